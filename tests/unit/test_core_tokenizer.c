/* tests/unit/test_core_tokenizer.c — core/tokenizer.
 *
 * Hand-made tiny vocabularies built through the array path (expected ids
 * derived by hand, the derivation in the comments), the real model (env
 * DARKSERVE_MODEL) for round trips, special tokens, invalid UTF-8, limits and
 * the streaming detokenizer, and bad metadata written as GGUF files. The
 * corpus-wide comparison with HF tokenizers is tests/reference/
 * test_tokenizer.py.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/gguf.h"
#include "core/rng.h"
#include "core/text/tokenizer.h"
#include "tests/unit/check.h"

#define SP "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* Encodes with the caller-buffer API and compares with want[0..n_want). */
static int enc_eq(const core_tokenizer_t *t, const char *s, size_t len, unsigned flags,
                  const int32_t *want, size_t n_want)
{
    int32_t ids[256];
    size_t n = 0;
    core_error_t err = {0};
    int rc = core_tokenizer_encode(t, s, len, 0, flags, ids, 256, &n, &err);
    int ok = rc == 0 && n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        printf("    encode(\"%.*s\") rc %d (%s) ->", (int)len, s, rc, err.msg);
        for (size_t i = 0; i < n && i < 256; i++)
            printf(" %d", (int)ids[i]);
        printf("  want");
        for (size_t i = 0; i < n_want; i++)
            printf(" %d", (int)want[i]);
        printf("\n");
    }
    return ok;
}

#define ENC_EQ(t, s, flags, ...)                                                              \
    do {                                                                                      \
        const int32_t want_[] = {__VA_ARGS__};                                                \
        CHECK(enc_eq((t), (s), strlen(s), (flags), want_, sizeof want_ / sizeof want_[0])); \
    } while (0)
#define ENC_EMPTY(t, s, len, flags) CHECK(enc_eq((t), (s), (len), (flags), NULL, 0))

/* decode(ids) as a NUL-terminated malloc'ed string (NULL on error). */
static char *dec_str(const core_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags, size_t *len)
{
    size_t need = 0;
    core_tokenizer_decode(t, ids, n, flags, NULL, 0, &need, NULL);
    char *s = malloc(need + 1);
    if (!s || core_tokenizer_decode(t, ids, n, flags, s, need, len, NULL) != 0) {
        free(s);
        return NULL;
    }
    s[*len] = 0;
    return s;
}

/* encode then decode; 1 if the bytes come back unchanged. */
static int round_trips(const core_tokenizer_t *t, const char *s, size_t len, unsigned eflags, unsigned dflags)
{
    int32_t *ids = NULL;
    size_t n = 0, dl = 0;
    core_error_t err = {0};
    if (core_tokenizer_encode_alloc(t, s, len, 0, CORE_TOK_MAX_IDS(len), eflags, &ids, &n, &err) != 0) {
        printf("    encode failed: %s\n", err.msg);
        return 0;
    }
    char *d = dec_str(t, ids, n, dflags, &dl);
    int ok = d && dl == len && memcmp(d, s, len) == 0;
    free(ids);
    free(d);
    return ok;
}

/* ---- a tiny byte-level BPE vocabulary ----
 * Byte-level symbols: "a" "b" "c" stand for themselves, "Ġ" (U+0120) for the
 * space byte. Only the bytes listed have symbols; any other byte is dropped. */
