/* test_srv_log.c — the logger: line formats, escaping (one event = one
 * line, JSON lines parse), level filtering, truncation, reopen after a
 * rename (logrotate), and lines from many threads never interleaving.
 */
#include "server/base/log.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_path[64];
static char g_path2[80];

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

static void fresh(srv_log_level_t level, srv_log_format_t fmt)
{
    unlink(g_path);
    char err[256] = "";
    CHECK_INT_EQ(srv_log_init(level, fmt, g_path, err, sizeof err), 0);
}

TEST(test_text_lines)
{
    fresh(SRV_LOG_INFO, SRV_LOG_FORMAT_TEXT);
    SRV_LOG(SRV_LOG_INFO, "rid-1", "hello %d", 42);
    SRV_LOG(SRV_LOG_WARN, NULL, "two\nlines \"quoted\" \x01");
    SRV_LOG(SRV_LOG_DEBUG, "rid-2", "dropped at info");
    char *t = slurp(g_path, NULL);
    CHECK_INT_EQ(count_lines(t), 2);
    CHECK(t && strstr(t, " info [rid-1] hello 42\n"));
    CHECK(t && strstr(t, " warn two\\nlines \"quoted\" \\x01\n"));
    CHECK(t && !strstr(t, "dropped"));
    /* ISO-8601 UTC timestamp with milliseconds first */
    CHECK(t && strlen(t) > 24 && t[4] == '-' && t[10] == 'T' && t[19] == '.' && t[23] == 'Z');
    free(t);
}

TEST(test_level_check_skips_arguments)
{
    fresh(SRV_LOG_WARN, SRV_LOG_FORMAT_TEXT);
    int evaluated = 0;
    SRV_LOG(SRV_LOG_INFO, NULL, "%d", ++evaluated);
    CHECK_INT_EQ(evaluated, 0);
    SRV_LOG(SRV_LOG_ERROR, NULL, "%d", ++evaluated);
    CHECK_INT_EQ(evaluated, 1);
}

TEST(test_json_lines)
{
    fresh(SRV_LOG_DEBUG, SRV_LOG_FORMAT_JSON);
    SRV_LOG(SRV_LOG_DEBUG, "r\"1", "tab\there, newline\n, bad utf8 \xff, ok \xc3\xa9");
    srv_log_access(&(srv_log_access_rec_t){.req_id = "abc",
                                           .method = "POST",
                                           .path = "/v1/x\"y",
                                           .route = "/v1/{id}",
                                           .peer = "127.0.0.1",
                                           .status = 201,
                                           .bytes_in = 7,
                                           .bytes_out = 1234,
                                           .duration_ms = 1.5,
                                           .outcome = "ok"});
    char big[SRV_LOG_LINE_MAX * 2];
    memset(big, '"', sizeof big - 1); /* every byte doubles when escaped */
    big[sizeof big - 1] = '\0';
    SRV_LOG(SRV_LOG_ERROR, NULL, "%s", big);
    char *t = slurp(g_path, NULL);
    CHECK_INT_EQ(count_lines(t), 3);
    char *save = NULL;
    int i = 0;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        CHECK_MSG(j != NULL, "line %d is not JSON: %s", i, je.text);
        if (!j)
            continue;
        CHECK(json_is_string(json_object_get(j, "ts")));
        if (i == 0) {
            CHECK_STR_EQ(json_string_value(json_object_get(j, "level")), "debug");
            CHECK_STR_EQ(json_string_value(json_object_get(j, "rid")), "r\"1");
            CHECK_STR_EQ(json_string_value(json_object_get(j, "msg")),
                         "tab\there, newline\n, bad utf8 ?, ok \xc3\xa9");
        } else if (i == 1) {
            CHECK_STR_EQ(json_string_value(json_object_get(j, "msg")), "access");
            CHECK_STR_EQ(json_string_value(json_object_get(j, "path")), "/v1/x\"y");
            CHECK_INT_EQ(json_integer_value(json_object_get(j, "status")), 201);
            CHECK_INT_EQ(json_integer_value(json_object_get(j, "bytes_out")), 1234);
            CHECK_NEAR(json_real_value(json_object_get(j, "ms")), 1.5, 1e-9);
        } else {
            const char *m = json_string_value(json_object_get(j, "msg"));
            CHECK(m && strlen(m) < SRV_LOG_LINE_MAX);
            CHECK(m && strlen(m) > 3 && strcmp(m + strlen(m) - 3, "...") == 0);
        }
        json_decref(j);
    }
    CHECK_INT_EQ(i, 3);
    free(t);
}

