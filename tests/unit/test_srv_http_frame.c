/* test_srv_http_frame.c — the framing rules of RFC 9112 as the HTTP server
 * applies them (server/http/http_frame.c), without a server or a socket:
 * raw request heads as the front door reads them, header lists as the
 * request hook sees them, and request targets. Each case names the answer
 * due (0 = acceptable). */
#include "server/http/http_impl.h"
#include "tests/unit/check.h"

#include <string.h>

typedef struct head_case {
    const char *name;
    const char *bytes; /* NUL-free unless len is given */
    size_t len;        /* 0 = strlen(bytes) */
    int complete;      /* srv_http_head_scan's answer */
    int status;        /* the verdict when complete */
} head_case_t;

#define H11 "POST /x HTTP/1.1\r\nHost: h\r\n"

static const head_case_t heads[] = {
    {"plain GET", "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0, 1, 0},
    {"bare LF lines", "GET / HTTP/1.1\nHost: h\n\n", 0, 1, 0},
    {"leading empty lines", "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 0, 1, 0},
    {"HTTP/1.0 without Host", "GET / HTTP/1.0\r\n\r\n", 0, 1, 0},
    {"incomplete", "GET / HTTP/1.1\r\nHost: h\r\nX-Half: ", 0, 0, 0},
    {"body length", H11 "Content-Length: 5\r\n\r\nhello", 0, 1, 0},
    {"chunked", H11 "Transfer-Encoding: chunked\r\n\r\n", 0, 1, 0},
    {"chunked in capitals", H11 "Transfer-Encoding: CHUNKED\r\n\r\n", 0, 1, 0},
    {"same Content-Length twice", H11 "Content-Length: 2\r\nContent-Length: 2\r\n\r\n", 0, 1, 0},
    /* smuggling: both framings */
    {"CL and TE", H11 "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 1, 400},
    {"TE and CL", H11 "Transfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n", 0, 1, 400},
    {"two Content-Lengths", H11 "Content-Length: 2\r\nContent-Length: 20\r\n\r\n", 0, 1, 400},
    {"Content-Length list", H11 "Content-Length: 5, 5\r\n\r\n", 0, 1, 400},
    {"Content-Length -1", H11 "Content-Length: -1\r\n\r\n", 0, 1, 400},
    {"Content-Length abc", H11 "Content-Length: abc\r\n\r\n", 0, 1, 400},
    {"Content-Length +5", H11 "Content-Length: +5\r\n\r\n", 0, 1, 400},
    {"Content-Length trailing space", H11 "Content-Length: 5 \r\n\r\n", 0, 1, 400},
    {"Content-Length empty", H11 "Content-Length:\r\n\r\n", 0, 1, 400},
    {"Content-Length 2^64", H11 "Content-Length: 18446744073709551616\r\n\r\n", 0, 1, 413},
    {"Content-Length 2^64-1", H11 "Content-Length: 18446744073709551615\r\n\r\n", 0, 1, 0},
    {"space before colon", H11 "Transfer-Encoding : chunked\r\n\r\n", 0, 1, 400},
    {"tab before colon", H11 "Content-Length\t: 1\r\n\r\n", 0, 1, 400},
    {"name not a token", H11 "X(y): 1\r\n\r\n", 0, 1, 400},
    {"no colon", H11 "Nothing here\r\n\r\n", 0, 1, 400},
    {"obs-fold", H11 "X-A: one\r\n two\r\n\r\n", 0, 1, 400},
    {"NUL in a value", H11 "X-A: a\0b\r\n\r\n", sizeof(H11 "X-A: a\0b\r\n\r\n") - 1, 1, 400},
    {"bare CR in a value", H11 "X-A: a\rb\r\n\r\n", 0, 1, 400},
    {"control byte in a value", H11 "X-A: a\x01" "b\r\n\r\n", 0, 1, 400},
    {"tab in a value", H11 "X-A: a\tb\r\n\r\n", 0, 1, 0},
    {"obs-text in a value", H11 "X-A: caf\xc3\xa9\r\n\r\n", 0, 1, 0},
    {"HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", 0, 1, 400},
    {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 0, 1, 400},
    {"two Hosts on 1.0", "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 0, 1, 400},
    {"xchunked", H11 "Transfer-Encoding: xchunked\r\n\r\n", 0, 1, 501},
    {"gzip, chunked", H11 "Transfer-Encoding: gzip, chunked\r\n\r\n", 0, 1, 501},
    {"chunked, chunked", H11 "Transfer-Encoding: chunked, chunked\r\n\r\n", 0, 1, 400},
    {"chunked and space", H11 "Transfer-Encoding: chunked \r\n\r\n", 0, 1, 400},
    {"two TE headers", H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
     0, 1, 400},
    {"TE on HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 1, 400},
    {"HTTP/2.0", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 0, 1, 505},
    {"HTTP/0.9", "GET /\r\n\r\n", 0, 1, 400},
    {"two spaces", "GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 0, 1, 400},
    {"control byte in the target", "GET /a\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 0, 1, 400},
    {"lowercase version", "GET / http/1.1\r\nHost: h\r\n\r\n", 0, 1, 400},
};

TEST(test_heads)
{
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        const head_case_t *c = &heads[i];
        size_t n = c->len ? c->len : strlen(c->bytes);
        srv_http_head_t hd;
        int done = srv_http_head_scan(c->bytes, n, HEAD_MAX, &hd);
        CHECK_MSG(done == c->complete, "%s: complete %d, want %d", c->name, done, c->complete);
        if (done && c->complete)
            CHECK_MSG(hd.frame.status == c->status, "%s: status %d (%s), want %d", c->name,
                      hd.frame.status, hd.frame.msg, c->status);
        if (done && hd.frame.status)
            CHECK_MSG(hd.frame.code && hd.frame.msg[0], "%s: no code or message", c->name);
    }
}

TEST(test_head_parts)
{
    const char *req = "\r\nPOST /v1/a%20b?q=1 HTTP/1.1\r\nHost: h\r\nX-Request-Id: abc-1\r\n"
                      "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\nrest";
    srv_http_head_t hd;
    CHECK_INT_EQ(srv_http_head_scan(req, strlen(req), HEAD_MAX, &hd), 1);
    CHECK_INT_EQ(hd.frame.status, 0);
    CHECK(strcmp(hd.method, "POST") == 0);
    CHECK(hd.target_len == strlen("/v1/a%20b?q=1") &&
          memcmp(req + hd.target_off, "/v1/a%20b?q=1", hd.target_len) == 0);
    CHECK(strcmp(hd.req_id, "abc-1") == 0);
    CHECK(hd.frame.te_chunked && hd.frame.has_body);
    /* the first chunk's size came along: beyond 64 bits reads as the most */
    CHECK(hd.first_chunk_known && hd.first_chunk == UINT64_MAX);
    CHECK(strncmp(req + hd.head_len, "FFFF", 4) == 0);
    const char *req2 = H11 "Transfer-Encoding: chunked\r\n\r\n1a;ext=1\r\n";
    CHECK_INT_EQ(srv_http_head_scan(req2, strlen(req2), HEAD_MAX, &hd), 1);
    CHECK(hd.first_chunk_known && hd.first_chunk == 0x1a);
    const char *req3 = H11 "Transfer-Encoding: chunked\r\n\r\n1a";
    CHECK_INT_EQ(srv_http_head_scan(req3, strlen(req3), HEAD_MAX, &hd), 1);
    CHECK(!hd.first_chunk_known); /* its line is not whole yet */
}

TEST(test_head_too_large)
{
    static char big[HEAD_MAX + 100];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX-Big: ", 23);
    srv_http_head_t hd;
    /* not whole yet, but already past what the door reads: 431 */
    CHECK_INT_EQ(srv_http_head_scan(big, sizeof big, HEAD_MAX, &hd), 1);
    CHECK_INT_EQ(hd.frame.status, 431);
    /* below the bound it waits for more */
    CHECK_INT_EQ(srv_http_head_scan(big, HEAD_MAX - 10, HEAD_MAX, &hd), 0);
}

/* The request hook's view: fields one by one, as libmicrohttpd lists them
 * (it keeps whitespace before the colon in the name). */
TEST(test_fields)
{
    srv_http_frame_t f;
    srv_http_frame_init(&f, 1);
    srv_http_frame_field(&f, "Host", 4, "h", 1);
    srv_http_frame_field(&f, "Transfer-Encoding ", 18, "chunked", 7);
    srv_http_frame_finish(&f);
    CHECK_INT_EQ(f.status, 400);
    CHECK(f.n_te == 0); /* not the framing header: its name has a space */

    srv_http_frame_init(&f, 1);
    srv_http_frame_field(&f, "Host", 4, "h", 1);
    srv_http_frame_field(&f, "X-A", 3, "a\rb", 3);
    srv_http_frame_finish(&f);
    CHECK_INT_EQ(f.status, 400);

    srv_http_frame_init(&f, 1);
    f.need_host = 0; /* an injected request */
    srv_http_frame_field(&f, "Content-Length", 14, "12", 2);
    srv_http_frame_finish(&f);
    CHECK_INT_EQ(f.status, 0);
    CHECK(f.has_body && f.clen == 12);

    srv_http_frame_init(&f, 1);
    srv_http_frame_field(&f, "host", 4, "h", 1);
    srv_http_frame_field(&f, "content-length", 14, "0", 1);
    srv_http_frame_finish(&f);
    CHECK_INT_EQ(f.status, 0);
    CHECK(!f.has_body);

    /* the first problem is the one named */
    srv_http_frame_init(&f, 1);
    srv_http_frame_field(&f, "Host", 4, "h", 1);
    srv_http_frame_field(&f, "Transfer-Encoding", 17, "\"x\\", 3);
    srv_http_frame_finish(&f);
    CHECK_INT_EQ(f.status, 501);
    CHECK(strstr(f.msg, "\"x\\") != NULL); /* the caller escapes it into JSON */
}

TEST(test_targets)
{
    static const char *const ok[] = {"/", "/v1/models", "/v1/a%20b", "/x?y=%0A", "/x?y=%7F",
                                     "/%2", "/%zz", "/a?b=%2", "/a?b=%2F"};
    static const char *const bad[] = {"/v1/models%00junk", "/v1/sessions/abc%00/state",
                                      "/a%0a", "/a%0D", "/a%7f", "/a%1F", "/a\x01", "/a?b=%00",
                                      "/a%00?b=1", "/v1/sessions/x%2Fstate", "/a%2f"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK_MSG(srv_http_target_check(ok[i], strlen(ok[i])) == 0, "%s", ok[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(srv_http_target_check(bad[i], strlen(bad[i])) == -1, "%s", bad[i]);
}

int main(void)
{
    RUN(test_heads);
    RUN(test_head_parts);
    RUN(test_head_too_large);
    RUN(test_fields);
    RUN(test_targets);
    return CHECK_DONE();
}
