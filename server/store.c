/* server/store.c — the session store (server/store.h).
 *
 * One mutex guards the table (an array of sessions sorted by id) and every
 * session's bookkeeping; disk I/O and (de)serialization run outside it on a
 * session that is either busy (held by a caller or by fork / export /
 * import) or marked io (eviction, flush), so a 50 MB write never stalls
 * other sessions. Whoever meets an io session waits on the condition
 * variable; whoever meets a busy one gets SRV_STORE_EBUSY.
 *
 * Files are named by the session id and created through a directory fd, so
 * no path is ever built from input other than an id validated as 32 hex
 * chars. A write goes to "<id>.tmp" first; startup deletes such leftovers.
 * A checkpoint is the file "<id>.<turns>" (store.h "Turns and
 * checkpoints"), never written in place: it is the session's previous file,
 * hard-linked before the new one is renamed over it, or a whole file an
 * import writes; a rollback renames it back over "<id>".
 */
#include "server/store.h"
#include "server/store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/le.h"
#include "core/sample.h"
#include "core/state.h"
#include "proto/proto.h"
#include "server/random.h"

#define TMP_SUFFIX ".tmp"
#define LOCK_NAME ".lock"
#define PROBE_NAME ".write-probe"

/* ---- errors ---- */

const char *srv_store_strerror(int code)
{
    switch (code) {
#define SRV_STORE_ERR_STR_(name, val, desc) \
    case name: return desc;
        SRV_STORE_ERRNO_MAP(SRV_STORE_ERR_STR_)
#undef SRV_STORE_ERR_STR_
    }
    return code == 0 ? "success" : "unknown error";
}

void srv_store_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static const char *errstr(int e, char *buf, size_t n)
{
    return strerror_r(e, buf, n); /* GNU: returns the message */
}

/* ---- ids ---- */

int srv_session_id_valid(const char *id)
{
    return id && proto_session_id_valid(id, strnlen(id, ID_LEN + 1));
}

static int random_bytes(void *buf, size_t n, char *err, size_t errlen)
{
    int e = srv_random_bytes(buf, n);
    char eb[128];
    return e ? STORE_FAIL(err, errlen, SRV_STORE_EIO, "getrandom: %s", errstr(e, eb, sizeof eb))
             : 0;
}

static int new_id(char id[ID_LEN + 1], char *err, size_t errlen)
{
    unsigned char r[ID_LEN / 2];
    int rc = random_bytes(r, sizeof r, err, errlen);
    if (rc < 0)
        return rc;
    proto_session_id_format(r, id);
    return 0;
}

/* ---- the table (caller holds mu) ---- */

/* First index whose id is >= id (strict = 0) or > id (strict = 1). */
static size_t tab_bound(const srv_store_t *st, const char *id, int strict)
{
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tab[mid]->id, id);
        if (c < 0 || (strict && c == 0))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static srv_session_t *tab_find(const srv_store_t *st, const char *id)
{
    size_t i = tab_bound(st, id, 0);
    return i < st->n && strcmp(st->tab[i]->id, id) == 0 ? st->tab[i] : NULL;
}

static int tab_reserve(srv_store_t *st, char *err, size_t errlen)
{
    if (st->n < st->cap)
        return 0;
    size_t cap = st->cap ? st->cap * 2 : 64;
    srv_session_t **t = realloc(st->tab, cap * sizeof(srv_session_t *));
    if (!t)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for the session table");
    st->tab = t;
    st->cap = cap;
    return 0;
}

static int tab_insert(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    int rc = tab_reserve(st, err, errlen);
    if (rc < 0)
        return rc;
    size_t i = tab_bound(st, s->id, 0);
    memmove(st->tab + i + 1, st->tab + i, (st->n - i) * sizeof(srv_session_t *));
    st->tab[i] = s;
    st->n++;
    return 0;
}

static void tab_remove(srv_store_t *st, const srv_session_t *s)
{
    size_t i = tab_bound(st, s->id, 0);
    if (i < st->n && st->tab[i] == s) {
        memmove(st->tab + i, st->tab + i + 1, (st->n - i - 1) * sizeof(srv_session_t *));
        st->n--;
    }
}

/* Waits while s is under store I/O. Returns s, or NULL if it vanished. */
static srv_session_t *find_settled(srv_store_t *st, const char *id)
{
    for (;;) {
        srv_session_t *s = tab_find(st, id);
        if (!s || !s->io)
            return s;
        pthread_cond_wait(&st->cv, &st->mu);
    }
}

/* ---- compute contexts ---- */

static void ctx_free(srv_seq_ctx_t *c)
{
    core_attn_state_free(c->state);
    core_sampler_free(c->sampler);
    free(c->pending);
    memset(c, 0, sizeof *c);
}

/* Fresh empty context: state of the model's attention, default sampler with
 * a random seed (sessions that never set a seed must not share one stream). */
static int ctx_new(srv_store_t *st, srv_seq_ctx_t *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    core_error_t e = {0};
    core_sample_params_t p;
    core_sample_params_default(&p);
    if (random_bytes(&p.seed, sizeof p.seed, NULL, 0) < 0)
        p.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)c;
    if (core_attn_state_new(st->attn, &c->state, &e) < 0 ||
        core_sampler_new(&p, &c->sampler, &e) < 0) {
        ctx_free(c);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "new session state: %s", e.msg);
    }
    return 0;
}

static size_t ctx_bytes(const srv_seq_ctx_t *c)
{
    if (!c->state)
        return 0;
    return core_attn_state_bytes(c->state) + core_sampler_state_size() +
           c->n_pending * sizeof(int32_t);
}

/* Memory of a session in memory: its context, a redo's second context, the
 * last turn's input. */
static size_t session_mem(const srv_session_t *s)
{
    return sizeof(srv_session_t) + ctx_bytes(&s->ctx) + ctx_bytes(&s->prep) + ctx_bytes(&s->aside) +
           (s->n_last_in + s->n_prev_in) * sizeof(int32_t) + (s->pg ? s->pg_text + s->pg_reply : 0);
}

static void last_clear(srv_session_t *s)
{
    free(s->last_in);
    s->last_in = NULL;
    s->n_last_in = 0;
    s->last_flags = 0;
    free(s->pg); /* its sizes stay: the file still has it */
    s->pg = NULL;
}

/* s's pending grammar becomes pg (owned; text[t] ++ reply[r], NULL when
 * none); the one it had is freed. */
static void pg_set(srv_session_t *s, unsigned char *pg, size_t t, size_t r)
{
    free(s->pg);
    s->pg = pg;
    s->pg_text = pg ? t : 0;
    s->pg_reply = pg ? r : 0;
}

static int64_t ctx_tokens(const srv_seq_ctx_t *c)
{
    return core_attn_state_pos(c->state) + (int64_t)c->n_pending;
}

/* Caller holds mu. Re-reads the size and token count of a session in memory. */
static void refresh(srv_store_t *st, srv_session_t *s)
{
    if (!s->ctx.state)
        return;
    size_t m = session_mem(s);
    st->mem_bytes = st->mem_bytes - s->mem_bytes + m;
    s->mem_bytes = m;
    s->tokens = ctx_tokens(&s->ctx);
    s->state_bytes =
        core_state_size(s->ctx.state, s->ctx.sampler, s->ctx.n_pending,
                        OWNER_BYTES_V3 + 4 * s->n_last_in + 8 + s->pg_text + s->pg_reply);
}

/* Caller holds mu. Frees a session's context and its accounting (not n_mem
 * reservations: the caller adjusts those). */
static void drop_memory(srv_store_t *st, srv_session_t *s)
{
    if (!s->ctx.state)
        return;
    st->mem_bytes -= s->mem_bytes;
    st->n_mem--;
    s->mem_bytes = 0;
    ctx_free(&s->ctx);
    ctx_free(&s->prep);
    ctx_free(&s->aside);
    last_clear(s);
    free(s->prev_in);
    s->prev_in = NULL;
    s->n_prev_in = 0;
}

/* Caller holds mu: writing s failed. The client was told that its change
 * was not saved, so the session goes back to what was saved, its file
 * (read again at the next acquire), with the token count and size it had
 * then; a session without a file keeps its memory, to be written later. */
static void revert(srv_store_t *st, srv_session_t *s, int64_t tokens, size_t state_bytes)
{
    if (!s->on_disk) {
        s->dirty = 1;
        return;
    }
    drop_memory(st, s);
    s->dirty = 0;
    s->tokens = tokens;
    s->state_bytes = state_bytes;
}

/* Caller holds mu: s's file was just written with len bytes. */
static void disk_written(srv_store_t *st, srv_session_t *s, size_t len)
{
    if (s->on_disk) {
        st->disk_bytes -= s->disk_bytes;
    } else {
        s->on_disk = 1;
        st->n_disk++;
    }
    s->disk_bytes = len;
    st->disk_bytes += len;
}

/* Caller holds mu: s's file is gone. */
static void disk_gone(srv_store_t *st, srv_session_t *s)
{
    if (!s->on_disk)
        return;
    st->n_disk--;
    st->disk_bytes -= s->disk_bytes;
    s->on_disk = 0;
    s->disk_bytes = 0;
}

/* ---- blobs ---- */

/* 1 if s is "" or OWNER_LEN lowercase hex chars. */
static int owner_tag_valid(const char *s)
{
    return s[0] == '\0' || srv_session_id_valid(s); /* same shape as an id */
}

static int owner_parse(const void *p, size_t n, owner_t *o)
{
    const unsigned char *b = p;
    if (!p || n < OWNER_BYTES_V1 || core_le_get_u32(b + 4) > 3)
        return -1;
    uint32_t v = core_le_get_u32(b);
    if (!(v == 1u && n == OWNER_BYTES_V1) && !(v == 2u && n == OWNER_BYTES_V2) &&
        !(v >= 3u && v <= OWNER_VERSION && n >= OWNER_BYTES_V3))
        return -1;
    char tag[OWNER_LEN + 1] = "";
    if (v >= 2u && b[OWNER_BYTES_V1] != 0) {
        memcpy(tag, b + OWNER_BYTES_V1, OWNER_LEN);
        tag[OWNER_LEN] = '\0';
        if (!srv_session_id_valid(tag))
            return -1;
    }
    int64_t turns = 0;
    unsigned lf = 0;
    size_t n_in = 0, pg_t = 0, pg_r = 0;
    if (v >= 3u) {
        turns = (int64_t)core_le_get_u64(b + OWNER_BYTES_V2);
        lf = core_le_get_u32(b + OWNER_BYTES_V2 + 8);
        n_in = core_le_get_u32(b + OWNER_BYTES_V2 + 12);
        if (turns < 0 || lf > (SRV_TURN_REPLY | SRV_TURN_CHAT | TURN_KEPT) ||
            n_in > SRV_TURN_INPUT_MAX || (n_in && !(lf & TURN_KEPT)))
            return -1;
        size_t end = OWNER_BYTES_V3 + 4 * n_in;
        if (v >= 4u) {
            if (n < end + 8)
                return -1;
            pg_t = core_le_get_u32(b + end);
            pg_r = core_le_get_u32(b + end + 4);
            if (pg_t > SRV_PENDING_GRAMMAR_MAX || pg_r > SRV_PENDING_GRAMMAR_MAX - pg_t ||
                (!pg_t && pg_r))
                return -1;
            end += 8 + pg_t + pg_r;
        }
        if (n != end)
            return -1;
        for (size_t i = 0; i < n_in; i++)
            if (core_le_get_u32(b + OWNER_BYTES_V3 + 4 * i) > (uint32_t)INT32_MAX)
                return -1;
    }
    uint32_t f = core_le_get_u32(b + 4);
    o->turn_open = (int)(f & 1u);
    o->has_chat = (int)((f >> 1) & 1u);
    o->created = (int64_t)core_le_get_u64(b + 8);
    o->last_used = (int64_t)core_le_get_u64(b + 16);
    memcpy(o->owner, tag, sizeof tag);
    o->turns = turns;
    o->last_flags = lf;
    o->in = n_in ? b + OWNER_BYTES_V3 : NULL;
    o->n_in = n_in;
    o->pg = pg_t ? b + OWNER_BYTES_V3 + 4 * n_in + 8 : NULL;
    o->pg_text = pg_t;
    o->pg_reply = pg_r;
    return 0;
}

