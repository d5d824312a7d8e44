/* core/attn/features.c — random-feature draws, the feature maps (Performer,
 * DARKFormer, DARKFormer-IS, Flexformer-s/-n), and the DARKFormer adapter
 * GGUF (keys and per-layer tensors).
 *
 * Draws and proposals are computed in double and rounded once to the fp32
 * parameters the kernels use; core_features_phi recomputes φ in double from
 * those fp32 parameters without BLAS, so it serves as an oracle for the
 * kernels' fp32 path.
 */
#include "core/attn/features.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/blas.h"
#include "core/kernels/linalg.h"
#include "core/rng.h"
#include "core/tensor.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t core_features_stream_seed(uint64_t seed, int layer, int kv_head)
{
    uint64_t x = mix64(seed + 0x9e3779b97f4a7c15ULL);
    x = mix64(x ^ (0x6a09e667f3bcc909ULL * ((uint64_t)(uint32_t)layer + 1)));
    x = mix64(x ^ (0xbb67ae8584caa73bULL * ((uint64_t)(uint32_t)kv_head + 1)));
    return x;
}

static int check_dims(int hd, int m, core_error_t *err)
{
    /* Returns the literal code so that callers' analysis sees it is nonzero. */
    if (hd < 1 || hd > CORE_FEATURES_MAX_HEAD_DIM) {
        core_error_set(err, CORE_EINVAL, "head dim %d not in [1, %d]", hd,
                       CORE_FEATURES_MAX_HEAD_DIM);
        return CORE_EINVAL;
    }
    if (m < 1 || m > CORE_FEATURES_MAX_FEATURES) {
        core_error_set(err, CORE_EINVAL, "feature count %d not in [1, %d]", m,
                       CORE_FEATURES_MAX_FEATURES);
        return CORE_EINVAL;
    }
    return 0;
}

int core_features_draw(uint64_t stream_seed, int hd, int m, double *eps, core_error_t *err)
{
    int rc = check_dims(hd, m, err);
    size_t n = (size_t)hd, nn = n * n;
    /* (nn > 0 is implied by check_dims; restated for static analysis) */
    if (rc || nn == 0)
        return rc ? rc : CORE_EINVAL;
    /* calloc: every element is written before it is read, but zeroed
     * buffers keep static analysis from having to prove it. */
    double *g = calloc(nn, sizeof *g); /* [Hd][Hd] Gaussian block, then R */
    double *q = calloc(nn, sizeof *q); /* [Hd][Hd] its Q */
    double *s = calloc(n, sizeof *s);     /* [Hd] chi(Hd) row norms */
    if (!g || !q || !s) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for feature draws");
        goto fail;
    }
    core_rng_t r;
    core_rng_seed(&r, stream_seed);
    for (size_t row0 = 0; row0 < (size_t)m; row0 += n) {
        for (size_t i = 0; i < n * n; i++)
            g[i] = core_rng_normal(&r);
        for (size_t j = 0; j < n; j++) {
            double ss = 0.0;
            for (size_t t = 0; t < n; t++) {
                double x = core_rng_normal(&r);
                ss += x * x;
            }
            s[j] = sqrt(ss);
        }
        rc = core_linalg_qr(hd, g, q);
        if (rc) {
            core_error_set(err, rc, "QR of a feature block failed");
            goto fail;
        }
        size_t rows = (size_t)m - row0 < n ? (size_t)m - row0 : n;
        for (size_t j = 0; j < rows; j++) {
            /* Sign fix Q·sign(diag R): makes the factorization unique and Q
             * Haar-distributed (plain Householder Q is not). */
            double sg = g[j * n + j] < 0.0 ? -1.0 : 1.0;
            for (size_t c = 0; c < n; c++)
                eps[(row0 + j) * n + c] = s[j] * sg * q[c * n + j];
        }
    }
    rc = 0;
fail:
    free(g);
    free(q);
    free(s);
    return rc;
}

int core_features_is_proposal(int hd, const float *lambda, double *a, double *logdet,
                              int *n_clamped, core_error_t *err)
{
    int rc = check_dims(hd, 1, err);
    if (rc)
        return rc;
    size_t n = (size_t)hd;
    double *l = malloc(n * n * sizeof *l); /* [Hd][Hd] Λ, then destroyed */
    double *u = malloc(n * n * sizeof *u); /* [Hd][Hd] eigenvectors (columns) */
    double *w = malloc(n * sizeof *w);     /* [Hd] eigenvalues */
    if (!l || !u || !w) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for the IS proposal");
        goto fail;
    }
    for (size_t i = 0; i < n * n; i++) {
        if (!isfinite(lambda[i])) {
            rc = core_error_set(err, CORE_EINVAL, "lambda[%zu][%zu] is not finite", i / n, i % n);
            goto fail;
        }
        l[i] = lambda[i];
    }
    rc = core_linalg_eigh(hd, l, w, u);
    if (rc) {
        core_error_set(err, CORE_EINVAL, "eigendecomposition of lambda did not converge");
        goto fail;
    }
    int clamped = 0;
    double ld = 0.0;
    for (size_t j = 0; j < n; j++) {
        double lam = w[j];
        if (lam < 0.0 || lam > CORE_FEATURES_LAMBDA_MAX) {
            lam = lam < 0.0 ? 0.0 : CORE_FEATURES_LAMBDA_MAX;
            clamped++;
        }
        double sig = (1.0 + 2.0 * lam) / (1.0 - 2.0 * lam); /* eigenvalue of Σ* */
        ld += log(sig);
        w[j] = sqrt(sig);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (size_t k = 0; k < n; k++)
                acc += u[i * n + k] * w[k] * u[j * n + k];
            a[i * n + j] = acc;
        }
    *logdet = ld;
    if (n_clamped)
        *n_clamped = clamped;
    rc = 0;
