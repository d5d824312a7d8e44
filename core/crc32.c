/* core/crc32.c — CRC-32 (IEEE 802.3), slicing by 8 (see crc32.h).
 *
 * Slicing by 8: the checksum runs over tens of MB for a long exact-attention
 * session state, where the bytewise loop would cost more than the
 * serialization itself. The tables are filled once (pthread_once).
 */
#include "core/crc32.h"

#include <pthread.h>

#include "core/le.h"

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
        crc_tab[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xffu];
}

uint32_t core_crc32(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo = c ^ core_le_get_u32(p), hi = core_le_get_u32(p + 4);
        c = crc_tab[7][lo & 0xffu] ^ crc_tab[6][(lo >> 8) & 0xffu] ^
            crc_tab[5][(lo >> 16) & 0xffu] ^ crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xffu] ^
            crc_tab[2][(hi >> 8) & 0xffu] ^ crc_tab[1][(hi >> 16) & 0xffu] ^ crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xffu];
    return ~c;
}
