/* server/cli/http_client.h — a small HTTP/1.1 client over POSIX sockets, for the
 * command-line tools that talk to a running server (`darkserve chat`).
 *
 * It is not part of the serving path and knows nothing of the server around
 * it: no JSON, no sessions, no logging. Three pieces, each usable alone:
 *
 *   srv_hc_parser_*  a push parser for one response: status line, headers,
 *                    and a body framed by Content-Length, chunked transfer
 *                    encoding, or the end of the connection; interim 1xx
 *                    answers are skipped. Body bytes go to a callback as
 *                    they arrive (no buffering), so streams work.
 *                    srv_hc_request reads every answer through it.
 *   srv_sse_*        a push parser for a text/event-stream body: "data:"
 *                    lines joined into one event per blank line; comments
 *                    (": ping") and other fields ignored.
 *   srv_hc_request   one request on a fresh connection (Connection: close):
 *                    connect, send a Content-Length body, read the answer
 *                    through the parser, with an inactivity timeout and a
 *                    cancel flag a signal handler may set.
 *
 * Every size is bounded: the header block, chunk-size lines, the body
 * (caller's bound) and one SSE event. Malformed input is an error with a
 * message, never a crash or an unbounded allocation.
 *
 * Errors are negative codes from SRV_HC_ERRNO_MAP with a message in a
 * caller's buffer or the parser's err field.
 */
#ifndef DARKSERVE_SERVER_HTTP_CLIENT_H
#define DARKSERVE_SERVER_HTTP_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* X(name, value, description) */
#define SRV_HC_ERRNO_MAP(X)                                                                        \
    X(SRV_HC_EPROTO, -601, "malformed HTTP response")                                              \
    X(SRV_HC_ETOOBIG, -602, "response over a size limit")                                          \
    X(SRV_HC_ECONNECT, -603, "cannot connect")                                                     \
    X(SRV_HC_EIO, -604, "connection error")                                                        \
    X(SRV_HC_ETIMEDOUT, -605, "timed out")                                                         \
    X(SRV_HC_ECANCELED, -606, "interrupted")                                                       \
    X(SRV_HC_ENOMEM, -607, "out of memory")                                                        \
    X(SRV_HC_EINVAL, -608, "invalid argument")                                                     \
    X(SRV_HC_ESTOP, -609, "stopped by the caller")

enum srv_hc_errno {
#define SRV_HC_ERR_ENUM_(name, val, desc) name = val,
    SRV_HC_ERRNO_MAP(SRV_HC_ERR_ENUM_)
#undef SRV_HC_ERR_ENUM_
};

/* A static description of an error code (0 = "success"). */
const char *srv_hc_strerror(int code);

/* The status line and headers together, and each chunk-size line. */
#define SRV_HC_MAX_HEAD (32 * 1024)
#define SRV_HC_MAX_CHUNK_LINE 256

/* ---- response parser ---------------------------------------------------- */

/* Called once per response, when the final (non-1xx) head is complete.
 * content_type is borrowed for the call ("" when absent). Return 0 to go on,
 * anything else to stop the parse (feed then returns SRV_HC_ESTOP). */
typedef int (*srv_hc_head_fn)(void *ud, int status, const char *content_type);
/* Called with each piece of body (borrowed for the call), in order. Same
 * return convention. */
typedef int (*srv_hc_body_fn)(void *ud, const char *data, size_t len);

typedef struct srv_hc_parser {
    /* results, valid once the head is complete */
    int status;
    char content_type[128];
    int64_t content_length; /* -1: none */
    int chunked;
    /* private */
    int state;
    char head[SRV_HC_MAX_HEAD];
    size_t head_len;
    size_t line_start; /* where the head's current line begins */
    char line[SRV_HC_MAX_CHUNK_LINE];
    size_t line_len;
    uint64_t chunk_left;
    uint64_t body_seen, body_max;
    srv_hc_head_fn on_head;
    srv_hc_body_fn on_body;
    void *ud;
    char err[160]; /* what went wrong, after an error */
} srv_hc_parser_t;

/* Prepares p (caller-owned, about 33 KB: do not put it on a small stack) for
 * one response whose body may have at most body_max bytes. Either callback
 * may be NULL; ud is passed to both. */
void srv_hc_parser_init(srv_hc_parser_t *p, uint64_t body_max, srv_hc_head_fn on_head,
                        srv_hc_body_fn on_body, void *ud);

/* Feeds n bytes received from the connection. Returns the number of bytes
 * consumed (less than n only when the response ended inside buf: the rest
 * belongs to no response of ours), or a negative code with p->err set.
 * After an error the parser stays failed. */
