/* server/http/http_test.h — for tests and fuzz targets only: the parts of the
 * HTTP front end (server/http/http.h) that no production code calls.
 *
 * Requests without a connection (srv_http_inject) let a unit test or a fuzz
 * target drive the whole request path with no socket. The stream functions
 * below let a test's producer thread watch a stream directly; the server's
 * own producers learn the same through the callbacks instead (on_cancel, and
 * SRV_HTTP_EAGAIN then on_writable), and answer deferred requests with
 * srv_stream_reply / srv_stream_reply_take / srv_stream_rerun.
 *
 * Implemented in server/http/http.c and server/http/http_stream.c; nothing under
 * server/ other than those two includes this header.
 */
#ifndef DARKSERVE_SERVER_HTTP_TEST_H
#define DARKSERVE_SERVER_HTTP_TEST_H

#include <stddef.h>

#include "server/http/http.h"

/* ---- streams, for test producers ---- */

/* Any thread. Turns a deferred stream into a streamed response with this
 * status; then srv_stream_write as usual. */
int srv_stream_begin(srv_stream_t *s, int status, const char *content_type);

/* Any thread. Bytes that can be written now without SRV_HTTP_EAGAIN. */
size_t srv_stream_space(srv_stream_t *s);

/* Any thread. Blocks (never on the loop thread, nor in a stream callback!)
 * until at least `need` bytes can be written, the stream is cancelled, or
 * timeout_ms passes (< 0 = no timeout). Returns 0, SRV_HTTP_ECANCELED or
 * SRV_HTTP_ETIMEDOUT. */
int srv_stream_wait_writable(srv_stream_t *s, size_t need, int timeout_ms);

/* Any thread. 1 once the client went away or the server is stopping (writes
 * then fail with SRV_HTTP_ECANCELED). */
int srv_stream_cancelled(srv_stream_t *s);

/* ---- requests without a connection ----
 * srv_http_inject runs one request through exactly what a connection's
 * request goes through (request id, the checks of "How a request is
 * processed", the route table, the handler, deferred and streamed answers,
 * the access line and metrics), with no socket: the answer is collected in
 * a srv_http_result_t. The url is as on the wire (path percent-encoded,
 * optional ?query); headers are used as given (Content-Length and
 * Transfer-Encoding decide whether the request has a body, as for a
 * connection: keep them consistent with body_len; the body is delivered
 * whole, as a chunked one would be once decoded). What a connection adds
 * is absent: no peer address ("inject"), no timeouts, no hang-up, no front
 * door (http_gate.c), HTTP/1.1. A server made with opts.no_listen takes
 * requests only this way. */

typedef struct srv_http_inject {
    const char *method;         /* "GET", ... */
    const char *url;            /* "/v1/sessions?limit=2" */
    const char *const *headers; /* [2 * n_headers]: name, value, name, value... (borrowed) */
    size_t n_headers;
    const void *body; /* [body_len] (borrowed), NULL when body_len is 0 */
    size_t body_len;
} srv_http_inject_t;

typedef struct srv_http_result {
    int done;           /* the request ended (the fields below are final) */
    int cut;            /* it ended without a whole answer (stream aborted, cancelled) */
    int status;         /* 0 until answered */
    char *content_type; /* owned, NULL = none */
    char *headers;      /* owned "Name: value\n" lines of the answer, NULL = none */
    char *body;         /* owned [body_len] + NUL, NULL when empty */
    size_t body_len;
    int oom; /* part of the answer was lost to an allocation failure */
} srv_http_result_t;

/* Starts an injected request (loop thread; not from inside a handler or a
 * stream callback). *out (caller-owned) must stay valid until out->done:
 * an immediate answer completes before this returns, a deferred or
 * streamed one as the loop runs (uv_run), and srv_http_close completes
 * whatever is left (cut). Returns 0, or SRV_HTTP_EINVAL (a header name that
 * is empty or holds a colon, CR or LF, a value with LF, a closing server) /
 * SRV_HTTP_ENOMEM, when nothing was started. A name that is not a token, a
 * bare CR in a value, framing headers that disagree (a Content-Length other
 * than body_len, one with Transfer-Encoding, two values...) reach the
 * request hook's framing rules and are answered there, as on a connection;
 * only the Host rule is left out (no connection to name). */
int srv_http_inject(srv_http_t *h, const srv_http_inject_t *in, srv_http_result_t *out);
/* Frees what a result owns (not r itself); r is zeroed. NULL is a no-op. */
void srv_http_result_free(srv_http_result_t *r);

#endif
