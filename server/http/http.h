/* server/http/http.h — HTTP front end: libmicrohttpd driven by a libuv loop, a
 * routing table, and streamed responses fed from any thread.
 *
 * This module knows HTTP and nothing about models, sessions or JSON schemas:
 * handlers registered by the rest of the server do the work.
 *
 * ## Threads
 * Everything here runs on the thread that runs the uv loop ("loop thread"),
 * except the srv_stream_* producer functions marked "any thread". Handlers
 * are called on the loop thread and must not block: hand long work to
 * another thread (the scheduler) and answer through a stream.
 *
 * ## How a request is processed
 * 1. Headers arrive. The server assigns a request id (the client's
 *    X-Request-Id if it is 1..64 characters of [A-Za-z0-9._:-], else a fresh
 *    one) that every response carries in X-Request-Id and every log line
 *    about the request shows.
 * 2. Checks, in this order, each answering with a JSON error object
 *    {"error":{"message","type","param","code"}}:
 *      framing (RFC 9112): Content-Length with Transfer-Encoding, two
 *      different or malformed Content-Lengths, whitespace before a colon,
 *      Host missing (HTTP/1.1) or twice, a control byte in a value
 *                                        -> 400, Connection: close; a coding
 *                                           other than chunked -> 501; a
 *                                           Content-Length past 64 bits -> 413
 *      a control byte in the path, raw or %-encoded, %2F in the path, or
 *      %00 in the query
 *                                        -> 400
 *      draining (srv_http_drain)         -> 503 (routes without SRV_ROUTE_DRAIN_OK)
 *      API key missing or wrong          -> 401 when keys are configured, before
 *                                           404/405 so that unauthenticated
 *                                           clients cannot map the routes; not
 *                                           for paths with a SRV_ROUTE_PUBLIC
 *                                           route, nor OPTIONS on a known path
 *      no route for the path             -> 404
 *      OPTIONS                           -> 204 CORS preflight / Allow (no auth)
 *      path known, method not            -> 405 with an Allow header
 *      body whose Content-Type is not application/json on a SRV_ROUTE_JSON
 *      route                             -> 415
 *      Content-Length above the limit    -> 413 (before the body is read)
 *      a body that may pass 1 MiB while max_uploads such bodies arrive
 *                                        -> 429 (Retry-After: 1)
 * 3. The body is accumulated (bounded by the route's limit; past 1 MiB in a
 *    temporary file in opts.upload_dir, mapped read-only once whole: its
 *    pages are the page cache's, not a copy in the heap)
 *    and the handler is called once, with the complete body. A chunked body
 *    that passes the limit is answered with 413 at once, in its middle, and
 *    the connection closes.
 * 4. Before returning, the handler must do exactly one of:
 *      srv_reply / srv_reply_json / srv_reply_error   answer now;
 *      srv_stream_open                                start a streamed answer
 *                                                     (status and headers sent now);
 *      srv_stream_defer                               answer later from any thread
 *                                                     (srv_stream_reply,
 *                                                     srv_stream_reply_take or
 *                                                     srv_stream_rerun).
 *    Returning without any of them is a bug, answered with 500.
 * 5. When the request ends (response sent, client gone, timeout, shutdown) an
 *    access-log line is written and the metrics are updated
 *    (darkserve_http_requests_total{method,route,code},
 *    darkserve_http_request_duration_seconds{route}, in-flight requests, open
 *    connections, stream cancels, request timeouts) when opts.metrics is set.
 * The first request of a connection is read by the server's front door
 * before libmicrohttpd (server/http/http_gate.c): its head is judged on the
 * raw bytes (a NUL in a value, a folded line, a Content-Length
 * libmicrohttpd could not parse, a first chunk size past the route's limit,
 * a head over 16 KiB -> 400/413/431) and answered there, with an access
 * line. Responses that libmicrohttpd writes by itself (a malformed request
 * line, a malformed Content-Length on a later request of a kept-alive
 * connection, headers over its 32 KiB per-connection memory) carry no
 * request id and produce no access line.
 *
 * Connections: keep-alive is kept for bodiless requests answered with an
 * error; after an early answer to a request *with* a body (413, 415, 401...)
 * the connection closes, since the unread body is still on the wire, and
 * lingers a moment (what still comes is read and dropped) so the client
 * reads the answer rather than a reset. max_connections bounds the
 * connections libmicrohttpd serves (suspended ones too) and, separately,
 * those waiting at the door for their first request's head or for a slot:
 * when that waiting room is full, the oldest connection without a head of
 * the address holding most of them is closed (408). max_connections_per_address
 * bounds one client address's open connections: at the bound its idle
 * kept-alive connections are closed for a new one, and when none is idle
 * the new one gets 429 (too_many_connections), so a single address cannot
 * fill max_connections. Refusals are logged (rate-limited) and counted in
 * darkserve_http_connections_refused_total{reason}. header_timeout_s bounds
 * the time a new connection may take to send its first request's headers.
 * idle_timeout_s closes a connection with no I/O (a stalled client, an idle
 * keep-alive); request_timeout_s bounds the time to receive a whole request,
 * counted from the connection's start or the end of its previous response,
 * so a client that trickles bytes is cut too. Neither applies while a
 * request waits for its producer (suspended connections do not time out).
 *
 * CORS: for an Origin listed in opts.cors_origins (or any, with "*"), every
 * response carries Access-Control-Allow-Origin, Vary: Origin and
 * Access-Control-Expose-Headers: X-Request-Id; preflights (OPTIONS with
 * Access-Control-Request-Method) get 204 with Allow-Methods, Allow-Headers
 * and Max-Age. Other origins get no CORS headers (the browser blocks them).
 *
 * ## Streams (srv_stream_t)
 * A stream is the response channel of one request, written by a producer
 * thread. Bytes written are buffered (up to max_buffered, the back-pressure
 * bound) and handed to the socket as it drains; while nothing is buffered the
 * connection is suspended and costs nothing. The producer learns that the
 * client went away (or that the server is stopping) in two ways:
 *   - writes fail with SRV_HTTP_ECANCELED;
 *   - opts.on_cancel runs once on the loop thread (optional); e.g. to mark a
 *     job cancelled so the scheduler drops it at its next step.
 * A suspended connection's socket is watched for hang-up, so a client that
 * disconnects while the producer is still thinking (long prefill) is noticed
 * at once, not at the next write. A client that half-closes its side after
 * sending the request (shutdown(SHUT_WR)) looks the same at first; the
 * server tells them apart by sending something harmless, which a closed
 * socket answers with a reset: an interim "100 Continue" while nothing of
 * the answer was sent (HTTP/1.1), or the stream's probe bytes
 * (srv_stream_opts_t.probe) once it streams. A half-closed client gets its
 * whole answer, with Connection: close. HTTP/1.0 has no harmless bytes
 * before the answer: its FIN then counts as a hang-up. Without a possible
 * probe after that (a stream without probe bytes) a closed client is
 * noticed at the next write. While bytes flow, a vanished client is noticed
 * when a write fails.
 *
 * Callbacks (on_cancel, on_writable) run on the loop thread and must not
 * block; they may call any srv_stream_* function of this header.
 *
 * A typical token producer (the scheduler thread, once per step):
 *     rc = srv_stream_write(s, sse_bytes, n);
 *     SRV_HTTP_EAGAIN: keep the event and stop writing this job's events;
 *         on_writable tells when to write it again;
 *     SRV_HTTP_ECANCELED: stop writing (on_cancel drops the job);
 *   and at the end: write the final event ("data: [DONE]\n\n" or an error
 *   event), then srv_stream_close(s, SRV_STREAM_END).
 *
 * Lifetime: the producer owns one reference, returned by srv_stream_close
 * (exactly once, from any thread, also after cancellation). No callback runs
 * after srv_stream_close has returned. Streams stay valid (writes then fail
 * with SRV_HTTP_ECANCELED) even after the server was closed, but producers
 * should close them before the server is freed for the memory to go.
 *
 * ## Lifecycle of the server
 *   srv_http_t *h = srv_http_new(loop, &opts, err, sizeof err);   binds, listens
 *   srv_http_route(h, "POST", "/v1/sessions/{id}/append", fn, ud, &ropts);
 *   uv_run(loop, UV_RUN_DEFAULT);
 *   ... on SIGTERM: srv_http_drain(h); wait until srv_http_inflight(h) == 0 or
 *   a deadline; srv_http_close(h, done_cb, ud); the loop then ends once every
 *   handle is closed and uv_loop_close(loop) returns 0.
 * server/daemon.c does exactly this; applications plug in through srv_app_t
 * (server/daemon.h) and only register routes.
 */
