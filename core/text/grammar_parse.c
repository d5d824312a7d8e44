/* core/text/grammar_parse.c — grammar text -> the compiled arrays of
 * grammar_impl.h, with every check that can be made before generating:
 * syntax (line/column and what was expected), undefined and twice-defined
 * rules, a missing root, rules that can never end, left recursion, and the
 * size bounds of core_grammar_limits_t.
 *
 * Expansion (docs/GRAMMAR.md states the language; this is how it is built):
 *   "abc"      a run of singleton byte sets (the UTF-8 of each code point)
 *   [..] .     one byte set when every code point is ASCII; otherwise a rule
 *              whose alternatives are the UTF-8 byte-range sequences of the
 *              class (one for all its ASCII code points, one per sequence of
 *              multi-byte ranges, as utf8_split() cuts them)
 *   ( .. )     a rule of its own
 *   x*         S ::= x S | ""          x+  = x S
 *   x?         O ::= x | ""            x{m,n} = x (m times) then O_(n-m),
 *                                       O_1 ::= x | "", O_k ::= x O_(k-1) | ""
 * A repeated item that is more than one element becomes a rule first, so
 * every repetition repeats one element. The loops call themselves last
 * (tail calls), so they never grow a parse stack.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/grammar_impl.h"

#define NO_RULE 0xFFFFFFFFu
#define INF_REPEAT 0xFFFFFFFFu
#define MAX_CP 0x10FFFFu

/* What made a rule (for messages). */
enum { RK_START = 0, RK_NAMED, RK_GROUP, RK_REPEAT, RK_CLASS, RK_LITERAL };

typedef struct balt {
    gel_t *el;
    uint32_t n, cap;
} balt_t;

typedef struct brule {
    const char *name; /* into the text; NULL unless RK_NAMED */
    uint32_t name_len;
    int kind;
    int defined;
    size_t pos;     /* definition (named) or the construct (helpers) */
    size_t use_pos; /* first reference (named) */
    uint32_t *alts; /* [n_alts] indices into parser.alts */
    uint32_t n_alts, cap_alts;
} brule_t;

typedef struct cprange {
    uint32_t lo, hi;
} cprange_t;

typedef struct parser {
    const char *s;
    size_t len, pos;
    const core_grammar_limits_t *lim;
    core_error_t *err;
    brule_t *rules;
    uint32_t n_rules, cap_rules, n_named;
    balt_t *alts;
    uint32_t n_alts, cap_alts;
    size_t n_el; /* elements so far, END of each alternative included */
    gset_t *sets;
    uint32_t n_sets, cap_sets;
    uint32_t single[256]; /* set index + 1 of the singleton of each byte; 0 = none yet */
    uint32_t *names;      /* open-addressing table of named rule ids, [hcap] */
    uint32_t hcap;
    uint32_t nesting;
    unsigned char *lit; /* decoded literal bytes */
    size_t lit_len, lit_cap;
    cprange_t *cr; /* class ranges */
    size_t n_cr, cap_cr;
} parser_t;

/* ------------------------------------------------------------ errors */

