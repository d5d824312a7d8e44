/* tests/unit/test_core_chat.c — chat template detection and rendering.
 *
 * Expected strings are written by hand from each format's definition (Meta's
 * Llama-2 / Llama-3 prompt formats, Gemma's turn format, ChatML); the ChatML
 * render is also compared with SmolLM2's own Jinja template by
 * tests/reference/test_chat_oracle.py.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/chat.h"
#include "core/rng.h"
#include "tests/unit/check.h"

#define MAXB 65536

/* SmolLM2-135M-Instruct's tokenizer.chat_template, as stored in its GGUF. */
static const char smollm2_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char smollm2_default[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

static char *render(const core_chat_tmpl_t *t, const core_chat_msg_t *m, size_t n, int gen,
                    int bos)
{
    core_chat_opts_t o = {gen, bos, 0, 0};
    char *out = NULL;
    core_error_t e = {0};
    int rc = core_chat_render(t, m, n, &o, MAXB, &out, NULL, &e);
    CHECK_MSG(rc == 0, "render: %s", e.msg);
    return out;
}

static char *render_cont(const core_chat_tmpl_t *t, const core_chat_msg_t *m, size_t n, int gen,
                         int open)
{
    core_chat_opts_t o = {gen, 0, open, 0};
    char *out = NULL;
    core_error_t e = {0};
    int rc = core_chat_render_continue(t, m, n, &o, MAXB, &out, NULL, &e);
    CHECK_MSG(rc == 0, "render_continue: %s", e.msg);
    return out;
}

static core_chat_tmpl_t named(const char *name)
{
    core_chat_tmpl_t t;
    CHECK_INT_EQ(core_chat_tmpl_from_name(name, &t, NULL), 0);
    return t;
}

#define EXPECT_RENDER(t, msgs, n, gen, bos, want)                                  \
    do {                                                                           \
        char *got_ = render(&(t), (msgs), (n), (gen), (bos));                      \
        CHECK_STR_EQ(got_, (want));                                                \
        free(got_);                                                                \
    } while (0)

static const core_chat_msg_t conv4[] = {
    {"system", "You are terse."},
    {"user", "Hi there"},
    {"assistant", "Hello!"},
    {"user", "What is 2+2?"},
};

TEST(test_chatml)
{
    core_chat_tmpl_t t = named("chatml");
    EXPECT_RENDER(t, conv4, 4, 1, 0,
                  "<|im_start|>system\nYou are terse.<|im_end|>\n"
                  "<|im_start|>user\nHi there<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* No generation prompt; BOS text does not exist in ChatML. */
    EXPECT_RENDER(t, conv4 + 1, 1, 0, 1, "<|im_start|>user\nHi there<|im_end|>\n");
    /* Content is verbatim: no trimming. */
    static const core_chat_msg_t ws[] = {{"user", "  spaced \n"}};
    EXPECT_RENDER(t, ws, 1, 0, 0, "<|im_start|>user\n  spaced \n<|im_end|>\n");
    /* The name gives no default system prompt. */
    EXPECT_RENDER(t, conv4 + 1, 1, 1, 0,
                  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_RENDER(t, NULL, 0, 1, 0, "<|im_start|>assistant\n");
    EXPECT_RENDER(t, NULL, 0, 0, 0, "");
}

TEST(test_chatml_smollm2_default_system)
{
    core_chat_tmpl_t t;
    CHECK_INT_EQ(core_chat_tmpl_detect(smollm2_template, &t, NULL), 0);
    CHECK_INT_EQ(t.kind, CORE_CHAT_CHATML);
    CHECK_INT_EQ(t.fallback, 0);
    CHECK_INT_EQ(t.default_system_len, strlen(smollm2_default));
    CHECK(memcmp(t.default_system, smollm2_default, t.default_system_len) == 0);
    /* First message not system: the default goes first. */
    EXPECT_RENDER(t, conv4 + 1, 3, 1, 0,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nHi there<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* An explicit system message replaces it. */
    EXPECT_RENDER(t, conv4, 2, 0, 0,
                  "<|im_start|>system\nYou are terse.<|im_end|>\n"
                  "<|im_start|>user\nHi there<|im_end|>\n");
    /* A first assistant message still gets it; an empty list does not (the
     * Jinja loop never runs). */
    EXPECT_RENDER(t, conv4 + 2, 1, 0, 0,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n");
    EXPECT_RENDER(t, NULL, 0, 1, 0, "<|im_start|>assistant\n");
    /* A later system message does not suppress it (only messages[0] counts). */
    static const core_chat_msg_t late[] = {{"user", "a"}, {"system", "b"}};
    EXPECT_RENDER(t, late, 2, 0, 0,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\na<|im_end|>\n"
                  "<|im_start|>system\nb<|im_end|>\n");
}

TEST(test_llama3)
{
    core_chat_tmpl_t t = named("llama3");
    static const core_chat_msg_t m[] = {
        {"system", " You are terse. "},
        {"user", "Hi there\n"},
        {"assistant", "Hello!"},
        {"user", "\tWhat is 2+2?"},
    };
    EXPECT_RENDER(t, m, 4, 1, 1,
                  "<|begin_of_text|>"
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_RENDER(t, m + 1, 1, 0, 0,
                  "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>");
}

TEST(test_gemma)
{
    core_chat_tmpl_t t = named("gemma");
    EXPECT_RENDER(t, conv4, 4, 1, 1,
                  "<bos>"
                  "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
                  "<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
                  "<start_of_turn>model\n");
    /* Several system messages join; trimming applies to each part. */
    static const core_chat_msg_t two[] = {{"system", "A"}, {"system", " B "}, {"user", " u "}};
    EXPECT_RENDER(t, two, 3, 0, 0, "<start_of_turn>user\nA\n\nB\n\nu<end_of_turn>\n");
    /* System text that an assistant message follows is a user turn of its
     * own, where the messages put it. */
    static const core_chat_msg_t before_a[] = {{"system", "S"}, {"assistant", "a"}, {"user", "u"}};
    EXPECT_RENDER(t, before_a, 3, 0, 0,
                  "<start_of_turn>user\nS<end_of_turn>\n"
                  "<start_of_turn>model\na<end_of_turn>\n"
                  "<start_of_turn>user\nu<end_of_turn>\n");
    /* System text alone: a user turn of that text, which the generation
     * prompt closes and which is otherwise left open. */
    static const core_chat_msg_t alone[] = {{"system", " Be brief. "}, {"system", "S2"}};
    EXPECT_RENDER(t, alone, 1, 1, 1,
                  "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n");
    EXPECT_RENDER(t, alone, 1, 0, 0, "<start_of_turn>user\nBe brief.");
    EXPECT_RENDER(t, alone, 2, 0, 0, "<start_of_turn>user\nBe brief.\n\nS2");
    EXPECT_RENDER(t, alone, 2, 1, 0,
                  "<start_of_turn>user\nBe brief.\n\nS2<end_of_turn>\n<start_of_turn>model\n");
    /* ... also after a closed turn */
    static const core_chat_msg_t late[] = {{"user", "u"}, {"system", "S"}};
    EXPECT_RENDER(t, late, 2, 0, 0,
                  "<start_of_turn>user\nu<end_of_turn>\n<start_of_turn>user\nS");
    EXPECT_RENDER(t, late, 2, 1, 0,
                  "<start_of_turn>user\nu<end_of_turn>\n<start_of_turn>user\nS<end_of_turn>\n"
                  "<start_of_turn>model\n");
}

/* What a render leaves open, and continuing a user turn that holds system
 * text (a Gemma session created with a system message alone). */
TEST(test_gemma_open_user_turn)
{
    core_chat_tmpl_t g = named("gemma"), l2 = named("llama2"), l3 = named("llama3"),
                     cm = named("chatml");
    static const core_chat_msg_t sys[] = {{"system", "S"}};
    static const core_chat_msg_t usr[] = {{"user", "u"}};
    core_chat_opts_t none = {0, 0, 0, 0}, gen = {1, 0, 0, 0}, uopen = {0, 0, 0, 1},
                     uopen_gen = {1, 0, 0, 1};
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, sys, 1, &none), CORE_CHAT_OPEN_USER);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, sys, 1, NULL), CORE_CHAT_OPEN_USER);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, sys, 1, &gen), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, usr, 1, &uopen), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, NULL, 0, &uopen), CORE_CHAT_OPEN_USER);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, NULL, 0, &uopen_gen), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&g, NULL, 0, &none), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&cm, sys, 1, &none), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&l3, sys, 1, &none), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(&l2, sys, 1, &none), CORE_CHAT_OPEN_NONE);
    CHECK_INT_EQ(core_chat_render_leaves_open(NULL, sys, 1, &none), CORE_CHAT_OPEN_NONE);

    /* The continuations, by hand. */
    static const struct {
        core_chat_msg_t m[2];
        size_t n;
        int gen;
        const char *want;
    } cases[] = {
        {{{"user", " u "}}, 1, 1, "\n\nu<end_of_turn>\n<start_of_turn>model\n"},
        {{{"user", "u"}}, 1, 0, "\n\nu<end_of_turn>\n"},
        {{{"system", "S2"}, {"user", "u"}}, 2, 0, "\n\nS2\n\nu<end_of_turn>\n"},
        {{{"system", "S2"}}, 1, 0, "\n\nS2"},
        {{{"assistant", "a"}}, 1, 0, "<end_of_turn>\n<start_of_turn>model\na<end_of_turn>\n"},
        {{{"user", "u"}}, 0, 1, "<end_of_turn>\n<start_of_turn>model\n"},
        {{{"user", "u"}}, 0, 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_chat_opts_t o = {cases[i].gen, 0, 0, 1};
        char *out = NULL;
        core_error_t e = {0};
        CHECK_INT_EQ(core_chat_render_continue(&g, cases[i].m, cases[i].n, &o, MAXB, &out, NULL, &e),
                     0);
        CHECK_MSG(out && strcmp(out, cases[i].want) == 0, "case %zu: '%s'", i, out ? out : "");
        free(out);
    }
    /* The session's parts add up to the whole conversation. */
    static const core_chat_msg_t whole[] = {{"system", "S"}, {"system", "T"}, {"user", "u"}};
    char *a = render(&g, whole, 1, 0, 0), *b = NULL;
    core_chat_opts_t o = {1, 0, 0, 1};
    CHECK_INT_EQ(core_chat_render_continue(&g, whole + 1, 2, &o, MAXB, &b, NULL, NULL), 0);
    char *full = render(&g, whole, 3, 1, 0);
    char joined[256];
    snprintf(joined, sizeof joined, "%s%s", a ? a : "", b ? b : "");
    CHECK_STR_EQ(joined, full);
    free(a);
    free(b);
    free(full);

    /* Refusals: no other format has such a turn; not both turns open. */
    char *out = NULL;
    core_error_t e = {0};
    CHECK_INT_EQ(core_chat_render_continue(&cm, usr, 1, &uopen, MAXB, &out, NULL, &e),
                 CORE_EINVAL);
    CHECK(out == NULL && strstr(e.msg, "gemma") && strstr(e.msg, "chatml"));
    core_chat_opts_t both = {0, 0, 1, 1};
    CHECK_INT_EQ(core_chat_render_continue(&g, usr, 1, &both, MAXB, &out, NULL, &e), CORE_EINVAL);
    CHECK(out == NULL && strstr(e.msg, "open user and assistant"));
    /* a full render ignores user_turn_open, as it does assistant_turn_open */
    CHECK_INT_EQ(core_chat_render(&g, usr, 1, &uopen, MAXB, &out, NULL, &e), 0);
    CHECK_STR_EQ(out, "<start_of_turn>user\nu<end_of_turn>\n");
    free(out);
    /* Llama-2 keeps refusing system text that no user message follows. */
    out = NULL;
    CHECK_INT_EQ(core_chat_render(&l2, sys, 1, &gen, MAXB, &out, NULL, &e), CORE_EINVAL);
    CHECK(out == NULL && strstr(e.msg, "messages[0]") && strstr(e.msg, "llama2"));
}

