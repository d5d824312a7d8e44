/* server/ui/ui.h — the web page served by the daemon itself (GET /).
 *
 * The page is plain HTML, CSS and JavaScript kept in server/ui/ and built
 * into the binary: at build time server/ui/embed.c writes their bytes into
 * a generated C file that defines srv_ui_files[] (see the Makefile). This
 * module only serves those bytes; the page talks to the server through the
 * public API like any other client.
 *
 * Routes (all GET, HEAD too; no API key needed, the page asks for one when
 * the API answers 401):
 *   /               index.html
 *   /ui/{name}      any embedded file by its name (app.js, app.css, ...)
 * Every answer carries its Content-Type, a Content-Security-Policy that runs
 * scripts from this origin only (no inline script, so text injected into the
 * page cannot run), X-Content-Type-Options: nosniff, Cache-Control: no-cache
 * and an ETag (a hash of the bytes, computed by the generator): a request
 * whose If-None-Match names it gets 304 without a body. An unknown name is
 * 404.
 */
#ifndef DARKSERVE_SERVER_UI_H
#define DARKSERVE_SERVER_UI_H

#include <stddef.h>

#include "server/http/http.h"

/* One embedded file (defined by the generated file). */
typedef struct srv_ui_file {
    const char *name;           /* base name, e.g. "app.js" */
    const unsigned char *bytes; /* [len] the file's bytes */
    size_t len;
    const char *etag; /* "\"<16 hex digits>\"": FNV-1a 64 of the bytes, quoted */
} srv_ui_file_t;

extern const srv_ui_file_t srv_ui_files[]; /* [srv_ui_n_files] */
extern const size_t srv_ui_n_files;

/* Registers the page's routes on h (loop thread, before the server runs).
 * Returns 0, or -1 when a route cannot be registered or an embedded file has
 * a name whose type is unknown (a file added to server/ui/ that the server
 * would not know how to label). */
int srv_ui_routes(srv_http_t *h);

#endif
