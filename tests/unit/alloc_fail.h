/* alloc_fail.h — every allocation failing in turn under jansson: a test's
 * op() (1 when it succeeded) is run once to count the allocations it makes,
 * then once with each of them failing, and must come back cleanly each time
 * (no crash, no leak under ASan) and fail at least once.
 *
 * One test file includes it once (its counters are the file's). */
#ifndef DARKSERVE_TESTS_ALLOC_FAIL_H
#define DARKSERVE_TESTS_ALLOC_FAIL_H

#include <jansson.h>
#include <stdlib.h>

#include "tests/unit/check.h"

static long countdown = -1, calls;

static void *failing_malloc(size_t n)
{
    calls++;
    if (countdown >= 0 && countdown-- == 0)
        return NULL;
    return malloc(n);
}

/* Runs op with no failure, then with its k-th allocation failing for every
 * k, then with none again; jansson's allocator is restored after. */
static void check_alloc_failures(int (*op)(void))
{
    json_malloc_t om;
    json_free_t of;
    json_get_alloc_funcs(&om, &of);
    json_set_alloc_funcs(failing_malloc, free);
    countdown = -1;
    calls = 0;
    CHECK(op());
    long total = calls;
    int failures = 0;
    for (long k = 0; k < total; k++) {
        countdown = k;
        failures += !op();
    }
    countdown = -1;
    CHECK(op());
    json_set_alloc_funcs(om, of);
    CHECK(total > 0 && failures > 0);
}

#endif
