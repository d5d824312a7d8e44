/* tests/unit/test_core_tensor.c — tensor types, fp16/bf16 conversion,
 * dequantization layout and core_dot_ref.
 *
 * Bitwise agreement with llama.cpp's reference dequantization is tested in
 * tests/reference/test_dequant.py. Here: conversions against brute-force
 * nearest-value references (not the same bit tricks), block layouts against
 * encoders written from the GGML block formats (the packing direction, so an
 * element-order mistake in the decoder cannot cancel out), error handling, and
 * core_dot_ref against dequantize-then-dot summed in long double.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/tensor.h"
#include "tests/unit/check.h"

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(type_table)
{
    static const struct { int t; const char *name; int64_t be; size_t bb; int sup; } want[] = {
        {CORE_TTYPE_F32, "F32", 1, 4, 1},       {CORE_TTYPE_F16, "F16", 1, 2, 1},
        {CORE_TTYPE_BF16, "BF16", 1, 2, 1},     {CORE_TTYPE_Q4_0, "Q4_0", 32, 18, 1},
        {CORE_TTYPE_Q4_1, "Q4_1", 32, 20, 1},   {CORE_TTYPE_Q5_0, "Q5_0", 32, 22, 1},
        {CORE_TTYPE_Q5_1, "Q5_1", 32, 24, 1},   {CORE_TTYPE_Q8_0, "Q8_0", 32, 34, 1},
        {CORE_TTYPE_Q8_1, "Q8_1", 32, 40, 0},   {CORE_TTYPE_Q2_K, "Q2_K", 256, 84, 1},
        {CORE_TTYPE_Q3_K, "Q3_K", 256, 110, 1}, {CORE_TTYPE_Q4_K, "Q4_K", 256, 144, 1},
        {CORE_TTYPE_Q5_K, "Q5_K", 256, 176, 1}, {CORE_TTYPE_Q6_K, "Q6_K", 256, 210, 1},
        {CORE_TTYPE_Q8_K, "Q8_K", 256, 292, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_STR_EQ(core_ttype_name(want[i].t), want[i].name);
        CHECK_INT_EQ(core_ttype_block_elems(want[i].t), want[i].be);
        CHECK_INT_EQ(core_ttype_block_bytes(want[i].t), want[i].bb);
        CHECK_INT_EQ(core_ttype_supported(want[i].t), want[i].sup);
    }
    int unknown[] = {-1, 4, 5, 31, 32, 33, CORE_TTYPE_COUNT_, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_STR_EQ(core_ttype_name(unknown[i]), "unknown");
        CHECK_INT_EQ(core_ttype_block_elems(unknown[i]), 0);
        CHECK_INT_EQ(core_ttype_block_bytes(unknown[i]), 0);
        CHECK_INT_EQ(core_ttype_supported(unknown[i]), 0);
    }
}

TEST(row_bytes)
{
    size_t n = 0;
    CHECK(core_ttype_row_bytes(CORE_TTYPE_Q4_1, 576, &n) == 0 && n == 18 * 20);
    CHECK(core_ttype_row_bytes(CORE_TTYPE_Q6_K, 512, &n) == 0 && n == 420);
    CHECK(core_ttype_row_bytes(CORE_TTYPE_F16, 3, &n) == 0 && n == 6);
    CHECK(core_ttype_row_bytes(CORE_TTYPE_F32, 0, &n) == 0 && n == 0);
    CHECK_INT_EQ(core_ttype_row_bytes(CORE_TTYPE_Q4_1, 33, &n), CORE_EINVAL);
    CHECK_INT_EQ(core_ttype_row_bytes(CORE_TTYPE_F32, -4, &n), CORE_EINVAL);
    CHECK_INT_EQ(core_ttype_row_bytes(4, 32, &n), CORE_EINVAL);
    CHECK_INT_EQ(core_ttype_row_bytes(CORE_TTYPE_F32, INT64_MAX, &n), CORE_ERANGE);
    CHECK_INT_EQ(core_ttype_row_bytes(28 /* F64 */, INT64_MAX / 2, &n), CORE_ERANGE);
}