static const char *const bpe_tokens[] = {
    "<|end|>", /* 0 CONTROL */
    "<u>",     /* 1 USER_DEFINED */
    "a", "b", "c", /* 2 3 4 */
    "\xC4\xA0",    /* 5 "Ġ" = space */
    "ab",          /* 6 merge rank 0 */
    "abc",         /* 7 merge rank 1 */
    "\xC4\xA0" "a",/* 8 "Ġa" merge rank 2 */
    "<", ">", "|", "e", "n", "d", "u", /* 9..15 */
    "aa",          /* 16 merge rank 3 */
};
static const int32_t bpe_types[] = {3, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static const char *const bpe_merges[] = {"a b", "ab c", "\xC4\xA0 a", "a a"};

static void bpe_spec(core_tok_spec_t *s)
{
    core_tok_spec_init(s);
    s->model = CORE_TOK_MODEL_BPE;
    s->pre = "gpt2";
    s->n_tokens = sizeof bpe_tokens / sizeof bpe_tokens[0];
    s->tokens = bpe_tokens;
    s->token_types = bpe_types;
    s->n_merges = sizeof bpe_merges / sizeof bpe_merges[0];
    s->merges = bpe_merges;
    s->eos_id = 0;
}

TEST(tiny_bpe_by_hand)
{
    core_tok_spec_t spec;
    bpe_spec(&spec);
    core_tokenizer_t *t = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), 0);
    if (!t)
        return;
    CHECK_INT_EQ(core_tokenizer_n_vocab(t), 17);
    CHECK_STR_EQ(core_tokenizer_pre_name(t), "gpt2");

    /* "abc ab": the GPT-2 regex gives pieces "abc" and " ab".
     * "abc": a b c -> (a,b) rank 0 -> ab c -> (ab,c) rank 1 -> abc = 7.
     * " ab": Ġ a b; candidates (Ġ,a) rank 2 and (a,b) rank 0; the lower rank
     * wins although it is further right -> Ġ ab; (Ġ,ab) is no merge -> 5 6. */
    ENC_EQ(t, "abc ab", 0, 7, 5, 6);
    /* " a": Ġ a -> (Ġ,a) rank 2 -> 8. */
    ENC_EQ(t, " a", 0, 8);
    /* "aaa": (a,a) at 0 and at 1 have equal rank; the leftmost merges first
     * -> aa a; (aa,a) is no merge -> 16 2. */
    ENC_EQ(t, "aaa", 0, 16, 2);
    /* "aéb" is one \p{L}+ piece; é's bytes C3 A9 have no symbol and are
     * dropped (as HF does), after which a and b are neighbours and merge. */
    ENC_EQ(t, "a\xC3\xA9" "b", 0, 6);
    /* control token: recognised only with PARSE_SPECIAL. Without it the
     * regex pieces are "a", "<|", "end", "|>", "b" and nothing merges. */
    ENC_EQ(t, "a<|end|>b", CORE_TOK_PARSE_SPECIAL, 2, 0, 3);
    ENC_EQ(t, "a<|end|>b", 0, 2, 9, 11, 12, 13, 14, 11, 10, 3);
    /* user-defined token: recognised in both modes */
    ENC_EQ(t, "a<u>b", 0, 2, 1, 3);
    ENC_EQ(t, "a<u>b", CORE_TOK_PARSE_SPECIAL, 2, 1, 3);
    /* the text after a special is tokenized on its own: " a" stays Ġa */
    ENC_EQ(t, "<|end|> a", CORE_TOK_PARSE_SPECIAL, 0, 8);
    /* add_eos appends eos only with ADD_SPECIAL */
    core_tokenizer_free(t);
    spec.add_eos = 1;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), 0);
    if (!t)
        return;
    ENC_EQ(t, "ab", CORE_TOK_ADD_SPECIAL, 6, 0);
    ENC_EQ(t, "ab", 0, 6);
    ENC_EQ(t, "", CORE_TOK_ADD_SPECIAL, 0);
    ENC_EMPTY(t, "", 0, 0);
    ENC_EMPTY(t, NULL, 0, CORE_TOK_PARSE_SPECIAL);

    /* pieces: byte-level symbols map back to bytes; specials are their text */
    size_t len;
    const char *p = core_tokenizer_piece(t, 8, &len);
    CHECK(p && len == 2 && memcmp(p, " a", 2) == 0);
    char buf[16];
    CHECK_INT_EQ(core_tokenizer_token_to_piece(t, 0, 0, buf, sizeof buf, &len, NULL), 0);
    CHECK_INT_EQ(len, 0);
    CHECK_INT_EQ(core_tokenizer_token_to_piece(t, 0, CORE_TOK_DECODE_SPECIAL, buf, sizeof buf, &len, NULL), 0);
    CHECK(len == 7 && memcmp(buf, "<|end|>", 7) == 0);
    CHECK_INT_EQ(core_tokenizer_token_to_piece(t, 0, CORE_TOK_DECODE_SPECIAL, buf, 3, &len, NULL), CORE_ERANGE);
    CHECK_INT_EQ(len, 7);
    CHECK_INT_EQ(core_tokenizer_token_to_piece(t, 17, 0, buf, sizeof buf, &len, NULL), CORE_EINVAL);
    CHECK_INT_EQ(core_tokenizer_token_to_piece(t, 1, 0, buf, sizeof buf, &len, NULL), 0);
    CHECK(len == 3 && memcmp(buf, "<u>", 3) == 0); /* user-defined: always rendered */
    CHECK(core_tokenizer_is_eog(t, 0));
    CHECK(!core_tokenizer_is_eog(t, 1));
    CHECK(!core_tokenizer_is_eog(t, -1));
    CHECK(!core_tokenizer_is_eog(t, 99));
    CHECK_INT_EQ(core_tokenizer_find(t, "abc", 3), 7);
    CHECK_INT_EQ(core_tokenizer_find(t, "abcd", 4), -1);
    CHECK_INT_EQ(core_tokenizer_token_type(t, 1), CORE_TOK_TYPE_USER_DEFINED);
    /* the vocabulary lacks most bytes: that is reported, not fatal */
    CHECK(strstr(core_tokenizer_warnings(t), "dropped") != NULL);
    core_tokenizer_free(t);
}

/* Specials are matched leftmost-longest, as HF's added vocabulary does. */
TEST(special_longest_match)
{
    static const char *const toks[] = {"<s>", "<s>x", "x", "<", "s", ">", "y"};
    static const int32_t types[] = {3, 3, 1, 1, 1, 1, 1};
    core_tok_spec_t spec;
    core_tok_spec_init(&spec);
    spec.pre = "gpt2";
    spec.n_tokens = 7;
    spec.tokens = toks;
    spec.token_types = types;
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    ENC_EQ(t, "<s>xy", CORE_TOK_PARSE_SPECIAL, 1, 6);
    ENC_EQ(t, "y<s>y", CORE_TOK_PARSE_SPECIAL, 6, 0, 6);
    ENC_EQ(t, "<s<s>", CORE_TOK_PARSE_SPECIAL, 3, 4, 0);
    core_tokenizer_free(t);
}

/* ---- a tiny SentencePiece-style vocabulary ----
 * 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then pieces with scores:
 * ▁ 0, a 0, b 0, ▁a -1, ab -2, ▁ab -3, ▁b -0.5, ba -0.25. */
enum { SPM_SP = 259, SPM_A, SPM_B, SPM_SPA, SPM_AB, SPM_SPAB, SPM_SPB, SPM_BA, SPM_N };

typedef struct spm_vocab {
    char bytes[256][8];
    const char *tokens[SPM_N];
    float scores[SPM_N];
    int32_t types[SPM_N];
} spm_vocab_t;

