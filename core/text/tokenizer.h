/* core/text/tokenizer.h — text <-> token ids for the models darkserve serves.
 *
 * Two vocabulary kinds, as GGUF's tokenizer.ggml.model names them:
 *   "gpt2"  byte-level BPE: the text is split by a pre-tokenizer (PCRE2 regexes
 *           chosen by tokenizer.ggml.pre), every byte becomes one GPT-2
 *           byte-to-unicode symbol, and adjacent symbols merge by merge rank.
 *   "llama" SentencePiece-style BPE: spaces become U+2581 ("▁"), an optional
 *           "▁" is prepended, adjacent symbols merge when their concatenation
 *           is a vocabulary entry (highest score first), and a character that
 *           is no entry falls back to its <0xXX> byte tokens.
 * The algorithm is built from plain arrays (core_tok_spec_t), so it can be
 * tested without a file; core_tokenizer_from_gguf() only reads those arrays
 * out of the tokenizer.ggml.* keys.
 *
 * Special tokens. Vocabulary entries of type CONTROL (3) and UNKNOWN (2) are
 * recognised in input text only with CORE_TOK_PARSE_SPECIAL; entries of type
 * USER_DEFINED (4) are recognised always, because they are ordinary words the
 * model's author added (HF "added tokens" that are not special; llama.cpp does
 * the same). Matching is leftmost-longest, as HF tokenizers does. Text between
 * matches is tokenized independently (a regex never looks across a special
 * token).
 *
 * Invalid UTF-8 is never an error. Byte-level BPE: the text is cut into valid
 * UTF-8 stretches; each stretch goes through the pre-tokenizer, and each byte
 * outside them is one piece of its own that becomes its byte token. A byte the
 * vocabulary has no symbol for is dropped, exactly as HF tokenizers does (with
 * unk_token null); core_tokenizer_warnings() says which bytes those are.
 * SentencePiece: each invalid byte is a symbol of its own and falls back to its
 * <0xXX> token (or unk when the vocabulary has no byte tokens).
 *
 * Thread safety: a tokenizer is immutable after construction; any number of
 * threads may encode and decode with one tokenizer concurrently (all scratch
 * memory is per call). core never logs: construction warnings are kept in a
 * string readable with core_tokenizer_warnings().
 */
#ifndef DARKSERVE_CORE_TOKENIZER_H
#define DARKSERVE_CORE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/gguf.h"

/* Hard limits that bound every allocation made from metadata or input. */
#define CORE_TOK_MAX_VOCAB ((int64_t)1 << 22)      /* entries in tokens[] */
#define CORE_TOK_MAX_MERGES ((int64_t)1 << 23)     /* entries in merges[] */
#define CORE_TOK_MAX_TOKEN_LEN 4096                /* bytes in one token's text */
#define CORE_TOK_MAX_TEXT ((size_t)1 << 28)        /* bytes one encode call accepts */

typedef struct core_tokenizer core_tokenizer_t;

typedef enum core_tok_model {
    CORE_TOK_MODEL_BPE = 1, /* "gpt2": byte-level BPE with merges */
    CORE_TOK_MODEL_SPM = 2  /* "llama": SentencePiece-style BPE with scores */
} core_tok_model_t;

/* Values of tokenizer.ggml.token_type. */
typedef enum core_tok_type {
    CORE_TOK_TYPE_UNDEFINED = 0,
    CORE_TOK_TYPE_NORMAL = 1,
    CORE_TOK_TYPE_UNKNOWN = 2,
    CORE_TOK_TYPE_CONTROL = 3,
    CORE_TOK_TYPE_USER_DEFINED = 4,
    CORE_TOK_TYPE_UNUSED = 5,
    CORE_TOK_TYPE_BYTE = 6
} core_tok_type_t;

/* Everything a tokenizer is built from. All pointers are borrowed for the
 * duration of core_tokenizer_new() only: the tokenizer copies what it keeps.
 * Strings are (pointer, length) pairs; a NULL lens array means NUL-terminated. */
