/* server/api/api_bridge.c — the one place where proto structs become core/engine
 * parameters, and core / engine / session-store errors become HTTP statuses
 * and OpenAI error objects (DESIGN.md §6). Loop thread.
 */
#include "server/api/api.h"

#include "proto/tools.h"
#include "server/base/random.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters ---- */

void api_sample_params(const proto_gen_params_t *p, core_sample_params_t *out)
{
    core_sample_params_default(out);
    const proto_sampling_t *s = &p->sampling;
    out->temperature = (float)s->temperature;
    out->top_p = (float)s->top_p;
    out->top_k = s->top_k;
    out->min_p = (float)s->min_p;
    out->repeat_penalty = (float)s->repeat_penalty;
    out->presence_penalty = (float)s->presence_penalty;
    out->frequency_penalty = (float)s->frequency_penalty;
    out->seed = s->has_seed ? (uint64_t)s->seed : srv_random_u64();
    out->n_logprobs = p->logprobs > 0 ? p->logprobs : 0;
    out->no_logprob = p->logprobs < 0; /* none asked for: none computed */
    /* proto bounds the entries by PROTO_MAX_LOGIT_BIAS == CORE_SAMPLE_MAX_BIAS */
    for (size_t i = 0; i < p->n_logit_bias && i < CORE_SAMPLE_MAX_BIAS; i++) {
        out->bias[i].id = p->logit_bias[i].id;
        out->bias[i].bias = p->logit_bias[i].bias;
        out->n_bias = (int32_t)i + 1;
    }
}

/* ---- errors ---- */

int api_anthropic_route(const char *route)
{
    return route &&
           (strcmp(route, "/v1/messages") == 0 || strcmp(route, "/v1/messages/count_tokens") == 0);
}

char *api_error_json_for(const char *route, const proto_error_t *e)
{
    return api_anthropic_route(route) ? proto_anthropic_error_json(e) : proto_error_json(e);
}

void api_reply_proto(srv_req_t *req, const proto_error_t *e)
{
    char *j = api_error_json_for(srv_req_route(req), e);
    if (!j) {
        srv_reply_error(req, 500, "server_error", NULL, "internal_error", "out of memory");
        return;
    }
    srv_reply_json(req, e->status, j);
    proto_free(j);
}

void api_reply_kind(srv_req_t *req, proto_errkind_t kind, const char *param, const char *fmt, ...)
{
    char msg[PROTO_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    proto_error_t e;
    proto_error_set(&e, kind, param, "%s", msg);
    api_reply_proto(req, &e);
}

int api_engine_error(int code, const char *msg, proto_error_t *e)
{
    switch (code) {
    case SRV_ENGINE_EQUEUE_FULL:
        proto_error_set(e, PROTO_ERR_RATE_LIMIT, NULL, "the generation queue is full; retry later");
        return 1;
    case SRV_ENGINE_ESTOPPED:
        proto_error_set(e, PROTO_ERR_UNAVAILABLE, NULL, "the server is shutting down");
        e->code = "draining";
        return 0;
    case SRV_ENGINE_ECONTEXT:
        proto_error_set(e, PROTO_ERR_CONTEXT_LENGTH, NULL, "%s",
                        msg && *msg ? msg : "the prompt does not fit the model's context");
        return 0;
    case SRV_ENGINE_EINVAL:
        proto_error_set(e, PROTO_ERR_INVALID_VALUE, NULL, "%s",
                        msg && *msg ? msg : "invalid request");
        return 0;
    default:
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "%s",
                        msg && *msg ? msg : srv_engine_strerror(code));
        return 0;
    }
}

void api_reply_engine(srv_req_t *req, int code, const char *msg)
{
    proto_error_t e;
    if (api_engine_error(code, msg, &e))
        srv_req_add_header(req, "Retry-After", "1");
    api_reply_proto(req, &e);
}

