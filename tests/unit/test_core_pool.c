/* core/kernels/pool.c and its use by core/model.c: every chunk of a dynamically
 * shared run is done exactly once whatever the pool size; late workers skip
 * a run; idle workers sleep (no thread left running); the model's logits do
 * not depend on its thread count, bit for bit (tiny fixture model, and the
 * default model when DARKSERVE_MODEL is set). No timing assertions: the idle
 * check only waits until the workers are asleep. */
#include <dirent.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/model.h"
#include "core/kernels/pool.h"

enum { N_CHUNKS = 257 };

typedef struct share {
    _Atomic int next;
    _Atomic int done[N_CHUNKS];
    _Atomic int calls;
    _Atomic int bad_index;
} share_t;

static void share_fn(void *ctx, int worker, int n_workers)
{
    share_t *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    if (worker < 0 || worker >= n_workers)
        atomic_store(&s->bad_index, 1);
    for (;;) {
        const int c = atomic_fetch_add(&s->next, 1);
        if (c >= N_CHUNKS)
            return;
        atomic_fetch_add(&s->done[c], 1);
    }
}

TEST(every_chunk_once_any_size)
{
    for (int n = 1; n <= 5; n++) {
        core_pool_t *p = NULL;
        CHECK_INT_EQ(core_pool_new(n, &p, NULL), 0);
        CHECK_INT_EQ(core_pool_size(p), n);
        for (int run = 0; run < 300; run++) {
            share_t s;
            memset(&s, 0, sizeof s);
            core_pool_run(p, share_fn, &s);
            int bad = 0;
            for (int c = 0; c < N_CHUNKS; c++)
                bad |= atomic_load(&s.done[c]) != 1;
            CHECK_MSG(!bad, "pool of %d, run %d: a chunk not done exactly once", n, run);
            CHECK(atomic_load(&s.calls) >= 1 && atomic_load(&s.calls) <= n);
            CHECK(!atomic_load(&s.bad_index));
            if (bad)
                break;
        }
        core_pool_free(p);
    }
    share_t s;
    memset(&s, 0, sizeof s);
    core_pool_run(NULL, share_fn, &s); /* no pool: on the caller */
    CHECK_INT_EQ(atomic_load(&s.calls), 1);
    CHECK_INT_EQ(atomic_load(&s.done[N_CHUNKS - 1]), 1);
}

TEST(sizes_and_bad_arguments)
{
    core_pool_t *p = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_pool_new(-1, &p, &err), CORE_ERANGE);
    CHECK(p == NULL);
    CHECK_INT_EQ(core_pool_new(CORE_POOL_MAX_THREADS + 1, &p, &err), CORE_ERANGE);
    CHECK_INT_EQ(core_pool_new(0, &p, NULL), 0);
    CHECK(core_pool_cpu_count() >= 1);
    CHECK_INT_EQ(core_pool_size(p), core_pool_cpu_count());
    core_pool_free(p);
    core_pool_free(NULL);
    CHECK_INT_EQ(core_pool_size(NULL), 1);
}

/* Threads of this process in state R other than the caller, from /proc. */
static int running_others(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    char self[32];
    snprintf(self, sizeof self, "%ld", (long)gettid());
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, self))
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[r] = '\0';
        const char *close_paren = strrchr(buf, ')');
        if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R')
            n++;
    }
    closedir(d);
    return n;
}

TEST(idle_workers_sleep)
{
    core_pool_t *p = NULL;
    CHECK_INT_EQ(core_pool_new(3, &p, NULL), 0);
    for (int run = 0; run < 50; run++) {
        share_t s;
        memset(&s, 0, sizeof s);
        core_pool_run(p, share_fn, &s);
    }
    /* the workers poll for CORE_POOL_SPIN_US after the last run, then wait on
     * a condition variable: wait until no worker is running (up to 10 s on a
     * busy machine; a spinning pool never gets there) */
    int others = -1;
    for (int i = 0; i < 200 && others != 0; i++) {
        const struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        others = running_others();
    }
    CHECK_MSG(others == 0, "%d worker threads still running when idle", others);
    core_pool_free(p);
}

/* Prefill of a prompt, then decode steps of three sequences in one batch (and
 * a fourth alone); all logits into out ([(1 + STEPS * 4)][V]). */
enum { STEPS = 6, PROMPT = 12, PROMPT_LONG = 40 }; /* > MODEL_TILE_MIN_ROWS: prompt tiles */

