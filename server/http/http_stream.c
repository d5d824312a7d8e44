/* server/http/http_stream.c — the hub and the streams of the HTTP server
 * (server/http/http_impl.h): stream references, the dirty list that producers
 * fill and the loop drains, the loop's pending callbacks, and the producer
 * API (srv_stream_*, server/http/http.h; the test-only ones in
 * server/http/http_test.h) that any thread calls.
 */
#include "server/http/http.h"
#include "server/http/http_impl.h"
#include "server/http/http_test.h"

#include "server/base/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the hub and stream references ---- */

void srv_http_hub_unref_locked(hub_t *hub, int *free_it)
{
    *free_it = --hub->refs == 0;
}

void srv_http_hub_free(hub_t *hub)
{
    pthread_mutex_destroy(&hub->lock);
    free(hub);
}

static int on_loop_thread(const hub_t *hub)
{
    return pthread_equal(pthread_self(), hub->loop_thread);
}

/* Drops one stream reference; hub->lock held on entry, released on return. */
void srv_http_stream_unref_unlock(srv_stream_t *s)
{
    hub_t *hub = s->hub;
    int free_hub = 0;
    if (--s->refs > 0) {
        pthread_mutex_unlock(&hub->lock);
        return;
    }
    srv_http_hub_unref_locked(hub, &free_hub);
    pthread_mutex_unlock(&hub->lock);
    pthread_cond_destroy(&s->cond);
    free(s->buf);
    free(s->ctype);
    srv_http_hdrlist_clear(&s->headers);
    free(s);
    if (free_hub)
        srv_http_hub_free(hub);
}

void srv_http_stream_unref(srv_stream_t *s)
{
    pthread_mutex_lock(&s->hub->lock);
    srv_http_stream_unref_unlock(s);
}

/* Tells the loop about news on s (hub->lock held). */
static void stream_mark_dirty_locked(srv_stream_t *s)
{
    hub_t *hub = s->hub;
    if (!s->dirty && hub->async) {
        s->dirty = 1;
        s->refs++;
        s->dirty_next = hub->dirty;
        hub->dirty = s;
        uv_async_send(hub->async);
    }
}

/* Queues a callback for the loop to run outside MHD_run (loop thread). */
void srv_http_pending_add(srv_http_t *h, srv_stream_t *s, unsigned flag)
{
    if (!s->pend) {
        pthread_mutex_lock(&s->hub->lock);
        s->refs++;
        pthread_mutex_unlock(&s->hub->lock);
        s->pend_next = h->pending;
        h->pending = s;
    }
    s->pend |= flag;
}

/* Marks s cancelled (loop thread); the on_cancel callback follows. */
void srv_http_stream_cancel(srv_http_t *h, srv_stream_t *s)
{
    int live = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (!s->cancelled) {
        s->cancelled = 1;
        live = !s->closed;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->hub->lock);
    if (live && s->on_cancel)
        srv_http_pending_add(h, s, PEND_CANCEL);
    if (live && h->m_cancels)
        srv_metric_add(h->m_cancels, NULL, 1);
}

/* Runs one callback unless the producer closed the stream; close() waits for
 * a running callback, so ud stays valid for its duration. */
static void stream_fire(srv_stream_t *s, void (*cb)(srv_stream_t *, void *))
{
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed || !cb) {
        pthread_mutex_unlock(&s->hub->lock);
        return;
    }
    s->in_cb++;
    pthread_mutex_unlock(&s->hub->lock);
    cb(s, s->cb_ud);
    pthread_mutex_lock(&s->hub->lock);
    if (--s->in_cb == 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->hub->lock);
}

void srv_http_process_pending(srv_http_t *h)
{
    while (h->pending) {
        srv_stream_t *s = h->pending;
        h->pending = s->pend_next;
        unsigned pend = s->pend;
        s->pend = 0;
        s->pend_next = NULL;
        if (pend & PEND_CANCEL)
            stream_fire(s, s->on_cancel);
        else if (pend & PEND_WRITABLE)
            stream_fire(s, s->on_writable);
        srv_http_stream_unref(s);
    }
}

/* ---- streams: the producer API ---- */