static void line_col(const parser_t *P, size_t pos, int *line, int *col)
{
    int l = 1, c = 1;
    if (pos > P->len)
        pos = P->len;
    for (size_t i = 0; i < pos; i++) {
        unsigned char ch = (unsigned char)P->s[i];
        if (ch == '\n') {
            l++;
            c = 1;
        } else if ((ch & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int perr(parser_t *P, size_t pos, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int perr(parser_t *P, size_t pos, int code, const char *fmt, ...)
{
    char msg[CORE_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    line_col(P, pos, &line, &col);
    core_error_set(P->err, code, "line %d, column %d: %s", line, col, msg);
    /* code itself, so that the analyzer sees every error return is nonzero */
    return code;
}

static int oom(parser_t *P)
{
    core_error_set(P->err, CORE_ENOMEM, "out of memory compiling the grammar");
    return CORE_ENOMEM;
}

/* A short description of the text at pos, for "found ..." */
static void describe(const parser_t *P, size_t pos, char *out, size_t cap)
{
    if (pos >= P->len) {
        snprintf(out, cap, "the end of the grammar");
        return;
    }
    unsigned char c = (unsigned char)P->s[pos];
    if (c == '\n')
        snprintf(out, cap, "the end of the line");
    else if (c >= 0x21 && c < 0x7F)
        snprintf(out, cap, "'%c'", c);
    else if (c == ' ' || c == '\t' || c == '\r')
        snprintf(out, cap, "a space");
    else
        snprintf(out, cap, "byte 0x%02X", c);
}

/* ------------------------------------------------------------ building */

static void *grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    uint32_t nc = *cap ? *cap : 4;
    while (nc < need)
        nc *= 2;
    void *np = realloc(p, (size_t)nc * elem);
    if (np)
        *cap = nc;
    return np;
}

static int count_elements(parser_t *P, size_t n, size_t pos)
{
    if (P->n_el + n > P->lim->max_elements)
        return perr(P, pos, CORE_ERANGE,
                    "the grammar expands to more than %u elements (repetitions and character "
                    "classes expand into rules)",
                    (unsigned)P->lim->max_elements);
    P->n_el += n;
    return 0;
}

static int new_rule(parser_t *P, int kind, size_t pos, uint32_t *id)
{
    brule_t *r = grow(P->rules, &P->cap_rules, P->n_rules + 1, sizeof *r);
    if (!r)
        return oom(P);
    P->rules = r;
    memset(&r[P->n_rules], 0, sizeof *r);
    r[P->n_rules].kind = kind;
    r[P->n_rules].pos = pos;
    r[P->n_rules].defined = kind != RK_NAMED;
    *id = P->n_rules++;
    return 0;
}

/* A new empty alternative of rule r; its index in *ai. Counts its END. */
static int new_alt(parser_t *P, uint32_t r, size_t pos, uint32_t *ai)
{
    int rc = count_elements(P, 1, pos);
    if (rc)
        return rc;
    balt_t *a = grow(P->alts, &P->cap_alts, P->n_alts + 1, sizeof *a);
    if (!a)
        return oom(P);
    P->alts = a;
    memset(&a[P->n_alts], 0, sizeof *a);
    brule_t *R = &P->rules[r];
    uint32_t *l = grow(R->alts, &R->cap_alts, R->n_alts + 1, sizeof *l);
    if (!l)
        return oom(P);
    R->alts = l;
    l[R->n_alts++] = P->n_alts;
    *ai = P->n_alts++;
    return 0;
}

static int push_el(parser_t *P, uint32_t ai, gel_t e, size_t pos)
{
    int rc = count_elements(P, 1, pos);
    if (rc)
        return rc;
    balt_t *a = &P->alts[ai];
    gel_t *el = grow(a->el, &a->cap, a->n + 1, sizeof *el);
    if (!el)
        return oom(P);
    a->el = el;
    el[a->n++] = e;
    return 0;
}

static int new_set(parser_t *P, const gset_t *s, uint32_t *idx)
{
    gset_t *v = grow(P->sets, &P->cap_sets, P->n_sets + 1, sizeof *v);
    if (!v)
        return oom(P);
    P->sets = v;
    v[P->n_sets] = *s;
    *idx = P->n_sets++;
    return 0;
}

static int byte_el(parser_t *P, unsigned b, gel_t *e)
{
    if (!P->single[b]) {
        gset_t s = {{0, 0, 0, 0}};
        s.w[b >> 6] |= 1ull << (b & 63);
        uint32_t idx = 0;
        int rc = new_set(P, &s, &idx);
        if (rc)
            return rc;
        P->single[b] = idx + 1;
    }
    *e = (gel_t){GEL_BYTES, P->single[b] - 1};
    return 0;
}

static uint32_t name_hash(const char *s, uint32_t n)
{
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The slot of named rule s[0..n) in P->names: its id, or NO_RULE where it
 * would go. */
static uint32_t find_named(const parser_t *P, const char *s, uint32_t n)
{
    uint32_t mask = P->hcap - 1, h = name_hash(s, n) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t r = P->names[h];
        if (r == NO_RULE || (P->rules[r].name_len == n && memcmp(P->rules[r].name, s, n) == 0))
            return h;
    }
}

/* The id of named rule s[0..n), added (undefined, first used at pos) when new. */
static int named_rule(parser_t *P, const char *s, uint32_t n, size_t pos, uint32_t *id)
{
    uint32_t h = find_named(P, s, n);
    if (P->names[h] != NO_RULE) {
        *id = P->names[h];
        return 0;
    }
    if (P->n_named >= P->lim->max_rules)
        return perr(P, pos, CORE_ERANGE, "more than %u named rules", (unsigned)P->lim->max_rules);
    int rc = new_rule(P, RK_NAMED, pos, id);
    if (rc)
        return rc;
    P->rules[*id].name = s;
    P->rules[*id].name_len = n;
    P->rules[*id].use_pos = pos;
    P->names[h] = *id;
    P->n_named++;
    return 0;
}

/* ------------------------------------------------------------ lexing */

static int at_end(const parser_t *P)
{
    return P->pos >= P->len;
}

static int peek(const parser_t *P)
{
    return P->pos < P->len ? (unsigned char)P->s[P->pos] : -1;
}

static int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* Skips spaces, tabs, CRs and comments; newlines too when nl. */
static void skip_ws(parser_t *P, int nl)
{
    while (!at_end(P)) {
        int c = peek(P);
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            P->pos++;
        } else if (c == '#') {
            while (!at_end(P) && peek(P) != '\n')
                P->pos++;
        } else {
            break;
        }
    }
}

/* Decodes the (already validated) UTF-8 code point at pos. */
static uint32_t decode_cp(parser_t *P)
{
    const unsigned char *s = (const unsigned char *)P->s + P->pos;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n > 1) {
        c &= 0x3Fu >> (n - 1);
        for (int i = 1; i < n; i++)
            c = (c << 6) | (s[i] & 0x3Fu);
    }
    P->pos += (size_t)n;
    return c;
}

static int hex_digits(parser_t *P, int n, uint32_t *out, size_t esc_pos)
{
    uint32_t v = 0;
    *out = 0;
    for (int i = 0; i < n; i++) {
        int c = peek(P);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return perr(P, esc_pos, CORE_EFORMAT, "the escape needs %d hex digits", n);
        v = v * 16 + (uint32_t)d;
        P->pos++;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static int read_char(parser_t *P, uint32_t *cp)
{
    size_t start = P->pos;
    if (peek(P) != '\\') {
        *cp = decode_cp(P);
        return 0;
    }
    P->pos++;
    int c = peek(P);
    if (c < 0)
        return perr(P, start, CORE_EFORMAT, "the escape '\\' is cut by the end of the grammar");
    P->pos++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/': *cp = (uint32_t)c; return 0;
    case 'x': return hex_digits(P, 2, cp, start);
    case 'u':
    case 'U': {
        int rc = hex_digits(P, c == 'u' ? 4 : 8, cp, start);
        if (rc)
            return rc;
        if (*cp > MAX_CP)
            return perr(P, start, CORE_EFORMAT, "U+%X is beyond U+10FFFF", (unsigned)*cp);
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return perr(P, start, CORE_EFORMAT,
                        "U+%04X is a surrogate, not a character (write the character itself)",
                        (unsigned)*cp);
        return 0;
    }
    default: {
        char what[32];
        describe(P, start + 1, what, sizeof what);
        return perr(P, start, CORE_EFORMAT,
                    "unknown escape '\\' followed by %s (known: \\n \\r \\t \\\\ \\\" \\' \\[ "
                    "\\] \\- \\^ \\/ \\xHH \\uHHHH \\UHHHHHHHH)",
                    what);
    }
    }
}

static size_t utf8_encode(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Offset of the first invalid UTF-8 sequence (or NUL byte) of s[0..n), n if none. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else {
            return i;
        }
        if (i + k >= n)
            return i; /* cut short by the end */
        for (size_t j = 1; j <= k; j++) {
            unsigned b = s[i + j];
            if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF))
                return i;
        }
        i += k + 1;
    }
    return n;
}

/* A literal or class that starts at start and meets the end of the line
 * (or of the text) before its closing character. */
static int not_closed(parser_t *P, size_t start, const char *what, char close)
{
    return perr(P, start, CORE_EFORMAT, "the %s is not closed (expected '%c' before %s)", what,
                close, at_end(P) ? "the end of the grammar" : "the end of the line");
}

/* ------------------------------------------------------------ classes */

static int cr_add(parser_t *P, uint32_t lo, uint32_t hi)
{
    if (P->n_cr == P->cap_cr) {
        size_t nc = P->cap_cr ? 2 * P->cap_cr : 16;
        cprange_t *v = realloc(P->cr, nc * sizeof *v);
        if (!v)
            return oom(P);
        P->cr = v;
        P->cap_cr = nc;
    }
    P->cr[P->n_cr++] = (cprange_t){lo, hi};
    return 0;
}

static int cr_cmp(const void *a, const void *b)
{
    uint32_t x = ((const cprange_t *)a)->lo, y = ((const cprange_t *)b)->lo;
    return (x > y) - (x < y);
}

/* Sorts and merges P->cr, complements it when neg, and cuts out the
 * surrogates: the code points the class matches, as disjoint ranges. */
static int cr_normalize(parser_t *P, int neg)
{
    qsort(P->cr, P->n_cr, sizeof *P->cr, cr_cmp);
    size_t n = 0;
    for (size_t i = 0; i < P->n_cr; i++) {
        if (n && P->cr[i].lo <= P->cr[n - 1].hi + 1) {
            if (P->cr[i].hi > P->cr[n - 1].hi)
                P->cr[n - 1].hi = P->cr[i].hi;
        } else {
            P->cr[n++] = P->cr[i];
        }
    }
    P->n_cr = n;
    if (neg) {
        /* the complement has at most n + 1 ranges */
        cprange_t *c = malloc((n + 1) * sizeof *c);
        if (!c)
            return oom(P);
        size_t m = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < n; i++) {
            if (P->cr[i].lo > next)
                c[m++] = (cprange_t){next, P->cr[i].lo - 1};
            next = P->cr[i].hi + 1;
        }
        if (next <= MAX_CP)
            c[m++] = (cprange_t){next, MAX_CP};
        P->n_cr = 0;
        for (size_t i = 0; i < m; i++) {
            int rc = cr_add(P, c[i].lo, c[i].hi);
            if (rc) {
                free(c);
                return rc;
            }
        }
        free(c);
    }
    /* cut [D800, DFFF] out (a range may straddle it): at most one more range */
    n = P->n_cr;
    for (size_t i = 0; i < n; i++) {
        cprange_t r = P->cr[i];
        if (r.hi < 0xD800 || r.lo > 0xDFFF)
            continue;
        if (r.lo < 0xD800)
            P->cr[i].hi = 0xD7FF;
        else
            P->cr[i] = (cprange_t){1, 0}; /* emptied, dropped below */
        if (r.hi > 0xDFFF) {
            int rc = cr_add(P, 0xE000, r.hi);
            if (rc)
                return rc;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < P->n_cr; i++)
        if (P->cr[i].lo <= P->cr[i].hi)
            P->cr[m++] = P->cr[i];
    P->n_cr = m;
    return 0;
}

/* UTF-8 sequences of a code point range: each one is k byte ranges such
 * that the code points of the range are exactly the byte strings of the
 * product of those ranges (k = 1..4). */
typedef struct u8seq {
    int k;
    unsigned char lo[4], hi[4];
} u8seq_t;

typedef struct u8out {
    u8seq_t *v;
    size_t n, cap;
} u8out_t;

static int u8_emit(u8out_t *o, const u8seq_t *s)
{
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 16;
        u8seq_t *v = realloc(o->v, nc * sizeof *v);
        if (!v)
            return -1;
        o->v = v;
        o->cap = nc;
    }
    o->v[o->n++] = *s;
    return 0;
}

