/* core/kernels/qdot_neon_impl.h — the aarch64 kernels of the quantized
 * products (core/kernels/qdot_neon.c), private to core/kernels:
 * core/kernels/qdot_q8.c (integer path) and core/kernels/qdot.c (f32 path)
 * dispatch to them for CORE_QDOT_NEON and CORE_QDOT_NEON_DOTPROD. The API
 * and the error contracts are core/kernels/qdot.h's. Declared on every
 * machine, defined on aarch64 only.
 */
#ifndef DARKSERVE_CORE_QDOT_NEON_IMPL_H
#define DARKSERVE_CORE_QDOT_NEON_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/kernels/qdot.h"

/* The function attributes of the SDOT kernels (here and in
 * core/kernels/qdot_pack_neon.c): gcc's arm_neon.h declares SDOT for
 * armv8.2-a+dotprod, clang's for the feature alone. */
#ifdef __clang__
#define QDOT_NEON_DP_TARGET "dotprod"
#else
#define QDOT_NEON_DP_TARGET "arch=armv8.2-a+dotprod"
#endif

/* core_q8_matmul on aarch64: dotprod != 0 multiplies with SDOT (the caller
 * has checked that the CPU has it), 0 with widening multiplies (any armv8-a
 * core). qa, w borrowed; c caller-owned. Preconditions as core_q8_matmul's:
 * core_q8_supported(type), qa->k a multiple of the type's block, j0 <= j1. */
void core_q8_matmul_neon(int dotprod, int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                         const void *w, size_t row_bytes, float beta, float *c, int64_t ldc);

/* core_q8_quantize on aarch64: the same bytes as the scalar reference. qa
 * caller-owned (laid out by core_q8_act_init), a borrowed. */
void core_q8_quantize_neon(core_q8_act_t *qa, const float *a, int64_t lda);

/* The f32 path on aarch64, for Q4_0, Q4_1, Q8_0, F16 and BF16 weights (the
 * types core_qdot_has_fast_kernel names): core_qmatmul_nt's product and
 * core_qdot_dequant's values (n values in groups of 32, an F16/BF16 rest
 * through core_dequantize), with their preconditions. Each returns 1 when
 * it took the type, 0 (nothing written) for another type. Arguments as
 * core_qmatmul_nt's and core_qdot_dequant's. */
int core_qmatmul_nt_neon(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const void *w, size_t row_bytes, float beta, float *c, int64_t ldc);
int core_qdot_dequant_neon(int type, const void *src, float *dst, int64_t n);

#endif
