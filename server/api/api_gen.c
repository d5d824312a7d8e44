/* server/api/api_gen.c — a generation request in flight: engine jobs on one side,
 * one HTTP answer (a stream of frames, or one deferred reply) on the other.
 *
 * The engine calls notify/on_done on its scheduler thread; they only put the
 * request on app->ready and wake the loop (uv_async_send). Everything else —
 * popping events, formatting, writing, finishing — happens on the loop
 * thread, so the kinds' ops need no locks.
 *
 * Back-pressure: frames that do not fit the stream's buffer are held here
 * and no more events are popped until on_writable; the unpopped events stay
 * in the engine's bounded per-job queue, which pauses the sequence. A client
 * that goes away cancels the jobs at once (on_cancel); their remaining
 * events are popped and dropped.
 *
 * A request is freed only when (a) every submitted job's on_done has run (the
 * engine no longer holds the pointer), (b) its events were drained and the
 * kind's done() ran (after the session's write on the I/O thread came
 * back), and (c) the stream was closed. The ping timer's close
 * callback does the free, so no uv callback can see a freed request.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <inttypes.h>
#include <stddef.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PING_MS 3000

static void gen_free_cb(uv_handle_t *h)
{
    api_gen_t *g = h->data;
    api_app_t *app = g->app;
    if (g->ops && g->ops->free)
        g->ops->free(g->kd);
    core_grammar_free(g->grammar);
    free(g->held);
    free(g);
    if (--app->handles_open == 0)
        free(app);
}

static void live_unlink(api_gen_t *g)
{
    api_app_t *app = g->app;
    if (g->live_prev)
        g->live_prev->live_next = g->live_next;
    else if (app->live == g)
        app->live = g->live_next;
    if (g->live_next)
        g->live_next->live_prev = g->live_prev;
    g->live_prev = g->live_next = NULL;
}

/* ---- scheduler-thread callbacks ---- */

void api_gen_wake(api_app_t *app, api_gen_t *g)
{
    pthread_mutex_lock(&app->mu);
    if (!g->queued) {
        g->queued = 1;
        g->next_ready = app->ready_head;
        app->ready_head = g;
    }
    pthread_mutex_unlock(&app->mu);
    uv_async_send(&app->wake);
}

static void job_notify(void *ud)
{
    api_gen_t *g = ud;
    api_gen_wake(g->app, g);
}

static void job_on_done(srv_job_t *job, void *ud)
{
    (void)job;
    api_gen_t *g = ud;
    api_app_t *app = g->app;
    /* After the increment the engine never touches g again; the loop may
     * free it as soon as it sees the count, so take app first. */
    pthread_mutex_lock(&app->mu);
    atomic_fetch_add(&g->n_on_done, 1);
    if (!g->queued) {
        g->queued = 1;
        g->next_ready = app->ready_head;
        app->ready_head = g;
    }
    pthread_mutex_unlock(&app->mu);
    uv_async_send(&app->wake);
}

/* ---- construction ---- */

api_gen_t *api_gen_new(api_app_t *app, srv_req_t *req, const api_gen_ops_t *ops, void *kd,
                       size_t n_jobs)
{
    api_gen_t *g = calloc(1, sizeof *g + n_jobs * sizeof g->jobs[0]);
    if (!g) {
        if (ops->free)
            ops->free(kd);
        return NULL;
    }
    g->app = app;
    g->ops = ops;
    g->kd = kd;
    g->n_jobs = n_jobs;
    snprintf(g->route, sizeof g->route, "%s", srv_req_route(req) ? srv_req_route(req) : "");
    snprintf(g->rid, sizeof g->rid, "%s", srv_req_id(req));
    g->t_start_ns = srv_engine_now_ns();
    atomic_init(&g->n_on_done, 0);
    uv_timer_init(app->loop, &g->ping);
    g->ping.data = g;
    app->handles_open++;
    g->live_next = app->live;
    if (app->live)
        app->live->live_prev = g;
    app->live = g;
    return g;
}

