/* tests/unit/test_core_atomic_file.c — core/atomic_file.h: a file replaced
 * whole, and every failure (create, write, a write that makes no progress,
 * the rename) leaving the old file as it was and no temp file behind, by a
 * directory fd and by path (a mkstemp template).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/err.h"
#include "tests/unit/check.h"

static char *mkdir_tmp(void)
{
    const char *base = getenv("TMPDIR");
    char t[512];
    snprintf(t, sizeof t, "%s/ds_afile_XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(t);
    return d ? strdup(d) : NULL;
}

/* Files in dir (not . or ..). */
static int n_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* 1 when file name in dirfd holds exactly s. */
static int holds(int dirfd, const char *name, const char *s)
{
    char buf[256];
    int fd = openat(dirfd, name, O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n == (ssize_t)strlen(s) && memcmp(buf, s, (size_t)n) == 0;
}

static void rm_dir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

/* Writes s as name (through tmp) in dirfd; the result of the first step
 * that fails. */
static int put(core_afile_t *af, int dirfd, const char *name, const char *tmp, const char *s)
{
    int rc = core_afile_open(af, dirfd, name, tmp, 0600);
    if (rc == 0)
        rc = core_afile_write(af, s, strlen(s));
    if (rc == 0)
        rc = core_afile_commit(af);
    return rc;
}

TEST(replaces_a_file)
{
    char *dir = mkdir_tmp();
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY) : -1;
    CHECK(dfd >= 0);
    if (dfd < 0)
        goto out;
    core_afile_t af;
    CHECK_INT_EQ(put(&af, dfd, "f", "f.tmp", "first"), 0);
    CHECK(af.renamed);
    CHECK(holds(dfd, "f", "first"));
    CHECK_INT_EQ(put(&af, dfd, "f", "f.tmp", "second, longer"), 0);
    CHECK(holds(dfd, "f", "second, longer"));
    CHECK_INT_EQ(n_files(dir), 1); /* no temp file left */
    struct stat sb;
    CHECK(fstatat(dfd, "f", &sb, 0) == 0 && (sb.st_mode & 0777) == 0600);
    /* a stale temp file (a crash) is overwritten, not in the way */
    int fd = openat(dfd, "g.tmp", O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0 && write(fd, "stale stale stale", 17) == 17);
    if (fd >= 0)
        close(fd);
    CHECK_INT_EQ(put(&af, dfd, "g", "g.tmp", "new"), 0);
    CHECK(holds(dfd, "g", "new"));
    CHECK_INT_EQ(n_files(dir), 2);
    close(dfd);
out:
    rm_dir(dir);
}

static ssize_t failing_write(int fd, const void *buf, size_t n, void *ud)
{
    int *calls = ud;
    if ((*calls)++ == 0) /* the first write goes through, in part */
        return write(fd, buf, n > 2 ? 2 : n);
    errno = ENOSPC;
    return -1;
}

static ssize_t stuck_write(int fd, const void *buf, size_t n, void *ud)
{
    (void)fd;
    (void)buf;
    (void)n;
    (void)ud;
    return 0;
}

static int refuse_rename(void *ud)
{
    int *ran = ud;
    *ran = 1;
    return EROFS;
}

