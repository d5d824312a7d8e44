/* core/attn/attn_exact.c — exact causal softmax attention over a KV cache.
 *
 * The reference attention kind: bounded by cfg.max_ctx tokens, memory grows
 * with the context. Each state holds, per layer, K and V rows for every token
 * it has absorbed. The cache is grown in chunks on reserve, so a short session
 * holds only what it uses; nothing here ever shrinks it except reset.
 *
 * forward() writes the n new K/V rows at positions [pos, pos+n) and attends;
 * the position only moves in core_attn_advance(), so a forward that fails
 * part-way (or a batch that fails in another sequence) leaves the state as it
 * was: rows past pos are scratch until advanced over.
 *
 * With sliding-window layers (cfg.swa_window) this kind runs the global
 * layers only, under core/attn/attn_swa.c, which keeps the local layers'
 * windows in rings and attends them with core_attn_exact_attend; the GEMMs
 * span the keys a block of queries can see, not the whole context.
 *
 * Scores and the weighted sum are GEMMs per query head over a block of query
 * rows (at most EXACT_QB, fewer for long contexts) so the score scratch stays
 * bounded by EXACT_SCORE_FLOATS.
 */
#include "core/attn/attn_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/blas.h"
#include "core/le.h"

enum {
    EXACT_GROW_CHUNK = 16,  /* tokens: the smallest step the cache grows by (it doubles
                             * beyond), so an idle short session holds little */
    EXACT_QB = 256,         /* query rows per score block */
    EXACT_SCORE_FLOATS = 1 << 22 /* bound on the [rows][ctx] score block (16 MiB) */
};

typedef struct exact_state {
    float **k;   /* [L] -> [cap][Hkv*Hd] */
    float **v;   /* [L] -> [cap][Hkv*Hd] */
    int64_t cap; /* tokens every layer's K and V can hold */
} exact_state_t;

static int exact_init(core_attn_t *a, const core_gguf_t *adapter, core_error_t *err)
{
    (void)adapter;
    if (a->cfg.max_ctx <= 0)
        return core_error_set(err, CORE_EINVAL, "exact attention needs a positive max_ctx");
    /* Bound so that cap * Hkv*Hd * sizeof(float) cannot overflow size_t. */
    uint64_t row = (uint64_t)a->cfg.n_head_kv * (uint64_t)a->cfg.head_dim;
    if (row > ((uint64_t)1 << 24) || (uint64_t)a->cfg.max_ctx > ((uint64_t)1 << 36) / row)
        return core_error_set(err, CORE_ERANGE,
                              "exact attention cache too large: %lld tokens x %llu floats",
                              (long long)a->cfg.max_ctx, (unsigned long long)row);
    a->impl = NULL;
    return 0;
}

static void exact_fini(core_attn_t *a)
{
    (void)a;
}

static void free_cache(exact_state_t *es, int n_layer)
{
    if (es->k) {
        for (int l = 0; l < n_layer; l++)
            free(es->k[l]);
    }
    if (es->v) {
        for (int l = 0; l < n_layer; l++)
            free(es->v[l]);
    }
    free(es->k);
    free(es->v);
    es->k = NULL;
    es->v = NULL;
    es->cap = 0;
}

static int exact_state_init(core_attn_state_t *s, core_error_t *err)
{
    exact_state_t *es = calloc(1, sizeof *es);
    if (!es)
        return core_error_set(err, CORE_ENOMEM, "out of memory for exact attention state");
    s->impl = es;
    return 0;
}

static void exact_state_fini(core_attn_state_t *s)
{
    exact_state_t *es = s->impl;
    if (!es)
        return;
    free_cache(es, s->a->cfg.n_layer);
    free(es);
    s->impl = NULL;
}

/* Reset gives the memory back: a reset session should cost what a new one does. */
static void exact_state_reset(core_attn_state_t *s)
{
    free_cache(s->impl, s->a->cfg.n_layer);
}

/* Grows every layer's K and V to hold cap tokens (cap > es->cap). On failure
 * the layers already grown keep their larger blocks, which is harmless: es->cap
 * only moves once all of them are large enough. */
