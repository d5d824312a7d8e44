/* tests/fuzz/fuzz_chat.c — libFuzzer target for the chat templates
 * (core/text/chat.c): the input picks a template and options (first byte) and
 * is split into messages at 0x1e bytes, each starting with its role (s, u,
 * a, or anything else: an unknown role); the conversation is rendered whole
 * and as a continuation, with the spans of message contents. The input as
 * a whole is also given to template detection. Invariants: a render is
 * NUL-terminated at its length; spans are ordered, disjoint, inside the
 * output, and each is a copy of bytes of some message content.
 *
 * Build and run: make fuzz FUZZ_TARGETS=chat (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/chat.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192)
        return 0;
    static const char *const kinds[] = {"chatml", "llama2", "llama3", "gemma"};
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    const uint8_t ctl = data[0];
    core_chat_tmpl_t t;
    core_error_t err = {0};
    FUZZ_REQUIRE(core_chat_tmpl_from_name(kinds[ctl & 3], &t, &err) == 0);
    core_chat_opts_t o = {.add_generation_prompt = (ctl >> 2) & 1,
                          .add_bos_text = (ctl >> 3) & 1,
                          .assistant_turn_open = (ctl >> 4) & 1,
                          .user_turn_open = (ctl >> 5) & 1};
    /* contents: NUL-terminated copies (a NUL inside cuts the content) */
    char *buf = malloc(size);
    FUZZ_REQUIRE(buf != NULL);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    core_chat_msg_t msgs[MAX_MSGS];
    size_t n = 0;
    char *p = buf;
    while (n < MAX_MSGS) {
        char *e = strchr(p, 0x1e);
        if (e)
            *e = '\0';
        int r = *p == 's' ? 0 : *p == 'u' ? 1 : *p == 'a' ? 2 : 3;
        msgs[n].role = roles[r];
        msgs[n].content = *p ? p + 1 : p;
        n++;
        if (!e)
            break;
        p = e + 1;
    }
    for (int cont = 0; cont < 2; cont++) {
        char *out = NULL;
        size_t len = 0, ns = 0;
        core_chat_span_t *sp = NULL;
        int rc = core_chat_render_spans(&t, msgs, n, &o, cont, 1 << 20, &out, &len, &sp, &ns,
                                        &err);
        if (rc < 0) {
            FUZZ_REQUIRE(out == NULL && err.msg[0] != '\0');
            free(sp);
            continue;
        }
        FUZZ_REQUIRE(out != NULL && strlen(out) <= len && out[len] == '\0');
        size_t end = 0;
        for (size_t i = 0; i < ns; i++) {
            FUZZ_REQUIRE(sp[i].off >= end && sp[i].off + sp[i].len <= len);
            end = sp[i].off + sp[i].len;
            int found = 0;
            for (size_t m = 0; m < n && !found; m++) {
                size_t cl = strlen(msgs[m].content);
                for (size_t k = 0; k + sp[i].len <= cl && !found; k++)
                    found = memcmp(msgs[m].content + k, out + sp[i].off, sp[i].len) == 0;
            }
            FUZZ_REQUIRE(found);
        }
        free(sp);
        free(out);
    }
    /* the input as a template's Jinja text */
    char *jt = malloc(size + 1);
    FUZZ_REQUIRE(jt != NULL);
    memcpy(jt, data, size);
    jt[size] = '\0';
    core_chat_tmpl_t d;
    if (core_chat_tmpl_detect(jt, &d, &err) == 0) {
        core_chat_msg_t one = {.role = "user", .content = "hi"};
        char *out = NULL;
        if (core_chat_render(&d, &one, 1, &o, 1 << 20, &out, NULL, &err) == 0)
            FUZZ_REQUIRE(out != NULL);
        free(out);
    }
    free(jt);
    free(buf);
    return 0;
}
