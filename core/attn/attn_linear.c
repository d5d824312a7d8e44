/* core/attn/attn_linear.c — linear (random-feature) attention: Performer,
 * DARKFormer, DARKFormer-IS and Flexformer-s/-n, each optionally hybrid with
 * an exact window.
 *
 * The feature maps live in core/attn/features.c; this file keeps the recurrent
 * state and runs the causal kernels. It knows nothing of the model around it.
 *
 * Per layer and KV head a state holds S̃ [M][Hd], z̃ [M] and a running
 * log-scale per feature c [M]: S̃_i = Σ_t exp(a_i(k_t) − c_i) v_t and
 * z̃_i = Σ_t exp(a_i(k_t) − c_i), where a_i(k) is the full fp32 feature logit
 * of key k (core_features.h) and c_i the max of a_i over the keys absorbed so
 * far (−inf while empty). When a key raises c_i, row i of S̃ and z̃ is first
 * multiplied by exp(c_i,old − c_i,new); c is never a max over keys that have
 * not been absorbed. This is DESIGN §3's running log-scale kept per feature
 * rather than one scalar per state: a query weighs all keys of one feature by
 * the same exp(g_i), so flushing terms far below that feature's own maximum
 * loses nothing that matters, whereas one shared scalar lets a key that is
 * large on one feature (a late key with a big norm along a wide IS
 * direction: logits > 200 happen) flush every other feature to zero.
 * 1 ≤ z̃_i ≤ keys absorbed (the maximal key contributes exactly 1, every
 * other key at most 1) and |S̃_i| ≤ z̃_i·max|v|, so nothing overflows and
 * the recurrence's denominator never underflows.
 *
 * Hybrid window W: the query at position τ attends exactly (softmax of
 * q̂·k̂) to the keys at positions max(0, τ−W+1)..τ, kept in a per-layer ring
 * buffer of the last W keys/values, and linearly to every older key: the key
 * at position τ−W is absorbed into (S, z) when token τ arrives. W = 0 is pure
 * linear attention, where each token's own key is absorbed before its query.
 *
 * One normalization for both parts. For a query row with query logits
 * g_i = ω_i·ŷ + b_i and half norm h = |ŷ|²/2 (true φ_i(q) = exp(g_i − h)),
 * and C_i the scale the key features were exponentiated under:
 *   true linear numerator   = exp(Lrow) · num,   Lrow = mx − h,
 *   true linear denominator = exp(Lrow) · den,   mx = max_i (g_i + C_i),
 * num = Σ_i exp(g_i + C_i − mx) · (S̃ and chunk-key terms at scale C_i), den
 * likewise with z̃ (mx is the per-query max shift; with the scales folded in,
 * den ≥ 1 whenever the feature reaching mx has its maximal key visible). The
 * exact terms are exp(s_j), s_j = q̂·k̂_j. With the row stabilizer
 * s* = max(Lrow, max_j s_j):
 *   out = (e^(Lrow−s*)·num + Σ_j e^(s_j−s*) v_j) / (e^(Lrow−s*)·den + Σ_j e^(s_j−s*))
 * Each sum is finite and the largest exact term is 1 (or the linear scale
 * factor is 1), so the ratio neither overflows nor loses its denominator. In
 * pure linear mode exp(Lrow) cancels and out = num/den.
 *
 * Chunked prefill: tokens are processed in chunks (default 64). Within a
 * chunk the keys that enter the linear state get features exp(a_i − C_i)
 * with C_i = max(c_i, their logits) — the running scales after the chunk,
 * which token-by-token updates reach at the chunk's end — and the masked
 * product φ(Q)·φ(K)ᵀ (key u visible to token t iff u ≤ t) gives the
 * intra-chunk part; the carried state, still at its scales c_i, enters with
 * the factors exp(c_i − C_i). Earlier rows thus see their keys at scales
 * C_i ≥ their own running max; this is exact except where entries underflow.
 * Flushed entries cost at most ~M·(chunk + keys absorbed)·FLT_MIN in the
 * units of den, so a row whose den ≥ 2^-60 is accurate to ~1e-8 relative
 * even after 10^9 tokens (~1e-15 for the chunk's own keys). A row below that
 * (the maximum of its best feature comes from a later key of the chunk) is
 * recomputed exactly in double in the log domain from the logits and the
 * unscaled state (slow_row). That guard is unbiased: it changes how the same
 * sums are evaluated, never what is summed.
 *
 * Accumulators: S and z are fp32 by default; core_attn_linear_set_opts can
 * make new states accumulate in double, to measure drift on long streams.
 *
 * Flexformer (signed trigonometric features, core/attn/features.h): a vector's
 * features are e^(ν|ŷ|²) times signed values in [−1/√(M/2), 1/√(M/2)], so
 * a key's log-magnitude (ν|ŷ|² plus the decay to the chunk's end) takes the
 * place of every one of its logits: the running scales c_i then all move
 * together (one value repeated M times, so the state layout and its payload
 * are the linear kinds'), the key that sets them contributes its values
 * exactly, and S̃, z̃ stay bounded by the number of keys; the query's
 * log-magnitude joins Lrow. Nothing is an exponential of a feature logit,
 * so nothing underflows and the log-domain path is not needed.
 *
 * Signed denominators. φ(q)·φ(k) estimates e^(q̂·k̂) > 0 without bias but
 * is itself signed, so the linear denominator D (the estimate of the older
 * keys' mass) can be small or negative, and E + D with it (E, the exact
 * mass of sinks and window, > 0). Nothing is added to or clamped in the
 * features, z or D: the estimates of numerator and denominator stay
 * unbiased, and E + D keeps full double precision (den is summed in
 * double). A row is changed only when D < −E/2 (the estimate would remove
 * more than half of the mass that is known exactly): then the row's linear
 * numerator and denominator are both scaled by λ = (E/2)/|D| < 1, giving
 * E + λD = E/2. The output stays a weighted combination of the exact
 * part's values and the linear part's own ratio (never a division by a
 * value near 0), and rows where the rule acts are counted
 * (core_attn_linear_den_stats; measured on held-out text in docs/QUALITY.md).
 * Pure linear attention (no window, no sinks) has no E: a row with D ≤ 0
 * outputs zero (counted). An additive floor (D + ε) or |D| would bias every
 * row; this touches only the counted ones. The training code (tools/convert.py,
 * tools/distill.py) applies the same rule. A map with an input sphere
 * (features.h) has a rule of its own, stable by construction: a row with
 * D < 0 drops its linear part (λ = 0), so its denominator is E; the bias,
 * the older keys' mass taken as 0 on those rows, is counted the same way.
 */
#include "core/attn/attn_impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/blas.h"
#include "core/attn/attn_linear.h"
#include "core/attn/features.h"
#include "core/kernels/half.h"
#include "core/kernels/kvrow.h"
#include "core/le.h"
#include "core/kernels/vexp.h"

#define LIN_DEFAULT_CHUNK 64
#define LIN_MAX_CHUNK 4096
#define LIN_MAX_HEADS 4096
/* Chunks shrink until one chunk's exact scores [rows][W + chunk] and query
 * features [rows][M] each fit these many floats. */
#define LIN_SCORE_BUDGET ((size_t)1 << 22)
#define LIN_FEATURE_BUDGET ((size_t)1 << 24)
/* Positions whose RoPE angles a scratch slot keeps (unrope), for queries
 * and for entering keys apart: a decode step's query and key recur for
 * every layer and KV head. Prime, so that a power-of-two window never puts
 * them on one entry. */
#define LIN_ROPE_CACHE 67
/* Fast-path denominators below this take the exact log-domain path. */
#define LIN_DEN_MIN 0x1p-60
/* A memory row is scored at its true RoPE distance while its block is at
 * most this many positions past it (so at most LIN_MEM_CAP + B − 1, inside
 * the 8K a Llama-family model like SmolLM2 was trained on), and at this
 * distance after that: never at one the model did not see. */
#define LIN_MEM_CAP 4096

typedef struct lin_params {
    core_features_t *maps; /* [L][Hkv] */
    float *gam;            /* [L][Hkv] decay γ (1 = none) */
    float *mix;            /* [L][H] log-weight β of the linear part against the exact part */
    double *rope_if;       /* [n_rot/2] RoPE inverse frequencies (prerope or sinks) */
    double *sink_cs;       /* [n_rot/2][2] cos, sin of (W + S − 1)·θ_i: the sinks' fixed shift */
    double *sink_cs_span;  /* the same at (W + λ + S − 1)·θ_i: next to a recent memory's span */
    double *mem_cs;        /* [n_rot/2][2] cos, sin of cap·θ_i: far memory rows' distance */
    int64_t mem_cap;       /* the memory's distance cap (LIN_MEM_CAP; tests set less) */
    int chunk;             /* requested tokens per chunk */
    int cn;                /* effective tokens per chunk (budget-bounded) */
    int fp64;              /* accumulator precision of states created next */
    int slots;             /* scratch slots, one per thread that may forward at once */
    float **fs;            /* [slots] float scratch, layout in lin_scratch_t */
    double **ds;           /* [slots] double scratch */
    core_attn_den_stats_t *den; /* [slots] Flexformer's denominators, counted */
    int trig;              /* Flexformer: signed features */
} lin_params_t;

/* What a state holds is known without clearing it all: a new or reset
 * state sets only c to −inf. A KV head whose c are all −inf (no key has
 * reached its linear state) has S̃ and z̃ of no defined value, and nothing
 * reads them (chunk_linear and slow_row weigh them only through finite
 * scales); chunk_absorb zeroes them when the first keys arrive. Of the
 * window and the sinks only positions below pos are ever read. So a state
 * that serves a short chat never touches most of its ~9 MB, and copying one
 * (a fork, a prefix-cache snapshot or its restore) copies what is valid:
 * clearing and copying whole states were most of a 16-stream run's page
 * faults and of the loop thread's time. */
typedef struct lin_state {
    int fp64;
    size_t blob_bytes;
    unsigned char *blob; /* everything below, one allocation */
    double *c;           /* [L][Hkv][M] running log-scales */
    void *S;             /* [L][Hkv][M][Hd] float or double */
    void *z;             /* [L][Hkv][M] float or double */
    /* a KV head's window and sinks contiguous (the attention of one head
     * streams them; the payload orders them [rows][Hkv], see kv_rows_put),
     * rows of the config's format (core/kernels/kvrow.h: halves or 8 bits;
     * kv_rows), row_bytes(cfg) each */
    unsigned char *ring_k; /* [L][Hkv][W] rows, slot = position % W */
    unsigned char *ring_v; /* [L][Hkv][W] */
    unsigned char *sink_k; /* [L][Hkv][S] rows, row = position (< S) */
    unsigned char *sink_v; /* [L][Hkv][S] */
    /* the exact memory (cfg->memory = λ > 0, else empty): per KV head its
     * rows in position order; a row's key after RoPE while it is near,
     * before RoPE once it is far (mem_far) */
    int64_t *mem_pos;    /* [L][Hkv][λ] positions */
    float *mem_score;    /* [L][Hkv][λ] the retention score each row kept */
    int32_t *mem_n;      /* [L][Hkv] rows held */
    unsigned char *mem_k; /* [L][Hkv][λ] rows */
    unsigned char *mem_v; /* [L][Hkv][λ] rows */
    /* Not part of the state's data (never copied or saved; counted in its
     * bytes): a decode step's two halves per query row,
     * [Hkv][H/Hkv][LIN_MG_ROW], from the units that computed them to the
     * merge (head_done). */
    double *mg;
} lin_state_t;

/* A merge row: lrow, den, the exact stabilizer, the exact sum, then the
 * linear numerator [Hd] and the exact values' sum [Hd]. */
#define LIN_MG_HEAD 4
#define LIN_MG_ROW(hd) (LIN_MG_HEAD + 2 * (hd))

/* Views into the scratch for one chunk of cn tokens, R = cn·(H/Hkv) query
 * rows, NI ≤ cn keys entering the state, NK ≤ W + cn window keys. */
typedef struct lin_scratch {
    float *qx;  /* [R][Hd] raw query rows */
    float *qy;  /* [R][Hd] prepared ŷ; then, in chunk_out_exact, the rows turned to the sinks' frame */
    float *gd;  /* [R][M] query logits g (no norm term) */
    float *qp;  /* [R][M] exp(g + C − mx) */
    float *qs;  /* [R][M] exp(g + c − mx): the same for the carried state */
    float *kx;  /* [NI][Hd] raw keys entering the state */
    float *ky;  /* [NI][Hd] prepared */
    float *kd;  /* [NI][M] full key logits a */
    float *kp;  /* [NI][M] exp(a − C) */
    float *vi;  /* [NI][Hd] their values */
    float *pp;  /* [R][NI] masked φ(Q)φ(K)ᵀ */
    float *num; /* [R][Hd] linear numerators */
    float *qu;  /* [R][Hd] queries before RoPE (prerope) */
    float *ku;  /* [NI][Hd] keys before RoPE (prerope) */
    float *ks;  /* [S][Hd] sink keys moved next to the window (see chunk_forward) */
    float *es;  /* [R][S] their scores */
    float *kvg; /* [NK][Hd] the exact keys, then their values, as floats */
    float *e;   /* [R][NK] exact weights */
    float *ev;  /* [R][Hd] exact numerators */
    float *qm;  /* [R][Hd] query rows turned to the memory rows' distance (memory on) */
    float *ak;  /* [B][Hd] keys a block boundary absorbs (feature input) */
    float *av;  /* [B][Hd] their values */
    double *qhn;  /* [R] |ŷ|²/2 of queries */
    double *khn;  /* [NI] |ŷ|²/2 of keys */
    double *lrow; /* [R] Lrow, −inf when the row has no linear part */
    double *den;  /* [R] linear denominators */
    double *esum; /* [R] exact denominators */
    double *sx;   /* [R] the exact part's stabilizer (decode's exact unit) */
    double *cn;   /* [M] scales C after this chunk */
    double *al;   /* [M] exp(c − C) */
    double *tmp;  /* [M + NI + Hd] slow path */
    double *ent;  /* [B + λ][3] a boundary's contestants: score, position, source */
    double *ws;   /* [M][Hd + 2] the state a boundary scores against: c, S, z (score_state) */
    float *wf;    /* [M][Hd + 1] that state's S and z as floats at its scales (recall_errors) */
    float *we;    /* [B][M + Hd + 1] candidates' weights, then their numerators and denominators */
    /* [2][LIN_ROPE_CACHE][1 + n_rot], queries' then keys': a position (−1:
     * none) and its cos, sin pairs at entry position % LIN_ROPE_CACHE;
     * kept from call to call */
    double *rc;
} lin_scratch_t;

typedef struct lin_sizes {
    size_t nf, nd; /* floats, doubles */
} lin_sizes_t;

static size_t take(size_t *off, size_t n)
{
    size_t o = *off;
    *off += n;
    return o;
}

/* Offsets of every scratch buffer for chunk cn; with sc, also the views
 * over the bases fb and db (then both are the slot's scratch, never NULL). */
static lin_sizes_t scratch_layout(const core_attn_cfg_t *cfg, size_t cn, float *fb, double *db,
                                  lin_scratch_t *sc)
{
    size_t gs = (size_t)(cfg->n_head / cfg->n_head_kv), hd = (size_t)cfg->head_dim;
    size_t m = (size_t)cfg->n_features, w = (size_t)cfg->window;
    size_t sk = (size_t)cfg->sinks, lam = (size_t)cfg->memory;
    /* with the memory, a chunk's exact keys are the sinks, up to W + B
     * positions and λ rows; a boundary absorbs up to B keys (ni) */
    size_t bl = lam ? (size_t)CORE_ATTN_MEMORY_BLOCK : 0, ni = cn > bl ? cn : bl;
    size_t r = cn * gs, nk = lam ? sk + w + bl + lam : w > 0 || sk > 0 ? sk + w + cn : 0;
    size_t f = 0, d = 0;
    size_t o_qx = take(&f, r * hd), o_qy = take(&f, r * hd), o_gd = take(&f, r * m);
    size_t o_qp = take(&f, r * m), o_qs = take(&f, r * m), o_kx = take(&f, ni * hd), o_ky = take(&f, ni * hd);
    size_t o_kd = take(&f, ni * m), o_kp = take(&f, ni * m), o_vi = take(&f, ni * hd);
    size_t o_pp = take(&f, r * cn), o_num = take(&f, r * hd);
    size_t o_e = take(&f, r * nk), o_ev = take(&f, r * hd);
    size_t o_qu = take(&f, r * hd), o_ku = take(&f, ni * hd), o_ks = take(&f, sk * hd);
    size_t o_es = take(&f, r * sk), o_kvg = take(&f, nk * hd);
    size_t o_qm = take(&f, lam ? r * hd : 0), o_ak = take(&f, bl * hd), o_av = take(&f, bl * hd);
    size_t o_wf = take(&f, lam ? m * (hd + 1) : 0), o_we = take(&f, bl * (m + hd + 1));
    size_t o_qhn = take(&d, r), o_khn = take(&d, ni), o_lrow = take(&d, r), o_den = take(&d, r);
    size_t o_esum = take(&d, r), o_sx = take(&d, r), o_cn = take(&d, m), o_al = take(&d, m);
    size_t o_tmp = take(&d, m + ni + hd), o_ent = take(&d, 3 * (bl + lam));
    size_t o_ws = take(&d, lam ? m * (hd + 2) : 0);
    size_t o_rc = take(&d, (size_t)2 * LIN_ROPE_CACHE * (1 + (size_t)cfg->n_rot));
    if (sc) {
        sc->qx = fb + o_qx;
        sc->qy = fb + o_qy;
        sc->gd = fb + o_gd;
        sc->qp = fb + o_qp;
        sc->qs = fb + o_qs;
        sc->kx = fb + o_kx;
        sc->ky = fb + o_ky;
        sc->kd = fb + o_kd;
        sc->kp = fb + o_kp;
        sc->vi = fb + o_vi;
        sc->pp = fb + o_pp;
        sc->num = fb + o_num;
        sc->qu = fb + o_qu;
        sc->ku = fb + o_ku;
        sc->ks = fb + o_ks;
        sc->es = fb + o_es;
        sc->kvg = fb + o_kvg;
        sc->e = fb + o_e;
        sc->ev = fb + o_ev;
        sc->qm = fb + o_qm;
        sc->ak = fb + o_ak;
        sc->wf = fb + o_wf;
        sc->we = fb + o_we;
        sc->av = fb + o_av;
        sc->qhn = db + o_qhn;
        sc->khn = db + o_khn;
        sc->lrow = db + o_lrow;
        sc->den = db + o_den;
        sc->esum = db + o_esum;
        sc->sx = db + o_sx;
        sc->cn = db + o_cn;
        sc->al = db + o_al;
        sc->tmp = db + o_tmp;
        sc->ent = db + o_ent;
        sc->ws = db + o_ws;
        sc->rc = db + o_rc;
    }
    return (lin_sizes_t){f, d};
}