static void spm_spec(spm_vocab_t *v, core_tok_spec_t *s)
{
    v->tokens[0] = "<unk>";
    v->tokens[1] = "<s>";
    v->tokens[2] = "</s>";
    v->types[0] = 2;
    v->types[1] = v->types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(v->bytes[b], sizeof v->bytes[b], "<0x%02X>", b);
        v->tokens[3 + b] = v->bytes[b];
        v->types[3 + b] = 6;
    }
    static const char *const pieces[] = {SP, "a", "b", SP "a", "ab", SP "ab", SP "b", "ba"};
    static const float sc[] = {0.0f, 0.0f, 0.0f, -1.0f, -2.0f, -3.0f, -0.5f, -0.25f};
    for (int i = 0; i < 8; i++) {
        v->tokens[SPM_SP + i] = pieces[i];
        v->scores[SPM_SP + i] = sc[i];
        v->types[SPM_SP + i] = 1;
    }
    for (int i = 0; i < SPM_SP; i++)
        v->scores[i] = 0.0f;
    core_tok_spec_init(s);
    s->model = CORE_TOK_MODEL_SPM;
    s->n_tokens = SPM_N;
    s->tokens = v->tokens;
    s->scores = v->scores;
    s->token_types = v->types;
    s->unk_id = 0;
    s->bos_id = 1;
    s->eos_id = 2;
    s->add_bos = 1;
    s->add_space_prefix = 1;
}

TEST(tiny_spm_by_hand)
{
    spm_vocab_t v;
    core_tok_spec_t spec;
    spm_spec(&v, &spec);
    core_tokenizer_t *t = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), 0);
    if (!t)
        return;
    /* "ab" -> "▁ab": candidates (▁,a) = "▁a" score -1 and (a,b) = "ab"
     * score -2; the higher score merges first -> ▁a b; then (▁a,b) = "▁ab"
     * -3 -> one token. (Merging "ab" first would also end in "▁ab"; the
     * next case is where order shows.) */
    ENC_EQ(t, "ab", 0, SPM_SPAB);
    /* "b a" -> "▁b▁a": (▁,b) -0.5 beats (▁,a) -1; "b▁" is no token -> ▁b ▁a */
    ENC_EQ(t, "b a", 0, SPM_SPB, SPM_SPA);
    /* "ba" -> "▁ba": (b,a) = "ba" -0.25 beats the leftmost pair (▁,b) -0.5
     * -> ▁ ba; "▁ba" is no token. (Lowest score first would give ▁b a.) */
    ENC_EQ(t, "ba", 0, SPM_SP, SPM_BA);
    /* "bab" -> "▁bab": ba (-0.25) first -> ▁ ba b; then (▁,ba) "▁ba" and
     * (ba,b) "bab" are no tokens -> ▁ ba b */
    ENC_EQ(t, "bab", 0, SPM_SP, SPM_BA, SPM_B);
    /* "é" is no piece: byte fallback to <0xC3> <0xA9> (ids 3 + byte) */
    ENC_EQ(t, "\xC3\xA9", 0, SPM_SP, 3 + 0xC3, 3 + 0xA9);
    /* invalid UTF-8: each bad byte is its own symbol and falls back */
    ENC_EQ(t, "a\xFF", 0, SPM_SPA, 3 + 0xFF);
    /* BOS only with ADD_SPECIAL; the empty text is just BOS */
    ENC_EQ(t, "ab", CORE_TOK_ADD_SPECIAL, 1, SPM_SPAB);
    ENC_EQ(t, "", CORE_TOK_ADD_SPECIAL, 1);
    ENC_EMPTY(t, "", 0, 0);
    /* the space prefix is added at the start and after every special */
    ENC_EQ(t, "a</s>b", CORE_TOK_PARSE_SPECIAL, SPM_SPA, 2, SPM_SPB);
    /* without parsing, "</s>" is text: ▁a then bytes of "</s>" then b */
    ENC_EQ(t, "a</s>b", 0, SPM_SPA, 3 + '<', 3 + '/', 3 + 's', 3 + '>', SPM_B);

    /* decode: ▁ is a space, byte tokens are bytes; STRIP_PREFIX drops the
     * space the encoder added */
    size_t len;
    const int32_t ids[] = {SPM_SPB, SPM_SPA, 3 + 0xC3, 3 + 0xA9};
    char *d = dec_str(t, ids, 4, 0, &len);
    CHECK_STR_EQ(d, " b a\xC3\xA9");
    free(d);
    d = dec_str(t, ids, 4, CORE_TOK_DECODE_STRIP_PREFIX, &len);
    CHECK_STR_EQ(d, "b a\xC3\xA9");
    free(d);
    const int32_t with_bos[] = {1, SPM_SPA};
    d = dec_str(t, with_bos, 2, CORE_TOK_DECODE_STRIP_PREFIX, &len);
    CHECK_STR_EQ(d, "a"); /* an unrendered special does not block the strip */
    free(d);
    d = dec_str(t, with_bos, 2, CORE_TOK_DECODE_STRIP_PREFIX | CORE_TOK_DECODE_SPECIAL, &len);
    CHECK_STR_EQ(d, "<s> a"); /* as HF's Strip decoder: only a leading space goes */
    free(d);
    core_tokenizer_free(t);

    /* add_space_prefix off: "ab" -> a b -> (a,b) "ab" */
    spec.add_space_prefix = 0;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), 0);
    if (t)
        ENC_EQ(t, "ab", 0, SPM_AB);
    core_tokenizer_free(t);
}

/* A SentencePiece vocabulary without byte tokens falls back to unk. */
TEST(spm_unknown_without_byte_tokens)
{
    static const char *const toks[] = {"<unk>", SP, "a"};
    static const float scores[] = {0, 0, 0};
    static const int32_t types[] = {2, 1, 1};
    core_tok_spec_t spec;
    core_tok_spec_init(&spec);
    spec.model = CORE_TOK_MODEL_SPM;
    spec.n_tokens = 3;
    spec.tokens = toks;
    spec.scores = scores;
    spec.token_types = types;
    spec.unk_id = 0;
    spec.add_space_prefix = 1;
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    ENC_EQ(t, "ax", 0, 1, 2, 0);
    ENC_EQ(t, "a\xC3\xA9", 0, 1, 2, 0); /* one unk for the whole character */
    core_tokenizer_free(t);
}

