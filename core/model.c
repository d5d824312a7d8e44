/* core/model.c — Llama-family decoders: GGUF loading and the batched forward.
 *
 * Two architectures share one model description and one forward, chosen by
 * general.architecture: "llama" and "gemma3". Gemma 3 differs by fields of
 * the description (read_hparams_gemma3 says which): embeddings scaled by
 * sqrt(D), RMSNorm after attention and after the FFN as well as before, a
 * per-head RMSNorm on q and k, GeGLU (tanh GELU) instead of SwiGLU, NeoX
 * RoPE (halves), sliding-window layers with their own RoPE base
 * (core_attn_layer_window), the attention scale from the file and optional
 * final logit soft-capping. Its norm weights are used as stored: llama.cpp's
 * converter has already added Gemma's 1 to them.
 *
 * Loading reads the <arch>.* hyperparameters and checks every tensor's
 * presence, type and shape against them (the error names the tensor). The
 * weight matrices stay in the file's mapping in their GGUF type (F16 and
 * BF16 included), with no f32 copies: the model's resident memory is its
 * file plus scratch. Only the norm vectors (and an F32 matrix the file does
 * not align to 4 bytes) are held as f32.
 *
 * Decode rows (every sequence that brings one token to the forward; they are
 * placed first) read the weights in place through core/qdot, 4-6x fewer
 * bytes per token than f32 for the block types: for Q4_0/Q4_1/Q5_0/Q5_1/
 * Q8_0/Q4_K/Q5_K/Q6_K weights they are quantized to 8 bits once per input
 * (one quantization serves q, k and v; another gate and up) and multiplied in
 * integers; the other types (F16, BF16, Q2_K, Q3_K) take the rows as f32.
 * Where the decode weights are packed (AVX2, AVX-512 VNNI; Q4_0, Q4_1, Q8_0), all
 * prompt rows of the forward, every sequence's, go through one product on
 * panels dequantized from the packed copy (core_qmatmul_packed): each output
 * one fused multiply-add chain, so a row's bits do not depend on the rows
 * beside it. Elsewhere a prompt sequence of at most MODEL_TILE_MIN_ROWS
 * rows reads the weights in place (f32 activations); a longer one
 * multiplies each matrix tile by tile:
 * MODEL_TILE_FLOATS of its rows dequantized (exactly) into a scratch tile,
 * then sgemm, so the f32 values are made once per forward and stay in
 * cache. Which path a row takes depends only on
 * its own sequence, so a sequence computes the same (up to float rounding)
 * whatever else shares the batch. The core/qdot products run on the model's
 * thread pool (core/kernels/pool.h), their weight rows shared out among the threads:
 * the result does not depend on the number of threads.
 *
 * Forward of B sequences: their new tokens are concatenated into T rows; every
 * projection is one GEMM over the T rows; RoPE uses each row's own position;
 * attention runs per sequence through core/attn/attn.h. Attention capacity is
 * reserved for every sequence before any layer runs, so a context overflow
 * fails before anything was computed, and positions only advance once every
 * layer of every sequence has succeeded.
 *
 * RoPE convention: GGUF llama files carry Q/K weights permuted by the converter
 * so that the "normal" rotation applies, i.e. consecutive pairs
 * (x[2i], x[2i+1]) rotate by pos * base^(-2i/n_rot) (not the NeoX halves).
 * gemma3 files are not permuted: pairs (x[i], x[i + n_rot/2]) rotate (NeoX).
 * tests/reference/test_model_oracle.py checks this against an independent
 * numpy implementation on the real model.
 */
#include "core/model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/kernels/blas.h"
#include "core/attn/features.h"
#include "core/lora.h"
#include "core/kernels/pool.h"
#include "core/kernels/qdot.h"
#include "core/tensor.h"
#include "core/kernels/vexp.h"

enum {
    MODEL_MAX_OPS = 3,       /* weight matrices applied to one input (q, k, v) */
    MODEL_LOGIT_ROWS = 256,  /* logits rows per output GEMM: bounds the [R][V] scratch (and each
                              * batch of rows dequantizes the output matrix once) */
    MODEL_NAME_MAX = 96,     /* longest tensor name we build */
    MODEL_TILE_FLOATS = 1 << 20, /* dequantized weight tile of a prompt product (4 MiB) */
    /* A prompt sequence of more rows than this multiplies block-type weights
     * through dequantized tiles and sgemm, one of at most this many reads
     * them in place (core/qdot, f32 activations). Measured on the default
     * model (Q4_1, 2-core Xeon with AVX-512 VNNI, `perplexity --chunk C`):
     * CPU time for 480 tokens, tiles / in place: 12 rows 10.2-10.7 s /
     * 4.9-5.0 s, 24 rows 5.5-5.7 / 4.3-5.2, 48 rows 3.4-3.6 / 3.8-4.0. */
    MODEL_TILE_MIN_ROWS = 32,
    /* Weight rows of a prompt tile (fewer when a tile of MODEL_TILE_FLOATS
     * cannot hold them): small enough that a matrix makes several tiles for
     * the pool's threads to share (an FFN matrix of the default model 6, its
     * output head 192), large enough for sgemm. */
    MODEL_TILE_ROWS = 256
};

/* Sanity bounds on hyperparameters from the file, before they size anything. */
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_DIM (1 << 16)
#define MODEL_MAX_FF (1 << 18)
#define MODEL_MAX_HEADS 1024
#define MODEL_MAX_VOCAB (1 << 22)
#define MODEL_MAX_CTX ((int64_t)1 << 32)

/* A weight matrix of rows × k values in the file's mapping (data, borrowed
 * from core_model.g), row j at data + j·row_bytes. qdot: core/qdot has a
 * kernel for the type (block types, F16, BF16): decode rows read it in
 * place, prompt rows through dequantized tiles. Otherwise (F32) w32 is an
 * f32 view of the whole matrix for every path: the mapping itself when
 * aligned, else own, an f32 copy made at load. */
typedef struct wmat {
    const void *data;
    int type;
    size_t row_bytes;
    int64_t rows, k;
    int qdot;
    const float *w32;
    float *own;
    void *pk; /* in m->pk_arena: the weights packed for the decode kernel (core_q8_pack), or NULL */
} wmat_t;

typedef struct layer {
    float *attn_norm; /* [D] */
    wmat_t wq;        /* [H*Hd][D] */
    wmat_t wk;        /* [Hkv*Hd][D] */
    wmat_t wv;        /* [Hkv*Hd][D] */
    wmat_t wo;        /* [D][H*Hd] */
    float *ffn_norm;  /* [D] */
    wmat_t w_gate;    /* [FF][D] */
    wmat_t w_up;      /* [FF][D] */
    wmat_t w_down;    /* [D][FF] */
    /* gemma3 only (NULL for llama): */
    float *q_norm;         /* [Hd] RMSNorm of each query head */
    float *k_norm;         /* [Hd] RMSNorm of each key head */
    float *post_attn_norm; /* [D] RMSNorm of the attention output before the residual */
    float *post_ffn_norm;  /* [D] RMSNorm of the FFN output before the residual */
    int rope_set;          /* which of m->rope_inv_freq's sets rotates its q, k */
} layer_t;

typedef enum model_arch { MODEL_ARCH_LLAMA = 0, MODEL_ARCH_GEMMA3 = 1 } model_arch_t;

struct core_model {
    core_model_info_t info;
    core_gguf_t *g;        /* owned: the model file (tokenizer metadata lives here) */
    core_gguf_t *adapter;  /* owned, may be NULL: kept open for the attention's lifetime */
    core_attn_t *attn;     /* owned */
    core_lora_t *lora;     /* owned, may be NULL: the adapter's q/k/v/o updates (darkformer) */
    int n_rot;             /* rotated dims per head (<= Hd, even) */
    model_arch_t arch;
    /* per-architecture fields of the forward (llama: 1, 0, 1, 0, 0, 1) */
    float emb_scale;       /* embedding rows are multiplied by it (gemma3: sqrt(D)) */
    int neox;              /* RoPE rotates halves (x[i], x[i + n_rot/2]), not pairs */
    float q_mult;          /* q rows are multiplied by it: the file's attention scale
                            * times sqrt(Hd), since attention scales by 1/sqrt(Hd) */
    int gelu;              /* FFN: gelu_tanh(gate) * up, not silu(gate) * up */
    double softcap;        /* final logits: c·tanh(logit/c) when > 0 */
    int n_rope_sets;       /* 1, or 2 with sliding-window layers (0 global, 1 local) */
    double rope_base_local; /* RoPE base of the local layers */
    int64_t swa_window;    /* local layers' key window (0: none) */
    int swa_period;        /* layer l is global when l % swa_period == swa_period - 1 */
    wmat_t tok_embd;       /* [V][D]: rows are dequantized as tokens come in */
    float *out_norm;       /* [D] */
    wmat_t output;         /* [V][D]; a copy of tok_embd's view when tied */
    layer_t *layers;       /* [L] */
    double *rope_inv_freq; /* [n_rope_sets][n_rot/2]: base^(-2i/n_rot) / scale */
    float *rope_cs;        /* [rows][n_rope_sets][n_rot/2][2] cos, sin of each row's angles
                            * (a forward's) */

    /* scratch, grown to the largest T seen (<= CORE_MODEL_MAX_ROWS) */
    int64_t cap_rows;
    float *x;      /* [T][D] residual stream */
    float *xn;     /* [T][D] normalized rows */
    float *q;      /* [T][H*Hd] */
    float *k;      /* [T][Hkv*Hd] */
    float *v;      /* [T][Hkv*Hd] */
    float *att;    /* [T][H*Hd] attention output */
    float *gate;   /* [T][FF] */
    float *up;     /* [T][FF] */
    int64_t *pos;  /* [T] RoPE position of each row */
    float *lrows;  /* [MODEL_LOGIT_ROWS][D] gathered final-norm rows */
    float *logits; /* [MODEL_LOGIT_ROWS][V] */
    float *wtile;  /* [pool threads][wtile_n] a dequantized weight tile per thread */
    unsigned char *pk_arena; /* owned: every matrix's packed copy (pack_matrices) */
    int all_packed;  /* every matrix (layers' and output) has a packed copy */
    int prompt_int8; /* opts.prompt_int8: prompt rows in 8 bits where all_packed */
    int prompt_f32;  /* opts.prompt_f32: prompt rows never on the AMX-BF16 tiles */
    size_t wtile_n; /* floats in one tile: max(the tile size asked for, the largest k) */
    unsigned char *erow;   /* [tok_embd.row_bytes] an embedding row unpacked from output.pk */
    float *panel;          /* [pool threads][panel_n] 64-byte aligned: core_qmatmul_packed's */
    uint16_t *bsplit;      /* [cap_rows][2 kmax] 64-byte aligned, where the AMX-BF16 panels
                            * run: the prompt rows split (core_q8_amx_split) */
    size_t panel_n;        /* floats: core_q8_panel_floats(the largest k) */