static int enc_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Cuts [lo, hi] (no surrogates) until every piece is one product of byte
 * ranges: first at the encoding-length borders, then wherever lo and hi
 * differ above their last i continuation bytes while those are not a full
 * 0..63 span on both ends. Recursion depth is at most a few levels per
 * byte position. */
static int utf8_split(uint32_t lo, uint32_t hi, u8out_t *o)
{
    if (lo > hi)
        return 0;
    static const uint32_t border[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= border[i] && hi > border[i])
            return utf8_split(lo, border[i], o) < 0 ? -1 : utf8_split(border[i] + 1, hi, o);
    int n = enc_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_split(lo, lo | m, o) < 0 ? -1 : utf8_split((lo | m) + 1, hi, o);
            if ((hi & m) != m)
                return utf8_split(lo, (hi & ~m) - 1, o) < 0 ? -1 : utf8_split(hi & ~m, hi, o);
        }
    }
    u8seq_t s;
    unsigned char a[4] = {0}, b[4] = {0};
    s.k = (int)utf8_encode(lo, a);
    utf8_encode(hi, b);
    for (int i = 0; i < s.k; i++) {
        s.lo[i] = a[i];
        s.hi[i] = b[i];
    }
    return u8_emit(o, &s);
}

static void set_range(gset_t *s, unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi; b++)
        s->w[b >> 6] |= 1ull << (b & 63);
}

