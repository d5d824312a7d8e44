/* server/http/http.c — libmicrohttpd on a libuv loop (see http.h for the API).
 * The streams and their producer API are server/http/http_stream.c, the route
 * table server/http/http_route.c; what they share is server/http/http_impl.h.
 *
 * How MHD is driven (libmicrohttpd 0.9.75, libuv 1.44):
 *   - MHD runs in "external epoll" mode: no thread of its own. Its epoll fd is
 *     watched by a uv_poll_t; readiness calls MHD_run. After every MHD_run a
 *     one-shot uv_timer_t is re-armed from MHD_get_timeout (MHD keeps work it
 *     could not finish, and connection timeouts, behind that timeout).
 *   - Producers on other threads append to a stream's buffer under the hub
 *     mutex, put the stream on the hub's dirty list and uv_async_send; the
 *     loop resumes the suspended connections of dirty streams and runs MHD.
 *   - A streamed body comes from MHD_create_response_from_callback with
 *     MHD_SIZE_UNKNOWN. The reader returns buffered bytes, or suspends the
 *     connection and returns 0 when none are ready (returning 0 without
 *     suspending would make MHD spin).
 *   - MHD does not watch suspended connections, so each one's socket gets a
 *     uv_poll_t for UV_DISCONNECT while it is suspended: a client that hangs
 *     up is noticed at once, its stream is cancelled, the connection resumed,
 *     and the reader (or the access handler) answers with an error so MHD
 *     closes it.
 *   - The disconnect poll is always stopped before the connection is resumed,
 *     so it never outlives the socket MHD closes (libuv keys watchers by fd
 *     and the number is reused by the next accept).
 *   - MHD's own idle timeout (MHD_OPTION_CONNECTION_TIMEOUT) cuts stalled
 *     clients. A client that trickles bytes slowly never goes idle, so a
 *     second deadline (request timeout) is kept per connection and enforced
 *     by a 1 s sweep that shuts the socket down; MHD then sees the hang-up and
 *     closes the connection itself.
 *   - MHD has no listen socket: the front door (server/http/http_gate.c)
 *     accepts, holds each connection until its first request's head is in
 *     and checked (the header timeout and the per-address bound are its),
 *     and hands it on with MHD_add_connection; on_connection learns its
 *     peer and start time from h->adding.
 *
 * Memory: requests (srv_req_t) belong to the loop and die in MHD's
 * "request completed" callback. Streams are reference-counted: the producer,
 * the request, the dirty list and the loop's pending-callback list each hold
 * a reference. The hub (mutex + async handle) is reference-counted by the
 * server and every stream, so a producer that writes after the server closed
 * finds hub->async == NULL instead of a freed handle.
 */
#include "server/http/http.h"
#include "server/http/http_impl.h"
#include "server/http/http_test.h"

#include "server/base/log.h"
#include "server/base/random.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void run_mhd(srv_http_t *h);

/* ---- time, ids ---- */

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

static int valid_req_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= REQ_ID_MAX || !(isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return n > 0;
}

/* ---- responses ---- */

static const char *drain_conn_header(const srv_http_t *h)
{
    return h->draining ? "close" : NULL;
}

/* Did the client shut down its sending side with nothing more to read? Its
 * answer then says Connection: close, so that the client, which cannot send
 * another request, sees the end of the connection after it. */
static int peer_sent_eof(srv_req_t *req)
{
    if (req->peer_eof)
        return 1;
    char c;
    if (req->fd < 0 || recv(req->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
        return 0;
    req->peer_eof = 1;
    return 1;
}

typedef void (*add_header_fn)(void *to, const char *name, const char *value);

/* The headers every response carries, then the handler's and extra, each
 * through add(to, name, value). */
static void response_headers(srv_req_t *req, const char *ctype, const hdrlist_t *extra,
                             add_header_fn add, void *to)
{
    if (ctype && *ctype)
        add(to, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add(to, "X-Request-Id", req->id);
    if (req->cors_origin) {
        add(to, "Access-Control-Allow-Origin", req->cors_origin);
        add(to, "Vary", "Origin");
        add(to, "Access-Control-Expose-Headers", "X-Request-Id");
    }
    if (drain_conn_header(req->h) || req->close_after || peer_sent_eof(req))
        add(to, MHD_HTTP_HEADER_CONNECTION, "close");
    for (size_t i = 0; i < req->headers.n; i++)
        add(to, req->headers.v[i].name, req->headers.v[i].value);
    for (size_t i = 0; extra && i < extra->n; i++)
        add(to, extra->v[i].name, extra->v[i].value);
}

static void add_mhd_header(void *to, const char *name, const char *value)
{
    MHD_add_response_header(to, name, value);
}

static enum MHD_Result inject_answer(srv_req_t *req, int status, const char *ctype,
                                     const hdrlist_t *extra, const void *body, size_t len);

/* Adds the headers every response carries and queues it. Takes ownership of
 * resp. Returns MHD_YES/MHD_NO as the access handler should. */
static enum MHD_Result queue_response(srv_req_t *req, int status, struct MHD_Response *resp,
                                      const char *ctype, const hdrlist_t *extra)
{
    if (!resp) {
        SRV_LOG(SRV_LOG_ERROR, req->id, "cannot create response (out of memory)");
        return MHD_NO;
    }
    response_headers(req, ctype, extra, add_mhd_header, resp);
    /* An answer before the body was read: libmicrohttpd closes the
     * connection after it, and the close lingers (on_connection) so the
     * client reads it rather than a reset for its unread upload. */
    if (req->phase == PH_RECEIVING && req->cx)
        req->cx->linger = 1;
    enum MHD_Result r = MHD_queue_response(req->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (r != MHD_YES) {
        SRV_LOG(SRV_LOG_ERROR, req->id, "libmicrohttpd refused to queue a %d response", status);
        return MHD_NO;
    }
    req->phase = PH_ANSWERED;
    req->status = status;
    return MHD_YES;
}

static enum MHD_Result queue_buffer(srv_req_t *req, int status, const char *ctype,
                                    const void *body, size_t len, const hdrlist_t *extra)
{
    if (req->hold) {
        req->held_status = status;
        req->held_ctype = ctype ? strdup(ctype) : NULL;
        req->held_body = malloc(len + 1);
        if ((ctype && !req->held_ctype) || !req->held_body)
            return MHD_NO;
        memcpy(req->held_body, body, len);
        req->held_len = len;
        for (size_t i = 0; extra && i < extra->n; i++)
            if (srv_http_hdrlist_add(&req->held_extra, extra->v[i].name, extra->v[i].value))
                return MHD_NO;
        req->phase = PH_HELD;
        return MHD_YES;
    }
    if (req->inj)
        return inject_answer(req, status, ctype, extra, body, len);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result r = queue_response(req, status, resp, ctype, extra);
    if (r == MHD_YES)
        req->bytes_out += len;
    return r;
}

/* Like queue_buffer, without a copy: MHD sends body[0..len) in place and
 * free()s it when the response is gone. body (malloc'd, non-NULL) is owned
 * by this call whatever it returns. */
static enum MHD_Result queue_buffer_owned(srv_req_t *req, int status, const char *ctype,
                                          char *body, size_t len, const hdrlist_t *extra)
{
    if (req->hold || len == 0 || req->inj) {
        enum MHD_Result r = queue_buffer(req, status, ctype, body, len, extra);
        free(body);
        return r;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!resp)
        free(body);
    enum MHD_Result r = queue_response(req, status, resp, ctype, extra);
    if (r == MHD_YES)
        req->bytes_out += len;
    return r;
}

/* Anthropic's Messages API (/v1/messages...) answers every error in its
 * own shape, {"type":"error","error":{"type","message"}}, these too; the
 * type by status as server/api does it (proto_anthropic_error_json). */
static const char *anthropic_type(const srv_req_t *req, int status)
{
    const char *p = req ? req->path : NULL;
    if (!p || strncmp(p, "/v1/messages", 12) != 0 || (p[12] != '\0' && p[12] != '/'))
        return NULL;
    return status == 401   ? "authentication_error"
           : status == 403 ? "permission_error"
           : status == 404 ? "not_found_error"
           : status == 413 ? "request_too_large"
           : status == 429 ? "rate_limit_error"
           : status == 503 ? "overloaded_error"
           : status >= 500 ? "api_error"
                           : "invalid_request_error";
}

static enum MHD_Result queue_error(srv_req_t *req, int status, const char *type,
                                   const char *code, const char *msg, const hdrlist_t *extra)
{
    char emsg[512], body[800];
    srv_http_json_escape(emsg, sizeof emsg, msg);
    const char *at = anthropic_type(req, status);
    if (at) {
        int n = snprintf(body, sizeof body,
                         "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"%s\"}}\n",
                         at, emsg);
        if (n < 0 || (size_t)n >= sizeof body)
            n = (int)strlen(body);
        return queue_buffer(req, status, "application/json", body, (size_t)n, extra);
    }
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                     "\"code\":%s%s%s}}\n",
                     emsg, type, code ? "\"" : "", code ? code : "null", code ? "\"" : "");
    if (n < 0 || (size_t)n >= sizeof body)
        n = (int)strlen(body);
    return queue_buffer(req, status, "application/json", body, (size_t)n, extra);
}

/* ---- streams: the reader MHD calls ---- */

static void req_suspend(srv_req_t *req);

static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    srv_stream_t *s = cls;
    srv_req_t *req = s->req;
    hub_t *hub = s->hub;
    pthread_mutex_lock(&hub->lock);
    size_t avail = s->len - s->off;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(out, s->buf + s->off, n);
        s->off += n;
        if (s->off == s->len)
            s->off = s->len = 0;
        int writable = 0;
        if (s->want_writable && s->len - s->off <= s->max_buffered / 2) {
            s->want_writable = 0;
            writable = s->on_writable && !s->closed;
        }
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&hub->lock);
        if (writable && req)
            srv_http_pending_add(req->h, s, PEND_WRITABLE);
        if (req)
            req->bytes_out += n;
        return (ssize_t)n;
    }
    int cancelled = s->cancelled, closed = s->closed, abort_ = s->abort;
    pthread_mutex_unlock(&hub->lock);
    if (cancelled || !req)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (closed)
        return abort_ ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing buffered: park the connection until the producer writes. A
     * write racing with this is not lost: it marks the stream dirty and the
     * loop resumes us after MHD_run returns. */
    req_suspend(req);
    return 0;
}

