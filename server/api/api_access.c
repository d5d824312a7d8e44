/* server/api/api_access.c — how a handler gets at a session: who is asking
 * (API keys -> owner tags), whether the caller may see it, and holding it in
 * memory for the handler (api_session_acquire), reading an evicted session
 * back on the I/O thread and running the handler again. Shared by every
 * endpoint that names a session (api_sessions.c, api_openai.c's "session").
 * Loop thread, except the read-back's work function (I/O thread).
 */
#include "server/api/api.h"

#include "server/base/sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- owners ---- */

int api_owner_tags_init(api_app_t *app)
{
    const srv_strlist_t *keys = &app->cfg->api_keys;
    if (keys->n == 0)
        return 0;
    app->key_owner = calloc(keys->n, sizeof *app->key_owner);
    if (!app->key_owner)
        return -1;
    static const char prefix[] = "darkserve session owner\n";
    for (size_t i = 0; i < keys->n; i++) {
        size_t kl = strlen(keys->v[i]), n = sizeof prefix - 1 + kl;
        char *buf = malloc(n);
        if (!buf)
            return -1;
        memcpy(buf, prefix, sizeof prefix - 1);
        memcpy(buf + sizeof prefix - 1, keys->v[i], kl);
        uint8_t d[SRV_SHA256_BYTES];
        srv_sha256(buf, n, d);
        free(buf);
        proto_hex_format(d, SRV_SESSION_OWNER_LEN / 2, app->key_owner[i]);
    }
    return 0;
}

void api_caller(const api_app_t *app, srv_req_t *req, api_caller_t *c)
{
    int admin = 0;
    int key = srv_req_key(req, &admin);
    if (key < 0 || !app->key_owner) {
        c->owner = "";
        c->all = 1;
        return;
    }
    c->owner = app->key_owner[key];
    c->all = admin;
}

int api_caller_may(const api_caller_t *c, const char *owner)
{
    return c->all || strcmp(c->owner, owner) == 0;
}

int api_session_check(api_app_t *app, srv_req_t *req, const api_caller_t *c, const char *id)
{
    srv_session_info_t si;
    char err[SRV_STORE_ERR_MAX] = "";
    int rc = srv_store_info(app->store, id, &si, err, sizeof err);
    if (rc == SRV_STORE_ENOTFOUND && srv_store_remote(app->store) && app->io_running) {
        /* a session of the shared store this replica has not seen yet:
         * its metadata first (on the I/O thread), then the handler again */
        api_session_bring(app, req, id, API_BRING_META);
        return -1;
    }
    if (rc == 0 && !api_caller_may(c, si.owner))
        rc = SRV_STORE_ENOTFOUND;
    if (rc < 0) {
        api_reply_store(req, rc, id, err);
        return -1;
    }
    return 0;
}

/* ---- deferred answers (from the I/O thread's completions) ---- */

void api_defer_reply_json(srv_stream_t *st, int status, const char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":\"internal_error\"}}";
    if (!json) {
        srv_stream_reply(st, 500, "application/json", oom, sizeof oom - 1);
        return;
    }
    if (status == 429 || status == 503) /* as api_reply_admit says it */
        srv_stream_add_header(st, "Retry-After", "1");
    srv_stream_reply(st, status, "application/json", json, strlen(json));
}

void api_defer_reply_error(srv_stream_t *st, const proto_error_t *e)
{
    char *j = proto_error_json(e);
    api_defer_reply_json(st, e->status, j);
    proto_free(j);
}

/* ---- evicted sessions: read back on the I/O thread ---- */

typedef struct bring_io {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    srv_stream_t *stream;
    char id[PROTO_SESSION_ID_LEN + 1];
    api_bring_kind_t kind;
    int fetched; /* held for the handler (srv_store_fetch) */
    int rc;
    proto_error_t e;
} bring_io_t;

static void bring_work(api_io_t *io)
{
    bring_io_t *w = (bring_io_t *)io;
    srv_session_t *s = NULL;
    char err[SRV_STORE_ERR_MAX] = "";
    if (w->kind == API_BRING_META) {
        w->rc = srv_store_refresh(w->app->store, w->id, err, sizeof err);
    } else if (w->kind == API_BRING_SESSION && srv_store_remote(w->app->store)) {
        /* lease taken, read when another replica moved it on; held until
         * the handler's srv_store_acquire_in_memory takes it */
        w->rc = srv_store_fetch(w->app->store, w->id, err, sizeof err);
        w->fetched = w->rc == 0;
    } else if (w->kind == API_BRING_REDO) {
        w->rc = srv_store_redo_prepare(w->app->store, w->id, err, sizeof err);
        if (w->rc == SRV_STORE_EEVICTED)
            w->rc = 0; /* the handler's acquire reads it back first */
    } else {
        w->rc = srv_store_acquire(w->app->store, w->id, &s, err, sizeof err);
        if (w->rc == 0) {
            srv_store_release(w->app->store, s, 0, NULL, 0); /* now in memory, most recently used */
            api_store_fault_after_read(w->app->store);
        }
    }
    if (w->rc < 0)
        api_store_error(w->rc, w->id, err, &w->e);
}