    core_pool_t *pool;     /* owned: threads of the quantized products */
    void *qbuf;            /* [core_q8_act_bytes(cap_rows, max(D, FF, H*Hd))] */
    core_q8_act_t qa;      /* the quantized decode rows of the current input, over qbuf */
    int64_t *seq_row;      /* [cap_rows] first row of each sequence of the forward */
    core_attn_item_t *items; /* [cap_rows] each sequence's attention of a layer */
    int64_t *pre_n;        /* [cap_rows] rows of each prompt sequence, in row order */
    int64_t n_pre;         /* prompt sequences of the current input */
    core_qdot_job_t *jobs; /* [MODEL_MAX_OPS * (cap_rows + 1)] */

    core_model_tap_fn tap; /* NULL unless a tool observes q, k, v */
    void *tap_ud;          /* borrowed */
};

/* ---------------------------------------------------------------- loading */

static int get_int_req(const core_gguf_t *g, const char *key, int64_t lo, int64_t hi, int64_t *out,
                       core_error_t *err)
{
    int rc = core_gguf_get_int(g, key, out, err);
    if (rc < 0)
        return rc == CORE_ENOTFOUND
                   ? core_error_set(err, CORE_EFORMAT, "missing hyperparameter %s", key)
                   : rc;
    if (*out < lo || *out > hi)
        return core_error_set(err, CORE_ERANGE, "hyperparameter %s = %lld out of range [%lld, %lld]",
                              key, (long long)*out, (long long)lo, (long long)hi);
    return 0;
}

/* Optional integer: *out keeps def when the key is absent. */
static int get_int_opt(const core_gguf_t *g, const char *key, int64_t lo, int64_t hi, int64_t def,
                       int64_t *out, core_error_t *err)
{
    *out = def;
    if (core_gguf_find_key(g, key) < 0)
        return 0;
    return get_int_req(g, key, lo, hi, out, err);
}

static int get_float_opt(const core_gguf_t *g, const char *key, double def, double *out,
                         core_error_t *err)
{
    *out = def;
    if (core_gguf_find_key(g, key) < 0)
        return 0;
    int rc = core_gguf_get_float(g, key, out, err);
    if (rc < 0)
        return rc;
    if (!isfinite(*out))
        return core_error_set(err, CORE_ERANGE, "hyperparameter %s is not finite", key);
    return 0;
}

