/* core/kernels/qdot_q8.c — integer dot products of 8-bit activations with Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weight rows (the API and error
 * contract are in core/kernels/qdot.h).
 *
 * Per block of 32 the product is an integer: I = sum_i u_i * q_i with u the
 * weight's integer values (the stored quants 0..15 or, Q5, 0..31; int8 for
 * Q8_0; sc (u - 32) for Q6_K, see below) and q the activation's int8 quants.
 * A block then adds d_w d_a I + m_w d_a s (s = sum q, m_w the offset: Q4_1's
 * and Q5_1's m, -8 d_w for Q4_0 whose values are d_w (u - 8), -16 d_w for
 * Q5_0, -dmin mn for Q4_K and Q5_K, 0 for Q8_0 and Q6_K). Keeping the quants
 * unsigned lets the Q4 and Q5 types share the u8 x s8 instruction (maddubs,
 * dpbusd) without sign tricks; the signed weights of Q8_0 and Q6_K go
 * through |w| x (sign(w) q). No integer overflow anywhere: maddubs pairs are
 * at most 2 * 128 * 127 = 32512 < 2^15, a block sum at most 2^19 (Q6_K:
 * 32 * 128 * 32 * 127 < 2^24, so it also converts to float exactly).
 *
 * The scalar kernel is the reference: it defines the integers and the float
 * operations (per block: (d_w * d_a) * I, then m_w * ds with ds = d_a * s
 * formed at quantization, summed in block order). SIMD kernels form the same
 * integers and the same two products but sum them in lanes, so they differ
 * from the reference only in the order of float additions.
 *
 * Every output is computed by the same one-row kernel, whatever the number
 * of activation rows (the weight row is re-expanded for each; it stays in
 * L1) and whatever range of weight rows a call covers: a decode row gets the
 * same bits alone, in a batch, or on any number of threads. That matters
 * more than it seems: the next product quantizes these outputs again, and
 * rounding to 8 bits turns a last-bit difference near a rounding boundary
 * into a difference of one quantization step.
 *
 * Quantizing the activations is shared by all ISAs: max |x| (exact in any
 * order), d = max / 127, id = 127 / max, q = round_to_nearest_even(clamp(x *
 * id, +-127)); the AVX2 version does those same operations eight lanes at a
 * time, the NEON one four, so every ISA writes the same bytes.
 *
 * The aarch64 kernels (NEON, NEON with SDOT) are in core/kernels/qdot_neon.c;
 * mm() and core_q8_quantize_isa dispatch to them.
 */
#include <math.h>
#include <string.h>

#include "core/err.h"
#include "core/kernels/qdot.h"
#include "core/kernels/qdot_neon_impl.h"
#include "core/tensor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q8_X86 1
#endif

enum { QB = CORE_Q8_BLOCK }; /* values per block */
/* How far ahead of the row being multiplied the SIMD kernels prefetch the
 * weights. A decode product is one pass over a matrix that comes from
 * memory; the hardware prefetcher alone kept one core at ~5 GB/s of Q4_1
 * where this gets ~9 (build/tools/bench_qdot --n 100000, medians of 21;
 * 1 KiB, 2, 4 and 8 KiB were all within noise of each other, well above
 * none). Prefetches past the matrix's end do not fault. */
#ifndef Q8_PF_BYTES
#define Q8_PF_BYTES 4096
#endif

int core_q8_supported(int type)
{
    return type == CORE_TTYPE_Q4_0 || type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q5_0 ||
           type == CORE_TTYPE_Q5_1 || type == CORE_TTYPE_Q8_0 || type == CORE_TTYPE_Q4_K ||
           type == CORE_TTYPE_Q5_K || type == CORE_TTYPE_Q6_K;
}

/* K-quant super-blocks of 256 values hold 8 of our activation blocks; block
 * i (0..7) of a super-block (layouts as core/tensor.c's core_dequantize):
 *  - Q4_K (d, dmin, scales[12], qs[128]) and Q5_K (d, dmin, scales[12],
 *    qh[32], qs[128]): one sub-block with d_w = d sc_i and m_w = -dmin mn_i
 *    (6-bit sc, mn; both products exact in float), its quants the low (i
 *    even) or high (i odd) nibbles of qs[32 (i / 2) ..][32], plus for Q5_K
 *    bit i of qh[e] as bit 4 of value e;
 *  - Q6_K (ql[128], qh[64], scales[16] int8, d): two sub-blocks of 16 with
 *    scales sc[2i], sc[2i + 1]; value e is d sc (u_e - 32), u_e the low (i %
 *    4 < 2) or high nibble of ql[64 (i / 4) + 32 (i % 2) + e] and bits 2 (i %
 *    4) and up of qh[32 (i / 4) + e] as bits 4-5. The scales go into the
 *    integer, I = sum_e sc (u_e - 32) q_e, with d_w = d and no offset: the
 *    two halves' scales differ, so a per-block d_w could not carry them. */
