/* core/attn/attn.c — dispatch of the attention interface to its kinds.
 *
 * Owns the fields common to every kind (config, position counter, scratch);
 * everything kind-specific lives behind core_attn_vtbl_t (attn_impl.h):
 * attn_exact.c (KV cache) and attn_linear.c (Performer, DARKFormer,
 * DARKFormer-IS, Flexformer-s/-n, each optionally hybrid with an exact window);
 * a model with sliding-window layers goes through attn_swa.c, which runs
 * either on its global layers.
 * What the kinds themselves call back (names, scratch) is attn_common.c, so
 * the dispatch sits above its implementations and nothing calls up into it.
 */
#include "core/attn/attn_impl.h"
#include "core/kernels/blas.h"
#include "core/kernels/pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const core_attn_vtbl_t *vtbl_for(core_attn_kind_t kind)
{
    switch (kind) {
    case CORE_ATTN_EXACT: return &core_attn_exact_vtbl;
    case CORE_ATTN_PERFORMER:
    case CORE_ATTN_DARKFORMER:
    case CORE_ATTN_DARKFORMER_IS:
    case CORE_ATTN_FLEXFORMER_S:
    case CORE_ATTN_FLEXFORMER_N: return &core_attn_linear_vtbl;
    }
    return NULL;
}

