/* Tests for the integer path of core/qdot (core_q8_*): activation
 * quantization, and every weight type x every ISA this CPU runs against the
 * scalar reference kernel (CORE_QDOT_GENERIC), plus the pool runner.
 *
 * What is checked (the contract in core/kernels/qdot.h):
 *  - quantization: every ISA writes the same bytes; x - d q within d / 2
 *    (plus float rounding); s = sum q; zero padding past k (k = 1..100);
 *  - integer sums exactly: with power-of-two scales (weights d_w = 2^-4 and
 *    offsets multiples of 2^-4, activations multiples of 2^-3 with a 127 *
 *    2^-3 in every block, so d_a = 2^-3) every float operation of every
 *    kernel is exact, so each ISA must equal the reference bit for bit, and
 *    the reference must equal the exact sum computed here in double: a wrong
 *    nibble, sign or lane moves the result by at least 2^-7;
 *  - random data: every output within gamma(nb + 8) * S8 of the exact E
 *    (double sums of the block integers), and E within sum_i |y_i| (d_a / 2
 *    + 4u |x_i|) of core_dot_ref on the unquantized activations;
 *  - shapes m = 1..17, n = 1..33, odd and even block counts, strided C,
 *    beta 0 (NaN in C ignored) and 1; padding columns of C untouched;
 *  - sub-ranges [j0, j1), each activation row alone, and the pool runner at
 *    1..4 threads give the same bits as one full call.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/kernels/pool.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/unit/check.h"
#include "tests/unit/qdot_check.h"

static const int types[] = {CORE_TTYPE_Q4_0, CORE_TTYPE_Q4_1, CORE_TTYPE_Q5_0, CORE_TTYPE_Q5_1,
                            CORE_TTYPE_Q8_0, CORE_TTYPE_Q4_K, CORE_TTYPE_Q5_K, CORE_TTYPE_Q6_K};
enum { N_TYPES = 8 };

/* k for a test that wants about k values: a multiple of the type's block */
static int64_t k_for(int type, int64_t k)
{
    const int64_t b = core_ttype_block_elems(type);
    return k % b == 0 ? k : (k / b + 1) * b;
}

static float get_half(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return core_fp16_to_fp32(h);
}

/* n rows of k values; exact != 0: power-of-two scales (see the top; the
 * K-quants' sub-block scales and mins at most 3 in magnitude there, Q6_K's
 * int8 scales in [-2, 2], to stay within 2^24). */
static void fill_w(core_rng_t *r, int type, int64_t n, int64_t k, size_t row_bytes,
                   unsigned char *w, int exact)
{
    const size_t bb = core_ttype_block_bytes(type);
    const int q6 = type == CORE_TTYPE_Q6_K;
    for (size_t i = 0; i < (size_t)n * row_bytes; i++)
        w[i] = (unsigned char)core_rng_u64(r);
    for (int64_t j = 0; j < n; j++)
        for (int64_t b = 0; b < k / core_ttype_block_elems(type); b++) {
            unsigned char *blk = w + (size_t)j * row_bytes + (size_t)b * bb;
            put_half(blk + (q6 ? 208 : 0), exact ? 0.0625f : (float)(core_rng_normal(r) * 0.05));
            if (type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q5_1)
                put_half(blk + 2, exact ? 0.0625f * (float)((int)(core_rng_u64(r) % 33) - 16)
                                        : (float)(core_rng_normal(r) * 0.05));
            if (type == CORE_TTYPE_Q4_K || type == CORE_TTYPE_Q5_K) {
                put_half(blk + 2, exact ? 0.0625f : (float)(core_rng_normal(r) * 0.01));
                for (int e = 0; e < 12 && exact; e++)
                    blk[4 + e] &= e < 8 ? 0x03 : 0x33;
            }
            for (int e = 0; e < 16 && q6 && exact; e++)
                blk[192 + e] = (unsigned char)(int8_t)((int)(core_rng_u64(r) % 5) - 2);
        }
}

/* [m][lda] activations; exact: multiples of 1/8 with a +-127/8 per block. */
static void fill_a(core_rng_t *r, float *a, int64_t m, int64_t k, int64_t lda, int exact)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t e = 0; e < lda; e++) {
            float v;
            if (!exact)
                v = (float)core_rng_normal(r);
            else if (e % 32 == (i + e / 32) % 32)
                v = (core_rng_u64(r) & 1) ? 127.0f / 8 : -127.0f / 8;
            else
                v = (float)((int)(core_rng_u64(r) % 255) - 127) / 8;
            a[i * lda + e] = e < k ? v : NAN; /* NaN past k: must never be read */
        }
}

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

/* Block b (of 32 values) of a weight row: scale d_w, offset m_w and the 32
 * integer weights u (nibbles 0..15, 0..31 for Q5, int8, or for Q6_K the
 * 6-bit quant minus 32 times its 16 values' int8 scale), as the kernels see
 * them. Written from core/tensor.c's dequantizers, independently of the
 * kernels; E below is checked against core_dot_ref too. */
static void block_parts(int type, const unsigned char *row, int64_t b, float *dw, float *mw,
                        int *u)
{
    const int sub = (int)(b % 8);  /* block in its super-block */
    if (type == CORE_TTYPE_Q6_K) { /* ql[128] qh[64] scales[16] d */
        const unsigned char *sb = row + (size_t)(b / 8) * 210;
        const int half = sub / 4, quarter = sub % 4; /* 128-value half, 32-value quarter */
        for (int e = 0; e < 32; e++) {
            const unsigned char l = sb[64 * half + 32 * (quarter & 1) + e];
            const int lo = (quarter < 2 ? l : l >> 4) & 0x0f;
            const int hi = (sb[128 + 32 * half + e] >> (2 * quarter)) & 3;
            const int sc = (int8_t)sb[192 + 8 * half + 2 * quarter + e / 16];
            u[e] = sc * ((lo | hi << 4) - 32);
        }
        *dw = get_half(sb + 208);
        *mw = 0.0f;
        return;
    }
    if (type == CORE_TTYPE_Q4_K || type == CORE_TTYPE_Q5_K) {
        const int q5 = type == CORE_TTYPE_Q5_K;
        const unsigned char *sb = row + (size_t)(b / 8) * (q5 ? 176 : 144);
        const unsigned char *qs = sb + (q5 ? 48 : 16) + 32 * (sub / 2);
        int sc, mn;
        k_scale_min(sub, sb + 4, &sc, &mn);
        *dw = get_half(sb) * (float)sc;
        *mw = -(get_half(sb + 2) * (float)mn);
        for (int e = 0; e < 32; e++)
            u[e] =
                ((sub % 2 ? qs[e] >> 4 : qs[e]) & 0x0f) | (q5 ? ((sb[16 + e] >> sub) & 1) << 4 : 0);
        return;
    }
    const unsigned char *blk = row + (size_t)b * core_ttype_block_bytes(type);
    *dw = get_half(blk);
    if (type == CORE_TTYPE_Q8_0) {
        for (int i = 0; i < 32; i++)
            u[i] = (int8_t)blk[2 + i];
        *mw = 0.0f;
        return;
    }
    const int q5 = type == CORE_TTYPE_Q5_0 || type == CORE_TTYPE_Q5_1;
    const int off = type == CORE_TTYPE_Q4_1 || type == CORE_TTYPE_Q5_1;
    const unsigned char *qs = blk + (off ? 4 : 2) + (q5 ? 4 : 0);
    uint32_t qh = 0;
    if (q5)
        memcpy(&qh, blk + (off ? 4 : 2), sizeof qh);
    for (int i = 0; i < 16; i++) {
        u[i] = (qs[i] & 0x0f) | (int)(((qh >> i) & 1u) << 4);
        u[i + 16] = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1u) << 4);
    }
    *mw = off ? get_half(blk + 2) : (type == CORE_TTYPE_Q5_0 ? -16.0f : -8.0f) * *dw;
}

