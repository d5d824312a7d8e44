/* core/kernels/blas.c — the one door to BLAS; nothing else in darkserve includes
 * cblas.h.
 *
 * core_gemm_nt with few rows (m <= CORE_GEMM_SMALL_M, the decode case: one
 * row per decoding sequence) does not go to OpenBLAS: sgemm packs the whole
 * B operand (a weight matrix) on every call, which for one row costs more
 * than the product itself (measured: 76% of decode time in
 * sgemm_incopy). The small-m kernel streams each B row once and dots it with
 * every A row while it is in L1, with AVX2/FMA when the CPU has them.
 * A lower kernel path forced by DARKSERVE_ISA or core_qdot_force_isa
 * (core/kernels/cpu.h) takes that path's small kernels (small_level).
 */
#include "core/kernels/blas.h"

#include "core/kernels/qdot.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CORE_BLAS_X86 1
#endif

typedef void (*nn_fn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                      int64_t, float, float *, int64_t);
static void pick_small(void);
static int small_level(void);
static pthread_once_t small_once = PTHREAD_ONCE_INIT;
static _Atomic int small_generic; /* core_gemm_small_force_generic */
static nn_fn small_tn;            /* core_gemm_tn's rank-1 updates */
static void tn_small_generic(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                             int64_t ldc);

void core_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= CORE_GEMM_SMALL_M) {
        core_gemm_nt_small(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void core_gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= CORE_GEMM_SMALL_M) {
        core_gemm_nn_small(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* C[m][n] = alpha * A[k][m]ᵀ · B[k][n] + beta * C. A few rank-1 updates
 * (k ≤ CORE_GEMM_SMALL_K: a decode step adds one key to the linear state)
 * run here: sgemm's packing costs more than such products. */
void core_gemm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (k <= CORE_GEMM_SMALL_K) {
        /* no AVX2 kernel of its own: below the best, the portable one */
        (small_level() == 0 ? small_tn : tn_small_generic)(m, n, k, alpha, a, lda, b, ldb, beta,
                                                           c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

void core_blas_set_threads(int n)
{
    if (n > 0)
        openblas_set_num_threads(n);
}

int core_blas_threads(void)
{
    return openblas_get_num_threads();
}

const char *core_blas_corename(void)
{
    const char *n = openblas_get_corename();
    return n ? n : "unknown";
}

const char *core_blas_better_coretype(void)
{
    /* OpenBLAS 0.3.21 (Debian bookworm) does not know CPUs newer than it and
     * falls back to its SSE3 "Prescott" kernels, about 4x slower for prefill
     * here (measured on an AVX-512 Xeon). Only a generic fallback is
     * overridden; a core OpenBLAS identified is left alone. */
    static const char *const generic[] = {"prescott", "core2", "nehalem", "katmai", "coppermine",
                                          "northwood", "banias", "unknown"};
    const char *cur = core_blas_corename();
    int is_generic = 0;
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        if (strcasecmp(cur, generic[i]) == 0)
            is_generic = 1;
    if (!is_generic)
        return NULL;
#ifdef CORE_BLAS_X86
    if (core_cpu_has(CORE_CPU_AVX512F | CORE_CPU_AVX512BW | CORE_CPU_AVX512VL | CORE_CPU_AVX512DQ))
        return "SkylakeX";
    if (core_cpu_has(CORE_CPU_AVX2 | CORE_CPU_FMA))
        return "Haswell";
#endif
    return NULL;
}

/* ---- small-m kernel ---- */

static float dot_generic(const float *x, const float *y, int64_t k)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
        s0 += x[i] * y[i];
        s1 += x[i + 1] * y[i + 1];
        s2 += x[i + 2] * y[i + 2];
        s3 += x[i + 3] * y[i + 3];
    }
    for (; i < k; i++)
        s0 += x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}

#ifdef CORE_BLAS_X86
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *x, const float *y, int64_t k)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    for (; i + 8 <= k; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < k; i++)
        r += x[i] * y[i];
    return r;
}
#endif

/* C[m][n0 .. n0 + w) = alpha * sum over k of A[.][k] B[k][.] + beta * C, each
 * element summed in k order (one fused multiply-add per term on AVX2). */
static void axpy_rows_generic(int64_t m, int64_t n0, int64_t w, int64_t k, float alpha,
                              const float *a, int64_t lda, const float *b, int64_t ldb,
                              float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = n0; j < n0 + w; j++) {
            float s = 0.0f;
            for (int64_t t = 0; t < k; t++)
                s += a[i * lda + t] * b[t * ldb + j];
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? alpha * s : alpha * s + beta * *cij;
        }
}

