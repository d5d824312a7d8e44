/* test_proto_response.c — response builders, error objects and stream framing:
 * every builder's output parses back (jansson) with exactly the field names and
 * JSON types of the contract in docs/API.md; framing is byte-exact; strings
 * with invalid UTF-8 or NUL still give valid JSON. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/check.h"

/* Parses text (allowing \u0000 so NUL round trips can be checked). */
static json_t *parse(const char *text)
{
    json_error_t e;
    CHECK_MSG(text != NULL, "builder returned NULL");
    if (!text)
        return NULL;
    CHECK_MSG(strchr(text, '\n') == NULL, "builder output has a newline: %s", text);
    json_t *j = json_loads(text, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &e);
    CHECK_MSG(j != NULL, "output is not JSON (%s): %s", e.text, text);
    return j;
}

/* Checks that obj has exactly the keys given as "name:type" strings, type one
 * of s (string), i (integer), r (real), n (number), b (bool), o (object),
 * a (array), z (null), S (string or null), O (object or null). */
static void check_shape(json_t *obj, const char *what, ...)
{
    va_list ap;
    size_t count = 0;
    CHECK_MSG(json_is_object(obj), "%s is not an object", what);
    if (!json_is_object(obj))
        return;
    va_start(ap, what);
    const char *spec;
    while ((spec = va_arg(ap, const char *))) {
        char key[64];
        const char *colon = strchr(spec, ':');
        size_t kl = (size_t)(colon - spec);
        memcpy(key, spec, kl);
        key[kl] = '\0';
        char t = colon[1];
        json_t *v = json_object_get(obj, key);
        int ok = 0;
        switch (t) {
        case 's': ok = json_is_string(v); break;
        case 'i': ok = json_is_integer(v); break;
        case 'r': ok = json_is_real(v); break;
        case 'n': ok = json_is_number(v); break;
        case 'b': ok = json_is_boolean(v); break;
        case 'o': ok = json_is_object(v); break;
        case 'a': ok = json_is_array(v); break;
        case 'z': ok = json_is_null(v); break;
        case 'S': ok = json_is_string(v) || json_is_null(v); break;
        case 'O': ok = json_is_object(v) || json_is_null(v); break;
        }
        CHECK_MSG(ok, "%s.%s missing or not of type %c", what, key, t);
        count++;
    }
    va_end(ap);
    CHECK_MSG(json_object_size(obj) == count, "%s has %zu keys, expected %zu", what,
              json_object_size(obj), count);
}

