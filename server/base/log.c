/* server/base/log.c — process-wide line logger (see log.h).
 *
 * Lines are assembled in a stack buffer with every control character escaped,
 * so a message can never forge a second line, then written with one write(2)
 * under a mutex. The file descriptor is swapped with dup2() on reopen so a
 * writer racing with SIGHUP never sees a closed descriptor.
 */
#include "server/base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int log_level_v = SRV_LOG_INFO;
static srv_log_format_t log_format = SRV_LOG_FORMAT_TEXT;
static int log_fd = STDERR_FILENO; /* guarded by log_lock */
static char *log_path;             /* guarded by log_lock; NULL = stderr */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static const char *level_name(srv_log_level_t level)
{
    if ((int)level < 0 || (int)level > SRV_LOG_DEBUG)
        return "?";
    return level_names[level];
}

srv_log_level_t srv_log_level(void)
{
    return (srv_log_level_t)atomic_load_explicit(&log_level_v, memory_order_relaxed);
}

static int open_log_file(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && err)
        snprintf(err, errlen, "cannot open log file '%s': %s", path, strerror(errno));
    return fd;
}

int srv_log_init(srv_log_level_t level, srv_log_format_t format, const char *path, char *err,
                 size_t errlen)
{
    int fd = STDERR_FILENO;
    char *copy = NULL;
    if (path && *path) {
        copy = strdup(path);
        if (!copy) {
            if (err)
                snprintf(err, errlen, "out of memory");
            return -1;
        }
        fd = open_log_file(path, err, errlen);
        if (fd < 0) {
            free(copy);
            return -1;
        }
    }
    pthread_mutex_lock(&log_lock);
    if (log_fd != STDERR_FILENO)
        close(log_fd);
    free(log_path);
    log_fd = fd;
    log_path = copy;
    log_format = format;
    atomic_store(&log_level_v, (int)level);
    pthread_mutex_unlock(&log_lock);
    return 0;
}

void srv_log_shutdown(void)
{
    pthread_mutex_lock(&log_lock);
    if (log_fd != STDERR_FILENO)
        close(log_fd);
    log_fd = STDERR_FILENO;
    free(log_path);
    log_path = NULL;
    pthread_mutex_unlock(&log_lock);
}

static void log_plain(srv_log_level_t level, const char *msg);

int srv_log_reopen(void)
{
    char err[256];
    int rc = 0;
    pthread_mutex_lock(&log_lock);
    if (log_path) {
        int fd = open_log_file(log_path, err, sizeof err);
        if (fd < 0) {
            rc = -1;
        } else {
            /* dup2 swaps atomically: no window where log_fd is closed. */
            if (dup2(fd, log_fd) < 0) {
                snprintf(err, sizeof err, "cannot reopen log file: %s", strerror(errno));
                rc = -1;
            }
            close(fd);
        }
    }
    pthread_mutex_unlock(&log_lock);
    if (rc)
        log_plain(SRV_LOG_ERROR, err);
    return rc;
}

/* ---- line assembly ---- */

typedef struct line {
    char buf[SRV_LOG_LINE_MAX + 8];
    size_t len;
    int full;
} line_t;

/* Room kept for "...\n" when a line is cut. */
#define LINE_LIMIT (SRV_LOG_LINE_MAX - 5)

