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

TEST(tools_and_tool_blocks_become_the_chat_request)
{
    proto_chat_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(
        parse("{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"tools\":[{\"name\":\"f\","
              "\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}},{\"type\":\"custom\","
              "\"name\":\"g\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":"
              "\"g\","
              "\"disable_parallel_tool_use\":true},\"messages\":[{\"role\":\"user\",\"content\":"
              "\"q\"},"
              "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
              "\"f\",\"input\":{\"a\":1}}]},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
              "\"text\":\"pre\"},{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{"
              "\"type\":\"text\",\"text\":\"r\"}],\"is_error\":true},{\"type\":\"text\",\"text\":"
              "\"post\"}]}]}",
              &r, &e),
        0);
    CHECK_INT_EQ(r.p.stream, 1);
    CHECK_INT_EQ((int)r.n_tools, 2);
    CHECK_STR_EQ(r.tools[1].name, "g");
    CHECK_INT_EQ(r.tool_choice, PROTO_TOOL_CHOICE_NAMED);
    CHECK_INT_EQ((int)r.tool_named, 1);
    CHECK_INT_EQ(r.parallel_tool_calls, 0);
    /* q, the call, "pre", the result, "post" */
    CHECK_INT_EQ((int)r.n_messages, 5);
    CHECK_INT_EQ(r.messages[1].role, PROTO_ROLE_ASSISTANT);
    CHECK_INT_EQ((int)r.messages[1].n_tool_calls, 1);
    CHECK_STR_EQ(r.messages[1].tool_calls[0].name, "f");
    CHECK_STR_EQ(r.messages[2].content, "pre");
    CHECK_INT_EQ(r.messages[3].role, PROTO_ROLE_TOOL);
    CHECK_STR_EQ(r.messages[3].content, "Error: r");
    CHECK_STR_EQ(r.messages[4].content, "post");
    proto_chat_free(&r);
    /* "any" is a forced call of any tool */
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"max_tokens\":9,\"tools\":[{\"name\":\"f\","
                       "\"input_schema\":{}}],\"tool_choice\":{\"type\":\"any\"},\"messages\":"
                       "[{\"role\":\"user\",\"content\":\"q\"}]}",
                       &r, &e),
                 0);
    CHECK_INT_EQ(r.tool_choice, PROTO_TOOL_CHOICE_REQUIRED);
    proto_chat_free(&r);
}

TEST(count_tokens_request)
{
    proto_chat_req_t r;
    proto_error_t e;
    const char *ok = "{\"model\":\"m\",\"system\":\"s\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"a\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]}";
    CHECK_INT_EQ(proto_messages_count_parse(ok, strlen(ok), NULL, &r, &e), 0);
    CHECK_INT_EQ((int)r.n_messages, 2);
    CHECK_INT_EQ((int)r.n_tools, 1);
    proto_chat_free(&r);
    const char *bad = "{\"model\":\"m\",\"max_tokens\":3,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"a\"}]}";
    CHECK(proto_messages_count_parse(bad, strlen(bad), NULL, &r, &e) < 0);
    CHECK_STR_EQ(e.param, "max_tokens");
    const char *none = "{\"model\":\"m\"}";
    CHECK(proto_messages_count_parse(none, strlen(none), NULL, &r, &e) < 0);
    CHECK_STR_EQ(e.param, "messages");
}

TEST(stream_events_and_tool_use_answer)
{
    size_t n = 0;
    char *f = proto_messages_event(
        &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TEXT_DELTA, .index = 2, .text = "hi", .len = 2}, &n);
    CHECK_STR_EQ(f, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
                    "\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n");
    CHECK_INT_EQ((int)n, (int)strlen(f));
    proto_free(f);
    f = proto_messages_event(&(proto_msg_ev_t){.kind = PROTO_MSG_EV_MESSAGE_DELTA,
                                               .stop_reason = "tool_use",
                                               .output_tokens = 7},
                             NULL);
    CHECK_STR_EQ(f, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{"
                    "\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{"
                    "\"output_tokens\":7}}\n\n");
    proto_free(f);
    CHECK(proto_messages_event(&(proto_msg_ev_t){.kind = (proto_msg_ev_kind_t)99}, NULL) == NULL);
    proto_messages_end_t m = {.id = "msg_1", .model = "m", .stop_reason = "tool_use"};
    char *s = proto_messages_json(
        "{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"id\":\"call_abc\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},{\"id\":\"call_d\","
        "\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"cut\"}}]}}]}",
        &m);
    CHECK_STR_EQ(s, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\","
                    "\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_abc\",\"name\":\"f\","
                    "\"input\":{\"a\":1}},{\"type\":\"tool_use\",\"id\":\"toolu_d\",\"name\":\"g\","
                    "\"input\":{}}],\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":"
                    "{\"input_tokens\":0,\"output_tokens\":0}}");
    proto_free(s);
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
         "tools[0].input_schema"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}",
         "tools[0].type"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tools\":[{\"name\":\"f\",\"input_schema\":{},\"x\":1}]}",
         "tools[0].x"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\",\"properties\":"
         "{\"n\":{\"type\":\"number\",\"multipleOf\":2}}}}]}",
         "tools[0].input_schema"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tool_choice\":{\"type\":\"maybe\"}}",
         "tool_choice"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\"}}",
         "tool_choice.name"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
         "thinking"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"stream\":1}",
         "stream"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\",\"content\":"
         "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":[]}]}]}",
         "messages[0].content[0].input"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
         "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
         "messages[0].content[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
         "[{\"type\":\"image\",\"source\":{}}]}]}",
         "messages[0].content[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
         "\"temperature\":2}",
         "temperature"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}",
         "messages[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{"
         "\"type\":"
         "\"tool_result\"}]}]}",
         "messages[0].content[0].tool_use_id"},
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
    ok &=
        parse("{\"model\":\"m\",\"max_tokens\":3,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
              "\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":[{"
              "\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"r\"}]},{\"role\":"
              "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\","
              "\"input\":{}}]}]}",
              &r, &e) == 0;
    proto_chat_free(&r);
    s = proto_messages_event(&(proto_msg_ev_t){.kind = PROTO_MSG_EV_MESSAGE_START, .id = "i"},
                             NULL);
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
    RUN(tools_and_tool_blocks_become_the_chat_request);
    RUN(count_tokens_request);
    RUN(stream_events_and_tool_use_answer);
    RUN(refusals_name_the_field);
    RUN(answer_and_error_shapes);
    RUN(allocation_failures);
    return CHECK_DONE();
}