int64_t srv_hc_parser_feed(srv_hc_parser_t *p, const char *buf, size_t n);

/* The connection was closed by the peer. Returns 0 when that ends a complete
 * response (a body framed by the end of the connection, or one already
 * complete), SRV_HC_EPROTO with p->err set when the response was cut. */
int srv_hc_parser_eof(srv_hc_parser_t *p);

/* 1 once the whole response (head and body) has been parsed. */
int srv_hc_parser_done(const srv_hc_parser_t *p);

/* ---- server-sent events ------------------------------------------------- */

/* One complete event: its data lines joined with "\n" (data is NUL-terminated
 * at data[len], borrowed for the call). Return 0 to go on, anything else to
 * stop (srv_sse_feed then returns SRV_HC_ESTOP). */
typedef int (*srv_sse_event_fn)(void *ud, const char *data, size_t len);

typedef struct srv_sse {
    char *line; /* the line being read; owned */
    size_t line_len, line_cap;
    char *data; /* the event's data so far, each line ending in "\n"; owned */
    size_t data_len, data_cap;
    size_t max; /* bound of one line and of one event's data */
    int has_data;
    int after_cr; /* the previous byte ended a line with CR: a LF now is part of it */
    int failed;
    srv_sse_event_fn on_event;
    void *ud;
    char err[160];
} srv_sse_t;

/* Prepares s for a stream whose lines and events have at most max bytes
 * (1 <= max <= 1 GiB). Returns 0 or SRV_HC_ENOMEM / SRV_HC_EINVAL. */
int srv_sse_init(srv_sse_t *s, size_t max, srv_sse_event_fn on_event, void *ud);
/* Frees the buffers; s may then be initialized again. NULL is a no-op. */
void srv_sse_free(srv_sse_t *s);
/* Feeds n bytes of the body. Returns 0, SRV_HC_ETOOBIG (a line or an event
 * over max, with s->err set) or SRV_HC_ESTOP. An event still open when the
 * stream ends is dropped, as the SSE specification says. */
int srv_sse_feed(srv_sse_t *s, const char *buf, size_t n);

/* ---- requests ----------------------------------------------------------- */

/* http://HOST[:PORT][/BASE]: HOST a name, an IPv4 address or [IPv6]; PORT
 * defaults to 80; BASE (no trailing slash) prefixes every request path. */
typedef struct srv_hc_url {
    char host[256]; /* without brackets */
    char port[8];
    char base[512];
    int ipv6_literal;
} srv_hc_url_t;

/* Parses url into u. Returns 0, or SRV_HC_EINVAL with a message in err. */
int srv_hc_url_parse(const char *url, srv_hc_url_t *u, char *err, size_t errlen);

typedef struct srv_hc_request {
    const char *method;       /* "GET", "POST", … */
    const char *path;         /* appended to the URL's base; starts with '/' */
    const char *bearer;       /* Authorization: Bearer value, or NULL */
    const char *content_type; /* with a body; NULL = no Content-Type */
    const void *body;         /* borrowed; body_len bytes, sent with Content-Length */
    size_t body_len;
    int timeout_ms;    /* longest wait for the connection, one write or one read;
                          <= 0: 30 s */
    uint64_t body_max; /* largest response body accepted */
    /* when set (by a signal handler, say) the request stops with
     * SRV_HC_ECANCELED within ~100 ms; NULL = never */
    volatile sig_atomic_t *cancel;
    srv_hc_head_fn on_head;
    srv_hc_body_fn on_body;
    void *ud;
} srv_hc_request_t;

/* Runs one request on a new connection to u and reads the whole answer,
 * passing it to rq's callbacks. Returns the final HTTP status (100..599), or
 * a negative code with a message in err ("cannot connect to 127.0.0.1:8080:
 * Connection refused"). */
int srv_hc_request(const srv_hc_url_t *u, const srv_hc_request_t *rq, char *err, size_t errlen);

/* A growable byte buffer bounded by max, usable as an srv_hc_body_fn
 * (pass the buffer as ud): a body over max stops the request. */
typedef struct srv_hc_buf {
    char *data; /* owned; NUL-terminated after each append */
    size_t len, cap, max;
} srv_hc_buf_t;

int srv_hc_buf_append(void *buf, const char *data, size_t len);
/* Frees the data and empties b (max is kept). NULL is a no-op. */
void srv_hc_buf_free(srv_hc_buf_t *b);

#endif