/* The element that matches one code point of the ranges in P->cr. */
static int class_element(parser_t *P, size_t pos, gel_t *out)
{
    u8out_t o = {0};
    gset_t ascii = {{0, 0, 0, 0}};
    int has_ascii = 0, rc = 0;
    for (size_t i = 0; i < P->n_cr; i++) {
        uint32_t lo = P->cr[i].lo, hi = P->cr[i].hi;
        if (lo < 0x80) {
            set_range(&ascii, lo, hi < 0x80 ? hi : 0x7F);
            has_ascii = 1;
            if (hi < 0x80)
                continue;
            lo = 0x80;
        }
        if (utf8_split(lo, hi, &o) < 0) {
            free(o.v);
            return oom(P);
        }
    }
    uint32_t idx = 0;
    if (o.n == 0) {
        if ((rc = new_set(P, &ascii, &idx)) == 0)
            *out = (gel_t){GEL_BYTES, idx};
        free(o.v);
        return rc;
    }
    uint32_t r = 0, ai = 0;
    if ((rc = new_rule(P, RK_CLASS, pos, &r)) != 0)
        goto done;
    if (has_ascii) {
        if ((rc = new_alt(P, r, pos, &ai)) != 0 || (rc = new_set(P, &ascii, &idx)) != 0 ||
            (rc = push_el(P, ai, (gel_t){GEL_BYTES, idx}, pos)) != 0)
            goto done;
    }
    for (size_t i = 0; i < o.n; i++) {
        if ((rc = new_alt(P, r, pos, &ai)) != 0)
            goto done;
        for (int k = 0; k < o.v[i].k; k++) {
            gset_t s = {{0, 0, 0, 0}};
            set_range(&s, o.v[i].lo[k], o.v[i].hi[k]);
            if ((rc = new_set(P, &s, &idx)) != 0 ||
                (rc = push_el(P, ai, (gel_t){GEL_BYTES, idx}, pos)) != 0)
                goto done;
        }
    }
    *out = (gel_t){GEL_REF, r};
done:
    free(o.v);
    return rc;
}

static int parse_class(parser_t *P, gel_t *out)
{
    size_t start = P->pos;
    P->pos++; /* '[' */
    int neg = 0;
    if (peek(P) == '^') {
        neg = 1;
        P->pos++;
    }
    P->n_cr = 0;
    int rc;
    for (;;) {
        int c = peek(P);
        if (c < 0 || c == '\n')
            return not_closed(P, start, "character class", ']');
        if (c == ']')
            break;
        size_t at = P->pos;
        uint32_t lo = 0, hi = 0;
        if ((rc = read_char(P, &lo)) != 0)
            return rc;
        hi = lo;
        if (peek(P) == '-' && P->pos + 1 < P->len && P->s[P->pos + 1] != ']') {
            P->pos++;
            if (peek(P) == '\n')
                return perr(P, P->pos, CORE_EFORMAT, "a range needs its upper end after '-'");
            if ((rc = read_char(P, &hi)) != 0)
                return rc;
            if (hi < lo)
                return perr(P, at, CORE_EFORMAT,
                            "the range U+%04X-U+%04X is reversed (its first character must "
                            "not come after its last)",
                            (unsigned)lo, (unsigned)hi);
        }
        if ((rc = cr_add(P, lo, hi)) != 0)
            return rc;
    }
    P->pos++; /* ']' */
    if (P->n_cr == 0)
        return perr(P, start, CORE_EFORMAT, "empty character class '[%s]'", neg ? "^" : "");
    if ((rc = cr_normalize(P, neg)) != 0)
        return rc;
    if (P->n_cr == 0)
        return perr(P, start, CORE_EFORMAT, "the character class matches no character");
    return class_element(P, start, out);
}

/* ------------------------------------------------------------ items */

/* A parsed item before repetition: nothing (""), one element, or a literal
 * of several bytes (in P->lit). */
typedef struct unit {
    int kind; /* 0 empty, 1 element, 2 literal */
    gel_t el;
} unit_t;

static int parse_alternatives(parser_t *P, uint32_t r, int top);

static int parse_literal(parser_t *P, unit_t *u)
{
    size_t start = P->pos;
    P->pos++; /* '"' */
    P->lit_len = 0;
    for (;;) {
        int c = peek(P);
        if (c < 0 || c == '\n')
            return not_closed(P, start, "literal", '"');
        if (c == '"')
            break;
        uint32_t cp = 0;
        int rc = read_char(P, &cp);
        if (rc)
            return rc;
        if (P->lit_len + 4 > P->lit_cap) {
            size_t nc = P->lit_cap ? 2 * P->lit_cap : 64;
            unsigned char *v = realloc(P->lit, nc);
            if (!v)
                return oom(P);
            P->lit = v;
            P->lit_cap = nc;
        }
        P->lit_len += utf8_encode(cp, P->lit + P->lit_len);
    }
    P->pos++;
    if (P->lit_len == 0) {
        u->kind = 0;
        return 0;
    }
    if (P->lit_len == 1) {
        u->kind = 1;
        return byte_el(P, P->lit[0], &u->el);
    }
    u->kind = 2;
    return 0;
}

/* Makes u one element (a literal becomes a rule of its own). */
static int unit_element(parser_t *P, unit_t *u, size_t pos)
{
    if (u->kind != 2)
        return 0;
    uint32_t r = 0, ai = 0;
    int rc;
    if ((rc = new_rule(P, RK_LITERAL, pos, &r)) != 0 || (rc = new_alt(P, r, pos, &ai)) != 0)
        return rc;
    for (size_t i = 0; i < P->lit_len; i++) {
        gel_t e;
        if ((rc = byte_el(P, P->lit[i], &e)) != 0 || (rc = push_el(P, ai, e, pos)) != 0)
            return rc;
    }
    u->kind = 1;
    u->el = (gel_t){GEL_REF, r};
    return 0;
}

static int append_unit(parser_t *P, uint32_t ai, const unit_t *u, size_t pos)
{
    int rc = 0;
    if (u->kind == 1)
        return push_el(P, ai, u->el, pos);
    for (size_t i = 0; u->kind == 2 && i < P->lit_len && rc == 0; i++) {
        gel_t e;
        if ((rc = byte_el(P, P->lit[i], &e)) == 0)
            rc = push_el(P, ai, e, pos);
    }
    return rc;
}

static int parse_count(parser_t *P, uint32_t *v, size_t brace)
{
    uint64_t x = 0;
    int any = 0;
    while (peek(P) >= '0' && peek(P) <= '9') {
        x = x * 10 + (uint64_t)(peek(P) - '0');
        if (x > P->lim->max_repeat)
            return perr(P, brace, CORE_ERANGE, "a repetition count is above %u",
                        (unsigned)P->lim->max_repeat);
        P->pos++;
        any = 1;
    }
    *v = any ? (uint32_t)x : INF_REPEAT;
    return 0;
}

