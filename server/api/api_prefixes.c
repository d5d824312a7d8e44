/* server/api/api_prefixes.c — the prefix cache's endpoints (docs/API.md
 * "Prefix cache"): POST /v1/prefixes pins a prefix (an ingest job whose
 * state is kept), GET /v1/prefixes lists the entries, DELETE
 * /v1/prefixes/{id} unpins. The cache's glue in the request flow is
 * api_prefix.c. Loop thread.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void entry_info(const srv_prefix_entry_t *e, proto_prefix_info_t *p)
{
    size_t n = 0;
    srv_prefix_entry_tokens(e, &n);
    *p = (proto_prefix_info_t){.id = srv_prefix_entry_id(e),
                               .tokens = (int64_t)n,
                               .bytes = (int64_t)srv_prefix_entry_bytes(e),
                               .pinned = srv_prefix_entry_pinned(e),
                               .hits = (int64_t)srv_prefix_entry_hits(e)};
}

static void reply_entry(srv_req_t *req, int status, const srv_prefix_entry_t *e)
{
    proto_prefix_info_t p;
    entry_info(e, &p);
    char *j = proto_prefix_json(&p);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply_json(req, status, j);
    proto_free(j);
}

/* The answer to a pin the cache refused (rc: its error). */
static void pin_error(const api_app_t *app, int rc, size_t bytes, proto_error_t *e)
{
    srv_prefix_cache_stats_t st = {0};
    if (app->prefix)
        srv_prefix_cache_stats(app->prefix, &st);
    if (rc == SRV_PREFIX_EPINNED) {
        proto_error_set(e, PROTO_ERR_STORAGE, NULL,
                        "%d prefixes are pinned already, the most this server keeps; "
                        "DELETE /v1/prefixes/{id} one first",
                        API_PREFIX_MAX_PINNED);
    } else if (rc == SRV_PREFIX_ETOOBIG) {
        proto_error_set(e, PROTO_ERR_STORAGE, NULL,
                        "pinning this prefix (%zu bytes of state) would take the pinned prefixes "
                        "to %zu bytes, over the prefix cache's %lld MiB (--prefix-cache-mb)",
                        bytes, st.pinned_bytes + bytes, (long long)app->cfg->prefix_cache_mb);
    } else {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "prefix cache: %s", srv_prefix_strerror(rc));
        return;
    }
    e->code = "prefix_cache_full";
}

typedef struct pin_kd {
    int32_t *key; /* owned [n] */
    size_t n;
    size_t est; /* state bytes expected */
} pin_kd_t;

static void pin_kd_free(void *p)
{
    pin_kd_t *k = p;
    if (k)
        free(k->key);
    free(k);
}

static void pin_done(api_gen_t *g)
{
    pin_kd_t *k = g->kd;
    if (g->aborted || g->cancelled)
        return;
    const srv_job_result_t *res = srv_job_result(g->jobs[0].job);
    proto_error_t e;
    if (g->shutdown) {
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, &e);
        api_gen_reply_error(g, &e);
        return;
    }
    if (!res || res->finish[0] == SRV_FINISH_ERROR) {
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "prefix ingest failed: %s",
                        res && res->error[0] ? res->error : "error");
        api_gen_reply_error(g, &e);
        return;
    }
    api_app_t *app = g->app;
    core_attn_state_t *st = g->jobs[0].own.state;
    srv_prefix_entry_t *ent = NULL;
    int rc = app->prefix ? srv_prefix_cache_insert(app->prefix, k->key, k->n, st,
                                                   api_prefix_entry_bytes(st), 1, &ent)
                         : SRV_PREFIX_ETOOBIG;
    if (rc == 0)
        g->jobs[0].own.state = NULL; /* the cache's now */
    else if (rc == SRV_PREFIX_EEXIST) /* made meanwhile by another request */
        rc = srv_prefix_cache_pin(app->prefix, ent);
    if (rc < 0) {
        pin_error(app, rc, api_prefix_entry_bytes(st), &e);
        api_gen_reply_error(g, &e);
        return;
    }
    proto_prefix_info_t p;
    entry_info(ent, &p);
    char *j = proto_prefix_json(&p);
    api_gen_reply_json(g, 201, j); /* NULL: 500 out of memory */
    proto_free(j);
}

static const api_gen_ops_t pin_ops = {.done = pin_done, .free = pin_kd_free};

