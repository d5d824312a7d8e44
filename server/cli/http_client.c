/* server/cli/http_client.c — the HTTP/1.1 client of the command-line tools (see
 * http_client.h). Plain POSIX sockets and poll(); no library, no globals. */
#include "server/cli/http_client.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/base/version.h"

const char *srv_hc_strerror(int code)
{
    switch (code) {
    case 0: return "success";
#define SRV_HC_ERR_STR_(name, val, desc)                                                           \
    case name: return desc;
        SRV_HC_ERRNO_MAP(SRV_HC_ERR_STR_)
#undef SRV_HC_ERR_STR_
    default: return "unknown error";
    }
}

/* ---- response parser ---------------------------------------------------- */

enum {
    ST_HEAD,       /* status line and headers */
    ST_BODY_LEN,   /* Content-Length body: chunk_left bytes to go */
    ST_BODY_CLOSE, /* body until the connection closes */
    ST_CHUNK_SIZE, /* a chunk-size line */
    ST_CHUNK_DATA, /* chunk_left bytes of chunk data */
    ST_CHUNK_CRLF, /* the line end after a chunk's data */
    ST_TRAILERS,   /* trailer lines after the last chunk */
    ST_DONE,
    ST_FAILED
};

static int fail(srv_hc_parser_t *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(srv_hc_parser_t *p, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    p->state = ST_FAILED;
    return code;
}

void srv_hc_parser_init(srv_hc_parser_t *p, uint64_t body_max, srv_hc_head_fn on_head,
                        srv_hc_body_fn on_body, void *ud)
{
    p->status = 0;
    p->content_type[0] = '\0';
    p->content_length = -1;
    p->chunked = 0;
    p->state = ST_HEAD;
    p->head_len = 0;
    p->line_start = 0;
    p->line_len = 0;
    p->chunk_left = 0;
    p->body_seen = 0;
    p->body_max = body_max;
    p->on_head = on_head;
    p->on_body = on_body;
    p->ud = ud;
    p->err[0] = '\0';
}

int srv_hc_parser_done(const srv_hc_parser_t *p)
{
    return p->state == ST_DONE;
}

static int ieq(const char *a, size_t an, const char *b)
{
    size_t bn = strlen(b);
    if (an != bn)
        return 0;
    for (size_t i = 0; i < an; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (x != y)
            return 0;
    }
    return 1;
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static void trim(const char **s, size_t *n)
{
    while (*n && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*n)--;
    }
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
        (*n)--;
}

/* "HTTP/1.x SSS[ reason]" -> p->status. */
static int parse_status_line(srv_hc_parser_t *p, const char *l, size_t n)
{
    if (n < 12 || memcmp(l, "HTTP/1.", 7) != 0 || l[7] < '0' || l[7] > '9' || l[8] != ' ')
        return fail(p, SRV_HC_EPROTO, "not an HTTP/1.x status line: '%.40s'", l);
    int st = 0;
    for (int i = 9; i < 12; i++) {
        if (l[i] < '0' || l[i] > '9')
            return fail(p, SRV_HC_EPROTO, "bad status code in '%.40s'", l);
        st = st * 10 + (l[i] - '0');
    }
    if (n > 12 && l[12] != ' ')
        return fail(p, SRV_HC_EPROTO, "bad status code in '%.40s'", l);
    if (st < 100 || st > 599)
        return fail(p, SRV_HC_EPROTO, "status %d out of range", st);
    p->status = st;
    return 0;
}

static int parse_content_length(srv_hc_parser_t *p, const char *v, size_t n)
{
    if (n == 0 || n > 18)
        return fail(p, SRV_HC_EPROTO, "bad Content-Length '%.*s'", (int)(n > 40 ? 40 : n), v);
    int64_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return fail(p, SRV_HC_EPROTO, "bad Content-Length '%.*s'", (int)(n > 40 ? 40 : n), v);
        len = len * 10 + (v[i] - '0');
    }
    if (p->content_length >= 0 && p->content_length != len)
        return fail(p, SRV_HC_EPROTO, "two different Content-Length headers");
    p->content_length = len;
    return 0;
}

/* Only "chunked" is understood; it must be the one coding (a server that
 * compresses would need Accept-Encoding, which we never send). */
