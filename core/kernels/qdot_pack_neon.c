/* core/kernels/qdot_pack_neon.c — the packed-weight kernels (core_q8_pack's
 * layout, core/kernels/qdot_pack.c) on aarch64 NEON: the batched decode
 * product on 8-bit activations and the prompt rows' f32 panels (the
 * entries are in core/kernels/qdot_pack_impl.h). Empty elsewhere.
 *
 * A 64-byte line of a packed block holds 4 values of each of a group's 16
 * rows; a 128-bit register holds a quarter of it, rows 4u .. 4u + 3, 4 bytes
 * a 32-bit lane: the lane layout SDOT multiplies, lane r summing 4 weights
 * of row r times the same 4 activation values (the 32-bit lane t of the
 * activation block, broadcast: SDOT's indexed form). A quarter is
 * multiplied over all its blocks before the next: every weight byte comes
 * from memory once (the other quarters' lines are in L1 or L2 by then), and
 * the unpacked weights of a block serve ACTS activation rows at a time.
 *
 * Integers (per block and lane, exact): the weights as the signed bytes the
 * reference multiplies (Q4 nibbles 0..15, Q8_0's int8), times the int8
 * activations, by SDOT where the CPU has dotprod, else by widening
 * multiplies (SMULL into 16 bits, pairwise added twice into SDOT's lanes):
 * the block's integer sum I either way.
 * Floats: acc = fma(I, d_w * d_a, acc), macc = fma(m_w, ds, macc) over the
 * blocks (m_w = -8 d_w for Q4_0, none for Q8_0), the output acc + macc
 * (+ beta c by fma): the operations of the x86 packed kernels in their
 * order, lane for lane, so a row's bits do not depend on the rows or
 * activation rows beside it, and are those of the AVX2 and AVX-512 kernels.
 *
 * Panels: the same [group][k][16] floats as the x86 fills (core_dequantize's
 * arithmetic), and per output one chain of k fused multiply-adds from 0 in
 * e order: the x86 panels' bits. One group (four registers of weights)
 * against PANEL_R rows at a time: 4 x PANEL_R accumulators.
 */
#include "core/kernels/qdot_pack_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "core/kernels/qdot_neon_impl.h" /* QDOT_NEON_DP_TARGET */
#include "core/tensor.h"

#define DP_TARGET QDOT_NEON_DP_TARGET
#define NEON_INL static inline __attribute__((always_inline))
#define DP_INL static inline __attribute__((target(DP_TARGET), always_inline))
#define DP_FN __attribute__((target(DP_TARGET)))

enum {
    QB = CORE_Q8_BLOCK,
    ROWS = CORE_Q8_PACK_ROWS,
    ACTS = 4,    /* activation rows a pass over a quarter's blocks serves */
    PANEL_R = 4, /* prompt rows a pass over a panel serves (16 accumulators) */
    PF = 4096    /* bytes prefetched ahead, as qdot_neon.c (not measured on an ARM core) */
};

static size_t gbytes(int type)
{
    return type == CORE_TTYPE_Q8_0 ? CORE_Q8_PACK_GB_Q8 : CORE_Q8_PACK_GB_Q4;
}

/* 4 f16 at p as floats (FCVTL: exact). */
NEON_INL float32x4_t half4(const unsigned char *p)
{
    uint16_t h[4];
    memcpy(h, p, sizeof h);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* Lane r (row 4u + r) of v: sum over j of w[4r + j] * a4[j] (a4: 4 bytes
 * broadcast to every lane), SDOT or the widening multiplies. */
DP_INL int32x4_t dot4_dp(int32x4_t acc, int8x16_t w, int8x16_t a4)
{
    return vdotq_s32(acc, w, a4);
}

NEON_INL int32x4_t dot4_mull(int32x4_t acc, int8x16_t w, int8x16_t a4)
{
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a4));
    const int16x8_t hi = vmull_high_s8(w, a4);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

NEON_INL int8x16_t bcast4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* Quarter u of the group at gp against R activation rows from ri; lanes
 * [l0, l1) of the quarter (row 4u + lane) stored at c + 4u. */