/* {m} {m,} {m,n} {,n} at P->pos (the '{'). */
static int parse_braces(parser_t *P, uint32_t *min, uint32_t *max)
{
    size_t brace = P->pos;
    P->pos++;
    skip_ws(P, 0);
    uint32_t a = 0, b = 0;
    int rc = parse_count(P, &a, brace);
    if (rc)
        return rc;
    skip_ws(P, 0);
    if (peek(P) == '}') {
        if (a == INF_REPEAT)
            return perr(P, brace, CORE_EFORMAT, "'{}' needs a count: {m}, {m,}, {m,n} or {,n}");
        P->pos++;
        *min = *max = a;
        return 0;
    }
    if (peek(P) != ',')
        return perr(P, P->pos, CORE_EFORMAT, "expected a count, ',' or '}' in the repetition");
    P->pos++;
    skip_ws(P, 0);
    if ((rc = parse_count(P, &b, brace)) != 0)
        return rc;
    skip_ws(P, 0);
    if (peek(P) != '}')
        return perr(P, P->pos, CORE_EFORMAT, "expected '}' to close the repetition");
    P->pos++;
    *min = a == INF_REPEAT ? 0 : a;
    *max = b;
    if (b != INF_REPEAT && b < *min)
        return perr(P, brace, CORE_EFORMAT,
                    "the repetition {%u,%u} has its maximum below its "
                    "minimum",
                    (unsigned)*min, (unsigned)b);
    return 0;
}

/* Appends u repeated min..max times (max INF_REPEAT: no limit) to ai. */
static int repeat(parser_t *P, uint32_t ai, unit_t *u, uint32_t min, uint32_t max, size_t pos)
{
    int rc;
    if (u->kind == 0) {
        if (max == INF_REPEAT)
            return perr(P, pos, CORE_EFORMAT,
                        "the repeated item matches only the empty string, so the repetition "
                        "could loop forever");
        return 0;
    }
    if ((rc = unit_element(P, u, pos)) != 0)
        return rc;
    for (uint32_t i = 0; i < min; i++)
        if ((rc = push_el(P, ai, u->el, pos)) != 0)
            return rc;
    uint32_t r = 0, a1 = 0, a2 = 0;
    if (max == INF_REPEAT) {
        /* S ::= u S | "" */
        if ((rc = new_rule(P, RK_REPEAT, pos, &r)) != 0 || (rc = new_alt(P, r, pos, &a1)) != 0 ||
            (rc = push_el(P, a1, u->el, pos)) != 0 ||
            (rc = push_el(P, a1, (gel_t){GEL_REF, r}, pos)) != 0 ||
            (rc = new_alt(P, r, pos, &a2)) != 0)
            return rc;
        return push_el(P, ai, (gel_t){GEL_REF, r}, pos);
    }
    uint32_t prev = NO_RULE;
    for (uint32_t k = min; k < max; k++) {
        /* O_k ::= u O_(k-1) | "" */
        if ((rc = new_rule(P, RK_REPEAT, pos, &r)) != 0 || (rc = new_alt(P, r, pos, &a1)) != 0 ||
            (rc = push_el(P, a1, u->el, pos)) != 0)
            return rc;
        if (prev != NO_RULE && (rc = push_el(P, a1, (gel_t){GEL_REF, prev}, pos)) != 0)
            return rc;
        if ((rc = new_alt(P, r, pos, &a2)) != 0)
            return rc;
        prev = r;
    }
    if (prev != NO_RULE)
        return push_el(P, ai, (gel_t){GEL_REF, prev}, pos);
    return 0;
}

static int parse_item(parser_t *P, uint32_t ai)
{
    size_t start = P->pos;
    int c = peek(P);
    unit_t u = {0, {0, 0}};
    int rc;
    if (c == '"') {
        rc = parse_literal(P, &u);
    } else if (c == '[') {
        u.kind = 1;
        rc = parse_class(P, &u.el);
    } else if (c == '.') {
        P->pos++;
        P->n_cr = 0;
        u.kind = 1;
        if ((rc = cr_add(P, 0, MAX_CP)) == 0 && (rc = cr_normalize(P, 0)) == 0)
            rc = class_element(P, start, &u.el);
    } else if (c == '(') {
        if (P->nesting >= P->lim->max_nesting)
            return perr(P, start, CORE_ERANGE, "parentheses nested deeper than %u",
                        (unsigned)P->lim->max_nesting);
        P->pos++;
        uint32_t r = 0;
        if ((rc = new_rule(P, RK_GROUP, start, &r)) != 0)
            return rc;
        P->nesting++;
        skip_ws(P, 1);
        if ((rc = parse_alternatives(P, r, 0)) != 0)
            return rc;
        P->nesting--;
        if (peek(P) != ')') {
            char what[32];
            describe(P, P->pos, what, sizeof what);
            int line, col;
            line_col(P, start, &line, &col);
            return perr(P, P->pos, CORE_EFORMAT,
                        "expected ')' to close the '(' of line %d, column %d, found %s", line, col,
                        what);
        }
        P->pos++;
        u.kind = 1;
        u.el = (gel_t){GEL_REF, r};
    } else if (is_name_char(c)) {
        size_t n0 = P->pos;
        while (is_name_char(peek(P)))
            P->pos++;
        uint32_t r = 0;
        rc = named_rule(P, P->s + n0, (uint32_t)(P->pos - n0), n0, &r);
        u.kind = 1;
        u.el = (gel_t){GEL_REF, r};
    } else if (c == ':' && P->pos + 2 < P->len && memcmp(P->s + P->pos, "::=", 3) == 0) {
        return perr(P, start, CORE_EFORMAT,
                    "'::=' must follow a rule name at the start of a line (each rule starts "
                    "on a line of its own)");
    } else {
        char what[32];
        describe(P, start, what, sizeof what);
        return perr(P, start, CORE_EFORMAT,
                    "expected an item (a \"literal\", a [class], '.', a (group) or a rule name), "
                    "found %s",
                    what);
    }
    if (rc)
        return rc;
    c = peek(P);
    uint32_t min = 0, max = 0;
    size_t rpos = P->pos;
    if (c == '*' || c == '+' || c == '?') {
        P->pos++;
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : INF_REPEAT;
    } else if (c == '{') {
        if ((rc = parse_braces(P, &min, &max)) != 0)
            return rc;
    } else {
        return append_unit(P, ai, &u, start);
    }
    c = peek(P);
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return perr(P, P->pos, CORE_EFORMAT,
                    "a repetition cannot be repeated directly; put the item in parentheses");
    return repeat(P, ai, &u, min, max, rpos);
}

