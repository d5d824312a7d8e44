/* server/store/store_dir.c — the session directory (server/store/store.h "Disk"):
 * writing and reading session files, deleting them, the directory's
 * budgets, and opening it (the lock, the scan at startup).
 *
 * Files are named by the session id and created through a directory fd, so
 * no path is ever built from input other than an id validated as 32 hex
 * chars. A write goes to "<id>.tmp" first; startup deletes such leftovers.
 * A checkpoint is the file "<id>.<turns>", or "<id>.<turns>.<generation>"
 * after an import (store.h "Turns and checkpoints", "Crashes"), never
 * written in place: it is the session's previous file, hard-linked before
 * the new one is renamed over it, or a whole file an import writes; a
 * rollback renames it back over "<id>".
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* Caller holds mu, s idle: removes s (file first, so a failure keeps it). */
int srv_sess_remove_session(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    if (s->on_disk && (srv_sess_fault(st, "unlink") || unlinkat(st->dirfd, s->id, 0) < 0) &&
        errno != ENOENT) {
        char eb[128];
        int e = errno;
        return STORE_FAIL(err, errlen, srv_sess_io_code(e), "deleting %s/%s: %s", st->dir, s->id,
                          srv_sess_errstr(e, eb, sizeof eb));
    }
    srv_sess_disk_gone(st, s);
    srv_sess_ckpt_drop_from(st, s, 0);
    srv_sess_drop_memory(st, s);
    srv_sess_tab_remove(st, s);
    free(s->ckpt);
    free(s);
    return 0;
}

/* ---- the directory's budgets (caller holds mu) ---- */

/* Is a used less recently than b? (last_used, then the LRU tick; files
 * found at startup have tick 0.) */
static int older(const srv_session_t *a, const srv_session_t *b)
{
    return a->last_used != b->last_used ? a->last_used < b->last_used : a->tick < b->tick;
}

/* Deletes, until the directory's budgets hold (max_disk_files files,
 * checkpoints included, and max_disk_bytes bytes): first the oldest
 * checkpoint of the least recently used idle session that has one, then,
 * when no idle session has any left, the least recently used idle sessions
 * with a file (file and memory). keep (may be NULL) is the session whose
 * write called this: its checkpoints may go, never itself. Busy sessions
 * and sessions under I/O stay, so the budget can be exceeded while they
 * are. Caller holds mu. Returns 0 or the first deletion error (then it
 * stops). */
int srv_sess_trim_disk(srv_store_t *st, const srv_session_t *keep, char *err, size_t errlen)
{
    for (;;) {
        int over_n = st->max_disk_files && st->n_disk + st->n_ckpt_files > st->max_disk_files;
        int over_b = st->max_disk_bytes && st->disk_bytes > st->max_disk_bytes;
        if (!over_n && !over_b)
            return 0;
        if (srv_sess_no_io_here(st)) { /* deleting files waits for srv_store_settle */
            atomic_store(&st->unsettled, 1);
            return 0;
        }
        srv_session_t *v = NULL, *c = NULL;
        for (size_t i = 0; i < st->n; i++) {
            srv_session_t *s = st->tab[i];
            if (s->busy || s->io)
                continue;
            if (s->n_ckpt && (!c || older(s, c)))
                c = s;
            if (s->on_disk && s != keep && (!v || older(s, v)))
                v = s;
        }
        int rc;
        if (c) {
            rc = srv_sess_ckpt_delete(st, c, 0, err, errlen);
        } else if (v) {
            rc = srv_sess_remove_session(st, v, err, errlen);
            if (rc == 0)
                st->disk_evicted++;
        } else {
            return 0;
        }
        if (rc < 0)
            return rc;
    }
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

static int cmp_session(const void *a, const void *b)
{
    const srv_session_t *x = *(const srv_session_t *const *)a,
                        *y = *(const srv_session_t *const *)b;
    return strcmp(x->id, y->id);
}

/* A checkpoint file found at startup. */
typedef struct found_ckpt {
    char id[ID_LEN + 1];
    int64_t turn;
    uint64_t gen; /* the generation its name carries */
    int64_t tokens;
    size_t bytes;
    int ok; /* a whole blob for this model and attention (by its header) */
} found_ckpt_t;

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

static int cmp_found(const void *a, const void *b)
{
    const found_ckpt_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->turn > y->turn) - (x->turn < y->turn);
}

/* Gives the checkpoint files found to their sessions (the table sorted):
 * those a session's file does not reach (turns at or past its count,
 * damaged, or for another configuration) and those of no session are
 * deleted, except checkpoints of a session file for another model, left
 * alone with it; then each session keeps its newest max_ckpt. */
