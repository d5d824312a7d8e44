/* server/engine/engine.c — the scheduler thread: admission, the batched step,
 * sampling and event delivery into the jobs' output queues, and the
 * engine's life cycle (see engine.h for the contract). What other threads
 * call on jobs (submit, cancel, pop, wait, release) is in engine_jobs.c;
 * the objects both share are in engine_impl.h.
 *
 * Locking: one engine mutex guards what other threads touch: the waiting
 * FIFO, job flags (cancelled, attached, done), output queues, the published
 * statistics and the stop flags. Everything else — the running jobs, their
 * sequences, the batch, the model — belongs to the scheduler thread, which
 * works without the lock and takes it only at the start of a step (to admit
 * and to read cancellations) and at its end (to deliver events). Callbacks
 * (notify, on_done) run with no lock held.
 */
#include "server/engine/engine.h"

#include "core/rng.h"
#include "server/engine/engine_impl.h"
#include "server/engine/engine_test.h"
#include "server/base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


const char *srv_engine_strerror(int code)
{
#define SRV_ENGINE_ERR_STR_(name, val, desc)                                                       \
    case name: return desc;
    switch (code) {
        SRV_ENGINE_ERRNO_MAP(SRV_ENGINE_ERR_STR_)
    default: return "unknown error";
    }
#undef SRV_ENGINE_ERR_STR_
}

