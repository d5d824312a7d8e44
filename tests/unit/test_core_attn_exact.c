/* Exact attention (core/attn/attn_exact.c) against a naive reference written here:
 * plain loops, double precision, the whole history kept by the test; with
 * sliding-window layers (Gemma 3), the reference masks keys older than the
 * window. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/attn/attn.h"
#include "core/rng.h"

typedef struct hist {
    int L, H, Hkv, Hd;
    int64_t W;  /* sliding window of the local layers, 0 = none */
    int period; /* layer l is global when l % period == period - 1 */
    int64_t n, cap;
    float *k, *v; /* [L][cap][Hkv*Hd] every key/value the sequence has seen */
} hist_t;

static void hist_init(hist_t *h, int L, int H, int Hkv, int Hd, int64_t cap)
{
    h->L = L;
    h->H = H;
    h->Hkv = Hkv;
    h->Hd = Hd;
    h->W = 0;
    h->period = 1;
    h->n = 0;
    h->cap = cap;
    h->k = calloc((size_t)L * (size_t)cap * (size_t)(Hkv * Hd), sizeof(float));
    h->v = calloc((size_t)L * (size_t)cap * (size_t)(Hkv * Hd), sizeof(float));
}

static void hist_free(hist_t *h)
{
    free(h->k);
    free(h->v);
}

static void hist_copy(hist_t *dst, const hist_t *src)
{
    hist_init(dst, src->L, src->H, src->Hkv, src->Hd, src->cap);
    dst->W = src->W;
    dst->period = src->period;
    size_t n = (size_t)src->L * (size_t)src->cap * (size_t)(src->Hkv * src->Hd) * sizeof(float);
    memcpy(dst->k, src->k, n);
    memcpy(dst->v, src->v, n);
    dst->n = src->n;
}

/* Naive causal GQA softmax attention of n new rows of layer l at position
 * h->n (the new k/v must already be stored in the history at [h->n, h->n+n)). */
static void naive(const hist_t *h, int l, int64_t n, const float *q, double *out)
{
    const int kvd = h->Hkv * h->Hd, qd = h->H * h->Hd;
    const float *K = h->k + (size_t)l * (size_t)h->cap * (size_t)kvd;
    const float *V = h->v + (size_t)l * (size_t)h->cap * (size_t)kvd;
    double *s = malloc((size_t)(h->n + n) * sizeof *s);
    const int local = h->W > 0 && l % h->period != h->period - 1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t ctx = h->n + i + 1;
        /* a local layer's query at position p sees keys p - W + 1 .. p */
        const int64_t lo = local && ctx - h->W > 0 ? ctx - h->W : 0;
        for (int hh = 0; hh < h->H; hh++) {
            const int hk = hh / (h->H / h->Hkv);
            double mx = -1e300;
            for (int64_t j = lo; j < ctx; j++) {
                double d = 0.0;
                for (int e = 0; e < h->Hd; e++)
                    d += (double)q[i * qd + hh * h->Hd + e] * K[j * kvd + hk * h->Hd + e];
                s[j] = d / sqrt((double)h->Hd);
                if (s[j] > mx)
                    mx = s[j];
            }
            double sum = 0.0;
            for (int64_t j = lo; j < ctx; j++) {
                s[j] = exp(s[j] - mx);
                sum += s[j];
            }
            for (int e = 0; e < h->Hd; e++) {
                double acc = 0.0;
                for (int64_t j = lo; j < ctx; j++)
                    acc += s[j] * V[j * kvd + hk * h->Hd + e];
                out[i * qd + hh * h->Hd + e] = acc / sum;
            }
        }
    }
    free(s);
}

static void fill(core_rng_t *r, float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * core_rng_normal(r));
}

/* Feeds n random tokens through every layer of s and the naive reference;
 * returns the largest |out - ref| / max(1, |ref|). */
