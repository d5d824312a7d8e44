/* test_proto_tools.c — the tool-call output parser and the generic format's
 * prompt texts (proto/tools.h): well-formed calls in both modes, every kind
 * of malformed text coming back as content, the same result whatever the
 * pieces the output arrives in, and random bytes (no call: the content is
 * the input, byte for byte).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/tools.h"
#include "tests/unit/check.h"

#define MAXC 16

typedef struct result {
    char content[8192];
    size_t n_content;
    int n_calls;
    char name[MAXC][80];
    char args[MAXC][2048];
    int bad_order; /* an ARGS before its CALL, or indices out of order */
} result_t;

static void collect(void *ud, const proto_tool_ev_t *ev)
{
    result_t *r = ud;
    if (ev->kind == PROTO_TOOL_EV_CONTENT) {
        if (ev->len == 0 || r->n_content + ev->len >= sizeof r->content)
            r->bad_order = 1;
        else
            memcpy(r->content + r->n_content, ev->text, ev->len);
        r->n_content += ev->len;
        r->content[r->n_content < sizeof r->content ? r->n_content : 0] = '\0';
    } else if (ev->kind == PROTO_TOOL_EV_CALL) {
        if (ev->index != r->n_calls || r->n_calls >= MAXC) {
            r->bad_order = 1;
            return;
        }
        snprintf(r->name[r->n_calls], sizeof r->name[0], "%.*s", (int)ev->len, ev->text);
        r->n_calls++;
    } else {
        if (ev->index != r->n_calls - 1) {
            r->bad_order = 1;
            return;
        }
        char *a = r->args[ev->index];
        size_t n = strlen(a);
        snprintf(a + n, sizeof r->args[0] - n, "%.*s", (int)ev->len, ev->text);
    }
}

static const char *const NAMES[] = {"f", "get_weather", "g-2"};

/* Runs the parser over text cut at the given points (cuts[n_cuts], sorted). */
static void run_cuts(const char *text, int incremental, int max_calls, const size_t *cuts,
                     size_t n_cuts, result_t *r)
{
    memset(r, 0, sizeof *r);
    proto_tool_parser_t *p = proto_tool_parser_new(NAMES, 3, incremental, max_calls, collect, r);
    CHECK(p != NULL);
    size_t len = strlen(text), at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        CHECK(proto_tool_parser_feed(p, text + at, to - at) == 0);
        at = to;
    }
    CHECK(proto_tool_parser_finish(p) == 0);
    CHECK(proto_tool_parser_calls(p) == r->n_calls);
    proto_tool_parser_free(p);
    CHECK(!r->bad_order);
}

static void run(const char *text, int incremental, int max_calls, result_t *r)
{
    run_cuts(text, incremental, max_calls, NULL, 0, r);
}

static int same(const result_t *a, const result_t *b)
{
    if (a->n_content != b->n_content || memcmp(a->content, b->content, a->n_content) ||
        a->n_calls != b->n_calls)
        return 0;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->name[i], b->name[i]) || strcmp(a->args[i], b->args[i]))
            return 0;
    return 1;
}

/* The result does not depend on where the text is cut: every single cut,
 * and every byte on its own. */
static void check_any_pieces(const char *text, int incremental, int max_calls)
{
    result_t whole, part;
    run(text, incremental, max_calls, &whole);
    size_t len = strlen(text);
    for (size_t c = 0; c <= len; c++) {
        run_cuts(text, incremental, max_calls, &c, 1, &part);
        CHECK_MSG(same(&whole, &part), "cut at %zu of '%s'", c, text);
    }
    size_t *all = malloc((len + 1) * sizeof *all);
    for (size_t c = 0; c < len; c++)
        all[c] = c;
    run_cuts(text, incremental, max_calls, all, len, &part);
    free(all);
    if (!incremental) /* incremental ARGS fragments differ, their concatenation not */
        CHECK_MSG(same(&whole, &part), "bytes of '%s'", text);
    else
        CHECK_MSG(same(&whole, &part), "bytes (incremental) of '%s'", text);
}

#define CALL(name, args)                                                                           \
    "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " args "}\n</tool_call>"

