/* test_srv_engine.c — the scheduler (server/engine/engine.c) on the tiny model (env
 * DARKSERVE_TINY_MODEL).
 *
 * Every expected token sequence comes from the engine running the same
 * request alone (max_batch effects, forks and continuations are checked
 * against that simplest run), or from the tokenizer (stop strings). Tests
 * that need a job to stay unfinished make it deterministic with
 * back-pressure (a consumer that does not pop pauses the job) or with
 * srv_engine_hold (several jobs start in the same step), never with sleeps;
 * every wait is bounded by WAIT_MS.
 */
#include "server/engine/engine.h"
#include "server/engine/engine_test.h"
#include "server/base/log.h"
#include "server/base/metrics.h"
#include "tests/unit/check.h"

#include "core/rng.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_MS 30000
#define MAXC 4   /* choices a test job has at most */
#define MAXT 512 /* tokens per choice kept */
#define TEXTMAX 8192

static core_model_t *tiny;     /* exact attention, max_ctx 512 */
static core_model_t *tiny_lin; /* Performer attention: no context limit */
static core_tokenizer_t *tok;
static int V;

/* ------------------------------------------------------------- helpers */

typedef struct out {
    int32_t tok[MAXC][MAXT];
    uint64_t step[MAXC][MAXT];
    int n[MAXC];
    char text[MAXC][TEXTMAX];
    size_t tlen[MAXC];
    srv_finish_t finish[MAXC];
    int ends[MAXC]; /* events with finish set, per choice */
    int after_end;  /* events of a choice after its end (must stay 0) */
    int n_events;
    int done;       /* DONE seen */
    int after_done; /* events after DONE (must stay 0) */
    srv_job_result_t res;
} out_t;

static out_t *out_new(void)
{
    return calloc(1, sizeof(out_t));
}

static void out_take(out_t *o, const srv_event_t *ev)
{
    o->n_events++;
    if (o->done) {
        o->after_done++;
        return;
    }
    if (ev->kind == SRV_EVENT_DONE) {
        o->done = 1;
        return;
    }
    const int c = ev->choice;
    if (c < 0 || c >= MAXC)
        return;
    if (o->ends[c])
        o->after_end++;
    if (ev->kind == SRV_EVENT_TOKEN && o->n[c] < MAXT) {
        o->tok[c][o->n[c]] = ev->token;
        o->step[c][o->n[c]] = ev->step;
        o->n[c]++;
    }
    if (o->tlen[c] + ev->len < TEXTMAX) {
        memcpy(o->text[c] + o->tlen[c], ev->text, ev->len);
        o->tlen[c] += ev->len;
        o->text[c][o->tlen[c]] = '\0';
    }
    if (ev->finish != SRV_FINISH_NONE) {
        o->finish[c] = ev->finish;
        o->ends[c]++;
    }
}

/* Pops what is there; 1 once DONE was seen. */
static int out_drain(srv_job_t *j, out_t *o)
{
    srv_event_t *ev;
    while (srv_job_pop(j, &ev)) {
        out_take(o, ev);
        srv_event_free(ev);
    }
    return o->done;
}

/* Pops until DONE (bounded); copies the result. 1 on success. */
static int collect(srv_job_t *j, out_t *o)
{
    const int64_t until = srv_engine_now_ns() + (int64_t)WAIT_MS * 1000000;
    while (!out_drain(j, o)) {
        int64_t left = (until - srv_engine_now_ns()) / 1000000;
        if (left <= 0)
            return 0;
        srv_job_wait(j, left);
    }
    const srv_job_result_t *r = srv_job_result(j);
    if (!r)
        return 0;
    o->res = *r;
    return 1;
}

/* Pops until n TOKEN events of choice 0 arrived (bounded). */
static int collect_tokens(srv_job_t *j, out_t *o, int n)
{
    const int64_t until = srv_engine_now_ns() + (int64_t)WAIT_MS * 1000000;
    while (o->n[0] < n && !o->done) {
        srv_event_t *ev;
        if (srv_job_pop(j, &ev)) {
            out_take(o, ev);
            srv_event_free(ev);
            continue;
        }
        int64_t left = (until - srv_engine_now_ns()) / 1000000;
        if (left <= 0)
            return 0;
        srv_job_wait(j, left);
    }
    return o->n[0] >= n;
}

/* Callback bookkeeping shared by all tests. */
static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cv = PTHREAD_COND_INITIALIZER;
static int cb_notify;   /* notify calls */
static int cb_bad_done; /* on_done called with a job that is not done */

static void on_notify(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&cb_mu);
    cb_notify++;
    pthread_mutex_unlock(&cb_mu);
}

static void on_done(srv_job_t *j, void *ud)
{
    int *flag = ud;
    pthread_mutex_lock(&cb_mu);
    if (!srv_job_result(j))
        cb_bad_done++;
    if (flag)
        (*flag)++;
    pthread_cond_broadcast(&cb_cv);
    pthread_mutex_unlock(&cb_mu);
}

static void cb_reset(void)
{
    pthread_mutex_lock(&cb_mu);
    cb_notify = cb_bad_done = 0;
    pthread_mutex_unlock(&cb_mu);
}

/* Waits (bounded) until *flag (a job's on_done counter, its ud) is >= n.
 * Per-job counters, because on_done of an earlier job may still be running
 * after its consumer saw DONE. */
static int wait_flag(int *flag, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&cb_mu);
    int rc = 0;
    while (*flag < n && rc == 0)
        rc = pthread_cond_timedwait(&cb_cv, &cb_mu, &ts);
    int ok = *flag >= n;
    pthread_mutex_unlock(&cb_mu);
    return ok;
}

static int flag_value(const int *flag)
{
    pthread_mutex_lock(&cb_mu);
    int n = *flag;
    pthread_mutex_unlock(&cb_mu);
    return n;
}

static void ctx_init(srv_seq_ctx_t *c, core_model_t *m)
{
    memset(c, 0, sizeof *c);
    core_sample_params_t p;
    core_sample_params_default(&p);
    core_error_t err = {0};
    if (core_attn_state_new(core_model_attn(m), &c->state, &err) < 0 ||
        core_sampler_new(&p, &c->sampler, &err) < 0)
        printf("  ctx: %s\n", err.msg);
}

static void ctx_fini(srv_seq_ctx_t *c)
{
    core_attn_state_free(c->state);
    core_sampler_free(c->sampler);
    srv_seq_ctx_clear_pending(c);
    memset(c, 0, sizeof *c);
}

static srv_engine_t *engine(core_model_t *m, const srv_engine_opts_t *o)
{
    srv_engine_t *e = NULL;
    char err[256] = "";
    int rc = srv_engine_new(m, tok, o, &e, err, sizeof err);
    if (rc < 0)
        printf("  engine: %s\n", err);
    return e;
}

static void greedy_spec(srv_job_spec_t *sp, srv_seq_ctx_t *c, const int32_t *prompt, size_t n,
                        int64_t max_tokens)
{
    srv_job_spec_init(sp);
    sp->ctx = c;
    sp->prompt = prompt;
    sp->n_prompt = n;
    sp->max_tokens = max_tokens;
    sp->params.temperature = 0.0f;
    sp->ignore_eos = 1;
    sp->notify = on_notify;
    sp->on_done = on_done;
}

static srv_job_t *submit(srv_engine_t *e, const srv_job_spec_t *sp)
{
    srv_job_t *j = NULL;
    char err[256] = "";
    int rc = srv_engine_submit(e, sp, &j, err, sizeof err);
    if (rc < 0)
        printf("  submit: %s (%s)\n", srv_engine_strerror(rc), err);
    return j;
}

/* Runs one job to its end; 1 on success. */
static int run(srv_engine_t *e, const srv_job_spec_t *sp, out_t *o)
{
    srv_job_t *j = submit(e, sp);
    if (!j)
        return 0;
    int ok = collect(j, o);
    srv_job_release(j);
    return ok;
}

