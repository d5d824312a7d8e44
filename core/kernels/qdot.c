/* core/kernels/qdot.c — products of f32 activation rows with quantized (or F16,
 * BF16) weight rows.
 *
 * Every weight block is dequantized once (in registers for Q4_0/Q4_1/Q8_0
 * and for runs of 32 F16/BF16 values, into a one-block buffer for the other
 * types) and multiplied with all m activation rows of the current chunk, so
 * a weight byte is read once per call. With several rows the dequantized
 * values are formed with the same operations as core/tensor.c (product, then
 * sum; no FMA there); with one row (decode) the block scale is factored out
 * of the block's sum instead, which saves the per-value multiply and add on
 * the busiest execution ports (F16/BF16 have no scale: their values convert
 * exactly, F16 with F16C, BF16 with a 16-bit shift).
 *
 * AVX2 is opt-in per function (the build targets x86-64-v2 on x86-64) and
 * picked at run time through core/kernels/cpu.h; the aarch64 NEON kernels of
 * the fast types are in core/kernels/qdot_neon.c. The integer path
 * is in core/kernels/qdot_q8.c;
 * the pool runner for both is at the end of this file.
 */
#include "core/kernels/qdot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/err.h"
#include "core/kernels/qdot_neon_impl.h"
#include "core/tensor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QDOT_X86 1
#endif

enum {
    QDOT_MR = 8,         /* activation rows per chunk: one weight read serves them all */
    QDOT_MAX_BLCK = 256, /* largest block (K-quants) */
    QDOT_SX_MAX = 1024   /* blocks per row (k <= 32768) the one-row kernel keeps sums for */
};

/* F16 and BF16: "blocks" of one value, read in runs of 32 (64 bytes) by the
 * SIMD kernels, any k. */
static inline int is_half(int type)
{
    return type == CORE_TTYPE_F16 || type == CORE_TTYPE_BF16;
}

int core_qdot_supported(int type)
{
    if (is_half(type))
        return 1;
    if (!core_ttype_supported(type))
        return 0;
    const int64_t b = core_ttype_block_elems(type); /* F32: 1 */
    return b == 32 || b == QDOT_MAX_BLCK;
}

int core_qdot_has_fast_kernel(int type)
{
    return type == CORE_TTYPE_Q4_0 || type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q8_0 ||
           is_half(type);
}

static inline void put(float *c, float v, float beta)
{
    *c = beta == 0.0f ? v : v + beta * *c;
}

/* ---- portable path: one block dequantized, four partial sums per row ---- */

static void qmm_generic(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const int64_t blck = core_ttype_block_elems(type);
    const size_t bb = core_ttype_block_bytes(type);
    /* values dequantized at a time: a block, or up to 256 F16/BF16 values */
    const int64_t run = blck == 1 ? QDOT_MAX_BLCK : blck;
    float y[QDOT_MAX_BLCK]; /* one run, [run] */
    for (int64_t j = 0; j < n; j++) {
        const unsigned char *row = w + (size_t)j * row_bytes;
        for (int64_t r0 = 0; r0 < m; r0 += QDOT_MR) {
            const int mr = m - r0 < QDOT_MR ? (int)(m - r0) : QDOT_MR;
            float s[QDOT_MR][4] = {{0}};
            for (int64_t i = 0; i < k; i += run) {
                const int64_t len = k - i < run ? k - i : run;
                (void)core_dequantize(type, row + (size_t)(i / blck) * bb, y, len, NULL);
                for (int r = 0; r < mr; r++) {
                    const float *x = a + (r0 + r) * lda + i;
                    for (int64_t e = 0; e < len; e++) /* sum e % 4 of the row (run % 4 == 0) */
                        s[r][e & 3] += y[e] * x[e];
                }
            }
            for (int r = 0; r < mr; r++)
                put(c + (r0 + r) * ldc + j, (s[r][0] + s[r][1]) + (s[r][2] + s[r][3]), beta);
        }
    }
}

/* ---- AVX2 / FMA ---- */

#ifdef QDOT_X86
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))