fail:
    free(l);
    free(u);
    free(w);
    return rc;
}

void core_features_fini(core_features_t *f)
{
    if (!f)
        return;
    free(f->omega);
    free(f->omega2);
    free(f->bias);
    free(f->mat);
    memset(f, 0, sizeof *f);
}

int core_features_init(core_features_t *f, core_attn_kind_t kind, int hd, int m,
                       uint64_t stream_seed, const float *mat, const double *is_a,
                       double is_logdet, core_error_t *err)
{
    memset(f, 0, sizeof *f);
    int rc = check_dims(hd, m, err);
    if (rc)
        return rc;
    if (kind != CORE_ATTN_PERFORMER && kind != CORE_ATTN_DARKFORMER &&
        kind != CORE_ATTN_DARKFORMER_IS)
        return core_error_set(err, CORE_EINVAL, "attention kind '%s' has no feature map",
                              core_attn_kind_name(kind));
    if (kind == CORE_ATTN_DARKFORMER && !mat)
        return core_error_set(err, CORE_EINVAL, "darkformer feature map needs its matrix M");
    if (kind == CORE_ATTN_DARKFORMER_IS && (!is_a || !isfinite(is_logdet)))
        return core_error_set(err, CORE_EINVAL, "darkformer-is feature map needs its proposal");
    size_t n = (size_t)hd, mm = (size_t)m;
    double *eps = calloc(mm * n, sizeof *eps); /* [M][Hd] */
    f->omega = malloc(mm * n * sizeof *f->omega);
    f->bias = malloc(mm * sizeof *f->bias);
    if (kind == CORE_ATTN_DARKFORMER)
        f->mat = malloc(n * n * sizeof *f->mat);
    if (!eps || !f->omega || !f->bias || (kind == CORE_ATTN_DARKFORMER && !f->mat)) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for a feature map");
        goto fail;
    }
    if (f->mat) {
        for (size_t i = 0; i < n * n; i++) {
            if (!isfinite(mat[i])) {
                rc = core_error_set(err, CORE_EINVAL, "M[%zu][%zu] is not finite", i / n, i % n);
                goto fail;
            }
            f->mat[i] = mat[i];
        }
    }
    rc = core_features_draw(stream_seed, hd, m, eps, err);
    if (rc)
        goto fail;
    double log_m = log((double)m);
    for (size_t i = 0; i < mm; i++) {
        const double *e = eps + i * n;
        double b = 0.0;
        if (kind == CORE_ATTN_DARKFORMER_IS) {
            /* ω = A ε ~ N(0, Σ*); √w = exp(¼ log|Σ*| − ¼|ω|² + ¼|ε|²). */
            double w2 = 0.0, e2 = 0.0;
            for (size_t r = 0; r < n; r++) {
                double acc = 0.0;
                for (size_t c = 0; c < n; c++)
                    acc += is_a[r * n + c] * e[c];
                f->omega[i * n + r] = (float)acc;
                w2 += acc * acc;
                e2 += e[r] * e[r];
            }
            b = 0.25 * is_logdet - 0.25 * w2 + 0.25 * e2;
        } else {
            for (size_t r = 0; r < n; r++)
                f->omega[i * n + r] = (float)e[r];
        }
        f->bias[i] = (float)(b - 0.5 * log_m);
    }
    free(eps);
    f->kind = kind;
    f->head_dim = hd;
    f->n_features = m;
    return 0;
fail:
    free(eps);
    core_features_fini(f);
    return rc;
}

