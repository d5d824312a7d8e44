/* server/store/store_remote.c — the session table in front of a shared
 * backend (server/store/store_backend.h; server/store/store.h "Shared stores").
 *
 * Memory is a cache here. A session's copy in memory is of one backend
 * version (s->version) and is used only after an acquire found the backend
 * still at that version, under the session's lease; when the backend has
 * moved on (another replica served a turn), the acquire reads the new blob.
 * on_disk and disk_bytes mean "saved in the backend" and the blob's size.
 * A session created here has version 0 until its first save and exists
 * nowhere else until then.
 *
 * Backend calls block (Redis: a round trip, a 15 MB transfer) and run
 * outside st->mu on a session marked busy, like the directory store's file
 * I/O; they are made on the store's I/O thread. The loop thread's
 * srv_store_acquire_in_memory never calls the backend: it takes a session
 * srv_store_fetch acquired for it on the I/O thread.
 *
 * It calls the table and the codec below it, never the public calls of
 * store.c, which call it (store_impl.h says who calls whom).
 */
#include "server/store/store_impl.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/base/log.h"

/* A fetched session nobody took (the client left before its handler ran
 * again) is given back by the sweep after this long. */
#define FETCH_MAX_MS 30000

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t mono_ms(void)
{
    return mono_ns() / 1000000;
}

int srv_store_remote(const srv_store_t *st)
{
    return st && st->be != NULL;
}

int srv_store_health(srv_store_t *st, char *why, size_t n)
{
    if (!st || !st->be) {
        if (why && n)
            why[0] = '\0';
        return 0;
    }
    return st->be->ops->health(st->be, why, n);
}

/* The metadata the backend keeps beside s's blob of len bytes, c being
 * the context it holds. */
static void meta_of(const srv_session_t *s, const srv_seq_ctx_t *c, size_t len, srv_store_meta_t *m)
{
    memset(m, 0, sizeof *m);
    memcpy(m->owner, s->owner, sizeof m->owner);
    m->created = s->created;
    m->last_used = s->last_used;
    m->tokens = c && c->state ? srv_sess_ctx_tokens(c) : s->tokens;
    m->turns = s->turns;
    m->pending_grammar = s->pg_text ? (int64_t)s->pg_reply : -1;
    m->state_bytes = len;
}

/* Caller holds mu: s's metadata from the backend's (s not in memory). The
 * pending grammar's text size is not in it: pg_text only says whether
 * there is one (info reads no more while the session is not in memory). */
static void meta_apply(srv_store_t *st, srv_session_t *s, uint64_t version,
                       const srv_store_meta_t *m)
{
    memcpy(s->owner, m->owner, sizeof s->owner);
    s->created = m->created;
    s->last_used = m->last_used;
    s->tokens = m->tokens;
    s->turns = m->turns;
    s->pg_text = m->pending_grammar >= 0 ? 1 : 0;
    s->pg_reply = m->pending_grammar >= 0 ? (size_t)m->pending_grammar : 0;
    s->state_bytes = (size_t)m->state_bytes;
    s->version = version;
    srv_sess_disk_written(st, s, (size_t)m->state_bytes);
}

/* Caller holds mu, s busy and not in memory (any copy dropped): c and m
 * (taken) become s's memory and metadata, of version v (a blob of len
 * bytes). */
static void adopt(srv_store_t *st, srv_session_t *s, srv_seq_ctx_t *c, meta_t *m, uint64_t v,
                  size_t len)
{
    st->n_mem++;
    s->ctx = *c;
    memset(c, 0, sizeof *c);
    s->mem_bytes = 0;
    if (m->have) {
        s->turn_open = m->o.turn_open;
        s->has_chat = m->o.has_chat;
        s->turns = m->o.turns;
        s->created = m->o.created;
        s->last_used = m->o.last_used;
        memcpy(s->owner, m->o.owner, sizeof s->owner);
        s->last_flags = m->o.last_flags;
        s->last_in = m->in;
        s->n_last_in = m->o.n_in;
        srv_sess_pg_set(s, m->pg, m->o.pg_text, m->o.pg_reply);
        m->in = NULL;
        m->pg = NULL;
    } else {
        s->turn_open = s->has_chat = 0;
        s->turns = 0;
        s->last_flags = 0;
        srv_sess_pg_set(s, NULL, 0, 0);
    }
    s->version = v;
    s->dirty = 0;
    srv_sess_disk_written(st, s, len);
    srv_sess_refresh(st, s);
}

/* Holds session id (busy) with its lease and its memory current with the
 * backend (read when the backend's version is not the one in memory). A
 * session created here and never saved is held without the backend. */