enum {
    QK_SUPER = 256,
    Q4K_BYTES = 144,
    Q5K_BYTES = 176,
    Q6K_BYTES = 210,
    Q6K_SC = 192,
    Q6K_D = 208
};

static inline int is_k(int type)
{
    return type == CORE_TTYPE_Q4_K || type == CORE_TTYPE_Q5_K || type == CORE_TTYPE_Q6_K;
}

/* bytes of a K-quant super-block */
static inline size_t k_bytes(int type)
{
    return type == CORE_TTYPE_Q4_K ? Q4K_BYTES : type == CORE_TTYPE_Q5_K ? Q5K_BYTES : Q6K_BYTES;
}

/* offset of Q4_K's and Q5_K's qs in their super-block */
static inline size_t kqs_off(int type)
{
    return type == CORE_TTYPE_Q5_K ? 48 : 16;
}

/* 1 when blocks add m_w * ds (every type but Q8_0 and Q6_K) */
static inline int has_off(int type)
{
    return type != CORE_TTYPE_Q8_0 && type != CORE_TTYPE_Q6_K;
}

/* 1 when the block's integer weights are signed (|w| x sign(w) q) */
#ifdef Q8_X86 /* only the SIMD kernels move the weights' signs */
static inline int is_signed(int type)
{
    return type == CORE_TTYPE_Q8_0 || type == CORE_TTYPE_Q6_K;
}
#endif

static void k_scale_min(int j, const unsigned char *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Block geometry (ggml's layouts; constant-folded in each instantiation):
 * Q4_0 d | qs[16]; Q4_1 d m | qs[16]; Q5_0 d | qh[4] | qs[16]; Q5_1 d m |
 * qh[4] | qs[16]; Q8_0 d | qs[32] (int8). A Q4/Q5 value is d u + m with u
 * the stored nibble (plus qh bit j as bit 4 of value j for Q5), m stored
 * (Q4_1, Q5_1) or -8 d (Q4_0), -16 d (Q5_0). */
static inline size_t blk_bytes(int type)
{
    switch (type) {
    case CORE_TTYPE_Q4_0: return 18;
    case CORE_TTYPE_Q4_1: return 20;
    case CORE_TTYPE_Q5_0: return 22;
    case CORE_TTYPE_Q5_1: return 24;
    case CORE_TTYPE_Q8_0: return 34;
    default: return 0; /* K-quants are addressed by super-block (k_bytes) */
    }
}

static inline size_t qs_off(int type)
{
    return type == CORE_TTYPE_Q4_1 ? 4 : type == CORE_TTYPE_Q5_0 ? 6 : type == CORE_TTYPE_Q5_1 ? 8 : 2;
}

static inline int has_m(int type)
{
    return type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q5_1;
}

static inline int is_q5(int type)
{
    return type == CORE_TTYPE_Q5_0 || type == CORE_TTYPE_Q5_1;
}

/* m = mul * d for the types without a stored offset */
static inline float m_mul(int type)
{
    return type == CORE_TTYPE_Q5_0 ? -16.0f : -8.0f;
}

size_t core_q8_act_bytes(int64_t m, int64_t k)
{
    const size_t nb = (size_t)((k + QB - 1) / QB);
    const size_t bytes = (size_t)m * nb * (QB + 2 * sizeof(float) + sizeof(int32_t));
    return (bytes + 63) & ~(size_t)63;
}

void core_q8_act_init(core_q8_act_t *qa, void *buf, int64_t m, int64_t k)
{
    const int64_t nb = (k + QB - 1) / QB;
    qa->m = m;
    qa->k = k;
    qa->nb = nb;
    qa->q = buf;
    qa->d = (float *)(void *)((char *)buf + (size_t)(m * nb) * QB);
    qa->s = (int32_t *)(void *)(qa->d + m * nb);
    qa->ds = (float *)(void *)(qa->s + m * nb);
}

static uint16_t rd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- activation quantization ---- */

/* One block of n <= 32 values (the rest of the block is zero). */
static void quant_block(const float *x, int64_t n, int8_t *q, float *d, int32_t *s, float *ds)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float v = fabsf(x[i]);
        amax = v > amax ? v : amax;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < QB; i++) {
        float v = i < n ? x[i] * id : 0.0f;
        v = v < 127.0f ? v : 127.0f; /* NaN -> 127, as minps */
        v = v > -127.0f ? v : -127.0f;
        const int qi = (int)nearbyintf(v); /* nearest even: the default mode */
        q[i] = (int8_t)qi;
        sum += qi;
    }
    *s = sum;
    *ds = *d * (float)sum;
}