/* ---- fp16 ---- */

/* value of a half from its fields, by arithmetic */
static double half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

TEST(fp16_to_fp32_every_value)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = core_fp16_to_fp32((uint16_t)h);
        double v = half_value((uint16_t)h);
        int sign_ok = !!signbit(f) == (int)(h >> 15);
        if (isnan(v) ? !isnan(f) || !sign_ok : (double)f != v || !sign_ok) bad++;
    }
    CHECK_INT_EQ(bad, 0);
}

/* Nearest half to x, ties to the even mantissa, by search over all finite
 * halves; at and beyond 65520 (half way to 2^16) the answer is infinity. */
static uint16_t fp16_ref(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isnan(x)) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00;
    uint32_t lo = 0, hi = 0x7bff; /* half_value(k) increases with k here */
    while (lo < hi) {                /* largest k with value(k) <= a */
        uint32_t mid = (lo + hi + 1) / 2;
        if (half_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    double below = half_value((uint16_t)lo);
    double above = lo == 0x7bff ? 65536.0 : half_value((uint16_t)(lo + 1));
    double d1 = a - below, d2 = above - a;
    uint32_t k = d1 < d2 ? lo : d2 < d1 ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    return (uint16_t)(sign | k);
}

static int fp16_agrees(float x)
{
    uint16_t got = core_fp32_to_fp16(x), want = fp16_ref(x);
    if (isnan(x)) return (got & 0x7c00) == 0x7c00 && (got & 0x3ff) && !!(got & 0x8000) == !!signbit(x);
    if (got != want) printf("  fp16(%a) = 0x%04x, want 0x%04x\n", (double)x, got, want);
    return got == want;
}

TEST(fp32_to_fp16_rounds_to_nearest_even)
{
    int bad = 0;
    /* every half's value, its midpoints with the next, and one float-ulp either side */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float v = (float)half_value((uint16_t)h);
        double next = h == 0x7bff ? 65536.0 : half_value((uint16_t)(h + 1));
        float mid = (float)((half_value((uint16_t)h) + next) / 2);
        float xs[] = {v, mid, nextafterf(mid, INFINITY), nextafterf(mid, -INFINITY)};
        for (int i = 0; i < 4; i++) bad += !fp16_agrees(xs[i]) + !fp16_agrees(-xs[i]);
    }
    core_rng_t r;
    core_rng_seed(&r, 16);
    for (int i = 0; i < 1000000; i++) bad += !fp16_agrees(u2f((uint32_t)core_rng_u64(&r)));
    CHECK_INT_EQ(bad, 0);
    /* named cases */
    CHECK_INT_EQ(core_fp32_to_fp16(1.0f), 0x3c00);
    CHECK_INT_EQ(core_fp32_to_fp16(-2.0f), 0xc000);
    CHECK_INT_EQ(core_fp32_to_fp16(65504.0f), 0x7bff);
    CHECK_INT_EQ(core_fp32_to_fp16(65519.99f), 0x7bff);
    CHECK_INT_EQ(core_fp32_to_fp16(65520.0f), 0x7c00);
    CHECK_INT_EQ(core_fp32_to_fp16(1e10f), 0x7c00);
    CHECK_INT_EQ(core_fp32_to_fp16(INFINITY), 0x7c00);
    CHECK_INT_EQ(core_fp32_to_fp16(-INFINITY), 0xfc00);
    CHECK_INT_EQ(core_fp32_to_fp16(-0.0f), 0x8000);
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(1, -24)), 0x0001);     /* smallest subnormal */
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(1, -25)), 0x0000);     /* tie -> even (0) */
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(3, -25)), 0x0002);     /* tie 1|2 -> 2 */
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(5, -25)), 0x0002);     /* tie 2|3 -> 2 */
    CHECK_INT_EQ(core_fp32_to_fp16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(1, -14)), 0x0400);     /* smallest normal */
    CHECK_INT_EQ(core_fp32_to_fp16(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400); /* rounds up into normals */
    CHECK_INT_EQ(core_fp32_to_fp16(1e-30f), 0x0000);
    uint16_t qn = core_fp32_to_fp16(NAN);
    CHECK((qn & 0x7c00) == 0x7c00 && (qn & 0x3ff) != 0);
    uint16_t sn = core_fp32_to_fp16(u2f(0x7f800001)); /* signalling NaN, low payload */
    CHECK((sn & 0x7c00) == 0x7c00 && (sn & 0x3ff) != 0);
    CHECK(isnan(core_fp16_to_fp32(0x7c01)) && isinf(core_fp16_to_fp32(0x7c00)));
    /* every non-NaN half survives the round trip */
    int rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        rt += core_fp32_to_fp16(core_fp16_to_fp32((uint16_t)h)) != h;
    }
    CHECK_INT_EQ(rt, 0);
}

