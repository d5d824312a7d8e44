/* core/qdot_pack.c — Q4_0, Q4_1 and Q8_0 weights repacked sixteen rows to a
 * block for the AVX-512 VNNI decode kernel (the API is in core/qdot.h).
 *
 * The row kernels of core/qdot_q8.c put two blocks of one weight row in a
 * vector, so every block of every row needs its own float work (the scale
 * moved to its lanes, a conversion, a multiply-add) and every output a
 * horizontal sum; with several activation rows (batched decode) all of it is
 * repeated per row. Here the vector holds one block of 16 weight rows: lane r
 * is row r, each dpbusd multiplies 4 weights of each of the 16 rows with the
 * same 4 activation values (broadcast), and a block's 8 dpbusd leave in lane
 * r the block's integer sum I of row r. The float work is then one
 * multiply-add per block for 16 rows, there is no horizontal sum, and the
 * unpacked weights of a block serve every activation row.
 *
 * Layout: group g (rows 16g .. 16g + 15; the last group padded with zero rows)
 * holds its nb blocks one after the other, GB bytes each:
 *   Q4_0, Q4_1 (GB = 320): d[16] f16, m[16] f16 (Q4_1; zero for Q4_0), then
 *     for t = 0..3 the bytes qs[4t .. 4t + 3] of rows 0..15 (64 bytes): the
 *     low nibbles are values 4t..4t+3, the high ones 16+4t..16+4t+3;
 *   Q8_0 (GB = 576): d[16] f16, wsum[16] int16 (the sum of the row's 32
 *     weights), then for t = 0..7 the bytes qs[4t .. 4t + 3] of rows 0..15.
 * Q8_0's weights are signed, and dpbusd wants one operand unsigned: the
 * activations are made unsigned (q + 128, an xor of the sign bit) and
 * I = sum (q + 128) w - 128 wsum, exactly.
 *
 * Per block and lane the arithmetic is: I exact in int32, then acc =
 * fma(I, d_w * d_a, acc) and, for the offset types, macc = fma(m_w, ds,
 * macc) (m_w = -8 d_w for Q4_0), the output acc + macc: the same integers as
 * the reference kernel and the same products, summed in block order with
 * fused multiply-adds. A lane's operations do not depend on the other lanes,
 * on the activation rows that share the call or on the range of rows asked
 * for, so a row's bits are the same alone, in a batch or on any thread.
 */
#include <string.h>

#include "core/qdot.h"
#include "core/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PACK_X86 1
#endif

enum {
    PACK_ROWS = CORE_Q8_PACK_ROWS,
    QB = CORE_Q8_BLOCK,
    GB_Q4 = 320, /* bytes of one block of a group */
    GB_Q8 = 576,
    PACK_ACTS = 4, /* activation rows a pass over a block's weights serves */
    PACK_PF = 4096 /* bytes prefetched ahead, as core/qdot_q8.c */
};

static int packs(int type)
{
    return type == CORE_TTYPE_Q4_0 || type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q8_0;
}

static size_t group_block_bytes(int type)
{
    return type == CORE_TTYPE_Q8_0 ? GB_Q8 : GB_Q4;
}

int core_q8_pack_supported(int type)
{
    return packs(type) && core_qdot_isa() == CORE_QDOT_AVX512VNNI;
}

size_t core_q8_pack_bytes(int type, int64_t rows, int64_t k)
{
    if (!packs(type) || rows < 0 || k <= 0 || k % QB != 0)
        return 0;
    const size_t groups = (size_t)((rows + PACK_ROWS - 1) / PACK_ROWS);
    return groups * (size_t)(k / QB) * group_block_bytes(type);
}

