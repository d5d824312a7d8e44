/* core/text/grammar.c — the vocabulary trie, grammar states, and the token mask.
 *
 * States. A state is the set of parse stacks the text so far leaves (a
 * grammar may be ambiguous), each a list of positions (grammar_impl.h);
 * after every step each stack is *closed*: ENDs popped and REFs expanded
 * until its top expects a byte, or it is empty (the text is complete).
 *
 * Masks. A token is allowed when some stack can consume all its bytes. The
 * tokens are walked as a byte trie, depth first, carrying the set of stacks
 * the path so far leaves; a subtree is skipped as soon as no stack survives.
 * Walks memoize: each distinct set met in one walk is interned, and the step
 * (set, byte) -> set is computed once (a lazy DFA over the walk's sets), so a
 * trie node costs a table lookup.
 *
 * Position tables. Walking the whole trie at every step would cost about as
 * much as a small forward, so each grammar position p gets a table, built on
 * first use: the tokens accepted from a stack whose top is p, as far as that
 * can be decided from the frames that are known to lie below p whatever the
 * context. Those frames are the *chain* of p: below a frame of rule R there
 * can only be one of the positions cont[R] (a REF that is not last in its
 * alternative pushes its return position; a last one is a tail call and
 * inherits the caller's); when that position is unique, it is known, and so
 * on down. The table holds (a) the bit set of tokens accepted within the
 * chain (including those that pop out of it exactly at their last byte), and
 * (b) the trie nodes where a path pops out of the chain with bytes left: the
 * tokens below such a node depend on the stack under the chain. A mask step
 * for a stack is then: OR the bit set, and walk the subtrees of (b) from the
 * real frames under the chain — few and shallow, because a continuation
 * rejects most bytes at once. A stack whose top d frames do not equal the
 * chain (not expected) or a grammar over max_cache falls back to a full walk;
 * the tests compare both ways with a reference recognizer.
 */
#include "core/text/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text/grammar_impl.h"

#define CLOSE_STEPS (1u << 18) /* closure steps in one advance (ambiguity bound) */
#define WALK_SETS (1u << 16)   /* distinct stack sets one walk may intern */
#define WALK_WORDS (1u << 22)  /* words of those sets */
#define WALK_STEPS (1u << 25)  /* closure steps in one walk (time bound) */
#define PROBE_EFFORT (1u << 20) /* closure steps and stack comparisons of one compile's probe */
#define PROBE_WORDS (1u << 22)  /* words of the states one probe keeps (16 MiB) */

/* ------------------------------------------------------------ helpers */

