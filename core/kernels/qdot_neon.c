/* core/kernels/qdot_neon.c — the quantized products on aarch64 with NEON.
 * The integer path (8-bit activations times Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K and Q6_K weight rows) comes in two variants: SDOT (the
 * armv8.2-a dotprod extension, four int8 products summed into each 32-bit
 * lane in one instruction) and, for cores without it, widening multiplies
 * (SMULL into 16 bits, pairwise added into 32-bit lanes of four products
 * each, SDOT's lanes: both variants give the same bits). The API and error
 * contract are core/kernels/qdot.h's;
 * core/kernels/qdot_q8.c dispatches here and holds the scalar reference
 * (mm_generic, ref_block) that defines the integers formed below.
 *
 * Every weight value of these types fits a signed byte as the integer the
 * reference multiplies (Q4/Q5/K-quant quants 0..31, Q8_0's int8, Q6_K's v -
 * 32), so both variants multiply signed by signed, no sign tricks: Q6_K's
 * per-16-value scales multiply the two halves' 32-bit lane sums. Per block
 * of 32 the four lanes hold partial sums whose total is the reference's
 * integer I exactly (each product at most 128 * 127 < 2^15); each block's
 * lanes are converted to float and added, times d_w * d_a (the reference's
 * product), to four lane accumulators, and m_w * ds in steps of four blocks:
 * the same integers and products as the reference, summed in another order
 * (the contract's gamma(nb + 8) bound; bit for bit where every float
 * operation is exact, which tests/unit/test_core_qdot_q8.c checks).
 *
 * The f32 path (core_qmatmul_nt, core_qdot_dequant) has NEON kernels for
 * the types with a fast kernel (Q4_0, Q4_1, Q8_0, F16, BF16; the others
 * stay on qdot.c's portable code): a block dequantized in registers to
 * core_dequantize's exact values, then fused multiply-adds with up to 8
 * activation rows, two accumulators a row, so each lane's chain is k/8
 * operations long (within the header's k/4 + 8).
 *
 * The build targets armv8-a; the dotprod functions carry their own target
 * attribute, and core/kernels/cpu.c says whether the CPU has the extension.
 * The file is empty elsewhere.
 */
#include "core/kernels/qdot_neon_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "core/tensor.h" /* CORE_TTYPE_* */

#define DP_TARGET QDOT_NEON_DP_TARGET
#define DP_FN __attribute__((target(DP_TARGET)))
#define DP_INL static inline __attribute__((target(DP_TARGET), always_inline))
#define NEON_INL static inline __attribute__((always_inline))

enum { QB = CORE_Q8_BLOCK };
/* How far ahead of the row being multiplied the weights are prefetched:
 * qdot_q8.c's x86 distance, not measured on an ARM core. */
enum { NEON_PF_BYTES = 4096 };

/* Block and super-block geometry (ggml's layouts, as core/tensor.c's
 * core_dequantize reads them; qdot_q8.c describes each). */
enum { Q4K_BYTES = 144, Q5K_BYTES = 176, Q6K_BYTES = 210, Q6K_SC = 192, Q6K_D = 208 };

NEON_INL int is_k(int type)
{
    return type == CORE_TTYPE_Q4_K || type == CORE_TTYPE_Q5_K || type == CORE_TTYPE_Q6_K;
}

NEON_INL size_t k_bytes(int type)
{
    return type == CORE_TTYPE_Q4_K ? Q4K_BYTES : type == CORE_TTYPE_Q5_K ? Q5K_BYTES : Q6K_BYTES;
}

NEON_INL size_t blk_bytes(int type)
{
    switch (type) {
    case CORE_TTYPE_Q4_0: return 18;
    case CORE_TTYPE_Q4_1: return 20;
    case CORE_TTYPE_Q5_0: return 22;
    case CORE_TTYPE_Q5_1: return 24;
    default: return 34; /* Q8_0 (K-quants are addressed by super-block) */
    }
}

NEON_INL size_t qs_off(int type)
{
    return type == CORE_TTYPE_Q4_1 ? 4 : type == CORE_TTYPE_Q5_0 ? 6 : type == CORE_TTYPE_Q5_1 ? 8 : 2;
}