static void quant_generic(core_q8_act_t *qa, const float *a, int64_t lda)
{
    for (int64_t r = 0; r < qa->m; r++)
        for (int64_t b = 0; b < qa->nb; b++) {
            const int64_t n = qa->k - b * QB < QB ? qa->k - b * QB : QB;
            quant_block(a + r * lda + b * QB, n, qa->q + (r * qa->nb + b) * QB,
                        qa->d + r * qa->nb + b, qa->s + r * qa->nb + b, qa->ds + r * qa->nb + b);
        }
}

#ifdef Q8_X86
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))

AVX2_INL float hsum8(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AVX2_INL int32_t hsum8i(__m256i s)
{
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

AVX2_INL float half(const unsigned char *p)
{
    return _cvtsh_ss(rd16(p));
}

/* v · id clamped to [−127, 127] (NaN to 127, as minps), rounded to nearest
 * even, as 32-bit integers. */
AVX2_INL __m256i quant8(__m256 v, __m256 id, __m256 hi, __m256 lo)
{
    __m256 t = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(v, id), hi), lo);
    t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(t);
}

AVX2_FN static void quant_avx2(core_q8_act_t *qa, const float *a, int64_t lda)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int64_t full = qa->k / QB;
    for (int64_t r = 0; r < qa->m; r++) {
        const float *x = a + r * lda;
        for (int64_t b = 0; b < full; b++, x += QB) {
            /* named vectors, not an array: gcc splits these unaligned
             * loads in two and, for an array, put the halves through the
             * stack, where each whole-vector reload waited for two stores
             * it could not forward (~4x the time of this loop) */
            const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
            const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absm), _mm256_and_ps(v1, absm)),
                                      _mm256_max_ps(_mm256_and_ps(v2, absm), _mm256_and_ps(v3, absm)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            qa->d[r * qa->nb + b] = amax / 127.0f;
            const __m256 idv = _mm256_set1_ps(id);
            const __m256i q0 = quant8(v0, idv, hi, lo), q1 = quant8(v1, idv, hi, lo);
            const __m256i q2 = quant8(v2, idv, hi, lo), q3 = quant8(v3, idv, hi, lo);
            const int32_t sum = hsum8i(
                _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
            qa->s[r * qa->nb + b] = sum;
            qa->ds[r * qa->nb + b] = (amax / 127.0f) * (float)sum;
            /* packs work per 128-bit lane: the permute restores element order */
            const __m256i p16a = _mm256_packs_epi32(q0, q1);
            const __m256i p16b = _mm256_packs_epi32(q2, q3);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm);
            _mm256_storeu_si256((__m256i *)(void *)(qa->q + (r * qa->nb + b) * QB), p8);
        }
        if (full < qa->nb) /* a partial last block */
            quant_block(x, qa->k - full * QB, qa->q + (r * qa->nb + full) * QB,
                        qa->d + r * qa->nb + full, qa->s + r * qa->nb + full,
                        qa->ds + r * qa->nb + full);
    }
}
#endif

int core_q8_quantize_isa(core_qdot_isa_t isa, core_q8_act_t *qa, const float *a, int64_t lda)
{
    if (!core_qdot_isa_runs(isa))
        return CORE_EUNSUPPORTED;
#ifdef Q8_X86
    if (isa >= CORE_QDOT_AVX2) {
        quant_avx2(qa, a, lda);
        return 0;
    }
#endif
#ifdef __aarch64__
    if (isa >= CORE_QDOT_NEON) {
        core_q8_quantize_neon(qa, a, lda);
        return 0;
    }
#endif
    quant_generic(qa, a, lda);
    return 0;
}

void core_q8_quantize(core_q8_act_t *qa, const float *a, int64_t lda)
{
    (void)core_q8_quantize_isa(core_qdot_isa(), qa, a, lda);
}

static inline void put(float *c, float v, float beta)
{
    *c = beta == 0.0f ? v : v + beta * *c;
}

/* ---- scalar reference ---- */

/* Block b (of 32 values) of a weight row as the integer path sees it: its
 * 32 integer weights u, its scale d_w and offset m_w (value e is d_w u_e +
 * m_w). This defines the integers every kernel must form. */
