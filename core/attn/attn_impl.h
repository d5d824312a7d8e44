/* core/attn/attn_impl.h — private: how attention kinds plug into core/attn/attn.c.
 *
 * Each kind provides a vtable; core/attn/attn.c dispatches and owns the common
 * fields. Only core/attn*.c and core/state.c (which frames the serialized
 * payloads and swaps a loaded state in) include this file.
 */
#ifndef DARKSERVE_CORE_ATTN_IMPL_H
#define DARKSERVE_CORE_ATTN_IMPL_H

#include "core/attn/attn.h"

typedef struct core_attn_vtbl {
    int (*init)(core_attn_t *a, const core_gguf_t *adapter, core_error_t *err);
    void (*fini)(core_attn_t *a);
    int (*state_init)(core_attn_state_t *s, core_error_t *err);
    void (*state_fini)(core_attn_state_t *s);
    void (*state_reset)(core_attn_state_t *s);
    int (*state_copy)(core_attn_state_t *dst, const core_attn_state_t *src, core_error_t *err);
    size_t (*state_bytes)(const core_attn_state_t *s);
    /* Optional (NULL: state_bytes, and 0 from bytes_held_at): the bytes of
     * the state's memory written so far, and those of a copy of a state at
     * pos (core_attn_state_bytes_held, core_attn_bytes_held_at). */
    size_t (*state_bytes_held)(const core_attn_state_t *s);
    size_t (*bytes_held_at)(const core_attn_t *a, int64_t pos);
    int (*reserve)(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err);
    int (*forward)(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n, const float *q,
                   const float *k, const float *v, float *out, core_error_t *err);
    /* Optional (NULL: forward only, one sequence at a time). forward split
     * into units (the KV heads, or finer) that may run at once on different
     * threads, each with its own scratch slot (< the n of set_workers), then
     * forward_done once all units of the item have run, on one thread (with
     * the same count: what is left for it may depend on the split).
     * units: how many per item for a batch of n_items on n_threads (the
     * kind may split finer when there are few items; an item's results must
     * not depend on the split); forward_unit gets that count. Units cannot
     * fail: forward_unit validates nothing that forward would. */
    int (*set_workers)(core_attn_t *a, int n, core_error_t *err);
    int (*units)(const core_attn_t *a, int n_items, int n_threads);
    void (*forward_unit)(core_attn_t *a, const core_attn_item_t *it, int layer, int unit,
                         int n_units, int slot);
    void (*forward_done)(core_attn_t *a, const core_attn_item_t *it, int layer, int n_units);
    /* Serialized payload of a state (core/state.c frames it with the header,
     * the checksum and the position). Little-endian, self-contained given the
     * attention config; its size depends only on the config, s->pos and the
     * state's own settings (linear: accumulator precision).
     * state_save_size: the exact bytes state_save writes for s as it is now.
     * state_save: writes them into buf (cap >= that size, else CORE_ERANGE).
     * state_load: s is a FRESH state of the same core_attn_t (position 0,
     * never used) that the caller discards on error; fills it from exactly len
     * bytes saved at position pos (the caller sets s->pos). Malformed or
     * mismatched input is CORE_EFORMAT / CORE_EMISMATCH naming the part. */
    size_t (*state_save_size)(const core_attn_state_t *s);
    int (*state_save)(const core_attn_state_t *s, void *buf, size_t cap, core_error_t *err);
    int (*state_load)(core_attn_state_t *s, int64_t pos, const void *buf, size_t len,
                      core_error_t *err);
} core_attn_vtbl_t;

struct core_attn {
    core_attn_cfg_t cfg;
    const core_attn_vtbl_t *vt;
    void *impl;        /* kind-private parameters */
    int workers;       /* scratch slots of forward_unit (core_attn_set_workers) */
    float *scratch;    /* kind-private scratch, grown on demand */
    size_t scratch_n;  /* floats in scratch */
    uint64_t params_salt; /* core_attn_set_params_salt, 0: none */
};

struct core_attn_state {
    const core_attn_t *a;
    int64_t pos;       /* tokens absorbed */
    void *impl;        /* kind-private state */
};

/* Grows a->scratch to at least n floats; returns it or NULL (CORE_ENOMEM set). */
float *core_attn_scratch(core_attn_t *a, size_t n, core_error_t *err);

/* Exact causal softmax (scale 1/sqrt(Hd)) of the n query rows q [n][H*Hd]
 * at positions P..P+n-1 into out [n][H*Hd], over the key and value rows K,
 * V [rows][Hkv*Hd], row j holding position kpos0 + j, the last P + n - 1. A
 * query at position p sees the keys j with p - j < W (W = 0: every row
 * held); kpos0 must not exceed the first key any query sees. Scores go to
 * a's scratch (core_attn_scratch: CORE_ENOMEM is the only failure, and
 * none once it holds core_attn_exact_scratch_floats). attn_exact.c. */
int core_attn_exact_attend(core_attn_t *a, int64_t P, int64_t n, int64_t W, const float *q,
                           const float *K, const float *V, int64_t kpos0, float *out,
                           core_error_t *err);
/* The scratch floats core_attn_exact_attend takes for n queries over ctx
 * key rows. */
size_t core_attn_exact_scratch_floats(int64_t n, int64_t ctx);

/* The attention of the global layers under a's sliding-window composite
 * (attn_swa.c), or a itself when it is no composite: what the linear
 * kinds' inspection (core_attn_linear_features, _params) and the state's
 * parameter digest look at. */
const core_attn_t *core_attn_global_attn(const core_attn_t *a);

extern const core_attn_vtbl_t core_attn_exact_vtbl;  /* attn_exact.c */
extern const core_attn_vtbl_t core_attn_swa_vtbl;    /* attn_swa.c */
extern const core_attn_vtbl_t core_attn_linear_vtbl; /* attn_linear.c */

#endif
