/* proto/schema.c — JSON Schema -> grammar text (proto/schema.h).
 *
 * Each schema becomes a rule "rN ::= ..." (a $ref target once, so recursive
 * schemas become recursive rules); shared pieces (whitespace, string
 * characters, numbers, an unconstrained value, string formats) are emitted
 * once at the end, only when used. The text is then compiled by core like
 * any request grammar, so core's checks (rules that can never end, ...)
 * still apply; what core would find only as a grammar fault and a schema
 * author can make (a $ref cycle that reads nothing) is caught here first
 * with the schema's path.
 *
 * Knows no HTTP and no core; pure functions over jansson values.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "proto/schema.h"

/* ------------------------------------------------------------- text buffer */

typedef px_buf_t sb_t;

static void sb_put(sb_t *b, const char *s, size_t n)
{
    px_buf_append(s, n, b);
}

static void sb_puts(sb_t *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

/* Formatted text of any length (a tool grammar's list of alternatives
 * grows with the tools): the buffer grows, or fails (sticky) and the
 * conversion reports out of memory; nothing is ever cut. */
#define sb_printf px_buf_printf

static void sb_free(sb_t *b)
{
    px_free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- context */

/* Shared rules, emitted at the end when used. */
enum {
    NEED_WS = 1u << 0,
    NEED_CHAR = 1u << 1,
    NEED_STRING = 1u << 2,
    NEED_NUMBER = 1u << 3,
    NEED_INTEGER = 1u << 4,
    NEED_ANY = 1u << 5,
    NEED_DATE = 1u << 6,
    NEED_TIME = 1u << 7,
    NEED_DATETIME = 1u << 8,
    NEED_UUID = 1u << 9,
    NEED_EMAIL = 1u << 10,
    NEED_IPV4 = 1u << 11,
    NEED_FRAC = 1u << 12
};

typedef struct ref_ent {
    char *ptr; /* the $ref text; owned */
    int rule;
    int busy;  /* being converted now */
    int guard; /* x->guard when its conversion began */
} ref_ent_t;

typedef struct sx {
    json_t *root;
    sb_t out; /* the rules written so far */
    int n_rules;
    sb_t path; /* where the conversion is ("response_format.json_schema.schema.items") */
    const char *param;
    proto_error_t *err;
    int rc; /* the first error (0 = none) */
    unsigned need;
    ref_ent_t refs[PROTO_SCHEMA_MAX_REFS];
    int n_refs;
    int depth;
    int guard; /* objects and arrays open on the conversion stack: each reads a byte first */
} sx_t;

#define NAME_LEN 32
#define PATH_SHOWN 200 /* bytes of a schema path a message shows (its end) */

static int fail(sx_t *x, proto_errkind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(sx_t *x, proto_errkind_t kind, const char *fmt, ...)
{
    if (x->rc)
        return x->rc;
    char msg[PROTO_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(msg, sizeof msg, fmt, ap) >= (int)sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 4); /* a cut is marked */
    va_end(ap);
    /* A path longer than a message can hold (long property names, deep
     * nesting) is shown by its end, the part that names the place, and
     * says that its start is left out. */
    const char *path = x->path.p && !x->path.failed ? x->path.p : "";
    size_t plen = strlen(path);
    const char *cut = "";
    if (plen > PATH_SHOWN) {
        path += plen - PATH_SHOWN;
        cut = "...";
    }
    x->rc = proto_error_set(x->err, kind, x->param, "%s%s: %s", cut, path, msg);
    return x->rc;
}

static int oom(sx_t *x)
{
    if (!x->rc)
        x->rc = proto_error_set(x->err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return x->rc;
}

/* The path grows with the schema; a failed append (out of memory) fails
 * the path (sticky), and fail() then shows none rather than a wrong one. */
static size_t path_push(sx_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(sx_t *x, const char *fmt, ...)
{
    size_t old = x->path.n;
    va_list ap;
    va_start(ap, fmt);
    px_buf_vprintf(&x->path, fmt, ap);
    va_end(ap);
    return old;
}

static void path_pop(sx_t *x, size_t old)
{
    if (x->path.failed || old > x->path.n)
        return;
    x->path.n = old;
    if (x->path.p)
        x->path.p[old] = '\0';
}

static int new_rule(sx_t *x)
{
    if (x->n_rules >= PROTO_SCHEMA_MAX_RULES)
        return fail(x, PROTO_ERR_INVALID_VALUE,
                    "the schema needs more than %d grammar rules; simplify it",
                    PROTO_SCHEMA_MAX_RULES);
    return x->n_rules++;
}

static int emit_rule(sx_t *x, int id, sb_t *body)
{
    if (body->failed)
        return oom(x);
    sb_printf(&x->out, "r%d ::= ", id);
    sb_put(&x->out, body->p ? body->p : "\"\"", body->p ? body->n : 2);
    sb_puts(&x->out, "\n");
    if (x->out.failed)
        return oom(x);
    if (x->out.n > PROTO_MAX_GRAMMAR_BYTES)
        return fail(x, PROTO_ERR_INVALID_VALUE,
                    "the schema's grammar is over %d bytes; simplify it", PROTO_MAX_GRAMMAR_BYTES);
    return 0;
}

/* A new rule of body (freed); its id, or < 0. */
static int add_rule(sx_t *x, sb_t *body)
{
    int id = new_rule(x);
    if (id >= 0 && emit_rule(x, id, body) < 0)
        id = -1;
    sb_free(body);
    return id < 0 ? x->rc : id;
}

/* --------------------------------------------------------------- literals */

/* A grammar literal of s[0..n) (UTF-8): `"` and `\` escaped, controls as \xHH. */
static void lit(sb_t *b, const char *s, size_t n)
{
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\x%02x", c);
        } else {
            sb_put(b, s + i, 1);
        }
    }
    sb_puts(b, "\"");
}

/* The literal of a JSON value as the model must write it (compact). */
static int lit_json(sx_t *x, sb_t *b, json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t)
        return oom(x);
    lit(b, t, strlen(t));
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    f(t);
    return 0;
}

/* ------------------------------------------------------------ keywords */

/* Annotations: no effect on what validates. */
static const char *const annotations[] = {
    "title",       "description",   "examples",        "default",
    "$schema",     "$id",           "$comment",        "deprecated",
    "readOnly",    "writeOnly",     "$anchor",         "$defs",
    "definitions", "discriminator", "contentEncoding", "contentMediaType",
    "$vocabulary", "example",       "strict",          NULL};

/* Keywords that constrain and that the converter does not implement. */
static const char *const refused[] = {"not",
                                      "if",
                                      "then",
                                      "else",
                                      "patternProperties",
                                      "propertyNames",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "dependencies",
                                      "unevaluatedProperties",
                                      "unevaluatedItems",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "multipleOf",
                                      "$dynamicRef",
                                      "$recursiveRef",
                                      "contentSchema",
                                      NULL};

static int in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k))
            return 1;
    return 0;
}

/* 1 when s has a key other than annotations and those in `allowed`. */
static const char *other_constraint(json_t *s, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (in_list(annotations, k) || in_list(allowed, k))
            continue;
        if (in_list(refused, k))
            return k;
        /* a keyword this converter reads: constraining */
        static const char *const known[] = {"type",
                                            "enum",
                                            "const",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "items",
                                            "prefixItems",
                                            "additionalItems",
                                            "minItems",
                                            "maxItems",
                                            "uniqueItems",
                                            "minLength",
                                            "maxLength",
                                            "pattern",
                                            "format",
                                            "minimum",
                                            "maximum",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum",
                                            "$ref",
                                            "anyOf",
                                            "oneOf",
                                            "allOf",
                                            "minProperties",
                                            "maxProperties",
                                            "nullable",
                                            NULL};
        if (in_list(known, k))
            return k;
    }
    return NULL;
}

static int check_refused(sx_t *x, json_t *s)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (in_list(refused, k))
            return fail(x, PROTO_ERR_UNSUPPORTED, "'%s' is not supported", k);
        if (!strcmp(k, "uniqueItems") && json_is_true(v)) {
            json_t *mx = json_object_get(s, "maxItems");
            if (!(json_is_integer(mx) && json_integer_value(mx) <= 1))
                return fail(x, PROTO_ERR_UNSUPPORTED, "'uniqueItems': true is not supported");
        }
    }
    return 0;
}