static int str_eq(core_gguf_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

static void copy_str(char *dst, size_t cap, core_gguf_str_t s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

typedef struct fnv {
    uint64_t h;
} fnv_t;

static void fnv_bytes(fnv_t *f, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        f->h ^= b[i];
        f->h *= 0x100000001b3ULL;
    }
}

static void fnv_u64(fnv_t *f, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    fnv_bytes(f, b, sizeof b);
}

/* Checks that name exists with the expected shape [ne0] or [ne1][ne0], a
 * supported type and a consistent byte size. Returns the tensor (borrowed
 * from the mapping) and its row size, or NULL with the negative code in *rc
 * (err says why). Returning the pointer, not only a code, keeps a caller from
 * reading an unset tensor whatever the code (clang-analyzer cannot see that
 * core_error_set returns its negative code). */
static const core_gguf_tensor_t *find_tensor(core_model_t *m, const char *name, int64_t ne0,
                                             int64_t ne1, size_t *row_bytes_out, int *rc,
                                             core_error_t *err)
{
    const core_gguf_tensor_t *t = core_gguf_find_tensor(m->g, name);
    const int64_t want[CORE_GGUF_MAX_DIMS] = {ne0, ne1 > 0 ? ne1 : 1, 1, 1};
    const int64_t rows = want[1];
    size_t row_bytes = 0;
    int shape_ok = 1;
    if (!t) {
        *rc = core_error_set(err, CORE_EFORMAT, "missing tensor %s", name);
        return NULL;
    }
    for (int d = 0; d < CORE_GGUF_MAX_DIMS; d++)
        shape_ok &= t->ne[d] == want[d];
    if (!shape_ok)
        *rc = core_error_set(err, CORE_EFORMAT,
                             "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                             name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                             (long long)t->ne[3], (long long)want[0], (long long)want[1]);
    else if (!core_ttype_supported(t->type))
        *rc = core_error_set(err, CORE_EUNSUPPORTED, "tensor %s has unsupported type %s (%d)", name,
                             core_ttype_name(t->type), t->type);
    else if (core_ttype_row_bytes(t->type, ne0, &row_bytes) < 0)
        *rc = core_error_set(err, CORE_EFORMAT,
                             "tensor %s: row length %lld is not a multiple of the %s block", name,
                             (long long)ne0, core_ttype_name(t->type));
    else if ((uint64_t)row_bytes * (uint64_t)rows != (uint64_t)t->nbytes)
        *rc = core_error_set(err, CORE_EFORMAT, "tensor %s: %zu data bytes, expected %llu", name,
                             t->nbytes, (unsigned long long)row_bytes * (unsigned long long)rows);
    else {
        m->info.n_params += (uint64_t)(ne0 * rows);
        *row_bytes_out = row_bytes;
        return t;
    }
    return NULL;
}

/* Dequantizes n values of type from src into a new buffer. */
static int dequantized_copy(const char *name, int type, const void *src, int64_t n, float **out,
                            core_error_t *err)
{
    float *buf = malloc((size_t)n * sizeof *buf);
    if (!buf)
        return core_error_set(err, CORE_ENOMEM, "out of memory for tensor %s (%lld floats)", name,
                              (long long)n);
    int rc = core_dequantize(type, src, buf, n, err);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* A vector (norm weights) of ne0 values, as a new f32 buffer. */
static int load_vector(core_model_t *m, const char *name, int64_t ne0, float **out,
                       core_error_t *err)
{
    size_t row_bytes;
    int rc;
    const core_gguf_tensor_t *t = find_tensor(m, name, ne0, 0, &row_bytes, &rc, err);
    return t ? dequantized_copy(name, t->type, t->data, ne0, out, err) : rc;
}

/* A matrix of ne1 rows of ne0 values, left in the mapping (wmat_t). */
static int load_matrix(core_model_t *m, const char *name, int64_t ne0, int64_t ne1, wmat_t *w,
                       core_error_t *err)
{
    size_t row_bytes;
    int rc;
    const core_gguf_tensor_t *t = find_tensor(m, name, ne0, ne1, &row_bytes, &rc, err);
    if (!t)
        return rc;
    *w = (wmat_t){.data = t->data, .type = t->type, .row_bytes = row_bytes, .rows = ne1, .k = ne0,
                  .qdot = core_qdot_supported(t->type)};
    if (w->qdot)
        return 0;
    if (t->type == CORE_TTYPE_F32 && (uintptr_t)t->data % sizeof(float) == 0) {
        w->w32 = t->data;
        return 0;
    }
    if ((rc = dequantized_copy(name, t->type, t->data, ne0 * ne1, &w->own, err)) < 0)
        return rc;
    w->w32 = w->own;
    return 0;
}

/* Matrix i of the 7·L + 1 a decode step multiplies, in the order it does:
 * each layer's q, k, v, o, gate, up, down, then the output head. */
static wmat_t *matrix_at(core_model_t *m, int i)
{
    if (i == 7 * m->info.n_layer)
        return &m->output;
    layer_t *ly = &m->layers[i / 7];
    wmat_t *ws[7] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
    return ws[i % 7];
}

static size_t packed_bytes(const wmat_t *w)
{
    if (!core_q8_pack_supported(w->type) || w->k % CORE_Q8_BLOCK != 0)
        return 0;
    return (core_q8_pack_bytes(w->type, w->rows, w->k) + 63) / 64 * 64;
}

/* The decode rows' copy of every matrix in the packed layout, where this
 * CPU's kernel reads one (AVX2, AVX-512 VNNI; Q4_0, Q4_1, Q8_0): the same bytes
 * again in anonymous memory, read instead of the mapping by every decode
 * product, all in one arena in the order a step reads them, 2 MiB aligned
 * and offered to the kernel as transparent huge pages (with 4 KiB pages a
 * token walked ~24,000 page tables and the hardware prefetchers stopped at
 * every page: decode ~9% slower). */
static int pack_matrices(core_model_t *m, core_error_t *err)
{
    const int n = 7 * m->info.n_layer + 1;
    size_t total = 0;
    m->all_packed = 1;
    for (int i = 0; i < n; i++) {
        const size_t b = packed_bytes(matrix_at(m, i));
        total += b;
        m->all_packed &= b > 0;
    }
    if (total == 0)
        return 0;
    const size_t huge = (size_t)2 << 20, cap = (total + huge - 1) / huge * huge;
    if (!(m->pk_arena = aligned_alloc(huge, cap)))
        return core_error_set(err, CORE_ENOMEM, "out of memory for %zu bytes of packed weights",
                              total);
#ifdef MADV_HUGEPAGE
    (void)madvise(m->pk_arena, cap, MADV_HUGEPAGE); /* advice: 4 KiB pages work too */
#endif
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        wmat_t *w = matrix_at(m, i);
        const size_t b = packed_bytes(w);
        if (b == 0)
            continue;
        w->pk = m->pk_arena + at;
        at += b;
        core_q8_pack(w->type, w->data, w->row_bytes, w->rows, w->k, w->pk);
        /* Nothing reads the file's pages of w from now on (decode and
         * prompts read pk, embeddings of a tied output too;
         * compute_fingerprint ran before): out of the resident set. Only a
         * product run with a forced lower ISA (tests) maps them in again. */
        core_gguf_release(m->g, w->data, (size_t)w->rows * w->row_bytes);
    }
    return 0;
}

/* The file's key <arch>.suffix, in buf (MODEL_NAME_MAX bytes). */
static const char *arch_key(char *buf, const char *arch, const char *suffix)
{
    snprintf(buf, MODEL_NAME_MAX, "%s.%s", arch, suffix);
    return buf;
}
#define KEY(suffix) arch_key(k1, a, suffix)
#define KEY2(suffix) arch_key(k2, a, suffix)

static int read_hparams_gemma3(core_model_t *m, const char *a, core_error_t *err);

static int read_hparams(core_model_t *m, core_error_t *err)
{
    const core_gguf_t *g = m->g;
    core_model_info_t *in = &m->info;
    core_gguf_str_t s;
    int rc = core_gguf_get_str(g, "general.architecture", &s, err);
    if (rc < 0)
        return rc == CORE_ENOTFOUND
                   ? core_error_set(err, CORE_EFORMAT, "missing general.architecture")
                   : rc;
    if (str_eq(s, "llama")) {
        m->arch = MODEL_ARCH_LLAMA;
    } else if (str_eq(s, "gemma3")) {
        m->arch = MODEL_ARCH_GEMMA3;
    } else {
        char arch[64];
        copy_str(arch, sizeof arch, s);
        return core_error_set(err, CORE_EUNSUPPORTED,
                              "unsupported architecture '%s' (llama and gemma3 are supported)",
                              arch);
    }
    const char *a = m->arch == MODEL_ARCH_GEMMA3 ? "gemma3" : "llama";
    snprintf(in->arch, sizeof in->arch, "%s", a);
    char k1[MODEL_NAME_MAX], k2[MODEL_NAME_MAX];
    if (core_gguf_get_str(g, "general.name", &s, NULL) == 0 ||
        core_gguf_get_str(g, "general.basename", &s, NULL) == 0)
        copy_str(in->name, sizeof in->name, s);
    else
        snprintf(in->name, sizeof in->name, "%s", a);

    int64_t L, D, FF, H, Hkv, Hd, ctx, n_rot;
    if ((rc = get_int_req(g, KEY("block_count"), 1, MODEL_MAX_LAYERS, &L, err)) < 0 ||
        (rc = get_int_req(g, KEY("embedding_length"), 1, MODEL_MAX_DIM, &D, err)) < 0 ||
        (rc = get_int_req(g, KEY("feed_forward_length"), 1, MODEL_MAX_FF, &FF, err)) < 0 ||
        (rc = get_int_req(g, KEY("attention.head_count"), 1, MODEL_MAX_HEADS, &H, err)) < 0 ||
        (rc = get_int_opt(g, KEY("attention.head_count_kv"), 1, MODEL_MAX_HEADS, H, &Hkv, err)) <
            0 ||
        (rc = get_int_req(g, KEY("context_length"), 1, MODEL_MAX_CTX, &ctx, err)) < 0)
        return rc;
    int64_t n_expert;
    if ((rc = get_int_opt(g, KEY("expert_count"), 0, INT32_MAX, 0, &n_expert, err)) < 0)
        return rc;
    if (n_expert > 0)
        return core_error_set(err, CORE_EUNSUPPORTED,
                              "mixture-of-experts llama (llama.expert_count = %lld) is not supported",
                              (long long)n_expert);
    /* Llama 3.x frequency factors would change every rotation angle; running
     * without them would be silently wrong, so refuse. */
    if (core_gguf_find_tensor(g, "rope_freqs.weight"))
        return core_error_set(err, CORE_EUNSUPPORTED,
                              "tensor rope_freqs.weight (llama3 RoPE frequency factors) is not "
                              "supported");
    if (H % Hkv != 0)
        return core_error_set(err, CORE_EFORMAT, "head_count %lld is not a multiple of head_count_kv %lld",
                              (long long)H, (long long)Hkv);
    if ((rc = get_int_opt(g, KEY("attention.key_length"), 1, MODEL_MAX_DIM, D / H, &Hd, err)) < 0)
        return rc;
    int64_t vlen;
    if ((rc = get_int_opt(g, KEY("attention.value_length"), 1, MODEL_MAX_DIM, Hd, &vlen, err)) < 0)
        return rc;
    if (vlen != Hd)
        return core_error_set(err, CORE_EUNSUPPORTED, "value_length %lld differs from key_length %lld",
                              (long long)vlen, (long long)Hd);
    if (Hd * H > (int64_t)MODEL_MAX_DIM * 4 || (Hd % 2) != 0)
        return core_error_set(err, CORE_EFORMAT, "bad head dimension %lld", (long long)Hd);
    if ((rc = get_int_opt(g, KEY("rope.dimension_count"), 2, Hd, Hd, &n_rot, err)) < 0)
        return rc;
    if (n_rot % 2 != 0)
        return core_error_set(err, CORE_EFORMAT, "%s = %lld is odd", KEY("rope.dimension_count"),
                              (long long)n_rot);

    double base, eps, scale = 1.0;
    if ((rc = get_float_opt(g, KEY("rope.freq_base"), 10000.0, &base, err)) < 0 ||
        (rc = get_float_opt(g, KEY("attention.layer_norm_rms_epsilon"),
                            m->arch == MODEL_ARCH_GEMMA3 ? 1e-6 : 1e-5, &eps, err)) < 0)
        return rc;
    if (base <= 1.0 || eps < 0.0 || eps > 1.0)
        return core_error_set(err, CORE_ERANGE, "bad rope base %g or rms epsilon %g", base, eps);
    if (core_gguf_get_str(g, KEY("rope.scaling.type"), &s, NULL) == 0) {
        if (str_eq(s, "linear")) {
            if ((rc = get_float_opt(g, KEY("rope.scaling.factor"), 1.0, &scale, err)) < 0)
                return rc;
        } else if (!str_eq(s, "none")) {
            char ty[32];
            copy_str(ty, sizeof ty, s);
            return core_error_set(err, CORE_EUNSUPPORTED, "unsupported %s '%s' (linear, none)",
                                  KEY2("rope.scaling.type"), ty);
        }
    } else if (core_gguf_find_key(g, KEY("rope.scale_linear")) >= 0) {
        /* older converters wrote the linear factor under this key */
        if ((rc = get_float_opt(g, KEY("rope.scale_linear"), 1.0, &scale, err)) < 0)
            return rc;
    }
    if (scale == 0.0)
        scale = 1.0;
    if (scale < 1e-3 || scale > 1e6)
        return core_error_set(err, CORE_ERANGE, "rope scaling factor %g out of range", scale);

    /* V: the tokenizer's token count when present, else vocab_size, else token_embd. */
    int64_t V = -1;
    core_gguf_arr_t toks;
    if (core_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) == 0) {
        V = (int64_t)toks.n;
    } else if (core_gguf_find_key(g, KEY("vocab_size")) >= 0) {
        if ((rc = get_int_req(g, KEY("vocab_size"), 1, MODEL_MAX_VOCAB, &V, err)) < 0)
            return rc;
    } else {
        const core_gguf_tensor_t *te = core_gguf_find_tensor(g, "token_embd.weight");
        if (!te)
            return core_error_set(err, CORE_EFORMAT, "missing tensor token_embd.weight");
        V = te->ne[1];
    }
    if (V < 1 || V > MODEL_MAX_VOCAB)
        return core_error_set(err, CORE_ERANGE, "vocabulary size %lld out of range", (long long)V);

    in->n_layer = (int)L;
    in->n_embd = (int)D;
    in->n_ff = (int)FF;
    in->n_head = (int)H;
    in->n_head_kv = (int)Hkv;
    in->head_dim = (int)Hd;
    in->n_vocab = (int)V;
    in->n_ctx_train = ctx;
    in->rope_base = base;
    in->rope_scale = scale;
    in->rms_eps = eps;
    m->n_rot = (int)n_rot;
    m->emb_scale = 1.0f;
    m->q_mult = 1.0f;
    m->n_rope_sets = 1;
    return m->arch == MODEL_ARCH_GEMMA3 ? read_hparams_gemma3(m, a, err) : 0;
}

/* What gemma3 adds to the common keys, each checked: the sliding window
 * (required: a Gemma 3 without one is not what this forward computes), the
 * local layers' period (llama.cpp fixes 6 for gemma3 and writes no key; a
 * file that has one is read), the local RoPE base (llama.cpp: 10000, key
 * rope.freq_base_swa when written), the attention scale (attention.scale,
 * default 1/sqrt(key_length): query_pre_attn_scalar = head dim, as for every
 * released size but 27B, whose files carry the key), final logit
 * soft-capping. Attention logit soft-capping (Gemma 2) is refused: exact
 * attention has no such step. */
static int read_hparams_gemma3(core_model_t *m, const char *a, core_error_t *err)
{
    const core_gguf_t *g = m->g;
    const core_model_info_t *in = &m->info;
    char k1[MODEL_NAME_MAX];
    int64_t W, period;
    double base_local, scale, softcap, attn_cap;
    int rc;
    if ((rc = get_int_req(g, KEY("attention.sliding_window"), 1, MODEL_MAX_CTX, &W, err)) < 0 ||
        (rc = get_int_opt(g, KEY("attention.sliding_window_pattern"), 1, MODEL_MAX_LAYERS, 6,
                          &period, err)) < 0 ||
        (rc = get_float_opt(g, KEY("rope.freq_base_swa"), 10000.0, &base_local, err)) < 0 ||
        (rc = get_float_opt(g, KEY("attention.scale"), 1.0 / sqrt((double)in->head_dim), &scale,
                            err)) < 0 ||
        (rc = get_float_opt(g, KEY("final_logit_softcapping"), 0.0, &softcap, err)) < 0 ||
        (rc = get_float_opt(g, KEY("attn_logit_softcapping"), 0.0, &attn_cap, err)) < 0)
        return rc;
    if (base_local <= 1.0)
        return core_error_set(err, CORE_ERANGE, "%s = %g must exceed 1", KEY("rope.freq_base_swa"),
                              base_local);
    if (!(scale > 0.0) || scale > 1e3)
        return core_error_set(err, CORE_ERANGE, "%s = %g out of range (0, 1000]",
                              KEY("attention.scale"), scale);
    if (softcap < 0.0)
        return core_error_set(err, CORE_ERANGE, "%s = %g is negative",
                              KEY("final_logit_softcapping"), softcap);
    if (attn_cap != 0.0)
        return core_error_set(err, CORE_EUNSUPPORTED,
                              "%s = %g: attention logit soft-capping is not supported",
                              KEY("attn_logit_softcapping"), attn_cap);
    if (m->n_rot != in->head_dim)
        return core_error_set(err, CORE_EFORMAT, "%s = %d differs from the head dimension %d",
                              KEY("rope.dimension_count"), m->n_rot, in->head_dim);
    m->emb_scale = (float)sqrt((double)in->n_embd);
    m->neox = 1;
    m->gelu = 1;
    m->q_mult = (float)(scale * sqrt((double)in->head_dim));
    m->softcap = softcap;
    m->swa_window = W;
    m->swa_period = (int)period;
    m->rope_base_local = base_local;
    m->n_rope_sets = period > 1 ? 2 : 1; /* a period of 1: every layer global */
    return 0;
}
#undef KEY
#undef KEY2

static int load_weights(core_model_t *m, core_error_t *err)
{
    const core_model_info_t *in = &m->info;
    const int64_t D = in->n_embd, V = in->n_vocab, FF = in->n_ff;
    const int64_t qd = (int64_t)in->n_head * in->head_dim, kvd = (int64_t)in->n_head_kv * in->head_dim;
    int rc;
    if ((rc = load_matrix(m, "token_embd.weight", D, V, &m->tok_embd, err)) < 0 ||
        (rc = load_vector(m, "output_norm.weight", D, &m->out_norm, err)) < 0)
        return rc;
    if (core_gguf_find_tensor(m->g, "output.weight")) {
        if ((rc = load_matrix(m, "output.weight", D, V, &m->output, err)) < 0)
            return rc;
    } else {
        m->output = m->tok_embd;
        m->output.own = NULL; /* tok_embd owns any copy */
        m->info.tied_output = 1;
    }
    m->layers = calloc((size_t)in->n_layer, sizeof *m->layers);
    if (!m->layers)
        return core_error_set(err, CORE_ENOMEM, "out of memory for %d layers", in->n_layer);
    for (int l = 0; l < in->n_layer; l++) {
        layer_t *ly = &m->layers[l];
        struct {
            const char *suffix;
            int64_t ne0, ne1;
            float **vec; /* a norm vector, or */
            wmat_t *w;   /* a matrix */
        } spec[] = {
            {"attn_norm", D, 0, &ly->attn_norm, NULL},  {"attn_q", D, qd, NULL, &ly->wq},
            {"attn_k", D, kvd, NULL, &ly->wk},          {"attn_v", D, kvd, NULL, &ly->wv},
            {"attn_output", qd, D, NULL, &ly->wo},      {"ffn_norm", D, 0, &ly->ffn_norm, NULL},
            {"ffn_gate", D, FF, NULL, &ly->w_gate},     {"ffn_up", D, FF, NULL, &ly->w_up},
            {"ffn_down", FF, D, NULL, &ly->w_down},
        };
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            char name[MODEL_NAME_MAX];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[i].suffix);
            rc = spec[i].vec ? load_vector(m, name, spec[i].ne0, spec[i].vec, err)
                             : load_matrix(m, name, spec[i].ne0, spec[i].ne1, spec[i].w, err);
            if (rc < 0)
                return rc;
        }
        if (m->arch != MODEL_ARCH_GEMMA3)
            continue;
        struct {
            const char *suffix;
            int64_t n;
            float **vec;
        } norms[] = {
            {"attn_q_norm", in->head_dim, &ly->q_norm},
            {"attn_k_norm", in->head_dim, &ly->k_norm},
            {"post_attention_norm", D, &ly->post_attn_norm},
            {"post_ffw_norm", D, &ly->post_ffn_norm},
        };
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) {
            char name[MODEL_NAME_MAX];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[i].suffix);
            if ((rc = load_vector(m, name, norms[i].n, norms[i].vec, err)) < 0)
                return rc;
        }
        const core_attn_cfg_t swa = {.swa_window = m->swa_window, .swa_period = m->swa_period};
        ly->rope_set = core_attn_layer_window(&swa, l) > 0 ? 1 : 0;
    }
    return pack_matrices(m, err);
}