#ifndef DARKSERVE_SERVER_HTTP_H
#define DARKSERVE_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/base/metrics.h"

/* X(name, value, description) */
#define SRV_HTTP_ERRNO_MAP(X)                                                                  \
    X(SRV_HTTP_EINVAL, -201, "invalid argument")                                               \
    X(SRV_HTTP_ENOMEM, -202, "out of memory")                                                  \
    X(SRV_HTTP_ESTATE, -203, "not allowed in this state (already answered?)")                  \
    X(SRV_HTTP_EAGAIN, -204, "stream buffer full, wait for on_writable")                       \
    X(SRV_HTTP_ECANCELED, -205, "client gone or server stopping")                              \
    X(SRV_HTTP_ETIMEDOUT, -206, "timed out")                                                   \
    X(SRV_HTTP_ELISTEN, -207, "cannot listen")                                                 \
    X(SRV_HTTP_EMHD, -208, "libmicrohttpd refused")

enum srv_http_errno {
#define SRV_HTTP_ERR_ENUM_(name, val, desc) name = val,
    SRV_HTTP_ERRNO_MAP(SRV_HTTP_ERR_ENUM_)
#undef SRV_HTTP_ERR_ENUM_
};

typedef struct srv_http srv_http_t;
typedef struct srv_req srv_req_t;
typedef struct srv_stream srv_stream_t;