AVX2_INL float hsum8(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* fp16 -> f32 by table: the per-block scales then cost a load instead of
 * shuffles on the port the nibble widening already saturates. */
static float h2f[1 << 16];
static pthread_once_t h2f_once = PTHREAD_ONCE_INIT;

static void h2f_init(void)
{
    for (uint32_t i = 0; i < (1u << 16); i++)
        h2f[i] = core_fp16_to_fp32((uint16_t)i);
}

AVX2_INL float half_tab(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h2f[h];
}

/* 8 F16 (F16C) or BF16 (a shift) values at p as floats: both exact. */
AVX2_INL __m256 half8(int type, const unsigned char *p)
{
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (type == CORE_TTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Bytes of the 32 values deq_block reads: a block, or 32 F16/BF16 values. */
static inline size_t grp_bytes(int type)
{
    return is_half(type) ? 64 : core_ttype_block_bytes(type);
}

/* The 32 values of one block (or 32 F16/BF16 values) as four vectors in
 * element order (written out: loops over small arrays here end up spilled
 * to the stack). */
AVX2_INL void deq_block(int type, const unsigned char *b, __m256 *w0, __m256 *w1, __m256 *w2,
                        __m256 *w3)
{
    if (is_half(type)) {
        *w0 = half8(type, b);
        *w1 = half8(type, b + 16);
        *w2 = half8(type, b + 32);
        *w3 = half8(type, b + 48);
        return;
    }
    const __m256 d = _mm256_set1_ps(half_tab(b));
    if (type == CORE_TTYPE_Q8_0) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 2));
        const __m128i q01 = _mm256_castsi256_si128(q), q23 = _mm256_extracti128_si256(q, 1);
        *w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q01)));
        *w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q01, 8))));
        *w2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q23)));
        *w3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q23, 8))));
        return;
    }
    /* Q4_0 / Q4_1: low nibbles are values 0..15, high nibbles 16..31 */
    const int q41 = type == CORE_TTYPE_Q4_1;
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + (q41 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(v, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    if (!q41) {
        const __m128i eight = _mm_set1_epi8(8);
        lo = _mm_sub_epi8(lo, eight);
        hi = _mm_sub_epi8(hi, eight);
    }
    /* nibbles are small: the signed widening is right for both types */
    *w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    *w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    *w2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    *w3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    if (q41) {
        const __m256 mn = _mm256_set1_ps(half_tab(b + 2));
        *w0 = _mm256_add_ps(*w0, mn);
        *w1 = _mm256_add_ps(*w1, mn);
        *w2 = _mm256_add_ps(*w2, mn);
        *w3 = _mm256_add_ps(*w3, mn);
    }
}

/* One weight row against one activation row (decode), with the block scale
 * factored out: sum_b d_b * (q_b . x_b) [+ m_b * sx_b for Q4_1, sx_b the sum
 * of x over block b]. The integer quants convert to float exactly, so this
 * differs from the dequantize-then-dot order only in rounding (bounded by the
 * header's Q4_1 term). */
AVX2_INL void row1_factored(int type, const float *x, const float *sx, const unsigned char *row,
                            int64_t nb, float beta, float *c)
{
    const int q41 = type == CORE_TTYPE_Q4_1, q80 = type == CORE_TTYPE_Q8_0;
    const size_t bb = q80 ? 34 : q41 ? 20 : 18;
    const int qoff = q41 ? 4 : 2;
    const __m256i mask = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    __m256 acc = _mm256_setzero_ps();
    float ms = 0.0f;
    for (int64_t b = 0; b < nb; b++, x += 32) {
        const unsigned char *blk = row + (size_t)b * bb;
        const unsigned char *qs = blk + qoff;
        __m256i q0, q1, q2, q3;
        if (q80) {
            q0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)qs));
            q1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qs + 8)));
            q2 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qs + 16)));
            q3 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qs + 24)));
        } else {
            /* bytes 0..7 hold values 0..7 (low) and 16..23 (high), 8..15 the rest */
            const __m256i l0 =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)qs));
            const __m256i l1 =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(qs + 8)));
            q0 = _mm256_and_si256(l0, mask);
            q1 = _mm256_and_si256(l1, mask);
            q2 = _mm256_srli_epi32(l0, 4);
            q3 = _mm256_srli_epi32(l1, 4);
            if (!q41) {
                q0 = _mm256_sub_epi32(q0, eight);
                q1 = _mm256_sub_epi32(q1, eight);
                q2 = _mm256_sub_epi32(q2, eight);
                q3 = _mm256_sub_epi32(q3, eight);
            }
        }
        __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q0), _mm256_loadu_ps(x));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_loadu_ps(x + 8), t);
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q2), _mm256_loadu_ps(x + 16), t);
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q3), _mm256_loadu_ps(x + 24), t);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_tab(blk)), t, acc);
        if (q41)
            ms += half_tab(blk + 2) * sx[b];
    }
    put(c, hsum8(acc) + ms, beta);
}

