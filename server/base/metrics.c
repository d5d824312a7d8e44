/* server/base/metrics.c — Prometheus registry (see metrics.h).
 *
 * Values are doubles stored as their bit patterns in 64-bit atomics; add is a
 * compare-and-swap loop, which stays lock-free on x86-64 and aarch64.
 * Histogram buckets are stored non-cumulative (one atomic increment per
 * observation) and summed at render time.
 */
#include "server/base/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM } kind_t;

struct srv_series {
    const srv_metric_t *metric;
    char **values;            /* owned; metric->nlabels strings */
    _Atomic uint64_t bits;    /* counter/gauge value as double bits */
    _Atomic uint64_t sum;     /* histogram: sum as double bits */
    _Atomic uint64_t *counts; /* histogram: nbounds + 1 (last = +Inf), non-cumulative */
};

struct srv_metric {
    srv_metrics_t *reg;
    char *name;
    char *help;
    kind_t kind;
    size_t nlabels;
    char **labels;  /* owned */
    size_t nbounds;
    double *bounds; /* owned, histograms */
    srv_series_t **series; /* owned; guarded by reg->lock */
    size_t nseries, cap;
};

struct srv_metrics {
    pthread_mutex_t lock;
    srv_metric_t **metrics; /* owned */
    size_t n, cap;
    int share; /* srv_metrics_share */
};

static uint64_t dbits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double bitsd(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void srv_metrics_share(srv_metrics_t *reg, int on)
{
    pthread_mutex_lock(&reg->lock);
    reg->share = on;
    pthread_mutex_unlock(&reg->lock);
}

srv_metrics_t *srv_metrics_new(void)
{
    srv_metrics_t *reg = calloc(1, sizeof *reg);
    if (!reg)
        return NULL;
    pthread_mutex_init(&reg->lock, NULL);
    return reg;
}

static void series_free(srv_series_t *s, size_t nlabels)
{
    if (!s)
        return;
    for (size_t i = 0; i < nlabels && s->values; i++)
        free(s->values[i]);
    free(s->values);
    free(s->counts);
    free(s);
}

static void metric_free(srv_metric_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nseries; i++)
        series_free(m->series[i], m->nlabels);
    free(m->series);
    for (size_t i = 0; i < m->nlabels && m->labels; i++)
        free(m->labels[i]);
    free(m->labels);
    free(m->bounds);
    free(m->name);
    free(m->help);
    free(m);
}

void srv_metrics_free(srv_metrics_t *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n; i++)
        metric_free(reg->metrics[i]);
    free(reg->metrics);
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