static int take(srv_store_t *st, const char *id, srv_session_t **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_find_settled(st, id);
    int placeholder = 0;
    if (s && s->busy) {
        pthread_mutex_unlock(&st->mu);
        return STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    }
    if (s && s->version == 0 && s->ctx.state) { /* only here so far */
        s->busy = 1;
        s->tick = ++st->tick;
        s->tokens_held = srv_sess_ctx_tokens(&s->ctx);
        pthread_mutex_unlock(&st->mu);
        *out = s;
        return 0;
    }
    if (!s) { /* known to the backend only (or to nobody) */
        s = calloc(1, sizeof *s);
        if (s) {
            s->st = st;
            memcpy(s->id, id, ID_LEN + 1);
        }
        if (!s || srv_sess_tab_insert(st, s, err, errlen) < 0) {
            free(s);
            pthread_mutex_unlock(&st->mu);
            return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
        }
        placeholder = 1;
    }
    s->busy = 1;
    const uint64_t have = s->ctx.state && !s->dirty ? s->version : 0;
    pthread_mutex_unlock(&st->mu);

    char tok[SRV_STORE_TOKEN_MAX] = "";
    uint64_t v = 0;
    unsigned char *blob = NULL;
    size_t len = 0;
    srv_seq_ctx_t c = {0};
    meta_t m = {0};
    const int64_t t0 = mono_ns();
    int rc = st->be->ops->acquire(st->be, id, have, tok, &v, &blob, &len, err, errlen);
    const int64_t t1 = mono_ns();
    const int loaded = rc == 0 && blob != NULL;
    if (loaded) {
        if (len > st->max_blob) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_EIO,
                            "session %s in the shared store has %zu bytes, more "
                            "than any state of this server (%zu)",
                            id, len, st->max_blob);
        } else {
            char what[96];
            snprintf(what, sizeof what, "session %s in the shared store", id);
            rc = srv_sess_load_blob(st, blob, len, what, &c, &m, err, errlen);
        }
        free(blob);
        if (rc < 0)
            st->be->ops->release(st->be, id, tok);
    }
    pthread_mutex_lock(&st->mu);
    if (rc == 0 && loaded) {
        if (s->ctx.state)
            srv_sess_drop_memory(st, s);
        if ((rc = srv_sess_make_room(st, 1, err, errlen)) < 0) {
            st->be->ops->release(st->be, id, tok);
            srv_sess_ctx_free(&c);
            srv_sess_meta_free(&m);
        } else {
            adopt(st, s, &c, &m, v, len);
            srv_sess_meta_free(&m);
        }
    }
    if (rc < 0) {
        if (rc == SRV_STORE_ENOTFOUND || placeholder)
            srv_sess_forget(st, s); /* gone, or nothing known of it here */
        else
            srv_sess_give_back(st, s);
        pthread_mutex_unlock(&st->mu);
        return rc;
    }
    if (loaded) /* another replica served it last (or it was not in memory here) */
        SRV_LOG(SRV_LOG_INFO, NULL,
                "session %s read from the shared store: version %" PRIu64
                ", %zu bytes, %.2f ms (%.2f ms to fetch, %.2f ms to load the state)",
                id, v, len, (double)(mono_ns() - t0) / 1e6, (double)(t1 - t0) / 1e6,
                (double)(mono_ns() - t1) / 1e6);
    memcpy(s->token, tok, sizeof s->token);
    s->leased = 1;
    s->tokens_held = srv_sess_ctx_tokens(&s->ctx);
    s->tick = ++st->tick;
    pthread_mutex_unlock(&st->mu);
    *out = s;
    return 0;
}