/* Gemma-style USER_DEFINED whitespace runs: stored with spaces in the GGUF
 * (llama.cpp's converter unescapes them), matched by SentencePiece in the
 * escaped text, so a literal "▁" in the input matches a space of the piece;
 * without add_space_prefix nothing is prepended. */
TEST(spm_user_defined_spaces_match_escaped_text)
{
    static const char *const toks[] = {"<unk>", SP, "a", "  ", "   ", "<t>"};
    static const float scores[] = {0, 0, 0, -1000, -1000, -1000};
    static const int32_t types[] = {2, 1, 1, 4, 4, 4};
    core_tok_spec_t spec;
    core_tok_spec_init(&spec);
    spec.model = CORE_TOK_MODEL_SPM;
    spec.n_tokens = 6;
    spec.tokens = toks;
    spec.scores = scores;
    spec.token_types = types;
    spec.unk_id = 0;
    spec.add_space_prefix = 0;
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    ENC_EQ(t, "a  a", 0, 2, 3, 2);                 /* two spaces: the piece */
    ENC_EQ(t, "a a", 0, 2, 1, 2);                  /* one space: "▁" */
    ENC_EQ(t, "   a", 0, 4, 2);                    /* longest run first */
    ENC_EQ(t, " " SP SP "a", 0, 4, 2);            /* "▁" stands for a space */
    ENC_EQ(t, SP " a", 0, 3, 2);
    ENC_EQ(t, SP "a", 0, 1, 2);                    /* a lone "▁" is the piece "▁" */
    ENC_EQ(t, "<t>" SP SP "<t>", 0, 5, 3, 5);      /* USER_DEFINED without parse flag */
    ENC_EQ(t, "\xE2\x96", 0, 0, 0);                /* a cut "▁": no match, an unk a byte */
    core_tokenizer_free(t);
}

/* Random bytes through the tiny SPM vocabulary (every byte has a token) must
 * come back exactly, and never fail. */
TEST(spm_random_bytes_round_trip)
{
    spm_vocab_t v;
    core_tok_spec_t spec;
    spm_spec(&v, &spec);
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    core_rng_t rng;
    core_rng_seed(&rng, 7);
    int bad = 0;
    for (int it = 0; it < 500; it++) {
        char s[64];
        size_t n = (size_t)(core_rng_u64(&rng) % sizeof s);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = core_rng_u64(&rng);
            s[i] = (char)(r % 4 == 0 ? ' ' : r % 4 == 1 ? 'a' : (int)((r >> 8) & 0xFF));
        }
        if (memmem(s, n, SP, 3))
            continue; /* a literal U+2581 decodes as a space: SentencePiece's own limitation */
        bad += !round_trips(t, s, n, 0, CORE_TOK_DECODE_STRIP_PREFIX);
    }
    CHECK_INT_EQ(bad, 0);
    core_tokenizer_free(t);
}

/* The documented bound on the id count holds in SPM's worst case: no "▁"
 * piece (so every space becomes three byte tokens) and specials between
 * short stretches (each stretch gets a prefix). */
TEST(spm_id_count_bound)
{
    spm_vocab_t v;
    core_tok_spec_t spec;
    spm_spec(&v, &spec);
    spec.n_tokens = SPM_SP; /* specials and byte tokens only */
    spec.add_eos = 1;
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    static const char *const texts[] = {" ", "  ", " </s> </s> ", "</s> </s> </s>", "a", "\xC3\xA9 \xC3\xA9"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t len = strlen(texts[i]), n = 0;
        CHECK_INT_EQ(core_tokenizer_encode(t, texts[i], len, 0, CORE_TOK_ADD_SPECIAL | CORE_TOK_PARSE_SPECIAL,
                                           NULL, 0, &n, NULL),
                     n ? CORE_ERANGE : 0);
        CHECK_MSG(n <= CORE_TOK_MAX_IDS(len), "\"%s\": %zu ids for %zu bytes", texts[i], n, len);
    }
    /* " " -> BOS, "▁▁" as six byte tokens, EOS */
    size_t n = 0;
    core_tokenizer_encode(t, " ", 1, 0, CORE_TOK_ADD_SPECIAL, NULL, 0, &n, NULL);
    CHECK_INT_EQ(n, 8);
    core_tokenizer_free(t);
}

/* ---- the real model ---- */

static core_tokenizer_t *real_tok(void)
{
    const char *path = getenv("DARKSERVE_MODEL");
    CHECK_MSG(path != NULL, "DARKSERVE_MODEL is not set");
    if (!path)
        return NULL;
    core_gguf_t *g = NULL;
    core_tokenizer_t *t = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open(path, &g, &err);
    if (rc == 0)
        rc = core_tokenizer_from_gguf(g, &t, &err);
    core_gguf_close(g);
    CHECK_MSG(rc == 0, "%s: %s", path, err.msg);
    return t;
}

/* Token id of the byte-level symbol standing for byte b. */
static int32_t byte_id(const core_tokenizer_t *t, unsigned char b)
{
    for (int32_t i = 0; i < core_tokenizer_n_vocab(t); i++) {
        size_t len;
        const char *p = core_tokenizer_piece(t, i, &len);
        if (len == 1 && (unsigned char)p[0] == b && core_tokenizer_token_type(t, i) == CORE_TOK_TYPE_NORMAL)
            return i;
    }
    return -1;
}

