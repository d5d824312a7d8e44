/* proto/parse.c — loading a request body and the field readers shared by every
 * request parser: numbers, integers, booleans, strings, messages, token ids and
 * the generation options common to completions, chat and session generate.
 *
 * Every message names the field the way a client wrote it ("messages[2].role")
 * and states the accepted range, so a 400 is enough to fix the request.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "proto/schema.h"

/* jansson would recurse up to its compile-time limit (2048) before we could
 * look at the tree: count brackets outside strings first. */
static int depth_exceeds(const char *b, size_t len, int max_depth)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = b[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return 1;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 0;
}

json_t *px_load_object(const char *body, size_t len, int allow_empty, proto_error_t *err,
                       int *rc)
{
    json_error_t jerr;
    json_t *root;

    if (len == 0 || !body) {
        if (allow_empty) {
            root = json_object();
            if (!root)
                *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return root;
        }
        *rc = proto_error_set(err, PROTO_ERR_INVALID_JSON, NULL,
                              "request body is empty; expected a JSON object");
        return NULL;
    }
    if (depth_exceeds(body, len, PROTO_MAX_JSON_DEPTH)) {
        *rc = proto_error_set(err, PROTO_ERR_INVALID_JSON, NULL,
                              "request body nests JSON deeper than %d levels",
                              PROTO_MAX_JSON_DEPTH);
        return NULL;
    }
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_out_of_memory) {
            *rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return NULL;
        }
        *rc = proto_error_set(err, PROTO_ERR_INVALID_JSON, NULL,
                              "request body is not valid JSON: %s (line %d, column %d)",
                              jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *rc = proto_error_set(err, PROTO_ERR_INVALID_JSON, NULL,
                              "request body must be a JSON object");
        return NULL;
    }
    return root;
}

void px_paramf(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, PROTO_ERROR_PARAM_MAX, fmt, ap);
    va_end(ap);
    if (n >= PROTO_ERROR_PARAM_MAX) /* cut: say so */
        memcpy(out + PROTO_ERROR_PARAM_MAX - 4, "...", 4);
}

json_t *px_get(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

int px_sampler_number(json_t *v, const char *param, double lo, double hi, int lo_open,
                      const char *range_text, double *out, proto_error_t *err)
{
    char got[PX_VALUE_TEXT_MAX];
    px_value_text(v, got);
    if (json_is_number(v)) {
        double d = json_number_value(v);
        float f = (float)d;
        int lo_ok = lo_open ? d > lo : d >= lo;
        int f_ok = isfinite(f) && (lo_open ? f > lo : f >= lo) && f <= hi;
        if (lo_ok && d <= hi && f_ok) {
            *out = d;
            return 0;
        }
        if (lo_ok && d <= hi)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                                   "'%s' must be a number %s (got %s, which is %g as the "
                                   "sampler's 32-bit float)",
                                   param, range_text, got, (double)f);
    }
    return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                           "'%s' must be a number %s (got %s)", param, range_text, got);
}

/* A sampler number field: 0 when read, 1 when absent (out untouched), <0 on
 * error (px_sampler_number). */
static int px_read_number(json_t *obj, const char *key, double lo, double hi, int lo_open,
                          const char *range_text, double *out, proto_error_t *err)
{
    json_t *v = px_get(obj, key);
    if (!v)
        return 1;
    return px_sampler_number(v, key, lo, hi, lo_open, range_text, out, err);
}

int px_read_int(json_t *obj, const char *key, int64_t lo, int64_t hi, const char *range_text,
                int64_t *out, proto_error_t *err)
{
    json_t *v = px_get(obj, key);
    if (!v)
        return 1;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i >= lo && i <= hi) {
            *out = (int64_t)i;
            return 0;
        }
    }
    char got[PX_VALUE_TEXT_MAX];
    px_value_text(v, got);
    return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                           "'%s' must be an integer %s (got %s)", key, range_text, got);
}

int px_read_prefix_id(json_t *obj, char *out, proto_error_t *err)
{
    out[0] = '\0';
    json_t *s = px_get(obj, "prefix");
    if (!s)
        return 0;
    if (!json_is_string(s) || !proto_prefix_id_valid(json_string_value(s), json_string_length(s)))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prefix",
                               "'prefix' must be a prefix id (\"pfx_\" and 24 lowercase hex "
                               "characters, from POST /v1/prefixes)");
    memcpy(out, json_string_value(s), PROTO_PREFIX_ID_LEN);
    out[PROTO_PREFIX_ID_LEN] = '\0';
    return 0;
}