int api_gen_oneshot(api_gen_t *g, size_t ji, const core_sample_params_t *params, core_error_t *ce)
{
    api_gen_job_t *j = &g->jobs[ji];
    int rc = core_attn_state_new(core_model_attn(g->app->model), &j->own.state, ce);
    if (rc < 0)
        return rc;
    rc = core_sampler_new(params, &j->own.sampler, ce);
    if (rc < 0)
        return rc;
    j->ctx = &j->own;
    return 0;
}

int api_gen_grammar(api_gen_t *g, const proto_gen_params_t *p, proto_error_t *e)
{
    if (!p->grammar)
        return 0;
    core_error_t ce = {0};
    core_grammar_state_t st;
    int rc = core_grammar_new(p->grammar, p->grammar_len, srv_engine_grammar_vocab(g->app->engine),
                              NULL, &g->grammar, &ce);
    if (rc == 0) {
        /* the start state too: a hostile grammar can fail before any text */
        rc = core_grammar_state_init(&st, g->grammar, &ce);
        core_grammar_state_clear(&st);
    }
    g->grammar_param = p->grammar_param ? p->grammar_param : "grammar";
    if (rc == CORE_ENOMEM) {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory compiling 'grammar'");
        return -1;
    }
    if (rc < 0) {
        /* a grammar converted from a JSON Schema (response_format, format)
         * fails here only where the schema itself cannot be written out: a
         * required property that recurses without end, a pattern whose
         * repetition can match nothing, a bound of core's */
        const char *from = p->grammar_param ? p->grammar_param : "grammar";
        if (strcmp(from, "grammar") != 0)
            proto_error_set(e, PROTO_ERR_INVALID_VALUE, from,
                            "'%s': the grammar of its schema is %s: %s", from,
                            rc == CORE_ERANGE ? "over a limit" : "invalid", ce.msg);
        else
            proto_error_set(e, PROTO_ERR_INVALID_VALUE, "grammar", "'grammar' is %s: %s",
                            rc == CORE_ERANGE ? "over a limit" : "invalid", ce.msg);
        return -1;
    }
    return 0;
}

void api_gen_job_error(const api_gen_t *g, const srv_job_result_t *res, const char *msg,
                       proto_error_t *e)
{
    if (res && res->grammar_bound) {
        /* the client's grammar, not the server, met the bound: compiling
         * probes the first states (core_grammar_new), this one lay beyond */
        const char *param = g->grammar_param ? g->grammar_param : "grammar";
        proto_error_set(e, PROTO_ERR_INVALID_VALUE, param,
                        "'%s': the text generated so far met a bound of its grammar: %s", param,
                        msg);
        return;
    }
    proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "generation failed: %s", msg);
}

int api_gen_submit(api_gen_t *g, size_t ji, srv_job_spec_t *spec, char *err, size_t errlen)
{
    api_gen_job_t *j = &g->jobs[ji];
    spec->grammar = g->grammar;
    spec->ctx = j->ctx;
    spec->req_id = g->rid;
    spec->notify = job_notify;
    spec->on_done = job_on_done;
    spec->ud = g;
    if (g->app->gen_timeout_ns > 0)
        spec->deadline_ns = g->t_start_ns + g->app->gen_timeout_ns;
    int rc = srv_engine_submit(g->app->engine, spec, &j->job, err, errlen);
    if (rc == 0)
        j->submitted = 1;
    return rc;
}

/* ---- writing ---- */

static int held_append(api_gen_t *g, const char *b, size_t n)
{
    if (g->held_len + n > g->held_cap) {
        size_t cap = g->held_cap ? g->held_cap : 4096;
        while (cap < g->held_len + n)
            cap *= 2;
        char *p = realloc(g->held, cap);
        if (!p)
            return -1;
        g->held = p;
        g->held_cap = cap;
    }
    memcpy(g->held + g->held_len, b, n);
    g->held_len += n;
    return 0;
}