/* A non-negative integer keyword; 1 when absent, 0 when read. */
static int read_count(sx_t *x, json_t *s, const char *key, int64_t *out)
{
    json_t *v = json_object_get(s, key);
    if (!v)
        return 1;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1;
    if (!(d >= 0) || d != floor(d))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'%s' must be a non-negative integer", key);
    *out = d > 1e15 ? (int64_t)1e15 : (int64_t)d;
    return 0;
}

/* ------------------------------------------------------------ shared rules */

static void emit_shared(sx_t *x)
{
    sb_t *o = &x->out;
    unsigned n = x->need;
    if (n & NEED_ANY)
        n |= NEED_WS | NEED_STRING | NEED_NUMBER;
    if (n & (NEED_STRING))
        n |= NEED_CHAR;
    if (n & NEED_DATETIME)
        n |= NEED_DATE | NEED_TIME;
    if (n & NEED_WS)
        sb_printf(o, "ws ::= ( \" \" | \"\\n\" [ \\t]{0,%d} )?\n", PROTO_SCHEMA_WS_MAX);
    if (n & NEED_CHAR)
        /* \u escapes only of non-surrogates: one escape is one character,
         * so minLength/maxLength count exactly */
        sb_puts(o, "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                   "( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )\n");
    if (n & NEED_STRING)
        sb_puts(o, "string ::= \"\\\"\" char* \"\\\"\"\n");
    if (n & NEED_NUMBER)
        sb_printf(o, "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,%d} ) ( \".\" [0-9]{1,%d} )?\n",
                  PROTO_SCHEMA_INT_DIGITS - 1, PROTO_SCHEMA_FRAC_DIGITS);
    if (n & NEED_INTEGER)
        sb_printf(o, "integer ::= \"0\" | \"-\"? [1-9] [0-9]{0,%d}\n", PROTO_SCHEMA_INT_DIGITS - 1);
    if (n & NEED_FRAC)
        sb_printf(o, "frac ::= \".\" [0-9]{0,%d} [1-9]\n", PROTO_SCHEMA_FRAC_DIGITS - 1);
    if (n & NEED_ANY) {
        sb_puts(o, "any0 ::= string | number | \"true\" | \"false\" | \"null\"\n");
        for (int d = 1; d <= PROTO_SCHEMA_ANY_DEPTH; d++) {
            sb_printf(o,
                      "obj%d ::= \"{\" ws ( string ws \":\" ws any%d ( ws \",\" ws string ws "
                      "\":\" ws any%d )* ws )? \"}\"\n",
                      d, d - 1, d - 1);
            sb_printf(o, "arr%d ::= \"[\" ws ( any%d ( ws \",\" ws any%d )* ws )? \"]\"\n", d,
                      d - 1, d - 1);
            sb_printf(o, "any%d ::= obj%d | arr%d | any0\n", d, d, d);
        }
    }
    if (n & NEED_DATE) {
        /* February stops at 28: every date the rule writes exists */
        sb_puts(o, "date ::= [1-9] [0-9]{3} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" "
                   "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" "
                   "( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] "
                   "| \"2\" [0-8] ) )\n");
    }
    if (n & NEED_TIME)
        sb_puts(o, "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                   "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                   "[0-5] [0-9] )\n");
    if (n & NEED_DATETIME)
        sb_puts(o, "date-time ::= date \"T\" time\n");
    if (n & NEED_UUID)
        sb_puts(o, "uuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} "
                   "\"-\" [0-9a-f]{12}\n");
    if (n & NEED_EMAIL)
        sb_puts(o, "email ::= [a-zA-Z0-9_+-]{1,32} ( \".\" [a-zA-Z0-9_+-]{1,32} ){0,3} \"@\" "
                   "( [a-zA-Z0-9] [a-zA-Z0-9-]{0,30} \".\" ){1,3} [a-zA-Z]{2,10}\n");
    if (n & NEED_IPV4)
        sb_puts(o, "ipv4 ::= octet \".\" octet \".\" octet \".\" octet\n"
                   "octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] "
                   "| [0-9]\n");
}

/* -------------------------------------------------------------- numbers */

#define INT_CAP 999999999999999LL /* PROTO_SCHEMA_INT_DIGITS nines */

static const char nines[] = "9999999999999999999";
static const char zeros[] = "0000000000000000000";

/* The decimal strings of length n from lo to hi (same length, lo <= hi). */
static void digits_same(sb_t *b, const char *lo, const char *hi, size_t n)
{
    size_t k = 0;
    while (k < n && lo[k] == hi[k]) {
        sb_printf(b, "\"%c\" ", lo[k]);
        k++;
    }
    if (k == n)
        return;
    lo += k;
    hi += k;
    n -= k;
    int all0 = strspn(lo + 1, "0") >= n - 1, all9 = strspn(hi + 1, "9") >= n - 1;
    char a = lo[0], z = (char)(all9 ? hi[0] : hi[0] - 1);
    int first = 1;
    sb_puts(b, "( ");
    if (!all0) {
        sb_printf(b, "\"%c\" ", lo[0]);
        digits_same(b, lo + 1, nines, n - 1);
        a++;
        first = 0;
    }
    if (a <= z) {
        sb_puts(b, first ? "" : "| ");
        if (a == z)
            sb_printf(b, "\"%c\" ", a);
        else
            sb_printf(b, "[%c-%c] ", a, z);
        if (n > 1)
            sb_printf(b, "[0-9]{%zu} ", n - 1);
        first = 0;
    }
    if (!all9) {
        sb_puts(b, first ? "" : "| ");
        sb_printf(b, "\"%c\" ", hi[0]);
        digits_same(b, zeros, hi + 1, n - 1);
    }
    sb_puts(b, ") ");
}

/* Decimal numerals of the integers a..b (0 <= a <= b), no leading zeros. */
static void uint_range(sb_t *b, int64_t a, int64_t z)
{
    char sa[24], sz[24], lo[24], hi[24];
    int la = snprintf(sa, sizeof sa, "%lld", (long long)a);
    int lz = snprintf(sz, sizeof sz, "%lld", (long long)z);
    sb_puts(b, "( ");
    for (int L = la; L <= lz; L++) {
        if (L == la)
            memcpy(lo, sa, (size_t)la + 1);
        else
            snprintf(lo, sizeof lo, "1%.*s", L - 1, zeros);
        if (L == lz)
            memcpy(hi, sz, (size_t)lz + 1);
        else
            snprintf(hi, sizeof hi, "%.*s", L, nines);
        if (L > la)
            sb_puts(b, "| ");
        digits_same(b, lo, hi, (size_t)L);
    }
    sb_puts(b, ") ");
}

/* Integers lo..hi (lo <= hi), "-" only before a non-zero magnitude. */
static void int_range(sb_t *b, int64_t lo, int64_t hi)
{
    int alt = 0;
    sb_puts(b, "( ");
    if (lo < 0) {
        sb_puts(b, "\"-\" ");
        uint_range(b, hi < 0 ? -hi : 1, -lo);
        alt = 1;
    }
    if (hi >= 0) {
        sb_puts(b, alt ? "| " : "");
        uint_range(b, lo > 0 ? lo : 0, hi);
    }
    sb_puts(b, ") ");
}

static int64_t clamp_int(double d)
{
    if (d > (double)INT_CAP)
        return INT_CAP;
    if (d < -(double)INT_CAP)
        return -INT_CAP;
    return (int64_t)d;
}

/* One bound: from "minimum"/"maximum" and "exclusiveMinimum"/"exclusiveMaximum"
 * (a number, draft 6 on, or a boolean beside the plain bound, draft 4). The
 * tighter of two wins. */
static int read_bound(sx_t *x, json_t *s, int upper, int *has, double *v, int *excl)
{
    const char *kp = upper ? "maximum" : "minimum";
    const char *ke = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    json_t *p = json_object_get(s, kp), *e = json_object_get(s, ke);
    *has = 0;
    *excl = 0;
    if (p) {
        if (!json_is_number(p))
            return fail(x, PROTO_ERR_INVALID_VALUE, "'%s' must be a number", kp);
        *has = 1;
        *v = json_number_value(p);
        if (json_is_true(e))
            *excl = 1;
    }
    if (e && !json_is_boolean(e)) {
        if (!json_is_number(e))
            return fail(x, PROTO_ERR_INVALID_VALUE, "'%s' must be a number", ke);
        double d = json_number_value(e);
        if (!*has || (upper ? d <= *v : d >= *v)) {
            *has = 1;
            *v = d;
            *excl = 1;
        }
    }
    return 0;
}

/* Writes the number (or integer) alternatives of schema s into b. */
static int conv_number(sx_t *x, json_t *s, int integer, sb_t *b)
{
    int hl, hh, el, eh;
    double lo = 0, hi = 0;
    if (read_bound(x, s, 0, &hl, &lo, &el) < 0 || read_bound(x, s, 1, &hh, &hi, &eh) < 0)
        return x->rc;
    if (!hl && !hh) {
        x->need |= integer ? NEED_INTEGER : NEED_NUMBER;
        sb_puts(b, integer ? "integer " : "number ");
        return 0;
    }
    /* the integers allowed */
    int64_t A = hl ? clamp_int(el ? floor(lo) + 1 : ceil(lo)) : -INT_CAP;
    int64_t B = hh ? clamp_int(eh ? ceil(hi) - 1 : floor(hi)) : INT_CAP;
    int alt = 0;
    sb_puts(b, "( ");
    if (A <= B) {
        int_range(b, A, B);
        alt = 1;
    }
    if (!integer) {
        /* i.f with f > 0 lies in (i, i+1): inside [lo, hi] when i >= lo and
         * i + 1 <= hi (strict or not); -i.f likewise in (-i-1, -i) */
        int64_t p0 = hl ? clamp_int(ceil(lo)) : 0, p1 = hh ? clamp_int(floor(hi)) - 1 : INT_CAP;
        int64_t n0 = hh ? clamp_int(ceil(-hi)) : 0, n1 = hl ? clamp_int(floor(-lo)) - 1 : INT_CAP;
        if (p0 < 0)
            p0 = 0;
        if (n0 < 0)
            n0 = 0;
        if (p0 <= p1) {
            sb_puts(b, alt ? "| " : "");
            uint_range(b, p0, p1);
            sb_puts(b, "frac ");
            alt = 1;
        }
        if (n0 <= n1) {
            sb_puts(b, alt ? "| " : "");
            sb_puts(b, "\"-\" ");
            uint_range(b, n0, n1);
            sb_puts(b, "frac ");
            alt = 1;
        }
        x->need |= NEED_FRAC;
    }
    sb_puts(b, ") ");
    if (!alt)
        return fail(x, PROTO_ERR_INVALID_VALUE, "no %s satisfies the bounds",
                    integer ? "integer" : "number");
    return 0;
}

/* ---------------------------------------------------------------- patterns */

typedef struct rx {
    sx_t *x;
    const unsigned char *s;
    size_t i, n;
    int depth;
} rx_t;

static int rx_alt(rx_t *r, sb_t *b, int top);

static int rx_fail(rx_t *r, const char *what)
{
    return fail(r->x, PROTO_ERR_UNSUPPORTED,
                "'pattern': %s at offset %zu is not supported (docs/GRAMMAR.md lists the "
                "regular-expression subset)",
                what, r->i);
}

/* One character as the model writes it inside a JSON string. */
static void rx_char(sb_t *b, uint32_t c)
{
    static const char *const esc[] = {[8] = "b", [9] = "t", [10] = "n", [12] = "f", [13] = "r"};
    if (c == '"')
        sb_puts(b, "\"\\\\\\\"\" ");
    else if (c == '\\')
        sb_puts(b, "\"\\\\\\\\\" ");
    else if (c < sizeof esc / sizeof esc[0] && esc[c])
        sb_printf(b, "\"\\\\%s\" ", esc[c]);
    else if (c < 0x20)
        sb_printf(b, "\"\\\\u00%02x\" ", (unsigned)c);
    else if (c < 0x80 && c != '"' && c != '\\')
        sb_printf(b, "\"%c\" ", (char)c);
    else
        sb_printf(b, "\"\\U%08x\" ", (unsigned)c);
}

/* A class member as a grammar class character. */
static void cls_char(sb_t *b, uint32_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        sb_printf(b, "%c", (char)c);
    else if (c < 0x80)
        sb_printf(b, "\\x%02x", (unsigned)c);
    else
        sb_printf(b, "\\U%08x", (unsigned)c);
}

/* The code point at s[i] (valid UTF-8: jansson checked it). */
static uint32_t rx_next(rx_t *r)
{
    const unsigned char *s = r->s + r->i;
    uint32_t c = s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len > 1)
        c &= 0xFF >> (len + 1);
    for (size_t k = 1; k < len && r->i + k < r->n; k++)
        c = (c << 6) | (s[k] & 0x3F);
    r->i += len;
    return c;
}