/* The metadata of session s as its file holds it (borrowing s's input). */
static owner_t owner_of(const srv_session_t *s)
{
    owner_t o = {.created = s->created,
                 .last_used = s->last_used,
                 .turn_open = s->turn_open,
                 .has_chat = s->has_chat,
                 .turns = s->turns,
                 .last_flags = s->last_flags,
                 .pg = s->pg,
                 .pg_text = s->pg ? s->pg_text : 0,
                 .pg_reply = s->pg ? s->pg_reply : 0};
    memcpy(o.owner, s->owner, sizeof o.owner);
    return o;
}

/* The blob of context c with metadata o (new malloc'd *out); in[n_in] is the
 * last turn's input (o->in is not used), parts[n_parts] its checkpoints
 * (an export). id names the session in messages. */
static int serialize_meta(const srv_store_t *st, const char *id, const owner_t *o,
                          const int32_t *in, size_t n_in, const srv_seq_ctx_t *c,
                          const core_state_part_t *parts, size_t n_parts, unsigned char **out,
                          size_t *len, char *err, size_t errlen)
{
    const size_t pg_len = o->pg ? o->pg_text + o->pg_reply : 0;
    size_t ol = OWNER_BYTES_V3 + 4 * n_in + 8 + pg_len;
    unsigned char *own = malloc(ol);
    if (!own)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "session %s: out of memory", id);
    core_le_put_u32(own, OWNER_VERSION);
    core_le_put_u32(own + 4, (uint32_t)(o->turn_open ? 1 : 0) | (uint32_t)(o->has_chat ? 2 : 0));
    core_le_put_u64(own + 8, (uint64_t)o->created);
    core_le_put_u64(own + 16, (uint64_t)o->last_used);
    memset(own + OWNER_BYTES_V1, 0, OWNER_LEN);
    memcpy(own + OWNER_BYTES_V1, o->owner, strlen(o->owner));
    core_le_put_u64(own + OWNER_BYTES_V2, (uint64_t)o->turns);
    core_le_put_u32(own + OWNER_BYTES_V2 + 8, o->last_flags);
    core_le_put_u32(own + OWNER_BYTES_V2 + 12, (uint32_t)n_in);
    for (size_t i = 0; i < n_in; i++)
        core_le_put_u32(own + OWNER_BYTES_V3 + 4 * i, (uint32_t)in[i]);
    unsigned char *pgp = own + OWNER_BYTES_V3 + 4 * n_in;
    core_le_put_u32(pgp, (uint32_t)(pg_len ? o->pg_text : 0));
    core_le_put_u32(pgp + 4, (uint32_t)(pg_len ? o->pg_reply : 0));
    if (pg_len)
        memcpy(pgp + 8, o->pg, pg_len);
    core_state_desc_t d = {.fingerprint = st->fp, .state = c->state, .sampler = c->sampler,
                           .pending = c->pending, .n_pending = c->n_pending, .owner = own,
                           .owner_len = ol, .checkpoints = parts, .n_checkpoints = n_parts};
    size_t n = core_state_desc_size(&d);
    unsigned char *buf = n ? malloc(n) : NULL;
    int rc = 0;
    core_error_t e = {0};
    if (n == 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                        "session %s: state too large to save (%zu pending "
                        "tokens)",
                        id, c->n_pending);
    else if (!buf)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM,
                        "session %s: out of memory for a %zu-byte state", id, n);
    else if (core_state_save(&d, buf, n, len, &e) < 0)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "session %s: %s", id, e.msg);
    free(own);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* The blob of session s with context c (new malloc'd *out). s must be held
 * (busy or io); c is s->ctx or the context about to become it. */
static int serialize_ctx(const srv_store_t *st, const srv_session_t *s, const srv_seq_ctx_t *c,
                         unsigned char **out, size_t *len, char *err, size_t errlen)
{
    owner_t o = owner_of(s);
    return serialize_meta(st, s->id, &o, s->last_in, s->n_last_in, c, NULL, 0, out, len, err,
                          errlen);
}

static int serialize(const srv_store_t *st, const srv_session_t *s, unsigned char **out,
                     size_t *len, char *err, size_t errlen)
{
    return serialize_ctx(st, s, &s->ctx, out, len, err, errlen);
}

/* A malloc'd copy of the input ids o->in (NULL when there are none). */
static int owner_input(const owner_t *o, int32_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->n_in)
        return 0;
    int32_t *v = malloc(o->n_in * sizeof *v);
    if (!v)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a turn's input");
    for (size_t i = 0; i < o->n_in; i++)
        v[i] = (int32_t)core_le_get_u32(o->in + 4 * i);
    *out = v;
    return 0;
}

/* A malloc'd copy of the pending grammar o->pg (NULL when there is none). */
static int owner_pg(const owner_t *o, unsigned char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o->pg)
        return 0;
    unsigned char *v = malloc(o->pg_text + o->pg_reply);
    if (!v)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a pending grammar");
    memcpy(v, o->pg, o->pg_text + o->pg_reply);
    *out = v;
    return 0;
}

/* Restores blob into c (a session's context, or a fresh one): on error c is
 * unchanged. The pending tokens are checked against the vocabulary before
 * anything is replaced. Codes: EMISMATCH (the blob is not for here or is
 * damaged; message from core), ENOMEM. *o gets the owner section if valid
 * (returns 1 then, else 0 with *o untouched). */
static int restore(srv_store_t *st, const unsigned char *b, size_t len, srv_seq_ctx_t *c,
                   owner_t *o, int *have_owner, char *err, size_t errlen)
{
    core_error_t e = {0};
    core_state_info_t in;
    *have_owner = 0;
    if (core_state_peek(b, len, &in, NULL) == 0 && in.total == len) {
        size_t off = in.owner_off + in.owner_len;
        for (size_t i = 0; i < in.n_pending; i++) {
            uint32_t t = core_le_get_u32(b + off + 4 * i);
            if (t >= (uint32_t)st->n_vocab) {
                /* Damage or another model explains it better, if either applies. */
                if (core_state_verify(b, len, st->fp, st->attn, &e) < 0)
                    return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", e.msg);
                return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                                  "pending token %zu has id %u, the vocabulary "
                                  "has %d",
                                  i, t, st->n_vocab);
            }
        }
    }
    int32_t *pend = NULL;
    size_t np = 0, ol = 0;
    const void *own = NULL;
    int rc = core_state_load(b, len, st->fp, c->state, c->sampler, &pend, &np, &own, &ol, &e);
    if (rc < 0)
        return rc == CORE_ENOMEM ? STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "%s", e.msg)
                                 : STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", e.msg);
    free(c->pending);
    c->pending = pend;
    c->n_pending = np;
    if (owner_parse(own, ol, o) == 0) {
        *have_owner = 1;
        /* a turn's input that this vocabulary cannot feed is not kept */
        for (size_t i = 0; i < o->n_in; i++)
            if (core_le_get_u32(o->in + 4 * i) >= (uint32_t)st->n_vocab) {
                o->last_flags &= ~TURN_KEPT;
                o->in = NULL;
                o->n_in = 0;
                break;
            }
    }
    return 0;
}


static void meta_free(meta_t *m)
{
    free(m->in);
    free(m->pg);
    m->in = NULL;
    m->pg = NULL;
}

/* ---- files ---- */

/* 0, or the errno an injected fault makes op fail with (errno set too). */
static int fault(const srv_store_t *st, const char *op)
{
    int e = st->fault_fn ? st->fault_fn(op, st->fault_ud) : 0;
    if (e)
        errno = e;
    return e;
}

static ssize_t do_write(srv_store_t *st, int fd, const void *p, size_t n)
{
    if (fault(st, "write"))
        return -1;
    return st->write_fn ? st->write_fn(fd, p, n, st->write_ud) : write(fd, p, n);
}

/* A file system that has no room or takes no writes: the client is told
 * so (507), apart from other I/O errors. */
static int io_code(int e)
{
    return e == ENOSPC || e == EDQUOT || e == EROFS ? SRV_STORE_ENOSPACE : SRV_STORE_EIO;
}

/* Atomic replace of file id (a session's, or a checkpoint's name): tmp,
 * fsync, rename, fsync of the directory. On failure the previous file is
 * untouched and the temp file removed. link_as (NULL = none): before the
 * rename, the previous file is hard-linked under that name too (a stale
 * file of that name is replaced), so it survives the rename: *linked = 1
 * when it was (a link that fails only means no link); a failed rename
 * removes the link again. */
static int write_file_link(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                           const char *link_as, int *linked, char *err, size_t errlen)
{
    char tmp[CKPT_NAME_MAX + sizeof TMP_SUFFIX], eb[128]; /* a checkpoint's name, too */
    snprintf(tmp, sizeof tmp, "%s" TMP_SUFFIX, id);
    int fd = fault(st, "create")
                 ? -1
                 : openat(st->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                          0600);
    if (fd < 0) {
        int e = errno;
        return STORE_FAIL(err, errlen, io_code(e), "cannot create %s/%s: %s", st->dir, tmp,
                          errstr(e, eb, sizeof eb));
    }
    const char *what = "writing";
    size_t off = 0;
    while (off < len) {
        ssize_t w = do_write(st, fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            goto fail;
        }
        off += (size_t)w;
    }
    what = "syncing";
    if (fsync(fd) < 0)
        goto fail;
    what = "closing";
    int cr = close(fd);
    fd = -1;
    if (cr < 0)
        goto fail;
    what = "renaming";
    if (link_as) {
        unlinkat(st->dirfd, link_as, 0);
        *linked = !fault(st, "link") && linkat(st->dirfd, id, st->dirfd, link_as, 0) == 0;
    }
    if (fault(st, "rename") || renameat(st->dirfd, tmp, st->dirfd, id) < 0) {
        if (link_as && *linked) {
            int e = errno;
            unlinkat(st->dirfd, link_as, 0);
            *linked = 0;
            errno = e;
        }
        goto fail;
    }
    if (fsync(st->dirfd) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "syncing directory %s after writing %s: %s",
                          st->dir, id, errstr(errno, eb, sizeof eb));
    return 0;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlinkat(st->dirfd, tmp, 0);
    return STORE_FAIL(err, errlen, io_code(e), "%s %s/%s: %s (the previous file is kept)", what,
                      st->dir, tmp, errstr(e, eb, sizeof eb));
}

static int write_file(srv_store_t *st, const char *id, const unsigned char *buf, size_t len,
                      char *err, size_t errlen)
{
    return write_file_link(st, id, buf, len, NULL, NULL, err, errlen);
}

