/* core/kernels/half.c — half-precision rows (core/kernels/half.h): portable C and F16C. */
#include "core/kernels/half.h"

#include <math.h>

#include "core/kernels/qdot.h"
#include "core/tensor.h"

#if defined(__x86_64__) || defined(__i386__)
#define HALF_X86 1
#include <immintrin.h>
#endif

static float saturate(float v)
{
    return v > CORE_HALF_MAX && v < INFINITY    ? CORE_HALF_MAX
           : v < -CORE_HALF_MAX && v > -INFINITY ? -CORE_HALF_MAX
                                                 : v;
}

static void pack_c(const float *x, uint16_t *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        h[i] = core_fp32_to_fp16(saturate(x[i]));
}

static void round_c(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = core_fp16_to_fp32(core_fp32_to_fp16(saturate(x[i])));
}

#ifdef HALF_X86
#define F16C_FN __attribute__((target("avx2,f16c")))

/* Saturates finite values to ±CORE_HALF_MAX, leaving ±inf and NaN: min and
 * max return their second operand when either is NaN, so x goes second;
 * an infinity is restored from x. */
F16C_FN static inline __m256 saturate8(__m256 x)
{
    const __m256 mx = _mm256_set1_ps(CORE_HALF_MAX), inf = _mm256_set1_ps(INFINITY);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 c = _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), mx), _mm256_min_ps(mx, x));
    __m256 is_inf = _mm256_cmp_ps(_mm256_and_ps(x, absmask), inf, _CMP_EQ_OQ);
    return _mm256_blendv_ps(c, x, is_inf);
}

F16C_FN static void pack_f16c(const float *x, uint16_t *h, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(h + i),
                         _mm256_cvtps_ph(saturate8(_mm256_loadu_ps(x + i)), _MM_FROUND_TO_NEAREST_INT));
    pack_c(x + i, h + i, n - i);
}

F16C_FN static void round_f16c(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(saturate8(_mm256_loadu_ps(x + i)),
                                                                 _MM_FROUND_TO_NEAREST_INT)));
    round_c(x + i, y + i, n - i);
}
#endif

#ifdef HALF_X86
static int use_f16c(void)
{
    return core_qdot_isa() == CORE_QDOT_AVX2 || core_qdot_isa() == CORE_QDOT_AVX512VNNI;
}
#endif

void core_half_pack(const float *x, uint16_t *h, int64_t n)
{
#ifdef HALF_X86
    if (use_f16c()) {
        pack_f16c(x, h, n);
        return;
    }
#endif
    pack_c(x, h, n);
}

void core_half_unpack(const uint16_t *h, float *x, int64_t n)
{
    /* the F16 weights' dequantizer: F16C in groups of 32, the rest in C */
    core_qdot_dequant(CORE_TTYPE_F16, h, x, n);
}

void core_half_round(const float *x, float *y, int64_t n)
{
#ifdef HALF_X86
    if (use_f16c()) {
        round_f16c(x, y, n);
        return;
    }
#endif
    round_c(x, y, n);
}
