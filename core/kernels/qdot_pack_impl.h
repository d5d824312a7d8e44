/* core/kernels/qdot_pack_impl.h — private to the packed-weight kernels: the
 * AVX2 kernels (core/kernels/qdot_pack_avx2.c) and the aarch64 NEON ones
 * (core/kernels/qdot_pack_neon.c) that core/kernels/qdot_pack.c dispatches
 * to when the chosen ISA is CORE_QDOT_AVX2, CORE_QDOT_NEON or
 * CORE_QDOT_NEON_DOTPROD. Declared on every machine, each defined on its own.
 *
 * They read the layout core_q8_pack writes (described at the top of
 * qdot_pack.c) and do, lane by lane, the float operations of the AVX-512
 * kernels in the same order, so every ISA that packs gives the same bits
 * (tests/unit/test_core_qdot_q8.c checks it). Arguments are checked by the
 * public entries; these take them as valid.
 */
#ifndef DARKSERVE_CORE_QDOT_PACK_IMPL_H
#define DARKSERVE_CORE_QDOT_PACK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/kernels/qdot.h"

/* Bytes of one block of a group of CORE_Q8_PACK_ROWS rows (the layout). */
enum { CORE_Q8_PACK_GB_Q4 = 320, CORE_Q8_PACK_GB_Q8 = 576 };

/* core_q8_matmul_packed on AVX2: type Q4_0, Q4_1 or Q8_0; pk, c as there. */
void core_q8_matmul_packed_avx2(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                                const unsigned char *pk, float beta, float *c, int64_t ldc);
/* core_qmatmul_packed on AVX2 (j0 a multiple of 16, panel 64-byte aligned). */
void core_qmatmul_packed_avx2(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                              const float *a, int64_t lda, const unsigned char *pk, float *panel,
                              float beta, float *c, int64_t ldc);

/* The same two on aarch64; dotprod != 0 multiplies with SDOT (the caller
 * has checked the CPU has it), 0 with widening multiplies: the same bits. */
void core_q8_matmul_packed_neon(int dotprod, int type, const core_q8_act_t *qa, int64_t j0,
                                int64_t j1, const unsigned char *pk, float beta, float *c,
                                int64_t ldc);
void core_qmatmul_packed_neon(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                              const float *a, int64_t lda, const unsigned char *pk, float *panel,
                              float beta, float *c, int64_t ldc);

#endif
