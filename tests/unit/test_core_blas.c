/* Unit tests of core/kernels/blas.c: the small-m GEMM kernel (decode path) and the
 * BLAS-backed path, both against a naive double-precision reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/kernels/blas.h"
#include "core/kernels/cpu.h"
#include "core/kernels/half.h"
#include "core/kernels/kvrow.h"
#include "core/rng.h"

/* C = alpha * A[m][k] · B + beta * C in double, B[n][k]ᵀ (nt) or B[k][n];
 * mag: the sum of the terms' magnitudes, the scale of float rounding. */
static void ref_gemm(int nt, int64_t m, int64_t n, int64_t k, double alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, double beta, const float *c0,
                     double *c, int64_t ldc, double *mag)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, g = 0;
            for (int64_t p = 0; p < k; p++) {
                const double t = (double)a[i * lda + p] * (nt ? b[j * ldb + p] : b[p * ldb + j]);
                s += t;
                g += fabs(t);
            }
            double prev = beta == 0 ? 0 : beta * c0[i * ldc + j];
            c[i * ldc + j] = alpha * s + prev;
            mag[i * ldc + j] = fabs(alpha) * g + fabs(prev) + 1e-30;
        }
}

static void fill(core_rng_t *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)core_rng_normal(r);
}

/* max over entries of |got - want| / (sum of |terms|): float rounding error
 * of a k-term dot is below ~k * 2^-24 of that magnitude. */
enum { OP_NT = 0, OP_NT_SMALL = 1, OP_NN = 2, OP_NN_SMALL = 3 };