static int parse_sequence(parser_t *P, uint32_t r, int top)
{
    uint32_t ai;
    int rc = new_alt(P, r, P->pos, &ai);
    if (rc)
        return rc;
    for (;;) {
        skip_ws(P, !top);
        int c = peek(P);
        if (c < 0 || c == '|' || c == ')' || (top && c == '\n'))
            return 0;
        if ((rc = parse_item(P, ai)) != 0)
            return rc;
    }
}

/* Alternatives of rule r up to the end of the rule (top: a newline that is
 * not followed by a line starting with '|') or of the group (')'). */
static int parse_alternatives(parser_t *P, uint32_t r, int top)
{
    for (;;) {
        int rc = parse_sequence(P, r, top);
        if (rc)
            return rc;
        skip_ws(P, !top);
        if (peek(P) == '|') {
            P->pos++;
            skip_ws(P, 1);
            continue;
        }
        if (top) {
            size_t save = P->pos;
            skip_ws(P, 1);
            if (peek(P) == '|') {
                P->pos++;
                skip_ws(P, 1);
                continue;
            }
            P->pos = save;
        }
        return 0;
    }
}

/* Is a rule definition "name ::=" at P->pos? */
static int rule_starts(const parser_t *P)
{
    size_t i = P->pos;
    while (i < P->len && is_name_char((unsigned char)P->s[i]))
        i++;
    if (i == P->pos)
        return 0;
    while (i < P->len && (P->s[i] == ' ' || P->s[i] == '\t'))
        i++;
    return i + 3 <= P->len && memcmp(P->s + i, "::=", 3) == 0;
}

static int parse_rule(parser_t *P)
{
    size_t n0 = P->pos;
    while (is_name_char(peek(P)))
        P->pos++;
    if (P->pos == n0) {
        char what[32];
        describe(P, n0, what, sizeof what);
        return perr(P, n0, CORE_EFORMAT,
                    "expected a rule name (letters, digits, '_' or '-') at the start of a rule, "
                    "found %s (a rule continues on the next line only after '|' or inside "
                    "parentheses)",
                    what);
    }
    uint32_t nlen = (uint32_t)(P->pos - n0);
    skip_ws(P, 0);
    if (P->pos + 3 > P->len || memcmp(P->s + P->pos, "::=", 3) != 0) {
        char what[32];
        describe(P, P->pos, what, sizeof what);
        return perr(P, P->pos, CORE_EFORMAT, "expected '::=' after the rule name '%.*s', found %s",
                    (int)(nlen > 64 ? 64 : nlen), P->s + n0, what);
    }
    P->pos += 3;
    uint32_t r = 0;
    int rc = named_rule(P, P->s + n0, nlen, n0, &r);
    if (rc)
        return rc;
    brule_t *R = &P->rules[r];
    if (R->defined) {
        int line, col;
        line_col(P, R->pos, &line, &col);
        return perr(P, n0, CORE_EFORMAT, "the rule '%.*s' is defined twice (first at line %d)",
                    (int)(nlen > 64 ? 64 : nlen), P->s + n0, line);
    }
    R->defined = 1;
    R->pos = n0;
    /* The body may start on the next line; a rule whose next line starts
     * another rule is empty (matches ""). */
    skip_ws(P, 0);
    if (peek(P) == '\n') {
        size_t save = P->pos;
        skip_ws(P, 1);
        if (at_end(P) || rule_starts(P)) {
            P->pos = save;
            uint32_t ai;
            return new_alt(P, r, n0, &ai);
        }
    }
    if ((rc = parse_alternatives(P, r, 1)) != 0)
        return rc;
    skip_ws(P, 0);
    int c = peek(P);
    if (c >= 0 && c != '\n') {
        if (c == ')')
            return perr(P, P->pos, CORE_EFORMAT, "unmatched ')'");
        char what[32];
        describe(P, P->pos, what, sizeof what);
        return perr(P, P->pos, CORE_EFORMAT, "expected the end of the rule, found %s", what);
    }
    return 0;
}

/* ------------------------------------------------------------ checks */

/* A rule's name for messages: 'name', or what made it. */
static void rule_label(const parser_t *P, uint32_t r, char *out, size_t cap)
{
    const brule_t *R = &P->rules[r];
    switch (R->kind) {
    case RK_NAMED:
        snprintf(out, cap, "'%.*s'", (int)(R->name_len > 64 ? 64 : R->name_len), R->name);
        break;
    case RK_GROUP: snprintf(out, cap, "(group)"); break;
    case RK_REPEAT: snprintf(out, cap, "(repetition)"); break;
    default: snprintf(out, cap, "(item)"); break;
    }
}

/* Flattens the builder into g's arrays (rule order, alternatives in order,
 * an END after each). */
static int flatten(parser_t *P, core_grammar_t *g)
{
    g->n_rules = P->n_rules;
    g->n_el = (uint32_t)P->n_el;
    g->el = malloc((size_t)g->n_el * sizeof *g->el);
    g->el_rule = malloc((size_t)g->n_el * sizeof *g->el_rule);
    g->rule_alt = malloc(((size_t)g->n_rules + 1) * sizeof *g->rule_alt);
    g->alt_first = malloc(((size_t)P->n_alts + 1) * sizeof *g->alt_first);
    if (!g->el || !g->el_rule || !g->rule_alt || !g->alt_first)
        return oom(P);
    uint32_t e = 0, a = 0;
    for (uint32_t r = 0; r < P->n_rules; r++) {
        g->rule_alt[r] = a;
        const brule_t *R = &P->rules[r];
        for (uint32_t k = 0; k < R->n_alts; k++) {
            const balt_t *A = &P->alts[R->alts[k]];
            g->alt_first[a++] = e;
            for (uint32_t i = 0; i < A->n; i++) {
                g->el[e] = A->el[i];
                g->el_rule[e++] = r;
            }
            g->el[e] = (gel_t){GEL_END, 0};
            g->el_rule[e++] = r;
        }
    }
    g->rule_alt[P->n_rules] = a;
    g->n_sets = P->n_sets;
    g->sets = P->sets;
    P->sets = NULL;
    assert(P->n_rules > 0 && P->rules[0].n_alts > 0); /* the start rule, made first */
    g->start = g->alt_first[g->rule_alt[0]];
    return 0;
}

