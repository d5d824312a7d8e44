/* server/engine.c — the scheduler thread, job submission and output queues
 * (see engine.h for the contract).
 *
 * Locking: one engine mutex guards what other threads touch: the waiting
 * FIFO, job flags (cancelled, attached, done), output queues, the published
 * statistics and the stop flags. Everything else — the running jobs, their
 * sequences, the batch, the model — belongs to the scheduler thread, which
 * works without the lock and takes it only at the start of a step (to admit
 * and to read cancellations) and at its end (to deliver events). Callbacks
 * (notify, on_done) run with no lock held.
 */
#include "server/engine.h"

#include "core/rng.h"
#include "server/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    DEF_MAX_BATCH = 8,
    DEF_PREFILL_CHUNK = 256,
    DEF_STEP_TOKENS = SRV_ENGINE_DEFAULT_STEP_TOKENS,
    DEF_MAX_QUEUE = 64,
    MAX_QUEUE_LIMIT = SRV_ENGINE_MAX_QUEUE,
    DEF_Q_EVENTS = 1024
};
#define DEF_Q_BYTES ((size_t)256 << 10)
#define MAX_Q_EVENTS ((size_t)1 << 24)
#define MAX_Q_BYTES ((size_t)1 << 30)

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

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
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

static srv_event_t *ev_new(srv_event_kind_t kind, int choice, const char *text, size_t len)
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

/* ---- objects ---- */

typedef enum phase { PH_WAITING = 0, PH_PREFILL, PH_DECODE, PH_DONE } phase_t;

/* One choice of a job. Choice 0 runs on the context's state and sampler;
 * the others on copies made when the prompt is absorbed (fork). */
typedef struct seq {
    int live; /* forked and decoding */
    int ended;
    int owned; /* state and sampler are this seq's copies */
    core_attn_state_t *state;
    core_sampler_t *sampler;
    float *logits; /* [V], owned */
    int32_t unfed; /* last sampled token not yet fed, -1 if none */
    int stop_matched;
    core_tok_stream_t ts;
    core_stop_t *stop;      /* owned */
    core_grammar_state_t gs; /* with job->grammar: this choice's place in it (owned) */
    int64_t n_gen;
    int64_t t_last_ns;
} seq_t;

struct srv_job {
    srv_engine_t *e;
    /* set by submit, then read-only */
    srv_seq_ctx_t *ctx;
    int32_t *input; /* [max(n_input, 1)]: pending ++ prompt */
    size_t n_input, n_prompt;
    int64_t max_tokens;
    int n_choices;
    core_sample_params_t params;
    const core_grammar_t *grammar; /* borrowed until on_done, may be NULL */
    int reseed, ignore_eos;
    char **stops; /* [n_stops], owned */
    size_t n_stops;
    unsigned detok_flags;
    int64_t deadline_ns;
    size_t n_cached;                           /* input tokens the state held at start */
    size_t snap_at[SRV_ENGINE_MAX_SNAPS];      /* [n_snap] input positions to copy at */
    core_attn_state_t *snaps[SRV_ENGINE_MAX_SNAPS]; /* [n_snap] the copies (scheduler
                                                  thread until DONE, then the taker) */
    size_t n_snap, next_snap;
    char req_id[72];
    void (*notify)(void *ud);
    void (*on_done)(srv_job_t *job, void *ud);
    void *ud;
    int64_t t_submit;

    /* under e->mu */
    int refs;
    int attached; /* the caller still holds its reference */
    int cancelled;
    int done;
    srv_event_t **q; /* ring [q_cap] */
    size_t q_head, q_len, q_cap, q_bytes;
    pthread_cond_t cv; /* srv_job_wait */
    srv_job_t *next;   /* waiting FIFO */
    int needs_start;   /* admitted or ended from the queue, not started */

