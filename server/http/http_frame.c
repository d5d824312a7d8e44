/* server/http/http_frame.c — the message-framing rules of RFC 9112 for
 * requests, as pure functions over bytes: no socket, no libmicrohttpd call,
 * no allocation. Two callers (server/http/http_impl.h):
 *   - the front door (server/http/http_gate.c) reads the raw head of a
 *     connection's first request with MSG_PEEK and runs srv_http_head_scan
 *     over it before libmicrohttpd sees a byte;
 *   - the request hook (server/http/http.c check_headers) runs the same
 *     field rules (srv_http_frame_field / srv_http_frame_finish) over the
 *     header list libmicrohttpd parsed, for every request (later requests
 *     of a kept-alive connection, injected requests).
 * The verdict is one status (400, 413, 431, 501, 505) and a message; the
 * caller sends it. Why the rules are stricter than RFC 9112 in places: a
 * value the front door lets through must mean the same to libmicrohttpd
 * 0.9.75, which parses it again (it compares Transfer-Encoding with
 * "chunked" as a whole string, keeps trailing whitespace, and answers a
 * Content-Length it cannot parse with a broken response of its own), so
 * anything it would read differently is refused here first.
 */
#include "server/http/http_impl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* A field value byte RFC 9110 allows: VCHAR, obs-text, SP, HTAB. */
static int is_value_byte(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7F);
}

static int name_is(const char *name, size_t nlen, const char *want)
{
    return strlen(want) == nlen && strncasecmp(name, want, nlen) == 0;
}

static void frame_fail(srv_http_frame_t *f, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void frame_fail(srv_http_frame_t *f, int status, const char *code, const char *fmt, ...)
{
    if (f->status)
        return; /* the first problem found is the one reported */
    f->status = status;
    f->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
}

void srv_http_frame_init(srv_http_frame_t *f, int http11)
{
    memset(f, 0, sizeof *f);
    f->http11 = http11;
    f->need_host = http11;
}

/* Content-Length: 1*DIGIT and nothing else. Leading whitespace is already
 * gone (both parsers strip it); trailing whitespace, a sign, a list
 * ("5, 5") are refused: libmicrohttpd 0.9.75 would answer each with a
 * malformed response of its own. */
static void frame_clen(srv_http_frame_t *f, const char *v, size_t vlen)
{
    uint64_t x = 0;
    int huge = 0;
    if (vlen == 0) {
        f->clen_bad = 1;
        return;
    }
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < '0' || c > '9') {
            f->clen_bad = 1;
            return;
        }
        if (x > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
            huge = 1;
        else
            x = x * 10 + (uint64_t)(c - '0');
    }
    if (huge) {
        f->clen_huge = 1;
        return;
    }
    if (f->n_cl > 1 && x != f->clen)
        f->clen_conflict = 1;
    f->clen = x;
}

/* Transfer-Encoding: only "chunked", alone, is a framing this server reads.
 * Any other coding is named (501); "chunked" twice, or with whitespace or
 * commas libmicrohttpd would not strip, is malformed (400). */
static void frame_te(srv_http_frame_t *f, const char *v, size_t vlen)
{
    if (vlen == 7 && strncasecmp(v, "chunked", 7) == 0) {
        f->te_chunked = 1;
        return;
    }
    size_t i = 0;
    while (i < vlen) {
        while (i < vlen && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < vlen && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        if (i > s && !(i - s == 7 && strncasecmp(v + s, "chunked", 7) == 0)) {
            size_t n = i - s < sizeof f->te_unknown - 1 ? i - s : sizeof f->te_unknown - 1;
            memcpy(f->te_unknown, v + s, n);
            f->te_unknown[n] = '\0';
            for (size_t k = 0; k < n; k++) /* echoed in a message: printable only */
                if (!isprint((unsigned char)f->te_unknown[k]))
                    f->te_unknown[k] = '?';
            return;
        }
    }
    f->te_bad = 1;
}

void srv_http_frame_field(srv_http_frame_t *f, const char *name, size_t nlen, const char *value,
                          size_t vlen)
{
    if (nlen == 0)
        f->bad_name = 1;
    for (size_t i = 0; i < nlen; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == ' ' || c == '\t')
            f->ws_name = 1;
        else if (!is_tchar(c))
            f->bad_name = 1;
    }
    for (size_t i = 0; i < vlen; i++)
        if (!is_value_byte((unsigned char)value[i]))
            f->bad_value = 1;
    if (name_is(name, nlen, "Content-Length")) {
        f->n_cl++;
        frame_clen(f, value, vlen);
    } else if (name_is(name, nlen, "Transfer-Encoding")) {
        f->n_te++;
        frame_te(f, value, vlen);
    } else if (name_is(name, nlen, "Host")) {
        f->n_host++;
    }
}

