/* server/api/api_app.c — srv_darkserve_app, the application `darkserve serve` runs:
 * loads the model, tokenizer and chat template, starts the engine and the
 * session store, registers the REST routes; on drain stops admitting work,
 * on stop finishes what is left and saves sessions.
 *
 * Shutdown (daemon.c drives it): SIGTERM -> drain(): the engine refuses new
 * jobs, running generations go on; shortly before --drain-timeout ends, a
 * timer cancels the generations still running so each stream ends with a
 * final error event ("server is shutting down") instead of being cut by the
 * server's hard cancel. Then stop(): the engine stops, the remaining events
 * are delivered, every session is flushed to disk.
 */
#include "server/api/api.h"

#include "core/gguf.h"
#include "core/kernels/qdot.h"
#include "server/attn_select.h"
#include "server/base/log.h"
#include "server/store/store_backend.h"
#include "server/ui/ui.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SWEEP_MS 10000

static void app_handle_closed(uv_handle_t *h)
{
    api_app_t *app = h->data;
    if (--app->handles_open == 0) {
        api_hub_app_gone(app);
        free(app->key_owner);
        free(app);
    }
}

/* ---- engine -> loop ---- */

static void on_wake(uv_async_t *a)
{
    api_io_pump(a->data);
    api_gen_pump_ready(a->data);
}

/* The sweep writes and deletes files: on the I/O thread, one at a time. */
typedef struct sweep_io {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    int rc;
    char err[256];
} sweep_io_t;

static void sweep_work(api_io_t *io)
{
    sweep_io_t *w = (sweep_io_t *)io;
    w->rc = srv_store_sweep(w->app->store, (int64_t)time(NULL), w->err, sizeof w->err);
}

static void sweep_done(api_io_t *io)
{
    sweep_io_t *w = (sweep_io_t *)io;
    if (w->rc < 0)
        SRV_LOG(SRV_LOG_WARN, NULL, "session sweep: %s (%s)", srv_store_strerror(w->rc),
                w->err);
    w->app->sweeping = 0;
    free(w);
}

static void on_sweep(uv_timer_t *t)
{
    api_app_t *app = t->data;
    if (app->sweeping || app->stopping)
        return;
    sweep_io_t *w = calloc(1, sizeof *w);
    if (!w)
        return;
    w->io.work = sweep_work;
    w->io.done = sweep_done;
    w->app = app;
    app->sweeping = 1;
    api_io_submit(app, &w->io);
}

/* The loop thread never writes or deletes a session file to make room
 * (srv_store_no_io_here): what it leaves is done here, on the I/O thread,
 * checked once per loop turn. */
static void settle_work(api_io_t *io)
{
    sweep_io_t *w = (sweep_io_t *)io;
    w->rc = srv_store_settle(w->app->store, w->err, sizeof w->err);
}

static void settle_done(api_io_t *io)
{
    sweep_io_t *w = (sweep_io_t *)io;
    if (w->rc < 0)
        SRV_LOG(SRV_LOG_WARN, NULL, "moving sessions to disk: %s (%s)",
                srv_store_strerror(w->rc), w->err);
    w->app->settling = 0;
    free(w);
}

static void on_settle_check(uv_prepare_t *p)
{
    api_app_t *app = p->data;
    if (app->settling || app->stopping || !app->io_running || !app->store ||
        !srv_store_needs_settle(app->store))
        return;
    sweep_io_t *w = calloc(1, sizeof *w);
    if (!w)
        return;
    w->io.work = settle_work;
    w->io.done = settle_done;
    w->app = app;
    app->settling = 1;
    api_io_submit(app, &w->io);
}

static void on_drain_deadline(uv_timer_t *t)
{
    api_app_t *app = t->data;
    int n = 0;
    for (api_gen_t *g = app->live; g; g = g->live_next)
        n += !g->finished;
    if (n)
        SRV_LOG(SRV_LOG_WARN, NULL, "drain: ending %d generation(s) still running", n);
    api_gen_cancel_all(app, 1);
}