TEST(test_llama2)
{
    core_chat_tmpl_t t = named("llama2");
    /* Meta's format: <s>[INST] <<SYS>>\n{s}\n<</SYS>>\n\n{u} [/INST] {a} </s><s>[INST] {u} [/INST] */
    EXPECT_RENDER(t, conv4, 4, 1, 0,
                  "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
                  "<s>[INST] What is 2+2? [/INST]");
    EXPECT_RENDER(t, conv4, 4, 0, 1,
                  "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
                  "<s>[INST] What is 2+2? [/INST]");
    /* strip() of the whole first turn: user's leading blanks stay after the
     * system block, trailing ones go; a blank user message strips back to
     * the block's end. */
    static const core_chat_msg_t ws[] = {{"system", " S "}, {"user", "  u \n"}};
    EXPECT_RENDER(t, ws, 2, 0, 0, "[INST] <<SYS>>\n S \n<</SYS>>\n\n  u [/INST]");
    static const core_chat_msg_t blank[] = {{"system", "S"}, {"user", " \n"}};
    EXPECT_RENDER(t, blank, 2, 0, 0, "[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
    static const core_chat_msg_t plain[] = {{"user", " u1 "}, {"assistant", " a1 "},
                                            {"user", "u2"}};
    EXPECT_RENDER(t, plain, 3, 0, 0, "[INST] u1 [/INST] a1 </s><s>[INST] u2 [/INST]");
    /* An assistant first: the user turn after it needs its <s>. */
    EXPECT_RENDER(t, plain + 1, 2, 0, 0, " a1 </s><s>[INST] u2 [/INST]");
}

TEST(test_unknown_role_and_bad_input)
{
    core_chat_tmpl_t t = named("chatml");
    static const core_chat_msg_t tool[] = {{"user", "u"}, {"tool", "x"}};
    char *out = NULL;
    core_error_t e = {0};
    for (int k = 0; k < 4; k++) {
        t.kind = (core_chat_kind_t)k;
        CHECK_INT_EQ(core_chat_render(&t, tool, 2, NULL, MAXB, &out, NULL, &e), CORE_EINVAL);
        CHECK(out == NULL);
        CHECK_MSG(strstr(e.msg, "messages[1]") && strstr(e.msg, "'tool'"), "%s", e.msg);
        CHECK_INT_EQ(core_chat_render_continue(&t, tool, 2, NULL, MAXB, &out, NULL, &e),
                     CORE_EINVAL);
    }
    static const core_chat_msg_t caps[] = {{"User", "u"}};
    CHECK_INT_EQ(core_chat_render(&t, caps, 1, NULL, MAXB, &out, NULL, &e), CORE_EINVAL);
    static const core_chat_msg_t nocontent[] = {{"user", NULL}};
    CHECK_INT_EQ(core_chat_render(&t, nocontent, 1, NULL, MAXB, &out, NULL, &e), CORE_EINVAL);
    CHECK(strstr(e.msg, "content") != NULL);
    static const core_chat_msg_t norole[] = {{NULL, "x"}};
    CHECK_INT_EQ(core_chat_render(&t, norole, 1, NULL, MAXB, &out, NULL, &e), CORE_EINVAL);
    t.kind = (core_chat_kind_t)7;
    CHECK_INT_EQ(core_chat_render(&t, conv4, 1, NULL, MAXB, &out, NULL, &e), CORE_EINVAL);
}

TEST(test_output_bound)
{
    core_chat_tmpl_t t = named("chatml");
    char *out = NULL;
    size_t len = 0;
    core_error_t e = {0};
    CHECK_INT_EQ(core_chat_render(&t, conv4, 4, NULL, MAXB, &out, &len, &e), 0);
    CHECK_INT_EQ(len, strlen(out));
    free(out);
    out = NULL;
    size_t exact = len;
    CHECK_INT_EQ(core_chat_render(&t, conv4, 4, NULL, exact, &out, &len, &e), 0);
    CHECK(out != NULL);
    free(out);
    out = NULL;
    CHECK_INT_EQ(core_chat_render(&t, conv4, 4, NULL, exact - 1, &out, &len, &e), CORE_ERANGE);
    CHECK(out == NULL && len == 0);
    CHECK_INT_EQ(core_chat_render(&t, conv4, 4, NULL, 0, &out, &len, &e), CORE_ERANGE);
    /* More messages than bytes are refused before anything is allocated. */
    CHECK_INT_EQ(core_chat_render(&t, conv4, 4, NULL, 3, &out, &len, &e), CORE_ERANGE);
}

TEST(test_detection)
{
    struct dcase {
        const char *text;
        core_chat_kind_t kind;
        int fallback;
        const char *default_system;
    };
    static const struct dcase cases[] = {
        /* Plain ChatML (no default system prompt). */
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<|im_start|>assistant\\n' }}{% endif %}",
         CORE_CHAT_CHATML, 0, NULL},
        /* Qwen-style: default system prompt written with \n escapes. */
        {"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
         "'\\n'}}{% endfor %}",
         CORE_CHAT_CHATML, 0, "You are a helpful assistant."},
        /* System rendered from content, not a literal: no default. */
        {"{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + "
         "messages[0]['content'] + '<|im_end|>\\n' }}{% endif %}",
         CORE_CHAT_CHATML, 0, NULL},
        /* Llama-3 Instruct. */
        {"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
         "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
         "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
         "bos_token + content %}{% endif %}{{ content }}{% endfor %}",
         CORE_CHAT_LLAMA3, 0, NULL},
        /* Gemma. */
        {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}"
         "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
         CORE_CHAT_GEMMA, 0, NULL},
        /* Llama-2 chat. */
        {"{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
         "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + "
         "' ' + eos_token }}{% endif %}",
         CORE_CHAT_LLAMA2, 0, NULL},
        /* Unknown families fall back to ChatML and say so. */
        {"{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
         CORE_CHAT_CHATML, 1, NULL},
        {"", CORE_CHAT_CHATML, 1, NULL},
        {NULL, CORE_CHAT_CHATML, 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_chat_tmpl_t t;
        memset(&t, 0x5a, sizeof t);
        core_error_t e = {0};
        CHECK_MSG(core_chat_tmpl_detect(cases[i].text, &t, &e) == 0, "case %zu: %s", i, e.msg);
        CHECK_MSG(t.kind == cases[i].kind && t.fallback == cases[i].fallback,
                  "case %zu: kind %d fallback %d", i, (int)t.kind, t.fallback);
        const char *ds = cases[i].default_system;
        CHECK_MSG(t.default_system_len == (ds ? strlen(ds) : 0) &&
                      (!ds || memcmp(t.default_system, ds, strlen(ds)) == 0),
                  "case %zu: default system '%.*s'", i, (int)t.default_system_len,
                  t.default_system);
    }
    /* The real SmolLM2 text was checked in test_chatml_smollm2_default_system. */
}

