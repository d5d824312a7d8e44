/* server/store/prefix_cache_test.h — for tests and fuzz targets only: the parts of
 * the prefix cache (server/store/prefix_cache.h) that no production code calls.
 *
 * The server never drops an entry by hand: entries go by eviction (insert)
 * and with the cache, and DELETE /v1/prefixes/{id} only unpins. Tests drop
 * one directly to check the counts and the hash chains after a removal.
 *
 * Implemented in server/store/prefix_cache.c; nothing under server/ other than
 * that file includes this header.
 */
#ifndef DARKSERVE_SERVER_PREFIX_CACHE_TEST_H
#define DARKSERVE_SERVER_PREFIX_CACHE_TEST_H

#include "server/store/prefix_cache.h"

/* Drops e (pinned or not) and frees its value. */
void srv_prefix_cache_remove(srv_prefix_cache_t *c, srv_prefix_entry_t *e);

#endif
