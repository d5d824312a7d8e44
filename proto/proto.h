/* proto/proto.h — darkserve's request/response layer: JSON <-> plain C structs.
 *
 * Pure functions: no I/O, no globals, no logging, no core/ or server/ headers.
 * Depends on libc and jansson only. docs/API.md is the reference for every
 * request and response shape produced or accepted here.
 *
 * Requests: each proto_*_parse() takes the raw body (body, len), validates it
 * and fills a caller-provided struct. On success it returns 0 and the struct
 * owns heap copies of every string/array (free with the matching
 * proto_*_free()). On failure it returns a negative PROTO_E* code, fills the
 * caller's proto_error_t (HTTP status, OpenAI type/code, the offending field in
 * `param`, a message naming the field) and leaves *out zeroed, so calling
 * proto_*_free() on it is harmless either way. Every *_free(NULL) is a no-op.
 *
 * Conventions of the parsers (documented in docs/API.md):
 *   - the body must be one JSON object, nested at most PROTO_MAX_JSON_DEPTH
 *     levels, UTF-8, without duplicate keys and without "\u0000" in strings;
 *   - unknown fields are ignored (OpenAI clients send extra ones);
 *   - a field whose value is null is treated as absent;
 *   - integer fields must be JSON integers (16.0 is rejected);
 *   - fields whose meaning darkserve cannot honour (echo: true, tools, a
 *     JSON Schema keyword the converter does not implement, ...) are
 *     rejected with 400 rather than silently ignored.
 *
 * Responses: each proto_*_json() builder returns a new NUL-terminated compact
 * JSON text (no newline inside) or NULL when out of memory. Release it with
 * proto_free(). Every string that goes into JSON is passed as (pointer, length)
 * where it may come from the model, and is made valid UTF-8 first: each
 * ill-formed sequence (a token piece holding half of a multibyte character,
 * overlongs, surrogates, stray continuation bytes) becomes U+FFFD following
 * Unicode's "maximal subpart" rule; an embedded NUL byte is kept and written
 * as \u0000. Non-finite numbers are written as -9999 (logprobs of impossible
 * tokens, as OpenAI does) or 0 (timings).
 *
 * Streams: proto_frame() wraps one JSON text as an SSE event or an NDJSON line.
 *
 * Memory: every allocation goes through jansson's allocator (json_get_alloc_funcs),
 * so tests can inject failures with json_set_alloc_funcs(); with jansson's
 * default allocator proto_free() is free().
 */
#ifndef DARKSERVE_PROTO_PROTO_H
#define DARKSERVE_PROTO_PROTO_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- limits */

#define PROTO_MAX_JSON_DEPTH 32      /* nesting of [ and { in a request body */
#define PROTO_MAX_MESSAGES 1024      /* chat/session messages per request */
#define PROTO_MAX_CONTENT_PARTS 256  /* parts in one message's content array */
#define PROTO_MAX_STOP 16            /* stop strings */
#define PROTO_MAX_STOP_BYTES 256     /* bytes in one stop string */
#define PROTO_MAX_PROMPTS 16         /* prompts in one completions request */
#define PROTO_MAX_N 16               /* choices per prompt */
#define PROTO_MAX_LOGPROBS 20        /* top alternatives per token */
#define PROTO_MAX_NAME_BYTES 256     /* model, user */
#define PROTO_SESSION_ID_LEN 32      /* lowercase hex characters, 128 bits */
#define PROTO_PREFIX_ID_LEN 28       /* "pfx_" + 24 lowercase hex characters */
#define PROTO_MAX_LIST_LIMIT 1000    /* GET /v1/sessions?limit= */
#define PROTO_MAX_GRAMMAR_BYTES (256 << 10) /* "grammar" (core's CORE_GRAMMAR_MAX_TEXT) */
#define PROTO_MAX_LOGIT_BIAS 1024    /* "logit_bias" entries (core's CORE_SAMPLE_MAX_BIAS) */
#define PROTO_DEFAULT_LIST_LIMIT 20
#define PROTO_MAX_TOOLS 128          /* "tools" entries */
#define PROTO_MAX_TOOL_NAME 64       /* bytes of a function name, [a-zA-Z0-9_-] */
#define PROTO_MAX_TOOLS_BYTES (256 << 10) /* the "tools" array as compact JSON */
#define PROTO_MAX_TOOL_CALLS 8       /* calls of one forced answer (parallel_tool_calls) */
#define PROTO_MAX_MSG_TOOL_CALLS 64  /* "tool_calls" of one assistant message */
#define PROTO_MAX_TOOL_CALL_ID 256   /* bytes of a "tool_call_id" / tool_calls[].id */

/* Defaults used when a proto_limits_t field is 0 (or the pointer is NULL). */
#define PROTO_DEFAULT_MAX_TOKENS_LIMIT 32768
#define PROTO_DEFAULT_MAX_TOKENS 256
#define PROTO_DEFAULT_MAX_PROMPT_TOKENS (1 << 20)
#define PROTO_DEFAULT_MAX_TEXT_BYTES (8 << 20)

/* Per-server limits the parsers enforce. Zero-initialize and set what you
 * need: a 0 field takes the default above. */
typedef struct proto_limits {
    int64_t max_tokens_limit;   /* max_tokens above this -> 400 'max_tokens' */
    int64_t default_max_tokens; /* max_tokens when absent (clamped to the limit) */
    int64_t n_vocab;            /* token ids must be < n_vocab; 0 = < INT32_MAX */
    int64_t max_prompt_tokens;  /* token ids in one prompt / detokenize request */
    int64_t max_text_bytes;     /* bytes of one text field and of all message contents */
} proto_limits_t;

/* ---------------------------------------------------------------- errors */

/* Return codes of proto functions. */
#define PROTO_EINVAL (-101) /* the request is invalid; err has a 4xx status */
#define PROTO_ENOMEM (-102) /* out of memory; err has status 500 */

/* X(kind, HTTP status, OpenAI "type", default "code") */
#define PROTO_ERRKIND_MAP(X)                                                        \
    X(PROTO_ERR_INVALID_JSON, 400, "invalid_request_error", "invalid_json")         \
    X(PROTO_ERR_INVALID_VALUE, 400, "invalid_request_error", "invalid_value")       \
    X(PROTO_ERR_MISSING, 400, "invalid_request_error", "missing_required_parameter") \
    X(PROTO_ERR_UNSUPPORTED, 400, "invalid_request_error", "unsupported_parameter") \
    X(PROTO_ERR_CONTEXT_LENGTH, 400, "invalid_request_error", "context_length_exceeded") \
    X(PROTO_ERR_AUTH, 401, "authentication_error", "invalid_api_key")               \
    X(PROTO_ERR_NOT_FOUND, 404, "not_found_error", "not_found")                     \
    X(PROTO_ERR_SESSION_NOT_FOUND, 404, "not_found_error", "session_not_found")     \
    X(PROTO_ERR_MODEL_NOT_FOUND, 404, "not_found_error", "model_not_found")         \
    X(PROTO_ERR_METHOD, 405, "invalid_request_error", "method_not_allowed")         \
    X(PROTO_ERR_CONFLICT, 409, "conflict_error", "session_busy")                    \
    X(PROTO_ERR_TOO_LARGE, 413, "invalid_request_error", "request_too_large")       \
    X(PROTO_ERR_MEDIA_TYPE, 415, "invalid_request_error", "unsupported_media_type") \
    X(PROTO_ERR_RATE_LIMIT, 429, "rate_limit_error", "rate_limit_exceeded")         \
    X(PROTO_ERR_INTERNAL, 500, "server_error", "internal_error")                    \
    X(PROTO_ERR_UNAVAILABLE, 503, "server_error", "service_unavailable")            \
    X(PROTO_ERR_STORAGE, 507, "server_error", "insufficient_storage")

