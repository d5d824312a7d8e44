/* server/engine/engine.h — the scheduler: continuous batching of sequence jobs over
 * one model, on one thread.
 *
 * The engine knows models, tokenizers and samplers; it knows nothing of HTTP,
 * JSON or session stores. Handlers submit *jobs* from any thread and read
 * their output as a queue of events; one scheduler thread runs every forward.
 *
 * ## Objects and ownership
 *   srv_engine_t   created by srv_engine_new; borrows the model and tokenizer
 *                  (both must outlive it) and owns the scheduler thread, the
 *                  sampling workspace and every job's internal memory.
 *   srv_seq_ctx_t  one conversation's compute context: attention state,
 *                  sampler, pending tokens. Owned by its owner (the session
 *                  store, or a handler for a one-shot request); *borrowed by
 *                  the engine from a successful submit until the job's DONE
 *                  event*. In between, the owner must not touch it (one job
 *                  per context at a time: the session layer answers 409).
 *   srv_job_t      one submitted request. Reference counted: submit returns
 *                  the caller's reference (release it with srv_job_release),
 *                  the engine holds its own until the job is done.
 *   srv_event_t    one output event, popped by the consumer, who owns it
 *                  (srv_event_free).
 *
 * ## What a job does
 * input = ctx->pending ++ prompt. The engine feeds the input through the model
 * in chunks (prefill); then, when max_tokens > 0, it forks the context into
 * n_choices sequences (choice 0 keeps ctx->state and ctx->sampler, choices
 * 1..n-1 run on private copies) and decodes them, one token per step each,
 * until each one ends: end-of-generation token ("stop", unless ignore_eos),
 * a stop string ("stop"), max_tokens ("length"; also when an exact-attention
 * cache is full), cancellation ("cancelled"), the job's deadline ("timeout")
 * or an error ("error").
 *
 * ## Grammars
 * With spec.grammar every choice samples under the grammar: each keeps its
 * own grammar state (choice i > 0 starts from a copy of choice 0's, made
 * with the fork), each step masks the tokens that cannot continue it
 * (core_grammar_mask, core_sampler_sample_masked) and advances it by the
 * sampled token; end-of-generation tokens are allowed only where the text is
 * complete. A grammar the sequence cannot follow (its bounds, or no allowed
 * token with a finite logit) ends the choice with "error". The grammar
 * state is not part of the context: it lives as long as the job, and starts
 * at the grammar's start, or at spec.grammar_start (the owner's record of a
 * reply that stopped before the grammar was complete, see
 * server/store/store.h srv_session_pending_grammar).
 *
 * ## Session semantics (the pending rule)
 * The session's history is the token sequence
 *     (tokens absorbed by ctx->state) ++ ctx->pending.
 * Submit appends the prompt to it; every token choice 0 samples is appended
 * to it, except an end-of-generation token that ended the turn (a template's
 * continuation closes the turn: core_chat_render_continue, open = 1). The
 * last sampled token has not been fed through the model yet (its logits were
 * never needed), so after the job it is ctx->pending[0]; the next job absorbs
 * it first. Hence, for greedy decoding, "continue with new text" gives the
 * same tokens as "a fresh context fed the full history" (tested). A job that
 * is cancelled / times out / fails during prefill leaves the unabsorbed rest
 * of its input in ctx->pending, so the rule holds in every case; an owner
 * that wants a cancelled request to leave no trace snapshots the context
 * before submitting and restores it. After a stop-string match the history
 * holds every sampled token, including the text past the match.
 * The sampler's penalty history follows the same history: the prompt is
 * accepted into it when the job starts (core_sampler_accept), sampled tokens
 * when sampled. Tokens in ctx->pending are already in the sampler history.
 * Choices 1..n-1 are discarded when the job ends: the session continues
 * choice 0.
 *
 * ## Seeds
 * The request's sampling parameters are installed into ctx->sampler when the
 * job starts (core_sampler_set_params). With reseed = 1, choice i's RNG is
 * restarted from params.seed + i (so choice i equals a one-choice job with
 * seed params.seed + i). With reseed = 0, choice 0 continues the context's RNG
 * stream and choices i > 0 get seeds from the engine's own generator.
 *
 * ## Cached prefixes and snapshots (the prefix-state cache, server/store/prefix_cache.h)
 * spec.n_cached = P > 0 says ctx->state already holds the state after
 * prompt[0..P) (a copy from the cache, taken by the owner before submit):
 * the context then has no pending tokens and its state's position is P.
 * The job feeds only prompt[P..n_prompt); the sampler history still gets
 * the whole prompt, and prompt_tokens counts it, so the job is the same as
 * one that fed every token. A job that generates needs P < n_prompt (the
 * logits of the last prompt token).
 * spec.snap_at[k] asks for a copy of the state after input[0..snap_at[k])
 * (input = pending ++ prompt): the prefill splits its chunk at that
 * position (one shorter row count in that step; the batch is unchanged),
 * copies the state, and goes on. Only for a context whose state is a
 * function of the prompt alone (no pending tokens, position n_cached).
 * Once the prefill is over, srv_job_take_snapshot hands each copy to the caller; a
 * position the job never reached (cancelled, failed) gives NULL.
 *
 * ## Events, per job
 *   SRV_EVENT_TOKEN  one sampled token of one choice: id, logprob, the top
 *                    alternatives, and the text that became safe to emit
 *                    (UTF-8 complete, not part of a possible stop string; may
 *                    be empty). When the choice ends at this token, finish is
 *                    set and text includes the flushed tail.
 *   SRV_EVENT_END    a choice ended without a token (cancelled, timeout,
 *                    error, shutdown); text is the held-back tail.
 *   SRV_EVENT_DONE   the job is over (always last, exactly once): the context
 *                    is back in the owner's hands; srv_job_result() is valid.
 * So every choice's last event has finish != SRV_FINISH_NONE, then DONE
 * follows. An ingest-only job (max_tokens 0) has only DONE.
 *
 * ## Embeddings
 * An ingest-only job with spec.pool set also hands back the final hidden
 * states of its input (core_batch_seq_t.hidden: after the final norm) into
 * spec.embed_out, pooled as it goes: the mean of every token's, the last
 * token's, or every token's row. The input is fed in prefill chunks through
 * the context's state like any prompt, and a chunk's rows are folded into
 * the pool before the next one runs, so what a mean or last pool holds
 * beside the state is [D] whatever the input's length (with a linear
 * attention kind the state too is of constant size). The context must be
 * fresh (position 0, nothing pending, no cached prefix, no snapshots): the
 * pool is over the input alone. embed_out is complete when the job's choice
 * finished "length"; after any other finish its contents are unspecified.
 *
 * ## Threads and callbacks
 * spec.notify(ud) runs on the scheduler thread, without engine locks, after
 * a step queued events for the job (at most once per step), and after DONE.
 * spec.on_done(job, ud) runs once on the scheduler thread after DONE was
 * queued and notify ran; nothing of the job's calls back after it returns.
 * Both run for every accepted job, also after srv_job_release, so ud must
 * stay valid until on_done has run. They must not block (a blocking callback
 * stalls every sequence: persist state on another thread, e.g. the loop
 * thread seeing DONE) and may call only srv_job_pop, srv_job_result,
 * srv_job_release and srv_engine_cancel (never stop/free).
 * uv_async_send is the intended body of notify. During srv_engine_stop the
 * callbacks run while the stopping thread waits in the join, so they must
 * not wait for that thread either.
 *
 * ## Back-pressure
 * A job's queue is bounded (opts.max_queued_events / max_queued_bytes). While
 * it is over the bound, the job's decoding sequences sit out the steps (the
 * rest of the batch runs on); popping below the bound wakes them. Cancel and
 * deadline still apply to a paused job; the final events are queued over the
 * bound. A released job's events are dropped, so it never pauses.
 *
 * ## Shutdown
 *   srv_engine_drain(e)              any thread, non-blocking: submit now fails
 *                                    with SRV_ENGINE_ESTOPPED; jobs continue.
 *   srv_engine_stop(e, deadline_ns)  drains, lets the accepted jobs (running
 *                                    and waiting) run until the deadline,
 *                                    then cancels the rest ("cancelled"),
 *                                    and joins the thread. Blocks; every
 *                                    on_done has run when it returns.
 *   srv_engine_free(e)               stop(now) if needed, then frees. Every
 *                                    job reference must have been released.
 * Times are CLOCK_MONOTONIC nanoseconds (srv_engine_now_ns()).
 */