/* 64-bit FNV-1a over what identifies the network: the hyperparameters, every
 * tensor's name, type and shape, and a sample of every tensor's bytes (its
 * first and last 4 KiB) so that two fine-tunes of one base with identical
 * shapes still differ, without hashing the whole file at load. */
static void compute_fingerprint(core_model_t *m)
{
    const core_model_info_t *in = &m->info;
    fnv_t f = {0xcbf29ce484222325ULL};
    fnv_bytes(&f, in->arch, strlen(in->arch));
    const int64_t hp[] = {in->n_layer, in->n_embd,  in->n_ff,    in->n_head,
                          in->n_head_kv, in->head_dim, in->n_vocab, m->n_rot};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        fnv_u64(&f, (uint64_t)hp[i]);
    const double hf[] = {in->rope_base, in->rope_scale, in->rms_eps};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        uint64_t bits;
        memcpy(&bits, &hf[i], sizeof bits);
        fnv_u64(&f, bits);
    }
    if (m->arch == MODEL_ARCH_GEMMA3) {
        const double gf[] = {m->rope_base_local, m->q_mult, m->softcap};
        for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++) {
            uint64_t bits;
            memcpy(&bits, &gf[i], sizeof bits);
            fnv_u64(&f, bits);
        }
        fnv_u64(&f, (uint64_t)m->swa_window);
        fnv_u64(&f, (uint64_t)m->swa_period);
    }
    const int64_t nt = core_gguf_n_tensors(m->g);
    for (int64_t i = 0; i < nt; i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(m->g, i);
        fnv_bytes(&f, t->name, strlen(t->name) + 1);
        fnv_u64(&f, (uint64_t)t->type);
        fnv_u64(&f, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            fnv_u64(&f, (uint64_t)t->ne[d]);
        const size_t sample = 4096;
        const unsigned char *data = t->data;
        if (t->nbytes <= 2 * sample) {
            fnv_bytes(&f, data, t->nbytes);
        } else {
            fnv_bytes(&f, data, sample);
            fnv_bytes(&f, data + t->nbytes - sample, sample);
        }
    }
    snprintf(m->info.fingerprint, sizeof m->info.fingerprint, "%016llx", (unsigned long long)f.h);
}

/* An adapter's learned matrices only mean something for the network they
 * were trained on; one that names its base model must name this one. An
 * adapter without darkformer.base_fingerprint (hand-made, tests) is taken
 * as it is. */
static int check_adapter_owner(const core_model_t *m, const char *adapter_path, core_error_t *err)
{
    core_features_adapter_info_t ai = {0};
    int rc = core_features_adapter_info(m->adapter, &ai, err);
    if (rc < 0)
        return rc;
    if (ai.base_fingerprint[0] && strcmp(ai.base_fingerprint, m->info.fingerprint) != 0)
        return core_error_set(err, CORE_EMISMATCH,
                              "adapter %s was made for the model with fingerprint %s, not "
                              "this one (fingerprint %s)",
                              adapter_path, ai.base_fingerprint, m->info.fingerprint);
    return 0;
}

int core_model_load(const char *path, const core_model_opts_t *opts, core_model_t **out,
                    core_error_t *err)
{
    static const core_model_opts_t defaults = {.attn_kind = CORE_ATTN_EXACT};
    *out = NULL;
    if (!opts)
        opts = &defaults;
    if (opts->max_ctx < 0 || opts->n_features < 0 || opts->window < 0 || opts->tile_floats < 0)
        return core_error_set(err, CORE_EINVAL,
                              "negative max_ctx, n_features, window or tile_floats");
    if (opts->n_threads < 0 || opts->n_threads > CORE_POOL_MAX_THREADS)
        return core_error_set(err, CORE_ERANGE, "thread count %d out of range [0, %d]",
                              opts->n_threads, CORE_POOL_MAX_THREADS);
    core_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return core_error_set(err, CORE_ENOMEM, "out of memory for the model");
    m->prompt_int8 = opts->prompt_int8 != 0;
    m->prompt_f32 = opts->prompt_f32 != 0;
    m->wtile_n = opts->tile_floats ? (size_t)opts->tile_floats : (size_t)MODEL_TILE_FLOATS;
    int rc = core_gguf_open(path, &m->g, err);
    if (rc < 0)
        goto fail;
    if ((rc = read_hparams(m, err)) < 0)
        goto fail;
    /* before the weights: their packing gives back the pages it samples */
    compute_fingerprint(m);
    if ((rc = load_weights(m, err)) < 0)
        goto fail;

    m->rope_inv_freq =
        malloc((size_t)m->n_rope_sets * (size_t)(m->n_rot / 2) * sizeof *m->rope_inv_freq);
    if (!m->rope_inv_freq) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for RoPE frequencies");
        goto fail;
    }
    /* set 0: the global layers (the file's base and linear scaling); set 1:
     * the local ones (their own base, unscaled) */
    for (int i = 0; i < m->n_rot / 2; i++) {
        m->rope_inv_freq[i] =
            pow(m->info.rope_base, -2.0 * i / (double)m->n_rot) / m->info.rope_scale;
        if (m->n_rope_sets > 1)
            m->rope_inv_freq[m->n_rot / 2 + i] = pow(m->rope_base_local, -2.0 * i / (double)m->n_rot);
    }

    if (opts->adapter_path) {
        if ((rc = core_gguf_open(opts->adapter_path, &m->adapter, err)) < 0 ||
            (rc = check_adapter_owner(m, opts->adapter_path, err)) < 0)
            goto fail;
    }
    core_attn_cfg_t cfg = {
        .kind = opts->attn_kind,
        .n_layer = m->info.n_layer,
        .n_head = m->info.n_head,
        .n_head_kv = m->info.n_head_kv,
        .head_dim = m->info.head_dim,
        .max_ctx = opts->max_ctx > 0 ? opts->max_ctx : m->info.n_ctx_train,
        .n_features = opts->n_features > 0 ? opts->n_features : 128,
        .window = opts->window,
        .seed = opts->seed,
        .sinks = opts->sinks,
        .prerope = opts->prerope,
        .decay_off = opts->decay_off,
        .linear_off = opts->linear_off,
        .memory = opts->memory,
        .memory_keep = opts->memory_keep,
        .kv_bits = opts->kv_bits,
        .n_rot = m->n_rot,
        .rope_base = m->info.rope_base,
        .rope_scale = m->info.rope_scale,
        .swa_window = m->swa_window,
        .swa_period = m->swa_period,
        .rope_halves = m->neox,
    };
    /* The pool is the only parallelism: sgemm runs inside its threads (prompt
     * tiles, the attention's units) on one OpenBLAS thread each. */
    core_blas_set_threads(1);
    if ((cfg.memory && (rc = core_attn_memory_heads_parse(&cfg, opts->memory_heads, err)) < 0) ||
        (rc = core_attn_new(&cfg, m->adapter, &m->attn, err)) < 0 ||
        (rc = core_pool_new(opts->n_threads, &m->pool, err)) < 0 ||
        (rc = core_attn_set_workers(m->attn, core_pool_size(m->pool), err)) < 0)
        goto fail;
    if (m->adapter &&
        (opts->attn_kind == CORE_ATTN_DARKFORMER || core_attn_kind_is_trig(opts->attn_kind))) {
        const int64_t qd = (int64_t)m->info.n_head * m->info.head_dim;
        if ((rc = core_lora_load(m->adapter, m->info.n_layer, m->info.n_embd, qd,
                                 (int64_t)m->info.n_head_kv * m->info.head_dim, &m->lora, err)) < 0)
            goto fail;
        if (core_lora_rank(m->lora) > m->info.n_ff) { /* its scratch is the FFN's gate rows */
            rc = core_error_set(err, CORE_EFORMAT, "adapter LoRA rank %d exceeds the FFN width %d",
                                core_lora_rank(m->lora), (int)m->info.n_ff);
            goto fail;
        }
        core_attn_set_params_salt(m->attn, core_lora_digest(m->lora));
    }
    *out = m;
    return 0;
fail:
    core_model_free(m);
    return rc;
}

int core_model_file_local_layers(const char *path)
{
    core_gguf_t *g = NULL;
    core_gguf_str_t a;
    if (!path || core_gguf_open(path, &g, NULL) < 0)
        return 0;
    const int yes = core_gguf_get_str(g, "general.architecture", &a, NULL) == 0 &&
                    str_eq(a, "gemma3");
    core_gguf_close(g);
    return yes;
}