/* Fixpoint of "some alternative has only elements for which ok()":
 * nullable (BYTES never) and productive (BYTES always). */
static int fixpoint(const core_grammar_t *g, uint8_t *flag, int bytes_ok)
{
    /* Linear (a pass over every rule until nothing changes took a pass
     * per link of a chain of rules defined in the wrong order): each
     * alternative counts the references it still waits for; a rule that
     * gets its flag lowers the count of every alternative that refers to
     * it, and an alternative at 0 flags its rule. */
    uint32_t n_alts = g->rule_alt[g->n_rules];
    uint32_t *need = calloc((size_t)n_alts + 1, sizeof *need);
    uint32_t *alt_rule = calloc((size_t)n_alts + 1, sizeof *alt_rule);
    uint32_t *first = calloc((size_t)g->n_rules + 1, sizeof *first); /* CSR: rule -> alts */
    uint32_t *users = calloc((size_t)g->n_el + 1, sizeof *users);
    uint32_t *todo = malloc(((size_t)g->n_rules + 1) * sizeof *todo);
    int rc = -1;
    if (!need || !alt_rule || !first || !users || !todo)
        goto out;
    for (uint32_t r = 0; r < g->n_rules; r++)
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            alt_rule[a] = r;
            need[a] = 0;
            for (uint32_t e = g->alt_first[a]; !bytes_ok && g->el[e].kind != GEL_END; e++)
                if (g->el[e].kind == GEL_BYTES)
                    need[a] = UINT32_MAX; /* never: it reads a byte */
            if (need[a] == UINT32_MAX)
                continue;
            for (uint32_t e = g->alt_first[a]; g->el[e].kind != GEL_END; e++)
                if (g->el[e].kind == GEL_REF) {
                    need[a]++;
                    first[g->el[e].arg + 1]++;
                }
        }
    for (uint32_t r = 0; r < g->n_rules; r++)
        first[r + 1] += first[r];
    for (uint32_t a = 0; a < n_alts; a++) {
        if (need[a] == UINT32_MAX)
            continue;
        for (uint32_t e = g->alt_first[a]; g->el[e].kind != GEL_END; e++)
            if (g->el[e].kind == GEL_REF)
                users[first[g->el[e].arg]++] = a;
    }
    for (uint32_t r = g->n_rules; r > 0; r--) /* back to the starts */
        first[r] = first[r - 1];
    first[0] = 0;
    size_t nt = 0;
    for (uint32_t a = 0; a < n_alts; a++)
        if (need[a] == 0 && !flag[alt_rule[a]]) {
            flag[alt_rule[a]] = 1;
            todo[nt++] = alt_rule[a];
        }
    while (nt) {
        uint32_t t = todo[--nt];
        for (uint32_t k = first[t]; k < first[t + 1]; k++) {
            uint32_t a = users[k];
            if (--need[a] == 0 && !flag[alt_rule[a]]) {
                flag[alt_rule[a]] = 1;
                todo[nt++] = alt_rule[a];
            }
        }
    }
    rc = 0;
out:
    free(need);
    free(alt_rule);
    free(first);
    free(users);
    free(todo);
    return rc;
}

/* Left recursion: an edge r -> t when some alternative of r reaches REF t
 * after only nullable elements. A cycle reachable from the start is an
 * error naming it. Iterative DFS (rules can number hundreds of thousands). */
