/* server/api/api_faults.c — fault injection for the session store, for tests
 * of what clients see when the disk fails (tests/integration/test_faults.py)
 * or when sessions race for memory (test_evicted_sessions.py).
 *
 * DARKSERVE_TEST_FAULT_FILE=PATH in the environment at startup names a file
 * that is read before every operation that changes the session directory;
 * its first word decides what that operation does:
 *   enospc   writes fail with ENOSPC (a full disk)
 *   erofs    creating, renaming and deleting files fail with EROFS (a
 *            read-only file system)
 *   stall    each write writes half of its bytes, then waits while the file
 *            still says "stall" (a slow disk: a test can kill -9 the server
 *            in the middle of a state write, or see who waits for it);
 *            reading a session file back waits likewise before it starts
 *   evict-after-read
 *            each time the I/O thread has read an evicted session back for
 *            a request (api_session_acquire), every idle session in memory
 *            goes back to disk at once (srv_store_trim to 0 bytes), as if
 *            other requests had pushed it out again before the handler ran
 *            a second time: the request must not then read it on the loop
 *   evict-before-acquire
 *            each time a handler is about to acquire its session on the
 *            loop thread (api_session_acquire), every idle session in
 *            memory whose file is current is dropped from memory (a trim to
 *            0 bytes on the loop, which writes nothing there), as if the
 *            I/O thread had evicted it in the instant after the handler
 *            found it in memory: the request must go round through the I/O
 *            thread, not read the file on the loop (here every time, so it
 *            ends 503 session_store_busy)
 *   evict-before-acquire-stall
 *            the same, and reading a session file back waits while the
 *            file still says so (as with stall): a test sees which thread
 *            reads (the loop must keep answering), then lets it through
 *   kill-at N
 *            the process kills itself (SIGKILL, as kill -9 would) right
 *            before the Nth operation that changes the session directory
 *            (each create, write, link, rename and unlink the store's fault
 *            points see, counted from the first one in this mode; reads do
 *            not count), after logging which one: a test crashes a store
 *            change at each of its steps in turn and checks what a restart
 *            finds (tests/integration/test_store_crash.py)
 *   anything else, or no file: normal operation.
 * Reading a small file per operation costs microseconds next to the fsync
 * that follows; without the variable nothing is installed.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char fault_path[1024];
static atomic_long kill_points; /* operations counted in kill-at mode so far */

/* The file's first word into mode[32] ("" when none), and the number after
 * it into *arg when arg is not NULL (0 when none). */
static void fault_mode_arg(char mode[32], long *arg)
{
    mode[0] = '\0';
    if (arg)
        *arg = 0;
    FILE *f = fopen(fault_path, "r");
    if (!f)
        return;
    char num[32];
    if (fscanf(f, "%31s", mode) != 1)
        mode[0] = '\0';
    else if (arg && fscanf(f, "%31s", num) == 1)
        *arg = strtol(num, NULL, 10);
    fclose(f);
}

static void fault_mode(char mode[32])
{
    fault_mode_arg(mode, NULL);
}

/* kill-at N: the Nth counted operation does not happen, nor anything after
 * it. The log line is written whole before the signal (one write(2)). */
static void kill_at(const char *op, long n)
{
    long k = atomic_fetch_add(&kill_points, 1) + 1;
    if (n > 0 && k >= n) {
        SRV_LOG(SRV_LOG_WARN, NULL,
                "kill-at %ld: killing the process before store operation %ld (%s)", n, k, op);
        raise(SIGKILL);
    }
}

static int fault_op(const char *op, void *ud)
{
    (void)ud;
    char mode[32];
    long arg = 0;
    fault_mode_arg(mode, &arg);
    if (strcmp(mode, "kill-at") == 0 && strcmp(op, "read") != 0)
        kill_at(op, arg);
    if (strcmp(mode, "enospc") == 0 && strcmp(op, "write") == 0)
        return ENOSPC;
    if (strcmp(mode, "erofs") == 0 && strcmp(op, "write") != 0 && strcmp(op, "read") != 0)
        return EROFS;
    while (strcmp(op, "read") == 0 &&
           (strcmp(mode, "stall") == 0 || strcmp(mode, "evict-before-acquire-stall") == 0)) {
        nanosleep(&(struct timespec){0, 20L * 1000 * 1000}, NULL);
        fault_mode(mode);
    }
    return 0;
}

static ssize_t fault_write(int fd, const void *buf, size_t n, void *ud)
{
    (void)ud;
    char mode[32];
    fault_mode(mode);
    if (strcmp(mode, "stall") != 0 || n < 2)
        return write(fd, buf, n);
    ssize_t w = write(fd, buf, n / 2);
    while (fault_mode(mode), strcmp(mode, "stall") == 0)
        nanosleep(&(struct timespec){0, 20L * 1000 * 1000}, NULL);
    return w;
}

void api_store_fault_install(srv_store_t *st)
{
    const char *p = getenv("DARKSERVE_TEST_FAULT_FILE");
    if (!p || !*p)
        return;
    snprintf(fault_path, sizeof fault_path, "%s", p);
    srv_store_set_fault_fn(st, fault_op, NULL);
    srv_store_set_write_fn(st, fault_write, NULL);
    SRV_LOG(SRV_LOG_WARN, NULL,
            "DARKSERVE_TEST_FAULT_FILE=%s: session store faults injected from "
            "that file (testing only)",
            fault_path);
}

/* Every idle session out of memory (srv_store_trim to 0 bytes) when the
 * mode begins with word. */
static void evict_in_mode(srv_store_t *st, const char *word)
{
    if (!fault_path[0])
        return;
    char mode[32];
    fault_mode(mode);
    if (strncmp(mode, word, strlen(word)) == 0)
        srv_store_trim(st, 0, NULL, 0);
}

void api_store_fault_after_read(srv_store_t *st)
{
    evict_in_mode(st, "evict-after-read");
}

void api_store_fault_before_acquire(srv_store_t *st)
{
    evict_in_mode(st, "evict-before-acquire"); /* and evict-before-acquire-stall */
}
