/* server/api/api_misc.c — POST /tokenize and POST /detokenize: the model's
 * tokenizer over HTTP (the same tokenization the generation endpoints use
 * for a prompt). Loop thread; the tokenizer is immutable and thread-safe.
 */
#include "server/api/api.h"

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

int api_misc_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    int rc = 0;
    rc |= srv_http_route(app->http, "POST", "/tokenize", h_tokenize, app, &json);
    rc |= srv_http_route(app->http, "POST", "/detokenize", h_detokenize, app, &json);
    return rc ? -1 : 0;
}
