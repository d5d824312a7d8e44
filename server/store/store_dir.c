/* server/store/store_dir.c — the session directory (server/store/store.h "Disk",
 * "Crashes"): writing, reading, renaming and deleting its files, the names
 * of checkpoint files, and opening it (the lock, the scan at startup).
 *
 * Files are named by the session id and created through a directory fd, so
 * no path is ever built from input other than an id validated as 32 hex
 * chars. A write goes to "<id>.tmp" first; startup deletes such leftovers.
 * A checkpoint is the file "<id>.<turns>", or "<id>.<turns>.<generation>"
 * after an import (store.h "Turns and checkpoints", "Crashes"), never
 * written in place: it is the session's previous file, hard-linked before
 * the new one is renamed over it, or a whole file an import writes; a
 * rollback renames it back over "<id>".
 *
 * It knows files, not sessions: the scan returns what it found, and the
 * table (store_table.c) decides what belongs to whom. It calls only
 * store_base.c and store_codec.c (store_impl.h says who calls whom).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/state.h"

#define TMP_SUFFIX ".tmp"

#define LOCK_NAME ".lock"

#define PROBE_NAME ".write-probe"

/* ---- files ---- */

/* 0, or the errno an injected fault makes op fail with (errno set too). */
int srv_sess_fault(const srv_store_t *st, const char *op)
{
    int e = st->fault_fn ? st->fault_fn(op, st->fault_ud) : 0;
    if (e)
        errno = e;
    return e;
}

/* write(2) for session files, behind the injected faults and the test's
 * write function (core_afile_write_fn). */
static ssize_t do_write(int fd, const void *p, size_t n, void *ud)
{
    srv_store_t *st = ud;
    if (srv_sess_fault(st, "write"))
        return -1;
    return st->write_fn ? st->write_fn(fd, p, n, st->write_ud) : write(fd, p, n);
}

/* A file system that has no room or takes no writes: the client is told
 * so (507), apart from other I/O errors. */
int srv_sess_io_code(int e)
{
    return e == ENOSPC || e == EDQUOT || e == EROFS ? SRV_STORE_ENOSPACE : SRV_STORE_EIO;
}

/* What happens right before the rename of a write (core_afile_hook_fn):
 * the hard link of the previous file, then the injected fault. */
typedef struct link_hook {
    srv_store_t *st;
    const char *id, *link_as; /* link_as NULL: no link */
    int *linked;
} link_hook_t;

static int before_rename(void *ud)
{
    link_hook_t *h = ud;
    if (h->link_as) {
        unlinkat(h->st->dirfd, h->link_as, 0);
        *h->linked = !srv_sess_fault(h->st, "link") &&
                     linkat(h->st->dirfd, h->id, h->st->dirfd, h->link_as, 0) == 0;
    }
    return srv_sess_fault(h->st, "rename");
}

/* Atomic replace of file id (a session's, or a checkpoint's name): tmp,
 * fsync, rename, fsync of the directory (core/atomic_file.h). On failure
 * the previous file is untouched and the temp file removed. link_as (NULL =
 * none): before the rename, the previous file is hard-linked under that
 * name too (a stale file of that name is replaced), so it survives the
 * rename: *linked = 1 when it was (a link that fails only means no link); a
 * failed rename removes the link again. */
int srv_sess_write_file_link(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                             const char *link_as, int *linked, char *err, size_t errlen)
{
    char tmp[CKPT_NAME_MAX + sizeof TMP_SUFFIX], eb[128]; /* a checkpoint's name, too */
    snprintf(tmp, sizeof tmp, "%s" TMP_SUFFIX, id);
    core_afile_t af;
    int e = srv_sess_fault(st, "create");
    if (!e && core_afile_open(&af, st->dirfd, id, tmp, 0600) < 0)
        e = af.errnum;
    if (e)
        return STORE_FAIL(err, errlen, srv_sess_io_code(e), "cannot create %s/%s: %s", st->dir, tmp,
                          srv_sess_errstr(e, eb, sizeof eb));
    link_hook_t hook = {.st = st, .id = id, .link_as = link_as, .linked = linked};
    af.write_fn = do_write;
    af.write_ud = st;
    af.before_rename = before_rename;
    af.hook_ud = &hook;
    if (core_afile_write(&af, buf, len) == 0 && core_afile_commit(&af) == 0)
        return 0;
    if (af.renamed) /* the new file is in place; its name may not be durable */
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "syncing directory %s after writing %s: %s",
                          st->dir, id, srv_sess_errstr(af.errnum, eb, sizeof eb));
    if (link_as && *linked) { /* the rename failed: the link goes too */
        unlinkat(st->dirfd, link_as, 0);
        *linked = 0;
    }
    return STORE_FAIL(err, errlen, srv_sess_io_code(af.errnum),
                      "%s %s/%s: %s (the previous file is kept)", af.step, st->dir, tmp,
                      srv_sess_errstr(af.errnum, eb, sizeof eb));
}