#ifdef CORE_BLAS_X86
#define NN256_FN static inline __attribute__((target("avx2,fma"), always_inline))
/* Eight elements of an 8-bit row (core/kernels/kvrow.h: the row's scale,
 * then its bytes) from column col, each the float product q·d. */
NN256_FN __m256 ld8_q8(const unsigned char *row, int64_t col)
{
    float d;
    memcpy(&d, row, sizeof d);
    const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(row + sizeof d + col));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(d));
}

/* Columns j..j+7 of C = alpha·A·B + beta·C for m <= CORE_GEMM_SMALL_M rows of A: B's eight
 * elements of row t loaded once for all m rows, one accumulator per row.
 * hb 0: B in floats (row t at b + t·ldb floats); hb 2: in 8-bit rows (row t
 * at b + t·ldb bytes). hb is a constant in each caller, so each instance has
 * one kind of load and the same fused multiply-adds in k order. */
NN256_FN void nn8_avx2(int64_t m, int64_t j, int64_t k, float alpha, const float *a, int64_t lda,
                       const void *b, int64_t ldb, int hb, float beta, float *c, int64_t ldc)
{
    __m256 acc[CORE_GEMM_SMALL_M];
    for (int64_t i = 0; i < m; i++)
        acc[i] = _mm256_setzero_ps();
    for (int64_t t = 0; t < k; t++) {
        const __m256 bt = hb ? ld8_q8((const unsigned char *)b + t * ldb, j)
                             : _mm256_loadu_ps((const float *)b + t * ldb + j);
        for (int64_t i = 0; i < m; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i * lda + t), bt, acc[i]);
    }
    for (int64_t i = 0; i < m; i++) {
        __m256 v = _mm256_mul_ps(_mm256_set1_ps(alpha), acc[i]);
        float *ci = c + i * ldc + j;
        if (beta != 0.0f)
            v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(ci), v);
        _mm256_storeu_ps(ci, v);
    }
}

/* Eight columns at a time (nn8_avx2), floats. */
__attribute__((target("avx2,fma"))) static void nn_small_avx2(int64_t m, int64_t n, int64_t k,
                                                             float alpha, const float *a,
                                                             int64_t lda, const float *b,
                                                             int64_t ldb, float beta, float *c,
                                                             int64_t ldc)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        nn8_avx2(m, j, k, alpha, a, lda, b, ldb, 0, beta, c, ldc);
    if (j < n)
        axpy_rows_generic(m, j, n - j, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

#ifdef CORE_BLAS_X86
/* The same on AVX-512 for up to 4 rows of A: 64 columns a pass (four
 * vectors per row, up to 16 accumulators in registers: M is a constant in
 * each instance), a row of B loaded once per pass. Every element is the same
 * chain of fused multiply-adds in k order as in nn_small_avx2. */
#define NN512_FN static inline __attribute__((target("avx512f,avx2,fma"), always_inline))
/* B rows fetched ahead by the AVX-512 small kernels (see nt4_avx512): 32
 * rows of keys (4 KiB of halves, 8 of floats) keep ~64 line fills in
 * flight. A window's keys and values come from memory on every decode step
 * once sixteen sequences' states (~9 MB each) no longer fit in L3; with 8
 * rows ahead the scores ran at the latency of ~16 lines in flight (batch of
 * 16 at context 512: 758 -> 874 and 806 -> 877 tokens/s alternating; one
 * stream unchanged, 310 -> 315). */
enum { NT_PF = 32 };
/* 16 elements of B: floats, halves (hb 1: core/kernels/half.h) or 8-bit
 * rows (hb 2: core/kernels/kvrow.h), converted exactly. row is where a row
 * of B starts (elements for hb 0 and 1; bytes for hb 2, where the row's
 * scale comes first and each element is the float product q·d, as
 * core_kvrow_unpack gives it), col + t the first element's column. The
 * kernels below take hb as a constant, so each instance has one kind of
 * load, and a product's terms are the same fused multiply-adds in the same
 * order whatever B's kind. */
NN512_FN __m512 ld16(const void *b, int64_t row, int64_t col, int hb)
{
    if (hb == 2) {
        const unsigned char *r = (const unsigned char *)b + row;
        float d;
        memcpy(&d, r, sizeof d);
        const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(r + sizeof d + col));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d));
    }
    return hb ? _mm512_cvtph_ps(_mm256_loadu_si256(
                    (const __m256i *)(const void *)((const uint16_t *)b + row + col)))
              : _mm512_loadu_ps((const float *)b + row + col);
}