    /* scheduler thread only */
    phase_t phase;
    size_t absorbed;
    seq_t *seqs;          /* [n_choices] */
    int n_live;           /* choices not ended */
    int slots;            /* sequence slots held */
    srv_finish_t end_req; /* end requested for this step */
    int paused;
    srv_event_t **out; /* events made this step, delivered under the lock */
    size_t n_out, cap_out;
    srv_event_t *done_ev; /* preallocated: DONE always arrives */
    int touched, finalized;
    srv_job_t *tnext;
    int64_t t_admit, t_prefill_done, t_first_tok, t_last_tok;
    srv_job_result_t res;
};

typedef struct eng_metrics {
    srv_series_t *steps, *batch_seqs, *batch_rows, *prompt, *gen, *queue, *running, *ttft, *itl,
        *qwait;
    srv_series_t *finished[SRV_FINISH_COUNT_];
    srv_series_t *rej_full, *rej_stopped, *rej_invalid;
} eng_metrics_t;

struct srv_engine {
    core_model_t *model;
    const core_tokenizer_t *tok;
    core_attn_t *attn;
    int64_t V;
    int exact;
    int64_t max_ctx;
    srv_engine_opts_t o;

    pthread_t thread;
    int thread_started, joined;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* wakes the scheduler */
    pthread_mutex_t stop_mu; /* serializes srv_engine_stop callers */

    /* under mu */
    srv_job_t *wait_head, *wait_tail;
    int64_t n_waiting;
    int draining, stopping, hold;
    int64_t stop_deadline;
    uint64_t sub_submitted, sub_rejected, sub_queue_full;
    srv_engine_stats_t pub; /* published copy of st */

    /* scheduler thread only */
    srv_job_t **running; /* [max_batch], admission order */
    int n_running;
    int64_t running_seqs;
    srv_engine_stats_t st;
    core_sample_ws_t *ws;
    core_grammar_vocab_t *gvocab; /* the tokenizer's, for grammars (immutable) */
    core_grammar_ws_t *gws;
    uint64_t *gmask; /* [CORE_GRAMMAR_MASK_WORDS(V)] */
    core_rng_t seed_rng;
    core_batch_seq_t *batch; /* [max_batch] */
    srv_job_t **bjob;        /* [max_batch] */
    seq_t **bseq;            /* [max_batch]: NULL for a prefill entry */
    int *bfail;              /* [max_batch] */
    char *piece;             /* [piece_cap] detokenizer output */
    size_t piece_cap;
    char *txt; /* growable text of the event being built */
    size_t txt_len, txt_cap;
    int txt_oom;
    srv_job_t *touched;
    eng_metrics_t m;
};

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