static enum MHD_Result queue_stream(srv_req_t *req, srv_stream_t *s, int status,
                                    const char *ctype, const hdrlist_t *extra)
{
    if (req->inj) /* inject_run pulls the body through stream_reader */
        return inject_answer(req, status, ctype, extra, NULL, 0);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, READER_BLOCK, stream_reader, s, NULL);
    return queue_response(req, status, resp, ctype, extra);
}

/* ---- opening a stream (the handler's side; http_stream.c has the rest) ---- */

static int can_answer(const srv_req_t *req);

/* A new stream of req in mode, or NULL (logged as what, or a 500 queued
 * when out of memory) when req cannot take one. */
static srv_stream_t *stream_start(srv_req_t *req, const srv_stream_opts_t *sopts, int mode,
                                  const char *what)
{
    if (!can_answer(req)) {
        SRV_LOG(SRV_LOG_ERROR, req->id, "%s on an answered request", what);
        return NULL;
    }
    srv_stream_t *s = srv_http_stream_new(req, sopts);
    if (!s) {
        queue_error(req, 500, "server_error", "internal", "out of memory", NULL);
        return NULL;
    }
    s->mode = mode;
    return s;
}

srv_stream_t *srv_stream_open(srv_req_t *req, int status, const char *content_type,
                              const srv_stream_opts_t *sopts)
{
    srv_stream_t *s = stream_start(req, sopts, MODE_STREAMING, "stream opened");
    if (!s)
        return NULL;
    s->status = status;
    if (queue_stream(req, s, status, content_type, NULL) != MHD_YES) {
        /* The request keeps its reference (released when it ends); the
         * producer's is returned to nobody, so drop it here. */
        pthread_mutex_lock(&s->hub->lock);
        s->closed = 1;
        s->abort = 1;
        s->cancelled = 1;
        srv_http_stream_unref_unlock(s);
        return NULL;
    }
    return s;
}

srv_stream_t *srv_stream_defer(srv_req_t *req, const srv_stream_opts_t *sopts)
{
    return stream_start(req, sopts, MODE_DEFERRED, "answer deferred");
}

/* ---- suspension and hang-up detection ---- */

static void on_hup_closed(uv_handle_t *hnd)
{
    free(hnd);
}

static void req_resume(srv_req_t *req)
{
    if (!req->suspended)
        return;
    if (req->hup)
        uv_poll_stop(req->hup);
    req->suspended = 0;
    if (req->conn)
        MHD_resume_connection(req->conn);
    else
        req->h->rerun = 1; /* inject_run takes it up */
}

/* The client of a waiting request sent FIN. A client that half-closes
 * (shutdown(SHUT_WR) after its request) and one that closed its socket look
 * the same until something is sent to them: a closed socket answers data
 * with RST. So send something harmless: an interim "100 Continue" before
 * the response (HTTP/1.1 clients must skip 1xx answers), or the stream's
 * probe bytes as one chunk of a response under way (MHD has flushed what
 * it wrote before it asked the reader and was suspended). HTTP/1.0 has no
 * interim answers, so nothing harmless can be sent before its answer: its
 * FIN then counts as leaving (as most servers and proxies take any
 * client's), else a closed 1.0 client's prefill and generation would run
 * to their end. Returns -1 when the client is taken as gone; 0 when it may
 * still read (then an RST, if it comes, shows up as an error on the socket;
 * without a probe, a closed client is noticed at the next write). Never
 * writes a partial probe. */