typedef struct rng {
    uint32_t lo, hi;
} rng_t;
#define RX_MAX_RANGES 128

/* ASCII shorthands: \d \w \s and their negations, as ranges (\s as a
 * space only and the negations over printable ASCII: a subset). */
static size_t shorthand(char k, rng_t *out)
{
    switch (k) {
    case 'd': out[0] = (rng_t){'0', '9'}; return 1;
    case 'w':
        out[0] = (rng_t){'0', '9'};
        out[1] = (rng_t){'A', 'Z'};
        out[2] = (rng_t){'a', 'z'};
        out[3] = (rng_t){'_', '_'};
        return 4;
    case 's': out[0] = (rng_t){' ', ' '}; return 1;
    case 'D':
        out[0] = (rng_t){0x20, '0' - 1};
        out[1] = (rng_t){'9' + 1, 0x7E};
        return 2;
    case 'W':
        out[0] = (rng_t){0x20, '0' - 1};
        out[1] = (rng_t){'9' + 1, 'A' - 1};
        out[2] = (rng_t){'Z' + 1, '_' - 1};
        out[3] = (rng_t){'_' + 1, 'a' - 1};
        out[4] = (rng_t){'z' + 1, 0x7E};
        return 5;
    case 'S': out[0] = (rng_t){0x21, 0x7E}; return 1;
    default: return 0;
    }
}

/* Writes ranges as one alternative set: plain characters in one class,
 * the ones JSON escapes (controls, `"`, `\`) as their escapes. */
static int emit_ranges(rx_t *r, sb_t *b, const rng_t *rg, size_t n)
{
    sb_t cls = {0};
    int alts = 0;
    sb_puts(b, "( ");
    for (size_t i = 0; i < n; i++) {
        for (uint32_t c = rg[i].lo; c <= rg[i].hi && c < 0x20; c++) {
            sb_puts(b, alts++ ? "| " : "");
            rx_char(b, c);
        }
        static const uint32_t cut[] = {'"', '\\'};
        uint32_t lo = rg[i].lo < 0x20 ? 0x20 : rg[i].lo;
        for (size_t k = 0; k < 2; k++) {
            if (lo <= cut[k] && cut[k] <= rg[i].hi) {
                sb_puts(b, alts++ ? "| " : "");
                rx_char(b, cut[k]);
            }
        }
        /* the plain parts of [lo, hi]: split around `"` and `\` */
        uint32_t a = lo;
        while (a <= rg[i].hi) {
            uint32_t z = rg[i].hi;
            if (a <= '"' && '"' <= z)
                z = a == '"' ? a : '"' - 1;
            else if (a <= '\\' && '\\' <= z)
                z = a == '\\' ? a : '\\' - 1;
            if (a != '"' && a != '\\') {
                cls_char(&cls, a);
                if (z > a) {
                    sb_puts(&cls, "-");
                    cls_char(&cls, z);
                }
            }
            if (z == 0xFFFFFFFFu)
                break;
            a = z + 1;
        }
    }
    if (cls.n) {
        sb_puts(b, alts++ ? "| [" : "[");
        sb_put(b, cls.p, cls.n);
        sb_puts(b, "] ");
    }
    sb_free(&cls);
    sb_puts(b, ") ");
    if (!alts)
        return rx_fail(r, "an empty class");
    return 0;
}

static int rx_escape_char(rx_t *r, uint32_t e, uint32_t *out)
{
    switch (e) {
    case 'n': *out = '\n'; return 0;
    case 't': *out = '\t'; return 0;
    case 'r': *out = '\r'; return 0;
    case 'f': *out = '\f'; return 0;
    case 'v': *out = '\v'; return 0;
    case 'x':
    case 'u': {
        size_t nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (size_t k = 0; k < nd; k++) {
            unsigned char h = r->i < r->n ? r->s[r->i] : 0;
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0)
                return rx_fail(r, "a malformed \\x or \\u escape");
            v = v * 16 + (uint32_t)d;
            r->i++;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(r, "a surrogate escape");
        *out = v;
        return 0;
    }
    default:
        if (e < 0x80 &&
            !((e >= '0' && e <= '9') || (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))) {
            *out = e; /* \. \\ \- \[ ... */
            return 0;
        }
        {
            char what[32];
            snprintf(what, sizeof what, "the escape '\\%c'", e < 0x80 ? (char)e : '?');
            return rx_fail(r, what);
        }
    }
}