const char *srv_finish_name(srv_finish_t f)
{
    switch (f) {
    case SRV_FINISH_STOP: return "stop";
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_CANCELLED: return "cancelled";
    case SRV_FINISH_TIMEOUT: return "timeout";
    case SRV_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

int64_t srv_engine_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int eng_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- pending tokens ---- */

void srv_seq_ctx_clear_pending(srv_seq_ctx_t *ctx)
{
    if (!ctx)
        return;
    free(ctx->pending);
    ctx->pending = NULL;
    ctx->n_pending = 0;
}

int srv_seq_ctx_set_pending(srv_seq_ctx_t *ctx, const int32_t *toks, size_t n)
{
    if (!ctx || (n && !toks) || n > SRV_ENGINE_MAX_PROMPT)
        return SRV_ENGINE_EINVAL;
    int32_t *p = NULL;
    if (n) {
        p = malloc(n * sizeof *p);
        if (!p)
            return SRV_ENGINE_ENOMEM;
        memcpy(p, toks, n * sizeof *p);
    }
    free(ctx->pending);
    ctx->pending = p;
    ctx->n_pending = n;
    return 0;
}

void srv_job_spec_init(srv_job_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->n_choices = 1;
    core_sample_params_default(&spec->params);
}

void srv_event_free(srv_event_t *ev)
{
    free(ev);
}

srv_event_t *eng_ev_new(srv_event_kind_t kind, int choice, const char *text, size_t len)
{
    srv_event_t *ev = malloc(sizeof *ev + len + 1);
    if (!ev)
        return NULL;
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->choice = choice;
    ev->token = -1;
    ev->len = len;
    if (len)
        memcpy(ev->text, text, len);
    ev->text[len] = '\0';
    return ev;
}

/* ---- small helpers (scheduler thread) ---- */

static void txt_reset(srv_engine_t *E)
{
    E->txt_len = 0;
    E->txt_oom = 0;
}

static void txt_add(srv_engine_t *E, const char *s, size_t n)
{
    if (!n)
        return;
    if (E->txt_len + n > E->txt_cap) {
        size_t cap = E->txt_cap ? E->txt_cap : 256;
        while (cap < E->txt_len + n)
            cap *= 2;
        char *p = realloc(E->txt, cap);
        if (!p) {
            E->txt_oom = 1;
            return;
        }
        E->txt = p;
        E->txt_cap = cap;
    }
    memcpy(E->txt + E->txt_len, s, n);
    E->txt_len += n;
}

static void touch(srv_engine_t *E, srv_job_t *j)
{
    if (j->touched)
        return;
    j->touched = 1;
    j->tnext = E->touched;
    E->touched = j;
}

static void emit(srv_engine_t *E, srv_job_t *j, srv_event_t *ev)
{
    touch(E, j);
    if (!ev)
        return;
    ev->step = E->st.steps;
    if (j->n_out == j->cap_out) {
        size_t cap = j->cap_out ? 2 * j->cap_out : 8;
        srv_event_t **p = realloc(j->out, cap * sizeof(srv_event_t *));
        if (!p) {
            free(ev);
            return;
        }
        j->out = p;
        j->cap_out = cap;
    }
    j->out[j->n_out++] = ev;
}

static void set_error(srv_job_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(srv_job_t *j, const char *fmt, ...)
{
    if (j->res.error[0])
        return; /* the first error is the interesting one */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->res.error, sizeof j->res.error, fmt, ap);
    va_end(ap);
    SRV_LOG(SRV_LOG_WARN, j->req_id[0] ? j->req_id : NULL, "engine: %s", j->res.error);
}

/* A grammar call of choice i failed (ce): the job's error, marked as the
 * grammar's bound when it is one and the first error. */
static void grammar_error(srv_job_t *j, int i, const core_error_t *ce)
{
    const int first = !j->res.error[0];
    if (i >= 0)
        set_error(j, "grammar of choice %d: %s", i, ce->msg);
    else
        set_error(j, "grammar: %s", ce->msg);
    if (first && ce->code == CORE_ERANGE)
        j->res.grammar_bound = 1;
}

/* The held-back text of a choice that ends: the detokenizer's incomplete
 * character, then the stop matcher's held text. 1 if that completed a stop
 * string. */
static int flush_tails(srv_engine_t *E, seq_t *s)
{
    if (s->stop_matched)
        return 1;
    size_t n = 0;
    core_stop_result_t r;
    if (core_tok_stream_flush(&s->ts, E->piece, E->piece_cap, &n, NULL) == 0 && n) {
        if (core_stop_feed(s->stop, E->piece, n, &r, NULL) == 0) {
            txt_add(E, r.text, r.len);
            if (r.matched) {
                s->stop_matched = 1;
                return 1;
            }
        }
    }
    core_stop_flush(s->stop, &r);
    txt_add(E, r.text, r.len);
    return 0;
}

static void seq_release(seq_t *s)
{
    core_grammar_state_clear(&s->gs);
    if (s->owned) {
        core_attn_state_free(s->state);
        core_sampler_free(s->sampler);
        s->owned = 0;
    }
    s->state = NULL;
    s->sampler = NULL;
}

/* Ends choice i. emit_end: queue an END event (choices that end without a
 * token). */
static void choice_end(srv_engine_t *E, srv_job_t *j, int i, srv_finish_t why, int emit_end)
{
    seq_t *s = &j->seqs[i];
    if (s->ended)
        return;
    if (emit_end && j->max_tokens > 0) {
        txt_reset(E);
        if (s->live)
            flush_tails(E, s);
        srv_event_t *ev = eng_ev_new(SRV_EVENT_END, i, E->txt, E->txt_oom ? 0 : E->txt_len);
        if (ev) {
            ev->finish = why;
            ev->n_completion = s->n_gen;
        }
        emit(E, j, ev);
    }
    s->ended = 1;
    s->live = 0;
    j->res.finish[i] = why;
    j->res.completion_tokens[i] = s->n_gen;
    j->n_live--;
    if (j->slots > 0) {
        j->slots--;
        E->running_seqs--;
    }
    E->st.choices_finished[why]++;
    srv_series_add(E->m.finished[why], 1);
    if (i > 0)
        seq_release(s); /* choice 0's state and sampler are the context's */
    touch(E, j);
}

/* Ends every choice that has not ended. */
static void job_end_all(srv_engine_t *E, srv_job_t *j, srv_finish_t why)
{
    for (int i = 0; i < j->n_choices; i++)
        choice_end(E, j, i, why, 1);
}

/* A sampled token of choice s: detokenize, match stops, decide the end. */
static void take_token(srv_engine_t *E, srv_job_t *j, int i, const core_sample_result_t *r,
                       int64_t now)
{
    seq_t *s = &j->seqs[i];
    s->n_gen++;
    E->st.generated_tokens++;
    srv_series_add(E->m.gen, 1);
    if (s->t_last_ns) {
        double dt = (double)(now - s->t_last_ns) / 1e9;
        E->st.itl_count++;
        E->st.itl_sum_s += dt;
        srv_series_observe(E->m.itl, dt);
    }
    s->t_last_ns = now;
    if (!j->t_first_tok) {
        j->t_first_tok = now;
        double ttft = (double)(now - j->t_submit) / 1e9;
        E->st.ttft_count++;
        E->st.ttft_sum_s += ttft;
        srv_series_observe(E->m.ttft, ttft);
    }
    j->t_last_tok = now;

    txt_reset(E);
    srv_finish_t fin = SRV_FINISH_NONE;
    const int eog = !j->ignore_eos && core_tokenizer_is_eog(E->tok, r->token);
    if (eog) {
        /* the end-of-generation token is no text, and not history */
        flush_tails(E, s);
        fin = SRV_FINISH_STOP;
        s->unfed = -1;
    } else {
        size_t n = 0;
        core_stop_result_t sr;
        s->unfed = r->token;
        if (core_tok_stream_push(&s->ts, r->token, E->piece, E->piece_cap, &n, NULL) == 0 && n &&
            core_stop_feed(s->stop, E->piece, n, &sr, NULL) == 0) {
            txt_add(E, sr.text, sr.len);
            if (sr.matched) {
                s->stop_matched = 1;
                fin = SRV_FINISH_STOP;
            }
        }
        if (fin == SRV_FINISH_NONE && (s->n_gen >= j->max_tokens ||
                                       (E->exact && core_attn_state_pos(s->state) >= E->max_ctx)))
            fin = flush_tails(E, s) ? SRV_FINISH_STOP : SRV_FINISH_LENGTH;
    }
    srv_event_t *ev = eng_ev_new(SRV_EVENT_TOKEN, i, E->txt, E->txt_oom ? 0 : E->txt_len);
    if (ev) {
        ev->token = r->token;
        ev->logprob = r->logprob;
        ev->n_top = r->n_top;
        if (r->n_top > 0)
            memcpy(ev->top, r->top, (size_t)r->n_top * sizeof ev->top[0]);
        ev->finish = fin;
        ev->n_completion = s->n_gen;
    }
    emit(E, j, ev);
    if (fin != SRV_FINISH_NONE)
        choice_end(E, j, i, fin, 0);
}

static void sample_choice(srv_engine_t *E, srv_job_t *j, int i, const float *logits, int64_t now)
{
    core_sample_result_t r;
    core_error_t ce = {0};
    seq_t *s = &j->seqs[i];
    const uint64_t *allow = NULL;
    if (j->grammar) {
        if (core_grammar_mask(&s->gs, E->gws, E->gmask, E->V, &ce) < 0) {
            grammar_error(j, i, &ce);
            choice_end(E, j, i, SRV_FINISH_ERROR, 1);
            return;
        }
        allow = E->gmask;
    }
    if (core_sampler_sample_masked(s->sampler, E->ws, logits, E->V, allow, &r, &ce) < 0) {
        set_error(j, "sampling choice %d: %s%s", i, ce.msg,
                  allow ? " (under the grammar)" : "");
        choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        return;
    }
    if (j->grammar && core_grammar_accept(&s->gs, E->gws, r.token, &ce) < 0) {
        grammar_error(j, i, &ce);
        choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        return;
    }
    take_token(E, j, i, &r, now);
}

/* The token entry b of the batch drew in sample_batch, or its error. */
static void take_sampled(srv_engine_t *E, srv_job_t *j, int i, int b, int64_t now)
{
    if (E->brc[b] < 0) {
        set_error(j, "sampling choice %d: %s", i, E->berr[b].msg);
        choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        return;
    }
    take_token(E, j, i, &E->bres[b], now);
}

typedef struct sample_run {
    srv_engine_t *E;
    int nb;
    _Atomic int next;
} sample_run_t;

static void sample_worker(void *ctx, int worker, int n_workers)
{
    (void)n_workers;
    sample_run_t *sr = ctx;
    srv_engine_t *E = sr->E;
    for (;;) {
        const int b = atomic_fetch_add_explicit(&sr->next, 1, memory_order_relaxed);
        if (b >= sr->nb)
            return;
        if (!E->bsampled[b])
            continue;
        seq_t *s = E->bseq[b];
        E->brc[b] = core_sampler_sample_masked(s->sampler, E->wss[worker], s->logits, E->V, NULL,
                                               &E->bres[b], &E->berr[b]);
    }
}

/* Draws the next token of every decoded sequence without a grammar (whose
 * mask and workspace are the engine's one) on the model's threads: each
 * sampler is its sequence's own and each thread has its workspace, so the
 * tokens are those a draw one after another gives. Sampling sixteen
 * sequences one after another (a pass or more over the 49,152 logits each)
 * was ~1 ms of a ~12 ms step that left the pool's other thread waiting.
 * The results are taken in batch order by step(). */
static void sample_batch(srv_engine_t *E, int nb)
{
    int n = 0;
    for (int b = 0; b < nb; b++) {
        E->bsampled[b] = E->bseq[b] && !E->bfail[b] && !E->bjob[b]->grammar;
        n += E->bsampled[b];
    }
    if (n < 2 || E->n_wss < 2) { /* one: step() samples it itself */
        for (int b = 0; b < nb; b++)
            E->bsampled[b] = 0;
        return;
    }
    sample_run_t sr = {.E = E, .nb = nb};
    atomic_init(&sr.next, 0);
    core_model_run(E->model, sample_worker, &sr);
}

/* The prompt is absorbed: make the n choices (copies of the context for
 * i > 0), seed them, and sample every choice's first token from the
 * prompt's logits. All copies are made before any choice samples, so they
 * start from the same sampler history and RNG position. */
static void job_fork(srv_engine_t *E, srv_job_t *j, int64_t now)
{
    core_error_t ce = {0};
    seq_t *s0 = &j->seqs[0];
    for (int i = 0; i < j->n_choices; i++) {
        seq_t *s = &j->seqs[i];
        if (s->ended)
            continue;
        if (i > 0) {
            s->owned = 1;
            if (core_attn_state_new(E->attn, &s->state, &ce) < 0 ||
                core_attn_state_copy(s->state, s0->state, &ce) < 0 ||
                core_sampler_clone(s0->sampler, &s->sampler, &ce) < 0 ||
                (j->grammar && core_grammar_state_copy(&s->gs, &s0->gs, &ce) < 0)) {
                set_error(j, "fork of choice %d: %s", i, ce.msg);
                choice_end(E, j, i, SRV_FINISH_ERROR, 1);
                continue;
            }
            s->logits = malloc((size_t)E->V * sizeof *s->logits);
            if (!s->logits) {
                set_error(j, "fork of choice %d: out of memory", i);
                choice_end(E, j, i, SRV_FINISH_ERROR, 1);
                continue;
            }
        }
        if (core_stop_new((const char *const *)j->stops, NULL, j->n_stops, &s->stop, &ce) < 0) {
            set_error(j, "stop strings: %s", ce.msg);
            choice_end(E, j, i, SRV_FINISH_ERROR, 1);
            continue;
        }
        core_tok_stream_init(&s->ts, E->tok, j->detok_flags);
        s->live = 1;
    }
    /* seeds after every copy was taken (choice 0's reseed must not leak into
     * the copies' starting point; they are all reseeded anyway) */
    for (int i = 0; i < j->n_choices; i++) {
        seq_t *s = &j->seqs[i];
        if (!s->live)
            continue;
        if (j->reseed)
            core_sampler_seed(s->sampler, j->params.seed + (uint64_t)i);
        else if (i > 0)
            core_sampler_seed(s->sampler, core_rng_u64(&E->seed_rng));
    }
    j->phase = PH_DECODE;
    for (int i = 0; i < j->n_choices; i++) {
        if (j->seqs[i].live)
            sample_choice(E, j, i, s0->logits, now);
    }
}

/* Scheduler-side start of a job (admitted, or ended while waiting): install
 * the request's parameters, put the prompt into the sampler history, take
 * over ctx->pending (its copy heads job->input). */
static void job_start(srv_engine_t *E, srv_job_t *j)
{
    srv_seq_ctx_t *c = j->ctx;
    core_error_t ce = {0};
    j->phase = PH_PREFILL;
    j->n_live = j->n_choices;
    srv_seq_ctx_clear_pending(c);
    seq_t *s0 = &j->seqs[0];
    s0->state = c->state;
    s0->sampler = c->sampler;
    if (c->sampler) {
        if (j->max_tokens > 0 && core_sampler_set_params(c->sampler, &j->params, &ce) < 0) {
            set_error(j, "sampling parameters: %s", ce.msg);
            j->end_req = SRV_FINISH_ERROR;
            return;
        }
        /* the ring keeps only the last CORE_SAMPLE_HISTORY tokens */
        size_t from = j->n_prompt > CORE_SAMPLE_HISTORY ? j->n_prompt - CORE_SAMPLE_HISTORY : 0;
        const int32_t *prompt = j->input + (j->n_input - j->n_prompt);
        for (size_t k = from; k < j->n_prompt; k++)
            core_sampler_accept(c->sampler, prompt[k], NULL);
    }
    if (j->max_tokens > 0) {
        s0->logits = malloc((size_t)E->V * sizeof *s0->logits);
        if (!s0->logits) {
            set_error(j, "out of memory for logits");
            j->end_req = SRV_FINISH_ERROR;
        } else if (j->grammar && !s0->gs.g && /* else from spec.grammar_start */
                   core_grammar_state_init(&s0->gs, j->grammar, &ce) < 0) {
            grammar_error(j, -1, &ce);
            j->end_req = SRV_FINISH_ERROR;
        }
    }
}

static void job_finalize(srv_engine_t *E, srv_job_t *j, int64_t now)
{
    srv_seq_ctx_t *c = j->ctx;
    const size_t rem = j->n_input - j->absorbed;
    const int32_t tail = j->seqs[0].unfed;
    /* the pending rule: unabsorbed input, or the last unfed sample of
     * choice 0; the input buffer (capacity >= max(n_input, 1)) carries it */
    if (rem > 0) {
        memmove(j->input, j->input + j->absorbed, rem * sizeof *j->input);
        c->pending = j->input;
        c->n_pending = rem;
        j->input = NULL;
    } else if (tail >= 0) {
        j->input[0] = tail;
        c->pending = j->input;
        c->n_pending = 1;
        j->input = NULL;
    } else {
        c->pending = NULL;
        c->n_pending = 0;
    }
    int with_tokens = 0;
    for (int i = 0; i < j->n_choices; i++) {
        seq_t *s = &j->seqs[i];
        if (!s->ended) /* cannot happen: every path ends its choices first */
            choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        j->res.completion_total += s->n_gen;
        with_tokens += s->n_gen > 0;
        seq_release(s);
        free(s->logits);
        s->logits = NULL;
        core_stop_free(s->stop);
        s->stop = NULL;
    }
    srv_job_result_t *r = &j->res;
    r->n_choices = j->n_choices;
    r->prompt_tokens = (int64_t)j->n_prompt;
    r->input_tokens = (int64_t)j->n_input;
    r->absorbed_tokens = (int64_t)(j->absorbed - j->n_cached);
    r->cached_tokens = (int64_t)j->n_cached;
    r->state_pos = core_attn_state_pos(c->state);
    r->n_pending = c->n_pending;
    r->queue_s = j->t_admit ? (double)(j->t_admit - j->t_submit) / 1e9 : -1;
    r->ttft_s = j->t_first_tok ? (double)(j->t_first_tok - j->t_submit) / 1e9 : -1;
    r->prefill_s = j->t_prefill_done ? (double)(j->t_prefill_done - j->t_admit) / 1e9 : -1;
    r->decode_s = j->t_first_tok ? (double)(j->t_last_tok - j->t_first_tok) / 1e9 : -1;
    r->total_s = (double)(now - j->t_submit) / 1e9;
    r->prefill_tps = r->prefill_s > 0 ? (double)r->absorbed_tokens / r->prefill_s : -1;
    r->decode_tps =
        r->decode_s > 0 ? (double)(r->completion_total - with_tokens) / r->decode_s : -1;
    r->end_step = E->st.steps;
    if (j->slots > 0) {
        E->running_seqs -= j->slots;
        j->slots = 0;
    }
    j->phase = PH_DONE;
    j->finalized = 1;
    E->st.jobs_done++;
    emit(E, j, j->done_ev);
    j->done_ev = NULL;
}

/* ---- one step ---- */

/* Copies the state at every snapshot position the prefill just reached. A
 * copy that fails is skipped (the cache misses it, nothing else changes). */
static void take_snapshots(srv_engine_t *E, srv_job_t *j)
{
    while (j->next_snap < j->n_snap && j->snap_at[j->next_snap] == j->absorbed) {
        core_error_t ce = {0};
        core_attn_state_t *cp = NULL;
        if (core_attn_state_new(E->attn, &cp, &ce) < 0 ||
            core_attn_state_copy(cp, j->ctx->state, &ce) < 0) {
            SRV_LOG(SRV_LOG_WARN, j->req_id, "engine: state snapshot at %zu tokens: %s",
                    j->absorbed, ce.msg);
            core_attn_state_free(cp);
            cp = NULL;
        }
        j->snaps[j->next_snap++] = cp;
    }
}

static int job_runnable(const srv_job_t *j)
{
    return !j->finalized && !j->paused && (j->phase == PH_PREFILL || j->phase == PH_DECODE);
}

/* An embedding job's chunk of n rows (in j->ehid) was fed and j->absorbed
 * counts it: fold it into the pool, and write the pool's answer once the
 * input is absorbed. Rows are summed in double, so a long input's mean does
 * not lose its late tokens to rounding. */
static void pool_rows(const srv_engine_t *E, srv_job_t *j, int64_t n)
{
    const int64_t D = E->D;
    if (j->pool == SRV_POOL_MEAN) {
        for (int64_t r = 0; r < n; r++)
            for (int64_t d = 0; d < D; d++)
                j->esum[d] += (double)j->ehid[r * D + d];
        if (j->absorbed == j->n_input)
            for (int64_t d = 0; d < D; d++)
                j->embed_out[d] = (float)(j->esum[d] / (double)j->n_input);
    } else if (j->pool == SRV_POOL_LAST && j->absorbed == j->n_input) {
        memcpy(j->embed_out, j->ehid + (n - 1) * D, (size_t)D * sizeof *j->embed_out);
    }
}

/* Runs the batch; on failure, each entry alone, so one bad sequence does not
 * take the others down. */
static void run_forward(srv_engine_t *E, int nb)
{
    core_error_t ce = {0};
    for (int b = 0; b < nb; b++)
        E->bfail[b] = 0;
    if (core_model_forward(E->model, E->batch, nb, &ce) == 0)
        return;
    E->st.forward_errors++;
    SRV_LOG(SRV_LOG_WARN, NULL,
            "engine: batched forward of %d sequences failed (%s); retrying alone", nb, ce.msg);
    for (int b = 0; b < nb; b++) {
        core_error_t ce1 = {0};
        if (core_model_forward(E->model, &E->batch[b], 1, &ce1) < 0) {
            E->bfail[b] = 1;
            set_error(E->bjob[b], "forward: %s", ce1.msg);
        }
    }
}

static void step(srv_engine_t *E, srv_job_t *ending, int64_t now)
{
    /* jobs that end before running: start (the pending rule) and finish */
    for (srv_job_t *j = ending, *nx; j; j = nx) {
        nx = j->next;
        j->next = NULL;
        job_start(E, j);
        job_end_all(E, j, j->end_req);
        job_finalize(E, j, now);
    }
    for (int r = 0; r < E->n_running; r++) {
        srv_job_t *j = E->running[r];
        if (j->finalized)
            continue;
        if (j->needs_start) {
            j->needs_start = 0;
            j->t_admit = now;
            srv_series_observe(E->m.qwait, (double)(now - j->t_submit) / 1e9);
            srv_finish_t req = j->end_req;
            job_start(E, j);
            if (req != SRV_FINISH_NONE)
                j->end_req = req;
            if (j->end_req == SRV_FINISH_NONE && j->absorbed == j->n_input) {
                /* empty ingest: nothing to run */
                j->t_prefill_done = now;
                choice_end(E, j, 0, SRV_FINISH_LENGTH, 0);
            }
        }
        if (j->end_req != SRV_FINISH_NONE)
            job_end_all(E, j, j->end_req);
        if (j->n_live == 0)
            job_finalize(E, j, now);
    }

    /* gather: one row per decoding sequence, then prompt chunks in
     * admission order within the row budget */
    int nb = 0, n_dec = 0, n_pre = 0;
    int64_t rows = 0;
    for (int r = 0; r < E->n_running; r++) {
        srv_job_t *j = E->running[r];
        if (!job_runnable(j) || j->phase != PH_DECODE)
            continue;
        for (int i = 0; i < j->n_choices; i++) {
            seq_t *s = &j->seqs[i];
            if (!s->live)
                continue;
            E->batch[nb] = (core_batch_seq_t){.state = s->state,
                                              .tokens = &s->unfed,
                                              .n_tokens = 1,
                                              .logits_mode = CORE_LOGITS_LAST,
                                              .logits = s->logits};
            E->bjob[nb] = j;
            E->bseq[nb] = s;
            nb++;
            n_dec++;
            rows++;
        }
    }
    for (int r = 0; r < E->n_running && rows < E->o.max_step_tokens; r++) {
        srv_job_t *j = E->running[r];
        if (!job_runnable(j) || j->phase != PH_PREFILL)
            continue;
        size_t n = j->n_input - j->absorbed;
        if (n > (size_t)E->o.prefill_chunk)
            n = (size_t)E->o.prefill_chunk;
        if ((int64_t)n > E->o.max_step_tokens - rows)
            n = (size_t)(E->o.max_step_tokens - rows);
        /* a snapshot position ends the chunk (snap_at > absorbed: n stays >= 1) */
        if (j->next_snap < j->n_snap && j->absorbed + n > j->snap_at[j->next_snap])
            n = j->snap_at[j->next_snap] - j->absorbed;
        const int last = j->absorbed + n == j->n_input;
        const int want = last && j->max_tokens > 0;
        float *hidden = NULL; /* an embedding job's rows of this chunk */
        if (j->pool == SRV_POOL_TOKENS)
            hidden = j->embed_out + j->absorbed * (size_t)E->D;
        else if (j->pool != SRV_POOL_OFF)
            hidden = j->ehid;
        E->batch[nb] = (core_batch_seq_t){.state = j->ctx->state,
                                          .tokens = j->input + j->absorbed,
                                          .n_tokens = (int64_t)n,
                                          .logits_mode = want ? CORE_LOGITS_LAST : CORE_LOGITS_NONE,
                                          .logits = want ? j->seqs[0].logits : NULL,
                                          .hidden = hidden};
        E->bjob[nb] = j;
        E->bseq[nb] = NULL;
        nb++;
        n_pre++;
        rows += (int64_t)n;
    }
    if (nb == 0)
        return;

    run_forward(E, nb);
    const int64_t t = srv_engine_now_ns();
    E->st.steps++;
    E->st.rows += (uint64_t)rows;
    E->st.batch_hist[nb]++;
    if (nb > E->st.max_batch_seen)
        E->st.max_batch_seen = nb;
    if (n_dec && n_pre)
        E->st.steps_mixed++;
    srv_series_add(E->m.steps, 1);
    srv_series_observe(E->m.batch_seqs, nb);
    srv_series_observe(E->m.batch_rows, (double)rows);

    sample_batch(E, nb);
    for (int b = 0; b < nb; b++) {
        srv_job_t *j = E->bjob[b];
        seq_t *s = E->bseq[b];
        if (s) {
            const int i = (int)(s - j->seqs);
            if (E->bfail[b]) {
                choice_end(E, j, i, SRV_FINISH_ERROR, 1);
                continue;
            }
            s->unfed = -1;
            if (E->bsampled[b])
                take_sampled(E, j, i, b, t);
            else
                sample_choice(E, j, i, s->logits, t);
            continue;
        }
        if (E->bfail[b]) {
            job_end_all(E, j, SRV_FINISH_ERROR);
            continue;
        }
        j->absorbed += (size_t)E->batch[b].n_tokens;
        if (j->pool != SRV_POOL_OFF)
            pool_rows(E, j, E->batch[b].n_tokens);
        take_snapshots(E, j);
        E->st.prompt_tokens += (uint64_t)E->batch[b].n_tokens;
        srv_series_add(E->m.prompt, (double)E->batch[b].n_tokens);
        if (j->absorbed < j->n_input)
            continue;
        j->t_prefill_done = t;
        pthread_mutex_lock(&E->mu);
        j->snaps_ready = 1;
        pthread_mutex_unlock(&E->mu);
        if (j->max_tokens == 0)
            choice_end(E, j, 0, SRV_FINISH_LENGTH, 0);
        else
            job_fork(E, j, t);
    }
    for (int r = 0; r < E->n_running; r++) {
        srv_job_t *j = E->running[r];
        if (!j->finalized && j->n_live == 0)
            job_finalize(E, j, t);
    }
}

int srv_job_snapshots_ready(srv_job_t *job)
{
    if (!job)
        return 0;
    pthread_mutex_lock(&job->e->mu);
    const int r = job->done || job->snaps_ready;
    pthread_mutex_unlock(&job->e->mu);
    return r;
}

core_attn_state_t *srv_job_take_snapshot(srv_job_t *job, size_t k)
{
    if (!job || k >= job->n_snap)
        return NULL;
    srv_engine_t *e = job->e;
    core_attn_state_t *s = NULL;
    pthread_mutex_lock(&e->mu);
    if (job->done || job->snaps_ready) { /* the scheduler writes snaps no more */
        s = job->snaps[k];
        job->snaps[k] = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return s;
}

/* ---- queues (under mu) ---- */

int eng_over_bound(const srv_engine_t *E, const srv_job_t *j)
{
    return j->attached &&
           (j->q_len >= E->o.max_queued_events || j->q_bytes >= E->o.max_queued_bytes);
}

static int q_push(srv_job_t *j, srv_event_t *ev)
{
    if (j->q_len == j->q_cap) {
        size_t cap = j->q_cap ? 2 * j->q_cap : 16;
        srv_event_t **p = malloc(cap * sizeof(srv_event_t *));
        if (!p)
            return -1;
        for (size_t k = 0; k < j->q_len; k++)
            p[k] = j->q[(j->q_head + k) % j->q_cap];
        free(j->q);
        j->q = p;
        j->q_cap = cap;
        j->q_head = 0;
    }
    j->q[(j->q_head + j->q_len) % j->q_cap] = ev;
    j->q_len++;
    j->q_bytes += ev->len;
    return 0;
}

void eng_q_clear(srv_job_t *j)
{
    while (j->q_len) {
        free(j->q[j->q_head]);
        j->q_head = (j->q_head + 1) % j->q_cap;
        j->q_len--;
    }
    j->q_bytes = 0;
}

void eng_job_free(srv_job_t *j)
{
    if (!j)
        return;
    eng_q_clear(j);
    free(j->q);
    for (size_t k = 0; k < j->n_out; k++)
        free(j->out[k]);
    free(j->out);
    free(j->done_ev);
    if (j->seqs) {
        for (int i = 0; i < j->n_choices; i++) {
            seq_release(&j->seqs[i]);
            free(j->seqs[i].logits);
            core_stop_free(j->seqs[i].stop);
        }
    }
    free(j->seqs);
    for (size_t k = 0; k < j->n_stops; k++)
        free(j->stops[k]);
    free(j->stops);
    free(j->input);
    free(j->ehid);
    free(j->esum);
    for (size_t k = 0; k < j->n_snap; k++)
        core_attn_state_free(j->snaps[k]);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops one reference (under mu); returns the job when it must be freed
 * (outside the lock). */
srv_job_t *eng_job_unref(srv_job_t *j)
{
    return --j->refs == 0 ? j : NULL;
}

static srv_finish_t end_reason(const srv_job_t *j, int64_t now, int cut)
{
    if (j->cancelled || cut)
        return SRV_FINISH_CANCELLED;
    if (j->deadline_ns > 0 && now >= j->deadline_ns)
        return SRV_FINISH_TIMEOUT;
    return SRV_FINISH_NONE;
}

static void publish(srv_engine_t *E)
{
    E->st.running_jobs = E->n_running;
    E->st.running_seqs = E->running_seqs;
    E->pub = E->st;
    srv_series_set(E->m.running, (double)E->running_seqs);
    srv_series_set(E->m.queue, (double)E->n_waiting);
}

void eng_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ns)
{
    if (until_ns <= 0) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = {.tv_sec = (time_t)(until_ns / 1000000000),
                          .tv_nsec = (long)(until_ns % 1000000000)};
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Earliest time something needs the scheduler without a signal: a job's
 * deadline or the stop deadline; 0 = none. */
static int64_t next_wakeup(const srv_engine_t *E)
{
    int64_t w = 0;
#define SRV_ENGINE_MIN_(x)                                                                         \
    do {                                                                                           \
        int64_t x_ = (x);                                                                          \
        if (x_ > 0 && (w == 0 || x_ < w))                                                          \
            w = x_;                                                                                \
    } while (0)
    for (const srv_job_t *j = E->wait_head; j; j = j->next)
        SRV_ENGINE_MIN_(j->deadline_ns);
    for (int r = 0; r < E->n_running; r++)
        SRV_ENGINE_MIN_(E->running[r]->deadline_ns);
    if (E->stopping)
        SRV_ENGINE_MIN_(E->stop_deadline);
#undef SRV_ENGINE_MIN_
    return w;
}

static void *sched_main(void *arg)
{
    srv_engine_t *E = arg;
    pthread_mutex_lock(&E->mu);
    for (;;) {
        const int64_t now = srv_engine_now_ns();
        const int cut = E->stopping && now >= E->stop_deadline;
        int work = 0;

        /* waiting jobs that end without running */
        srv_job_t *ending = NULL, **endp = &ending;
        E->wait_tail = NULL;
        for (srv_job_t **pp = &E->wait_head; *pp;) {
            srv_job_t *j = *pp;
            srv_finish_t why = end_reason(j, now, cut);
            if (why != SRV_FINISH_NONE) {
                *pp = j->next;
                j->next = NULL;
                j->end_req = why;
                *endp = j;
                endp = &j->next;
                E->n_waiting--;
                work = 1;
            } else {
                E->wait_tail = j;
                pp = &j->next;
            }
        }
        /* admit while sequence slots are free (FIFO: no overtaking) */
        while (E->wait_head && !E->hold &&
               E->running_seqs + E->wait_head->n_choices <= E->o.max_batch) {
            srv_job_t *j = E->wait_head;
            E->wait_head = j->next;
            if (!E->wait_head)
                E->wait_tail = NULL;
            j->next = NULL;
            E->n_waiting--;
            j->needs_start = 1;
            j->slots = j->n_choices;
            E->running_seqs += j->n_choices;
            E->running[E->n_running++] = j;
        }
        for (int r = 0; r < E->n_running; r++) {
            srv_job_t *j = E->running[r];
            j->end_req = end_reason(j, now, cut);
            j->paused = j->end_req == SRV_FINISH_NONE && eng_over_bound(E, j);
            if (j->end_req != SRV_FINISH_NONE || !j->paused || j->needs_start)
                work = 1;
        }
        if (!work) {
            publish(E);
            if (E->stopping && !E->wait_head && E->n_running == 0)
                break;
            eng_timed_wait(&E->cv, &E->mu, next_wakeup(E));
            continue;
        }
        pthread_mutex_unlock(&E->mu);

        E->touched = NULL;
        step(E, ending, now);

        /* deliver */
        pthread_mutex_lock(&E->mu);
        for (srv_job_t *j = E->touched; j; j = j->tnext) {
            for (size_t k = 0; k < j->n_out; k++) {
                if (!j->attached || q_push(j, j->out[k]) < 0)
                    free(j->out[k]);
            }
            j->n_out = 0;
            if (j->finalized)
                j->done = 1;
            pthread_cond_broadcast(&j->cv);
        }
        int w = 0;
        for (int r = 0; r < E->n_running; r++) {
            if (!E->running[r]->finalized)
                E->running[w++] = E->running[r];
        }
        E->n_running = w;
        publish(E);
        srv_job_t *list = E->touched;
        E->touched = NULL;
        pthread_mutex_unlock(&E->mu);

        for (srv_job_t *j = list; j; j = j->tnext) {
            if (j->notify)
                j->notify(j->ud);
        }
        for (srv_job_t *j = list; j; j = j->tnext) {
            if (j->finalized && j->on_done)
                j->on_done(j, j->ud);
        }
        pthread_mutex_lock(&E->mu);
        srv_job_t *dead = NULL;
        for (srv_job_t *j = list, *nx; j; j = nx) {
            nx = j->tnext;
            j->touched = 0;
            j->tnext = NULL;
            if (j->finalized && eng_job_unref(j)) {
                j->tnext = dead;
                dead = j;
            }
        }
        if (dead) {
            pthread_mutex_unlock(&E->mu);
            for (srv_job_t *j = dead, *nx; j; j = nx) {
                nx = j->tnext;
                eng_job_free(j);
            }
            pthread_mutex_lock(&E->mu);
        }
    }
    pthread_mutex_unlock(&E->mu);
    return NULL;
}

/* ---- public: engine ---- */

static void register_metrics(srv_engine_t *E)
{
    srv_metrics_t *reg = E->o.metrics;
    if (!reg)
        return;
    static const double b_seqs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    static const double b_rows[] = {1, 4, 16, 64, 256, 1024, 2048, 4096};
    static const double b_ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double b_itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    E->m.steps = srv_metric_series(
        srv_metrics_counter(reg, "darkserve_engine_steps_total", "Batched forwards run", NULL),
        NULL);
    E->m.batch_seqs =
        srv_metric_series(srv_metrics_histogram(reg, "darkserve_engine_batch_sequences",
                                                "Sequences in one batched forward", NULL, b_seqs,
                                                sizeof b_seqs / sizeof b_seqs[0]),
                          NULL);
    E->m.batch_rows =
        srv_metric_series(srv_metrics_histogram(reg, "darkserve_engine_batch_tokens",
                                                "Token rows in one batched forward", NULL, b_rows,
                                                sizeof b_rows / sizeof b_rows[0]),
                          NULL);
    E->m.prompt = srv_metric_series(srv_metrics_counter(reg, "darkserve_engine_prompt_tokens_total",
                                                        "Input tokens absorbed", NULL),
                                    NULL);
    E->m.gen = srv_metric_series(
        srv_metrics_counter(reg, "darkserve_engine_generated_tokens_total", "Tokens sampled", NULL),
        NULL);
    E->m.queue = srv_metric_series(
        srv_metrics_gauge(reg, "darkserve_engine_queue_depth", "Jobs waiting to run", NULL), NULL);
    E->m.running = srv_metric_series(
        srv_metrics_gauge(reg, "darkserve_engine_running_sequences", "Sequence slots in use", NULL),
        NULL);
    E->m.ttft =
        srv_metric_series(srv_metrics_histogram(reg, "darkserve_engine_time_to_first_token_seconds",
                                                "Submit to first sampled token", NULL, b_ttft,
                                                sizeof b_ttft / sizeof b_ttft[0]),
                          NULL);
    E->m.qwait = srv_metric_series(srv_metrics_histogram(reg, "darkserve_engine_queue_wait_seconds",
                                                         "Submit to first scheduled step", NULL,
                                                         b_ttft, sizeof b_ttft / sizeof b_ttft[0]),
                                   NULL);
    E->m.itl = srv_metric_series(srv_metrics_histogram(reg, "darkserve_engine_inter_token_seconds",
                                                       "Time between two tokens of one sequence",
                                                       NULL, b_itl, sizeof b_itl / sizeof b_itl[0]),
                                 NULL);
    srv_metric_t *fin = srv_metrics_counter(reg, "darkserve_engine_sequences_finished_total",
                                            "Sequences (choices) ended, by finish reason",
                                            (const char *[]){"reason", NULL});
    for (int f = 1; f < SRV_FINISH_COUNT_; f++)
        E->m.finished[f] = srv_metric_series(fin, (const char *[]){srv_finish_name(f)});
    srv_metric_t *rej = srv_metrics_counter(reg, "darkserve_engine_rejected_total",
                                            "Jobs refused at submission, by reason",
                                            (const char *[]){"reason", NULL});
    E->m.rej_full = srv_metric_series(rej, (const char *[]){"queue_full"});
    E->m.rej_stopped = srv_metric_series(rej, (const char *[]){"stopping"});
    E->m.rej_invalid = srv_metric_series(rej, (const char *[]){"invalid"});
}

static int resolve_opts(srv_engine_opts_t *o, char *err, size_t errlen)
{
    if (o->max_batch == 0)
        o->max_batch = DEF_MAX_BATCH;
    if (o->prefill_chunk == 0)
        o->prefill_chunk = DEF_PREFILL_CHUNK;
    if (o->max_step_tokens == 0)
        o->max_step_tokens = DEF_STEP_TOKENS;
    if (o->max_queue == 0)
        o->max_queue = DEF_MAX_QUEUE;
    if (o->max_queued_events == 0)
        o->max_queued_events = DEF_Q_EVENTS;
    if (o->max_queued_bytes == 0)
        o->max_queued_bytes = DEF_Q_BYTES;
    if (o->max_batch < 1 || o->max_batch > SRV_ENGINE_MAX_BATCH)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "max_batch %d outside 1..%d", o->max_batch,
                    SRV_ENGINE_MAX_BATCH);
    if (o->max_step_tokens < o->max_batch || o->max_step_tokens > SRV_ENGINE_MAX_STEP_TOKENS)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "max_step_tokens %d outside max_batch..%d",
                    o->max_step_tokens, SRV_ENGINE_MAX_STEP_TOKENS);
    if (o->prefill_chunk < 1 || o->prefill_chunk > o->max_step_tokens)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "prefill_chunk %d outside 1..max_step_tokens",
                    o->prefill_chunk);
    if (o->max_queue < 1 || o->max_queue > MAX_QUEUE_LIMIT)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "max_queue %d outside 1..%d", o->max_queue,
                    MAX_QUEUE_LIMIT);
    if (o->max_queued_events > MAX_Q_EVENTS || o->max_queued_bytes > MAX_Q_BYTES)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "per-job output bound too large");
    if (o->max_input == 0 || o->max_input > SRV_ENGINE_MAX_PROMPT)
        o->max_input = SRV_ENGINE_MAX_PROMPT;
    return 0;
}

