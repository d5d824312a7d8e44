/* server/engine/engine_test.h — for tests and fuzz targets only: the parts of the
 * scheduler (server/engine/engine.h) that no production code calls.
 *
 * A test thread may block on a job and hold the scheduler so that several
 * jobs start in the same step; the server's own threads learn of events
 * through spec.notify instead and never pause the scheduler.
 *
 * Implemented in server/engine/engine.c and server/engine/engine_jobs.c; nothing under
 * server/ other than those two includes this header.
 */
#ifndef DARKSERVE_SERVER_ENGINE_TEST_H
#define DARKSERVE_SERVER_ENGINE_TEST_H

#include <stdint.h>

#include "server/engine/engine.h"

/* Any thread. hold = 1: jobs are still accepted but none is admitted to run
 * (running ones continue) until hold = 0; tests use it to make several jobs
 * start in the same step. Deadlines and cancellation still apply to held
 * jobs; stop() releases the hold. */
void srv_engine_hold(srv_engine_t *e, int hold);

/* Blocks until the job has an event to pop or timeout_ms passes (< 0 = no
 * limit). Returns 1 if an event is ready, 0 on timeout. For threads that may
 * block; the loop thread uses notify. */
int srv_job_wait(srv_job_t *job, int64_t timeout_ms);

#endif