static const char *sget(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static long long iget(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static double nget(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

/* ------------------------------------------------------------- errors */

TEST(error_table_matches_contract)
{
    /* docs/API.md, "Errors": status, type, code per kind. */
    static const struct {
        proto_errkind_t kind;
        int status;
        const char *type, *code;
    } want[] = {
        {PROTO_ERR_INVALID_JSON, 400, "invalid_request_error", "invalid_json"},
        {PROTO_ERR_INVALID_VALUE, 400, "invalid_request_error", "invalid_value"},
        {PROTO_ERR_MISSING, 400, "invalid_request_error", "missing_required_parameter"},
        {PROTO_ERR_UNSUPPORTED, 400, "invalid_request_error", "unsupported_parameter"},
        {PROTO_ERR_CONTEXT_LENGTH, 400, "invalid_request_error", "context_length_exceeded"},
        {PROTO_ERR_AUTH, 401, "authentication_error", "invalid_api_key"},
        {PROTO_ERR_NOT_FOUND, 404, "not_found_error", "not_found"},
        {PROTO_ERR_SESSION_NOT_FOUND, 404, "not_found_error", "session_not_found"},
        {PROTO_ERR_MODEL_NOT_FOUND, 404, "not_found_error", "model_not_found"},
        {PROTO_ERR_METHOD, 405, "invalid_request_error", "method_not_allowed"},
        {PROTO_ERR_CONFLICT, 409, "conflict_error", "session_busy"},
        {PROTO_ERR_TOO_LARGE, 413, "invalid_request_error", "request_too_large"},
        {PROTO_ERR_MEDIA_TYPE, 415, "invalid_request_error", "unsupported_media_type"},
        {PROTO_ERR_RATE_LIMIT, 429, "rate_limit_error", "rate_limit_exceeded"},
        {PROTO_ERR_INTERNAL, 500, "server_error", "internal_error"},
        {PROTO_ERR_UNAVAILABLE, 503, "server_error", "service_unavailable"},
        {PROTO_ERR_STORAGE, 507, "server_error", "insufficient_storage"},
    };
    CHECK_INT_EQ(sizeof want / sizeof want[0], PROTO_ERR_KIND_COUNT_);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        proto_error_t e;
        int rc = proto_error_set(&e, want[i].kind, NULL, "x");
        CHECK_INT_EQ(rc, want[i].kind == PROTO_ERR_INTERNAL ? PROTO_ENOMEM : PROTO_EINVAL);
        CHECK_INT_EQ(e.status, want[i].status);
        CHECK_STR_EQ(e.type, want[i].type);
        CHECK_STR_EQ(e.code, want[i].code);
    }
    /* a kind outside the table is the internal error's row */
    proto_error_t ex;
    CHECK_INT_EQ(proto_error_set(&ex, (proto_errkind_t)999, NULL, "x"), PROTO_ENOMEM);
    CHECK_INT_EQ(ex.status, 500);
    CHECK_STR_EQ(ex.type, "server_error");
    CHECK_STR_EQ(ex.code, "internal_error");
    CHECK_INT_EQ(proto_error_set(NULL, PROTO_ERR_NOT_FOUND, "x", "y"), PROTO_EINVAL);
}

TEST(error_json_shape)
{
    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, "temperature",
                    "'temperature' must be a number between 0 and 2");
    char *s = proto_error_json(&e);
    CHECK_STR_EQ(s, "{\"error\":{\"message\":\"'temperature' must be a number between 0 and "
                    "2\",\"type\":\"invalid_request_error\",\"param\":\"temperature\",\"code\":"
                    "\"invalid_value\"}}");
    proto_free(s);

    /* no param -> null; code NULL -> null */
    proto_error_set(&e, PROTO_ERR_SESSION_NOT_FOUND, NULL, "session %s not found", "abc");
    e.code = NULL;
    s = proto_error_json(&e);
    json_t *j = parse(s);
    json_t *in = json_object_get(j, "error");
    check_shape(j, "root", "error:o", NULL);
    check_shape(in, "error", "message:s", "type:s", "param:z", "code:z", NULL);
    CHECK_STR_EQ(sget(in, "message"), "session abc not found");
    CHECK_STR_EQ(sget(in, "type"), "not_found_error");
    json_decref(j);
    proto_free(s);

    /* a message carrying an invalid byte and a quote still gives valid JSON */
    proto_error_set(&e, PROTO_ERR_INVALID_JSON, "", "bad near '\xff\"' here");
    s = proto_error_json(&e);
    j = parse(s);
    CHECK_STR_EQ(sget(json_object_get(j, "error"), "message"), "bad near '\xEF\xBF\xBD\"' here");
    CHECK(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
    proto_free(s);

    /* a message cut by the buffer ends with "..." (the cut is said); a
     * character it cuts in half is repaired to U+FFFD in the JSON */
    char big[700];
    memset(big, 'a', sizeof big);
    strcpy(big + PROTO_ERROR_MSG_MAX - 3, "\xe2\x82\xac tail");
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, "p", "%s", big);
    CHECK_INT_EQ(strlen(e.message), PROTO_ERROR_MSG_MAX - 1);
    s = proto_error_json(&e);
    j = parse(s);
    const char *m = sget(json_object_get(j, "error"), "message");
    CHECK(m && strlen(m) == PROTO_ERROR_MSG_MAX - 1); /* 508 'a' + "..." */
    CHECK(m && !strcmp(m + strlen(m) - 4, "a..."));
    json_decref(j);
    proto_free(s);
    strcpy(big + PROTO_ERROR_MSG_MAX - 5, "\xe2\x82\xac tail"); /* the "..." cuts the euro */
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, "p", "%s", big);
    s = proto_error_json(&e);
    j = parse(s);
    m = sget(json_object_get(j, "error"), "message");
    CHECK(m && !strcmp(m + strlen(m) - 6, "\xEF\xBF\xBD..."));
    json_decref(j);
    proto_free(s);

    /* param truncated to fit */
    char longp[200];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    proto_error_set(&e, PROTO_ERR_INVALID_VALUE, longp, "m");
    CHECK_INT_EQ(strlen(e.param), PROTO_ERROR_PARAM_MAX - 1);
    CHECK(!strcmp(e.param + PROTO_ERROR_PARAM_MAX - 4, "...")); /* said to be cut */
}

/* -------------------------------------------------------- completions */

static const proto_top_logprob_t tops0[] = {
    {"Hello", 5, 100, -0.25}, {"Hi", 2, 101, -1.5}, {"Hello", 5, 102, -3.0}};
static const proto_token_logprob_t lps0[] = {
    {"Hello", 5, 100, -0.25, 0, tops0, 3},
    {" wor\xe2\x82", 6, 200, -INFINITY, 5, NULL, 0},
};