typedef enum proto_errkind {
#define PROTO_ERRKIND_ENUM_(kind, status, type, code) kind,
    PROTO_ERRKIND_MAP(PROTO_ERRKIND_ENUM_)
#undef PROTO_ERRKIND_ENUM_
    PROTO_ERR_KIND_COUNT_
} proto_errkind_t;

#define PROTO_ERROR_PARAM_MAX 64
#define PROTO_ERROR_MSG_MAX 512

typedef struct proto_error {
    int status;                        /* HTTP status */
    const char *type;                  /* static string ("invalid_request_error") */
    const char *code;                  /* static string or NULL (JSON null) */
    char param[PROTO_ERROR_PARAM_MAX]; /* offending field ("messages[2].role"); "" = null */
    char message[PROTO_ERROR_MSG_MAX]; /* human-readable, names the field */
} proto_error_t;

/* Fills err (may be NULL) from the kind's table row, param (NULL or "" = none;
 * copied, truncated to fit) and a printf-style message. Returns PROTO_ENOMEM for
 * PROTO_ERR_INTERNAL and PROTO_EINVAL for every other kind, so parsers can
 * write `return proto_error_set(...)`. The server may overwrite err->code with
 * another static string afterwards (e.g. "draining"). */
int proto_error_set(proto_error_t *err, proto_errkind_t kind, const char *param,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}.
 * err is borrowed. Returns new text (proto_free) or NULL (out of memory). */
char *proto_error_json(const proto_error_t *err);

/* Releases any text or buffer returned by a proto builder. NULL is a no-op. */
void proto_free(void *p);

/* -------------------------------------------------------- shared request parts */

typedef enum proto_role {
    PROTO_ROLE_SYSTEM = 0, /* "system" and "developer" */
    PROTO_ROLE_USER = 1,
    PROTO_ROLE_TOOL = 2,     /* a tool's result ("tool"), answering an assistant's tool call */
    PROTO_ROLE_ASSISTANT = 3 /* the last value: role <= PROTO_ROLE_ASSISTANT is a valid role
                                (tests/fuzz/fuzz_proto.c checks that) */
} proto_role_t;

/* One call of an assistant message's "tool_calls" in the history:
 * {"id", "type": "function", "function": {"name", "arguments"}}. */
typedef struct proto_msg_tool_call {
    char *id;          /* owned, "" when absent */
    char *name;        /* owned, 1..PROTO_MAX_TOOL_NAME bytes */
    char *arguments;   /* owned text: the JSON string's value as given, or an object
                          given directly, dumped compact; "{}" when absent */
    size_t arguments_len;
} proto_msg_tool_call_t;

/* One chat message; content is the concatenation of its text parts joined by
 * "\n" when given as an array. An assistant message with "tool_calls" may
 * have "content": null (content is then ""). */
typedef struct proto_message {
    proto_role_t role;
    char *content;      /* owned, NUL-terminated UTF-8 (never contains NUL) */
    size_t content_len; /* bytes, without the terminator */
    char *tool_call_id; /* owned or NULL: role tool's "tool_call_id" */
    proto_msg_tool_call_t *tool_calls; /* owned [n_tool_calls] (assistant), NULL when none */
    size_t n_tool_calls;               /* <= PROTO_MAX_MSG_TOOL_CALLS */
} proto_message_t;

/* Sampling parameters with their defaults already applied. */
typedef struct proto_sampling {
    double temperature;       /* [0, 2], default 1 (0 = greedy) */
    double top_p;             /* (0, 1], default 1 */
    int32_t top_k;            /* >= 0, default 0 = disabled */
    double min_p;             /* [0, 1], default 0 = disabled */
    double repeat_penalty;    /* > 0, default 1 = disabled */
    double presence_penalty;  /* [-2, 2], default 0 */
    double frequency_penalty; /* [-2, 2], default 0 */
    int has_seed;             /* 1 when "seed" was given */
    int64_t seed;
} proto_sampling_t;

typedef enum proto_stream_format {
    PROTO_STREAM_SSE = 0,   /* text/event-stream: "data: <json>\n\n" */
    PROTO_STREAM_NDJSON = 1 /* application/x-ndjson: "<json>\n" */
} proto_stream_format_t;

/* One "logit_bias" entry: the key (a token id, < n_vocab) and its bias. */
typedef struct proto_logit_bias {
    int32_t id;
    float bias; /* [-100, 100] */
} proto_logit_bias_t;

/* Generation options shared by completions, chat and session generate. */
typedef struct proto_gen_params {
    char *model;           /* owned or NULL when absent */
    int64_t max_tokens;    /* 1..limit; default from proto_limits_t */
    int n;                 /* 1..PROTO_MAX_N, default 1 (always 1 for generate) */
    proto_sampling_t sampling;
    char *stop[PROTO_MAX_STOP]; /* owned, each 1..PROTO_MAX_STOP_BYTES bytes */
    size_t n_stop;
    int logprobs;          /* -1 = none; else top alternatives wanted, 0..20 */
    int stream;            /* 0/1 */
    int include_usage;     /* stream_options.include_usage */
    char session[PROTO_SESSION_ID_LEN + 1]; /* "" when absent */
    char prefix[PROTO_PREFIX_ID_LEN + 1];   /* "prefix": a cached prefix's id; "" when
                                               absent (completions and chat only) */
    char *grammar;         /* owned, or NULL when absent or "": grammar text (docs/GRAMMAR.md),
                              at most PROTO_MAX_GRAMMAR_BYTES; the server compiles it */
    size_t grammar_len;
    const char *grammar_param; /* static: the field the grammar came from, for errors:
                                  "grammar", "response_format" (its JSON Schema or
                                  json_object, converted by proto/schema.h) or "format"
                                  (Ollama); NULL when there is no grammar */
    proto_logit_bias_t *logit_bias; /* owned [n_logit_bias], NULL when absent or {} */
    size_t n_logit_bias;            /* <= PROTO_MAX_LOGIT_BIAS */
} proto_gen_params_t;

/* ------------------------------------------------- POST /v1/completions */

/* One prompt: exactly one of text / tokens is set. */
typedef struct proto_prompt {
    char *text;       /* owned NUL-terminated UTF-8, or NULL */
    size_t text_len;
    int32_t *tokens;  /* owned [n_tokens] ids, or NULL */
    size_t n_tokens;
} proto_prompt_t;