void api_gen_write_raw(api_gen_t *g, const char *bytes, size_t len)
{
    if (!g->stream || !g->streaming || g->cancelled || len == 0)
        return;
    if (g->held_len == 0) {
        int rc = srv_stream_write(g->stream, bytes, len);
        if (rc == 0) {
            g->bytes_out += len;
            return;
        }
        if (rc != SRV_HTTP_EAGAIN) {
            /* client gone (on_cancel follows) or out of memory: stop writing */
            g->cancelled = 1;
            return;
        }
    }
    if (held_append(g, bytes, len) < 0) {
        SRV_LOG(SRV_LOG_ERROR, g->rid, "out of memory holding %zu stream bytes; cutting", len);
        g->cancelled = 1;
        for (size_t i = 0; i < g->n_jobs; i++)
            if (g->jobs[i].submitted)
                srv_engine_cancel(g->jobs[i].job);
    }
}

void api_gen_write_json(api_gen_t *g, const char *json)
{
    if (!json) {
        SRV_LOG(SRV_LOG_ERROR, g->rid, "out of memory formatting an event");
        return;
    }
    size_t n = 0;
    char *f = proto_frame(g->fmt, json, strlen(json), &n);
    if (!f) {
        SRV_LOG(SRV_LOG_ERROR, g->rid, "out of memory framing an event");
        return;
    }
    api_gen_write_raw(g, f, n);
    proto_free(f);
}

void api_gen_write_error(api_gen_t *g, const proto_error_t *e)
{
    size_t n = 0;
    if (api_anthropic_route(g->route)) { /* an error event, and no [DONE] */
        char *a = proto_anthropic_error_event(e, &n);
        if (a)
            api_gen_write_raw(g, a, n);
        proto_free(a);
        return;
    }
    char *f = proto_frame_error(g->fmt, e, &n);
    if (f)
        api_gen_write_raw(g, f, n);
    proto_free(f);
    if (g->fmt == PROTO_STREAM_SSE)
        api_gen_write_raw(g, PROTO_SSE_DONE, strlen(PROTO_SSE_DONE));
}

void api_gen_reply_json(api_gen_t *g, int status, const char *json)
{
    if (!g->stream || g->streaming)
        return;
    if (!json) {
        srv_stream_reply(g->stream, 500, "application/json",
                         "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                         "\"param\":null,\"code\":\"internal_error\"}}",
                         strlen("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_"
                                "error\",\"param\":null,\"code\":\"internal_error\"}}"));
    } else {
        if (status == 429 || status == 503) /* as api_reply_admit says it */
            srv_stream_add_header(g->stream, "Retry-After", "1");
        srv_stream_reply(g->stream, status, "application/json", json, strlen(json));
    }
    g->stream = NULL; /* reply releases the reference, also when the client is gone */
}

void api_gen_reply_error(api_gen_t *g, const proto_error_t *e)
{
    char *j = api_error_json_for(g->route, e);
    api_gen_reply_json(g, e->status, j);
    proto_free(j);
}

int api_gen_release_session(api_gen_t *g, int persist, char *err, size_t errlen)
{
    if (g->persisted) {
        if (g->persist_rc < 0)
            snprintf(err, errlen, "%s", g->persist_err);
        return g->persist_rc;
    }
    if (!g->session)
        return 0;
    srv_session_t *s = g->session;
    g->session = NULL;
    if (persist)
        srv_session_touch(s);
    char d[SRV_STORE_ERR_MAX] = "";
    int rc = srv_store_release(g->app->store, s, persist, d, sizeof d);
    if (rc < 0) {
        snprintf(err, errlen,
                 "session state could not be saved (%s); the session keeps its "
                 "previous state",
                 *d ? d : srv_store_strerror(rc));
        srv_series_add(g->app->m_persist_err, 1);
        SRV_LOG(SRV_LOG_ERROR, g->rid, "%s", err);
    }
    return rc;
}

/* ---- the end ---- */

