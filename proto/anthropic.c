/* proto/anthropic.c — Anthropic's Messages API (POST /v1/messages), the
 * subset docs/API.md lists: a request is read into the chat request the
 * OpenAI route runs (so every check of that route applies), and the chat
 * answer is written back in the Messages shape. As Anthropic's API does,
 * fields it does not know are refused; those darkserve does not implement
 * (tools, images, streaming, thinking) too, with the API's error shape.
 */
#include <string.h>

#include "proto/proto_impl.h"

static const char *const known[] = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
    "top_k", "metadata",   "stream",   "tools",  "tool_choice",    "thinking",    "service_tier"};
static const char *const not_here[] = {"tools", "tool_choice", "thinking"};

/* The text of content (a string, or an array of text blocks) into a new
 * JSON string; param names it in errors. */
static json_t *content_text(json_t *content, const char *param, proto_error_t *err, int *rc)
{
    if (json_is_string(content))
        return json_incref(content);
    if (!json_is_array(content)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                              "'%s' must be a string or an array of content blocks", param);
        return NULL;
    }
    px_buf_t b = {0};
    px_buf_append("", 0, &b);
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *blk = json_array_get(content, k);
        json_t *type = json_is_object(blk) ? px_get(blk, "type") : NULL;
        char bp[PROTO_ERROR_PARAM_MAX];
        px_paramf(bp, "%s[%zu]", param, k);
        if (!json_is_string(type)) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, bp,
                                  "'%s' must be a content block with a 'type'", bp);
            px_free(b.p);
            return NULL;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, bp,
                                  "'%s': content blocks of type '%.40s' are not supported; "
                                  "only 'text' is",
                                  bp, json_string_value(type));
            px_free(b.p);
            return NULL;
        }
        json_t *t = px_get(blk, "text");
        if (!json_is_string(t)) {
            *rc =
                proto_error_set(err, PROTO_ERR_INVALID_VALUE, bp, "'%s.text' must be a string", bp);
            px_free(b.p);
            return NULL;
        }
        px_buf_append(json_string_value(t), json_string_length(t), &b);
    }
    json_t *s = b.failed ? NULL : json_stringn(b.p ? b.p : "", b.n);
    px_free(b.p);
    if (!s)
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return s;
}

/* The chat request (an OpenAI body) the Messages request stands for. */
static json_t *to_chat(json_t *root, proto_error_t *err, int *rc)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                                  "%.64s: Extra inputs are not permitted", key);
            return NULL;
        }
    }
    for (size_t i = 0; i < sizeof not_here / sizeof not_here[0]; i++) {
        v = px_get(root, not_here[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0)) {
            *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, not_here[i],
                                  "'%s' is not supported by darkserve's /v1/messages", not_here[i]);
            return NULL;
        }
    }
    if (json_is_true(px_get(root, "stream"))) {
        *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, "stream",
                              "'stream': true is not supported by darkserve's /v1/messages yet");
        return NULL;
    }
    static const char *const required[] = {"model", "max_tokens", "messages"};
    for (size_t i = 0; i < 3; i++)
        if (!px_get(root, required[i])) {
            *rc = proto_error_set(err, PROTO_ERR_MISSING, required[i], "%s: Field required",
                                  required[i]);
            return NULL;
        }
    json_t *msgs = px_get(root, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "messages",
                              "'messages' must be a non-empty array");
        return NULL;
    }
    json_t *out = json_object(), *om = json_array();
    int bad = !out || !om;
    json_t *sys = px_get(root, "system");
    if (!bad && sys) {
        json_t *t = content_text(sys, "system", err, rc);
        if (!t) {
            json_decref(out);
            json_decref(om);
            return NULL;
        }
        json_t *m = json_object();
        bad |= json_object_set_new(m, "role", json_string("system"));
        bad |= json_object_set_new(m, "content", t);
        bad |= json_array_append_new(om, m);
    }
    for (size_t i = 0; !bad && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        char mp[PROTO_ERROR_PARAM_MAX];
        px_paramf(mp, "messages[%zu]", i);
        json_t *role = json_is_object(m) ? px_get(m, "role") : NULL;
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, mp,
                                  "'%s.role' must be \"user\" or \"assistant\"", mp);
            json_decref(out);
            json_decref(om);
            return NULL;
        }
        char cp[PROTO_ERROR_PARAM_MAX];
        px_paramf(cp, "messages[%zu].content", i);
        json_t *c = px_get(m, "content");
        json_t *t = c ? content_text(c, cp, err, rc) : NULL;
        if (!t) {
            if (!c)
                *rc = proto_error_set(err, PROTO_ERR_MISSING, cp, "%s: Field required", cp);
            json_decref(out);
            json_decref(om);
            return NULL;
        }
        json_t *nm = json_object();
        bad |= json_object_set_new(nm, "role", json_string(r));
        bad |= json_object_set_new(nm, "content", t);
        bad |= json_array_append_new(om, nm);
    }
    bad |= json_object_set_new(out, "messages", om);
    static const char *const same[] = {"model", "max_tokens", "temperature", "top_p", "top_k"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = px_get(root, same[i])))
            bad |= json_object_set(out, same[i], v);
    if ((v = px_get(root, "stop_sequences")))
        bad |= json_object_set(out, "stop", v);
    if (bad) {
        json_decref(out);
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    return out;
}

