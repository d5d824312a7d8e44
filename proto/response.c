/* proto/response.c — response builders: OpenAI completions and chat (whole and
 * streamed chunks), session objects and pages, /generate lines, models,
 * tokenize/detokenize and health.
 *
 * Pattern: build the tree ignoring individual failures and OR their results
 * into `bad` (jansson's *_set_new/append_new accept a NULL container or value
 * and release what they were given), then dump or drop the whole tree.
 */
#include <math.h>
#include <string.h>

#include "proto/proto_impl.h"

/* logprob of a token the model gave probability 0 (-inf); OpenAI's sentinel. */
#define LOGPROB_FLOOR (-9999.0)

static json_t *fail_tree(json_t *root)
{
    json_decref(root);
    return NULL;
}

static json_t *px_usage(const proto_usage_t *u, int with_total)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    bad |= json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    if (with_total)
        bad |= json_object_set_new(o, "total_tokens",
                                   json_integer(u->prompt_tokens + u->completion_tokens));

    return bad ? fail_tree(o) : o;
}

/* A piece as an object key: made valid UTF-8, and NUL bytes replaced by U+FFFD
 * too, because common JSON readers (jansson among them) refuse "\u0000" in a
 * key although it is valid JSON. New reference or NULL. */
static json_t *piece_key(const char *s, size_t len)
{
    /* U+FFFD's UTF-8 bytes, no terminating NUL: copied into the middle of k */
    static const char replacement[3] = {'\xEF', '\xBF', '\xBD'};
    if (!memchr(s ? s : "", '\0', s ? len : 0))
        return px_str(s, len);
    size_t n = 0, o = 0;
    char *fixed = proto_utf8_sanitize(s, len, &n);
    if (!fixed || n > (SIZE_MAX - 1) / 3) {
        px_free(fixed);
        return NULL;
    }
    char *k = px_malloc(3 * n + 1);
    if (!k) {
        px_free(fixed);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (fixed[i] == '\0') {
            memcpy(k + o, replacement, sizeof replacement);
            o += sizeof replacement;
        } else {
            k[o++] = fixed[i];
        }
    }
    json_t *j = json_stringn_nocheck(k, o);
    px_free(k);
    px_free(fixed);
    return j;
}

/* The legacy completions shape: parallel arrays over the choice's tokens. */
static json_t *px_completion_logprobs(const proto_choice_t *c)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    int bad = 0;
    for (size_t i = 0; i < c->n_logprobs; i++) {
        const proto_token_logprob_t *t = &c->logprobs[i];
        bad |= json_array_append_new(tokens, px_str(t->piece, t->piece_len));
        bad |= json_array_append_new(lps, px_real(t->logprob, LOGPROB_FLOOR));
        json_t *top = json_object();
        for (size_t k = 0; k < t->n_top; k++) {
            json_t *key = piece_key(t->top[k].piece, t->top[k].piece_len);
            if (!key) {
                bad = 1;
                break;
            }
            /* Two ids can share a piece (or the same repaired text): keep
             * the first, which is the more likely one. */
            if (!json_object_getn(top, json_string_value(key), json_string_length(key)))
                bad |= json_object_setn_new(top, json_string_value(key),
                                            json_string_length(key),
                                            px_real(t->top[k].logprob, LOGPROB_FLOOR));
            json_decref(key);
        }
        bad |= json_array_append_new(tops, top);
        bad |= json_array_append_new(offs, json_integer(t->text_offset));
    }
    json_t *o = json_object();
    bad |= json_object_set_new(o, "tokens", tokens);
    bad |= json_object_set_new(o, "token_logprobs", lps);
    bad |= json_object_set_new(o, "top_logprobs", tops);
    bad |= json_object_set_new(o, "text_offset", offs);
    return bad ? fail_tree(o) : o;
}

/* UTF-8 bytes of a piece as integers, so clients can rebuild characters split
 * across tokens (OpenAI's "bytes"). */
static json_t *bytes_array(const char *s, size_t n)
{
    json_t *a = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= json_array_append_new(a, json_integer((unsigned char)s[i]));
    return bad ? fail_tree(a) : a;
}