/* E (exact up to double rounding) and S8 for one row pair. */
static void exact_dot(int type, const unsigned char *row, const core_q8_act_t *qa, int64_t i,
                      double *e, double *s8)
{
    *e = 0;
    *s8 = 0;
    for (int64_t b = 0; b < qa->nb; b++) {
        float dw, mw;
        int u[32];
        block_parts(type, row, b, &dw, &mw, u);
        const int8_t *q = qa->q + (i * qa->nb + b) * 32;
        int64_t isum = 0, iabs = 0;
        for (int t = 0; t < 32; t++) {
            isum += (int64_t)u[t] * q[t];
            iabs += llabs((int64_t)u[t] * q[t]);
        }
        const double da = qa->d[i * qa->nb + b];
        const double t1 = (double)dw * da * (double)isum;
        const double t2 = (double)mw * qa->ds[i * qa->nb + b];
        *e += t1 + t2;
        *s8 += fabs((double)dw * da) * (double)iabs + fabs(t2);
    }
}

typedef struct buf {
    unsigned char *w;
    float *a, *c0, *c, *cg, *y;
    void *qbuf;
} buf_t;

static void buf_free(buf_t *b)
{
    free(b->w);
    free(b->a);
    free(b->c0);
    free(b->c);
    free(b->cg);
    free(b->y);
    free(b->qbuf);
}

/* One product under every ISA against the reference and the exact sums. */
static void check_case(core_rng_t *r, int type, int64_t m, int64_t n, int64_t k, float beta,
                       int exact)
{
    size_t rb = 0;
    CHECK(core_ttype_row_bytes(type, k, &rb) == 0);
    rb += (size_t)(n % 3); /* some padding between rows */
    const int64_t lda = k + 5, ldc = n + 3;
    buf_t B = {0};
    B.w = malloc((size_t)n * rb + 1);
    B.a = malloc((size_t)(m * lda) * sizeof(float));
    B.c0 = malloc((size_t)(m * ldc) * sizeof(float));
    B.c = malloc((size_t)(m * ldc) * sizeof(float));
    B.cg = malloc((size_t)(m * ldc) * sizeof(float));
    B.y = malloc((size_t)k * sizeof(float));
    B.qbuf = malloc(core_q8_act_bytes(m, k));
    if (!B.w || !B.a || !B.c0 || !B.c || !B.cg || !B.y || !B.qbuf) {
        CHECK(!"out of memory");
        buf_free(&B);
        return;
    }
    fill_w(r, type, n, k, rb, B.w, exact);
    fill_a(r, B.a, m, k, lda, exact);
    for (int64_t i = 0; i < m * ldc; i++)
        B.c0[i] = beta == 0.0f ? NAN : (float)core_rng_normal(r);
    core_q8_act_t qa;
    core_q8_act_init(&qa, B.qbuf, m, k);
    core_q8_quantize(&qa, B.a, lda);

    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    /* the last passes, s == ni: the packed kernel, where this CPU runs it;
     * s == ni + 1: the packed kernel on AMX tiles for every m, where the CPU
     * and OS run them, which must give the VNNI kernel's bits (kept in pv) */
    void *pk = NULL;
    float *pv = NULL;
    if (core_q8_pack_supported(type) &&
        (pk = aligned_alloc(64, (core_q8_pack_bytes(type, n, k) + 63) / 64 * 64)))
        core_q8_pack(type, B.w, rb, n, k, pk);
    const int passes = ni + (pk != NULL) + (pk != NULL && core_q8_amx_available());
    if (passes > ni + 1 && !(pv = malloc((size_t)(m * ldc) * sizeof *pv))) {
        CHECK(!"out of memory");
        free(pk);
        buf_free(&B);
        return;
    }
    int bad = 0;
    for (int s = 0; s < passes && !bad; s++) {
        float *out = s == 0 ? B.cg : B.c;
        memcpy(out, B.c0, (size_t)(m * ldc) * sizeof(float));
        if (s < ni) {
            CHECK_INT_EQ(core_q8_matmul_isa(isas[s], type, &qa, 0, n, B.w, rb, beta, out, ldc), 0);
        } else {
            CHECK_INT_EQ(core_q8_force_amx(s == ni ? CORE_Q8_AMX_OFF : CORE_Q8_AMX_ON), 0);
            CHECK_INT_EQ(core_q8_matmul_packed(type, &qa, 0, n, pk, beta, out, ldc), 0);
            CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
            if (s == ni && pv)
                memcpy(pv, out, (size_t)(m * ldc) * sizeof *pv);
            for (int64_t i = 0; s > ni && i < m * ldc && !bad; i++)
                if (!same_bits(out[i], pv[i])) {
                    bad = 1;
                    CHECK_MSG(0, "%s amx m=%lld n=%lld k=%lld [%lld][%lld]: %.9g vs vnni %.9g",
                              core_ttype_name(type), (long long)m, (long long)n, (long long)k,
                              (long long)(i / ldc), (long long)(i % ldc), (double)out[i],
                              (double)pv[i]);
                }
        }
        const char *vname = s < ni ? core_qdot_isa_name(isas[s]) : s == ni ? "packed" : "amx";
        for (int64_t j = 0; j < n && !bad; j++) {
            const unsigned char *row = B.w + (size_t)j * rb;
            CHECK(core_dequantize(type, row, B.y, k, NULL) == 0);
            for (int64_t i = 0; i < m && !bad; i++) {
                double e, s8;
                exact_dot(type, row, &qa, i, &e, &s8);
                const double cin = beta == 0.0f ? 0.0 : (double)beta * B.c0[i * ldc + j];
                const double got = out[i * ldc + j], u = ldexp(1.0, -24);
                if (exact) {
                    /* every operation exact: the reference is E, and every ISA
                     * is the reference bit for bit */
                    if (s == 0 ? got != (double)(float)(e + cin) : !same_bits(B.cg[i * ldc + j], (float)got)) {
                        bad = 1;
                        CHECK_MSG(0, "%s %s m=%lld n=%lld k=%lld [%lld][%lld]: %.9g vs %.9g",
                                  core_ttype_name(type), vname,
                                  (long long)m, (long long)n, (long long)k, (long long)i,
                                  (long long)j, got, s == 0 ? e + cin : (double)B.cg[i * ldc + j]);
                    }
                    continue;
                }
                const double tol = gamma_n((double)qa.nb + 8) * s8 +
                                   2 * u * (fabs(e) + fabs(cin) + fabs(e + cin)) + 1e-30;
                if (!(fabs(got - (e + cin)) <= tol)) {
                    bad = 1;
                    CHECK_MSG(0, "%s %s m=%lld n=%lld k=%lld [%lld][%lld]: %.9g vs E %.9g (tol %.3g)",
                              core_ttype_name(type), vname, (long long)m,
                              (long long)n, (long long)k, (long long)i, (long long)j, got, e + cin,
                              tol);
                }
                if (s == 0) { /* E against the f32 dot of the unquantized row */
                    const float *x = B.a + i * lda;
                    double qtol = 0;
                    for (int64_t t = 0; t < k; t++)
                        qtol += fabs((double)B.y[t]) *
                                (qa.d[i * qa.nb + t / 32] / 2.0 + 4 * u * fabs((double)x[t]));
                    const double ref = core_dot_ref(type, row, x, k);
                    if (!(fabs(e - ref) <= qtol + 1e-30)) {
                        bad = 1;
                        CHECK_MSG(0, "%s m=%lld k=%lld [%lld][%lld]: E %.9g vs f32 dot %.9g (tol %.3g)",
                                  core_ttype_name(type), (long long)m, (long long)k, (long long)i,
                                  (long long)j, e, ref, qtol);
                    }
                }
            }
        }
        for (int64_t i = 0; i < m; i++) /* padding columns of C untouched */
            for (int64_t j = n; j < ldc; j++)
                CHECK(same_bits(out[i * ldc + j], B.c0[i * ldc + j]));
    }
    free(pk);
    free(pv);
    buf_free(&B);
}

