/* test_srv_serve.c — srv_serve_run with a test application: the SIGTERM
 * drain waits for an open stream, a drain deadline cancels what is left, a
 * second signal cuts the wait short, and the app's start/drain/stop hooks run
 * in order. The daemon runs on a thread of this process; signals are raised
 * at the process and reach the loop through libuv.
 *
 * Every wait is bounded (WAIT_MS); the drain timeouts used (20 s, 60 s)
 * exceed WAIT_MS so a test passes only through the behaviour it checks.
 */
#include "server/http/http_test.h"
#include "server/base/log.h"
#include "server/daemon.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS HTTP_WAIT_MS

static char g_log[64];

static struct {
    pthread_mutex_t mu;
    int started, drained, stopped;
    int order_ok;          /* drain (if any) came before stop */
    int release;           /* let the /hold producer finish */
    int saw_cancel;        /* the producer saw its stream cancelled */
    int stream_open_at_stop;
    int fail_start;
    pthread_t producer;
    int have_producer;
    int producer_live;
} app_st = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *prod_hold(void *arg)
{
    srv_stream_t *s = arg;
    srv_stream_write(s, "a\n", 2);
    uint64_t end = mono_ms() + 3 * WAIT_MS;
    for (;;) {
        pthread_mutex_lock(&app_st.mu);
        int rel = app_st.release;
        pthread_mutex_unlock(&app_st.mu);
        if (rel || srv_stream_cancelled(s) || mono_ms() > end)
            break;
        sleep_ms(5);
    }
    int c = srv_stream_cancelled(s);
    if (!c)
        srv_stream_write(s, "b\n", 2);
    pthread_mutex_lock(&app_st.mu);
    app_st.saw_cancel = c;
    app_st.producer_live = 0;
    pthread_mutex_unlock(&app_st.mu);
    srv_stream_close(s, SRV_STREAM_END);
    return NULL;
}

static void h_hold(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_t *s = srv_stream_open(req, 200, "text/plain", NULL);
    if (!s)
        return;
    pthread_mutex_lock(&app_st.mu);
    app_st.producer_live = 1;
    app_st.have_producer = 1;
    pthread_create(&app_st.producer, NULL, prod_hold, s);
    pthread_mutex_unlock(&app_st.mu);
}

static int app_start(const srv_serve_ctx_t *ctx, void **state)
{
    *state = &app_st;
    pthread_mutex_lock(&app_st.mu);
    app_st.started = 1;
    int fail = app_st.fail_start;
    pthread_mutex_unlock(&app_st.mu);
    if (fail) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "test app refuses to start");
        return -1;
    }
    CHECK(ctx->cfg && ctx->loop && ctx->http && ctx->metrics);
    return srv_http_route(ctx->http, "GET", "/hold", h_hold, NULL, NULL);
}

static void app_drain(void *state)
{
    CHECK(state == &app_st);
    pthread_mutex_lock(&app_st.mu);
    app_st.drained = 1;
    pthread_mutex_unlock(&app_st.mu);
}

static void app_stop(void *state)
{
    CHECK(state == &app_st);
    pthread_mutex_lock(&app_st.mu);
    app_st.order_ok = !app_st.stopped && app_st.started;
    app_st.stopped = 1;
    app_st.stream_open_at_stop = app_st.producer_live;
    int join = app_st.have_producer;
    app_st.have_producer = 0;
    pthread_mutex_unlock(&app_st.mu);
    /* The shutdown hook owns its threads: the producer ends promptly because
     * its stream was cancelled or released before stop. */
    if (join)
        pthread_join(app_st.producer, NULL);
}

static const srv_app_t test_app = {app_start, app_drain, app_stop};

static void app_reset(void)
{
    pthread_mutex_lock(&app_st.mu);
    app_st.started = app_st.drained = app_st.stopped = app_st.order_ok = 0;
    app_st.release = app_st.saw_cancel = app_st.stream_open_at_stop = 0;
    app_st.fail_start = 0;
    app_st.producer_live = 0;
    pthread_mutex_unlock(&app_st.mu);
}

/* ---- running the daemon on a thread ---- */

typedef struct run {
    pthread_t th;
    char *argv[16];
    int argc;
    int rc;
    int done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} run_t;

