/* test_proto_responses.c — OpenAI's Responses API in proto/responses.c: a
 * request read into the chat request (instructions first, input items as
 * messages, function calls and their outputs, function tools, text.format
 * as response_format, max_output_tokens), the refusals naming their field,
 * the response object and the stream events, and allocation failures (an
 * error or NULL, never a crash or a leak under ASan). End to end:
 * tests/integration/test_api_responses.py. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/alloc_fail.h"
#include "tests/unit/check.h"

static int parse(const char *body, proto_responses_req_t *r, proto_error_t *e)
{
    proto_limits_t lim = {.max_tokens_limit = 1000};
    return proto_responses_parse(body, strlen(body), &lim, r, e);
}

TEST(text_input_and_defaults)
{
    proto_responses_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be brief\","
                       "\"max_output_tokens\":7,\"temperature\":0.5,\"top_p\":0.9}",
                       &r, &e),
                 0);
    CHECK_INT_EQ(r.store, 1);
    CHECK_STR_EQ(r.previous_id, "");
    CHECK_INT_EQ((int)r.chat.n_messages, 2);
    CHECK_INT_EQ(r.chat.messages[0].role, PROTO_ROLE_SYSTEM);
    CHECK_STR_EQ(r.chat.messages[0].content, "be brief");
    CHECK_STR_EQ(r.chat.messages[1].content, "hi");
    CHECK_INT_EQ((int)r.chat.p.max_tokens, 7);
    CHECK_NEAR(r.chat.p.sampling.temperature, 0.5, 0);
    /* the answer repeats what was asked, with OpenAI's defaults */
    json_t *echo = json_loads(r.echo, 0, NULL);
    CHECK(echo != NULL);
    CHECK_INT_EQ((int)json_integer_value(json_object_get(echo, "max_output_tokens")), 7);
    CHECK(json_is_true(json_object_get(echo, "store")));
    CHECK_STR_EQ(json_string_value(json_object_get(echo, "tool_choice")), "auto");
    CHECK_STR_EQ(json_string_value(json_object_get(
                     json_object_get(json_object_get(echo, "text"), "format"), "type")),
                 "text");
    json_decref(echo);
    proto_responses_free(&r);
}

TEST(items_tools_and_format)
{
    proto_responses_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(
        parse(
            "{\"model\":\"m\",\"store\":false,\"previous_response_id\":\"resp_1\",\"input\":["
            "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
            "{\"type\":\"input_text\",\"text\":\"b\"}]},"
            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
            "\"text\":\"c\"}]},"
            "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":"
            "\"{\\\"x\\\":1}\"},"
            "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"r\"}],"
            "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\","
            "\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
            "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"parallel_tool_calls\":false,"
            "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"s\",\"schema\":"
            "{\"type\":\"object\"}}},\"metadata\":{\"k\":\"v\"},\"reasoning\":{\"effort\":null},"
            "\"include\":[],\"background\":false,\"truncation\":\"disabled\"}",
            &r, &e) < 0,
        1);
    /* a forced tool choice cannot be combined with a JSON format: the chat
     * route's rule, named as this API names the field */
    CHECK_STR_EQ(e.param, "tool_choice");
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"store\":false,\"previous_response_id\":\"resp_1\","
                       "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
                       "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
                       "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
                       "\"output_text\",\"text\":\"c\"}]},"
                       "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\","
                       "\"arguments\":\"{\\\"x\\\":1}\"},"
                       "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":"
                       "\"r\"}],\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":"
                       "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"function\","
                       "\"name\":\"f\"},\"parallel_tool_calls\":false}",
                       &r, &e),
                 0);
    CHECK_INT_EQ(r.store, 0);
    CHECK_STR_EQ(r.previous_id, "resp_1");
    /* user "ab", assistant "c" with the call, the tool's result */
    CHECK_INT_EQ((int)r.chat.n_messages, 3);
    CHECK_STR_EQ(r.chat.messages[0].content, "ab");
    CHECK_STR_EQ(r.chat.messages[1].content, "c");
    CHECK_INT_EQ((int)r.chat.messages[1].n_tool_calls, 1);
    CHECK_STR_EQ(r.chat.messages[1].tool_calls[0].id, "call_1");
    CHECK_INT_EQ(r.chat.messages[2].role, PROTO_ROLE_TOOL);
    CHECK_STR_EQ(r.chat.messages[2].tool_call_id, "call_1");
    CHECK_INT_EQ((int)r.chat.n_tools, 1);
    CHECK_INT_EQ(r.chat.tool_choice, PROTO_TOOL_CHOICE_NAMED);
    CHECK_INT_EQ(r.chat.parallel_tool_calls, 0);
    proto_responses_free(&r);
    /* a call alone opens an assistant message; json_schema is a grammar */
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\","
                       "\"name\":\"f\",\"arguments\":\"{}\"}],\"text\":{\"format\":{\"type\":"
                       "\"json_schema\",\"name\":\"s\",\"schema\":{\"type\":\"object\","
                       "\"properties\":{\"a\":{\"type\":\"integer\"}}},\"strict\":true}}}",
                       &r, &e),
                 0);
    CHECK_INT_EQ(r.chat.messages[0].role, PROTO_ROLE_ASSISTANT);
    CHECK(r.chat.p.grammar != NULL);
    proto_responses_free(&r);
    /* output items sent back as input, with their ids and statuses */
    CHECK_INT_EQ(parse("{\"input\":[{\"id\":\"msg_1\",\"type\":\"message\",\"status\":"
                       "\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
                       "\"output_text\",\"text\":\"t\",\"annotations\":[],\"logprobs\":[]}]},"
                       "{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\","
                       "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
                       "\"function_call_output\",\"call_id\":\"c\",\"output\":\"r\"}]}",
                       &r, &e),
                 0);
    CHECK_INT_EQ((int)r.chat.n_messages, 2);
    CHECK_STR_EQ(r.chat.messages[0].content, "t");
    CHECK_INT_EQ((int)r.chat.messages[0].n_tool_calls, 1);
    proto_responses_free(&r);
}

