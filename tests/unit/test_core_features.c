/* Unit tests for core/kernels/linalg.c and core/attn/features.c: QR and Jacobi against
 * their defining identities, block-orthogonal draws, the three estimators'
 * unbiasedness over many independent draws, the identities between kinds,
 * the IS variance claim on anisotropic data, and the adapter GGUF. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/attn/features.h"
#include "core/kernels/linalg.h"
#include "core/rng.h"
#include "tests/unit/check.h"

static void rand_matrix(core_rng_t *r, int n, double *a)
{
    for (int i = 0; i < n * n; i++)
        a[i] = core_rng_normal(r);
}

TEST(test_qr_identities)
{
    core_rng_t r;
    core_rng_seed(&r, 11);
    int sizes[] = {1, 2, 5, 16, 64};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        size_t nn = (size_t)n;
        double *a = malloc(nn * nn * sizeof *a), *a0 = malloc(nn * nn * sizeof *a0);
        double *q = malloc(nn * nn * sizeof *q);
        rand_matrix(&r, n, a);
        memcpy(a0, a, nn * nn * sizeof *a);
        CHECK_INT_EQ(core_linalg_qr(n, a, q), 0);
        double orth = 0, rec = 0, low = 0;
        for (size_t i = 0; i < nn; i++)
            for (size_t j = 0; j < nn; j++) {
                double qtq = 0, qr = 0;
                for (size_t k = 0; k < nn; k++) {
                    qtq += q[k * nn + i] * q[k * nn + j];
                    qr += q[i * nn + k] * a[k * nn + j];
                }
                orth = fmax(orth, fabs(qtq - (i == j)));
                rec = fmax(rec, fabs(qr - a0[i * nn + j]));
                if (i > j)
                    low = fmax(low, fabs(a[i * nn + j]));
            }
        CHECK_MSG(orth < 1e-12, "n=%d |QtQ-I| = %g", n, orth);
        CHECK_MSG(rec < 1e-11, "n=%d |QR-A| = %g", n, rec);
        CHECK_MSG(low == 0.0, "n=%d R not upper triangular (%g)", n, low);
        free(a);
        free(a0);
        free(q);
    }
    CHECK_INT_EQ(core_linalg_qr(0, NULL, NULL), CORE_EINVAL);
}

TEST(test_eigh_identities)
{
    core_rng_t r;
    core_rng_seed(&r, 12);
    int sizes[] = {1, 3, 16, 64};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        size_t nn = (size_t)n;
        double *a = malloc(nn * nn * sizeof *a), *a0 = malloc(nn * nn * sizeof *a0);
        double *v = malloc(nn * nn * sizeof *v), *w = malloc(nn * sizeof *w);
        rand_matrix(&r, n, a);
        for (size_t i = 0; i < nn; i++)
            for (size_t j = 0; j < i; j++)
                a[i * nn + j] = a[j * nn + i];
        memcpy(a0, a, nn * nn * sizeof *a);
        CHECK_INT_EQ(core_linalg_eigh(n, a, w, v), 0);
        double orth = 0, res = 0;
        for (size_t i = 0; i < nn; i++)
            for (size_t j = 0; j < nn; j++) {
                double vtv = 0, av = 0;
                for (size_t k = 0; k < nn; k++) {
                    vtv += v[k * nn + i] * v[k * nn + j];
                    av += a0[i * nn + k] * v[k * nn + j];
                }
                orth = fmax(orth, fabs(vtv - (i == j)));
                res = fmax(res, fabs(av - w[j] * v[i * nn + j]));
            }
        for (size_t j = 1; j < nn; j++)
            CHECK(w[j - 1] <= w[j]);
        CHECK_MSG(orth < 1e-12, "n=%d |VtV-I| = %g", n, orth);
        CHECK_MSG(res < 1e-10, "n=%d |AV-VW| = %g", n, res);
        free(a);
        free(a0);
        free(v);
        free(w);
    }
    double bad[4] = {1, NAN, NAN, 1}, w2[2], v2[4];
    CHECK_INT_EQ(core_linalg_eigh(2, bad, w2, v2), CORE_ERANGE);
}

TEST(test_draw_block_orthogonal)
{
    enum { HD = 8, M = 20, DRAWS = 400 };
    double eps[M * HD], eps2[M * HD];
    core_error_t err = {0};
    CHECK_INT_EQ(core_features_draw(99, HD, M, eps, &err), 0);
    CHECK_INT_EQ(core_features_draw(99, HD, M, eps2, &err), 0);
    CHECK(memcmp(eps, eps2, sizeof eps) == 0);
    CHECK_INT_EQ(core_features_draw(100, HD, M, eps2, &err), 0);
    CHECK(memcmp(eps, eps2, sizeof eps) != 0);
    /* Rows of one block are mutually orthogonal, across blocks they are not. */
    double in_block = 0, across = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < i; j++) {
            double d = 0;
            for (int c = 0; c < HD; c++)
                d += eps[i * HD + c] * eps[j * HD + c];
            if (i / HD == j / HD)
                in_block = fmax(in_block, fabs(d));
            else
                across = fmax(across, fabs(d));
        }
    CHECK_MSG(in_block < 1e-12, "in-block dot %g", in_block);
    CHECK(across > 1e-3);
    /* Marginals: every coordinate of every row is N(0,1). Over DRAWS draws,
     * the mean of ε² is 1 and that of ε is 0 within 5 standard errors. */
    double s1 = 0, s2 = 0, s4 = 0;
    long cnt = 0;
    for (int d = 0; d < DRAWS; d++) {
        CHECK_INT_EQ(core_features_draw(core_features_stream_seed(5, d, 0), HD, M, eps, &err), 0);
        for (int i = 0; i < M * HD; i++) {
            s1 += eps[i];
            s2 += eps[i] * eps[i];
            s4 += eps[i] * eps[i] * eps[i] * eps[i];
            cnt++;
        }
    }
    double m1 = s1 / cnt, m2 = s2 / cnt, var2 = s4 / cnt - m2 * m2;
    /* Coordinates within a row are dependent, so use a conservative bound
     * (× √(HD·M)) on the standard errors. */
    double k = sqrt((double)HD * M);
    CHECK_MSG(fabs(m1) < 5 * k / sqrt((double)cnt), "mean %g", m1);
    CHECK_MSG(fabs(m2 - 1) < 5 * k * sqrt(var2 / cnt), "mean square %g", m2);
    /* And the seeds of (layer, head) pairs differ. */
    CHECK(core_features_stream_seed(1, 0, 1) != core_features_stream_seed(1, 1, 0));
    CHECK(core_features_stream_seed(1, 0, 0) != core_features_stream_seed(2, 0, 0));
    CHECK_INT_EQ(core_features_draw(1, 0, 4, eps, &err), CORE_EINVAL);
}