static int rx_class(rx_t *r, sb_t *b)
{
    rng_t rg[RX_MAX_RANGES];
    size_t n = 0;
    int neg = 0;
    if (r->i < r->n && r->s[r->i] == '^') {
        neg = 1;
        r->i++;
    }
    int first = 1;
    for (;;) {
        if (r->i >= r->n)
            return rx_fail(r, "an unclosed class");
        if (r->s[r->i] == ']' && !first) {
            r->i++;
            break;
        }
        first = 0;
        if (n + 8 > RX_MAX_RANGES)
            return rx_fail(r, "a class this large");
        uint32_t c = rx_next(r);
        if (c == '[' && r->i < r->n &&
            (r->s[r->i] == ':' || r->s[r->i] == '=' || r->s[r->i] == '.'))
            return rx_fail(r, "a POSIX class");
        if (c == '\\') {
            if (r->i >= r->n)
                return rx_fail(r, "a trailing backslash");
            uint32_t e = rx_next(r);
            size_t k = e < 0x80 ? shorthand((char)e, rg + n) : 0;
            if (k) {
                if (neg)
                    return rx_fail(r, "a shorthand class inside a negated class");
                n += k;
                continue;
            }
            if (e == 'b') {
                c = '\b';
            } else if (rx_escape_char(r, e, &c) < 0) {
                return r->x->rc;
            }
        }
        uint32_t hi = c;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            hi = rx_next(r);
            if (hi == '\\') {
                if (r->i >= r->n)
                    return rx_fail(r, "a trailing backslash");
                uint32_t e = rx_next(r);
                if (e < 0x80 && shorthand((char)e, rg + n))
                    return rx_fail(r, "a range that ends in a shorthand class");
                if (rx_escape_char(r, e, &hi) < 0)
                    return r->x->rc;
            }
            if (hi < c)
                return rx_fail(r, "a reversed range");
        }
        rg[n++] = (rng_t){c, hi};
    }
    if (!neg)
        return emit_ranges(r, b, rg, n);
    sb_puts(b, "[^");
    for (size_t i = 0; i < n; i++) {
        cls_char(b, rg[i].lo);
        if (rg[i].hi > rg[i].lo) {
            sb_puts(b, "-");
            cls_char(b, rg[i].hi);
        }
    }
    sb_puts(b, "\"\\\\\\x00-\\x1f] ");
    return 0;
}

/* One atom into b; 1 when there is none here (end, `|`, `)`). */
static int rx_atom(rx_t *r, sb_t *b, int top)
{
    if (r->i >= r->n)
        return 1;
    unsigned char c = r->s[r->i];
    if (c == '|' || c == ')')
        return 1;
    if (c == '*' || c == '+' || c == '?')
        return rx_fail(r, "a quantifier with nothing to repeat");
    if (c == '^' || c == '$') {
        if (top && c == '$' && (r->i + 1 == r->n || r->s[r->i + 1] == '|')) {
            r->i++; /* the end anchor of a top-level branch */
            sb_puts(b, "\"\" ");
            return 0;
        }
        return rx_fail(r, "an anchor inside the pattern");
    }
    if (c == '(') {
        r->i++;
        if (++r->depth > 32)
            return rx_fail(r, "groups nested this deep");
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') {
                r->i += 2;
            } else if (r->i + 2 < r->n && (r->s[r->i + 1] == 'P' || r->s[r->i + 1] == '<') &&
                       r->s[r->i + 1 + (r->s[r->i + 1] == 'P')] == '<' &&
                       r->s[r->i + 2 + (r->s[r->i + 1] == 'P')] != '=' &&
                       r->s[r->i + 2 + (r->s[r->i + 1] == 'P')] != '!') {
                while (r->i < r->n && r->s[r->i] != '>')
                    r->i++;
                if (r->i >= r->n)
                    return rx_fail(r, "an unclosed group name");
                r->i++;
            } else {
                return rx_fail(r, "a lookaround, flag or other '(?' group");
            }
        }
        sb_puts(b, "( ");
        if (rx_alt(r, b, 0) < 0)
            return r->x->rc;
        if (r->i >= r->n || r->s[r->i] != ')')
            return rx_fail(r, "an unclosed group");
        r->i++;
        r->depth--;
        sb_puts(b, ") ");
        return 0;
    }
    r->i++;
    if (c == '[')
        return rx_class(r, b);
    if (c == '.') {
        sb_puts(b, "[^\"\\\\\\x00-\\x1f] ");
        return 0;
    }
    uint32_t cp = c;
    if (c == '\\') {
        if (r->i >= r->n)
            return rx_fail(r, "a trailing backslash");
        uint32_t e = rx_next(r);
        rng_t rg[8];
        size_t k = e < 0x80 ? shorthand((char)e, rg) : 0;
        if (k)
            return emit_ranges(r, b, rg, k);
        if (rx_escape_char(r, e, &cp) < 0)
            return r->x->rc;
        rx_char(b, cp);
        return 0;
    }
    r->i--;
    cp = rx_next(r);
    rx_char(b, cp);
    return 0;
}

static int rx_number(rx_t *r, long *out)
{
    size_t st = r->i;
    long v = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && v <= 100000)
        v = v * 10 + (r->s[r->i++] - '0');
    *out = v;
    return r->i > st;
}

static int rx_seq(rx_t *r, sb_t *b, int top)
{
    int any = 0;
    if (top && r->i < r->n && r->s[r->i] == '^')
        r->i++; /* the start anchor of a top-level branch */
    for (;;) {
        sb_t a = {0};
        int rc = rx_atom(r, &a, top);
        if (rc != 0) {
            sb_free(&a);
            if (rc < 0)
                return rc;
            break;
        }
        any = 1;
        if (r->i < r->n && strchr("*+?{", r->s[r->i])) {
            unsigned char q = r->s[r->i++];
            sb_puts(b, "( ");
            sb_put(b, a.p, a.n);
            sb_puts(b, ")");
            if (q == '{') {
                long m = 0, n = -1;
                int hm = rx_number(r, &m);
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    if (!rx_number(r, &n))
                        n = -1;
                    if (!hm)
                        m = 0;
                } else {
                    n = m;
                    if (!hm) {
                        sb_free(&a);
                        return rx_fail(r, "a malformed {m,n}");
                    }
                }
                if (r->i >= r->n || r->s[r->i] != '}') {
                    sb_free(&a);
                    return rx_fail(r, "a malformed {m,n}");
                }
                r->i++;
                if (m > 1000 || n > 1000 || (n >= 0 && n < m)) {
                    sb_free(&a);
                    return rx_fail(r, "a repetition count over 1000 or reversed");
                }
                if (n < 0)
                    sb_printf(b, "{%ld,} ", m);
                else
                    sb_printf(b, "{%ld,%ld} ", m, n);
            } else {
                sb_printf(b, "%c ", q);
            }
            if (r->i < r->n && r->s[r->i] == '?')
                r->i++; /* lazy: the same language */
            if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '*' || r->s[r->i] == '{')) {
                sb_free(&a);
                return rx_fail(r, "a possessive or repeated quantifier");
            }
        } else {
            sb_put(b, a.p, a.n);
        }
        sb_free(&a);
    }
    if (!any)
        sb_puts(b, "\"\" ");
    return 0;
}

static int rx_alt(rx_t *r, sb_t *b, int top)
{
    for (;;) {
        if (rx_seq(r, b, top) < 0)
            return r->x->rc;
        if (r->i < r->n && r->s[r->i] == '|') {
            r->i++;
            sb_puts(b, "| ");
            continue;
        }
        return 0;
    }
}

/* ---------------------------------------------------------------- strings */

static const struct {
    const char *name;
    unsigned need;
} formats[] = {{"date", NEED_DATE}, {"time", NEED_TIME},   {"date-time", NEED_DATETIME},
               {"uuid", NEED_UUID}, {"email", NEED_EMAIL}, {"ipv4", NEED_IPV4}};

