/* proto/responses.c — OpenAI's Responses API (POST /v1/responses), the
 * subset docs/API.md lists: the request is read into the chat request it
 * stands for (instructions as the system message, input items as messages,
 * function tools, text.format as response_format), so every check of the
 * chat route applies; the answer and its stream events are built here
 * from what the server generated. Fields OpenAI's API has that darkserve
 * cannot honour (background, built-in tools, reasoning, ...) and unknown
 * fields are refused with 400 naming them.
 */
#include <string.h>

#include "proto/proto_impl.h"

/* what the request may hold; the second list is recognized but refused
 * unless absent or at its neutral value (checked below) */
static const char *const known[] = {"model",
                                    "input",
                                    "instructions",
                                    "max_output_tokens",
                                    "temperature",
                                    "top_p",
                                    "stream",
                                    "store",
                                    "tools",
                                    "tool_choice",
                                    "parallel_tool_calls",
                                    "text",
                                    "metadata",
                                    "user",
                                    "safety_identifier",
                                    "prompt_cache_key",
                                    "service_tier",
                                    "truncation",
                                    "include",
                                    "reasoning",
                                    "background",
                                    "stream_options",
                                    "top_logprobs",
                                    "max_tool_calls",
                                    "conversation",
                                    "prompt",
                                    "previous_response_id"};

static int fail(int *rc, proto_error_t *err, proto_errkind_t kind, const char *param,
                const char *msg)
{
    *rc = proto_error_set(err, kind, param, "%s", msg);
    return -1;
}

/* The neutral values of recognized fields darkserve has nothing behind:
 * anything else is refused naming the field. */
static int refuse_unhonoured(json_t *root, proto_error_t *err, int *rc)
{
    json_t *v;
    if ((v = px_get(root, "background")) && !json_is_false(v))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "background",
                    "'background' responses are not supported by darkserve; send "
                    "'background': false or leave it out");
    if ((v = px_get(root, "include")) && !(json_is_array(v) && json_array_size(v) == 0))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "include",
                    "'include' is not supported by darkserve (nothing extra can be included)");
    if ((v = px_get(root, "reasoning"))) {
        /* {} or {"effort": null, ...}: nothing asked */
        int empty = json_is_object(v);
        const char *key;
        json_t *x;
        if (empty)
            json_object_foreach(v, key, x) empty &= json_is_null(x);
        if (!empty)
            return fail(rc, err, PROTO_ERR_UNSUPPORTED, "reasoning",
                        "'reasoning' is not supported by darkserve: the model has no reasoning "
                        "mode");
    }
    if ((v = px_get(root, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "top_logprobs",
                    "'top_logprobs' is not supported by darkserve's /v1/responses; use "
                    "/v1/chat/completions");
    if (px_get(root, "max_tool_calls"))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "max_tool_calls",
                    "'max_tool_calls' is not supported by darkserve (a forced answer holds at "
                    "most 8 calls; parallel_tool_calls: false makes it one)");
    if (px_get(root, "conversation"))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "conversation",
                    "'conversation' is not supported by darkserve; continue with "
                    "'previous_response_id'");
    if (px_get(root, "prompt"))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "prompt",
                    "'prompt' (stored prompt templates) is not supported by darkserve");
    if ((v = px_get(root, "truncation")) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "disabled") == 0))
        return fail(rc, err, PROTO_ERR_UNSUPPORTED, "truncation",
                    "'truncation' must be \"disabled\": darkserve never drops input");
    if ((v = px_get(root, "stream_options"))) {
        const char *key;
        json_t *x;
        if (!json_is_object(v))
            return fail(rc, err, PROTO_ERR_INVALID_VALUE, "stream_options",
                        "'stream_options' must be an object");
        json_object_foreach(v, key, x)
        {
            if (strcmp(key, "include_obfuscation") != 0 || !json_is_boolean(x))
                return fail(rc, err, PROTO_ERR_UNSUPPORTED, "stream_options",
                            "'stream_options' takes only 'include_obfuscation' (a boolean; "
                            "darkserve adds no obfuscation)");
        }
    }
    static const char *const strings[] = {
        "user",         "safety_identifier",    "prompt_cache_key",
        "service_tier", "previous_response_id", "instructions"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if ((v = px_get(root, strings[i])) && !json_is_string(v)) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, strings[i], "'%s' must be a string",
                                  strings[i]);
            return -1;
        }
    if ((v = px_get(root, "metadata")) && !json_is_object(v))
        return fail(rc, err, PROTO_ERR_INVALID_VALUE, "metadata", "'metadata' must be an object");
    if ((v = px_get(root, "store")) && !json_is_boolean(v))
        return fail(rc, err, PROTO_ERR_INVALID_VALUE, "store", "'store' must be a boolean");
    return 0;
}