int px_read_bool(json_t *obj, const char *key, int *out, proto_error_t *err)
{
    json_t *v = px_get(obj, key);
    if (!v)
        return 1;
    if (!json_is_boolean(v)) {
        char got[PX_VALUE_TEXT_MAX];
        px_value_text(v, got);
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                               "'%s' must be a boolean (got %s)", key, got);
    }
    *out = json_is_true(v);
    return 0;
}

int px_read_string(json_t *obj, const char *key, size_t max_bytes, char **out, size_t *out_len,
                   proto_error_t *err)
{
    json_t *v = px_get(obj, key);
    if (!v)
        return 1;
    if (!json_is_string(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key, "'%s' must be a string", key);
    size_t n = json_string_length(v);
    if (n > max_bytes)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                               "'%s' must be at most %zu bytes (got %zu)", key, max_bytes, n);
    char *s = px_strndup(json_string_value(v), n);
    if (!s)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    *out = s;
    if (out_len)
        *out_len = n;
    return 0;
}

void px_limits_resolve(const proto_limits_t *in, proto_limits_t *out)
{
    proto_limits_t z = {0};
    if (!in)
        in = &z;
    out->max_tokens_limit =
        in->max_tokens_limit > 0 ? in->max_tokens_limit : PROTO_DEFAULT_MAX_TOKENS_LIMIT;
    out->default_max_tokens =
        in->default_max_tokens > 0 ? in->default_max_tokens : PROTO_DEFAULT_MAX_TOKENS;
    if (out->default_max_tokens > out->max_tokens_limit)
        out->default_max_tokens = out->max_tokens_limit;
    out->n_vocab = in->n_vocab > 0 && in->n_vocab <= INT32_MAX ? in->n_vocab : INT32_MAX;
    out->max_prompt_tokens =
        in->max_prompt_tokens > 0 ? in->max_prompt_tokens : PROTO_DEFAULT_MAX_PROMPT_TOKENS;
    out->max_text_bytes = in->max_text_bytes > 0 ? in->max_text_bytes : PROTO_DEFAULT_MAX_TEXT_BYTES;
}

/* ------------------------------------------------------------- messages */

void px_messages_free(proto_message_t *m, size_t n)
{
    if (!m)
        return;
    for (size_t i = 0; i < n; i++) {
        px_free(m[i].content);
        px_free(m[i].tool_call_id);
        for (size_t k = 0; k < m[i].n_tool_calls; k++) {
            px_free(m[i].tool_calls[k].id);
            px_free(m[i].tool_calls[k].name);
            px_free(m[i].tool_calls[k].arguments);
        }
        px_free(m[i].tool_calls);
    }
    px_free(m);
}

static int parse_role(json_t *msg, const char *mp, proto_role_t *role, proto_error_t *err)
{
    char param[PROTO_ERROR_PARAM_MAX];
    px_paramf(param, "%s.role", mp);
    json_t *r = px_get(msg, "role");
    if (!r)
        return proto_error_set(err, PROTO_ERR_MISSING, param, "'%s' is required", param);
    const char *s = json_is_string(r) ? json_string_value(r) : "";
    if (json_is_string(r) && strlen(s) == json_string_length(r)) {
        if (!strcmp(s, "system") || !strcmp(s, "developer")) {
            *role = PROTO_ROLE_SYSTEM;
            return 0;
        }
        if (!strcmp(s, "user")) {
            *role = PROTO_ROLE_USER;
            return 0;
        }
        if (!strcmp(s, "assistant")) {
            *role = PROTO_ROLE_ASSISTANT;
            return 0;
        }
        if (!strcmp(s, "tool")) {
            *role = PROTO_ROLE_TOOL;
            return 0;
        }
        if (!strcmp(s, "function"))
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, param,
                                   "'%s' 'function' (the legacy function-calling API) is not "
                                   "supported; use 'tool' messages and 'tools'",
                                   param);
    }
    return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                           "'%s' must be one of 'system', 'developer', 'user', 'assistant', "
                           "'tool'",
                           param);
}