/* Fetches the cache lines of n elements of the B row at row into L1. */
NN512_FN void pf_row(const void *b, int64_t row, int64_t n, int hb)
{
    const int64_t es = hb == 2 ? 1 : hb ? 2 : 4;
    const char *p = (const char *)b + row * (hb == 2 ? 1 : es);
    for (int64_t at = 0; at < n * es + (hb == 2 ? 4 : 0); at += 64)
        _mm_prefetch(p + at, _MM_HINT_T0);
}

NN512_FN void nn64_avx512(int M, int64_t k, float alpha, const float *a, int64_t lda,
                          const void *b, int64_t col, int hb, int64_t ldb, float beta, float *c,
                          int64_t ldc)
{
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int i = 0; i < M; i++)
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[i][v] = _mm512_setzero_ps();
    for (int64_t t = 0; t < k; t++) {
        const int64_t bt = t * ldb;
        if (t + NT_PF < k) /* as in nt4_avx512: a strided stream of B rows */
            pf_row(b, bt + NT_PF * ldb + (hb == 2 ? 0 : col), 64, hb);
        const __m512 b0 = ld16(b, bt, col, hb), b1 = ld16(b, bt, col + 16, hb);
        const __m512 b2 = ld16(b, bt, col + 32, hb), b3 = ld16(b, bt, col + 48, hb);
        #pragma GCC unroll 4
        for (int i = 0; i < M; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * lda + t]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(ai, b2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(ai, b3, acc[i][3]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < M; i++)
        #pragma GCC unroll 4
        for (int64_t v = 0; v < 4; v++) {
            float *ci = c + i * ldc + 16 * v;
            __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), acc[i][v]);
            if (beta != 0.0f)
                r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(ci), r);
            _mm512_storeu_ps(ci, r);
        }
}

/* One instance per (M, kind of B), as NT4_CASES below. */
#define NN64_CASES(HB, B)                                                                      \
    switch (m) {                                                                               \
    case 1: nn64_avx512(1, k, alpha, a, lda, B, j, HB, ldb, beta, c + j, ldc); break;         \
    case 2: nn64_avx512(2, k, alpha, a, lda, B, j, HB, ldb, beta, c + j, ldc); break;         \
    case 3: nn64_avx512(3, k, alpha, a, lda, B, j, HB, ldb, beta, c + j, ldc); break;         \
    default: nn64_avx512(4, k, alpha, a, lda, B, j, HB, ldb, beta, c + j, ldc); break;        \
    }

__attribute__((target("avx512f,avx2,fma"))) static void nn_small_avx512(int64_t m, int64_t n,
                                                                       int64_t k, float alpha,
                                                                       const float *a, int64_t lda,
                                                                       const float *b, int64_t ldb,
                                                                       float beta, float *c,
                                                                       int64_t ldc)
{
    int64_t j = 0;
    for (; m <= 4 && j + 64 <= n; j += 64)
        NN64_CASES(0, b)
    if (j < n)
        nn_small_avx2(m, n - j, k, alpha, a, lda, b + j, ldb, beta, c + j, ldc);
}

/* core_gemm_nt_small on AVX-512 for up to 4 rows of A and k a multiple of
 * 16 (attention's scores: the query rows of a KV head against its keys):
 * four B rows a pass, each loaded once for all M rows, 4M accumulators of
 * 16 lanes, then one transposing reduction per row gives its four sums in a
 * 128-bit vector (the per-element horizontal sums of a dot product each cost
 * as much as the products themselves at k = 64). Fewer than four B rows
 * left: one at a time, the same lane order. */
NN512_FN __m128 sum4_512(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 t = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    /* each 128-bit lane: [a0, a1, a2, a3] partial sums; add the four lanes */
    const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(t),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
}

