/* server/api/api_responses.c — the stored responses of POST /v1/responses
 * (docs/API.md "POST /v1/responses"), and
 *   GET    /v1/responses/{id}   the stored response object
 *   DELETE /v1/responses/{id}   forgets it and deletes its session
 *
 * A response made with "store": true runs on a session of the session store
 * of its own: a new one, or, with previous_response_id, a fork of that
 * response's session (api_responses_branch, on the I/O thread) continued
 * with only the new input. So a later previous_response_id continues from
 * that session's constant-size state without the history being sent or
 * read again, and every stored response keeps its own state: the same
 * response can be continued twice (two branches). This table maps response
 * ids onto their sessions: each entry is one response, its session, the
 * owner tag of the key that made it and its answer (for GET). The table
 * is bounded (API_RESPONSES_MAX entries, API_RESPONSES_MAX_BYTES of
 * answers): the oldest entries are forgotten first (their sessions stay
 * ordinary sessions, under the store's own limits and --session-ttl). It
 * lives in memory: a restart forgets it. Loop thread only.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rsp_entry {
    char id[PROTO_RESPONSE_ID_MAX + 1];
    char session[PROTO_SESSION_ID_LEN + 1];
    char owner[SRV_SESSION_OWNER_LEN + 1];
    char *json; /* the answer, owned */
    size_t json_len;
    uint64_t seq; /* insertion order */
} rsp_entry_t;

/* A fork made for a request that continues a response
 * (api_responses_branch), until the request's handler runs again and takes
 * it. */
typedef struct rsp_branch {
    struct rsp_branch *next;
    char rid[72];                           /* the request's id */
    char src[PROTO_SESSION_ID_LEN + 1];     /* the session forked */
    char session[PROTO_SESSION_ID_LEN + 1]; /* the copy */
    char owner[SRV_SESSION_OWNER_LEN + 1];
} rsp_branch_t;

struct api_rsp_table {
    rsp_branch_t *branches;
    rsp_entry_t *e; /* [n], unordered */
    size_t n, cap;
    size_t bytes; /* sum of json_len */
    uint64_t seq;
};

void api_responses_free(api_app_t *app)
{
    api_rsp_table_t *t = app->responses;
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        free(t->e[i].json);
    free(t->e);
    while (t->branches) {
        rsp_branch_t *b = t->branches;
        t->branches = b->next;
        free(b);
    }
    free(t);
    app->responses = NULL;
}

static rsp_entry_t *find(api_rsp_table_t *t, const char *id)
{
    for (size_t i = 0; t && i < t->n; i++)
        if (strcmp(t->e[i].id, id) == 0)
            return &t->e[i];
    return NULL;
}

static int visible(const rsp_entry_t *e, const api_caller_t *who)
{
    return api_caller_may(who, e->owner);
}

static void drop(api_rsp_table_t *t, size_t i)
{
    t->bytes -= t->e[i].json_len;
    /* each entry owns its answer; the analyzer takes the entry moved into
     * slot i for the one freed here */
    /* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
    free(t->e[i].json);
    t->e[i].json = NULL;
    if (i != --t->n)
        t->e[i] = t->e[t->n];
}

int api_responses_has(const api_app_t *app, const char *id)
{
    return app->responses && find(app->responses, id) != NULL;
}

int api_responses_find(api_app_t *app, const char *id, const api_caller_t *who,
                       char session[PROTO_SESSION_ID_LEN + 1])
{
    rsp_entry_t *e = find(app->responses, id);
    if (!e || !visible(e, who))
        return -1;
    snprintf(session, PROTO_SESSION_ID_LEN + 1, "%s", e->session);
    return 0;
}

void api_responses_put(api_app_t *app, const char *id, const char *session, const char *owner,
                       const char *json)
{
    if (!app->responses && !(app->responses = calloc(1, sizeof *app->responses)))
        goto oom;
    api_rsp_table_t *t = app->responses;
    const size_t len = strlen(json);
    /* the oldest go first, to make room */
    while (t->n && (t->n >= API_RESPONSES_MAX || t->bytes + len > API_RESPONSES_MAX_BYTES)) {
        size_t old = 0;
        for (size_t i = 1; i < t->n; i++)
            if (t->e[i].seq < t->e[old].seq)
                old = i;
        drop(t, old);
    }
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 16;
        rsp_entry_t *ne = realloc(t->e, nc * sizeof *ne);
        if (!ne)
            goto oom;
        t->e = ne;
        t->cap = nc;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        goto oom;
    memcpy(copy, json, len + 1);
    rsp_entry_t *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", id);
    snprintf(e->session, sizeof e->session, "%s", session);
    snprintf(e->owner, sizeof e->owner, "%s", owner ? owner : "");
    e->json = copy;
    e->json_len = len;
    e->seq = ++t->seq;
    t->bytes += len;
    return;
oom:
    SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory storing response %s: it cannot be continued", id);
}