static void set_error(srv_job_t *j, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(srv_job_t *j, int code, const char *fmt, ...)
{
    if (j->res.error_code)
        return; /* the first error is the interesting one */
    j->res.error_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->res.error, sizeof j->res.error, fmt, ap);
    va_end(ap);
    SRV_LOG(SRV_LOG_WARN, j->req_id[0] ? j->req_id : NULL, "engine: %s", j->res.error);
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
        srv_event_t *ev = ev_new(SRV_EVENT_END, i, E->txt, E->txt_oom ? 0 : E->txt_len);
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
    srv_event_t *ev = ev_new(SRV_EVENT_TOKEN, i, E->txt, E->txt_oom ? 0 : E->txt_len);
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
            set_error(j, ce.code, "grammar of choice %d: %s", i, ce.msg);
            choice_end(E, j, i, SRV_FINISH_ERROR, 1);
            return;
        }
        allow = E->gmask;
    }
    if (core_sampler_sample_masked(s->sampler, E->ws, logits, E->V, allow, &r, &ce) < 0) {
        set_error(j, ce.code, "sampling choice %d: %s%s", i, ce.msg,
                  allow ? " (under the grammar)" : "");
        choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        return;
    }
    if (j->grammar && core_grammar_accept(&s->gs, E->gws, r.token, &ce) < 0) {
        set_error(j, ce.code, "grammar of choice %d: %s", i, ce.msg);
        choice_end(E, j, i, SRV_FINISH_ERROR, 1);
        return;
    }
    take_token(E, j, i, &r, now);
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
                set_error(j, ce.code ? ce.code : CORE_ENOMEM, "fork of choice %d: %s", i, ce.msg);
                choice_end(E, j, i, SRV_FINISH_ERROR, 1);
                continue;
            }
            s->logits = malloc((size_t)E->V * sizeof *s->logits);
            if (!s->logits) {
                set_error(j, SRV_ENGINE_ENOMEM, "fork of choice %d: out of memory", i);
                choice_end(E, j, i, SRV_FINISH_ERROR, 1);
                continue;
            }
        }
        if (core_stop_new((const char *const *)j->stops, NULL, j->n_stops, &s->stop, &ce) < 0) {
            set_error(j, ce.code, "stop strings: %s", ce.msg);
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
            set_error(j, ce.code, "sampling parameters: %s", ce.msg);
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
            set_error(j, SRV_ENGINE_ENOMEM, "out of memory for logits");
            j->end_req = SRV_FINISH_ERROR;
        } else if (j->grammar && !s0->gs.g && /* else from spec.grammar_start */
                   core_grammar_state_init(&s0->gs, j->grammar, &ce) < 0) {
            set_error(j, ce.code, "grammar: %s", ce.msg);
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
            set_error(E->bjob[b], ce1.code, "forward: %s", ce1.msg);
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
        E->batch[nb] = (core_batch_seq_t){.state = j->ctx->state,
                                          .tokens = j->input + j->absorbed,
                                          .n_tokens = (int64_t)n,
                                          .logits_mode = want ? CORE_LOGITS_LAST : CORE_LOGITS_NONE,
                                          .logits = want ? j->seqs[0].logits : NULL};
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
            sample_choice(E, j, i, s->logits, t);
            continue;
        }
        if (E->bfail[b]) {
            job_end_all(E, j, SRV_FINISH_ERROR);
            continue;
        }
        j->absorbed += (size_t)E->batch[b].n_tokens;
        take_snapshots(E, j);
        E->st.prompt_tokens += (uint64_t)E->batch[b].n_tokens;
        srv_series_add(E->m.prompt, (double)E->batch[b].n_tokens);
        if (j->absorbed < j->n_input)
            continue;
        j->t_prefill_done = t;
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

core_attn_state_t *srv_job_take_snapshot(srv_job_t *job, size_t k)
{
    if (!job || k >= job->n_snap)
        return NULL;
    srv_engine_t *e = job->e;
    pthread_mutex_lock(&e->mu);
    const int done = job->done;
    pthread_mutex_unlock(&e->mu);
    if (!done)
        return NULL;
    core_attn_state_t *s = job->snaps[k];
    job->snaps[k] = NULL;
    return s;
}

/* ---- queues (under mu) ---- */

static int over_bound(const srv_engine_t *E, const srv_job_t *j)
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

static void q_clear(srv_job_t *j)
{
    while (j->q_len) {
        free(j->q[j->q_head]);
        j->q_head = (j->q_head + 1) % j->q_cap;
        j->q_len--;
    }
    j->q_bytes = 0;
}