TEST(quantize_every_isa_same_bytes)
{
    core_rng_t r;
    core_rng_seed(&r, 21);
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    for (int64_t k = 1; k <= 100; k += (k < 40 ? 1 : 13)) {
        const int64_t m = 1 + k % 4, lda = k + 2;
        float *a = malloc((size_t)(m * lda) * sizeof *a);
        void *b0 = malloc(core_q8_act_bytes(m, k)), *b1 = malloc(core_q8_act_bytes(m, k));
        if (!a || !b0 || !b1) {
            CHECK(!"out of memory");
            free(a), free(b0), free(b1);
            return;
        }
        for (int64_t i = 0; i < m * lda; i++)
            a[i] = (float)(core_rng_normal(&r) * (i % 7 == 0 ? 100.0 : 1.0));
        for (int64_t e = 0; e < k && e < 32; e++)
            a[e] = 0.0f; /* an all-zero first block in row 0 (when k <= 32) */
        if (k > 5 && m > 1)
            a[lda + 3] = 2.5f * (float)((a[lda + 3] > 0) - (a[lda + 3] < 0)); /* ties */
        core_q8_act_t q0, q1;
        core_q8_act_init(&q0, b0, m, k);
        CHECK_INT_EQ(core_q8_quantize_isa(CORE_QDOT_GENERIC, &q0, a, lda), 0);
        CHECK_INT_EQ(q0.nb, (k + 31) / 32);
        for (int64_t i = 0; i < m; i++)
            for (int64_t b = 0; b < q0.nb; b++) {
                const float d = q0.d[i * q0.nb + b];
                int32_t s = 0;
                for (int t = 0; t < 32; t++) {
                    const int64_t e = b * 32 + t;
                    const int qv = q0.q[(i * q0.nb + b) * 32 + t];
                    s += qv;
                    CHECK(qv >= -127 && qv <= 127);
                    if (e >= k) {
                        CHECK(qv == 0);
                        continue;
                    }
                    const double x = a[i * lda + e];
                    CHECK_MSG(fabs(x - (double)d * qv) <= d / 2 + 4 * ldexp(fabs(x), -24) + 1e-30,
                              "k=%lld [%lld][%lld]: %g vs %g * %d", (long long)k, (long long)i,
                              (long long)e, x, (double)d, qv);
                }
                CHECK_INT_EQ(s, q0.s[i * q0.nb + b]);
                CHECK(same_bits(q0.ds[i * q0.nb + b], d * (float)s));
            }
        for (int s = 1; s < ni; s++) {
            memset(b1, 0x5a, core_q8_act_bytes(m, k));
            core_q8_act_init(&q1, b1, m, k);
            CHECK_INT_EQ(core_q8_quantize_isa(isas[s], &q1, a, lda), 0);
            const size_t used = (size_t)(m * q0.nb) * (32 + 4 + 4 + 4);
            CHECK_MSG(memcmp(b0, b1, used) == 0, "k=%lld isa %s", (long long)k,
                      core_qdot_isa_name(isas[s]));
        }
        free(a);
        free(b0);
        free(b1);
    }
}

TEST(integer_sums_exact_every_isa)
{
    core_rng_t r;
    core_rng_seed(&r, 22);
    for (int t = 0; t < N_TYPES; t++)
        for (int64_t m = 1; m <= 17; m++) {
            const int64_t n = 1 + (m * 5) % 33, k = k_for(types[t], 32 * (1 + (m * 7) % 48));
            check_case(&r, types[t], m, n, k, m % 3 == 0 ? 1.0f : 0.0f, 1);
        }
}

TEST(random_within_bound_every_isa)
{
    core_rng_t r;
    core_rng_seed(&r, 23);
    const int64_t ks[] = {32, 64, 96, 576, 1536};
    for (int t = 0; t < N_TYPES; t++) {
        for (int64_t m = 1; m <= 17; m++)
            check_case(&r, types[t], m, 1 + (m * 11) % 33, k_for(types[t], ks[m % 5]),
                       m % 2 ? 1.0f : 0.0f, 0);
        for (int64_t n = 1; n <= 33; n++)
            check_case(&r, types[t], 1 + n % 3, n, k_for(types[t], ks[n % 5]), 0.0f, 0);
        check_case(&r, types[t], 3, 5, k_for(types[t], 64), -0.5f, 0);
        check_case(&r, types[t], 2, 0, k_for(types[t], 32), 0.0f, 0); /* empty product */
    }
}

/* Sub-ranges and the pool give the bits of one full call. */
/* The packed kernel: sub-ranges that cut groups of 16 rows, each activation
 * row alone, and jobs on 1..4 threads with a second job starting at a group
 * give the bits of one full call. */