static int conv_string(sx_t *x, json_t *s, sb_t *b)
{
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    int64_t mn = 0, mx = -1;
    int rmn = read_count(x, s, "minLength", &mn), rmx = read_count(x, s, "maxLength", &mx);
    if (rmn < 0 || rmx < 0)
        return x->rc;
    if ((fmt || pat) && (rmn == 0 || rmx == 0))
        return fail(x, PROTO_ERR_UNSUPPORTED,
                    "'minLength'/'maxLength' together with '%s' is not supported",
                    fmt ? "format" : "pattern");
    if (fmt && pat)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'format' together with 'pattern' is not supported");
    if (fmt) {
        if (!json_is_string(fmt))
            return fail(x, PROTO_ERR_INVALID_VALUE, "'format' must be a string");
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
            if (!strcmp(json_string_value(fmt), formats[i].name)) {
                x->need |= formats[i].need;
                sb_printf(b, "\"\\\"\" %s \"\\\"\" ", formats[i].name);
                return 0;
            }
        }
        return fail(x, PROTO_ERR_UNSUPPORTED,
                    "'format' '%.40s' is not supported (date, time, date-time, uuid, email, "
                    "ipv4 are)",
                    json_string_value(fmt));
    }
    if (pat) {
        if (!json_is_string(pat))
            return fail(x, PROTO_ERR_INVALID_VALUE, "'pattern' must be a string");
        rx_t r = {x, (const unsigned char *)json_string_value(pat), 0, json_string_length(pat), 0};
        sb_puts(b, "\"\\\"\" ( ");
        if (rx_alt(&r, b, 1) < 0)
            return x->rc;
        if (r.i < r.n)
            return rx_fail(&r, "an unbalanced ')'");
        sb_puts(b, ") \"\\\"\" ");
        return 0;
    }
    x->need |= NEED_CHAR;
    if (mx >= 0 && mx < mn)
        return fail(x, PROTO_ERR_INVALID_VALUE, "'maxLength' is less than 'minLength'");
    if (mn > 1000)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'minLength' is %lld; above 1000 is not supported",
                    (long long)mn);
    if (mx > 1000)
        mx = 1000; /* a subset: at most 1000 characters */
    if (mx >= 0)
        sb_printf(b, "\"\\\"\" char{%lld,%lld} \"\\\"\" ", (long long)mn, (long long)mx);
    else
        sb_printf(b, "\"\\\"\" char{%lld,} \"\\\"\" ", (long long)mn);
    return 0;
}

/* ------------------------------------------------------------ composites */

static int conv(sx_t *x, json_t *s, char name[NAME_LEN]);

/* "any value", at the nesting bound */
static void any_name(sx_t *x, char name[NAME_LEN])
{
    x->need |= NEED_ANY;
    snprintf(name, NAME_LEN, "any%d", PROTO_SCHEMA_ANY_DEPTH);
}

/* A sub-schema (key `key` of s, or element idx of array key) to a rule name. */
static int conv_at(sx_t *x, json_t *sub, const char *key, long idx, char name[NAME_LEN])
{
    size_t old = idx >= 0 ? path_push(x, ".%s[%ld]", key, idx) : path_push(x, ".%s", key);
    int rc = conv(x, sub, name);
    path_pop(x, old);
    return rc;
}

/* The object keywords of a schema, read and checked. */
typedef struct obj_kw {
    json_t *props;      /* borrowed object; NULL when absent */
    json_t *req;        /* borrowed array of strings; NULL when absent */
    json_t *addl;       /* borrowed boolean or schema; NULL when absent */
    int64_t minp, maxp; /* minProperties, maxProperties (-1: no bound) */
} obj_kw_t;

/* One member of an object's grammar. */
typedef struct obj_member {
    const char *key;     /* borrowed from the schema */
    char rule[NAME_LEN]; /* the rule of its value */
    int required;
} obj_member_t;

static int obj_read(sx_t *x, json_t *s, obj_kw_t *o)
{
    o->props = json_object_get(s, "properties");
    o->req = json_object_get(s, "required");
    o->addl = json_object_get(s, "additionalProperties");
    o->minp = 0;
    o->maxp = -1;
    if (o->props && !json_is_object(o->props))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'properties' must be an object");
    if (o->req && !json_is_array(o->req))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'required' must be an array of strings");
    for (size_t i = 0; o->req && i < json_array_size(o->req); i++)
        if (!json_is_string(json_array_get(o->req, i)))
            return fail(x, PROTO_ERR_INVALID_VALUE, "'required' must be an array of strings");
    if (o->addl && !json_is_boolean(o->addl) && !json_is_object(o->addl))
        return fail(x, PROTO_ERR_INVALID_VALUE,
                    "'additionalProperties' must be a boolean or a schema");
    if (read_count(x, s, "minProperties", &o->minp) < 0 ||
        read_count(x, s, "maxProperties", &o->maxp) < 0)
        return x->rc;
    return 0;
}

static int obj_is_required(const obj_kw_t *o, const char *key)
{
    for (size_t i = 0; o->req && i < json_array_size(o->req); i++)
        if (!strcmp(json_string_value(json_array_get(o->req, i)), key))
            return 1;
    return 0;
}

/* Required names that are not declared properties, repeats counted. */
static size_t obj_n_undeclared(const obj_kw_t *o)
{
    size_t n = 0;
    for (size_t i = 0; o->req && i < json_array_size(o->req); i++)
        if (!o->props || !json_object_get(o->props, json_string_value(json_array_get(o->req, i))))
            n++;
    return n;
}

/* An object without members: "{}" when additionalProperties is false, else
 * a map of string keys to values of additionalProperties (any when absent). */
static int conv_map(sx_t *x, const obj_kw_t *o, sb_t *b)
{
    int64_t minp = o->minp, maxp = o->maxp;
    if (json_is_false(o->addl)) {
        if (minp > 0)
            return fail(x, PROTO_ERR_INVALID_VALUE, "no object satisfies 'minProperties'");
        sb_puts(b, "\"{\" ws \"}\" ");
        return 0;
    }
    char vn[NAME_LEN];
    if (json_is_object(o->addl)) {
        if (conv_at(x, o->addl, "additionalProperties", -1, vn) < 0)
            return x->rc;
    } else {
        any_name(x, vn);
    }
    if (minp > 1)
        return fail(x, PROTO_ERR_UNSUPPORTED,
                    "'minProperties' above 1 without declared properties is not supported");
    if (maxp > PROTO_SCHEMA_MAX_COUNT)
        maxp = PROTO_SCHEMA_MAX_COUNT; /* a subset: at most 1000 entries */
    x->need |= NEED_STRING;
    if (maxp == 0) {
        sb_puts(b, "\"{\" ws \"}\" ");
        return 0;
    }
    sb_printf(b, "\"{\" ws ( string ws \":\" ws %s ( ws \",\" ws string ws \":\" ws %s )", vn, vn);
    if (maxp > 0)
        sb_printf(b, "{0,%lld} ", (long long)maxp - 1);
    else
        sb_puts(b, "* ");
    sb_printf(b, "ws )%s \"}\" ", minp ? "" : "?");
    return 0;
}

/* The members into m[] (room for every declared property and every
 * undeclared required name): the declared properties in order, their
 * values converted (a property whose schema is false may not appear and is
 * never written), then the required names that are not declared (any
 * value). Sets *n and *n_req (how many are required). */
static int obj_members(sx_t *x, const obj_kw_t *o, obj_member_t *m, size_t *n, size_t *n_req)
{
    size_t k = 0;
    *n_req = 0;
    const char *key;
    json_t *v;
    if (o->props) {
        json_object_foreach(o->props, key, v)
        {
            int required = obj_is_required(o, key);
            size_t old = path_push(x, ".properties.%s", key);
            int rc = 0;
            if (json_is_false(v)) {
                if (required)
                    rc = fail(x, PROTO_ERR_INVALID_VALUE,
                              "the property is required but its schema is false");
            } else {
                rc = conv(x, v, m[k].rule);
            }
            path_pop(x, old);
            if (rc < 0)
                return rc;
            if (json_is_false(v))
                continue;
            m[k].key = key;
            m[k].required = required;
            *n_req += (size_t)required;
            k++;
        }
    }
    size_t n_decl = k; /* the undeclared ones follow */
    for (size_t i = 0; o->req && i < json_array_size(o->req); i++) {
        const char *rk = json_string_value(json_array_get(o->req, i));
        if (o->props && json_object_get(o->props, rk))
            continue;
        /* a name listed twice is written once */
        int dup = 0;
        for (size_t j = n_decl; j < k; j++)
            dup |= !strcmp(m[j].key, rk);
        if (dup)
            continue;
        m[k].key = rk;
        any_name(x, m[k].rule);
        m[k].required = 1;
        (*n_req)++;
        k++;
    }
    *n = k;
    return 0;
}