/* ---- /health, /metrics ---- */

/* Sessions of every model (api_hub_app). */
static void session_counts(api_app_t *app, size_t *mem, size_t *disk, size_t *bytes)
{
    *mem = *disk = *bytes = 0;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        size_t m = 0, d = 0, b = 0;
        if (a->store)
            srv_store_stats(a->store, &m, &d, &b);
        *mem += m;
        *disk += d > m ? d : m;
        *bytes += b;
    }
}

/* Ready when every model is. */
static int all_ready(api_app_t *app)
{
    for (size_t i = 0; i < api_hub_count(app); i++)
        if (!api_hub_app(app, i)->ready)
            return 0;
    return 1;
}

static void h_health(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const int draining = app->draining || srv_http_draining(srv_req_server(req));
    const int ready = all_ready(app);
    const char *names[8];
    size_t n_models = api_hub_count(app) < 8 ? api_hub_count(app) : 8;
    for (size_t i = 0; i < n_models; i++)
        names[i] = api_hub_app(app, i)->model_id;
    proto_health_t h = {.status = draining ? "draining"
                                  : ready  ? "ok"
                                           : "loading",
                        .model = ready ? app->model_id : NULL,
                        .models = names,
                        .n_models = ready ? n_models : 0};
    /* a shared session store that cannot be reached: "degraded", still 200
     * (this replica serves everything that needs no session; 503 is for a
     * replica that can take no traffic: loading, draining) */
    char why[512];
    if (!draining && ready && app->store && srv_store_health(app->store, why, sizeof why) < 0) {
        h.status = "degraded";
        h.reason = why;
    }
    size_t mem, disk, bytes;
    session_counts(app, &mem, &disk, &bytes);
    h.sessions = (int64_t)disk;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        if (!a->engine)
            continue;
        srv_engine_stats_t st;
        srv_engine_stats(a->engine, &st);
        h.queue_depth += st.queue_depth + st.running_jobs;
    }
    h.uptime_s = (double)(srv_engine_now_ns() - app->t_start_ns) / 1e9;
    char *j = proto_health_json(&h);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply_json(req, draining || !ready ? 503 : 200, j);
    proto_free(j);
}

/* Gauges that are read at scrape time rather than updated on every change;
 * with several models, app is the first and its series (shared by every
 * model's app: srv_metrics_share) get the sums over all of them. */
static void refresh_metrics(api_app_t *app)
{
    size_t mem, disk, bytes;
    session_counts(app, &mem, &disk, &bytes);
    srv_series_set(app->m_sess_mem, (double)mem);
    srv_series_set(app->m_sess_disk, (double)disk);
    srv_series_set(app->m_sess_bytes, (double)bytes);
    size_t dbytes_all = 0;
    int64_t queue = 0, running = 0;
    int any_engine = 0;
    for (size_t i = 0; i < api_hub_count(app); i++) {
        api_app_t *a = api_hub_app(app, i);
        api_prefix_refresh_metrics(a);
        if (a->store) {
            size_t dbytes = 0;
            uint64_t evicted = 0;
            srv_store_disk_stats(a->store, &dbytes, &evicted);
            dbytes_all += dbytes;
            if (evicted > a->disk_evicted_seen) {
                srv_series_add(a->m_sess_evicted, (double)(evicted - a->disk_evicted_seen));
                a->disk_evicted_seen = evicted;
            }
        }
        if (!a->engine || !a->m_batch_steps)
            continue;
        srv_engine_stats_t st;
        srv_engine_stats(a->engine, &st);
        queue += st.queue_depth;
        running += st.running_seqs;
        any_engine = 1;
        for (int b = 1; b <= SRV_ENGINE_MAX_BATCH; b++) {
            if (st.batch_hist[b] == a->batch_seen[b])
                continue;
            char lbl[16];
            snprintf(lbl, sizeof lbl, "%d", b);
            srv_metric_add(a->m_batch_steps, (const char *[]){lbl},
                           (double)(st.batch_hist[b] - a->batch_seen[b]));
            a->batch_seen[b] = st.batch_hist[b];
        }
    }
    if (app->store)
        srv_series_set(app->m_sess_disk_bytes, (double)dbytes_all);
    if (app->hub && any_engine) {
        /* each engine sets these on its own changes: the sum of them all */
        srv_series_set(srv_metric_series(srv_metrics_gauge(app->metrics,
                                                           "darkserve_engine_queue_depth",
                                                           "Jobs waiting to run", NULL),
                                         NULL),
                       (double)queue);
        srv_series_set(srv_metric_series(srv_metrics_gauge(app->metrics,
                                                           "darkserve_engine_running_sequences",
                                                           "Sequence slots in use", NULL),
                                         NULL),
                       (double)running);
    }
}