/* Whole file id (new malloc'd *out). ENOTFOUND if it is gone, EIO else. */
static int read_file(srv_store_t *st, const char *id, unsigned char **out, size_t *len, char *err,
                     size_t errlen)
{
    char eb[128];
    int fd = fault(st, "read") ? -1 : openat(st->dirfd, id, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        return e == ENOENT ? STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "opening %s/%s: %s",
                                        st->dir, id, errstr(e, eb, sizeof eb))
                           : STORE_FAIL(err, errlen, SRV_STORE_EIO, "opening %s/%s: %s", st->dir,
                                        id, errstr(e, eb, sizeof eb));
    }
    struct stat sb;
    unsigned char *buf = NULL;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "stat %s/%s: %s", st->dir, id,
                          errstr(e, eb, sizeof eb));
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
                              r == 0 ? "file shrank while reading" : errstr(e, eb, sizeof eb));
        }
        off += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

/* Loads blob buf[len] into a fresh context *c; its metadata into *m (may
 * be NULL; free with meta_free). what names the blob in messages ("session
 * file DIR/NAME"). */
static int load_blob(srv_store_t *st, const unsigned char *buf, size_t len, const char *what,
                     srv_seq_ctx_t *c, meta_t *m, char *err, size_t errlen)
{
    if (m)
        memset(m, 0, sizeof *m);
    int rc = ctx_new(st, c, err, errlen);
    if (rc < 0)
        return rc;
    owner_t o;
    int have;
    rc = restore(st, buf, len, c, &o, &have, err, errlen);
    if (rc < 0) {
        ctx_free(c);
        if (rc != SRV_STORE_ENOMEM) {
            char msg[SRV_STORE_ERR_MAX];
            snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "%s: %s", what, msg);
        }
    } else if (m && have) {
        m->have = 1;
        m->o = o;
        m->o.in = NULL;
        if ((rc = owner_input(&o, &m->in, err, errlen)) < 0 ||
            (rc = owner_pg(&o, &m->pg, err, errlen)) < 0) {
            meta_free(m);
            ctx_free(c);
        }
        m->o.pg = m->pg;
    }
    return rc;
}

/* Loads session file name (a session's, or a checkpoint's) into a fresh
 * context *c; its metadata into *m (may be NULL; free m->in). */
static int load_file(srv_store_t *st, const char *name, srv_seq_ctx_t *c, meta_t *m, char *err,
                     size_t errlen)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    if (m)
        memset(m, 0, sizeof *m);
    int rc = read_file(st, name, &buf, &len, err, errlen);
    if (rc < 0)
        return rc;
    char what[600];
    snprintf(what, sizeof what, "session file %s/%s", st->dir, name);
    rc = load_blob(st, buf, len, what, c, m, err, errlen);
    free(buf);
    return rc;
}

/* ---- checkpoint files (caller holds mu) ---- */

static void ckpt_name(char out[CKPT_NAME_MAX], const char *id, int64_t turn)
{
    snprintf(out, CKPT_NAME_MAX, "%s.%lld", id, (long long)turn);
}

/* s's checkpoint file for `turn` turns exists (after every one it has). */
static int ckpt_add(srv_store_t *st, srv_session_t *s, int64_t turn, int64_t tokens, size_t bytes,
                    char *err, size_t errlen)
{
    if (s->n_ckpt == s->cap_ckpt) {
        size_t cap = s->cap_ckpt ? 2 * s->cap_ckpt : 8;
        ckpt_t *c = realloc(s->ckpt, cap * sizeof *c);
        if (!c)
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a checkpoint");
        s->ckpt = c;
        s->cap_ckpt = cap;
    }
    s->ckpt[s->n_ckpt++] = (ckpt_t){.turn = turn, .tokens = tokens, .bytes = bytes};
    st->disk_bytes += bytes;
    st->n_ckpt_files++;
    return 0;
}

/* s's checkpoint k is no longer its (the file is gone or became another). */
static void ckpt_forget(srv_store_t *st, srv_session_t *s, size_t k)
{
    st->disk_bytes -= s->ckpt[k].bytes;
    st->n_ckpt_files--;
    memmove(s->ckpt + k, s->ckpt + k + 1, (s->n_ckpt - k - 1) * sizeof *s->ckpt);
    s->n_ckpt--;
}

/* Deletes s's checkpoint k (its file, then the entry); a file already
 * gone is fine. On an error the entry stays. */
static int ckpt_delete(srv_store_t *st, srv_session_t *s, size_t k, char *err, size_t errlen)
{
    char name[CKPT_NAME_MAX];
    ckpt_name(name, s->id, s->ckpt[k].turn);
    if ((fault(st, "unlink") || unlinkat(st->dirfd, name, 0) < 0) && errno != ENOENT) {
        char eb[128];
        int e = errno;
        return STORE_FAIL(err, errlen, io_code(e), "deleting %s/%s: %s", st->dir, name,
                          errstr(e, eb, sizeof eb));
    }
    ckpt_forget(st, s, k);
    return 0;
}

/* Deletes s's checkpoints from index k on (best effort: a file that cannot
 * be deleted is forgotten all the same, and startup deletes it as one past
 * the session's turns). */
static void ckpt_drop_from(srv_store_t *st, srv_session_t *s, size_t k)
{
    while (s->n_ckpt > k)
        if (ckpt_delete(st, s, s->n_ckpt - 1, NULL, 0) < 0)
            ckpt_forget(st, s, s->n_ckpt - 1);
}

/* Deletes s's oldest checkpoints past the newest max_ckpt (best effort). */
static void ckpt_prune(srv_store_t *st, srv_session_t *s)
{
    while (s->n_ckpt > st->max_ckpt)
        if (ckpt_delete(st, s, 0, NULL, 0) < 0)
            ckpt_forget(st, s, 0);
}

/* Index of s's checkpoint for `turn` turns, or -1. */
static ssize_t ckpt_find(const srv_session_t *s, int64_t turn)
{
    for (size_t k = 0; k < s->n_ckpt; k++)
        if (s->ckpt[k].turn == turn)
            return (ssize_t)k;
    return -1;
}

/* "after turns a..b" of s's checkpoints, for messages. */
static const char *ckpt_range(const srv_session_t *s, char *buf, size_t n)
{
    if (s->n_ckpt == 0 && s->st->be)
        snprintf(buf, n, "sessions in a shared store keep none");
    else if (s->n_ckpt == 0)
        snprintf(buf, n, "it keeps none");
    else if (s->n_ckpt == 1)
        snprintf(buf, n, "it keeps one, after %lld turn%s", (long long)s->ckpt[0].turn,
                 s->ckpt[0].turn == 1 ? "" : "s");
    else
        snprintf(buf, n, "it keeps them after %lld to %lld turns", (long long)s->ckpt[0].turn,
                 (long long)s->ckpt[s->n_ckpt - 1].turn);
    return buf;
}

/* ---- eviction (caller holds mu; released around the I/O) ---- */

/* Is the caller the thread that must not wait for the disk? */
static int no_io_here(const srv_store_t *st)
{
    return st->has_no_io && pthread_equal(pthread_self(), st->no_io_thread);
}

/* The least recently used idle session in memory; on the no-I/O thread
 * only one whose file is current (dropping it writes nothing). */
static srv_session_t *lru_victim(const srv_store_t *st)
{
    /* a shared store's copy in memory is dropped, never written: only one
     * equal to the backend's goes */
    const int clean = no_io_here(st) || st->be;
    srv_session_t *v = NULL;
    for (size_t i = 0; i < st->n; i++) {
        srv_session_t *s = st->tab[i];
        if (s->ctx.state && !s->busy && !s->io && (!clean || (s->on_disk && !s->dirty)) &&
            (!v || s->tick < v->tick))
            v = s;
    }
    return v;
}

/* Writes s if it changed (s idle, in memory), under the io mark. */
static int write_marked(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    s->io = 1;
    pthread_mutex_unlock(&st->mu);
    int rc = serialize(st, s, &buf, &len, err, errlen);
    if (rc == 0)
        rc = write_file(st, s->id, buf, len, err, errlen);
    free(buf);
    pthread_mutex_lock(&st->mu);
    if (rc == 0) {
        disk_written(st, s, len);
        s->dirty = 0;
        s->state_bytes = len;
    }
    s->io = 0;
    pthread_cond_broadcast(&st->cv);
    return rc;
}

static int evict(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    if (s->dirty || !s->on_disk) {
        int rc = write_marked(st, s, err, errlen);
        if (rc < 0)
            return rc;
        /* Someone may have acquired it after the write: then it stays. */
        if (s->busy || s->io || s->dirty)
            return 0;
    }
    drop_memory(st, s);
    return 0;
}

/* Evicts least recently used idle sessions until the bounds hold with
 * `need` more sessions in memory. With need, failing to make room is
 * SRV_STORE_EFULL; the byte bound is a target (busy sessions stay). */
static int make_room(srv_store_t *st, size_t need, char *err, size_t errlen)
{
    for (;;) {
        int over_n = st->max_sessions && st->n_mem + need > st->max_sessions;
        int over_b = st->max_bytes && st->mem_bytes > st->max_bytes;
        if (!over_n && !over_b)
            return 0;
        srv_session_t *v = st->dirfd >= 0 || st->be ? lru_victim(st) : NULL;
        if (!v && no_io_here(st) && st->dirfd >= 0) {
            /* what is left to evict must be written first: on another
             * thread (srv_store_settle); the bounds wait until then */
            atomic_store(&st->unsettled, 1);
            return 0;
        }
        if (!v) {
            if (over_n && need)
                return STORE_FAIL(err, errlen, SRV_STORE_EFULL,
                                  "%zu sessions in memory (the maximum is %zu) and "
                                  "none can be moved to disk",
                                  st->n_mem, st->max_sessions);
            return 0;
        }
        int rc = evict(st, v, err, errlen);
        if (rc < 0)
            return rc;
        if (v->ctx.state)
            return 0; /* taken meanwhile; do not spin on it */
    }
}