/* ---- Flexformer: signed trigonometric features ----
 *
 * The estimator. For ω ~ N(0, I), E[cos(ω·u)] = e^(−|u|²/2) (the
 * characteristic function of a standard normal) and E[sin(ω·u)] = 0. With
 * u = q̂ − k̂ and cos(a − b) = cos a cos b + sin a sin b:
 *   E[cos(ω·q̂)cos(ω·k̂) + sin(ω·q̂)sin(ω·k̂)] = e^(−|q̂−k̂|²/2)
 *                                             = e^(q̂·k̂) e^(−|q̂|²/2) e^(−|k̂|²/2),
 * so with the norm factor e^(|x̂|²/2) = e^(|x|²/(2√Hd)) on both sides,
 *   φ(x) = e^(|x̂|²/2) [cos(ω_i·x̂), sin(ω_i·x̂)]_{i<m} / √m
 * gives E[φ(q)·φ(k)] = e^(q̂·k̂) = e^(q·k/√Hd): the softmax kernel, unbiased,
 * for any ω_i that are each marginally N(0, I) — the block-orthogonal draws
 * ε of Performer are. This is Performer's trigonometric estimator; the
 * stationary kind (-s) keeps its form and learns the ω_i, so the untrained
 * kind (ω = ε) *is* that estimator. Each product is bounded,
 * |φ(q)·φ(k)| ≤ e^(|q̂|²/2 + |k̂|²/2), and signed.
 *
 * The non-stationary kind (-n, Yaglom): a kernel k(x, y) = E[e^(i(ω_1·x −
 * ω_2·y))] over a joint law of frequency pairs need not depend on x − y
 * only. Symmetrizing the pair law (each draw (ω_1, ω_2) also as (ω_2, ω_1),
 * (ω_1, ω_1), (ω_2, ω_2)) makes the kernel real, symmetric and positive
 * definite, and its Monte-Carlo estimate factorizes:
 *   φ(x) = e^(ν|x̂|²) [cos(ω_1i·x̂) + cos(ω_2i·x̂), sin(ω_1i·x̂) + sin(ω_2i·x̂)]_i / (2√m)
 *   φ(q)·φ(k) = e^(ν(|q̂|²+|k̂|²)) / (4m) Σ_i Σ_{a,b∈{1,2}} cos(ω_ai·q̂ − ω_bi·k̂),
 * the cross terms a ≠ b being what no stationary kernel has. The norm factor
 * e^(|x|²/τ) = e^(ν|x̂|²), ν = √Hd/τ, has a learned τ in place of 2√Hd
 * (a positive function of x times its value at y keeps the kernel positive
 * definite). At ω_2 = ω_1 and τ = 2√Hd every term is cos(ω_i·(q̂ − k̂)) and
 * -n equals -s, hence Performer's estimator at the draws.
 *
 * Computation: the cosine half occupies rows [0, m) and the sine half rows
 * [m, 2m) of the M = 2m state rows, so one GEMM per frequency set writes
 * u_i = ω_i·ŷ in place and the transform reads u_i before it writes rows i
 * and m + i. */
int core_features_init_trig(core_features_t *f, core_attn_kind_t kind, int hd, int m,
                            uint64_t stream_seed, const float *omega, const float *omega2,
                            double tau, core_error_t *err)
{
    memset(f, 0, sizeof *f);
    int rc = check_dims(hd, m, err);
    if (rc)
        return rc;
    if (!core_attn_kind_is_trig(kind))
        return core_error_set(err, CORE_EINVAL, "attention kind '%s' has no trigonometric "
                              "feature map", core_attn_kind_name(kind));
    if (m % 2)
        return core_error_set(err, CORE_EINVAL, "%s needs an even feature count (cosine and sine "
                              "rows), got %d", core_attn_kind_name(kind), m);
    int nst = kind == CORE_ATTN_FLEXFORMER_N;
    double t2 = 2.0 * sqrt((double)hd);
    if (!nst || tau <= 0.0)
        tau = t2;
    if (!(tau >= CORE_FEATURES_TAU_MIN && tau <= CORE_FEATURES_TAU_MAX))
        return core_error_set(err, CORE_EINVAL, "tau %g not in [%g, %g]", tau,
                              CORE_FEATURES_TAU_MIN, CORE_FEATURES_TAU_MAX);
    size_t n = (size_t)hd, mf = (size_t)m / 2;
    double *eps = omega ? NULL : calloc(mf * n, sizeof *eps); /* [M/2][Hd] */
    f->omega = malloc(mf * n * sizeof *f->omega);
    f->bias = calloc((size_t)m, sizeof *f->bias);
    if (nst)
        f->omega2 = malloc(mf * n * sizeof *f->omega2);
    if ((!omega && !eps) || !f->omega || !f->bias || (nst && !f->omega2)) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for a feature map");
        goto fail;
    }
    if (omega) {
        for (size_t i = 0; i < mf * n; i++) {
            if (!isfinite(omega[i])) {
                rc = core_error_set(err, CORE_EINVAL, "omega[%zu][%zu] is not finite", i / n,
                                    i % n);
                goto fail;
            }
            f->omega[i] = omega[i];
        }
    } else {
        rc = core_features_draw(stream_seed, hd, (int)mf, eps, err);
        if (rc)
            goto fail;
        for (size_t i = 0; i < mf * n; i++)
            f->omega[i] = (float)eps[i];
    }
    for (size_t i = 0; nst && i < mf * n; i++) {
        if (omega2 && !isfinite(omega2[i])) {
            rc = core_error_set(err, CORE_EINVAL, "omega2[%zu][%zu] is not finite", i / n, i % n);
            goto fail;
        }
        f->omega2[i] = omega2 ? omega2[i] : f->omega[i];
    }
    free(eps);
    f->kind = kind;
    f->head_dim = hd;
    f->n_features = m;
    f->tau = (float)tau;
    /* ν from the fp32 τ the digest and the adapter see; exactly ½ at 2√Hd
     * only up to rounding, so -s uses ½ itself */
    f->norm_coef = nst ? sqrt((double)hd) / (double)f->tau : 0.5;
    return 0;