static void check_packed_ranges(int type, const core_q8_act_t *qa, const float *a,
                                const unsigned char *w, size_t rb, int64_t n, int64_t k,
                                core_pool_t **pools, float *full, float *part)
{
    const int64_t m = qa->m, ldc = n, n1 = 5 * CORE_Q8_PACK_ROWS;
    const size_t pb = core_q8_pack_bytes(type, n, k);
    unsigned char *pk = aligned_alloc(64, (pb + 63) / 64 * 64);
    void *onebuf = malloc(core_q8_act_bytes(1, k));
    if (!pk || !onebuf) {
        CHECK(!"out of memory");
        free(pk);
        free(onebuf);
        return;
    }
    core_q8_pack(type, w, rb, n, k, pk);
    CHECK_INT_EQ(core_q8_matmul_packed(type, qa, 0, n, pk, 0.0f, full, ldc), 0);
    for (int64_t j0 = 0; j0 < n; j0 += 37)
        CHECK_INT_EQ(core_q8_matmul_packed(type, qa, j0, j0 + 37 < n ? j0 + 37 : n, pk, 0.0f, part,
                                           ldc),
                     0);
    int bad = 0;
    for (int64_t i = 0; i < m * ldc; i++)
        bad |= !same_bits(full[i], part[i]);
    CHECK_MSG(!bad, "%s packed: ranges of 37 rows differ from one call", core_ttype_name(type));
    memset(part, 0, (size_t)(m * ldc) * sizeof *part);
    for (int64_t i = 0; i < m; i++) {
        core_q8_act_t one;
        core_q8_act_init(&one, onebuf, 1, k);
        core_q8_quantize(&one, a + i * k, k);
        CHECK_INT_EQ(core_q8_matmul_packed(type, &one, 0, n, pk, 0.0f, part + i * ldc, ldc), 0);
    }
    bad = 0;
    for (int64_t i = 0; i < m * ldc; i++)
        bad |= !same_bits(full[i], part[i]);
    CHECK_MSG(!bad, "%s packed: rows alone differ from the batch", core_ttype_name(type));
    const size_t gstride = core_q8_pack_bytes(type, CORE_Q8_PACK_ROWS, k);
    const core_qdot_job_t jobs[2] = {
        {.type = type, .w = w, .pk = pk, .row_bytes = rb, .n = n1, .qa = qa, .c = part,
         .ldc = ldc},
        {.type = type, .w = w + n1 * rb, .pk = pk + (size_t)(n1 / CORE_Q8_PACK_ROWS) * gstride,
         .row_bytes = rb, .n = n - n1, .qa = qa, .c = part + n1, .ldc = ldc},
    };
    for (int p = 0; p < 4; p++) {
        memset(part, 0, (size_t)(m * ldc) * sizeof *part);
        core_qdot_run_jobs(pools[p], jobs, 2);
        bad = 0;
        for (int64_t i = 0; i < m * ldc; i++)
            bad |= !same_bits(full[i], part[i]);
        CHECK_MSG(!bad, "%s packed jobs on %d threads", core_ttype_name(type), p + 1);
    }
    /* the f32 rows' kernel on the same packed weights (prompts): column
     * ranges starting at groups of 16 (ending anywhere), each row alone, and
     * m rows split in two calls give the bits of one full call */
    float *f32full = malloc((size_t)(m * ldc) * sizeof *f32full);
    float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
    if (!f32full || !panel) {
        CHECK(!"out of memory");
    } else {
        CHECK_INT_EQ(core_qmatmul_packed(type, m, 0, n, k, a, k, pk, panel, 0.0f, f32full, ldc),
                     0);
        memset(part, 0, (size_t)(m * ldc) * sizeof *part);
        for (int64_t j0 = 0; j0 < n; j0 += 48)
            CHECK_INT_EQ(core_qmatmul_packed(type, m, j0, j0 + 37 < n ? j0 + 37 : n, k, a, k, pk,
                                             panel, 0.0f, part, ldc) |
                             (j0 + 37 < n ? core_qmatmul_packed(type, m, j0 + 32,
                                                                j0 + 48 < n ? j0 + 48 : n, k, a, k,
                                                                pk, panel, 0.0f, part, ldc)
                                          : 0),
                         0);
        bad = 0;
        for (int64_t i = 0; i < m * ldc; i++)
            bad |= !same_bits(f32full[i], part[i]);
        CHECK_MSG(!bad, "%s packed f32: column ranges differ", core_ttype_name(type));
        memset(part, 0, (size_t)(m * ldc) * sizeof *part);
        for (int64_t i = 0; i < m; i++)
            CHECK_INT_EQ(core_qmatmul_packed(type, 1, 0, n, k, a + i * k, k, pk, panel, 0.0f,
                                             part + i * ldc, ldc),
                         0);
        bad = 0;
        for (int64_t i = 0; i < m * ldc; i++)
            bad |= !same_bits(f32full[i], part[i]);
        CHECK_MSG(!bad, "%s packed f32: rows alone differ", core_ttype_name(type));
        CHECK_INT_EQ(core_qmatmul_packed(type, 1, 8, n, k, a, k, pk, panel, 0.0f, part, ldc),
                     CORE_EINVAL); /* j0 inside a group */
        CHECK_INT_EQ(core_qmatmul_packed(type, 1, 0, n, k, a, k, pk, panel + 1, 0.0f, part, ldc),
                     CORE_EINVAL); /* a misaligned panel */
    }
    free(panel);
    free(f32full);
    free(pk);
    free(onebuf);
}

TEST(ranges_and_pool_bit_exact)
{
    core_rng_t r;
    core_rng_seed(&r, 24);
    const int64_t m = 5, n = 203, k = 768, ldc = n; /* a multiple of every block */
    core_pool_t *pools[4] = {NULL};
    for (int p = 0; p < 4; p++)
        CHECK_INT_EQ(core_pool_new(p + 1, &pools[p], NULL), 0);
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    float *a = malloc((size_t)(m * k) * sizeof *a);
    float *full = malloc((size_t)(m * ldc) * sizeof *full);
    float *part = malloc((size_t)(m * ldc) * sizeof *part);
    float *f32full = malloc((size_t)(m * ldc) * sizeof *f32full);
    float *f32part = malloc((size_t)(m * ldc) * sizeof *f32part);
    unsigned char *w = malloc((size_t)n * (size_t)(k / 32) * 34); /* the largest row */
    void *qb = malloc(core_q8_act_bytes(m, k)), *onebuf = malloc(core_q8_act_bytes(1, k));
    if (!a || !full || !part || !f32full || !f32part || !w || !qb || !onebuf) {
        CHECK(!"out of memory");
        goto out;
    }
    fill_a(&r, a, m, k, k, 0);
    core_q8_act_t qa;
    core_q8_act_init(&qa, qb, m, k);
    core_q8_quantize(&qa, a, k);
    for (int t = 0; t < N_TYPES; t++) {
        size_t rb = 0;
        CHECK(core_ttype_row_bytes(types[t], k, &rb) == 0);
        fill_w(&r, types[t], n, k, rb, w, 0);
        for (int s = 0; s < ni; s++) {
            CHECK_INT_EQ(core_qdot_force_isa(isas[s]), 0);
            core_q8_matmul(types[t], &qa, 0, n, w, rb, 0.0f, full, ldc);
            core_qmatmul_nt(types[t], m, n, k, a, k, w, rb, 0.0f, f32full, ldc);
            for (int64_t j0 = 0; j0 < n; j0 += 37)
                core_q8_matmul(types[t], &qa, j0, j0 + 37 < n ? j0 + 37 : n, w, rb, 0.0f, part,
                               ldc);
            for (int64_t i = 0; i < m * ldc; i++)
                CHECK(same_bits(full[i], part[i]));
            /* each activation row alone (a decode row outside a batch) */
            memset(part, 0, (size_t)(m * ldc) * sizeof *part);
            for (int64_t i = 0; i < m; i++) {
                core_q8_act_t one;
                core_q8_act_init(&one, onebuf, 1, k);
                core_q8_quantize(&one, a + i * k, k);
                core_q8_matmul(types[t], &one, 0, n, w, rb, 0.0f, part + i * ldc, ldc);
            }
            for (int64_t i = 0; i < m * ldc; i++)
                CHECK(same_bits(full[i], part[i]));
            for (int p = 0; p < 4; p++) {
                /* the rows split over two jobs, one integer and one f32 */
                const int64_t n1 = 77;
                const core_qdot_job_t jobs[3] = {
                    {.type = types[t], .w = w, .row_bytes = rb, .n = n1, .qa = &qa, .c = part,
                     .ldc = ldc},
                    {.type = types[t], .w = w + n1 * rb, .row_bytes = rb, .n = n - n1, .qa = &qa,
                     .c = part + n1, .ldc = ldc},
                    {.type = types[t], .w = w, .row_bytes = rb, .n = n, .a = a, .m = m, .k = k,
                     .lda = k, .c = f32part, .ldc = ldc},
                };
                memset(part, 0, (size_t)(m * ldc) * sizeof *part);
                memset(f32part, 0, (size_t)(m * ldc) * sizeof *f32part);
                core_qdot_run_jobs(pools[p], jobs, 3);
                int bad = 0;
                for (int64_t i = 0; i < m * ldc; i++)
                    bad |= !same_bits(full[i], part[i]) || !same_bits(f32full[i], f32part[i]);
                CHECK_MSG(!bad, "%s %s on %d threads", core_ttype_name(types[t]),
                          core_qdot_isa_name(isas[s]), p + 1);
            }
        }
        CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
        /* the packed kernel on the vector units, then (where they run) on
         * AMX tiles for every row count */
        for (int amx = 0; amx < 1 + core_q8_amx_available(); amx++) {
            CHECK_INT_EQ(core_q8_force_amx(amx ? CORE_Q8_AMX_ON : CORE_Q8_AMX_OFF), 0);
            if (core_q8_pack_supported(types[t]))
                check_packed_ranges(types[t], &qa, a, w, rb, n, k, pools, full, part);
        }
        CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
    }
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
out:
    for (int p = 0; p < 4; p++)
        core_pool_free(pools[p]);
    free(a);
    free(full);
    free(part);
    free(f32full);
    free(f32part);
    free(w);
    free(qb);
    free(onebuf);
}

