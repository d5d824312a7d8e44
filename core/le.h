/* core/le.h — little-endian fields of the files and blobs darkserve writes
 * (session state, attention payloads, sampler state, the store's owner section).
 *
 * Byte by byte, so they are right on any host and for any alignment; the
 * compilers turn them into single loads and stores on little-endian hosts.
 * p points at 4 (u32) or 8 (u64) bytes the caller owns.
 */
#ifndef DARKSERVE_CORE_LE_H
#define DARKSERVE_CORE_LE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* n 2-, 4- or 8-byte values (core_le_copy16, 32, 64) between host
 * order and little-endian, either way (the same swap): a memcpy on
 * little-endian hosts. dst and src do not overlap. */
static inline void core_le_copy_n(void *dst, const void *src, size_t n, int width)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++, s += width, d += width)
        for (int b = 0; b < width; b++)
            d[b] = s[width - 1 - b];
#else
    memcpy(dst, src, n * (size_t)width);
#endif
}

static inline void core_le_copy16(void *dst, const void *src, size_t n)
{
    core_le_copy_n(dst, src, n, 2);
}

static inline void core_le_copy32(void *dst, const void *src, size_t n)
{
    core_le_copy_n(dst, src, n, 4);
}

static inline void core_le_copy64(void *dst, const void *src, size_t n)
{
    core_le_copy_n(dst, src, n, 8);
}

#endif
