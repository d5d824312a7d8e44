/* server/api/api_budget.c — the attention-state memory budget
 * (--max-state-memory): what a request's states may need at most
 * (api_state_bound), admission against what sessions hold and requests in
 * flight reserved (api_state_admit; idle sessions are moved to disk on the
 * I/O thread to make room), and the 429/503 reply that says so. Loop thread.
 * With several models the budget is one pool: every model's sessions and
 * reservations count against it.
 * A request's own reservation is api_gen_reserve (api_gen.c).
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <stdlib.h>

size_t api_state_bound(const api_app_t *app, int64_t tokens)
{
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(app->model));
    if (c->kind != CORE_ATTN_EXACT)
        return app->state_fixed_bytes;
    /* the cache doubles and rounds up to 16 tokens: at most 2 * tokens + 16,
     * never past the context */
    int64_t cap = tokens > c->max_ctx / 2 ? c->max_ctx : 2 * tokens + 16;
    if (cap > c->max_ctx)
        cap = c->max_ctx;
    size_t row = 2 * (size_t)c->n_head_kv * (size_t)c->head_dim * sizeof(float);
    return 4096 + (size_t)c->n_layer * (2 * sizeof(float *) + (size_t)cap * row);
}

typedef struct trim_io {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    size_t target;
    int rc;
    char err[256];
} trim_io_t;

static void trim_work(api_io_t *io)
{
    trim_io_t *w = (trim_io_t *)io;
    w->rc = srv_store_trim(w->app->store, w->target, w->err, sizeof w->err);
}

static void trim_done(api_io_t *io)
{
    trim_io_t *w = (trim_io_t *)io;
    if (w->rc < 0)
        SRV_LOG(SRV_LOG_WARN, NULL, "moving idle sessions to disk for state memory: %s",
                w->err);
    w->app->trimming = 0;
    free(w);
}

int api_state_admit(api_app_t *app, size_t bytes, proto_error_t *e)
{
    if (!app->state_budget)
        return 0;
    const size_t B = app->state_budget;
    if (bytes > B) {
        proto_error_set(e, PROTO_ERR_INVALID_VALUE, NULL,
                        "this request needs up to %zu bytes of attention state, more than the "
                        "server's whole budget of %zu (--max-state-memory); ask for fewer "
                        "choices ('n') or tokens",
                        bytes, B);
        e->code = "state_memory_exceeded";
        return -1;
    }
    /* one pool for every model the server runs (api_hub_app) */
    size_t held = 0, evictable = 0, reserved = 0;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        size_t h = 0, ev = 0;
        if (a->store)
            srv_store_mem_stats(a->store, &h, &ev);
        held += h;
        evictable += ev;
        reserved += a->state_reserved;
    }
    size_t used = reserved + held;
    if (used > B || bytes > B - used) {
        proto_error_set(e, PROTO_ERR_RATE_LIMIT, NULL,
                        "attention state memory is full (%zu of %zu bytes in use by sessions and "
                        "requests in flight, %zu more needed); retry later",
                        used, B, bytes);
        e->code = "state_memory_full";
        return -1;
    }
    /* idle sessions make way (written to disk, off the loop), each model's
     * store by the same room */
    const size_t room = B - used - bytes;
    for (size_t i = 0; evictable > room && i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        size_t h = 0, ev = 0;
        if (a->store)
            srv_store_mem_stats(a->store, &h, &ev);
        if (ev <= room || a->trimming || !a->io_running)
            continue;
        trim_io_t *w = calloc(1, sizeof *w);
        if (!w)
            continue;
        w->io.work = trim_work;
        w->io.done = trim_done;
        w->app = a;
        w->target = h + room;
        a->trimming = 1;
        api_io_submit(a, &w->io);
    }
    return 0;
}

void api_reply_admit(srv_req_t *req, const proto_error_t *e)
{
    if (e->status == 429 || e->status == 503)
        srv_req_add_header(req, "Retry-After", "1");
    api_reply_proto(req, e);
}
