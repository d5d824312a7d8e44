/* server/engine/engine_jobs.c — the engine's job API, called from any thread
 * (usually the event loop): validation and submission of a job spec,
 * cancellation, popping and waiting for events, the result, and release.
 * Everything here works under the engine mutex or on a job not yet
 * submitted; the scheduler thread's side is server/engine/engine.c.
 */
#include "server/engine/engine.h"

#include "server/engine/engine_impl.h"
#include "server/engine/engine_test.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- public: submit ---- */

static int check_tokens(const int32_t *t, size_t n, int64_t V, const char *what, char *err,
                        size_t errlen)
{
    for (size_t k = 0; k < n; k++) {
        if (t[k] < 0 || t[k] >= V)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "%s token %zu is %d, outside [0,%lld)",
                        what, k, (int)t[k], (long long)V);
    }
    return 0;
}

static int validate(const srv_engine_t *E, const srv_job_spec_t *sp, char *err, size_t errlen)
{
    const srv_seq_ctx_t *c = sp->ctx;
    if (!c || !c->state)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: a context with a state is required");
    if (c->n_pending && !c->pending)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: n_pending without pending tokens");
    if (sp->n_prompt && !sp->prompt)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "prompt: n_prompt without tokens");
    if (sp->n_prompt > SRV_ENGINE_MAX_PROMPT || c->n_pending > SRV_ENGINE_MAX_PROMPT - sp->n_prompt)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "prompt: more than %zu tokens",
                    SRV_ENGINE_MAX_PROMPT);
    int rc;
    if ((rc = check_tokens(c->pending, c->n_pending, E->V, "pending", err, errlen)) < 0 ||
        (rc = check_tokens(sp->prompt, sp->n_prompt, E->V, "prompt", err, errlen)) < 0)
        return rc;
    if (sp->max_tokens < 0)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "max_tokens: %lld is negative",
                    (long long)sp->max_tokens);
    const int n = sp->n_choices ? sp->n_choices : 1;
    if (n < 1 || n > SRV_ENGINE_MAX_CHOICES || n > E->o.max_batch)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "n: %d outside 1..%d", sp->n_choices,
                    SRV_ENGINE_MAX_CHOICES < E->o.max_batch ? SRV_ENGINE_MAX_CHOICES
                                                            : E->o.max_batch);
    if (sp->deadline_ns < 0)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "deadline: negative");
    const size_t n_input = c->n_pending + sp->n_prompt;
    if ((sp->n_cached || sp->n_snap) &&
        (c->n_pending || core_attn_state_pos(c->state) != (int64_t)sp->n_cached))
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                    "n_cached: the context must hold exactly the state after the first %zu "
                    "prompt tokens and nothing pending",
                    sp->n_cached);
    if (sp->n_cached > sp->n_prompt ||
        (sp->max_tokens > 0 && sp->n_prompt && sp->n_cached >= sp->n_prompt))
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "n_cached: %zu of %zu prompt tokens",
                    sp->n_cached, sp->n_prompt);
    if (sp->n_snap > SRV_ENGINE_MAX_SNAPS || (sp->n_snap && !sp->snap_at))
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "snap_at: at most %d positions",
                    SRV_ENGINE_MAX_SNAPS);
    for (size_t k = 0; k < sp->n_snap; k++) {
        size_t lo = k ? sp->snap_at[k - 1] : sp->n_cached;
        if (sp->snap_at[k] <= lo || sp->snap_at[k] > n_input)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                        "snap_at[%zu]: %zu not increasing within (%zu, %zu]", k, sp->snap_at[k],
                        sp->n_cached, n_input);
    }
    /* the whole input, the cached prefix too: whether a request is taken
     * must not depend on what the cache holds at the moment */
    if (n_input > E->o.max_input)
        return eng_fail(err, errlen, SRV_ENGINE_ECONTEXT,
                        "the input is %zu tokens (%zu pending in the context, %zu new), over the "
                        "%zu one request may give the model to read (--max-prompt-tokens)",
                        n_input, c->n_pending, sp->n_prompt, E->o.max_input);
    const size_t n_new = n_input - sp->n_cached;
    if (E->exact && (int64_t)n_new > E->max_ctx - core_attn_state_pos(c->state))
        return eng_fail(err, errlen, SRV_ENGINE_ECONTEXT,
                    "%zu new tokens after %lld exceed the context of %lld tokens", n_new,
                    (long long)core_attn_state_pos(c->state), (long long)E->max_ctx);
    if (sp->pool != SRV_POOL_OFF) {
        if (sp->pool != SRV_POOL_MEAN && sp->pool != SRV_POOL_LAST && sp->pool != SRV_POOL_TOKENS)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "pool: %d is not a pooling",
                            (int)sp->pool);
        if (sp->max_tokens != 0 || n != 1 || !sp->embed_out || sp->n_prompt == 0)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                            "pool: an embedding job has an output, one choice, a prompt and "
                            "no generation");
        if (c->n_pending || sp->n_cached || sp->n_snap || core_attn_state_pos(c->state) != 0)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                            "pool: an embedding job needs a fresh context");
    }
    if (sp->max_tokens == 0) {
        if (n != 1)
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "n: must be 1 without generation");
        return 0;
    }
    if (!c->sampler)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "ctx: generation needs a sampler");
    if (n_input == 0)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL,
                    "prompt: empty, and the context has no pending token to continue from");
    core_error_t ce = {0};
    if (core_sample_params_validate(&sp->params, &ce) < 0)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "%s", ce.msg);
    if (sp->n_stops > CORE_STOP_MAX)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "stop: more than %d strings", CORE_STOP_MAX);
    if (sp->n_stops && !sp->stops)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "stop: n_stops without strings");
    for (size_t k = 0; k < sp->n_stops; k++) {
        if (!sp->stops[k])
            return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "stop[%zu]: NULL", k);
    }
    core_stop_t *m = NULL;
    if (core_stop_new(sp->stops, NULL, sp->n_stops, &m, &ce) < 0)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "stop: %s", ce.msg);
    core_stop_free(m);
    return 0;
}