static int probe_peer(srv_req_t *req)
{
    char buf[160];
    int n = 0;
    if (req->phase == PH_WAITING && !req->http11) {
        return -1;
    } else if (req->phase == PH_WAITING) {
        n = snprintf(buf, sizeof buf, "HTTP/1.1 100 Continue\r\n\r\n");
    } else if (req->phase == PH_ANSWERED && req->stream && req->stream->probe &&
               strcmp(req->method, "HEAD") != 0) {
        const char *pb = req->stream->probe;
        size_t pl = strlen(pb);
        if (pl == 0 || pl > 64)
            return 0;
        n = req->http11 ? snprintf(buf, sizeof buf, "%zx\r\n%s\r\n", pl, pb)
                        : snprintf(buf, sizeof buf, "%s", pb);
    }
    if (n <= 0 || (size_t)n >= sizeof buf)
        return 0;
    int queued = 0, sndbuf = 0;
    socklen_t sl = sizeof sndbuf;
    if (ioctl(req->fd, SIOCOUTQ, &queued) < 0 ||
        getsockopt(req->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sl) < 0 || sndbuf - queued < 4096)
        return 0; /* no room for the probe in one piece: wait for the next write */
    ssize_t w = send(req->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
        return -1;
    if (w >= 0 && w != n) {
        /* cannot happen with the room checked above; the framing is broken */
        SRV_LOG(SRV_LOG_WARN, req->id, "hang-up probe written in part; closing");
        return -1;
    }
    return 0;
}

static void on_hup(uv_poll_t *p, int status, int events)
{
    srv_req_t *req = p->data;
    if (status == 0 && !(events & (UV_DISCONNECT | UV_PRIORITIZED)))
        return;
    if (req && req->suspended && status == 0 && (events & UV_DISCONNECT) && !req->peer_eof) {
        req->peer_eof = 1;
        if (probe_peer(req) == 0) {
            /* From now on only an error or a full hang-up (EPOLLERR/HUP, which
             * epoll always reports) ends it: FIN stays readable forever. */
            uv_poll_start(p, UV_PRIORITIZED, on_hup);
            SRV_LOG(SRV_LOG_DEBUG, req->id, "client shut down its side; still answering");
            return;
        }
    }
    uv_poll_stop(p);
    if (!req || !req->suspended)
        return;
    srv_http_t *h = req->h;
    SRV_LOG(SRV_LOG_DEBUG, req->id, "client hung up while its request was waiting");
    req->client_gone = 1;
    if (req->stream)
        srv_http_stream_cancel(h, req->stream);
    req_resume(req);
    run_mhd(h);
}

static void req_suspend(srv_req_t *req)
{
    srv_http_t *h = req->h;
    req->suspended = 1;
    if (!req->conn)
        return;
    MHD_suspend_connection(req->conn);
    if (!req->hup && req->fd >= 0) {
        uv_poll_t *p = malloc(sizeof *p);
        if (p && uv_poll_init(h->loop, p, req->fd) == 0) {
            p->data = req;
            req->hup = p;
        } else {
            free(p);
            SRV_LOG(SRV_LOG_WARN, req->id, "cannot watch a waiting connection for hang-up");
        }
    }
    if (req->hup)
        uv_poll_start(req->hup, req->peer_eof ? UV_PRIORITIZED : UV_DISCONNECT, on_hup);
}

/* ---- request accessors ---- */

/* A header (case-insensitive name) or query argument of req: MHD's for a
 * connection's request, the injected lists otherwise. */
static const char *req_lookup(const srv_req_t *req, enum MHD_ValueKind kind, const char *name)
{
    if (req->conn)
        return MHD_lookup_connection_value(req->conn, kind, name);
    const hdrlist_t *l = kind == MHD_HEADER_KIND ? &req->inj_headers : &req->inj_query;
    for (size_t i = 0; i < l->n; i++)
        if (kind == MHD_HEADER_KIND ? strcasecmp(l->v[i].name, name) == 0
                                    : strcmp(l->v[i].name, name) == 0)
            return l->v[i].value;
    return NULL;
}

const char *srv_req_path(const srv_req_t *req)
{
    return req->path;
}

const char *srv_req_route(const srv_req_t *req)
{
    return req->route ? req->route->pattern : NULL;
}

const char *srv_req_id(const srv_req_t *req)
{
    return req->id;
}

int srv_req_key(const srv_req_t *req, int *admin)
{
    if (admin)
        *admin = req->key >= 0 && req->h->api_key_admin[req->key];
    return req->key;
}

srv_http_t *srv_req_server(const srv_req_t *req)
{
    return req->h;
}

const char *srv_req_param(const srv_req_t *req, const char *name)
{
    for (size_t i = 0; i < req->nparams; i++)
        if (strcmp(req->pnames[i], name) == 0)
            return req->pvals[i];
    return NULL;
}

const char *srv_req_query(const srv_req_t *req, const char *key)
{
    return req_lookup(req, MHD_GET_ARGUMENT_KIND, key);
}

const char *srv_req_header(const srv_req_t *req, const char *name)
{
    return req_lookup(req, MHD_HEADER_KIND, name);
}

const char *srv_req_body(const srv_req_t *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

/* A body: a mapping of map_len bytes, or malloc'd (map_len 0). */
static void body_release(const char *body, size_t map_len)
{
    if (map_len)
        munmap((void *)body, map_len);
    else
        free((void *)body);
}

int srv_req_take_body(srv_req_t *req, srv_body_t *out)
{
    *out = (srv_body_t){.data = req->body, .len = req->body_len, .map_len = req->body_map};
    req->body = NULL;
    req->body_len = req->body_cap = req->body_map = 0;
    if (!out->data) {
        char *b = malloc(1);
        if (!b)
            return -1;
        b[0] = '\0';
        out->data = b;
    }
    return 0;
}

void srv_body_free(srv_body_t *b)
{
    if (!b)
        return;
    body_release(b->data, b->map_len);
    *b = (srv_body_t){0};
}

int srv_req_add_header(srv_req_t *req, const char *name, const char *value)
{
    if (req->phase == PH_ANSWERED)
        return SRV_HTTP_ESTATE;
    return srv_http_hdrlist_add(&req->headers, name, value);
}

static int can_answer(const srv_req_t *req)
{
    return req->phase == PH_HANDLER && !req->stream;
}

int srv_reply(srv_req_t *req, int status, const char *content_type, const void *body, size_t len)
{
    if (!can_answer(req)) {
        SRV_LOG(SRV_LOG_ERROR, req->id, "handler answered twice (status %d)", status);
        return SRV_HTTP_ESTATE;
    }
    if (status < 100 || status > 999)
        return SRV_HTTP_EINVAL;
    return queue_buffer(req, status, content_type, body ? body : "", body ? len : 0, NULL) ==
                   MHD_YES
               ? 0
               : SRV_HTTP_EMHD;
}

int srv_reply_json(srv_req_t *req, int status, const char *json)
{
    return srv_reply(req, status, "application/json", json, json ? strlen(json) : 0);
}

int srv_reply_error(srv_req_t *req, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...)
{
    char msg[512], emsg[1024], etype[128], eparam[256], ecode[128], body[1700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_http_json_escape(emsg, sizeof emsg, msg);
    srv_http_json_escape(etype, sizeof etype, type ? type : "invalid_request_error");
    srv_http_json_escape(eparam, sizeof eparam, param ? param : "");
    srv_http_json_escape(ecode, sizeof ecode, code ? code : "");
    const char *at = anthropic_type(req, status);
    if (at) {
        snprintf(body, sizeof body,
                 "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"%s\"}}\n", at, emsg);
        return srv_reply(req, status, "application/json", body, strlen(body));
    }
    snprintf(body, sizeof body,
             "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":%s%s%s,\"code\":%s%s%s}}\n",
             emsg, etype, param ? "\"" : "", param ? eparam : "null", param ? "\"" : "",
             code ? "\"" : "", code ? ecode : "null", code ? "\"" : "");
    return srv_reply(req, status, "application/json", body, strlen(body));
}

/* ---- API keys and CORS ---- */

/* Compares without an early exit, so the time does not reveal how much of a
 * guess was right. The loop length depends only on the configured key. */
static int key_equal(const char *given, size_t glen, const char *key)
{
    size_t klen = strlen(key);
    unsigned diff = (unsigned)(glen != klen);
    for (size_t i = 0; i < klen; i++) {
        unsigned char g = i < glen ? (unsigned char)given[i] : 0;
        diff |= (unsigned)(g ^ (unsigned char)key[i]);
    }
    return diff == 0;
}

/* 1 when the request may pass: no keys configured, or it carries one of
 * them (its index into *key). */
static int auth_ok(const srv_http_t *h, const srv_req_t *req, int *key)
{
    *key = -1;
    if (h->n_api_keys == 0)
        return 1;
    const char *given = NULL;
    const char *auth = req_lookup(req, MHD_HEADER_KIND, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        given = auth + 7;
        while (*given == ' ')
            given++;
    }
    if (!given)
        given = req_lookup(req, MHD_HEADER_KIND, "X-Api-Key");
    if (!given)
        return 0;
    size_t glen = strlen(given);
    int ok = 0;
    for (size_t i = 0; i < h->n_api_keys; i++) {
        int eq = key_equal(given, glen, h->api_keys[i]);
        ok |= eq;
        if (eq)
            *key = (int)i;
    }
    return ok;
}

static const char *cors_allow(const srv_http_t *h, const char *origin)
{
    if (!origin || !*origin)
        return NULL;
    for (size_t i = 0; i < h->n_cors; i++) {
        if (strcmp(h->cors[i], "*") == 0)
            return "*";
        if (strcasecmp(h->cors[i], origin) == 0)
            return origin;
    }
    return NULL;
}

/* The headers a preflight allows: ours, then every name the browser asks
 * for (Access-Control-Request-Headers; SDKs send their own, such as the
 * OpenAI and Anthropic JavaScript clients' x-stainless-*), each once. A name
 * that is not an RFC 9110 token, or one past the buffer, is left out (the
 * browser then refuses the request, as it should). */
#define CORS_ALLOW_HEADERS_MAX 1024
static void cors_allow_headers(const char *asked, char out[CORS_ALLOW_HEADERS_MAX])
{
    static const char base[] = "Authorization, Content-Type, X-Api-Key, X-Request-Id";
    size_t n = sizeof base - 1;
    memcpy(out, base, sizeof base);
    for (const char *p = asked; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        size_t len = strcspn(p, ", \t");
        const char *name = p;
        p += len;
        if (len == 0 || len > 64)
            continue;
        int token = 1;
        for (size_t i = 0; i < len && token; i++)
            token = isalnum((unsigned char)name[i]) || strchr("!#$%&'*+-.^_`|~", name[i]);
        /* already listed: as a whole name, in any case */
        int dup = 0;
        for (const char *q = out; *q && !dup;) {
            size_t ql = strcspn(q, ",");
            dup = ql == len && strncasecmp(q, name, len) == 0;
            q += ql;
            q += strspn(q, ", ");
        }
        if (!token || dup || n + 2 + len + 1 > CORS_ALLOW_HEADERS_MAX)
            continue;
        memcpy(out + n, ", ", 2);
        memcpy(out + n + 2, name, len);
        n += 2 + len;
        out[n] = '\0';
    }
}

/* ---- the access handler ---- */

static int body_is_json(const char *ctype)
{
    if (!ctype)
        return 0;
    while (*ctype == ' ')
        ctype++;
    size_t n = strlen("application/json");
    if (strncasecmp(ctype, "application/json", n) != 0)
        return 0;
    char c = ctype[n];
    return c == '\0' || c == ';' || c == ' ';
}

static enum MHD_Result frame_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    srv_http_frame_field(cls, key, key_size, value ? value : "", value ? value_size : 0);
    return MHD_YES;
}

/* The framing verdict over the header list libmicrohttpd parsed (or the
 * injected one). What libmicrohttpd 0.9.75 does not check itself is checked
 * here, before any route or handler: Content-Length with
 * Transfer-Encoding, conflicting Content-Length values, whitespace before a
 * colon (it keeps it in the name), Host missing or twice on HTTP/1.1, CR
 * or control bytes in a value, transfer codings other than chunked. What it
 * hides from this list (a NUL it cut a value at, folded lines it joined, a
 * Content-Length it could not parse and answered itself) only the front
 * door sees, on a connection's first request (http_gate.c). */
static void req_frame(srv_req_t *req, srv_http_frame_t *f)
{
    srv_http_frame_init(f, req->http11);
    if (req->conn) {
        MHD_get_connection_values_n(req->conn, MHD_HEADER_KIND, frame_field, f);
    } else {
        f->need_host = 0; /* an injected request has no connection to name */
        for (size_t i = 0; i < req->inj_headers.n; i++)
            srv_http_frame_field(f, req->inj_headers.v[i].name, strlen(req->inj_headers.v[i].name),
                                 req->inj_headers.v[i].value,
                                 strlen(req->inj_headers.v[i].value));
    }
    srv_http_frame_finish(f);
    /* an injected body is whole: a Content-Length must say its length */
    if (!f->status && !req->conn && f->n_cl && f->clen != req->inj_body_len) {
        f->status = 400;
        f->code = "malformed_request";
        snprintf(f->msg, sizeof f->msg, "Content-Length does not match the body");
    }
}

static void spool_free(srv_req_t *req);

static void req_free(srv_req_t *req)
{
    spool_free(req);
    for (size_t i = 0; i < req->nparams; i++)
        free(req->pvals[i]);
    srv_http_hdrlist_clear(&req->headers);
    srv_http_hdrlist_clear(&req->held_extra);
    srv_http_hdrlist_clear(&req->inj_headers);
    srv_http_hdrlist_clear(&req->inj_query);
    free(req->held_ctype);
    free(req->held_body);
    free(req->cors_origin);
    body_release(req->body, req->body_map);
    free(req->method);
    free(req->path);
    free(req);
}

static srv_req_t *req_alloc(srv_http_t *h, struct MHD_Connection *c, const char *url,
                            const char *method)
{
    srv_req_t *req = calloc(1, sizeof *req);
    if (!req)
        return NULL;
    req->h = h;
    req->conn = c;
    req->fd = -1;
    req->spool_fd = -1;
    req->key = -1;
    req->t_start_ns = uv_hrtime();
    req->method = strdup(method);
    req->path = strdup(url);
    if (!req->method || !req->path) {
        req_free(req);
        return NULL;
    }
    return req;
}

/* The request id, the connection's details, and the server's list. */
static void req_start(srv_http_t *h, srv_req_t *req)
{
    const char *rid = req_lookup(req, MHD_HEADER_KIND, "X-Request-Id");
    if (rid && valid_req_id(rid))
        snprintf(req->id, sizeof req->id, "%s", rid);
    else
        srv_http_new_req_id(h, req->id);
    req->next = h->reqs;
    if (h->reqs)
        h->reqs->prev = req;
    h->reqs = req;
    struct MHD_Connection *c = req->conn;
    if (!c)
        return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        req->fd = ci->connect_fd;
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci)
        req->cx = ci->socket_context;
    if (req->cx) {
        req->cx->busy = 1;
        req->bad_target = req->cx->bad_target;
        req->cx->bad_target = 0;
    }
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr,
                      req->peer, sizeof req->peer);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                      req->peer, sizeof req->peer);
    }
}

