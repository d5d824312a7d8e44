/* core/kernels/qdot_pack_avx2.c — the packed-weight kernels (core_q8_pack's
 * layout, core/kernels/qdot_pack.c) on AVX2: the batched decode product on
 * 8-bit activations and the prompt rows' f32 panels, for CPUs without
 * AVX-512 (the entries are in core/kernels/qdot_pack_impl.h).
 *
 * A 64-byte line of a packed block holds 4 values of each of a group's 16
 * rows; a ymm register holds half of it, rows 8h .. 8h + 7 (h = 0, 1), so
 * each half is a group of 8 rows to this kernel, the lane layout the
 * AVX-512 kernel has with 8 lanes instead of 16. A half is multiplied over
 * all its blocks before the other: every weight byte still comes from
 * memory once (the second half's lines are in L1 or L2 by then), and the
 * 16 ymm registers hold a half-block's unpacked weights (8) and the
 * accumulators of a few activation rows. ACTS = 4 rows a pass spills a
 * little and still beat 2 (a 16-row product of a 1536 x 576 Q4_1 matrix
 * from L2: ~173 against ~204 us, build/tools/bench_qdot --m 16, AMD EPYC
 * with AVX-512, AVX2 path).
 *
 * Integers (per block and lane, exact):
 *   Q4_0, Q4_1: maddubs of the unsigned nibbles (0..15) with the broadcast
 *     int8 activations, 4 values of a row per 32-bit lane; each int16 pair
 *     sum is at most 2 * 15 * 128 = 3840 in magnitude, so the 8 maddubs of
 *     a block add up in int16 (<= 30720 < 2^15) before one madd with ones
 *     widens them to the lane's int32 block sum I;
 *   Q8_0: maddubs of |w| with sign(w) * q (pairs at most 2 * 128 * 127 =
 *     32512 < 2^15, q in [-127, 127]), widened per line: the same I.
 * Floats: acc = fma(I, d_w * d_a, acc), macc = fma(m_w, ds, macc) over the
 * blocks, the output acc + macc (+ beta c by fma) — the AVX-512 kernel's
 * operations in its order, lane for lane, so both give the same bits.
 *
 * Panels: the same [group][k][16] floats as the AVX-512 fill (core_dequantize's
 * arithmetic), and per output one chain of k fused multiply-adds from 0 in
 * e order: the same bits as the AVX-512 panels. One group (two ymm of
 * weights) against PANEL_R rows at a time: 2 x PANEL_R accumulators, the
 * weights and the broadcast in 15 registers.
 */
#include "core/kernels/qdot_pack_impl.h"

#include <string.h>

#include "core/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>

enum {
    QB = CORE_Q8_BLOCK,
    ROWS = CORE_Q8_PACK_ROWS,
    ACTS = 4,      /* activation rows a pass over a half's blocks serves (see the top) */
    PF = 8192,     /* bytes prefetched ahead (into L2), as the AVX-512 kernel */
    PANEL_R = 6,   /* prompt rows a pass over a panel serves */
    PANEL_G = CORE_Q8_PANEL_ROWS / ROWS
};

#define AVX2_FN static inline __attribute__((target("avx2,fma,f16c"), always_inline))
#define AVX2_ENTRY __attribute__((target("avx2,fma,f16c")))

static size_t gbytes(int type)
{
    return type == CORE_TTYPE_Q8_0 ? CORE_Q8_PACK_GB_Q8 : CORE_Q8_PACK_GB_Q4;
}

/* 8 f16 at p as floats. */
AVX2_FN __m256 half8(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* All-ones in the lanes of half h whose row l (8h + lane) is in [l0, l1). */
AVX2_FN __m256i lane_mask(int h, int l0, int l1)
{
    const __m256i idx =
        _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * h));
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(l0), idx),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32(l1), idx));
}

AVX2_FN void prefetch_ahead(const unsigned char *gp, size_t gb)
{
    for (size_t o = 0; o < gb; o += 64)
        _mm_prefetch((const char *)gp + PF + o, _MM_HINT_T1);
}

AVX2_FN __m256i bcast4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* Half h of the group at gp against R activation rows from ri; the lanes
 * in mask stored at c + 8h (lane l at c[8h + l], row i at c + i * ldc). */
