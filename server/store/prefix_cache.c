/* server/store/prefix_cache.c — the prefix-state cache (see prefix_cache.h): a
 * chained hash table of entries keyed by digest, a doubly linked list in
 * use order for eviction, and the sorted set of key lengths the lookup
 * hashes a prompt at. */
#include "server/store/prefix_cache.h"
#include "server/store/prefix_cache_test.h"

#include "proto/proto.h"
#include "server/base/sha256.h"

#include <stdlib.h>
#include <string.h>

const char *srv_prefix_strerror(int code)
{
#define SRV_PREFIX_ERR_STR_(name, val, desc)                                                       \
    case name: return desc;
    switch (code) {
        SRV_PREFIX_ERRNO_MAP(SRV_PREFIX_ERR_STR_)
    default: return "unknown error";
    }
#undef SRV_PREFIX_ERR_STR_
}

struct srv_prefix_entry {
    uint8_t key[SRV_SHA256_BYTES]; /* the digest, cut to hash_bits */
    char id[SRV_PREFIX_ID_LEN + 1];
    int32_t *toks; /* [n], owned */
    size_t n;
    void *value; /* owned */
    size_t bytes;
    int pinned;
    uint64_t hits;
    int reused; /* srv_prefix_cache_note_reuse: evicted with the hit ones */
    srv_prefix_entry_t *newer, *older; /* use order; c->head is the newest */
    srv_prefix_entry_t *chain;         /* bucket */
};

typedef struct len_count {
    size_t len;   /* a key length */
    size_t count; /* entries with it */
} len_count_t;

struct srv_prefix_cache {
    srv_prefix_cache_opts_t o; /* o.ns points at ns */
    uint8_t *ns;
    srv_sha256_ctx_t base; /* after the namespace */
    srv_prefix_entry_t **buckets; /* [nb], nb a power of two */
    size_t nb;
    srv_prefix_entry_t *head, *tail;
    len_count_t *lens; /* [n_lens] ascending by len */
    size_t n_lens, cap_lens;
    srv_prefix_cache_stats_t st; /* st.reserved: srv_prefix_cache_reserve's */
};

enum { INITIAL_BUCKETS = 64 };

/* ---- digests ---- */

static void finish_key(const srv_prefix_cache_t *c, srv_sha256_ctx_t *h, uint8_t full[32],
                       uint8_t key[32])
{
    srv_sha256_final(h, full);
    memcpy(key, full, SRV_SHA256_BYTES);
    const int bits = c->o.hash_bits;
    if (bits == 0 || bits >= 256)
        return;
    key[bits / 8] &= (uint8_t)(0xff00u >> (bits % 8));
    for (int i = bits / 8 + 1; i < SRV_SHA256_BYTES; i++)
        key[i] = 0;
}

static size_t bucket_of(const uint8_t key[32], size_t nb)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | key[i];
    return (size_t)(v & (nb - 1));
}

static srv_prefix_entry_t *bucket_find(const srv_prefix_cache_t *c, const uint8_t key[32],
                                       const int32_t *toks, size_t n)
{
    for (srv_prefix_entry_t *e = c->buckets[bucket_of(key, c->nb)]; e; e = e->chain)
        if (e->n == n && memcmp(e->key, key, sizeof e->key) == 0 &&
            memcmp(e->toks, toks, n * sizeof *toks) == 0)
            return e;
    return NULL;
}

/* ---- lists ---- */

static void lru_unlink(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    if (e->newer)
        e->newer->older = e->older;
    else
        c->head = e->older;
    if (e->older)
        e->older->newer = e->newer;
    else
        c->tail = e->newer;
    e->newer = e->older = NULL;
}

static void lru_push_head(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    e->newer = NULL;
    e->older = c->head;
    if (c->head)
        c->head->newer = e;
    else
        c->tail = e;
    c->head = e;
}