TEST(completion_response_shape)
{
    proto_resp_meta_t meta = {"cmpl-1", 1700000000, "smollm2", NULL};
    proto_choice_t ch[2] = {
        {0, "Hello wor\xe2\x82", 11, "length", 1, lps0, 2},
        {1, "x", 1, "stop", 0, NULL, 0},
    };
    proto_usage_t u = {7, 3};
    char *s = proto_completion_json(&meta, ch, 2, &u);
    json_t *j = parse(s);
    check_shape(j, "completion", "id:s", "object:s", "created:i", "model:s", "choices:a",
                "usage:o", NULL);
    CHECK_STR_EQ(sget(j, "object"), "text_completion");
    CHECK_STR_EQ(sget(j, "id"), "cmpl-1");
    CHECK_INT_EQ(iget(j, "created"), 1700000000);
    json_t *us = json_object_get(j, "usage");
    check_shape(us, "usage", "prompt_tokens:i", "completion_tokens:i", "total_tokens:i", NULL);
    CHECK_INT_EQ(iget(us, "total_tokens"), 10);
    json_t *choices = json_object_get(j, "choices");
    CHECK_INT_EQ(json_array_size(choices), 2);
    json_t *c0 = json_array_get(choices, 0), *c1 = json_array_get(choices, 1);
    check_shape(c0, "choice0", "index:i", "text:s", "logprobs:o", "finish_reason:s", NULL);
    check_shape(c1, "choice1", "index:i", "text:s", "logprobs:z", "finish_reason:s", NULL);
    CHECK_STR_EQ(sget(c0, "text"), "Hello wor\xEF\xBF\xBD");
    CHECK_STR_EQ(sget(c0, "finish_reason"), "length");
    CHECK_INT_EQ(iget(c1, "index"), 1);
    json_t *lp = json_object_get(c0, "logprobs");
    check_shape(lp, "logprobs", "tokens:a", "token_logprobs:a", "top_logprobs:a",
                "text_offset:a", NULL);
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(lp, "tokens"), 1)),
                 " wor\xEF\xBF\xBD");
    json_t *tl = json_object_get(lp, "token_logprobs");
    CHECK_NEAR(json_number_value(json_array_get(tl, 0)), -0.25, 0);
    CHECK_NEAR(json_number_value(json_array_get(tl, 1)), -9999.0, 0);
    json_t *top0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    /* dict keyed by piece; the duplicate "Hello" keeps the better logprob */
    CHECK_INT_EQ(json_object_size(top0), 2);
    CHECK_NEAR(nget(top0, "Hello"), -0.25, 0);
    CHECK_NEAR(nget(top0, "Hi"), -1.5, 0);
    CHECK_INT_EQ(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 1)), 0);
    CHECK_INT_EQ(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), 5);
    json_decref(j);
    proto_free(s);
}

TEST(completion_logprob_keys_without_nul)
{
    /* "\u0000" in an object key is valid JSON but refused by common readers
     * (jansson too): keys get U+FFFD instead; values keep the escape. */
    proto_top_logprob_t top = {"a\0b", 3, 1, -1.0};
    proto_token_logprob_t lp = {"a\0b", 3, 1, -1.0, 0, &top, 1};
    proto_choice_t c = {0, "a\0b", 3, "stop", 1, &lp, 1};
    proto_resp_meta_t meta = {"id", 1, "m", NULL};
    char *s = proto_completion_json(&meta, &c, 1, NULL);
    json_t *j = parse(s);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *top0 = json_array_get(json_object_get(l, "top_logprobs"), 0);
    CHECK_NEAR(nget(top0, "a\xEF\xBF\xBD" "b"), -1.0, 0);
    CHECK_INT_EQ(json_string_length(json_array_get(json_object_get(l, "tokens"), 0)), 3);
    json_decref(j);
    proto_free(s);
}

