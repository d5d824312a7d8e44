/* server/http/http_route.c — the route table of the HTTP server
 * (server/http/http_impl.h): patterns with {param} segments, matching a path
 * against them, and the methods a path allows. Knows no sockets.
 */
#include "server/http/http.h"
#include "server/http/http_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- routing ---- */

int srv_http_route_parse(route_t *r, const char *pattern)
{
    if (pattern[0] != '/')
        return SRV_HTTP_EINVAL;
    const char *p = pattern + 1;
    r->nsegs = 0;
    if (!*p)
        return 0; /* "/" */
    for (;;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 0 || r->nsegs == MAX_SEGS)
            return SRV_HTTP_EINVAL;
        seg_t *sg = &r->segs[r->nsegs];
        if (p[0] == '{') {
            if (n < 3 || p[n - 1] != '}')
                return SRV_HTTP_EINVAL;
            sg->param = 1;
            sg->text = strndup(p + 1, n - 2);
        } else {
            if (memchr(p, '{', n) || memchr(p, '}', n))
                return SRV_HTTP_EINVAL;
            sg->param = 0;
            sg->text = strndup(p, n);
        }
        if (!sg->text)
            return SRV_HTTP_ENOMEM;
        r->nsegs++;
        if (!end)
            return 0;
        p = end + 1;
    }
}

void srv_http_route_clear(route_t *r)
{
    for (size_t i = 0; i < r->nsegs; i++)
        free(r->segs[i].text);
    free(r->method);
    free(r->pattern);
}

/* Does path match r? On a match with req non-NULL, the parameters are copied
 * into req. */
int srv_http_route_match(const route_t *r, const char *path, srv_req_t *req)
{
    const char *starts[MAX_SEGS];
    size_t lens[MAX_SEGS];
    if (path[0] != '/')
        return 0;
    const char *p = path + 1;
    if (r->nsegs == 0)
        return *p == '\0';
    for (size_t i = 0; i < r->nsegs; i++) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const seg_t *sg = &r->segs[i];
        if (n == 0)
            return 0;
        if (!sg->param && (strlen(sg->text) != n || memcmp(sg->text, p, n) != 0))
            return 0;
        starts[i] = p;
        lens[i] = n;
        if (i + 1 < r->nsegs) {
            if (!end)
                return 0;
            p = end + 1;
        } else if (end) {
            return 0;
        }
    }
    if (!req)
        return 1;
    for (size_t i = 0; i < r->nsegs && req->nparams < MAX_PARAMS; i++) {
        if (!r->segs[i].param)
            continue;
        char *v = strndup(starts[i], lens[i]);
        if (!v)
            return -1;
        req->pnames[req->nparams] = r->segs[i].text;
        req->pvals[req->nparams++] = v;
    }
    return 1;
}

int srv_http_route(srv_http_t *h, const char *method, const char *pattern, srv_handler_fn fn,
                   void *ud, const srv_route_opts_t *ropts)
{
    if (!h || !method || !*method || !pattern || !fn)
        return SRV_HTTP_EINVAL;
    for (const char *m = method; *m; m++)
        if (!isupper((unsigned char)*m))
            return SRV_HTTP_EINVAL;
    size_t nparams = 0;
    if (h->nroutes == h->rcap) {
        size_t ncap = h->rcap ? h->rcap * 2 : 16;
        route_t *nr = realloc(h->routes, ncap * sizeof *nr);
        if (!nr)
            return SRV_HTTP_ENOMEM;
        h->routes = nr;
        h->rcap = ncap;
    }
    route_t *r = &h->routes[h->nroutes];
    memset(r, 0, sizeof *r);
    int rc = srv_http_route_parse(r, pattern);
    for (size_t i = 0; rc == 0 && i < r->nsegs; i++)
        nparams += (size_t)r->segs[i].param;
    if (rc == 0 && nparams > MAX_PARAMS)
        rc = SRV_HTTP_EINVAL;
    if (rc == 0) {
        r->method = strdup(method);
        r->pattern = strdup(pattern);
        if (!r->method || !r->pattern)
            rc = SRV_HTTP_ENOMEM;
    }
    if (rc) {
        srv_http_route_clear(r);
        return rc;
    }
    r->fn = fn;
    r->ud = ud;
    r->flags = ropts ? ropts->flags : 0;
    r->max_body = ropts && ropts->max_body ? ropts->max_body : h->max_body;
    h->nroutes++;
    return 0;
}

int srv_http_route_set_max_body(srv_http_t *h, const char *method, const char *pattern,
                                size_t max_body)
{
    if (!h || !method || !pattern)
        return SRV_HTTP_EINVAL;
    int found = 0;
    for (size_t i = 0; i < h->nroutes; i++) {
        route_t *r = &h->routes[i];
        if (strcmp(r->method, method) == 0 && strcmp(r->pattern, pattern) == 0) {
            r->max_body = max_body ? max_body : h->max_body;
            found = 1;
        }
    }
    return found ? 0 : SRV_HTTP_EINVAL;
}

int srv_http_method_matches(const route_t *r, const char *method)
{
    return strcmp(r->method, method) == 0 ||
           (strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0);
}

/* "GET, HEAD, POST, OPTIONS": methods of the routes matching path. */
void srv_http_allowed_methods(const srv_http_t *h, const char *path, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    const char *seen[64];
    size_t nseen = 0;
    for (size_t i = 0; i < h->nroutes; i++) {
        const route_t *r = &h->routes[i];
        if (srv_http_route_match(r, path, NULL) != 1)
            continue;
        const char *ms[2] = {r->method, strcmp(r->method, "GET") == 0 ? "HEAD" : NULL};
        for (int k = 0; k < 2 && ms[k]; k++) {
            int dup = 0;
            for (size_t j = 0; j < nseen; j++)
                dup |= strcmp(seen[j], ms[k]) == 0;
            if (dup || nseen == 64)
                continue;
            seen[nseen++] = ms[k];
            int w = snprintf(out + n, cap - n, "%s%s", n ? ", " : "", ms[k]);
            if (w > 0 && (size_t)w < cap - n)
                n += (size_t)w;
        }
    }
    int w = snprintf(out + n, cap - n, "%sOPTIONS", n ? ", " : "");
    (void)w;
}