static void h_metrics(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    refresh_metrics(app);
    size_t len = 0;
    char *text = srv_metrics_render(app->metrics, &len);
    if (!text) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply(req, 200, SRV_METRICS_CONTENT_TYPE, text, len);
    free(text);
}

static void register_metrics(api_app_t *app)
{
    srv_metrics_t *m = app->metrics;
    if (!m)
        return;
    srv_metric_t *sess = srv_metrics_gauge(m, "darkserve_sessions", "Sessions held, by place",
                                           (const char *[]){"where", NULL});
    app->m_sess_mem = srv_metric_series(sess, (const char *[]){"memory"});
    app->m_sess_disk = srv_metric_series(sess, (const char *[]){"disk"});
    app->m_sess_bytes =
        srv_metric_series(srv_metrics_gauge(m, "darkserve_session_state_bytes",
                                            "Bytes of session state held in memory", NULL),
                          NULL);
    app->m_sess_disk_bytes =
        srv_metric_series(srv_metrics_gauge(m, "darkserve_session_disk_bytes",
                                            "Bytes of session files in --session-dir", NULL),
                          NULL);
    app->m_sess_evicted = srv_metric_series(
        srv_metrics_counter(m, "darkserve_session_disk_evictions_total",
                            "Sessions deleted to keep --session-dir within --max-session-disk "
                            "and --max-session-files",
                            NULL),
        NULL);
    app->m_persist_err = srv_metric_series(
        srv_metrics_counter(m, "darkserve_session_persist_errors_total",
                            "Session saves that failed (the previous saved state was kept)", NULL),
        NULL);
    app->m_batch_steps =
        srv_metrics_counter(m, "darkserve_engine_steps_by_batch_total",
                            "Batched forwards by the exact number of sequences in them",
                            (const char *[]){"sequences", NULL});
    api_prefix_register_metrics(app);
}

/* ---- start ---- */

/* The served model's id: the file name without ".gguf" (what operators
 * recognise; GGUF general.name is often a training-run label). */
static void model_name(api_app_t *app)
{
    const char *base = strrchr(app->cfg->model, '/');
    base = base ? base + 1 : app->cfg->model;
    snprintf(app->model_id, sizeof app->model_id, "%s", base);
    size_t n = strlen(app->model_id);
    if (n > 5 && strcmp(app->model_id + n - 5, ".gguf") == 0)
        app->model_id[n - 5] = '\0';
    const char *alias = srv_known_model_name(app->cfg->model);
    snprintf(app->model_alias, sizeof app->model_alias, "%s", alias ? alias : "");
}

/* Attention: --attn auto picks DARKFormer with the model's adapter, else a
 * training-free fallback (which it says); numbers: flags win, then the
 * adapter's values, then defaults (server/attn_select.h). */