NN512_FN void nt4_avx512(int M, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                         const void *b, int hb, int64_t ldb, float beta, float *c, int64_t ldc)
{
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const int64_t b0 = j * ldb, b1 = b0 + ldb, b2 = b1 + ldb, b3 = b2 + ldb;
        /* B rows (attention's keys) are fetched NT_PF rows ahead: a stream
         * the hardware prefetcher follows poorly when rows are strided */
        if (j + NT_PF + 4 <= n)
            for (int r = 0; r < 4; r++)
                pf_row(b, b0 + (NT_PF + r) * ldb, k, hb);
        __m512 acc[4][4];
        #pragma GCC unroll 4
        for (int i = 0; i < M; i++)
            #pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[i][v] = _mm512_setzero_ps();
        for (int64_t t = 0; t < k; t += 16) {
            const __m512 w0 = ld16(b, b0, t, hb), w1 = ld16(b, b1, t, hb);
            const __m512 w2 = ld16(b, b2, t, hb), w3 = ld16(b, b3, t, hb);
            #pragma GCC unroll 4
            for (int i = 0; i < M; i++) {
                const __m512 ai = _mm512_loadu_ps(a + i * lda + t);
                acc[i][0] = _mm512_fmadd_ps(ai, w0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(ai, w1, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(ai, w2, acc[i][2]);
                acc[i][3] = _mm512_fmadd_ps(ai, w3, acc[i][3]);
            }
        }
        #pragma GCC unroll 4
        for (int i = 0; i < M; i++) {
            __m128 r = _mm_mul_ps(_mm_set1_ps(alpha),
                                  sum4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
            float *ci = c + i * ldc + j;
            if (beta != 0.0f)
                r = _mm_fmadd_ps(_mm_set1_ps(beta), _mm_loadu_ps(ci), r);
            _mm_storeu_ps(ci, r);
        }
    }
    for (; j < n; j++) {
        const int64_t bj = j * ldb;
        #pragma GCC unroll 4
        for (int i = 0; i < M; i++) {
            __m512 s = _mm512_setzero_ps();
            for (int64_t t = 0; t < k; t += 16)
                s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i * lda + t), ld16(b, bj, t, hb), s);
            const __m512 z = _mm512_setzero_ps();
            float v = alpha * _mm_cvtss_f32(sum4_512(s, z, z, z));
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? v : v + beta * *cij;
        }
    }
}

/* One instance per (M, kind of B): M and hb are constants in each. */
#define NT4_CASES(HB, B)                                                                       \
    switch (m) {                                                                               \
    case 1: nt4_avx512(1, n, k, alpha, a, lda, B, HB, ldb, beta, c, ldc); break;              \
    case 2: nt4_avx512(2, n, k, alpha, a, lda, B, HB, ldb, beta, c, ldc); break;              \
    case 3: nt4_avx512(3, n, k, alpha, a, lda, B, HB, ldb, beta, c, ldc); break;              \
    default: nt4_avx512(4, n, k, alpha, a, lda, B, HB, ldb, beta, c, ldc); break;             \
    }

__attribute__((target("avx512f,avx2,fma"))) static int nt_small_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
    int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m > 4 || k % 16 != 0)
        return 0;
    NT4_CASES(0, b)
    return 1;
}

__attribute__((target("avx512f,avx2,fma,f16c"))) static int nt_half_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const uint16_t *b,
    int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m > 4 || k % 16 != 0)
        return 0;
    NT4_CASES(1, b)
    return 1;
}

__attribute__((target("avx512f,avx2,fma,f16c"))) static int nn_half_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const uint16_t *b,
    int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m > 4 || n % 64 != 0)
        return 0;
    for (int64_t j = 0; j < n; j += 64)
        NN64_CASES(1, b)
    return 1;
}
__attribute__((target("avx512f,avx2,fma"))) static int nt_q8_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const void *b,
    int64_t rb, float beta, float *c, int64_t ldc)
{
    if (m > 4 || k % 16 != 0)
        return 0;
    const int64_t ldb = rb;
    NT4_CASES(2, b)
    return 1;
}

__attribute__((target("avx512f,avx2,fma"))) static int nn_q8_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const void *b,
    int64_t rb, float beta, float *c, int64_t ldc)
{
    if (m > 4 || n % 64 != 0)
        return 0;
    const int64_t ldb = rb;
    for (int64_t j = 0; j < n; j += 64)
        NN64_CASES(2, b)
    return 1;
}
/* The 8-bit-row products on AVX2 + FMA (an AVX2-only CPU, or the forced
 * AVX2 path): the same operations in the same order as dot_avx2 and
 * nn_small_avx2 on the rows unpacked (an element is the float product q·d,
 * converted exactly), so the bits of core_gemm_nt_small and
 * core_gemm_nn_small at that level; the shapes of the AVX-512 kernels. */
