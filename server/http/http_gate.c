/* server/http/http_gate.c — the front door: the server's own accept loop in
 * front of libmicrohttpd (which runs without a listen socket and gets each
 * connection through MHD_add_connection).
 *
 * Why a door of our own:
 *   - A connection counts against --max-connections inside libmicrohttpd
 *     only once its first request's head is complete. Before that it waits
 *     here, where a slow or half-open client (slowloris, a flood that
 *     reconnects when cut) costs a descriptor and a small struct, never a
 *     slot that /health needs. When this waiting room is full the oldest
 *     half-open connection is shed (408) for the newcomer, who is likely to
 *     send its head at once.
 *   - The per-address bound counts connections that are open: a connection
 *     the client already closed but libmicrohttpd has not reaped yet is
 *     checked (a peek that reads end-of-file) before a newcomer is refused.
 *     A refusal is an answer (429, Connection: close), logged (rate-limited)
 *     and counted in darkserve_http_connections_refused_total{reason}.
 *   - The first request's head is read with MSG_PEEK and checked against
 *     RFC 9112 (server/http/http_frame.c) on the raw bytes before
 *     libmicrohttpd parses them: a NUL in a value, obsolete line folding, a
 *     Content-Length it would answer with a malformed response of its own,
 *     a chunk size beyond the route's body limit when the first chunk line
 *     came with the head. A bad head is answered here (one well-formed JSON
 *     error, Connection: close) and the connection lingers.
 *   - Closing a connection whose client may still be sending (an early
 *     answer to an upload) goes through a lingering close: the answer and a
 *     FIN, then what the client still sends is read and dropped for
 *     LINGER_MS, so its reads see the answer rather than a reset.
 * Later requests on a kept-alive connection are read by libmicrohttpd
 * directly; the request hook (server/http/http.c check_headers) applies the
 * field rules to them (see docs/DESIGN.md §4 for which layer does what).
 *
 * Everything here runs on the loop thread. Ownership: a gate_conn_t owns its
 * descriptor until it is closed or handed to libmicrohttpd, and its poll
 * handle, whose close callback frees the struct.
 */
#include "server/http/http_impl.h"

#include "server/base/log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* At most this many accepts per readiness callback, so a storm of new
 * connections cannot keep the loop from everything else. */
#define ACCEPT_BATCH 64

static const char *const note_reason[NOTE_N] = {"per_address", "shed", "overload", "timeout",
                                                "accept"};

static uint64_t gate_now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

void srv_http_note(srv_http_t *h, int kind, const char *fmt, ...)
{
    note_t *n = &h->notes[kind];
    uint64_t now = gate_now_ms();
    if (n->last_ms && now - n->last_ms < NOTE_EVERY_MS) {
        n->unsaid++;
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n->unsaid)
        SRV_LOG(SRV_LOG_WARN, NULL, "%s (and %u more like it in the last %us)", msg, n->unsaid,
                (unsigned)((now - n->last_ms) / 1000u));
    else
        SRV_LOG(SRV_LOG_WARN, NULL, "%s", msg);
    n->last_ms = now;
    n->unsaid = 0;
}

static void count_refusal(srv_http_t *h, int kind)
{
    if (h->m_refused)
        srv_metric_add(h->m_refused, (const char *[]){note_reason[kind]}, 1);
}

/* ---- peers ---- */