/* 0 when every key of obj (at param) is one of allowed[n], else a 400
 * naming the first other one. */
static int item_keys(json_t *obj, const char *const *allowed, size_t n, const char *param,
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
            px_paramf(kp, "%s.%.64s", param, key);
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, kp, "Unknown parameter: '%s'.", kp);
            return -1;
        }
    }
    return 0;
}
#define ITEM_KEYS(obj, list, param)                                                                \
    item_keys((obj), (list), sizeof(list) / sizeof((list)[0]), (param), err, rc)

/* The text of a content value (a string or an array of text parts of the
 * given types) as a new JSON string. */
static json_t *parts_text(json_t *c, const char *param, int assistant, proto_error_t *err, int *rc)
{
    if (json_is_string(c))
        return json_incref(c);
    if (!json_is_array(c)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                              "'%s' must be a string or an array of content parts", param);
        return NULL;
    }
    px_buf_t b = {0};
    px_buf_append("", 0, &b);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *p = json_array_get(c, k);
        char pp[PROTO_ERROR_PARAM_MAX];
        px_paramf(pp, "%s[%zu]", param, k);
        json_t *type = json_is_object(p) ? px_get(p, "type") : NULL;
        const char *t = json_is_string(type) ? json_string_value(type) : NULL;
        if (!t) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, pp,
                                  "'%s' must be a content part with a 'type'", pp);
            px_free(b.p);
            return NULL;
        }
        const int ok = strcmp(t, "input_text") == 0 ||
                       (assistant && (strcmp(t, "output_text") == 0 || strcmp(t, "refusal") == 0));
        if (!ok) {
            *rc =
                proto_error_set(err, PROTO_ERR_UNSUPPORTED, pp,
                                "'%s': content parts of type '%.40s' are not supported; %s", pp, t,
                                assistant ? "an assistant message takes 'output_text'"
                                          : "only 'input_text' is (no images, files or audio)");
            px_free(b.p);
            return NULL;
        }
        static const char *const in_keys[] = {"type", "text"};
        static const char *const out_keys[] = {"type", "text", "annotations", "logprobs"};
        static const char *const ref_keys[] = {"type", "refusal"};
        if ((strcmp(t, "input_text") == 0    ? ITEM_KEYS(p, in_keys, pp)
             : strcmp(t, "output_text") == 0 ? ITEM_KEYS(p, out_keys, pp)
                                             : ITEM_KEYS(p, ref_keys, pp)) < 0) {
            px_free(b.p);
            return NULL;
        }
        json_t *x = px_get(p, strcmp(t, "refusal") == 0 ? "refusal" : "text");
        if (!json_is_string(x)) {
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, pp,
                                  "'%s' needs its text as a string", pp);
            px_free(b.p);
            return NULL;
        }
        px_buf_append(json_string_value(x), json_string_length(x), &b);
    }
    json_t *s = b.failed ? NULL : json_stringn(b.p ? b.p : "", b.n);
    px_free(b.p);
    if (!s)
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return s;
}