TEST(test_names)
{
    static const char *const names[] = {"chatml", "llama2", "llama3", "gemma"};
    for (int k = 0; k < 4; k++) {
        core_chat_tmpl_t t;
        CHECK_INT_EQ(core_chat_tmpl_from_name(names[k], &t, NULL), 0);
        CHECK_INT_EQ(t.kind, k);
        CHECK_INT_EQ(t.fallback, 0);
        CHECK_INT_EQ(t.default_system_len, 0);
        CHECK_STR_EQ(core_chat_kind_name(t.kind), names[k]);
    }
    core_chat_tmpl_t t;
    core_error_t e = {0};
    CHECK_INT_EQ(core_chat_tmpl_from_name("vicuna", &t, &e), CORE_EINVAL);
    CHECK(strstr(e.msg, "vicuna") && strstr(e.msg, "chatml") && strstr(e.msg, "gemma"));
    CHECK_INT_EQ(core_chat_tmpl_from_name(NULL, &t, &e), CORE_EINVAL);
    CHECK_INT_EQ(core_chat_tmpl_from_name("ChatML", &t, &e), CORE_EINVAL);
    /* Override beats detection; an empty override means detect. */
    CHECK_INT_EQ(core_chat_tmpl_init("gemma", smollm2_template, &t, NULL), 0);
    CHECK_INT_EQ(t.kind, CORE_CHAT_GEMMA);
    CHECK_INT_EQ(core_chat_tmpl_init("", smollm2_template, &t, NULL), 0);
    CHECK(t.kind == CORE_CHAT_CHATML && t.default_system_len > 0);
    CHECK_INT_EQ(core_chat_tmpl_init(NULL, "[INST]", &t, NULL), 0);
    CHECK_INT_EQ(t.kind, CORE_CHAT_LLAMA2);
    CHECK_INT_EQ(core_chat_tmpl_init("nope", smollm2_template, &t, &e), CORE_EINVAL);
}