static int check_left_recursion(parser_t *P, const core_grammar_t *g, const uint8_t *nullable)
{
    uint32_t n = g->n_rules;
    uint32_t *first = malloc(((size_t)n + 1) * sizeof *first); /* CSR of the left edges */
    uint32_t *to = malloc(((size_t)g->n_el + 1) * sizeof *to);
    uint8_t *color = calloc(n, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *path = malloc((size_t)n * sizeof *path);
    uint32_t *next = malloc((size_t)n * sizeof *next); /* edge to follow next, per rule */
    int rc = 0;
    if (!first || !to || !color || !path || !next) {
        rc = oom(P);
        goto out;
    }
    uint32_t m = 0;
    for (uint32_t r = 0; r < n; r++) {
        first[r] = m;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            for (uint32_t e = g->alt_first[a]; g->el[e].kind == GEL_REF; e++) {
                to[m++] = g->el[e].arg;
                if (!nullable[g->el[e].arg])
                    break;
            }
    }
    first[n] = m;
    size_t depth = 0;
    path[depth++] = 0;
    color[0] = 1;
    next[0] = first[0];
    while (depth) {
        uint32_t r = path[depth - 1];
        if (next[r] == first[r + 1]) {
            color[r] = 2;
            depth--;
            continue;
        }
        uint32_t t = to[next[r]++];
        if (color[t] == 0) {
            color[t] = 1;
            next[t] = first[t];
            path[depth++] = t;
            continue;
        }
        if (color[t] == 2)
            continue;
        /* the cycle is path[k..depth) where path[k] == t */
        size_t k = depth - 1;
        while (path[k] != t)
            k--;
        for (size_t i = k; i < depth; i++)
            if (P->rules[path[i]].kind == RK_REPEAT) {
                rc = perr(P, P->rules[path[i]].pos, CORE_EFORMAT,
                          "the repeated item can match the empty string, so the repetition "
                          "could loop forever without reading anything");
                goto out;
            }
        char msg[400] = "";
        size_t used = 0;
        for (size_t i = k; i <= depth && used + 80 < sizeof msg; i++) {
            char lab[80];
            rule_label(P, i < depth ? path[i] : t, lab, sizeof lab);
            used +=
                (size_t)snprintf(msg + used, sizeof msg - used, "%s%s", i > k ? " -> " : "", lab);
        }
        uint32_t named = t;
        for (size_t i = k; i < depth; i++)
            if (P->rules[path[i]].kind == RK_NAMED) {
                named = path[i];
                break;
            }
        rc = perr(P, P->rules[named].pos, CORE_EFORMAT,
                  "left recursion: %s (a rule may not begin with itself, also not after items "
                  "that can match the empty string)",
                  msg);
        goto out;
    }
out:
    free(first);
    free(to);
    free(color);
    free(path);
    free(next);
    return rc;
}

static int check(parser_t *P, core_grammar_t *g)
{
    int rc = 0;
    for (uint32_t r = 0; r < P->n_rules; r++) {
        const brule_t *R = &P->rules[r];
        if (R->kind == RK_NAMED && !R->defined)
            return perr(P, R->use_pos, CORE_EFORMAT, "the rule '%.*s' is not defined",
                        (int)(R->name_len > 64 ? 64 : R->name_len), R->name);
    }
    uint8_t *nullable = calloc(g->n_rules, 1);
    uint8_t *productive = calloc(g->n_rules, 1);
    uint8_t *reach = calloc(g->n_rules, 1);
    uint32_t *todo = malloc((size_t)g->n_rules * sizeof *todo);
    if (!nullable || !productive || !reach || !todo) {
        rc = oom(P);
        goto out;
    }
    if (fixpoint(g, nullable, 0) < 0 || fixpoint(g, productive, 1) < 0) {
        rc = oom(P);
        goto out;
    }
    size_t nt = 0;
    reach[0] = 1;
    todo[nt++] = 0;
    while (nt) {
        uint32_t r = todo[--nt];
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            for (uint32_t e = g->alt_first[a]; g->el[e].kind != GEL_END; e++)
                if (g->el[e].kind == GEL_REF && !reach[g->el[e].arg]) {
                    reach[g->el[e].arg] = 1;
                    todo[nt++] = g->el[e].arg;
                }
    }
    /* A rule that can never end: with the start unproductive, follow
     * unproductive references from it until one repeats (that rule needs
     * itself; the others only need it); otherwise the first reachable one. */
    uint32_t bad = NO_RULE;
    if (!productive[0]) {
        uint8_t *seen = reach; /* reused */
        memset(seen, 0, g->n_rules);
        uint32_t r = 0;
        while (!seen[r]) {
            seen[r] = 1;
            uint32_t next = r;
            for (uint32_t e = g->alt_first[g->rule_alt[r]]; g->el[e].kind != GEL_END; e++)
                if (g->el[e].kind == GEL_REF && !productive[g->el[e].arg]) {
                    next = g->el[e].arg;
                    break;
                }
            r = next;
        }
        bad = r;
    }
    for (uint32_t r = 0; r < g->n_rules && bad == NO_RULE; r++)
        if (reach[r] && !productive[r])
            bad = r;
    if (bad != NO_RULE) {
        char lab[80];
        rule_label(P, bad, lab, sizeof lab);
        rc = perr(P, P->rules[bad].pos, CORE_EFORMAT,
                  "%s can never produce a complete string: each of its alternatives needs "
                  "itself (give it an alternative that ends)",
                  lab);
        goto out;
    }
    rc = check_left_recursion(P, g, nullable);
out:
    free(nullable);
    free(productive);
    free(reach);
    free(todo);
    return rc;
}

/* ------------------------------------------------------------ entry */

int gram_parse(core_grammar_t *g, const char *text, size_t len, core_error_t *err)
{
    parser_t P;
    memset(&P, 0, sizeof P);
    P.s = text;
    P.len = len;
    P.lim = &g->lim;
    P.err = err;
    int rc = 0;
    if (len > g->lim.max_text)
        return core_error_set(err, CORE_ERANGE, "the grammar is %zu bytes, at most %zu", len,
                              g->lim.max_text);
    if (!text && len)
        return core_error_set(err, CORE_EINVAL, "grammar text is NULL");
    size_t bad = utf8_check((const unsigned char *)text, len);
    if (bad < len)
        return perr(&P, bad, CORE_EFORMAT, "%s",
                    text[bad] ? "invalid UTF-8" : "a NUL byte (write \\x00 in a literal)");
    P.hcap = 1;
    while (P.hcap < 2 * g->lim.max_rules + 2)
        P.hcap *= 2;
    P.names = malloc((size_t)P.hcap * sizeof *P.names);
    if (!P.names)
        return oom(&P);
    memset(P.names, 0xFF, (size_t)P.hcap * sizeof *P.names);

    uint32_t start = 0, ai = 0;
    if ((rc = new_rule(&P, RK_START, 0, &start)) != 0 || (rc = new_alt(&P, start, 0, &ai)) != 0)
        goto out;
    for (;;) {
        skip_ws(&P, 1);
        if (at_end(&P))
            break;
        if ((rc = parse_rule(&P)) != 0)
            goto out;
    }
    uint32_t root = P.names[find_named(&P, "root", 4)];
    if (root == NO_RULE || !P.rules[root].defined) {
        rc = root == NO_RULE
                 ? perr(&P, 0, CORE_EFORMAT, "no rule named 'root' (generation starts at root)")
                 : perr(&P, P.rules[root].use_pos, CORE_EFORMAT, "the rule 'root' is not defined");
        goto out;
    }
    if ((rc = push_el(&P, ai, (gel_t){GEL_REF, root}, 0)) != 0)
        goto out;
    if ((rc = flatten(&P, g)) != 0)
        goto out;
    rc = check(&P, g);
out:
    for (uint32_t i = 0; i < P.n_alts; i++)
        free(P.alts[i].el);
    for (uint32_t i = 0; i < P.n_rules; i++)
        free(P.rules[i].alts);
    free(P.alts);
    free(P.rules);
    free(P.sets);
    free(P.names);
    free(P.lit);
    free(P.cr);
    return rc;
}