void srv_http_frame_finish(srv_http_frame_t *f)
{
    if (f->ws_name)
        frame_fail(f, 400, "malformed_request",
                   "a header field name holds whitespace (before the colon?)");
    if (f->bad_name)
        frame_fail(f, 400, "malformed_request", "a header field name is not a token");
    if (f->bad_value)
        frame_fail(f, 400, "malformed_request",
                   "a header field value holds a control character (NUL, CR, LF...)");
    if (f->need_host && f->n_host == 0)
        frame_fail(f, 400, "malformed_request", "an HTTP/1.1 request needs a Host header");
    if (f->n_host > 1)
        frame_fail(f, 400, "malformed_request", "more than one Host header");
    if (f->n_te) {
        /* RFC 9112 6.3: both framings at once is how requests are smuggled
         * past a proxy that reads the other one; the connection closes */
        if (f->n_cl)
            frame_fail(f, 400, "malformed_request",
                       "both Content-Length and Transfer-Encoding");
        if (!f->http11)
            frame_fail(f, 400, "malformed_request", "Transfer-Encoding in an HTTP/1.0 request");
        if (f->n_te > 1)
            frame_fail(f, 400, "malformed_request", "more than one Transfer-Encoding header");
        if (f->te_unknown[0])
            frame_fail(f, 501, "unsupported_transfer_coding",
                       "transfer coding '%s' is not supported (only chunked)", f->te_unknown);
        if (f->te_bad)
            frame_fail(f, 400, "malformed_request", "malformed Transfer-Encoding");
    }
    if (f->clen_bad)
        frame_fail(f, 400, "malformed_request",
                   "malformed Content-Length (digits only, one value)");
    if (f->clen_conflict)
        frame_fail(f, 400, "malformed_request", "conflicting Content-Length values");
    if (f->clen_huge)
        frame_fail(f, 413, "request_too_large", "Content-Length is beyond any body limit");
    f->has_body = f->te_chunked || (f->n_cl && f->clen > 0);
}

/* ---- the raw head (the front door) ---- */

/* The end of the line starting at p within [p, end): the offset of its LF,
 * or -1 when no LF is there yet. */
static long line_end(const char *p, const char *end)
{
    const char *lf = memchr(p, '\n', (size_t)(end - p));
    return lf ? (long)(lf - p) : -1;
}

/* The request line p[0..n) (no CR/LF): METHOD SP target SP HTTP/1.x. */
static void scan_request_line(srv_http_head_t *hd, const char *p, size_t n)
{
    srv_http_frame_t *f = &hd->frame;
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)p[i]))
        i++;
    if (i == 0 || i >= n || p[i] != ' ' || i >= sizeof hd->method) {
        frame_fail(f, 400, "malformed_request", "malformed request line");
        return;
    }
    memcpy(hd->method, p, i);
    hd->method[i] = '\0';
    size_t t = ++i;
    while (i < n && p[i] != ' ') {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x21 || c == 0x7F) {
            frame_fail(f, 400, "malformed_request",
                       "the request target holds a control character");
            return;
        }
        i++;
    }
    hd->target_off = t;
    hd->target_len = i - t;
    if (i == t || i >= n) {
        frame_fail(f, 400, "malformed_request", "malformed request line");
        return;
    }
    const char *v = p + i + 1;
    size_t vl = n - i - 1;
    if (vl == 8 && memcmp(v, "HTTP/1.1", 8) == 0) {
        f->http11 = f->need_host = 1;
    } else if (vl == 8 && memcmp(v, "HTTP/1.0", 8) == 0) {
        f->http11 = f->need_host = 0;
    } else if (vl == 8 && memcmp(v, "HTTP/", 5) == 0 && isdigit((unsigned char)v[5]) &&
               v[6] == '.' && isdigit((unsigned char)v[7])) {
        frame_fail(f, 505, "http_version_not_supported",
                   "only HTTP/1.0 and HTTP/1.1 are served");
    } else {
        frame_fail(f, 400, "malformed_request", "malformed request line");
    }
}