static srv_req_t *req_new(srv_http_t *h, struct MHD_Connection *c, const char *url,
                          const char *method)
{
    srv_req_t *req = req_alloc(h, c, url, method);
    if (req)
        req_start(h, req);
    return req;
}

static enum MHD_Result check_headers(srv_http_t *h, srv_req_t *req);

static enum MHD_Result queue_unauthorized(srv_req_t *req)
{
    hdrlist_t extra = {0};
    srv_http_hdrlist_add(&extra, "WWW-Authenticate", "Bearer");
    enum MHD_Result r =
        queue_error(req, 401, "authentication_error", "invalid_api_key",
                    "missing or wrong API key (Authorization: Bearer KEY or X-Api-Key)", &extra);
    srv_http_hdrlist_clear(&extra);
    return r;
}

/* First call: headers are in. Routes, checks, early errors. */
static enum MHD_Result on_headers(srv_http_t *h, srv_req_t *req)
{
    enum MHD_Result r = check_headers(h, req);
    req->hold = 0;
    return r;
}

static enum MHD_Result check_headers(srv_http_t *h, srv_req_t *req)
{
    const char *method = req->method;
    srv_http_frame_t f;
    req_frame(req, &f);
    if (f.status) {
        /* The framing is in doubt, so nothing after this request on the
         * connection can be trusted to start where it seems to: the answer
         * goes out at once and closes (bytes already sent are dropped) */
        req->hold = 0;
        req->close_after = 1;
        return queue_error(req, f.status,
                           f.status >= 500 ? "server_error" : "invalid_request_error", f.code,
                           f.msg, NULL);
    }
    const int body = f.has_body;
    const uint64_t clen = f.n_cl ? f.clen : 0;
    const int clen_known = f.n_cl > 0;
    /* Without a body, an early answer waits for MHD's last call so the
     * connection stays usable; with one, it goes out at once and MHD skips
     * the body. */
    req->hold = !body;
    if (req->bad_target)
        return queue_error(req, 400, "invalid_request_error", "malformed_request",
                           "the request path holds a control character (%00..%1F, %7F) "
                           "or an encoded slash (%2F), or the query an encoded NUL",
                           NULL);
    const char *origin = req_lookup(req, MHD_HEADER_KIND, "Origin");
    const char *allow = cors_allow(h, origin);
    if (allow && !(req->cors_origin = strdup(allow)))
        return MHD_NO;

    const route_t *route = NULL;
    int path_known = 0, path_public = 0;
    for (size_t i = 0; i < h->nroutes; i++) {
        const route_t *r = &h->routes[i];
        if (srv_http_route_match(r, req->path, NULL) != 1)
            continue;
        path_known = 1;
        path_public |= (r->flags & SRV_ROUTE_PUBLIC) != 0;
        if (!route && srv_http_method_matches(r, method))
            route = r;
    }
    if (h->draining && !(route && (route->flags & SRV_ROUTE_DRAIN_OK)))
        return queue_error(req, 503, "server_error", "draining",
                           "the server is shutting down; retry on another replica", NULL);
    /* The key is checked before 404/405, so a client without one learns
     * nothing about which paths and methods exist. Public paths (/health)
     * and CORS preflights of known paths (browsers send those without
     * credentials) stay open. */
    const int preflight = strcmp(method, "OPTIONS") == 0 && !route && path_known;
    if (!path_public && !preflight && !auth_ok(h, req, &req->key))
        return queue_unauthorized(req);
    if (h->not_ready && route && !(route->flags & SRV_ROUTE_DRAIN_OK))
        return queue_error(req, 503, "server_error", "loading",
                           "the model is still loading; retry shortly", NULL);
    if (!path_known)
        return queue_error(req, 404, "not_found_error", "not_found", "no such route", NULL);
    if (strcmp(method, "OPTIONS") == 0 && !route) {
        char methods[256];
        hdrlist_t extra = {0};
        srv_http_allowed_methods(h, req->path, methods, sizeof methods);
        srv_http_hdrlist_add(&extra, "Allow", methods);
        if (req->cors_origin &&
            req_lookup(req, MHD_HEADER_KIND, "Access-Control-Request-Method")) {
            srv_http_hdrlist_add(&extra, "Access-Control-Allow-Methods", methods);
            char allow_h[CORS_ALLOW_HEADERS_MAX];
            cors_allow_headers(req_lookup(req, MHD_HEADER_KIND, "Access-Control-Request-Headers"),
                               allow_h);
            srv_http_hdrlist_add(&extra, "Access-Control-Allow-Headers", allow_h);
            srv_http_hdrlist_add(&extra, "Access-Control-Max-Age", "600");
        }
        enum MHD_Result r = queue_buffer(req, 204, NULL, "", 0, &extra);
        srv_http_hdrlist_clear(&extra);
        return r;
    }
    if (!route) {
        char methods[256];
        hdrlist_t extra = {0};
        srv_http_allowed_methods(h, req->path, methods, sizeof methods);
        srv_http_hdrlist_add(&extra, "Allow", methods);
        char msg[320];
        snprintf(msg, sizeof msg, "method %s not allowed here; allowed: %s", method, methods);
        enum MHD_Result r = queue_error(req, 405, "invalid_request_error", "method_not_allowed",
                                        msg, &extra);
        srv_http_hdrlist_clear(&extra);
        return r;
    }
    req->route = route;
    if (srv_http_route_match(route, req->path, req) < 0)
        return MHD_NO;
    if ((route->flags & SRV_ROUTE_JSON) && body &&
        !body_is_json(req_lookup(req, MHD_HEADER_KIND, "Content-Type")))
        return queue_error(req, 415, "invalid_request_error", "unsupported_media_type",
                           "the body must be JSON (Content-Type: application/json)", NULL);
    req->body_limit = route->max_body;
    if (clen_known && clen > req->body_limit) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body of %llu bytes exceeds the limit of %zu bytes",
                 (unsigned long long)clen, req->body_limit);
        return queue_error(req, 413, "invalid_request_error", "request_too_large", msg, NULL);
    }
    /* A body that may be larger than SPOOL_MIN goes to a file as it comes
     * and takes an upload slot, so neither memory nor the disk is spent on
     * more than max_uploads of them at once. */
    if (body && req->body_limit > SPOOL_MIN && (f.te_chunked || clen > SPOOL_MIN)) {
        if (h->uploads >= h->max_uploads) {
            char msg[160];
            hdrlist_t extra = {0};
            srv_http_hdrlist_add(&extra, "Retry-After", "1");
            snprintf(msg, sizeof msg,
                     "the server takes %u large upload(s) at once (--max-uploads) and has them; "
                     "retry shortly",
                     h->max_uploads);
            enum MHD_Result r = queue_error(req, 429, "rate_limit_error", "too_many_uploads",
                                            msg, &extra);
            srv_http_hdrlist_clear(&extra);
            return r;
        }
        h->uploads++;
        req->upload_slot = 1;
    }
    return MHD_YES;
}