typedef struct core_tok_spec {
    core_tok_model_t model;
    const char *pre;              /* pre-tokenizer name (tokenizer.ggml.pre), NULL = "default";
                                   * used by CORE_TOK_MODEL_BPE only */
    int64_t n_tokens;             /* 1..CORE_TOK_MAX_VOCAB */
    const char *const *tokens;    /* [n_tokens] token texts, as stored in the vocabulary */
    const size_t *token_lens;     /* [n_tokens] or NULL */
    const float *scores;          /* [n_tokens]; required for SPM, ignored for BPE */
    const int32_t *token_types;   /* [n_tokens] core_tok_type_t values, or NULL = all NORMAL */
    int64_t n_merges;             /* BPE: required, >= 0; SPM: ignored */
    const char *const *merges;    /* [n_merges] "left right" */
    const size_t *merge_lens;     /* [n_merges] or NULL */
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id; /* -1 = none */
    int add_bos;                  /* add BOS when encoding with CORE_TOK_ADD_SPECIAL */
    int add_eos;                  /* add EOS when encoding with CORE_TOK_ADD_SPECIAL */
    int add_space_prefix;         /* SPM: prepend "▁" to text at the start or after a special token */
} core_tok_spec_t;

/* Fills a spec with the defaults: no ids, no flags, model BPE, all arrays NULL. */
void core_tok_spec_init(core_tok_spec_t *spec);

/* Builds a tokenizer from arrays. *out is new (free with core_tokenizer_free).
 * Rejects with CORE_EFORMAT (message names the entry): missing tokens,
 * empty or over-long token texts, token types outside 0..6, merges that are
 * not "a b" or whose parts or concatenation are not tokens, special ids out
 * of range, add_bos/add_eos without the id, a missing scores array for SPM.
 * CORE_ERANGE for counts over the limits. A text that occurs twice resolves to
 * its lowest id (warning). An unknown pre-tokenizer name falls back to "gpt2"
 * and records a warning. */
int core_tokenizer_new(const core_tok_spec_t *spec, core_tokenizer_t **out, core_error_t *err);

/* Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,
 * bos_token_id,eos_token_id,eot_token_id,eom_token_id,unknown_token_id,
 * add_bos_token,add_eos_token,add_space_prefix} from g (borrowed; not used
 * after return) and builds a tokenizer. Missing tokens array, an unsupported
 * model, or a token_type/scores array whose length differs from tokens is
 * CORE_EFORMAT. Defaults when keys are absent: add_bos = add_space_prefix =
 * (model == "llama"), add_eos = 0; for "llama", unk/bos/eos default to 0/1/2
 * like the original SentencePiece vocabularies. A special id that is not a
 * valid token id (files store "none" as 0xFFFFFFFF) is treated as absent and
 * noted in the warnings. *out is new. */
int core_tokenizer_from_gguf(const core_gguf_t *g, core_tokenizer_t **out, core_error_t *err);
/* Same, with the pre-tokenizer name taken from pre instead of
 * tokenizer.ggml.pre when pre is not NULL (tests compare pre-tokenizers on one
 * vocabulary; also a way to serve a file that names the wrong one). */
int core_tokenizer_from_gguf_pre(const core_gguf_t *g, const char *pre, core_tokenizer_t **out,
                                 core_error_t *err);

void core_tokenizer_free(core_tokenizer_t *t); /* NULL is a no-op */

/* ---- properties (t borrowed) ---- */
int32_t core_tokenizer_n_vocab(const core_tokenizer_t *t);
core_tok_model_t core_tokenizer_model(const core_tokenizer_t *t);
/* Name of the pre-tokenizer actually used ("smollm", "gpt2", ...); static. */
const char *core_tokenizer_pre_name(const core_tokenizer_t *t);
int32_t core_tokenizer_bos(const core_tokenizer_t *t); /* -1 if none */
int32_t core_tokenizer_eos(const core_tokenizer_t *t); /* -1 if none */
/* End-of-turn id: tokenizer.ggml.eot_token_id, else the first control token
 * among <|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>, <EOT>; -1 if none. */