TEST(completion_chunk_shape)
{
    proto_resp_meta_t meta = {"cmpl-2", 5, "m", NULL};
    proto_choice_t c = {0, " the", 4, NULL, 0, NULL, 0};
    char *s = proto_completion_chunk_json(&meta, &c, NULL);
    json_t *j = parse(s);
    check_shape(j, "chunk", "id:s", "object:s", "created:i", "model:s", "choices:a", NULL);
    CHECK_STR_EQ(sget(j, "object"), "text_completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    check_shape(c0, "choice", "index:i", "text:s", "logprobs:z", "finish_reason:z", NULL);
    json_decref(j);
    proto_free(s);

    proto_usage_t u = {3, 4};
    s = proto_completion_chunk_json(&meta, NULL, &u);
    j = parse(s);
    check_shape(j, "usage chunk", "id:s", "object:s", "created:i", "model:s", "choices:a",
                "usage:o", NULL);
    CHECK_INT_EQ(json_array_size(json_object_get(j, "choices")), 0);
    CHECK_INT_EQ(iget(json_object_get(j, "usage"), "total_tokens"), 7);
    json_decref(j);
    proto_free(s);
}

TEST(system_fingerprint_in_every_shape)
{
    /* given: in whole responses and in every chunk; NULL: absent (above) */
    proto_resp_meta_t meta = {"x-1", 1, "m", "fp_0123456789abcdef"};
    proto_choice_t c = {0, "a", 1, "stop", 0, NULL, 0};
    proto_usage_t u = {1, 1};
    char *s[5] = {proto_completion_json(&meta, &c, 1, &u),
                  proto_completion_chunk_json(&meta, &c, NULL),
                  proto_chat_tools_json(&meta, &c, NULL, 1, &u),
                  proto_chat_chunk_json(&meta, &c, 1, NULL),
                  proto_chat_chunk_json(&meta, NULL, 0, &u)};
    for (int i = 0; i < 5; i++) {
        json_t *j = parse(s[i]);
        CHECK_STR_EQ(sget(j, "system_fingerprint"), "fp_0123456789abcdef");
        json_decref(j);
        proto_free(s[i]);
    }
}

/* --------------------------------------------------------------- chat */

TEST(chat_response_shape)
{
    proto_resp_meta_t meta = {"chatcmpl-1", 42, "smollm2", NULL};
    proto_choice_t c = {0, "Hi!", 3, "stop", 1, lps0, 2};
    proto_usage_t u = {10, 2};
    char *s = proto_chat_tools_json(&meta, &c, NULL, 1, &u);
    json_t *j = parse(s);
    check_shape(j, "chat", "id:s", "object:s", "created:i", "model:s", "choices:a", "usage:o",
                NULL);
    CHECK_STR_EQ(sget(j, "object"), "chat.completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    check_shape(c0, "choice", "index:i", "message:o", "logprobs:o", "finish_reason:s", NULL);
    json_t *msg = json_object_get(c0, "message");
    check_shape(msg, "message", "role:s", "content:s", NULL);
    CHECK_STR_EQ(sget(msg, "role"), "assistant");
    CHECK_STR_EQ(sget(msg, "content"), "Hi!");
    json_t *lp = json_object_get(c0, "logprobs");
    check_shape(lp, "logprobs", "content:a", NULL);
    json_t *e0 = json_array_get(json_object_get(lp, "content"), 0);
    json_t *e1 = json_array_get(json_object_get(lp, "content"), 1);
    check_shape(e0, "entry", "token:s", "logprob:n", "bytes:a", "top_logprobs:a", NULL);
    CHECK_INT_EQ(json_array_size(json_object_get(e0, "top_logprobs")), 3);
    check_shape(json_array_get(json_object_get(e0, "top_logprobs"), 1), "top", "token:s",
                "logprob:n", "bytes:a", NULL);
    /* the partial character: token repaired, bytes exact */
    CHECK_STR_EQ(sget(e1, "token"), " wor\xEF\xBF\xBD");
    json_t *bytes = json_object_get(e1, "bytes");
    CHECK_INT_EQ(json_array_size(bytes), 6);
    CHECK_INT_EQ(json_integer_value(json_array_get(bytes, 4)), 0xe2);
    CHECK_INT_EQ(json_integer_value(json_array_get(bytes, 5)), 0x82);
    CHECK_NEAR(nget(e1, "logprob"), -9999.0, 0);
    json_decref(j);
    proto_free(s);
}

TEST(chat_tool_calls_shape)
{
    proto_resp_meta_t meta = {"chatcmpl-3", 42, "m", NULL};
    proto_tool_call_t calls[2] = {{0, "call_a", "f", "{\"a\":1}", 7}, {1, "call_b", "g", NULL, 0}};
    proto_choice_t c = {0, "", 0, "tool_calls", 0, NULL, 0};
    proto_choice_tools_t ct = {calls, 2};
    char *s = proto_chat_tools_json(&meta, &c, &ct, 1, NULL);
    json_t *j = parse(s);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR_EQ(sget(c0, "finish_reason"), "tool_calls");
    json_t *msg = json_object_get(c0, "message");
    check_shape(msg, "message", "role:s", "content:z", "tool_calls:a", NULL);
    json_t *t0 = json_array_get(json_object_get(msg, "tool_calls"), 0);
    check_shape(t0, "call", "id:s", "type:s", "function:o", NULL);
    CHECK(json_object_get(t0, "index") == NULL);
    CHECK_STR_EQ(sget(t0, "type"), "function");
    check_shape(json_object_get(t0, "function"), "function", "name:s", "arguments:s", NULL);
    CHECK_STR_EQ(sget(json_object_get(t0, "function"), "arguments"), "{\"a\":1}");
    json_t *t1 = json_array_get(json_object_get(msg, "tool_calls"), 1);
    CHECK_STR_EQ(sget(json_object_get(t1, "function"), "arguments"), "");
    json_decref(j);
    proto_free(s);
    /* content beside calls stays */
    c.text = "ok";
    c.text_len = 2;
    s = proto_chat_tools_json(&meta, &c, &ct, 1, NULL);
    j = parse(s);
    msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECK_STR_EQ(sget(msg, "content"), "ok");
    json_decref(j);
    proto_free(s);

    /* chunks: the first of a call with id, type, name and ""; then fragments */
    proto_tool_call_t first = {1, "call_b", "g", "", 0};
    s = proto_chat_tool_chunk_json(&meta, 0, &first);
    j = parse(s);
    json_t *ch0 = json_array_get(json_object_get(j, "choices"), 0);
    check_shape(ch0, "choice", "index:i", "delta:o", "logprobs:z", "finish_reason:z", NULL);
    json_t *delta = json_object_get(ch0, "delta");
    check_shape(delta, "delta", "tool_calls:a", NULL);
    t0 = json_array_get(json_object_get(delta, "tool_calls"), 0);
    check_shape(t0, "call", "index:i", "id:s", "type:s", "function:o", NULL);
    CHECK_INT_EQ(json_integer_value(json_object_get(t0, "index")), 1);
    check_shape(json_object_get(t0, "function"), "function", "name:s", "arguments:s", NULL);
    json_decref(j);
    proto_free(s);
    proto_tool_call_t frag = {1, NULL, NULL, "{\"x\"", 4};
    s = proto_chat_tool_chunk_json(&meta, 0, &frag);
    j = parse(s);
    delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    t0 = json_array_get(json_object_get(delta, "tool_calls"), 0);
    check_shape(t0, "call", "index:i", "function:o", NULL);
    check_shape(json_object_get(t0, "function"), "function", "arguments:s", NULL);
    CHECK_STR_EQ(sget(json_object_get(t0, "function"), "arguments"), "{\"x\"");
    json_decref(j);
    proto_free(s);
}

TEST(chat_chunk_sequence)
{
    proto_resp_meta_t meta = {"chatcmpl-2", 42, "m", NULL};
    /* first chunk: role + empty content */
    proto_choice_t c = {0, "", 0, NULL, 0, NULL, 0};
    char *s = proto_chat_chunk_json(&meta, &c, 1, NULL);
    json_t *j = parse(s);
    check_shape(j, "chunk", "id:s", "object:s", "created:i", "model:s", "choices:a", NULL);
    CHECK_STR_EQ(sget(j, "object"), "chat.completion.chunk");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    check_shape(c0, "choice", "index:i", "delta:o", "logprobs:z", "finish_reason:z", NULL);
    check_shape(json_object_get(c0, "delta"), "delta", "role:s", "content:s", NULL);
    json_decref(j);
    proto_free(s);

    /* content chunk */
    proto_choice_t c2 = {0, "Hel", 3, NULL, 1, lps0, 1};
    s = proto_chat_chunk_json(&meta, &c2, 0, NULL);
    j = parse(s);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    check_shape(json_object_get(c0, "delta"), "delta", "content:s", NULL);
    check_shape(json_object_get(c0, "logprobs"), "logprobs", "content:a", NULL);
    json_decref(j);
    proto_free(s);

    /* final chunk: empty delta + finish_reason */
    proto_choice_t c3 = {0, NULL, 0, "length", 0, NULL, 0};
    s = proto_chat_chunk_json(&meta, &c3, 0, NULL);
    j = parse(s);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_INT_EQ(json_object_size(json_object_get(c0, "delta")), 0);
    CHECK_STR_EQ(sget(c0, "finish_reason"), "length");
    json_decref(j);
    proto_free(s);

    /* usage chunk */
    proto_usage_t u = {1, 2};
    s = proto_chat_chunk_json(&meta, NULL, 0, &u);
    j = parse(s);
    check_shape(j, "usage chunk", "id:s", "object:s", "created:i", "model:s", "choices:a",
                "usage:o", NULL);
    CHECK_INT_EQ(json_array_size(json_object_get(j, "choices")), 0);
    check_shape(json_object_get(j, "usage"), "usage", "prompt_tokens:i", "completion_tokens:i",
                "total_tokens:i", NULL);
    json_decref(j);
    proto_free(s);
}

/* ------------------------------------------------------------ sessions */

TEST(session_objects)
{
    const proto_checkpoint_t cks[2] = {{3, 90, 1000}, {4, 101, 1200}};
    proto_session_info_t s1 = {"0123456789abcdef0123456789abcdef", 120, 4718592, 1700000000,
                               1700000100, "darkformer", 128, 64, 5, cks, 2, 0, 0, 96, 8,
                               "recent", 12, NULL};
    char *s = proto_session_json(&s1, 0);
    CHECK_STR_EQ(s, "{\"id\":\"0123456789abcdef0123456789abcdef\",\"tokens\":120,"
                    "\"state_bytes\":4718592,\"turns\":5}");
    proto_free(s);
    /* the model a session is bound to, when given */
    s1.model = "gemma-3-270m-q4_k_m";
    s = proto_session_json(&s1, 0);
    CHECK_STR_EQ(s, "{\"id\":\"0123456789abcdef0123456789abcdef\",\"tokens\":120,"
                    "\"state_bytes\":4718592,\"model\":\"gemma-3-270m-q4_k_m\",\"turns\":5}");
    proto_free(s);
    s1.model = NULL;
    s = proto_session_json(&s1, 1);
    json_t *j = parse(s);
    check_shape(j, "session", "id:s", "tokens:i", "state_bytes:i", "turns:i", "created:i",
                "last_used:i", "attention:o", "checkpoints:a", NULL);
    check_shape(json_object_get(j, "attention"), "attention", "kind:s", "features:i",
                "window:i", "memory:i", "memory_keep:s", "memory_heads:i", "kv_bits:i", NULL);
    CHECK_STR_EQ(sget(json_object_get(j, "attention"), "kind"), "darkformer");
    CHECK_INT_EQ(iget(json_object_get(j, "attention"), "kv_bits"), 8);
    CHECK_INT_EQ(iget(json_object_get(j, "attention"), "window"), 64);
    CHECK_INT_EQ(iget(json_object_get(j, "attention"), "memory"), 96);
    CHECK_STR_EQ(sget(json_object_get(j, "attention"), "memory_keep"), "recent");
    CHECK_INT_EQ(iget(json_object_get(j, "attention"), "memory_heads"), 12);
    json_t *ca = json_object_get(j, "checkpoints");
    CHECK_INT_EQ(json_array_size(ca), 2);
    check_shape(json_array_get(ca, 1), "checkpoint", "turn:i", "tokens:i", "bytes:i", NULL);
    CHECK_INT_EQ(iget(json_array_get(ca, 1), "turn"), 4);
    CHECK_INT_EQ(iget(json_array_get(ca, 1), "tokens"), 101);
    json_decref(j);
    proto_free(s);
    /* a pending grammar shows in the full form only */
    s1.has_pending_grammar = 1;
    s1.pending_grammar_bytes = 17;
    s = proto_session_json(&s1, 0);
    CHECK(strstr(s, "pending_grammar") == NULL);
    proto_free(s);
    s = proto_session_json(&s1, 1);
    j = parse(s);
    check_shape(json_object_get(j, "pending_grammar"), "pending_grammar", "bytes:i", NULL);
    CHECK_INT_EQ(iget(json_object_get(j, "pending_grammar"), "bytes"), 17);
    json_decref(j);
    proto_free(s);
    s1.has_pending_grammar = 0;
    /* the session object in a generate's last line and answer */
    proto_usage_t gu = {5, 3};
    s = proto_generate_done_session_json("stop", &gu, NULL, &s1);
    j = parse(s);
    check_shape(j, "done", "done:b", "finish_reason:s", "usage:o", "timings:o", "session:o",
                NULL);
    CHECK_INT_EQ(iget(json_object_get(j, "session"), "turns"), 5);
    json_decref(j);
    proto_free(s);
    s = proto_generate_session_json("x", "hi", 2, NULL, 0, NULL, "length", &gu, NULL, &s1);
    j = parse(s);
    check_shape(j, "generate", "id:s", "text:s", "tokens:a", "finish_reason:s", "usage:o",
                "timings:o", "session:o", NULL);
    json_decref(j);
    proto_free(s);

    proto_session_info_t items[2] = {s1, s1};
    items[1].id = "ffffffffffffffffffffffffffffffff";
    s = proto_session_list_json(items, 2, 1);
    j = parse(s);
    check_shape(j, "list", "object:s", "data:a", "has_more:b", "last_id:s", NULL);
    CHECK_STR_EQ(sget(j, "object"), "list");
    CHECK(json_is_true(json_object_get(j, "has_more")));
    CHECK_STR_EQ(sget(j, "last_id"), "ffffffffffffffffffffffffffffffff");
    CHECK_INT_EQ(json_array_size(json_object_get(j, "data")), 2);
    check_shape(json_array_get(json_object_get(j, "data"), 0), "item", "id:s", "tokens:i",
                "state_bytes:i", "turns:i", "created:i", "last_used:i", "attention:o",
                "checkpoints:a", NULL);
    json_decref(j);
    proto_free(s);

    s = proto_session_list_json(NULL, 0, 0);
    CHECK_STR_EQ(s, "{\"object\":\"list\",\"data\":[],\"has_more\":false,\"last_id\":null}");
    proto_free(s);
}

TEST(session_id_functions)
{
    CHECK(proto_session_id_valid("0123456789abcdef0123456789abcdef", 32));
    CHECK(!proto_session_id_valid("0123456789abcdef0123456789abcdef", 31));
    CHECK(!proto_session_id_valid("0123456789abcdef0123456789abcdef0", 33));
    CHECK(!proto_session_id_valid("0123456789abcdeF0123456789abcdef", 32));
    CHECK(!proto_session_id_valid("0123456789abcdeg0123456789abcdef", 32));
    CHECK(!proto_session_id_valid("../../etc/passwd/0123456789abcde", 32));
    CHECK(!proto_session_id_valid("0123456789abcdef\0" "123456789abcdef", 32));
    CHECK(!proto_session_id_valid(NULL, 32));
    uint8_t b[16];
    for (int i = 0; i < 16; i++)
        b[i] = (uint8_t)(i * 17); /* 00 11 22 .. ff */
    char id[33];
    proto_session_id_format(b, id);
    CHECK_STR_EQ(id, "00112233445566778899aabbccddeeff");
    CHECK(proto_session_id_valid(id, strlen(id)));
}

/* ------------------------------------------------------------ generate */

TEST(generate_lines)
{
    proto_gen_token_t t = {" world", 6, 1917, NULL};
    char *s = proto_generate_token_json(&t);
    CHECK_STR_EQ(s, "{\"text\":\" world\",\"token\":1917}");
    proto_free(s);

    /* half of a multibyte character: replaced, still valid JSON */
    proto_gen_token_t half = {"\xf0\x9f", 2, 7, NULL};
    s = proto_generate_token_json(&half);
    CHECK_STR_EQ(s, "{\"text\":\"\xEF\xBF\xBD\",\"token\":7}");
    proto_free(s);

    /* embedded NUL is escaped */
    proto_gen_token_t nul = {"a\0b", 3, 8, NULL};
    s = proto_generate_token_json(&nul);
    CHECK_STR_EQ(s, "{\"text\":\"a\\u0000b\",\"token\":8}");
    json_t *j = parse(s);
    CHECK_INT_EQ(json_string_length(json_object_get(j, "text")), 3);
    json_decref(j);
    proto_free(s);

    proto_gen_token_t withlp = {"Hello", 5, 100, &lps0[0]};
    s = proto_generate_token_json(&withlp);
    j = parse(s);
    check_shape(j, "token line", "text:s", "token:i", "logprob:n", "top_logprobs:a", NULL);
    check_shape(json_array_get(json_object_get(j, "top_logprobs"), 0), "top", "token:s", "id:i",
                "logprob:n", NULL);
    CHECK_INT_EQ(iget(json_array_get(json_object_get(j, "top_logprobs"), 1), "id"), 101);
    json_decref(j);
    proto_free(s);

    proto_usage_t u = {10, 20};
    proto_timings_t tm = {1.5, 100.0, 400.0};
    s = proto_generate_done_session_json("stop", &u, &tm, NULL);
    j = parse(s);
    check_shape(j, "done", "done:b", "finish_reason:s", "usage:o", "timings:o", NULL);
    CHECK(json_is_true(json_object_get(j, "done")));
    check_shape(json_object_get(j, "usage"), "usage", "prompt_tokens:i", "completion_tokens:i",
                NULL);
    json_t *tj = json_object_get(j, "timings");
    check_shape(tj, "timings", "queue_ms:n", "prompt_ms:n", "generation_ms:n",
                "prompt_tokens_per_second:n", "generation_tokens_per_second:n", NULL);
    CHECK_NEAR(nget(tj, "prompt_tokens_per_second"), 100.0, 1e-9);  /* 10 tokens / 0.1 s */
    CHECK_NEAR(nget(tj, "generation_tokens_per_second"), 50.0, 1e-9); /* 20 / 0.4 s */
    json_decref(j);
    proto_free(s);

    /* zero durations and NaN: rates are 0, never inf/NaN */
    proto_timings_t tz = {NAN, 0, 0};
    s = proto_generate_done_session_json(NULL, &u, &tz, NULL);
    j = parse(s);
    CHECK(json_is_null(json_object_get(j, "finish_reason")));
    CHECK_NEAR(nget(json_object_get(j, "timings"), "queue_ms"), 0, 0);
    CHECK_NEAR(nget(json_object_get(j, "timings"), "prompt_tokens_per_second"), 0, 0);
    json_decref(j);
    proto_free(s);
}

TEST(generate_nonstream)
{
    int32_t ids[2] = {100, 200};
    proto_usage_t u = {5, 2};
    proto_timings_t tm = {0, 10, 20};
    char *s = proto_generate_session_json("0123456789abcdef0123456789abcdef", "Hello wor\xe2\x82",
                                          11, ids, 2, NULL, "length", &u, &tm, NULL);
    json_t *j = parse(s);
    check_shape(j, "generate", "id:s", "text:s", "tokens:a", "finish_reason:s", "usage:o",
                "timings:o", NULL);
    CHECK_INT_EQ(json_integer_value(json_array_get(json_object_get(j, "tokens"), 1)), 200);
    CHECK_STR_EQ(sget(j, "text"), "Hello wor\xEF\xBF\xBD");
    json_decref(j);
    proto_free(s);

    s = proto_generate_session_json("id", "x", 1, ids, 2, lps0, "stop", &u, &tm, NULL);
    j = parse(s);
    check_shape(j, "generate+lp", "id:s", "text:s", "tokens:a", "finish_reason:s", "usage:o",
                "timings:o", "logprobs:a", NULL);
    json_t *e0 = json_array_get(json_object_get(j, "logprobs"), 0);
    check_shape(e0, "lp", "token:s", "id:i", "logprob:n", "bytes:a", "top_logprobs:a", NULL);
    check_shape(json_array_get(json_object_get(e0, "top_logprobs"), 0), "top", "token:s", "id:i",
                "logprob:n", "bytes:a", NULL);
    json_decref(j);
    proto_free(s);
}

/* ---------------------------------------------------------- operations */

TEST(operations_shapes)
{
    proto_model_entry_t m[1] = {{"SmolLM2-135M-Instruct", 1700000000, NULL}};
    char *s = proto_models_json(m, 1);
    CHECK_STR_EQ(s, "{\"object\":\"list\",\"data\":[{\"id\":\"SmolLM2-135M-Instruct\","
                    "\"object\":\"model\",\"created\":1700000000,\"owned_by\":\"darkserve\"}]}");
    proto_free(s);

    int32_t ids[3] = {19556, 905, 0};
    s = proto_tokenize_json(ids, 3, NULL, NULL);
    CHECK_STR_EQ(s, "{\"tokens\":[19556,905,0]}");
    proto_free(s);
    const char *pieces[3] = {"Hello", " wor\xe2", ""};
    size_t plens[3] = {5, 5, 0};
    s = proto_tokenize_json(ids, 3, pieces, plens);
    CHECK_STR_EQ(s, "{\"tokens\":[{\"id\":19556,\"piece\":\"Hello\"},{\"id\":905,\"piece\":\" "
                    "wor\xEF\xBF\xBD\"},{\"id\":0,\"piece\":\"\"}]}");
    proto_free(s);
    s = proto_tokenize_json(NULL, 0, NULL, NULL);
    CHECK_STR_EQ(s, "{\"tokens\":[]}");
    proto_free(s);

    s = proto_detokenize_json("caf\xc3\xa9 \"q\"\n", 10);
    CHECK_STR_EQ(s, "{\"text\":\"caf\xc3\xa9 \\\"q\\\"\\n\","
                    "\"content\":\"caf\xc3\xa9 \\\"q\\\"\\n\"}");
    proto_free(s);

    proto_health_t h = {"ok", "SmolLM2", 3, 1, 12.5, NULL, NULL, 0};
    s = proto_health_json(&h);
    json_t *j = parse(s);
    check_shape(j, "health", "status:s", "model:s", "sessions:i", "queue_depth:i", "uptime_s:n",
                NULL);
    CHECK_NEAR(nget(j, "uptime_s"), 12.5, 0);
    CHECK(!json_object_get(j, "reason"));
    json_decref(j);
    proto_free(s);
    proto_health_t h2 = {"loading", NULL, 0, 0, 0, NULL, NULL, 0};
    s = proto_health_json(&h2);
    j = parse(s);
    CHECK(json_is_null(json_object_get(j, "model")));
    json_decref(j);
    proto_free(s);
    /* a degraded server says why */
    proto_health_t h3 = {"degraded", "SmolLM2", 3, 0, 1.0, "session store unreachable", NULL, 0};
    s = proto_health_json(&h3);
    j = parse(s);
    check_shape(j, "health", "status:s", "reason:s", "model:s", "sessions:i", "queue_depth:i",
                "uptime_s:n", NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "reason")), "session store unreachable");
    json_decref(j);
    proto_free(s);
    /* several models: "models" names them all, "model" is the default */
    const char *const names[] = {"SmolLM2", "gemma-3"};
    proto_health_t h4 = {"ok", "SmolLM2", 0, 0, 1.0, NULL, names, 2};
    s = proto_health_json(&h4);
    j = parse(s);
    check_shape(j, "health", "status:s", "model:s", "models:a", "sessions:i", "queue_depth:i",
                "uptime_s:n", NULL);
    CHECK(json_array_size(json_object_get(j, "models")) == 2);
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(j, "models"), 1)), "gemma-3");
    json_decref(j);
    proto_free(s);
    proto_health_t h5 = {"ok", "SmolLM2", 0, 0, 1.0, NULL, names, 1}; /* one: no list */
    s = proto_health_json(&h5);
    j = parse(s);
    CHECK(!json_object_get(j, "models"));
    json_decref(j);
    proto_free(s);
}