int srv_engine_new(core_model_t *model, const core_tokenizer_t *tok, const srv_engine_opts_t *opts,
                   srv_engine_t **out, char *err, size_t errlen)
{
    if (!model || !tok || !out)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "model, tokenizer and out are required");
    *out = NULL;
    srv_engine_opts_t o = {0};
    if (opts)
        o = *opts;
    int rc = resolve_opts(&o, err, errlen);
    if (rc < 0)
        return rc;
    const core_model_info_t *info = core_model_info(model);
    if (core_tokenizer_n_vocab(tok) > info->n_vocab)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                    "tokenizer has %d tokens, the model only %d logits",
                    (int)core_tokenizer_n_vocab(tok), info->n_vocab);
    srv_engine_t *E = calloc(1, sizeof *E);
    if (!E)
        return eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
    E->model = model;
    E->tok = tok;
    E->attn = core_model_attn(model);
    E->V = info->n_vocab;
    E->D = info->n_embd;
    const core_attn_cfg_t *ac = core_attn_config(E->attn);
    E->exact = ac->kind == CORE_ATTN_EXACT;
    E->max_ctx = ac->max_ctx;
    E->o = o;
    core_rng_seed(&E->seed_rng,
                  o.seed ? o.seed : (uint64_t)srv_engine_now_ns() ^ ((uint64_t)getpid() << 32));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&E->mu, NULL);
    pthread_mutex_init(&E->stop_mu, NULL);
    pthread_cond_init(&E->cv, &ca);
    pthread_condattr_destroy(&ca);
    const size_t nb = (size_t)o.max_batch;
    E->running = calloc(nb, sizeof(srv_job_t *));
    E->batch = calloc(nb, sizeof *E->batch);
    E->bjob = calloc(nb, sizeof(srv_job_t *));
    E->bseq = calloc(nb, sizeof(seq_t *));
    E->bfail = calloc(nb, sizeof *E->bfail);
    E->bsampled = calloc(nb, sizeof *E->bsampled);
    E->bres = calloc(nb, sizeof *E->bres);
    E->brc = calloc(nb, sizeof *E->brc);
    E->berr = calloc(nb, sizeof *E->berr);
    E->n_wss = core_model_threads(model);
    E->wss = calloc((size_t)E->n_wss, sizeof(core_sample_ws_t *));
    int wss_ok = E->wss != NULL;
    for (int w = 0; E->wss && w < E->n_wss; w++)
        wss_ok &= (E->wss[w] = core_sample_ws_new()) != NULL;
    E->piece_cap = core_tok_stream_max_out(tok);
    E->piece = malloc(E->piece_cap);
    E->ws = core_sample_ws_new();
    E->gws = core_grammar_ws_new();
    E->gmask = malloc(CORE_GRAMMAR_MASK_WORDS(E->V) * sizeof *E->gmask);
    if (!E->running || !E->batch || !E->bjob || !E->bseq || !E->bfail || !E->bsampled ||
        !E->bres || !E->brc || !E->berr || !wss_ok || !E->piece || !E->ws ||
        !E->gws || !E->gmask) {
        rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
        goto fail;
    }
    core_error_t ce = {0};
    if (core_grammar_vocab_from_tokenizer(tok, &E->gvocab, &ce) < 0) {
        rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "grammar vocabulary: %s", ce.msg);
        goto fail;
    }
    register_metrics(E);
    if (pthread_create(&E->thread, NULL, sched_main, E) != 0) {
        rc = eng_fail(err, errlen, SRV_ENGINE_ETHREAD, "cannot start the scheduler thread: %s",
                  strerror(errno));
        goto fail;
    }
    E->thread_started = 1;
    *out = E;
    return 0;
