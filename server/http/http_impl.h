/* server/http/http_impl.h — the HTTP server's insides, shared by its files and
 * by nothing else:
 *   server/http/http.c         libmicrohttpd on the libuv loop: connections,
 *                         requests, responses, suspension, injected
 *                         requests, construction and shutdown;
 *   server/http/http_stream.c  the hub and the streams: references, the dirty
 *                         and pending lists, and the producer API
 *                         (srv_stream_*) that any thread calls;
 *   server/http/http_route.c   the route table: patterns, matching, methods;
 *   server/http/http_headers.c header lists;
 *   server/http/http_frame.c   the framing rules of RFC 9112 over bytes and
 *                         header lists (no socket, no MHD);
 *   server/http/http_gate.c    the front door: accepting, per-address
 *                         accounting, the first request's head read before
 *                         libmicrohttpd sees it, refusals, lingering closes.
 * The ownership and locking rules are those of server/http/http.c's comment.
 */
#ifndef DARKSERVE_SERVER_HTTP_IMPL_H
#define DARKSERVE_SERVER_HTTP_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/socket.h>
#include <stdint.h>
#include <uv.h>

#include "server/http/http.h"

#define DEFAULT_MAX_BODY ((size_t)1 << 20)
#define DEFAULT_STREAM_BUF ((size_t)256 << 10)
#define DEFAULT_MAX_CONN 256u
#define REQ_ID_MAX 64
#define MAX_PARAMS 8
#define MAX_SEGS 32
#define LISTEN_BACKLOG 511
#define SWEEP_MS 1000
/* MHD asks the reader for at most this many bytes at a time. */
#define READER_BLOCK ((size_t)16 * 1024)
/* The largest request head the front door reads (431 past it). Below
 * libmicrohttpd's 32 KiB connection memory, which must hold the head again
 * with its parsed header list. */
#define HEAD_MAX ((size_t)16 * 1024)
/* Bodies larger than this go to a temporary file as they arrive (on routes
 * whose limit allows more), so memory holds at most this much of an upload
 * until its handler runs; such uploads take one of max_uploads slots. */
#define SPOOL_MIN ((size_t)1 << 20)
#define DEFAULT_MAX_UPLOADS 2u
/* A closing connection that may still have bytes coming (an upload answered
 * early) is read and discarded for up to this long after the answer, so the
 * client reads the answer instead of a reset; at most LINGER_MAX at once. */
#define LINGER_MS 2000u
#define LINGER_MAX 64u
/* Refusals and cuts are logged at most once per this many ms per kind, with
 * the number left unsaid. */
#define NOTE_EVERY_MS 10000u

/* ---- small containers ---- */

typedef struct header {
    char *name, *value;
} header_t;

typedef struct hdrlist {
    header_t *v;
    size_t n, cap;
} hdrlist_t;

typedef struct seg {
    char *text; /* literal, or the parameter name */
    int param;
} seg_t;

typedef struct route {
    char *method;
    char *pattern;
    seg_t segs[MAX_SEGS];
    size_t nsegs;
    srv_handler_fn fn;
    void *ud;
    unsigned flags;
    size_t max_body;
} route_t;

typedef struct hub {
    pthread_mutex_t lock;
    int refs;                /* the server + every stream */
    uv_async_t *async;       /* NULL once the server is closing */
    srv_stream_t *dirty;     /* streams with news for the loop */
    pthread_t loop_thread;
} hub_t;

enum stream_mode {
    MODE_DEFERRED = 0, /* nothing sent, status not chosen */
    MODE_STREAMING,    /* status chosen, body streams */
    MODE_REPLY,        /* a complete answer is in buf */
    MODE_RERUN         /* no answer: run the handler again (srv_stream_rerun) */
};

enum pending_flags { PEND_CANCEL = 1, PEND_WRITABLE = 2 };

struct srv_stream {
    hub_t *hub;
    /* immutable after creation */
    void (*on_cancel)(srv_stream_t *, void *);
    void (*on_writable)(srv_stream_t *, void *);
    void *cb_ud;
    const char *probe; /* static; see srv_stream_opts_t */
    size_t max_buffered;
    /* guarded by hub->lock */
    int refs;
    pthread_cond_t cond;
    int mode;
    int status;
    char *ctype;
    hdrlist_t headers;
    char *buf; /* bytes [off, len) are waiting */
    size_t off, len, cap;
    int closed, abort, cancelled, want_writable, in_cb;
    int dirty;
    srv_stream_t *dirty_next;
    /* loop thread only */
    srv_req_t *req;
    unsigned pend;
    srv_stream_t *pend_next;
};

/* ---- framing (http_frame.c) ---- */

/* What the header fields of one request say about its framing, and the
 * verdict: status 0 = acceptable, else the answer due (400, 413, 431, 501,
 * 505), code and message. */
