/* test_proto_cases.c — data-driven request validation: every file in
 * each JSON file in $DARKSERVE_DATA/proto (default tests/data/proto) lists requests for one
 * endpoint with either the parsed values expected (expect_ok, matched against a
 * JSON view of the parsed struct) or the error expected (expect_error: status,
 * param, message_contains, optional code). See tests/data/proto/README.md. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "proto/proto_test.h"
#include "tests/unit/check.h"

/* ------------------------------------------------------- views of structs */

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static const char *role_name(proto_role_t r)
{
    return r == PROTO_ROLE_SYSTEM ? "system"
           : r == PROTO_ROLE_USER ? "user"
           : r == PROTO_ROLE_TOOL ? "tool"
                                  : "assistant";
}

static json_t *messages_view(const proto_message_t *m, size_t n)
{
    if (!m)
        return json_null();
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        CHECK(strlen(m[i].content) == m[i].content_len);
        json_t *o = json_pack("{s:s,s:s%}", "role", role_name(m[i].role), "content",
                              m[i].content, m[i].content_len);
        if (m[i].tool_call_id)
            json_object_set_new(o, "tool_call_id", json_string(m[i].tool_call_id));
        if (m[i].n_tool_calls) {
            json_t *tc = json_array();
            for (size_t k = 0; k < m[i].n_tool_calls; k++) {
                const proto_msg_tool_call_t *c = &m[i].tool_calls[k];
                CHECK(strlen(c->arguments) == c->arguments_len);
                json_array_append_new(tc, json_pack("{s:s,s:s,s:s}", "id", c->id, "name",
                                                    c->name, "arguments", c->arguments));
            }
            json_object_set_new(o, "tool_calls", tc);
        }
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *ids_view(const int32_t *t, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(t[i]));
    return a;
}

static json_t *gen_view(const proto_gen_params_t *p)
{
    const proto_sampling_t *s = &p->sampling;
    json_t *stop = json_array();
    for (size_t i = 0; i < p->n_stop; i++)
        json_array_append_new(stop, json_string(p->stop[i]));
    json_t *bias = json_object();
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", (int)p->logit_bias[i].id);
        json_object_set_new(bias, k, json_real(p->logit_bias[i].bias));
    }
    json_t *v = json_pack("{s:o,s:I,s:i,s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:o,s:o,s:i,s:b,s:b,s:o,s:o,s:o}",
                     "model", str_or_null(p->model), "max_tokens", (json_int_t)p->max_tokens,
                     "n", p->n, "temperature", s->temperature, "top_p", s->top_p, "top_k",
                     (json_int_t)s->top_k, "min_p", s->min_p, "repeat_penalty",
                     s->repeat_penalty, "presence_penalty", s->presence_penalty,
                     "frequency_penalty", s->frequency_penalty, "seed",
                     s->has_seed ? json_integer(s->seed) : json_null(), "stop", stop,
                     "logprobs", p->logprobs, "stream", p->stream, "include_usage",
                     p->include_usage, "session",
                     p->session[0] ? json_string(p->session) : json_null(), "grammar",
                     p->grammar ? json_stringn(p->grammar, p->grammar_len) : json_null(),
                     "logit_bias", bias);
    json_object_set_new(v, "grammar_from", str_or_null(p->grammar_param));
    return v;
}

/* ------------------------------------------------------------ matching */

/* expected ⊆ actual for objects; arrays element-wise with equal length;
 * numbers by value (1 matches 1.0). */
static int match(json_t *exp, json_t *act, char *where, size_t wcap)
{
    if (json_is_number(exp) && json_is_number(act))
        return json_number_value(exp) == json_number_value(act);
    if (json_is_object(exp) && json_is_object(act)) {
        const char *k;
        json_t *v;
        json_object_foreach(exp, k, v)
        {
            json_t *a = json_object_get(act, k);
            if (!a || !match(v, a, where, wcap)) {
                if (!where[0])
                    snprintf(where, wcap, "%s", k);
                return 0;
            }
        }
        return 1;
    }
    if (json_is_array(exp) && json_is_array(act)) {
        if (json_array_size(exp) != json_array_size(act))
            return 0;
        for (size_t i = 0; i < json_array_size(exp); i++)
            if (!match(json_array_get(exp, i), json_array_get(act, i), where, wcap))
                return 0;
        return 1;
    }
    return json_equal(exp, act);
}

