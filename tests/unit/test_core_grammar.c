/* tests/unit/test_core_grammar.c — the grammar parser and the token mask.
 *
 * The mask is checked against a reference written here, independent of
 * core/grammar*.c: grammars are built as small syntax trees, printed as
 * grammar text for the engine, and interpreted directly by a backtracking
 * recognizer that answers "is this byte string a prefix of some string of
 * the language?" (and "is it in the language?"). For random grammars
 * (literals with multi-byte characters, classes over the whole code point
 * range, negations, groups, every repetition form, recursion) and random
 * walks over a synthetic vocabulary (every single byte, multi-byte tokens,
 * tokens holding partial UTF-8), the engine's mask must equal the
 * reference's at every step, with the position tables and without them.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/grammar.h"
#include "core/rng.h"
#include "tests/unit/check.h"

/* ------------------------------------------------------------ syntax trees */

enum { R_LIT, R_CLASS, R_REF, R_SEQ, R_ALT, R_REP, R_ANY };

#define MAXK 8
#define INF (-1)

typedef struct rnode {
    int kind;
    unsigned char lit[24]; /* R_LIT: UTF-8 bytes */
    int lit_len;
    int neg; /* R_CLASS */
    uint32_t lo[4], hi[4];
    int nr;
    int rule; /* R_REF */
    struct rnode *k[MAXK];
    int nk;
    int min, max; /* R_REP; max INF = no limit */
    int n_pos;    /* R_CLASS, R_ANY: the code points as positive ranges, once computed */
    uint32_t pos_lo[8], pos_hi[8];
} rnode_t;

#define POOL 4096
static rnode_t pool[POOL];
static int n_pool;

#define MAX_RULES 8
static rnode_t *rules[MAX_RULES];
static const char *rule_names[MAX_RULES];
static int n_rules;