int srv_store_trim(srv_store_t *st, size_t max_bytes, char *err, size_t errlen)
{
    pthread_mutex_lock(&st->mu);
    int rc = 0;
    while (rc == 0 && st->mem_bytes > max_bytes) {
        srv_session_t *v = st->dirfd >= 0 || st->be ? lru_victim(st) : NULL;
        if (!v)
            break;
        rc = evict(st, v, err, errlen);
        if (rc == 0 && v->ctx.state)
            break; /* taken meanwhile; do not spin on it */
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void srv_store_mem_stats(srv_store_t *st, size_t *held, size_t *evictable)
{
    pthread_mutex_lock(&st->mu);
    size_t e = 0;
    for (size_t i = 0; (st->dirfd >= 0 || st->be) && i < st->n; i++) {
        const srv_session_t *s = st->tab[i];
        if (s->ctx.state && !s->busy && !s->io && (!st->be || (s->on_disk && !s->dirty)))
            e += s->mem_bytes;
    }
    if (e > st->mem_bytes)
        e = st->mem_bytes;
    *held = st->mem_bytes - e;
    *evictable = e;
    pthread_mutex_unlock(&st->mu);
}

static int remove_session(srv_store_t *st, srv_session_t *s, char *err, size_t errlen);

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
static int trim_disk(srv_store_t *st, const srv_session_t *keep, char *err, size_t errlen)
{
    for (;;) {
        int over_n = st->max_disk_files && st->n_disk + st->n_ckpt_files > st->max_disk_files;
        int over_b = st->max_disk_bytes && st->disk_bytes > st->max_disk_bytes;
        if (!over_n && !over_b)
            return 0;
        if (no_io_here(st)) { /* deleting files waits for srv_store_settle */
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
            rc = ckpt_delete(st, c, 0, err, errlen);
        } else if (v) {
            rc = remove_session(st, v, err, errlen);
            if (rc == 0)
                st->disk_evicted++;
        } else {
            return 0;
        }
        if (rc < 0)
            return rc;
    }
}

/* ---- store ---- */

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
                                    errstr(errno, eb, sizeof eb));
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

static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* Upper bound of any blob of this configuration (payloads in attn_*.c). */
/* Upper bound of any blob of this configuration with at most `pending`
 * pending tokens and `owner` owner bytes (payloads in attn_*.c). */
static size_t max_blob_bytes(const core_attn_cfg_t *c, size_t pending, size_t owner)
{
    size_t L = (size_t)c->n_layer, kv = sat_mul((size_t)c->n_head_kv, (size_t)c->head_dim);
    size_t payload;
    if (c->kind == CORE_ATTN_EXACT) {
        payload = sat_mul(sat_mul(2 * L, (size_t)c->max_ctx), sat_mul(kv, sizeof(float)));
    } else {
        size_t nz = sat_mul(sat_mul(L, (size_t)c->n_head_kv), (size_t)c->n_features);
        payload = sat_add(sat_mul(nz, 16), sat_mul(sat_mul(nz, (size_t)c->head_dim), 8));
        payload = sat_add(payload, sat_mul(sat_mul(2 * L, (size_t)c->window), sat_mul(kv, 4)));
        payload = sat_add(payload, 8);
    }
    size_t fixed = CORE_STATE_HEADER_BYTES + owner + 4 * pending + core_sampler_state_size() + 4;
    return sat_add(fixed, payload);
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
    const srv_session_t *x = *(const srv_session_t *const *)a, *y = *(const srv_session_t *const *)b;
    return strcmp(x->id, y->id);
}

/* A checkpoint file found at startup. */
typedef struct found_ckpt {
    char id[ID_LEN + 1];
    int64_t turn;
    int64_t tokens;
    size_t bytes;
    int ok; /* a whole blob for this model and attention (by its header) */
} found_ckpt_t;

/* The turns of checkpoint file name "<id>.<turns>" (id into id[]), or -1. */
static int64_t ckpt_parse_name(const char *name, char id[ID_LEN + 1])
{
    size_t nl = strlen(name);
    if (nl < ID_LEN + 2 || nl > ID_LEN + 20 || name[ID_LEN] != '.')
        return -1;
    memcpy(id, name, ID_LEN);
    id[ID_LEN] = '\0';
    if (!srv_session_id_valid(id))
        return -1;
    const char *d = name + ID_LEN + 1;
    if (d[0] == '0' && d[1] != '\0')
        return -1; /* one spelling per number */
    int64_t t = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || t > (INT64_MAX - 9) / 10)
            return -1;
        t = t * 10 + (*d - '0');
    }
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
        srv_session_t *s = tab_find(st, f[i].id);
        char name[CKPT_NAME_MAX];
        ckpt_name(name, f[i].id, f[i].turn);
        if (!s) {
            if (faccessat(st->dirfd, f[i].id, F_OK, AT_SYMLINK_NOFOLLOW) != 0)
                unlinkat(st->dirfd, name, 0); /* orphan */
            continue;
        }
        if (!f[i].ok || f[i].turn >= s->turns) {
            unlinkat(st->dirfd, name, 0);
            continue;
        }
        int rc = ckpt_add(st, s, f[i].turn, f[i].tokens, f[i].bytes, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < st->n; i++)
        ckpt_prune(st, st->tab[i]);
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
                          errstr(errno, eb, sizeof eb));
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
                if (srv_session_id_valid(base) || ckpt_parse_name(base, id) >= 0)
                    unlinkat(st->dirfd, name, 0); /* a write that never reached its rename */
            }
            continue;
        }
        int64_t turn = ckpt_parse_name(name, id);
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
        owner_t o = {.created = (int64_t)sb.st_mtime, .last_used = (int64_t)sb.st_mtime,
                     .owner = ""};
        if (in.owner_off + in.owner_len <= got)
            owner_parse(head + in.owner_off, in.owner_len, &o);
        srv_session_t *s = calloc(1, sizeof *s);
        if (!s || (rc = tab_reserve(st, err, errlen)) < 0) {
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
        s->pg_text = o.pg_text;
        s->pg_reply = o.pg_reply;
        memcpy(s->owner, o.owner, sizeof s->owner);
        s->tokens = in.pos + (int64_t)in.n_pending;
        s->state_bytes = in.total;
        st->tab[st->n++] = s;
        disk_written(st, s, in.total);
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

static int open_dir(srv_store_t *st, char *err, size_t errlen)
{
    char eb[128];
    int rc = mkdirs(st->dir, err, errlen);
    if (rc < 0)
        return rc;
    st->dirfd = open(st->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->dirfd < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot open session directory %s: %s",
                          st->dir, errstr(errno, eb, sizeof eb));
    st->lockfd = openat(st->dirfd, LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (st->lockfd < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot write in session directory %s: %s",
                          st->dir, errstr(errno, eb, sizeof eb));
    if (flock(st->lockfd, LOCK_EX | LOCK_NB) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EIO,
                          "session directory %s is in use by another process (%s)", st->dir,
                          errstr(errno, eb, sizeof eb));
    /* Permissions alone do not tell (root, read-only mounts): try a write. */
    int pfd = openat(st->dirfd, PROBE_NAME, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                     0600);
    if (pfd < 0 || write(pfd, "x", 1) != 1) {
        int e = errno;
        if (pfd >= 0)
            close(pfd);
        unlinkat(st->dirfd, PROBE_NAME, 0);
        return STORE_FAIL(err, errlen, SRV_STORE_EIO, "cannot write in session directory %s: %s",
                          st->dir, errstr(e, eb, sizeof eb));
    }
    close(pfd);
    unlinkat(st->dirfd, PROBE_NAME, 0);
    if ((rc = scan_dir(st, err, errlen)) < 0)
        return rc;
    /* a smaller budget than last time: the oldest go now */
    return trim_disk(st, NULL, err, errlen);
}

int srv_store_new(const srv_store_opts_t *o, srv_store_t **out, char *err, size_t errlen)
{
    int rc;
    srv_store_t *st = NULL;
    if (out)
        *out = NULL;
    if (!o || !o->model || !out) {
        rc =
            STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "session store: no options, model or output");
        if (o && o->backend)
            o->backend->ops->free(o->backend);
        goto fail;
    }
    const char *fp = o->fingerprint ? o->fingerprint : core_model_info(o->model)->fingerprint;
    if (strlen(fp) > CORE_STATE_FINGERPRINT_MAX || o->ttl_s < 0 ||
        o->max_checkpoints > SRV_STORE_MAX_CHECKPOINTS) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                        "session store: fingerprint over %d chars, negative "
                        "TTL or more than %d checkpoints",
                        CORE_STATE_FINGERPRINT_MAX, SRV_STORE_MAX_CHECKPOINTS);
        if (o->backend)
            o->backend->ops->free(o->backend);
        goto fail;
    }
    st = calloc(1, sizeof *st);
    if (!st) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for the session store");
        if (o->backend)
            o->backend->ops->free(o->backend);
        goto fail;
    }
    st->be = o->backend; /* a shared store: no directory, no checkpoints */
    st->dirfd = st->lockfd = -1;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->model = o->model;
    st->attn = core_model_attn(o->model);
    snprintf(st->fp, sizeof st->fp, "%s", fp);
    st->n_vocab = core_model_info(o->model)->n_vocab;
    st->max_sessions = o->max_sessions;
    st->max_bytes = o->max_bytes;
    st->max_disk_files = o->max_disk_files;
    st->max_disk_bytes = o->max_disk_bytes;
    if (st->be) /* the backend's memory is its own business (and its TTL) */
        st->max_disk_files = st->max_disk_bytes = 0;
    st->ttl_s = o->ttl_s;
    st->max_blob = max_blob_bytes(core_attn_config(st->attn), CORE_STATE_MAX_PENDING,
                                  CORE_STATE_MAX_OWNER);
    const int use_dir = o->dir && o->dir[0] && !st->be;
    st->max_ckpt = use_dir ? o->max_checkpoints : 0;
    st->max_ckpt_blob = max_blob_bytes(core_attn_config(st->attn), CKPT_PENDING_MAX,
                                       OWNER_BYTES_V3 + 4 * (size_t)SRV_TURN_INPUT_MAX);
    /* a shared store keeps no checkpoints but takes the export of a
     * directory store that has them (it keeps the state, not them) */
    const size_t ck_bound = st->be && o->max_checkpoints <= SRV_STORE_MAX_CHECKPOINTS
                                ? o->max_checkpoints
                                : st->max_ckpt;
    st->max_export = sat_add(st->max_blob, sat_mul(ck_bound, sat_add(st->max_ckpt_blob, 8)));
    if (use_dir) {
        st->dir = strdup(o->dir);
        if (!st->dir) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
            goto fail;
        }
        if ((rc = open_dir(st, err, errlen)) < 0)
            goto fail;
    }
    *out = st;
    return 0;
fail:
    srv_store_free(st);
    return rc;
}

void srv_store_free(srv_store_t *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++) {
        srv_session_t *s = st->tab[i];
        ctx_free(&s->ctx);
        ctx_free(&s->prep);
        ctx_free(&s->aside);
        free(s->last_in);
        free(s->prev_in);
        free(s->pg);
        free(s->ckpt);
        free(s);
    }
    free(st->tab);
    if (st->be)
        st->be->ops->free(st->be);
    if (st->lockfd >= 0)
        close(st->lockfd);
    if (st->dirfd >= 0)
        close(st->dirfd);
    free(st->dir);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

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

size_t srv_store_max_export(const srv_store_t *st)
{
    return st->max_export;
}

/* ---- sessions ---- */

int srv_store_create(srv_store_t *st, srv_session_t **out, char *err, size_t errlen)
{
    *out = NULL;
    srv_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
    int rc = ctx_new(st, &s->ctx, err, errlen);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->st = st;
    s->created = s->last_used = (int64_t)time(NULL);
    s->busy = 1;
    s->dirty = 1;
    pthread_mutex_lock(&st->mu);
    if ((rc = make_room(st, 1, err, errlen)) < 0)
        goto fail;
    do {
        if ((rc = new_id(s->id, err, errlen)) < 0)
            goto fail;
    } while (tab_find(st, s->id));
    if ((rc = tab_insert(st, s, err, errlen)) < 0)
        goto fail;
    s->tick = ++st->tick;
    s->mem_bytes = session_mem(s);
    st->mem_bytes += s->mem_bytes;
    st->n_mem++;
    s->tokens = 0;
    s->state_bytes = core_state_size(s->ctx.state, s->ctx.sampler, 0, OWNER_BYTES_V3);
    pthread_mutex_unlock(&st->mu);
    *out = s;
    return 0;
fail:
    pthread_mutex_unlock(&st->mu);
    ctx_free(&s->ctx);
    free(s);
    return rc;
}

/* Caller holds mu and s busy, s not in memory: loads it (mu released around
 * the I/O). On ENOTFOUND (file gone) the entry is removed and freed. */