/* One header line p[0..n) (no CR/LF). */
static void scan_field_line(srv_http_head_t *hd, const char *p, size_t n)
{
    srv_http_frame_t *f = &hd->frame;
    if (n && (p[0] == ' ' || p[0] == '\t')) {
        /* obs-fold: libmicrohttpd would join it to the previous value */
        frame_fail(f, 400, "malformed_request",
                   "a header line starts with whitespace (obsolete line folding)");
        return;
    }
    const char *colon = memchr(p, ':', n);
    if (!colon) {
        frame_fail(f, 400, "malformed_request", "a header line has no colon");
        return;
    }
    size_t nlen = (size_t)(colon - p);
    const char *v = colon + 1, *vend = p + n;
    while (v < vend && (*v == ' ' || *v == '\t'))
        v++;
    size_t vlen = (size_t)(vend - v);
    /* a NUL or a bare CR is seen here (raw bytes), which libmicrohttpd
     * would cut the value at or keep */
    srv_http_frame_field(f, p, nlen, v, vlen);
    if (name_is(p, nlen, "X-Request-Id") && vlen < sizeof hd->req_id) {
        memcpy(hd->req_id, v, vlen);
        hd->req_id[vlen] = '\0';
    }
}

/* Hex chunk size at p[0..n) (a chunk line without its CRLF): the size, with
 * *huge set when it has more digits than a uint64_t holds. -1 = no digit. */
static int scan_chunk_line(const char *p, size_t n, uint64_t *size)
{
    size_t i = 0;
    uint64_t x = 0;
    int huge = 0;
    while (i < n && isxdigit((unsigned char)p[i])) {
        unsigned d = (unsigned)(isdigit((unsigned char)p[i]) ? p[i] - '0'
                                                             : (tolower((unsigned char)p[i]) -
                                                                'a' + 10));
        if (x >> 60)
            huge = 1;
        x = (x << 4) | d;
        i++;
    }
    if (i == 0)
        return -1;
    *size = huge ? UINT64_MAX : x;
    return 0;
}

int srv_http_head_scan(const char *buf, size_t n, size_t max_head, srv_http_head_t *hd)
{
    memset(hd, 0, sizeof *hd);
    srv_http_frame_init(&hd->frame, 1);
    const char *p = buf, *end = buf + n;
    /* RFC 9112 2.2: empty lines before the request line are ignored */
    while (p < end && (*p == '\r' || *p == '\n')) {
        if (*p == '\r' && (p + 1 >= end || p[1] != '\n'))
            break;
        p += *p == '\r' ? 2 : 1;
    }
    hd->start = (size_t)(p - buf);
    int first = 1;
    for (;;) {
        long le = line_end(p, end);
        if (le < 0) {
            if ((size_t)(end - buf) >= max_head) {
                frame_fail(&hd->frame, 431, "headers_too_large",
                           "the request head is larger than the server reads");
                return 1;
            }
            return 0; /* more bytes needed */
        }
        size_t ll = (size_t)le;
        if ((size_t)(p - buf) + ll + 1 > max_head) {
            frame_fail(&hd->frame, 431, "headers_too_large",
                       "the request head is larger than the server reads");
            return 1;
        }
        const char *next = p + ll + 1;
        if (ll && p[ll - 1] == '\r')
            ll--;
        /* a CR anywhere else in the line is a bare CR */
        if (memchr(p, '\r', ll))
            frame_fail(&hd->frame, 400, "malformed_request", "a bare CR in the request head");
        if (first) {
            if (memchr(p, '\0', ll))
                frame_fail(&hd->frame, 400, "malformed_request",
                           "a NUL byte in the request line");
            else
                scan_request_line(hd, p, ll);
            hd->target_off += hd->start;
            first = 0;
        } else if (ll == 0) {
            hd->head_len = (size_t)(next - buf);
            break;
        } else {
            scan_field_line(hd, p, ll);
        }
        p = next;
    }
    srv_http_frame_finish(&hd->frame);
    /* the first chunk's size line, when it came with the head */
    if (!hd->frame.status && hd->frame.te_chunked) {
        const char *c = buf + hd->head_len;
        long le = line_end(c, end);
        if (le >= 0 && scan_chunk_line(c, (size_t)le, &hd->first_chunk) == 0)
            hd->first_chunk_known = 1;
    }
    return 1;
}

/* ---- the request target ---- */

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (unsigned char)tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int srv_http_target_check(const char *t, size_t n)
{
    int in_query = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        int encoded = 0;
        if (c == '?')
            in_query = 1;
        if (c == '%' && i + 2 < n) {
            int hi = hexval((unsigned char)t[i + 1]), lo = hexval((unsigned char)t[i + 2]);
            if (hi >= 0 && lo >= 0) {
                c = (unsigned char)(hi * 16 + lo);
                encoded = 1;
            }
        }
        /* a decoded NUL would cut the path or a query value short (the
         * id a handler sees is not the one sent); other control bytes have
         * no business in a path; the path is split into segments after it
         * is decoded, so an encoded slash would become a separator and
         * reach another route than the one the target names */
        if (c == 0 || (!in_query && (c < 0x20 || c == 0x7F || (encoded && c == '/'))))
            return -1;
    }
    return 0;
}
