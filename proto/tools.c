/* proto/tools.c — tool calling: "tools", "tool_choice" and
 * "parallel_tool_calls" of a chat request, the generic format's prompt text
 * and the parser of calls in the output (proto/tools.h).
 *
 * The parser sees the output a piece at a time and must never show the
 * "<tool_call>" markup as content, yet never sit on plain content longer
 * than it takes to tell that it is not a call: it holds only the text that
 * could still be the start of a call (leading whitespace and a prefix of
 * "<tool_call>") or that belongs to the call being read.
 */
#include "proto/tools.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "proto/schema.h"

/* ------------------------------------------------------------ the request */

void px_tools_free(proto_tool_t *t, size_t n)
{
    if (!t)
        return;
    for (size_t i = 0; i < n; i++) {
        px_free(t[i].name);
        px_free(t[i].description);
        px_free(t[i].parameters);
        px_free(t[i].json);
    }
    px_free(t);
}

/* Compact JSON text of v with numbers as given (px_dump rounds reals to 9
 * digits, fine for responses, not for a client's schema or arguments). */
static char *dump_exact(json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* tools[i] into *t; its parameters schema (borrowed from v, NULL when
 * absent) into *params. */
static int parse_tool(json_t *v, size_t i, proto_tool_t *t, json_t **params, proto_error_t *err)
{
    char tp[PROTO_ERROR_PARAM_MAX], fp[PROTO_ERROR_PARAM_MAX];
    px_paramf(tp, "tools[%zu]", i);
    if (!json_is_object(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, tp,
                               "'%s' must be an object {\"type\": \"function\", \"function\": "
                               "{\"name\", \"description\", \"parameters\"}}",
                               tp);
    json_t *type = px_get(v, "type"), *fn = px_get(v, "function");
    px_paramf(fp, "%s.type", tp);
    if (!json_is_string(type))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be 'function'", fp);
    if (strcmp(json_string_value(type), "function") != 0)
        return proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                               "'%s' '%.40s' is not supported; only 'function' tools are", fp,
                               json_string_value(type));
    px_paramf(fp, "%s.function", tp);
    if (!json_is_object(fn))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be an object with 'name'", fp);
    json_t *name = px_get(fn, "name"), *desc = px_get(fn, "description");
    json_t *par = px_get(fn, "parameters"), *strict = px_get(fn, "strict");
    px_paramf(fp, "%s.function.name", tp);
    if (!name)
        return proto_error_set(err, PROTO_ERR_MISSING, fp, "'%s' is required", fp);
    if (!json_is_string(name) ||
        !px_tool_name_valid(json_string_value(name), json_string_length(name)))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be 1 to %d characters a-z, A-Z, 0-9, '_' or '-'", fp,
                               PROTO_MAX_TOOL_NAME);
    px_paramf(fp, "%s.function.description", tp);
    if (desc && !json_is_string(desc))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be a string", fp);
    px_paramf(fp, "%s.function.parameters", tp);
    if (par && !json_is_object(par))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                               "'%s' must be a JSON Schema object", fp);
    px_paramf(fp, "%s.function.strict", tp);
    if (strict && !json_is_boolean(strict))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be a boolean", fp);
    *params = par;
    t->name = px_strndup(json_string_value(name), json_string_length(name));
    if (desc)
        t->description = px_strndup(json_string_value(desc), json_string_length(desc));
    if (par)
        t->parameters = dump_exact(par);
    /* the line the prompt lists: name, description, parameters, nothing else */
    json_t *f = json_object(), *line = json_object();
    int bad = !f || !line;
    bad |= json_object_set(f, "name", name);
    if (desc)
        bad |= json_object_set(f, "description", desc);
    if (par)
        bad |= json_object_set(f, "parameters", par);
    bad |= json_object_set_new(line, "type", json_string("function"));
    bad |= json_object_set(line, "function", f);
    if (!bad)
        t->json = dump_exact(line);
    json_decref(f);
    json_decref(line);
    if (!t->name || (desc && !t->description) || (par && !t->parameters) || !t->json)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return 0;
}

