/* test_srv_http.c — the HTTP front end, end to end over loopback sockets.
 *
 * Each group starts a real server (port 0) on its own loop thread, registers
 * test routes, talks to it with plain sockets from the main thread, stops it
 * and checks that uv_loop_close() == 0 (no handle leaked). Every wait has a
 * bound (WAIT_MS) so a broken server fails the test instead of hanging it;
 * no assertion depends on how fast anything is.
 *
 * Streaming checks avoid timing: the producer of /stream/incremental waits
 * until the client has *received* the first chunk before writing the second,
 * so a server that buffered the stream until it ends makes the producer time
 * out; the producer of /stream/cancel writes nothing after its first chunk,
 * so its connection is suspended and only the hang-up watch can notice the
 * client leaving.
 */
#include "server/http/http.h"
#include "server/http/http_test.h"
#include "server/base/log.h"
#include "server/base/metrics.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS HTTP_WAIT_MS
#define API_KEY "sekret-key-1"
#define API_KEY2 "other-key-2"
#define ORIGIN_OK "https://app.example"

/* ---------------------------------------------------------------- helpers */

static void abs_deadline(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* ---------------------------------------------------------------- server harness */

typedef struct server server_t;
typedef void (*server_fn)(server_t *S, void *arg);

struct server {
    pthread_t th;
    uv_loop_t loop;
    uv_async_t ctl;
    srv_http_t *h;
    srv_metrics_t *metrics;
    srv_http_opts_t opts;
    void (*setup)(server_t *S);
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 starting, 1 running, -1 failed, 2 stopped */
    int port;
    int loop_close_rc;
    char err[256];
    server_fn call_fn;
    void *call_arg;
    int call_pending;
};

static pthread_t g_loop_thread;

static void on_ctl(uv_async_t *a)
{
    server_t *S = a->data;
    pthread_mutex_lock(&S->mu);
    server_fn fn = S->call_fn;
    void *arg = S->call_arg;
    pthread_mutex_unlock(&S->mu);
    if (fn)
        fn(S, arg);
    pthread_mutex_lock(&S->mu);
    S->call_fn = NULL;
    S->call_pending = 0;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
}

static void *server_thread(void *arg)
{
    server_t *S = arg;
    g_loop_thread = pthread_self();
    uv_loop_init(&S->loop);
    S->h = srv_http_new(&S->loop, &S->opts, S->err, sizeof S->err);
    pthread_mutex_lock(&S->mu);
    if (!S->h) {
        S->state = -1;
        pthread_cond_broadcast(&S->cv);
        pthread_mutex_unlock(&S->mu);
        uv_loop_close(&S->loop);
        return NULL;
    }
    S->setup(S);
    uv_async_init(&S->loop, &S->ctl, on_ctl);
    S->ctl.data = S;
    S->port = srv_http_port(S->h);
    S->state = 1;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    uv_run(&S->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&S->loop);
    pthread_mutex_lock(&S->mu);
    S->loop_close_rc = rc;
    S->state = 2;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

static int server_start(server_t *S)
{
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    pthread_create(&S->th, NULL, server_thread, S);
    pthread_mutex_lock(&S->mu);
    while (S->state == 0)
        pthread_cond_wait(&S->cv, &S->mu);
    int ok = S->state == 1;
    pthread_mutex_unlock(&S->mu);
    if (!ok) {
        printf("  server failed to start: %s\n", S->err);
        pthread_join(S->th, NULL);
    }
    return ok ? 0 : -1;
}

/* Runs fn(S, arg) on the loop thread and waits for it. */
static int server_call(server_t *S, server_fn fn, void *arg)
{
    struct timespec ts;
    abs_deadline(&ts, WAIT_MS);
    pthread_mutex_lock(&S->mu);
    S->call_fn = fn;
    S->call_arg = arg;
    S->call_pending = 1;
    uv_async_send(&S->ctl);
    int rc = 0;
    while (S->call_pending && rc == 0)
        rc = pthread_cond_timedwait(&S->cv, &S->mu, &ts);
    pthread_mutex_unlock(&S->mu);
    return rc == 0 ? 0 : -1;
}

static void do_close(server_t *S, void *arg)
{
    (void)arg;
    srv_http_close(S->h, NULL, NULL);
    S->h = NULL;
    uv_close((uv_handle_t *)&S->ctl, NULL);
}

/* Stops the server and returns uv_loop_close's result (or -999 on a hang). */
static int server_stop(server_t *S)
{
    if (server_call(S, do_close, NULL) != 0)
        return -999;
    struct timespec ts;
    abs_deadline(&ts, WAIT_MS);
    pthread_mutex_lock(&S->mu);
    int rc = 0;
    while (S->state != 2 && rc == 0)
        rc = pthread_cond_timedwait(&S->cv, &S->mu, &ts);
    pthread_mutex_unlock(&S->mu);
    if (rc != 0)
        return -999;
    pthread_join(S->th, NULL);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    return S->loop_close_rc;
}

/* ---------------------------------------------------------------- shared test state */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* incremental stream */
    int client_saw_first;
    int incremental_timed_out;
    /* cancellation */
    int cancel_cb_count;
    int cancel_cb_on_loop;
    int saw_cancelled;
    int write_after_cancel;
    int producer_done;
    /* back-pressure */
    int bp_first, bp_second;
    size_t bp_space;
    int writable_count;
    int bp_errors;
    /* hold / release */
    int release;
    /* close with open stream */
    int server_gone;
    int write_after_close;
    /* deferred */
    int deferred_rc;
    pthread_t producer;
    int have_producer;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void t_reset(void)
{
    pthread_mutex_lock(&T.mu);
    T.client_saw_first = T.incremental_timed_out = 0;
    T.cancel_cb_count = T.cancel_cb_on_loop = T.saw_cancelled = 0;
    T.write_after_cancel = 0;
    T.producer_done = 0;
    T.bp_first = T.bp_second = T.bp_errors = T.writable_count = 0;
    T.bp_space = 0;
    T.release = 0;
    T.server_gone = T.write_after_close = 0;
    T.deferred_rc = 0;
    pthread_mutex_unlock(&T.mu);
}

/* Waits until *flag is non-zero; returns 0, or -1 after WAIT_MS. */
static int t_wait(const int *flag)
{
    struct timespec ts;
    abs_deadline(&ts, WAIT_MS);
    int rc = 0;
    pthread_mutex_lock(&T.mu);
    while (!*flag && rc == 0)
        rc = pthread_cond_timedwait(&T.cv, &T.mu, &ts);
    int ok = *flag != 0;
    pthread_mutex_unlock(&T.mu);
    return ok ? 0 : -1;
}

static void t_set(int *flag)
{
    pthread_mutex_lock(&T.mu);
    *flag = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

static void spawn_producer(void *(*fn)(void *), void *arg)
{
    pthread_create(&T.producer, NULL, fn, arg);
    T.have_producer = 1;
}

static void join_producer(void)
{
    if (T.have_producer)
        pthread_join(T.producer, NULL);
    T.have_producer = 0;
}

/* ---------------------------------------------------------------- routes */

static void h_echo(srv_req_t *req, void *ud)
{
    (void)ud;
    size_t len;
    const char *body = srv_req_body(req, &len);
    const char *x = srv_req_query(req, "x");
    const char *t = srv_req_header(req, "X-Test");
    char out[4096];
    snprintf(out, sizeof out,
             "{\"path\":\"%s\",\"x\":\"%s\",\"test\":\"%s\",\"len\":%zu,\"body\":\"%.1000s\"}",
             srv_req_path(req), x ? x : "", t ? t : "", len, body);
    srv_req_add_header(req, "X-Echo", "1");
    srv_reply_json(req, 200, out);
}

static void h_append(srv_req_t *req, void *ud)
{
    (void)ud;
    size_t len;
    srv_req_body(req, &len);
    char out[256];
    snprintf(out, sizeof out, "{\"id\":\"%s\",\"len\":%zu,\"route\":\"%s\"}",
             srv_req_param(req, "id"), len, srv_req_route(req));
    srv_reply_json(req, 200, out);
}

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
    srv_reply(req, 200, SRV_METRICS_CONTENT_TYPE, text, len);
    free(text);
}

static void h_err(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_reply_error(req, 409, "invalid_request_error", "session", "session_busy",
                    "session '%s' is busy: \"%s\"\n", srv_req_param(req, "id"), "caf\xc3\xa9 \xff");
}

#define BIG_LIMIT ((size_t)3 << 20)

/* /big: bodies past 1 MiB are spooled to a file as they arrive; the
 * handler sees them whole, as any other, and takes them away: a spooled
 * one as the file mapped (no copy in the heap), NUL-terminated too */
static void h_big(srv_req_t *req, void *ud)
{
    (void)ud;
    size_t len, left;
    const char *body = srv_req_body(req, &len);
    srv_body_t b;
    if (srv_req_take_body(req, &b) != 0) {
        srv_reply_json(req, 500, "{}");
        return;
    }
    srv_req_body(req, &left);
    unsigned long long sum = 0;
    for (size_t i = 0; i < b.len; i++)
        sum += (unsigned char)b.data[i] * (i % 7 + 1);
    char out[192];
    snprintf(out, sizeof out,
             "{\"len\":%zu,\"sum\":%llu,\"same\":%s,\"nul\":%s,\"mapped\":%s,\"left\":%zu}", b.len,
             sum, b.data == body && b.len == len ? "true" : "false",
             b.data[b.len] == '\0' ? "true" : "false", b.map_len ? "true" : "false", left);
    srv_body_free(&b);
    srv_body_free(&b); /* released bodies are empty: a second free is a no-op */
    srv_reply_json(req, 200, out);
}

static void h_noreply(srv_req_t *req, void *ud)
{
    (void)req;
    (void)ud;
}

static void h_double(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_reply_json(req, 200, "{\"first\":true}");
    int rc = srv_reply_json(req, 200, "{\"second\":true}");
    pthread_mutex_lock(&T.mu);
    T.deferred_rc = rc;
    pthread_mutex_unlock(&T.mu);
}

/* /stream/incremental */
static void *prod_incremental(void *arg)
{
    srv_stream_t *s = arg;
    srv_stream_write(s, "data: one\n\n", 11);
    if (t_wait(&T.client_saw_first) != 0) {
        pthread_mutex_lock(&T.mu);
        T.incremental_timed_out = 1;
        pthread_mutex_unlock(&T.mu);
    }
    srv_stream_write(s, "data: two\n\n", 11);
    srv_stream_close(s, SRV_STREAM_END);
    return NULL;
}

static void h_stream_incremental(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_req_add_header(req, "Cache-Control", "no-cache");
    srv_stream_t *s = srv_stream_open(req, 200, "text/event-stream", NULL);
    if (s)
        spawn_producer(prod_incremental, s);
}

/* /stream/cancel */
static void on_cancel_cb(srv_stream_t *s, void *ud)
{
    (void)s;
    (void)ud;
    pthread_mutex_lock(&T.mu);
    T.cancel_cb_count++;
    T.cancel_cb_on_loop = pthread_equal(pthread_self(), g_loop_thread);
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
}

static void *prod_cancel(void *arg)
{
    srv_stream_t *s = arg;
    srv_stream_write(s, "first\n", 6);
    /* Write nothing more: the connection stays suspended, and only the
     * hang-up watch can tell us the client left. */
    uint64_t end = mono_ms() + WAIT_MS;
    int seen = 0;
    while (!seen && mono_ms() < end) {
        seen = srv_stream_cancelled(s);
        if (!seen)
            sleep_ms(5);
    }
    int w = srv_stream_write(s, "late\n", 5);
    srv_stream_close(s, SRV_STREAM_END);
    pthread_mutex_lock(&T.mu);
    T.saw_cancelled = seen;
    T.write_after_cancel = w;
    T.producer_done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_stream_cancel(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.on_cancel = on_cancel_cb, .probe = "\n"};
    srv_stream_t *s = srv_stream_open(req, 200, "text/plain", &so);
    if (s)
        spawn_producer(prod_cancel, s);
}

/* /bp: back-pressure */
#define BP_TOTAL 200000
#define BP_PIECE 600

static char bp_byte(size_t i)
{
    return (char)('a' + (i * 7 + i / 26) % 26);
}

static void on_writable_cb(srv_stream_t *s, void *ud)
{
    (void)s;
    (void)ud;
    pthread_mutex_lock(&T.mu);
    T.writable_count++;
    pthread_mutex_unlock(&T.mu);
}

static void *prod_bp(void *arg)
{
    srv_stream_t *s = arg;
    char piece[BP_PIECE];
    size_t off = BP_PIECE; /* the handler wrote the first piece */
    int errors = 0;
    while (off < BP_TOTAL) {
        size_t n = BP_TOTAL - off < BP_PIECE ? BP_TOTAL - off : BP_PIECE;
        for (size_t i = 0; i < n; i++)
            piece[i] = bp_byte(off + i);
        int rc = srv_stream_write(s, piece, n);
        if (rc == SRV_HTTP_EAGAIN) {
            if (srv_stream_wait_writable(s, n, WAIT_MS) != 0) {
                errors++;
                break;
            }
            continue;
        }
        if (rc != 0) {
            errors++;
            break;
        }
        off += n;
    }
    srv_stream_close(s, SRV_STREAM_END);
    pthread_mutex_lock(&T.mu);
    T.bp_errors = errors;
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_bp(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.max_buffered = 1024, .on_writable = on_writable_cb};
    srv_stream_t *s = srv_stream_open(req, 200, "application/octet-stream", &so);
    if (!s)
        return;
    char piece[BP_PIECE];
    for (size_t i = 0; i < BP_PIECE; i++)
        piece[i] = bp_byte(i);
    /* On the loop thread nothing can drain the buffer meanwhile, so the
     * second write must hit the bound. */
    T.bp_first = srv_stream_write(s, piece, BP_PIECE);
    T.bp_second = srv_stream_write(s, piece, BP_PIECE);
    T.bp_space = srv_stream_space(s);
    spawn_producer(prod_bp, s);
}

/* /abort */
static void h_abort(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_t *s = srv_stream_open(req, 200, "text/plain", NULL);
    if (!s)
        return;
    srv_stream_write(s, "partial", 7);
    srv_stream_close(s, SRV_STREAM_ABORT);
}

/* /deferred */
static void *prod_deferred(void *arg)
{
    srv_stream_t *s = arg;
    sleep_ms(20);
    srv_stream_add_header(s, "X-Deferred", "yes");
    int rc = srv_stream_reply(s, 201, "text/plain", "later", 5);
    pthread_mutex_lock(&T.mu);
    T.deferred_rc = rc;
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_deferred(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_t *s = srv_stream_defer(req, NULL);
    if (s)
        spawn_producer(prod_deferred, s);
}

/* /deferred-stream */
static void *prod_deferred_stream(void *arg)
{
    srv_stream_t *s = arg;
    sleep_ms(10);
    int rc = srv_stream_begin(s, 202, "application/x-ndjson");
    for (int i = 0; i < 3 && rc == 0; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "{\"i\":%d}\n", i);
        rc = srv_stream_write(s, line, (size_t)n);
        sleep_ms(5);
    }
    srv_stream_close(s, SRV_STREAM_END);
    pthread_mutex_lock(&T.mu);
    T.deferred_rc = rc;
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_deferred_stream(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_t *s = srv_stream_defer(req, NULL);
    if (s)
        spawn_producer(prod_deferred_stream, s);
}

static int cancel_cb_seen(void)
{
    pthread_mutex_lock(&T.mu);
    int n = T.cancel_cb_count;
    pthread_mutex_unlock(&T.mu);
    return n;
}

/* /deferred-hold: never answers until the client is gone. It also waits for
 * on_cancel: the loop runs that callback after marking the stream cancelled
 * and skips it once the producer has closed the stream (server/http/http.h), so a
 * producer that replied as soon as it saw the flag would race it. */
static void *prod_deferred_hold(void *arg)
{
    srv_stream_t *s = arg;
    uint64_t end = mono_ms() + WAIT_MS;
    while (!(srv_stream_cancelled(s) && cancel_cb_seen()) && mono_ms() < end)
        sleep_ms(5);
    int seen = srv_stream_cancelled(s);
    int rc = srv_stream_reply(s, 200, "text/plain", "too late", 8); /* releases s */
    pthread_mutex_lock(&T.mu);
    T.saw_cancelled = seen;
    T.deferred_rc = rc;
    T.producer_done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_deferred_hold(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.on_cancel = on_cancel_cb};
    srv_stream_t *s = srv_stream_defer(req, &so);
    if (s)
        spawn_producer(prod_deferred_hold, s);
}

/* /deferred-release: answers once T.release is set (or the client is gone). */
static void *prod_deferred_release(void *arg)
{
    srv_stream_t *s = arg;
    uint64_t end = mono_ms() + WAIT_MS;
    for (;;) {
        pthread_mutex_lock(&T.mu);
        int rel = T.release;
        pthread_mutex_unlock(&T.mu);
        if (rel || srv_stream_cancelled(s) || mono_ms() >= end)
            break;
        sleep_ms(5);
    }
    int seen = srv_stream_cancelled(s);
    int rc = srv_stream_reply(s, 200, "text/plain", "released", 8);
    pthread_mutex_lock(&T.mu);
    T.saw_cancelled = seen;
    T.deferred_rc = rc;
    T.producer_done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    return NULL;
}

static void h_deferred_release(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.on_cancel = on_cancel_cb};
    srv_stream_t *s = srv_stream_defer(req, &so);
    if (s)
        spawn_producer(prod_deferred_release, s);
}

/* /stream/hold: first chunk, then waits for T.release (or cancellation). */
static void *prod_hold(void *arg)
{
    srv_stream_t *s = arg;
    srv_stream_write(s, "a\n", 2);
    uint64_t end = mono_ms() + WAIT_MS;
    for (;;) {
        pthread_mutex_lock(&T.mu);
        int rel = T.release;
        pthread_mutex_unlock(&T.mu);
        if (rel || srv_stream_cancelled(s) || mono_ms() >= end)
            break;
        sleep_ms(5);
    }
    int seen = srv_stream_cancelled(s);
    if (!seen)
        srv_stream_write(s, "b\n", 2);
    pthread_mutex_lock(&T.mu);
    T.saw_cancelled = seen;
    T.producer_done = 1;
    pthread_cond_broadcast(&T.cv);
    pthread_mutex_unlock(&T.mu);
    if (seen) {
        /* Keep the stream past the server's end: writes must fail cleanly. */
        t_wait(&T.server_gone);
        int w = srv_stream_write(s, "z", 1);
        pthread_mutex_lock(&T.mu);
        T.write_after_close = w;
        pthread_mutex_unlock(&T.mu);
    }
    srv_stream_close(s, SRV_STREAM_END);
    return NULL;
}

static void h_stream_hold(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.on_cancel = on_cancel_cb};
    srv_stream_t *s = srv_stream_open(req, 200, "text/plain", &so);
    if (s)
        spawn_producer(prod_hold, s);
}

/* /stream/hold-probe: /stream/hold as an event stream with a probe. */
static void h_stream_hold_probe(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_opts_t so = {.on_cancel = on_cancel_cb, .probe = ": probe\n\n"};
    srv_stream_t *s = srv_stream_open(req, 200, "text/event-stream", &so);
    if (s)
        spawn_producer(prod_hold, s);
}

static void setup_routes(server_t *S)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    srv_route_opts_t pub = {.flags = SRV_ROUTE_PUBLIC | SRV_ROUTE_DRAIN_OK};
    srv_route_opts_t raw = {.max_body = 64};
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/echo", h_echo, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "POST", "/echo", h_echo, NULL, &json), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "POST", "/raw", h_echo, NULL, &raw), 0);
    srv_route_opts_t big = {.max_body = BIG_LIMIT};
    CHECK_INT_EQ(srv_http_route(S->h, "POST", "/big", h_big, NULL, &big), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "POST", "/v1/sessions/{id}/append", h_append, NULL, &json),
                 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/health", h_health, NULL, &pub), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/metrics", h_metrics, S->metrics, &pub), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/noreply", h_noreply, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/err/{id}", h_err, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/double", h_double, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/stream/incremental", h_stream_incremental, NULL,
                                NULL),
                 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/stream/cancel", h_stream_cancel, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/stream/hold", h_stream_hold, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/bp", h_bp, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/abort", h_abort, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/deferred", h_deferred, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/deferred-stream", h_deferred_stream, NULL, NULL),
                 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/deferred-hold", h_deferred_hold, NULL, NULL), 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/deferred-release", h_deferred_release, NULL, NULL),
                 0);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/stream/hold-probe", h_stream_hold_probe, NULL,
                                NULL),
                 0);
    /* malformed patterns are refused */
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "no-slash", h_echo, NULL, NULL), SRV_HTTP_EINVAL);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/a//b", h_echo, NULL, NULL), SRV_HTTP_EINVAL);
    CHECK_INT_EQ(srv_http_route(S->h, "GET", "/a/{}", h_echo, NULL, NULL), SRV_HTTP_EINVAL);
    CHECK_INT_EQ(srv_http_route(S->h, "get", "/a", h_echo, NULL, NULL), SRV_HTTP_EINVAL);
}

