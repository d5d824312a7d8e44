/* core/blas.c — the one door to BLAS; nothing else in darkserve includes
 * cblas.h.
 *
 * core_gemm_nt with few rows (m <= CORE_GEMM_SMALL_M, the decode case: one
 * row per decoding sequence) does not go to OpenBLAS: sgemm packs the whole
 * B operand (a weight matrix) on every call, which for one row costs more
 * than the product itself (measured: 76% of decode time in
 * sgemm_incopy). The small-m kernel streams each B row once and dots it with
 * every A row while it is in L1, with AVX2/FMA when the CPU has them.
 */
#include "core/blas.h"

#include <cblas.h>
#include <strings.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CORE_BLAS_X86 1
#endif

void core_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= CORE_GEMM_SMALL_M) {
        core_gemm_nt_small(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void core_gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* C[m][n] = alpha * A[k][m]ᵀ · B[k][n] + beta * C */
void core_gemm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void core_blas_set_threads(int n)
{
    if (n > 0)
        openblas_set_num_threads(n);
}

const char *core_blas_corename(void)
{
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
}

const char *core_blas_better_coretype(void)
{
    /* OpenBLAS 0.3.21 (Debian bookworm) does not know CPUs newer than it and
     * falls back to its SSE3 "Prescott" kernels, about 4x slower for prefill
     * here (measured on an AVX-512 Xeon). Only a generic fallback is
     * overridden; a core OpenBLAS identified is left alone. */
    static const char *const generic[] = {"prescott", "core2", "nehalem", "katmai", "coppermine",
                                          "northwood", "banias", "unknown"};
    const char *cur = core_blas_corename();
    int is_generic = 0;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        if (strcasecmp(cur, generic[i]) == 0)
            is_generic = 1;
    if (!is_generic)
        return NULL;
#ifdef CORE_BLAS_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

/* ---- small-m kernel ---- */

static float dot_generic(const float *x, const float *y, int64_t k)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
        s0 += x[i] * y[i];
        s1 += x[i + 1] * y[i + 1];
        s2 += x[i + 2] * y[i + 2];
        s3 += x[i + 3] * y[i + 3];
    }
    for (; i < k; i++)
        s0 += x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}

#ifdef CORE_BLAS_X86
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *x, const float *y, int64_t k)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < k; i++)
        r += x[i] * y[i];
    return r;
}
#endif

typedef float (*dot_fn)(const float *, const float *, int64_t);

static dot_fn pick_dot(void)
{
#ifdef CORE_BLAS_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return dot_avx2;
#endif
    return dot_generic;
}

void core_gemm_nt_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    static dot_fn dot; /* benign race: every thread computes the same value */
    if (!dot)
        dot = pick_dot();
    for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * ldb;
        for (int64_t i = 0; i < m; i++) {
            float v = alpha * dot(a + i * lda, bj, k);
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? v : v + beta * *cij;
        }
    }
}