static rnode_t *node(int kind)
{
    if (n_pool >= POOL) {
        fprintf(stderr, "test node pool exhausted\n");
        abort();
    }
    rnode_t *x = &pool[n_pool++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return x;
}

static rnode_t *lit(const char *s)
{
    rnode_t *x = node(R_LIT);
    x->lit_len = (int)strlen(s);
    memcpy(x->lit, s, (size_t)x->lit_len);
    return x;
}

static rnode_t *cls(int neg, int nr, ...)
{
    rnode_t *x = node(R_CLASS);
    x->neg = neg;
    va_list ap;
    va_start(ap, nr);
    for (int i = 0; i < nr; i++) {
        x->lo[i] = va_arg(ap, uint32_t);
        x->hi[i] = va_arg(ap, uint32_t);
    }
    va_end(ap);
    x->nr = nr;
    return x;
}

static rnode_t *ref(int r)
{
    rnode_t *x = node(R_REF);
    x->rule = r;
    return x;
}

/* A sequence or alternation of n nodes. */
static rnode_t *group(int kind, int n, ...)
{
    rnode_t *x = node(kind);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        x->k[i] = va_arg(ap, rnode_t *);
    va_end(ap);
    x->nk = n;
    return x;
}

#define seq(...) group(R_SEQ, __VA_ARGS__)
#define alt(...) group(R_ALT, __VA_ARGS__)

static rnode_t *rep(rnode_t *c, int min, int max)
{
    rnode_t *x = node(R_REP);
    x->k[0] = c;
    x->nk = 1;
    x->min = min;
    x->max = max;
    return x;
}

static void grammar_reset(void)
{
    n_pool = 0;
    n_rules = 0;
}

/* ------------------------------------------------------------ printing */

typedef struct sbuf {
    char b[1 << 15];
    size_t n;
} sbuf_t;

static void sb_put(sbuf_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf_t *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s->b + s->n, sizeof s->b - s->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        s->n += (size_t)k;
    if (s->n >= sizeof s->b)
        s->n = sizeof s->b - 1;
}

/* A code point in a literal or class: ASCII letters as themselves, the
 * rest as escapes (\x, \u or \U, varying) or raw UTF-8. */
static void put_cp(sbuf_t *s, uint32_t c, int in_class)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ')
        sb_put(s, "%c", (char)c);
    else if (c == '"' || c == '\\' || (in_class && (c == ']' || c == '-' || c == '^')))
        sb_put(s, "\\%c", (char)c);
    else if (c == '\n')
        sb_put(s, "\\n");
    else if (c < 0x80)
        sb_put(s, "\\x%02X", (unsigned)c);
    else if (c <= 0xFFFF && (c & 1))
        sb_put(s, "\\u%04X", (unsigned)c);
    else if (c & 2)
        sb_put(s, "\\U%08X", (unsigned)c);
    else {
        unsigned char u[4];
        int n = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (n == 2) {
            u[0] = (unsigned char)(0xC0 | (c >> 6));
            u[1] = (unsigned char)(0x80 | (c & 0x3F));
        } else if (n == 3) {
            u[0] = (unsigned char)(0xE0 | (c >> 12));
            u[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            u[2] = (unsigned char)(0x80 | (c & 0x3F));
        } else {
            u[0] = (unsigned char)(0xF0 | (c >> 18));
            u[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            u[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            u[3] = (unsigned char)(0x80 | (c & 0x3F));
        }
        sb_put(s, "%.*s", n, (const char *)u);
    }
}

/* Decodes one code point of a literal's (valid) UTF-8. */
static int dec(const unsigned char *p, uint32_t *c)
{
    if (p[0] < 0x80) {
        *c = p[0];
        return 1;
    }
    int n = p[0] < 0xE0 ? 2 : p[0] < 0xF0 ? 3 : 4;
    uint32_t v = p[0] & (0x3Fu >> (n - 1));
    for (int i = 1; i < n; i++)
        v = (v << 6) | (p[i] & 0x3Fu);
    *c = v;
    return n;
}

static void print_node(sbuf_t *s, const rnode_t *x)
{
    switch (x->kind) {
    case R_LIT:
        sb_put(s, "\"");
        for (int i = 0; i < x->lit_len;) {
            uint32_t c;
            i += dec(x->lit + i, &c);
            put_cp(s, c, 0);
        }
        sb_put(s, "\"");
        break;
    case R_CLASS:
        sb_put(s, "[%s", x->neg ? "^" : "");
        for (int i = 0; i < x->nr; i++) {
            put_cp(s, x->lo[i], 1);
            if (x->hi[i] != x->lo[i]) {
                sb_put(s, "-");
                put_cp(s, x->hi[i], 1);
            }
        }
        sb_put(s, "]");
        break;
    case R_ANY: sb_put(s, "."); break;
    case R_REF: sb_put(s, "%s", rule_names[x->rule]); break;
    case R_SEQ:
    case R_ALT:
        sb_put(s, "(");
        for (int i = 0; i < x->nk; i++) {
            if (i)
                sb_put(s, x->kind == R_ALT ? " | " : " ");
            print_node(s, x->k[i]);
        }
        if (x->nk == 0)
            sb_put(s, "\"\"");
        sb_put(s, ")");
        break;
    case R_REP:
        print_node(s, x->k[0]);
        if (x->min == 0 && x->max == INF)
            sb_put(s, "*");
        else if (x->min == 1 && x->max == INF)
            sb_put(s, "+");
        else if (x->min == 0 && x->max == 1)
            sb_put(s, "?");
        else if (x->max == INF)
            sb_put(s, "{%d,}", x->min);
        else if (x->min == x->max)
            sb_put(s, "{%d}", x->min);
        else if (x->min == 0)
            sb_put(s, "{,%d}", x->max);
        else
            sb_put(s, "{%d,%d}", x->min, x->max);
        break;
    }
}

static void print_grammar(sbuf_t *s)
{
    s->n = 0;
    s->b[0] = 0;
    for (int r = 0; r < n_rules; r++) {
        sb_put(s, "%s ::= ", rule_names[r]);
        const rnode_t *x = rules[r];
        if (x->kind == R_ALT && x->nk > 1) {
            /* top-level alternatives, the later ones on lines of their own */
            for (int i = 0; i < x->nk; i++) {
                if (i)
                    sb_put(s, (i & 1) ? " | " : "\n    | ");
                print_node(s, x->k[i]);
            }
        } else {
            print_node(s, x);
        }
        sb_put(s, "%s\n", r & 1 ? "  # comment" : "");
    }
}

/* ------------------------------------------------------------ reference */

static const unsigned char *in; /* the text being recognized */
static size_t in_len;
static int prefix_mode; /* 1: is in[0..in_len) a prefix of a string of the language? */

typedef struct kont {
    const rnode_t *x;
    int rep; /* 1: the rest of repetition x, min..max more times; 0: match x */
    int min, max;
    const struct kont *next;
} kont_t;

static int m_node(const rnode_t *x, size_t pos, const kont_t *k);
static int m_rep(const rnode_t *x, int min, int max, size_t pos, const kont_t *k);

static int m_kont(size_t pos, const kont_t *k)
{
    if (prefix_mode && pos == in_len)
        return 1;
    if (!k)
        return pos == in_len;
    if (k->rep)
        return m_rep(k->x, k->min, k->max, pos, k->next);
    return m_node(k->x, pos, k->next);
}

/* The code points of a class, as positive ranges over [0, 0x10FFFF]
 * (surrogates are removed when testing). */
static int class_ranges(const rnode_t *x, uint32_t *lo, uint32_t *hi)
{
    if (x->kind == R_ANY) {
        lo[0] = 0;
        hi[0] = 0x10FFFF;
        return 1;
    }
    if (!x->neg) {
        for (int i = 0; i < x->nr; i++) {
            lo[i] = x->lo[i];
            hi[i] = x->hi[i];
        }
        return x->nr;
    }
    /* complement: step through 0..0x10FFFF skipping the listed ranges */
    int n = 0;
    uint32_t c = 0;
    while (c <= 0x10FFFF) {
        int in_r = -1;
        for (int i = 0; i < x->nr; i++)
            if (c >= x->lo[i] && c <= x->hi[i])
                in_r = i;
        if (in_r >= 0) {
            c = x->hi[in_r] + 1;
            continue;
        }
        uint32_t end = 0x10FFFF;
        for (int i = 0; i < x->nr; i++)
            if (x->lo[i] > c && x->lo[i] - 1 < end)
                end = x->lo[i] - 1;
        lo[n] = c;
        hi[n] = end;
        n++;
        c = end + 1;
    }
    return n;
}

/* Does the class hold a scalar value (not a surrogate) in [a, b]? */
static int class_meets(rnode_t *x, uint32_t a, uint32_t b)
{
    if (!x->n_pos)
        x->n_pos = class_ranges(x, x->pos_lo, x->pos_hi);
    for (int i = 0; i < x->n_pos; i++) {
        uint32_t p = x->pos_lo[i] > a ? x->pos_lo[i] : a, q = x->pos_hi[i] < b ? x->pos_hi[i] : b;
        if (p <= q && !(p >= 0xD800 && q <= 0xDFFF))
            return 1;
    }
    return 0;
}

/* One code point of the class at pos: its length, 0 for no match, -1 when
 * the input ends inside a character that the class could complete. */
static int class_at(rnode_t *x, size_t pos)
{
    unsigned b0 = in[pos];
    int n;
    uint32_t minv;
    if (b0 < 0x80)
        n = 1, minv = 0;
    else if (b0 >= 0xC0 && b0 <= 0xDF)
        n = 2, minv = 0x80;
    else if (b0 >= 0xE0 && b0 <= 0xEF)
        n = 3, minv = 0x800;
    else if (b0 >= 0xF0 && b0 <= 0xF7)
        n = 4, minv = 0x10000;
    else
        return 0;
    size_t have = in_len - pos < (size_t)n ? in_len - pos : (size_t)n;
    uint32_t lo = n == 1 ? b0 : b0 & (0x3Fu >> (n - 1)), hi = lo;
    for (int i = 1; i < n; i++) {
        if ((size_t)i < have) {
            if ((in[pos + (size_t)i] & 0xC0) != 0x80)
                return 0;
            lo = (lo << 6) | (in[pos + (size_t)i] & 0x3Fu);
            hi = (hi << 6) | (in[pos + (size_t)i] & 0x3Fu);
        } else {
            lo = lo << 6;
            hi = (hi << 6) | 0x3F;
        }
    }
    /* the characters this byte prefix can still become: not overlong, not
     * past U+10FFFF */
    if (lo < minv)
        lo = minv;
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    if (lo > hi)
        return 0;
    if (have < (size_t)n)
        return class_meets(x, lo, hi) ? -1 : 0;
    return class_meets(x, lo, lo) ? n : 0;
}

static int m_rep(const rnode_t *x, int min, int max, size_t pos, const kont_t *k)
{
    if (prefix_mode && pos == in_len)
        return 1;
    kont_t f = {x, 1, 0, 0, k};
    if (min > 0) {
        f.min = min - 1;
        f.max = max == INF ? INF : max - 1;
        return m_node(x->k[0], pos, &f);
    }
    if (m_kont(pos, k))
        return 1;
    if (max == 0)
        return 0;
    f.max = max == INF ? INF : max - 1;
    return m_node(x->k[0], pos, &f);
}

/* The recognizer backtracks, which is exponential on some random grammars:
 * a query that takes more than REF_BUDGET steps is abandoned (the walk is
 * skipped and counted), so the test's time stays bounded for any seed. */
#define REF_BUDGET 300000L
static long ref_steps;

static int m_node(const rnode_t *x, size_t pos, const kont_t *k)
{
    if (++ref_steps > REF_BUDGET)
        return 0;
    if (prefix_mode && pos == in_len)
        return 1;
    switch (x->kind) {
    case R_LIT:
        for (int i = 0; i < x->lit_len; i++) {
            if (pos + (size_t)i == in_len)
                return prefix_mode;
            if (in[pos + (size_t)i] != x->lit[i])
                return 0;
        }
        return m_kont(pos + (size_t)x->lit_len, k);
    case R_CLASS:
    case R_ANY: {
        if (pos == in_len)
            return 0;
        int n = class_at((rnode_t *)x, pos); /* fills the node's range cache */
        if (n < 0)
            return prefix_mode;
        return n > 0 && m_kont(pos + (size_t)n, k);
    }
    case R_REF: return m_node(rules[x->rule], pos, k);
    case R_SEQ: {
        if (x->nk == 0)
            return m_kont(pos, k);
        kont_t f[MAXK];
        for (int i = x->nk - 1; i >= 1; i--) {
            f[i].x = x->k[i];
            f[i].rep = f[i].min = f[i].max = 0;
            f[i].next = i + 1 < x->nk ? &f[i + 1] : k;
        }
        return m_node(x->k[0], pos, x->nk > 1 ? &f[1] : k);
    }
    case R_ALT:
        for (int i = 0; i < x->nk; i++)
            if (m_node(x->k[i], pos, k))
                return 1;
        return 0;
    case R_REP: return m_rep(x, x->min, x->max, pos, k);
    }
    return 0;
}

static int ref_match(const unsigned char *s, size_t n, int prefix)
{
    ref_steps = 0;
    in = s;
    in_len = n;
    prefix_mode = prefix;
    return m_node(rules[0], 0, NULL);
}

static int ref_prefix(const unsigned char *s, size_t n)
{
    return ref_match(s, n, 1);
}

static int ref_full(const unsigned char *s, size_t n)
{
    return ref_match(s, n, 0);
}

/* ------------------------------------------------------------ random grammars */

static core_rng_t rng;

static int rnd(int n)
{
    return (int)(core_rng_u64(&rng) % (uint64_t)n);
}

/* Characters the grammars and the vocabulary are made of: ASCII, 2-, 3- and
 * 4-byte UTF-8, and the quote and backslash the printer escapes. */
static const uint32_t alphabet[] = {'a', 'b', 'c', 'x', '"', '\\', 0xE9, 0x20AC, 0x1F600, 0x7FF};
#define N_ALPHA (int)(sizeof alphabet / sizeof alphabet[0])

static int put_utf8(uint32_t c, unsigned char *o)
{
    if (c < 0x80) {
        o[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (unsigned char)(0xC0 | (c >> 6));
        o[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (c >> 12));
        o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (c >> 18));
    o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (c & 0x3F));
    return 4;
}

static rnode_t *rand_lit(int allow_empty)
{
    rnode_t *x = node(R_LIT);
    int n = allow_empty ? rnd(3) : 1 + rnd(2);
    for (int i = 0; i < n; i++)
        x->lit_len += put_utf8(alphabet[rnd(N_ALPHA)], x->lit + x->lit_len);
    return x;
}

static const uint32_t cps[] = {'a',   'b',    'c',    'x',    0x7F,   0x80,    0xE9,    0x7FF,
                               0x800, 0x20AC, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF};
#define N_CPS (int)(sizeof cps / sizeof cps[0])

static rnode_t *rand_class(void)
{
    if (rnd(8) == 0)
        return node(R_ANY);
    rnode_t *x = node(R_CLASS);
    x->neg = rnd(3) == 0;
    x->nr = 1 + rnd(3);
    for (int i = 0; i < x->nr; i++) {
        int a = rnd(N_CPS), b = rnd(N_CPS);
        if (a > b) {
            int t = a;
            a = b;
            b = t;
        }
        x->lo[i] = cps[a];
        x->hi[i] = rnd(2) ? cps[a] : cps[b];
    }
    return x;
}

/* An item of rule r. guarded: something non-empty precedes it in its rule,
 * so references back to rules <= r cannot make left recursion. Items that
 * a * or + repeats never match the empty string. */
static rnode_t *rand_item(int r, int depth, int *guarded, int non_empty, int back_ok)
{
    int k = rnd(depth > 2 ? 3 : 7);
    rnode_t *x;
    switch (k) {
    case 0: x = rand_lit(!non_empty); break;
    case 1: x = rand_class(); break;
    case 2: {
        /* a reference: forward always, backward only when guarded */
        int fwd = r + 1 < n_rules;
        if (back_ok && *guarded && (!fwd || rnd(2)))
            x = ref(rnd(r + 1));
        else if (fwd)
            x = ref(r + 1 + rnd(n_rules - r - 1));
        else
            x = rand_lit(0);
        break;
    }
    case 3: {
        int n = 1 + rnd(3);
        x = node(R_SEQ);
        int g = *guarded;
        for (int i = 0; i < n; i++)
            x->k[x->nk++] = rand_item(r, depth + 1, &g, non_empty && i == 0, back_ok);
        break;
    }
    case 4: {
        int n = 2 + rnd(2);
        x = node(R_ALT);
        for (int i = 0; i < n; i++) {
            int g = *guarded;
            x->k[x->nk++] = rand_item(r, depth + 1, &g, non_empty, back_ok);
        }
        break;
    }
    default: {
        static const int forms[][2] = {{0, INF}, {1, INF}, {0, 1},  {2, 2},
                                       {1, 3},   {0, 2},   {2, INF}};
        int f = rnd(7);
        int unbounded = forms[f][1] == INF;
        int g = *guarded;
        rnode_t *c;
        /* a repeated item: a literal or class (never empty under * and +) */
        c = rnd(2) ? rand_lit(!unbounded) : rand_class();
        (void)g;
        x = rep(c, forms[f][0], forms[f][1]);
        if (non_empty && forms[f][0] == 0)
            x = seq(2, rand_lit(0), x);
        break;
    }
    }
    /* after a non-empty literal or class the rest of the sequence is guarded */
    if ((x->kind == R_LIT && x->lit_len > 0) || x->kind == R_CLASS || x->kind == R_ANY)
        *guarded = 1;
    return x;
}

static void rand_grammar(void)
{
    static const char *names[MAX_RULES] = {"root", "r1", "rule-2", "R_3", "r4", "r5", "r6", "r7"};
    grammar_reset();
    n_rules = 1 + rnd(4);
    for (int r = 0; r < n_rules; r++)
        rule_names[r] = names[r];
    for (int r = 0; r < n_rules; r++) {
        rnode_t *a = node(R_ALT);
        int na = 1 + rnd(3);
        for (int i = 0; i < na; i++) {
            rnode_t *s = node(R_SEQ);
            int n = 1 + rnd(3), g = 0;
            /* the first alternative never refers back: every rule can end */
            for (int j = 0; j < n; j++)
                s->k[s->nk++] = rand_item(r, 1, &g, 0, i > 0);
            a->k[a->nk++] = s;
        }
        rules[r] = a;
    }
}

/* ------------------------------------------------------------ vocabulary */

#define MAX_V 1024
#define MAX_TOK 16

typedef struct tvocab {
    int n;
    unsigned char b[MAX_V][MAX_TOK];
    size_t len[MAX_V];
    uint8_t kind[MAX_V];
} tvocab_t;

static tvocab_t tv;

/* Every single byte; then tokens made of whole characters of the alphabet,
 * their first or last bytes only (partial UTF-8), and the grammar text's
 * punctuation; one END and one NEVER token. */
static void make_vocab(int n_multi)
{
    memset(&tv, 0, sizeof tv);
    for (int b = 0; b < 256; b++) {
        tv.b[tv.n][0] = (unsigned char)b;
        tv.len[tv.n] = 1;
        tv.kind[tv.n++] = CORE_GRAMMAR_TOK_TEXT;
    }
    tv.kind[tv.n++] = CORE_GRAMMAR_TOK_END;
    tv.kind[tv.n++] = CORE_GRAMMAR_TOK_NEVER;
    tv.len[tv.n - 1] = 0;
    for (int i = 0; i < n_multi && tv.n < MAX_V; i++) {
        unsigned char t[MAX_TOK + 8];
        size_t n = 0;
        int parts = 1 + rnd(3);
        for (int p = 0; p < parts; p++) {
            unsigned char u[4];
            int k = put_utf8(alphabet[rnd(N_ALPHA)], u);
            int from = 0, to = k;
            int cut = rnd(4);
            if (cut == 0 && k > 1 && p == 0)
                from = 1 + rnd(k - 1); /* starts inside a character */
            else if (cut == 1 && k > 1 && p == parts - 1)
                to = 1 + rnd(k - 1); /* ends inside one */
            for (int j = from; j < to; j++)
                t[n++] = u[j];
        }
        if (n < 2 || n > MAX_TOK)
            continue;
        memcpy(tv.b[tv.n], t, n);
        tv.len[tv.n] = n;
        tv.kind[tv.n++] = CORE_GRAMMAR_TOK_TEXT;
    }
}

static core_grammar_vocab_t *vocab_of(const tvocab_t *v)
{
    const char *p[MAX_V];
    for (int i = 0; i < v->n; i++)
        p[i] = (const char *)v->b[i];
    core_grammar_vocab_t *gv = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_grammar_vocab_new(v->n, p, v->len, v->kind, &gv, &err) == 0, "%s", err.msg);
    return gv;
}

/* ------------------------------------------------------------ engine vs reference */

static int bit(const uint64_t *m, int t)
{
    return (int)((m[t >> 6] >> (t & 63)) & 1);
}

/* The reference mask after text w[0..n); 0 when a query ran out of budget. */
static int ref_mask(const unsigned char *w, size_t n, uint64_t *m)
{
    static unsigned char buf[4096];
    memset(m, 0, CORE_GRAMMAR_MASK_WORDS(tv.n) * 8);
    memcpy(buf, w, n);
    for (int t = 0; t < tv.n; t++) {
        int ok = 0;
        if (tv.kind[t] == CORE_GRAMMAR_TOK_END)
            ok = ref_full(w, n);
        else if (tv.kind[t] == CORE_GRAMMAR_TOK_TEXT) {
            memcpy(buf + n, tv.b[t], tv.len[t]);
            ok = ref_prefix(buf, n + tv.len[t]);
        }
        if (ref_steps > REF_BUDGET)
            return 0;
        if (ok)
            m[t >> 6] |= 1ull << (t & 63);
    }
    return 1;
}

static void dump_text(const char *what, const unsigned char *w, size_t n)
{
    printf("  %s (%zu bytes):", what, n);
    for (size_t i = 0; i < n; i++)
        printf(" %02x", w[i]);
    printf("\n");
}

static int ambiguous; /* grammars refused and walks ended by CORE_ERANGE (too many parse stacks) */
static int too_slow;  /* walks ended by the reference's budget */

/* Random walks through the language of the current grammar (rules[]): at
 * each step the engine's masks (tables, and no tables) must equal the
 * reference's. Returns the number of steps compared, -1 on a mismatch. */
static int compare_walks(const char *text, core_grammar_vocab_t *gv, int walks, int steps,
                         size_t max_text)
{
    core_grammar_t *g = NULL, *g0 = NULL;
    core_error_t err = {0};
    core_grammar_limits_t nocache = {.max_cache = 1};
    int rc_new = core_grammar_new(text, strlen(text), gv, NULL, &g, &err);
    if (rc_new == CORE_ERANGE && strstr(err.msg, "ambiguous")) {
        /* the compile-time probe met the ambiguity bound: a bound, not a bug */
        ambiguous++;
        return 0;
    }
    if (rc_new != 0 || core_grammar_new(text, strlen(text), gv, &nocache, &g0, &err) != 0) {
        CHECK_MSG(0, "grammar refused: %s\n%s", err.msg, text);
        core_grammar_free(g);
        return -1;
    }
    core_grammar_ws_t *ws = core_grammar_ws_new();
    size_t W = CORE_GRAMMAR_MASK_WORDS(tv.n);
    uint64_t *me = calloc(W, 8), *m0 = calloc(W, 8), *mr = calloc(W, 8);
    int compared = 0, bad = 0;
    for (int w = 0; w < walks && !bad; w++) {
        core_grammar_state_t st, st0;
        CHECK(core_grammar_state_init(&st, g, &err) == 0);
        CHECK(core_grammar_state_init(&st0, g0, &err) == 0);
        unsigned char text_so_far[2048];
        size_t n = 0;
        for (int s = 0; s < steps && !bad; s++) {
            int rc = core_grammar_mask(&st, ws, me, tv.n, &err);
            int rc0 = core_grammar_mask(&st0, ws, m0, tv.n, &err);
            if (rc == CORE_ERANGE || rc0 == CORE_ERANGE) {
                /* a random grammar can be too ambiguous: a bound, not a bug (the walk
                 * without tables carries more stacks per set, so it may meet it first) */
                ambiguous++;
                break;
            }
            CHECK_MSG(rc == 0 && rc0 == 0, "mask: %s", err.msg);
            if (!ref_mask(text_so_far, n, mr)) {
                too_slow++;
                break;
            }
            compared++;
            for (int t = 0; t < tv.n && !bad; t++) {
                if (bit(me, t) != bit(mr, t) || bit(m0, t) != bit(mr, t)) {
                    CHECK_MSG(0, "token %d: engine %d, engine without tables %d, reference %d", t,
                              bit(me, t), bit(m0, t), bit(mr, t));
                    printf("  grammar:\n%s", text);
                    dump_text("text so far", text_so_far, n);
                    dump_text("token", tv.b[t], tv.len[t]);
                    bad = 1;
                }
            }
            int full = ref_full(text_so_far, n);
            if (ref_steps <= REF_BUDGET)
                CHECK_INT_EQ(core_grammar_state_accepting(&st), full);
            /* pick an allowed token, multi-byte ones more often */
            int pick = -1, seen = 0;
            for (int t = 0; t < tv.n; t++)
                if (bit(mr, t) && tv.kind[t] == CORE_GRAMMAR_TOK_TEXT &&
                    n + tv.len[t] <= max_text) {
                    int weight = tv.len[t] > 1 ? 4 : 1;
                    seen += weight;
                    if (rnd(seen) < weight)
                        pick = t;
                }
            if (pick < 0)
                break;
            rc = core_grammar_accept(&st, ws, pick, &err);
            rc0 = core_grammar_accept(&st0, ws, pick, &err);
            if (rc == CORE_ERANGE || rc0 == CORE_ERANGE) {
                ambiguous++;
                break;
            }
            CHECK_MSG(rc == 0 && rc0 == 0, "accept: %s", err.msg);
            memcpy(text_so_far + n, tv.b[pick], tv.len[pick]);
            n += tv.len[pick];
        }
        core_grammar_state_clear(&st);
        core_grammar_state_clear(&st0);
    }
    free(me);
    free(m0);
    free(mr);
    core_grammar_ws_free(ws);
    core_grammar_free(g);
    core_grammar_free(g0);
    return bad ? -1 : compared;
}

TEST(random_grammars_match_reference)
{
    /* GRAMMAR_TRIALS / GRAMMAR_SEED run more or other grammars by hand */
    core_rng_seed(&rng, getenv("GRAMMAR_SEED") ? strtoull(getenv("GRAMMAR_SEED"), NULL, 10) : 15);
    int trials = getenv("GRAMMAR_TRIALS") ? atoi(getenv("GRAMMAR_TRIALS")) : 400;
    long steps = 0;
    for (int i = 0; i < trials; i++) {
        make_vocab(300);
        core_grammar_vocab_t *gv = vocab_of(&tv);
        rand_grammar();
        sbuf_t s;
        print_grammar(&s);
        int n = compare_walks(s.b, gv, 3, 12, 40);
        core_grammar_vocab_free(gv);
        if (n < 0)
            break;
        steps += n;
    }
    printf("  %d random grammars, %ld mask steps compared, %d walks ended by the ambiguity "
           "bound, %d by the reference's budget\n",
           trials, steps, ambiguous, too_slow);
    CHECK(too_slow < trials / 20);
    CHECK(steps > 10 * trials);
    CHECK(ambiguous < trials / 4);
}

/* A JSON-like grammar: nesting through rules referenced from several places
 * (the position tables' context-dependent case), strings with escapes and
 * any non-control character, numbers. */
static void json_grammar(void)
{
    grammar_reset();
    static const char *names[] = {"root",   "value",  "object", "array",
                                  "string", "number", "ws",     "member"};
    n_rules = 8;
    for (int i = 0; i < n_rules; i++)
        rule_names[i] = names[i];
    rnode_t *ws =
        rep(cls(0, 2, (uint32_t)' ', (uint32_t)' ', (uint32_t)'\n', (uint32_t)'\n'), 0, 2);
    rules[0] = seq(1, ref(1));
    rules[1] = alt(7, ref(2), ref(3), ref(4), ref(5), lit("true"), lit("false"), lit("null"));
    rules[7] = seq(5, ref(4), ref(6), lit(":"), ref(6), ref(1));
    rules[2] = seq(4, lit("{"), ref(6),
                   rep(seq(2, ref(7), rep(seq(4, ref(6), lit(","), ref(6), ref(7)), 0, INF)), 0, 1),
                   lit("}"));
    rules[3] = seq(4, lit("["), ref(6),
                   rep(seq(2, ref(1), rep(seq(4, ref(6), lit(","), ref(6), ref(1)), 0, INF)), 0, 1),
                   lit("]"));
    rules[4] = seq(
        3, lit("\""),
        rep(alt(2,
                cls(1, 3, (uint32_t)'"', (uint32_t)'"', (uint32_t)'\\', (uint32_t)'\\', 0u, 0x1Fu),
                seq(2, lit("\\"),
                    cls(0, 4, (uint32_t)'"', (uint32_t)'"', (uint32_t)'\\', (uint32_t)'\\',
                        (uint32_t)'n', (uint32_t)'n', (uint32_t)'t', (uint32_t)'t'))),
            0, INF),
        lit("\""));
    rules[5] =
        seq(3, rep(lit("-"), 0, 1),
            alt(2, lit("0"),
                seq(2, cls(0, 1, (uint32_t)'1', (uint32_t)'9'),
                    rep(cls(0, 1, (uint32_t)'0', (uint32_t)'9'), 0, INF))),
            rep(seq(2, lit("."), rep(cls(0, 1, (uint32_t)'0', (uint32_t)'9'), 1, INF)), 0, 1));
    rules[6] = ws;
}

/* JSON-flavoured tokens: punctuation runs, keywords, digits, quoted words,
 * escapes, multi-byte characters whole and cut. */
static void make_json_vocab(void)
{
    static const char *const toks[] = {
        "{",    "}",     "[",     "]",        "\"",   ":",        ",",        " ",      "\n",
        "{\"",  "\":",   "\",",   "\"}",      "\"]",  "},",       "],",       ": ",     ", ",
        "[{",   "}]",    "{}",    "[]",       "true", "false",    "null",     "tr",     "ue",
        "nu",   "ll",    "0",     "1",        "12",   "-",        "-1",       ".",      ".5",
        "0.",   "3.14",  "a",     "ab",       "abc",  "key",      "\"a\"",    "\\",     "\\n",
        "\\\"", "\\t",   "é",     "\xC3",     "\xA9", "€",        "\xE2\x82", "\xAC\"", "x\"",
        "a\":", "\"\"",  " \"",   "\n\"",     "  ",   "null,",    "true]",    "1,",     "9}",
        ", \"", "\":\"", "\": {", "\"b\": [", "😀",    "\xF0\x9F", "\x98\x80", "\x7F",   "\x01"};
    memset(&tv, 0, sizeof tv);
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        tv.len[tv.n] = strlen(toks[i]);
        memcpy(tv.b[tv.n], toks[i], tv.len[tv.n]);
        tv.kind[tv.n++] = CORE_GRAMMAR_TOK_TEXT;
    }
    tv.kind[tv.n++] = CORE_GRAMMAR_TOK_END;
}

TEST(json_grammar_matches_reference)
{
    core_rng_seed(&rng, 42);
    json_grammar();
    make_json_vocab();
    core_grammar_vocab_t *gv = vocab_of(&tv);
    sbuf_t s;
    print_grammar(&s);
    int n = compare_walks(s.b, gv, 60, 40, 1024);
    printf("  json: %d mask steps compared\n", n);
    CHECK(n > 300);
    core_grammar_vocab_free(gv);
}

/* ------------------------------------------------------------ language checks */

static core_grammar_vocab_t *byte_vocab(void)
{
    make_vocab(0);
    return vocab_of(&tv);
}

static core_grammar_t *compile(const char *text, core_grammar_vocab_t *gv)
{
    core_grammar_t *g = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_grammar_new(text, strlen(text), gv, NULL, &g, &err) == 0, "%s: %s", text,
              err.msg);
    return g;
}

