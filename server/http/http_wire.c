/* server/http/http_wire.c — what the HTTP layer writes as raw bytes, below
 * both libmicrohttpd's side (http.c) and the front door (http_gate.c):
 * JSON string escaping for error bodies, a whole error answer as the bytes
 * of an HTTP/1.1 response (the door answers before libmicrohttpd ever sees
 * a connection), and request ids. Calls nothing else of the server. Loop
 * thread (the id state is the server's).
 */
#include "server/http/http_impl.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Length of the valid UTF-8 sequence at p (1..4), 0 if invalid. */
static size_t utf8_seq(const unsigned char *p)
{
    size_t n;
    unsigned cp, min;
    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        n = 2;
        min = 0x80;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        n = 3;
        min = 0x800;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    cp = p[0] & (0x3Fu >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) /* also stops at the NUL */
            return 0;
        cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) ? n : 0;
}

/* JSON string body of s into out[cap], cut to fit; invalid UTF-8 bytes (a
 * method or path echoed from a client) become '?' so the body stays JSON. */
void srv_http_json_escape(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && n + 7 < cap) {
        if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p++;
        } else if (*p < 0x20 || *p == 0x7F) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", *p++);
        } else if (*p < 0x80) {
            out[n++] = (char)*p++;
        } else {
            size_t k = utf8_seq(p);
            if (k == 0) {
                out[n++] = '?';
                p++;
            } else {
                memcpy(out + n, p, k);
                n += k;
                p += k;
            }
        }
    }
    out[n] = '\0';
}

size_t srv_http_error_bytes(char *out, size_t cap, int status, const char *type,
                            const char *code, const char *msg, const char *req_id,
                            int retry_after)
{
    char emsg[512], body[800], retry[32] = "";
    srv_http_json_escape(emsg, sizeof emsg, msg);
    int bn = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                      "\"code\":\"%s\"}}\n",
                      emsg, type, code);
    if (bn < 0 || (size_t)bn >= sizeof body)
        return 0;
    if (retry_after > 0)
        snprintf(retry, sizeof retry, "Retry-After: %d\r\n", retry_after);
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    char date[64] = "";
    time_t t = time(NULL);
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\n"
                     "X-Request-Id: %s\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
                     status, reason && *reason ? reason : "Error", date, req_id, bn, retry, body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

void srv_http_new_req_id(srv_http_t *h, char *id)
{
    snprintf(id, REQ_ID_MAX + 1, "%016llx", (unsigned long long)splitmix64(&h->rid_state));
}
