/* server/base/log.h — the daemon's logger: one line per event, text or JSON, to
 * stderr or a file that SIGHUP reopens (logrotate's copytruncate is not
 * needed).
 *
 * Only server/ logs; core/ and proto/ return errors instead. Every line names
 * the request it belongs to when there is one, so one grep on a request id
 * (the X-Request-Id header a client saw) finds everything about it.
 *
 *   SRV_LOG(SRV_LOG_WARN, req_id, "queue full (%zu jobs)", n);   req_id may be NULL
 *
 * The level check happens before the arguments are evaluated. The logger is
 * process-wide (a log file is a process resource) and thread-safe: each line
 * is formatted into one buffer and written with a single write(2) under a
 * lock, so lines from the loop and the scheduler threads never interleave.
 *
 * Text line:  2024-05-01T12:00:00.123Z info [rid] message
 * JSON line:  {"ts":"2024-05-01T12:00:00.123Z","level":"info","rid":"...","msg":"..."}
 * Access lines (srv_log_access) carry their fields as key=value pairs in text
 * and as separate JSON members.
 */
#ifndef DARKSERVE_SERVER_LOG_H
#define DARKSERVE_SERVER_LOG_H

#include <stddef.h>
#include <stdint.h>

typedef enum srv_log_level {
    SRV_LOG_ERROR = 0,
    SRV_LOG_WARN = 1,
    SRV_LOG_INFO = 2,
    SRV_LOG_DEBUG = 3
} srv_log_level_t;

typedef enum srv_log_format {
    SRV_LOG_FORMAT_TEXT = 0,
    SRV_LOG_FORMAT_JSON = 1
} srv_log_format_t;

/* Longest line written; a longer message is cut and ends with "...". */
#define SRV_LOG_LINE_MAX 4096

/* Configures the logger. path NULL or "" logs to stderr; otherwise the file is
 * opened for appending (created 0644). path is copied. Returns 0, or -1 with a
 * message in err[errlen] (the previous configuration stays in place). May be
 * called again to reconfigure. Before any call, the logger writes text at
 * level info to stderr. */
int srv_log_init(srv_log_level_t level, srv_log_format_t format, const char *path, char *err,
                 size_t errlen);

/* Reopens the log file (after logrotate moved it). No-op when logging to
 * stderr. Safe from any thread; on failure keeps the old file and logs an
 * error there. Returns 0 or -1. */
int srv_log_reopen(void);

/* Closes the log file and returns to stderr. */
void srv_log_shutdown(void);

/* Current threshold (set by srv_log_init); lines with level > threshold are
 * dropped. */
srv_log_level_t srv_log_level(void);

/* The formatter behind SRV_LOG; call the macro instead. req_id may be NULL. */
void srv_log_write(srv_log_level_t level, const char *req_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define SRV_LOG(level, req_id, ...)                                                            \
    do {                                                                                       \
        if ((int)(level) <= (int)srv_log_level())                                              \
            srv_log_write((level), (req_id), __VA_ARGS__);                                     \
    } while (0)

/* One access-log record (info level). Strings are borrowed for the call; any
 * may be NULL. */
typedef struct srv_log_access_rec {
    const char *req_id;
    const char *method;
    const char *path;
    const char *route;    /* the matched pattern ("/v1/sessions/{id}"), NULL if none */
    const char *peer;     /* client address */
    int status;           /* 0 when no response was queued */
    uint64_t bytes_in;    /* request body bytes read */
    uint64_t bytes_out;   /* response body bytes produced */
    double duration_ms;   /* from headers received to request end */
    const char *outcome;  /* "ok", "client_abort", "timeout", "error", ... */
} srv_log_access_rec_t;

void srv_log_access(const srv_log_access_rec_t *rec);

#endif