void core_model_free(core_model_t *m)
{
    if (!m)
        return;
    core_pool_free(m->pool);
    core_lora_free(m->lora);
    free(m->qbuf);
    core_attn_free(m->attn);
    if (m->layers) {
        for (int l = 0; l < m->info.n_layer; l++) {
            layer_t *ly = &m->layers[l];
            free(ly->attn_norm);
            free(ly->ffn_norm);
            free(ly->q_norm);
            free(ly->k_norm);
            free(ly->post_attn_norm);
            free(ly->post_ffn_norm);
            const wmat_t *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                  &ly->w_gate, &ly->w_up, &ly->w_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                free(ws[i]->own);
        }
        free(m->layers);
    }
    free(m->output.own);
    free(m->pk_arena); /* tok_embd has no packed copy: it is packed only as the output */
    free(m->tok_embd.own);
    free(m->wtile);
    free(m->erow);
    free(m->panel);
    free(m->bsplit);
    free(m->out_norm);
    free(m->rope_inv_freq);
    free(m->rope_cs);
    free(m->x);
    free(m->xn);
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->att);
    free(m->gate);
    free(m->up);
    free(m->pos);
    free(m->seq_row);
    free(m->items);
    free(m->pre_n);
    free(m->jobs);
    free(m->lrows);
    free(m->logits);
    core_gguf_close(m->adapter);
    core_gguf_close(m->g);
    free(m);
}

const core_model_info_t *core_model_info(const core_model_t *m)
{
    return &m->info;
}

int core_model_threads(const core_model_t *m)
{
    return core_pool_size(m->pool);
}

void core_model_run(core_model_t *m, core_pool_fn fn, void *ctx)
{
    core_pool_run(m->pool, fn, ctx);
}

const core_gguf_t *core_model_gguf(const core_model_t *m)
{
    return m->g;
}

core_attn_t *core_model_attn(core_model_t *m)
{
    return m->attn;
}

void core_model_set_tap(core_model_t *m, core_model_tap_fn fn, void *ud)
{
    m->tap = fn;
    m->tap_ud = fn ? ud : NULL;
}

/* ---------------------------------------------------------------- forward */

static int grow(void **p, size_t bytes)
{
    void *n = realloc(*p, bytes);
    if (!n)
        return -1;
    *p = n;
    return 0;
}

static int ensure_scratch(core_model_t *m, int64_t T, core_error_t *err)
{
    const core_model_info_t *in = &m->info;
    if (!m->lrows || !m->logits || !m->wtile || !m->erow || !m->panel) {
        free(m->lrows);
        free(m->logits);
        free(m->wtile);
        free(m->erow);
        free(m->panel);
        int64_t kmax = in->n_embd > in->n_ff ? in->n_embd : in->n_ff;
        if ((int64_t)in->n_head * in->head_dim > kmax)
            kmax = (int64_t)in->n_head * in->head_dim;
        if ((int64_t)m->wtile_n < kmax)
            m->wtile_n = (size_t)kmax;
        const size_t threads = (size_t)core_pool_size(m->pool);
        m->lrows = malloc((size_t)MODEL_LOGIT_ROWS * (size_t)in->n_embd * sizeof(float));
        m->logits = malloc((size_t)MODEL_LOGIT_ROWS * (size_t)in->n_vocab * sizeof(float));
        m->wtile = malloc(threads * m->wtile_n * sizeof(float));
        m->erow = malloc(m->tok_embd.row_bytes ? m->tok_embd.row_bytes : 1);
        m->panel_n = core_q8_panel_floats(kmax); /* a multiple of 16 floats: 64 bytes */
        m->panel = aligned_alloc(64, threads * m->panel_n * sizeof(float));
        if (!m->lrows || !m->logits || !m->wtile || !m->erow || !m->panel)
            return core_error_set(err, CORE_ENOMEM, "out of memory for the logits scratch");
    }
    if (T <= m->cap_rows)
        return 0;
    const size_t t = (size_t)T, f = sizeof(float);
    const size_t D = (size_t)in->n_embd, qd = (size_t)in->n_head * (size_t)in->head_dim,
                 kvd = (size_t)in->n_head_kv * (size_t)in->head_dim, FF = (size_t)in->n_ff;
    if (grow((void **)&m->x, t * D * f) || grow((void **)&m->xn, t * D * f) ||
        grow((void **)&m->q, t * qd * f) || grow((void **)&m->k, t * kvd * f) ||
        grow((void **)&m->v, t * kvd * f) || grow((void **)&m->att, t * qd * f) ||
        grow((void **)&m->gate, t * FF * f) || grow((void **)&m->up, t * FF * f) ||
        grow((void **)&m->pos, t * sizeof *m->pos) ||
        grow((void **)&m->rope_cs, t * (size_t)m->n_rope_sets * (size_t)m->n_rot * f) ||
        grow((void **)&m->seq_row, t * sizeof *m->seq_row) ||
        grow((void **)&m->items, t * sizeof *m->items) ||
        grow((void **)&m->pre_n, t * sizeof *m->pre_n) ||
        grow((void **)&m->jobs, (t + 1) * MODEL_MAX_OPS * sizeof *m->jobs))
        return core_error_set(err, CORE_ENOMEM, "out of memory for a forward of %lld rows",
                              (long long)T);
    int64_t kmax = in->n_embd > in->n_ff ? in->n_embd : in->n_ff;
    if ((int64_t)qd > kmax)
        kmax = (int64_t)qd;
    /* the logits rows reuse it: at most MODEL_LOGIT_ROWS of them */
    const int64_t qrows = T > MODEL_LOGIT_ROWS ? T : MODEL_LOGIT_ROWS;
    if (grow(&m->qbuf, core_q8_act_bytes(qrows, kmax)))
        return core_error_set(err, CORE_ENOMEM, "out of memory for a forward of %lld rows",
                              (long long)T);
    if (!m->prompt_f32 && core_q8_amx_panels_available()) { /* contents need not survive */
        free(m->bsplit);
        const size_t bytes = core_q8_amx_split_words(T, kmax) * sizeof(uint16_t);
        m->bsplit = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!m->bsplit)
            return core_error_set(err, CORE_ENOMEM, "out of memory for a forward of %lld rows",
                                  (long long)T);
    }
    m->cap_rows = T;
    return 0;
}

/* y = x / sqrt(mean(x^2) + eps) * w, per row of n values. */
static void rmsnorm(float *y, const float *x, const float *w, int64_t n, double eps)
{
    /* the sum of squares in four chains: one waited on every addition
     * (~2,300 cycles a row of 576, 61 rows a token) */
    const float r = (float)(1.0 / sqrt(core_dot_f32(x, x, n) / (double)n + eps));
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * r * w[i];
}

/* The cos, sin pairs of position pos's RoPE angles, once per row and forward
 * (every layer's q and k rows use them). Angles in double: pos * freq loses
 * the fraction in float once pos is in the millions. */
static void rope_angles(int n_rot, const double *inv_freq, int64_t pos,
                        float *cs /* [n_rot] cos,sin pairs */)
{
    for (int64_t i = 0; i < n_rot / 2; i++) {
        const double ang = (double)pos * inv_freq[i];
        cs[2 * i] = (float)cos(ang);
        cs[2 * i + 1] = (float)sin(ang);
    }
}

/* Rotates the first n_rot dims of each of nh heads of one row by the angles
 * cs (rope_angles): consecutive pairs (x[2i], x[2i+1]), or with neox the
 * halves' pairs (x[i], x[i + n_rot/2]). */
static void rope_row(float *x, int nh, int hd, int n_rot, int neox, const float *cs)
{
    const int64_t half = n_rot / 2, i1 = neox ? half : 1, step = neox ? 1 : 2;
    for (int h = 0; h < nh; h++) {
        float *p = x + (int64_t)h * hd;
        for (int64_t i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float a = p[i * step], b = p[i * step + i1];
            p[i * step] = a * c - b * s;
            p[i * step + i1] = a * s + b * c;
        }
    }
}

/* RMSNorm of each of nh heads of hd values of one row, in place (gemma3's q
 * and k norms). */
static void head_norm_row(float *x, int nh, int hd, const float *w, double eps)
{
    for (int h = 0; h < nh; h++)
        rmsnorm(x + (int64_t)h * hd, x + (int64_t)h * hd, w, hd, eps);
}

static int check_batch(const core_model_t *m, const core_batch_seq_t *seqs, int n_seqs,
                       int64_t *T_out, core_error_t *err)
{
    if (n_seqs < 0 || (n_seqs > 0 && !seqs))
        return core_error_set(err, CORE_EINVAL, "bad batch (%d sequences)", n_seqs);
    int64_t T = 0;
    for (int b = 0; b < n_seqs; b++) {
        const core_batch_seq_t *sq = &seqs[b];
        if (!sq->state || !sq->tokens || sq->n_tokens < 1)
            return core_error_set(err, CORE_EINVAL,
                                  "sequence %d: needs a state and at least one token", b);
        if (sq->logits_mode != CORE_LOGITS_NONE && sq->logits_mode != CORE_LOGITS_LAST &&
            sq->logits_mode != CORE_LOGITS_ALL)
            return core_error_set(err, CORE_EINVAL, "sequence %d: bad logits mode %d", b,
                                  sq->logits_mode);
        if (sq->logits_mode != CORE_LOGITS_NONE && !sq->logits)
            return core_error_set(err, CORE_EINVAL, "sequence %d: logits requested without a buffer",
                                  b);
        /* T >= 0 and n_tokens > 0 here: the sum in the message is taken
         * unsigned, where it cannot overflow even for n_tokens near INT64_MAX. */
        if (sq->n_tokens > CORE_MODEL_MAX_ROWS - T)
            return core_error_set(err, CORE_ERANGE,
                                  "batch exceeds %d tokens per forward (sequence %d brings it to "
                                  "%llu); split the prompt into chunks",
                                  CORE_MODEL_MAX_ROWS, b,
                                  (unsigned long long)T + (unsigned long long)sq->n_tokens);
        for (int64_t i = 0; i < sq->n_tokens; i++) {
            if (sq->tokens[i] < 0 || sq->tokens[i] >= m->info.n_vocab)
                return core_error_set(err, CORE_EINVAL,
                                      "sequence %d: token %lld is %d, outside the vocabulary [0,%d)",
                                      b, (long long)i, (int)sq->tokens[i], m->info.n_vocab);
        }
        for (int c = 0; c < b; c++) {
            if (seqs[c].state == sq->state)
                return core_error_set(err, CORE_EINVAL,
                                      "sequences %d and %d share one attention state", c, b);
        }
        T += sq->n_tokens;
    }
    *T_out = T;
    return 0;
}

/* One weight matrix applied to the current input: C[T][w->rows] = A · Wᵀ +
 * beta * C. */
typedef struct wop {
    const wmat_t *w;
    float beta;
    float *c;
    int64_t ldc;
} wop_t;

/* C[n][w->rows] = A[n][k] · Wᵀ + beta * C for a block-type w and a prompt
 * sequence's n rows: tile by tile, a tile some rows of w dequantized
 * (exactly, as core_dequantize) into a thread's buffer and multiplied with
 * sgemm. The f32 values live in cache for one tile instead of in memory for
 * the model's lifetime; the products are those of sgemm on the whole f32
 * matrix, split by output columns (test_core_model weight_tiles_match_one_tile).
 * The tiles are shared out on the pool, each thread dequantizing its own and
 * calling sgemm on it: OpenBLAS runs on one thread (core_model_load), the
 * pool is the only parallelism, so nothing oversubscribes the cores and
 * dequantizing is no longer serial. */
