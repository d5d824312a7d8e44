/* server/api/api_ollama.c — the subset of Ollama's API that tools built for
 * Ollama need (docs/API.md, "Ollama API"):
 *   POST /api/generate, POST /api/chat   NDJSON streams by default
 *   GET /api/tags, POST /api/show, GET /api/ps, GET /api/version
 *   pull, push, create, delete, copy, blobs   a clear error (501)
 * Errors have Ollama's shape, {"error": "message"}, with the status darkserve
 * gives the same fault elsewhere.
 *
 * A request runs as one engine job on a one-shot context, like a chat
 * completion. /api/generate's "context" (the token ids of the conversation
 * so far, as Ollama returns them) is read again in front of the new prompt:
 * it costs a prefill of its length, unlike a darkserve session, whose state
 * carries the conversation in constant size.
 */
#include "server/api/api.h"

#include "server/base/log.h"
#include "server/base/version.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

_Static_assert(PROTO_OLLAMA_MAX_REPEAT_LAST_N == CORE_SAMPLE_HISTORY,
               "options.repeat_last_n is bounded by the sampler's history");

#define RFC3339_LEN 64

/* ---- small helpers ---- */

static void rfc3339(int64_t sec, long nsec, char out[RFC3339_LEN])
{
    time_t t = (time_t)sec;
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, RFC3339_LEN, "%s.%09ldZ", base, nsec % 1000000000L);
}

static void now_rfc3339(char out[RFC3339_LEN])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rfc3339((int64_t)ts.tv_sec, ts.tv_nsec, out);
}

static void reply_error(srv_req_t *req, const proto_error_t *e)
{
    char *j = proto_ollama_error_json(e);
    if (!j) {
        srv_reply_json(req, 500, "{\"error\":\"out of memory\"}");
        return;
    }
    srv_reply_json(req, e->status, j);
    proto_free(j);
}