static peer_t *peer_get(srv_http_t *h, const struct sockaddr *sa)
{
    unsigned char addr[16] = {0};
    int family = sa->sa_family;
    if (family == AF_INET)
        memcpy(addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    else if (family == AF_INET6)
        memcpy(addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    /* a linear list: it holds only addresses with open connections, at most
     * 2 * max_conns of them */
    for (peer_t *p = h->peers; p; p = p->next)
        if (p->family == family && memcmp(p->addr, addr, sizeof addr) == 0)
            return p;
    peer_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->family = family;
    memcpy(p->addr, addr, sizeof addr);
    if (!inet_ntop(family, addr, p->text, sizeof p->text))
        snprintf(p->text, sizeof p->text, "?");
    p->next = h->peers;
    h->peers = p;
    return p;
}

void srv_http_gate_release(srv_http_t *h, peer_t *p)
{
    if (!p || p->open == 0)
        return;
    if (--p->open > 0)
        return;
    for (peer_t **pp = &h->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            free(p);
            return;
        }
}

/* 1 when the client closed fd (end-of-file is all there is to read). */
static int peer_closed(int fd)
{
    char c;
    return fd >= 0 && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void conn_drop(gate_conn_t *gc);

/* Before refusing p's newcomer: stop counting its connections the client
 * has closed already (libmicrohttpd reaps them at its next run), then,
 * while p is still over its bound, close its kept-alive connections that
 * wait between requests, the longest idle first. A client that drops its
 * connection without closing the socket (requests.post leaves it to the
 * garbage collector) holds such connections; the newcomer has a request
 * to make, and an idle kept-alive connection may be closed at any time
 * (RFC 9112 9.6). */
static void peer_reconcile(srv_http_t *h, peer_t *p, unsigned bound)
{
    for (conn_t *cx = h->conns; cx && p->open; cx = cx->next) {
        if (cx->peer != p || cx->uncounted || cx->busy || !peer_closed(cx->fd))
            continue;
        cx->uncounted = 1;
        srv_http_gate_release(h, p); /* p lives on: the newcomer holds its caller's ref */
    }
    for (gate_conn_t *gc = h->heads.first, *next; gc; gc = next) {
        next = gc->next;
        if (gc->peer == p && peer_closed(gc->fd))
            conn_drop(gc);
    }
    while (p->open > bound) {
        conn_t *idle = NULL;
        for (conn_t *cx = h->conns; cx; cx = cx->next)
            if (cx->peer == p && !cx->uncounted && !cx->busy && cx->fd >= 0 &&
                (!idle || cx->idle_since_ms < idle->idle_since_ms))
                idle = cx;
        if (!idle)
            return;
        idle->uncounted = 1;
        srv_http_gate_release(h, p);
        /* libmicrohttpd sees the end at its next read and closes it */
        shutdown(idle->fd, SHUT_RDWR);
        SRV_LOG(SRV_LOG_DEBUG, NULL,
                "closed an idle kept-alive connection of %s for a new one "
                "(--max-connections-per-address %u)",
                p->text, bound);
    }
}

/* ---- lists ---- */

static gate_list_t *list_of(srv_http_t *h, int state)
{
    return state == GATE_HEAD ? &h->heads : state == GATE_READY ? &h->ready : &h->lingers;
}

static void list_add(gate_list_t *l, gate_conn_t *gc)
{
    gc->prev = l->last;
    gc->next = NULL;
    if (l->last)
        l->last->next = gc;
    else
        l->first = gc;
    l->last = gc;
    l->n++;
}

static void list_del(gate_list_t *l, gate_conn_t *gc)
{
    if (gc->prev)
        gc->prev->next = gc->next;
    else
        l->first = gc->next;
    if (gc->next)
        gc->next->prev = gc->prev;
    else
        l->last = gc->prev;
    gc->prev = gc->next = NULL;
    l->n--;
}

static void on_conn_poll_closed(uv_handle_t *hnd)
{
    free(hnd); /* the poll is the struct's first member */
}

/* Unlists gc and closes its poll; the struct goes in the close callback,
 * never here, so a loop that forgets one connection never frees what
 * another still points to. The descriptor is the caller's business. */
static void conn_forget(gate_conn_t *gc)
{
    srv_http_t *h = gc->h;
    list_del(list_of(h, gc->state), gc);
    if (gc->peer) {
        srv_http_gate_release(h, gc->peer);
        gc->peer = NULL;
    }
    uv_poll_stop(&gc->poll);
    uv_close((uv_handle_t *)&gc->poll, on_conn_poll_closed);
}

/* A new connection of the door on fd (not listed yet), or NULL. */
static gate_conn_t *conn_new(srv_http_t *h, int fd)
{
    gate_conn_t *gc = calloc(1, sizeof *gc);
    if (!gc)
        return NULL;
    if (uv_poll_init(h->loop, &gc->poll, fd) != 0) {
        free(gc);
        return NULL;
    }
    gc->poll.data = gc;
    gc->h = h;
    gc->fd = fd;
    return gc;
}

static void conn_drop(gate_conn_t *gc)
{
    int fd = gc->fd;
    conn_forget(gc);
    if (fd >= 0)
        close(fd);
}

static void on_conn_poll(uv_poll_t *p, int status, int events);

/* libuv polls level-triggered and the door only peeks, so a half-sent head
 * would keep the socket readable and the loop spinning: the low-water mark
 * makes it readable again only when a byte more than was seen has come
 * (Linux honours SO_RCVLOWAT in poll). Back to 1 before anyone reads. */
static void set_lowat(int fd, size_t n)
{
    int v = n > (size_t)HEAD_MAX * 2 ? (int)HEAD_MAX * 2 : (int)n;
    if (v < 1)
        v = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
}

/* ---- lingering ---- */

/* One buffer for every discarding read: the loop thread is the only reader. */
static char g_sink[64 * 1024];

static void linger_read(gate_conn_t *gc)
{
    for (;;) {
        ssize_t n = recv(gc->fd, g_sink, sizeof g_sink, MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        conn_drop(gc); /* end of file or an error: the client is done */
        return;
    }
}

/* gc (or a new struct, for gc NULL) becomes a lingering connection on fd. */
static void linger_start(srv_http_t *h, gate_conn_t *gc, int fd)
{
    if (h->lingers.n >= LINGER_MAX || h->stage != OPEN) {
        if (gc)
            conn_drop(gc);
        else
            close(fd);
        return;
    }
    /* the answer is out (or queued): a FIN after it ends the client's read */
    shutdown(fd, SHUT_WR);
    set_lowat(fd, 1);
    if (!gc) {
        gc = conn_new(h, fd);
        if (!gc) {
            close(fd);
            return;
        }
        gc->state = GATE_LINGER;
        list_add(&h->lingers, gc);
    } else {
        if (gc->peer) {
            srv_http_gate_release(h, gc->peer);
            gc->peer = NULL;
        }
        list_del(list_of(h, gc->state), gc);
        gc->state = GATE_LINGER;
        list_add(&h->lingers, gc);
    }
    gc->linger_end_ms = gate_now_ms() + LINGER_MS;
    uv_poll_start(&gc->poll, UV_READABLE | UV_DISCONNECT, on_conn_poll);
    linger_read(gc);
}

void srv_http_gate_linger(srv_http_t *h, int fd)
{
    linger_start(h, NULL, fd);
}

/* ---- answers written by the door ---- */

/* Writes a whole error answer to a connection nothing else writes to. The
 * socket's buffer of a fresh connection takes it in one piece; a part
 * write only shortens what a client that stopped reading gets. */
static void door_answer(int fd, int status, const char *type, const char *code, const char *msg,
                        const char *req_id, int retry_after)
{
    char buf[1024];
    size_t n = srv_http_error_bytes(buf, sizeof buf, status, type, code, msg, req_id,
                                    retry_after);
    if (n)
        (void)send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A head the door refused: the answer, the access line, the metric, then a
 * lingering close. */
static void head_refuse(gate_conn_t *gc, const srv_http_head_t *hd, const char *buf)
{
    srv_http_t *h = gc->h;
    const srv_http_frame_t *f = &hd->frame;
    char id[REQ_ID_MAX + 1];
    size_t idl = strlen(hd->req_id);
    int id_ok = idl > 0;
    for (size_t i = 0; i < idl && id_ok; i++)
        id_ok = isalnum((unsigned char)hd->req_id[i]) || strchr("._:-", hd->req_id[i]);
    if (id_ok)
        snprintf(id, sizeof id, "%s", hd->req_id);
    else
        srv_http_new_req_id(h, id);
    const char *type = f->status == 501 || f->status == 505 ? "server_error"
                                                            : "invalid_request_error";
    door_answer(gc->fd, f->status, type, f->code, f->msg, id, 0);
    char path[256] = "";
    if (hd->target_len) {
        size_t n = hd->target_len < sizeof path - 1 ? hd->target_len : sizeof path - 1;
        memcpy(path, buf + hd->target_off, n);
        path[n] = '\0';
    }
    double ms = (double)(gate_now_ms() - gc->t_accept_ms);
    srv_log_access(&(srv_log_access_rec_t){.req_id = id,
                                           .method = hd->method[0] ? hd->method : "?",
                                           .path = path,
                                           .peer = gc->peer ? gc->peer->text : NULL,
                                           .status = f->status,
                                           .duration_ms = ms,
                                           .outcome = "malformed"});
    if (h->metrics) {
        char code[16];
        snprintf(code, sizeof code, "%d", f->status);
        srv_metric_add(h->m_requests, (const char *[]){"other", "unmatched", code}, 1);
    }
    SRV_LOG(SRV_LOG_DEBUG, id, "refused a request head from %s: %s",
            gc->peer ? gc->peer->text : "?", f->msg);
    linger_start(h, gc, gc->fd);
}

/* The body limit of the route a head's method and target reach, or 0 when
 * none does (the request hook answers those). */
static size_t head_body_limit(srv_http_t *h, const srv_http_head_t *hd, const char *buf)
{
    static char path[HEAD_MAX + 1]; /* loop thread only */
    size_t n = hd->target_len;
    const char *q = memchr(buf + hd->target_off, '?', n);
    if (q)
        n = (size_t)(q - (buf + hd->target_off));
    memcpy(path, buf + hd->target_off, n);
    path[n] = '\0';
    MHD_http_unescape(path);
    for (size_t i = 0; i < h->nroutes; i++) {
        const route_t *r = &h->routes[i];
        if (srv_http_route_match(r, path, NULL) == 1 && srv_http_method_matches(r, hd->method))
            return r->max_body;
    }
    return 0;
}

/* ---- handing on ---- */

/* Gives gc's connection to libmicrohttpd (the caller checked for a slot);
 * gc goes. */
static void hand_on(gate_conn_t *gc)
{
    srv_http_t *h = gc->h;
    int fd = gc->fd;
    gc->fd = -1;
    set_lowat(fd, 1);
    /* on_connection (http.c) takes gc's peer and start time over, inside
     * MHD_add_connection */
    h->adding = gc;
    enum MHD_Result r = MHD_add_connection(h->d, fd, (const struct sockaddr *)&gc->sa,
                                           (socklen_t)gc->salen);
    h->adding = NULL;
    if (r != MHD_YES) /* libmicrohttpd closed fd */
        srv_http_note(h, NOTE_OVERLOAD, "libmicrohttpd refused a connection from %s",
                      gc->peer ? gc->peer->text : "?");
    conn_forget(gc);
    h->run(h);
}

void srv_http_gate_kick(srv_http_t *h)
{
    h->gate_kick = 0;
    /* hand_on runs libmicrohttpd only after this (h->run from inside
     * run_mhd defers), so the list changes only by what it unlists */
    for (gate_conn_t *gc = h->ready.first, *next;
         gc && h->n_mhd < h->max_conns && h->stage == OPEN; gc = next) {
        next = gc->next;
        hand_on(gc);
    }
}

/* ---- reading a head ---- */

static void head_read(gate_conn_t *gc, int events)
{
    static char buf[HEAD_MAX + 64]; /* loop thread only */
    srv_http_t *h = gc->h;
    ssize_t n = recv(gc->fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        conn_drop(gc); /* gone before it asked anything */
        return;
    }
    if (n < 0)
        return;
    if ((size_t)n > gc->seen) {
        gc->seen = (size_t)n;
        gc->last_io_ms = gate_now_ms();
    }
    srv_http_head_t hd;
    if (srv_http_head_scan(buf, (size_t)n, HEAD_MAX, &hd) == 0) {
        if (events & UV_DISCONNECT) {
            conn_drop(gc); /* it shut its side before the head was whole */
            return;
        }
        set_lowat(gc->fd, (size_t)n + 1); /* a peek sees it all again next time */
        return;
    }
    if (hd.frame.status) {
        head_refuse(gc, &hd, buf);
        return;
    }
    if (hd.first_chunk_known) {
        size_t limit = head_body_limit(h, &hd, buf);
        if (limit && hd.first_chunk > limit) {
            hd.frame.status = 413;
            hd.frame.code = "request_too_large";
            snprintf(hd.frame.msg, sizeof hd.frame.msg,
                     "a chunk of the body exceeds the limit of %zu bytes", limit);
            head_refuse(gc, &hd, buf);
            return;
        }
    }
    if (h->n_mhd < h->max_conns) {
        hand_on(gc);
        return;
    }
    /* no slot: it waits, oldest first, until libmicrohttpd closes one */
    uv_poll_stop(&gc->poll);
    list_del(&h->heads, gc);
    gc->state = GATE_READY;
    list_add(&h->ready, gc);
}

static void on_conn_poll(uv_poll_t *p, int status, int events)
{
    gate_conn_t *gc = p->data;
    if (gc->state == GATE_LINGER) {
        if (status < 0)
            conn_drop(gc);
        else
            linger_read(gc);
        return;
    }
    if (status < 0) {
        conn_drop(gc);
        return;
    }
    head_read(gc, events);
}

/* ---- accepting ---- */

/* Room for one more connection at the door: sheds the oldest half-open one
 * when full. 0 when there is room now. */
static int make_room(srv_http_t *h)
{
    if (h->heads.n + h->ready.n < h->max_conns)
        return 0;
    if (!h->heads.first)
        return -1; /* every waiting connection has asked already */
    /* the address with the most connections still without a head pays:
     * a flood from a few addresses is shed before anyone else's slow
     * client; its oldest goes */
    peer_t *worst = NULL;
    for (gate_conn_t *gc = h->heads.first; gc; gc = gc->next)
        if (gc->peer && ++gc->peer->waiting > (worst ? worst->waiting : 0))
            worst = gc->peer;
    gate_conn_t *old = h->heads.first;
    for (gate_conn_t *gc = h->heads.first; gc; gc = gc->next) {
        if (gc->peer)
            gc->peer->waiting = 0;
        if (worst && gc->peer == worst && old->peer != worst)
            old = gc;
    }
    door_answer(old->fd, 408, "invalid_request_error", "request_timeout",
                "too many connections are waiting for their headers: the oldest go", "-", 0);
    count_refusal(h, NOTE_SHED);
    srv_http_note(h, NOTE_SHED,
                  "shed a connection from %s that had not sent its headers after %llu ms "
                  "(%zu connections wait at the door, --max-connections %u)",
                  old->peer ? old->peer->text : "?",
                  (unsigned long long)(gate_now_ms() - old->t_accept_ms), h->heads.n,
                  h->max_conns);
    conn_drop(old);
    return 0;
}

static void accept_one(srv_http_t *h, int fd, const struct sockaddr_storage *ss, socklen_t sl)
{
    peer_t *p = peer_get(h, (const struct sockaddr *)ss);
    if (!p) {
        close(fd);
        return;
    }
    p->open++; /* held while deciding, so reconciling cannot free it */
    if (h->max_per_addr && p->open > h->max_per_addr) {
        peer_reconcile(h, p, h->max_per_addr);
        if (p->open > h->max_per_addr) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "too many connections from your address (%u open; the limit is %u)",
                     p->open - 1, h->max_per_addr);
            door_answer(fd, 429, "rate_limit_error", "too_many_connections", msg, "-", 1);
            count_refusal(h, NOTE_PER_ADDRESS);
            srv_http_note(h, NOTE_PER_ADDRESS,
                          "refused a connection from %s: %u open from that address "
                          "(--max-connections-per-address %u)",
                          p->text, p->open - 1, h->max_per_addr);
            srv_http_gate_release(h, p);
            linger_start(h, NULL, fd);
            return;
        }
    }
    if (make_room(h) != 0) {
        door_answer(fd, 503, "server_error", "service_unavailable",
                    "the server has no connection slot free; retry shortly", "-", 1);
        count_refusal(h, NOTE_OVERLOAD);
        srv_http_note(h, NOTE_OVERLOAD,
                      "refused a connection from %s: %zu connections wait for a slot "
                      "(--max-connections %u)",
                      p->text, h->ready.n, h->max_conns);
        srv_http_gate_release(h, p);
        linger_start(h, NULL, fd);
        return;
    }
    gate_conn_t *gc = conn_new(h, fd);
    if (!gc) {
        srv_http_gate_release(h, p);
        close(fd);
        return;
    }
    gc->state = GATE_HEAD;
    memcpy(&gc->sa, ss, sl);
    gc->salen = (unsigned)sl;
    gc->peer = p;
    gc->t_accept_ms = gc->last_io_ms = gate_now_ms();
    list_add(&h->heads, gc);
    uv_poll_start(&gc->poll, UV_READABLE | UV_DISCONNECT, on_conn_poll);
    head_read(gc, 0); /* a client that wrote right after connecting need not wait */
}

void srv_http_gate_on_listen(uv_poll_t *p, int status, int events)
{
    srv_http_t *h = p->data;
    (void)events;
    if (status < 0 || h->stage != OPEN)
        return;
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        socklen_t sl = sizeof ss;
        int fd = accept4(h->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* the listen socket stays readable: pause until the next
                 * sweep rather than spin */
                srv_http_note(h, NOTE_ACCEPT, "cannot accept connections: %s; pausing 1 s",
                              strerror(errno));
                uv_poll_stop(&h->listen_poll);
                h->listen_paused = 1;
            }
            return;
        }
        if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) {
            close(fd);
            continue;
        }
        accept_one(h, fd, &ss, sl);
    }
}

