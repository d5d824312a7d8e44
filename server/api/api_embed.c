/* server/api/api_embed.c — the embedding endpoints:
 *   POST /v1/embeddings              OpenAI's shape
 *   POST /embedding, /embeddings     llama.cpp's (pooling "none" answers every token)
 *   POST /api/embed, /api/embeddings Ollama's (its error shape, {"error": message})
 *
 * One engine job per input, on a fresh one-shot context, with the engine's
 * pooling (server/engine/engine.h, "Embeddings"): the input is fed through
 * the attention state in prefill chunks like any prompt, batched with the
 * other requests, and each chunk's final hidden states are folded into the
 * pool as it goes. With a linear attention kind the state and the pool are
 * of constant size, so an input of any length (up to --max-prompt-tokens)
 * is embedded whole in constant memory, never truncated.
 */
#include "server/api/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Token rows one pooling "none" answer may hold (all inputs together): each
 * is D numbers of text, so this bounds the answer (~64 MiB at D = 576). */
#define EMBED_MAX_TOKEN_ROWS 8192

typedef struct em_input {
    float *out;  /* owned [rows][D]: the engine's pool output */
    size_t rows; /* 1, or the input's tokens with pooling none */
} em_input_t;

typedef struct em_req {
    proto_embed_api_t api;
    int normalize, base64;
    size_t dim;
    char model[PROTO_MAX_NAME_BYTES + 1]; /* the name the answer gives */
    size_t n;
    em_input_t *in; /* [n] */
} em_req_t;

static void em_free(void *kd)
{
    em_req_t *r = kd;
    if (!r)
        return;
    for (size_t i = 0; r->in && i < r->n; i++)
        free(r->in[i].out);
    free(r->in);
    free(r);
}

static int ollama_api(proto_embed_api_t api)
{
    return api == PROTO_EMBED_OLLAMA || api == PROTO_EMBED_OLLAMA_V1;
}

/* Answers an error in the API's own shape. */
static void em_reply_error(srv_req_t *req, proto_embed_api_t api, const proto_error_t *e)
{
    if (!ollama_api(api)) {
        api_reply_proto(req, e);
        return;
    }
    char *j = proto_ollama_error_json(e);
    srv_reply_json(req, j ? e->status : 500, j ? j : "{\"error\":\"out of memory\"}");
    proto_free(j);
}