static void rand_tokens(core_rng_t *r, int32_t *t, size_t n)
{
    /* ids above the special tokens (0..2 in the tiny vocabulary) */
    for (size_t i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(core_rng_u64(r) % (uint64_t)(V - 3));
}

static int same_tokens(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ------------------------------------------------------------- tests */

TEST(eight_concurrent_jobs_batch_and_match_alone)
{
    enum { N = 8, GEN = 12 };
    const size_t len[N] = {3, 7, 12, 20, 28, 35, 41, 50};
    srv_metrics_t *reg = srv_metrics_new();
    srv_engine_opts_t o = {
        .max_batch = 8, .prefill_chunk = 64, .max_step_tokens = 2048, .metrics = reg};
    srv_engine_t *e = engine(tiny, &o);
    CHECK(e != NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 11);
    int32_t prompt[N][64];
    out_t *ref[N], *got[N];
    srv_seq_ctx_t ctx[N];
    for (int i = 0; i < N; i++) {
        rand_tokens(&r, prompt[i], len[i]);
        ref[i] = out_new();
        got[i] = out_new();
        /* reference: the job alone */
        srv_seq_ctx_t c;
        ctx_init(&c, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c, prompt[i], len[i], GEN);
        CHECK(run(e, &sp, ref[i]));
        CHECK_INT_EQ(ref[i]->n[0], GEN);
        ctx_fini(&c);
    }
    srv_engine_stats_t s0, s1;
    srv_engine_stats(e, &s0);
    cb_reset();
    srv_job_t *jobs[N];
    int dn[N] = {0};
    srv_engine_hold(e, 1);
    for (int i = 0; i < N; i++) {
        ctx_init(&ctx[i], tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &ctx[i], prompt[i], len[i], GEN);
        sp.ud = &dn[i];
        jobs[i] = submit(e, &sp);
        CHECK(jobs[i] != NULL);
    }
    srv_engine_stats(e, &s1);
    CHECK_INT_EQ(s1.queue_depth, N);
    srv_engine_hold(e, 0);
    for (int i = 0; i < N; i++) {
        if (!jobs[i])
            continue;
        CHECK(collect(jobs[i], got[i]));
        CHECK(wait_flag(&dn[i], 1));
        srv_job_release(jobs[i]);
        CHECK_MSG(same_tokens(got[i]->tok[0], got[i]->n[0], ref[i]->tok[0], ref[i]->n[0]),
                  "job %d: batched tokens differ from the job alone", i);
        CHECK_STR_EQ(got[i]->text[0], ref[i]->text[0]);
        CHECK_INT_EQ(got[i]->finish[0], SRV_FINISH_LENGTH);
        CHECK_INT_EQ(got[i]->ends[0], 1);
        CHECK_INT_EQ(got[i]->after_end + got[i]->after_done, 0);
        const srv_job_result_t *res = &got[i]->res;
        CHECK_INT_EQ(res->prompt_tokens, (int64_t)len[i]);
        CHECK_INT_EQ(res->completion_total, GEN);
        CHECK_INT_EQ(res->finish[0], SRV_FINISH_LENGTH);
        /* the last sample is pending, every other token was fed */
        CHECK_INT_EQ(res->state_pos, (int64_t)len[i] + GEN - 1);
        CHECK_INT_EQ(core_attn_state_pos(ctx[i].state), (int64_t)len[i] + GEN - 1);
        CHECK_INT_EQ(ctx[i].n_pending, 1);
        if (ctx[i].n_pending == 1)
            CHECK_INT_EQ(ctx[i].pending[0], got[i]->tok[0][GEN - 1]);
        CHECK(res->queue_s >= 0 && res->ttft_s >= res->queue_s && res->total_s >= res->ttft_s);
        CHECK(res->decode_s >= 0 && res->prefill_s >= 0);
        ctx_fini(&ctx[i]);
    }
    for (int i = 0; i < N; i++)
        CHECK_INT_EQ(flag_value(&dn[i]), 1);
    CHECK_INT_EQ(cb_bad_done, 0);
    CHECK(cb_notify >= N);
    srv_engine_stats(e, &s1);
    /* hold made them start together: one prefill step and GEN - 1 decode
     * steps, every one with all 8 sequences */
    CHECK_INT_EQ(s1.batch_hist[8] - s0.batch_hist[8], GEN);
    CHECK_INT_EQ(s1.steps - s0.steps, GEN);
    CHECK_INT_EQ(s1.max_batch_seen, 8);
    CHECK_INT_EQ(s1.generated_tokens - s0.generated_tokens, N * GEN);
    CHECK_INT_EQ(s1.running_seqs, 0);
    CHECK_INT_EQ(s1.queue_depth, 0);
    CHECK_INT_EQ(s1.choices_finished[SRV_FINISH_LENGTH], 2 * N);

    char *text = srv_metrics_render(reg, NULL);
    CHECK(text && strstr(text, "darkserve_engine_batch_sequences_bucket{le=\"8\"}"));
    CHECK(text && strstr(text, "darkserve_engine_sequences_finished_total{reason=\"length\"} 16"));
    free(text);
    for (int i = 0; i < N; i++) {
        free(ref[i]);
        free(got[i]);
    }
    srv_engine_free(e);
    srv_metrics_free(reg);
}

TEST(long_prompt_prefills_beside_decoding_sequences)
{
    enum { LA = 4, LB = 80, GA = 40, GB = 8 };
    srv_engine_opts_t o = {.max_batch = 4, .prefill_chunk = 16, .max_step_tokens = 2048};
    srv_engine_t *e = engine(tiny, &o);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 12);
    int32_t pa[LA], pb[LB];
    rand_tokens(&r, pa, LA);
    rand_tokens(&r, pb, LB);
    out_t *ra = out_new(), *rb = out_new(), *ga = out_new(), *gb = out_new();
    srv_seq_ctx_t ca, cb;
    srv_job_spec_t sa, sb;
    ctx_init(&ca, tiny);
    greedy_spec(&sa, &ca, pa, LA, GA);
    CHECK(run(e, &sa, ra));
    ctx_fini(&ca);
    ctx_init(&cb, tiny);
    greedy_spec(&sb, &cb, pb, LB, GB);
    CHECK(run(e, &sb, rb));
    ctx_fini(&cb);

    srv_engine_stats_t s0, s1;
    srv_engine_stats(e, &s0);
    ctx_init(&ca, tiny);
    ctx_init(&cb, tiny);
    greedy_spec(&sa, &ca, pa, LA, GA);
    greedy_spec(&sb, &cb, pb, LB, GB);
    srv_engine_hold(e, 1);
    srv_job_t *ja = submit(e, &sa), *jb = submit(e, &sb);
    srv_engine_hold(e, 0);
    CHECK(ja && jb);
    if (ja && jb) {
        CHECK(collect(ja, ga));
        CHECK(collect(jb, gb));
        CHECK(same_tokens(ga->tok[0], ga->n[0], ra->tok[0], ra->n[0]));
        CHECK(same_tokens(gb->tok[0], gb->n[0], rb->tok[0], rb->n[0]));
        srv_engine_stats(e, &s1);
        /* B needs LB / 16 = 5 prefill steps; A decodes in the 4 after its own
         * prefill step */
        CHECK_MSG(s1.steps_mixed - s0.steps_mixed >= 4, "mixed steps: %llu",
                  (unsigned long long)(s1.steps_mixed - s0.steps_mixed));
        int before = 0;
        for (int k = 0; k < ga->n[0]; k++)
            before += ga->step[0][k] < gb->step[0][0];
        CHECK_MSG(before >= 4, "A produced %d tokens while B was prefilling", before);
        CHECK(gb->res.prefill_tps > 0);
    }
    srv_job_release(ja);
    srv_job_release(jb);
    ctx_fini(&ca);
    ctx_fini(&cb);
    free(ra);
    free(rb);
    free(ga);
    free(gb);
    srv_engine_free(e);
}

TEST(n_choices_equal_independent_seeds)
{
    enum { L = 10, G = 20, N = 3 };
    srv_engine_t *e = engine(tiny, NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 13);
    int32_t p[L];
    rand_tokens(&r, p, L);
    out_t *ind[N], *multi = out_new();
    for (int i = 0; i < N; i++) {
        ind[i] = out_new();
        srv_seq_ctx_t c;
        ctx_init(&c, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c, p, L, G);
        sp.params.temperature = 1.0f;
        sp.params.seed = 1000 + (uint64_t)i;
        sp.reseed = 1;
        CHECK(run(e, &sp, ind[i]));
        ctx_fini(&c);
    }
    srv_seq_ctx_t c;
    ctx_init(&c, tiny);
    srv_job_spec_t sp;
    greedy_spec(&sp, &c, p, L, G);
    sp.params.temperature = 1.0f;
    sp.params.seed = 1000;
    sp.params.n_logprobs = 3;
    sp.reseed = 1;
    sp.n_choices = N;
    CHECK(run(e, &sp, multi));
    int differ = 0;
    for (int i = 0; i < N; i++) {
        CHECK_MSG(same_tokens(multi->tok[i], multi->n[i], ind[i]->tok[0], ind[i]->n[0]),
                  "choice %d differs from the job seeded %d", i, 1000 + i);
        CHECK_INT_EQ(multi->finish[i], SRV_FINISH_LENGTH);
        CHECK_INT_EQ(multi->res.completion_tokens[i], G);
        if (i > 0)
            differ += !same_tokens(multi->tok[i], multi->n[i], multi->tok[0], multi->n[0]);
    }
    CHECK_MSG(differ > 0, "three seeds gave three identical samples");
    CHECK_INT_EQ(multi->res.completion_total, N * G);
    /* the context continues choice 0 */
    CHECK_INT_EQ(core_attn_state_pos(c.state), L + G - 1);
    CHECK_INT_EQ(c.n_pending, 1);
    if (c.n_pending)
        CHECK_INT_EQ(c.pending[0], multi->tok[0][G - 1]);
    ctx_fini(&c);
    for (int i = 0; i < N; i++)
        free(ind[i]);
    free(multi);
    srv_engine_free(e);
}

static int ascii_piece(int32_t id, size_t *len)
{
    const char *p = core_tokenizer_piece(tok, id, len);
    if (!p || *len == 0)
        return 0;
    for (size_t k = 0; k < *len; k++) {
        if ((unsigned char)p[k] >= 0x80 || p[k] == '\0')
            return 0;
    }
    return 1;
}

TEST(stop_string_across_tokens)
{
    enum { L = 8, G = 60 };
    srv_engine_t *e = engine(tiny, NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 14);
    int32_t p[L];
    rand_tokens(&r, p, L);
    out_t *ref = out_new(), *got = out_new();
    srv_seq_ctx_t c;
    ctx_init(&c, tiny);
    srv_job_spec_t sp;
    greedy_spec(&sp, &c, p, L, G);
    CHECK(run(e, &sp, ref));
    ctx_fini(&c);
    /* the stop string: the last bytes of token k and the first of k+1, whose
     * first occurrence in the text is exactly there */
    const char *T = ref->text[0];
    size_t off = 0;
    int k_found = -1;
    char stop[8] = "";
    size_t cut = 0;
    for (int k = 0; k + 1 < ref->n[0]; k++) {
        size_t l0, l1;
        int ok = ascii_piece(ref->tok[0][k], &l0);
        int ok1 = ascii_piece(ref->tok[0][k + 1], &l1);
        if (ok && ok1 && k >= 2) {
            const char *p0 = core_tokenizer_piece(tok, ref->tok[0][k], &l0);
            const char *p1 = core_tokenizer_piece(tok, ref->tok[0][k + 1], &l1);
            size_t a = l0 < 2 ? l0 : 2, b = l1 < 2 ? l1 : 2;
            memcpy(stop, p0 + l0 - a, a);
            memcpy(stop + a, p1, b);
            stop[a + b] = '\0';
            const char *hit = strstr(T, stop);
            if (hit && (size_t)(hit - T) == off + l0 - a) {
                k_found = k;
                cut = off + l0 - a;
                break;
            }
        }
        size_t lk;
        if (!core_tokenizer_piece(tok, ref->tok[0][k], &lk))
            break;
        if (!ascii_piece(ref->tok[0][k], &lk) && lk)
            break; /* offsets below assume byte-exact ASCII text */
        off += lk;
    }
    CHECK_MSG(k_found >= 0, "no ASCII token pair to build a stop string from");
    if (k_found >= 0) {
        const char *stops[] = {"\x01never", stop};
        ctx_init(&c, tiny);
        greedy_spec(&sp, &c, p, L, G);
        sp.stops = stops;
        sp.n_stops = 2;
        CHECK(run(e, &sp, got));
        CHECK_INT_EQ(got->finish[0], SRV_FINISH_STOP);
        CHECK_INT_EQ(got->n[0], k_found + 2);
        CHECK_INT_EQ(got->tlen[0], cut);
        CHECK(strncmp(got->text[0], T, cut) == 0);
        CHECK(strstr(got->text[0], stop) == NULL);
        /* history: every sampled token; the last one is pending */
        CHECK_INT_EQ(c.n_pending, 1);
        if (c.n_pending)
            CHECK_INT_EQ(c.pending[0], ref->tok[0][k_found + 1]);
        ctx_fini(&c);
    }
    free(ref);
    free(got);
    srv_engine_free(e);
}

TEST(max_tokens_and_end_of_generation)
{
    enum { L = 6, G = 64, NP = 64 };
    srv_engine_opts_t o = {.max_batch = 8};
    srv_engine_t *e = engine(tiny, &o);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 15);
    int32_t p[NP][L];
    /* max_tokens */
    {
        rand_tokens(&r, p[0], L);
        out_t *got = out_new();
        srv_seq_ctx_t c;
        ctx_init(&c, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c, p[0], L, 5);
        CHECK(run(e, &sp, got));
        CHECK_INT_EQ(got->n[0], 5);
        CHECK_INT_EQ(got->finish[0], SRV_FINISH_LENGTH);
        CHECK_INT_EQ(got->res.completion_tokens[0], 5);
        ctx_fini(&c);
        free(got);
    }
    /* end of generation: find (deterministically) a prompt whose greedy
     * continuation, with EOG ignored, contains an EOG token; without
     * ignore_eos the job must stop right there, with nothing pending */
    int found = 0;
    for (int batch = 0; batch < 8 && !found; batch++) {
        srv_job_t *jobs[8];
        out_t *outs[8];
        srv_seq_ctx_t cs[8];
        srv_engine_hold(e, 1);
        for (int i = 0; i < 8; i++) {
            rand_tokens(&r, p[batch * 8 + i], L);
            ctx_init(&cs[i], tiny);
            outs[i] = out_new();
            srv_job_spec_t sp;
            greedy_spec(&sp, &cs[i], p[batch * 8 + i], L, G);
            jobs[i] = submit(e, &sp);
        }
        srv_engine_hold(e, 0);
        for (int i = 0; i < 8; i++) {
            if (jobs[i])
                collect(jobs[i], outs[i]);
            srv_job_release(jobs[i]);
            ctx_fini(&cs[i]);
        }
        for (int i = 0; i < 8 && !found; i++) {
            int at = -1;
            for (int k = 0; k < outs[i]->n[0] && at < 0; k++) {
                if (core_tokenizer_is_eog(tok, outs[i]->tok[0][k]))
                    at = k;
            }
            if (at < 0)
                continue;
            found = 1;
            out_t *got = out_new();
            srv_seq_ctx_t c;
            ctx_init(&c, tiny);
            srv_job_spec_t sp;
            greedy_spec(&sp, &c, p[batch * 8 + i], L, G);
            sp.ignore_eos = 0;
            CHECK(run(e, &sp, got));
            CHECK_INT_EQ(got->finish[0], SRV_FINISH_STOP);
            CHECK_INT_EQ(got->n[0], at + 1);
            CHECK(same_tokens(got->tok[0], got->n[0], outs[i]->tok[0], at + 1));
            /* the EOG token closes the turn: not pending, not fed */
            CHECK_INT_EQ(c.n_pending, 0);
            CHECK_INT_EQ(core_attn_state_pos(c.state), L + at);
            ctx_fini(&c);
            free(got);
        }
        for (int i = 0; i < 8; i++)
            free(outs[i]);
    }
    CHECK_MSG(found, "no prompt among %d produced an end-of-generation token", NP);
    srv_engine_free(e);
}