static void ref_block(int type, const unsigned char *row, int64_t b, int *u, float *dw, float *mw)
{
    *mw = 0.0f;
    if (is_k(type)) {
        const unsigned char *sb = row + (size_t)(b / 8) * k_bytes(type);
        const int i = (int)(b % 8);
        if (type == CORE_TTYPE_Q6_K) {
            const int j = i % 4;
            const unsigned char *ql = sb + (size_t)(i / 4) * 64 + (size_t)(j % 2) * 32,
                                *qh = sb + 128 + (size_t)(i / 4) * 32;
            const int8_t *sc = (const int8_t *)(const void *)(sb + Q6K_SC) + (size_t)i * 2;
            for (int e = 0; e < QB; e++) {
                const int v =
                    ((j < 2 ? ql[e] : ql[e] >> 4) & 0x0f) | (((qh[e] >> (2 * j)) & 3) << 4);
                u[e] = sc[e / 16] * (v - 32);
            }
            *dw = core_fp16_to_fp32(rd16(sb + Q6K_D));
            return;
        }
        int sc, mn;
        k_scale_min(i, sb + 4, &sc, &mn);
        *dw = core_fp16_to_fp32(rd16(sb)) * (float)sc;
        *mw = -(core_fp16_to_fp32(rd16(sb + 2)) * (float)mn);
        const unsigned char *qs = sb + kqs_off(type) + (size_t)(i / 2) * 32;
        for (int e = 0; e < QB; e++) {
            u[e] = (i % 2 ? qs[e] >> 4 : qs[e]) & 0x0f;
            if (type == CORE_TTYPE_Q5_K)
                u[e] |= ((sb[16 + e] >> i) & 1) << 4;
        }
        return;
    }
    const unsigned char *blk = row + (size_t)b * blk_bytes(type);
    *dw = core_fp16_to_fp32(rd16(blk));
    if (type == CORE_TTYPE_Q8_0) {
        for (int e = 0; e < QB; e++)
            u[e] = (blk[2 + e] ^ 0x80) - 128; /* the int8 of the byte */
        return;
    }
    const unsigned char *qs = blk + qs_off(type);
    uint32_t qh = 0;
    if (is_q5(type))
        memcpy(&qh, blk + (has_m(type) ? 4 : 2), sizeof qh);
    for (int e = 0; e < QB / 2; e++) {
        u[e] = (qs[e] & 0x0f) | (int)(((qh >> e) & 1u) << 4);
        u[e + QB / 2] = (qs[e] >> 4) | (int)(((qh >> (e + 16)) & 1u) << 4);
    }
    *mw = has_m(type) ? core_fp16_to_fp32(rd16(blk + 2)) : m_mul(type) * *dw;
}

static void mm_generic(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                       const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const int64_t nb = qa->nb;
    for (int64_t j = j0; j < j1; j++) {
        const unsigned char *row = w + (size_t)j * row_bytes;
        for (int64_t r = 0; r < qa->m; r++) {
            const int8_t *q = qa->q + r * nb * QB;
            const float *d = qa->d + r * nb;
            const float *ds = qa->ds + r * nb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int u[QB];
                float dw, mw;
                ref_block(type, row, b, u, &dw, &mw);
                int32_t isum = 0;
                for (int e = 0; e < QB; e++)
                    isum += u[e] * q[b * QB + e];
                const float t = (dw * d[b]) * (float)isum;
                acc += t;
                if (has_off(type)) {
                    const float tm = mw * ds[b];
                    acc += tm;
                }
            }
            put(c + r * ldc + j, acc, beta);
        }
    }
}

#ifdef Q8_X86
/* ---- AVX2: one block per step, u8 x s8 with maddubs ---- */

/* The 32 unsigned nibbles of a Q4 block in element order: low nibbles are
 * values 0..15 (low lane), high nibbles 16..31 (high lane). */
AVX2_INL __m256i nibbles256(const unsigned char *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}

/* Bit j of the 32 bits at p as 0x10 in byte j, 0 elsewhere (Q5's fifth
 * bits, in element order). */