static double step(core_attn_t *a, core_attn_state_t *s, hist_t *h, core_rng_t *r, int64_t n,
                   int *rc_out)
{
    const int qd = h->H * h->Hd, kvd = h->Hkv * h->Hd;
    float *q = malloc((size_t)n * (size_t)qd * sizeof *q);
    float *k = malloc((size_t)n * (size_t)kvd * sizeof *k);
    float *v = malloc((size_t)n * (size_t)kvd * sizeof *v);
    float *out = malloc((size_t)n * (size_t)qd * sizeof *out);
    double *ref = malloc((size_t)n * (size_t)qd * sizeof *ref);
    double worst = 0.0;
    core_error_t err = {0};
    int rc = core_attn_reserve(a, s, n, &err);
    for (int l = 0; rc == 0 && l < h->L; l++) {
        /* scale 2 gives peaked softmax rows, so a wrong key shows */
        fill(r, q, n * qd, 2.0);
        fill(r, k, n * kvd, 1.0);
        fill(r, v, n * kvd, 1.0);
        size_t off = ((size_t)l * (size_t)h->cap + (size_t)h->n) * (size_t)kvd;
        memcpy(h->k + off, k, (size_t)n * (size_t)kvd * sizeof(float));
        memcpy(h->v + off, v, (size_t)n * (size_t)kvd * sizeof(float));
        rc = core_attn_forward(a, s, l, n, q, k, v, out, &err);
        if (rc < 0)
            break;
        naive(h, l, n, q, ref);
        for (int64_t i = 0; i < n * qd; i++) {
            double sc = fabs(ref[i]) > 1.0 ? fabs(ref[i]) : 1.0;
            double d = fabs(out[i] - ref[i]) / sc;
            if (d > worst)
                worst = d;
        }
    }
    if (rc == 0) {
        core_attn_advance(s, n);
        h->n += n;
    } else {
        printf("  step: %s\n", err.msg);
    }
    *rc_out = rc;
    free(q);
    free(k);
    free(v);
    free(out);
    free(ref);
    return worst;
}

static core_attn_t *make_attn_swa(int L, int H, int Hkv, int Hd, int64_t max_ctx, int64_t W,
                                  int period)
{
    core_attn_cfg_t cfg = {.kind = CORE_ATTN_EXACT, .n_layer = L, .n_head = H, .n_head_kv = Hkv,
                           .head_dim = Hd, .max_ctx = max_ctx, .swa_window = W,
                           .swa_period = period};
    core_attn_t *a = NULL;
    core_error_t err = {0};
    if (core_attn_new(&cfg, NULL, &a, &err) < 0)
        printf("  core_attn_new: %s\n", err.msg);
    return a;
}

static core_attn_t *make_attn(int L, int H, int Hkv, int Hd, int64_t max_ctx)
{
    return make_attn_swa(L, H, Hkv, Hd, max_ctx, 0, 0);
}

static void check_shapes(int H, int Hkv, int Hd)
{
    const int L = 2;
    const int64_t cap = 700;
    core_attn_t *a = make_attn(L, H, Hkv, Hd, cap);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    hist_t h;
    hist_init(&h, L, H, Hkv, Hd, cap);
    core_rng_t r;
    core_rng_seed(&r, (uint64_t)(H * 100 + Hkv * 10 + Hd));
    /* prefill chunks, single decode steps, and a chunk longer than the
     * kernel's 256-row query block that also crosses a cache growth step */
    const int64_t chunks[] = {5, 1, 1, 7, 300, 1, 33, 1};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        int rc;
        double w = step(a, s, &h, &r, chunks[c], &rc);
        CHECK_INT_EQ(rc, 0);
        CHECK_MSG(w < 1e-5, "H=%d Hkv=%d Hd=%d chunk %zu: max rel diff %.3g", H, Hkv, Hd, c, w);
    }
    CHECK_INT_EQ(core_attn_state_pos(s), h.n);
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(matches_naive_mha)
{
    check_shapes(4, 4, 8);
}

TEST(matches_naive_gqa)
{
    check_shapes(4, 2, 16);
    check_shapes(6, 2, 8);
    check_shapes(3, 1, 64);
}

/* Sliding-window layers: local layers (all but every period-th) against the
 * masked reference, global ones against the full one, for windows shorter
 * and longer than a chunk, across the kernel's 256-row query blocks. */
