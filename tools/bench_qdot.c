/* tools/bench_qdot.c — throughput of the quantized matmul kernels alone.
 *
 *   bench_qdot [--type Q4_1] [--n ROWS] [--k COLS] [--m M] [--reps R] [--threads T]
 *
 * Times core_qmatmul_nt (f32 activations) and the integer path (quantize +
 * core_qdot_run_jobs) for every ISA this CPU runs, and the packed integer
 * path (core_q8_pack's layout, "int8p") where the ISA packs the type, on random weights of n x
 * k (default 1536 x 576: one FFN matrix of the default model, which stays in
 * L2; pass --n 100000 for a matrix that must come from memory), m activation
 * rows; then the prompt rows' kernels on the packed copy, on the calling
 * thread, per ISA that packs: "panel" (the f32 panels, core_qmatmul_packed)
 * and, where the CPU has AMX-BF16, "bf16t" (core_q8_amx_split of the rows,
 * then core_qmatmul_packed_amx). Prints, per variant, the medians over R
 * repetitions of wall time and
 * of process CPU time, with the weight bytes read per second of each. A
 * benchmark program, not a test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/kernels/pool.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"
#include "core/tensor.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the process (all threads): on a shared machine it measures
 * the work, where wall time also measures the other processes. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One variant's line: the medians of its reps wall (t) and CPU (tc) times,
 * sorted here, and the weight bytes read per second of each. */
static void report(const char *isa, const char *path, double *t, double *tc, long reps,
                   double bytes)
{
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    qsort(tc, (size_t)reps, sizeof *tc, cmp_d);
    printf("  %-10s %-5s wall median %9.1f us (%6.2f GB/s)  cpu median %9.1f us (%6.2f "
           "GB/s per CPU-second)\n",
           isa, path, t[reps / 2] * 1e6, bytes / t[reps / 2] / 1e9, tc[reps / 2] * 1e6,
           bytes / tc[reps / 2] / 1e9);
}

