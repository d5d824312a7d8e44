/* core/atomic_file.h — replacing a file atomically: write a temp file next
 * to the target, fsync it, rename it over the target, fsync the directory.
 * A crash or an error leaves either the old file or the new one, never a
 * torn one; an error also removes the temp file.
 *
 * The steps are separate calls so that a caller can stream the contents in
 * pieces (core/gguf_write.c) and hook into the sequence (server/store/store_dir.c:
 * failure injection around write(2) and the rename, a hard link of the old
 * file taken just before it is replaced). Names are relative to a directory
 * fd (AT_FDCWD: the working directory, or absolute paths).
 *
 *     core_afile_t af;
 *     if (core_afile_open(&af, dirfd, "name", "name.tmp", 0600) < 0 ||
 *         core_afile_write(&af, buf, len) < 0 || core_afile_commit(&af) < 0)
 *         ... af.step failed with errno af.errnum (af.renamed: the new file
 *             is in place and only the directory's fsync failed) ...
 *
 * Each call returns 0, or CORE_EIO (CORE_EINVAL for bad arguments) with
 * the failed step and its errno in the handle; a failure of open, write or
 * commit (before the rename) has already closed and removed the temp file.
 * Not thread-safe per handle; independent handles are.
 */
#ifndef DARKSERVE_CORE_ATOMIC_FILE_H
#define DARKSERVE_CORE_ATOMIC_FILE_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

/* Replaces write(2) for core_afile_write (failure injection): returns what
 * write(2) would, errno set on -1. */
typedef ssize_t (*core_afile_write_fn)(int fd, const void *buf, size_t n, void *ud);
/* Runs after the temp file is synced and closed, right before the rename:
 * 0 to go on, or an errno value the rename then fails with. */
typedef int (*core_afile_hook_fn)(void *ud);

typedef struct core_afile {
    int dirfd;          /* the directory the names are relative to */
    const char *name;   /* the target (borrowed until commit or abort) */
    char tmp[PATH_MAX]; /* the temp file's name */
    int fd;             /* the temp file while it is open, else -1 */
    int renamed;        /* the new file is in place */
    /* set by the caller after open (zeroed by it); NULL: none */
    core_afile_write_fn write_fn;
    void *write_ud;
    core_afile_hook_fn before_rename;
    void *hook_ud;
    /* the failure: "creating", "writing", "syncing", "closing", "renaming",
     * "syncing the directory" (static strings), and its errno */
    const char *step;
    int errnum;
} core_afile_t;

/* Creates the temp file tmp (borrowed, copied; at most PATH_MAX - 1 bytes)
 * for replacing name, with mode as open(2) takes it. A tmp ending in
 * "XXXXXX" is a template made unique as by mkstemp(3), created 0600 whatever
 * mode says (fchmod af->fd to change it), and only with dirfd == AT_FDCWD
 * (else EINVAL); any other tmp is created or truncated, never through a
 * symbolic link. */
int core_afile_open(core_afile_t *af, int dirfd, const char *name, const char *tmp, unsigned mode);
/* Appends buf[n] (borrowed) to the temp file, through af->write_fn when
 * set; a write that makes no progress is ENOSPC. */
int core_afile_write(core_afile_t *af, const void *buf, size_t n);
/* fsync and close the temp file, af->before_rename, rename it over the
 * target, fsync the directory. */
int core_afile_commit(core_afile_t *af);
/* Gives up: closes and removes the temp file (the target is untouched).
 * A no-op once the temp file is gone (after a failure or a commit). */
void core_afile_abort(core_afile_t *af);

#endif