/* ---- continuing a response: a fork of its session ---- */

typedef struct rsp_fork {
    api_io_t io;
    api_app_t *app;
    srv_stream_t *stream;
    rsp_branch_t b;
    int rc;
    proto_error_t e;
} rsp_fork_t;

static void fork_work(api_io_t *io)
{
    rsp_fork_t *f = (rsp_fork_t *)io;
    char err[SRV_STORE_ERR_MAX] = "";
    f->rc =
        srv_store_fork_owned(f->app->store, f->b.src, f->b.owner, f->b.session, err, sizeof err);
    if (f->rc < 0)
        api_store_error(f->rc, f->b.src, err, &f->e);
}

static void fork_done(api_io_t *io)
{
    rsp_fork_t *f = (rsp_fork_t *)io;
    api_app_t *app = f->app;
    rsp_branch_t *b = NULL;
    if (f->rc < 0) {
        api_defer_reply_error(f->stream, &f->e);
    } else if (!(app->responses || (app->responses = calloc(1, sizeof *app->responses))) ||
               !(b = malloc(sizeof *b))) {
        proto_error_t e;
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        api_defer_reply_error(f->stream, &e);
    } else {
        *b = f->b;
        b->next = app->responses->branches;
        app->responses->branches = b;
        /* copies whose requests ended before taking them are forgotten, the
         * oldest first, past API_RESPONSES_MAX_BRANCHES (the sessions stay,
         * under the store's limits) */
        size_t k = 0;
        for (rsp_branch_t **pp = &b->next; *pp; k++) {
            if (k + 1 >= API_RESPONSES_MAX_BRANCHES) {
                rsp_branch_t *old = *pp;
                *pp = old->next;
                free(old);
            } else {
                pp = &(*pp)->next;
            }
        }
        if (srv_stream_rerun(f->stream) != 0) { /* the client left: nobody takes it */
            app->responses->branches = b->next;
            free(b);
        }
    }
    free(f);
}

int api_responses_branch(api_app_t *app, srv_req_t *req, const char *session, const char *owner,
                         char out[PROTO_SESSION_ID_LEN + 1])
{
    const char *rid = srv_req_id(req) ? srv_req_id(req) : "";
    api_rsp_table_t *t = app->responses;
    for (rsp_branch_t **pp = t ? &t->branches : NULL; pp && *pp; pp = &(*pp)->next) {
        rsp_branch_t *b = *pp;
        if (strcmp(b->rid, rid) == 0 && strcmp(b->src, session) == 0 &&
            strcmp(b->owner, owner ? owner : "") == 0) {
            /* kept until taken: the copy may be read back from disk first,
             * and the handler run once more */
            snprintf(out, PROTO_SESSION_ID_LEN + 1, "%s", b->session);
            return 0;
        }
    }
    /* the copy is a new state in memory */
    srv_session_info_t si;
    proto_error_t e;
    if (srv_store_info(app->store, session, &si, NULL, 0) == 0 &&
        api_state_admit(app, api_state_bound(app, si.tokens), &e) < 0) {
        api_reply_admit(req, &e);
        return 1;
    }
    rsp_fork_t *f = calloc(1, sizeof *f);
    if (!f) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return 1;
    }
    f->io.work = fork_work;
    f->io.done = fork_done;
    f->app = app;
    snprintf(f->b.rid, sizeof f->b.rid, "%s", rid);
    snprintf(f->b.src, sizeof f->b.src, "%s", session);
    snprintf(f->b.owner, sizeof f->b.owner, "%s", owner ? owner : "");
    f->stream = srv_stream_defer(req, NULL);
    if (!f->stream) { /* answered 500 */
        free(f);
        return 1;
    }
    api_io_submit(app, &f->io);
    return 1;
}