/* {"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]} */
json_t *px_chat_logprob_entry(const proto_token_logprob_t *t)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "token", px_str(t->piece, t->piece_len));
    bad |= json_object_set_new(o, "logprob", px_real(t->logprob, LOGPROB_FLOOR));
    bad |= json_object_set_new(o, "bytes", bytes_array(t->piece, t->piece_len));
    json_t *tops = json_array();
    for (size_t k = 0; k < t->n_top; k++) {
        const proto_top_logprob_t *a = &t->top[k];
        json_t *e = json_object();
        bad |= json_object_set_new(e, "token", px_str(a->piece, a->piece_len));
        bad |= json_object_set_new(e, "logprob", px_real(a->logprob, LOGPROB_FLOOR));
        bad |= json_object_set_new(e, "bytes", bytes_array(a->piece, a->piece_len));
        bad |= json_array_append_new(tops, e);
    }
    bad |= json_object_set_new(o, "top_logprobs", tops);
    return bad ? fail_tree(o) : o;
}

static json_t *chat_logprobs(const proto_choice_t *c)
{
    json_t *content = json_array();
    int bad = 0;
    for (size_t i = 0; i < c->n_logprobs; i++)
        bad |= json_array_append_new(content, px_chat_logprob_entry(&c->logprobs[i]));
    json_t *o = json_object();
    bad |= json_object_set_new(o, "content", content);
    return bad ? fail_tree(o) : o;
}

/* id, object, created, model (and system_fingerprint): the head every OpenAI
 * response starts with. */
static json_t *resp_head(const proto_resp_meta_t *m, const char *object)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "id", px_cstr_or_null(m->id ? m->id : ""));
    bad |= json_object_set_new(o, "object", json_string(object));
    bad |= json_object_set_new(o, "created", json_integer(m->created));
    bad |= json_object_set_new(o, "model", px_cstr_or_null(m->model ? m->model : ""));
    if (m->system_fingerprint)
        bad |= json_object_set_new(o, "system_fingerprint", px_cstr_or_null(m->system_fingerprint));
    return bad ? fail_tree(o) : o;
}

static json_t *completion_choice(const proto_choice_t *c)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "index", json_integer(c->index));
    bad |= json_object_set_new(o, "text", px_str(c->text, c->text ? c->text_len : 0));
    bad |= json_object_set_new(o, "logprobs",
                               c->has_logprobs ? px_completion_logprobs(c) : json_null());
    bad |= json_object_set_new(o, "finish_reason", px_cstr_or_null(c->finish_reason));
    return bad ? fail_tree(o) : o;
}