/* The main server: auth, CORS, small body limit. */
static server_t A;
static const char *const a_keys[] = {API_KEY, API_KEY2};
static const char *const a_origins[] = {ORIGIN_OK};
#define AUTH "Authorization: Bearer " API_KEY "\r\n"

static void start_a(void)
{
    memset(&A, 0, sizeof A);
    A.metrics = srv_metrics_new();
    A.opts = (srv_http_opts_t){
        .host = "127.0.0.1",
        .port = 0,
        .max_body = 1024,
        .idle_timeout_s = 30,
        .api_keys = a_keys,
        .n_api_keys = 2,
        .cors_origins = a_origins,
        .n_cors_origins = 1,
        .metrics = A.metrics,
    };
    A.setup = setup_routes;
}

static void do_inflight_a(server_t *S, void *arg)
{
    *(size_t *)arg = srv_http_inflight(S->h);
}

/* ---------------------------------------------------------------- tests */

TEST(test_echo_and_request_ids)
{
    resp_t r;
    char v[256], id1[128] = "", id2[128] = "";
    CHECK(http_get(A.port, "/echo?x=hello%20there", AUTH "X-Test: yes\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"path\":\"/echo\""));
    CHECK(r.body && strstr(r.body, "\"x\":\"hello there\""));
    CHECK(r.body && strstr(r.body, "\"test\":\"yes\""));
    CHECK(resp_header(&r, "X-Echo", v, sizeof v) && strcmp(v, "1") == 0);
    CHECK(resp_header(&r, "Content-Type", v, sizeof v) && strcmp(v, "application/json") == 0);
    CHECK(resp_header(&r, "X-Request-Id", id1, sizeof id1) && strlen(id1) == 16);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", AUTH, &r) == 0);
    CHECK(resp_header(&r, "X-Request-Id", id2, sizeof id2) && strlen(id2) == 16);
    CHECK(strcmp(id1, id2) != 0);
    resp_free(&r);
    /* a client's own id is kept; an unusable one is replaced */
    CHECK(http_get(A.port, "/echo", AUTH "X-Request-Id: client-id.42\r\n", &r) == 0);
    CHECK(resp_header(&r, "X-Request-Id", v, sizeof v) && strcmp(v, "client-id.42") == 0);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", AUTH "X-Request-Id: bad id with spaces\r\n", &r) == 0);
    CHECK(resp_header(&r, "X-Request-Id", v, sizeof v) && strlen(v) == 16);
    resp_free(&r);
    /* HEAD reaches the GET route, without a body */
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "HEAD /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK_INT_EQ(r.body_len, 0);
    resp_free(&r);
    free(b.p);
}