TEST(force_isa_and_bad_arguments)
{
    CHECK(core_q8_supported(CORE_TTYPE_Q4_0));
    CHECK(core_q8_supported(CORE_TTYPE_Q4_1));
    CHECK(core_q8_supported(CORE_TTYPE_Q8_0));
    CHECK(core_q8_supported(CORE_TTYPE_Q5_0));
    CHECK(core_q8_supported(CORE_TTYPE_Q5_1));
    CHECK(core_q8_supported(CORE_TTYPE_Q4_K));
    CHECK(core_q8_supported(CORE_TTYPE_Q5_K));
    CHECK(core_q8_supported(CORE_TTYPE_Q6_K));
    CHECK(!core_q8_supported(CORE_TTYPE_Q3_K));
    CHECK(!core_q8_supported(CORE_TTYPE_F16));
    CHECK(!core_q8_supported(CORE_TTYPE_F32));
    CHECK(core_qdot_isa() == core_qdot_default_isa());
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_GENERIC), 0);
    CHECK(core_qdot_isa() == CORE_QDOT_GENERIC);
    CHECK_INT_EQ(core_qdot_force_isa((core_qdot_isa_t)-1), CORE_EUNSUPPORTED);
    CHECK(core_qdot_isa() == CORE_QDOT_GENERIC);
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
    CHECK(core_qdot_isa() == core_qdot_default_isa());
    CHECK(core_qdot_isa_name(CORE_QDOT_AVX512VNNI) != NULL);
    CHECK(core_qdot_isa_name(CORE_QDOT_ISA_COUNT_) == NULL);

    float a[40] = {0}, c[2] = {0};
    unsigned char buf[256], w[64] = {0};
    core_q8_act_t qa;
    CHECK(core_q8_act_bytes(1, 40) <= sizeof buf);
    CHECK_INT_EQ(core_q8_act_bytes(1, 40) % 64, 0);
    core_q8_act_init(&qa, buf, 1, 40);
    CHECK_INT_EQ(core_q8_quantize_isa(CORE_QDOT_GENERIC, &qa, a, 40), 0);
    /* k = 40 is no multiple of a weight block */
    CHECK_INT_EQ(core_q8_matmul_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q4_1, &qa, 0, 1, w, 20, 0.0f, c, 1),
                 CORE_EINVAL);
    core_q8_act_init(&qa, buf, 1, 32);
    CHECK_INT_EQ(
        core_q8_matmul_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q3_K, &qa, 0, 1, w, 110, 0.0f, c, 1),
        CORE_EINVAL);
    /* k = 32 is no multiple of the K-quants' 256 */
    CHECK_INT_EQ(core_q8_matmul_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q4_K, &qa, 0, 1, w, 144, 0.0f, c, 1),
                 CORE_EINVAL);
    CHECK_INT_EQ(
        core_q8_matmul_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q6_K, &qa, 0, 1, w, 210, 0.0f, c, 1),
        CORE_EINVAL);
    CHECK_INT_EQ(core_q8_matmul_isa(CORE_QDOT_GENERIC, CORE_TTYPE_Q4_1, &qa, 1, 0, w, 20, 0.0f, c, 1),
                 CORE_EINVAL);
    CHECK_INT_EQ(core_q8_matmul_isa((core_qdot_isa_t)9, CORE_TTYPE_Q4_1, &qa, 0, 1, w, 20, 0.0f, c, 1),
                 CORE_EUNSUPPORTED);
    CHECK_INT_EQ(core_q8_quantize_isa((core_qdot_isa_t)9, &qa, a, 32), CORE_EUNSUPPORTED);
}

/* Each ISA is forced exactly where this CPU runs it, and it runs only the
 * paths of its own architecture: the x86 ones never on aarch64 (where they
 * would silently run the reference), nor the NEON ones on x86. With
 * DARKSERVE_EXPECT_BEST_ISA set (make cross-test: the emulated CPU with and
 * without dotprod), the run-time detection must pick that path. */
TEST(isa_paths_per_architecture)
{
    CHECK(core_qdot_isa_runs(CORE_QDOT_GENERIC));
    CHECK(core_qdot_isa_runs(core_qdot_best_isa()));
    CHECK(!core_qdot_isa_runs((core_qdot_isa_t)-1));
    CHECK(!core_qdot_isa_runs(CORE_QDOT_ISA_COUNT_));
    for (int i = 0; i < CORE_QDOT_ISA_COUNT_; i++) {
        const core_qdot_isa_t isa = (core_qdot_isa_t)i;
        CHECK(core_qdot_isa_name(isa) != NULL);
        for (int j = 0; j < i && core_qdot_isa_name(isa); j++)
            CHECK(strcmp(core_qdot_isa_name(isa), core_qdot_isa_name((core_qdot_isa_t)j)) != 0);
        CHECK_INT_EQ(core_qdot_force_isa(isa), core_qdot_isa_runs(isa) ? 0 : CORE_EUNSUPPORTED);
        if (core_qdot_isa_runs(isa))
            CHECK(core_qdot_isa() == isa);
    }
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
#if defined(__aarch64__) && defined(__linux__)
    CHECK(core_qdot_isa_runs(CORE_QDOT_NEON));
    CHECK(!core_qdot_isa_runs(CORE_QDOT_AVX2));
    CHECK(!core_qdot_isa_runs(CORE_QDOT_AVX512VNNI));
    CHECK(core_qdot_isa_runs(CORE_QDOT_NEON_DOTPROD) == core_cpu_has(CORE_CPU_DOTPROD));
#else
    CHECK(!core_qdot_isa_runs(CORE_QDOT_NEON));
    CHECK(!core_qdot_isa_runs(CORE_QDOT_NEON_DOTPROD));
#endif
    const char *want = getenv("DARKSERVE_EXPECT_BEST_ISA");
    if (want && *want)
        CHECK_STR_EQ(core_qdot_isa_name(core_qdot_best_isa()), want);
}

/* The two aarch64 variants form the same lane sums (SMULL pairs added as
 * SDOT adds them), so on random data, where the float work rounds, they
 * give the same bits: every type, several shapes. Runs where the CPU has
 * dotprod (make cross-test's emulated core), a note elsewhere. */
TEST(neon_variants_same_bits)
{
    if (!core_qdot_isa_runs(CORE_QDOT_NEON_DOTPROD)) {
        printf("  note: no NEON dotprod here: the two NEON variants are not compared\n");
        return;
    }
    core_rng_t r;
    core_rng_seed(&r, 29);
    for (int t = 0; t < N_TYPES; t++)
        for (int s = 0; s < 3; s++) {
            const int64_t m = 1 + s * 2, n = 7 + s * 9, k = k_for(types[t], 96 + 480 * s);
            size_t rb = 0;
            CHECK(core_ttype_row_bytes(types[t], k, &rb) == 0);
            unsigned char *w = malloc((size_t)n * rb);
            float *a = malloc((size_t)(m * k) * sizeof *a);
            float *c0 = malloc((size_t)(m * n) * sizeof *c0), *c1 = malloc((size_t)(m * n) * sizeof *c1);
            void *qb = malloc(core_q8_act_bytes(m, k));
            if (!w || !a || !c0 || !c1 || !qb) {
                CHECK(!"out of memory");
            } else {
                fill_w(&r, types[t], n, k, rb, w, 0);
                fill_a(&r, a, m, k, k, 0);
                core_q8_act_t qa;
                core_q8_act_init(&qa, qb, m, k);
                CHECK_INT_EQ(core_q8_quantize_isa(CORE_QDOT_NEON, &qa, a, k), 0);
                CHECK_INT_EQ(core_q8_matmul_isa(CORE_QDOT_NEON, types[t], &qa, 0, n, w, rb, 0.0f,
                                                c0, n), 0);
                CHECK_INT_EQ(core_q8_matmul_isa(CORE_QDOT_NEON_DOTPROD, types[t], &qa, 0, n, w,
                                                rb, 0.0f, c1, n), 0);
                int same = 1;
                for (int64_t i = 0; i < m * n; i++)
                    same &= same_bits(c0[i], c1[i]);
                CHECK_MSG(same, "%s m=%ld n=%ld k=%ld", core_ttype_name(types[t]), (long)m,
                          (long)n, (long)k);
            }
            free(w);
            free(a);
            free(c0);
            free(c1);
            free(qb);
        }
}