typedef struct proto_completion_req {
    proto_gen_params_t p;
    proto_prompt_t *prompts; /* owned [n_prompts], 1..PROTO_MAX_PROMPTS */
    size_t n_prompts;
} proto_completion_req_t;

/* body/lim/err are borrowed (lim may be NULL = defaults); *out is filled and
 * owned by the caller (proto_completion_free). */
int proto_completion_parse(const char *body, size_t len, const proto_limits_t *lim,
                           proto_completion_req_t *out, proto_error_t *err);
void proto_completion_free(proto_completion_req_t *r);

/* ------------------------------------------- POST /v1/chat/completions */

/* "parse_special" (requests with messages; default false): whether
 * special-token texts inside message contents ("<|im_start|>") become
 * special tokens. By default contents are plain text, so a user cannot
 * forge the template's turn markers; only the template's own markers are
 * special. */
/* One function of "tools": {"type": "function", "function": {"name",
 * "description", "parameters", "strict"}}. */
typedef struct proto_tool {
    char *name;        /* owned, [a-zA-Z0-9_-]{1,64}, unique in the request */
    char *description; /* owned or NULL */
    char *parameters;  /* owned compact JSON text of the parameters schema, or NULL */
    char *json;        /* owned: {"type":"function","function":{...}} compact, the line the
                          generic format lists (proto/tools.h) */
} proto_tool_t;

/* "tool_choice". Default: AUTO with tools, NONE without. */
typedef enum proto_tool_choice {
    PROTO_TOOL_CHOICE_NONE = 0,     /* "none": tools not rendered, output is content */
    PROTO_TOOL_CHOICE_AUTO = 1,     /* "auto": free text, parsed for calls afterwards */
    PROTO_TOOL_CHOICE_REQUIRED = 2, /* "required": constrained to calls of any tool */
    PROTO_TOOL_CHOICE_NAMED = 3     /* {"type":"function","function":{"name"}}: that one */
} proto_tool_choice_t;

/* With tools and a forced choice (REQUIRED, NAMED) the parser also writes the
 * call grammar (proto_schema_tools_grammar) into p.grammar, grammar_param
 * "tools"; such a choice cannot come with "grammar" or a JSON
 * response_format. Every tool's parameters go through the JSON Schema
 * converter whatever the choice: an unsupported keyword is a 400 naming
 * tools[i].function.parameters. */
typedef struct proto_chat_req {
    proto_gen_params_t p;       /* logprobs: -1 unless "logprobs": true, then top_logprobs */
    proto_message_t *messages;  /* owned [n_messages], 1..PROTO_MAX_MESSAGES */
    size_t n_messages;
    int parse_special;          /* see above */
    proto_tool_t *tools;        /* owned [n_tools], NULL when absent or [] */
    size_t n_tools;             /* <= PROTO_MAX_TOOLS */
    proto_tool_choice_t tool_choice;
    size_t tool_named;          /* NAMED: index into tools */
    int parallel_tool_calls;    /* default 1 */
} proto_chat_req_t;

int proto_chat_parse(const char *body, size_t len, const proto_limits_t *lim,
                     proto_chat_req_t *out, proto_error_t *err);
void proto_chat_free(proto_chat_req_t *r);

/* ------------------------------------------------------------- sessions */

/* 1 when s[0..len) is exactly PROTO_SESSION_ID_LEN lowercase hex digits. */
int proto_session_id_valid(const char *s, size_t len);

/* Writes the 32-hex-digit id of 16 random bytes (caller supplies them) and a
 * NUL into out[33]. */
void proto_session_id_format(const uint8_t bytes[16], char out[PROTO_SESSION_ID_LEN + 1]);

/* Writes bytes[0..n) as 2n lowercase hex digits and a NUL into out[2n + 1]. */
void proto_hex_format(const uint8_t *bytes, size_t n, char *out);

/* POST /v1/sessions: {"system"?: string, "messages"?: [...]} — not both; an
 * empty body ({} or len 0) creates an empty session. */
typedef struct proto_session_create_req {
    char *system;               /* owned or NULL */
    size_t system_len;
    proto_message_t *messages;  /* owned or NULL */
    size_t n_messages;
    int parse_special;          /* for system / messages, as for chat */
    char prefix[PROTO_PREFIX_ID_LEN + 1]; /* "prefix": a cached prefix's id, or "" */
} proto_session_create_req_t;

int proto_session_create_parse(const char *body, size_t len, const proto_limits_t *lim,
                               proto_session_create_req_t *out, proto_error_t *err);
void proto_session_create_free(proto_session_create_req_t *r);

/* 1 when s[0..len) is "pfx_" and 24 lowercase hex digits. */
int proto_prefix_id_valid(const char *s, size_t len);

/* POST /v1/sessions/{id}/append: {"text": string} xor {"messages": [...]}. */
typedef struct proto_session_append_req {
    char *text;                 /* owned or NULL */
    size_t text_len;
    proto_message_t *messages;  /* owned or NULL */
    size_t n_messages;
    int parse_special;          /* for messages, as for chat ("text" is always raw) */
} proto_session_append_req_t;

int proto_session_append_parse(const char *body, size_t len, const proto_limits_t *lim,
                               proto_session_append_req_t *out, proto_error_t *err);

/* POST /v1/prefixes: {"text": string} xor {"messages": [...]}, and
 * "parse_special" — the body of an append. */
typedef proto_session_append_req_t proto_prefix_create_req_t;
int proto_prefix_create_parse(const char *body, size_t len, const proto_limits_t *lim,
                              proto_prefix_create_req_t *out, proto_error_t *err);
void proto_session_append_free(proto_session_append_req_t *r);

/* POST /v1/sessions/{id}/generate: optional "text" xor "messages" to ingest
 * first, then generation options; "stream" defaults to true and
 * "stream_format" to "ndjson". An empty body is allowed. p.n is always 1. */
typedef struct proto_generate_req {
    proto_gen_params_t p;
    char *text;                 /* owned or NULL */
    size_t text_len;
    proto_message_t *messages;  /* owned or NULL */
    size_t n_messages;
    proto_stream_format_t format;
    int parse_special;          /* for messages, as for chat ("text" is always raw) */
    int continue_grammar;       /* "continue_grammar": finish the session's pending grammar
                                   (never with text, messages, grammar or a JSON
                                   response_format: 400 naming the field) */
} proto_generate_req_t;

int proto_generate_parse(const char *body, size_t len, const proto_limits_t *lim,
                         proto_generate_req_t *out, proto_error_t *err);
void proto_generate_free(proto_generate_req_t *r);

/* POST /v1/sessions/{id}/regenerate: the generation options of generate
 * (same defaults); "text", "messages" and "continue_grammar" are refused
 * (400 naming the field): a regenerate runs the last turn's input again. text/messages of
 * *out stay NULL; free with proto_generate_free. */
int proto_regenerate_parse(const char *body, size_t len, const proto_limits_t *lim,
                           proto_generate_req_t *out, proto_error_t *err);

#define PROTO_MAX_ROLLBACK_TURNS 1000000000 /* "turns" of a rollback at most */

/* POST /v1/sessions/{id}/rollback: {"turns": n}, an integer 1..
 * PROTO_MAX_ROLLBACK_TURNS, default 1 (an empty body or {} goes back one
 * turn). */