static void put_raw(line_t *l, const char *s, size_t n)
{
    if (l->full)
        return;
    /* All or nothing, so a cut never splits an escape sequence or a UTF-8
     * character (the cut JSON line must still parse). */
    if (n > LINE_LIMIT - l->len) {
        l->full = 1;
        return;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void put_str(line_t *l, const char *s)
{
    put_raw(l, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    size_t n;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    unsigned cp = c & (0x3Fu >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

enum esc_mode {
    ESC_TEXT = 0,   /* control bytes as \n \r \t \xNN */
    ESC_JSON = 1,   /* JSON string rules */
    ESC_QUOTED = 2  /* text, plus \" and \\ inside a quoted field */
};

/* Appends s escaped for mode; a line can never be split by its content.
 * Invalid UTF-8 bytes become '?' so JSON lines stay valid. */
static void put_escaped(line_t *l, const char *s, int mode)
{
    int json = mode == ESC_JSON;
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    size_t i = 0;
    char tmp[8];
    while (i < n && !l->full) {
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t k = utf8_len(p + i, n - i);
            if (k == 0) {
                put_raw(l, "?", 1);
                i++;
            } else {
                put_raw(l, s + i, k);
                i += k;
            }
            continue;
        }
        if ((c == '"' || c == '\\') && mode != ESC_TEXT) {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            put_raw(l, tmp, 2);
        } else if (c == '\n') {
            put_raw(l, "\\n", 2);
        } else if (c == '\r') {
            put_raw(l, "\\r", 2);
        } else if (c == '\t') {
            put_raw(l, "\\t", 2);
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, json ? "\\u%04x" : "\\x%02x", c);
            put_raw(l, tmp, strlen(tmp));
        } else {
            put_raw(l, s + i, 1);
        }
        i++;
    }
}

static void put_timestamp(line_t *l)
{
    struct timespec ts;
    struct tm tm;
    char buf[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    put_str(l, buf);
}

static void line_begin(line_t *l, srv_log_level_t level, const char *req_id, int json)
{
    l->len = 0;
    l->full = 0;
    if (json) {
        put_str(l, "{\"ts\":\"");
        put_timestamp(l);
        put_str(l, "\",\"level\":\"");
        put_str(l, level_name(level));
        put_str(l, "\"");
        if (req_id && *req_id) {
            put_str(l, ",\"rid\":\"");
            put_escaped(l, req_id, ESC_JSON);
            put_str(l, "\"");
        }
    } else {
        put_timestamp(l);
        put_str(l, " ");
        put_str(l, level_name(level));
        if (req_id && *req_id) {
            put_str(l, " [");
            put_escaped(l, req_id, ESC_TEXT);
            put_str(l, "]");
        }
        put_str(l, " ");
    }
}

static void line_emit(line_t *l, int json)
{
    if (l->full) {
        /* A cut JSON line still has to parse: close the string and object. */
        memcpy(l->buf + l->len, json ? "...\"}" : "...", json ? 5 : 3);
        l->len += json ? 5 : 3;
    } else if (json) {
        put_raw(l, "}", 1);
    }
    l->buf[l->len++] = '\n';
    pthread_mutex_lock(&log_lock);
    size_t off = 0;
    while (off < l->len) {
        ssize_t w = write(log_fd, l->buf + off, l->len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; /* nowhere left to report a logging failure */
        off += (size_t)w;
    }
    pthread_mutex_unlock(&log_lock);
}

static srv_log_format_t current_format(void)
{
    pthread_mutex_lock(&log_lock);
    srv_log_format_t f = log_format;
    pthread_mutex_unlock(&log_lock);
    return f;
}

static void log_line(srv_log_level_t level, const char *req_id, const char *msg)
{
    line_t l;
    int json = current_format() == SRV_LOG_FORMAT_JSON;
    line_begin(&l, level, req_id, json);
    if (json) {
        put_str(&l, ",\"msg\":\"");
        put_escaped(&l, msg, ESC_JSON);
        if (!l.full)
            put_str(&l, "\"");
    } else {
        put_escaped(&l, msg, ESC_TEXT);
    }
    line_emit(&l, json);
}

static void log_plain(srv_log_level_t level, const char *msg)
{
    log_line(level, NULL, msg);
}

void srv_log_write(srv_log_level_t level, const char *req_id, const char *fmt, ...)
{
    char msg[SRV_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_line(level, req_id, msg);
}

static void put_field_str(line_t *l, int json, const char *key, const char *val, int quote)
{
    if (!val)
        return;
    if (json) {
        put_str(l, ",\"");
        put_str(l, key);
        put_str(l, "\":\"");
        put_escaped(l, val, ESC_JSON);
        put_str(l, "\"");
    } else {
        put_str(l, " ");
        put_str(l, key);
        put_str(l, quote ? "=\"" : "=");
        put_escaped(l, val, quote ? ESC_QUOTED : ESC_TEXT);
        if (quote)
            put_str(l, "\"");
    }
}

static void put_field_num(line_t *l, int json, const char *key, const char *num)
{
    if (json) {
        put_str(l, ",\"");
        put_str(l, key);
        put_str(l, "\":");
    } else {
        put_str(l, " ");
        put_str(l, key);
        put_str(l, "=");
    }
    put_str(l, num);
}

void srv_log_access(const srv_log_access_rec_t *r)
{
    if (SRV_LOG_INFO > srv_log_level())
        return;
    line_t l;
    char num[48];
    int json = current_format() == SRV_LOG_FORMAT_JSON;
    line_begin(&l, SRV_LOG_INFO, r->req_id, json);
    if (json)
        put_str(&l, ",\"msg\":\"access\"");
    else
        put_str(&l, "access");
    put_field_str(&l, json, "method", r->method, 0);
    put_field_str(&l, json, "path", r->path, 1);
    put_field_str(&l, json, "route", r->route, 1);
    snprintf(num, sizeof num, "%d", r->status);
    put_field_num(&l, json, "status", num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)r->bytes_in);
    put_field_num(&l, json, "bytes_in", num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)r->bytes_out);
    put_field_num(&l, json, "bytes_out", num);
    snprintf(num, sizeof num, "%.3f", r->duration_ms);
    put_field_num(&l, json, "ms", num);
    put_field_str(&l, json, "peer", r->peer, 0);
    put_field_str(&l, json, "outcome", r->outcome, 0);
    if (json && l.full) {
        /* Field-level cut would leave broken JSON; fall back to a short line. */
        line_begin(&l, SRV_LOG_INFO, r->req_id, json);
        put_str(&l, ",\"msg\":\"access (record too long)\"");
    }
    line_emit(&l, json);
}