/* 1 when s is in the language, 0 when it is a proper prefix only, -1 when
 * it cannot be continued. */
static int judge(core_grammar_t *g, const char *s)
{
    core_grammar_state_t st;
    core_grammar_ws_t *ws = core_grammar_ws_new();
    core_error_t err = {0};
    int r = -2;
    if (core_grammar_state_init(&st, g, &err) == 0) {
        if (core_grammar_accept_bytes(&st, ws, s, strlen(s), &err) != 0)
            r = -1;
        else
            r = core_grammar_state_accepting(&st);
        core_grammar_state_clear(&st);
    }
    core_grammar_ws_free(ws);
    return r;
}

TEST(syntax_forms)
{
    static const struct {
        const char *grammar, *in, *prefix, *out;
    } cases[] = {
        {"root ::= \"yes\" | \"no\"", "yes", "n", "yess"},
        {"root ::= \"a\"\n    | \"b\"  # more alternatives on their own lines\n    | \"c\"", "c",
         "", "d"},
        {"# a comment line\n\nroot ::= x+ \"!\"\nx ::= [a-c]", "abca!", "ab", "!"},
        {"root ::= [^a-z]{2,3}", "AB9", "A", "Aa"},
        {"root ::= \"x\"{,2} \"y\"", "xxy", "xx", "xxx"},
        {"root ::= \"x\"{2,} \"y\"", "xxxxy", "x", "xy"},
        {"root ::= \"x\"{3}", "xxx", "xx", "xxxx"},
        {"root ::= (\"a\" | \"b\" \"c\")* \"d\"", "abcad", "abc", "ac"},
        {"root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\\\\\\"\"", "A\xC3\xA9\xF0\x9F\x98\x80\n\t\\\"",
         "A\xC3", "A\xC3\xA8"},
        {"root ::= . .",
         "\xE2\x82\xAC"
         "a",
         "\xE2\x82",
         "\xE2\x82"
         "a"},
        {"root ::= [\\]\\-\\^]+", "]-^", "", "a"},
        {"root ::= empty \"a\"\nempty ::=\nother ::= \"b\"", "a", "", "b"},
        {"root ::=\n  \"split\" (\n  \"a\" |\n  \"b\"\n)", "splitb", "spl", "splitc"},
        {"root ::= [\\u0000-\\U0010FFFF]", "\xF4\x8F\xBF\xBF", "\xF4\x8F", "\xED\xA0\x80"},
        {"root ::= [a-z_-]+", "a-b_c", "", "A"},
        {"root ::= \"é\"", "\xC3\xA9", "\xC3", "\xC3\xA8"},
    };
    core_grammar_vocab_t *gv = byte_vocab();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_grammar_t *g = compile(cases[i].grammar, gv);
        if (!g)
            continue;
        CHECK_MSG(judge(g, cases[i].in) == 1, "%s: '%s' should be in", cases[i].grammar,
                  cases[i].in);
        CHECK_MSG(judge(g, cases[i].prefix) == 0 || strcmp(cases[i].prefix, "") == 0,
                  "%s: '%s' should be a proper prefix", cases[i].grammar, cases[i].prefix);
        CHECK_MSG(judge(g, cases[i].out) == -1, "%s: '%s' should be refused", cases[i].grammar,
                  cases[i].out);
        core_grammar_free(g);
    }
    core_grammar_vocab_free(gv);
}