static int grow_cache(const core_attn_t *a, exact_state_t *es, int64_t cap, core_error_t *err)
{
    const int L = a->cfg.n_layer;
    const size_t bytes = (size_t)cap * (size_t)a->cfg.n_head_kv * (size_t)a->cfg.head_dim *
                         sizeof(float);
    if (!es->k) {
        es->k = calloc((size_t)L, sizeof *es->k);
        es->v = calloc((size_t)L, sizeof *es->v);
        if (!es->k || !es->v) {
            free(es->k);
            free(es->v);
            es->k = es->v = NULL;
            return core_error_set(err, CORE_ENOMEM, "out of memory for the KV cache index");
        }
    }
    for (int l = 0; l < L; l++) {
        float *k = realloc(es->k[l], bytes);
        if (!k)
            goto oom;
        es->k[l] = k;
        float *v = realloc(es->v[l], bytes);
        if (!v)
            goto oom;
        es->v[l] = v;
    }
    es->cap = cap;
    return 0;
oom:
    return core_error_set(err, CORE_ENOMEM, "out of memory for a KV cache of %lld tokens",
                          (long long)cap);
}

static int exact_state_copy(core_attn_state_t *dst, const core_attn_state_t *src, core_error_t *err)
{
    const exact_state_t *se = src->impl;
    exact_state_t *de = dst->impl;
    const core_attn_t *a = src->a;
    if (src->pos > de->cap) {
        int rc = grow_cache(a, de, se->cap, err);
        if (rc < 0)
            return rc;
    }
    const size_t row_bytes = (size_t)a->cfg.n_head_kv * (size_t)a->cfg.head_dim * sizeof(float);
    for (int l = 0; l < a->cfg.n_layer && src->pos > 0; l++) {
        memcpy(de->k[l], se->k[l], (size_t)src->pos * row_bytes);
        memcpy(de->v[l], se->v[l], (size_t)src->pos * row_bytes);
    }
    return 0;
}

static size_t exact_state_bytes(const core_attn_state_t *s)
{
    const exact_state_t *es = s->impl;
    const core_attn_cfg_t *c = &s->a->cfg;
    size_t b = sizeof *es;
    if (es->k)
        b += 2 * (size_t)c->n_layer * sizeof(float *);
    return b + 2 * (size_t)c->n_layer * (size_t)es->cap * (size_t)c->n_head_kv *
                   (size_t)c->head_dim * sizeof(float);
}

static int exact_reserve(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err)
{
    exact_state_t *es = s->impl;
    const int64_t max = a->cfg.max_ctx;
    /* pos >= 0 and here n > max - pos >= 0: the sum is taken unsigned, where
     * it cannot overflow even for n near INT64_MAX. */
    if (n > max - s->pos)
        return core_error_set(err, CORE_ECONTEXT, "context length %lld exceeded: have %lld, need %llu",
                              (long long)max, (long long)s->pos,
                              (unsigned long long)s->pos + (unsigned long long)n);
    const int64_t need = s->pos + n;
    if (need <= es->cap)
        return 0;
    /* Doubling keeps the realloc count logarithmic in long sessions. */
    int64_t cap = es->cap * 2;
    if (cap < need)
        cap = need;
    cap = (cap + EXACT_GROW_CHUNK - 1) / EXACT_GROW_CHUNK * EXACT_GROW_CHUNK;
    if (cap > max)
        cap = max;
    return grow_cache(a, es, cap, err);
}

/* Query rows per score block: fewer as the context grows keeps the
 * scratch bounded. */
static int64_t query_block(int64_t n, int64_t ctx)
{
    int64_t qb = EXACT_SCORE_FLOATS / ctx;
    qb = qb < 1 ? 1 : qb > EXACT_QB ? EXACT_QB : qb;
    return n < qb ? n : qb;
}

size_t core_attn_exact_scratch_floats(int64_t n, int64_t ctx)
{
    return (size_t)query_block(n, ctx) * (size_t)ctx;
}