/* ---- bodies: memory, then a temporary file ---- */

/* A new unnamed file in the upload directory (O_TMPFILE: nothing to clean
 * up after a crash; else a named one removed at once). -1 on failure. */
static int spool_open(const srv_http_t *h)
{
    int fd = open(h->upload_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/.darkserve-upload-XXXXXX", h->upload_dir) >=
        (int)sizeof path)
        return -1;
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0)
        unlink(path);
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void spool_free(srv_req_t *req)
{
    if (req->spool_fd >= 0)
        close(req->spool_fd);
    req->spool_fd = -1;
}

/* The spooled body for the handler (srv_req_body's contract: its bytes and
 * a NUL after them). The file is mapped read-only, a NUL written after the
 * body first: its pages are those the page cache holds since they were
 * written, so a large import costs no copy of itself in the heap (the
 * unnamed file lives until the mapping goes). Where the file cannot be
 * mapped it is read into one buffer of exactly its size. 0, or -1 (out of
 * memory, a read error). */
static int spool_load(srv_req_t *req)
{
    const size_t n = req->body_len + 1;
    if (pwrite(req->spool_fd, "", 1, (off_t)req->body_len) == 1) {
        void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, req->spool_fd, 0);
        if (m != MAP_FAILED) {
            spool_free(req);
            free(req->body);
            req->body = m;
            req->body_map = n;
            req->body_cap = 0;
            return 0;
        }
    }
    char *b = malloc(n);
    size_t got = 0;
    while (b && got < req->body_len) {
        ssize_t r = pread(req->spool_fd, b + got, req->body_len - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    spool_free(req);
    if (!b || got != req->body_len) {
        free(b);
        return -1;
    }
    b[got] = '\0';
    free(req->body);
    req->body = b;
    req->body_cap = got + 1;
    return 0;
}

/* Answers an upload in the middle of its body and ends the connection.
 * libmicrohttpd 0.9.75 cannot queue an answer while a body is arriving, and
 * waiting for its end lets a client hold the server as long as it sends:
 * the error is written straight to the socket (nothing else is writing to
 * it while the request is received) and the connection is closed with a
 * lingering close (on_connection), so the client reads the answer. */
static enum MHD_Result abort_upload(srv_req_t *req, int status, const char *code,
                                    const char *msg)
{
    char buf[1024];
    size_t n = srv_http_error_bytes(buf, sizeof buf, status,
                                    status >= 500 ? "server_error" : "invalid_request_error",
                                    code, msg, req->id, 0);
    if (n && req->fd >= 0)
        (void)send(req->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    req->status = status;
    req->phase = PH_ANSWERED;
    req->outcome = status == 413 ? "too_large" : "upload_failed";
    req->bytes_out += n;
    if (req->cx)
        req->cx->linger = 1;
    spool_free(req);
    free(req->body);
    req->body = NULL;
    req->body_cap = 0;
    return MHD_NO; /* libmicrohttpd closes the connection */
}

static enum MHD_Result on_body(srv_req_t *req, const char *data, size_t n)
{
    if (req->too_large)
        return MHD_YES;
    if (n > req->body_limit - req->body_len) {
        if (req->conn) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes",
                     req->body_limit);
            return abort_upload(req, 413, "request_too_large", msg);
        }
        /* an injected body is whole already: answered at its end */
        req->too_large = 1;
        free(req->body);
        req->body = NULL;
        req->body_len = req->body_cap = 0;
        return MHD_YES;
    }
    if (req->spool_fd < 0 && req->upload_slot && req->body_len + n > SPOOL_MIN) {
        int fd = spool_open(req->h);
        if (fd < 0 || (req->body_len && write_all(fd, req->body, req->body_len) != 0)) {
            if (fd >= 0)
                close(fd);
            SRV_LOG(SRV_LOG_ERROR, req->id, "cannot spool an upload in %s: %s",
                    req->h->upload_dir, strerror(errno));
            return abort_upload(req, 507, "insufficient_storage",
                                "no room for the upload on the server (--upload-dir)");
        }
        req->spool_fd = fd;
        free(req->body);
        req->body = NULL;
        req->body_cap = 0;
    }
    if (req->spool_fd >= 0) {
        if (write_all(req->spool_fd, data, n) != 0) {
            SRV_LOG(SRV_LOG_ERROR, req->id, "cannot spool an upload in %s: %s",
                    req->h->upload_dir, strerror(errno));
            return abort_upload(req, 507, "insufficient_storage",
                                "no room for the upload on the server (--upload-dir)");
        }
        req->body_len += n;
        return MHD_YES;
    }
    if (req->body_len + n + 1 > req->body_cap) {
        /* Doubling, but never past the limit (+ the NUL): a body the route
         * accepts never costs more than its limit. */
        size_t ncap = req->body_cap ? req->body_cap : 1024;
        while (ncap < req->body_len + n + 1)
            ncap *= 2;
        if (ncap > req->body_limit + 1)
            ncap = req->body_limit + 1;
        char *nb = realloc(req->body, ncap);
        if (!nb)
            return MHD_NO;
        req->body = nb;
        req->body_cap = ncap;
    }
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
    return MHD_YES;
}

static enum MHD_Result run_handler(srv_req_t *req);

/* Queues whatever the producer decided for a deferred stream, or suspends
 * again when it has not decided yet. */
static enum MHD_Result answer_deferred(srv_req_t *req)
{
    srv_stream_t *s = req->stream;
    pthread_mutex_lock(&s->hub->lock);
    int mode = s->mode, closed = s->closed, gone = s->cancelled;
    int status = s->status;
    char *ctype = s->ctype;
    s->ctype = NULL;
    hdrlist_t extra = s->headers;
    memset(&s->headers, 0, sizeof s->headers);
    char *body = NULL;
    size_t blen = 0;
    if (mode == MODE_REPLY) {
        if (s->off)
            memmove(s->buf, s->buf + s->off, s->len - s->off);
        body = s->buf;
        blen = s->len - s->off;
        s->buf = NULL;
        s->off = s->len = s->cap = 0;
    }
    pthread_mutex_unlock(&s->hub->lock);
    enum MHD_Result r;
    if (gone || req->client_gone)
        r = MHD_NO;
    else if (mode == MODE_REPLY && body) {
        r = queue_buffer_owned(req, status, ctype, body, blen, &extra); /* takes body */
        body = NULL;
    } else if (mode == MODE_REPLY)
        r = queue_buffer(req, status, ctype, "", 0, &extra);
    else if (mode == MODE_STREAMING)
        r = queue_stream(req, s, status, ctype, &extra);
    else if (mode == MODE_RERUN) {
        /* the request as it was received, its handler again: the stream
         * and the headers added for the first answer go */
        pthread_mutex_lock(&s->hub->lock);
        s->req = NULL;
        pthread_mutex_unlock(&s->hub->lock);
        srv_http_stream_unref(s);
        req->stream = NULL;
        srv_http_hdrlist_clear(&req->headers);
        r = run_handler(req);
    }
    else if (closed)
        r = queue_error(req, 500, "server_error", "internal", "the request was dropped", NULL);
    else {
        req->phase = PH_WAITING;
        req_suspend(req);
        r = MHD_YES;
    }
    free(body);
    free(ctype);
    srv_http_hdrlist_clear(&extra);
    return r;
}

static enum MHD_Result run_handler(srv_req_t *req)
{
    if (req->cx)
        req->cx->deadline_ms = 0; /* the request is in: the request timeout stops */
    if (req->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", req->body_limit);
        return queue_error(req, 413, "invalid_request_error", "request_too_large", msg, NULL);
    }
    if (req->spool_fd >= 0 && spool_load(req) != 0) {
        SRV_LOG(SRV_LOG_ERROR, req->id, "cannot read a spooled upload of %zu bytes back",
                req->body_len);
        hdrlist_t extra = {0};
        srv_http_hdrlist_add(&extra, "Retry-After", "1");
        enum MHD_Result r = queue_error(req, 503, "server_error", "service_unavailable",
                                        "the server cannot hold the body now; retry shortly",
                                        &extra);
        srv_http_hdrlist_clear(&extra);
        return r;
    }
    req->phase = PH_HANDLER;
    req->runs++;
    req->route->fn(req, req->route->ud);
    if (req->phase == PH_ANSWERED)
        return MHD_YES;
    if (req->stream)
        return answer_deferred(req);
    SRV_LOG(SRV_LOG_ERROR, req->id, "handler for %s %s returned without answering",
            req->method, req->route->pattern);
    return queue_error(req, 500, "server_error", "internal", "the handler did not answer",
                       NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    srv_http_t *h = cls;
    srv_req_t *req = *con_cls;
    if (!req) {
        req = req_new(h, c, url, method);
        if (!req)
            return MHD_NO;
        req->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
        *con_cls = req;
        return on_headers(h, req);
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->phase != PH_RECEIVING)
            return MHD_YES; /* an early answer is queued: drop the rest */
        /* Past the limit (or when the upload cannot be spooled) on_body
         * answers at once and returns MHD_NO, which closes the connection
         * (abort_upload says why it does not go through MHD). */
        return on_body(req, upload_data, n);
    }
    switch (req->phase) {
    case PH_RECEIVING:
        return run_handler(req);
    case PH_HELD:
        return queue_buffer(req, req->held_status, req->held_ctype, req->held_body,
                            req->held_len, &req->held_extra);
    case PH_WAITING:
        return answer_deferred(req);
    default:
        return MHD_YES;
    }
}

