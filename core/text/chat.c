/* core/text/chat.c — chat template detection and rendering (formats in chat.h).
 *
 * Rendering runs twice over the same code: once counting bytes, once writing
 * into a buffer of exactly that size, so the limit is checked before anything
 * is allocated and no output ever reallocates.
 */
#include "core/text/chat.h"

#include <stdlib.h>
#include <string.h>

typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role_t;

/* ---------------------------------------------------------------- names */

static const char *const kind_names[] = {"chatml", "llama2", "llama3", "gemma"};

const char *core_chat_kind_name(core_chat_kind_t kind)
{
    if ((unsigned)kind < sizeof kind_names / sizeof kind_names[0])
        return kind_names[kind];
    return "unknown";
}

static void tmpl_clear(core_chat_tmpl_t *t, core_chat_kind_t kind)
{
    t->kind = kind;
    t->fallback = 0;
    t->default_system_len = 0;
    t->default_system[0] = '\0';
}

int core_chat_tmpl_from_name(const char *name, core_chat_tmpl_t *out, core_error_t *err)
{
    for (size_t i = 0; name && i < sizeof kind_names / sizeof kind_names[0]; i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            tmpl_clear(out, (core_chat_kind_t)i);
            return 0;
        }
    }
    return core_error_set(err, CORE_EINVAL,
                          "unknown chat template name '%.64s' (known: chatml, llama2, llama3, gemma)",
                          name ? name : "(null)");
}

/* ---------------------------------------------------------------- detection */

/* Finds '<|im_start|>system\n' TEXT '<|im_end|>' inside one quoted literal
 * (the SmolLM2 / Qwen pattern for a default system prompt). Returns 1 and
 * fills t when found, 0 when not, CORE_ERANGE when TEXT is too long. */
static int find_default_system(const char *text, core_chat_tmpl_t *t, core_error_t *err)
{
    static const char open[] = "<|im_start|>system";
    static const char close[] = "<|im_end|>";
    for (const char *p = strstr(text, open); p; p = strstr(p + 1, open)) {
        if (p == text || (p[-1] != '\'' && p[-1] != '"'))
            continue;
        char quote = p[-1];
        const char *q = p + strlen(open);
        if (*q == '\n')
            q += 1;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *e = strstr(q, close);
        if (!e || e == q)
            continue;
        /* TEXT must be plain literal text: a quote, '+', '{' or '}' means the
         * literal ended and an expression (message['content']) started. */
        size_t span = (size_t)(e - q);
        if (strcspn(q, "'\"+{}") < span)
            continue;
        const char *after = e + strlen(close);
        if (*after == '\n')
            after += 1;
        else if (after[0] == '\\' && after[1] == 'n')
            after += 2;
        if (*after != quote)
            continue;
        size_t n = 0;
        for (const char *c = q; c < e; c++) {
            char ch = *c;
            if (ch == '\\') {
                if (c + 1 < e && c[1] == 'n') {
                    ch = '\n';
                    c++;
                } else {
                    goto next; /* other escapes: not a plain literal we can read */
                }
            }
            if (n >= CORE_CHAT_DEFAULT_SYSTEM_MAX)
                return core_error_set(err, CORE_ERANGE,
                                      "chat template default system prompt is longer than %d bytes",
                                      CORE_CHAT_DEFAULT_SYSTEM_MAX);
            t->default_system[n++] = ch;
        }
        t->default_system_len = n;
        return 1;
    next:;
    }
    return 0;
}

int core_chat_tmpl_detect(const char *text, core_chat_tmpl_t *out, core_error_t *err)
{
    tmpl_clear(out, CORE_CHAT_CHATML);
    if (!text || !*text) {
        out->fallback = 1;
        return 0;
    }
    if (strstr(text, "<|im_start|>")) {
        core_chat_tmpl_t t;
        tmpl_clear(&t, CORE_CHAT_CHATML);
        int rc = find_default_system(text, &t, err);
        if (rc < 0)
            return rc;
        *out = t;
    } else if (strstr(text, "<|start_header_id|>") && strstr(text, "<|eot_id|>")) {
        out->kind = CORE_CHAT_LLAMA3;
    } else if (strstr(text, "<start_of_turn>")) {
        out->kind = CORE_CHAT_GEMMA;
    } else if (strstr(text, "[INST]")) {
        out->kind = CORE_CHAT_LLAMA2;
    } else {
        out->fallback = 1;
    }
    return 0;
}