#ifndef DARKSERVE_SERVER_ENGINE_H
#define DARKSERVE_SERVER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn/attn.h"
#include "core/text/grammar.h"
#include "core/model.h"
#include "core/sample.h"
#include "core/text/tokenizer.h"
#include "server/base/metrics.h"

/* X(name, value, description) */
#define SRV_ENGINE_ERRNO_MAP(X)                                                                    \
    X(SRV_ENGINE_EINVAL, -301, "invalid argument")                                                 \
    X(SRV_ENGINE_ENOMEM, -302, "out of memory")                                                    \
    X(SRV_ENGINE_EQUEUE_FULL, -303, "queue full")                                                  \
    X(SRV_ENGINE_ESTOPPED, -304, "engine is stopping")                                             \
    X(SRV_ENGINE_ECONTEXT, -305, "context length exceeded")                                        \
    X(SRV_ENGINE_ETHREAD, -306, "cannot start the scheduler thread")

enum srv_engine_errno {
#define SRV_ENGINE_ERR_ENUM_(name, val, desc) name = val,
    SRV_ENGINE_ERRNO_MAP(SRV_ENGINE_ERR_ENUM_)
#undef SRV_ENGINE_ERR_ENUM_
};

/* Static description of a code; never NULL. */
const char *srv_engine_strerror(int code);

