/* core/text/chat.h — chat templates: a list of {role, content} messages to prompt text.
 *
 * darkserve does not run Jinja. It recognizes the common template families
 * from marker substrings of the model's `tokenizer.chat_template` (as
 * llama.cpp does) and renders them in C. The output is text; turning special
 * markers ("<|im_start|>", "<s>") into special tokens, and whether a BOS token
 * goes in front, is the tokenizer's business.
 *
 * Formats (role names are system / user / assistant; anything else is
 * CORE_EINVAL naming the role; content is a NUL-terminated string):
 *
 *   ChatML (CORE_CHAT_CHATML), SmolLM2, Qwen, ...
 *     each message: "<|im_start|>" role "\n" content "<|im_end|>\n"
 *     generation prompt: "<|im_start|>assistant\n"
 *     Content is copied verbatim. If the template text carries a default
 *     system prompt (SmolLM2: "You are a helpful AI assistant named SmolLM,
 *     trained by Hugging Face"), a full render of a non-empty conversation
 *     whose first message is not a system message starts with
 *     "<|im_start|>system\n" default "<|im_end|>\n" — what SmolLM2's Jinja
 *     template does.
 *   Llama-3 (CORE_CHAT_LLAMA3)
 *     BOS text "<|begin_of_text|>"
 *     each message: "<|start_header_id|>" role "<|end_header_id|>\n\n"
 *                   trim(content) "<|eot_id|>"
 *     generation prompt: "<|start_header_id|>assistant<|end_header_id|>\n\n"
 *   Gemma (CORE_CHAT_GEMMA) — no system role: system text opens a user turn
 *     BOS text "<bos>"
 *     system: "<start_of_turn>user\n" trim(content), the turn left open; a
 *             system message in a user turn already open adds
 *             "\n\n" trim(content)
 *     user: in an open turn "\n\n" trim(content) "<end_of_turn>\n", else
 *           "<start_of_turn>user\n" trim(content) "<end_of_turn>\n"
 *     assistant: an open user turn is closed ("<end_of_turn>\n"), then
 *                "<start_of_turn>model\n" trim(content) "<end_of_turn>\n"
 *     generation prompt: an open user turn is closed, then
 *                        "<start_of_turn>model\n"
 *     So [system S, user U] is "<start_of_turn>user\nS\n\nU<end_of_turn>\n"
 *     (Gemma's own template and llama.cpp agree), several system messages
 *     join with "\n\n", and a conversation of system messages alone is a
 *     user turn of that text: with the generation prompt the model answers
 *     it; without one (a session's opening) the turn stays open for the next
 *     user message (core_chat_render_leaves_open, opts.user_turn_open).
 *     System text that an assistant message follows is a user turn of its
 *     own, kept in the place the messages give it (llama.cpp instead moves
 *     it into the next user turn; a session that already holds it cannot).
 *   Llama-2 (CORE_CHAT_LLAMA2), Meta's [INST] format
 *     BOS text "<s>"
 *     user: "<s>" "[INST] " X " [/INST]", X = trim(content), or with pending
 *           system text S: strip("<<SYS>>\n" S "\n<</SYS>>\n\n" content)
 *           (S joined as for Gemma, not trimmed). The "<s>" is left out when
 *           the turn is the very first text of a full render: that one is the
 *           BOS, which add_bos_text (or the tokenizer) provides.
 *     assistant: " " trim(content) " </s>"
 *     generation prompt: "" (the answer's leading space is the model's).
 *   For Llama-2 a system message that no user message follows is
 *   CORE_EINVAL. trim() strips ASCII whitespace, as the reference templates'
 *   trim/strip do on ASCII text.
 *
 * Stateful sessions (core_chat_render_continue): a session that already holds
 * a conversation needs only the text that extends it. Two starting points:
 *   assistant_turn_open = 1: the session ends inside an assistant turn — the
 *     prompt was rendered with the generation prompt and the generated tokens
 *     followed, without the end-of-turn token that stopped generation (a
 *     sampled stop token is not fed back). The continuation first closes that
 *     turn: "<|im_end|>\n" (ChatML), "<|eot_id|>" (Llama-3),
 *     "<end_of_turn>\n" (Gemma), " </s>" (Llama-2).
 *   user_turn_open = 1 (Gemma only): the session ends inside a user turn
 *     that holds system text (a render that core_chat_render_leaves_open
 *     called CORE_CHAT_OPEN_USER). The new messages continue that turn as
 *     they would have in one render.
 *   both 0: the session ends right after a closed turn (a previous
 *     continuation or full render without generation prompt).
 * Then come the new messages, rendered as they would be in the middle of a
 * conversation (no default system prompt, no BOS, Llama-2 "<s>" before every
 * user turn), and the generation prompt if asked for. Guarantee (tested):
 *   render(old + [assistant: A] + new) ==
 *       render(old, gen prompt) + A' + render_continue(new, open = 1)
 * where A' is A as the template writes an assistant body (ChatML: A;
 * Llama-3, Gemma: trim(A); Llama-2: " " trim(A)), and
 *   render(old + new) == render(old) + render_continue(new, open = 0)
 * when old ends with a user or assistant message, and for Gemma
 *   render(old + new) == render(old) + render_continue(new, user open = 1)
 * when old ends with a system message. An empty session is rendered with
 * core_chat_render.
 */
#ifndef DARKSERVE_CORE_CHAT_H
#define DARKSERVE_CORE_CHAT_H

#include <stddef.h>

#include "core/err.h"

#define CORE_CHAT_DEFAULT_SYSTEM_MAX 2048 /* bytes of a template's default system prompt */
#define CORE_CHAT_MAX_OUTPUT (64u << 20)  /* hard cap on any render, whatever max_bytes says */

