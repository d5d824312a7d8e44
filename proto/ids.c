/* proto/ids.c — the shape of the ids the API hands out: session ids (32
 * lowercase hex digits, 128 random bits) and prefix ids ("pfx_" and 24
 * lowercase hex digits), and the lowercase hex the server writes them with.
 * Knows no JSON, so every other proto file and the server's store can use
 * it. */
#include <string.h>

#include "proto/proto.h"

/* 1 when s[0..n) are lowercase hex digits only. */
static int lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
    }
    return 1;
}

int proto_session_id_valid(const char *s, size_t len)
{
    return s && len == PROTO_SESSION_ID_LEN && lower_hex(s, len);
}

int proto_prefix_id_valid(const char *s, size_t len)
{
    return s && len == PROTO_PREFIX_ID_LEN && memcmp(s, "pfx_", 4) == 0 &&
           lower_hex(s + 4, len - 4);
}

void proto_hex_format(const uint8_t *bytes, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[bytes[i] >> 4];
        out[2 * i + 1] = hex[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

void proto_session_id_format(const uint8_t bytes[16], char out[PROTO_SESSION_ID_LEN + 1])
{
    proto_hex_format(bytes, PROTO_SESSION_ID_LEN / 2, out);
}