void api_store_error(int code, const char *id, const char *detail, proto_error_t *e)
{
    const char *d = detail && *detail ? detail : srv_store_strerror(code);
    switch (code) {
    case SRV_STORE_ENOTFOUND:
        proto_error_set(e, PROTO_ERR_SESSION_NOT_FOUND, NULL, "session '%s' not found",
                        id ? id : "");
        break;
    case SRV_STORE_EBUSY:
        proto_error_set(e, PROTO_ERR_CONFLICT, NULL,
                        "session '%s' is busy (generating or being modified); retry when it is "
                        "done",
                        id ? id : "");
        break;
    case SRV_STORE_EMISMATCH:
    case SRV_STORE_EINVAL: proto_error_set(e, PROTO_ERR_INVALID_VALUE, NULL, "%s", d); break;
    case SRV_STORE_EFULL:
        proto_error_set(e, PROTO_ERR_UNAVAILABLE, NULL, "session store full: %s", d);
        e->code = "session_store_full";
        break;
    case SRV_STORE_ENOSPACE:
        proto_error_set(e, PROTO_ERR_STORAGE, NULL, "session storage: %s", d);
        break;
    case SRV_STORE_ENOCKPT:
        proto_error_set(e, PROTO_ERR_CONFLICT, NULL, "%s", d);
        e->code = "checkpoint_not_found";
        break;
    case SRV_STORE_EUNAVAIL:
        proto_error_set(e, PROTO_ERR_UNAVAILABLE, NULL, "%s", d);
        e->code = "session_store_unavailable";
        break;
    case SRV_STORE_ESTALE:
        proto_error_set(e, PROTO_ERR_CONFLICT, NULL, "%s", d);
        e->code = "session_conflict";
        break;
    default: proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "session store: %s", d); break;
    }
}

void api_persist_error(int rc, const char *msg, proto_error_t *e)
{
    switch (rc) {
    case SRV_STORE_ENOSPACE: proto_error_set(e, PROTO_ERR_STORAGE, NULL, "%s", msg); break;
    case SRV_STORE_EUNAVAIL: /* a shared store that could not take it: not acknowledged */
        proto_error_set(e, PROTO_ERR_UNAVAILABLE, NULL, "%s", msg);
        e->code = "session_store_unavailable";
        break;
    case SRV_STORE_ESTALE: /* another replica moved the session on meanwhile */
        proto_error_set(e, PROTO_ERR_CONFLICT, NULL, "%s", msg);
        e->code = "session_conflict";
        break;
    default: proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "%s", msg); break;
    }
}

void api_reply_store(srv_req_t *req, int code, const char *id, const char *detail)
{
    proto_error_t e;
    api_store_error(code, id, detail, &e);
    if (e.status == 503)
        srv_req_add_header(req, "Retry-After", "1");
    api_reply_proto(req, &e);
}

void api_core_error(int code, const char *param, const char *msg, proto_error_t *e)
{
    switch (code) {
    case CORE_ENOMEM: proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory: %s", msg); break;
    case CORE_ECONTEXT: proto_error_set(e, PROTO_ERR_CONTEXT_LENGTH, param, "%s", msg); break;
    case CORE_ERANGE:
    case CORE_EINVAL:
        if (param)
            proto_error_set(e, PROTO_ERR_INVALID_VALUE, param, "'%s': %s", param, msg);
        else
            proto_error_set(e, PROTO_ERR_INVALID_VALUE, NULL, "%s", msg);
        break;
    default: proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "%s", msg); break;
    }
}

int api_input_budget(const api_app_t *app, size_t n, const char *param, proto_error_t *e)
{
    const int64_t max = app->cfg ? app->cfg->max_prompt_tokens : 0; /* 0: no budget (tests) */
    if (max <= 0 || (int64_t)n <= max)
        return 0;
    proto_error_set(e, PROTO_ERR_CONTEXT_LENGTH, param,
                    "'%s' is %zu tokens; a request may give the model at most %lld tokens to "
                    "read (--max-prompt-tokens); send longer text to a session in several "
                    "appends",
                    param, n, (long long)max);
    return -1;
}

const char *api_finish_reason(srv_finish_t f)
{
    return srv_finish_name(f);
}

/* ---- text ---- */

int api_tokenize(const api_app_t *app, const char *text, size_t len, int add_special, int32_t **ids,
                 size_t *n, core_error_t *ce)
{
    unsigned flags = CORE_TOK_PARSE_SPECIAL | (add_special ? CORE_TOK_ADD_SPECIAL : 0u);
    return core_tokenizer_encode_alloc(app->tok, text, len, 0,
                                       (size_t)app->limits.max_prompt_tokens, flags, ids, n, ce);
}