TEST(real_model_basics)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    CHECK_INT_EQ(core_tokenizer_n_vocab(t), 49152);
    CHECK_INT_EQ(core_tokenizer_model(t), CORE_TOK_MODEL_BPE);
    CHECK_STR_EQ(core_tokenizer_pre_name(t), "smollm");
    CHECK_INT_EQ(core_tokenizer_bos(t), 1);
    CHECK_INT_EQ(core_tokenizer_eos(t), 2);
    CHECK_INT_EQ(core_tokenizer_eot(t), 2);
    /* <|endoftext|> and <|im_end|> end a generation, <|im_start|> does not */
    CHECK(core_tokenizer_is_eog(t, 0));
    CHECK(core_tokenizer_is_eog(t, 2));
    CHECK(!core_tokenizer_is_eog(t, 1));
    CHECK(!core_tokenizer_is_eog(t, 100));
    /* ids from HF tokenizers on the same vocabulary (tests/reference/
     * test_tokenizer.py builds that tokenizer): "Hello world!" -> 19556 905 17;
     * digits are split one by one: " 12" -> Ġ 1 2 = 216 33 34 */
    ENC_EQ(t, "Hello world!", 0, 19556, 905, 17);
    ENC_EQ(t, " 12", 0, 216, 33, 34);
    /* add_bos_token is false in this model: ADD_SPECIAL adds nothing */
    ENC_EQ(t, "Hello world!", CORE_TOK_ADD_SPECIAL, 19556, 905, 17);
    /* special tokens on and off */
    ENC_EQ(t, "<|im_start|>", CORE_TOK_PARSE_SPECIAL, 1);
    ENC_EQ(t, "<|im_end|><|endoftext|>", CORE_TOK_PARSE_SPECIAL, 2, 0);
    int32_t ids[64];
    size_t n = 0;
    CHECK_INT_EQ(core_tokenizer_encode(t, "<|im_start|>", 12, 0, 0, ids, 64, &n, NULL), 0);
    CHECK(n > 1);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] > 16); /* no control token comes out of plain text */
    ENC_EMPTY(t, "", 0, CORE_TOK_PARSE_SPECIAL | CORE_TOK_ADD_SPECIAL);
    CHECK(strstr(core_tokenizer_warnings(t), "21 bytes") != NULL);
    core_tokenizer_free(t);
}

static const char *const rt_texts[] = {
    "",
    "Hello, world!",
    "  leading, trailing  \n\n\t",
    "Привет, мир! Γειά σου. مرحبا. שלום. नमस्ते. 你好，世界！ こんにちは 안녕하세요 สวัสดี",
    "👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈 🇺🇸",
    "def f(x):\n    return x ** 2  # comment\n",
    "I'm, you're, THEY'VE, he'll, she'd, it's, DON'T",
    "1234567890 3.14159 1,000,000 -42",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "!!!???...---***",
};

TEST(real_model_round_trips)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    for (size_t i = 0; i < sizeof rt_texts / sizeof rt_texts[0]; i++) {
        size_t n = strlen(rt_texts[i]);
        CHECK_MSG(round_trips(t, rt_texts[i], n, CORE_TOK_PARSE_SPECIAL, CORE_TOK_DECODE_SPECIAL), "%s",
                  rt_texts[i]);
        CHECK_MSG(round_trips(t, rt_texts[i], n, 0, 0), "%s", rt_texts[i]);
    }
    /* without DECODE_SPECIAL the control tokens vanish from the text */
    int32_t ids[] = {1, 4093, 2};
    size_t len;
    char *d = dec_str(t, ids, 3, 0, &len);
    CHECK_STR_EQ(d, "user");
    free(d);
    d = dec_str(t, ids, 3, CORE_TOK_DECODE_SPECIAL, &len);
    CHECK_STR_EQ(d, "<|im_start|>user<|im_end|>");
    free(d);
    core_tokenizer_free(t);
}

/* Invalid UTF-8 never fails: bytes outside valid characters become their
 * byte tokens; bytes the vocabulary has no symbol for (0xFF in SmolLM2) are
 * dropped. decode(encode(s)) is s minus exactly those bytes. */
TEST(real_model_invalid_utf8)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    int32_t b80 = byte_id(t, 0x80), ba = byte_id(t, 'a'), bb = byte_id(t, 'b');
    CHECK(b80 >= 0 && ba >= 0 && bb >= 0);
    ENC_EQ(t, "a\x80" "b", 0, ba, b80, bb);
    ENC_EMPTY(t, "\xFF", 1, 0);
    static const char *const bad[] = {"\xC3", "a\xC3", "\xE2\x82", "\xE2\x82 x", "\xED\xA0\x80", "\xF0\x9F\x98",
                                      "\x80\x80\x80", "caf\xC3\xA9\xC3", "\xC3\x28", "\xE0\x80\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(round_trips(t, bad[i], strlen(bad[i]), CORE_TOK_PARSE_SPECIAL, 0), "bad[%zu]", i);

    /* random bytes: never an error; the round trip loses only unrepresentable bytes */
    uint8_t representable[256];
    for (int b = 0; b < 256; b++)
        representable[b] = byte_id(t, (unsigned char)b) >= 0;
    core_rng_t rng;
    core_rng_seed(&rng, 11);
    int failures = 0;
    for (int it = 0; it < 300; it++) {
        char s[96], kept[96];
        size_t n = (size_t)(core_rng_u64(&rng) % sizeof s), nk = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = core_rng_u64(&rng);
            s[i] = (char)(r % 3 == 0 ? " \nab1<|"[(r >> 8) % 7] : (int)((r >> 16) & 0xFF));
            if (representable[(unsigned char)s[i]])
                kept[nk++] = s[i];
        }
        int32_t *ids = NULL;
        size_t n_ids = 0, dl = 0;
        core_error_t err = {0};
        if (core_tokenizer_encode_alloc(t, s, n, 0, n + 2, 0, &ids, &n_ids, &err) != 0) {
            failures++;
            continue;
        }
        char *d = dec_str(t, ids, n_ids, 0, &dl);
        failures += !(d && dl == nk && memcmp(d, kept, nk) == 0);
        free(d);
        free(ids);
    }
    CHECK_INT_EQ(failures, 0);
    core_tokenizer_free(t);
}