/* "tool_choice": its kind, and for a named function its index. */
static int parse_choice(json_t *root, proto_chat_req_t *r, proto_error_t *err)
{
    json_t *v = px_get(root, "tool_choice");
    r->tool_choice = r->n_tools ? PROTO_TOOL_CHOICE_AUTO : PROTO_TOOL_CHOICE_NONE;
    if (!v)
        return 0;
    static const char shape[] = "'tool_choice' must be 'none', 'auto', 'required' or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "none"))
            r->tool_choice = PROTO_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "auto"))
            r->tool_choice = PROTO_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "required"))
            r->tool_choice = PROTO_TOOL_CHOICE_REQUIRED;
        else
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice", shape);
    } else if (json_is_object(v)) {
        json_t *type = px_get(v, "type"), *fn = px_get(v, "function");
        json_t *name = json_is_object(fn) ? px_get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_string(name))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice", shape);
        size_t k = 0;
        while (k < r->n_tools && strcmp(r->tools[k].name, json_string_value(name)) != 0)
            k++;
        if (k == r->n_tools && r->n_tools)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice.function.name",
                                   "'tool_choice.function.name' '%.64s' is not one of 'tools'",
                                   json_string_value(name));
        r->tool_choice = PROTO_TOOL_CHOICE_NAMED;
        r->tool_named = k;
    } else {
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice", shape);
    }
    if (!r->n_tools && r->tool_choice != PROTO_TOOL_CHOICE_NONE)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice",
                               "'tool_choice' other than 'none' requires 'tools'");
    return 0;
}

int px_parse_tools(json_t *root, proto_chat_req_t *r, proto_error_t *err)
{
    r->parallel_tool_calls = 1;
    int rc = px_read_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, err);
    if (rc < 0)
        return rc;
    json_t *v = px_get(root, "tools");
    if (v && !json_is_array(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tools",
                               "'tools' must be an array of function tools");
    size_t n = v ? json_array_size(v) : 0;
    if (n > PROTO_MAX_TOOLS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tools",
                               "'tools' has %zu entries; at most %d are allowed", n,
                               PROTO_MAX_TOOLS);
    json_t **params = NULL;
    proto_schema_fn_t *fns = NULL;
    if (n) {
        char *all = dump_exact(v);
        size_t bytes = all ? strlen(all) : 0;
        px_free(all);
        if (!all)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        if (bytes > PROTO_MAX_TOOLS_BYTES)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tools",
                                   "'tools' is %zu bytes of JSON; at most %d are allowed", bytes,
                                   PROTO_MAX_TOOLS_BYTES);
        r->tools = px_malloc(n * sizeof *r->tools);
        /* an array of pointers: sizeof *params is a pointer's size on purpose */
        params = px_malloc(n * sizeof *params); /* NOLINT(bugprone-sizeof-expression) */
        fns = px_malloc(n * sizeof *fns);
        if (!r->tools || !params || !fns) {
            rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
            goto done;
        }
        memset(r->tools, 0, n * sizeof *r->tools);
        r->n_tools = n;
        for (size_t i = 0; i < n; i++) {
            if ((rc = parse_tool(json_array_get(v, i), i, &r->tools[i], &params[i], err)) < 0)
                goto done;
            for (size_t k = 0; k < i; k++) {
                if (strcmp(r->tools[k].name, r->tools[i].name) == 0) {
                    char fp[PROTO_ERROR_PARAM_MAX];
                    px_paramf(fp, "tools[%zu].function.name", i);
                    rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                                         "'%s' '%s' is the name of tools[%zu] too; names must "
                                         "be unique",
                                         fp, r->tools[i].name, k);
                    goto done;
                }
            }
        }
    }
    if ((rc = parse_choice(root, r, err)) < 0)
        goto done;
    if (!n)
        goto done;
    /* every schema through the converter, whatever the choice: one that
     * cannot be honoured is refused even when no call is forced now */
    /* "tools[127].function.parameters" is 30 bytes: n <= PROTO_MAX_TOOLS fits */
    _Static_assert(PROTO_MAX_TOOLS < 1000000, "tool paths fit 48 bytes");
    char(*pth)[48] = px_malloc(n * sizeof *pth);
    if (!pth) {
        rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(pth[i], sizeof pth[i], "tools[%zu].function.parameters", i);
        fns[i] = (proto_schema_fn_t){r->tools[i].name, params[i], pth[i]};
    }
    const int forced =
        r->tool_choice == PROTO_TOOL_CHOICE_REQUIRED || r->tool_choice == PROTO_TOOL_CHOICE_NAMED;
    const int max_calls = r->parallel_tool_calls ? PROTO_MAX_TOOL_CALLS : 1;
    if (forced && r->p.grammar) {
        rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tool_choice",
                             "a forced tool call ('tool_choice' '%s') cannot be combined with "
                             "'%s'; its output is constrained to the call already",
                             r->tool_choice == PROTO_TOOL_CHOICE_REQUIRED ? "required" : "function",
                             r->p.grammar_param ? r->p.grammar_param : "grammar");
        px_free(pth);
        goto done;
    }
    /* Each function alone, so that a refusal names the function it is
     * about and so that tools which are not forced are not bounded by the
     * size of a grammar of all of them together (never built for them). */
    char *g = NULL;
    size_t gl = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = proto_schema_tools_grammar(&fns[i], 1, 1, &g, &gl, err);
        px_free(g);
        g = NULL;
    }
    if (rc == 0 && forced) {
        const size_t first = r->tool_choice == PROTO_TOOL_CHOICE_NAMED ? r->tool_named : 0;
        const size_t count = r->tool_choice == PROTO_TOOL_CHOICE_NAMED ? 1 : n;
        rc = proto_schema_tools_grammar(&fns[first], count, max_calls, &g, &gl, err);
        if (rc == PROTO_EINVAL && count > 1) {
            /* every function fits alone: the bound met is that of all
             * of them in one grammar */
            char what[PROTO_ERROR_MSG_MAX];
            snprintf(what, sizeof what, "%s", err->message);
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "tools",
                                 "'tool_choice' 'required' constrains the answer to calls of "
                                 "any of the %zu tools, and the grammar of all of them together "
                                 "is over a bound (%s); use fewer or smaller tools, or name one "
                                 "function in 'tool_choice'",
                                 n, what);
        }
    }
    px_free(pth);
    if (rc == 0 && forced) {
        r->p.grammar = g;
        r->p.grammar_len = gl;
        r->p.grammar_param = "tools";
    } else {
        px_free(g);
    }