/* Who runs a packed product: the VNNI kernel, or AMX tiles from
 * CORE_Q8_AMX_MIN_ROWS rows on where the CPU and OS run them (forced either
 * way for tests); rows too long for the tiles' scratch (more than
 * CORE_Q8_AMX_MAX_BLOCKS blocks) stay on the vector units with the same
 * bits. */
/* DARKSERVE_ISA: the rule (every name against every best path), and this
 * process's own environment honoured (make unit runs these tests once per
 * path the CPU has, each with DARKSERVE_ISA set). */
TEST(env_isa_choice)
{
    char msg[160];
    core_qdot_isa_t isa;
    for (int best = 0; best < CORE_QDOT_ISA_COUNT_; best++) {
        CHECK_INT_EQ(core_qdot_isa_choose(NULL, (core_qdot_isa_t)best, &isa, msg, sizeof msg), 1);
        CHECK(isa == (core_qdot_isa_t)best && msg[0] == '\0');
        CHECK_INT_EQ(core_qdot_isa_choose("", (core_qdot_isa_t)best, &isa, msg, sizeof msg), 1);
        for (int want = 0; want < CORE_QDOT_ISA_COUNT_; want++) {
            const char *name = core_qdot_isa_name((core_qdot_isa_t)want);
            const int rc = core_qdot_isa_choose(name, (core_qdot_isa_t)best, &isa, msg, sizeof msg);
            if (core_qdot_isa_runs_on((core_qdot_isa_t)want, (core_qdot_isa_t)best)) {
                CHECK_INT_EQ(rc, 0);
                CHECK(isa == (core_qdot_isa_t)want);
            } else {
                CHECK_INT_EQ(rc, CORE_EUNSUPPORTED);
                CHECK(isa == (core_qdot_isa_t)best);
                CHECK_MSG(strstr(msg, name) && strstr(msg, "does not run"), "%s", msg);
            }
        }
        CHECK_INT_EQ(core_qdot_isa_choose("AVX2", (core_qdot_isa_t)best, &isa, msg, sizeof msg),
                     CORE_EINVAL);
        CHECK_MSG(strstr(msg, "unknown path") != NULL, "%s", msg);
        CHECK_INT_EQ(core_qdot_isa_choose("avx512", (core_qdot_isa_t)best, &isa, msg, sizeof msg),
                     CORE_EINVAL);
    }
    CHECK_MSG(core_qdot_env_error() == NULL, "%s", core_qdot_env_error());
    const char *env = getenv("DARKSERVE_ISA");
    if (env && *env) {
        CHECK_MSG(!strcmp(core_qdot_isa_name(core_qdot_isa()), env), "DARKSERVE_ISA=%s runs %s",
                  env, core_qdot_isa_name(core_qdot_isa()));
        printf("  DARKSERVE_ISA=%s: the default entries run %s\n", env,
               core_qdot_isa_name(core_qdot_isa()));
    } else {
        CHECK(core_qdot_default_isa() == core_qdot_best_isa());
    }
}

/* The packed kernels on every ISA that packs (AVX2, AVX-512 VNNI on x86;
 * NEON and NEON-dotprod on aarch64; not the generic one) give the same
 * bits: the decode product and the prompt panels, for each packed type, on
 * ranges that cut groups of 16 (and the halves of 8 the AVX2 kernel and the
 * quarters of 4 the NEON one work in), with and without beta. Each ISA's
 * kernel is also checked against the reference (check_case, under
 * DARKSERVE_ISA in make unit); here the paths meet each other. */
TEST(packed_same_bits_every_isa)
{
    static const int ptypes[] = {CORE_TTYPE_Q4_0, CORE_TTYPE_Q4_1, CORE_TTYPE_Q8_0};
    static const int64_t ms[] = {1, 2, 3, 5, 16};
    static const int64_t ranges[][2] = {{0, 45}, {3, 45}, {9, 23}, {16, 24}, {17, 18}};
    const int64_t n = 45, ks[] = {96, 576};
    core_qdot_isa_t isas[CORE_QDOT_ISA_COUNT_];
    const int ni = isa_list(isas);
    core_rng_t r;
    core_rng_seed(&r, 31);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_OFF), 0);
    for (int t = 0; t < 3; t++)
        for (int ki = 0; ki < 2; ki++) {
            const int type = ptypes[t];
            const int64_t k = ks[ki], m = ms[(t + ki) % 5], ldc = n + 2;
            size_t rb = 0;
            CHECK(core_ttype_row_bytes(type, k, &rb) == 0);
            unsigned char *w = malloc((size_t)n * rb);
            float *a = malloc((size_t)(16 * k) * sizeof *a);
            void *qb = malloc(core_q8_act_bytes(16, k));
            unsigned char *pk = aligned_alloc(64, (core_q8_pack_bytes(type, n, k) + 63) / 64 * 64);
            float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
            float *ref = malloc((size_t)(2 * 16 * ldc) * sizeof *ref);
            float *out = malloc((size_t)(2 * 16 * ldc) * sizeof *out);
            float *c0 = malloc((size_t)(16 * ldc) * sizeof *c0);
            if (!w || !a || !qb || !pk || !panel || !ref || !out || !c0) {
                CHECK(!"out of memory");
                goto next;
            }
            fill_w(&r, type, n, k, rb, w, 0);
            for (int64_t i = 0; i < 16 * k; i++)
                a[i] = (float)core_rng_normal(&r);
            for (int64_t i = 0; i < 16 * ldc; i++)
                c0[i] = (float)core_rng_normal(&r);
            core_q8_pack(type, w, rb, n, k, pk);
            core_q8_act_t qa;
            core_q8_act_init(&qa, qb, m, k);
            core_q8_quantize(&qa, a, k);
            for (int s = 0; s < ni; s++) { /* the generic path does not pack */
                CHECK_INT_EQ(core_qdot_force_isa(isas[s]), 0);
                CHECK_INT_EQ(core_q8_pack_supported(type), isas[s] != CORE_QDOT_GENERIC);
            }
            for (int ri = 0; ri < 5; ri++) {
                const int64_t j0 = ranges[ri][0], j1 = ranges[ri][1];
                const float beta = ri % 2 ? 0.5f : 0.0f;
                int first = 1;
                for (int s = 0; s < ni; s++) {
                    if (isas[s] == CORE_QDOT_GENERIC)
                        continue; /* the levels that pack: every other */
                    CHECK_INT_EQ(core_qdot_force_isa(isas[s]), 0);
                    float *o = first ? ref : out;
                    memcpy(o, c0, (size_t)(16 * ldc) * sizeof *o);
                    memcpy(o + 16 * ldc, c0, (size_t)(16 * ldc) * sizeof *o);
                    CHECK_INT_EQ(core_q8_matmul_packed(type, &qa, j0, j1, pk, beta, o, ldc), 0);
                    CHECK_INT_EQ(core_qmatmul_packed(type, m, j0 / 16 * 16, j1, k, a, k, pk, panel,
                                                     beta, o + 16 * ldc, ldc),
                                 0);
                    int bad = 0;
                    for (int64_t i = 0; !first && i < 2 * 16 * ldc && !bad; i++)
                        if (!same_bits(o[i], ref[i])) {
                            bad = 1;
                            CHECK_MSG(0, "%s %s k=%lld m=%lld [%lld, %lld) %s [%lld][%lld]: %.9g vs %.9g",
                                      core_ttype_name(type), core_qdot_isa_name(isas[s]),
                                      (long long)k, (long long)m, (long long)j0, (long long)j1,
                                      i < 16 * ldc ? "decode" : "panels",
                                      (long long)(i % (16 * ldc) / ldc), (long long)(i % ldc),
                                      (double)o[i], (double)ref[i]);
                        }
                    first = 0;
                }
            }
        next:
            free(w);
            free(a);
            free(qb);
            free(pk);
            free(panel);
            free(ref);
            free(out);
            free(c0);
        }
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
    CHECK_INT_EQ(core_qdot_force_isa(CORE_QDOT_ISA_COUNT_), 0);
}