AVX2_INL __m256i bits5(const unsigned char *p)
{
    uint32_t x;
    memcpy(&x, p, sizeof x);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

/* The 32 unsigned quants u of a Q4/Q5 block in element order. */
AVX2_INL __m256i quants256(int type, const unsigned char *blk)
{
    const __m256i u = nibbles256(blk + qs_off(type));
    return is_q5(type) ? _mm256_or_si256(u, bits5(blk + (has_m(type) ? 4 : 2))) : u;
}

/* d_w and m_w of the 8 blocks of a K-quant super-block as vectors (Q6_K: d
 * eight times; its m_w are 0 and never read). */
AVX2_INL void kscales8(int type, const unsigned char *sb, __m256 *dw, __m256 *mw)
{
    if (type == CORE_TTYPE_Q6_K) {
        *dw = _mm256_set1_ps(half(sb + Q6K_D));
        *mw = _mm256_setzero_ps();
        return;
    }
    unsigned char sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        int s, m;
        k_scale_min(j, sb + 4, &s, &m);
        sc[j] = (unsigned char)s;
        mn[j] = (unsigned char)m;
    }
    const __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)sc)));
    const __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)mn)));
    *dw = _mm256_mul_ps(_mm256_set1_ps(half(sb)), fs);
    /* -(dmin * mn): the negation is exact */
    *mw = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(half(sb + 2)), fm), _mm256_set1_ps(-0.0f));
}

/* Bit i of each of the 32 bytes at p as 0x10 (Q5_K's fifth bits of block i). */
AVX2_INL __m256i kbits5(const unsigned char *p, int i)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, i), 4), _mm256_set1_epi8(0x10));
}

/* The 32 unsigned quants of Q4_K / Q5_K block i (0..7) of the super-block at sb. */
AVX2_INL __m256i kquants256(int type, const unsigned char *sb, int i)
{
    const __m256i v =
        _mm256_loadu_si256((const __m256i *)(const void *)(sb + kqs_off(type) + (size_t)(i / 2) * 32));
    const __m256i u = _mm256_and_si256(i % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    return type == CORE_TTYPE_Q5_K ? _mm256_or_si256(u, kbits5(sb + 16, i)) : u;
}

/* The 32 signed quants u - 32 of Q6_K block i (0..7) of the super-block at sb. */
AVX2_INL __m256i q6quants256(const unsigned char *sb, int i)
{
    const int j = i % 4;
    const __m256i l =
        _mm256_loadu_si256((const __m256i *)(const void *)(sb + (size_t)(i / 4) * 64 + (size_t)(j % 2) * 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(sb + 128 + (size_t)(i / 4) * 32));
    const __m256i lo =
        _mm256_and_si256(j < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0f));
    /* two bits per byte shifted to bits 4-5: nothing crosses a byte */
    const __m256i hi =
        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j), _mm256_set1_epi8(3)), 4);
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

/* Q6_K block i's two scales as 16-bit lanes: sc[2i] for values 0..15 (low
 * lane), sc[2i + 1] for 16..31. */
AVX2_INL __m256i q6scales16(const unsigned char *sb, int i)
{
    const int8_t *sc = (const int8_t *)(const void *)(sb + Q6K_SC);
    return _mm256_set_m128i(_mm_set1_epi16(sc[(size_t)i * 2 + 1]), _mm_set1_epi16(sc[(size_t)i * 2]));
}

/* The f16 scales of 8 blocks bb bytes apart: d (offset 0) into *dw and, for
 * Q4_1, m (offset 2) into *mw. One gather of the 4 bytes at each block start. */
AVX2_INL void scales8(int type, const unsigned char *blk, size_t bb, __m256 *dw, __m256 *mw)
{
    const int s = (int)bb;
    const __m256i idx = _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
    const __m256i g = _mm256_i32gather_epi32((const int *)(const void *)blk, idx, 1);
    const __m256i lo = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    const __m256i hi = _mm256_srli_epi32(g, 16);
    /* per lane [d0..d3 m0..m3 | d4..d7 m4..m7], then [d0..d7 | m0..m7] */
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    *dw = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *mw = has_m(type) ? _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1))
                      : _mm256_mul_ps(*dw, _mm256_set1_ps(m_mul(type)));
}

/* d_w and m_w of the 8 blocks from block b on (b a multiple of 8). */
AVX2_INL void step_scales8(int type, const unsigned char *row, int64_t b, __m256 *dw, __m256 *mw)
{
    if (is_k(type))
        kscales8(type, row + (size_t)(b / 8) * k_bytes(type), dw, mw);
    else
        scales8(type, row + (size_t)b * blk_bytes(type), blk_bytes(type), dw, mw);
}

/* The integer products of block b + i of a weight row with the activation
 * quants qv, as 8 lane sums of 4 products each (their sum is the block's
 * I). For K-quants b is a multiple of 8 (the super-block) and i < 8. */
