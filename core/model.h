/* core/model.h — Llama-family decoders (general.architecture llama or gemma3;
 * core/model.c says how gemma3 differs): load from GGUF, batched forward.
 *
 * One core_model_forward() call runs B sequences, each with its own state
 * (position) and its own number of new tokens. The decode rows (sequences of
 * one token) of all sequences are multiplied together, reading each weight
 * once, in 8-bit integer products (core/kernels/qdot.h; logits within a few percent
 * of the f32 ones, see tests/reference/test_model_oracle.py); each prompt
 * chunk (sequences of more tokens) is one f32 product of its own. A
 * sequence's logits are bit for bit those it gets alone: they depend on its
 * tokens and how its prompt was chunked, not on the rest of the batch.
 * Attention goes through core/attn/attn.h, per sequence. The weight matrices are
 * not converted at load: they stay in the file's mapping in their GGUF type
 * (core/model.c says how each product reads them) and only the norm vectors
 * are held as f32; a long prompt chunk dequantizes one tile of a matrix at a
 * time into scratch (opts.tile_floats).
 *
 * Threading: one forward at a time per model (it owns scratch buffers). The
 * model owns a pool of opts.n_threads - 1 worker threads (core/kernels/pool.h) that
 * the calling thread joins during a forward's weight products and attention;
 * they sleep between forwards. Logits do not depend on the thread count.
 */
#ifndef DARKSERVE_CORE_MODEL_H
#define DARKSERVE_CORE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn/attn.h"
#include "core/err.h"
#include "core/gguf.h"
#include "core/kernels/pool.h"

typedef struct core_model core_model_t;

typedef struct core_model_opts {
    core_attn_kind_t attn_kind; /* default CORE_ATTN_EXACT */
    int n_features;             /* M for linear kinds (0 = default 128) */
    int window;                 /* W for linear kinds */
    int64_t max_ctx;            /* exact KV capacity; 0 = the model's context length */
    uint64_t seed;              /* feature seed (0 = default) */
    const char *adapter_path;   /* DARKFormer adapter GGUF or NULL (borrowed) */
    int sinks;                  /* S exact sink tokens of linear kinds (0 = none) */
    int prerope;                /* 1: linear features on q, k before RoPE */
    int decay_off;              /* 1: no learned decay (γ = 1) */
    int linear_off;             /* 1: linear branch off (sinks + window only) */
    int memory;                 /* λ exact memory rows per KV head (0 = off) */
    int memory_keep;            /* CORE_ATTN_KEEP_*: which rows the memory keeps */
    const char *memory_heads;   /* which KV heads have it (core_attn_memory_heads_parse;
                                   NULL = all; borrowed) */
    int kv_bits;                /* bits of the linear kinds' exact rows: 8 or 16
                                   (0 = 16; core_attn_cfg_t.kv_bits) */
    int n_threads;              /* threads of a forward, the caller's included
                                   (0 = the CPUs available;
                                   <= CORE_POOL_MAX_THREADS) */
    int prompt_int8;            /* 0 (default): prompt rows multiply in f32
                                   against dequantized weights; 1: where
                                   every matrix has the packed integer kernel
                                   (AVX-512 VNNI; Q4_0, Q4_1, Q8_0), they are
                                   quantized to 8 bits like decode rows */
    int prompt_f32;             /* 1: prompt rows on the f32 panels even
                                   where the CPU has AMX-BF16 tiles; 0
                                   (default): on the tiles there, three bf16
                                   products within 2^-16 of f32
                                   (core_qmatmul_packed_amx) */
    int64_t tile_floats;        /* floats of a dequantized weight tile of prompt
                                   products, one per pool thread (0 = the
                                   default, 4 MiB; at least one row is always
                                   held): tests make it small to cross tile
                                   boundaries */
} core_model_opts_t;

typedef struct core_model_info {
    char arch[32];
    char name[128];
    int n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
    int64_t n_ctx_train;
    double rope_base;      /* <arch>.rope.freq_base (gemma3: its global layers') */
    double rope_scale;     /* linear scaling factor, 1 = none */
    double rms_eps;
    int tied_output;       /* output head shares token_embd */
    uint64_t n_params;
    char fingerprint[17];  /* hex of a 64-bit hash over the tensor infos + metadata sizes */
} core_model_info_t;

enum core_logits_mode { CORE_LOGITS_NONE = 0, CORE_LOGITS_LAST = 1, CORE_LOGITS_ALL = 2 };

typedef struct core_batch_seq {
    core_attn_state_t *state; /* borrowed; advanced by n_tokens on success */
    const int32_t *tokens;    /* [n_tokens], borrowed */
    int64_t n_tokens;         /* >= 1 */
    int logits_mode;          /* enum core_logits_mode */
    float *logits;            /* caller-owned: [1][V] (LAST) or [n_tokens][V] (ALL) */
    float *hidden;            /* caller-owned [n_tokens][D] or NULL: every token's final
                                 hidden state, after the final norm (the rows the output
                                 head multiplies), for embeddings; whatever logits_mode */
} core_batch_seq_t;

