/* helpers.h — small helpers that several unit tests share: a file slurper,
 * little-endian stores and CRC-32 resealing of edited blobs, a monotonic
 * clock, and a raw HTTP/1.1 client over loopback sockets.
 *
 * Header-only (static inline), so a test includes it without a link rule and
 * pays nothing for what it does not call. It depends on libc and POSIX
 * sockets only, never on core/, proto/ or server/: the CRC-32 here is
 * written independently of core_crc32, so a test that reseals a blob
 * does not trust the code under test to compute its checksum.
 *
 * The HTTP client is deliberately dumb (one request per connection,
 * "Connection: close", reads until the peer closes) so that tests see the
 * server's bytes exactly; every wait is bounded by HTTP_WAIT_MS.
 */
#ifndef DARKSERVE_TESTS_HELPERS_H
#define DARKSERVE_TESTS_HELPERS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ---- files and blobs ---- */

/* The whole file at path, NUL-terminated (the NUL not counted in *len; len
 * may be NULL). New: the caller frees it. NULL when the file cannot be opened
 * or read, or memory runs out. */
static inline char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    size_t cap = fstat(fileno(f), &st) == 0 && st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
    size_t n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break; /* EOF or error: ferror below */
        char *nb = realloc(b, cap * 2);
        if (!nb) {
            free(b);
            b = NULL;
        } else {
            b = nb;
            cap *= 2;
        }
    }
    if (b && ferror(f)) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        if (len)
            *len = n;
    }
    return b;
}

static inline void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* CRC-32 (IEEE 802.3, reflected, as zlib) of p[0..n), bit by bit. */
static inline uint32_t test_crc32(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

/* Rewrites the trailing little-endian CRC-32 of a blob b[0..len) (the CRC of
 * everything before it) after a test edited a field. */
static inline void reseal(unsigned char *b, size_t len)
{
    put_le32(b + len - 4, test_crc32(b, len - 4));
}

/* ---- time ---- */

static inline uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a raw HTTP/1.1 client ---- */

#define HTTP_WAIT_MS 10000

/* A growing NUL-terminated byte buffer; {0} is empty; the owner frees p. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf_t;

static inline void buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np)
            abort(); /* a test out of memory cannot go on */
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* A new blocking connection to 127.0.0.1:port; the fd or -1. */
static inline int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline int send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static inline int send_str(int fd, const char *s)
{
    return send_all(fd, s, strlen(s));
}

/* Reads what arrives within timeout_ms. Returns bytes read (>0), 0 on EOF,
 * -1 on a connection error (reset), -2 on timeout. */
static inline ssize_t recv_wait(int fd, buf_t *b, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr == 0)
        return -2;
    char tmp[16384];
    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
    if (r > 0)
        buf_add(b, tmp, (size_t)r);
    return r < 0 ? -1 : r;
}

/* Reads until the peer closes. Returns 0 on EOF/reset, -2 on timeout. */
static inline int read_until_close(int fd, buf_t *b, int timeout_ms)
{
    uint64_t end = mono_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= end)
            return -2;
        ssize_t r = recv_wait(fd, b, (int)(end - now));
        if (r == 0 || r == -1)
            return 0;
        if (r == -2)
            return -2;
    }
}

/* Reads until b holds needle. Returns 0, -1 if the peer closed first, -2 on
 * timeout. */
static inline int read_until_contains(int fd, buf_t *b, const char *needle, int timeout_ms)
{
    uint64_t end = mono_ms() + (uint64_t)timeout_ms;
    while (!(b->p && strstr(b->p, needle))) {
        uint64_t now = mono_ms();
        if (now >= end)
            return -2;
        ssize_t r = recv_wait(fd, b, (int)(end - now));
        if (r <= 0 && r != -2)
            return -1;
    }
    return 0;
}

/* One parsed response: status, the head (status line and header lines, each
 * ending \r\n) and the body (de-chunked; owned, free with resp_free). */
