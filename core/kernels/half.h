/* core/kernels/half.h — rows of IEEE half precision (binary16).
 *
 * The linear attention kinds keep their window and sinks as halves
 * (core/attn/attn_linear.c): half the bytes a decode step streams per sequence
 * and half of each session's window. Every key and value is rounded once,
 * on entry, so whatever reads it later (the exact window, the keys entering
 * the linear state, a saved blob) sees the same number however the tokens
 * were chunked.
 *
 * Conversions run with F16C when core_qdot_isa() is AVX2 or higher (that
 * ISA requires F16C), else in portable C (core_fp32_to_fp16 and
 * core_fp16_to_fp32, core/tensor.h); both give the same bits for every
 * non-NaN input. Unpacking is core_qdot_dequant of F16 values. Pointers
 * are borrowed; n ≥ 0.
 */
#ifndef DARKSERVE_CORE_HALF_H
#define DARKSERVE_CORE_HALF_H

#include <stdint.h>

/* Largest finite half. */
#define CORE_HALF_MAX 65504.0f

/* h[i] = x[i] rounded to nearest, ties to even; finite values beyond
 * ±CORE_HALF_MAX saturate to it (a finite key stays finite), infinities stay
 * infinite and NaN stays NaN (its payload is not kept). */
void core_half_pack(const float *x, uint16_t *h, int64_t n);
/* x[i] = h[i], exact. */
void core_half_unpack(const uint16_t *h, float *x, int64_t n);
/* y[i] = x[i] rounded as core_half_pack rounds it, as a float (y may be x). */
void core_half_round(const float *x, float *y, int64_t n);

#endif