AVX2_INL __m256i block_dot256(int type, const unsigned char *row, int64_t b, int i, __m256i qv)
{
    const unsigned char *sb = row + (size_t)(b / 8) * k_bytes(type);
    const unsigned char *blk = row + (size_t)(b + i) * blk_bytes(type);
    const __m256i ones = _mm256_set1_epi16(1);
    if (is_signed(type)) {
        const __m256i sw = type == CORE_TTYPE_Q6_K
                               ? q6quants256(sb, i)
                               : _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(sw, sw), _mm256_sign_epi8(qv, sw));
        /* Q6_K: each 16-bit pair sum times its half's scale (at most 8128 * 128) */
        return _mm256_madd_epi16(p, type == CORE_TTYPE_Q6_K ? q6scales16(sb, i) : ones);
    }
    const __m256i u = is_k(type) ? kquants256(type, sb, i) : quants256(type, blk);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, qv), ones);
}

/* Blocks b..nb-1 (fewer than 8 left; never for K-quants, whose rows are
 * whole super-blocks): one at a time, the scale a scalar. */
AVX2_INL void tail256(int type, const unsigned char *row, const int8_t *q, const float *d,
                      const float *ds, int64_t b, int64_t nb, __m256 *acc, float *mtail)
{
    for (; b < nb && !is_k(type); b++) {
        const unsigned char *blk = row + (size_t)b * blk_bytes(type);
        const float dw = half(blk);
        const __m256i p = block_dot256(
            type, row, b, 0, _mm256_loadu_si256((const __m256i *)(const void *)(q + b * QB)));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * d[b]), _mm256_cvtepi32_ps(p), *acc);
        if (has_off(type)) {
            const float mw = has_m(type) ? half(blk + 2) : m_mul(type) * dw;
            const float tm = mw * ds[b];
            *mtail += tm;
        }
    }
}

/* One weight row against one activation row (decode), eight blocks per step:
 * their scales as vectors (one gather), four accumulators so that the
 * additions of consecutive blocks do not wait for each other. */
AVX2_INL void row1_avx2(int type, const core_q8_act_t *qa, int64_t ri, const unsigned char *row,
                        float beta, float *c)
{
    const int64_t nb = qa->nb;
    const int8_t *q = qa->q + ri * nb * QB;
    const float *d = qa->d + ri * nb, *ds = qa->ds + ri * nb;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    __m256 macc = _mm256_setzero_ps();
    float mtail = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 dw8, mw8;
        step_scales8(type, row, b, &dw8, &mw8);
        const __m256 sc8 = _mm256_mul_ps(dw8, _mm256_loadu_ps(d + b));
        if (has_off(type))
            macc = _mm256_fmadd_ps(mw8, _mm256_loadu_ps(ds + b), macc);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m256i p =
                block_dot256(type, row, b, i,
                             _mm256_loadu_si256((const __m256i *)(const void *)(q + (b + i) * QB)));
            const __m256 s = _mm256_permutevar8x32_ps(sc8, _mm256_set1_epi32(i));
            acc[i & 3] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[i & 3]);
        }
    }
    tail256(type, row, q, d, ds, b, nb, &acc[0], &mtail);
    const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    put(c, (hsum8(s) + hsum8(macc)) + mtail, beta);
}

/* The cache lines of the weights Q8_PF_BYTES past row (of row_bytes). */
AVX2_INL void prefetch_row(const unsigned char *row, size_t row_bytes)
{
    for (size_t o = 0; o < row_bytes; o += 64)
        _mm_prefetch((const char *)row + Q8_PF_BYTES + o, _MM_HINT_T0);
}

AVX2_INL void mm_avx2(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                      const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    for (int64_t j = j0; j < j1; j++) {
        const unsigned char *row = w + (size_t)j * row_bytes; /* in L1 after the first row */
        prefetch_row(row, row_bytes);
        for (int64_t r = 0; r < qa->m; r++)
            row1_avx2(type, qa, r, row, beta, c + r * ldc + j);
    }
}

#define Q8_INSTANCE(suffix, attr, body, TYPE)                                                    \
    attr static void mm_##suffix(const core_q8_act_t *qa, int64_t j0, int64_t j1,                 \
                                 const unsigned char *w, size_t row_bytes, float beta, float *c, \
                                 int64_t ldc)                                                    \
    {                                                                                            \
        body(TYPE, qa, j0, j1, w, row_bytes, beta, c, ldc);                                      \
    }

