/* server/base/sha256.h — SHA-256 (FIPS 180-4), for the owner tags of sessions
 * (server/api/api_sessions.c): a session file records a hash of the API key
 * that created it, never the key; and for the keys of the prefix-state
 * cache (server/store/prefix_cache.h), which hashes every prefix length of a
 * prompt in one pass (copy the context, finish the copy).
 *
 * Knows nothing of the daemon; no allocation, no globals.
 */
#ifndef DARKSERVE_SERVER_SHA256_H
#define DARKSERVE_SERVER_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SRV_SHA256_BYTES 32

/* out[32] = SHA-256 of data[0..n) (data borrowed; NULL allowed when n == 0). */
void srv_sha256(const void *data, size_t n, uint8_t out[SRV_SHA256_BYTES]);

/* Incremental form: init, update any number of times, final. A plain
 * struct: copying it forks the hash (the copy can be finished while the
 * original goes on). */
typedef struct srv_sha256_ctx {
    uint32_t h[8];
    uint8_t buf[64]; /* [fill] bytes of the unfinished block */
    size_t fill;
    uint64_t n; /* bytes so far */
} srv_sha256_ctx_t;

void srv_sha256_init(srv_sha256_ctx_t *c);
void srv_sha256_update(srv_sha256_ctx_t *c, const void *data, size_t n); /* data borrowed */
/* out[32]; c is spent (init it again to reuse). */
void srv_sha256_final(srv_sha256_ctx_t *c, uint8_t out[SRV_SHA256_BYTES]);

#endif
