/* core/text/tokenizer.c — tokenizer construction (from arrays or GGUF metadata),
 * lookups, decoding and the streaming detokenizer. Encoding lives in
 * tokenizer_encode.c. Knows nothing of HTTP or JSON; never logs.
 */
#include "core/text/tokenizer_impl.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* core_error_set returns its code; spelling the code out as the value lets
 * static analysis see that every failure path returns nonzero. */
#define TOK_FAIL(err, code, ...) (core_error_set((err), (code), __VA_ARGS__), (code))

/* ---- pre-tokenizers ----
 *
 * The regexes are those of the HF tokenizer.json files, with one deliberate
 * change: HF runs them with Oniguruma, whose \s is Unicode White_Space, while
 * PCRE2's \s (UCP) also matches U+180E. WS spells White_Space out so the two
 * engines agree on every code point (checked over all of U+0000..U+10FFFF
 * against tokenizers 0.21.1; \p{L} and \p{N} agreed as they are). */
#define WS                                                                                    \
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"      \
    "\\x{202F}\\x{205F}\\x{3000}"

#define RE_GPT2                                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS \
    "])|[" WS "]+"

/* HF's Digits pre-tokenizer (SmolLM2: individual_digits) uses Rust's
 * char::is_numeric, whose Unicode version is newer than PCRE2 10.42's tables;
 * these are the Nd/No code points it adds (found by comparing both over every
 * code point). With a newer PCRE2 they are already in \p{N}. */
#define RE_DIGIT                                                                              \
    "[\\p{N}\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-"       \
    "\\x{11F59}\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-"    \
    "\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}]"

#define RE_LLAMA3_TAIL                                                                        \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_LLAMA3                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2                                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" RE_LLAMA3_TAIL

typedef struct pre_def {
    const char *names[3];      /* tokenizer.ggml.pre values, first is canonical */
    const char *steps[3];      /* regexes applied in sequence, each splitting the
                                * previous pieces into matches and the gaps between */
    int ignore_merges;
} pre_def_t;

static const pre_def_t pre_defs[] = {
    {{"gpt2", "default", NULL}, {RE_GPT2, NULL, NULL}, 0},
    {{"llama3", "llama-bpe", NULL}, {RE_LLAMA3, NULL, NULL}, 1},
    {{"smollm", NULL, NULL}, {RE_DIGIT, RE_GPT2, NULL}, 0},
    {{"qwen2", NULL, NULL}, {RE_QWEN2, NULL, NULL}, 0},
};

static const pre_def_t *pre_find(const char *name)
{
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        for (size_t k = 0; k < 3 && pre_defs[i].names[k]; k++)
            if (strcmp(name, pre_defs[i].names[k]) == 0)
                return &pre_defs[i];
    return NULL;
}

/* ---- small helpers ---- */

