/* server/ui/ui.c — serves the embedded web page (see ui.h).
 *
 * The bytes come from the generated file the Makefile writes with
 * server/ui/embed.c; nothing here reads the disk. The page is served without
 * an API key (it holds no data, and asks for the key once the API answers
 * 401) and while the model loads or the server drains, so a browser gets the
 * page and then the API's own answer ("loading", "draining").
 */
#include "server/ui/ui.h"

#include <string.h>

/* Scripts, styles and fetches from this origin only: no inline script or
 * style, no eval, no plug-ins, no framing. Model output is put into the page
 * as text (app.js never parses it as HTML); this policy is the second line:
 * markup that got in anyway could not run a script. */
#define UI_CSP                                                                                     \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                \
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const char *content_type(const char *name)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0)
            return types[i].type;
    return NULL;
}

static const srv_ui_file_t *find_file(const char *name)
{
    for (size_t i = 0; i < srv_ui_n_files; i++)
        if (strcmp(srv_ui_files[i].name, name) == 0)
            return &srv_ui_files[i];
    return NULL;
}

/* Does an If-None-Match value name etag? It is "*" or a comma-separated
 * list of entity tags, weak ones (W/"...") matching too (RFC 9110 13.1.2). */
static int etag_matches(const char *inm, const char *etag)
{
    size_t elen = strlen(etag);
    const char *p = inm;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*')
            return 1;
        if (strncmp(p, "W/", 2) == 0)
            p += 2;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if ((size_t)(end - start) == elen && memcmp(start, etag, elen) == 0)
            return 1;
    }
    return 0;
}

static void serve_file(srv_req_t *req, const srv_ui_file_t *f)
{
    srv_req_add_header(req, "ETag", f->etag);
    srv_req_add_header(req, "Cache-Control", "no-cache");
    srv_req_add_header(req, "Content-Security-Policy", UI_CSP);
    srv_req_add_header(req, "X-Content-Type-Options", "nosniff");
    srv_req_add_header(req, "Referrer-Policy", "no-referrer");
    const char *inm = srv_req_header(req, "If-None-Match");
    if (inm && etag_matches(inm, f->etag)) {
        srv_reply(req, 304, NULL, NULL, 0);
        return;
    }
    srv_reply(req, 200, content_type(f->name), f->bytes, f->len);
}

static void h_index(srv_req_t *req, void *ud)
{
    const srv_ui_file_t *f = ud;
    serve_file(req, f);
}

static void h_asset(srv_req_t *req, void *ud)
{
    (void)ud;
    const srv_ui_file_t *f = find_file(srv_req_param(req, "name"));
    if (!f) {
        srv_reply_error(req, 404, "not_found_error", NULL, "not_found", "no such file: %s",
                        srv_req_path(req));
        return;
    }
    serve_file(req, f);
}

int srv_ui_routes(srv_http_t *h)
{
    for (size_t i = 0; i < srv_ui_n_files; i++)
        if (!content_type(srv_ui_files[i].name))
            return -1;
    const srv_ui_file_t *index = find_file("index.html");
    if (!index)
        return -1;
    srv_route_opts_t ro = {.flags = SRV_ROUTE_PUBLIC | SRV_ROUTE_DRAIN_OK};
    /* the ud of a route is borrowed: the embedded table is static */
    if (srv_http_route(h, "GET", "/", h_index, (void *)index, &ro) < 0 ||
        srv_http_route(h, "GET", "/ui/{name}", h_asset, NULL, &ro) < 0)
        return -1;
    return 0;
}