char *proto_completion_json(const proto_resp_meta_t *meta, const proto_choice_t *choices,
                            size_t n_choices, const proto_usage_t *usage)
{
    json_t *root = resp_head(meta, "text_completion");
    json_t *arr = json_array();
    int bad = 0;
    for (size_t i = 0; i < n_choices; i++)
        bad |= json_array_append_new(arr, completion_choice(&choices[i]));
    bad |= json_object_set_new(root, "choices", arr);
    proto_usage_t zero = {0, 0};
    bad |= json_object_set_new(root, "usage", px_usage(usage ? usage : &zero, 1));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_completion_chunk_json(const proto_resp_meta_t *meta, const proto_choice_t *choice,
                                  const proto_usage_t *usage)
{
    json_t *root = resp_head(meta, "text_completion");
    json_t *arr = json_array();
    int bad = 0;
    if (choice)
        bad |= json_array_append_new(arr, completion_choice(choice));
    bad |= json_object_set_new(root, "choices", arr);
    if (usage)
        bad |= json_object_set_new(root, "usage", px_usage(usage, 1));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

/* [{"index"?, "id", "type": "function", "function": {"name", "arguments"}}]:
 * with_index for chunks (deltas), whose later pieces of a call carry only
 * index and function.arguments. */
static json_t *tool_calls_json(const proto_tool_call_t *calls, size_t n, int with_index)
{
    json_t *a = json_array();
    int bad = !a;
    for (size_t i = 0; !bad && i < n; i++) {
        const proto_tool_call_t *t = &calls[i];
        json_t *o = json_object(), *f = json_object();
        bad |= !o || !f;
        if (with_index)
            bad |= json_object_set_new(o, "index", json_integer(t->index));
        if (t->id) {
            bad |= json_object_set_new(o, "id", px_str(t->id, strlen(t->id)));
            bad |= json_object_set_new(o, "type", json_string("function"));
            bad |= json_object_set_new(f, "name", px_str(t->name, t->name ? strlen(t->name) : 0));
        }
        bad |= json_object_set_new(f, "arguments",
                                   px_str(t->arguments, t->arguments ? t->arguments_len : 0));
        bad |= json_object_set_new(o, "function", f);
        bad |= json_array_append_new(a, o);
    }
    return bad ? fail_tree(a) : a;
}

char *proto_chat_tools_json(const proto_resp_meta_t *meta, const proto_choice_t *choices,
                            const proto_choice_tools_t *tools, size_t n_choices,
                            const proto_usage_t *usage)
{
    json_t *root = resp_head(meta, "chat.completion");
    json_t *arr = json_array();
    int bad = 0;
    for (size_t i = 0; i < n_choices; i++) {
        const proto_choice_t *c = &choices[i];
        json_t *o = json_object(), *msg = json_object();
        bad |= json_object_set_new(msg, "role", json_string("assistant"));
        const size_t nt = tools ? tools[i].n_calls : 0;
        if (nt && (!c->text || c->text_len == 0))
            bad |= json_object_set_new(msg, "content", json_null());
        else
            bad |= json_object_set_new(msg, "content",
                                       px_str(c->text, c->text ? c->text_len : 0));
        if (nt)
            bad |= json_object_set_new(msg, "tool_calls", tool_calls_json(tools[i].calls, nt, 0));
        bad |= json_object_set_new(o, "index", json_integer(c->index));
        bad |= json_object_set_new(o, "message", msg);
        bad |= json_object_set_new(o, "logprobs", c->has_logprobs ? chat_logprobs(c) : json_null());
        bad |= json_object_set_new(o, "finish_reason", px_cstr_or_null(c->finish_reason));
        bad |= json_array_append_new(arr, o);
    }
    bad |= json_object_set_new(root, "choices", arr);
    proto_usage_t zero = {0, 0};
    bad |= json_object_set_new(root, "usage", px_usage(usage ? usage : &zero, 1));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_chat_chunk_json(const proto_resp_meta_t *meta, const proto_choice_t *choice,
                            int with_role, const proto_usage_t *usage)
{
    json_t *root = resp_head(meta, "chat.completion.chunk");
    json_t *arr = json_array();
    int bad = 0;
    if (choice) {
        json_t *o = json_object(), *delta = json_object();
        if (with_role)
            bad |= json_object_set_new(delta, "role", json_string("assistant"));
        if (choice->text)
            bad |= json_object_set_new(delta, "content", px_str(choice->text, choice->text_len));
        bad |= json_object_set_new(o, "index", json_integer(choice->index));
        bad |= json_object_set_new(o, "delta", delta);
        bad |= json_object_set_new(o, "logprobs",
                                   choice->has_logprobs ? chat_logprobs(choice) : json_null());
        bad |= json_object_set_new(o, "finish_reason", px_cstr_or_null(choice->finish_reason));
        bad |= json_array_append_new(arr, o);
    }
    bad |= json_object_set_new(root, "choices", arr);
    if (usage)
        bad |= json_object_set_new(root, "usage", px_usage(usage, 1));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_chat_tool_chunk_json(const proto_resp_meta_t *meta, int index,
                                 const proto_tool_call_t *call)
{
    json_t *root = resp_head(meta, "chat.completion.chunk");
    json_t *arr = json_array(), *o = json_object(), *delta = json_object();
    int bad = !arr || !o || !delta;
    bad |= json_object_set_new(delta, "tool_calls", tool_calls_json(call, 1, 1));
    bad |= json_object_set_new(o, "index", json_integer(index));
    bad |= json_object_set_new(o, "delta", delta);
    bad |= json_object_set_new(o, "logprobs", json_null());
    bad |= json_object_set_new(o, "finish_reason", json_null());
    bad |= json_array_append_new(arr, o);
    bad |= json_object_set_new(root, "choices", arr);
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

/* ------------------------------------------------------------- sessions */

static json_t *session_obj(const proto_session_info_t *s, int full)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "id", px_cstr_or_null(s->id ? s->id : ""));
    bad |= json_object_set_new(o, "tokens", json_integer(s->tokens));
    bad |= json_object_set_new(o, "state_bytes", json_integer(s->state_bytes));
    if (s->model)
        bad |= json_object_set_new(o, "model", px_cstr_or_null(s->model));
    bad |= json_object_set_new(o, "turns", json_integer(s->turns));
    if (full) {
        bad |= json_object_set_new(o, "created", json_integer(s->created));
        bad |= json_object_set_new(o, "last_used", json_integer(s->last_used));
        json_t *a = json_object();
        bad |= json_object_set_new(a, "kind", px_cstr_or_null(s->attn_kind ? s->attn_kind : ""));
        bad |= json_object_set_new(a, "features", json_integer(s->attn_features));
        bad |= json_object_set_new(a, "window", json_integer(s->attn_window));
        bad |= json_object_set_new(a, "memory", json_integer(s->attn_memory));
        bad |= json_object_set_new(a, "memory_keep", px_cstr_or_null(s->attn_memory_keep));
        bad |= json_object_set_new(a, "memory_heads", json_integer(s->attn_memory_heads));
        bad |= json_object_set_new(a, "kv_bits", json_integer(s->attn_kv_bits));
        bad |= json_object_set_new(o, "attention", a);
        json_t *cs = json_array();
        for (size_t i = 0; s->checkpoints && i < s->n_checkpoints; i++) {
            json_t *c = json_object();
            bad |= json_object_set_new(c, "turn", json_integer(s->checkpoints[i].turn));
            bad |= json_object_set_new(c, "tokens", json_integer(s->checkpoints[i].tokens));
            bad |= json_object_set_new(c, "bytes", json_integer(s->checkpoints[i].bytes));
            bad |= json_array_append_new(cs, c);
        }
        bad |= json_object_set_new(o, "checkpoints", cs);
        if (s->has_pending_grammar) {
            json_t *pg = json_object();
            bad |= json_object_set_new(pg, "bytes", json_integer(s->pending_grammar_bytes));
            bad |= json_object_set_new(o, "pending_grammar", pg);
        }
    }
    return bad ? fail_tree(o) : o;
}

char *proto_session_json(const proto_session_info_t *s, int full)
{
    return px_dump(session_obj(s, full));
}

char *proto_session_list_json(const proto_session_info_t *items, size_t n, int has_more)
{
    json_t *root = json_object(), *data = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= json_array_append_new(data, session_obj(&items[i], 1));
    bad |= json_object_set_new(root, "object", json_string("list"));
    bad |= json_object_set_new(root, "data", data);
    bad |= json_object_set_new(root, "has_more", json_boolean(has_more));
    bad |= json_object_set_new(root, "last_id",
                               n ? px_cstr_or_null(items[n - 1].id ? items[n - 1].id : "")
                                 : json_null());
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

/* ------------------------------------------------------------- prefixes */

static json_t *prefix_obj(const proto_prefix_info_t *p)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "id", px_cstr_or_null(p->id));
    bad |= json_object_set_new(o, "object", json_string("prefix"));
    bad |= json_object_set_new(o, "tokens", json_integer(p->tokens));
    bad |= json_object_set_new(o, "bytes", json_integer(p->bytes));
    bad |= json_object_set_new(o, "pinned", json_boolean(p->pinned));
    bad |= json_object_set_new(o, "hits", json_integer(p->hits));
    return bad ? fail_tree(o) : o;
}

char *proto_prefix_json(const proto_prefix_info_t *p)
{
    return px_dump(prefix_obj(p));
}

char *proto_prefix_list_json(const proto_prefix_info_t *items, size_t n, int64_t budget_bytes,
                             int64_t bytes, int64_t pinned_bytes)
{
    json_t *root = json_object(), *data = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= json_array_append_new(data, prefix_obj(&items[i]));
    bad |= json_object_set_new(root, "object", json_string("list"));
    bad |= json_object_set_new(root, "data", data);
    bad |= json_object_set_new(root, "budget_bytes", json_integer(budget_bytes));
    bad |= json_object_set_new(root, "bytes", json_integer(bytes));
    bad |= json_object_set_new(root, "pinned_bytes", json_integer(pinned_bytes));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_json_add_int(const char *json, const char *key, int64_t v)
{
    json_t *root = json ? json_loads(json, JSON_ALLOW_NUL, NULL) : NULL;
    if (!json_is_object(root) || json_object_set_new(root, key, json_integer(v)) < 0) {
        json_decref(root);
        return NULL;
    }
    return px_dump(root);
}

/* ------------------------------------------------------------- generate */

static double per_second(int64_t tokens, double ms)
{
    return ms > 0 && isfinite(ms) ? (double)tokens * 1000.0 / ms : 0.0;
}

static json_t *px_timings(const proto_timings_t *t, const proto_usage_t *u)
{
    proto_timings_t zt = {0, 0, 0};
    proto_usage_t zu = {0, 0};
    if (!t)
        t = &zt;
    if (!u)
        u = &zu;
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "queue_ms", px_real(t->queue_ms, 0));
    bad |= json_object_set_new(o, "prompt_ms", px_real(t->prompt_ms, 0));
    bad |= json_object_set_new(o, "generation_ms", px_real(t->generation_ms, 0));
    bad |= json_object_set_new(o, "prompt_tokens_per_second",
                               px_real(per_second(u->prompt_tokens, t->prompt_ms), 0));
    bad |= json_object_set_new(o, "generation_tokens_per_second",
                               px_real(per_second(u->completion_tokens, t->generation_ms), 0));
    return bad ? fail_tree(o) : o;
}

/* {"token","id","logprob"} alternatives of the /generate shapes. */
static json_t *gen_top(const proto_token_logprob_t *lp, int with_bytes)
{
    json_t *tops = json_array();
    int bad = 0;
    for (size_t k = 0; k < lp->n_top; k++) {
        const proto_top_logprob_t *a = &lp->top[k];
        json_t *e = json_object();
        bad |= json_object_set_new(e, "token", px_str(a->piece, a->piece_len));
        bad |= json_object_set_new(e, "id", json_integer(a->id));
        bad |= json_object_set_new(e, "logprob", px_real(a->logprob, LOGPROB_FLOOR));
        if (with_bytes)
            bad |= json_object_set_new(e, "bytes", bytes_array(a->piece, a->piece_len));
        bad |= json_array_append_new(tops, e);
    }
    return bad ? fail_tree(tops) : tops;
}

char *proto_generate_token_json(const proto_gen_token_t *t)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "text", px_str(t->text, t->text ? t->text_len : 0));
    bad |= json_object_set_new(o, "token", json_integer(t->id));
    if (t->lp) {
        bad |= json_object_set_new(o, "logprob", px_real(t->lp->logprob, LOGPROB_FLOOR));
        bad |= json_object_set_new(o, "top_logprobs", gen_top(t->lp, 0));
    }
    return bad ? (json_decref(o), NULL) : px_dump(o);
}