fail:
    E->joined = 1;
    srv_engine_free(E);
    return rc;
}

void srv_engine_drain(srv_engine_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_hold(srv_engine_t *e, int hold)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->hold = hold != 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_stop(srv_engine_t *e, int64_t deadline_ns)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->stop_mu);
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    e->hold = 0;
    if (!e->stopping || deadline_ns < e->stop_deadline)
        e->stop_deadline = deadline_ns;
    e->stopping = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started && !e->joined) {
        pthread_join(e->thread, NULL);
        e->joined = 1;
    }
    pthread_mutex_unlock(&e->stop_mu);
}

void srv_engine_free(srv_engine_t *e)
{
    if (!e)
        return;
    if (e->thread_started && !e->joined)
        srv_engine_stop(e, srv_engine_now_ns());
    free(e->running);
    free(e->batch);
    free(e->bjob);
    free(e->bseq);
    free(e->bfail);
    free(e->bsampled);
    free(e->bres);
    free(e->brc);
    free(e->berr);
    for (int w = 0; e->wss && w < e->n_wss; w++)
        core_sample_ws_free(e->wss[w]);
    free(e->wss);
    free(e->piece);
    free(e->txt);
    core_sample_ws_free(e->ws);
    core_grammar_ws_free(e->gws);
    core_grammar_vocab_free(e->gvocab);
    free(e->gmask);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->stop_mu);
    free(e);
}

void srv_engine_stats(srv_engine_t *e, srv_engine_stats_t *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->pub;
    out->queue_depth = e->n_waiting;
    out->jobs_submitted = e->sub_submitted;
    out->jobs_rejected = e->sub_rejected;
    out->jobs_queue_full = e->sub_queue_full;
    pthread_mutex_unlock(&e->mu);
}

const core_grammar_vocab_t *srv_engine_grammar_vocab(const srv_engine_t *e)
{
    return e->gvocab;
}