TEST(failures_keep_the_old_file)
{
    char *dir = mkdir_tmp();
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY) : -1;
    CHECK(dfd >= 0);
    if (dfd < 0)
        goto out;
    core_afile_t af;
    CHECK_INT_EQ(put(&af, dfd, "f", "f.tmp", "old"), 0);

    /* write(2) fails half way */
    int calls = 0;
    CHECK_INT_EQ(core_afile_open(&af, dfd, "f", "f.tmp", 0600), 0);
    af.write_fn = failing_write;
    af.write_ud = &calls;
    CHECK_INT_EQ(core_afile_write(&af, "a new file", 10), CORE_EIO);
    CHECK_STR_EQ(af.step, "writing");
    CHECK_INT_EQ(af.errnum, ENOSPC);
    CHECK_INT_EQ(af.fd, -1);
    CHECK(!af.renamed);
    CHECK(holds(dfd, "f", "old"));
    CHECK_INT_EQ(n_files(dir), 1);

    /* a write that makes no progress is a full disk */
    CHECK_INT_EQ(core_afile_open(&af, dfd, "f", "f.tmp", 0600), 0);
    af.write_fn = stuck_write;
    CHECK_INT_EQ(core_afile_write(&af, "x", 1), CORE_EIO);
    CHECK_INT_EQ(af.errnum, ENOSPC);
    CHECK(holds(dfd, "f", "old"));
    CHECK_INT_EQ(n_files(dir), 1);

    /* the rename refused (by the hook, as by the file system) */
    int ran = 0;
    CHECK_INT_EQ(core_afile_open(&af, dfd, "f", "f.tmp", 0600), 0);
    CHECK_INT_EQ(core_afile_write(&af, "replacement", 11), 0);
    af.before_rename = refuse_rename;
    af.hook_ud = &ran;
    CHECK_INT_EQ(core_afile_commit(&af), CORE_EIO);
    CHECK(ran);
    CHECK_STR_EQ(af.step, "renaming");
    CHECK_INT_EQ(af.errnum, EROFS);
    CHECK(!af.renamed);
    CHECK(holds(dfd, "f", "old"));
    CHECK_INT_EQ(n_files(dir), 1);

    /* given up between steps */
    CHECK_INT_EQ(core_afile_open(&af, dfd, "f", "f.tmp", 0600), 0);
    CHECK_INT_EQ(core_afile_write(&af, "half", 4), 0);
    core_afile_abort(&af);
    core_afile_abort(&af); /* twice: a no-op */
    CHECK(holds(dfd, "f", "old"));
    CHECK_INT_EQ(n_files(dir), 1);

    /* the temp file cannot be created: nothing is left behind either */
    CHECK_INT_EQ(core_afile_open(&af, dfd, "f", "no/such/dir.tmp", 0600), CORE_EIO);
    CHECK_STR_EQ(af.step, "creating");
    CHECK_INT_EQ(af.errnum, ENOENT);
    core_afile_abort(&af);
    CHECK(holds(dfd, "f", "old"));
    CHECK_INT_EQ(n_files(dir), 1);
    close(dfd);
out:
    rm_dir(dir);
}

TEST(by_path_with_a_template)
{
    char *dir = mkdir_tmp();
    CHECK(dir != NULL);
    if (!dir)
        return;
    char path[600], tmpl[620];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    snprintf(tmpl, sizeof tmpl, "%s.tmp.XXXXXX", path);
    core_afile_t af;
    CHECK_INT_EQ(put(&af, AT_FDCWD, path, tmpl, "v1"), 0);
    CHECK(holds(AT_FDCWD, path, "v1"));
    CHECK_INT_EQ(put(&af, AT_FDCWD, path, tmpl, "v2"), 0);
    CHECK(holds(AT_FDCWD, path, "v2"));
    CHECK_INT_EQ(n_files(dir), 1);
    /* a failed write removes the uniquely named temp file too */
    int calls = 1; /* failing_write fails at once */
    CHECK_INT_EQ(core_afile_open(&af, AT_FDCWD, path, tmpl, 0600), 0);
    CHECK(strncmp(af.tmp, path, strlen(path)) == 0 && strstr(af.tmp, "XXXXXX") == NULL);
    af.write_fn = failing_write;
    af.write_ud = &calls;
    CHECK_INT_EQ(core_afile_write(&af, "v3", 2), CORE_EIO);
    CHECK(holds(AT_FDCWD, path, "v2"));
    CHECK_INT_EQ(n_files(dir), 1);
    /* a template needs a path (mkstemp): not under a directory fd */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK_INT_EQ(core_afile_open(&af, dfd, "m", "m.XXXXXX", 0600), CORE_EINVAL);
    core_afile_abort(&af);
    if (dfd >= 0)
        close(dfd);
    CHECK_INT_EQ(n_files(dir), 1);
    rm_dir(dir);
}

int main(void)
{
    RUN(replaces_a_file);
    RUN(failures_keep_the_old_file);
    RUN(by_path_with_a_template);
    return CHECK_DONE();
}
