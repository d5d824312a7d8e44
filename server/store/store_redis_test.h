/* server/store/store_redis_test.h — for tests and fuzz targets only: the parts of
 * the Redis session backend (server/store/store_redis.c, declared in
 * server/store/store_backend.h) that no production code calls.
 *
 * The key layout and the encoding of a session's metadata in its hash are
 * the backend's own business; the server reaches Redis only through
 * srv_store_redis_new and the backend's ops. They are declared here so that
 * test_srv_store_redis checks them without a Redis server.
 *
 * Implemented in server/store/store_redis.c; nothing under server/ other than
 * that file includes this header.
 */
#ifndef DARKSERVE_SERVER_STORE_REDIS_TEST_H
#define DARKSERVE_SERVER_STORE_REDIS_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "server/store/store.h"
#include "server/store/store_backend.h"

/* The Redis keys of session id under namespace ns (the prefix every key of
 * one deployment shares: "darkserve:<16 hex of the model fingerprint>:"),
 * into out[n]: kind 's' the session's hash (blob and metadata), 'l' its
 * lease. Returns the length, or -1 when it does not fit. */
int srv_store_redis_key(const char *ns, char kind, const char *id, char *out, size_t n);

/* The metadata fields of a session hash, in the order the scripts and
 * srv_store_redis_meta_decode use them. */
#define SRV_STORE_REDIS_META_FIELDS 7
extern const char *const srv_store_redis_meta_names[SRV_STORE_REDIS_META_FIELDS];
/* m as the decimal / text values of those fields into buf (caller-owned
 * [SRV_STORE_REDIS_META_FIELDS][32 + SRV_SESSION_OWNER_LEN]). */
void srv_store_redis_meta_encode(const srv_store_meta_t *m,
                                 char buf[SRV_STORE_REDIS_META_FIELDS][32 + SRV_SESSION_OWNER_LEN]);
/* The fields' values v[i] (len[i] bytes; NULL = missing) back into *m.
 * Returns 0, or -1 when one is missing or malformed. */
int srv_store_redis_meta_decode(const char *const *v, const size_t *len, srv_store_meta_t *m);
/* A version as Redis holds it (decimal text of len bytes): 0 and *out, or
 * -1 (malformed, or 0). */
int srv_store_redis_version_parse(const char *s, size_t len, uint64_t *out);

#endif