done:
    px_free(params);
    px_free(fns);
    return rc;
}

/* ------------------------------------------------------------ prompt text */

static char *buf_take(px_buf_t *b, size_t *out_len)
{
    if (b->failed || !b->p) {
        px_free(b->p);
        if (!b->failed && (b->p = px_strndup("", 0)) != NULL) {
            *out_len = 0;
            return b->p;
        }
        return NULL;
    }
    *out_len = b->n;
    return b->p;
}

static void put(px_buf_t *b, const char *s)
{
    px_buf_append(s, strlen(s), b);
}

char *proto_tools_system_text(const proto_tool_t *tools, size_t n, const char *base,
                              size_t base_len, size_t *out_len)
{
    px_buf_t b = {0};
    if (base_len) {
        px_buf_append(base, base_len, &b);
        put(&b, "\n\n");
    }
    put(&b, "# Tools\n\nYou can call functions to help with the user's request. The "
            "functions, one JSON object per line, inside <tools></tools>:\n<tools>\n");
    for (size_t i = 0; i < n; i++) {
        put(&b, tools[i].json);
        put(&b, "\n");
    }
    put(&b, "</tools>\n\nTo call a function, answer with its name and arguments as one JSON "
            "object inside <tool_call></tool_call>, one block per call:\n<tool_call>\n"
            "{\"name\": <function-name>, \"arguments\": <arguments-as-a-JSON-object>}\n"
            "</tool_call>");
    return buf_take(&b, out_len);
}

/* One call in the format: arguments that are a JSON object go in as they
 * are; anything else (a client's malformed text) as a JSON string. */
static void put_call(px_buf_t *b, const proto_msg_tool_call_t *c)
{
    json_t *args = json_loadb(c->arguments, c->arguments_len, JSON_REJECT_DUPLICATES, NULL);
    json_t *o = json_object();
    int bad = !o;
    bad |= json_object_set_new(o, "name", json_string(c->name));
    bad |= json_object_set_new(o, "arguments",
                               json_is_object(args) ? json_incref(args)
                                                    : json_stringn(c->arguments, c->arguments_len));
    json_decref(args);
    char *t = bad ? NULL : json_dumps(o, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(o);
    if (!t) {
        b->failed = 1;
        return;
    }
    put(b, PROTO_TOOL_CALL_OPEN "\n");
    put(b, t);
    put(b, "\n" PROTO_TOOL_CALL_CLOSE);
    px_free(t);
}

char *proto_tools_assistant_text(const proto_message_t *m, size_t *out_len)
{
    px_buf_t b = {0};
    px_buf_append(m->content, m->content_len, &b);
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        if (b.n)
            put(&b, "\n");
        put_call(&b, &m->tool_calls[i]);
    }
    return buf_take(&b, out_len);
}