/* Raw vector x (what the kernels receive) whose x̂ = x·Hd^(-1/4) is xh. */
static void from_hat(int hd, const double *xh, float *x)
{
    for (int i = 0; i < hd; i++)
        x[i] = (float)(xh[i] * pow((double)hd, 0.25));
}

static double hat_dot(int hd, const float *a, const float *b, const float *mat)
{
    double s = pow((double)hd, -0.25), ya[64], yb[64], d = 0;
    for (int i = 0; i < hd; i++) {
        ya[i] = yb[i] = 0;
        for (int c = 0; c < hd; c++) {
            double mic = mat ? mat[i * hd + c] : (i == c);
            ya[i] += mic * a[c] * s;
            yb[i] += mic * b[c] * s;
        }
        d += ya[i] * yb[i];
    }
    return d;
}

typedef struct est {
    double mean, sd, n;
} est_t;

/* Mean and sd of φ(q)·φ(k) over `draws` independent feature maps. */
static est_t estimate(core_attn_kind_t kind, int hd, int m, int draws, uint64_t seed,
                      const float *mat, const double *isa, double logdet, const float *q,
                      const float *k)
{
    double s = 0, s2 = 0, *pq = malloc((size_t)m * sizeof *pq), *pk = malloc((size_t)m * sizeof *pk);
    core_error_t err = {0};
    for (int d = 0; d < draws; d++) {
        core_features_t f;
        int rc = core_features_init(&f, kind, hd, m, core_features_stream_seed(seed, d, 0), mat,
                                    isa, logdet, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc)
            break;
        core_features_phi(&f, 1, q, hd, pq);
        core_features_phi(&f, 1, k, hd, pk);
        double dot = 0;
        for (int i = 0; i < m; i++)
            dot += pq[i] * pk[i];
        s += dot;
        s2 += dot * dot;
        core_features_fini(&f);
    }
    free(pq);
    free(pk);
    est_t e = {s / draws, 0, draws};
    e.sd = sqrt(fmax(0, s2 / draws - e.mean * e.mean) * draws / (draws - 1.0));
    return e;
}