/* ---- bf16 ---- */

static uint16_t bf16_ref(float x)
{
    uint32_t u = f2u(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double a = fabs((double)x);
    double vlo = fabs((double)u2f((uint32_t)lo << 16));
    /* hi may be the infinity pattern: treat it as the next power of two */
    double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1, 128) : fabs((double)u2f((uint32_t)hi << 16));
    double d1 = a - vlo, d2 = vhi - a;
    if (d1 < d2) return lo;
    if (d2 < d1) return hi;
    return (lo & 1) ? hi : lo;
}

TEST(fp32_to_bf16_rounds_to_nearest_even)
{
    int bad = 0;
    core_rng_t r;
    core_rng_seed(&r, 30);
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)core_rng_u64(&r);
        if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        float x = u2f(u);
        bad += core_fp32_to_bf16(x) != bf16_ref(x);
    }
    CHECK_INT_EQ(bad, 0);
    CHECK_INT_EQ(core_fp32_to_bf16(1.0f), 0x3f80);
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie -> even */
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie -> even (up) */
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x7f7fffff)), 0x7f80); /* FLT_MAX overflows */
    CHECK_INT_EQ(core_fp32_to_bf16(INFINITY), 0x7f80);
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x00008000)), 0x0000); /* subnormal tie -> 0 */
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x00018000)), 0x0002);
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0x7f800001)), 0x7fc0); /* sNaN -> quiet, not inf */
    CHECK_INT_EQ(core_fp32_to_bf16(u2f(0xffffffff)), 0xffff);
    int rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = core_bf16_to_fp32((uint16_t)h);
        if (f2u(f) != h << 16) rt++;
        if (!isnan(f) && core_fp32_to_bf16(f) != h) rt++;
    }
    CHECK_INT_EQ(rt, 0);
}

/* ---- block layouts: encoders written from the formats ---- */

static void put_h(uint8_t *p, float v)
{
    uint16_t h = core_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}
static float h_of(float v) { return core_fp16_to_fp32(core_fp32_to_fp16(v)); }

static int rnd(core_rng_t *r, int n) { return (int)(core_rng_u64(r) % (uint64_t)n); }

/* Checks core_dequantize of blk against want[n], reporting the first miss. */
static int same(int type, const uint8_t *blk, const float *want, int n)
{
    float y[256];
    core_error_t err = {0};
    if (core_dequantize(type, blk, y, n, &err) != 0) {
        printf("  %s: %s\n", core_ttype_name(type), err.msg);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (f2u(y[i]) != f2u(want[i])) {
            printf("  %s: value %d is %g, want %g\n", core_ttype_name(type), i, (double)y[i], (double)want[i]);
            return 0;
        }
    }
    return 1;
}