TEST(amx_choice)
{
    const int avail = core_q8_amx_available();
    CHECK_INT_EQ(core_q8_force_amx((core_q8_amx_mode_t)7), CORE_EINVAL);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_ON), avail ? 0 : CORE_EUNSUPPORTED);
    CHECK_INT_EQ(core_q8_amx_used(1), avail);
    CHECK_INT_EQ(core_q8_amx_used(0), 0);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_OFF), 0);
    CHECK_INT_EQ(core_q8_amx_used(1), 0);
    CHECK_INT_EQ(core_q8_amx_used(64), 0);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
    CHECK_INT_EQ(core_q8_amx_used(CORE_Q8_AMX_MIN_ROWS - 1), 0);
    CHECK_INT_EQ(core_q8_amx_used(CORE_Q8_AMX_MIN_ROWS), avail);
    if (!core_q8_pack_supported(CORE_TTYPE_Q8_0))
        return;
    const int64_t m = CORE_Q8_AMX_MIN_ROWS, n = 20, k = 32 * (CORE_Q8_AMX_MAX_BLOCKS + 1);
    size_t rb = 0;
    CHECK(core_ttype_row_bytes(CORE_TTYPE_Q8_0, k, &rb) == 0);
    core_rng_t r;
    core_rng_seed(&r, 12);
    unsigned char *w = malloc((size_t)n * rb);
    float *a = malloc((size_t)(m * k) * sizeof *a), *c0 = malloc((size_t)(m * n) * sizeof *c0),
          *c1 = malloc((size_t)(m * n) * sizeof *c1);
    void *qb = malloc(core_q8_act_bytes(m, k));
    void *pk = aligned_alloc(64, (core_q8_pack_bytes(CORE_TTYPE_Q8_0, n, k) + 63) / 64 * 64);
    if (w && a && c0 && c1 && qb && pk) {
        fill_w(&r, CORE_TTYPE_Q8_0, n, k, rb, w, 0);
        fill_a(&r, a, m, k, k, 0);
        core_q8_pack(CORE_TTYPE_Q8_0, w, rb, n, k, pk);
        core_q8_act_t qa;
        core_q8_act_init(&qa, qb, m, k);
        core_q8_quantize(&qa, a, k);
        CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_OFF), 0);
        CHECK_INT_EQ(core_q8_matmul_packed(CORE_TTYPE_Q8_0, &qa, 0, n, pk, 0.0f, c0, n), 0);
        (void)core_q8_force_amx(CORE_Q8_AMX_ON);
        CHECK_INT_EQ(core_q8_matmul_packed(CORE_TTYPE_Q8_0, &qa, 0, n, pk, 0.0f, c1, n), 0);
        int bad = 0;
        for (int64_t i = 0; i < m * n; i++)
            bad |= !same_bits(c0[i], c1[i]);
        CHECK_MSG(!bad, "rows of %lld blocks differ with the tiles asked for", (long long)(k / 32));
    } else {
        CHECK(!"out of memory");
    }
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
    free(w);
    free(a);
    free(c0);
    free(c1);
    free(qb);
    free(pk);
}

/* The prompt rows on AMX-BF16 tiles (core_qmatmul_packed_amx): within the
 * stated bound of the exact product of the dequantized weights (one dropped
 * or misplaced bf16 part costs ~2^-9 of a term, far past it), a row's bits
 * the same alone, in a batch and in column ranges; bad arguments refused.
 * Skipped, and said, where the CPU lacks the tiles. */
static void check_amx_panels(core_rng_t *r, int type, int64_t m, int64_t n, int64_t k, float beta)
{
    size_t rb = 0;
    CHECK(core_ttype_row_bytes(type, k, &rb) == 0);
    const size_t pb = (core_q8_pack_bytes(type, n, k) + 63) / 64 * 64;
    const size_t sb = (core_q8_amx_split_words(m, k) * sizeof(uint16_t) + 63) / 64 * 64;
    unsigned char *w = malloc((size_t)n * rb), *pk = aligned_alloc(64, pb);
    float *a = malloc((size_t)(m * k) * sizeof *a), *wd = malloc((size_t)(n * k) * sizeof *wd);
    float *c0 = malloc((size_t)(m * n) * sizeof *c0), *c = malloc((size_t)(m * n) * sizeof *c);
    float *part = malloc((size_t)(m * n) * sizeof *part);
    float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
    uint16_t *as = aligned_alloc(64, sb);
    if (!w || !pk || !a || !wd || !c0 || !c || !part || !panel || !as) {
        CHECK(!"out of memory");
        goto out;
    }
    fill_w(r, type, n, k, rb, w, 0);
    fill_a(r, a, m, k, k, 0);
    CHECK(core_dequantize(type, w, wd, n * k, NULL) == 0);
    core_q8_pack(type, w, rb, n, k, pk);
    for (int64_t i = 0; i < m * n; i++)
        c0[i] = c[i] = (float)core_rng_normal(r);
    CHECK_INT_EQ(core_q8_amx_split(a, k, m, k, as), 0);
    CHECK_INT_EQ(core_qmatmul_packed_amx(type, m, 0, n, k, as, pk, panel, beta, c, n), 0);
    const double bound = ldexp(1.0, -15) + (double)k * ldexp(1.0, -24);
    int bad = 0;
    for (int64_t i = 0; i < m && !bad; i++)
        for (int64_t j = 0; j < n && !bad; j++) {
            double ex = beta * (double)c0[i * n + j], mag = 0;
            for (int64_t e = 0; e < k; e++) {
                ex += (double)a[i * k + e] * wd[j * k + e];
                mag += fabs((double)a[i * k + e] * wd[j * k + e]);
            }
            const double err = fabs(c[i * n + j] - ex);
            if (err > bound * mag + ldexp(fabs(beta * (double)c0[i * n + j]), -22) + 1e-30) {
                CHECK_MSG(0, "%s m %lld n %lld k %lld: C[%lld][%lld] off by %.3g (bound %.3g)",
                          core_ttype_name(type), (long long)m, (long long)n, (long long)k,
                          (long long)i, (long long)j, err, bound * mag);
                bad = 1;
            }
        }
    /* each row alone, and column ranges from groups of 16 */
    if (beta == 0.0f) {
        for (int64_t i = 0; i < m; i++)
            CHECK_INT_EQ(core_qmatmul_packed_amx(type, 1, 0, n, k, as + i * 2 * k, pk, panel, 0.0f,
                                                 part + i * n, n),
                         0);
        bad = 0;
        for (int64_t i = 0; i < m * n; i++)
            bad |= !same_bits(c[i], part[i]);
        CHECK_MSG(!bad, "%s amx panels: rows alone differ", core_ttype_name(type));
        for (int64_t j0 = 0; j0 < n; j0 += 48)
            CHECK_INT_EQ(core_qmatmul_packed_amx(type, m, j0, j0 + 48 < n ? j0 + 48 : n, k, as,
                                                 pk, panel, 0.0f, part, n),
                         0);
        bad = 0;
        for (int64_t i = 0; i < m * n; i++)
            bad |= !same_bits(c[i], part[i]);
        CHECK_MSG(!bad, "%s amx panels: column ranges differ", core_ttype_name(type));
    }
out:
    free(w);
    free(pk);
    free(a);
    free(wd);
    free(c0);
    free(c);
    free(part);
    free(panel);
    free(as);
}

