/* proto/request.c — POST /v1/completions and POST /v1/chat/completions. */
#include <string.h>

#include "proto/proto_impl.h"

/* ---------------------------------------------------------- completions */

static const char prompt_shape[] = "'prompt' must be a string, an array of strings, an array "
                                   "of token ids or an array of arrays of token ids";

void proto_completion_free(proto_completion_req_t *r)
{
    if (!r)
        return;
    px_gen_params_free(&r->p);
    if (r->prompts) {
        for (size_t i = 0; i < r->n_prompts; i++) {
            px_free(r->prompts[i].text);
            px_free(r->prompts[i].tokens);
        }
        px_free(r->prompts);
    }
    memset(r, 0, sizeof *r);
}

static int prompt_text(json_t *s, const char *param, int64_t *left, proto_prompt_t *p,
                       proto_error_t *err)
{
    size_t n = json_string_length(s);
    if ((int64_t)n > *left)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' is too long: prompts may total at most %lld bytes", param,
                               (long long)*left);
    *left -= (int64_t)n;
    p->text = px_strndup(json_string_value(s), n);
    if (!p->text)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    p->text_len = n;
    return 0;
}

int px_parse_prompt(json_t *root, const proto_limits_t *lim, proto_completion_req_t *r,
                    proto_error_t *err)
{
    json_t *v = px_get(root, "prompt");
    int64_t left = lim->max_text_bytes;
    if (!v)
        return proto_error_set(err, PROTO_ERR_MISSING, "prompt", "'prompt' is required");
    if (!json_is_string(v) && !json_is_array(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt", prompt_shape);
    size_t count = json_is_array(v) ? json_array_size(v) : 1;
    if (count == 0)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt",
                               "'prompt' must not be an empty array");
    json_t *first = json_is_array(v) ? json_array_get(v, 0) : v;
    /* A flat array of integers is one tokenized prompt. */
    int flat_ids = json_is_array(v) && json_is_integer(first);
    size_t n_prompts = flat_ids ? 1 : count;
    if (json_is_array(v) && !flat_ids && !json_is_string(first) && !json_is_array(first))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt", prompt_shape);
    if (n_prompts > PROTO_MAX_PROMPTS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt",
                               "'prompt' has %zu prompts; at most %d are allowed", n_prompts,
                               PROTO_MAX_PROMPTS);
    r->prompts = px_malloc(n_prompts * sizeof *r->prompts);
    if (!r->prompts)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(r->prompts, 0, n_prompts * sizeof *r->prompts);
    r->n_prompts = n_prompts;

    if (json_is_string(v))
        return prompt_text(v, "prompt", &left, &r->prompts[0], err);
    if (flat_ids)
        return px_parse_token_ids(v, "prompt", lim->max_prompt_tokens, lim->n_vocab, 0,
                                  &r->prompts[0].tokens, &r->prompts[0].n_tokens, err);
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(v, i);
        char ep[PROTO_ERROR_PARAM_MAX];
        int rc;
        px_paramf(ep, "prompt[%zu]", i);
        if (json_is_string(first)) {
            if (!json_is_string(e))
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                       "'%s' must be a string like the other prompts", ep);
            rc = prompt_text(e, ep, &left, &r->prompts[i], err);
        } else {
            if (!json_is_array(e))
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                       "'%s' must be an array of token ids like the other "
                                       "prompts",
                                       ep);
            rc = px_parse_token_ids(e, ep, lim->max_prompt_tokens, lim->n_vocab, 0,
                                    &r->prompts[i].tokens, &r->prompts[i].n_tokens, err);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Fields of the legacy completions API that change the output in ways
 * darkserve does not implement: refuse them instead of ignoring them. */
int px_completion_unsupported(json_t *root, const proto_gen_params_t *p, proto_error_t *err)
{
    json_t *v;
    if ((v = px_get(root, "echo"))) {
        if (!json_is_boolean(v))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "echo",
                                   "'echo' must be a boolean");
        if (json_is_true(v))
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "echo",
                                   "'echo': true is not supported");
    }
    if ((v = px_get(root, "best_of"))) {
        if (!json_is_integer(v) || json_integer_value(v) != p->n)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "best_of",
                                   "'best_of' is not supported unless it equals 'n'");
    }
    if ((v = px_get(root, "suffix"))) {
        if (!json_is_string(v) || json_string_length(v) != 0)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "suffix",
                                   "'suffix' is not supported");
    }
    return 0;
}

int proto_completion_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                           proto_completion_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    if ((rc = px_parse_gen_params(root, &lim, PX_GEN_COMPLETION, &out->p, err)) < 0)
        goto fail;
    if ((rc = px_completion_unsupported(root, &out->p, err)) < 0)
        goto fail;
    if ((rc = px_parse_prompt(root, &lim, out, err)) < 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_completion_free(out);
    return rc;
}

/* ----------------------------------------------------------------- chat */

void proto_chat_free(proto_chat_req_t *r)
{
    if (!r)
        return;
    px_gen_params_free(&r->p);
    px_messages_free(r->messages, r->n_messages);
    px_tools_free(r->tools, r->n_tools);
    memset(r, 0, sizeof *r);
}

/* The legacy function-calling fields: "tools" and "tool_choice" replace them. */
static int chat_unsupported(json_t *root, proto_error_t *err)
{
    static const char *const legacy[] = {"functions", "function_call"};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        json_t *v = px_get(root, legacy[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0))
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, legacy[i],
                                   "'%s' (the legacy function-calling API) is not supported; "
                                   "use 'tools' and 'tool_choice'",
                                   legacy[i]);
    }
    return 0;
}

int proto_chat_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                     proto_chat_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    json_t *msgs = px_get(root, "messages");
    if (!msgs) {
        rc = proto_error_set(err, PROTO_ERR_MISSING, "messages", "'messages' is required");
        goto fail;
    }
    if ((rc = px_parse_messages(msgs, "messages", lim.max_text_bytes, &out->messages,
                                &out->n_messages, err)) < 0)
        goto fail;
    if ((rc = px_parse_gen_params(root, &lim, PX_GEN_CHAT, &out->p, err)) < 0)
        goto fail;
    if ((rc = px_read_bool(root, "parse_special", &out->parse_special, err)) < 0)
        goto fail;
    if ((rc = chat_unsupported(root, err)) < 0)
        goto fail;
    if ((rc = px_parse_tools(root, out, err)) < 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_chat_free(out);
    return rc;
}