TEST(refusals_name_the_field)
{
    static const struct {
        const char *body, *param;
        int status;
    } cases[] = {
        {"{\"model\":\"m\"}", "input", 400},
        {"{\"input\":\"a\",\"seed\":1}", "seed", 400},
        {"{\"input\":\"a\",\"background\":true}", "background", 400},
        {"{\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type", 400},
        {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"x\":1}]}",
         "tools[0].x", 400},
        {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{"
         "\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"multipleOf\":2}}}}]}",
         "tools[0].parameters", 400},
        {"{\"input\":\"a\",\"tool_choice\":{\"type\":\"web_search\"}}", "tool_choice", 400},
        {"{\"input\":\"a\",\"include\":[\"reasoning.encrypted_content\"]}", "include", 400},
        {"{\"input\":\"a\",\"reasoning\":{\"effort\":\"high\"}}", "reasoning", 400},
        {"{\"input\":\"a\",\"truncation\":\"auto\"}", "truncation", 400},
        {"{\"input\":\"a\",\"top_logprobs\":2}", "top_logprobs", 400},
        {"{\"input\":\"a\",\"conversation\":\"c\"}", "conversation", 400},
        {"{\"input\":\"a\",\"store\":\"yes\"}", "store", 400},
        {"{\"input\":\"a\",\"previous_response_id\":\"\"}", "previous_response_id", 400},
        {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type", 400},
        {"{\"input\":\"a\",\"text\":{\"verbosity\":\"low\"}}", "text.verbosity", 400},
        {"{\"input\":\"a\",\"max_output_tokens\":0}", "max_output_tokens", 400},
        {"{\"input\":5}", "input", 400},
        {"{\"input\":[]}", "input", 400},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "input[0].role", 400},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
         "\"x\"}]}]}",
         "input[0].content[0]", 400},
        {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "input[0].type", 400},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
         "input[0].call_id", 400},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0].output",
         400},
        {"{\"input\":\"a\",\"stream_options\":{\"include_usage\":true}}", "stream_options", 400},
        {"{\"input\":[{\"role\":\"user\",\"content\":\"a\",\"name\":\"x\"}]}", "input[0].name",
         400},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\","
         "\"x\":1}]}]}",
         "input[0].content[0].x", 400},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":"
         "\"{}\",\"x\":1}]}",
         "input[0].x", 400},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"r\","
         "\"x\":1}]}",
         "input[0].x", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_responses_req_t r;
        proto_error_t e;
        CHECK(parse(cases[i].body, &r, &e) < 0);
        CHECK_STR_EQ(e.param, cases[i].param);
        CHECK_INT_EQ(e.status, cases[i].status);
        CHECK(r.echo == NULL);
    }
    proto_responses_req_t r;
    proto_error_t e;
    CHECK(parse("{\"input\":\"a\",\"max_output_tokens\":0}", &r, &e) < 0);
    CHECK(strstr(e.message, "max_output_tokens") != NULL);
}