/* opts may be NULL (defaults). *out is new; free with core_model_free().
 * An adapter whose darkformer.base_fingerprint is set and differs from the
 * model's fingerprint is refused (CORE_EMISMATCH naming the adapter and both
 * fingerprints): its learned parameters belong to another network. */
int core_model_load(const char *path, const core_model_opts_t *opts, core_model_t **out,
                    core_error_t *err);
void core_model_free(core_model_t *m); /* NULL is a no-op */

const core_model_info_t *core_model_info(const core_model_t *m);
const core_gguf_t *core_model_gguf(const core_model_t *m); /* borrowed: tokenizer metadata */
int core_model_threads(const core_model_t *m);             /* compute threads, caller included */
/* 1 when prompt rows are quantized to 8 bits for the weight products, as
 * decode rows are (opts.prompt_int8, and every matrix runs on the packed
 * integer kernel on this CPU with the kernels as now chosen). */
int core_model_prompt_int8(const core_model_t *m);
/* 1 when prompt rows multiply the packed matrices on AMX-BF16 tiles (not
 * opts.prompt_f32, the CPU has them, prompt rows are not in 8 bits, some
 * matrix is packed). */
int core_model_prompt_amx(const core_model_t *m);
core_attn_t *core_model_attn(core_model_t *m);             /* borrowed: make states from it */

/* Runs fn on the model's threads (core_pool_run: the caller is worker 0 of
 * core_model_threads), for work between forwards that would leave them idle
 * (a batch's sampling); only from the thread that calls core_model_forward,
 * never during one. */
void core_model_run(core_model_t *m, core_pool_fn fn, void *ctx);

/* Runs the batch. On error no state has been advanced. */
int core_model_forward(core_model_t *m, core_batch_seq_t *seqs, int n_seqs, core_error_t *err);

/* Observation hook for offline tools (recording activations for the
 * DARKFormer conversion): called during core_model_forward for every layer
 * and every sequence of the batch, just before its attention runs, with what
 * attention sees: q [n][H*Hd], k [n][Hkv*Hd] (RoPE applied, in the model's
 * layout: core_attn_cfg_t.rope_halves says which), v [n][Hkv*Hd],
 * all borrowed for the duration of the call only. seq is the index in the
 * batch, pos0 the position of the sequence's first new token. The hook must
 * not call back into the model. Costs one pointer test per layer when unset. */
typedef void (*core_model_tap_fn)(void *ud, int layer, int seq, int64_t pos0, int64_t n,
                                  const float *q, const float *k, const float *v);
/* fn NULL removes the hook; ud is borrowed and passed through. */
void core_model_set_tap(core_model_t *m, core_model_tap_fn fn, void *ud);

/* 1 when the model file at path has sliding-window layers (its
 * general.architecture is gemma3): a linear kind runs its global layers
 * only, and without an adapter it runs exact attention (none of the
 * training-free fallbacks: most of its attention is exact already); 0 when
 * it has none or cannot be read as a GGUF (the load then says why). Opens
 * the file's header only. */
int core_model_file_local_layers(const char *path);

/* ---- adapter discovery ---- */

/* Longest path the discovery builds (bytes, with the NUL). */
#define CORE_MODEL_PATH_MAX 4096
/* Tokens one core_model_forward takes at most, all sequences together (it
 * bounds the forward's scratch). */
#define CORE_MODEL_MAX_ROWS 4096
/* Places looked at, in order. */
#define CORE_MODEL_ADAPTER_CANDIDATES 2

/* Where the DARKFormer adapter of the model file model_path would be, by
 * name (stem = the file name without a trailing ".gguf"):
 *   i = 0  <dir of model>/adapters/<stem>.darkformer.gguf
 *   i = 1  <model_path without ".gguf">.darkformer.gguf
 * into out[cap] (caller-owned). Looks at no file. Returns 0, CORE_ENOTFOUND
 * for another i, CORE_ERANGE if it does not fit (out is then ""),
 * CORE_EINVAL for a NULL or empty path or one without a file name. */
int core_model_adapter_candidate(const char *model_path, int i, char *out, size_t cap);

/* The first candidate above that is an existing regular file (stat()
 * follows symlinks), copied to out[cap] (caller-owned). Returns 0;
 * CORE_ENOTFOUND with the message "no DARKFormer adapter for MODEL (looked
 * for A, B)" when none is; CORE_ERANGE / CORE_EINVAL as above. Does not open
 * the file: whether it belongs to the model is core_model_load's check. */
int core_model_adapter_find(const char *model_path, char *out, size_t cap, core_error_t *err);

#endif
