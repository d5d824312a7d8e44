/* core/tensor.c — GGML tensor types: block geometry, fp16/bf16 conversion,
 * reference dequantization and the naive dot product.
 *
 * Dequantization must equal llama.cpp's reference (ggml-quants.c, mirrored by
 * gguf-py's quants.py) bit for bit, so the float operations below keep the
 * reference's order and rounding: every product and sum is a separate float
 * operation (assigned to a float before the next one, so no compiler may fuse
 * them into an FMA) and scale products are formed before they meet the quant.
 * Multi-byte fields are read with memcpy: tensor data inside a GGUF mapping is
 * only as aligned as the file says, and blocks themselves are 2-byte aligned at
 * best. Little-endian host assumed (as GGUF is).
 */
#include "core/tensor.h"

#include <math.h>
#include <string.h>

#define QK 32   /* values per block of the legacy types */
#define QK_K 256 /* values per super-block of the k-quants */

typedef void (*dequant_fn)(const uint8_t *blk, float *y);

typedef struct ttype_info {
    const char *name;
    int64_t blck;   /* values per block */
    size_t bytes;   /* bytes per block */
    dequant_fn deq; /* NULL: size known, dequantization not implemented */
} ttype_info_t;

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static float rd_h(const uint8_t *p) { return core_fp16_to_fp32(rd16(p)); }

float core_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;

    if (exp == 0x1f) {
        /* inf / NaN: keep the payload in the top mantissa bits. */
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* Subnormal half: normalize; every one is a normal float. */
        uint32_t e = 113; /* exponent of 2^-14 in float bias, before shifts */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t core_fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        /* NaN: keep the top payload bits, force quiet so it stays a NaN. */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    /* 65520 = 0x477ff000 is the midpoint between the largest half and 2^16:
     * at and above it, round-to-nearest-even goes to infinity. */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;
    if (ax < 0x38800000u) {
        /* Result is a half subnormal (or zero): value / 2^-24 rounded to an
         * integer, ties to even. Values below 2^-25 round to zero. */
        if (ax < 0x33000000u) return sign;
        uint32_t e = ax >> 23;                  /* biased float exponent */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u; /* 24-bit significand */
        /* value = m * 2^(e-150); in units of 2^-24 that is m >> (126 - e). */
        uint32_t shift = 126u - e; /* 14..24 here */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q); /* q may reach 0x400: the smallest normal */
    }
    /* Normal half: rebias, then round the dropped 13 bits to nearest even. A
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t r = ax - 0x38000000u; /* exponent bias 127 -> 15, in place */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

float core_bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t core_fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        /* NaN: truncate and force quiet (as ggml does), never round into inf. */
        return (uint16_t)((x >> 16) | 0x40u);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- block dequantizers: blk is one block, y gets its values ---- */

static void deq_f32(const uint8_t *blk, float *y) { memcpy(y, blk, sizeof *y); }
static void deq_f16(const uint8_t *blk, float *y) { *y = rd_h(blk); }
static void deq_bf16(const uint8_t *blk, float *y) { *y = core_bf16_to_fp32(rd16(blk)); }

/* Q4_0: d (f16), qs[16]: low nibbles are values 0..15, high nibbles 16..31. */
static void deq_q4_0(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const uint8_t *qs = blk + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1: d, m (f16), qs[16]; y = d*q + m. */
static void deq_q4_1(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const float m = rd_h(blk + 2);
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < QK / 2; j++) {
        float a = d * (float)(qs[j] & 0x0f);
        float b = d * (float)(qs[j] >> 4);
        y[j] = a + m;
        y[j + QK / 2] = b + m;
    }
}

/* Q5_0: d (f16), qh (u32: bit j is the 5th bit of value j), qs[16]. */
static void deq_q5_0(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    uint32_t qh;
    memcpy(&qh, blk + 2, sizeof qh);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        int x1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        y[j] = d * (float)(x0 - 16);
        y[j + QK / 2] = d * (float)(x1 - 16);
    }
}

/* Q5_1: d, m (f16), qh (u32), qs[16]; y = d*q + m. */
static void deq_q5_1(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const float m = rd_h(blk + 2);
    uint32_t qh;
    memcpy(&qh, blk + 4, sizeof qh);
    const uint8_t *qs = blk + 8;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        int x1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        float a = d * (float)x0;
        float b = d * (float)x1;
        y[j] = a + m;
        y[j + QK / 2] = b + m;
    }
}

