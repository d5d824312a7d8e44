/* server/base/metrics.h — a small Prometheus registry rendered as text exposition
 * format 0.0.4 (GET /metrics, Content-Type SRV_METRICS_CONTENT_TYPE).
 *
 * A *metric* is a family (name, help, type, label names); a *series* is one
 * combination of label values inside it. Register metrics at startup, look up
 * a series once and keep the pointer on hot paths:
 *
 *   srv_metric_t *req = srv_metrics_counter(reg, "darkserve_http_requests_total",
 *                                           "HTTP requests", (const char *[]){"code", NULL});
 *   srv_series_t *ok = srv_metric_series(req, (const char *[]){"200"});
 *   srv_series_add(ok, 1);                       // from any thread
 *
 * Thread safety: registration, series lookup and rendering take the
 * registry's mutex; updates through a series pointer are lock-free atomics,
 * so the scheduler thread can count without touching the loop. A render that
 * races with a histogram update may see that observation in some buckets
 * only; _count is the +Inf bucket, so each rendered histogram is consistent
 * with itself.
 *
 * Every function accepts NULL metric/series pointers as a no-op, so a caller
 * whose registration failed (or that runs without metrics) needs no checks.
 *
 * Ownership: the registry owns metrics and series; their pointers stay valid
 * until srv_metrics_free. Names, help and label strings passed in are copied.
 */
#ifndef DARKSERVE_SERVER_METRICS_H
#define DARKSERVE_SERVER_METRICS_H

#include <stddef.h>

#define SRV_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Label names per metric, and series per metric, at most. A series lookup
 * beyond the series limit returns NULL (updates become no-ops) rather than
 * letting a label with unbounded values grow memory. */
#define SRV_METRICS_MAX_LABELS 8
#define SRV_METRICS_MAX_SERIES 4096
#define SRV_METRICS_MAX_BUCKETS 64

typedef struct srv_metrics srv_metrics_t;
typedef struct srv_metric srv_metric_t;
typedef struct srv_series srv_series_t;

/* New empty registry (owned by the caller), NULL when out of memory. */
srv_metrics_t *srv_metrics_new(void);
/* Frees the registry and every metric and series in it. NULL is a no-op. */
void srv_metrics_free(srv_metrics_t *reg);

/* on = 1: from now on, registering a name already registered with the same
 * kind, label names and bounds returns the metric already there instead of
 * NULL (one engine per served model, each counting into the same family:
 * the families count every model together). on = 0: the default. */
void srv_metrics_share(srv_metrics_t *reg, int on);

/* Registers a metric. name must match [a-zA-Z_:][a-zA-Z0-9_:]*; labels is a
 * NULL-terminated list of label names ([a-zA-Z_][a-zA-Z0-9_]*, not starting
 * with "__", not "le" for histograms), or NULL for none. Returns a pointer
 * owned by the registry, or NULL if a name is invalid, already registered
 * (see srv_metrics_share),
 * or memory is short. Counters only go up (srv_series_add with v >= 0). */
srv_metric_t *srv_metrics_counter(srv_metrics_t *reg, const char *name, const char *help,
                                  const char *const *labels);
srv_metric_t *srv_metrics_gauge(srv_metrics_t *reg, const char *name, const char *help,
                                const char *const *labels);
/* bounds[0..nbounds): finite, strictly increasing upper bounds; the +Inf
 * bucket is implicit. nbounds in 1..SRV_METRICS_MAX_BUCKETS. */
srv_metric_t *srv_metrics_histogram(srv_metrics_t *reg, const char *name, const char *help,
                                    const char *const *labels, const double *bounds,
                                    size_t nbounds);

/* The series with these label values (one per label name, in order; NULL
 * when the metric has no labels), created at zero on first use. Values are
 * copied. Returns a pointer owned by the registry, or NULL (NULL metric, a
 * NULL value, out of memory, or SRV_METRICS_MAX_SERIES reached). */
srv_series_t *srv_metric_series(srv_metric_t *m, const char *const *values);

/* Updates (lock-free, any thread). add: counters (v < 0 ignored) and gauges;
 * set: gauges only; observe: histograms only. A call of the wrong kind is
 * ignored. */
void srv_series_add(srv_series_t *s, double v);
void srv_series_set(srv_series_t *s, double v);
void srv_series_observe(srv_series_t *s, double v);

/* Lookup + update in one call, for cold paths. */
void srv_metric_add(srv_metric_t *m, const char *const *values, double v);
void srv_metric_set(srv_metric_t *m, const char *const *values, double v);
void srv_metric_observe(srv_metric_t *m, const char *const *values, double v);

/* Renders every metric in registration order, series in creation order.
 * Returns a NUL-terminated string owned by the caller (free()), its length in
 * *len when len is non-NULL, or NULL when out of memory. */
char *srv_metrics_render(srv_metrics_t *reg, size_t *len);

#endif