static int lens_add(srv_prefix_cache_t *c, size_t len)
{
    size_t i = 0;
    while (i < c->n_lens && c->lens[i].len < len)
        i++;
    if (i < c->n_lens && c->lens[i].len == len) {
        c->lens[i].count++;
        return 0;
    }
    if (c->n_lens == c->cap_lens) {
        size_t cap = c->cap_lens ? 2 * c->cap_lens : 16;
        len_count_t *p = realloc(c->lens, cap * sizeof *p);
        if (!p)
            return -1;
        c->lens = p;
        c->cap_lens = cap;
    }
    memmove(c->lens + i + 1, c->lens + i, (c->n_lens - i) * sizeof *c->lens);
    c->lens[i] = (len_count_t){len, 1};
    c->n_lens++;
    return 0;
}

static void lens_drop(srv_prefix_cache_t *c, size_t len)
{
    for (size_t i = 0; i < c->n_lens; i++) {
        if (c->lens[i].len != len)
            continue;
        if (--c->lens[i].count == 0) {
            memmove(c->lens + i, c->lens + i + 1, (c->n_lens - i - 1) * sizeof *c->lens);
            c->n_lens--;
        }
        return;
    }
}

/* Doubles the table when it holds more entries than buckets (no-op when
 * memory is short: chains only get longer). */