/* ------------------------------------------------------------ invalid grammars */

TEST(invalid_grammars_have_clear_errors)
{
    static const struct {
        const char *text;
        int code;
        const char *where; /* "line L, column C" */
        const char *says;
    } cases[] = {
        {"", CORE_EFORMAT, "line 1, column 1", "no rule named 'root'"},
        {"# only a comment\n", CORE_EFORMAT, "line 1, column 1", "no rule named 'root'"},
        {"root", CORE_EFORMAT, "line 1, column 5", "expected '::=' after the rule name 'root'"},
        {"root := \"a\"", CORE_EFORMAT, "line 1, column 6", "expected '::='"},
        {"root ::= \"abc", CORE_EFORMAT, "line 1, column 10", "literal is not closed"},
        {"root ::= \"ab\nc\"", CORE_EFORMAT, "line 1, column 10", "the end of the line"},
        {"root ::= [a-", CORE_EFORMAT, "line 1, column 10", "not closed"},
        {"root ::= [z-a]", CORE_EFORMAT, "line 1, column 11", "reversed"},
        {"root ::= []", CORE_EFORMAT, "line 1, column 10", "empty character class"},
        {"root ::= [^\\x00-\\U0010FFFF]", CORE_EFORMAT, "line 1, column 10",
         "matches no character"},
        {"root ::= (\"a\"", CORE_EFORMAT, "line 1, column 14", "expected ')' to close the '('"},
        {"root ::= (\"a\"\n", CORE_EFORMAT, "line 2, column 1", "expected ')'"},
        {"root ::= \"a\")", CORE_EFORMAT, "line 1, column 13", "unmatched ')'"},
        {"root ::= foo", CORE_EFORMAT, "line 1, column 10", "the rule 'foo' is not defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", CORE_EFORMAT, "line 2, column 1",
         "defined twice (first at line 1)"},
        {"root ::= root \"a\" | \"b\"", CORE_EFORMAT, "line 1, column 1",
         "left recursion: 'root' -> 'root'"},
        {"root ::= x\nx ::= y? root | \"a\"\ny ::= \"b\"", CORE_EFORMAT, "line 1, column 1",
         "left recursion: 'root' -> 'x' -> 'root'"},
        {"root ::= (\"a\"?)*", CORE_EFORMAT, "line 1, column 16", "can match the empty string"},
        {"root ::= \"\"*", CORE_EFORMAT, "line 1, column 12", "only the empty string"},
        {"root ::= \"a\" root", CORE_EFORMAT, "line 1, column 1", "never produce a complete"},
        {"root ::= x\nx ::= \"(\" x \")\"", CORE_EFORMAT, "line 2, column 1", "'x' can never"},
        {"root ::= \"a\"{3,2}", CORE_EFORMAT, "line 1, column 13", "maximum below its minimum"},
        {"root ::= \"a\"{1001}", CORE_ERANGE, "line 1, column 13", "above 1000"},
        {"root ::= \"a\"{}", CORE_EFORMAT, "line 1, column 13", "needs a count"},
        {"root ::= \"a\"{1;2}", CORE_EFORMAT, "line 1, column 15", "expected a count, ','"},
        {"root ::= \"a\"{1,2", CORE_EFORMAT, "line 1, column 17", "expected '}'"},
        {"root ::= \"a\"**", CORE_EFORMAT, "line 1, column 14", "cannot be repeated directly"},
        {"root ::= \"\\q\"", CORE_EFORMAT, "line 1, column 11", "unknown escape"},
        {"root ::= \"\\uD800\"", CORE_EFORMAT, "line 1, column 11", "surrogate"},
        {"root ::= \"\\U00110000\"", CORE_EFORMAT, "line 1, column 11", "beyond U+10FFFF"},
        {"root ::= \"\\x4\"", CORE_EFORMAT, "line 1, column 11", "2 hex digits"},
        {"root ::= \"\\", CORE_EFORMAT, "line 1, column 11", "cut by the end"},
        {"root ::= \"\xff\"", CORE_EFORMAT, "line 1, column 11", "invalid UTF-8"},
        {"root ::= \"\xc3\"", CORE_EFORMAT, "line 1, column 11", "invalid UTF-8"},
        {"root ::= \"\xc3\xa9\" \xed\xa0\x80", CORE_EFORMAT, "line 1, column 14", "invalid UTF-8"},
        {"root ::= \"a\" b ::= \"c\"", CORE_EFORMAT, "line 1, column 16", "'::=' must follow"},
        {"  \"a\"", CORE_EFORMAT, "line 1, column 3", "expected a rule name"},
        {"root ::= *", CORE_EFORMAT, "line 1, column 10", "expected an item"},
        {"root ::= \"a\"\n  \"b\"", CORE_EFORMAT, "line 2, column 3", "only after '|'"},
        {"root ::= \"é\" @", CORE_EFORMAT, "line 1, column 14", "found '@'"},
        {"root ::= [a-\n]", CORE_EFORMAT, "line 1, column 13", "upper end"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        core_grammar_t *g = NULL;
        core_error_t err = {0};
        int rc = core_grammar_new(cases[i].text, strlen(cases[i].text), NULL, NULL, &g, &err);
        CHECK_MSG(rc == cases[i].code, "case %zu (%s): rc %d, expected %d (%s)", i, cases[i].text,
                  rc, cases[i].code, err.msg);
        CHECK_MSG(g == NULL, "case %zu: a grammar came back", i);
        CHECK_MSG(strncmp(err.msg, cases[i].where, strlen(cases[i].where)) == 0 &&
                      strstr(err.msg, cases[i].says) != NULL,
                  "case %zu (%s): message \"%s\", expected \"%s: ...%s...\"", i, cases[i].text,
                  err.msg, cases[i].where, cases[i].says);
        core_grammar_free(g);
    }
    /* a NUL byte inside the text */
    core_grammar_t *g = NULL;
    core_error_t err = {0};
    CHECK(core_grammar_new("root ::= \"a\"\0", 13, NULL, NULL, &g, &err) == CORE_EFORMAT);
    CHECK(strstr(err.msg, "NUL") != NULL);
}

TEST(bounds_are_enforced)
{
    core_grammar_t *g = NULL;
    core_error_t err = {0};
    char buf[4096];
    /* nesting */
    size_t n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
    for (int i = 0; i < 65; i++)
        buf[n++] = '(';
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a\"");
    for (int i = 0; i < 65; i++)
        buf[n++] = ')';
    buf[n] = 0;
    CHECK(core_grammar_new(buf, n, NULL, NULL, &g, &err) == CORE_ERANGE);
    CHECK(strstr(err.msg, "nested deeper than 64") != NULL);
    /* 64 levels are fine */
    n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
    for (int i = 0; i < 64; i++)
        buf[n++] = '(';
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a\"");
    for (int i = 0; i < 64; i++)
        buf[n++] = ')';
    buf[n] = 0;
    CHECK(core_grammar_new(buf, n, NULL, NULL, &g, &err) == 0);
    core_grammar_free(g);
    /* elements: repetitions multiply */
    core_grammar_limits_t lim = {.max_elements = 3000};
    const char *big = "root ::= x{1000} x{1000} x{1000}\nx ::= [a-z]{1000}";
    CHECK(core_grammar_new(big, strlen(big), NULL, &lim, &g, &err) == CORE_ERANGE);
    CHECK(strstr(err.msg, "more than 3000 elements") != NULL);
    /* the default bound holds a hostile nest of counted repetitions */
    const char *bomb = "root ::= ((((\"a\"{1000}){1000}){1000}){1000})";
    CHECK(core_grammar_new(bomb, strlen(bomb), NULL, NULL, &g, &err) == 0);
    core_grammar_free(g);
    n = (size_t)snprintf(buf, sizeof buf, "root ::=");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, " x{0,1000}");
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\nx ::= \"a\"");
    CHECK(core_grammar_new(buf, n, NULL, NULL, &g, &err) == CORE_ERANGE);
    CHECK(strstr(err.msg, "line 1, column ") != NULL && strstr(err.msg, "elements") != NULL);
    /* rules */
    core_grammar_limits_t lr = {.max_rules = 3};
    const char *rr = "root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"";
    CHECK(core_grammar_new(rr, strlen(rr), NULL, &lr, &g, &err) == CORE_ERANGE);
    CHECK(strstr(err.msg, "more than 3 named rules") != NULL);
    /* text */
    core_grammar_limits_t lt = {.max_text = 10};
    CHECK(core_grammar_new("root ::= \"abc\"", 14, NULL, &lt, &g, &err) == CORE_ERANGE);
    /* repetition count */
    core_grammar_limits_t lc = {.max_repeat = 5};
    CHECK(core_grammar_new("root ::= \"a\"{6}", 15, NULL, &lc, &g, &err) == CORE_ERANGE);

    /* ambiguity (2^n stacks after n x's): found when compiling, with the
     * text that meets the bound */
    core_grammar_vocab_t *gv = byte_vocab();
    const char *amb = "root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"";
    CHECK(core_grammar_new(amb, strlen(amb), gv, NULL, &g, &err) == CORE_ERANGE && !g);
    CHECK_MSG(strstr(err.msg, "too ambiguous: more than 512 parse stacks") &&
                  strstr(err.msg, "(after the text \"xxxxxxxx\")"),
              "%s", err.msg);
    /* a repetition of a repetition that can read nothing: every split of
     * the x's is a reading (a schema pattern "^(x{0,1000}){0,1000}$" once
     * failed only at generation, with a 500) */
    const char *rr2 = "root ::= \"\\\"\" ( \"x\"{0,1000} ){0,1000} \"\\\"\"";
    CHECK(core_grammar_new(rr2, strlen(rr2), gv, NULL, &g, &err) == CORE_ERANGE && !g);
    CHECK_MSG(strstr(err.msg, "too ambiguous") && strstr(err.msg, "(after the text \"\\\"\")"),
              "%s", err.msg);
    /* many alternatives alike are not ambiguous past the bound: 300 keys
     * after one quote keep 300 stacks (an object of 256 optional
     * properties keeps 259 after "{") */
    {
        char keys[8192];
        size_t k = (size_t)snprintf(keys, sizeof keys, "root ::= \"\\\"\" ( \"k0\"");
        for (int i = 1; i < 300; i++)
            k += (size_t)snprintf(keys + k, sizeof keys - k, " | \"k%d\"", i);
        snprintf(keys + k, sizeof keys - k, " ) \"\\\"\"");
        CHECK_MSG(core_grammar_new(keys, strlen(keys), gv, NULL, &g, &err) == 0, "%s", err.msg);
        core_grammar_state_t s300;
        core_grammar_ws_t *w300 = core_grammar_ws_new();
        CHECK(core_grammar_state_init(&s300, g, &err) == 0);
        CHECK(core_grammar_accept_bytes(&s300, w300, "\"k", 2, &err) == 0 &&
              s300.n_stacks == 300);
        core_grammar_state_clear(&s300);
        core_grammar_ws_free(w300);
        core_grammar_free(g);
    }
    /* and while generating, past what the probe explored (max_probe 1:
     * the start only) */
    core_grammar_limits_t l1 = {.max_probe = 1};
    CHECK(core_grammar_new(amb, strlen(amb), gv, &l1, &g, &err) == 0);
    core_grammar_state_t st;
    core_grammar_ws_t *ws = core_grammar_ws_new();
    CHECK(core_grammar_state_init(&st, g, &err) == 0);
    int rc = 0;
    for (int i = 0; i < 12 && rc == 0; i++)
        rc = core_grammar_accept_bytes(&st, ws, "x", 1, &err);
    CHECK(rc == CORE_ERANGE && strstr(err.msg, "ambiguous") != NULL);
    core_grammar_state_clear(&st);
    core_grammar_free(g);
    /* depth */
    g = compile("root ::= \"(\" root \")\" | \"\"", gv);
    CHECK(core_grammar_state_init(&st, g, &err) == 0);
    rc = 0;
    int i;
    for (i = 0; i < 5000 && rc == 0; i++)
        rc = core_grammar_accept_bytes(&st, ws, "(", 1, &err);
    CHECK(rc == CORE_ERANGE && strstr(err.msg, "deeper than 4096") != NULL);
    CHECK(i > 4000);
    uint64_t mask[CORE_GRAMMAR_MASK_WORDS(300)];
    CHECK(core_grammar_mask(&st, ws, mask, tv.n, &err) == 0); /* the state is still usable */
    core_grammar_state_clear(&st);
    core_grammar_free(g);
    /* paths explored by one closure: 2^24 ways to read nothing, met by
     * the start state when compiling */
    const char *paths = "root ::= x x x x x x x x x x x x x x x x x x x x x x x x \"a\"\n"
                        "x ::= \"\" | \"\"";
    CHECK(core_grammar_new(paths, strlen(paths), gv, NULL, &g, &err) == CORE_ERANGE && !g);
    CHECK_MSG(strstr(err.msg, "parse paths (at the start of the text)"), "%s", err.msg);
    core_grammar_ws_free(ws);
    core_grammar_vocab_free(gv);
}