TEST(ingest_only_advances_by_the_input)
{
    srv_engine_t *e = engine(tiny, NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 16);
    int32_t p1[20], p2[3], p3[7];
    rand_tokens(&r, p1, 20);
    rand_tokens(&r, p2, 3);
    rand_tokens(&r, p3, 7);
    srv_seq_ctx_t c;
    ctx_init(&c, tiny);
    srv_job_spec_t sp;
    out_t *o = out_new();
    greedy_spec(&sp, &c, p1, 20, 0);
    CHECK(run(e, &sp, o));
    CHECK_INT_EQ(o->n_events, 1); /* DONE only */
    CHECK(o->done);
    CHECK_INT_EQ(o->res.absorbed_tokens, 20);
    CHECK_INT_EQ(o->res.completion_total, 0);
    CHECK_INT_EQ(o->res.finish[0], SRV_FINISH_LENGTH);
    CHECK_INT_EQ(core_attn_state_pos(c.state), 20);
    CHECK_INT_EQ(c.n_pending, 0);
    /* the prompt is in the sampler's penalty history */
    int32_t hist[CORE_SAMPLE_HISTORY];
    size_t nh = core_sampler_history(c.sampler, hist, CORE_SAMPLE_HISTORY);
    CHECK(nh == 20 && memcmp(hist, p1, sizeof p1) == 0);

    /* generate 5: the last is pending */
    memset(o, 0, sizeof *o);
    greedy_spec(&sp, &c, p2, 3, 5);
    CHECK(run(e, &sp, o));
    CHECK_INT_EQ(core_attn_state_pos(c.state), 20 + 3 + 4);
    CHECK_INT_EQ(c.n_pending, 1);
    /* ingest 7 more: absorbs the pending token first */
    memset(o, 0, sizeof *o);
    greedy_spec(&sp, &c, p3, 7, 0);
    CHECK(run(e, &sp, o));
    CHECK_INT_EQ(o->res.input_tokens, 8);
    CHECK_INT_EQ(o->res.absorbed_tokens, 8);
    CHECK_INT_EQ(o->res.prompt_tokens, 7);
    CHECK_INT_EQ(core_attn_state_pos(c.state), 20 + 3 + 5 + 7);
    CHECK_INT_EQ(c.n_pending, 0);
    /* an empty ingest is a no-op */
    memset(o, 0, sizeof *o);
    greedy_spec(&sp, &c, NULL, 0, 0);
    CHECK(run(e, &sp, o));
    CHECK_INT_EQ(core_attn_state_pos(c.state), 35);
    ctx_fini(&c);
    free(o);
    srv_engine_free(e);
}