fail:
    free(eps);
    core_features_fini(f);
    return rc;
}

int core_features_set_radius(core_features_t *f, double radius, core_error_t *err)
{
    if (!core_attn_kind_is_trig(f->kind))
        return core_error_set(err, CORE_EINVAL, "attention kind '%s' has no input sphere",
                              core_attn_kind_name(f->kind));
    if (!(radius >= CORE_FEATURES_RADIUS_MIN && radius <= CORE_FEATURES_RADIUS_MAX))
        return core_error_set(err, CORE_EINVAL, "radius %g not in [%g, %g]", radius,
                              CORE_FEATURES_RADIUS_MIN, CORE_FEATURES_RADIUS_MAX);
    f->radius = (float)radius;
    return 0;
}

/* The factor that maps a row of squared norm ss onto f's sphere (1: no
 * sphere; 0 for a zero row, which stays zero). */
static double sphere_scale(const core_features_t *f, double ss)
{
    if (f->radius <= 0.0f)
        return 1.0;
    return ss > 0.0 ? (double)f->radius / sqrt(ss) : 0.0;
}

void core_features_trig(const core_features_t *f, int64_t n, const float *y, float *vals,
                        double *lognorm)
{
    int64_t hd = f->head_dim, m = f->n_features, mf = m / 2;
    int nst = f->omega2 != NULL;
    /* u_1 into the cosine half of every row, u_2 (-n) into the sine half */
    core_gemm_nt(n, mf, hd, 1.0f, y, hd, f->omega, hd, 0.0f, vals, m);
    if (nst)
        core_gemm_nt(n, mf, hd, 1.0f, y, hd, f->omega2, hd, 0.0f, vals + mf, m);
    float sc = (float)(nst ? 0.5 / sqrt((double)mf) : 1.0 / sqrt((double)mf));
    for (int64_t r = 0; r < n; r++) {
        float *v = vals + r * m;
        double ss = 0.0;
        for (int64_t c = 0; c < hd; c++)
            ss += (double)y[r * hd + c] * y[r * hd + c];
        /* the sphere scales ŷ, hence every u = ω·ŷ, by one factor */
        const double ys = sphere_scale(f, ss);
        const float us = (float)ys;
        for (int64_t i = 0; i < mf; i++) {
            float a = v[i] * us; /* exact without a sphere (us = 1) */
            if (nst) {
                float b = v[mf + i] * us;
                v[i] = (cosf(a) + cosf(b)) * sc;
                v[mf + i] = (sinf(a) + sinf(b)) * sc;
            } else {
                v[i] = cosf(a) * sc;
                v[mf + i] = sinf(a) * sc;
            }
        }
        lognorm[r] = f->norm_coef * (ss * ys * ys);
    }
}

void core_features_prepare(const core_features_t *f, int64_t n, const float *x, int64_t ldx,
                           float *y)
{
    int64_t hd = f->head_dim;
    float scale = (float)pow((double)hd, -0.25);
    if (f->mat) {
        /* y = x·Matᵀ first, then the same scaling as the other kinds, so that
         * Mat = I gives bit-identical ŷ (the GEMM sums x_c·1 and exact zeros). */
        core_gemm_nt(n, hd, hd, 1.0f, x, ldx, f->mat, hd, 0.0f, y, hd);
        for (int64_t i = 0; i < n * hd; i++)
            y[i] *= scale;
    } else {
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < hd; c++)
                y[r * hd + c] = x[r * ldx + c] * scale;
    }
}

void core_features_logits(const core_features_t *f, int64_t n, const float *y, float *dots,
                          double *half_norm)
{
    int64_t hd = f->head_dim, m = f->n_features;
    core_gemm_nt(n, m, hd, 1.0f, y, hd, f->omega, hd, 0.0f, dots, m);
    for (int64_t r = 0; r < n; r++) {
        float *d = dots + r * m;
        for (int64_t i = 0; i < m; i++)
            d[i] += f->bias[i];
        double ss = 0.0;
        for (int64_t c = 0; c < hd; c++)
            ss += (double)y[r * hd + c] * y[r * hd + c];
        half_norm[r] = 0.5 * ss;
    }
}