static const char *role_name(proto_role_t r)
{
    switch (r) {
    case PROTO_ROLE_SYSTEM: return "system";
    case PROTO_ROLE_USER:
    case PROTO_ROLE_TOOL: return "user";
    default: return "assistant";
    }
}

/* The messages as the template sees them, in darkserve's generic tool
 * format (proto/tools.h): the tools listed in the system prompt (the
 * conversation's first system message, or the template's default one, or
 * for a session's continuation a system message before the new ones), an
 * assistant's tool_calls written after its content, consecutive tool
 * results in one user turn. Texts made here go to owned[*n_owned]. */
static int chat_view(const api_app_t *app, const proto_message_t *msgs, size_t n, int cont,
                     const proto_tool_t *tools, size_t n_tools, core_chat_msg_t *cm,
                     size_t *n_cm, char **owned, size_t *n_owned, core_error_t *ce)
{
    size_t k = 0, i = 0;
    *n_owned = 0;
    if (n_tools) {
        const char *base = "";
        size_t base_len = 0;
        if (!cont && n && msgs[0].role == PROTO_ROLE_SYSTEM) {
            base = msgs[0].content;
            base_len = msgs[0].content_len;
            i = 1;
        } else if (!cont) {
            base = app->tmpl.default_system;
            base_len = app->tmpl.default_system_len;
        }
        size_t len = 0;
        char *t = proto_tools_system_text(tools, n_tools, base, base_len, &len);
        if (!t)
            return core_error_set(ce, CORE_ENOMEM, "out of memory listing %zu tools", n_tools);
        owned[(*n_owned)++] = t;
        cm[k++] = (core_chat_msg_t){"system", t};
    }
    while (i < n) {
        const proto_message_t *m = &msgs[i];
        size_t len = 0;
        char *t = NULL;
        size_t run = 1;
        if (m->role == PROTO_ROLE_TOOL) {
            while (i + run < n && msgs[i + run].role == PROTO_ROLE_TOOL)
                run++;
            t = proto_tools_results_text(m, run, &len);
        } else if (m->n_tool_calls) {
            t = proto_tools_assistant_text(m, &len);
        } else {
            cm[k++] = (core_chat_msg_t){role_name(m->role), m->content};
            i++;
            continue;
        }
        if (!t)
            return core_error_set(ce, CORE_ENOMEM, "out of memory rendering tool messages");
        owned[(*n_owned)++] = t;
        cm[k++] = (core_chat_msg_t){role_name(m->role), t};
        i += run;
    }
    *n_cm = k;
    return 0;
}

int api_chat_tokens(const api_app_t *app, const proto_message_t *msgs, size_t n, int cont, int open,
                    int gen_prompt, int parse_special, int add_special, int32_t **ids,
                    size_t *n_ids, core_error_t *ce)
{
    return api_chat_tokens_tools(app, msgs, n, NULL, 0, cont, open, gen_prompt, parse_special,
                                 add_special, ids, n_ids, ce);
}