int px_tool_name_valid(const char *s, size_t n)
{
    if (n < 1 || n > PROTO_MAX_TOOL_NAME)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* One entry of an assistant message's "tool_calls" at path tp. */
static int parse_msg_tool_call(json_t *c, const char *tp, proto_msg_tool_call_t *out,
                               proto_error_t *err)
{
    char fp[PROTO_ERROR_PARAM_MAX];
    if (!json_is_object(c))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                               "'%s' must be an object {\"id\", \"type\": \"function\", "
                               "\"function\": {\"name\", \"arguments\"}}",
                               tp);
    json_t *id = px_get(c, "id"), *type = px_get(c, "type"), *fn = px_get(c, "function");
    px_paramf(fp, "%s.id", tp);
    if (id && (!json_is_string(id) || json_string_length(id) > PROTO_MAX_TOOL_CALL_ID))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be a string of at most %d bytes", fp,
                               PROTO_MAX_TOOL_CALL_ID);
    px_paramf(fp, "%s.type", tp);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be 'function'", fp);
    px_paramf(fp, "%s.function", tp);
    if (!json_is_object(fn))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be an object with 'name' and 'arguments'", fp);
    json_t *name = px_get(fn, "name"), *args = px_get(fn, "arguments");
    px_paramf(fp, "%s.function.name", tp);
    if (!json_is_string(name) ||
        !px_tool_name_valid(json_string_value(name), json_string_length(name)))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be a function name of 1 to %d characters a-z, A-Z, "
                               "0-9, '_' or '-'",
                               fp, PROTO_MAX_TOOL_NAME);
    px_paramf(fp, "%s.function.arguments", tp);
    char *a = NULL;
    size_t an = 0;
    if (!args) {
        a = px_strndup("{}", 2);
        an = 2;
    } else if (json_is_string(args)) {
        an = json_string_length(args);
        a = px_strndup(json_string_value(args), an);
    } else if (json_is_object(args)) {
        a = json_dumps(args, JSON_COMPACT); /* exact numbers, unlike px_dump */
        an = a ? strlen(a) : 0;
    } else {
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be a string (the arguments as JSON text)", fp);
    }
    out->id = px_strndup(id ? json_string_value(id) : "", id ? json_string_length(id) : 0);
    out->name = px_strndup(json_string_value(name), json_string_length(name));
    out->arguments = a;
    out->arguments_len = an;
    if (!out->id || !out->name || !a)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return 0;
}

/* "tool_calls" of message msg (role at *role) and "tool_call_id". */
static int parse_msg_tools(json_t *msg, const char *mp, proto_message_t *m, proto_error_t *err)
{
    char tp[PROTO_ERROR_PARAM_MAX];
    json_t *tc = px_get(msg, "tool_calls");
    px_paramf(tp, "%s.tool_calls", mp);
    if (tc && !json_is_array(tc))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp, "'%s' must be an array", tp);
    size_t nc = tc ? json_array_size(tc) : 0;
    if (nc && m->role != PROTO_ROLE_ASSISTANT)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                               "'%s' is only allowed in 'assistant' messages", tp);
    if (nc > PROTO_MAX_MSG_TOOL_CALLS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                               "'%s' has %zu calls; at most %d are allowed", tp, nc,
                               PROTO_MAX_MSG_TOOL_CALLS);
    if (nc) {
        m->tool_calls = px_malloc(nc * sizeof *m->tool_calls);
        if (!m->tool_calls)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        memset(m->tool_calls, 0, nc * sizeof *m->tool_calls);
        m->n_tool_calls = nc;
        for (size_t k = 0; k < nc; k++) {
            char cp[PROTO_ERROR_PARAM_MAX];
            px_paramf(cp, "%s[%zu]", tp, k);
            int rc = parse_msg_tool_call(json_array_get(tc, k), cp, &m->tool_calls[k], err);
            if (rc < 0)
                return rc;
        }
    }
    json_t *id = px_get(msg, "tool_call_id");
    if (id) {
        px_paramf(tp, "%s.tool_call_id", mp);
        if (m->role != PROTO_ROLE_TOOL)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                                   "'%s' is only allowed in 'tool' messages", tp);
        if (!json_is_string(id) || json_string_length(id) > PROTO_MAX_TOOL_CALL_ID)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                                   "'%s' must be a string of at most %d bytes", tp,
                                   PROTO_MAX_TOOL_CALL_ID);
        m->tool_call_id = px_strndup(json_string_value(id), json_string_length(id));
        if (!m->tool_call_id)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    }
    return 0;
}

