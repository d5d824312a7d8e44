/* core/kernels/qdot_pack.c — Q4_0, Q4_1 and Q8_0 weights repacked sixteen rows to a
 * block for the AVX-512 VNNI decode kernel (the API is in core/kernels/qdot.h);
 * on AVX2 the same layout goes to core/kernels/qdot_pack_avx2.c, on aarch64
 * (NEON, with or without dotprod) to core/kernels/qdot_pack_neon.c.
 *
 * The row kernels of core/kernels/qdot_q8.c put two blocks of one weight row in a
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
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/kernels/qdot.h"
#include "core/kernels/qdot_pack_impl.h"
#include "core/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PACK_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#define PACK_AMX 1
#endif

enum {
    PACK_ROWS = CORE_Q8_PACK_ROWS,
    QB = CORE_Q8_BLOCK,
    GB_Q4 = CORE_Q8_PACK_GB_Q4, /* bytes of one block of a group */
    GB_Q8 = CORE_Q8_PACK_GB_Q8,
    PACK_ACTS = 4, /* activation rows a pass over a block's weights serves */
    PACK_PF = 8192 /* bytes prefetched ahead (into L2) */
};

static int packs(int type)
{
    return type == CORE_TTYPE_Q4_0 || type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q8_0;
}

static size_t group_block_bytes(int type)
{
    return type == CORE_TTYPE_Q8_0 ? GB_Q8 : GB_Q4;
}

/* The ISA levels with packed kernels: every one but the portable C. */
static int isa_packs(core_qdot_isa_t isa)
{
    return isa == CORE_QDOT_AVX2 || isa == CORE_QDOT_AVX512VNNI || isa == CORE_QDOT_NEON ||
           isa == CORE_QDOT_NEON_DOTPROD;
}

int core_q8_pack_supported(int type)
{
    return packs(type) && isa_packs(core_qdot_isa());
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

/* Every line of the gb-byte block at gp PACK_PF bytes ahead, into L2: one
 * thread alone then streams ~30% faster than with two lines into L1 (the
 * line fill buffers stay free for the loads); with two threads the same.
 * The decode kernel and the prompt panels' fill read the packed matrix in
 * its order, a group's blocks and then the next group's. */
PACK_FN void prefetch_ahead(const unsigned char *gp, size_t gb)
{
    for (size_t o = 0; o < gb; o += 64)
        _mm_prefetch((const char *)gp + PACK_PF + o, _MM_HINT_T1);
}

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
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = macc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        prefetch_ahead(gp, gb);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
        if (type == CORE_TTYPE_Q8_0) {
            __m512i w[8];
#pragma GCC unroll 8
            for (int64_t t = 0; t < 8; t++)
                w[t] = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
            const __m512i corr = _mm512_slli_epi32(
                _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(gp + 32))),
                7);
            #pragma GCC unroll 4
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
        #pragma GCC unroll 4
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
    #pragma GCC unroll 4
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
        /* the last 1-3 rows in one pass (R a constant in each call) */
        if (qa->m - r == 3)
            group_rows(type, 3, qa, r, gp, l0, l1, beta, cg, ldc);
        else if (qa->m - r == 2)
            group_rows(type, 2, qa, r, gp, l0, l1, beta, cg, ldc);
        else if (qa->m - r == 1)
            group_rows(type, 1, qa, r, gp, l0, l1, beta, cg, ldc);
    }
}

/* ---- the same product on Intel AMX tiles (batches of activation rows) ----
 * One tile multiply takes R <= 16 activation rows' block b (an R x 32 tile
 * of signed bytes, read in place: row stride nb * 32) and block b of a group
 * (an 8 x 64 tile: line t holds values 4t .. 4t + 3 of each of the 16 weight
 * rows, the packed layout's order; Q4 nibbles are first split into bytes, low
 * ones as lines 0-3, high ones as lines 4-7) and leaves in an R x 16 tile of
 * int32 the block's exact integer sum I of every (activation row, weight
 * row): TDPBSUD (signed by unsigned) for the Q4 types, TDPBSSD for Q8_0,
 * whose signed weights then need no offset correction. The float work per
 * block and lane is group_rows' in the same order: acc = fma(I, d_w * d_a,
 * acc) over the blocks, macc = fma(m_w, ds, macc) over the blocks, the
 * output acc + macc (+ beta c): every output has the VNNI kernel's bits
 * (tested). The tiles take the integer work off the vector units, where the
 * VNNI kernel spends 8 dpbusd and 8 broadcasts per block, row and group. */
enum { AMX_MAX_R = 16 /* activation rows a tile holds */ };

#define AMX_TARGET                                                                               \
    target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define AMX_FN static inline __attribute__((AMX_TARGET, always_inline))