static double run_case(int op, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                       int64_t pad, core_rng_t *r)
{
    const int nn = op >= OP_NN, small = op & 1;
    int64_t lda = k + pad, ldb = (nn ? n : k) + 2 * pad, ldc = n + pad;
    float *a = malloc(sizeof(float) * (size_t)(m * lda));
    float *b = malloc(sizeof(float) * (size_t)((nn ? k : n) * ldb));
    float *c = malloc(sizeof(float) * (size_t)(m * ldc));
    float *c0 = malloc(sizeof(float) * (size_t)(m * ldc));
    double *want = malloc(sizeof(double) * (size_t)(m * ldc));
    double *mag = malloc(sizeof(double) * (size_t)(m * ldc));
    fill(r, a, (size_t)(m * lda));
    fill(r, b, (size_t)((nn ? k : n) * ldb));
    fill(r, c0, (size_t)(m * ldc));
    for (int64_t i = 0; i < m * ldc; i++)
        c[i] = beta == 0.0f ? NAN : c0[i]; /* beta 0 must overwrite, even NaN */
    ref_gemm(!nn, m, n, k, alpha, a, lda, b, ldb, beta, c0, want, ldc, mag);
    if (op == OP_NT_SMALL)
        core_gemm_nt_small(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else if (op == OP_NT)
        core_gemm_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else if (op == OP_NN_SMALL)
        core_gemm_nn_small(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        core_gemm_nn(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    (void)small;
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double e = fabs((double)c[i * ldc + j] - want[i * ldc + j]) / mag[i * ldc + j];
            if (!(e <= worst)) /* NaN counts as worst */
                worst = isnan(e) ? INFINITY : e;
        }
    free(a);
    free(b);
    free(c);
    free(c0);
    free(want);
    free(mag);
    return worst;
}

/* Both small kernels, on the CPU's own path and forced to the portable one. */
TEST(small_kernels_match_reference)
{
    core_rng_t r;
    core_rng_seed(&r, 7);
    static const int64_t ks[] = {1, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 576, 1536};
    static const int64_t ns[] = {1, 2, 5, 8, 17, 64, 67};
    for (int gen = 0; gen < 2; gen++) {
        core_gemm_small_force_generic(gen);
        for (int op = OP_NT_SMALL; op <= OP_NN_SMALL; op += 2)
            for (int64_t m = 1; m <= CORE_GEMM_SMALL_M + 3; m++)
                for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                        double e = run_case(op, m, ns[ni], ks[ki], 1.0f, 0.0f, (int64_t)(ki % 3),
                                            &r);
                        CHECK_MSG(e < 1e-6, "%s%s m %lld n %lld k %lld: error %g",
                                  op == OP_NN_SMALL ? "nn" : "nt", gen ? " generic" : "",
                                  (long long)m, (long long)ns[ni], (long long)ks[ki], e);
                    }
    }
    core_gemm_small_force_generic(0);
}

/* The small kernels on every kernel path this CPU runs (core_qdot_force_isa,
 * as DARKSERVE_ISA): each within the reference's bound, and below the CPU's
 * best path no AVX-512 half kernel (a lower path runs what its CPUs have). */
TEST(small_kernels_every_isa)
{
    core_rng_t r;
    core_rng_seed(&r, 17);
    static const int64_t ks[] = {1, 7, 33, 64, 576};
    const float a[16] = {0};
    float c[1] = {0};
    const uint16_t bh[16] = {0};
    for (int isa = 0; isa <= (int)core_qdot_best_isa(); isa++) {
        if (!core_qdot_isa_runs((core_qdot_isa_t)isa))
            continue;
        CHECK_INT_EQ(core_qdot_force_isa((core_qdot_isa_t)isa), 0);
        for (int op = OP_NT_SMALL; op <= OP_NN_SMALL; op += 2)
            for (int64_t m = 1; m <= CORE_GEMM_SMALL_M; m += 3)
                for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                    const double e = run_case(op, m, 67, ks[ki], 0.5f, 1.0f, 1, &r);
                    CHECK_MSG(e < 1e-6, "%s %s m %lld k %lld: error %g",
                              core_qdot_isa_name((core_qdot_isa_t)isa),
                              op == OP_NN_SMALL ? "nn" : "nt", (long long)m, (long long)ks[ki], e);
                }
        if (isa < (int)core_qdot_best_isa())
            CHECK_MSG(core_gemm_nt_half_small(1, 1, 16, 1.0f, a, 16, bh, 16, 0.0f, c, 1) == 0,
                      "%s: a half kernel ran", core_qdot_isa_name((core_qdot_isa_t)isa));
        /* the 8-bit-row kernels exist for AVX2 and AVX-512, not the portable path */
        CHECK_MSG(core_gemm_nt_q8_small(1, 1, 16, 1.0f, a, 16, bh, 20, 0.0f, c, 1) ==
                      (isa >= (int)CORE_QDOT_AVX2 && isa <= (int)CORE_QDOT_AVX512VNNI),
                  "%s: the 8-bit-row kernel ran or not against its path",
                  core_qdot_isa_name((core_qdot_isa_t)isa));
    }
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
}

TEST(small_kernels_alpha_beta)
{
    core_rng_t r;
    core_rng_seed(&r, 8);
    for (int gen = 0; gen < 2; gen++) {
        core_gemm_small_force_generic(gen);
        for (int op = OP_NT_SMALL; op <= OP_NN_SMALL; op += 2) {
            CHECK(run_case(op, 3, 9, 100, 0.5f, 1.0f, 1, &r) < 1e-6);
            CHECK(run_case(op, 3, 24, 100, 0.5f, 1.0f, 1, &r) < 1e-6);
            CHECK(run_case(op, 8, 4, 64, -2.0f, 0.25f, 0, &r) < 1e-6);
            CHECK(run_case(op, 1, 1, 1, 1.0f, 1.0f, 0, &r) < 1e-6);
        }
    }
    core_gemm_small_force_generic(0);
}

/* The AVX2 and portable paths sum every element in the same order and
 * differ only by fused vs separate multiply-adds: close, not equal. */
