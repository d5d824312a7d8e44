/* test_srv_prefix_cache.c — the prefix-state cache structure
 * (server/store/prefix_cache.h): longest-prefix lookup, LRU order and the byte
 * bound, pinning and its bounds, and keys that collide in the digest
 * (hash_bits cut to a few bits) told apart by their full token lists. */
#include "server/store/prefix_cache.h"
#include "server/store/prefix_cache_test.h"
#include "tests/unit/check.h"

#include <stdlib.h>

/* Values are counted allocations, so the tests see every free. */
static int live_values;

static void free_value(void *v)
{
    if (v)
        live_values--;
    free(v);
}

static void *value(void)
{
    live_values++;
    return malloc(1);
}

static srv_prefix_cache_t *cache(size_t budget, size_t max_pinned, int hash_bits)
{
    srv_prefix_cache_opts_t o = {.budget = budget, .max_pinned = max_pinned, .ns = "model+attn",
                                 .ns_len = 10, .free_value = free_value,
                                 .hash_bits = hash_bits};
    srv_prefix_cache_t *c = NULL;
    CHECK_INT_EQ(srv_prefix_cache_new(&o, &c), 0);
    return c;
}

/* toks[i] = base + i */
static void seq(int32_t *t, size_t n, int32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

static int insert(srv_prefix_cache_t *c, const int32_t *t, size_t n, size_t bytes, int pinned)
{
    void *v = value();
    int rc = srv_prefix_cache_insert(c, t, n, v, bytes, pinned, NULL);
    if (rc < 0)
        free_value(v);
    return rc;
}

TEST(test_longest_prefix)
{
    srv_prefix_cache_t *c = cache(1000, 4, 0);
    int32_t p[64];
    seq(p, 64, 100);
    CHECK_INT_EQ(insert(c, p, 8, 10, 0), 0);
    CHECK_INT_EQ(insert(c, p, 32, 10, 0), 0);
    CHECK_INT_EQ(insert(c, p, 16, 10, 0), 0);
    size_t n = 0;
    srv_prefix_entry_t *e = srv_prefix_cache_lookup(c, p, 64, 64);
    CHECK(e && (srv_prefix_entry_tokens(e, &n), n == 32));
    /* max_len bounds the match: the 32-token entry is too long */
    e = srv_prefix_cache_lookup(c, p, 64, 31);
    CHECK(e && (srv_prefix_entry_tokens(e, &n), n == 16));
    /* a prompt exactly as long as an entry may use it when max_len allows */
    e = srv_prefix_cache_lookup(c, p, 16, 16);
    CHECK(e && (srv_prefix_entry_tokens(e, &n), n == 16));
    /* a prompt that differs inside the 16-token prefix matches only 8 */
    int32_t q[64];
    seq(q, 64, 100);
    q[12] = 7;
    e = srv_prefix_cache_lookup(c, q, 64, 64);
    CHECK(e && (srv_prefix_entry_tokens(e, &n), n == 8));
    q[0] = 7;
    CHECK(srv_prefix_cache_lookup(c, q, 64, 64) == NULL);
    CHECK(srv_prefix_cache_lookup(c, p, 7, 64) == NULL);
    srv_prefix_cache_stats_t st;
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.hits, 4);
    CHECK_INT_EQ(st.misses, 2);
    CHECK_INT_EQ(st.entries, 3);
    CHECK_INT_EQ(st.bytes, 30);
    /* exact find and the id round trip */
    e = srv_prefix_cache_find(c, p, 16);
    CHECK(e != NULL);
    CHECK(srv_prefix_cache_find(c, p, 17) == NULL);
    CHECK(e && srv_prefix_cache_get(c, srv_prefix_entry_id(e)) == e);
    CHECK(e && strlen(srv_prefix_entry_id(e)) == SRV_PREFIX_ID_LEN &&
          strncmp(srv_prefix_entry_id(e), "pfx_", 4) == 0);
    CHECK(srv_prefix_cache_get(c, "pfx_000000000000000000000000") == NULL);
    /* the same tokens again: EEXIST with the entry, value not taken */
    srv_prefix_entry_t *old = NULL;
    void *v = value();
    CHECK_INT_EQ(srv_prefix_cache_insert(c, p, 16, v, 10, 0, &old), SRV_PREFIX_EEXIST);
    CHECK(old == e);
    free_value(v);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

/* The namespace is part of the key: the same tokens under another
 * namespace hash differently (the ids differ). */
TEST(test_namespace)
{
    srv_prefix_cache_t *a = cache(100, 1, 0);
    srv_prefix_cache_opts_t o = {.budget = 100, .max_pinned = 1, .ns = "other", .ns_len = 5,
                                 .free_value = free_value};
    srv_prefix_cache_t *b = NULL;
    CHECK_INT_EQ(srv_prefix_cache_new(&o, &b), 0);
    int32_t p[4];
    seq(p, 4, 1);
    srv_prefix_entry_t *ea = NULL, *eb = NULL;
    void *va = value(), *vb = value();
    CHECK_INT_EQ(srv_prefix_cache_insert(a, p, 4, va, 1, 0, &ea), 0);
    CHECK_INT_EQ(srv_prefix_cache_insert(b, p, 4, vb, 1, 0, &eb), 0);
    CHECK(ea && eb && strcmp(srv_prefix_entry_id(ea), srv_prefix_entry_id(eb)) != 0);
    srv_prefix_cache_free(a);
    srv_prefix_cache_free(b);
    CHECK_INT_EQ(live_values, 0);
}

TEST(test_lru_and_budget)
{
    srv_prefix_cache_t *c = cache(100, 4, 0);
    int32_t a[4], b[4], d[4], e4[4];
    seq(a, 4, 10);
    seq(b, 4, 20);
    seq(d, 4, 30);
    seq(e4, 4, 40);
    CHECK_INT_EQ(insert(c, a, 4, 40, 0), 0);
    CHECK_INT_EQ(insert(c, b, 4, 40, 0), 0);
    /* a used: b is now the least recently used */
    CHECK(srv_prefix_cache_lookup(c, a, 4, 4) != NULL);
    CHECK_INT_EQ(insert(c, d, 4, 40, 0), 0); /* 120 > 100: b goes */
    CHECK(srv_prefix_cache_find(c, b, 4) == NULL);
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK(srv_prefix_cache_find(c, d, 4) != NULL);
    srv_prefix_cache_stats_t st;
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.evictions, 1);
    CHECK_INT_EQ(st.bytes, 80);
    CHECK(st.bytes <= 100);
    /* iteration is most recent first: d, a */
    srv_prefix_entry_t *it = srv_prefix_cache_next(c, NULL);
    CHECK(it == srv_prefix_cache_find(c, d, 4));
    it = it ? srv_prefix_cache_next(c, it) : NULL;
    CHECK(it == srv_prefix_cache_find(c, a, 4));
    CHECK(it && srv_prefix_cache_next(c, it) == NULL);
    /* one entry that needs the whole budget evicts both */
    CHECK_INT_EQ(insert(c, e4, 4, 100, 0), 0);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.entries, 1);
    CHECK_INT_EQ(st.evictions, 3);
    /* larger than the budget: refused, nothing evicted */
    CHECK_INT_EQ(insert(c, a, 4, 101, 0), SRV_PREFIX_ETOOBIG);
    CHECK(srv_prefix_cache_find(c, e4, 4) != NULL);
    /* the lookup no longer finds evicted prefixes */
    CHECK(srv_prefix_cache_lookup(c, b, 4, 4) == NULL);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