static int all_on_done(const api_gen_t *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_jobs; i++)
        n += g->jobs[i].submitted ? 1u : 0u;
    return (size_t)atomic_load(&g->n_on_done) == n;
}

static int all_done_ev(const api_gen_t *g)
{
    for (size_t i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].submitted && !g->jobs[i].done_ev)
            return 0;
    return 1;
}

/* Releases jobs and one-shot contexts, closes the stream, frees g (via the
 * ping timer's close callback). */
static void gen_destroy(api_gen_t *g)
{
    if (g->destroyed || g->persisting)
        return; /* persist_done() comes back here */
    g->destroyed = 1;
    for (size_t i = 0; i < g->n_jobs; i++) {
        api_gen_job_t *j = &g->jobs[i];
        srv_job_release(j->job);
        j->job = NULL;
        api_prefix_drop(g->app, &j->pfx);
        core_attn_state_free(j->own.state);
        core_sampler_free(j->own.sampler);
        srv_seq_ctx_clear_pending(&j->own);
        j->own.state = NULL;
        j->own.sampler = NULL;
    }
    if (g->session) {
        char e[256];
        api_gen_release_session(g, 0, e, sizeof e);
    }
    if (g->stream) {
        srv_stream_close(g->stream,
                         g->cancelled && !g->closing ? SRV_STREAM_ABORT : SRV_STREAM_END);
        g->stream = NULL;
    }
    /* No callback can queue g any more (every on_done ran), but an earlier
     * wake may still have it on the ready list. */
    pthread_mutex_lock(&g->app->mu);
    if (g->queued) {
        api_gen_t **pp = &g->app->ready_head;
        while (*pp && *pp != g)
            pp = &(*pp)->next_ready;
        if (*pp)
            *pp = g->next_ready;
        g->queued = 0;
    }
    pthread_mutex_unlock(&g->app->mu);
    g->app->state_reserved -= g->reserved;
    g->reserved = 0;
    live_unlink(g);
    uv_timer_stop(&g->ping);
    uv_close((uv_handle_t *)&g->ping, gen_free_cb);
}

/* Runs done(), then closes once the held frames went out. */
static void gen_end(api_gen_t *g)
{
    if (g->ops->done)
        g->ops->done(g);
    g->closing = 1;
    if (g->held_len == 0 || g->cancelled || !g->stream)
        gen_destroy(g);
}

/* I/O thread: writes the session and gives it back. */
static void persist_work(api_io_t *io)
{
    api_gen_t *g = (api_gen_t *)((char *)io - offsetof(api_gen_t, persist_io));
    srv_session_t *s = g->persist_s;
    srv_session_touch(s);
    char d[SRV_STORE_ERR_MAX] = "";
    g->persist_rc = srv_store_release(g->app->store, s, 1, d, sizeof d);
    if (g->persist_rc < 0) {
        /* a detail too long for persist_err is cut short (the result is tested, so
         * GCC's -Wformat-truncation takes the cut as meant) */
        if (snprintf(g->persist_err, sizeof g->persist_err,
                     "session state could not be saved (%s); the session keeps its "
                     "previous state",
                     *d ? d : srv_store_strerror(g->persist_rc)) < 0)
            g->persist_err[0] = '\0';
    }
}

static void persist_done(api_io_t *io)
{
    api_gen_t *g = (api_gen_t *)((char *)io - offsetof(api_gen_t, persist_io));
    g->persisting = 0;
    g->persisted = 1;
    g->persist_s = NULL;
    if (g->persist_rc < 0) {
        srv_series_add(g->app->m_persist_err, 1);
        SRV_LOG(SRV_LOG_ERROR, g->rid, "%s", g->persist_err);
    }
    gen_end(g);
}

/* Called when everything of g's jobs is in: the session (if any) is
 * written on the I/O thread first, so the loop goes on serving meanwhile;
 * then gen_end. */
