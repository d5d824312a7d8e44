/* tools/bench_bw.c — memory bandwidth probe for `make bench` (the decode-bandwidth target).
 *
 *   bench_bw [--mb N] [--passes P] [--threads T] [--kernel c|avx2|avx512]
 *            [--model M.gguf]
 *
 * Decode reads every weight once per token, so its speed is bounded by
 * (weight bytes read per token) / (memory read bandwidth). This program
 * measures the second figure and, with --model, computes the first from the
 * model file, so that `make bench` can state the bound it compares against
 * in the same minutes as the decode figures.
 *
 * read: a STREAM-like loop summing 64-bit integers over a buffer much larger
 *   than the last-level cache (default: the larger of 512 MiB and 4x the LLC),
 *   on 1 thread and on T threads (default: every CPU this process may run on),
 *   each thread over its own contiguous slice. Bytes read / time.
 * copy: memcpy from the buffer's first half to its second half, read and
 *   written bytes both counted (as the numpy copyto figures in
 *   docs/PERFORMANCE.md were), for comparison with those.
 * Each figure is the median of P timed passes after one untimed pass; min and
 * max are printed beside it. GB/s = 10^9 bytes per second.
 *
 * --model: the bytes a decode step reads from the file, i.e. every tensor but
 *   the token embedding table (the matrices, the 1-D norms, the output head),
 *   plus the table itself when it doubles as the output head (tied, as in
 *   SmolLM2) or one of its rows when it does not; and one more read figure
 *   on T threads with a buffer of exactly that size, which on a CPU with a
 *   large last-level cache may be served from it (printed for context; the
 *   bound uses the large buffer).
 *
 * Output lines (parsed by scripts/bench.py and tests/integration/
 * test_bench_tools.py; keep their shape):
 *   read 1 thread: median X GB/s (min A, max B)
 *   read T threads: median X GB/s (min A, max B)
 *   copy 1 thread: ...            copy T threads: ...
 *   weights per decode token: N bytes (...)
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/gguf.h"
#include "core/kernels/qdot.h"
#include "tools/tool_args.h"

#define MIB ((size_t)1 << 20)
#define SLICE_ALIGN ((size_t)4096) /* thread slices start on a page */

typedef uint64_t (*read_fn)(const unsigned char *p, size_t n);

/* Plain C: four independent sums so the loads are not serialized behind one
 * add chain (the compiler may vectorize it further). n is a multiple of 32
 * (slices are page-aligned sizes). */
static uint64_t read_c(const unsigned char *p, size_t n)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        s0 += w[i];
        s1 += w[i + 1];
        s2 += w[i + 2];
        s3 += w[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BW_X86 1

__attribute__((target("avx2"))) static uint64_t read_avx2(const unsigned char *p, size_t n)
{
    const __m256i *v = (const __m256i *)(const void *)p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 4 <= n / 32; i += 4) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
    }
    __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)(void *)t, a);
    return t[0] + t[1] + t[2] + t[3];
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const unsigned char *p, size_t n)
{
    const __m512i *v = (const __m512i *)(const void *)p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 4 <= n / 64; i += 4) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
    }
    __m512i a = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a);
}
#else
/* other machines (aarch64) have the portable kernel only: never chosen */
#define read_avx2 read_c
#define read_avx512 read_c
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum op { OP_INIT, OP_READ, OP_COPY, OP_EXIT };

/* Shared by the coordinating thread and the workers. Each pass: everyone
 * meets at `start`, the workers run op over their slice, everyone meets at
 * `end`. A pass lasts from the first worker's start to the last worker's
 * end, as the workers' own clocks say: the coordinator, woken from a
 * barrier on a busy machine, may run late (its own timestamps made passes
 * look up to 100x too short on 2 loaded cores). The workers wait
 * on `gate` first, so that the barriers are sized after every thread that
 * could be started is known. */
typedef struct pool {
    pthread_mutex_t gate;
    pthread_barrier_t start, end;
    int n;      /* workers */
    enum op op; /* written by the coordinator before `start` */
    unsigned char *buf;
    size_t bytes; /* OP_INIT / OP_READ span [0, bytes); OP_COPY: bytes/2 each way */
    read_fn read;
} pool_t;

typedef struct worker {
    pool_t *pool;
    int id;
    uint64_t sum;  /* keeps the reads alive */
    double t0, t1; /* this pass's start and end on this worker */
} worker_t;

