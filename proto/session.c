/* proto/session.c — the native sessions API (create, append, generate, list
 * paging) and POST /tokenize, /detokenize. Ids: proto/ids.c. */
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"

/* "text" (or `text_key`) xor "messages"; required says whether one must be
 * present. */
static int parse_text_xor_messages(json_t *root, const char *text_key, const proto_limits_t *lim,
                                   int required, char **text, size_t *text_len,
                                   proto_message_t **msgs, size_t *n_msgs, proto_error_t *err)
{
    json_t *t = px_get(root, text_key);
    json_t *m = px_get(root, "messages");
    if (t && m)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "messages",
                               "give either '%s' or 'messages', not both", text_key);
    if (!t && !m) {
        if (required)
            return proto_error_set(err, PROTO_ERR_MISSING, text_key,
                                   "one of '%s' or 'messages' is required", text_key);
        return 0;
    }
    if (m)
        return px_parse_messages(m, "messages", lim->max_text_bytes, msgs, n_msgs, err);
    return px_read_string(root, text_key, (size_t)lim->max_text_bytes, text, text_len, err);
}

/* ------------------------------------------------------- POST /v1/sessions */

void proto_session_create_free(proto_session_create_req_t *r)
{
    if (!r)
        return;
    px_free(r->system);
    px_messages_free(r->messages, r->n_messages);
    memset(r, 0, sizeof *r);
}

int proto_session_create_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                               proto_session_create_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 1, err, &rc);
    if (!root)
        return rc;
    rc = parse_text_xor_messages(root, "system", &lim, 0, &out->system, &out->system_len,
                                 &out->messages, &out->n_messages, err);
    if (rc >= 0)
        rc = px_read_bool(root, "parse_special", &out->parse_special, err);
    if (rc >= 0)
        rc = px_read_prefix_id(root, out->prefix, err);
    json_decref(root);
    if (rc < 0) {
        proto_session_create_free(out);
        return rc;
    }
    return 0;
}

/* ------------------------------------------- POST /v1/sessions/{id}/append */

void proto_session_append_free(proto_session_append_req_t *r)
{
    if (!r)
        return;
    px_free(r->text);
    px_messages_free(r->messages, r->n_messages);
    memset(r, 0, sizeof *r);
}

int proto_session_append_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                               proto_session_append_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    rc = parse_text_xor_messages(root, "text", &lim, 1, &out->text, &out->text_len,
                                 &out->messages, &out->n_messages, err);
    if (rc >= 0)
        rc = px_read_bool(root, "parse_special", &out->parse_special, err);
    json_decref(root);
    if (rc < 0) {
        proto_session_append_free(out);
        return rc;
    }
    return 0;
}

/* ------------------------------------------------------- POST /v1/prefixes */

int proto_prefix_create_parse(const char *body, size_t len, const proto_limits_t *lim,
                              proto_prefix_create_req_t *out, proto_error_t *err)
{
    return proto_session_append_parse(body, len, lim, out, err);
}

/* ----------------------------------------- POST /v1/sessions/{id}/generate */

void proto_generate_free(proto_generate_req_t *r)
{
    if (!r)
        return;
    px_gen_params_free(&r->p);
    px_free(r->text);
    px_messages_free(r->messages, r->n_messages);
    memset(r, 0, sizeof *r);
}

int proto_generate_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                         proto_generate_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 1, err, &rc);
    if (!root)
        return rc;
    if ((rc = parse_text_xor_messages(root, "text", &lim, 0, &out->text, &out->text_len,
                                      &out->messages, &out->n_messages, err)) < 0)
        goto fail;
    if ((rc = px_parse_gen_params(root, &lim, PX_GEN_GENERATE, &out->p, err)) < 0)
        goto fail;
    if ((rc = px_read_bool(root, "parse_special", &out->parse_special, err)) < 0)
        goto fail;
    if ((rc = px_read_bool(root, "continue_grammar", &out->continue_grammar, err)) < 0)
        goto fail;
    if (out->continue_grammar) {
        /* the reply goes on under the grammar it started with, from where it stopped */
        const char *f = out->text ? "text" : out->messages ? "messages" : out->p.grammar_param;
        if (f) {
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, f,
                                 "'continue_grammar' finishes the reply the session's last "
                                 "generate left under its grammar; it cannot come with '%s'",
                                 f);
            goto fail;
        }
    }
    out->format = PROTO_STREAM_NDJSON;
    json_t *f = px_get(root, "stream_format");
    if (f) {
        if (json_is_string(f) && !strcmp(json_string_value(f), "ndjson")) {
            out->format = PROTO_STREAM_NDJSON;
        } else if (json_is_string(f) && !strcmp(json_string_value(f), "sse")) {
            out->format = PROTO_STREAM_SSE;
        } else {
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "stream_format",
                                 "'stream_format' must be \"ndjson\" or \"sse\"");
            goto fail;
        }
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_generate_free(out);
    return rc;
}