int core_attn_new(const core_attn_cfg_t *cfg, const core_gguf_t *adapter, core_attn_t **out,
                  core_error_t *err)
{
    *out = NULL;
    const core_attn_vtbl_t *vt = vtbl_for(cfg->kind);
    if (!vt)
        return core_error_set(err, CORE_EINVAL, "unknown attention kind %d", (int)cfg->kind);
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_head_kv <= 0 || cfg->head_dim <= 0 ||
        cfg->n_head % cfg->n_head_kv != 0)
        return core_error_set(err, CORE_EINVAL,
                              "bad attention shape: layers %d, heads %d, kv heads %d, head dim %d",
                              cfg->n_layer, cfg->n_head, cfg->n_head_kv, cfg->head_dim);
    if (cfg->window < 0 || cfg->n_features < 0 || cfg->max_ctx < 0)
        return core_error_set(err, CORE_EINVAL, "negative window, feature count or context");
    if (cfg->kv_bits != 0 && cfg->kv_bits != 8 && cfg->kv_bits != 16)
        return core_error_set(err, CORE_EINVAL, "exact rows of %d bits (8 or 16)", cfg->kv_bits);
    if (cfg->kv_bits == 8 && cfg->kind == CORE_ATTN_EXACT)
        return core_error_set(err, CORE_EINVAL, "8-bit rows are the linear kinds' window, sinks "
                              "and memory: exact attention keeps its cache in f32");
    if (cfg->swa_window < 0 || (cfg->swa_window > 0 && cfg->swa_period < 1))
        return core_error_set(err, CORE_EINVAL, "bad sliding window %lld (period %d)",
                              (long long)cfg->swa_window, cfg->swa_period);
    if (cfg->memory && cfg->kind == CORE_ATTN_EXACT)
        return core_error_set(err, CORE_EINVAL, "an exact memory (%d rows) is for the linear "
                              "kinds: exact attention keeps every key", cfg->memory);
    core_attn_t *a = calloc(1, sizeof *a);
    if (!a)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention");
    a->cfg = *cfg;
    /* sliding-window layers: rings for the local layers, the kind for the global ones */
    a->vt = cfg->swa_window > 0 ? &core_attn_swa_vtbl : vt;
    a->workers = 1; /* every kind's init makes one slot of scratch */
    int rc = a->vt->init(a, adapter, err);
    if (rc < 0) {
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void core_attn_free(core_attn_t *a)
{
    if (!a)
        return;
    a->vt->fini(a);
    free(a->scratch);
    free(a);
}

const core_attn_cfg_t *core_attn_config(const core_attn_t *a)
{
    return &a->cfg;
}

void core_attn_set_params_salt(core_attn_t *a, uint64_t salt)
{
    a->params_salt = salt;
}

int core_attn_state_new(const core_attn_t *a, core_attn_state_t **out, core_error_t *err)
{
    *out = NULL;
    core_attn_state_t *s = calloc(1, sizeof *s);
    if (!s)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention state");
    s->a = a;
    int rc = a->vt->state_init(s, err);
    if (rc < 0) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void core_attn_state_free(core_attn_state_t *s)
{
    if (!s)
        return;
    s->a->vt->state_fini(s);
    free(s);
}

void core_attn_state_reset(core_attn_state_t *s)
{
    s->a->vt->state_reset(s);
    s->pos = 0;
}

int core_attn_state_copy(core_attn_state_t *dst, const core_attn_state_t *src, core_error_t *err)
{
    if (dst->a != src->a)
        return core_error_set(err, CORE_EMISMATCH, "states belong to different attention configs");
    int rc = src->a->vt->state_copy(dst, src, err);
    if (rc == 0)
        dst->pos = src->pos;
    return rc;
}

int64_t core_attn_state_pos(const core_attn_state_t *s)
{
    return s->pos;
}

size_t core_attn_state_bytes(const core_attn_state_t *s)
{
    return s->a->vt->state_bytes(s);
}

size_t core_attn_state_bytes_held(const core_attn_state_t *s)
{
    return s->a->vt->state_bytes_held ? s->a->vt->state_bytes_held(s) : s->a->vt->state_bytes(s);
}

size_t core_attn_bytes_held_at(const core_attn_t *a, int64_t pos)
{
    return a->vt->bytes_held_at && pos >= 0 ? a->vt->bytes_held_at(a, pos) : 0;
}

int core_attn_reserve(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err)
{
    if (n < 0)
        return core_error_set(err, CORE_EINVAL, "negative token count %lld", (long long)n);
    /* s->pos is bounded by every path that sets it (state.c refuses larger
     * blobs), so this sum cannot overflow; the kinds index rings with it. */
    if (s->pos < 0 || s->pos > CORE_ATTN_MAX_POS || n > CORE_ATTN_MAX_POS - s->pos)
        return core_error_set(err, CORE_ECONTEXT, "position %lld + %lld tokens exceeds the "
                              "largest position %lld", (long long)s->pos, (long long)n,
                              (long long)CORE_ATTN_MAX_POS);
    return a->vt->reserve(a, s, n, err);
}

int core_attn_forward(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n, const float *q,
                      const float *k, const float *v, float *out, core_error_t *err)
{
    if (layer < 0 || layer >= a->cfg.n_layer)
        return core_error_set(err, CORE_EINVAL, "layer %d out of range [0,%d)", layer,
                              a->cfg.n_layer);
    if (n <= 0)
        return core_error_set(err, CORE_EINVAL, "token count %lld must be positive", (long long)n);
    return a->vt->forward(a, s, layer, n, q, k, v, out, err);
}

void core_attn_advance(core_attn_state_t *s, int64_t n)
{
    s->pos += n;
}

int core_attn_set_workers(core_attn_t *a, int n, core_error_t *err)
{
    if (n < 1 || n > CORE_POOL_MAX_THREADS)
        return core_error_set(err, CORE_ERANGE, "attention workers %d not in [1, %d]", n,
                              CORE_POOL_MAX_THREADS);
    int rc = a->vt->set_workers ? a->vt->set_workers(a, n, err) : 0;
    if (rc == 0)
        a->workers = n;
    return rc;
}

/* Units of all items, handed out from one counter: unit u of item i is task
 * i * units + u. The worker's index is its scratch slot. */
typedef struct batch_run {
    core_attn_t *a;
    const core_attn_item_t *items;
    int layer, units, tasks;
    _Atomic int next;
} batch_run_t;

static void batch_worker(void *ctx, int worker, int n_workers)
{
    (void)n_workers;
    batch_run_t *br = ctx;
    for (;;) {
        int t = atomic_fetch_add_explicit(&br->next, 1, memory_order_relaxed);
        if (t >= br->tasks)
            return;
        br->a->vt->forward_unit(br->a, &br->items[t / br->units], br->layer, t % br->units,
                                br->units, worker);
    }
}

int core_attn_forward_batch(core_attn_t *a, core_pool_t *pool, int layer, int n_items,
                            const core_attn_item_t *items, core_error_t *err)
{
    if (layer < 0 || layer >= a->cfg.n_layer)
        return core_error_set(err, CORE_EINVAL, "layer %d out of range [0,%d)", layer,
                              a->cfg.n_layer);
    for (int i = 0; i < n_items; i++)
        if (items[i].n <= 0)
            return core_error_set(err, CORE_EINVAL, "token count %lld must be positive",
                                  (long long)items[i].n);
    const core_attn_vtbl_t *vt = a->vt;
    /* Longer items call sgemm: when OpenBLAS threads it itself, two pool
     * threads inside a threaded OpenBLAS at once wait on each other (prefill
     * on 2 threads took 1.5x as long), so those run on the calling thread. */
    int pooled = 1;
    if (core_blas_threads() > 1)
        for (int i = 0; i < n_items; i++)
            pooled &= items[i].n <= CORE_ATTN_POOL_MAX_ROWS;
    if (!vt->forward_unit || !pooled || a->workers < core_pool_size(pool)) {
        for (int i = 0; i < n_items; i++) {
            const core_attn_item_t *it = &items[i];
            int rc = vt->forward(a, it->state, layer, it->n, it->q, it->k, it->v, it->out, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    batch_run_t br = {.a = a, .items = items, .layer = layer, .units = vt->units(a, n_items, core_pool_size(pool))};
    br.tasks = n_items * br.units;
    atomic_init(&br.next, 0);
    core_pool_run(pool, batch_worker, &br);
    for (int i = 0; i < n_items; i++)
        vt->forward_done(a, &items[i], layer, br.units);
    return 0;
}