/* content: a string, or an array of {"type":"text","text":...} joined by "\n". */
static int parse_content(json_t *msg, const char *mp, int64_t max_text, char **out,
                         size_t *out_len, proto_error_t *err)
{
    char param[PROTO_ERROR_PARAM_MAX];
    px_paramf(param, "%s.content", mp);
    json_t *c = px_get(msg, "content");
    if (!c)
        return proto_error_set(err, PROTO_ERR_MISSING, param, "'%s' is required", param);
    if (json_is_string(c)) {
        size_t n = json_string_length(c);
        if ((int64_t)n > max_text)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                                   "'%s' must be at most %lld bytes", param,
                                   (long long)max_text);
        *out = px_strndup(json_string_value(c), n);
        if (!*out)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        *out_len = n;
        return 0;
    }
    if (!json_is_array(c))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' must be a string or an array of text parts", param);
    size_t np = json_array_size(c);
    if (np > PROTO_MAX_CONTENT_PARTS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' has %zu parts; at most %d are allowed", param, np,
                               PROTO_MAX_CONTENT_PARTS);
    size_t total = 0;
    for (size_t j = 0; j < np; j++) {
        char pp[PROTO_ERROR_PARAM_MAX], tp[PROTO_ERROR_PARAM_MAX];
        px_paramf(pp, "%s[%zu]", param, j);
        json_t *part = json_array_get(c, j);
        if (!json_is_object(part))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, pp,
                                   "'%s' must be an object {\"type\": \"text\", \"text\": ...}",
                                   pp);
        px_paramf(tp, "%s.type", pp);
        json_t *type = px_get(part, "type");
        if (!json_is_string(type))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                                   "'%s' must be the string 'text'", tp);
        if (strcmp(json_string_value(type), "text") != 0)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, tp,
                                   "'%s' '%.40s' is not supported; only 'text' parts are", tp,
                                   json_string_value(type));
        px_paramf(tp, "%s.text", pp);
        json_t *text = px_get(part, "text");
        if (!json_is_string(text))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp, "'%s' must be a string",
                                   tp);
        total += json_string_length(text) + (j > 0);
        if ((int64_t)total > max_text)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                                   "'%s' must be at most %lld bytes", param,
                                   (long long)max_text);
    }
    char *s = px_malloc(total + 1);
    if (!s)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    size_t o = 0;
    for (size_t j = 0; j < np; j++) {
        json_t *text = json_object_get(json_array_get(c, j), "text");
        size_t n = json_string_length(text);
        if (j > 0)
            s[o++] = '\n';
        memcpy(s + o, json_string_value(text), n);
        o += n;
    }
    s[o] = '\0';
    *out = s;
    *out_len = o;
    return 0;
}

int px_parse_messages(json_t *v, const char *param, int64_t max_text, proto_message_t **out,
                      size_t *n, proto_error_t *err)
{
    *out = NULL;
    *n = 0;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' must be a non-empty array of messages", param);
    size_t count = json_array_size(v);
    if (count > PROTO_MAX_MESSAGES)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' has %zu messages; at most %d are allowed", param, count,
                               PROTO_MAX_MESSAGES);
    proto_message_t *m = px_malloc(count * sizeof *m);
    if (!m)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(m, 0, count * sizeof *m);
    int64_t total = 0;
    int rc = 0;
    size_t i;
    for (i = 0; i < count; i++) {
        char mp[PROTO_ERROR_PARAM_MAX];
        px_paramf(mp, "%s[%zu]", param, i);
        json_t *msg = json_array_get(v, i);
        if (!json_is_object(msg)) {
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, mp,
                                 "'%s' must be an object with 'role' and 'content'", mp);
            goto fail;
        }
        if ((rc = parse_role(msg, mp, &m[i].role, err)) < 0)
            goto fail;
        if ((rc = parse_msg_tools(msg, mp, &m[i], err)) < 0)
            goto fail;
        if (m[i].n_tool_calls && !px_get(msg, "content")) {
            /* an assistant turn of calls only: "content" null or absent */
            if (!(m[i].content = px_strndup("", 0))) {
                rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
                goto fail;
            }
        } else if ((rc = parse_content(msg, mp, max_text, &m[i].content, &m[i].content_len,
                                       err)) < 0) {
            goto fail;
        }
        for (size_t k = 0; k < m[i].n_tool_calls; k++)
            total += (int64_t)m[i].tool_calls[k].arguments_len;
        total += (int64_t)m[i].content_len;
        if (total > max_text) {
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                                 "'%s' content must total at most %lld bytes", param,
                                 (long long)max_text);
            goto fail;
        }
    }
    *out = m;
    *n = count;
    return 0;