static int grow_to(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

#define GROW(ptr, cap, need) grow_to((void **)&(ptr), &(cap), (need), sizeof *(ptr))

/* memcpy / memcmp of n frames; n may be 0 with NULL pointers (which the C
 * library functions do not allow). */
static void copy_words(uint32_t *dst, const uint32_t *src, size_t n)
{
    if (n)
        memcpy(dst, src, n * sizeof *dst);
}

static int same_words(const uint32_t *a, const uint32_t *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

static void set_bit(uint64_t *bits, int32_t id)
{
    bits[(uint32_t)id >> 6] |= 1ull << ((uint32_t)id & 63);
}

/* ------------------------------------------------------------ vocabulary */

struct core_grammar_vocab {
    int32_t n;     /* tokens */
    uint8_t *kind; /* [n] core_grammar_tok_kind_t */
    uint32_t *off; /* [n + 1] token bytes: bytes[off[i] .. off[i + 1]) (TEXT only) */
    char *bytes;
    int32_t *ends; /* [n_ends] END token ids */
    uint32_t n_ends;
    uint32_t n_nodes;
    uint8_t *byte;   /* [n_nodes] byte leading into the node */
    uint32_t *child; /* [n_nodes + 1] node i's children: child[i] .. child[i + 1] */
    uint32_t *tok;   /* [n_nodes + 1] tokens ending at node i: ids[tok[i] .. tok[i + 1]) */
    int32_t *ids;
    uint32_t max_len; /* longest TEXT token: the trie's depth */
};

typedef struct vent {
    const unsigned char *p;
    uint32_t len;
    int32_t id;
} vent_t;

static int vent_cmp(const void *a, const void *b)
{
    const vent_t *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

void core_grammar_vocab_free(core_grammar_vocab_t *v)
{
    if (!v)
        return;
    free(v->kind);
    free(v->off);
    free(v->bytes);
    free(v->ends);
    free(v->byte);
    free(v->child);
    free(v->tok);
    free(v->ids);
    free(v);
}

/* Breadth-first over e[0..n) sorted by bytes: node i's children are
 * allocated while node i is processed, so they are consecutive and child[]
 * and tok[] never decrease. A node is a distinct non-empty prefix, so there
 * are at most total + 1 of them. */
static int trie_build(core_grammar_vocab_t *v, const vent_t *e, size_t n, size_t total)
{
    size_t cap = total + 2;
    uint32_t *qa = malloc(cap * sizeof *qa); /* per node: its tokens e[qa .. qb), its depth */
    uint32_t *qb = malloc(cap * sizeof *qb);
    uint32_t *qd = malloc(cap * sizeof *qd);
    v->byte = malloc(cap);
    v->child = malloc(cap * sizeof *v->child);
    v->tok = malloc(cap * sizeof *v->tok);
    v->ids = malloc((n ? n : 1) * sizeof *v->ids);
    int rc = -1;
    if (!qa || !qb || !qd || !v->byte || !v->child || !v->tok || !v->ids)
        goto out;
    size_t nodes = 1, n_ids = 0;
    v->byte[0] = 0;
    qa[0] = 0;
    qb[0] = (uint32_t)n;
    qd[0] = 0;
    for (size_t i = 0; i < nodes; i++) {
        uint32_t a = qa[i], b = qb[i], d = qd[i];
        v->tok[i] = (uint32_t)n_ids;
        while (a < b && e[a].len == d)
            v->ids[n_ids++] = e[a++].id;
        v->child[i] = (uint32_t)nodes;
        while (a < b) {
            unsigned char c = e[a].p[d];
            uint32_t z = a;
            while (z < b && e[z].p[d] == c)
                z++;
            v->byte[nodes] = c;
            qa[nodes] = a;
            qb[nodes] = z;
            qd[nodes] = d + 1;
            nodes++;
            a = z;
        }
    }
    v->n_nodes = (uint32_t)nodes;
    v->child[nodes] = (uint32_t)nodes;
    v->tok[nodes] = (uint32_t)n_ids;
    rc = 0;
out:
    free(qa);
    free(qb);
    free(qd);
    return rc;
}

int core_grammar_vocab_new(int32_t n, const char *const *pieces, const size_t *lens,
                           const uint8_t *kinds, core_grammar_vocab_t **out, core_error_t *err)
{
    *out = NULL;
    if (n <= 0 || n > CORE_TOK_MAX_VOCAB)
        return core_error_set(err, CORE_EINVAL, "vocabulary of %d tokens (1..%lld)", (int)n,
                              (long long)CORE_TOK_MAX_VOCAB);
    if (!pieces || !lens || !kinds)
        return core_error_set(err, CORE_EINVAL, "vocabulary arrays are NULL");
    core_grammar_vocab_t *v = calloc(1, sizeof *v);
    vent_t *e = NULL;
    if (!v)
        return core_error_set(err, CORE_ENOMEM, "grammar vocabulary");
    size_t total = 0, n_text = 0, n_ends = 0;
    for (int32_t i = 0; i < n; i++) {
        if (kinds[i] > CORE_GRAMMAR_TOK_END) {
            core_grammar_vocab_free(v);
            return core_error_set(err, CORE_EINVAL, "token %d has kind %u", (int)i,
                                  (unsigned)kinds[i]);
        }
        if (kinds[i] == CORE_GRAMMAR_TOK_TEXT && lens[i] > 0) {
            if (lens[i] > CORE_TOK_MAX_TOKEN_LEN || !pieces[i]) {
                core_grammar_vocab_free(v);
                return core_error_set(err, CORE_EINVAL, "token %d: %s", (int)i,
                                      pieces[i] ? "longer than CORE_TOK_MAX_TOKEN_LEN"
                                                : "bytes are NULL");
            }
            total += lens[i];
            n_text++;
        }
        n_ends += kinds[i] == CORE_GRAMMAR_TOK_END;
    }
    v->n = n;
    v->kind = malloc((size_t)n);
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->bytes = malloc(total ? total : 1);
    v->ends = malloc((n_ends ? n_ends : 1) * sizeof *v->ends);
    e = malloc((n_text ? n_text : 1) * sizeof *e);
    if (!v->kind || !v->off || !v->bytes || !v->ends || !e || total > UINT32_MAX)
        goto nomem;
    size_t o = 0, k = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)o;
        int text = kinds[i] == CORE_GRAMMAR_TOK_TEXT && lens[i] > 0;
        v->kind[i] = text                               ? CORE_GRAMMAR_TOK_TEXT
                     : kinds[i] == CORE_GRAMMAR_TOK_END ? CORE_GRAMMAR_TOK_END
                                                        : CORE_GRAMMAR_TOK_NEVER;
        if (v->kind[i] == CORE_GRAMMAR_TOK_END)
            v->ends[v->n_ends++] = i;
        if (!text)
            continue;
        memcpy(v->bytes + o, pieces[i], lens[i]);
        e[k].p = (const unsigned char *)v->bytes + o;
        e[k].len = (uint32_t)lens[i];
        e[k].id = i;
        if (e[k].len > v->max_len)
            v->max_len = e[k].len;
        k++;
        o += lens[i];
    }
    v->off[n] = (uint32_t)o;
    qsort(e, n_text, sizeof *e, vent_cmp);
    if (trie_build(v, e, n_text, total) < 0)
        goto nomem;
    free(e);
    *out = v;
    return 0;
nomem:
    free(e);
    core_grammar_vocab_free(v);
    return core_error_set(err, CORE_ENOMEM, "grammar vocabulary of %d tokens", (int)n);
}

int core_grammar_vocab_from_tokenizer(const core_tokenizer_t *t, core_grammar_vocab_t **out,
                                      core_error_t *err)
{
    *out = NULL;
    int32_t n = core_tokenizer_n_vocab(t);
    if (n <= 0)
        return core_error_set(err, CORE_EINVAL, "the tokenizer has no tokens");
    const char **p = malloc((size_t)n * sizeof *p);
    size_t *l = malloc((size_t)n * sizeof *l);
    uint8_t *k = malloc((size_t)n);
    int rc;
    if (!p || !l || !k) {
        rc = core_error_set(err, CORE_ENOMEM, "grammar vocabulary of %d tokens", (int)n);
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        core_tok_type_t ty = core_tokenizer_token_type(t, i);
        p[i] = core_tokenizer_piece(t, i, &l[i]);
        if (core_tokenizer_is_eog(t, i))
            k[i] = CORE_GRAMMAR_TOK_END;
        else if (ty == CORE_TOK_TYPE_CONTROL || ty == CORE_TOK_TYPE_UNKNOWN ||
                 ty == CORE_TOK_TYPE_UNUSED || !p[i])
            k[i] = CORE_GRAMMAR_TOK_NEVER;
        else
            k[i] = CORE_GRAMMAR_TOK_TEXT;
        if (!p[i]) {
            p[i] = "";
            l[i] = 0;
        }
    }
    rc = core_grammar_vocab_new(n, p, l, k, out, err);
out:
    free(p);
    free(l);
    free(k);
    return rc;
}

int32_t core_grammar_vocab_size(const core_grammar_vocab_t *v)
{
    return v->n;
}

size_t core_grammar_vocab_nodes(const core_grammar_vocab_t *v)
{
    return v->n_nodes;
}

/* ------------------------------------------------------------ grammar */

struct gcache {
    uint32_t d;      /* frames of the chain */
    int escape;      /* 1: something lies below the chain (a context) */
    uint32_t *chain; /* [d] bottom first; chain[d - 1] is the position */
    uint64_t *bits;  /* [words] tokens accepted within the chain */
    uint32_t n_esc;
    uint32_t *esc; /* [n_esc] trie nodes where a path leaves the chain with bytes left */
};

static void cache_free(gcache_t *c)
{
    if (!c)
        return;
    free(c->chain);
    free(c->bits);
    free(c->esc);
    free(c);
}

void core_grammar_free(core_grammar_t *g)
{
    if (!g)
        return;
    if (g->cache) {
        for (uint32_t i = 0; i < g->n_el; i++)
            cache_free(atomic_load_explicit(&g->cache[i], memory_order_relaxed));
        free((void *)g->cache);
        pthread_mutex_destroy(&g->mu);
    }
    free(g->el);
    free(g->el_rule);
    free(g->rule_alt);
    free(g->alt_first);
    free(g->sets);
    free(g->cont);
    free(g);
}

static uint32_t clamp_u32(uint32_t v, uint32_t def)
{
    return v == 0 || v > def ? def : v;
}

static void limits_resolve(const core_grammar_limits_t *in, core_grammar_limits_t *o)
{
    core_grammar_limits_t z;
    memset(&z, 0, sizeof z);
    if (!in)
        in = &z;
    o->max_text = in->max_text == 0 || in->max_text > CORE_GRAMMAR_MAX_TEXT ? CORE_GRAMMAR_MAX_TEXT
                                                                            : in->max_text;
    o->max_rules = clamp_u32(in->max_rules, CORE_GRAMMAR_MAX_RULES);
    o->max_elements = clamp_u32(in->max_elements, CORE_GRAMMAR_MAX_ELEMENTS);
    o->max_nesting = clamp_u32(in->max_nesting, CORE_GRAMMAR_MAX_NESTING);
    o->max_repeat = clamp_u32(in->max_repeat, CORE_GRAMMAR_MAX_REPEAT);
    o->max_stacks = clamp_u32(in->max_stacks, CORE_GRAMMAR_MAX_STACKS);
    o->max_depth = clamp_u32(in->max_depth, CORE_GRAMMAR_MAX_DEPTH);
    o->max_probe = clamp_u32(in->max_probe, CORE_GRAMMAR_MAX_PROBE);
    o->max_cache = in->max_cache == 0 || in->max_cache > CORE_GRAMMAR_MAX_CACHE
                       ? CORE_GRAMMAR_MAX_CACHE
                       : in->max_cache;
}

static int probe(const core_grammar_t *g, core_error_t *err);

/* cont[R]: the positions that can lie directly below a frame of rule R
 * (module comment), as a join over the lattice NONE < one position <
 * MULTI. A REF at s pushes s + 1 unless s + 1 is END (tail call: the
 * caller's own below is inherited). A worklist of rules whose value
 * changed: each changes at most twice, so this is linear in the grammar
 * (a pass over every element until nothing changes took a pass per link
 * of a long chain of tail calls, as {0,1000} makes: seconds). */
static int compute_cont(core_grammar_t *g, core_error_t *err)
{
    uint32_t *todo = malloc(((size_t)g->n_rules + 1) * sizeof *todo);
    uint8_t *queued = calloc(g->n_rules ? g->n_rules : 1, 1);
    if (!todo || !queued) {
        free(todo);
        free(queued);
        return core_error_set(err, CORE_ENOMEM, "grammar");
    }
    for (uint32_t r = 0; r < g->n_rules; r++)
        g->cont[r] = GCONT_NONE;
    g->cont[0] = GCONT_BOTTOM;
    size_t nt = 0;
    todo[nt++] = 0;
    queued[0] = 1;
    while (nt) {
        uint32_t r = todo[--nt];
        queued[r] = 0;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            for (uint32_t s = g->alt_first[a]; g->el[s].kind != GEL_END; s++) {
                if (g->el[s].kind != GEL_REF)
                    continue;
                uint32_t v = g->el[s + 1].kind != GEL_END ? s + 1 : g->cont[r];
                uint32_t t = g->el[s].arg, *c = &g->cont[t];
                uint32_t nv = *c == GCONT_NONE ? v : *c == v ? v : GCONT_MULTI;
                if (nv != *c) {
                    *c = nv;
                    if (!queued[t]) {
                        queued[t] = 1;
                        todo[nt++] = t;
                    }
                }
            }
        }
    }
    free(todo);
    free(queued);
    return 0;
}

