/* tests/unit/test_core_sample.c — sampling, sampler state and stop strings.
 *
 * The optimized pipeline (partial selection, float weights) is checked against
 * a naive reference written here from the definition in core/sample.h: full
 * sort, softmax in double. Where a decision of the two can legitimately differ
 * by rounding (a cumulative sum within 1e-6 of a threshold), the case is
 * counted and skipped, and the test checks that such cases stay rare.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/sample.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

/* ------------------------------------------------------------ reference */

typedef struct ref_cand {
    double z;
    int32_t id;
} ref_cand_t;

static int ref_cmp_desc(const void *pa, const void *pb)
{
    const ref_cand_t *a = pa, *b = pb;
    if (a->z != b->z)
        return a->z > b->z ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int ref_cmp_id(const void *pa, const void *pb)
{
    const ref_cand_t *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

/* Penalized logits (rounded to float: the pipeline's logits are floats).
 * hist: the history, oldest first. */
static void ref_penalize(const core_sample_params_t *p, const int32_t *hist, size_t nh,
                         const float *logits, int64_t V, double *z)
{
    size_t last = p->repeat_last_n < 0 ? CORE_SAMPLE_HISTORY : (size_t)p->repeat_last_n;
    if (nh > CORE_SAMPLE_HISTORY) {
        hist += nh - CORE_SAMPLE_HISTORY;
        nh = CORE_SAMPLE_HISTORY;
    }
    if (last > nh)
        last = nh;
    int *count = calloc((size_t)V, sizeof *count);
    for (size_t i = nh - last; i < nh; i++)
        if (hist[i] < V)
            count[hist[i]]++;
    for (int64_t i = 0; i < V; i++) {
        double v = logits[i];
        /* step 0: the bias, rounded to float like the logits it joins */
        for (int32_t b = 0; b < p->n_bias; b++)
            if (p->bias[b].id == i && !isinf(v))
                v = (float)(v + (double)p->bias[b].bias);
        if (count[i] > 0) {
            if (v > 0)
                v = v / p->repeat_penalty;
            else
                v = v * p->repeat_penalty;
            v = v - count[i] * (double)p->frequency_penalty - (double)p->presence_penalty;
        }
        z[i] = (float)v;
    }
    free(count);
}

typedef struct ref_dist {
    size_t n;
    int32_t ids[8192];
    double probs[8192];
    double margin; /* distance of the closest filter decision to its threshold */
} ref_dist_t;

static void ref_distribution(const core_sample_params_t *p, const int32_t *hist, size_t nh,
                             const float *logits, int64_t V, ref_dist_t *out)
{
    double *z = malloc((size_t)V * sizeof *z);
    ref_cand_t *c = malloc((size_t)V * sizeof *c);
    ref_penalize(p, hist, nh, logits, V, z);
    for (int64_t i = 0; i < V; i++)
        c[i] = (ref_cand_t){z[i], (int32_t)i};
    qsort(c, (size_t)V, sizeof *c, ref_cmp_desc);
    out->margin = INFINITY;
    size_t m = (size_t)V;
    if (p->temperature == 0.0f) {
        out->n = 1;
        out->ids[0] = c[0].id;
        out->probs[0] = 1.0;
        goto done;
    }
    if (p->top_k > 0 && (int64_t)p->top_k < V)
        m = (size_t)p->top_k;
    double zmax = c[0].z;
    if (p->top_p < 1.0f) {
        double s = 0;
        for (size_t i = 0; i < m; i++)
            s += exp(c[i].z - zmax);
        double cum = 0;
        for (size_t i = 0; i < m; i++) {
            cum += exp(c[i].z - zmax) / s;
            double d = fabs(cum - p->top_p);
            if (d < out->margin)
                out->margin = d;
            if (cum >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        double thr = zmax + log((double)p->min_p);
        size_t keep = 1;
        for (size_t i = 1; i < m; i++) {
            double d = fabs(c[i].z - thr);
            if (d < out->margin)
                out->margin = d;
        }
        while (keep < m && c[keep].z >= thr)
            keep++;
        m = keep;
    }
    size_t n = 0;
    qsort(c, m, sizeof *c, ref_cmp_id);
    double s = 0;
    for (size_t i = 0; i < m; i++) {
        if (isinf(c[i].z))
            continue;
        double w = exp((c[i].z - zmax) / p->temperature);
        out->ids[n] = c[i].id;
        out->probs[n] = w;
        s += w;
        n++;
    }
    for (size_t i = 0; i < n; i++)
        out->probs[i] /= s;
    out->n = n;
done:
    free(z);
    free(c);
}

/* Inverse CDF in id order; *margin = distance of u to the nearest boundary. */
static int32_t ref_draw(const ref_dist_t *d, double u, double *margin)
{
    double cum = 0;
    int32_t pick = -1;
    *margin = INFINITY;
    for (size_t i = 0; i < d->n; i++) {
        cum += d->probs[i];
        if (fabs(cum - u) < *margin)
            *margin = fabs(cum - u);
        if (pick < 0 && cum > u)
            pick = d->ids[i];
    }
    return pick < 0 ? d->ids[d->n - 1] : pick;
}

/* Log-softmax of the penalized logits over the whole vocabulary. */
static void ref_logprobs(const core_sample_params_t *p, const int32_t *hist, size_t nh,
                         const float *logits, int64_t V, double *lp)
{
    double *z = malloc((size_t)V * sizeof *z);
    ref_penalize(p, hist, nh, logits, V, z);
    double t = p->temperature > 0 ? p->temperature : 1.0, zmax = -INFINITY, s = 0;
    for (int64_t i = 0; i < V; i++)
        zmax = z[i] > zmax ? z[i] : zmax;
    for (int64_t i = 0; i < V; i++)
        s += exp((z[i] - zmax) / t);
    for (int64_t i = 0; i < V; i++)
        lp[i] = (z[i] - zmax) / t - log(s);
    free(z);
}

/* ------------------------------------------------------------ helpers */

static void random_logits(core_rng_t *r, float *x, int64_t V, double scale, int with_neg_inf)
{
    for (int64_t i = 0; i < V; i++)
        x[i] = (float)(scale * core_rng_normal(r));
    if (with_neg_inf && V > 2)
        for (int k = 0; k < 3; k++)
            x[core_rng_u64(r) % (uint64_t)V] = -INFINITY;
}

static core_sampler_t *new_sampler(const core_sample_params_t *p)
{
    core_sampler_t *s = NULL;
    core_error_t e = {0};
    int rc = core_sampler_new(p, &s, &e);
    CHECK_MSG(rc == 0, "core_sampler_new: %s", e.msg);
    return s;
}

/* ------------------------------------------------------------ tests */

TEST(test_defaults_valid)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    CHECK_INT_EQ(core_sample_params_validate(&p, NULL), 0);
    CHECK(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    CHECK(p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
}

#define BAD(name, stmt)                                        \
static void name(core_sample_params_t *p) { stmt; }
BAD(t_neg, p->temperature = -0.1f)
BAD(t_nan, p->temperature = NAN)
BAD(t_inf, p->temperature = INFINITY)
BAD(k_neg, p->top_k = -1)
BAD(p_zero, p->top_p = 0.0f)
BAD(p_big, p->top_p = 1.01f)
BAD(p_nan, p->top_p = NAN)
BAD(minp_neg, p->min_p = -0.01f)
BAD(minp_big, p->min_p = 1.5f)
BAD(minp_nan, p->min_p = NAN)
BAD(rep_zero, p->repeat_penalty = 0.0f)
BAD(rep_neg, p->repeat_penalty = -1.0f)
BAD(rep_nan, p->repeat_penalty = NAN)
BAD(last_n_low, p->repeat_last_n = -2)
BAD(last_n_high, p->repeat_last_n = CORE_SAMPLE_HISTORY + 1)
BAD(pres_low, p->presence_penalty = -2.5f)
BAD(pres_high, p->presence_penalty = 2.01f)
BAD(pres_nan, p->presence_penalty = NAN)
BAD(freq_low, p->frequency_penalty = -2.01f)
BAD(freq_high, p->frequency_penalty = 3.0f)
BAD(freq_nan, p->frequency_penalty = NAN)
BAD(lp_big, p->n_logprobs = 21)
BAD(lp_neg, p->n_logprobs = -1)
BAD(nolp_two, p->no_logprob = 2)
BAD(nolp_with_top, (p->no_logprob = 1, p->n_logprobs = 2))
#undef BAD

TEST(test_validation_names_field)
{
    struct bad {
        const char *field;
        void (*set)(core_sample_params_t *);
    };
    static const struct bad cases[] = {
        {"temperature", t_neg},     {"temperature", t_nan},     {"temperature", t_inf},
        {"top_k", k_neg},           {"top_p", p_zero},          {"top_p", p_big},
        {"top_p", p_nan},           {"min_p", minp_neg},        {"min_p", minp_big},
        {"min_p", minp_nan},        {"repeat_penalty", rep_zero}, {"repeat_penalty", rep_neg},
        {"repeat_penalty", rep_nan}, {"repeat_last_n", last_n_low},
        {"repeat_last_n", last_n_high}, {"presence_penalty", pres_low},
        {"presence_penalty", pres_high}, {"presence_penalty", pres_nan},
        {"frequency_penalty", freq_low}, {"frequency_penalty", freq_high},
        {"frequency_penalty", freq_nan}, {"n_logprobs", lp_big},   {"n_logprobs", lp_neg},
        {"no_logprob", nolp_two},   {"no_logprob", nolp_with_top},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_sample_params_t p;
        core_sample_params_default(&p);
        cases[i].set(&p);
        core_error_t e = {0};
        int rc = core_sample_params_validate(&p, &e);
        CHECK_MSG(rc == CORE_EINVAL, "case %zu (%s): rc %d", i, cases[i].field, rc);
        CHECK_MSG(strstr(e.msg, cases[i].field) != NULL, "case %zu: '%s' lacks '%s'", i, e.msg,
                  cases[i].field);
        /* The constructor and set_params refuse the same values. */
        core_sampler_t *s = NULL;
        CHECK(core_sampler_new(&p, &s, NULL) == CORE_EINVAL && s == NULL);
    }
    /* Boundary values that are allowed. */
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.repeat_last_n = -1;
    p.n_logprobs = CORE_SAMPLE_MAX_LOGPROBS;
    CHECK_INT_EQ(core_sample_params_validate(&p, NULL), 0);
    /* set_params leaves the sampler unchanged on error. */
    core_sampler_t *s = new_sampler(&p);
    core_sample_params_t bad = p;
    bad.top_p = 2.0f;
    CHECK_INT_EQ(core_sampler_set_params(s, &bad, NULL), CORE_EINVAL);
    CHECK(core_sampler_params(s)->top_p == 1.0f);
    core_sampler_free(s);
}

/* The optimized distribution and draw against the reference, over many
 * parameter combinations, vocabulary sizes, logit scales and histories. */
TEST(test_against_reference)
{
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const int32_t topks[] = {0, 1, 5, 40, 100000};
    static const float topps[] = {1.0f, 0.95f, 0.5f, 0.05f};
    static const float minps[] = {0.0f, 0.05f, 0.3f};
    static const float reps[] = {1.0f, 1.3f, 0.8f};
    static const float press[] = {0.0f, 0.5f, -1.0f};
    static const float freqs[] = {0.0f, 0.3f, -0.7f};
    static const int32_t lastns[] = {-1, 0, 8, 64};
    static const int64_t vs[] = {1, 7, 100, 1000, 6000};
    static const double scales[] = {0.3, 2.0, 8.0};
    core_rng_t r;
    core_rng_seed(&r, 12345);
    core_sample_ws_t *ws = core_sample_ws_new();
    float *logits = malloc(6000 * sizeof *logits);
    float *mlogits = malloc(6000 * sizeof *mlogits);
    char *masked = calloc(6000, 1);
    int32_t *ids = malloc(8192 * sizeof *ids);
    double *probs = malloc(8192 * sizeof *probs);
    double *lp = malloc(6000 * sizeof *lp);
    ref_dist_t *ref = malloc(sizeof *ref);
    int32_t hist[400];
    int trials = 0, compared_dist = 0, compared_draw = 0, skipped = 0;

    for (int trial = 0; trial < 1500; trial++) {
        core_sample_params_t p;
        core_sample_params_default(&p);
        p.temperature = temps[core_rng_u64(&r) % 4];
        p.top_k = topks[core_rng_u64(&r) % 5];
        p.top_p = topps[core_rng_u64(&r) % 4];
        p.min_p = minps[core_rng_u64(&r) % 3];
        p.repeat_penalty = reps[core_rng_u64(&r) % 3];
        p.presence_penalty = press[core_rng_u64(&r) % 3];
        p.frequency_penalty = freqs[core_rng_u64(&r) % 3];
        p.repeat_last_n = lastns[core_rng_u64(&r) % 4];
        p.n_logprobs = (int32_t)(core_rng_u64(&r) % 21);
        p.seed = core_rng_u64(&r);
        int64_t V = vs[core_rng_u64(&r) % 5];
        double scale = scales[core_rng_u64(&r) % 3];
        core_sampler_t *s = new_sampler(&p);
        core_rng_t shadow;
        core_rng_seed(&shadow, p.seed);
        /* A history with repeats (small id range) and ids beyond V. */
        size_t nh = core_rng_u64(&r) % 300;
        int64_t range = V < 20 ? V + 3 : 20;
        for (size_t i = 0; i < nh; i++) {
            hist[i] = (int32_t)(core_rng_u64(&r) % (uint64_t)range);
            core_sampler_accept(s, hist[i], NULL);
        }
        /* logit bias on some tokens (ids past V too), a mask on some trials */
        int use_mask = core_rng_u64(&r) % 3 == 0;
        if (core_rng_u64(&r) % 3 == 0) {
            static const float biases[] = {-100.0f, 100.0f, -3.5f, 0.25f, 7.0f, -0.5f};
            p.n_bias = 1 + (int32_t)(core_rng_u64(&r) % 20);
            for (int32_t b = 0; b < p.n_bias; b++) {
                p.bias[b].id = (int32_t)(core_rng_u64(&r) % (uint64_t)(V + 5));
                p.bias[b].bias = biases[core_rng_u64(&r) % 6];
            }
            core_error_t e = {0};
            CHECK(core_sampler_set_params(s, &p, &e) == 0);
        }
        for (int step = 0; step < 3; step++) {
            random_logits(&r, logits, V, scale, step == 1);
            /* the mask keeps about 2/3 of the tokens and one finite logit at least; the
             * reference sees the masked tokens as -inf */
            uint64_t allow[(6000 + 63) / 64];
            if (use_mask) {
                memset(allow, 0, sizeof allow);
                int64_t keep = (int64_t)(core_rng_u64(&r) % (uint64_t)V);
                while (isinf(logits[keep]))
                    keep = (keep + 1) % V;
                for (int64_t i = 0; i < V; i++)
                    if (i == keep || core_rng_u64(&r) % 3 != 0)
                        allow[i / 64] |= 1ull << (i % 64);
                    else
                        masked[i] = 1;
                for (int64_t i = 0; i < V; i++)
                    mlogits[i] = masked[i] ? -INFINITY : logits[i];
                memset(masked, 0, (size_t)V);
            } else {
                memcpy(mlogits, logits, (size_t)V * sizeof *logits);
            }
            const uint64_t *mask = use_mask ? allow : NULL;
            ref_distribution(&p, hist, nh, mlogits, V, ref);
            size_t n = 0;
            core_error_t e = {0};
            int rc = core_sampler_dist_masked(s, ws, logits, V, mask, ids, probs, 8192, &n, &e);
            CHECK_MSG(rc == 0, "dist: %s", e.msg);
            trials++;
            if (ref->margin < 1e-6) {
                skipped++;
            } else {
                compared_dist++;
                int same = n == ref->n;
                for (size_t i = 0; same && i < n; i++)
                    same = ids[i] == ref->ids[i] && fabs(probs[i] - ref->probs[i]) < 1e-5;
                CHECK_MSG(same, "trial %d step %d: distribution differs (n %zu vs %zu)", trial,
                          step, n, ref->n);
            }
            /* The draw: the shadow RNG gives the same u the sampler uses. */
            double u = p.temperature > 0 ? core_rng_uniform(&shadow) : 0.0, dm = INFINITY;
            int32_t want = p.temperature > 0 ? ref_draw(ref, u, &dm) : ref->ids[0];
            ref_logprobs(&p, hist, nh, mlogits, V, lp);
            core_sample_result_t res;
            rc = core_sampler_sample_masked(s, ws, logits, V, mask, &res, &e);
            if (mask)
                CHECK((mask[res.token / 64] >> (res.token % 64)) & 1);
            CHECK_MSG(rc == 0, "sample: %s", e.msg);
            if (ref->margin >= 1e-6 && dm >= 1e-6) {
                compared_draw++;
                CHECK_MSG(res.token == want, "trial %d step %d: token %d, reference %d", trial,
                          step, res.token, want);
            }
            CHECK_NEAR(res.logprob, lp[res.token], 1e-4);
            int32_t nt = p.n_logprobs < V ? p.n_logprobs : (int32_t)V;
            CHECK_INT_EQ(res.n_top, nt);
            for (int32_t i = 0; i < res.n_top; i++) {
                if (isinf(lp[res.top[i].id]))
                    CHECK(res.top[i].logprob == -INFINITY);
                else
                    CHECK_NEAR(res.top[i].logprob, lp[res.top[i].id], 1e-4);
                if (i > 0) {
                    CHECK(res.top[i].logprob <= res.top[i - 1].logprob);
                    CHECK(res.top[i].id != res.top[i - 1].id);
                }
            }
            /* The alternatives are the best: nothing outside beats the last one. */
            if (res.n_top > 0) {
                double worst = lp[res.top[res.n_top - 1].id];
                int beaten = 0;
                for (int64_t i = 0; i < V; i++) {
                    int in = 0;
                    for (int32_t j = 0; j < res.n_top; j++)
                        in |= res.top[j].id == i;
                    if (!in && lp[i] > worst + 1e-6)
                        beaten = 1;
                }
                CHECK_MSG(!beaten, "trial %d: a token outside the top-%d is more likely", trial,
                          res.n_top);
            }
            hist[nh++] = res.token;
        }
        core_sampler_free(s);
    }
    CHECK_MSG(skipped * 100 < trials, "%d of %d cases too close to call", skipped, trials);
    CHECK(compared_draw > trials / 2);
    printf("  reference: %d cases, %d distributions and %d draws compared, %d skipped\n", trials,
           compared_dist, compared_draw, skipped);
    free(logits);
    free(mlogits);
    free(masked);
    free(ids);
    free(probs);
    free(lp);
    free(ref);
    core_sample_ws_free(ws);
}

/* Bias and mask by hand: +100 forces a token, -100 bans it, a mask beats
 * any bias, and no allowed finite logit is an error. */
TEST(test_bias_and_mask)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    float logits[5] = {0.0f, 1.0f, 2.0f, 3.0f, -INFINITY};
    core_sample_ws_t *ws = core_sample_ws_new();
    core_error_t e = {0};
    core_sample_result_t res;
    p.n_bias = 2;
    p.bias[0] = (core_logit_bias_t){0, 100.0f};
    p.bias[1] = (core_logit_bias_t){4, 100.0f}; /* -inf stays -inf */
    core_sampler_t *s = new_sampler(&p);
    for (int i = 0; i < 50; i++) {
        CHECK(core_sampler_sample(s, ws, logits, 5, &res, &e) == 0);
        CHECK(res.token == 0);
    }
    uint64_t allow = (1u << 1) | (1u << 2);
    for (int i = 0; i < 50; i++) {
        CHECK(core_sampler_sample_masked(s, ws, logits, 5, &allow, &res, &e) == 0);
        CHECK(res.token == 1 || res.token == 2);
    }
    p.temperature = 0.0f;
    p.bias[0] = (core_logit_bias_t){3, -100.0f};
    p.n_bias = 1;
    CHECK(core_sampler_set_params(s, &p, &e) == 0);
    CHECK(core_sampler_sample(s, ws, logits, 5, &res, &e) == 0 && res.token == 2);
    allow = 1u << 4; /* only the -inf token */
    CHECK(core_sampler_sample_masked(s, ws, logits, 5, &allow, &res, &e) == CORE_EINVAL);
    CHECK(strstr(e.msg, "no allowed token") != NULL);
    /* validation names the entry */
    p.bias[0].bias = 100.5f;
    CHECK(core_sampler_set_params(s, &p, &e) == CORE_EINVAL && strstr(e.msg, "bias[0]"));
    p.bias[0] = (core_logit_bias_t){-1, 1.0f};
    CHECK(core_sampler_set_params(s, &p, &e) == CORE_EINVAL);
    p.bias[0] = (core_logit_bias_t){1, NAN};
    CHECK(core_sampler_set_params(s, &p, &e) == CORE_EINVAL);
    p.n_bias = CORE_SAMPLE_MAX_BIAS + 1;
    CHECK(core_sampler_set_params(s, &p, &e) == CORE_EINVAL && strstr(e.msg, "n_bias"));
    core_sampler_free(s);
    core_sample_ws_free(ws);
}

/* Chi-square goodness of fit of the empirical frequencies of N draws against
 * the reference probabilities. With df = V - 1 = 7, P(chi2 > 24.32) = 0.001
 * for a correct sampler; the seeds are fixed, so the test is deterministic,
 * and a wrong distribution (a temperature slip, an off-by-one in the walk)
 * gives values in the hundreds or more at this N. */
static double chi_square(const core_sample_params_t *p, const float *logits, int64_t V, int N)
{
    ref_dist_t *ref = malloc(sizeof *ref);
    ref_distribution(p, NULL, 0, logits, V, ref);
    core_sampler_t *s = new_sampler(p);
    core_sample_ws_t *ws = core_sample_ws_new();
    long counts[8] = {0};
    for (int i = 0; i < N; i++) {
        core_sample_result_t res;
        core_sampler_sample(s, ws, logits, V, &res, NULL);
        counts[res.token]++;
    }
    double chi = 0;
    for (int64_t t = 0; t < V; t++) {
        double pr = 0;
        for (size_t i = 0; i < ref->n; i++)
            if (ref->ids[i] == t)
                pr = ref->probs[i];
        if (pr == 0) {
            CHECK_MSG(counts[t] == 0, "token %lld was filtered out but drawn %ld times",
                      (long long)t, counts[t]);
            continue;
        }
        double ex = pr * N;
        chi += (counts[t] - ex) * (counts[t] - ex) / ex;
    }
    core_sampler_free(s);
    core_sample_ws_free(ws);
    free(ref);
    return chi;
}

TEST(test_frequencies_match_softmax)
{
    static const float logits[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.seed = 2024;
    double chi = chi_square(&p, logits, 8, 200000);
    CHECK_MSG(chi < 24.32, "T=1 unfiltered: chi2 = %g (df 7, 0.1%% critical value 24.32)", chi);
    /* Exact softmax of the reference itself, so the comparison is with the
     * definition, not with another implementation of the same code. */
    double s = 0, pr3;
    for (int i = 0; i < 8; i++)
        s += exp(logits[i]);
    pr3 = exp(2.0) / s;
    ref_dist_t *ref = malloc(sizeof *ref);
    ref_distribution(&p, NULL, 0, logits, 8, ref);
    CHECK_NEAR(ref->probs[3], pr3, 1e-12);
    free(ref);

    /* With temperature and top-k: df = 3 - 1 = 2 survivors, critical 13.82. */
    p.temperature = 0.7f;
    p.top_k = 3;
    p.seed = 77;
    chi = chi_square(&p, logits, 8, 100000);
    CHECK_MSG(chi < 13.82, "T=0.7 top_k=3: chi2 = %g (df 2, 0.1%% critical value 13.82)", chi);

    /* A wrong distribution is detected: draws at T=1 scored against T=0.5
     * probabilities must fail the test by a wide margin. */
    core_sample_params_t q;
    core_sample_params_default(&q);
    q.seed = 5;
    core_sampler_t *smp = new_sampler(&q);
    core_sample_ws_t *ws = core_sample_ws_new();
    long counts[8] = {0};
    for (int i = 0; i < 200000; i++) {
        core_sample_result_t res;
        core_sampler_sample(smp, ws, logits, 8, &res, NULL);
        counts[res.token]++;
    }
    double z = 0, chi_wrong = 0;
    for (int i = 0; i < 8; i++)
        z += exp(logits[i] / 0.5);
    for (int i = 0; i < 8; i++) {
        double ex = exp(logits[i] / 0.5) / z * 200000;
        chi_wrong += (counts[i] - ex) * (counts[i] - ex) / ex;
    }
    CHECK_MSG(chi_wrong > 1000, "the chi-square test cannot tell T=1 from T=0.5 (%g)", chi_wrong);
    core_sampler_free(smp);
    core_sample_ws_free(ws);
}

TEST(test_greedy)
{
    core_rng_t r;
    core_rng_seed(&r, 9);
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.temperature = 0.0f;
    p.n_logprobs = 3;
    core_sampler_t *s = new_sampler(&p);
    core_sample_ws_t *ws = core_sample_ws_new();
    float x[1000];
    for (int it = 0; it < 50; it++) {
        random_logits(&r, x, 1000, 3.0, 0);
        int32_t best = 0;
        for (int i = 1; i < 1000; i++)
            if (x[i] > x[best])
                best = i;
        core_sample_result_t res;
        CHECK_INT_EQ(core_sampler_sample(s, ws, x, 1000, &res, NULL), 0);
        CHECK_INT_EQ(res.token, best);
        CHECK_INT_EQ(res.top[0].id, best);
        CHECK(res.top[0].logprob == res.logprob);
    }
    /* Ties: the lowest id wins, in the argmax and in the alternatives. */
    float tie[6] = {0.5f, 3.0f, -1.0f, 3.0f, 3.0f, 2.0f};
    core_sample_result_t res;
    CHECK_INT_EQ(core_sampler_sample(s, ws, tie, 6, &res, NULL), 0);
    CHECK_INT_EQ(res.token, 1);
    CHECK_INT_EQ(res.top[0].id, 1);
    CHECK_INT_EQ(res.top[1].id, 3);
    CHECK_INT_EQ(res.top[2].id, 4);
    /* Ties at every position of the four-lane maximum, and past it */
    for (int at = 0; at < 9; at++) {
        float t9[11];
        for (int i = 0; i < 11; i++)
            t9[i] = (float)i * 0.1f;
        t9[at] = t9[at + 2] = 5.0f;
        CHECK_INT_EQ(core_sampler_sample(s, ws, t9, 11, &res, NULL), 0);
        CHECK_MSG(res.token == at, "tie at %d: token %d", at, res.token);
    }
    /* Non-finite logits are refused, naming the first one */
    float bad[9] = {0, 1, 2, 3, 4, NAN, 6, 7, INFINITY};
    core_error_t e = {0};
    CHECK_INT_EQ(core_sampler_sample(s, ws, bad, 9, &res, &e), CORE_EINVAL);
    CHECK_MSG(strstr(e.msg, "logits[5] is NaN") != NULL, "%s", e.msg);
    bad[5] = 5.0f;
    CHECK_INT_EQ(core_sampler_sample(s, ws, bad, 9, &res, &e), CORE_EINVAL);
    CHECK_MSG(strstr(e.msg, "logits[8] is +inf") != NULL, "%s", e.msg);
    float none[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_INT_EQ(core_sampler_sample(s, ws, none, 5, &res, &e), CORE_EINVAL);
    CHECK_MSG(strstr(e.msg, "every logit is -inf") != NULL, "%s", e.msg);
    /* A temperature whose inverse overflows is greedy, not NaN. */
    core_sample_params_t tiny = p;
    tiny.temperature = 1e-45f;
    CHECK_INT_EQ(core_sampler_set_params(s, &tiny, NULL), 0);
    CHECK_INT_EQ(core_sampler_sample(s, ws, tie, 6, &res, NULL), 0);
    CHECK_INT_EQ(res.token, 1);
    CHECK(isfinite(res.logprob));
    tiny.temperature = 1e-30f; /* tiny but invertible: still a valid distribution */
    CHECK_INT_EQ(core_sampler_set_params(s, &tiny, NULL), 0);
    CHECK_INT_EQ(core_sampler_sample(s, ws, tie, 6, &res, NULL), 0);
    CHECK(res.token == 1 || res.token == 3 || res.token == 4);
    CHECK_INT_EQ(core_sampler_set_params(s, &p, NULL), 0);
    /* Greedy draws no random number: the RNG state is unchanged. */
    unsigned char a[2048], b[2048];
    size_t sz = core_sampler_state_size();
    CHECK(sz <= sizeof a);
    core_sampler_state_save(s, a, sizeof a, NULL);
    core_sampler_clear_history(s);
    core_sampler_sample(s, ws, tie, 6, &res, NULL);
    core_sampler_clear_history(s);
    core_sampler_state_save(s, b, sizeof b, NULL);
    CHECK(memcmp(a + 16, b + 16, 32) == 0);
    core_sampler_free(s);
    core_sample_ws_free(ws);
}

TEST(test_top_k_1_is_greedy)
{
    core_rng_t r;
    core_rng_seed(&r, 31);
    core_sample_params_t g, k1;
    core_sample_params_default(&g);
    g.temperature = 0.0f;
    core_sample_params_default(&k1);
    k1.temperature = 1.3f;
    k1.top_k = 1;
    k1.seed = 999;
    core_sampler_t *sg = new_sampler(&g), *sk = new_sampler(&k1);
    core_sample_ws_t *ws = core_sample_ws_new();
    float x[5000];
    for (int it = 0; it < 40; it++) {
        random_logits(&r, x, 5000, 2.0, it % 2);
        if (it == 3)
            x[17] = x[4000] = 100.0f; /* a tie at the top */
        core_sample_result_t a, b;
        CHECK_INT_EQ(core_sampler_sample(sg, ws, x, 5000, &a, NULL), 0);
        CHECK_INT_EQ(core_sampler_sample(sk, ws, x, 5000, &b, NULL), 0);
        CHECK_INT_EQ(a.token, b.token);
        if (it == 3)
            CHECK_INT_EQ(b.token, 17);
    }
    core_sampler_free(sg);
    core_sampler_free(sk);
    core_sample_ws_free(ws);
}

static void run_sequence(core_sampler_t *s, core_sample_ws_t *ws, uint64_t logit_seed, int n,
                         int32_t *out)
{
    core_rng_t r;
    core_rng_seed(&r, logit_seed);
    float *x = malloc(2000 * sizeof *x);
    for (int i = 0; i < n; i++) {
        random_logits(&r, x, 2000, 1.5, 0);
        core_sample_result_t res;
        core_sampler_sample(s, ws, x, 2000, &res, NULL);
        out[i] = res.token;
    }
    free(x);
}

TEST(test_seed_determinism_and_fork)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.9f;
    p.min_p = 0.01f;
    p.frequency_penalty = 0.4f;
    p.seed = 4242;
    core_sample_ws_t *ws = core_sample_ws_new();
    core_sampler_t *a = new_sampler(&p), *b = new_sampler(&p);
    int32_t ta[200], tb[200], tc[200];
    run_sequence(a, ws, 1, 200, ta);
    run_sequence(b, ws, 1, 200, tb);
    CHECK(memcmp(ta, tb, sizeof ta) == 0);
    /* Another seed gives another sequence. */
    p.seed = 4243;
    core_sampler_t *c = new_sampler(&p);
    run_sequence(c, ws, 1, 200, tc);
    CHECK(memcmp(ta, tc, sizeof ta) != 0);
    /* A fork continues exactly like the original. */
    core_sampler_t *f = NULL;
    CHECK_INT_EQ(core_sampler_clone(a, &f, NULL), 0);
    run_sequence(a, ws, 2, 100, ta);
    run_sequence(f, ws, 2, 100, tb);
    CHECK(memcmp(ta, tb, 100 * sizeof ta[0]) == 0);
    /* Reseeding restarts the stream (history aside: cleared too). */
    core_sampler_seed(c, 4242);
    core_sampler_clear_history(c);
    run_sequence(c, ws, 1, 200, tc);
    core_sampler_t *d = NULL;
    p.seed = 4242;
    CHECK_INT_EQ(core_sampler_new(&p, &d, NULL), 0);
    run_sequence(d, ws, 1, 200, ta);
    CHECK(memcmp(ta, tc, sizeof ta) == 0);
    core_sampler_free(a);
    core_sampler_free(b);
    core_sampler_free(c);
    core_sampler_free(d);
    core_sampler_free(f);
    core_sample_ws_free(ws);
}

/* no_logprob: the same tokens, greedy and sampled, penalties and bias on
 * (the normalizer it skips only ever reported), and nothing reported. */
TEST(test_no_logprob_same_tokens)
{
    for (int greedy = 0; greedy < 2; greedy++) {
        core_sample_params_t p;
        core_sample_params_default(&p);
        p.temperature = greedy ? 0.0f : 0.8f;
        p.top_k = greedy ? 0 : 40;
        p.frequency_penalty = 0.3f;
        p.n_bias = 1;
        p.bias[0] = (core_logit_bias_t){.id = 7, .bias = 2.0f};
        p.seed = 99;
        core_sample_ws_t *ws = core_sample_ws_new();
        core_sampler_t *a = new_sampler(&p);
        p.no_logprob = 1;
        core_sampler_t *b = new_sampler(&p);
        core_rng_t r;
        core_rng_seed(&r, 5);
        float x[2000];
        for (int i = 0; i < 150; i++) {
            random_logits(&r, x, 2000, 1.5, 0);
            core_sample_result_t ra, rb;
            CHECK_INT_EQ(core_sampler_sample(a, ws, x, 2000, &ra, NULL), 0);
            CHECK_INT_EQ(core_sampler_sample(b, ws, x, 2000, &rb, NULL), 0);
            CHECK_MSG(ra.token == rb.token, "greedy %d token %d: %d vs %d", greedy, i,
                      (int)ra.token, (int)rb.token);
            CHECK(isfinite(ra.logprob) && isnan(rb.logprob) && rb.n_top == 0);
        }
        core_sampler_free(a);
        core_sampler_free(b);
        core_sample_ws_free(ws);
    }
}

/* Hand-computed penalties, read back through the T=1 distribution. */
static void check_dist_is_softmax_of(core_sampler_t *s, core_sample_ws_t *ws, const float *x,
                                     int64_t V, const double *want_z)
{
    int32_t ids[16];
    double probs[16], sum = 0;
    size_t n = 0;
    CHECK_INT_EQ(core_sampler_dist(s, ws, x, V, ids, probs, 16, &n, NULL), 0);
    CHECK_INT_EQ(n, V);
    for (int64_t i = 0; i < V; i++)
        sum += exp(want_z[i]);
    for (size_t i = 0; i < n; i++) {
        CHECK_INT_EQ(ids[i], i);
        CHECK_NEAR(probs[i], exp(want_z[i]) / sum, 1e-6);
    }
}

TEST(test_penalties_by_hand)
{
    static const float x[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = -1;
    core_sampler_t *s = new_sampler(&p);
    core_sample_ws_t *ws = core_sample_ws_new();
    /* History 0, 1, 1, 3, 4, 9 (9 >= V: ignored). */
    static const int32_t h[] = {0, 1, 1, 3, 4, 9};
    for (size_t i = 0; i < 6; i++)
        core_sampler_accept(s, h[i], NULL);
    /* 0: 2/2 - 0.5 - 0.25 = 0.25        (count 1, positive: divided)
     * 1: -1*2 - 2*0.5 - 0.25 = -3.25    (count 2, negative: multiplied)
     * 2: 0.5                            (absent)
     * 3: 3/2 - 0.5 - 0.25 = 0.75
     * 4: 0*2 - 0.5 - 0.25 = -0.75       (zero stays zero under repeat) */
    static const double all[5] = {0.25, -3.25, 0.5, 0.75, -0.75};
    check_dist_is_softmax_of(s, ws, x, 5, all);
    /* Window of the last 3 tokens: 3, 4, 9. */
    p.repeat_last_n = 3;
    core_sampler_set_params(s, &p, NULL);
    static const double last3[5] = {2.0, -1.0, 0.5, 0.75, -0.75};
    check_dist_is_softmax_of(s, ws, x, 5, last3);
    /* Window 0: no penalty at all. */
    p.repeat_last_n = 0;
    core_sampler_set_params(s, &p, NULL);
    static const double none[5] = {2.0, -1.0, 0.5, 3.0, 0.0};
    check_dist_is_softmax_of(s, ws, x, 5, none);
    /* Only OpenAI penalties (negative ones reward repeats). */
    p.repeat_last_n = -1;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = -1.0f;
    p.presence_penalty = 2.0f;
    core_sampler_set_params(s, &p, NULL);
    /* 0: 2 + 1 - 2 = 1; 1: -1 + 2 - 2 = -1; 3: 3 + 1 - 2 = 2; 4: 0 + 1 - 2 = -1 */
    static const double oai[5] = {1.0, -1.0, 0.5, 2.0, -1.0};
    check_dist_is_softmax_of(s, ws, x, 5, oai);
    /* Greedy sees the penalties too: 3 was best, after a strong repeat
     * penalty 0 (2.0 -> 2.0/1, not in history now) wins. */
    core_sampler_clear_history(s);
    core_sampler_accept(s, 3, NULL);
    core_sample_params_default(&p);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    core_sampler_set_params(s, &p, NULL);
    core_sample_result_t res;
    CHECK_INT_EQ(core_sampler_sample(s, ws, x, 5, &res, NULL), 0);
    CHECK_INT_EQ(res.token, 0);
    /* ... and the reported logprob is under the penalized distribution. */
    double z = exp(2.0) + exp(-1.0) + exp(0.5) + exp(1.5) + exp(0.0);
    CHECK_NEAR(res.logprob, 2.0 - log(z), 1e-6);
    core_sampler_free(s);
    core_sample_ws_free(ws);
}

TEST(test_bad_logits)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    core_sampler_t *s = new_sampler(&p);
    core_sample_ws_t *ws = core_sample_ws_new();
    core_sample_result_t res;
    core_error_t e = {0};
    float x[4] = {0.0f, NAN, 1.0f, 2.0f};
    CHECK_INT_EQ(core_sampler_sample(s, ws, x, 4, &res, &e), CORE_EINVAL);
    CHECK(strstr(e.msg, "logits[1]") != NULL);
    x[1] = INFINITY;
    CHECK_INT_EQ(core_sampler_sample(s, ws, x, 4, &res, &e), CORE_EINVAL);
    float ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK_INT_EQ(core_sampler_sample(s, ws, ninf, 3, &res, &e), CORE_EINVAL);
    CHECK_INT_EQ(core_sampler_sample(s, ws, x, 0, &res, &e), CORE_EINVAL);
    CHECK_INT_EQ(core_sampler_sample(s, ws, NULL, 4, &res, &e), CORE_EINVAL);
    CHECK_INT_EQ(core_sampler_accept(s, -1, &e), CORE_EINVAL);
    int32_t h[4];
    CHECK_INT_EQ(core_sampler_history(s, h, 4), 0); /* failures appended nothing */
    /* -inf bans: never drawn. */
    float ban[4] = {-INFINITY, 0.0f, -INFINITY, 0.1f};
    for (int i = 0; i < 2000; i++) {
        CHECK_INT_EQ(core_sampler_sample(s, ws, ban, 4, &res, NULL), 0);
        CHECK(res.token == 1 || res.token == 3);
    }
    /* A tiny repeat penalty cannot produce +inf. */
    p.repeat_penalty = 1e-30f;
    p.temperature = 0.0f;
    core_sampler_set_params(s, &p, NULL);
    float big[3] = {1e10f, 5.0f, 1.0f};
    core_sampler_clear_history(s);
    core_sampler_accept(s, 0, NULL);
    CHECK_INT_EQ(core_sampler_sample(s, ws, big, 3, &res, &e), 0);
    CHECK_INT_EQ(res.token, 0);
    CHECK(isfinite(res.logprob));
    core_sampler_free(s);
    core_sample_ws_free(ws);
}

TEST(test_history_ring)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    core_sampler_t *s = new_sampler(&p);
    int32_t h[CORE_SAMPLE_HISTORY + 10];
    for (int32_t i = 0; i < 300; i++)
        core_sampler_accept(s, i, NULL);
    size_t n = core_sampler_history(s, h, sizeof h / sizeof h[0]);
    CHECK_INT_EQ(n, CORE_SAMPLE_HISTORY);
    CHECK_INT_EQ(h[0], 300 - CORE_SAMPLE_HISTORY);
    CHECK_INT_EQ(h[CORE_SAMPLE_HISTORY - 1], 299);
    core_sampler_free(s);
}

/* An independent table-driven CRC-32 (IEEE) to forge valid-checksum buffers. */
TEST(test_state_roundtrip_and_rejects)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    p.temperature = 0.8f;
    p.repeat_penalty = 1.2f;
    p.frequency_penalty = 0.3f;
    p.seed = 77;
    core_sample_ws_t *ws = core_sample_ws_new();
    core_sampler_t *a = new_sampler(&p);
    int32_t ta[300], tb[300];
    run_sequence(a, ws, 3, 300, ta); /* the ring wraps */
    size_t sz = core_sampler_state_size();
    CHECK_INT_EQ(sz, 48 + 4 * CORE_SAMPLE_HISTORY + 4);
    unsigned char *buf = malloc(sz + 1), *bad = malloc(sz + 1);
    CHECK_INT_EQ(core_sampler_state_save(a, buf, sz - 1, NULL), CORE_ERANGE);
    CHECK_INT_EQ(core_sampler_state_save(a, buf, sz, NULL), 0);
    CHECK(memcmp(buf, "DSSM", 4) == 0);
    CHECK_INT_EQ(buf[4], 1);
    /* Little-endian count field: 256 = 00 01 00 00. */
    CHECK(buf[12] == 0 && buf[13] == 1 && buf[14] == 0 && buf[15] == 0);

    /* Loaded into a sampler with another seed and history, it continues the
     * same tokens as the original. */
    core_sample_params_t q = p;
    q.seed = 1;
    core_sampler_t *b = new_sampler(&q);
    core_sampler_accept(b, 5, NULL);
    core_error_t e = {0};
    CHECK_INT_EQ(core_sampler_state_load(b, buf, sz, &e), 0);
    int32_t ha[CORE_SAMPLE_HISTORY], hb[CORE_SAMPLE_HISTORY];
    CHECK_INT_EQ(core_sampler_history(a, ha, CORE_SAMPLE_HISTORY), CORE_SAMPLE_HISTORY);
    CHECK_INT_EQ(core_sampler_history(b, hb, CORE_SAMPLE_HISTORY), CORE_SAMPLE_HISTORY);
    CHECK(memcmp(ha, hb, sizeof ha) == 0);
    run_sequence(a, ws, 4, 50, ta);
    run_sequence(b, ws, 4, 50, tb);
    CHECK(memcmp(ta, tb, 50 * sizeof ta[0]) == 0);

    /* A partial history round-trips too. */
    core_sampler_t *c = new_sampler(&p);
    core_sampler_accept(c, 7, NULL);
    core_sampler_accept(c, 8, NULL);
    core_sampler_state_save(c, bad, sz, NULL);
    core_sampler_clear_history(b);
    CHECK_INT_EQ(core_sampler_state_load(b, bad, sz, NULL), 0);
    CHECK_INT_EQ(core_sampler_history(b, hb, CORE_SAMPLE_HISTORY), 2);
    CHECK(hb[0] == 7 && hb[1] == 8);
    core_sampler_accept(b, 9, NULL); /* the ring continues after the loaded tokens */
    CHECK_INT_EQ(core_sampler_history(b, hb, CORE_SAMPLE_HISTORY), 3);
    CHECK(hb[2] == 9);

    /* Rejections; after each, b must be untouched. */
    unsigned char before[2048];
    core_sampler_state_save(b, before, sizeof before, NULL);
#define REJECT(len, code)                                                         \
    do {                                                                          \
        core_error_t e_ = {0};                                                    \
        CHECK_INT_EQ(core_sampler_state_load(b, bad, (len), &e_), (code));        \
        CHECK(e_.msg[0] != '\0');                                                 \
        unsigned char after_[2048];                                               \
        core_sampler_state_save(b, after_, sizeof after_, NULL);                  \
        CHECK(memcmp(before, after_, sz) == 0);                                   \
    } while (0)
    memcpy(bad, buf, sz);
    REJECT(sz - 1, CORE_EFORMAT); /* truncated */
    REJECT(0, CORE_EFORMAT);
    REJECT(sz + 1, CORE_EFORMAT); /* trailing garbage */
    CHECK_INT_EQ(core_sampler_state_load(b, NULL, sz, NULL), CORE_EFORMAT);
    /* Every single-bit flip anywhere is caught. */
    int missed = 0;
    for (size_t i = 0; i < sz; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(bad, buf, sz);
            bad[i] ^= (unsigned char)(1u << bit);
            if (core_sampler_state_load(b, bad, sz, NULL) == 0)
                missed++;
        }
    }
    CHECK_INT_EQ(missed, 0);
    memcpy(bad, buf, sz);
    bad[0] = 'X';
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* magic */
    memcpy(bad, buf, sz);
    put_le32(bad + 4, 2);
    reseal(bad, sz);
    REJECT(sz, CORE_EUNSUPPORTED); /* version */
    memcpy(bad, buf, sz);
    put_le32(bad + 8, 128);
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* capacity */
    memcpy(bad, buf, sz);
    put_le32(bad + 12, CORE_SAMPLE_HISTORY + 1);
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* count > capacity */
    memcpy(bad, buf, sz);
    put_le32(bad + 48 + 4 * 10, 0x80000000u);
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* negative token id */
    memcpy(bad, buf, sz);
    memset(bad + 16, 0, 32);
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* all-zero RNG */
    core_sampler_state_save(c, bad, sz, NULL);
    put_le32(bad + 48 + 4 * 5, 3);
    reseal(bad, sz);
    REJECT(sz, CORE_EFORMAT); /* garbage in an unused slot */
    /* A corrupted buffer is refused with a checksum error, not loaded. */
    memcpy(bad, buf, sz);
    bad[100] ^= 0x40;
    REJECT(sz, CORE_ECHECKSUM);
#undef REJECT
    free(buf);
    free(bad);
    core_sampler_free(a);
    core_sampler_free(b);
    core_sampler_free(c);
    core_sample_ws_free(ws);
}

/* ------------------------------------------------------------ stop strings */

typedef struct stop_run {
    char out[4096];
    size_t len;
    int matched, which;
} stop_run_t;

/* Feeds text split at the given cut points (ascending, inside text). */
static void stop_run(core_stop_t *m, const char *text, size_t tl, const size_t *cuts, size_t nc,
                     stop_run_t *r)
{
    core_stop_reset(m);
    r->len = 0;
    r->matched = 0;
    r->which = -1;
    size_t prev = 0;
    for (size_t i = 0; i <= nc; i++) {
        size_t end = i < nc ? cuts[i] : tl;
        core_stop_result_t res;
        CHECK_INT_EQ(core_stop_feed(m, text + prev, end - prev, &res, NULL), 0);
        if (res.len)
            memcpy(r->out + r->len, res.text, res.len);
        r->len += res.len;
        r->matched = res.matched;
        r->which = res.which;
        prev = end;
    }
    if (!r->matched) {
        core_stop_result_t res;
        core_stop_flush(m, &res);
        if (res.len)
            memcpy(r->out + r->len, res.text, res.len);
        r->len += res.len;
    }
}

/* Reference: the first byte position where some stop string ends; among
 * those ending there, the longest. */
static void stop_reference(const char *const *stops, size_t ns, const char *text, size_t tl,
                           stop_run_t *r)
{
    for (size_t end = 1; end <= tl; end++) {
        int best = -1;
        size_t bl = 0;
        for (size_t i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l <= end && memcmp(text + end - l, stops[i], l) == 0 && l > bl) {
                best = (int)i;
                bl = l;
            }
        }
        if (best >= 0) {
            memcpy(r->out, text, end - bl);
            r->len = end - bl;
            r->matched = 1;
            r->which = best;
            return;
        }
    }
    memcpy(r->out, text, tl);
    r->len = tl;
    r->matched = 0;
    r->which = -1;
}

static core_stop_t *new_stop(const char *const *stops, size_t n)
{
    core_stop_t *m = NULL;
    core_error_t e = {0};
    CHECK_MSG(core_stop_new(stops, NULL, n, &m, &e) == 0, "core_stop_new: %s", e.msg);
    return m;
}

static void feed_expect(core_stop_t *m, const char *piece, const char *emit, int matched)
{
    core_stop_result_t res;
    CHECK_INT_EQ(core_stop_feed(m, piece, strlen(piece), &res, NULL), 0);
    CHECK_MSG(res.len == strlen(emit) && memcmp(res.text, emit, res.len) == 0,
              "fed '%s': emitted '%.*s', expected '%s'", piece, (int)res.len, res.text, emit);
    CHECK_INT_EQ(res.matched, matched);
}

TEST(test_stop_across_tokens)
{
    static const char *const stops[] = {"\n\nUser:", "###"};
    core_stop_t *m = new_stop(stops, 2);
    feed_expect(m, "Hello", "Hello", 0);
    feed_expect(m, " wor", " wor", 0);
    feed_expect(m, "ld\n", "ld", 0); /* "\n" might start "\n\nUser:" */
    CHECK_INT_EQ(core_stop_pending(m), 1);
    feed_expect(m, "\nUs", "", 0);
    CHECK_INT_EQ(core_stop_pending(m), 4);
    feed_expect(m, "er: hi", "", 1); /* the stop string and what follows are dropped */
    core_stop_result_t res;
    CHECK_INT_EQ(core_stop_feed(m, "more", 4, &res, NULL), 0);
    CHECK(res.len == 0 && res.matched == 1 && res.which == 0);
    core_stop_flush(m, &res);
    CHECK(res.len == 0 && res.matched == 1);

    /* Held text is released once it can no longer become a stop string. */
    core_stop_reset(m);
    feed_expect(m, "a\n\nU", "a", 0);
    feed_expect(m, "x", "\n\nUx", 0);
    feed_expect(m, "#", "", 0);
    feed_expect(m, "#", "", 0);
    feed_expect(m, "!", "##!", 0);
    /* A stop inside one piece: text before it is emitted. */
    feed_expect(m, "ok### tail", "ok", 1);
    CHECK_INT_EQ(core_stop_feed(m, "", 0, &res, NULL), 0);
    CHECK(res.which == 1);

    /* Held text comes out at the end of generation. */
    core_stop_reset(m);
    feed_expect(m, "end\n\nUse", "end", 0);
    core_stop_flush(m, &res);
    CHECK(res.len == 5 && memcmp(res.text, "\n\nUse", 5) == 0 && !res.matched);
    core_stop_flush(m, &res);
    CHECK_INT_EQ(res.len, 0);

    /* At the very start. */
    core_stop_reset(m);
    feed_expect(m, "###", "", 1);
    core_stop_free(m);
}

TEST(test_stop_overlaps_and_multiple)
{
    /* "bce" ends before "abcd" could: it wins, and only "a" is emitted. */
    static const char *const s1[] = {"abcd", "bce"};
    core_stop_t *m = new_stop(s1, 2);
    feed_expect(m, "ab", "", 0);
    feed_expect(m, "c", "", 0);
    feed_expect(m, "e", "a", 1);
    core_stop_reset(m);
    feed_expect(m, "xabc", "x", 0);
    feed_expect(m, "d", "", 1);
    core_stop_result_t res;
    core_stop_feed(m, "", 0, &res, NULL);
    CHECK_INT_EQ(res.which, 0);
    core_stop_free(m);
    /* Same end: the longer stop string wins. */
    static const char *const s2[] = {"c", "abc"};
    m = new_stop(s2, 2);
    feed_expect(m, "zzabc", "zz", 1);
    core_stop_feed(m, "", 0, &res, NULL);
    CHECK_INT_EQ(res.which, 1);
    core_stop_free(m);
    /* Self-overlapping stop: "aab" in "aaab". */
    static const char *const s3[] = {"aab"};
    m = new_stop(s3, 1);
    feed_expect(m, "a", "", 0);
    feed_expect(m, "a", "", 0);
    feed_expect(m, "a", "a", 0);
    feed_expect(m, "b", "", 1);
    core_stop_free(m);
    /* No false positives: near misses pass through intact. */
    static const char *const s4[] = {"STOP", "\n\n"};
    m = new_stop(s4, 2);
    const char *text = "STO\nP ST OP S\nTOP STOPS";
    stop_run_t r;
    size_t cuts[3] = {3, 4, 10};
    stop_run(m, text, 18, cuts, 3, &r); /* up to "... S\nTOP" */
    CHECK(!r.matched && r.len == 18 && memcmp(r.out, text, 18) == 0);
    core_stop_free(m);
    /* No stop strings at all. */
    m = new_stop(NULL, 0);
    feed_expect(m, "anything\n", "anything\n", 0);
    core_stop_free(m);
}

TEST(test_stop_split_invariance_random)
{
    core_rng_t r;
    core_rng_seed(&r, 555);
    static const char alpha[] = "abc\n";
    char stops_buf[CORE_STOP_MAX][8];
    const char *stops[CORE_STOP_MAX];
    char text[200];
    stop_run_t want, got;
    int matched = 0;
    for (int trial = 0; trial < 3000; trial++) {
        size_t ns = 1 + core_rng_u64(&r) % 4;
        for (size_t i = 0; i < ns; i++) {
            size_t l = 1 + core_rng_u64(&r) % 5;
            for (size_t j = 0; j < l; j++)
                stops_buf[i][j] = alpha[core_rng_u64(&r) % 4];
            stops_buf[i][l] = '\0';
            stops[i] = stops_buf[i];
        }
        size_t tl = core_rng_u64(&r) % 60;
        for (size_t j = 0; j < tl; j++)
            text[j] = alpha[core_rng_u64(&r) % 4];
        stop_reference(stops, ns, text, tl, &want);
        matched += want.matched;
        core_stop_t *m = new_stop(stops, ns);
        /* Whole text, byte by byte, and random pieces: the same result. */
        size_t cuts[200], nc = 0;
        stop_run(m, text, tl, cuts, 0, &got);
        CHECK(got.len == want.len && memcmp(got.out, want.out, want.len) == 0 &&
              got.matched == want.matched && got.which == want.which);
        for (size_t j = 1; j < tl; j++)
            cuts[nc++] = j;
        stop_run(m, text, tl, cuts, nc, &got);
        CHECK(got.len == want.len && memcmp(got.out, want.out, want.len) == 0 &&
              got.matched == want.matched && got.which == want.which);
        nc = 0;
        for (size_t j = 1; j < tl; j++)
            if (core_rng_u64(&r) % 3 == 0)
                cuts[nc++] = j;
        stop_run(m, text, tl, cuts, nc, &got);
        CHECK_MSG(got.len == want.len && memcmp(got.out, want.out, want.len) == 0 &&
                      got.matched == want.matched && got.which == want.which,
                  "trial %d", trial);
        /* Whatever is held back is a proper prefix of some stop string. */
        core_stop_reset(m);
        for (size_t j = 0; j < tl; j++) {
            core_stop_result_t res;
            core_stop_feed(m, text + j, 1, &res, NULL);
            if (res.matched)
                break;
            size_t held = core_stop_pending(m);
            if (held) {
                const char *tail = text + j + 1 - held;
                int ok = 0;
                for (size_t i = 0; i < ns; i++)
                    ok |= held < strlen(stops[i]) && memcmp(tail, stops[i], held) == 0;
                CHECK(ok);
            }
        }
        core_stop_free(m);
    }
    CHECK(matched > 1000 && matched < 2900); /* both outcomes well exercised */
}

TEST(test_stop_validation)
{
    core_stop_t *m = NULL;
    core_error_t e = {0};
    static const char *const empty[] = {"ok", ""};
    CHECK_INT_EQ(core_stop_new(empty, NULL, 2, &m, &e), CORE_EINVAL);
    CHECK(m == NULL && strstr(e.msg, "stop[1]") != NULL);
    char longs[CORE_STOP_MAX_LEN + 2];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    const char *lp[1] = {longs};
    CHECK_INT_EQ(core_stop_new(lp, NULL, 1, &m, &e), CORE_EINVAL);
    CHECK(strstr(e.msg, "stop[0]") != NULL);
    longs[CORE_STOP_MAX_LEN] = '\0'; /* exactly the limit is fine */
    CHECK_INT_EQ(core_stop_new(lp, NULL, 1, &m, &e), 0);
    core_stop_free(m);
    const char *many[CORE_STOP_MAX + 1];
    for (int i = 0; i <= CORE_STOP_MAX; i++)
        many[i] = "x";
    CHECK_INT_EQ(core_stop_new(many, NULL, CORE_STOP_MAX + 1, &m, &e), CORE_EINVAL);
    CHECK_INT_EQ(core_stop_new(many, NULL, CORE_STOP_MAX, &m, &e), 0);
    core_stop_result_t res;
    CHECK_INT_EQ(core_stop_feed(m, "y", (size_t)CORE_STOP_MAX_FEED + 1, &res, &e), CORE_EINVAL);
    core_stop_free(m);
    /* Explicit lengths allow bytes a C string cannot hold. */
    static const char nul_stop[] = {'a', '\0', 'b'};
    const char *np[1] = {nul_stop};
    size_t nl[1] = {3};
    CHECK_INT_EQ(core_stop_new(np, nl, 1, &m, &e), 0);
    CHECK_INT_EQ(core_stop_feed(m, "xa\0bz", 5, &res, NULL), 0);
    CHECK(res.matched && res.len == 1 && res.text[0] == 'x');
    core_stop_free(m);
    core_stop_free(NULL);
    core_sampler_free(NULL);
    core_sample_ws_free(NULL);
}

int main(void)
{
    RUN(test_defaults_valid);
    RUN(test_validation_names_field);
    RUN(test_against_reference);
    RUN(test_bias_and_mask);
    RUN(test_frequencies_match_softmax);
    RUN(test_greedy);
    RUN(test_top_k_1_is_greedy);
    RUN(test_seed_determinism_and_fork);
    RUN(test_penalties_by_hand);
    RUN(test_bad_logits);
    RUN(test_history_ring);
    RUN(test_state_roundtrip_and_rejects);
    RUN(test_stop_across_tokens);
    RUN(test_stop_overlaps_and_multiple);
    RUN(test_stop_split_invariance_random);
    RUN(test_stop_validation);
    RUN(test_no_logprob_same_tokens);
    return CHECK_DONE();
}