static void h_prefix_create(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_prefix_create_req_t pr;
    proto_error_t e;
    if (proto_prefix_create_parse(body, len, &app->limits, &pr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    core_error_t ce = {0};
    const char *what = pr.messages ? "messages" : "text";
    int rc = pr.messages ? api_chat_tokens(app, pr.messages, pr.n_messages, 0, 0, 0,
                                           pr.parse_special, 1, &ids, &n, &ce)
                         : api_tokenize(app, pr.text, pr.text_len, 1, &ids, &n, &ce);
    proto_session_append_free(&pr);
    if (rc < 0) {
        api_core_error(ce.code, what, ce.msg, &e);
        api_reply_proto(req, &e);
        free(ids);
        return;
    }
    if (api_input_budget(app, n, what, &e) < 0) {
        free(ids);
        api_reply_proto(req, &e);
        return;
    }
    /* the key: all but the last token, which every request using the
     * prefix feeds itself (api.h "the prefix-state cache") */
    if (n < 2) {
        free(ids);
        api_reply_kind(req, PROTO_ERR_INVALID_VALUE, what, "a prefix needs at least 2 tokens; this one has %zu", n);
        return;
    }
    const size_t nk = n - 1;
    srv_prefix_entry_t *ent = app->prefix ? srv_prefix_cache_find(app->prefix, ids, nk) : NULL;
    if (ent) { /* cached already: pinned now (201), or pinned before (200) */
        free(ids);
        const int was = srv_prefix_entry_pinned(ent);
        int prc = srv_prefix_cache_pin(app->prefix, ent);
        if (prc < 0) {
            pin_error(app, prc, srv_prefix_entry_bytes(ent), &e);
            api_reply_proto(req, &e);
            return;
        }
        srv_prefix_cache_touch(app->prefix, ent);
        reply_entry(req, was ? 200 : 201, ent);
        return;
    }
    /* refused before any work when it cannot be pinned */
    const size_t est = api_prefix_entry_estimate(app, (int64_t)nk);
    srv_prefix_cache_stats_t st = {0};
    if (app->prefix)
        srv_prefix_cache_stats(app->prefix, &st);
    if (!app->prefix || st.pinned >= API_PREFIX_MAX_PINNED ||
        st.pinned_bytes + est > (size_t)app->cfg->prefix_cache_mb << 20) {
        free(ids);
        pin_error(app, st.pinned >= API_PREFIX_MAX_PINNED ? SRV_PREFIX_EPINNED : SRV_PREFIX_ETOOBIG,
                  est, &e);
        api_reply_proto(req, &e);
        return;
    }
    pin_kd_t *kd = calloc(1, sizeof *kd);
    api_gen_t *g = kd ? api_gen_new(app, req, &pin_ops, kd, 1) : NULL;
    if (!g) { /* api_gen_new freed kd */
        free(ids);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    kd->key = ids;
    kd->n = nk;
    kd->est = est;
    if (api_gen_reserve(g, est, &e) < 0) {
        api_gen_abort(g);
        api_reply_admit(req, &e);
        return;
    }
    core_sample_params_t sp;
    core_sample_params_default(&sp);
    if (api_gen_oneshot(g, 0, &sp, &ce) < 0) {
        api_core_error(ce.code, NULL, ce.msg, &e);
        api_gen_abort(g);
        api_reply_proto(req, &e);
        return;
    }
    srv_job_spec_t spec;
    srv_job_spec_init(&spec);
    spec.prompt = ids;
    spec.n_prompt = nk;
    spec.max_tokens = 0;
    /* a shorter cached prefix shortens this ingest too */
    if (api_prefix_plan(g, 0, &spec, ids, nk, nk, NULL, NULL, 0, &e) < 0) {
        api_gen_abort(g);
        api_reply_proto(req, &e);
        return;
    }
    char err[512];
    rc = api_gen_submit(g, 0, &spec, err, sizeof err);
    if (rc < 0) {
        api_gen_abort(g);
        api_reply_engine(req, rc, err);
        return;
    }
    api_gen_start(g, req, 0, PROTO_STREAM_NDJSON);
}

/* Every model's cache (api_hub_app): the entries of each, the budgets and
 * bytes summed. */
static void h_prefix_list(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t total = 0, bytes = 0, pinned = 0;
    int64_t budget = 0;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        srv_prefix_cache_stats_t st = {0};
        if (a->prefix)
            srv_prefix_cache_stats(a->prefix, &st);
        total += st.entries;
        bytes += st.bytes;
        pinned += st.pinned_bytes;
        budget += a->cfg->prefix_cache_mb << 20;
    }
    proto_prefix_info_t *items = calloc(total ? total : 1, sizeof *items);
    if (!items) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        for (srv_prefix_entry_t *e = a->prefix ? srv_prefix_cache_next(a->prefix, NULL) : NULL;
             e && n < total; e = srv_prefix_cache_next(a->prefix, e))
            entry_info(e, &items[n++]);
    }
    char *j = proto_prefix_list_json(items, n, budget, (int64_t)bytes, (int64_t)pinned);
    free(items);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

static void h_prefix_delete(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *id = srv_req_param(req, "id");
    srv_prefix_entry_t *ent =
        id && app->prefix ? srv_prefix_cache_get(app->prefix, id) : NULL;
    if (!ent || !srv_prefix_entry_pinned(ent)) {
        proto_error_t e;
        proto_error_set(&e, PROTO_ERR_NOT_FOUND, NULL, "no pinned prefix '%.64s'", id ? id : "");
        e.code = "prefix_not_found";
        api_reply_proto(req, &e);
        return;
    }
    srv_prefix_cache_unpin(app->prefix, ent);
    reply_entry(req, 200, ent);
}

int api_prefix_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    int rc = 0;
    rc |= api_route(app, "POST", "/v1/prefixes", h_prefix_create, &json);
    rc |= api_route(app, "GET", "/v1/prefixes", h_prefix_list, NULL);
    rc |= api_route(app, "DELETE", "/v1/prefixes/{id}", h_prefix_delete, NULL);
    return rc ? -1 : 0;
}