TEST(auto_calls)
{
    result_t r;
    run("  \n" CALL("f", "{\"a\": 1}"), 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.name[0], "f");
    CHECK_STR_EQ(r.args[0], "{\"a\":1}");
    CHECK_INT_EQ((int)r.n_content, 0);

    run(CALL("f", "{}") "\n\n " CALL("g-2", "{\"s\": \"}\\\"{\", \"n\": [1, {\"x\": null}]}") "\n",
        0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 2);
    CHECK_STR_EQ(r.name[1], "g-2");
    CHECK_STR_EQ(r.args[1], "{\"s\":\"}\\\"{\",\"n\":[1,{\"x\":null}]}");
    CHECK_INT_EQ((int)r.n_content, 0);

    /* the arguments as a JSON string, "parameters" for "arguments", keys in
     * any order, an escaped name, no closing tag at the very end */
    run("<tool_call>{\"arguments\": \"{\\\"q\\\": 2.5}\", \"name\": \"get_weather\"}", 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.args[0], "{\"q\":2.5}");
    run("<tool_call> {\"name\": \"\\u0066\", \"parameters\": {\"b\": true}} </tool_call>", 0, 8,
        &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.name[0], "f");
    CHECK_STR_EQ(r.args[0], "{\"b\":true}");

    /* text after the calls is content; so are calls past max_calls */
    run(CALL("f", "{}") " and then", 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.content, "and then");
    run(CALL("f", "{}") "\n" CALL("g-2", "{}"), 0, 1, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.content, CALL("g-2", "{}"));
    run("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}}\n</tool_call>", 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.content, "}\n</tool_call>");
    run("<tool_call>{\"name\": \"f\", \"arguments\": {}} trailing", 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.content, "trailing");
}

TEST(malformed_is_content)
{
    static const char *const bad[] = {
        "Hello there",
        "  \n ",
        "",
        "Sure! " CALL("f", "{}"),
        "<tool_ca",
        "<tool_cal>{}",
        "<tool_call>",
        "<tool_call>\n",
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call>\n{\"name\": \"f\"",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
        "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\" \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\" \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}}\n</tool_call>",
        "<tool_call>\nx{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        result_t r;
        run(bad[i], 0, 8, &r);
        CHECK_MSG(r.n_calls == 0, "'%s' gave a call", bad[i]);
        CHECK_MSG(r.n_content == strlen(bad[i]) && !memcmp(r.content, bad[i], r.n_content),
                  "'%s' came back as '%s'", bad[i], r.content);
        check_any_pieces(bad[i], 0, 8);
    }
    /* a malformed second call: the first stands, the rest is content */
    result_t r;
    run(CALL("f", "{}") "\n<tool_call>\n{\"name\": \"zz\"}", 0, 8, &r);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.content, "<tool_call>\n{\"name\": \"zz\"}");
}

TEST(incremental_reports_as_it_goes)
{
    const char *t =
        CALL("get_weather", "{\"city\": \"Pa\\\"ris\", \"n\": [1, 2]}") "\n" CALL("f", "{}");
    result_t r;
    run(t, 1, 8, &r);
    CHECK_INT_EQ(r.n_calls, 2);
    CHECK_STR_EQ(r.name[0], "get_weather");
    CHECK_STR_EQ(r.args[0], "{\"city\": \"Pa\\\"ris\", \"n\": [1, 2]}");
    CHECK_STR_EQ(r.args[1], "{}");
    CHECK_INT_EQ((int)r.n_content, 0);
    check_any_pieces(t, 1, 8);

    /* the name is reported before the arguments have arrived */
    memset(&r, 0, sizeof r);
    proto_tool_parser_t *p = proto_tool_parser_new(NAMES, 3, 1, 8, collect, &r);
    const char *head = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"";
    CHECK(proto_tool_parser_feed(p, head, strlen(head)) == 0);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_STR_EQ(r.args[0], "{\"a\"");
    CHECK(proto_tool_parser_feed(p, ": 1", 3) == 0);
    CHECK_STR_EQ(r.args[0], "{\"a\": 1");
    /* cut short (max_tokens): the call stays as reported */
    CHECK(proto_tool_parser_finish(p) == 0);
    CHECK_INT_EQ(r.n_calls, 1);
    CHECK_INT_EQ((int)r.n_content, 0);
    proto_tool_parser_free(p);

    /* an unknown name is never reported */
    run("<tool_call>\n{\"name\": \"zz\", \"arguments\": {}}\n</tool_call>", 1, 8, &r);
    CHECK_INT_EQ(r.n_calls, 0);
    CHECK(r.n_content > 0);
}

