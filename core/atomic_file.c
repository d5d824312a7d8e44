/* core/atomic_file.c — replacing a file atomically (core/atomic_file.h).
 *
 * The order is what makes it atomic and durable: the data reaches the disk
 * (fsync of the temp file) before the rename makes it visible under the
 * target's name, and the rename reaches the disk (fsync of the directory)
 * before the caller is told it is done. The temp file lives in the target's
 * directory, so the rename never crosses file systems.
 */
#include "core/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"

/* Records the failed step and errno e; removes the temp file unless it was
 * renamed. Returns CORE_EIO. */
static int fail(core_afile_t *af, const char *step, int e)
{
    af->step = step;
    af->errnum = e;
    core_afile_abort(af);
    return CORE_EIO;
}

int core_afile_open(core_afile_t *af, int dirfd, const char *name, const char *tmp, unsigned mode)
{
    if (!af)
        return CORE_EINVAL;
    memset(af, 0, sizeof *af);
    af->dirfd = dirfd;
    af->name = name;
    af->fd = -1;
    af->step = "creating";
    if (!name || !tmp) {
        af->errnum = EINVAL;
        return CORE_EINVAL;
    }
    size_t n = strlen(tmp);
    if (n >= sizeof af->tmp) {
        af->errnum = ENAMETOOLONG;
        return CORE_EIO;
    }
    memcpy(af->tmp, tmp, n + 1);
    const int templ = n >= 6 && strcmp(tmp + n - 6, "XXXXXX") == 0;
    if (templ && dirfd != AT_FDCWD) {
        af->errnum = EINVAL;
        af->tmp[0] = '\0';
        return CORE_EINVAL;
    }
    af->fd = templ ? mkostemp(af->tmp, O_CLOEXEC)
                   : openat(dirfd, af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                            (mode_t)mode);
    if (af->fd < 0) {
        af->errnum = errno;
        af->tmp[0] = '\0'; /* nothing to remove */
        return CORE_EIO;
    }
    af->step = NULL;
    return 0;
}

int core_afile_write(core_afile_t *af, const void *buf, size_t n)
{
    if (!af || af->fd < 0 || (n && !buf))
        return CORE_EINVAL;
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = af->write_fn ? af->write_fn(af->fd, p, n, af->write_ud) : write(af->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return fail(af, "writing", w == 0 ? ENOSPC : errno);
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* fsync of the directory af->name is in. */
static int sync_dir(const core_afile_t *af)
{
    if (af->dirfd != AT_FDCWD)
        return fsync(af->dirfd);
    char d[PATH_MAX];
    const char *slash = strrchr(af->name, '/');
    if (!slash) {
        snprintf(d, sizeof d, ".");
    } else {
        size_t k = slash == af->name ? 1 : (size_t)(slash - af->name); /* "/x": "/" */
        if (k >= sizeof d) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(d, af->name, k);
        d[k] = '\0';
    }
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    errno = e;
    return rc;
}

int core_afile_commit(core_afile_t *af)
{
    if (!af || af->fd < 0)
        return CORE_EINVAL;
    if (fsync(af->fd) < 0)
        return fail(af, "syncing", errno);
    int cr = close(af->fd);
    af->fd = -1;
    if (cr < 0)
        return fail(af, "closing", errno);
    int e = af->before_rename ? af->before_rename(af->hook_ud) : 0;
    if (e)
        return fail(af, "renaming", e);
    if (renameat(af->dirfd, af->tmp, af->dirfd, af->name) < 0)
        return fail(af, "renaming", errno);
    af->renamed = 1;
    af->tmp[0] = '\0';
    if (sync_dir(af) < 0) {
        af->step = "syncing the directory";
        af->errnum = errno;
        return CORE_EIO;
    }
    return 0;
}

void core_afile_abort(core_afile_t *af)
{
    if (!af)
        return;
    if (af->fd >= 0) {
        close(af->fd);
        af->fd = -1;
    }
    if (af->tmp[0]) {
        unlinkat(af->dirfd, af->tmp, 0);
        af->tmp[0] = '\0';
    }
}
