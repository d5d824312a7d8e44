/* server/api/api_prefix.c — the prefix-state cache in the request flow
 * (docs/API.md "Prefix cache"):
 *   - before a job on a fresh context: the longest cached prefix of its
 *     prompt is copied into the context's state (the engine then feeds
 *     only the rest: srv_job_spec_t.n_cached), and the prefix lengths to
 *     insert become engine snapshots (srv_job_spec_t.snap_at);
 *   - once the job's prefill is over: the snapshots go into the cache.
 * The /v1/prefixes endpoints that pin, list and unpin entries are
 * api_prefixes.c.
 *
 * The cache and every state in it belong to the loop thread: entries are
 * copied into a context before the job is submitted and snapshots taken
 * once the scheduler is done with them, so it never sees a cached state.
 *
 * Snapshots in flight are memory too: each one planned reserves its
 * estimated bytes in the cache (which evicts to make room), so the cache
 * and the copies on their way into it stay within --prefix-cache-mb, and
 * a key some request in flight will insert already (every chat without a
 * system message shares the default one) is not planned again. A copy is a
 * memcpy of one state (a few MB for DARKFormer, the KV cache so far for
 * exact attention). The key's namespace is the model fingerprint and the
 * attention configuration with the digest of its learned parameters
 * (api_attn_config_text): what makes two states incomparable.
 */
#include "server/api/api.h"

#include "server/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the cache counts an entry at: the bytes its state has written
 * (core_attn_state_bytes_held), not its capacity. Entries never grow (a
 * hit copies one into the request's own state), and a short chat's
 * DARKFormer snapshot has written ~2.5 of its 9.4 MB: counted at capacity,
 * the default 64 MiB held 7 of them. */
size_t api_prefix_entry_bytes(const core_attn_state_t *st)
{
    return core_attn_state_bytes_held(st);
}

/* An entry's bytes before its state exists: a snapshot (or a pinned
 * prefix's state) at tokens positions. */
size_t api_prefix_entry_estimate(const api_app_t *app, int64_t tokens)
{
    const size_t b = core_attn_bytes_held_at(core_model_attn(app->model), tokens);
    return b ? b : api_state_bound(app, tokens);
}

/* Boundaries of one chat request that are kept at most: the first and the
 * last ones (a shared system prompt; the conversation so far). */
#define MAX_BOUNDS 4

static void free_state(void *v)
{
    core_attn_state_free(v);
}

int api_prefix_init(api_app_t *app)
{
    if (app->cfg->prefix_cache_mb <= 0)
        return 0;
    char ns[1024];
    const char *fp = core_model_info(app->model)->fingerprint;
    int n = snprintf(ns, sizeof ns, "darkserve prefix state\nmodel=%s\n", fp);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof ns ? (size_t)n : sizeof ns - 1;
    len += api_attn_config_text(app, ns + len, sizeof ns - len);
    srv_prefix_cache_opts_t o = {.budget = (size_t)app->cfg->prefix_cache_mb << 20,
                                 .max_pinned = API_PREFIX_MAX_PINNED,
                                 .ns = ns,
                                 .ns_len = len,
                                 .free_value = free_state};
    return srv_prefix_cache_new(&o, &app->prefix) < 0 ? -1 : 0;
}

void api_prefix_free(api_app_t *app)
{
    srv_prefix_cache_free(app->prefix);
    app->prefix = NULL;
    free(app->pfx_pending);
    app->pfx_pending = NULL;
    app->n_pfx_pending = app->cap_pfx_pending = 0;
}

/* ---- snapshots in flight ---- */

/* One per key in flight: a key on its way is never planned a second time,
 * so its one plan owns the entry. */
struct api_pfx_pending {
    uint64_t key;  /* pending_key of the prefix */
    size_t wanted; /* plans that skipped it because it was on its way */
};

/* FNV-1a of a prefix's tokens and length: two requests planning the same
 * prefix get the same key (a collision only skips one insert). */
static uint64_t pending_key(const int32_t *toks, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)n;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint64_t)(((uint32_t)toks[i] >> (8 * b)) & 0xffu);
            h *= 0x100000001b3u;
        }
    return h;
}

