/* server/store/store_table.c — the session table (server/store/store.h): the
 * sessions sorted by id, the memory and disk they take and the bounds on
 * both (eviction, the directory's budgets), each session's checkpoint
 * files, holding a session for a store operation, and building the table
 * from what the directory holds at startup.
 *
 * One mutex (st->mu) guards the table and every session's bookkeeping;
 * "caller holds mu" below means it. Disk I/O and (de)serialization run
 * outside it on a session that is either busy (held by a caller or by a
 * store operation) or marked io (eviction, flush), so a 50 MB write never
 * stalls other sessions: whoever meets an io session waits on st->cv,
 * whoever meets a busy one gets SRV_STORE_EBUSY.
 *
 * It calls store_base.c, store_codec.c and store_dir.c, nothing above
 * (store_impl.h says who calls whom).
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/state.h"

/* ---- the table (caller holds mu) ---- */

/* First index whose id is >= id (strict = 0) or > id (strict = 1). */
size_t srv_sess_tab_bound(const srv_store_t *st, const char *id, int strict)
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
    size_t i = srv_sess_tab_bound(st, id, 0);
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
    size_t i = srv_sess_tab_bound(st, s->id, 0);
    memmove(st->tab + i + 1, st->tab + i, (st->n - i) * sizeof(srv_session_t *));
    st->tab[i] = s;
    st->n++;
    return 0;
}

