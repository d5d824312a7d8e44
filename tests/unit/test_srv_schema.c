/* test_srv_schema.c — JSON Schema -> grammar (proto/schema.h) compiled by
 * core's grammar engine: each schema's grammar accepts the instances listed
 * as valid (byte by byte, ending in an accepting state) and refuses the
 * invalid ones (a byte refused, or the text incomplete), and integer and
 * number bounds are exact over a window of values. A test_srv_ binary
 * because it needs both libraries (proto converts, core runs), as the
 * server does; no model.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/grammar.h"
#include "proto/schema.h"
#include "tests/unit/check.h"

static core_grammar_ws_t *gws;

/* proto_schema_grammar of schema text s (JSON; the server hands over the
 * value it parsed from the request), path and param both `path`. */
static int schema_grammar(const char *s, const char *path, char **out, size_t *out_len,
                          proto_error_t *e)
{
    *out = NULL;
    *out_len = 0;
    json_t *schema = json_loads(s, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
    CHECK_MSG(schema != NULL, "the test's schema is not JSON: %s", s);
    if (!schema)
        return -1;
    int rc = proto_schema_grammar(schema, path, path, out, out_len, e);
    json_decref(schema);
    return rc;
}

/* The grammar of schema text s, compiled; NULL (and a printed reason) on failure. */
static core_grammar_t *compile(const char *s)
{
    char *text = NULL;
    size_t len = 0;
    proto_error_t e;
    if (schema_grammar(s, "schema", &text, &len, &e) < 0) {
        printf("  convert %s: %s\n", s, e.message);
        return NULL;
    }
    core_grammar_t *g = NULL;
    core_error_t ce = {0};
    if (core_grammar_new(text, len, NULL, NULL, &g, &ce) < 0) {
        printf("  compile %s: %s\n----\n%s----\n", s, ce.msg, text);
        g = NULL;
    }
    proto_free(text);
    return g;
}

/* 1 when the grammar's language holds exactly the string v. */
static int accepts(const core_grammar_t *g, const char *v)
{
    core_grammar_state_t st;
    core_error_t ce = {0};
    if (core_grammar_state_init(&st, g, &ce) < 0)
        return -1;
    int ok = core_grammar_accept_bytes(&st, gws, v, strlen(v), &ce) == 0 &&
             core_grammar_state_accepting(&st);
    core_grammar_state_clear(&st);
    return ok;
}

typedef struct {
    const char *schema;
    const char *valid[8];
    const char *invalid[8];
} case_t;

static const case_t cases[] = {
    {"{\"type\":\"boolean\"}", {"true", "false"}, {"1", "\"true\"", "tru", "null"}},
    {"{\"type\":\"null\"}", {"null"}, {"nul", "0"}},
    {"{\"type\":\"string\",\"maxLength\":3}",
     {"\"\"", "\"abc\"", "\"\\u00e9\\n\"", "\"\xc3\xa9t\xc3\xa9\""},
     {"\"abcd\"", "abc", "\"a", "\"\\ud800\"", "\"\x01\""}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}",
     {"\"ab\"", "\"\\\"\\\\\""},
     {"\"a\"", "\"abc\""}},
    {"{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1]}]}",
     {"\"red\"", "\"green\"", "1", "null", "{\"a\":[1]}"},
     {"\"blue\"", "2", "{\"a\": [1]}"}},
    {"{\"type\":\"string\",\"enum\":[\"a\",2]}", {"\"a\""}, {"2"}},
    {"{\"const\":\"x\\\"y\"}", {"\"x\\\"y\""}, {"\"xy\""}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
     "\"string\",\"maxLength\":2}},\"required\":[\"a\"],\"additionalProperties\":false}",
     {"{\"a\":1}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\" : -5 ,\n  \"b\" : \"\" }"},
     {"{}", "{\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,}", "{\"a\":1,\"c\":2}",
      "{\"a\":1.5}", "{\"a\":1}  "}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},"
     "\"c\":{\"type\":\"null\"}}}",
     {"{}", "{\"b\":null}", "{\"a\":null,\"c\":null}", "{\"a\":null,\"b\":null,\"c\":null}"},
     {"{,\"b\":null}", "{\"a\":null\"c\":null}", "{\"c\":null,\"a\":null}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"}},"
     "\"required\":[\"b\"]}",
     {"{\"b\":null}", "{\"a\":null,\"b\":null}"},
     {"{}", "{\"a\":null}"}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"maxProperties\":2}",
     {"{}", "{\"x\":1}", "{\"x\":1,\"y\":2}"},
     {"{\"x\":\"s\"}", "{\"x\":1,\"y\":2,\"z\":3}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
     {"[true]", "[true, false ,true]", "[\n  false\n]"},
     {"[]", "[true,true,true,true]", "[1]", "[true,]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\","
     "\"maxLength\":1}],\"items\":false}",
     {"[]", "[1]", "[1,\"a\"]"},
     {"[\"a\"]", "[1,\"a\",2]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"const\":2},\"minItems\":2,"
     "\"maxItems\":3}",
     {"[1,2]", "[1,2,2]"},
     {"[1]", "[1,2,2,2]", "[2,2]"}},
    {"{\"type\":[\"integer\",\"null\"]}", {"5", "null", "-12"}, {"\"5\"", "5.5"}},
    {"{\"anyOf\":[{\"type\":\"boolean\"},{\"type\":\"string\",\"maxLength\":1}]}",
     {"true", "\"a\""},
     {"null"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
     "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"},
     {"{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":2},{\"v\":2}]}"}},
    {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\"},\"next\":{\"$ref\":\"#\"}}}",
     {"{}", "{\"n\":\"a\",\"next\":{\"next\":{}}}"},
     {"{\"next\":1}"}},
    {"{\"type\":\"string\",\"format\":\"date\"}",
     {"\"2024-02-28\"", "\"1999-12-31\"", "\"2023-04-30\""},
     {"\"2024-02-30\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"0999-01-01\"", "\"2023-1-01\""}},
    {"{\"type\":\"string\",\"format\":\"date-time\"}",
     {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T23:59:59.123+05:30\""},
     {"\"2024-01-02T24:00:00Z\"", "\"2024-01-02 03:04:05Z\"", "\"2024-01-02T03:04:05\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}",
     {"\"123e4567-e89b-12d3-a456-426614174000\""},
     {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\""}},
    {"{\"type\":\"string\",\"format\":\"email\"}",
     {"\"a.b@example.com\""},
     {"\"ab.example.com\"", "\"a@b\""}},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}",
     {"\"192.168.0.1\"", "\"255.255.255.0\""},
     {"\"256.1.1.1\"", "\"1.1.1\"", "\"01.1.1.1\""}},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}",
     {"\"AB-123\""},
     {"\"ab-123\"", "\"AB-12\"", "\"AB-1234\""}},
    {"{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}",
     {"\"cat\"", "\"dogs\""},
     {"\"cow\"", "\"cats?\""}},
    {"{\"type\":\"string\",\"pattern\":\"^a\\\"[^x0-9]\\\\.$\"}",
     {"\"a\\\"b.\""},
     {"\"a\\\"x.\"", "\"a\\\"1.\"", "\"a\\\"b,\""}},
    {"{\"type\":\"string\",\"pattern\":\"^[\\\\n\\\"a]+$\"}",
     {"\"a\\n\\\"a\""},
     {"\"\\t\"", "\"\n\""}},
    {"{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":2}",
     {"0", "2", "-1", "1.5", "-0.25", "1.999999"},
     {"2.5", "-2", "-1.75", "2.1", "1e1", "01"}},
    {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
     {"0.5", "0.000001"},
     {"0", "1", "0.0", "1.0", "-0.5"}},
    {"true", {"1", "\"x\"", "[1,{\"a\":null}]", "{}"}, {"", "x"}},
    {"{}", {"1", "{\"k\":[true]}"}, {"{\"k\":}"}},
};