TEST(pieces_do_not_matter)
{
    static const char *const texts[] = {
        CALL("f", "{\"a\": 1}"),
        " \n" CALL("f", "{}") "\n" CALL("g-2", "{\"x\": \"<tool_call>\"}") " tail",
        "<tool_call>{\"arguments\": {\"k\": [true, false, null, -1.5e3]}, \"name\": \"f\"}",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_cal",
        "text <tool_call>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        check_any_pieces(texts[i], 0, 8);
        check_any_pieces(texts[i], 0, 1);
    }
}

TEST(random_bytes)
{
    /* an alphabet that makes tags and JSON likely */
    static const char alpha[] = "<tool_cal>/{}[]\":, \n\\fname argumets0123";
    unsigned s = 12345;
    for (int it = 0; it < 3000; it++) {
        char t[160];
        size_t n = 1 + (size_t)(it % 150);
        if (it % 3 == 0) {
            /* a real call with bytes changed */
            snprintf(t, sizeof t, "%s", CALL("f", "{\"a\": [1, {\"b\": \"c\"}]}"));
            n = strlen(t);
            for (int k = 0; k < 3; k++) {
                s = s * 1103515245u + 12345u;
                t[(s >> 8) % n] = alpha[(s >> 20) % (sizeof alpha - 1)];
            }
        } else {
            for (size_t k = 0; k < n; k++) {
                s = s * 1103515245u + 12345u;
                t[k] = alpha[(s >> 16) % (sizeof alpha - 1)];
            }
            t[n] = '\0';
        }
        for (int inc = 0; inc < 2; inc++) {
            result_t r;
            run(t, inc, 2, &r);
            if (r.n_calls == 0 && !inc)
                CHECK_MSG(r.n_content == strlen(t) && !memcmp(r.content, t, r.n_content), "'%s'",
                          t);
            for (int c = 0; c < r.n_calls; c++)
                CHECK(strcmp(r.name[c], "f") == 0 || strcmp(r.name[c], "g-2") == 0 ||
                      strcmp(r.name[c], "get_weather") == 0);
        }
    }
}

TEST(prompt_texts)
{
    proto_tool_t tools[2] = {
        {.name = "f", .json = "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"},
        {.name = "g", .json = "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}"}};
    size_t n = 0;
    char *t = proto_tools_system_text(tools, 2, "Be brief.", 9, &n);
    CHECK(t && strlen(t) == n);
    CHECK(strncmp(t, "Be brief.\n\n# Tools\n", 19) == 0);
    CHECK(strstr(t, "<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n"
                    "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}\n</tools>") != NULL);
    CHECK(strstr(t, "<tool_call>\n{\"name\": <function-name>") != NULL);
    proto_free(t);
    t = proto_tools_system_text(tools, 1, "", 0, &n);
    CHECK(strncmp(t, "# Tools\n", 8) == 0);
    proto_free(t);

    proto_msg_tool_call_t calls[2] = {{"c1", "f", "{\"a\": 1}", 8}, {"", "g", "oops", 4}};
    proto_message_t m = {.role = PROTO_ROLE_ASSISTANT,
                         .content = "",
                         .content_len = 0,
                         .tool_calls = calls,
                         .n_tool_calls = 2};
    t = proto_tools_assistant_text(&m, &n);
    CHECK_STR_EQ(t, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>\n"
                    "<tool_call>\n{\"name\":\"g\",\"arguments\":\"oops\"}\n</tool_call>");
    proto_free(t);
    m.content = "Let me check.";
    m.content_len = 13;
    m.n_tool_calls = 1;
    t = proto_tools_assistant_text(&m, &n);
    CHECK_STR_EQ(t, "Let me check.\n<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n"
                    "</tool_call>");
    /* what the assistant text holds parses back as the same call */
    result_t r;
    run(t + 14, 0, 8, &r);
    CHECK(r.n_calls == 1 && !strcmp(r.args[0], "{\"a\":1}"));
    proto_free(t);

    proto_message_t res[2] = {{.role = PROTO_ROLE_TOOL, .content = "18C", .content_len = 3},
                              {.role = PROTO_ROLE_TOOL, .content = "", .content_len = 0}};
    t = proto_tools_results_text(res, 2, &n);
    CHECK_STR_EQ(t, "<tool_response>\n18C\n</tool_response>\n<tool_response>\n\n"
                    "</tool_response>");
    proto_free(t);
}

int main(void)
{
    RUN(auto_calls);
    RUN(malformed_is_content);
    RUN(incremental_reports_as_it_goes);
    RUN(pieces_do_not_matter);
    RUN(random_bytes);
    RUN(prompt_texts);
    return CHECK_DONE();
}