typedef struct amx_cfg { /* the LDTILECFG operand, palette 1 */
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg_t;

/* LDTILECFG of palette 1 with tiles 0..7 of rows[t] rows of colsb[t] bytes.
 * Through asm with the whole struct as its operand: gcc 12's
 * _tile_loadconfig does not tell the compiler it reads all 64 bytes, and a
 * test build of the same code had the rows and column stores dropped (the
 * tile instructions then fault). */
static inline __attribute__((always_inline)) void tile_config(const uint8_t rows[8],
                                                              const uint16_t colsb[8])
{
    amx_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* Tiles 0-3 hold the sums of four blocks (R x 16 int32 each); 4 and 6 the
 * activations (R x 32 bytes), 5 and 7 the weights (8 x 64 bytes), two pairs
 * so that a block's loads need not wait for the multiply before. The loop
 * multiplies four blocks, stores their sums together, then does their float
 * work: a load that follows a tile store waits until the store is done
 * (~25 cycles), so one wait per four blocks instead of one per block.
 * Reordering cannot hide the float work behind the tile work: on the Intel
 * Xeon measured the tile unit and the vector units take turns
 * (build/tools/bench_amx_overlap: overlap ~0.1), so the kernel costs the
 * sum of its two halves, and two software-pipelined orders were slower
 * (docs/PERFORMANCE.md, "The 16-stream batching target: the ceiling on two cores"). */
AMX_FN void amx_config(int R)
{
    const uint8_t r = (uint8_t)R;
    const uint8_t rows[8] = {r, r, r, r, r, 8, r, 8};
    const uint16_t colsb[8] = {64, 64, 64, 64, QB, 64, QB, 64};
    tile_config(rows, colsb);
}

/* Block b's weights as a tile: Q8_0's packed bytes are one; the Q4 types'
 * nibbles are split into bytes in slot b % AMX_SLOTS of wt (512 bytes each,
 * 64-byte aligned) one batch of AMX_BATCH blocks before their tile loads: a
 * tile load of bytes the vector unit has just stored waits until they reach
 * the cache. */
enum { AMX_BATCH = 4, AMX_SLOTS = 2 * AMX_BATCH };

AMX_FN void amx_split(int type, const unsigned char *gp, int64_t b, unsigned char *wt)
{
    if (type == CORE_TTYPE_Q8_0)
        return;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    unsigned char *out = wt + (size_t)(b % AMX_SLOTS) * 512;
#pragma GCC unroll 4
    for (size_t t = 0; t < 4; t++) {
        const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
        _mm512_store_si512((void *)(out + 64 * t), _mm512_and_si512(v, m4));
        _mm512_store_si512((void *)(out + 256 + 64 * t),
                           _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

AMX_FN const unsigned char *amx_weights(int type, const unsigned char *gp, int64_t b,
                                        const unsigned char *wt)
{
    return type == CORE_TTYPE_Q8_0 ? gp + 64 : wt + (size_t)(b % AMX_SLOTS) * 512;
}

/* One block's tile work into sums tile C, with activation and weight tiles
 * A and B (literal tile numbers: the intrinsics paste them into the
 * instruction): the activation rows' block at arow (row stride bytes), the
 * weights' at wtile (64 bytes a line). gcc 12's _tile_loadd is an asm that
 * does not say it reads memory, so a compiler barrier first keeps the
 * split's stores (and any other) before the tile loads. */
#define AMX_BLOCK(C, A, B, q8, arow, stride, wtile)                                              \
    do {                                                                                         \
        __asm__ volatile("" ::: "memory");                                                       \
        _tile_zero(C);                                                                           \
        _tile_loadd(A, arow, stride);                                                            \
        _tile_loadd(B, wtile, 64);                                                               \
        if (q8)                                                                                  \
            _tile_dpbssd(C, A, B);                                                               \
        else                                                                                     \
            _tile_dpbsud(C, A, B);                                                               \
    } while (0)

/* A block's float work for R rows (a constant once inlined) from its sums at
 * cb: acc[r] = fma(I, d_w * d_a, acc[r]), group_rows' operations. gpb: the
 * group's block (its d_w first), da_b: the rows' activation scales. */
AMX_FN void amx_scale(int R, const unsigned char *gpb, const float *da_b, const int32_t *cb,
                      __m512 *acc)
{
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gpb));
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(da_b[r]));
        const __m512i sums = _mm512_load_si512((const void *)(cb + (size_t)16 * r));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s, acc[r]);
    }
}

/* group_rows on tiles: R (a constant in each instance) activation rows from
 * ri against the 16 rows of the group at gp. wt: AMX_SLOTS x 512 bytes, cb: AMX_BATCH x R x
 * 16 int32, accs: R x 16 floats, all 64-byte aligned scratch. */
