/* test_proto_ollama.c — Ollama's API in proto/ollama.c: the defaults and the
 * option mapping of /api/generate and /api/chat, the ignored-options list,
 * the response shapes parsed back with jansson, and allocation failures at
 * every point of the parsers and builders (500 / NULL, never a crash or a
 * leak under ASan). The refusals of bad values are exercised end to end in
 * tests/integration/test_api_ollama.py. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/alloc_fail.h"
#include "tests/unit/check.h"

static int parse(const char *body, int chat, proto_ollama_req_t *r, proto_error_t *e)
{
    proto_limits_t lim = {.max_tokens_limit = 1000, .n_vocab = 100};
    return proto_ollama_parse(body, strlen(body), chat, &lim, r, e);
}

TEST(defaults_are_ollamas)
{
    proto_ollama_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"prompt\":\"p\"}", 0, &r, &e), 0);
    CHECK_STR_EQ(r.model, "m");
    CHECK_STR_EQ(r.prompt, "p");
    CHECK_INT_EQ(r.p.stream, 1);
    CHECK_NEAR(r.p.sampling.temperature, 0.8, 0);
    CHECK_INT_EQ(r.p.sampling.top_k, 40);
    CHECK_NEAR(r.p.sampling.top_p, 0.9, 0);
    CHECK_NEAR(r.p.sampling.repeat_penalty, 1.1, 0);
    CHECK_INT_EQ(r.repeat_last_n, 64);
    CHECK_INT_EQ(r.p.sampling.has_seed, 0);
    CHECK_INT_EQ(r.unlimited, 1);
    CHECK_INT_EQ(r.p.max_tokens, 1000);
    CHECK_INT_EQ(r.p.logprobs, -1);
    CHECK(r.context == NULL && r.messages == NULL && r.ignored[0] == '\0');
    proto_ollama_free(&r);
    proto_ollama_free(&r); /* zeroed: harmless twice */
}

TEST(options_map_to_the_sampler)
{
    proto_ollama_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                       "{\"role\":\"user\"}],\"stream\":false,\"options\":{\"temperature\":0,"
                       "\"top_k\":0,\"top_p\":0.5,\"min_p\":0.1,\"repeat_penalty\":1.0,"
                       "\"repeat_last_n\":-1,\"seed\":42,\"num_predict\":7,\"stop\":\"x\","
                       "\"presence_penalty\":1,\"num_ctx\":4096,\"mirostat\":null}}",
                       1, &r, &e),
                 0);
    CHECK_INT_EQ(r.p.stream, 0);
    CHECK_NEAR(r.p.sampling.temperature, 0, 0);
    CHECK_INT_EQ(r.p.sampling.top_k, 0);
    CHECK_NEAR(r.p.sampling.top_p, 0.5, 0);
    CHECK_NEAR(r.p.sampling.min_p, 0.1, 0);
    CHECK_NEAR(r.p.sampling.repeat_penalty, 1.0, 0);
    CHECK_NEAR(r.p.sampling.presence_penalty, 1.0, 0);
    CHECK_INT_EQ(r.repeat_last_n, -1);
    CHECK_INT_EQ(r.p.sampling.has_seed, 1);
    CHECK_INT_EQ(r.p.sampling.seed, 42);
    CHECK_INT_EQ(r.p.max_tokens, 7);
    CHECK_INT_EQ(r.unlimited, 0);
    CHECK_INT_EQ(r.p.n_stop, 1);
    CHECK_STR_EQ(r.p.stop[0], "x");
    CHECK_STR_EQ(r.ignored, "num_ctx"); /* null is absent, not ignored */
    CHECK_INT_EQ(r.n_messages, 2);
    CHECK_INT_EQ(r.messages[0].role, PROTO_ROLE_SYSTEM);
    CHECK_STR_EQ(r.messages[1].content, ""); /* absent content */
    proto_ollama_free(&r);

    /* seed -1 is Ollama's "random"; num_predict 0 and -2 run to the end */
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"options\":{\"seed\":-1,\"num_predict\":-2}}", 0, &r, &e),
                 0);
    CHECK_INT_EQ(r.p.sampling.has_seed, 0);
    CHECK_INT_EQ(r.unlimited, 1);
    CHECK_INT_EQ(r.p.max_tokens, 1000);
    proto_ollama_free(&r);
}

