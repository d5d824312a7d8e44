/* core/kernels/blas.h — the only door to BLAS. Row-major single-precision GEMM.
 *
 * core_gemm_nt: C[m][n] = alpha * A[m][k] · B[n][k]ᵀ + beta * C  (weights stored
 * as [out][in] rows, the GGUF layout, are B here). core_gemm_nn: C = A·B with
 * B[k][n]. lda/ldb/ldc are row strides in floats.
 */
#ifndef DARKSERVE_CORE_BLAS_H
#define DARKSERVE_CORE_BLAS_H

#include <stdint.h>

void core_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void core_gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void core_gemm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Depth up to which core_gemm_tn adds rank-1 updates itself (no sgemm). */
#define CORE_GEMM_SMALL_K 4
/* Rows up to which core_gemm_nt and core_gemm_nn use the small kernels below
 * instead of sgemm (whose packing costs more than such products). */
#define CORE_GEMM_SMALL_M 8
/* core_gemm_nt without BLAS, for few rows of A (decode): each B row is read
 * once. beta == 0 overwrites C (NaN in C does not propagate). */
void core_gemm_nt_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* core_gemm_nn without BLAS for few rows of A: each element summed in k
 * order; beta == 0 overwrites C. Any m (taken CORE_GEMM_SMALL_M rows at a time). */
void core_gemm_nn_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Attention's decode products with B in half precision (core/kernels/half.h): for
 * up to 4 rows of A on a CPU with AVX-512F and F16C (nt: k a multiple of
 * 16; nn: n a multiple of 64), bit for bit what core_gemm_nt_small /
 * core_gemm_nn_small give on B converted to floats (core_half_unpack),
 * reading half the bytes. 1 when they ran; 0, with nothing written, for
 * another shape or CPU or under core_gemm_small_force_generic: the caller
 * converts B and calls the float entries. */
int core_gemm_nt_half_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc);
int core_gemm_nn_half_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc);
/* The same with B in 8-bit rows (core/kernels/kvrow.h, CORE_KVROW_Q8) rb
 * bytes apart: nt's B rows are the keys [n][k], nn's the values [k][n];
 * bit for bit what the float entries give on B converted by
 * core_kvrow_unpack, reading about a quarter of the bytes. Same shapes and
 * return values as the half entries, on AVX-512F and on AVX2 + FMA (also
 * the forced AVX2 path); 0 on the portable path. */
int core_gemm_nt_q8_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const void *b, int64_t rb, float beta, float *c,
                          int64_t ldc);
int core_gemm_nn_q8_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const void *b, int64_t rb, float beta, float *c,
                          int64_t ldc);
/* Nonzero makes the small kernels take their portable C path, as on a CPU
 * without AVX2 (tests use it to check both); 0 lets the CPU choose again. */
void core_gemm_small_force_generic(int on);
/* Name of the kernel set OpenBLAS chose ("Prescott", "SkylakeX", ...). */
const char *core_blas_corename(void);
/* When OpenBLAS fell back to a generic kernel set although the CPU has
 * AVX2/AVX-512, the OPENBLAS_CORETYPE value that selects the right one
 * ("SkylakeX", "Haswell"); NULL otherwise. OpenBLAS reads that variable only
 * when it is loaded, so a program that wants it sets it and re-executes
 * itself (server/main.c does). */
const char *core_blas_better_coretype(void);
/* Number of BLAS threads (0 = leave the library default). core_model_load
 * sets 1: the model's pool is its parallelism. */
void core_blas_set_threads(int n);
/* Threads a BLAS call may use now. */
int core_blas_threads(void);

#endif