void core_q8_pack(int type, const void *w, size_t row_bytes, int64_t rows, int64_t k, void *dst)
{
    const int64_t nb = k / QB, groups = (rows + PACK_ROWS - 1) / PACK_ROWS;
    const size_t gb = group_block_bytes(type), bb = core_ttype_block_bytes(type);
    const int q8 = type == CORE_TTYPE_Q8_0, nt = q8 ? 8 : 4;
    unsigned char *out = dst;
    memset(out, 0, core_q8_pack_bytes(type, rows, k));
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            unsigned char *gp = out + (size_t)(g * nb + b) * gb;
            for (int64_t r = 0; r < PACK_ROWS && g * PACK_ROWS + r < rows; r++) {
                const unsigned char *blk =
                    (const unsigned char *)w + (size_t)(g * PACK_ROWS + r) * row_bytes +
                    (size_t)b * bb;
                memcpy(gp + 2 * r, blk, 2); /* d */
                const unsigned char *qs = blk + (q8 ? 2 : type == CORE_TTYPE_Q4_1 ? 4 : 2);
                if (type == CORE_TTYPE_Q4_1)
                    memcpy(gp + 32 + 2 * r, blk + 2, 2); /* m */
                if (q8) {
                    int16_t sum = 0;
                    for (int e = 0; e < QB; e++)
                        sum = (int16_t)(sum + (int8_t)qs[e]);
                    memcpy(gp + 32 + 2 * r, &sum, 2);
                }
                for (int64_t t = 0; t < nt; t++)
                    memcpy(gp + 64 + 64 * t + 4 * r, qs + 4 * t, 4);
            }
        }
}

void core_q8_unpack(int type, const void *pk, int64_t k, int64_t j0, int64_t n, void *dst)
{
    const int64_t nb = k / QB;
    const size_t gb = group_block_bytes(type), bb = core_ttype_block_bytes(type);
    const int q8 = type == CORE_TTYPE_Q8_0, nt = q8 ? 8 : 4;
    const size_t qoff = type == CORE_TTYPE_Q4_1 ? 4 : 2; /* qs within a block */
    unsigned char *out = dst;
    for (int64_t j = j0; j < j0 + n; j++) {
        const int64_t g = j / PACK_ROWS, r = j % PACK_ROWS;
        const unsigned char *gp = (const unsigned char *)pk + (size_t)(g * nb) * gb;
        for (int64_t b = 0; b < nb; b++, gp += gb, out += bb) {
            memcpy(out, gp + 2 * r, 2); /* d */
            if (type == CORE_TTYPE_Q4_1)
                memcpy(out + 2, gp + 32 + 2 * r, 2); /* m */
            for (int64_t t = 0; t < nt; t++)
                memcpy(out + qoff + 4 * t, gp + 64 + 64 * t + 4 * r, 4);
        }
    }
}

#ifdef PACK_X86
#define PACK_FN                                                                                  \
    static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"),  \
                                 always_inline))

/* The 16 rows of group g against R activation rows from ri on, lanes [l0,
 * l1) of the result stored at c (lane l at c[l], row i at c + i * ldc). */
PACK_FN void group_rows(int type, int R, const core_q8_act_t *qa, int64_t ri,
                        const unsigned char *gp, int l0, int l1, float beta, float *c,
                        int64_t ldc)
{
    const int64_t nb = qa->nb;
    const size_t gb = group_block_bytes(type);
    const __m512i m4 = _mm512_set1_epi8(0x0f), sign = _mm512_set1_epi8((char)0x80);
    __m512 acc[PACK_ACTS], macc[PACK_ACTS];
    for (int r = 0; r < R; r++)
        acc[r] = macc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        _mm_prefetch((const char *)gp + PACK_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)gp + PACK_PF + 256, _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
        if (type == CORE_TTYPE_Q8_0) {
            __m512i w[8];
#pragma GCC unroll 8
            for (int64_t t = 0; t < 8; t++)
                w[t] = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
            const __m512i corr = _mm512_slli_epi32(
                _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(gp + 32))),
                7);
            for (int r = 0; r < R; r++) {
                const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;
                __m512i is = _mm512_setzero_si512(), ih = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int64_t t = 0; t < 4; t++) { /* two chains, as below */
                    int32_t a4, b4;
                    memcpy(&a4, q + 4 * t, 4);
                    memcpy(&b4, q + 16 + 4 * t, 4);
                    is = _mm512_dpbusd_epi32(is, _mm512_xor_si512(_mm512_set1_epi32(a4), sign), w[t]);
                    ih = _mm512_dpbusd_epi32(ih, _mm512_xor_si512(_mm512_set1_epi32(b4), sign),
                                             w[t + 4]);
                }
                is = _mm512_sub_epi32(_mm512_add_epi32(is, ih), corr);
                const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(qa->d[(ri + r) * nb + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[r]);
            }
            continue;
        }
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int64_t t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
            lo[t] = _mm512_and_si512(v, m4);
            hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        const __m512 mw =
            type == CORE_TTYPE_Q4_1
                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(gp + 32)))
                : _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
        for (int r = 0; r < R; r++) {
            const int8_t *q = qa->q + ((ri + r) * nb + b) * QB;
            /* two chains (low and high nibbles): half the dpbusd latency */
            __m512i is = _mm512_setzero_si512(), ih = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int64_t t = 0; t < 4; t++) {
                int32_t a4l, a4h;
                memcpy(&a4l, q + 4 * t, 4);
                memcpy(&a4h, q + 16 + 4 * t, 4);
                is = _mm512_dpbusd_epi32(is, lo[t], _mm512_set1_epi32(a4l));
                ih = _mm512_dpbusd_epi32(ih, hi[t], _mm512_set1_epi32(a4h));
            }
            is = _mm512_add_epi32(is, ih);
            const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(qa->d[(ri + r) * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[r]);
            macc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(qa->ds[(ri + r) * nb + b]), macc[r]);
        }
    }
    const __mmask16 keep = (__mmask16)(((1u << l1) - 1u) & ~((1u << l0) - 1u));
    for (int r = 0; r < R; r++) {
        float *cr = c + (ri + r) * ldc;
        __m512 v = _mm512_add_ps(acc[r], macc[r]);
        if (beta != 0.0f)
            v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(keep, cr), v);
        _mm512_mask_storeu_ps(cr, keep, v);
    }
}

