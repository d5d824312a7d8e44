/* core/attn/features.h — positive random features for linear attention.
 *
 * The feature maps of DESIGN.md §3 for one (layer, KV head), their random
 * draws, the DARKFormer adapter GGUF that carries the learned parameters
 * (docs/ADAPTER.md), and the tuning knobs of the linear attention kernels
 * (core/attn/attn_linear.c). Used by the attention kernels and by offline tools
 * (conversion, calibration), so nothing here depends on a loaded model.
 *
 * Notation: Hd head dim, M features, x̂ = x·Hd^(-1/4) so exp(q̂·k̂) = exp(q·k/√Hd).
 *   Performer      ŷ = x̂,      φ_i = exp(ω_i·ŷ − |ŷ|²/2) / √M
 *   DARKFormer     ŷ = Mat·x̂,  same φ          (kernel exp(q̂ᵀΣk̂), Σ = MatᵀMat)
 *   DARKFormer-IS  ŷ = x̂,      ω_i = A ε_i with A = Σ*^(1/2), and each feature
 *                  times √w_i, w_i = N(ω_i;0,I)/N(ω_i;0,Σ*)
 *                  = |Σ*|^(1/2) exp(−|ω_i|²/2 + |ε_i|²/2)   (kernel exp(q̂·k̂))
 * In every kind φ_i(x) = exp(ω_i·ŷ − |ŷ|²/2 + b_i) with a per-feature log
 * weight b_i = −½ log M (+ ½ log w_i for IS), which is how they are stored.
 *
 * Flexformer (signed trigonometric features; M = 2m state rows for m
 * frequencies, rows [0, m) the cosine half, rows [m, 2m) the sine half):
 *   -s  φ(x) = e^(|ŷ|²/2) · [cos(ω_i·ŷ), sin(ω_i·ŷ)]_i / √m,  ŷ = x̂
 *   -n  φ(x) = e^(ν|ŷ|²) · [cos(ω_1i·ŷ) + cos(ω_2i·ŷ), sin(ω_1i·ŷ) + sin(ω_2i·ŷ)]_i / (2√m),
 *       ν = √Hd/τ (so e^(ν|ŷ|²) = e^(|x|²/τ); τ = 2√Hd gives ν = ½)
 * The ω are learned (adapter tensors omega, omega2, tau); without an adapter
 * they are the Performer draws ε (first m rows), ω_2 = ω_1 and τ = 2√Hd, and
 * both kinds are exactly Performer's trigonometric estimator of exp(q̂·k̂)
 * (derivation in core/attn/features.c). Here the log-norm ν|ŷ|² is the common
 * log-magnitude of every feature of a vector and the rest is a signed value in
 * [−1/√m, 1/√m]: core_features_trig returns the two apart.
 *
 * ε are block-orthogonal standard draws: per block of Hd rows, an Hd×Hd
 * matrix G of N(0,1) (row-major, drawn in order), its QR with the sign fix
 * Q·sign(diag R) (Haar-distributed Q), then Hd norms s_j = |g_j| of fresh
 * N(0, I_Hd) vectors (chi(Hd) law); ε_{b·Hd+j} = s_j · (column j of Q).
 * Blocks are stacked until M rows (the last one truncated). Each ε_i alone is
 * exactly N(0, I), so every estimator stays unbiased.
 */
#ifndef DARKSERVE_CORE_FEATURES_H
#define DARKSERVE_CORE_FEATURES_H

#include <stddef.h>
#include <stdint.h>

#include "core/attn/attn.h"
#include "core/err.h"
#include "core/gguf.h"

/* Eigenvalues of Λ are clamped into [0, CORE_FEATURES_LAMBDA_MAX] before
 * Σ* = (I+2Λ)(I−2Λ)⁻¹ is formed: Σ* exists only below 1/2 (0.49 gives
 * Σ* eigenvalues ≤ 99), and a covariance has no negative eigenvalues (any
 * are estimation noise); with Σ* ⪰ I the IS weights are bounded by |Σ*|^(1/2). */