/* ---- continuation == full render of the extended conversation minus prefix */

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* A's body as the template writes an assistant message (see chat.h). */
static void assistant_body(core_chat_kind_t k, const char *a, char *out, size_t cap)
{
    const char *s = a;
    size_t n = strlen(a);
    if (k != CORE_CHAT_CHATML) {
        while (n && strchr(" \t\n\r\v\f", *s)) {
            s++;
            n--;
        }
        while (n && strchr(" \t\n\r\v\f", s[n - 1]))
            n--;
    }
    snprintf(out, cap, "%s%.*s", k == CORE_CHAT_LLAMA2 ? " " : "", (int)n, s);
}

static char *try_render(const core_chat_tmpl_t *t, const core_chat_msg_t *m, size_t n, int gen,
                        int cont, int open)
{
    core_chat_opts_t o = {gen, 0, open, 0};
    char *out = NULL;
    int rc = cont ? core_chat_render_continue(t, m, n, &o, MAXB, &out, NULL, NULL)
                  : core_chat_render(t, m, n, &o, MAXB, &out, NULL, NULL);
    return rc == 0 ? out : NULL;
}

/* Checks both guarantees for old + new; returns 0 when the conversation is
 * not renderable in this format (a system message left without a user turn
 * after it in Gemma / Llama-2; the caller counts those). */
