/* server/api/api_misc.c — POST /tokenize and POST /detokenize: the model's
 * tokenizer over HTTP (the same tokenization the generation endpoints use
 * for a prompt); llama.cpp's GET /props (the model, its context, chat
 * template and defaults) and POST /apply-template (the text a chat request
 * gives the model). Loop thread; the tokenizer is immutable and
 * thread-safe.
 */
#include "server/api/api.h"

#include "server/base/version.h"

#include <stdlib.h>
#include <string.h>

static void h_tokenize(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_tokenize_req_t tr;
    proto_error_t e;
    if (proto_tokenize_parse(body, len, &app->limits, &tr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    const char **pieces = NULL;
    size_t *plens = NULL;
    core_error_t ce = {0};
    if (api_tokenize(app, tr.text, tr.text_len, tr.add_special, &ids, &n, &ce) < 0) {
        api_core_error(ce.code, "text", ce.msg, &e);
        api_reply_proto(req, &e);
        goto out;
    }
    if (tr.with_pieces) {
        pieces = calloc(n ? n : 1, sizeof *pieces);
        plens = calloc(n ? n : 1, sizeof *plens);
        if (!pieces || !plens) {
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            pieces[i] = core_tokenizer_piece(app->tok, ids[i], &plens[i]);
            if (!pieces[i]) {
                pieces[i] = "";
                plens[i] = 0;
            }
        }
    }
    char *j =
        proto_tokenize_json(ids, n, tr.with_pieces ? (const char *const *)pieces : NULL, plens);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
out:
    free(pieces);
    free(plens);
    free(ids);
    proto_tokenize_free(&tr);
}

static void h_detokenize(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_detokenize_req_t dr;
    proto_error_t e;
    proto_limits_t lim = app->limits;
    if (proto_detokenize_parse(body, len, &lim, &dr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    char *text = NULL;
    size_t need = 0;
    core_error_t ce = {0};
    /* first pass sizes the text, second fills it */
    int rc = core_tokenizer_decode(app->tok, dr.tokens, dr.n_tokens, 0, NULL, 0, &need, &ce);
    if (rc < 0 && rc != CORE_ERANGE) {
        api_core_error(ce.code, "tokens", ce.msg, &e);
        api_reply_proto(req, &e);
        goto out;
    }
    text = malloc(need + 1);
    if (!text) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    if (core_tokenizer_decode(app->tok, dr.tokens, dr.n_tokens, 0, text, need, &need, &ce) < 0) {
        api_core_error(ce.code, "tokens", ce.msg, &e);
        api_reply_proto(req, &e);
        goto out;
    }
    char *j = proto_detokenize_json(text, need);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
out:
    free(text);
    proto_detokenize_free(&dr);
}

/* A token's text, or NULL for -1 (borrowed from the tokenizer, or a copy
 * into buf[cap] so that it ends with a NUL). */
static const char *token_text(const api_app_t *app, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    const char *p = id >= 0 ? core_tokenizer_piece(app->tok, id, &len) : NULL;
    if (!p)
        return NULL;
    snprintf(buf, cap, "%.*s", (int)len, p);
    return buf;
}

static void h_props(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(app->model));
    core_gguf_str_t tt = {NULL, 0};
    int have_t =
        core_gguf_get_str(core_model_gguf(app->model), "tokenizer.chat_template", &tt, NULL) == 0;
    char bos[64], eos[64];
    int32_t fim[3];
    proto_llama_props_t p = {
        .model_alias = app->model_id,
        .model_path = app->cfg->model,
        .build_info = "darkserve " DARKSERVE_VERSION,
        .chat_template = have_t ? tt.ptr : core_chat_kind_name(app->tmpl.kind),
        .chat_template_len = have_t ? (size_t)tt.len : strlen(core_chat_kind_name(app->tmpl.kind)),
        .bos_token = token_text(app, core_tokenizer_bos(app->tok), bos, sizeof bos),
        .eos_token = token_text(app, core_tokenizer_eos(app->tok), eos, sizeof eos),
        /* exact attention: its cache; a linear kind: what one request may
         * give the model to read */
        .n_ctx = c->kind == CORE_ATTN_EXACT ? c->max_ctx : app->cfg->max_prompt_tokens,
        .n_predict = app->limits.default_max_tokens,
        .total_slots = app->cfg->max_batch,
        .infill = api_fim_tokens(app, fim)};
    char *j = proto_llama_props_json(&p);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

static void h_apply_template(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_chat_req_t cr;
    proto_error_t e;
    if (proto_chat_parse(body, len, &app->limits, &cr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    char *text = NULL;
    size_t n = 0;
    core_error_t ce = {0};
    if (cr.n_tools) {
        api_reply_kind(req, PROTO_ERR_UNSUPPORTED, "tools",
                       "'tools' are not rendered by /apply-template; it shows the messages "
                       "only");
    } else if (api_chat_text(app, cr.messages, cr.n_messages, &text, &n, &ce) < 0) {
        api_core_error(ce.code, "messages", ce.msg, &e);
        api_reply_proto(req, &e);
    } else {
        char *j = proto_prompt_json(text, n);
        if (j)
            srv_reply_json(req, 200, j);
        else
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        proto_free(j);
    }
    free(text);
    proto_chat_free(&cr);
}

int api_misc_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    int rc = 0;
    rc |= api_route(app, "POST", "/tokenize", h_tokenize, &json);
    rc |= api_route(app, "POST", "/detokenize", h_detokenize, &json);
    rc |= api_route(app, "GET", "/props", h_props, NULL);
    rc |= api_route(app, "POST", "/apply-template", h_apply_template, &json);
    return rc ? -1 : 0;
}