/* Every prompt sequence of more than MODEL_TILE_MIN_ROWS rows (rows pre_n[g]
 * from row Td on, as in matmuls) times w, on dequantized tiles: each tile is
 * dequantized once for all of them, then each sequence is its own sgemm on
 * it, the same call as when it is alone (so the same bits). */
typedef struct tiles_run {
    core_model_t *m;
    const wmat_t *w;
    const int64_t *pre_n;
    int64_t n_pre, Td, lda, ldc, tile;
    const float *a;
    float beta;
    float *c;
    _Atomic int64_t next; /* first row of the next tile to take */
} tiles_run_t;

static void tiles_worker(void *ctx, int worker, int n_workers)
{
    (void)n_workers;
    tiles_run_t *t = ctx;
    const wmat_t *w = t->w;
    const int64_t k = w->k;
    float *buf = t->m->wtile + (size_t)worker * t->m->wtile_n;
    for (;;) {
        const int64_t j0 = atomic_fetch_add_explicit(&t->next, t->tile, memory_order_relaxed);
        if (j0 >= w->rows)
            return;
        const int64_t nj = w->rows - j0 < t->tile ? w->rows - j0 : t->tile;
        /* rows are contiguous whole blocks: one call for the tile */
        core_qdot_dequant(w->type, (const unsigned char *)w->data + (size_t)j0 * w->row_bytes,
                          buf, nj * k);
        for (int64_t g = 0, r0 = t->Td; g < t->n_pre; r0 += t->pre_n[g], g++)
            if (t->pre_n[g] > MODEL_TILE_MIN_ROWS)
                core_gemm_nt(t->pre_n[g], nj, k, 1.0f, t->a + r0 * t->lda, t->lda, buf, k,
                             t->beta, t->c + r0 * t->ldc + j0, t->ldc);
    }
}

static void gemm_tiles(core_model_t *m, int64_t Td, const int64_t *pre_n, int64_t n_pre,
                       const float *a, int64_t lda, const wmat_t *w, float beta, float *c,
                       int64_t ldc)
{
    int any = 0;
    for (int64_t g = 0; g < n_pre; g++)
        any |= pre_n[g] > MODEL_TILE_MIN_ROWS;
    if (!any)
        return;
    /* The same tiles whatever the thread count: sgemm's rounding depends on
     * how the columns are split (test_core_pool checks 1-4 threads). */
    int64_t tile = MODEL_TILE_ROWS;
    if (tile > (int64_t)m->wtile_n / w->k)
        tile = (int64_t)m->wtile_n / w->k;
    tiles_run_t t = {.m = m, .w = w, .pre_n = pre_n, .n_pre = n_pre, .Td = Td, .lda = lda,
                     .ldc = ldc, .tile = tile, .a = a, .beta = beta, .c = c};
    atomic_init(&t.next, 0);
    core_pool_run(m->pool, tiles_worker, &t);
}

/* The prompt rows (n from row Td on, every prompt sequence's) times each
 * packed op's weights through core_qmatmul_packed: one pool run for all ops,
 * shared out in column chunks of up to CORE_Q8_PANEL_ROWS weight rows, each
 * dequantized once into the thread's panel for all the rows. A row's bits do
 * not depend on the rows beside it, so every sequence gets the numbers it
 * has alone, however the batch and its chunks fall. */
typedef struct panels_run {
    core_model_t *m;
    const wop_t *const *ops;
    int n_ops;
    int64_t k, n, lda, chunk;
    const float *a; /* the first prompt row */
    const uint16_t *as; /* the prompt rows split, or NULL: the f32 panels */
    int64_t r0;     /* its row in the forward: ops' c rows from here */
    _Atomic int64_t next; /* next chunk over the ops' concatenated columns */
} panels_run_t;

static void panels_worker(void *ctx, int worker, int n_workers)
{
    (void)n_workers;
    panels_run_t *t = ctx;
    float *panel = t->m->panel + (size_t)worker * t->m->panel_n;
    for (;;) {
        int64_t j0 = atomic_fetch_add_explicit(&t->next, t->chunk, memory_order_relaxed);
        int i = 0;
        while (i < t->n_ops && j0 >= t->ops[i]->w->rows) /* ops are chunk-aligned: see below */
            j0 -= (t->ops[i]->w->rows + t->chunk - 1) / t->chunk * t->chunk, i++;
        if (i == t->n_ops)
            return;
        const wop_t *o = t->ops[i];
        const int64_t j1 = o->w->rows - j0 < t->chunk ? o->w->rows : j0 + t->chunk;
        if (t->as)
            (void)core_qmatmul_packed_amx(o->w->type, t->n, j0, j1, t->k, t->as, o->w->pk, panel,
                                          o->beta, o->c + t->r0 * o->ldc, o->ldc);
        else
            (void)core_qmatmul_packed(o->w->type, t->n, j0, j1, t->k, t->a, t->lda, o->w->pk,
                                      panel, o->beta, o->c + t->r0 * o->ldc, o->ldc);
    }
}

static void gemm_panels(core_model_t *m, int64_t Td, int64_t n, int64_t k, const float *a,
                        int64_t lda, const wop_t *const *ops, int n_ops)
{
    int64_t cols = 0;
    for (int i = 0; i < n_ops; i++)
        cols += ops[i]->w->rows;
    /* the largest chunk that still gives every thread a few to take */
    int64_t chunk = CORE_Q8_PANEL_ROWS;
    while (chunk > CORE_Q8_PACK_ROWS && cols / chunk < 4 * (int64_t)core_pool_size(m->pool))
        chunk /= 2;
    panels_run_t t = {.m = m, .ops = ops, .n_ops = n_ops, .k = k, .n = n, .lda = lda,
                      .chunk = chunk, .a = a + Td * lda, .r0 = Td};
    /* on AMX-BF16 tiles (bsplit exists unless opts.prompt_f32 or the CPU
     * has none): the rows split once for every op and chunk */
    if (m->bsplit && core_q8_amx_panels_used() &&
        core_q8_amx_split(t.a, lda, n, k, m->bsplit) == 0)
        t.as = m->bsplit;
    atomic_init(&t.next, 0);
    core_pool_run(m->pool, panels_worker, &t);
}

/* Applies every op to A[k] (lda), whose rows are grouped by sequence: first
 * the Td decode rows, then the rows of each prompt sequence (pre_n[n_pre]).
 * Decode rows are bound by reading the weights, so they read the ~5-bit
 * blocks in place (quantized to 8 bits once, for every op with an integer
 * kernel). Prompt rows of a packed matrix: all in one product on panels
 * (gemm_panels). Otherwise a prompt sequence's rows read the weights in
 * place when there are at most MODEL_TILE_MIN_ROWS (f32 activations); more
 * rows amortize the dequantization and go to sgemm on dequantized tiles
 * (gemm_tiles: each tile once for all such sequences of the call). F32
 * weights (no qdot kernel)
 * are read as f32 (w32) on every path. One call per sequence, not one over
 * all rows: sgemm's rounding depends on the number of rows, and a sequence's
 * numbers must not depend on what else shares the batch (the 8-bit rounding
 * of the next decode step would amplify a last-bit difference). All
 * core/qdot products of the call are one pool run. */
/* The adapter's LoRA update of projection which over this forward's prompt
 * rows, one product per prompt sequence so a sequence's result does not
 * depend on the batch it is in (the decode rows': layer_rows, four at a
 * time). m->gate is free until the FFN: the [rows][r] scratch. */
enum { MODEL_LORA_ROWS = 4 };
static void lora_prompts(core_model_t *m, int l, int which, int64_t Td, const float *x,
                         int64_t ldx, float *y, int64_t ldy)
{
    for (int64_t g = 0, r0 = Td; g < m->n_pre; r0 += m->pre_n[g], g++)
        core_lora_add(m->lora, l, which, m->pre_n[g], x + r0 * ldx, ldx, y + r0 * ldy, ldy,
                      m->gate);
}

/* qa_ready: m->qa already holds the Td decode rows of a in 8 bits
 * (layer_rows). */
static void matmuls(core_model_t *m, int64_t Td, const int64_t *pre_n, int64_t n_pre, int64_t k,
                    const float *a, int64_t lda, const wop_t *ops, int n_ops, int qa_ready)
{
    core_qdot_job_t *jobs = m->jobs; /* [MODEL_MAX_OPS * (1 + n_pre)] */
    const wop_t *panel_ops[MODEL_MAX_OPS];
    int nj = 0, quantized = qa_ready, n_panel = 0;
    int64_t n_prompt = 0;
    for (int64_t g = 0; g < n_pre; g++)
        n_prompt += pre_n[g];
    for (int i = 0; i < n_ops && i < MODEL_MAX_OPS; i++) {
        const wop_t *o = &ops[i];
        const wmat_t *qw = o->w;
        /* clang-analyzer takes &ly->wq for NULL when it cannot rule out a
         * NULL m->layers (a loaded model has its layers) */
        /* NOLINTNEXTLINE(clang-analyzer-core.NullDereference) */
        const int panels = qw->pk && core_q8_pack_supported(qw->type);
        const core_qdot_job_t base = {.type = qw->type, .w = qw->data, .pk = qw->pk,
                                      .row_bytes = qw->row_bytes, .n = qw->rows,
                                      .beta = o->beta, .ldc = o->ldc};
        if (Td > 0 && !qw->qdot) {
            core_gemm_nt_small(Td, qw->rows, k, 1.0f, a, lda, qw->w32, k, o->beta, o->c, o->ldc);
        } else if (Td > 0) {
            core_qdot_job_t *jb = &jobs[nj++];
            *jb = base;
            jb->c = o->c;
            if (core_q8_supported(qw->type) && k % CORE_Q8_BLOCK == 0) {
                if (!quantized) {
                    core_q8_act_init(&m->qa, m->qbuf, Td, k);
                    core_q8_quantize(&m->qa, a, lda);
                    quantized = 1;
                }
                jb->qa = &m->qa;
            } else {
                jb->a = a;
                jb->m = Td;
                jb->k = k;
                jb->lda = lda;
            }
        }
        if (panels) {
            if (n_prompt > 0)
                panel_ops[n_panel++] = o;
            continue;
        }
        for (int64_t g = 0, r0 = Td; g < n_pre; r0 += pre_n[g], g++) {
            const int64_t n = pre_n[g];
            if (!qw->qdot) {
                core_gemm_nt(n, qw->rows, k, 1.0f, a + r0 * lda, lda, qw->w32, k, o->beta,
                             o->c + r0 * o->ldc, o->ldc);
                continue;
            }
            if (n > MODEL_TILE_MIN_ROWS)
                continue; /* gemm_tiles below, with the other long ones */
            core_qdot_job_t *jb = &jobs[nj++];
            *jb = base;
            jb->c = o->c + r0 * o->ldc;
            jb->a = a + r0 * lda;
            jb->m = n;
            jb->k = k;
            jb->lda = lda;
        }
        if (qw->qdot)
            gemm_tiles(m, Td, pre_n, n_pre, a, lda, qw, o->beta, o->c, o->ldc);
    }
    if (nj > 0)
        core_qdot_run_jobs(m->pool, jobs, nj);
    if (n_panel > 0)
        gemm_panels(m, Td, n_prompt, k, a, lda, panel_ops, n_panel);
}