int srv_sess_write_file(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                        char *err, size_t errlen)
{
    return srv_sess_write_file_link(st, id, buf, len, NULL, NULL, err, errlen);
}

/* Whole file id (new malloc'd *out). ENOTFOUND if it is gone, EIO else. */
int srv_sess_read_file(srv_store_t *st, const char *id, unsigned char **out, size_t *len, char *err,
                       size_t errlen)
{
    char eb[128];
    int fd =
        srv_sess_fault(st, "read") ? -1 : openat(st->dirfd, id, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        return e == ENOENT ? STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "opening %s/%s: %s",
                                        st->dir, id, srv_sess_errstr(e, eb, sizeof eb))
                           : STORE_FAIL(err, errlen, SRV_STORE_EIO, "opening %s/%s: %s", st->dir,
                                        id, srv_sess_errstr(e, eb, sizeof eb));
    }
    struct stat sb;
    unsigned char *buf = NULL;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "stat %s/%s: %s", st->dir, id,
                          srv_sess_errstr(e, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > st->max_blob) {
        close(fd);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO,
                          "%s/%s: not a regular file of at most %zu bytes", st->dir, id,
                          st->max_blob);
    }
    size_t n = (size_t)sb.st_size, off = 0;
    buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory reading %zu bytes of %s/%s",
                          n, st->dir, id);
    }
    while (off < n) {
        ssize_t r = pread(fd, buf + off, n - off, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r == 0 ? EIO : errno;
            close(fd);
            free(buf);
            return STORE_FAIL(err, errlen, SRV_STORE_EIO, "reading %s/%s: %s", st->dir, id,
                              r == 0 ? "file shrank while reading"
                                     : srv_sess_errstr(e, eb, sizeof eb));
        }
        off += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

/* Loads session file name (a session's, or a checkpoint's) into a fresh
 * context *c; its metadata into *m (may be NULL; free m->in). */
int srv_sess_load_file(srv_store_t *st, const char *name, srv_seq_ctx_t *c, meta_t *m, char *err,
                       size_t errlen)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    if (m)
        memset(m, 0, sizeof *m);
    int rc = srv_sess_read_file(st, name, &buf, &len, err, errlen);
    if (rc < 0)
        return rc;
    char what[600];
    snprintf(what, sizeof what, "session file %s/%s", st->dir, name);
    rc = srv_sess_load_blob(st, buf, len, what, c, m, err, errlen);
    free(buf);
    return rc;
}

/* Deletes file name of the directory (a session's or a checkpoint's) behind
 * the "unlink" fault point: 0, also when it was gone already; else
 * ENOSPACE / EIO naming the file and the errno (the file stays). */
int srv_sess_dir_unlink(srv_store_t *st, const char *name, char *err, size_t errlen)
{
    if ((srv_sess_fault(st, "unlink") || unlinkat(st->dirfd, name, 0) < 0) && errno != ENOENT) {
        char eb[128];
        int e = errno;
        return STORE_FAIL(err, errlen, srv_sess_io_code(e), "deleting %s/%s: %s", st->dir, name,
                          srv_sess_errstr(e, eb, sizeof eb));
    }
    return 0;
}

/* Deletes file name, best effort and without a fault point: the clean-up
 * of a file nothing refers to (startup deletes what is left). */
void srv_sess_dir_remove(srv_store_t *st, const char *name)
{
    unlinkat(st->dirfd, name, 0);
}

/* Renames file from over file to behind the "rename" fault point, then
 * syncs the directory (a failed sync is the disk's business: the rename is
 * done). ENOTFOUND when from is gone, else ENOSPACE / EIO; either way
 * nothing was renamed. */
int srv_sess_dir_rename(srv_store_t *st, const char *from, const char *to, char *err, size_t errlen)
{
    if (srv_sess_fault(st, "rename") || renameat(st->dirfd, from, st->dirfd, to) < 0) {
        char eb[128];
        int e = errno;
        return STORE_FAIL(err, errlen, e == ENOENT ? SRV_STORE_ENOTFOUND : srv_sess_io_code(e),
                          "renaming %s/%s to %s: %s (nothing was renamed)", st->dir, from, to,
                          srv_sess_errstr(e, eb, sizeof eb));
    }
    (void)fsync(st->dirfd);
    return 0;
}