static int parse_transfer_encoding(srv_hc_parser_t *p, const char *v, size_t n)
{
    while (n) {
        const char *comma = memchr(v, ',', n);
        size_t k = comma ? (size_t)(comma - v) : n;
        const char *item = v;
        size_t in = k;
        trim(&item, &in);
        if (in) {
            if (!ieq(item, in, "chunked") || p->chunked)
                return fail(p, SRV_HC_EPROTO, "unsupported Transfer-Encoding '%.*s'",
                            (int)(n > 40 ? 40 : n), v);
            p->chunked = 1;
        }
        v += comma ? k + 1 : k;
        n -= comma ? k + 1 : k;
    }
    if (!p->chunked)
        return fail(p, SRV_HC_EPROTO, "empty Transfer-Encoding");
    return 0;
}

static int parse_header(srv_hc_parser_t *p, const char *l, size_t n)
{
    if (l[0] == ' ' || l[0] == '\t')
        return fail(p, SRV_HC_EPROTO, "folded header line");
    const char *colon = memchr(l, ':', n);
    if (!colon || colon == l)
        return fail(p, SRV_HC_EPROTO, "header line without a name: '%.40s'", l);
    size_t nn = (size_t)(colon - l);
    for (size_t i = 0; i < nn; i++)
        if (!is_tchar((unsigned char)l[i]))
            return fail(p, SRV_HC_EPROTO, "bad character in a header name");
    const char *v = colon + 1;
    size_t vn = n - nn - 1;
    for (size_t i = 0; i < vn; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(p, SRV_HC_EPROTO, "control character in header '%.*s'", (int)nn, l);
    }
    trim(&v, &vn);
    if (ieq(l, nn, "content-length"))
        return parse_content_length(p, v, vn);
    if (ieq(l, nn, "transfer-encoding"))
        return parse_transfer_encoding(p, v, vn);
    if (ieq(l, nn, "content-type")) {
        size_t k = vn < sizeof p->content_type - 1 ? vn : sizeof p->content_type - 1;
        memcpy(p->content_type, v, k);
        p->content_type[k] = '\0';
    }
    return 0;
}

/* The head in p->head[0..head_len) is complete (it ends with its empty
 * line): parse it and choose how the body is framed. */
static int end_of_head(srv_hc_parser_t *p)
{
    p->content_length = -1;
    p->chunked = 0;
    p->content_type[0] = '\0';
    const char *s = p->head, *end = p->head + p->head_len;
    int first = 1;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = (size_t)(nl - s);
        if (n && s[n - 1] == '\r')
            n--;
        if (n == 0)
            break;
        if (memchr(s, '\0', n))
            return fail(p, SRV_HC_EPROTO, "NUL byte in the response head");
        int rc = first ? parse_status_line(p, s, n) : parse_header(p, s, n);
        if (rc < 0)
            return rc;
        first = 0;
        s = nl + 1;
    }
    if (first)
        return fail(p, SRV_HC_EPROTO, "empty line where the status line should be");
    p->head_len = 0;
    p->line_start = 0;
    if (p->status < 200) {
        if (p->status == 101)
            return fail(p, SRV_HC_EPROTO, "unexpected 101 Switching Protocols");
        return 0; /* interim answer (100 Continue): the real one follows */
    }
    if (p->on_head && p->on_head(p->ud, p->status, p->content_type) != 0)
        return fail(p, SRV_HC_ESTOP, "stopped by the caller");
    if (p->status == 204 || p->status == 304) {
        p->state = ST_DONE;
    } else if (p->chunked) {
        p->state = ST_CHUNK_SIZE;
        p->line_len = 0;
    } else if (p->content_length >= 0) {
        if ((uint64_t)p->content_length > p->body_max)
            return fail(p, SRV_HC_ETOOBIG, "response body of %lld bytes is over the limit (%llu)",
                        (long long)p->content_length, (unsigned long long)p->body_max);
        p->chunk_left = (uint64_t)p->content_length;
        p->state = p->chunk_left ? ST_BODY_LEN : ST_DONE;
    } else {
        p->state = ST_BODY_CLOSE;
    }
    return 0;
}

/* Adds one byte to the head (or trailer) block; returns 1 when it ended the
 * block (an empty line), 0 to go on, or an error. */
static int head_byte(srv_hc_parser_t *p, char c)
{
    if (p->head_len >= sizeof p->head)
        return fail(p, SRV_HC_ETOOBIG, "response %s over %d bytes",
                    p->state == ST_HEAD ? "head" : "trailers", SRV_HC_MAX_HEAD);
    p->head[p->head_len++] = c;
    if (c != '\n')
        return 0;
    size_t n = p->head_len - 1 - p->line_start;
    if (n && p->head[p->head_len - 2] == '\r')
        n--;
    p->line_start = p->head_len;
    return n == 0;
}

