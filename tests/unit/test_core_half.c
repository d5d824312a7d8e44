/* Tests of core/kernels/half.c: every half unpacks to the value its bits mean;
 * packing rounds to nearest with ties to even, checked at every midpoint
 * between neighbouring positive halves (computed here in double, not with
 * core/tensor.c's converter); saturation, infinities and NaN; the portable
 * and F16C paths bit for bit, at every length 0..40 (the vector tails). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/kernels/half.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"

/* The value of half bits h from its fields, in double. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double s = h & 0x8000 ? -1.0 : 1.0;
    if (e == 0x1f)
        return m ? NAN : s * INFINITY;
    return e ? s * ldexp(1.0 + m / 1024.0, e - 15) : s * ldexp(m / 1024.0, -14);
}

/* The ISAs to run: generic, and AVX2 (F16C) where this CPU has it. */
static int n_isas(void)
{
    return core_qdot_isa_runs(CORE_QDOT_AVX2) ? 2 : 1;
}

static void use_isa(int i)
{
    core_qdot_force_isa(i ? CORE_QDOT_AVX2 : CORE_QDOT_GENERIC);
}

TEST(unpack_every_half)
{
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    for (int isa = 0; isa < n_isas(); isa++) {
        use_isa(isa);
        core_half_unpack(h, x, N);
        int bad = -1;
        for (int i = 0; i < N && bad < 0; i++) {
            double want = half_value((uint16_t)i);
            if (isnan(want) ? !isnan(x[i]) : (double)x[i] != want || !signbit(x[i]) != !signbit(want))
                bad = i;
        }
        CHECK_MSG(bad < 0, "isa %d: half 0x%04x unpacked wrong", isa, bad);
    }
    core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
    free(h);
    free(x);
}

/* At the midpoint between each positive half a and the next b (exact in
 * float: 12 significant bits), ties go to the even one; one float below goes
 * to a, one above to b. Negative values mirror them. */
TEST(pack_rounds_to_nearest_even)
{
    enum { N = 0x7bff * 6 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint16_t *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    int64_t n = 0;
    for (uint16_t a = 0; a < 0x7bff; a++) {
        uint16_t b = (uint16_t)(a + 1);
        float mid = (float)((half_value(a) + half_value(b)) / 2.0);
        CHECK((double)mid == (half_value(a) + half_value(b)) / 2.0);
        uint16_t even = a % 2 ? b : a;
        float v[3] = {nextafterf(mid, -INFINITY), mid, nextafterf(mid, INFINITY)};
        uint16_t w[3] = {a, even, b};
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < 3; j++) {
                x[n] = s ? -v[j] : v[j];
                want[n++] = (uint16_t)(w[j] | (s ? 0x8000 : 0));
            }
    }
    for (int isa = 0; isa < n_isas(); isa++) {
        use_isa(isa);
        core_half_pack(x, got, n);
        core_half_round(x, y, n);
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (got[i] != want[i] || (double)y[i] != half_value(want[i]))
                bad = i;
        CHECK_MSG(bad < 0, "isa %d: %.9g packed to 0x%04x, want 0x%04x", isa,
                  bad < 0 ? 0.0 : (double)x[bad], bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
    }
    core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
    free(x);
    free(y);
    free(want);
    free(got);
}

TEST(saturation_infinity_nan)
{
    const float x[12] = {65504.0f, 65519.0f, 65520.0f, 1e30f, FLT_MAX, INFINITY,
                         -65520.0f, -1e30f, -INFINITY, NAN, 0.0f, -0.0f};
    const uint16_t want[12] = {0x7bff, 0x7bff, 0x7bff, 0x7bff, 0x7bff, 0x7c00,
                               0xfbff, 0xfbff, 0xfc00, 0, 0x0000, 0x8000};
    for (int isa = 0; isa < n_isas(); isa++) {
        use_isa(isa);
        /* at offset 0 (the vector path) and 5 (the scalar tail) */
        for (int off = 0; off < 2; off++) {
            float in[20] = {0}, y[20];
            uint16_t h[20];
            memcpy(in + off * 5, x, sizeof x);
            core_half_pack(in, h, 20);
            core_half_round(in, y, 20);
            for (int i = 0; i < 12; i++) {
                uint16_t g = h[off * 5 + i];
                float r = y[off * 5 + i];
                if (i == 9)
                    CHECK_MSG((g & 0x7c00) == 0x7c00 && (g & 0x3ff) && isnan(r),
                              "isa %d: NaN packed to 0x%04x", isa, g);
                else
                    CHECK_MSG(g == want[i] && (double)r == half_value(want[i]),
                              "isa %d offset %d: %g packed to 0x%04x, want 0x%04x", isa, off,
                              (double)x[i], g, want[i]);
            }
        }
    }
    core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
}

/* Random values over the whole range, every length 0..40: the paths agree
 * bit for bit and nothing is written past n. */
TEST(paths_agree_every_length)
{
    core_rng_t r;
    core_rng_seed(&r, 11);
    enum { N = 48 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(core_rng_normal(&r) * pow(10.0, core_rng_uniform(&r) * 12.0 - 8.0));
    for (int n = 0; n <= 40; n++) {
        uint16_t h[2][N + 4];
        float u[2][N + 4], y[2][N + 4];
        for (int isa = 0; isa < 2; isa++) {
            for (int i = 0; i < N + 4; i++) {
                h[isa][i] = 0x1234;
                u[isa][i] = y[isa][i] = 7.0f;
            }
            use_isa(isa < n_isas() ? isa : 0);
            core_half_pack(x, h[isa], n);
            core_half_unpack(h[isa], u[isa], n);
            core_half_round(x, y[isa], n);
        }
        int ok = 1;
        for (int i = 0; i < N + 4; i++) {
            ok &= h[0][i] == h[1][i] && memcmp(&u[0][i], &u[1][i], 4) == 0 &&
                  memcmp(&y[0][i], &y[1][i], 4) == 0 && memcmp(&u[0][i], &y[0][i], 4) == 0;
            if (i >= n)
                ok &= h[0][i] == 0x1234 && y[0][i] == 7.0f && u[1][i] == 7.0f;
        }
        CHECK_MSG(ok, "length %d", n);
    }
    core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
}

int main(void)
{
    RUN(unpack_every_half);
    RUN(pack_rounds_to_nearest_even);
    RUN(saturation_infinity_nan);
    RUN(paths_agree_every_length);
    return CHECK_DONE();
}
