/* Tests for core/qdot: quantized-row matrix products against core_dot_ref
 * (double sums over core_dequantize's values), for every supported type
 * (the block types, F16 and BF16), every ISA this CPU runs, many shapes
 * (F16/BF16: any k, m = 1..17, n = 1..33), strides and beta.
 *
 * Tolerance: the header's error contract. The kernels use the integer quants
 * and scales exactly (a one-hot activation reads back core_dequantize's value
 * bit for bit, checked below), so an output differs from the exact sum only
 * by float rounding of the products and sums: each partial sum takes at most
 * k/4 + 8 sequential operations, so |got - ref| <= gamma(k/4 + 8) * S
 * (Higham's bound for recursive summation of products, gamma(n) = n u /
 * (1 - n u), u = 2^-24), S = sum_e |y_e x_e|, widened for Q4_1 by the block
 * offset m (the one-row kernel sums d * (q . x) and m * sum(x) separately):
 * S = sum_e (|y_e| + 2 |m_b|) |x_e|. Plus one rounding of the stored result
 * and of the beta term. A wrong nibble order or scale shifts the result by
 * O(S / sqrt(k)), orders of magnitude above that bound for the k tested.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/unit/check.h"
#include "tests/unit/qdot_check.h"

/* Offsets of a block's f16 scale fields (d, m, dmin), rewritten to finite
 * values after random filling so that random bytes do not make NaN/Inf.
 * F16/BF16 (n_half 0): every value is drawn finite instead. */
typedef struct {
    int type;
    int n_half;
    int off[2];
} halves_t;

static const halves_t halves[] = {
    {CORE_TTYPE_Q4_0, 1, {0, 0}},   {CORE_TTYPE_Q4_1, 2, {0, 2}}, {CORE_TTYPE_Q5_0, 1, {0, 0}},
    {CORE_TTYPE_Q5_1, 2, {0, 2}},   {CORE_TTYPE_Q8_0, 1, {0, 0}}, {CORE_TTYPE_Q2_K, 2, {80, 82}},
    {CORE_TTYPE_Q3_K, 1, {108, 0}}, {CORE_TTYPE_Q4_K, 2, {0, 2}}, {CORE_TTYPE_Q5_K, 2, {0, 2}},
    {CORE_TTYPE_Q6_K, 1, {208, 0}}, {CORE_TTYPE_F16, 0, {0, 0}},  {CORE_TTYPE_BF16, 0, {0, 0}},
};

static int is_half(int type)
{
    return type == CORE_TTYPE_F16 || type == CORE_TTYPE_BF16;
}

static const halves_t *halves_of(int type)
{
    for (size_t i = 0; i < sizeof halves / sizeof halves[0]; i++)
        if (halves[i].type == type)
            return &halves[i];
    return NULL;
}

/* n rows of k values, each row row_bytes apart (padding bytes random). */
static void fill_rows(core_rng_t *r, int type, int64_t n, int64_t k, size_t row_bytes,
                      unsigned char *w)
{
    const halves_t *hv = halves_of(type);
    const int64_t blck = core_ttype_block_elems(type);
    const size_t bb = core_ttype_block_bytes(type);
    for (size_t i = 0; i < (size_t)n * row_bytes; i++)
        w[i] = (unsigned char)core_rng_u64(r);
    for (int64_t j = 0; j < n; j++)
        for (int64_t b = 0; b < k / blck; b++) {
            unsigned char *blk = w + (size_t)j * row_bytes + (size_t)b * bb;
            for (int h = 0; h < hv->n_half; h++)
                put_half(blk + hv->off[h], (float)(core_rng_normal(r) * 0.05));
            if (is_half(type)) {
                const float v = (float)core_rng_normal(r);
                const uint16_t h =
                    type == CORE_TTYPE_F16 ? core_fp32_to_fp16(v) : core_fp32_to_bf16(v);
                memcpy(blk, &h, sizeof h);
            }
        }
}

static void fill_f(core_rng_t *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)core_rng_normal(r);
}

/* One product under each ISA the CPU runs, every output checked against
 * core_dot_ref; the paths agree within twice the bound (checked too). */