TEST(logprob_floats_round_trip)
{
    /* 9 significant digits: a float logprob survives print + parse exactly. */
    float vals[4] = {-0.1f, -1e-7f, -23.456789f, -1234.5678f};
    for (int i = 0; i < 4; i++) {
        proto_token_logprob_t t = {"a", 1, 1, vals[i], 0, NULL, 0};
        proto_gen_token_t g = {"a", 1, 1, &t};
        char *s = proto_generate_token_json(&g);
        json_t *j = parse(s);
        CHECK((float)nget(j, "logprob") == vals[i]);
        json_decref(j);
        proto_free(s);
    }
}

/* ------------------------------------------------------------- framing */

TEST(framing_exact)
{
    size_t n = 0;
    char *f = proto_frame(PROTO_STREAM_SSE, "{\"a\":1}", 7, &n);
    CHECK_STR_EQ(f, "data: {\"a\":1}\n\n");
    CHECK_INT_EQ(n, 15);
    proto_free(f);
    f = proto_frame(PROTO_STREAM_NDJSON, "{\"a\":1}", 7, &n);
    CHECK_STR_EQ(f, "{\"a\":1}\n");
    CHECK_INT_EQ(n, 8);
    proto_free(f);

    /* every SSE line ending becomes its own data line */
    f = proto_frame(PROTO_STREAM_SSE, "a\nb\r\nc\rd", 8, &n);
    CHECK_STR_EQ(f, "data: a\ndata: b\ndata: c\ndata: d\n\n");
    CHECK_INT_EQ(n, strlen("data: a\ndata: b\ndata: c\ndata: d\n\n"));
    proto_free(f);
    f = proto_frame(PROTO_STREAM_SSE, "x\n", 2, &n);
    CHECK_STR_EQ(f, "data: x\ndata: \n\n");
    proto_free(f);
    /* NDJSON: raw newlines (JSON whitespace) become spaces */
    f = proto_frame(PROTO_STREAM_NDJSON, "{\n\"a\":\r\n1}", 10, &n);
    CHECK_STR_EQ(f, "{ \"a\":  1}\n");
    proto_free(f);
    f = proto_frame(PROTO_STREAM_SSE, "", 0, &n);
    CHECK_STR_EQ(f, "data: \n\n");
    proto_free(f);

    CHECK_STR_EQ(PROTO_SSE_DONE, "data: [DONE]\n\n");
    CHECK_STR_EQ(PROTO_SSE_PING, ": ping\n\n");

    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "generation failed");
    f = proto_frame_error(PROTO_STREAM_SSE, &e, &n);
    CHECK_STR_EQ(f, "data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\","
                    "\"param\":null,\"code\":\"internal_error\"}}\n\n");
    proto_free(f);
    f = proto_frame_error(PROTO_STREAM_NDJSON, &e, &n);
    CHECK_STR_EQ(f, "{\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\","
                    "\"param\":null,\"code\":\"internal_error\"}}\n");
    CHECK_INT_EQ(n, strlen(f));
    proto_free(f);

    /* a builder's output framed as SSE is one event of one data line */
    proto_gen_token_t t = {"line1\nline2", 11, 5, NULL};
    char *j = proto_generate_token_json(&t);
    f = proto_frame(PROTO_STREAM_SSE, j, strlen(j), &n);
    CHECK_STR_EQ(f, "data: {\"text\":\"line1\\nline2\",\"token\":5}\n\n");
    proto_free(f);
    proto_free(j);
}

int main(void)
{
    RUN(error_table_matches_contract);
    RUN(error_json_shape);
    RUN(completion_response_shape);
    RUN(completion_logprob_keys_without_nul);
    RUN(completion_chunk_shape);
    RUN(system_fingerprint_in_every_shape);
    RUN(chat_response_shape);
    RUN(chat_chunk_sequence);
    RUN(chat_tool_calls_shape);
    RUN(session_objects);
    RUN(session_id_functions);
    RUN(generate_lines);
    RUN(generate_nonstream);
    RUN(operations_shapes);
    RUN(logprob_floats_round_trip);
    RUN(framing_exact);
    return CHECK_DONE();
}