PACK_FN void packed_vnni(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                         const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    const size_t gstride = (size_t)qa->nb * group_block_bytes(type);
    for (int64_t g = j0 / PACK_ROWS; g * PACK_ROWS < j1; g++) {
        const int64_t base = g * PACK_ROWS;
        const int l0 = (int)(j0 > base ? j0 - base : 0);
        const int l1 = (int)(j1 - base < PACK_ROWS ? j1 - base : PACK_ROWS);
        const unsigned char *gp = pk + (size_t)g * gstride;
        float *cg = c + base; /* lane l is column base + l */
        int64_t r = 0;
        for (; r + PACK_ACTS <= qa->m; r += PACK_ACTS)
            group_rows(type, PACK_ACTS, qa, r, gp, l0, l1, beta, cg, ldc);
        for (; r < qa->m; r++)
            group_rows(type, 1, qa, r, gp, l0, l1, beta, cg, ldc);
    }
}

/* f32 activation rows (prompt products of a few rows) against the 16 rows
 * of group g: per block, the weights' integers of all 16 rows become float
 * vectors once (value e of every row in one vector) and serve R activation
 * rows; S = sum_e a_e q_e is summed in four chains of 8 fused multiply-adds
 * (values e = 4t + j and 16 + 4t + j in chain j; Q8_0: 4t + j, t < 8) and
 * folded as (S0 + S1) + (S2 + S3), then acc = fma(S, d_w, acc) and, for the
 * offset types, macc = fma(m_w, sum_e a_e, macc). A lane's and a row's
 * operations depend on nothing else in the call. */
PACK_FN void group_rows_f32(int type, int R, const float *a, int64_t lda, int64_t nb,
                            const unsigned char *gp, int l0, int l1, float beta, float *c,
                            int64_t ldc)
{
    const size_t gb = group_block_bytes(type);
    const int q8 = type == CORE_TTYPE_Q8_0;
    const __m512i m4 = _mm512_set1_epi32(0x0f);
    __m512 acc[PACK_ACTS], macc[PACK_ACTS];
    for (int r = 0; r < R; r++)
        acc[r] = macc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        _mm_prefetch((const char *)gp + PACK_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)gp + PACK_PF + 256, _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
        __m512 wv[QB]; /* wv[e]: value e of the 16 rows */
        if (q8) {
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    wv[4 * t + j] = _mm512_cvtepi32_ps(
                        _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24));
            }
        } else {
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    wv[4 * t + j] =
                        _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j), m4));
                    wv[16 + 4 * t + j] =
                        _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * j + 4), m4));
                }
            }
        }
        const __m512 mw =
            type == CORE_TTYPE_Q4_1
                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(gp + 32)))
                : _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
        for (int r = 0; r < R; r++) {
            const float *x = a + r * lda + b * QB;
            __m512 s[4];
            for (int j = 0; j < 4; j++)
                s[j] = _mm512_setzero_ps();
            /* chain j: values 4t + j (t < 8), i.e. 4t + j and 16 + 4t + j of a Q4 block */
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++)
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    s[j] = _mm512_fmadd_ps(_mm512_set1_ps(x[4 * t + j]), wv[4 * t + j], s[j]);
            const __m512 sum = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
            acc[r] = _mm512_fmadd_ps(sum, dw, acc[r]);
            if (!q8) {
                const float xs =
                    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)));
                macc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs), macc[r]);
            }
        }
    }
    const __mmask16 keep = (__mmask16)(((1u << l1) - 1u) & ~((1u << l0) - 1u));
    for (int r = 0; r < R; r++) {
        float *cr = c + r * ldc;
        __m512 v = _mm512_add_ps(acc[r], macc[r]);
        if (beta != 0.0f)
            v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(keep, cr), v);
        _mm512_mask_storeu_ps(cr, keep, v);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