static void em_reply_errorf(srv_req_t *req, proto_embed_api_t api, proto_errkind_t kind,
                            const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void em_reply_errorf(srv_req_t *req, proto_embed_api_t api, proto_errkind_t kind,
                            const char *param, const char *fmt, ...)
{
    char msg[PROTO_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    proto_error_t e;
    proto_error_set(&e, kind, param, "%s", msg);
    em_reply_error(req, api, &e);
}

static void em_gen_error(api_gen_t *g, const proto_error_t *e)
{
    em_req_t *r = g->kd;
    if (!ollama_api(r->api)) {
        api_gen_reply_error(g, e);
        return;
    }
    char *j = proto_ollama_error_json(e);
    api_gen_reply_json(g, j ? e->status : 500, j ? j : "{\"error\":\"out of memory\"}");
    proto_free(j);
}

static void em_done(api_gen_t *g)
{
    em_req_t *r = g->kd;
    if (g->aborted)
        return;
    int64_t prompt_tokens = 0;
    const srv_job_result_t *bad = NULL;
    for (size_t i = 0; i < g->n_jobs; i++) {
        const srv_job_result_t *res = g->jobs[i].submitted ? srv_job_result(g->jobs[i].job) : NULL;
        if (!res) {
            continue;
        }
        prompt_tokens += res->prompt_tokens;
        if (!bad && res->finish[0] != SRV_FINISH_LENGTH)
            bad = res;
    }
    api_gen_log_done(g, NULL, prompt_tokens, 0, -1,
                     bad ? api_finish_reason(bad->finish[0]) : "length");
    if (g->cancelled)
        return;
    proto_error_t e;
    if (g->shutdown) {
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, &e);
        em_gen_error(g, &e);
        return;
    }
    if (bad) {
        if (bad->finish[0] == SRV_FINISH_ERROR)
            api_gen_job_error(g, bad, bad->error[0] ? bad->error : "embedding failed", &e);
        else
            proto_error_set(&e, PROTO_ERR_UNAVAILABLE, NULL, "the embedding did not finish (%s)",
                            api_finish_reason(bad->finish[0]));
        em_gen_error(g, &e);
        return;
    }
    const float **vecs = calloc(r->n, sizeof *vecs);
    size_t *rows = calloc(r->n, sizeof *rows);
    char *j = NULL;
    if (vecs && rows) {
        for (size_t i = 0; i < r->n; i++) {
            for (size_t t = 0; t < r->in[i].rows; t++)
                proto_embed_normalize(r->in[i].out + t * r->dim, r->dim, r->normalize);
            vecs[i] = r->in[i].out;
            rows[i] = r->in[i].rows;
        }
        proto_embed_resp_t resp = {.api = r->api,
                                   .model = r->model,
                                   .vecs = vecs,
                                   .rows = rows,
                                   .n = r->n,
                                   .dim = r->dim,
                                   .base64 = r->base64,
                                   .prompt_tokens = prompt_tokens,
                                   .total_duration_ns = srv_engine_now_ns() - g->t_start_ns};
        j = proto_embed_json(&resp);
    }
    free(vecs);
    free(rows);
    if (!j) {
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        em_gen_error(g, &e);
        return;
    }
    api_gen_reply_json(g, 200, j);
    proto_free(j);
}

static const api_gen_ops_t em_ops = {
    .event = NULL, .prepare = NULL, .done = em_done, .free = em_free};

static srv_pool_t engine_pool(proto_pooling_t p)
{
    return p == PROTO_POOL_LAST   ? SRV_POOL_LAST
           : p == PROTO_POOL_NONE ? SRV_POOL_TOKENS
                                  : SRV_POOL_MEAN;
}

static void inputs_free(int32_t **ids, size_t n)
{
    for (size_t i = 0; ids && i < n; i++)
        free(ids[i]);
    free(ids);
}

static void embed(srv_req_t *req, api_app_t *app, proto_embed_api_t api)
{
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_embed_req_t er;
    proto_error_t e;
    if (proto_embed_parse(body, len, api, &app->limits, &er, &e) < 0) {
        em_reply_error(req, api, &e);
        return;
    }
    const size_t D = (size_t)core_model_info(app->model)->n_embd;
    int32_t **ids = NULL;
    size_t *n_ids = NULL;
    em_req_t *r = NULL;
    if (ollama_api(api) && !api_model_named(app, er.model)) {
        char names[512];
        api_model_names(app, names, sizeof names);
        em_reply_errorf(req, api, PROTO_ERR_MODEL_NOT_FOUND, "model",
                        "model '%.256s' not found: this server serves %s (darkserve cannot "
                        "pull models)",
                        er.model, names);
        goto out;
    }
    if (er.dimensions && (size_t)er.dimensions != D) {
        em_reply_errorf(req, api, PROTO_ERR_UNSUPPORTED, "dimensions",
                        "'dimensions' %lld is not supported: this model's embeddings have %zu "
                        "(a causal decoder's hidden state is not trained to be cut shorter)",
                        (long long)er.dimensions, D);
        goto out;
    }
    ids = calloc(er.n_inputs, sizeof *ids);
    n_ids = calloc(er.n_inputs, sizeof *n_ids);
    if (!ids || !n_ids) {
        em_reply_errorf(req, api, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    const char *field = api == PROTO_EMBED_OLLAMA_V1 ? "prompt" : "input";
    size_t total = 0, token_rows = 0;
    for (size_t i = 0; i < er.n_inputs; i++) {
        const proto_prompt_t *p = &er.inputs[i];
        char param[40];
        snprintf(param, sizeof param, er.n_inputs > 1 ? "%s[%zu]" : "%s", field, i);
        if (p->tokens) {
            ids[i] = malloc(p->n_tokens * sizeof *ids[i]);
            if (!ids[i]) {
                em_reply_errorf(req, api, PROTO_ERR_INTERNAL, NULL, "out of memory");
                goto out;
            }
            memcpy(ids[i], p->tokens, p->n_tokens * sizeof *ids[i]);
            n_ids[i] = p->n_tokens;
        } else {
            core_error_t ce = {0};
            if (api_tokenize(app, p->text ? p->text : "", p->text_len, 1, &ids[i], &n_ids[i], &ce) <
                0) {
                api_core_error(ce.code, param, ce.msg, &e);
                em_reply_error(req, api, &e);
                goto out;
            }
        }
        /* an empty text is nothing to embed, whether or not the model
         * would read a BOS token for it (Gemma does) */
        if (n_ids[i] == 0 || (!p->tokens && p->text_len == 0)) {
            em_reply_errorf(req, api, PROTO_ERR_INVALID_VALUE, param,
                            "'%s' has no tokens: there is nothing to embed", param);
            goto out;
        }
        total += n_ids[i];
        token_rows += er.pooling == PROTO_POOL_NONE ? n_ids[i] : 1;
    }
    if (api_input_budget(app, total, field, &e) < 0) {
        em_reply_error(req, api, &e);
        goto out;
    }
    if (token_rows > EMBED_MAX_TOKEN_ROWS) {
        em_reply_errorf(req, api, PROTO_ERR_INVALID_VALUE, "pooling",
                        "'pooling': \"none\" answers one vector per token; the inputs have %zu "
                        "tokens, at most %d are answered in one request",
                        token_rows, EMBED_MAX_TOKEN_ROWS);
        goto out;
    }

    r = calloc(1, sizeof *r);
    if (r)
        r->in = calloc(er.n_inputs, sizeof *r->in);
    if (!r || !r->in) {
        em_free(r);
        em_reply_errorf(req, api, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    r->api = api;
    r->normalize = er.normalize;
    r->base64 = er.base64;
    r->dim = D;
    r->n = er.n_inputs;
    snprintf(r->model, sizeof r->model, "%s", er.model ? er.model : app->model_id);
    for (size_t i = 0; i < er.n_inputs; i++) {
        r->in[i].rows = er.pooling == PROTO_POOL_NONE ? n_ids[i] : 1;
        r->in[i].out = malloc(r->in[i].rows * D * sizeof *r->in[i].out);
        if (!r->in[i].out) {
            em_free(r);
            em_reply_errorf(req, api, PROTO_ERR_INTERNAL, NULL, "out of memory");
            goto out;
        }
    }

    api_gen_t *g = api_gen_new(app, req, &em_ops, r, er.n_inputs);
    if (!g) {
        em_reply_errorf(req, api, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    size_t need = 0;
    for (size_t i = 0; i < er.n_inputs; i++)
        need += api_state_bound(app, (int64_t)n_ids[i]);
    if (api_gen_reserve(g, need, &e) < 0) {
        api_gen_abort(g);
        if (ollama_api(api))
            em_reply_error(req, api, &e);
        else
            api_reply_admit(req, &e);
        goto out;
    }
    core_sample_params_t sp;
    core_sample_params_default(&sp);
    for (size_t i = 0; i < er.n_inputs; i++) {
        core_error_t ce = {0};
        if (api_gen_oneshot(g, i, &sp, &ce) < 0) {
            api_gen_abort(g);
            api_core_error(ce.code, NULL, ce.msg, &e);
            em_reply_error(req, api, &e);
            goto out;
        }
        srv_job_spec_t spec;
        srv_job_spec_init(&spec);
        spec.prompt = ids[i];
        spec.n_prompt = n_ids[i];
        spec.max_tokens = 0;
        spec.pool = engine_pool(er.pooling);
        spec.embed_out = r->in[i].out;
        char err[512];
        int rc = api_gen_submit(g, i, &spec, err, sizeof err);
        if (rc < 0) {
            api_gen_abort(g);
            int retry = api_engine_error(rc, err, &e);
            if (ollama_api(api) || !retry)
                em_reply_error(req, api, &e);
            else
                api_reply_engine(req, rc, err);
            goto out;
        }
    }
    api_gen_start(g, req, 0, PROTO_STREAM_SSE);
out:
    inputs_free(ids, er.n_inputs);
    free(n_ids);
    proto_embed_free(&er);
}

static void h_openai(srv_req_t *req, void *ud)
{
    embed(req, ud, PROTO_EMBED_OPENAI);
}

static void h_llama(srv_req_t *req, void *ud)
{
    embed(req, ud, PROTO_EMBED_LLAMA);
}

static void h_ollama(srv_req_t *req, void *ud)
{
    embed(req, ud, PROTO_EMBED_OLLAMA);
}

static void h_ollama_v1(srv_req_t *req, void *ud)
{
    embed(req, ud, PROTO_EMBED_OLLAMA_V1);
}

int api_embed_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    int rc = 0;
    rc |= api_route(app, "POST", "/v1/embeddings", h_openai, &json);
    rc |= api_route(app, "POST", "/embedding", h_llama, &json);
    rc |= api_route(app, "POST", "/embeddings", h_llama, &json);
    /* Ollama takes any content type, as its other routes here do */
    rc |= api_route(app, "POST", "/api/embed", h_ollama, NULL);
    rc |= api_route(app, "POST", "/api/embeddings", h_ollama_v1, NULL);
    return rc ? -1 : 0;
}