TEST(legacy_block_layouts)
{
    core_rng_t r;
    core_rng_seed(&r, 5);
    for (int rep = 0; rep < 200; rep++) {
        uint8_t b[64];
        float want[32];
        int q[32];
        float d = h_of((float)(rnd(&r, 2000) - 1000) / 256.0f), m = h_of((float)(rnd(&r, 2000) - 1000) / 64.0f);
        /* Q4_0 / Q4_1: byte j holds value j (low nibble) and j+16 (high). */
        for (int j = 0; j < 32; j++) q[j] = rnd(&r, 16);
        memset(b, 0, sizeof b);
        put_h(b, d);
        for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        for (int j = 0; j < 32; j++) want[j] = d * (float)(q[j] - 8);
        CHECK(same(CORE_TTYPE_Q4_0, b, want, 32));
        put_h(b, d);
        put_h(b + 2, m);
        for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        for (int j = 0; j < 32; j++) {
            float p = d * (float)q[j];
            want[j] = p + m;
        }
        CHECK(same(CORE_TTYPE_Q4_1, b, want, 32));
        /* Q5_0 / Q5_1: fifth bit of value j is bit j of the u32 qh. */
        for (int j = 0; j < 32; j++) q[j] = rnd(&r, 32);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
        put_h(b, d);
        memcpy(b + 2, &qh, 4);
        for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        for (int j = 0; j < 32; j++) want[j] = d * (float)(q[j] - 16);
        CHECK(same(CORE_TTYPE_Q5_0, b, want, 32));
        put_h(b, d);
        put_h(b + 2, m);
        memcpy(b + 4, &qh, 4);
        for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        for (int j = 0; j < 32; j++) {
            float p = d * (float)q[j];
            want[j] = p + m;
        }
        CHECK(same(CORE_TTYPE_Q5_1, b, want, 32));
        /* Q8_0 */
        put_h(b, d);
        for (int j = 0; j < 32; j++) {
            q[j] = rnd(&r, 256) - 128;
            b[2 + j] = (uint8_t)(int8_t)q[j];
            want[j] = d * (float)q[j];
        }
        CHECK(same(CORE_TTYPE_Q8_0, b, want, 32));
    }
}

/* Q4_K / Q5_K 6-bit scale and min packing, as the quantizer writes it. */
static void pack_k_scales(const int *ls, const int *lm, uint8_t *s)
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = (uint8_t)ls[j];
            s[j + 4] = (uint8_t)lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xf) | (lm[j] & 0xf) << 4);
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

