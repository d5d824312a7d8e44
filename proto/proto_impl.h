/* proto/proto_impl.h — helpers shared by the proto sources; not part of the public API.
 *
 * Allocation goes through jansson's allocator so that one hook
 * (json_set_alloc_funcs) can inject failures into every path in tests.
 */
#ifndef DARKSERVE_PROTO_PROTO_IMPL_H
#define DARKSERVE_PROTO_PROTO_IMPL_H

#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* ------------------------------------------------------------- memory */

void *px_malloc(size_t n);               /* NULL for n == 0 or when out of memory */
void px_free(void *p);                   /* NULL is a no-op */
char *px_strndup(const char *s, size_t n); /* copy + NUL; NULL when out of memory */

/* A growing text buffer (px_dump, proto/schema.c). `failed` is sticky:
 * jansson 2.14 ignores the result of writing an object key (dump.c,
 * dump_string in both key loops), so after one failed append it would go
 * on and produce JSON with a key missing; once an append fails, every later
 * one fails too and the text is dropped. */
typedef struct px_buf {
    char *p; /* owned; NUL-terminated after each append */
    size_t n, cap;
    int failed;
} px_buf_t;
/* Appends bytes[0..size) to the px_buf_t `data` (a json_dump_callback_t).
 * 0, or -1 when out of memory (the buffer is then failed). */
int px_buf_append(const char *bytes, size_t size, void *data);
/* Appends the formatted text to b, whatever its length (the buffer grows;
 * nothing is ever cut). 0, or -1 when out of memory or the format fails
 * (the buffer is then failed). */
int px_buf_printf(px_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int px_buf_vprintf(px_buf_t *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* ------------------------------------------------------------ UTF-8 */

/* ---------------------------------------------------------- building */

/* A JSON string of s[0..len) made valid UTF-8 (NULL s -> ""). New reference or
 * NULL when out of memory. */
json_t *px_str(const char *s, size_t len);
/* px_str of a NUL-terminated string, or JSON null when s is NULL. */
json_t *px_cstr_or_null(const char *s);
/* json_real, with non-finite v replaced by `fallback`. */
json_t *px_real(double v, double fallback);
/* Compact dump of root (reference stolen). NULL when root is NULL or on OOM. */
char *px_dump(json_t *root);

/* ----------------------------------------------------------- parsing */

/* Formats a field path ("messages[3].content") into out[PROTO_ERROR_PARAM_MAX],
 * a text too long ends with "..." (a cut is always marked; real paths are far shorter). */
void px_paramf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A client's value as error messages quote it ("(got 1e-300)"): compact
 * JSON, a real in its shortest exact form, a text longer than the buffer
 * cut and ending with "...". */
#define PX_VALUE_TEXT_MAX 64
void px_value_text(json_t *v, char out[PX_VALUE_TEXT_MAX]);

/* v (non-NULL) as a number the sampler takes: in [lo, hi] (lo excluded
 * when lo_open), checked on the value as a 32-bit float too (the sampler's
 * type: 1e-300 is a double greater than 0 but a float 0, 1e300 a float
 * infinity). 0 and *out, or 400 naming param and quoting the value given. */
int px_sampler_number(json_t *v, const char *param, double lo, double hi, int lo_open,
                      const char *range_text, double *out, proto_error_t *err);
#define PX_REPEAT_PENALTY_RANGE "greater than 0 and at most 3.4e38"

/* Loads body as one JSON object after checking depth. len == 0 gives an empty
 * object when allow_empty, else 400. Returns a new reference or NULL with err set
 * (*rc = PROTO_EINVAL or PROTO_ENOMEM). */
json_t *px_load_object(const char *body, size_t len, int allow_empty, proto_error_t *err,
                       int *rc);

/* The value of key, or NULL when absent or JSON null (borrowed). */
json_t *px_get(json_t *obj, const char *key);

/* Field readers: return 0 when read, 1 when absent (out untouched), <0 on error
 * (err set, naming `key`). */
int px_read_int(json_t *obj, const char *key, int64_t lo, int64_t hi, const char *range_text,
                int64_t *out, proto_error_t *err);
int px_read_bool(json_t *obj, const char *key, int *out, proto_error_t *err);
/* "prefix" (a prefix id, proto_prefix_id_valid) into out[PROTO_PREFIX_ID_LEN + 1];
 * "" when absent. */
int px_read_prefix_id(json_t *obj, char *out, proto_error_t *err);
/* A string of at most max_bytes bytes; *out is a new copy. */
int px_read_string(json_t *obj, const char *key, size_t max_bytes, char **out, size_t *out_len,
                   proto_error_t *err);

/* messages array value v (non-NULL) at field `param`. New [*n] array in *out.
 * *total_bytes is increased by the content bytes, checked against max_text. */
int px_parse_messages(json_t *v, const char *param, int64_t max_text, proto_message_t **out,
                      size_t *n, proto_error_t *err);
void px_messages_free(proto_message_t *m, size_t n);
/* 1 when s[0..n) is a function name: [a-zA-Z0-9_-]{1,PROTO_MAX_TOOL_NAME}. */
int px_tool_name_valid(const char *s, size_t n);

/* An array of token ids at `param` (caller checked json_is_array). */
int px_parse_token_ids(json_t *arr, const char *param, int64_t max_count, int64_t n_vocab,
                       int allow_empty, int32_t **out, size_t *n, proto_error_t *err);

/* Resolved limits: every field non-zero. */
void px_limits_resolve(const proto_limits_t *in, proto_limits_t *out);

enum px_gen_kind { PX_GEN_COMPLETION, PX_GEN_CHAT, PX_GEN_GENERATE };

/* Fields common to the generation endpoints (see docs/API.md). */
int px_parse_gen_params(json_t *root, const proto_limits_t *lim, enum px_gen_kind kind,
                        proto_gen_params_t *p, proto_error_t *err);
void px_gen_params_free(proto_gen_params_t *p);

/* "tools", "tool_choice", "parallel_tool_calls" of a chat request into r
 * (proto/tools.c); runs after px_parse_gen_params (a forced call sets
 * r->p.grammar). */
int px_parse_tools(json_t *root, proto_chat_req_t *r, proto_error_t *err);
void px_tools_free(proto_tool_t *t, size_t n);

/* "prompt" of a completions request into r->prompts (proto/request.c). */
int px_parse_prompt(json_t *root, const proto_limits_t *lim, proto_completion_req_t *r,
                    proto_error_t *err);
/* The legacy completions fields darkserve refuses (echo, best_of, suffix). */
int px_completion_unsupported(json_t *root, const proto_gen_params_t *p, proto_error_t *err);

/* ------------------------------------------------------ response parts */

json_t *px_chat_logprob_entry(const proto_token_logprob_t *t);

#endif