static int model_opts(const srv_config_t *cfg, srv_attn_choice_t *ch)
{
    srv_attn_request_t rq = {.kind = cfg->attn, .adapter = cfg->adapter,
                             .n_features = cfg->features > 0 ? (int)cfg->features : 0,
                             .window = cfg->window >= 0 ? (int)cfg->window : -1,
                             .sinks = (int)cfg->sinks, .memory = (int)cfg->memory,
                             .kv_bits = (int)cfg->kv_bits,
                             .memory_keep = cfg->memory_keep, .memory_heads = cfg->memory_heads,
                             .prerope = -1,
                             .decay_off = cfg->decay == 0, .linear = -1};
    core_error_t ce = {0};
    if (srv_attn_select(cfg->model, &rq, ch, &ce) < 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "attention for %s: %s", cfg->model, ce.msg);
        return -1;
    }
    if (ch->fallback)
        SRV_LOG(SRV_LOG_WARN, NULL, "%s", ch->note);
    else if (ch->discovered)
        SRV_LOG(SRV_LOG_INFO, NULL, "--attn auto: DARKFormer with the adapter found beside the "
                "model, %s", ch->adapter);
    return 0;
}

static int load(api_app_t *app)
{
    const srv_config_t *cfg = app->cfg;
    core_error_t ce = {0};
    srv_attn_choice_t *ch = malloc(sizeof *ch); /* a few KiB: off the threadpool's stack */
    if (!ch) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
        return -1;
    }
    if (model_opts(cfg, ch) < 0) {
        free(ch);
        return -1;
    }
    ch->mo.n_threads = (int)cfg->threads;
    ch->mo.prompt_int8 = cfg->prompt_precision == SRV_PRECISION_INT8;
    ch->mo.prompt_f32 = cfg->prompt_precision == SRV_PRECISION_F32;
    const core_model_opts_t *mo = &ch->mo;
    int64_t t0 = srv_engine_now_ns();
    int rc = core_model_load(cfg->model, mo, &app->model, &ce);
    if (rc < 0) {
        const int linear = mo->attn_kind != CORE_ATTN_EXACT;
        if (linear && !mo->adapter_path && strstr(ce.msg, "adapter"))
            SRV_LOG(SRV_LOG_ERROR, NULL,
                    "cannot load %s with --attn %s: no adapter given (%s). Pass --adapter "
                    "PATH (a DARKFormer adapter GGUF for this model), or use --attn exact or "
                    "--attn performer, which need none",
                    cfg->model, core_attn_kind_name(mo->attn_kind), ce.msg);
        else if (rc == CORE_EMISMATCH && ch->discovered)
            SRV_LOG(SRV_LOG_ERROR, NULL,
                    "cannot load the model %s: %s (found beside the model by --attn auto; pass "
                    "--adapter PATH or --attn KIND)",
                    cfg->model, ce.msg);
        else
            SRV_LOG(SRV_LOG_ERROR, NULL, "cannot load the model %s: %s%s", cfg->model, ce.msg,
                    app->hub ? " (with several --model, the attention flags apply to every "
                               "model; --attn auto picks each model's own)"
                             : "");
        free(ch);
        return -1;
    }
    char attn_desc[CORE_MODEL_PATH_MAX + 256];
    srv_attn_describe(core_attn_config(core_model_attn(app->model)), ch->adapter, attn_desc,
                      sizeof attn_desc);
    free(ch);
    if (core_tokenizer_from_gguf(core_model_gguf(app->model), &app->tok, &ce) < 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "tokenizer of %s: %s", cfg->model, ce.msg);
        return -1;
    }
    core_gguf_str_t tt = {NULL, 0};
    char *tmpl_text = NULL;
    if (core_gguf_get_str(core_model_gguf(app->model), "tokenizer.chat_template", &tt, NULL) == 0) {
        tmpl_text = strndup(tt.ptr, (size_t)tt.len);
        if (!tmpl_text) {
            SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
            return -1;
        }
    }
    /* A Gemma 3 GGUF without a template (the base model) is prompted in
     * Gemma's turn format: what its instruction-tuned siblings were trained
     * on, not something the base model was taught */
    const char *tmpl_name = cfg->chat_template[0] ? cfg->chat_template : NULL;
    const int gemma_turns =
        !tmpl_name && !tmpl_text && strcmp(core_model_info(app->model)->arch, "gemma3") == 0;
    rc = core_chat_tmpl_init(gemma_turns ? "gemma" : tmpl_name, tmpl_text, &app->tmpl, &ce);
    free(tmpl_text);
    if (rc < 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "--chat-template: %s", ce.msg);
        return -1;
    }
    if (gemma_turns)
        SRV_LOG(SRV_LOG_INFO, NULL,
                "the model has no chat template: chat uses Gemma's turn format (a base model "
                "prompted in that format; --chat-template chooses another)");
    if (app->tmpl.fallback)
        SRV_LOG(SRV_LOG_WARN, NULL,
                "the model's chat template is not one darkserve knows; using ChatML (set "
                "--chat-template to choose)");
    model_name(app);
    const core_model_info_t *info = core_model_info(app->model);
    SRV_LOG(SRV_LOG_INFO, NULL,
            "model %s (%s, %d layers, %" PRIu64 " parameters, fingerprint %s) loaded in %.2fs; "
            "attention %s; chat template %s",
            app->model_id, info->arch, info->n_layer, info->n_params, info->fingerprint,
            (double)(srv_engine_now_ns() - t0) / 1e9, attn_desc,
            core_chat_kind_name(app->tmpl.kind));
    if (core_q8_amx_available())
        SRV_LOG(SRV_LOG_INFO, NULL,
                "batches of %d or more 8-bit rows on Intel AMX tiles (the vector kernels' bits)",
                CORE_Q8_AMX_MIN_ROWS);
    int warn = 0;
    const char *rows = srv_prompt_rows_note(
        app->model, app->cfg->prompt_precision == SRV_PRECISION_INT8, &warn);
    if (rows)
        SRV_LOG(warn ? SRV_LOG_WARN : SRV_LOG_INFO, NULL, "%s", rows);
    return 0;
}

