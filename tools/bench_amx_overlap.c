/* tools/bench_amx_overlap.c — does the AMX tile unit run beside the vector
 * units? (the 16-stream batching target: the batched decode kernel's two halves)
 *
 *   bench_amx_overlap [--reps R] [--groups G]
 *
 * The batched decode kernel (core/kernels/qdot_pack.c, amx_group_rows) does two
 * kinds of work per block of 32 values, 16 activation rows and 16 weight
 * rows: tile work (zero a sums tile, load the activations' and the weights'
 * tiles, one TDPBSUD, store the 16 x 16 int32 sums) and float work (per
 * activation row: load its 16 sums, convert, scale, fused multiply-add).
 * This program times each alone and both interleaved on independent data,
 * the float work once with 512-bit and once with 256-bit vectors:
 *
 *   tiles            ns a block (G groups x 18 blocks a pass)
 *   float zmm        ns a block
 *   tiles+float zmm  ns a block
 *   overlap zmm      (tiles + float - both) / min(tiles, float): 0 when the
 *                    two take turns, 1 when the shorter hides behind the longer
 *   (the same for ymm)
 *
 * Each figure is the fastest of R passes (default 50) over G groups (default
 * 96: a 1536 x 576 matrix), so it is the hardware's rate with hot caches,
 * not a decode figure. Where the CPU or OS gives no AMX tiles it says so and
 * exits 0. The data are constants; the result is printed so that the
 * compiler keeps the work.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/kernels/qdot.h"
#include "tools/tool_args.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OVL_X86 1
#endif

enum { NB = 18, ROWS = 16, MAX_GROUPS = 4096 };

#ifdef OVL_X86
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define OVL_FN                                                                                     \
    static __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma"), noinline))

typedef struct ovl_cfg { /* the LDTILECFG operand, palette 1 */
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ovl_cfg_t;

/* The kernel's shapes: sums tiles 0 and 1 (16 x 16 int32), activations 4
 * and 6 (16 x 32 bytes), weights 5 and 7 (8 x 64 bytes). */
static void ovl_config(void)
{
    ovl_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    const uint8_t rows[8] = {ROWS, ROWS, ROWS, ROWS, ROWS, 8, ROWS, 8};
    const uint16_t colsb[8] = {64, 64, 64, 64, 32, 64, 32, 64};
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = colsb[t];
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

typedef struct ovl_data {
    int8_t *a;     /* ROWS x NB x 32 activation bytes */
    uint8_t *w;    /* groups x NB x 512 weight bytes */
    int32_t *sums; /* 4 x 256 int32 the tiles store to */
    int32_t *src;  /* 2 x 256 int32 the float work reads (not the tiles') */
    float scales[2 * ROWS];
    int64_t groups;
} ovl_data_t;

enum { TILES = 1, FLOAT_Z = 2, FLOAT_Y = 4 };

/* One pass over every group and block pair: the work named by what. */
OVL_FN float ovl_pass(const ovl_data_t *d, int what)
{
    const int64_t stride = (int64_t)NB * 32;
    __m512 acc[ROWS];
    __m256 acc_y[ROWS][2];
    for (int r = 0; r < ROWS; r++) {
        acc[r] = _mm512_setzero_ps();
        acc_y[r][0] = acc_y[r][1] = _mm256_setzero_ps();
    }
    const __m512 dw = _mm512_set1_ps(0.5f);
    for (int64_t g = 0; g < d->groups; g++) {
        const uint8_t *wg = d->w + g * NB * 512;
        for (int64_t b = 0; b < NB; b += 2) {
            if (what & TILES) {
                _tile_zero(0);
                _tile_loadd(4, d->a + b * 32, stride);
                _tile_loadd(5, wg + b * 512, 64);
                _tile_dpbsud(0, 4, 5);
                _tile_zero(1);
                _tile_loadd(6, d->a + (b + 1) * 32, stride);
                _tile_loadd(7, wg + (b + 1) * 512, 64);
                _tile_dpbsud(1, 6, 7);
                _tile_stored(0, d->sums + (b % 4) * 256, 64);
                _tile_stored(1, d->sums + ((b + 1) % 4) * 256, 64);
            }
            if (what & FLOAT_Z) {
#pragma GCC unroll 32
                for (int r = 0; r < 2 * ROWS; r++) {
                    const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(d->scales[r]));
                    const __m512i v = _mm512_load_si512((const void *)(d->src + (size_t)r * 16));
                    acc[r % ROWS] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), s, acc[r % ROWS]);
                }
            }
            if (what & FLOAT_Y) {
#pragma GCC unroll 32
                for (int r = 0; r < 2 * ROWS; r++) {
                    const __m256 s =
                        _mm256_mul_ps(_mm512_castps512_ps256(dw), _mm256_set1_ps(d->scales[r]));
                    const __m256i v0 =
                        _mm256_load_si256((const __m256i *)(const void *)(d->src + (size_t)r * 16));
                    const __m256i v1 = _mm256_load_si256(
                        (const __m256i *)(const void *)(d->src + (size_t)r * 16 + 8));
                    acc_y[r % ROWS][0] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(v0), s, acc_y[r % ROWS][0]);
                    acc_y[r % ROWS][1] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), s, acc_y[r % ROWS][1]);
                }
            }
        }
    }
    float out = 0.0f;
    for (int r = 0; r < ROWS; r++) {
        out += _mm512_reduce_add_ps(acc[r]);
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(acc_y[r][0], acc_y[r][1]));
        out += t[0] + t[7];
    }
    return out;
}