typedef struct srv_http_frame {
    int http11;
    int need_host;     /* HTTP/1.1 from a connection: exactly one Host */
    unsigned n_cl, n_te, n_host;
    uint64_t clen;     /* the Content-Length, when n_cl and it parsed */
    int clen_bad, clen_huge, clen_conflict;
    int te_chunked;    /* Transfer-Encoding is exactly "chunked" */
    int te_bad;
    char te_unknown[32]; /* the first coding that is not chunked */
    int ws_name, bad_name, bad_value;
    int has_body;      /* set by srv_http_frame_finish */
    int status;
    const char *code;  /* static */
    char msg[160];
} srv_http_frame_t;

/* A raw request head as the front door read it. */
typedef struct srv_http_head {
    srv_http_frame_t frame;
    size_t start;           /* offset of the request line (empty lines skipped) */
    size_t head_len;        /* bytes up to and with the empty line */
    char method[16];
    size_t target_off, target_len; /* the request target in the buffer */
    char req_id[REQ_ID_MAX + 1];   /* X-Request-Id as sent (unchecked), or "" */
    int first_chunk_known;  /* chunked, and the first chunk's size line came with it */
    uint64_t first_chunk;   /* that size (UINT64_MAX when beyond 64 bits) */
} srv_http_head_t;

/* Starts a verdict for a request of that version; need_host follows it. */
void srv_http_frame_init(srv_http_frame_t *f, int http11);
/* One header field as received: name[0..nlen), value[0..vlen) without the
 * whitespace after the colon. */
void srv_http_frame_field(srv_http_frame_t *f, const char *name, size_t nlen, const char *value,
                          size_t vlen);
/* The verdict once every field was seen (f->status, code, msg, has_body). */
void srv_http_frame_finish(srv_http_frame_t *f);
/* Scans buf[0..n), the start of a connection's bytes: 0 when the head is
 * not complete yet; 1 when it is (or is malformed, or longer than max_head:
 * hd->frame.status says). */
int srv_http_head_scan(const char *buf, size_t n, size_t max_head, srv_http_head_t *hd);
/* A request target (path and query as on the wire, t[0..n)): 0 when
 * acceptable, -1 when it holds a control byte in the path or a NUL in the
 * query, raw or percent-encoded, or an encoded slash (%2F) in the path. */
int srv_http_target_check(const char *t, size_t n);

/* ---- connections ---- */

/* A client address with open connections (the front door's accounting);
 * listed while it has one, freed with its last. */
typedef struct peer {
    struct peer *next;
    int family;             /* AF_INET, AF_INET6 */
    unsigned char addr[16];
    unsigned open;          /* connections counted against the per-address bound */
    unsigned waiting;       /* scratch: its connections without a head (make_room) */
    char text[64];          /* for the log */
} peer_t;

enum gate_state {
    GATE_HEAD = 0, /* accepted, its first request's head not complete */
    GATE_READY,    /* head checked, waiting for a libmicrohttpd slot */
    GATE_LINGER    /* answered and closing: reading what still comes */
};

/* A connection the front door holds (http_gate.c). */
typedef struct gate_conn {
    uv_poll_t poll;      /* first: its close callback frees the struct */
    struct srv_http *h;
    int fd;
    int state;
    struct sockaddr_storage sa;
    unsigned salen;
    peer_t *peer;        /* counted while HEAD or READY; NULL once handed on */
    uint64_t t_accept_ms, last_io_ms, linger_end_ms;
    size_t seen;         /* bytes of the head seen so far (idle timeout) */
    struct gate_conn *prev, *next; /* its state's list, oldest first */
} gate_conn_t;

typedef struct gate_list {
    gate_conn_t *first, *last;
    size_t n;
} gate_list_t;

/* Rate-limited log of one kind of refusal or cut. */
typedef struct note {
    uint64_t last_ms;
    unsigned unsaid;
} note_t;

enum note_kind { NOTE_PER_ADDRESS = 0, NOTE_SHED, NOTE_OVERLOAD, NOTE_TIMEOUT, NOTE_ACCEPT,
                 NOTE_N };

typedef struct conn {
    int fd;
    uint64_t deadline_ms; /* 0 = not receiving a request */
    int cut;
    int busy;             /* a request (headers seen) is in progress */
    int served;           /* requests completed on this connection */
    int bad_target;       /* the request line being parsed has a bad target */
    int linger;           /* closing with an answer while a body may still come */
    int uncounted;        /* closed by the client, or idle and closed for a newcomer of its
                             address: no longer counted for its peer */
    uint64_t idle_since_ms; /* the end of its last request (or its start) */
    peer_t *peer;         /* the front door's record of its address, or NULL */
    struct conn *prev, *next;
} conn_t;

