/* proto/anthropic.c — Anthropic's Messages API (POST /v1/messages), the
 * subset docs/API.md lists: a request is read into the chat request the
 * OpenAI route runs (so every check of that route applies: tools become
 * function tools, tool_use blocks tool_calls, tool_result blocks tool
 * messages), and the chat answer is written back in the Messages shape,
 * streamed as Anthropic's named SSE events. As Anthropic's API does, fields
 * it does not know are refused; those darkserve does not implement
 * (images, documents, thinking, server tools) too, with the API's error
 * shape.
 */
#include <string.h>

#include "proto/proto_impl.h"

static const char *const known[] = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
    "top_k", "metadata",   "stream",   "tools",  "tool_choice",    "thinking",    "service_tier"};

/* 0 when every key of obj is one of allowed[n], else a 400 naming the
 * first other one (param.key). */
static int only_keys(json_t *obj, const char *const *allowed, size_t n, const char *param,
                     proto_error_t *err, int *rc)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++)
            ok = strcmp(key, allowed[i]) == 0;
        if (!ok) {
            char kp[PROTO_ERROR_PARAM_MAX];
            if (param)
                px_paramf(kp, "%s.%.64s", param, key);
            else
                px_paramf(kp, "%.64s", key);
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, kp,
                                  "%s: Extra inputs are not permitted", kp);
            return -1;
        }
    }
    return 0;
}
#define ONLY_KEYS(obj, list, param)                                                                \
    only_keys((obj), (list), sizeof(list) / sizeof((list)[0]), (param), err, rc)

/* Appends the text of block blk (type "text", at bp) to b. */
static int text_block(json_t *blk, const char *bp, px_buf_t *b, proto_error_t *err, int *rc)
{
    static const char *const keys[] = {"type", "text", "cache_control", "citations"};
    if (ONLY_KEYS(blk, keys, bp) < 0)
        return -1;
    json_t *cit = px_get(blk, "citations");
    if (cit && !(json_is_array(cit) && json_array_size(cit) == 0)) {
        char cp[PROTO_ERROR_PARAM_MAX];
        px_paramf(cp, "%s.citations", bp);
        *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, cp, "'%s' is not supported", cp);
        return -1;
    }
    json_t *t = px_get(blk, "text");
    if (!json_is_string(t)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, bp, "'%s.text' must be a string", bp);
        return -1;
    }
    px_buf_append(json_string_value(t), json_string_length(t), b);
    return 0;
}

/* The type of block blk at bp, or NULL after a 400. */
static const char *block_type(json_t *blk, const char *bp, proto_error_t *err, int *rc)
{
    json_t *type = json_is_object(blk) ? px_get(blk, "type") : NULL;
    if (!json_is_string(type)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, bp,
                              "'%s' must be a content block with a 'type'", bp);
        return NULL;
    }
    return json_string_value(type);
}

static int block_unsupported(const char *bp, const char *type, const char *which,
                             proto_error_t *err, int *rc)
{
    *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, bp,
                          "'%s': content blocks of type '%.40s' are not supported here; %s", bp,
                          type, which);
    return -1;
}

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
        char bp[PROTO_ERROR_PARAM_MAX];
        px_paramf(bp, "%s[%zu]", param, k);
        const char *type = block_type(blk, bp, err, rc);
        if (!type ||
            (strcmp(type, "text") != 0 &&
             block_unsupported(bp, type, "only 'text' is", err, rc) < 0) ||
            text_block(blk, bp, &b, err, rc) < 0) {
            px_free(b.p);
            return NULL;
        }
    }
    json_t *s = b.failed ? NULL : json_stringn(b.p ? b.p : "", b.n);
    px_free(b.p);
    if (!s)
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return s;
}

/* Appends {"role", "content": text} to om (text's reference stolen). */
static int add_msg(json_t *om, const char *role, json_t *text)
{
    json_t *m = json_object();
    int bad = !m || !text;
    bad |= json_object_set_new(m, "role", json_string(role));
    bad |= json_object_set_new(m, "content", text ? text : json_null());
    bad |= json_array_append_new(om, m);
    return bad ? -1 : 0;
}

/* A user turn's blocks at mp (content cp): text blocks joined into user
 * messages, each tool_result a tool message, in their order. */