TEST(real_model_limits_and_buffers)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    const char *s = "The quick brown fox jumps over the lazy dog.";
    size_t len = strlen(s), n = 0;
    core_error_t err = {0};
    int32_t ids[64];
    CHECK_INT_EQ(core_tokenizer_encode(t, s, len, 0, 0, ids, 64, &n, &err), 0);
    size_t full = n;
    CHECK(full > 3);
    /* too small: CORE_ERANGE, the required count, and the first cap ids */
    int32_t small[3];
    CHECK_INT_EQ(core_tokenizer_encode(t, s, len, 0, 0, small, 3, &n, &err), CORE_ERANGE);
    CHECK_INT_EQ(n, full);
    CHECK(memcmp(small, ids, sizeof small) == 0);
    CHECK_INT_EQ(core_tokenizer_encode(t, s, len, 0, 0, NULL, 0, &n, &err), CORE_ERANGE);
    CHECK_INT_EQ(n, full);
    /* text longer than max_len */
    CHECK_INT_EQ(core_tokenizer_encode(t, s, len, 10, 0, ids, 64, &n, &err), CORE_ERANGE);
    CHECK_INT_EQ(n, 0);
    CHECK(strstr(err.msg, "exceeds") != NULL);
    /* alloc: max_tokens bounds the output */
    int32_t *a = NULL;
    CHECK_INT_EQ(core_tokenizer_encode_alloc(t, s, len, 0, full - 1, 0, &a, &n, &err), CORE_ERANGE);
    CHECK(a == NULL && n == 0);
    CHECK_INT_EQ(core_tokenizer_encode_alloc(t, s, len, 0, full, 0, &a, &n, &err), 0);
    CHECK(n == full && a && memcmp(a, ids, full * sizeof *a) == 0);
    free(a);
    /* decode: bad ids and small buffers */
    char out[8];
    int32_t bad_ids[] = {5, 49152};
    CHECK_INT_EQ(core_tokenizer_decode(t, bad_ids, 2, 0, out, sizeof out, &n, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "ids[1]") != NULL);
    CHECK_INT_EQ(core_tokenizer_decode(t, ids, full, 0, out, sizeof out, &n, &err), CORE_ERANGE);
    CHECK_INT_EQ(n, len);
    CHECK(memcmp(out, s, sizeof out) == 0);
    core_tokenizer_free(t);
}

/* ---- streaming detokenizer ---- */

/* Pushes ids one by one; appends each push's output, separated by '|', so
 * the test sees where text was held back. */
static void stream_all(const core_tokenizer_t *t, unsigned flags, const int32_t *ids, size_t n, int flush,
                       char *out, size_t cap)
{
    core_tok_stream_t s;
    core_tok_stream_init(&s, t, flags);
    size_t max = core_tok_stream_max_out(t), w = 0, k;
    char *chunk = malloc(max);
    for (size_t i = 0; i < n && chunk; i++) {
        if (core_tok_stream_push(&s, ids[i], chunk, max, &k, NULL) != 0 || w + k + 2 >= cap)
            break;
        memcpy(out + w, chunk, k);
        w += k;
        out[w++] = '|';
    }
    if (flush && chunk && core_tok_stream_flush(&s, chunk, max, &k, NULL) == 0 && w + k + 1 < cap) {
        memcpy(out + w, chunk, k);
        w += k;
    }
    out[w] = 0;
    free(chunk);
}

#define FFFD "\xEF\xBF\xBD"

