/* server/store/store.c — the session store's public calls (server/store/store.h):
 * opening and closing it, holding, giving back, deleting, copying and
 * listing sessions, the maintenance (sweep, settle, flush) and the
 * accessors of a held session.
 *
 * The store's files, each calling only those listed before it (so each can
 * be read and tested without the ones after it; store_impl.h declares
 * their shared functions in this order):
 *   store_base.c      errors, ids
 *   store_codec.c     contexts, the owner section, blobs, checks of a
 *                     client's blob
 *   store_dir.c       the session directory's files, the startup scan
 *   store_table.c     the table, memory and disk accounting and bounds,
 *                     checkpoint bookkeeping, the table built at startup
 *   store_turns.c     turns, rollback, redo
 *   store_remote.c    the table in front of a shared backend
 *   store_transfer.c  export and import
 *   store.c           the rest of the public calls
 * (store_turns.c and store_remote.c do not call each other, nor do
 * store_transfer.c and store.c.)
 */
#include "server/store/store.h"
#include "server/store/store_impl.h"
#include "server/store/store_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/sample.h"
#include "core/state.h"

/* ---- the store ---- */

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
    const int use_dir = o->dir && o->dir[0] && !st->be;
    st->max_ckpt = use_dir ? o->max_checkpoints : 0;
    /* a shared store keeps no checkpoints but takes the export of a
     * directory store that has them (it keeps the state, not them) */
    const size_t ck_bound = st->be && o->max_checkpoints <= SRV_STORE_MAX_CHECKPOINTS
                                ? o->max_checkpoints
                                : st->max_ckpt;
    srv_sess_blob_bounds(core_attn_config(st->attn), ck_bound, &st->max_blob, &st->max_ckpt_blob,
                         &st->max_export);
    if (use_dir) {
        srv_found_t *found = NULL;
        size_t n_found = 0;
        st->dir = strdup(o->dir);
        if (!st->dir) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory");
            goto fail;
        }
        rc = srv_sess_open_dir(st, &found, &n_found, err, errlen);
        if (rc == 0)
            rc = srv_sess_table_load(st, found, n_found, err, errlen);
        free(found);
        /* a smaller budget than last time: the oldest go now */
        if (rc < 0 || (rc = srv_sess_trim_disk(st, NULL, err, errlen)) < 0)
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
    st->n_mem++;
    srv_sess_refresh(st, s); /* its memory, tokens (0) and size counted */
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
            if (linked &&
                srv_sess_ckpt_add(st, s, s->turns0, s->tokens0, file0, s->gen, err, errlen) < 0)
                srv_sess_dir_remove(st, link_as);
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
    size_t i = after && after[0] ? srv_sess_tab_bound(st, after, 1) : 0;
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
        for (size_t i = 0; i < st->n; i = srv_sess_tab_bound(st, cursor, 1)) {
            srv_session_t *s = st->tab[i];
            memcpy(cursor, s->id, sizeof cursor);
            if (!s->ctx.state || s->busy || s->io || (!s->dirty && s->on_disk))
                continue;
            int rc = srv_sess_write_marked(st, s, err, errlen);
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
    pthread_mutex_lock(&s->st->mu);
    if (s->turn_open != open) {
        s->turn_open = open;
        s->dirty = 1;
    }
    pthread_mutex_unlock(&s->st->mu);
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
