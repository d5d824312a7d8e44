/* core/kernels/kvrow.c — exact rows of the linear attention kinds in half or
 * 8-bit precision (core/kernels/kvrow.h). Packing and checking run once per
 * row that enters or leaves a state, so they stay portable C; the products
 * that read the rows are in core/kernels/blas.c. */
#include "core/kernels/kvrow.h"

#include <math.h>
#include <string.h>

#include "core/kernels/half.h"

size_t core_kvrow_bytes(core_kvrow_fmt_t f, int64_t hd)
{
    return f == CORE_KVROW_Q8 ? sizeof(float) + (size_t)hd : 2 * (size_t)hd;
}

int core_kvrow_bits(core_kvrow_fmt_t f)
{
    return f == CORE_KVROW_Q8 ? 8 : f == CORE_KVROW_F16 ? 16 : -1;
}

int core_kvrow_fmt_of_bits(int bits, core_kvrow_fmt_t *f)
{
    if (bits != 8 && bits != 16)
        return -1;
    *f = bits == 8 ? CORE_KVROW_Q8 : CORE_KVROW_F16;
    return 0;
}

/* One 8-bit row: see kvrow.h. NaN anywhere gives a NaN scale (and zeros). */
static void pack_q8(const float *x, unsigned char *row, int64_t hd)
{
    float amax = 0.0f;
    int nan = 0;
    for (int64_t i = 0; i < hd; i++) {
        const float a = fabsf(x[i]);
        nan |= isnan(x[i]);
        if (a > amax)
            amax = a;
    }
    if (amax > CORE_KVROW_MAX)
        amax = CORE_KVROW_MAX;
    const float d = nan ? NAN : amax / 127.0f;
    int8_t *q = (int8_t *)(void *)(row + sizeof d);
    for (int64_t i = 0; i < hd; i++) {
        float v = x[i] > CORE_KVROW_MAX ? CORE_KVROW_MAX : x[i] < -CORE_KVROW_MAX ? -CORE_KVROW_MAX
                                                                                 : x[i];
        float r = d > 0.0f ? nearbyintf(v / d) : 0.0f;
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
    memcpy(row, &d, sizeof d);
}

static void unpack_q8(const unsigned char *row, float *x, int64_t hd)
{
    float d;
    memcpy(&d, row, sizeof d);
    const int8_t *q = (const int8_t *)(const void *)(row + sizeof d);
    for (int64_t i = 0; i < hd; i++)
        x[i] = (float)q[i] * d;
}

void core_kvrow_pack(core_kvrow_fmt_t f, const float *x, void *dst, int64_t n, int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        core_half_pack(x, dst, n * hd);
        return;
    }
    const size_t rb = core_kvrow_bytes(f, hd);
    for (int64_t r = 0; r < n; r++)
        pack_q8(x + r * hd, (unsigned char *)dst + (size_t)r * rb, hd);
}

void core_kvrow_unpack(core_kvrow_fmt_t f, const void *src, float *x, int64_t n, int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        core_half_unpack(src, x, n * hd);
        return;
    }
    const size_t rb = core_kvrow_bytes(f, hd);
    for (int64_t r = 0; r < n; r++)
        unpack_q8((const unsigned char *)src + (size_t)r * rb, x + r * hd, hd);
}

void core_kvrow_round(core_kvrow_fmt_t f, const float *x, float *y, int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        core_half_round(x, y, hd);
        return;
    }
    unsigned char row[sizeof(float) + CORE_KVROW_MAX_HD];
    pack_q8(x, row, hd);
    unpack_q8(row, y, hd);
}

int core_kvrow_valid(core_kvrow_fmt_t f, const void *src, int64_t n, int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n * hd; i++)
            if ((h[i] & 0x7c00u) == 0x7c00u)
                return 0;
        return 1;
    }
    const size_t rb = core_kvrow_bytes(f, hd);
    for (int64_t r = 0; r < n; r++) {
        const unsigned char *row = (const unsigned char *)src + (size_t)r * rb;
        float d;
        memcpy(&d, row, sizeof d);
        if (!(d >= 0.0f && d <= CORE_KVROW_MAX / 127.0f))
            return 0;
        const int8_t *q = (const int8_t *)(const void *)(row + sizeof d);
        for (int64_t i = 0; i < hd; i++)
            if (q[i] == INT8_MIN)
                return 0;
    }
    return 1;
}

/* A 4-byte word and a half between host order and little-endian bytes
 * (core/le.h is the core's; kernels keep to their own layer). */
static void word_to_le(const unsigned char *host, unsigned char *le)
{
    uint32_t v;
    memcpy(&v, host, 4);
    for (int i = 0; i < 4; i++)
        le[i] = (unsigned char)(v >> (8 * i));
}

static void word_from_le(const unsigned char *le, unsigned char *host)
{
    const uint32_t v = (uint32_t)le[0] | (uint32_t)le[1] << 8 | (uint32_t)le[2] << 16 |
                       (uint32_t)le[3] << 24;
    memcpy(host, &v, 4);
}

void core_kvrow_to_le(core_kvrow_fmt_t f, const void *rows, unsigned char *le, int64_t n,
                      int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        const uint16_t *h = rows;
        for (int64_t i = 0; i < n * hd; i++) {
            le[2 * i] = (unsigned char)h[i];
            le[2 * i + 1] = (unsigned char)(h[i] >> 8);
        }
        return;
    }
    const size_t rb = core_kvrow_bytes(f, hd);
    for (int64_t r = 0; r < n; r++) {
        const unsigned char *s = (const unsigned char *)rows + (size_t)r * rb;
        word_to_le(s, le + (size_t)r * rb);
        memcpy(le + (size_t)r * rb + sizeof(float), s + sizeof(float), (size_t)hd);
    }
}

void core_kvrow_from_le(core_kvrow_fmt_t f, const unsigned char *le, void *rows, int64_t n,
                        int64_t hd)
{
    if (f == CORE_KVROW_F16) {
        uint16_t *h = rows;
        for (int64_t i = 0; i < n * hd; i++)
            h[i] = (uint16_t)(le[2 * i] | le[2 * i + 1] << 8);
        return;
    }
    const size_t rb = core_kvrow_bytes(f, hd);
    for (int64_t r = 0; r < n; r++) {
        unsigned char *d = (unsigned char *)rows + (size_t)r * rb;
        word_from_le(le + (size_t)r * rb, d);
        memcpy(d + sizeof(float), le + (size_t)r * rb + sizeof(float), (size_t)hd);
    }
}