/* [lo, hi) of worker id's share of len bytes, in SLICE_ALIGN units. */
static void slice(size_t len, int n, int id, size_t *lo, size_t *hi)
{
    size_t units = len / SLICE_ALIGN;
    *lo = units * (size_t)id / (size_t)n * SLICE_ALIGN;
    *hi = units * (size_t)(id + 1) / (size_t)n * SLICE_ALIGN;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pool_t *p = w->pool;
    pthread_mutex_lock(&p->gate);
    pthread_mutex_unlock(&p->gate);
    for (;;) {
        pthread_barrier_wait(&p->start);
        enum op op = p->op;
        if (op == OP_EXIT)
            return NULL;
        size_t lo, hi;
        w->t0 = now_s();
        if (op == OP_COPY) {
            size_t half = p->bytes / 2 / SLICE_ALIGN * SLICE_ALIGN;
            slice(half, p->n, w->id, &lo, &hi);
            memcpy(p->buf + half + lo, p->buf + lo, hi - lo);
        } else {
            slice(p->bytes, p->n, w->id, &lo, &hi);
            if (op == OP_INIT) /* first touch by the thread that will read it */
                for (size_t i = lo; i < hi; i++)
                    p->buf[i] = (unsigned char)(i * 131u + 7u);
            else
                w->sum += p->read(p->buf + lo, hi - lo);
        }
        w->t1 = now_s();
        pthread_barrier_wait(&p->end);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile uint64_t sink;

/* Runs one measurement (op over bytes of buf on n threads): one untimed pass,
 * then `passes` timed ones; prints the line described at the top (unless
 * what is NULL). */
static int measure(const char *what, enum op op, unsigned char *buf, size_t bytes, int n,
                   int passes, read_fn rd, const char *suffix)
{
    pool_t p = {.n = n, .op = op, .buf = buf, .bytes = bytes, .read = rd};
    worker_t *ws = calloc((size_t)n, sizeof *ws);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    double *gbs = calloc((size_t)passes, sizeof *gbs);
    int started = 0, rc = -1;
    if (!ws || !th || !gbs) {
        fprintf(stderr, "bench_bw: out of memory\n");
        goto out;
    }
    pthread_mutex_init(&p.gate, NULL);
    pthread_mutex_lock(&p.gate);
    for (; started < n; started++) {
        ws[started] = (worker_t){.pool = &p, .id = started};
        if (pthread_create(&th[started], NULL, worker_main, &ws[started]) != 0) {
            fprintf(stderr, "bench_bw: cannot start thread %d of %d\n", started + 1, n);
            p.op = OP_EXIT;
            break;
        }
    }
    pthread_barrier_init(&p.start, NULL, (unsigned)started + 1);
    pthread_barrier_init(&p.end, NULL, (unsigned)started + 1);
    pthread_mutex_unlock(&p.gate);
    if (started == n) {
        /* bytes moved per pass: read counts the buffer; copy counts the
         * bytes read and the bytes written */
        double moved =
            op == OP_COPY ? 2.0 * (double)(bytes / 2 / SLICE_ALIGN * SLICE_ALIGN) : (double)bytes;
        for (int i = -1; i < passes; i++) {
            pthread_barrier_wait(&p.start);
            pthread_barrier_wait(&p.end);
            double t0 = ws[0].t0, t1 = ws[0].t1;
            for (int k = 1; k < n; k++) {
                t0 = ws[k].t0 < t0 ? ws[k].t0 : t0;
                t1 = ws[k].t1 > t1 ? ws[k].t1 : t1;
            }
            double dt = t1 - t0;
            if (i >= 0)
                gbs[i] = moved / dt * 1e-9;
        }
        rc = 0;
        p.op = OP_EXIT;
    }
    pthread_barrier_wait(&p.start); /* every worker sees OP_EXIT and returns */
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sink += ws[i].sum;
    }
    pthread_barrier_destroy(&p.start);
    pthread_barrier_destroy(&p.end);
    pthread_mutex_destroy(&p.gate);
    if (rc == 0 && what) {
        qsort(gbs, (size_t)passes, sizeof *gbs, cmp_d);
        printf("%s %d thread%s%s: median %.2f GB/s (min %.2f, max %.2f)\n", what, n,
               n == 1 ? "" : "s", suffix, gbs[passes / 2], gbs[0], gbs[passes - 1]);
        fflush(stdout);
    }
out:
    free(ws);
    free(th);
    free(gbs);
    return rc;
}

static size_t llc_bytes(void)
{
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l3 > 0 ? (size_t)l3 : l2 > 0 ? (size_t)l2 : 0;
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Weight bytes one decode step reads (see the top); prints the breakdown.
 * Returns the total, 0 on error (printed). */
static uint64_t model_bytes(const char *path)
{
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    if (core_gguf_open(path, &g, &err) < 0) {
        fprintf(stderr, "bench_bw: %s: %s\n", path, err.msg);
        return 0;
    }
    uint64_t mat = 0, vec = 0, embd = 0, embd_row = 0, head = 0;
    int have_embd = 0, have_head = 0;
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        if (!strcmp(t->name, "token_embd.weight")) {
            int64_t rows = 1;
            for (uint32_t d = 1; d < t->n_dims; d++)
                rows *= t->ne[d];
            have_embd = 1;
            embd = t->nbytes;
            embd_row = rows > 0 ? t->nbytes / (uint64_t)rows : t->nbytes;
        } else if (!strcmp(t->name, "output.weight")) {
            have_head = 1;
            head = t->nbytes;
        } else if (t->n_dims >= 2) {
            mat += t->nbytes;
        } else {
            vec += t->nbytes;
        }
    }
    core_gguf_close(g);
    uint64_t total = mat + vec + (have_head ? head + embd_row : embd);
    printf("weights per decode token: %" PRIu64 " bytes (matrices %" PRIu64 ", 1-D tensors %" PRIu64
           ", output head %" PRIu64 " %s)\n",
           total, mat, vec, have_head ? head : embd,
           have_head   ? "(output.weight; plus one token_embd row)"
           : have_embd ? "(token_embd.weight, tied)"
                       : "(none found)");
    return total;
}

int main(int argc, char **argv)
{
    int64_t mb = 0, passes = 9, threads = 0;
    const char *kernel = NULL, *model = NULL;
    if (tool_isa_env_ok("bench_bw") < 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!bad && !strcmp(a, "--mb"))
            bad = parse_i64(v, 1, 1 << 16, &mb);
        else if (!bad && !strcmp(a, "--passes"))
            bad = parse_i64(v, 1, 1000, &passes);
        else if (!bad && !strcmp(a, "--threads"))
            bad = parse_i64(v, 0, 1024, &threads);
        else if (!bad && !strcmp(a, "--kernel"))
            kernel = v;
        else if (!bad && !strcmp(a, "--model"))
            model = v;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr,
                    "bench_bw: bad option or value near '%s'\nusage: bench_bw [--mb N] "
                    "[--passes P] [--threads T] [--kernel c|avx2|avx512] [--model M]\n",
                    a);
            return 2;
        }
        i++;
    }
    read_fn rd = read_c;
    const char *rd_name = "c";