int core_chat_tmpl_init(const char *override_name, const char *template_text,
                        core_chat_tmpl_t *out, core_error_t *err)
{
    if (override_name && *override_name)
        return core_chat_tmpl_from_name(override_name, out, err);
    return core_chat_tmpl_detect(template_text, out, err);
}

/* ---------------------------------------------------------------- output */

typedef struct sbuf {
    char *p;      /* NULL while counting */
    size_t len;
    size_t max;
    int overflow;
    core_chat_span_t *spans; /* NULL while counting (or not wanted) */
    size_t n_spans;          /* content spans written (or counted) */
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n)
{
    if (b->overflow)
        return;
    if (n > b->max - b->len) {
        b->overflow = 1;
        return;
    }
    if (b->p)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void puts_(sbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Message content: written like any text, and its place recorded. */
static void put_content(sbuf_t *b, const char *s, size_t n)
{
    if (b->overflow || n == 0)
        return;
    size_t off = b->len;
    put(b, s, n);
    if (b->overflow)
        return;
    if (b->spans)
        b->spans[b->n_spans] = (core_chat_span_t){off, n};
    b->n_spans++;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

typedef struct span {
    const char *p;
    size_t n;
} span_t;

static span_t trim(const char *s)
{
    size_t n = strlen(s);
    while (n && is_ws(*s)) {
        s++;
        n--;
    }
    while (n && is_ws(s[n - 1]))
        n--;
    return (span_t){s, n};
}

static size_t rtrim_len(const char *s)
{
    size_t n = strlen(s);
    while (n && is_ws(s[n - 1]))
        n--;
    return n;
}

/* ---------------------------------------------------------------- render */

/* Failures return the constant CORE_EINVAL rather than core_error_set's
 * result: the static analyzer cannot see across files that the two are
 * equal, and would otherwise follow render() over unset roles. */
static int parse_roles(const core_chat_msg_t *msgs, size_t n, role_t *roles_out, core_error_t *err)
{
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r) {
            core_error_set(err, CORE_EINVAL, "messages[%zu].role is missing", i);
            return CORE_EINVAL;
        }
        if (!msgs[i].content) {
            core_error_set(err, CORE_EINVAL, "messages[%zu].content is missing", i);
            return CORE_EINVAL;
        }
        if (strcmp(r, "system") == 0) {
            roles_out[i] = ROLE_SYSTEM;
        } else if (strcmp(r, "user") == 0) {
            roles_out[i] = ROLE_USER;
        } else if (strcmp(r, "assistant") == 0) {
            roles_out[i] = ROLE_ASSISTANT;
        } else {
            core_error_set(err, CORE_EINVAL,
                           "messages[%zu].role '%.64s' is not system, user or assistant", i, r);
            return CORE_EINVAL;
        }
    }
    return 0;
}

static const char *role_name(role_t r)
{
    return r == ROLE_SYSTEM ? "system" : r == ROLE_USER ? "user" : "assistant";
}

/* Pending system text (Llama-2): every system message since the last user
 * turn, joined by "\n\n", written as it is into that turn. Stored as a range
 * of message indices. */
typedef struct pending {
    size_t first, count;
} pending_t;

static void put_pending(sbuf_t *b, const core_chat_msg_t *msgs, const role_t *roles,
                        const pending_t *pd)
{
    size_t k = 0;
    for (size_t i = pd->first; k < pd->count; i++) {
        if (roles[i] != ROLE_SYSTEM)
            continue;
        if (k++)
            puts_(b, "\n\n");
        put_content(b, msgs[i].content, strlen(msgs[i].content));
    }
}

static void put_trimmed(sbuf_t *b, const char *s)
{
    span_t t = trim(s);
    put_content(b, t.p, t.n);
}

/* full: a whole conversation (default system prompt and first-turn rules
 * apply). The caller has validated roles. */
static int render(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, const role_t *roles,
                  size_t n, const core_chat_opts_t *o, int full, sbuf_t *b, core_error_t *err)
{
    int at_start = full; /* nothing written yet in a full render */
    pending_t pd = {0, 0};

    if (!full && o->user_turn_open && t->kind != CORE_CHAT_GEMMA)
        return core_error_set(err, CORE_EINVAL,
                              "an open user turn is continued only in the gemma format, not %s",
                              core_chat_kind_name(t->kind));
    if (!full && o->user_turn_open && o->assistant_turn_open)
        return core_error_set(err, CORE_EINVAL,
                              "a continuation cannot start in an open user and assistant turn");
    if (!full && o->assistant_turn_open) {
        static const char *const close[] = {"<|im_end|>\n", " </s>", "<|eot_id|>",
                                            "<end_of_turn>\n"};
        puts_(b, close[t->kind]);
    }
    if (full && o->add_bos_text) {
        static const char *const bos[] = {"", "<s>", "<|begin_of_text|>", "<bos>"};
        puts_(b, bos[t->kind]);
    }

    switch (t->kind) {
    case CORE_CHAT_CHATML:
        if (full && n > 0 && t->default_system_len > 0 && roles[0] != ROLE_SYSTEM) {
            puts_(b, "<|im_start|>system\n");
            put(b, t->default_system, t->default_system_len);
            puts_(b, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n; i++) {
            puts_(b, "<|im_start|>");
            puts_(b, role_name(roles[i]));
            puts_(b, "\n");
            put_content(b, msgs[i].content, strlen(msgs[i].content));
            puts_(b, "<|im_end|>\n");
        }
        break;
    case CORE_CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            puts_(b, "<|start_header_id|>");
            puts_(b, role_name(roles[i]));
            puts_(b, "<|end_header_id|>\n\n");
            put_trimmed(b, msgs[i].content);
            puts_(b, "<|eot_id|>");
        }
        break;
    case CORE_CHAT_GEMMA: {
        /* System text is written where it comes, opening a user turn that
         * the next user message continues (rather than held back for it):
         * so a session can hold it alone and continue it later. */
        int user_open = !full && o->user_turn_open;
        for (size_t i = 0; i < n; i++) {
            if (roles[i] != ROLE_ASSISTANT && user_open) {
                puts_(b, "\n\n");
            } else if (roles[i] != ROLE_ASSISTANT) {
                puts_(b, "<start_of_turn>user\n");
            } else {
                if (user_open)
                    puts_(b, "<end_of_turn>\n");
                puts_(b, "<start_of_turn>model\n");
            }
            put_trimmed(b, msgs[i].content);
            user_open = roles[i] == ROLE_SYSTEM;
            if (!user_open)
                puts_(b, "<end_of_turn>\n");
        }
        if (user_open && o->add_generation_prompt)
            puts_(b, "<end_of_turn>\n");
        break;
    }
    case CORE_CHAT_LLAMA2:
        for (size_t i = 0; i < n; i++) {
            if (roles[i] == ROLE_SYSTEM) {
                if (!pd.count)
                    pd.first = i;
                pd.count++;
                continue;
            }
            if (roles[i] == ROLE_ASSISTANT) {
                puts_(b, " ");
                put_trimmed(b, msgs[i].content);
                puts_(b, " </s>");
                at_start = 0;
                continue;
            }
            if (!at_start)
                puts_(b, "<s>");
            at_start = 0;
            puts_(b, "[INST] ");
            if (pd.count) {
                /* strip() of "<<SYS>>\n" S "\n<</SYS>>\n\n" content: the front
                 * is not whitespace, the back is content's; an all-blank
                 * content strips back to "<</SYS>>". */
                puts_(b, "<<SYS>>\n");
                put_pending(b, msgs, roles, &pd);
                puts_(b, "\n<</SYS>>");
                size_t cl = rtrim_len(msgs[i].content);
                if (cl) {
                    puts_(b, "\n\n");
                    put_content(b, msgs[i].content, cl);
                }
                pd.count = 0;
            } else {
                put_trimmed(b, msgs[i].content);
            }
            puts_(b, " [/INST]");
        }
        break;
    default:
        return core_error_set(err, CORE_EINVAL, "chat template kind %d is not known", (int)t->kind);
    }
    if (pd.count)
        return core_error_set(err, CORE_EINVAL,
                              "messages[%zu]: a system message must be followed by a user message "
                              "in the %s format",
                              pd.first, core_chat_kind_name(t->kind));
    if (o->add_generation_prompt) {
        static const char *const gen[] = {"<|im_start|>assistant\n", "",
                                          "<|start_header_id|>assistant<|end_header_id|>\n\n",
                                          "<start_of_turn>model\n"};
        puts_(b, gen[t->kind]);
    }
    return 0;
}

core_chat_open_t core_chat_render_leaves_open(const core_chat_tmpl_t *t,
                                              const core_chat_msg_t *msgs, size_t n,
                                              const core_chat_opts_t *opts)
{
    if (!t || t->kind != CORE_CHAT_GEMMA || (opts && opts->add_generation_prompt))
        return CORE_CHAT_OPEN_NONE;
    if (n == 0)
        return opts && opts->user_turn_open ? CORE_CHAT_OPEN_USER : CORE_CHAT_OPEN_NONE;
    const char *r = msgs ? msgs[n - 1].role : NULL;
    return r && strcmp(r, "system") == 0 ? CORE_CHAT_OPEN_USER : CORE_CHAT_OPEN_NONE;
}

static int render_alloc(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                        const core_chat_opts_t *opts, int full, size_t max_bytes, char **out,
                        size_t *out_len, core_chat_span_t **spans, size_t *n_spans,
                        core_error_t *err)
{
    static const core_chat_opts_t zero_opts;
    const core_chat_opts_t *o = opts ? opts : &zero_opts;
    role_t *roles = NULL;
    char *p = NULL;
    core_chat_span_t *sp = NULL;
    int rc;

    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (spans)
        *spans = NULL;
    if (n_spans)
        *n_spans = 0;
    if (!t)
        return core_error_set(err, CORE_EINVAL, "chat template is NULL");
    if (n && !msgs)
        return core_error_set(err, CORE_EINVAL, "messages are NULL");
    if ((unsigned)t->kind >= sizeof kind_names / sizeof kind_names[0])
        return core_error_set(err, CORE_EINVAL, "chat template kind %d is not known", (int)t->kind);
    /* Every message writes at least one byte (its markers, or the "\n\n"
     * that joins system text), so this bounds the roles allocation without
     * refusing anything that could fit. */
    size_t limit = max_bytes < CORE_CHAT_MAX_OUTPUT ? max_bytes : CORE_CHAT_MAX_OUTPUT;
    if (n > limit)
        return core_error_set(err, CORE_ERANGE, "%zu messages cannot fit in %zu bytes", n, limit);
    roles = malloc((n ? n : 1) * sizeof *roles);
    if (!roles)
        return core_error_set(err, CORE_ENOMEM, "roles of %zu messages", n);
    if ((rc = parse_roles(msgs, n, roles, err)) != 0)
        goto fail;

    sbuf_t count = {NULL, 0, limit, 0, NULL, 0};
    if ((rc = render(t, msgs, roles, n, o, full, &count, err)) != 0)
        goto fail;
    if (count.overflow) {
        rc = core_error_set(err, CORE_ERANGE, "rendered chat prompt is longer than %zu bytes",
                            limit);
        goto fail;
    }
    p = malloc(count.len + 1);
    if (!p) {
        rc = core_error_set(err, CORE_ENOMEM, "chat prompt of %zu bytes", count.len);
        goto fail;
    }
    if (spans && !(sp = malloc((count.n_spans ? count.n_spans : 1) * sizeof *sp))) {
        rc = core_error_set(err, CORE_ENOMEM, "%zu content spans", count.n_spans);
        goto fail;
    }
    sbuf_t wr = {p, 0, count.len, 0, sp, 0};
    if ((rc = render(t, msgs, roles, n, o, full, &wr, err)) != 0)
        goto fail;
    p[wr.len] = '\0';
    free(roles);
    *out = p;
    if (out_len)
        *out_len = wr.len;
    if (spans)
        *spans = sp;
    if (n_spans)
        *n_spans = wr.n_spans;
    return 0;
fail:
    free(roles);
    free(p);
    free(sp);
    return rc;
}

int core_chat_render(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                     const core_chat_opts_t *opts, size_t max_bytes, char **out, size_t *out_len,
                     core_error_t *err)
{
    return render_alloc(t, msgs, n, opts, 1, max_bytes, out, out_len, NULL, NULL, err);
}

int core_chat_render_continue(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                              const core_chat_opts_t *opts, size_t max_bytes, char **out,
                              size_t *out_len, core_error_t *err)
{
    return render_alloc(t, msgs, n, opts, 0, max_bytes, out, out_len, NULL, NULL, err);
}

int core_chat_render_spans(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                           const core_chat_opts_t *opts, int cont, size_t max_bytes, char **out,
                           size_t *out_len, core_chat_span_t **spans, size_t *n_spans,
                           core_error_t *err)
{
    if (!spans || !n_spans)
        return core_error_set(err, CORE_EINVAL, "spans and n_spans are required");
    return render_alloc(t, msgs, n, opts, !cont, max_bytes, out, out_len, spans, n_spans, err);
}
