/* core/sample.c — sampling pipeline, sampler state (de)serialization and the
 * stop-string matcher. Knows nothing of the model, tokenizer or server: it sees
 * V floats and a stream of bytes.
 *
 * Cost per sample for V logits: one copy/check/argmax pass, one expf pass for
 * the log-normalizer of the reported logprobs (shared with the weights when
 * nothing is filtered), one selection pass (a k-heap for top-k; for top-p
 * without top-k a bucketed pass that sorts one bucket, never the vocabulary)
 * and a k-heap pass for the n_logprobs alternatives.
 */
#include "core/sample.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/le.h"
#include "core/rng.h"
#include "core/crc32.h"
#include "core/kernels/vexp.h"

/* ---------------------------------------------------------------- params */

void core_sample_params_default(core_sample_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->n_logprobs = 0;
    p->no_logprob = 0;
}

int core_sample_params_validate(const core_sample_params_t *p, core_error_t *err)
{
    if (!p)
        return core_error_set(err, CORE_EINVAL, "sampling parameters are NULL");
    /* isfinite first so that NaN never slips through a range comparison. */
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return core_error_set(err, CORE_EINVAL, "temperature must be a finite number >= 0 (got %g)",
                              (double)p->temperature);
    if (p->top_k < 0)
        return core_error_set(err, CORE_EINVAL, "top_k must be >= 0 (got %d)", (int)p->top_k);
    if (!isfinite(p->top_p) || !(p->top_p > 0.0f && p->top_p <= 1.0f))
        return core_error_set(err, CORE_EINVAL, "top_p must be in (0, 1] (got %g)",
                              (double)p->top_p);
    if (!isfinite(p->min_p) || !(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return core_error_set(err, CORE_EINVAL, "min_p must be in [0, 1] (got %g)",
                              (double)p->min_p);
    if (!isfinite(p->repeat_penalty) || !(p->repeat_penalty > 0.0f))
        return core_error_set(err, CORE_EINVAL, "repeat_penalty must be a finite number > 0 (got %g)",
                              (double)p->repeat_penalty);
    if (p->repeat_last_n < -1 || p->repeat_last_n > CORE_SAMPLE_HISTORY)
        return core_error_set(err, CORE_EINVAL, "repeat_last_n must be in [-1, %d] (got %d)",
                              CORE_SAMPLE_HISTORY, (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty) ||
        !(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return core_error_set(err, CORE_EINVAL, "presence_penalty must be in [-2, 2] (got %g)",
                              (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty) ||
        !(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return core_error_set(err, CORE_EINVAL, "frequency_penalty must be in [-2, 2] (got %g)",
                              (double)p->frequency_penalty);
    if (p->n_logprobs < 0 || p->n_logprobs > CORE_SAMPLE_MAX_LOGPROBS)
        return core_error_set(err, CORE_EINVAL, "n_logprobs must be in [0, %d] (got %d)",
                              CORE_SAMPLE_MAX_LOGPROBS, (int)p->n_logprobs);
    if (p->no_logprob != 0 && p->no_logprob != 1)
        return core_error_set(err, CORE_EINVAL, "no_logprob must be 0 or 1 (got %d)",
                              (int)p->no_logprob);
    if (p->no_logprob && p->n_logprobs)
        return core_error_set(err, CORE_EINVAL, "no_logprob with %d alternatives asked for",
                              (int)p->n_logprobs);
    if (p->n_bias < 0 || p->n_bias > CORE_SAMPLE_MAX_BIAS)
        return core_error_set(err, CORE_EINVAL, "n_bias must be in [0, %d] (got %d)",
                              CORE_SAMPLE_MAX_BIAS, (int)p->n_bias);
    for (int32_t i = 0; i < p->n_bias; i++) {
        float b = p->bias[i].bias;
        if (p->bias[i].id < 0)
            return core_error_set(err, CORE_EINVAL, "bias[%d]: token id %d is negative", (int)i,
                                  (int)p->bias[i].id);
        if (!isfinite(b) || !(b >= -CORE_SAMPLE_BIAS_LIMIT && b <= CORE_SAMPLE_BIAS_LIMIT))
            return core_error_set(err, CORE_EINVAL, "bias[%d] must be in [-100, 100] (got %g)",
                                  (int)i, (double)b);
    }
    return 0;
}

/* ---------------------------------------------------------------- objects */

struct core_sampler {
    core_sample_params_t p;
    core_rng_t rng;
    int32_t ring[CORE_SAMPLE_HISTORY]; /* [CORE_SAMPLE_HISTORY] token ids */
    uint32_t head;                     /* next slot to write */
    uint32_t count;                    /* valid tokens, <= CORE_SAMPLE_HISTORY */
};

typedef struct cand {
    float z;
    int32_t id;
} cand_t;

struct core_sample_ws {
    int64_t cap;   /* V the buffers hold */
    float *z;      /* [V] penalized logits */
    float *w;      /* [V] unnormalized survivor weights (step 6) */
    float *wt;     /* [V] top-p: weights at the temperature, by id */
    int32_t *ids;  /* [V] survivor ids, ascending */
    cand_t *cand;  /* [V] selection buffer */
};

core_sample_ws_t *core_sample_ws_new(void)
{
    return calloc(1, sizeof(core_sample_ws_t));
}

void core_sample_ws_free(core_sample_ws_t *ws)
{
    if (!ws)
        return;
    free(ws->z);
    free(ws->w);
    free(ws->wt);
    free(ws->ids);
    free(ws->cand);
    free(ws);
}

static int ws_reserve(core_sample_ws_t *ws, int64_t V, core_error_t *err)
{
    if (ws->cap >= V)
        return 0;
    /* V <= CORE_SAMPLE_MAX_VOCAB was checked by the caller, so no product overflows. */
    size_t n = (size_t)V;
    float *z = malloc(n * sizeof *z);
    float *w = malloc(n * sizeof *w);
    float *wt = malloc(n * sizeof *wt);
    int32_t *ids = malloc(n * sizeof *ids);
    cand_t *cand = malloc(n * sizeof *cand);
    if (!z || !w || !wt || !ids || !cand) {
        free(z);
        free(w);
        free(wt);
        free(ids);
        free(cand);
        return core_error_set(err, CORE_ENOMEM, "sampling workspace for V=%lld", (long long)V);
    }
    free(ws->z);
    free(ws->w);
    free(ws->wt);
    free(ws->ids);
    free(ws->cand);
    ws->z = z;
    ws->w = w;
    ws->wt = wt;
    ws->ids = ids;
    ws->cand = cand;
    ws->cap = V;
    return 0;
}

int core_sampler_new(const core_sample_params_t *p, core_sampler_t **out, core_error_t *err)
{
    int rc;
    *out = NULL;
    if ((rc = core_sample_params_validate(p, err)) != 0)
        return rc;
    core_sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        return core_error_set(err, CORE_ENOMEM, "sampler");
    s->p = *p;
    core_rng_seed(&s->rng, p->seed);
    *out = s;
    return 0;
}

void core_sampler_free(core_sampler_t *s)
{
    free(s);
}

int core_sampler_clone(const core_sampler_t *s, core_sampler_t **out, core_error_t *err)
{
    *out = NULL;
    core_sampler_t *c = malloc(sizeof *c);
    if (!c)
        return core_error_set(err, CORE_ENOMEM, "sampler clone");
    *c = *s;
    *out = c;
    return 0;
}

int core_sampler_set_params(core_sampler_t *s, const core_sample_params_t *p, core_error_t *err)
{
    int rc = core_sample_params_validate(p, err);
    if (rc == 0)
        s->p = *p;
    return rc;
}

const core_sample_params_t *core_sampler_params(const core_sampler_t *s)
{
    return &s->p;
}

void core_sampler_seed(core_sampler_t *s, uint64_t seed)
{
    core_rng_seed(&s->rng, seed);
}

int core_sampler_accept(core_sampler_t *s, int32_t token, core_error_t *err)
{
    if (token < 0)
        return core_error_set(err, CORE_EINVAL, "token id %d is negative", (int)token);
    s->ring[s->head] = token;
    s->head = (s->head + 1) % CORE_SAMPLE_HISTORY;
    if (s->count < CORE_SAMPLE_HISTORY)
        s->count++;
    return 0;
}

void core_sampler_clear_history(core_sampler_t *s)
{
    memset(s->ring, 0, sizeof s->ring);
    s->head = 0;
    s->count = 0;
}

size_t core_sampler_history(const core_sampler_t *s, int32_t *out, size_t cap)
{
    size_t n = s->count;
    size_t first = (s->head + CORE_SAMPLE_HISTORY - n) % CORE_SAMPLE_HISTORY;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = s->ring[(first + i) % CORE_SAMPLE_HISTORY];
    return n;
}

/* ---------------------------------------------------------------- pipeline */

/* The total order of candidates: larger logit first, then smaller id. */
static int cand_better(cand_t a, cand_t b)
{
    return a.z > b.z || (a.z == b.z && a.id < b.id);
}

static int cand_cmp_desc(const void *pa, const void *pb)
{
    cand_t a = *(const cand_t *)pa, b = *(const cand_t *)pb;
    if (cand_better(a, b))
        return -1;
    return cand_better(b, a) ? 1 : 0;
}

static int cand_cmp_id(const void *pa, const void *pb)
{
    int32_t a = ((const cand_t *)pa)->id, b = ((const cand_t *)pb)->id;
    return (a > b) - (a < b);
}

static int i32_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* Min-heap on cand_better: the root is the worst of the kept. */
static void heap_sift_down(cand_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_better(h[m], h[l]))
            m = l;
        if (r < n && cand_better(h[m], h[r]))
            m = r;
        if (m == i)
            return;
        cand_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The k best of z[V] into out[k], sorted best first. O(V log k): most
 * elements are rejected by one comparison with the heap root. */
static void select_top(const float *z, int64_t V, size_t k, cand_t *out)
{
    assert(k >= 1 && (int64_t)k <= V); /* out[0] is the heap's root */
    for (size_t i = 0; i < k; i++)
        out[i] = (cand_t){z[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;)
        heap_sift_down(out, k, i);
    for (int64_t i = (int64_t)k; i < V; i++) {
        cand_t c = {z[i], (int32_t)i};
        if (cand_better(c, out[0])) {
            out[0] = c;
            heap_sift_down(out, k, 0);
        }
    }
    qsort(out, k, sizeof *out, cand_cmp_desc);
}

/* The maximum of z[V] and the lowest id holding it (0 when all are -inf):
 * the maximum by core_max_f32 (one running maximum waited on every
 * comparison: ~60 us over a 49,152-token vocabulary), then the first index
 * equal to it. */
static void argmax(const float *z, int64_t V, float *zmax, int32_t *best)
{
    const float m = core_max_f32(z, V);
    int32_t b = 0;
    for (int64_t i = 0; i < V && m > -INFINITY; i++)
        if (z[i] == m) {
            b = (int32_t)i;
            break;
        }
    *zmax = m;
    *best = b;
}

/* A finite logit moved past the float range stays at its edge. */
static float clamp_finite(double v)
{
    if (v > FLT_MAX)
        return FLT_MAX;
    if (v < -FLT_MAX && !isinf(v))
        return -FLT_MAX;
    return (float)v;
}

/* Step 1 on z[V]; 0 when it changed nothing. */
static int apply_penalties(const core_sampler_t *s, float *z, int64_t V)
{
    const core_sample_params_t *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return 0;
    size_t n = p->repeat_last_n < 0 ? CORE_SAMPLE_HISTORY : (size_t)p->repeat_last_n;
    int32_t win[CORE_SAMPLE_HISTORY];
    size_t have = core_sampler_history(s, win, CORE_SAMPLE_HISTORY);
    if (n > have)
        n = have;
    if (n == 0)
        return 0;
    /* The window is the newest n tokens; sorting them gives the counts. */
    int32_t *w = win + (have - n);
    qsort(w, n, sizeof *w, i32_cmp);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && w[j] == w[i])
            j++;
        int32_t t = w[i];
        double c = (double)(j - i);
        i = j;
        if ((int64_t)t >= V)
            continue;
        double v = z[t];
        if (v > 0)
            v /= p->repeat_penalty;
        else
            v *= p->repeat_penalty;
        v -= c * p->frequency_penalty + p->presence_penalty;
        /* A tiny repeat_penalty can push a finite logit past FLT_MAX. */
        z[t] = clamp_finite(v);
    }
    return 1;
}

/* Steps 0 and 1 on a copy of the logits, checking them and finding the
 * argmax on the way (lowest id on ties). */
static int load_logits(const core_sampler_t *s, const float *logits, int64_t V,
                       const uint64_t *allow, float *z, float *zmax, int32_t *best,
                       core_error_t *err)
{
    assert(V > 0); /* check_call; stated for the analyzer, which reads z[0] later */
    /* one vector pass for NaN and +inf (a scalar test per logit was most of
     * a greedy token's sampling), then a copy */
    const int64_t bad = core_first_unbounded_f32(logits, V);
    if (bad < V) {
        /* The constant is returned so that the analyzer sees *zmax is only
         * read on success. */
        core_error_set(err, CORE_EINVAL, "logits[%lld] is %s", (long long)bad,
                       isnan(logits[bad]) ? "NaN" : "+inf");
        return CORE_EINVAL;
    }
    if (!allow) {
        memcpy(z, logits, (size_t)V * sizeof *z);
    } else {
        for (int64_t i = 0; i < V; i++)
            z[i] = (allow[i >> 6] >> (i & 63)) & 1u ? logits[i] : -INFINITY;
    }
    argmax(z, V, zmax, best);
    const core_sample_params_t *p = &s->p;
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t t = p->bias[i].id;
        if ((int64_t)t < V && z[t] > -INFINITY)
            z[t] = clamp_finite((double)z[t] + (double)p->bias[i].bias);
    }
    /* Bias and penalties can move the maximum either way. */
    if (apply_penalties(s, z, V) || p->n_bias)
        argmax(z, V, zmax, best);
    return 0;
}

/* sum_V exp((z - zmax) * inv_t): the log-normalizer of every reported
 * logprob, one pass over the vocabulary per sampled token, through the
 * vectorized exponential (core/kernels/vexp.h; within 3e-7 of expf's). */
static double sum_exp(const float *z, int64_t V, float zmax, float inv_t)
{
    enum { BLOCK = 1024 };
    float y[BLOCK];
    double s = 0.0;
    for (int64_t i0 = 0; i0 < V; i0 += BLOCK) {
        const int64_t n = V - i0 < BLOCK ? V - i0 : BLOCK;
        for (int64_t j = 0; j < n; j++)
            y[j] = (z[i0 + j] - zmax) * inv_t;
        core_exp_shifted(y, n, 0.0, y);
        s += core_sum_f32(y, n);
    }
    return s;
}

/* Top-p without top-k, without sorting the vocabulary: the logits are
 * bucketed by their distance below the max (TOPP_BUCKETS buckets over
 * TOPP_RANGE nats, everything further down in the last one), the bucket where
 * the cumulative mass crosses p is found from the bucket masses, and only that
 * bucket is sorted to place the exact cut. The kept set is the one the sorted
 * definition gives; only the order in which the mass is summed differs, which
 * moves the cut only when the sum is within rounding of p. */
#define TOPP_BUCKETS 1024
#define TOPP_RANGE 64.0f

static size_t topp_bucket(float zmax, float z)
{
    float d = (zmax - z) * ((float)TOPP_BUCKETS / TOPP_RANGE); /* +inf for -inf logits */
    /* Through int: a float to unsigned 64-bit conversion is a slow sequence
     * on x86-64 without AVX-512. */
    return d < (float)(TOPP_BUCKETS - 1) ? (size_t)(int)d : TOPP_BUCKETS - 1;
}

static size_t top_p_alone(const core_sample_params_t *p, core_sample_ws_t *ws, int64_t V,
                          float zmax, float min_z, double *total, double *norm_t)
{
    const float *z = ws->z;
    float *w = ws->w;           /* [V] temperature-1 weights by id, then survivor weights */
    float inv_t = 1.0f / p->temperature;
    /* At T != 1 the weights at T are needed for the survivors and, over the
     * whole vocabulary, for the logprobs: computed here in the same pass. */
    float *wt = inv_t == 1.0f ? w : ws->wt;
    double mass[TOPP_BUCKETS];  /* [TOPP_BUCKETS] */
    double norm = 0.0, sum_t = 0.0;
    memset(mass, 0, sizeof mass);
    for (int64_t i = 0; i < V; i++) {
        float e = expf(z[i] - zmax);
        w[i] = e;
        norm += (double)e;
        mass[topp_bucket(zmax, z[i])] += (double)e;
    }
    if (wt != w)
        for (int64_t i = 0; i < V; i++) {
            float et = expf((z[i] - zmax) * inv_t);
            wt[i] = et;
            sum_t += (double)et;
        }
    *norm_t = wt == w ? norm : sum_t;
    double target = (double)p->top_p * norm, before = 0.0;
    size_t cb = 0;
    while (cb < TOPP_BUCKETS && before + mass[cb] < target)
        before += mass[cb++];
    /* Rounding can leave every bucket short of target: then all tokens stay. */
    cand_t cut = {-INFINITY, INT32_MAX};
    if (cb < TOPP_BUCKETS) {
        cand_t *c = ws->cand;
        size_t nb = 0;
        for (int64_t i = 0; i < V; i++)
            if (topp_bucket(zmax, z[i]) == cb)
                c[nb++] = (cand_t){z[i], (int32_t)i};
        qsort(c, nb, sizeof *c, cand_cmp_desc);
        double cum = before;
        cut = c[nb - 1];
        for (size_t i = 0; i < nb; i++) {
            cum += (double)w[c[i].id];
            if (cum >= target) {
                cut = c[i];
                break;
            }
        }
    }
    /* Survivors in id order: better than or equal to the cut, above the
     * min-p threshold, weighted at the temperature. Compaction writes index n
     * <= i, so w can be overwritten in place. */
    double sum = 0.0;
    size_t n = 0;
    for (int64_t i = 0; i < V; i++) {
        /* Branch-free compaction: about half the tokens survive in an
         * unpredictable pattern, and a branch here mispredicts constantly.
         * keep = (z_i, i) is not worse than the cut, and passes min-p. */
        float zi = z[i];
        int keep = ((zi > cut.z) | ((zi == cut.z) & ((int32_t)i <= cut.id))) & (zi >= min_z) &
                   (zi > -INFINITY);
        float e = wt[i];
        ws->ids[n] = (int32_t)i;
        w[n] = e;
        sum += (double)e * (double)keep; /* not ?: which compiles to a branch */
        n += (size_t)keep;
    }
    *total = sum;
    return n;
}

/* Steps 3-6 (non-greedy). Leaves the survivors in ws->ids / ws->w (ascending
 * id), returns their count and sets *total to sum(w). The argmax always
 * survives with weight 1, so the count is >= 1. *norm_t is set to
 * sum_V exp((z - zmax) / T) when that came for free (the logprobs'
 * normalizer, always >= 1), else to 0. */
static size_t build_survivors(const core_sample_params_t *p, core_sample_ws_t *ws, int64_t V,
                              float zmax, double *total, double *norm_t)
{
    const float *z = ws->z;
    float inv_t = 1.0f / p->temperature;
    /* z >= zmax + log(min_p) <=> p_i >= min_p * p_max; -inf when off. */
    float min_z = p->min_p > 0.0f ? zmax + logf(p->min_p) : -INFINITY;
    int use_k = p->top_k > 0 && (int64_t)p->top_k < V;
    int use_p = p->top_p < 1.0f;
    double sum = 0.0;
    size_t n = 0;

    *norm_t = 0.0;
    if (!use_k && !use_p) {
        /* Min-p alone is a threshold: no ordering needed. */
        for (int64_t i = 0; i < V; i++) {
            if (z[i] >= min_z && z[i] > -INFINITY) {
                float w = expf((z[i] - zmax) * inv_t);
                ws->ids[n] = (int32_t)i;
                ws->w[n] = w;
                sum += (double)w;
                n++;
            }
        }
        *total = sum;
        /* Nothing filtered: the normalizer itself (sum_exp gives it within
         * the vectorized exponential's rounding, 3e-7). */
        if (n == (size_t)V)
            *norm_t = sum;
        return n;
    }

    if (!use_k)
        return top_p_alone(p, ws, V, zmax, min_z, total, norm_t);

    /* Top-k by partial selection, then top-p over the k (llama.cpp
     * renormalizes over what top-k kept). */
    cand_t *c = ws->cand;
    size_t m = (size_t)p->top_k;
    select_top(z, V, m, c);
    if (use_p) {
        double norm = 0.0, cum = 0.0;
        for (size_t i = 0; i < m; i++)
            norm += (double)expf(c[i].z - zmax);
        double target = (double)p->top_p * norm;
        for (size_t i = 0; i < m; i++) {
            cum += (double)expf(c[i].z - zmax);
            if (cum >= target) {
                m = i + 1;
                break;
            }
        }
    }
    /* Min-p on a sorted prefix is a cut; the argmax (c[0]) always stays. */
    size_t keep = 1;
    while (keep < m && c[keep].z >= min_z)
        keep++;
    m = keep;
    qsort(c, m, sizeof *c, cand_cmp_id);
    for (size_t i = 0; i < m; i++) {
        if (!(c[i].z > -INFINITY))
            continue;
        float w = expf((c[i].z - zmax) * inv_t);
        ws->ids[n] = c[i].id;
        ws->w[n] = w;
        sum += (double)w;
        n++;
    }
    *total = sum;
    return n;
}

/* Temperatures so small that 1/T overflows would turn the argmax's weight
 * into 0 * inf = NaN; they mean "greedy" anyway. */
static int is_greedy(const core_sample_params_t *p)
{
    return p->temperature == 0.0f || !isfinite(1.0f / p->temperature);
}

static int check_call(const float *logits, int64_t V, core_error_t *err)
{
    if (!logits)
        return core_error_set(err, CORE_EINVAL, "logits are NULL");
    if (V <= 0 || V > CORE_SAMPLE_MAX_VOCAB)
        return core_error_set(err, CORE_EINVAL, "vocabulary size %lld is not in [1, %d]",
                              (long long)V, CORE_SAMPLE_MAX_VOCAB);
    return 0;
}

/* Checks, reserves, applies steps 0 and 1 and finds the argmax. */
static int prepare(const core_sampler_t *s, core_sample_ws_t *ws, const float *logits, int64_t V,
                   const uint64_t *allow, float *zmax, int32_t *best, core_error_t *err)
{
    int rc;
    if ((rc = check_call(logits, V, err)) != 0)
        return rc;
    if ((rc = ws_reserve(ws, V, err)) != 0)
        return rc;
    if ((rc = load_logits(s, logits, V, allow, ws->z, zmax, best, err)) != 0)
        return rc;
    if (!(*zmax > -INFINITY))
        return core_error_set(err, CORE_EINVAL, "%s",
                              allow ? "no allowed token has a finite logit" : "every logit is -inf");
    return 0;
}

int core_sampler_sample(core_sampler_t *s, core_sample_ws_t *ws, const float *logits, int64_t V,
                        core_sample_result_t *res, core_error_t *err)
{
    return core_sampler_sample_masked(s, ws, logits, V, NULL, res, err);
}

int core_sampler_sample_masked(core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                               int64_t V, const uint64_t *allow, core_sample_result_t *res,
                               core_error_t *err)
{
    float zmax;
    int32_t tok;
    int rc = prepare(s, ws, logits, V, allow, &zmax, &tok, err);
    if (rc)
        return rc;
    const core_sample_params_t *p = &s->p;
    int greedy = is_greedy(p);
    float inv_t = greedy ? 1.0f : 1.0f / p->temperature;
    double norm_t = 0.0; /* sum_V exp((z - zmax) / T); >= 1 once known */

    if (!greedy) {
        double total;
        size_t n = build_survivors(p, ws, V, zmax, &total, &norm_t);
        double target = core_rng_uniform(&s->rng) * total;
        double cum = 0.0;
        size_t pick = n;
        for (size_t i = 0; i < n; i++) {
            cum += (double)ws->w[i];
            if (cum > target) {
                pick = i;
                break;
            }
        }
        if (pick == n) {
            /* u * total rounded up to total: take the last token with weight. */
            pick = n - 1;
            while (pick > 0 && ws->w[pick] == 0.0f)
                pick--;
        }
        tok = ws->ids[pick];
    }

    res->token = tok;
    if (p->no_logprob) { /* nothing reported: no normalizer */
        res->logprob = NAN;
        res->n_top = 0;
        return core_sampler_accept(s, tok, err);
    }
    if (!(norm_t >= 1.0))
        norm_t = sum_exp(ws->z, V, zmax, inv_t);
    double log_norm = log(norm_t);
    res->logprob = (float)((double)((ws->z[tok] - zmax) * inv_t) - log_norm);
    size_t nt = (size_t)p->n_logprobs;
    if ((int64_t)nt > V)
        nt = (size_t)V;
    res->n_top = (int32_t)nt;
    if (nt) {
        cand_t top[CORE_SAMPLE_MAX_LOGPROBS];
        select_top(ws->z, V, nt, top);
        for (size_t i = 0; i < nt; i++) {
            res->top[i].id = top[i].id;
            res->top[i].logprob = (float)((double)((top[i].z - zmax) * inv_t) - log_norm);
        }
    }
    return core_sampler_accept(s, tok, err);
}

int core_sampler_dist(const core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                      int64_t V, int32_t *ids, double *probs, size_t cap, size_t *n_out,
                      core_error_t *err)
{
    return core_sampler_dist_masked(s, ws, logits, V, NULL, ids, probs, cap, n_out, err);
}

int core_sampler_dist_masked(const core_sampler_t *s, core_sample_ws_t *ws, const float *logits,
                             int64_t V, const uint64_t *allow, int32_t *ids, double *probs,
                             size_t cap, size_t *n_out, core_error_t *err)
{
    float zmax;
    int32_t best;
    int rc = prepare(s, ws, logits, V, allow, &zmax, &best, err);
    *n_out = 0;
    if (rc)
        return rc;
    if (is_greedy(&s->p)) {
        if (cap < 1)
            return core_error_set(err, CORE_ERANGE, "distribution needs 1 entry, cap is 0");
        ids[0] = best;
        probs[0] = 1.0;
        *n_out = 1;
        return 0;
    }
    double total;
    double norm_t;
    size_t n = build_survivors(&s->p, ws, V, zmax, &total, &norm_t);
    /* Survivors are distinct ids: stated for the analyzer, which does not
     * follow build_survivors far enough to see it. */
    assert(n <= (size_t)V);
    if (n > cap)
        return core_error_set(err, CORE_ERANGE, "distribution has %zu entries, cap is %zu", n, cap);
    for (size_t i = 0; i < n; i++) {
        ids[i] = ws->ids[i];
        probs[i] = (double)ws->w[i] / total;
    }
    *n_out = n;
    return 0;
}

/* ---------------------------------------------------------------- state */

#define STATE_VERSION 1u
#define STATE_HDR 48u
#define STATE_SIZE (STATE_HDR + 4u * CORE_SAMPLE_HISTORY + 4u)

/* Bytes, not a string: the blob holds no terminating NUL. */
static const unsigned char state_magic[4] = {'D', 'S', 'S', 'M'};

size_t core_sampler_state_size(void)
{
    return STATE_SIZE;
}

int core_sampler_state_save(const core_sampler_t *s, void *buf, size_t cap, core_error_t *err)
{
    if (!buf || cap < STATE_SIZE)
        return core_error_set(err, CORE_ERANGE, "sampler state needs %u bytes, buffer has %zu",
                              STATE_SIZE, buf ? cap : (size_t)0);
    unsigned char *b = buf;
    memset(b, 0, STATE_SIZE);
    memcpy(b, state_magic, sizeof state_magic);
    core_le_put_u32(b + 4, STATE_VERSION);
    core_le_put_u32(b + 8, CORE_SAMPLE_HISTORY);
    core_le_put_u32(b + 12, s->count);
    for (int i = 0; i < 4; i++)
        core_le_put_u64(b + 16 + 8 * (size_t)i, s->rng.s[i]);
    int32_t hist[CORE_SAMPLE_HISTORY];
    size_t n = core_sampler_history(s, hist, CORE_SAMPLE_HISTORY);
    for (size_t i = 0; i < n; i++)
        core_le_put_u32(b + STATE_HDR + 4 * i, (uint32_t)hist[i]);
    core_le_put_u32(b + STATE_SIZE - 4, core_crc32(0, b, STATE_SIZE - 4));
    return 0;
}

int core_sampler_state_load(core_sampler_t *s, const void *buf, size_t len, core_error_t *err)
{
    const unsigned char *b = buf;
    if (!buf || len != STATE_SIZE)
        return core_error_set(err, CORE_EFORMAT, "sampler state is %zu bytes, expected %u",
                              buf ? len : (size_t)0, STATE_SIZE);
    if (memcmp(b, state_magic, sizeof state_magic) != 0)
        return core_error_set(err, CORE_EFORMAT, "sampler state: bad magic");
    uint32_t ver = core_le_get_u32(b + 4);
    if (ver != STATE_VERSION)
        return core_error_set(err, CORE_EUNSUPPORTED, "sampler state version %u (supported: %u)",
                              ver, STATE_VERSION);
    uint32_t crc = core_le_get_u32(b + STATE_SIZE - 4), want = core_crc32(0, b, STATE_SIZE - 4);
    if (crc != want)
        return core_error_set(err, CORE_ECHECKSUM, "sampler state: crc32 %08x, computed %08x",
                              crc, want);
    uint32_t capacity = core_le_get_u32(b + 8), count = core_le_get_u32(b + 12);
    if (capacity != CORE_SAMPLE_HISTORY)
        return core_error_set(err, CORE_EFORMAT, "sampler state: history capacity %u, expected %d",
                              capacity, CORE_SAMPLE_HISTORY);
    if (count > capacity)
        return core_error_set(err, CORE_EFORMAT, "sampler state: %u tokens in a ring of %u", count,
                              capacity);
    core_rng_t rng;
    uint64_t any = 0;
    for (int i = 0; i < 4; i++)
        any |= rng.s[i] = core_le_get_u64(b + 16 + 8 * (size_t)i);
    if (!any)
        return core_error_set(err, CORE_EFORMAT, "sampler state: RNG state is all zero");
    int32_t ring[CORE_SAMPLE_HISTORY];
    for (uint32_t i = 0; i < CORE_SAMPLE_HISTORY; i++) { /* == capacity, checked above */
        uint32_t v = core_le_get_u32(b + STATE_HDR + 4 * (size_t)i);
        if (i < count && v > (uint32_t)INT32_MAX)
            return core_error_set(err, CORE_EFORMAT, "sampler state: token %u has id %u", i, v);
        if (i >= count && v != 0)
            return core_error_set(err, CORE_EFORMAT, "sampler state: unused slot %u is not zero", i);
        ring[i] = (int32_t)v;
    }
    s->rng = rng;
    memcpy(s->ring, ring, sizeof ring);
    s->count = count;
    s->head = count % CORE_SAMPLE_HISTORY;
    return 0;
}

/* ---------------------------------------------------------------- stop */

struct core_stop {
    size_t n;
    size_t maxlen;  /* longest stop string */
    size_t lens[CORE_STOP_MAX];
    char strs[CORE_STOP_MAX][CORE_STOP_MAX_LEN];
    char *buf;      /* [cap] emitted-by-last-call prefix, then held bytes */
    size_t cap;
    size_t len;     /* bytes in buf */
    size_t emitted; /* leading bytes of buf returned by the last call */
    int matched;
    int which;
};

int core_stop_new(const char *const *stops, const size_t *lens, size_t n, core_stop_t **out,
                  core_error_t *err)
{
    *out = NULL;
    if (n > CORE_STOP_MAX)
        return core_error_set(err, CORE_EINVAL, "%zu stop strings, at most %d", n, CORE_STOP_MAX);
    if (n && !stops)
        return core_error_set(err, CORE_EINVAL, "stop strings are NULL");
    core_stop_t *m = calloc(1, sizeof *m);
    if (!m)
        return core_error_set(err, CORE_ENOMEM, "stop matcher");
    for (size_t i = 0; i < n; i++) {
        if (!stops[i]) {
            free(m);
            return core_error_set(err, CORE_EINVAL, "stop[%zu] is NULL", i);
        }
        size_t l = lens ? lens[i] : strnlen(stops[i], CORE_STOP_MAX_LEN + 1);
        if (l == 0 || l > CORE_STOP_MAX_LEN) {
            free(m);
            return core_error_set(err, CORE_EINVAL, "stop[%zu] is %s (1..%d bytes)", i,
                                  l ? "too long" : "empty", CORE_STOP_MAX_LEN);
        }
        memcpy(m->strs[i], stops[i], l);
        m->lens[i] = l;
        if (l > m->maxlen)
            m->maxlen = l;
    }
    m->n = n;
    m->which = -1;
    *out = m;
    return 0;
}

void core_stop_free(core_stop_t *m)
{
    if (!m)
        return;
    free(m->buf);
    free(m);
}

void core_stop_reset(core_stop_t *m)
{
    m->len = 0;
    m->emitted = 0;
    m->matched = 0;
    m->which = -1;
}

size_t core_stop_pending(const core_stop_t *m)
{
    return m->len - m->emitted;
}

/* Drops the bytes the previous call returned (they are the caller's now). */
static void stop_compact(core_stop_t *m)
{
    if (m->emitted) {
        memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
        m->len -= m->emitted;
        m->emitted = 0;
    }
}

/* Is buf[j..len) a proper prefix of some stop string? */
static int stop_is_prefix(const core_stop_t *m, const char *tail, size_t tl)
{
    for (size_t i = 0; i < m->n; i++)
        if (tl < m->lens[i] && memcmp(tail, m->strs[i], tl) == 0)
            return 1;
    return 0;
}

int core_stop_feed(core_stop_t *m, const char *piece, size_t len, core_stop_result_t *res,
                   core_error_t *err)
{
    res->text = m->buf;
    res->len = 0;
    res->matched = m->matched;
    res->which = m->which;
    if (len > CORE_STOP_MAX_FEED)
        return core_error_set(err, CORE_EINVAL, "text piece of %zu bytes, at most %d", len,
                              CORE_STOP_MAX_FEED);
    if (len && !piece)
        return core_error_set(err, CORE_EINVAL, "text piece is NULL");
    if (m->matched)
        return 0;
    stop_compact(m);
    /* held < CORE_STOP_MAX_LEN and len <= CORE_STOP_MAX_FEED: no overflow. */
    if (m->len + len > m->cap) {
        size_t nc = m->cap ? m->cap : 512;
        while (nc < m->len + len)
            nc *= 2;
        char *nb = realloc(m->buf, nc);
        if (!nb)
            return core_error_set(err, CORE_ENOMEM, "stop matcher buffer of %zu bytes", nc);
        m->buf = nb;
        m->cap = nc;
    }
    if (len == 0)
        return 0; /* nothing new: the held bytes stay held */
    memcpy(m->buf + m->len, piece, len);
    m->len += len;
    res->text = m->buf;

    /* The held bytes contain no complete stop string, so the first match to
     * end is the earliest-ending occurrence in the whole buffer. */
    size_t best_end = SIZE_MAX, best_len = 0;
    int best = -1;
    for (size_t i = 0; i < m->n; i++) {
        const char *hit = memmem(m->buf, m->len, m->strs[i], m->lens[i]);
        if (!hit)
            continue;
        size_t end = (size_t)(hit - m->buf) + m->lens[i];
        if (end < best_end || (end == best_end && m->lens[i] > best_len)) {
            best_end = end;
            best_len = m->lens[i];
            best = (int)i;
        }
    }
    if (best >= 0) {
        m->matched = 1;
        m->which = best;
        res->len = best_end - best_len;
        res->matched = 1;
        res->which = best;
        m->emitted = m->len; /* nothing is held after a match */
        return 0;
    }
    /* Hold back from the earliest position whose tail could still grow into
     * a stop string; only tails shorter than the longest one can. */
    size_t safe = m->len;
    size_t from = m->len >= m->maxlen ? m->len - m->maxlen + 1 : 0;
    for (size_t j = from; j < m->len; j++) {
        if (stop_is_prefix(m, m->buf + j, m->len - j)) {
            safe = j;
            break;
        }
    }
    m->emitted = safe;
    res->len = safe;
    return 0;
}

void core_stop_flush(core_stop_t *m, core_stop_result_t *res)
{
    res->matched = m->matched;
    res->which = m->which;
    if (m->matched) {
        res->text = m->buf;
        res->len = 0;
        return;
    }
    stop_compact(m);
    res->text = m->buf;
    res->len = m->len;
    m->emitted = m->len;
}
