/* core/kernels/pool.c — persistent worker threads: a generation counter under a
 * mutex, announced through a condition variable, mirrored in an atomic that
 * workers poll for CORE_POOL_SPIN_US before they sleep.
 *
 * Why poll at all: a decode step runs ~120 pool runs back to back, a few
 * hundred microseconds apart or less; a condition-variable wake-up of a
 * sleeping thread costs tens of microseconds (more on a virtual machine whose
 * idle vCPU halts), which would eat the gain of the second core. Why only a
 * little: once the forward is over the scheduler may wait for seconds, and a
 * worker that kept polling would take a CPU from the event loop and from
 * other processes. The wait for the run's end follows the same pattern.
 *
 * A worker that arrives after the caller has finished its own call skips
 * the run (the caller has done the work, the functions share it out
 * dynamically): on a machine whose cores are busy with other processes, a
 * descheduled worker then costs nothing, instead of holding every product
 * until the scheduler gets round to it.
 */
#include "core/kernels/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

typedef struct worker {
    core_pool_t *pool;
    int index;
} worker_t;

/* The run state, one 64-bit word: the run's generation (high 32 bits), an
 * open flag and the number of workers inside fn. A worker joins a run only
 * while it is open and only the run it read fn and ctx for. */
#define RUN_OPEN ((uint64_t)1 << 31)
#define RUN_COUNT ((uint64_t)RUN_OPEN - 1)

struct core_pool {
    int n;              /* threads including the caller */
    int started;        /* workers running (n - 1 once constructed) */
    pthread_t *th;      /* [n - 1] */
    worker_t *wk;       /* [n - 1] */
    pthread_mutex_t mu; /* guards gen, stop, fn, ctx; pairs with the two conds */
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    uint64_t gen;          /* run counter (under mu) */
    int stop;              /* under mu */
    core_pool_fn fn;       /* the current run (under mu) */
    void *ctx;
    _Atomic uint64_t agen; /* gen, readable without the lock */
    _Atomic uint64_t run;  /* gen << 32 | RUN_OPEN? | workers inside fn */
};

int core_pool_cpu_count(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int c = CPU_COUNT(&set);
        if (c > 0)
            return c > CORE_POOL_MAX_THREADS ? CORE_POOL_MAX_THREADS : c;
    }
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (n > CORE_POOL_MAX_THREADS ? CORE_POOL_MAX_THREADS : (int)n) : 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Polls until (*a & mask) != v (returns 1) or CORE_POOL_SPIN_US pass
 * (returns 0). */
static int spin_while_eq(_Atomic uint64_t *a, uint64_t mask, uint64_t v)
{
    const uint64_t t0 = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if ((atomic_load_explicit(a, memory_order_acquire) & mask) != v)
                return 1;
            POOL_PAUSE();
        }
        if (now_ns() - t0 > (uint64_t)CORE_POOL_SPIN_US * 1000u)
            return 0;
    }
}

/* Polls until (*a & mask) == 0 (returns 1) or CORE_POOL_SPIN_US pass
 * (returns 0). */
static int spin_while_nonzero(_Atomic uint64_t *a, uint64_t mask)
{
    const uint64_t t0 = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if ((atomic_load_explicit(a, memory_order_acquire) & mask) == 0)
                return 1;
            POOL_PAUSE();
        }
        if (now_ns() - t0 > (uint64_t)CORE_POOL_SPIN_US * 1000u)
            return 0;
    }
}

/* Enters run g if it is still open. */
static int join_run(core_pool_t *p, uint64_t g)
{
    uint64_t v = atomic_load_explicit(&p->run, memory_order_acquire);
    for (;;) {
        if ((v >> 32) != (g & 0xffffffffu) || !(v & RUN_OPEN))
            return 0;
        if (atomic_compare_exchange_weak_explicit(&p->run, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    }
}

static void *worker_main(void *arg)
{
    const worker_t *w = arg;
    core_pool_t *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        (void)spin_while_eq(&p->agen, UINT64_MAX, seen);
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop)
            pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        const core_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);

        if (!join_run(p, seen))
            continue; /* the caller did all the work already */
        fn(ctx, w->index, p->n);
        const uint64_t left = atomic_fetch_sub_explicit(&p->run, 1, memory_order_acq_rel) - 1;
        if ((left & (RUN_OPEN | RUN_COUNT)) == 0) {
            /* closed and empty: under the lock, so a caller that saw a
             * worker inside under it is already waiting and gets the signal */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

void core_pool_free(core_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p->wk);
    free(p);
}

int core_pool_new(int n_threads, core_pool_t **out, core_error_t *err)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > CORE_POOL_MAX_THREADS)
        return core_error_set(err, CORE_ERANGE, "thread count %d out of range [0, %d]", n_threads,
                              CORE_POOL_MAX_THREADS);
    if (n_threads == 0)
        n_threads = core_pool_cpu_count();
    core_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return core_error_set(err, CORE_ENOMEM, "out of memory for a thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->agen, 0);
    atomic_init(&p->run, 0);
    if (n_threads > 1) {
        p->th = calloc((size_t)(n_threads - 1), sizeof *p->th);
        p->wk = calloc((size_t)(n_threads - 1), sizeof *p->wk);
        if (!p->th || !p->wk) {
            core_pool_free(p);
            return core_error_set(err, CORE_ENOMEM, "out of memory for a thread pool");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->wk[i] = (worker_t){p, i + 1};
        if (pthread_create(&p->th[i], NULL, worker_main, &p->wk[i]) != 0) {
            core_pool_free(p);
            return core_error_set(err, CORE_EIO, "cannot start compute thread %d of %d", i + 2,
                                  n_threads);
        }
        p->started++;
    }
    *out = p;
    return 0;
}

int core_pool_size(const core_pool_t *p)
{
    return p ? p->n : 1;
}

void core_pool_run(core_pool_t *p, core_pool_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->gen++;
    atomic_store_explicit(&p->run, (p->gen & 0xffffffffu) << 32 | RUN_OPEN, memory_order_release);
    atomic_store_explicit(&p->agen, p->gen, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n);

    /* close the run: late workers skip it; wait for those inside */
    const uint64_t v = atomic_fetch_and_explicit(&p->run, ~RUN_OPEN, memory_order_acq_rel);
    if ((v & RUN_COUNT) == 0)
        return;
    if (!spin_while_nonzero(&p->run, RUN_COUNT)) {
        pthread_mutex_lock(&p->mu);
        while ((atomic_load_explicit(&p->run, memory_order_acquire) & RUN_COUNT) != 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