char *proto_generate_done_session_json(const char *finish_reason, const proto_usage_t *usage,
                                       const proto_timings_t *timings,
                                       const proto_session_info_t *session)
{
    proto_usage_t zero = {0, 0};
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "done", json_true());
    bad |= json_object_set_new(o, "finish_reason", px_cstr_or_null(finish_reason));
    bad |= json_object_set_new(o, "usage", px_usage(usage ? usage : &zero, 0));
    bad |= json_object_set_new(o, "timings", px_timings(timings, usage));
    if (session)
        bad |= json_object_set_new(o, "session", session_obj(session, 1));
    return bad ? (json_decref(o), NULL) : px_dump(o);
}

char *proto_generate_session_json(const char *id, const char *text, size_t text_len,
                                  const int32_t *tokens, size_t n_tokens,
                                  const proto_token_logprob_t *lps, const char *finish_reason,
                                  const proto_usage_t *usage, const proto_timings_t *timings,
                                  const proto_session_info_t *session)
{
    proto_usage_t zero = {0, 0};
    json_t *o = json_object(), *ids = json_array();
    int bad = 0;
    for (size_t i = 0; i < n_tokens; i++)
        bad |= json_array_append_new(ids, json_integer(tokens[i]));
    bad |= json_object_set_new(o, "id", px_cstr_or_null(id ? id : ""));
    bad |= json_object_set_new(o, "text", px_str(text, text ? text_len : 0));
    bad |= json_object_set_new(o, "tokens", ids);
    bad |= json_object_set_new(o, "finish_reason", px_cstr_or_null(finish_reason));
    bad |= json_object_set_new(o, "usage", px_usage(usage ? usage : &zero, 0));
    bad |= json_object_set_new(o, "timings", px_timings(timings, usage));
    if (lps) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n_tokens; i++) {
            const proto_token_logprob_t *t = &lps[i];
            json_t *e = json_object();
            bad |= json_object_set_new(e, "token", px_str(t->piece, t->piece_len));
            bad |= json_object_set_new(e, "id", json_integer(t->id));
            bad |= json_object_set_new(e, "logprob", px_real(t->logprob, LOGPROB_FLOOR));
            bad |= json_object_set_new(e, "bytes", bytes_array(t->piece, t->piece_len));
            bad |= json_object_set_new(e, "top_logprobs", gen_top(t, 1));
            bad |= json_array_append_new(arr, e);
        }
        bad |= json_object_set_new(o, "logprobs", arr);
    }
    if (session)
        bad |= json_object_set_new(o, "session", session_obj(session, 1));
    return bad ? (json_decref(o), NULL) : px_dump(o);
}