void api_responses_branch_taken(api_app_t *app, const char *fork)
{
    api_rsp_table_t *t = app->responses;
    for (rsp_branch_t **pp = t ? &t->branches : NULL; pp && *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->session, fork) == 0) {
            rsp_branch_t *b = *pp;
            *pp = b->next;
            free(b);
            return;
        }
}

static rsp_entry_t *path_entry(api_app_t *app, srv_req_t *req)
{
    const char *id = srv_req_param(req, "id");
    api_caller_t who;
    api_caller(app, req, &who);
    rsp_entry_t *e = id ? find(app->responses, id) : NULL;
    if (!e || !visible(e, &who)) {
        api_reply_kind(req, PROTO_ERR_NOT_FOUND, NULL, "Response with id '%.64s' not found.",
                       id ? id : "");
        return NULL;
    }
    return e;
}

static void h_get(srv_req_t *req, void *ud)
{
    rsp_entry_t *e = path_entry(ud, req);
    if (e)
        srv_reply_json(req, 200, e->json);
}

/* DELETE: the response's session goes too (on the I/O thread). */
typedef struct rsp_del {
    api_io_t io;
    api_app_t *app;
    srv_stream_t *stream;
    char session[PROTO_SESSION_ID_LEN + 1];
    char body[PROTO_RESPONSE_ID_MAX + 96];
    int rc;
} rsp_del_t;

static void del_work(api_io_t *io)
{
    rsp_del_t *d = (rsp_del_t *)io;
    d->rc = srv_store_delete(d->app->store, d->session, NULL, 0);
}

static void del_done(api_io_t *io)
{
    rsp_del_t *d = (rsp_del_t *)io;
    if (d->rc < 0 && d->rc != SRV_STORE_ENOTFOUND)
        SRV_LOG(SRV_LOG_WARN, NULL, "session %s of a deleted response: %s", d->session,
                srv_store_strerror(d->rc));
    api_defer_reply_json(d->stream, 200, d->body);
    free(d);
}

static void h_delete(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    rsp_entry_t *e = path_entry(app, req);
    if (!e)
        return;
    rsp_del_t *d = calloc(1, sizeof *d);
    if (!d) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    snprintf(d->body, sizeof d->body, "{\"id\":\"%s\",\"object\":\"response\",\"deleted\":true}",
             e->id);
    snprintf(d->session, sizeof d->session, "%s", e->session);
    drop(app->responses, (size_t)(e - app->responses->e));
    d->io.work = del_work;
    d->io.done = del_done;
    d->app = app;
    d->stream = srv_stream_defer(req, NULL);
    if (!d->stream) {
        free(d);
        return;
    }
    api_io_submit(app, &d->io);
}

int api_responses_routes(api_app_t *app)
{
    int rc = 0;
    rc |= api_route(app, "GET", "/v1/responses/{id}", h_get, NULL);
    rc |= api_route(app, "DELETE", "/v1/responses/{id}", h_delete, NULL);
    return rc ? -1 : 0;
}
