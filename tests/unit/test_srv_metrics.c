/* test_srv_metrics.c — the Prometheus registry and its text exposition.
 *
 * Expected texts are written by hand from the exposition format 0.0.4 spec
 * (HELP/TYPE lines, label escaping of \ " and newline, cumulative le buckets
 * ending in +Inf, _sum and _count), with observations chosen as exact binary
 * fractions so the sums have one right spelling.
 */
#include "server/base/metrics.h"
#include "tests/unit/check.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

TEST(test_exposition_text)
{
    srv_metrics_t *reg = srv_metrics_new();
    srv_metric_t *c = srv_metrics_counter(reg, "req_total", "Requests.\nSecond \\ line",
                                          (const char *[]){"code", "method", NULL});
    srv_metric_t *g = srv_metrics_gauge(reg, "temp_celsius", "Temperature", NULL);
    static const double bounds[] = {0.5, 1, 2.5};
    srv_metric_t *h =
        srv_metrics_histogram(reg, "lat_seconds", "Latency", (const char *[]){"route", NULL},
                              bounds, 3);
    CHECK(c && g && h);
    srv_metric_add(c, (const char *[]){"200", "GET"}, 1);
    srv_metric_add(c, (const char *[]){"500", "POST"}, 1.5);
    srv_metric_add(c, (const char *[]){"200", "GET"}, 2);
    srv_metric_add(c, (const char *[]){"200", "GET"}, -5); /* counters never go down */
    srv_metric_set(g, NULL, 21.5);
    srv_metric_add(g, NULL, -0.5);
    srv_series_t *s = srv_metric_series(h, (const char *[]){"/a"});
    srv_series_observe(s, 0.25);
    srv_series_observe(s, 0.5); /* le is inclusive */
    srv_series_observe(s, 0.75);
    srv_series_observe(s, 4);
    srv_metric_observe(h, (const char *[]){"x\"y\\z\nw"}, 1);
    size_t len = 0;
    char *text = srv_metrics_render(reg, &len);
    const char *expect = "# HELP req_total Requests.\\nSecond \\\\ line\n"
                         "# TYPE req_total counter\n"
                         "req_total{code=\"200\",method=\"GET\"} 3\n"
                         "req_total{code=\"500\",method=\"POST\"} 1.5\n"
                         "# HELP temp_celsius Temperature\n"
                         "# TYPE temp_celsius gauge\n"
                         "temp_celsius 21\n"
                         "# HELP lat_seconds Latency\n"
                         "# TYPE lat_seconds histogram\n"
                         "lat_seconds_bucket{route=\"/a\",le=\"0.5\"} 2\n"
                         "lat_seconds_bucket{route=\"/a\",le=\"1\"} 3\n"
                         "lat_seconds_bucket{route=\"/a\",le=\"2.5\"} 3\n"
                         "lat_seconds_bucket{route=\"/a\",le=\"+Inf\"} 4\n"
                         "lat_seconds_sum{route=\"/a\"} 5.5\n"
                         "lat_seconds_count{route=\"/a\"} 4\n"
                         "lat_seconds_bucket{route=\"x\\\"y\\\\z\\nw\",le=\"0.5\"} 0\n"
                         "lat_seconds_bucket{route=\"x\\\"y\\\\z\\nw\",le=\"1\"} 1\n"
                         "lat_seconds_bucket{route=\"x\\\"y\\\\z\\nw\",le=\"2.5\"} 1\n"
                         "lat_seconds_bucket{route=\"x\\\"y\\\\z\\nw\",le=\"+Inf\"} 1\n"
                         "lat_seconds_sum{route=\"x\\\"y\\\\z\\nw\"} 1\n"
                         "lat_seconds_count{route=\"x\\\"y\\\\z\\nw\"} 1\n";
    CHECK_STR_EQ(text, expect);
    CHECK_INT_EQ(len, strlen(expect));
    free(text);
    srv_metrics_free(reg);
}

TEST(test_special_values)
{
    srv_metrics_t *reg = srv_metrics_new();
    srv_metric_t *g = srv_metrics_gauge(reg, "g", "", (const char *[]){"k", NULL});
    srv_metric_set(g, (const char *[]){"a"}, INFINITY);
    srv_metric_set(g, (const char *[]){"b"}, -INFINITY);
    srv_metric_set(g, (const char *[]){"c"}, NAN);
    srv_metric_set(g, (const char *[]){"d"}, 0.1);
    srv_metric_set(g, (const char *[]){"e"}, 1e300);
    srv_metric_set(g, (const char *[]){"f"}, 1234567);
    char *text = srv_metrics_render(reg, NULL);
    CHECK_STR_EQ(text, "# HELP g \n# TYPE g gauge\n"
                       "g{k=\"a\"} +Inf\ng{k=\"b\"} -Inf\ng{k=\"c\"} NaN\n"
                       "g{k=\"d\"} 0.1\ng{k=\"e\"} 1e+300\ng{k=\"f\"} 1234567\n");
    free(text);
    srv_metrics_free(reg);
    /* an empty registry renders as an empty string */
    reg = srv_metrics_new();
    size_t len = 99;
    text = srv_metrics_render(reg, &len);
    CHECK_STR_EQ(text, "");
    CHECK_INT_EQ(len, 0);
    free(text);
    srv_metrics_free(reg);
}