OVL_FN void ovl_release(void)
{
    _tile_release();
}

/* ns a block (the fastest pass of reps), the results summed into *sink. */
static double ovl_time(const ovl_data_t *d, int what, int64_t reps, float *sink)
{
    double best = 1e30;
    for (int64_t i = 0; i < reps; i++) {
        const double t0 = now_s();
        *sink += ovl_pass(d, what);
        const double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return best * 1e9 / (double)(d->groups * NB);
}

static void ovl_report(const char *isa, double tiles, double flt, double both)
{
    const double lo = tiles < flt ? tiles : flt;
    printf("float %s       %6.2f ns a block\n", isa, flt);
    printf("tiles+float %s %6.2f ns a block\n", isa, both);
    printf("overlap %s     %6.2f (0: one after the other; 1: the shorter hidden)\n", isa,
           (tiles + flt - both) / lo);
}
#endif

int main(int argc, char **argv)
{
    int64_t reps = 50, groups = 96;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 0;
        if (v && !strcmp(argv[i], "--reps"))
            ok = parse_i64(v, 1, 100000, &reps) == 0;
        else if (v && !strcmp(argv[i], "--groups"))
            ok = parse_i64(v, 1, MAX_GROUPS, &groups) == 0;
        if (!ok) {
            fprintf(stderr, "usage: bench_amx_overlap [--reps 1..100000] [--groups 1..%d]\n",
                    MAX_GROUPS);
            return 2;
        }
    }
#ifdef OVL_X86
    if (!core_q8_amx_available()) {
        printf("no AMX tiles on this CPU or OS: nothing to measure\n");
        return 0;
    }
    ovl_data_t d = {.groups = groups};
    d.a = aligned_alloc(64, (size_t)ROWS * NB * 32);
    d.w = aligned_alloc(64, (size_t)groups * NB * 512);
    d.sums = aligned_alloc(64, (size_t)4 * 256 * sizeof(int32_t));
    d.src = aligned_alloc(64, (size_t)2 * 256 * sizeof(int32_t));
    if (!d.a || !d.w || !d.sums || !d.src) {
        fprintf(stderr, "bench_amx_overlap: out of memory\n");
        free(d.a);
        free(d.w);
        free(d.sums);
        free(d.src);
        return 1;
    }
    memset(d.a, 1, (size_t)ROWS * NB * 32);
    memset(d.w, 2, (size_t)groups * NB * 512);
    memset(d.sums, 0, (size_t)4 * 256 * sizeof(int32_t));
    for (int i = 0; i < 2 * 256; i++)
        d.src[i] = i % 97 - 48;
    for (int r = 0; r < 2 * ROWS; r++)
        d.scales[r] = 1.0f + 1e-3f * (float)r;
    ovl_config();
    float sink = 0.0f;
    (void)ovl_pass(&d, TILES | FLOAT_Z | FLOAT_Y); /* warm up */
    const double tiles = ovl_time(&d, TILES, reps, &sink);
    const double fz = ovl_time(&d, FLOAT_Z, reps, &sink);
    const double bz = ovl_time(&d, TILES | FLOAT_Z, reps, &sink);
    const double fy = ovl_time(&d, FLOAT_Y, reps, &sink);
    const double by = ovl_time(&d, TILES | FLOAT_Y, reps, &sink);
    ovl_release();
    printf("blocks of 32 values x 16 activation rows x 16 weight rows; %lld groups x %d blocks, "
           "fastest of %lld passes\n",
           (long long)groups, NB, (long long)reps);
    printf("tiles           %6.2f ns a block\n", tiles);
    ovl_report("zmm", tiles, fz, bz);
    ovl_report("ymm", tiles, fy, by);
    printf("(checksum %g)\n", (double)sink);
    free(d.a);
    free(d.w);
    free(d.sums);
    free(d.src);
#else
    printf("not an x86-64 build: nothing to measure\n");
#endif
    return 0;
}