static void check_case(core_rng_t *r, int type, int64_t m, int64_t n, int64_t k, size_t pad,
                       float beta)
{
    size_t rb0 = 0;
    CHECK(core_ttype_row_bytes(type, k, &rb0) == 0);
    const size_t row_bytes = rb0 + pad;
    const int64_t lda = k + 3, ldc = n + 2;
    unsigned char *w = malloc((size_t)n * row_bytes);
    float *a = malloc((size_t)(m * lda) * sizeof *a);
    float *c0 = malloc((size_t)(m * ldc) * sizeof *c0);
    float *c = malloc((size_t)(m * ldc) * sizeof *c);
    float *cg = malloc((size_t)(m * ldc) * sizeof *cg);
    float *c1 = malloc((size_t)(m * ldc) * sizeof *c1); /* the AVX2 result */
    float *y = malloc((size_t)k * sizeof *y);
    double *tolv = malloc((size_t)(m * ldc) * sizeof *tolv); /* [m][ldc] bound per output */
    unsigned char *pk = NULL;                                /* w packed, where this CPU packs */
    float *panel = NULL;                                     /* its scratch */
    if (!w || !a || !c0 || !c || !cg || !c1 || !y || !tolv) {
        CHECK(!"out of memory");
        goto out;
    }
    fill_rows(r, type, n, k, row_bytes, w);
    fill_f(r, a, (size_t)(m * lda));
    for (int64_t i = 0; i < m * ldc; i++)
        c0[i] = beta == 0.0f ? NAN : (float)core_rng_normal(r);

    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    /* the last pass, s == ni: the packed weights' kernel, where this CPU runs it */
    if (core_q8_pack_supported(type) && k % CORE_Q8_BLOCK == 0 && k > 0 &&
        (pk = aligned_alloc(64, (core_q8_pack_bytes(type, n, k) + 63) / 64 * 64)) &&
        (panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel)))
        core_q8_pack(type, w, row_bytes, n, k, pk);
    else {
        free(pk);
        pk = NULL;
    }
    for (int s = 0; s < ni + (pk != NULL); s++) {
        float *out = s == 0 ? cg : s == 1 ? c1 : c;
        memcpy(out, c0, (size_t)(m * ldc) * sizeof *out);
        int rc = s < ni ? core_qmatmul_nt_isa(isas[s], type, m, n, k, a, lda, w, row_bytes, beta,
                                              out, ldc)
                        : core_qmatmul_packed(type, m, 0, n, k, a, lda, pk, panel, beta, out,
                                              ldc);
        CHECK_INT_EQ(rc, 0);
        int bad = 0;
        for (int64_t j = 0; j < n; j++) {
            const unsigned char *row = w + (size_t)j * row_bytes;
            CHECK(core_dequantize(type, row, y, k, NULL) == 0);
            for (int64_t i = 0; i < m; i++) {
                const float *x = a + i * lda;
                double sabs = 0;
                for (int64_t e = 0; e < k; e++) {
                    double off = 0; /* |m_b| of Q4_1's y = d q + m */
                    if (type == CORE_TTYPE_Q4_1) {
                        uint16_t h;
                        memcpy(&h, row + (size_t)(e / 32) * 20 + 2, sizeof h);
                        off = fabs((double)core_fp16_to_fp32(h));
                    }
                    sabs += (fabs((double)y[e]) + 2 * off) * fabs((double)x[e]);
                }
                const double dot = core_dot_ref(type, row, x, k);
                const double cin = beta == 0.0f ? 0.0 : (double)beta * c0[i * ldc + j];
                const double ref = dot + cin;
                const double u = ldexp(1.0, -24);
                /* the panels' chains are k deep (core/kernels/qdot.h) */
                const double depth = s < ni ? (double)k / 4 + 8 : (double)k;
                const double tol = gamma_n(depth) * sabs +
                                   2 * u * (fabs(dot) + fabs(cin) + fabs(ref)) + 1e-30;
                const double got = out[i * ldc + j];
                tolv[i * ldc + j] = tol;
                if (!(fabs(got - ref) <= tol) && !bad) {
                    bad = 1; /* report the first one only */
                    CHECK_MSG(0,
                              "%s isa %d m=%lld n=%lld k=%lld beta=%g [%lld][%lld]: %.9g vs %.9g "
                              "(tol %.3g)",
                              core_ttype_name(type), s < ni ? (int)isas[s] : -1, (long long)m,
                              (long long)n, (long long)k, (double)beta, (long long)i, (long long)j,
                              got, ref, tol);
                }
            }
        }
        if (s >= 1) {
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++)
                    CHECK(fabs((double)cg[i * ldc + j] - out[i * ldc + j]) <=
                          2 * tolv[i * ldc + j]);
        }
        if (s == 2 && s < ni) /* the f32 kernels of AVX-512 CPUs are the AVX2 ones */
            CHECK(memcmp(out, c1, (size_t)(m * ldc) * sizeof *out) == 0);
        /* padding columns of C are not touched */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = n; j < ldc; j++) {
                const float g = out[i * ldc + j], z = c0[i * ldc + j];
                CHECK(same_bits(g, z));
            }
    }