/* 5 standard errors: a true mean lies outside with probability < 1e-6. */
static int within(est_t e, double target)
{
    return fabs(e.mean - target) < 5 * e.sd / sqrt(e.n);
}

enum { EHD = 8, EM = 16, EDRAWS = 2000, NPAIRS = 5 };

static void make_pairs(float q[NPAIRS][EHD], float k[NPAIRS][EHD])
{
    double qh[NPAIRS][EHD] = {{0}}, kh[NPAIRS][EHD] = {{0}};
    core_rng_t r;
    core_rng_seed(&r, 77);
    /* aligned, anti-aligned, orthogonal, anisotropic (one large coordinate),
     * random */
    qh[0][0] = 0.6, kh[0][0] = 0.5, qh[0][1] = 0.2, kh[0][1] = 0.3;
    qh[1][2] = 0.7, kh[1][2] = -0.6;
    qh[2][3] = 0.8, kh[2][4] = 0.8;
    qh[3][5] = 1.1, qh[3][0] = 0.1, kh[3][5] = 0.9, kh[3][1] = -0.1;
    for (int i = 0; i < EHD; i++) {
        qh[4][i] = 0.3 * core_rng_normal(&r);
        kh[4][i] = 0.3 * core_rng_normal(&r);
    }
    for (int p = 0; p < NPAIRS; p++) {
        from_hat(EHD, qh[p], q[p]);
        from_hat(EHD, kh[p], k[p]);
    }
}

TEST(test_performer_unbiased)
{
    float q[NPAIRS][EHD], k[NPAIRS][EHD];
    make_pairs(q, k);
    for (int p = 0; p < NPAIRS; p++) {
        double target = exp(hat_dot(EHD, q[p], k[p], NULL));
        est_t e = estimate(CORE_ATTN_PERFORMER, EHD, EM, EDRAWS, 1000 + p, NULL, NULL, 0, q[p], k[p]);
        CHECK_MSG(within(e, target), "pair %d: mean %.6f target %.6f sd %.4f", p, e.mean, target,
                  e.sd);
    }
}

/* A fixed, clearly non-identity, well-conditioned M. */
static void make_mat(float *mat)
{
    core_rng_t r;
    core_rng_seed(&r, 5);
    for (int i = 0; i < EHD; i++)
        for (int c = 0; c < EHD; c++)
            mat[i * EHD + c] = (float)((i == c ? (i % 2 ? 1.3 : 0.6) : 0.0) + 0.15 * core_rng_normal(&r));
}

TEST(test_darkformer_unbiased)
{
    float q[NPAIRS][EHD], k[NPAIRS][EHD], mat[EHD * EHD];
    make_pairs(q, k);
    make_mat(mat);
    int distinguished = 0;
    for (int p = 0; p < NPAIRS; p++) {
        double target = exp(hat_dot(EHD, q[p], k[p], mat));
        est_t e = estimate(CORE_ATTN_DARKFORMER, EHD, EM, EDRAWS, 2000 + p, mat, NULL, 0, q[p], k[p]);
        CHECK_MSG(within(e, target), "pair %d: mean %.6f target exp(qΣk) %.6f sd %.4f", p, e.mean,
                  target, e.sd);
        /* The test can tell the learned kernel from the original one. */
        distinguished += !within(e, exp(hat_dot(EHD, q[p], k[p], NULL)));
    }
    CHECK_MSG(distinguished >= 3, "only %d pairs distinguish exp(qΣk) from exp(q·k)",
              distinguished);
}

/* Λ = U diag(lam) Uᵀ with a random rotation U. */
static void make_lambda(int hd, const double *lam, uint64_t seed, float *out, double *dout)
{
    core_rng_t r;
    core_rng_seed(&r, seed);
    size_t n = (size_t)hd;
    double *g = malloc(n * n * sizeof *g), *u = malloc(n * n * sizeof *u);
    rand_matrix(&r, hd, g);
    core_linalg_qr(hd, g, u);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t t = 0; t < n; t++)
                s += u[i * n + t] * lam[t] * u[j * n + t];
            if (out)
                out[i * n + j] = (float)s;
            if (dout)
                dout[i * n + j] = s;
        }
    free(g);
    free(u);
}