static const char *outcome_name(enum MHD_RequestTerminationCode toe, const srv_req_t *req)
{
    if (req->client_gone)
        return "client_gone";
    if (req->cx && req->cx->cut)
        return "request_timeout";
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK: return "ok";
    case MHD_REQUEST_TERMINATED_WITH_ERROR: return "error";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return "idle_timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return "shutdown";
    case MHD_REQUEST_TERMINATED_READ_ERROR: return "read_error";
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT: return "client_gone";
    }
    return "unknown";
}

static const char *method_label(const char *m)
{
    static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS",
                                        "PATCH", NULL};
    for (int i = 0; known[i]; i++)
        if (strcmp(m, known[i]) == 0)
            return known[i];
    return "other";
}

/* The end of a request: its stream, the access line, metrics; frees req. */
static void req_complete(srv_http_t *h, srv_req_t *req, enum MHD_RequestTerminationCode toe)
{
    if (req->inj) {
        req->inj->done = 1;
        req->inj->cut = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    }
    if (req->hup) {
        uv_poll_stop(req->hup);
        req->hup->data = NULL;
        uv_close((uv_handle_t *)req->hup, on_hup_closed);
        req->hup = NULL;
    }
    srv_stream_t *s = req->stream;
    if (s) {
        pthread_mutex_lock(&s->hub->lock);
        int finished = s->closed && !s->abort && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        s->req = NULL;
        pthread_mutex_unlock(&s->hub->lock);
        if (!finished)
            srv_http_stream_cancel(h, s);
        srv_http_stream_unref(s);
        req->stream = NULL;
    }
    if (req->inflight)
        h->inflight--;
    if (req->upload_slot)
        h->uploads--;
    req->upload_slot = 0;
    spool_free(req);
    if (req->cx) {
        req->cx->busy = 0;
        req->cx->served++;
        req->cx->idle_since_ms = now_ms();
        req->cx->deadline_ms = h->request_timeout_s ? now_ms() + h->request_timeout_s * 1000ull
                                                    : 0;
        /* Draining: a keep-alive connection whose response was queued before
         * the drain began must not wait for another request. The response is
         * fully written by now; the shutdown only ends the connection. */
        if (h->draining && req->cx->fd >= 0)
            shutdown(req->cx->fd, SHUT_RDWR);
    }
    const char *outcome = req->outcome ? req->outcome : outcome_name(toe, req);
    double ms = (double)(uv_hrtime() - req->t_start_ns) / 1e6;
    srv_log_access(&(srv_log_access_rec_t){
        .req_id = req->id,
        .method = req->method,
        .path = req->path,
        .route = req->route ? req->route->pattern : NULL,
        .peer = req->peer,
        .status = req->status,
        .bytes_in = req->body_len,
        .bytes_out = req->bytes_out,
        .duration_ms = ms,
        .outcome = outcome,
    });
    if (h->metrics) {
        char code[16];
        snprintf(code, sizeof code, "%d", req->status);
        const char *route = req->route ? req->route->pattern : "unmatched";
        srv_metric_add(h->m_requests,
                       (const char *[]){method_label(req->method), route, code}, 1);
        srv_metric_observe(h->m_duration, (const char *[]){route}, ms / 1000.0);
        srv_metric_set(h->m_inflight, NULL, (double)h->inflight);
    }
    if (req->prev)
        req->prev->next = req->next;
    else
        h->reqs = req->next;
    if (req->next)
        req->next->prev = req->prev;
    req_free(req);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)c;
    srv_req_t *req = *con_cls;
    if (!req)
        return;
    *con_cls = NULL;
    req_complete(cls, req, toe);
}

/* ---- injected requests ---- */

static int buf_add(char **buf, size_t *len, const void *data, size_t n)
{
    char *nb = realloc(*buf, *len + n + 1);
    if (!nb)
        return -1;
    memcpy(nb + *len, data, n);
    *len += n;
    nb[*len] = '\0';
    *buf = nb;
    return 0;
}

static void add_result_header(void *to, const char *name, const char *value)
{
    srv_http_result_t *r = to;
    size_t len = r->headers ? strlen(r->headers) : 0;
    if (buf_add(&r->headers, &len, name, strlen(name)) || buf_add(&r->headers, &len, ": ", 2) ||
        buf_add(&r->headers, &len, value, strlen(value)) || buf_add(&r->headers, &len, "\n", 1))
        r->oom = 1;
}

/* What queue_response does for a connection: the status and headers, and a
 * whole body (body non-NULL) or the start of a streamed one (NULL). */
static enum MHD_Result inject_answer(srv_req_t *req, int status, const char *ctype,
                                     const hdrlist_t *extra, const void *body, size_t len)
{
    srv_http_result_t *out = req->inj;
    out->status = status;
    response_headers(req, ctype, extra, add_result_header, out);
    free(out->content_type);
    out->content_type = ctype ? strdup(ctype) : NULL;
    if (body && buf_add(&out->body, &out->body_len, body, len))
        out->oom = 1;
    req->phase = PH_ANSWERED;
    req->status = status;
    req->bytes_out += len;
    if (body)
        req->inj_end = 1;
    return MHD_YES;
}

/* One step of a runnable injected request, as MHD_run would take it: the
 * held answer, the deferred one, or the streamed body so far; the end. */
static void inject_step(srv_req_t *req)
{
    srv_http_t *h = req->h;
    enum MHD_Result r = MHD_YES;
    if (!req->inj_end) {
        switch (req->phase) {
        case PH_HELD:
            r = queue_buffer(req, req->held_status, req->held_ctype, req->held_body,
                             req->held_len, &req->held_extra);
            break;
        case PH_WAITING:
            r = answer_deferred(req);
            break;
        case PH_ANSWERED:
            for (;;) {
                char buf[READER_BLOCK];
                ssize_t n = stream_reader(req->stream, 0, buf, sizeof buf);
                if (n > 0 && buf_add(&req->inj->body, &req->inj->body_len, buf, (size_t)n))
                    req->inj->oom = 1;
                if (n > 0)
                    continue;
                if (n == MHD_CONTENT_READER_END_OF_STREAM)
                    req->inj_end = 1;
                else if (n != 0)
                    req->inj_end = 2;
                break; /* 0: suspended until the producer writes */
            }
            break;
        default:
            req->inj_end = 2;
            break;
        }
    }
    if (r != MHD_YES)
        req->inj_end = 2;
    if (req->inj_end)
        req_complete(h, req, req->inj_end == 1 ? MHD_REQUEST_TERMINATED_COMPLETED_OK
                                               : MHD_REQUEST_TERMINATED_WITH_ERROR);
}

/* Steps every injected request that is not waiting for its producer. Each
 * step ends suspended, answered or complete, so this ends. */
static void inject_run(srv_http_t *h)
{
    for (;;) {
        srv_req_t *req = h->reqs;
        while (req && !(req->inj && !req->suspended))
            req = req->next;
        if (!req)
            return;
        inject_step(req);
    }
}

static int inject_query(srv_req_t *req, char *q)
{
    while (q && *q) {
        char *next = strchr(q, '&');
        if (next)
            *next++ = '\0';
        char *v = strchr(q, '=');
        if (v)
            *v++ = '\0';
        for (char *p = q; *p; p++)
            if (*p == '+')
                *p = ' ';
        for (char *p = v; p && *p; p++)
            if (*p == '+')
                *p = ' ';
        MHD_http_unescape(q);
        if (v)
            MHD_http_unescape(v);
        if (*q && srv_http_hdrlist_add(&req->inj_query, q, v ? v : "") == SRV_HTTP_ENOMEM)
            return SRV_HTTP_ENOMEM;
        q = next;
    }
    return 0;
}

