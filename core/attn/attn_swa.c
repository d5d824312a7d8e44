/* core/attn/attn_swa.c — attention of a model with sliding-window layers
 * (Gemma 3: cfg.swa_window, core_attn_layer_window), any kind.
 *
 * A local layer's query at position p sees the keys at p - W + 1 .. p
 * (W = cfg.swa_window), so its state is a ring of the last R = W - 1 keys
 * and values (the rows a later query can still see; position u in slot
 * u % R), f32 and attended by exact softmax whatever the kind: the model
 * computes them so. The global layers (every swa_period-th) run an attention
 * of their own, g, of cfg.kind over the global layers only (n_layer = their
 * count, layer N of g = the N-th global layer): exact keeps their every key
 * (bounded by max_ctx), a linear kind their constant-size state, so with a
 * linear kind the whole state is constant. g reads the adapter as on any
 * model: a sliding-window model's adapter describes its global layers.
 *
 * A linear kind un-rotates RoPE by pairs (x[2i], x[2i+1]); a model that
 * rotates halves (cfg.rope_halves) has its global q and k permuted to that
 * layout before g sees them (core_attn_rope_pairs): a common permutation
 * of q and k leaves every score q·k as it was, and v is untouched.
 *
 * Forward of n tokens at position P of a local layer: the ring's rows of
 * positions max(0, P - R) .. P - 1, then the n new rows, are gathered in
 * order (core_attn_exact_attend wants consecutive positions), attended, and
 * the last min(n, R) new rows written into the ring. reserve() sizes every
 * buffer a forward uses, so a forward after it cannot fail: the rings only
 * change in forwards, which run once every sequence of a batch is reserved,
 * and a position only advances after every layer (core/model.c).
 *
 * The payload (core/state.c frames it): u32 SWA_TAG, u32 R, u32 local
 * layers, u32 0; per local layer the K rows of positions max(0, pos - R)
 * .. pos - 1 [nv][Hkv*Hd] f32 then the V rows the same; then g's payload.
 * Gemma states written before the rings existed (an exact cache of every
 * layer) do not start with the tag and are refused as such.
 */
#include "core/attn/attn_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/le.h"

#define SWA_TAG 0x31415753u /* "SWA1" little-endian */
#define SWA_HEAD_BYTES 16

typedef struct swa_params {
    core_attn_t *g;  /* the global layers' attention */
    int *slot;       /* [L]: index among the global layers (>= 0), or -1 - index among the local */
    int n_local;
    int64_t R;       /* ring rows per local layer: swa_window - 1 */
    int64_t kvs;     /* Hkv*Hd */
    int pairs;       /* permute q, k for g (a linear g of a rope_halves model) */
    float *gk, *gv;  /* [R + n][kvs] gathered local rows */
    float *pq, *pk;  /* [n][H*Hd], [n][kvs] permuted global q, k */
    int64_t rows;    /* n the buffers above hold */
} swa_params_t;

typedef struct swa_state {
    core_attn_state_t *g; /* a state of the global layers' attention */
    float *rk, *rv;       /* [n_local][R][kvs] rings */
} swa_state_t;

static const core_attn_vtbl_t *global_vtbl(core_attn_kind_t kind)
{
    return kind == CORE_ATTN_EXACT ? &core_attn_exact_vtbl : &core_attn_linear_vtbl;
}

/* ---- the global layers' attention and its states (through their vtable:
 * core_attn_new's checks were made on the whole configuration) ---- */

static void global_free(core_attn_t *g)
{
    if (!g)
        return;
    g->vt->fini(g);
    free(g->scratch);
    free(g);
}