/* Hard limits (bounds on options and job specs). */
#define SRV_ENGINE_MAX_BATCH 256                /* sequences per step */
#define SRV_ENGINE_MAX_STEP_TOKENS CORE_MODEL_MAX_ROWS /* rows per forward */
#define SRV_ENGINE_DEFAULT_STEP_TOKENS 2048     /* rows per forward when opts leave it 0 */
#define SRV_ENGINE_MAX_QUEUE (1 << 20)          /* jobs waiting */
#define SRV_ENGINE_MAX_CHOICES 16               /* n per job */
#define SRV_ENGINE_MAX_PROMPT ((size_t)1 << 24) /* tokens of one job's input */
#define SRV_ENGINE_MAX_SNAPS 8                  /* state snapshots of one job */

typedef enum srv_finish {
    SRV_FINISH_NONE = 0,
    SRV_FINISH_STOP = 1,      /* end-of-generation token or stop string */
    SRV_FINISH_LENGTH = 2,    /* max_tokens (also: ingest-only job complete) */
    SRV_FINISH_CANCELLED = 3, /* srv_engine_cancel or shutdown deadline */
    SRV_FINISH_TIMEOUT = 4,   /* the job's deadline passed */
    SRV_FINISH_ERROR = 5,     /* see srv_job_result()->error */
    SRV_FINISH_COUNT_ = 6
} srv_finish_t;

/* "stop", "length", "cancelled", "timeout", "error"; NULL for NONE. */
const char *srv_finish_name(srv_finish_t f);

typedef struct srv_engine srv_engine_t;
typedef struct srv_job srv_job_t;

typedef struct srv_engine_opts {
    int max_batch;            /* sequences per step (running at once); 0 = 8 */
    int prefill_chunk;        /* prompt tokens one sequence feeds per step; 0 = 256 */
    int max_step_tokens;      /* rows per forward, >= max_batch; 0 = SRV_ENGINE_DEFAULT_STEP_TOKENS */
    int max_queue;            /* jobs accepted but not yet running; 0 = 64 */
    size_t max_queued_events; /* per-job output bound (back-pressure); 0 = 1024 */
    size_t max_queued_bytes;  /* per-job output bound in text bytes; 0 = 256 KiB */
    size_t max_input;         /* tokens one job may give the model to read (pending + prompt,
                                 cached prefix included); more is refused at submit with
                                 SRV_ENGINE_ECONTEXT; 0 = SRV_ENGINE_MAX_PROMPT */
    uint64_t seed;            /* engine seed generator for unseeded choices; 0 = from time */
    srv_metrics_t *metrics;   /* borrowed, may be NULL; must outlive the engine.
                                 The engine registers darkserve_engine_* metrics. */
} srv_engine_opts_t;