/* Appends the chat messages input item it (at ip) stands for to om. */
static int input_item(json_t *it, const char *ip, json_t *om, proto_error_t *err, int *rc)
{
    char fp[PROTO_ERROR_PARAM_MAX];
    if (!json_is_object(it)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, ip, "'%s' must be an object", ip);
        return -1;
    }
    json_t *type = px_get(it, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : NULL;
    if (type && !t) {
        px_paramf(fp, "%s.type", ip);
        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be a string", fp);
        return -1;
    }
    int bad = 0;
    static const char *const msg_keys[] = {"type", "role", "content", "id", "status"};
    static const char *const call_keys[] = {"type", "call_id", "name", "arguments", "id", "status"};
    static const char *const out_keys[] = {"type", "call_id", "output", "id", "status"};
    if (!t || strcmp(t, "message") == 0) {
        if (ITEM_KEYS(it, msg_keys, ip) < 0)
            return -1;
        json_t *role = px_get(it, "role");
        const char *r = json_is_string(role) ? json_string_value(role) : "";
        if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "system") != 0 &&
            strcmp(r, "developer") != 0) {
            px_paramf(fp, "%s.role", ip);
            *rc = proto_error_set(err, role ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING, fp,
                                  "'%s' must be \"user\", \"assistant\", \"system\" or "
                                  "\"developer\"",
                                  fp);
            return -1;
        }
        px_paramf(fp, "%s.content", ip);
        json_t *c = px_get(it, "content");
        if (!c) {
            *rc = proto_error_set(err, PROTO_ERR_MISSING, fp, "'%s' is required", fp);
            return -1;
        }
        json_t *text = parts_text(c, fp, r[0] == 'a', err, rc);
        if (!text)
            return -1;
        json_t *m = json_object();
        bad |= !m;
        bad |= json_object_set_new(m, "role", json_string(r));
        bad |= json_object_set_new(m, "content", text);
        bad |= json_array_append_new(om, m);
    } else if (strcmp(t, "function_call") == 0) {
        if (ITEM_KEYS(it, call_keys, ip) < 0)
            return -1;
        static const char *const need[] = {"call_id", "name", "arguments"};
        for (size_t i = 0; i < 3; i++) {
            json_t *v = px_get(it, need[i]);
            if (!json_is_string(v)) {
                px_paramf(fp, "%s.%s", ip, need[i]);
                *rc = proto_error_set(err, v ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING, fp,
                                      "'%s' must be a string", fp);
                return -1;
            }
        }
        /* calls join the assistant message before them, else open one */
        json_t *last = json_array_get(om, json_array_size(om) - 1);
        json_t *lr = json_object_get(last, "role");
        json_t *m = last;
        if (!(json_is_string(lr) && strcmp(json_string_value(lr), "assistant") == 0)) {
            m = json_object();
            bad |= !m;
            bad |= json_object_set_new(m, "role", json_string("assistant"));
            bad |= json_object_set_new(m, "content", json_null());
            bad |= json_array_append_new(om, m);
        }
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) {
            calls = json_array();
            bad |= json_object_set_new(m, "tool_calls", calls);
        }
        json_t *c = json_object(), *f = json_object();
        bad |= !c || !f;
        bad |= json_object_set(c, "id", px_get(it, "call_id"));
        bad |= json_object_set_new(c, "type", json_string("function"));
        bad |= json_object_set(f, "name", px_get(it, "name"));
        bad |= json_object_set(f, "arguments", px_get(it, "arguments"));
        bad |= json_object_set_new(c, "function", f);
        bad |= json_array_append_new(calls, c);
    } else if (strcmp(t, "function_call_output") == 0) {
        if (ITEM_KEYS(it, out_keys, ip) < 0)
            return -1;
        json_t *cid = px_get(it, "call_id");
        if (!json_is_string(cid)) {
            px_paramf(fp, "%s.call_id", ip);
            *rc = proto_error_set(err, cid ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_MISSING, fp,
                                  "'%s' must be a string", fp);
            return -1;
        }
        px_paramf(fp, "%s.output", ip);
        json_t *o = px_get(it, "output");
        if (!o) {
            *rc = proto_error_set(err, PROTO_ERR_MISSING, fp, "'%s' is required", fp);
            return -1;
        }
        json_t *text = parts_text(o, fp, 0, err, rc);
        if (!text)
            return -1;
        json_t *m = json_object();
        bad |= !m;
        bad |= json_object_set_new(m, "role", json_string("tool"));
        bad |= json_object_set_new(m, "content", text);
        bad |= json_object_set(m, "tool_call_id", cid);
        bad |= json_array_append_new(om, m);
    } else {
        px_paramf(fp, "%s.type", ip);
        *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                              "'%s': input items of type '%.40s' are not supported; darkserve "
                              "takes 'message', 'function_call' and 'function_call_output'",
                              fp, t);
        return -1;
    }
    if (bad) {
        *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* tools, tool_choice and text.format as the chat request's (into out). */
static int tools_and_format(json_t *root, json_t *out, proto_error_t *err, int *rc)
{
    int bad = 0;
    char fp[PROTO_ERROR_PARAM_MAX];
    json_t *tools = px_get(root, "tools");
    if (tools) {
        if (!json_is_array(tools))
            return fail(rc, err, PROTO_ERR_INVALID_VALUE, "tools", "'tools' must be an array");
        json_t *ot = json_array();
        bad |= !ot;
        for (size_t i = 0; !bad && i < json_array_size(tools); i++) {
            json_t *t = json_array_get(tools, i);
            json_t *type = json_is_object(t) ? px_get(t, "type") : NULL;
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
                px_paramf(fp, "tools[%zu].type", i);
                *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                      "'%s': only function tools are supported; built-in tools "
                                      "(web_search, file_search, code_interpreter, mcp, ...) "
                                      "are not",
                                      fp);
                json_decref(ot);
                return -1;
            }
            const char *key;
            json_t *v;
            json_t *f = json_object(), *w = json_object();
            bad |= !f || !w;
            json_object_foreach(t, key, v)
            {
                if (strcmp(key, "type") == 0)
                    continue;
                if (strcmp(key, "name") != 0 && strcmp(key, "description") != 0 &&
                    strcmp(key, "parameters") != 0 && strcmp(key, "strict") != 0) {
                    px_paramf(fp, "tools[%zu].%.64s", i, key);
                    *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                                          "Unknown parameter: '%s'.", fp);
                    json_decref(f);
                    json_decref(w);
                    json_decref(ot);
                    return -1;
                }
                bad |= json_object_set(f, key, v);
            }
            bad |= json_object_set_new(w, "type", json_string("function"));
            bad |= json_object_set_new(w, "function", f);
            bad |= json_array_append_new(ot, w);
        }
        bad |= json_object_set_new(out, "tools", ot);
    }
    json_t *tc = px_get(root, "tool_choice");
    if (tc) {
        if (json_is_string(tc)) {
            bad |= json_object_set(out, "tool_choice", tc);
        } else {
            json_t *type = json_is_object(tc) ? px_get(tc, "type") : NULL;
            json_t *name = json_is_object(tc) ? px_get(tc, "name") : NULL;
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
                !json_is_string(name) || json_object_size(tc) != 2)
                return fail(rc, err, PROTO_ERR_UNSUPPORTED, "tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"name\": ...}");
            json_t *o = json_object(), *f = json_object();
            bad |= !o || !f;
            bad |= json_object_set_new(o, "type", json_string("function"));
            bad |= json_object_set(f, "name", name);
            bad |= json_object_set_new(o, "function", f);
            bad |= json_object_set_new(out, "tool_choice", o);
        }
    }
    json_t *text = px_get(root, "text");
    if (text) {
        if (!json_is_object(text))
            return fail(rc, err, PROTO_ERR_INVALID_VALUE, "text", "'text' must be an object");
        const char *key;
        json_t *v;
        json_object_foreach(text, key, v)
        {
            if (strcmp(key, "format") == 0)
                continue;
            if (strcmp(key, "verbosity") == 0 &&
                (json_is_null(v) ||
                 (json_is_string(v) && strcmp(json_string_value(v), "medium") == 0)))
                continue;
            px_paramf(fp, "text.%.64s", key);
            *rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                  "'%s' is not supported by darkserve ('text' takes 'format'; "
                                  "'verbosity' only \"medium\")",
                                  fp);
            return -1;
        }
        json_t *f = px_get(text, "format");
        if (f) {
            json_t *type = json_is_object(f) ? px_get(f, "type") : NULL;
            const char *t = json_is_string(type) ? json_string_value(type) : "";
            json_t *rf = json_object();
            bad |= !rf;
            if (strcmp(t, "text") == 0 || strcmp(t, "json_object") == 0) {
                bad |= json_object_set_new(rf, "type", json_string(t));
            } else if (strcmp(t, "json_schema") == 0) {
                json_t *js = json_object();
                bad |= !js;
                json_object_foreach(f, key, v)
                {
                    if (strcmp(key, "type") == 0)
                        continue;
                    if (strcmp(key, "name") != 0 && strcmp(key, "schema") != 0 &&
                        strcmp(key, "strict") != 0 && strcmp(key, "description") != 0) {
                        px_paramf(fp, "text.format.%.64s", key);
                        *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                                              "Unknown parameter: '%s'.", fp);
                        json_decref(js);
                        json_decref(rf);
                        return -1;
                    }
                    bad |= json_object_set(js, key, v);
                }
                bad |= json_object_set_new(rf, "type", json_string("json_schema"));
                bad |= json_object_set_new(rf, "json_schema", js);
            } else {
                json_decref(rf);
                return fail(rc, err, PROTO_ERR_INVALID_VALUE, "text.format.type",
                            "'text.format.type' must be \"text\", \"json_object\" or "
                            "\"json_schema\"");
            }
            bad |= json_object_set_new(out, "response_format", rf);
        }
    }
    if (bad)
        return fail(rc, err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return 0;
}