int srv_sess_remote_acquire(srv_store_t *st, const char *id, int from_backend, srv_session_t **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    if (from_backend)
        return take(st, id, out, err, errlen);
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_tab_find(st, id);
    int rc = 0;
    if (s && s->fetched) { /* held for this caller by srv_store_fetch */
        s->fetched = 0;
        s->tick = ++st->tick;
        *out = s;
    } else if (s && s->busy) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    } else if (s && s->version == 0 && s->ctx.state) {
        s->busy = 1;
        s->tick = ++st->tick;
        s->tokens_held = srv_sess_ctx_tokens(&s->ctx);
        *out = s;
    } else {
        rc = STORE_FAIL(err, errlen, SRV_STORE_EEVICTED,
                        "session %s must be read from the shared store "
                        "first",
                        id);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Gives back session s that take() held for an operation of this file
 * (never in a turn or a redo), as srv_store_release would (which sits
 * above this file): persist = 1 saves it first, under the version it read,
 * and a save that fails drops the copy in memory, so a change the client
 * was told failed never reappears; then the lease goes. */
static int give_back(srv_store_t *st, srv_session_t *s, int persist, char *err, size_t errlen)
{
    int rc = 0;
    unsigned char *buf = NULL;
    size_t len = 0;
    if (persist) {
        rc = srv_sess_serialize(st, s, &buf, &len, err, errlen);
        if (rc == 0)
            rc = srv_sess_remote_save(st, s, buf, len, err, errlen);
        free(buf);
    }
    pthread_mutex_lock(&st->mu);
    const int64_t tokens0 = s->tokens;
    const size_t bytes0 = s->state_bytes;
    srv_sess_refresh(st, s);
    if (persist && rc == 0) {
        srv_sess_disk_written(st, s, len);
        s->dirty = 0;
    } else if (persist) {
        srv_sess_revert(st, s, tokens0, bytes0);
    }
    if (persist)
        srv_sess_ctx_free(&s->prep);
    srv_sess_remote_released(st, s, persist, persist && rc == 0);
    srv_sess_refresh(st, s);
    s->busy = 0;
    s->tick = ++st->tick;
    srv_sess_make_room(st, 0, NULL, 0);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_store_fetch(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (!st->be)
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL, "fetch: the store has no backend");
    srv_session_t *s = NULL;
    int rc = take(st, id, &s, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&st->mu);
    s->fetched = 1;
    s->fetched_ms = mono_ms();
    pthread_mutex_unlock(&st->mu);
    return 0;
}

void srv_store_unfetch(srv_store_t *st, const char *id)
{
    if (!st->be || !srv_session_id_valid(id))
        return;
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_tab_find(st, id);
    const int give = s && s->fetched;
    if (give)
        s->fetched = 0;
    pthread_mutex_unlock(&st->mu);
    if (give)
        give_back(st, s, 0, NULL, 0);
}

int srv_sess_remote_save(srv_store_t *st, srv_session_t *s, const unsigned char *buf, size_t len,
                         char *err, size_t errlen)
{
    srv_store_meta_t m;
    meta_of(s, &s->ctx, len, &m);
    uint64_t v = 0;
    int rc = st->be->ops->save(st->be, s->id, s->leased ? s->token : NULL, s->version, buf, len, &m,
                               &v, err, errlen);
    if (rc == 0) {
        pthread_mutex_lock(&st->mu);
        s->version = v;
        s->leased = 0; /* the save dropped it */
        pthread_mutex_unlock(&st->mu);
    }
    return rc;
}

void srv_sess_remote_released(srv_store_t *st, srv_session_t *s, int persist, int saved)
{
    (void)saved;
    if (s->leased) {
        st->be->ops->release(st->be, s->id, s->token);
        s->leased = 0;
    }
    /* a copy the caller changed without saving matches no version: the
     * next acquire reads the backend's */
    if (!persist && s->ctx.state && s->version > 0 &&
        (s->dirty || srv_sess_ctx_tokens(&s->ctx) != s->tokens_held)) {
        srv_sess_drop_memory(st, s);
        s->dirty = 0;
    }
}

int srv_sess_remote_delete(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_find_settled(st, id);
    if (s && s->busy) {
        pthread_mutex_unlock(&st->mu);
        return STORE_FAIL(err, errlen, SRV_STORE_EBUSY, "session %s is busy", id);
    }
    if (s && s->version == 0) { /* never saved: only here */
        srv_sess_forget(st, s);
        pthread_mutex_unlock(&st->mu);
        return 0;
    }
    if (s)
        s->busy = 1;
    pthread_mutex_unlock(&st->mu);
    int rc = st->be->ops->remove(st->be, id, err, errlen);
    pthread_mutex_lock(&st->mu);
    if (s && (rc == 0 || rc == SRV_STORE_ENOTFOUND))
        srv_sess_forget(st, s);
    else if (s)
        srv_sess_give_back(st, s);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int srv_sess_remote_fork(srv_store_t *st, const char *id, const char *owner,
                         char out_id[SRV_SESSION_ID_LEN + 1], char *err, size_t errlen)
{
    srv_session_t *src = NULL;
    int rc = take(st, id, &src, err, errlen);
    if (rc < 0)
        return rc;
    srv_session_t *ns = calloc(1, sizeof *ns);
    srv_seq_ctx_t c = {0};
    unsigned char *pg = NULL, *buf = NULL;
    size_t len = 0;
    int reserved = 0, inserted = 0;
    if (!ns) {
        rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
        goto done;
    }
    srv_sess_fork_init(st, ns, src, owner);
    if ((rc = srv_sess_ctx_copy(st, &src->ctx, &c, err, errlen)) < 0)
        goto done;
    if (src->pg) { /* the copy continues the reply the source left pending, too */
        if (!(pg = malloc(src->pg_text + src->pg_reply))) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a pending grammar");
            goto done;
        }
        memcpy(pg, src->pg, src->pg_text + src->pg_reply);
        srv_sess_pg_set(ns, pg, src->pg_text, src->pg_reply);
        pg = NULL;
    }
    pthread_mutex_lock(&st->mu);
    if ((rc = srv_sess_make_room(st, 1, err, errlen)) == 0) {
        do {
            rc = srv_sess_new_id(ns->id, err, errlen);
        } while (rc == 0 && srv_sess_tab_find(st, ns->id));
    }
    if (rc == 0 && (rc = srv_sess_tab_insert(st, ns, err, errlen)) == 0) {
        inserted = 1;
        reserved = 1;
        st->n_mem++; /* reserved while it is written */
    }
    pthread_mutex_unlock(&st->mu);
    if (rc < 0)
        goto done;
    rc = srv_sess_serialize_ctx(st, ns, &c, &buf, &len, err, errlen);
    if (rc == 0) {
        srv_store_meta_t m;
        meta_of(ns, &c, len, &m);
        uint64_t v = 0;
        rc = st->be->ops->save(st->be, ns->id, NULL, 0, buf, len, &m, &v, err, errlen);
        ns->version = v;
    }
    free(buf);
done:
    give_back(st, src, 0, NULL, 0);
    pthread_mutex_lock(&st->mu);
    if (rc == 0) {
        ns->ctx = c;
        ns->mem_bytes = 0;
        srv_sess_refresh(st, ns);
        srv_sess_disk_written(st, ns, len);
        ns->dirty = 0;
        ns->busy = 0;
        ns->tick = ++st->tick;
        memcpy(out_id, ns->id, ID_LEN + 1);
        srv_sess_make_room(st, 0, NULL, 0);
    } else {
        if (reserved)
            st->n_mem--;
        if (inserted)
            srv_sess_tab_remove(st, ns);
        srv_sess_ctx_free(&c);
        if (ns)
            free(ns->pg);
        free(ns);
    }
    pthread_mutex_unlock(&st->mu);
    free(pg);
    return rc;
}

int srv_sess_remote_export(srv_store_t *st, const char *id, void **blob, size_t *len, char *err,
                           size_t errlen)
{
    srv_session_t *s = NULL;
    int rc = take(st, id, &s, err, errlen);
    if (rc < 0)
        return rc;
    unsigned char *buf = NULL;
    size_t n = 0;
    rc = srv_sess_serialize_ctx(st, s, &s->ctx, &buf, &n, err, errlen);
    give_back(st, s, 0, NULL, 0);
    if (rc < 0)
        return rc;
    *blob = buf;
    *len = n;
    return 0;
}

int srv_sess_remote_import(srv_store_t *st, const char *id, const void *blob, size_t len, char *err,
                           size_t errlen)
{
    core_error_t ve = {0};
    if (core_state_verify(blob, len, st->fp, st->attn, &ve) < 0)
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", ve.msg);
    srv_seq_ctx_t c = {0};
    meta_t m = {0};
    /* the blob's checkpoints (an export of a directory store) are not kept:
     * a shared store keeps none */
    int rc = srv_sess_load_blob(st, blob, len, "the imported state", &c, &m, err, errlen);
    if (rc == 0 && m.have && (rc = srv_sess_owner_pg_check(&m.o, err, errlen)) < 0) {
        srv_sess_ctx_free(&c);
        srv_sess_meta_free(&m);
    }
    if (rc < 0) {
        if (rc == SRV_STORE_ENOMEM)
            return rc;
        char msg[SRV_STORE_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
        return STORE_FAIL(err, errlen, SRV_STORE_EMISMATCH, "%s", msg);
    }
    srv_session_t *s = NULL;
    if ((rc = take(st, id, &s, err, errlen)) < 0) {
        srv_sess_ctx_free(&c);
        srv_sess_meta_free(&m);
        return rc;
    }
    pthread_mutex_lock(&st->mu);
    /* the session's own owner and creation time stay */
    char owner[SRV_SESSION_OWNER_LEN + 1];
    memcpy(owner, s->owner, sizeof owner);
    const int64_t created = s->created;
    if (s->ctx.state)
        srv_sess_drop_memory(st, s);
    adopt(st, s, &c, &m, s->version, s->disk_bytes);
    memcpy(s->owner, owner, sizeof owner);
    s->created = created;
    s->last_used = (int64_t)time(NULL);
    s->dirty = 1;
    srv_sess_meta_free(&m);
    pthread_mutex_unlock(&st->mu);
    /* saved (and on failure dropped from memory) like a turn */
    return give_back(st, s, 1, err, errlen);
}

int srv_sess_remote_list(srv_store_t *st, const char *owner, const char *after, size_t limit,
                         srv_session_info_t *out, size_t *n, int *has_more, char *err,
                         size_t errlen)
{
    srv_store_entry_t *e = limit ? calloc(limit, sizeof *e) : NULL;
    if (limit && !e)
        return STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a list");
    size_t k = 0;
    int more = 0;
    int rc = st->be->ops->list(st->be, owner, after ? after : "", limit, e, &k, &more, err, errlen);
    if (rc < 0) {
        free(e);
        return rc;
    }
    pthread_mutex_lock(&st->mu);
    for (size_t i = 0; i < k && i < limit; i++) {
        srv_session_info_t *o = &out[i];
        memset(o, 0, sizeof *o);
        memcpy(o->id, e[i].id, sizeof o->id);
        memcpy(o->owner, e[i].meta.owner, sizeof o->owner);
        o->tokens = e[i].meta.tokens;
        o->state_bytes = (size_t)e[i].meta.state_bytes;
        o->created = e[i].meta.created;
        o->last_used = e[i].meta.last_used;
        o->on_disk = 1;
        o->turns = e[i].meta.turns;
        o->pending_grammar = e[i].meta.pending_grammar;
        const srv_session_t *s = srv_sess_tab_find(st, e[i].id);
        if (s) {
            o->in_memory = s->ctx.state != NULL && s->version == e[i].version;
            o->busy = s->busy;
        }
    }
    pthread_mutex_unlock(&st->mu);
    free(e);
    *n = k < limit ? k : limit;
    *has_more = more;
    return 0;
}

int srv_store_refresh(srv_store_t *st, const char *id, char *err, size_t errlen)
{
    if (!srv_session_id_valid(id))
        return STORE_FAIL(err, errlen, SRV_STORE_EINVAL,
                          "malformed session id (expected 32 lowercase hex chars)");
    if (!st->be) {
        pthread_mutex_lock(&st->mu);
        const srv_session_t *s = srv_sess_tab_find(st, id);
        pthread_mutex_unlock(&st->mu);
        return s ? 0 : STORE_FAIL(err, errlen, SRV_STORE_ENOTFOUND, "session %s not found", id);
    }
    uint64_t v = 0;
    srv_store_meta_t m;
    int rc = st->be->ops->peek(st->be, id, &v, &m, err, errlen);
    pthread_mutex_lock(&st->mu);
    srv_session_t *s = srv_sess_tab_find(st, id);
    if (rc == SRV_STORE_ENOTFOUND && s && s->version == 0 && s->ctx.state)
        rc = 0; /* created here, not saved yet */
    else if (rc == SRV_STORE_ENOTFOUND && s && !s->busy)
        srv_sess_forget(st, s);
    else if (rc == 0 && !s) {
        s = calloc(1, sizeof *s);
        if (!s) {
            rc = STORE_FAIL(err, errlen, SRV_STORE_ENOMEM, "out of memory for a session");
        } else {
            s->st = st;
            memcpy(s->id, id, ID_LEN + 1);
            if ((rc = srv_sess_tab_insert(st, s, err, errlen)) < 0)
                free(s);
            else
                meta_apply(st, s, v, &m);
        }
    } else if (rc == 0 && !s->busy && s->version != v) {
        /* another replica moved it on: a copy in memory is of the past */
        if (s->ctx.state)
            srv_sess_drop_memory(st, s);
        s->dirty = 0;
        meta_apply(st, s, v, &m);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void srv_sess_remote_sweep(srv_store_t *st, int64_t now)
{
    const int64_t t = mono_ms();
    size_t i = 0;
    while (i < st->n) {
        srv_session_t *s = st->tab[i];
        if (s->fetched && t - s->fetched_ms > FETCH_MAX_MS) {
            /* nobody came for it: as srv_store_unfetch (its lease goes) */
            s->fetched = 0;
            if (s->leased) {
                st->be->ops->release(st->be, s->id, s->token);
                s->leased = 0;
            }
            srv_sess_give_back(st, s);
        }
        if (!s->busy && s->version > 0 && st->ttl_s > 0 && now - s->last_used >= st->ttl_s) {
            srv_sess_forget(st, s); /* the copy here; the backend expires its own */
            continue;
        }
        i++;
    }
}
