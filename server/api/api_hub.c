/* server/api/api_hub.c — several models in one server: one app per model
 * (api_app.c: its engine, session store, prefix cache, I/O thread) behind
 * one router that registers every route once and hands each request to the
 * app of the model it names (api.h, "several models"; DESIGN.md "Several
 * models").
 *
 * What each model gets of the shared budgets (so that the server as a
 * whole stays within what the flags say): --max-sessions,
 * --max-session-bytes, --max-session-disk, --max-session-files and
 * --prefix-cache-mb are split evenly between the models;
 * --max-state-memory is one pool that every model's admissions count
 * against (api_budget.c). Each model's sessions live in their own
 * directory, <--session-dir>/<model id>, so that one store's start-up
 * clean-up never meets another model's files.
 *
 * Loop thread only.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HUB_MAX_ROUTES 96
#define HUB_MAX_MODELS API_HUB_MAX_MODELS

/* How a route finds its model. */
typedef enum hub_pick {
    HUB_PICK_BODY,     /* the JSON body's "model" */
    HUB_PICK_OLLAMA,   /* the body's "model", else "name" */
    HUB_PICK_QUERY,    /* ?model= */
    HUB_PICK_SESSION,  /* the app that holds session {id} */
    HUB_PICK_PREFIX,   /* the app that holds prefix {id} */
    HUB_PICK_RESPONSE, /* the app that holds stored response {id} */
    HUB_PICK_FIRST     /* the first app (lists and server-wide routes) */
} hub_pick_t;

typedef struct hub_route {
    api_hub_t *hub;
    char method[8];
    char pattern[64];
    srv_handler_fn fn;
    hub_pick_t pick;
} hub_route_t;

struct api_hub {
    srv_http_t *http;
    api_app_t *apps[HUB_MAX_MODELS]; /* owned by themselves (freed when their handles close) */
    srv_config_t cfgs[HUB_MAX_MODELS]; /* each app's view: shallow copies of the server's,
                                          with the model's own path and shares */
    char *dirs[HUB_MAX_MODELS];        /* owned: each model's session directory */
    size_t n;
    size_t n_ready;
    size_t n_alive; /* apps not freed yet; the hub goes with the last */
    size_t state_max_body; /* the largest state blob any model makes */
    hub_route_t *routes[HUB_MAX_ROUTES]; /* owned */
    size_t n_routes;
    int (*has_response)(const api_app_t *app, const char *id); /* api_responses_has */
};

/* ---- names ---- */

int api_model_named(const api_app_t *app, const char *name)
{
    const char *cand[2] = {app->model_id, app->model_alias};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(cand[k]);
        if (n == 0 || strncasecmp(name, cand[k], n) != 0)
            continue;
        if (name[n] == '\0' || strcasecmp(name + n, ":latest") == 0)
            return 1;
    }
    return 0;
}

void api_model_names(const api_app_t *app, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < api_hub_count(app) && used < len; i++) {
        int w = snprintf(out + used, len - used, "%s'%s'", i ? ", " : "",
                         api_hub_app(app, i)->model_id);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

size_t api_hub_count(const api_app_t *app)
{
    return app->hub ? app->hub->n : 1;
}

api_app_t *api_hub_app(const api_app_t *app, size_t i)
{
    return app->hub ? app->hub->apps[i] : (api_app_t *)app;
}

/* ---- routing ---- */

static hub_pick_t route_pick(const char *method, const char *pattern)
{
    if (strncmp(pattern, "/v1/sessions/{id}", 17) == 0)
        return HUB_PICK_SESSION;
    if (strcmp(pattern, "/v1/prefixes/{id}") == 0)
        return HUB_PICK_PREFIX;
    if (strcmp(pattern, "/v1/responses/{id}") == 0)
        return HUB_PICK_RESPONSE;
    if (strcmp(pattern, "/props") == 0)
        return HUB_PICK_QUERY;
    static const char *const first[] = {"/api/pull", "/api/push",  "/api/create",
                                        "/api/copy", "/api/delete", "/api/blobs/"};
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        if (strncmp(pattern, first[i], strlen(first[i])) == 0)
            return HUB_PICK_FIRST;
    if (strcmp(method, "POST") != 0)
        return HUB_PICK_FIRST;
    return strncmp(pattern, "/api/", 5) == 0 ? HUB_PICK_OLLAMA : HUB_PICK_BODY;
}

/* 404 model_not_found in the route's API's shape (Ollama's for /api/...,
 * Anthropic's for /v1/messages, OpenAI's elsewhere). */
static void reply_unknown(api_hub_t *hub, srv_req_t *req, const char *name, int too_long)
{
    char names[512];
    api_model_names(hub->apps[0], names, sizeof names);
    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_MODEL_NOT_FOUND, "model",
                    "model '%.256s%s' not found: this server serves %s (darkserve cannot pull "
                    "models)",
                    name, too_long ? "..." : "", names);
    const char *route = srv_req_route(req);
    if (route && strncmp(route, "/api/", 5) == 0) {
        char *j = proto_ollama_error_json(&e);
        if (!j) {
            srv_reply_json(req, 500, "{\"error\":\"out of memory\"}");
            return;
        }
        srv_reply_json(req, e.status, j);
        proto_free(j);
        return;
    }
    api_reply_proto(req, &e);
}

