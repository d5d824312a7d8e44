/* test_proto_schema.c — proto/schema.h refuses what it cannot honour: every
 * constraining keyword it does not implement, malformed schemas, patterns
 * outside the subset and the size bounds give PROTO_EINVAL with a message
 * that names the keyword and its path; annotations are ignored. (The
 * grammars themselves are run by core in test_srv_schema.c.)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/schema.h"
#include "tests/unit/check.h"

/* The converter's answer for schema text s (JSON; the server hands over the
 * value it parsed from the request): 0 and the grammar in *g, or the error
 * in *e. */
static int convert(const char *s, char **g, proto_error_t *e)
{
    size_t n = 0;
    *g = NULL;
    memset(e, 0, sizeof *e);
    json_t *schema = json_loads(s, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
    CHECK_MSG(schema != NULL, "the test's schema is not JSON: %s", s);
    if (!schema)
        return -1;
    int rc = proto_schema_grammar(schema, "S", "param", g, &n, e);
    json_decref(schema);
    return rc;
}

TEST(refusals_name_keyword_and_path)
{
    static const struct {
        const char *schema, *msg;
    } c[] = {
        {"{\"not\":{}}", "S: 'not' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":5}}}",
         "S.properties.age: 'multipleOf' is not supported"},
        {"{\"if\":{},\"then\":{}}", "'if' is not supported"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}",
         "S: 'patternProperties' is not supported"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"uniqueItems\":true}}",
         "S.items: 'uniqueItems': true is not supported"},
        {"{\"type\":\"array\",\"contains\":{\"const\":1}}", "'contains' is not supported"},
        {"{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}",
         "'dependentRequired' is not supported"},
        {"{\"type\":\"object\",\"propertyNames\":{\"maxLength\":3}}",
         "'propertyNames' is not supported"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"not\":{\"const\":3}}]}",
         "S.anyOf[1]: 'not' is not supported"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}",
         "'allOf' of more than one schema is not supported"},
        {"{\"type\":\"string\",\"anyOf\":[{\"maxLength\":1}]}", "'type' beside 'anyOf'"},
        {"{\"$ref\":\"#/$defs/a\",\"maxLength\":2,\"$defs\":{\"a\":{}}}",
         "'maxLength' beside '$ref'"},
        {"{\"$ref\":\"https://example.com/s.json\"}", "only local references"},
        {"{\"$ref\":\"#/definitions/none\"}", "names nothing in the schema"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},"
         "\"$ref\":\"#/$defs/a\"}",
         "refers back to itself"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "'format' 'uri' is not supported"},
        {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":5}",
         "together with 'format' is not supported"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "a lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\bc\"}", "the escape '\\b'"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "the escape '\\1'"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "an anchor inside the pattern"},
        {"{\"type\":\"string\",\"pattern\":\"a{2000}\"}", "a repetition count over 1000"},
        {"{\"type\":\"string\",\"pattern\":\"[^\\\\d]\"}", "a shorthand class inside a negated"},
        {"{\"type\":\"string\",\"pattern\":\"a++\"}", "a possessive or repeated quantifier"},
        {"{\"type\":\"string\",\"pattern\":\"(ab\"}", "an unclosed group"},
        {"{\"type\":\"string\",\"pattern\":\"ab)\"}", "an unbalanced ')'"},
        {"{\"type\":\"string\",\"pattern\":\"[z-a]\"}", "a reversed range"},
        {"{\"type\":\"string\",\"pattern\":\"*a\"}", "nothing to repeat"},
        {"{\"type\":\"string\",\"minLength\":5000}", "'minLength' is 5000; above 1000"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "less than 'minLength'"},
        {"{\"type\":\"string\",\"maxLength\":-1}", "'maxLength' must be a non-negative integer"},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", "no integer satisfies the bounds"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":1}",
         "no number satisfies the bounds"},
        {"{\"type\":\"number\",\"minimum\":\"3\"}", "'minimum' must be a number"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", "less than 'minItems'"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
         "'minItems' needs more items than the tuple allows"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}",
         "S.properties.a: the property is required but its schema is false"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":1}",
         "'minProperties' above the number of required"},
        {"{\"type\":\"object\",\"additionalProperties\":{},\"minProperties\":2}",
         "'minProperties' above 1 without declared properties"},
        {"{\"type\":\"strnig\"}", "'type' 'strnig' is not a JSON Schema type"},
        {"{\"type\":[\"string\",\"string\"]}", "'type' lists 'string' twice"},
        {"{\"type\":[]}", "'type' must be a type name"},
        {"{\"enum\":[1,2],\"type\":\"string\"}", "no value of 'enum' satisfies the schema"},
        {"{\"enum\":\"a\"}", "'enum' must be an array"},
        {"{\"anyOf\":[]}", "'anyOf' must be a non-empty array"},
        {"false", "S: the schema is false"},
        {"5", "a schema must be an object or a boolean"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":[5]}}}",
         "S.properties.a.items[0]: a schema must be an object or a boolean"},
        {"{\"type\":\"object\",\"required\":\"a\"}", "'required' must be an array of strings"},
        {"{\"type\":\"object\",\"additionalProperties\":3}", "'additionalProperties' must be"},
        {"{\"$defs\":{\"a\":{\"type\":\"string\",\"format\":\"hostname\"}},\"type\":\"array\","
         "\"items\":{\"$ref\":\"#/$defs/a\"}}",
         "S.items(#/$defs/a): 'format' 'hostname' is not supported"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char *g;
        proto_error_t e;
        int rc = convert(c[i].schema, &g, &e);
        CHECK_MSG(rc == PROTO_EINVAL && g == NULL, "%s: rc %d", c[i].schema, rc);
        CHECK_INT_EQ(e.status, 400);
        CHECK_STR_EQ(e.param, "param");
        CHECK_MSG(strstr(e.message, c[i].msg) != NULL, "%s: message '%s', expected '%s'",
                  c[i].schema, e.message, c[i].msg);
        proto_free(g);
    }
}