AMX_FN void amx_group_rows(int type, int R, const core_q8_act_t *qa, int64_t ri,
                           const unsigned char *gp, int l0, int l1, float beta, float *c,
                           int64_t ldc, const float *da, const float *ds, unsigned char *wt,
                           int32_t *cb, float *accs)
{
    const int64_t nb = qa->nb, stride = nb * QB;
    const size_t gb = group_block_bytes(type);
    const int q8 = type == CORE_TTYPE_Q8_0;
    const int8_t *qrows = qa->q + ri * nb * QB;
    __m512 acc[AMX_MAX_R];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < AMX_BATCH && b < nb; b++)
        amx_split(type, gp + (size_t)b * gb, b, wt);
    for (int64_t b0 = 0; b0 < nb; b0 += AMX_BATCH) {
        const int64_t nt = nb - b0 < AMX_BATCH ? nb - b0 : AMX_BATCH;
        for (int64_t b = b0 + AMX_BATCH; b < b0 + 2 * (int64_t)AMX_BATCH && b < nb; b++) {
            prefetch_ahead(gp + (size_t)b * gb, gb);
            amx_split(type, gp + (size_t)b * gb, b, wt);
        }
#define AMX_BLOCK_AT(C, A, B, b)                                                                 \
    AMX_BLOCK(C, A, B, q8, qrows + (b) * QB, stride,                                             \
              amx_weights(type, gp + (size_t)(b) * gb, b, wt))
        AMX_BLOCK_AT(0, 4, 5, b0);
        if (nt > 1)
            AMX_BLOCK_AT(1, 6, 7, b0 + 1);
        if (nt > 2)
            AMX_BLOCK_AT(2, 4, 5, b0 + 2);
        if (nt > 3)
            AMX_BLOCK_AT(3, 6, 7, b0 + 3);
#undef AMX_BLOCK_AT
        _tile_stored(0, cb, 64);
        if (nt > 1)
            _tile_stored(1, cb + (size_t)AMX_MAX_R * 16, 64);
        if (nt > 2)
            _tile_stored(2, cb + (size_t)2 * AMX_MAX_R * 16, 64);
        if (nt > 3)
            _tile_stored(3, cb + (size_t)3 * AMX_MAX_R * 16, 64);
        for (int64_t q = 0; q < nt; q++)
            amx_scale(R, gp + (size_t)(b0 + q) * gb, da + (b0 + q) * AMX_MAX_R,
                      cb + (size_t)q * AMX_MAX_R * 16, acc);
    }
    /* the offsets' sums, block by block as group_rows adds them (zero for
     * Q8_0, whose output is still acc + 0 there) */
    __m512 macc[AMX_MAX_R];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        _mm512_store_ps(accs + (size_t)16 * r, acc[r]);
        macc[r] = _mm512_setzero_ps();
    }
    if (type != CORE_TTYPE_Q8_0) {
        for (int64_t b = 0; b < nb; b++, gp += gb) {
            const __m512 dw =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
            const __m512 mw =
                type == CORE_TTYPE_Q4_1
                    ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(gp + 32)))
                    : _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                macc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[b * AMX_MAX_R + r]), macc[r]);
        }
    }
    const __mmask16 keep = (__mmask16)(((1u << l1) - 1u) & ~((1u << l0) - 1u));
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        float *cr = c + (ri + r) * ldc;
        __m512 v = _mm512_add_ps(_mm512_load_ps(accs + (size_t)16 * r), macc[r]);
        if (beta != 0.0f)
            v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(keep, cr), v);
        _mm512_mask_storeu_ps(cr, keep, v);
    }
}

#define AMX_CASE(RR)                                                                             \
    case RR:                                                                                     \
        amx_group_rows(type, RR, qa, ri, gp, l0, l1, beta, c, ldc, da, ds, wt, cb, accs);        \
        break;

__attribute__((AMX_TARGET)) static void
amx_dispatch(int type, int R, const core_q8_act_t *qa, int64_t ri, const unsigned char *gp,
             int l0, int l1, float beta, float *c, int64_t ldc, const float *da, const float *ds,
             unsigned char *wt, int32_t *cb, float *accs)
{
    switch (R) {
        AMX_CASE(1) AMX_CASE(2) AMX_CASE(3) AMX_CASE(4) AMX_CASE(5) AMX_CASE(6) AMX_CASE(7)
        AMX_CASE(8) AMX_CASE(9) AMX_CASE(10) AMX_CASE(11) AMX_CASE(12) AMX_CASE(13)
        AMX_CASE(14) AMX_CASE(15) AMX_CASE(16)
    default: break;
    }
}
#undef AMX_CASE

/* packed_vnni's loop on tiles: activation rows 16 at a time, then the rest;
 * the tile configuration follows the row count, and the tiles are released
 * at the end (the OS then need not save them when the thread sleeps). */
__attribute__((AMX_TARGET)) static void
packed_amx(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1, const unsigned char *pk,
           float beta, float *c, int64_t ldc)
{
    _Alignas(64) unsigned char wt[AMX_SLOTS * 512];
    _Alignas(64) int32_t cb[AMX_BATCH * AMX_MAX_R * 16];
    _Alignas(64) float accs[AMX_MAX_R * 16];
    _Alignas(64) float da[CORE_Q8_AMX_MAX_BLOCKS * AMX_MAX_R];
    _Alignas(64) float ds[CORE_Q8_AMX_MAX_BLOCKS * AMX_MAX_R];
    const int64_t nb = qa->nb;
    const size_t gstride = (size_t)nb * group_block_bytes(type);
    int cfg_r = 0;
    for (int64_t ri = 0; ri < qa->m; ri += AMX_MAX_R) {
        const int R = (int)(qa->m - ri < AMX_MAX_R ? qa->m - ri : AMX_MAX_R);
        if (R != cfg_r)
            amx_config(cfg_r = R);
        /* block b's scales of the R rows side by side (gathered: nb * R
         * scalar moves were ~3% of a batched decode step) */
        const __mmask16 rows = (__mmask16)((1u << R) - 1u);
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)nb));
        for (int64_t b = 0; b < nb; b++) {
            const int64_t at = ri * nb + b;
            _mm512_store_ps(da + b * AMX_MAX_R,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows, idx, qa->d + at, 4));
            _mm512_store_ps(ds + b * AMX_MAX_R,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows, idx, qa->ds + at, 4));
        }
        for (int64_t g = j0 / PACK_ROWS; g * PACK_ROWS < j1; g++) {
            const int64_t base = g * PACK_ROWS;
            const int l0 = (int)(j0 > base ? j0 - base : 0);
            const int l1 = (int)(j1 - base < PACK_ROWS ? j1 - base : PACK_ROWS);
            amx_dispatch(type, R, qa, ri, pk + (size_t)g * gstride, l0, l1, beta, c + base, ldc,
                         da, ds, wt, cb, accs);
        }
    }
    if (cfg_r)
        _tile_release();
}