TEST(test_routing_errors)
{
    resp_t r;
    char v[256];
    CHECK(http_get(A.port, "/nope", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 404);
    CHECK(r.body && strstr(r.body, "\"code\":\"not_found\""));
    CHECK(r.body && strstr(r.body, "{\"error\":{\"message\":"));
    CHECK(resp_header(&r, "X-Request-Id", v, sizeof v) != NULL);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo/", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 404);
    resp_free(&r);

    CHECK(http_do(A.port, "DELETE /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH "\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 405);
    CHECK(resp_header(&r, "Allow", v, sizeof v) != NULL);
    CHECK_STR_EQ(v, "GET, HEAD, POST, OPTIONS");
    CHECK(r.body && strstr(r.body, "method_not_allowed"));
    resp_free(&r);

    CHECK(http_post(A.port, "/v1/sessions/abc-123/append", "application/json", "{\"t\":1}", AUTH,
                    &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"id\":\"abc-123\""));
    CHECK(r.body && strstr(r.body, "\"len\":7"));
    CHECK(r.body && strstr(r.body, "\"route\":\"/v1/sessions/{id}/append\""));
    resp_free(&r);
    CHECK(http_post(A.port, "/v1/sessions//append", "application/json", "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 404);
    resp_free(&r);
    CHECK(http_get(A.port, "/v1/sessions/abc/append", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 405);
    CHECK(resp_header(&r, "Allow", v, sizeof v) && strcmp(v, "POST, OPTIONS") == 0);
    resp_free(&r);

    /* error objects are valid JSON whatever the message holds */
    CHECK(http_get(A.port, "/err/s1", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 409);
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    CHECK(j != NULL);
    json_t *e = json_object_get(j, "error");
    CHECK_STR_EQ(json_string_value(json_object_get(e, "message")),
                 "session 's1' is busy: \"caf\xc3\xa9 ?\"\n");
    CHECK_STR_EQ(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    CHECK_STR_EQ(json_string_value(json_object_get(e, "param")), "session");
    CHECK_STR_EQ(json_string_value(json_object_get(e, "code")), "session_busy");
    json_decref(j);
    resp_free(&r);
    CHECK(http_get(A.port, "/nope", AUTH, &r) == 0);
    j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    CHECK(j && json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
    resp_free(&r);

    /* a handler that does not answer gets 500; a second answer is refused */
    CHECK(http_get(A.port, "/noreply", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 500);
    resp_free(&r);
    CHECK(http_get(A.port, "/double", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "first"));
    CHECK_INT_EQ(T.deferred_rc, SRV_HTTP_ESTATE);
    resp_free(&r);
}

TEST(test_body_limits)
{
    resp_t r;
    char body[1100];
    /* exactly at the limit (1024) */
    memset(body, 'a', 1024);
    body[0] = '"';
    body[1023] = '"';
    body[1024] = '\0';
    CHECK(http_post(A.port, "/echo", "application/json", body, AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"len\":1024"));
    resp_free(&r);
    /* one byte over, announced by Content-Length: 413 before the body is read */
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" AUTH
                 "Content-Length: 1025\r\n\r\n");
    CHECK(read_until_contains(fd, &b, "\r\n\r\n", WAIT_MS) == 0);
    CHECK(b.p && strncmp(b.p, "HTTP/1.1 413", 12) == 0);
    close(fd);
    free(b.p);
    /* chunked body that grows past the limit */
    buf_t req = {0};
    const char *head = "POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                       "Content-Type: application/json\r\n" AUTH
                       "Transfer-Encoding: chunked\r\n\r\n";
    buf_add(&req, head, strlen(head));
    char chunk[600];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < 3; i++) {
        buf_add(&req, "258\r\n", 5); /* 0x258 = 600 */
        buf_add(&req, chunk, sizeof chunk);
        buf_add(&req, "\r\n", 2);
    }
    buf_add(&req, "0\r\n\r\n", 5);
    CHECK(http_do(A.port, req.p, &r) == 0);
    CHECK_INT_EQ(r.status, 413);
    CHECK(r.body && strstr(r.body, "request_too_large"));
    resp_free(&r);
    free(req.p);
    /* a route with its own smaller limit */
    CHECK(http_post(A.port, "/raw", "text/plain",
                    "0123456789012345678901234567890123456789012345678901234567890123456789", AUTH,
                    &r) == 0);
    CHECK_INT_EQ(r.status, 413);
    resp_free(&r);
}

static char big_byte(size_t i)
{
    return (char)('a' + (i * 13 + i / 977) % 26);
}

/* Sends a /big request of n bytes (chunked in 64 KiB pieces, or with a
 * Content-Length) and returns the answer; with end 0 the last chunk is
 * never sent (the answer must come in the middle of the body). */
static int big_post(int port, size_t n, int chunked, int end, resp_t *r)
{
    int fd = tcp_connect(port);
    if (fd < 0)
        return -1;
    char head[512];
    snprintf(head, sizeof head,
             "POST /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH "%s\r\n",
             chunked ? "Transfer-Encoding: chunked\r\n" : "");
    if (!chunked)
        snprintf(head + strlen(head) - 2, sizeof head - strlen(head) + 2,
                 "Content-Length: %zu\r\n\r\n", n);
    send_str(fd, head);
    static char piece[65536 + 16];
    buf_t got = {0};
    for (size_t off = 0; off < n;) {
        size_t k = n - off < 65536 ? n - off : 65536;
        size_t h = chunked ? (size_t)snprintf(piece, 16, "%zx\r\n", k) : 0;
        for (size_t i = 0; i < k; i++)
            piece[h + i] = big_byte(off + i);
        if (chunked)
            memcpy(piece + h + k, "\r\n", 2);
        if (send_all(fd, piece, h + k + (chunked ? 2 : 0)) != 0)
            break; /* answered and closed: read it */
        off += k;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (!end && poll(&pfd, 1, 0) == 1)
            break; /* the answer came while the body was still coming */
    }
    if (chunked && end)
        send_str(fd, "0\r\n\r\n");
    int rc = read_until_close(fd, &got, WAIT_MS);
    close(fd);
    rc = rc == 0 && got.p ? parse_resp(got.p, got.len, r) : -1;
    free(got.p);
    return rc;
}

TEST(test_large_bodies)
{
    const size_t n = (size_t)5 << 19; /* 2.5 MiB: past the 1 MiB kept in memory */
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (unsigned char)big_byte(i) * (i % 7 + 1);
    char want[128];
    /* n is a multiple of the page size: the NUL after it is on a page of
     * its own in the mapping */
    snprintf(want, sizeof want,
             "{\"len\":%zu,\"sum\":%llu,\"same\":true,\"nul\":true,\"mapped\":true,\"left\":0}", n,
             sum);
    resp_t r;
    for (int chunked = 0; chunked < 2; chunked++) {
        CHECK(big_post(A.port, n, chunked, 1, &r) == 0);
        CHECK_INT_EQ(r.status, 200);
        CHECK_MSG(r.body && strstr(r.body, want), "chunked %d: %s", chunked, r.body);
        resp_free(&r);
    }
    /* a body kept in memory is taken as it is */
    CHECK(big_post(A.port, 4096, 0, 1, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK_MSG(r.body && strstr(r.body, "\"len\":4096,") &&
                  strstr(r.body, "\"same\":true,\"nul\":true,\"mapped\":false,\"left\":0"),
              "%s", r.body);
    resp_free(&r);
    /* a chunked body past the limit is answered while it still arrives
     * (the old server waited for its end), once, with a JSON error */
    CHECK(big_post(A.port, BIG_LIMIT * 4, 1, 0, &r) == 0);
    CHECK_INT_EQ(r.status, 413);
    CHECK(r.body && strstr(r.body, "request_too_large"));
    resp_free(&r);
    /* the upload slots came back: the next one is taken */
    CHECK(big_post(A.port, n, 1, 1, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
}

TEST(test_content_type)
{
    resp_t r;
    CHECK(http_post(A.port, "/echo", "text/plain", "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 415);
    CHECK(r.body && strstr(r.body, "unsupported_media_type"));
    resp_free(&r);
    CHECK(http_post(A.port, "/echo", NULL, "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 415);
    resp_free(&r);
    CHECK(http_post(A.port, "/echo", "application/json; charset=utf-8", "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
    CHECK(http_post(A.port, "/echo", "Application/JSON", "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
    CHECK(http_post(A.port, "/echo", "application/jsonx", "{}", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 415);
    resp_free(&r);
    /* no body, no Content-Type: the handler decides */
    CHECK(http_post(A.port, "/echo", NULL, "", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"len\":0"));
    resp_free(&r);
    /* routes without SRV_ROUTE_JSON take anything */
    CHECK(http_post(A.port, "/raw", "text/plain", "hi", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
}

TEST(test_auth)
{
    resp_t r;
    char v[128];
    CHECK(http_get(A.port, "/echo", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    CHECK(resp_header(&r, "WWW-Authenticate", v, sizeof v) && strcmp(v, "Bearer") == 0);
    CHECK(r.body && strstr(r.body, "invalid_api_key"));
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "Authorization: Bearer sekret-key-X\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "Authorization: Bearer sekret-key-10\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "Authorization: Bearer sekret-key-\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "Authorization: Basic " API_KEY "\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "Authorization: bearer " API_KEY "\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", "X-Api-Key: " API_KEY2 "\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
    /* /health is open */
    CHECK(http_get(A.port, "/health", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"ok\""));
    resp_free(&r);
    /* without the key, unknown paths and methods are 401 as well: a client
     * without a key cannot map the routes */
    CHECK(http_get(A.port, "/nope", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    CHECK(resp_header(&r, "WWW-Authenticate", v, sizeof v) && strcmp(v, "Bearer") == 0);
    resp_free(&r);
    CHECK(http_get(A.port, "/nope", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 404);
    resp_free(&r);
    CHECK(http_do(A.port, "DELETE /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    CHECK(resp_header(&r, "Allow", v, sizeof v) == NULL);
    resp_free(&r);
    CHECK(http_do(A.port,
                  "DELETE /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH "\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 405);
    resp_free(&r);
    CHECK(http_do(A.port, "OPTIONS /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    resp_free(&r);
    /* the public path keeps answering without a key, also its 405 */
    CHECK(http_do(A.port,
                  "POST /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                  "Content-Length: 0\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 405);
    resp_free(&r);
}

TEST(test_cors)
{
    resp_t r;
    char v[256];
    CHECK(http_get(A.port, "/echo", AUTH "Origin: " ORIGIN_OK "\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
          strcmp(v, ORIGIN_OK) == 0);
    CHECK(resp_header(&r, "Vary", v, sizeof v) && strcmp(v, "Origin") == 0);
    CHECK(resp_header(&r, "Access-Control-Expose-Headers", v, sizeof v) &&
          strstr(v, "X-Request-Id"));
    resp_free(&r);
    /* errors carry CORS headers too, so the browser can read them */
    CHECK(http_get(A.port, "/echo", "Origin: " ORIGIN_OK "\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 401);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) != NULL);
    resp_free(&r);
    CHECK(http_get(A.port, "/echo", AUTH "Origin: https://evil.example\r\n", &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) == NULL);
    resp_free(&r);
    /* preflight: no key needed */
    CHECK(http_do(A.port,
                  "OPTIONS /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nOrigin: " ORIGIN_OK
                  "\r\nAccess-Control-Request-Method: POST\r\n"
                  "Access-Control-Request-Headers: content-type, authorization\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 204);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) &&
          strcmp(v, ORIGIN_OK) == 0);
    CHECK(resp_header(&r, "Access-Control-Allow-Methods", v, sizeof v) && strstr(v, "POST"));
    CHECK(resp_header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
          strstr(v, "Authorization") && strstr(v, "Content-Type"));
    CHECK(resp_header(&r, "Access-Control-Max-Age", v, sizeof v) != NULL);
    resp_free(&r);
    /* the headers an SDK asks for are allowed, each once; a name that is not
     * a token is not */
    CHECK(http_do(A.port,
                  "OPTIONS /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nOrigin: " ORIGIN_OK
                  "\r\nAccess-Control-Request-Method: POST\r\n"
                  "Access-Control-Request-Headers: authorization,content-type,x-stainless-os,"
                  "x-stainless-lang, x-stainless-os,bad(name)\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 204);
    CHECK(resp_header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
          strcmp(v, "Authorization, Content-Type, X-Api-Key, X-Request-Id, x-stainless-os, "
                    "x-stainless-lang") == 0);
    resp_free(&r);
    CHECK(http_do(A.port,
                  "OPTIONS /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nOrigin: "
                  "https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 204);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) == NULL);
    CHECK(resp_header(&r, "Access-Control-Allow-Methods", v, sizeof v) == NULL);
    resp_free(&r);
    CHECK(http_do(A.port,
                  "OPTIONS /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH "\r\n",
                  &r) == 0);
    CHECK_INT_EQ(r.status, 404);
    resp_free(&r);
}

TEST(test_keepalive)
{
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "GET /echo?x=1 HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    CHECK(read_until_contains(fd, &b, "\"x\":\"1\"", WAIT_MS) == 0);
    send_str(fd, "GET /nope HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    CHECK(read_until_contains(fd, &b, "HTTP/1.1 404", WAIT_MS) == 0);
    send_str(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" AUTH
                 "Content-Length: 2\r\nConnection: close\r\n\r\n{}");
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    CHECK_MSG(b.p && strstr(b.p, "\"body\":\"{}\""), "got: %s", b.p ? b.p : "");
    close(fd);
    free(b.p);
}

TEST(test_stream_incremental)
{
    t_reset();
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "GET /stream/incremental HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH
                 "\r\n");
    /* The producer writes "two" only after we report having seen "one". */
    CHECK(read_until_contains(fd, &b, "data: one", WAIT_MS) == 0);
    CHECK(!strstr(b.p ? b.p : "", "data: two"));
    t_set(&T.client_saw_first);
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    join_producer();
    resp_t r;
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.chunked && r.chunked_complete);
    CHECK(r.body && strcmp(r.body, "data: one\n\ndata: two\n\n") == 0);
    char v[128];
    CHECK(resp_header(&r, "Content-Type", v, sizeof v) && strcmp(v, "text/event-stream") == 0);
    CHECK(resp_header(&r, "Cache-Control", v, sizeof v) && strcmp(v, "no-cache") == 0);
    CHECK_INT_EQ(T.incremental_timed_out, 0);
    resp_free(&r);
    free(b.p);
}

TEST(test_stream_cancel_while_suspended)
{
    t_reset();
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "GET /stream/cancel HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    CHECK(read_until_contains(fd, &b, "first\n", WAIT_MS) == 0);
    close(fd); /* the producer is idle: only the hang-up watch can see this */
    CHECK(t_wait(&T.producer_done) == 0);
    join_producer();
    pthread_mutex_lock(&T.mu);
    CHECK_INT_EQ(T.saw_cancelled, 1);
    CHECK_INT_EQ(T.cancel_cb_count, 1);
    CHECK_INT_EQ(T.cancel_cb_on_loop, 1);
    CHECK_INT_EQ(T.write_after_cancel, SRV_HTTP_ECANCELED);
    pthread_mutex_unlock(&T.mu);
    free(b.p);
}

TEST(test_backpressure)
{
    t_reset();
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "GET /bp HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" AUTH "\r\n");
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    join_producer();
    CHECK_INT_EQ(T.bp_first, 0);
    CHECK_INT_EQ(T.bp_second, SRV_HTTP_EAGAIN);
    CHECK_INT_EQ(T.bp_space, 1024 - BP_PIECE);
    CHECK_INT_EQ(T.bp_errors, 0);
    CHECK(T.writable_count >= 1);
    resp_t r;
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK(r.chunked_complete);
    CHECK_INT_EQ(r.body_len, BP_TOTAL);
    size_t bad = 0;
    for (size_t i = 0; r.body && i < r.body_len; i++)
        bad += r.body[i] != bp_byte(i);
    CHECK_INT_EQ(bad, 0);
    resp_free(&r);
    free(b.p);
}

TEST(test_abort_and_deferred)
{
    resp_t r;
    char v[64];
    t_reset();
    CHECK(http_get(A.port, "/abort", AUTH, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.chunked && !r.chunked_complete); /* cut, never a clean end */
    CHECK(r.body && strcmp(r.body, "partial") == 0);
    resp_free(&r);

    CHECK(http_get(A.port, "/deferred", AUTH "Origin: " ORIGIN_OK "\r\n", &r) == 0);
    join_producer();
    CHECK_INT_EQ(r.status, 201);
    CHECK(resp_header(&r, "Content-Length", v, sizeof v) && strcmp(v, "5") == 0);
    CHECK(resp_header(&r, "X-Deferred", v, sizeof v) && strcmp(v, "yes") == 0);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin", v, sizeof v) != NULL);
    CHECK(resp_header(&r, "X-Request-Id", v, sizeof v) != NULL);
    CHECK(r.body && strcmp(r.body, "later") == 0);
    CHECK_INT_EQ(T.deferred_rc, 0);
    resp_free(&r);

    CHECK(http_get(A.port, "/deferred-stream", AUTH, &r) == 0);
    join_producer();
    CHECK_INT_EQ(r.status, 202);
    CHECK(r.chunked_complete);
    CHECK(r.body && strcmp(r.body, "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n") == 0);
    CHECK(resp_header(&r, "Content-Type", v, sizeof v) && strcmp(v, "application/x-ndjson") == 0);
    CHECK_INT_EQ(T.deferred_rc, 0);
    resp_free(&r);
}

/* Waits until the request on A is in flight (its handler ran, the
 * connection waits for the producer). */
static void wait_inflight_a(void)
{
    size_t inflight = 0;
    uint64_t end = mono_ms() + WAIT_MS;
    while (inflight == 0 && mono_ms() < end) {
        server_call(&A, do_inflight_a, &inflight);
        if (!inflight)
            sleep_ms(5);
    }
    CHECK_INT_EQ(inflight, 1);
}

/* A client that shuts down its sending side after its request still gets
 * the answer: the server's probe (an interim 100 Continue before the
 * answer, the stream's probe bytes during it) reaches it instead of a cut,
 * and the answer ends with the connection (Connection: close). */
TEST(test_half_closed_client_gets_its_answer)
{
    t_reset();
    int fd = tcp_connect(A.port);
    buf_t b = {0};
    send_str(fd, "GET /deferred-release HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    wait_inflight_a();
    CHECK(shutdown(fd, SHUT_WR) == 0);
    CHECK(read_until_contains(fd, &b, "HTTP/1.1 100 Continue\r\n\r\n", WAIT_MS) == 0);
    t_set(&T.release);
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    CHECK(t_wait(&T.producer_done) == 0);
    join_producer();
    resp_t r;
    const char *fin = b.p ? strstr(b.p, "HTTP/1.1 200") : NULL;
    CHECK_MSG(fin, "got: %s", b.p ? b.p : "");
    if (fin) {
        CHECK(parse_resp(fin, b.len - (size_t)(fin - b.p), &r) == 0);
        CHECK_INT_EQ(r.status, 200);
        CHECK(r.body && strcmp(r.body, "released") == 0);
        char v[32];
        CHECK(resp_header(&r, "Connection", v, sizeof v) && strcasecmp(v, "close") == 0);
        resp_free(&r);
    }
    pthread_mutex_lock(&T.mu);
    CHECK_INT_EQ(T.saw_cancelled, 0);
    CHECK_INT_EQ(T.deferred_rc, 0);
    pthread_mutex_unlock(&T.mu);
    free(b.p);

    /* the same during a stream */
    t_reset();
    memset(&b, 0, sizeof b);
    fd = tcp_connect(A.port);
    send_str(fd, "GET /stream/hold-probe HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    CHECK(read_until_contains(fd, &b, "a\n", WAIT_MS) == 0);
    CHECK(shutdown(fd, SHUT_WR) == 0);
    CHECK(read_until_contains(fd, &b, ": probe\n\n", WAIT_MS) == 0);
    t_set(&T.release);
    CHECK(t_wait(&T.producer_done) == 0);
    join_producer();
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.chunked_complete);
    CHECK(r.body && strcmp(r.body, "a\n: probe\n\nb\n") == 0);
    resp_free(&r);
    pthread_mutex_lock(&T.mu);
    CHECK_INT_EQ(T.saw_cancelled, 0);
    pthread_mutex_unlock(&T.mu);
    free(b.p);
}

TEST(test_deferred_client_gone)
{
    t_reset();
    int fd = tcp_connect(A.port);
    send_str(fd, "GET /deferred-hold HTTP/1.1\r\nHost: t\r\n" AUTH "\r\n");
    /* the request is waiting (suspended) once the handler has run; wait for
     * the in-flight count to show it, then hang up */
    size_t inflight = 0;
    uint64_t end = mono_ms() + WAIT_MS;
    while (inflight == 0 && mono_ms() < end) {
        server_call(&A, do_inflight_a, &inflight);
        if (!inflight)
            sleep_ms(5);
    }
    CHECK_INT_EQ(inflight, 1);
    close(fd);
    CHECK(t_wait(&T.producer_done) == 0);
    join_producer();
    pthread_mutex_lock(&T.mu);
    CHECK_INT_EQ(T.saw_cancelled, 1);
    CHECK_INT_EQ(T.cancel_cb_count, 1);
    CHECK_INT_EQ(T.deferred_rc, SRV_HTTP_ECANCELED);
    pthread_mutex_unlock(&T.mu);
}

TEST(test_metrics_exposition)
{
    resp_t r;
    char v[128];
    CHECK(http_get(A.port, "/metrics", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(resp_header(&r, "Content-Type", v, sizeof v) && strstr(v, "version=0.0.4"));
    /* 404s are counted under route "unmatched"; earlier tests made several */
    CHECK(r.body && strstr(r.body, "darkserve_http_requests_total{method=\"GET\",route=\"/echo\","
                                   "code=\"200\"}"));
    CHECK(r.body && strstr(r.body, "route=\"unmatched\",code=\"404\"}"));
    CHECK(r.body && strstr(r.body, "darkserve_http_request_duration_seconds_bucket{route=\"/echo\","
                                   "le=\"+Inf\"}"));
    /* test_stream_cancel_while_suspended and test_deferred_client_gone */
    CHECK(r.body && strstr(r.body, "darkserve_http_stream_cancels_total 2\n"));
    resp_free(&r);
}

TEST(test_main_start)
{
    start_a();
    CHECK(server_start(&A) == 0);
}

TEST(test_main_stop)
{
    CHECK_INT_EQ(server_stop(&A), 0); /* uv_loop_close() == 0 */
    srv_metrics_free(A.metrics);
}

/* ---- timeouts: a slow-loris client is cut ---- */

static server_t B;

static int start_b(unsigned idle_s, unsigned request_s)
{
    memset(&B, 0, sizeof B);
    B.metrics = srv_metrics_new();
    B.opts = (srv_http_opts_t){.port = 0,
                               .idle_timeout_s = idle_s,
                               .request_timeout_s = request_s,
                               .metrics = B.metrics};
    B.setup = setup_routes;
    return server_start(&B);
}

TEST(test_idle_timeout)
{
    /* no request timeout: only MHD's idle timeout can act */
    if (start_b(1, 0) != 0) {
        CHECK(0);
        return;
    }
    /* Half a header, then silence. */
    int fd = tcp_connect(B.port);
    buf_t b = {0};
    send_str(fd, "GET /echo HTTP/1.1\r\nHost: t\r\nX-Half: ");
    CHECK_INT_EQ(read_until_close(fd, &b, WAIT_MS), 0);
    CHECK(!b.p || !strstr(b.p, "200 OK"));
    close(fd);
    free(b.p);
    CHECK_INT_EQ(server_stop(&B), 0);
    srv_metrics_free(B.metrics);
}

TEST(test_request_timeout)
{
    /* A byte every 200 ms never looks idle (1 s): only the request timeout
     * can cut it. */
    if (start_b(1, 2) != 0) {
        CHECK(0);
        return;
    }
    int fd = tcp_connect(B.port);
    send_str(fd, "GET /echo HTTP/1.1\r\nHost: t\r\nX-Slow: ");
    uint64_t end = mono_ms() + WAIT_MS;
    int cut = 0;
    while (!cut && mono_ms() < end) {
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) {
            cut = 1;
            break;
        }
        buf_t tmp = {0};
        ssize_t rr = recv_wait(fd, &tmp, 200);
        free(tmp.p);
        if (rr == 0 || rr == -1)
            cut = 1;
    }
    CHECK_MSG(cut, "trickling client was not cut within %d ms", WAIT_MS);
    close(fd);

    /* the server still serves, and counted the cut */
    resp_t r;
    CHECK(http_get(B.port, "/metrics", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 200);
    CHECK(r.body && strstr(r.body, "darkserve_http_request_timeouts_total 1\n"));
    resp_free(&r);
    CHECK_INT_EQ(server_stop(&B), 0);
    srv_metrics_free(B.metrics);
}

/* ---- connection limit ---- */

static server_t C;

TEST(test_connection_limit)
{
    memset(&C, 0, sizeof C);
    C.opts = (srv_http_opts_t){.port = 0, .max_connections = 2, .idle_timeout_s = 30};
    C.setup = setup_routes;
    if (server_start(&C) != 0) {
        CHECK(0);
        return;
    }
    int a = tcp_connect(C.port), b2 = tcp_connect(C.port);
    /* make sure both are accepted and alive (keep-alive requests) */
    buf_t ba = {0}, bb = {0};
    send_str(a, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    send_str(b2, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    CHECK(read_until_contains(a, &ba, "\"ok\"", WAIT_MS) == 0);
    CHECK(read_until_contains(b2, &bb, "\"ok\"", WAIT_MS) == 0);
    /* a third one is not served while two are open */
    int c3 = tcp_connect(C.port);
    buf_t bc = {0};
    if (c3 >= 0) {
        send_str(c3, "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        ssize_t rr = recv_wait(c3, &bc, 300);
        CHECK_MSG(rr == -2 || rr == 0 || rr == -1, "third connection got a response");
        CHECK(!bc.p || !strstr(bc.p, "\"ok\""));
        /* once one closes, a new client is served */
        close(a);
        a = -1;
        if (rr == -2) {
            CHECK(read_until_close(c3, &bc, WAIT_MS) == 0);
            CHECK(bc.p && strstr(bc.p, "\"ok\""));
        } else {
            resp_t r;
            CHECK(http_get(C.port, "/health", NULL, &r) == 0);
            CHECK_INT_EQ(r.status, 200);
            resp_free(&r);
        }
        close(c3);
    }
    if (a >= 0)
        close(a);
    close(b2);
    free(ba.p);
    free(bb.p);
    free(bc.p);
    CHECK_INT_EQ(server_stop(&C), 0);
}

/* One address cannot take every slot: past max_connections_per_address
 * its new connections are closed at once (another address is still
 * served), and header_timeout_s cuts connections that never finish their
 * first request's headers. */
static server_t P;

static int tcp_connect_from(int port, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me, sa;
    memset(&me, 0, sizeof me);
    me.sin_family = AF_INET;
    inet_pton(AF_INET, src, &me.sin_addr);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

TEST(test_per_address_limit_and_header_timeout)
{
    memset(&P, 0, sizeof P);
    P.metrics = srv_metrics_new();
    P.opts = (srv_http_opts_t){.port = 0, .max_connections = 8, .max_connections_per_address = 2,
                               .header_timeout_s = 1, .request_timeout_s = 600,
                               .idle_timeout_s = 600, .metrics = P.metrics};
    P.setup = setup_routes;
    if (server_start(&P) != 0) {
        CHECK(0);
        return;
    }
    int half[2];
    for (int i = 0; i < 2; i++) {
        half[i] = tcp_connect_from(P.port, "127.0.0.2");
        CHECK(half[i] >= 0);
        send_str(half[i], "GET /health HTTP/1.1\r\nHost: t\r\nX-Half: ");
    }
    /* a third from the same address is closed without an answer */
    int third = tcp_connect_from(P.port, "127.0.0.2");
    buf_t b3 = {0};
    if (third >= 0) {
        send_str(third, "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        CHECK(read_until_close(third, &b3, WAIT_MS) == 0);
        CHECK_MSG(!b3.p || !strstr(b3.p, "\"ok\""), "got: %s", b3.p);
        close(third);
    }
    /* another address is served */
    int other = tcp_connect_from(P.port, "127.0.0.3");
    buf_t bo = {0};
    CHECK(other >= 0);
    send_str(other, "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    CHECK(read_until_close(other, &bo, WAIT_MS) == 0);
    CHECK(bo.p && strstr(bo.p, "\"ok\""));
    close(other);
    /* the half-sent headers are cut by the header timeout (not the 600 s
     * request or idle timeouts) */
    for (int i = 0; i < 2; i++) {
        buf_t bh = {0};
        CHECK(read_until_close(half[i], &bh, WAIT_MS) == 0);
        close(half[i]);
        free(bh.p);
    }
    resp_t r;
    CHECK(http_get(P.port, "/metrics", NULL, &r) == 0);
    CHECK(r.body && strstr(r.body, "darkserve_http_request_timeouts_total 2\n"));
    resp_free(&r);
    free(b3.p);
    free(bo.p);
    CHECK_INT_EQ(server_stop(&P), 0);
    srv_metrics_free(P.metrics);
}

/* ---- drain: new requests get 503, open streams finish ---- */

static server_t D;

static void do_drain(server_t *S, void *arg)
{
    (void)arg;
    srv_http_drain(S->h);
}

static void do_inflight(server_t *S, void *arg)
{
    *(size_t *)arg = srv_http_inflight(S->h);
}

TEST(test_drain)
{
    t_reset();
    memset(&D, 0, sizeof D);
    D.opts = (srv_http_opts_t){.port = 0, .idle_timeout_s = 30};
    D.setup = setup_routes;
    if (server_start(&D) != 0) {
        CHECK(0);
        return;
    }
    int fd = tcp_connect(D.port);
    buf_t b = {0};
    send_str(fd, "GET /stream/hold HTTP/1.1\r\nHost: t\r\n\r\n");
    CHECK(read_until_contains(fd, &b, "a\n", WAIT_MS) == 0);
    CHECK(server_call(&D, do_drain, NULL) == 0);
    resp_t r;
    char v[64];
    CHECK(http_get(D.port, "/echo", NULL, &r) == 0);
    CHECK_INT_EQ(r.status, 503);
    CHECK(r.body && strstr(r.body, "draining"));
    CHECK(resp_header(&r, "Connection", v, sizeof v) && strcasecmp(v, "close") == 0);
    resp_free(&r);
    CHECK(http_get(D.port, "/health", NULL, &r) == 0); /* DRAIN_OK: its handler runs */
    CHECK_INT_EQ(r.status, 503);
    CHECK(r.body && strstr(r.body, "{\"status\":\"draining\"}"));
    resp_free(&r);
    size_t inflight = 99;
    CHECK(server_call(&D, do_inflight, &inflight) == 0);
    CHECK_INT_EQ(inflight, 1);
    t_set(&T.release);
    /* the open stream finishes, and its response says Connection: close */
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    close(fd);
    join_producer();
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK(r.chunked_complete);
    CHECK(r.body && strcmp(r.body, "a\nb\n") == 0);
    resp_free(&r);
    free(b.p);
    uint64_t end = mono_ms() + WAIT_MS;
    do {
        CHECK(server_call(&D, do_inflight, &inflight) == 0);
        if (inflight)
            sleep_ms(10);
    } while (inflight && mono_ms() < end);
    CHECK_INT_EQ(inflight, 0);
    CHECK_INT_EQ(server_stop(&D), 0);
}

/* ---- not ready (the application is loading) ---- */

static void do_set_ready(server_t *S, void *arg)
{
    srv_http_set_ready(S->h, *(int *)arg);
}

TEST(test_not_ready)
{
    t_reset();
    memset(&D, 0, sizeof D);
    D.opts = (srv_http_opts_t){.port = 0, .idle_timeout_s = 30};
    D.setup = setup_routes;
    if (server_start(&D) != 0) {
        CHECK(0);
        return;
    }
    int ready = 0;
    CHECK(server_call(&D, do_set_ready, &ready) == 0);
    resp_t r;
    CHECK(http_get(D.port, "/echo", NULL, &r) == 0); /* a work route: refused */
    CHECK_INT_EQ(r.status, 503);
    CHECK(r.body && strstr(r.body, "\"loading\""));
    resp_free(&r);
    CHECK(http_get(D.port, "/health", NULL, &r) == 0); /* DRAIN_OK: its handler answers */
    CHECK_INT_EQ(r.status, 200);
    resp_free(&r);
    CHECK(http_get(D.port, "/no/such/route", NULL, &r) == 0); /* unknown stays 404 */
    CHECK_INT_EQ(r.status, 404);
    resp_free(&r);
    ready = 1;
    CHECK(server_call(&D, do_set_ready, &ready) == 0);
    CHECK(http_get(D.port, "/echo", NULL, &r) == 0);
    CHECK(r.status != 503);
    resp_free(&r);
    CHECK_INT_EQ(server_stop(&D), 0);
}

/* ---- closing the server under an open stream ---- */

static server_t E;

TEST(test_close_with_open_stream)
{
    t_reset();
    memset(&E, 0, sizeof E);
    E.opts = (srv_http_opts_t){.port = 0};
    E.setup = setup_routes;
    if (server_start(&E) != 0) {
        CHECK(0);
        return;
    }
    int fd = tcp_connect(E.port);
    buf_t b = {0};
    send_str(fd, "GET /stream/hold HTTP/1.1\r\nHost: t\r\n\r\n");
    CHECK(read_until_contains(fd, &b, "a\n", WAIT_MS) == 0);
    CHECK_INT_EQ(server_stop(&E), 0); /* uv_loop_close() == 0 with a stream still open */
    CHECK(t_wait(&T.producer_done) == 0);
    pthread_mutex_lock(&T.mu);
    CHECK_INT_EQ(T.saw_cancelled, 1);
    CHECK_INT_EQ(T.cancel_cb_count, 1);
    pthread_mutex_unlock(&T.mu);
    t_set(&T.server_gone);
    join_producer();
    CHECK_INT_EQ(T.write_after_close, SRV_HTTP_ECANCELED);
    /* the client sees the connection end without a clean last chunk */
    CHECK(read_until_close(fd, &b, WAIT_MS) == 0);
    resp_t r;
    CHECK(parse_resp(b.p, b.len, &r) == 0);
    CHECK(!r.chunked_complete);
    resp_free(&r);
    close(fd);
    free(b.p);
}

TEST(test_listen_errors)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char err[256] = "";
    srv_http_opts_t o = {.host = "256.1.1.1", .port = 0};
    srv_http_t *h = srv_http_new(&loop, &o, err, sizeof err);
    CHECK(h == NULL);
    CHECK(strstr(err, "256.1.1.1") != NULL);
    /* a port in use */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    listen(fd, 1);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    o = (srv_http_opts_t){.host = "127.0.0.1", .port = ntohs(sa.sin_port)};
    err[0] = '\0';
    h = srv_http_new(&loop, &o, err, sizeof err);
    CHECK(h == NULL);
    CHECK_MSG(strstr(err, "in use") != NULL, "err = %s", err);
    close(fd);
    CHECK_INT_EQ(uv_loop_close(&loop), 0);
}

/* ---- injected requests (srv_http_inject) and srv_stream_rerun ---- */

static void inj_hello(srv_req_t *req, void *ud)
{
    (void)ud;
    char b[160];
    const char *q = srv_req_query(req, "q");
    size_t blen = 0;
    const char *body = srv_req_body(req, &blen);
    snprintf(b, sizeof b, "{\"path\":\"%s\",\"q\":\"%s\",\"x\":\"%s\",\"body\":%zu,\"key\":%d}",
             srv_req_path(req), q ? q : "", srv_req_header(req, "X-Thing") ? "yes" : "no", blen,
             srv_req_key(req, NULL));
    (void)body;
    srv_reply_json(req, 200, b);
}

/* First run: defers and asks for a rerun (a producer that waited for
 * something); second run: answers with the run count. */
static void inj_rerun(srv_req_t *req, void *ud)
{
    (void)ud;
    if (srv_req_runs(req) == 1) {
        srv_req_add_header(req, "X-First", "dropped on rerun");
        srv_stream_t *s = srv_stream_defer(req, NULL);
        CHECK(s != NULL);
        CHECK_INT_EQ(srv_stream_rerun(s), 0);
        return;
    }
    char b[32];
    snprintf(b, sizeof b, "{\"runs\":%d}", srv_req_runs(req));
    srv_reply_json(req, 201, b);
}

static void inj_stream(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_stream_t *s = srv_stream_open(req, 200, "text/plain", NULL);
    CHECK(s != NULL);
    CHECK_INT_EQ(srv_stream_write(s, "one ", 4), 0);
    CHECK_INT_EQ(srv_stream_write(s, "two", 3), 0);
    srv_stream_close(s, SRV_STREAM_END);
}

static void inj_run(uv_loop_t *loop, srv_http_t *h, const srv_http_inject_t *in,
                    srv_http_result_t *r)
{
    CHECK_INT_EQ(srv_http_inject(h, in, r), 0);
    for (int i = 0; i < 1000 && !r->done; i++)
        uv_run(loop, UV_RUN_NOWAIT);
    CHECK(r->done);
}

TEST(test_inject_without_a_socket)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char err[256] = "";
    const char *keys[] = {"k1"};
    srv_http_opts_t o = {.no_listen = 1, .api_keys = keys, .n_api_keys = 1};
    srv_http_t *h = srv_http_new(&loop, &o, err, sizeof err);
    CHECK_MSG(h != NULL, "%s", err);
    if (!h)
        return;
    CHECK_INT_EQ(srv_http_port(h), 0);
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    srv_http_route(h, "POST", "/hello/{name}", inj_hello, NULL, &json);
    srv_http_route(h, "GET", "/rerun", inj_rerun, NULL, NULL);
    srv_http_route(h, "GET", "/stream", inj_stream, NULL, NULL);
    const char *auth[] = {"Authorization", "Bearer k1", "X-Thing", "1", "Content-Type",
                          "application/json", "Content-Length", "2", "X-Request-Id", "inj-1"};
    srv_http_result_t r;
    /* the route, its path (decoded), query, headers, body and key */
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "POST", .url = "/hello/w%6Frld?q=a+b%21",
                                 .headers = auth, .n_headers = 5, .body = "{}", .body_len = 2},
            &r);
    CHECK_INT_EQ(r.status, 200);
    CHECK(!r.cut);
    CHECK_MSG(r.body && strcmp(r.body, "{\"path\":\"/hello/world\",\"q\":\"a b!\",\"x\":\"yes\","
                                       "\"body\":2,\"key\":0}") == 0,
              "%s", r.body ? r.body : "");
    CHECK(r.headers && strstr(r.headers, "X-Request-Id: inj-1\n"));
    CHECK(r.content_type && strcmp(r.content_type, "application/json") == 0);
    srv_http_result_free(&r);
    /* the checks before the handler: 401 without the key, 404, 405, 415 */
    inj_run(&loop, h, &(srv_http_inject_t){.method = "GET", .url = "/rerun"}, &r);
    CHECK_INT_EQ(r.status, 401);
    srv_http_result_free(&r);
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/nope", .headers = auth, .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 404);
    srv_http_result_free(&r);
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "PUT", .url = "/rerun", .headers = auth, .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 405);
    CHECK(r.headers && strstr(r.headers, "Allow: GET, HEAD, OPTIONS\n"));
    srv_http_result_free(&r);
    const char *text[] = {"Authorization", "Bearer k1", "Content-Type", "text/plain",
                          "Content-Length", "2"};
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "POST", .url = "/hello/x", .headers = text,
                                 .n_headers = 3, .body = "{}", .body_len = 2},
            &r);
    CHECK_INT_EQ(r.status, 415);
    srv_http_result_free(&r);
    /* a deferred request run again: the second run answers, the first
     * run's headers are gone */
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/rerun", .headers = auth, .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 201);
    CHECK(r.body && strcmp(r.body, "{\"runs\":2}") == 0);
    CHECK(r.headers && !strstr(r.headers, "X-First"));
    srv_http_result_free(&r);
    /* a streamed answer is collected whole */
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/stream", .headers = auth, .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 200);
    CHECK(!r.cut && r.body_len == 7 && memcmp(r.body, "one two", 7) == 0);
    srv_http_result_free(&r);
    /* headers no parser would pass on are refused before anything runs */
    const char *bad[] = {"Bad:Name", "v", "X-A", "a\nb"};
    for (int i = 0; i < 2; i++)
        CHECK_INT_EQ(srv_http_inject(h, &(srv_http_inject_t){.method = "GET", .url = "/stream",
                                                              .headers = bad + 2 * (size_t)i,
                                                              .n_headers = 1},
                                     &r),
                     SRV_HTTP_EINVAL);
    /* the rest reach the framing rules, as a connection's would: a name
     * with a space (before the colon), a body length that is not the body's */
    const char *ws[] = {"Bad Name", "v"};
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/stream", .headers = ws, .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 400);
    CHECK(r.body && strstr(r.body, "malformed_request"));
    srv_http_result_free(&r);
    const char *cl[] = {"Content-Length", "5"};
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/stream", .headers = cl, .n_headers = 1,
                                 .body = "abc", .body_len = 3},
            &r);
    CHECK_INT_EQ(r.status, 400);
    srv_http_result_free(&r);
    /* an encoded NUL in the path never reaches routing */
    inj_run(&loop, h,
            &(srv_http_inject_t){.method = "GET", .url = "/stream%00x", .headers = auth,
                                 .n_headers = 1},
            &r);
    CHECK_INT_EQ(r.status, 400);
    srv_http_result_free(&r);
    srv_http_close(h, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_INT_EQ(uv_loop_close(&loop), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    alarm(240); /* a hang is a failure, not a stuck CI job */
    srv_log_init(getenv("TEST_SRV_HTTP_DEBUG") ? SRV_LOG_DEBUG : SRV_LOG_WARN, SRV_LOG_FORMAT_TEXT,
                 NULL, NULL, 0);
    RUN(test_listen_errors);
    RUN(test_inject_without_a_socket);
    RUN(test_main_start);
    if (A.state == 1) {
        RUN(test_echo_and_request_ids);
        RUN(test_routing_errors);
        RUN(test_body_limits);
        RUN(test_large_bodies);
        RUN(test_content_type);
        RUN(test_auth);
        RUN(test_cors);
        RUN(test_keepalive);
        RUN(test_stream_incremental);
        RUN(test_stream_cancel_while_suspended);
        RUN(test_backpressure);
        RUN(test_abort_and_deferred);
        RUN(test_deferred_client_gone);
        RUN(test_half_closed_client_gets_its_answer);
        RUN(test_metrics_exposition);
        RUN(test_main_stop);
    }
    RUN(test_idle_timeout);
    RUN(test_request_timeout);
    RUN(test_connection_limit);
    RUN(test_per_address_limit_and_header_timeout);
    RUN(test_drain);
    RUN(test_not_ready);
    RUN(test_close_with_open_stream);
    return CHECK_DONE();
}