/* Q8_0: d (f16), qs[32] int8. */
static void deq_q8_0(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const int8_t *qs = (const int8_t *)(blk + 2);
    for (int j = 0; j < QK; j++) y[j] = d * (float)qs[j];
}

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), d, dmin. */
static void deq_q2_k(const uint8_t *blk, float *y)
{
    const uint8_t *scales = blk;
    const uint8_t *q = blk + 16;
    const float d = rd_h(blk + 80);
    const float dmin = rd_h(blk + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                uint8_t sc = scales[is++];
                const float dl = d * (float)(sc & 0x0f);
                const float ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++) {
                    float p = dl * (float)((q[l + 16 * half] >> shift) & 3);
                    *y++ = p - ml;
                }
            }
        }
        q += 32;
    }
}

/* Q3_K: hmask[32], qs[64] (low 2 bits), scales[12] (16 6-bit scales), d. */
static void deq_q3_k(const uint8_t *blk, float *y)
{
    const uint8_t *hm = blk;
    const uint8_t *q = blk + 32;
    const uint8_t *sp = blk + 96;
    const float d_all = rd_h(blk + 108);
    int8_t scales[16];
    for (int j = 0; j < 16; j++) {
        int lo = (sp[j % 8] >> (4 * (j / 8))) & 0x0f;
        int hi = (sp[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        scales[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                const float dl = d_all * (float)scales[is++];
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* The 6-bit scale and min of sub-block j (0..7) in Q4_K / Q5_K's 12 bytes. */
static void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K: d, dmin (f16), scales[12], qs[128]; 64 values per pair of sub-blocks. */
static void deq_q4_k(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const float dmin = rd_h(blk + 2);
    const uint8_t *scales = blk + 4;
    const uint8_t *q = blk + 16;
    int is = 0;
    for (int j = 0; j < QK_K; j += 64) {
        uint8_t sc, mn;
        k_scale_min(is, scales, &sc, &mn);
        const float d1 = d * (float)sc;
        const float m1 = dmin * (float)mn;
        k_scale_min(is + 1, scales, &sc, &mn);
        const float d2 = d * (float)sc;
        const float m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            float p = d1 * (float)(q[l] & 0x0f);
            *y++ = p - m1;
        }
        for (int l = 0; l < 32; l++) {
            float p = d2 * (float)(q[l] >> 4);
            *y++ = p - m2;
        }
        q += 32;
        is += 2;
    }
}

/* Q5_K: d, dmin, scales[12], qh[32] (5th bits), qs[128]. */
static void deq_q5_k(const uint8_t *blk, float *y)
{
    const float d = rd_h(blk);
    const float dmin = rd_h(blk + 2);
    const uint8_t *scales = blk + 4;
    const uint8_t *qh = blk + 16;
    const uint8_t *ql = blk + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64) {
        uint8_t sc, mn;
        k_scale_min(is, scales, &sc, &mn);
        const float d1 = d * (float)sc;
        const float m1 = dmin * (float)mn;
        k_scale_min(is + 1, scales, &sc, &mn);
        const float d2 = d * (float)sc;
        const float m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            float p = d1 * (float)((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0));
            *y++ = p - m1;
        }
        for (int l = 0; l < 32; l++) {
            float p = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0));
            *y++ = p - m2;
        }
        ql += 32;
        is += 2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d. */
static void deq_q6_k(const uint8_t *blk, float *y)
{
    const uint8_t *ql = blk;
    const uint8_t *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = rd_h(blk + 208);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            const float s1 = d * (float)sc[is + 0];
            const float s2 = d * (float)sc[is + 2];
            const float s3 = d * (float)sc[is + 4];
            const float s4 = d * (float)sc[is + 6];
            y[l + 0] = s1 * (float)q1;
            y[l + 32] = s2 * (float)q2;
            y[l + 64] = s3 * (float)q3;
            y[l + 96] = s4 * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Sizes of every type id GGUF files use (so the reader can validate extents of
 * tensors we cannot dequantize); deq marks the ones implemented here. */
static const ttype_info_t ttypes[CORE_TTYPE_COUNT_] = {
    [0] = {"F32", 1, 4, deq_f32},
    [1] = {"F16", 1, 2, deq_f16},
    [2] = {"Q4_0", QK, 18, deq_q4_0},
    [3] = {"Q4_1", QK, 20, deq_q4_1},
    [6] = {"Q5_0", QK, 22, deq_q5_0},
    [7] = {"Q5_1", QK, 24, deq_q5_1},
    [8] = {"Q8_0", QK, 34, deq_q8_0},
    [9] = {"Q8_1", QK, 40, NULL},
    [10] = {"Q2_K", QK_K, 84, deq_q2_k},
    [11] = {"Q3_K", QK_K, 110, deq_q3_k},
    [12] = {"Q4_K", QK_K, 144, deq_q4_k},
    [13] = {"Q5_K", QK_K, 176, deq_q5_k},
    [14] = {"Q6_K", QK_K, 210, deq_q6_k},
    [15] = {"Q8_K", QK_K, 292, NULL},
    [16] = {"IQ2_XXS", QK_K, 66, NULL},
    [17] = {"IQ2_XS", QK_K, 74, NULL},
    [18] = {"IQ3_XXS", QK_K, 98, NULL},
    [19] = {"IQ1_S", QK_K, 50, NULL},
    [20] = {"IQ4_NL", QK, 18, NULL},
    [21] = {"IQ3_S", QK_K, 110, NULL},
    [22] = {"IQ2_S", QK_K, 82, NULL},
    [23] = {"IQ4_XS", QK_K, 136, NULL},
    [24] = {"I8", 1, 1, NULL},
    [25] = {"I16", 1, 2, NULL},
    [26] = {"I32", 1, 4, NULL},
    [27] = {"I64", 1, 8, NULL},
    [28] = {"F64", 1, 8, NULL},
    [29] = {"IQ1_M", QK_K, 56, NULL},
    [30] = {"BF16", 1, 2, deq_bf16},
    [34] = {"TQ1_0", QK_K, 54, NULL},
    [35] = {"TQ2_0", QK_K, 66, NULL},
    [39] = {"MXFP4", QK, 17, NULL},
};

static const ttype_info_t *ttype(int type)
{
    if (type < 0 || type >= CORE_TTYPE_COUNT_ || !ttypes[type].name) return NULL;
    return &ttypes[type];
}

const char *core_ttype_name(int type)
{
    const ttype_info_t *t = ttype(type);
    return t ? t->name : "unknown";
}

int core_ttype_supported(int type)
{
    const ttype_info_t *t = ttype(type);
    return t && t->deq;
}

int64_t core_ttype_block_elems(int type)
{
    const ttype_info_t *t = ttype(type);
    return t ? t->blck : 0;
}

size_t core_ttype_block_bytes(int type)
{
    const ttype_info_t *t = ttype(type);
    return t ? t->bytes : 0;
}

int core_ttype_row_bytes(int type, int64_t n, size_t *out)
{
    const ttype_info_t *t = ttype(type);
    if (!t || n < 0 || n % t->blck != 0) return CORE_EINVAL;
    uint64_t blocks = (uint64_t)(n / t->blck);
    if (blocks > SIZE_MAX / t->bytes) return CORE_ERANGE;
    *out = (size_t)blocks * t->bytes;
    return 0;
}

int core_dequantize(int type, const void *src, float *dst, int64_t n, core_error_t *err)
{
    const ttype_info_t *t = ttype(type);
    if (!t || !t->deq)
        return core_error_set(err, CORE_EUNSUPPORTED, "dequantize: type %d (%s) not supported",
                              type, core_ttype_name(type));
    if (n < 0 || n % t->blck != 0)
        return core_error_set(err, CORE_EINVAL,
                              "dequantize: %s: n=%lld is not a non-negative multiple of %lld",
                              t->name, (long long)n, (long long)t->blck);
    if (n > 0 && (!src || !dst))
        return core_error_set(err, CORE_EINVAL, "dequantize: NULL buffer");
    const uint8_t *p = src;
    int64_t nb = n / t->blck;
    for (int64_t b = 0; b < nb; b++) {
        t->deq(p, dst);
        p += t->bytes;
        dst += t->blck;
    }
    return 0;
}

double core_dot_ref(int type, const void *row, const float *x, int64_t n)
{
    const ttype_info_t *t = ttype(type);
    if (!t || !t->deq || n < 0 || n % t->blck != 0 || (n > 0 && (!row || !x))) return NAN;
    float y[QK_K]; /* one block, [blck] */
    const uint8_t *p = row;
    double acc = 0.0;
    for (int64_t i = 0; i < n; i += t->blck) {
        t->deq(p, y);
        for (int64_t j = 0; j < t->blck; j++) acc += (double)y[j] * (double)x[i + j];
        p += t->bytes;
    }
    return acc;
}