#define QUARTER_BODY(DOT)                                                                        \
    const int64_t nb = qa->nb;                                                                   \
    const size_t gb = gbytes(type);                                                              \
    const uint8x16_t m4 = vdupq_n_u8(0x0f);                                                      \
    float32x4_t acc[ACTS], macc[ACTS];                                                           \
    for (int r = 0; r < R; r++)                                                                  \
        acc[r] = macc[r] = vdupq_n_f32(0.0f);                                                    \
    for (int64_t b = 0; b < nb; b++, gp += gb) {                                                 \
        if (pf)                                                                                  \
            for (size_t o = 0; o < gb; o += 64)                                                  \
                __builtin_prefetch(gp + PF + o, 0, 2);                                           \
        const float32x4_t dw = half4(gp + 8 * u);                                                \
        const unsigned char *wq = gp + 64 + 16 * u; /* line t at wq + 64 t */                    \
        if (type == CORE_TTYPE_Q8_0) {                                                           \
            int8x16_t w[8];                                                                      \
            for (int t = 0; t < 8; t++)                                                          \
                w[t] = vld1q_s8((const int8_t *)(wq + 64 * t));                                  \
            for (int r = 0; r < R; r++) {                                                        \
                const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;                              \
                int32x4_t is = vdupq_n_s32(0);                                                   \
                for (int t = 0; t < 8; t++)                                                      \
                    is = DOT(is, w[t], bcast4(q + 4 * t));                                       \
                const float32x4_t s = vmulq_f32(dw, vdupq_n_f32(qa->d[(ri + r) * nb + b]));      \
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(is), s);                                \
            }                                                                                    \
            continue;                                                                            \
        }                                                                                        \
        int8x16_t lo[4], hi[4];                                                                  \
        for (int t = 0; t < 4; t++) {                                                            \
            const uint8x16_t v = vld1q_u8(wq + 64 * t);                                          \
            lo[t] = vreinterpretq_s8_u8(vandq_u8(v, m4));                                        \
            hi[t] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));                                       \
        }                                                                                        \
        const float32x4_t mw = type == CORE_TTYPE_Q4_1 ? half4(gp + 32 + 8 * u)                  \
                                                       : vmulq_f32(dw, vdupq_n_f32(-8.0f));      \
        for (int r = 0; r < R; r++) {                                                            \
            const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;                                  \
            int32x4_t is = vdupq_n_s32(0);                                                       \
            for (int t = 0; t < 4; t++) { /* low nibbles: 4t..4t+3; high: 16+4t.. */             \
                is = DOT(is, lo[t], bcast4(q + 4 * t));                                          \
                is = DOT(is, hi[t], bcast4(q + 16 + 4 * t));                                     \
            }                                                                                    \
            const float32x4_t s = vmulq_f32(dw, vdupq_n_f32(qa->d[(ri + r) * nb + b]));          \
            acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(is), s);                                    \
            macc[r] = vfmaq_f32(macc[r], mw, vdupq_n_f32(qa->ds[(ri + r) * nb + b]));            \
        }                                                                                        \
    }                                                                                            \
    for (int r = 0; r < R; r++) {                                                                \
        float *cr = c + (ri + r) * ldc + 4 * u;                                                  \
        float v[4], old[4] = {0};                                                                \
        vst1q_f32(v, vaddq_f32(acc[r], macc[r]));                                                \
        if (beta != 0.0f) {                                                                      \
            for (int l = l0; l < l1; l++)                                                        \
                old[l] = cr[l];                                                                  \
            vst1q_f32(v, vfmaq_f32(vld1q_f32(v), vdupq_n_f32(beta), vld1q_f32(old)));            \
        }                                                                                        \
        for (int l = l0; l < l1; l++)                                                            \
            cr[l] = v[l];                                                                        \
    }

DP_INL void quarter_dp(int type, int R, const core_q8_act_t *qa, int64_t ri,
                       const unsigned char *gp, int u, int pf, int l0, int l1, float beta,
                       float *c, int64_t ldc)
{
    QUARTER_BODY(dot4_dp)
}