void core_features_phi(const core_features_t *f, int64_t n, const float *x, int64_t ldx,
                       double *phi)
{
    size_t hd = (size_t)f->head_dim, m = (size_t)f->n_features;
    double scale = pow((double)hd, -0.25);
    double xh[CORE_FEATURES_MAX_HEAD_DIM], y[CORE_FEATURES_MAX_HEAD_DIM];
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * ldx;
        for (size_t c = 0; c < hd; c++)
            xh[c] = (double)xr[c] * scale;
        double n2 = 0.0;
        for (size_t i = 0; i < hd; i++) {
            if (f->mat) {
                double acc = 0.0;
                for (size_t c = 0; c < hd; c++)
                    acc += (double)f->mat[i * hd + c] * xh[c];
                y[i] = acc;
            } else {
                y[i] = xh[i];
            }
            n2 += y[i] * y[i];
        }
        if (core_attn_kind_is_trig(f->kind)) {
            if (f->radius > 0.0f) { /* onto the sphere |ŷ| = radius */
                double ys = n2 > 0.0 ? (double)f->radius / sqrt(n2) : 0.0;
                for (size_t i = 0; i < hd; i++)
                    y[i] *= ys;
                n2 *= ys * ys;
            }
            size_t mf = m / 2;
            double sc = f->omega2 ? 0.5 / sqrt((double)mf) : 1.0 / sqrt((double)mf);
            double nf = exp(f->norm_coef * n2);
            for (size_t i = 0; i < mf; i++) {
                double a = 0.0, b = 0.0;
                for (size_t c = 0; c < hd; c++) {
                    a += (double)f->omega[i * hd + c] * y[c];
                    if (f->omega2)
                        b += (double)f->omega2[i * hd + c] * y[c];
                }
                double cs = cos(a) + (f->omega2 ? cos(b) : 0.0);
                double sn = sin(a) + (f->omega2 ? sin(b) : 0.0);
                phi[(size_t)r * m + i] = nf * sc * cs;
                phi[(size_t)r * m + mf + i] = nf * sc * sn;
            }
            continue;
        }
        for (size_t i = 0; i < m; i++) {
            double acc = 0.0;
            for (size_t c = 0; c < hd; c++)
                acc += (double)f->omega[i * hd + c] * y[c];
            phi[(size_t)r * m + i] = exp(acc - 0.5 * n2 + (double)f->bias[i]);
        }
    }
}

/* ---- adapter ---- */

static int adapter_int(const core_gguf_t *g, const char *key, int64_t lo, int64_t hi, int64_t *out,
                       int *found, core_error_t *err)
{
    *found = 0;
    if (core_gguf_find_key(g, key) < 0)
        return 0;
    int64_t v;
    int rc = core_gguf_get_int(g, key, &v, err);
    if (rc)
        return core_error_set(err, CORE_EFORMAT, "adapter key '%s': not an integer (%s)", key,
                              core_strerror(rc));
    if (v < lo || v > hi)
        return core_error_set(err, CORE_EFORMAT, "adapter key '%s': %" PRId64 " not in [%" PRId64
                              ", %" PRId64 "]", key, v, lo, hi);
    *out = v;
    *found = 1;
    return 0;
}

static int adapter_str(const core_gguf_t *g, const char *key, char *buf, size_t cap, int *found,
                       core_error_t *err)
{
    *found = 0;
    if (core_gguf_find_key(g, key) < 0)
        return 0;
    core_gguf_str_t s;
    int rc = core_gguf_get_str(g, key, &s, err);
    if (rc)
        return core_error_set(err, CORE_EFORMAT, "adapter key '%s': not a string (%s)", key,
                              core_strerror(rc));
    if (s.len >= cap || memchr(s.ptr, 0, (size_t)s.len))
        return core_error_set(err, CORE_EFORMAT,
                              "adapter key '%s': longer than %zu bytes or contains NUL", key,
                              cap - 1);
    memcpy(buf, s.ptr, (size_t)s.len);
    buf[s.len] = '\0';
    *found = 1;
    return 0;
}

int core_features_adapter_info(const core_gguf_t *g, core_features_adapter_info_t *info,
                               core_error_t *err)
{
    int found, rc;
    int64_t v;
    char kind[32];
    if ((rc = adapter_int(g, "darkformer.format_version", 0, INT32_MAX, &v, &found, err)))
        return rc;
    if (found && v != 1 && v != CORE_FEATURES_ADAPTER_VERSION)
        return core_error_set(err, CORE_EUNSUPPORTED, "adapter key 'darkformer.format_version': "
                              "version %" PRId64 ", this build reads 1 and %d", v,
                              CORE_FEATURES_ADAPTER_VERSION);
    info->version = found ? (int)v : 1;
    if ((rc = adapter_str(g, "darkformer.kind", kind, sizeof kind, &found, err)))
        return rc;
    if (found && core_attn_kind_parse(kind, &info->kind) != 0)
        return core_error_set(err, CORE_EFORMAT, "adapter key 'darkformer.kind': unknown kind '%s'",
                              kind);
    if ((rc = adapter_int(g, "darkformer.n_features", 1, CORE_FEATURES_MAX_FEATURES, &v, &found,
                          err)))
        return rc;
    if (found)
        info->n_features = (int)v;
    if ((rc = adapter_int(g, "darkformer.window", 0, CORE_FEATURES_MAX_WINDOW, &v, &found, err)))
        return rc;
    if (found)
        info->window = (int)v;
    if ((rc = adapter_int(g, "darkformer.sinks", 0, CORE_FEATURES_MAX_SINKS, &v, &found, err)))
        return rc;
    if (found)
        info->sinks = (int)v;
    if ((rc = adapter_int(g, "darkformer.prerope", 0, 1, &v, &found, err)))
        return rc;
    if (found)
        info->prerope = (int)v;
    if ((rc = adapter_int(g, "darkformer.memory", 0, CORE_ATTN_MAX_MEMORY, &v, &found, err)))
        return rc;
    if (found)
        info->memory = (int)v;
    char keep[16];
    if ((rc = adapter_str(g, "darkformer.memory_keep", keep, sizeof keep, &found, err)))
        return rc;
    if (found && core_attn_keep_parse(keep, &info->memory_keep) != 0)
        return core_error_set(err, CORE_EFORMAT, "adapter key 'darkformer.memory_keep': '%s' is "
                              "neither 'recall' nor 'recent'", keep);
    if ((rc = adapter_str(g, "darkformer.memory_heads", info->memory_heads,
                          sizeof info->memory_heads, &found, err)))
        return rc;
    if ((rc = adapter_int(g, "darkformer.serve_window", 0, CORE_FEATURES_MAX_WINDOW, &v, &found,
                          err)))
        return rc;
    if (found)
        info->serve_window = (int)v;
    if ((rc = adapter_int(g, "darkformer.kv_bits", 8, 16, &v, &found, err)))
        return rc;
    if (found && v != 8 && v != 16)
        return core_error_set(err, CORE_EFORMAT, "adapter key darkformer.kv_bits is %lld "
                              "(8 or 16)", (long long)v);
    if (found)
        info->kv_bits = (int)v;
    if ((rc = adapter_int(g, "darkformer.seed", 0, INT64_MAX, &v, &found, err)))
        return rc;
    if (found)
        info->seed = (uint64_t)v;
    char fp[sizeof info->base_fingerprint];
    if ((rc = adapter_str(g, "darkformer.base_fingerprint", fp, sizeof fp, &found, err)))
        return rc;
    if (found)
        memcpy(info->base_fingerprint, fp, sizeof fp);
    return 0;
}