static int user_blocks(json_t *content, const char *cp, json_t *om, proto_error_t *err, int *rc)
{
    static const char *const tr_keys[] = {"type", "tool_use_id", "content", "is_error",
                                          "cache_control"};
    px_buf_t b = {0};
    int any = 0, bad = 0;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *blk = json_array_get(content, k);
        char bp[PROTO_ERROR_PARAM_MAX];
        px_paramf(bp, "%s[%zu]", cp, k);
        const char *type = block_type(blk, bp, err, rc);
        if (!type)
            goto fail;
        if (strcmp(type, "text") == 0) {
            if (text_block(blk, bp, &b, err, rc) < 0)
                goto fail;
            any = 1;
            continue;
        }
        if (strcmp(type, "tool_result") != 0) {
            block_unsupported(bp, type, "a user turn takes 'text' and 'tool_result'", err, rc);
            goto fail;
        }
        if (ONLY_KEYS(blk, tr_keys, bp) < 0)
            goto fail;
        json_t *tid = px_get(blk, "tool_use_id");
        if (!json_is_string(tid)) {
            char tp[PROTO_ERROR_PARAM_MAX];
            px_paramf(tp, "%s.tool_use_id", bp);
            *rc = proto_error_set(err, tid ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING, tp,
                                  "'%s' must be a string", tp);
            goto fail;
        }
        json_t *ie = px_get(blk, "is_error");
        if (ie && !json_is_boolean(ie)) {
            char tp[PROTO_ERROR_PARAM_MAX];
            px_paramf(tp, "%s.is_error", bp);
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp, "'%s' must be a boolean", tp);
            goto fail;
        }
        char rp[PROTO_ERROR_PARAM_MAX];
        px_paramf(rp, "%s.content", bp);
        json_t *rc_ = px_get(blk, "content");
        json_t *t = rc_ ? content_text(rc_, rp, err, rc) : json_string("");
        if (!t)
            goto fail;
        if (json_is_true(ie)) { /* the model reads that the call failed */
            json_t *et = json_sprintf("Error: %s", json_string_value(t));
            json_decref(t);
            t = et;
        }
        if (any && !b.failed) { /* text before the result: a user message of its own */
            bad |= add_msg(om, "user", json_stringn(b.p ? b.p : "", b.n));
            b.n = 0;
            any = 0;
        }
        json_t *m = json_object();
        bad |= !m || !t;
        bad |= json_object_set_new(m, "role", json_string("tool"));
        bad |= json_object_set_new(m, "content", t ? t : json_null());
        bad |= json_object_set(m, "tool_call_id", tid);
        bad |= json_array_append_new(om, m);
    }
    if (any || json_array_size(content) == 0)
        bad |= add_msg(om, "user", json_stringn(b.p ? b.p : "", b.n));
    px_free(b.p);
    if (bad || b.failed) {
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return -1;
    }
    return 0;
fail:
    px_free(b.p);
    return -1;
}

/* An assistant turn's blocks: text joined as content, tool_use blocks as
 * tool_calls. */
static int assistant_blocks(json_t *content, const char *cp, json_t *om, proto_error_t *err,
                            int *rc)
{
    static const char *const tu_keys[] = {"type", "id", "name", "input", "cache_control"};
    px_buf_t b = {0};
    json_t *calls = json_array();
    int bad = !calls;
    for (size_t k = 0; !bad && k < json_array_size(content); k++) {
        json_t *blk = json_array_get(content, k);
        char bp[PROTO_ERROR_PARAM_MAX];
        px_paramf(bp, "%s[%zu]", cp, k);
        const char *type = block_type(blk, bp, err, rc);
        if (!type)
            goto fail;
        if (strcmp(type, "text") == 0) {
            if (text_block(blk, bp, &b, err, rc) < 0)
                goto fail;
            continue;
        }
        if (strcmp(type, "tool_use") != 0) {
            block_unsupported(bp, type, "an assistant turn takes 'text' and 'tool_use'", err, rc);
            goto fail;
        }
        if (ONLY_KEYS(blk, tu_keys, bp) < 0)
            goto fail;
        static const char *const need[] = {"id", "name", "input"};
        for (size_t i = 0; i < 3; i++) {
            json_t *v = px_get(blk, need[i]);
            if (!v || (i < 2 ? !json_is_string(v) : !json_is_object(v))) {
                char fp[PROTO_ERROR_PARAM_MAX];
                px_paramf(fp, "%s.%s", bp, need[i]);
                *rc = proto_error_set(err, v ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING, fp,
                                      "'%s' must be %s", fp, i < 2 ? "a string" : "an object");
                goto fail;
            }
        }
        json_t *c = json_object(), *f = json_object();
        bad |= !c || !f;
        bad |= json_object_set(c, "id", px_get(blk, "id"));
        bad |= json_object_set_new(c, "type", json_string("function"));
        bad |= json_object_set(f, "name", px_get(blk, "name"));
        bad |= json_object_set(f, "arguments", px_get(blk, "input"));
        bad |= json_object_set_new(c, "function", f);
        bad |= json_array_append_new(calls, c);
    }
    json_t *m = json_object();
    bad |= !m;
    bad |= json_object_set_new(m, "role", json_string("assistant"));
    bad |= json_object_set_new(
        m, "content",
        json_array_size(calls) && b.n == 0 ? json_null() : json_stringn(b.p ? b.p : "", b.n));
    if (json_array_size(calls))
        bad |= json_object_set(m, "tool_calls", calls);
    bad |= json_array_append_new(om, m);
    json_decref(calls);
    px_free(b.p);
    if (bad || b.failed) {
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return -1;
    }
    return 0;
fail:
    json_decref(calls);
    px_free(b.p);
    return -1;
}