srv_stream_t *srv_http_stream_new(srv_req_t *req, const srv_stream_opts_t *so)
{
    srv_http_t *h = req->h;
    srv_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (pthread_cond_init(&s->cond, NULL)) {
        free(s);
        return NULL;
    }
    s->hub = h->hub;
    s->max_buffered = so && so->max_buffered ? so->max_buffered : h->stream_buf;
    if (so) {
        s->on_cancel = so->on_cancel;
        s->on_writable = so->on_writable;
        s->cb_ud = so->ud;
        s->probe = so->probe;
    }
    s->refs = 2; /* producer + request */
    s->req = req;
    pthread_mutex_lock(&h->hub->lock);
    h->hub->refs++;
    pthread_mutex_unlock(&h->hub->lock);
    req->stream = s;
    if (!req->inflight) {
        req->inflight = 1;
        h->inflight++;
        if (h->m_inflight)
            srv_metric_set(h->m_inflight, NULL, (double)h->inflight);
    }
    return s;
}


int srv_stream_add_header(srv_stream_t *s, const char *name, const char *value)
{
    pthread_mutex_lock(&s->hub->lock);
    int rc = s->mode != MODE_DEFERRED || s->closed ? SRV_HTTP_ESTATE
                                                   : srv_http_hdrlist_add(&s->headers, name, value);
    pthread_mutex_unlock(&s->hub->lock);
    return rc;
}

/* Copies data into the buffer (hub->lock held). */
static int buf_append(srv_stream_t *s, const void *data, size_t len)
{
    if (s->off > 0 && s->len + len > s->cap) {
        memmove(s->buf, s->buf + s->off, s->len - s->off);
        s->len -= s->off;
        s->off = 0;
    }
    if (s->len + len > s->cap) {
        size_t ncap = s->cap ? s->cap : 4096;
        while (ncap < s->len + len)
            ncap *= 2;
        char *nb = realloc(s->buf, ncap);
        if (!nb)
            return SRV_HTTP_ENOMEM;
        s->buf = nb;
        s->cap = ncap;
    }
    if (len)
        memcpy(s->buf + s->len, data, len);
    s->len += len;
    return 0;
}

static int stream_gone_locked(const srv_stream_t *s)
{
    return s->cancelled || !s->hub->async;
}

int srv_stream_begin(srv_stream_t *s, int status, const char *content_type)
{
    if (status < 100 || status > 999)
        return SRV_HTTP_EINVAL;
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed || s->mode != MODE_DEFERRED) {
        rc = SRV_HTTP_ESTATE;
    } else if (stream_gone_locked(s)) {
        rc = SRV_HTTP_ECANCELED;
    } else {
        char *ct = content_type ? strdup(content_type) : NULL;
        if (content_type && !ct) {
            rc = SRV_HTTP_ENOMEM;
        } else {
            s->ctype = ct;
            s->status = status;
            s->mode = MODE_STREAMING;
            stream_mark_dirty_locked(s);
        }
    }
    pthread_mutex_unlock(&s->hub->lock);
    return rc;
}

int srv_stream_write(srv_stream_t *s, const void *data, size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed || s->mode != MODE_STREAMING) {
        rc = SRV_HTTP_ESTATE;
    } else if (stream_gone_locked(s)) {
        rc = SRV_HTTP_ECANCELED;
    } else if (len == 0) {
        rc = 0;
    } else if (s->len - s->off > 0 && s->len - s->off + len > s->max_buffered) {
        s->want_writable = 1;
        rc = SRV_HTTP_EAGAIN;
    } else {
        rc = buf_append(s, data, len);
        if (rc == 0)
            stream_mark_dirty_locked(s);
    }
    pthread_mutex_unlock(&s->hub->lock);
    return rc;
}