static void bring_done(api_io_t *io)
{
    bring_io_t *w = (bring_io_t *)io;
    if (w->rc < 0)
        api_defer_reply_error(w->stream, &w->e);
    else if (srv_stream_rerun(w->stream) != 0 && w->fetched) /* the handler finds it in memory */
        srv_store_unfetch(w->app->store, w->id); /* the client left: nobody comes for it */
    free(w);
}

/* Handler runs a request may take to find its session in memory: each
 * run but the last reads it on the I/O thread. A session pushed back to
 * disk every time before its handler ran again (sessions competing for
 * --max-sessions / --max-state-memory) is refused after that rather than
 * read on the loop, which would stall every other connection. */
#define BRING_IN_RUNS 4

/* 1 (req answered 429) when session id is on disk and its state does not
 * fit --max-state-memory now; 0 otherwise. */
static int refuse_evicted(api_app_t *app, srv_req_t *req, const char *id)
{
    srv_session_info_t si;
    proto_error_t e;
    if (srv_store_info(app->store, id, &si, NULL, 0) < 0 || si.in_memory || si.busy ||
        api_state_admit(app, api_state_bound(app, si.tokens), &e) == 0)
        return 0;
    api_reply_admit(req, &e);
    return 1;
}

/* Reads session id (API_BRING_SESSION: it is not in memory), the checkpoint a
 * regenerate starts from (API_BRING_REDO) or a shared store's metadata of it
 * (API_BRING_META) on the I/O thread, then runs req's handler again. Always 1
 * (req answered, or it runs again). */
int api_session_bring(api_app_t *app, srv_req_t *req, const char *id, api_bring_kind_t kind)
{
    proto_error_t e;
    srv_session_info_t si;
    const int redo = kind == API_BRING_REDO;
    if (kind == API_BRING_META) {
        /* nothing to admit: no state is read */
    } else if (redo) { /* the checkpoint is a second state beside the session's */
        if (srv_store_info(app->store, id, &si, NULL, 0) == 0 &&
            api_state_admit(app, api_state_bound(app, si.tokens), &e) < 0) {
            api_reply_admit(req, &e);
            return 1;
        }
    } else if (refuse_evicted(app, req, id)) {
        return 1;
    }
    if (srv_req_runs(req) >= BRING_IN_RUNS + redo) {
        proto_error_set(&e, PROTO_ERR_UNAVAILABLE, NULL,
                        "session '%s' was moved back to disk %d times before this request could "
                        "use it (other sessions need the memory); retry later",
                        id, BRING_IN_RUNS - 1);
        e.code = "session_store_busy";
        api_reply_admit(req, &e);
        return 1;
    }
    bring_io_t *w = calloc(1, sizeof *w);
    if (!w) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return 1;
    }
    w->stream = srv_stream_defer(req, NULL);
    if (!w->stream) { /* answered 500 */
        free(w);
        return 1;
    }
    w->io.work = bring_work;
    w->io.done = bring_done;
    w->app = app;
    w->kind = kind;
    snprintf(w->id, sizeof w->id, "%s", id);
    api_io_submit(app, &w->io);
    return 1;
}

static int bring_in(api_app_t *app, srv_req_t *req, const char *id)
{
    return api_session_bring(app, req, id, API_BRING_SESSION);
}

int api_session_acquire(api_app_t *app, srv_req_t *req, const char *id, srv_session_t **out)
{
    *out = NULL;
    int rc;
    char err[SRV_STORE_ERR_MAX] = "";
    if (app->io_running) {
        /* one step, no check before it: the I/O thread may evict the
         * session between a check and an acquire */
        api_store_fault_before_acquire(app->store);
        rc = srv_store_acquire_in_memory(app->store, id, out, err, sizeof err);
        if (rc == SRV_STORE_EEVICTED)
            return bring_in(app, req, id);
    } else { /* no I/O thread: reading it here is the only way */
        if (refuse_evicted(app, req, id))
            return 1;
        rc = srv_store_acquire(app->store, id, out, err, sizeof err);
    }
    if (rc < 0) {
        api_reply_store(req, rc, id, err);
        return 1;
    }
    return 0;
}