int core_features_resolve(const char *adapter_path, core_features_settings_t *s,
                          core_error_t *err)
{
    core_features_adapter_info_t ai = {.n_features = 0, .window = -1, .sinks = -1,
                                       .prerope = -1, .memory = -1, .memory_keep = -1,
                                       .kv_bits = -1,
                                       .serve_window = -1,
                                       .seed = s->seed,
                                       .version = 0};
    if (adapter_path) {
        core_gguf_t *g = NULL;
        int rc = core_gguf_open(adapter_path, &g, err);
        if (rc == 0)
            rc = core_features_adapter_info(g, &ai, err);
        core_gguf_close(g);
        if (rc < 0)
            return rc;
        if (ai.version == 1) { /* predates sinks and pre-RoPE features */
            ai.sinks = 0;
            ai.prerope = 0;
        }
    }
    s->seed = ai.seed;
    if (s->n_features <= 0)
        s->n_features = ai.n_features > 0 ? ai.n_features : CORE_FEATURES_DEFAULT_M;
    if (s->window < 0)
        s->window = ai.serve_window >= 0 ? ai.serve_window
                    : ai.window >= 0     ? ai.window
                                         : CORE_FEATURES_DEFAULT_WINDOW;
    if (s->sinks < 0)
        s->sinks = ai.sinks >= 0 ? ai.sinks : CORE_FEATURES_DEFAULT_SINKS;
    if (s->prerope < 0)
        s->prerope = ai.prerope >= 0 ? ai.prerope : 0;
    if (s->memory < 0)
        s->memory = ai.memory >= 0 ? ai.memory : CORE_FEATURES_DEFAULT_MEMORY;
    if (s->kv_bits <= 0)
        s->kv_bits = ai.kv_bits > 0 ? ai.kv_bits : CORE_FEATURES_DEFAULT_KV_BITS;
    if (s->memory_keep < 0)
        s->memory_keep = ai.memory_keep >= 0 ? ai.memory_keep : CORE_ATTN_KEEP_RECALL;
    if (!s->memory_heads[0])
        snprintf(s->memory_heads, sizeof s->memory_heads, "%s",
                 ai.memory_heads[0] ? ai.memory_heads : "all");
    return 0;
}

int core_features_adapter_vector(const core_gguf_t *g, const char *what, int layer, int n,
                                 float *out, int *found, core_error_t *err)
{
    char name[96];
    snprintf(name, sizeof name, "darkformer.blk.%d.%s", layer, what);
    *found = 0;
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, name);
    if (!t)
        return 0;
    int is_decay = strcmp(what, "decay") == 0, is_tau = strcmp(what, "tau") == 0;
    int is_radius = strcmp(what, "radius") == 0;
    double lo = is_decay    ? CORE_FEATURES_DECAY_MIN
                : is_tau    ? CORE_FEATURES_TAU_MIN
                : is_radius ? CORE_FEATURES_RADIUS_MIN
                            : -CORE_FEATURES_MIX_MAX;
    double hi = is_decay    ? 1.0
                : is_tau    ? CORE_FEATURES_TAU_MAX
                : is_radius ? CORE_FEATURES_RADIUS_MAX
                            : CORE_FEATURES_MIX_MAX;
    if (t->type != CORE_TTYPE_F32)
        return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s' has type %s, expected F32",
                              name, core_ttype_name(t->type));
    if (t->n_dims != 1 || t->ne[0] != n || t->nbytes != (size_t)n * sizeof(float) || !t->data)
        return core_error_set(err, CORE_EFORMAT,
                              "adapter tensor '%s' has shape [%" PRId64 ", %" PRId64
                              "], expected [%d] (%s)", name, t->ne[0], t->ne[1], n,
                              is_decay || is_tau || is_radius ? "Hkv" : "H");
    for (int i = 0; i < n; i++) {
        float x;
        memcpy(&x, (const unsigned char *)t->data + (size_t)i * sizeof x, sizeof x);
        if (!((double)x >= lo && (double)x <= hi))
            return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s': element %d is %g, "
                                  "outside [%g, %g]", name, i, (double)x, lo, hi);
        out[i] = x;
    }
    *found = 1;
    return 0;
}