static void gen_finish(api_gen_t *g)
{
    g->finished = 1;
    uv_timer_stop(&g->ping);
    if (g->session && !g->aborted) {
        if (g->ops->prepare)
            g->ops->prepare(g);
        g->persist_s = g->session;
        g->session = NULL;
        g->persisting = 1;
        g->persist_io.work = persist_work;
        g->persist_io.done = persist_done;
        api_io_submit(g->app, &g->persist_io);
        return;
    }
    gen_end(g);
}

/* Pops and handles events until the queues are empty or the stream is
 * full; finishes g when everything is in. */
static void gen_pump(api_gen_t *g)
{
    if (g->finished || g->destroyed)
        return;
    int progress = 1;
    while (progress && (g->held_len == 0 || g->cancelled)) {
        progress = 0;
        for (size_t i = 0; i < g->n_jobs; i++) {
            api_gen_job_t *j = &g->jobs[i];
            if (!j->submitted || j->done_ev)
                continue;
            srv_event_t *ev = NULL;
            while ((g->held_len == 0 || g->cancelled) && srv_job_pop(j->job, &ev)) {
                progress = 1;
                api_prefix_harvest(g, i); /* the snapshots, as soon as the prefill is over */
                if (ev->kind == SRV_EVENT_DONE) {
                    j->done_ev = 1;
                } else if (g->ops->event)
                    g->ops->event(g, i, ev);
                srv_event_free(ev);
                if (j->done_ev)
                    break;
            }
        }
    }
    if (all_done_ev(g) && all_on_done(g))
        gen_finish(g);
}

void api_gen_pump_ready(api_app_t *app)
{
    /* One at a time off the shared list: a notify may push a request again
     * while another is being pumped. Bounded, so a busy scheduler cannot
     * keep the loop from its sockets; the rest waits for the next turn. */
    for (int n = 0; n < 4096; n++) {
        pthread_mutex_lock(&app->mu);
        api_gen_t *g = app->ready_head;
        if (g) {
            app->ready_head = g->next_ready;
            g->next_ready = NULL;
            g->queued = 0;
        }
        pthread_mutex_unlock(&app->mu);
        if (!g)
            return;
        gen_pump(g);
    }
    uv_async_send(&app->wake);
}

/* ---- stream callbacks (loop thread) ---- */

static void on_cancel(srv_stream_t *s, void *ud)
{
    (void)s;
    api_gen_t *g = ud;
    if (!g->cancelled)
        SRV_LOG(SRV_LOG_INFO, g->rid, "client gone: cancelling the generation");
    g->cancelled = 1;
    for (size_t i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].submitted)
            srv_engine_cancel(g->jobs[i].job);
    if (g->finished) {
        gen_destroy(g);
        return;
    }
    gen_pump(g);
}

static void on_writable(srv_stream_t *s, void *ud)
{
    api_gen_t *g = ud;
    if (g->held_len == 0 || g->cancelled)
        return;
    int rc = srv_stream_write(s, g->held, g->held_len);
    if (rc == SRV_HTTP_EAGAIN)
        return;
    if (rc == 0)
        g->bytes_out += g->held_len;
    else
        g->cancelled = 1;
    g->held_len = 0;
    if (g->finished) {
        gen_destroy(g);
        return;
    }
    gen_pump(g);
}

static void on_ping(uv_timer_t *t)
{
    api_gen_t *g = t->data;
    if (g->finished || g->cancelled || !g->stream)
        return;
    if (g->bytes_out == g->bytes_at_tick && g->held_len == 0)
        api_gen_write_raw(g, PROTO_SSE_PING, strlen(PROTO_SSE_PING));
    g->bytes_at_tick = g->bytes_out;
}