int32_t core_tokenizer_eot(const core_tokenizer_t *t);
/* 1 if generating id ends the generation: eos, eot, eom, and control tokens
 * whose text is one of <|endoftext|>, <|im_end|>, <|eot_id|>, <|eom_id|>,
 * <end_of_turn>, <|end|>, <EOT>, <|end_of_text|>. 0 otherwise (also for ids
 * out of range). */
int core_tokenizer_is_eog(const core_tokenizer_t *t, int32_t id);
core_tok_type_t core_tokenizer_token_type(const core_tokenizer_t *t, int32_t id); /* UNDEFINED if out of range */
/* Token id of an exact vocabulary text, -1 if absent. */
int32_t core_tokenizer_find(const core_tokenizer_t *t, const char *text, size_t len);
/* Construction warnings, "; "-separated; "" when none. Borrowed from t. */
const char *core_tokenizer_warnings(const core_tokenizer_t *t);

/* ---- encoding ---- */
#define CORE_TOK_ADD_SPECIAL 1u   /* add BOS/EOS as add_bos/add_eos ask */
#define CORE_TOK_PARSE_SPECIAL 2u /* recognise CONTROL/UNKNOWN token texts in the input */

/* Encodes text[0..len) (any bytes, text may be NULL when len == 0).
 * max_len bounds len (0 means CORE_TOK_MAX_TEXT; values above it are clamped
 * to it); a longer text is CORE_ERANGE with *n_ids = 0.
 * Writes the first min(cap, n) ids into ids (caller-owned, may be NULL when
 * cap == 0) and n, the number of ids the text needs, into *n_ids. Returns 0
 * when everything fit, CORE_ERANGE with *n_ids > cap when it did not (call
 * again with a buffer of *n_ids). A text never needs more than
 * CORE_TOK_MAX_IDS(len) ids: BPE len + 2; SPM's "▁" escaping (1 byte -> 3)
 * and prefix (one per stretch between specials) allow up to 4 * len + 5 when
 * everything falls back to byte tokens. */
#define CORE_TOK_MAX_IDS(len) (4 * (size_t)(len) + 5)
int core_tokenizer_encode(const core_tokenizer_t *t, const char *text, size_t len, size_t max_len,
                          unsigned flags, int32_t *ids, size_t cap, size_t *n_ids, core_error_t *err);

/* Same, into a new array: *ids is malloc'ed (caller frees with free()), also
 * when *n_ids == 0 (then it may be NULL). More than max_tokens ids is
 * CORE_ERANGE (*ids NULL, *n_ids 0). */
int core_tokenizer_encode_alloc(const core_tokenizer_t *t, const char *text, size_t len,
                                size_t max_len, size_t max_tokens, unsigned flags, int32_t **ids,
                                size_t *n_ids, core_error_t *err);

/* A byte range [off, off + len) of an input text. */
typedef struct core_tok_range {
    size_t off, len;
} core_tok_range_t;

/* core_tokenizer_encode_alloc, except that inside the ranges plain[0..n_plain)
 * (borrowed; sorted by off, not overlapping, inside the text; else
 * CORE_EINVAL) special-token texts are not recognised even with
 * CORE_TOK_PARSE_SPECIAL (USER_DEFINED ones still are, as without it), and no
 * match crosses a range's border. A range is not tokenized on its own: it
 * joins the ordinary text around it, so when it holds no special text the
 * result equals core_tokenizer_encode_alloc's. For chat prompts: the
 * template's markers are special, the message contents (plain) are text. */
int core_tokenizer_encode_plain_alloc(const core_tokenizer_t *t, const char *text, size_t len,
                                      size_t max_len, size_t max_tokens, unsigned flags,
                                      const core_tok_range_t *plain, size_t n_plain,
                                      int32_t **ids, size_t *n_ids, core_error_t *err);

