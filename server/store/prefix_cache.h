/* server/store/prefix_cache.h — the prefix-state cache: values (the attention
 * state after a token prefix) kept under the prefix's tokens, bounded by
 * bytes with least-recently-used eviction, and pinned entries that are never
 * evicted.
 *
 * Knows nothing of models, states or HTTP: a value is an opaque pointer
 * with a size in bytes and a free function given at creation
 * (server/api/api_prefix.c stores core_attn_state_t copies and counts
 * core_attn_state_bytes, so an exact-attention state is counted at its true,
 * growing size).
 *
 * ## Keys
 * An entry's key is its token list. It is found by a SHA-256 digest of
 * (namespace, tokens): the namespace names what makes two states
 * incomparable (the model fingerprint and the attention configuration; the
 * caller's bytes), the tokens are hashed as host-order int32. The digest
 * only picks the bucket: a hit also compares the whole token list, so a
 * collision cannot return another prefix's state (opts.hash_bits lets the
 * tests force collisions). An entry's id is "pfx_" and the first 24 hex
 * digits of the full digest (stable for a prefix over restarts of the same
 * configuration).
 *
 * ## Lookup
 * srv_prefix_cache_lookup finds the longest entry whose tokens start the
 * given prompt (at most max_len of them): one pass over the prompt hashes
 * every length some entry has (the SHA-256 state is copied at each such
 * length and finished), longest first wins.
 *
 * ## Budget and pinning
 * Every entry counts its bytes against opts.budget; unpinned entries are
 * evicted to make room, those never hit by a lookup first, least recently
 * used first within each class (a lookup hit or an insert makes an entry
 * the most recent; srv_prefix_cache_note_reuse counts as a hit here): a
 * reused prefix outlives one-off ones. Pinned entries are never evicted;
 * their bytes, and their number (opts.max_pinned), are bounded, so a pin
 * that would pass either is refused. A budget of 0 refuses every insert.
 *
 * Ownership: the cache owns its entries, their tokens and (from a
 * successful insert) their values; entry pointers are borrowed and valid
 * until the next call that inserts, removes or evicts (insert, remove,
 * unpin is harmless). Not thread-safe: one thread (darkserve's loop
 * thread) uses it.
 */
#ifndef DARKSERVE_SERVER_PREFIX_CACHE_H
#define DARKSERVE_SERVER_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* X(name, value, description) */
#define SRV_PREFIX_ERRNO_MAP(X)                                                                    \
    X(SRV_PREFIX_EINVAL, -501, "invalid argument")                                                 \
    X(SRV_PREFIX_ENOMEM, -502, "out of memory")                                                    \
    X(SRV_PREFIX_EEXIST, -503, "the prefix is cached already")                                     \
    X(SRV_PREFIX_ETOOBIG, -504, "the entry does not fit the cache's budget")                       \
    X(SRV_PREFIX_EPINNED, -505, "too many pinned prefixes")

enum srv_prefix_errno {
#define SRV_PREFIX_ERR_ENUM_(name, val, desc) name = val,
    SRV_PREFIX_ERRNO_MAP(SRV_PREFIX_ERR_ENUM_)
#undef SRV_PREFIX_ERR_ENUM_
};

/* Static description of a code; never NULL. */
const char *srv_prefix_strerror(int code);

#define SRV_PREFIX_ID_LEN 28 /* "pfx_" + 24 hex */

typedef struct srv_prefix_cache srv_prefix_cache_t;
typedef struct srv_prefix_entry srv_prefix_entry_t;

typedef struct srv_prefix_cache_opts {
    size_t budget;          /* bytes of values held at most; 0 = the cache refuses inserts */
    size_t max_pinned;      /* pinned entries at most */
    const void *ns;         /* [ns_len] namespace bytes mixed into every digest (copied) */
    size_t ns_len;
    void (*free_value)(void *value); /* frees an entry's value; NULL = free() */
    int hash_bits;          /* digest bits used for buckets and equality of digests:
                               0 = all 256; tests use a few to force collisions */
} srv_prefix_cache_opts_t;

typedef struct srv_prefix_cache_stats {
    size_t entries, bytes;       /* all entries, pinned included */
    size_t pinned, pinned_bytes; /* the pinned ones */
    uint64_t hits, misses;       /* srv_prefix_cache_lookup results */
    uint64_t evictions;          /* entries dropped to make room */
    uint64_t inserts;            /* entries added */
    size_t reserved;             /* bytes reserved (srv_prefix_cache_reserve) */
} srv_prefix_cache_stats_t;

/* New empty cache (owned by the caller). 0 or SRV_PREFIX_ENOMEM /
 * SRV_PREFIX_EINVAL (opts NULL, hash_bits outside 0..256). */