static void job_free(srv_job_t *j)
{
    if (!j)
        return;
    q_clear(j);
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
    for (size_t k = 0; k < j->n_snap; k++)
        core_attn_state_free(j->snaps[k]);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops one reference (under mu); returns the job when it must be freed
 * (outside the lock). */
static srv_job_t *job_unref(srv_job_t *j)
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

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ns)
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
            j->paused = j->end_req == SRV_FINISH_NONE && over_bound(E, j);
            if (j->end_req != SRV_FINISH_NONE || !j->paused || j->needs_start)
                work = 1;
        }
        if (!work) {
            publish(E);
            if (E->stopping && !E->wait_head && E->n_running == 0)
                break;
            timed_wait(&E->cv, &E->mu, next_wakeup(E));
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
            if (j->finalized && job_unref(j)) {
                j->tnext = dead;
                dead = j;
            }
        }
        if (dead) {
            pthread_mutex_unlock(&E->mu);
            for (srv_job_t *j = dead, *nx; j; j = nx) {
                nx = j->tnext;
                job_free(j);
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
        return fail(err, errlen, SRV_ENGINE_EINVAL, "max_batch %d outside 1..%d", o->max_batch,
                    SRV_ENGINE_MAX_BATCH);
    if (o->max_step_tokens < o->max_batch || o->max_step_tokens > SRV_ENGINE_MAX_STEP_TOKENS)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "max_step_tokens %d outside max_batch..%d",
                    o->max_step_tokens, SRV_ENGINE_MAX_STEP_TOKENS);
    if (o->prefill_chunk < 1 || o->prefill_chunk > o->max_step_tokens)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "prefill_chunk %d outside 1..max_step_tokens",
                    o->prefill_chunk);
    if (o->max_queue < 1 || o->max_queue > MAX_QUEUE_LIMIT)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "max_queue %d outside 1..%d", o->max_queue,
                    MAX_QUEUE_LIMIT);
    if (o->max_queued_events > MAX_Q_EVENTS || o->max_queued_bytes > MAX_Q_BYTES)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "per-job output bound too large");
    return 0;
}