/* Reservations count against the budget: reserving evicts the least
 * recently used unpinned entries, inserts keep room for what is reserved,
 * a reservation the pinned entries leave no room for is refused with
 * nothing evicted, and release gives the room back. */
/* An entry that was hit (or marked reused) outlives newer entries never hit. */
TEST(test_hit_entries_evicted_last)
{
    srv_prefix_cache_t *c = cache(100, 4, 0);
    int32_t a[4], b[4], d[4], e4[4];
    seq(a, 4, 10);
    seq(b, 4, 20);
    seq(d, 4, 30);
    seq(e4, 4, 40);
    CHECK_INT_EQ(insert(c, a, 4, 40, 0), 0);
    CHECK(srv_prefix_cache_lookup(c, a, 4, 4) != NULL); /* a: one hit */
    CHECK_INT_EQ(insert(c, b, 4, 40, 0), 0);
    CHECK_INT_EQ(insert(c, d, 4, 40, 0), 0); /* b (never hit) goes, not a (older) */
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK(srv_prefix_cache_find(c, b, 4) == NULL);
    CHECK_INT_EQ(insert(c, e4, 4, 40, 0), 0); /* d goes */
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK(srv_prefix_cache_find(c, d, 4) == NULL);
    /* when only hit entries are left, the oldest of them goes; an entry
     * marked reused (wanted by requests in flight) counts as hit */
    srv_prefix_entry_t *ee = srv_prefix_cache_find(c, e4, 4);
    CHECK(ee != NULL);
    if (ee)
        srv_prefix_cache_note_reuse(c, ee);
    CHECK_INT_EQ(insert(c, b, 4, 40, 0), 0);
    CHECK(srv_prefix_cache_find(c, a, 4) == NULL);
    CHECK(srv_prefix_cache_find(c, e4, 4) != NULL);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

TEST(test_reservations)
{
    srv_prefix_cache_t *c = cache(100, 4, 0);
    int32_t a[4], b[4], d[4], p[4];
    seq(a, 4, 10);
    seq(b, 4, 20);
    seq(d, 4, 30);
    seq(p, 4, 50);
    CHECK_INT_EQ(insert(c, a, 4, 30, 0), 0);
    CHECK_INT_EQ(insert(c, b, 4, 30, 0), 0);
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 30), 0); /* 90: nothing goes */
    srv_prefix_cache_stats_t st;
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.reserved, 30);
    CHECK_INT_EQ(st.entries, 2);
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 30), 0); /* 120: a, the oldest, goes */
    CHECK(srv_prefix_cache_find(c, a, 4) == NULL);
    CHECK(srv_prefix_cache_find(c, b, 4) != NULL);
    /* an insert keeps room for the 60 reserved: b goes */
    CHECK_INT_EQ(insert(c, d, 4, 30, 0), 0);
    CHECK(srv_prefix_cache_find(c, b, 4) == NULL);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.bytes, 30);
    CHECK_INT_EQ(st.evictions, 2);
    /* released, a reservation's insert fits beside d */
    srv_prefix_cache_release(c, 30);
    CHECK_INT_EQ(insert(c, a, 4, 30, 0), 0);
    CHECK(srv_prefix_cache_find(c, d, 4) != NULL);
    /* pinned 30 + reserved 30 + 50 > 100: refused, nothing evicted */
    srv_prefix_entry_t *pe = NULL;
    void *v = value();
    CHECK_INT_EQ(srv_prefix_cache_insert(c, p, 4, v, 30, 1, &pe), 0);
    srv_prefix_cache_stats(c, &st);
    const uint64_t ev = st.evictions;
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 50), SRV_PREFIX_ETOOBIG);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.evictions, ev);
    CHECK_INT_EQ(st.reserved, 30);
    /* 40 fits once the unpinned go: a and d */
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 40), 0);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.entries, 1);
    CHECK_INT_EQ(st.reserved, 70);
    /* releasing more than is reserved leaves 0 */
    srv_prefix_cache_release(c, 1000);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.reserved, 0);
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 101), SRV_PREFIX_ETOOBIG);
    /* a reservation never evicts an entry that was hit: pinned p 30, hit a
     * 30, 50 more does not fit without a: refused, a stays */
    CHECK_INT_EQ(insert(c, a, 4, 30, 0), 0);
    CHECK(srv_prefix_cache_lookup(c, a, 4, 4) != NULL);
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 50), SRV_PREFIX_ETOOBIG);
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK_INT_EQ(srv_prefix_cache_reserve(c, 40), 0);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