AVX2_FN void half_rows(int type, int R, const core_q8_act_t *qa, int64_t ri,
                       const unsigned char *gp, int64_t h, int pf, __m256i mask, float beta, float *c,
                       int64_t ldc)
{
    const int64_t nb = qa->nb;
    const size_t gb = gbytes(type);
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[ACTS], macc[ACTS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = macc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        if (pf)
            prefetch_ahead(gp, gb);
        const __m256 dw = half8(gp + 16 * h);
        const unsigned char *wq = gp + 64 + 32 * h; /* line t at wq + 64 t */
        if (type == CORE_TTYPE_Q8_0) {
            __m256i aw[8];
#pragma GCC unroll 8
            for (int64_t t = 0; t < 8; t++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(wq + 64 * t));
                aw[t] = _mm256_sign_epi8(w, w);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;
                __m256i is = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int64_t t = 0; t < 8; t++) {
                    const __m256i w =
                        _mm256_loadu_si256((const __m256i *)(const void *)(wq + 64 * t));
                    const __m256i p = _mm256_maddubs_epi16(aw[t], _mm256_sign_epi8(bcast4(q + 4 * t), w));
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(p, ones));
                }
                const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(qa->d[(ri + r) * nb + b]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), s, acc[r]);
            }
            continue;
        }
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int64_t t = 0; t < 4; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(wq + 64 * t));
            lo[t] = _mm256_and_si256(v, m4);
            hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        const __m256 mw = type == CORE_TTYPE_Q4_1 ? half8(gp + 32 + 16 * h)
                                                  : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;
            /* low nibbles: values 4t..4t+3; high: 16+4t..16+4t+3 */
            __m256i s16 = _mm256_maddubs_epi16(lo[0], bcast4(q));
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], bcast4(q + 16)));
#pragma GCC unroll 4
            for (int64_t t = 1; t < 4; t++) {
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[t], bcast4(q + 4 * t)));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[t], bcast4(q + 16 + 4 * t)));
            }
            const __m256i is = _mm256_madd_epi16(s16, ones);
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(qa->d[(ri + r) * nb + b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), s, acc[r]);
            macc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(qa->ds[(ri + r) * nb + b]), macc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *cr = c + (ri + r) * ldc + 8 * h;
        __m256 v = _mm256_add_ps(acc[r], macc[r]);
        if (beta != 0.0f)
            v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(cr, mask), v);
        _mm256_maskstore_ps(cr, mask, v);
    }
}

AVX2_FN void packed_body(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                         const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    const size_t gstride = (size_t)qa->nb * gbytes(type);
    for (int64_t g = j0 / ROWS; g * ROWS < j1; g++) {
        const int64_t base = g * ROWS;
        const int l0 = (int)(j0 > base ? j0 - base : 0);
        const int l1 = (int)(j1 - base < ROWS ? j1 - base : ROWS);
        const unsigned char *gp = pk + (size_t)g * gstride;
        float *cg = c + base; /* lane l is column base + l */
        for (int64_t h = 0; h < 2; h++) {
            if (l1 <= 8 * h || l0 >= 8 * h + 8)
                continue;
            const __m256i mask = lane_mask((int)h, l0, l1);
            int64_t r = 0;
            for (; r + ACTS <= qa->m; r += ACTS)
                half_rows(type, ACTS, qa, r, gp, h, h == 0 && r == 0, mask, beta, cg, ldc);
            if (qa->m - r == 3)
                half_rows(type, 3, qa, r, gp, h, h == 0 && r == 0, mask, beta, cg, ldc);
            else if (qa->m - r == 2)
                half_rows(type, 2, qa, r, gp, h, h == 0 && r == 0, mask, beta, cg, ldc);
            else if (qa->m - r == 1)
                half_rows(type, 1, qa, r, gp, h, h == 0 && r == 0, mask, beta, cg, ldc);
        }
    }
}

/* One instance per type: the type tests fold away. */
AVX2_ENTRY static void packed_q4_0(const core_q8_act_t *qa, int64_t j0, int64_t j1,
                                   const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    packed_body(CORE_TTYPE_Q4_0, qa, j0, j1, pk, beta, c, ldc);
}

AVX2_ENTRY static void packed_q4_1(const core_q8_act_t *qa, int64_t j0, int64_t j1,
                                   const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    packed_body(CORE_TTYPE_Q4_1, qa, j0, j1, pk, beta, c, ldc);
}

AVX2_ENTRY static void packed_q8_0(const core_q8_act_t *qa, int64_t j0, int64_t j1,
                                   const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    packed_body(CORE_TTYPE_Q8_0, qa, j0, j1, pk, beta, c, ldc);
}

void core_q8_matmul_packed_avx2(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                                const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    if (type == CORE_TTYPE_Q4_0)
        packed_q4_0(qa, j0, j1, pk, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_1)
        packed_q4_1(qa, j0, j1, pk, beta, c, ldc);
    else
        packed_q8_0(qa, j0, j1, pk, beta, c, ldc);
}

/* ---- f32 prompt rows: panels ---- */