NEON_INL int has_m(int type)
{
    return type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q5_1;
}

NEON_INL int is_q5(int type)
{
    return type == CORE_TTYPE_Q5_0 || type == CORE_TTYPE_Q5_1;
}

/* 1 when blocks add m_w * ds (every type but Q8_0 and Q6_K) */
NEON_INL int has_off(int type)
{
    return type != CORE_TTYPE_Q8_0 && type != CORE_TTYPE_Q6_K;
}

/* The f16 at p as a float (FCVTL: exact, as core_fp16_to_fp32). */
NEON_INL float half(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* Q4_K's and Q5_K's 6-bit scale and min of sub-block j (q: the 12 bytes). */
NEON_INL void k_scale_min(int j, const unsigned char *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 16 bytes at qs as values 0..15 (low nibbles) and 16..31 (high). */
NEON_INL void nibbles(const unsigned char *qs, uint8x16_t *lo, uint8x16_t *hi)
{
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vandq_u8(v, vdupq_n_u8(0x0f));
    *hi = vshrq_n_u8(v, 4);
}

/* Bit e of the 16 bits as 0x10 in byte e (Q5's fifth bits). */
NEON_INL uint8x16_t bits16(uint32_t bits)
{
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(b, vld1q_u8(sel)), vdupq_n_u8(0x10));
}

/* The 32 integer weights of block b of a row as the reference forms them
 * (values 0..15 in u0, 16..31 in u1); for Q6_K without its scales, which
 * *sc0, *sc1 get (values 0..15, 16..31). */
NEON_INL void block_quants(int type, const unsigned char *row, int64_t b, int8x16_t *u0,
                           int8x16_t *u1, int *sc0, int *sc1)
{
    uint8x16_t lo, hi;
    if (is_k(type)) {
        const unsigned char *sb = row + (size_t)(b / 8) * k_bytes(type);
        const int i = (int)(b % 8);
        if (type == CORE_TTYPE_Q6_K) {
            const int j = i % 4;
            const unsigned char *ql = sb + (size_t)(i / 4) * 64 + (size_t)(j % 2) * 32;
            const unsigned char *qh = sb + 128 + (size_t)(i / 4) * 32;
            lo = vld1q_u8(ql);
            hi = vld1q_u8(ql + 16);
            if (j < 2) {
                lo = vandq_u8(lo, vdupq_n_u8(0x0f));
                hi = vandq_u8(hi, vdupq_n_u8(0x0f));
            } else {
                lo = vshrq_n_u8(lo, 4);
                hi = vshrq_n_u8(hi, 4);
            }
            /* bits 2j, 2j + 1 of qh as bits 4-5 */
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * j));
            const uint8x16_t three = vdupq_n_u8(3);
            const uint8x16_t h0 = vandq_u8(vshlq_u8(vld1q_u8(qh), sh), three);
            const uint8x16_t h1 = vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), three);
            const int8x16_t k32 = vdupq_n_s8(32);
            *u0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(h0, 4))), k32);
            *u1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, vshlq_n_u8(h1, 4))), k32);
            const unsigned char *sc = sb + Q6K_SC + (size_t)i * 2; /* int8 scales */
            *sc0 = (sc[0] ^ 0x80) - 128;
            *sc1 = (sc[1] ^ 0x80) - 128;
            return;
        }
        const unsigned char *qs =
            sb + (type == CORE_TTYPE_Q5_K ? 48 : 16) + (size_t)(i / 2) * 32;
        lo = vld1q_u8(qs);
        hi = vld1q_u8(qs + 16);
        if (i % 2) {
            lo = vshrq_n_u8(lo, 4);
            hi = vshrq_n_u8(hi, 4);
        } else {
            lo = vandq_u8(lo, vdupq_n_u8(0x0f));
            hi = vandq_u8(hi, vdupq_n_u8(0x0f));
        }
        if (type == CORE_TTYPE_Q5_K) { /* bit i of qh[e] (sb + 16) as bit 4 of value e */
            const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << i)), x10 = vdupq_n_u8(0x10);
            lo = vorrq_u8(lo, vandq_u8(vtstq_u8(vld1q_u8(sb + 16), bit), x10));
            hi = vorrq_u8(hi, vandq_u8(vtstq_u8(vld1q_u8(sb + 32), bit), x10));
        }
        *u0 = vreinterpretq_s8_u8(lo);
        *u1 = vreinterpretq_s8_u8(hi);
        return;
    }
    const unsigned char *blk = row + (size_t)b * blk_bytes(type);
    if (type == CORE_TTYPE_Q8_0) {
        *u0 = vld1q_s8((const int8_t *)(const void *)(blk + 2));
        *u1 = vld1q_s8((const int8_t *)(const void *)(blk + 18));
        return;
    }
    nibbles(blk + qs_off(type), &lo, &hi);
    if (is_q5(type)) {
        uint32_t qh;
        memcpy(&qh, blk + (has_m(type) ? 4 : 2), sizeof qh);
        lo = vorrq_u8(lo, bits16(qh & 0xffffu));
        hi = vorrq_u8(hi, bits16(qh >> 16));
    }
    *u0 = vreinterpretq_s8_u8(lo);
    *u1 = vreinterpretq_s8_u8(hi);
}