typedef enum core_chat_kind {
    CORE_CHAT_CHATML = 0,
    CORE_CHAT_LLAMA2 = 1,
    CORE_CHAT_LLAMA3 = 2,
    CORE_CHAT_GEMMA = 3
} core_chat_kind_t;

/* A plain value: copy it freely, nothing to free. */
typedef struct core_chat_tmpl {
    core_chat_kind_t kind;
    int fallback;           /* 1: the template text matched no known family
                               (or was empty) and ChatML was chosen */
    size_t default_system_len;                      /* 0: none */
    char default_system[CORE_CHAT_DEFAULT_SYSTEM_MAX]; /* not NUL-terminated */
} core_chat_tmpl_t;

typedef struct core_chat_msg {
    const char *role;    /* "system", "user" or "assistant" (borrowed) */
    const char *content; /* borrowed, NUL-terminated */
} core_chat_msg_t;

typedef struct core_chat_opts {
    int add_generation_prompt; /* end with the opening of an assistant turn */
    int add_bos_text;          /* full render only: start with the format's BOS
                                  text (none for ChatML); leave 0 when the
                                  tokenizer adds BOS itself */
    int assistant_turn_open;   /* continuation only: see the header comment */
    int user_turn_open;        /* continuation only, Gemma only: see the header
                                  comment (not with assistant_turn_open) */
} core_chat_opts_t;

/* The turn a render leaves open at its end. */
typedef enum core_chat_open {
    CORE_CHAT_OPEN_NONE = 0,      /* closed (or the generation prompt's turn,
                                     which the caller tracks as it generates) */
    CORE_CHAT_OPEN_ASSISTANT = 1, /* (the caller's, after generation) */
    CORE_CHAT_OPEN_USER = 2       /* a Gemma user turn holding system text */
} core_chat_open_t;

/* "chatml", "llama2", "llama3", "gemma". */
const char *core_chat_kind_name(core_chat_kind_t kind);

/* Template from a name (one of the above; no default system prompt).
 * An unknown or NULL name is CORE_EINVAL listing the known names. */
int core_chat_tmpl_from_name(const char *name, core_chat_tmpl_t *out, core_error_t *err);

/* Template from the Jinja text of `tokenizer.chat_template` (borrowed; NULL or
 * "" allowed). Markers, first match wins:
 *   "<|im_start|>"                          -> ChatML (+ default system prompt,
 *                                              see below)
 *   "<|start_header_id|>" and "<|eot_id|>"  -> Llama-3
 *   "<start_of_turn>"                       -> Gemma
 *   "[INST]"                                -> Llama-2
 *   none                                    -> ChatML with out->fallback = 1
 * Default system prompt: a string literal '<|im_start|>system\n' TEXT
 * '<|im_end|>' with no Jinja syntax or quotes in TEXT ("\n" escapes are
 * decoded). CORE_ERANGE if TEXT is longer than CORE_CHAT_DEFAULT_SYSTEM_MAX. */
int core_chat_tmpl_detect(const char *template_text, core_chat_tmpl_t *out, core_error_t *err);

/* The server's rule: a non-empty override name wins, else detection. */
int core_chat_tmpl_init(const char *override_name, const char *template_text,
                        core_chat_tmpl_t *out, core_error_t *err);

/* Renders msgs[n] (borrowed) as a whole conversation. On success *out is a
 * NUL-terminated malloc'd string owned by the caller (free()), *out_len its
 * length (out_len may be NULL). Output longer than max_bytes (or
 * CORE_CHAT_MAX_OUTPUT) is CORE_ERANGE and *out stays NULL. opts may be NULL
 * (all zero). */
int core_chat_render(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                     const core_chat_opts_t *opts, size_t max_bytes, char **out, size_t *out_len,
                     core_error_t *err);

/* Renders only the text that extends a session's conversation with msgs[n]
 * (see the header comment). Same ownership and limits as core_chat_render;
 * add_bos_text is ignored. */
int core_chat_render_continue(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                              const core_chat_opts_t *opts, size_t max_bytes, char **out,
                              size_t *out_len, core_error_t *err);

/* The turn that a successful render (full or continuation, with opts) of
 * msgs[n] leaves open: CORE_CHAT_OPEN_USER for Gemma when no generation
 * prompt is asked and the last message is a system message (or n is 0 and
 * opts->user_turn_open), else CORE_CHAT_OPEN_NONE. Roles are read as the
 * render reads them (an unknown one: CORE_CHAT_OPEN_NONE, the render refuses
 * it). A session stores the result and passes it back as user_turn_open. */
core_chat_open_t core_chat_render_leaves_open(const core_chat_tmpl_t *t,
                                              const core_chat_msg_t *msgs, size_t n,
                                              const core_chat_opts_t *opts);

/* A byte range [off, off + len) of a rendered prompt. */
typedef struct core_chat_span {
    size_t off, len;
} core_chat_span_t;

/* core_chat_render (cont = 0) or core_chat_render_continue (cont = 1), and
 * where the message contents landed: *spans (malloc'd, caller frees, also
 * when *n_spans is 0) lists, in order and without overlap, every byte range
 * of *out copied from a message's content; everything else is the
 * template's. The server tokenizes the template's markers as special tokens
 * and the contents as plain text (core_tokenizer_encode_plain_alloc), so a
 * message cannot forge a turn marker. spans and n_spans are required. */
int core_chat_render_spans(const core_chat_tmpl_t *t, const core_chat_msg_t *msgs, size_t n,
                           const core_chat_opts_t *opts, int cont, size_t max_bytes, char **out,
                           size_t *out_len, core_chat_span_t **spans, size_t *n_spans,
                           core_error_t *err);

#endif