/* ---- f32 activation rows (prompts) against packed weights: panels ----
 * Up to PANEL_GROUPS groups of 16 weight rows are dequantized into a panel,
 * [group][k][16] floats (value e of the group's 16 rows in one vector), with
 * core_dequantize's arithmetic (Q4_1 d q + m as a product then a sum, Q4_0
 * d (q - 8), Q8_0 d q: the same floats). Every activation row then runs
 * against the panel: C[i][j] = sum_e a[i][e] w[j][e] as one chain of fused
 * multiply-adds in e order from 0. A row's bits therefore depend on its own
 * values and the weights only, not on the rows that share the call, how
 * they are grouped or which thread computes them. */
enum { PANEL_GROUPS = CORE_Q8_PANEL_ROWS / PACK_ROWS, PANEL_R = 6 };

PACK_FN void panel_fill(int type, const unsigned char *gp, int64_t nb, float *panel)
{
    const size_t gb = group_block_bytes(type);
    const __m512i m4 = _mm512_set1_epi32(0x0f), eight = _mm512_set1_epi32(8);
    for (int64_t b = 0; b < nb; b++, gp += gb) {
        /* a chunk's groups follow one another in memory: one stream */
        prefetch_ahead(gp, gb);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)gp));
        float *out = panel + b * QB * PACK_ROWS;
        if (type == CORE_TTYPE_Q8_0) {
#pragma GCC unroll 8
            for (int64_t t = 0; t < 8; t++) {
                const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
#pragma GCC unroll 4
                for (int64_t j = 0; j < 4; j++) {
                    const __m512i q = _mm512_srai_epi32(_mm512_slli_epi32(v, (unsigned)(24 - 8 * j)), 24);
                    _mm512_store_ps(out + (4 * t + j) * PACK_ROWS,
                                    _mm512_mul_ps(dw, _mm512_cvtepi32_ps(q)));
                }
            }
            continue;
        }
        const __m512 mw = type == CORE_TTYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                                        (const __m256i *)(const void *)(gp + 32)))
                                                  : _mm512_setzero_ps(); /* Q4_0: unused */
#pragma GCC unroll 4
        for (int64_t t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512((const void *)(gp + 64 + 64 * t));
#pragma GCC unroll 2
            for (int64_t h = 0; h < 2; h++) /* low nibbles: values 4t + j; high: 16 + 4t + j */
#pragma GCC unroll 4
                for (int64_t j = 0; j < 4; j++) {
                    const __m512i q =
                        _mm512_and_si512(_mm512_srli_epi32(v, (unsigned)(8 * j + 4 * h)), m4);
                    const __m512 y =
                        type == CORE_TTYPE_Q4_1
                            ? _mm512_add_ps(_mm512_mul_ps(dw, _mm512_cvtepi32_ps(q)), mw)
                            : _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, eight)));
                    _mm512_store_ps(out + (16 * h + 4 * t + j) * PACK_ROWS, y);
                }
        }
    }
}

/* R activation rows from a against G panels of k values: lanes [l0, l1) of
 * group g stored at c + g * 16 (row r at + r * ldc). */
PACK_FN void panel_rows(int R, int G, const float *a, int64_t lda, int64_t k,
                        const float *panel, int l1_last, float beta, float *c, int64_t ldc)
{
    /* G and R are constants here (panel_dispatch): the loops unroll and the
     * G x R accumulators stay in registers */
    __m512 acc[PANEL_GROUPS][PANEL_R];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[g][r] = _mm512_setzero_ps();
    for (int64_t e = 0; e < k; e++) {
        __m512 w[PANEL_GROUPS];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            w[g] = _mm512_load_ps(panel + ((size_t)g * (size_t)k + (size_t)e) * PACK_ROWS);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(a[r * lda + e]);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm512_fmadd_ps(x, w[g], acc[g][r]);
        }
    }
    for (int g = 0; g < G; g++) {
        const int l1 = g == G - 1 ? l1_last : PACK_ROWS;
        const __mmask16 keep = (__mmask16)((1u << l1) - 1u);
        for (int r = 0; r < R; r++) {
            float *cr = c + r * ldc + (int64_t)g * PACK_ROWS;
            __m512 v = acc[g][r];
            if (beta != 0.0f)
                v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(keep, cr), v);
            _mm512_mask_storeu_ps(cr, keep, v);
        }
    }
}