/* d_w and m_w of block b (the reference's: ref_block in qdot_q8.c). */
NEON_INL void block_scales(int type, const unsigned char *row, int64_t b, float *dw, float *mw)
{
    if (is_k(type)) {
        const unsigned char *sb = row + (size_t)(b / 8) * k_bytes(type);
        if (type == CORE_TTYPE_Q6_K) {
            *dw = half(sb + Q6K_D);
            *mw = 0.0f;
            return;
        }
        int sc, mn;
        k_scale_min((int)(b % 8), sb + 4, &sc, &mn);
        *dw = half(sb) * (float)sc;
        *mw = -(half(sb + 2) * (float)mn);
        return;
    }
    const unsigned char *blk = row + (size_t)b * blk_bytes(type);
    *dw = half(blk);
    *mw = has_m(type) ? half(blk + 2) : (type == CORE_TTYPE_Q5_0 ? -16.0f : -8.0f) * *dw;
}

/* ---- the two ways of summing 16 int8 products into four int32 lanes ---- */

/* Lane l gets products 4l..4l+3, as SDOT's: the same lane sums, so the
 * two variants give the same bits. */
NEON_INL int32x4_t dot16_mull(int32x4_t acc, int8x16_t u, int8x16_t q)
{
    const int16x8_t lo = vmull_s8(vget_low_s8(u), vget_low_s8(q)); /* |u q| <= 128 * 127 */
    const int16x8_t hi = vmull_high_s8(u, q);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

DP_INL int32x4_t dot16_sdot(int32x4_t acc, int8x16_t u, int8x16_t q)
{
#if defined(__clang__) && !defined(__ARM_FEATURE_DOTPROD)
    /* clang's arm_neon.h (14 here) declares vdotq_s32 only where the whole
     * file targets dotprod; the instruction assembles in a function that
     * targets it */
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(u), "w"(q));
    return acc;
#else
    return vdotq_s32(acc, u, q);
#endif
}

/* One weight row against activation row ri, four blocks per step (their
 * scales as vectors), one lane accumulator per block of the step. DOT is
 * dot16_mull or dot16_sdot; ATTR the matching function attributes. */