out:
    free(pk);
    free(panel);
    free(w);
    free(a);
    free(c0);
    free(c);
    free(cg);
    free(c1);
    free(y);
    free(tolv);
}

TEST(every_supported_type_has_test_data)
{
    int n = 0;
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++) {
        if (!core_qdot_supported(t))
            continue;
        n++;
        CHECK_MSG(halves_of(t) != NULL, "type %s supported but not covered", core_ttype_name(t));
    }
    CHECK(core_qdot_supported(CORE_TTYPE_Q4_0));
    CHECK(core_qdot_supported(CORE_TTYPE_Q4_1));
    CHECK(core_qdot_supported(CORE_TTYPE_Q8_0));
    CHECK(core_qdot_supported(CORE_TTYPE_Q4_K));
    CHECK(core_qdot_supported(CORE_TTYPE_Q5_K));
    CHECK(core_qdot_supported(CORE_TTYPE_Q6_K));
    CHECK(core_qdot_supported(CORE_TTYPE_F16));
    CHECK(core_qdot_supported(CORE_TTYPE_BF16));
    CHECK(!core_qdot_supported(CORE_TTYPE_F32));
    CHECK(!core_qdot_supported(CORE_TTYPE_Q8_1)); /* known size, no dequantizer */
    CHECK(!core_qdot_supported(-1));
    CHECK(!core_qdot_supported(39));
    CHECK(n >= 8);
}

TEST(matches_reference_all_types_shapes)
{
    core_rng_t r;
    core_rng_seed(&r, 11);
    const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13};
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++) {
        if (!core_qdot_supported(t) || !halves_of(t))
            continue;
        const int64_t blck = core_ttype_block_elems(t);
        const int64_t ks_block[] = {blck, 2 * blck, 3 * blck, blck == 32 ? 576 : 512, 1536};
        const int64_t ks_half[] = {1, 7, 33, 100, 577}; /* F16/BF16: any k */
        const int64_t *ks = blck == 1 ? ks_half : ks_block;
        for (size_t ki = 0; ki < sizeof ks_block / sizeof ks_block[0]; ki++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int64_t n = 1 + (int64_t)((mi * 7 + ki * 3) % 11);
                check_case(&r, t, ms[mi], n, ks[ki], (mi + ki) % 3 == 0 ? 0 : 5,
                           mi % 2 ? 1.0f : 0.0f);
            }
        /* other beta, and a degenerate empty product */
        check_case(&r, t, 3, 4, 2 * blck, 1, -0.5f);
        check_case(&r, t, 2, 0, blck, 0, 0.0f);
    }
}

/* A one-hot activation reads out single dequantized weights: the kernels'
 * values are exactly core_dequantize's (the premise of the tolerance). */