typedef struct proto_rollback_req {
    int64_t turns;
} proto_rollback_req_t;

int proto_rollback_parse(const char *body, size_t len, proto_rollback_req_t *out,
                         proto_error_t *err);

/* GET /v1/sessions?limit=&after= : the server passes the decoded query pairs. */
typedef struct proto_kv {
    const char *key;   /* borrowed, NUL-terminated */
    const char *value; /* borrowed, NUL-terminated, or NULL for "?key" */
} proto_kv_t;

typedef struct proto_session_list_req {
    int limit;                            /* 1..PROTO_MAX_LIST_LIMIT, default 20 */
    char after[PROTO_SESSION_ID_LEN + 1]; /* "" = from the start */
} proto_session_list_req_t;

/* kv is borrowed [n]; unknown keys are ignored, a repeated known key is 400. */
int proto_session_list_parse(const proto_kv_t *kv, size_t n, proto_session_list_req_t *out,
                             proto_error_t *err);

/* ----------------------------------------------- POST /tokenize, /detokenize */

typedef struct proto_tokenize_req {
    char *text;       /* owned ("text", or its alias "content") */
    size_t text_len;
    int add_special;  /* default 0 */
    int with_pieces;  /* default 0 */
} proto_tokenize_req_t;

int proto_tokenize_parse(const char *body, size_t len, const proto_limits_t *lim,
                         proto_tokenize_req_t *out, proto_error_t *err);
void proto_tokenize_free(proto_tokenize_req_t *r);

typedef struct proto_detokenize_req {
    int32_t *tokens;  /* owned [n_tokens] or NULL when empty */
    size_t n_tokens;
} proto_detokenize_req_t;

int proto_detokenize_parse(const char *body, size_t len, const proto_limits_t *lim,
                           proto_detokenize_req_t *out, proto_error_t *err);
void proto_detokenize_free(proto_detokenize_req_t *r);

/* ------------------------------------------------------ response builders */

/* Every pointer in these input structs is borrowed for the call only. */

typedef struct proto_top_logprob {
    const char *piece; /* raw token bytes (may be partial UTF-8) */
    size_t piece_len;
    int32_t id;
    double logprob;
} proto_top_logprob_t;

typedef struct proto_token_logprob {
    const char *piece; /* raw token bytes (may be partial UTF-8) */
    size_t piece_len;
    int32_t id;
    double logprob;
    int64_t text_offset;            /* completions shape: byte offset in the choice text */
    const proto_top_logprob_t *top; /* [n_top], best first */
    size_t n_top;
} proto_token_logprob_t;

/* One tool call of a chat response. In a chat.completion message every
 * field is set; in a chunk's delta the first chunk of a call carries id and name
 * ("type": "function" with them) and arguments "", later ones id = name =
 * NULL and a fragment of the arguments. */
typedef struct proto_tool_call {
    int index;             /* position among the choice's calls */
    const char *id;        /* "call_..." or NULL (chunk: not the first of the call) */
    const char *name;      /* NULL with id NULL */
    const char *arguments; /* JSON text (or a fragment of it); NULL = "" */
    size_t arguments_len;
} proto_tool_call_t;

typedef struct proto_choice {
    int index;
    const char *text;          /* completion text / chat content / delta; NULL = none */
    size_t text_len;
    const char *finish_reason; /* "stop", "length", ... or NULL (JSON null) */
    int has_logprobs;          /* 0: "logprobs": null */
    const proto_token_logprob_t *logprobs; /* [n_logprobs] */
    size_t n_logprobs;
} proto_choice_t;

/* The tool calls of one chat choice (proto_chat_tools_json). */
typedef struct proto_choice_tools {
    const proto_tool_call_t *calls; /* [n_calls] */
    size_t n_calls;
} proto_choice_tools_t;

typedef struct proto_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
} proto_usage_t;
/* (proto_usage_t and proto_resp_meta_t keep their fields: callers, the fuzz
 * harness among them, initialize them by position. The cached-token count
 * is added to a built response by proto_usage_cached_json.) */

/* id ("cmpl-..."/"chatcmpl-..."), created (unix seconds) and model of a
 * response; system_fingerprint ("fp_..."), when not NULL, goes into every
 * response and chunk built from it. */
typedef struct proto_resp_meta {
    const char *id;
    int64_t created;
    const char *model;
    const char *system_fingerprint; /* NULL = omitted */
} proto_resp_meta_t;

/* {"id","object":"text_completion","created","model","choices":[{"index","text",
 * "logprobs":{tokens,token_logprobs,top_logprobs,text_offset}|null,
 * "finish_reason"}],"usage":{prompt_tokens,completion_tokens,total_tokens}} */
char *proto_completion_json(const proto_resp_meta_t *meta, const proto_choice_t *choices,
                            size_t n_choices, const proto_usage_t *usage);

/* One stream chunk, same object name as the non-stream response. choice NULL
 * gives "choices": []; usage non-NULL adds "usage" (the include_usage chunk). */
char *proto_completion_chunk_json(const proto_resp_meta_t *meta, const proto_choice_t *choice,
                                  const proto_usage_t *usage);

/* {"id","object":"chat.completion","created","model","choices":[{"index",
 * "message":{"role":"assistant","content"},"logprobs":{"content":[...]}|null,
 * "finish_reason"}],"usage":{...}}. With tools[n_choices] (NULL = none) a
 * choice with calls gets "message.tool_calls" [{"id","type":"function",
 * "function":{"name","arguments"}}], and "content": null when its text is
 * empty. */
char *proto_chat_tools_json(const proto_resp_meta_t *meta, const proto_choice_t *choices,
                            const proto_choice_tools_t *tools, size_t n_choices,
                            const proto_usage_t *usage);

/* "chat.completion.chunk": delta carries "role":"assistant" when with_role,
 * "content" when choice->text != NULL; choice NULL gives "choices": []; usage
 * non-NULL adds "usage". */
char *proto_chat_chunk_json(const proto_resp_meta_t *meta, const proto_choice_t *choice,
                            int with_role, const proto_usage_t *usage);
/* A chunk of choice `index` whose delta is {"tool_calls": [call]} (the
 * fields proto_tool_call_t says), "logprobs": null, "finish_reason": null. */
char *proto_chat_tool_chunk_json(const proto_resp_meta_t *meta, int index,
                                 const proto_tool_call_t *call);

/* A session's checkpoint: its state after `turn` turns. */
typedef struct proto_checkpoint {
    int64_t turn;
    int64_t tokens; /* history length then */
    int64_t bytes;  /* its serialized size */
} proto_checkpoint_t;