static void app_free_parts(api_app_t *app)
{
    srv_engine_free(app->engine);
    app->engine = NULL;
    api_prefix_free(app);
    api_responses_free(app);
    srv_store_free(app->store);
    app->store = NULL;
    core_tokenizer_free(app->tok);
    app->tok = NULL;
    core_model_free(app->model);
    app->model = NULL;
}

static void app_close_handles(api_app_t *app)
{
    uv_close((uv_handle_t *)&app->wake, app_handle_closed);
    uv_close((uv_handle_t *)&app->sweep_timer, app_handle_closed);
    uv_close((uv_handle_t *)&app->settle_check, app_handle_closed);
    uv_close((uv_handle_t *)&app->drain_timer, app_handle_closed);
}

/* Threadpool: the slow part (reading and dequantizing the model). Touches
 * only what load() fills; the loop thread does not read those until
 * load_after. */
static void load_work(uv_work_t *w)
{
    api_app_t *app = w->data;
    app->load_rc = load(app);
}

/* Loop thread, after load_work: engine, session store, then ready. */
static void load_after(uv_work_t *w, int status)
{
    api_app_t *app = w->data;
    char err[512];
    app->loading = 0;
    if (app->stop_pending) { /* stop() ran meanwhile and left the cleanup to us */
        app_free_parts(app);
        app_close_handles(app);
        return;
    }
    if (status != 0 || app->load_rc < 0) {
        srv_serve_fail(app->serve, "cannot load the model (see above)");
        return;
    }
    const srv_config_t *cfg = app->cfg;
    app->limits.max_tokens_limit = cfg->max_tokens_limit;
    app->limits.default_max_tokens = PROTO_DEFAULT_MAX_TOKENS;
    app->limits.n_vocab = core_tokenizer_n_vocab(app->tok);
    app->limits.max_prompt_tokens = PROTO_DEFAULT_MAX_PROMPT_TOKENS;
    app->limits.max_text_bytes = PROTO_DEFAULT_MAX_TEXT_BYTES;
    srv_engine_opts_t eo = {
        .max_batch = (int)cfg->max_batch,
        .prefill_chunk = (int)cfg->prefill_chunk,
        .max_input = (size_t)cfg->max_prompt_tokens, /* the prefill budget, per job */
        .max_queue = (int)cfg->max_queue,
        .metrics = app->metrics,
    };
    if (srv_engine_new(app->model, app->tok, &eo, &app->engine, err, sizeof err) < 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "engine: %s", err);
        srv_serve_fail(app->serve, "cannot start the engine");
        return;
    }
    /* the state budget: sessions in memory never take more than it alone */
    app->state_budget = (size_t)cfg->max_state_memory;
    size_t sess_bytes = (size_t)cfg->max_session_bytes;
    if (app->state_budget && app->state_budget < sess_bytes)
        sess_bytes = app->state_budget;
    {
        core_attn_state_t *st0 = NULL;
        core_error_t ce = {0};
        if (core_attn_state_new(core_model_attn(app->model), &st0, &ce) < 0) {
            SRV_LOG(SRV_LOG_ERROR, NULL, "attention state: %s", ce.msg);
            srv_serve_fail(app->serve, "cannot make an attention state");
            return;
        }
        app->state_fixed_bytes = core_attn_state_bytes(st0);
        core_attn_state_free(st0);
    }
    if (api_prefix_init(app) < 0) {
        srv_serve_fail(app->serve, "cannot make the prefix cache");
        return;
    }
    srv_store_backend_t *be = NULL;
    if (cfg->session_store[0]) {
        char ns[64];
        srv_store_redis_namespace(core_model_info(app->model)->fingerprint, ns, sizeof ns);
        srv_store_redis_opts_t ro = {.url = cfg->session_store, .ns = ns,
                                     .ttl_ms = cfg->session_ttl_s * 1000};
        if (srv_store_redis_new(&ro, &be, err, sizeof err) < 0) {
            SRV_LOG(SRV_LOG_ERROR, NULL, "--session-store: %s", err);
            srv_serve_fail(app->serve, "cannot open the session store");
            return;
        }
        char shown[512];
        srv_store_redis_url_redact(cfg->session_store, shown, sizeof shown);
        SRV_LOG(SRV_LOG_INFO, NULL, "sessions in %s (keys %s*), shared with the replicas that use "
                "it; no checkpoints", shown, ns);
    }
    srv_store_opts_t so = {
        .backend = be, /* the store owns it from here on */
        .dir = cfg->session_dir,
        .max_sessions = (size_t)cfg->max_sessions,
        .max_bytes = sess_bytes,
        .max_disk_files = (size_t)cfg->max_session_files,
        .max_disk_bytes = (size_t)cfg->max_session_disk,
        .ttl_s = cfg->session_ttl_s,
        .max_checkpoints = (size_t)cfg->checkpoints,
        .model = app->model,
        .fingerprint = core_model_info(app->model)->fingerprint,
    };
    if (srv_store_new(&so, &app->store, err, sizeof err) < 0) {
        if (be)
            SRV_LOG(SRV_LOG_ERROR, NULL, "--session-store: %s", err);
        else
            SRV_LOG(SRV_LOG_ERROR, NULL, "--session-dir %s: %s", cfg->session_dir, err);
        srv_serve_fail(app->serve, "cannot open the session store");
        return;
    }
    api_store_fault_install(app->store);
    /* an imported state is at most the largest blob this model can make,
     * with its checkpoints: from now on the http layer refuses a larger PUT
     * from its Content-Length, and never buffers more of a chunked one */
    app->state_blob_max = srv_store_max_export(app->store) + 4096;
    if (!app->hub && srv_http_route_set_max_body(app->http, "PUT", "/v1/sessions/{id}/state",
                                                 app->state_blob_max) < 0) {
        srv_serve_fail(app->serve, "cannot bound the state import route");
        return;
    }
    if (api_io_start(app) < 0) {
        srv_serve_fail(app->serve, "cannot start the session I/O thread");
        return;
    }
    uv_timer_start(&app->sweep_timer, on_sweep, SWEEP_MS, SWEEP_MS);
    /* from now on this thread leaves the store's disk work to the I/O thread */
    srv_store_no_io_here(app->store);
    uv_prepare_start(&app->settle_check, on_settle_check);
    app->ready = 1;
    api_hub_ready(app);
}

