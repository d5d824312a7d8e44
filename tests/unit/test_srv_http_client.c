/* test_srv_http_client.c — the command-line tools' HTTP client
 * (server/cli/http_client.h): the response parser on Content-Length, chunked and
 * close-framed bodies fed whole, byte by byte and split at every position;
 * malformed responses and bodies over their bounds give errors; the SSE
 * parser on every line ending, split anywhere; seeded random mutations of
 * valid responses never crash (run under ASan by make asan); URL parsing;
 * and whole requests against a loopback socket served by a thread. */
#include "server/cli/http_client.h"
#include "tests/unit/check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- a collecting parser --------------------------------------------------- */

typedef struct got {
    char body[1 << 16];
    size_t len;
    int heads, head_status;
    char ctype[128];
    int stop_at_head;
} got_t;

static int on_head(void *ud, int status, const char *ct)
{
    got_t *g = ud;
    g->heads++;
    g->head_status = status;
    snprintf(g->ctype, sizeof g->ctype, "%s", ct);
    return g->stop_at_head;
}

static int on_body(void *ud, const char *d, size_t n)
{
    got_t *g = ud;
    if (n > sizeof g->body - g->len)
        return -1;
    memcpy(g->body + g->len, d, n);
    g->len += n;
    return 0;
}

static srv_hc_parser_t P; /* large: kept off the stack */
static got_t G;

/* Feeds text in pieces of `step` bytes (0: whole), then EOF if eof.
 * Returns the first negative code, else 0; *consumed gets the bytes taken. */