int srv_http_inject(srv_http_t *h, const srv_http_inject_t *in, srv_http_result_t *out)
{
    memset(out, 0, sizeof *out);
    if (!h || !in || !in->method || !*in->method || !in->url || h->stage != OPEN ||
        (in->n_headers && !in->headers) || (in->body_len && !in->body))
        return SRV_HTTP_EINVAL;
    for (size_t i = 0; i < in->n_headers; i++)
        if (!srv_http_header_received(in->headers[2 * i], in->headers[2 * i + 1]))
            return SRV_HTTP_EINVAL;
    char *url = strdup(in->url);
    if (!url)
        return SRV_HTTP_ENOMEM;
    char *q = strchr(url, '?');
    if (q)
        *q++ = '\0';
    MHD_http_unescape(url);
    srv_req_t *req = req_alloc(h, NULL, url, in->method);
    int rc = req ? inject_query(req, q) : SRV_HTTP_ENOMEM;
    if (req) {
        req->bad_target = srv_http_target_check(in->url, strlen(in->url)) != 0;
        req->inj_body_len = in->body_len;
    }
    free(url);
    for (size_t i = 0; rc == 0 && i < in->n_headers; i++)
        rc = srv_http_hdrlist_add_received(&req->inj_headers, in->headers[2 * i],
                                           in->headers[2 * i + 1]);
    if (rc) {
        if (req)
            req_free(req);
        return rc;
    }
    req->inj = out;
    req->http11 = 1;
    snprintf(req->peer, sizeof req->peer, "inject");
    req_start(h, req);
    enum MHD_Result r = on_headers(h, req);
    if (r == MHD_YES && req->phase == PH_RECEIVING) {
        if (in->body_len)
            r = on_body(req, in->body, in->body_len);
        if (r == MHD_YES)
            r = run_handler(req);
    }
    if (r != MHD_YES)
        req->inj_end = 2;
    run_mhd(h); /* steps it, with everything else */
    return 0;
}

void srv_http_result_free(srv_http_result_t *r)
{
    if (!r)
        return;
    free(r->content_type);
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv_http_t *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        h->n_mhd++;
        /* the front door hands connections on from inside
         * MHD_add_connection: their peer and start time come along */
        gate_conn_t *from = h->adding;
        uint64_t t0 = from ? from->t_accept_ms : now_ms();
        conn_t *cx = calloc(1, sizeof *cx);
        if (!cx)
            return; /* no request timeout; its peer stays counted by the door */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cx->fd = ci ? ci->connect_fd : -1;
        cx->deadline_ms = h->request_timeout_s ? t0 + h->request_timeout_s * 1000ull : 0;
        cx->idle_since_ms = t0;
        if (from) {
            cx->peer = from->peer;
            from->peer = NULL;
        }
        cx->next = h->conns;
        if (h->conns)
            h->conns->prev = cx;
        h->conns = cx;
        *socket_context = cx;
        if (h->m_conns)
            srv_metric_add(h->m_conns, NULL, 1);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (h->n_mhd)
            h->n_mhd--;
        /* a slot is free: the door hands a waiting connection on after
         * this MHD_run (not from inside it) */
        h->gate_kick = 1;
        h->rerun = 1;
        conn_t *cx = *socket_context;
        if (!cx)
            return;
        if (cx->peer && !cx->uncounted)
            srv_http_gate_release(h, cx->peer);
        /* libmicrohttpd closes the socket after this call, having sent its
         * FIN; a duplicate keeps it open to drain what the client still
         * sends (an upload answered early), so the answer is not lost to a
         * reset */
        int unread = 0;
        if (cx->fd >= 0 && h->stage == OPEN &&
            (cx->linger || (ioctl(cx->fd, FIONREAD, &unread) == 0 && unread > 0))) {
            int dupfd = fcntl(cx->fd, F_DUPFD_CLOEXEC, 0);
            if (dupfd >= 0)
                srv_http_gate_linger(h, dupfd);
        }
        if (cx->prev)
            cx->prev->next = cx->next;
        else
            h->conns = cx->next;
        if (cx->next)
            cx->next->prev = cx->prev;
        free(cx);
        *socket_context = NULL;
        if (h->m_conns)
            srv_metric_add(h->m_conns, NULL, -1);
    }
}

/* libmicrohttpd shows the request target here as sent, before it decodes
 * it into the path the access handler gets (cut at a decoded NUL). The
 * verdict waits on the connection for that request's first access call. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_t *cx = ci ? ci->socket_context : NULL;
    if (cx && uri)
        cx->bad_target = srv_http_target_check(uri, strlen(uri)) != 0;
    return NULL; /* *con_cls stays NULL until the access handler's first call */
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (SRV_LOG_DEBUG > srv_log_level())
        return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    SRV_LOG(SRV_LOG_DEBUG, NULL, "libmicrohttpd: %s", msg);
}

/* ---- the loop side ---- */

static void on_mhd_timer(uv_timer_t *t)
{
    run_mhd(t->data);
}

static void on_mhd_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    run_mhd(p->data);
}

static void run_mhd(srv_http_t *h)
{
    if (h->stage == CLOSED)
        return;
    if (h->in_run) {
        h->rerun = 1;
        return;
    }
    h->in_run = 1;
    do {
        h->rerun = 0;
        MHD_run(h->d);
        inject_run(h);
        srv_http_process_pending(h);
        if (h->gate_kick)
            srv_http_gate_kick(h);
    } while (h->rerun);
    h->in_run = 0;
    MHD_UNSIGNED_LONG_LONG t = 0;
    if (MHD_get_timeout(h->d, &t) == MHD_YES)
        uv_timer_start(&h->mhd_timer, on_mhd_timer, (uint64_t)t, 0);
    else
        uv_timer_stop(&h->mhd_timer);
}

static void on_async(uv_async_t *a)
{
    srv_http_t *h = a->data;
    hub_t *hub = h->hub;
    pthread_mutex_lock(&hub->lock);
    srv_stream_t *list = hub->dirty;
    hub->dirty = NULL;
    for (srv_stream_t *s = list; s; s = s->dirty_next)
        s->dirty = 0;
    pthread_mutex_unlock(&hub->lock);
    while (list) {
        srv_stream_t *s = list;
        list = s->dirty_next;
        s->dirty_next = NULL;
        if (s->req)
            req_resume(s->req);
        srv_http_stream_unref(s);
    }
    if (h->stage != CLOSED)
        run_mhd(h);
}

static void on_sweep(uv_timer_t *t)
{
    srv_http_t *h = t->data;
    uint64_t now = now_ms();
    for (conn_t *cx = h->conns; cx; cx = cx->next) {
        if (cx->cut || cx->fd < 0 || !cx->deadline_ms || now < cx->deadline_ms)
            continue;
        /* MHD owns the descriptor; shutting it down (not closing it) makes
         * the next read fail, and MHD closes the connection itself. */
        cx->cut = 1;
        shutdown(cx->fd, SHUT_RDWR);
        srv_http_note(h, NOTE_TIMEOUT, "request timeout: closing a connection that took over %us",
                      h->request_timeout_s);
        if (h->m_timeouts)
            srv_metric_add(h->m_timeouts, NULL, 1);
    }
    /* the door's connections: header, request and idle timeouts, lingering */
    srv_http_gate_sweep(h, now);
    if (h->gate_kick)
        run_mhd(h);
}

/* ---- construction ---- */

static int listen_socket(const char *host, int port, int *is_v6, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portbuf[16];
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(portbuf, sizeof portbuf, "%d", port);
    int gai = getaddrinfo(host, portbuf, &hints, &res);
    if (gai) {
        snprintf(err, errlen, "cannot resolve listen address '%s': %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    int saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, LISTEN_BACKLOG) == 0) {
            *is_v6 = ai->ai_family == AF_INET6;
            break;
        }
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(saved));
    return fd;
}

static void register_metrics(srv_http_t *h)
{
    static const double buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,  5,     10,   30,  60,   300};
    srv_metrics_t *m = h->metrics;
    h->m_requests = srv_metrics_counter(m, "darkserve_http_requests_total",
                                        "HTTP requests completed, by method, route and status",
                                        (const char *[]){"method", "route", "code", NULL});
    h->m_duration = srv_metrics_histogram(
        m, "darkserve_http_request_duration_seconds",
        "time from request headers to the end of the response", (const char *[]){"route", NULL},
        buckets, sizeof buckets / sizeof buckets[0]);
    h->m_inflight = srv_metrics_gauge(m, "darkserve_http_inflight_requests",
                                      "requests being answered (streams, deferred answers)", NULL);
    h->m_conns = srv_metrics_gauge(m, "darkserve_http_connections", "open client connections",
                                   NULL);
    h->m_cancels = srv_metrics_counter(
        m, "darkserve_http_stream_cancels_total",
        "streamed or deferred answers cancelled (client gone, timeout, shutdown)", NULL);
    h->m_timeouts = srv_metrics_counter(m, "darkserve_http_request_timeouts_total",
                                        "connections cut by the request timeout", NULL);
    h->m_refused = srv_metrics_counter(
        m, "darkserve_http_connections_refused_total",
        "connections refused or shed at the door: per_address (429, "
        "--max-connections-per-address), overload (503, no slot), shed (408, the oldest "
        "connection still without its headers, for a newcomer)",
        (const char *[]){"reason", NULL});
}