#define ROW1_DEF(name, ATTR, DOT)                                                                  \
    ATTR void name(int type, const core_q8_act_t *qa, int64_t ri, const unsigned char *row,       \
                   float beta, float *c)                                                          \
    {                                                                                             \
        const int64_t nb = qa->nb;                                                                \
        const int8_t *q = qa->q + ri * nb * QB;                                                   \
        const float *d = qa->d + ri * nb, *ds = qa->ds + ri * nb;                                 \
        const int32x4_t zero = vdupq_n_s32(0);                                                    \
        float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),          \
                              vdupq_n_f32(0.0f)};                                                 \
        float32x4_t macc = vdupq_n_f32(0.0f);                                                     \
        float mtail = 0.0f;                                                                       \
        int64_t b = 0;                                                                            \
        for (; b < nb; b += 4) {                                                                  \
            const int nblk = nb - b < 4 ? (int)(nb - b) : 4;                                      \
            float dw[4] = {0}, mw[4] = {0}, sc[4];                                                \
            for (int i = 0; i < nblk; i++)                                                        \
                block_scales(type, row, b + i, &dw[i], &mw[i]);                                   \
            if (nblk == 4) {                                                                      \
                vst1q_f32(sc, vmulq_f32(vld1q_f32(dw), vld1q_f32(d + b)));                        \
                if (has_off(type))                                                                \
                    macc = vfmaq_f32(macc, vld1q_f32(mw), vld1q_f32(ds + b));                     \
            } else {                                                                              \
                for (int i = 0; i < nblk; i++) {                                                  \
                    sc[i] = dw[i] * d[b + i];                                                     \
                    if (has_off(type)) {                                                          \
                        const float tm = mw[i] * ds[b + i];                                       \
                        mtail += tm;                                                              \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (int i = 0; i < nblk; i++) {                                                      \
                const int8_t *qb = q + (b + i) * QB;                                              \
                int8x16_t u0, u1;                                                                 \
                int sc0 = 0, sc1 = 0;                                                             \
                block_quants(type, row, b + i, &u0, &u1, &sc0, &sc1);                             \
                int32x4_t p;                                                                      \
                if (type == CORE_TTYPE_Q6_K)                                                      \
                    p = vmlaq_n_s32(vmulq_n_s32(DOT(zero, u0, vld1q_s8(qb)), sc0),                \
                                    DOT(zero, u1, vld1q_s8(qb + 16)), sc1);                       \
                else                                                                              \
                    p = DOT(DOT(zero, u0, vld1q_s8(qb)), u1, vld1q_s8(qb + 16));                  \
                acc[i] = vfmaq_n_f32(acc[i], vcvtq_f32_s32(p), sc[i]);                            \
            }                                                                                     \
        }                                                                                         \
        const float32x4_t s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));   \
        const float v = (vaddvq_f32(s) + vaddvq_f32(macc)) + mtail;                               \
        *c = beta == 0.0f ? v : v + beta * *c;                                                    \
    }

ROW1_DEF(row1_mull, NEON_INL, dot16_mull)
ROW1_DEF(row1_sdot, DP_INL, dot16_sdot)

/* The cache lines of the weights NEON_PF_BYTES past row (of row_bytes). */
NEON_INL void prefetch_row(const unsigned char *row, size_t row_bytes)
{
    for (size_t o = 0; o < row_bytes; o += 64)
        __builtin_prefetch(row + NEON_PF_BYTES + o, 0, 3);
}

/* Weight rows [j0, j1) against every activation row, each output by the
 * one-row kernel (the same bits alone, in a batch or on any thread). */
#define MM_DEF(name, ATTR, ROW1)                                                                   \
    ATTR void name(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,                     \
                   const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)   \
    {                                                                                             \
        for (int64_t j = j0; j < j1; j++) {                                                       \
            const unsigned char *row = w + (size_t)j * row_bytes; /* in L1 after the first */     \
            prefetch_row(row, row_bytes);                                                         \
            for (int64_t r = 0; r < qa->m; r++)                                                   \
                ROW1(type, qa, r, row, beta, c + r * ldc + j);                                    \
        }                                                                                         \
    }

MM_DEF(mm_mull, NEON_INL, row1_mull)
MM_DEF(mm_sdot, DP_INL, row1_sdot)

/* One instance per type and variant, so that each type's unpacking is
 * branch-free. */
#define MM_INSTANCE(suffix, TYPE)                                                                  \
    static void mm_##suffix##_mull(const core_q8_act_t *qa, int64_t j0, int64_t j1,               \
                                   const unsigned char *w, size_t row_bytes, float beta, float *c, \
                                   int64_t ldc)                                                   \
    {                                                                                             \
        mm_mull(TYPE, qa, j0, j1, w, row_bytes, beta, c, ldc);                                    \
    }                                                                                             \
    DP_FN static void mm_##suffix##_sdot(const core_q8_act_t *qa, int64_t j0, int64_t j1,         \
                                         const unsigned char *w, size_t row_bytes, float beta,    \
                                         float *c, int64_t ldc)                                   \
    {                                                                                             \
        mm_sdot(TYPE, qa, j0, j1, w, row_bytes, beta, c, ldc);                                    \
    }