static int effective_chunk(const core_attn_cfg_t *cfg, int chunk)
{
    size_t gs = (size_t)(cfg->n_head / cfg->n_head_kv), cn = (size_t)chunk;
    size_t extra = cfg->memory ? (size_t)CORE_ATTN_MEMORY_BLOCK + (size_t)cfg->memory : 0;
    while (cn > 1 && gs * cn * ((size_t)cfg->window + (size_t)cfg->sinks + extra + cn) >
                         LIN_SCORE_BUDGET)
        cn /= 2;
    while (cn > 1 && gs * cn * (size_t)cfg->n_features > LIN_FEATURE_BUDGET)
        cn /= 2;
    return (int)cn;
}

static void free_slots(float **fs, double **ds, int n)
{
    for (int i = 0; i < n; i++) {
        free(fs ? fs[i] : NULL);
        free(ds ? ds[i] : NULL);
    }
    free(fs);
    free(ds);
}

/* Scratch for chunks of `chunk` tokens in `slots` slots, all new: on failure
 * the previous scratch stays as it was. */
static int set_scratch(core_attn_t *a, lin_params_t *lp, int chunk, int slots, core_error_t *err)
{
    int cn = effective_chunk(&a->cfg, chunk);
    lin_sizes_t sz = scratch_layout(&a->cfg, (size_t)cn, NULL, NULL, NULL);
    float **fs = calloc((size_t)slots, sizeof *fs);
    double **ds = calloc((size_t)slots, sizeof *ds);
    core_attn_den_stats_t *den = calloc((size_t)slots, sizeof *den);
    int ok = fs && ds && den;
    for (int i = 0; ok && i < slots; i++) {
        fs[i] = malloc(sz.nf * sizeof *fs[i]);
        ds[i] = malloc(sz.nd * sizeof *ds[i]);
        ok = fs[i] && ds[i];
        if (ok) {
            lin_scratch_t sc;
            (void)scratch_layout(&a->cfg, (size_t)cn, fs[i], ds[i], &sc);
            for (int e = 0; e < 2 * LIN_ROPE_CACHE; e++)
                sc.rc[(size_t)e * (size_t)(1 + a->cfg.n_rot)] = -1.0;
        }
    }
    if (!ok) {
        free_slots(fs, ds, fs && ds ? slots : 0);
        free(den);
        return core_error_set(err, CORE_ENOMEM, "out of memory for linear attention scratch "
                              "(%d x %zu floats, %zu doubles)", slots, sz.nf, sz.nd);
    }
    /* the counters carry over into slot 0 */
    for (int i = 0; i < lp->slots; i++) {
        den[0].rows += lp->den[i].rows;
        den[0].neg += lp->den[i].neg;
        den[0].below_half += lp->den[i].below_half;
        den[0].below_tenth += lp->den[i].below_tenth;
        den[0].pure_zero += lp->den[i].pure_zero;
    }
    free_slots(lp->fs, lp->ds, lp->slots);
    free(lp->den);
    lp->fs = fs;
    lp->ds = ds;
    lp->den = den;
    lp->slots = slots;
    lp->chunk = chunk;
    lp->cn = cn;
    return 0;
}

static int set_chunk(core_attn_t *a, lin_params_t *lp, int chunk, core_error_t *err)
{
    return set_scratch(a, lp, chunk, lp->slots > 0 ? lp->slots : 1, err);
}

static void free_params(lin_params_t *lp, size_t n_maps)
{
    if (!lp)
        return;
    for (size_t i = 0; lp->maps && i < n_maps; i++)
        core_features_fini(&lp->maps[i]);
    free(lp->maps);
    free(lp->gam);
    free(lp->mix);
    free(lp->rope_if);
    free(lp->sink_cs);
    free(lp->sink_cs_span);
    free(lp->mem_cs);
    free_slots(lp->fs, lp->ds, lp->slots);
    free(lp->den);
    free(lp);
}

/* The configuration a linear kind can run (and its adapter, where the kind
 * needs one): 0 or CORE_EINVAL with the reason. */
static int check_cfg(const core_attn_cfg_t *cfg, const core_gguf_t *adapter, core_error_t *err)
{
    const char *kname = core_attn_kind_name(cfg->kind);
    if (cfg->n_features < 1 || cfg->n_features > CORE_FEATURES_MAX_FEATURES)
        return core_error_set(err, CORE_EINVAL, "%s attention needs n_features in [1, %d], got %d",
                              kname, CORE_FEATURES_MAX_FEATURES, cfg->n_features);
    if (cfg->head_dim > CORE_FEATURES_MAX_HEAD_DIM || cfg->n_head > LIN_MAX_HEADS)
        return core_error_set(err, CORE_EINVAL, "%s attention supports head dim <= %d and <= %d "
                              "heads, got %d and %d", kname, CORE_FEATURES_MAX_HEAD_DIM,
                              LIN_MAX_HEADS, cfg->head_dim, cfg->n_head);
    if (cfg->window > CORE_FEATURES_MAX_WINDOW)
        return core_error_set(err, CORE_EINVAL, "window %d exceeds %d", cfg->window,
                              CORE_FEATURES_MAX_WINDOW);
    if (cfg->sinks < 0 || cfg->sinks > CORE_FEATURES_MAX_SINKS)
        return core_error_set(err, CORE_EINVAL, "sinks %d not in [0, %d]", cfg->sinks,
                              CORE_FEATURES_MAX_SINKS);
    if (cfg->memory < 0 || cfg->memory > CORE_ATTN_MAX_MEMORY)
        return core_error_set(err, CORE_EINVAL, "memory %d not in [0, %d]", cfg->memory,
                              CORE_ATTN_MAX_MEMORY);
    if (cfg->memory_keep != CORE_ATTN_KEEP_RECALL && cfg->memory_keep != CORE_ATTN_KEEP_RECENT)
        return core_error_set(err, CORE_EINVAL, "memory_keep %d is neither recall (%d) nor "
                              "recent (%d)", cfg->memory_keep, CORE_ATTN_KEEP_RECALL,
                              CORE_ATTN_KEEP_RECENT);
    if (cfg->memory_some &&
        (size_t)cfg->n_layer * (size_t)cfg->n_head_kv > CORE_ATTN_MAX_HEADS)
        return core_error_set(err, CORE_EINVAL, "a memory on some heads takes at most %d "
                              "(layer, KV head) pairs, the model has %lld", CORE_ATTN_MAX_HEADS,
                              (long long)cfg->n_layer * cfg->n_head_kv);
    if (cfg->memory_some) {
        /* no bit past the model's heads */
        const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
        for (size_t i = nh; i < CORE_ATTN_MAX_HEADS; i++)
            if (cfg->memory_mask[i / 64] >> (i % 64) & 1u)
                return core_error_set(err, CORE_EINVAL, "memory head %zu past the model's %zu "
                                      "(layer, KV head) pairs", i, nh);
    }
    if (cfg->memory &&
        (core_attn_kind_is_trig(cfg->kind) || cfg->window < 1 || cfg->linear_off))
        return core_error_set(err, CORE_EINVAL, "an exact memory needs a window, the linear "
                              "branch and a kind with positive features (not %s)", kname);
    if ((cfg->prerope || cfg->sinks || cfg->memory) &&
        (cfg->n_rot < 2 || cfg->n_rot % 2 || cfg->n_rot > cfg->head_dim ||
         !(cfg->rope_base > 0.0) || !(cfg->rope_scale > 0.0)))
        return core_error_set(err, CORE_EINVAL, "pre-RoPE features and sinks need the model's RoPE "
                              "(n_rot %d, base %g, scale %g)", cfg->n_rot, cfg->rope_base,
                              cfg->rope_scale);
    if (cfg->linear_off && cfg->window == 0 && cfg->sinks == 0)
        return core_error_set(err, CORE_EINVAL, "linear branch off needs a window or sinks");
    if (cfg->kind == CORE_ATTN_DARKFORMER && !adapter)
        return core_error_set(err, CORE_EINVAL, "attention kind 'darkformer' needs an adapter "
                              "GGUF with tensors darkformer.blk.N.M");
    if (cfg->kind == CORE_ATTN_DARKFORMER_IS && !adapter)
        return core_error_set(err, CORE_EINVAL, "attention kind 'darkformer-is' needs an adapter "
                              "GGUF with tensors darkformer.blk.N.lambda");
    const int trig = core_attn_kind_is_trig(cfg->kind);
    if (trig && cfg->n_features % 2)
        return core_error_set(err, CORE_EINVAL, "%s needs an even n_features (M/2 frequencies, "
                              "a cosine and a sine row each), got %d", kname, cfg->n_features);
    return 0;
}

/* Work buffers of linear_init, one layer's worth (NULL where the kind has
 * no use for them). */
typedef struct lin_init_buf {
    float *mat;               /* [Hd][Hd] one head's M or Λ */
    double *isa;              /* [Hd][Hd] Σ*^(1/2) */
    float *om1, *om2, *tau;   /* Flexformer: [Hkv][M/2][Hd] x2, [Hkv] */
} lin_init_buf_t;

/* Layer l's parameters from the adapter (or the seed's draws): its decays
 * and mixing weights, and the feature map of every KV head. */