static int deliver(srv_hc_parser_t *p, const char *data, size_t n)
{
    if (n > p->body_max - p->body_seen)
        return fail(p, SRV_HC_ETOOBIG, "response body over the limit (%llu bytes)",
                    (unsigned long long)p->body_max);
    p->body_seen += n;
    if (p->on_body && p->on_body(p->ud, data, n) != 0)
        return fail(p, SRV_HC_ESTOP, "stopped by the caller");
    return 0;
}

/* A complete chunk-size line in p->line: hex size, then optional
 * extensions after ';' (ignored). */
static int chunk_size_line(srv_hc_parser_t *p)
{
    size_t n = p->line_len;
    if (n && p->line[n - 1] == '\r')
        n--;
    uint64_t size = 0;
    size_t i = 0;
    for (; i < n; i++) {
        char c = p->line[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            break;
        if (i >= 15)
            return fail(p, SRV_HC_EPROTO, "chunk size too long");
        size = size * 16 + (uint64_t)d;
    }
    if (i == 0)
        return fail(p, SRV_HC_EPROTO, "bad chunk size line '%.*s'", (int)(n > 40 ? 40 : n),
                    p->line);
    while (i < n && (p->line[i] == ' ' || p->line[i] == '\t'))
        i++;
    if (i < n && p->line[i] != ';')
        return fail(p, SRV_HC_EPROTO, "bad chunk size line '%.*s'", (int)(n > 40 ? 40 : n),
                    p->line);
    p->line_len = 0;
    if (size == 0) {
        p->state = ST_TRAILERS;
        p->head_len = 0;
        p->line_start = 0;
        return 0;
    }
    if (size > p->body_max - p->body_seen)
        return fail(p, SRV_HC_ETOOBIG, "response body over the limit (%llu bytes)",
                    (unsigned long long)p->body_max);
    p->chunk_left = size;
    p->state = ST_CHUNK_DATA;
    return 0;
}

int64_t srv_hc_parser_feed(srv_hc_parser_t *p, const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int rc = 0;
        switch (p->state) {
        case ST_FAILED: return SRV_HC_EPROTO;
        case ST_DONE: return (int64_t)i;
        case ST_HEAD:
            rc = head_byte(p, buf[i++]);
            if (rc == 1)
                rc = end_of_head(p);
            break;
        case ST_TRAILERS:
            rc = head_byte(p, buf[i++]);
            if (rc == 1) {
                p->state = ST_DONE;
                rc = 0;
            }
            break;
        case ST_BODY_LEN:
        case ST_CHUNK_DATA: {
            size_t k = n - i < p->chunk_left ? n - i : (size_t)p->chunk_left;
            rc = deliver(p, buf + i, k);
            i += k;
            p->chunk_left -= k;
            if (rc == 0 && p->chunk_left == 0) {
                p->state = p->state == ST_BODY_LEN ? ST_DONE : ST_CHUNK_CRLF;
                p->line_len = 0;
            }
            break;
        }
        case ST_BODY_CLOSE:
            rc = deliver(p, buf + i, n - i);
            i = n;
            break;
        case ST_CHUNK_SIZE: {
            char c = buf[i++];
            if (c == '\n') {
                rc = chunk_size_line(p);
            } else if (p->line_len >= sizeof p->line) {
                rc = fail(p, SRV_HC_EPROTO, "chunk size line over %d bytes", SRV_HC_MAX_CHUNK_LINE);
            } else {
                p->line[p->line_len++] = c;
            }
            break;
        }
        case ST_CHUNK_CRLF: {
            char c = buf[i++];
            if (c == '\r' && p->line_len == 0)
                p->line_len = 1;
            else if (c == '\n') {
                p->state = ST_CHUNK_SIZE;
                p->line_len = 0;
            } else
                rc = fail(p, SRV_HC_EPROTO, "chunk data longer than its size");
            break;
        }
        }
        if (rc < 0)
            return rc;
    }
    return (int64_t)i;
}

int srv_hc_parser_eof(srv_hc_parser_t *p)
{
    switch (p->state) {
    case ST_DONE: return 0;
    case ST_BODY_CLOSE: p->state = ST_DONE; return 0;
    case ST_FAILED: return SRV_HC_EPROTO;
    case ST_HEAD:
        if (p->head_len == 0 && p->status == 0)
            return fail(p, SRV_HC_EPROTO, "connection closed without an answer");
        return fail(p, SRV_HC_EPROTO, "connection closed inside the response head");
    default: return fail(p, SRV_HC_EPROTO, "connection closed before the end of the response body");
    }
}