int srv_engine_new(core_model_t *model, const core_tokenizer_t *tok, const srv_engine_opts_t *opts,
                   srv_engine_t **out, char *err, size_t errlen)
{
    if (!model || !tok || !out)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "model, tokenizer and out are required");
    *out = NULL;
    srv_engine_opts_t o = {0};
    if (opts)
        o = *opts;
    int rc = resolve_opts(&o, err, errlen);
    if (rc < 0)
        return rc;
    const core_model_info_t *info = core_model_info(model);
    if (core_tokenizer_n_vocab(tok) > info->n_vocab)
        return fail(err, errlen, SRV_ENGINE_EINVAL,
                    "tokenizer has %d tokens, the model only %d logits",
                    (int)core_tokenizer_n_vocab(tok), info->n_vocab);
    srv_engine_t *E = calloc(1, sizeof *E);
    if (!E)
        return fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
    E->model = model;
    E->tok = tok;
    E->attn = core_model_attn(model);
    E->V = info->n_vocab;
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
    E->piece_cap = core_tok_stream_max_out(tok);
    E->piece = malloc(E->piece_cap);
    E->ws = core_sample_ws_new();
    E->gws = core_grammar_ws_new();
    E->gmask = malloc(CORE_GRAMMAR_MASK_WORDS(E->V) * sizeof *E->gmask);
    if (!E->running || !E->batch || !E->bjob || !E->bseq || !E->bfail || !E->piece || !E->ws ||
        !E->gws || !E->gmask) {
        rc = fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
        goto fail;
    }
    core_error_t ce = {0};
    if (core_grammar_vocab_from_tokenizer(tok, &E->gvocab, &ce) < 0) {
        rc = fail(err, errlen, SRV_ENGINE_ENOMEM, "grammar vocabulary: %s", ce.msg);
        goto fail;
    }
    register_metrics(E);
    if (pthread_create(&E->thread, NULL, sched_main, E) != 0) {
        rc = fail(err, errlen, SRV_ENGINE_ETHREAD, "cannot start the scheduler thread: %s",
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

/* ---- public: submit ---- */

static int check_tokens(const int32_t *t, size_t n, int64_t V, const char *what, char *err,
                        size_t errlen)
{
    for (size_t k = 0; k < n; k++) {
        if (t[k] < 0 || t[k] >= V)
            return fail(err, errlen, SRV_ENGINE_EINVAL, "%s token %zu is %d, outside [0,%lld)",
                        what, k, (int)t[k], (long long)V);
    }
    return 0;
}

static int validate(const srv_engine_t *E, const srv_job_spec_t *sp, char *err, size_t errlen)
{
    const srv_seq_ctx_t *c = sp->ctx;
    if (!c || !c->state)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: a context with a state is required");
    if (c->n_pending && !c->pending)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: n_pending without pending tokens");
    if (sp->n_prompt && !sp->prompt)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "prompt: n_prompt without tokens");
    if (sp->n_prompt > SRV_ENGINE_MAX_PROMPT || c->n_pending > SRV_ENGINE_MAX_PROMPT - sp->n_prompt)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "prompt: more than %zu tokens",
                    SRV_ENGINE_MAX_PROMPT);
    int rc;
    if ((rc = check_tokens(c->pending, c->n_pending, E->V, "pending", err, errlen)) < 0 ||
        (rc = check_tokens(sp->prompt, sp->n_prompt, E->V, "prompt", err, errlen)) < 0)
        return rc;
    if (sp->max_tokens < 0)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "max_tokens: %lld is negative",
                    (long long)sp->max_tokens);
    const int n = sp->n_choices ? sp->n_choices : 1;
    if (n < 1 || n > SRV_ENGINE_MAX_CHOICES || n > E->o.max_batch)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "n: %d outside 1..%d", sp->n_choices,
                    SRV_ENGINE_MAX_CHOICES < E->o.max_batch ? SRV_ENGINE_MAX_CHOICES
                                                            : E->o.max_batch);
    if (sp->deadline_ns < 0)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "deadline: negative");
    const size_t n_input = c->n_pending + sp->n_prompt;
    if ((sp->n_cached || sp->n_snap) &&
        (c->n_pending || core_attn_state_pos(c->state) != (int64_t)sp->n_cached))
        return fail(err, errlen, SRV_ENGINE_EINVAL,
                    "n_cached: the context must hold exactly the state after the first %zu "
                    "prompt tokens and nothing pending",
                    sp->n_cached);
    if (sp->n_cached > sp->n_prompt ||
        (sp->max_tokens > 0 && sp->n_prompt && sp->n_cached >= sp->n_prompt))
        return fail(err, errlen, SRV_ENGINE_EINVAL, "n_cached: %zu of %zu prompt tokens",
                    sp->n_cached, sp->n_prompt);
    if (sp->n_snap > SRV_ENGINE_MAX_SNAPS || (sp->n_snap && !sp->snap_at))
        return fail(err, errlen, SRV_ENGINE_EINVAL, "snap_at: at most %d positions",
                    SRV_ENGINE_MAX_SNAPS);
    for (size_t k = 0; k < sp->n_snap; k++) {
        size_t lo = k ? sp->snap_at[k - 1] : sp->n_cached;
        if (sp->snap_at[k] <= lo || sp->snap_at[k] > n_input)
            return fail(err, errlen, SRV_ENGINE_EINVAL,
                        "snap_at[%zu]: %zu not increasing within (%zu, %zu]", k, sp->snap_at[k],
                        sp->n_cached, n_input);
    }
    const size_t n_new = n_input - sp->n_cached;
    if (E->exact && (int64_t)n_new > E->max_ctx - core_attn_state_pos(c->state))
        return fail(err, errlen, SRV_ENGINE_ECONTEXT,
                    "%zu new tokens after %lld exceed the context of %lld tokens", n_new,
                    (long long)core_attn_state_pos(c->state), (long long)E->max_ctx);
    if (sp->max_tokens == 0) {
        if (n != 1)
            return fail(err, errlen, SRV_ENGINE_EINVAL, "n: must be 1 without generation");
        return 0;
    }
    if (!c->sampler)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: generation needs a sampler");
    if (n_input == 0)
        return fail(err, errlen, SRV_ENGINE_EINVAL,
                    "prompt: empty, and the context has no pending token to continue from");
    core_error_t ce = {0};
    if (core_sample_params_validate(&sp->params, &ce) < 0)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "%s", ce.msg);
    if (sp->n_stops > CORE_STOP_MAX)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "stop: more than %d strings", CORE_STOP_MAX);
    if (sp->n_stops && !sp->stops)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "stop: n_stops without strings");
    for (size_t k = 0; k < sp->n_stops; k++) {
        if (!sp->stops[k])
            return fail(err, errlen, SRV_ENGINE_EINVAL, "stop[%zu]: NULL", k);
    }
    core_stop_t *m = NULL;
    if (core_stop_new(sp->stops, NULL, sp->n_stops, &m, &ce) < 0)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "stop: %s", ce.msg);
    core_stop_free(m);
    return 0;
}