TEST(test_access_text)
{
    fresh(SRV_LOG_INFO, SRV_LOG_FORMAT_TEXT);
    srv_log_access(&(srv_log_access_rec_t){.req_id = "id9",
                                           .method = "GET",
                                           .path = "/health",
                                           .status = 200,
                                           .bytes_out = 15,
                                           .duration_ms = 0.25,
                                           .outcome = "ok"});
    char *t = slurp(g_path, NULL);
    CHECK(t && strstr(t, " info [id9] access method=GET path=\"/health\" status=200 bytes_in=0 "
                         "bytes_out=15 ms=0.250 outcome=ok\n"));
    free(t);
}

TEST(test_reopen)
{
    fresh(SRV_LOG_INFO, SRV_LOG_FORMAT_TEXT);
    SRV_LOG(SRV_LOG_INFO, NULL, "before rotation");
    unlink(g_path2);
    CHECK_INT_EQ(rename(g_path, g_path2), 0);
    SRV_LOG(SRV_LOG_INFO, NULL, "still old file");
    CHECK_INT_EQ(srv_log_reopen(), 0);
    SRV_LOG(SRV_LOG_INFO, NULL, "after rotation");
    char *old = slurp(g_path2, NULL), *cur = slurp(g_path, NULL);
    CHECK(old && strstr(old, "before rotation") && strstr(old, "still old file"));
    CHECK(old && !strstr(old, "after rotation"));
    CHECK(cur && strstr(cur, "after rotation") && count_lines(cur) == 1);
    free(old);
    free(cur);
    unlink(g_path2);
    /* an unopenable path is an error and keeps the current file */
    char err[256] = "";
    CHECK_INT_EQ(srv_log_init(SRV_LOG_INFO, SRV_LOG_FORMAT_TEXT, "/nonexistent-dir/x.log", err,
                              sizeof err),
                 -1);
    CHECK(strstr(err, "/nonexistent-dir/x.log") != NULL);
    SRV_LOG(SRV_LOG_INFO, NULL, "kept");
    cur = slurp(g_path, NULL);
    CHECK(cur && strstr(cur, "kept"));
    free(cur);
}

#define N_THREADS 4
#define N_LINES 2000

static void *writer(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < N_LINES; i++)
        SRV_LOG(SRV_LOG_INFO, NULL, "thread %d line %d %s", id, i,
                "padding-padding-padding-padding-padding-padding-padding-padding");
    return NULL;
}

TEST(test_threads_do_not_interleave)
{
    fresh(SRV_LOG_INFO, SRV_LOG_FORMAT_TEXT);
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&th[i], NULL, writer, (void *)(intptr_t)i);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    char *t = slurp(g_path, NULL);
    CHECK_INT_EQ(count_lines(t), N_THREADS * N_LINES);
    int bad = 0;
    char *save = NULL;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int id, n;
        const char *m = strstr(line, " info thread ");
        if (!m || sscanf(m, " info thread %d line %d", &id, &n) != 2 ||
            !strstr(line, "padding-padding") || strstr(m + 1, " info "))
            bad++;
    }
    CHECK_INT_EQ(bad, 0);
    free(t);
}

int main(void)
{
    snprintf(g_path, sizeof g_path, "/tmp/test_srv_log_%d.log", (int)getpid());
    snprintf(g_path2, sizeof g_path2, "%s.1", g_path);
    RUN(test_text_lines);
    RUN(test_level_check_skips_arguments);
    RUN(test_json_lines);
    RUN(test_access_text);
    RUN(test_reopen);
    RUN(test_threads_do_not_interleave);
    srv_log_shutdown();
    unlink(g_path);
    return CHECK_DONE();
}