/* ---- server-sent events ------------------------------------------------- */

int srv_sse_init(srv_sse_t *s, size_t max, srv_sse_event_fn on_event, void *ud)
{
    memset(s, 0, sizeof *s);
    if (max == 0 || max > ((size_t)1 << 30))
        return SRV_HC_EINVAL;
    s->max = max;
    s->on_event = on_event;
    s->ud = ud;
    return 0;
}

void srv_sse_free(srv_sse_t *s)
{
    if (!s)
        return;
    free(s->line);
    free(s->data);
    s->line = s->data = NULL;
    s->line_len = s->data_len = s->line_cap = s->data_cap = 0;
}

/* Makes room for n more bytes and a NUL in *buf (capacity *cap, holding
 * len bytes), which may hold at most max bytes before its NUL. */
static int sse_room(char **buf, size_t *cap, size_t len, size_t n, size_t max)
{
    if (n > max - len)
        return SRV_HC_ETOOBIG;
    size_t need = len + n + 1;
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 256;
    while (ncap < need)
        ncap *= 2;
    if (ncap > max + 1)
        ncap = max + 1;
    if (ncap < need)
        return SRV_HC_ETOOBIG;
    char *nb = realloc(*buf, ncap);
    if (!nb)
        return SRV_HC_ENOMEM;
    *buf = nb;
    *cap = ncap;
    return 0;
}

static int sse_fail(srv_sse_t *s, int code, const char *what)
{
    s->failed = code;
    if (code == SRV_HC_ETOOBIG)
        snprintf(s->err, sizeof s->err, "event stream %s over %zu bytes", what, s->max);
    else if (code == SRV_HC_ESTOP)
        snprintf(s->err, sizeof s->err, "stopped by the caller");
    else
        snprintf(s->err, sizeof s->err, "%s", srv_hc_strerror(code));
    return code;
}

static int sse_line(srv_sse_t *s)
{
    const char *l = s->line ? s->line : "";
    size_t n = s->line_len;
    s->line_len = 0;
    if (n == 0) {
        if (!s->has_data)
            return 0;
        size_t len = s->data_len ? s->data_len - 1 : 0; /* the last "\n" is not data */
        s->data[len] = '\0';
        s->data_len = 0;
        s->has_data = 0;
        if (s->on_event && s->on_event(s->ud, s->data, len) != 0)
            return sse_fail(s, SRV_HC_ESTOP, "");
        return 0;
    }
    if (l[0] == ':')
        return 0; /* a comment (": ping") */
    const char *colon = memchr(l, ':', n);
    size_t nn = colon ? (size_t)(colon - l) : n;
    if (nn != 4 || memcmp(l, "data", 4) != 0)
        return 0; /* event, id, retry and unknown fields: nothing we use */
    const char *v = colon ? colon + 1 : l + n;
    size_t vn = (size_t)(l + n - v);
    if (vn && v[0] == ' ')
        v++, vn--;
    int rc = sse_room(&s->data, &s->data_cap, s->data_len, vn + 1, s->max + 1);
    if (rc < 0)
        return sse_fail(s, rc, "event");
    memcpy(s->data + s->data_len, v, vn);
    s->data_len += vn;
    s->data[s->data_len++] = '\n';
    s->has_data = 1;
    return 0;
}

int srv_sse_feed(srv_sse_t *s, const char *buf, size_t n)
{
    if (s->failed)
        return s->failed;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (s->after_cr) {
            s->after_cr = 0;
            if (c == '\n')
                continue;
        }
        if (c == '\r' || c == '\n') {
            s->after_cr = c == '\r';
            int rc = sse_line(s);
            if (rc < 0)
                return rc;
            continue;
        }
        int rc = sse_room(&s->line, &s->line_cap, s->line_len, 1, s->max);
        if (rc < 0)
            return sse_fail(s, rc, "line");
        s->line[s->line_len++] = c;
    }
    return 0;
}

/* ---- buffers ------------------------------------------------------------ */