int core_attn_exact_attend(core_attn_t *a, int64_t P, int64_t n, int64_t W, const float *q,
                           const float *K, const float *V, int64_t kpos0, float *out,
                           core_error_t *err)
{
    const core_attn_cfg_t *c = &a->cfg;
    const int H = c->n_head, Hkv = c->n_head_kv, Hd = c->head_dim;
    const int64_t qs = (int64_t)H * Hd;   /* row stride of q and out */
    const int64_t kvs = (int64_t)Hkv * Hd; /* row stride of K, V */
    const int64_t ctx = P + n - kpos0;    /* key rows held */
    const int64_t qb = query_block(n, ctx);
    float *S = core_attn_scratch(a, (size_t)qb * (size_t)ctx, err); /* [qb][ctx] */
    if (!S)
        return err ? err->code : CORE_ENOMEM;

    const float scale = (float)(1.0 / sqrt((double)Hd));
    const int group = H / Hkv;
    for (int h = 0; h < H; h++) {
        const int hk = h / group;
        for (int64_t i0 = 0; i0 < n; i0 += qb) {
            const int64_t m = n - i0 < qb ? n - i0 : qb;
            /* Query row i (absolute position P+i) sees keys [lo(i), P+i]; the
             * block's first row sees the lowest, its last the highest, so the
             * GEMM spans keys [k0, nk) and each row masks the rest. */
            const int64_t nk = P + i0 + m;
            const int64_t k0 = W > 0 && P + i0 - W + 1 > kpos0 ? P + i0 - W + 1 : kpos0;
            const int64_t span = nk - k0;
            core_gemm_nt(m, span, Hd, scale, q + i0 * qs + (int64_t)h * Hd, qs,
                         K + (k0 - kpos0) * kvs + (int64_t)hk * Hd, kvs, 0.0f, S, span);
            for (int64_t r = 0; r < m; r++) {
                float *row = S + r * span;
                const int64_t p = P + i0 + r;                        /* its position */
                const int64_t lo = W > 0 && p - W + 1 > k0 ? p - W + 1 - k0 : 0;
                const int64_t hi = p + 1 - k0;                        /* keys [lo, hi) of row */
                float mx = row[lo];
                for (int64_t j = lo + 1; j < hi; j++)
                    mx = row[j] > mx ? row[j] : mx;
                double sum = 0.0;
                for (int64_t j = lo; j < hi; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                const float inv = (float)(1.0 / sum);
                for (int64_t j = 0; j < lo; j++)
                    row[j] = 0.0f;
                for (int64_t j = lo; j < hi; j++)
                    row[j] *= inv;
                for (int64_t j = hi; j < span; j++)
                    row[j] = 0.0f;
            }
            core_gemm_nn(m, Hd, span, 1.0f, S, span, V + (k0 - kpos0) * kvs + (int64_t)hk * Hd,
                         kvs, 0.0f, out + i0 * qs + (int64_t)h * Hd, qs);
        }
    }
    return 0;
}

static int exact_forward(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n,
                         const float *q, const float *k, const float *v, float *out,
                         core_error_t *err)
{
    exact_state_t *es = s->impl;
    const int64_t kvs = (int64_t)a->cfg.n_head_kv * a->cfg.head_dim;
    const int64_t P = s->pos;
    if (P + n > es->cap)
        return core_error_set(err, CORE_EINVAL,
                              "exact attention: %lld tokens at position %lld not reserved "
                              "(capacity %lld)",
                              (long long)n, (long long)P, (long long)es->cap);
    float *Kc = es->k[layer]; /* [cap][Hkv*Hd] */
    float *Vc = es->v[layer]; /* [cap][Hkv*Hd] */
    memcpy(Kc + P * kvs, k, (size_t)n * (size_t)kvs * sizeof(float));
    memcpy(Vc + P * kvs, v, (size_t)n * (size_t)kvs * sizeof(float));
    /* a sliding-window layer's query at position p sees keys [p - W + 1, p] */
    return core_attn_exact_attend(a, P, n, core_attn_layer_window(&a->cfg, layer), q, Kc, Vc, 0,
                                  out, err);
}

/* ---- serialization (core/state.c frames the payload) ----
 *
 * Payload: for every layer, the K rows then the V rows of positions 0..pos-1,
 * [pos][Hkv*Hd] little-endian floats each. Rows past pos are scratch and are
 * not saved, so a blob costs what the session has absorbed, not the capacity. */

/* Bytes of the payload of a state at pos tokens, 0 on overflow (pos > 0). */
static size_t exact_payload_bytes(const core_attn_cfg_t *c, int64_t pos)
{
    size_t row = (size_t)c->n_head_kv * (size_t)c->head_dim * sizeof(float);
    size_t per = 2 * (size_t)c->n_layer;
    if (pos <= 0)
        return 0;
    if ((size_t)pos > SIZE_MAX / row / per)
        return 0;
    return (size_t)pos * row * per;
}

static size_t exact_state_save_size(const core_attn_state_t *s)
{
    return exact_payload_bytes(&s->a->cfg, s->pos);
}

static int exact_state_save(const core_attn_state_t *s, void *buf, size_t cap, core_error_t *err)
{
    const exact_state_t *es = s->impl;
    const core_attn_cfg_t *c = &s->a->cfg;
    size_t need = exact_payload_bytes(c, s->pos);
    if (cap < need)
        return core_error_set(err, CORE_ERANGE, "exact attention payload needs %zu bytes, buffer has %zu",
                              need, cap);
    size_t n = (size_t)s->pos * (size_t)c->n_head_kv * (size_t)c->head_dim; /* floats per block */
    unsigned char *p = buf;
    if (n > 0 && (!es->k || !es->v || es->cap < s->pos))
        return core_error_set(err, CORE_EINVAL, "exact attention state at %lld tokens has no cache",
                              (long long)s->pos);
    for (int l = 0; l < c->n_layer && n > 0; l++) {
        if (!es->k[l] || !es->v[l])
            return core_error_set(err, CORE_EINVAL, "exact attention: layer %d has no cache", l);
        core_le_copy32(p, es->k[l], n);
        p += n * sizeof(float);
        core_le_copy32(p, es->v[l], n);
        p += n * sizeof(float);
    }
    return 0;
}

static int exact_state_load(core_attn_state_t *s, int64_t pos, const void *buf, size_t len,
                            core_error_t *err)
{
    exact_state_t *es = s->impl;
    const core_attn_t *a = s->a;
    const core_attn_cfg_t *c = &a->cfg;
    if (pos < 0 || pos > c->max_ctx)
        return core_error_set(err, CORE_EMISMATCH,
                              "exact attention state of %lld tokens does not fit this server's "
                              "context of %lld", (long long)pos, (long long)c->max_ctx);
    size_t need = exact_payload_bytes(c, pos);
    if (len != need)
        return core_error_set(err, CORE_EFORMAT,
                              "exact attention payload is %zu bytes, %lld tokens need %zu", len,
                              (long long)pos, need);
    if (pos == 0)
        return 0;
    int64_t cap = (pos + EXACT_GROW_CHUNK - 1) / EXACT_GROW_CHUNK * EXACT_GROW_CHUNK;
    int rc = grow_cache(a, es, cap < c->max_ctx ? cap : c->max_ctx, err);
    if (rc < 0 || es->cap < pos || !es->k || !es->v) /* cap moves once every layer has grown */
        return rc < 0 ? rc : core_error_set(err, CORE_ENOMEM, "exact attention: no cache");
    size_t n = (size_t)pos * (size_t)c->n_head_kv * (size_t)c->head_dim;
    const unsigned char *p = buf;
    for (int l = 0; l < c->n_layer; l++) {
        if (!es->k[l] || !es->v[l])
            return core_error_set(err, CORE_ENOMEM, "exact attention: layer %d has no cache", l);
        core_le_copy32(es->k[l], p, n);
        p += n * sizeof(float);
        core_le_copy32(es->v[l], p, n);
        p += n * sizeof(float);
        /* A blob is input: a NaN would poison every later softmax silently,
         * a huge finite value overflow the next forward. */
        for (size_t i = 0; i < n; i++) {
            if (!(fabsf(es->k[l][i]) <= CORE_ATTN_MAX_KV) || !(fabsf(es->v[l][i]) <= CORE_ATTN_MAX_KV))
                return core_error_set(err, CORE_EFORMAT,
                                      "exact attention payload: %s %s in layer %d, token %zu "
                                      "(keys and values must be finite, |x| <= %.0f)",
                                      isfinite(es->k[l][i]) && isfinite(es->v[l][i])
                                          ? "out-of-range" : "non-finite",
                                      fabsf(es->k[l][i]) <= CORE_ATTN_MAX_KV ? "value" : "key", l,
                                      i / ((size_t)c->n_head_kv * (size_t)c->head_dim),
                                      (double)CORE_ATTN_MAX_KV);
        }
    }
    return 0;
}

const core_attn_vtbl_t core_attn_exact_vtbl = {
    .init = exact_init,
    .fini = exact_fini,
    .state_init = exact_state_init,
    .state_fini = exact_state_fini,
    .state_reset = exact_state_reset,
    .state_copy = exact_state_copy,
    .state_bytes = exact_state_bytes,
    .reserve = exact_reserve,
    .forward = exact_forward,
    .state_save_size = exact_state_save_size,
    .state_save = exact_state_save,
    .state_load = exact_state_load,
};