fail:
    px_messages_free(m, count);
    return rc;
}

/* ------------------------------------------------------------ token ids */

int px_parse_token_ids(json_t *arr, const char *param, int64_t max_count, int64_t n_vocab,
                       int allow_empty, int32_t **out, size_t *n, proto_error_t *err)
{
    size_t count = json_array_size(arr);
    *out = NULL;
    *n = 0;
    if (count == 0) {
        if (allow_empty)
            return 0;
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' must not be an empty array", param);
    }
    if ((int64_t)count > max_count)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                               "'%s' has %zu token ids; at most %lld are allowed", param, count,
                               (long long)max_count);
    int32_t *t = px_malloc(count * sizeof *t);
    if (!t)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        json_t *v = json_array_get(arr, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= n_vocab) {
            char ep[PROTO_ERROR_PARAM_MAX];
            px_paramf(ep, "%s[%zu]", param, i);
            px_free(t);
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s' must be a token id between 0 and %lld", ep,
                                   (long long)(n_vocab - 1));
        }
        t[i] = (int32_t)id;
    }
    *out = t;
    *n = count;
    return 0;
}

/* ----------------------------------------------------- generation options */

void px_gen_params_free(proto_gen_params_t *p)
{
    if (!p)
        return;
    px_free(p->model);
    for (size_t i = 0; i < p->n_stop; i++)
        px_free(p->stop[i]);
    px_free(p->grammar);
    px_free(p->logit_bias);
    memset(p, 0, sizeof *p);
}

static int parse_stop(json_t *root, proto_gen_params_t *p, proto_error_t *err)
{
    json_t *v = px_get(root, "stop");
    if (!v)
        return 0;
    json_t *one[1] = {v};
    size_t count = 1;
    if (json_is_array(v)) {
        count = json_array_size(v);
        if (count > PROTO_MAX_STOP)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "stop",
                                   "'stop' must be a string or an array of at most %d strings",
                                   PROTO_MAX_STOP);
    } else if (!json_is_string(v)) {
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "stop",
                               "'stop' must be a string or an array of at most %d strings",
                               PROTO_MAX_STOP);
    }
    for (size_t i = 0; i < count; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        char ep[PROTO_ERROR_PARAM_MAX];
        if (json_is_array(v))
            px_paramf(ep, "stop[%zu]", i);
        else
            px_paramf(ep, "stop");
        size_t n = json_is_string(s) ? json_string_length(s) : 0;
        if (!json_is_string(s) || n == 0 || n > PROTO_MAX_STOP_BYTES)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s' must be a string of 1 to %d bytes", ep,
                                   PROTO_MAX_STOP_BYTES);
        p->stop[p->n_stop] = px_strndup(json_string_value(s), n);
        if (!p->stop[p->n_stop])
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        p->n_stop++;
    }
    return 0;
}

static int parse_max_tokens(json_t *root, const proto_limits_t *lim, proto_gen_params_t *p,
                            proto_error_t *err)
{
    char range[PROTO_ERROR_PARAM_MAX]; /* px_paramf writes that much */
    int64_t a = 0, b = 0;
    px_paramf(range, "between 1 and %lld", (long long)lim->max_tokens_limit);
    int ra = px_read_int(root, "max_tokens", 1, lim->max_tokens_limit, range, &a, err);
    if (ra < 0)
        return ra;
    int rb = px_read_int(root, "max_completion_tokens", 1, lim->max_tokens_limit, range, &b, err);
    if (rb < 0)
        return rb;
    if (ra == 0 && rb == 0 && a != b)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "max_completion_tokens",
                               "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) differ; "
                               "give one of them",
                               (long long)a, (long long)b);
    p->max_tokens = rb == 0 ? b : ra == 0 ? a : lim->default_max_tokens;
    return 0;
}