NEON_INL void quarter_mull(int type, int R, const core_q8_act_t *qa, int64_t ri,
                           const unsigned char *gp, int u, int pf, int l0, int l1, float beta,
                           float *c, int64_t ldc)
{
    QUARTER_BODY(dot4_mull)
}
#undef QUARTER_BODY

/* Every group touching [j0, j1), quarter by quarter, ACTS rows a pass. */
#define PACKED_BODY(QUARTER)                                                                     \
    const size_t gstride = (size_t)qa->nb * gbytes(type);                                        \
    for (int64_t g = j0 / ROWS; g * ROWS < j1; g++) {                                            \
        const int64_t base = g * ROWS;                                                           \
        const int g0 = (int)(j0 > base ? j0 - base : 0);                                         \
        const int g1 = (int)(j1 - base < ROWS ? j1 - base : ROWS);                               \
        const unsigned char *gp = pk + (size_t)g * gstride;                                      \
        for (int u = 0; u < ROWS / 4; u++) {                                                     \
            const int l0 = g0 > 4 * u ? g0 - 4 * u : 0;                                          \
            const int l1 = g1 - 4 * u < 4 ? g1 - 4 * u : 4;                                      \
            if (l1 <= l0)                                                                        \
                continue;                                                                        \
            for (int64_t r = 0; r < qa->m; r += ACTS) {                                          \
                const int R = (int)(qa->m - r < ACTS ? qa->m - r : ACTS);                        \
                QUARTER(type, R, qa, r, gp, u, u == 0 && r == 0, l0, l1, beta, c + base, ldc);   \
            }                                                                                    \
        }                                                                                        \
    }

DP_FN static void packed_dp(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                            const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    PACKED_BODY(quarter_dp)
}

static void packed_mull(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                        const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    PACKED_BODY(quarter_mull)
}
#undef PACKED_BODY

void core_q8_matmul_packed_neon(int dotprod, int type, const core_q8_act_t *qa, int64_t j0,
                                int64_t j1, const unsigned char *pk, float beta, float *c,
                                int64_t ldc)
{
    if (dotprod)
        packed_dp(type, qa, j0, j1, pk, beta, c, ldc);
    else
        packed_mull(type, qa, j0, j1, pk, beta, c, ldc);
}

/* ---- f32 prompt rows: panels ---- */

/* The group's nb packed blocks at gp dequantized into its panel: value e of
 * the 16 rows at panel + 16 e (the x86 fills' floats: d (q - 8), d q + m,
 * d q, each one rounding as core_dequantize's). */
static void panel_fill(int type, const unsigned char *gp, int64_t nb, float *panel)
{
    const size_t gb = gbytes(type);
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        float *out = panel + b * QB * ROWS;
        for (int u = 0; u < ROWS / 4; u++) {
            const float32x4_t dw = half4(gp + 8 * u);
            const unsigned char *wq = gp + 64 + 16 * u;
            float *ou = out + 4 * u;
            if (type == CORE_TTYPE_Q8_0) {
                for (int t = 0; t < 8; t++) {
                    const int32x4_t v = vld1q_s32((const int32_t *)(const void *)(wq + 64 * t));
                    for (int j = 0; j < 4; j++) { /* byte j of each lane, sign-extended */
                        const int32x4_t q = vshrq_n_s32(vshlq_s32(v, vdupq_n_s32(24 - 8 * j)), 24);
                        vst1q_f32(ou + (4 * t + j) * ROWS, vmulq_f32(dw, vcvtq_f32_s32(q)));
                    }
                }
                continue;
            }
            const float32x4_t mw = type == CORE_TTYPE_Q4_1 ? half4(gp + 32 + 8 * u)
                                                           : vdupq_n_f32(0.0f);
            for (int t = 0; t < 4; t++) {
                const uint32x4_t v = vld1q_u32((const uint32_t *)(const void *)(wq + 64 * t));
                for (int n = 0; n < 2; n++) /* low nibbles: values 4t + j; high: 16 + 4t + j */
                    for (int j = 0; j < 4; j++) {
                        const int32x4_t q = vreinterpretq_s32_u32(vandq_u32(
                            vshlq_u32(v, vdupq_n_s32(-(8 * j + 4 * n))), vdupq_n_u32(0x0f)));
                        const float32x4_t y =
                            type == CORE_TTYPE_Q4_1
                                ? vaddq_f32(vmulq_f32(dw, vcvtq_f32_s32(q)), mw)
                                : vmulq_f32(dw, vcvtq_f32_s32(vsubq_s32(q, vdupq_n_s32(8))));
                        vst1q_f32(ou + (16 * n + 4 * t + j) * ROWS, y);
                    }
            }
        }
    }
}

