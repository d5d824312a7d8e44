/* proto/schema.h — JSON Schema -> grammar text (the GBNF-like form of
 * docs/GRAMMAR.md), for `response_format` (OpenAI) and `format` (Ollama).
 *
 * The grammar describes a subset of the instances the schema accepts: every
 * string of the grammar is one JSON value that validates against the schema
 * (docs/GRAMMAR.md "JSON Schema" lists what is exact and where the grammar is
 * narrower than the schema: property order as declared, no undeclared
 * properties, bounded whitespace and number lengths, ...). A keyword that
 * constrains and that the converter cannot honour is refused with a 400
 * naming it and its path, never ignored. Annotations (title, description,
 * examples, default, $schema, $id, $comment, ...) and unknown keywords are
 * ignored, as validators ignore them.
 *
 * Pure functions of proto/ (libc and jansson); the server compiles the text
 * with core_grammar_new like a request's `grammar`.
 */
#ifndef DARKSERVE_PROTO_SCHEMA_H
#define DARKSERVE_PROTO_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "proto/proto.h"

#define PROTO_SCHEMA_MAX_DEPTH 64  /* nesting of schemas inside schemas */
#define PROTO_SCHEMA_MAX_RULES 800 /* rules of the grammar (core allows 1 024) */
#define PROTO_SCHEMA_MAX_REFS 256  /* distinct $ref targets */
#define PROTO_SCHEMA_ANY_DEPTH 6   /* nesting of an unconstrained value ({} or json_object) */
#define PROTO_SCHEMA_INT_DIGITS 15 /* digits of an integer part without a bound */
#define PROTO_SCHEMA_FRAC_DIGITS 6 /* digits after the decimal point */
#define PROTO_SCHEMA_WS_MAX 16     /* spaces or tabs after a newline between tokens */
/* minItems, maxItems (above: 400); maxProperties of a map (above: taken as 1000) */
#define PROTO_SCHEMA_MAX_COUNT 1000

/* Converts schema (borrowed) into grammar text. `path` names the schema in
 * messages ("response_format.json_schema.schema"), `param` is the error's
 * param ("response_format"); both borrowed. On success *out is a new
 * NUL-terminated text of *out_len bytes (<= PROTO_MAX_GRAMMAR_BYTES;
 * proto_free). On failure returns PROTO_EINVAL (err: 400 with a message
 * "<path>: <what>") or PROTO_ENOMEM, and *out is NULL. */
int proto_schema_grammar(json_t *schema, const char *path, const char *param, char **out,
                         size_t *out_len, proto_error_t *err);

/* Grammar text of any JSON object (`{"type": "json_object"}`, Ollama's
 * "json"), values nested at most PROTO_SCHEMA_ANY_DEPTH levels. */
int proto_schema_object_grammar(char **out, size_t *out_len, proto_error_t *err);

/* One function of a tool-call grammar. */
typedef struct proto_schema_fn {
    const char *name;   /* borrowed: [a-zA-Z0-9_-]{1,64} (written as a literal) */
    json_t *parameters; /* borrowed JSON Schema of the arguments; NULL = no
                           parameters, the arguments are "{}" */
    const char *path;   /* borrowed: its place for messages and the error's param
                           ("tools[2].function.parameters") */
} proto_schema_fn_t;

/* Grammar of 1..max_calls tool calls (docs/API.md, "Tool calling"):
 *   root ::= call ( "\n" call ){0,max_calls-1}
 *   call ::= "<tool_call>\n" ( fn_0 | fn_1 | ... ) "\n</tool_call>"
 *   fn_i ::= "{\"name\": \"<name_i>\", \"arguments\": " <parameters_i> "}"
 * Each function's schema is converted against its own root ($ref "#/..."
 * resolves inside its parameters), its rules numbered after the previous
 * function's, so any number of schemas share one grammar. fns[n] borrowed,
 * n >= 1, 1 <= max_calls <= PROTO_MAX_TOOL_CALLS. Errors as
 * proto_schema_grammar, param = the function's path. */
int proto_schema_tools_grammar(const proto_schema_fn_t *fns, size_t n, int max_calls, char **out,
                               size_t *out_len, proto_error_t *err);

#endif