TEST(ignored_list_is_bounded)
{
    char body[8192] = "{\"model\":\"m\",\"options\":{";
    for (int i = 0; i < 100; i++)
        sprintf(body + strlen(body), "%s\"unknown_option_%03d\":1", i ? "," : "", i);
    strcat(body, "}}");
    proto_ollama_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse(body, 0, &r, &e), 0);
    CHECK(strlen(r.ignored) < PROTO_OLLAMA_IGNORED_MAX);
    CHECK(strncmp(r.ignored, "unknown_option_000,unknown_option_001,", 38) == 0);
    CHECK(strcmp(r.ignored + strlen(r.ignored) - 3, "...") == 0);
    proto_ollama_free(&r);
}

TEST(errors_name_the_field)
{
    static const struct {
        const char *body;
        int chat, status;
        const char *param;
    } cases[] = {
        {"{\"prompt\":\"p\"}", 0, 400, "model"},
        {"{\"model\":\"m\",\"options\":{\"temperature\":2.5}}", 0, 400, "options.temperature"},
        {"{\"model\":\"m\",\"options\":{\"stop\":[\"a\",5]}}", 1, 400, "options.stop[1]"},
        {"{\"model\":\"m\",\"context\":[1,100]}", 0, 400, "context[1]"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 1, 400,
         "messages[0].role"},
        {"{\"model\":\"m\",\"format\":\"xml\"}", 1, 400, "format"},
        {"{\"model\":\"m\",\"format\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}", 1, 400,
         "format"},
        {"{\"model\":\"m\",\"template\":\"t\"}", 0, 400, "template"},
        {"{\"model\":\"m\",", 0, 400, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_ollama_req_t r;
        proto_error_t e;
        CHECK_MSG(parse(cases[i].body, cases[i].chat, &r, &e) < 0, "case %zu accepted", i);
        CHECK_INT_EQ(e.status, cases[i].status);
        CHECK_STR_EQ(e.param, cases[i].param);
        CHECK(r.model == NULL && r.messages == NULL); /* zeroed on failure */
        char *j = proto_ollama_error_json(&e);
        json_t *o = json_loads(j, 0, NULL);
        CHECK(o && json_object_size(o) == 1 &&
              !strcmp(json_string_value(json_object_get(o, "error")), e.message));
        json_decref(o);
        proto_free(j);
    }
}

TEST(response_shapes)
{
    int32_t ctx[3] = {1, 2, 3};
    proto_token_logprob_t lp = {"a", 1, 5, -0.5, 0, NULL, 0};
    proto_ollama_resp_t r = {.model = "m",
                             .created_at = "t",
                             .text = "hi",
                             .text_len = 2,
                             .done = 1,
                             .done_reason = "stop",
                             .with_stats = 1,
                             .eval_count = 2,
                             .context = ctx,
                             .n_context = 3,
                             .with_logprobs = 1,
                             .logprobs = &lp,
                             .n_logprobs = 1};
    char *s = proto_ollama_resp_json(&r);
    json_t *o = json_loads(s, 0, NULL);
    CHECK(o != NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(o, "response")), "hi");
    CHECK(json_is_true(json_object_get(o, "done")));
    CHECK_INT_EQ(json_array_size(json_object_get(o, "context")), 3);
    CHECK_INT_EQ(json_integer_value(json_object_get(o, "eval_count")), 2);
    CHECK_STR_EQ(json_string_value(
                     json_object_get(json_array_get(json_object_get(o, "logprobs"), 0), "token")),
                 "a");
    json_decref(o);
    proto_free(s);

    proto_ollama_resp_t c = {
        .chat = 1, .model = "m", .created_at = "t", .text = "x", .text_len = 1};
    s = proto_ollama_resp_json(&c);
    o = json_loads(s, 0, NULL);
    CHECK(o && !json_object_get(o, "done_reason") && !json_object_get(o, "context") &&
          !json_object_get(o, "response"));
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(o, "message"), "role")),
                 "assistant");
    json_decref(o);
    proto_free(s);

    proto_ollama_model_t m = {.name = "m:latest", .size = 9, .digest = "d", .family = "llama"};
    s = proto_ollama_models_json(&m, 1, 1);
    o = json_loads(s, 0, NULL);
    json_t *e0 = json_array_get(json_object_get(o, "models"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(e0, "model")), "m:latest");
    CHECK(json_object_get(e0, "context_length") == NULL); /* 0 = omitted */
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(e0, "details"), "format")),
                 "gguf");
    json_decref(o);
    proto_free(s);
}