static int parse(const char *text, size_t n, size_t step, int eof, uint64_t body_max,
                 size_t *consumed)
{
    memset(&G, 0, sizeof G);
    srv_hc_parser_init(&P, body_max, on_head, on_body, &G);
    size_t off = 0;
    while (off < n) {
        size_t k = step && step < n - off ? step : n - off;
        int64_t used = srv_hc_parser_feed(&P, text + off, k);
        if (used < 0)
            return (int)used;
        off += (size_t)used;
        if ((size_t)used < k)
            break;
    }
    if (consumed)
        *consumed = off;
    if (eof) {
        int rc = srv_hc_parser_eof(&P);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_str(const char *text, int eof)
{
    return parse(text, strlen(text), 0, eof, 1 << 20, NULL);
}

TEST(test_content_length)
{
    const char *r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "content-length: 11\r\nX-Other:  a b \r\n\r\n{\"a\": true}";
    size_t n = strlen(r);
    for (size_t step = 0; step <= 3; step++) {
        CHECK_INT_EQ(parse(r, n, step, 0, 1 << 20, NULL), 0);
        CHECK(srv_hc_parser_done(&P));
        CHECK_INT_EQ(P.status, 200);
        CHECK_INT_EQ(P.content_length, 11);
        CHECK_INT_EQ(G.heads, 1);
        CHECK_STR_EQ(G.ctype, "application/json");
        CHECK_INT_EQ(G.len, 11);
        CHECK(memcmp(G.body, "{\"a\": true}", 11) == 0);
    }
    /* bytes after the body are not ours: feed stops at the end */
    const char *two = "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200";
    size_t used = 0;
    CHECK_INT_EQ(parse(two, strlen(two), 0, 0, 1 << 20, &used), 0);
    CHECK_INT_EQ(used, strlen(two) - strlen("HTTP/1.1 200"));
    CHECK_INT_EQ(P.status, 404);
    /* bare LF line ends, no reason phrase, an empty body */
    CHECK_INT_EQ(parse_str("HTTP/1.0 204\nContent-Length: 0\n\n", 0), 0);
    CHECK(srv_hc_parser_done(&P));
    CHECK_INT_EQ(P.status, 204);
    CHECK_INT_EQ(G.len, 0);
}

TEST(test_chunked_every_split)
{
    const char *r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                    "Content-Type: text/event-stream\r\n\r\n"
                    "5\r\nhello\r\n1;ext=1\r\n \r\nA \r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n";
    const char *want = "hello 0123456789";
    size_t n = strlen(r);
    for (size_t cut = 0; cut <= n; cut++) {
        memset(&G, 0, sizeof G);
        srv_hc_parser_init(&P, 1 << 20, on_head, on_body, &G);
        int64_t a = srv_hc_parser_feed(&P, r, cut);
        int64_t b = srv_hc_parser_feed(&P, r + cut, n - cut);
        CHECK_MSG(a == (int64_t)cut && b == (int64_t)(n - cut), "cut %zu: %lld %lld (%s)", cut,
                  (long long)a, (long long)b, P.err);
        CHECK_MSG(srv_hc_parser_done(&P), "cut %zu", cut);
        CHECK_MSG(G.len == strlen(want) && memcmp(G.body, want, G.len) == 0, "cut %zu", cut);
        CHECK_INT_EQ(srv_hc_parser_eof(&P), 0);
    }
    CHECK(P.chunked);
    CHECK_STR_EQ(G.ctype, "text/event-stream");
    /* lower-case hex, LF-only line ends, no trailers */
    CHECK_INT_EQ(
        parse_str("HTTP/1.1 200 OK\nTransfer-Encoding: Chunked\n\na\nabcdefghij\n0\n\n", 0), 0);
    CHECK(srv_hc_parser_done(&P));
    CHECK_INT_EQ(G.len, 10);
}

TEST(test_interim_and_close_framed)
{
    const char *r = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
                    "HTTP/1.1 201 Created\r\n\r\nuntil the end";
    CHECK_INT_EQ(parse(r, strlen(r), 1, 1, 1 << 20, NULL), 0);
    CHECK_INT_EQ(G.heads, 1); /* interim answers are not reported */
    CHECK_INT_EQ(P.status, 201);
    CHECK(srv_hc_parser_done(&P));
    CHECK_INT_EQ(G.len, strlen("until the end"));
    /* before EOF a close-framed body is not complete */
    CHECK_INT_EQ(parse_str("HTTP/1.1 200 OK\r\n\r\nab", 0), 0);
    CHECK(!srv_hc_parser_done(&P));
}

static void expect_err(const char *r, int eof, int code, const char *words)
{
    int rc = parse(r, strlen(r), 0, eof, 64, NULL);
    CHECK_MSG(rc == code, "'%.30s…': %d (%s), expected %d", r, rc, P.err, code);
    CHECK_MSG(strstr(P.err, words) != NULL, "'%.30s…': message '%s' lacks '%s'", r, P.err, words);
    /* a failed parser stays failed */
    CHECK(srv_hc_parser_feed(&P, "x", 1) < 0);
    CHECK(!srv_hc_parser_done(&P));
}

TEST(test_malformed)
{
    expect_err("HTTP/2 200 OK\r\n\r\n", 0, SRV_HC_EPROTO, "status line");
    expect_err("ICY 200 OK\r\n\r\n", 0, SRV_HC_EPROTO, "status line");
    expect_err("HTTP/1.1 2x0 OK\r\n\r\n", 0, SRV_HC_EPROTO, "status code");
    expect_err("HTTP/1.1 2000 OK\r\n\r\n", 0, SRV_HC_EPROTO, "status code");
    expect_err("HTTP/1.1 999 Huh\r\n\r\n", 0, SRV_HC_EPROTO, "out of range");
    expect_err("HTTP/1.1 101 Switching\r\n\r\n", 0, SRV_HC_EPROTO, "101");
    expect_err("\r\n\r\n", 0, SRV_HC_EPROTO, "status line");
    expect_err("HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", 0, SRV_HC_EPROTO, "without a name");
    expect_err("HTTP/1.1 200 OK\r\n: v\r\n\r\n", 0, SRV_HC_EPROTO, "without a name");
    expect_err("HTTP/1.1 200 OK\r\nA: b\r\n  folded\r\n\r\n", 0, SRV_HC_EPROTO, "folded");
    expect_err("HTTP/1.1 200 OK\r\nBad Name: v\r\n\r\n", 0, SRV_HC_EPROTO, "header name");
    expect_err("HTTP/1.1 200 OK\r\nA: b\x01\r\n\r\n", 0, SRV_HC_EPROTO, "control character");
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n", 0, SRV_HC_EPROTO,
               "Content-Length");
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, SRV_HC_EPROTO, "Content-Length");
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", 0, SRV_HC_EPROTO,
               "Content-Length");
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 0,
               SRV_HC_EPROTO, "two different");
    expect_err("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0, SRV_HC_EPROTO,
               "Transfer-Encoding");
    expect_err("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 0, SRV_HC_EPROTO,
               "Transfer-Encoding");
    expect_err("HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n", 0, SRV_HC_EPROTO,
               "Transfer-Encoding");
    const char *te = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    char buf[1024];
    snprintf(buf, sizeof buf, "%szz\r\n", te);
    expect_err(buf, 0, SRV_HC_EPROTO, "chunk size");
    snprintf(buf, sizeof buf, "%s\r\n", te);
    expect_err(buf, 0, SRV_HC_EPROTO, "chunk size");
    snprintf(buf, sizeof buf, "%s5 x\r\n", te);
    expect_err(buf, 0, SRV_HC_EPROTO, "chunk size");
    snprintf(buf, sizeof buf, "%s10000000000000000\r\n", te);
    expect_err(buf, 0, SRV_HC_EPROTO, "too long");
    snprintf(buf, sizeof buf, "%s2\r\nabc\r\n", te);
    expect_err(buf, 0, SRV_HC_EPROTO, "longer than its size");
    snprintf(buf, sizeof buf, "%s3;%0300d\r\n", te, 0);
    expect_err(buf, 0, SRV_HC_EPROTO, "over 256 bytes");
    /* cut short */
    expect_err("", 1, SRV_HC_EPROTO, "without an answer");
    expect_err("HTTP/1.1 200 OK\r\nContent-", 1, SRV_HC_EPROTO, "inside the response head");
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", 1, SRV_HC_EPROTO,
               "before the end");
    snprintf(buf, sizeof buf, "%s5\r\nab", te);
    expect_err(buf, 1, SRV_HC_EPROTO, "before the end");
    snprintf(buf, sizeof buf, "%s0\r\nX: y\r\n", te);
    expect_err(buf, 1, SRV_HC_EPROTO, "before the end");
    /* NUL in the head */
    static const char nul[] = "HTTP/1.1 200 OK\r\nA: \0b\r\n\r\n";
    int rc = parse(nul, sizeof nul - 1, 0, 0, 64, NULL);
    CHECK_INT_EQ(rc, SRV_HC_EPROTO);
}