/* Embedding jobs: pooled in prefill chunks through the state (a linear kind,
 * chunk 16, an input of 10 chunks and a bit), the mean and the last token's
 * row equal what every token's rows (pool TOKENS) give, and those equal the
 * model's own hidden rows fed in the same chunks; a context that is not
 * fresh, or generation, is refused. */
TEST(embedding_jobs_pool_the_hidden_rows)
{
    enum { N = 170, CH = 16 };
    srv_engine_opts_t eo = {.prefill_chunk = CH};
    srv_engine_t *e = engine(tiny_lin, &eo);
    if (!e)
        return;
    const int64_t D = core_model_info(tiny_lin)->n_embd;
    core_rng_t r;
    core_rng_seed(&r, 41);
    int32_t p[N];
    rand_tokens(&r, p, N);
    float *all = malloc((size_t)N * (size_t)D * sizeof *all);
    float *ref = malloc((size_t)N * (size_t)D * sizeof *ref);
    float *mean = malloc((size_t)D * sizeof *mean);
    float *last = malloc((size_t)D * sizeof *last);
    srv_seq_ctx_t c;
    srv_job_spec_t sp;
    out_t *o = out_new();
    const srv_pool_t pools[3] = {SRV_POOL_TOKENS, SRV_POOL_MEAN, SRV_POOL_LAST};
    float *outs[3] = {all, mean, last};
    for (int k = 0; k < 3; k++) {
        ctx_init(&c, tiny_lin);
        greedy_spec(&sp, &c, p, N, 0);
        sp.pool = pools[k];
        sp.embed_out = outs[k];
        memset(o, 0, sizeof *o);
        CHECK(run(e, &sp, o));
        CHECK_INT_EQ(o->res.finish[0], SRV_FINISH_LENGTH);
        CHECK_INT_EQ(core_attn_state_pos(c.state), N);
        ctx_fini(&c);
    }
    /* the model's rows, chunk by chunk as the engine feeds them */
    ctx_init(&c, tiny_lin);
    for (int64_t i = 0; i < N; i += CH) {
        core_batch_seq_t b = {.state = c.state,
                              .tokens = p + i,
                              .n_tokens = N - i < CH ? N - i : CH,
                              .hidden = ref + i * D};
        CHECK_INT_EQ(core_model_forward(tiny_lin, &b, 1, NULL), 0);
    }
    ctx_fini(&c);
    CHECK(memcmp(all, ref, (size_t)N * (size_t)D * sizeof *all) == 0);
    CHECK(memcmp(last, all + (N - 1) * D, (size_t)D * sizeof *last) == 0);
    for (int64_t d = 0; d < D; d++) {
        double s = 0;
        for (int i = 0; i < N; i++)
            s += all[i * D + d];
        CHECK_NEAR(mean[d], s / N, 1e-6);
    }
    /* refused: pending tokens, generation, no output */
    srv_job_t *j = NULL;
    char err[256];
    ctx_init(&c, tiny_lin);
    CHECK_INT_EQ(srv_seq_ctx_set_pending(&c, p, 1), 0);
    greedy_spec(&sp, &c, p, 4, 0);
    sp.pool = SRV_POOL_MEAN;
    sp.embed_out = mean;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &j, err, sizeof err), SRV_ENGINE_EINVAL);
    CHECK(strstr(err, "fresh context") != NULL);
    srv_seq_ctx_clear_pending(&c);
    sp.max_tokens = 3;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &j, err, sizeof err), SRV_ENGINE_EINVAL);
    sp.max_tokens = 0;
    sp.embed_out = NULL;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &j, err, sizeof err), SRV_ENGINE_EINVAL);
    CHECK(j == NULL);
    ctx_fini(&c);
    free(o);
    free(all);
    free(ref);
    free(mean);
    free(last);
    srv_engine_free(e);
}

/* "continue a session with new text" == "a fresh context fed the full
 * history", greedy, with and without penalties (which read the history). */
static void continuation_case(srv_engine_t *e, float repeat_penalty, float freq_penalty)
{
    enum { L1 = 12, G1 = 8, L2 = 6, G2 = 10 };
    core_rng_t r;
    core_rng_seed(&r, 17);
    int32_t p1[L1], p2[L2], full[L1 + G1 + L2];
    rand_tokens(&r, p1, L1);
    rand_tokens(&r, p2, L2);
    out_t *o1 = out_new(), *o2 = out_new(), *of = out_new();
    srv_seq_ctx_t a, b;
    ctx_init(&a, tiny);
    ctx_init(&b, tiny);
    srv_job_spec_t sp;
    greedy_spec(&sp, &a, p1, L1, G1);
    sp.params.repeat_penalty = repeat_penalty;
    sp.params.frequency_penalty = freq_penalty;
    CHECK(run(e, &sp, o1));
    CHECK_INT_EQ(o1->finish[0], SRV_FINISH_LENGTH);
    CHECK_INT_EQ(a.n_pending, 1);
    greedy_spec(&sp, &a, p2, L2, G2);
    sp.params.repeat_penalty = repeat_penalty;
    sp.params.frequency_penalty = freq_penalty;
    CHECK(run(e, &sp, o2));

    memcpy(full, p1, sizeof p1);
    memcpy(full + L1, o1->tok[0], G1 * sizeof *full);
    memcpy(full + L1 + G1, p2, sizeof p2);
    greedy_spec(&sp, &b, full, L1 + G1 + L2, G2);
    sp.params.repeat_penalty = repeat_penalty;
    sp.params.frequency_penalty = freq_penalty;
    CHECK(run(e, &sp, of));
    CHECK_MSG(same_tokens(o2->tok[0], o2->n[0], of->tok[0], of->n[0]),
              "continuation differs from the full history (penalty %g/%g)", repeat_penalty,
              freq_penalty);
    CHECK_INT_EQ(core_attn_state_pos(a.state), core_attn_state_pos(b.state));
    CHECK(a.n_pending == 1 && b.n_pending == 1 && a.pending[0] == b.pending[0]);
    int32_t ha[CORE_SAMPLE_HISTORY], hb[CORE_SAMPLE_HISTORY];
    size_t na = core_sampler_history(a.sampler, ha, CORE_SAMPLE_HISTORY);
    size_t nb = core_sampler_history(b.sampler, hb, CORE_SAMPLE_HISTORY);
    CHECK(na == nb && memcmp(ha, hb, na * sizeof *ha) == 0);
    ctx_fini(&a);
    ctx_fini(&b);
    free(o1);
    free(o2);
    free(of);
}

