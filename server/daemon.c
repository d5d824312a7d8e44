/* server/daemon.c — the daemon's main loop (see daemon.h).
 *
 * Signals go through uv_signal_t, so their handlers run on the loop thread
 * like everything else and may touch the HTTP server directly.
 */
#include "server/daemon.h"

#include "server/base/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_POLL_MS 50

struct srv_serve {
    srv_config_t cfg;
    uv_loop_t loop;
    srv_http_t *http;
    srv_metrics_t *metrics;
    const srv_app_t *app;
    void *app_state;
    int app_started;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    int draining;
    int stopping;
    int failed; /* srv_serve_fail: exit 1 */
    uint64_t drain_deadline_ms;
};
typedef struct srv_serve serve_t;

static void h_health(srv_req_t *req, void *ud)
{
    (void)ud;
    if (srv_http_draining(srv_req_server(req)))
        srv_reply_json(req, 503, "{\"status\":\"draining\"}");
    else
        srv_reply_json(req, 200, "{\"status\":\"ok\"}");
}

static void h_metrics(srv_req_t *req, void *ud)
{
    size_t len = 0;
    char *text = srv_metrics_render(ud, &len);
    if (!text) {
        srv_reply_error(req, 500, "server_error", NULL, "internal", "out of memory");
        return;
    }
    srv_reply(req, 200, SRV_METRICS_CONTENT_TYPE, text, len);
    free(text);
}

static void on_http_closed(void *ud)
{
    (void)ud;
}

/* The end: cancel what is left, run the shutdown hook, close everything so
 * the loop runs dry. */
static void finish(serve_t *S)
{
    if (S->stopping)
        return;
    S->stopping = 1;
    size_t left = srv_http_inflight(S->http);
    if (left)
        SRV_LOG(SRV_LOG_WARN, NULL, "drain: cancelling %zu request(s) still open", left);
    srv_http_cancel_all(S->http);
    if (S->app_started && S->app && S->app->stop)
        S->app->stop(S->app_state);
    S->app_started = 0;
    srv_http_close(S->http, on_http_closed, S);
    S->http = NULL;
    uv_timer_stop(&S->drain_timer);
    uv_close((uv_handle_t *)&S->drain_timer, NULL);
    uv_close((uv_handle_t *)&S->sig_term, NULL);
    uv_close((uv_handle_t *)&S->sig_int, NULL);
    uv_close((uv_handle_t *)&S->sig_hup, NULL);
    SRV_LOG(SRV_LOG_INFO, NULL, "stopped");
}

void srv_serve_fail(srv_serve_t *S, const char *why)
{
    SRV_LOG(SRV_LOG_ERROR, NULL, "startup failed: %s", why);
    if (!S) /* an application run without srv_serve_run (tests/fuzz/fuzz_http.c) */
        return;
    S->failed = 1;
    finish(S);
}

static void on_drain_tick(uv_timer_t *t)
{
    serve_t *S = t->data;
    if (S->stopping)
        return;
    if (srv_http_inflight(S->http) == 0) {
        SRV_LOG(SRV_LOG_INFO, NULL, "drain: all requests finished");
        finish(S);
    } else if (uv_now(&S->loop) >= S->drain_deadline_ms) {
        SRV_LOG(SRV_LOG_WARN, NULL, "drain: timeout after %llds",
                (long long)S->cfg.drain_timeout_s);
        finish(S);
    }
}

static void on_stop_signal(uv_signal_t *sig, int signum)
{
    serve_t *S = sig->data;
    if (S->stopping)
        return;
    if (S->draining) {
        SRV_LOG(SRV_LOG_WARN, NULL, "second %s: stopping now", strsignal(signum));
        finish(S);
        return;
    }
    S->draining = 1;
    SRV_LOG(SRV_LOG_INFO, NULL, "%s: draining (%zu request(s) open, up to %llds)",
            strsignal(signum), srv_http_inflight(S->http), (long long)S->cfg.drain_timeout_s);
    srv_http_drain(S->http);
    if (S->app_started && S->app && S->app->drain)
        S->app->drain(S->app_state);
    S->drain_deadline_ms = uv_now(&S->loop) + (uint64_t)S->cfg.drain_timeout_s * 1000u;
    uv_timer_start(&S->drain_timer, on_drain_tick, 0, DRAIN_POLL_MS);
}

static void on_hup(uv_signal_t *sig, int signum)
{
    (void)sig;
    (void)signum;
    if (srv_log_reopen() == 0)
        SRV_LOG(SRV_LOG_INFO, NULL, "SIGHUP: log file reopened");
}