Q8_INSTANCE(q4_0_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q4_0)
Q8_INSTANCE(q4_1_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q4_1)
Q8_INSTANCE(q5_0_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q5_0)
Q8_INSTANCE(q5_1_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q5_1)
Q8_INSTANCE(q4_k_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q4_K)
Q8_INSTANCE(q5_k_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q5_K)
Q8_INSTANCE(q6_k_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q6_K)
Q8_INSTANCE(q8_0_avx2, AVX2_FN, mm_avx2, CORE_TTYPE_Q8_0)

/* ---- AVX-512 VNNI: two blocks per 512-bit step, u8 x s8 with dpbusd ---- */

#define VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VNNI_INL                                                                                 \
    static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"),  \
                                 always_inline))

/* The 4 int8 scales of Q6_K blocks i, i + 1 (i even) as 32-bit lanes, each
 * four times: [sc[2i] x 4, sc[2i + 1] x 4, sc[2i + 2] x 4, sc[2i + 3] x 4]. */
VNNI_INL __m512i q6scales512(const unsigned char *sb, int i)
{
    int32_t s4;
    memcpy(&s4, sb + Q6K_SC + (size_t)i * 2, sizeof s4);
    const __m128i rep = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(s4), rep));
}

VNNI_INL float hsum16(__m512 s)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(s),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1))));
}

/* One weight row against one activation row, eight blocks per step as
 * row1_avx2, two blocks per 512-bit product. The nibbles of a pair are laid
 * out [lo0 lo1 hi0 hi1] (one shift of the two 16-byte loads), so the
 * activation pair [a0 lo, a0 hi, a1 lo, a1 hi] is shuffled to match. */
VNNI_INL void row1_vnni(int type, const core_q8_act_t *qa, int64_t ri, const unsigned char *row,
                        float beta, float *c)
{
    const int64_t nb = qa->nb;
    const size_t bb = blk_bytes(type);
    const int8_t *q = qa->q + ri * nb * QB;
    const float *d = qa->d + ri * nb, *ds = qa->ds + ri * nb;
    const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 macc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float mtail = 0.0f;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const unsigned char *blk = row + (size_t)b * bb;
        const unsigned char *sb = row + (size_t)(b / 8) * k_bytes(type);
        __m256 dw8, mw8;
        step_scales8(type, row, b, &dw8, &mw8);
        const __m512 sc8 = _mm512_castps256_ps512(_mm256_mul_ps(dw8, _mm256_loadu_ps(d + b)));
        if (has_off(type))
            macc = _mm256_fmadd_ps(mw8, _mm256_loadu_ps(ds + b), macc);
#pragma GCC unroll 4
        for (int i = 0; i < 8; i += 2) {
            const unsigned char *b0 = blk + (size_t)i * bb, *b1 = b0 + bb;
            __m512i qv = _mm512_loadu_si512((const void *)(q + (b + i) * QB));
            __m512i u;
            /* element order [b0 | b1] unless the nibble layout says otherwise */
            __m512i idx = _mm512_setr_epi32(i, i, i, i, i, i, i, i, i + 1, i + 1, i + 1, i + 1,
                                            i + 1, i + 1, i + 1, i + 1);
            if (is_signed(type)) {
                const __m512i sw =
                    type == CORE_TTYPE_Q6_K
                        ? _mm512_inserti64x4(_mm512_castsi256_si512(q6quants256(sb, i)),
                                             q6quants256(sb, i + 1), 1)
                        : _mm512_inserti64x4(
                              _mm512_castsi256_si512(
                                  _mm256_loadu_si256((const __m256i *)(const void *)(b0 + 2))),
                              _mm256_loadu_si256((const __m256i *)(const void *)(b1 + 2)), 1);
                u = _mm512_abs_epi8(sw);
                qv = _mm512_mask_sub_epi8(qv, _mm512_movepi8_mask(sw), zero, qv);
            } else if (is_k(type)) { /* sub-blocks i, i + 1: one 32-byte load */
                const __m256i v = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(sb + kqs_off(type) + (size_t)i * 16));
                u = _mm512_and_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
                if (type == CORE_TTYPE_Q5_K)
                    u = _mm512_or_si512(
                        u, _mm512_inserti64x4(_mm512_castsi256_si512(kbits5(sb + 16, i)),
                                              kbits5(sb + 16, i + 1), 1));
            } else if (is_q5(type)) { /* element order, as Q8_0 */
                u = _mm512_inserti64x4(_mm512_castsi256_si512(quants256(type, b0)),
                                       quants256(type, b1), 1);
            } else {
                const size_t qoff = qs_off(type);
                const __m256i v = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(b0 + qoff))),
                    _mm_loadu_si128((const __m128i *)(const void *)(b1 + qoff)), 1);
                u = _mm512_and_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
                qv = _mm512_shuffle_i64x2(qv, qv, 0xd8); /* to [lo0 lo1 hi0 hi1] */
                idx = _mm512_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1, i, i, i, i, i + 1,
                                        i + 1, i + 1, i + 1);
            }
            __m512i p = _mm512_dpbusd_epi32(zero, u, qv);
            if (type == CORE_TTYPE_Q6_K) /* lanes of 4 products: 4 lanes per half-block scale */
                p = _mm512_mullo_epi32(p, q6scales512(sb, i));
            const __m512 s = _mm512_permutexvar_ps(idx, sc8);
            acc[(i >> 1) & 1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[(i >> 1) & 1]);
        }
    }
    /* the blocks left after the last group of 8: the AVX2 code (same integers) */
    tail256(type, row, q, d, ds, b, nb, &acc1, &mtail);
    put(c, ((hsum16(_mm512_add_ps(acc[0], acc[1])) + hsum8(acc1)) + hsum8(macc)) + mtail, beta);
}