TEST(test_pinning)
{
    srv_prefix_cache_t *c = cache(100, 2, 0);
    int32_t a[4], b[4], d[4], x[4];
    seq(a, 4, 10);
    seq(b, 4, 20);
    seq(d, 4, 30);
    seq(x, 4, 50);
    CHECK_INT_EQ(insert(c, a, 4, 30, 1), 0);
    CHECK_INT_EQ(insert(c, b, 4, 30, 0), 0);
    CHECK_INT_EQ(insert(c, d, 4, 30, 0), 0);
    /* 40 more: b (oldest unpinned) goes, the older pinned a stays */
    CHECK_INT_EQ(insert(c, x, 4, 40, 0), 0);
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK(srv_prefix_cache_find(c, b, 4) == NULL);
    /* unpinned entries never crowd out pinned ones: 71 does not fit next to
     * the 30 pinned bytes, 70 does (and evicts every unpinned entry) */
    CHECK_INT_EQ(insert(c, b, 4, 71, 0), SRV_PREFIX_ETOOBIG);
    CHECK_INT_EQ(insert(c, b, 4, 70, 0), 0);
    CHECK(srv_prefix_cache_find(c, a, 4) != NULL);
    CHECK(srv_prefix_cache_find(c, d, 4) == NULL);
    srv_prefix_cache_stats_t st;
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.pinned, 1);
    CHECK_INT_EQ(st.pinned_bytes, 30);
    CHECK_INT_EQ(st.bytes, 100);
    /* pinning b (70) would take the pinned bytes to 100: allowed; a second
     * pin past the count (max 2) is refused */
    srv_prefix_entry_t *eb = srv_prefix_cache_find(c, b, 4);
    CHECK(eb && srv_prefix_cache_pin(c, eb) == 0);
    CHECK_INT_EQ(insert(c, x, 4, 1, 1), SRV_PREFIX_EPINNED);
    /* everything is pinned: an unpinned insert cannot make room */
    CHECK_INT_EQ(insert(c, x, 4, 1, 0), SRV_PREFIX_ETOOBIG);
    /* unpin b: it becomes evictable again */
    srv_prefix_cache_unpin(c, eb);
    CHECK_INT_EQ(insert(c, x, 4, 50, 0), 0);
    CHECK(srv_prefix_cache_find(c, b, 4) == NULL);
    /* a pin that would pass the budget in bytes */
    srv_prefix_entry_t *ex = srv_prefix_cache_find(c, x, 4);
    CHECK(ex && srv_prefix_cache_pin(c, ex) == 0); /* 30 + 50 */
    CHECK_INT_EQ(insert(c, d, 4, 21, 1), SRV_PREFIX_EPINNED);
    srv_prefix_cache_unpin(c, ex);
    CHECK_INT_EQ(insert(c, d, 4, 71, 1), SRV_PREFIX_ETOOBIG);
    CHECK_INT_EQ(insert(c, d, 4, 70, 1), 0); /* evicts x */
    CHECK(srv_prefix_cache_find(c, x, 4) == NULL);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.pinned, 2);
    CHECK_INT_EQ(st.pinned_bytes, 100);
    /* remove drops a pinned entry and its count */
    srv_prefix_entry_t *ea = srv_prefix_cache_find(c, a, 4);
    if (ea)
        srv_prefix_cache_remove(c, ea);
    srv_prefix_cache_stats(c, &st);
    CHECK_INT_EQ(st.pinned, 1);
    CHECK_INT_EQ(st.bytes, 70);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

