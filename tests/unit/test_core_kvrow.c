/* Tests of core/kernels/kvrow.c, the exact rows of the linear attention
 * kinds: 8-bit rows against a reference computed here in double (scale
 * max|x|/127, each element the nearest multiple of it), the bound d/2 on
 * every element, idempotence (a packed row unpacks and packs to the same
 * bytes), saturation, the validity check's refusals, the little-endian
 * order of a payload, and the half format's pass-through to half.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/kernels/half.h"
#include "core/kernels/kvrow.h"
#include "core/rng.h"

enum { HD = 64 };

static void fill(core_rng_t *r, float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((core_rng_uniform(r) * 2.0 - 1.0) * scale);
}

static float row_scale(const unsigned char *row)
{
    float d;
    memcpy(&d, row, sizeof d);
    return d;
}

TEST(sizes_and_bits)
{
    CHECK_INT_EQ((int)core_kvrow_bytes(CORE_KVROW_Q8, 64), 68);
    CHECK_INT_EQ((int)core_kvrow_bytes(CORE_KVROW_F16, 64), 128);
    CHECK_INT_EQ(core_kvrow_bits(CORE_KVROW_Q8), 8);
    CHECK_INT_EQ(core_kvrow_bits(CORE_KVROW_F16), 16);
    core_kvrow_fmt_t f;
    CHECK_INT_EQ(core_kvrow_fmt_of_bits(8, &f), 0);
    CHECK_INT_EQ((int)f, (int)CORE_KVROW_Q8);
    CHECK_INT_EQ(core_kvrow_fmt_of_bits(16, &f), 0);
    CHECK_INT_EQ((int)f, (int)CORE_KVROW_F16);
    CHECK(core_kvrow_fmt_of_bits(4, &f) < 0);
    CHECK(core_kvrow_fmt_of_bits(32, &f) < 0);
}

/* Against the double reference: the scale, every q within one step of the
 * reference's nearest (a float quotient may fall on the other side of a
 * midpoint) and every element within d/2 (plus the product's rounding). */
TEST(q8_matches_reference)
{
    core_rng_t r;
    core_rng_seed(&r, 5);
    float x[8 * HD], y[8 * HD];
    unsigned char q[8 * (4 + HD)];
    for (int trial = 0; trial < 200; trial++) {
        fill(&r, x, 8 * HD, pow(10.0, (double)(trial % 9) - 4.0));
        core_kvrow_pack(CORE_KVROW_Q8, x, q, 8, HD);
        core_kvrow_unpack(CORE_KVROW_Q8, q, y, 8, HD);
        for (int row = 0; row < 8; row++) {
            const unsigned char *qr = q + row * (4 + HD);
            double amax = 0; /* (a compare, not fmax: aarch64 gcc 12 cannot vectorize that) */
            for (int i = 0; i < HD; i++)
                if (fabs((double)x[row * HD + i]) > amax)
                    amax = fabs((double)x[row * HD + i]);
            const double d = row_scale(qr);
            CHECK_MSG(fabs(d - amax / 127.0) <= 1e-7 * amax / 127.0, "scale %g, want %g", d,
                      amax / 127.0);
            int peak = 0;
            for (int i = 0; i < HD; i++) {
                const int qi = ((const int8_t *)(qr + 4))[i];
                const double want = nearbyint((double)x[row * HD + i] / d);
                CHECK_MSG(abs(qi - (int)want) <= 1 && qi >= -127 && qi <= 127, "q %d, want %g",
                          qi, want);
                CHECK_MSG(fabs((double)y[row * HD + i] - x[row * HD + i]) <= d * (0.5 + 1e-6),
                          "element %d off by %g (d %g)", i, fabs(y[row * HD + i] - x[row * HD + i]),
                          d);
                CHECK_MSG(y[row * HD + i] == (float)qi * (float)d, "unpack is not q·d");
                peak |= qi == 127 || qi == -127;
            }
            CHECK_MSG(peak, "row %d: the largest element is not ±127", row);
        }
    }
}

TEST(q8_idempotent_and_round)
{
    core_rng_t r;
    core_rng_seed(&r, 6);
    float x[4 * HD], y[4 * HD], z[HD];
    unsigned char a[4 * (4 + HD)], b[4 * (4 + HD)];
    for (int trial = 0; trial < 100; trial++) {
        fill(&r, x, 4 * HD, 3.0);
        core_kvrow_pack(CORE_KVROW_Q8, x, a, 4, HD);
        core_kvrow_unpack(CORE_KVROW_Q8, a, y, 4, HD);
        core_kvrow_pack(CORE_KVROW_Q8, y, b, 4, HD);
        CHECK_MSG(memcmp(a, b, sizeof a) == 0, "trial %d: pack(unpack(row)) changed it", trial);
        for (int row = 0; row < 4; row++) {
            core_kvrow_round(CORE_KVROW_Q8, x + row * HD, z, HD);
            CHECK(memcmp(z, y + row * HD, sizeof z) == 0);
        }
    }
    /* round in place */
    memcpy(z, x, sizeof z);
    core_kvrow_round(CORE_KVROW_Q8, z, z, HD);
    CHECK(memcmp(z, y, sizeof z) == 0);
}