/* The app a model name picks; NULL for an unknown name. */
static api_app_t *by_name(api_hub_t *hub, const char *name)
{
    for (size_t i = 0; i < hub->n; i++)
        if (api_model_named(hub->apps[i], name))
            return hub->apps[i];
    return NULL;
}

/* The app that holds id (a session, pinned prefix or stored response,
 * by pick); NULL when none does. */
static api_app_t *holder(api_hub_t *hub, hub_pick_t pick, const char *id)
{
    if (!id || !*id)
        return NULL;
    for (size_t i = 0; i < hub->n; i++) {
        api_app_t *a = hub->apps[i];
        if (!a->ready)
            continue;
        if (pick == HUB_PICK_SESSION && a->store &&
            srv_store_info(a->store, id, &(srv_session_info_t){0}, NULL, 0) == 0)
            return a;
        if (pick == HUB_PICK_PREFIX && a->prefix && srv_prefix_cache_get(a->prefix, id))
            return a;
        if (pick == HUB_PICK_RESPONSE && hub->has_response(a, id))
            return a;
    }
    return NULL;
}

/* 400: what the request continues belongs to another model than it names. */
static void reply_bound(srv_req_t *req, const char *what, const char *id, const api_app_t *owner,
                        const char *name)
{
    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, "model",
                    "%s '%.64s' is bound to model '%s'; it cannot continue on '%.256s'", what,
                    id, owner->model_id, name);
    api_reply_proto(req, &e);
}

/* What a JSON body names: its model, and what it continues (a session, a
 * cached prefix, a stored response: their app answers it, whatever the
 * model field says, which must then name the same model). */
enum { PEEK_MODEL, PEEK_FALLBACK, PEEK_SESSION, PEEK_PREFIX, PEEK_RESPONSE, PEEK_N };