typedef struct proto_session_info {
    const char *id;
    int64_t tokens;         /* tokens ingested so far */
    int64_t state_bytes;    /* size of the serialized state */
    int64_t created;        /* unix seconds (full form) */
    int64_t last_used;      /* unix seconds (full form) */
    const char *attn_kind;  /* "exact", "performer", "darkformer", ... (full form) */
    int64_t attn_features;  /* M */
    int64_t attn_window;    /* W */
    int64_t turns;          /* turns so far */
    const proto_checkpoint_t *checkpoints; /* borrowed [n_checkpoints], oldest first (full form) */
    size_t n_checkpoints;
    int has_pending_grammar;       /* a constrained reply left unfinished (full form) */
    int64_t pending_grammar_bytes; /* its bytes so far */
    int64_t attn_memory; /* λ exact memory rows per KV head (0 = none; full form) */
    int64_t attn_kv_bits; /* bits of the exact rows, 8 or 16 (0 = exact attention; full form) */
    const char *attn_memory_keep; /* "recall" | "recent" with a memory, else NULL (full form) */
    int64_t attn_memory_heads;    /* KV heads (layer, head pairs) that have it (full form) */
    const char *model;    /* the model the session is bound to; NULL = no "model" field */
} proto_session_info_t;

/* full = 0: {"id","tokens","state_bytes",["model"],"turns"}; full = 1 adds "created",
 * "last_used", "attention":{"kind","features","window","memory","memory_keep",
 * "memory_heads","kv_bits"},
 * "checkpoints":[{"turn","tokens","bytes"}] and, only when
 * has_pending_grammar, "pending_grammar":{"bytes"}. */
char *proto_session_json(const proto_session_info_t *s, int full);

/* {"object":"list","data":[full session objects],"has_more","last_id"|null} */
char *proto_session_list_json(const proto_session_info_t *items, size_t n, int has_more);

/* A cached prefix (POST/GET /v1/prefixes). */
typedef struct proto_prefix_info {
    const char *id;  /* "pfx_..." */
    int64_t tokens;  /* tokens its state holds */
    int64_t bytes;   /* memory its state takes */
    int pinned;
    int64_t hits;    /* requests it served */
} proto_prefix_info_t;

/* {"id","object":"prefix","tokens","bytes","pinned","hits"} */
char *proto_prefix_json(const proto_prefix_info_t *p);
/* {"object":"list","data":[prefix objects],"budget_bytes","bytes","pinned_bytes"} */
char *proto_prefix_list_json(const proto_prefix_info_t *items, size_t n, int64_t budget_bytes,
                             int64_t bytes, int64_t pinned_bytes);
/* json (an object built here, borrowed) with the integer field key = v
 * added at the top level. New string (proto_free) or NULL (out of memory,
 * not an object). */
char *proto_json_add_int(const char *json, const char *key, int64_t v);

typedef struct proto_timings {
    double queue_ms;      /* waiting for the scheduler */
    double prompt_ms;     /* ingesting the new text */
    double generation_ms; /* producing the completion tokens */
} proto_timings_t;

/* One generated token of /generate: {"text","token"} plus, when lp != NULL,
 * "logprob" and "top_logprobs":[{"token","id","logprob"}]. */
typedef struct proto_gen_token {
    const char *text; /* raw piece bytes */
    size_t text_len;
    int32_t id;
    const proto_token_logprob_t *lp; /* NULL = no logprobs */
} proto_gen_token_t;

char *proto_generate_token_json(const proto_gen_token_t *t);

/* json (a response or chunk built here, borrowed) with
 * "usage.prompt_tokens_details": {"cached_tokens": cached_tokens} added, as
 * OpenAI reports prompt caching; a copy when json has no "usage" object.
 * New string (proto_free) or NULL when out of memory or json is not an
 * object. */
char *proto_usage_cached_json(const char *json, int64_t cached_tokens);

/* {"done":true,"finish_reason","usage":{"prompt_tokens","completion_tokens"},
 * "timings":{"queue_ms","prompt_ms","generation_ms","prompt_tokens_per_second",
 * "generation_tokens_per_second"}}, plus "session": the full session object
 * after the request (session generate and regenerate) when session is not
 * NULL. */
char *proto_generate_done_session_json(const char *finish_reason, const proto_usage_t *usage,
                                       const proto_timings_t *timings,
                                       const proto_session_info_t *session);

/* Non-stream generate: {"id","text","tokens":[ids],"finish_reason","usage",
 * "timings"} plus "logprobs":[{"token","id","logprob","bytes","top_logprobs"}]
 * when lps != NULL, and "session" when session is not NULL (see
 * proto_generate_done_session_json). id is the session id;
 * tokens[n_tokens], lps[n_tokens]. */
char *proto_generate_session_json(const char *id, const char *text, size_t text_len,
                                  const int32_t *tokens, size_t n_tokens,
                                  const proto_token_logprob_t *lps, const char *finish_reason,
                                  const proto_usage_t *usage, const proto_timings_t *timings,
                                  const proto_session_info_t *session);

typedef struct proto_model_entry {
    const char *id;
    int64_t created;
    const char *owned_by;
} proto_model_entry_t;

/* {"object":"list","data":[{"id","object":"model","created","owned_by"}]} */
char *proto_models_json(const proto_model_entry_t *models, size_t n);

/* {"tokens":[ids]} or, with pieces != NULL, {"tokens":[{"id","piece"}]};
 * pieces[i]/piece_lens[i] are the raw bytes of tokens[i]. */
char *proto_tokenize_json(const int32_t *tokens, size_t n, const char *const *pieces,
                          const size_t *piece_lens);

/* {"text": ..., "content": ...} (the same text; llama.cpp's name for it) */
char *proto_detokenize_json(const char *text, size_t len);

typedef struct proto_health {
    const char *status;  /* "ok", "degraded", "loading", "draining" */
    const char *model;   /* NULL = JSON null */
    int64_t sessions;    /* sessions held (memory + disk) */
    int64_t queue_depth; /* jobs waiting or running */
    double uptime_s;
    const char *reason;  /* why it is degraded; NULL = no "reason" field (after "status") */
    const char *const *models; /* [n_models] every model served, when several; else unused */
    size_t n_models;           /* 0 or 1: no "models" field */
} proto_health_t;

/* {"status",["reason"],"model",["models"],"sessions","queue_depth","uptime_s"}:
 * "models" (the names of every model) only when n_models > 1; "model" is
 * the default one. */
char *proto_health_json(const proto_health_t *h);

/* ----------------------------------- POST /completion (llama.cpp's native API) */

/* The OpenAI completions fields (one prompt, n = 1) and llama.cpp's own:
 * "n_predict" (-1: the server's max_tokens limit; 0 refused), "n_probs"
 * (the top alternatives of every token, as "logprobs"), "ignore_eos",
 * "return_tokens", "cache_prompt" and "n_keep" (accepted: the prefix cache
 * never changes an answer and nothing is ever dropped from the context),
 * "id_slot" -1 or 0; the sampler fields darkserve lacks are refused unless
 * they hold their off value (docs/API.md). "prompt" may mix strings and
 * token ids in one array: then parts holds them in order and c.prompts[0]
 * is empty. */
typedef struct proto_llama_req {
    proto_completion_req_t c;
    proto_prompt_t *parts; /* owned [n_parts] of a mixed prompt, or NULL */
    size_t n_parts;
    int n_probs; /* 0 = none */
    int ignore_eos;
    int return_tokens;
} proto_llama_req_t;

int proto_llama_parse(const char *body, size_t len, const proto_limits_t *lim,
                      proto_llama_req_t *out, proto_error_t *err);