packed_f32(int type, int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a, int64_t lda,
           const unsigned char *pk, float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / QB;
    const size_t gstride = (size_t)nb * group_block_bytes(type);
    for (int64_t g = j0 / PACK_ROWS; g * PACK_ROWS < j1; g++) {
        const int64_t base = g * PACK_ROWS;
        const int l0 = (int)(j0 > base ? j0 - base : 0);
        const int l1 = (int)(j1 - base < PACK_ROWS ? j1 - base : PACK_ROWS);
        const unsigned char *gp = pk + (size_t)g * gstride;
        float *cg = c + base; /* lane l is column base + l */
        int64_t r = 0;
        for (; r + PACK_ACTS <= m; r += PACK_ACTS)
            group_rows_f32(type, PACK_ACTS, a + r * lda, lda, nb, gp, l0, l1, beta, cg + r * ldc,
                           ldc);
        for (; r < m; r++)
            group_rows_f32(type, 1, a + r * lda, lda, nb, gp, l0, l1, beta, cg + r * ldc, ldc);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
packed_q4_0(const core_q8_act_t *qa, int64_t j0, int64_t j1, const unsigned char *pk, float beta,
            float *c, int64_t ldc)
{
    packed_vnni(CORE_TTYPE_Q4_0, qa, j0, j1, pk, beta, c, ldc);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
packed_q4_1(const core_q8_act_t *qa, int64_t j0, int64_t j1, const unsigned char *pk, float beta,
            float *c, int64_t ldc)
{
    packed_vnni(CORE_TTYPE_Q4_1, qa, j0, j1, pk, beta, c, ldc);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
packed_q8_0(const core_q8_act_t *qa, int64_t j0, int64_t j1, const unsigned char *pk, float beta,
            float *c, int64_t ldc)
{
    packed_vnni(CORE_TTYPE_Q8_0, qa, j0, j1, pk, beta, c, ldc);
}
#endif

int core_q8_matmul_packed(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                          const void *pk, float beta, float *c, int64_t ldc)
{
    if (!core_q8_pack_supported(type) || j0 < 0 || j1 < j0)
        return CORE_EINVAL;
#ifdef PACK_X86
    const unsigned char *p = pk;
    if (type == CORE_TTYPE_Q4_0)
        packed_q4_0(qa, j0, j1, p, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_1)
        packed_q4_1(qa, j0, j1, p, beta, c, ldc);
    else
        packed_q8_0(qa, j0, j1, p, beta, c, ldc);
    return 0;
#else
    (void)qa;
    (void)pk;
    (void)beta;
    (void)c;
    (void)ldc;
    return CORE_EINVAL;
#endif
}

int core_qmatmul_packed(int type, int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a,
                        int64_t lda, const void *pk, float beta, float *c, int64_t ldc)
{
    if (!core_q8_pack_supported(type) || j0 < 0 || j1 < j0 || m < 0 || k <= 0 || k % QB != 0)
        return CORE_EINVAL;
#ifdef PACK_X86
    packed_f32(type, m, j0, j1, k, a, lda, pk, beta, c, ldc);
    return 0;
#else
    (void)a;
    (void)lda;
    (void)pk;
    (void)beta;
    (void)c;
    (void)ldc;
    return CORE_EINVAL;
#endif
}