/* -------------------------------------------------------------- running */

static void limits_from(json_t *j, proto_limits_t *lim)
{
    memset(lim, 0, sizeof *lim);
    if (!j)
        return;
    lim->max_tokens_limit = json_integer_value(json_object_get(j, "max_tokens_limit"));
    lim->default_max_tokens = json_integer_value(json_object_get(j, "default_max_tokens"));
    lim->n_vocab = json_integer_value(json_object_get(j, "n_vocab"));
    lim->max_prompt_tokens = json_integer_value(json_object_get(j, "max_prompt_tokens"));
    lim->max_text_bytes = json_integer_value(json_object_get(j, "max_text_bytes"));
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static char *hex_decode(const char *h, size_t *len)
{
    size_t n = strlen(h) / 2;
    char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b[i] = (char)v;
    }
    *len = n;
    return b;
}

/* Runs the endpoint's parser; returns the view (NULL on error) and rc. */
static json_t *run_parser(const char *endpoint, json_t *c, const char *body, size_t len,
                          const proto_limits_t *lim, proto_error_t *err, int *rc)
{
    json_t *view = NULL;
    if (!strcmp(endpoint, "completions")) {
        proto_completion_req_t r;
        *rc = proto_completion_parse(body, len, lim, &r, err);
        if (*rc == 0) {
            view = gen_view(&r.p);
            json_t *ps = json_array();
            for (size_t i = 0; i < r.n_prompts; i++) {
                const proto_prompt_t *p = &r.prompts[i];
                CHECK((p->text != NULL) != (p->tokens != NULL));
                json_array_append_new(ps, p->text ? json_stringn(p->text, p->text_len)
                                                  : ids_view(p->tokens, p->n_tokens));
            }
            json_object_set_new(view, "prompts", ps);
        } else {
            CHECK(all_zero(&r, sizeof r));
        }
        proto_completion_free(&r);
    } else if (!strcmp(endpoint, "chat")) {
        proto_chat_req_t r;
        *rc = proto_chat_parse(body, len, lim, &r, err);
        if (*rc == 0) {
            view = gen_view(&r.p);
            json_object_set_new(view, "messages", messages_view(r.messages, r.n_messages));
            json_object_set_new(view, "parse_special", json_boolean(r.parse_special));
            static const char *const choices[] = {"none", "auto", "required", "named"};
            json_t *tools = json_array();
            for (size_t i = 0; i < r.n_tools; i++)
                json_array_append_new(
                    tools, json_pack("{s:s,s:o,s:o,s:s}", "name", r.tools[i].name, "description",
                                     str_or_null(r.tools[i].description), "parameters",
                                     str_or_null(r.tools[i].parameters), "json",
                                     r.tools[i].json));
            json_object_set_new(view, "tools", tools);
            json_object_set_new(view, "tool_choice", json_string(choices[r.tool_choice]));
            if (r.tool_choice == PROTO_TOOL_CHOICE_NAMED)
                json_object_set_new(view, "tool_named", json_integer((json_int_t)r.tool_named));
            json_object_set_new(view, "parallel_tool_calls", json_boolean(r.parallel_tool_calls));
        } else {
            CHECK(all_zero(&r, sizeof r));
        }
        proto_chat_free(&r);
    } else if (!strcmp(endpoint, "session_create")) {
        proto_session_create_req_t r;
        *rc = proto_session_create_parse(body, len, lim, &r, err);
        if (*rc == 0)
            view = json_pack("{s:o,s:o,s:b}", "system", str_or_null(r.system), "messages",
                             messages_view(r.messages, r.n_messages), "parse_special",
                             r.parse_special);
        else
            CHECK(all_zero(&r, sizeof r));
        proto_session_create_free(&r);
    } else if (!strcmp(endpoint, "session_append")) {
        proto_session_append_req_t r;
        *rc = proto_session_append_parse(body, len, lim, &r, err);
        if (*rc == 0)
            view = json_pack("{s:o,s:o,s:b}", "text", str_or_null(r.text), "messages",
                             messages_view(r.messages, r.n_messages), "parse_special",
                             r.parse_special);
        else
            CHECK(all_zero(&r, sizeof r));
        proto_session_append_free(&r);
    } else if (!strcmp(endpoint, "session_generate")) {
        proto_generate_req_t r;
        *rc = proto_generate_parse(body, len, lim, &r, err);
        if (*rc == 0) {
            view = gen_view(&r.p);
            json_object_set_new(view, "text", str_or_null(r.text));
            json_object_set_new(view, "messages", messages_view(r.messages, r.n_messages));
            json_object_set_new(view, "format",
                                json_string(r.format == PROTO_STREAM_SSE ? "sse" : "ndjson"));
            json_object_set_new(view, "parse_special", json_boolean(r.parse_special));
        } else {
            CHECK(all_zero(&r, sizeof r));
        }
        proto_generate_free(&r);
    } else if (!strcmp(endpoint, "session_regenerate")) {
        proto_generate_req_t r;
        *rc = proto_regenerate_parse(body, len, lim, &r, err);
        if (*rc == 0) {
            view = gen_view(&r.p);
            CHECK(!r.text && !r.messages);
            json_object_set_new(view, "format",
                                json_string(r.format == PROTO_STREAM_SSE ? "sse" : "ndjson"));
        } else {
            CHECK(all_zero(&r, sizeof r));
        }
        proto_generate_free(&r);
    } else if (!strcmp(endpoint, "session_rollback")) {
        proto_rollback_req_t r;
        *rc = proto_rollback_parse(body, len, &r, err);
        if (*rc == 0)
            view = json_pack("{s:I}", "turns", (json_int_t)r.turns);
        else
            CHECK(all_zero(&r, sizeof r));
    } else if (!strcmp(endpoint, "session_list")) {
        json_t *q = json_object_get(c, "query");
        size_t n = json_array_size(q);
        proto_kv_t kv[16];
        CHECK(n <= 16);
        for (size_t i = 0; i < n && i < 16; i++) {
            json_t *pair = json_array_get(q, i);
            kv[i].key = json_string_value(json_array_get(pair, 0));
            kv[i].value = json_string_value(json_array_get(pair, 1)); /* null -> NULL */
        }
        proto_session_list_req_t r;
        *rc = proto_session_list_parse(kv, n, &r, err);
        if (*rc == 0)
            view = json_pack("{s:i,s:o}", "limit", r.limit, "after",
                             r.after[0] ? json_string(r.after) : json_null());
    } else if (!strcmp(endpoint, "tokenize")) {
        proto_tokenize_req_t r;
        *rc = proto_tokenize_parse(body, len, lim, &r, err);
        if (*rc == 0)
            view = json_pack("{s:s%,s:b,s:b}", "text", r.text, r.text_len, "add_special",
                             r.add_special, "with_pieces", r.with_pieces);
        else
            CHECK(all_zero(&r, sizeof r));
        proto_tokenize_free(&r);
    } else if (!strcmp(endpoint, "detokenize")) {
        proto_detokenize_req_t r;
        *rc = proto_detokenize_parse(body, len, lim, &r, err);
        if (*rc == 0)
            view = json_pack("{s:o}", "tokens", ids_view(r.tokens, r.n_tokens));
        else
            CHECK(all_zero(&r, sizeof r));
        proto_detokenize_free(&r);
    } else if (!strcmp(endpoint, "utf8")) {
        /* body = the bytes of "hex"; the view is what the UTF-8 functions say. */
        size_t out_len = 0;
        char *fixed = proto_utf8_sanitize(body ? body : "", len, &out_len);
        char *hex = malloc(2 * out_len + 1);
        for (size_t i = 0; i < out_len; i++)
            sprintf(hex + 2 * i, "%02x", (unsigned char)fixed[i]);
        hex[2 * out_len] = '\0';
        CHECK(fixed && fixed[out_len] == '\0' && proto_utf8_valid(fixed, out_len));
        view = json_pack("{s:s,s:b,s:I}", "sanitized_hex", hex, "valid",
                         proto_utf8_valid(body ? body : "", len), "complete_prefix",
                         (json_int_t)proto_utf8_complete_prefix(body ? body : "", len));
        free(hex);
        proto_free(fixed);
        *rc = 0;
    } else {
        CHECK_MSG(0, "unknown endpoint %s", endpoint);
        *rc = -100;
    }
    return view;
}

