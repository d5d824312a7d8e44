/* server/daemon.h — `darkserve serve`: configuration, logging, signals, the
 * HTTP server and the event loop, around a pluggable application (model,
 * scheduler, sessions) that registers its routes.
 *
 * Lifecycle:
 *   1. parse the configuration (exit 2 on a usage error; --help and
 *      --print-config print and exit 0), open the log;
 *   2. create the loop, the metrics registry and the HTTP server (bind);
 *      a bind failure exits 1;
 *   3. app->start(ctx) (may be NULL): load, start threads, register routes;
 *      failure exits 1. Then the built-in routes are added (the first
 *      registered route wins, so the app may replace them):
 *        GET /health   {"status":"ok"}, 503 {"status":"draining"}; no API key
 *        GET /metrics  Prometheus text; needs the API key when keys are set
 *   4. run the loop. SIGTERM or SIGINT begins a drain: new requests get 503,
 *      app->drain runs, open requests get up to --drain-timeout to finish
 *      (a second signal cuts the wait short); then the remaining ones are
 *      cancelled, app->stop runs (the shutdown hook), the server closes and
 *      the process exits 0. SIGHUP reopens --log-file.
 * The line "listening on http://HOST:PORT" (info level) tells scripts and
 * tests the bound port when --port 0 was given.
 */
#ifndef DARKSERVE_SERVER_SERVE_H
#define DARKSERVE_SERVER_SERVE_H

#include <uv.h>

#include "server/config.h"
#include "server/http/http.h"
#include "server/base/metrics.h"

/* What the application gets at start; every pointer is borrowed and valid
 * until app->stop returns. */
typedef struct srv_serve srv_serve_t;

typedef struct srv_serve_ctx {
    const srv_config_t *cfg;
    uv_loop_t *loop;
    srv_http_t *http;
    srv_metrics_t *metrics;
    srv_serve_t *serve; /* for srv_serve_fail */
} srv_serve_ctx_t;

/* Loop thread: the application failed after start returned (e.g. a model
 * that loads in the background turned out unreadable): logs why, stops the
 * server as after a second signal (app->stop runs) and makes srv_serve_run
 * return 1. S NULL (an application started without srv_serve_run, as the
 * HTTP fuzz target does): only logs. */
void srv_serve_fail(srv_serve_t *S, const char *why);

typedef struct srv_app {
    /* Loop thread, before the loop runs. Sets *state (passed back to the
     * other hooks). Returns 0, or non-zero after logging why (exit 1). */
    int (*start)(const srv_serve_ctx_t *ctx, void **state);
    /* Loop thread, when a drain begins (optional): stop admitting work. */
    void (*drain)(void *state);
    /* Loop thread, the shutdown hook (optional): after the drain ended or
     * timed out and open streams were cancelled. Stop threads, close every
     * stream still held, flush sessions. The HTTP server is closed after it
     * returns. */
    void (*stop)(void *state);
} srv_app_t;

/* Runs the daemon with app (NULL = built-in routes only). argv[0..argc) are
 * the arguments after "serve". Returns the process exit code. */
int srv_serve_run(int argc, char **argv, const srv_app_t *app);

#endif