TEST(annotations_and_unknown_keywords_are_ignored)
{
    char *a, *b;
    proto_error_t e;
    CHECK(convert("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
                  "\"required\":[\"x\"]}",
                  &a, &e) == 0);
    CHECK(convert("{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"u\","
                  "\"title\":\"T\",\"description\":\"D\",\"$comment\":\"c\",\"x-vendor\":1,"
                  "\"type\":\"object\",\"examples\":[{}],\"default\":{},\"properties\":{\"x\":"
                  "{\"type\":\"integer\",\"title\":\"X\",\"default\":3,\"deprecated\":true}},"
                  "\"required\":[\"x\"]}",
                  &b, &e) == 0);
    CHECK(a && b && !strcmp(a, b));
    proto_free(a);
    proto_free(b);
}

TEST(bounds)
{
    char *g;
    proto_error_t e;
    /* schemas nested past PROTO_SCHEMA_MAX_DEPTH */
    char deep[4096] = "";
    for (int i = 0; i < PROTO_SCHEMA_MAX_DEPTH + 2; i++)
        strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < PROTO_SCHEMA_MAX_DEPTH + 2; i++)
        strcat(deep, "}");
    CHECK(convert(deep, &g, &e) == PROTO_EINVAL);
    CHECK_MSG(strstr(e.message, "nested more than 64 levels") != NULL, "%s", e.message);
    /* more rules than PROTO_SCHEMA_MAX_RULES: 250 properties, each an object */
    json_t *props = json_object();
    for (int i = 0; i < 250; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        json_object_set_new(props, k,
                            json_pack("{s:{s:{s:s}}}", "properties", "v", "type", "null"));
    }
    json_t *s = json_pack("{s:s,s:o}", "type", "object", "properties", props);
    size_t n;
    CHECK(proto_schema_grammar(s, "S", "param", &g, &n, &e) == PROTO_EINVAL);
    CHECK_MSG(strstr(e.message, "more than 800 grammar rules") != NULL, "%s", e.message);
    json_decref(s);
    /* grammar text past PROTO_MAX_GRAMMAR_BYTES: long enum strings */
    json_t *en = json_array();
    for (int i = 0; i < 300; i++) {
        char v[1100];
        memset(v, 'a' + i % 26, sizeof v - 1);
        v[sizeof v - 1] = '\0';
        char head[16];
        snprintf(head, sizeof head, "%06d", i);
        memcpy(v, head, 6); /* six digits, then the run of letters: all distinct */
        json_array_append_new(en, json_string(v));
    }
    s = json_pack("{s:o}", "enum", en);
    CHECK(proto_schema_grammar(s, "S", "param", &g, &n, &e) == PROTO_EINVAL);
    CHECK_MSG(strstr(e.message, "grammar is over") != NULL, "%s", e.message);
    json_decref(s);
}

TEST(grammar_shapes)
{
    char *g;
    proto_error_t e;
    /* the declared order of properties is kept, required first member */
    CHECK(convert("{\"type\":\"object\",\"properties\":{\"zeta\":{\"type\":\"null\"},\"alpha\":"
                  "{\"type\":\"null\"}},\"required\":[\"zeta\",\"alpha\"]}",
                  &g, &e) == 0);
    CHECK(g && strstr(g, "\"\\\"zeta\\\"\"") && strstr(g, "\"\\\"alpha\\\"\""));
    CHECK(g && strstr(g, "root ::= ") && strstr(g, "ws ::= "));
    proto_free(g);
    /* a required name that is not declared is written once however often it
     * is listed, also beside a property whose schema is false */
    CHECK(convert("{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"z\",\"z\"]}",
                  &g, &e) == 0);
    const char *z = g ? strstr(g, "\"\\\"z\\\"\"") : NULL;
    CHECK(z && !strstr(z + 1, "\"\\\"z\\\"\""));
    proto_free(g);
    /* whitespace is bounded: a newline and at most PROTO_SCHEMA_WS_MAX blanks */
    CHECK(convert("{\"type\":\"array\"}", &g, &e) == 0);
    CHECK(g && strstr(g, "ws ::= ( \" \" | \"\\n\" [ \\t]{0,16} )?\n"));
    CHECK(g && strstr(g, "any6 ::= ") && !strstr(g, "any7"));
    proto_free(g);
    size_t n;
    CHECK(proto_schema_object_grammar(&g, &n, &e) == 0 && g && strlen(g) == n);
    CHECK(g && strstr(g, "\"{\" ws ( string ws \":\" ws any6"));
    proto_free(g);
}