TEST(session_continuation_equals_full_history)
{
    srv_engine_t *e = engine(tiny, NULL);
    if (!e)
        return;
    continuation_case(e, 1.0f, 0.0f);
    continuation_case(e, 1.3f, 0.5f);
    srv_engine_free(e);
}

/* A job that snapshots its prefill at two positions, then jobs resumed from
 * each snapshot (n_cached) with the whole prompt: the same greedy tokens,
 * state position and sampler history as the cold job, on both an exact
 * and a linear model; the snapshot position splits a prefill chunk. */
static void snapshot_case(core_model_t *m, float repeat_penalty)
{
    enum { L = 300, G = 10 };
    core_rng_t r;
    core_rng_seed(&r, 23);
    int32_t p[L];
    rand_tokens(&r, p, L);
    srv_engine_t *e = engine(m, NULL);
    if (!e)
        return;
    out_t *cold = out_new(), *warm = out_new();
    srv_seq_ctx_t a;
    ctx_init(&a, m);
    const size_t snaps[2] = {100, 257}; /* 257: inside the second 256-token chunk */
    srv_job_spec_t sp;
    greedy_spec(&sp, &a, p, L, G);
    sp.params.repeat_penalty = repeat_penalty;
    sp.snap_at = snaps;
    sp.n_snap = 2;
    srv_job_t *j = submit(e, &sp);
    CHECK(j && collect(j, cold));
    core_attn_state_t *st[2] = {NULL, NULL};
    for (int k = 0; j && k < 2; k++) {
        st[k] = srv_job_take_snapshot(j, (size_t)k);
        CHECK(st[k] && core_attn_state_pos(st[k]) == (int64_t)snaps[k]);
    }
    CHECK(j && srv_job_take_snapshot(j, 0) == NULL); /* taken once */
    srv_job_release(j);
    int32_t hc[CORE_SAMPLE_HISTORY];
    size_t nhc = core_sampler_history(a.sampler, hc, CORE_SAMPLE_HISTORY);
    for (int k = 0; k < 2; k++) {
        if (!st[k])
            continue;
        srv_seq_ctx_t b;
        ctx_init(&b, m);
        core_error_t ce = {0};
        CHECK(core_attn_state_copy(b.state, st[k], &ce) == 0);
        greedy_spec(&sp, &b, p, L, G);
        sp.params.repeat_penalty = repeat_penalty;
        sp.n_cached = snaps[k];
        memset(warm, 0, sizeof *warm);
        CHECK(run(e, &sp, warm));
        CHECK_MSG(same_tokens(cold->tok[0], cold->n[0], warm->tok[0], warm->n[0]),
                  "resumed at %zu differs from the cold prefill", snaps[k]);
        CHECK_INT_EQ(warm->res.cached_tokens, (int64_t)snaps[k]);
        CHECK_INT_EQ(warm->res.prompt_tokens, L);
        CHECK_INT_EQ(warm->res.absorbed_tokens, (int64_t)(L - snaps[k]));
        CHECK_INT_EQ(core_attn_state_pos(b.state), core_attn_state_pos(a.state));
        int32_t hw[CORE_SAMPLE_HISTORY];
        size_t nhw = core_sampler_history(b.sampler, hw, CORE_SAMPLE_HISTORY);
        CHECK(nhw == nhc && memcmp(hw, hc, nhw * sizeof *hw) == 0);
        ctx_fini(&b);
        core_attn_state_free(st[k]);
    }
    /* bad specs: n_cached without the matching state, a generating job with
     * nothing left to feed, snapshots out of order or past the input */
    srv_seq_ctx_t c;
    ctx_init(&c, m);
    char err[256];
    srv_job_t *bad = NULL;
    greedy_spec(&sp, &c, p, L, G);
    sp.n_cached = 10; /* the state is at 0 */
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &bad, err, sizeof err), SRV_ENGINE_EINVAL);
    sp.n_cached = 0;
    const size_t unordered[2] = {50, 40}, past[1] = {L + 1};
    sp.snap_at = unordered;
    sp.n_snap = 2;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &bad, err, sizeof err), SRV_ENGINE_EINVAL);
    sp.snap_at = past;
    sp.n_snap = 1;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &bad, err, sizeof err), SRV_ENGINE_EINVAL);
    core_attn_advance(c.state, L); /* position L: as if all of p were cached */
    greedy_spec(&sp, &c, p, L, G);
    sp.n_cached = L;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &bad, err, sizeof err), SRV_ENGINE_EINVAL);
    CHECK(bad == NULL);
    ctx_fini(&c);
    ctx_fini(&a);
    free(cold);
    free(warm);
    srv_engine_free(e);
}

TEST(snapshot_then_resume_equals_cold_prefill)
{
    snapshot_case(tiny, 1.0f);
    snapshot_case(tiny, 1.3f);
    snapshot_case(tiny_lin, 1.0f);
}

/* Snapshots are handed over once the prompt is absorbed: after the first
 * token (the job has 200 more to go), srv_job_snapshots_ready is 1 and take
 * gives the copies at their positions, once each; the generation then goes
 * on to its end (and frees what was not taken: nothing here). */
TEST(snapshots_ready_before_done)
{
    enum { L = 120, G = 200 };
    srv_engine_t *e = engine(tiny_lin, NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 29);
    int32_t p[L];
    rand_tokens(&r, p, L);
    srv_seq_ctx_t a;
    ctx_init(&a, tiny_lin);
    const size_t snaps[2] = {40, 119};
    srv_job_spec_t sp;
    greedy_spec(&sp, &a, p, L, G);
    sp.snap_at = snaps;
    sp.n_snap = 2;
    out_t *o = out_new();
    srv_job_t *j = submit(e, &sp);
    CHECK(j != NULL);
    if (j) {
        CHECK(collect_tokens(j, o, 1));
        CHECK(srv_job_snapshots_ready(j));
        for (int k = 0; k < 2; k++) {
            core_attn_state_t *st = srv_job_take_snapshot(j, (size_t)k);
            CHECK(st && core_attn_state_pos(st) == (int64_t)snaps[k]);
            core_attn_state_free(st);
        }
        CHECK(srv_job_take_snapshot(j, 1) == NULL);
        CHECK(collect(j, o));
        CHECK_INT_EQ(o->n[0], G);
        srv_job_release(j);
    }
    CHECK(!srv_job_snapshots_ready(NULL));
    free(o);
    ctx_fini(&a);
    srv_engine_free(e);
}

TEST(cancel_ends_within_one_step)
{
    srv_engine_t *e = engine(tiny_lin, NULL);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 18);
    int32_t p[5];
    rand_tokens(&r, p, 5);
    srv_seq_ctx_t c;
    ctx_init(&c, tiny_lin);
    srv_job_spec_t sp;
    /* far more tokens than it can make before the cancel lands */
    greedy_spec(&sp, &c, p, 5, 100000000);
    out_t *o = out_new();
    srv_job_t *j = submit(e, &sp);
    CHECK(j != NULL);
    if (j) {
        CHECK(collect_tokens(j, o, 3));
        srv_engine_stats_t s0;
        srv_engine_stats(e, &s0);
        srv_engine_cancel(j);
        CHECK(collect(j, o));
        CHECK_INT_EQ(o->finish[0], SRV_FINISH_CANCELLED);
        CHECK_INT_EQ(o->res.finish[0], SRV_FINISH_CANCELLED);
        CHECK_MSG(o->res.end_step <= s0.steps + 1, "cancelled at step %llu, ended at %llu",
                  (unsigned long long)s0.steps, (unsigned long long)o->res.end_step);
        CHECK_INT_EQ(o->ends[0], 1);
        CHECK_INT_EQ(o->after_done + o->after_end, 0);
        /* the pending rule holds for a cancelled job too */
        const int64_t n = o->res.completion_tokens[0];
        CHECK_INT_EQ(n, o->n[0]);
        CHECK_INT_EQ(core_attn_state_pos(c.state), 5 + n - 1);
        CHECK(c.n_pending == 1 && c.pending[0] == o->tok[0][o->n[0] - 1]);
        srv_engine_stats_t s1;
        srv_engine_stats(e, &s1);
        CHECK_INT_EQ(s1.choices_finished[SRV_FINISH_CANCELLED], 1);
        srv_engine_cancel(j); /* after the end: no-op */
        srv_job_release(j);
    }
    ctx_fini(&c);
    free(o);
    srv_engine_free(e);
}

