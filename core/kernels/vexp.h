/* core/kernels/vexp.h — exponentials of many floats at once, for softmax weights,
 * and the sums in double around them.
 *
 * core_exp_shifted(x, n, s, out): out[j] = e^(x[j] - s) for the n floats x
 * (x[j] - s formed in double, then rounded to float), 0 where x[j] is -inf or
 * x[j] - s < CORE_EXP_MIN_ARG. One polynomial on every path: the AVX-512
 * kernel, the AVX2 + FMA one (on the AVX2 kernel path, core_qdot_isa) and
 * the portable one (C with fmaf) perform the same correctly rounded
 * operations per element, so they give the same bits, whatever n and
 * wherever an element sits. Relative error at most CORE_EXP_MAX_REL_ERR of
 * the exact e^(rounded argument) (tests/unit/test_core_vexp.c checks both
 * against libm's exp in double).
 */
#ifndef DARKSERVE_CORE_VEXP_H
#define DARKSERVE_CORE_VEXP_H

#include <stdint.h>

/* Below this argument the result is 0 (e^-87 is ~1.6e-38, the smallest
 * normal float's order: a softmax weight that small next to the largest, 1,
 * is nothing). */
#define CORE_EXP_MIN_ARG (-87.0f)
#define CORE_EXP_MAX_REL_ERR 3e-7

void core_exp_shifted(const float *x, int64_t n, double s, float *out);
/* Σ x[j] in double over n floats (softmax weights' denominators), in four
 * independent chains: a single chain waits on every addition's latency.
 * The order is fixed by n alone, so the bits do not depend on the CPU. */
/* g[j] = silu(g[j]) · u[j] = g[j] / (1 + e^(−g[j])) · u[j] for n floats
 * (SwiGLU), the exponential core_exp_shifted's; the same bits on every
 * path. */
void core_silu_mul_f32(float *g, const float *u, int64_t n);
/* g[j] = gelu(g[j]) · u[j] for n floats (GeGLU, Gemma), GELU's tanh
 * approximation x/2 · (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) computed as
 * x / (1 + e^(-2z)) with core_exp_shifted's exponential; the same bits on
 * every path. */
void core_gelu_mul_f32(float *g, const float *u, int64_t n);
double core_sum_f32(const float *x, int64_t n);
/* The largest of n floats (−inf for n = 0; NaN terms skipped), in four
 * chains likewise. */
float core_max_f32(const float *x, int64_t n);
/* The index of the first x[j] that is NaN or +inf (both fail x < +inf), n
 * when there is none (logits a sampler must refuse: a whole vocabulary per
 * token, 16 lanes a compare on AVX-512). */
int64_t core_first_unbounded_f32(const float *x, int64_t n);
/* Σ a[j]·b[j] in double (a norm's sum of squares, a denominator's dot
 * product), in four chains likewise. */
double core_dot_f32(const float *a, const float *b, int64_t n);
/* Tests: nonzero forces the portable path; 0 lets the CPU choose. */
void core_exp_force_generic(int on);

#endif