static int parse_sampling(json_t *root, proto_sampling_t *s, proto_error_t *err)
{
    int rc;
    int64_t i64 = 0;
    if ((rc = px_read_number(root, "temperature", 0, 2, 0, "between 0 and 2", &s->temperature,
                             err)) < 0)
        return rc;
    if ((rc = px_read_number(root, "top_p", 0, 1, 1, "greater than 0 and at most 1", &s->top_p,
                             err)) < 0)
        return rc;
    if ((rc = px_read_number(root, "min_p", 0, 1, 0, "between 0 and 1", &s->min_p, err)) < 0)
        return rc;
    if ((rc = px_read_number(root, "repeat_penalty", 0, FLT_MAX, 1, PX_REPEAT_PENALTY_RANGE,
                             &s->repeat_penalty, err)) < 0)
        return rc;
    if ((rc = px_read_number(root, "presence_penalty", -2, 2, 0, "between -2 and 2",
                             &s->presence_penalty, err)) < 0)
        return rc;
    if ((rc = px_read_number(root, "frequency_penalty", -2, 2, 0, "between -2 and 2",
                             &s->frequency_penalty, err)) < 0)
        return rc;
    rc = px_read_int(root, "top_k", 0, INT32_MAX, "of at least 0 (0 disables it)", &i64, err);
    if (rc < 0)
        return rc;
    if (rc == 0)
        s->top_k = (int32_t)i64;
    rc = px_read_int(root, "seed", INT64_MIN, INT64_MAX, "(a 64-bit signed integer)", &i64, err);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        s->has_seed = 1;
        s->seed = i64;
    }
    return 0;
}

static int parse_logprobs(json_t *root, enum px_gen_kind kind, proto_gen_params_t *p,
                          proto_error_t *err)
{
    int rc;
    int64_t i64 = 0;
    char range[PROTO_ERROR_PARAM_MAX]; /* px_paramf writes that much */
    px_paramf(range, "between 0 and %d", PROTO_MAX_LOGPROBS);
    if (kind != PX_GEN_CHAT) {
        rc = px_read_int(root, "logprobs", 0, PROTO_MAX_LOGPROBS, range, &i64, err);
        if (rc < 0)
            return rc;
        if (rc == 0)
            p->logprobs = (int)i64;
        return 0;
    }
    int want = 0;
    if ((rc = px_read_bool(root, "logprobs", &want, err)) < 0)
        return rc;
    rc = px_read_int(root, "top_logprobs", 0, PROTO_MAX_LOGPROBS, range, &i64, err);
    if (rc < 0)
        return rc;
    if (rc == 0 && !want)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "top_logprobs",
                               "'top_logprobs' requires 'logprobs' to be true");
    if (want)
        p->logprobs = rc == 0 ? (int)i64 : 0;
    return 0;
}

/* "logit_bias": {"<token id>": bias, ...}, as OpenAI: ids as decimal strings
 * (no sign, no leading zeros), each < n_vocab, biases in [-100, 100]. */
static int parse_logit_bias(json_t *root, const proto_limits_t *lim, proto_gen_params_t *p,
                            proto_error_t *err)
{
    json_t *v = px_get(root, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "logit_bias",
                               "'logit_bias' must be an object mapping token ids to biases "
                               "between -100 and 100");
    size_t n = json_object_size(v);
    if (n == 0)
        return 0;
    if (n > PROTO_MAX_LOGIT_BIAS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "logit_bias",
                               "'logit_bias' has %zu entries; at most %d are allowed", n,
                               PROTO_MAX_LOGIT_BIAS);
    p->logit_bias = px_malloc(n * sizeof *p->logit_bias);
    if (!p->logit_bias)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    const int64_t vocab = lim->n_vocab > 0 ? lim->n_vocab : INT32_MAX;
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b)
    {
        char ep[PROTO_ERROR_PARAM_MAX];
        px_paramf(ep, "logit_bias.%.40s", key);
        size_t kl = strlen(key);
        int64_t id = 0;
        int ok = kl >= 1 && kl <= 10 && (key[0] != '0' || kl == 1);
        for (size_t i = 0; ok && i < kl; i++) {
            ok = key[i] >= '0' && key[i] <= '9';
            id = id * 10 + (key[i] - '0');
        }
        if (!ok)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s': the key is not a token id (a decimal integer without "
                                   "sign or leading zeros)",
                                   ep);
        if (id >= vocab)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s': token id %lld is not in the vocabulary (ids are 0 to "
                                   "%lld)",
                                   ep, (long long)id, (long long)vocab - 1);
        double x = json_is_number(b) ? json_number_value(b) : NAN;
        if (!(x >= -100.0 && x <= 100.0))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s' must be a number between -100 and 100", ep);
        p->logit_bias[p->n_logit_bias++] = (proto_logit_bias_t){(int32_t)id, (float)x};
    }
    return 0;
}