/* 1 when the directory has a file (of any kind) called name. */
int srv_sess_dir_exists(const srv_store_t *st, const char *name)
{
    return faccessat(st->dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* ---- names ---- */

void srv_sess_ckpt_name(char out[CKPT_NAME_MAX], const char *id, int64_t turn, uint64_t gen)
{
    if (gen)
        snprintf(out, CKPT_NAME_MAX, "%s.%lld.%llu", id, (long long)turn, (unsigned long long)gen);
    else
        snprintf(out, CKPT_NAME_MAX, "%s.%lld", id, (long long)turn);
}

/* The decimal number at *pd up to the next '.' or the end (*pd moved
 * there), at most max; -1 when there is none, it has a leading zero (one
 * spelling per number) or it is over max. */
static int64_t parse_num(const char **pd, int64_t max)
{
    const char *d = *pd;
    if (*d < '0' || *d > '9' || (d[0] == '0' && d[1] != '\0' && d[1] != '.'))
        return -1;
    int64_t v = 0;
    for (; *d && *d != '.'; d++) {
        if (*d < '0' || *d > '9' || v > (max - (*d - '0')) / 10)
            return -1;
        v = v * 10 + (*d - '0');
    }
    *pd = d;
    return v;
}

/* The turns of checkpoint file name "<id>.<turns>" or "<id>.<turns>.<gen>"
 * (id into id[], the generation into *gen, 0 when the name has none), or
 * -1. A generation is never 0 in a name. */
static int64_t ckpt_parse_name(const char *name, char id[ID_LEN + 1], uint64_t *gen)
{
    size_t nl = strlen(name);
    if (nl < ID_LEN + 2 || nl >= CKPT_NAME_MAX || name[ID_LEN] != '.')
        return -1;
    memcpy(id, name, ID_LEN);
    id[ID_LEN] = '\0';
    if (!srv_session_id_valid(id))
        return -1;
    const char *d = name + ID_LEN + 1;
    int64_t t = parse_num(&d, INT64_MAX), g = 0;
    if (t >= 0 && *d == '.') {
        d++;
        g = parse_num(&d, INT64_MAX);
        if (g <= 0)
            return -1;
    }
    if (t < 0 || *d != '\0')
        return -1;
    *gen = (uint64_t)g;
    return t;
}

/* ---- opening the directory ---- */

static int mkdirs(const char *path, char *err, size_t errlen)
{
    char eb[128];
    char *p = strdup(path);
    if (!p)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
    for (char *q = p + 1;; q++) {
        if (*q == '/' || *q == '\0') {
            char c = *q;
            *q = '\0';
            if (mkdir(p, 0700) < 0 && errno != EEXIST) {
                int rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot create directory %s: %s", p,
                                    srv_sess_errstr(errno, eb, sizeof eb));
                free(p);
                return rc;
            }
            *q = c;
            if (c == '\0')
                break;
        }
    }
    free(p);
    return 0;
}

/* Could a blob with attention config b load here (header fields only; the
 * learned parameters and an exact state's length are checked on load)? */
static int cfg_compatible(const core_attn_cfg_t *b, const core_attn_cfg_t *c)
{
    if (b->kind != c->kind || b->n_layer != c->n_layer || b->n_head != c->n_head ||
        b->n_head_kv != c->n_head_kv || b->head_dim != c->head_dim)
        return 0;
    return c->kind == CORE_ATTN_EXACT ||
           (b->n_features == c->n_features && b->window == c->window && b->seed == c->seed);
}

/* Appends a zeroed entry to *f (*n used, *cap allocated): NULL when out of
 * memory. */
static srv_found_t *found_push(srv_found_t **f, size_t *n, size_t *cap)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        srv_found_t *nf = realloc(*f, c * sizeof *nf);
        if (!nf)
            return NULL;
        *f = nf;
        *cap = c;
    }
    srv_found_t *e = &(*f)[(*n)++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Lists the session files and checkpoint files of this model in the
 * directory (their headers only) into *found[*n] (malloc'd), and deletes
 * temp files a crash left. Files that are not ours, or are for another
 * model or attention configuration, are left alone and not listed (the
 * server may be restarted with the configuration they belong to). Which
 * checkpoint belongs to which session is the table's to decide
 * (srv_sess_table_load). */
static int scan_dir(srv_store_t *st, srv_found_t **found, size_t *n_found, char *err, size_t errlen)
{
    char eb[128];
    const core_attn_cfg_t *cfg = core_attn_config(st->attn);
    int fd2 = dup(st->dirfd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    *found = NULL;
    *n_found = 0;
    if (!d) {
        if (fd2 >= 0)
            close(fd2);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot list %s: %s", st->dir,
                          srv_sess_errstr(errno, eb, sizeof eb));
    }
    size_t head_cap = CORE_STATE_HEADER_BYTES + CORE_STATE_MAX_OWNER, cap_found = 0;
    unsigned char *head = malloc(head_cap);
    int rc = head ? 0 : STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        size_t nl = strlen(name);
        char id[ID_LEN + 1];
        if (nl > ID_LEN && strcmp(name + nl - strlen(TMP_SUFFIX), TMP_SUFFIX) == 0) {
            char base[CKPT_NAME_MAX];
            size_t bl = nl - strlen(TMP_SUFFIX);
            if (bl < sizeof base) {
                memcpy(base, name, bl);
                base[bl] = '\0';
                uint64_t g;
                if (srv_session_id_valid(base) || ckpt_parse_name(base, id, &g) >= 0)
                    unlinkat(st->dirfd, name, 0); /* a write that never reached its rename */
            }
            continue;
        }
        uint64_t gen = 0;
        int64_t turn = ckpt_parse_name(name, id, &gen);
        if (turn < 0 && !srv_session_id_valid(name))
            continue;
        int fd = openat(st->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat sb;
        if (fd < 0)
            continue;
        if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
            close(fd);
            continue;
        }
        size_t want = (uint64_t)sb.st_size < head_cap ? (size_t)sb.st_size : head_cap, got = 0;
        while (got < want) {
            ssize_t r = pread(fd, head + got, want - got, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        close(fd);
        core_state_info_t in;
        int ours = core_state_peek(head, got, &in, NULL) == 0 &&
                   strcmp(in.fingerprint, st->fp) == 0 && cfg_compatible(&in.cfg, cfg);
        /* A session file for this model whose size disagrees with its header
         * was cut short (or grew) behind our back: it is listed all the
         * same, so that using it answers with what is wrong ("truncated")
         * instead of 404. A checkpoint file is listed to be kept or deleted. */
        if (turn < 0 && !ours)
            continue;
        srv_found_t *e = found_push(found, n_found, &cap_found);
        if (!e) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
            break;
        }
        memcpy(e->id, turn >= 0 ? id : name, ID_LEN + 1);
        e->turn = turn;
        e->bytes = (size_t)sb.st_size;
        if (turn >= 0) {
            e->gen = gen;
            e->ok = ours && in.total == (uint64_t)sb.st_size && in.n_checkpoints == 0;
            e->tokens = e->ok ? in.pos + (int64_t)in.n_pending : 0;
            continue;
        }
        e->tokens = in.pos + (int64_t)in.n_pending;
        e->o = (owner_t){
            .created = (int64_t)sb.st_mtime, .last_used = (int64_t)sb.st_mtime, .owner = ""};
        if (in.owner_off + in.owner_len <= got)
            srv_sess_owner_parse(head + in.owner_off, in.owner_len, &e->o);
        e->o.in = NULL; /* they pointed into head */
        e->o.pg = NULL;
    }
    free(head);
    closedir(d);
    if (rc < 0) {
        free(*found);
        *found = NULL;
        *n_found = 0;
    }
    return rc;
}

int srv_sess_open_dir(srv_store_t *st, srv_found_t **found, size_t *n, char *err, size_t errlen)
{
    char eb[128];
    *found = NULL;
    *n = 0;
    int rc = mkdirs(st->dir, err, errlen);
    if (rc < 0)
        return rc;
    st->dirfd = open(st->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->dirfd < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot open session directory %s: %s",
                          st->dir, srv_sess_errstr(errno, eb, sizeof eb));
    st->lockfd = openat(st->dirfd, LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (st->lockfd < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot write in session directory %s: %s",
                          st->dir, srv_sess_errstr(errno, eb, sizeof eb));
    if (flock(st->lockfd, LOCK_EX | LOCK_NB) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO,
                          "session directory %s is in use by another process (%s)", st->dir,
                          srv_sess_errstr(errno, eb, sizeof eb));
    /* Permissions alone do not tell (root, read-only mounts): try a write. */
    int pfd =
        openat(st->dirfd, PROBE_NAME, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (pfd < 0 || write(pfd, "x", 1) != 1) {
        int e = errno;
        if (pfd >= 0)
            close(pfd);
        unlinkat(st->dirfd, PROBE_NAME, 0);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot write in session directory %s: %s",
                          st->dir, srv_sess_errstr(e, eb, sizeof eb));
    }
    close(pfd);
    unlinkat(st->dirfd, PROBE_NAME, 0);
    return scan_dir(st, found, n, err, errlen);
}

/* ---- failure injection ---- */

void srv_store_set_write_fn(srv_store_t *st, srv_store_write_fn fn, void *ud)
{
    pthread_mutex_lock(&st->mu);
    st->write_fn = fn;
    st->write_ud = ud;
    pthread_mutex_unlock(&st->mu);
}

void srv_store_set_fault_fn(srv_store_t *st, srv_store_fault_fn fn, void *ud)
{
    pthread_mutex_lock(&st->mu);
    st->fault_fn = fn;
    st->fault_ud = ud;
    pthread_mutex_unlock(&st->mu);
}
