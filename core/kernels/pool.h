/* core/kernels/pool.h — one persistent pool of worker threads for data-parallel
 * kernels (the quantized matmuls of a forward).
 *
 * A pool of N threads is the calling thread plus N - 1 workers started once;
 * core_pool_run() hands one function to the caller and to every worker that
 * picks the run up while the caller is still inside its own call, and
 * returns once all of those have returned: at most N threads compute at any
 * time (no oversubscription if N <= the CPUs available), and a worker that
 * is not scheduled in time does not hold the caller up. The function must
 * therefore share its work out dynamically (an atomic counter of chunks), so
 * that the caller alone finishes whatever no worker took. Between runs a worker polls for a short while
 * (CORE_POOL_SPIN_US, so that the next matmul of the same forward does not
 * pay a wake-up) and then sleeps on a condition variable: an idle pool takes
 * no CPU.
 *
 * Threading: one core_pool_run() at a time per pool (the owner's thread);
 * the function runs concurrently on all threads of the pool.
 */
#ifndef DARKSERVE_CORE_POOL_H
#define DARKSERVE_CORE_POOL_H

#include "core/err.h"

/* Longest a worker polls for the next run before it sleeps. */
#define CORE_POOL_SPIN_US 200
/* Largest pool. */
#define CORE_POOL_MAX_THREADS 256

typedef struct core_pool core_pool_t;

/* Runs on every thread of the pool: worker is 0 (the caller) .. n_workers-1.
 * ctx is the pointer given to core_pool_run. */
typedef void (*core_pool_fn)(void *ctx, int worker, int n_workers);

/* CPUs this process may run on (sched_getaffinity, else the online count),
 * at least 1. */
int core_pool_cpu_count(void);

/* New pool of n_threads threads including the caller (0 = core_pool_cpu_count();
 * 1 starts no thread). *out is new, free with core_pool_free. CORE_ERANGE for
 * n_threads < 0 or > CORE_POOL_MAX_THREADS, CORE_ENOMEM / CORE_EIO when
 * memory or a thread cannot be had (nothing is left running then). */
int core_pool_new(int n_threads, core_pool_t **out, core_error_t *err);
/* Stops and joins the workers. NULL is a no-op. Not during a run. */
void core_pool_free(core_pool_t *p);
/* Threads of the pool, including the caller; 1 for NULL. */
int core_pool_size(const core_pool_t *p);
/* fn(ctx, 0, n) on the calling thread and fn(ctx, i, n) on each worker i in
 * [1, n) that joins before that call returns (possibly none); returns once
 * every call has returned. p NULL runs fn(ctx, 0, 1). fn must not call
 * core_pool_run on the same pool. */
void core_pool_run(core_pool_t *p, core_pool_fn fn, void *ctx);

#endif