/* The chat request (an OpenAI chat body) the Responses request stands for. */
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
            char kp[PROTO_ERROR_PARAM_MAX];
            px_paramf(kp, "%.64s", key);
            *rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, kp, "Unknown parameter: '%s'.", kp);
            return NULL;
        }
    }
    if (refuse_unhonoured(root, err, rc) < 0)
        return NULL;
    json_t *input = px_get(root, "input");
    if (!input) {
        fail(rc, err, PROTO_ERR_MISSING, "input", "'input' is required");
        return NULL;
    }
    json_t *out = json_object(), *om = json_array();
    int bad = !out || !om;
    json_t *ins = px_get(root, "instructions");
    if (ins) {
        json_t *m = json_object();
        bad |= !m;
        bad |= json_object_set_new(m, "role", json_string("system"));
        bad |= json_object_set(m, "content", ins);
        bad |= json_array_append_new(om, m);
    }
    if (json_is_string(input)) {
        json_t *m = json_object();
        bad |= !m;
        bad |= json_object_set_new(m, "role", json_string("user"));
        bad |= json_object_set(m, "content", input);
        bad |= json_array_append_new(om, m);
    } else if (json_is_array(input) && json_array_size(input) > 0) {
        for (size_t i = 0; !bad && i < json_array_size(input); i++) {
            char ip[PROTO_ERROR_PARAM_MAX];
            px_paramf(ip, "input[%zu]", i);
            if (input_item(json_array_get(input, i), ip, om, err, rc) < 0)
                goto fail;
        }
    } else {
        fail(rc, err, PROTO_ERR_INVALID_VALUE, "input",
             "'input' must be a string or a non-empty array of input items");
        goto fail;
    }
    bad |= json_object_set_new(out, "messages", om);
    om = NULL;
    static const char *const same[] = {"model", "temperature", "top_p", "stream",
                                       "parallel_tool_calls"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = px_get(root, same[i])))
            bad |= json_object_set(out, same[i], v);
    if ((v = px_get(root, "max_output_tokens")))
        bad |= json_object_set(out, "max_tokens", v);
    if (!bad && tools_and_format(root, out, err, rc) < 0)
        goto fail;
    if (bad) {
        fail(rc, err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    return out;
fail:
    json_decref(om);
    json_decref(out);
    return NULL;
}

/* The chat parser's field names as this API names them, in place within
 * s[cap]. */
static void responses_names(char *s, size_t cap)
{
    static const char *const from[] = {".function.parameters",
                                       ".function.name",
                                       ".function.description",
                                       "response_format.json_schema",
                                       "response_format",
                                       "max_tokens",
                                       "messages"};
    static const char *const to[] = {".parameters", ".name",       ".description",
                                     "text.format", "text.format", "max_output_tokens",
                                     "input"};
    for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
        char *p = s;
        const size_t fl = strlen(from[i]), tl = strlen(to[i]);
        while ((p = strstr(p, from[i]))) {
            if (strlen(s) - fl + tl + 1 > cap)
                break;
            memmove(p + tl, p + fl, strlen(p + fl) + 1);
            memcpy(p, to[i], tl);
            p += tl;
        }
    }
}