TEST(k_quant_block_layouts)
{
    core_rng_t r;
    core_rng_seed(&r, 6);
    for (int rep = 0; rep < 100; rep++) {
        uint8_t b[256];
        float want[256];
        int L[256], ls[16], lm[16];
        float d = h_of((float)(rnd(&r, 1000) + 1) / 4096.0f), dmin = h_of((float)(rnd(&r, 1000) + 1) / 8192.0f);

        /* Q4_K: 8 sub-blocks of 32; chunk c of 64 values: low nibbles are
         * sub-block 2c, high nibbles sub-block 2c+1 */
        for (int j = 0; j < 8; j++) ls[j] = rnd(&r, 64), lm[j] = rnd(&r, 64);
        for (int i = 0; i < 256; i++) L[i] = rnd(&r, 16);
        memset(b, 0, sizeof b);
        put_h(b, d);
        put_h(b + 2, dmin);
        pack_k_scales(ls, lm, b + 4);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) b[16 + 32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
        for (int i = 0; i < 256; i++) {
            float dl = d * (float)ls[i / 32], ml = dmin * (float)lm[i / 32];
            float p = dl * (float)L[i];
            want[i] = p - ml;
        }
        CHECK(same(CORE_TTYPE_Q4_K, b, want, 256));

        /* Q5_K: as Q4_K plus qh[32]: value 32*s + l has its 5th bit at bit s of qh[l] */
        for (int i = 0; i < 256; i++) L[i] = rnd(&r, 32);
        memset(b, 0, sizeof b);
        put_h(b, d);
        put_h(b + 2, dmin);
        pack_k_scales(ls, lm, b + 4);
        for (int i = 0; i < 256; i++) b[16 + i % 32] |= (uint8_t)((L[i] >> 4) << (i / 32));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[48 + 32 * c + l] = (uint8_t)((L[64 * c + l] & 15) | (L[64 * c + 32 + l] & 15) << 4);
        for (int i = 0; i < 256; i++) {
            float dl = d * (float)ls[i / 32], ml = dmin * (float)lm[i / 32];
            float p = dl * (float)L[i];
            want[i] = p - ml;
        }
        CHECK(same(CORE_TTYPE_Q5_K, b, want, 256));

        /* Q6_K: 16 sub-blocks of 16 with int8 scales; per 128 values, ql[l]
         * holds values l (low) and l+64 (high), ql[l+32] values l+32 and l+96,
         * qh[l] the top 2 bits of l, l+32, l+64, l+96. */
        int8_t sc[16];
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)(rnd(&r, 256) - 128);
        for (int i = 0; i < 256; i++) L[i] = rnd(&r, 64);
        memset(b, 0, sizeof b);
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int *x = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((x[l] & 15) | (x[l + 64] & 15) << 4);
                ql[l + 32] = (uint8_t)((x[l + 32] & 15) | (x[l + 96] & 15) << 4);
                qh[l] = (uint8_t)((x[l] >> 4) | (x[l + 32] >> 4) << 2 | (x[l + 64] >> 4) << 4 | (x[l + 96] >> 4) << 6);
            }
        }
        memcpy(b + 192, sc, 16);
        put_h(b + 208, d);
        for (int i = 0; i < 256; i++) {
            float s = d * (float)sc[i / 16];
            want[i] = s * (float)(L[i] - 32);
        }
        CHECK(same(CORE_TTYPE_Q6_K, b, want, 256));

        /* Q2_K: 16 sub-blocks of 16, scale|min<<4 per byte; per 128 values,
         * qs[l] (l < 32) holds values l, l+32, l+64, l+96 at bits 0,2,4,6. */
        for (int j = 0; j < 16; j++) ls[j] = rnd(&r, 16), lm[j] = rnd(&r, 16);
        for (int i = 0; i < 256; i++) L[i] = rnd(&r, 4);
        memset(b, 0, sizeof b);
        for (int j = 0; j < 16; j++) b[j] = (uint8_t)(ls[j] | lm[j] << 4);
        for (int i = 0; i < 256; i++) b[16 + 32 * (i / 128) + i % 32] |= (uint8_t)(L[i] << (2 * ((i % 128) / 32)));
        put_h(b + 80, d);
        put_h(b + 82, dmin);
        for (int i = 0; i < 256; i++) {
            float dl = d * (float)ls[i / 16], ml = dmin * (float)lm[i / 16];
            float p = dl * (float)L[i];
            want[i] = p - ml;
        }
        CHECK(same(CORE_TTYPE_Q2_K, b, want, 256));

        /* Q3_K: values -4..3 as 2 low bits in qs (as Q2_K) plus a high bit in
         * hmask (value i: bit i/32 of hmask[i%32], set means "no -4"); 16
         * 6-bit scales biased by 32. */
        for (int j = 0; j < 16; j++) ls[j] = rnd(&r, 64);
        for (int i = 0; i < 256; i++) L[i] = rnd(&r, 8);
        memset(b, 0, sizeof b);
        for (int i = 0; i < 256; i++) {
            if (L[i] > 3) b[i % 32] |= (uint8_t)(1u << (i / 32));
            b[32 + 32 * (i / 128) + i % 32] |= (uint8_t)((L[i] & 3) << (2 * ((i % 128) / 32)));
        }
        for (int j = 0; j < 16; j++) {
            int l = ls[j];
            if (j < 8) b[96 + j] |= (uint8_t)(l & 0xf);
            else b[96 + j - 8] |= (uint8_t)((l & 0xf) << 4);
            b[96 + 8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        put_h(b + 108, d);
        for (int i = 0; i < 256; i++) {
            float dl = d * (float)(ls[i / 16] - 32);
            want[i] = dl * (float)(L[i] - 4);
        }
        CHECK(same(CORE_TTYPE_Q3_K, b, want, 256));
    }
}