/* ---- allocation failures ---- */

static int op(void)
{
    proto_ollama_req_t r;
    proto_error_t e;
    int ok = parse("{\"model\":\"m\",\"prompt\":\"p\",\"system\":\"s\",\"context\":[1,2],"
                   "\"options\":{\"stop\":[\"a\",\"b\"],\"num_ctx\":1}}",
                   0, &r, &e) == 0;
    proto_ollama_free(&r);
    ok &= parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 1, &r,
                &e) == 0;
    proto_ollama_free(&r);
    char *name = NULL;
    ok &= proto_ollama_show_parse("{\"name\":\"m\"}", 12, &name, &e) == 0;
    proto_free(name);
    int32_t ctx[2] = {1, 2};
    proto_ollama_resp_t o = {.model = "m",
                             .text = "t",
                             .text_len = 1,
                             .done = 1,
                             .with_stats = 1,
                             .context = ctx,
                             .n_context = 2};
    char *s = proto_ollama_resp_json(&o);
    ok &= s != NULL;
    proto_free(s);
    proto_ollama_model_t m = {.name = "m"};
    proto_ollama_info_t in = {.arch = "llama"};
    s = proto_ollama_show_json(&m, &in, "FROM m", "tmpl");
    ok &= s != NULL;
    proto_free(s);
    return ok;
}

TEST(allocation_failures)
{
    check_alloc_failures(op);
}

/* proto_peek_model: what the router of several models reads first. */
TEST(peek_model)
{
    char out[16];
    const char *b = "{\"model\":\"gemma3-270m\",\"prompt\":\"x\"}";
    CHECK(proto_peek_model(b, strlen(b), NULL, out, sizeof out) == 1);
    CHECK_STR_EQ(out, "gemma3-270m");
    b = "{\"name\":\"tiny:latest\"}"; /* Ollama's older key, when asked for */
    CHECK(proto_peek_model(b, strlen(b), NULL, out, sizeof out) == 0);
    CHECK(proto_peek_model(b, strlen(b), "name", out, sizeof out) == 1);
    CHECK_STR_EQ(out, "tiny:latest");
    b = "{\"model\":\"a\",\"name\":\"b\"}"; /* "model" wins */
    CHECK(proto_peek_model(b, strlen(b), "name", out, sizeof out) == 1);
    CHECK_STR_EQ(out, "a");
    /* absent, empty, not a string, not JSON, not an object: 0 (the request's
     * own parse says what is wrong) */
    static const char *const none[] = {"{}", "{\"model\":\"\"}", "{\"model\":3}",
                                       "{\"model\":null}", "not json", "[\"model\"]", ""};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        CHECK(proto_peek_model(none[i], strlen(none[i]), "name", out, sizeof out) == 0);
        CHECK_STR_EQ(out, "");
    }
    CHECK(proto_peek_model(NULL, 0, NULL, out, sizeof out) == 0);
    /* too long for out: -1; a NUL inside is not JSON the parser takes: 0 */
    b = "{\"model\":\"0123456789abcdef\"}";
    CHECK(proto_peek_model(b, strlen(b), NULL, out, sizeof out) == -1);
    b = "{\"model\":\"a\\u0000b\"}";
    CHECK(proto_peek_model(b, strlen(b), NULL, out, sizeof out) == 0);
}

int main(void)
{
    RUN(peek_model);
    RUN(defaults_are_ollamas);
    RUN(options_map_to_the_sampler);
    RUN(ignored_list_is_bounded);
    RUN(errors_name_the_field);
    RUN(response_shapes);
    RUN(allocation_failures);
    return CHECK_DONE();
}