/* Routes answer from the start (503 "loading" until the model is in, /health
 * says "loading"); the model loads on libuv's threadpool, so probes and
 * clients get an answer instead of waiting in the listen backlog. */
int api_app_start(const srv_serve_ctx_t *ctx, const srv_config_t *cfg, api_hub_t *hub,
                  api_app_t **out)
{
    api_app_t *app = calloc(1, sizeof *app);
    if (!app) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
        return -1;
    }
    app->cfg = cfg;
    app->hub = hub;
    app->loop = ctx->loop;
    app->http = ctx->http;
    app->metrics = ctx->metrics;
    app->serve = ctx->serve;
    app->created = (int64_t)time(NULL);
    app->t_start_ns = srv_engine_now_ns();
    app->gen_timeout_ns = cfg->generation_timeout_s * INT64_C(1000000000);
    if (api_owner_tags_init(app) < 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "out of memory");
        free(app->key_owner);
        free(app);
        return -1;
    }
    pthread_mutex_init(&app->mu, NULL);
    register_metrics(app);
    /* The http layer's limit for PUT .../state until the model is known
     * (requests get 503 "loading" from their headers until then);
     * load_after replaces it by the model's bound (state_blob_max). */
    app->state_max_body = (size_t)cfg->max_body;

    /* routes: registered before serve's built-in /health and /metrics, so
     * these replace them */
    srv_route_opts_t health = {.flags = SRV_ROUTE_PUBLIC | SRV_ROUTE_DRAIN_OK};
    srv_route_opts_t metrics = {.flags = SRV_ROUTE_DRAIN_OK};
    if (api_route(app, "GET", "/health", h_health, &health) < 0 ||
        api_route(app, "GET", "/metrics", h_metrics, &metrics) < 0 ||
        api_openai_routes(app) < 0 || api_responses_routes(app) < 0 ||
        api_sessions_routes(app) < 0 || api_misc_routes(app) < 0 || api_embed_routes(app) < 0 ||
        api_ollama_routes(app) < 0 || api_prefix_routes(app) < 0 ||
        (cfg->ui && srv_ui_routes(app->http) < 0)) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "cannot register the routes");
        pthread_mutex_destroy(&app->mu);
        free(app->key_owner);
        free(app);
        return -1;
    }
    srv_http_set_ready(app->http, 0);
    uv_async_init(app->loop, &app->wake, on_wake);
    uv_timer_init(app->loop, &app->sweep_timer);
    uv_prepare_init(app->loop, &app->settle_check);
    app->settle_check.data = app;
    uv_timer_init(app->loop, &app->drain_timer);
    app->wake.data = app->sweep_timer.data = app->drain_timer.data = app;
    app->handles_open = 4;
    app->load_req.data = app;
    app->loading = 1;
    if (uv_queue_work(app->loop, &app->load_req, load_work, load_after) != 0) {
        SRV_LOG(SRV_LOG_ERROR, NULL, "cannot start loading the model");
        app->loading = 0;
        app_close_handles(app);
        return -1;
    }
    *out = app;
    return 0;
}