void proto_llama_free(proto_llama_req_t *r);

/* "generation_settings" of an answer: the request's settings, seed the one
 * used. New text (proto_free) or NULL when out of memory. */
char *proto_llama_settings_json(const proto_llama_req_t *r, int64_t seed);

/* The native fields an answer or stream chunk carries beside OpenAI's. */
typedef struct proto_llama_fields {
    const char *content; /* this chunk's text, or the whole answer's */
    size_t content_len;
    const int32_t *tokens; /* [n_tokens] ids of the text ("tokens") */
    size_t n_tokens;
    int with_probs; /* "completion_probabilities" of probs[n_probs] */
    const proto_token_logprob_t *probs;
    size_t n_probs;
    int stop;              /* 1: the end: the fields below are written too */
    const char *stop_type; /* "eos", "word", "limit", "none" */
    const char *stopping_word;
    const char *content_all; /* the whole text (has_new_line) */
    size_t content_all_len;
    int64_t tokens_predicted, tokens_evaluated, tokens_cached;
    double prompt_ms, predicted_ms;
    const char *settings; /* proto_llama_settings_json text, or NULL */
} proto_llama_fields_t;

/* json (an OpenAI completion or chunk object, borrowed) with f's fields
 * added: "content", "tokens", "stop", "index", "id_slot", with probs
 * "completion_probabilities" ([{"id","token","logprob","bytes",
 * "top_logprobs":[{"id","token","logprob","bytes"}]}]); at the end
 * "stop_type", "stopping_word", "tokens_predicted", "tokens_evaluated",
 * "tokens_cached", "truncated", "has_new_line", "generation_settings",
 * "timings". New text or NULL. */
char *proto_llama_fields_json(const char *json, const proto_llama_fields_t *f);

/* POST /infill (llama.cpp's): "input_prefix" and "input_suffix" (strings,
 * default ""), the text between which the model writes; "prompt" (optional)
 * is text already typed after the prefix; the rest is /completion's.
 * "input_extra" (other files) is refused unless empty. */
typedef struct proto_infill_req {
    proto_llama_req_t l;
    char *prefix, *suffix; /* owned or NULL */
    size_t prefix_len, suffix_len;
} proto_infill_req_t;

int proto_infill_parse(const char *body, size_t len, const proto_limits_t *lim,
                       proto_infill_req_t *out, proto_error_t *err);
void proto_infill_free(proto_infill_req_t *r);

/* GET /props (llama.cpp's): the model, the context, the chat template and
 * the default settings. Strings borrowed; NULL ones become null. */
typedef struct proto_llama_props {
    const char *model_alias, *model_path, *build_info;
    const char *chat_template; /* [chat_template_len], raw template text or NULL */
    size_t chat_template_len;
    const char *bos_token, *eos_token;
    int64_t n_ctx;       /* tokens one request may give the model (see docs/API.md) */
    int64_t n_predict;   /* the default max_tokens */
    int64_t total_slots; /* sequences decoded at once (--max-batch) */
    int infill;          /* the vocabulary has fill-in-the-middle tokens */
} proto_llama_props_t;

/* {"default_generation_settings":{"id","n_ctx","params":{...}},"total_slots",
 * "model_alias","model_path","modalities","chat_template","bos_token",
 * "eos_token","build_info","infill"} (new text or NULL) */
char *proto_llama_props_json(const proto_llama_props_t *p);

/* {"prompt": text} (POST /apply-template; new text or NULL) */
char *proto_prompt_json(const char *text, size_t len);

/* --------------------------------- POST /v1/messages (Anthropic's Messages API) */

/* The Messages request (model, max_tokens, messages with text content or
 * text blocks, system, stop_sequences, temperature 0..1, top_p, top_k,
 * metadata) read into the chat request the OpenAI route runs; *out as from
 * proto_chat_parse (proto_chat_free). Unknown fields are refused ("Extra
 * inputs are not permitted", as Anthropic's API answers), and so are tools,
 * tool_choice, thinking, non-text blocks and stream: true. */
int proto_messages_parse(const char *body, size_t len, const proto_limits_t *lim,
                         proto_chat_req_t *out, proto_error_t *err);

typedef struct proto_messages_end {
    const char *id; /* "msg_..." */
    const char *model;
    const char *stop_reason;   /* "end_turn", "max_tokens", "stop_sequence" or NULL */
    const char *stop_sequence; /* the one that matched, or NULL */
} proto_messages_end_t;

/* The chat answer chat_json (borrowed) as a Messages answer: {"id","type":
 * "message","role":"assistant","model","content":[{"type":"text","text"}],
 * "stop_reason","stop_sequence","usage":{"input_tokens","output_tokens"}}.
 * New text or NULL. */
char *proto_messages_json(const char *chat_json, const proto_messages_end_t *m);

/* POST /v1/messages/count_tokens: the fields of a Messages request that
 * shape the prompt (model, messages, system, tools, tool_choice, thinking;
 * no max_tokens), read the same way (max_tokens set to 1). */
int proto_messages_count_parse(const char *body, size_t len, const proto_limits_t *lim,
                               proto_chat_req_t *out, proto_error_t *err);

/* {"type":"error","error":{"type","message"}}: Anthropic's error shape, its
 * type from e's status. New text or NULL. */
char *proto_anthropic_error_json(const proto_error_t *e);
/* The same as a streamed event: "event: error\ndata: {...}\n\n". */
char *proto_anthropic_error_event(const proto_error_t *e, size_t *out_len);

/* A streamed Messages answer's events (Anthropic's order: message_start,
 * then per content block content_block_start, its deltas and
 * content_block_stop, then message_delta and message_stop; ping between). */
typedef enum proto_msg_ev_kind {
    PROTO_MSG_EV_MESSAGE_START, /* id, model, input_tokens */
    PROTO_MSG_EV_PING,
    PROTO_MSG_EV_TEXT_START,    /* index: a text block */
    PROTO_MSG_EV_TOOL_START,    /* index, id, name: a tool_use block */
    PROTO_MSG_EV_TEXT_DELTA,    /* index, text[len]: text_delta */
    PROTO_MSG_EV_JSON_DELTA,    /* index, text[len]: input_json_delta */
    PROTO_MSG_EV_BLOCK_STOP,    /* index */
    PROTO_MSG_EV_MESSAGE_DELTA, /* stop_reason, stop_sequence, output_tokens */
    PROTO_MSG_EV_MESSAGE_STOP,
    PROTO_MSG_EV_ERROR /* (not built here: proto_anthropic_error_event) */
} proto_msg_ev_kind_t;

typedef struct proto_msg_ev {
    proto_msg_ev_kind_t kind;
    int index;
    const char *text;
    size_t len;
    const char *id, *name, *model;
    int64_t input_tokens, output_tokens;
    const char *stop_reason, *stop_sequence;
} proto_msg_ev_t;

/* The SSE frame "event: <type>\ndata: <json>\n\n" of ev; new text (its
 * length in *out_len) or NULL. */
char *proto_messages_event(const proto_msg_ev_t *ev, size_t *out_len);

/* ------------------------------------------------------------ responses */