int proto_messages_parse(const char *body, size_t len, const proto_limits_t *lim,
                         proto_chat_req_t *out, proto_error_t *err)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    /* Anthropic's temperature is 0..1, top_k >= 0 */
    json_t *t = px_get(root, "temperature");
    if (t && (!json_is_number(t) || json_number_value(t) < 0 || json_number_value(t) > 1)) {
        json_decref(root);
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "temperature",
                               "'temperature' must be a number between 0 and 1");
    }
    json_t *chat = to_chat(root, err, &rc);
    json_decref(root);
    if (!chat)
        return rc;
    char *text = px_dump(chat); /* reference stolen */
    if (!text)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    rc = proto_chat_parse(text, strlen(text), lim, out, err);
    px_free(text);
    if (rc == 0 && out->p.stream) /* not reachable: stream true was refused */
        out->p.stream = 0;
    return rc;
}

char *proto_messages_json(const char *chat_json, const proto_messages_end_t *m)
{
    json_t *root = chat_json ? json_loads(chat_json, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *ch = json_array_get(json_object_get(root, "choices"), 0);
    json_t *content = json_object_get(json_object_get(ch, "message"), "content");
    json_t *usage = json_object_get(root, "usage");
    if (!json_is_object(root) || !json_is_object(ch)) {
        json_decref(root);
        return NULL;
    }
    json_t *o = json_object(), *blocks = json_array(), *blk = json_object(), *u = json_object();
    int bad = !o || !blocks || !blk || !u;
    bad |= json_object_set_new(o, "id", px_cstr_or_null(m->id));
    bad |= json_object_set_new(o, "type", json_string("message"));
    bad |= json_object_set_new(o, "role", json_string("assistant"));
    bad |= json_object_set_new(o, "model", px_cstr_or_null(m->model));
    bad |= json_object_set_new(blk, "type", json_string("text"));
    bad |= json_object_set_new(blk, "text",
                               json_is_string(content) ? json_incref(content) : json_string(""));
    bad |= json_array_append_new(blocks, blk);
    bad |= json_object_set_new(o, "content", blocks);
    bad |= json_object_set_new(o, "stop_reason", px_cstr_or_null(m->stop_reason));
    bad |= json_object_set_new(o, "stop_sequence", px_cstr_or_null(m->stop_sequence));
    bad |= json_object_set_new(
        u, "input_tokens",
        json_integer(json_integer_value(json_object_get(usage, "prompt_tokens"))));
    bad |= json_object_set_new(
        u, "output_tokens",
        json_integer(json_integer_value(json_object_get(usage, "completion_tokens"))));
    bad |= json_object_set_new(o, "usage", u);
    json_decref(root);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return px_dump(o);
}

char *proto_anthropic_error_json(const proto_error_t *e)
{
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    json_t *o = json_object(), *in = json_object();
    int bad = !o || !in;
    bad |= json_object_set_new(o, "type", json_string("error"));
    bad |= json_object_set_new(in, "type", json_string(type));
    bad |= json_object_set_new(in, "message", px_str(e->message, strlen(e->message)));
    bad |= json_object_set_new(o, "error", in);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return px_dump(o);
}