/* The members m[0..n) (n >= 1) in declared order, each optional one
 * possibly absent. F_i: the next member written is i or, skipping optional
 * ones, a later one: mem_i S_{i+1}, or also F_{i+1} when mem_i is
 * optional. S_i: the rest after a member before i: nothing (unless one of
 * i.. is required), or a comma and F_i. The comma is read once, before the
 * key chooses the member, so the text after a value keeps a few parse
 * stacks rather than a few per optional member left, and after "{" or a
 * comma there is one per member that can come next (the documented 256
 * fit the stack bound). F_i is a rule of its own where something refers
 * to it by name (F_0, F_{i-1} of an optional member) or it has two
 * alternatives; elsewhere it is written into S_i. Rules from the end. */
static int obj_rules(sx_t *x, const obj_member_t *m, size_t n, size_t n_req, sb_t *b)
{
    int s_next = -1, f_next = -1, required_left = 0;
    for (size_t i = n; i-- > 0;) {
        sb_t f = {0}; /* F_i's body */
        json_t *ks = json_string(m[i].key);
        if (!ks)
            return oom(x);
        int rc = lit_json(x, &f, ks);
        json_decref(ks);
        sb_printf(&f, " ws \":\" ws %s ", m[i].rule);
        if (s_next >= 0)
            sb_printf(&f, "r%d ", s_next);
        if (!m[i].required && f_next >= 0)
            sb_printf(&f, "| r%d", f_next);
        required_left |= m[i].required;
        const int f_rule = i == 0 || !m[i - 1].required || (!m[i].required && i + 1 < n);
        int s_id = -1, f_id = -1;
        if (rc == 0 && f_rule && (f_id = new_rule(x)) < 0)
            rc = f_id;
        if (rc == 0 && i > 0 && (s_id = new_rule(x)) < 0)
            rc = s_id;
        if (rc == 0 && f_rule)
            rc = emit_rule(x, f_id, &f);
        if (rc == 0 && i > 0) {
            sb_t sb = {0};
            sb_puts(&sb, required_left ? "ws \",\" ws " : "( ws \",\" ws ");
            if (f_rule)
                sb_printf(&sb, "r%d", f_id);
            else
                sb_put(&sb, f.p, f.n);
            sb_puts(&sb, required_left ? "" : " )?");
            rc = emit_rule(x, s_id, &sb);
            sb_free(&sb);
        }
        sb_free(&f);
        if (rc < 0)
            return rc;
        s_next = s_id;
        f_next = f_id;
    }
    if (n_req)
        sb_printf(b, "\"{\" ws r%d ws \"}\" ", f_next);
    else
        sb_printf(b, "\"{\" ws ( r%d ws )? \"}\" ", f_next);
    return 0;
}

/* An object schema: its members (obj_members) in order, or a map when it
 * declares none. */
static int conv_object(sx_t *x, json_t *s, sb_t *b)
{
    obj_kw_t o;
    if (obj_read(x, s, &o) < 0)
        return x->rc;
    x->need |= NEED_WS;
    size_t n_max = (o.props ? json_object_size(o.props) : 0) + obj_n_undeclared(&o);
    if (n_max > 256)
        return fail(x, PROTO_ERR_INVALID_VALUE, "more than 256 properties are not supported");
    if (n_max == 0)
        return conv_map(x, &o, b);
    obj_member_t *m = px_malloc(n_max * sizeof *m);
    if (!m)
        return oom(x);
    size_t n = 0, n_req = 0;
    int rc = obj_members(x, &o, m, &n, &n_req);
    if (rc == 0 && o.minp > (int64_t)n_req)
        rc = fail(x, PROTO_ERR_UNSUPPORTED,
                  "'minProperties' above the number of required properties is not supported");
    else if (rc == 0 && o.maxp >= 0 && o.maxp < (int64_t)n)
        rc = fail(x, PROTO_ERR_UNSUPPORTED,
                  "'maxProperties' below the number of properties is not supported");
    if (rc == 0 && n == 0)
        sb_puts(b, "\"{\" ws \"}\" ");
    else if (rc == 0)
        rc = obj_rules(x, m, n, n_req, b);
    px_free(m);
    return rc < 0 ? rc : 0;
}

static int conv_array(sx_t *x, json_t *s, sb_t *b)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *extra_s = NULL; /* schema of items after the prefix; NULL: any */
    int extra_ok = 1;
    const char *prefix_key = "prefixItems";
    if (json_is_array(items)) { /* draft 4-7 tuples */
        if (prefix)
            return fail(x, PROTO_ERR_INVALID_VALUE, "'items' as an array beside 'prefixItems'");
        prefix = items;
        prefix_key = "items";
        items = json_object_get(s, "additionalItems");
    } /* additionalItems without a tuple is ignored, as validators ignore it */
    if (prefix && !json_is_array(prefix))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'prefixItems' must be an array of schemas");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'items' must be a schema");
    if (json_is_false(items))
        extra_ok = 0;
    else if (json_is_object(items))
        extra_s = items;
    int64_t mn = 0, mx = -1;
    if (read_count(x, s, "minItems", &mn) < 0 || read_count(x, s, "maxItems", &mx) < 0)
        return x->rc;
    if (mx >= 0 && mx < mn)
        return fail(x, PROTO_ERR_INVALID_VALUE, "'maxItems' is less than 'minItems'");
    /* counts are written as grammar repetitions, whose bound is 1000 */
    if (mn > PROTO_SCHEMA_MAX_COUNT || mx > PROTO_SCHEMA_MAX_COUNT)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'%s' is %lld; above %d is not supported",
                    mn > PROTO_SCHEMA_MAX_COUNT ? "minItems" : "maxItems",
                    (long long)(mn > PROTO_SCHEMA_MAX_COUNT ? mn : mx), PROTO_SCHEMA_MAX_COUNT);
    size_t k = prefix ? json_array_size(prefix) : 0;
    if (k > 64)
        return fail(x, PROTO_ERR_UNSUPPORTED, "more than 64 'prefixItems' are not supported");
    if (mx >= 0 && (size_t)mx < k)
        k = (size_t)mx;
    x->need |= NEED_WS;
    char en[NAME_LEN] = "";
    /* extras: count from e_min to e_max (-1: no bound) */
    int64_t e_min = mn > (int64_t)k ? mn - (int64_t)k : 0;
    int64_t e_max = mx >= 0 ? mx - (int64_t)k : -1;
    if (!extra_ok) {
        if (e_min > 0)
            return fail(x, PROTO_ERR_INVALID_VALUE,
                        "'minItems' needs more items than the tuple allows");
        e_max = 0;
    }
    if (e_max != 0) {
        if (extra_s) {
            if (conv_at(x, extra_s, prefix && prefix_key[0] == 'i' ? "additionalItems" : "items",
                        -1, en) < 0)
                return x->rc;
        } else {
            any_name(x, en);
        }
    }
    if (k == 0) {
        if (e_max == 0) {
            sb_puts(b, "\"[\" ws \"]\" ");
            return 0;
        }
        sb_printf(b, "\"[\" ws ( %s ( ws \",\" ws %s )", en, en);
        int64_t lo = e_min > 0 ? e_min - 1 : 0;
        if (e_max < 0)
            sb_printf(b, "{%lld,} ", (long long)lo);
        else
            sb_printf(b, "{%lld,%lld} ", (long long)lo, (long long)e_max - 1);
        sb_printf(b, "ws )%s \"]\" ", e_min > 0 ? "" : "?");
        return 0;
    }
    /* tuple: rest_i = ( ws "," ws P_i rest_{i+1} ), optional when i >= minItems;
     * rest_k = the extras */
    char pn[NAME_LEN];
    int next = -1;
    {
        sb_t body = {0};
        if (e_max != 0) {
            sb_printf(&body, "( ws \",\" ws %s )", en);
            if (e_max < 0)
                sb_printf(&body, "{%lld,} ", (long long)e_min);
            else
                sb_printf(&body, "{%lld,%lld} ", (long long)e_min, (long long)e_max);
        }
        if ((next = add_rule(x, &body)) < 0)
            return x->rc;
    }
    for (size_t i = k; i-- > 0;) {
        if (conv_at(x, json_array_get(prefix, i), prefix_key, (long)i, pn) < 0)
            return x->rc;
        sb_t body = {0};
        if (i == 0)
            sb_printf(&body, "%s r%d", pn, next);
        else if ((int64_t)i < mn)
            sb_printf(&body, "ws \",\" ws %s r%d", pn, next);
        else
            sb_printf(&body, "( ws \",\" ws %s r%d )?", pn, next);
        if ((next = add_rule(x, &body)) < 0)
            return x->rc;
    }
    sb_printf(b, "\"[\" ws %sr%d ws %s\"]\" ", mn > 0 ? "" : "( ", next, mn > 0 ? "" : ")? ");
    return 0;
}