static void *serve_thread(void *arg)
{
    run_t *r = arg;
    int rc = srv_serve_run(r->argc, r->argv, &test_app);
    pthread_mutex_lock(&r->mu);
    r->rc = rc;
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Starts the daemon; returns the port from its "listening on" line, or -1. */
static int serve_start(run_t *r, const char *drain_timeout)
{
    unlink(g_log);
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    static char port0[] = "--port=0", logf[] = "--log-file", dt[] = "--drain-timeout";
    r->argv[r->argc++] = port0;
    r->argv[r->argc++] = logf;
    r->argv[r->argc++] = g_log;
    r->argv[r->argc++] = dt;
    r->argv[r->argc++] = (char *)drain_timeout;
    pthread_create(&r->th, NULL, serve_thread, r);
    uint64_t end = mono_ms() + WAIT_MS;
    while (mono_ms() < end) {
        char *t = slurp(g_log, NULL);
        const char *m = t ? strstr(t, "listening on http://127.0.0.1:") : NULL;
        int port = m ? atoi(m + strlen("listening on http://127.0.0.1:")) : 0;
        free(t);
        if (m)
            return port;
        pthread_mutex_lock(&r->mu);
        int done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (done)
            return -1;
        sleep_ms(10);
    }
    return -1;
}

/* Waits for the daemon to return; its exit code, or -999 on a hang. */
static int serve_wait(run_t *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&r->mu);
    int w = 0;
    while (!r->done && w == 0)
        w = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    int done = r->done, rc = r->rc;
    pthread_mutex_unlock(&r->mu);
    if (!done)
        return -999;
    pthread_join(r->th, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    return rc;
}

/* ---- tests ---- */

TEST(test_drain_waits_for_open_stream)
{
    app_reset();
    run_t r;
    int port = serve_start(&r, "20s");
    CHECK(port > 0);
    if (port <= 0)
        return;
    CHECK_INT_EQ(http_status(port, "/health"), 200);
    int fd = tcp_connect(port);
    buf_t buf = {0};
    CHECK(send_str(fd, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(read_until_contains(fd, &buf, "a\n", WAIT_MS) == 0);
    raise(SIGTERM);
    /* the drain is visible from outside: /health says so, others get 503 */
    uint64_t end = mono_ms() + WAIT_MS;
    while (http_status(port, "/health") != 503 && mono_ms() < end)
        sleep_ms(10);
    CHECK_INT_EQ(http_status(port, "/health"), 503);
    CHECK_INT_EQ(http_status(port, "/hold"), 503);
    pthread_mutex_lock(&app_st.mu);
    CHECK_INT_EQ(app_st.drained, 1);
    CHECK_INT_EQ(app_st.stopped, 0); /* still waiting for the open stream */
    app_st.release = 1;
    pthread_mutex_unlock(&app_st.mu);
    CHECK(read_until_close(fd, &buf, WAIT_MS) == 0);
    const char *body = buf.p ? strstr(buf.p, "\r\n\r\n") : NULL;
    CHECK(body && strstr(body, "b\n"));
    CHECK(body && strstr(body, "\r\n0\r\n\r\n") != NULL); /* clean end of the chunked body */
    free(buf.p);
    close(fd);
    CHECK_INT_EQ(serve_wait(&r), 0);
    CHECK_INT_EQ(app_st.stopped, 1);
    CHECK_INT_EQ(app_st.order_ok, 1);
    CHECK_INT_EQ(app_st.saw_cancel, 0);
    CHECK_INT_EQ(app_st.stream_open_at_stop, 0);
    char *t = slurp(g_log, NULL);
    CHECK(t && strstr(t, "draining") && strstr(t, "all requests finished") &&
          strstr(t, "stopped"));
    free(t);
}

TEST(test_drain_deadline_cancels)
{
    app_reset();
    run_t r;
    int port = serve_start(&r, "1s");
    CHECK(port > 0);
    if (port <= 0)
        return;
    int fd = tcp_connect(port);
    buf_t buf = {0};
    CHECK(send_str(fd, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(read_until_contains(fd, &buf, "a\n", WAIT_MS) == 0);
    raise(SIGTERM);
    CHECK_INT_EQ(serve_wait(&r), 0);
    CHECK_INT_EQ(app_st.stopped, 1);
    CHECK_INT_EQ(app_st.saw_cancel, 1);
    CHECK(read_until_close(fd, &buf, WAIT_MS) == 0);
    CHECK(buf.p && strstr(buf.p, "\r\n0\r\n\r\n") == NULL); /* cut, not a clean end */
    free(buf.p);
    close(fd);
    char *t = slurp(g_log, NULL);
    CHECK(t && strstr(t, "drain: timeout") && strstr(t, "cancelling 1 request"));
    free(t);
}

TEST(test_second_signal_stops_now)
{
    app_reset();
    run_t r;
    int port = serve_start(&r, "60s");
    CHECK(port > 0);
    if (port <= 0)
        return;
    int fd = tcp_connect(port);
    buf_t buf = {0};
    CHECK(send_str(fd, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(read_until_contains(fd, &buf, "a\n", WAIT_MS) == 0);
    raise(SIGTERM);
    uint64_t end = mono_ms() + WAIT_MS;
    for (;;) {
        pthread_mutex_lock(&app_st.mu);
        int d = app_st.drained;
        pthread_mutex_unlock(&app_st.mu);
        if (d || mono_ms() > end)
            break;
        sleep_ms(5);
    }
    raise(SIGINT);
    CHECK_INT_EQ(serve_wait(&r), 0);
    CHECK_INT_EQ(app_st.saw_cancel, 1);
    free(buf.p);
    close(fd);
}

TEST(test_start_failures)
{
    app_reset();
    pthread_mutex_lock(&app_st.mu);
    app_st.fail_start = 1;
    pthread_mutex_unlock(&app_st.mu);
    run_t r;
    CHECK_INT_EQ(serve_start(&r, "1s"), -1);
    CHECK_INT_EQ(serve_wait(&r), 1);
    CHECK_INT_EQ(app_st.started, 1);
    char bad[] = "--bogus";
    char *argv[] = {bad, NULL};
    CHECK_INT_EQ(srv_serve_run(1, argv, &test_app), 2);
}

int main(void)
{
    alarm(120);
    snprintf(g_log, sizeof g_log, "/tmp/test_srv_serve_%d.log", (int)getpid());
    RUN(test_drain_waits_for_open_stream);
    RUN(test_drain_deadline_cancels);
    RUN(test_second_signal_stops_now);
    RUN(test_start_failures);
    unlink(g_log);
    return CHECK_DONE();
}