TEST(q8_edges)
{
    float x[HD] = {0}, y[HD];
    unsigned char q[4 + HD];
    core_kvrow_pack(CORE_KVROW_Q8, x, q, 1, HD); /* a zero row */
    CHECK(row_scale(q) == 0.0f);
    core_kvrow_unpack(CORE_KVROW_Q8, q, y, 1, HD);
    for (int i = 0; i < HD; i++)
        CHECK(y[i] == 0.0f);
    CHECK(core_kvrow_valid(CORE_KVROW_Q8, q, 1, HD));
    x[3] = 1e30f; /* saturates to ±CORE_KVROW_MAX */
    x[4] = -1e30f;
    x[5] = 1.0f;
    core_kvrow_pack(CORE_KVROW_Q8, x, q, 1, HD);
    core_kvrow_unpack(CORE_KVROW_Q8, q, y, 1, HD);
    CHECK(fabsf(y[3] - CORE_KVROW_MAX) <= CORE_KVROW_MAX * 1e-6f);
    CHECK(fabsf(y[4] + CORE_KVROW_MAX) <= CORE_KVROW_MAX * 1e-6f);
    CHECK(core_kvrow_valid(CORE_KVROW_Q8, q, 1, HD));
    x[6] = NAN; /* refused when read back */
    core_kvrow_pack(CORE_KVROW_Q8, x, q, 1, HD);
    CHECK(!core_kvrow_valid(CORE_KVROW_Q8, q, 1, HD));
}

TEST(q8_valid_refuses)
{
    core_rng_t r;
    core_rng_seed(&r, 8);
    float x[2 * HD];
    unsigned char q[2 * (4 + HD)], bad[2 * (4 + HD)];
    fill(&r, x, 2 * HD, 1.0);
    core_kvrow_pack(CORE_KVROW_Q8, x, q, 2, HD);
    CHECK(core_kvrow_valid(CORE_KVROW_Q8, q, 2, HD));
    const float scales[] = {-1.0f, INFINITY, NAN, CORE_KVROW_MAX / 127.0f * 1.01f};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        memcpy(bad, q, sizeof q);
        memcpy(bad + 4 + HD, &scales[i], 4); /* the second row's scale */
        CHECK_MSG(!core_kvrow_valid(CORE_KVROW_Q8, bad, 2, HD), "scale %g accepted",
                  (double)scales[i]);
    }
    memcpy(bad, q, sizeof q);
    bad[4 + 10] = 0x80; /* q = −128: no pack gives it */
    CHECK(!core_kvrow_valid(CORE_KVROW_Q8, bad, 2, HD));
    uint16_t h[HD];
    core_half_pack(x, h, HD);
    CHECK(core_kvrow_valid(CORE_KVROW_F16, h, 1, HD));
    h[7] = 0x7c00; /* +inf */
    CHECK(!core_kvrow_valid(CORE_KVROW_F16, h, 1, HD));
}

/* A payload holds rows little-endian: the scale's bytes in that order, the
 * values as they are; back to the same rows. */
TEST(le_round_trip)
{
    core_rng_t r;
    core_rng_seed(&r, 9);
    float x[3 * HD];
    fill(&r, x, 3 * HD, 2.0);
    unsigned char q[3 * (4 + HD)], le[3 * (4 + HD)], back[3 * (4 + HD)];
    core_kvrow_pack(CORE_KVROW_Q8, x, q, 3, HD);
    core_kvrow_to_le(CORE_KVROW_Q8, q, le, 3, HD);
    for (int row = 0; row < 3; row++) {
        uint32_t bits;
        const float d = row_scale(q + row * (4 + HD));
        memcpy(&bits, &d, 4);
        const unsigned char *p = le + row * (4 + HD);
        CHECK(p[0] == (bits & 0xff) && p[1] == ((bits >> 8) & 0xff) &&
              p[2] == ((bits >> 16) & 0xff) && p[3] == bits >> 24);
        CHECK(memcmp(p + 4, q + row * (4 + HD) + 4, HD) == 0);
    }
    core_kvrow_from_le(CORE_KVROW_Q8, le, back, 3, HD);
    CHECK(memcmp(back, q, sizeof q) == 0);
    uint16_t h[3 * HD], h2[3 * HD];
    unsigned char hl[3 * HD * 2];
    core_kvrow_pack(CORE_KVROW_F16, x, h, 3, HD);
    core_kvrow_to_le(CORE_KVROW_F16, h, hl, 3, HD);
    CHECK(hl[0] == (h[0] & 0xff) && hl[1] == (h[0] >> 8));
    core_kvrow_from_le(CORE_KVROW_F16, hl, h2, 3, HD);
    CHECK(memcmp(h, h2, sizeof h) == 0);
}

/* The half format is half.h's, row for row. */
TEST(f16_is_half)
{
    core_rng_t r;
    core_rng_seed(&r, 10);
    float x[2 * HD], y[2 * HD], z[2 * HD];
    uint16_t a[2 * HD], b[2 * HD];
    fill(&r, x, 2 * HD, 100.0);
    core_kvrow_pack(CORE_KVROW_F16, x, a, 2, HD);
    core_half_pack(x, b, 2 * HD);
    CHECK(memcmp(a, b, sizeof a) == 0);
    core_kvrow_unpack(CORE_KVROW_F16, a, y, 2, HD);
    core_half_unpack(b, z, 2 * HD);
    CHECK(memcmp(y, z, sizeof y) == 0);
    core_kvrow_round(CORE_KVROW_F16, x, y, HD);
    CHECK(memcmp(y, z, HD * sizeof *y) == 0);
}

int main(void)
{
    RUN(sizes_and_bits);
    RUN(q8_matches_reference);
    RUN(q8_idempotent_and_round);
    RUN(q8_edges);
    RUN(q8_valid_refuses);
    RUN(le_round_trip);
    RUN(f16_is_half);
    return CHECK_DONE();
}