static int attach_found(srv_store_t *st, found_ckpt_t *f, size_t n, char *err, size_t errlen)
{
    if (n > 1)
        qsort(f, n, sizeof *f, cmp_found);
    for (size_t i = 0; i < n; i++) {
        srv_session_t *s = srv_sess_tab_find(st, f[i].id);
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, f[i].id, f[i].turn, f[i].gen);
        if (!s) {
            if (faccessat(st->dirfd, f[i].id, F_OK, AT_SYMLINK_NOFOLLOW) != 0)
                unlinkat(st->dirfd, name, 0); /* orphan */
            continue;
        }
        /* another generation's file is what a crash left of an import:
         * the old set after the new session file was renamed into place,
         * the new set before */
        if (!f[i].ok || f[i].turn >= s->turns || f[i].gen != s->gen) {
            unlinkat(st->dirfd, name, 0);
            continue;
        }
        int rc =
            srv_sess_ckpt_add(st, s, f[i].turn, f[i].tokens, f[i].bytes, f[i].gen, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < st->n; i++)
        srv_sess_ckpt_prune(st, st->tab[i]);
    return 0;
}

/* Registers the session files found in the directory, and their
 * checkpoints; deletes crash leftovers. Files that are not ours, or are for
 * another model or attention configuration, are left alone: not listed,
 * never swept (the server may be restarted with the configuration they
 * belong to). */
static int scan_dir(srv_store_t *st, char *err, size_t errlen)
{
    char eb[128];
    const core_attn_cfg_t *cfg = core_attn_config(st->attn);
    int fd2 = dup(st->dirfd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!d) {
        if (fd2 >= 0)
            close(fd2);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot list %s: %s", st->dir,
                          srv_sess_errstr(errno, eb, sizeof eb));
    }
    size_t head_cap = CORE_STATE_HEADER_BYTES + CORE_STATE_MAX_OWNER;
    unsigned char *head = malloc(head_cap);
    found_ckpt_t *found = NULL;
    size_t n_found = 0, cap_found = 0;
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
        if (turn >= 0) {
            if (n_found == cap_found) {
                size_t cap = cap_found ? 2 * cap_found : 64;
                found_ckpt_t *nf = realloc(found, cap * sizeof *nf);
                if (!nf) {
                    rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
                    break;
                }
                found = nf;
                cap_found = cap;
            }
            found_ckpt_t *fc = &found[n_found++];
            memcpy(fc->id, id, sizeof fc->id);
            fc->turn = turn;
            fc->gen = gen;
            fc->ok = ours && in.total == (uint64_t)sb.st_size && in.n_checkpoints == 0;
            fc->tokens = fc->ok ? in.pos + (int64_t)in.n_pending : 0;
            fc->bytes = (size_t)sb.st_size;
            continue;
        }
        /* A file for this model whose size disagrees with its header was cut
         * short (or grew) behind our back: it is listed all the same, so that
         * using it answers with what is wrong ("truncated") instead of 404. */
        if (!ours)
            continue;
        in.total = (size_t)sb.st_size;
        owner_t o = {
            .created = (int64_t)sb.st_mtime, .last_used = (int64_t)sb.st_mtime, .owner = ""};
        if (in.owner_off + in.owner_len <= got)
            srv_sess_owner_parse(head + in.owner_off, in.owner_len, &o);
        srv_session_t *s = calloc(1, sizeof *s);
        if (!s || (rc = srv_sess_tab_reserve(st, err, errlen)) < 0) {
            free(s);
            rc = rc < 0 ? rc : STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
            break;
        }
        s->st = st;
        memcpy(s->id, name, ID_LEN + 1);
        s->created = o.created;
        s->last_used = o.last_used;
        s->turn_open = o.turn_open;
        s->has_chat = o.has_chat;
        s->turns = o.turns;
        s->gen = s->gen_used = o.gen;
        s->pg_text = o.pg_text;
        s->pg_reply = o.pg_reply;
        memcpy(s->owner, o.owner, sizeof s->owner);
        s->tokens = in.pos + (int64_t)in.n_pending;
        s->state_bytes = in.total;
        st->tab[st->n++] = s;
        srv_sess_disk_written(st, s, in.total);
    }
    free(head);
    closedir(d);
    if (rc == 0 && st->n > 1)
        qsort(st->tab, st->n, sizeof(srv_session_t *), cmp_session);
    if (rc == 0)
        rc = attach_found(st, found, n_found, err, errlen);
    free(found);
    return rc;
}

int srv_sess_open_dir(srv_store_t *st, char *err, size_t errlen)
{
    char eb[128];
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
    if ((rc = scan_dir(st, err, errlen)) < 0)
        return rc;
    /* a smaller budget than last time: the oldest go now */
    return srv_sess_trim_disk(st, NULL, err, errlen);
}

/* ---- failure injection, stats ---- */

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

void srv_store_disk_stats(srv_store_t *st, size_t *bytes, uint64_t *evicted)
{
    pthread_mutex_lock(&st->mu);
    if (bytes)
        *bytes = st->disk_bytes;
    if (evicted)
        *evicted = st->disk_evicted;
    pthread_mutex_unlock(&st->mu);
}