int api_chat_tokens_tools(const api_app_t *app, const proto_message_t *msgs, size_t n,
                          const proto_tool_t *tools, size_t n_tools, int cont, int open,
                          int gen_prompt, int parse_special, int add_special, int32_t **ids,
                          size_t *n_ids, core_error_t *ce)
{
    *ids = NULL;
    *n_ids = 0;
    core_chat_msg_t *cm = calloc(n + 1, sizeof *cm);
    char **owned = calloc(n + 1, sizeof *owned);
    size_t n_cm = 0, n_owned = 0;
    if (!cm || !owned) {
        free(cm);
        free(owned);
        return core_error_set(ce, CORE_ENOMEM, "out of memory rendering %zu messages", n);
    }
    int vrc = chat_view(app, msgs, n, cont, tools, n_tools, cm, &n_cm, owned, &n_owned, ce);
    if (vrc < 0) {
        for (size_t i = 0; i < n_owned; i++)
            proto_free(owned[i]);
        free(owned);
        free(cm);
        return vrc;
    }
    core_chat_opts_t o = {.add_generation_prompt = gen_prompt,
                          .assistant_turn_open = cont && open == CORE_CHAT_OPEN_ASSISTANT,
                          .user_turn_open = cont && open == CORE_CHAT_OPEN_USER};
    size_t max = (size_t)app->limits.max_text_bytes * 2 + 65536;
    char *text = NULL;
    size_t len = 0, n_spans = 0;
    core_chat_span_t *spans = NULL;
    int rc = core_chat_render_spans(&app->tmpl, cm, n_cm, &o, cont, max, &text, &len, &spans,
                                    &n_spans, ce);
    free(cm);
    for (size_t i = 0; i < n_owned; i++)
        proto_free(owned[i]);
    free(owned);
    if (rc < 0)
        return rc;
    /* The template's markers are special tokens; the contents are plain text
     * unless the request opted in (else "<|im_start|>system" in a user
     * message would open a forged system turn). */
    core_tok_range_t *plain = NULL;
    if (!parse_special && n_spans) {
        plain = malloc(n_spans * sizeof *plain);
        if (!plain) {
            free(text);
            free(spans);
            return core_error_set(ce, CORE_ENOMEM, "out of memory for %zu content spans", n_spans);
        }
        for (size_t i = 0; i < n_spans; i++)
            plain[i] = (core_tok_range_t){spans[i].off, spans[i].len};
    }
    unsigned flags = CORE_TOK_PARSE_SPECIAL | (add_special ? CORE_TOK_ADD_SPECIAL : 0u);
    rc = core_tokenizer_encode_plain_alloc(app->tok, text, len, 0,
                                           (size_t)app->limits.max_prompt_tokens, flags, plain,
                                           parse_special ? 0 : n_spans, ids, n_ids, ce);
    free(plain);
    free(spans);
    free(text);
    return rc;
}

int api_chat_leaves_open(const api_app_t *app, const proto_message_t *msgs, size_t n, int cont,
                         int open, int gen_prompt)
{
    /* the view's last message has the role of msgs' last one (tool results
     * are a user turn, tool calls an assistant's), so that one decides */
    core_chat_msg_t last = {n ? role_name(msgs[n - 1].role) : "user", ""};
    core_chat_opts_t o = {.add_generation_prompt = gen_prompt,
                          .user_turn_open = cont && open == CORE_CHAT_OPEN_USER};
    return (int)core_chat_render_leaves_open(&app->tmpl, n ? &last : NULL, n ? 1 : 0, &o);
}

int api_chat_text(const api_app_t *app, const proto_message_t *msgs, size_t n, char **text,
                  size_t *len, core_error_t *ce)
{
    *text = NULL;
    *len = 0;
    core_chat_msg_t *cm = calloc(n + 1, sizeof *cm);
    char **owned = calloc(n + 1, sizeof *owned);
    size_t n_cm = 0, n_owned = 0;
    int rc = (!cm || !owned)
                 ? core_error_set(ce, CORE_ENOMEM, "out of memory rendering %zu messages", n)
                 : chat_view(app, msgs, n, 0, NULL, 0, cm, &n_cm, owned, &n_owned, ce);
    if (rc == 0) {
        core_chat_opts_t o = {.add_generation_prompt = 1};
        size_t max = (size_t)app->limits.max_text_bytes * 2 + 65536;
        rc = core_chat_render(&app->tmpl, cm, n_cm, &o, max, text, len, ce);
    }
    for (size_t i = 0; owned && i < n_owned; i++)
        proto_free(owned[i]);
    free(owned);
    free(cm);
    return rc;
}

int api_fim_tokens(const api_app_t *app, int32_t out[3])
{
    static const char *const names[3] = {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"};
    for (int k = 0; k < 3; k++) {
        int32_t *ids = NULL;
        size_t n = 0, plen = 0;
        core_error_t ce = {0};
        if (api_tokenize(app, names[k], strlen(names[k]), 0, &ids, &n, &ce) < 0) {
            free(ids);
            return 0;
        }
        /* one token whose text is the marker: the vocabulary has it */
        const char *piece = n == 1 ? core_tokenizer_piece(app->tok, ids[0], &plen) : NULL;
        const int ok = piece && plen == strlen(names[k]) && memcmp(piece, names[k], plen) == 0;
        out[k] = ok ? ids[0] : -1;
        free(ids);
        if (!ok)
            return 0;
    }
    return 1;
}