/* "response_format": {"type": "text"} (no constraint), {"type": "json_object"}
 * (any JSON object) or {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}}: the last two become the request's grammar
 * (proto/schema.h), so they cannot come with a "grammar" of their own. */
static int parse_response_format(json_t *root, proto_gen_params_t *p, proto_error_t *err)
{
    json_t *v = px_get(root, "response_format");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "response_format",
                               "'response_format' must be an object like {\"type\": \"text\"}");
    json_t *t = px_get(v, "type");
    if (!json_is_string(t))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "response_format.type",
                               "'response_format.type' must be a string");
    const char *type = json_string_value(t);
    if (!strcmp(type, "text"))
        return 0;
    int object = !strcmp(type, "json_object");
    if (!object && strcmp(type, "json_schema") != 0)
        return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "response_format.type",
                               "'response_format.type' '%.40s' is not supported; 'text', "
                               "'json_object' and 'json_schema' are",
                               type);
    if (p->grammar)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "grammar",
                               "'grammar' and 'response_format' of type '%s' cannot be given "
                               "together",
                               type);
    int rc;
    json_t *bare = px_get(v, "schema"); /* llama.cpp's form: the schema beside the type */
    if (bare && (object || !px_get(v, "json_schema"))) {
        rc = proto_schema_grammar(bare, "response_format.schema", "response_format.schema",
                                  &p->grammar, &p->grammar_len, err);
    } else if (object) {
        rc = proto_schema_object_grammar(&p->grammar, &p->grammar_len, err);
    } else {
        json_t *js = px_get(v, "json_schema");
        if (!js)
            return proto_error_set(err, PROTO_ERR_MISSING, "response_format.json_schema",
                                   "'response_format.json_schema' is required when the type "
                                   "is 'json_schema'");
        if (!json_is_object(js))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "response_format.json_schema",
                                   "'response_format.json_schema' must be an object with "
                                   "'name' and 'schema'");
        json_t *name = px_get(js, "name"), *strict = px_get(js, "strict");
        if (name && (!json_is_string(name) || json_string_length(name) > 64))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE,
                                   "response_format.json_schema.name",
                                   "'response_format.json_schema.name' must be a string of at "
                                   "most 64 characters");
        if (strict && !json_is_boolean(strict))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE,
                                   "response_format.json_schema.strict",
                                   "'response_format.json_schema.strict' must be a boolean");
        json_t *schema = px_get(js, "schema");
        if (!schema)
            return proto_error_set(err, PROTO_ERR_MISSING, "response_format.json_schema.schema",
                                   "'response_format.json_schema.schema' is required");
        rc = proto_schema_grammar(schema, "response_format.json_schema.schema",
                                  "response_format.json_schema.schema", &p->grammar,
                                  &p->grammar_len, err);
    }
    if (rc == 0)
        p->grammar_param = "response_format";
    return rc;
}

/* "json_schema" (llama.cpp's field): a JSON Schema the reply follows, as
 * response_format's; it cannot come with another grammar. */
static int parse_json_schema(json_t *root, proto_gen_params_t *p, proto_error_t *err)
{
    json_t *v = px_get(root, "json_schema");
    if (!v)
        return 0;
    if (p->grammar)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "json_schema",
                               "'json_schema' and '%s' cannot be given together", p->grammar_param);
    int rc =
        proto_schema_grammar(v, "json_schema", "json_schema", &p->grammar, &p->grammar_len, err);
    if (rc == 0)
        p->grammar_param = "json_schema";
    return rc;
}