TEST(instances_match_the_schema)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_grammar_t *g = compile(cases[i].schema);
        CHECK_MSG(g != NULL, "case %zu", i);
        if (!g)
            continue;
        for (size_t k = 0; k < 8 && cases[i].valid[k]; k++)
            CHECK_MSG(accepts(g, cases[i].valid[k]) == 1, "case %zu: %s refused", i,
                      cases[i].valid[k]);
        for (size_t k = 0; k < 8 && cases[i].invalid[k]; k++)
            CHECK_MSG(accepts(g, cases[i].invalid[k]) == 0, "case %zu: %s accepted", i,
                      cases[i].invalid[k]);
        core_grammar_free(g);
    }
}

/* Over -1200..1200: the grammar of {integer, bounds} accepts exactly the
 * integers the bounds allow, written without leading zeros or "-0". */
TEST(integer_bounds_are_exact)
{
    static const struct {
        const char *kw;
        long lo, hi; /* the integers allowed, within the window */
    } b[] = {
        {"\"minimum\":0,\"maximum\":100", 0, 100},
        {"\"minimum\":-37,\"maximum\":-5", -37, -5},
        {"\"minimum\":-999,\"maximum\":1000", -999, 1000},
        {"\"minimum\":7", 7, 1200},
        {"\"maximum\":-3", -1200, -3},
        {"\"exclusiveMinimum\":9,\"exclusiveMaximum\":101", 10, 100},
        {"\"minimum\":2.5,\"maximum\":19.99", 3, 19},
        {"\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":5.0001", 0, -1},
        {"\"minimum\":123,\"maximum\":987", 123, 987},
        {"\"minimum\":-1,\"maximum\":0", -1, 0},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        char s[256];
        snprintf(s, sizeof s, "{\"type\":\"integer\",%s}", b[i].kw);
        if (b[i].hi < b[i].lo) { /* no integer: a 400 */
            char *t = NULL;
            size_t n = 0;
            proto_error_t e;
            CHECK(schema_grammar(s, "s", &t, &n, &e) == PROTO_EINVAL);
            CHECK(strstr(e.message, "no integer satisfies the bounds") != NULL);
            continue;
        }
        core_grammar_t *g = compile(s);
        CHECK_MSG(g != NULL, "%s", s);
        if (!g)
            continue;
        int bad = 0;
        for (long v = -1200; v <= 1200 && bad < 3; v++) {
            char num[32];
            snprintf(num, sizeof num, "%ld", v);
            int want = v >= b[i].lo && v <= b[i].hi;
            if (accepts(g, num) != want) {
                bad++;
                CHECK_MSG(0, "%s: %ld %s", s, v, want ? "refused" : "accepted");
            }
        }
        CHECK(!accepts(g, "-0") && !accepts(g, "007"));
        core_grammar_free(g);
    }
}

/* Numbers with one fraction digit over -30.0..30.0: accepted exactly when
 * within the (integer) bounds; x.0 forms are not written (a fraction ends
 * in a non-zero digit), their integer forms are. */
TEST(number_bounds_are_exact_for_integer_bounds)
{
    static const struct {
        const char *kw;
        double lo, hi;
        int lo_x, hi_x;
    } b[] = {
        {"\"minimum\":-12,\"maximum\":7", -12, 7, 0, 0},
        {"\"exclusiveMinimum\":-3,\"maximum\":20", -3, 20, 1, 0},
        {"\"minimum\":0,\"exclusiveMaximum\":10", 0, 10, 0, 1},
        {"\"maximum\":-2", -1e9, -2, 0, 0},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        char s[256];
        snprintf(s, sizeof s, "{\"type\":\"number\",%s}", b[i].kw);
        core_grammar_t *g = compile(s);
        CHECK_MSG(g != NULL, "%s", s);
        if (!g)
            continue;
        int bad = 0;
        for (int t = -300; t <= 300 && bad < 3; t++) {
            double v = t / 10.0;
            char num[32];
            if (t % 10 == 0)
                snprintf(num, sizeof num, "%d", t / 10);
            else
                snprintf(num, sizeof num, "%s%d.%d", t < 0 ? "-" : "", abs(t) / 10, abs(t) % 10);
            int want = (b[i].lo_x ? v > b[i].lo : v >= b[i].lo) &&
                       (b[i].hi_x ? v < b[i].hi : v <= b[i].hi);
            if (accepts(g, num) != want) {
                bad++;
                CHECK_MSG(0, "%s: %s %s", s, num, want ? "refused" : "accepted");
            }
        }
        core_grammar_free(g);
    }
}

/* Schemas whose grammars core must refuse are caught by the converter
 * first, with the schema's path; those only core can judge still fail to
 * compile (never a grammar that runs unconstrained). */
TEST(cycles_are_caught_before_core)
{
    const char *s = "{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
                    "\"$ref\":\"#/$defs/a\"}";
    char *t = NULL;
    size_t n = 0;
    proto_error_t e;
    CHECK(schema_grammar(s, "schema", &t, &n, &e) == PROTO_EINVAL);
    CHECK_MSG(strstr(e.message, "refers back to itself") != NULL, "%s", e.message);
    /* a required property that recurses for ever: core finds no end */
    const char *inf = "{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#\"}},"
                      "\"required\":[\"n\"]}";
    CHECK(schema_grammar(inf, "schema", &t, &n, &e) == 0);
    core_grammar_t *g = NULL;
    core_error_t ce = {0};
    CHECK(core_grammar_new(t, n, NULL, NULL, &g, &ce) < 0 && g == NULL);
    proto_free(t);
}

/* The call grammar of several functions: each one's schema against its own
 * root (the same $ref "#/$defs/p" means two different things), names as
 * constants, 1..max_calls calls joined by "\n". */
TEST(tool_call_grammar)
{
    json_t *a = json_loads("{\"$defs\":{\"p\":{\"type\":\"integer\",\"minimum\":1,"
                           "\"maximum\":3}},\"type\":\"object\",\"properties\":{\"n\":"
                           "{\"$ref\":\"#/$defs/p\"}},\"required\":[\"n\"]}",
                           0, NULL);
    json_t *b = json_loads("{\"$defs\":{\"p\":{\"type\":\"boolean\"}},\"type\":\"object\","
                           "\"properties\":{\"ok\":{\"$ref\":\"#/$defs/p\"}},"
                           "\"required\":[\"ok\"]}",
                           0, NULL);
    CHECK(a && b);
    proto_schema_fn_t fns[3] = {{"num", a, "tools[0].function.parameters"},
                                {"flag-2", b, "tools[1].function.parameters"},
                                {"ping", NULL, "tools[2].function.parameters"}};
    for (int max = 1; max <= 2; max++) {
        char *t = NULL;
        size_t n = 0;
        proto_error_t e;
        CHECK(proto_schema_tools_grammar(fns, 3, max, &t, &n, &e) == 0);
        core_grammar_t *g = NULL;
        core_error_t ce = {0};
        CHECK_MSG(core_grammar_new(t, n, NULL, NULL, &g, &ce) == 0, "%s\n%s", ce.msg, t);
        static const char *const valid[] = {
            "<tool_call>\n{\"name\": \"num\", \"arguments\": {\"n\": 2}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"flag-2\", \"arguments\": {\"ok\": false}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"};
        static const char *const invalid[] = {
            "<tool_call>\n{\"name\": \"num\", \"arguments\": {\"n\": 4}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"num\", \"arguments\": {\"n\": true}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"flag-2\", \"arguments\": {\"ok\": 1}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"pong\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"x\": 1}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"num\", \"arguments\": {\"n\": 2}}",
            "{\"name\": \"num\", \"arguments\": {\"n\": 2}}",
            ""};
        for (size_t i = 0; g && i < 3; i++) {
            CHECK_MSG(accepts(g, valid[i]) == 1, "%s", valid[i]);
            char two[256];
            snprintf(two, sizeof two, "%s\n%s", valid[i], valid[(i + 1) % 3]);
            CHECK_MSG(accepts(g, two) == (max == 2), "max %d: %s", max, two);
        }
        for (size_t i = 0; g && i < sizeof invalid / sizeof invalid[0]; i++)
            CHECK_MSG(accepts(g, invalid[i]) == 0, "%s", invalid[i]);
        core_grammar_free(g);
        proto_free(t);
    }
    /* an unsupported keyword names its function's path */
    json_t *bad = json_loads("{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}", 0, NULL);
    proto_schema_fn_t fb[2] = {{"a", a, "tools[0].function.parameters"},
                               {"b", bad, "tools[1].function.parameters"}};
    char *t = NULL;
    size_t n = 0;
    proto_error_t e;
    CHECK(proto_schema_tools_grammar(fb, 2, 1, &t, &n, &e) == PROTO_EINVAL && t == NULL);
    CHECK_STR_EQ(e.param, "tools[1].function.parameters");
    CHECK_MSG(strstr(e.message, "tools[1].function.parameters.properties.x: 'not'") != NULL, "%s",
              e.message);
    CHECK(proto_schema_tools_grammar(fb, 1, 9, &t, &n, &e) < 0);
    json_decref(a);
    json_decref(b);
    json_decref(bad);
}

int main(void)
{
    gws = core_grammar_ws_new();
    RUN(instances_match_the_schema);
    RUN(integer_bounds_are_exact);
    RUN(number_bounds_are_exact_for_integer_bounds);
    RUN(cycles_are_caught_before_core);
    RUN(tool_call_grammar);
    core_grammar_ws_free(gws);
    return CHECK_DONE();
}
