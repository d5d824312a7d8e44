/* server/sha256.h — SHA-256 (FIPS 180-4), for the owner tags of sessions
 * (server/api_sessions.c): a session file records a hash of the API key
 * that created it, never the key.
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

#endif