TEST(test_bounds)
{
    /* body over body_max (64 in expect_err): announced, chunked, close-framed */
    expect_err("HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n", 0, SRV_HC_ETOOBIG,
               "over the limit");
    char buf[512];
    snprintf(buf, sizeof buf,
             "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
             "20\r\n%032d\r\n21\r\n",
             0);
    expect_err(buf, 0, SRV_HC_ETOOBIG, "over the limit");
    snprintf(buf, sizeof buf, "HTTP/1.1 200 OK\r\n\r\n%065d", 0);
    expect_err(buf, 0, SRV_HC_ETOOBIG, "over the limit");
    /* exactly body_max is fine */
    snprintf(buf, sizeof buf, "HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n%064d", 0);
    CHECK_INT_EQ(parse(buf, strlen(buf), 7, 0, 64, NULL), 0);
    CHECK(srv_hc_parser_done(&P));
    /* a head over SRV_HC_MAX_HEAD, and trailers likewise */
    static char big[SRV_HC_MAX_HEAD + 200];
    size_t n = (size_t)snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\n");
    while (n < SRV_HC_MAX_HEAD + 100)
        n += (size_t)snprintf(big + n, sizeof big - n, "X-Pad: 0123456789abcdef\r\n");
    CHECK_INT_EQ(parse(big, n, 1000, 0, 64, NULL), SRV_HC_ETOOBIG);
    CHECK(strstr(P.err, "head") != NULL);
    n = (size_t)snprintf(big, sizeof big,
                         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n");
    while (n < SRV_HC_MAX_HEAD + 100)
        n += (size_t)snprintf(big + n, sizeof big - n, "X-Pad: 0123456789abcdef\r\n");
    CHECK_INT_EQ(parse(big, n, 0, 0, 64, NULL), SRV_HC_ETOOBIG);
    CHECK(strstr(P.err, "trailers") != NULL);
}

TEST(test_callbacks_stop)
{
    memset(&G, 0, sizeof G);
    G.stop_at_head = 1;
    srv_hc_parser_init(&P, 1 << 20, on_head, on_body, &G);
    const char *r = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab";
    CHECK_INT_EQ(srv_hc_parser_feed(&P, r, strlen(r)), SRV_HC_ESTOP);
    CHECK_INT_EQ(G.len, 0);
    /* no callbacks at all is allowed */
    srv_hc_parser_init(&P, 1 << 20, NULL, NULL, NULL);
    CHECK_INT_EQ(srv_hc_parser_feed(&P, r, strlen(r)), (int64_t)strlen(r));
    CHECK(srv_hc_parser_done(&P));
    CHECK_STR_EQ(srv_hc_strerror(SRV_HC_ETOOBIG), "response over a size limit");
    CHECK_STR_EQ(srv_hc_strerror(0), "success");
}

/* Seeded mutations of valid responses (bytes replaced, inserted, deleted,
 * cut), fed in random pieces: each must end in success or an error code,
 * within its bounds (ASan and UBSan check the rest under make asan). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

TEST(test_random_mutations)
{
    static const char *seeds[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: a/b\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\nT: "
        "1\r\n\r\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 NF\r\n\r\n{\"error\":1}",
    };
    static const char alphabet[] = "\r\n:; 0123456789abcdefHTTP/1.\x00\xff";
    char buf[512];
    int ok = 0, errs = 0;
    for (int iter = 0; iter < 20000; iter++) {
        const char *s = seeds[rnd() % 3];
        size_t n = strlen(s);
        memcpy(buf, s, n + 1);
        int muts = 1 + (int)(rnd() % 4);
        for (int m = 0; m < muts; m++) {
            size_t at = n ? rnd() % n : 0;
            char c = alphabet[rnd() % (sizeof alphabet - 1)];
            switch (rnd() % 4) {
            case 0: buf[at] = c; break;
            case 1:
                if (n < sizeof buf - 1) {
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = c;
                    n++;
                }
                break;
            case 2:
                if (n) {
                    memmove(buf + at, buf + at + 1, n - at - 1);
                    n--;
                }
                break;
            default: n = at; break;
            }
        }
        int rc = parse(buf, n, 1 + rnd() % 9, (int)(rnd() % 2), 16, NULL);
        if (rc == 0) {
            ok++;
            CHECK(G.len <= 16);
        } else {
            errs++;
            CHECK(rc == SRV_HC_EPROTO || rc == SRV_HC_ETOOBIG);
            CHECK(P.err[0] != '\0');
        }
    }
    CHECK(ok > 0 && errs > 0); /* both outcomes were exercised */
}