/* ----------------------------------------------------------------- types */

static const char *const type_names[] = {"string", "number", "integer", "boolean",
                                         "null",   "object", "array",   NULL};

static int value_has_type(json_t *v, const char *t)
{
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "object"))
        return json_is_object(v);
    return json_is_array(v);
}

/* The type names of s: from "type" (a string or an array), else inferred from
 * the keywords present (none: every type, i.e. any value). Returns the count,
 * or -1 after fail() (a literal -1, not fail's code: clang-analyzer does not
 * follow the variadic fail, and took its result for a count). */
static int type_set(sx_t *x, json_t *s, const char *out[8])
{
    json_t *t = json_object_get(s, "type");
    int n = 0;
    if (t) {
        json_t *one[1] = {t};
        size_t cnt = json_is_array(t) ? json_array_size(t) : 1;
        if (cnt == 0 || cnt > 7) {
            (void)fail(x, PROTO_ERR_INVALID_VALUE,
                       "'type' must be a type name or an array of them");
            return -1;
        }
        for (size_t i = 0; i < cnt; i++) {
            json_t *e = json_is_array(t) ? json_array_get(t, i) : one[0];
            const char *name = json_is_string(e) ? json_string_value(e) : "";
            if (!in_list(type_names, name)) {
                (void)fail(x, PROTO_ERR_INVALID_VALUE, "'type' '%.40s' is not a JSON Schema type",
                           name);
                return -1;
            }
            for (int j = 0; j < n; j++)
                if (!strcmp(out[j], name)) {
                    (void)fail(x, PROTO_ERR_INVALID_VALUE, "'type' lists '%s' twice", name);
                    return -1;
                }
            out[n++] = name;
        }
        int has_null = 0;
        for (int j = 0; j < n; j++)
            has_null |= !strcmp(out[j], "null");
        if (json_is_true(json_object_get(s, "nullable")) && !has_null)
            out[n++] = "null";
        return n;
    }
    static const struct {
        const char *type;
        const char *const kw[6];
    } infer[] = {
        {"object",
         {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
          NULL}},
        {"array", {"items", "prefixItems", "minItems", "maxItems", "additionalItems", NULL}},
        {"string", {"minLength", "maxLength", "pattern", "format", NULL}},
        {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL}},
    };
    for (size_t i = 0; i < sizeof infer / sizeof infer[0]; i++)
        for (size_t j = 0; infer[i].kw[j]; j++)
            if (json_object_get(s, infer[i].kw[j])) {
                out[n++] = infer[i].type;
                break;
            }
    if (n && json_is_true(json_object_get(s, "nullable")))
        out[n++] = "null";
    return n;
}

static int conv_type(sx_t *x, json_t *s, const char *t, sb_t *b)
{
    if (!strcmp(t, "string"))
        return conv_string(x, s, b);
    if (!strcmp(t, "number") || !strcmp(t, "integer"))
        return conv_number(x, s, t[1] == 'n', b);
    if (!strcmp(t, "boolean")) {
        sb_puts(b, "( \"true\" | \"false\" ) ");
        return 0;
    }
    if (!strcmp(t, "null")) {
        sb_puts(b, "\"null\" ");
        return 0;
    }
    int rc;
    x->guard++; /* an object or array reads a byte before any sub-schema */
    if (!strcmp(t, "object"))
        rc = conv_object(x, s, b);
    else
        rc = conv_array(x, s, b);
    x->guard--;
    return rc;
}

/* enum / const: the listed values that fit "type" when one is given. */
static int conv_enum(sx_t *x, json_t *s, sb_t *b)
{
    json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (e && !json_is_array(e))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'enum' must be an array");
    const char *types[8];
    int nt = json_object_get(s, "type") ? type_set(x, s, types) : 0;
    if (nt < 0)
        return x->rc;
    size_t n = c ? 1 : json_array_size(e), alts = 0;
    sb_puts(b, "( ");
    for (size_t i = 0; i < n; i++) {
        json_t *v = c ? c : json_array_get(e, i);
        if (c && e) {
            /* both: const must also be listed */
            int listed = 0;
            for (size_t j = 0; j < json_array_size(e); j++)
                listed |= json_equal(c, json_array_get(e, j));
            if (!listed)
                continue;
        }
        int fits = nt == 0;
        for (int j = 0; j < nt; j++)
            fits |= value_has_type(v, types[j]);
        if (!fits)
            continue;
        sb_puts(b, alts++ ? "| " : "");
        if (lit_json(x, b, v) < 0)
            return x->rc;
        sb_puts(b, " ");
    }
    sb_puts(b, ") ");
    if (!alts)
        return fail(x, PROTO_ERR_INVALID_VALUE, "no value of '%s' satisfies the schema",
                    c ? "const" : "enum");
    return 0;
}

/* Resolves a local JSON pointer ("#", "#/$defs/A", with ~0 ~1 and %25-free
 * names); NULL when it names nothing. */
static json_t *resolve(json_t *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    json_t *cur = root;
    const char *p = ref + 1;
    sb_t tok = {0}; /* one segment, unescaped: as long as the name it spells */
    while (cur && *p) {
        if (*p != '/') {
            cur = NULL;
            break;
        }
        p++;
        tok.n = 0;
        sb_put(&tok, "", 0); /* an empty segment is the key "" */
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~') {
                if (*p != '0' && *p != '1') {
                    tok.failed = 1;
                    break;
                }
                c = *p == '0' ? '~' : '/';
                p++;
            }
            sb_put(&tok, &c, 1);
        }
        if (tok.failed) { /* a bad escape, or out of memory */
            cur = NULL;
            break;
        }
        if (json_is_object(cur)) {
            cur = json_object_getn(cur, tok.p, tok.n);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok.p, &end, 10);
            cur = (*end || tok.n == 0 || i < 0) ? NULL : json_array_get(cur, (size_t)i);
        } else {
            cur = NULL;
        }
    }
    sb_free(&tok);
    return cur;
}

static int conv_ref(sx_t *x, json_t *s, char name[NAME_LEN])
{
    json_t *r = json_object_get(s, "$ref");
    if (!json_is_string(r))
        return fail(x, PROTO_ERR_INVALID_VALUE, "'$ref' must be a string");
    const char *ref = json_string_value(r);
    static const char *const ref_only[] = {"$ref", NULL};
    const char *other = other_constraint(s, ref_only);
    if (other)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'%s' beside '$ref' is not supported", other);
    for (int i = 0; i < x->n_refs; i++) {
        if (strcmp(x->refs[i].ptr, ref) != 0)
            continue;
        if (x->refs[i].busy && x->refs[i].guard == x->guard)
            return fail(x, PROTO_ERR_INVALID_VALUE,
                        "'$ref' '%.80s' refers back to itself without an object or array in "
                        "between",
                        ref);
        snprintf(name, NAME_LEN, "r%d", x->refs[i].rule);
        return 0;
    }
    json_t *target = resolve(x->root, ref);
    if (!target)
        return fail(x, ref[0] == '#' ? PROTO_ERR_INVALID_VALUE : PROTO_ERR_UNSUPPORTED,
                    "'$ref' '%.80s' %s", ref,
                    ref[0] == '#' ? "names nothing in the schema"
                                  : "is not supported (only local references \"#/...\" are)");
    if (x->n_refs >= PROTO_SCHEMA_MAX_REFS)
        return fail(x, PROTO_ERR_INVALID_VALUE, "more than %d distinct '$ref' targets",
                    PROTO_SCHEMA_MAX_REFS);
    int id = new_rule(x);
    if (id < 0)
        return x->rc;
    ref_ent_t *e = &x->refs[x->n_refs];
    e->ptr = px_strndup(ref, strlen(ref));
    if (!e->ptr)
        return oom(x);
    x->n_refs++;
    int me = x->n_refs - 1;
    x->refs[me].rule = id;
    x->refs[me].busy = 1;
    x->refs[me].guard = x->guard;
    char tn[NAME_LEN];
    /* messages inside the target name the reference they came through */
    size_t old = path_push(x, "(%s)", ref);
    int rc = conv(x, target, tn);
    path_pop(x, old);
    x->refs[me].busy = 0;
    if (rc < 0)
        return rc;
    sb_t body = {0};
    sb_puts(&body, tn);
    rc = emit_rule(x, id, &body);
    sb_free(&body);
    if (rc < 0)
        return rc;
    snprintf(name, NAME_LEN, "r%d", id);
    return 0;
}

