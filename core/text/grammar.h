/* core/text/grammar.h — grammar-constrained decoding: which tokens may come next.
 *
 * A grammar is a text in a GBNF-like form (docs/GRAMMAR.md is the reference:
 * rules `name ::= alternatives`, literals "...", character classes [a-z]
 * [^...], `.`, groups ( ), repetition * + ? {m} {m,} {m,n} {,n}, rule
 * references, # comments). The language is a set of byte strings; character
 * classes and `.` stand for Unicode code points in UTF-8, so every string of
 * the language is valid UTF-8, while a token may end or begin inside a
 * character.
 *
 * Four objects:
 *   core_grammar_vocab_t  the token byte strings of one model, arranged as a
 *                         byte trie. Built once per model; immutable, shared
 *                         read-only by every grammar and thread.
 *   core_grammar_t        one compiled grammar (parsed, checked, bound to a
 *                         vocabulary). Compiled once per request, shared by
 *                         the sequences that use it. It fills a table per
 *                         grammar position on first use (the tokens that
 *                         position accepts on its own, see grammar.c); that
 *                         fill is locked, so sequences on several threads may
 *                         share one grammar.
 *   core_grammar_state_t  where one sequence is in the grammar: a plain
 *                         caller-owned value (the parse stacks in one
 *                         buffer), copied with core_grammar_state_copy (fork)
 *                         and freed with core_grammar_state_clear.
 *   core_grammar_ws_t     scratch memory for mask and accept calls; one per
 *                         thread (the scheduler's), shared by its sequences.
 *
 * Per sampled token: core_grammar_mask() sets the bit of every token that can
 * continue the text so far to a prefix of some string of the language (an
 * end-of-generation token only where the text so far is in the language);
 * the sampler drops the others (core_sampler_sample_masked); then
 * core_grammar_accept() advances the state by the chosen token.
 *
 * Bounds. Parsing bounds the text, the rules, the elements after expansion
 * (each repetition and each character class expands into small rules), the
 * nesting of parentheses and the counts of {m,n}; left recursion (also
 * through rules that can match nothing, as in ("a"?)*) and rules that can
 * never end are compile errors. While generating, the number of parse stacks
 * alive at once (an ambiguous grammar), the depth of a stack and the memory
 * of the position tables are bounded: past a bound a call fails with
 * CORE_ERANGE and a message, never with unbounded memory or time. Compiling
 * also runs the texts' first states against those bounds (the probe, see
 * core_grammar_new), so that most grammars that would meet one while
 * generating are refused before any text.
 *
 * Knows nothing of HTTP, JSON or requests.
 */
#ifndef DARKSERVE_CORE_GRAMMAR_H
#define DARKSERVE_CORE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/text/tokenizer.h"

/* Defaults and hard maxima of core_grammar_limits_t. */
#define CORE_GRAMMAR_MAX_TEXT ((size_t)256 << 10) /* bytes of grammar text */
#define CORE_GRAMMAR_MAX_RULES 1024               /* named rules */
#define CORE_GRAMMAR_MAX_ELEMENTS (1u << 18)      /* elements after expansion */
#define CORE_GRAMMAR_MAX_NESTING 64               /* depth of ( ) */
#define CORE_GRAMMAR_MAX_REPEAT 1000              /* m and n of {m,n} */
#define CORE_GRAMMAR_MAX_STACKS 512               /* parse stacks alive at once */
#define CORE_GRAMMAR_MAX_DEPTH 4096               /* frames in one stack */
#define CORE_GRAMMAR_MAX_CACHE ((size_t)64 << 20) /* bytes of position tables per grammar */
#define CORE_GRAMMAR_MAX_PROBE 4096               /* states explored when compiling */

/* Limits of one grammar. Zero-initialize and set what you need: a 0 field
 * takes the default above; a larger value is clamped to it. */
typedef struct core_grammar_limits {
    size_t max_text;
    uint32_t max_rules;
    uint32_t max_elements;
    uint32_t max_nesting;
    uint32_t max_repeat;
    uint32_t max_stacks;
    uint32_t max_depth;
    size_t max_cache; /* 1 = cache nothing: every mask walks the trie (tests) */
    uint32_t max_probe; /* states the compile-time probe explores (see core_grammar_new) */
} core_grammar_limits_t;

/* ---- vocabulary ---- */

typedef struct core_grammar_vocab core_grammar_vocab_t;

typedef enum core_grammar_tok_kind {
    CORE_GRAMMAR_TOK_NEVER = 0, /* never allowed under a grammar (control tokens) */
    CORE_GRAMMAR_TOK_TEXT = 1,  /* stands for its bytes */
    CORE_GRAMMAR_TOK_END = 2    /* ends the generation: allowed where the grammar accepts */
} core_grammar_tok_kind_t;

/* A vocabulary of n tokens (1..CORE_TOK_MAX_VOCAB): token i is kinds[i]
 * (a core_grammar_tok_kind_t) and, for TEXT, the bytes pieces[i][0..lens[i])
 * (1..CORE_TOK_MAX_TOKEN_LEN bytes; an empty TEXT token counts as NEVER).
 * All arrays are borrowed for the call. *out is new (core_grammar_vocab_free). */
int core_grammar_vocab_new(int32_t n, const char *const *pieces, const size_t *lens,
                           const uint8_t *kinds, core_grammar_vocab_t **out, core_error_t *err);