/* "tools" and "tool_choice" as the chat request's (into out). */
static int tools_to_chat(json_t *root, json_t *out, proto_error_t *err, int *rc)
{
    static const char *const t_keys[] = {"type", "name", "description", "input_schema",
                                         "cache_control"};
    json_t *tools = px_get(root, "tools");
    int bad = 0;
    if (tools) {
        if (!json_is_array(tools)) {
            *rc =
                proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tools", "'tools' must be an array");
            return -1;
        }
        json_t *ot = json_array();
        bad |= !ot;
        for (size_t i = 0; !bad && i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            char tp[PROTO_ERROR_PARAM_MAX], fp[PROTO_ERROR_PARAM_MAX];
            px_paramf(tp, "tools[%zu]", i);
            if (!json_is_object(t)) {
                *rc =
                    proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp, "'%s' must be an object", tp);
                json_decref(ot);
                return -1;
            }
            json_t *type = px_get(t, "type");
            if (type && !(json_is_string(type) && strcmp(json_string_value(type), "custom") == 0)) {
                px_paramf(fp, "%s.type", tp);
                *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                      "'%s': only client tools (type 'custom', with an "
                                      "input_schema) are supported; server tools are not",
                                      fp);
                json_decref(ot);
                return -1;
            }
            if (ONLY_KEYS(t, t_keys, tp) < 0) {
                json_decref(ot);
                return -1;
            }
            json_t *schema = px_get(t, "input_schema");
            if (!schema || !px_get(t, "name")) {
                px_paramf(fp, "%s.%s", tp, schema ? "name" : "input_schema");
                *rc = proto_error_set(err, PROTO_ERR_MISSING, fp, "%s: Field required", fp);
                json_decref(ot);
                return -1;
            }
            json_t *f = json_object(), *w = json_object();
            bad |= !f || !w;
            bad |= json_object_set(f, "name", px_get(t, "name"));
            if (px_get(t, "description"))
                bad |= json_object_set(f, "description", px_get(t, "description"));
            bad |= json_object_set(f, "parameters", schema);
            bad |= json_object_set_new(w, "type", json_string("function"));
            bad |= json_object_set_new(w, "function", f);
            bad |= json_array_append_new(ot, w);
        }
        bad |= json_object_set_new(out, "tools", ot);
    }
    json_t *tc = px_get(root, "tool_choice");
    if (tc) {
        static const char *const c_keys[] = {"type", "name", "disable_parallel_tool_use"};
        json_t *type = json_is_object(tc) ? px_get(tc, "type") : NULL;
        const char *ty = json_is_string(type) ? json_string_value(type) : "";
        if (!json_is_object(tc) || (strcmp(ty, "auto") != 0 && strcmp(ty, "any") != 0 &&
                                    strcmp(ty, "tool") != 0 && strcmp(ty, "none") != 0)) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice",
                                  "'tool_choice' must be {\"type\": \"auto\" | \"any\" | "
                                  "\"tool\" | \"none\"}");
            return -1;
        }
        if (ONLY_KEYS(tc, c_keys, "tool_choice") < 0)
            return -1;
        json_t *dp = px_get(tc, "disable_parallel_tool_use");
        if (dp && !json_is_boolean(dp)) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE,
                                  "tool_choice.disable_parallel_tool_use",
                                  "'tool_choice.disable_parallel_tool_use' must be a boolean");
            return -1;
        }
        if (json_is_true(dp))
            bad |= json_object_set_new(out, "parallel_tool_calls", json_false());
        if (strcmp(ty, "tool") == 0) {
            json_t *name = px_get(tc, "name");
            if (!json_is_string(name)) {
                *rc = proto_error_set(err, name ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING,
                                      "tool_choice.name",
                                      "'tool_choice.name' must name one of the tools");
                return -1;
            }
            json_t *o = json_object(), *f = json_object();
            bad |= !o || !f;
            bad |= json_object_set_new(o, "type", json_string("function"));
            bad |= json_object_set(f, "name", name);
            bad |= json_object_set_new(o, "function", f);
            bad |= json_object_set_new(out, "tool_choice", o);
        } else {
            bad |= json_object_set_new(out, "tool_choice",
                                       json_string(strcmp(ty, "any") == 0 ? "required" : ty));
        }
    }
    if (bad) {
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* POST /v1/messages/count_tokens takes these */
static const char *const count_known[] = {"model", "messages",    "system",
                                          "tools", "tool_choice", "thinking"};

/* The chat request (an OpenAI body) the Messages request stands for
 * (count: a count_tokens request, which has no max_tokens). */
static json_t *to_chat(json_t *root, int count, proto_error_t *err, int *rc)
{
    if ((count ? ONLY_KEYS(root, count_known, NULL) : ONLY_KEYS(root, known, NULL)) < 0)
        return NULL;
    json_t *v = px_get(root, "thinking");
    if (v) {
        json_t *tt = json_is_object(v) ? px_get(v, "type") : NULL;
        if (!(json_is_string(tt) && strcmp(json_string_value(tt), "disabled") == 0)) {
            *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, "thinking",
                                  "'thinking' is not supported by darkserve's /v1/messages "
                                  "(only {\"type\": \"disabled\"})");
            return NULL;
        }
    }
    static const char *const required[] = {"model", "messages", "max_tokens"};
    for (size_t i = 0; i < (count ? 2u : 3u); i++)
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
        if (!t)
            goto fail;
        bad |= add_msg(om, "system", t);
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
            goto fail;
        }
        static const char *const m_keys[] = {"role", "content"};
        if (ONLY_KEYS(m, m_keys, mp) < 0)
            goto fail;
        char cp[PROTO_ERROR_PARAM_MAX];
        px_paramf(cp, "messages[%zu].content", i);
        json_t *c = px_get(m, "content");
        if (!c) {
            *rc = proto_error_set(err, PROTO_ERR_MISSING, cp, "%s: Field required", cp);
            goto fail;
        }
        if (json_is_array(c)) {
            if ((r[0] == 'u' ? user_blocks(c, cp, om, err, rc)
                             : assistant_blocks(c, cp, om, err, rc)) < 0)
                goto fail;
            continue;
        }
        json_t *t = content_text(c, cp, err, rc);
        if (!t)
            goto fail;
        bad |= add_msg(om, r, t);
    }
    bad |= json_object_set_new(out, "messages", om);
    om = NULL;
    static const char *const same[] = {"model", "max_tokens", "temperature",
                                       "top_p", "top_k",      "stream"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = px_get(root, same[i])))
            bad |= json_object_set(out, same[i], v);
    if ((v = px_get(root, "stop_sequences")))
        bad |= json_object_set(out, "stop", v);
    if (count) /* nothing is generated */
        bad |= json_object_set_new(out, "max_tokens", json_integer(1));
    if (!bad && tools_to_chat(root, out, err, rc) < 0) {
        json_decref(out);
        return NULL;
    }
    if (bad) {
        json_decref(out);
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    return out;
fail:
    json_decref(om);
    json_decref(out);
    return NULL;
}