static void reply_errorf(srv_req_t *req, proto_errkind_t kind, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_errorf(srv_req_t *req, proto_errkind_t kind, int status, const char *fmt, ...)
{
    proto_error_t e;
    char msg[PROTO_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    proto_error_set(&e, kind, NULL, "%s", msg);
    if (status)
        e.status = status;
    reply_error(req, &e);
}

/* The served model answers to its id, its short name and those with
 * ":latest" (Ollama's tag), in any case, as Ollama's names are
 * (api_model_named). */
static int check_model(api_app_t *app, srv_req_t *req, const char *name)
{
    if (api_model_named(app, name))
        return 0;
    char names[512];
    api_model_names(app, names, sizeof names);
    reply_errorf(req, PROTO_ERR_MODEL_NOT_FOUND, 0,
                 "model '%.256s' not found: this server serves %s (darkserve cannot pull "
                 "models)",
                 name, names);
    return -1;
}

/* "135M", "1.7B" from a parameter count. */
static void param_size(uint64_t n, char *out, size_t len)
{
    if (n >= 1000000000u)
        snprintf(out, len, "%.1fB", (double)n / 1e9);
    else if (n >= 1000000u)
        snprintf(out, len, "%.0fM", (double)n / 1e6);
    else
        snprintf(out, len, "%.0fK", (double)n / 1e3);
}

/* llama.cpp's general.file_type names (enum llama_ftype). */
static const char *ftype_name(int64_t t)
{
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",
        [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S", [12] = "Q3_K_M",
        [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",
        [18] = "Q6_K",   [32] = "BF16"};
    if (t >= 0 && t < (int64_t)(sizeof names / sizeof names[0]) && names[t])
        return names[t];
    return "unknown";
}

typedef struct model_desc {
    proto_ollama_model_t m;
    char name[sizeof((api_app_t *)0)->model_id + 8];
    char modified[RFC3339_LEN];
    char psize[16];
} model_desc_t;

static void describe(api_app_t *app, model_desc_t *d)
{
    const core_model_info_t *info = core_model_info(app->model);
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s:latest", app->model_id);
    struct stat sb;
    int have = stat(app->cfg->model, &sb) == 0;
    rfc3339(have ? (int64_t)sb.st_mtim.tv_sec : app->created, have ? sb.st_mtim.tv_nsec : 0,
            d->modified);
    param_size(info->n_params, d->psize, sizeof d->psize);
    int64_t ft = -1;
    core_gguf_get_int(core_model_gguf(app->model), "general.file_type", &ft, NULL);
    d->m = (proto_ollama_model_t){.name = d->name,
                                  .modified_at = d->modified,
                                  .size = have ? (int64_t)sb.st_size : 0,
                                  .digest = info->fingerprint,
                                  .family = info->arch,
                                  .parameter_size = d->psize,
                                  .quantization_level = ftype_name(ft)};
}

/* ---- a generation ---- */

typedef struct ol_req {
    int chat;
    int stream;
    int logprobs;                         /* -1 none */
    int want_context;                     /* generate without raw: answer with "context" */
    char model[PROTO_MAX_NAME_BYTES + 1]; /* as the client named it (echoed) */
    int32_t *ids;                         /* owned [n_ids]: the prompt as fed (for "context") */
    size_t n_ids;
    int32_t *gen; /* owned [n_gen]: sampled tokens that are text (no end token) */
    size_t n_gen, cap_gen;
    api_acc_t acc; /* non-streamed: text, tokens for logprobs */
    srv_finish_t finish;
    int oom;
} ol_req_t;

static void ol_free(void *kd)
{
    ol_req_t *k = kd;
    if (!k)
        return;
    free(k->ids);
    free(k->gen);
    api_acc_free(&k->acc);
    free(k);
}

static void ol_keep_token(ol_req_t *k, int32_t id)
{
    if (!k->want_context || k->oom)
        return;
    if (k->n_gen == k->cap_gen) {
        size_t cap = k->cap_gen ? 2 * k->cap_gen : 64;
        int32_t *p = realloc(k->gen, cap * sizeof *p);
        if (!p) {
            k->oom = 1;
            return;
        }
        k->gen = p;
        k->cap_gen = cap;
    }
    k->gen[k->n_gen++] = id;
}

static void ol_event(api_gen_t *g, size_t ji, const srv_event_t *ev)
{
    (void)ji;
    ol_req_t *k = g->kd;
    if (ev->finish != SRV_FINISH_NONE)
        k->finish = ev->finish;
    const int tok = ev->kind == SRV_EVENT_TOKEN;
    const int eog =
        tok && ev->finish == SRV_FINISH_STOP && core_tokenizer_is_eog(g->app->tok, ev->token);
    const int with_lp = k->logprobs >= 0 && tok && !eog;
    if (tok && !eog)
        ol_keep_token(k, ev->token);
    if (!k->stream) {
        api_acc_text(&k->acc, ev->text, ev->len);
        if (with_lp)
            api_acc_token(&k->acc, ev);
        return;
    }
    if (ev->len == 0 && !with_lp)
        return;
    proto_token_logprob_t lp;
    proto_top_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS];
    if (with_lp)
        api_event_logprob(g->app->tok, ev, 0, &lp, top);
    char now[RFC3339_LEN];
    now_rfc3339(now);
    proto_ollama_resp_t r = {.chat = k->chat,
                             .model = k->model,
                             .created_at = now,
                             .text = ev->text,
                             .text_len = ev->len,
                             .with_logprobs = with_lp,
                             .logprobs = with_lp ? &lp : NULL,
                             .n_logprobs = with_lp ? 1u : 0u};
    char *j = proto_ollama_resp_json(&r);
    api_gen_write_json(g, j);
    proto_free(j);
}

static int64_t ns_of(double s)
{
    return s > 0 ? (int64_t)(s * 1e9) : 0;
}

static void ol_done(api_gen_t *g)
{
    ol_req_t *k = g->kd;
    if (g->aborted)
        return;
    const srv_job_result_t *res = g->jobs[0].submitted ? srv_job_result(g->jobs[0].job) : NULL;
    const char *job_err = NULL;
    if (res && res->finish[0] == SRV_FINISH_ERROR)
        job_err = res->error[0] ? res->error : "generation failed";
    const char *fin = api_finish_reason(k->finish);
    if (!fin)
        fin = "length";
    api_gen_log_done(g, NULL, res ? res->prompt_tokens : 0, res ? res->completion_total : 0,
                     res ? res->ttft_s : -1, fin);
    if (g->cancelled)
        return;
    proto_error_t e;
    int failed = 1;
    if (g->shutdown)
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, &e);
    else if (job_err)
        api_gen_job_error(g, res, job_err, &e);
    else if (k->oom || k->acc.oom || !res)
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
    else
        failed = 0;
    if (failed) {
        char *j = proto_ollama_error_json(&e);
        if (k->stream)
            api_gen_write_json(g, j);
        else
            api_gen_reply_json(g, e.status, j);
        proto_free(j);
        return;
    }

    /* "context": the prompt as fed, then the reply's tokens */
    int32_t *ctx = NULL;
    if (k->want_context) {
        ctx = malloc((k->n_ids + k->n_gen + 1) * sizeof *ctx);
        if (ctx) {
            if (k->n_ids)
                memcpy(ctx, k->ids, k->n_ids * sizeof *ctx);
            if (k->n_gen)
                memcpy(ctx + k->n_ids, k->gen, k->n_gen * sizeof *ctx);
        }
    }
    proto_token_logprob_t *lps = NULL;
    proto_top_logprob_t *tops = NULL;
    int lp_ok =
        k->stream || k->logprobs < 0 || api_acc_logprobs(&k->acc, g->app->tok, &lps, &tops) == 0;
    char now[RFC3339_LEN];
    now_rfc3339(now);
    proto_ollama_resp_t r = {.chat = k->chat,
                             .model = k->model,
                             .created_at = now,
                             .text = k->stream     ? ""
                                     : k->acc.text ? k->acc.text
                                                   : "",
                             .text_len = k->stream ? 0 : k->acc.len,
                             .done = 1,
                             .done_reason = fin,
                             .with_stats = 1,
                             .total_duration = srv_engine_now_ns() - g->t_start_ns,
                             .load_duration = 0,
                             .prompt_eval_count = res->prompt_tokens,
                             .prompt_eval_duration = ns_of(res->prefill_s),
                             .eval_count = res->completion_total,
                             .eval_duration = ns_of(res->decode_s),
                             .context = ctx,
                             .n_context = ctx ? k->n_ids + k->n_gen : 0,
                             .with_logprobs = !k->stream && k->logprobs >= 0,
                             .logprobs = lps,
                             .n_logprobs = !k->stream && k->logprobs >= 0 ? k->acc.n_toks : 0};
    char *j = (k->want_context && !ctx) || !lp_ok ? NULL : proto_ollama_resp_json(&r);
    int status = 200;
    if (!j) {
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        j = proto_ollama_error_json(&e);
        status = 500;
    }
    if (k->stream)
        api_gen_write_json(g, j);
    else
        api_gen_reply_json(g, status, j);
    proto_free(j);
    free(ctx);
    free(lps);
    free(tops);
}

static const api_gen_ops_t ol_ops = {.event = ol_event, .done = ol_done, .free = ol_free};

/* The "load" answer Ollama gives a request without anything to generate
 * from (empty prompt, no messages): the model is loaded, nothing else. */
static void reply_load(srv_req_t *req, const proto_ollama_req_t *r)
{
    char now[RFC3339_LEN];
    now_rfc3339(now);
    proto_ollama_resp_t o = {
        .chat = r->chat, .model = r->model, .created_at = now, .done = 1, .done_reason = "load"};
    char *j = proto_ollama_resp_json(&o);
    if (!j) {
        reply_errorf(req, PROTO_ERR_INTERNAL, 0, "out of memory");
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

/* /api/generate's system and prompt as the messages of a chat (into m[2],
 * borrowing r's strings); returns their count. */
static size_t ol_generate_messages(const proto_ollama_req_t *r, proto_message_t m[2])
{
    size_t nm = 0;
    if (r->system)
        m[nm++] = (proto_message_t){
            .role = PROTO_ROLE_SYSTEM, .content = r->system, .content_len = r->system_len};
    m[nm++] = (proto_message_t){
        .role = PROTO_ROLE_USER, .content = r->prompt, .content_len = r->prompt_len};
    return nm;
}

/* The tokens to feed: see docs/API.md ("context"). Returns 0, or answers
 * req and returns -1. */
static int ol_tokens(api_app_t *app, srv_req_t *req, const proto_ollama_req_t *r, int32_t **ids,
                     size_t *n)
{
    core_error_t ce = {0};
    proto_error_t e;
    int32_t *tail = NULL;
    size_t n_tail = 0;
    int rc;
    const char *param = r->chat ? "messages" : "prompt";
    if (r->chat) {
        rc = api_chat_tokens(app, r->messages, r->n_messages, 0, 0, 1, 0, 1, &tail, &n_tail, &ce);
    } else if (r->raw) {
        rc = api_tokenize(app, r->prompt, r->prompt_len, r->n_context == 0, &tail, &n_tail, &ce);
    } else {
        proto_message_t m[2];
        const size_t nm = ol_generate_messages(r, m);
        /* after a context (which ends inside the assistant's reply, as we
         * returned it) the template continues the conversation: it closes
         * that reply's turn and opens the new ones */
        const int cont = r->n_context > 0;
        rc = api_chat_tokens(app, m, nm, cont, cont, 1, 0, !cont, &tail, &n_tail, &ce);
    }
    if (rc < 0) {
        api_core_error(ce.code, param, ce.msg, &e);
        reply_error(req, &e);
        return -1;
    }
    size_t total = r->n_context + n_tail;
    if (api_input_budget(app, total, param, &e) < 0) {
        free(tail);
        reply_error(req, &e);
        return -1;
    }
    int32_t *all = malloc((total ? total : 1) * sizeof *all);
    if (!all) {
        free(tail);
        reply_errorf(req, PROTO_ERR_INTERNAL, 0, "out of memory");
        return -1;
    }
    if (r->n_context)
        memcpy(all, r->context, r->n_context * sizeof *all);
    if (n_tail)
        memcpy(all + r->n_context, tail, n_tail * sizeof *all);
    free(tail);
    *ids = all;
    *n = total;
    return 0;
}

/* The prefix-cache boundaries of the prompt ids[n] (api_prefix_chat_bounds),
 * the messages rendered as ol_tokens renders them: /api/chat's, or
 * /api/generate's system and prompt when it starts a conversation (no
 * context, not raw). The OpenAI route plans the same ones for the same
 * messages, so both prefill a conversation in the same pieces (and get the
 * same numbers, bit for bit) and share the cache's entries. */
static size_t ol_bounds(const api_app_t *app, const proto_ollama_req_t *r, const int32_t *ids,
                        size_t n, size_t *out)
{
    if (r->chat)
        return api_prefix_chat_bounds(app, r->messages, r->n_messages, NULL, 0, 0, ids, n, out);
    if (r->raw || r->n_context > 0)
        return 0;
    proto_message_t m[2];
    const size_t nm = ol_generate_messages(r, m);
    return api_prefix_chat_bounds(app, m, nm, NULL, 0, 0, ids, n, out);
}

static void ol_handle(srv_req_t *req, api_app_t *app, int chat)
{
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_ollama_req_t r;
    proto_error_t e;
    if (proto_ollama_parse(body, len, chat, &app->limits, &r, &e) < 0) {
        reply_error(req, &e);
        return;
    }
    if (check_model(app, req, r.model) < 0)
        goto out;
    if (r.ignored[0])
        SRV_LOG(SRV_LOG_WARN, srv_req_id(req),
                "ollama options ignored (darkserve has no use for them): %s", r.ignored);
    if (chat ? r.n_messages == 0 : r.prompt_len == 0) {
        reply_load(req, &r);
        goto out;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (ol_tokens(app, req, &r, &ids, &n) < 0)
        goto out;

    ol_req_t *k = calloc(1, sizeof *k);
    api_gen_t *g = k ? api_gen_new(app, req, &ol_ops, k, 1) : NULL;
    if (!g) {
        free(ids);
        reply_errorf(req, PROTO_ERR_INTERNAL, 0, "out of memory");
        goto out;
    }
    k->chat = chat;
    k->stream = r.p.stream;
    k->logprobs = r.p.logprobs;
    k->want_context = !chat && !r.raw;
    snprintf(k->model, sizeof k->model, "%s", r.model);
    k->ids = ids;
    k->n_ids = n;

    if (api_gen_reserve(g, api_state_bound(app, (int64_t)n + r.p.max_tokens), &e) < 0) {
        api_gen_abort(g);
        if (e.status == 429)
            srv_req_add_header(req, "Retry-After", "1");
        reply_error(req, &e);
        goto out;
    }
    if (api_gen_grammar(g, &r.p, &e) < 0) {
        api_gen_abort(g);
        reply_error(req, &e);
        goto out;
    }
    core_sample_params_t sp;
    api_sample_params(&r.p, &sp);
    sp.repeat_last_n = r.repeat_last_n;
    core_error_t ce = {0};
    if (api_gen_oneshot(g, 0, &sp, &ce) < 0) {
        api_core_error(ce.code, NULL, ce.msg, &e);
        api_gen_abort(g);
        reply_error(req, &e);
        goto out;
    }
    srv_job_spec_t spec;
    srv_job_spec_init(&spec);
    spec.prompt = ids;
    spec.n_prompt = n;
    spec.max_tokens = r.p.max_tokens;
    spec.n_choices = 1;
    spec.params = sp;
    spec.reseed = 1;
    spec.stops = (const char *const *)r.p.stop;
    spec.n_stops = r.p.n_stop;
    /* the context starts from the longest cached prefix, as on the OpenAI
     * route, and inserts the conversation's boundaries */
    size_t bounds[SRV_ENGINE_MAX_SNAPS];
    const size_t n_bounds = ol_bounds(app, &r, ids, n, bounds);
    if (api_prefix_plan(g, 0, &spec, ids, n, n ? n - 1 : 0, "", bounds, n_bounds, &e) < 0) {
        api_gen_abort(g);
        reply_error(req, &e);
        goto out;
    }
    char err[512];
    int rc = api_gen_submit(g, 0, &spec, err, sizeof err);
    if (rc < 0) {
        api_gen_abort(g);
        if (api_engine_error(rc, err, &e))
            srv_req_add_header(req, "Retry-After", "1");
        reply_error(req, &e);
        goto out;
    }
    api_gen_start(g, req, r.p.stream, PROTO_STREAM_NDJSON);
out:
    proto_ollama_free(&r);
}

static void h_generate(srv_req_t *req, void *ud)
{
    ol_handle(req, ud, 0);
}

static void h_chat(srv_req_t *req, void *ud)
{
    ol_handle(req, ud, 1);
}

/* ---- the model ---- */

static void reply_text(srv_req_t *req, char *j)
{
    if (!j) {
        reply_errorf(req, PROTO_ERR_INTERNAL, 0, "out of memory");
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

/* Every model the server runs (api_hub_app), as /api/tags (ps = 0) or
 * /api/ps lists them. */
static void list_models(srv_req_t *req, api_app_t *app, int ps)
{
    enum { MAX_LISTED = 8 };
    model_desc_t d[MAX_LISTED];
    proto_ollama_model_t m[MAX_LISTED];
    size_t n = api_hub_count(app);
    n = n < MAX_LISTED ? n : MAX_LISTED;
    for (size_t i = 0; i < n; i++) {
        const api_app_t *a = api_hub_app(app, i);
        describe(api_hub_app(app, i), &d[i]);
        m[i] = d[i].m;
        if (!ps)
            continue;
        /* loaded for the server's lifetime: Ollama's "never expires" */
        m[i].expires_at = "9999-12-31T23:59:59Z";
        const core_attn_cfg_t *c = core_attn_config(core_model_attn(a->model));
        m[i].context_length = c->kind == CORE_ATTN_EXACT ? c->max_ctx : 0;
    }
    reply_text(req, proto_ollama_models_json(m, n, ps));
}

static void h_tags(srv_req_t *req, void *ud)
{
    list_models(req, ud, 0);
}

static void h_ps(srv_req_t *req, void *ud)
{
    list_models(req, ud, 1);
}

static void h_show(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    char *name = NULL;
    proto_error_t e;
    if (proto_ollama_show_parse(body, len, &name, &e) < 0) {
        reply_error(req, &e);
        return;
    }
    int known = check_model(app, req, name) == 0;
    proto_free(name);
    if (!known)
        return;
    model_desc_t d;
    describe(app, &d);
    const core_model_info_t *info = core_model_info(app->model);
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(app->model));
    proto_ollama_info_t in = {.arch = info->arch,
                              .name = info->name,
                              .n_params = (int64_t)info->n_params,
                              .n_ctx_train = info->n_ctx_train,
                              .n_embd = info->n_embd,
                              .n_ff = info->n_ff,
                              .n_layer = info->n_layer,
                              .n_head = info->n_head,
                              .n_head_kv = info->n_head_kv,
                              .n_vocab = info->n_vocab,
                              .rope_base = info->rope_base,
                              .attention = core_attn_kind_name(c->kind),
                              .system_fingerprint = api_system_fingerprint(app)};
    const char *base = strrchr(app->cfg->model, '/');
    base = base ? base + 1 : app->cfg->model;
    char modelfile[512];
    snprintf(modelfile, sizeof modelfile,
             "# served by darkserve %s; the model is fixed when the server starts\nFROM %.400s\n",
             DARKSERVE_VERSION, base);
    core_gguf_str_t tt = {NULL, 0};
    char *tmpl = NULL;
    if (core_gguf_get_str(core_model_gguf(app->model), "tokenizer.chat_template", &tt, NULL) == 0)
        tmpl = strndup(tt.ptr, (size_t)tt.len);
    reply_text(req, proto_ollama_show_json(&d.m, &in, modelfile,
                                           tmpl ? tmpl : core_chat_kind_name(app->tmpl.kind)));
    free(tmpl);
}

static void h_version(srv_req_t *req, void *ud)
{
    (void)ud;
    srv_reply_json(req, 200, "{\"version\":\"" DARKSERVE_VERSION "\"}");
}

/* pull, push, create, delete, copy, blobs: darkserve serves the one model it
 * was started with. */
static void h_manage(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *path = srv_req_path(req);
    reply_errorf(req, PROTO_ERR_UNSUPPORTED, 501,
                 "%.64s is not supported: darkserve serves one model, '%s', chosen when it "
                 "starts (--model PATH); it does not pull, push, create, copy or delete models",
                 path, app->model_id);
}

int api_ollama_routes(api_app_t *app)
{
    int rc = 0;
    /* no SRV_ROUTE_JSON: Ollama takes any content type (`curl -d` sends a
     * form type), the body is parsed as JSON all the same */
    rc |= api_route(app, "POST", "/api/generate", h_generate, NULL);
    rc |= api_route(app, "POST", "/api/chat", h_chat, NULL);
    rc |= api_route(app, "GET", "/api/tags", h_tags, NULL);
    rc |= api_route(app, "POST", "/api/show", h_show, NULL);
    rc |= api_route(app, "GET", "/api/ps", h_ps, NULL);
    rc |= api_route(app, "GET", "/api/version", h_version, NULL);
    static const char *const manage[][2] = {
        {"POST", "/api/pull"},         {"POST", "/api/push"}, {"POST", "/api/create"},
        {"DELETE", "/api/delete"},     {"POST", "/api/copy"}, {"POST", "/api/blobs/{digest}"},
        {"GET", "/api/blobs/{digest}"}};
    for (size_t i = 0; i < sizeof manage / sizeof manage[0]; i++)
        rc |= api_route(app, manage[i][0], manage[i][1], h_manage, NULL);
    return rc ? -1 : 0;
}