/* One op on the forward's rows: Tq in 8 bits, then n_pre prompt sequences
 * (m->pre_n). */
static void matmul(core_model_t *m, int64_t Tq, int64_t n_pre, int64_t k, const float *a,
                   int64_t lda, const wmat_t *w, float beta, float *c, int64_t ldc)
{
    const wop_t op = {w, beta, c, ldc};
    matmuls(m, Tq, m->pre_n, n_pre, k, a, lda, &op, 1, 0);
}

/* 1 when every row of a forward, prompt rows too, is quantized to 8 bits
 * for the products, as decode rows are (opts.prompt_int8), where every
 * matrix runs on the packed integer kernel. A prompt then costs ~0.6x its
 * f32 panels' time, and a row's products still do not depend on the rows
 * beside it (each is quantized by itself). The price, why it is not the
 * default: prompt rows round their activations to 8 bits as decode rows
 * do (perplexity +0.2-0.4%), and a prompt prefilled in other pieces (a
 * prefix-cache hit, a session's turns) then differs from the same prompt
 * prefilled whole by 8-bit steps rather than by float rounding, enough to
 * change greedy replies (docs/PERFORMANCE.md). */
static int all_rows_q8(const core_model_t *m)
{
    return m->prompt_int8 && m->all_packed && core_q8_pack_supported(m->output.type);
}

int core_model_prompt_int8(const core_model_t *m)
{
    return all_rows_q8(m);
}

int core_model_prompt_amx(const core_model_t *m)
{
    return !m->prompt_f32 && !all_rows_q8(m) && m->pk_arena && core_q8_amx_panels_used() &&
           core_qdot_isa() == CORE_QDOT_AVX512VNNI;
}

/* The nr gathered rows: decode rows (decode != 0), or the rows of ng prompt
 * sequences, gn[g] each (one product per sequence, as in the forward). */
static void flush_logits(core_model_t *m, float *const *dst, int nr, int decode,
                         const int64_t *gn, int64_t ng)
{
    const int64_t D = m->info.n_embd, V = m->info.n_vocab;
    const wop_t op = {&m->output, 0.0f, m->logits, V};
    const int q8 = decode || all_rows_q8(m);
    matmuls(m, q8 ? nr : 0, gn, q8 ? 0 : ng, D, m->lrows, D, &op, 1, 0);
    for (int i = 0; i < nr; i++)
        memcpy(dst[i], m->logits + (int64_t)i * V, (size_t)V * sizeof(float));
    if (m->softcap > 0.0) { /* gemma3 with final_logit_softcapping: c·tanh(z/c) */
        const float c = (float)m->softcap, ic = (float)(1.0 / m->softcap);
        for (int i = 0; i < nr; i++)
            for (int64_t j = 0; j < V; j++)
                dst[i][j] = c * tanhf(dst[i][j] * ic);
    }
}

/* Final norm + output head for the requested rows only, MODEL_LOGIT_ROWS at a
 * time: one GEMM reads the [V][D] head once per chunk rather than once per
 * sequence, and the [R][V] scratch stays bounded. Decode rows (pass 0) and
 * prompt rows (pass 1) are flushed apart, prompt rows in one product per
 * sequence: each row keeps the path and rounding it has alone. */
static void compute_logits(core_model_t *m, core_batch_seq_t *seqs, int n_seqs)
{
    const int64_t D = m->info.n_embd, V = m->info.n_vocab;
    float *dst[MODEL_LOGIT_ROWS];
    int64_t gn[MODEL_LOGIT_ROWS]; /* rows per sequence in the gathered rows */
    for (int pass = 0; pass < 2; pass++) {
        int nr = 0;
        int64_t ng = 0;
        for (int b = 0; b < n_seqs; b++) {
            const core_batch_seq_t *sq = &seqs[b];
            if (sq->logits_mode == CORE_LOGITS_NONE || (sq->n_tokens == 1) != (pass == 0))
                continue;
            const int64_t first = sq->logits_mode == CORE_LOGITS_ALL ? 0 : sq->n_tokens - 1;
            gn[ng++] = 0;
            for (int64_t r = first; r < sq->n_tokens; r++) {
                rmsnorm(m->lrows + (int64_t)nr * D, m->x + (m->seq_row[b] + r) * D, m->out_norm,
                        D, m->info.rms_eps);
                dst[nr++] = sq->logits + (r - first) * V;
                gn[ng - 1]++;
                if (nr == MODEL_LOGIT_ROWS) {
                    flush_logits(m, dst, nr, pass == 0, gn, ng);
                    nr = 0;
                    ng = 0;
                    if (r + 1 < sq->n_tokens)
                        gn[ng++] = 0;
                }
            }
        }
        if (nr > 0)
            flush_logits(m, dst, nr, pass == 0, gn, ng);
    }
}

/* The final-norm rows of the sequences that asked for them (seq.hidden):
 * the same rmsnorm compute_logits gives the output head. */
static void compute_hidden(core_model_t *m, core_batch_seq_t *seqs, int n_seqs)
{
    const int64_t D = m->info.n_embd;
    for (int b = 0; b < n_seqs; b++) {
        const core_batch_seq_t *sq = &seqs[b];
        if (!sq->hidden)
            continue;
        for (int64_t r = 0; r < sq->n_tokens; r++)
            rmsnorm(sq->hidden + r * D, m->x + (m->seq_row[b] + r) * D, m->out_norm, D,
                    m->info.rms_eps);
    }
}

/* Row id of the embedding matrix as f32 into dst. When the output shares
 * tok_embd and has a packed copy, the row's bytes come from that copy (the
 * file's pages of the matrix stay out of the resident set, pack_matrices);
 * m->erow holds the unpacked bytes. */
static void embed_row(core_model_t *m, int32_t id, float *dst)
{
    const wmat_t *e = &m->tok_embd;
    if (e->w32) {
        memcpy(dst, e->w32 + (int64_t)id * e->k, (size_t)e->k * sizeof(float));
    } else if (m->info.tied_output && m->output.pk) {
        core_q8_unpack(e->type, m->output.pk, e->k, id, 1, m->erow);
        core_dequantize(e->type, m->erow, dst, e->k, NULL);
    } else {
        core_dequantize(e->type, (const unsigned char *)e->data + (size_t)id * e->row_bytes, dst,
                        e->k, NULL);
    }
}

/* A layer's per-row work between its products, which would otherwise run on
 * the calling thread alone while the pool waits: the decode rows' LoRA
 * updates (MODEL_LORA_ROWS rows a call: the small kernels give a row of up
 * to four the bits it gets alone, and read A and B once for the four),
 * RoPE, RMSNorm and the 8-bit quantization of the next product's decode
 * rows. Units of MODEL_LORA_ROWS rows from row 0 taken from a counter; a
 * row's result does not depend on the unit or the thread, so the forward's
 * bits are those of doing it all on one thread. The prompt sequences' LoRA
 * (one product per sequence) stays with the caller, before the run. */
enum { ROWS_ATTN_NORM, ROWS_ROPE, ROWS_FFN_NORM, ROWS_POST_FFN };
typedef struct rows_run {
    core_model_t *m;
    const layer_t *ly;
    int stage, l, quant; /* quant: the first Tq rows go to m->qa */
    int64_t T, Td, Tq;
    _Atomic int64_t next;
} rows_run_t;

/* Rows [r0, r0 + n) of qa as an activation of their own (the layout is row
 * by row in each of its arrays). */
static core_q8_act_t act_rows(const core_q8_act_t *qa, int64_t r0, int64_t n)
{
    return (core_q8_act_t){.m = n,
                           .k = qa->k,
                           .nb = qa->nb,
                           .q = qa->q + r0 * qa->nb * CORE_Q8_BLOCK,
                           .d = qa->d + r0 * qa->nb,
                           .s = qa->s + r0 * qa->nb,
                           .ds = qa->ds + r0 * qa->nb};
}

static void rows_worker(void *ctx, int worker, int n_workers)
{
    (void)worker;
    (void)n_workers;
    rows_run_t *t = ctx;
    core_model_t *m = t->m;
    const core_model_info_t *in = &m->info;
    const int64_t D = in->n_embd, H = in->n_head, Hkv = in->n_head_kv, Hd = in->head_dim;
    const int64_t qd = H * Hd, kvd = Hkv * Hd, r = m->lora ? core_lora_rank(m->lora) : 0;
    for (;;) {
        const int64_t t0 = atomic_fetch_add_explicit(&t->next, MODEL_LORA_ROWS,
                                                     memory_order_relaxed);
        if (t0 >= t->T)
            return;
        const int64_t t1 = t->T - t0 < MODEL_LORA_ROWS ? t->T : t0 + MODEL_LORA_ROWS;
        const int64_t nd = t->Td > t1 ? t1 - t0 : t->Td > t0 ? t->Td - t0 : 0; /* decode rows */
        const int64_t nq = t->Tq > t1 ? t1 - t0 : t->Tq > t0 ? t->Tq - t0 : 0; /* 8-bit rows */
        float *scratch = m->gate + t0 * r; /* [nd][r]: this unit's part of gate's rows */
        if (t->stage == ROWS_ROPE) {
            if (m->lora && nd > 0) {
                core_lora_add(m->lora, t->l, CORE_LORA_Q, nd, m->xn + t0 * D, D, m->q + t0 * qd,
                              qd, scratch);
                core_lora_add(m->lora, t->l, CORE_LORA_K, nd, m->xn + t0 * D, D, m->k + t0 * kvd,
                              kvd, scratch);
                core_lora_add(m->lora, t->l, CORE_LORA_V, nd, m->xn + t0 * D, D, m->v + t0 * kvd,
                              kvd, scratch);
            }
            const int64_t cs_row = (int64_t)m->n_rope_sets * m->n_rot;
            const int64_t cs_off = (int64_t)t->ly->rope_set * m->n_rot;
            for (int64_t i = t0; i < t1; i++) {
                float *qi = m->q + i * qd, *ki = m->k + i * kvd;
                const float *cs = m->rope_cs + i * cs_row + cs_off;
                if (t->ly->q_norm) {
                    head_norm_row(qi, (int)H, (int)Hd, t->ly->q_norm, in->rms_eps);
                    head_norm_row(ki, (int)Hkv, (int)Hd, t->ly->k_norm, in->rms_eps);
                }
                rope_row(qi, (int)H, (int)Hd, m->n_rot, m->neox, cs);
                rope_row(ki, (int)Hkv, (int)Hd, m->n_rot, m->neox, cs);
                if (m->q_mult != 1.0f)
                    for (int64_t j = 0; j < qd; j++)
                        qi[j] *= m->q_mult;
            }
            continue;
        }
        if (t->stage == ROWS_POST_FFN) { /* x += post_ffn_norm(FFN output in xn) */
            for (int64_t i = t0; i < t1; i++) {
                float *xi = m->x + i * D, *yi = m->xn + i * D;
                rmsnorm(yi, yi, t->ly->post_ffn_norm, D, in->rms_eps);
                for (int64_t j = 0; j < D; j++)
                    xi[j] += yi[j];
            }
            continue;
        }
        if (t->stage == ROWS_FFN_NORM && t->ly->post_attn_norm) {
            /* x += post_attn_norm(attention output in xn) */
            for (int64_t i = t0; i < t1; i++) {
                float *xi = m->x + i * D, *yi = m->xn + i * D;
                rmsnorm(yi, yi, t->ly->post_attn_norm, D, in->rms_eps);
                for (int64_t j = 0; j < D; j++)
                    xi[j] += yi[j];
            }
        }
        if (t->stage == ROWS_FFN_NORM && m->lora && nd > 0)
            core_lora_add(m->lora, t->l, CORE_LORA_O, nd, m->att + t0 * qd, qd, m->x + t0 * D, D,
                          scratch);
        const float *w = t->stage == ROWS_ATTN_NORM ? t->ly->attn_norm : t->ly->ffn_norm;
        for (int64_t i = t0; i < t1; i++)
            rmsnorm(m->xn + i * D, m->x + i * D, w, D, in->rms_eps);
        if (t->quant && nq > 0) {
            core_q8_act_t part = act_rows(&m->qa, t0, nq);
            core_q8_quantize(&part, m->xn + t0 * D, D);
        }
    }
}