/* ----------------------------------------------------------- operations */

char *proto_models_json(const proto_model_entry_t *models, size_t n)
{
    json_t *root = json_object(), *data = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_object();
        bad |= json_object_set_new(m, "id", px_cstr_or_null(models[i].id ? models[i].id : ""));
        bad |= json_object_set_new(m, "object", json_string("model"));
        bad |= json_object_set_new(m, "created", json_integer(models[i].created));
        bad |= json_object_set_new(m, "owned_by",
                                   px_cstr_or_null(models[i].owned_by ? models[i].owned_by
                                                                      : "darkserve"));
        bad |= json_array_append_new(data, m);
    }
    bad |= json_object_set_new(root, "object", json_string("list"));
    bad |= json_object_set_new(root, "data", data);
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_tokenize_json(const int32_t *tokens, size_t n, const char *const *pieces,
                          const size_t *piece_lens)
{
    json_t *root = json_object(), *arr = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (pieces) {
            json_t *e = json_object();
            bad |= json_object_set_new(e, "id", json_integer(tokens[i]));
            bad |= json_object_set_new(e, "piece", px_str(pieces[i], piece_lens[i]));
            bad |= json_array_append_new(arr, e);
        } else {
            bad |= json_array_append_new(arr, json_integer(tokens[i]));
        }
    }
    bad |= json_object_set_new(root, "tokens", arr);
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_detokenize_json(const char *text, size_t len)
{
    json_t *root = json_object();
    int bad = json_object_set_new(root, "text", px_str(text, text ? len : 0));
    /* llama.cpp's server names it "content" */
    bad |= json_object_set_new(root, "content", px_str(text, text ? len : 0));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_health_json(const proto_health_t *h)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "status", px_cstr_or_null(h->status ? h->status : "ok"));
    if (h->reason)
        bad |= json_object_set_new(o, "reason", px_cstr_or_null(h->reason));
    bad |= json_object_set_new(o, "model", px_cstr_or_null(h->model));
    if (h->n_models > 1) {
        json_t *a = json_array();
        bad |= !a;
        for (size_t i = 0; a && i < h->n_models; i++)
            bad |= json_array_append_new(a, px_cstr_or_null(h->models[i]));
        bad |= json_object_set_new(o, "models", a);
    }
    bad |= json_object_set_new(o, "sessions", json_integer(h->sessions));
    bad |= json_object_set_new(o, "queue_depth", json_integer(h->queue_depth));
    bad |= json_object_set_new(o, "uptime_s", px_real(h->uptime_s, 0));
    return bad ? (json_decref(o), NULL) : px_dump(o);
}

char *proto_usage_cached_json(const char *json, int64_t cached_tokens)
{
    json_t *root = json ? json_loads(json, JSON_ALLOW_NUL, NULL) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    json_t *u = json_object_get(root, "usage");
    if (json_is_object(u)) {
        json_t *d = json_object();
        if (json_object_set_new(d, "cached_tokens", json_integer(cached_tokens)) < 0 ||
            json_object_set_new(u, "prompt_tokens_details", d) < 0) {
            json_decref(root);
            return NULL;
        }
    }
    return px_dump(root);
}