static int global_new(const core_attn_t *a, const core_gguf_t *adapter, int n_global,
                      core_attn_t **out, core_error_t *err)
{
    /* the memory's head list names the model's layers, the global kind
     * numbers only its own */
    if (a->cfg.memory && a->cfg.memory_some)
        return core_error_set(err, CORE_EINVAL, "--memory-heads is for models without "
                              "sliding-window layers (give every head the memory, or none)");
    core_attn_t *g = calloc(1, sizeof *g);
    if (!g)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention");
    g->cfg = a->cfg;
    g->cfg.n_layer = n_global;
    g->cfg.swa_window = 0;
    g->cfg.swa_period = 0;
    g->cfg.rope_halves = 0; /* g sees pairs */
    g->vt = global_vtbl(a->cfg.kind);
    g->workers = 1;
    int rc = g->vt->init(g, adapter, err);
    if (rc < 0) {
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

static core_attn_state_t *global_state(const core_attn_state_t *s)
{
    core_attn_state_t *gs = ((swa_state_t *)s->impl)->g;
    if (gs)
        gs->pos = s->pos; /* advanced by the outer state only */
    return gs;
}

/* ---- parameters ---- */

static void swa_fini(core_attn_t *a)
{
    swa_params_t *p = a->impl;
    if (!p)
        return;
    global_free(p->g);
    free(p->slot);
    free(p->gk);
    free(p->gv);
    free(p->pq);
    free(p->pk);
    free(p);
    a->impl = NULL;
}

static int swa_init(core_attn_t *a, const core_gguf_t *adapter, core_error_t *err)
{
    const core_attn_cfg_t *c = &a->cfg;
    swa_params_t *p = calloc(1, sizeof *p);
    if (!p)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention");
    a->impl = p;
    p->slot = malloc((size_t)c->n_layer * sizeof *p->slot);
    if (!p->slot) {
        swa_fini(a);
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention");
    }
    int n_global = 0;
    for (int l = 0; l < c->n_layer; l++)
        p->slot[l] = core_attn_layer_window(c, l) > 0 ? -1 - p->n_local++ : n_global++;
    /* bound so that every ring's bytes fit a size_t */
    p->kvs = (int64_t)c->n_head_kv * c->head_dim;
    if (c->swa_window > ((int64_t)1 << 24) || p->kvs > ((int64_t)1 << 24)) {
        swa_fini(a);
        return core_error_set(err, CORE_ERANGE, "sliding window %lld too large",
                              (long long)c->swa_window);
    }
    p->R = c->swa_window - 1;
    p->pairs = c->rope_halves && c->kind != CORE_ATTN_EXACT;
    /* fewer layers than the period: no global layer, nothing but rings */
    int rc = n_global ? global_new(a, adapter, n_global, &p->g, err) : 0;
    if (rc < 0) {
        swa_fini(a);
        return rc;
    }
    return 0;
}

const core_attn_t *core_attn_global_attn(const core_attn_t *a)
{
    if (a->vt != &core_attn_swa_vtbl)
        return a;
    const core_attn_t *g = ((const swa_params_t *)a->impl)->g;
    return g ? g : a;
}

/* ---- states ---- */

static size_t ring_floats(const swa_params_t *p)
{
    return (size_t)p->n_local * (size_t)p->R * (size_t)p->kvs;
}

static void swa_state_fini(core_attn_state_t *s)
{
    swa_state_t *ss = s->impl;
    if (!ss)
        return;
    if (ss->g && ss->g->a)
        ss->g->a->vt->state_fini(ss->g);
    free(ss->g);
    free(ss->rk);
    free(ss->rv);
    free(ss);
    s->impl = NULL;
}

static int swa_state_init(core_attn_state_t *s, core_error_t *err)
{
    const swa_params_t *p = s->a->impl;
    swa_state_t *ss = calloc(1, sizeof *ss);
    if (!ss)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention state");
    s->impl = ss;
    /* calloc: the pages of ring rows not yet written take no memory */
    const size_t nr = ring_floats(p);
    ss->rk = calloc(nr ? nr : 1, sizeof(float));
    ss->rv = calloc(nr ? nr : 1, sizeof(float));
    ss->g = p->g ? calloc(1, sizeof *ss->g) : NULL;
    if (!ss->rk || !ss->rv || (p->g && !ss->g)) {
        swa_state_fini(s);
        return core_error_set(err, CORE_ENOMEM, "out of memory for the local layers' rings");
    }
    if (!p->g)
        return 0;
    ss->g->a = p->g;
    int rc = p->g->vt->state_init(ss->g, err);
    if (rc < 0) {
        free(ss->g);
        ss->g = NULL;
        swa_state_fini(s);
        return rc;
    }
    return 0;
}

static void swa_state_reset(core_attn_state_t *s)
{
    swa_state_t *ss = s->impl;
    if (ss->g) {
        ss->g->a->vt->state_reset(ss->g);
        ss->g->pos = 0;
    }
}

/* Rows of a local layer's ring that hold positions at pos. */
static int64_t ring_held(const swa_params_t *p, int64_t pos)
{
    return pos < p->R ? pos : p->R;
}

static int swa_state_copy(core_attn_state_t *dst, const core_attn_state_t *src, core_error_t *err)
{
    const swa_params_t *p = src->a->impl;
    const swa_state_t *se = src->impl;
    swa_state_t *de = dst->impl;
    core_attn_state_t *sg = global_state(src);
    if (sg) {
        int rc = p->g->vt->state_copy(de->g, sg, err);
        if (rc < 0)
            return rc;
        de->g->pos = sg->pos;
    }
    /* positions < R sit in slots 0..pos-1; later ones fill the ring */
    const size_t n = (size_t)ring_held(p, src->pos) * (size_t)p->kvs;
    for (int i = 0; i < p->n_local && n > 0; i++) {
        const size_t off = (size_t)i * (size_t)p->R * (size_t)p->kvs;
        memcpy(de->rk + off, se->rk + off, n * sizeof(float));
        memcpy(de->rv + off, se->rv + off, n * sizeof(float));
    }
    return 0;
}

static size_t swa_state_bytes(const core_attn_state_t *s)
{
    const swa_params_t *p = s->a->impl;
    const core_attn_state_t *gs = global_state(s);
    return sizeof(swa_state_t) + 2 * ring_floats(p) * sizeof(float) +
           (gs ? sizeof *gs + p->g->vt->state_bytes(gs) : 0);
}

static size_t swa_state_bytes_held(const core_attn_state_t *s)
{
    const swa_params_t *p = s->a->impl;
    const core_attn_state_t *gs = global_state(s);
    const size_t ring = 2 * (size_t)p->n_local * (size_t)ring_held(p, s->pos) * (size_t)p->kvs *
                        sizeof(float);
    if (!gs)
        return sizeof(swa_state_t) + ring;
    const core_attn_vtbl_t *gv = p->g->vt;
    return sizeof(swa_state_t) + sizeof *gs + ring +
           (gv->state_bytes_held ? gv->state_bytes_held(gs) : gv->state_bytes(gs));
}

static size_t swa_bytes_held_at(const core_attn_t *a, int64_t pos)
{
    const swa_params_t *p = a->impl;
    const size_t g = !p->g ? 1 : p->g->vt->bytes_held_at ? p->g->vt->bytes_held_at(p->g, pos) : 0;
    if (g == 0)
        return 0;
    return sizeof(swa_state_t) + sizeof(core_attn_state_t) + g +
           2 * (size_t)p->n_local * (size_t)ring_held(p, pos) * (size_t)p->kvs * sizeof(float);
}

/* ---- forward ---- */

/* *buf grown to n floats; 0, or -1 with *buf as it was. */
static int grow(float **buf, size_t n)
{
    float *b = realloc(*buf, n * sizeof **buf);
    if (!b)
        return -1;
    *buf = b;
    return 0;
}

/* Grows the gathering and permutation buffers to n new rows. */
static int grow_rows(const core_attn_t *a, swa_params_t *p, int64_t n, core_error_t *err)
{
    if (n <= p->rows)
        return 0;
    const size_t g = (size_t)(p->R + n) * (size_t)p->kvs;
    const size_t nq = (size_t)n * (size_t)a->cfg.n_head * (size_t)a->cfg.head_dim;
    if (grow(&p->gk, g) < 0 || grow(&p->gv, g) < 0 ||
        (p->pairs && (grow(&p->pq, nq) < 0 || grow(&p->pk, (size_t)n * (size_t)p->kvs) < 0)))
        return core_error_set(err, CORE_ENOMEM, "out of memory for %lld rows of sliding-window "
                              "attention", (long long)n);
    p->rows = n;
    return 0;
}

static int swa_reserve(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err)
{
    swa_params_t *p = a->impl;
    int rc = p->g ? p->g->vt->reserve(p->g, global_state(s), n, err) : 0;
    if (rc < 0)
        return rc;
    if ((rc = grow_rows(a, p, n, err)) < 0)
        return rc;
    const size_t sc = core_attn_exact_scratch_floats(n, ring_held(p, s->pos) + n);
    return core_attn_scratch(a, sc, err) ? 0 : (err ? err->code : CORE_ENOMEM);
}

static int swa_forward(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n, const float *q,
                       const float *k, const float *v, float *out, core_error_t *err)
{
    swa_params_t *p = a->impl;
    swa_state_t *ss = s->impl;
    const core_attn_cfg_t *c = &a->cfg;
    if (n > p->rows)
        return core_error_set(err, CORE_EINVAL, "sliding-window attention: %lld tokens not "
                              "reserved", (long long)n);
    const int slot = p->slot[layer];
    if (slot >= 0) {
        if (p->pairs) {
            core_attn_rope_pairs(q, p->pq, n, c->n_head, c->head_dim, c->n_rot);
            core_attn_rope_pairs(k, p->pk, n, c->n_head_kv, c->head_dim, c->n_rot);
            q = p->pq;
            k = p->pk;
        }
        return p->g->vt->forward(p->g, global_state(s), slot, n, q, k, v, out, err);
    }
    const int64_t R = p->R, kvs = p->kvs, P = s->pos;
    const size_t rb = (size_t)kvs * sizeof(float);
    float *rk = ss->rk + (size_t)(-1 - slot) * (size_t)R * (size_t)kvs;
    float *rv = ss->rv + (size_t)(-1 - slot) * (size_t)R * (size_t)kvs;
    const int64_t have = ring_held(p, P), kpos0 = P - have;
    for (int64_t u = kpos0; u < P; u++) {
        memcpy(p->gk + (u - kpos0) * kvs, rk + (u % R) * kvs, rb);
        memcpy(p->gv + (u - kpos0) * kvs, rv + (u % R) * kvs, rb);
    }
    memcpy(p->gk + have * kvs, k, (size_t)n * rb);
    memcpy(p->gv + have * kvs, v, (size_t)n * rb);
    int rc = core_attn_exact_attend(a, P, n, c->swa_window, q, p->gk, p->gv, kpos0, out, err);
    if (rc < 0)
        return rc;
    for (int64_t t = n > R ? n - R : 0; t < n; t++) {
        memcpy(rk + ((P + t) % R) * kvs, k + t * kvs, rb);
        memcpy(rv + ((P + t) % R) * kvs, v + t * kvs, rb);
    }
    return 0;
}

/* ---- serialization ---- */

static size_t ring_payload(const swa_params_t *p, int64_t pos)
{
    return 2 * (size_t)p->n_local * (size_t)ring_held(p, pos) * (size_t)p->kvs * sizeof(float);
}

static size_t swa_state_save_size(const core_attn_state_t *s)
{
    const swa_params_t *p = s->a->impl;
    return SWA_HEAD_BYTES + ring_payload(p, s->pos) +
           (p->g ? p->g->vt->state_save_size(global_state(s)) : 0);
}

static int swa_state_save(const core_attn_state_t *s, void *buf, size_t cap, core_error_t *err)
{
    const swa_params_t *p = s->a->impl;
    const swa_state_t *ss = s->impl;
    const size_t need = swa_state_save_size(s);
    if (cap < need)
        return core_error_set(err, CORE_ERANGE, "sliding-window attention payload needs %zu "
                              "bytes, buffer has %zu", need, cap);
    unsigned char *b = buf;
    core_le_put_u32(b, SWA_TAG);
    core_le_put_u32(b + 4, (uint32_t)p->R);
    core_le_put_u32(b + 8, (uint32_t)p->n_local);
    core_le_put_u32(b + 12, 0);
    b += SWA_HEAD_BYTES;
    const int64_t R = p->R, nv = ring_held(p, s->pos), u0 = s->pos - nv;
    for (int i = 0; i < p->n_local; i++) {
        const float *ring[2] = {ss->rk + (size_t)i * (size_t)R * (size_t)p->kvs,
                                ss->rv + (size_t)i * (size_t)R * (size_t)p->kvs};
        for (int kv = 0; kv < 2; kv++)
            for (int64_t u = u0; u < s->pos; u++) {
                core_le_copy32(b, ring[kv] + (u % R) * p->kvs, (size_t)p->kvs);
                b += (size_t)p->kvs * sizeof(float);
            }
    }
    return p->g ? p->g->vt->state_save(global_state(s), b,
                                       cap - (size_t)(b - (unsigned char *)buf), err) : 0;
}

static int swa_state_load(core_attn_state_t *s, int64_t pos, const void *buf, size_t len,
                          core_error_t *err)
{
    const swa_params_t *p = s->a->impl;
    swa_state_t *ss = s->impl;
    const unsigned char *b = buf;
    if (len < SWA_HEAD_BYTES || core_le_get_u32(b) != SWA_TAG)
        return core_error_set(err, CORE_EFORMAT,
                              "attention payload of a sliding-window model without its ring "
                              "header: a state written before the local layers kept only "
                              "their window (an exact cache of every layer) is not read; "
                              "start the session again");
    if (core_le_get_u32(b + 4) != (uint32_t)p->R || core_le_get_u32(b + 8) != (uint32_t)p->n_local ||
        core_le_get_u32(b + 12) != 0)
        return core_error_set(err, CORE_EMISMATCH,
                              "sliding-window payload of %u local layers with rings of %u rows; "
                              "this model has %d with %lld", core_le_get_u32(b + 8),
                              core_le_get_u32(b + 4), p->n_local, (long long)p->R);
    const size_t ring = ring_payload(p, pos);
    if (len - SWA_HEAD_BYTES < ring)
        return core_error_set(err, CORE_EFORMAT, "sliding-window payload is %zu bytes, the rings "
                              "of %lld tokens need %zu", len, (long long)pos,
                              ring + SWA_HEAD_BYTES);
    b += SWA_HEAD_BYTES;
    const int64_t R = p->R, nv = ring_held(p, pos), u0 = pos - nv;
    for (int i = 0; i < p->n_local; i++) {
        float *r[2] = {ss->rk + (size_t)i * (size_t)R * (size_t)p->kvs,
                       ss->rv + (size_t)i * (size_t)R * (size_t)p->kvs};
        for (int kv = 0; kv < 2; kv++)
            for (int64_t u = u0; u < pos; u++) {
                float *row = r[kv] + (u % R) * p->kvs;
                core_le_copy32(row, b, (size_t)p->kvs);
                b += (size_t)p->kvs * sizeof(float);
                /* input: a NaN would poison every later softmax */
                for (int64_t j = 0; j < p->kvs; j++)
                    if (!(fabsf(row[j]) <= CORE_ATTN_MAX_KV))
                        return core_error_set(err, CORE_EFORMAT,
                                              "sliding-window payload: %s %s in local layer %d, "
                                              "token %lld (keys and values must be finite, |x| "
                                              "<= %.0f)", isfinite(row[j]) ? "out-of-range"
                                                                           : "non-finite",
                                              kv ? "value" : "key", i, (long long)u,
                                              (double)CORE_ATTN_MAX_KV);
            }
    }
    const size_t rest = len - SWA_HEAD_BYTES - ring;
    if (!p->g)
        return rest == 0 ? 0 : core_error_set(err, CORE_EFORMAT, "sliding-window payload has "
                                              "%zu bytes past its rings", rest);
    int rc = p->g->vt->state_load(ss->g, pos, b, rest, err);
    if (rc == 0)
        ss->g->pos = pos;
    return rc;
}

const core_attn_vtbl_t core_attn_swa_vtbl = {
    .init = swa_init,
    .fini = swa_fini,
    .state_init = swa_state_init,
    .state_fini = swa_state_fini,
    .state_reset = swa_state_reset,
    .state_copy = swa_state_copy,
    .state_bytes = swa_state_bytes,
    .state_bytes_held = swa_state_bytes_held,
    .bytes_held_at = swa_bytes_held_at,
    .reserve = swa_reserve,
    .forward = swa_forward,
    .state_save_size = swa_state_save_size,
    .state_save = swa_state_save,
    .state_load = swa_state_load,
};