/* ---- SSE ---------------------------------------------------------------- */

typedef struct events {
    char all[4096]; /* events joined with '|' */
    size_t len;
    int n, stop_after;
} events_t;

static int on_event(void *ud, const char *d, size_t n)
{
    events_t *e = ud;
    CHECK(d[n] == '\0');
    if (e->len + n + 1 < sizeof e->all) {
        memcpy(e->all + e->len, d, n);
        e->len += n;
        e->all[e->len++] = '|';
        e->all[e->len] = '\0';
    }
    e->n++;
    return e->stop_after && e->n >= e->stop_after;
}

TEST(test_sse_split_anywhere)
{
    const char *streams[] = {
        "data: {\"a\":1}\n\n: ping\n\ndata:x\ndata: y\n\nevent: e\nid: 3\n\ndata\n\n"
        "data: [DONE]\n\ndata: cut",
        "data: {\"a\":1}\r\n\r\n: ping\r\n\r\ndata:x\r\ndata: y\r\n\r\nevent: e\r\nid: 3\r\n\r\n"
        "data\r\n\r\ndata: [DONE]\r\n\r\ndata: cut",
        "data: {\"a\":1}\r\r: ping\r\rdata:x\rdata: y\r\revent: e\rid: 3\r\rdata\r\r"
        "data: [DONE]\r\rdata: cut",
    };
    const char *want = "{\"a\":1}|x\ny||[DONE]|";
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(streams[k]);
        for (size_t cut = 0; cut <= n; cut++) {
            events_t e = {0};
            srv_sse_t s;
            CHECK_INT_EQ(srv_sse_init(&s, 64, on_event, &e), 0);
            CHECK_INT_EQ(srv_sse_feed(&s, streams[k], cut), 0);
            CHECK_INT_EQ(srv_sse_feed(&s, streams[k] + cut, n - cut), 0);
            CHECK_MSG(strcmp(e.all, want) == 0, "stream %d cut %zu: '%s'", k, cut, e.all);
            srv_sse_free(&s);
        }
    }
    /* byte by byte, with a data value that keeps its second space */
    events_t e = {0};
    srv_sse_t s;
    srv_sse_init(&s, 64, on_event, &e);
    const char *t = "data:  two spaces\n\n";
    for (size_t i = 0; t[i]; i++)
        CHECK_INT_EQ(srv_sse_feed(&s, t + i, 1), 0);
    CHECK_STR_EQ(e.all, " two spaces|");
    srv_sse_free(&s);
    srv_sse_free(NULL);
}