/* The register tiles the compiler keeps in registers: G and R constant. */
#define PANEL_CASE(RR, GG)                                                                       \
    case (RR) * 8 + (GG): panel_rows(RR, GG, a, lda, k, panel, l1, beta, c, ldc); break;

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
panel_dispatch(int R, int G, const float *a, int64_t lda, int64_t k, const float *panel, int l1,
               float beta, float *c, int64_t ldc)
{
    switch (R * 8 + G) {
        PANEL_CASE(6, 4) PANEL_CASE(5, 4) PANEL_CASE(4, 4) PANEL_CASE(3, 4) PANEL_CASE(2, 4)
        PANEL_CASE(1, 4) PANEL_CASE(6, 3) PANEL_CASE(5, 3) PANEL_CASE(4, 3) PANEL_CASE(3, 3)
        PANEL_CASE(2, 3) PANEL_CASE(1, 3) PANEL_CASE(6, 2) PANEL_CASE(5, 2) PANEL_CASE(4, 2)
        PANEL_CASE(3, 2) PANEL_CASE(2, 2) PANEL_CASE(1, 2) PANEL_CASE(6, 1) PANEL_CASE(5, 1)
        PANEL_CASE(4, 1) PANEL_CASE(3, 1) PANEL_CASE(2, 1) PANEL_CASE(1, 1)
    default: break;
    }
}
#undef PANEL_CASE

PACK_FN void packed_f32_body(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                             const float *a, int64_t lda, const unsigned char *pk, float *panel,
                             float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / QB;
    const size_t gstride = (size_t)nb * group_block_bytes(type);
    for (int64_t c0 = j0; c0 < j1; c0 += CORE_Q8_PANEL_ROWS) {
        const int64_t c1 = j1 - c0 < CORE_Q8_PANEL_ROWS ? j1 - c0 : CORE_Q8_PANEL_ROWS;
        const int G = (int)((c1 + PACK_ROWS - 1) / PACK_ROWS);
        const int l1 = (int)(c1 - (int64_t)(G - 1) * PACK_ROWS);
        for (int g = 0; g < G; g++)
            panel_fill(type, pk + (size_t)(c0 / PACK_ROWS + g) * gstride, nb,
                       panel + (size_t)g * (size_t)k * PACK_ROWS);
        for (int64_t i = 0; i < m; i += PANEL_R) {
            const int R = (int)(m - i < PANEL_R ? m - i : PANEL_R);
            panel_dispatch(R, G, a + i * lda, lda, k, panel, l1, beta, c + i * ldc + c0, ldc);
        }
    }
}

/* ---- f32 prompt rows on Intel AMX-BF16 tiles: three bf16 products ----
 * Where the CPU has AMX-BF16 (and AVX512-BF16 for the conversions), the
 * prompt rows' product runs on tiles instead of the f32 panels. Every f32
 * value v is split into hi = bf16(v) and lo = bf16(v - hi) (round to
 * nearest even both; v - hi is exact), so hi + lo carries 16 bits of v's
 * 24. A tile multiply TDPBF16PS adds products of bf16 pairs, each exact in
 * f32, to f32 sums; per block of 32 values three of them, a_hi w_hi, a_lo
 * w_hi and a_hi w_lo (in that order), go into one f32 sum per (row,
 * output) over the whole row, blocks in order. The dropped a_lo w_lo and
 * the two splits' remainders are below 2^-16 of each |a_e w_e|: |C - exact|
 * <= (2^-15 + k 2^-24) sum_e |a_e w_e| (the k 2^-24: the f32 additions).
 * A row's bits depend on its own values and the weights only, as with the
 * panels. 3 tile multiplies of 16 x 16 x 32 take ~48 cycles at the unit's
 * rate against 256 for the same fused multiply-adds on two 512-bit ports;
 * measured, with the weights' split and the tile loads, 1.4x the panels at
 * 28 rows and 2.3-2.5x at 448 (docs/PERFORMANCE.md).
 *
 * The weights: the panel's groups (up to PANEL_GROUPS of 16 rows), block b
 * of group g as two 16 x 64-byte tiles, hi then lo, line i holding for
 * output lane n the pair (w[n][32b + 2i], w[n][32b + 2i + 1]) (the layout
 * TDPBF16PS reads its second operand in), core_dequantize's floats split.
 * The activations: split once per product by core_q8_amx_split (row r's k
 * hi values, then its k lo values), read as R x 64-byte tiles. */
#define BX_TARGET                                                                                \
    target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define BX_FN static inline __attribute__((BX_TARGET, always_inline))

enum { BX_TILE = 512 /* bf16 values of one 16 x 64-byte tile */ };

/* hi and lo of 32 floats (v0 the first 16, v1 the next), 32 bf16 each in
 * value order. */
BX_FN void bx_split32(__m512 v0, __m512 v1, __m512i *hi, __m512i *lo)
{
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0); /* v0's 16, then v1's */
    const __m512 h0 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    const __m512 h1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0));
}