TEST(amx_panels_within_bound)
{
    const int avail = core_q8_amx_panels_available();
    CHECK_INT_EQ(core_q8_force_amx_panels((core_q8_amx_mode_t)7), CORE_EINVAL);
    CHECK_INT_EQ(core_q8_force_amx_panels(CORE_Q8_AMX_ON), avail ? 0 : CORE_EUNSUPPORTED);
    CHECK_INT_EQ(core_q8_amx_panels_used(), avail);
    CHECK_INT_EQ(core_q8_force_amx_panels(CORE_Q8_AMX_OFF), 0);
    CHECK_INT_EQ(core_q8_amx_panels_used(), 0);
    CHECK_INT_EQ(core_q8_force_amx_panels(CORE_Q8_AMX_AUTO), 0);
    CHECK_INT_EQ(core_q8_amx_panels_used(), avail);
    if (!avail) {
        printf("  (no AMX-BF16 here: the prompt tiles are not tested)\n");
        float a[32] = {0};
        _Alignas(64) uint16_t as[64];
        CHECK_INT_EQ(core_q8_amx_split(a, 32, 1, 32, as), CORE_EINVAL);
        return;
    }
    core_rng_t r;
    core_rng_seed(&r, 31);
    const int pt[] = {CORE_TTYPE_Q4_0, CORE_TTYPE_Q4_1, CORE_TTYPE_Q8_0};
    const int64_t ms[] = {1, 5, 16, 17, 33}, ns[] = {16, 37, 100, 129}, ks[] = {32, 64, 576, 1536};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++)
            check_amx_panels(&r, pt[t], ms[i], ns[(i + t) % 4], ks[(i + 2 * t) % 4],
                             i == 3 ? 0.5f : i == 4 ? 1.0f : 0.0f); /* 1: the sums start from c */
    /* bad arguments */
    const int64_t k = 64, n = 16;
    size_t rb = 0;
    CHECK(core_ttype_row_bytes(CORE_TTYPE_Q4_1, k, &rb) == 0);
    unsigned char *w = calloc(n, rb), *pk = aligned_alloc(64, core_q8_pack_bytes(CORE_TTYPE_Q4_1, n, k));
    float *a = calloc(2 * k, sizeof *a), *c = calloc(n, sizeof *c);
    float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
    uint16_t *as = aligned_alloc(64, 4 * k * sizeof *as);
    if (w && pk && a && c && panel && as) {
        core_q8_pack(CORE_TTYPE_Q4_1, w, rb, n, k, pk);
        CHECK_INT_EQ(core_q8_amx_split(a, k, 1, k, as), 0);
        CHECK_INT_EQ(core_q8_amx_split(a, k, 1, 48, as), CORE_EINVAL);     /* k not 32s */
        CHECK_INT_EQ(core_q8_amx_split(a, 16, 1, 32, as), CORE_EINVAL);    /* lda < k */
        CHECK_INT_EQ(core_q8_amx_split(a, k, 1, k, as + 1), CORE_EINVAL);  /* misaligned */
        CHECK_INT_EQ(core_qmatmul_packed_amx(CORE_TTYPE_Q4_1, 1, 0, n, k, as, pk, panel, 0.0f, c, n), 0);
        CHECK_INT_EQ(core_qmatmul_packed_amx(CORE_TTYPE_Q4_1, 1, 8, n, k, as, pk, panel, 0.0f, c, n),
                     CORE_EINVAL); /* j0 inside a group */
        CHECK_INT_EQ(core_qmatmul_packed_amx(CORE_TTYPE_Q4_1, 1, 0, n, k, as + 1, pk, panel, 0.0f, c,
                                             n),
                     CORE_EINVAL);
        CHECK_INT_EQ(core_qmatmul_packed_amx(CORE_TTYPE_Q4_1, 1, 0, n, k, as, pk, panel + 1, 0.0f, c,
                                             n),
                     CORE_EINVAL);
        CHECK_INT_EQ(core_qmatmul_packed_amx(CORE_TTYPE_Q5_0, 1, 0, n, k, as, pk, panel, 0.0f, c, n),
                     CORE_EINVAL); /* a type that does not pack */
    } else {
        CHECK(!"out of memory");
    }
    free(w);
    free(pk);
    free(a);
    free(c);
    free(panel);
    free(as);
}

/* A packed copy gives back the original block bytes of any row range
 * (prompt tiles dequantize from it): ranges that start, end and stop inside
 * groups of 16 rows, and the padded last group. Pure C, so checked on every
 * host whether or not it runs the packed kernel. */
TEST(unpack_gives_the_packed_bytes)
{
    const int ptypes[] = {CORE_TTYPE_Q4_0, CORE_TTYPE_Q4_1, CORE_TTYPE_Q8_0};
    const int64_t n = 37, k = 96, ranges[][2] = {{0, 37}, {5, 16}, {16, 1}, {15, 2}, {33, 4}};
    core_rng_t r;
    core_rng_seed(&r, 11);
    for (size_t t = 0; t < sizeof ptypes / sizeof *ptypes; t++) {
        const size_t rb = (size_t)(k / CORE_Q8_BLOCK) * core_ttype_block_bytes(ptypes[t]);
        unsigned char *w = malloc((size_t)n * rb), *back = malloc((size_t)(n + 1) * rb);
        unsigned char *pk = aligned_alloc(64, (core_q8_pack_bytes(ptypes[t], n, k) + 63) / 64 * 64);
        if (!w || !back || !pk) {
            CHECK(!"out of memory");
        } else {
            for (size_t i = 0; i < (size_t)n * rb; i++)
                w[i] = (unsigned char)core_rng_u64(&r);
            core_q8_pack(ptypes[t], w, rb, n, k, pk);
            for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
                memset(back, 0xa5, (size_t)(n + 1) * rb);
                core_q8_unpack(ptypes[t], pk, k, ranges[i][0], ranges[i][1], back);
                CHECK_MSG(!memcmp(back, w + (size_t)ranges[i][0] * rb, (size_t)ranges[i][1] * rb),
                          "%s rows %lld+%lld", core_ttype_name(ptypes[t]), (long long)ranges[i][0],
                          (long long)ranges[i][1]);
                CHECK_MSG(back[(size_t)ranges[i][1] * rb] == 0xa5, "%s wrote past the range",
                          core_ttype_name(ptypes[t]));
            }
        }
        free(w);
        free(back);
        free(pk);
    }
}

int main(void)
{
    printf("  best ISA: %s\n", core_qdot_isa_name(core_qdot_best_isa()));
    RUN(quantize_every_isa_same_bytes);
    RUN(integer_sums_exact_every_isa);
    RUN(random_within_bound_every_isa);
    RUN(ranges_and_pool_bit_exact);
    RUN(force_isa_and_bad_arguments);
    RUN(env_isa_choice);
    RUN(packed_same_bits_every_isa);
    RUN(isa_paths_per_architecture);
    RUN(neon_variants_same_bits);
    RUN(amx_choice);
    RUN(amx_panels_within_bound);
    RUN(unpack_gives_the_packed_bytes);
    return CHECK_DONE();
}
