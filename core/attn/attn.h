/* core/attn/attn.h — the attention interface the Llama forward calls.
 *
 * Dimension letters (used in every shape comment in core/):
 *   B sequences, T tokens, D model dim, H query heads, Hkv KV heads,
 *   Hd head dim, M random features, W hybrid window, V vocab, L layers.
 *
 * A core_attn_t holds the immutable per-model attention parameters of one
 * configuration (kind, M, W, feature seeds / learned matrices for every layer
 * and KV head). A core_attn_state_t is one sequence's attention memory for all
 * layers: a KV cache for exact attention (bounded by max_ctx), a constant-size
 * recurrent state for the linear kinds. The position of a state (tokens it has
 * absorbed) is the RoPE position of the next token.
 *
 * Calling protocol for one forward of n new tokens of one sequence:
 *   core_attn_reserve(a, s, n)               -- may fail with CORE_ECONTEXT
 *   for layer in 0..L-1: core_attn_forward(a, s, layer, n, q, k, v, out)
 *   core_attn_advance(s, n)
 * q and k arrive with RoPE applied. Queries of head h use KV head
 * h / (H / Hkv) (grouped-query attention).
 *
 * Threading: a core_attn_t owns scratch memory, so at most one forward runs on
 * it at a time (darkserve runs all forwards on the scheduler thread).
 */
#ifndef DARKSERVE_CORE_ATTN_H
#define DARKSERVE_CORE_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/kernels/pool.h"
#include "core/gguf.h"

typedef enum core_attn_kind {
    CORE_ATTN_EXACT = 0,
    CORE_ATTN_PERFORMER = 1,
    CORE_ATTN_DARKFORMER = 2,
    CORE_ATTN_DARKFORMER_IS = 3,
    /* Flexformer (DESIGN.md §3): signed trigonometric features of learnable
     * frequencies, stationary (-s) and non-stationary / Yaglom (-n). */
    CORE_ATTN_FLEXFORMER_S = 4,
    CORE_ATTN_FLEXFORMER_N = 5
} core_attn_kind_t;

/* The most (layer, KV head) pairs a linear kind takes. */
#define CORE_ATTN_MAX_HEADS 4096

/* What the exact memory keeps (core_attn_cfg_t.memory_keep). */
enum { CORE_ATTN_KEEP_RECALL = 0, CORE_ATTN_KEEP_RECENT = 1 };

typedef struct core_attn_cfg {
    core_attn_kind_t kind;
    int n_layer;      /* L */
    int n_head;       /* H */
    int n_head_kv;    /* Hkv, divides H */
    int head_dim;     /* Hd */
    int64_t max_ctx;  /* exact: KV cache capacity in tokens */
    int n_features;   /* M, linear kinds */
    int window;       /* W, linear kinds: exact softmax over the last W tokens, 0 = pure */
    uint64_t seed;    /* random-feature seed */
    /* DARKFormer v2 (linear kinds; all zero = v1 behaviour, DESIGN.md §3): */
    int sinks;        /* S: the first S tokens are kept and attended exactly forever */
    int prerope;      /* 1: the linear branch's features see q, k before RoPE */
    int decay_off;    /* 1: ignore the adapter's decays (γ = 1), keep its mixing weights */
    int linear_off;   /* 1: no linear branch at all (sinks + window only; ablations) */
    /* Exact memory (linear, non-trigonometric kinds; DESIGN.md §3 "Exact
     * memory"): λ key/value rows per KV head kept exact beside the linear
     * state, chosen by self-recall error; 0 = off. With it, keys leave the
     * exact span in blocks of CORE_ATTN_MEMORY_BLOCK positions. */
    int memory;
    /* Which rows the memory keeps (CORE_ATTN_KEEP_*): the best by
     * self-recall error, or the most recent (the window of the heads that
     * have a memory extended by λ rows). */
    int memory_keep;
    /* Which KV heads have the memory: every one when memory_some is 0,
     * else those whose flat index layer·Hkv + h has its bit set in
     * memory_mask (the others keep only the window, sinks and linear state;
     * their keys still leave in blocks). */
    int memory_some;
    uint64_t memory_mask[CORE_ATTN_MAX_HEADS / 64];
    /* Bits of the exact rows (window, sinks, memory) of the linear kinds:
     * 16 halves, 8 rows of 8 bits with a scale each (core/kernels/kvrow.h);
     * 0 = 16. Exact attention keeps its own cache (0 or 16 only). */
    int kv_bits;
    int n_rot;        /* RoPE: rotated dims (pairs 2i, 2i+1), needed when prerope */
    double rope_base; /* RoPE: θ_i = pos · base^(-2i/n_rot) / rope_scale */
    double rope_scale;
    /* Sliding-window (local) layers (Gemma 3): with swa_window > 0, layer l
     * is local unless l % swa_period == swa_period - 1; a query at position
     * p of a local layer sees the keys at positions j with p - j <
     * swa_window, kept in a ring of the last swa_window - 1 keys and values
     * (exact softmax, f32, whatever the kind). kind then applies to the
     * global layers only (core/attn/attn_swa.c): exact keeps their every
     * key, a linear kind runs them as on any model, its adapter's layer N
     * being the N-th global layer. 0 = every layer global. */
    int64_t swa_window;
    int swa_period;
    /* 1: the model's RoPE rotates halves (x[i], x[i + n_rot/2]) (NeoX,
     * Gemma), 0: pairs (x[2i], x[2i+1]). A linear kind un-rotates pairs, so
     * the global layers' q and k reach it permuted to pairs
     * (core_attn_rope_pairs; q·k is unchanged). */
    int rope_halves;
} core_attn_cfg_t;