/* The F32 adapter tensor darkformer.blk.<layer>.<what> of shape [ne0, ne1,
 * ne2] (dims names it in messages), every element finite. */
static int adapter_f32(const core_gguf_t *g, const char *what, int layer, int ne0, int ne1,
                       int ne2, const char *dims, const core_gguf_tensor_t **out,
                       core_error_t *err)
{
    char name[96];
    snprintf(name, sizeof name, "darkformer.blk.%d.%s", layer, what);
    *out = NULL;
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, name);
    if (!t)
        return core_error_set(err, CORE_ENOTFOUND, "adapter tensor '%s' is missing", name);
    if (t->type != CORE_TTYPE_F32)
        return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s' has type %s, expected F32",
                              name, core_ttype_name(t->type));
    if (t->n_dims > 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
        return core_error_set(err, CORE_EFORMAT,
                              "adapter tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64
                              ", %" PRId64 "], expected [%d, %d, %d] %s",
                              name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], ne0, ne1, ne2, dims);
    size_t count = (size_t)ne0 * (size_t)ne1 * (size_t)ne2;
    if (t->nbytes != count * sizeof(float) || !t->data)
        return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s' has %zu bytes, expected %zu",
                              name, t->nbytes, count * sizeof(float));
    const unsigned char *p = t->data;
    for (size_t i = 0; i < count; i++) {
        float x;
        memcpy(&x, p + i * sizeof x, sizeof x);
        if (!isfinite(x))
            return core_error_set(err, CORE_EFORMAT,
                                  "adapter tensor '%s': element %zu is not finite", name, i);
    }
    *out = t;
    return 0;
}

int core_features_adapter_tensor(const core_gguf_t *g, const char *what, int layer, int n_head_kv,
                                 int head_dim, const core_gguf_tensor_t **out, core_error_t *err)
{
    return adapter_f32(g, what, layer, head_dim, head_dim, n_head_kv, "(Hd, Hd, Hkv)", out, err);
}

int core_features_adapter_omega(const core_gguf_t *g, const char *what, int layer, int n_head_kv,
                                int n_freq, int head_dim, float *out, core_error_t *err)
{
    const core_gguf_tensor_t *t;
    int rc = adapter_f32(g, what, layer, head_dim, n_freq, n_head_kv, "(Hd, M/2, Hkv)", &t, err);
    /* t is set only on success: testing it, not only rc, keeps clang-analyzer
     * (which cannot see that core_error_set returns its negative code) from
     * reading a NULL t */
    if (rc < 0 || !t)
        return rc < 0 ? rc : CORE_EFORMAT;
    memcpy(out, t->data, t->nbytes);
    return 0;
}