typedef struct resp {
    int status;
    char head[8192];
    char *body;
    size_t body_len;
    int chunked;
    int chunked_complete; /* the terminating 0-size chunk arrived */
} resp_t;

static inline void resp_free(resp_t *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Value of header name in r (case-insensitive), copied into out; NULL if absent. */
static inline const char *resp_header(const resp_t *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    const char *p = strstr(r->head, "\r\n");
    while (p && p[2]) {
        p += 2;
        const char *eol = strstr(p, "\r\n");
        if (!eol)
            break;
        if ((size_t)(eol - p) > n && strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(eol - v);
            if (vl >= cap)
                vl = cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return out;
        }
        p = eol;
    }
    return NULL;
}

/* Parses one HTTP response from raw[0..len); de-chunks the body. 0 or -1. */
static inline int parse_resp(const char *raw, size_t len, resp_t *r)
{
    memset(r, 0, sizeof *r);
    if (!raw)
        return -1;
    const char *he = strstr(raw, "\r\n\r\n");
    if (!he || sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1)
        return -1;
    size_t hl = (size_t)(he - raw) + 2;
    if (hl >= sizeof r->head)
        return -1;
    memcpy(r->head, raw, hl);
    r->head[hl] = '\0';
    const char *b = he + 4;
    size_t blen = len - (size_t)(b - raw);
    char te[64];
    buf_t body = {0};
    buf_add(&body, "", 0);
    if (resp_header(r, "Transfer-Encoding", te, sizeof te) && strcasestr(te, "chunked")) {
        r->chunked = 1;
        const char *p = b, *end = b + blen;
        while (p < end) {
            char *eol = NULL;
            unsigned long sz = strtoul(p, &eol, 16);
            if (!eol || eol + 2 > end || eol[0] != '\r')
                break;
            p = eol + 2;
            if (sz == 0) {
                r->chunked_complete = 1;
                break;
            }
            if (p + sz > end) {
                buf_add(&body, p, (size_t)(end - p));
                break;
            }
            buf_add(&body, p, sz);
            p += sz + 2;
        }
    } else {
        buf_add(&body, b, blen);
    }
    r->body = body.p;
    r->body_len = body.len;
    return 0;
}

/* Sends req on a new connection, reads until the server closes, parses.
 * 0 or -1 (no connection, send failed, no close within HTTP_WAIT_MS, or not
 * an HTTP response). */
static inline int http_do(int port, const char *req, resp_t *r)
{
    memset(r, 0, sizeof *r);
    int fd = tcp_connect(port);
    if (fd < 0)
        return -1;
    buf_t b = {0};
    int rc = send_str(fd, req) == 0 && read_until_close(fd, &b, HTTP_WAIT_MS) == 0 ? 0 : -1;
    close(fd);
    if (rc == 0)
        rc = parse_resp(b.p, b.len, r);
    free(b.p);
    return rc;
}

/* A GET with Connection: close and extra header lines (each ending \r\n;
 * NULL for none). */
static inline int http_get(int port, const char *path, const char *extra, resp_t *r)
{
    char req[2048];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s\r\n", path,
             extra ? extra : "");
    return http_do(port, req, r);
}

/* A POST of body with a Content-Type (NULL: none) and extra header lines. */
static inline int http_post(int port, const char *path, const char *ctype, const char *body,
                            const char *extra, resp_t *r)
{
    buf_t b = {0};
    char head[2048];
    snprintf(head, sizeof head,
             "POST %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s%s%sContent-Length: %zu\r\n"
             "%s\r\n",
             path, ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "",
             strlen(body), extra ? extra : "");
    buf_add(&b, head, strlen(head));
    buf_add(&b, body, strlen(body));
    int rc = http_do(port, b.p, r);
    free(b.p);
    return rc;
}

/* The status of GET path, or -1. */
static inline int http_status(int port, const char *path)
{
    resp_t r;
    int status = http_get(port, path, NULL, &r) == 0 ? r.status : -1;
    resp_free(&r);
    return status;
}

#endif