TEST(small_nn_paths_agree)
{
    core_rng_t r;
    core_rng_seed(&r, 11);
    enum { M = 3, N = 64, K = 272 };
    static float a[M * K], b[K * N], c1[M * N], c2[M * N];
    fill(&r, a, M * K);
    fill(&r, b, K * N);
    core_gemm_nn_small(M, N, K, 1.0f, a, K, b, N, 0.0f, c1, N);
    core_gemm_small_force_generic(1);
    core_gemm_nn_small(M, N, K, 1.0f, a, K, b, N, 0.0f, c2, N);
    core_gemm_small_force_generic(0);
    for (int i = 0; i < M * N; i++)
        CHECK_NEAR(c1[i], c2[i], 1e-3);
}

TEST(dispatch_both_paths)
{
    core_rng_t r;
    core_rng_seed(&r, 9);
    /* m <= CORE_GEMM_SMALL_M goes to the small kernels, larger m to sgemm. */
    for (int op = OP_NT; op <= OP_NN; op += 2)
        for (int64_t m = 1; m <= CORE_GEMM_SMALL_M + 8; m += 3) {
            double e = run_case(op, m, 40, 96, 1.0f, 1.0f, 2, &r);
            CHECK_MSG(e < 1e-6, "op %d m %lld: error %g", op, (long long)m, e);
        }
}

TEST(nn_and_tn_match_reference)
{
    core_rng_t r;
    core_rng_seed(&r, 10);
    enum { M = 5, N = 7, K = 13 };
    float a[M * K], b[K * N], at[K * M], c[M * N], c2[M * N];
    fill(&r, a, M * K);
    fill(&r, b, K * N);
    for (int i = 0; i < M; i++)
        for (int p = 0; p < K; p++)
            at[p * M + i] = a[i * K + p];
    core_gemm_nn(M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    core_gemm_tn(M, N, K, 1.0f, at, M, b, N, 0.0f, c2, N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int p = 0; p < K; p++)
                s += (double)a[i * K + p] * b[p * N + j];
            CHECK_NEAR(c[i * N + j], s, 1e-5);
            CHECK_NEAR(c2[i * N + j], s, 1e-5);
        }
}

/* core_gemm_tn at every depth around CORE_GEMM_SMALL_K (its own rank-1
 * updates below, sgemm above), with alpha and beta, against double sums. */
TEST(tn_small_depths)
{
    core_rng_t r;
    core_rng_seed(&r, 12);
    enum { M = 9, N = 70, KMAX = CORE_GEMM_SMALL_K + 3 };
    float at[KMAX * M], b[KMAX * N], c[M * N], c0[M * N];
    fill(&r, at, KMAX * M);
    fill(&r, b, KMAX * N);
    fill(&r, c0, M * N);
    const float betas[2] = {0.0f, 0.75f};
    for (int gen = 0; gen < 2; gen++) /* the CPU's kernel, then the portable one */
    for (int k = 1; k <= KMAX; k++)
        for (int bi = 0; bi < 2; bi++) {
            memcpy(c, c0, sizeof c);
            core_gemm_small_force_generic(gen);
            core_gemm_tn(M, N, k, 1.5f, at, M, b, N, betas[bi], c, N);
            core_gemm_small_force_generic(0);
            double worst = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)at[p * M + i] * b[p * N + j];
                    double want = 1.5 * s + (double)betas[bi] * c0[i * N + j];
                    double e = fabs(c[i * N + j] - want);
                    worst = e > worst ? e : worst;
                }
            CHECK_MSG(worst < 1e-5, "generic %d k %d beta %g: error %g", gen, k, (double)betas[bi],
                      worst);
        }
}

/* The half-B products: where they run (AVX-512 F16C, m ≤ 4), bit for bit the
 * float small kernels on B converted (core_half_unpack); elsewhere they
 * decline and write nothing. */
