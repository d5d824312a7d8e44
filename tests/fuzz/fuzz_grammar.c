/* tests/fuzz/fuzz_grammar.c — libFuzzer target for the grammar compiler and
 * matcher (core/grammar*.c). The input is a grammar text (after an optional
 * first line "#!xyz" whose bytes pick the tokens to feed). It is compiled
 * against a small synthetic vocabulary (every single byte, some multi-byte
 * and partial UTF-8 tokens, an END token) with small bounds, so a slow
 * grammar shows as a timeout rather than taking the fuzzer's time; when it
 * compiles, a few steps run: mask, then accept the token the input picks.
 * Invariants: an error names a line and column (or a bound); a token the
 * mask allows is accepted; one it refuses is refused and leaves the state
 * as it was (its mask unchanged); the masks with and without position
 * tables agree; a state copy gives the same masks.
 *
 * Build and run: make fuzz FUZZ_TARGETS=grammar (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/grammar.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NV 300

static core_grammar_vocab_t *fz_vocab(void)
{
    static core_grammar_vocab_t *v;
    if (v)
        return v;
    static char bytes[NV][8];
    static const char *const multi[] = {"ab",
                                        "abc",
                                        "\"",
                                        "\",",
                                        "{\"",
                                        "}",
                                        "\xC3\xA9",
                                        "\xC3",
                                        "\xA9",
                                        "\xE2\x82\xAC",
                                        "\xE2\x82",
                                        "\xAC\"",
                                        "\xF0\x9F\x98\x80",
                                        "\xF0\x9F",
                                        "\x98\x80",
                                        "yes",
                                        "no",
                                        "  ",
                                        "\n",
                                        "12",
                                        "-1",
                                        "true",
                                        "null",
                                        "[]",
                                        "{}"};
    const char *p[NV];
    size_t l[NV];
    uint8_t k[NV];
    int n = 0;
    for (int b = 0; b < 256; b++, n++) {
        bytes[n][0] = (char)b;
        p[n] = bytes[n];
        l[n] = 1;
        k[n] = CORE_GRAMMAR_TOK_TEXT;
    }
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++, n++) {
        p[n] = multi[i];
        l[n] = strlen(multi[i]);
        k[n] = CORE_GRAMMAR_TOK_TEXT;
    }
    p[n] = "";
    l[n] = 0;
    k[n++] = CORE_GRAMMAR_TOK_END;
    core_error_t err = {0};
    FUZZ_REQUIRE(core_grammar_vocab_new(n, p, l, k, &v, &err) == 0);
    return v;
}

static int bit(const uint64_t *m, int t)
{
    return (int)((m[t >> 6] >> (t & 63)) & 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384)
        return 0;
    core_grammar_vocab_t *v = fz_vocab();
    const int nv = core_grammar_vocab_size(v);
    /* "#!<picks>\n" chooses the tokens; it is also a comment line */
    const uint8_t *picks = NULL;
    size_t n_picks = 0;
    if (size >= 2 && data[0] == '#' && data[1] == '!') {
        const uint8_t *nl = memchr(data, '\n', size);
        picks = data + 2;
        n_picks = (size_t)((nl ? nl : data + size) - picks);
    }
    core_grammar_limits_t lim = {.max_elements = 1u << 14, .max_stacks = 64, .max_depth = 256};
    core_grammar_limits_t lim0 = lim;
    lim0.max_cache = 1;
    core_grammar_t *g = NULL, *g0 = NULL;
    core_error_t err = {0};
    int rc = core_grammar_new((const char *)data, size, v, &lim, &g, &err);
    if (rc < 0) {
        FUZZ_REQUIRE(g == NULL);
        FUZZ_REQUIRE(rc == CORE_EFORMAT || rc == CORE_ERANGE || rc == CORE_ENOMEM);
        FUZZ_REQUIRE(strncmp(err.msg, "line ", 5) == 0 || rc != CORE_EFORMAT);
        return 0;
    }
    FUZZ_REQUIRE(core_grammar_new((const char *)data, size, v, &lim0, &g0, &err) == 0);
    core_grammar_ws_t *ws = core_grammar_ws_new();
    FUZZ_REQUIRE(ws != NULL);
    core_grammar_state_t st, st0, cp = {0};
    uint64_t m[CORE_GRAMMAR_MASK_WORDS(NV)], m0[CORE_GRAMMAR_MASK_WORDS(NV)],
        mc[CORE_GRAMMAR_MASK_WORDS(NV)];
    if (core_grammar_state_init(&st, g, &err) == 0) {
        FUZZ_REQUIRE(core_grammar_state_init(&st0, g0, &err) == 0);
        for (size_t step = 0; step < 8; step++) {
            int r1 = core_grammar_mask(&st, ws, m, nv, &err);
            int r0 = core_grammar_mask(&st0, ws, m0, nv, &err);
            if (r1 < 0 || r0 < 0) {
                /* only a bound may stop a mask, and then in either mode */
                FUZZ_REQUIRE((r1 == CORE_ERANGE || r1 == 0) && (r0 == CORE_ERANGE || r0 == 0));
                break;
            }
            FUZZ_REQUIRE(memcmp(m, m0, sizeof m) == 0);
            FUZZ_REQUIRE(core_grammar_state_copy(&cp, &st, &err) == 0);
            FUZZ_REQUIRE(core_grammar_mask(&cp, ws, mc, nv, &err) == 0);
            FUZZ_REQUIRE(memcmp(m, mc, sizeof m) == 0);
            /* a refused token leaves the state as it was */
            int pick = n_picks ? picks[step % n_picks] : (int)(step * 37 % (size_t)nv);
            int refused = -1;
            for (int t = 0; t < nv && refused < 0; t++)
                if (!bit(m, (pick + t) % nv))
                    refused = (pick + t) % nv;
            if (refused >= 0) {
                FUZZ_REQUIRE(core_grammar_accept(&st, ws, refused, &err) == CORE_EINVAL);
                FUZZ_REQUIRE(core_grammar_mask(&st, ws, mc, nv, &err) == 0);
                FUZZ_REQUIRE(memcmp(m, mc, sizeof m) == 0);
            }
            int take = -1;
            for (int t = 0; t < nv && take < 0; t++)
                if (bit(m, (pick + t) % nv))
                    take = (pick + t) % nv;
            if (take < 0)
                break;
            r1 = core_grammar_accept(&st, ws, take, &err);
            r0 = core_grammar_accept(&st0, ws, take, &err);
            if (r1 == CORE_ERANGE || r0 == CORE_ERANGE)
                break;
            FUZZ_REQUIRE(r1 == 0 && r0 == 0);
        }
        core_grammar_state_clear(&st);
        core_grammar_state_clear(&st0);
        core_grammar_state_clear(&cp);
    }
    core_grammar_ws_free(ws);
    core_grammar_free(g);
    core_grammar_free(g0);
    return 0;
}