/* OpenAI's Responses API (POST /v1/responses), the subset docs/API.md
 * lists: read into the chat request it stands for. */
#define PROTO_RESPONSE_ID_MAX 64 /* bytes of a response id */

typedef struct proto_responses_req {
    proto_chat_req_t chat; /* instructions + input as messages; max_output_tokens as
                              max_tokens; function tools; text.format as response_format */
    int store;             /* "store", default 1 */
    char previous_id[PROTO_RESPONSE_ID_MAX + 1]; /* "previous_response_id", "" when absent */
    char *echo; /* the request fields a response object repeats (JSON object, owned) */
} proto_responses_req_t;

int proto_responses_parse(const char *body, size_t len, const proto_limits_t *lim,
                          proto_responses_req_t *out, proto_error_t *err);
void proto_responses_free(proto_responses_req_t *r);

/* One function_call output item. */
typedef struct proto_rsp_call {
    const char *id;      /* item id, "fc_..." */
    const char *call_id; /* "call_..." */
    const char *name;
    const char *arguments;
    size_t arguments_len;
} proto_rsp_call_t;

/* A response object: {"id","object":"response","created_at","status",
 * "error","incomplete_details","model","output":[message?, function_call*],
 * "usage"} and the fields of echo (proto_responses_req_t). */
typedef struct proto_rsp_out {
    const char *id;
    int64_t created_at;
    const char *model;
    const char *status;                     /* "in_progress", "completed", "incomplete", "failed" */
    const char *incomplete_reason;          /* "max_output_tokens" or NULL */
    const char *error_code, *error_message; /* failed: "error" (else null) */
    const char *echo;
    int has_message; /* a message item with one output_text part */
    const char *msg_id, *item_status;
    const char *text;
    size_t text_len;
    const proto_rsp_call_t *calls;
    size_t n_calls;
    int with_usage; /* else "usage": null */
    int64_t input_tokens, output_tokens, cached_tokens;
} proto_rsp_out_t;

char *proto_responses_json(const proto_rsp_out_t *o);
/* An output item: the function call (when call), else a message (msg_id;
 * content one output_text part of text[len], or [] when text is NULL). */
char *proto_responses_item_json(const proto_rsp_call_t *call, const char *msg_id,
                                const char *status, const char *text, size_t len);

/* A stream event "event: <type>\ndata: {...}\n\n": type and
 * sequence_number, then by type: response (JSON text of the response
 * object), item_id and output_index, content_index (content_part and
 * output_text events), item (JSON text), part (content_part events: an
 * output_text part of text[len]), delta / text / arguments (text[len]),
 * name (function_call_arguments.done); type "error": code, message
 * (text[len]), param. */
typedef struct proto_rsp_ev {
    const char *type;
    int64_t seq;
    const char *response;
    const char *item_id;
    int output_index, content_index;
    const char *item;
    const char *text;
    size_t len;
    const char *name;
    const char *code, *param;
} proto_rsp_ev_t;

char *proto_responses_event(const proto_rsp_ev_t *ev, size_t *out_len);

/* ------------------------------------------------------------ embeddings */

/* Which API an embedding request came in (docs/API.md, "Embeddings"): the
 * field names, defaults and answer shape follow it. */
typedef enum proto_embed_api {
    PROTO_EMBED_OPENAI = 0,   /* POST /v1/embeddings: "input" */
    PROTO_EMBED_LLAMA = 1,    /* POST /embedding, /embeddings (llama.cpp): "content" or "input" */
    PROTO_EMBED_OLLAMA = 2,   /* POST /api/embed: "model", "input" (strings) */
    PROTO_EMBED_OLLAMA_V1 = 3 /* POST /api/embeddings: "model", "prompt" (one string) */
} proto_embed_api_t;

/* "pooling": how a text's token vectors become its embedding. */
typedef enum proto_pooling {
    PROTO_POOL_MEAN = 1, /* the mean of every token's (default) */
    PROTO_POOL_LAST = 2, /* the last token's */
    PROTO_POOL_NONE = 3  /* every token's (POST /embedding only) */
} proto_pooling_t;

#define PROTO_MAX_EMBED_INPUTS 64 /* inputs of one embedding request */
#define PROTO_MAX_EMBED_NORM 64   /* the largest p of a p-norm "embd_normalize" */

typedef struct proto_embed_req {
    proto_embed_api_t api;
    char *model;            /* owned or NULL (required by the Ollama APIs) */
    proto_prompt_t *inputs; /* owned [n_inputs], 1..PROTO_MAX_EMBED_INPUTS: text or ids */
    size_t n_inputs;
    proto_pooling_t pooling;
    int normalize;      /* "embd_normalize": -1 none, 0 the largest magnitude to
                           32760, 1 taxicab, 2 Euclidean, p > 2 the p-norm; default
                           2, -1 for /api/embeddings */
    int base64;         /* OpenAI "encoding_format": "base64" */
    int64_t dimensions; /* OpenAI and /api/embed "dimensions"; 0 when absent (the
                           server refuses any but the model's width) */
} proto_embed_req_t;

/* body/lim/err borrowed; *out owned by the caller (proto_embed_free). */
int proto_embed_parse(const char *body, size_t len, proto_embed_api_t api,
                      const proto_limits_t *lim, proto_embed_req_t *out, proto_error_t *err);
void proto_embed_free(proto_embed_req_t *r);

/* Divides v[n] by its norm of the given mode (proto_embed_req_t.normalize),
 * computed in double; -1 and a zero vector leave it as it is. */
void proto_embed_normalize(float *v, size_t n, int mode);

typedef struct proto_embed_resp {
    proto_embed_api_t api;
    const char *model;
    const float *const *vecs; /* [n]: input i's rows[i] vectors of dim floats, borrowed */
    const size_t *rows;       /* [n]: 1, or its tokens with pooling "none" */
    size_t n, dim;
    int base64;                /* OpenAI: "embedding" as base64 of little-endian float32 */
    int64_t prompt_tokens;     /* usage / prompt_eval_count */
    int64_t total_duration_ns; /* Ollama's total_duration */
} proto_embed_resp_t;

/* The answer in r->api's shape (new text, proto_free; NULL when out of
 * memory): OpenAI {"object":"list","data":[{"object":"embedding","index",
 * "embedding"}],"model","usage"}; llama.cpp [{"index","embedding":[[...]]}];
 * Ollama {"model","embeddings":[[...]],"total_duration","load_duration",
 * "prompt_eval_count"}; /api/embeddings {"embedding":[...]}. */
char *proto_embed_json(const proto_embed_resp_t *r);

/* ------------------------------------------------------------ Ollama API */

/* POST /api/generate and POST /api/chat with Ollama's field names and
 * defaults (docs/API.md, "Ollama API"). Differences from the OpenAI
 * parsers: "stream" defaults to true; sampling lives in "options" with
 * Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
 * 1.1, repeat_last_n 64, seed -1 = random, num_predict -1 = until the
 * end or the server's max_tokens limit); options darkserve has no use for
 * are ignored and named in `ignored` (the server logs them); "model" is
 * required. Fields whose meaning darkserve cannot honour (images, tools,
 * format, template, suffix, think) are refused. Errors carry the status
 * and a message; the server answers {"error": message}
 * (proto_ollama_error_json). */