TEST(answer_and_events)
{
    proto_rsp_call_t call = {"fc_1", "call_1", "f", "{\"x\":1}", 7};
    proto_rsp_out_t o = {.id = "resp_1",
                         .created_at = 5,
                         .model = "m",
                         .status = "completed",
                         .echo = "{\"store\":true}",
                         .has_message = 1,
                         .msg_id = "msg_1",
                         .text = "hi",
                         .text_len = 2,
                         .calls = &call,
                         .n_calls = 1,
                         .with_usage = 1,
                         .input_tokens = 3,
                         .output_tokens = 4};
    char *s = proto_responses_json(&o);
    CHECK_STR_EQ(s, "{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":5,\"status\":"
                    "\"completed\",\"background\":false,\"error\":null,\"incomplete_details\":"
                    "null,\"model\":\"m\",\"output\":[{\"id\":\"msg_1\",\"type\":\"message\","
                    "\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
                    "\"output_text\",\"text\":\"hi\",\"annotations\":[],\"logprobs\":[]}]},{\"id\":"
                    "\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":"
                    "\"call_1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}],\"usage\":{"
                    "\"input_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":0},"
                    "\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                    "\"total_tokens\":7},\"store\":true}");
    proto_free(s);
    size_t n = 0;
    s = proto_responses_event(&(proto_rsp_ev_t){.type = "response.output_text.delta",
                                                .seq = 4,
                                                .item_id = "msg_1",
                                                .output_index = 0,
                                                .text = "h",
                                                .len = 1},
                              &n);
    CHECK_STR_EQ(s, "event: response.output_text.delta\ndata: {\"type\":"
                    "\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\","
                    "\"output_index\":0,\"content_index\":0,\"delta\":\"h\",\"logprobs\":[]}\n\n");
    CHECK_INT_EQ((int)n, (int)strlen(s));
    proto_free(s);
    s = proto_responses_event(&(proto_rsp_ev_t){.type = "response.function_call_arguments.done",
                                                .seq = 9,
                                                .item_id = "fc_1",
                                                .output_index = 1,
                                                .text = "{}",
                                                .len = 2,
                                                .name = "f"},
                              NULL);
    CHECK_STR_EQ(s, "event: response.function_call_arguments.done\ndata: {\"type\":"
                    "\"response.function_call_arguments.done\",\"sequence_number\":9,"
                    "\"item_id\":\"fc_1\",\"output_index\":1,\"arguments\":\"{}\",\"name\":"
                    "\"f\"}\n\n");
    proto_free(s);
    CHECK(proto_responses_event(&(proto_rsp_ev_t){.type = NULL}, NULL) == NULL);
    /* a response text that is not JSON is no event */
    CHECK(proto_responses_event(&(proto_rsp_ev_t){.type = "response.completed", .response = "{"},
                                NULL) == NULL);
}

static int op(void)
{
    proto_responses_req_t r;
    proto_error_t e;
    int ok = parse("{\"model\":\"m\",\"instructions\":\"s\",\"input\":[{\"role\":\"user\","
                   "\"content\":\"a\"},{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":"
                   "\"f\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
                   "\"c\",\"output\":\"r\"}],\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
                   "\"text\":{\"format\":{\"type\":\"json_object\"}}}",
                   &r, &e) == 0;
    proto_responses_free(&r);
    proto_rsp_call_t call = {"fc_1", "call_1", "f", "{}", 2};
    proto_rsp_out_t o = {.id = "r",
                         .echo = "{}",
                         .has_message = 1,
                         .text = "t",
                         .text_len = 1,
                         .calls = &call,
                         .n_calls = 1,
                         .with_usage = 1};
    char *s = proto_responses_json(&o);
    ok &= s != NULL;
    proto_free(s);
    s = proto_responses_event(
        &(proto_rsp_ev_t){
            .type = "response.content_part.added", .item_id = "m", .text = "", .len = 0},
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
    RUN(text_input_and_defaults);
    RUN(items_tools_and_format);
    RUN(refusals_name_the_field);
    RUN(answer_and_events);
    RUN(allocation_failures);
    return CHECK_DONE();
}
