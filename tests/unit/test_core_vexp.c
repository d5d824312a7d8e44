/* Tests of core/kernels/vexp.c: core_exp_shifted against libm's exp in double, the
 * AVX-512 and portable paths bit for bit, -inf and tiny arguments, every
 * length and position (the masked tail). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "core/kernels/cpu.h"
#include "core/kernels/vexp.h"

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* worst relative error over n values against e^((float)(x - s)) in double */
static double worst_rel(const float *x, int64_t n, double s, const float *got)
{
    double worst = 0;
    for (int64_t j = 0; j < n; j++) {
        const float y = (float)((double)x[j] - s);
        if (x[j] == -INFINITY || y < CORE_EXP_MIN_ARG) {
            if (got[j] != 0.0f)
                return INFINITY;
            continue;
        }
        const double want = exp((double)y), e = fabs(got[j] - want) / want;
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

TEST(matches_libm_both_paths)
{
    core_rng_t r;
    core_rng_seed(&r, 5);
    enum { N = 20000 };
    float *x = malloc(N * sizeof *x), *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    for (int j = 0; j < N; j++)
        x[j] = (float)(core_rng_uniform(&r) * 100.0 - 95.0); /* -95 .. 5 */
    x[0] = -INFINITY;
    x[1] = 0.0f;
    x[2] = -87.0f;
    x[3] = -86.99f;
    x[4] = -1e-30f;
    const double shifts[] = {0.0, 3.25, -2.0, 40.123456789};
    for (size_t i = 0; i < sizeof shifts / sizeof shifts[0]; i++) {
        core_exp_force_generic(0);
        core_exp_shifted(x, N, shifts[i], a);
        core_exp_force_generic(1);
        core_exp_shifted(x, N, shifts[i], b);
        core_exp_force_generic(0);
        int same = 1;
        for (int j = 0; j < N; j++)
            same &= same_bits(a[j], b[j]);
        CHECK_MSG(same, "shift %g: the two paths differ", shifts[i]);
        const double ea = worst_rel(x, N, shifts[i], a), eb = worst_rel(x, N, shifts[i], b);
        CHECK_MSG(ea <= CORE_EXP_MAX_REL_ERR && eb <= CORE_EXP_MAX_REL_ERR,
                  "shift %g: relative error %.3g / %.3g", shifts[i], ea, eb);
        printf("  shift %g: worst relative error %.3g\n", shifts[i], ea);
    }
    CHECK(a[0] == 0.0f);
    free(x);
    free(a);
    free(b);
}

/* Every length 0..40 from every offset 0..3: the same bits as one long call
 * (an element's result does not depend on where the vector tail falls), and
 * nothing written past n. */
TEST(lengths_and_positions)
{
    core_rng_t r;
    core_rng_seed(&r, 6);
    enum { N = 64 };
    float x[N], full[N], part[N + 8];
    for (int j = 0; j < N; j++)
        x[j] = (float)(core_rng_uniform(&r) * 20.0 - 18.0);
    core_exp_shifted(x, N, 1.5, full);
    for (int off = 0; off < 4; off++)
        for (int n = 0; n <= 40; n++) {
            for (int j = 0; j < N + 8; j++)
                part[j] = 7.0f;
            core_exp_shifted(x + off, n, 1.5, part);
            int ok = 1;
            for (int j = 0; j < n; j++)
                ok &= same_bits(part[j], full[off + j]);
            for (int j = n; j < N + 8; j++)
                ok &= part[j] == 7.0f;
            CHECK_MSG(ok, "offset %d length %d", off, n);
        }
}

/* core_sum_f32 and core_dot_f32 against long double sums (and core_max_f32) of the same
 * floats: every length around their four chains, within n·2^-52 of the sum
 * of magnitudes; integers (every partial sum exact in double) bit for bit;
 * only x[0..n) read. */
TEST(sums_match_reference)
{
    enum { N = 300 };
    float x[N + 4];
    core_rng_t r;
    core_rng_seed(&r, 11);
    for (int j = 0; j < N + 4; j++)
        x[j] = (float)((core_rng_uniform(&r) - 0.5) * 1e3);
    for (int n = 0; n <= N; n += n < 40 ? 1 : 37) {
        long double ref = 0.0L, mag = 0.0L;
        for (int j = 0; j < n; j++) {
            ref += x[j];
            mag += fabsl((long double)x[j]);
        }
        double got = core_sum_f32(x, n);
        CHECK_MSG(fabsl((long double)got - ref) <= mag * (n + 1) * 0x1p-52L, "n %d: %.17g vs %.17Lg",
                  n, got, ref);
    }
    float k[N];
    double want = 0.0;
    for (int j = 0; j < N; j++) {
        k[j] = (float)(j % 17) - 8.0f;
        want += k[j];
    }
    CHECK(core_sum_f32(k, N) == want);
    x[3] = NAN; /* past n: never read */
    CHECK(isfinite(core_sum_f32(x, 3)));
    /* the dot product likewise: against long double at every length, and
     * small integers (every partial sum exact) bit for bit */
    x[3] = 0.25f;
    float y[N];
    for (int j = 0; j < N; j++)
        y[j] = x[N - 1 - j];
    for (int n = 0; n <= N; n += n < 40 ? 1 : 37) {
        long double ref = 0.0L, mag = 0.0L;
        for (int j = 0; j < n; j++) {
            ref += (long double)x[j] * y[j];
            mag += fabsl((long double)x[j] * y[j]);
        }
        double got = core_dot_f32(x, y, n);
        CHECK_MSG(fabsl((long double)got - ref) <= mag * (n + 2) * 0x1p-52L, "dot n %d", n);
    }
    double sq = 0.0;
    for (int j = 0; j < N; j++)
        sq += (double)k[j] * k[j];
    CHECK(core_dot_f32(k, k, N) == sq);
    /* the maximum: at every lane position and length, NaN skipped, -inf
     * for none */
    CHECK(core_max_f32(x, 0) == -INFINITY);
    for (int n = 1; n <= 12; n++)
        for (int at = 0; at < n; at++) {
            float v[12];
            for (int j = 0; j < n; j++)
                v[j] = (float)-j;
            v[at] = 5.0f;
            if (at + 1 < n)
                v[at + 1] = NAN;
            CHECK_MSG(core_max_f32(v, n) == 5.0f, "max n %d at %d", n, at);
        }
}

/* core_first_unbounded_f32 on both paths: NaN and +inf found at every
 * position of every length up to 40 (across the 16-lane blocks and the
 * tail), the first of two, -inf and huge finite values passed over, n for
 * none. */
TEST(first_unbounded_both_paths)
{
    const float bads[2] = {NAN, INFINITY};
    for (int path = 0; path < 2; path++) {
        core_exp_force_generic(path);
        float v[40];
        CHECK(core_first_unbounded_f32(v, 0) == 0);
        for (int n = 1; n <= 40; n++) {
            for (int j = 0; j < n; j++)
                v[j] = j % 3 == 0 ? -INFINITY : j % 3 == 1 ? FLT_MAX : -(float)j;
            CHECK_MSG(core_first_unbounded_f32(v, n) == n, "path %d n %d: none", path, n);
            for (int at = 0; at < n; at++)
                for (int b = 0; b < 2; b++) {
                    const float keep = v[at];
                    v[at] = bads[b];
                    if (at + 1 < n)
                        v[n - 1] = bads[1 - b]; /* a later one does not count */
                    CHECK_MSG(core_first_unbounded_f32(v, n) == at, "path %d n %d at %d", path,
                              n, at);
                    v[at] = keep;
                    v[n - 1] = (n - 1) % 3 == 0 ? -INFINITY : (n - 1) % 3 == 1 ? FLT_MAX
                                                                             : -(float)(n - 1);
                }
        }
    }
    core_exp_force_generic(0);
}

/* The double reference of SwiGLU's silu(g)·u, or of GeGLU's gelu(g)·u with
 * GELU's tanh approximation written as Gemma's description gives it. */
static double glu_ref(int gelu, double g, double u)
{
    if (!gelu)
        return g / (1.0 + exp(-g)) * u;
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
}

static void glu_mul(int gelu, float *g, const float *u, int64_t n)
{
    if (gelu)
        core_gelu_mul_f32(g, u, n);
    else
        core_silu_mul_f32(g, u, n);
}

/* SwiGLU's silu(g)·u and GeGLU's gelu(g)·u: the vector path gives the
 * portable one's bits at every length 0..70 (tails), and both agree with a
 * double evaluation (the exponential's 3e-7, the argument's, division's and
 * product's rounding); g from -120 to 120 (the exponential clamped at e^88
 * and flushed below CORE_EXP_MIN_ARG), zeros of both signs, u of both
 * signs. */
static void check_glu_both_paths(int gelu)
{
    enum { N = 70 };
    float g0[N], u[N], got[2][N];
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int rep = 0; rep < 40; rep++) {
        for (int j = 0; j < N; j++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            const double r = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
            g0[j] = rep < 20 ? (float)(8.0 * (r - 0.5)) : (float)(240.0 * (r - 0.5));
            u[j] = (float)(3.0 * (((double)((x >> 7) & 0xffff) / 65536.0) - 0.5));
        }
        g0[0] = 0.0f;
        g0[1] = -0.0f;
        for (int n = 0; n <= N; n += rep < 2 ? 1 : N) {
            for (int path = 0; path < 2; path++) {
                core_exp_force_generic(path);
                memcpy(got[path], g0, sizeof g0);
                glu_mul(gelu, got[path], u, n);
                for (int j = n; j < N; j++) /* nothing past n is written */
                    CHECK(memcmp(&got[path][j], &g0[j], sizeof(float)) == 0);
            }
            CHECK_MSG(memcmp(got[0], got[1], (size_t)n * sizeof(float)) == 0,
                      "rep %d n %d: paths differ", rep, n);
            for (int j = 0; j < n; j++) {
                const double want = glu_ref(gelu, (double)g0[j], (double)u[j]);
                /* GELU: the argument's rounding, relative to the result,
                 * grows with |z| where the result is already ~0 */
                CHECK_MSG(fabs((double)got[1][j] - want) <=
                              (gelu ? 2e-6 : 1e-6) * fabs(want) + (gelu ? 1e-7 : 1e-30),
                          "%s g %g u %g: %g vs %g", gelu ? "gelu" : "silu", (double)g0[j],
                          (double)u[j], (double)got[1][j], want);
            }
        }
    }
    core_exp_force_generic(0);
}

TEST(silu_mul_both_paths)
{
    check_glu_both_paths(0);
}

TEST(gelu_mul_both_paths)
{
    check_glu_both_paths(1);
}

/* The exponentials and SwiGLU on every kernel path this CPU runs
 * (core_qdot_force_isa: portable C, AVX2, AVX-512) give the portable path's
 * bits, full vectors and tails alike. */
TEST(every_isa_same_bits)
{
    enum { N = 83 };
    float x[N], u[N], ref[N], got[N], gref[N], ggot[N], eref[N], egot[N];
    uint64_t v = 0x2545f4914f6cdd1du;
    for (int j = 0; j < N; j++) {
        v = v * 6364136223846793005u + 1442695040888963407u;
        const double r = (double)(v >> 11) / 9007199254740992.0;
        x[j] = (float)(200.0 * r - 150.0); /* below the floor, above the clamp */
        u[j] = (float)(2.0 * r - 1.0);
    }
    x[5] = -INFINITY;
    core_exp_force_generic(1);
    core_exp_shifted(x, N, -3.5, ref);
    memcpy(gref, x, sizeof x);
    core_silu_mul_f32(gref, u, N);
    memcpy(eref, x, sizeof x);
    eref[5] = 0.0f; /* GELU of -inf: inf * 0 */
    core_gelu_mul_f32(eref, u, N);
    core_exp_force_generic(0);
    for (int isa = 0; isa <= (int)core_qdot_best_isa(); isa++) {
        if (!core_qdot_isa_runs((core_qdot_isa_t)isa))
            continue;
        CHECK_INT_EQ(core_qdot_force_isa((core_qdot_isa_t)isa), 0);
        for (int n = N - 9; n <= N; n++) {
            core_exp_shifted(x, n, -3.5, got);
            memcpy(ggot, x, sizeof x);
            core_silu_mul_f32(ggot, u, n);
            memcpy(egot, x, sizeof x);
            egot[5] = 0.0f;
            core_gelu_mul_f32(egot, u, n);
            CHECK_MSG(memcmp(got, ref, (size_t)n * sizeof *got) == 0 &&
                          memcmp(ggot, gref, (size_t)n * sizeof *ggot) == 0 &&
                          memcmp(egot, eref, (size_t)n * sizeof *egot) == 0,
                      "%s n %d: not the portable bits", core_qdot_isa_name((core_qdot_isa_t)isa),
                      n);
        }
    }
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
}

int main(void)
{
    RUN(every_isa_same_bits);
    RUN(silu_mul_both_paths);
    RUN(gelu_mul_both_paths);
    RUN(matches_libm_both_paths);
    RUN(first_unbounded_both_paths);
    RUN(lengths_and_positions);
    RUN(sums_match_reference);
    return CHECK_DONE();
}