/* The 32 products of w0..w3 (one block) with x[0..32), as 8 lane sums. */
AVX2_INL __m256 dot32(__m256 w0, __m256 w1, __m256 w2, __m256 w3, const float *x)
{
    __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
    t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), t);
    t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), t);
    return _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), t);
}

/* One weight row against MR (1..8, a literal at every call site) activation
 * rows, one accumulator each: the rows are the independent chains. tail:
 * the values past the nb groups of 32 (F16/BF16 rows only), zero-padded to
 * one more group. */
AVX2_INL void row_fast(int type, int MR, const float *a, int64_t lda, const unsigned char *row,
                       int64_t nb, size_t bb, int tail, float beta, float *c, int64_t ldc)
{
    __m256 acc[QDOT_MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256 w0, w1, w2, w3;
        deq_block(type, row + (size_t)b * bb, &w0, &w1, &w2, &w3);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++)
            acc[r] = _mm256_add_ps(acc[r], dot32(w0, w1, w2, w3, a + r * lda + b * 32));
    }
    if (tail > 0) {
        unsigned char wt[64] = {0}; /* [32] F16/BF16 values */
        memcpy(wt, row + (size_t)nb * bb, (size_t)tail * 2);
        __m256 w0, w1, w2, w3;
        deq_block(type, wt, &w0, &w1, &w2, &w3);
        for (int r = 0; r < MR; r++) {
            float xt[32] = {0};
            memcpy(xt, a + r * lda + nb * 32, (size_t)tail * sizeof(float));
            acc[r] = _mm256_add_ps(acc[r], dot32(w0, w1, w2, w3, xt));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
        put(c + r * ldc, hsum8(acc[r]), beta);
}

AVX2_INL void qmm_fast(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / 32;
    const size_t bb = grp_bytes(type);
    const int tail = is_half(type) ? (int)(k % 32) : 0;
    float sx[QDOT_SX_MAX]; /* [nb] per-block sums of the single activation row */
    for (int64_t r0 = 0; r0 < m; r0 += QDOT_MR) {
        const int64_t mr = m - r0 < QDOT_MR ? m - r0 : QDOT_MR;
        const float *ar = a + r0 * lda;
        float *cr = c + r0 * ldc;
        if (mr == 1 && nb <= QDOT_SX_MAX && !is_half(type)) { /* no scale to factor out */
            if (type == CORE_TTYPE_Q4_1) {
                for (int64_t b = 0; b < nb; b++) {
                    const float *x = ar + b * 32;
                    sx[b] = hsum8(_mm256_add_ps(
                        _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                        _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24))));
                }
            }
            for (int64_t j = 0; j < n; j++)
                row1_factored(type, ar, sx, w + (size_t)j * row_bytes, nb, beta, cr + j);
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            const unsigned char *row = w + (size_t)j * row_bytes;
            switch (mr) {
            case 1: row_fast(type, 1, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 2: row_fast(type, 2, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 3: row_fast(type, 3, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 4: row_fast(type, 4, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 5: row_fast(type, 5, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 6: row_fast(type, 6, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            case 7: row_fast(type, 7, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            default: row_fast(type, 8, ar, lda, row, nb, bb, tail, beta, cr + j, ldc); break;
            }
        }
    }
}

/* Separate instantiations so each type's dequantization is branch-free. */
#define QMM_INSTANCE(suffix, TYPE)                                                                 \
    AVX2_FN static void qmm_##suffix##_avx2(int64_t m, int64_t n, int64_t k, const float *a,       \
                                            int64_t lda, const unsigned char *w, size_t row_bytes, \
                                            float beta, float *c, int64_t ldc)                     \
    {                                                                                              \
        qmm_fast(TYPE, m, n, k, a, lda, w, row_bytes, beta, c, ldc);                               \
    }

QMM_INSTANCE(q4_0, CORE_TTYPE_Q4_0)
QMM_INSTANCE(q4_1, CORE_TTYPE_Q4_1)
QMM_INSTANCE(q8_0, CORE_TTYPE_Q8_0)
QMM_INSTANCE(f16, CORE_TTYPE_F16)
QMM_INSTANCE(bf16, CORE_TTYPE_BF16)

/* Other block types: dequantize one block with core/tensor.c, FMA it with
 * every row of the chunk. */
AVX2_FN static void qmm_block_avx2(int type, int64_t m, int64_t n, int64_t k, const float *a,
                                   int64_t lda, const unsigned char *w, size_t row_bytes,
                                   float beta, float *c, int64_t ldc)
{
    const int64_t blck = core_ttype_block_elems(type);
    const size_t bb = core_ttype_block_bytes(type);
    float y[QDOT_MAX_BLCK]; /* one block, [blck] */
    for (int64_t j = 0; j < n; j++) {
        const unsigned char *row = w + (size_t)j * row_bytes;
        for (int64_t r0 = 0; r0 < m; r0 += QDOT_MR) {
            const int mr = m - r0 < QDOT_MR ? (int)(m - r0) : QDOT_MR;
            __m256 acc[QDOT_MR][4];
            for (int r = 0; r < mr; r++)
                for (int e = 0; e < 4; e++)
                    acc[r][e] = _mm256_setzero_ps();
            const unsigned char *blk = row;
            for (int64_t i = 0; i < k; i += blck, blk += bb) {
                (void)core_dequantize(type, blk, y, blck, NULL);
                for (int r = 0; r < mr; r++) {
                    const float *x = a + (r0 + r) * lda + i;
                    for (int64_t e = 0; e < blck; e += 32) {
                        for (int64_t u = 0; u < 4; u++)
                            acc[r][u] = _mm256_fmadd_ps(_mm256_loadu_ps(y + e + 8 * u),
                                                        _mm256_loadu_ps(x + e + 8 * u), acc[r][u]);
                    }
                }
            }
            for (int r = 0; r < mr; r++) {
                __m256 s = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),
                                         _mm256_add_ps(acc[r][2], acc[r][3]));
                put(c + (r0 + r) * ldc + j, hsum8(s), beta);
            }
        }
    }
}
#endif /* QDOT_X86 */

#ifdef QDOT_X86
/* n values in groups of 32 (deq_block); an F16/BF16 rest of n % 32 values
 * through core_dequantize. */
AVX2_FN static void dequant_avx2(int type, const unsigned char *src, float *dst, int64_t n)
{
    const size_t bb = grp_bytes(type);
    const int64_t nb = n / 32;
    for (int64_t b = 0; b < nb; b++) {
        __m256 w0, w1, w2, w3;
        deq_block(type, src + (size_t)b * bb, &w0, &w1, &w2, &w3);
        float *y = dst + b * 32;
        _mm256_storeu_ps(y, w0);
        _mm256_storeu_ps(y + 8, w1);
        _mm256_storeu_ps(y + 16, w2);
        _mm256_storeu_ps(y + 24, w3);
    }
    if (n > nb * 32)
        (void)core_dequantize(type, src + (size_t)nb * bb, dst + nb * 32, n - nb * 32, NULL);
}
#endif

static int dequant(core_qdot_isa_t isa, int type, const void *src, float *dst, int64_t n)
{
#ifdef QDOT_X86
    if (isa >= CORE_QDOT_AVX2 && core_qdot_has_fast_kernel(type)) {
        if (n < 0 || n % core_ttype_block_elems(type) != 0)
            return CORE_EINVAL;
        (void)pthread_once(&h2f_once, h2f_init);
        dequant_avx2(type, src, dst, n);
        return 0;
    }
#elif defined(__aarch64__)
    if (isa >= CORE_QDOT_NEON && core_qdot_has_fast_kernel(type)) { /* qdot_neon.c */
        if (n < 0 || n % core_ttype_block_elems(type) != 0)
            return CORE_EINVAL;
        (void)core_qdot_dequant_neon(type, src, dst, n);
        return 0;
    }
#else
    (void)isa;
#endif
    return core_dequantize(type, src, dst, n, NULL);
}

void core_qdot_dequant(int type, const void *src, float *dst, int64_t n)
{
    (void)dequant(core_qdot_isa(), type, src, dst, n);
}

int core_qdot_dequant_isa(core_qdot_isa_t isa, int type, const void *src, float *dst, int64_t n)
{
    if (!core_qdot_isa_runs(isa))
        return CORE_EUNSUPPORTED;
    return dequant(isa, type, src, dst, n);
}

static void qmm(core_qdot_isa_t isa, int type, int64_t m, int64_t n, int64_t k, const float *a,
                int64_t lda, const void *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const unsigned char *wb = w;
#ifdef QDOT_X86
    if (isa >= CORE_QDOT_AVX2) {
        (void)pthread_once(&h2f_once, h2f_init);
        switch (type) {
        case CORE_TTYPE_Q4_0: qmm_q4_0_avx2(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q4_1: qmm_q4_1_avx2(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q8_0: qmm_q8_0_avx2(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_F16: qmm_f16_avx2(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_BF16: qmm_bf16_avx2(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        default: qmm_block_avx2(type, m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return;
        }
    }
#elif defined(__aarch64__)
    if (isa >= CORE_QDOT_NEON && /* qdot_neon.c: the types with a fast kernel */
        core_qmatmul_nt_neon(type, m, n, k, a, lda, wb, row_bytes, beta, c, ldc))
        return;
#else
    (void)isa;
#endif
    qmm_generic(type, m, n, k, a, lda, wb, row_bytes, beta, c, ldc);
}

void core_qmatmul_nt(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const void *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    qmm(core_qdot_isa(), type, m, n, k, a, lda, w, row_bytes, beta, c, ldc);
}

int core_qmatmul_nt_isa(core_qdot_isa_t isa, int type, int64_t m, int64_t n, int64_t k,
                        const float *a, int64_t lda, const void *w, size_t row_bytes, float beta,
                        float *c, int64_t ldc)
{
    if (!core_qdot_isa_runs(isa))
        return CORE_EUNSUPPORTED;
    if (!core_qdot_supported(type) || k < 0 || k % core_ttype_block_elems(type) != 0 || m < 0 ||
        n < 0)
        return CORE_EINVAL;
    qmm(isa, type, m, n, k, a, lda, w, row_bytes, beta, c, ldc);
    return 0;
}

/* ---- jobs on a pool ---- */

/* Rows (over the concatenated jobs) are shared out as one contiguous range
 * per thread, which its owner takes from the front QDOT_CHUNK_OWN rows at
 * a time: one sequential stream per thread, which the hardware prefetchers
 * and the kernel's own prefetch follow (chunks handed out in turn from one
 * counter made every thread jump at every chunk). A thread whose range is
 * empty steals the back half of the largest remainder, so the threads
 * finish within a small piece of one another, and a thread not scheduled
 * in time has its range taken by the others. Ranges start at multiples of
 * the packed kernel's 16-row groups. */
enum { QDOT_CHUNK_OWN = 64, QDOT_CHUNK_MIN = 16, QDOT_MAX_RANGES = 64 };

typedef struct qdot_range {
    _Atomic uint64_t v; /* lo | hi << 32: rows [lo, hi) not taken yet */
    char pad[64 - sizeof(uint64_t)];
} qdot_range_t;

typedef struct jobs_run {
    const core_qdot_job_t *jobs;
    int n_jobs;
    int64_t total;       /* sum of the jobs' n (< 2^32) */
    core_qdot_isa_t isa; /* one for all threads */
    int n_ranges;
    qdot_range_t range[QDOT_MAX_RANGES];
} jobs_run_t;

static void job_rows(const jobs_run_t *r, const core_qdot_job_t *jb, int64_t j0, int64_t j1)
{
    if (jb->qa && jb->pk && r->isa != CORE_QDOT_GENERIC) { /* every other level packs */
        (void)core_q8_matmul_packed(jb->type, jb->qa, j0, j1, jb->pk, jb->beta, jb->c, jb->ldc);
        return;
    }
    if (jb->qa) {
        (void)core_q8_matmul_isa(r->isa, jb->type, jb->qa, j0, j1, jb->w, jb->row_bytes, jb->beta,
                                 jb->c, jb->ldc);
        return;
    }
    qmm(r->isa, jb->type, jb->m, j1 - j0, jb->k, jb->a, jb->lda,
        (const unsigned char *)jb->w + (size_t)j0 * jb->row_bytes, jb->row_bytes, jb->beta,
        jb->c + j0, jb->ldc);
}

/* Where range i starts (i = n_ranges: the end): a multiple of 16 rows. */
static int64_t range_edge(const jobs_run_t *r, int i)
{
    return i == r->n_ranges ? r->total
                            : r->total * i / r->n_ranges / QDOT_CHUNK_MIN * QDOT_CHUNK_MIN;
}

/* The next rows [*g0, return) for thread worker, or -1 when none is left.
 * Which thread computes a row does not change its result. */
static int64_t take_rows(jobs_run_t *r, int worker, int64_t *g0)
{
    _Atomic uint64_t *own = &r->range[worker % r->n_ranges].v;
    uint64_t v = atomic_load_explicit(own, memory_order_relaxed);
    for (;;) {
        const uint64_t lo = v & 0xffffffffu, hi = v >> 32;
        if (lo >= hi)
            break;
        const uint64_t n = hi - lo < QDOT_CHUNK_OWN ? hi - lo : QDOT_CHUNK_OWN;
        if (atomic_compare_exchange_weak_explicit(own, &v, (lo + n) | hi << 32,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *g0 = (int64_t)lo;
            return (int64_t)(lo + n);
        }
    }
    for (;;) { /* steal the back half of the largest remainder */
        int best = -1;
        uint64_t bv = 0, bleft = 0;
        for (int i = 0; i < r->n_ranges; i++) {
            const uint64_t w = atomic_load_explicit(&r->range[i].v, memory_order_relaxed);
            const uint64_t lo = w & 0xffffffffu, hi = w >> 32;
            if (hi > lo && hi - lo > bleft) {
                best = i;
                bv = w;
                bleft = hi - lo;
            }
        }
        if (best < 0)
            return -1;
        const uint64_t lo = bv & 0xffffffffu, hi = bv >> 32;
        uint64_t n = (bleft / 2 + QDOT_CHUNK_MIN - 1) / QDOT_CHUNK_MIN * QDOT_CHUNK_MIN;
        n = n < bleft ? n : bleft;
        if (atomic_compare_exchange_strong_explicit(&r->range[best].v, &bv, lo | (hi - n) << 32,
                                                    memory_order_relaxed, memory_order_relaxed)) {
            *g0 = (int64_t)(hi - n);
            return (int64_t)hi;
        }
    }
}

static void jobs_worker(void *ctx, int worker, int n_workers)
{
    (void)n_workers;
    jobs_run_t *r = ctx;
    for (;;) {
        int64_t g0;
        const int64_t g1 = take_rows(r, worker, &g0);
        if (g1 < 0)
            return;
        int64_t base = 0;
        for (int i = 0; i < r->n_jobs && base < g1; base += r->jobs[i].n, i++) {
            const int64_t lo = g0 > base ? g0 - base : 0;
            const int64_t hi = g1 - base < r->jobs[i].n ? g1 - base : r->jobs[i].n;
            if (lo < hi)
                job_rows(r, &r->jobs[i], lo, hi);
        }
    }
}

void core_qdot_run_jobs(core_pool_t *pool, const core_qdot_job_t *jobs, int n_jobs)
{
    jobs_run_t r = {.jobs = jobs, .n_jobs = n_jobs, .isa = core_qdot_isa()};
    for (int i = 0; i < n_jobs; i++)
        r.total += jobs[i].n;
    if (r.total == 0)
        return;
    const int threads = r.total <= QDOT_CHUNK_MIN ? 1 : core_pool_size(pool);
    r.n_ranges = threads < QDOT_MAX_RANGES ? threads : QDOT_MAX_RANGES;
    for (int i = 0; i < r.n_ranges; i++)
        atomic_init(&r.range[i].v,
                    (uint64_t)range_edge(&r, i) | (uint64_t)range_edge(&r, i + 1) << 32);
    if (threads == 1)
        jobs_worker(&r, 0, 1);
    else
        core_pool_run(pool, jobs_worker, &r);
}