int main(int argc, char **argv)
{
    const char *tname = "Q4_1";
    long n = 1536, k = 576, m = 1, reps = 21, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--type"))
            tname = v;
        else if (!strcmp(a, "--n"))
            n = atol(v);
        else if (!strcmp(a, "--k"))
            k = atol(v);
        else if (!strcmp(a, "--m"))
            m = atol(v);
        else if (!strcmp(a, "--reps"))
            reps = atol(v);
        else if (!strcmp(a, "--threads"))
            threads = atol(v);
        else {
            fprintf(stderr, "bench_qdot: unknown option %s\n", a);
            return 2;
        }
    }
    int type = -1;
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++)
        if (!strcmp(core_ttype_name(t), tname))
            type = t;
    size_t rb = 0;
    if (type < 0 || !core_qdot_supported(type) || n < 1 || k < 32 || m < 1 || m > 64 || reps < 1 ||
        reps > 1000 || threads < 0 || threads > 256 || core_ttype_row_bytes(type, k, &rb) < 0) {
        fprintf(stderr, "usage: bench_qdot [--type Q4_1] [--n ROWS] [--k COLS (block multiple)] "
                        "[--m 1..64] [--reps R] [--threads T]\n");
        return 2;
    }
    core_pool_t *pool = NULL;
    unsigned char *w = malloc((size_t)n * rb);
    float *a = malloc((size_t)(m * k) * sizeof *a), *c = malloc((size_t)(m * n) * sizeof *c);
    void *qb = malloc(core_q8_act_bytes(m, k));
    double *t = malloc((size_t)reps * sizeof *t), *tc = malloc((size_t)reps * sizeof *tc);
    if (!w || !a || !c || !qb || !t || !tc || core_pool_new((int)threads, &pool, NULL) < 0) {
        fprintf(stderr, "bench_qdot: out of memory\n");
        return 1;
    }
    core_rng_t r;
    core_rng_seed(&r, 5);
    for (size_t i = 0; i < (size_t)n * rb; i++)
        w[i] = (unsigned char)core_rng_u64(&r);
    const size_t bb = core_ttype_block_bytes(type);
    for (size_t i = 0; i < (size_t)n * rb; i += bb) { /* finite scales */
        uint16_t h = core_fp32_to_fp16(0.01f);
        memcpy(w + i, &h, 2);
    }
    void *pk = NULL;
    if (core_q8_pack_supported(type) && k % CORE_Q8_BLOCK == 0 &&
        (pk = malloc(core_q8_pack_bytes(type, n, k))))
        core_q8_pack(type, w, rb, n, k, pk);
    for (long i = 0; i < m * k; i++)
        a[i] = (float)core_rng_normal(&r);
    printf("%s n=%ld k=%ld m=%ld threads=%d: %.1f MB of weights\n", tname, n, k, m,
           core_pool_size(pool), (double)n * (double)rb / 1e6);
    for (int isa = 0; isa < (int)CORE_QDOT_ISA_COUNT_; isa++) {
        if (core_qdot_force_isa((core_qdot_isa_t)isa) != 0) /* not this CPU's */
            continue;
        for (int path = 0; path < 4; path++) { /* f32, int8, int8p, int8p on AMX tiles */
            if (path >= 1 && !core_q8_supported(type))
                continue;
            if (path >= 2 && (!pk || !core_q8_pack_supported(type)))
                continue;
            if (path == 3 && (!core_q8_amx_available() || isa != (int)CORE_QDOT_AVX512VNNI))
                continue;
            (void)core_q8_force_amx(path == 3 ? CORE_Q8_AMX_ON : CORE_Q8_AMX_OFF);
            for (long i = 0; i < reps; i++) {
                const double t0 = now_s(), c0 = cpu_s();
                core_q8_act_t qa;
                core_qdot_job_t jb = {.type = type, .w = w, .row_bytes = rb, .n = n, .c = c,
                                      .ldc = n};
                if (path >= 1) {
                    core_q8_act_init(&qa, qb, m, k);
                    core_q8_quantize(&qa, a, k);
                    jb.qa = &qa;
                    jb.pk = path >= 2 ? pk : NULL;
                } else {
                    jb.a = a;
                    jb.m = m;
                    jb.k = k;
                    jb.lda = k;
                }
                core_qdot_run_jobs(pool, &jb, 1);
                t[i] = now_s() - t0;
                tc[i] = cpu_s() - c0;
            }
            report(core_qdot_isa_name((core_qdot_isa_t)isa),
                   path == 3 ? "amx" : path == 2 ? "int8p" : path ? "int8" : "f32", t, tc, reps,
                   (double)n * (double)rb);
        }
    }
    (void)core_q8_force_amx(CORE_Q8_AMX_AUTO);
    /* prompt rows (f32) against the packed weights on the calling thread:
     * the f32 panels on every ISA that packs, and where the CPU has
     * AMX-BF16 the tiles (the split of the rows included) */
    for (int isa = 0; isa <= (int)core_qdot_best_isa(); isa++) {
        if (!core_qdot_isa_runs((core_qdot_isa_t)isa))
            continue;
        (void)core_qdot_force_isa((core_qdot_isa_t)isa);
        if (!pk || !core_q8_pack_supported(type))
            continue;
        float *panel = aligned_alloc(64, core_q8_panel_floats(k) * sizeof *panel);
        const size_t sb = (core_q8_amx_split_words(m, k) * sizeof(uint16_t) + 63) / 64 * 64;
        uint16_t *as = core_q8_amx_panels_used() ? aligned_alloc(64, sb) : NULL;
        for (int path = 0; path < 2 && panel; path++) {
            if (path == 1 && !as)
                break;
            for (long i = 0; i < reps; i++) {
                const double t0 = now_s(), c0 = cpu_s();
                if (path == 0)
                    (void)core_qmatmul_packed(type, m, 0, n, k, a, k, pk, panel, 0.0f, c, n);
                else if (core_q8_amx_split(a, k, m, k, as) == 0)
                    (void)core_qmatmul_packed_amx(type, m, 0, n, k, as, pk, panel, 0.0f, c, n);
                t[i] = now_s() - t0;
                tc[i] = cpu_s() - c0;
            }
            report(core_qdot_isa_name((core_qdot_isa_t)isa), path ? "bf16t" : "panel", t, tc, reps,
                   (double)n * (double)rb);
        }
        free(panel);
        free(as);
    }
    (void)core_qdot_force_isa(CORE_QDOT_ISA_COUNT_);
    core_pool_free(pool);
    free(w);
    free(a);
    free(c);
    free(qb);
    free(pk);
    free(t);
    free(tc);
    return 0;
}