MM_INSTANCE(q4_0, CORE_TTYPE_Q4_0)
MM_INSTANCE(q4_1, CORE_TTYPE_Q4_1)
MM_INSTANCE(q5_0, CORE_TTYPE_Q5_0)
MM_INSTANCE(q5_1, CORE_TTYPE_Q5_1)
MM_INSTANCE(q8_0, CORE_TTYPE_Q8_0)
MM_INSTANCE(q4_k, CORE_TTYPE_Q4_K)
MM_INSTANCE(q5_k, CORE_TTYPE_Q5_K)
MM_INSTANCE(q6_k, CORE_TTYPE_Q6_K)

typedef void (*mm_fn)(const core_q8_act_t *, int64_t, int64_t, const unsigned char *, size_t,
                      float, float *, int64_t);

void core_q8_matmul_neon(int dotprod, int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                         const void *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    mm_fn f;
    switch (type) {
    case CORE_TTYPE_Q4_0: f = dotprod ? mm_q4_0_sdot : mm_q4_0_mull; break;
    case CORE_TTYPE_Q4_1: f = dotprod ? mm_q4_1_sdot : mm_q4_1_mull; break;
    case CORE_TTYPE_Q5_0: f = dotprod ? mm_q5_0_sdot : mm_q5_0_mull; break;
    case CORE_TTYPE_Q5_1: f = dotprod ? mm_q5_1_sdot : mm_q5_1_mull; break;
    case CORE_TTYPE_Q4_K: f = dotprod ? mm_q4_k_sdot : mm_q4_k_mull; break;
    case CORE_TTYPE_Q5_K: f = dotprod ? mm_q5_k_sdot : mm_q5_k_mull; break;
    case CORE_TTYPE_Q6_K: f = dotprod ? mm_q6_k_sdot : mm_q6_k_mull; break;
    default: f = dotprod ? mm_q8_0_sdot : mm_q8_0_mull; break;
    }
    f(qa, j0, j1, w, row_bytes, beta, c, ldc);
}

/* ---- activation quantization: the reference's operations, four lanes at a time ---- */

/* One block of 32 values at x into q, *d, *s, *ds. Max of |x| (NaN ignored,
 * as the reference's comparison does: FMAXNM), d = max / 127, id = 127 /
 * max, q = x * id clamped to [-127, 127] with NaN to 127 (FMINNM returns
 * the number), rounded to nearest even (FCVTNS). */
NEON_INL void quant_block32(const float *x, int8_t *q, float *d, int32_t *s, float *ds)
{
    float32x4_t v[8];
    float32x4_t mx = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; i++) {
        v[i] = vld1q_f32(x + (size_t)4 * i);
        mx = vmaxnmq_f32(mx, vabsq_f32(v[i]));
    }
    const float amax = vmaxnmvq_f32(mx);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    const float32x4_t idv = vdupq_n_f32(id), hi = vdupq_n_f32(127.0f), lo = vdupq_n_f32(-127.0f);
    int32x4_t sum = vdupq_n_s32(0);
    int16x8_t h[4];
    for (int i = 0; i < 8; i += 2) {
        const int32x4_t a = vcvtnq_s32_f32(vmaxnmq_f32(vminnmq_f32(vmulq_f32(v[i], idv), hi), lo));
        const int32x4_t b =
            vcvtnq_s32_f32(vmaxnmq_f32(vminnmq_f32(vmulq_f32(v[i + 1], idv), hi), lo));
        sum = vaddq_s32(sum, vaddq_s32(a, b));
        h[i / 2] = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
    }
    vst1q_s8(q, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(q + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    *s = vaddvq_s32(sum);
    *ds = *d * (float)*s;
}

void core_q8_quantize_neon(core_q8_act_t *qa, const float *a, int64_t lda)
{
    const int64_t nb = qa->nb;
    for (int64_t r = 0; r < qa->m; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *x = a + r * lda + b * QB;
            const int64_t n = qa->k - b * QB < QB ? qa->k - b * QB : QB;
            float pad[QB] = {0}; /* a partial last block, zero-padded as the reference does */
            if (n < QB)
                memcpy(pad, x, (size_t)n * sizeof(float));
            quant_block32(n < QB ? pad : x, qa->q + (r * nb + b) * QB, qa->d + r * nb + b,
                          qa->s + r * nb + b, qa->ds + r * nb + b);
        }
}

/* ---- f32 path: activation rows in floats times Q4_0, Q4_1, Q8_0, F16, BF16 rows ---- */

NEON_INL int is_half_type(int type)
{
    return type == CORE_TTYPE_F16 || type == CORE_TTYPE_BF16;
}

/* Bytes of the 32 values deq32 reads: a block, or 32 F16/BF16 values. */
NEON_INL size_t grp_bytes(int type)
{
    return is_half_type(type) ? 64 : blk_bytes(type);
}

/* 16 nibble or int8 quants as four float vectors in element order. */
NEON_INL void s8_to_f32(int8x16_t q, float32x4_t *y)
{
    const int16x8_t l = vmovl_s8(vget_low_s8(q)), h = vmovl_high_s8(q);
    y[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l)));
    y[1] = vcvtq_f32_s32(vmovl_high_s16(l));
    y[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    y[3] = vcvtq_f32_s32(vmovl_high_s16(h));
}