/* The request's fields the answer repeats, with OpenAI's defaults. */
static json_t *echo_of(json_t *root)
{
    json_t *e = json_object();
    if (!e)
        return NULL;
    json_t *v;
    int bad = 0;
#define ECHO(key, dflt)                                                                            \
    bad |= json_object_set_new(e, key, (v = px_get(root, key)) ? json_incref(v) : (dflt))
    ECHO("instructions", json_null());
    ECHO("max_output_tokens", json_null());
    ECHO("metadata", json_object());
    ECHO("parallel_tool_calls", json_true());
    ECHO("previous_response_id", json_null());
    ECHO("store", json_true());
    ECHO("temperature", json_real(1.0));
    ECHO("top_p", json_real(1.0));
    ECHO("tool_choice", json_string("auto"));
    ECHO("tools", json_array());
    ECHO("truncation", json_string("disabled"));
    ECHO("user", json_null());
#undef ECHO
    json_t *text = px_get(root, "text");
    json_t *fmt = text ? px_get(text, "format") : NULL;
    json_t *t = json_object();
    bad |= !t;
    if (fmt) {
        bad |= json_object_set(t, "format", fmt);
    } else {
        json_t *f = json_object();
        bad |= !f || json_object_set_new(f, "type", json_string("text"));
        bad |= json_object_set_new(t, "format", f);
    }
    bad |= json_object_set_new(e, "text", t);
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

int proto_responses_parse(const char *body, size_t len, const proto_limits_t *lim,
                          proto_responses_req_t *out, proto_error_t *err)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    out->store = 1;
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    json_t *chat = to_chat(root, err, &rc);
    if (!chat) {
        json_decref(root);
        return rc;
    }
    json_t *v = px_get(root, "store");
    if (v)
        out->store = json_is_true(v);
    v = px_get(root, "previous_response_id");
    if (v) {
        if (json_string_length(v) == 0 || json_string_length(v) > PROTO_RESPONSE_ID_MAX) {
            json_decref(chat);
            json_decref(root);
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "previous_response_id",
                                   "'previous_response_id' must be a response id (1 to %d "
                                   "bytes)",
                                   PROTO_RESPONSE_ID_MAX);
        }
        memcpy(out->previous_id, json_string_value(v), json_string_length(v) + 1);
    }
    json_t *echo = echo_of(root);
    out->echo = echo ? px_dump(echo) : NULL;
    json_decref(root);
    char *text = px_dump(chat); /* reference stolen */
    if (!text || !out->echo) {
        px_free(text);
        proto_responses_free(out);
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    }
    rc = proto_chat_parse(text, strlen(text), lim, &out->chat, err);
    px_free(text);
    if (rc < 0) {
        responses_names(err->param, sizeof err->param);
        responses_names(err->message, sizeof err->message);
        px_free(out->echo);
        out->echo = NULL;
        return rc;
    }
    return 0;
}