static int bring_in(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    int rc = make_room(st, 1, err, errlen);
    if (rc < 0)
        return rc;
    st->n_mem++; /* reserved while loading */
    pthread_mutex_unlock(&st->mu);
    srv_seq_ctx_t c;
    meta_t m;
    char id[ID_LEN + 1];
    memcpy(id, s->id, sizeof id);
    rc = load_file(st, id, &c, &m, err, errlen);
    pthread_mutex_lock(&st->mu);
    if (rc < 0) {
        st->n_mem--;
        if (rc == SRV_STORE_ENOTFOUND) {
            ckpt_drop_from(st, s, 0);
            tab_remove(st, s);
            disk_gone(st, s);
            free(s->ckpt);
            free(s);
        }
        return rc;
    }
    s->ctx = c;
    if (m.have) { /* the file is the truth (after a write that failed, too) */
        s->turn_open = m.o.turn_open;
        s->has_chat = m.o.has_chat;
        s->turns = m.o.turns;
        while (s->n_ckpt && s->ckpt[s->n_ckpt - 1].turn >= s->turns)
            ckpt_drop_from(st, s, s->n_ckpt - 1);
    }
    s->last_flags = m.o.last_flags;
    s->last_in = m.in;
    s->n_last_in = m.o.n_in;
    pg_set(s, m.pg, m.o.pg_text, m.o.pg_reply);
    s->mem_bytes = 0;
    refresh(st, s);
    return 0;
}

/* srv_store_acquire (from_disk = 1) and srv_store_acquire_in_memory. */
static int acquire(srv_store_t *st, const char *id, int from_disk, srv_session_t **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (st->be)
        return srv_sess_remote_acquire(st, id, from_disk, out, err, errlen);
    pthread_mutex_lock(&st->mu);
    /* waiting out a write (find_settled) is waiting for the disk too */
    srv_session_t *s = from_disk ? find_settled(st, id) : tab_find(st, id);
    int rc = 0;
    if (!s) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
        goto out;
    }
    if (s->busy) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
        goto out;
    }
    if (!from_disk && (s->io || !s->ctx.state)) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED, "session %s is %s", id,
                        s->io ? "being written to disk" : "on disk, not in memory");
        goto out;
    }
    s->busy = 1;
    s->tick = ++st->tick;
    if (!s->ctx.state && (rc = bring_in(st, s, err, errlen)) < 0) {
        if (rc != SRV_STORE_ENOTFOUND)
            s->busy = 0;
        goto out;
    }
    *out = s;
out:
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_store_acquire(srv_store_t *st, const char *id, srv_session_t **out, char *err,
                      size_t errlen)
{
    return acquire(st, id, 1, out, err, errlen);
}

int srv_store_acquire_in_memory(srv_store_t *st, const char *id, srv_session_t **out, char *err,
                                size_t errlen)
{
    return acquire(st, id, 0, out, err, errlen);
}

/* Caller holds mu: the turn s opened is over; abort = 1 undoes it (its
 * count and last-turn record go back). */
static void turn_end(srv_store_t *st, srv_session_t *s, int abort)
{
    if (!s->in_turn)
        return;
    if (abort) {
        s->turns = s->turns0;
        free(s->last_in);
        s->last_in = s->prev_in;
        s->n_last_in = s->n_prev_in;
        s->last_flags = s->prev_flags;
        s->dirty = s->dirty0;
    } else {
        free(s->prev_in);
    }
    s->prev_in = NULL;
    s->n_prev_in = 0;
    s->in_turn = 0;
    s->turn_link = 0;
    refresh(st, s);
}

/* Caller holds mu: a redo ends; undo = 1 puts back the state it replaced,
 * else that state is dropped (the redo was written, or reverted to the
 * file). */
static void redo_end(srv_store_t *st, srv_session_t *s, int undo)
{
    if (!s->redo)
        return;
    if (undo && s->aside.state) {
        ctx_free(&s->ctx);
        s->ctx = s->aside;
        memset(&s->aside, 0, sizeof s->aside);
        s->turn_open = s->aside_turn_open;
        s->has_chat = s->aside_has_chat;
        s->dirty = s->dirty0;
    }
    ctx_free(&s->aside);
    s->redo = 0;
    refresh(st, s);
}

int srv_store_release(srv_store_t *st, srv_session_t *s, int persist, char *err, size_t errlen)
{
    if (!st || !s || !s->busy)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "release of a session that is not held");
    int rc = 0;
    unsigned char *buf = NULL;
    size_t len = 0;
    int write = persist && (st->dirfd >= 0 || st->be);
    if (!persist) { /* nothing of a turn or redo to keep */
        pthread_mutex_lock(&st->mu);
        turn_end(st, s, 1);
        redo_end(st, s, 1);
        pthread_mutex_unlock(&st->mu);
    }
    /* the state before the turn is the file being replaced: kept as the
     * turn's checkpoint by a link */
    char link_as[CKPT_NAME_MAX];
    int want_link = write && s->in_turn && s->turn_link, linked = 0;
    if (want_link)
        ckpt_name(link_as, s->id, s->turns0);
    if (write) {
        rc = serialize(st, s, &buf, &len, err, errlen);
        if (rc == 0 && st->be)
            rc = srv_sess_remote_save(st, s, buf, len, err, errlen);
        else if (rc == 0)
            rc = write_file_link(st, s->id, buf, len, want_link ? link_as : NULL, &linked, err,
                                 errlen);
        free(buf);
    }
    pthread_mutex_lock(&st->mu);
    /* what the file holds, for a failed write (a turn or a redo refreshed
     * the cached values when it began) */
    const int began = s->in_turn || s->redo;
    int64_t tokens0 = began ? s->tokens0 : s->tokens;
    size_t bytes0 = began ? s->bytes0 : s->state_bytes, file0 = s->disk_bytes;
    refresh(st, s);
    if (write) {
        if (rc == 0) {
            disk_written(st, s, len);
            s->dirty = 0;
            if (linked && ckpt_add(st, s, s->turns0, s->tokens0, file0, err, errlen) < 0)
                unlinkat(st->dirfd, link_as, 0);
            ckpt_prune(st, s);
        } else {
            if (s->on_disk && s->in_turn)
                s->turns = s->turns0; /* the file's count */
            revert(st, s, tokens0, bytes0);
        }
    }
    turn_end(st, s, 0);
    redo_end(st, s, 0);
    if (persist)
        ctx_free(&s->prep); /* the session changed: what was prepared is stale */
    if (st->be)
        srv_sess_remote_released(st, s, persist, write && rc == 0);
    refresh(st, s);
    s->busy = 0;
    s->tick = ++st->tick;
    /* Another session failing to spill is the sweep's error to report, not
     * this release's: this session's own write is what the caller asked. */
    if (make_room(st, 0, NULL, 0) == 0)
        (void)trim_disk(st, s, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Caller holds mu, s idle: removes s (file first, so a failure keeps it). */
static int remove_session(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    if (s->on_disk && (fault(st, "unlink") || unlinkat(st->dirfd, s->id, 0) < 0) &&
        errno != ENOENT) {
        char eb[128];
        int e = errno;
        return STORE_FAIL(err, errlen, io_code(e), "deleting %s/%s: %s", st->dir, s->id,
                          errstr(e, eb, sizeof eb));
    }
    disk_gone(st, s);
    ckpt_drop_from(st, s, 0);
    drop_memory(st, s);
    tab_remove(st, s);
    free(s->ckpt);
    free(s);
    return 0;
}

int srv_store_delete(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (st->be)
        return srv_sess_remote_delete(st, id, err, errlen);
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = find_settled(st, id);
    int rc;
    if (!s)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    else if (s->busy)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    else
        rc = remove_session(st, s, err, errlen);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void fill_info(const srv_session_t *s, srv_session_info_t *o)
{
    memset(o, 0, sizeof *o);
    memcpy(o->id, s->id, sizeof o->id);
    memcpy(o->owner, s->owner, sizeof o->owner);
    o->tokens = s->tokens;
    o->state_bytes = s->state_bytes;
    o->created = s->created;
    o->last_used = s->last_used;
    o->on_disk = s->on_disk;
    o->in_memory = s->ctx.state != NULL;
    o->busy = s->busy;
    o->turns = s->turns;
    o->pending_grammar = s->pg_text ? (int64_t)s->pg_reply : -1;
    o->n_checkpoints = s->n_ckpt < SRV_STORE_MAX_CHECKPOINTS ? s->n_ckpt
                                                               : SRV_STORE_MAX_CHECKPOINTS;
    for (size_t i = 0; i < o->n_checkpoints; i++)
        o->checkpoints[i] = (srv_checkpoint_t){.turn = s->ckpt[i].turn,
                                               .tokens = s->ckpt[i].tokens,
                                               .bytes = s->ckpt[i].bytes};
}

int srv_store_info(srv_store_t *st, const char *id, srv_session_info_t *out, char *err,
                   size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = tab_find(st, id);
    if (s)
        fill_info(s, out);
    pthread_mutex_unlock(&st->mu);
    return s ? 0 : STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
}

int srv_store_list_owned(srv_store_t *st, const char *owner, const char *after, size_t limit,
                         srv_session_info_t *out, size_t *n, int *has_more, char *err,
                         size_t errlen)
{
    *n = 0;
    *has_more = 0;
    if (limit && !out)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "list: no output array");
    if (st->be)
        return srv_sess_remote_list(st, owner, after, limit, out, n, has_more, err, errlen);
    pthread_mutex_lock(&st->mu);
    size_t i = after && after[0] ? tab_bound(st, after, 1) : 0;
    for (; i < st->n; i++) {
        if (owner && strcmp(st->tab[i]->owner, owner) != 0)
            continue;
        if (*n == limit) {
            *has_more = 1;
            break;
        }
        fill_info(st->tab[i], &out[(*n)++]);
    }
    pthread_mutex_unlock(&st->mu);
    return 0;
}

/* Caller holds mu: takes session id for a store operation (busy). */
static int take(srv_store_t *st, const char *id, srv_session_t **out, char *err, size_t errlen)
{
    srv_session_t *s = find_settled(st, id);
    if (!s)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    if (s->busy)
        return STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    s->busy = 1;
    *out = s;
    return 0;
}

static void give_back(srv_store_t *st, srv_session_t *s)
{
    s->busy = 0;
    pthread_cond_broadcast(&st->cv);
}

/* c = independent copy of the context of src (in memory). */
static int ctx_copy(srv_store_t *st, const srv_seq_ctx_t *src, srv_seq_ctx_t *c, char *err,
                    size_t errlen)
{
    int rc = ctx_new(st, c, err, errlen);
    if (rc < 0)
        return rc;
    core_error_t e = {0};
    core_sampler_t *smp = NULL;
    if (core_attn_state_copy(c->state, src->state, &e) < 0) {
        /* States of one attention can still differ in layout (linear
         * accumulator precision): the blob carries it, a copy does not. */
        size_t n = core_state_size(src->state, NULL, 0, 0), len = 0;
        unsigned char *buf = malloc(n ? n : 1);
        core_state_desc_t d = {.fingerprint = st->fp, .state = src->state};
        int rc2 = !buf || !n ? CORE_ENOMEM : core_state_save(&d, buf, n, &len, &e);
        if (rc2 == 0)
            rc2 = core_state_load(buf, len, st->fp, c->state, NULL, NULL, NULL, NULL, NULL, &e);
        free(buf);
        if (rc2 < 0) {
            ctx_free(c);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
        }
    }
    if (src->sampler && core_sampler_clone(src->sampler, &smp, &e) < 0) {
        ctx_free(c);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
    }
    if (smp) {
        core_sampler_free(c->sampler);
        c->sampler = smp;
    }
    if (src->n_pending) {
        c->pending = malloc(src->n_pending * sizeof *c->pending);
        if (!c->pending) {
            ctx_free(c);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM,
                              "out of memory copying pending tokens");
        }
        memcpy(c->pending, src->pending, src->n_pending * sizeof *c->pending);
        c->n_pending = src->n_pending;
    }
    return 0;
}

