/* server/http/http_headers.c — header lists (hdrlist_t, http_impl.h): the
 * extra headers of an answer, a request's and an injected request's
 * headers. Validates what goes in (a token name, no CR or LF in the value),
 * so no header a handler adds can split an answer; an injected request's
 * headers only as loosely as a connection's parser would pass them on, so
 * the request hook's framing rules (http_frame.c) judge the rest. Calls nothing of the
 * server; whichever thread owns the list.
 */
#include "server/http/http_impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

void srv_http_hdrlist_clear(hdrlist_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].value);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int is_token_char(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

int srv_http_header_valid(const char *name, const char *value)
{
    if (!name || !*name || !value)
        return 0;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (!is_token_char(*p))
            return 0;
    for (const unsigned char *p = (const unsigned char *)value; *p; p++)
        if (*p == '\r' || *p == '\n')
            return 0;
    return 1;
}

int srv_http_header_received(const char *name, const char *value)
{
    if (!name || !*name || !value || strpbrk(name, ":\r\n") || strchr(value, '\n'))
        return 0;
    return 1;
}

static int hdrlist_put(hdrlist_t *l, const char *name, const char *value);

int srv_http_hdrlist_add(hdrlist_t *l, const char *name, const char *value)
{
    if (!srv_http_header_valid(name, value))
        return SRV_HTTP_EINVAL;
    return hdrlist_put(l, name, value);
}

int srv_http_hdrlist_add_received(hdrlist_t *l, const char *name, const char *value)
{
    if (!srv_http_header_received(name, value))
        return SRV_HTTP_EINVAL;
    return hdrlist_put(l, name, value);
}

static int hdrlist_put(hdrlist_t *l, const char *name, const char *value)
{
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 4;
        header_t *nv = realloc(l->v, ncap * sizeof *nv);
        if (!nv)
            return SRV_HTTP_ENOMEM;
        l->v = nv;
        l->cap = ncap;
    }
    char *n = strdup(name), *v = strdup(value);
    if (!n || !v) {
        free(n);
        free(v);
        return SRV_HTTP_ENOMEM;
    }
    l->v[l->n].name = n;
    l->v[l->n].value = v;
    l->n++;
    return 0;
}