#define CORE_FEATURES_LAMBDA_MAX 0.49
#define CORE_FEATURES_MAX_HEAD_DIM 1024
#define CORE_FEATURES_MAX_FEATURES 65536
#define CORE_FEATURES_MAX_WINDOW (1 << 20)

/* ---- draws ---- */

/* Seed of the feature stream of one (layer, KV head) under a model-level
 * seed: a splitmix64-style mix, so every (layer, KV head) has its own,
 * deterministic draw. */
uint64_t core_features_stream_seed(uint64_t seed, int layer, int kv_head);

/* Block-orthogonal standard draws (see above) from a stream seed.
 * eps (out, caller-owned): [m][hd]. Returns 0, CORE_EINVAL, CORE_ENOMEM. */
int core_features_draw(uint64_t stream_seed, int hd, int m, double *eps, core_error_t *err);

/* The DARKFormer-IS proposal from Λ: A = Σ*^(1/2) (symmetric) and log|Σ*|.
 * lambda (borrowed): [hd][hd], symmetrized as (Λ+Λᵀ)/2. a (out): [hd][hd].
 * *n_clamped (may be NULL) = eigenvalues that were clamped.
 * Returns 0, CORE_EINVAL (non-finite Λ), CORE_ENOMEM. */
int core_features_is_proposal(int hd, const float *lambda, double *a, double *logdet,
                              int *n_clamped, core_error_t *err);

/* ---- one feature map ---- */

typedef struct core_features {
    core_attn_kind_t kind; /* PERFORMER, DARKFORMER, DARKFORMER_IS, FLEXFORMER_S or _N */
    int head_dim;          /* Hd */
    int n_features;        /* M (state rows; Flexformer: 2m for m frequencies) */
    float *omega;          /* [M][Hd] ω (for IS already A·ε); Flexformer [M/2][Hd] ω_1; owned */
    float *bias;           /* [M] b_i, owned (Flexformer: zeros, unused) */
    float *mat;            /* [Hd][Hd] DARKFormer's Mat (ŷ_r = Σ_c Mat[r][c] x̂_c), owned; NULL otherwise */
    float *omega2;         /* [M/2][Hd] Flexformer-n's ω_2, owned; NULL otherwise */
    float tau;             /* Flexformer: τ of the norm factor e^(|x|²/τ) (-s: 2√Hd) */
    double norm_coef;      /* Flexformer: ν = √Hd/τ, the log-norm is ν|ŷ|² */
    float radius;          /* Flexformer: > 0: each ŷ ≠ 0 is first mapped onto the sphere
                              |ŷ| = radius (adapter "radius"); 0: not (the plain map) */
} core_features_t;

/* Flexformer's map of one (layer, KV head) into *f (arrays new; release
 * with core_features_fini). kind FLEXFORMER_S or _N, m even (M/2
 * frequencies). omega (borrowed, [M/2][Hd]) NULL: the first M/2 Performer
 * draws of stream_seed. -n: omega2 (borrowed, [M/2][Hd]) NULL: ω_2 = ω_1;
 * tau <= 0: 2√Hd. -s ignores omega2 and tau. Values must be finite and τ in
 * [CORE_FEATURES_TAU_MIN, CORE_FEATURES_TAU_MAX].
 * Returns 0, CORE_EINVAL, CORE_ENOMEM; *f is zeroed on failure. */
int core_features_init_trig(core_features_t *f, core_attn_kind_t kind, int hd, int m,
                            uint64_t stream_seed, const float *omega, const float *omega2,
                            double tau, core_error_t *err);

/* Flexformer features of prepared rows y [n][Hd] (ŷ = x̂): vals (out,
 * [n][M]) the signed values (cosine half, then sine half, including the
 * 1/√m or 1/(2√m)); lognorm (out, [n]) ν|ŷ|², accumulated in double. The
 * feature is e^lognorm · vals. With a radius (core_features_set_radius)
 * ŷ is first mapped onto its sphere. Only for the Flexformer kinds. */