void srv_sess_fork_init(srv_store_t *st, srv_session_t *ns, const srv_session_t *src,
                        const char *owner)
{
    ns->st = st;
    ns->busy = 1;
    ns->dirty = 1;
    ns->created = ns->last_used = (int64_t)time(NULL);
    ns->turn_open = src->turn_open;
    ns->has_chat = src->has_chat;
    const char *tag = owner ? owner : src->owner;
    memcpy(ns->owner, tag, strlen(tag) + 1);
}

int srv_store_fork_owned(srv_store_t *st, const char *id, const char *owner,
                         char out_id[SRV_SESSION_ID_LEN + 1], char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (owner && !owner_tag_valid(owner))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed owner tag");
    if (st->be)
        return srv_sess_remote_fork(st, id, owner, out_id, err, errlen);
    srv_session_t *ns = calloc(1, sizeof *ns), *src = NULL;
    if (!ns)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
    pthread_mutex_lock(&st->mu);
    int rc = take(st, id, &src, err, errlen);
    if (rc < 0) {
        pthread_mutex_unlock(&st->mu);
        free(ns);
        return rc;
    }
    if ((rc = make_room(st, 1, err, errlen)) < 0)
        goto fail_locked;
    do {
        if ((rc = new_id(ns->id, err, errlen)) < 0)
            goto fail_locked;
    } while (tab_find(st, ns->id));
    if ((rc = tab_insert(st, ns, err, errlen)) < 0)
        goto fail_locked;
    srv_sess_fork_init(st, ns, src, owner);
    st->n_mem++; /* reserved while copying */
    pthread_mutex_unlock(&st->mu);

    srv_seq_ctx_t c;
    meta_t m = {0};
    if (src->ctx.state) {
        owner_t so = owner_of(src);
        rc = ctx_copy(st, &src->ctx, &c, err, errlen);
        if (rc == 0 && (rc = owner_pg(&so, &m.pg, err, errlen)) < 0)
            ctx_free(&c);
        m.o.pg_text = so.pg_text;
        m.o.pg_reply = so.pg_reply;
    } else {
        rc = load_file(st, src->id, &c, &m, err, errlen);
        free(m.in);
        m.in = NULL;
    }
    if (rc == 0) /* the copy continues the reply the source left pending, too */
        pg_set(ns, m.pg, m.o.pg_text, m.o.pg_reply);
    else
        meta_free(&m);
    unsigned char *buf = NULL;
    size_t len = 0;
    if (rc == 0 && st->dirfd >= 0) {
        rc = serialize_ctx(st, ns, &c, &buf, &len, err, errlen);
        if (rc == 0)
            rc = write_file(st, ns->id, buf, len, err, errlen);
        free(buf);
        if (rc < 0)
            ctx_free(&c);
    }

    pthread_mutex_lock(&st->mu);
    give_back(st, src);
    if (rc < 0) {
        st->n_mem--;
        tab_remove(st, ns);
        free(ns->pg);
        free(ns);
        pthread_mutex_unlock(&st->mu);
        return rc;
    }
    ns->ctx = c;
    if (st->dirfd >= 0) {
        disk_written(st, ns, len);
        ns->dirty = 0;
    }
    ns->mem_bytes = 0;
    refresh(st, ns);
    ns->busy = 0;
    ns->tick = ++st->tick;
    memcpy(out_id, ns->id, ID_LEN + 1);
    make_room(st, 0, NULL, 0);
    trim_disk(st, ns, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return 0;
fail_locked:
    give_back(st, src);
    pthread_mutex_unlock(&st->mu);
    free(ns);
    return rc;
}

/* The checkpoint files of s (held) read back as blobs for an export:
 * parts[*n] (each blob malloc'd; free with parts_free). A file that is
 * gone or damaged is left out (it is no state of the session's), and one
 * over max_ckpt_blob (so that the export stays within what an import
 * takes). */
static int export_parts(srv_store_t *st, srv_session_t *s, core_state_part_t *parts, size_t *n,
                        char *err, size_t errlen)
{
    *n = 0;
    for (size_t k = 0; k < s->n_ckpt; k++) {
        char name[CKPT_NAME_MAX];
        ckpt_name(name, s->id, s->ckpt[k].turn);
        unsigned char *b = NULL;
        size_t l = 0;
        int rc = read_file(st, name, &b, &l, err, errlen);
        if (rc == SRV_STORE_ENOMEM)
            return rc;
        core_error_t e = {0};
        if (rc < 0 || l > st->max_ckpt_blob || core_state_verify(b, l, st->fp, st->attn, &e) < 0) {
            free(b);
            continue;
        }
        parts[(*n)++] = (core_state_part_t){.blob = b, .len = l};
    }
    return 0;
}

static void parts_free(core_state_part_t *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free((void *)(uintptr_t)parts[i].blob);
}

int srv_store_export(srv_store_t *st, const char *id, void **blob, size_t *len, char *err,
                     size_t errlen)
{
    *blob = NULL;
    *len = 0;
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (st->be)
        return srv_sess_remote_export(st, id, blob, len, err, errlen);
    srv_session_t *s = NULL;
    pthread_mutex_lock(&st->mu);
    int rc = take(st, id, &s, err, errlen);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    unsigned char *buf = NULL;
    size_t n = 0, np = 0;
    core_state_part_t parts[SRV_STORE_MAX_CHECKPOINTS];
    if (s->n_ckpt)
        rc = export_parts(st, s, parts, &np, err, errlen);
    if (rc < 0) {
        /* out of memory */
    } else if (np) {
        /* the state and its checkpoints in one version 2 blob */
        srv_seq_ctx_t c = {0};
        meta_t m = {0};
        if (!s->ctx.state)
            rc = load_file(st, s->id, &c, &m, err, errlen);
        if (rc == 0) {
            owner_t o = owner_of(s);
            const int32_t *in = s->last_in;
            size_t n_in = s->n_last_in;
            if (!s->ctx.state) {
                o.last_flags = m.o.last_flags;
                in = m.in;
                n_in = m.o.n_in;
                o.pg = m.pg;
                o.pg_text = m.o.pg_text;
                o.pg_reply = m.o.pg_reply;
            }
            rc = serialize_meta(st, s->id, &o, in, n_in, s->ctx.state ? &s->ctx : &c, parts, np,
                                &buf, &n, err, errlen);
        }
        ctx_free(&c);
        meta_free(&m);
    } else if (s->ctx.state) {
        rc = serialize(st, s, &buf, &n, err, errlen);
    } else if ((rc = read_file(st, s->id, &buf, &n, err, errlen)) == 0) {
        core_error_t e = {0};
        if (core_state_verify(buf, n, st->fp, st->attn, &e) < 0) {
            free(buf);
            buf = NULL;
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO, "session file %s/%s: %s", st->dir, s->id,
                            e.msg);
        }
    }
    parts_free(parts, np);
    pthread_mutex_lock(&st->mu);
    give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    *blob = buf;
    *len = n;
    return 0;
}

/* The metadata of the owner section at b's head (a blob core_state_load
 * accepted): 0 and *o, or -1 when it has none this store reads. */
static int blob_owner(const unsigned char *b, size_t len, owner_t *o)
{
    core_state_info_t in;
    if (core_state_peek(b, len, &in, NULL) < 0)
        return -1;
    return owner_parse(b + in.owner_off, in.owner_len, o);
}

/* Checks the checkpoints of an imported blob (which core_state_verify
 * accepted) before anything changes: each loads (payload and pending
 * tokens checked) into scratch, names its turn count, the counts rise and
 * stay below the blob's own (turns). *first = the first of the newest
 * max_ckpt, which are kept. EMISMATCH with the reason. */
static int import_check(srv_store_t *st, const unsigned char *blob, size_t len, int64_t turns,
                        srv_seq_ctx_t *scratch, size_t *first, char *err, size_t errlen)
{
    core_state_info_t in;
    *first = 0;
    if (core_state_peek(blob, len, &in, NULL) < 0 || in.n_checkpoints == 0)
        return 0;
    int64_t prev = -1;
    for (size_t i = 0; i < in.n_checkpoints; i++) {
        const void *p = NULL;
        size_t pl = 0;
        core_error_t e = {0};
        owner_t o;
        int have = 0;
        if (core_state_checkpoint(blob, len, i, &p, &pl, &e) < 0)
            return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "checkpoint %zu: %s", i, e.msg);
        int rc = restore(st, p, pl, scratch, &o, &have, err, errlen);
        if (rc < 0) {
            char msg[SRV_STORE_ERR_MAX];
            snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
            return rc == SRV_STORE_ENOMEM
                       ? rc
                       : STORE_FAIL(err, errlen, rc, "checkpoint %zu: %s", i, msg);
        }
        if (!have || o.turns <= prev || o.turns >= turns)
            return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                              "checkpoint %zu: its turn count (%lld) must "
                              "rise from one checkpoint to the next and stay below the "
                              "session's (%lld)",
                              i, have ? (long long)o.turns : -1LL, (long long)turns);
        prev = o.turns;
    }
    if (in.n_checkpoints > st->max_ckpt)
        *first = in.n_checkpoints - st->max_ckpt;
    return 0;
}

/* Writes the imported blob's checkpoints from index first on as s's
 * checkpoint files, with s's owner tag and creation time (s held, its old
 * checkpoints gone). A checkpoint that cannot be written is left out, with
 * the ones after it. */
static void import_write(srv_store_t *st, srv_session_t *s, const unsigned char *blob, size_t len,
                         size_t first, srv_seq_ctx_t *scratch)
{
    core_state_info_t in;
    if (core_state_peek(blob, len, &in, NULL) < 0)
        return;
    for (size_t i = first; i < in.n_checkpoints; i++) {
        const void *p = NULL;
        size_t pl = 0, wl = 0;
        owner_t o;
        int have = 0;
        unsigned char *buf = NULL;
        int32_t *ids = NULL;
        if (core_state_checkpoint(blob, len, i, &p, &pl, NULL) < 0 ||
            restore(st, p, pl, scratch, &o, &have, NULL, 0) < 0 || !have ||
            owner_input(&o, &ids, NULL, 0) < 0)
            return;
        memcpy(o.owner, s->owner, sizeof o.owner);
        o.created = s->created;
        char name[CKPT_NAME_MAX];
        ckpt_name(name, s->id, o.turns);
        int rc = serialize_meta(st, s->id, &o, ids, o.n_in, scratch, NULL, 0, &buf, &wl, NULL, 0);
        free(ids);
        if (rc == 0)
            rc = write_file(st, name, buf, wl, NULL, 0);
        free(buf);
        pthread_mutex_lock(&st->mu);
        if (rc == 0 && ckpt_add(st, s, o.turns, ctx_tokens(scratch), wl, NULL, 0) < 0) {
            unlinkat(st->dirfd, name, 0);
            rc = -1;
        }
        pthread_mutex_unlock(&st->mu);
        if (rc < 0)
            return;
    }
}

