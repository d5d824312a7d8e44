/* core/le.h — little-endian fields of the files and blobs darkserve writes
 * (session state, sampler state, the store's owner section).
 *
 * Byte by byte, so they are right on any host and for any alignment; the
 * compilers turn them into single loads and stores on little-endian hosts.
 * p points at 4 (u32) or 8 (u64) bytes the caller owns.
 */
#ifndef DARKSERVE_CORE_LE_H
#define DARKSERVE_CORE_LE_H

#include <stdint.h>

static inline void core_le_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void core_le_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t core_le_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t core_le_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
