/* server/store/store.c — the session store (server/store/store.h): the table of
 * sessions, their memory and its bounds, and the calls that hold, give
 * back, copy and list sessions.
 *
 * One mutex guards the table (an array of sessions sorted by id) and every
 * session's bookkeeping; disk I/O and (de)serialization run outside it on a
 * session that is either busy (held by a caller or by fork / export /
 * import) or marked io (eviction, flush), so a 50 MB write never stalls
 * other sessions. Whoever meets an io session waits on the condition
 * variable; whoever meets a busy one gets SRV_STORE_EBUSY.
 *
 * The rest of the store: store_blob.c (what a session's file holds, export
 * and import), store_dir.c (the session directory), store_turns.c (turns
 * and checkpoints), store_remote.c (a shared backend); their shared
 * structures and helpers are in store_impl.h.
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"
#include "server/store/store_test.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/sample.h"
#include "core/state.h"
#include "proto/proto.h"
#include "server/base/random.h"

/* ---- errors ---- */

const char *srv_store_strerror(int code)
{
    switch (code) {
#define SRV_STORE_ERR_STR_(name, val, desc)                                                        \
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

const char *srv_sess_errstr(int e, char *buf, size_t n)
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
    return e ? STORE_FAIL(err, errlen, SRV_STORE_EIO, "getrandom: %s",
                          srv_sess_errstr(e, eb, sizeof eb))
             : 0;
}

int srv_sess_new_id(char id[ID_LEN + 1], char *err, size_t errlen)
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

srv_session_t *srv_sess_tab_find(const srv_store_t *st, const char *id)
{
    size_t i = tab_bound(st, id, 0);
    return i < st->n && strcmp(st->tab[i]->id, id) == 0 ? st->tab[i] : NULL;
}

int srv_sess_tab_reserve(srv_store_t *st, char *err, size_t errlen)
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

int srv_sess_tab_insert(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    int rc = srv_sess_tab_reserve(st, err, errlen);
    if (rc < 0)
        return rc;
    size_t i = tab_bound(st, s->id, 0);
    memmove(st->tab + i + 1, st->tab + i, (st->n - i) * sizeof(srv_session_t *));
    st->tab[i] = s;
    st->n++;
    return 0;
}

void srv_sess_tab_remove(srv_store_t *st, const srv_session_t *s)
{
    size_t i = tab_bound(st, s->id, 0);
    if (i < st->n && st->tab[i] == s) {
        memmove(st->tab + i, st->tab + i + 1, (st->n - i - 1) * sizeof(srv_session_t *));
        st->n--;
    }
}

/* Waits while s is under store I/O. Returns s, or NULL if it vanished. */
srv_session_t *srv_sess_find_settled(srv_store_t *st, const char *id)
{
    for (;;) {
        srv_session_t *s = srv_sess_tab_find(st, id);
        if (!s || !s->io)
            return s;
        pthread_cond_wait(&st->cv, &st->mu);
    }
}

/* ---- compute contexts ---- */

void srv_sess_ctx_free(srv_seq_ctx_t *c)
{
    core_attn_state_free(c->state);
    core_sampler_free(c->sampler);
    free(c->pending);
    memset(c, 0, sizeof *c);
}

/* Fresh empty context: state of the model's attention, default sampler with
 * a random seed (sessions that never set a seed must not share one stream). */
int srv_sess_ctx_new(srv_store_t *st, srv_seq_ctx_t *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    core_error_t e = {0};
    core_sample_params_t p;
    core_sample_params_default(&p);
    if (random_bytes(&p.seed, sizeof p.seed, NULL, 0) < 0)
        p.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)c;
    if (core_attn_state_new(st->attn, &c->state, &e) < 0 ||
        core_sampler_new(&p, &c->sampler, &e) < 0) {
        srv_sess_ctx_free(c);
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
void srv_sess_pg_set(srv_session_t *s, unsigned char *pg, size_t t, size_t r)
{
    free(s->pg);
    s->pg = pg;
    s->pg_text = pg ? t : 0;
    s->pg_reply = pg ? r : 0;
}

int64_t srv_sess_ctx_tokens(const srv_seq_ctx_t *c)
{
    return core_attn_state_pos(c->state) + (int64_t)c->n_pending;
}

/* Caller holds mu. Re-reads the size and token count of a session in memory. */
void srv_sess_refresh(srv_store_t *st, srv_session_t *s)
{
    if (!s->ctx.state)
        return;
    size_t m = session_mem(s);
    st->mem_bytes = st->mem_bytes - s->mem_bytes + m;
    s->mem_bytes = m;
    s->tokens = srv_sess_ctx_tokens(&s->ctx);
    s->state_bytes =
        core_state_size(s->ctx.state, s->ctx.sampler, s->ctx.n_pending,
                        srv_sess_owner_bytes(s->n_last_in, s->pg_text + s->pg_reply, s->gen));
}

/* Caller holds mu. Frees a session's context and its accounting (not n_mem
 * reservations: the caller adjusts those). */
void srv_sess_drop_memory(srv_store_t *st, srv_session_t *s)
{
    if (!s->ctx.state)
        return;
    st->mem_bytes -= s->mem_bytes;
    st->n_mem--;
    s->mem_bytes = 0;
    srv_sess_ctx_free(&s->ctx);
    srv_sess_ctx_free(&s->prep);
    srv_sess_ctx_free(&s->aside);
    last_clear(s);
    free(s->prev_in);
    s->prev_in = NULL;
    s->n_prev_in = 0;
}

/* Caller holds mu: writing s failed. The client was told that its change
 * was not saved, so the session goes back to what was saved, its file
 * (read again at the next acquire), with the token count and size it had
 * then; a session without a file keeps its memory, to be written later. */
void srv_sess_revert(srv_store_t *st, srv_session_t *s, int64_t tokens, size_t state_bytes)
{
    if (!s->on_disk) {
        s->dirty = 1;
        return;
    }
    srv_sess_drop_memory(st, s);
    s->dirty = 0;
    s->tokens = tokens;
    s->state_bytes = state_bytes;
}

/* Caller holds mu: s's file was just written with len bytes. */
void srv_sess_disk_written(srv_store_t *st, srv_session_t *s, size_t len)
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
void srv_sess_disk_gone(srv_store_t *st, srv_session_t *s)
{
    if (!s->on_disk)
        return;
    st->n_disk--;
    st->disk_bytes -= s->disk_bytes;
    s->on_disk = 0;
    s->disk_bytes = 0;
}

/* ---- eviction (caller holds mu; released around the I/O) ---- */

/* Is the caller the thread that must not wait for the disk? */
int srv_sess_no_io_here(const srv_store_t *st)
{
    return st->has_no_io && pthread_equal(pthread_self(), st->no_io_thread);
}

/* The least recently used idle session in memory; on the no-I/O thread
 * only one whose file is current (dropping it writes nothing). */
static srv_session_t *lru_victim(const srv_store_t *st)
{
    /* a shared store's copy in memory is dropped, never written: only one
     * equal to the backend's goes */
    const int clean = srv_sess_no_io_here(st) || st->be;
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
    int rc = srv_sess_serialize(st, s, &buf, &len, err, errlen);
    if (rc == 0)
        rc = srv_sess_write_file(st, s->id, buf, len, err, errlen);
    free(buf);
    pthread_mutex_lock(&st->mu);
    if (rc == 0) {
        srv_sess_disk_written(st, s, len);
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
    srv_sess_drop_memory(st, s);
    return 0;
}

/* Evicts least recently used idle sessions until the bounds hold with
 * `need` more sessions in memory. With need, failing to make room is
 * SRV_STORE_EFULL; the byte bound is a target (busy sessions stay). */
int srv_sess_make_room(srv_store_t *st, size_t need, char *err, size_t errlen)
{
    for (;;) {
        int over_n = st->max_sessions && st->n_mem + need > st->max_sessions;
        int over_b = st->max_bytes && st->mem_bytes > st->max_bytes;
        if (!over_n && !over_b)
            return 0;
        srv_session_t *v = st->dirfd >= 0 || st->be ? lru_victim(st) : NULL;
        if (!v && srv_sess_no_io_here(st) && st->dirfd >= 0) {
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

/* ---- the store ---- */

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
    st->max_blob =
        max_blob_bytes(core_attn_config(st->attn), CORE_STATE_MAX_PENDING, CORE_STATE_MAX_OWNER);
    const int use_dir = o->dir && o->dir[0] && !st->be;
    st->max_ckpt = use_dir ? o->max_checkpoints : 0;
    st->max_ckpt_blob =
        max_blob_bytes(core_attn_config(st->attn), CKPT_PENDING_MAX,
                       srv_sess_owner_bytes(SRV_TURN_INPUT_MAX, SRV_PENDING_GRAMMAR_MAX, 1));
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
        if ((rc = srv_sess_open_dir(st, err, errlen)) < 0)
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
        srv_sess_ctx_free(&s->ctx);
        srv_sess_ctx_free(&s->prep);
        srv_sess_ctx_free(&s->aside);
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
    int rc = srv_sess_ctx_new(st, &s->ctx, err, errlen);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->st = st;
    s->created = s->last_used = (int64_t)time(NULL);
    s->busy = 1;
    s->dirty = 1;
    pthread_mutex_lock(&st->mu);
    if ((rc = srv_sess_make_room(st, 1, err, errlen)) < 0)
        goto fail;
    do {
        if ((rc = srv_sess_new_id(s->id, err, errlen)) < 0)
            goto fail;
    } while (srv_sess_tab_find(st, s->id));
    if ((rc = srv_sess_tab_insert(st, s, err, errlen)) < 0)
        goto fail;
    s->tick = ++st->tick;
    s->mem_bytes = session_mem(s);
    st->mem_bytes += s->mem_bytes;
    st->n_mem++;
    s->tokens = 0;
    s->state_bytes = core_state_size(s->ctx.state, s->ctx.sampler, 0, srv_sess_owner_bytes(0, 0, 0));
    pthread_mutex_unlock(&st->mu);
    *out = s;
    return 0;
fail:
    pthread_mutex_unlock(&st->mu);
    srv_sess_ctx_free(&s->ctx);
    free(s);
    return rc;
}

/* Caller holds mu and s busy, s not in memory: loads it (mu released around
 * the I/O). On ENOTFOUND (file gone) the entry is removed and freed. */
static int bring_in(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    int rc = srv_sess_make_room(st, 1, err, errlen);
    if (rc < 0)
        return rc;
    st->n_mem++; /* reserved while loading */
    pthread_mutex_unlock(&st->mu);
    srv_seq_ctx_t c;
    meta_t m;
    char id[ID_LEN + 1];
    memcpy(id, s->id, sizeof id);
    rc = srv_sess_load_file(st, id, &c, &m, err, errlen);
    pthread_mutex_lock(&st->mu);
    if (rc < 0) {
        st->n_mem--;
        if (rc == SRV_STORE_ENOTFOUND) {
            srv_sess_ckpt_drop_from(st, s, 0);
            srv_sess_tab_remove(st, s);
            srv_sess_disk_gone(st, s);
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
        s->gen = m.o.gen;
        if (s->gen > s->gen_used)
            s->gen_used = s->gen;
        /* checkpoints the file does not reach, as at startup */
        for (size_t k = s->n_ckpt; k-- > 0;)
            if (s->ckpt[k].turn >= s->turns || s->ckpt[k].gen != s->gen)
                srv_sess_ckpt_drop_from(st, s, k);
    }
    s->last_flags = m.o.last_flags;
    s->last_in = m.in;
    s->n_last_in = m.o.n_in;
    srv_sess_pg_set(s, m.pg, m.o.pg_text, m.o.pg_reply);
    s->mem_bytes = 0;
    srv_sess_refresh(st, s);
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
    /* waiting out a write (srv_sess_find_settled) is waiting for the disk too */
    srv_session_t *s = from_disk ? srv_sess_find_settled(st, id) : srv_sess_tab_find(st, id);
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
        srv_sess_turn_end(st, s, 1);
        srv_sess_redo_end(st, s, 1);
        pthread_mutex_unlock(&st->mu);
    }
    /* the state before the turn is the file being replaced: kept as the
     * turn's checkpoint by a link */
    char link_as[CKPT_NAME_MAX];
    int want_link = write && s->in_turn && s->turn_link, linked = 0;
    if (want_link)
        srv_sess_ckpt_name(link_as, s->id, s->turns0, s->gen);
    if (write) {
        rc = srv_sess_serialize(st, s, &buf, &len, err, errlen);
        if (rc == 0 && st->be)
            rc = srv_sess_remote_save(st, s, buf, len, err, errlen);
        else if (rc == 0)
            rc = srv_sess_write_file_link(st, s->id, buf, len, want_link ? link_as : NULL, &linked,
                                          err, errlen);
        free(buf);
    }
    pthread_mutex_lock(&st->mu);
    /* what the file holds, for a failed write (a turn or a redo refreshed
     * the cached values when it began) */
    const int began = s->in_turn || s->redo;
    int64_t tokens0 = began ? s->tokens0 : s->tokens;
    size_t bytes0 = began ? s->bytes0 : s->state_bytes, file0 = s->disk_bytes;
    srv_sess_refresh(st, s);
    if (write) {
        if (rc == 0) {
            srv_sess_disk_written(st, s, len);
            s->dirty = 0;
            if (linked && srv_sess_ckpt_add(st, s, s->turns0, s->tokens0, file0, s->gen, err, errlen) < 0)
                unlinkat(st->dirfd, link_as, 0);
            srv_sess_ckpt_prune(st, s);
        } else {
            if (s->on_disk && s->in_turn)
                s->turns = s->turns0; /* the file's count */
            srv_sess_revert(st, s, tokens0, bytes0);
        }
    }
    srv_sess_turn_end(st, s, 0);
    srv_sess_redo_end(st, s, 0);
    if (persist)
        srv_sess_ctx_free(&s->prep); /* the session changed: what was prepared is stale */
    if (st->be)
        srv_sess_remote_released(st, s, persist, write && rc == 0);
    srv_sess_refresh(st, s);
    s->busy = 0;
    s->tick = ++st->tick;
    /* Another session failing to spill is the sweep's error to report, not
     * this release's: this session's own write is what the caller asked. */
    if (srv_sess_make_room(st, 0, NULL, 0) == 0)
        (void)srv_sess_trim_disk(st, s, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_store_delete(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (st->be)
        return srv_sess_remote_delete(st, id, err, errlen);
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_find_settled(st, id);
    int rc;
    if (!s)
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    else if (s->busy)
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    else
        rc = srv_sess_remove_session(st, s, err, errlen);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void srv_sess_fill_info(const srv_session_t *s, srv_session_info_t *o)
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
    o->n_checkpoints =
        s->n_ckpt < SRV_STORE_MAX_CHECKPOINTS ? s->n_ckpt : SRV_STORE_MAX_CHECKPOINTS;
    for (size_t i = 0; i < o->n_checkpoints; i++)
        o->checkpoints[i] = (srv_checkpoint_t){
            .turn = s->ckpt[i].turn, .tokens = s->ckpt[i].tokens, .bytes = s->ckpt[i].bytes};
}

int srv_store_info(srv_store_t *st, const char *id, srv_session_info_t *out, char *err,
                   size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_tab_find(st, id);
    if (s)
        srv_sess_fill_info(s, out);
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
        srv_sess_fill_info(st->tab[i], &out[(*n)++]);
    }
    pthread_mutex_unlock(&st->mu);
    return 0;
}

/* Caller holds mu: takes session id for a store operation (busy). */
int srv_sess_take(srv_store_t *st, const char *id, srv_session_t **out, char *err, size_t errlen)
{
    srv_session_t *s = srv_sess_find_settled(st, id);
    if (!s)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    if (s->busy)
        return STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    s->busy = 1;
    *out = s;
    return 0;
}

void srv_sess_give_back(srv_store_t *st, srv_session_t *s)
{
    s->busy = 0;
    pthread_cond_broadcast(&st->cv);
}

/* c = independent copy of the context of src (in memory). */
int srv_sess_ctx_copy(srv_store_t *st, const srv_seq_ctx_t *src, srv_seq_ctx_t *c, char *err,
                      size_t errlen)
{
    int rc = srv_sess_ctx_new(st, c, err, errlen);
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
            srv_sess_ctx_free(c);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
        }
    }
    if (src->sampler && core_sampler_clone(src->sampler, &smp, &e) < 0) {
        srv_sess_ctx_free(c);
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "copying a session: %s", e.msg);
    }
    if (smp) {
        core_sampler_free(c->sampler);
        c->sampler = smp;
    }
    if (src->n_pending) {
        c->pending = malloc(src->n_pending * sizeof *c->pending);
        if (!c->pending) {
            srv_sess_ctx_free(c);
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
    if (owner && !srv_sess_owner_tag_valid(owner))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "malformed owner tag");
    if (st->be)
        return srv_sess_remote_fork(st, id, owner, out_id, err, errlen);
    srv_session_t *ns = calloc(1, sizeof *ns), *src = NULL;
    if (!ns)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
    pthread_mutex_lock(&st->mu);
    int rc = srv_sess_take(st, id, &src, err, errlen);
    if (rc < 0) {
        pthread_mutex_unlock(&st->mu);
        free(ns);
        return rc;
    }
    if ((rc = srv_sess_make_room(st, 1, err, errlen)) < 0)
        goto fail_locked;
    do {
        if ((rc = srv_sess_new_id(ns->id, err, errlen)) < 0)
            goto fail_locked;
    } while (srv_sess_tab_find(st, ns->id));
    if ((rc = srv_sess_tab_insert(st, ns, err, errlen)) < 0)
        goto fail_locked;
    srv_sess_fork_init(st, ns, src, owner);
    st->n_mem++; /* reserved while copying */
    pthread_mutex_unlock(&st->mu);

    srv_seq_ctx_t c;
    meta_t m = {0};
    if (src->ctx.state) {
        owner_t so = srv_sess_owner_of(src);
        rc = srv_sess_ctx_copy(st, &src->ctx, &c, err, errlen);
        if (rc == 0 && (rc = srv_sess_owner_pg(&so, &m.pg, err, errlen)) < 0)
            srv_sess_ctx_free(&c);
        m.o.pg_text = so.pg_text;
        m.o.pg_reply = so.pg_reply;
    } else {
        rc = srv_sess_load_file(st, src->id, &c, &m, err, errlen);
        free(m.in);
        m.in = NULL;
    }
    if (rc == 0) /* the copy continues the reply the source left pending, too */
        srv_sess_pg_set(ns, m.pg, m.o.pg_text, m.o.pg_reply);
    else
        srv_sess_meta_free(&m);
    unsigned char *buf = NULL;
    size_t len = 0;
    if (rc == 0 && st->dirfd >= 0) {
        rc = srv_sess_serialize_ctx(st, ns, &c, &buf, &len, err, errlen);
        if (rc == 0)
            rc = srv_sess_write_file(st, ns->id, buf, len, err, errlen);
        free(buf);
        if (rc < 0)
            srv_sess_ctx_free(&c);
    }

    pthread_mutex_lock(&st->mu);
    srv_sess_give_back(st, src);
    if (rc < 0) {
        st->n_mem--;
        srv_sess_tab_remove(st, ns);
        free(ns->pg);
        free(ns);
        pthread_mutex_unlock(&st->mu);
        return rc;
    }
    ns->ctx = c;
    if (st->dirfd >= 0) {
        srv_sess_disk_written(st, ns, len);
        ns->dirty = 0;
    }
    ns->mem_bytes = 0;
    srv_sess_refresh(st, ns);
    ns->busy = 0;
    ns->tick = ++st->tick;
    memcpy(out_id, ns->id, ID_LEN + 1);
    srv_sess_make_room(st, 0, NULL, 0);
    srv_sess_trim_disk(st, ns, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return 0;
fail_locked:
    srv_sess_give_back(st, src);
    pthread_mutex_unlock(&st->mu);
    free(ns);
    return rc;
}

/* ---- sweep, settle, flush, stats ---- */

int srv_store_sweep(srv_store_t *st, int64_t now, char *err, size_t errlen)
{
    int first = 0;
    pthread_mutex_lock(&st->mu);
    if (st->be) {
        srv_sess_remote_sweep(st, now);
        int rc = srv_sess_make_room(st, 0, err, errlen);
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
            int rc = srv_sess_remove_session(st, s, err, errlen);
            if (rc < 0) {
                if (!first)
                    first = rc;
                i++;
            }
        }
    }
    int rc = srv_sess_make_room(st, 0, err, errlen);
    int rc2 = srv_sess_trim_disk(st, NULL, err, errlen);
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
    int rc = srv_sess_make_room(st, 0, err, errlen);
    int rc2 = srv_sess_trim_disk(st, NULL, err, errlen);
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

int srv_session_set_owner(srv_session_t *s, const char *owner, char *err, size_t errlen)
{
    if (!owner || !srv_sess_owner_tag_valid(owner))
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
    return s->ctx.state ? srv_sess_ctx_tokens(&s->ctx) : s->tokens;
}

int srv_session_last_turn(const srv_session_t *s, unsigned *flags, const int32_t **input, size_t *n)
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
        srv_sess_pg_set(s, pg, tlen, rlen);
        s->dirty = 1;
        srv_sess_refresh(st, s);
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

/* ---- for store_remote.c ---- */

void srv_sess_forget(srv_store_t *st, srv_session_t *s)
{
    srv_sess_disk_gone(st, s);
    srv_sess_drop_memory(st, s);
    srv_sess_tab_remove(st, s);
    free(s->ckpt);
    free(s->pg);
    free(s);
    pthread_cond_broadcast(&st->cv);
}