char *proto_tools_results_text(const proto_message_t *msgs, size_t n, size_t *out_len)
{
    px_buf_t b = {0};
    for (size_t i = 0; i < n; i++) {
        put(&b, i ? "\n<tool_response>\n" : "<tool_response>\n");
        px_buf_append(msgs[i].content, msgs[i].content_len, &b);
        put(&b, "\n</tool_response>");
    }
    return buf_take(&b, out_len);
}

/* ------------------------------------------------------------ the parser */

enum { M_LEAD, M_OPEN, M_BODY, M_CLOSE, M_CONTENT };
enum { K_KEY, K_COLON, K_VALUE, K_INVAL, K_AFTER }; /* where depth 1 of the object is */
enum { KEY_OTHER, KEY_NAME, KEY_ARGS };

#define NONE SIZE_MAX

struct proto_tool_parser {
    char **names;
    size_t n_names;
    int incremental, max_calls;
    proto_tool_emit_fn emit;
    void *ud;
    int failed;
    int mode;
    int calls;
    px_buf_t buf;      /* the text held: lead whitespace, the tag, the call */
    size_t tag;        /* M_OPEN, M_CLOSE: bytes of the tag matched */
    size_t close_from; /* M_CLOSE: where the text after the object starts */
    /* M_BODY: a lexical scan of the object, enough to find its end and the
     * spans of "name" and "arguments" at its top level */
    size_t obj_s;
    int depth, in_str, esc, phase, key, val_kind;
    size_t key_s, val_s;
    size_t name_s, name_e; /* the name's JSON string, quotes included; NONE = not yet */
    size_t args_s, args_e; /* the arguments' value; NONE = not begun / not ended */
    size_t args_sent;      /* incremental: bytes of buf up to here were reported */
    int announced;         /* incremental: CALL reported for this call */
};

static void ev(proto_tool_parser_t *p, proto_tool_ev_kind_t kind, int index, const char *s,
               size_t n)
{
    if (n == 0 && kind == PROTO_TOOL_EV_CONTENT)
        return;
    proto_tool_ev_t e = {kind, index, s, n};
    p->emit(p->ud, &e);
}

proto_tool_parser_t *proto_tool_parser_new(const char *const *names, size_t n_names,
                                           int incremental, int max_calls, proto_tool_emit_fn emit,
                                           void *ud)
{
    proto_tool_parser_t *p = px_malloc(sizeof *p);
    if (!p)
        return NULL;
    memset(p, 0, sizeof *p);
    p->names = px_malloc((n_names ? n_names : 1) * sizeof *p->names);
    if (!p->names) {
        px_free(p);
        return NULL;
    }
    for (size_t i = 0; i < n_names; i++) {
        p->names[i] = px_strndup(names[i], strlen(names[i]));
        if (!p->names[i]) {
            p->n_names = i;
            proto_tool_parser_free(p);
            return NULL;
        }
    }
    p->n_names = n_names;
    p->incremental = incremental;
    p->max_calls = max_calls < 1 ? 1 : max_calls;
    p->emit = emit;
    p->ud = ud;
    p->mode = M_LEAD;
    return p;
}

void proto_tool_parser_free(proto_tool_parser_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_names; i++)
        px_free(p->names[i]);
    px_free(p->names);
    px_free(p->buf.p);
    px_free(p);
}