static void maybe_grow(srv_prefix_cache_t *c)
{
    if (c->st.entries <= c->nb)
        return;
    size_t nb = 2 * c->nb;
    /* arrays of entry pointers: sizeof *b is a pointer's size on purpose */
    srv_prefix_entry_t **b = calloc(nb, sizeof *b); /* NOLINT(bugprone-sizeof-expression) */
    if (!b)
        return;
    for (size_t i = 0; i < c->nb; i++) {
        for (srv_prefix_entry_t *e = c->buckets[i], *nx; e; e = nx) {
            nx = e->chain;
            size_t k = bucket_of(e->key, nb);
            e->chain = b[k];
            b[k] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nb = nb;
}

static void entry_free(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    if (c->o.free_value)
        c->o.free_value(e->value);
    else
        free(e->value);
    free(e->toks);
    free(e);
}

/* ---- the cache ---- */

int srv_prefix_cache_new(const srv_prefix_cache_opts_t *opts, srv_prefix_cache_t **out)
{
    *out = NULL;
    if (!opts || opts->hash_bits < 0 || opts->hash_bits > 256 || (opts->ns_len && !opts->ns))
        return SRV_PREFIX_EINVAL;
    srv_prefix_cache_t *c = calloc(1, sizeof *c);
    if (!c)
        return SRV_PREFIX_ENOMEM;
    c->o = *opts;
    c->nb = INITIAL_BUCKETS;
    c->buckets = calloc(c->nb, sizeof *c->buckets); /* NOLINT(bugprone-sizeof-expression) */
    c->ns = malloc(opts->ns_len ? opts->ns_len : 1);
    if (!c->buckets || !c->ns) {
        srv_prefix_cache_free(c);
        return SRV_PREFIX_ENOMEM;
    }
    if (opts->ns_len)
        memcpy(c->ns, opts->ns, opts->ns_len);
    c->o.ns = c->ns;
    srv_sha256_init(&c->base);
    srv_sha256_update(&c->base, c->ns, c->o.ns_len);
    *out = c;
    return 0;
}

void srv_prefix_cache_free(srv_prefix_cache_t *c)
{
    if (!c)
        return;
    for (srv_prefix_entry_t *e = c->head, *nx; e; e = nx) {
        nx = e->older;
        entry_free(c, e);
    }
    free(c->buckets);
    free(c->lens);
    free(c->ns);
    free(c);
}

srv_prefix_entry_t *srv_prefix_cache_lookup(srv_prefix_cache_t *c, const int32_t *toks, size_t n,
                                            size_t max_len)
{
    const size_t lim = n < max_len ? n : max_len;
    srv_sha256_ctx_t h = c->base;
    size_t hashed = 0;
    srv_prefix_entry_t *best = NULL;
    for (size_t i = 0; i < c->n_lens && c->lens[i].len <= lim; i++) {
        const size_t len = c->lens[i].len;
        srv_sha256_update(&h, toks + hashed, (len - hashed) * sizeof *toks);
        hashed = len;
        srv_sha256_ctx_t fin = h; /* the hash of toks[0..len); h goes on */
        uint8_t full[SRV_SHA256_BYTES], key[SRV_SHA256_BYTES];
        finish_key(c, &fin, full, key);
        srv_prefix_entry_t *e = bucket_find(c, key, toks, len);
        if (e)
            best = e;
    }
    if (!best) {
        c->st.misses++;
        return NULL;
    }
    c->st.hits++;
    best->hits++;
    srv_prefix_cache_touch(c, best);
    return best;
}

srv_prefix_entry_t *srv_prefix_cache_find(srv_prefix_cache_t *c, const int32_t *toks, size_t n)
{
    if (n == 0)
        return NULL;
    srv_sha256_ctx_t h = c->base;
    srv_sha256_update(&h, toks, n * sizeof *toks);
    uint8_t full[SRV_SHA256_BYTES], key[SRV_SHA256_BYTES];
    finish_key(c, &h, full, key);
    return bucket_find(c, key, toks, n);
}

srv_prefix_entry_t *srv_prefix_cache_get(srv_prefix_cache_t *c, const char *id)
{
    for (srv_prefix_entry_t *e = c->head; e; e = e->older)
        if (strcmp(e->id, id) == 0)
            return e;
    return NULL;
}

void srv_prefix_cache_touch(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    lru_unlink(c, e);
    lru_push_head(c, e);
}

static void unlink_entry(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    srv_prefix_entry_t **pp = &c->buckets[bucket_of(e->key, c->nb)];
    while (*pp != e)
        pp = &(*pp)->chain;
    *pp = e->chain;
    lru_unlink(c, e);
    lens_drop(c, e->n);
    c->st.entries--;
    c->st.bytes -= e->bytes;
    if (e->pinned) {
        c->st.pinned--;
        c->st.pinned_bytes -= e->bytes;
    }
}

void srv_prefix_cache_remove(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    unlink_entry(c, e);
    entry_free(c, e);
}

/* Evicts unpinned entries until the entries, the reservations and bytes
 * more fit the budget, or only pinned ones are left (the callers have
 * checked that the pinned ones, the reservations and bytes fit): first
 * those never hit, oldest first, then the others, oldest first. A prefix
 * that was reused (a shared system prompt) thus outlives any number of
 * one-off conversations passing through. */
static int reused(const srv_prefix_entry_t *e)
{
    return e->hits > 0 || e->reused;
}

/* passes: 1 evicts only entries never hit, 2 the others after them. */
static void evict_for(srv_prefix_cache_t *c, size_t bytes, int passes)
{
    for (int pass = 0; pass < passes; pass++) {
        srv_prefix_entry_t *v = c->tail;
        while (v && (c->st.bytes + c->st.reserved > c->o.budget ||
                     c->st.bytes + c->st.reserved > c->o.budget - bytes)) {
            srv_prefix_entry_t *newer = v->newer;
            if (!v->pinned && (pass == 1 || !reused(v))) {
                srv_prefix_cache_remove(c, v);
                c->st.evictions++;
            }
            v = newer;
        }
    }
}

int srv_prefix_cache_insert(srv_prefix_cache_t *c, const int32_t *toks, size_t n, void *value,
                            size_t bytes, int pinned, srv_prefix_entry_t **out)
{
    if (out)
        *out = NULL;
    if (!c || !toks || n == 0)
        return SRV_PREFIX_EINVAL;
    srv_sha256_ctx_t h = c->base;
    srv_sha256_update(&h, toks, n * sizeof *toks);
    uint8_t full[SRV_SHA256_BYTES], key[SRV_SHA256_BYTES];
    finish_key(c, &h, full, key);
    srv_prefix_entry_t *old = bucket_find(c, key, toks, n);
    if (old) {
        if (out)
            *out = old;
        return SRV_PREFIX_EEXIST;
    }
    if (pinned && c->st.pinned >= c->o.max_pinned)
        return SRV_PREFIX_EPINNED;
    if (bytes > c->o.budget || c->st.pinned_bytes > c->o.budget - bytes)
        return SRV_PREFIX_ETOOBIG;
    srv_prefix_entry_t *e = calloc(1, sizeof *e);
    if (e)
        e->toks = malloc(n * sizeof *toks);
    if (!e || !e->toks || lens_add(c, n) < 0) {
        if (e)
            free(e->toks);
        free(e);
        return SRV_PREFIX_ENOMEM;
    }
    evict_for(c, bytes, 2);
    memcpy(e->key, key, sizeof e->key);
    memcpy(e->id, "pfx_", 5);
    proto_hex_format(full, (SRV_PREFIX_ID_LEN - 4) / 2, e->id + 4); /* over the NUL, and one */
    memcpy(e->toks, toks, n * sizeof *toks);
    e->n = n;
    e->value = value;
    e->bytes = bytes;
    e->pinned = pinned != 0;
    size_t b = bucket_of(key, c->nb);
    e->chain = c->buckets[b];
    c->buckets[b] = e;
    lru_push_head(c, e);
    c->st.entries++;
    c->st.bytes += bytes;
    c->st.inserts++;
    if (e->pinned) {
        c->st.pinned++;
        c->st.pinned_bytes += bytes;
    }
    maybe_grow(c);
    if (out)
        *out = e;
    return 0;
}

void srv_prefix_cache_note_reuse(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    (void)c;
    e->reused = 1;
}

int srv_prefix_cache_reserve(srv_prefix_cache_t *c, size_t bytes)
{
    if (!c || bytes > c->o.budget)
        return SRV_PREFIX_ETOOBIG;
    /* only what no request has used may go for a copy not made yet */
    size_t kept = c->st.reserved;
    for (const srv_prefix_entry_t *v = c->head; v; v = v->older)
        if (v->pinned || reused(v))
            kept += v->bytes;
    if (kept > c->o.budget - bytes)
        return SRV_PREFIX_ETOOBIG;
    evict_for(c, bytes, 1);
    c->st.reserved += bytes;
    return 0;
}

void srv_prefix_cache_release(srv_prefix_cache_t *c, size_t bytes)
{
    if (c)
        c->st.reserved -= bytes < c->st.reserved ? bytes : c->st.reserved;
}

int srv_prefix_cache_pin(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    if (e->pinned)
        return 0;
    if (c->st.pinned >= c->o.max_pinned)
        return SRV_PREFIX_EPINNED;
    if (c->st.pinned_bytes + e->bytes > c->o.budget)
        return SRV_PREFIX_ETOOBIG;
    e->pinned = 1;
    c->st.pinned++;
    c->st.pinned_bytes += e->bytes;
    return 0;
}

void srv_prefix_cache_unpin(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    if (!e->pinned)
        return;
    e->pinned = 0;
    c->st.pinned--;
    c->st.pinned_bytes -= e->bytes;
    srv_prefix_cache_touch(c, e);
}

void srv_prefix_cache_stats(const srv_prefix_cache_t *c, srv_prefix_cache_stats_t *out)
{
    *out = c->st;
}

srv_prefix_entry_t *srv_prefix_cache_next(srv_prefix_cache_t *c, srv_prefix_entry_t *e)
{
    return e ? e->older : c->head;
}

const char *srv_prefix_entry_id(const srv_prefix_entry_t *e)
{
    return e->id;
}

const int32_t *srv_prefix_entry_tokens(const srv_prefix_entry_t *e, size_t *n)
{
    if (n)
        *n = e->n;
    return e->toks;
}

void *srv_prefix_entry_value(const srv_prefix_entry_t *e)
{
    return e->value;
}

size_t srv_prefix_entry_bytes(const srv_prefix_entry_t *e)
{
    return e->bytes;
}

int srv_prefix_entry_pinned(const srv_prefix_entry_t *e)
{
    return e->pinned;
}

uint64_t srv_prefix_entry_hits(const srv_prefix_entry_t *e)
{
    return e->hits;
}