/* One conversation's compute context (see "Session semantics"). A plain
 * struct: the owner fills state and sampler and keeps pending consistent. */
typedef struct srv_seq_ctx {
    core_attn_state_t *state; /* owned by the ctx's owner; from core_model_attn(model) */
    core_sampler_t *sampler;  /* owned by the ctx's owner; may be NULL for ingest-only jobs */
    int32_t *pending;         /* [n_pending], malloc'd, owned by the ctx (free with
                                 srv_seq_ctx_clear_pending); NULL when n_pending == 0.
                                 Tokens of the history the state has not absorbed. */
    size_t n_pending;
} srv_seq_ctx_t;

/* Frees ctx->pending and zeroes the count (state and sampler untouched).
 * NULL is a no-op. */
void srv_seq_ctx_clear_pending(srv_seq_ctx_t *ctx);
/* Replaces ctx->pending with a copy of toks[n] (borrowed). 0 or
 * SRV_ENGINE_ENOMEM / SRV_ENGINE_EINVAL (ctx unchanged). For restoring a
 * serialized session. */
int srv_seq_ctx_set_pending(srv_seq_ctx_t *ctx, const int32_t *toks, size_t n);

/* How an embedding job pools its tokens' hidden states (see "Embeddings"). */
typedef enum srv_pool {
    SRV_POOL_OFF = 0,   /* not an embedding job */
    SRV_POOL_MEAN = 1,  /* embed_out [D]: the mean over the input's tokens */
    SRV_POOL_LAST = 2,  /* embed_out [D]: the last token's */
    SRV_POOL_TOKENS = 3 /* embed_out [n_prompt][D]: every token's */
} srv_pool_t;

typedef struct srv_job_spec {
    srv_seq_ctx_t *ctx;    /* borrowed from submit until DONE (see header) */
    const int32_t *prompt; /* [n_prompt], copied by submit; may be NULL if 0 */
    size_t n_prompt;
    int64_t max_tokens;          /* completion tokens per choice; 0 = ingest only */
    int n_choices;               /* 1..SRV_ENGINE_MAX_CHOICES and <= max_batch; 0 = 1;
                                    must be 1 for ingest-only */
    core_sample_params_t params; /* validated by submit; n_logprobs alternatives
                                    are reported per token */
    const core_grammar_t *grammar; /* NULL, or every choice follows it (see "Grammars");
                                      compiled against srv_engine_grammar_vocab(e);
                                      borrowed until on_done has run */
    const core_grammar_state_t *grammar_start; /* NULL: choice 0 starts at the grammar's
                                      start; else at a copy of this state of grammar (a
                                      reply that continues text already under it);
                                      borrowed for the submit call */
    int reseed;                  /* 1: choice i seeded params.seed + i; 0: see "Seeds" */
    int ignore_eos;              /* 1: end-of-generation tokens do not end a choice */
    const char *const *stops;    /* [n_stops] stop strings (NUL-terminated, copied) */
    size_t n_stops;              /* <= CORE_STOP_MAX */
    unsigned detok_flags;        /* CORE_TOK_DECODE_* for event text (0: control
                                    tokens render as nothing) */
    int64_t deadline_ns;         /* absolute srv_engine_now_ns() time; 0 = none */
    const char *req_id;          /* copied, for log lines; may be NULL */
    size_t n_cached;             /* prompt tokens ctx->state already absorbed (see
                                    "Cached prefixes"); 0 = none */
    const size_t *snap_at;       /* [n_snap] strictly increasing, each in
                                    (n_cached, n_input]; copied by submit */
    size_t n_snap;               /* <= SRV_ENGINE_MAX_SNAPS */
    srv_pool_t pool;             /* SRV_POOL_OFF, or an embedding job (see "Embeddings"):
                                    max_tokens 0, a fresh context, n_prompt >= 1 */
    float *embed_out;            /* with pool: caller-owned [D] (MEAN, LAST) or
                                    [n_prompt][D] (TOKENS); written by the scheduler,
                                    borrowed until DONE */
    void (*notify)(void *ud);    /* may be NULL; see "Threads and callbacks" */
    void (*on_done)(srv_job_t *job, void *ud); /* may be NULL */
    void *ud;                                  /* borrowed until on_done has run */
} srv_job_spec_t;