static int load_layer(const core_attn_cfg_t *cfg, const core_gguf_t *adapter, lin_params_t *lp,
                      int l, const lin_init_buf_t *bf, core_error_t *err)
{
    const int trig = core_attn_kind_is_trig(cfg->kind);
    size_t hkv = (size_t)cfg->n_head_kv, hd = (size_t)cfg->head_dim;
    size_t nfq = (size_t)cfg->n_features / 2;
    float *mat = bf->mat, *om1 = bf->om1, *om2 = bf->om2, *tau = bf->tau;
    double *isa = bf->isa;
    int rc;
    const core_gguf_tensor_t *t = NULL;
    if (cfg->kind == CORE_ATTN_DARKFORMER || (trig && adapter)) {
        /* v2 parameters; absent (v1 adapters) = no decay, equal weights. */
        int found;
        rc = core_features_adapter_vector(adapter, "decay", l, cfg->n_head_kv,
                                          lp->gam + (size_t)l * hkv, &found, err);
        if (rc == 0)
            rc = core_features_adapter_vector(adapter, "mix", l, cfg->n_head,
                                              lp->mix + (size_t)l * (size_t)cfg->n_head,
                                              &found, err);
        if (rc)
            return rc;
        for (size_t h = 0; cfg->decay_off && h < hkv; h++)
            lp->gam[(size_t)l * hkv + h] = 1.0f;
    }
    if (cfg->kind == CORE_ATTN_DARKFORMER || cfg->kind == CORE_ATTN_DARKFORMER_IS) {
        const char *what = cfg->kind == CORE_ATTN_DARKFORMER ? "M" : "lambda";
        rc = core_features_adapter_tensor(adapter, what, l, cfg->n_head_kv, cfg->head_dim, &t,
                                          err);
        if (rc)
            return rc;
    }
    if (trig && adapter) {
        /* an adapter for a Flexformer kind carries its frequencies: the
         * untrained kind (Performer's draws) is the one without adapter */
        int found = 1;
        rc = core_features_adapter_omega(adapter, "omega", l, cfg->n_head_kv, (int)nfq,
                                         cfg->head_dim, om1, err);
        if (rc == 0 && cfg->kind == CORE_ATTN_FLEXFORMER_N)
            rc = core_features_adapter_omega(adapter, "omega2", l, cfg->n_head_kv, (int)nfq,
                                             cfg->head_dim, om2, err);
        if (rc == 0 && cfg->kind == CORE_ATTN_FLEXFORMER_N)
            rc = core_features_adapter_vector(adapter, "tau", l, cfg->n_head_kv, tau, &found,
                                              err);
        if (rc == 0 && !found)
            rc = core_error_set(err, CORE_ENOTFOUND, "adapter tensor 'darkformer.blk.%d.tau' "
                                "is missing", l);
        if (rc)
            return rc;
    }
    for (size_t h = 0; trig && h < hkv; h++) {
        uint64_t ss = core_features_stream_seed(cfg->seed, l, (int)h);
        int nst = cfg->kind == CORE_ATTN_FLEXFORMER_N;
        rc = core_features_init_trig(&lp->maps[(size_t)l * hkv + h], cfg->kind, cfg->head_dim,
                                     cfg->n_features, ss, om1 ? om1 + h * nfq * hd : NULL,
                                     om2 && nst ? om2 + h * nfq * hd : NULL,
                                     tau && nst ? (double)tau[h] : 0.0, err);
        if (rc)
            return rc;
    }
    if (trig && adapter) { /* optional: the input sphere (features.h); mat is scratch */
        int found;
        rc = core_features_adapter_vector(adapter, "radius", l, cfg->n_head_kv, mat, &found, err);
        for (size_t h = 0; rc == 0 && found && h < hkv; h++)
            rc = core_features_set_radius(&lp->maps[(size_t)l * hkv + h], mat[h], err);
        if (rc)
            return rc;
    }
    for (size_t h = 0; !trig && h < hkv; h++) {
        uint64_t ss = core_features_stream_seed(cfg->seed, l, (int)h);
        core_features_t *f = &lp->maps[(size_t)l * hkv + h];
        double logdet = 0.0;
        if (t)
            memcpy(mat, (const unsigned char *)t->data + h * hd * hd * sizeof(float),
                   hd * hd * sizeof(float));
        if (cfg->kind == CORE_ATTN_DARKFORMER_IS) {
            rc = core_features_is_proposal(cfg->head_dim, mat, isa, &logdet, NULL, err);
            if (rc) {
                core_error_set(err, rc, "adapter tensor 'darkformer.blk.%d.lambda', KV head "
                               "%zu: no IS proposal", l, h);
                return rc;
            }
        }
        rc = core_features_init(f, cfg->kind, cfg->head_dim, cfg->n_features, ss, mat, isa,
                                logdet, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* The memory's distance cap and its angles (after rope_if). */
static void set_mem_cap(lin_params_t *lp, const core_attn_cfg_t *cfg, int64_t cap)
{
    lp->mem_cap = cap;
    for (int64_t i = 0; cfg->memory && i < cfg->n_rot / 2; i++) {
        const double ang = (double)cap * lp->rope_if[i];
        lp->mem_cs[2 * i] = cos(ang);
        lp->mem_cs[2 * i + 1] = sin(ang);
    }
}

static int linear_init(core_attn_t *a, const core_gguf_t *adapter, core_error_t *err)
{
    const core_attn_cfg_t *cfg = &a->cfg;
    const char *kname = core_attn_kind_name(cfg->kind);
    const int trig = core_attn_kind_is_trig(cfg->kind);
    int rc = check_cfg(cfg, adapter, err);
    if (rc)
        return rc;

    size_t hkv = (size_t)cfg->n_head_kv, hd = (size_t)cfg->head_dim;
    size_t n_maps = (size_t)cfg->n_layer * hkv;
    size_t nfq = (size_t)cfg->n_features / 2;
    float *mat = NULL, *om1 = NULL, *om2 = NULL, *tau = NULL; /* see lin_init_buf_t */
    double *isa = NULL;
    lin_params_t *lp = calloc(1, sizeof *lp);
    const int roped = cfg->prerope || cfg->sinks || cfg->memory;
    size_t n_rope = roped ? (size_t)cfg->n_rot / 2 : 1;
    if (lp) {
        lp->maps = calloc(n_maps, sizeof *lp->maps);
        lp->gam = malloc(n_maps * sizeof *lp->gam);
        lp->mix = calloc((size_t)cfg->n_layer * (size_t)cfg->n_head, sizeof *lp->mix);
        lp->rope_if = calloc(n_rope, sizeof *lp->rope_if);
        lp->sink_cs = calloc(2 * n_rope, sizeof *lp->sink_cs);
        lp->sink_cs_span = calloc(2 * n_rope, sizeof *lp->sink_cs_span);
        lp->mem_cs = calloc(2 * n_rope, sizeof *lp->mem_cs);
    }
    mat = malloc(hd * hd * sizeof *mat);
    isa = malloc(hd * hd * sizeof *isa);
    if (trig && adapter) {
        om1 = malloc(hkv * nfq * hd * sizeof *om1);
        om2 = malloc(hkv * nfq * hd * sizeof *om2);
        tau = malloc(hkv * sizeof *tau);
    }
    if (!lp || !lp->maps || !lp->gam || !lp->mix || !lp->rope_if || !lp->sink_cs ||
        !lp->sink_cs_span || !lp->mem_cs ||
        !mat || !isa ||
        (trig && adapter && (!om1 || !om2 || !tau))) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for %s parameters", kname);
        goto fail;
    }
    for (size_t i = 0; i < n_maps; i++)
        lp->gam[i] = 1.0f;
    for (int64_t i = 0; roped && i < cfg->n_rot / 2; i++) {
        lp->rope_if[i] = pow(cfg->rope_base, -2.0 * (double)i / (double)cfg->n_rot) / cfg->rope_scale;
        double ang = (double)(cfg->window + cfg->sinks - 1) * lp->rope_if[i];
        lp->sink_cs[2 * i] = cos(ang);
        lp->sink_cs[2 * i + 1] = sin(ang);
        ang = (double)(cfg->window + cfg->memory + cfg->sinks - 1) * lp->rope_if[i];
        lp->sink_cs_span[2 * i] = cos(ang);
        lp->sink_cs_span[2 * i + 1] = sin(ang);
    }
    set_mem_cap(lp, cfg, LIN_MEM_CAP);
    const lin_init_buf_t bf = {mat, isa, om1, om2, tau};
    for (int l = 0; l < cfg->n_layer; l++)
        if ((rc = load_layer(cfg, adapter, lp, l, &bf, err)))
            goto fail;
    lp->fp64 = 0;
    lp->trig = trig;
    rc = set_chunk(a, lp, LIN_DEFAULT_CHUNK, err);
    if (rc)
        goto fail;
    free(mat);
    free(isa);
    free(om1);
    free(om2);
    free(tau);
    a->impl = lp;
    return 0;
fail:
    free(mat);
    free(isa);
    free(om1);
    free(om2);
    free(tau);
    free_params(lp, n_maps);
    return rc;
}

static void linear_fini(core_attn_t *a)
{
    free_params(a->impl, (size_t)a->cfg.n_layer * (size_t)a->cfg.n_head_kv);
    a->impl = NULL;
}

/* ---- state ---- */

static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* Rows of the window ring: W, or W + B with the memory (keys leave the
 * exact span only at block boundaries, so up to W + B − 1 are exact). */
static size_t ring_rows(const core_attn_cfg_t *cfg)
{
    return (size_t)cfg->window + (cfg->memory ? (size_t)CORE_ATTN_MEMORY_BLOCK : 0);
}

/* The format of the exact rows (window, sinks, memory) and a row's bytes:
 * cfg->kv_bits 8 keeps them in 8 bits, else (16, or 0 in a config that
 * does not say) in halves. */
static core_kvrow_fmt_t row_fmt(const core_attn_cfg_t *cfg)
{
    return cfg->kv_bits == 8 ? CORE_KVROW_Q8 : CORE_KVROW_F16;
}

static size_t row_bytes(const core_attn_cfg_t *cfg)
{
    return core_kvrow_bytes(row_fmt(cfg), cfg->head_dim);
}

/* The memory's rows in a state (λ for each KV head that has it), where
 * flat head h's start, and how many h may hold. */
static size_t mem_rows_total(const core_attn_cfg_t *cfg)
{
    return core_attn_memory_heads(cfg) * (size_t)cfg->memory;
}

static size_t mem_first(const core_attn_cfg_t *cfg, size_t h)
{
    return core_attn_memory_heads_before(cfg, h) * (size_t)cfg->memory;
}

static size_t mem_cap_rows(const core_attn_cfg_t *cfg, size_t h)
{
    return core_attn_head_has_memory(cfg, h) ? (size_t)cfg->memory : 0;
}

static void state_clear(lin_state_t *st, const core_attn_cfg_t *cfg)
{
    size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, nc = nh * (size_t)cfg->n_features;
    for (size_t i = 0; i < nc; i++)
        st->c[i] = -INFINITY;
    for (size_t h = 0; cfg->memory && h < nh; h++)
        st->mem_n[h] = 0;
}

/* Lays st out in precision fp64, cleared: one allocation, doubles first so
 * every part stays 8-byte aligned. */
static int lin_state_relayout(lin_state_t *st, const core_attn_cfg_t *cfg, int fp64,
                              core_error_t *err)
{
    size_t es = fp64 ? sizeof(double) : sizeof(float);
    size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, n_s, n_z, n_ring, n_sink, b_s, b_z,
           b_r, b_k;
    /* the memory: positions (8 bytes), scores and counts (4), rows */
    const size_t lam = (size_t)cfg->memory, n_mem = mem_rows_total(cfg), rb = row_bytes(cfg),
                 b_mrow = n_mem * rb;
    const size_t b_mp = n_mem * sizeof(int64_t),
                 b_ms = lam ? n_mem * sizeof(float) + nh * sizeof(int32_t) : 0,
                 b_mr = b_mrow * 2;
    if (!mul_ok(nh, (size_t)cfg->n_features, &n_z) ||
        !mul_ok(n_z, (size_t)cfg->head_dim, &n_s) ||
        !mul_ok(nh * rb, ring_rows(cfg), &n_ring) ||
        !mul_ok(nh * rb, (size_t)cfg->sinks, &n_sink) ||
        !mul_ok(n_s, es, &b_s) || !mul_ok(n_z, es, &b_z) ||
        !mul_ok(n_ring, 2, &b_r) ||
        !mul_ok(n_sink, 2, &b_k) ||
        b_s > SIZE_MAX / 8 || b_r > SIZE_MAX / 8 || b_k > SIZE_MAX / 8)
        return core_error_set(err, CORE_ERANGE, "linear attention state size overflows");
    /* doubles and 8-byte positions first, then 4-byte parts, then the rows
     * (halves, or 8-bit rows that start with a float, 4 + Hd bytes with Hd
     * a multiple of 16): every part stays aligned */
    size_t b_c = n_z * sizeof(double), total = b_c + b_mp + b_s + b_z + b_ms + b_r + b_k + b_mr;
    unsigned char *blob = malloc(total ? total : 1);
    if (!blob)
        return core_error_set(err, CORE_ENOMEM, "out of memory for a %zu-byte attention state",
                              total);
    free(st->blob);
    st->fp64 = fp64;
    st->blob = blob;
    st->blob_bytes = total;
    unsigned char *p = blob;
    st->c = (double *)(void *)p;
    st->mem_pos = (int64_t *)(void *)(p += b_c);
    st->S = p += b_mp;
    st->z = p += b_s;
    st->mem_score = (float *)(void *)(p += b_z);
    st->mem_n = (int32_t *)(void *)(p + n_mem * sizeof(float));
    st->ring_k = p + b_ms;
    st->ring_v = st->ring_k + n_ring;
    st->sink_k = st->ring_v + n_ring;
    st->sink_v = st->sink_k + n_sink;
    st->mem_k = st->sink_v + n_sink;
    st->mem_v = st->mem_k + b_mrow;
    state_clear(st, cfg);
    return 0;
}

static int linear_state_init(core_attn_state_t *s, core_error_t *err)
{
    const lin_params_t *lp = s->a->impl;
    lin_state_t *st = calloc(1, sizeof *st);
    if (!st)
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention state");
    int rc = lin_state_relayout(st, &s->a->cfg, lp->fp64, err);
    if (rc < 0) {
        free(st);
        return rc;
    }
    const core_attn_cfg_t *cfg = &s->a->cfg;
    st->mg = malloc((size_t)cfg->n_head * LIN_MG_ROW((size_t)cfg->head_dim) * sizeof *st->mg);
    if (!st->mg) {
        free(st->blob);
        free(st);
        return core_error_set(err, CORE_ENOMEM, "out of memory for attention state");
    }
    s->impl = st;
    return 0;
}

static void linear_state_fini(core_attn_state_t *s)
{
    lin_state_t *st = s->impl;
    if (!st)
        return;
    free(st->blob);
    free(st->mg);
    free(st);
    s->impl = NULL;
}

static void linear_state_reset(core_attn_state_t *s)
{
    state_clear(s->impl, &s->a->cfg);
}

/* KV head h's linear state (of nh = L·Hkv) holds keys. A head's scales are
 * all −inf or all finite (a key's logits are finite on every feature, so
 * the first keys make every c_i finite and nothing makes one −inf again;
 * linear_state_load refuses a head that mixes them): its first tells. */
static int head_holds(const lin_state_t *st, const core_attn_cfg_t *cfg, size_t h)
{
    return st->c[h * (size_t)cfg->n_features] > -INFINITY;
}

/* Copies what src holds at position pos (lin_state_t): the scales, the
 * accumulators of the heads that hold keys, the valid window slots and
 * sink rows. */
static int linear_state_copy(core_attn_state_t *dst, const core_attn_state_t *src,
                             core_error_t *err)
{
    lin_state_t *d = dst->impl;
    const lin_state_t *sr = src->impl;
    const core_attn_cfg_t *cfg = &src->a->cfg;
    if (d->fp64 != sr->fp64 || d->blob_bytes != sr->blob_bytes)
        return core_error_set(err, CORE_EMISMATCH,
                              "attention states differ in accumulator precision");
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, m = (size_t)cfg->n_features,
                 hd = (size_t)cfg->head_dim, es = sr->fp64 ? sizeof(double) : sizeof(float);
    memcpy(d->c, sr->c, nh * m * sizeof(double));
    for (size_t h = 0; h < nh; h++)
        if (head_holds(sr, cfg, h)) {
            memcpy((char *)d->S + h * m * hd * es, (const char *)sr->S + h * m * hd * es,
                   m * hd * es);
            memcpy((char *)d->z + h * m * es, (const char *)sr->z + h * m * es, m * es);
        }
    const size_t w = ring_rows(cfg), nsk = (size_t)cfg->sinks, pos = (size_t)src->pos;
    const size_t nv = pos < w ? pos : w, ns = pos < nsk ? pos : nsk, lam = (size_t)cfg->memory;
    const size_t rb = row_bytes(cfg);
    for (size_t h = 0; h < nh; h++) {
        memcpy(d->ring_k + h * w * rb, sr->ring_k + h * w * rb, nv * rb);
        memcpy(d->ring_v + h * w * rb, sr->ring_v + h * w * rb, nv * rb);
        memcpy(d->sink_k + h * nsk * rb, sr->sink_k + h * nsk * rb, ns * rb);
        memcpy(d->sink_v + h * nsk * rb, sr->sink_v + h * nsk * rb, ns * rb);
        if (!lam)
            continue;
        const size_t n = (size_t)sr->mem_n[h], o = mem_first(cfg, h);
        d->mem_n[h] = sr->mem_n[h];
        memcpy(d->mem_pos + o, sr->mem_pos + o, n * sizeof(int64_t));
        memcpy(d->mem_score + o, sr->mem_score + o, n * sizeof(float));
        memcpy(d->mem_k + o * rb, sr->mem_k + o * rb, n * rb);
        memcpy(d->mem_v + o * rb, sr->mem_v + o * rb, n * rb);
    }
    return 0;
}

static size_t linear_state_bytes(const core_attn_state_t *s)
{
    const lin_state_t *st = s->impl;
    const core_attn_cfg_t *cfg = &s->a->cfg;
    return sizeof *s + sizeof *st + st->blob_bytes +
           (size_t)cfg->n_head * LIN_MG_ROW((size_t)cfg->head_dim) * sizeof *st->mg;
}

/* Whole pages n bytes can span at any alignment (0 for none). */
static size_t span_pages(size_t n)
{
    enum { PAGE = 4096 };
    return n ? (n + PAGE - 1) / PAGE + 1 : 0;
}

/* The bytes of a state at pos with n_hold heads holding keys that have been
 * written (lin_state_relayout's layout, core_attn_state_bytes_held): the
 * scales (state_clear writes them all), each holding head's accumulators,
 * every head's valid window rows (the first min(pos, W) slots, as
 * linear_state_copy counts them) and sink rows, each region counted at the
 * pages it can span; the merge rows; never more than the whole state. */
static size_t held_bytes(const core_attn_cfg_t *cfg, int fp64, int64_t pos, size_t n_hold,
                         size_t whole)
{
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, m = (size_t)cfg->n_features,
                 hd = (size_t)cfg->head_dim, es = fp64 ? sizeof(double) : sizeof(float),
                 w = ring_rows(cfg), nsk = (size_t)cfg->sinks, p = (size_t)pos,
                 hb = row_bytes(cfg), /* one K or V row */
                 lam = (size_t)cfg->memory, n_mem = mem_rows_total(cfg);
    const size_t nv = p < w ? p : w, ns = p < nsk ? p : nsk;
    size_t pages = span_pages(nh * m * sizeof(double));
    pages += n_hold * (span_pages(m * hd * es) + span_pages(m * es));
    pages += 2 * nh * span_pages(nv * hb);
    /* the memory's counts, positions and scores, and its rows once keys
     * leave the window (counted whole: they fill within a few blocks) */
    if (lam)
        pages += span_pages(n_mem * (sizeof(int64_t) + sizeof(float)) + nh * sizeof(int32_t)) +
                 (n_hold ? 2 * span_pages(n_mem * hb) : 0);
    pages += 2 * (ns == nsk ? span_pages(nh * nsk * hb) : nh * span_pages(ns * hb));
    const size_t b = sizeof(core_attn_state_t) + sizeof(lin_state_t) + pages * 4096 +
                     (size_t)cfg->n_head * LIN_MG_ROW(hd) * sizeof(double);
    return b < whole ? b : whole;
}

static size_t linear_state_bytes_held(const core_attn_state_t *s)
{
    const lin_state_t *st = s->impl;
    const core_attn_cfg_t *cfg = &s->a->cfg;
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
    size_t n_hold = 0;
    for (size_t h = 0; h < nh; h++)
        n_hold += (size_t)head_holds(st, cfg, h);
    return held_bytes(cfg, st->fp64, s->pos, n_hold, linear_state_bytes(s));
}

/* A copy at pos: its heads hold keys once one has left the window and the
 * sinks (pos > W + S), all of them alike. */
static size_t linear_bytes_held_at(const core_attn_t *a, int64_t pos)
{
    const lin_params_t *lp = a->impl;
    const core_attn_cfg_t *cfg = &a->cfg;
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
    const int holds = pos > (int64_t)cfg->window + (int64_t)cfg->sinks;
    /* the whole state: as linear_state_bytes computes it for one of a's */
    const size_t es = lp->fp64 ? sizeof(double) : sizeof(float),
                 m = (size_t)cfg->n_features, hd = (size_t)cfg->head_dim;
    const size_t whole = sizeof(core_attn_state_t) + sizeof(lin_state_t) +
                         nh * m * (sizeof(double) + es * (hd + 1)) +
                         2 * row_bytes(cfg) *
                             (nh * (ring_rows(cfg) + (size_t)cfg->sinks) + mem_rows_total(cfg)) +
                         mem_rows_total(cfg) * (sizeof(int64_t) + sizeof(float)) +
                         (cfg->memory ? nh * sizeof(int32_t) : 0) +
                         (size_t)cfg->n_head * LIN_MG_ROW(hd) * sizeof(double);
    return held_bytes(cfg, lp->fp64, pos, holds ? nh : 0, whole);
}

static int linear_reserve(core_attn_t *a, core_attn_state_t *s, int64_t n, core_error_t *err)
{
    /* Constant-size state and chunk-bounded scratch: no context limit. */
    (void)a;
    (void)s;
    (void)n;
    (void)err;
    return 0;
}

/* ---- forward ---- */

typedef struct lin_ctx {
    const core_features_t *f;
    lin_scratch_t sc;
    /* m = M features (everywhere in this file; the max shift is mx); nq =
     * H·Hd, nkv = Hkv·Hd row strides */
    int64_t p0, hd, m, gs, nq, nkv, h, w;
    int64_t ring_n;               /* ring rows: W, or W + B with the memory */
    int64_t lam;                  /* λ memory rows per KV head, 0: off (no blocks) */
    int64_t keep;                 /* rows this head's memory holds: λ, or 0 for a head
                                   * without it (cfg->memory_some) */
    int recent;                   /* the memory keeps the newest rows (CORE_ATTN_KEEP_RECENT) */
    int64_t cap;                  /* the memory's distance cap (lin_params_t.mem_cap) */
    const float *q, *k, *v;
    float *out;
    const unsigned char *ring_k, *ring_v; /* this layer's [Hkv][W] rows */
    const unsigned char *sink_k, *sink_v; /* this layer's [Hkv][S] rows */
    core_kvrow_fmt_t rf;          /* their format (row_fmt) */
    int64_t rb;                   /* a row's bytes */
    int64_t sinks;                /* S */
    double lg;                    /* log γ of this KV head (0: no decay) */
    const float *mix;             /* this layer's [H] β */
    const double *rope_if;        /* [n_rot/2] (prerope or sinks), else NULL */
    const double *sink_cs;        /* lin_params_t.sink_cs, or sink_cs_span (sink_w) */
    int64_t sink_w;               /* the sinks sit next to this span: W, or W + λ for a head
                                   * whose memory keeps the newest rows */
    const double *mem_cs;         /* lin_params_t.mem_cs */
    /* head h's memory (head_set) */
    unsigned char *mem_k, *mem_v; /* [λ] rows */
    int64_t *mem_pos;             /* [λ] */
    float *mem_score;             /* [λ] */
    int32_t *mem_n;
    int pre;                      /* features before RoPE */
    int n_rot;
    int lin_off;                  /* linear branch off */
    int trig;                     /* Flexformer: signed features, one log-scale per vector */
    core_attn_den_stats_t *dst;   /* Flexformer's denominator counters */
    int fp64;
    float *sf, *zf;   /* this head's S, z (fp32 states) */
    double *sd, *zd;  /* (fp64 states) */
    double *c;        /* this head's [M] scales */
} lin_ctx_t;

/* max_i (g[i] + c[i]) in double (four chains, as core_max_f32: one chain
 * waited on every comparison, and such loops were a tenth of a batched
 * decode step), or max_i c[i] for g NULL; −inf for m = 0. */
static double max_shifted(const float *g, const double *c, int64_t m)
{
    double mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int64_t i = 0; i < m; i++) {
        const double v = g ? (double)g[i] + c[i] : c[i];
        mx[i & 3] = v > mx[i & 3] ? v : mx[i & 3];
    }
    const double a = mx[0] > mx[1] ? mx[0] : mx[1], b = mx[2] > mx[3] ? mx[2] : mx[3];
    return a > b ? a : b;
}

/* e[j] = −inf for j in [j0, j1) ∩ [0, n). */
static void mask_span(float *e, int64_t n, int64_t j0, int64_t j1)
{
    for (int64_t j = j0 > 0 ? j0 : 0; j < j1 && j < n; j++)
        e[j] = -INFINITY;
}

/* Where the keys (val 0) or values (val 1) of KV head h from position pos
 * (< end) lie as stored rows: in the sinks (pos < S) or the ring (which still
 * holds positions p0−W..p0−1: both are updated only after the whole
 * forward), rows Hd apart, with *len the positions that follow pos there;
 * NULL for this forward's input (pos ≥ p0: floats, not rounded yet), *len
 * the rest up to end. */
static const unsigned char *kv_row_run(const lin_ctx_t *x, int val, int64_t pos, int64_t end,
                                       int64_t *len)
{
    if (pos >= x->p0) {
        *len = end - pos;
        return NULL;
    }
    /* A position before this forward that is not a sink is in the ring
     * (which holds positions p0 − ring_n..p0 − 1), so W > 0 there (with
     * W = 0 the exact span starts at p0 + t0 ≥ p0);
     * clang-analyzer does not know that positions are not negative. */
    const int sk = pos < x->sinks;
    /* NOLINTNEXTLINE(clang-analyzer-core.DivideZero) */
    int64_t lim = sk ? x->sinks : pos + x->ring_n - pos % x->ring_n;
    if (lim > x->p0)
        lim = x->p0;
    if (lim > end)
        lim = end;
    *len = lim - pos;
    if (sk)
        return (val ? x->sink_v : x->sink_k) + (x->h * x->sinks + pos) * x->rb;
    return (val ? x->ring_v : x->ring_k) + (x->h * x->ring_n + pos % x->ring_n) * x->rb;
}

/* The keys (val 0) or values (val 1) of KV head h at the n positions from
 * pos, into dst [n][Hd] as floats; this forward's input rounded as
 * linear_forward_done will store it. Every key and value is read through
 * here or kv_row_run, so each is the same number whether it came in this
 * forward or an earlier one: chunking never changes it. */
static void kv_rows(const lin_ctx_t *x, int val, int64_t pos, int64_t n, float *dst)
{
    const float *in = val ? x->v : x->k;
    const int64_t hd = x->hd, end = pos + n;
    for (int64_t len; pos < end; pos += len, dst += len * hd) {
        const unsigned char *h = kv_row_run(x, val, pos, end, &len);
        if (h)
            core_kvrow_unpack(x->rf, h, dst, len, hd);
        else
            for (int64_t i = 0; i < len; i++)
                core_kvrow_round(x->rf, in + (pos + i - x->p0) * x->nkv + x->h * hd, dst + i * hd,
                                 hd);
    }
}

/* The decode products on stored rows b (core/kernels/blas.h), in their own
 * format: scores c[m][n] = alpha·a[m][Hd]·(n key rows)ᵀ + beta·c (nt), and
 * sums c[m][Hd] = a[m][n]·(n value rows) + beta·c (nn). 0 when no kernel
 * takes the shape: the caller unpacks the rows and uses the float entries. */
static int rows_nt(const lin_ctx_t *x, int64_t m, int64_t n, float alpha, const float *a,
                   const unsigned char *b, float beta, float *c, int64_t ldc)
{
    if (x->rf == CORE_KVROW_Q8)
        return core_gemm_nt_q8_small(m, n, x->hd, alpha, a, x->hd, b, x->rb, beta, c, ldc);
    return core_gemm_nt_half_small(m, n, x->hd, alpha, a, x->hd, (const uint16_t *)(const void *)b,
                                   x->hd, beta, c, ldc);
}

static int rows_nn(const lin_ctx_t *x, int64_t m, int64_t n, const float *a, int64_t lda,
                   const unsigned char *b, float beta, float *c)
{
    if (x->rf == CORE_KVROW_Q8)
        return core_gemm_nn_q8_small(m, x->hd, n, 1.0f, a, lda, b, x->rb, beta, c, x->hd);
    return core_gemm_nn_half_small(m, x->hd, n, 1.0f, a, lda, (const uint16_t *)(const void *)b,
                                   x->hd, beta, c, x->hd);
}

/* a turned by the angles cs (n_rot/2 cos, sin pairs): back (un-rotated,
 * fwd 0) or forward (fwd 1, the inverse); the dimensions past n_rot are
 * copied. */
static void rotate(const lin_ctx_t *x, const double *cs, int fwd, const float *a, float *o)
{
    for (int64_t j = 0; j < x->n_rot / 2; j++) {
        /* rope_cs fills an entry before it is read (clang-analyzer does
         * not follow the cache's position tags) */
        /* NOLINTNEXTLINE(clang-analyzer-core.uninitialized.Assign) */
        double c = cs[2 * j], sn = fwd ? cs[2 * j + 1] : -cs[2 * j + 1];
        double u = a[2 * j], w = a[2 * j + 1];
        o[2 * j] = (float)(u * c - w * sn);
        o[2 * j + 1] = (float)(w * c + u * sn);
    }
    for (int64_t j = x->n_rot; j < x->hd; j++)
        o[j] = a[j];
}

/* cos, sin of pos·θ_j for j < n_rot/2, from the slot's query (key 0) or
 * key cache (computed there first if another position holds its entry). */
static const double *rope_cs(const lin_ctx_t *x, int64_t pos, int key)
{
    double *e = x->sc.rc + ((int64_t)key * LIN_ROPE_CACHE + pos % LIN_ROPE_CACHE) * (1 + x->n_rot);
    if (e[0] != (double)pos) {
        for (int64_t j = 0; j < x->n_rot / 2; j++) {
            double ang = (double)pos * x->rope_if[j];
            e[1 + 2 * j] = cos(ang);
            e[2 + 2 * j] = sin(ang);
        }
        e[0] = (double)pos;
    }
    return e + 1;
}

/* Undoes RoPE on n rows of Hd (row i at position pos0 + i / per; angles
 * from the query or the key cache, key): the model rotates pairs (2j, 2j+1)
 * by pos·θ_j; rotating back by −pos·θ_j gives the vector before RoPE to
 * float rounding. */
static void unrope(const lin_ctx_t *x, int key, int64_t n, int64_t per, int64_t pos0,
                   const float *in, float *out)
{
    for (int64_t i = 0; i < n; i++)
        rotate(x, rope_cs(x, pos0 + i / per, key), 0, in + i * x->hd, out + i * x->hd);
}

/* Exact log-domain evaluation of one row's linear part (the underflow guard):
 * every term's log-weight is formed in double from the logits and the state
 * at its own scales, then one max shift. Sets num/den for row r and lrow to
 * that shift (the caller subtracts the query's half norm, as for the fast
 * path), or lrow = −inf when the row has no mass at all. */
static void slow_row(lin_ctx_t *x, int64_t r, int64_t t, int64_t ti0, int64_t ni, double cdec)
{
    lin_scratch_t *sc = &x->sc;
    int64_t m = x->m, hd = x->hd;
    const float *g = sc->gd + r * m;
    double *lw = sc->tmp;           /* [M] state terms, then [NI] key terms */
    double *acc = sc->tmp + m + ni; /* [Hd] */
    double top = -INFINITY;
    for (int64_t i = 0; i < m; i++) {
        /* S̃, z̃ are read only under a finite scale (see lin_state_t) */
        double zi = !(x->c[i] > -INFINITY) ? 0.0 : x->fp64 ? x->zd[i] : (double)x->zf[i];
        lw[i] = zi > 0.0 ? (double)g[i] + x->c[i] + cdec + log(zi) : -INFINITY;
        if (lw[i] > top)
            top = lw[i];
    }
    for (int64_t j = 0; j < ni; j++) {
        double *lj = &lw[m + j];
        *lj = -INFINITY;
        if (ti0 + j > t)
            continue;
        const float *a = sc->kd + j * m;
        double mx = -INFINITY;
        for (int64_t i = 0; i < m; i++)
            if ((double)g[i] + a[i] > mx)
                mx = (double)g[i] + a[i];
        if (!(mx > -INFINITY))
            continue;
        double s = 0.0;
        for (int64_t i = 0; i < m; i++)
            s += exp((double)g[i] + a[i] - mx);
        /* s >= 1: the term that attains mx contributes exp(0). */
        // cppcheck-suppress invalidFunctionArg
        *lj = mx + log(s);
        if (*lj > top)
            top = *lj;
    }
    if (!(top > -INFINITY)) {
        sc->lrow[r] = -INFINITY;
        return;
    }
    double den = 0.0;
    for (int64_t c = 0; c < hd; c++)
        acc[c] = 0.0;
    for (int64_t i = 0; i < m; i++) {
        if (lw[i] == -INFINITY)
            continue;
        double e = exp(lw[i] - top);
        den += e;
        double zi = x->fp64 ? x->zd[i] : (double)x->zf[i];
        double wgt = e / zi; /* S̃_i / z̃_i is a weighted mean of values */
        for (int64_t c = 0; c < hd; c++)
            acc[c] += wgt * (x->fp64 ? x->sd[i * hd + c] : (double)x->sf[i * hd + c]);
    }
    for (int64_t j = 0; j < ni; j++) {
        if (lw[m + j] == -INFINITY)
            continue;
        double e = exp(lw[m + j] - top);
        den += e;
        for (int64_t c = 0; c < hd; c++)
            acc[c] += e * sc->vi[j * hd + c];
    }
    for (int64_t c = 0; c < hd; c++)
        sc->num[r * hd + c] = (float)acc[c];
    sc->den[r] = den;
    sc->lrow[r] = top;
}

/* Flexformer's factor on a hybrid row's linear part (the signed-denominator
 * rule of the file comment): lw = log of the row's linear scale against its
 * exact part (Lrow − s*), den its linear denominator at that scale, e ≥ 1 its
 * exact mass, so D = e^lw·den. D < −E/2: λe^lw with λ = (E/2)/|D|, i.e.
 * (E/2)/|den|, formed without e^lw (which may overflow). The comparisons run
 * in the log domain for the same reason; counted in x->dst. With an input
 * sphere any D < 0 gives 0. */
static double trig_weight(lin_ctx_t *x, double lw, double den, double e)
{
    if (!(lw > -INFINITY) || den == 0.0)
        return 0.0;
    x->dst->rows++;
    if (den > 0.0) /* E + D > E: no rule; a linear part 1e300 times E is all there is */
        return exp(lw < 690.0 ? lw : 690.0);
    x->dst->neg++;
    double ld = lw + log(-den); /* log |D| */
    x->dst->below_tenth += ld > log(0.9 * e);
    x->dst->below_half += ld > log(0.5 * e);
    if (x->f->radius > 0.0f) /* the sphere's rule: the linear part dropped */
        return 0.0;
    return ld > log(0.5 * e) ? 0.5 * e / -den : exp(lw);
}

/* Tokens [t0, t1) of this forward, one KV head.
 *
 * Decay (γ = e^lg per token): the state after token τ is γ·(state after
 * τ−1) + the key that token brings, so a query at τ weighs a key absorbed at
 * τ' by γ^(τ−τ'). Everything linear is first evaluated at the chunk's end
 * (key logits a' = a + (t1−1−t)·lg, the carried state at c + nt·lg), which
 * is also the scale the state is left at; row t then multiplies its linear
 * part by γ^(t−t1+1) = e^((t−t1+1)·lg), added to its log-scale Lrow. The
 * running log-scales thus absorb the decay: the key that sets C_i still
 * contributes exactly 1 to z̃_i, so z̃ ≥ 1 and nothing underflows, however
 * long the stream. γ = 1 adds zeros: bit-identical to no decay. */
/* One chunk of a KV head's rows, tokens [t0, t1), and what its steps
 * (chunk_keys .. chunk_absorb, in that order) hand on to one another. */
typedef struct lin_chunk {
    int64_t t0, t1, nr; /* nr = (t1 − t0)·gs rows: the group's query heads per token */
    int64_t ti0, ni;    /* the keys entering the linear state: those of tokens ti0..ti0+ni */
    double cdec;        /* (t1 − t0)·log γ: the decay over the chunk */
    int state_on;       /* the carried state holds keys */
    int unroped;        /* chunk_queries un-rotated the query rows into sc->qu */
} lin_chunk_t;

/* The block (of CORE_ATTN_MEMORY_BLOCK positions) position pos is in. */
static int64_t block_start(int64_t pos)
{
    return pos / CORE_ATTN_MEMORY_BLOCK * CORE_ATTN_MEMORY_BLOCK;
}

/* The rows of head x->h's memory that are far at block b (b − u ≥
 * LIN_MEM_CAP): a prefix, the rows being in position order. Their keys are
 * held before RoPE, the others' after. */
static int64_t mem_far(const lin_ctx_t *x, int64_t b)
{
    const int64_t n = *x->mem_n;
    int64_t f = 0;
    while (f < n && b - x->mem_pos[f] >= x->cap)
        f++;
    return f;
}

/* The keys entering the linear state with this chunk (their features and
 * log-scales, in sc) and the state's new scales cn and rescale factors al. */
static void chunk_keys(lin_ctx_t *x, lin_chunk_t *ck)
{
    lin_scratch_t *sc = &x->sc;
    const core_features_t *f = x->f;
    int64_t hd = x->hd, m = x->m, w = x->w, nsk = x->sinks;
    int64_t t0 = ck->t0, t1 = ck->t1;
    double *cn = sc->cn, *al = sc->al;
    /* With the memory, keys join the linear state only at block boundaries
     * (block_boundary, before the block's first rows): the state stays at
     * the time b − 1 of its block's start b, so this chunk's rows weigh it
     * by the decay from there to the chunk's end (and chunk_linear's
     * (t − t1 + 1)·lg on to each row). */
    if (x->lam)
        ck->cdec = (double)(x->p0 + t1 - block_start(x->p0 + t0)) * x->lg;
    double lg = x->lg, cdec = ck->cdec;
    /* Keys entering the linear state: token τ brings the key at τ−W, except
     * the sinks (positions < S), which stay exact forever. */
    int64_t tfirst = w + nsk - x->p0 > 0 ? w + nsk - x->p0 : 0;
    int64_t ti0 = t0 > tfirst ? t0 : tfirst;
    int64_t ni = t1 > ti0 && !x->lin_off && !x->lam ? t1 - ti0 : 0;
    ck->ti0 = ti0;
    ck->ni = ni;
    if (ni == 0 && !(x->c[0] > -INFINITY)) {
        /* an empty head (head_holds) and no key entering: no linear part,
         * nothing to absorb, the scales stay −inf (every decode step of a
         * context up to W + S) */
        ck->state_on = 0;
        return;
    }
    kv_rows(x, 0, x->p0 + ti0 - w, ni, sc->kx);
    kv_rows(x, 1, x->p0 + ti0 - w, ni, sc->vi);
    for (int64_t i = 0; i < m; i++)
        cn[i] = x->c[i] + cdec; /* −inf stays −inf */
    if (ni > 0) {
        const float *kin = sc->kx;
        if (x->pre) {
            unrope(x, 1, ni, 1, x->p0 + ti0 - w, sc->kx, sc->ku);
            kin = sc->ku;
        }
        core_features_prepare(f, ni, kin, hd, sc->ky);
        if (x->trig) {
            /* kd holds the signed values, khn the key's log-magnitude
             * (ν|ŷ|² and the decay to the chunk's end), shared by its rows */
            core_features_trig(f, ni, sc->ky, sc->kd, sc->khn);
            for (int64_t j = 0; j < ni; j++) {
                sc->khn[j] += (double)(t1 - 1 - (ti0 + j)) * lg;
                for (int64_t i = 0; i < m; i++)
                    if (sc->khn[j] > cn[i])
                        cn[i] = sc->khn[j];
            }
        } else {
            core_features_logits(f, ni, sc->ky, sc->kd, sc->khn);
        }
        for (int64_t j = 0; j < ni && !x->trig; j++) {
            float *a = sc->kd + j * m;
            double dj = (double)(t1 - 1 - (ti0 + j)) * lg;
            for (int64_t i = 0; i < m; i++) {
                a[i] = (float)((double)a[i] - sc->khn[j] + dj);
                if (a[i] > cn[i])
                    cn[i] = a[i];
            }
        }
    }
    int state_on = 0;
    for (int64_t i = 0; i < m; i++) {
        /* e^0 = 1 exactly: most steps raise no scale, and exp was most
         * of this loop */
        const double e = x->c[i] + cdec - cn[i];
        al[i] = x->c[i] > -INFINITY ? (e == 0.0 ? 1.0 : exp(e)) : 0.0;
        state_on |= x->c[i] > -INFINITY;
    }
    state_on &= !x->lin_off;
    ck->state_on = state_on;
}

/* Head x->h's query rows of tokens [t0, t1) into sc->qx. */
static void load_queries(lin_ctx_t *x, int64_t t0, int64_t t1)
{
    const int64_t w = x->gs * x->hd;
    for (int64_t t = t0; t < t1; t++)
        memcpy(x->sc.qx + (t - t0) * w, x->q + t * x->nq + x->h * w, (size_t)w * sizeof(float));
}

/* The query rows' features: qp (for the chunk's own keys) and qs (the
 * carried state's weights), with each row's log-scale lrow. A chunk with
 * nothing older than the window yet (an empty state and no key entering
 * it: every token of a context up to W + S) has no linear part, and its
 * rows' lrow is −inf without them: computing the features anyway was a
 * tenth of a batched decode step at short contexts. */
static void chunk_queries(lin_ctx_t *x, lin_chunk_t *ck)
{
    lin_scratch_t *sc = &x->sc;
    const core_features_t *f = x->f;
    int64_t hd = x->hd, m = x->m, gs = x->gs;
    int64_t t0 = ck->t0, t1 = ck->t1, nr = ck->nr;
    double *cn = sc->cn, *al = sc->al;
    load_queries(x, t0, t1);
    if (x->lin_off || !(ck->state_on || ck->ni > 0)) {
        for (int64_t r = 0; r < nr; r++)
            sc->lrow[r] = -INFINITY;
        return;
    }
    const float *qin = sc->qx;
    if (x->pre) {
        unrope(x, 0, nr, gs, x->p0 + t0, sc->qx, sc->qu);
        qin = sc->qu;
        ck->unroped = 1;
    }
    core_features_prepare(f, nr, qin, hd, sc->qy);
    if (x->trig) {
        /* gd: signed values; qhn: minus the query's log-magnitude, so
         * that Lrow = mx − qhn below adds it */
        core_features_trig(f, nr, sc->qy, sc->gd, sc->qhn);
        for (int64_t r = 0; r < nr; r++)
            sc->qhn[r] = -sc->qhn[r];
    } else {
        core_features_logits(f, nr, sc->qy, sc->gd, sc->qhn);
    }
    for (int64_t r = 0; r < nr; r++) {
        const float *g = sc->gd + r * m;
        float *p = sc->qp + r * m, *ps = sc->qs + r * m;
        /* Flexformer: the scales only (its values are bounded by 1/√(M/2)) */
        const double mx = max_shifted(x->trig ? NULL : g, cn, m);
        sc->lrow[r] = mx;
        /* p = e^(g + C − mx) (Flexformer: e^(C − mx) g), 0 where C or mx is −inf */
        for (int64_t i = 0; i < m; i++)
            p[i] = -INFINITY;
        for (int64_t i = 0; i < m && mx > -INFINITY; i++)
            if (cn[i] > -INFINITY)
                p[i] = (float)((x->trig ? 0.0 : (double)g[i]) + cn[i] - mx);
        core_exp_shifted(p, m, 0.0, p);
        if (x->trig)
            for (int64_t i = 0; i < m; i++)
                p[i] *= g[i];
        for (int64_t i = 0; i < m; i++)
            ps[i] = (float)(p[i] * al[i]);
    }
}

/* The linear part of every row: numerator num and denominator den from
 * the carried state and the chunk's keys, and lrow its final log-weight. */
static void chunk_linear(lin_ctx_t *x, const lin_chunk_t *ck)
{
    lin_scratch_t *sc = &x->sc;
    int64_t hd = x->hd, m = x->m, gs = x->gs;
    int64_t t0 = ck->t0, t1 = ck->t1, nr = ck->nr;
    double *cn = sc->cn;
    double lg = x->lg, cdec = ck->cdec;
    int64_t ti0 = ck->ti0, ni = ck->ni;
    int state_on = ck->state_on;
    /* Linear part, fast path: carried state (weights qs), chunk keys (qp·kpᵀ). */
    memset(sc->num, 0, (size_t)(nr * hd) * sizeof(float));
    for (int64_t r = 0; r < nr; r++)
        sc->den[r] = 0.0;
    if (state_on) {
        for (int64_t r = 0; r < nr; r++) {
            const float *ps = sc->qs + r * m;
            double dz = 0.0;
            if (x->fp64) {
                for (int64_t i = 0; i < m; i++)
                    dz += (double)ps[i] * x->zd[i];
                for (int64_t c = 0; c < hd; c++) {
                    double s = 0.0;
                    for (int64_t i = 0; i < m; i++)
                        s += (double)ps[i] * x->sd[i * hd + c];
                    sc->num[r * hd + c] = (float)s;
                }
            } else {
                dz = core_dot_f32(ps, x->zf, m);
            }
            sc->den[r] = dz;
        }
        if (!x->fp64)
            core_gemm_nn(nr, hd, m, 1.0f, sc->qs, m, x->sf, hd, 0.0f, sc->num, hd);
    }
    if (ni > 0) {
        /* kp = e^(a − C) (Flexformer: e^(|k| − C) times its signed value),
         * 0 where C is −inf */
        for (int64_t j = 0; j < ni; j++) {
            float *kp = sc->kp + j * m;
            const float *kd = sc->kd + j * m;
            for (int64_t i = 0; i < m; i++)
                kp[i] = !(cn[i] > -INFINITY) ? -INFINITY
                        : x->trig            ? (float)(sc->khn[j] - cn[i])
                                             : (float)((double)kd[i] - cn[i]);
            core_exp_shifted(kp, m, 0.0, kp);
            if (x->trig)
                for (int64_t i = 0; i < m; i++)
                    kp[i] *= kd[i];
        }
        core_gemm_nt(nr, ni, m, 1.0f, sc->qp, m, sc->kp, m, 0.0f, sc->pp, ni);
        for (int64_t r = 0; r < nr; r++) {
            int64_t t = t0 + r / gs;
            float *pr = sc->pp + r * ni;
            double s = 0.0;
            for (int64_t j = 0; j < ni; j++) {
                if (ti0 + j > t)
                    pr[j] = 0.0f;
                s += pr[j];
            }
            sc->den[r] += s;
        }
        core_gemm_nn(nr, hd, ni, 1.0f, sc->pp, ni, sc->vi, hd, 1.0f, sc->num, hd);
    }
    for (int64_t r = 0; r < nr; r++) {
        int64_t t = t0 + r / gs;
        if (x->lin_off || !(sc->lrow[r] > -INFINITY) || !(state_on || (ni > 0 && t >= ti0))) {
            sc->lrow[r] = -INFINITY; /* nothing older than the window yet */
            continue;
        }
        /* (Flexformer's values are signed and not exponentials of logits:
         * nothing underflows, and its denominator is handled below.) */
        if (!x->trig && !(sc->den[r] >= LIN_DEN_MIN))
            slow_row(x, r, t, ti0, ni, cdec);
        /* −inf stays −inf; decay from the chunk's end back to row t; mixing weight. */
        sc->lrow[r] += (double)(t - t1 + 1) * lg + (double)x->mix[x->h * gs + r % gs] - sc->qhn[r];
    }
}

/* Output rows with no exact keys (no window, no sinks): the linear part
 * alone. */
static void chunk_out_linear(lin_ctx_t *x, const lin_chunk_t *ck)
{
    lin_scratch_t *sc = &x->sc;
    int64_t hd = x->hd, gs = x->gs;
    int64_t t0 = ck->t0, nr = ck->nr;
    for (int64_t r = 0; r < nr; r++) {
        int64_t t = t0 + r / gs, g = r % gs;
        float *o = x->out + t * x->nq + (x->h * gs + g) * hd;
        double inv = sc->lrow[r] > -INFINITY ? 1.0 / sc->den[r] : 0.0;
        if (x->trig && sc->lrow[r] > -INFINITY) {
            /* no exact mass to compare with: a non-positive estimate of
             * a positive mass gives the empty output, counted */
            x->dst->rows++;
            x->dst->neg += sc->den[r] < 0.0;
            if (!(sc->den[r] > 0.0)) {
                x->dst->pure_zero++;
                inv = 0.0;
            }
        }
        for (int64_t c = 0; c < hd; c++)
            o[c] = (float)(sc->num[r * hd + c] * inv);
    }
}

/* Output rows: the linear part and the exact sinks and window under one
 * stabilizer. alone: the exact part only (a decode step's exact unit,
 * head_exact): each row stabilized by its own scores (kept in sx), esum and
 * ev at that stabilizer, no output. */
static void chunk_out_exact(lin_ctx_t *x, const lin_chunk_t *ck, int alone)
{
    lin_scratch_t *sc = &x->sc;
    int64_t hd = x->hd, gs = x->gs, w = x->w, nsk = x->sinks;
    int64_t t0 = ck->t0, t1 = ck->t1, nr = ck->nr;
    /* Exact keys: the sinks older than the span, then the span of every
     * position some row's window reaches (for W = 0: the chunk's own). */
    int64_t back = w > 0 ? w - 1 : 0;
    int64_t pw0 = x->p0 + t0 - back > 0 ? x->p0 + t0 - back : 0;
    /* with the memory: every key from W before the block's start, then
     * the memory's rows (columns nks..nk − 1) */
    if (x->lam)
        pw0 = block_start(x->p0 + t0) - w > 0 ? block_start(x->p0 + t0) - w : 0;
    int64_t ns = nsk < pw0 ? nsk : pw0;
    int64_t nks = ns + x->p0 + t1 - pw0, nm = x->lam ? *x->mem_n : 0, nk = nks + nm;
    int have_qu = ck->unroped;
    /* key j is at position j < ns ? j : pw0 + j − ns; the products read
     * the sinks' and the ring's halves in place where a kernel takes them
     * (decode), else rows gathered as floats */
    const float scale = (float)(1.0 / sqrt((double)hd));
    for (int64_t j = 0, len; j < nks; j += len) {
        int64_t pos = j < ns ? j : pw0 + j - ns;
        const unsigned char *h = kv_row_run(x, 0, pos, j < ns ? ns : x->p0 + t1, &len);
        if (!h || !rows_nt(x, nr, len, scale, sc->qx, h, 0.0f, sc->e + j, nk)) {
            kv_rows(x, 0, pos, len, sc->kvg + j * hd);
            core_gemm_nt(nr, len, hd, scale, sc->qx, hd, sc->kvg + j * hd, hd, 0.0f, sc->e + j, nk);
        }
    }
    /* Sinks sit next to the window (StreamingLLM's positions): once a
     * query at τ is past τ = W + S − 1, sink j is scored as if it were at
     * position j + (τ − W + 1 − S), so the RoPE distance to the sinks
     * stays W + S − 1 − j however long the stream — a model never saw
     * RoPE distances past its training context. That relative rotation
     * is the same for every such τ: with q̃ = q un-rotated by τ and
     * k̃_j = k_j rotated by 1 − W − S (from its own j), the score is
     * q̃·k̃_j. Before that τ every sink sits at its true position. */
    int64_t tshift = x->sink_w + nsk - 1; /* first τ with the shift */
    int shifted = nsk > 0 && x->p0 + t1 - 1 >= tshift;
    if (shifted) {
        /* q̃·R(−δ)k_j = R(δ)q̃·k_j (δ = W + S − 1, angles precomputed):
         * the few query rows turn instead of the S keys, which the
         * product then reads as stored */
        /* unless chunk_queries un-rotated them for the features */
        if (!have_qu)
            unrope(x, 0, nr, gs, x->p0 + t0, sc->qx, sc->qu);
        have_qu = 1;
        for (int64_t r = 0; r < nr; r++)
            rotate(x, x->sink_cs, 1, sc->qu + r * hd, sc->qy + r * hd);
        int64_t len;
        const unsigned char *h = kv_row_run(x, 0, 0, nsk, &len);
        if (!h || len < nsk || !rows_nt(x, nr, nsk, scale, sc->qy, h, 0.0f, sc->es, nsk)) {
            kv_rows(x, 0, 0, nsk, sc->ks);
            core_gemm_nt(nr, nsk, hd, scale, sc->qy, hd, sc->ks, hd, 0.0f, sc->es, nsk);
        }
    }
    /* The memory's rows: the near ones (keys after RoPE) at their true
     * distance against the query rows as they are; the far ones (a prefix:
     * keys before RoPE) all at distance LIN_MEM_CAP, R(cap)·q̃ against
     * k̃_j, so a row kept from far back never meets a RoPE distance the
     * model did not see (docs/DESIGN.md §3 "Exact memory"). */
    if (nm > 0) {
        const int64_t nf = mem_far(x, block_start(x->p0 + t0));
        if (nf > 0) {
            if (!have_qu)
                unrope(x, 0, nr, gs, x->p0 + t0, sc->qx, sc->qu);
            for (int64_t r = 0; r < nr; r++)
                rotate(x, x->mem_cs, 1, sc->qu + r * hd, sc->qm + r * hd);
        }
        for (int part = 0; part < 2; part++) {
            const int64_t j0 = part ? nf : 0, nj = part ? nm - nf : nf;
            const float *qq = part ? sc->qx : sc->qm;
            if (nj == 0)
                continue;
            if (!rows_nt(x, nr, nj, scale, qq, x->mem_k + j0 * x->rb, 0.0f, sc->e + nks + j0,
                         nk)) {
                core_kvrow_unpack(x->rf, x->mem_k + j0 * x->rb, sc->kvg + (nks + j0) * hd, nj, hd);
                core_gemm_nt(nr, nj, hd, scale, qq, hd, sc->kvg + (nks + j0) * hd, hd, 0.0f,
                             sc->e + nks + j0, nk);
            }
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        int64_t tau = x->p0 + t0 + r / gs;
        if (shifted && tau >= tshift)
            for (int64_t j = 0; j < nsk; j++)
                sc->e[r * nk + (j < ns ? j : ns + j - pw0)] = sc->es[r * nsk + j];
        /* key at u is visible iff u ≤ τ and (u in the window or u a sink) */
        int64_t lo = x->lam ? pw0 : w > 0 ? (tau - w + 1 > 0 ? tau - w + 1 : 0) : tau + 1;
        float *er = sc->e + r * nk;
        /* masked: the sinks' part past τ (j < ns, at u = j); the window
         * part (u = pw0 + j − ns) past τ, and below lo unless a sink; the
         * memory's rows are all older than the span, all visible */
        mask_span(er, ns, tau + 1, ns);
        mask_span(er, nks, tau + 1 - pw0 + ns, nks);
        mask_span(er, nks, (nsk > pw0 ? nsk : pw0) - pw0 + ns, lo - pw0 + ns);
        /* Flexformer's Lrow bounds the magnitude of its linear terms,
         * not their signed sum (which can be far smaller): the exact
         * scores alone stabilize its rows (the row's own key or a sink
         * is always visible here, so E ≥ 1) */
        const double s0 = alone || x->trig ? -INFINITY : sc->lrow[r], se = core_max_f32(er, nk);
        const double s = se > s0 ? se : s0;
        core_exp_shifted(er, nk, s, er); /* -inf (masked) gives 0 */
        sc->esum[r] = core_sum_f32(er, nk);
        if (alone) {
            sc->sx[r] = s;
            continue;
        }
        /* From here on lrow holds the linear part's factor e^(Lrow − s*)
         * (Flexformer: its log, Lrow − s*, which may exceed the double range). */
        if (x->trig)
            sc->lrow[r] = sc->lrow[r] - s;
        else
            sc->lrow[r] = sc->lrow[r] > -INFINITY ? exp(sc->lrow[r] - s) : 0.0;
    }
    for (int64_t j = 0, len; j < nks; j += len) {
        int64_t pos = j < ns ? j : pw0 + j - ns;
        const float beta = j > 0 ? 1.0f : 0.0f;
        const unsigned char *h = kv_row_run(x, 1, pos, j < ns ? ns : x->p0 + t1, &len);
        if (!h || !rows_nn(x, nr, len, sc->e + j, nk, h, beta, sc->ev)) {
            kv_rows(x, 1, pos, len, sc->kvg + j * hd);
            core_gemm_nn(nr, hd, len, 1.0f, sc->e + j, nk, sc->kvg + j * hd, hd, beta, sc->ev, hd);
        }
    }
    if (nm > 0 && !rows_nn(x, nr, nm, sc->e + nks, nk, x->mem_v, nks > 0 ? 1.0f : 0.0f, sc->ev)) {
        core_kvrow_unpack(x->rf, x->mem_v, sc->kvg + nks * hd, nm, hd);
        core_gemm_nn(nr, hd, nm, 1.0f, sc->e + nks, nk, sc->kvg + nks * hd, hd,
                     nks > 0 ? 1.0f : 0.0f, sc->ev, hd);
    }
    for (int64_t r = 0; r < nr && !alone; r++) {
        int64_t t = t0 + r / gs, g = r % gs;
        float *o = x->out + t * x->nq + (x->h * gs + g) * hd;
        double wl = sc->lrow[r];
        if (x->trig)
            wl = trig_weight(x, sc->lrow[r], sc->den[r], sc->esum[r]);
        double inv = 1.0 / (wl * sc->den[r] + sc->esum[r]);
        for (int64_t c = 0; c < hd; c++)
            o[c] = (float)((wl * sc->num[r * hd + c] + sc->ev[r * hd + c]) * inv);
    }
}

/* Absorbs the chunk's keys into the state: rows rescaled to their new
 * scales, then the keys added. */
static void chunk_absorb(lin_ctx_t *x, const lin_chunk_t *ck)
{
    lin_scratch_t *sc = &x->sc;
    int64_t hd = x->hd, m = x->m;
    double *cn = sc->cn, *al = sc->al;
    int64_t ni = ck->ni;
    /* Absorb this chunk's keys: rescale rows to their new scales, then add. */
    if (x->lin_off || (!ck->state_on && ni == 0)) /* (chunk_keys left cn, al unset) */
        return;
    if (!ck->state_on && ni > 0) { /* the first keys: S̃, z̃ had no value (lin_state_t) */
        const size_t es = x->fp64 ? sizeof(double) : sizeof(float);
        memset(x->fp64 ? (void *)x->sd : (void *)x->sf, 0, (size_t)(m * hd) * es);
        memset(x->fp64 ? (void *)x->zd : (void *)x->zf, 0, (size_t)m * es);
    }
    if (x->fp64) {
        for (int64_t i = 0; i < m; i++) {
            double *si = x->sd + i * hd, zi = x->zd[i] * al[i];
            for (int64_t c = 0; c < hd; c++)
                si[c] *= al[i];
            for (int64_t j = 0; j < ni; j++) {
                double kv = sc->kp[j * m + i];
                zi += kv;
                for (int64_t c = 0; c < hd; c++)
                    si[c] += kv * sc->vi[j * hd + c];
            }
            x->zd[i] = zi;
        }
    } else {
        for (int64_t i = 0; i < m; i++) {
            /* a row at its scale (the decay only moves c), or one no key has
             * reached yet and none reaches now (c and C −inf: it holds nothing
             * any query weighs, and the key that first reaches it multiplies
             * it by 0 here) stays as it is: a decode step with the window
             * not full yet rescaled every row of every head by 0 */
            if (al[i] == 1.0 || !(cn[i] > -INFINITY))
                continue;
            float fa = (float)al[i];
            float *si = x->sf + i * hd;
            for (int64_t c = 0; c < hd; c++)
                si[c] *= fa;
            x->zf[i] *= fa;
        }
        if (ni > 0)
            core_gemm_tn(m, hd, ni, 1.0f, sc->kp, m, sc->vi, hd, 1.0f, x->sf, hd);
        for (int64_t i = 0; i < m && ni > 0; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < ni; j++)
                s += sc->kp[j * m + i];
            x->zf[i] += (float)s;
        }
    }
    memcpy(x->c, cn, (size_t)m * sizeof *cn);
}

/* ---- the exact memory (cfg->memory = λ > 0; docs/DESIGN.md §3 "Exact
 * memory") ----
 *
 * Keys leave the exact span in blocks: at each boundary b (a multiple of B
 * = CORE_ATTN_MEMORY_BLOCK), before the rows of the block [b, b + B), the
 * keys at positions [b − W − B, b − W) (none below S: the sinks stay) and
 * the memory's λ rows compete on their retention score; the λ best stay
 * exact (the memory), the others join the linear state with the decay
 * their age implies, γ^(t − W − u) at a row t as if they had joined when
 * they left the window. A row of the block sees exactly the sinks, the
 * memory and every key from b − W on (W + 1 to W + B of them), and
 * linearly the state as it was at b. So the linear state changes only at
 * boundaries, by the same operations on the same numbers however the
 * tokens were chunked or batched: its bits, and so every choice made
 * from them, do not depend on the chunking.
 *
 * The score is a key's self-recall error at its boundary, ‖Σ_i φ_i(k) S_i /
 * Σ_i φ_i(k) z_i − v‖², against the linear state with the memory's rows
 * added as linear terms (score_state): how badly a state holding everything
 * older would give back its value, divided by the median of its block's
 * errors (relative_errors). A row keeps the score it entered with; ties go
 * to the older position. */

/* Contestants [score, position, source] best first: the higher score,
 * then the older position (a total order on what is stored). */
static int ent_cmp(const void *pa, const void *pb)
{
    const double *a = pa, *b = pb;
    if (a[0] != b[0])
        return a[0] > b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

/* Memory row i's key as the features take it, into out [Hd]: before RoPE
 * for pre-RoPE features, else at its own position; far says the row is
 * held before RoPE (mem_far), so it is turned forward or back as needed. */
static void mem_key_features_in(const lin_ctx_t *x, int64_t i, int far, float *out)
{
    float tmp[CORE_FEATURES_MAX_HEAD_DIM];
    core_kvrow_unpack(x->rf, x->mem_k + i * x->rb, tmp, 1, x->hd);
    if (far == (x->pre != 0))
        memcpy(out, tmp, (size_t)x->hd * sizeof *tmp);
    else
        rotate(x, rope_cs(x, x->mem_pos[i], 1), far, tmp, out);
}

/* The state a boundary b scores against, into sc->ws (double: c [M], S
 * [M][Hd], z [M], at the state's time b − B − 1): the linear state with
 * the memory's nm rows added as linear terms, each with the decay of its
 * age. So a key is ranked by how badly a state that holds everything older
 * than it would give it back, not against an empty state while the first
 * rows fill the memory. Reads the memory in its storage form as of the
 * boundary before (mem_far). */
static void score_state(lin_ctx_t *x, int64_t b, int64_t nm)
{
    lin_scratch_t *sc = &x->sc;
    const int64_t hd = x->hd, m = x->m, B = CORE_ATTN_MEMORY_BLOCK;
    double *wc = sc->ws, *wS = sc->ws + m, *wz = sc->ws + m + m * hd;
    for (int64_t i = 0; i < m; i++) {
        const int on = x->c[i] > -INFINITY;
        wc[i] = x->c[i];
        wz[i] = on ? (x->fp64 ? x->zd[i] : (double)x->zf[i]) : 0.0;
        for (int64_t c = 0; c < hd; c++)
            wS[i * hd + c] = on ? (x->fp64 ? x->sd[i * hd + c] : (double)x->sf[i * hd + c]) : 0.0;
    }
    const int64_t nf = mem_far(x, b - B);
    for (int64_t j0 = 0; j0 < nm; j0 += B) {
        const int64_t n = nm - j0 < B ? nm - j0 : B;
        for (int64_t r = 0; r < n; r++) {
            const int64_t i = j0 + r;
            mem_key_features_in(x, i, i < nf, sc->ak + r * hd);
        }
        core_features_prepare(x->f, n, sc->ak, hd, sc->ky);
        core_features_logits(x->f, n, sc->ky, sc->kd, sc->khn);
        /* the rows' logits at the state's time, the new scales, the old
         * sums moved to them, then the rows added (one product) */
        for (int64_t r = 0; r < n; r++) {
            core_kvrow_unpack(x->rf, x->mem_v + (j0 + r) * x->rb, sc->av + r * hd, 1, hd);
            const double dj = (double)(b - B - 1 - x->w - x->mem_pos[j0 + r]) * x->lg;
            float *a = sc->kd + r * m;
            for (int64_t i = 0; i < m; i++) {
                a[i] = (float)((double)a[i] - sc->khn[r] + dj);
                if (a[i] > sc->cn[i] || r == 0)
                    sc->cn[i] = r == 0 ? (a[i] > wc[i] ? a[i] : wc[i]) : a[i];
            }
        }
        for (int64_t i = 0; i < m; i++) {
            const double f = wc[i] > -INFINITY ? exp(wc[i] - sc->cn[i]) : 0.0;
            if (f != 1.0) {
                wz[i] *= f;
                for (int64_t c = 0; c < hd; c++)
                    wS[i * hd + c] *= f;
            }
            wc[i] = sc->cn[i];
        }
        for (int64_t r = 0; r < n; r++) {
            float *kp = sc->kp + r * m;
            const float *a = sc->kd + r * m;
            for (int64_t i = 0; i < m; i++)
                kp[i] = (float)((double)a[i] - wc[i]);
            core_exp_shifted(kp, m, 0.0, kp);
        }
        core_gemm_tn(m, hd, n, 1.0f, sc->kp, m, sc->av, hd, 0.0f, sc->wf, hd);
        for (int64_t i = 0; i < m; i++) {
            double s = 0.0;
            for (int64_t r = 0; r < n; r++)
                s += sc->kp[r * m + i];
            wz[i] += s;
            for (int64_t c = 0; c < hd; c++)
                wS[i * hd + c] += sc->wf[i * hd + c];
        }
    }
}

/* The self-recall errors of n keys with feature logits g [n][M] (their
 * norm terms cancel in the ratio) and values v [n][Hd] against the scoring
 * state (score_state), into err[n]: ‖v‖² for a key the state gives nothing
 * back for. Products in float through the small GEMMs (the same operations
 * on the same numbers whatever the chunking: a boundary's inputs are). */
static void recall_errors(const lin_ctx_t *x, int64_t n, const float *g, const float *v,
                          double *err)
{
    const int64_t m = x->m, hd = x->hd;
    const double *wc = x->sc.ws, *wS = x->sc.ws + m, *wz = x->sc.ws + m + m * hd;
    float *sf = x->sc.wf, *zf = x->sc.wf + m * hd; /* [M][Hd], [M] */
    float *w = x->sc.we, *num = x->sc.we + n * m, *den = num + n * hd;
    for (int64_t i = 0; i < m; i++) {
        zf[i] = (float)wz[i];
        for (int64_t c = 0; c < hd; c++)
            sf[i * hd + c] = (float)wS[i * hd + c];
    }
    for (int64_t j = 0; j < n; j++) {
        const float *gj = g + j * m;
        float *wj = w + j * m;
        double mx = -INFINITY;
        for (int64_t i = 0; i < m; i++)
            if (wc[i] > -INFINITY && (double)gj[i] + wc[i] > mx)
                mx = (double)gj[i] + wc[i];
        for (int64_t i = 0; i < m; i++)
            wj[i] = wc[i] > -INFINITY && mx > -INFINITY ? (float)((double)gj[i] + wc[i] - mx)
                                                          : -INFINITY;
        core_exp_shifted(wj, m, 0.0, wj);
    }
    core_gemm_nn(n, hd, m, 1.0f, w, m, sf, hd, 0.0f, num, hd);
    core_gemm_nn(n, 1, m, 1.0f, w, m, zf, 1, 0.0f, den, 1);
    for (int64_t j = 0; j < n; j++) {
        double e = 0.0;
        for (int64_t c = 0; c < hd; c++) {
            const double d = (den[j] > 0.0f ? (double)num[j * hd + c] / (double)den[j] : 0.0) -
                             (double)v[j * hd + c];
            e += d * d;
        }
        err[j] = e;
    }
}

static int dbl_cmp(const void *pa, const void *pb)
{
    const double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* A block's errors err[n] (n ≤ B) divided by their median, so that a row's
 * score says how far it stands out of its own block, not how full the state
 * was when it was scored: raw errors fall as the state fills, and rows
 * scored against the first, nearly empty states would hold the memory for
 * good. A median of 0 leaves the errors as they are. */
static void relative_errors(double *err, int64_t n)
{
    double tmp[CORE_ATTN_MEMORY_BLOCK];
    memcpy(tmp, err, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, dbl_cmp);
    const double med = 0.5 * (tmp[(n - 1) / 2] + tmp[n / 2]);
    for (int64_t j = 0; j < n && med > 0.0; j++)
        err[j] /= med;
}

/* The boundary at b of KV head x->h: the contest, the memory rewritten in
 * position order, the losers absorbed into the linear state at time b − 1
 * (which also moves the state's time on by B). */
static void block_boundary(lin_ctx_t *x, int64_t b)
{
    lin_scratch_t *sc = &x->sc;
    const core_features_t *f = x->f;
    const int64_t hd = x->hd, m = x->m, B = CORE_ATTN_MEMORY_BLOCK, lam = x->keep;
    int64_t u0 = b - x->w - B;
    const int64_t u1 = b - x->w;
    if (u0 < x->sinks)
        u0 = x->sinks;
    const int64_t nu = u1 > u0 ? u1 - u0 : 0, nm = *x->mem_n;
    /* self-recall errors only where they choose: a head with rows to keep
     * and the recall rule (the recent rule ranks by position; a head
     * without a memory absorbs every leaving key) */
    const int scored = nu > 0 && lam > 0 && !x->recent;
    if (scored)
        score_state(x, b, nm);
    /* the leaving keys: after RoPE (kx) and before (ku), values (vi), and
     * their feature logits (kd) for the scores */
    if (nu > 0) {
        kv_rows(x, 0, u0, nu, sc->kx);
        kv_rows(x, 1, u0, nu, sc->vi);
        unrope(x, 1, nu, 1, u0, sc->kx, sc->ku);
    }
    if (scored) {
        core_features_prepare(f, nu, x->pre ? sc->ku : sc->kx, hd, sc->ky);
        core_features_logits(f, nu, sc->ky, sc->kd, sc->khn);
    }
    double *ent = sc->ent;
    for (int64_t i = 0; i < nm; i++) {
        ent[3 * i] = x->recent ? (double)x->mem_pos[i] : (double)x->mem_score[i];
        ent[3 * i + 1] = (double)x->mem_pos[i];
        ent[3 * i + 2] = (double)i;
    }
    if (scored) {
        recall_errors(x, nu, sc->kd, sc->vi, sc->khn);
        relative_errors(sc->khn, nu);
    }
    for (int64_t j = 0; j < nu; j++) {
        /* stored as a float, compared as the float it is stored as (the
         * recent rule stores 0 and ranks by position) */
        const float s = scored ? (float)sc->khn[j] : 0.0f;
        sc->khn[j] = (double)s;
        ent[3 * (nm + j)] = x->recent ? (double)(u0 + j) : (double)s;
        ent[3 * (nm + j) + 1] = (double)(u0 + j);
        ent[3 * (nm + j) + 2] = (double)(nm + j);
    }
    const int64_t n = nm + nu, keep = n < lam ? n : lam;
    qsort(ent, (size_t)n, 3 * sizeof(double), ent_cmp);
    unsigned char kept[CORE_ATTN_MAX_MEMORY + CORE_ATTN_MEMORY_BLOCK];
    memset(kept, 0, sizeof kept);
    for (int64_t i = 0; i < keep; i++)
        kept[(int64_t)ent[3 * i + 2]] = 1;
    /* the losers in position order (memory rows are older than the
     * leaving keys): keys as the features take them, values, positions;
     * at most nu of them (the memory had at most λ) */
    int64_t apos[CORE_ATTN_MEMORY_BLOCK], na = 0;
    const int64_t nf = mem_far(x, b - B); /* rows held before RoPE until now */
    for (int64_t i = 0; i < nm; i++) {
        if (kept[i])
            continue;
        mem_key_features_in(x, i, i < nf, sc->ak + na * hd);
        core_kvrow_unpack(x->rf, x->mem_v + i * x->rb, sc->av + na * hd, 1, hd);
        apos[na++] = x->mem_pos[i];
    }
    for (int64_t j = 0; j < nu; j++) {
        if (kept[nm + j])
            continue;
        memcpy(sc->ak + na * hd, (x->pre ? sc->ku : sc->kx) + j * hd, (size_t)hd * sizeof(float));
        memcpy(sc->av + na * hd, sc->vi + j * hd, (size_t)hd * sizeof(float));
        apos[na++] = u0 + j;
    }
    /* the memory: its kept rows moved down in order, then the new ones
     * (near: keys after RoPE, as the ring holds them) */
    int64_t k = 0;
    for (int64_t i = 0; i < nm; i++) {
        if (!kept[i])
            continue;
        if (k != i) {
            memcpy(x->mem_k + k * x->rb, x->mem_k + i * x->rb, (size_t)x->rb);
            memcpy(x->mem_v + k * x->rb, x->mem_v + i * x->rb, (size_t)x->rb);
            x->mem_pos[k] = x->mem_pos[i];
            x->mem_score[k] = x->mem_score[i];
        }
        k++;
    }
    for (int64_t j = 0; j < nu; j++) {
        if (!kept[nm + j])
            continue;
        core_kvrow_pack(x->rf, sc->kx + j * hd, x->mem_k + k * x->rb, 1, hd);
        core_kvrow_pack(x->rf, sc->vi + j * hd, x->mem_v + k * x->rb, 1, hd);
        x->mem_pos[k] = u0 + j;
        x->mem_score[k] = (float)sc->khn[j];
        k++;
    }
    *x->mem_n = (int32_t)k;
    /* rows that became far at this boundary: keys turned back before RoPE,
     * once in their life */
    for (int64_t i = 0; i < k && b - x->mem_pos[i] >= x->cap; i++) {
        if (b - B - x->mem_pos[i] >= x->cap)
            continue;
        float ka[CORE_FEATURES_MAX_HEAD_DIM], kb[CORE_FEATURES_MAX_HEAD_DIM];
        core_kvrow_unpack(x->rf, x->mem_k + i * x->rb, ka, 1, hd);
        rotate(x, rope_cs(x, x->mem_pos[i], 1), 0, ka, kb);
        core_kvrow_pack(x->rf, kb, x->mem_k + i * x->rb, 1, hd);
    }
    /* the losers join the linear state at time b − 1: key u weighs
     * γ^(b − 1 − W − u) there, so γ^(t − W − u) at a row t; the state's
     * rows move on by B steps of decay */
    double *cn = sc->cn, *al = sc->al;
    const double bdec = (double)B * x->lg;
    if (na > 0) {
        core_features_prepare(f, na, sc->ak, hd, sc->ky);
        core_features_logits(f, na, sc->ky, sc->kd, sc->khn);
    }
    for (int64_t i = 0; i < m; i++)
        cn[i] = x->c[i] + bdec; /* −inf stays −inf */
    for (int64_t j = 0; j < na; j++) {
        float *a = sc->kd + j * m;
        const double dj = (double)(b - 1 - x->w - apos[j]) * x->lg;
        for (int64_t i = 0; i < m; i++) {
            a[i] = (float)((double)a[i] - sc->khn[j] + dj);
            if (a[i] > cn[i])
                cn[i] = a[i];
        }
    }
    const int state_on = x->c[0] > -INFINITY;
    for (int64_t i = 0; i < m; i++) {
        const double e = x->c[i] + bdec - cn[i];
        al[i] = x->c[i] > -INFINITY ? (e == 0.0 ? 1.0 : exp(e)) : 0.0;
    }
    for (int64_t j = 0; j < na; j++) {
        float *kp = sc->kp + j * m;
        const float *kd = sc->kd + j * m;
        for (int64_t i = 0; i < m; i++)
            kp[i] = !(cn[i] > -INFINITY) ? -INFINITY : (float)((double)kd[i] - cn[i]);
        core_exp_shifted(kp, m, 0.0, kp);
    }
    if (na > 0)
        memcpy(sc->vi, sc->av, (size_t)(na * hd) * sizeof(float));
    const lin_chunk_t ck = {.ni = na, .state_on = state_on};
    chunk_absorb(x, &ck);
}

static void chunk_forward(lin_ctx_t *x, int64_t t0, int64_t t1)
{
    lin_chunk_t ck = {.t0 = t0, .t1 = t1, .nr = (t1 - t0) * x->gs,
                      .cdec = (double)(t1 - t0) * x->lg};
    /* with the memory, chunks start at most at a boundary (head_forward) */
    if (x->lam && x->p0 + t0 > 0 && (x->p0 + t0) % CORE_ATTN_MEMORY_BLOCK == 0)
        block_boundary(x, x->p0 + t0);
    chunk_keys(x, &ck);
    chunk_queries(x, &ck);
    chunk_linear(x, &ck);
    if (x->w == 0 && x->sinks == 0)
        chunk_out_linear(x, &ck);
    else
        chunk_out_exact(x, &ck, 0);
    if (!x->lam)
        chunk_absorb(x, &ck);
}

/* The parts of x common to every KV head of item it at layer, with the
 * scratch of slot. */
static void ctx_init(core_attn_t *a, const core_attn_item_t *it, int layer, int slot, lin_ctx_t *x)
{
    const core_attn_cfg_t *cfg = &a->cfg;
    lin_params_t *lp = a->impl;
    lin_state_t *st = it->state->impl;
    int64_t hkv = cfg->n_head_kv, hd = cfg->head_dim, w = cfg->window;
    *x = (lin_ctx_t){0};
    scratch_layout(cfg, (size_t)lp->cn, lp->fs[slot], lp->ds[slot], &x->sc);
    x->p0 = it->state->pos;
    x->hd = hd;
    x->m = cfg->n_features;
    x->gs = cfg->n_head / cfg->n_head_kv;
    x->nq = (int64_t)cfg->n_head * hd;
    x->nkv = hkv * hd;
    x->w = w;
    x->q = it->q;
    x->k = it->k;
    x->v = it->v;
    x->out = it->out;
    x->ring_n = (int64_t)ring_rows(cfg);
    x->lam = cfg->memory;
    x->recent = cfg->memory_keep == CORE_ATTN_KEEP_RECENT;
    x->rf = row_fmt(cfg);
    x->rb = (int64_t)row_bytes(cfg);
    x->ring_k = st->ring_k + (int64_t)layer * x->ring_n * hkv * x->rb;
    x->ring_v = st->ring_v + (int64_t)layer * x->ring_n * hkv * x->rb;
    x->mem_cs = lp->mem_cs;
    x->cap = lp->mem_cap;
    x->sinks = cfg->sinks;
    x->sink_k = st->sink_k + (int64_t)layer * cfg->sinks * hkv * x->rb;
    x->sink_v = st->sink_v + (int64_t)layer * cfg->sinks * hkv * x->rb;
    x->mix = lp->mix + (size_t)layer * (size_t)cfg->n_head;
    x->rope_if = cfg->prerope || cfg->sinks || cfg->memory ? lp->rope_if : NULL;
    x->sink_cs = lp->sink_cs;
    x->sink_w = w;
    x->pre = cfg->prerope;
    x->n_rot = cfg->n_rot;
    x->lin_off = cfg->linear_off;
    x->trig = lp->trig;
    x->dst = &lp->den[slot];
    x->fp64 = st->fp64;
}

/* x's fields for KV head h of item it at layer. */
static void head_set(core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it, int layer,
                     int64_t h)
{
    lin_params_t *lp = a->impl;
    lin_state_t *st = it->state->impl;
    int64_t m = x->m, hd = x->hd;
    size_t idx = (size_t)layer * (size_t)a->cfg.n_head_kv + (size_t)h;
    if (x->lam) { /* head h's memory */
        const size_t o = mem_first(&a->cfg, idx);
        x->keep = (int64_t)mem_cap_rows(&a->cfg, idx);
        x->mem_pos = st->mem_pos + o;
        x->mem_score = st->mem_score + o;
        x->mem_n = st->mem_n + idx;
        x->mem_k = st->mem_k + o * (size_t)x->rb;
        x->mem_v = st->mem_v + o * (size_t)x->rb;
    }
    if (x->lam && x->recent && x->keep > 0) { /* the sinks next to the longer span */
        x->sink_cs = lp->sink_cs_span;
        x->sink_w = x->w + x->keep;
    } else {
        x->sink_cs = lp->sink_cs;
        x->sink_w = x->w;
    }
    x->h = h;
    x->f = &lp->maps[idx];
    x->lg = lp->gam[idx] < 1.0f ? log((double)lp->gam[idx]) : 0.0;
    x->c = st->c + idx * (size_t)m;
    if (st->fp64) {
        x->sd = (double *)st->S + idx * (size_t)(m * hd);
        x->zd = (double *)st->z + idx * (size_t)m;
    } else {
        x->sf = (float *)st->S + idx * (size_t)(m * hd);
        x->zf = (float *)st->z + idx * (size_t)m;
    }
}

/* Every chunk of KV head h: reads the state's sinks and ring, writes only
 * this head's linear state and output columns, so the heads of an item (and
 * of different items) may run at once. */
static void head_forward(core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it, int layer,
                         int64_t h)
{
    lin_params_t *lp = a->impl;
    head_set(a, x, it, layer, h);
    for (int64_t t0 = 0, t1; t0 < it->n; t0 = t1) {
        t1 = t0 + lp->cn < it->n ? t0 + lp->cn : it->n;
        if (x->lam) { /* no chunk crosses a block boundary */
            const int64_t nb = block_start(x->p0 + t0) + CORE_ATTN_MEMORY_BLOCK - x->p0;
            t1 = t1 < nb ? t1 : nb;
        }
        chunk_forward(x, t0, t1);
    }
}

/* A decode step (one token) of a kind with exact keys is two halves per KV
 * head: the linear part and its state update (head_linear) and the sinks
 * and window (head_exact), each stabilized on its own; linear_forward_done
 * merges the two for every query row. With few items in a batch each half
 * is a unit of its own (three KV heads on two threads left one thread idle
 * a third of the attention); else one unit runs both, on the same numbers,
 * so an item's results do not depend on the split. */
/* The configuration keeps exact keys (a window or sinks) beside the linear
 * state. */
static int exact_keys(const core_attn_cfg_t *cfg)
{
    return cfg->window > 0 || cfg->sinks > 0;
}

static int split_decode(const core_attn_cfg_t *cfg, const core_attn_item_t *it)
{
    /* with the memory, a step at a block boundary first changes the state
     * and the memory both halves read: it runs as one unit */
    const int64_t pos = it->state->pos;
    return it->n == 1 && exact_keys(cfg) &&
           !(cfg->memory && pos > 0 && pos % CORE_ATTN_MEMORY_BLOCK == 0);
}

static double *mg_row(const core_attn_t *a, const core_attn_item_t *it, int64_t h, int64_t g)
{
    const lin_state_t *st = it->state->impl;
    const int64_t gs = a->cfg.n_head / a->cfg.n_head_kv;
    return st->mg + (h * gs + g) * LIN_MG_ROW(a->cfg.head_dim);
}

static void head_linear(core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it, int layer,
                        int64_t h)
{
    lin_scratch_t *sc = &x->sc;
    head_set(a, x, it, layer, h);
    lin_chunk_t ck = {.t0 = 0, .t1 = 1, .nr = x->gs, .cdec = x->lg};
    chunk_keys(x, &ck);
    chunk_queries(x, &ck);
    chunk_linear(x, &ck);
    for (int64_t g = 0; g < x->gs; g++) {
        double *row = mg_row(a, it, h, g);
        row[0] = sc->lrow[g];
        row[1] = sc->den[g];
        for (int64_t c = 0; c < x->hd; c++)
            row[LIN_MG_HEAD + c] = sc->num[g * x->hd + c];
    }
    if (!x->lam)
        chunk_absorb(x, &ck);
}

static void head_exact(core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it, int layer,
                       int64_t h)
{
    lin_scratch_t *sc = &x->sc;
    int64_t hd = x->hd, gs = x->gs;
    head_set(a, x, it, layer, h);
    load_queries(x, 0, 1);
    lin_chunk_t ck = {.t0 = 0, .t1 = 1, .nr = gs};
    chunk_out_exact(x, &ck, 1);
    for (int64_t g = 0; g < gs; g++) {
        double *row = mg_row(a, it, h, g);
        row[2] = sc->sx[g];
        row[3] = sc->esum[g];
        for (int64_t c = 0; c < hd; c++)
            row[LIN_MG_HEAD + hd + c] = sc->ev[g * hd + c];
    }
}

/* The output rows of a split decode step, as chunk_out_exact forms them
 * from the two halves: under the stabilizer s* = max(Lrow, s_exact), or the
 * exact scores' alone for Flexformer (then the exact half is taken as it
 * is). */
static void merge_decode(const core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it,
                         int64_t h)
{
    int64_t hd = x->hd, gs = x->gs;
    for (int64_t g = 0; g < gs; g++) {
        const double *row = mg_row(a, it, h, g);
        const double lrow = row[0], den = row[1], se = row[2], esum = row[3];
        double wl = 1.0, we = 1.0; /* the larger side's factor is e^0 */
        if (x->trig)
            wl = trig_weight(x, lrow - se, den, esum);
        else if (lrow > se)
            we = exp(se - lrow);
        else
            wl = lrow > -INFINITY ? exp(lrow - se) : 0.0;
        const double inv = 1.0 / (wl * den + we * esum);
        float *o = x->out + (h * gs + g) * hd;
        for (int64_t c = 0; c < hd; c++)
            o[c] = (float)((wl * row[LIN_MG_HEAD + c] + we * row[LIN_MG_HEAD + hd + c]) * inv);
    }
}

/* After both halves of KV head h: a split decode step's rows merged, and
 * the new keys and values join the head's sinks and ring (regions of its
 * own: no other head reads them). */
static void head_done(const core_attn_t *a, lin_ctx_t *x, const core_attn_item_t *it, int layer,
                      int64_t h)
{
    const core_attn_cfg_t *cfg = &a->cfg;
    if (split_decode(cfg, it)) {
        const lin_params_t *lp = a->impl; /* trig_weight reads the head's map */
        x->f = &lp->maps[(size_t)layer * (size_t)cfg->n_head_kv + (size_t)h];
        merge_decode(a, x, it, h);
    }
    lin_state_t *st = it->state->impl;
    int64_t hkv = cfg->n_head_kv, hd = cfg->head_dim, w = (int64_t)ring_rows(cfg), n = it->n;
    int64_t pos = it->state->pos;
    /* The sinks are the first S positions, kept for good; both rounded to
     * the rows' format, as kv_rows rounded them for this forward's reads. */
    const core_kvrow_fmt_t rf = row_fmt(cfg);
    const size_t rb = row_bytes(cfg);
    for (int64_t t = 0; t < n && pos + t < cfg->sinks; t++) {
        size_t at = (size_t)(((int64_t)layer * hkv + h) * cfg->sinks + pos + t) * rb;
        core_kvrow_pack(rf, it->k + (t * hkv + h) * hd, st->sink_k + at, 1, hd);
        core_kvrow_pack(rf, it->v + (t * hkv + h) * hd, st->sink_v + at, 1, hd);
    }
    /* Only now may the ring forget positions p0 − W.. (p0 − W − B.. with the
     * memory): every chunk read them. */
    for (int64_t t = n - w > 0 ? n - w : 0; w > 0 && t < n; t++) {
        size_t at = (size_t)(((int64_t)layer * hkv + h) * w + (pos + t) % w) * rb;
        core_kvrow_pack(rf, it->k + (t * hkv + h) * hd, st->ring_k + at, 1, hd);
        core_kvrow_pack(rf, it->v + (t * hkv + h) * hd, st->ring_v + at, 1, hd);
    }
}

/* A head's work is all in unit h unless a split decode step's halves ran
 * as units of their own (2·Hkv): the linear half reads the ring slot the
 * new key takes, so the exact half's unit could not write it. */
static int done_in_unit(const core_attn_t *a, const core_attn_item_t *it, int n_units)
{
    return n_units == a->cfg.n_head_kv || !split_decode(&a->cfg, it);
}

/* What the units left: every head's head_done when the halves ran apart
 * (on one thread: slot 0's counters). */
static void linear_forward_done(core_attn_t *a, const core_attn_item_t *it, int layer, int n_units)
{
    if (done_in_unit(a, it, n_units))
        return;
    lin_ctx_t x;
    ctx_init(a, it, layer, 0, &x);
    for (int64_t h = 0; h < a->cfg.n_head_kv; h++)
        head_done(a, &x, it, layer, h);
}

/* Unit u < Hkv: head u (both halves of a decode step; with 2·Hkv units,
 * its linear half only); u ≥ Hkv (2·Hkv units): the exact half of head
 * u − Hkv of a decode step, nothing for other items. */
static void linear_forward_unit(core_attn_t *a, const core_attn_item_t *it, int layer, int unit,
                                int n_units, int slot)
{
    const int64_t hkv = a->cfg.n_head_kv;
    const int split = split_decode(&a->cfg, it);
    if (unit >= hkv && !split)
        return;
    lin_ctx_t x;
    ctx_init(a, it, layer, slot, &x);
    if (unit >= hkv) {
        head_exact(a, &x, it, layer, unit - hkv);
    } else if (split) {
        head_linear(a, &x, it, layer, unit);
        if (n_units == hkv)
            head_exact(a, &x, it, layer, unit);
    } else {
        head_forward(a, &x, it, layer, unit);
    }
    if (unit < hkv && done_in_unit(a, it, n_units))
        head_done(a, &x, it, layer, unit);
}

/* The halves apart while the heads alone give a thread fewer than two
 * units: one item on two threads (3 → 6 units), not a batch of 16. */
static int linear_units(const core_attn_t *a, int n_items, int n_threads)
{
    const core_attn_cfg_t *cfg = &a->cfg;
    return exact_keys(cfg) && (int64_t)n_items * cfg->n_head_kv < 2 * (int64_t)n_threads
               ? 2 * cfg->n_head_kv
               : cfg->n_head_kv;
}

static int linear_set_workers(core_attn_t *a, int n, core_error_t *err)
{
    lin_params_t *lp = a->impl;
    return n <= lp->slots ? 0 : set_scratch(a, lp, lp->chunk, n, err);
}

static int linear_forward(core_attn_t *a, core_attn_state_t *s, int layer, int64_t n,
                          const float *q, const float *k, const float *v, float *out,
                          core_error_t *err)
{
    (void)err;
    const core_attn_item_t it = {s, n, q, k, v, out};
    const int n_units = linear_units(a, 1, 1);
    for (int u = 0; u < n_units; u++)
        linear_forward_unit(a, &it, layer, u, n_units, 0);
    linear_forward_done(a, &it, layer, n_units);
    return 0;
}

/* ---- serialization (core/state.c frames the payload) ----
 *
 * Payload, little-endian:
 *   u32 accumulator bytes (4: float S and z, 8: double), plus the rows'
 *       format: LIN_HALF_ROWS when the window, sink and memory rows are
 *       halves, LIN_Q8_ROWS when they are 8-bit rows (core/kernels/kvrow.h:
 *       f32 scale, then Hd signed bytes), neither in the oldest payloads,
 *       whose rows are f32. A payload's rows are in the format of the state
 *       that wrote it; a state of another format reads older formats by
 *       rounding each row as it would have been rounded on entry (f32 or
 *       halves into 8 bits), and refuses 8-bit rows when it keeps halves.
 *   u32 window rows saved per layer, nv = min(pos, W)
 *   c [L][Hkv][M] f64, S [L][Hkv][M][Hd], z [L][Hkv][M] (f32 or f64)
 *   per layer: ring K slots 0..nv-1 [nv][Hkv][Hd], then ring V the same
 *   per layer: sink K rows 0..ns-1 [ns][Hkv][Hd], then sink V the same,
 *   ns = min(pos, S) (nothing without sinks: the v1 payload)
 * With LIN_MEMORY in the first word (the exact memory, λ > 0), the ring has
 * W + B rows (nv = min(pos, W + B)), a u32 λ follows the second word, and
 * after the sinks, per layer and KV head: u32 n (rows held, ≤ λ), n × (i64
 * position, f32 score), the n keys (rows; after RoPE while near, before
 * once far: mem_far), then the n values; positions increasing, each older than the exact span.
 * Slot = position % ring rows, so slots 0..nv-1 are exactly the valid ones
 * whether or not the ring has wrapped. The size depends on the config, the precision
 * and min(pos, W), never on how many tokens came before. A state is loaded in
 * the precision it was saved in (a state's precision is its own, see
 * core_attn_linear_set_opts), so continuing it is bit-identical. */
#define LIN_HALF_ROWS 0x100u
#define LIN_MEMORY 0x200u
#define LIN_Q8_ROWS 0x400u

/* A payload's row format: a state's (core_kvrow_fmt_t) or the oldest f32. */
enum { PAY_F16 = CORE_KVROW_F16, PAY_Q8 = CORE_KVROW_Q8, PAY_F32 = 2 };

static size_t pay_row_bytes(int pf, size_t hd)
{
    return pf == PAY_F32 ? 4 * hd : core_kvrow_bytes((core_kvrow_fmt_t)pf, (int64_t)hd);
}

/* The rows of the window ring or the sinks in the payload: per layer, the
 * nv valid rows (slots or positions 0..nv-1) of K, then of V, each row
 * [Hkv][Hd]; in the state a layer is [Hkv][cap][Hd] (cap = W or S). Written
 * to (put) or read from (get) p, which is returned advanced. */
typedef struct kv_shape {
    int n_layer;
    size_t hkv, cap, hd, nv;
} kv_shape_t;

static unsigned char *kv_rows_put(unsigned char *p, const unsigned char *k,
                                  const unsigned char *v, core_kvrow_fmt_t rf,
                                  const kv_shape_t *sh)
{
    const size_t rb = core_kvrow_bytes(rf, (int64_t)sh->hd);
    for (int l = 0; l < sh->n_layer; l++)
        for (int which = 0; which < 2; which++) {
            const unsigned char *src = (which ? v : k) + (size_t)l * sh->hkv * sh->cap * rb;
            for (size_t r = 0; r < sh->nv; r++)
                for (size_t h = 0; h < sh->hkv; h++, p += rb)
                    core_kvrow_to_le(rf, src + (h * sh->cap + r) * rb, p, 1, (int64_t)sh->hd);
        }
    return p;
}

/* A key or value row read from a blob is finite and within ±CORE_ATTN_MAX_KV
 * (f32 rows; the largest finite half is that bound, so a half row need only
 * be finite): the kernels rely on it, anything else would turn every later
 * output into NaN or inf without an error. */
static int row_in_range(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= CORE_ATTN_MAX_KV))
            return 0;
    return 1;
}

/* n payload rows of format pf at p into n state rows of format rf at dst
 * (rows rb apart there): copied when the formats agree, else each row
 * rounded as it would have been on entry. 1, or 0 when a row is not one a
 * state can hold (not finite or out of range, an 8-bit row no pack gives)
 * or would be an 8-bit row made a half (linear_state_load refuses that
 * first, as a mismatch). */
static int rows_from_payload(int pf, core_kvrow_fmt_t rf, const unsigned char *p,
                             unsigned char *dst, size_t n, size_t hd)
{
    const size_t pb = pay_row_bytes(pf, hd), rb = core_kvrow_bytes(rf, (int64_t)hd);
    if (pf == (int)rf) {
        core_kvrow_from_le(rf, p, dst, (int64_t)n, (int64_t)hd);
        return core_kvrow_valid(rf, dst, (int64_t)n, (int64_t)hd);
    }
    if (pf == PAY_Q8)
        return 0;
    float row[CORE_FEATURES_MAX_HEAD_DIM];
    uint16_t hrow[CORE_FEATURES_MAX_HEAD_DIM];
    for (size_t r = 0; r < n; r++, p += pb, dst += rb) {
        if (pf == PAY_F32) {
            core_le_copy32(row, p, hd);
            if (!row_in_range(row, hd))
                return 0;
        } else {
            core_le_copy16(hrow, p, hd);
            if (!core_kvrow_valid(CORE_KVROW_F16, hrow, 1, (int64_t)hd))
                return 0;
            core_half_unpack(hrow, row, (int64_t)hd);
        }
        core_kvrow_pack(rf, row, dst, 1, (int64_t)hd);
    }
    return 1;
}

/* kv_rows_put's inverse for payload rows of format pf into rows of format
 * rf. NULL, with the layer in *bad, at the first row refused
 * (rows_from_payload). */
static const unsigned char *kv_rows_get(const unsigned char *p, int pf, core_kvrow_fmt_t rf,
                                        unsigned char *k, unsigned char *v, const kv_shape_t *sh,
                                        int *bad)
{
    const size_t rb = core_kvrow_bytes(rf, (int64_t)sh->hd), pb = pay_row_bytes(pf, sh->hd);
    for (int l = 0; l < sh->n_layer; l++)
        for (int which = 0; which < 2; which++) {
            unsigned char *dst = (which ? v : k) + (size_t)l * sh->hkv * sh->cap * rb;
            for (size_t r = 0; r < sh->nv; r++)
                for (size_t h = 0; h < sh->hkv; h++, p += pb)
                    if (!rows_from_payload(pf, rf, p, dst + (h * sh->cap + r) * rb, 1,
                                           sh->hd)) {
                        *bad = l;
                        return NULL;
                    }
        }
    return p;
}

typedef struct lin_ser {
    size_t n_z, n_s;         /* elements: c and z, S */
    size_t n_ring, n_sink;   /* rows of one layer's valid ring (and sink) K rows */
    size_t es;               /* accumulator bytes */
    int pf;                  /* the rows' format (PAY_*) */
    size_t rb;               /* bytes of a payload row (pay_row_bytes) */
    size_t bytes;            /* the whole payload */
} lin_ser_t;

/* Sizes of a payload; 0 if they overflow (never for a state that exists). */
static int lin_ser_sizes(const core_attn_cfg_t *cfg, int fp64, int pf, int64_t pos,
                         lin_ser_t *z)
{
    size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, hd = (size_t)cfg->head_dim;
    size_t nv = pos < (int64_t)ring_rows(cfg) ? (size_t)pos : ring_rows(cfg);
    size_t nsk = pos < (int64_t)cfg->sinks ? (size_t)pos : (size_t)cfg->sinks;
    size_t b_c, b_s, b_z, b_r, n_rl;
    z->n_sink = nsk * (size_t)cfg->n_head_kv; /* ≤ 1024 · (small shape): no overflow */
    z->es = fp64 ? sizeof(double) : sizeof(float);
    z->pf = pf;
    z->rb = pay_row_bytes(pf, hd);
    if (pos < 0 || !mul_ok(nh, (size_t)cfg->n_features, &z->n_z) ||
        !mul_ok(z->n_z, hd, &z->n_s) || !mul_ok(nv, (size_t)cfg->n_head_kv, &z->n_ring) ||
        !mul_ok(z->n_z, sizeof(double), &b_c) || !mul_ok(z->n_s, z->es, &b_s) ||
        !mul_ok(z->n_z, z->es, &b_z) || !mul_ok(z->n_ring, 2 * z->rb, &n_rl) ||
        !mul_ok(n_rl, (size_t)cfg->n_layer, &b_r) || b_c > SIZE_MAX / 8 || b_s > SIZE_MAX / 8 ||
        b_z > SIZE_MAX / 8 || b_r > SIZE_MAX / 8)
        return 0;
    z->bytes = 8 + b_c + b_s + b_z + b_r + 2 * z->n_sink * z->rb * (size_t)cfg->n_layer;
    /* the memory's λ word (its rows vary: mem_bytes) */
    z->bytes += cfg->memory ? 4 : 0;
    return 1;
}

/* The bytes of the memory section of st's payload: per head a count, then
 * per row a position, a score and a key and value row. */
static size_t mem_bytes(const core_attn_cfg_t *cfg, const lin_state_t *st)
{
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
    size_t b = 0;
    for (size_t h = 0; cfg->memory && h < nh; h++)
        b += 4 + (size_t)st->mem_n[h] * (8 + 4 + 2 * row_bytes(cfg));
    return b;
}

/* The ring's and the sinks' shapes for kv_rows_*: their valid rows from z. */
static void kv_shapes(const core_attn_cfg_t *cfg, const lin_ser_t *z, kv_shape_t *ring,
                      kv_shape_t *sink)
{
    size_t hkv = (size_t)cfg->n_head_kv, hd = (size_t)cfg->head_dim;
    *ring = (kv_shape_t){cfg->n_layer, hkv, ring_rows(cfg), hd, z->n_ring / hkv};
    *sink = (kv_shape_t){cfg->n_layer, hkv, (size_t)cfg->sinks, hd, z->n_sink / hkv};
}

static size_t linear_state_save_size(const core_attn_state_t *s)
{
    const lin_state_t *st = s->impl;
    lin_ser_t z;
    return lin_ser_sizes(&s->a->cfg, st->fp64, (int)row_fmt(&s->a->cfg), s->pos, &z)
               ? z.bytes + mem_bytes(&s->a->cfg, st)
               : 0;
}

static int linear_state_save(const core_attn_state_t *s, void *buf, size_t cap, core_error_t *err)
{
    const core_attn_cfg_t *cfg = &s->a->cfg;
    const lin_state_t *st = s->impl;
    lin_ser_t z;
    const core_kvrow_fmt_t rf = row_fmt(cfg);
    if (!lin_ser_sizes(cfg, st->fp64, (int)rf, s->pos, &z))
        return core_error_set(err, CORE_ERANGE, "linear attention payload size overflows");
    const size_t mb = mem_bytes(cfg, st);
    if (cap < z.bytes + mb)
        return core_error_set(err, CORE_ERANGE, "linear attention payload needs %zu bytes, "
                              "buffer has %zu", z.bytes + mb, cap);
    unsigned char *p = buf;
    core_le_put_u32(p, (uint32_t)z.es | (rf == CORE_KVROW_Q8 ? LIN_Q8_ROWS : LIN_HALF_ROWS) |
                           (cfg->memory ? LIN_MEMORY : 0u));
    core_le_put_u32(p + 4, (uint32_t)(z.n_ring / (size_t)cfg->n_head_kv));
    p += 8;
    if (cfg->memory) {
        core_le_put_u32(p, (uint32_t)cfg->memory);
        p += 4;
    }
    core_le_copy64(p, st->c, z.n_z);
    p += z.n_z * sizeof(double);
    /* a head that holds no keys is saved as zeros (its S̃, z̃ have no value) */
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, m = z.n_z / nh,
                 ns = m * (size_t)cfg->head_dim;
    for (size_t h = 0; h < nh; h++) {
        unsigned char *ps = p + h * ns * z.es, *pz = p + (z.n_s + h * m) * z.es;
        if (!head_holds(st, cfg, h)) {
            memset(ps, 0, ns * z.es);
            memset(pz, 0, m * z.es);
        } else if (st->fp64) {
            core_le_copy64(ps, (const double *)st->S + h * ns, ns);
            core_le_copy64(pz, (const double *)st->z + h * m, m);
        } else {
            core_le_copy32(ps, (const float *)st->S + h * ns, ns);
            core_le_copy32(pz, (const float *)st->z + h * m, m);
        }
    }
    p += (z.n_s + z.n_z) * z.es;
    kv_shape_t ring, sink;
    kv_shapes(cfg, &z, &ring, &sink);
    p = kv_rows_put(p, st->ring_k, st->ring_v, rf, &ring);
    p = kv_rows_put(p, st->sink_k, st->sink_v, rf, &sink);
    const size_t lam = (size_t)cfg->memory, hd = (size_t)cfg->head_dim, rb = row_bytes(cfg);
    for (size_t h = 0; lam && h < nh; h++) {
        const size_t n = (size_t)st->mem_n[h];
        core_le_put_u32(p, (uint32_t)n);
        p += 4;
        const size_t o = mem_first(cfg, h);
        for (size_t i = 0; i < n; i++, p += 12) {
            core_le_put_u64(p, (uint64_t)st->mem_pos[o + i]);
            core_le_copy32(p + 8, st->mem_score + o + i, 1);
        }
        core_kvrow_to_le(rf, st->mem_k + o * rb, p, (int64_t)n, (int64_t)hd);
        p += n * rb;
        core_kvrow_to_le(rf, st->mem_v + o * rb, p, (int64_t)n, (int64_t)hd);
        p += n * rb;
    }
    return 0;
}

/* Reads the memory section at p (len bytes to the payload's end) into st
 * for a state at pos: NULL with err set when it is malformed (counts past
 * λ, positions not increasing or not older than the exact span, scores or
 * rows not finite) or does not end where the payload does. */
static int mem_load(const core_attn_cfg_t *cfg, lin_state_t *st, int64_t pos, int pf,
                    const unsigned char *p, size_t len, core_error_t *err)
{
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv, hd = (size_t)cfg->head_dim,
                 pb = pay_row_bytes(pf, hd), rb = row_bytes(cfg);
    const core_kvrow_fmt_t rf = row_fmt(cfg);
    /* every memory row left the exact span at an earlier boundary */
    const int64_t older = pos / CORE_ATTN_MEMORY_BLOCK * CORE_ATTN_MEMORY_BLOCK - cfg->window;
    for (size_t h = 0; h < nh; h++) {
        if (len < 4)
            return core_error_set(err, CORE_EFORMAT, "linear attention payload: memory of "
                                  "head %zu cut short", h);
        const uint32_t n = core_le_get_u32(p);
        const size_t row = 12 + 2 * pb, o = mem_first(cfg, h), cap = mem_cap_rows(cfg, h);
        p += 4;
        len -= 4;
        if (n > cap || (size_t)n * row > len)
            return core_error_set(err, CORE_EFORMAT, "linear attention payload: memory of head "
                                  "%zu holds %u rows (at most %zu, %zu bytes left)", h, n, cap,
                                  len);
        int64_t prev = (int64_t)cfg->sinks - 1;
        for (size_t i = 0; i < n; i++, p += 12) {
            const int64_t u = (int64_t)core_le_get_u64(p);
            float s;
            core_le_copy32(&s, p + 8, 1);
            if (u <= prev || u >= older || !(s >= 0.0f) || !isfinite(s))
                return core_error_set(err, CORE_EFORMAT, "linear attention payload: memory row "
                                      "%zu of head %zu at position %lld (score %g) is out of "
                                      "order or not older than the exact span", i, h,
                                      (long long)u, (double)s);
            st->mem_pos[o + i] = prev = u;
            st->mem_score[o + i] = s;
        }
        const int ok = rows_from_payload(pf, rf, p, st->mem_k + o * rb, n, hd) &&
                       rows_from_payload(pf, rf, p + (size_t)n * pb, st->mem_v + o * rb, n, hd);
        p += 2 * (size_t)n * pb;
        len -= (size_t)n * row;
        if (!ok)
            return core_error_set(err, CORE_EFORMAT, "linear attention payload: non-finite "
                                  "or malformed memory row in head %zu", h);
        st->mem_n[h] = (int32_t)n;
    }
    if (len != 0)
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: %zu bytes after "
                              "the memory", len);
    return 0;
}