static int conv_composition(sx_t *x, json_t *s, const char *kw, sb_t *b)
{
    json_t *l = json_object_get(s, kw);
    if (!json_is_array(l) || json_array_size(l) == 0)
        return fail(x, PROTO_ERR_INVALID_VALUE, "'%s' must be a non-empty array of schemas", kw);
    const char *const only[] = {kw, "nullable", NULL};
    const char *other = other_constraint(s, only);
    if (other)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'%s' beside '%s' is not supported", other, kw);
    if (!strcmp(kw, "allOf") && json_array_size(l) > 1)
        return fail(x, PROTO_ERR_UNSUPPORTED, "'allOf' of more than one schema is not supported");
    sb_puts(b, "( ");
    for (size_t i = 0; i < json_array_size(l); i++) {
        char n[NAME_LEN];
        if (conv_at(x, json_array_get(l, i), kw, (long)i, n) < 0)
            return x->rc;
        sb_printf(b, "%s%s ", i ? "| " : "", n);
    }
    if (json_is_true(json_object_get(s, "nullable")))
        sb_puts(b, "| \"null\" ");
    sb_puts(b, ") ");
    return 0;
}

/* Converts schema s into a rule; its name into name. */
static int conv(sx_t *x, json_t *s, char name[NAME_LEN])
{
    if (x->rc)
        return x->rc;
    if (json_is_true(s)) {
        any_name(x, name);
        return 0;
    }
    if (json_is_false(s))
        return fail(x, PROTO_ERR_INVALID_VALUE, "the schema is false: no value satisfies it");
    if (!json_is_object(s))
        return fail(x, PROTO_ERR_INVALID_VALUE, "a schema must be an object or a boolean");
    if (check_refused(x, s) < 0)
        return x->rc;
    if (json_object_get(s, "$ref"))
        return conv_ref(x, s, name);
    if (++x->depth > PROTO_SCHEMA_MAX_DEPTH) {
        x->depth--;
        return fail(x, PROTO_ERR_INVALID_VALUE, "schemas nested more than %d levels",
                    PROTO_SCHEMA_MAX_DEPTH);
    }
    sb_t body = {0};
    int rc = 0;
    static const char *const comp[] = {"anyOf", "oneOf", "allOf"};
    size_t ci = 0;
    while (ci < 3 && !json_object_get(s, comp[ci]))
        ci++;
    if (ci < 3) {
        rc = conv_composition(x, s, comp[ci], &body);
    } else if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        rc = conv_enum(x, s, &body);
    } else {
        const char *types[8];
        int nt = type_set(x, s, types);
        if (nt < 0) {
            rc = x->rc;
        } else if (nt == 0) {
            x->depth--;
            any_name(x, name);
            return 0;
        }
        for (int i = 0; rc == 0 && i < nt; i++) {
            sb_puts(&body, i ? "| " : "( ");
            rc = conv_type(x, s, types[i], &body);
        }
        if (rc == 0)
            sb_puts(&body, ") ");
    }
    x->depth--;
    if (rc == 0) {
        int id = new_rule(x);
        if (id < 0)
            rc = x->rc;
        else if ((rc = emit_rule(x, id, &body)) == 0)
            snprintf(name, NAME_LEN, "r%d", id);
    }
    sb_free(&body);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------------ entry */

static int finish(sx_t *x, const char *root_name, char **out, size_t *out_len)
{
    sb_printf(&x->out, "root ::= %s\n", root_name);
    emit_shared(x);
    if (x->out.failed)
        return oom(x);
    if (x->out.n > PROTO_MAX_GRAMMAR_BYTES)
        return fail(x, PROTO_ERR_INVALID_VALUE, "the schema's grammar is over %d bytes",
                    PROTO_MAX_GRAMMAR_BYTES);
    *out = x->out.p;
    *out_len = x->out.n;
    memset(&x->out, 0, sizeof x->out);
    return 0;
}

static void sx_free(sx_t *x)
{
    sb_free(&x->out);
    sb_free(&x->path);
    for (int i = 0; i < x->n_refs; i++)
        px_free(x->refs[i].ptr);
}

int proto_schema_grammar(json_t *schema, const char *path, const char *param, char **out,
                         size_t *out_len, proto_error_t *err)
{
    *out = NULL;
    *out_len = 0;
    sx_t *x = px_malloc(sizeof *x);
    if (!x)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(x, 0, sizeof *x);
    x->root = schema;
    x->param = param;
    x->err = err;
    path_push(x, "%s", path);
    char name[NAME_LEN];
    int rc = conv(x, schema, name);
    if (rc == 0)
        rc = finish(x, name, out, out_len);
    sx_free(x);
    px_free(x);
    return rc;
}

int proto_schema_object_grammar(char **out, size_t *out_len, proto_error_t *err)
{
    json_t *s = json_pack("{s:s}", "type", "object");
    if (!s)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    int rc = proto_schema_grammar(s, "response_format", "response_format", out, out_len, err);
    json_decref(s);
    return rc;
}

/* The refs table names pointers inside one root: a new root starts it
 * again (rule ids keep counting, so the rules of earlier roots stay apart). */
static void refs_reset(sx_t *x)
{
    for (int i = 0; i < x->n_refs; i++)
        px_free(x->refs[i].ptr);
    x->n_refs = 0;
}

int proto_schema_tools_grammar(const proto_schema_fn_t *fns, size_t n, int max_calls, char **out,
                               size_t *out_len, proto_error_t *err)
{
    *out = NULL;
    *out_len = 0;
    if (n == 0 || max_calls < 1 || max_calls > PROTO_MAX_TOOL_CALLS)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL,
                               "tool grammar of %zu functions, %d calls", n, max_calls);
    sx_t *x = px_malloc(sizeof *x);
    if (!x)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(x, 0, sizeof *x);
    x->err = err;
    sb_t alts = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        refs_reset(x);
        path_pop(x, 0);
        path_push(x, "%s", fns[i].path);
        x->param = fns[i].path;
        x->root = fns[i].parameters;
        char args[NAME_LEN] = "\"{}\"";
        if (fns[i].parameters)
            rc = conv(x, fns[i].parameters, args);
        if (rc < 0)
            break;
        sb_t body = {0}, head = {0};
        sb_printf(&head, "{\"name\": \"%s\", \"arguments\": ", fns[i].name);
        if (head.failed) {
            sb_free(&head);
            rc = oom(x);
            break;
        }
        lit(&body, head.p, head.n);
        sb_free(&head);
        sb_printf(&body, " %s \"}\"", args);
        int id = add_rule(x, &body);
        if (id < 0) {
            rc = id;
            break;
        }
        sb_printf(&alts, "%sr%d", i ? " | " : "", id);
    }
    if (rc == 0) {
        sb_printf(&x->out, "call ::= \"<tool_call>\\n\" ( %s ) \"\\n</tool_call>\"\n",
                  alts.p ? alts.p : "");
        if (alts.failed)
            rc = oom(x);
    }
    if (rc == 0) {
        sb_t root = {0};
        if (max_calls > 1)
            sb_printf(&root, "call ( \"\\n\" call ){0,%d}", max_calls - 1);
        else
            sb_puts(&root, "call");
        rc = root.failed ? oom(x) : finish(x, root.p, out, out_len);
        sb_free(&root);
    }
    sb_free(&alts);
    sx_free(x);
    px_free(x);
    return rc;
}
