/* proto/tools.h — tool calling in darkserve's generic format: the prompt
 * text that lists the tools and replays calls and results, and the parser
 * that finds calls in a model's output (docs/API.md, "Tool calling").
 *
 * The format (Hermes/Qwen style, which many small instruct models know):
 *   - the tools: a system text block "# Tools" with one JSON line per
 *     function inside <tools></tools> and the instruction to answer with
 *     <tool_call>{"name": ..., "arguments": {...}}</tool_call>;
 *   - a call, in the history and in the output:
 *     "<tool_call>\n" {"name": "<name>", "arguments": <object>} "\n</tool_call>",
 *     several calls separated by "\n";
 *   - a tool's result: "<tool_response>\n" content "\n</tool_response>",
 *     consecutive results joined by "\n" in one user turn.
 *
 * Pure functions of proto/: no I/O, no globals. Texts returned are new
 * (proto_free) and NULL only when out of memory.
 */
#ifndef DARKSERVE_PROTO_TOOLS_H
#define DARKSERVE_PROTO_TOOLS_H

#include <stddef.h>

#include "proto/proto.h"

#define PROTO_TOOL_CALL_OPEN "<tool_call>"
#define PROTO_TOOL_CALL_CLOSE "</tool_call>"

/* base[0..base_len) (a system prompt, may be empty), "\n\n" when it is not
 * empty, then the tools block listing tools[n] (borrowed). *out_len set. */
char *proto_tools_system_text(const proto_tool_t *tools, size_t n, const char *base,
                              size_t base_len, size_t *out_len);

/* An assistant message's content with its tool_calls written after it
 * ("\n" between): the body of its turn. m borrowed. */
char *proto_tools_assistant_text(const proto_message_t *m, size_t *out_len);

/* The user-turn body of tool results msgs[n] (borrowed, role tool). */
char *proto_tools_results_text(const proto_message_t *msgs, size_t n, size_t *out_len);

/* ---- the output parser ----
 *
 * Fed the generated text piece by piece, it tells content from calls:
 * after optional whitespace, "<tool_call>" opens a call; the JSON object
 * that follows must have "name" (one of the allowed names) and "arguments"
 * (an object, or a string holding one; "parameters" is taken for it too);
 * then whitespace and "</tool_call>" (which may be missing at the very end).
 * Calls may follow each other, whitespace between. Everything else is
 * content: text before the first call, a call that does not parse (its text
 * from "<tool_call>" on, and all that follows), text after max_calls calls.
 * Whitespace around calls is dropped.
 *
 * Two modes:
 *   incremental = 0 (tool_choice "auto"): a call is reported once its object
 *     is complete and valid: CALL then one ARGS with the arguments as compact
 *     JSON. Nothing of a call that turns out malformed was reported.
 *   incremental = 1 (a forced call: the output follows the call grammar):
 *     CALL as soon as the name is complete, then ARGS with each piece of the
 *     arguments' text as it arrives (exactly the model's bytes). A call cut
 *     short (max_tokens) stays as it was reported.
 */
typedef enum proto_tool_ev_kind {
    PROTO_TOOL_EV_CONTENT = 0, /* text is content */
    PROTO_TOOL_EV_CALL = 1,    /* call `index` begins; text is the function name */
    PROTO_TOOL_EV_ARGS = 2     /* text continues call `index`'s arguments */
} proto_tool_ev_kind_t;

typedef struct proto_tool_ev {
    proto_tool_ev_kind_t kind;
    int index;        /* CALL, ARGS: the call's position, from 0 */
    const char *text; /* borrowed for the callback */
    size_t len;
} proto_tool_ev_t;

typedef void (*proto_tool_emit_fn)(void *ud, const proto_tool_ev_t *ev);

typedef struct proto_tool_parser proto_tool_parser_t;

/* names[n_names] are copied. max_calls >= 1. emit/ud borrowed; emit is
 * called from feed and finish only. NULL when out of memory. */
proto_tool_parser_t *proto_tool_parser_new(const char *const *names, size_t n_names,
                                           int incremental, int max_calls, proto_tool_emit_fn emit,
                                           void *ud);
/* Feeds text[0..len). 0, or PROTO_ENOMEM (the parser is then failed: later
 * calls do nothing and return PROTO_ENOMEM). */
int proto_tool_parser_feed(proto_tool_parser_t *p, const char *text, size_t len);
/* The end of the output: whatever is pending is reported. Feed no more. */
int proto_tool_parser_finish(proto_tool_parser_t *p);
/* Calls reported (CALL events) so far. */
int proto_tool_parser_calls(const proto_tool_parser_t *p);
void proto_tool_parser_free(proto_tool_parser_t *p);

#endif