static int valid_name(const char *s, int allow_colon)
{
    if (!s || !*s)
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (allow_colon && c == ':') || (p != s && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static srv_metric_t *metric_register(srv_metrics_t *reg, const char *name, const char *help,
                                     const char *const *labels, kind_t kind, const double *bounds,
                                     size_t nbounds)
{
    if (!reg || !valid_name(name, 1))
        return NULL;
    size_t nlabels = 0;
    for (; labels && labels[nlabels]; nlabels++) {
        const char *l = labels[nlabels];
        if (nlabels >= SRV_METRICS_MAX_LABELS || !valid_name(l, 0) || strncmp(l, "__", 2) == 0 ||
            (kind == KIND_HISTOGRAM && strcmp(l, "le") == 0))
            return NULL;
        for (size_t j = 0; j < nlabels; j++)
            if (strcmp(labels[j], l) == 0)
                return NULL;
    }
    if (kind == KIND_HISTOGRAM) {
        if (!bounds || nbounds < 1 || nbounds > SRV_METRICS_MAX_BUCKETS)
            return NULL;
        for (size_t i = 0; i < nbounds; i++)
            if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
                return NULL;
    }
    srv_metric_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->reg = reg;
    m->kind = kind;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    m->nlabels = nlabels;
    m->labels = calloc(nlabels ? nlabels : 1, sizeof *m->labels);
    if (!m->name || !m->help || !m->labels)
        goto fail;
    for (size_t i = 0; i < nlabels; i++)
        if (!(m->labels[i] = strdup(labels[i])))
            goto fail;
    if (kind == KIND_HISTOGRAM) {
        m->nbounds = nbounds;
        m->bounds = malloc(nbounds * sizeof *m->bounds);
        if (!m->bounds)
            goto fail;
        memcpy(m->bounds, bounds, nbounds * sizeof *m->bounds);
    }
    pthread_mutex_lock(&reg->lock);
    for (size_t i = 0; i < reg->n; i++) {
        if (strcmp(reg->metrics[i]->name, name) == 0) {
            srv_metric_t *old = reg->metrics[i];
            int same = reg->share && old->kind == m->kind && old->nlabels == m->nlabels &&
                       old->nbounds == m->nbounds;
            for (size_t j = 0; same && j < m->nlabels; j++)
                same = strcmp(old->labels[j], m->labels[j]) == 0;
            for (size_t j = 0; same && j < m->nbounds; j++)
                same = old->bounds[j] == m->bounds[j];
            pthread_mutex_unlock(&reg->lock);
            metric_free(m);
            return same ? old : NULL;
        }
    }
    if (reg->n == reg->cap) {
        size_t ncap = reg->cap ? reg->cap * 2 : 16;
        /* an array of pointers, on purpose */
        srv_metric_t **nm =
            realloc(reg->metrics, ncap * sizeof *nm); // NOLINT(bugprone-sizeof-expression)
        if (!nm) {
            pthread_mutex_unlock(&reg->lock);
            goto fail;
        }
        reg->metrics = nm;
        reg->cap = ncap;
    }
    reg->metrics[reg->n++] = m;
    pthread_mutex_unlock(&reg->lock);
    return m;
fail:
    metric_free(m);
    return NULL;
}

srv_metric_t *srv_metrics_counter(srv_metrics_t *reg, const char *name, const char *help,
                                  const char *const *labels)
{
    return metric_register(reg, name, help, labels, KIND_COUNTER, NULL, 0);
}

srv_metric_t *srv_metrics_gauge(srv_metrics_t *reg, const char *name, const char *help,
                                const char *const *labels)
{
    return metric_register(reg, name, help, labels, KIND_GAUGE, NULL, 0);
}

srv_metric_t *srv_metrics_histogram(srv_metrics_t *reg, const char *name, const char *help,
                                    const char *const *labels, const double *bounds,
                                    size_t nbounds)
{
    return metric_register(reg, name, help, labels, KIND_HISTOGRAM, bounds, nbounds);
}

static srv_series_t *series_new(srv_metric_t *m, const char *const *values)
{
    srv_series_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->metric = m;
    s->values = calloc(m->nlabels ? m->nlabels : 1, sizeof *s->values);
    if (!s->values)
        goto fail;
    for (size_t i = 0; i < m->nlabels; i++)
        if (!(s->values[i] = strdup(values[i])))
            goto fail;
    if (m->kind == KIND_HISTOGRAM) {
        s->counts = calloc(m->nbounds + 1, sizeof *s->counts);
        if (!s->counts)
            goto fail;
    }
    atomic_init(&s->bits, dbits(0.0));
    atomic_init(&s->sum, dbits(0.0));
    return s;
fail:
    series_free(s, m->nlabels);
    return NULL;
}

srv_series_t *srv_metric_series(srv_metric_t *m, const char *const *values)
{
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->nlabels; i++)
        if (!values || !values[i])
            return NULL;
    srv_series_t *found = NULL;
    pthread_mutex_lock(&m->reg->lock);
    for (size_t i = 0; i < m->nseries && !found; i++) {
        srv_series_t *s = m->series[i];
        size_t j = 0;
        while (j < m->nlabels && strcmp(s->values[j], values[j]) == 0)
            j++;
        if (j == m->nlabels)
            found = s;
    }
    if (!found && m->nseries < SRV_METRICS_MAX_SERIES) {
        if (m->nseries == m->cap) {
            size_t ncap = m->cap ? m->cap * 2 : 4;
            srv_series_t **ns =
                realloc(m->series, ncap * sizeof *ns); // NOLINT(bugprone-sizeof-expression)
            if (!ns)
                goto out;
            m->series = ns;
            m->cap = ncap;
        }
        found = series_new(m, values);
        if (found)
            m->series[m->nseries++] = found;
    }
out:
    pthread_mutex_unlock(&m->reg->lock);
    return found;
}

void srv_series_add(srv_series_t *s, double v)
{
    if (!s || s->metric->kind == KIND_HISTOGRAM)
        return;
    if (s->metric->kind == KIND_COUNTER && !(v >= 0))
        return;
    atomic_add_double(&s->bits, v);
}

void srv_series_set(srv_series_t *s, double v)
{
    if (!s || s->metric->kind != KIND_GAUGE)
        return;
    atomic_store_explicit(&s->bits, dbits(v), memory_order_relaxed);
}

void srv_series_observe(srv_series_t *s, double v)
{
    if (!s || s->metric->kind != KIND_HISTOGRAM)
        return;
    const srv_metric_t *m = s->metric;
    size_t b = 0;
    /* Bucket i counts v <= bounds[i] (Prometheus "le"); NaN lands in +Inf. */
    while (b < m->nbounds && !(v <= m->bounds[b]))
        b++;
    atomic_fetch_add_explicit(&s->counts[b], 1, memory_order_relaxed);
    atomic_add_double(&s->sum, v);
}

void srv_metric_add(srv_metric_t *m, const char *const *values, double v)
{
    srv_series_add(srv_metric_series(m, values), v);
}

void srv_metric_set(srv_metric_t *m, const char *const *values, double v)
{
    srv_series_set(srv_metric_series(m, values), v);
}

void srv_metric_observe(srv_metric_t *m, const char *const *values, double v)
{
    srv_series_observe(srv_metric_series(m, values), v);
}

/* ---- rendering ---- */

typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 1024;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* HELP text escapes \ and newline; label values also escape ". */
static void put_escaped(buf_t *b, const char *s, int label_value)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            put(b, "\\\\", 2);
        else if (*p == '\n')
            put(b, "\\n", 2);
        else if (label_value && *p == '"')
            put(b, "\\\"", 2);
        else
            put(b, p, 1);
    }
}