static void dispatch(srv_req_t *req, void *ud)
{
    hub_route_t *r = ud;
    api_hub_t *hub = r->hub;
    api_app_t *app = hub->apps[0];
    char v[PEEK_N][PROTO_MAX_NAME_BYTES + 1];
    int found[PEEK_N] = {0};
    const char *name = v[PEEK_MODEL];
    int named = 0;
    v[PEEK_MODEL][0] = '\0';
    switch (r->pick) {
    case HUB_PICK_FIRST:
        break;
    case HUB_PICK_QUERY: {
        const char *q = srv_req_query(req, "model");
        if (q && *q) {
            snprintf(v[PEEK_MODEL], sizeof v[PEEK_MODEL], "%s", q);
            named = strlen(q) < sizeof v[PEEK_MODEL] ? 1 : -1;
        }
        break;
    }
    case HUB_PICK_BODY:
    case HUB_PICK_OLLAMA: {
        static const char *const keys[PEEK_N] = {"model", "name", "session", "prefix",
                                                 "previous_response_id"};
        char *outs[PEEK_N] = {v[0], v[1], v[2], v[3], v[4]};
        size_t len = 0;
        const char *body = srv_req_body(req, &len);
        proto_peek_strings(body, len, keys, PEEK_N, outs, sizeof v[0], found);
        named = found[PEEK_MODEL];
        if (!named && r->pick == HUB_PICK_OLLAMA) {
            named = found[PEEK_FALLBACK];
            name = v[PEEK_FALLBACK];
        }
        if (r->pick == HUB_PICK_OLLAMA)
            break;
        static const struct {
            int key;
            hub_pick_t pick;
            const char *what;
        } anchors[] = {{PEEK_SESSION, HUB_PICK_SESSION, "session"},
                       {PEEK_PREFIX, HUB_PICK_PREFIX, "prefix"},
                       {PEEK_RESPONSE, HUB_PICK_RESPONSE, "response"}};
        for (size_t i = 0; i < sizeof anchors / sizeof anchors[0]; i++) {
            api_app_t *h = found[anchors[i].key] > 0
                               ? holder(hub, anchors[i].pick, v[anchors[i].key])
                               : NULL;
            if (!h)
                continue;
            if (named > 0 && !api_model_named(h, name)) {
                reply_bound(req, anchors[i].what, v[anchors[i].key], h, name);
                return;
            }
            r->fn(req, h);
            return;
        }
        break;
    }
    case HUB_PICK_SESSION:
    case HUB_PICK_PREFIX:
    case HUB_PICK_RESPONSE: {
        const char *id = srv_req_param(req, "id");
        api_app_t *h = holder(hub, r->pick, id);
        if (!h) /* the first app answers: 404 in its words */
            break;
        /* a session stays bound to its model: a body naming another is refused */
        size_t len = 0;
        const char *body = strcmp(r->method, "POST") == 0 ? srv_req_body(req, &len) : NULL;
        if (body && proto_peek_model(body, len, NULL, v[PEEK_MODEL], sizeof v[PEEK_MODEL]) == 1 &&
            !api_model_named(h, v[PEEK_MODEL])) {
            reply_bound(req, r->pick == HUB_PICK_SESSION  ? "session"
                             : r->pick == HUB_PICK_PREFIX ? "prefix"
                                                          : "response",
                        id, h, v[PEEK_MODEL]);
            return;
        }
        app = h;
        break;
    }
    }
    if (named) {
        api_app_t *a = named > 0 ? by_name(hub, name) : NULL;
        if (!a) {
            reply_unknown(hub, req, name, named < 0);
            return;
        }
        app = a;
    }
    r->fn(req, app);
}

int api_route(api_app_t *app, const char *method, const char *pattern, srv_handler_fn fn,
              const srv_route_opts_t *opts)
{
    api_hub_t *hub = app->hub;
    if (!hub)
        return srv_http_route(app->http, method, pattern, fn, app, opts);
    for (size_t i = 0; i < hub->n_routes; i++) {
        hub_route_t *r = hub->routes[i];
        if (strcmp(r->method, method) == 0 && strcmp(r->pattern, pattern) == 0)
            return r->fn == fn ? 0 : -1; /* every app registers the same handlers */
    }
    if (hub->n_routes == HUB_MAX_ROUTES || strlen(method) >= sizeof hub->routes[0]->method ||
        strlen(pattern) >= sizeof hub->routes[0]->pattern)
        return -1;
    hub_route_t *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    r->hub = hub;
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->pattern, sizeof r->pattern, "%s", pattern);
    r->fn = fn;
    r->pick = route_pick(method, pattern);
    hub->routes[hub->n_routes++] = r;
    return srv_http_route(hub->http, method, pattern, dispatch, r, opts);
}

/* ---- lifecycle ---- */

void api_hub_ready(api_app_t *app)
{
    api_hub_t *hub = app->hub;
    if (!hub) {
        srv_http_set_ready(app->http, 1);
        SRV_LOG(SRV_LOG_INFO, NULL, "ready");
        return;
    }
    /* a PUT of a state blob is bounded by the largest any model makes */
    if (app->state_blob_max > hub->state_max_body) {
        hub->state_max_body = app->state_blob_max;
        if (srv_http_route_set_max_body(hub->http, "PUT", "/v1/sessions/{id}/state",
                                        hub->state_max_body) < 0)
            SRV_LOG(SRV_LOG_WARN, NULL, "cannot bound the state import route");
    }
    if (++hub->n_ready < hub->n) {
        SRV_LOG(SRV_LOG_INFO, NULL, "model %s ready (%zu of %zu)", app->model_id, hub->n_ready,
                hub->n);
        return;
    }
    srv_http_set_ready(hub->http, 1);
    SRV_LOG(SRV_LOG_INFO, NULL, "ready (%zu models)", hub->n);
}