void srv_sess_tab_remove(srv_store_t *st, const srv_session_t *s)
{
    size_t i = srv_sess_tab_bound(st, s->id, 0);
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

/* ---- a session's memory and files (caller holds mu) ---- */

/* Memory of a session in memory: its context, a redo's second context, the
 * last turn's input. */
static size_t session_mem(const srv_session_t *s)
{
    return sizeof(srv_session_t) + srv_sess_ctx_bytes(&s->ctx) + srv_sess_ctx_bytes(&s->prep) +
           srv_sess_ctx_bytes(&s->aside) + (s->n_last_in + s->n_prev_in) * sizeof(int32_t) +
           (s->pg ? s->pg_text + s->pg_reply : 0);
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

/* Caller holds mu, s idle: removes s (file first, so a failure keeps it). */
int srv_sess_remove_session(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
{
    if (s->on_disk) {
        int rc = srv_sess_dir_unlink(st, s->id, err, errlen);
        if (rc < 0)
            return rc;
    }
    srv_sess_disk_gone(st, s);
    srv_sess_ckpt_drop_from(st, s, 0);
    srv_sess_drop_memory(st, s);
    srv_sess_tab_remove(st, s);
    free(s->ckpt);
    free(s);
    return 0;
}

/* ---- checkpoint files (caller holds mu) ---- */

/* s's checkpoint file for `turn` turns exists (after every one it has). */
int srv_sess_ckpt_add(srv_store_t *st, srv_session_t *s, int64_t turn, int64_t tokens, size_t bytes,
                      uint64_t gen, char *err, size_t errlen)
{
    if (s->n_ckpt == s->cap_ckpt) {
        size_t cap = s->cap_ckpt ? 2 * s->cap_ckpt : 8;
        ckpt_t *c = realloc(s->ckpt, cap * sizeof *c);
        if (!c)
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a checkpoint");
        s->ckpt = c;
        s->cap_ckpt = cap;
    }
    s->ckpt[s->n_ckpt++] = (ckpt_t){.turn = turn, .tokens = tokens, .bytes = bytes, .gen = gen};
    st->disk_bytes += bytes;
    st->n_ckpt_files++;
    return 0;
}

/* s's checkpoint k is no longer its (the file is gone or became another). */
void srv_sess_ckpt_forget(srv_store_t *st, srv_session_t *s, size_t k)
{
    st->disk_bytes -= s->ckpt[k].bytes;
    st->n_ckpt_files--;
    memmove(s->ckpt + k, s->ckpt + k + 1, (s->n_ckpt - k - 1) * sizeof *s->ckpt);
    s->n_ckpt--;
}

/* Deletes s's checkpoint k (its file, then the entry); a file already
 * gone is fine. On an error the entry stays. */
int srv_sess_ckpt_delete(srv_store_t *st, srv_session_t *s, size_t k, char *err, size_t errlen)
{
    char name[CKPT_NAME_MAX];
    srv_sess_ckpt_name(name, s->id, s->ckpt[k].turn, s->ckpt[k].gen);
    int rc = srv_sess_dir_unlink(st, name, err, errlen);
    if (rc == 0)
        srv_sess_ckpt_forget(st, s, k);
    return rc;
}

/* Deletes s's checkpoints from index k on (best effort: a file that cannot
 * be deleted is forgotten all the same, and startup deletes it as one past
 * the session's turns). */
void srv_sess_ckpt_drop_from(srv_store_t *st, srv_session_t *s, size_t k)
{
    while (s->n_ckpt > k)
        if (srv_sess_ckpt_delete(st, s, s->n_ckpt - 1, NULL, 0) < 0)
            srv_sess_ckpt_forget(st, s, s->n_ckpt - 1);
}

/* Deletes s's oldest checkpoints past the newest max_ckpt (best effort). */
void srv_sess_ckpt_prune(srv_store_t *st, srv_session_t *s)
{
    while (s->n_ckpt > st->max_ckpt)
        if (srv_sess_ckpt_delete(st, s, 0, NULL, 0) < 0)
            srv_sess_ckpt_forget(st, s, 0);
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
int srv_sess_write_marked(srv_store_t *st, srv_session_t *s, char *err, size_t errlen)
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
        int rc = srv_sess_write_marked(st, s, err, errlen);
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

void srv_store_disk_stats(srv_store_t *st, size_t *bytes, uint64_t *evicted)
{
    pthread_mutex_lock(&st->mu);
    if (bytes)
        *bytes = st->disk_bytes;
    if (evicted)
        *evicted = st->disk_evicted;
    pthread_mutex_unlock(&st->mu);
}

/* ---- startup ---- */

static int cmp_session(const void *a, const void *b)
{
    const srv_session_t *x = *(const srv_session_t *const *)a,
                        *y = *(const srv_session_t *const *)b;
    return strcmp(x->id, y->id);
}

/* Session files first, then checkpoints by id and turn. */
static int cmp_found(const void *a, const void *b)
{
    const srv_found_t *x = a, *y = b;
    if ((x->turn < 0) != (y->turn < 0))
        return x->turn < 0 ? -1 : 1;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->turn > y->turn) - (x->turn < y->turn);
}

/* The table as the files srv_sess_open_dir found make it (f[n], sorted
 * here; the caller frees it): a session for each session file, and each
 * gets its checkpoint files. Those a session file does not reach are
 * deleted: what a crash left (store.h "Crashes") of another generation
 * than the session file's, at or past its turn count, damaged, for another
 * configuration, or of no session (except those of a session file for
 * another model, left alone with it); then each session keeps its newest
 * max_ckpt. */
int srv_sess_table_load(srv_store_t *st, srv_found_t *f, size_t n, char *err, size_t errlen)
{
    if (n > 1)
        qsort(f, n, sizeof *f, cmp_found);
    size_t i = 0;
    for (; i < n && f[i].turn < 0; i++) {
        srv_session_t *s = calloc(1, sizeof *s);
        int rc = s ? srv_sess_tab_reserve(st, err, errlen)
                   : STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
        if (rc < 0) {
            free(s);
            return rc;
        }
        const owner_t *o = &f[i].o;
        s->st = st;
        memcpy(s->id, f[i].id, ID_LEN + 1);
        s->created = o->created;
        s->last_used = o->last_used;
        s->turn_open = o->turn_open;
        s->has_chat = o->has_chat;
        s->turns = o->turns;
        s->gen = s->gen_used = o->gen;
        s->pg_text = o->pg_text;
        s->pg_reply = o->pg_reply;
        memcpy(s->owner, o->owner, sizeof s->owner);
        s->tokens = f[i].tokens;
        s->state_bytes = f[i].bytes;
        st->tab[st->n++] = s;
        srv_sess_disk_written(st, s, f[i].bytes);
    }
    if (st->n > 1)
        qsort(st->tab, st->n, sizeof(srv_session_t *), cmp_session);
    for (; i < n; i++) {
        srv_session_t *s = srv_sess_tab_find(st, f[i].id);
        char name[CKPT_NAME_MAX];
        srv_sess_ckpt_name(name, f[i].id, f[i].turn, f[i].gen);
        if (!s) {
            if (!srv_sess_dir_exists(st, f[i].id))
                srv_sess_dir_remove(st, name); /* orphan */
            continue;
        }
        /* another generation's file is what a crash left of an import:
         * the old set after the new session file was renamed into place,
         * the new set before */
        if (!f[i].ok || f[i].turn >= s->turns || f[i].gen != s->gen) {
            srv_sess_dir_remove(st, name);
            continue;
        }
        int rc =
            srv_sess_ckpt_add(st, s, f[i].turn, f[i].tokens, f[i].bytes, f[i].gen, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (size_t k = 0; k < st->n; k++)
        srv_sess_ckpt_prune(st, st->tab[k]);
    return 0;
}