/* A consumer that does not pop pauses its own job, not the batch; cancel
 * reaches a paused job; a released job runs to its end without a consumer. */
TEST(back_pressure_pauses_one_job)
{
    srv_engine_opts_t o = {.max_batch = 4, .max_queued_events = 4};
    srv_engine_t *e = engine(tiny, &o);
    if (!e)
        return;
    core_rng_t r;
    core_rng_seed(&r, 19);
    int32_t px[5], py[5], pz[5];
    rand_tokens(&r, px, 5);
    rand_tokens(&r, py, 5);
    rand_tokens(&r, pz, 5);
    srv_seq_ctx_t cx, cy, cz;
    ctx_init(&cx, tiny);
    ctx_init(&cy, tiny);
    ctx_init(&cz, tiny);
    srv_job_spec_t sx, sy, sz;
    greedy_spec(&sx, &cx, px, 5, 400);
    greedy_spec(&sy, &cy, py, 5, 30);
    greedy_spec(&sz, &cz, pz, 5, 40);
    int z_done = 0, y_done = 0;
    sz.ud = &z_done;
    sy.ud = &y_done;
    cb_reset();
    out_t *ox = out_new(), *oy = out_new();
    srv_job_t *jx = submit(e, &sx), *jy = submit(e, &sy), *jz = submit(e, &sz);
    CHECK(jx && jy && jz);
    srv_job_release(jz); /* nobody will read z */
    if (jy)
        CHECK(collect(jy, oy)); /* y runs to its end while x sits paused */
    CHECK_INT_EQ(oy->n[0], 30);
    CHECK_INT_EQ(oy->finish[0], SRV_FINISH_LENGTH);
    CHECK(wait_flag(&y_done, 1));
    CHECK(wait_flag(&z_done, 1)); /* z ran to its end with nobody reading */
    CHECK_INT_EQ(flag_value(&z_done), 1);
    if (jx) {
        CHECK(srv_job_result(jx) == NULL);
        srv_engine_cancel(jx);
        CHECK(collect(jx, ox));
        CHECK_INT_EQ(ox->finish[0], SRV_FINISH_CANCELLED);
        /* paused after exactly max_queued_events tokens */
        CHECK_INT_EQ(ox->res.completion_tokens[0], 4);
        CHECK_INT_EQ(ox->n[0], 4);
    }
    srv_job_release(jx);
    srv_job_release(jy);
    ctx_fini(&cx);
    ctx_fini(&cy);
    ctx_fini(&cz);
    free(ox);
    free(oy);
    srv_engine_free(e);
}

TEST(queue_full_and_bad_specs)
{
    srv_engine_opts_t o = {.max_batch = 2, .max_queue = 3};
    srv_engine_t *e = engine(tiny, &o);
    if (!e)
        return;
    int32_t p[4] = {5, 6, 7, 8};
    srv_seq_ctx_t c[4];
    srv_job_t *j[4] = {NULL};
    srv_job_spec_t sp;
    srv_engine_hold(e, 1);
    for (int i = 0; i < 4; i++) {
        ctx_init(&c[i], tiny);
        greedy_spec(&sp, &c[i], p, 4, 3);
        char err[256] = "";
        int rc = srv_engine_submit(e, &sp, &j[i], err, sizeof err);
        if (i < 3) {
            CHECK_INT_EQ(rc, 0);
        } else {
            CHECK_INT_EQ(rc, SRV_ENGINE_EQUEUE_FULL);
            CHECK(j[i] == NULL);
            CHECK(strstr(err, "3 jobs") != NULL);
            CHECK_STR_EQ(srv_engine_strerror(rc), "queue full");
            CHECK_INT_EQ(c[i].n_pending, 0); /* untouched */
        }
    }
    srv_engine_stats_t st;
    srv_engine_stats(e, &st);
    CHECK_INT_EQ(st.queue_depth, 3);
    CHECK_INT_EQ(st.jobs_queue_full, 1);
    srv_engine_hold(e, 0);
    for (int i = 0; i < 3; i++) {
        out_t *ou = out_new();
        if (j[i])
            CHECK(collect(j[i], ou));
        CHECK_INT_EQ(ou->n[0], 3);
        srv_job_release(j[i]);
        free(ou);
    }

    /* bad specs: each refused with its code, the context untouched */
    srv_job_t *x = NULL;
    char err[256];
    greedy_spec(&sp, &c[3], p, 4, 3);
    sp.n_choices = 3; /* > max_batch */
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    greedy_spec(&sp, &c[3], p, 4, 0);
    sp.n_choices = 2; /* ingest with choices */
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    int32_t bad[2] = {1, V};
    greedy_spec(&sp, &c[3], bad, 2, 3);
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    CHECK(strstr(err, "prompt token 1") != NULL);
    greedy_spec(&sp, &c[3], NULL, 0, 3); /* nothing to sample from */
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    greedy_spec(&sp, &c[3], p, 4, 3);
    sp.params.top_p = 2.0f;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    const char *empty_stop[] = {""};
    greedy_spec(&sp, &c[3], p, 4, 3);
    sp.stops = empty_stop;
    sp.n_stops = 1;
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    int32_t *big = calloc(600, sizeof *big);
    greedy_spec(&sp, &c[3], big, 600, 3); /* exact cache holds 512 */
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_ECONTEXT);
    free(big);
    core_sampler_t *keep = c[3].sampler;
    c[3].sampler = NULL;
    greedy_spec(&sp, &c[3], p, 4, 3);
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_EINVAL);
    c[3].sampler = keep;
    CHECK(x == NULL);
    CHECK_INT_EQ(core_attn_state_pos(c[3].state), 0);
    for (int i = 0; i < 4; i++)
        ctx_fini(&c[i]);

    /* bad options */
    srv_engine_t *bad_e = NULL;
    srv_engine_opts_t bo = {.max_batch = 16, .max_step_tokens = 8};
    CHECK_INT_EQ(srv_engine_new(tiny, tok, &bo, &bad_e, err, sizeof err), SRV_ENGINE_EINVAL);
    CHECK(bad_e == NULL);
    /* the largest values `serve` accepts (server/config.c) start an engine */
    srv_engine_opts_t top = {.max_batch = SRV_ENGINE_MAX_BATCH,
                             .prefill_chunk = SRV_ENGINE_DEFAULT_STEP_TOKENS, .max_queue = 1};
    srv_engine_t *top_e = engine(tiny, &top);
    CHECK(top_e != NULL);
    srv_engine_free(top_e);
    srv_engine_free(e);
    srv_engine_free(NULL);
}

TEST(timeout)
{
    srv_engine_opts_t o = {.max_queued_events = 4};
    srv_engine_t *e = engine(tiny, &o);
    if (!e)
        return;
    int32_t p[10] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    /* a deadline already past: ends before running; the prompt stays pending */
    {
        srv_seq_ctx_t c;
        ctx_init(&c, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c, p, 10, 5);
        sp.deadline_ns = 1;
        out_t *ou = out_new();
        CHECK(run(e, &sp, ou));
        CHECK_INT_EQ(ou->finish[0], SRV_FINISH_TIMEOUT);
        CHECK_INT_EQ(ou->n[0], 0);
        CHECK_INT_EQ(ou->ends[0], 1);
        CHECK_INT_EQ(core_attn_state_pos(c.state), 0);
        CHECK(c.n_pending == 10 && memcmp(c.pending, p, sizeof p) == 0);
        ctx_fini(&c);
        free(ou);
    }
    /* a job paused by its consumer still times out */
    {
        srv_seq_ctx_t c;
        ctx_init(&c, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c, p, 10, 400);
        sp.deadline_ns = srv_engine_now_ns() + 200 * 1000000LL;
        int d = 0;
        sp.ud = &d;
        srv_job_t *j = submit(e, &sp);
        CHECK(j != NULL);
        CHECK(wait_flag(&d, 1)); /* without popping a single event */
        if (j) {
            const srv_job_result_t *res = srv_job_result(j);
            CHECK(res && res->finish[0] == SRV_FINISH_TIMEOUT);
            /* paused after at most max_queued_events tokens */
            CHECK(res && res->completion_tokens[0] <= 4);
            out_t *ou = out_new();
            CHECK(collect(j, ou));
            CHECK_INT_EQ(ou->finish[0], SRV_FINISH_TIMEOUT);
            free(ou);
        }
        srv_job_release(j);
        ctx_fini(&c);
    }
    srv_engine_free(e);
}