/* Largest position a state may reach (2^48 tokens: years of streaming at
 * any speed, and far from overflowing pos + n or a RoPE angle in double). */
#define CORE_ATTN_MAX_POS ((int64_t)1 << 48)

/* Largest magnitude a key or value read from a state blob may have: the
 * range of half precision, which every real model's K/V fits (fp16 KV
 * caches are the common default). Finite but larger values would make the
 * next forward overflow to inf and the session unsaveable. */
#define CORE_ATTN_MAX_KV 65504.0f

/* The exact memory's block: keys leave the exact span (and compete for the
 * memory) at positions that are multiples of it; and its largest λ. */
#define CORE_ATTN_MEMORY_BLOCK 64
#define CORE_ATTN_MAX_MEMORY 4096

/* Longest memory-heads text core_attn_memory_heads_parse takes. */
#define CORE_ATTN_HEADS_SPEC_MAX 16384

/* Sets cfg->memory_some and cfg->memory_mask from spec (cfg->n_layer and
 * n_head_kv must be set): NULL, "" or "all" = every KV head; else a
 * comma-separated list of "layer.head" pairs (decimal, each in range, none
 * twice). CORE_EINVAL naming the bad entry. */
int core_attn_memory_heads_parse(core_attn_cfg_t *cfg, const char *spec, core_error_t *err);
/* The heads of cfg as that text ("all", or the pairs in order) into buf;
 * the length it needs (as snprintf). */
size_t core_attn_memory_heads_format(const core_attn_cfg_t *cfg, char *buf, size_t cap);
/* "recall" or "recent" for a CORE_ATTN_KEEP_* value (NULL for others), and
 * back (CORE_EINVAL for other names). */
const char *core_attn_keep_name(int keep);
int core_attn_keep_parse(const char *name, int *keep);

/* 1 if flat KV head index i (layer·Hkv + h) of cfg has the exact memory. */
int core_attn_head_has_memory(const core_attn_cfg_t *cfg, size_t i);
/* KV heads of cfg with the memory, and how many of them come before flat
 * index i (so the memory's rows of head i start at λ times that). */
size_t core_attn_memory_heads(const core_attn_cfg_t *cfg);
size_t core_attn_memory_heads_before(const core_attn_cfg_t *cfg, size_t i);

typedef struct core_attn core_attn_t;
typedef struct core_attn_state core_attn_state_t;

/* "exact", "performer", "darkformer", "darkformer-is", "flexformer-s",
 * "flexformer-n". */
const char *core_attn_kind_name(core_attn_kind_t kind);
/* Parses a kind name; CORE_EINVAL if unknown. */
int core_attn_kind_parse(const char *name, core_attn_kind_t *out);
/* 1 for the Flexformer kinds (signed trigonometric features), else 0. */
int core_attn_kind_is_trig(core_attn_kind_t kind);

/* The key window of layer under cfg: swa_window for a local layer, 0 (the
 * whole context) for a global one. */
int64_t core_attn_layer_window(const core_attn_cfg_t *cfg, int layer);
/* Layers that see the whole context (not sliding-window): those a linear
 * kind runs and an adapter describes, in order. */