typedef struct srv_http_opts {
    const char *host;            /* listen address (numeric or name); NULL = 127.0.0.1 */
    int port;                    /* 0 = any free port (see srv_http_port) */
    size_t max_body;             /* default body limit of a route, bytes; 0 = 1 MiB */
    unsigned idle_timeout_s;     /* close connections idle this long; 0 = never */
    unsigned request_timeout_s;  /* time to receive a whole request; 0 = no limit */
    unsigned header_timeout_s;   /* time to receive the first request's headers, from the
                                    connection's start; 0 = no limit */
    unsigned max_connections;    /* 0 = 256 */
    unsigned max_connections_per_address; /* open connections of one client address; beyond
                                             it new ones are closed at once; 0 = no limit */
    size_t stream_max_buffered;  /* default per-stream bound; 0 = 256 KiB */
    unsigned max_uploads;        /* bodies over 1 MiB being received at once (each spooled
                                    to a file); beyond it 429; 0 = 2 */
    const char *upload_dir;      /* where those bodies are spooled; NULL or "" = $TMPDIR,
                                    else /tmp. Copied; must take files (checked here) */
    const char *const *api_keys; /* [n_api_keys], copied; none = no auth */
    const unsigned char *api_key_admin; /* [n_api_keys] or NULL, copied: 1 = an admin key
                                           (srv_req_key reports it; the http layer gives
                                           admin keys nothing more) */
    size_t n_api_keys;
    const char *const *cors_origins; /* [n_cors_origins], copied; "*" = any */
    size_t n_cors_origins;
    srv_metrics_t *metrics;      /* borrowed, may be NULL; must outlive the server */
    int no_listen;               /* 1: no listen socket; requests come only through
                                    srv_http_inject (server/http/http_test.h:
                                    fuzzing, tests) */
} srv_http_opts_t;

/* Creates the server on loop (borrowed; must outlive it), binds and listens.
 * Call it on the thread that will run the loop. Returns a new server, or NULL
 * with a message in err[errlen]. */
srv_http_t *srv_http_new(uv_loop_t *loop, const srv_http_opts_t *opts, char *err, size_t errlen);

/* Port actually bound (useful with port 0). */
int srv_http_port(const srv_http_t *h);

/* ---- routes ---- */

typedef void (*srv_handler_fn)(srv_req_t *req, void *ud);

enum srv_route_flags {
    SRV_ROUTE_JSON = 1u << 0,     /* a body, if any, must be application/json (else 415) */
    SRV_ROUTE_PUBLIC = 1u << 1,   /* no API key needed (health checks) */
    SRV_ROUTE_DRAIN_OK = 1u << 2  /* still dispatched while draining */
};

typedef struct srv_route_opts {
    unsigned flags;  /* srv_route_flags */
    size_t max_body; /* body limit for this route; 0 = opts.max_body */
} srv_route_opts_t;

/* Registers fn for method ("GET", "POST", ...; HEAD requests also reach GET
 * routes) and pattern: literal segments and {name} segments that match one
 * non-empty path segment, e.g. "/v1/sessions/{id}/append". The first
 * registered match wins. ud is borrowed and passed to fn. ropts may be NULL.
 * Loop thread. Returns 0, or SRV_HTTP_EINVAL for a malformed pattern. */
int srv_http_route(srv_http_t *h, const char *method, const char *pattern, srv_handler_fn fn,
                   void *ud, const srv_route_opts_t *ropts);