static void warn(core_tokenizer_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(core_tokenizer_t *t, const char *fmt, ...)
{
    size_t used = strlen(t->warnings);
    if (used + 3 >= sizeof t->warnings)
        return;
    if (used) {
        memcpy(t->warnings + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->warnings + used, sizeof t->warnings - used, fmt, ap);
    va_end(ap);
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

size_t core_tok_utf8_len(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned char b = s[0];
    if (b < 0x80)
        return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF)
        need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0; /* overlong */
        if (b == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90; /* overlong */
        if (b == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else
        return 0;
    if (n < need || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return need;
}

/* Decodes the code point of a valid sequence of length len. */
static uint32_t utf8_cp(const unsigned char *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

size_t core_tok_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes take code points 256.. in byte order, so that every byte
 * is one visible character of the vocabulary. cp_to_byte inverts it. */
static void gpt2_byte_map(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    uint32_t next = 256;
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? (uint32_t)b : next++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static const char *tok_str(const core_tokenizer_t *t, int32_t id)
{
    return t->text + t->tok_off[id];
}

int32_t core_tok_lookup(const core_tokenizer_t *t, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t v = t->hash[i];
        if (v == 0)
            return -1;
        int32_t id = v - 1;
        if (t->tok_len[id] == n && memcmp(tok_str(t, id), s, n) == 0)
            return id;
        i = (i + 1) & t->hash_mask;
    }
}

static int merge_put(core_tokenizer_t *t, int32_t l, int32_t r, int32_t rank, int32_t id)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t i = (size_t)core_tok_hash_u64(key) & t->merge_mask;
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == key)
            return 1; /* duplicate pair: the first (lowest) rank stays */
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i].key = key;
    t->merges[i].rank = rank;
    t->merges[i].id = id;
    return 0;
}

/* ---- construction ---- */

void core_tok_spec_init(core_tok_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->model = CORE_TOK_MODEL_BPE;
    spec->bos_id = spec->eos_id = spec->eot_id = spec->eom_id = spec->unk_id = -1;
}

void core_tokenizer_free(core_tokenizer_t *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_steps; i++)
        pcre2_code_free(t->re[i]);
    free(t->text);
    free(t->tok_off);
    free(t->tok_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->eog);
    free(t->hash);
    free(t->merges);
    free(t->trie);
    free(t);
}

static size_t spec_len(const char *const *strs, const size_t *lens, int64_t i)
{
    return lens ? lens[i] : (strs[i] ? strlen(strs[i]) : 0);
}

static int compile_pre(core_tokenizer_t *t, const char *name, core_error_t *err)
{
    const pre_def_t *def = pre_find(name);
    if (!def) {
        warn(t, "unknown pre-tokenizer \"%.64s\", using gpt2", name);
        def = pre_find("gpt2");
    }
    t->pre_name = def->names[0];
    t->ignore_merges = def->ignore_merges;
    for (int i = 0; i < 3 && def->steps[i]; i++) {
        int ec;
        PCRE2_SIZE eoff;
        t->re[i] = pcre2_compile((PCRE2_SPTR)def->steps[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &ec, &eoff, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return core_error_set(err, CORE_EINVAL, "pre-tokenizer %s regex %d: %s at %zu",
                                  def->names[0], i, (const char *)msg, (size_t)eoff);
        }
        t->n_steps = i + 1;
        /* JIT is an optimisation only: without it pcre2_match interprets. */
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
    }
    return 0;
}

static int trie_add(core_tokenizer_t *t, int32_t id, int32_t *cap)
{
    const unsigned char *s = (const unsigned char *)tok_str(t, id);
    uint32_t n = t->tok_len[id];
    int32_t node = 0;
    for (uint32_t k = 0; k < n; k++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != s[k])
            c = t->trie[c].sibling;
        if (c < 0) {
            if (t->n_trie == *cap) {
                int32_t ncap = *cap * 2;
                core_tok_trie_node_t *nt = realloc(t->trie, (size_t)ncap * sizeof *nt);
                if (!nt)
                    return CORE_ENOMEM;
                t->trie = nt;
                *cap = ncap;
            }
            c = t->n_trie++;
            t->trie[c].child = -1;
            t->trie[c].id = -1;
            t->trie[c].byte = s[k];
            t->trie[c].sibling = t->trie[node].child;
            t->trie[node].child = c;
        }
        node = c;
    }
    if (t->trie[node].id < 0)
        t->trie[node].id = id; /* the same text twice: the lowest id wins */
    t->trie_first[s[0]] = 1;
    return 0;
}

static int is_special_type(uint8_t type)
{
    return type == CORE_TOK_TYPE_CONTROL || type == CORE_TOK_TYPE_UNKNOWN ||
           type == CORE_TOK_TYPE_USER_DEFINED;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Byte value of a "<0xXX>" token text, -1 if it is not one. */
static int byte_token_value(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Writes the decoded bytes of token id into o and returns their count, which
 * never exceeds the text length: each character becomes itself or one byte. */
static size_t make_piece(const core_tokenizer_t *t, int32_t id, const int16_t cp_to_byte[324], char *o)
{
    const unsigned char *s = (const unsigned char *)tok_str(t, id);
    size_t n = t->tok_len[id], w = 0;
    uint8_t type = t->types[id];
    if (is_special_type(type)) {
        memcpy(o, s, n);
        return n;
    }
    if (type == CORE_TOK_TYPE_BYTE) {
        int v = byte_token_value((const char *)s, n);
        if (v >= 0) {
            o[0] = (char)v;
            return 1;
        }
        memcpy(o, s, n);
        return n;
    }
    for (size_t i = 0; i < n;) {
        size_t cl = core_tok_utf8_len(s + i, n - i);
        if (cl == 0) { /* not UTF-8: keep the byte */
            o[w++] = (char)s[i++];
            continue;
        }
        uint32_t cp = utf8_cp(s + i, cl);
        if (t->model == CORE_TOK_MODEL_BPE && cp < 324 && cp_to_byte[cp] >= 0)
            o[w++] = (char)cp_to_byte[cp];
        else if (t->model == CORE_TOK_MODEL_SPM && cp == 0x2581)
            o[w++] = ' ';
        else {
            memcpy(o + w, s + i, cl);
            w += cl;
        }
        i += cl;
    }
    return w;
}

static const char *const eog_texts[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                        "<end_of_turn>", "<|end|>",    "<EOT>",      "<|end_of_text|>"};
static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<EOT>"};

static int check_id(int32_t id, int32_t n, const char *what, core_error_t *err)
{
    if (id < -1 || id >= n)
        return core_error_set(err, CORE_EFORMAT, "%s %d is not a token id (vocabulary of %d)", what,
                              (int)id, (int)n);
    return 0;
}

/* The spec's counts and arrays, before anything is allocated. */
static int spec_check(const core_tok_spec_t *spec, core_error_t *err)
{
    if (!spec || (spec->model != CORE_TOK_MODEL_BPE && spec->model != CORE_TOK_MODEL_SPM))
        return TOK_FAIL(err, CORE_EINVAL, "tokenizer spec: unknown model kind");
    if (spec->n_tokens <= 0 || !spec->tokens)
        return TOK_FAIL(err, CORE_EFORMAT, "tokenizer has no tokens");
    if (spec->n_tokens > CORE_TOK_MAX_VOCAB)
        return TOK_FAIL(err, CORE_ERANGE, "tokenizer has %lld tokens, limit %lld",
                        (long long)spec->n_tokens, (long long)CORE_TOK_MAX_VOCAB);
    if (spec->model == CORE_TOK_MODEL_SPM && !spec->scores)
        return TOK_FAIL(err, CORE_EFORMAT, "SentencePiece tokenizer without scores");
    if (spec->model == CORE_TOK_MODEL_BPE && (spec->n_merges < 0 || (spec->n_merges > 0 && !spec->merges)))
        return TOK_FAIL(err, CORE_EFORMAT, "BPE tokenizer without a merges array");
    if (spec->model == CORE_TOK_MODEL_BPE && spec->n_merges > CORE_TOK_MAX_MERGES)
        return TOK_FAIL(err, CORE_ERANGE, "tokenizer has %lld merges, limit %lld",
                        (long long)spec->n_merges, (long long)CORE_TOK_MAX_MERGES);
    return 0;
}

/* Token texts, types, the lookup hash and (SPM) scores: validated, then
 * copied into one arena that the pieces follow; *off is where they start. */
static int load_vocab(core_tokenizer_t *t, const core_tok_spec_t *spec, size_t *off,
                      core_error_t *err)
{
    const int32_t n = t->n_vocab;
    size_t text_bytes = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = spec_len(spec->tokens, spec->token_lens, i);
        if (!spec->tokens[i] || l == 0)
            return TOK_FAIL(err, CORE_EFORMAT, "tokenizer.ggml.tokens[%d] is empty", (int)i);
        if (l > CORE_TOK_MAX_TOKEN_LEN)
            return TOK_FAIL(err, CORE_EFORMAT, "tokenizer.ggml.tokens[%d] is %zu bytes, limit %d",
                            (int)i, l, CORE_TOK_MAX_TOKEN_LEN);
        text_bytes += l;
        if (spec->token_types && (spec->token_types[i] < 0 || spec->token_types[i] > 6))
            return TOK_FAIL(err, CORE_EFORMAT,
                            "tokenizer.ggml.token_type[%d] = %d is not a token type", (int)i,
                            (int)spec->token_types[i]);
    }
    /* texts, then pieces, which are never longer than their text (make_piece) */
    t->text = malloc(text_bytes * 2 + 1);
    t->tok_off = malloc((size_t)n * sizeof *t->tok_off);
    t->tok_len = malloc((size_t)n * sizeof *t->tok_len);
    t->piece_off = malloc((size_t)n * sizeof *t->piece_off);
    t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
    t->types = malloc((size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->hash_mask = pow2_at_least((size_t)n * 2) - 1;
    t->hash = calloc(t->hash_mask + 1, sizeof *t->hash);
    if (!t->text || !t->tok_off || !t->tok_len || !t->piece_off || !t->piece_len || !t->types ||
        !t->eog || !t->hash)
        return TOK_FAIL(err, CORE_ENOMEM, "out of memory for a vocabulary of %d tokens", (int)n);
    *off = 0;
    int n_dup = 0;
    int32_t first_dup = -1;
    for (int32_t i = 0; i < n; i++) {
        size_t l = spec_len(spec->tokens, spec->token_lens, i);
        memcpy(t->text + *off, spec->tokens[i], l);
        t->tok_off[i] = *off;
        t->tok_len[i] = (uint32_t)l;
        *off += l;
        t->types[i] = spec->token_types ? (uint8_t)spec->token_types[i] : CORE_TOK_TYPE_NORMAL;
        if (core_tok_lookup(t, tok_str(t, i), l) >= 0) {
            if (n_dup++ == 0)
                first_dup = i;
            continue;
        }
        size_t h = (size_t)hash_bytes(tok_str(t, i), l) & t->hash_mask;
        while (t->hash[h])
            h = (h + 1) & t->hash_mask;
        t->hash[h] = i + 1;
    }
    if (n_dup)
        warn(t, "%d token texts occur more than once (first at id %d); lookups use the lowest id",
             n_dup, (int)first_dup);

    if (spec->model == CORE_TOK_MODEL_SPM) {
        t->scores = malloc((size_t)n * sizeof *t->scores);
        if (!t->scores)
            return TOK_FAIL(err, CORE_ENOMEM, "out of memory for scores");
        memcpy(t->scores, spec->scores, (size_t)n * sizeof *t->scores);
    }
    return 0;
}

/* Special ids, the add_* flags and the end-of-generation set. */
static int set_specials(core_tokenizer_t *t, const core_tok_spec_t *spec, core_error_t *err)
{
    const int32_t n = t->n_vocab;
    int rc;
    if ((rc = check_id(spec->bos_id, n, "bos_token_id", err)) ||
        (rc = check_id(spec->eos_id, n, "eos_token_id", err)) ||
        (rc = check_id(spec->eot_id, n, "eot_token_id", err)) ||
        (rc = check_id(spec->eom_id, n, "eom_token_id", err)) ||
        (rc = check_id(spec->unk_id, n, "unknown_token_id", err)))
        return rc;
    t->bos = spec->bos_id;
    t->eos = spec->eos_id;
    t->eot = spec->eot_id;
    t->eom = spec->eom_id;
    t->unk = spec->unk_id;
    t->add_bos = spec->add_bos != 0;
    t->add_eos = spec->add_eos != 0;
    t->add_space_prefix = spec->add_space_prefix != 0;
    if (t->add_bos && t->bos < 0)
        return TOK_FAIL(err, CORE_EFORMAT, "add_bos_token is set but there is no bos_token_id");
    if (t->add_eos && t->eos < 0)
        return TOK_FAIL(err, CORE_EFORMAT, "add_eos_token is set but there is no eos_token_id");
    if (t->model == CORE_TOK_MODEL_BPE && t->add_space_prefix) {
        warn(t, "add_space_prefix is ignored for gpt2 (byte-level BPE) vocabularies");
        t->add_space_prefix = 0;
    }
    if (t->eot < 0) {
        for (size_t k = 0; k < sizeof eot_texts / sizeof eot_texts[0] && t->eot < 0; k++) {
            int32_t id = core_tok_lookup(t, eot_texts[k], strlen(eot_texts[k]));
            if (id >= 0 && t->types[id] == CORE_TOK_TYPE_CONTROL)
                t->eot = id;
        }
    }
    for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
        int32_t id = core_tok_lookup(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && (t->types[id] == CORE_TOK_TYPE_CONTROL || t->types[id] == CORE_TOK_TYPE_USER_DEFINED))
            t->eog[id] = 1;
    }
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (t->eot >= 0)
        t->eog[t->eot] = 1;
    if (t->eom >= 0)
        t->eog[t->eom] = 1;
    return 0;
}

/* The token of each byte (-1: none) and the code point -> byte map of the
 * byte-level BPE alphabet into cp_to_byte; warns about missing bytes. */
static void find_byte_tokens(core_tokenizer_t *t, const core_tok_spec_t *spec,
                             int16_t cp_to_byte[324])
{
    gpt2_byte_map(t->byte_cp, cp_to_byte);
    int missing = 0;
    char missing_list[96] = "";
    for (int b = 0; b < 256; b++) {
        char sym[8];
        size_t sl;
        int32_t id;
        if (t->model == CORE_TOK_MODEL_BPE) {
            sl = core_tok_utf8_put(t->byte_cp[b], sym);
            id = core_tok_lookup(t, sym, sl);
        } else {
            sl = (size_t)snprintf(sym, sizeof sym, "<0x%02X>", b);
            id = core_tok_lookup(t, sym, sl);
            if (id >= 0 && t->types[id] != CORE_TOK_TYPE_BYTE && spec->token_types)
                id = -1;
        }
        t->byte_tok[b] = id;
        if (id < 0) {
            size_t ml = strlen(missing_list);
            if (missing < 8 && ml + 6 < sizeof missing_list)
                snprintf(missing_list + ml, sizeof missing_list - ml, "%s0x%02X", missing ? " " : "", b);
            missing++;
        }
    }
    if (missing && t->model == CORE_TOK_MODEL_BPE)
        warn(t, "%d bytes have no byte-level symbol in the vocabulary (%s%s) and are dropped when "
                "encoding", missing, missing_list, missing > 8 ? " ..." : "");
    else if (missing && missing < 256)
        warn(t, "%d bytes have no <0xXX> token (%s%s); characters needing them encode as unk",
             missing, missing_list, missing > 8 ? " ..." : "");
}

/* The trie of special tokens (control, user-defined), matched before any
 * other rule when encoding parses specials. */
static int build_trie(core_tokenizer_t *t, core_error_t *err)
{
    int32_t trie_cap = 64;
    t->trie = malloc((size_t)trie_cap * sizeof *t->trie);
    if (!t->trie)
        return TOK_FAIL(err, CORE_ENOMEM, "out of memory for special tokens");
    t->n_trie = 1;
    t->trie[0].child = t->trie[0].sibling = t->trie[0].id = -1;
    t->trie[0].byte = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (is_special_type(t->types[i]) && trie_add(t, i, &trie_cap) != 0)
            return TOK_FAIL(err, CORE_ENOMEM, "out of memory for special tokens");
    return 0;
}

/* BPE: the merges table (each "left right" must name two tokens whose
 * concatenation is a token). */
static int load_merges(core_tokenizer_t *t, const core_tok_spec_t *spec, core_error_t *err)
{
    int rc = 0;
    t->n_merges = spec->n_merges;
    t->merge_mask = pow2_at_least((size_t)spec->n_merges * 2 + 1) - 1;
    t->merges = malloc((t->merge_mask + 1) * sizeof *t->merges);
    char *cat = malloc(2 * CORE_TOK_MAX_TOKEN_LEN + 1);
    if (!t->merges || !cat) {
        rc = core_error_set(err, CORE_ENOMEM, "out of memory for %lld merges", (long long)spec->n_merges);
        goto out;
    }
    for (size_t i = 0; i <= t->merge_mask; i++)
        t->merges[i].key = UINT64_MAX;
    int n_dup_merges = 0;
    for (int64_t i = 0; i < spec->n_merges; i++) {
        const char *m = spec->merges[i];
        size_t ml = spec_len(spec->merges, spec->merge_lens, i);
        const char *sp = ml > 1 && m ? memchr(m + 1, ' ', ml - 1) : NULL;
        if (!sp || sp + 1 == m + ml) {
            rc = core_error_set(err, CORE_EFORMAT,
                                "tokenizer.ggml.merges[%lld] \"%.*s\" is not two tokens separated by a space",
                                (long long)i, (int)(ml < 64 ? ml : 64), m ? m : "");
            goto out;
        }
        size_t ll = (size_t)(sp - m), rl = ml - ll - 1;
        int32_t l = core_tok_lookup(t, m, ll);
        int32_t r = core_tok_lookup(t, sp + 1, rl);
        if (l < 0 || r < 0) {
            rc = core_error_set(err, CORE_EFORMAT,
                                "tokenizer.ggml.merges[%lld] \"%.*s\": %s part is not a token",
                                (long long)i, (int)(ml < 64 ? ml : 64), m, l < 0 ? "left" : "right");
            goto out;
        }
        if (ll + rl > 2 * (size_t)CORE_TOK_MAX_TOKEN_LEN) {
            rc = core_error_set(err, CORE_EFORMAT, "tokenizer.ggml.merges[%lld] is too long", (long long)i);
            goto out;
        }
        memcpy(cat, m, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t id = core_tok_lookup(t, cat, ll + rl);
        if (id < 0) {
            rc = core_error_set(err, CORE_EFORMAT,
                                "tokenizer.ggml.merges[%lld] \"%.*s\": the merged text is not a token",
                                (long long)i, (int)(ml < 64 ? ml : 64), m);
            goto out;
        }
        n_dup_merges += merge_put(t, l, r, (int32_t)i, id);
    }
    if (n_dup_merges)
        warn(t, "%d merges repeat an earlier pair; the first rank is used", n_dup_merges);
out:
    free(cat);
    return rc;
}

int core_tokenizer_new(const core_tok_spec_t *spec, core_tokenizer_t **out, core_error_t *err)
{
    *out = NULL;
    int rc = spec_check(spec, err);
    if (rc)
        return rc;
    core_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t)
        return core_error_set(err, CORE_ENOMEM, "out of memory for tokenizer");
    t->model = spec->model;
    t->n_vocab = (int32_t)spec->n_tokens;
    size_t off = 0;
    int16_t cp_to_byte[324];
    if ((rc = load_vocab(t, spec, &off, err)) || (rc = set_specials(t, spec, err)))
        goto fail;
    find_byte_tokens(t, spec, cp_to_byte);

    /* pieces, after the texts in the arena */
    t->max_piece_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t pl = make_piece(t, i, cp_to_byte, t->text + off);
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)pl;
        off += pl;
        if (pl > t->max_piece_len)
            t->max_piece_len = pl;
    }

    if ((rc = build_trie(t, err)))
        goto fail;
    if (t->model == CORE_TOK_MODEL_BPE) {
        if ((rc = load_merges(t, spec, err)) ||
            (rc = compile_pre(t, spec->pre ? spec->pre : "default", err)) != 0)
            goto fail;
    } else {
        t->pre_name = "spm";
    }

    *out = t;
    return 0;
fail:
    core_tokenizer_free(t);
    return rc;
}

/* ---- GGUF ---- */

static int get_opt_int(const core_gguf_t *g, const char *key, int64_t *v, int *present, core_error_t *err)
{
    int rc = core_gguf_get_int(g, key, v, err);
    *present = rc == 0;
    return rc == CORE_ENOTFOUND ? 0 : rc;
}

static int get_opt_bool(const core_gguf_t *g, const char *key, int *v, core_error_t *err)
{
    int b = 0;
    int rc = core_gguf_get_bool(g, key, &b, err);
    if (rc == 0)
        *v = b != 0;
    return rc == CORE_ENOTFOUND ? 0 : rc;
}

static int read_str_array(const char *key, core_gguf_arr_t *arr,
                          const char ***strs, size_t **lens, core_error_t *err)
{
    if (arr->type != CORE_GGUF_TYPE_STRING)
        return core_error_set(err, CORE_EFORMAT, "%s is not an array of strings", key);
    if (arr->n > (uint64_t)CORE_TOK_MAX_MERGES)
        return core_error_set(err, CORE_ERANGE, "%s has %llu entries, too many", key,
                              (unsigned long long)arr->n);
    *strs = malloc((arr->n ? arr->n : 1) * sizeof **strs);
    *lens = malloc((arr->n ? arr->n : 1) * sizeof **lens);
    if (!*strs || !*lens)
        return core_error_set(err, CORE_ENOMEM, "out of memory reading %s", key);
    for (uint64_t i = 0; i < arr->n; i++) {
        core_gguf_str_t s;
        int rc = core_gguf_arr_str(arr, i, &s);
        if (rc)
            return core_error_set(err, CORE_EFORMAT, "%s[%llu] is unreadable", key, (unsigned long long)i);
        if (s.len > CORE_TOK_MAX_TOKEN_LEN * 2 + 1)
            return core_error_set(err, CORE_EFORMAT, "%s[%llu] is %llu bytes long", key,
                                  (unsigned long long)i, (unsigned long long)s.len);
        (*strs)[i] = s.ptr;
        (*lens)[i] = (size_t)s.len;
    }
    return 0;
}

/* tokenizer.ggml.model into spec->model and the pre-tokenizer name (pre,
 * else tokenizer.ggml.pre copied into pre_name[64], else none). */
static int gguf_model_kind(const core_gguf_t *g, const char *pre, core_tok_spec_t *spec,
                           char pre_name[64], core_error_t *err)
{
    char model[32];
    core_gguf_str_t s;
    int rc;
    rc = core_gguf_get_str(g, "tokenizer.ggml.model", &s, err);
    if (rc == CORE_ENOTFOUND)
        return TOK_FAIL(err, CORE_EFORMAT, "missing tokenizer.ggml.model");
    if (rc)
        return rc;
    if (s.len >= sizeof model)
        s.len = sizeof model - 1;
    memcpy(model, s.ptr, (size_t)s.len);
    model[s.len] = 0;
    if (strcmp(model, "gpt2") == 0)
        spec->model = CORE_TOK_MODEL_BPE;
    else if (strcmp(model, "llama") == 0)
        spec->model = CORE_TOK_MODEL_SPM;
    else
        return TOK_FAIL(err, CORE_EUNSUPPORTED,
                        "tokenizer.ggml.model \"%s\" is not supported (gpt2, llama)", model);

    if (pre) {
        spec->pre = pre;
    } else {
        rc = core_gguf_get_str(g, "tokenizer.ggml.pre", &s, err);
        if (rc && rc != CORE_ENOTFOUND)
            return rc;
        if (rc == 0) {
            if (s.len >= 64)
                s.len = 63;
            memcpy(pre_name, s.ptr, (size_t)s.len);
            pre_name[s.len] = 0;
            spec->pre = pre_name;
        }
    }
    return 0;
}

/* tokenizer.ggml.token_type, when present, into *types (new; the caller
 * frees it) and spec->token_types. */
static int gguf_token_types(const core_gguf_t *g, core_tok_spec_t *spec, int32_t **types,
                            core_error_t *err)
{
    core_gguf_arr_t arr;
    int rc = core_gguf_get_arr(g, "tokenizer.ggml.token_type", &arr, err);
    if (rc == CORE_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    if (arr.n != (uint64_t)spec->n_tokens)
        return TOK_FAIL(err, CORE_EFORMAT,
                        "tokenizer.ggml.token_type has %llu entries, tokenizer.ggml.tokens has %lld",
                        (unsigned long long)arr.n, (long long)spec->n_tokens);
    *types = malloc((size_t)arr.n * sizeof **types);
    if (!*types)
        return TOK_FAIL(err, CORE_ENOMEM, "out of memory for token types");
    for (uint64_t i = 0; i < arr.n; i++) {
        int64_t v;
        if (core_gguf_arr_int(&arr, i, &v) != 0 || v < INT32_MIN || v > INT32_MAX)
            return TOK_FAIL(err, CORE_EFORMAT, "tokenizer.ggml.token_type[%llu] is not an integer",
                            (unsigned long long)i);
        (*types)[i] = (int32_t)v;
    }
    spec->token_types = *types;
    return 0;
}

/* tokenizer.ggml.scores of a llama vocabulary into *scores (new; the caller
 * frees it) and spec->scores; other vocabularies ignore them. */
static int gguf_scores(const core_gguf_t *g, core_tok_spec_t *spec, float **scores,
                       core_error_t *err)
{
    core_gguf_arr_t arr;
    int rc = core_gguf_get_arr(g, "tokenizer.ggml.scores", &arr, err);
    if (rc == CORE_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    if (spec->model != CORE_TOK_MODEL_SPM)
        return 0;
    if (arr.n != (uint64_t)spec->n_tokens)
        return TOK_FAIL(err, CORE_EFORMAT,
                        "tokenizer.ggml.scores has %llu entries, tokenizer.ggml.tokens has %lld",
                        (unsigned long long)arr.n, (long long)spec->n_tokens);
    *scores = malloc((size_t)arr.n * sizeof **scores);
    if (!*scores)
        return TOK_FAIL(err, CORE_ENOMEM, "out of memory for scores");
    for (uint64_t i = 0; i < arr.n; i++) {
        double v;
        if (core_gguf_arr_float(&arr, i, &v) != 0)
            return TOK_FAIL(err, CORE_EFORMAT, "tokenizer.ggml.scores[%llu] is not a number",
                            (unsigned long long)i);
        (*scores)[i] = (float)v;
    }
    spec->scores = *scores;
    return 0;
}

/* The special ids and add_* flags: the vocabulary kind's defaults, then the
 * file's keys; an id outside the vocabulary is dropped with a note in
 * note[note_cap]. */
static int gguf_special_ids(const core_gguf_t *g, core_tok_spec_t *spec, char *note,
                            size_t note_cap, core_error_t *err)
{
    spec->add_bos = spec->model == CORE_TOK_MODEL_SPM;
    spec->add_space_prefix = spec->model == CORE_TOK_MODEL_SPM;
    if (spec->model == CORE_TOK_MODEL_SPM && spec->n_tokens > 2) {
        spec->unk_id = 0;
        spec->bos_id = 1;
        spec->eos_id = 2;
    }
    static const struct {
        const char *key;
        size_t field;
    } id_keys[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(core_tok_spec_t, bos_id)},
        {"tokenizer.ggml.eos_token_id", offsetof(core_tok_spec_t, eos_id)},
        {"tokenizer.ggml.eot_token_id", offsetof(core_tok_spec_t, eot_id)},
        {"tokenizer.ggml.eom_token_id", offsetof(core_tok_spec_t, eom_id)},
        {"tokenizer.ggml.unknown_token_id", offsetof(core_tok_spec_t, unk_id)},
    };
    for (size_t k = 0; k < sizeof id_keys / sizeof id_keys[0]; k++) {
        int64_t v;
        int present;
        int rc = get_opt_int(g, id_keys[k].key, &v, &present, err);
        if (rc)
            return rc;
        if (!present)
            continue;
        int32_t *field = (int32_t *)((char *)spec + id_keys[k].field);
        if (v < 0 || v >= spec->n_tokens) {
            size_t nl = strlen(note);
            snprintf(note + nl, note_cap - nl, "%s%s = %lld ignored", nl ? "; " : "",
                     id_keys[k].key + 15, (long long)v);
            *field = -1;
        } else {
            *field = (int32_t)v;
        }
    }
    int rc;
    if ((rc = get_opt_bool(g, "tokenizer.ggml.add_bos_token", &spec->add_bos, err)) ||
        (rc = get_opt_bool(g, "tokenizer.ggml.add_eos_token", &spec->add_eos, err)) ||
        (rc = get_opt_bool(g, "tokenizer.ggml.add_space_prefix", &spec->add_space_prefix, err)))
        return rc;
    return 0;

}

int core_tokenizer_from_gguf_pre(const core_gguf_t *g, const char *pre, core_tokenizer_t **out,
                                 core_error_t *err)
{
    *out = NULL;
    core_tok_spec_t spec;
    core_tok_spec_init(&spec);
    const char **tokens = NULL, **merges = NULL;
    size_t *token_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    char pre_name[64];
    char note[256] = "";
    core_gguf_arr_t arr;
    int rc = gguf_model_kind(g, pre, &spec, pre_name, err);
    if (rc)
        return rc;

    rc = core_gguf_get_arr(g, "tokenizer.ggml.tokens", &arr, err);
    if (rc == CORE_ENOTFOUND) {
        rc = core_error_set(err, CORE_EFORMAT, "missing tokenizer.ggml.tokens");
        goto done;
    }
    if (rc)
        goto done;
    if (arr.n == 0 || arr.n > (uint64_t)CORE_TOK_MAX_VOCAB) {
        rc = core_error_set(err, CORE_EFORMAT, "tokenizer.ggml.tokens has %llu entries",
                            (unsigned long long)arr.n);
        goto done;
    }
    if ((rc = read_str_array("tokenizer.ggml.tokens", &arr, &tokens, &token_lens, err)))
        goto done;
    spec.n_tokens = (int64_t)arr.n;
    spec.tokens = tokens;
    spec.token_lens = token_lens;

    if ((rc = gguf_token_types(g, &spec, &types, err)) || (rc = gguf_scores(g, &spec, &scores, err)))
        goto done;
    if (spec.model == CORE_TOK_MODEL_SPM && !spec.scores) {
        rc = core_error_set(err, CORE_EFORMAT, "missing tokenizer.ggml.scores for a llama vocabulary");
        goto done;
    }

    if (spec.model == CORE_TOK_MODEL_BPE) {
        rc = core_gguf_get_arr(g, "tokenizer.ggml.merges", &arr, err);
        if (rc == CORE_ENOTFOUND) {
            rc = core_error_set(err, CORE_EFORMAT, "missing tokenizer.ggml.merges for a gpt2 vocabulary");
            goto done;
        }
        if (rc)
            goto done;
        if ((rc = read_str_array("tokenizer.ggml.merges", &arr, &merges, &merge_lens, err)))
            goto done;
        spec.n_merges = (int64_t)arr.n;
        spec.merges = merges;
        spec.merge_lens = merge_lens;
    }

    if ((rc = gguf_special_ids(g, &spec, note, sizeof note, err)))
        goto done;

    rc = core_tokenizer_new(&spec, out, err);
    if (rc == 0 && note[0])
        warn(*out, "%s", note);
done:
    free(tokens);
    free(token_lens);
    free(merges);
    free(merge_lens);
    free(scores);
    free(types);
    return rc;
}

int core_tokenizer_from_gguf(const core_gguf_t *g, core_tokenizer_t **out, core_error_t *err)
{
    return core_tokenizer_from_gguf_pre(g, NULL, out, err);
}

/* ---- properties ---- */

int32_t core_tokenizer_n_vocab(const core_tokenizer_t *t) { return t->n_vocab; }
core_tok_model_t core_tokenizer_model(const core_tokenizer_t *t) { return t->model; }
const char *core_tokenizer_pre_name(const core_tokenizer_t *t) { return t->pre_name; }
int32_t core_tokenizer_bos(const core_tokenizer_t *t) { return t->bos; }
int32_t core_tokenizer_eos(const core_tokenizer_t *t) { return t->eos; }
int32_t core_tokenizer_eot(const core_tokenizer_t *t) { return t->eot; }
const char *core_tokenizer_warnings(const core_tokenizer_t *t) { return t->warnings; }

int core_tokenizer_is_eog(const core_tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

core_tok_type_t core_tokenizer_token_type(const core_tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? (core_tok_type_t)t->types[id] : CORE_TOK_TYPE_UNDEFINED;
}

int32_t core_tokenizer_find(const core_tokenizer_t *t, const char *text, size_t len)
{
    return text || len == 0 ? core_tok_lookup(t, text ? text : "", len) : -1;
}

/* ---- decoding ---- */

const char *core_tokenizer_piece(const core_tokenizer_t *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    *len = t->piece_len[id];
    return t->text + t->piece_off[id];
}

/* The piece decoding emits for id under flags (empty for unrendered specials). */
static const char *emitted_piece(const core_tokenizer_t *t, int32_t id, unsigned flags, size_t *len)
{
    uint8_t type = t->types[id];
    if (!(flags & CORE_TOK_DECODE_SPECIAL) &&
        (type == CORE_TOK_TYPE_CONTROL || type == CORE_TOK_TYPE_UNKNOWN)) {
        *len = 0;
        return "";
    }
    *len = t->piece_len[id];
    return t->text + t->piece_off[id];
}

int core_tokenizer_token_to_piece(const core_tokenizer_t *t, int32_t id, unsigned flags, char *out,
                                  size_t cap, size_t *n_out, core_error_t *err)
{
    *n_out = 0;
    if (id < 0 || id >= t->n_vocab)
        return core_error_set(err, CORE_EINVAL, "token id %d out of range (vocabulary of %d)", (int)id,
                              (int)t->n_vocab);
    size_t len;
    const char *p = emitted_piece(t, id, flags, &len);
    *n_out = len;
    if (len > cap)
        return core_error_set(err, CORE_ERANGE, "piece of token %d needs %zu bytes, buffer has %zu",
                              (int)id, len, cap);
    if (len)
        memcpy(out, p, len);
    return 0;
}

static int strips_prefix(const core_tokenizer_t *t, unsigned flags)
{
    return (flags & CORE_TOK_DECODE_STRIP_PREFIX) && t->model == CORE_TOK_MODEL_SPM && t->add_space_prefix;
}

int core_tokenizer_decode(const core_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                          char *out, size_t cap, size_t *n_out, core_error_t *err)
{
    *n_out = 0;
    size_t w = 0;
    int strip = strips_prefix(t, flags);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return core_error_set(err, CORE_EINVAL, "ids[%zu] = %d is not a token id (vocabulary of %d)",
                                  i, (int)ids[i], (int)t->n_vocab);
        size_t len;
        const char *p = emitted_piece(t, ids[i], flags, &len);
        if (strip && len) {
            if (p[0] == ' ') {
                p++;
                len--;
            }
            strip = 0;
        }
        if (w < cap)
            memcpy(out + w, p, len < cap - w ? len : cap - w);
        w += len;
    }
    *n_out = w;
    if (w > cap)
        return core_error_set(err, CORE_ERANGE, "decoded text needs %zu bytes, buffer has %zu", w, cap);
    return 0;
}

/* ---- streaming detokenizer ---- */

void core_tok_stream_init(core_tok_stream_t *s, const core_tokenizer_t *t, unsigned flags)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
    s->strip_pending = strips_prefix(t, flags);
}

size_t core_tok_stream_max_out(const core_tokenizer_t *t)
{
    /* every byte (held-back ones included) may turn into a 3-byte U+FFFD */
    return 3 * (t->max_piece_len + 4);
}

static size_t put_fffd(char *o)
{
    o[0] = (char)0xEF;
    o[1] = (char)0xBF;
    o[2] = (char)0xBD;
    return 3;
}

/* Feeds one byte; appends whatever became complete to o. */
static size_t stream_byte(core_tok_stream_t *s, unsigned char b, char *o)
{
    size_t w = 0;
    if (s->n_pend) {
        unsigned char lo = 0x80, hi = 0xBF;
        if (s->n_pend == 1) {
            unsigned char lead = s->pend[0];
            if (lead == 0xE0)
                lo = 0xA0;
            else if (lead == 0xED)
                hi = 0x9F;
            else if (lead == 0xF0)
                lo = 0x90;
            else if (lead == 0xF4)
                hi = 0x8F;
        }
        if (b >= lo && b <= hi) {
            s->pend[s->n_pend++] = b;
            if (s->n_pend == s->n_need) {
                memcpy(o, s->pend, s->n_pend);
                w = s->n_pend;
                s->n_pend = 0;
            }
            return w;
        }
        /* the held-back bytes are a maximal invalid subpart; b starts afresh */
        w += put_fffd(o);
        s->n_pend = 0;
    }
    if (b < 0x80) {
        o[w++] = (char)b;
    } else if (b >= 0xC2 && b <= 0xDF) {
        s->pend[0] = b;
        s->n_pend = 1;
        s->n_need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        s->pend[0] = b;
        s->n_pend = 1;
        s->n_need = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
        s->pend[0] = b;
        s->n_pend = 1;
        s->n_need = 4;
    } else {
        w += put_fffd(o + w);
    }
    return w;
}

int core_tok_stream_push(core_tok_stream_t *s, int32_t id, char *out, size_t cap, size_t *n_out,
                         core_error_t *err)
{
    const core_tokenizer_t *t = s->t;
    *n_out = 0;
    if (id < 0 || id >= t->n_vocab)
        return core_error_set(err, CORE_EINVAL, "token id %d out of range (vocabulary of %d)", (int)id,
                              (int)t->n_vocab);
    if (cap < core_tok_stream_max_out(t))
        return core_error_set(err, CORE_ERANGE, "stream output buffer of %zu bytes, need %zu", cap,
                              core_tok_stream_max_out(t));
    size_t len, w = 0;
    const unsigned char *p = (const unsigned char *)emitted_piece(t, id, s->flags, &len);
    if (s->strip_pending && len) {
        if (p[0] == ' ') {
            p++;
            len--;
        }
        s->strip_pending = 0;
    }
    for (size_t i = 0; i < len; i++)
        w += stream_byte(s, p[i], out + w);
    *n_out = w;
    return 0;
}

int core_tok_stream_flush(core_tok_stream_t *s, char *out, size_t cap, size_t *n_out, core_error_t *err)
{
    *n_out = 0;
    if (s->n_pend) {
        if (cap < 3)
            return core_error_set(err, CORE_ERANGE, "stream output buffer of %zu bytes, need 3", cap);
        *n_out = put_fffd(out);
        s->n_pend = 0;
    }
    return 0;
}