/* Fills spec with defaults: n_choices 1, default sample params
 * (core_sample_params_default), everything else zero/NULL. */
void srv_job_spec_init(srv_job_spec_t *spec);

typedef enum srv_event_kind {
    SRV_EVENT_TOKEN = 1,
    SRV_EVENT_END = 2,
    SRV_EVENT_DONE = 3
} srv_event_kind_t;

typedef struct srv_event {
    srv_event_kind_t kind;
    int choice;    /* TOKEN, END: 0..n_choices-1; DONE: -1 */
    int32_t token; /* TOKEN: the sampled id; else -1 */
    float logprob; /* TOKEN: its log-probability (core/sample.h) */
    int32_t n_top; /* TOKEN: alternatives in top[] (= params.n_logprobs) */
    core_sample_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS];
    srv_finish_t finish;  /* set on the choice's last event; DONE: NONE */
    int64_t n_completion; /* TOKEN, END: completion tokens of this choice so far */
    uint64_t step;        /* the engine's step counter when it was produced
                             (diagnostics: which forward a token came from) */
    size_t len;           /* bytes of text */
    char text[];          /* [len] UTF-8, NUL-terminated (owned by the event) */
} srv_event_t;

void srv_event_free(srv_event_t *ev); /* NULL is a no-op */

typedef struct srv_job_result {
    int n_choices;
    srv_finish_t finish[SRV_ENGINE_MAX_CHOICES];
    int64_t completion_tokens[SRV_ENGINE_MAX_CHOICES];
    int64_t completion_total; /* sum over choices */
    int64_t prompt_tokens;    /* spec.n_prompt */
    int64_t input_tokens;     /* n_pending at start + n_prompt */
    int64_t absorbed_tokens;  /* of the input, fed through the model (not the cached) */
    int64_t cached_tokens;    /* spec.n_cached: prompt tokens taken from a cached state */
    int64_t state_pos;        /* core_attn_state_pos(ctx->state) at the end */
    size_t n_pending;         /* ctx->n_pending at the end */
    /* timings, seconds; -1 where it does not apply */
    double queue_s;     /* submit -> first scheduled */
    double ttft_s;      /* submit -> first token sampled */
    double prefill_s;   /* first scheduled -> input absorbed */
    double decode_s;    /* first token -> last token */
    double total_s;     /* submit -> done */
    double prefill_tps; /* absorbed_tokens / prefill_s */
    double decode_tps;  /* tokens after each choice's first / decode_s */
    uint64_t end_step;  /* the engine's step counter when the job ended */
    char error[256];    /* the first error's message, "" if none */
    int grammar_bound;  /* 1: that first error is a bound the request's grammar met while
                           generating (CORE_ERANGE from a mask or an accept: too ambiguous,
                           too deep, too complex for the vocabulary), a fault of the
                           request rather than of the server */
} srv_job_result_t;

/* ---- engine ---- */

/* Monotonic clock in nanoseconds (for deadlines). */
int64_t srv_engine_now_ns(void);

/* Starts an engine on model and tok (borrowed; must outlive the engine).
 * opts may be NULL (defaults). Returns 0 and *out (owned by the caller), or a
 * negative SRV_ENGINE_E* code with a message in err[errlen] (err may be NULL). */
int srv_engine_new(core_model_t *model, const core_tokenizer_t *tok, const srv_engine_opts_t *opts,
                   srv_engine_t **out, char *err, size_t errlen);

/* The vocabulary grammars for this engine's model are compiled against
 * (built once, with the engine; immutable, any thread). */
const core_grammar_vocab_t *srv_engine_grammar_vocab(const srv_engine_t *e);

