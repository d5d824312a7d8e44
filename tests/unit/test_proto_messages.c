/* test_proto_messages.c — Anthropic's Messages API in proto/anthropic.c: a
 * request read into the chat request (system first, text blocks joined,
 * stop_sequences as stop), the refusals with their field, the answer and
 * error shapes, and allocation failures (an error or NULL, never a crash or
 * a leak under ASan). End to end: tests/integration/test_api_messages.py. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/alloc_fail.h"
#include "tests/unit/check.h"

static int parse(const char *body, proto_chat_req_t *r, proto_error_t *e)
{
    proto_limits_t lim = {.max_tokens_limit = 1000};
    return proto_messages_parse(body, strlen(body), &lim, r, e);
}

TEST(request_becomes_the_chat_request)
{
    proto_chat_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"max_tokens\":9,\"system\":[{\"type\":\"text\","
                       "\"text\":\"S\"}],\"stop_sequences\":[\"x\",\"y\"],\"temperature\":0.5,"
                       "\"top_k\":3,\"metadata\":{\"user_id\":\"u\"},\"messages\":[{\"role\":"
                       "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":"
                       "\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":\"c\"}]}",
                       &r, &e),
                 0);
    CHECK_INT_EQ((int)r.n_messages, 3);
    CHECK_INT_EQ(r.messages[0].role, PROTO_ROLE_SYSTEM);
    CHECK_STR_EQ(r.messages[0].content, "S");
    CHECK_STR_EQ(r.messages[1].content, "ab");
    CHECK_INT_EQ(r.messages[2].role, PROTO_ROLE_ASSISTANT);
    CHECK_INT_EQ((int)r.p.max_tokens, 9);
    CHECK_INT_EQ((int)r.p.n_stop, 2);
    CHECK_STR_EQ(r.p.stop[1], "y");
    CHECK_NEAR(r.p.sampling.temperature, 0.5, 0);
    CHECK_INT_EQ(r.p.sampling.top_k, 3);
    proto_chat_free(&r);
}

TEST(refusals_name_the_field)
{
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "model"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "max_tokens"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", "messages"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"n\":2}",
         "n"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tools\":[{}]}",
         "tools"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"stream\":true}",
         "stream"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"temperature\":2}",
         "temperature"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}",
         "messages[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{"
         "\"type\":"
         "\"tool_result\"}]}]}",
         "messages[0].content[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\"}]}",
         "messages[0].content"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_chat_req_t r;
        proto_error_t e;
        CHECK(parse(cases[i].body, &r, &e) < 0);
        CHECK_STR_EQ(e.param, cases[i].param);
        CHECK_INT_EQ(e.status, 400);
    }
}

TEST(answer_and_error_shapes)
{
    proto_messages_end_t m = {
        .id = "msg_1", .model = "m", .stop_reason = "stop_sequence", .stop_sequence = "x"};
    char *s = proto_messages_json("{\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"usage\":"
                                  "{\"prompt_tokens\":5,\"completion_tokens\":2}}",
                                  &m);
    CHECK_STR_EQ(s, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\","
                    "\"content\":[{\"type\":\"text\",\"text\":\"hi\"}],\"stop_reason\":"
                    "\"stop_sequence\",\"stop_sequence\":\"x\",\"usage\":{\"input_tokens\":5,"
                    "\"output_tokens\":2}}");
    proto_free(s);
    proto_error_t e;
    proto_error_set(&e, PROTO_ERR_RATE_LIMIT, NULL, "busy");
    s = proto_anthropic_error_json(&e);
    CHECK_STR_EQ(s, "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":"
                    "\"busy\"}}");
    proto_free(s);
}

static int op(void)
{
    proto_chat_req_t r;
    proto_error_t e;
    int ok = parse("{\"model\":\"m\",\"max_tokens\":3,\"system\":\"s\",\"messages\":[{\"role\":"
                   "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}",
                   &r, &e) == 0;
    proto_chat_free(&r);
    proto_messages_end_t m = {.id = "msg_1", .model = "m"};
    char *s = proto_messages_json("{\"choices\":[{\"message\":{\"content\":\"hi\"}}]}", &m);
    ok &= s != NULL;
    proto_free(s);
    return ok;
}

TEST(allocation_failures)
{
    check_alloc_failures(op);
}

int main(void)
{
    RUN(request_becomes_the_chat_request);
    RUN(refusals_name_the_field);
    RUN(answer_and_error_shapes);
    RUN(allocation_failures);
    return CHECK_DONE();
}