/* Changes the body limit of the route(s) registered with exactly method and
 * pattern (e.g. once the application knows the largest body it can use);
 * 0 = opts.max_body. Loop thread. Returns 0, or SRV_HTTP_EINVAL when no such
 * route exists. */
int srv_http_route_set_max_body(srv_http_t *h, const char *method, const char *pattern,
                                size_t max_body);

/* ---- request accessors (loop thread, inside the handler) ----
 * Returned strings are owned by the request. Header and query values are
 * only valid during the handler call; copy what is needed later. The rest
 * lives until the request ends. */
const char *srv_req_path(const srv_req_t *req);       /* decoded path, no query */
const char *srv_req_route(const srv_req_t *req);      /* matched pattern */
const char *srv_req_id(const srv_req_t *req);
const char *srv_req_param(const srv_req_t *req, const char *name);  /* {name}, NULL if none */
const char *srv_req_query(const srv_req_t *req, const char *key);   /* NULL if absent */
const char *srv_req_header(const srv_req_t *req, const char *name); /* case-insensitive */
/* The body, NUL-terminated (the NUL is not counted in *len); "" when empty. */
const char *srv_req_body(const srv_req_t *req, size_t *len);
/* A body taken away from its request: len bytes plus a NUL at data, read
 * only. In memory, or (a spooled upload) the file it was spooled to mapped,
 * which lives until srv_body_free. */
typedef struct {
    const char *data;
    size_t len;
    size_t map_len; /* > 0: a mapping of that many bytes; 0: malloc'd */
} srv_body_t;
/* Takes the body away from the request (no copy) into *out, which the
 * caller owns from then on and may keep past the request's end (release it
 * with srv_body_free); srv_req_body says "" afterwards. 0, or -1 when out
 * of memory (*out then holds nothing). */
int srv_req_take_body(srv_req_t *req, srv_body_t *out);
/* Releases a taken body; NULL or an empty one: no-op. */
void srv_body_free(srv_body_t *b);
srv_http_t *srv_req_server(const srv_req_t *req);
/* The API key the request authenticated with: its index in opts.api_keys,
 * or -1 when no keys are configured (or the path is public). *admin (may be
 * NULL) = 1 when that key is marked admin. */
int srv_req_key(const srv_req_t *req, int *admin);

/* Adds a response header (copied) to whatever answer follows: reply, stream
 * or deferred reply. Names must be HTTP tokens, values free of CR/LF. Do not
 * add Content-Type, Content-Length, Transfer-Encoding or X-Request-Id here:
 * the server sets them. Returns 0 or SRV_HTTP_EINVAL / SRV_HTTP_ESTATE
 * (headers already sent). */
int srv_req_add_header(srv_req_t *req, const char *name, const char *value);

/* ---- immediate answers (loop thread, inside the handler) ---- */

/* body[0..len) is copied. content_type NULL = none. Returns 0 or a negative
 * code (SRV_HTTP_ESTATE when already answered). */