int proto_tool_parser_calls(const proto_tool_parser_t *p)
{
    return p->calls;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void body_reset(proto_tool_parser_t *p)
{
    p->obj_s = NONE;
    p->depth = p->in_str = p->esc = 0;
    p->phase = K_KEY;
    p->key = KEY_OTHER;
    p->val_kind = 0;
    p->name_s = p->name_e = p->args_s = p->args_e = NONE;
    p->args_sent = 0;
    p->announced = 0;
}

/* Everything held from `from` on is content, and so is the rest of the
 * output. */
static void to_content(proto_tool_parser_t *p, size_t from)
{
    if (from < p->buf.n)
        ev(p, PROTO_TOOL_EV_CONTENT, 0, p->buf.p + from, p->buf.n - from);
    p->buf.n = 0;
    p->mode = M_CONTENT;
}

/* The function name of the JSON string buf[name_s, name_e), if allowed. */
static json_t *allowed_name(proto_tool_parser_t *p, const char *s, size_t n)
{
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (json_is_string(v))
        for (size_t i = 0; i < p->n_names; i++)
            if (strcmp(p->names[i], json_string_value(v)) == 0)
                return v;
    json_decref(v);
    return NULL;
}

/* Incremental mode: reports the name once known, then the arguments' bytes
 * that arrived since the last report. 0, or -1 when the name is not one of
 * the allowed. */
static int report_incremental(proto_tool_parser_t *p)
{
    if (!p->announced) {
        if (p->name_e == NONE)
            return 0;
        json_t *name = allowed_name(p, p->buf.p + p->name_s, p->name_e - p->name_s);
        if (!name)
            return -1;
        ev(p, PROTO_TOOL_EV_CALL, p->calls, json_string_value(name), json_string_length(name));
        json_decref(name);
        p->announced = 1;
        p->calls++;
    }
    if (p->args_s == NONE)
        return 0;
    size_t from = p->args_sent > p->args_s ? p->args_sent : p->args_s;
    size_t to = p->args_e != NONE ? p->args_e : p->buf.n;
    if (to > from)
        ev(p, PROTO_TOOL_EV_ARGS, p->calls - 1, p->buf.p + from, to - from);
    if (to > p->args_sent)
        p->args_sent = to;
    return 0;
}

/* Auto mode: the complete object buf[obj_s, end) as a call, or -1. */
static int report_object(proto_tool_parser_t *p, size_t end)
{
    json_t *o = json_loadb(p->buf.p + p->obj_s, end - p->obj_s, JSON_REJECT_DUPLICATES, NULL);
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    json_t *parsed = NULL;
    if (json_is_string(args)) {
        parsed = json_loadb(json_string_value(args), json_string_length(args),
                            JSON_REJECT_DUPLICATES, NULL);
        args = parsed;
    }
    int ok = json_is_string(name) && json_is_object(args);
    size_t k = 0;
    while (ok && k < p->n_names && strcmp(p->names[k], json_string_value(name)) != 0)
        k++;
    char *text = ok && k < p->n_names ? dump_exact(args) : NULL;
    if (text) {
        ev(p, PROTO_TOOL_EV_CALL, p->calls, p->names[k], strlen(p->names[k]));
        ev(p, PROTO_TOOL_EV_ARGS, p->calls, text, strlen(text));
        p->calls++;
        px_free(text);
    }
    json_decref(parsed);
    json_decref(o);
    return text ? 0 : -1;
}

static void value_start(proto_tool_parser_t *p, size_t pos, int kind)
{
    p->val_kind = kind;
    p->val_s = pos;
    p->phase = K_INVAL;
    if (p->key == KEY_ARGS && p->args_s == NONE)
        p->args_s = pos;
}

static void value_end(proto_tool_parser_t *p, size_t end)
{
    if (p->key == KEY_NAME && p->val_kind == 's' && p->name_e == NONE) {
        p->name_s = p->val_s;
        p->name_e = end;
    }
    if (p->key == KEY_ARGS && p->args_s == p->val_s && p->args_e == NONE)
        p->args_e = end;
    p->val_kind = 0;
    p->phase = K_AFTER;
}

static void key_end(proto_tool_parser_t *p, size_t end)
{
    const char *k = p->buf.p + p->key_s;
    size_t n = end - p->key_s;
    p->key = n == 4 && !memcmp(k, "name", 4)           ? KEY_NAME
             : n == 9 && !memcmp(k, "arguments", 9)    ? KEY_ARGS
             : n == 10 && !memcmp(k, "parameters", 10) ? KEY_ARGS
                                                       : KEY_OTHER;
    p->phase = K_COLON;
}

/* One byte of the call body, at buf[pos]. 1: the object ended with it;
 * 0: go on; -1: this is no call. */
static int body_byte(proto_tool_parser_t *p, char c, size_t pos)
{
    if (p->obj_s == NONE) {
        if (is_ws(c))
            return 0;
        if (c != '{')
            return -1;
        p->obj_s = pos;
        p->depth = 1;
        return 0;
    }
    const int top = p->depth == 1;
    if (p->in_str) {
        if (p->esc)
            p->esc = 0;
        else if (c == '\\')
            p->esc = 1;
        else if (c == '"') {
            p->in_str = 0;
            if (top && p->phase == K_KEY)
                key_end(p, pos);
            else if (top && p->val_kind == 's')
                value_end(p, pos + 1);
        }
        return 0;
    }
    if (top && p->val_kind == 'x' && (c == ',' || c == '}' || is_ws(c)))
        value_end(p, pos);
    switch (c) {
    case '"':
        p->in_str = 1;
        if (top && p->phase == K_KEY)
            p->key_s = pos + 1;
        else if (top && p->phase == K_VALUE)
            value_start(p, pos, 's');
        else if (top && p->phase != K_INVAL)
            return -1;
        break;
    case '{':
    case '[':
        if (top && p->phase == K_VALUE)
            value_start(p, pos, 'c');
        else if (top)
            return -1;
        p->depth++;
        break;
    case '}':
    case ']':
        p->depth--;
        if (p->depth == 1 && p->val_kind == 'c')
            value_end(p, pos + 1);
        if (p->depth == 0)
            return c == '}' ? 1 : -1;
        break;
    case ',':
        if (top)
            p->phase = K_KEY;
        break;
    case ':':
        if (top && p->phase == K_COLON)
            p->phase = K_VALUE;
        else if (top)
            return -1;
        break;
    default:
        if (top && !is_ws(c)) {
            if (p->phase == K_VALUE)
                value_start(p, pos, 'x');
            else if (p->phase != K_INVAL)
                return -1;
        }
        break;
    }
    return 0;
}

/* One byte in a mode that holds text (not M_CONTENT). */
static void held_byte(proto_tool_parser_t *p, char c)
{
    static const char open[] = PROTO_TOOL_CALL_OPEN, close[] = PROTO_TOOL_CALL_CLOSE;
    if (p->mode == M_LEAD && is_ws(c) && p->calls > 0)
        return; /* whitespace between calls is dropped */
    if (px_buf_append(&c, 1, &p->buf) < 0) {
        p->failed = 1;
        return;
    }
    size_t pos = p->buf.n - 1;
    switch (p->mode) {
    case M_LEAD:
        if (is_ws(c))
            return;
        if (c == '<' && p->calls < p->max_calls) {
            p->mode = M_OPEN;
            p->tag = 1;
            return;
        }
        to_content(p, 0);
        return;
    case M_OPEN:
        if (c != open[p->tag]) {
            to_content(p, 0);
            return;
        }
        if (++p->tag == sizeof open - 1) {
            p->mode = M_BODY;
            body_reset(p);
        }
        return;
    case M_BODY: {
        int r = body_byte(p, c, pos);
        if (r == 0)
            return;
        if (p->incremental) {
            if (r > 0 && report_incremental(p) == 0 && p->announced) {
                p->mode = M_CLOSE;
                p->tag = 0;
                p->close_from = pos + 1;
                return;
            }
            /* no call after all; what was reported stays reported */
            to_content(p, p->announced ? p->buf.n : 0);
            return;
        }
        if (r > 0 && report_object(p, pos + 1) == 0) {
            p->mode = M_CLOSE;
            p->tag = 0;
            p->close_from = pos + 1;
            return;
        }
        to_content(p, 0);
        return;
    }
    case M_CLOSE:
        if (p->tag == 0 && is_ws(c))
            return;
        if (c != close[p->tag]) {
            /* the call stands; what follows it is content */
            size_t from = p->close_from;
            while (from < p->buf.n && is_ws(p->buf.p[from]))
                from++;
            to_content(p, from);
            return;
        }
        if (++p->tag == sizeof close - 1) {
            p->buf.n = 0;
            p->mode = M_LEAD;
        }
        return;
    default: return;
    }
}

int proto_tool_parser_feed(proto_tool_parser_t *p, const char *text, size_t len)
{
    if (p->failed)
        return PROTO_ENOMEM;
    size_t i = 0;
    while (i < len && !p->failed) {
        if (p->mode == M_CONTENT) {
            ev(p, PROTO_TOOL_EV_CONTENT, 0, text + i, len - i);
            break;
        }
        held_byte(p, text[i++]);
    }
    if (!p->failed && p->incremental && p->mode == M_BODY && report_incremental(p) < 0)
        to_content(p, 0);
    return p->failed ? PROTO_ENOMEM : 0;
}

int proto_tool_parser_finish(proto_tool_parser_t *p)
{
    if (p->failed)
        return PROTO_ENOMEM;
    switch (p->mode) {
    case M_LEAD:
        if (p->calls == 0)
            to_content(p, 0);
        break;
    case M_OPEN: to_content(p, 0); break;
    case M_BODY:
        /* a call cut short: reported as far as it went, or content */
        to_content(p, p->announced ? p->buf.n : 0);
        break;
    default: break;
    }
    p->buf.n = 0;
    p->mode = M_CONTENT;
    return 0;
}