TEST(half_kernels_match_float)
{
    core_rng_t r;
    core_rng_seed(&r, 13);
    enum { KD = 64, NR = 37, NC = 128 };
    float a[5 * KD], bf[NR * NC], c1[5 * NC], c2[5 * NC], dummy[1];
    uint16_t bh[NR * NC];
    fill(&r, a, 5 * KD);
    fill(&r, bf, NR * NC);
    core_half_pack(bf, bh, NR * NC);
    core_half_unpack(bh, bf, NR * NC);
    const int avail = core_gemm_nt_half_small(1, 1, 16, 1.0f, a, 16, bh, 16, 0.0f, dummy, 1);
    int ran = 0;
    for (int64_t m = 1; m <= 5; m++)
        for (int beta = 0; beta < 2; beta++) {
            /* scores: A [m][KD] against NR rows of KD halves, C row stride NR */
            for (int i = 0; i < 5 * NC; i++)
                c1[i] = c2[i] = 0.5f * (float)i;
            core_gemm_nt_small(m, NR, KD, 0.125f, a, KD, bf, KD, (float)beta, c1, NR);
            int took = core_gemm_nt_half_small(m, NR, KD, 0.125f, a, KD, bh, KD, (float)beta, c2, NR);
            CHECK_MSG(took ? memcmp(c1, c2, sizeof c1) == 0 : 1, "nt m %lld beta %d differs",
                      (long long)m, beta);
            CHECK_MSG(took == (m <= 4 && avail), "nt m %lld: ran %d", (long long)m, took);
            ran += took;
            /* values: A [m][NR] times NR rows of NC halves */
            for (int i = 0; i < 5 * NC; i++)
                c1[i] = c2[i] = 0.25f * (float)i;
            core_gemm_nn_small(m, NC, NR, 1.0f, a, NR, bf, NC, (float)beta, c1, NC);
            took = core_gemm_nn_half_small(m, NC, NR, 1.0f, a, NR, bh, NC, (float)beta, c2, NC);
            CHECK_MSG(took == (m <= 4 && avail), "nn m %lld: ran %d", (long long)m, took);
            if (!took)
                for (int i = 0; i < 5 * NC; i++)
                    CHECK_MSG(c2[i] == 0.25f * (float)i, "nn m %lld: declined but wrote", (long long)m);
            else
                CHECK_MSG(memcmp(c1, c2, sizeof c1) == 0, "nn m %lld beta %d differs", (long long)m, beta);
            ran += took;
        }
    /* n not a multiple of 64, k not of 16: declined */
    CHECK(!core_gemm_nn_half_small(1, 48, NR, 1.0f, a, NR, bh, 48, 0.0f, c2, 48));
    CHECK(!core_gemm_nt_half_small(1, 4, 40, 1.0f, a, 40, bh, 40, 0.0f, c2, 4));
    core_gemm_small_force_generic(1);
    CHECK(!core_gemm_nt_half_small(1, NR, KD, 1.0f, a, KD, bh, KD, 0.0f, c2, NR));
    core_gemm_small_force_generic(0);
    printf("  half kernels ran in %d of 20 cases (0 on a CPU without AVX-512 and F16C)\n", ran);
}

/* The 8-bit-row products (core/kernels/kvrow.h): where they run (AVX-512
 * or AVX2, m ≤ 4), bit for bit the float small kernels of that path on the
 * rows unpacked, with a
 * scale per row (the nn rows span two 64-column passes: each must take its
 * own row's scale); elsewhere they decline and write nothing. */