/* 1 when a product of rows of k values by w quantizes its decode rows to
 * 8 bits (matmuls). */
static int takes_q8(const wmat_t *w, int64_t k)
{
    return w->qdot && core_q8_supported(w->type) && k % CORE_Q8_BLOCK == 0;
}

/* One stage of rows_worker over the forward's T rows (the first Td decode
 * rows, the first Tq in 8 bits): on the pool when there are two units or
 * more. Returns whether m->qa now holds the Tq rows (quantized for the
 * product that follows). */
static int layer_rows(core_model_t *m, int stage, int l, int64_t T, int64_t Td, int64_t Tq,
                      const wmat_t *next)
{
    const int quant = (stage == ROWS_ATTN_NORM || stage == ROWS_FFN_NORM) && Tq > 0 && next &&
                      takes_q8(next, m->info.n_embd);
    if (quant)
        core_q8_act_init(&m->qa, m->qbuf, Tq, m->info.n_embd);
    rows_run_t t = {.m = m, .ly = &m->layers[l], .stage = stage, .l = l, .quant = quant,
                    .T = T, .Td = Td, .Tq = Tq};
    atomic_init(&t.next, 0);
    if (T > MODEL_LORA_ROWS)
        core_pool_run(m->pool, rows_worker, &t);
    else
        rows_worker(&t, 0, 1);
    return quant;
}

/* SwiGLU's product g = silu(g) * u = g / (1 + e^-g) * u, or GeGLU's
 * gelu(g) * u (gemma3), a row at a time (core_silu_mul_f32 /
 * core_gelu_mul_f32: one vector pass, whose bits do not depend on where an
 * element sits, so neither does g), rows shared out on the pool. */
typedef struct silu_run {
    core_model_t *m;
    float *g;
    const float *u;
    int64_t rows, len, Tq; /* rows of len values; the first Tq go to 8 bits */
    int quant;             /* the Tq rows go to m->qa (8 bits) for w_down */
    _Atomic int64_t next;
} silu_run_t;

static void silu_worker(void *ctx, int worker, int n_workers)
{
    (void)worker;
    (void)n_workers;
    silu_run_t *t = ctx;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (i >= t->rows)
            return;
        if (t->m->gelu)
            core_gelu_mul_f32(t->g + i * t->len, t->u + i * t->len, t->len);
        else
            core_silu_mul_f32(t->g + i * t->len, t->u + i * t->len, t->len);
        if (t->quant && i < t->Tq) {
            core_q8_act_t part = act_rows(&t->m->qa, i, 1);
            core_q8_quantize(&part, t->g + i * t->len, t->len);
        }
    }
}

/* g = silu(g) * u over the forward's T rows of FF values, a row a unit
 * (on the pool for more than one row), each of the first Tq rows then
 * quantized to 8 bits for the down projection when it takes them. Returns
 * whether m->qa holds them. */
static int swiglu(core_model_t *m, const layer_t *ly, int64_t T, int64_t Tq)
{
    const int64_t FF = m->info.n_ff;
    const int quant = Tq > 0 && takes_q8(&ly->w_down, FF);
    if (quant)
        core_q8_act_init(&m->qa, m->qbuf, Tq, FF);
    silu_run_t t = {.m = m, .g = m->gate, .u = m->up, .rows = T, .len = FF, .Tq = Tq,
                    .quant = quant};
    atomic_init(&t.next, 0);
    if (T == 1)
        silu_worker(&t, 0, 1);
    else
        core_pool_run(m->pool, silu_worker, &t);
    return quant;
}

int core_model_forward(core_model_t *m, core_batch_seq_t *seqs, int n_seqs, core_error_t *err)
{
    int64_t T = 0;
    int rc = check_batch(m, seqs, n_seqs, &T, err);
    if (rc < 0 || T == 0)
        return rc;
    if ((rc = ensure_scratch(m, T, err)) < 0)
        return rc;
    for (int b = 0; b < n_seqs; b++) {
        if ((rc = core_attn_reserve(m->attn, seqs[b].state, seqs[b].n_tokens, err)) < 0)
            return rc;
    }

    const core_model_info_t *in = &m->info;
    const int64_t D = in->n_embd, FF = in->n_ff, H = in->n_head, Hkv = in->n_head_kv,
                  Hd = in->head_dim;
    const int64_t qd = H * Hd, kvd = Hkv * Hd;

    /* rows: the decode sequences' (one token each) first, then the others */
    int64_t Td = 0;
    for (int b = 0; b < n_seqs; b++)
        Td += seqs[b].n_tokens == 1;
    int64_t td = 0, tp = Td;
    m->n_pre = 0;
    for (int b = 0; b < n_seqs; b++) {
        m->seq_row[b] = seqs[b].n_tokens == 1 ? td++ : tp;
        if (seqs[b].n_tokens > 1) {
            tp += seqs[b].n_tokens;
            m->pre_n[m->n_pre++] = seqs[b].n_tokens;
        }
        const int64_t p0 = core_attn_state_pos(seqs[b].state);
        for (int64_t i = 0; i < seqs[b].n_tokens; i++) {
            const int64_t t = m->seq_row[b] + i;
            m->pos[t] = p0 + i;
            for (int r = 0; r < m->n_rope_sets; r++)
                rope_angles(m->n_rot, m->rope_inv_freq + (int64_t)r * (m->n_rot / 2), m->pos[t],
                            m->rope_cs + (t * m->n_rope_sets + r) * m->n_rot);
            embed_row(m, seqs[b].tokens[i], m->x + t * D);
            if (m->emb_scale != 1.0f)
                for (int64_t j = 0; j < D; j++)
                    m->x[t * D + j] *= m->emb_scale;
        }
    }

    /* the rows in 8 bits for the products (all_rows_q8: every row, then no
     * prompt sequences for matmuls) */
    const int64_t Tq = all_rows_q8(m) ? T : Td, npq = Tq == T ? 0 : m->n_pre;
    for (int l = 0; l < in->n_layer; l++) {
        const layer_t *ly = &m->layers[l];
        int ready = layer_rows(m, ROWS_ATTN_NORM, l, T, Td, Tq, &ly->wq);
        const wop_t qkv[3] = {{&ly->wq, 0.0f, m->q, qd},
                              {&ly->wk, 0.0f, m->k, kvd},
                              {&ly->wv, 0.0f, m->v, kvd}};
        matmuls(m, Tq, m->pre_n, npq, D, m->xn, D, qkv, 3, ready);
        if (m->lora) { /* the prompt rows' here, the decode rows' in layer_rows */
            lora_prompts(m, l, CORE_LORA_Q, Td, m->xn, D, m->q, qd);
            lora_prompts(m, l, CORE_LORA_K, Td, m->xn, D, m->k, kvd);
            lora_prompts(m, l, CORE_LORA_V, Td, m->xn, D, m->v, kvd);
        }
        (void)layer_rows(m, ROWS_ROPE, l, T, Td, Tq, NULL);
        for (int b = 0; b < n_seqs; b++) {
            const int64_t off = m->seq_row[b];
            if (m->tap)
                m->tap(m->tap_ud, l, b, m->pos[off], seqs[b].n_tokens, m->q + off * qd,
                       m->k + off * kvd, m->v + off * kvd);
            m->items[b] = (core_attn_item_t){seqs[b].state, seqs[b].n_tokens, m->q + off * qd,
                                             m->k + off * kvd, m->v + off * kvd,
                                             m->att + off * qd};
        }
        if ((rc = core_attn_forward_batch(m->attn, m->pool, l, n_seqs, m->items, err)) < 0)
            return rc;
        /* llama: the residual folded into the GEMM, x += att · Woᵀ; gemma3:
         * xn = att · Woᵀ, normalized and added by ROWS_FFN_NORM */
        if (ly->post_attn_norm)
            matmul(m, Tq, npq, qd, m->att, qd, &ly->wo, 0.0f, m->xn, D);
        else
            matmul(m, Tq, npq, qd, m->att, qd, &ly->wo, 1.0f, m->x, D);
        if (m->lora)
            lora_prompts(m, l, CORE_LORA_O, Td, m->att, qd, m->x, D);
        ready = layer_rows(m, ROWS_FFN_NORM, l, T, Td, Tq, &ly->w_gate);
        const wop_t gate_up[2] = {{&ly->w_gate, 0.0f, m->gate, FF},
                                  {&ly->w_up, 0.0f, m->up, FF}};
        matmuls(m, Tq, m->pre_n, npq, D, m->xn, D, gate_up, 2, ready);
        ready = swiglu(m, ly, T, Tq);
        if (ly->post_ffn_norm) { /* xn = FFN output, then x += its norm */
            const wop_t down = {&ly->w_down, 0.0f, m->xn, D};
            matmuls(m, Tq, m->pre_n, npq, FF, m->gate, FF, &down, 1, ready);
            (void)layer_rows(m, ROWS_POST_FFN, l, T, Td, Tq, NULL);
        } else {
            const wop_t down = {&ly->w_down, 1.0f, m->x, D};
            matmuls(m, Tq, m->pre_n, npq, FF, m->gate, FF, &down, 1, ready);
        }
    }

    compute_logits(m, seqs, n_seqs);
    compute_hidden(m, seqs, n_seqs);
    for (int b = 0; b < n_seqs; b++)
        core_attn_advance(seqs[b].state, seqs[b].n_tokens);
    return 0;
}