TEST(test_is_unbiased_for_original_kernel)
{
    float q[NPAIRS][EHD], k[NPAIRS][EHD], lambda[EHD * EHD];
    /* includes an eigenvalue above 1/2 (clamped) and a negative one */
    double lam[EHD] = {0.8, 0.4, 0.3, 0.2, 0.1, 0.05, 0.0, -0.05};
    make_pairs(q, k);
    make_lambda(EHD, lam, 9, lambda, NULL);
    double isa[EHD * EHD], logdet;
    int clamped = -1;
    core_error_t err = {0};
    CHECK_INT_EQ(core_features_is_proposal(EHD, lambda, isa, &logdet, &clamped, &err), 0);
    CHECK_INT_EQ(clamped, 2);
    for (int p = 0; p < NPAIRS; p++) {
        double target = exp(hat_dot(EHD, q[p], k[p], NULL));
        est_t e = estimate(CORE_ATTN_DARKFORMER_IS, EHD, EM, EDRAWS, 3000 + p, NULL, isa, logdet,
                           q[p], k[p]);
        CHECK_MSG(within(e, target), "pair %d: mean %.6f target %.6f sd %.4f", p, e.mean, target,
                  e.sd);
    }
}

TEST(test_is_proposal_formula)
{
    enum { HD = 6 };
    double lam[HD] = {0.0, 0.1, 0.25, 0.4, 0.49, 0.7};
    float lambda[HD * HD];
    double dl[HD * HD], isa[HD * HD], logdet;
    make_lambda(HD, lam, 3, lambda, dl);
    int clamped;
    core_error_t err = {0};
    CHECK_INT_EQ(core_features_is_proposal(HD, lambda, isa, &logdet, &clamped, &err), 0);
    CHECK_INT_EQ(clamped, 1);
    double want_ld = 0;
    for (int i = 0; i < HD; i++) {
        double l = lam[i] > 0.49 ? 0.49 : lam[i];
        want_ld += log((1 + 2 * l) / (1 - 2 * l));
    }
    CHECK_NEAR(logdet, want_ld, 1e-5);
    /* A² = Σ* on the unclamped part: (I − 2Λ)·A² = I + 2Λ holds exactly
     * when no eigenvalue was clamped; check it on a clamp-free Λ. */
    double lam2[HD] = {0.0, 0.05, 0.1, 0.2, 0.3, 0.45};
    make_lambda(HD, lam2, 4, lambda, dl);
    CHECK_INT_EQ(core_features_is_proposal(HD, lambda, isa, &logdet, &clamped, &err), 0);
    CHECK_INT_EQ(clamped, 0);
    double worst = 0, asym = 0;
    for (int i = 0; i < HD; i++)
        for (int j = 0; j < HD; j++) {
            double lhs = 0;
            for (int t = 0; t < HD; t++) {
                double a2 = 0;
                for (int u = 0; u < HD; u++)
                    a2 += isa[t * HD + u] * isa[u * HD + j];
                /* Λ as the fp32 values the proposal saw */
                lhs += ((i == t) - 2.0 * lambda[i * HD + t]) * a2;
            }
            worst = fmax(worst, fabs(lhs - ((i == j) + 2.0 * lambda[i * HD + j])));
            asym = fmax(asym, fabs(isa[i * HD + j] - isa[j * HD + i]));
        }
    CHECK_MSG(worst < 1e-9, "(I-2L)A^2 - (I+2L) = %g", worst);
    CHECK(asym < 1e-12);
    lambda[3] = NAN;
    CHECK_INT_EQ(core_features_is_proposal(HD, lambda, isa, &logdet, &clamped, &err), CORE_EINVAL);
}