#define PROTO_OLLAMA_MAX_CONTEXT 65536   /* ids in a generate request's "context" */
#define PROTO_OLLAMA_MAX_REPEAT_LAST_N 256 /* = the sampler's history ring */
#define PROTO_OLLAMA_IGNORED_MAX 256     /* bytes of the ignored option names list */

typedef struct proto_ollama_req {
    int chat;                  /* 1: /api/chat (messages); 0: /api/generate (prompt) */
    char *model;               /* owned, 1..PROTO_MAX_NAME_BYTES bytes */
    proto_gen_params_t p;      /* max_tokens, sampling, stop, stream, logprobs; n = 1 */
    int unlimited;             /* num_predict <= 0: p.max_tokens is the server's limit */
    int32_t repeat_last_n;     /* -1 (whole history) .. PROTO_OLLAMA_MAX_REPEAT_LAST_N */
    /* generate */
    char *prompt;              /* owned, or NULL when absent */
    size_t prompt_len;
    char *system;              /* owned, or NULL when absent */
    size_t system_len;
    int raw;                   /* prompt used as it is, no chat template */
    int32_t *context;          /* owned [n_context] token ids, or NULL */
    size_t n_context;
    /* chat */
    proto_message_t *messages; /* owned [n_messages], or NULL when none */
    size_t n_messages;
    char ignored[PROTO_OLLAMA_IGNORED_MAX]; /* "num_ctx,mirostat" ("" = none; truncated) */
} proto_ollama_req_t;

/* chat selects /api/chat; body, lim and err borrowed; *out owned by the
 * caller (proto_ollama_free). */
int proto_ollama_parse(const char *body, size_t len, int chat, const proto_limits_t *lim,
                       proto_ollama_req_t *out, proto_error_t *err);
void proto_ollama_free(proto_ollama_req_t *r);

/* The model a JSON request body names, for routing it before its own parse:
 * the non-empty string "model" (or, when that is absent or not a string,
 * the key fallback, e.g. Ollama's older "name"; NULL = none) copied into
 * out[outlen]. 1 when found; 0 when absent, empty or not a string, or when
 * the body is not a JSON object (the request's own parse says what is
 * wrong); -1 when the name does not fit out[outlen] or holds a NUL. */
int proto_peek_model(const char *body, size_t len, const char *fallback, char *out,
                     size_t outlen);
/* The non-empty strings of keys[0..n_keys) of a JSON request body, each into
 * out[i][outlen] (found[i]: 1 copied; 0 absent, empty or not a string; -1
 * too long for outlen or holding a NUL; out[i] "" unless 1). 0, or -1 when
 * the body is not a JSON object (every found[i] 0). */
int proto_peek_strings(const char *body, size_t len, const char *const *keys, size_t n_keys,
                       char *const *out, size_t outlen, int *found);

/* POST /api/show: {"model": name} (or the older "name"); *name is a new
 * copy (proto_free). */
int proto_ollama_show_parse(const char *body, size_t len, char **name, proto_error_t *err);

/* One line (or the whole answer) of /api/generate or /api/chat. */
typedef struct proto_ollama_resp {
    int chat;                /* "message": {"role": "assistant", "content"} vs "response" */
    const char *model;
    const char *created_at;  /* RFC 3339 */
    const char *text;        /* this line's text (raw bytes, made valid UTF-8) */
    size_t text_len;
    int done;
    /* with done: */
    const char *done_reason; /* "stop", "length", "load", ... */
    int with_stats;          /* the counts and durations (ns) below */
    int64_t total_duration, load_duration, prompt_eval_count, prompt_eval_duration;
    int64_t eval_count, eval_duration;
    const int32_t *context;  /* [n_context] "context" (generate); NULL = omitted */
    size_t n_context;
    int with_logprobs;       /* 1: "logprobs" of logprobs[n_logprobs]; 0: omitted */
    const proto_token_logprob_t *logprobs;
    size_t n_logprobs;
} proto_ollama_resp_t;

char *proto_ollama_resp_json(const proto_ollama_resp_t *r);

/* The model as /api/tags, /api/ps and /api/show describe it. */
typedef struct proto_ollama_model {
    const char *name;         /* "SmolLM2-135M-Instruct:latest" */
    const char *modified_at;  /* RFC 3339 */
    int64_t size;             /* bytes */
    const char *digest;
    const char *family;       /* "llama" */
    const char *parameter_size;     /* "135M" */
    const char *quantization_level; /* "Q4_1" */
    const char *expires_at;   /* ps only */
    int64_t context_length;   /* ps only; 0 = omitted (no context limit) */
} proto_ollama_model_t;

/* {"models": [{"name","model","modified_at","size","digest","details"}]} or,
 * ps = 1, {"models": [{"name","model","size","digest","details","expires_at",
 * "size_vram","context_length"?}]} */
char *proto_ollama_models_json(const proto_ollama_model_t *m, size_t n, int ps);

/* What /api/show's "model_info" says ({"general.architecture", ...,
 * "<arch>.context_length", ...}, GGUF key names as Ollama shows them). */
typedef struct proto_ollama_info {
    const char *arch;      /* "llama" */
    const char *name;      /* general.name */
    int64_t n_params, n_ctx_train, n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab;
    double rope_base;
    const char *attention; /* darkserve.attention: "darkformer" ... */
    const char *system_fingerprint; /* darkserve.system_fingerprint, NULL = omitted */
} proto_ollama_info_t;

/* /api/show: {"modelfile","parameters","template","details","model_info",
 * "capabilities":["completion"],"modified_at"}. */
char *proto_ollama_show_json(const proto_ollama_model_t *m, const proto_ollama_info_t *info,
                             const char *modelfile, const char *template_text);

/* {"error": err->message} */
char *proto_ollama_error_json(const proto_error_t *err);

/* ------------------------------------------------------------ framing */

#define PROTO_SSE_DONE "data: [DONE]\n\n"
#define PROTO_SSE_PING ": ping\n\n"

/* SSE: "data: <json>\n\n" (each line of json text gets its own "data: "
 * prefix, as the SSE spec joins them back with \n); NDJSON: "<json>\n" with any
 * CR/LF inside replaced by a space (only JSON whitespace can hold them).
 * json[0..len) is borrowed. Returns new bytes (proto_free), *out_len set to
 * their length (a NUL follows them), or NULL when out of memory. */
char *proto_frame(proto_stream_format_t fmt, const char *json, size_t len, size_t *out_len);

/* The error event / line: proto_frame() of proto_error_json(err). */
char *proto_frame_error(proto_stream_format_t fmt, const proto_error_t *err, size_t *out_len);

/* ------------------------------------------------------------ UTF-8 */

/* New copy of s[0..len) with every ill-formed sequence replaced by U+FFFD
 * (maximal subparts, as Unicode §3.9 recommends) and a NUL terminator;
 * *out_len gets the length. NULL when out of memory. */
char *proto_utf8_sanitize(const char *s, size_t len, size_t *out_len);

#endif