enum req_phase {
    PH_RECEIVING = 0, /* headers seen, body coming */
    PH_HANDLER,       /* handler running */
    PH_WAITING,       /* deferred: suspended until the producer answers */
    PH_HELD,          /* an early answer waits for the end of the request */
    PH_ANSWERED       /* a response is queued */
};

struct srv_req {
    srv_http_t *h;
    struct MHD_Connection *conn;
    conn_t *cx;
    srv_req_t *prev, *next;
    const route_t *route;
    char *method;
    char *path;
    char id[REQ_ID_MAX + 1];
    char peer[64];
    char *cors_origin; /* Access-Control-Allow-Origin value, NULL = none */
    const char *pnames[MAX_PARAMS];
    char *pvals[MAX_PARAMS];
    size_t nparams;
    char *body; /* malloc'd, or a read-only mapping of body_map bytes */
    size_t body_len, body_cap, body_limit;
    size_t body_map; /* > 0: body maps the spooled file (body_len + its NUL) */
    int too_large;
    int spool_fd;      /* the body so far in a temporary file (SPOOL_MIN), or -1 */
    int upload_slot;   /* holds one of max_uploads */
    int bad_target;    /* control byte in the path / NUL in the query */
    int close_after;   /* the answer says Connection: close (framing error) */
    const char *outcome; /* static; overrides the access line's outcome */
    uint64_t inj_body_len; /* injected: the body's length, for Content-Length */
    hdrlist_t headers;
    int phase;
    int status;
    /* An answer decided from the headers of a request without a body is held
     * until MHD has the whole request: queued earlier, MHD would close the
     * keep-alive connection. */
    int hold;
    int held_status;
    char *held_ctype;
    char *held_body;
    size_t held_len;
    hdrlist_t held_extra;
    uint64_t bytes_out;
    uint64_t t_start_ns;
    srv_stream_t *stream; /* the request's reference */
    int suspended;
    uv_poll_t *hup;
    int fd;
    int http11;   /* HTTP/1.1 request: 1xx interim answers and chunked bodies */
    int key;      /* index of the API key it authenticated with, -1 = none */
    int peer_eof; /* the client shut down its sending side (or closed) */
    int client_gone;
    int inflight;
    int runs; /* handler calls so far (srv_stream_rerun runs it again) */
    /* An injected request (srv_http_inject) has no connection (conn NULL):
     * its headers and query come from these lists and its answer goes to
     * *inj, the streamed body pulled by inject_run. */
    struct srv_http_result *inj; /* server/http/http_test.h */
    hdrlist_t inj_headers, inj_query;
    int inj_end; /* 0 running; 1 answered whole; 2 cut */
};

enum close_stage { OPEN = 0, CLOSING, CLOSED };

struct srv_http {
    uv_loop_t *loop;
    struct MHD_Daemon *d;
    /* runs libmicrohttpd (and what waits on it) now, or after the run in
     * progress: http.c's, called by the front door (http_gate.c sits below
     * http.c and reaches it only through this) */
    void (*run)(srv_http_t *h);
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    uv_timer_t sweep;
    uv_async_t async;
    int handles_open;
    hub_t *hub;
    route_t *routes;
    size_t nroutes, rcap;
    size_t max_body;
    size_t stream_buf;
    unsigned request_timeout_s;
    unsigned header_timeout_s;
    char **api_keys;
    unsigned char *api_key_admin; /* [n_api_keys] */
    size_t n_api_keys;
    char **cors;
    size_t n_cors;
    int port;
    int draining;
    int not_ready;  /* srv_http_set_ready(h, 0): the application is loading */
    int stage;
    size_t inflight;
    srv_req_t *reqs;
    conn_t *conns;
    srv_stream_t *pending;
    int in_run, rerun;
    uint64_t rid_state;
    srv_metrics_t *metrics;
    srv_metric_t *m_requests, *m_duration, *m_inflight, *m_cancels, *m_timeouts, *m_conns;
    srv_metric_t *m_refused;
    /* the front door (http_gate.c) */
    int listen_fd;           /* -1 without one */
    uv_poll_t listen_poll;
    int listen_paused;       /* out of descriptors: accepting resumes at the next sweep */
    unsigned max_conns;      /* libmicrohttpd's connections, and the door's */
    unsigned max_per_addr;   /* 0 = no bound */
    unsigned idle_timeout_s;
    gate_list_t heads, ready, lingers;
    size_t n_mhd;            /* connections libmicrohttpd holds */
    peer_t *peers;
    gate_conn_t *adding;     /* being handed to libmicrohttpd right now */
    int gate_kick;           /* a slot freed: hand READY connections on */
    note_t notes[NOTE_N];
    /* uploads */
    unsigned uploads, max_uploads;
    char *upload_dir;
    void (*done)(void *);
    void *done_ud;
};

