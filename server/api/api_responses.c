/* server/api/api_responses.c — the stored responses of POST /v1/responses
 * (docs/API.md "POST /v1/responses"), and
 *   GET    /v1/responses/{id}   the stored response object
 *   DELETE /v1/responses/{id}   forgets it (and its session, when it is
 *                               the newest response of that session)
 *
 * A response made with "store": true runs on a session of the session store
 * (a new one, or the session of its previous_response_id, continued in
 * place), so a later previous_response_id continues from that session's
 * constant-size state without the history being sent or read again. This
 * table maps response ids onto sessions: each entry is one response, its
 * session, the owner tag of the key that made it, its answer (for GET), and
 * whether it is its session's newest response (the head): only a head can
 * be continued, since the session has moved on past the others. The table
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
    char next[PROTO_RESPONSE_ID_MAX + 1]; /* the response that continued it, "" = head */
    char *json;                           /* the answer, owned */
    size_t json_len;
    uint64_t seq; /* insertion order */
} rsp_entry_t;

struct api_rsp_table {
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
    free(t->e[i].json);
    t->e[i] = t->e[--t->n];
}

int api_responses_find(api_app_t *app, const char *id, const api_caller_t *who,
                       char session[PROTO_SESSION_ID_LEN + 1], char *next, size_t next_len)
{
    rsp_entry_t *e = find(app->responses, id);
    if (!e || !visible(e, who))
        return -1;
    snprintf(session, PROTO_SESSION_ID_LEN + 1, "%s", e->session);
    if (e->next[0]) {
        snprintf(next, next_len, "%s", e->next);
        return -2;
    }
    return 0;
}

void api_responses_put(api_app_t *app, const char *id, const char *session, const char *owner,
                       const char *json, const char *prev)
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
    rsp_entry_t *p = prev && prev[0] ? find(t, prev) : NULL;
    if (p)
        snprintf(p->next, sizeof p->next, "%s", id);
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
    SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory storing response %s: it cannot be continued",
            id);
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

/* DELETE of a head: its session goes too (on the I/O thread). */
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
    const int head = !e->next[0];
    snprintf(d->session, sizeof d->session, "%s", e->session);
    drop(app->responses, (size_t)(e - app->responses->e));
    if (!head) {
        srv_reply_json(req, 200, d->body);
        free(d);
        return;
    }
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
    rc |= srv_http_route(app->http, "GET", "/v1/responses/{id}", h_get, app, NULL);
    rc |= srv_http_route(app->http, "DELETE", "/v1/responses/{id}", h_delete, app, NULL);
    return rc ? -1 : 0;
}