static struct api_pfx_pending *pending_find(api_app_t *app, uint64_t key)
{
    for (size_t i = 0; i < app->n_pfx_pending; i++)
        if (app->pfx_pending[i].key == key)
            return &app->pfx_pending[i];
    return NULL;
}

/* Adds key (not in flight yet): 0, or -1 when out of memory (the snapshot
 * is then not planned). */
static int pending_add(api_app_t *app, uint64_t key)
{
    if (app->n_pfx_pending == app->cap_pfx_pending) {
        size_t cap = app->cap_pfx_pending ? 2 * app->cap_pfx_pending : 16;
        struct api_pfx_pending *np = realloc(app->pfx_pending, cap * sizeof *np);
        if (!np)
            return -1;
        app->pfx_pending = np;
        app->cap_pfx_pending = cap;
    }
    app->pfx_pending[app->n_pfx_pending++] = (struct api_pfx_pending){key, 0};
    return 0;
}

static void pending_remove(api_app_t *app, uint64_t key)
{
    struct api_pfx_pending *p = pending_find(app, key);
    if (p)
        *p = app->pfx_pending[--app->n_pfx_pending];
}

void api_prefix_drop(api_app_t *app, api_prefix_plan_t *pl)
{
    for (size_t k = 0; k < pl->n_snap; k++) {
        srv_prefix_cache_release(app->prefix, pl->est[k]);
        pending_remove(app, pl->key[k]);
    }
    pl->n_snap = 0;
    free(pl->toks);
    pl->toks = NULL;
}

void api_prefix_register_metrics(api_app_t *app)
{
    srv_metrics_t *m = app->metrics;
    if (!m)
        return;
    app->m_pfx_hits = srv_metric_series(
        srv_metrics_counter(m, "darkserve_prefix_cache_hits_total",
                            "Requests that started from a cached prefix state", NULL),
        NULL);
    app->m_pfx_misses = srv_metric_series(
        srv_metrics_counter(m, "darkserve_prefix_cache_misses_total",
                            "Requests on a fresh context that found no cached prefix", NULL),
        NULL);
    app->m_pfx_evictions = srv_metric_series(
        srv_metrics_counter(m, "darkserve_prefix_cache_evictions_total",
                            "Cached prefixes dropped to stay within --prefix-cache-mb", NULL),
        NULL);
    app->m_pfx_inserts = srv_metric_series(
        srv_metrics_counter(m, "darkserve_prefix_cache_inserts_total",
                            "Prefix states added to the cache", NULL),
        NULL);
    app->m_pfx_bytes = srv_metric_series(
        srv_metrics_gauge(m, "darkserve_prefix_cache_bytes",
                          "Bytes of attention state held by the prefix cache", NULL),
        NULL);
    app->m_pfx_entries = srv_metric_series(
        srv_metrics_gauge(m, "darkserve_prefix_cache_entries", "Prefixes cached", NULL), NULL);
    app->m_pfx_pinned = srv_metric_series(
        srv_metrics_gauge(m, "darkserve_prefix_cache_pinned", "Prefixes pinned (never evicted)",
                          NULL),
        NULL);
    app->m_pfx_reserved = srv_metric_series(
        srv_metrics_gauge(m, "darkserve_prefix_cache_reserved_bytes",
                          "Bytes reserved for state snapshots on their way into the cache", NULL),
        NULL);
}

void api_prefix_refresh_metrics(api_app_t *app)
{
    if (!app->prefix)
        return;
    srv_prefix_cache_stats_t st, *seen = &app->pfx_seen;
    srv_prefix_cache_stats(app->prefix, &st);
    srv_series_add(app->m_pfx_hits, (double)(st.hits - seen->hits));
    srv_series_add(app->m_pfx_misses, (double)(st.misses - seen->misses));
    srv_series_add(app->m_pfx_evictions, (double)(st.evictions - seen->evictions));
    srv_series_add(app->m_pfx_inserts, (double)(st.inserts - seen->inserts));
    srv_series_set(app->m_pfx_bytes, (double)st.bytes);
    srv_series_set(app->m_pfx_entries, (double)st.entries);
    srv_series_set(app->m_pfx_pinned, (double)st.pinned);
    srv_series_set(app->m_pfx_reserved, (double)st.reserved);
    *seen = st;
}

