/* server/engine/engine_impl.h — what server/engine/engine.c (the scheduler thread) and
 * server/engine/engine_jobs.c (the any-thread job API) share: the engine's and a
 * job's structures, and the queue and error helpers both sides call. The
 * locking rules are engine.c's (its top comment). Private to the engine.
 */
#ifndef DARKSERVE_SERVER_ENGINE_IMPL_H
#define DARKSERVE_SERVER_ENGINE_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "server/engine/engine.h"
#include "server/base/metrics.h"

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
    int snaps_ready; /* the prefill is over: snaps are the loop's to take (under mu) */
    core_attn_state_t *snaps[SRV_ENGINE_MAX_SNAPS]; /* [n_snap] the copies (scheduler
                                                  thread until snaps_ready, then the taker) */
    size_t n_snap, next_snap;
    srv_pool_t pool;  /* embedding job: how its hidden states are pooled */
    float *embed_out; /* borrowed from the spec until DONE */
    float *ehid;      /* owned [prefill chunk][D]: a chunk's hidden rows (MEAN, LAST) */
    double *esum;     /* owned [D]: the sum of the rows so far (MEAN) */
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
    int64_t D; /* the model's width (embedding rows) */
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
    /* decode entries sampled together on the model's threads (sample_batch):
     * whether entry b was, its result and its error */
    int *bsampled;               /* [max_batch] */
    core_sample_result_t *bres;  /* [max_batch] */
    int *brc;                    /* [max_batch] */
    core_error_t *berr;          /* [max_batch] */
    core_sample_ws_t **wss;      /* [model threads]: one workspace per sampling thread */
    int n_wss;
    char *piece;             /* [piece_cap] detokenizer output */
    size_t piece_cap;
    char *txt; /* growable text of the event being built */
    size_t txt_len, txt_cap;
    int txt_oom;
    srv_job_t *touched;
    eng_metrics_t m;
};

/* Writes the message into err (errlen bytes, may be NULL) and returns code. */
int eng_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A new event of len bytes of text (NULL when out of memory). */
srv_event_t *eng_ev_new(srv_event_kind_t kind, int choice, const char *text, size_t len);

/* Under mu: */
/* Whether j's queue is past the engine's bounds (an attached job pauses). */
int eng_over_bound(const srv_engine_t *E, const srv_job_t *j);
/* Frees every queued event of j. */
void eng_q_clear(srv_job_t *j);
/* Drops one reference; returns the job when it must be freed (outside the
 * lock, eng_job_free). */
srv_job_t *eng_job_unref(srv_job_t *j);

/* Frees j and all it owns (no lock: its last reference is gone). */
void eng_job_free(srv_job_t *j);
/* pthread_cond_wait, or until the CLOCK_MONOTONIC time until_ns (> 0). */
void eng_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ns);

#endif