int srv_hc_buf_append(void *buf, const char *data, size_t len)
{
    srv_hc_buf_t *b = buf;
    if (len > b->max - b->len)
        return -1;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *nd = realloc(b->data, cap);
        if (!nd)
            return -1;
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

void srv_hc_buf_free(srv_hc_buf_t *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- URLs --------------------------------------------------------------- */

int srv_hc_url_parse(const char *url, srv_hc_url_t *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "'%s': only http:// URLs are supported", url);
        return SRV_HC_EINVAL;
    }
    const char *s = url + 7, *host = s, *host_end;
    if (*s == '[') {
        host = s + 1;
        host_end = strchr(host, ']');
        if (!host_end) {
            snprintf(err, errlen, "'%s': unclosed '[' in the host", url);
            return SRV_HC_EINVAL;
        }
        s = host_end + 1;
        u->ipv6_literal = 1;
    } else {
        s += strcspn(s, ":/?#");
        host_end = s;
    }
    size_t hn = (size_t)(host_end - host);
    if (hn == 0 || hn >= sizeof u->host) {
        snprintf(err, errlen, "'%s': %s host", url, hn ? "too long a" : "no");
        return SRV_HC_EINVAL;
    }
    for (size_t i = 0; i < hn; i++) {
        unsigned char c = (unsigned char)host[i];
        if (c <= ' ' || c == 0x7f || c == '@' || c == '[' || c == ']' || c == '\\') {
            snprintf(err, errlen, "'%s': bad character in the host", url);
            return SRV_HC_EINVAL;
        }
    }
    memcpy(u->host, host, hn);
    strcpy(u->port, "80");
    if (*s == ':') {
        s++;
        size_t pn = strspn(s, "0123456789");
        long port = pn && pn <= 5 ? strtol(s, NULL, 10) : 0;
        if (port < 1 || port > 65535) {
            snprintf(err, errlen, "'%s': the port must be 1 to 65535", url);
            return SRV_HC_EINVAL;
        }
        snprintf(u->port, sizeof u->port, "%ld", port);
        s += pn;
    }
    if (*s && *s != '/') {
        snprintf(err, errlen, "'%s': unexpected '%c' after the host", url, *s);
        return SRV_HC_EINVAL;
    }
    size_t bn = strlen(s);
    while (bn && s[bn - 1] == '/')
        bn--;
    if (bn >= sizeof u->base) {
        snprintf(err, errlen, "'%s': path too long", url);
        return SRV_HC_EINVAL;
    }
    for (size_t i = 0; i < bn; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c == 0x7f || c == '?' || c == '#') {
            snprintf(err, errlen, "'%s': the URL path may not hold spaces, '?' or '#'", url);
            return SRV_HC_EINVAL;
        }
    }
    memcpy(u->base, s, bn);
    return 0;
}

/* ---- requests ----------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events, in slices of 100 ms so that a cancel
 * flag set by a signal handler is seen even when the signal arrived just
 * before poll(). */
static int wait_fd(int fd, short events, int timeout_ms, volatile sig_atomic_t *cancel)
{
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        if (cancel && *cancel)
            return SRV_HC_ECANCELED;
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return SRV_HC_ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, left < 100 ? (int)left : 100);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return SRV_HC_EIO;
    }
}

static int has_crlf(const char *s)
{
    return s && strpbrk(s, "\r\n") != NULL;
}

static int connect_to(const srv_hc_url_t *u, int timeout_ms, volatile sig_atomic_t *cancel,
                      char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(u->host, u->port, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", u->host, gai_strerror(gai));
        return SRV_HC_ECONNECT;
    }
    int fd = -1, saved = 0, rc = SRV_HC_ECONNECT;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        saved = errno;
        if (saved == EINPROGRESS) {
            rc = wait_fd(fd, POLLOUT, timeout_ms, cancel);
            if (rc == 0) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                    break;
                saved = soerr ? soerr : errno;
                rc = SRV_HC_ECONNECT;
            } else if (rc == SRV_HC_ETIMEDOUT) {
                saved = ETIMEDOUT;
            }
        }
        close(fd);
        fd = -1;
        if (rc == SRV_HC_ECANCELED)
            break;
    }
    freeaddrinfo(res);
    if (fd >= 0)
        return fd;
    if (rc == SRV_HC_ECANCELED) {
        snprintf(err, errlen, "interrupted");
        return rc;
    }
    snprintf(err, errlen, "cannot connect to %s%s%s:%s: %s", u->ipv6_literal ? "[" : "", u->host,
             u->ipv6_literal ? "]" : "", u->port, strerror(saved ? saved : ECONNREFUSED));
    return SRV_HC_ECONNECT;
}

static int send_all(int fd, const char *p, size_t n, int timeout_ms, volatile sig_atomic_t *cancel)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, timeout_ms, cancel);
            if (rc < 0)
                return rc;
            continue;
        }
        return SRV_HC_EIO;
    }
    return 0;
}