/* A budget of 0 (the cache disabled) refuses every insert. */
TEST(test_zero_budget)
{
    srv_prefix_cache_t *c = cache(0, 4, 0);
    int32_t a[2] = {1, 2};
    CHECK_INT_EQ(insert(c, a, 2, 1, 0), SRV_PREFIX_ETOOBIG);
    CHECK_INT_EQ(insert(c, a, 2, 1, 1), SRV_PREFIX_ETOOBIG);
    CHECK(srv_prefix_cache_lookup(c, a, 2, 2) == NULL);
    srv_prefix_cache_free(c);
    CHECK_INT_EQ(live_values, 0);
}

/* With 1 or 0 bits of digest kept, keys collide all the time: lookups
 * still return the entry whose tokens match, never a colliding one. */
TEST(test_collisions)
{
    for (int bits = 0; bits <= 2; bits++) {
        srv_prefix_cache_t *c = cache(1u << 20, 4, bits == 0 ? 1 : bits);
        enum { N = 200 };
        int32_t t[N][6];
        for (int i = 0; i < N; i++) {
            seq(t[i], 6, 1000);
            t[i][5] = i; /* same first five tokens, last differs */
            CHECK_INT_EQ(insert(c, t[i], 6, 1, 0), 0);
        }
        /* prefixes of 5 tokens collide with every 6-token key in bucket and
         * digest but differ in length */
        int32_t five[5];
        seq(five, 5, 1000);
        CHECK(srv_prefix_cache_find(c, five, 5) == NULL);
        for (int i = 0; i < N; i += 17) {
            int32_t q[8];
            memcpy(q, t[i], sizeof t[i]);
            q[6] = 1;
            q[7] = 2;
            size_t n = 0;
            srv_prefix_entry_t *e = srv_prefix_cache_lookup(c, q, 8, 8);
            const int32_t *k = e ? srv_prefix_entry_tokens(e, &n) : NULL;
            CHECK_MSG(k && n == 6 && k[5] == i, "bits %d key %d", bits, i);
        }
        /* the ids come from the full digest: distinct despite collisions */
        srv_prefix_entry_t *e0 = srv_prefix_cache_find(c, t[0], 6);
        srv_prefix_entry_t *e1 = srv_prefix_cache_find(c, t[1], 6);
        CHECK(e0 && e1 && strcmp(srv_prefix_entry_id(e0), srv_prefix_entry_id(e1)) != 0);
        CHECK(e1 && srv_prefix_cache_get(c, srv_prefix_entry_id(e1)) == e1);
        /* removing one leaves the others findable (the chain is intact) */
        if (e0)
            srv_prefix_cache_remove(c, e0);
        CHECK(srv_prefix_cache_find(c, t[0], 6) == NULL);
        CHECK(srv_prefix_cache_find(c, t[N - 1], 6) != NULL);
        CHECK(srv_prefix_cache_find(c, t[1], 6) == e1);
        srv_prefix_cache_free(c);
    }
    CHECK_INT_EQ(live_values, 0);
}

TEST(test_bad_args)
{
    srv_prefix_cache_t *c = NULL;
    srv_prefix_cache_opts_t o = {.budget = 1, .hash_bits = 257};
    CHECK_INT_EQ(srv_prefix_cache_new(&o, &c), SRV_PREFIX_EINVAL);
    CHECK(c == NULL);
    CHECK_INT_EQ(srv_prefix_cache_new(NULL, &c), SRV_PREFIX_EINVAL);
    c = cache(10, 1, 0);
    int32_t a[1] = {1};
    CHECK_INT_EQ(srv_prefix_cache_insert(c, a, 0, NULL, 1, 0, NULL), SRV_PREFIX_EINVAL);
    CHECK(strcmp(srv_prefix_strerror(SRV_PREFIX_ETOOBIG), "unknown error") != 0);
    srv_prefix_cache_free(c);
    srv_prefix_cache_free(NULL);
}

int main(void)
{
    RUN(test_longest_prefix);
    RUN(test_namespace);
    RUN(test_lru_and_budget);
    RUN(test_hit_entries_evicted_last);
    RUN(test_reservations);
    RUN(test_pinning);
    RUN(test_zero_budget);
    RUN(test_collisions);
    RUN(test_bad_args);
    return CHECK_DONE();
}