void core_features_trig(const core_features_t *f, int64_t n, const float *y, float *vals,
                        double *lognorm);

/* Flexformer's input sphere: ŷ ↦ radius·ŷ/|ŷ| before the features (a zero
 * row stays zero), so the norm factor e^(ν·radius²) is one constant per
 * head and the kernel is a function of the angle between q and k alone.
 * f must be a Flexformer map; radius in [CORE_FEATURES_RADIUS_MIN,
 * CORE_FEATURES_RADIUS_MAX]. Returns 0 or CORE_EINVAL (f unchanged). */
int core_features_set_radius(core_features_t *f, double radius, core_error_t *err);

#define CORE_FEATURES_RADIUS_MIN 0.01
#define CORE_FEATURES_RADIUS_MAX 100.0

/* Bounds on Flexformer-n's τ (in units of the raw |x|²): below, e^(|x|²/τ)
 * turns every key into its own scale; above, the norm factor is 1. */
#define CORE_FEATURES_TAU_MIN 0.01
#define CORE_FEATURES_TAU_MAX 1.0e6

/* Builds the map of one (layer, KV head) into *f (caller-owned struct, its
 * arrays new; release with core_features_fini).
 *   PERFORMER      mat, is_a ignored.
 *   DARKFORMER     mat (borrowed, [hd][hd], finite) required.
 *   DARKFORMER_IS  is_a / is_logdet from core_features_is_proposal required.
 * Identical stream_seed -> identical ε in every kind, so DARKFormer with
 * Mat = I and IS with Λ = 0 reproduce Performer bit for bit.
 * Returns 0, CORE_EINVAL, CORE_ENOMEM; *f is zeroed on failure. */
int core_features_init(core_features_t *f, core_attn_kind_t kind, int hd, int m,
                       uint64_t stream_seed, const float *mat, const double *is_a,
                       double is_logdet, core_error_t *err);
void core_features_fini(core_features_t *f); /* zeroed or NULL is a no-op */

/* ŷ of n raw vectors (Hd^(-1/4) scaling, then Mat for DARKFormer).
 * x (borrowed): n rows of Hd floats, row stride ldx. y (out): [n][Hd]. */
void core_features_prepare(const core_features_t *f, int64_t n, const float *x, int64_t ldx,
                           float *y);

/* Feature logits of prepared rows, fp32, split as the kernels need them:
 * dots (out): [n][M] = ω_i·ŷ + b_i; half_norm (out): [n] = |ŷ|²/2 (accumulated
 * in double). The full logit is dots − half_norm. */
void core_features_logits(const core_features_t *f, int64_t n, const float *y, float *dots,
                          double *half_norm);

/* φ of n raw vectors, computed independently of the fp32 kernels in double
 * (for tools and oracles): phi (out): [n][M] = exp(ω_i·ŷ − |ŷ|²/2 + b_i)
 * (Flexformer: its signed trigonometric features, the norm factor included).
 * x (borrowed): n rows, stride ldx. May overflow to inf for absurd inputs. */
void core_features_phi(const core_features_t *f, int64_t n, const float *x, int64_t ldx,
                       double *phi);

/* ---- the adapter GGUF (docs/ADAPTER.md) ---- */

/* Version 2 adds sinks, the pre-RoPE flag, decays and mixing weights;
 * version 1 files (none of those: v1 behaviour) are still read. */
#define CORE_FEATURES_ADAPTER_VERSION 2
#define CORE_FEATURES_MAX_SINKS 1024
/* Decays below this make the linear branch a few-token window: refused. */
#define CORE_FEATURES_DECAY_MIN 0.5
/* Mixing log-weights are bounded so exp() of them stays tame. */
#define CORE_FEATURES_MIX_MAX 30.0