TEST(stream_holds_back_partial_characters)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    char out[256];
    /* é = C3 A9 in two byte tokens: nothing after the first, é after the second */
    int32_t e_acute[] = {byte_id(t, 0xC3), byte_id(t, 0xA9)};
    stream_all(t, 0, e_acute, 2, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|\xC3\xA9|");
    /* 😀 = F0 9F 98 80 in four */
    int32_t grin[] = {byte_id(t, 0xF0), byte_id(t, 0x9F), byte_id(t, 0x98), byte_id(t, 0x80)};
    stream_all(t, 0, grin, 4, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|||\xF0\x9F\x98\x80|");
    /* Expected replacements follow the Unicode "maximal subpart" practice;
     * each is what Python's bytes.decode("utf-8", "replace") gives:
     * C3 'a'       -> U+FFFD 'a'   (cut short by the next byte)
     * 80           -> U+FFFD       (stray continuation byte)
     * E0 80        -> U+FFFD U+FFFD (E0 needs A0..BF next: overlong)
     * F0 9F 98 'a' -> U+FFFD 'a'   (one subpart)
     * ED A0        -> U+FFFD U+FFFD (surrogate range)
     * C3 at the end -> U+FFFD from flush */
    int32_t a = byte_id(t, 'a');
    int32_t c1[] = {byte_id(t, 0xC3), a};
    stream_all(t, 0, c1, 2, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|" FFFD "a|");
    int32_t c2[] = {byte_id(t, 0x80)};
    stream_all(t, 0, c2, 1, 1, out, sizeof out);
    CHECK_STR_EQ(out, FFFD "|");
    int32_t c3[] = {byte_id(t, 0xE0), byte_id(t, 0x80)};
    stream_all(t, 0, c3, 2, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|" FFFD FFFD "|");
    int32_t c4[] = {byte_id(t, 0xF0), byte_id(t, 0x9F), byte_id(t, 0x98), a};
    stream_all(t, 0, c4, 4, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|||" FFFD "a|");
    int32_t c5[] = {byte_id(t, 0xED), byte_id(t, 0xA0)};
    stream_all(t, 0, c5, 2, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|" FFFD FFFD "|");
    int32_t c6[] = {a, byte_id(t, 0xC3)};
    stream_all(t, 0, c6, 2, 1, out, sizeof out);
    CHECK_STR_EQ(out, "a||" FFFD);
    stream_all(t, 0, c6, 2, 0, out, sizeof out); /* not flushed: still held */
    CHECK_STR_EQ(out, "a||");
    /* specials: rendered only with DECODE_SPECIAL */
    int32_t sp[] = {1, a, 2};
    stream_all(t, 0, sp, 3, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|a||");
    stream_all(t, CORE_TOK_DECODE_SPECIAL, sp, 3, 1, out, sizeof out);
    CHECK_STR_EQ(out, "<|im_start|>|a|<|im_end|>|");
    /* a buffer below max_out is refused, and bad ids too */
    core_tok_stream_t s;
    core_tok_stream_init(&s, t, 0);
    size_t k;
    CHECK_INT_EQ(core_tok_stream_push(&s, a, out, 4, &k, NULL), CORE_ERANGE);
    CHECK_INT_EQ(core_tok_stream_push(&s, -1, out, sizeof out, &k, NULL), CORE_EINVAL);
    /* a real encoding streamed equals its decode */
    const char *txt = "Привет 👋🏽 世界 — done.";
    int32_t ids[128];
    size_t n = 0, dl = 0;
    CHECK_INT_EQ(core_tokenizer_encode(t, txt, strlen(txt), 0, 0, ids, 128, &n, NULL), 0);
    char joined[512];
    stream_all(t, 0, ids, n, 1, joined, sizeof joined);
    size_t w = 0;
    for (size_t i = 0; joined[i]; i++)
        if (joined[i] != '|')
            joined[w++] = joined[i];
    joined[w] = 0;
    char *d = dec_str(t, ids, n, 0, &dl);
    CHECK_STR_EQ(joined, d);
    CHECK_STR_EQ(joined, txt);
    free(d);
    core_tokenizer_free(t);
}

TEST(stream_strip_prefix_spm)
{
    spm_vocab_t v;
    core_tok_spec_t spec;
    spm_spec(&v, &spec);
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, NULL), 0);
    if (!t)
        return;
    char out[128];
    int32_t ids[] = {1, SPM_SPA, SPM_SPB};
    stream_all(t, CORE_TOK_DECODE_STRIP_PREFIX, ids, 3, 1, out, sizeof out);
    CHECK_STR_EQ(out, "|a| b|");
    stream_all(t, 0, ids, 3, 1, out, sizeof out); /* a continuation keeps its space */
    CHECK_STR_EQ(out, "| a| b|");
    core_tokenizer_free(t);
}

/* ---- concurrency: one tokenizer, several threads ---- */

typedef struct job {
    const core_tokenizer_t *t;
    int ok;
} job_t;

static void *encode_worker(void *arg)
{
    job_t *j = arg;
    j->ok = 1;
    for (int r = 0; r < 20; r++)
        for (size_t i = 0; i < sizeof rt_texts / sizeof rt_texts[0]; i++)
            j->ok &= round_trips(j->t, rt_texts[i], strlen(rt_texts[i]), CORE_TOK_PARSE_SPECIAL,
                                 CORE_TOK_DECODE_SPECIAL);
    return NULL;
}

TEST(concurrent_encoding)
{
    core_tokenizer_t *t = real_tok();
    if (!t)
        return;
    pthread_t th[4];
    job_t jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        jobs[i].ok = 0;
        CHECK_INT_EQ(pthread_create(&th[i], NULL, encode_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
    }
    core_tokenizer_free(t);
}

/* ---- bad metadata ---- */

TEST(bad_arrays_rejected)
{
    core_tok_spec_t spec;
    core_tokenizer_t *t = NULL;
    core_error_t err = {0};

    bpe_spec(&spec);
    spec.n_tokens = 0;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK(t == NULL && strstr(err.msg, "no tokens"));

    static const char *const unknown_part[] = {"a b", "ab q"};
    bpe_spec(&spec);
    spec.n_merges = 2;
    spec.merges = unknown_part;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "merges[1]") && strstr(err.msg, "right part"), "%s", err.msg);

    static const char *const unknown_result[] = {"b a"};
    spec.n_merges = 1;
    spec.merges = unknown_result;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "merged text is not a token"), "%s", err.msg);

    static const char *const no_space[] = {"ab"};
    spec.merges = no_space;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "separated by a space"), "%s", err.msg);

    static const int32_t bad_types[] = {3, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9, 1, 1, 1, 1};
    bpe_spec(&spec);
    spec.token_types = bad_types;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "token_type[12] = 9"), "%s", err.msg);

    static const char *const empty_tok[] = {"a", "", "b"};
    bpe_spec(&spec);
    spec.n_tokens = 3;
    spec.tokens = empty_tok;
    spec.token_types = NULL;
    spec.n_merges = 0;
    spec.eos_id = -1;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "tokens[1] is empty"), "%s", err.msg);

    bpe_spec(&spec);
    spec.bos_id = 17;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "bos_token_id 17"), "%s", err.msg);
    bpe_spec(&spec);
    spec.add_bos = 1;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "no bos_token_id"), "%s", err.msg);

    spm_vocab_t v;
    spm_spec(&v, &spec);
    spec.scores = NULL;
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "without scores"), "%s", err.msg);

    /* an unknown pre-tokenizer is a warning, not an error */
    bpe_spec(&spec);
    spec.pre = "no-such-pre";
    CHECK_INT_EQ(core_tokenizer_new(&spec, &t, &err), 0);
    if (t) {
        CHECK_STR_EQ(core_tokenizer_pre_name(t), "gpt2");
        CHECK(strstr(core_tokenizer_warnings(t), "unknown pre-tokenizer \"no-such-pre\"") != NULL);
    }
    core_tokenizer_free(t);
    core_tokenizer_free(NULL);
}