int core_features_adapter_write(const core_features_adapter_desc_t *d, const char *path,
                                core_error_t *err)
{
    if (d->n_layer < 1 || d->n_head_kv < 1 || d->head_dim < 1 ||
        ((d->mix || d->decay) && (d->n_head < d->n_head_kv || d->n_head % d->n_head_kv)) ||
        d->sinks < 0 || d->sinks > CORE_FEATURES_MAX_SINKS || d->prerope < 0 || d->prerope > 1 ||
        d->head_dim > CORE_FEATURES_MAX_HEAD_DIM || d->n_features < 1 ||
        d->n_features > CORE_FEATURES_MAX_FEATURES || d->window < 0 ||
        d->window > CORE_FEATURES_MAX_WINDOW || d->seed > (uint64_t)INT64_MAX ||
        d->lora_rank < 0 || (d->lora_rank > 0 && d->n_embd < 1) ||
        ((d->omega || d->omega2) && d->n_features % 2) ||
        (d->radius && !core_attn_kind_is_trig(d->kind)))
        return core_error_set(err, CORE_EINVAL, "adapter description out of range");
    for (int i = 0; i < 8 && d->lora_rank > 0; i++)
        if (!d->lora[i])
            return core_error_set(err, CORE_EINVAL, "adapter description: a LoRA part is missing");
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    if (!w)
        return core_error_set(err, CORE_ENOMEM, "out of memory for the adapter writer");
    const char *kind = core_attn_kind_name(d->kind);
    const char *fp = d->base_fingerprint ? d->base_fingerprint : "";
    int rc = core_gguf_writer_set_str(w, "general.architecture", "darkformer-adapter", 18);
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.format_version", CORE_GGUF_TYPE_UINT32,
                                      CORE_FEATURES_ADAPTER_VERSION);
    if (!rc)
        rc = core_gguf_writer_set_str(w, "darkformer.kind", kind, strlen(kind));
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.n_features", CORE_GGUF_TYPE_UINT32,
                                      d->n_features);
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.window", CORE_GGUF_TYPE_UINT32, d->window);
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.sinks", CORE_GGUF_TYPE_UINT32, d->sinks);
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.prerope", CORE_GGUF_TYPE_UINT32, d->prerope);
    if (!rc)
        rc = core_gguf_writer_set_int(w, "darkformer.seed", CORE_GGUF_TYPE_UINT64,
                                      (int64_t)d->seed);
    if (!rc)
        rc = core_gguf_writer_set_str(w, "darkformer.base_fingerprint", fp, strlen(fp));
    if (!rc && d->serve_window > 0)
        rc = core_gguf_writer_set_int(w, "darkformer.serve_window", CORE_GGUF_TYPE_UINT32,
                                      d->serve_window);
    if (!rc && d->kv_bits > 0)
        rc = core_gguf_writer_set_int(w, "darkformer.kv_bits", CORE_GGUF_TYPE_UINT32, d->kv_bits);
    if (!rc && d->memory > 0) {
        const char *keep = core_attn_keep_name(d->memory_keep);
        if (!keep) {
            rc = core_error_set(err, CORE_EINVAL, "memory_keep %d is not a rule", d->memory_keep);
            goto done;
        }
        rc = core_gguf_writer_set_int(w, "darkformer.memory", CORE_GGUF_TYPE_UINT32, d->memory);
        if (!rc)
            rc = core_gguf_writer_set_str(w, "darkformer.memory_keep", keep, strlen(keep));
        if (!rc && d->memory_heads && d->memory_heads[0])
            rc = core_gguf_writer_set_str(w, "darkformer.memory_heads", d->memory_heads,
                                          strlen(d->memory_heads));
    }
    if (rc) {
        core_error_set(err, rc, "writing adapter keys failed");
        goto done;
    }
    for (int l = 0; l < d->n_layer; l++) {
        /* per layer: M and Λ [Hkv][Hd][Hd], decay [Hkv], mix [H], the LoRA
         * (those given; ne in GGUF order, the fastest dimension first) */
        const int64_t r = d->lora_rank, D = d->n_embd, qd = (int64_t)d->n_head * d->head_dim,
                      kvd = (int64_t)d->n_head_kv * d->head_dim, mf = d->n_features / 2;
        const int lr = r > 0;
        const struct {
            const char *what;
            const float *base;
            uint32_t nd;
            int64_t ne[3];
        } parts[] = {
            {"M", d->mat, 3, {d->head_dim, d->head_dim, d->n_head_kv}},
            {"lambda", d->lambda, 3, {d->head_dim, d->head_dim, d->n_head_kv}},
            {"decay", d->decay, 1, {d->n_head_kv, 1, 1}},
            {"mix", d->mix, 1, {d->n_head, 1, 1}},
            {"omega", d->omega, 3, {d->head_dim, mf, d->n_head_kv}},
            {"omega2", d->omega2, 3, {d->head_dim, mf, d->n_head_kv}},
            {"tau", d->tau, 1, {d->n_head_kv, 1, 1}},
            {"radius", d->radius, 1, {d->n_head_kv, 1, 1}},
            {"lora_q_a", lr ? d->lora[0] : NULL, 2, {D, r, 1}},
            {"lora_q_b", lr ? d->lora[1] : NULL, 2, {r, qd, 1}},
            {"lora_k_a", lr ? d->lora[2] : NULL, 2, {D, r, 1}},
            {"lora_k_b", lr ? d->lora[3] : NULL, 2, {r, kvd, 1}},
            {"lora_v_a", lr ? d->lora[4] : NULL, 2, {D, r, 1}},
            {"lora_v_b", lr ? d->lora[5] : NULL, 2, {r, kvd, 1}},
            {"lora_o_a", lr ? d->lora[6] : NULL, 2, {qd, r, 1}},
            {"lora_o_b", lr ? d->lora[7] : NULL, 2, {r, D, 1}},
        };
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            if (!parts[i].base)
                continue;
            size_t count = (size_t)parts[i].ne[0] * (size_t)parts[i].ne[1] * (size_t)parts[i].ne[2];
            char name[96];
            snprintf(name, sizeof name, "darkformer.blk.%d.%s", l, parts[i].what);
            rc = core_gguf_writer_add_tensor(w, name, CORE_TTYPE_F32, parts[i].nd, parts[i].ne,
                                             parts[i].base + (size_t)l * count,
                                             count * sizeof(float));
            if (rc) {
                core_error_set(err, rc, "adding adapter tensor '%s' failed", name);
                goto done;
            }
        }
    }
    rc = core_gguf_writer_write(w, path, err);
done:
    core_gguf_writer_free(w);
    return rc;
}