/* ------------------------------------------------------------ states */

TEST(state_copy_is_independent_and_end_tokens)
{
    make_vocab(0);
    int end = 256, never = 257;
    core_grammar_vocab_t *gv = vocab_of(&tv);
    core_grammar_t *g = compile("root ::= \"ab\" | \"abc\"", gv);
    core_grammar_ws_t *ws = core_grammar_ws_new();
    core_error_t err = {0};
    core_grammar_state_t a, b = {0};
    CHECK(core_grammar_state_init(&a, g, &err) == 0);
    CHECK(core_grammar_accept(&a, ws, 'a', &err) == 0);
    CHECK(core_grammar_state_copy(&b, &a, &err) == 0);
    CHECK(core_grammar_accept(&a, ws, 'b', &err) == 0);
    CHECK(core_grammar_state_accepting(&a) && core_grammar_state_can_continue(&a));
    CHECK(!core_grammar_state_accepting(&b));
    uint64_t m[CORE_GRAMMAR_MASK_WORDS(300)];
    CHECK(core_grammar_mask(&a, ws, m, tv.n, &err) == 0);
    CHECK(bit(m, 'c') && bit(m, end) && !bit(m, never) && !bit(m, 'b'));
    CHECK(core_grammar_mask(&b, ws, m, tv.n, &err) == 0);
    CHECK(bit(m, 'b') && !bit(m, end) && !bit(m, 'c'));
    CHECK(core_grammar_accept(&b, ws, end, &err) == CORE_EINVAL);
    CHECK(core_grammar_accept(&b, ws, never, &err) == CORE_EINVAL);
    CHECK(core_grammar_accept(&b, ws, 'z', &err) == CORE_EINVAL);
    CHECK(core_grammar_accept(&b, ws, 'b', &err) == 0); /* b was unchanged by the refusals */
    CHECK(core_grammar_accept(&a, ws, 'c', &err) == 0);
    CHECK(core_grammar_state_accepting(&a) && !core_grammar_state_can_continue(&a));
    CHECK(core_grammar_mask(&a, ws, m, tv.n, &err) == 0);
    int allowed = 0;
    for (int t = 0; t < tv.n; t++)
        allowed += bit(m, t);
    CHECK(allowed == 1 && bit(m, end)); /* only the end */
    CHECK(core_grammar_accept(&a, ws, end, &err) == 0);
    /* a mask over more tokens than the vocabulary leaves the rest 0 */
    uint64_t big[CORE_GRAMMAR_MASK_WORDS(1000)];
    memset(big, 0xFF, sizeof big);
    CHECK(core_grammar_mask(&b, ws, big, 1000, &err) == 0);
    for (int t = 300; t < 1000; t++)
        CHECK(!bit(big, t));
    core_grammar_state_clear(&a);
    core_grammar_state_clear(&b);
    core_grammar_state_clear(&b); /* twice is fine */
    core_grammar_ws_free(ws);
    core_grammar_free(g);
    core_grammar_vocab_free(gv);
}

int main(void)
{
    RUN(syntax_forms);
    RUN(invalid_grammars_have_clear_errors);
    RUN(bounds_are_enforced);
    RUN(state_copy_is_independent_and_end_tokens);
    RUN(json_grammar_matches_reference);
    RUN(random_grammars_match_reference);
    return CHECK_DONE();
}