TEST(test_kinds_coincide_at_identity)
{
    enum { HD = 16, M = 40 };
    float eye[HD * HD] = {0}, lambda0[HD * HD] = {0}, x[5 * HD], yp[5 * HD], yd[5 * HD];
    for (int i = 0; i < HD; i++)
        eye[i * HD + i] = 1.0f;
    double isa[HD * HD], logdet;
    core_error_t err = {0};
    CHECK_INT_EQ(core_features_is_proposal(HD, lambda0, isa, &logdet, NULL, &err), 0);
    core_features_t p, d, s;
    CHECK_INT_EQ(core_features_init(&p, CORE_ATTN_PERFORMER, HD, M, 42, NULL, NULL, 0, &err), 0);
    CHECK_INT_EQ(core_features_init(&d, CORE_ATTN_DARKFORMER, HD, M, 42, eye, NULL, 0, &err), 0);
    CHECK_INT_EQ(core_features_init(&s, CORE_ATTN_DARKFORMER_IS, HD, M, 42, NULL, isa, logdet, &err), 0);
    CHECK(memcmp(p.omega, d.omega, sizeof(float) * HD * M) == 0);
    CHECK(memcmp(p.bias, d.bias, sizeof(float) * M) == 0);
    CHECK(memcmp(p.omega, s.omega, sizeof(float) * HD * M) == 0);
    CHECK(memcmp(p.bias, s.bias, sizeof(float) * M) == 0);
    core_rng_t r;
    core_rng_seed(&r, 8);
    for (int i = 0; i < 5 * HD; i++)
        x[i] = (float)(3 * core_rng_normal(&r));
    core_features_prepare(&p, 5, x, HD, yp);
    core_features_prepare(&d, 5, x, HD, yd);
    CHECK(memcmp(yp, yd, sizeof yp) == 0);
    /* bias = −½ log M for Performer */
    CHECK_NEAR(p.bias[0], -0.5 * log((double)M), 1e-7);
    /* fp32 logits agree with the double φ */
    float dots[5 * M];
    double hn[5], phi[5 * M];
    core_features_logits(&p, 5, yp, dots, hn);
    core_features_phi(&p, 5, x, HD, phi);
    double worst = 0;
    for (int rr = 0; rr < 5; rr++)
        for (int i = 0; i < M; i++)
            worst = fmax(worst, fabs((dots[rr * M + i] - hn[rr]) - log(phi[rr * M + i])));
    CHECK_MSG(worst < 1e-4, "fp32 vs double logits differ by %g", worst);
    core_features_fini(&p);
    core_features_fini(&d);
    core_features_fini(&s);
    core_features_fini(NULL);
    CHECK_INT_EQ(core_features_init(&p, CORE_ATTN_DARKFORMER, HD, M, 1, NULL, NULL, 0, &err),
                 CORE_EINVAL);
    CHECK_INT_EQ(core_features_init(&p, CORE_ATTN_EXACT, HD, M, 1, NULL, NULL, 0, &err), CORE_EINVAL);
}

/* DESIGN §3: for q̂, k̂ ~ N(0, Λ) the IS proposal Σ* minimises the
 * estimator's second moment averaged over such pairs. Measures, for pairs
 * drawn from N(0, Λ) with Λ's eigenvalues (top ×3, 0.2 ×3, 0.01 ×10) in a
 * random basis: out[kind] = mean squared error of φ(q)·φ(k) against exp(q̂·k̂)
 * (kind 0 Performer, 1 IS), out[2 + kind] = the same relative to the target,
 * out[4] = median over pairs of (IS MSE / Performer MSE). */
