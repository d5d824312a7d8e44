/* core/kernels/vexp.c — see core/kernels/vexp.h.
 *
 * e^y = 2^k e^r with k = round(y log2 e) and r = y - k ln 2 (ln 2 in two
 * parts, so r is exact to ~1 ulp for |k| <= 126), |r| <= ln 2 / 2; e^r by a
 * degree-6 polynomial (Taylor coefficients: the truncation error at |r| =
 * 0.347 is below 2^-27), evaluated by Horner's rule with fused
 * multiply-adds; 2^k by adding k to the exponent field (k in [-126, 127]
 * once the argument is >= CORE_EXP_MIN_ARG and <= 0 + rounding; larger
 * arguments, which a softmax shifted by its maximum never has, are clamped
 * to e^88).
 */
#include "core/kernels/vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/kernels/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define VEXP_X86 1
#endif

static const float LOG2E = 1.44269504088896341f;
static const float LN2_HI = 0.693145751953125f;     /* 12 significant bits: k * LN2_HI exact */
static const float LN2_LO = 1.428606765330187045e-06f;
static const float MAX_ARG = 88.0f; /* k <= 127: 2^k stays a normal float */
static const float C2 = 0.5f, C3 = 1.0f / 6, C4 = 1.0f / 24, C5 = 1.0f / 120, C6 = 1.0f / 720;

static float exp_one(float y)
{
    if (!(y >= CORE_EXP_MIN_ARG)) /* -inf, NaN-free by contract, and tiny */
        return 0.0f;
    if (y > MAX_ARG)
        y = MAX_ARG;
    const float k = nearbyintf(y * LOG2E);
    const float r = fmaf(-k, LN2_LO, fmaf(-k, LN2_HI, y));
    float p = fmaf(C6, r, C5);
    p = fmaf(p, r, C4);
    p = fmaf(p, r, C3);
    p = fmaf(p, r, C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)k * (1 << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

static void glu_generic(float *g, const float *u, int64_t n, int gelu);

/* GELU's tanh approximation as a logistic: x/2 (1 + tanh z) = x / (1 + e^(-2z)),
 * z = sqrt(2/pi) (x + 0.044715 x^3); the argument -2z, the same float
 * operations (no fused ones) on every path. */
#define GELU_A 0.044715f
#define GELU_M (-1.5957691216057308f) /* -2 sqrt(2/pi) */

static void exp_generic(const float *x, int64_t n, double s, float *out)
{
    for (int64_t j = 0; j < n; j++)
        out[j] = x[j] == -INFINITY ? 0.0f : exp_one((float)((double)x[j] - s));
}

#ifdef VEXP_X86
#define VEXP_FN __attribute__((target("avx512f,avx512dq,avx512vl,fma")))

/* 8 arguments: x - s in double, rounded to float; -inf stays -inf. */
VEXP_FN static inline __m256 args8(const float *x, __mmask8 m, __m512d s)
{
    const __m256 v = _mm256_maskz_loadu_ps(m, x);
    return _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_cvtps_pd(v), s));
}

/* exp_one on 16 arguments (0 below CORE_EXP_MIN_ARG and for -inf). */
VEXP_FN static inline __m512 exp16(__m512 y0)
{
    const __mmask16 live = _mm512_cmp_ps_mask(y0, _mm512_set1_ps(CORE_EXP_MIN_ARG), _CMP_GE_OQ);
    const __m512 y = _mm512_min_ps(y0, _mm512_set1_ps(MAX_ARG));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), k),
                                     _mm512_set1_ps(LN2_LO),
                                     _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), k),
                                                     _mm512_set1_ps(LN2_HI), y));
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(C6), r, _mm512_set1_ps(C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23);
    const __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
    return _mm512_maskz_mov_ps(live, v);
}

static inline __mmask16 first_lanes(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

VEXP_FN static void exp_avx512(const float *x, int64_t n, double s, float *out)
{
    const __m512d sv = _mm512_set1_pd(s);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __m512 y0 = _mm512_insertf32x8(
            _mm512_castps256_ps512(args8(x + j, (__mmask8)m, sv)),
            args8(x + j + 8, (__mmask8)(m >> 8), sv), 1);
        _mm512_mask_storeu_ps(out + j, m, exp16(y0));
    }
}

/* glu_generic's arithmetic 16 lanes at a time: the same argument and
 * exponential (exp16 is exp_one), then the division and product, each
 * correctly rounded in either. */
VEXP_FN static void glu_avx512(float *g, const float *u, int64_t n, int gelu)
{
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    const __m512 ga = _mm512_set1_ps(GELU_A), gm = _mm512_set1_ps(GELU_M);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + j);
        const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(gv, gv), gv);
        const __m512 e = exp16(gelu ? _mm512_mul_ps(gm, _mm512_add_ps(gv, _mm512_mul_ps(ga, x3)))
                                    : _mm512_xor_ps(gv, sign));
        const __m512 v = _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)),
                                       _mm512_maskz_loadu_ps(m, u + j));
        _mm512_mask_storeu_ps(g + j, m, v);
    }
}

/* ---- AVX2 + FMA: exp16's operations 8 lanes at a time (the same bits);
 * the last n % 8 elements through exp_one, which is the same function. */
#define VEXP2_FN __attribute__((target("avx2,fma")))