/* Any thread. Validates spec, copies what it needs and queues the job.
 * Returns 0 and *out (the caller's reference), or a negative code with a
 * message in err[errlen] (err may be NULL), and then nothing was queued, no
 * callback will run and spec->ctx is untouched:
 *   SRV_ENGINE_EINVAL       bad spec (the message names the field), or
 *                           nothing to sample from (max_tokens > 0 with no
 *                           prompt and nothing pending)
 *   SRV_ENGINE_ECONTEXT     the input (pending + prompt) is over opts.max_input, or
 *                           exact attention: the input does not fit the cache
 *   SRV_ENGINE_EQUEUE_FULL  max_queue jobs are waiting (HTTP 429)
 *   SRV_ENGINE_ESTOPPED     draining or stopped (HTTP 503)
 *   SRV_ENGINE_ENOMEM */
int srv_engine_submit(srv_engine_t *e, const srv_job_spec_t *spec, srv_job_t **out, char *err,
                      size_t errlen);

/* Any thread. Marks the job cancelled; the scheduler ends it before its next
 * forward (a forward already running completes). No-op on a finished job.
 * Choices end with "cancelled". */
void srv_engine_cancel(srv_job_t *job);

/* Any thread, non-blocking: stop accepting jobs (see "Shutdown"). */
void srv_engine_drain(srv_engine_t *e);
/* Blocking; see "Shutdown". Not from the scheduler thread (a callback). */
void srv_engine_stop(srv_engine_t *e, int64_t deadline_ns);
/* NULL is a no-op. */
void srv_engine_free(srv_engine_t *e);

/* ---- jobs (any thread) ---- */

/* Pops the oldest event: returns 1 and *ev (owned by the caller), or 0 when
 * the queue is empty. Never blocks. */
int srv_job_pop(srv_job_t *job, srv_event_t **ev);
/* The job's result; NULL before DONE (non-NULL once DONE was queued: the
 * context is back with its owner). Borrowed from the job (valid until the
 * caller's reference is released). */
const srv_job_result_t *srv_job_result(srv_job_t *job);
/* Once the job's prefill is over (srv_job_snapshots_ready) or it is DONE:
 * the state copy of spec.snap_at[k] (owned by the caller from now on; a
 * second call gives NULL), or NULL when the job did not reach that position
 * or the copy failed, and NULL before. Any thread. */
core_attn_state_t *srv_job_take_snapshot(srv_job_t *job, size_t k);
/* 1 once every snapshot the job will take is taken (its prompt is absorbed,
 * or the job is over), so they can go to the cache while it decodes. */
int srv_job_snapshots_ready(srv_job_t *job);
/* Drops the caller's reference. Events not yet popped are freed and later
 * ones dropped; the job itself runs on unless cancelled. NULL is a no-op. */
void srv_job_release(srv_job_t *job);

/* ---- statistics ---- */

typedef struct srv_engine_stats {
    uint64_t steps;                                /* forwards run */
    uint64_t steps_mixed;                          /* steps with both prefill and decode rows */
    uint64_t rows;                                 /* rows (tokens) over all forwards */
    uint64_t batch_hist[SRV_ENGINE_MAX_BATCH + 1]; /* steps by sequences in them */
    int max_batch_seen;                            /* largest number of sequences in one step */
    uint64_t prompt_tokens;                        /* input tokens absorbed */
    uint64_t generated_tokens;                     /* tokens sampled */
    uint64_t jobs_submitted;                       /* accepted by submit */
    uint64_t jobs_rejected;                        /* refused by submit (any reason) */
    uint64_t jobs_queue_full;                      /* refused with SRV_ENGINE_EQUEUE_FULL */
    uint64_t choices_finished[SRV_FINISH_COUNT_];  /* by finish reason */
    uint64_t jobs_done;
    uint64_t forward_errors; /* batched forwards that failed (then retried alone) */
    int64_t queue_depth;     /* jobs waiting now */
    int64_t running_jobs;    /* jobs admitted, not done */
    int64_t running_seqs;    /* sequence slots in use */
    uint64_t ttft_count;     /* jobs that produced a first token */
    double ttft_sum_s;
    uint64_t itl_count; /* inter-token intervals observed */
    double itl_sum_s;
} srv_engine_stats_t;

/* Any thread: a consistent copy of the counters (taken under the lock). */
void srv_engine_stats(srv_engine_t *e, srv_engine_stats_t *out);

#endif