void proto_responses_free(proto_responses_req_t *r)
{
    if (!r)
        return;
    proto_chat_free(&r->chat);
    px_free(r->echo);
    r->echo = NULL;
}

/* ---- answers ---- */

static json_t *message_item(const char *id, const char *status, const char *text, size_t len)
{
    json_t *m = json_object(), *c = json_array(), *p = json_object();
    int bad = !m || !c || !p;
    bad |= json_object_set_new(m, "id", px_cstr_or_null(id));
    bad |= json_object_set_new(m, "type", json_string("message"));
    bad |= json_object_set_new(m, "status", json_string(status));
    bad |= json_object_set_new(m, "role", json_string("assistant"));
    if (text) {
        bad |= json_object_set_new(p, "type", json_string("output_text"));
        bad |= json_object_set_new(p, "text", px_str(text, len));
        bad |= json_object_set_new(p, "annotations", json_array());
        bad |= json_object_set_new(p, "logprobs", json_array());
        bad |= json_array_append_new(c, p);
    } else {
        json_decref(p);
    }
    bad |= json_object_set_new(m, "content", c);
    if (bad) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static json_t *call_item(const proto_rsp_call_t *c, const char *status)
{
    json_t *m = json_object();
    int bad = !m;
    bad |= json_object_set_new(m, "id", px_cstr_or_null(c->id));
    bad |= json_object_set_new(m, "type", json_string("function_call"));
    bad |= json_object_set_new(m, "status", json_string(status));
    bad |= json_object_set_new(m, "call_id", px_cstr_or_null(c->call_id));
    bad |= json_object_set_new(m, "name", px_cstr_or_null(c->name));
    bad |= json_object_set_new(m, "arguments", px_str(c->arguments, c->arguments_len));
    if (bad) {
        json_decref(m);
        return NULL;
    }
    return m;
}

char *proto_responses_item_json(const proto_rsp_call_t *call, const char *msg_id,
                                const char *status, const char *text, size_t len)
{
    return px_dump(call ? call_item(call, status) : message_item(msg_id, status, text, len));
}

char *proto_responses_json(const proto_rsp_out_t *o)
{
    json_t *r = json_object();
    json_t *echo = o->echo ? json_loads(o->echo, 0, NULL) : json_object();
    json_t *out = json_array();
    int bad = !r || !json_is_object(echo) || !out;
    bad |= json_object_set_new(r, "id", px_cstr_or_null(o->id));
    bad |= json_object_set_new(r, "object", json_string("response"));
    bad |= json_object_set_new(r, "created_at", json_integer(o->created_at));
    bad |= json_object_set_new(r, "status", json_string(o->status ? o->status : "completed"));
    bad |= json_object_set_new(r, "background", json_false());
    if (o->error_message) {
        json_t *e = json_object();
        bad |= !e;
        bad |= json_object_set_new(e, "code",
                                   json_string(o->error_code ? o->error_code : "server_error"));
        bad |= json_object_set_new(e, "message", px_cstr_or_null(o->error_message));
        bad |= json_object_set_new(r, "error", e);
    } else {
        bad |= json_object_set_new(r, "error", json_null());
    }
    if (o->incomplete_reason) {
        json_t *d = json_object();
        bad |= !d || json_object_set_new(d, "reason", json_string(o->incomplete_reason));
        bad |= json_object_set_new(r, "incomplete_details", d);
    } else {
        bad |= json_object_set_new(r, "incomplete_details", json_null());
    }
    bad |= json_object_set_new(r, "model", px_cstr_or_null(o->model));
    if (o->has_message) {
        json_t *m = message_item(o->msg_id, o->item_status ? o->item_status : "completed",
                                 o->text ? o->text : "", o->text_len);
        bad |= !m || json_array_append_new(out, m);
    }
    for (size_t i = 0; i < o->n_calls; i++) {
        json_t *c = call_item(&o->calls[i], "completed");
        bad |= !c || json_array_append_new(out, c);
    }
    bad |= json_object_set_new(r, "output", out);
    out = NULL;
    if (o->with_usage) {
        json_t *u = json_object(), *id = json_object(), *od = json_object();
        bad |= !u || !id || !od;
        bad |= json_object_set_new(u, "input_tokens", json_integer(o->input_tokens));
        bad |= json_object_set_new(id, "cached_tokens", json_integer(o->cached_tokens));
        bad |= json_object_set_new(u, "input_tokens_details", id);
        bad |= json_object_set_new(u, "output_tokens", json_integer(o->output_tokens));
        bad |= json_object_set_new(od, "reasoning_tokens", json_integer(0));
        bad |= json_object_set_new(u, "output_tokens_details", od);
        bad |= json_object_set_new(u, "total_tokens",
                                   json_integer(o->input_tokens + o->output_tokens));
        bad |= json_object_set_new(r, "usage", u);
    } else {
        bad |= json_object_set_new(r, "usage", json_null());
    }
    if (!bad && echo)
        bad |= json_object_update(r, echo);
    json_decref(echo);
    json_decref(out);
    if (bad) {
        json_decref(r);
        return NULL;
    }
    return px_dump(r);
}

char *proto_responses_event(const proto_rsp_ev_t *ev, size_t *out_len)
{
    const char *t = ev->type;
    if (!t)
        return NULL;
    json_t *o = json_object();
    int bad = !o;
    bad |= json_object_set_new(o, "type", json_string(t));
    bad |= json_object_set_new(o, "sequence_number", json_integer(ev->seq));
    if (ev->response) {
        json_t *r = json_loads(ev->response, 0, NULL);
        bad |= !r || json_object_set_new(o, "response", r);
    }
    const int part = strstr(t, ".content_part.") != NULL;
    const int text_ev = strstr(t, ".output_text.") != NULL;
    const int args_ev = strstr(t, ".function_call_arguments.") != NULL;
    if (ev->item_id)
        bad |= json_object_set_new(o, "item_id", json_string(ev->item_id));
    if (ev->item || ev->item_id)
        bad |= json_object_set_new(o, "output_index", json_integer(ev->output_index));
    if (part || text_ev)
        bad |= json_object_set_new(o, "content_index", json_integer(ev->content_index));
    if (ev->item) {
        json_t *it = json_loads(ev->item, 0, NULL);
        bad |= !it || json_object_set_new(o, "item", it);
    }
    const int delta = strstr(t, ".delta") != NULL;
    if (part) {
        json_t *p = json_object();
        bad |= !p;
        bad |= json_object_set_new(p, "type", json_string("output_text"));
        bad |= json_object_set_new(p, "text", px_str(ev->text, ev->len));
        bad |= json_object_set_new(p, "annotations", json_array());
        bad |= json_object_set_new(p, "logprobs", json_array());
        bad |= json_object_set_new(o, "part", p);
    } else if (text_ev || args_ev) {
        bad |= json_object_set_new(o,
                                   delta     ? "delta"
                                   : text_ev ? "text"
                                             : "arguments",
                                   px_str(ev->text, ev->len));
        if (text_ev)
            bad |= json_object_set_new(o, "logprobs", json_array());
        if (args_ev && !delta && ev->name)
            bad |= json_object_set_new(o, "name", json_string(ev->name));
    }
    if (strcmp(t, "error") == 0) {
        bad |= json_object_set_new(o, "code", px_cstr_or_null(ev->code));
        bad |= json_object_set_new(o, "message", px_str(ev->text, ev->len));
        bad |= json_object_set_new(o, "param", px_cstr_or_null(ev->param));
    }
    char *j = bad ? NULL : px_dump(o);
    if (bad)
        json_decref(o);
    if (!j)
        return NULL;
    px_buf_t b = {0};
    px_buf_printf(&b, "event: %s\ndata: %s\n\n", t, j);
    px_free(j);
    if (b.failed) {
        px_free(b.p);
        return NULL;
    }
    if (out_len)
        *out_len = b.n;
    return b.p;
}