int px_parse_gen_params(json_t *root, const proto_limits_t *lim, enum px_gen_kind kind,
                        proto_gen_params_t *p, proto_error_t *err)
{
    int rc;
    char *user = NULL;
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->logprobs = -1;
    p->stream = kind == PX_GEN_GENERATE;
    p->sampling.temperature = 1.0;
    p->sampling.top_p = 1.0;
    p->sampling.repeat_penalty = 1.0;

    if ((rc = px_read_string(root, "model", PROTO_MAX_NAME_BYTES, &p->model, NULL, err)) < 0)
        return rc;
    /* "user" is accepted for OpenAI compatibility and not used. */
    if ((rc = px_read_string(root, "user", PROTO_MAX_NAME_BYTES, &user, NULL, err)) < 0)
        return rc;
    px_free(user);
    if ((rc = parse_max_tokens(root, lim, p, err)) < 0)
        return rc;
    if ((rc = parse_sampling(root, &p->sampling, err)) < 0)
        return rc;
    if (kind != PX_GEN_GENERATE) {
        int64_t n = 1;
        rc = px_read_int(root, "n", 1, PROTO_MAX_N, "between 1 and 16", &n, err);
        if (rc < 0)
            return rc;
        p->n = (int)n;
    }
    if ((rc = parse_stop(root, p, err)) < 0)
        return rc;
    if ((rc = px_read_bool(root, "stream", &p->stream, err)) < 0)
        return rc;
    json_t *so = px_get(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "stream_options",
                                   "'stream_options' must be an object");
        json_t *iu = px_get(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "stream_options.include_usage",
                                   "'stream_options.include_usage' must be a boolean");
        p->include_usage = json_is_true(iu); /* NULL-safe: false when absent */
    }
    if ((rc = parse_logprobs(root, kind, p, err)) < 0)
        return rc;
    if (kind != PX_GEN_GENERATE) {
        json_t *s = px_get(root, "session");
        if (s) {
            if (!json_is_string(s) ||
                !proto_session_id_valid(json_string_value(s), json_string_length(s)))
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "session",
                                       "'session' must be a session id (%d lowercase hex "
                                       "characters)",
                                       PROTO_SESSION_ID_LEN);
            memcpy(p->session, json_string_value(s), PROTO_SESSION_ID_LEN);
            p->session[PROTO_SESSION_ID_LEN] = '\0';
        }
        if ((rc = px_read_prefix_id(root, p->prefix, err)) < 0)
            return rc;
    }
    if ((rc = parse_logit_bias(root, lim, p, err)) < 0)
        return rc;
    if ((rc = px_read_string(root, "grammar", PROTO_MAX_GRAMMAR_BYTES, &p->grammar,
                             &p->grammar_len, err)) < 0)
        return rc;
    if (p->grammar && p->grammar_len == 0) {
        px_free(p->grammar);
        p->grammar = NULL;
    }
    if (p->grammar)
        p->grammar_param = "grammar";
    if ((rc = parse_response_format(root, p, err)) < 0)
        return rc;
    return parse_json_schema(root, p, err);
}

/* The string of key in root into out[outlen]: 1, 0 (absent, empty, not a
 * string), -1 (does not fit, or holds a NUL). */
static int peek_key(json_t *root, const char *key, char *out, size_t outlen)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_string(v) || json_string_length(v) == 0)
        return 0;
    size_t n = json_string_length(v);
    if (n >= outlen || memchr(json_string_value(v), '\0', n))
        return -1;
    memcpy(out, json_string_value(v), n + 1);
    return 1;
}

int proto_peek_strings(const char *body, size_t len, const char *const *keys, size_t n_keys,
                       char *const *out, size_t outlen, int *found)
{
    for (size_t i = 0; i < n_keys; i++) {
        out[i][0] = '\0';
        found[i] = 0;
    }
    proto_error_t e;
    int rc = 0;
    json_t *root = px_load_object(body, len, 0, &e, &rc);
    if (!root)
        return -1;
    for (size_t i = 0; i < n_keys; i++)
        found[i] = peek_key(root, keys[i], out[i], outlen);
    json_decref(root);
    return 0;
}

int proto_peek_model(const char *body, size_t len, const char *fallback, char *out,
                     size_t outlen)
{
    const char *keys[2] = {"model", fallback};
    char other[PROTO_MAX_NAME_BYTES + 1];
    char *outs[2] = {out, other};
    int found[2];
    if (proto_peek_strings(body, len, keys, fallback ? 2 : 1, outs,
                           outlen < sizeof other ? outlen : sizeof other, found) < 0)
        return 0;
    if (found[0] || !fallback)
        return found[0];
    if (found[1] > 0)
        memcpy(out, other, strlen(other) + 1);
    return found[1];
}