TEST(dequantize_errors)
{
    uint8_t blk[292] = {0};
    float y[256];
    core_error_t err = {0};
    CHECK_INT_EQ(core_dequantize(CORE_TTYPE_Q8_K, blk, y, 256, &err), CORE_EUNSUPPORTED);
    CHECK(strstr(err.msg, "Q8_K") != NULL);
    CHECK_INT_EQ(core_dequantize(4, blk, y, 32, &err), CORE_EUNSUPPORTED);
    CHECK_INT_EQ(core_dequantize(CORE_TTYPE_Q4_0, blk, y, 31, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "Q4_0") != NULL);
    CHECK_INT_EQ(core_dequantize(CORE_TTYPE_F32, blk, y, -1, &err), CORE_EINVAL);
    CHECK_INT_EQ(core_dequantize(CORE_TTYPE_F32, NULL, y, 4, &err), CORE_EINVAL);
    CHECK_INT_EQ(core_dequantize(CORE_TTYPE_F32, NULL, NULL, 0, &err), 0);
    /* n = 0 writes nothing */
    y[0] = 7.0f;
    CHECK(core_dequantize(CORE_TTYPE_Q6_K, blk, y, 0, NULL) == 0 && y[0] == 7.0f);
}

/* ---- core_dot_ref ---- */

TEST(dot_ref_equals_dequantize_then_dot)
{
    const int types[] = {CORE_TTYPE_F32, CORE_TTYPE_F16, CORE_TTYPE_BF16, CORE_TTYPE_Q4_0, CORE_TTYPE_Q4_1,
                         CORE_TTYPE_Q5_0, CORE_TTYPE_Q5_1, CORE_TTYPE_Q8_0, CORE_TTYPE_Q2_K, CORE_TTYPE_Q3_K,
                         CORE_TTYPE_Q4_K, CORE_TTYPE_Q5_K, CORE_TTYPE_Q6_K};
    enum { N = 2048 };
    core_rng_t r;
    core_rng_seed(&r, 77);
    uint8_t *row = malloc(N * 4);
    float *y = malloc(N * sizeof *y), *x = malloc(N * sizeof *x); /* [N] */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int t = types[ti];
        size_t nb = 0;
        CHECK(core_ttype_row_bytes(t, N, &nb) == 0);
        for (size_t i = 0; i < nb; i++) row[i] = (uint8_t)core_rng_u64(&r);
        /* Make every fp16 / bf16 / f32 field finite: clear exponent bits'
         * top so no inf/NaN appears (simplest: tame whole 16-bit words). */
        if (t == CORE_TTYPE_F32) {
            for (size_t i = 0; i < N; i++) {
                float f = (float)core_rng_normal(&r);
                memcpy(row + 4 * i, &f, 4);
            }
        } else {
            for (size_t i = 1; i < nb; i += 2) row[i] &= 0x3f; /* |value| of any f16/bf16 word < 2 */
        }
        for (int i = 0; i < N; i++) x[i] = (float)core_rng_normal(&r);
        CHECK(core_dequantize(t, row, y, N, NULL) == 0);
        long double acc = 0, mag = 0;
        for (int i = 0; i < N; i++) {
            acc += (long double)y[i] * x[i];
            mag += fabsl((long double)y[i] * x[i]);
        }
        double got = core_dot_ref(t, row, x, N);
        CHECK_MSG(fabsl((long double)got - acc) <= mag * 1e-13L, "%s: %.17g vs %.17Lg", core_ttype_name(t), got,
                  acc);
        CHECK_MSG(mag > 0, "%s: degenerate test row", core_ttype_name(t));
    }
    CHECK(isnan(core_dot_ref(CORE_TTYPE_Q8_K, row, x, 256)));
    CHECK(isnan(core_dot_ref(CORE_TTYPE_Q4_0, row, x, 33)));
    CHECK(core_dot_ref(CORE_TTYPE_Q4_0, row, x, 0) == 0.0);
    free(row);
    free(y);
    free(x);
}

int main(void)
{
    RUN(type_table);
    RUN(row_bytes);
    RUN(fp16_to_fp32_every_value);
    RUN(fp32_to_fp16_rounds_to_nearest_even);
    RUN(fp32_to_bf16_rounds_to_nearest_even);
    RUN(legacy_block_layouts);
    RUN(k_quant_block_layouts);
    RUN(dequantize_errors);
    RUN(dot_ref_equals_dequantize_then_dot);
    return CHECK_DONE();
}