void api_gen_start(api_gen_t *g, srv_req_t *req, int streaming, proto_stream_format_t fmt)
{
    srv_stream_opts_t so = {.on_cancel = on_cancel, .on_writable = on_writable, .ud = g};
    g->streaming = streaming;
    g->fmt = fmt;
    if (streaming && fmt == PROTO_STREAM_SSE)
        so.probe = PROTO_SSE_PING;
    if (streaming) {
        const char *ct = fmt == PROTO_STREAM_SSE ? "text/event-stream" : "application/x-ndjson";
        srv_req_add_header(req, "Cache-Control", "no-cache");
        srv_req_add_header(req, "X-Accel-Buffering", "no");
        g->stream = srv_stream_open(req, 200, ct, &so);
        if (g->stream && fmt == PROTO_STREAM_SSE) {
            g->ping_on = 1;
            uv_timer_start(&g->ping, on_ping, PING_MS, PING_MS);
        }
    } else {
        g->stream = srv_stream_defer(req, &so);
    }
    if (!g->stream) {
        g->cancelled = 1;
        for (size_t i = 0; i < g->n_jobs; i++)
            if (g->jobs[i].submitted)
                srv_engine_cancel(g->jobs[i].job);
    }
    /* events may already be waiting (the scheduler ran while we set up) */
    api_gen_wake(g->app, g);
}

void api_gen_abort(api_gen_t *g)
{
    g->cancelled = 1;
    g->aborted = 1;
    int borrowed = 0;
    for (size_t i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].submitted) {
            srv_engine_cancel(g->jobs[i].job);
            borrowed = 1;
        }
    /* The session's context may still be borrowed by a submitted job: its
     * release waits for the end (done() of a cancelled g persists nothing).
     * With no job it goes back now, before the caller's refusal is sent: a
     * client's next request must not find it busy. */
    if (!borrowed && g->session) {
        char e[256];
        api_gen_release_session(g, 0, e, sizeof e);
    }
    api_gen_wake(g->app, g);
}

void api_gen_cancel_all(api_app_t *app, int shutdown)
{
    for (api_gen_t *g = app->live; g; g = g->live_next) {
        if (g->finished)
            continue;
        if (shutdown)
            g->shutdown = 1;
        for (size_t i = 0; i < g->n_jobs; i++)
            if (g->jobs[i].submitted)
                srv_engine_cancel(g->jobs[i].job);
    }
}

void api_gen_shutdown(api_app_t *app)
{
    for (api_gen_t *g = app->live; g; g = g->live_next)
        g->cancelled = 1;
    for (int guard = 0; guard < 1000; guard++) {
        api_gen_pump_ready(app);
        pthread_mutex_lock(&app->mu);
        int more = app->ready_head != NULL;
        pthread_mutex_unlock(&app->mu);
        if (!more)
            break;
    }
    for (api_gen_t *g = app->live, *nx; g; g = nx) {
        nx = g->live_next;
        if (!g->finished)
            gen_pump(g); /* not queued yet: take its last events now */
        if (g->finished)
            gen_destroy(g); /* no-op when the pump already did */
        else
            SRV_LOG(SRV_LOG_ERROR, g->rid, "request still waiting for the engine at shutdown");
    }
}

/* ---- the state memory budget (api_budget.c admits; a request holds) ---- */

int api_gen_reserve(api_gen_t *g, size_t bytes, proto_error_t *e)
{
    if (api_state_admit(g->app, bytes, e) < 0)
        return -1;
    if (g->app->state_budget) {
        g->reserved += bytes;
        g->app->state_reserved += bytes;
    }
    return 0;
}

/* ---- accumulation ---- */

void api_acc_text(api_acc_t *a, const char *s, size_t n)
{
    if (a->oom || n == 0)
        return;
    if (a->len + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < a->len + n + 1)
            cap *= 2;
        char *p = realloc(a->text, cap);
        if (!p) {
            a->oom = 1;
            return;
        }
        a->text = p;
        a->cap = cap;
    }
    memcpy(a->text + a->len, s, n);
    a->len += n;
    a->text[a->len] = '\0';
}