/* ---- before and after a job ---- */

size_t api_prefix_chat_bounds(const api_app_t *app, const proto_message_t *msgs, size_t n,
                              const proto_tool_t *tools, size_t n_tools, int parse_special,
                              const int32_t *ids, size_t n_ids, size_t *out)
{
    if (!app->prefix || n == 0)
        return 0;
    /* A conversation that does not open with a system message gets the
     * template's default one, the same for every such request (SmolLM2's:
     * 21 of a short question's ~45 tokens): its end is a boundary too, the
     * first, rendered as that system message alone (k = 0 below). */
    const size_t dsl = app->tmpl.default_system_len;
    const int dflt = msgs[0].role != PROTO_ROLE_SYSTEM && dsl > 0;
    char dsys[CORE_CHAT_DEFAULT_SYSTEM_MAX + 1];
    memcpy(dsys, app->tmpl.default_system, dflt ? dsl : 0);
    dsys[dflt ? dsl : 0] = '\0';
    const proto_message_t sysm = {.role = PROTO_ROLE_SYSTEM, .content = dsys, .content_len = dsl};
    /* messages [0..k) for k = 1 and the last MAX_BOUNDS - 1 values up to n */
    size_t ks[MAX_BOUNDS + 1], nk = 0;
    if (dflt)
        ks[nk++] = 0;
    ks[nk++] = 1;
    for (size_t k = n > MAX_BOUNDS - 1 ? n - (MAX_BOUNDS - 2) : 2; k <= n; k++)
        ks[nk++] = k;
    size_t nb = 0;
    for (size_t i = 0; i < nk; i++) {
        int32_t *t = NULL;
        size_t nt = 0;
        core_error_t ce = {0};
        if (api_chat_tokens_tools(app, ks[i] ? msgs : &sysm, ks[i] ? ks[i] : 1, tools, n_tools, 0,
                                  0, 0, parse_special, 1, &t, &nt, &ce) < 0) {
            free(t);
            continue;
        }
        /* the key: the rendered text up to the boundary less its last token,
         * when the whole prompt starts with that text's tokens (a template
         * or tokenization that does not keep prefixes gives no key) */
        const int prefix = nt >= 1 && nt <= n_ids && memcmp(t, ids, nt * sizeof *t) == 0;
        free(t);
        if (!prefix || nt - 1 < API_PREFIX_MIN_TOKENS || (nb && out[nb - 1] >= nt - 1))
            continue;
        out[nb++] = nt - 1;
    }
    return nb;
}

/* 1 when toks[n] starts with key[nk]. */
static int starts_with(const int32_t *toks, size_t n, const int32_t *key, size_t nk)
{
    return nk <= n && memcmp(toks, key, nk * sizeof *key) == 0;
}