TEST(q8_kernels_match_float)
{
    core_rng_t r;
    core_rng_seed(&r, 29);
    enum { KD = 128, NR = 37, NC = 128 };
    const size_t rb = core_kvrow_bytes(CORE_KVROW_Q8, KD); /* KD == NC: one row size */
    float a[5 * NR + 5 * KD], bf[NR * NC], c1[5 * NC], c2[5 * NC], dummy[1];
    unsigned char bq[NR * (4 + NC)];
    fill(&r, a, 5 * NR + 5 * KD);
    fill(&r, bf, NR * NC);
    for (int j = 0; j < NR; j++) /* rows of very different scales */
        for (int i = 0; i < NC; i++)
            bf[j * NC + i] *= (float)(1 + j * j);
    core_kvrow_pack(CORE_KVROW_Q8, bf, bq, NR, NC);
    core_kvrow_unpack(CORE_KVROW_Q8, bq, bf, NR, NC);
    const int avail = core_gemm_nt_q8_small(1, 1, 16, 1.0f, a, 16, bq, (int64_t)rb, 0.0f, dummy, 1);
    int ran = 0;
    for (int64_t kd = 64; kd <= KD; kd += 64)
        for (int64_t m = 1; m <= 5; m++)
            for (int beta = 0; beta < 2; beta++) {
                /* scores: A [m][kd] against the first kd elements of NR rows */
                for (int i = 0; i < 5 * NC; i++)
                    c1[i] = c2[i] = 0.5f * (float)i;
                core_gemm_nt_small(m, NR, kd, 0.125f, a, KD, bf, NC, (float)beta, c1, NR);
                int took = core_gemm_nt_q8_small(m, NR, kd, 0.125f, a, KD, bq, (int64_t)rb,
                                                 (float)beta, c2, NR);
                CHECK_MSG(took ? memcmp(c1, c2, sizeof c1) == 0 : 1, "nt k %lld m %lld beta %d "
                          "differs", (long long)kd, (long long)m, beta);
                CHECK_MSG(took == (m <= 4 && avail), "nt m %lld: ran %d", (long long)m, took);
                if (!took)
                    for (int i = 0; i < 5 * NC; i++)
                        CHECK_MSG(c2[i] == 0.5f * (float)i, "nt m %lld: declined but wrote",
                                  (long long)m);
                ran += took;
            }
    for (int64_t m = 1; m <= 5; m++)
        for (int beta = 0; beta < 2; beta++) {
            /* values: A [m][NR] times NR rows of NC */
            for (int i = 0; i < 5 * NC; i++)
                c1[i] = c2[i] = 0.25f * (float)i;
            core_gemm_nn_small(m, NC, NR, 1.0f, a, NR, bf, NC, (float)beta, c1, NC);
            int took = core_gemm_nn_q8_small(m, NC, NR, 1.0f, a, NR, bq, (int64_t)rb, (float)beta,
                                             c2, NC);
            CHECK_MSG(took == (m <= 4 && avail), "nn m %lld: ran %d", (long long)m, took);
            if (!took)
                for (int i = 0; i < 5 * NC; i++)
                    CHECK_MSG(c2[i] == 0.25f * (float)i, "nn m %lld: declined but wrote",
                              (long long)m);
            else
                CHECK_MSG(memcmp(c1, c2, sizeof c1) == 0, "nn m %lld beta %d differs",
                          (long long)m, beta);
            ran += took;
        }
    CHECK(!core_gemm_nn_q8_small(1, 48, NR, 1.0f, a, NR, bq, (int64_t)rb, 0.0f, c2, 48));
    CHECK(!core_gemm_nt_q8_small(1, 4, 40, 1.0f, a, 40, bq, (int64_t)rb, 0.0f, c2, 4));
    core_gemm_small_force_generic(1);
    CHECK(!core_gemm_nt_q8_small(1, NR, 64, 1.0f, a, KD, bq, (int64_t)rb, 0.0f, c2, NR));
    CHECK(!core_gemm_nn_q8_small(1, NC, NR, 1.0f, a, NR, bq, (int64_t)rb, 0.0f, c2, NC));
    core_gemm_small_force_generic(0);
    printf("  8-bit-row kernels ran in %d of 30 cases (0 on the portable path)\n", ran);
}

int main(void)
{
    RUN(small_kernels_match_reference);
    RUN(small_kernels_every_isa);
    RUN(small_kernels_alpha_beta);
    RUN(small_nn_paths_agree);
    RUN(dispatch_both_paths);
    RUN(nn_and_tn_match_reference);
    RUN(tn_small_depths);
    RUN(half_kernels_match_float);
    RUN(q8_kernels_match_float);
    return CHECK_DONE();
}