TEST(test_registration_rules)
{
    srv_metrics_t *reg = srv_metrics_new();
    static const double b[] = {1, 2};
    static const double bad_b[] = {2, 1};
    CHECK(srv_metrics_counter(reg, "ok_total", "", NULL) != NULL);
    CHECK(srv_metrics_counter(reg, "ok_total", "", NULL) == NULL);      /* duplicate */
    CHECK(srv_metrics_gauge(reg, "ok_total", "", NULL) == NULL);        /* any kind */
    CHECK(srv_metrics_counter(reg, "9lives", "", NULL) == NULL);        /* leading digit */
    CHECK(srv_metrics_counter(reg, "has-dash", "", NULL) == NULL);
    CHECK(srv_metrics_counter(reg, "", "", NULL) == NULL);
    CHECK(srv_metrics_counter(reg, "ns:sub_total", "", NULL) != NULL);  /* colons allowed */
    CHECK(srv_metrics_counter(reg, "l1", "", (const char *[]){"a:b", NULL}) == NULL);
    CHECK(srv_metrics_counter(reg, "l2", "", (const char *[]){"__x", NULL}) == NULL);
    CHECK(srv_metrics_counter(reg, "l3", "", (const char *[]){"a", "a", NULL}) == NULL);
    CHECK(srv_metrics_counter(reg, "l4", "", (const char *[]){"le", NULL}) != NULL);
    CHECK(srv_metrics_histogram(reg, "h1", "", (const char *[]){"le", NULL}, b, 2) == NULL);
    CHECK(srv_metrics_histogram(reg, "h2", "", NULL, bad_b, 2) == NULL);
    CHECK(srv_metrics_histogram(reg, "h3", "", NULL, b, 0) == NULL);
    CHECK(srv_metrics_histogram(reg, "h4", "", NULL, NULL, 2) == NULL);
    srv_metric_t *h = srv_metrics_histogram(reg, "h5", "", NULL, b, 2);
    CHECK(h != NULL);
    /* wrong-kind updates are ignored; NULLs are no-ops */
    srv_series_t *s = srv_metric_series(h, NULL);
    srv_series_add(s, 5);
    srv_series_set(s, 5);
    char *text = srv_metrics_render(reg, NULL);
    CHECK(text && strstr(text, "h5_count 0\n") && strstr(text, "h5_sum 0\n"));
    free(text);
    srv_series_add(NULL, 1);
    srv_series_observe(NULL, 1);
    srv_metric_add(NULL, NULL, 1);
    CHECK(srv_metric_series(NULL, NULL) == NULL);
    srv_metric_t *c = srv_metrics_counter(reg, "two_total", "", (const char *[]){"a", "b", NULL});
    CHECK(srv_metric_series(c, (const char *[]){"x", NULL}) == NULL); /* missing value */
    CHECK(srv_metric_series(c, NULL) == NULL);
    CHECK(srv_metric_series(c, (const char *[]){"x", "y"}) ==
          srv_metric_series(c, (const char *[]){"x", "y"})); /* stable pointer */
    srv_metrics_free(reg);
    srv_metrics_free(NULL);
}

TEST(test_series_limit)
{
    srv_metrics_t *reg = srv_metrics_new();
    srv_metric_t *c = srv_metrics_counter(reg, "many_total", "", (const char *[]){"id", NULL});
    char id[32];
    int made = 0;
    for (int i = 0; i < SRV_METRICS_MAX_SERIES + 10; i++) {
        snprintf(id, sizeof id, "%d", i);
        made += srv_metric_series(c, (const char *[]){id}) != NULL;
    }
    CHECK_INT_EQ(made, SRV_METRICS_MAX_SERIES);
    /* existing series are still found at the limit */
    CHECK(srv_metric_series(c, (const char *[]){"0"}) != NULL);
    srv_metrics_free(reg);
}

#define N_THREADS 4
#define N_ITERS 100000

typedef struct work {
    srv_metric_t *c, *h, *g;
    int id;
} work_t;