/* The vocabulary of a tokenizer (borrowed for the call): end-of-generation
 * tokens (core_tokenizer_is_eog) are END; CONTROL, UNKNOWN and UNUSED tokens
 * are NEVER; every other token is TEXT with its piece (core_tokenizer_piece). */
int core_grammar_vocab_from_tokenizer(const core_tokenizer_t *t, core_grammar_vocab_t **out,
                                      core_error_t *err);
void core_grammar_vocab_free(core_grammar_vocab_t *v); /* NULL is a no-op */
int32_t core_grammar_vocab_size(const core_grammar_vocab_t *v);
/* Nodes of the byte trie (memory and benchmark reports). */
size_t core_grammar_vocab_nodes(const core_grammar_vocab_t *v);

/* ---- grammar ---- */

typedef struct core_grammar core_grammar_t;

/* Parses and checks text[0..len) (borrowed; UTF-8), binds it to vocab
 * (borrowed, must outlive the grammar; NULL: check only, masks and token
 * accepts then fail with CORE_EINVAL) and returns a new grammar in *out
 * (core_grammar_free). lim may be NULL (defaults). An invalid grammar is
 * CORE_EFORMAT with a message "line L, column C: <what is wrong or what
 * was expected>" (columns count characters from 1); a grammar over a bound
 * is CORE_ERANGE with the same kind of message.
 * The probe: the states the grammar's texts reach are explored breadth
 * first from the start, each distinct state once and each class of bytes
 * that leads somewhere else from it, up to lim->max_probe states and a
 * fixed budget of parser work (a few ms of CPU, docs/GRAMMAR.md); a state
 * over a bound of generation (stacks, depth, paths one byte opens) is
 * CORE_ERANGE with that bound's message and the text that reaches it
 * appended, as in: ... at once (after the text "xxxxxxxx"). Beyond the
 * budget the bounds still hold while generating. */
int core_grammar_new(const char *text, size_t len, const core_grammar_vocab_t *vocab,
                     const core_grammar_limits_t *lim, core_grammar_t **out, core_error_t *err);
void core_grammar_free(core_grammar_t *g); /* NULL is a no-op */
/* Bytes the position tables hold now (benchmark reports). */
size_t core_grammar_cache_bytes(const core_grammar_t *g);

/* ---- per-sequence state ---- */

/* The set of parse stacks the text so far leaves. A stack is a sequence of
 * grammar positions, bottom first; the top one expects a byte; an empty
 * stack means the text so far is a complete string of the language. */
typedef struct core_grammar_state {
    const core_grammar_t *g; /* borrowed */
    uint32_t *buf;           /* [len] the stacks, each as its depth then its frames; owned */
    size_t len, cap;         /* uint32 words used / allocated */
    uint32_t n_stacks;
} core_grammar_state_t;

/* The state before any text. *st is overwritten (not freed: clear it first
 * when it held a state); on error it is left empty. */
int core_grammar_state_init(core_grammar_state_t *st, const core_grammar_t *g, core_error_t *err);
/* Frees st's memory and zeroes it. NULL, or an already-clear state, is a no-op. */
void core_grammar_state_clear(core_grammar_state_t *st);
/* dst becomes an independent copy of src (what dst held is freed). On
 * error dst is unchanged. */
int core_grammar_state_copy(core_grammar_state_t *dst, const core_grammar_state_t *src,
                            core_error_t *err);
/* 1 when the text so far is a string of the language (an END token is allowed). */
int core_grammar_state_accepting(const core_grammar_state_t *st);
/* 1 when some byte can still follow (0: only an END token can come). */
int core_grammar_state_can_continue(const core_grammar_state_t *st);

/* ---- scratch ---- */

typedef struct core_grammar_ws core_grammar_ws_t;
core_grammar_ws_t *core_grammar_ws_new(void);     /* NULL when out of memory */
void core_grammar_ws_free(core_grammar_ws_t *ws); /* NULL is a no-op */

/* ---- decoding steps ---- */

/* Words of a mask over V tokens. */
#define CORE_GRAMMAR_MASK_WORDS(V) (((size_t)(V) + 63) / 64)

/* Writes into allow[CORE_GRAMMAR_MASK_WORDS(V)] (caller-owned) bit t (word
 * t / 64, bit t % 64) = 1 for every token t < V that may come next: TEXT
 * tokens whose bytes extend the text so far to a prefix of a string of the
 * language, END tokens when core_grammar_state_accepting(st). Tokens the
 * vocabulary does not have (t >= its size) are 0. st is unchanged (the
 * grammar's position tables may be filled). */
int core_grammar_mask(const core_grammar_state_t *st, core_grammar_ws_t *ws, uint64_t *allow,
                      int64_t V, core_error_t *err);

/* Advances st by token (a TEXT token's bytes; an END token leaves only the
 * empty stack). CORE_EINVAL when the mask would not allow it; st is then
 * unchanged. */
int core_grammar_accept(core_grammar_state_t *st, core_grammar_ws_t *ws, int32_t token,
                        core_error_t *err);
/* Advances st by bytes[0..len) (borrowed), e.g. a forced prefix. CORE_EINVAL
 * when they cannot continue the text (st unchanged). Needs no vocabulary. */
int core_grammar_accept_bytes(core_grammar_state_t *st, core_grammar_ws_t *ws, const void *bytes,
                              size_t len, core_error_t *err);

#endif