TEST(dequantized_values_bit_identical)
{
    core_rng_t r;
    core_rng_seed(&r, 12);
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++) {
        if (!core_qdot_supported(t) || !halves_of(t))
            continue;
        const int64_t k = is_half(t) ? 37 : 2 * core_ttype_block_elems(t); /* F16/BF16: a tail */
        size_t rb = 0;
        CHECK(core_ttype_row_bytes(t, k, &rb) == 0);
        unsigned char w[2 * 210];
        float y[512], x[512], out;
        fill_rows(&r, t, 1, k, rb, w);
        CHECK(core_dequantize(t, w, y, k, NULL) == 0);
        int bad = 0;
        for (int s = 0; s < ni; s++)
            for (int64_t e = 0; e < k && !bad; e++) {
                memset(x, 0, sizeof x);
                x[e] = 1.0f;
                CHECK(core_qmatmul_nt_isa(isas[s], t, 1, 1, k, x, k, w, rb, 0.0f, &out, 1) == 0);
                if (!same_bits(out, y[e]) && !(out == 0.0f && y[e] == 0.0f)) {
                    bad = 1;
                    CHECK_MSG(0, "%s isa %d value %lld: %.9g vs %.9g", core_ttype_name(t),
                              (int)isas[s], (long long)e, (double)out, (double)y[e]);
                }
            }
        if (!core_q8_pack_supported(t))
            continue;
        /* the panels of the packed weights hold the same floats */
        unsigned char *pk = aligned_alloc(64, (core_q8_pack_bytes(t, 1, k) + 63) / 64 * 64);
        float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
        if (!pk || !panel) {
            CHECK(!"out of memory");
        } else {
            core_q8_pack(t, w, rb, 1, k, pk);
            for (int64_t e = 0; e < k && !bad; e++) {
                memset(x, 0, sizeof x);
                x[e] = 1.0f;
                CHECK(core_qmatmul_packed(t, 1, 0, 1, k, x, k, pk, panel, 0.0f, &out, 1) == 0);
                if (!same_bits(out, y[e]) && !(out == 0.0f && y[e] == 0.0f)) {
                    bad = 1;
                    CHECK_MSG(0, "%s packed value %lld: %.9g vs %.9g", core_ttype_name(t),
                              (long long)e, (double)out, (double)y[e]);
                }
            }
        }
        free(pk);
        free(panel);
    }
}

/* core_qdot_dequant gives core_dequantize's values bit for bit, on every
 * ISA and every supported type (SIMD for Q4_0, Q4_1, Q8_0, F16, BF16), for a
 * run of several blocks (F16/BF16: two groups of 32 and a rest of 26). */
TEST(dequant_entry_equals_core_dequantize)
{
    core_rng_t r;
    core_rng_seed(&r, 14);
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++) {
        if (!core_qdot_supported(t) || !halves_of(t))
            continue;
        const int64_t k = is_half(t) ? 45 : 3 * core_ttype_block_elems(t);
        size_t rb = 0;
        CHECK(core_ttype_row_bytes(t, k, &rb) == 0);
        unsigned char w[3 * 2 * 210];
        float want[2 * 768], got[2 * 768];
        fill_rows(&r, t, 2, k, rb, w);
        CHECK(core_dequantize(t, w, want, 2 * k, NULL) == 0);
        for (int s = 0; s < ni; s++) {
            memset(got, 0xff, sizeof got);
            CHECK(core_qdot_dequant_isa(isas[s], t, w, got, 2 * k) == 0);
            CHECK_MSG(memcmp(got, want, (size_t)(2 * k) * sizeof(float)) == 0, "%s isa %d",
                      core_ttype_name(t), (int)isas[s]);
        }
        memset(got, 0xff, sizeof got);
        core_qdot_dequant(t, w, got, 2 * k);
        CHECK(memcmp(got, want, (size_t)(2 * k) * sizeof(float)) == 0);
    }
    float y[32];
    unsigned char b[34] = {0};
    CHECK_INT_EQ(core_qdot_dequant_isa(CORE_QDOT_ISA_COUNT_, CORE_TTYPE_Q8_0, b, y, 32),
                 CORE_EUNSUPPORTED);
    CHECK_INT_EQ(core_qdot_dequant_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q8_0, b, y, 31), CORE_EINVAL);
}

/* F16 and BF16 weights, read in place: every ISA against core_dot_ref for
 * m = 1..17 and n = 1..33, k not a multiple of 8 or 32 (the SIMD kernels'
 * tails) as well as multiples. */
TEST(half_types_odd_shapes)
{
    core_rng_t r;
    core_rng_seed(&r, 15);
    const int types[] = {CORE_TTYPE_F16, CORE_TTYPE_BF16};
    const int64_t ks[] = {1, 31, 32, 65, 200, 576, 1000};
    for (int t = 0; t < 2; t++) {
        for (int64_t m = 1; m <= 17; m++)
            check_case(&r, types[t], m, 1 + (m * 11) % 33, ks[m % 7], m % 3 ? 0 : 2,
                       m % 2 ? 1.0f : 0.0f);
        for (int64_t n = 1; n <= 33; n++)
            check_case(&r, types[t], 1 + n % 3, n, ks[(n + 3) % 7], 1, n % 4 ? 0.0f : -0.5f);
    }
}