/* Counts of items are written as grammar repetitions (at most 1000): a
 * count above is refused with the keyword and the value given, 1000 itself
 * is written. maxProperties of a map above 1000 writes at most 1000. */
TEST(item_counts_are_bounded_exactly)
{
    char *g;
    proto_error_t e;
    static const struct {
        const char *schema, *msg;
    } c[] = {
        {"{\"type\":\"array\",\"maxItems\":1001}", "S: 'maxItems' is 1001; above 1000"},
        {"{\"type\":\"array\",\"minItems\":1001}", "S: 'minItems' is 1001; above 1000"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"maxItems\":1001}", "'maxItems' is 1001"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"minItems\":5000}}",
         "S.items: 'minItems' is 5000"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK_MSG(convert(c[i].schema, &g, &e) == PROTO_EINVAL, "%s", c[i].schema);
        CHECK_MSG(strstr(e.message, c[i].msg) != NULL, "%s: %s", c[i].schema, e.message);
        CHECK_INT_EQ(e.status, 400);
        CHECK_STR_EQ(e.param, "param");
    }
    CHECK(convert("{\"type\":\"array\",\"minItems\":1000,\"maxItems\":1000}", &g, &e) == 0);
    CHECK(g && strstr(g, "{999,999}"));
    proto_free(g);
    CHECK(convert("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"null\"},"
                  "\"maxProperties\":5000}",
                  &g, &e) == 0);
    CHECK(g && strstr(g, "{0,999}"));
    proto_free(g);
}

/* Every text the converter formats grows with its input: a tool grammar's
 * list of alternatives (once cut at 256 bytes, so 37 tools made a broken
 * line), a long property name in a message's path, a $ref to a long name. */
TEST(formatting_never_cuts)
{
    enum { N = 128 }; /* PROTO_MAX_TOOLS */
    proto_schema_fn_t fns[N];
    char names[N][16];
    json_t *params = json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties", "a", "type",
                               "string");
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "fn_%d", i);
        fns[i] = (proto_schema_fn_t){names[i], params, "tools"};
    }
    char *g = NULL;
    size_t n = 0;
    proto_error_t e;
    CHECK(proto_schema_tools_grammar(fns, N, 1, &g, &n, &e) == 0);
    /* each line is one rule: a name, " ::= ", its body */
    int lines = 0, ok = 1;
    for (const char *l = g; l && *l; lines++) {
        const char *nl = strchr(l, '\n');
        const char *def = strstr(l, " ::= ");
        ok &= nl && def && def < nl;
        l = nl ? nl + 1 : l + strlen(l);
    }
    CHECK_MSG(ok && lines > N, "%d lines", lines);
    /* the call rule names every function's rule */
    const char *call = g ? strstr(g, "call ::= ") : NULL;
    const char *end = call ? strchr(call, '\n') : NULL;
    int alts = 0;
    for (const char *p = call; p && p < end; p++)
        alts += *p == '|';
    CHECK_INT_EQ(alts, N - 1);
    proto_free(g);
    json_decref(params);

    /* a path of a long property name: its end is shown, marked as cut */
    char name[1200];
    memset(name, 'k', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    json_t *s = json_pack("{s:s,s:{s:{s:i}}}", "type", "object", "properties", name,
                          "multipleOf", 2);
    CHECK(proto_schema_grammar(s, "S", "param", &g, &n, &e) == PROTO_EINVAL);
    CHECK_MSG(strncmp(e.message, "...", 3) == 0 && strstr(e.message, "kkk: 'multipleOf'"),
              "%s", e.message);
    json_decref(s);
    /* a $ref to a name longer than any fixed buffer resolves */
    s = json_pack("{s:{s:{s:s}}}", "$defs", name, "type", "null");
    char ref[1300];
    snprintf(ref, sizeof ref, "#/$defs/%s", name);
    json_object_set_new(s, "$ref", json_string(ref));
    CHECK_MSG(proto_schema_grammar(s, "S", "param", &g, &n, &e) == 0, "%s", e.message);
    CHECK(g && strstr(g, "\"null\""));
    proto_free(g);
    json_decref(s);
}

int main(void)
{
    RUN(refusals_name_keyword_and_path);
    RUN(annotations_and_unknown_keywords_are_ignored);
    RUN(bounds);
    RUN(grammar_shapes);
    RUN(item_counts_are_bounded_exactly);
    RUN(formatting_never_cuts);
    return CHECK_DONE();
}