static int run_model(const char *path, int kind, int threads, float *out, int V)
{
    /* linear: a window the prompt overflows (the ring wraps) and sinks, so
     * the attention's units read the sinks, both parts of the ring and the
     * new rows, on every thread of the pool */
    core_model_opts_t o = {.attn_kind = kind, .max_ctx = 64, .n_threads = threads,
                           .n_features = 16, .window = kind == CORE_ATTN_EXACT ? 0 : 5,
                           .sinks = kind == CORE_ATTN_EXACT ? 0 : 2};
    core_model_t *m = NULL;
    core_error_t err = {0};
    if (core_model_load(path, &o, &m, &err) < 0) {
        printf("  cannot load %s: %s\n", path, err.msg);
        return -1;
    }
    int rc = core_model_threads(m) == threads ? 0 : -1;
    core_attn_state_t *st[4] = {NULL};
    for (int b = 0; b < 4 && rc == 0; b++)
        rc = core_attn_state_new(core_model_attn(m), &st[b], &err);
    int32_t prompt[PROMPT_LONG];
    for (int i = 0; i < PROMPT_LONG; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    for (int b = 0; b < 4 && rc == 0; b++) {
        core_batch_seq_t sq = {.state = st[b], .tokens = prompt + b,
                               .n_tokens = b == 0 ? PROMPT_LONG : PROMPT - b,
                               .logits_mode = CORE_LOGITS_LAST, .logits = out};
        rc = core_model_forward(m, &sq, 1, &err);
    }
    for (int s = 0; s < STEPS && rc == 0; s++) {
        int32_t tok[4];
        core_batch_seq_t sq[4];
        for (int b = 0; b < 4; b++) {
            tok[b] = (int32_t)((s * 131 + b * 17 + 5) % V);
            sq[b] = (core_batch_seq_t){.state = st[b], .tokens = &tok[b], .n_tokens = 1,
                                       .logits_mode = CORE_LOGITS_LAST,
                                       .logits = out + (size_t)(1 + s * 4 + b) * (size_t)V};
        }
        rc = core_model_forward(m, sq, 3, &err);
        if (rc == 0)
            rc = core_model_forward(m, &sq[3], 1, &err);
    }
    if (rc < 0)
        printf("  %s: %s\n", path, err.msg);
    for (int b = 0; b < 4; b++)
        core_attn_state_free(st[b]);
    core_model_free(m);
    return rc;
}

static void check_thread_independence(const char *path, int kind)
{
    core_model_t *m = NULL;
    if (core_model_load(path, NULL, &m, NULL) < 0) {
        CHECK_MSG(0, "cannot load %s", path);
        return;
    }
    const int V = core_model_info(m)->n_vocab;
    core_model_free(m);
    const size_t nf = (size_t)(1 + STEPS * 4) * (size_t)V;
    float *ref = calloc(nf, sizeof *ref), *got = calloc(nf, sizeof *got);
    if (!ref || !got) {
        CHECK(!"out of memory");
        free(ref);
        free(got);
        return;
    }
    CHECK_INT_EQ(run_model(path, kind, 1, ref, V), 0);
    for (int t = 2; t <= 4; t++) {
        memset(got, 0, nf * sizeof *got);
        CHECK_INT_EQ(run_model(path, kind, t, got, V), 0);
        CHECK_MSG(memcmp(ref, got, nf * sizeof *got) == 0,
                  "%s (attention kind %d): logits on %d threads differ", path, kind, t);
    }
    free(ref);
    free(got);
}

TEST(model_logits_independent_of_threads)
{
    const char *tiny = getenv("DARKSERVE_TINY_MODEL"), *real = getenv("DARKSERVE_MODEL");
    CHECK_MSG(tiny != NULL, "DARKSERVE_TINY_MODEL is not set (run through make unit)");
    for (int kind = CORE_ATTN_EXACT; kind <= CORE_ATTN_PERFORMER; kind++) {
        if (tiny)
            check_thread_independence(tiny, kind);
        if (real)
            check_thread_independence(real, kind);
    }
    if (!real)
        printf("  note: DARKSERVE_MODEL not set, the default model is not checked\n");
}

int main(void)
{
    RUN(every_chunk_once_any_size);
    RUN(sizes_and_bad_arguments);
    RUN(idle_workers_sleep);
    RUN(model_logits_independent_of_threads);
    return CHECK_DONE();
}