enum { VHD = 16, VM = 32, VPAIRS = 400, VDRAWS = 100 };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void variance_compare(double top, double out[5])
{
    double lam[VHD];
    for (int i = 0; i < VHD; i++)
        lam[i] = i < 3 ? top : (i < 6 ? 0.2 : 0.01);
    float lambda[VHD * VHD];
    double dl[VHD * VHD], chol[VHD * VHD] = {0}, isa[VHD * VHD], logdet;
    make_lambda(VHD, lam, 21, lambda, dl);
    /* Cholesky of Λ to sample q̂, k̂ ~ N(0, Λ). */
    for (int i = 0; i < VHD; i++)
        for (int j = 0; j <= i; j++) {
            double s = dl[i * VHD + j];
            for (int t = 0; t < j; t++)
                s -= chol[i * VHD + t] * chol[j * VHD + t];
            chol[i * VHD + j] = i == j ? sqrt(s) : s / chol[j * VHD + j];
        }
    core_error_t err = {0};
    CHECK_INT_EQ(core_features_is_proposal(VHD, lambda, isa, &logdet, NULL, &err), 0);
    core_rng_t r;
    core_rng_seed(&r, 31);
    static float q[VPAIRS][VHD], k[VPAIRS][VHD];
    static double target[VPAIRS], per[2][VPAIRS];
    for (int p = 0; p < VPAIRS; p++) {
        double zq[VHD], zk[VHD], qh[VHD], kh[VHD];
        for (int i = 0; i < VHD; i++) {
            zq[i] = core_rng_normal(&r);
            zk[i] = core_rng_normal(&r);
        }
        for (int i = 0; i < VHD; i++) {
            qh[i] = kh[i] = 0;
            for (int t = 0; t <= i; t++) {
                qh[i] += chol[i * VHD + t] * zq[t];
                kh[i] += chol[i * VHD + t] * zk[t];
            }
        }
        from_hat(VHD, qh, q[p]);
        from_hat(VHD, kh, k[p]);
        target[p] = exp(hat_dot(VHD, q[p], k[p], NULL));
        per[0][p] = per[1][p] = 0;
    }
    double pq[VM], pk[VM];
    for (int kind = 0; kind < 2; kind++) {
        out[kind] = out[2 + kind] = 0;
        for (int d = 0; d < VDRAWS; d++) {
            core_features_t f;
            int rc = core_features_init(&f, kind ? CORE_ATTN_DARKFORMER_IS : CORE_ATTN_PERFORMER,
                                        VHD, VM, core_features_stream_seed(555, d, 0), NULL, isa,
                                        logdet, &err);
            CHECK_INT_EQ(rc, 0);
            if (rc)
                return;
            for (int p = 0; p < VPAIRS; p++) {
                core_features_phi(&f, 1, q[p], VHD, pq);
                core_features_phi(&f, 1, k[p], VHD, pk);
                double dot = 0;
                for (int i = 0; i < VM; i++)
                    dot += pq[i] * pk[i];
                double e2 = (dot - target[p]) * (dot - target[p]);
                per[kind][p] += e2;
                out[kind] += e2;
                out[2 + kind] += e2 / (target[p] * target[p]);
            }
            core_features_fini(&f);
        }
        out[kind] /= (double)VPAIRS * VDRAWS;
        out[2 + kind] /= (double)VPAIRS * VDRAWS;
    }
    double ratio[VPAIRS];
    for (int p = 0; p < VPAIRS; p++)
        ratio[p] = per[1][p] / per[0][p];
    qsort(ratio, VPAIRS, sizeof ratio[0], cmp_double);
    out[4] = ratio[VPAIRS / 2];
}

TEST(test_is_variance_lower_on_anisotropic_data)
{
    double tops[2] = {0.3, 0.45}, o[2][5];
    for (int i = 0; i < 2; i++) {
        variance_compare(tops[i], o[i]);
        printf("  IS variance, Hd=%d M=%d, Λ eigenvalues %.2f x3, 0.2 x3, 0.01 x10, %d pairs x %d "
               "draws:\n    MSE performer %.4g, darkformer-is %.4g; relative MSE %.4g vs %.4g; "
               "median per-pair MSE ratio IS/performer %.3f\n",
               VHD, VM, tops[i], VPAIRS, VDRAWS, o[i][0], o[i][1], o[i][2], o[i][3], o[i][4]);
    }
    /* Asserted only where it held with a wide margin (>= 3.5x) for 16 other
     * seeds of this set-up: the average MSE at eigenvalues 0.3. Performer's
     * MSE there is dominated by rare pairs (heavy tail); on the median pair
     * IS is slightly worse, and at 0.45 (Σ* = 19) it is worse on most pairs —
     * the proposal optimises the average second moment, not the typical pair. */
    CHECK_MSG(o[0][1] < o[0][0], "IS MSE %.4g not below Performer %.4g", o[0][1], o[0][0]);
}

/* ---- adapter ---- */

static char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/darkserve_features_%s_%d.gguf", tag, (int)getpid());
    return buf;
}