static int check_continuation(const core_chat_tmpl_t *t, const core_chat_msg_t *old, size_t no,
                              const char *answer, const core_chat_msg_t *nw, size_t nn, int gen)
{
    core_chat_msg_t all[64];
    /* Open assistant turn. */
    memcpy(all, old, no * sizeof *old);
    all[no] = (core_chat_msg_t){"assistant", answer};
    memcpy(all + no + 1, nw, nn * sizeof *nw);
    char *out = try_render(t, all, no + 1 + nn, gen, 0, 0);
    char *prefix = try_render(t, old, no, 1, 0, 0);
    if (!out || !prefix) {
        free(out);
        free(prefix);
        return 0;
    }
    char body[512];
    assistant_body(t->kind, answer, body, sizeof body);
    char *cont = render_cont(t, nw, nn, gen, 1);
    size_t pl = strlen(prefix), bl = strlen(body);
    CHECK_MSG(starts_with(out, prefix) && strncmp(out + pl, body, bl) == 0 &&
                  strcmp(out + pl + bl, cont) == 0,
              "%s open turn:\n  full  '%s'\n  parts '%s' + '%s' + '%s'",
              core_chat_kind_name(t->kind), out, prefix, body, cont);
    free(out);
    free(prefix);
    free(cont);
    /* Closed turn. */
    memcpy(all + no, nw, nn * sizeof *nw);
    out = try_render(t, all, no + nn, gen, 0, 0);
    if (out) {
        prefix = render(t, old, no, 0, 0);
        cont = render_cont(t, nw, nn, gen, 0);
        pl = strlen(prefix);
        CHECK_MSG(starts_with(out, prefix) && strcmp(out + pl, cont) == 0,
                  "%s closed turn:\n  full  '%s'\n  parts '%s' + '%s'",
                  core_chat_kind_name(t->kind), out, prefix, cont);
        free(out);
        free(prefix);
        free(cont);
    }
    return 1;
}