static int linear_state_load(core_attn_state_t *s, int64_t pos, const void *buf, size_t len,
                             core_error_t *err)
{
    const core_attn_cfg_t *cfg = &s->a->cfg;
    lin_state_t *st = s->impl;
    const unsigned char *p = buf;
    if (len < 8)
        return core_error_set(err, CORE_EFORMAT, "linear attention payload is %zu bytes", len);
    uint32_t w0 = core_le_get_u32(p), nv = core_le_get_u32(p + 4);
    uint32_t es = w0 & ~(LIN_HALF_ROWS | LIN_MEMORY | LIN_Q8_ROWS);
    if ((w0 & LIN_HALF_ROWS) && (w0 & LIN_Q8_ROWS))
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: rows both half and "
                              "8-bit");
    const int pf = (w0 & LIN_Q8_ROWS) ? PAY_Q8 : (w0 & LIN_HALF_ROWS) ? PAY_F16 : PAY_F32;
    if (pf == PAY_Q8 && row_fmt(cfg) != CORE_KVROW_Q8)
        return core_error_set(err, CORE_EMISMATCH, "state keeps its exact rows in 8 bits, this "
                              "server keeps them in 16 (--kv-bits %d)", cfg->kv_bits ? cfg->kv_bits
                                                                                     : 16);
    if (es != 4 && es != 8)
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: accumulator size %u "
                              "(expected 4 or 8)", es);
    const uint32_t lam = (w0 & LIN_MEMORY) ? (len >= 12 ? core_le_get_u32(p + 8) : UINT32_MAX) : 0;
    if (lam != (uint32_t)cfg->memory)
        return core_error_set(err, CORE_EMISMATCH, "state has an exact memory of %d rows, this "
                              "server runs %d (--memory)", lam == UINT32_MAX ? -1 : (int)lam,
                              cfg->memory);
    int64_t want_nv = pos < (int64_t)ring_rows(cfg) ? pos : (int64_t)ring_rows(cfg);
    if (pos < 0 || (int64_t)nv != want_nv)
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: %u window rows at "
                              "position %lld (window %d)", nv, (long long)pos, cfg->window);
    lin_ser_t z;
    int fp64 = es == 8;
    if (!lin_ser_sizes(cfg, fp64, pf, pos, &z))
        return core_error_set(err, CORE_EFORMAT, "linear attention payload size overflows");
    if (lam ? len < z.bytes : len != z.bytes)
        return core_error_set(err, CORE_EFORMAT, "linear attention payload is %zu bytes, "
                              "expected %s%zu", len, lam ? "at least " : "", z.bytes);
    if (fp64 != st->fp64) {
        int rc = lin_state_relayout(st, cfg, fp64, err);
        if (rc < 0)
            return rc;
    }
    p += lam ? 12 : 8;
    core_le_copy64(st->c, p, z.n_z);
    p += z.n_z * sizeof(double);
    if (fp64) {
        core_le_copy64(st->S, p, z.n_s);
        core_le_copy64(st->z, p + z.n_s * 8, z.n_z);
    } else {
        core_le_copy32(st->S, p, z.n_s);
        core_le_copy32(st->z, p + z.n_s * 4, z.n_z);
    }
    p += (z.n_s + z.n_z) * z.es;
    kv_shape_t ring, sink;
    kv_shapes(cfg, &z, &ring, &sink);
    int l;
    const core_kvrow_fmt_t rf = row_fmt(cfg);
    if (!(p = kv_rows_get(p, pf, rf, st->ring_k, st->ring_v, &ring, &l)))
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: non-finite "
                              "or out-of-range window row in layer %d", l);
    if (!(p = kv_rows_get(p, pf, rf, st->sink_k, st->sink_v, &sink, &l)))
        return core_error_set(err, CORE_EFORMAT, "linear attention payload: non-finite "
                              "or out-of-range sink row in layer %d", l);
    if (lam) {
        int rc = mem_load(cfg, st, pos, pf, p, len - (size_t)(p - (const unsigned char *)buf),
                          err);
        if (rc < 0)
            return rc;
    }
    /* A blob is input. The kernels rely on c being finite or −inf, on S
     * and z being finite (z ≥ 0; Flexformer's is signed) and on the window
     * and sink rows being finite (checked above): anything else would turn
     * every later output into NaN or inf without an error. */
    size_t hd = (size_t)cfg->head_dim;
    const int trig = core_attn_kind_is_trig(cfg->kind); /* its z̃ is signed */
    for (size_t i = 0; i < z.n_z; i++) {
        double zi = fp64 ? ((const double *)st->z)[i] : (double)((const float *)st->z)[i];
        if (isnan(st->c[i]) || st->c[i] == INFINITY || !isfinite(zi) || (zi < 0.0 && !trig))
            return core_error_set(err, CORE_EFORMAT, "linear attention payload: bad scale or "
                                  "normalizer at entry %zu (c = %g, z = %g)", i, st->c[i], zi);
        for (size_t j = i * hd; j < (i + 1) * hd; j++) {
            double v = fp64 ? ((const double *)st->S)[j] : (double)((const float *)st->S)[j];
            if (!isfinite(v))
                return core_error_set(err, CORE_EFORMAT, "linear attention payload: non-finite "
                                      "S at entry %zu", i);
        }
    }
    /* a head holds keys on every feature or on none (head_holds) */
    const size_t m = (size_t)cfg->n_features;
    for (size_t i = 0; i < z.n_z; i++)
        if ((st->c[i] > -INFINITY) != (st->c[i - i % m] > -INFINITY))
            return core_error_set(err, CORE_EFORMAT, "linear attention payload: head %zu has "
                                  "scales both -inf and finite (entry %zu)", i / m, i);
    return 0;
}

