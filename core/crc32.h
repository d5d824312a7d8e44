/* core/crc32.h — the CRC-32 every serialized blob of core carries (session
 * states, sampler states). Pure function; thread-safe. */
#ifndef DARKSERVE_CORE_CRC32_H
#define DARKSERVE_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32 (IEEE 802.3, as zlib's crc32) of n bytes of buf (borrowed),
 * continuing from crc (start with 0). */
uint32_t core_crc32(uint32_t crc, const void *buf, size_t n);

#endif