TEST(stop_drains_then_cancels)
{
    int32_t p[6] = {30, 31, 32, 33, 34, 35};
    /* running jobs finish when the deadline allows */
    {
        srv_engine_t *e = engine(tiny, NULL);
        if (!e)
            return;
        srv_seq_ctx_t c[3];
        srv_job_t *j[3];
        int d[3] = {0};
        for (int i = 0; i < 3; i++) {
            ctx_init(&c[i], tiny);
            srv_job_spec_t sp;
            greedy_spec(&sp, &c[i], p, 6, 20);
            sp.ud = &d[i];
            j[i] = submit(e, &sp);
        }
        srv_engine_stop(e, srv_engine_now_ns() + (int64_t)WAIT_MS * 1000000);
        for (int i = 0; i < 3; i++) {
            CHECK_INT_EQ(flag_value(&d[i]), 1); /* stop returns after every on_done */
            const srv_job_result_t *res = j[i] ? srv_job_result(j[i]) : NULL;
            CHECK(res && res->finish[0] == SRV_FINISH_LENGTH && res->completion_tokens[0] == 20);
            srv_job_release(j[i]);
            ctx_fini(&c[i]);
        }
        srv_seq_ctx_t c2;
        ctx_init(&c2, tiny);
        srv_job_spec_t sp;
        greedy_spec(&sp, &c2, p, 6, 2);
        srv_job_t *x = NULL;
        CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, NULL, 0), SRV_ENGINE_ESTOPPED);
        ctx_fini(&c2);
        srv_engine_stop(e, 0); /* again: no-op */
        srv_engine_free(e);
    }
    /* jobs that cannot finish (paused, or waiting for a slot) are cancelled
     * at the deadline */
    {
        srv_engine_opts_t o = {.max_batch = 2, .max_queued_events = 4};
        srv_engine_t *e = engine(tiny, &o);
        if (!e)
            return;
        srv_seq_ctx_t c[3];
        srv_job_t *j[3];
        int d[3] = {0};
        for (int i = 0; i < 3; i++) {
            ctx_init(&c[i], tiny);
            srv_job_spec_t sp;
            greedy_spec(&sp, &c[i], p, 6, 400);
            sp.ud = &d[i];
            j[i] = submit(e, &sp);
        }
        srv_engine_stop(e, srv_engine_now_ns() + 100 * 1000000LL);
        for (int i = 0; i < 3; i++) {
            CHECK_INT_EQ(flag_value(&d[i]), 1);
            const srv_job_result_t *res = j[i] ? srv_job_result(j[i]) : NULL;
            CHECK(res && res->finish[0] == SRV_FINISH_CANCELLED);
            if (i < 2)
                CHECK(res && res->completion_tokens[0] <= 4);
            else /* never ran: its prompt is pending */
                CHECK(res && res->completion_tokens[0] == 0 && c[i].n_pending == 6);
            srv_job_release(j[i]);
            ctx_fini(&c[i]);
        }
        srv_engine_stats_t st;
        srv_engine_stats(e, &st);
        CHECK_INT_EQ(st.choices_finished[SRV_FINISH_CANCELLED], 3);
        CHECK_INT_EQ(st.jobs_done, 3);
        srv_engine_free(e);
    }
}

/* ---- grammars ---- */

/* A recognizer for the JSON-like grammar below, written by hand: returns the
 * position after a value at s[i..n), -1 when the text is wrong, -2 when it
 * ends before the value does (a valid prefix). */
#define JSON_GRAMMAR                                                                               \
    "root ::= value\n"                                                                             \
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"               \
    "object ::= \"{\" ( string \":\" value ( \",\" string \":\" value )* )? \"}\"\n"               \
    "array ::= \"[\" ( value ( \",\" value )* )? \"]\"\n"                                          \
    "string ::= \"\\\"\" [a-z ]{0,8} \"\\\"\"\n"                                                   \
    "number ::= \"-\"? [0-9]{1,3}\n"

static long j_value(const char *s, long i, long n);

static long j_string(const char *s, long i, long n)
{
    if (i == n)
        return -2;
    if (s[i] != '"')
        return -1;
    for (int k = 0; k <= 8; k++) {
        if (++i == n)
            return -2;
        if (s[i] == '"')
            return i + 1;
        if (k == 8 || !((s[i] >= 'a' && s[i] <= 'z') || s[i] == ' '))
            return -1;
    }
    return -1;
}

/* elements of an object (pairs) or an array, after the opening bracket */
static long j_items(const char *s, long i, long n, int pairs, char close)
{
    if (i == n)
        return -2;
    if (s[i] == close)
        return i + 1;
    for (;;) {
        if (pairs) {
            if ((i = j_string(s, i, n)) < 0)
                return i;
            if (i == n)
                return -2;
            if (s[i++] != ':')
                return -1;
        }
        if ((i = j_value(s, i, n)) < 0)
            return i;
        if (i == n)
            return -2;
        if (s[i] == close)
            return i + 1;
        if (s[i++] != ',')
            return -1;
    }
}

static long j_value(const char *s, long i, long n)
{
    if (i == n)
        return -2;
    static const char *const words[] = {"true", "false", "null"};
    switch (s[i]) {
    case '{': return j_items(s, i + 1, n, 1, '}');
    case '[': return j_items(s, i + 1, n, 0, ']');
    case '"': return j_string(s, i, n);
    default: break;
    }
    for (int w = 0; w < 3; w++)
        if (s[i] == words[w][0]) {
            for (long k = 0; words[w][k]; k++, i++) {
                if (i == n)
                    return -2;
                if (s[i] != words[w][k])
                    return -1;
            }
            return i;
        }
    if (s[i] == '-' && ++i == n)
        return -2;
    long d = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && d < 4)
        i++, d++;
    return d == 0 || d > 3 ? -1 : i;
}

/* 1: s is a whole value; 0: a proper prefix of one; -1: neither. */
static int json_judge(const char *s)
{
    long n = (long)strlen(s), r = j_value(s, 0, n);
    return r == n ? 1 : r == -2 ? 0 : -1;
}

/* Every choice of every seed, under every sampler setting and with logit
 * bias, in one continuous batch: a stopped choice is a string of the
 * grammar, a cut one (max_tokens) a prefix of one; choice i of an n-choice
 * job equals a one-choice job seeded +i (the fork copies the grammar state). */