/* The bf16 panel of one group (see above) from its nb packed blocks at gp. */
BX_FN void bx_fill(int type, const unsigned char *gp, int64_t nb, uint16_t *out)
{
    const size_t gb = group_block_bytes(type);
    _Alignas(64) float y[QB * PACK_ROWS]; /* value e of the 16 rows at y + 16 e */
    /* word 2n of a line: value 2i of row n; 2n + 1: value 2i + 1 */
    const __m512i pair = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                          24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                          16, 0);
    for (int64_t b = 0; b < nb; b++, gp += gb, out += (size_t)2 * BX_TILE) {
        panel_fill(type, gp, 1, y);
        for (int64_t i = 0; i < QB / 2; i++) {
            __m512i h, l;
            bx_split32(_mm512_load_ps(y + 2 * i * PACK_ROWS),
                       _mm512_load_ps(y + (2 * i + 1) * PACK_ROWS), &h, &l);
            _mm512_store_si512((void *)(out + 32 * i), _mm512_permutexvar_epi16(pair, h));
            _mm512_store_si512((void *)(out + BX_TILE + 32 * i), _mm512_permutexvar_epi16(pair, l));
        }
    }
}

/* Tiles 0..G-1: the G groups' sums (R x 16 f32); 4, 5: the rows' block, hi
 * and lo (R x 32 bf16); 6, 7: a group's block, hi and lo (16 x 32 bf16). */
BX_FN void bx_config(int R)
{
    const uint8_t r = (uint8_t)R;
    const uint8_t rows[8] = {r, r, r, r, r, r, 16, 16};
    const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    tile_config(rows, colsb);
}

/* Two groups' block b (C, C + 1; the second only when G > C + 1) into
 * their sums: consecutive tile multiplies go to different sums, each sum
 * adding a_hi w_hi, a_lo w_hi, a_hi w_lo in that order. */
#define BX_PAIR(G_, C, D)                                                                        \
    do {                                                                                         \
        const uint16_t *w0 = panel + ((size_t)(C) * (size_t)nb + (size_t)b) * 2 * BX_TILE;      \
        const uint16_t *w1 = w0 + (size_t)nb * 2 * BX_TILE;                                      \
        if ((G_) > (D)) {                                                                        \
            _tile_loadd(6, w0, 64);                                                              \
            _tile_loadd(7, w1, 64);                                                              \
            _tile_dpbf16ps(C, 4, 6);                                                             \
            _tile_dpbf16ps(D, 4, 7);                                                             \
            _tile_dpbf16ps(C, 5, 6);                                                             \
            _tile_dpbf16ps(D, 5, 7);                                                             \
            _tile_loadd(6, w0 + BX_TILE, 64);                                                    \
            _tile_loadd(7, w1 + BX_TILE, 64);                                                    \
            _tile_dpbf16ps(C, 4, 6);                                                             \
            _tile_dpbf16ps(D, 4, 7);                                                             \
        } else if ((G_) > (C)) {                                                                 \
            _tile_loadd(6, w0, 64);                                                              \
            _tile_loadd(7, w0 + BX_TILE, 64);                                                    \
            _tile_dpbf16ps(C, 4, 6);                                                             \
            _tile_dpbf16ps(C, 5, 6);                                                             \
            _tile_dpbf16ps(C, 4, 7);                                                             \
        }                                                                                        \
    } while (0)

/* OP (a tile load or store) of sums tile g and group g's 16 columns of c,
 * g < G (the tile numbers must be literals). */
#define BX_SUMS(G_, OP, c_, stride_)                                                             \
    do {                                                                                         \
        OP(0, (c_), (stride_));                                                                  \
        if ((G_) > 1)                                                                            \
            OP(1, (c_) + (int64_t)PACK_ROWS, (stride_));                                         \
        if ((G_) > 2)                                                                            \
            OP(2, (c_) + (int64_t)2 * PACK_ROWS, (stride_));                                     \
        if ((G_) > 3)                                                                            \
            OP(3, (c_) + (int64_t)3 * PACK_ROWS, (stride_));                                     \
    } while (0)

/* R split rows (the tiles configured for R; row r's hi values at as + r *
 * 2k, its lo values k further) against the G groups of the bf16 panel:
 * lanes [0, l1_last) of the last group, all of the others. Where every
 * group is whole and beta is 0 or 1 the sums go from the tiles straight to
 * c (for beta 1 they start from c's values, loaded into the tiles): a
 * vector load after a tile store waits for it, ~15% of the time here. */