size_t srv_stream_space(srv_stream_t *s)
{
    pthread_mutex_lock(&s->hub->lock);
    size_t used = s->len - s->off;
    size_t space = used >= s->max_buffered ? 0 : s->max_buffered - used;
    if (space == 0)
        s->want_writable = 1; /* the caller will wait for on_writable */
    pthread_mutex_unlock(&s->hub->lock);
    return space;
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int srv_stream_wait_writable(srv_stream_t *s, size_t need, int timeout_ms)
{
    struct timespec ts;
    if (timeout_ms >= 0)
        deadline_after(&ts, timeout_ms);
    if (need > s->max_buffered)
        need = s->max_buffered;
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    for (;;) {
        if (stream_gone_locked(s)) {
            rc = SRV_HTTP_ECANCELED;
            break;
        }
        size_t used = s->len - s->off;
        size_t space = used < s->max_buffered ? s->max_buffered - used : 0;
        if (used == 0 || space >= need)
            break;
        int w = timeout_ms >= 0 ? pthread_cond_timedwait(&s->cond, &s->hub->lock, &ts)
                                : pthread_cond_wait(&s->cond, &s->hub->lock);
        if (w == ETIMEDOUT) {
            rc = SRV_HTTP_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&s->hub->lock);
    return rc;
}

int srv_stream_cancelled(srv_stream_t *s)
{
    pthread_mutex_lock(&s->hub->lock);
    int c = stream_gone_locked(s);
    pthread_mutex_unlock(&s->hub->lock);
    return c;
}

/* Marks closed, waits out a running callback, drops the producer's
 * reference. hub->lock held on entry, released on return. */
static void stream_close_locked(srv_stream_t *s, int mode)
{
    s->closed = 1;
    s->abort = mode == SRV_STREAM_ABORT;
    stream_mark_dirty_locked(s);
    pthread_cond_broadcast(&s->cond);
    if (!on_loop_thread(s->hub))
        while (s->in_cb > 0)
            pthread_cond_wait(&s->cond, &s->hub->lock);
    srv_http_stream_unref_unlock(s);
}

void srv_stream_close(srv_stream_t *s, int mode)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed) {
        /* A second close is a caller bug; the reference is already gone. */
        pthread_mutex_unlock(&s->hub->lock);
        return;
    }
    stream_close_locked(s, mode);
}

int srv_stream_reply_take(srv_stream_t *s, int status, const char *content_type, void *body,
                          size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->hub->lock);
        free(body);
        return SRV_HTTP_ESTATE;
    }
    if (s->mode != MODE_DEFERRED || status < 100 || status > 999) {
        rc = SRV_HTTP_ESTATE;
    } else if (stream_gone_locked(s)) {
        rc = SRV_HTTP_ECANCELED;
    } else {
        char *ct = content_type ? strdup(content_type) : NULL;
        if (content_type && !ct) {
            rc = SRV_HTTP_ENOMEM;
        } else {
            /* the answer is body itself: answer_deferred hands it to MHD */
            free(s->buf);
            s->buf = body;
            s->off = 0;
            s->len = s->cap = body ? len : 0;
            body = NULL;
            s->ctype = ct;
            s->status = status;
            s->mode = MODE_REPLY;
        }
    }
    free(body);
    stream_close_locked(s, rc == 0 ? SRV_STREAM_END : SRV_STREAM_ABORT);
    return rc;
}

int srv_stream_rerun(srv_stream_t *s)
{
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->hub->lock);
        return SRV_HTTP_ESTATE;
    }
    if (s->mode != MODE_DEFERRED)
        rc = SRV_HTTP_ESTATE;
    else if (stream_gone_locked(s))
        rc = SRV_HTTP_ECANCELED;
    else
        s->mode = MODE_RERUN;
    stream_close_locked(s, rc == 0 ? SRV_STREAM_END : SRV_STREAM_ABORT);
    return rc;
}

int srv_req_runs(const srv_req_t *req)
{
    return req->runs;
}

int srv_stream_reply(srv_stream_t *s, int status, const char *content_type, const void *body,
                     size_t len)
{
    int rc = 0;
    pthread_mutex_lock(&s->hub->lock);
    if (s->closed) {
        /* A second close is a caller bug; the reference is already gone. */
        pthread_mutex_unlock(&s->hub->lock);
        return SRV_HTTP_ESTATE;
    }
    if (s->mode != MODE_DEFERRED || status < 100 || status > 999) {
        rc = SRV_HTTP_ESTATE;
    } else if (stream_gone_locked(s)) {
        rc = SRV_HTTP_ECANCELED;
    } else {
        char *ct = content_type ? strdup(content_type) : NULL;
        if ((content_type && !ct) || buf_append(s, body, body ? len : 0)) {
            free(ct);
            rc = SRV_HTTP_ENOMEM;
        } else {
            s->ctype = ct;
            s->status = status;
            s->mode = MODE_REPLY;
        }
    }
    stream_close_locked(s, rc == 0 ? SRV_STREAM_END : SRV_STREAM_ABORT);
    return rc;
}

