/* core/qdot.h — matrix products against quantized weight rows, read in place.
 *
 * Decode multiplies a few activation rows by every weight matrix, so it is
 * bound by reading the weights. These kernels read the GGUF blocks directly
 * (Q4_1 is ~5 bits per weight instead of 32) and dequantize in registers.
 *
 * Error contract (what tests/unit/test_core_qdot.c checks against
 * core_dot_ref): every output is within gamma(k/4 + 8) * S of the exact sum,
 * gamma(n) = n u / (1 - n u), u = 2^-24, S = sum_i |y_i x_i| with y the
 * values core_dequantize gives; for types with a block offset (Q4_1: y = d q +
 * m) the one-row kernel factors d and m out of the block sums, so there S =
 * sum_i (|y_i| + 2 |m_b|) |x_i| (>= sum_i (|d q_i| + |m_b|) |x_i|).
 *
 * No allocation, no I/O; global state is a cached CPU-feature probe and a
 * 256 KiB fp16->f32 table filled once (pthread_once). Thread-safe.
 */
#ifndef DARKSERVE_CORE_QDOT_H
#define DARKSERVE_CORE_QDOT_H

#include <stddef.h>
#include <stdint.h>

typedef enum core_qdot_isa {
    CORE_QDOT_GENERIC = 0, /* portable C */
    CORE_QDOT_AVX2 = 1     /* AVX2 + FMA, chosen at run time */
} core_qdot_isa_t;

/* 1 when core_qmatmul_nt accepts weights of this type: the dequantizable
 * block types (block of 32 or 256 values); 0 for F32/F16/BF16 and unknown. */
int core_qdot_supported(int type);
/* 1 when this type has a dedicated SIMD kernel (Q4_0, Q4_1, Q8_0); the other
 * supported types go through a dequantize-one-block-then-FMA path. */
int core_qdot_has_fast_kernel(int type);
/* The best ISA this CPU runs. */
core_qdot_isa_t core_qdot_best_isa(void);

/* C[m][n] = A[m][k] · Wᵀ + beta * C, W being n rows of k values of the given
 * type, row j starting at (const char *)w + j * row_bytes (row_bytes >=
 * core_ttype_row_bytes(type, k)). a (borrowed, [m][lda] floats), w
 * (borrowed), c (caller-owned, [m][ldc] floats). beta == 0 overwrites C (NaN
 * in C does not propagate). Preconditions (caller's, not checked in the hot
 * path): core_qdot_supported(type), k a multiple of the type's block, m, n >=
 * 0. Best ISA of this CPU. */
void core_qmatmul_nt(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const void *w, size_t row_bytes, float beta, float *c, int64_t ldc);
/* Same with an explicit ISA (for tests comparing paths). Returns 0, or
 * CORE_EUNSUPPORTED when this CPU cannot run isa (nothing is written), or
 * CORE_EINVAL when type is not supported or k is not a multiple of its
 * block. */
int core_qmatmul_nt_isa(core_qdot_isa_t isa, int type, int64_t m, int64_t n, int64_t k,
                        const float *a, int64_t lda, const void *w, size_t row_bytes, float beta,
                        float *c, int64_t ldc);

#endif