int srv_store_import(srv_store_t *st, const char *id, const void *blob, size_t len, char *err,
                     size_t errlen)
{
    int rc;
    srv_session_t *s = NULL;
    int reserved = 0;
    srv_seq_ctx_t scratch = {0};
    if (!srv_session_id_valid(id)) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                        "malformed session id (expected 32 lowercase hex chars)");
        goto out;
    }
    if (!blob || len > st->max_export) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH,
                        "state blob of %zu bytes is larger than any state of this "
                        "server (%zu)",
                        len, st->max_export);
        goto out;
    }
    if (st->be) {
        rc = srv_sess_remote_import(st, id, blob, len, err, errlen);
        goto out;
    }
    pthread_mutex_lock(&st->mu);
    rc = take(st, id, &s, err, errlen);
    int64_t tokens0 = rc == 0 ? s->tokens : 0;
    size_t bytes0 = rc == 0 ? s->state_bytes : 0;
    if (rc == 0 && !s->ctx.state) {
        /* Evicted: the blob goes into a fresh context, swapped in below. */
        if ((rc = make_room(st, 1, err, errlen)) < 0) {
            give_back(st, s);
        } else {
            reserved = 1;
            st->n_mem++;
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        goto out;

    srv_seq_ctx_t fresh = {0}, *c = &s->ctx;
    owner_t o = {0};
    int have = 0, written = 0;
    size_t first = 0;
    const int64_t turns0 = s->turns;
    const size_t pg_text0 = s->pg_text, pg_reply0 = s->pg_reply;
    int32_t *in = NULL;
    unsigned char *pg = NULL;
    core_error_t ve = {0};
    /* the whole blob, checkpoints included, is checked before anything
     * changes */
    if (core_state_verify(blob, len, st->fp, st->attn, &ve) < 0) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", ve.msg);
        goto done;
    }
    have = blob_owner(blob, len, &o) == 0;
    if ((rc = ctx_new(st, &scratch, err, errlen)) < 0 ||
        (rc = import_check(st, blob, len, have ? o.turns : 0, &scratch, &first, err, errlen)) < 0)
        goto done;
    if (reserved) {
        if ((rc = ctx_new(st, &fresh, err, errlen)) < 0)
            goto done;
        c = &fresh;
    }
    if ((rc = restore(st, blob, len, c, &o, &have, err, errlen)) < 0 ||
        (rc = owner_input(&o, &in, err, errlen)) < 0 || (rc = owner_pg(&o, &pg, err, errlen)) < 0) {
        ctx_free(&fresh);
        goto done;
    }
    pthread_mutex_lock(&st->mu);
    /* the session's checkpoints belong to the state it leaves; deleted
     * first, so that no crash can pair them with the new one */
    ckpt_drop_from(st, s, 0);
    s->turn_open = have ? o.turn_open : 0;
    s->has_chat = have ? o.has_chat : 0;
    s->turns = have ? o.turns : 0;
    free(s->last_in);
    s->last_in = in;
    s->n_last_in = have ? o.n_in : 0;
    s->last_flags = have ? o.last_flags : 0;
    in = NULL;
    pg_set(s, have ? pg : NULL, o.pg_text, o.pg_reply);
    if (have)
        pg = NULL;
    ctx_free(&s->prep);
    s->last_used = (int64_t)time(NULL);
    pthread_mutex_unlock(&st->mu);
    size_t wlen = 0;
    if (st->dirfd >= 0) {
        unsigned char *buf = NULL;
        rc = serialize_ctx(st, s, c, &buf, &wlen, err, errlen);
        if (rc == 0)
            rc = write_file(st, s->id, buf, wlen, err, errlen);
        free(buf);
        written = rc == 0;
    }
    if (reserved) {
        pthread_mutex_lock(&st->mu);
        s->ctx = fresh;
        s->mem_bytes = 0;
        pthread_mutex_unlock(&st->mu);
        reserved = 0; /* the reservation became the session's */
    }
    pthread_mutex_lock(&st->mu);
    s->dirty = !written;
    if (written) {
        disk_written(st, s, wlen);
    } else if (st->dirfd >= 0) {
        if (s->on_disk) { /* the file's */
            s->turns = turns0;
            s->pg_text = pg_text0;
            s->pg_reply = pg_reply0;
        }
        revert(st, s, tokens0, bytes0);
    }
    pthread_mutex_unlock(&st->mu);
    if (written && st->max_ckpt)
        import_write(st, s, blob, len, first, &scratch);
done:
    free(in);
    free(pg);
    ctx_free(&scratch);
    pthread_mutex_lock(&st->mu);
    if (reserved)
        st->n_mem--;
    refresh(st, s);
    s->tick = ++st->tick;
    give_back(st, s);
    make_room(st, 0, NULL, 0);
    trim_disk(st, s, NULL, 0);
    pthread_mutex_unlock(&st->mu);
out:
    return rc;
}

int srv_store_sweep(srv_store_t *st, int64_t now, char *err, size_t errlen)
{
    int first = 0;
    pthread_mutex_lock(&st->mu);
    if (st->be) {
        srv_sess_remote_sweep(st, now);
        int rc = make_room(st, 0, err, errlen);
        pthread_mutex_unlock(&st->mu);
        return rc;
    }
    if (st->ttl_s > 0) {
        size_t i = 0;
        while (i < st->n) {
            srv_session_t *s = st->tab[i];
            if (s->busy || s->io || now - s->last_used < st->ttl_s) {
                i++;
                continue;
            }
            int rc = remove_session(st, s, err, errlen);
            if (rc < 0) {
                if (!first)
                    first = rc;
                i++;
            }
        }
    }
    int rc = make_room(st, 0, err, errlen);
    int rc2 = trim_disk(st, NULL, err, errlen);
    pthread_mutex_unlock(&st->mu);
    return first ? first : rc < 0 ? rc : rc2;
}

void srv_store_no_io_here(srv_store_t *st)
{
    pthread_mutex_lock(&st->mu);
    st->no_io_thread = pthread_self();
    st->has_no_io = 1;
    pthread_mutex_unlock(&st->mu);
}

int srv_store_needs_settle(srv_store_t *st)
{
    return atomic_load(&st->unsettled);
}

int srv_store_settle(srv_store_t *st, char *err, size_t errlen)
{
    pthread_mutex_lock(&st->mu);
    atomic_store(&st->unsettled, 0);
    int rc = make_room(st, 0, err, errlen);
    int rc2 = trim_disk(st, NULL, err, errlen);
    pthread_mutex_unlock(&st->mu);
    return rc < 0 ? rc : rc2;
}