TEST(test_sse_bounds_and_stop)
{
    events_t e = {0};
    srv_sse_t s;
    CHECK_INT_EQ(srv_sse_init(&s, 0, on_event, &e), SRV_HC_EINVAL);
    /* a line over the bound */
    CHECK_INT_EQ(srv_sse_init(&s, 12, on_event, &e), 0);
    CHECK_INT_EQ(srv_sse_feed(&s, ": 1234567890123\n", 16), SRV_HC_ETOOBIG);
    CHECK(strstr(s.err, "line") != NULL);
    CHECK_INT_EQ(srv_sse_feed(&s, "\n", 1), SRV_HC_ETOOBIG); /* stays failed */
    srv_sse_free(&s);
    /* an event over the bound, each line within it */
    CHECK_INT_EQ(srv_sse_init(&s, 12, on_event, &e), 0);
    CHECK_INT_EQ(srv_sse_feed(&s, "data: 1234\ndata: 5678\n", 22), 0);
    CHECK_INT_EQ(srv_sse_feed(&s, "data: 9abc\n", 11), SRV_HC_ETOOBIG);
    CHECK(strstr(s.err, "event") != NULL);
    CHECK_INT_EQ(e.n, 0);
    srv_sse_free(&s);
    /* the callback stops the stream */
    events_t stop = {.stop_after = 1};
    CHECK_INT_EQ(srv_sse_init(&s, 64, on_event, &stop), 0);
    CHECK_INT_EQ(srv_sse_feed(&s, "data: a\n\ndata: b\n\n", 18), SRV_HC_ESTOP);
    CHECK_INT_EQ(stop.n, 1);
    srv_sse_free(&s);
}

/* ---- URLs --------------------------------------------------------------- */