static char **copy_strings(const char *const *v, size_t n)
{
    char **out = calloc(n ? n : 1, sizeof *out);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!(out[i] = strdup(v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            free(out);
            return NULL;
        }
    }
    return out;
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static void http_free(srv_http_t *h)
{
    for (size_t i = 0; i < h->nroutes; i++)
        srv_http_route_clear(&h->routes[i]);
    free(h->routes);
    free_strings(h->api_keys, h->n_api_keys);
    free(h->api_key_admin);
    free_strings(h->cors, h->n_cors);
    free(h->upload_dir);
    while (h->peers) {
        peer_t *p = h->peers;
        h->peers = p->next;
        free(p);
    }
    if (h->hub) {
        int free_hub;
        pthread_mutex_lock(&h->hub->lock);
        srv_http_hub_unref_locked(h->hub, &free_hub);
        pthread_mutex_unlock(&h->hub->lock);
        if (free_hub)
            srv_http_hub_free(h->hub);
    }
    free(h);
}

srv_http_t *srv_http_new(uv_loop_t *loop, const srv_http_opts_t *o, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        errlen = sizeof dummy;
    }
    srv_http_t *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int fd = -1;
    h->loop = loop;
    h->run = run_mhd;
    h->listen_fd = -1;
    h->max_body = o->max_body ? o->max_body : DEFAULT_MAX_BODY;
    h->max_conns = o->max_connections ? o->max_connections : DEFAULT_MAX_CONN;
    h->max_per_addr = o->max_connections_per_address;
    h->idle_timeout_s = o->idle_timeout_s;
    h->max_uploads = o->max_uploads ? o->max_uploads : DEFAULT_MAX_UPLOADS;
    const char *udir = o->upload_dir && *o->upload_dir ? o->upload_dir : getenv("TMPDIR");
    h->upload_dir = strdup(udir && *udir ? udir : "/tmp");
    h->stream_buf = o->stream_max_buffered ? o->stream_max_buffered : DEFAULT_STREAM_BUF;
    h->request_timeout_s = o->request_timeout_s;
    h->header_timeout_s = o->header_timeout_s;
    h->metrics = o->metrics;
    h->n_api_keys = o->n_api_keys;
    h->n_cors = o->n_cors_origins;
    h->api_keys = copy_strings(o->api_keys, o->n_api_keys);
    h->api_key_admin = calloc(o->n_api_keys ? o->n_api_keys : 1, 1);
    if (h->api_key_admin && o->api_key_admin && o->n_api_keys)
        memcpy(h->api_key_admin, o->api_key_admin, o->n_api_keys);
    h->cors = copy_strings(o->cors_origins, o->n_cors_origins);
    h->hub = calloc(1, sizeof *h->hub);
    if (!h->api_keys || !h->api_key_admin || !h->cors || !h->hub || !h->upload_dir) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    pthread_mutex_init(&h->hub->lock, NULL);
    h->hub->refs = 1;
    h->hub->loop_thread = pthread_self();
    uint64_t seed = 0;
    if (srv_random_bytes(&seed, sizeof seed) != 0)
        seed = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    h->rid_state = seed;
    if (h->metrics)
        register_metrics(h);

    /* an upload directory that cannot take a file fails now, not at the
     * first large upload */
    int probe = spool_open(h);
    if (probe < 0) {
        snprintf(err, errlen, "cannot create temporary files in the upload directory %s: %s",
                 h->upload_dir, strerror(errno));
        goto fail;
    }
    close(probe);
    int v6 = 0;
    if (!o->no_listen) {
        fd = listen_socket(o->host ? o->host : "127.0.0.1", o->port, &v6, err, errlen);
        if (fd < 0)
            goto fail;
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    (void)v6; /* libmicrohttpd makes no socket: the family is the door's business */
    /* libmicrohttpd listens on nothing: the front door (http_gate.c)
     * accepts, and hands each connection on with MHD_add_connection once
     * its first request's head is in and checked. Its per-address limit is
     * the door's too (counting only open connections). */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    h->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
        MHD_OPTION_CONNECTION_LIMIT, h->max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
        o->idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
        MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "libmicrohttpd failed to start (epoll mode)");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!di || di->epoll_fd < 0) {
        snprintf(err, errlen, "libmicrohttpd has no epoll descriptor");
        goto fail;
    }
    /* the listen socket's watch first: each failure below leaves no handle
     * to close but this one */
    if (fd >= 0) {
        if (srv_http_gate_start(h, fd) != 0) {
            snprintf(err, errlen, "cannot watch the listen socket");
            goto fail;
        }
        fd = -1; /* the door's now (h->listen_fd) */
    }
    if (uv_poll_init(loop, &h->mhd_poll, di->epoll_fd) != 0) {
        snprintf(err, errlen, "cannot watch libmicrohttpd's epoll descriptor");
        if (h->listen_fd >= 0) {
            /* the watch lives in h until the loop closes it: h is leaked
             * rather than freed under it (this start fails anyway) */
            uv_close((uv_handle_t *)&h->listen_poll, NULL);
            close(h->listen_fd);
            MHD_stop_daemon(h->d);
            return NULL;
        }
        goto fail;
    }
    h->mhd_poll.data = h;
    uv_timer_init(loop, &h->mhd_timer);
    h->mhd_timer.data = h;
    uv_timer_init(loop, &h->sweep);
    h->sweep.data = h;
    uv_async_init(loop, &h->async, on_async);
    h->async.data = h;
    h->handles_open += 4; /* and the listen socket's watch, if any */
    h->hub->async = &h->async;
    if (h->listen_fd >= 0)
        uv_poll_start(&h->listen_poll, UV_READABLE, srv_http_gate_on_listen);
    uv_poll_start(&h->mhd_poll, UV_READABLE, on_mhd_poll);
    /* timeouts and lingering closes */
    uv_timer_start(&h->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    /* Arms the timer and accepts anything already queued. */
    run_mhd(h);
    return h;
fail:
    if (fd >= 0)
        close(fd);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (h->d)
        MHD_stop_daemon(h->d);
    http_free(h);
    return NULL;
}

int srv_http_port(const srv_http_t *h)
{
    return h->port;
}

void srv_http_drain(srv_http_t *h)
{
    if (h->draining)
        return;
    h->draining = 1;
    /* Idle keep-alive connections (served before) are closed now; busy ones
     * after their response (on_completed). A connection that has not
     * completed a request yet may be a client racing the signal: it is left
     * to send its request and get the 503, bounded by the request timeout. */
    for (conn_t *cx = h->conns; cx; cx = cx->next)
        if (!cx->busy && cx->served > 0 && cx->fd >= 0)
            shutdown(cx->fd, SHUT_RDWR);
}

void srv_http_set_ready(srv_http_t *h, int ready)
{
    h->not_ready = !ready;
}

int srv_http_draining(const srv_http_t *h)
{
    return h->draining;
}

size_t srv_http_inflight(const srv_http_t *h)
{
    return h->inflight;
}

void srv_http_cancel_all(srv_http_t *h)
{
    for (srv_req_t *req = h->reqs; req; req = req->next) {
        if (req->stream)
            srv_http_stream_cancel(h, req->stream);
        req_resume(req);
    }
    run_mhd(h);
}

static void on_handle_closed(uv_handle_t *hnd)
{
    srv_http_t *h = hnd->data;
    if (--h->handles_open > 0)
        return;
    void (*done)(void *) = h->done;
    void *ud = h->done_ud;
    http_free(h);
    if (done)
        done(ud);
}

void srv_http_close(srv_http_t *h, void (*done)(void *ud), void *ud)
{
    if (h->stage != OPEN)
        return;
    h->stage = CLOSING;
    h->done = done;
    h->done_ud = ud;
    /* no new connections; the ones at the door go */
    srv_http_gate_close(h);
    /* MHD must not be stopped with suspended connections: resume them all,
     * cancelled, and let one MHD_run close them. */
    srv_http_cancel_all(h);
    uv_poll_stop(&h->mhd_poll);
    MHD_stop_daemon(h->d); /* remaining requests complete with DAEMON_SHUTDOWN */
    h->d = NULL;
    for (srv_req_t *req = h->reqs, *next; req; req = next) {
        next = req->next;
        if (req->inj) /* MHD does not know these */
            req_complete(h, req, MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN);
    }
    h->stage = CLOSED;
    srv_http_process_pending(h);
    pthread_mutex_lock(&h->hub->lock);
    h->hub->async = NULL; /* producers now see every stream as cancelled */
    srv_stream_t *list = h->hub->dirty;
    h->hub->dirty = NULL;
    pthread_mutex_unlock(&h->hub->lock);
    while (list) {
        srv_stream_t *s = list;
        list = s->dirty_next;
        pthread_mutex_lock(&s->hub->lock);
        s->dirty = 0;
        pthread_cond_broadcast(&s->cond);
        srv_http_stream_unref_unlock(s);
    }
    if (h->listen_fd >= 0) {
        uv_close((uv_handle_t *)&h->listen_poll, on_handle_closed);
        close(h->listen_fd);
        h->listen_fd = -1;
    }
    uv_close((uv_handle_t *)&h->mhd_poll, on_handle_closed);
    uv_close((uv_handle_t *)&h->mhd_timer, on_handle_closed);
    uv_close((uv_handle_t *)&h->sweep, on_handle_closed);
    uv_close((uv_handle_t *)&h->async, on_handle_closed);
}