/* The group's nb packed blocks at gp dequantized into its panel: value e of
 * the 16 rows at panel + 16 e (the AVX-512 fill's floats). */
AVX2_FN void panel_fill(int type, const unsigned char *gp, int64_t nb, float *panel)
{
    const size_t gb = gbytes(type);
    const __m256i m4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        prefetch_ahead(gp, gb);
        float *out = panel + b * QB * ROWS;
        for (int64_t h = 0; h < 2; h++) {
            const __m256 dw = half8(gp + 16 * h);
            const unsigned char *wq = gp + 64 + 32 * h;
            float *oh = out + 8 * h;
            if (type == CORE_TTYPE_Q8_0) {
#pragma GCC unroll 8
                for (int64_t t = 0; t < 8; t++) {
                    const __m256i v =
                        _mm256_loadu_si256((const __m256i *)(const void *)(wq + 64 * t));
#pragma GCC unroll 4
                    for (int64_t j = 0; j < 4; j++) {
                        const __m256i q = _mm256_srai_epi32(_mm256_slli_epi32(v, (int)(24 - 8 * j)), 24);
                        _mm256_store_ps(oh + (4 * t + j) * ROWS,
                                        _mm256_mul_ps(dw, _mm256_cvtepi32_ps(q)));
                    }
                }
                continue;
            }
            const __m256 mw =
                type == CORE_TTYPE_Q4_1 ? half8(gp + 32 + 16 * h) : _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int64_t t = 0; t < 4; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(wq + 64 * t));
#pragma GCC unroll 2
                for (int64_t n = 0; n < 2; n++) /* low nibbles: values 4t + j; high: 16 + 4t + j */
#pragma GCC unroll 4
                    for (int64_t j = 0; j < 4; j++) {
                        const __m256i q =
                            _mm256_and_si256(_mm256_srli_epi32(v, (int)(8 * j + 4 * n)), m4);
                        const __m256 y =
                            type == CORE_TTYPE_Q4_1
                                ? _mm256_add_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(q)), mw)
                                : _mm256_mul_ps(dw,
                                                _mm256_cvtepi32_ps(_mm256_sub_epi32(q, eight)));
                        _mm256_store_ps(oh + (16 * n + 4 * t + j) * ROWS, y);
                    }
            }
        }
    }
}

/* R rows of a against one group's panel of k values: lanes [0, l1) stored
 * at c (row r at c + r * ldc). R is a constant in each instance
 * (panel_dispatch), so the 2R accumulators stay in registers. */
AVX2_FN void panel_rows(int R, const float *a, int64_t lda, int64_t k, const float *panel,
                        int l1, float beta, float *c, int64_t ldc)
{
    __m256 acc[PANEL_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t e = 0; e < k; e++) {
        const __m256 w0 = _mm256_load_ps(panel + e * ROWS), w1 = _mm256_load_ps(panel + e * ROWS + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 x = _mm256_broadcast_ss(a + r * lda + e);
            acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
        }
    }
    /* constant indices only (both loops unrolled): a variable index into
     * acc made gcc keep it in memory and store it at every e */
#pragma GCC unroll 2
    for (int64_t h = 0; h < 2; h++) {
        const __m256i mask = lane_mask((int)h, 0, l1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            if (l1 <= 8 * h)
                continue;
            float *cr = c + r * ldc + 8 * h;
            __m256 v = acc[r][h];
            if (beta != 0.0f)
                v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(cr, mask), v);
            _mm256_maskstore_ps(cr, mask, v);
        }
    }
}

#define PANEL_CASE(RR)                                                                           \
    case RR: panel_rows(RR, a, lda, k, panel, l1, beta, c, ldc); break;

AVX2_ENTRY static void panel_dispatch(int R, const float *a, int64_t lda, int64_t k,
                                      const float *panel, int l1, float beta, float *c,
                                      int64_t ldc)
{
    switch (R) {
        PANEL_CASE(6) PANEL_CASE(5) PANEL_CASE(4) PANEL_CASE(3) PANEL_CASE(2) PANEL_CASE(1)
    default: break;
    }
}
#undef PANEL_CASE

AVX2_FN void panels_body(int type, int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                         int64_t lda, const unsigned char *pk, float *panel, float beta, float *c,
                         int64_t ldc)
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

AVX2_ENTRY void core_qmatmul_packed_avx2(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                                         const float *a, int64_t lda, const unsigned char *pk,
                                         float *panel, float beta, float *c, int64_t ldc)
{
    if (type == CORE_TTYPE_Q4_1)
        panels_body(CORE_TTYPE_Q4_1, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_0)
        panels_body(CORE_TTYPE_Q4_0, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    else
        panels_body(CORE_TTYPE_Q8_0, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
}

#endif