int srv_http_gate_start(srv_http_t *h, int listen_fd)
{
    h->listen_fd = listen_fd;
    if (uv_poll_init(h->loop, &h->listen_poll, listen_fd) != 0)
        return -1;
    h->listen_poll.data = h;
    h->handles_open++;
    return 0;
}

static void drop_all(gate_list_t *l)
{
    for (gate_conn_t *gc = l->first, *next; gc; gc = next) {
        next = gc->next;
        conn_drop(gc);
    }
}

void srv_http_gate_close(srv_http_t *h)
{
    drop_all(&h->heads);
    drop_all(&h->ready);
    drop_all(&h->lingers);
    if (h->listen_fd >= 0)
        uv_poll_stop(&h->listen_poll);
}

void srv_http_gate_sweep(srv_http_t *h, uint64_t now)
{
    if (h->listen_paused && h->stage == OPEN) {
        h->listen_paused = 0;
        uv_poll_start(&h->listen_poll, UV_READABLE, srv_http_gate_on_listen);
    }
    for (gate_conn_t *gc = h->heads.first, *next; gc; gc = next) {
        next = gc->next;
        const char *why = NULL;
        unsigned lim = 0;
        int counted = 1; /* idle cuts are not, as libmicrohttpd's are not */
        if (h->header_timeout_s && now >= gc->t_accept_ms + h->header_timeout_s * 1000ull) {
            why = "header";
            lim = h->header_timeout_s;
        } else if (h->request_timeout_s &&
                   now >= gc->t_accept_ms + h->request_timeout_s * 1000ull) {
            why = "request";
            lim = h->request_timeout_s;
        } else if (h->idle_timeout_s && now >= gc->last_io_ms + h->idle_timeout_s * 1000ull) {
            why = "idle";
            lim = h->idle_timeout_s;
            counted = 0;
        }
        if (!why)
            continue;
        door_answer(gc->fd, 408, "invalid_request_error", "request_timeout",
                    "the request headers did not arrive in time", "-", 0);
        if (counted && h->m_timeouts)
            srv_metric_add(h->m_timeouts, NULL, 1);
        srv_http_note(h, NOTE_TIMEOUT, "%s timeout: closing a connection from %s %s %us", why,
                      gc->peer ? gc->peer->text : "?",
                      counted ? "whose headers took over" : "that sent nothing for", lim);
        conn_drop(gc);
    }
    for (gate_conn_t *gc = h->ready.first, *next; gc; gc = next) {
        next = gc->next;
        if (!h->request_timeout_s || now < gc->t_accept_ms + h->request_timeout_s * 1000ull)
            continue;
        door_answer(gc->fd, 503, "server_error", "service_unavailable",
                    "no connection slot became free in time; retry shortly", "-", 1);
        count_refusal(h, NOTE_OVERLOAD);
        srv_http_note(h, NOTE_OVERLOAD,
                      "no slot for a connection from %s within --request-timeout %us",
                      gc->peer ? gc->peer->text : "?", h->request_timeout_s);
        linger_start(h, gc, gc->fd);
    }
    for (gate_conn_t *gc = h->lingers.first, *next; gc; gc = next) {
        next = gc->next;
        if (now >= gc->linger_end_ms)
            conn_drop(gc);
    }
}