static void *hammer(void *arg)
{
    work_t *w = arg;
    srv_series_t *mine = srv_metric_series(w->c, (const char *[]){"shared"});
    for (int i = 0; i < N_ITERS; i++) {
        srv_series_add(mine, 1);
        srv_metric_observe(w->h, NULL, (i % 4) * 0.5); /* 0, 0.5, 1, 1.5 */
        srv_metric_add(w->g, NULL, 0.25);
        if (i % 1000 == 0) {
            char id[16];
            snprintf(id, sizeof id, "t%d", w->id);
            srv_metric_add(w->c, (const char *[]){id}, 1);
        }
    }
    return NULL;
}

TEST(test_threads)
{
    srv_metrics_t *reg = srv_metrics_new();
    static const double b[] = {0.5, 1};
    work_t w = {
        srv_metrics_counter(reg, "hits_total", "", (const char *[]){"who", NULL}),
        srv_metrics_histogram(reg, "obs", "", NULL, b, 2),
        srv_metrics_gauge(reg, "level", "", NULL),
        0,
    };
    pthread_t th[N_THREADS];
    work_t ws[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        ws[i] = w;
        ws[i].id = i;
        pthread_create(&th[i], NULL, hammer, &ws[i]);
    }
    /* rendering concurrently must be safe */
    for (int i = 0; i < 20; i++)
        free(srv_metrics_render(reg, NULL));
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    char *text = srv_metrics_render(reg, NULL);
    /* N_THREADS * N_ITERS adds of 1 (shared), N_ITERS / 1000 of them per
     * thread (t3), N_THREADS * N_ITERS of 0.25 (level) */
    CHECK(text && strstr(text, "hits_total{who=\"shared\"} 400000\n"));
    CHECK(text && strstr(text, "hits_total{who=\"t3\"} 100\n"));
    CHECK(text && strstr(text, "level 100000\n"));
    /* per thread: 25000 each of 0, 0.5, 1, 1.5 -> le 0.5: 50000, le 1: 75000 */
    CHECK(text && strstr(text, "obs_bucket{le=\"0.5\"} 200000\n"));
    CHECK(text && strstr(text, "obs_bucket{le=\"1\"} 300000\n"));
    CHECK(text && strstr(text, "obs_bucket{le=\"+Inf\"} 400000\n"));
    CHECK(text && strstr(text, "obs_sum 300000\n"));
    CHECK(text && strstr(text, "obs_count 400000\n"));
    free(text);
    srv_metrics_free(reg);
}

/* srv_metrics_share: one family for several engines (one per model). */
TEST(test_shared_families)
{
    srv_metrics_t *reg = srv_metrics_new();
    static const double b[] = {1, 2};
    static const double b2[] = {1, 3};
    srv_metric_t *c = srv_metrics_counter(reg, "tok_total", "", (const char *[]){"k", NULL});
    srv_metric_t *h = srv_metrics_histogram(reg, "lat", "", NULL, b, 2);
    CHECK(c && h);
    CHECK(srv_metrics_counter(reg, "tok_total", "", (const char *[]){"k", NULL}) == NULL);
    srv_metrics_share(reg, 1);
    CHECK(srv_metrics_counter(reg, "tok_total", "", (const char *[]){"k", NULL}) == c);
    CHECK(srv_metrics_histogram(reg, "lat", "", NULL, b, 2) == h);
    /* the same name with another kind, labels or bounds is still refused */
    CHECK(srv_metrics_gauge(reg, "tok_total", "", (const char *[]){"k", NULL}) == NULL);
    CHECK(srv_metrics_counter(reg, "tok_total", "", (const char *[]){"j", NULL}) == NULL);
    CHECK(srv_metrics_counter(reg, "tok_total", "", NULL) == NULL);
    CHECK(srv_metrics_histogram(reg, "lat", "", NULL, b2, 2) == NULL);
    /* both "engines" count into one series */
    srv_metric_add(c, (const char *[]){"x"}, 2);
    srv_metric_add(srv_metrics_counter(reg, "tok_total", "", (const char *[]){"k", NULL}),
                   (const char *[]){"x"}, 3);
    size_t len = 0;
    char *text = srv_metrics_render(reg, &len);
    CHECK(text && strstr(text, "tok_total{k=\"x\"} 5\n"));
    free(text);
    srv_metrics_share(reg, 0);
    CHECK(srv_metrics_counter(reg, "tok_total", "", (const char *[]){"k", NULL}) == NULL);
    srv_metrics_free(reg);
}

int main(void)
{
    RUN(test_shared_families);
    RUN(test_exposition_text);
    RUN(test_special_values);
    RUN(test_registration_rules);
    RUN(test_series_limit);
    RUN(test_threads);
    return CHECK_DONE();
}