/* R rows of a against one group's panel of k values: lanes [0, l1) stored
 * at c (row r at c + r * ldc). */
NEON_INL void panel_rows(int R, const float *a, int64_t lda, int64_t k, const float *panel,
                         int l1, float beta, float *c, int64_t ldc)
{
    float32x4_t acc[PANEL_R][4];
    for (int r = 0; r < R; r++)
        for (int u = 0; u < 4; u++)
            acc[r][u] = vdupq_n_f32(0.0f);
    for (int64_t e = 0; e < k; e++) {
        const float *pe = panel + e * ROWS;
        const float32x4_t w0 = vld1q_f32(pe), w1 = vld1q_f32(pe + 4), w2 = vld1q_f32(pe + 8),
                          w3 = vld1q_f32(pe + 12);
        for (int r = 0; r < R; r++) {
            const float32x4_t x = vdupq_n_f32(a[r * lda + e]);
            acc[r][0] = vfmaq_f32(acc[r][0], x, w0);
            acc[r][1] = vfmaq_f32(acc[r][1], x, w1);
            acc[r][2] = vfmaq_f32(acc[r][2], x, w2);
            acc[r][3] = vfmaq_f32(acc[r][3], x, w3);
        }
    }
    for (int r = 0; r < R; r++) {
        float v[ROWS];
        for (int u = 0; u < 4; u++)
            vst1q_f32(v + 4 * u, acc[r][u]);
        float *cr = c + r * ldc;
        for (int l = 0; l < l1; l++)
            cr[l] = beta != 0.0f ? __builtin_fmaf(beta, cr[l], v[l]) : v[l];
    }
}

static void panel_dispatch(int R, const float *a, int64_t lda, int64_t k, const float *panel,
                           int l1, float beta, float *c, int64_t ldc)
{
    switch (R) { /* a constant R in each instance: the accumulators stay in registers */
    case 4: panel_rows(4, a, lda, k, panel, l1, beta, c, ldc); break;
    case 3: panel_rows(3, a, lda, k, panel, l1, beta, c, ldc); break;
    case 2: panel_rows(2, a, lda, k, panel, l1, beta, c, ldc); break;
    default: panel_rows(1, a, lda, k, panel, l1, beta, c, ldc); break;
    }
}

void core_qmatmul_packed_neon(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                              const float *a, int64_t lda, const unsigned char *pk, float *panel,
                              float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / QB;
    const size_t gstride = (size_t)nb * gbytes(type);
    for (int64_t c0 = j0; c0 < j1; c0 += CORE_Q8_PANEL_ROWS) {
        const int64_t c1 = j1 - c0 < CORE_Q8_PANEL_ROWS ? j1 - c0 : CORE_Q8_PANEL_ROWS;
        const int G = (int)((c1 + ROWS - 1) / ROWS);
        for (int g = 0; g < G; g++)
            panel_fill(type, pk + (size_t)(c0 / ROWS + g) * gstride, nb,
                       panel + (size_t)g * (size_t)k * ROWS);
        for (int g = 0; g < G; g++) {
            const int l1 = g == G - 1 ? (int)(c1 - (int64_t)(G - 1) * ROWS) : ROWS;
            for (int64_t i = 0; i < m; i += PANEL_R) {
                const int R = (int)(m - i < PANEL_R ? m - i : PANEL_R);
                panel_dispatch(R, a + i * lda, lda, k, panel + (size_t)g * (size_t)k * ROWS, l1,
                               beta, c + i * ldc + c0 + (int64_t)g * ROWS, ldc);
            }
        }
    }
}

#endif