TEST(test_adapter_roundtrip_and_errors)
{
    enum { L = 2, HKV = 2, HD = 4 };
    float mat[L * HKV * HD * HD], lambda[L * HKV * HD * HD];
    for (int i = 0; i < L * HKV * HD * HD; i++) {
        mat[i] = (float)(i % 7) * 0.1f;
        lambda[i] = (float)(i % 5) * 0.01f;
    }
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = L, .n_head_kv = HKV,
                                      .head_dim = HD, .n_features = 96, .window = 32,
                                      .seed = 1234567, .base_fingerprint = "sha256:abcd",
                                      .mat = mat, .lambda = lambda};
    core_error_t err = {0};
    char *path = tmp_path("rt");
    int rc = core_features_adapter_write(&d, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    core_gguf_t *g = NULL;
    rc = core_gguf_open(path, &g, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    core_features_adapter_info_t info = {.kind = CORE_ATTN_EXACT, .n_features = 1};
    CHECK_INT_EQ(core_features_adapter_info(g, &info, &err), 0);
    CHECK_INT_EQ(info.kind, CORE_ATTN_DARKFORMER);
    CHECK_INT_EQ(info.n_features, 96);
    CHECK_INT_EQ(info.window, 32);
    CHECK_INT_EQ(info.seed, 1234567);
    CHECK_STR_EQ(info.base_fingerprint, "sha256:abcd");
    const core_gguf_tensor_t *t = NULL;
    CHECK_INT_EQ(core_features_adapter_tensor(g, "M", 1, HKV, HD, &t, &err), 0);
    CHECK(t && memcmp(t->data, mat + HKV * HD * HD, sizeof(float) * HKV * HD * HD) == 0);
    CHECK_INT_EQ(core_features_adapter_tensor(g, "lambda", 0, HKV, HD, &t, &err), 0);
    CHECK_INT_EQ(core_features_adapter_tensor(g, "M", 2, HKV, HD, &t, &err), CORE_ENOTFOUND);
    CHECK(strstr(err.msg, "darkformer.blk.2.M") != NULL);
    CHECK_INT_EQ(core_features_adapter_tensor(g, "M", 0, HKV, HD + 1, &t, &err), CORE_EFORMAT);
    CHECK(strstr(err.msg, "darkformer.blk.0.M") != NULL && strstr(err.msg, "shape") != NULL);
    CHECK_INT_EQ(core_features_adapter_tensor(g, "M", 0, HKV + 1, HD, &t, &err), CORE_EFORMAT);
    core_gguf_close(g);

    /* Non-finite values and a bad kind string are refused with the name. */
    mat[5] = INFINITY;
    d.kind = CORE_ATTN_DARKFORMER;
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), 0);
    CHECK_INT_EQ(core_gguf_open(path, &g, &err), 0);
    CHECK_INT_EQ(core_features_adapter_tensor(g, "M", 0, HKV, HD, &t, &err), CORE_EFORMAT);
    CHECK(strstr(err.msg, "darkformer.blk.0.M") != NULL && strstr(err.msg, "finite") != NULL);
    core_gguf_close(g);

    core_gguf_writer_t *w = core_gguf_writer_new(0);
    core_gguf_writer_set_int(w, "darkformer.format_version", CORE_GGUF_TYPE_UINT32, 3);
    CHECK_INT_EQ(core_gguf_writer_write(w, path, &err), 0);
    core_gguf_writer_free(w);
    CHECK_INT_EQ(core_gguf_open(path, &g, &err), 0);
    CHECK_INT_EQ(core_features_adapter_info(g, &info, &err), CORE_EUNSUPPORTED);
    CHECK(strstr(err.msg, "format_version") != NULL);
    core_gguf_close(g);

    w = core_gguf_writer_new(0);
    core_gguf_writer_set_str(w, "darkformer.kind", "softmax", 7);
    core_gguf_writer_set_str(w, "darkformer.n_features", "x", 1);
    CHECK_INT_EQ(core_gguf_writer_write(w, path, &err), 0);
    core_gguf_writer_free(w);
    CHECK_INT_EQ(core_gguf_open(path, &g, &err), 0);
    CHECK_INT_EQ(core_features_adapter_info(g, &info, &err), CORE_EFORMAT);
    CHECK(strstr(err.msg, "darkformer.kind") != NULL);
    core_gguf_close(g);

    /* The serving defaults: darkformer.serve_window wins over the trained
     * window, darkformer.kv_bits gives the rows' bits; flags win over both;
     * absent, the trained window and 16 bits. Bad values are refused. */
    mat[5] = 0.0f;
    d.serve_window = 100;
    d.kv_bits = 8;
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), 0);
    core_features_settings_t fs = {.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                   .kv_bits = -1};
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.window, 100);
    CHECK_INT_EQ(fs.kv_bits, 8);
    fs = (core_features_settings_t){.window = 7, .sinks = -1, .prerope = -1, .memory = -1,
                                    .kv_bits = 16};
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.window, 7);
    CHECK_INT_EQ(fs.kv_bits, 16);
    d.serve_window = 0;
    d.kv_bits = 0;
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), 0);
    fs = (core_features_settings_t){.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                    .kv_bits = -1};
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.window, 32);
    CHECK_INT_EQ(fs.kv_bits, CORE_FEATURES_DEFAULT_KV_BITS);
    /* the memory's serving keys: written together, read back, flags win */
    d.memory = 64;
    d.memory_keep = CORE_ATTN_KEEP_RECENT;
    d.memory_heads = "1.0,3.1";
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), 0);
    fs = (core_features_settings_t){.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                    .memory_keep = -1, .kv_bits = -1};
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.memory, 64);
    CHECK_INT_EQ(fs.memory_keep, CORE_ATTN_KEEP_RECENT);
    CHECK_MSG(strcmp(fs.memory_heads, "1.0,3.1") == 0, "heads '%s'", fs.memory_heads);
    fs = (core_features_settings_t){.window = -1, .sinks = -1, .prerope = -1, .memory = 0,
                                    .memory_keep = CORE_ATTN_KEEP_RECALL, .kv_bits = -1};
    snprintf(fs.memory_heads, sizeof fs.memory_heads, "all");
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.memory, 0);
    CHECK_INT_EQ(fs.memory_keep, CORE_ATTN_KEEP_RECALL);
    CHECK_MSG(strcmp(fs.memory_heads, "all") == 0, "heads '%s'", fs.memory_heads);
    d.memory = 0;
    d.memory_heads = NULL;
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), 0);
    fs = (core_features_settings_t){.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                    .memory_keep = -1, .kv_bits = -1};
    CHECK_INT_EQ(core_features_resolve(path, &fs, &err), 0);
    CHECK_INT_EQ(fs.memory, CORE_FEATURES_DEFAULT_MEMORY);
    CHECK_INT_EQ(fs.memory_keep, CORE_ATTN_KEEP_RECALL);
    CHECK_MSG(strcmp(fs.memory_heads, "all") == 0, "heads '%s'", fs.memory_heads);
    /* a rule the reader does not know */
    w = core_gguf_writer_new(0);
    core_gguf_writer_set_str(w, "darkformer.memory_keep", "oldest", 6);
    CHECK_INT_EQ(core_gguf_writer_write(w, path, &err), 0);
    core_gguf_writer_free(w);
    CHECK_INT_EQ(core_gguf_open(path, &g, &err), 0);
    CHECK_INT_EQ(core_features_adapter_info(g, &info, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "darkformer.memory_keep") != NULL, "%s", err.msg);
    core_gguf_close(g);
    static const char *const keys[] = {"darkformer.kv_bits", "darkformer.kv_bits",
                                       "darkformer.serve_window"};
    static const int64_t vals[] = {12, 32, (int64_t)CORE_FEATURES_MAX_WINDOW + 1};
    for (int i = 0; i < 3; i++) {
        w = core_gguf_writer_new(0);
        core_gguf_writer_set_int(w, keys[i], CORE_GGUF_TYPE_UINT32, vals[i]);
        CHECK_INT_EQ(core_gguf_writer_write(w, path, &err), 0);
        core_gguf_writer_free(w);
        CHECK_INT_EQ(core_gguf_open(path, &g, &err), 0);
        CHECK_INT_EQ(core_features_adapter_info(g, &info, &err), CORE_EFORMAT);
        CHECK_MSG(strstr(err.msg, keys[i]) != NULL, "%s", err.msg);
        core_gguf_close(g);
    }
    unlink(path);
}

int main(void)
{
    RUN(test_qr_identities);
    RUN(test_eigh_identities);
    RUN(test_draw_block_orthogonal);
    RUN(test_performer_unbiased);
    RUN(test_darkformer_unbiased);
    RUN(test_is_unbiased_for_original_kernel);
    RUN(test_is_proposal_formula);
    RUN(test_kinds_coincide_at_identity);
    RUN(test_is_variance_lower_on_anisotropic_data);
    RUN(test_adapter_roundtrip_and_errors);
    return CHECK_DONE();
}