static void close_leftover(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static int start_server(serve_t *S)
{
    char err[512];
    const srv_config_t *c = &S->cfg;
    srv_http_opts_t o = {
        .host = c->host,
        .port = (int)c->port,
        .max_body = (size_t)c->max_body,
        .idle_timeout_s = (unsigned)c->idle_timeout_s,
        .request_timeout_s = (unsigned)c->request_timeout_s,
        .header_timeout_s = (unsigned)c->header_timeout_s,
        .max_connections = (unsigned)c->max_connections,
        .max_connections_per_address = (unsigned)c->max_conns_per_address,
        .max_uploads = (unsigned)c->max_uploads,
        .upload_dir = c->upload_dir,
        .api_keys = (const char *const *)c->api_keys.v,
        .api_key_admin = c->api_key_admin,
        .n_api_keys = c->api_keys.n,
        .cors_origins = (const char *const *)c->cors_origins.v,
        .n_cors_origins = c->cors_origins.n,
        .metrics = S->metrics,
    };
    S->http = srv_http_new(&S->loop, &o, err, sizeof err);
    if (!S->http) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "%s", err);
        return -1;
    }
    if (S->app && S->app->start) {
        srv_serve_ctx_t ctx = {&S->cfg, &S->loop, S->http, S->metrics, S};
        if (S->app->start(&ctx, &S->app_state) != 0) {
            SRV_LOG(SRV_LOG_ERROR, NULL, "startup failed");
            return -1;
        }
        S->app_started = 1;
    }
    srv_route_opts_t health = {.flags = SRV_ROUTE_PUBLIC | SRV_ROUTE_DRAIN_OK};
    srv_route_opts_t metrics = {.flags = SRV_ROUTE_DRAIN_OK};
    srv_http_route(S->http, "GET", "/health", h_health, NULL, &health);
    srv_http_route(S->http, "GET", "/metrics", h_metrics, S->metrics, &metrics);
    return 0;
}

int srv_serve_run(int argc, char **argv, const srv_app_t *app)
{
    char err[512];
    serve_t *S = calloc(1, sizeof *S);
    if (!S) {
        fprintf(stderr, "darkserve serve: out of memory\n");
        return 1;
    }
    int rc = 1;
    int loop_ok = 0;
    if (srv_config_parse(&S->cfg, argc, argv, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "darkserve serve: %s\n", err);
        free(S);
        return 2;
    }
    if (S->cfg.want_help) {
        srv_config_help(stdout);
        rc = 0;
        goto out;
    }
    if (S->cfg.want_print) {
        srv_config_print(&S->cfg, stdout);
        rc = 0;
        goto out;
    }
    if (srv_log_init((srv_log_level_t)S->cfg.log_level, (srv_log_format_t)S->cfg.log_format,
                     S->cfg.log_file, err, sizeof err) != 0) {
        fprintf(stderr, "darkserve serve: %s\n", err);
        goto out;
    }
    /* MHD sends with MSG_NOSIGNAL, but other writers (session files,
     * sockets of future stores) should get EPIPE rather than die. */
    signal(SIGPIPE, SIG_IGN);
    S->app = app;
    if (uv_loop_init(&S->loop) != 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "cannot create the event loop");
        goto out;
    }
    loop_ok = 1;
    S->metrics = srv_metrics_new();
    if (!S->metrics) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
        goto out;
    }
    srv_metric_t *start_time = srv_metrics_gauge(
        S->metrics, "darkserve_start_time_seconds", "Unix time the server started", NULL);
    srv_metric_set(start_time, NULL, (double)time(NULL));

    uv_signal_init(&S->loop, &S->sig_term);
    uv_signal_init(&S->loop, &S->sig_int);
    uv_signal_init(&S->loop, &S->sig_hup);
    uv_timer_init(&S->loop, &S->drain_timer);
    S->sig_term.data = S->sig_int.data = S->sig_hup.data = S->drain_timer.data = S;
    uv_signal_start(&S->sig_term, on_stop_signal, SIGTERM);
    uv_signal_start(&S->sig_int, on_stop_signal, SIGINT);
    uv_signal_start(&S->sig_hup, on_hup, SIGHUP);

    if (start_server(S) != 0) {
        if (S->app_started && S->app->stop)
            S->app->stop(S->app_state);
        S->app_started = 0;
        if (S->http)
            srv_http_close(S->http, NULL, NULL);
        S->http = NULL;
        uv_walk(&S->loop, close_leftover, NULL);
        uv_run(&S->loop, UV_RUN_DEFAULT);
        goto out;
    }
    SRV_LOG(SRV_LOG_INFO, NULL, "listening on http://%s%s%s:%d (pid %d)",
            strchr(S->cfg.host, ':') ? "[" : "", S->cfg.host, strchr(S->cfg.host, ':') ? "]" : "",
            srv_http_port(S->http), (int)getpid());
    uv_run(&S->loop, UV_RUN_DEFAULT);
    rc = S->failed ? 1 : 0;
out:
    if (loop_ok) {
        if (uv_loop_close(&S->loop) != 0) {
            /* A handle someone forgot: close it rather than leak the loop. */
            SRV_LOG(SRV_LOG_WARN, NULL, "event loop still had open handles at exit");
            uv_walk(&S->loop, close_leftover, NULL);
            uv_run(&S->loop, UV_RUN_DEFAULT);
            uv_loop_close(&S->loop);
        }
    }
    srv_metrics_free(S->metrics);
    srv_config_free(&S->cfg);
    srv_log_shutdown();
    free(S);
    return rc;
}