int srv_prefix_cache_new(const srv_prefix_cache_opts_t *opts, srv_prefix_cache_t **out);
/* Frees every entry (and value). NULL is a no-op. */
void srv_prefix_cache_free(srv_prefix_cache_t *c);

/* The longest entry whose tokens are toks[0..len) for some 1 <= len <=
 * min(n, max_len) (toks borrowed), or NULL. Counts a hit (and makes the
 * entry the most recently used) or a miss. */
srv_prefix_entry_t *srv_prefix_cache_lookup(srv_prefix_cache_t *c, const int32_t *toks, size_t n,
                                            size_t max_len);
/* The entry whose tokens are exactly toks[0..n), or NULL. Counts nothing,
 * changes no order. */
srv_prefix_entry_t *srv_prefix_cache_find(srv_prefix_cache_t *c, const int32_t *toks, size_t n);
/* The entry with this id (NUL-terminated), or NULL. Counts nothing. */
srv_prefix_entry_t *srv_prefix_cache_get(srv_prefix_cache_t *c, const char *id);
/* Marks e the most recently used (a use that did not go through lookup). */
void srv_prefix_cache_touch(srv_prefix_cache_t *c, srv_prefix_entry_t *e);

/* Adds value (bytes of it) under toks[0..n) (copied; n >= 1), pinned or
 * not, evicting unpinned entries, least recently used first, to make room.
 * 0: the cache owns value, *out (may be NULL) is the new entry. Else value
 * stays the caller's and nothing changed (nothing was evicted):
 *   SRV_PREFIX_EEXIST   the tokens have an entry (*out: it; pin it with
 *                       srv_prefix_cache_pin)
 *   SRV_PREFIX_ETOOBIG  bytes do not fit the budget next to the pinned
 *                       entries
 *   SRV_PREFIX_EPINNED  pinned, and max_pinned entries are pinned
 *   SRV_PREFIX_ENOMEM, SRV_PREFIX_EINVAL */
int srv_prefix_cache_insert(srv_prefix_cache_t *c, const int32_t *toks, size_t n, void *value,
                            size_t bytes, int pinned, srv_prefix_entry_t **out);
/* Marks e as wanted by more than its inserter (requests that would have hit
 * it had it been there): evicted with the entries that were hit. */
void srv_prefix_cache_note_reuse(srv_prefix_cache_t *c, srv_prefix_entry_t *e);
/* Reserves bytes of the budget for a value that will be inserted later
 * (the server's state snapshots, taken while a prompt is prefilled):
 * entries never hit (nor marked reused) are evicted, least recently used
 * first, until the entries and every reservation fit, so the values in
 * flight and the cache together stay within the budget. 0, or
 * SRV_PREFIX_ETOOBIG (nothing evicted) when the pinned and the reused
 * entries and the reservations leave no room: a speculative copy never
 * displaces a prefix that was reused. Later inserts evict to keep room for
 * the reservations too. */
int srv_prefix_cache_reserve(srv_prefix_cache_t *c, size_t bytes);
/* Gives back bytes reserved (before inserting the value they were for). */
void srv_prefix_cache_release(srv_prefix_cache_t *c, size_t bytes);
/* Pins e: 0 (also when it was pinned), SRV_PREFIX_EPINNED, or
 * SRV_PREFIX_ETOOBIG when the pinned bytes would pass the budget. */
int srv_prefix_cache_pin(srv_prefix_cache_t *c, srv_prefix_entry_t *e);
/* Unpins e (it stays, now evictable, as the most recently used). */
void srv_prefix_cache_unpin(srv_prefix_cache_t *c, srv_prefix_entry_t *e);

void srv_prefix_cache_stats(const srv_prefix_cache_t *c, srv_prefix_cache_stats_t *out);
/* Iteration, most recently used first: next(c, NULL) is the first entry,
 * NULL after the last. */
srv_prefix_entry_t *srv_prefix_cache_next(srv_prefix_cache_t *c, srv_prefix_entry_t *e);

/* ---- an entry (borrowed from the cache) ---- */
const char *srv_prefix_entry_id(const srv_prefix_entry_t *e); /* SRV_PREFIX_ID_LEN chars */
const int32_t *srv_prefix_entry_tokens(const srv_prefix_entry_t *e, size_t *n);
void *srv_prefix_entry_value(const srv_prefix_entry_t *e);
size_t srv_prefix_entry_bytes(const srv_prefix_entry_t *e);
int srv_prefix_entry_pinned(const srv_prefix_entry_t *e);
uint64_t srv_prefix_entry_hits(const srv_prefix_entry_t *e); /* lookups it answered */

#endif
