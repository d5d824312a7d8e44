/* tests/fuzz/fuzz_tokenizer.c — libFuzzer target for the tokenizer
 * (core/tokenizer*.c) with the default model's byte-level BPE vocabulary
 * ($DARKSERVE_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf, else the
 * tiny fixture): the input is encoded with and without special tokens,
 * with plain ranges cut from it (the chat path), and decoded back whole and
 * token by token through the stream decoder. Invariants: ids in range;
 * without specials, valid UTF-8 decodes back to the input bytes (bytes the
 * vocabulary has no symbol for are dropped, as documented in
 * core/text/tokenizer.h: such inputs are not compared); the stream decoder takes every id (its output is
 * valid UTF-8, so it may differ from the raw decode).
 *
 * Build and run: make fuzz FUZZ_TARGETS=tokenizer (tests/fuzz/README.md).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/gguf.h"
#include "core/text/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static core_tokenizer_t *tok;
static unsigned char missing[256]; /* bytes without a byte-level symbol: dropped */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *p = getenv("DARKSERVE_MODEL");
    if (!p || !*p || access(p, R_OK) != 0)
        p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(p, R_OK) != 0)
        p = fuzz_tiny_path();
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    if (core_gguf_open(p, &g, &err) < 0 || core_tokenizer_from_gguf(g, &tok, &err) < 0) {
        fprintf(stderr, "fuzz setup: tokenizer of %s: %s\n", p, err.msg);
        abort();
    }
    core_gguf_close(g);
    for (int b = 0; b < 256; b++) {
        char c = (char)b, out[64];
        int32_t *ids = NULL;
        size_t n = 0, dl = 0;
        missing[b] = core_tokenizer_encode_alloc(tok, &c, 1, 1, 8, 0, &ids, &n, &err) < 0 ||
                     core_tokenizer_decode(tok, ids, n, 0, out, sizeof out, &dl, &err) < 0 ||
                     dl != 1 || out[0] != c;
        free(ids);
    }
    return 0;
}

/* Decodes ids[n] whole and through the stream decoder. Returns the whole decode (malloc'd) and its length. */
static char *decode_both(const int32_t *ids, size_t n, unsigned flags, size_t *len)
{
    size_t cap = n * CORE_TOK_MAX_TOKEN_LEN + 16, got = 0;
    char *out = malloc(cap);
    FUZZ_REQUIRE(out != NULL);
    core_error_t err = {0};
    FUZZ_REQUIRE(core_tokenizer_decode(tok, ids, n, flags, out, cap, &got, &err) == 0);
    FUZZ_REQUIRE(got <= cap);
    core_tok_stream_t s;
    core_tok_stream_init(&s, tok, flags);
    size_t mo = core_tok_stream_max_out(tok), sn = 0;
    char *sbuf = malloc(cap + mo), *piece = malloc(mo);
    FUZZ_REQUIRE(sbuf && piece);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        FUZZ_REQUIRE(core_tok_stream_push(&s, ids[i], piece, mo, &k, &err) == 0);
        FUZZ_REQUIRE(k <= mo && sn + k <= cap + mo);
        memcpy(sbuf + sn, piece, k);
        sn += k;
    }
    size_t k = 0;
    FUZZ_REQUIRE(core_tok_stream_flush(&s, piece, mo, &k, &err) == 0);
    memcpy(sbuf + sn, piece, k);
    sn += k;
    free(sbuf);
    free(piece);
    *len = got;
    return out;
}

/* 1 if b[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF)
 * made only of bytes the vocabulary has symbols for. */
static int utf8_valid(const uint8_t *b, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (missing[b[k]])
            return 0;
    size_t i = 0;
    while (i < n) {
        uint8_t c = b[i];
        size_t k;
        if (c < 0x80)
            k = 0;
        else if (c >= 0xc2 && c <= 0xdf)
            k = 1;
        else if (c >= 0xe0 && c <= 0xef)
            k = 2;
        else if (c >= 0xf0 && c <= 0xf4)
            k = 3;
        else
            return 0;
        if (k >= n - i)
            return 0; /* cut short */
        uint32_t cp = k == 0 ? c : (uint32_t)(c & (0x3f >> k));
        for (size_t j = 1; j <= k; j++) {
            if ((b[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (b[i + j] & 0x3fu);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok)
        LLVMFuzzerInitialize(NULL, NULL);
    if (size > 4096)
        return 0;
    const char *text = (const char *)data;
    const int32_t V = core_tokenizer_n_vocab(tok);
    static const unsigned flags[] = {0, CORE_TOK_PARSE_SPECIAL,
                                     CORE_TOK_PARSE_SPECIAL | CORE_TOK_ADD_SPECIAL};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        int32_t *ids = NULL;
        size_t n = 0;
        core_error_t err = {0};
        int rc = core_tokenizer_encode_alloc(tok, text, size, size, CORE_TOK_MAX_IDS(size),
                                             flags[f], &ids, &n, &err);
        FUZZ_REQUIRE(rc == 0); /* any bytes tokenize */
        FUZZ_REQUIRE(n <= CORE_TOK_MAX_IDS(size));
        for (size_t i = 0; i < n; i++)
            FUZZ_REQUIRE(ids[i] >= 0 && ids[i] < V);
        size_t dl = 0;
        char *back = decode_both(ids, n, CORE_TOK_DECODE_SPECIAL, &dl);
        if (flags[f] == 0 && core_tokenizer_model(tok) == CORE_TOK_MODEL_BPE &&
            utf8_valid(data, size))
            FUZZ_REQUIRE(dl == size && memcmp(back, text, size) == 0);
        free(back);
        free(ids);
    }
    /* plain ranges: the input cut at a few points chosen by its bytes */
    core_tok_range_t r[4];
    size_t nr = 0, at = 0;
    for (size_t i = 0; i < 4 && size > 0 && at < size; i++) {
        size_t off = at + data[i % size] % (size - at);
        size_t len = (size_t)data[(i + 1) % size] % (size - off + 1);
        r[nr++] = (core_tok_range_t){off, len};
        at = off + len;
        if (at >= size)
            break;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    core_error_t err = {0};
    int rc = core_tokenizer_encode_plain_alloc(tok, text, size, size, CORE_TOK_MAX_IDS(size),
                                               CORE_TOK_PARSE_SPECIAL, r, nr, &ids, &n, &err);
    FUZZ_REQUIRE(rc == 0);
    for (size_t i = 0; i < n; i++)
        FUZZ_REQUIRE(ids[i] >= 0 && ids[i] < V);
    free(ids);
    return 0;
}