int core_grammar_new(const char *text, size_t len, const core_grammar_vocab_t *vocab,
                     const core_grammar_limits_t *lim, core_grammar_t **out, core_error_t *err)
{
    *out = NULL;
    core_grammar_t *g = calloc(1, sizeof *g);
    if (!g)
        return core_error_set(err, CORE_ENOMEM, "grammar");
    limits_resolve(lim, &g->lim);
    g->vocab = vocab;
    int rc = gram_parse(g, text, len, err);
    if (rc < 0) {
        core_grammar_free(g);
        return rc;
    }
    g->cont = malloc((size_t)g->n_rules * sizeof *g->cont);
    g->cache = calloc(g->n_el, sizeof *g->cache);
    if (!g->cont || !g->cache) {
        free((void *)g->cache);
        g->cache = NULL;
        core_grammar_free(g);
        return core_error_set(err, CORE_ENOMEM, "grammar");
    }
    pthread_mutex_init(&g->mu, NULL);
    if ((rc = compute_cont(g, err)) != 0 || (rc = probe(g, err)) != 0) {
        core_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

size_t core_grammar_cache_bytes(const core_grammar_t *g)
{
    pthread_mutex_lock((pthread_mutex_t *)&g->mu);
    size_t n = g->cache_bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
    return n;
}

/* ------------------------------------------------------------ workspace */

/* A list of stacks being built: each as [nb, n, frames[n]]: the first nb
 * frames of the walk's base, then n frames of its own. */
typedef struct wlist {
    uint32_t *w;
    size_t len, cap;
    uint32_t n;
    int complete, escaped;
    gset_t tops; /* bytes some stack's top accepts */
} wlist_t;

/* An interned set: the same shape, stored in the arena. */
typedef struct iset {
    size_t off, len;
    uint32_t n, hash;
    int complete, escaped;
    gset_t tops;
} iset_t;

typedef struct slot {
    uint32_t gen, key, val;
} slot_t;

struct core_grammar_ws {
    uint32_t *work; /* closure worklist: items [nb, n, frames[n]] */
    size_t work_len, work_cap;
    size_t *item; /* item offsets */
    size_t n_item, cap_item;
    uint32_t *cur; /* the stack being closed: its own frames */
    size_t cur_cap;
    uint32_t steps;      /* closure steps of this advance */
    uint32_t walk_steps; /* closure steps of this walk */
    uint64_t effort;     /* closure steps and stack comparisons ever (the probe's budget) */
    wlist_t a, b;
    iset_t *sets;
    size_t n_sets, cap_sets;
    uint32_t *arena;
    size_t arena_len, arena_cap;
    slot_t *ih, *th; /* set hash -> id; (id, byte) -> id */
    uint32_t ih_cap, th_cap, ih_used, th_used;
    uint32_t gen;
    uint32_t *lv_node, *lv_id, *lv_next;
    size_t lv_cap, lv_cap2, lv_cap3;
    uint32_t *esc;
    size_t n_esc, cap_esc;
    uint32_t *acc; /* the state being built by an accept */
    size_t acc_len, acc_cap;
    uint32_t *chain;
    size_t chain_cap;
    uint64_t *bits; /* [words of the vocabulary] */
    size_t bits_cap;
};

core_grammar_ws_t *core_grammar_ws_new(void)
{
    core_grammar_ws_t *ws = calloc(1, sizeof *ws);
    if (ws)
        ws->gen = 1;
    return ws;
}

void core_grammar_ws_free(core_grammar_ws_t *ws)
{
    if (!ws)
        return;
    free(ws->work);
    free(ws->item);
    free(ws->cur);
    free(ws->a.w);
    free(ws->b.w);
    free(ws->sets);
    free(ws->arena);
    free(ws->ih);
    free(ws->th);
    free(ws->lv_node);
    free(ws->lv_id);
    free(ws->lv_next);
    free(ws->esc);
    free(ws->acc);
    free(ws->chain);
    free(ws->bits);
    free(ws);
}

static int ws_nomem(core_error_t *err)
{
    core_error_set(err, CORE_ENOMEM, "grammar workspace");
    return CORE_ENOMEM; /* the constant: the analyzer sees the error is nonzero */
}

/* ------------------------------------------------------------ closing stacks */

/* The frames a walk's stacks stand on; popping past the bottom completes
 * the text (escape = 0) or leaves the known frames (escape = 1). */
typedef struct wbase {
    const uint32_t *f;
    uint32_t n;
    int escape;
} wbase_t;

static void wlist_reset(wlist_t *l)
{
    l->len = 0;
    l->n = 0;
    l->complete = l->escaped = 0;
    memset(&l->tops, 0, sizeof l->tops);
}

/* Adds the closed stack (nb, cur[0..n)) to l unless it is there already. */
static int emit(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b, uint32_t nb,
                uint32_t n, wlist_t *l, core_error_t *err)
{
    ws->effort += (uint64_t)l->n * (1 + (nb + n) / 32); /* a comparison reads up to a stack */
    for (size_t o = 0; o < l->len; o += 2 + l->w[o + 1])
        if (l->w[o] == nb && l->w[o + 1] == n && same_words(l->w + o + 2, ws->cur, n))
            return 0;
    if (l->n >= g->lim.max_stacks)
        return core_error_set(err, CORE_ERANGE,
                              "the grammar is too ambiguous: more than %u parse stacks at once",
                              (unsigned)g->lim.max_stacks);
    if (GROW(l->w, l->cap, l->len + 2 + n) < 0)
        return ws_nomem(err);
    l->w[l->len] = nb;
    l->w[l->len + 1] = n;
    copy_words(l->w + l->len + 2, ws->cur, n);
    l->len += 2 + n;
    l->n++;
    uint32_t top = n ? ws->cur[n - 1] : b->f[nb - 1];
    const gset_t *s = &g->sets[g->el[top].arg];
    for (int i = 0; i < 4; i++)
        l->tops.w[i] |= s->w[i];
    return 0;
}

static int work_push(core_grammar_ws_t *ws, uint32_t nb, const uint32_t *f, uint32_t n,
                     uint32_t extra)
{
    if (GROW(ws->work, ws->work_cap, ws->work_len + 3 + n) < 0 ||
        GROW(ws->item, ws->cap_item, ws->n_item + 1) < 0)
        return -1;
    ws->item[ws->n_item++] = ws->work_len;
    uint32_t *w = ws->work + ws->work_len;
    w[0] = nb;
    w[1] = n + 1;
    copy_words(w + 2, f, n);
    w[2 + n] = extra;
    ws->work_len += 3 + n;
    return 0;
}

/* Closes the stack (nb, own frames f[0..n)) into l: follows END (pop) and
 * REF (expand, one path per alternative) until each path's top is BYTES or
 * it pops past the bottom. No left recursion (checked by the parser) makes
 * this finite; CLOSE_STEPS bounds the paths a hostile grammar can make it
 * explore before the duplicates meet. */
static int closure(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b, uint32_t nb,
                   const uint32_t *f, uint32_t n, wlist_t *l, core_error_t *err)
{
    ws->n_item = 0;
    ws->work_len = 0;
    if (n == 0) {
        if (GROW(ws->work, ws->work_cap, 2) < 0 || GROW(ws->item, ws->cap_item, 1) < 0)
            return ws_nomem(err);
        ws->item[ws->n_item++] = 0;
        ws->work[0] = nb;
        ws->work[1] = 0;
        ws->work_len = 2;
    } else if (work_push(ws, nb, f, n - 1, f[n - 1]) < 0) {
        return ws_nomem(err);
    }
    while (ws->n_item) {
        size_t o = ws->item[--ws->n_item];
        uint32_t cnb = ws->work[o], cn = ws->work[o + 1];
        if (GROW(ws->cur, ws->cur_cap, (size_t)cn + 1) < 0)
            return ws_nomem(err);
        copy_words(ws->cur, ws->work + o + 2, cn);
        ws->work_len = o;
        for (;;) {
            ws->effort++;
            if (++ws->steps > CLOSE_STEPS)
                return core_error_set(err, CORE_ERANGE,
                                      "the grammar is too ambiguous: one byte opens more than "
                                      "%u parse paths",
                                      CLOSE_STEPS);
            if (++ws->walk_steps > WALK_STEPS)
                return core_error_set(err, CORE_ERANGE,
                                      "the grammar is too complex for this vocabulary (one step "
                                      "takes more than %u parser moves)",
                                      WALK_STEPS);
            if (cn == 0 && cnb == 0) {
                if (b->escape)
                    l->escaped = 1;
                else
                    l->complete = 1;
                break;
            }
            uint32_t t = cn ? ws->cur[cn - 1] : b->f[cnb - 1];
            const gel_t *e = &g->el[t];
            if (e->kind == GEL_BYTES) {
                int rc = emit(g, ws, b, cnb, cn, l, err);
                if (rc)
                    return rc;
                break;
            }
            if (cn)
                cn--;
            else
                cnb--;
            if (e->kind == GEL_END)
                continue;
            if (GROW(ws->cur, ws->cur_cap, (size_t)cn + 2) < 0)
                return ws_nomem(err);
            /* REF: return position (unless a tail call), then the alternatives */
            if (g->el[t + 1].kind != GEL_END)
                ws->cur[cn++] = t + 1;
            if ((size_t)cnb + cn + 1 > g->lim.max_depth)
                return core_error_set(err, CORE_ERANGE,
                                      "the text nests deeper than %u grammar frames",
                                      (unsigned)g->lim.max_depth);
            uint32_t a0 = g->rule_alt[e->arg], a1 = g->rule_alt[e->arg + 1];
            for (uint32_t a = a1 - 1; a > a0; a--)
                if (work_push(ws, cnb, ws->cur, cn, g->alt_first[a]) < 0)
                    return ws_nomem(err);
            ws->cur[cn++] = g->alt_first[a0];
        }
    }
    return 0;
}

/* Every stack of the list (w[0..len), n stacks) that accepts byte c, moved
 * past it and closed, into l (reset first). */
static int advance(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b,
                   const uint32_t *w, size_t len, unsigned c, wlist_t *l, core_error_t *err)
{
    wlist_reset(l);
    ws->steps = 0;
    for (size_t o = 0; o < len; o += 2 + w[o + 1]) {
        uint32_t nb = w[o], n = w[o + 1];
        uint32_t top = n ? w[o + 2 + n - 1] : b->f[nb - 1];
        if (!gset_has(&g->sets[g->el[top].arg], c))
            continue;
        int rc;
        if (n) {
            /* own frames: the top moves on (closure copies them first) */
            if (GROW(ws->chain, ws->chain_cap, n) < 0)
                return ws_nomem(err);
            copy_words(ws->chain, w + o + 2, n);
            ws->chain[n - 1] = top + 1;
            rc = closure(g, ws, b, nb, ws->chain, n, l, err);
        } else {
            /* the top is a base frame: pop it, continue in a frame of our own */
            uint32_t next = top + 1;
            rc = closure(g, ws, b, nb - 1, &next, 1, l, err);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------ walks */

static uint32_t hash_words(const uint32_t *w, size_t n, uint32_t seed)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return (uint32_t)h;
}

static uint32_t mix(uint32_t k)
{
    k *= 0x9E3779B1u;
    return k ^ (k >> 15);
}

/* Starts a walk over base b: forgets every interned set. */
static void walk_reset(core_grammar_ws_t *ws)
{
    ws->n_sets = 0;
    ws->arena_len = 0;
    ws->ih_used = ws->th_used = 0;
    ws->walk_steps = 0;
    if (++ws->gen == 0) { /* wrapped: clear the stamps for real */
        if (ws->ih)
            memset(ws->ih, 0, ws->ih_cap * sizeof *ws->ih);
        if (ws->th)
            memset(ws->th, 0, ws->th_cap * sizeof *ws->th);
        ws->gen = 1;
    }
}

/* Grows a table to twice its size keeping the entries of this walk. */
static int table_grow(core_grammar_ws_t *ws, slot_t **tab, uint32_t *cap, int is_sets)
{
    uint32_t nc = *cap ? 2 * *cap : 1024;
    slot_t *t = calloc(nc, sizeof *t);
    if (!t)
        return -1;
    for (uint32_t i = 0; i < *cap; i++) {
        slot_t s = (*tab)[i];
        if (s.gen != ws->gen)
            continue;
        uint32_t h = (is_sets ? s.key : mix(s.key)) & (nc - 1);
        while (t[h].gen == ws->gen)
            h = (h + 1) & (nc - 1);
        t[h] = s;
    }
    free(*tab);
    *tab = t;
    *cap = nc;
    return 0;
}

/* The id of the set in l, interned. */
static int intern(core_grammar_ws_t *ws, const wlist_t *l, uint32_t *id, core_error_t *err)
{
    uint32_t flags = (uint32_t)l->complete | (uint32_t)l->escaped << 1;
    uint32_t h = hash_words(l->w, l->len, flags);
    if (2 * (ws->ih_used + 1) > ws->ih_cap && table_grow(ws, &ws->ih, &ws->ih_cap, 1) < 0)
        return ws_nomem(err);
    uint32_t m = ws->ih_cap - 1;
    for (uint32_t i = h & m;; i = (i + 1) & m) {
        slot_t *s = &ws->ih[i];
        if (s->gen != ws->gen) {
            if (ws->n_sets >= WALK_SETS || ws->arena_len + l->len > WALK_WORDS)
                return core_error_set(err, CORE_ERANGE,
                                      "the grammar is too complex for this vocabulary (more than "
                                      "%u parser states in one step)",
                                      WALK_SETS);
            if (GROW(ws->sets, ws->cap_sets, ws->n_sets + 1) < 0 ||
                GROW(ws->arena, ws->arena_cap, ws->arena_len + l->len + 1) < 0)
                return ws_nomem(err);
            iset_t *n = &ws->sets[ws->n_sets];
            n->off = ws->arena_len;
            n->len = l->len;
            n->n = l->n;
            n->hash = h;
            n->complete = l->complete;
            n->escaped = l->escaped;
            n->tops = l->tops;
            copy_words(ws->arena + ws->arena_len, l->w, l->len);
            ws->arena_len += l->len;
            *s = (slot_t){ws->gen, h, (uint32_t)ws->n_sets};
            ws->ih_used++;
            *id = (uint32_t)ws->n_sets++;
            return 0;
        }
        if (s->key != h)
            continue;
        const iset_t *c = &ws->sets[s->val];
        if (c->len == l->len && c->complete == l->complete && c->escaped == l->escaped &&
            same_words(ws->arena + c->off, l->w, l->len)) {
            *id = s->val;
            return 0;
        }
    }
}

/* The set (id, then byte c): memoized. */
static int step(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b, uint32_t id,
                unsigned c, uint32_t *out, core_error_t *err)
{
    uint32_t key = id << 8 | c;
    if (ws->th_cap) {
        uint32_t m = ws->th_cap - 1;
        for (uint32_t i = mix(key) & m; ws->th[i].gen == ws->gen; i = (i + 1) & m)
            if (ws->th[i].key == key) {
                *out = ws->th[i].val;
                return 0;
            }
    }
    const iset_t *s = &ws->sets[id];
    int rc = advance(g, ws, b, ws->arena + s->off, s->len, c, &ws->a, err);
    if (rc)
        return rc;
    if ((rc = intern(ws, &ws->a, out, err)) != 0)
        return rc;
    if (2 * (ws->th_used + 1) > ws->th_cap && table_grow(ws, &ws->th, &ws->th_cap, 0) < 0)
        return ws_nomem(err);
    uint32_t m = ws->th_cap - 1, i = mix(key) & m;
    while (ws->th[i].gen == ws->gen)
        i = (i + 1) & m;
    ws->th[i] = (slot_t){ws->gen, key, *out};
    ws->th_used++;
    return 0;
}

/* Depth-first over the trie below node0 from interned set id0: sets the bit
 * of every token (below node0) some stack accepts whole; with record,
 * appends to ws->esc each node with children where a path leaves the base. */
static int walk(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b, uint32_t node0,
                uint32_t id0, uint64_t *bits, int record, core_error_t *err)
{
    const core_grammar_vocab_t *v = g->vocab;
    size_t need = (size_t)v->max_len + 2;
    if (GROW(ws->lv_node, ws->lv_cap, need) < 0 || GROW(ws->lv_id, ws->lv_cap2, need) < 0 ||
        GROW(ws->lv_next, ws->lv_cap3, need) < 0)
        return ws_nomem(err);
    size_t L = 0;
    ws->lv_node[0] = node0;
    ws->lv_id[0] = id0;
    ws->lv_next[0] = v->child[node0];
    for (;;) {
        uint32_t node = ws->lv_node[L], c = ws->lv_next[L];
        if (c == v->child[node + 1]) {
            if (L == 0)
                return 0;
            L--;
            continue;
        }
        ws->lv_next[L] = c + 1;
        unsigned byte = v->byte[c];
        if (!gset_has(&ws->sets[ws->lv_id[L]].tops, byte))
            continue;
        uint32_t nid;
        int rc = step(g, ws, b, ws->lv_id[L], byte, &nid, err);
        if (rc)
            return rc;
        const iset_t *n = &ws->sets[nid];
        if (n->n == 0 && !n->complete && !n->escaped)
            continue;
        for (uint32_t k = v->tok[c]; k < v->tok[c + 1]; k++)
            set_bit(bits, v->ids[k]);
        int kids = v->child[c] != v->child[c + 1];
        if (record && n->escaped && kids) {
            if (GROW(ws->esc, ws->cap_esc, ws->n_esc + 1) < 0)
                return ws_nomem(err);
            ws->esc[ws->n_esc++] = c;
        }
        if (n->n && kids) {
            L++;
            ws->lv_node[L] = c;
            ws->lv_id[L] = nid;
            ws->lv_next[L] = v->child[c];
        }
    }
}

/* Interns the closure of (nb base frames, no own frames) over b. */
static int start_set(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b, uint32_t nb,
                     uint32_t *id, core_error_t *err)
{
    walk_reset(ws);
    wlist_reset(&ws->a);
    ws->steps = 0;
    int rc = closure(g, ws, b, nb, NULL, 0, &ws->a, err);
    return rc ? rc : intern(ws, &ws->a, id, err);
}

/* ------------------------------------------------------------ tables */

static size_t mask_words(const core_grammar_t *g)
{
    return CORE_GRAMMAR_MASK_WORDS(g->vocab->n);
}

/* Builds the table of position p (called under g->mu). NULL in *out when
 * max_cache does not allow one more. */
static int cache_build(const core_grammar_t *g, core_grammar_ws_t *ws, uint32_t p, gcache_t **out,
                       core_error_t *err)
{
    *out = NULL;
    size_t W = mask_words(g);
    /* the chain: p, then the unique positions below, bottom last */
    size_t d = 0;
    int escape = 1;
    uint32_t cur = p;
    for (;;) {
        if (GROW(ws->chain, ws->chain_cap, d + 1) < 0)
            return ws_nomem(err);
        ws->chain[d++] = cur;
        uint32_t c = g->cont[g->el_rule[cur]];
        if (c == GCONT_BOTTOM) {
            escape = 0;
            break;
        }
        /* a chain cut short is still exact: it only escapes earlier */
        if (c == GCONT_MULTI || c == GCONT_NONE || d >= g->lim.max_depth)
            break;
        cur = c;
    }
    gcache_t *e = calloc(1, sizeof *e);
    if (!e)
        return ws_nomem(err);
    e->d = (uint32_t)d;
    e->escape = escape;
    e->chain = malloc(d * sizeof *e->chain);
    e->bits = calloc(W, sizeof *e->bits);
    if (!e->chain || !e->bits) {
        cache_free(e);
        return ws_nomem(err);
    }
    for (size_t i = 0; i < d; i++)
        e->chain[i] = ws->chain[d - 1 - i];
    wbase_t b = {e->chain, e->d, escape};
    uint32_t id0;
    ws->n_esc = 0;
    int rc = start_set(g, ws, &b, e->d, &id0, err);
    if (rc == 0)
        rc = walk(g, ws, &b, 0, id0, e->bits, 1, err);
    if (rc == 0 && ws->n_esc) {
        e->esc = malloc(ws->n_esc * sizeof *e->esc);
        if (!e->esc)
            rc = ws_nomem(err);
        else
            copy_words(e->esc, ws->esc, ws->n_esc);
        e->n_esc = (uint32_t)ws->n_esc;
    }
    if (rc) {
        cache_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* The table of position p, built on first use; NULL in *out when the
 * grammar's tables are full. */
static int cache_get(const core_grammar_t *gc, core_grammar_ws_t *ws, uint32_t p, gcache_t **out,
                     core_error_t *err)
{
    core_grammar_t *g = (core_grammar_t *)gc; /* the tables are the mutable part */
    gcache_t *e = atomic_load_explicit(&g->cache[p], memory_order_acquire);
    if (e) {
        *out = e;
        return 0;
    }
    *out = NULL;
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    e = atomic_load_explicit(&g->cache[p], memory_order_relaxed);
    size_t est = mask_words(g) * 8 + sizeof *e;
    if (!e && !g->cache_full && g->cache_bytes + est <= g->lim.max_cache) {
        rc = cache_build(g, ws, p, &e, err);
        if (rc == 0) {
            size_t bytes = est + ((size_t)e->d + e->n_esc) * 4;
            if (g->cache_bytes + bytes > g->lim.max_cache) {
                cache_free(e);
                e = NULL;
                g->cache_full = 1;
            } else {
                g->cache_bytes += bytes;
                atomic_store_explicit(&g->cache[p], e, memory_order_release);
            }
        }
    } else if (!e) {
        g->cache_full = 1;
    }
    pthread_mutex_unlock(&g->mu);
    *out = e;
    return rc;
}

/* ------------------------------------------------------------ states */

void core_grammar_state_clear(core_grammar_state_t *st)
{
    if (!st)
        return;
    free(st->buf);
    memset(st, 0, sizeof *st);
}

int core_grammar_state_copy(core_grammar_state_t *dst, const core_grammar_state_t *src,
                            core_error_t *err)
{
    uint32_t *b = malloc((src->len ? src->len : 1) * sizeof *b);
    if (!b)
        return core_error_set(err, CORE_ENOMEM, "grammar state copy");
    copy_words(b, src->buf, src->len);
    free(dst->buf);
    dst->g = src->g;
    dst->buf = b;
    dst->len = src->len;
    dst->cap = src->len ? src->len : 1;
    dst->n_stacks = src->n_stacks;
    return 0;
}

int core_grammar_state_accepting(const core_grammar_state_t *st)
{
    for (size_t o = 0; o < st->len; o += 1 + st->buf[o])
        if (st->buf[o] == 0)
            return 1;
    return 0;
}

int core_grammar_state_can_continue(const core_grammar_state_t *st)
{
    for (size_t o = 0; o < st->len; o += 1 + st->buf[o])
        if (st->buf[o] > 0)
            return 1;
    return 0;
}

/* Appends the stack base[0..nb) ++ own[0..n) to ws->acc (state layout:
 * depth, frames) unless it is there. count: stacks in acc. */
static int acc_add(const core_grammar_t *g, core_grammar_ws_t *ws, const uint32_t *base,
                   uint32_t nb, const uint32_t *own, uint32_t n, uint32_t *count, core_error_t *err)
{
    uint32_t d = nb + n;
    ws->effort += (uint64_t)*count * (1 + d / 32);
    for (size_t o = 0; o < ws->acc_len; o += 1 + ws->acc[o])
        if (ws->acc[o] == d && same_words(ws->acc + o + 1, base, nb) &&
            same_words(ws->acc + o + 1 + nb, own, n))
            return 0;
    if (*count >= g->lim.max_stacks)
        return core_error_set(err, CORE_ERANGE,
                              "the grammar is too ambiguous: more than %u parse stacks at once",
                              (unsigned)g->lim.max_stacks);
    if (GROW(ws->acc, ws->acc_cap, ws->acc_len + 1 + d) < 0)
        return ws_nomem(err);
    ws->acc[ws->acc_len] = d;
    copy_words(ws->acc + ws->acc_len + 1, base, nb);
    copy_words(ws->acc + ws->acc_len + 1 + nb, own, n);
    ws->acc_len += 1 + d;
    (*count)++;
    return 0;
}

/* Moves ws->acc (count stacks) into st. */
static int acc_commit(core_grammar_ws_t *ws, core_grammar_state_t *st, uint32_t count,
                      core_error_t *err)
{
    if (st->cap < ws->acc_len || !st->buf) {
        uint32_t *b = realloc(st->buf, (ws->acc_len ? ws->acc_len : 1) * sizeof *b);
        if (!b)
            return core_error_set(err, CORE_ENOMEM, "grammar state");
        st->buf = b;
        st->cap = ws->acc_len ? ws->acc_len : 1;
    }
    copy_words(st->buf, ws->acc, ws->acc_len);
    st->len = ws->acc_len;
    st->n_stacks = count;
    return 0;
}

/* The stacks of list l (over base b) into ws->acc. */
static int acc_list(const core_grammar_t *g, core_grammar_ws_t *ws, const wbase_t *b,
                    const wlist_t *l, uint32_t *count, core_error_t *err)
{
    for (size_t o = 0; o < l->len; o += 2 + l->w[o + 1]) {
        int rc = acc_add(g, ws, b->f, l->w[o], l->w + o + 2, l->w[o + 1], count, err);
        if (rc)
            return rc;
    }
    if (l->complete)
        return acc_add(g, ws, NULL, 0, NULL, 0, count, err);
    return 0;
}

int core_grammar_state_init(core_grammar_state_t *st, const core_grammar_t *g, core_error_t *err)
{
    memset(st, 0, sizeof *st);
    core_grammar_ws_t *ws = core_grammar_ws_new();
    if (!ws)
        return ws_nomem(err);
    wbase_t b = {NULL, 0, 0};
    uint32_t count = 0, f = g->start;
    wlist_reset(&ws->a);
    ws->acc_len = 0;
    int rc = closure(g, ws, &b, 0, &f, 1, &ws->a, err);
    if (rc == 0)
        rc = acc_list(g, ws, &b, &ws->a, &count, err);
    if (rc == 0)
        rc = acc_commit(ws, st, count, err);
    core_grammar_ws_free(ws);
    if (rc) {
        core_grammar_state_clear(st);
        return rc;
    }
    st->g = g;
    return 0;
}

int core_grammar_accept_bytes(core_grammar_state_t *st, core_grammar_ws_t *ws, const void *bytes,
                              size_t len, core_error_t *err)
{
    const core_grammar_t *g = st->g;
    const unsigned char *p = bytes;
    if (!g)
        return core_error_set(err, CORE_EINVAL, "grammar state is not initialized");
    if (len && !bytes)
        return core_error_set(err, CORE_EINVAL, "bytes are NULL");
    uint32_t count = 0;
    ws->acc_len = 0;
    for (size_t o = 0; o < st->len; o += 1 + st->buf[o]) {
        uint32_t D = st->buf[o];
        const uint32_t *F = st->buf + o + 1;
        wbase_t b = {F, D, 0};
        int rc;
        if (len == 0) {
            if ((rc = acc_add(g, ws, F, D, NULL, 0, &count, err)) != 0)
                return rc;
            continue;
        }
        if (D == 0)
            continue; /* complete: no byte can follow */
        /* ping-pong between ws->b (current) and ws->a (advance's output) */
        wlist_t *cur = &ws->b;
        wlist_reset(cur);
        if (GROW(cur->w, cur->cap, 2) < 0)
            return ws_nomem(err);
        cur->w[0] = D;
        cur->w[1] = 0;
        cur->len = 2;
        cur->n = 1;
        for (size_t i = 0; i < len && (cur->n || i == 0); i++) {
            ws->walk_steps = 0; /* one byte at a time: CLOSE_STEPS bounds each */
            if ((rc = advance(g, ws, &b, cur->w, cur->len, p[i], &ws->a, err)) != 0)
                return rc;
            wlist_t t = ws->a;
            ws->a = ws->b;
            ws->b = t;
            cur = &ws->b;
            if (!cur->n && i + 1 < len) {
                cur->complete = 0;
                break;
            }
        }
        if ((rc = acc_list(g, ws, &b, cur, &count, err)) != 0)
            return rc;
    }
    if (count == 0)
        return core_error_set(err, CORE_EINVAL, "the text cannot continue the grammar here");
    return acc_commit(ws, st, count, err);
}

int core_grammar_accept(core_grammar_state_t *st, core_grammar_ws_t *ws, int32_t token,
                        core_error_t *err)
{
    const core_grammar_t *g = st->g;
    if (!g || !g->vocab)
        return core_error_set(err, CORE_EINVAL, "the grammar has no vocabulary");
    const core_grammar_vocab_t *v = g->vocab;
    if (token < 0 || token >= v->n)
        return core_error_set(err, CORE_EINVAL, "token %d is not in the vocabulary", (int)token);
    switch (v->kind[token]) {
    case CORE_GRAMMAR_TOK_TEXT:
        return core_grammar_accept_bytes(st, ws, v->bytes + v->off[token],
                                         v->off[token + 1] - v->off[token], err);
    case CORE_GRAMMAR_TOK_END:
        if (!core_grammar_state_accepting(st))
            return core_error_set(err, CORE_EINVAL,
                                  "end of generation (token %d) where the grammar is not complete",
                                  (int)token);
        st->buf[0] = 0;
        st->len = 1;
        st->n_stacks = 1;
        return 0;
    default:
        return core_error_set(err, CORE_EINVAL, "token %d is never allowed under a grammar",
                              (int)token);
    }
}

/* ------------------------------------------------------------ the probe */

/* A state the probe reached: its stacks in the probe's arena, and the byte
 * and state it came from (to quote the text in a message). */
typedef struct pnode {
    size_t off, len;
    uint32_t n_stacks, hash;
    uint32_t parent; /* PNODE_NONE for the start */
    unsigned char byte;
} pnode_t;

#define PNODE_NONE 0xFFFFFFFFu
#define PROBE_QUOTE 32 /* bytes of text a probe's message quotes (the last ones) */

typedef struct probe {
    pnode_t *nodes;
    size_t n_nodes, cap_nodes;
    uint32_t *arena;
    size_t arena_len, arena_cap;
    uint32_t *ht; /* node index + 1, 0 = empty; [ht_cap], a power of two */
    size_t ht_cap;
} probe_t;

static void probe_free(probe_t *p)
{
    free(p->nodes);
    free(p->arena);
    free(p->ht);
}

/* Adds the state st as reached from parent by byte unless the probe has it;
 * *added tells which. */
static int probe_add(probe_t *p, const core_grammar_state_t *st, uint32_t parent, unsigned byte,
                     int *added, core_error_t *err)
{
    *added = 0;
    uint32_t h = hash_words(st->buf, st->len, st->n_stacks);
    if (2 * (p->n_nodes + 1) > p->ht_cap) {
        size_t nc = p->ht_cap ? 2 * p->ht_cap : 1024;
        uint32_t *t = calloc(nc, sizeof *t);
        if (!t)
            return core_error_set(err, CORE_ENOMEM, "grammar probe");
        for (size_t i = 0; i < p->n_nodes; i++) {
            size_t k = p->nodes[i].hash & (nc - 1);
            while (t[k])
                k = (k + 1) & (nc - 1);
            t[k] = (uint32_t)i + 1;
        }
        free(p->ht);
        p->ht = t;
        p->ht_cap = nc;
    }
    size_t k = h & (p->ht_cap - 1);
    for (; p->ht[k]; k = (k + 1) & (p->ht_cap - 1)) {
        const pnode_t *o = &p->nodes[p->ht[k] - 1];
        /* a node exists only with its words in the arena */
        if (o->hash == h && o->len == st->len && o->n_stacks == st->n_stacks &&
            (st->len == 0 || (p->arena && same_words(p->arena + o->off, st->buf, st->len))))
            return 0;
    }
    if (GROW(p->nodes, p->cap_nodes, p->n_nodes + 1) < 0 ||
        GROW(p->arena, p->arena_cap, p->arena_len + st->len + 1) < 0)
        return core_error_set(err, CORE_ENOMEM, "grammar probe");
    copy_words(p->arena + p->arena_len, st->buf, st->len);
    p->nodes[p->n_nodes] = (pnode_t){p->arena_len, st->len, st->n_stacks, h, parent,
                                     (unsigned char)byte};
    p->arena_len += st->len;
    p->ht[k] = (uint32_t)++p->n_nodes;
    *added = 1;
    return 0;
}

/* Appends to msg[cap] (holding a message) where the probe met it: the text
 * that leads there, its last PROBE_QUOTE bytes quoted. A message too long
 * for msg is cut by snprintf (core_error_t's buffer: its messages are short). */
static void probe_where(const probe_t *p, uint32_t node, int last, char *msg, size_t cap)
{
    unsigned char text[PROBE_QUOTE];
    size_t n = 0, total = 0;
    if (last >= 0) {
        text[n++] = (unsigned char)last;
        total++;
    }
    for (uint32_t i = node; i != PNODE_NONE && p->nodes[i].parent != PNODE_NONE;
         i = p->nodes[i].parent) {
        if (n < PROBE_QUOTE)
            text[n++] = p->nodes[i].byte;
        total++;
    }
    size_t len = strnlen(msg, cap);
    if (len + 1 >= cap)
        return;
    if (total == 0) {
        snprintf(msg + len, cap - len, " (at the start of the text)");
        return;
    }
    char q[PROBE_QUOTE * 4 + 4]; /* each byte at most 4 characters: \xHH */
    size_t k = 0;
    for (size_t i = n; i-- > 0;) {
        unsigned c = text[i];
        if (c == '"' || c == '\\') {
            q[k++] = '\\';
            q[k++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            q[k++] = (char)c;
        } else {
            static const char hex[] = "0123456789abcdef";
            q[k++] = '\\';
            q[k++] = 'x';
            q[k++] = hex[c >> 4];
            q[k++] = hex[c & 15];
        }
    }
    q[k] = '\0';
    snprintf(msg + len, cap - len, " (after the text \"%s%s\")", total > n ? "..." : "", q);
}

/* The bytes some stack of st can read next, split into classes that the
 * same stacks accept (bytes of a class lead to the same state). */
static uint32_t byte_classes(const core_grammar_t *g, const core_grammar_state_t *st,
                             gset_t cls[256])
{
    uint32_t n = 0;
    for (size_t o = 0; o < st->len; o += 1 + st->buf[o]) {
        uint32_t D = st->buf[o];
        if (D == 0)
            continue;
        const gset_t *s = &g->sets[g->el[st->buf[o + D]].arg];
        gset_t rest = *s; /* the bytes of s in no class yet */
        for (uint32_t c = 0, n0 = n; c < n0; c++) {
            gset_t in, out;
            int any_in = 0, any_out = 0;
            for (int w = 0; w < 4; w++) {
                in.w[w] = cls[c].w[w] & s->w[w];
                out.w[w] = cls[c].w[w] & ~s->w[w];
                rest.w[w] &= ~cls[c].w[w];
                any_in |= in.w[w] != 0;
                any_out |= out.w[w] != 0;
            }
            if (any_in && any_out) { /* split */
                cls[c] = in;
                cls[n++] = out;
            }
        }
        if (rest.w[0] | rest.w[1] | rest.w[2] | rest.w[3])
            cls[n++] = rest;
    }
    return n;
}

static unsigned lowest_byte(const gset_t *s)
{
    for (unsigned w = 0; w < 4; w++)
        if (s->w[w])
            return w * 64 + (unsigned)__builtin_ctzll(s->w[w]);
    return 0;
}

/* Explores the states the grammar's texts reach, breadth first from the
 * start, each distinct state once, every class of bytes from each, until
 * lim.max_probe states or PROBE_EFFORT of work: a bound the texts meet
 * (too many stacks, too deep, one byte opening too many paths) is found
 * here, when the grammar is compiled, with the text that meets it, rather
 * than while generating. What lies beyond the budget is not known; the
 * bounds still hold there and fail that generation. */
static int probe(const core_grammar_t *g, core_error_t *err)
{
    probe_t p = {0};
    core_grammar_ws_t *ws = core_grammar_ws_new();
    core_grammar_state_t st = {0}, next = {0};
    gset_t *cls = malloc(256 * sizeof *cls);
    int rc = 0;
    if (!ws || !cls) {
        rc = core_error_set(err, CORE_ENOMEM, "grammar probe");
        goto out;
    }
    int added;
    if ((rc = core_grammar_state_init(&st, g, err)) != 0) {
        if (rc == CORE_ERANGE)
            probe_where(&p, PNODE_NONE, -1, err->msg, sizeof err->msg);
        goto out;
    }
    if ((rc = probe_add(&p, &st, PNODE_NONE, 0, &added, err)) != 0)
        goto out;
    for (size_t i = 0; i < p.n_nodes && p.n_nodes < g->lim.max_probe &&
                       ws->effort < PROBE_EFFORT && p.arena_len < PROBE_WORDS;
         i++) {
        const pnode_t nd = p.nodes[i];
        core_grammar_state_clear(&st);
        st.g = g;
        st.buf = malloc((nd.len ? nd.len : 1) * sizeof *st.buf);
        if (!st.buf) {
            rc = core_error_set(err, CORE_ENOMEM, "grammar probe");
            goto out;
        }
        copy_words(st.buf, p.arena + nd.off, nd.len);
        st.len = st.cap = nd.len;
        st.n_stacks = nd.n_stacks;
        uint32_t nc = byte_classes(g, &st, cls);
        for (uint32_t c = 0; c < nc && p.n_nodes < g->lim.max_probe; c++) {
            unsigned char b = (unsigned char)lowest_byte(&cls[c]);
            if ((rc = core_grammar_state_copy(&next, &st, err)) != 0)
                goto out;
            rc = core_grammar_accept_bytes(&next, ws, &b, 1, err);
            if (rc == CORE_ERANGE) {
                probe_where(&p, (uint32_t)i, b, err->msg, sizeof err->msg);
                goto out;
            }
            if (rc == CORE_EINVAL) { /* cannot happen: b is read by some stack */
                rc = 0;
                continue;
            }
            if (rc || (rc = probe_add(&p, &next, (uint32_t)i, b, &added, err)) != 0)
                goto out;
        }
    }
out:
    core_grammar_state_clear(&st);
    core_grammar_state_clear(&next);
    core_grammar_ws_free(ws);
    free(cls);
    probe_free(&p);
    return rc;
}

/* ------------------------------------------------------------ masks */

/* The tokens stack F[0..D) accepts, ORed into bits. */
static int mask_stack(const core_grammar_t *g, core_grammar_ws_t *ws, const uint32_t *F, uint32_t D,
                      uint64_t *bits, core_error_t *err)
{
    gcache_t *e;
    int rc = cache_get(g, ws, F[D - 1], &e, err);
    if (rc)
        return rc;
    wbase_t b = {F, D, 0};
    uint32_t id;
    if (!e || e->d > D || (!e->escape && e->d != D) ||
        !same_words(F + (D - e->d), e->chain, e->d)) {
        /* no table (or a chain that does not fit): walk the whole trie */
        if ((rc = start_set(g, ws, &b, D, &id, err)) != 0)
            return rc;
        return walk(g, ws, &b, 0, id, bits, 0, err);
    }
    size_t W = mask_words(g);
    for (size_t i = 0; i < W; i++)
        bits[i] |= e->bits[i];
    if (e->n_esc == 0 || D == e->d)
        return 0;
    /* what lies under the chain, closed: the tokens below each escape node */
    if ((rc = start_set(g, ws, &b, D - e->d, &id, err)) != 0)
        return rc;
    if (ws->sets[id].n == 0)
        return 0;
    for (uint32_t i = 0; i < e->n_esc; i++)
        if ((rc = walk(g, ws, &b, e->esc[i], id, bits, 0, err)) != 0)
            return rc;
    return 0;
}

int core_grammar_mask(const core_grammar_state_t *st, core_grammar_ws_t *ws, uint64_t *allow,
                      int64_t V, core_error_t *err)
{
    const core_grammar_t *g = st->g;
    if (!g || !g->vocab)
        return core_error_set(err, CORE_EINVAL, "the grammar has no vocabulary");
    if (V <= 0 || V > CORE_TOK_MAX_VOCAB)
        return core_error_set(err, CORE_EINVAL, "mask of %lld tokens", (long long)V);
    const core_grammar_vocab_t *v = g->vocab;
    size_t W = mask_words(g);
    if (GROW(ws->bits, ws->bits_cap, W) < 0)
        return ws_nomem(err);
    memset(ws->bits, 0, W * sizeof *ws->bits);
    int accepting = 0;
    for (size_t o = 0; o < st->len; o += 1 + st->buf[o]) {
        uint32_t D = st->buf[o];
        if (D == 0) {
            accepting = 1;
            continue;
        }
        int rc = mask_stack(g, ws, st->buf + o + 1, D, ws->bits, err);
        if (rc)
            return rc;
    }
    if (accepting)
        for (uint32_t i = 0; i < v->n_ends; i++)
            set_bit(ws->bits, v->ends[i]);
    size_t WV = CORE_GRAMMAR_MASK_WORDS(V);
    for (size_t i = 0; i < WV; i++)
        allow[i] = i < W ? ws->bits[i] : 0;
    if (V % 64 && (size_t)(V / 64) < W)
        allow[WV - 1] &= (1ull << (V % 64)) - 1;
    return 0;
}