int srv_reply(srv_req_t *req, int status, const char *content_type, const void *body, size_t len);
int srv_reply_json(srv_req_t *req, int status, const char *json);
/* {"error":{"message":<fmt...>,"type":type,"param":param|null,"code":code|null}} */
int srv_reply_error(srv_req_t *req, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ---- streams ---- */

typedef struct srv_stream_opts {
    size_t max_buffered; /* back-pressure bound in bytes; 0 = server default */
    /* Loop thread, at most once: the client went away, a timeout cut the
     * connection, or the server is closing. Not called after the producer
     * closed the stream. */
    void (*on_cancel)(srv_stream_t *s, void *ud);
    /* Loop thread: after a write returned SRV_HTTP_EAGAIN, the buffer has
     * drained to half of max_buffered or less. */
    void (*on_writable)(srv_stream_t *s, void *ud);
    void *ud; /* borrowed; passed to the callbacks */
    /* Static string, NULL = none: 1..64 bytes the client's parser ignores
     * (an SSE comment ": ping\n\n"), which the server may send between two
     * writes to learn whether a client that shut down its side is still
     * there (see "hang-up" above). */
    const char *probe;
} srv_stream_opts_t;

/* Starts a streamed response (inside the handler): status, content_type and
 * the headers added so far go out now; the body is whatever the producer
 * writes, sent chunked (HTTP/1.1) or until close (HTTP/1.0). sopts may be
 * NULL. Returns the producer's reference, or NULL (already answered, out of
 * memory); then the request has been answered with 500 if it was not. */
srv_stream_t *srv_stream_open(srv_req_t *req, int status, const char *content_type,
                              const srv_stream_opts_t *sopts);

/* Defers the answer (inside the handler): the connection waits, costing
 * nothing, until the producer calls srv_stream_reply or srv_stream_reply_take
 * (one complete response with Content-Length) or srv_stream_rerun. */
srv_stream_t *srv_stream_defer(srv_req_t *req, const srv_stream_opts_t *sopts);

/* Any thread. Deferred streams only, before anything was sent. */
int srv_stream_add_header(srv_stream_t *s, const char *name, const char *value);
/* Any thread. Answers a deferred stream with one complete response (body
 * copied) and closes it: s is invalid afterwards, as after srv_stream_close.
 * Returns 0, SRV_HTTP_ECANCELED (client gone; s is still released) or
 * SRV_HTTP_ESTATE (not deferred, or already begun; s is still released). */
int srv_stream_reply(srv_stream_t *s, int status, const char *content_type, const void *body,
                     size_t len);
/* Any thread. Same, without copying: takes body (malloc'd, len bytes; NULL
 * for an empty one), which is sent as it is and free()d once the response
 * is gone (or at once on an error return). A large answer (a session state)
 * so exists once in memory, not three times. */
int srv_stream_reply_take(srv_stream_t *s, int status, const char *content_type, void *body,
                          size_t len);
/* Any thread. Instead of answering a deferred stream, runs the request's
 * handler again on the loop thread, as if the request had just arrived:
 * same method, path, headers, body (unless taken) and API key; the headers
 * added for the first answer are dropped. For a handler that had to wait
 * for something (a session read back from disk on another thread) before
 * it can do its work. Releases s like srv_stream_reply. Returns 0,
 * SRV_HTTP_ECANCELED (client gone: nothing runs) or SRV_HTTP_ESTATE. */
int srv_stream_rerun(srv_stream_t *s);
/* Loop thread, in the handler: how many times the handler has been called
 * for req (1, then 2 after one srv_stream_rerun, ...). */
int srv_req_runs(const srv_req_t *req);
/* Any thread. Queues data[0..len) (copied) for the client. All or nothing:
 * returns 0; SRV_HTTP_EAGAIN when the buffered bytes would exceed
 * max_buffered (a write larger than the bound is accepted only into an empty
 * buffer), nothing queued, on_writable follows; SRV_HTTP_ECANCELED when the
 * client is gone; SRV_HTTP_ESTATE on a deferred stream (until
 * srv_stream_begin, server/http/http_test.h) or after close; SRV_HTTP_ENOMEM. */
int srv_stream_write(srv_stream_t *s, const void *data, size_t len);

enum srv_stream_close_mode {
    SRV_STREAM_END = 0,  /* finish normally once the buffered bytes are sent */
    SRV_STREAM_ABORT = 1 /* cut the connection: the client sees a truncated response */
};

/* Any thread, exactly once per stream (also after cancellation). Releases the
 * producer's reference: s must not be used afterwards. A deferred stream
 * closed before any answer is answered with 500. Waits for a running
 * on_cancel/on_writable callback to return (unless called from it). */
void srv_stream_close(srv_stream_t *s, int mode);

/* ---- lifecycle (loop thread) ---- */

/* Stops taking new work: from now on requests get 503 (routes with
 * SRV_ROUTE_DRAIN_OK still run) and responses say Connection: close.
 * Requests in progress continue. */
void srv_http_drain(srv_http_t *h);
int srv_http_draining(const srv_http_t *h);
/* While not ready (the application is still loading its model), matched
 * routes without SRV_ROUTE_DRAIN_OK get 503 with code "loading" and a
 * Retry-After-free message; /health-style routes (DRAIN_OK) still run. A new
 * server is ready. */
void srv_http_set_ready(srv_http_t *h, int ready);

/* Requests whose handler ran and whose answer is not finished yet (streams,
 * deferred answers, responses still being sent). */
size_t srv_http_inflight(const srv_http_t *h);

/* Cancels every open stream (their on_cancel run) and cuts their
 * connections. Used when a drain deadline passes. */
void srv_http_cancel_all(srv_http_t *h);

/* Cancels everything, stops libmicrohttpd and closes the server's handles.
 * When the last handle is closed, the server is freed and done(ud) runs
 * (done may be NULL). h must not be used after this call. Not from inside a
 * handler or a stream callback (libmicrohttpd is running then): call it from
 * a timer, signal or async callback of the loop. */
void srv_http_close(srv_http_t *h, void (*done)(void *ud), void *ud);

#endif