/* ---- decoding ---- */
#define CORE_TOK_DECODE_SPECIAL 1u      /* render CONTROL/UNKNOWN tokens as their text */
#define CORE_TOK_DECODE_STRIP_PREFIX 2u /* SPM with add_space_prefix: drop one leading
                                         * space of the output (decoding a whole
                                         * encoded text, not a continuation) */

/* The bytes one token stands for: byte-level symbols mapped back to their
 * bytes, "▁" to a space, <0xXX> byte tokens to their byte; CONTROL, UNKNOWN
 * and USER_DEFINED tokens are their text. May be a partial UTF-8 sequence.
 * Borrowed from t, not NUL-terminated; NULL if id out of range. */
const char *core_tokenizer_piece(const core_tokenizer_t *t, int32_t id, size_t *len);

/* Copies the piece of id into out[0..cap) (caller-owned): *n_out = its
 * length; CORE_ERANGE if cap is smaller (nothing written), CORE_EINVAL for a
 * bad id. CONTROL and UNKNOWN tokens give an empty piece unless flags has
 * CORE_TOK_DECODE_SPECIAL. */
int core_tokenizer_token_to_piece(const core_tokenizer_t *t, int32_t id, unsigned flags, char *out,
                                  size_t cap, size_t *n_out, core_error_t *err);

/* Concatenates the pieces of ids[0..n) into out[0..cap) (caller-owned, may be
 * NULL when cap == 0); the result is raw bytes (not NUL-terminated, possibly
 * invalid UTF-8 when the ids are). *n_out = bytes needed; CORE_ERANGE when
 * that exceeds cap (out holds a prefix). CORE_EINVAL for an id out of range
 * (the message gives its index). */
int core_tokenizer_decode(const core_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                          char *out, size_t cap, size_t *n_out, core_error_t *err);

/* ---- streaming detokenizer ----
 * Turns ids into text one at a time for a streamed response, emitting only
 * complete, valid UTF-8: a multi-byte character whose bytes arrive in several
 * tokens is held back until it is complete. Bytes that can never form a valid
 * character (stray continuation bytes, 0xC0/0xC1/0xF5..0xFF, overlongs,
 * surrogates, a sequence cut short by the next byte or by flush) are replaced
 * by U+FFFD, one per maximal invalid subpart (the Unicode-recommended practice,
 * what Python's errors="replace" does), so the output is always valid UTF-8.
 * The state is a plain caller-owned value: no allocation, nothing to free. */
typedef struct core_tok_stream {
    const core_tokenizer_t *t; /* borrowed; must outlive the stream */
    unsigned flags;            /* CORE_TOK_DECODE_* */
    int strip_pending;         /* drop the next leading space (STRIP_PREFIX) */
    unsigned char pend[4];     /* bytes of an incomplete character */
    unsigned n_pend;           /* bytes in pend */
    unsigned n_need;           /* total bytes of the character pend starts */
} core_tok_stream_t;

void core_tok_stream_init(core_tok_stream_t *s, const core_tokenizer_t *t, unsigned flags);
/* Output cap that always suffices for one push or flush. */
size_t core_tok_stream_max_out(const core_tokenizer_t *t);
/* Adds id; writes the text that became complete into out[0..cap) and its
 * length into *n_out. CORE_EINVAL for a bad id, CORE_ERANGE if cap <
 * core_tok_stream_max_out() (state unchanged in both cases). */
int core_tok_stream_push(core_tok_stream_t *s, int32_t id, char *out, size_t cap, size_t *n_out,
                         core_error_t *err);
/* Ends the stream: emits U+FFFD for a held-back incomplete character. */
int core_tok_stream_flush(core_tok_stream_t *s, char *out, size_t cap, size_t *n_out,
                          core_error_t *err);

#endif