/* dot_avx2(x, the row unpacked, k) for k a multiple of 16 */
__attribute__((target("avx2,fma"))) static float dot_q8_avx2(const float *x,
                                                            const unsigned char *row, int64_t k)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), ld8_q8(row, i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), ld8_q8(row, i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), ld8_q8(row, i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), ld8_q8(row, i + 24), s3);
    }
    for (; i + 8 <= k; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), ld8_q8(row, i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) static int nt_q8_avx2(int64_t m, int64_t n, int64_t k,
                                                         float alpha, const float *a, int64_t lda,
                                                         const void *b, int64_t rb, float beta,
                                                         float *c, int64_t ldc)
{
    if (m > 4 || k % 16 != 0)
        return 0;
    for (int64_t j = 0; j < n; j++) {
        const unsigned char *bj = (const unsigned char *)b + j * rb;
        for (int64_t i = 0; i < m; i++) {
            float v = alpha * dot_q8_avx2(a + i * lda, bj, k);
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? v : v + beta * *cij;
        }
    }
    return 1;
}

__attribute__((target("avx2,fma"))) static int nn_q8_avx2(int64_t m, int64_t n, int64_t k,
                                                         float alpha, const float *a, int64_t lda,
                                                         const void *b, int64_t rb, float beta,
                                                         float *c, int64_t ldc)
{
    if (m > 4 || n % 64 != 0)
        return 0;
    for (int64_t j = 0; j < n; j += 8)
        nn8_avx2(m, j, k, alpha, a, lda, b, rb, 2, beta, c, ldc);
    return 1;
}
#endif /* CORE_BLAS_X86 */

typedef float (*dot_fn)(const float *, const float *, int64_t);
typedef int (*nt_fn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                     int64_t, float, float *, int64_t);

/* core_gemm_tn for small k: row i of C is beta·C_i plus, in t order, the
 * products alpha·A[t][i]·B[t] (a fused multiply-add each on AVX-512). */
static void tn_small_generic(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                             int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++)
            ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
        for (int64_t t = 0; t < k; t++) {
            const float at = alpha * a[t * lda + i];
            const float *bt = b + t * ldb;
            for (int64_t j = 0; j < n; j++)
                ci[j] += at * bt[j];
        }
    }
}

#ifdef CORE_BLAS_X86
__attribute__((target("avx512f,avx2,fma"))) static void tn_small_avx512(
    int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
    int64_t ldb, float beta, float *c, int64_t ldc)
{
    const int64_t n16 = n - n % 16;
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n16; j += 16) {
            __m512 v = beta == 0.0f ? _mm512_setzero_ps()
                                    : _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(ci + j));
            for (int64_t t = 0; t < k; t++)
                v = _mm512_fmadd_ps(_mm512_set1_ps(alpha * a[t * lda + i]),
                                    _mm512_loadu_ps(b + t * ldb + j), v);
            _mm512_storeu_ps(ci + j, v);
        }
        for (int64_t j = n16; j < n; j++) {
            float v = beta == 0.0f ? 0.0f : beta * ci[j];
            for (int64_t t = 0; t < k; t++)
                v += alpha * a[t * lda + i] * b[t * ldb + j];
            ci[j] = v;
        }
    }
}
#endif