VEXP2_FN static inline __m256 exp8(__m256 y0)
{
    const __m256 live = _mm256_cmp_ps(y0, _mm256_set1_ps(CORE_EXP_MIN_ARG), _CMP_GE_OQ);
    const __m256 y = _mm256_min_ps(y0, _mm256_set1_ps(MAX_ARG));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nk = _mm256_sub_ps(_mm256_setzero_ps(), k);
    const __m256 r = _mm256_fmadd_ps(nk, _mm256_set1_ps(LN2_LO),
                                     _mm256_fmadd_ps(nk, _mm256_set1_ps(LN2_HI), y));
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(C6), r, _mm256_set1_ps(C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
    const __m256 v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_and_ps(v, live);
}

VEXP2_FN static void exp_avx2(const float *x, int64_t n, double s, float *out)
{
    const __m256d sv = _mm256_set1_pd(s);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        /* x - s in double, rounded to float (-inf stays -inf) */
        const __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j)), sv));
        const __m128 hi =
            _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + j + 4)), sv));
        _mm256_storeu_ps(out + j, exp8(_mm256_set_m128(hi, lo)));
    }
    exp_generic(x + j, n - j, s, out + j);
}

VEXP2_FN static void glu_avx2(float *g, const float *u, int64_t n, int gelu)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 ga = _mm256_set1_ps(GELU_A), gm = _mm256_set1_ps(GELU_M);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 gv = _mm256_loadu_ps(g + j);
        const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
        const __m256 e = exp8(gelu ? _mm256_mul_ps(gm, _mm256_add_ps(gv, _mm256_mul_ps(ga, x3)))
                                   : _mm256_xor_ps(gv, sign));
        const __m256 v =
            _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + j));
        _mm256_storeu_ps(g + j, v);
    }
    glu_generic(g + j, u + j, n - j, gelu);
}
#endif

/* g[j] / (1 + e^a) * u[j], a = -g[j] (SiLU) or GELU's -2z. */
static void glu_generic(float *g, const float *u, int64_t n, int gelu)
{
    for (int64_t j = 0; j < n; j++) {
        const float x = g[j], x3 = x * x * x;
        const float a = gelu ? GELU_M * (x + GELU_A * x3) : -x;
        g[j] = x / (1.0f + exp_one(a)) * u[j];
    }
}

static _Atomic int force_generic;

void core_exp_force_generic(int on)
{
    atomic_store(&force_generic, on != 0);
}

#ifdef VEXP_X86
/* The AVX2 paths run where the kernel path chosen is AVX2 (AVX2, FMA and
 * F16C; the AVX-512 path prefers its own) and tests do not force the
 * portable ones. */
static int use_avx2(void)
{
    return !atomic_load_explicit(&force_generic, memory_order_relaxed) &&
           core_qdot_isa() == CORE_QDOT_AVX2;
}

/* The AVX-512 paths run: the CPU has them, the kernel path chosen
 * (core_qdot_isa: DARKSERVE_ISA, core_qdot_force_isa) is AVX-512, and tests
 * do not force the portable ones. */
static int use_avx512(void)
{
    return !atomic_load_explicit(&force_generic, memory_order_relaxed) &&
           core_qdot_isa() == CORE_QDOT_AVX512VNNI &&
           core_cpu_has(CORE_CPU_AVX512F | CORE_CPU_AVX512DQ | CORE_CPU_AVX512VL);
}
#endif

void core_exp_shifted(const float *x, int64_t n, double s, float *out)
{
#ifdef VEXP_X86
    if (use_avx512()) {
        exp_avx512(x, n, s, out);
        return;
    }
    if (use_avx2()) {
        exp_avx2(x, n, s, out);
        return;
    }
#endif
    exp_generic(x, n, s, out);
}

static void glu_mul(float *g, const float *u, int64_t n, int gelu)
{
#ifdef VEXP_X86
    if (use_avx512()) {
        glu_avx512(g, u, n, gelu);
        return;
    }
    if (use_avx2()) {
        glu_avx2(g, u, n, gelu);
        return;
    }
#endif
    glu_generic(g, u, n, gelu);
}

void core_silu_mul_f32(float *g, const float *u, int64_t n)
{
    glu_mul(g, u, n, 0);
}

void core_gelu_mul_f32(float *g, const float *u, int64_t n)
{
    glu_mul(g, u, n, 1);
}

double core_sum_f32(const float *x, int64_t n)
{
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++)
            s[l] += (double)x[j + l];
    for (; j < n; j++)
        s[0] += (double)x[j];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

double core_dot_f32(const float *a, const float *b, int64_t n)
{
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++)
            s[l] += (double)a[j + l] * b[j + l];
    for (; j < n; j++)
        s[0] += (double)a[j] * b[j];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

float core_max_f32(const float *x, int64_t n)
{
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int l = 0; l < 4; l++)
            m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++)
        m[0] = x[j] > m[0] ? x[j] : m[0];
    const float a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
    return a > b ? a : b;
}

/* core_first_unbounded_f32 from element j on, one at a time. */
static int64_t unbounded_from(const float *x, int64_t j, int64_t n)
{
    for (; j < n; j++)
        if (!(x[j] < INFINITY))
            return j;
    return n;
}

#ifdef VEXP_X86
VEXP_FN static int64_t unbounded_avx512(const float *x, int64_t n)
{
    const __m512 inf = _mm512_set1_ps(INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        /* not less than +inf, unordered: NaN or +inf */
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), inf, _CMP_NLT_UQ);
        if (k)
            return j + __builtin_ctz((unsigned)k);
    }
    return unbounded_from(x, j, n);
}
#endif

int64_t core_first_unbounded_f32(const float *x, int64_t n)
{
#ifdef VEXP_X86
    if (use_avx512())
        return unbounded_avx512(x, n);
#endif
    return unbounded_from(x, 0, n);
}