/* Every one of the 65536 F16 and BF16 bit patterns through core_qdot_dequant
 * on every ISA: core_dequantize's value bit for bit, except that F16C makes
 * a signaling NaN quiet (the header's exception; both are NaN). */
TEST(half_dequant_every_bit_pattern)
{
    enum { N = 1 << 16 };
    uint16_t *h = malloc(N * sizeof *h);
    float *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    if (!h || !want || !got) {
        CHECK(!"out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    const int types[] = {CORE_TTYPE_F16, CORE_TTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        CHECK(core_dequantize(types[t], h, want, N, NULL) == 0);
        for (int s = 0; s < ni; s++) {
            CHECK_INT_EQ(core_qdot_dequant_isa(isas[s], types[t], h, got, N), 0);
            int bad = 0;
            for (uint32_t i = 0; i < N && !bad; i++) {
                const int snan = types[t] == CORE_TTYPE_F16 && isnan(want[i]) && !(i & 0x200);
                if (same_bits(got[i], want[i]) || (snan && isnan(got[i])))
                    continue;
                bad = 1;
                CHECK_MSG(0, "%s %s 0x%04x: %.9g vs %.9g", core_ttype_name(types[t]),
                          core_qdot_isa_name(isas[s]), (unsigned)i, (double)got[i],
                          (double)want[i]);
            }
        }
    }
out:
    free(h);
    free(want);
    free(got);
}

TEST(default_entry_equals_default_isa)
{
    core_rng_t r;
    core_rng_seed(&r, 13);
    const int64_t m = 3, n = 9, k = 512;
    size_t rb = 0;
    CHECK(core_ttype_row_bytes(CORE_TTYPE_Q4_1, k, &rb) == 0);
    unsigned char *w = malloc((size_t)n * rb);
    float a[3 * 512], c1[3 * 9], c2[3 * 9];
    if (!w) {
        CHECK(!"out of memory");
        return;
    }
    fill_rows(&r, CORE_TTYPE_Q4_1, n, k, rb, w);
    fill_f(&r, a, sizeof a / sizeof a[0]);
    core_qmatmul_nt(CORE_TTYPE_Q4_1, m, n, k, a, k, w, rb, 0.0f, c1, n);
    CHECK(core_qmatmul_nt_isa(core_qdot_default_isa(), CORE_TTYPE_Q4_1, m, n, k, a, k, w, rb, 0.0f, c2,
                              n) == 0);
    for (size_t i = 0; i < sizeof c1 / sizeof c1[0]; i++)
        CHECK(same_bits(c1[i], c2[i]));
    free(w);
}

TEST(rejects_bad_arguments)
{
    float a[64] = {0}, c[4] = {0};
    unsigned char w[64] = {0};
    CHECK_INT_EQ(
        core_qmatmul_nt_isa(CORE_QDOT_GENERIC, CORE_TTYPE_F32, 1, 1, 32, a, 32, w, 32, 0.0f, c, 1),
        CORE_EINVAL);
    CHECK_INT_EQ(
        core_qmatmul_nt_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q4_1, 1, 1, 48, a, 48, w, 30, 0.0f, c, 1),
        CORE_EINVAL);
    CHECK_INT_EQ(core_qmatmul_nt_isa((core_qdot_isa_t)7, CORE_TTYPE_Q4_1, 1, 1, 32, a, 32, w, 20,
                                     0.0f, c, 1),
                 CORE_EUNSUPPORTED);
    CHECK(core_qdot_has_fast_kernel(CORE_TTYPE_Q4_1));
    CHECK(core_qdot_has_fast_kernel(CORE_TTYPE_F16));
    CHECK(core_qdot_has_fast_kernel(CORE_TTYPE_BF16));
    CHECK(!core_qdot_has_fast_kernel(CORE_TTYPE_Q6_K));
}

int main(void)
{
    RUN(every_supported_type_has_test_data);
    RUN(matches_reference_all_types_shapes);
    RUN(dequantized_values_bit_identical);
    RUN(dequant_entry_equals_core_dequantize);
    RUN(half_types_odd_shapes);
    RUN(half_dequant_every_bit_pattern);
    RUN(default_entry_equals_default_isa);
    RUN(rejects_bad_arguments);
    return CHECK_DONE();
}