void api_acc_token(api_acc_t *a, const srv_event_t *ev)
{
    if (a->oom)
        return;
    if (a->n_toks == a->cap_toks) {
        size_t cap = a->cap_toks ? a->cap_toks * 2 : 32;
        api_tokrec_t *p = realloc(a->toks, cap * sizeof *p);
        if (!p) {
            a->oom = 1;
            return;
        }
        a->toks = p;
        a->cap_toks = cap;
    }
    api_tokrec_t *r = &a->toks[a->n_toks++];
    r->id = ev->token;
    r->logprob = ev->logprob;
    r->n_top = ev->n_top > CORE_SAMPLE_MAX_LOGPROBS ? CORE_SAMPLE_MAX_LOGPROBS : ev->n_top;
    if (r->n_top > 0)
        memcpy(r->top, ev->top, (size_t)r->n_top * sizeof r->top[0]);
}

void api_acc_free(api_acc_t *a)
{
    free(a->text);
    free(a->toks);
    memset(a, 0, sizeof *a);
}

static const char *piece_of(const core_tokenizer_t *tok, int32_t id, size_t *len)
{
    const char *p = core_tokenizer_piece(tok, id, len);
    if (!p) {
        *len = 0;
        return "";
    }
    return p;
}

static void fill_lp(const core_tokenizer_t *tok, int32_t id, float logprob, int32_t n_top,
                    const core_sample_logprob_t *top_in, int64_t offset, proto_token_logprob_t *lp,
                    proto_top_logprob_t *top)
{
    lp->piece = piece_of(tok, id, &lp->piece_len);
    lp->id = id;
    lp->logprob = logprob;
    lp->text_offset = offset;
    lp->top = top;
    lp->n_top = n_top > 0 ? (size_t)n_top : 0;
    for (size_t k = 0; k < lp->n_top; k++) {
        top[k].piece = piece_of(tok, top_in[k].id, &top[k].piece_len);
        top[k].id = top_in[k].id;
        top[k].logprob = top_in[k].logprob;
    }
}

void api_event_logprob(const core_tokenizer_t *tok, const srv_event_t *ev, int64_t offset,
                       proto_token_logprob_t *lp, proto_top_logprob_t *top)
{
    int32_t n_top = ev->n_top > CORE_SAMPLE_MAX_LOGPROBS ? CORE_SAMPLE_MAX_LOGPROBS : ev->n_top;
    fill_lp(tok, ev->token, ev->logprob, n_top, ev->top, offset, lp, top);
}

int api_acc_logprobs(const api_acc_t *a, const core_tokenizer_t *tok, proto_token_logprob_t **lps,
                     proto_top_logprob_t **tops)
{
    size_t n = a->n_toks ? a->n_toks : 1;
    *lps = calloc(n, sizeof **lps);
    *tops = calloc(n * CORE_SAMPLE_MAX_LOGPROBS, sizeof **tops);
    if (!*lps || !*tops) {
        free(*lps);
        free(*tops);
        *lps = NULL;
        *tops = NULL;
        return -1;
    }
    int64_t off = 0;
    for (size_t i = 0; i < a->n_toks; i++) {
        const api_tokrec_t *r = &a->toks[i];
        fill_lp(tok, r->id, r->logprob, r->n_top, r->top, off, &(*lps)[i],
                *tops + i * CORE_SAMPLE_MAX_LOGPROBS);
        off += (int64_t)(*lps)[i].piece_len;
    }
    return 0;
}

void api_gen_log_done(const api_gen_t *g, const char *session, int64_t prompt_tokens,
                      int64_t completion_tokens, double ttft_s, const char *finish)
{
    SRV_LOG(SRV_LOG_INFO, g->rid,
            "generation route=%s%s%s session=%s prompt_tokens=%" PRId64
            " completion_tokens=%" PRId64 " ttft_ms=%.1f total_ms=%.1f finish=%s%s",
            g->route, g->app->hub ? " model=" : "", g->app->hub ? g->app->model_id : "",
            session ? session : "-", prompt_tokens, completion_tokens,
            ttft_s >= 0 ? ttft_s * 1e3 : -1.0, (double)(srv_engine_now_ns() - g->t_start_ns) / 1e6,
            finish ? finish : "-", g->cancelled ? " (client gone)" : "");
}