static void hub_free(api_hub_t *hub)
{
    for (size_t i = 0; i < hub->n_routes; i++)
        free(hub->routes[i]);
    for (size_t i = 0; i < HUB_MAX_MODELS; i++)
        free(hub->dirs[i]);
    free(hub);
}

void api_hub_app_gone(api_app_t *app)
{
    api_hub_t *hub = app->hub;
    if (hub && --hub->n_alive == 0)
        hub_free(hub);
}

/* An even share of a bound (0 = none stays none), at least 1. */
static int64_t share(int64_t v, size_t n)
{
    if (v <= 0)
        return v;
    int64_t s = v / (int64_t)n;
    return s > 0 ? s : 1;
}

api_hub_t *api_hub_new(const srv_serve_ctx_t *ctx,
                       int (*has_response)(const api_app_t *app, const char *id))
{
    const srv_config_t *cfg = ctx->cfg;
    if (cfg->models.n > HUB_MAX_MODELS) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "--model: at most %d models, got %zu", HUB_MAX_MODELS,
                cfg->models.n);
        return NULL;
    }
    api_hub_t *hub = calloc(1, sizeof *hub);
    if (!hub) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
        return NULL;
    }
    hub->http = ctx->http;
    hub->n = cfg->models.n;
    hub->has_response = has_response;
    /* names must tell the models apart */
    for (size_t i = 0; i < hub->n; i++) {
        for (size_t j = 0; j < i; j++) {
            const char *a = strrchr(cfg->models.v[i], '/'), *b = strrchr(cfg->models.v[j], '/');
            a = a ? a + 1 : cfg->models.v[i];
            b = b ? b + 1 : cfg->models.v[j];
            if (strcasecmp(a, b) == 0) {
                SRV_LOG(SRV_LOG_ERROR, NULL,
                        "--model %s and --model %s have the same name '%s': requests could not "
                        "tell them apart",
                        cfg->models.v[j], cfg->models.v[i], a);
                hub_free(hub);
                return NULL;
            }
        }
    }
    /* families with the same name count every model (srv_metrics_share) */
    if (ctx->metrics)
        srv_metrics_share(ctx->metrics, 1);
    for (size_t i = 0; i < hub->n; i++) {
        srv_config_t *c = &hub->cfgs[i];
        *c = *cfg; /* borrowed strings: the server's configuration outlives the apps */
        c->model = cfg->models.v[i];
        const char *base = strrchr(c->model, '/');
        base = base ? base + 1 : c->model;
        size_t bl = strlen(base);
        if (bl > 5 && strcasecmp(base + bl - 5, ".gguf") == 0)
            bl -= 5;
        size_t dl = strlen(cfg->session_dir) + bl + 2;
        if (!(hub->dirs[i] = malloc(dl))) {
            SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
            hub_free(hub);
            return NULL;
        }
        snprintf(hub->dirs[i], dl, "%s/%.*s", cfg->session_dir, (int)bl, base);
        c->session_dir = hub->dirs[i];
        c->max_sessions = share(cfg->max_sessions, hub->n);
        c->max_session_bytes = share(cfg->max_session_bytes, hub->n);
        c->max_session_disk = share(cfg->max_session_disk, hub->n);
        c->max_session_files = share(cfg->max_session_files, hub->n);
        c->prefix_cache_mb = share(cfg->prefix_cache_mb, hub->n);
        c->ui = i == 0 && cfg->ui;
    }
    return hub;
}

const srv_config_t *api_hub_cfg(const api_hub_t *hub, size_t i)
{
    return &hub->cfgs[i];
}

void api_hub_add(api_hub_t *hub, size_t i, api_app_t *app)
{
    hub->apps[i] = app;
    hub->n_alive++;
}

void api_hub_abandon(api_hub_t *hub)
{
    if (hub->n_alive == 0)
        hub_free(hub);
}