int api_prefix_plan(api_gen_t *g, size_t ji, srv_job_spec_t *spec, const int32_t *toks, size_t n,
                    size_t max_cached, const char *prefix_id, const size_t *bounds,
                    size_t n_bounds, proto_error_t *e)
{
    api_app_t *app = g->app;
    api_gen_job_t *j = &g->jobs[ji];
    api_prefix_plan_t *pl = &j->pfx;
    if (prefix_id && prefix_id[0]) {
        srv_prefix_entry_t *want = app->prefix ? srv_prefix_cache_get(app->prefix, prefix_id)
                                               : NULL;
        if (!want) {
            proto_error_set(e, PROTO_ERR_NOT_FOUND, "prefix", "prefix '%s' not found%s",
                            prefix_id, app->prefix ? "" : " (the prefix cache is off)");
            e->code = "prefix_not_found";
            return -1;
        }
        size_t nk = 0;
        const int32_t *key = srv_prefix_entry_tokens(want, &nk);
        if (!starts_with(toks, n, key, nk) || nk > max_cached) {
            proto_error_set(e, PROTO_ERR_INVALID_VALUE, "prefix",
                            "the prompt (%zu tokens) does not %s the prefix '%s' (%zu tokens)", n,
                            starts_with(toks, n, key, nk) ? "continue past" : "start with",
                            prefix_id, nk);
            return -1;
        }
    }
    if (!app->prefix || n == 0)
        return 0;
    srv_seq_ctx_t *ctx = j->ctx;
    if (ctx->n_pending || core_attn_state_pos(ctx->state) != 0)
        return 0; /* a continued session: its state is no function of the prompt */
    srv_prefix_entry_t *hit = srv_prefix_cache_lookup(app->prefix, toks, n, max_cached);
    if (hit) {
        core_error_t ce = {0};
        if (core_attn_state_copy(ctx->state, srv_prefix_entry_value(hit), &ce) < 0) {
            core_attn_state_reset(ctx->state);
            api_core_error(ce.code, NULL, ce.msg, e);
            return -1;
        }
        srv_prefix_entry_tokens(hit, &pl->cached);
    }
    for (size_t k = 0; k < n_bounds && pl->n_snap < SRV_ENGINE_MAX_SNAPS; k++) {
        const size_t b = bounds[k];
        if (b <= pl->cached || b > n || (pl->n_snap && b <= pl->snap_at[pl->n_snap - 1]) ||
            srv_prefix_cache_find(app->prefix, toks, b))
            continue;
        /* not when a request in flight will insert it, nor when the cache
         * cannot make room for the copy */
        const uint64_t key = pending_key(toks, b);
        const size_t est = api_prefix_entry_estimate(app, (int64_t)b);
        struct api_pfx_pending *on_way = pending_find(app, key);
        if (on_way)
            on_way->wanted++; /* shared: the entry will be kept like a hit one */
        if (on_way || srv_prefix_cache_reserve(app->prefix, est) < 0)
            continue;
        if (pending_add(app, key) < 0) {
            srv_prefix_cache_release(app->prefix, est);
            continue;
        }
        pl->key[pl->n_snap] = key;
        pl->est[pl->n_snap] = est;
        pl->snap_at[pl->n_snap++] = b;
    }
    if (pl->n_snap) {
        const size_t nt = pl->snap_at[pl->n_snap - 1];
        pl->toks = malloc(nt * sizeof *pl->toks);
        if (pl->toks)
            memcpy(pl->toks, toks, nt * sizeof *pl->toks);
        else
            api_prefix_drop(app, pl); /* nothing to insert; the request runs on */
    }
    spec->n_cached = pl->cached;
    spec->snap_at = pl->snap_at;
    spec->n_snap = pl->n_snap;
    return 0;
}

/* Inserts state (owned; freed when the cache does not take it) under
 * toks[n]; 0 or the cache's error. */
static int insert_state(api_app_t *app, const int32_t *toks, size_t n, core_attn_state_t *st,
                        int pinned, srv_prefix_entry_t **out)
{
    int rc = srv_prefix_cache_insert(app->prefix, toks, n, st, api_prefix_entry_bytes(st), pinned, out);
    if (rc < 0)
        core_attn_state_free(st);
    return rc;
}

void api_prefix_harvest(api_gen_t *g, size_t ji)
{
    api_gen_job_t *j = &g->jobs[ji];
    api_prefix_plan_t *pl = &j->pfx;
    if (pl->n_snap == 0 || !srv_job_snapshots_ready(j->job))
        return;
    for (size_t k = 0; k < pl->n_snap; k++) {
        /* its reservation becomes the entry */
        srv_prefix_cache_release(g->app->prefix, pl->est[k]);
        pl->est[k] = 0;
        core_attn_state_t *st = srv_job_take_snapshot(j->job, k);
        if (!st || !g->app->prefix)
            continue;
        srv_prefix_entry_t *ent = NULL;
        int rc = insert_state(g->app, pl->toks, pl->snap_at[k], st, 0, &ent);
        const struct api_pfx_pending *p = pending_find(g->app, pl->key[k]);
        if (ent && p && p->wanted)
            srv_prefix_cache_note_reuse(g->app->prefix, ent);
        if (rc < 0 && rc != SRV_PREFIX_EEXIST && rc != SRV_PREFIX_ETOOBIG)
            SRV_LOG(SRV_LOG_WARN, g->rid, "prefix cache: %s", srv_prefix_strerror(rc));
    }
    api_prefix_drop(g->app, pl);
}

/* ---- /v1/prefixes ---- */
