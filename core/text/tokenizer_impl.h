/* core/text/tokenizer_impl.h — private layout of core_tokenizer_t, shared by
 * tokenizer.c (construction, decoding) and tokenizer_encode.c (encoding).
 * Nothing outside core/tokenizer*.c includes this.
 */
#ifndef DARKSERVE_CORE_TOKENIZER_IMPL_H
#define DARKSERVE_CORE_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/text/tokenizer.h"

#define CORE_TOK_MAX_PRE_STEPS 8

/* One node of the byte trie over the texts of CONTROL, UNKNOWN and
 * USER_DEFINED tokens; children are a sibling list (few specials share a
 * prefix, so a scan is cheaper than a 256-way table). */
typedef struct core_tok_trie_node {
    int32_t child;   /* first child, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t id;      /* token ending here, -1 none */
    unsigned char byte;
} core_tok_trie_node_t;

/* (left id, right id) -> (rank, merged id), open addressing. */
typedef struct core_tok_merge_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;
} core_tok_merge_slot_t;

struct core_tokenizer {
    core_tok_model_t model;
    int32_t n_vocab;                /* V */

    char *text;                     /* all token texts, then all pieces */
    size_t *tok_off;                /* [V] offset of token text in text */
    uint32_t *tok_len;              /* [V] */
    size_t *piece_off;              /* [V] offset of decoded bytes in text */
    uint32_t *piece_len;            /* [V] */
    float *scores;                  /* [V], SPM only (NULL for BPE) */
    uint8_t *types;                 /* [V] core_tok_type_t */
    uint8_t *eog;                   /* [V] 1 = ends generation */
    size_t max_piece_len;

    int32_t *hash;                  /* [hash_mask + 1] id + 1, 0 = empty */
    size_t hash_mask;

    core_tok_merge_slot_t *merges;  /* BPE: [merge_mask + 1] */
    size_t merge_mask;
    int64_t n_merges;

    uint32_t byte_cp[256];          /* GPT-2 byte-to-unicode code point of each byte */
    int32_t byte_tok[256];          /* BPE: id of the byte-level symbol of each byte;
                                     * SPM: id of <0xXX>; -1 if the vocabulary has none */

    core_tok_trie_node_t *trie;     /* [n_trie], node 0 is the root */
    int32_t n_trie;
    uint8_t trie_first[256];        /* 1 if some special text starts with that byte */

    const char *pre_name;           /* static */
    int n_steps;                    /* pre-tokenizer regexes, applied in sequence */
    pcre2_code *re[CORE_TOK_MAX_PRE_STEPS];
    int ignore_merges;              /* a piece that is itself a token is not merged (llama3) */

    int32_t bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix;

    char warnings[CORE_ERROR_MSG_MAX];
};

/* Lookup of an exact token text; -1 if absent. */
int32_t core_tok_lookup(const core_tokenizer_t *t, const char *s, size_t n);
/* Length of the valid UTF-8 character at s[0..n), 0 if s does not start one
 * (PCRE2's definition: no overlongs, no surrogates, nothing above U+10FFFF). */
size_t core_tok_utf8_len(const unsigned char *s, size_t n);
/* Writes code point cp (< 0x10000) as UTF-8 into o; returns 1..3. */
size_t core_tok_utf8_put(uint32_t cp, char *o);
/* Mixer for the (left, right) merge key. */
static inline uint64_t core_tok_hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* 1 if merges may produce token id and a symbol may resolve to it: NORMAL,
 * USER_DEFINED or UNDEFINED (never CONTROL, UNKNOWN, BYTE or UNUSED, as in
 * SentencePiece). */
static inline int core_tok_mergeable(const core_tokenizer_t *t, int32_t id)
{
    uint8_t ty = t->types[id];
    return ty == CORE_TOK_TYPE_NORMAL || ty == CORE_TOK_TYPE_USER_DEFINED || ty == CORE_TOK_TYPE_UNDEFINED;
}

#endif