int srv_store_flush(srv_store_t *st, char *err, size_t errlen)
{
    int first = 0;
    char cursor[ID_LEN + 1] = "";
    pthread_mutex_lock(&st->mu);
    if (st->dirfd >= 0) {
        /* By id cursor: the table may change while a write runs unlocked. */
        for (size_t i = 0; i < st->n; i = tab_bound(st, cursor, 1)) {
            srv_session_t *s = st->tab[i];
            memcpy(cursor, s->id, sizeof cursor);
            if (!s->ctx.state || s->busy || s->io || (!s->dirty && s->on_disk))
                continue;
            int rc = write_marked(st, s, err, errlen);
            if (rc < 0 && !first)
                first = rc;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return first;
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

void srv_store_stats(srv_store_t *st, size_t *in_memory, size_t *on_disk, size_t *bytes)
{
    pthread_mutex_lock(&st->mu);
    size_t m = 0;
    for (size_t i = 0; i < st->n; i++)
        m += st->tab[i]->ctx.state != NULL;
    if (in_memory)
        *in_memory = m;
    if (on_disk)
        *on_disk = st->n_disk;
    if (bytes)
        *bytes = st->mem_bytes;
    pthread_mutex_unlock(&st->mu);
}

/* ---- turns, rollback, redo ---- */

int srv_store_turn_begin(srv_store_t *st, srv_session_t *s, const int32_t *input, size_t n,
                         unsigned flags, char *err, size_t errlen)
{
    if (!s || !s->busy || s->in_turn || (n && !input))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "turn begin: session not held, or a turn is open");
    const int keep = n <= SRV_TURN_INPUT_MAX;
    int32_t *in = NULL;
    if (keep && n) {
        in = malloc(n * sizeof *in);
        if (!in)
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a turn's input");
        memcpy(in, input, n * sizeof *in);
    }
    pthread_mutex_lock(&st->mu);
    s->in_turn = 1;
    s->turns0 = s->turns;
    s->tokens0 = ctx_tokens(&s->ctx);
    s->bytes0 = s->state_bytes;
    s->dirty0 = s->dirty;
    /* the file holds the state as it is now: the turn's checkpoint */
    s->turn_link = st->max_ckpt > 0 && s->on_disk && !s->dirty && !s->redo;
    s->prev_flags = s->last_flags;
    s->prev_in = s->last_in;
    s->n_prev_in = s->n_last_in;
    s->last_in = in;
    s->n_last_in = keep ? n : 0;
    s->last_flags = (flags & (SRV_TURN_REPLY | SRV_TURN_CHAT)) | (keep ? TURN_KEPT : 0u);
    s->turns++;
    s->dirty = 1;
    ctx_free(&s->prep);
    refresh(st, s);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

void srv_store_turn_abort(srv_store_t *st, srv_session_t *s)
{
    pthread_mutex_lock(&st->mu);
    turn_end(st, s, 1);
    pthread_mutex_unlock(&st->mu);
}

/* Caller holds mu and s: the checkpoint of s for `turn` turns (index *k),
 * or ENOCKPT saying why not; what names the request in the message. */
static int ckpt_for(const srv_session_t *s, int64_t turn, const char *what, ssize_t *k, char *err,
                    size_t errlen)
{
    char r[96];
    if (turn < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                          "session %s has had %lld turn%s: %s cannot go "
                          "back further (%s)",
                          s->id, (long long)s->turns, s->turns == 1 ? "" : "s", what,
                          ckpt_range(s, r, sizeof r));
    *k = ckpt_find(s, turn);
    if (*k < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                          "session %s has no checkpoint after %lld turn%s "
                          "for %s (%s)",
                          s->id, (long long)turn, turn == 1 ? "" : "s", what,
                          ckpt_range(s, r, sizeof r));
    return 0;
}

int srv_store_rollback(srv_store_t *st, const char *id, int64_t n, srv_session_info_t *info,
                       char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (n < 1)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "a rollback goes back at least one turn");
    srv_session_t *s = NULL;
    ssize_t k = -1;
    pthread_mutex_lock(&st->mu);
    int rc = take(st, id, &s, err, errlen);
    if (rc == 0 &&
        (rc = ckpt_for(s, n > s->turns ? -1 : s->turns - n, "a rollback", &k, err, errlen)) < 0)
        give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    const ckpt_t ck = s->ckpt[k];
    const int in_mem = s->ctx.state != NULL;
    char name[CKPT_NAME_MAX], eb[128];
    ckpt_name(name, id, ck.turn);
    /* read and checked whole before anything changes */
    srv_seq_ctx_t c;
    meta_t m;
    rc = load_file(st, name, &c, &m, err, errlen);
    if (rc == 0 && (fault(st, "rename") || renameat(st->dirfd, name, st->dirfd, id) < 0)) {
        int e = errno;
        rc = STORE_FAIL(err, errlen, io_code(e),
                        "renaming %s/%s to %s: %s (the session is as it was)", st->dir, name, id,
                        errstr(e, eb, sizeof eb));
        ctx_free(&c);
        meta_free(&m);
    }
    if (rc == 0)
        (void)fsync(st->dirfd); /* the rename is done; its durability is the disk's */
    srv_seq_ctx_t old = {0};
    int32_t *old_in = NULL;
    unsigned char *old_pg = NULL;
    pthread_mutex_lock(&st->mu);
    if (rc == SRV_STORE_ENOTFOUND) { /* the file went behind our back */
        ckpt_forget(st, s, (size_t)k);
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "the checkpoint file %s/%s is gone",
                        st->dir, name);
    }
    if (rc == 0) {
        /* the checkpoint's file is the session's now */
        ckpt_forget(st, s, (size_t)k);
        disk_written(st, s, ck.bytes);
        ckpt_drop_from(st, s, (size_t)k);
        s->turns = ck.turn;
        s->turn_open = m.have ? m.o.turn_open : 0;
        s->has_chat = m.have ? m.o.has_chat : 0;
        s->tokens = ck.tokens;
        s->state_bytes = ck.bytes;
        s->dirty = 0;
        s->last_used = (int64_t)time(NULL); /* in memory; the file keeps the checkpoint's */
        ctx_free(&s->prep);
        if (in_mem) {
            old = s->ctx;
            s->ctx = c;
            old_in = s->last_in;
            s->last_in = m.in;
            s->n_last_in = m.o.n_in;
            s->last_flags = m.have ? m.o.last_flags : 0;
            old_pg = s->pg;
            s->pg = NULL;
            pg_set(s, m.pg, m.o.pg_text, m.o.pg_reply);
            refresh(st, s);
        } else {
            /* the file has it: only its sizes, for info */
            s->pg_text = m.o.pg_text;
            s->pg_reply = m.o.pg_reply;
            ctx_free(&c);
            meta_free(&m);
        }
        if (info)
            fill_info(s, info);
    }
    s->tick = ++st->tick;
    give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    ctx_free(&old);
    free(old_in);
    free(old_pg);
    return rc;
}

int srv_store_redo_prepare(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    srv_session_t *s = NULL;
    ssize_t k = -1;
    pthread_mutex_lock(&st->mu);
    int rc = take(st, id, &s, err, errlen);
    if (rc == 0) {
        if (!s->ctx.state)
            rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED, "session %s is on disk, not in memory",
                            id);
        else if (s->turns == 0)
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "session %s has no turn to regenerate",
                            id);
        else if (!(s->last_flags & SRV_TURN_REPLY))
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                            "the last turn of session %s generated no reply "
                            "to regenerate (it only added input)",
                            id);
        else if (!(s->last_flags & TURN_KEPT))
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT,
                            "the last turn of session %s had more than %d "
                            "input tokens, which are not kept for a regenerate; roll it back "
                            "and send it again",
                            id, SRV_TURN_INPUT_MAX);
        else
            rc = ckpt_for(s, s->turns - 1, "a regenerate", &k, err, errlen);
        if (rc < 0)
            give_back(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        return rc;
    char name[CKPT_NAME_MAX];
    ckpt_name(name, id, s->ckpt[k].turn);
    srv_seq_ctx_t c;
    meta_t m;
    rc = load_file(st, name, &c, &m, err, errlen);
    meta_free(&m);
    pthread_mutex_lock(&st->mu);
    if (rc == SRV_STORE_ENOTFOUND) {
        ckpt_forget(st, s, (size_t)k);
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOCKPT, "the checkpoint file %s/%s is gone",
                        st->dir, name);
    }
    if (rc == 0) {
        ctx_free(&s->prep);
        s->prep = c;
        s->prep_turns = s->turns;
        s->prep_turn_open = m.have ? m.o.turn_open : 0;
        s->prep_has_chat = m.have ? m.o.has_chat : 0;
        refresh(st, s);
    }
    s->tick = ++st->tick;
    give_back(st, s);
    make_room(st, 0, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_store_redo_begin(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    pthread_mutex_lock(&st->mu);
    int rc = 0;
    if (!s->busy || s->in_turn || s->redo)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "redo: session not held, or a turn is open");
    else if (!s->prep.state || s->prep_turns != s->turns)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED,
                        "session %s: the checkpoint to regenerate from is "
                        "not in memory",
                        s->id);
    if (rc == 0) {
        s->aside = s->ctx;
        s->aside_turn_open = s->turn_open;
        s->aside_has_chat = s->has_chat;
        s->ctx = s->prep;
        memset(&s->prep, 0, sizeof s->prep);
        s->turn_open = s->prep_turn_open;
        s->has_chat = s->prep_has_chat;
        s->tokens0 = s->tokens;
        s->bytes0 = s->state_bytes;
        s->dirty0 = s->dirty;
        s->dirty = 1;
        s->redo = 1;
        refresh(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* ---- accessors ---- */

const char *srv_session_id(const srv_session_t *s)
{
    return s->id;
}

srv_seq_ctx_t *srv_session_ctx(srv_session_t *s)
{
    return &s->ctx;
}

int srv_session_turn_open(const srv_session_t *s)
{
    return s->turn_open;
}

/* The flags are in the saved file: changing one makes the session dirty. */
static void set_flag(srv_session_t *s, int *flag, int v)
{
    pthread_mutex_lock(&s->st->mu);
    if (*flag != (v ? 1 : 0)) {
        *flag = v ? 1 : 0;
        s->dirty = 1;
    }
    pthread_mutex_unlock(&s->st->mu);
}

void srv_session_set_turn_open(srv_session_t *s, int open)
{
    set_flag(s, &s->turn_open, open);
}

int srv_session_has_chat(const srv_session_t *s)
{
    return s->has_chat;
}

void srv_session_set_has_chat(srv_session_t *s, int v)
{
    set_flag(s, &s->has_chat, v);
}

const char *srv_session_owner(const srv_session_t *s)
{
    return s->owner;
}

int srv_session_set_owner(srv_session_t *s, const char *owner, char *err, size_t errlen)
{
    if (!owner || !owner_tag_valid(owner))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed owner tag");
    pthread_mutex_lock(&s->st->mu);
    if (strcmp(s->owner, owner) != 0) {
        memcpy(s->owner, owner, strlen(owner) + 1);
        s->dirty = 1;
    }
    pthread_mutex_unlock(&s->st->mu);
    return 0;
}

int64_t srv_session_tokens(const srv_session_t *s)
{
    return s->ctx.state ? ctx_tokens(&s->ctx) : s->tokens;
}

int64_t srv_session_turns(const srv_session_t *s)
{
    return s->turns;
}

int srv_session_last_turn(const srv_session_t *s, unsigned *flags, const int32_t **input,
                          size_t *n)
{
    *flags = s->last_flags & (SRV_TURN_REPLY | SRV_TURN_CHAT);
    *input = s->n_last_in ? s->last_in : NULL;
    *n = s->n_last_in;
    return (s->last_flags & TURN_KEPT) != 0;
}

int srv_session_pending_grammar(const srv_session_t *s, const char **text, size_t *tlen,
                                const char **reply, size_t *rlen)
{
    *text = *reply = NULL;
    *tlen = *rlen = 0;
    if (!s->pg)
        return 0;
    *text = (const char *)s->pg;
    *tlen = s->pg_text;
    *reply = (const char *)s->pg + s->pg_text;
    *rlen = s->pg_reply;
    return 1;
}

int srv_session_set_pending_grammar(srv_session_t *s, const char *text, size_t tlen,
                                    const char *reply, size_t rlen, char *err, size_t errlen)
{
    unsigned char *pg = NULL;
    if (text) {
        if (!tlen || tlen > SRV_PENDING_GRAMMAR_MAX || rlen > SRV_PENDING_GRAMMAR_MAX - tlen ||
            (rlen && !reply))
            return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                              "pending grammar of %zu + %zu bytes (at most "
                              "%zu in all)",
                              tlen, rlen, SRV_PENDING_GRAMMAR_MAX);
        if (!(pg = malloc(tlen + rlen)))
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a pending grammar");
        memcpy(pg, text, tlen);
        if (rlen)
            memcpy(pg + tlen, reply, rlen);
    }
    srv_store_t *st = s->st;
    pthread_mutex_lock(&st->mu);
    if (pg || s->pg) {
        pg_set(s, pg, tlen, rlen);
        s->dirty = 1;
        refresh(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return 0;
}

void srv_session_touch(srv_session_t *s)
{
    srv_store_t *st = s->st;
    pthread_mutex_lock(&st->mu);
    s->last_used = (int64_t)time(NULL);
    s->dirty = 1;
    s->tick = ++st->tick;
    pthread_mutex_unlock(&st->mu);
}

/* ---- for store_remote.c (store_impl.h) ---- */

int srv_sess_new_id(char id[ID_LEN + 1], char *err, size_t errlen)
{
    return new_id(id, err, errlen);
}

srv_session_t *srv_sess_tab_find(const srv_store_t *st, const char *id)
{
    return tab_find(st, id);
}

int srv_sess_tab_insert(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    return tab_insert(st, s, err, errlen);
}

void srv_sess_tab_remove(srv_store_t *st, const srv_session_t *s)
{
    tab_remove(st, s);
}

srv_session_t *srv_sess_find_settled(srv_store_t *st, const char *id)
{
    return find_settled(st, id);
}

void srv_sess_ctx_free(srv_seq_ctx_t *c)
{
    ctx_free(c);
}

int srv_sess_ctx_copy(srv_store_t *st, const srv_seq_ctx_t *src, srv_seq_ctx_t *c, char *err,
                      size_t errlen)
{
    return ctx_copy(st, src, c, err, errlen);
}

int64_t srv_sess_ctx_tokens(const srv_seq_ctx_t *c)
{
    return ctx_tokens(c);
}

void srv_sess_refresh(srv_store_t *st, srv_session_t *s)
{
    refresh(st, s);
}

void srv_sess_drop_memory(srv_store_t *st, srv_session_t *s)
{
    drop_memory(st, s);
}

void srv_sess_disk_written(srv_store_t *st, srv_session_t *s, size_t len)
{
    disk_written(st, s, len);
}

int srv_sess_make_room(srv_store_t *st, size_t need, char *err, size_t errlen)
{
    return make_room(st, need, err, errlen);
}

void srv_sess_give_back(srv_store_t *st, srv_session_t *s)
{
    give_back(st, s);
}

void srv_sess_forget(srv_store_t *st, srv_session_t *s)
{
    disk_gone(st, s);
    drop_memory(st, s);
    tab_remove(st, s);
    free(s->ckpt);
    free(s->pg);
    free(s);
    pthread_cond_broadcast(&st->cv);
}

void srv_sess_pg_set(srv_session_t *s, unsigned char *pg, size_t t, size_t r)
{
    pg_set(s, pg, t, r);
}

int srv_sess_serialize_ctx(const srv_store_t *st, const srv_session_t *s, const srv_seq_ctx_t *c,
                           unsigned char **out, size_t *len, char *err, size_t errlen)
{
    return serialize_ctx(st, s, c, out, len, err, errlen);
}

int srv_sess_load_blob(srv_store_t *st, const unsigned char *buf, size_t len, const char *what,
                       srv_seq_ctx_t *c, meta_t *m, char *err, size_t errlen)
{
    return load_blob(st, buf, len, what, c, m, err, errlen);
}

void srv_sess_meta_free(meta_t *m)
{
    meta_free(m);
}
