/* core/text/grammar_impl.h — the compiled form of a grammar, shared by the parser
 * (grammar_parse.c: text -> these arrays) and the matcher (grammar.c).
 *
 * A compiled grammar is a pushdown automaton over bytes. Every rule is a list
 * of alternatives; every alternative is a run of elements in one array,
 * closed by an END element:
 *   BYTES  one byte from a 256-bit set (literals are runs of singleton sets;
 *          a character class is a small rule whose alternatives are runs of
 *          byte sets, one per UTF-8 byte-range sequence of its code points)
 *   REF    the rule arg (pushes a return position unless it is the last
 *          element of its alternative: a tail call, so loops do not grow the
 *          stack)
 *   END    the alternative is complete: return to the position below.
 * A position (frame) is an element index. Rule 0 is a synthetic start rule
 * whose one alternative is REF root; the start frame is its first element.
 */
#ifndef DARKSERVE_CORE_GRAMMAR_IMPL_H
#define DARKSERVE_CORE_GRAMMAR_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/text/grammar.h"

enum { GEL_END = 0, GEL_BYTES = 1, GEL_REF = 2 };

typedef struct gel {
    uint32_t kind; /* GEL_* */
    uint32_t arg;  /* BYTES: index into sets; REF: rule id; END: 0 */
} gel_t;

typedef struct gset {
    uint64_t w[4]; /* bit b: byte b matches */
} gset_t;

static inline int gset_has(const gset_t *s, unsigned b)
{
    return (int)((s->w[b >> 6] >> (b & 63)) & 1u);
}

/* Values of cont[] besides an element index (see grammar.c, "tables"). */
#define GCONT_NONE 0xFFFFFFFFu   /* the rule is never on a stack */
#define GCONT_MULTI 0xFFFFFFFEu  /* several positions (or the bottom) can be below */
#define GCONT_BOTTOM 0xFFFFFFFDu /* nothing is below: the rule ends the text */

typedef struct gcache gcache_t; /* grammar.c */

struct core_grammar {
    const core_grammar_vocab_t *vocab; /* borrowed, may be NULL */
    core_grammar_limits_t lim;         /* resolved */
    uint32_t n_el;
    gel_t *el;         /* [n_el] */
    uint32_t *el_rule; /* [n_el] rule each element belongs to */
    uint32_t n_rules;
    uint32_t *rule_alt;  /* [n_rules + 1]: rule r's alternatives are alt_first[rule_alt[r] ..
                            rule_alt[r + 1]) */
    uint32_t *alt_first; /* [n_alts] first element of each alternative */
    uint32_t n_sets;
    gset_t *sets;   /* [n_sets] */
    uint32_t *cont; /* [n_rules] the one position that can lie below a frame of the rule,
                       or GCONT_* */
    uint32_t start; /* the start frame */

    /* position tables (grammar.c) */
    pthread_mutex_t mu;         /* serializes filling */
    _Atomic(gcache_t *) *cache; /* [n_el] NULL until filled */
    size_t cache_bytes;         /* under mu */
    int cache_full;             /* under mu: max_cache reached, no more tables */
};

/* Parses text into g's el, el_rule, n_rules, rule_alt, alt_first, sets and
 * start (g->lim resolved by the caller), with every check of
 * core_grammar_new. On error those fields may be partly set; the caller
 * frees them. */
int gram_parse(core_grammar_t *g, const char *text, size_t len, core_error_t *err);

#endif