/* render(old + new) == render(old) + render_continue(new, user open) for a
 * Gemma history old that ends in system text. */
static void check_user_open(const core_chat_tmpl_t *t, const core_chat_msg_t *old, size_t no,
                            const core_chat_msg_t *nw, size_t nn, int gen)
{
    core_chat_msg_t all[64];
    memcpy(all, old, no * sizeof *old);
    memcpy(all + no, nw, nn * sizeof *nw);
    core_chat_opts_t po = {0, 0, 0, 0};
    CHECK_INT_EQ(core_chat_render_leaves_open(t, old, no, &po), CORE_CHAT_OPEN_USER);
    char *out = render(t, all, no + nn, gen, 0);
    char *prefix = render(t, old, no, 0, 0);
    core_chat_opts_t o = {gen, 0, 0, 1};
    char *cont = NULL;
    CHECK_INT_EQ(core_chat_render_continue(t, nw, nn, &o, MAXB, &cont, NULL, NULL), 0);
    size_t pl = prefix ? strlen(prefix) : 0;
    CHECK_MSG(out && prefix && cont && starts_with(out, prefix) && strcmp(out + pl, cont) == 0,
              "gemma open user turn:\n  full  '%s'\n  parts '%s' + '%s'", out ? out : "",
              prefix ? prefix : "", cont ? cont : "");
    /* and the continuation leaves open what the whole render leaves open */
    CHECK_INT_EQ(core_chat_render_leaves_open(t, nw, nn, &o),
                 core_chat_render_leaves_open(t, all, no + nn, &o));
    free(out);
    free(prefix);
    free(cont);
}