/* Attention settings an adapter carries. fingerprint: NUL-terminated, ""
 * when absent. Keys that are absent leave the fields of *cfg untouched. */
typedef struct core_features_adapter_info {
    core_attn_kind_t kind;
    int version;     /* darkformer.format_version (1 when absent) */
    int n_features;
    int window;
    int sinks;       /* darkformer.sinks */
    int memory;      /* darkformer.memory (optional: λ the adapter is served with), -1 if absent */
    int memory_keep; /* darkformer.memory_keep (optional: "recall" or "recent" as
                        CORE_ATTN_KEEP_*), -1 if absent */
    char memory_heads[CORE_ATTN_HEADS_SPEC_MAX]; /* darkformer.memory_heads (optional:
                        core_attn_memory_heads_parse's text), "" if absent */
    int kv_bits;     /* darkformer.kv_bits (optional: 8 or 16, the exact rows' bits the
                        adapter is served with), -1 if absent */
    int serve_window; /* darkformer.serve_window (optional: the window the adapter is
                         served with by default, chosen by measurement; window stays the
                         one it was trained with), -1 if absent */
    int prerope;     /* darkformer.prerope */
    uint64_t seed;
    char base_fingerprint[128];
} core_features_adapter_info_t;

/* Reads darkformer.* keys from g (borrowed) into *info (fields of absent
 * keys are left as the caller set them). Wrong types or values out of range
 * are CORE_EFORMAT naming the key; a darkformer.format_version other than
 * 1 or CORE_FEATURES_ADAPTER_VERSION is CORE_EUNSUPPORTED. */
int core_features_adapter_info(const core_gguf_t *g, core_features_adapter_info_t *info,
                               core_error_t *err);

/* Validated per-layer tensor "darkformer.blk.<layer>.<what>" (what = "M" or
 * "lambda"): F32, shape ne = [Hd, Hd, Hkv], finite values. *out is borrowed
 * from g; its data is [Hkv][Hd][Hd] (not necessarily 4-byte aligned: copy
 * with memcpy). CORE_ENOTFOUND / CORE_EFORMAT with the tensor's name. */
int core_features_adapter_tensor(const core_gguf_t *g, const char *what, int layer, int n_head_kv,
                                 int head_dim, const core_gguf_tensor_t **out, core_error_t *err);

/* Optional per-layer vector "darkformer.blk.<layer>.<what>" (v2): "decay",
 * F32 [Hkv], each γ in [CORE_FEATURES_DECAY_MIN, 1]; "mix", F32 [H], each
 * log-weight β with |β| <= CORE_FEATURES_MIX_MAX; "tau" (Flexformer-n), F32
 * [Hkv], each τ in [CORE_FEATURES_TAU_MIN, CORE_FEATURES_TAU_MAX]; "radius"
 * (Flexformer), F32 [Hkv], each in [CORE_FEATURES_RADIUS_MIN,
 * CORE_FEATURES_RADIUS_MAX]. Copies n values into out
 * (caller-owned, [n]); *found = 0 and out untouched when absent. Wrong type,
 * shape or values: CORE_EFORMAT naming the tensor. */
int core_features_adapter_vector(const core_gguf_t *g, const char *what, int layer, int n,
                                 float *out, int *found, core_error_t *err);

/* Flexformer frequencies "darkformer.blk.<layer>.<what>" (what = "omega" or
 * "omega2"): F32, shape ne = [Hd, M/2, Hkv], finite. Copied into out
 * (caller-owned, [Hkv][M/2][Hd]). CORE_ENOTFOUND / CORE_EFORMAT naming the
 * tensor. */
int core_features_adapter_omega(const core_gguf_t *g, const char *what, int layer, int n_head_kv,
                                int n_freq, int head_dim, float *out, core_error_t *err);