/* ---- drain, stop ---- */

void api_app_drain(api_app_t *app)
{
    app->draining = 1;
    if (app->engine)
        srv_engine_drain(app->engine);
    /* end running generations a little before serve's hard cut, so their
     * streams close with a final event */
    uint64_t ms = (uint64_t)app->cfg->drain_timeout_s * 1000u;
    uint64_t margin = ms / 10 < 1000 ? ms / 10 : 1000;
    uv_timer_start(&app->drain_timer, on_drain_deadline, ms - margin, 0);
}

void api_app_stop(api_app_t *app)
{
    app->stopping = 1;
    if (app->loading) { /* the threadpool still reads the model: load_after cleans up */
        app->stop_pending = 1;
        uv_timer_stop(&app->drain_timer);
        return;
    }
    uv_timer_stop(&app->sweep_timer);
    uv_prepare_stop(&app->settle_check);
    uv_timer_stop(&app->drain_timer);
    /* the store's queued work finishes (and is answered) before anything
     * goes; from now on store work runs inline */
    api_io_stop(app);
    api_gen_cancel_all(app, 1);
    if (app->engine)
        srv_engine_stop(app->engine, srv_engine_now_ns());
    /* every on_done has run: finish every request, release sessions */
    api_gen_shutdown(app);
    int rc = app->store ? srv_store_flush(app->store, NULL, 0) : 0;
    if (rc < 0)
        SRV_LOG(SRV_LOG_ERROR, NULL, "saving sessions at shutdown: %s", srv_store_strerror(rc));
    else
        SRV_LOG(SRV_LOG_INFO, NULL, "sessions saved");
    app_free_parts(app);
    app->ready = 0;
    app_close_handles(app);
}