static void nn_small_generic(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                             int64_t ldc)
{
    axpy_rows_generic(m, 0, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The small kernels this CPU runs, chosen once (pthread_once: every thread
 * that calls in before it is done waits, none reads a half-written choice). */
static dot_fn small_dot;
static nn_fn small_nn;
static nt_fn small_nt; /* NULL, or a kernel that takes some shapes (returns 1 when it did) */
typedef int (*half_fn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const uint16_t *,
                       int64_t, float, float *, int64_t);
static half_fn half_nt, half_nn; /* likewise, B in halves */
typedef int (*q8_fn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const void *,
                     int64_t, float, float *, int64_t);
static q8_fn q8_nt, q8_nn; /* likewise, B in 8-bit rows */

static void pick_small(void)
{
    small_dot = dot_generic;
    small_nn = nn_small_generic;
    small_tn = tn_small_generic;
#ifdef CORE_BLAS_X86
    if (core_cpu_has(CORE_CPU_AVX2 | CORE_CPU_FMA)) {
        small_dot = dot_avx2;
        small_nn = nn_small_avx2;
        q8_nt = nt_q8_avx2;
        q8_nn = nn_q8_avx2;
        if (core_cpu_has(CORE_CPU_AVX512F)) {
            small_tn = tn_small_avx512;
            small_nn = nn_small_avx512;
            small_nt = nt_small_avx512;
            q8_nt = nt_q8_avx512;
            q8_nn = nn_q8_avx512;
            if (core_qdot_best_isa() >= CORE_QDOT_AVX2) { /* that ISA includes F16C */
                half_nt = nt_half_avx512;
                half_nn = nn_half_avx512;
            }
        }
    }
#endif
}

/* Which small kernels run: 0, pick_small's (the CPU's best); or those of a
 * lower kernel path forced by DARKSERVE_ISA or core_qdot_force_isa
 * (SMALL_AVX2: the AVX2 + FMA kernels, no AVX-512 and no half kernels;
 * SMALL_GENERIC: the portable ones, as core_gemm_small_force_generic), so
 * that a forced path runs what a CPU of its class runs and is tested so. */
enum { SMALL_AVX2 = 1, SMALL_GENERIC = 2 };
static int small_level(void)
{
    pthread_once(&small_once, pick_small);
    if (atomic_load_explicit(&small_generic, memory_order_relaxed))
        return SMALL_GENERIC;
    const core_qdot_isa_t isa = core_qdot_isa();
    if (isa >= core_qdot_best_isa())
        return 0;
#ifdef CORE_BLAS_X86
    return isa >= CORE_QDOT_AVX2 ? SMALL_AVX2 : SMALL_GENERIC;
#else
    return SMALL_GENERIC;
#endif
}

void core_gemm_nn_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m > CORE_GEMM_SMALL_M) { /* the kernels keep one accumulator per row */
        core_gemm_nn_small(CORE_GEMM_SMALL_M, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        core_gemm_nn_small(m - CORE_GEMM_SMALL_M, n, k, alpha, a + CORE_GEMM_SMALL_M * lda, lda,
                           b, ldb, beta, c + CORE_GEMM_SMALL_M * ldc, ldc);
        return;
    }
    const int level = small_level();
    nn_fn nn = level == 0 ? small_nn : nn_small_generic;
#ifdef CORE_BLAS_X86
    if (level == SMALL_AVX2)
        nn = nn_small_avx2;
#endif
    nn(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void core_gemm_small_force_generic(int on)
{
    atomic_store(&small_generic, on != 0);
}

void core_gemm_nt_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    const int level = small_level();
    if (level == 0 && small_nt && small_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        return;
    dot_fn dot = level == 0 ? small_dot : dot_generic;
#ifdef CORE_BLAS_X86
    if (level == SMALL_AVX2)
        dot = dot_avx2;
#endif
    for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * ldb;
        for (int64_t i = 0; i < m; i++) {
            float v = alpha * dot(a + i * lda, bj, k);
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? v : v + beta * *cij;
        }
    }
}

int core_gemm_nt_half_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc)
{
    return small_level() == 0 && half_nt && half_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int core_gemm_nn_half_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                            int64_t ldc)
{
    return small_level() == 0 && half_nn && half_nn(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The 8-bit-row kernel of the level that runs: the CPU's best (AVX-512 or
 * AVX2), the AVX2 one on the forced AVX2 path, none on the portable one. */
static q8_fn q8_pick(int nt)
{
    const int level = small_level();
    if (level == 0)
        return nt ? q8_nt : q8_nn;
#ifdef CORE_BLAS_X86
    if (level == SMALL_AVX2)
        return nt ? nt_q8_avx2 : nn_q8_avx2;
#endif
    return NULL;
}

int core_gemm_nt_q8_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const void *b, int64_t rb, float beta, float *c, int64_t ldc)
{
    const q8_fn f = q8_pick(1);
    return f && f(m, n, k, alpha, a, lda, b, rb, beta, c, ldc);
}

int core_gemm_nn_q8_small(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const void *b, int64_t rb, float beta, float *c, int64_t ldc)
{
    const q8_fn f = q8_pick(0);
    return f && f(m, n, k, alpha, a, lda, b, rb, beta, c, ldc);
}
