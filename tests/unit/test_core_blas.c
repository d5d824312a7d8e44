/* Unit tests of core/blas.c: the small-m GEMM kernel (decode path) and the
 * BLAS-backed path, both against a naive double-precision reference. */
#include <stdlib.h>

#include "check.h"
#include "core/blas.h"
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

int main(void)
{
    RUN(small_kernels_match_reference);
    RUN(small_kernels_alpha_beta);
    RUN(small_nn_paths_agree);
    RUN(dispatch_both_paths);
    RUN(nn_and_tn_match_reference);
    return CHECK_DONE();
}