/* The 32 values of one block (or 32 F16/BF16 values) at b as core_dequantize
 * gives them, in element order: d * q (Q4_0: d * (q - 8)), then + m for
 * Q4_1 (a product, then a sum: no fused multiply-add, as core/tensor.c);
 * F16 by FCVTL and BF16 by a 16-bit shift, both exact. */
NEON_INL void deq32(int type, const unsigned char *b, float32x4_t *y)
{
    if (type == CORE_TTYPE_F16) {
        for (int i = 0; i < 8; i++)
            y[i] = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(b + (size_t)8 * i)));
        return;
    }
    if (type == CORE_TTYPE_BF16) {
        for (int i = 0; i < 8; i++)
            y[i] = vreinterpretq_f32_u32(
                vshll_n_u16(vreinterpret_u16_u8(vld1_u8(b + (size_t)8 * i)), 16));
        return;
    }
    const float d = half(b);
    if (type == CORE_TTYPE_Q8_0) {
        s8_to_f32(vld1q_s8((const int8_t *)(const void *)(b + 2)), y);
        s8_to_f32(vld1q_s8((const int8_t *)(const void *)(b + 18)), y + 4);
    } else {
        uint8x16_t lo, hi;
        nibbles(b + qs_off(type), &lo, &hi);
        int8x16_t sl = vreinterpretq_s8_u8(lo), sh = vreinterpretq_s8_u8(hi);
        if (type == CORE_TTYPE_Q4_0) {
            sl = vsubq_s8(sl, vdupq_n_s8(8));
            sh = vsubq_s8(sh, vdupq_n_s8(8));
        }
        s8_to_f32(sl, y);
        s8_to_f32(sh, y + 4);
    }
    for (int i = 0; i < 8; i++)
        y[i] = vmulq_n_f32(y[i], d);
    if (type == CORE_TTYPE_Q4_1) {
        const float32x4_t m = vdupq_n_f32(half(b + 2));
        for (int i = 0; i < 8; i++)
            y[i] = vaddq_f32(y[i], m);
    }
}

/* One weight row against MR (1..8, a literal at every call site)
 * activation rows: two accumulators a row, the block's even and odd
 * quarters, so each lane's chain has k/8 fused multiply-adds. tail: the
 * values past the nb groups of 32 (F16/BF16 only), zero-padded to a group. */