TEST(test_url_parse)
{
    srv_hc_url_t u;
    char err[256];
    CHECK_INT_EQ(srv_hc_url_parse("http://127.0.0.1:8080", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "127.0.0.1");
    CHECK_STR_EQ(u.port, "8080");
    CHECK_STR_EQ(u.base, "");
    CHECK_INT_EQ(srv_hc_url_parse("http://example.org/api/", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "example.org");
    CHECK_STR_EQ(u.port, "80");
    CHECK_STR_EQ(u.base, "/api");
    CHECK_INT_EQ(srv_hc_url_parse("http://[::1]:9/x", &u, err, sizeof err), 0);
    CHECK_STR_EQ(u.host, "::1");
    CHECK(u.ipv6_literal);
    CHECK_STR_EQ(u.port, "9");
    CHECK_STR_EQ(u.base, "/x");
    const char *bad[] = {"https://h",  "h:80",           "http://",     "http://:80",
                         "http://h:0", "http://h:65536", "http://h:x",  "http://[::1",
                         "http://h?q", "http://h/a b",   "http://u@h/", "http://h:80x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        CHECK_MSG(srv_hc_url_parse(bad[i], &u, err, sizeof err) == SRV_HC_EINVAL, "%s", bad[i]);
        CHECK_MSG(err[0] != '\0', "%s", bad[i]);
    }
}

/* ---- whole requests over a loopback socket -------------------------------- */

typedef struct peer {
    int lfd;
    const char *answer; /* written after the request's head and body were read */
    char request[4096];
    size_t req_len;
} peer_t;

static void *serve_one(void *arg)
{
    peer_t *p = arg;
    int fd = accept(p->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    /* read until the head and its Content-Length body are in */
    for (;;) {
        ssize_t r = recv(fd, p->request + p->req_len, sizeof p->request - 1 - p->req_len, 0);
        if (r <= 0)
            break;
        p->req_len += (size_t)r;
        p->request[p->req_len] = '\0';
        char *end = strstr(p->request, "\r\n\r\n");
        const char *cl = strstr(p->request, "Content-Length: ");
        if (end &&
            (!cl || p->req_len >= (size_t)(end + 4 - p->request) + strtoul(cl + 16, NULL, 10)))
            break;
    }
    size_t n = strlen(p->answer);
    for (size_t off = 0; off < n;) { /* in small pieces, as a stream would */
        size_t k = n - off < 7 ? n - off : 7;
        ssize_t w = send(fd, p->answer + off, k, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(fd);
    return NULL;
}

static int listen_loopback(srv_hc_url_t *u)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    char url[64], err[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/base", ntohs(a.sin_port));
    if (srv_hc_url_parse(url, u, err, sizeof err) != 0)
        return -1;
    return fd;
}

TEST(test_request_roundtrip)
{
    srv_hc_url_t u;
    peer_t p = {.answer = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
                          "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "f\r\ndata: {\"a\":1}\n\n\r\n8\r\n: ping\n\n\r\n0\r\n\r\n"};
    p.lfd = listen_loopback(&u);
    CHECK(p.lfd >= 0);
    if (p.lfd < 0)
        return;
    pthread_t th;
    pthread_create(&th, NULL, serve_one, &p);
    memset(&G, 0, sizeof G);
    srv_hc_request_t rq = {.method = "POST",
                           .path = "/v1/x",
                           .bearer = "k1",
                           .content_type = "application/json",
                           .body = "{}",
                           .body_len = 2,
                           .timeout_ms = 10000,
                           .body_max = 1 << 20,
                           .on_head = on_head,
                           .on_body = on_body,
                           .ud = &G};
    char err[256] = "";
    int st = srv_hc_request(&u, &rq, err, sizeof err);
    pthread_join(th, NULL);
    close(p.lfd);
    CHECK_MSG(st == 200, "%d %s", st, err);
    CHECK_STR_EQ(G.ctype, "text/event-stream");
    CHECK_INT_EQ(G.len, 23);
    CHECK(memcmp(G.body, "data: {\"a\":1}\n\n: ping\n\n", 23) == 0);
    CHECK(strncmp(p.request, "POST /base/v1/x HTTP/1.1\r\n", 26) == 0);
    CHECK(strstr(p.request, "\r\nAuthorization: Bearer k1\r\n") != NULL);
    CHECK(strstr(p.request, "\r\nContent-Length: 2\r\n") != NULL);
    CHECK(strstr(p.request, "\r\nConnection: close\r\n") != NULL);
    CHECK(p.req_len >= 2 && memcmp(p.request + p.req_len - 2, "{}", 2) == 0);
}

TEST(test_request_errors)
{
    srv_hc_url_t u;
    char err[256];
    /* nobody listens: the port of a socket just closed */
    int fd = listen_loopback(&u);
    CHECK(fd >= 0);
    close(fd);
    memset(&G, 0, sizeof G);
    srv_hc_request_t rq = {.method = "GET",
                           .path = "/health",
                           .timeout_ms = 5000,
                           .body_max = 1024,
                           .on_body = on_body,
                           .ud = &G};
    CHECK_INT_EQ(srv_hc_request(&u, &rq, err, sizeof err), SRV_HC_ECONNECT);
    CHECK_MSG(strstr(err, "cannot connect to 127.0.0.1:") && strstr(err, "refused"), "%s", err);
    /* header injection is refused before connecting */
    srv_hc_request_t bad = rq;
    bad.path = "/x\r\nEvil: 1";
    CHECK_INT_EQ(srv_hc_request(&u, &bad, err, sizeof err), SRV_HC_EINVAL);
    bad = rq;
    bad.bearer = "k\n";
    CHECK_INT_EQ(srv_hc_request(&u, &bad, err, sizeof err), SRV_HC_EINVAL);
    /* a cut answer and a garbage answer are errors with the parser's message */
    const char *answers[] = {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                             "SSH-2.0-OpenSSH_9.2\r\n\r\n"};
    const char *words[] = {"before the end", "status line"};
    for (int i = 0; i < 2; i++) {
        peer_t p = {.answer = answers[i]};
        p.lfd = listen_loopback(&u);
        pthread_t th;
        pthread_create(&th, NULL, serve_one, &p);
        int rc = srv_hc_request(&u, &rq, err, sizeof err);
        pthread_join(th, NULL);
        close(p.lfd);
        CHECK_INT_EQ(rc, SRV_HC_EPROTO);
        CHECK_MSG(strstr(err, words[i]) != NULL, "%s", err);
    }
    /* a cancel flag already set stops the request at once */
    volatile sig_atomic_t cancel = 1;
    peer_t p = {.answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"};
    p.lfd = listen_loopback(&u);
    srv_hc_request_t rc_rq = rq;
    rc_rq.cancel = &cancel;
    CHECK_INT_EQ(srv_hc_request(&u, &rc_rq, err, sizeof err), SRV_HC_ECANCELED);
    close(p.lfd);
}

int main(void)
{
    RUN(test_content_length);
    RUN(test_chunked_every_split);
    RUN(test_interim_and_close_framed);
    RUN(test_malformed);
    RUN(test_bounds);
    RUN(test_callbacks_stop);
    RUN(test_random_mutations);
    RUN(test_sse_split_anywhere);
    RUN(test_sse_bounds_and_stop);
    RUN(test_url_parse);
    RUN(test_request_roundtrip);
    RUN(test_request_errors);
    return CHECK_DONE();
}