int core_attn_global_layers(const core_attn_cfg_t *cfg);
/* n rows of nh heads of Hd values from the halves layout to the pairs
 * layout of RoPE (x[i], x[i + n_rot/2] -> y[2i], y[2i+1]; dimensions past
 * n_rot kept): what a linear kind sees of a model with rope_halves (also
 * what tools/record_qkv records for it). in and out do not overlap. */
void core_attn_rope_pairs(const float *in, float *out, int64_t n, int nh, int hd, int n_rot);

/* New attention parameters for cfg. adapter (borrowed, may be NULL) is the
 * DARKFormer adapter GGUF for the kinds that need learned parameters. */
int core_attn_new(const core_attn_cfg_t *cfg, const core_gguf_t *adapter, core_attn_t **out,
                  core_error_t *err);
void core_attn_free(core_attn_t *a); /* NULL is a no-op */
const core_attn_cfg_t *core_attn_config(const core_attn_t *a);
/* Learned parameters that live outside the attention but shape its state
 * (the model's LoRA on k and v, core/lora.h): a nonzero salt is mixed into
 * the parameter digest of state blobs and the system fingerprint
 * (core_state_params_digest), so a state made under one LoRA is refused
 * under another. 0 (the default) mixes nothing in. */
void core_attn_set_params_salt(core_attn_t *a, uint64_t salt);

/* New empty state (position 0). Borrows a, which must outlive it. */
int core_attn_state_new(const core_attn_t *a, core_attn_state_t **out, core_error_t *err);
void core_attn_state_free(core_attn_state_t *s); /* NULL is a no-op */
void core_attn_state_reset(core_attn_state_t *s);
/* dst becomes an exact copy of src (same core_attn_t). */
int core_attn_state_copy(core_attn_state_t *dst, const core_attn_state_t *src, core_error_t *err);
int64_t core_attn_state_pos(const core_attn_state_t *s);
/* Bytes of memory the state holds now (exact: grows with the cache). */
size_t core_attn_state_bytes(const core_attn_state_t *s);
/* Bytes of that memory written so far: an upper estimate of the pages the
 * state has resident (the server allocates states in mappings of their own,
 * whose untouched pages take no memory). Kinds that write their state whole
 * return core_attn_state_bytes; a linear state built by forwards, or copied
 * (core_attn_state_copy writes only what the source holds), has written its
 * scales, its valid window and sink rows and the accumulators of the heads
 * that hold keys: a short chat's DARKFormer state ~2.5 of its 9.4 MB. A
 * state filled by core_attn_state_load has written all of it. */
size_t core_attn_state_bytes_held(const core_attn_state_t *s);
/* The same for a copy of a state at position pos (a prefix-cache snapshot,
 * planned before it exists); 0 when the kind cannot say. */
size_t core_attn_bytes_held_at(const core_attn_t *a, int64_t pos);

int core_attn_reserve(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err);
/* q: [n][H*Hd], k, v: [n][Hkv*Hd] (borrowed); out: [n][H*Hd] (caller-owned). */
int core_attn_forward(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n, const float *q,
                      const float *k, const float *v, float *out, core_error_t *err);
void core_attn_advance(core_attn_state_t *s, int64_t n);

/* One sequence's part of a batched forward: as core_attn_forward's arguments. */
typedef struct core_attn_item {
    core_attn_state_t *state;
    int64_t n;
    const float *q, *k, *v;
    float *out;
} core_attn_item_t;

/* Scratch for up to n threads forwarding at once (core_attn_forward_batch on
 * a pool of n); 1 is what every kind starts with. CORE_ENOMEM leaves the
 * previous scratch in place. */
int core_attn_set_workers(core_attn_t *a, int n, core_error_t *err);

/* Rows per item up to which core_attn_forward_batch shares the work out
 * while BLAS runs on more than one thread (core/kernels/blas.h). */
#define CORE_ATTN_POOL_MAX_ROWS 8

/* core_attn_forward of layer for each item (distinct states), the work shared
 * out on pool's threads: the linear kinds split every sequence by KV head
 * (when BLAS is threaded itself, only if every item has at most
 * CORE_ATTN_POOL_MAX_ROWS rows); the other kinds run one sequence after
 * another on the calling thread.
 * Every output is computed by the same operations as by core_attn_forward,
 * whatever thread computes it, so the results are bit for bit the same on
 * any number of threads. Stops at the first failing item (its error). */
int core_attn_forward_batch(core_attn_t *a, core_pool_t *pool, int layer, int n_items,
                            const core_attn_item_t *items, core_error_t *err);

#endif