BX_FN void bx_rows(int R, int G, const uint16_t *as, int64_t k, const uint16_t *panel,
                   int l1_last, float beta, float *c, int64_t ldc)
{
    const int64_t nb = k / QB, stride = 4 * k; /* bytes from a row to the next */
    const int direct = l1_last == PACK_ROWS && (beta == 0.0f || beta == 1.0f);
    const int64_t cstride = ldc * (int64_t)sizeof(float);
    if (direct && beta == 1.0f) {
        BX_SUMS(G, _tile_loadd, c, cstride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t b = 0; b < nb; b++) {
        _tile_loadd(4, as + b * QB, stride);
        _tile_loadd(5, as + k + b * QB, stride);
        BX_PAIR(G, 0, 1);
        BX_PAIR(G, 2, 3);
    }
    if (direct) {
        BX_SUMS(G, _tile_stored, c, cstride);
        __asm__ volatile("" ::: "memory"); /* _tile_stored does not say it writes c */
        return;
    }
    _Alignas(64) float cs[16 * 16];
    for (int g = 0; g < G; g++) {
        switch (g) {
        case 0: _tile_stored(0, cs, 64); break;
        case 1: _tile_stored(1, cs, 64); break;
        case 2: _tile_stored(2, cs, 64); break;
        default: _tile_stored(3, cs, 64); break;
        }
        __asm__ volatile("" ::: "memory"); /* _tile_stored does not say it writes cs */
        const int l1 = g == G - 1 ? l1_last : PACK_ROWS;
        const __mmask16 keep = (__mmask16)((1u << l1) - 1u);
        for (int r = 0; r < R; r++) {
            float *cr = c + r * ldc + (int64_t)g * PACK_ROWS;
            __m512 v = _mm512_load_ps(cs + (int64_t)16 * r);
            if (beta != 0.0f)
                v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(keep, cr), v);
            _mm512_mask_storeu_ps(cr, keep, v);
        }
    }
}
#undef BX_PAIR
#undef BX_SUMS

BX_FN void packed_bx_body(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                          const uint16_t *as, const unsigned char *pk, float *panel, float beta,
                          float *c, int64_t ldc)
{
    const int64_t nb = k / QB;
    const size_t gstride = (size_t)nb * group_block_bytes(type);
    uint16_t *bp = (uint16_t *)(void *)panel; /* 4 bytes a weight: the f32 panel's size */
    int cfg_r = 0;
    for (int64_t c0 = j0; c0 < j1; c0 += CORE_Q8_PANEL_ROWS) {
        const int64_t c1 = j1 - c0 < CORE_Q8_PANEL_ROWS ? j1 - c0 : CORE_Q8_PANEL_ROWS;
        const int G = (int)((c1 + PACK_ROWS - 1) / PACK_ROWS);
        const int l1 = (int)(c1 - (int64_t)(G - 1) * PACK_ROWS);
        for (int g = 0; g < G; g++)
            bx_fill(type, pk + (size_t)(c0 / PACK_ROWS + g) * gstride, nb,
                    bp + (size_t)g * (size_t)nb * 2 * BX_TILE);
        __asm__ volatile("" ::: "memory"); /* the fill's stores before the tile loads */
        for (int64_t i = 0; i < m; i += AMX_MAX_R) {
            const int R = (int)(m - i < AMX_MAX_R ? m - i : AMX_MAX_R);
            if (R != cfg_r)
                bx_config(cfg_r = R);
            bx_rows(R, G, as + i * 2 * k, k, bp, l1, beta, c + i * ldc + c0, ldc);
        }
    }
    if (cfg_r)
        _tile_release();
}

__attribute__((BX_TARGET)) static void packed_bx(int type, int64_t m, int64_t j0, int64_t j1,
                                                 int64_t k, const uint16_t *as,
                                                 const unsigned char *pk, float *panel,
                                                 float beta, float *c, int64_t ldc)
{
    if (type == CORE_TTYPE_Q4_1)
        packed_bx_body(CORE_TTYPE_Q4_1, m, j0, j1, k, as, pk, panel, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_0)
        packed_bx_body(CORE_TTYPE_Q4_0, m, j0, j1, k, as, pk, panel, beta, c, ldc);
    else
        packed_bx_body(CORE_TTYPE_Q8_0, m, j0, j1, k, as, pk, panel, beta, c, ldc);
}

__attribute__((BX_TARGET)) static void bx_split_rows(const float *a, int64_t lda, int64_t m,
                                                     int64_t k, uint16_t *out)
{
    for (int64_t r = 0; r < m; r++, out += 2 * k)
        for (int64_t e = 0; e < k; e += QB) {
            __m512i h, l;
            bx_split32(_mm512_loadu_ps(a + r * lda + e), _mm512_loadu_ps(a + r * lda + e + 16),
                       &h, &l);
            _mm512_store_si512((void *)(out + e), h);
            _mm512_store_si512((void *)(out + k + e), l);
        }
}

/* One instance per type: the panel fill's type tests fold away. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
packed_f32(int type, int64_t m, int64_t j0, int64_t j1, int64_t k, const float *a, int64_t lda,
           const unsigned char *pk, float *panel, float beta, float *c, int64_t ldc)
{
    if (type == CORE_TTYPE_Q4_1)
        packed_f32_body(CORE_TTYPE_Q4_1, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_0)
        packed_f32_body(CORE_TTYPE_Q4_0, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    else
        packed_f32_body(CORE_TTYPE_Q8_0, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
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

/* The tiles run only where the CPU has them and Linux let this process use
 * them (tile data is an XSAVE component a process must ask for; cpu.c asks).
 * The prompt rows' bf16 products also need AMX-BF16 and AVX512-BF16. */
static _Atomic int amx_mode = CORE_Q8_AMX_AUTO;
static _Atomic int bx_mode = CORE_Q8_AMX_AUTO;

