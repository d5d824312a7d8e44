/* server/http/http_impl.h — the HTTP server's insides, shared by its files and
 * by nothing else:
 *   server/http/http.c         libmicrohttpd on the libuv loop: connections,
 *                         requests, responses, suspension, injected
 *                         requests, construction and shutdown;
 *   server/http/http_stream.c  the hub and the streams: references, the dirty
 *                         and pending lists, and the producer API
 *                         (srv_stream_*) that any thread calls;
 *   server/http/http_route.c   the route table: patterns, matching, methods;
 *   server/http/http_headers.c header lists.
 * The ownership and locking rules are those of server/http/http.c's comment.
 */
#ifndef DARKSERVE_SERVER_HTTP_IMPL_H
#define DARKSERVE_SERVER_HTTP_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
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

typedef struct conn {
    int fd;
    uint64_t deadline_ms; /* 0 = not receiving a request */
    uint64_t header_deadline_ms; /* first request's headers due; 0 = in, or no limit */
    int cut;
    int busy;             /* a request (headers seen) is in progress */
    int served;           /* requests completed on this connection */
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
    char *body;
    size_t body_len, body_cap, body_limit;
    int too_large;
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