/* One model: its app is the application. Several: one app per model behind
 * the hub (api_hub.c); the first app is the state the hooks get. */
static int app_start(const srv_serve_ctx_t *ctx, void **state)
{
    *state = NULL;
    const srv_config_t *cfg = ctx->cfg;
    if (cfg->models.n <= 1) {
        api_app_t *app = NULL;
        if (api_app_start(ctx, cfg, NULL, &app) < 0)
            return -1;
        *state = app;
        return 0;
    }
    api_hub_t *hub = api_hub_new(ctx, api_responses_has);
    if (!hub)
        return -1;
    api_app_t *apps[API_HUB_MAX_MODELS] = {NULL};
    for (size_t i = 0; i < cfg->models.n; i++) {
        if (api_app_start(ctx, api_hub_cfg(hub, i), hub, &apps[i]) < 0) {
            /* the apps already started load in the background: stop them */
            for (size_t j = 0; j < i; j++)
                api_app_stop(apps[j]);
            api_hub_abandon(hub);
            return -1;
        }
        api_hub_add(hub, i, apps[i]);
    }
    SRV_LOG(SRV_LOG_INFO, NULL, "serving %zu models; requests without \"model\" go to %s",
            cfg->models.n, cfg->models.v[0]);
    *state = apps[0];
    return 0;
}

/* Each model's app drains, or stops, in turn. */
static void app_drain(void *state)
{
    api_app_t *first = state;
    for (size_t i = 0; i < api_hub_count(first); i++)
        api_app_drain(api_hub_app(first, i));
}

static void app_stop(void *state)
{
    api_app_t *first = state;
    /* the hub may go with the last app's handles: take the list first */
    const size_t n = api_hub_count(first);
    api_app_t *apps[API_HUB_MAX_MODELS] = {NULL};
    for (size_t i = 0; i < n && i < API_HUB_MAX_MODELS; i++)
        apps[i] = api_hub_app(first, i);
    for (size_t i = 0; i < n && i < API_HUB_MAX_MODELS; i++)
        api_app_stop(apps[i]);
}

const srv_app_t srv_darkserve_app = {.start = app_start, .drain = app_drain, .stop = app_stop};