int srv_engine_submit(srv_engine_t *e, const srv_job_spec_t *spec, srv_job_t **out, char *err,
                      size_t errlen)
{
    if (!e || !spec || !out)
        return eng_fail(err, errlen, SRV_ENGINE_EINVAL, "engine, spec and out are required");
    *out = NULL;
    int rc = validate(e, spec, err, errlen);
    srv_job_t *j = NULL;
    if (rc < 0)
        goto rejected;
    j = calloc(1, sizeof *j);
    if (!j) {
        rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
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
    j->pool = spec->pool;
    j->embed_out = spec->embed_out;
    if (j->pool == SRV_POOL_MEAN || j->pool == SRV_POOL_LAST) {
        const size_t D = (size_t)e->D;
        j->ehid = malloc((size_t)e->o.prefill_chunk * D * sizeof *j->ehid);
        j->esum = calloc(D, sizeof *j->esum);
        if (!j->ehid || !j->esum) {
            rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
            goto rejected;
        }
    }
    j->notify = spec->notify;
    j->on_done = spec->on_done;
    j->ud = spec->ud;
    if (spec->req_id)
        snprintf(j->req_id, sizeof j->req_id, "%s", spec->req_id);
    j->input = malloc((j->n_input ? j->n_input : 1) * sizeof *j->input);
    j->seqs = calloc((size_t)j->n_choices, sizeof *j->seqs);
    j->done_ev = eng_ev_new(SRV_EVENT_DONE, -1, NULL, 0);
    if (spec->max_tokens > 0 && spec->n_stops)
        j->stops = calloc(spec->n_stops, sizeof *j->stops);
    if (!j->input || !j->seqs || !j->done_ev ||
        (spec->max_tokens > 0 && spec->n_stops && !j->stops)) {
        rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
        goto rejected;
    }
    for (int i = 0; i < j->n_choices; i++)
        j->seqs[i].unfed = -1;
    if (j->grammar && spec->grammar_start) {
        core_error_t ce = {0};
        if (spec->grammar_start->g != j->grammar ||
            core_grammar_state_copy(&j->seqs[0].gs, spec->grammar_start, &ce) < 0) {
            rc = eng_fail(err, errlen, ce.code == CORE_ENOMEM ? SRV_ENGINE_ENOMEM : SRV_ENGINE_EINVAL,
                      "grammar_start: %s", ce.code ? ce.msg : "not a state of grammar");
            goto rejected;
        }
    }
    if (j->stops) {
        for (size_t k = 0; k < spec->n_stops; k++) {
            j->stops[k] = strdup(spec->stops[k]);
            if (!j->stops[k]) {
                rc = eng_fail(err, errlen, SRV_ENGINE_ENOMEM, "out of memory");
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
        rc = eng_fail(err, errlen, SRV_ENGINE_ESTOPPED, "the engine is shutting down");
        srv_series_add(e->m.rej_stopped, 1);
    } else if (e->n_waiting >= e->o.max_queue) {
        rc = eng_fail(err, errlen, SRV_ENGINE_EQUEUE_FULL, "%d jobs are already waiting",
                  e->o.max_queue);
        e->sub_queue_full++;
        srv_series_add(e->m.rej_full, 1);
    }
    if (rc < 0) {
        e->sub_rejected++;
        pthread_mutex_unlock(&e->mu);
        eng_job_free(j);
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
    eng_job_free(j);
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
    const int was_over = eng_over_bound(E, job);
    *ev = job->q[job->q_head];
    job->q_head = (job->q_head + 1) % job->q_cap;
    job->q_len--;
    job->q_bytes -= (*ev)->len;
    if (was_over && !eng_over_bound(E, job))
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
        eng_timed_wait(&job->cv, &E->mu, until);
    }
    const int ready = job->q_len > 0 || job->done;
    pthread_mutex_unlock(&E->mu);
    return ready;
}

/* 1 once DONE was queued (the context is back with its owner). */
static int srv_job_done(srv_job_t *job)
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
    eng_q_clear(job);
    pthread_cond_signal(&E->cv); /* a paused job runs on, dropping its events */
    srv_job_t *dead = eng_job_unref(job);
    pthread_mutex_unlock(&E->mu);
    eng_job_free(dead);
}