/* Shortest decimal that reads back as the same double; Prometheus spells
 * the non-finite values +Inf, -Inf and NaN. */
static void format_double(double v, char *out, size_t n)
{
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    /* Integers print plainly ("10", not "1e+01"): what people and other
     * exporters write for bucket bounds and counts. */
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

static void put_double(buf_t *b, double v)
{
    char tmp[40];
    format_double(v, tmp, sizeof tmp);
    puts_(b, tmp);
}

/* {a="x",b="y"[,le="..."]} — nothing when there are no labels and no le. */
static void put_labels(buf_t *b, const srv_metric_t *m, const srv_series_t *s, const char *le)
{
    if (m->nlabels == 0 && !le)
        return;
    put(b, "{", 1);
    for (size_t i = 0; i < m->nlabels; i++) {
        if (i)
            put(b, ",", 1);
        puts_(b, m->labels[i]);
        put(b, "=\"", 2);
        put_escaped(b, s->values[i], 1);
        put(b, "\"", 1);
    }
    if (le) {
        if (m->nlabels)
            put(b, ",", 1);
        put(b, "le=\"", 4);
        puts_(b, le);
        put(b, "\"", 1);
    }
    put(b, "}", 1);
}

static void render_metric(buf_t *b, const srv_metric_t *m)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    puts_(b, "# HELP ");
    puts_(b, m->name);
    put(b, " ", 1);
    put_escaped(b, m->help, 0);
    puts_(b, "\n# TYPE ");
    puts_(b, m->name);
    put(b, " ", 1);
    puts_(b, type_names[m->kind]);
    put(b, "\n", 1);
    for (size_t i = 0; i < m->nseries; i++) {
        const srv_series_t *s = m->series[i];
        if (m->kind != KIND_HISTOGRAM) {
            puts_(b, m->name);
            put_labels(b, m, s, NULL);
            put(b, " ", 1);
            put_double(b, bitsd(atomic_load_explicit(&s->bits, memory_order_relaxed)));
            put(b, "\n", 1);
            continue;
        }
        uint64_t cum = 0;
        char le[40], num[32];
        for (size_t k = 0; k <= m->nbounds; k++) {
            cum += atomic_load_explicit(&s->counts[k], memory_order_relaxed);
            if (k < m->nbounds)
                format_double(m->bounds[k], le, sizeof le);
            else
                snprintf(le, sizeof le, "+Inf");
            puts_(b, m->name);
            puts_(b, "_bucket");
            put_labels(b, m, s, le);
            snprintf(num, sizeof num, " %llu\n", (unsigned long long)cum);
            puts_(b, num);
        }
        puts_(b, m->name);
        puts_(b, "_sum");
        put_labels(b, m, s, NULL);
        put(b, " ", 1);
        put_double(b, bitsd(atomic_load_explicit(&s->sum, memory_order_relaxed)));
        put(b, "\n", 1);
        puts_(b, m->name);
        puts_(b, "_count");
        put_labels(b, m, s, NULL);
        snprintf(num, sizeof num, " %llu\n", (unsigned long long)cum);
        puts_(b, num);
    }
}

char *srv_metrics_render(srv_metrics_t *reg, size_t *len)
{
    buf_t b = {0};
    put(&b, "", 0); /* an empty registry renders as "" rather than NULL */
    if (reg) {
        pthread_mutex_lock(&reg->lock);
        for (size_t i = 0; i < reg->n; i++)
            render_metric(&b, reg->metrics[i]);
        pthread_mutex_unlock(&reg->lock);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}