int core_q8_amx_available(void)
{
#ifdef PACK_AMX
    return core_qdot_best_isa() == CORE_QDOT_AVX512VNNI &&
           core_cpu_has(CORE_CPU_AMX_TILE | CORE_CPU_AMX_INT8);
#else
    return 0;
#endif
}

int core_q8_amx_panels_available(void)
{
    return core_q8_amx_available() && core_cpu_has(CORE_CPU_AMX_BF16 | CORE_CPU_AVX512BF16);
}

/* A forcing mode into slot: ON only where the unit is available. */
static int force_mode(_Atomic int *slot, core_q8_amx_mode_t mode, int available)
{
    if (mode != CORE_Q8_AMX_AUTO && mode != CORE_Q8_AMX_OFF && mode != CORE_Q8_AMX_ON)
        return CORE_EINVAL;
    if (mode == CORE_Q8_AMX_ON && !available)
        return CORE_EUNSUPPORTED;
    atomic_store_explicit(slot, mode, memory_order_relaxed);
    return 0;
}

int core_q8_force_amx_panels(core_q8_amx_mode_t mode)
{
    return force_mode(&bx_mode, mode, core_q8_amx_panels_available());
}

int core_q8_amx_panels_used(void)
{
    return atomic_load_explicit(&bx_mode, memory_order_relaxed) != CORE_Q8_AMX_OFF &&
           core_qdot_isa() == CORE_QDOT_AVX512VNNI && core_q8_amx_panels_available();
}

int core_q8_force_amx(core_q8_amx_mode_t mode)
{
    return force_mode(&amx_mode, mode, core_q8_amx_available());
}

int core_q8_amx_used(int64_t m)
{
    const int mode = atomic_load_explicit(&amx_mode, memory_order_relaxed);
    if (mode == CORE_Q8_AMX_OFF || m < 1 || core_qdot_isa() != CORE_QDOT_AVX512VNNI ||
        !core_q8_amx_available())
        return 0;
    return mode == CORE_Q8_AMX_ON || m >= CORE_Q8_AMX_MIN_ROWS;
}

int core_q8_matmul_packed(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                          const void *pk, float beta, float *c, int64_t ldc)
{
    const core_qdot_isa_t isa = core_qdot_isa(); /* once: a call per chunk of 64 rows */
    if (!packs(type) || !isa_packs(isa) || j0 < 0 || j1 < j0)
        return CORE_EINVAL;
#if defined(__aarch64__)
    core_q8_matmul_packed_neon(isa == CORE_QDOT_NEON_DOTPROD, type, qa, j0, j1, pk, beta, c, ldc);
    return 0;
#elif defined(PACK_X86)
    const unsigned char *p = pk;
    if (isa == CORE_QDOT_AVX2)
        core_q8_matmul_packed_avx2(type, qa, j0, j1, p, beta, c, ldc);
    else if (core_q8_amx_used(qa->m) && qa->nb <= CORE_Q8_AMX_MAX_BLOCKS)
        packed_amx(type, qa, j0, j1, p, beta, c, ldc);
    else if (type == CORE_TTYPE_Q4_0)
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
                        int64_t lda, const void *pk, float *panel, float beta, float *c,
                        int64_t ldc)
{
    if (!core_q8_pack_supported(type) || j0 < 0 || j1 < j0 || j0 % PACK_ROWS != 0 || m < 0 ||
        k <= 0 || k % QB != 0 || (uintptr_t)panel % 64 != 0)
        return CORE_EINVAL;
#if defined(__aarch64__)
    core_qmatmul_packed_neon(type, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    return 0;
#elif defined(PACK_X86)
    if (core_qdot_isa() == CORE_QDOT_AVX2)
        core_qmatmul_packed_avx2(type, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
    else
        packed_f32(type, m, j0, j1, k, a, lda, pk, panel, beta, c, ldc);
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

int core_q8_amx_split(const float *a, int64_t lda, int64_t m, int64_t k, uint16_t *out)
{
    if (!core_q8_amx_panels_available() || m < 0 || k <= 0 || k % QB != 0 || lda < k ||
        (uintptr_t)out % 64 != 0)
        return CORE_EINVAL;
#ifdef PACK_AMX
    bx_split_rows(a, lda, m, k, out);
    return 0;
#else
    (void)a;
    return CORE_EINVAL;
#endif
}

int core_qmatmul_packed_amx(int type, int64_t m, int64_t j0, int64_t j1, int64_t k,
                            const uint16_t *as, const void *pk, float *panel, float beta,
                            float *c, int64_t ldc)
{
    if (!core_q8_amx_panels_available() || !core_q8_pack_supported(type) || j0 < 0 || j1 < j0 ||
        j0 % PACK_ROWS != 0 || m < 0 || k <= 0 || k % QB != 0 || (uintptr_t)panel % 64 != 0 ||
        (uintptr_t)as % 64 != 0)
        return CORE_EINVAL;
#ifdef PACK_AMX
    packed_bx(type, m, j0, j1, k, as, pk, panel, beta, c, ldc);
    return 0;
#else
    (void)pk;
    (void)beta;
    (void)c;
    (void)ldc;
    return CORE_EINVAL;
#endif
}