/* ---- across the files (see each definition) ---- */

/* server/http/http_headers.c */
/* 1 when name is a token and value holds no CR or LF. */
int srv_http_header_valid(const char *name, const char *value);
void srv_http_hdrlist_clear(hdrlist_t *l);
/* Copies name: value into l (EINVAL for a name that is not a token or a
 * value with CR or LF, ENOMEM). */
int srv_http_hdrlist_add(hdrlist_t *l, const char *name, const char *value);
/* 1 when a header could have come off the wire as libmicrohttpd passes it
 * on: a non-empty name without colon, CR or LF (whitespace or other bytes a
 * token refuses are the framing rules' business), a value without LF. */
int srv_http_header_received(const char *name, const char *value);
/* srv_http_hdrlist_add with that looser check (an injected request). */
int srv_http_hdrlist_add_received(hdrlist_t *l, const char *name, const char *value);

/* server/http/http_stream.c (hub->lock as each definition says) */
void srv_http_hub_unref_locked(hub_t *hub, int *free_it);
void srv_http_hub_free(hub_t *hub);
/* A new stream of req (two references: the producer's and the request's),
 * or NULL when out of memory. Loop thread. */
srv_stream_t *srv_http_stream_new(srv_req_t *req, const srv_stream_opts_t *so);
void srv_http_stream_unref_unlock(srv_stream_t *s);
void srv_http_stream_unref(srv_stream_t *s);
void srv_http_pending_add(srv_http_t *h, srv_stream_t *s, unsigned flag);
void srv_http_stream_cancel(srv_http_t *h, srv_stream_t *s);
/* Runs the loop's queued stream callbacks (loop thread, outside MHD_run). */
void srv_http_process_pending(srv_http_t *h);

/* server/http/http_wire.c */
/* JSON string body of s into out[cap], cut to fit; invalid UTF-8 becomes '?'. */
void srv_http_json_escape(char *out, size_t cap, const char *s);
/* A whole error answer (status line, headers with Connection: close, the
 * JSON error body) into out[cap] for a socket nobody else writes to; its
 * length, or 0 when it does not fit. retry_after > 0 adds Retry-After. */
size_t srv_http_error_bytes(char *out, size_t cap, int status, const char *type,
                            const char *code, const char *msg, const char *req_id,
                            int retry_after);
/* A fresh request id into id[REQ_ID_MAX + 1]. */
void srv_http_new_req_id(srv_http_t *h, char *id);

/* server/http/http_gate.c (loop thread) */
/* Takes listen_fd (owned from now on, even on failure) and makes
 * h->listen_poll watch it (a handle counted in handles_open); 0 or -1.
 * Accepting starts with uv_poll_start(.., srv_http_gate_on_listen). */
int srv_http_gate_start(srv_http_t *h, int listen_fd);
void srv_http_gate_on_listen(uv_poll_t *p, int status, int events);
/* Stops accepting and closes every connection the door holds. */
void srv_http_gate_close(srv_http_t *h);
/* Timeouts and lingering ends; the sweep timer calls it every SWEEP_MS. */
void srv_http_gate_sweep(srv_http_t *h, uint64_t now_ms);
/* Hands waiting connections to libmicrohttpd while it has slots (outside
 * MHD_run). */
void srv_http_gate_kick(srv_http_t *h);
/* Takes fd (a closing connection's duplicate) to read and discard what the
 * client still sends, for LINGER_MS at most; closes it at once past
 * LINGER_MAX. */
void srv_http_gate_linger(srv_http_t *h, int fd);
/* One connection of p is gone. */
void srv_http_gate_release(srv_http_t *h, peer_t *p);
/* Logs one refusal or cut of kind at most every NOTE_EVERY_MS. */
void srv_http_note(srv_http_t *h, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* server/http/http_route.c */
/* Splits pattern ("/v1/sessions/{id}") into r's segments: 0, EINVAL for a
 * malformed pattern, ENOMEM; what was split is freed by
 * srv_http_route_clear either way. srv_http_route registers a route
 * through it; test_srv_http_route calls it directly. */
int srv_http_route_parse(route_t *r, const char *pattern);
/* Frees what route r owns (method, pattern, segment texts). */
void srv_http_route_clear(route_t *r);
/* 1 when path matches r (its parameters copied into req when req is not
 * NULL), 0 when not, -1 when out of memory. */
int srv_http_route_match(const route_t *r, const char *path, srv_req_t *req);
/* 1 when r answers method (GET routes answer HEAD too). */
int srv_http_method_matches(const route_t *r, const char *method);
/* "GET, HEAD, POST, OPTIONS": the methods of the routes matching path. */
void srv_http_allowed_methods(const srv_http_t *h, const char *path, char *out, size_t cap);

#endif