/* Defaults of the linear kinds when neither a flag nor an adapter says. */
#define CORE_FEATURES_DEFAULT_M 128
#define CORE_FEATURES_DEFAULT_WINDOW 64
#define CORE_FEATURES_DEFAULT_SINKS 4
#define CORE_FEATURES_DEFAULT_MEMORY 0
#define CORE_FEATURES_DEFAULT_KV_BITS 16

/* Attention settings of the linear kinds before resolution: a field the
 * caller set (n_features > 0; window, sinks, prerope >= 0) wins. */
typedef struct core_features_settings {
    int n_features;
    int window;
    int sinks;
    int prerope;
    int memory; /* λ exact memory rows; -1: the adapter's darkformer.memory, else
                   CORE_FEATURES_DEFAULT_MEMORY */
    int memory_keep; /* CORE_ATTN_KEEP_*; -1: the adapter's darkformer.memory_keep,
                        else recall */
    char memory_heads[CORE_ATTN_HEADS_SPEC_MAX]; /* "": the adapter's
                        darkformer.memory_heads, else "all" */
    int kv_bits; /* 8 or 16; -1 (or 0): the adapter's darkformer.kv_bits, else
                    CORE_FEATURES_DEFAULT_KV_BITS */
    uint64_t seed;
} core_features_settings_t;

/* The one rule for attention settings, used by the server and the CLI:
 * what the caller set wins, then the adapter's darkformer.* values (for
 * the window: darkformer.serve_window, then darkformer.window)
 * (adapter_path may be NULL), then the defaults above (a v1 adapter, which
 * predates sinks, means 0 sinks and post-RoPE features). s->seed becomes the
 * adapter's darkformer.seed when it has one (the learned parameters belong
 * to those draws), else it is left as given. Errors (unreadable adapter, bad
 * keys) are the reader's, naming the key. */
int core_features_resolve(const char *adapter_path, core_features_settings_t *s,
                          core_error_t *err);

typedef struct core_features_adapter_desc {
    core_attn_kind_t kind;
    int n_layer, n_head, n_head_kv, head_dim; /* L, H, Hkv, Hd */
    int n_features, window, sinks, prerope;
    uint64_t seed;                    /* < 2^63 */
    const char *base_fingerprint;     /* borrowed, may be NULL */
    const float *mat;                 /* borrowed [L][Hkv][Hd][Hd] or NULL */
    const float *lambda;              /* borrowed [L][Hkv][Hd][Hd] or NULL */
    const float *decay;               /* borrowed [L][Hkv] γ or NULL */
    const float *mix;                 /* borrowed [L][H] β or NULL */
    const float *omega;               /* borrowed [L][Hkv][M/2][Hd] Flexformer ω_1 or NULL */
    const float *omega2;              /* borrowed [L][Hkv][M/2][Hd] Flexformer-n ω_2 or NULL */
    const float *tau;                 /* borrowed [L][Hkv] Flexformer-n τ or NULL */
    const float *radius;              /* borrowed [L][Hkv] Flexformer input sphere or NULL */
    int lora_rank, n_embd;            /* r (0: no LoRA) and the model width D */
    int serve_window;                 /* darkformer.serve_window, written when > 0 */
    int kv_bits;                      /* darkformer.kv_bits (8, 16), written when > 0 */
    int memory;                       /* darkformer.memory, written when > 0, with: */
    int memory_keep;                  /* darkformer.memory_keep (CORE_ATTN_KEEP_*) */
    const char *memory_heads;         /* darkformer.memory_heads, written when non-empty */
    const float *lora[8];             /* borrowed, core/lora.h: q A [L][r][D], q B [L][H·Hd][r],
                                         k A, k B [L][Hkv·Hd][r], v A, v B, o A [L][r][H·Hd],
                                         o B [L][D][r] */
} core_features_adapter_desc_t;

/* Writes an adapter GGUF (version CORE_FEATURES_ADAPTER_VERSION) atomically
 * to path. */
int core_features_adapter_write(const core_features_adapter_desc_t *d, const char *path,
                                core_error_t *err);

#endif