/* Writes a GGUF with the tiny BPE vocabulary, minus/altered fields per mode,
 * and returns what core_tokenizer_from_gguf says about it. */
enum { GG_OK, GG_NO_TOKENS, GG_TYPE_COUNT, GG_BAD_MERGE, GG_NO_MODEL, GG_BAD_MODEL, GG_ID_RANGE };

static int from_gguf_case(int mode, core_error_t *err, core_tokenizer_t **out)
{
    char path[] = "/tmp/test_core_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -100;
    close(fd);
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    const char *model = mode == GG_BAD_MODEL ? "bert" : "gpt2";
    if (mode != GG_NO_MODEL)
        core_gguf_writer_set_str(w, "tokenizer.ggml.model", model, strlen(model));
    core_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt2", 4);
    size_t nt = sizeof bpe_tokens / sizeof bpe_tokens[0];
    if (mode != GG_NO_TOKENS)
        core_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", bpe_tokens, nt);
    core_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", CORE_GGUF_TYPE_INT32, bpe_types,
                             mode == GG_TYPE_COUNT ? nt - 1 : nt);
    static const char *const bad_merges[] = {"a b", "zz a"};
    core_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", mode == GG_BAD_MERGE ? bad_merges : bpe_merges,
                                 mode == GG_BAD_MERGE ? 2 : sizeof bpe_merges / sizeof bpe_merges[0]);
    core_gguf_writer_set_int(w, "tokenizer.ggml.eos_token_id", CORE_GGUF_TYPE_UINT32, 0);
    core_gguf_writer_set_int(w, "tokenizer.ggml.padding_token_id", CORE_GGUF_TYPE_UINT32, 0);
    core_gguf_writer_set_int(w, "tokenizer.ggml.bos_token_id", CORE_GGUF_TYPE_UINT32,
                             mode == GG_ID_RANGE ? 0xFFFFFFFFll : 0);
    core_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
    int rc = core_gguf_writer_write(w, path, err);
    core_gguf_writer_free(w);
    core_gguf_t *g = NULL;
    if (rc == 0)
        rc = core_gguf_open(path, &g, err);
    if (rc == 0)
        rc = core_tokenizer_from_gguf(g, out, err);
    core_gguf_close(g);
    unlink(path);
    return rc;
}

TEST(bad_gguf_rejected)
{
    core_error_t err = {0};
    core_tokenizer_t *t = NULL;
    CHECK_INT_EQ(from_gguf_case(GG_OK, &err, &t), 0);
    if (t) {
        ENC_EQ(t, "abc ab", 0, 7, 5, 6); /* same as the array path */
        CHECK_INT_EQ(core_tokenizer_eos(t), 0);
        CHECK_INT_EQ(core_tokenizer_bos(t), 0);
    }
    core_tokenizer_free(t);
    t = NULL;

    CHECK_INT_EQ(from_gguf_case(GG_NO_TOKENS, &err, &t), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "missing tokenizer.ggml.tokens"), "%s", err.msg);
    CHECK_INT_EQ(from_gguf_case(GG_TYPE_COUNT, &err, &t), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "token_type has 16 entries, tokenizer.ggml.tokens has 17"), "%s", err.msg);
    CHECK_INT_EQ(from_gguf_case(GG_BAD_MERGE, &err, &t), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "merges[1] \"zz a\": left part is not a token"), "%s", err.msg);
    CHECK_INT_EQ(from_gguf_case(GG_NO_MODEL, &err, &t), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "missing tokenizer.ggml.model"), "%s", err.msg);
    CHECK_INT_EQ(from_gguf_case(GG_BAD_MODEL, &err, &t), CORE_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "\"bert\""), "%s", err.msg);
    CHECK(t == NULL);
    /* files store "no id" as 0xFFFFFFFF: absent, with a warning */
    CHECK_INT_EQ(from_gguf_case(GG_ID_RANGE, &err, &t), 0);
    if (t) {
        CHECK_INT_EQ(core_tokenizer_bos(t), -1);
        CHECK(strstr(core_tokenizer_warnings(t), "bos_token_id = 4294967295 ignored") != NULL);
    }
    core_tokenizer_free(t);
}

int main(void)
{
    RUN(tiny_bpe_by_hand);
    RUN(special_longest_match);
    RUN(tiny_spm_by_hand);
    RUN(spm_unknown_without_byte_tokens);
    RUN(spm_random_bytes_round_trip);
    RUN(spm_id_count_bound);
    RUN(real_model_basics);
    RUN(real_model_round_trips);
    RUN(real_model_invalid_utf8);
    RUN(real_model_limits_and_buffers);
    RUN(stream_holds_back_partial_characters);
    RUN(spm_user_defined_spaces_match_escaped_text);
    RUN(stream_strip_prefix_spm);
    RUN(concurrent_encoding);
    RUN(bad_arrays_rejected);
    RUN(bad_gguf_rejected);
    return CHECK_DONE();
}
