/* core/blas.c — OpenBLAS wrapper; nothing else in darkserve includes cblas.h. */
#include "core/blas.h"

#include <cblas.h>

void core_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
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