#ifdef BW_X86
    int avx2 = core_cpu_has(CORE_CPU_AVX2), avx512 = core_cpu_has(CORE_CPU_AVX512F);
#else
    int avx2 = 0, avx512 = 0;
#endif
    if (!kernel) {
        rd = avx512 ? read_avx512 : avx2 ? read_avx2 : read_c;
        rd_name = avx512 ? "avx512" : avx2 ? "avx2" : "c";
    } else if (!strcmp(kernel, "c")) {
    } else if (!strcmp(kernel, "avx2") && avx2) {
        rd = read_avx2, rd_name = "avx2";
    } else if (!strcmp(kernel, "avx512") && avx512) {
        rd = read_avx512, rd_name = "avx512";
    } else {
        fprintf(stderr, "bench_bw: --kernel %s: unknown or not supported by this CPU\n", kernel);
        return 2;
    }
    size_t llc = llc_bytes();
    size_t bytes = mb > 0 ? (size_t)mb * MIB : 4 * llc > 512 * MIB ? 4 * llc : 512 * MIB;
    bytes = (bytes + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
    int nt = threads > 0 ? (int)threads : usable_cpus();
    long online = sysconf(_SC_NPROCESSORS_ONLN);

    printf("bench_bw: buffer %zu MiB (last-level cache %zu MiB), %d passes, read kernel %s, "
           "qdot kernels %s%s; %ld online CPUs, %d usable\n",
           bytes / MIB, llc / MIB, (int)passes, rd_name, core_qdot_isa_name(core_qdot_isa()),
           core_q8_amx_available() && core_qdot_isa() == CORE_QDOT_AVX512VNNI ? "+amx" : "",
           online, usable_cpus());
    fflush(stdout);
    unsigned char *buf =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        fprintf(stderr, "bench_bw: cannot map %zu MiB: %s\n", bytes / MIB, strerror(errno));
        return 1;
    }
    madvise(buf, bytes, MADV_HUGEPAGE); /* fewer TLB misses; a hint, may be refused */
    int rc = 0;
    if (measure(NULL, OP_INIT, buf, bytes, nt, 1, rd, "") < 0 ||
        measure("read", OP_READ, buf, bytes, 1, (int)passes, rd, "") < 0 ||
        (nt > 1 && measure("read", OP_READ, buf, bytes, nt, (int)passes, rd, "") < 0) ||
        measure("copy", OP_COPY, buf, bytes, 1, (int)passes, rd, "") < 0 ||
        (nt > 1 && measure("copy", OP_COPY, buf, bytes, nt, (int)passes, rd, "") < 0))
        rc = 1;
    if (rc == 0 && model) {
        uint64_t w = model_bytes(model);
        if (!w)
            rc = 1;
        else if (w <= bytes) {
            char suffix[96];
            size_t wb = (size_t)w / SLICE_ALIGN * SLICE_ALIGN;
            snprintf(suffix, sizeof suffix, " at %zu MiB (the weights' size; may be cached)",
                     wb / MIB);
            if (measure("read", OP_READ, buf, wb, nt, (int)passes, rd, suffix) < 0)
                rc = 1;
        }
    }
    munmap(buf, bytes);
    return rc;
}