TEST(test_continuation_consistency)
{
    core_chat_tmpl_t tmpls[5];
    tmpls[0] = named("chatml");
    tmpls[1] = named("llama2");
    tmpls[2] = named("llama3");
    tmpls[3] = named("gemma");
    CHECK_INT_EQ(core_chat_tmpl_detect(smollm2_template, &tmpls[4], NULL), 0);

    /* The case a stateful chat session lives on, by hand. */
    static const core_chat_msg_t old[] = {{"system", "Be nice."}, {"user", "Hi"}};
    static const core_chat_msg_t nw[] = {{"user", "And now?"}};
    for (int k = 0; k < 5; k++)
        CHECK(check_continuation(&tmpls[k], old, 2, "Hello there", nw, 1, 1));
    /* What the continuation text is, for ChatML and Llama-2. */
    char *c = render_cont(&tmpls[0], nw, 1, 1, 1);
    CHECK_STR_EQ(c, "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n");
    free(c);
    c = render_cont(&tmpls[1], nw, 1, 1, 1);
    CHECK_STR_EQ(c, " </s><s>[INST] And now? [/INST]");
    free(c);
    c = render_cont(&tmpls[2], nw, 1, 1, 1);
    CHECK_STR_EQ(c, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd now?<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(c);
    c = render_cont(&tmpls[3], nw, 1, 1, 1);
    CHECK_STR_EQ(c, "<end_of_turn>\n<start_of_turn>user\nAnd now?<end_of_turn>\n"
                    "<start_of_turn>model\n");
    free(c);
    /* The SmolLM2 default system prompt is never repeated in a continuation. */
    c = render_cont(&tmpls[4], nw, 1, 0, 0);
    CHECK_STR_EQ(c, "<|im_start|>user\nAnd now?<|im_end|>\n");
    free(c);
    /* Closing alone (e.g. before an append without generation). */
    c = render_cont(&tmpls[0], NULL, 0, 0, 1);
    CHECK_STR_EQ(c, "<|im_end|>\n");
    free(c);

    /* Random conversations: roles, contents with stray whitespace. */
    static const char *const roles[] = {"system", "user", "assistant", "user"};
    static const char *const texts[] = {"hello", " padded ", "two\nlines", "", "\ttab",
                                        "x y z\n\n"};
    core_rng_t r;
    core_rng_seed(&r, 8);
    int checked[5] = {0}, skipped = 0, gemma_open_checked = 0;
    for (int trial = 0; trial < 3000; trial++) {
        core_chat_msg_t o[8], n[8];
        size_t no = 1 + core_rng_u64(&r) % 6, nn = core_rng_u64(&r) % 5;
        for (size_t i = 0; i < no; i++)
            o[i] = (core_chat_msg_t){roles[core_rng_u64(&r) % 4], texts[core_rng_u64(&r) % 6]};
        for (size_t i = 0; i < nn; i++)
            n[i] = (core_chat_msg_t){roles[core_rng_u64(&r) % 4], texts[core_rng_u64(&r) % 6]};
        const char *answer = texts[core_rng_u64(&r) % 6];
        int gen = (int)(core_rng_u64(&r) % 2);
        /* A Gemma session's history may end in system text (its user turn
         * left open): the new messages continue that turn. Otherwise a
         * session's history ends with a user or assistant turn. */
        if (strcmp(o[no - 1].role, "system") == 0) {
            check_user_open(&tmpls[3], o, no, n, nn, gen);
            gemma_open_checked++;
            o[no - 1].role = "user";
        }
        for (int k = 0; k < 5; k++) {
            if (check_continuation(&tmpls[k], o, no, answer, n, nn, gen))
                checked[k]++;
            else
                skipped++;
        }
    }
    for (int k = 0; k < 5; k++)
        CHECK_MSG(checked[k] > 1500, "template %d: only %d conversations checked", k, checked[k]);
    CHECK_MSG(checked[3] == 3000, "gemma renders every conversation: %d", checked[3]);
    CHECK_MSG(gemma_open_checked > 300, "only %d open user turns checked", gemma_open_checked);
    (void)skipped;
}

/* core_chat_render_spans: the spans are exactly where contents (as the
 * format writes them: verbatim or trimmed) landed, in order; the rest is
 * the template's. */
TEST(test_content_spans)
{
    static const core_chat_msg_t msgs[] = {
        {"system", "  sys <|im_start|> text "},
        {"user", "u1 <s>[INST]"},
        {"assistant", " a1 "},
        {"user", "\tu2"},
    };
    static const char *const verbatim[] = {"  sys <|im_start|> text ", "u1 <s>[INST]", " a1 ",
                                           "\tu2"};
    static const char *const trimmed[] = {"sys <|im_start|> text", "u1 <s>[INST]", "a1", "u2"};
    static const char *const names[] = {"chatml", "llama3", "gemma", "llama2"};
    for (size_t k = 0; k < 4; k++) {
        core_chat_tmpl_t t;
        core_error_t e = {0};
        CHECK_INT_EQ(core_chat_tmpl_from_name(names[k], &t, &e), 0);
        const char *const *want = t.kind == CORE_CHAT_CHATML ? verbatim : trimmed;
        for (int cont = 0; cont < 2; cont++) {
            core_chat_opts_t o = {.add_generation_prompt = 1, .assistant_turn_open = cont};
            char *out = NULL;
            size_t len = 0, n = 0;
            core_chat_span_t *sp = NULL;
            CHECK_INT_EQ(core_chat_render_spans(&t, msgs, 4, &o, cont, 1 << 20, &out, &len, &sp, &n,
                                                &e),
                         0);
            CHECK_MSG(n == 4, "%s: %zu spans", names[k], n);
            size_t prev = 0;
            for (size_t i = 0; out && sp && i < n && i < 4; i++) {
                CHECK(sp[i].off >= prev && sp[i].off + sp[i].len <= len);
                /* Llama-2 keeps pending system text as is (only the whole
                 * [INST] body is stripped) */
                const char *w = t.kind == CORE_CHAT_LLAMA2 && i == 0 ? verbatim[0] : want[i];
                CHECK_MSG(sp[i].len == strlen(w) && memcmp(out + sp[i].off, w, sp[i].len) == 0,
                          "%s span %zu: '%.*s'", names[k], i, (int)sp[i].len, out + sp[i].off);
                prev = sp[i].off + sp[i].len;
            }
            /* the text is the same as without spans */
            char *plain = NULL;
            size_t plen = 0;
            CHECK_INT_EQ(cont ? core_chat_render_continue(&t, msgs, 4, &o, 1 << 20, &plain, &plen, &e)
                              : core_chat_render(&t, msgs, 4, &o, 1 << 20, &plain, &plen, &e),
                         0);
            CHECK(out && plain && plen == len && memcmp(out, plain, len) == 0);
            free(plain);
            free(out);
            free(sp);
        }
    }
}

int main(void)
{
    RUN(test_chatml);
    RUN(test_chatml_smollm2_default_system);
    RUN(test_llama3);
    RUN(test_gemma);
    RUN(test_gemma_open_user_turn);
    RUN(test_llama2);
    RUN(test_unknown_role_and_bad_input);
    RUN(test_output_bound);
    RUN(test_detection);
    RUN(test_names);
    RUN(test_continuation_consistency);
    RUN(test_content_spans);
    return CHECK_DONE();
}