/* -------------------------------------- POST /v1/sessions/{id}/regenerate */

int proto_regenerate_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                           proto_generate_req_t *out, proto_error_t *err)
{
    int rc = proto_generate_parse(body, len, lim_in, out, err);
    if (rc < 0)
        return rc;
    const char *f = out->text               ? "text"
                    : out->messages         ? "messages"
                    : out->continue_grammar ? "continue_grammar"
                                            : NULL;
    if (f) {
        proto_generate_free(out);
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, f,
                               "'%s' is not accepted by regenerate: it runs the last turn's "
                               "input again (to add input, use /generate)",
                               f);
    }
    return 0;
}

/* ---------------------------------------- POST /v1/sessions/{id}/rollback */

int proto_rollback_parse(const char *body, size_t len, proto_rollback_req_t *out,
                         proto_error_t *err)
{
    int rc = 0;
    int64_t turns = 1;
    memset(out, 0, sizeof *out);
    json_t *root = px_load_object(body, len, 1, err, &rc);
    if (!root)
        return rc;
    rc = px_read_int(root, "turns", 1, PROTO_MAX_ROLLBACK_TURNS, "between 1 and 1000000000",
                     &turns, err);
    json_decref(root);
    if (rc < 0)
        return rc;
    out->turns = turns;
    return 0;
}

/* ------------------------------------------------------ GET /v1/sessions */

int proto_session_list_parse(const proto_kv_t *kv, size_t n, proto_session_list_req_t *out,
                             proto_error_t *err)
{
    int seen_limit = 0, seen_after = 0;
    memset(out, 0, sizeof *out);
    out->limit = PROTO_DEFAULT_LIST_LIMIT;
    for (size_t i = 0; i < n; i++) {
        const char *k = kv[i].key, *v = kv[i].value;
        if (!k)
            continue;
        if (!strcmp(k, "limit")) {
            if (seen_limit++)
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "limit",
                                       "'limit' is given more than once");
            /* Digits only: strtol would take "+5", " 5" and "5abc". */
            long val = 0;
            size_t j = 0;
            for (; v && v[j] >= '0' && v[j] <= '9' && j < 5; j++)
                val = val * 10 + (v[j] - '0');
            if (!v || j == 0 || v[j] != '\0' || val < 1 || val > PROTO_MAX_LIST_LIMIT)
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "limit",
                                       "'limit' must be an integer between 1 and %d",
                                       PROTO_MAX_LIST_LIMIT);
            out->limit = (int)val;
        } else if (!strcmp(k, "after")) {
            if (seen_after++)
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "after",
                                       "'after' is given more than once");
            if (!v || !proto_session_id_valid(v, strlen(v)))
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "after",
                                       "'after' must be a session id (%d lowercase hex "
                                       "characters)",
                                       PROTO_SESSION_ID_LEN);
            memcpy(out->after, v, PROTO_SESSION_ID_LEN + 1);
        }
    }
    return 0;
}

/* ------------------------------------------------------------- tokenize */

void proto_tokenize_free(proto_tokenize_req_t *r)
{
    if (!r)
        return;
    px_free(r->text);
    memset(r, 0, sizeof *r);
}

int proto_tokenize_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                         proto_tokenize_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    /* "content" is llama.cpp's name for the same field. */
    const char *key = px_get(root, "text") ? "text" : "content";
    if (px_get(root, "text") && px_get(root, "content")) {
        rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "content",
                             "give either 'text' or 'content', not both");
        goto fail;
    }
    rc = px_read_string(root, key, (size_t)lim.max_text_bytes, &out->text, &out->text_len, err);
    if (rc < 0)
        goto fail;
    if (rc == 1) {
        rc = proto_error_set(err, PROTO_ERR_MISSING, "text", "'text' is required");
        goto fail;
    }
    if ((rc = px_read_bool(root, "add_special", &out->add_special, err)) < 0)
        goto fail;
    if ((rc = px_read_bool(root, "with_pieces", &out->with_pieces, err)) < 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_tokenize_free(out);
    return rc;
}

void proto_detokenize_free(proto_detokenize_req_t *r)
{
    if (!r)
        return;
    px_free(r->tokens);
    memset(r, 0, sizeof *r);
}

int proto_detokenize_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                           proto_detokenize_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    json_t *t = px_get(root, "tokens");
    if (!t) {
        rc = proto_error_set(err, PROTO_ERR_MISSING, "tokens", "'tokens' is required");
    } else if (!json_is_array(t)) {
        rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tokens",
                             "'tokens' must be an array of token ids");
    } else {
        rc = px_parse_token_ids(t, "tokens", lim.max_prompt_tokens, lim.n_vocab, 1, &out->tokens,
                                &out->n_tokens, err);
    }
    json_decref(root);
    if (rc < 0) {
        proto_detokenize_free(out);
        return rc;
    }
    return 0;
}
