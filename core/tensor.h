/* core/tensor.h — GGML tensor types: sizes, dequantization, reference dots.
 *
 * Type ids are GGUF's (ggml_type) numbering, so a value read from a file maps
 * directly. Quantized types are stored in blocks of core_ttype_block_elems()
 * values taking core_ttype_block_bytes() bytes; a row of n values must have n a
 * multiple of the block size. Everything here is pure (no allocation, no I/O).
 */
#ifndef DARKSERVE_CORE_TENSOR_H
#define DARKSERVE_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef enum core_ttype {
    CORE_TTYPE_F32 = 0,
    CORE_TTYPE_F16 = 1,
    CORE_TTYPE_Q4_0 = 2,
    CORE_TTYPE_Q4_1 = 3,
    CORE_TTYPE_Q5_0 = 6,
    CORE_TTYPE_Q5_1 = 7,
    CORE_TTYPE_Q8_0 = 8,
    CORE_TTYPE_Q8_1 = 9,
    CORE_TTYPE_Q2_K = 10,
    CORE_TTYPE_Q3_K = 11,
    CORE_TTYPE_Q4_K = 12,
    CORE_TTYPE_Q5_K = 13,
    CORE_TTYPE_Q6_K = 14,
    CORE_TTYPE_Q8_K = 15,
    CORE_TTYPE_BF16 = 30,
    CORE_TTYPE_COUNT_ = 40 /* upper bound on ids we know the name of */
} core_ttype_t;

/* Name as GGUF tools print it ("Q4_1"), or "unknown". */
const char *core_ttype_name(int type);
/* 1 when dequantization of this type is implemented, else 0. */
int core_ttype_supported(int type);
/* Values per block (1 for F32/F16/BF16), 0 for an unknown type. */
int64_t core_ttype_block_elems(int type);
/* Bytes per block, 0 for an unknown type. */
size_t core_ttype_block_bytes(int type);
/* Bytes of n values of this type into *out. CORE_EINVAL when n is not a
 * multiple of the block size or the type is unknown, CORE_ERANGE on overflow. */
int core_ttype_row_bytes(int type, int64_t n, size_t *out);

/* fp16 / bf16 <-> fp32 (IEEE, round-to-nearest-even on the way down). */
float core_fp16_to_fp32(uint16_t h);
uint16_t core_fp32_to_fp16(float f);
float core_bf16_to_fp32(uint16_t h);
uint16_t core_fp32_to_bf16(float f);

/* Dequantizes n values (n a multiple of the block size) from src (borrowed,
 * core_ttype_row_bytes(type, n) bytes) into dst (caller-owned, n floats). */
int core_dequantize(int type, const void *src, float *dst, int64_t n, core_error_t *err);

/* Naive reference: sum_i dequant(row)[i] * x[i] over n values, accumulated in
 * double. The oracle the optimized kernels are tested against. */
double core_dot_ref(int type, const void *row, const float *x, int64_t n);

#endif