const core_attn_vtbl_t core_attn_linear_vtbl = {
    .init = linear_init,
    .fini = linear_fini,
    .state_init = linear_state_init,
    .state_fini = linear_state_fini,
    .state_reset = linear_state_reset,
    .state_copy = linear_state_copy,
    .state_bytes = linear_state_bytes,
    .state_bytes_held = linear_state_bytes_held,
    .bytes_held_at = linear_bytes_held_at,
    .reserve = linear_reserve,
    .forward = linear_forward,
    .set_workers = linear_set_workers,
    .units = linear_units,
    .forward_unit = linear_forward_unit,
    .forward_done = linear_forward_done,
    .state_save_size = linear_state_save_size,
    .state_save = linear_state_save,
    .state_load = linear_state_load,
};

/* ---- tuning and inspection (core/attn/features.h) ---- */

int core_attn_linear_set_opts(core_attn_t *a, const core_attn_linear_opts_t *o, core_error_t *err)
{
    if (!a || a->vt != &core_attn_linear_vtbl)
        return core_error_set(err, CORE_EINVAL, "not a linear attention configuration");
    if (o->chunk < 1 || o->chunk > LIN_MAX_CHUNK || (o->fp64_state != 0 && o->fp64_state != 1) ||
        o->memory_cap < 0 || o->memory_cap > LIN_MEM_CAP)
        return core_error_set(err, CORE_EINVAL, "chunk %d not in [1, %d], fp64_state %d not 0/1 "
                              "or memory_cap %d not in [0, %d]", o->chunk, LIN_MAX_CHUNK,
                              o->fp64_state, o->memory_cap, LIN_MEM_CAP);
    lin_params_t *lp = a->impl;
    int rc = set_chunk(a, lp, o->chunk, err);
    if (rc)
        return rc;
    lp->fp64 = o->fp64_state;
    set_mem_cap(lp, &a->cfg, o->memory_cap ? o->memory_cap : LIN_MEM_CAP);
    return 0;
}