static int n_cases, n_ok_cases, n_err_cases;

static void run_case(const char *file, const char *endpoint, json_t *c)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *req = json_object_get(c, "request");
    json_t *raw = json_object_get(c, "raw");
    json_t *raw_hex = json_object_get(c, "raw_hex");
    if (!raw_hex)
        raw_hex = json_object_get(c, "hex");
    json_t *exp_ok = json_object_get(c, "expect_ok");
    json_t *exp_err = json_object_get(c, "expect_error");
    char *body = NULL;
    size_t len = 0;
    proto_limits_t lim;
    proto_error_t err;
    int rc = 0;

    CHECK_MSG(name && (exp_ok != NULL) != (exp_err != NULL), "%s: malformed case", file);
    if (!name)
        return;
    if (raw) {
        len = json_string_length(raw);
        body = malloc(len + 1);
        memcpy(body, json_string_value(raw), len);
    } else if (raw_hex) {
        body = hex_decode(json_string_value(raw_hex), &len);
    } else if (req) {
        body = json_dumps(req, JSON_COMPACT | JSON_ENCODE_ANY);
        len = strlen(body);
    }
    limits_from(json_object_get(c, "limits"), &lim);
    memset(&err, 0, sizeof err);
    json_t *view = run_parser(endpoint, c, body, len, &lim, &err, &rc);
    n_cases++;

    if (exp_ok) {
        n_ok_cases++;
        char where[128] = "";
        CHECK_MSG(rc == 0, "%s/%s: expected success, got %d: %s (param %s)", file, name, rc,
                  err.message, err.param);
        if (rc == 0)
            CHECK_MSG(match(exp_ok, view, where, sizeof where), "%s/%s: mismatch at '%s': %s",
                      file, name, where, json_dumps(view, JSON_COMPACT));
    } else if (exp_err) {
        n_err_cases++;
        json_int_t st = json_integer_value(json_object_get(exp_err, "status"));
        json_t *param = json_object_get(exp_err, "param");
        const char *frag = json_string_value(json_object_get(exp_err, "message_contains"));
        const char *code = json_string_value(json_object_get(exp_err, "code"));
        CHECK_MSG(rc < 0, "%s/%s: expected an error, parse succeeded", file, name);
        if (rc < 0) {
            CHECK_MSG(err.status == st, "%s/%s: status %d, expected %lld", file, name,
                      err.status, (long long)st);
            const char *want = json_is_string(param) ? json_string_value(param) : "";
            CHECK_MSG(!strcmp(err.param, want), "%s/%s: param '%s', expected '%s'", file, name,
                      err.param, want);
            CHECK_MSG(frag && strstr(err.message, frag), "%s/%s: message '%s' lacks '%s'",
                      file, name, err.message, frag ? frag : "(none)");
            if (code)
                CHECK_MSG(err.code && !strcmp(err.code, code), "%s/%s: code %s, expected %s",
                          file, name, err.code ? err.code : "null", code);
            /* The message names the field it is about. */
            if (err.param[0] && strcmp(endpoint, "session_list") != 0)
                CHECK_MSG(strstr(err.message, err.param) != NULL,
                          "%s/%s: message '%s' does not name '%s'", file, name, err.message,
                          err.param);
            /* And it serializes to the documented error object. */
            char *ej = proto_error_json(&err);
            json_t *ev = ej ? json_loads(ej, 0, NULL) : NULL;
            CHECK(ev && json_is_object(json_object_get(ev, "error")));
            json_decref(ev);
            proto_free(ej);
        }
    }
    json_decref(view);
    free(body);
}

static void run_file(const char *dir, const char *fname)
{
    char path[2048];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    CHECK_MSG(doc != NULL, "%s: %s (line %d)", path, jerr.text, jerr.line);
    if (!doc)
        return;
    const char *endpoint = json_string_value(json_object_get(doc, "endpoint"));
    json_t *cases = json_object_get(doc, "cases");
    CHECK_MSG(endpoint && json_array_size(cases) > 0, "%s: needs endpoint and cases", path);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) run_case(fname, endpoint ? endpoint : "?", c);
    json_decref(doc);
}

TEST(data_driven_cases)
{
    const char *data = getenv("DARKSERVE_DATA");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/proto", data && data[0] ? data : "tests/data");
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d)
        return;
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 5 && !strcmp(e->d_name + n - 5, ".json")) {
            run_file(dir, e->d_name);
            files++;
        }
    }
    closedir(d);
    printf("  %d files, %d cases (%d valid, %d invalid)\n", files, n_cases, n_ok_cases,
           n_err_cases);
    CHECK(files >= 10);
    CHECK(n_err_cases >= 100);
}

int main(void)
{
    RUN(data_driven_cases);
    return CHECK_DONE();
}