static void check_window(int64_t W, int period)
{
    const int L = 4, H = 4, Hkv = 1, Hd = 32;
    const int64_t cap = 800;
    core_attn_t *a = make_attn_swa(L, H, Hkv, Hd, cap, W, period);
    CHECK(a != NULL);
    if (!a)
        return;
    for (int l = 0; l < L; l++)
        CHECK_INT_EQ(core_attn_layer_window(core_attn_config(a), l),
                     l % period == period - 1 ? 0 : W);
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    hist_t h;
    hist_init(&h, L, H, Hkv, Hd, cap);
    h.W = W;
    h.period = period;
    core_rng_t r;
    core_rng_seed(&r, (uint64_t)(W * 10 + period));
    const int64_t chunks[] = {3, 1, 1, 9, 300, 1, 1, 40, 1, 257, 1};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        int rc;
        double w = step(a, s, &h, &r, chunks[c], &rc);
        CHECK_INT_EQ(rc, 0);
        CHECK_MSG(w < 1e-5, "W=%lld period %d chunk %zu: max rel diff %.3g", (long long)W, period,
                  c, w);
    }
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(sliding_window_matches_masked_naive)
{
    check_window(7, 2);   /* layers 0 and 2 local, 1 and 3 global */
    check_window(64, 3);  /* layers 0, 1 local, 2 global, 3 local */
    check_window(512, 4); /* a window longer than any chunk but the 300 */
}

/* The masked reference is not the unmasked one: a test that would pass
 * with the window ignored proves nothing. */