static char *request_head(const srv_hc_url_t *u, const srv_hc_request_t *rq, size_t *len)
{
    size_t cap = 512 + strlen(rq->method) + strlen(u->base) + strlen(rq->path) + strlen(u->host) +
                 (rq->bearer ? strlen(rq->bearer) : 0) +
                 (rq->content_type ? strlen(rq->content_type) : 0);
    char *h = malloc(cap);
    if (!h)
        return NULL;
    int n = snprintf(h, cap,
                     "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: darkserve/%s\r\n"
                     "Accept: */*\r\nConnection: close\r\n",
                     rq->method, u->base, rq->path, u->ipv6_literal ? "[" : "", u->host,
                     u->ipv6_literal ? "]" : "", u->port, DARKSERVE_VERSION);
    if (rq->bearer)
        n += snprintf(h + n, cap - (size_t)n, "Authorization: Bearer %s\r\n", rq->bearer);
    if (rq->content_type)
        n += snprintf(h + n, cap - (size_t)n, "Content-Type: %s\r\n", rq->content_type);
    if (rq->body_len || strcmp(rq->method, "GET") != 0)
        n += snprintf(h + n, cap - (size_t)n, "Content-Length: %zu\r\n", rq->body_len);
    n += snprintf(h + n, cap - (size_t)n, "\r\n");
    *len = (size_t)n;
    return h;
}

int srv_hc_request(const srv_hc_url_t *u, const srv_hc_request_t *rq, char *err, size_t errlen)
{
    if (!rq->method || !rq->path || rq->path[0] != '/' || has_crlf(rq->method) ||
        has_crlf(rq->path) || has_crlf(rq->bearer) || has_crlf(rq->content_type) ||
        strchr(rq->path, ' ') || (rq->body_len && !rq->body)) {
        snprintf(err, errlen, "invalid request");
        return SRV_HC_EINVAL;
    }
    if (rq->cancel && *rq->cancel) {
        snprintf(err, errlen, "interrupted");
        return SRV_HC_ECANCELED;
    }
    int timeout = rq->timeout_ms > 0 ? rq->timeout_ms : 30000;
    srv_hc_parser_t *p = calloc(1, sizeof *p);
    size_t head_len = 0;
    char *head = request_head(u, rq, &head_len);
    char *buf = malloc(16384);
    int rc = SRV_HC_ENOMEM, fd = -1;
    if (!p || !head || !buf) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    srv_hc_parser_init(p, rq->body_max, rq->on_head, rq->on_body, rq->ud);
    fd = connect_to(u, timeout, rq->cancel, err, errlen);
    if (fd < 0) {
        rc = fd;
        goto out;
    }
    /* A server may answer (413, 401) and close before it read the whole
     * body: a failed send is reported only when no answer can be read. */
    int send_rc = send_all(fd, head, head_len, timeout, rq->cancel);
    if (send_rc == 0 && rq->body_len)
        send_rc = send_all(fd, rq->body, rq->body_len, timeout, rq->cancel);
    if (send_rc == SRV_HC_ECANCELED || send_rc == SRV_HC_ETIMEDOUT) {
        rc = send_rc;
        snprintf(err, errlen, "%s while sending the request", srv_hc_strerror(rc));
        goto out;
    }
    for (;;) {
        rc = wait_fd(fd, POLLIN, timeout, rq->cancel);
        if (rc < 0) {
            snprintf(err, errlen, "%s while waiting for the answer", srv_hc_strerror(rc));
            goto out;
        }
        ssize_t r = recv(fd, buf, 16384, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (r < 0) {
            int e = errno;
            rc = srv_hc_parser_eof(p);
            if (rc == 0)
                break;
            rc = SRV_HC_EIO;
            snprintf(err, errlen, "connection error: %s", strerror(e));
            goto out;
        }
        if (r == 0) {
            rc = srv_hc_parser_eof(p);
            if (rc < 0) {
                if (send_rc < 0)
                    snprintf(err, errlen, "connection closed while sending the request");
                else
                    snprintf(err, errlen, "%s", p->err);
                goto out;
            }
            break;
        }
        int64_t used = srv_hc_parser_feed(p, buf, (size_t)r);
        if (used < 0) {
            rc = (int)used;
            snprintf(err, errlen, "%s", p->err);
            goto out;
        }
        if (srv_hc_parser_done(p))
            break;
    }
    rc = p->status;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    free(head);
    free(p);
    return rc;
}