/* The chat parser's names of tool fields as the Messages API names them
 * (tools[i].function.parameters -> tools[i].input_schema), in place. */
static void anthropic_names(char *s, size_t cap)
{
    static const char *const from[] = {".function.parameters", ".function.name",
                                       ".function.description"};
    static const char *const to[] = {".input_schema", ".name", ".description"};
    for (size_t i = 0; i < 3; i++) {
        char *p;
        while ((p = strstr(s, from[i]))) {
            size_t fl = strlen(from[i]), tl = strlen(to[i]);
            memmove(p + tl, p + fl, strlen(p + fl) + 1);
            memcpy(p, to[i], tl);
        }
    }
    (void)cap;
}

static int messages_parse(const char *body, size_t len, const proto_limits_t *lim,
                          proto_chat_req_t *out, proto_error_t *err, int count)
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
    json_t *chat = to_chat(root, count, err, &rc);
    json_decref(root);
    if (!chat)
        return rc;
    char *text = px_dump(chat); /* reference stolen */
    if (!text)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    rc = proto_chat_parse(text, strlen(text), lim, out, err);
    px_free(text);
    if (rc < 0) {
        anthropic_names(err->param, sizeof err->param);
        anthropic_names(err->message, sizeof err->message);
    }
    return rc;
}