NEON_INL void row_f32(int type, int MR, const float *a, int64_t lda, const unsigned char *row,
                      int64_t nb, int tail, float beta, float *c, int64_t ldc)
{
    const size_t bb = grp_bytes(type);
    float32x4_t acc0[8], acc1[8], y[8];
    for (int r = 0; r < MR; r++)
        acc0[r] = acc1[r] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b <= nb; b++) {
        const float *xb[8];
        float xt[8][QB];
        if (b < nb) {
            deq32(type, row + (size_t)b * bb, y);
            for (int r = 0; r < MR; r++)
                xb[r] = a + r * lda + b * QB;
        } else {
            if (tail == 0)
                break;
            unsigned char wt[64] = {0}; /* [32] F16/BF16 values */
            memcpy(wt, row + (size_t)nb * bb, (size_t)tail * 2);
            deq32(type, wt, y);
            for (int r = 0; r < MR; r++) {
                memset(xt[r], 0, sizeof xt[r]);
                memcpy(xt[r], a + r * lda + nb * QB, (size_t)tail * sizeof(float));
                xb[r] = xt[r];
            }
        }
        for (int r = 0; r < MR; r++)
            for (int i = 0; i < 8; i += 2) {
                acc0[r] = vfmaq_f32(acc0[r], y[i], vld1q_f32(xb[r] + (size_t)4 * i));
                acc1[r] = vfmaq_f32(acc1[r], y[i + 1], vld1q_f32(xb[r] + (size_t)4 * i + 4));
            }
    }
    for (int r = 0; r < MR; r++) {
        const float v = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
        c[r * ldc] = beta == 0.0f ? v : v + beta * c[r * ldc];
    }
}

NEON_INL void qmm_f32(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / QB;
    const int tail = is_half_type(type) ? (int)(k % QB) : 0;
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
        const int64_t mr = m - r0 < 8 ? m - r0 : 8;
        const float *ar = a + r0 * lda;
        float *cr = c + r0 * ldc;
        for (int64_t j = 0; j < n; j++) {
            const unsigned char *row = w + (size_t)j * row_bytes;
            switch (mr) {
            case 1: row_f32(type, 1, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 2: row_f32(type, 2, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 3: row_f32(type, 3, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 4: row_f32(type, 4, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 5: row_f32(type, 5, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 6: row_f32(type, 6, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            case 7: row_f32(type, 7, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            default: row_f32(type, 8, ar, lda, row, nb, tail, beta, cr + j, ldc); break;
            }
        }
    }
}

#define QMM_INSTANCE(suffix, TYPE)                                                                 \
    static void qmm_##suffix(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,        \
                             const unsigned char *w, size_t row_bytes, float beta, float *c,      \
                             int64_t ldc)                                                         \
    {                                                                                             \
        qmm_f32(TYPE, m, n, k, a, lda, w, row_bytes, beta, c, ldc);                               \
    }

QMM_INSTANCE(q4_0, CORE_TTYPE_Q4_0)
QMM_INSTANCE(q4_1, CORE_TTYPE_Q4_1)
QMM_INSTANCE(q8_0, CORE_TTYPE_Q8_0)
QMM_INSTANCE(f16, CORE_TTYPE_F16)
QMM_INSTANCE(bf16, CORE_TTYPE_BF16)

int core_qmatmul_nt_neon(int type, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const void *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const unsigned char *wb = w;
    switch (type) {
    case CORE_TTYPE_Q4_0: qmm_q4_0(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return 1;
    case CORE_TTYPE_Q4_1: qmm_q4_1(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return 1;
    case CORE_TTYPE_Q8_0: qmm_q8_0(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return 1;
    case CORE_TTYPE_F16: qmm_f16(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return 1;
    case CORE_TTYPE_BF16: qmm_bf16(m, n, k, a, lda, wb, row_bytes, beta, c, ldc); return 1;
    default: return 0;
    }
}

int core_qdot_dequant_neon(int type, const void *src, float *dst, int64_t n)
{
    if (type != CORE_TTYPE_Q4_0 && type != CORE_TTYPE_Q4_1 && type != CORE_TTYPE_Q8_0 &&
        !is_half_type(type))
        return 0;
    const unsigned char *s8 = src;
    const size_t bb = grp_bytes(type);
    const int64_t nb = n / QB;
    for (int64_t b = 0; b < nb; b++) {
        float32x4_t y[8];
        deq32(type, s8 + (size_t)b * bb, y);
        for (int i = 0; i < 8; i++)
            vst1q_f32(dst + b * QB + (int64_t)4 * i, y[i]);
    }
    if (n > nb * QB) /* an F16/BF16 rest */
        (void)core_dequantize(type, s8 + (size_t)nb * bb, dst + nb * QB, n - nb * QB, NULL);
    return 1;
}
#endif /* __aarch64__ */