TEST(grammar_every_choice_in_the_language)
{
    srv_engine_opts_t o = {.max_batch = 16};
    srv_engine_t *e = engine(tiny_lin, &o);
    if (!e)
        return;
    static const char *const grammars[] = {"root ::= \"yes\" | \"no\"", JSON_GRAMMAR};
    core_rng_t r;
    core_rng_seed(&r, 151);
    int stopped[2] = {0, 0}, total[2] = {0, 0};
    for (int gi = 0; gi < 2; gi++) {
        core_grammar_t *g = NULL;
        core_error_t ce = {0};
        CHECK_MSG(core_grammar_new(grammars[gi], strlen(grammars[gi]),
                                   srv_engine_grammar_vocab(e), NULL, &g, &ce) == 0,
                  "%s", ce.msg);
        if (!g)
            continue;
        for (int round = 0; round < 6; round++) {
            enum { J = 4, L = 8 };
            srv_job_t *jobs[J];
            out_t *outs[J];
            srv_seq_ctx_t cs[J];
            int32_t p[J][L];
            core_sample_params_t p0; /* job 0's */
            core_sample_params_default(&p0);
            srv_engine_hold(e, 1);
            for (int i = 0; i < J; i++) {
                rand_tokens(&r, p[i], L);
                ctx_init(&cs[i], tiny_lin);
                outs[i] = out_new();
                srv_job_spec_t sp;
                greedy_spec(&sp, &cs[i], p[i], L, gi == 0 ? 8 : 48);
                sp.ignore_eos = 0;
                sp.grammar = g;
                sp.reseed = 1;
                sp.n_choices = MAXC;
                sp.params.temperature = 1.0f;
                sp.params.seed = (uint64_t)(round * 100 + i * 10);
                switch (i) {
                case 1: sp.params.top_k = 40, sp.params.top_p = 0.9f; break;
                case 2: sp.params.min_p = 0.05f, sp.params.repeat_penalty = 1.3f; break;
                case 3:
                    sp.params.presence_penalty = 1.0f, sp.params.frequency_penalty = 0.5f;
                    sp.params.temperature = 1.7f;
                    break;
                default: break;
                }
                /* a bias pushing tokens the grammar may not allow */
                sp.params.n_bias = 8;
                for (int b = 0; b < 8; b++)
                    sp.params.bias[b] = (core_logit_bias_t){
                        (int32_t)(core_rng_u64(&r) % (uint64_t)V), b & 1 ? 100.0f : -5.0f};
                if (i == 0)
                    p0 = sp.params;
                jobs[i] = submit(e, &sp);
            }
            srv_engine_hold(e, 0);
            for (int i = 0; i < J; i++) {
                CHECK(jobs[i] && collect(jobs[i], outs[i]));
                srv_job_release(jobs[i]);
                for (int c = 0; c < MAXC; c++) {
                    const char *t = outs[i]->text[c];
                    srv_finish_t f = outs[i]->finish[c];
                    total[gi]++;
                    CHECK_MSG(f == SRV_FINISH_STOP || f == SRV_FINISH_LENGTH,
                              "grammar %d job %d choice %d: finish %d (%s)", gi, i, c, (int)f,
                              outs[i]->res.error);
                    int judged = gi == 0 ? (strcmp(t, "yes") == 0 || strcmp(t, "no") == 0 ? 1
                                            : strncmp("yes", t, strlen(t)) == 0 ||
                                                    strncmp("no", t, strlen(t)) == 0
                                                ? 0
                                                : -1)
                                         : json_judge(t);
                    CHECK_MSG(f == SRV_FINISH_STOP ? judged == 1 : judged >= 0,
                              "grammar %d job %d choice %d (finish %d): '%s'", gi, i, c, (int)f,
                              t);
                    stopped[gi] += f == SRV_FINISH_STOP;
                }
            }
            /* the fork: choice 2 of job 0 alone, seeded +2 */
            {
                srv_seq_ctx_t c;
                ctx_init(&c, tiny_lin);
                out_t *one = out_new();
                srv_job_spec_t sp;
                greedy_spec(&sp, &c, p[0], L, gi == 0 ? 8 : 48);
                sp.ignore_eos = 0;
                sp.grammar = g;
                sp.reseed = 1;
                sp.params = p0;
                sp.params.seed += 2;
                CHECK(run(e, &sp, one));
                CHECK(same_tokens(one->tok[0], one->n[0], outs[0]->tok[2], outs[0]->n[2]));
                ctx_fini(&c);
                free(one);
            }
            for (int i = 0; i < J; i++) {
                ctx_fini(&cs[i]);
                free(outs[i]);
            }
        }
        core_grammar_free(g);
    }
    printf("  yes/no: %d of %d choices stopped; json: %d of %d stopped (the rest cut by "
           "max_tokens)\n",
           stopped[0], total[0], stopped[1], total[1]);
    CHECK_INT_EQ(stopped[0], total[0]);
    CHECK(stopped[1] > 0);
    srv_engine_free(e);
}

/* opts.max_input bounds what one job gives the model to read, its context's
 * pending tokens included: more is ECONTEXT before anything is queued (a
 * 900 KB prefix once prefilled for minutes); as much is taken. */
TEST(input_budget)
{
    srv_engine_opts_t o = {.max_input = 10};
    srv_engine_t *e = engine(tiny_lin, &o);
    if (!e)
        return;
    int32_t p[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    srv_seq_ctx_t c;
    ctx_init(&c, tiny_lin);
    CHECK_INT_EQ(srv_seq_ctx_set_pending(&c, p, 3), 0);
    srv_job_spec_t sp;
    greedy_spec(&sp, &c, p, 8, 2);
    srv_job_t *x = NULL;
    char err[256] = "";
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_ECONTEXT);
    CHECK(x == NULL);
    CHECK_MSG(strstr(err, "the input is 11 tokens (3 pending in the context, 8 new)") &&
                  strstr(err, "over the 10"),
              "%s", err);
    CHECK_INT_EQ(c.n_pending, 3); /* untouched */
    CHECK_INT_EQ(core_attn_state_pos(c.state), 0);
    /* ingest-only jobs (a prefix, an append) too */
    greedy_spec(&sp, &c, p, 8, 0);
    CHECK_INT_EQ(srv_engine_submit(e, &sp, &x, err, sizeof err), SRV_ENGINE_ECONTEXT);
    /* exactly the budget runs */
    srv_seq_ctx_clear_pending(&c);
    greedy_spec(&sp, &c, p, 10, 2);
    out_t *ou = out_new();
    CHECK(run(e, &sp, ou));
    CHECK_INT_EQ(ou->n[0], 2);
    free(ou);
    ctx_fini(&c);
    srv_engine_free(e);
}

/* A bound the grammar meets while generating (past what core's probe
 * explored when compiling) ends the choice with "error" and marks the
 * result: the request's grammar, not the server, failed (the API answers
 * 400, not 500). */
TEST(grammar_bound_is_marked)
{
    srv_engine_t *e = engine(tiny_lin, NULL);
    if (!e)
        return;
    int32_t x_id = core_tokenizer_find(tok, "x", 1);
    CHECK(x_id >= 0);
    /* 2^n readings after n x's; max_probe 1 lets it compile */
    const char *amb = "root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"";
    core_grammar_limits_t lim = {.max_probe = 1};
    core_grammar_t *g = NULL;
    core_error_t ce = {0};
    CHECK(core_grammar_new(amb, strlen(amb), srv_engine_grammar_vocab(e), &lim, &g, &ce) == 0);
    srv_seq_ctx_t c;
    ctx_init(&c, tiny_lin);
    int32_t p[2] = {5, 6};
    srv_job_spec_t sp;
    greedy_spec(&sp, &c, p, 2, 40);
    sp.grammar = g;
    sp.params.bias[0].id = x_id; /* x, x, x, ... */
    sp.params.bias[0].bias = 100.0f;
    sp.params.n_bias = 1;
    srv_job_t *j = submit(e, &sp);
    out_t *ou = out_new();
    if (j)
        CHECK(collect(j, ou));
    const srv_job_result_t *res = j ? srv_job_result(j) : NULL;
    CHECK(res && res->finish[0] == SRV_FINISH_ERROR && res->grammar_bound == 1);
    CHECK_MSG(res && strstr(res->error, "too ambiguous"), "%s", res ? res->error : "");
    srv_job_release(j);
    free(ou);
    ctx_fini(&c);
    core_grammar_free(g);
    srv_engine_free(e);
}

int main(void)
{
    const char *path = getenv("DARKSERVE_TINY_MODEL");
    core_error_t err = {0};
    if (!path) {
        printf("DARKSERVE_TINY_MODEL is not set (run through make unit)\n");
        return 1;
    }
    srv_log_init(SRV_LOG_ERROR, SRV_LOG_FORMAT_TEXT, NULL, NULL, 0);
    core_model_opts_t lin = {.attn_kind = CORE_ATTN_PERFORMER};
    if (core_model_load(path, NULL, &tiny, &err) < 0 ||
        core_model_load(path, &lin, &tiny_lin, &err) < 0 ||
        core_tokenizer_from_gguf(core_model_gguf(tiny), &tok, &err) < 0) {
        printf("cannot load %s: %s\n", path, err.msg);
        return 1;
    }
    V = core_model_info(tiny)->n_vocab;
    RUN(eight_concurrent_jobs_batch_and_match_alone);
    RUN(long_prompt_prefills_beside_decoding_sequences);
    RUN(n_choices_equal_independent_seeds);
    RUN(stop_string_across_tokens);
    RUN(max_tokens_and_end_of_generation);
    RUN(ingest_only_advances_by_the_input);
    RUN(embedding_jobs_pool_the_hidden_rows);
    RUN(session_continuation_equals_full_history);
    RUN(cancel_ends_within_one_step);
    RUN(back_pressure_pauses_one_job);
    RUN(queue_full_and_bad_specs);
    RUN(timeout);
    RUN(stop_drains_then_cancels);
    RUN(snapshot_then_resume_equals_cold_prefill);
    RUN(snapshots_ready_before_done);
    RUN(grammar_every_choice_in_the_language);
    RUN(input_budget);
    RUN(grammar_bound_is_marked);
    core_tokenizer_free(tok);
    core_model_free(tiny);
    core_model_free(tiny_lin);
    return CHECK_DONE();
}