/* A call's arguments text as the object a tool_use block's input is: {}
 * when it is not one (a call cut by max_tokens). New reference or NULL. */
static json_t *call_input(json_t *args)
{
    json_t *in = NULL;
    if (json_is_string(args))
        in = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, NULL);
    if (json_is_object(in))
        return in;
    json_decref(in);
    return json_object();
}

/* "toolu_" and what follows "call_" in a chat call id. */
static json_t *tool_use_id(json_t *id)
{
    const char *s = json_is_string(id) ? json_string_value(id) : "";
    if (strncmp(s, "call_", 5) == 0)
        s += 5;
    return json_sprintf("toolu_%s", s);
}

int proto_messages_parse(const char *body, size_t len, const proto_limits_t *lim,
                         proto_chat_req_t *out, proto_error_t *err)
{
    return messages_parse(body, len, lim, out, err, 0);
}

int proto_messages_count_parse(const char *body, size_t len, const proto_limits_t *lim,
                               proto_chat_req_t *out, proto_error_t *err)
{
    return messages_parse(body, len, lim, out, err, 1);
}

char *proto_messages_json(const char *chat_json, const proto_messages_end_t *m)
{
    json_t *root = chat_json ? json_loads(chat_json, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *ch = json_array_get(json_object_get(root, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    json_t *content = json_object_get(msg, "content");
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *usage = json_object_get(root, "usage");
    if (!json_is_object(root) || !json_is_object(ch)) {
        json_decref(root);
        return NULL;
    }
    json_t *o = json_object(), *blocks = json_array(), *u = json_object();
    int bad = !o || !blocks || !u;
    bad |= json_object_set_new(o, "id", px_cstr_or_null(m->id));
    bad |= json_object_set_new(o, "type", json_string("message"));
    bad |= json_object_set_new(o, "role", json_string("assistant"));
    bad |= json_object_set_new(o, "model", px_cstr_or_null(m->model));
    /* the text first (none when the answer is calls only), then the calls */
    if (json_string_length(content) > 0 || json_array_size(calls) == 0) {
        json_t *blk = json_object();
        bad |= !blk;
        bad |= json_object_set_new(blk, "type", json_string("text"));
        bad |= json_object_set_new(
            blk, "text", json_is_string(content) ? json_incref(content) : json_string(""));
        bad |= json_array_append_new(blocks, blk);
    }
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
        json_t *blk = json_object();
        bad |= !blk;
        bad |= json_object_set_new(blk, "type", json_string("tool_use"));
        bad |= json_object_set_new(blk, "id", tool_use_id(json_object_get(c, "id")));
        bad |= json_object_set(blk, "name", json_object_get(f, "name"));
        bad |= json_object_set_new(blk, "input", call_input(json_object_get(f, "arguments")));
        bad |= json_array_append_new(blocks, blk);
    }
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

static const char *const ev_names[] = {[PROTO_MSG_EV_MESSAGE_START] = "message_start",
                                       [PROTO_MSG_EV_PING] = "ping",
                                       [PROTO_MSG_EV_TEXT_START] = "content_block_start",
                                       [PROTO_MSG_EV_TOOL_START] = "content_block_start",
                                       [PROTO_MSG_EV_TEXT_DELTA] = "content_block_delta",
                                       [PROTO_MSG_EV_JSON_DELTA] = "content_block_delta",
                                       [PROTO_MSG_EV_BLOCK_STOP] = "content_block_stop",
                                       [PROTO_MSG_EV_MESSAGE_DELTA] = "message_delta",
                                       [PROTO_MSG_EV_MESSAGE_STOP] = "message_stop",
                                       [PROTO_MSG_EV_ERROR] = "error"};

/* "event: <name>\ndata: <json>\n\n" of a JSON text (reference stolen). */
static char *sse_named(const char *name, json_t *o, size_t *out_len)
{
    char *j = px_dump(o);
    if (!j)
        return NULL;
    px_buf_t b = {0};
    px_buf_printf(&b, "event: %s\ndata: %s\n\n", name, j);
    px_free(j);
    if (b.failed) {
        px_free(b.p);
        return NULL;
    }
    if (out_len)
        *out_len = b.n;
    return b.p;
}

char *proto_messages_event(const proto_msg_ev_t *ev, size_t *out_len)
{
    if ((unsigned)ev->kind > PROTO_MSG_EV_ERROR)
        return NULL;
    const char *name = ev_names[ev->kind];
    json_t *o = json_object(), *x = NULL, *y = NULL;
    int bad = !o || json_object_set_new(o, "type", json_string(name));
    switch (ev->kind) {
    case PROTO_MSG_EV_MESSAGE_START:
        x = json_object();
        y = json_object();
        bad |= !x || !y;
        bad |= json_object_set_new(x, "id", px_cstr_or_null(ev->id));
        bad |= json_object_set_new(x, "type", json_string("message"));
        bad |= json_object_set_new(x, "role", json_string("assistant"));
        bad |= json_object_set_new(x, "model", px_cstr_or_null(ev->model));
        bad |= json_object_set_new(x, "content", json_array());
        bad |= json_object_set_new(x, "stop_reason", json_null());
        bad |= json_object_set_new(x, "stop_sequence", json_null());
        bad |= json_object_set_new(y, "input_tokens", json_integer(ev->input_tokens));
        bad |= json_object_set_new(y, "output_tokens", json_integer(0));
        bad |= json_object_set_new(x, "usage", y);
        bad |= json_object_set_new(o, "message", x);
        break;
    case PROTO_MSG_EV_TEXT_START:
    case PROTO_MSG_EV_TOOL_START:
        x = json_object();
        bad |= !x || json_object_set_new(o, "index", json_integer(ev->index));
        if (ev->kind == PROTO_MSG_EV_TEXT_START) {
            bad |= json_object_set_new(x, "type", json_string("text"));
            bad |= json_object_set_new(x, "text", json_string(""));
        } else {
            bad |= json_object_set_new(x, "type", json_string("tool_use"));
            bad |= json_object_set_new(x, "id", px_cstr_or_null(ev->id));
            bad |= json_object_set_new(x, "name", px_cstr_or_null(ev->name));
            bad |= json_object_set_new(x, "input", json_object());
        }
        bad |= json_object_set_new(o, "content_block", x);
        break;
    case PROTO_MSG_EV_TEXT_DELTA:
    case PROTO_MSG_EV_JSON_DELTA: {
        const int text = ev->kind == PROTO_MSG_EV_TEXT_DELTA;
        x = json_object();
        bad |= !x || json_object_set_new(o, "index", json_integer(ev->index));
        bad |=
            json_object_set_new(x, "type", json_string(text ? "text_delta" : "input_json_delta"));
        bad |= json_object_set_new(x, text ? "text" : "partial_json", px_str(ev->text, ev->len));
        bad |= json_object_set_new(o, "delta", x);
        break;
    }
    case PROTO_MSG_EV_BLOCK_STOP:
        bad |= json_object_set_new(o, "index", json_integer(ev->index));
        break;
    case PROTO_MSG_EV_MESSAGE_DELTA:
        x = json_object();
        y = json_object();
        bad |= !x || !y;
        bad |= json_object_set_new(x, "stop_reason", px_cstr_or_null(ev->stop_reason));
        bad |= json_object_set_new(x, "stop_sequence", px_cstr_or_null(ev->stop_sequence));
        bad |= json_object_set_new(o, "delta", x);
        bad |= json_object_set_new(y, "output_tokens", json_integer(ev->output_tokens));
        bad |= json_object_set_new(o, "usage", y);
        break;
    default: break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return sse_named(name, o, out_len);
}

char *proto_anthropic_error_event(const proto_error_t *e, size_t *out_len)
{
    char *j = proto_anthropic_error_json(e);
    if (!j)
        return NULL;
    px_buf_t b = {0};
    px_buf_printf(&b, "event: error\ndata: %s\n\n", j);
    px_free(j);
    if (b.failed) {
        px_free(b.p);
        return NULL;
    }
    if (out_len)
        *out_len = b.n;
    return b.p;
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