VNNI_INL void mm_vnni(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
                      const unsigned char *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    for (int64_t j = j0; j < j1; j++) {
        const unsigned char *row = w + (size_t)j * row_bytes;
        prefetch_row(row, row_bytes);
        for (int64_t r = 0; r < qa->m; r++)
            row1_vnni(type, qa, r, row, beta, c + r * ldc + j);
    }
}

Q8_INSTANCE(q4_0_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q4_0)
Q8_INSTANCE(q4_1_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q4_1)
Q8_INSTANCE(q5_0_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q5_0)
Q8_INSTANCE(q5_1_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q5_1)
Q8_INSTANCE(q4_k_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q4_K)
Q8_INSTANCE(q5_k_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q5_K)
Q8_INSTANCE(q6_k_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q6_K)
Q8_INSTANCE(q8_0_vnni, VNNI_FN, mm_vnni, CORE_TTYPE_Q8_0)
#endif /* Q8_X86 */

static void mm(core_qdot_isa_t isa, int type, const core_q8_act_t *qa, int64_t j0, int64_t j1,
               const void *w, size_t row_bytes, float beta, float *c, int64_t ldc)
{
    const unsigned char *wb = w;
#ifdef Q8_X86
    if (isa == CORE_QDOT_AVX512VNNI) {
        switch (type) {
        case CORE_TTYPE_Q4_0: mm_q4_0_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q4_1: mm_q4_1_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_0: mm_q5_0_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_1: mm_q5_1_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q4_K: mm_q4_k_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_K: mm_q5_k_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q6_K: mm_q6_k_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        default: mm_q8_0_vnni(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        }
    }
    if (isa == CORE_QDOT_AVX2) {
        switch (type) {
        case CORE_TTYPE_Q4_0: mm_q4_0_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q4_1: mm_q4_1_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_0: mm_q5_0_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_1: mm_q5_1_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q4_K: mm_q4_k_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q5_K: mm_q5_k_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        case CORE_TTYPE_Q6_K: mm_q6_k_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        default: mm_q8_0_avx2(qa, j0, j1, wb, row_bytes, beta, c, ldc); return;
        }
    }
#elif defined(__aarch64__)
    if (isa >= CORE_QDOT_NEON) { /* core/kernels/qdot_neon.c */
        core_q8_matmul_neon(isa == CORE_QDOT_NEON_DOTPROD, type, qa, j0, j1, wb, row_bytes, beta, c,
                            ldc);
        return;
    }
#else
    (void)isa;
#endif
    mm_generic(type, qa, j0, j1, wb, row_bytes, beta, c, ldc);
}

void core_q8_matmul(int type, const core_q8_act_t *qa, int64_t j0, int64_t j1, const void *w,
                    size_t row_bytes, float beta, float *c, int64_t ldc)
{
    mm(core_qdot_isa(), type, qa, j0, j1, w, row_bytes, beta, c, ldc);
}

int core_q8_matmul_isa(core_qdot_isa_t isa, int type, const core_q8_act_t *qa, int64_t j0,
                       int64_t j1, const void *w, size_t row_bytes, float beta, float *c,
                       int64_t ldc)
{
    if (!core_qdot_isa_runs(isa))
        return CORE_EUNSUPPORTED;
    if (!core_q8_supported(type) || qa->k % core_ttype_block_elems(type) != 0 || j0 < 0 || j1 < j0)
        return CORE_EINVAL;
    mm(isa, type, qa, j0, j1, w, row_bytes, beta, c, ldc);
    return 0;
}