TEST(sliding_window_changes_the_output)
{
    hist_t h;
    hist_init(&h, 1, 2, 1, 8, 64);
    core_rng_t r;
    core_rng_seed(&r, 3);
    core_attn_t *a = make_attn(1, 2, 1, 8, 64); /* no window */
    core_attn_state_t *s = NULL;
    CHECK(a != NULL);
    if (!a)
        return;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    h.W = 4; /* the reference masks, the attention does not */
    h.period = 2;
    int rc;
    double w = step(a, s, &h, &r, 20, &rc);
    CHECK_INT_EQ(rc, 0);
    CHECK_MSG(w > 1e-2, "window ignored, yet max rel diff only %.3g", w);
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(overflow_leaves_state_untouched)
{
    core_attn_t *a = make_attn(2, 4, 2, 8, 10);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    hist_t h;
    hist_init(&h, 2, 4, 2, 8, 10);
    core_rng_t r;
    core_rng_seed(&r, 7);
    int rc;
    double w = step(a, s, &h, &r, 8, &rc);
    CHECK_INT_EQ(rc, 0);
    CHECK(w < 1e-5);
    size_t bytes = core_attn_state_bytes(s);
    core_error_t err = {0};
    CHECK_INT_EQ(core_attn_reserve(a, s, 3, &err), CORE_ECONTEXT);
    CHECK_STR_EQ(err.msg, "context length 10 exceeded: have 8, need 11");
    /* the message's pos + n must not overflow for an absurd n */
    CHECK_INT_EQ(core_attn_reserve(a, s, INT64_MAX, &err), CORE_ECONTEXT);
    CHECK_STR_EQ(err.msg, "position 8 + 9223372036854775807 tokens exceeds the largest position "
                          "281474976710656");
    CHECK_INT_EQ(core_attn_state_pos(s), 8);
    CHECK_INT_EQ(core_attn_state_bytes(s), bytes);
    /* the remaining capacity is still usable and still correct */
    w = step(a, s, &h, &r, 2, &rc);
    CHECK_INT_EQ(rc, 0);
    CHECK(w < 1e-5);
    CHECK_INT_EQ(core_attn_state_pos(s), 10);
    CHECK_INT_EQ(core_attn_reserve(a, s, 1, &err), CORE_ECONTEXT);
    CHECK_INT_EQ(core_attn_reserve(a, s, 0, &err), 0);
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(forward_without_reserve_is_refused)
{
    core_attn_t *a = make_attn(1, 2, 1, 4, 100);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    float q[8] = {0}, k[4] = {0}, v[4] = {0}, out[8];
    core_error_t err = {0};
    CHECK_INT_EQ(core_attn_forward(a, s, 0, 1, q, k, v, out, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "not reserved") != NULL);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(memory_grows_lazily)
{
    /* a million-token capacity must not be allocated up front */
    core_attn_t *a = make_attn(4, 4, 2, 16, 1000000);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    size_t b0 = core_attn_state_bytes(s);
    CHECK(b0 < 1024);
    hist_t h;
    hist_init(&h, 4, 4, 2, 16, 600);
    core_rng_t r;
    core_rng_seed(&r, 3);
    int rc;
    step(a, s, &h, &r, 3, &rc);
    CHECK_INT_EQ(rc, 0);
    const size_t per_token = 2 * 4 * 2 * 16 * sizeof(float); /* K and V, all layers */
    size_t b1 = core_attn_state_bytes(s);
    CHECK(b1 >= 3 * per_token);
    CHECK(b1 <= b0 + 256 * per_token + 1024);
    step(a, s, &h, &r, 500, &rc);
    CHECK_INT_EQ(rc, 0);
    size_t b2 = core_attn_state_bytes(s);
    CHECK(b2 >= 503 * per_token);
    CHECK(b2 <= b0 + 1024 * per_token + 1024);
    /* the exact kind writes its cache as it grows: held is its size, and
     * it cannot say before a state exists (the server then uses its bound) */
    CHECK_INT_EQ(core_attn_state_bytes_held(s), b2);
    CHECK_INT_EQ(core_attn_bytes_held_at(a, 503), 0);
    core_attn_state_reset(s);
    CHECK_INT_EQ(core_attn_state_pos(s), 0);
    CHECK_INT_EQ(core_attn_state_bytes(s), b0);
    /* usable again after reset, from position 0 */
    hist_free(&h);
    hist_init(&h, 4, 4, 2, 16, 600);
    double w = step(a, s, &h, &r, 9, &rc);
    CHECK_INT_EQ(rc, 0);
    CHECK(w < 1e-5);
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(copy_forks_the_cache)
{
    core_attn_t *a = make_attn(2, 4, 2, 8, 1000);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL, *f = NULL, *big = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    CHECK_INT_EQ(core_attn_state_new(a, &f, NULL), 0);
    CHECK_INT_EQ(core_attn_state_new(a, &big, NULL), 0);
    hist_t h, hf, hb;
    hist_init(&h, 2, 4, 2, 8, 1000);
    core_rng_t r;
    core_rng_seed(&r, 11);
    int rc;
    step(a, s, &h, &r, 40, &rc);
    CHECK_INT_EQ(rc, 0);
    /* big already holds a longer cache: the copy must still be exact */
    hist_init(&hb, 2, 4, 2, 8, 1000);
    step(a, big, &hb, &r, 600, &rc);
    CHECK_INT_EQ(rc, 0);
    hist_free(&hb);
    CHECK_INT_EQ(core_attn_state_copy(f, s, NULL), 0);
    CHECK_INT_EQ(core_attn_state_copy(big, s, NULL), 0);
    CHECK_INT_EQ(core_attn_state_pos(f), 40);
    CHECK_INT_EQ(core_attn_state_pos(big), 40);
    hist_copy(&hf, &h);
    hist_copy(&hb, &h);
    /* the three continue with different tokens; each matches its own history */
    double w1 = step(a, s, &h, &r, 5, &rc);
    CHECK_INT_EQ(rc, 0);
    double w2 = step(a, f, &hf, &r, 1, &rc);
    CHECK_INT_EQ(rc, 0);
    double w3 = step(a, big, &hb, &r, 3, &rc);
    CHECK_INT_EQ(rc, 0);
    double w4 = step(a, f, &hf, &r, 7, &rc);
    CHECK_INT_EQ(rc, 0);
    CHECK(w1 < 1e-5 && w2 < 1e-5 && w3 < 1e-5 && w4 < 1e-5);
    hist_free(&h);
    hist_free(&hf);
    hist_free(&hb);
    core_attn_state_free(s);
    core_attn_state_free(f);
    core_attn_state_free(big);
    core_attn_free(a);
}

/* A context long enough that the kernel takes fewer than 256 query rows per
 * score block (its scratch bound), so blocks of an odd size tile the chunk;
 * sampled rows are checked against the naive reference. */
TEST(long_context_uses_smaller_blocks)
{
    enum { L = 1, H = 2, HKV = 1, HD = 4, N = 16500 };
    core_attn_t *a = make_attn(L, H, HKV, HD, N);
    CHECK(a != NULL);
    if (!a)
        return;
    core_attn_state_t *s = NULL;
    CHECK_INT_EQ(core_attn_state_new(a, &s, NULL), 0);
    hist_t h;
    hist_init(&h, L, H, HKV, HD, N);
    core_rng_t r;
    core_rng_seed(&r, 21);
    float *q = malloc((size_t)N * H * HD * sizeof *q);
    float *out = malloc((size_t)N * H * HD * sizeof *out);
    fill(&r, q, (int64_t)N * H * HD, 2.0);
    fill(&r, h.k, (int64_t)N * HKV * HD, 1.0);
    fill(&r, h.v, (int64_t)N * HKV * HD, 1.0);
    CHECK_INT_EQ(core_attn_reserve(a, s, N, NULL), 0);
    CHECK_INT_EQ(core_attn_forward(a, s, 0, N, q, h.k, h.v, out, NULL), 0);
    double worst = 0.0;
    const int64_t rows[] = {0, 1, 253, 254, 255, 256, 257, 508, 5000, N - 255, N - 2, N - 1};
    double ref[H * HD];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        /* the naive reference of row t alone: a history of t rows, one query */
        h.n = rows[i];
        naive(&h, 0, 1, q + rows[i] * H * HD, ref);
        for (int e = 0; e < H * HD; e++) {
            double d = fabs(out[rows[i] * H * HD + e] - ref[e]) / (fabs(ref[e]) > 1 ? fabs(ref[e]) : 1);
            worst = d > worst ? d : worst;
        }
    }
    CHECK_MSG(worst < 1e-5, "max rel diff %.3g", worst);
    free(q);
    free(out);
    hist_free(&h);
    core_attn_state_free(s);
    core_attn_free(a);
}

TEST(bad_config_is_refused)
{
    core_attn_cfg_t cfg = {.kind = CORE_ATTN_EXACT, .n_layer = 1, .n_head = 2, .n_head_kv = 1,
                           .head_dim = 4, .max_ctx = 0};
    core_attn_t *a = NULL;
    core_error_t err = {0};
    CHECK(core_attn_new(&cfg, NULL, &a, &err) < 0);
    CHECK(a == NULL);
    /* sliding windows: negative, or no period */
    cfg.max_ctx = 16;
    cfg.swa_window = -1;
    CHECK_INT_EQ(core_attn_new(&cfg, NULL, &a, &err), CORE_EINVAL);
    cfg.swa_window = 4;
    cfg.swa_period = 0;
    CHECK_INT_EQ(core_attn_new(&cfg, NULL, &a, &err), CORE_EINVAL);
    cfg.swa_period = 2;
    /* a linear kind runs the global layers (core/attn/attn_swa.c) */
    cfg.kind = CORE_ATTN_PERFORMER;
    CHECK_INT_EQ(core_attn_new(&cfg, NULL, &a, &err), 0);
    core_attn_free(a);
    a = NULL;
    core_attn_state_free(NULL);
    core_attn_free(NULL);
}

int main(void)
{
    RUN(matches_naive_mha);
    RUN(matches_naive_gqa);
    RUN(sliding_window_matches_masked_naive);
    RUN(sliding_window_changes_the_output);
    RUN(overflow_leaves_state_untouched);
    RUN(forward_without_reserve_is_refused);
    RUN(memory_grows_lazily);
    RUN(copy_forks_the_cache);
    RUN(long_context_uses_smaller_blocks);
    RUN(bad_config_is_refused);
    return CHECK_DONE();
}