const core_features_t *core_attn_linear_features(const core_attn_t *a, int layer, int kv_head)
{
    if (!a || a->vt != &core_attn_linear_vtbl || layer < 0 || layer >= a->cfg.n_layer ||
        kv_head < 0 || kv_head >= a->cfg.n_head_kv)
        return NULL;
    const lin_params_t *lp = a->impl;
    return &lp->maps[(size_t)layer * (size_t)a->cfg.n_head_kv + (size_t)kv_head];
}

int core_attn_linear_state_scale(const core_attn_state_t *s, int layer, int kv_head, double *c)
{
    if (!s || s->a->vt != &core_attn_linear_vtbl || layer < 0 || layer >= s->a->cfg.n_layer ||
        kv_head < 0 || kv_head >= s->a->cfg.n_head_kv)
        return CORE_EINVAL;
    const lin_state_t *st = s->impl;
    size_t m = (size_t)s->a->cfg.n_features;
    memcpy(c, st->c + ((size_t)layer * (size_t)s->a->cfg.n_head_kv + (size_t)kv_head) * m,
           m * sizeof *c);
    return 0;
}

int core_attn_linear_den_stats(core_attn_t *a, core_attn_den_stats_t *out, int reset)
{
    if (!a || a->vt != &core_attn_linear_vtbl)
        return CORE_EINVAL;
    lin_params_t *lp = a->impl;
    *out = (core_attn_den_stats_t){0};
    for (int i = 0; i < lp->slots; i++) {
        out->rows += lp->den[i].rows;
        out->neg += lp->den[i].neg;
        out->below_half += lp->den[i].below_half;
        out->below_tenth += lp->den[i].below_tenth;
        out->pure_zero += lp->den[i].pure_zero;
    }
    if (reset)
        memset(lp->den, 0, (size_t)lp->slots * sizeof *lp->den);
    return 0;
}

int core_attn_linear_params(const core_attn_t *a, int layer, const float **gam, const float **mix)
{
    if (!a || a->vt != &core_attn_linear_vtbl || layer < 0 || layer >= a->cfg.n_layer)
        return CORE_EINVAL;
    const lin_params_t *lp = a->impl;
    *gam = lp->gam + (size_t)layer * (size_t)a->cfg.n_head_kv;
    *mix = lp->mix + (size_t)layer * (size_t)a->cfg.n_head;
    return 0;
}