int srv_engine_submit(srv_engine_t *e, const srv_job_spec_t *spec, srv_job_t **out, char *err,
                      size_t errlen)
{
    if (!e || !spec || !out)
        return fail(err, errlen, SRV_ENGINE_EINVAL, "engine, spec and out are required");
    *out = NULL;
    int rc = validate(e, spec, err, errlen);
    srv_job_t *j = NULL;
    if (rc < 0)
        goto rejected;
    j = calloc(1, sizeof *j);
    if (!j) {
        rc = fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
        goto rejected;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    const srv_seq_ctx_t *c = spec->ctx;
    j->e = e;
    j->ctx = spec->ctx;
    j->n_prompt = spec->n_prompt;
    j->n_input = c->n_pending + spec->n_prompt;
    j->max_tokens = spec->max_tokens;
    j->n_choices = spec->n_choices ? spec->n_choices : 1;
    j->params = spec->params;
    j->grammar = spec->max_tokens > 0 ? spec->grammar : NULL;
    j->reseed = spec->reseed != 0;
    j->ignore_eos = spec->ignore_eos != 0;
    j->detok_flags = spec->detok_flags;
    j->deadline_ns = spec->deadline_ns;
    j->n_cached = spec->n_cached;
    j->absorbed = spec->n_cached;
    j->n_snap = spec->n_snap;
    if (spec->n_snap)
        memcpy(j->snap_at, spec->snap_at, spec->n_snap * sizeof *j->snap_at);
    j->notify = spec->notify;
    j->on_done = spec->on_done;
    j->ud = spec->ud;
    if (spec->req_id)
        snprintf(j->req_id, sizeof j->req_id, "%s", spec->req_id);
    j->input = malloc((j->n_input ? j->n_input : 1) * sizeof *j->input);
    j->seqs = calloc((size_t)j->n_choices, sizeof *j->seqs);
    j->done_ev = ev_new(SRV_EVENT_DONE, -1, NULL, 0);
    if (spec->max_tokens > 0 && spec->n_stops)
        j->stops = calloc(spec->n_stops, sizeof *j->stops);
    if (!j->input || !j->seqs || !j->done_ev ||
        (spec->max_tokens > 0 && spec->n_stops && !j->stops)) {
        rc = fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
        goto rejected;
    }
    for (int i = 0; i < j->n_choices; i++)
        j->seqs[i].unfed = -1;
    if (j->grammar && spec->grammar_start) {
        core_error_t ce = {0};
        if (spec->grammar_start->g != j->grammar ||
            core_grammar_state_copy(&j->seqs[0].gs, spec->grammar_start, &ce) < 0) {
            rc = fail(err, errlen, ce.code == CORE_ENOMEM ? SRV_ENGINE_ENOMEM : SRV_ENGINE_EINVAL,
                      "grammar_start: %s", ce.code ? ce.msg : "not a state of grammar");
            goto rejected;
        }
    }
    if (j->stops) {
        for (size_t k = 0; k < spec->n_stops; k++) {
            j->stops[k] = strdup(spec->stops[k]);
            if (!j->stops[k]) {
                rc = fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
                goto rejected;
            }
            j->n_stops = k + 1;
        }
    }
    if (c->n_pending)
        memcpy(j->input, c->pending, c->n_pending * sizeof *j->input);
    if (spec->n_prompt)
        memcpy(j->input + c->n_pending, spec->prompt, spec->n_prompt * sizeof *j->input);

    pthread_mutex_lock(&e->mu);
    if (e->draining) {
        rc = fail(err, errlen, SRV_ENGINE_ESTOPPED, "the engine is shutting down");
        srv_series_add(e->m.rej_stopped, 1);
    } else if (e->n_waiting >= e->o.max_queue) {
        rc = fail(err, errlen, SRV_ENGINE_EQUEUE_FULL, "%d jobs are already waiting",
                  e->o.max_queue);
        e->sub_queue_full++;
        srv_series_add(e->m.rej_full, 1);
    }
    if (rc < 0) {
        e->sub_rejected++;
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        return rc;
    }
    j->t_submit = srv_engine_now_ns();
    j->refs = 2;
    j->attached = 1;
    if (e->wait_tail)
        e->wait_tail->next = j;
    else
        e->wait_head = j;
    e->wait_tail = j;
    e->n_waiting++;
    e->sub_submitted++;
    srv_series_set(e->m.queue, (double)e->n_waiting);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = j;
    return 0;

rejected:
    pthread_mutex_lock(&e->mu);
    e->sub_rejected++;
    pthread_mutex_unlock(&e->mu);
    if (rc == SRV_ENGINE_EINVAL || rc == SRV_ENGINE_ECONTEXT)
        srv_series_add(e->m.rej_invalid, 1);
    job_free(j);
    return rc;
}

/* ---- public: jobs ---- */

void srv_engine_cancel(srv_job_t *job)
{
    if (!job)
        return;
    srv_engine_t *E = job->e;
    pthread_mutex_lock(&E->mu);
    if (!job->done) {
        job->cancelled = 1;
        pthread_cond_signal(&E->cv);
    }
    pthread_mutex_unlock(&E->mu);
}

int srv_job_pop(srv_job_t *job, srv_event_t **ev)
{
    srv_engine_t *E = job->e;
    *ev = NULL;
    pthread_mutex_lock(&E->mu);
    if (job->q_len == 0) {
        pthread_mutex_unlock(&E->mu);
        return 0;
    }
    const int was_over = over_bound(E, job);
    *ev = job->q[job->q_head];
    job->q_head = (job->q_head + 1) % job->q_cap;
    job->q_len--;
    job->q_bytes -= (*ev)->len;
    if (was_over && !over_bound(E, job))
        pthread_cond_signal(&E->cv); /* the job's sequences may run again */
    pthread_mutex_unlock(&E->mu);
    return 1;
}

int srv_job_wait(srv_job_t *job, int64_t timeout_ms)
{
    srv_engine_t *E = job->e;
    const int64_t until = timeout_ms < 0 ? 0 : srv_engine_now_ns() + timeout_ms * 1000000;
    pthread_mutex_lock(&E->mu);
    while (job->q_len == 0 && !job->done) {
        if (until && srv_engine_now_ns() >= until)
            break;
        timed_wait(&job->cv, &E->mu, until);
    }
    const int ready = job->q_len > 0 || job->done;
    pthread_mutex_unlock(&E->mu);
    return ready;
}

int srv_job_done(srv_job_t *job)
{
    srv_engine_t *E = job->e;
    pthread_mutex_lock(&E->mu);
    const int d = job->done;
    pthread_mutex_unlock(&E->mu);
    return d;
}

const srv_job_result_t *srv_job_result(srv_job_t *job)
{
    return srv_job_done(job) ? &job->res : NULL;
}

void srv_job_release(srv_job_t *job)
{
    if (!job)
        return;
    srv_engine_t *E = job->e;
    pthread_mutex_lock(&E->mu);
    job->attached = 0;
    q_clear(job);
    pthread_cond_signal(&E->cv); /* a paused job runs on, dropping its events */
    srv_job_t *dead = job_unref(job);
    pthread_mutex_unlock(&E->mu);
    job_free(dead);
}
