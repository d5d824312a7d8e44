/* test_srv_config.c — the option table: defaults, flags, environment,
 * precedence, value syntax, validation messages, --help and --print-config.
 */
#include "server/config.h"
#include "server/engine/engine.h"
#include "tests/unit/check.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *const no_env[] = {NULL};

/* Parses a NULL-terminated argument list with the given environment. */
static int parse(srv_config_t *cfg, char *const *env, char *err, size_t errlen, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, errlen);
    for (char *a = va_arg(ap, char *); a && argc < 63; a = va_arg(ap, char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    err[0] = '\0';
    return srv_config_parse(cfg, argc, argv, env, err, errlen);
}

/* Captures what fn writes to a FILE into a malloc'd string. */
static char *capture(void (*print_cfg)(const srv_config_t *, FILE *), const srv_config_t *cfg,
                     void (*print_help)(FILE *))
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (print_cfg)
        print_cfg(cfg, f);
    else
        print_help(f);
    fclose(f);
    return text;
}

TEST(test_defaults)
{
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    CHECK_STR_EQ(c.host, "127.0.0.1");
    CHECK_INT_EQ(c.port, 8080);
    CHECK_STR_EQ(c.model, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    CHECK_STR_EQ(c.adapter, "");
    CHECK_INT_EQ(c.attn, SRV_CFG_ATTN_AUTO);
    CHECK_INT_EQ(c.generation_timeout_s, 600);
    CHECK_INT_EQ(c.max_body, 1048576);
    CHECK_INT_EQ(c.request_timeout_s, 60);
    CHECK_INT_EQ(c.header_timeout_s, 10);
    CHECK_INT_EQ(c.max_conns_per_address, 64);
    CHECK_INT_EQ(c.idle_timeout_s, 30);
    CHECK_INT_EQ(c.drain_timeout_s, 30);
    CHECK_INT_EQ(c.session_ttl_s, 86400);
    CHECK_INT_EQ(c.max_session_bytes, 1073741824);
    CHECK_INT_EQ(c.max_session_disk, INT64_C(10) << 30);
    CHECK_INT_EQ(c.max_state_memory, INT64_C(4) << 30);
    CHECK_INT_EQ(c.max_session_files, 100000);
    CHECK_STR_EQ(c.session_dir, "./sessions");
    CHECK_INT_EQ(c.window, -1);
    CHECK_INT_EQ(c.log_level, SRV_CFG_LOG_INFO);
    CHECK_INT_EQ(c.log_format, SRV_CFG_LOG_TEXT);
    CHECK_STR_EQ(c.log_file, "");
    CHECK_INT_EQ(c.cors_origins.n, 0);
    CHECK_INT_EQ(c.api_keys.n, 0);
    CHECK_INT_EQ(c.want_help, 0);
    CHECK_INT_EQ(c.want_print, 0);
    CHECK_INT_EQ(c.source[0], SRV_CFG_SRC_DEFAULT);
    srv_config_free(&c);
    srv_config_free(&c); /* freeing twice (zeroed) is a no-op */
    srv_config_free(NULL);
}

TEST(test_flags_and_env)
{
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--port", "9000", "--host=::1", "--attn",
                       "performer", "--log-level=debug", "--threads", "3", NULL),
                 0);
    CHECK_INT_EQ(c.port, 9000);
    CHECK_STR_EQ(c.host, "::1");
    CHECK_INT_EQ(c.attn, SRV_CFG_ATTN_PERFORMER);
    CHECK_INT_EQ(c.log_level, SRV_CFG_LOG_DEBUG);
    CHECK_INT_EQ(c.threads, 3);
    srv_config_free(&c);
    /* the last occurrence wins; "=" may carry an empty value */
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--port=1", "--port", "2", "--adapter=",
                       NULL),
                 0);
    CHECK_INT_EQ(c.port, 2);
    CHECK_STR_EQ(c.adapter, "");
    srv_config_free(&c);

    char *env[] = {"DARKSERVE_PORT=7000", "DARKSERVE_ATTN=darkformer-is",
                   "DARKSERVE_CORS_ORIGIN=https://a.example, https://b.example",
                   "DARKSERVE_BIN=/ignored", "PATH=/usr/bin", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.port, 7000);
    CHECK_INT_EQ(c.attn, SRV_CFG_ATTN_DARKFORMER_IS);
    CHECK_INT_EQ(c.cors_origins.n, 2);
    if (c.cors_origins.n == 2) {
        CHECK_STR_EQ(c.cors_origins.v[0], "https://a.example");
        CHECK_STR_EQ(c.cors_origins.v[1], "https://b.example");
    }
    srv_config_free(&c);
    /* flags beat the environment; a list flag replaces the env list */
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, "--port", "7001", "--cors-origin", "*",
                       "--cors-origin", "http://localhost:3000,https://x.example", NULL),
                 0);
    CHECK_INT_EQ(c.port, 7001);
    CHECK_INT_EQ(c.cors_origins.n, 3);
    if (c.cors_origins.n == 3) {
        CHECK_STR_EQ(c.cors_origins.v[0], "*");
        CHECK_STR_EQ(c.cors_origins.v[1], "http://localhost:3000");
        CHECK_STR_EQ(c.cors_origins.v[2], "https://x.example");
    }
    char *text = capture(srv_config_print, &c, NULL);
    CHECK(text && strstr(text, "port               7001  (flag)\n"));
    CHECK(text && strstr(text, "attn               darkformer-is  (env)\n"));
    CHECK(text && strstr(text, "host               127.0.0.1  (default)\n"));
    free(text);
    srv_config_free(&c);
}

/* What the option table makes of s as the value of flag: --max-state-memory
 * (a size in [0, 1024T]) or --session-ttl (a duration in [0, 3650d]). 0 and
 * the option's value in *v, or -1 when s was refused as no size / duration
 * (syntax or overflow, not the option's range). */
static int scaled(const char *flag, const char *s, int64_t *v)
{
    srv_config_t c;
    char err[256];
    if (parse(&c, no_env, err, sizeof err, (char *)flag, (char *)s, NULL) == 0) {
        *v = strcmp(flag, "--session-ttl") == 0 ? c.session_ttl_s : c.max_state_memory;
        srv_config_free(&c);
        return 0;
    }
    CHECK_MSG(strstr(err, " expects a ") != NULL, "%s '%s': %s", flag, s, err);
    return -1;
}

TEST(test_sizes_and_durations)
{
    int64_t v = 0;
    CHECK_INT_EQ(scaled("--max-state-memory", "512K", &v), 0);
    CHECK_INT_EQ(v, 524288);
    CHECK_INT_EQ(scaled("--max-state-memory", "1M", &v), 0);
    CHECK_INT_EQ(v, 1048576);
    CHECK_INT_EQ(scaled("--max-state-memory", "2mb", &v), 0);
    CHECK_INT_EQ(v, 2097152);
    CHECK_INT_EQ(scaled("--max-state-memory", "3GiB", &v), 0);
    CHECK_INT_EQ(v, INT64_C(3221225472));
    CHECK_INT_EQ(scaled("--max-state-memory", "100", &v), 0);
    CHECK_INT_EQ(v, 100);
    CHECK_INT_EQ(scaled("--max-state-memory", "1X", &v), -1);
    CHECK_INT_EQ(scaled("--max-state-memory", "-1", &v), -1);
    CHECK_INT_EQ(scaled("--max-state-memory", "", &v), -1);
    CHECK_INT_EQ(scaled("--max-state-memory", " 1", &v), -1);
    CHECK_INT_EQ(scaled("--max-state-memory", "1.5M", &v), -1);
    CHECK_INT_EQ(scaled("--max-state-memory", "9000000000T", &v), -1); /* overflow */
    CHECK_INT_EQ(scaled("--max-state-memory", "99999999999999999999", &v), -1);
    CHECK_INT_EQ(scaled("--session-ttl", "30", &v), 0);
    CHECK_INT_EQ(v, 30);
    CHECK_INT_EQ(scaled("--session-ttl", "30s", &v), 0);
    CHECK_INT_EQ(v, 30);
    CHECK_INT_EQ(scaled("--session-ttl", "5m", &v), 0);
    CHECK_INT_EQ(v, 300);
    CHECK_INT_EQ(scaled("--session-ttl", "2h", &v), 0);
    CHECK_INT_EQ(v, 7200);
    CHECK_INT_EQ(scaled("--session-ttl", "1d", &v), 0);
    CHECK_INT_EQ(v, 86400);
    CHECK_INT_EQ(scaled("--session-ttl", "5ms", &v), -1);
    CHECK_INT_EQ(scaled("--session-ttl", "1w", &v), -1);

    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--max-body", "512K", "--idle-timeout", "2m",
                       "--session-ttl=0", NULL),
                 0);
    CHECK_INT_EQ(c.max_body, 524288);
    CHECK_INT_EQ(c.idle_timeout_s, 120);
    CHECK_INT_EQ(c.session_ttl_s, 0);
    char *text = capture(srv_config_print, &c, NULL);
    CHECK(text && strstr(text, "max-body           512K  (flag)\n"));
    CHECK(text && strstr(text, "idle-timeout       2m  (flag)\n"));
    free(text);
    srv_config_free(&c);
}

TEST(test_errors_name_the_flag)
{
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--nope", "1", NULL), -1);
    CHECK(strstr(err, "--nope") && strstr(err, "unknown"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--port=abc", NULL), -1);
    CHECK(strstr(err, "--port") && strstr(err, "abc"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--port", "65536", NULL), -1);
    CHECK(strstr(err, "--port") && strstr(err, "65535"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--port", NULL), -1);
    CHECK(strstr(err, "--port") && strstr(err, "needs a value"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--max-body", "2G", NULL), -1);
    CHECK(strstr(err, "--max-body") && strstr(err, "1G"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--max-body", "lots", NULL), -1);
    CHECK(strstr(err, "--max-body") && strstr(err, "size"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--drain-timeout", "5ms", NULL), -1);
    CHECK(strstr(err, "--drain-timeout") && strstr(err, "duration"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--attn", "softmax", NULL), -1);
    CHECK(strstr(err, "--attn") && strstr(err, "exact|performer|darkformer|darkformer-is|flexformer-s|flexformer-n|auto") &&
          strstr(err, "softmax"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--attn", "exact", NULL), 0);
    CHECK_INT_EQ(c.attn, SRV_CFG_ATTN_EXACT);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, (char *[]){"DARKSERVE_ATTN=exact", NULL}, err, sizeof err, "--attn",
                       "auto", NULL),
                 0);
    CHECK_INT_EQ(c.attn, SRV_CFG_ATTN_AUTO);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--log-format", "xml", NULL), -1);
    CHECK(strstr(err, "--log-format") && strstr(err, "text|json"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--host", "", NULL), -1);
    CHECK(strstr(err, "--host") && strstr(err, "empty"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--cors-origin", "https://a.example/path",
                       NULL),
                 -1);
    CHECK(strstr(err, "--cors-origin") && strstr(err, "https://a.example/path"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--cors-origin", "a.example", NULL), -1);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "serve", NULL), -1);
    CHECK(strstr(err, "unexpected argument 'serve'"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--api-key", "has space", NULL), -1);
    CHECK(strstr(err, "--api-key"));
    char *bad_env[] = {"DARKSERVE_MAX_BATCH=0", NULL};
    CHECK_INT_EQ(parse(&c, bad_env, err, sizeof err, NULL), -1);
    CHECK(strstr(err, "DARKSERVE_MAX_BATCH"));
    /* a flag overrides a bad environment variable without reading it */
    CHECK_INT_EQ(parse(&c, bad_env, err, sizeof err, "--max-batch", "4", NULL), 0);
    CHECK_INT_EQ(c.max_batch, 4);
    srv_config_free(&c);
    /* --help wins over everything */
    CHECK_INT_EQ(parse(&c, bad_env, err, sizeof err, "--nope", "--help", NULL), 0);
    CHECK_INT_EQ(c.want_help, 1);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--print-config", NULL), 0);
    CHECK_INT_EQ(c.want_print, 1);
    srv_config_free(&c);
}

TEST(test_api_keys)
{
    char path[] = "/tmp/test_srv_config_keysXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *text = "# production keys\n  key-one  \n\nkey-two\n# old: key-zero\n"
                       "root-key\t admin \n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    srv_config_t c;
    char err[256];
    char flag[300];
    snprintf(flag, sizeof flag, "--api-key-file=%s", path);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--api-key", "topsecret", flag, NULL), 0);
    CHECK_INT_EQ(c.api_keys.n, 4);
    if (c.api_keys.n == 4 && c.api_key_admin) {
        CHECK_STR_EQ(c.api_keys.v[0], "topsecret");
        CHECK_STR_EQ(c.api_keys.v[1], "key-one");
        CHECK_STR_EQ(c.api_keys.v[2], "key-two");
        CHECK_STR_EQ(c.api_keys.v[3], "root-key");
        /* only the key marked "admin" is one; --api-key is a plain key */
        CHECK(!c.api_key_admin[0] && !c.api_key_admin[1] && !c.api_key_admin[2]);
        CHECK(c.api_key_admin[3]);
    }
    char *out = capture(srv_config_print, &c, NULL);
    CHECK(out && !strstr(out, "topsecret"));
    CHECK(out && strstr(out, "api-key            <secret>  (flag)\n"));
    free(out);
    srv_config_free(&c);
    /* anything but "admin" after a key is refused */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, "key-one root\n", 13) == 13);
    close(fd);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, flag, NULL), -1);
    CHECK(strstr(err, "admin") && strstr(err, "root"));
    /* a file with no key is refused, so is a missing file */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, "# none\n\n", 8) == 8);
    close(fd);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, flag, NULL), -1);
    CHECK(strstr(err, "no key"));
    unlink(path);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, flag, NULL), -1);
    CHECK(strstr(err, "--api-key-file") && strstr(err, path));
    /* keys from the environment */
    char *env[] = {"DARKSERVE_API_KEY=envkey", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.api_keys.n, 1);
    srv_config_free(&c);
}

TEST(test_help_lists_every_option)
{
    static const char *const names[] = {
        "host",          "port",           "model",          "models-dir",     "adapter",
        "attn",          "features",       "window",         "threads",
        "max-batch",     "prefill-chunk",  "max-queue",      "max-sessions",
        "max-session-bytes", "session-dir", "session-ttl",   "max-body",
        "max-tokens-limit", "request-timeout", "idle-timeout", "drain-timeout",
        "api-key",       "api-key-file",   "cors-origin",    "log-level",
        "log-format",    "log-file",       "chat-template",  "max-connections",
        "generation-timeout", "sinks",    "memory",     "memory-keep", "memory-heads", "decay",          "max-session-disk",
        "max-session-files", "header-timeout", "max-connections-per-address",
        "max-uploads", "upload-dir",
        "max-state-memory", "checkpoints", "prefix-cache-mb", "ui", "session-store",
        "prompt-precision", "max-prompt-tokens", "kv-bits", NULL};
    char *help = capture(NULL, NULL, srv_config_help);
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    char *dump = capture(srv_config_print, &c, NULL);
    int lines = 0;
    for (const char *p = dump; p && *p; p++)
        lines += *p == '\n';
    int n = 0;
    for (; names[n]; n++) {
        char flag[64], env[64], line[64];
        snprintf(flag, sizeof flag, "  --%s ", names[n]);
        snprintf(env, sizeof env, "env DARKSERVE_");
        size_t k = strlen(env);
        for (const char *q = names[n]; *q && k + 1 < sizeof env; q++)
            env[k++] = *q == '-' ? '_' : (char)(*q - 32 * (*q >= 'a' && *q <= 'z'));
        env[k] = '\0';
        snprintf(line, sizeof line, "\n%-18s ", names[n]);
        CHECK_MSG(help && strstr(help, flag), "help lacks %s", flag);
        CHECK_MSG(help && strstr(help, env), "help lacks %s", env);
        CHECK_MSG(dump && (strstr(dump, line) || strncmp(dump, line + 1, strlen(line) - 1) == 0),
                  "print-config lacks %s", names[n]);
    }
    CHECK_INT_EQ(lines, n); /* one line per option, nothing else */
    CHECK(help && strstr(help, "--print-config"));
    free(help);
    free(dump);
    srv_config_free(&c);
}

/* Values the engine refuses (server/engine/engine.c resolve_opts) are refused here,
 * at startup, with a message that names the flag and the range; the largest
 * accepted values are the engine's own bounds. */
/* --session-store: a redis:// URL or nothing; a bad one is refused at
 * startup with what is wrong; --print-config hides its password. */
TEST(test_session_store)
{
    srv_config_t c;
    char err[512];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    CHECK_STR_EQ(c.session_store, "");
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--session-store", "redis://127.0.0.1:6390/2",
                       NULL), 0);
    CHECK_STR_EQ(c.session_store, "redis://127.0.0.1:6390/2");
    srv_config_free(&c);
    char *env[] = {"DARKSERVE_SESSION_STORE=redis://redis:6379/0", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, NULL), 0);
    CHECK_STR_EQ(c.session_store, "redis://redis:6379/0");
    srv_config_free(&c);
    static const struct {
        const char *url, *says;
    } bad[] = {
        {"http://h:1/0", "unknown session store"},
        {"rediss://h/0", "TLS"},
        {"redis://", "no host"},
        {"redis://h:0/0", "port"},
        {"redis://h:65536", "port"},
        {"redis://h:x/0", "port"},
        {"redis://h/abc", "database"},
        {"redis://h/-1", "database"},
        {"redis://h/0?x=1", "query"},
        {"redis://secret@h/0", "credentials"},
        {"redis://h o/0", "space"},
        {"redis://[::1/0", "IPv6"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--session-store", bad[i].url, NULL), -1);
        CHECK_MSG(strstr(err, "--session-store") && strstr(err, bad[i].says) &&
                      strstr(err, "redis://") && !strstr(err, "secret"),
                  "%s: %s", bad[i].url, err);
    }
    char *bad_env[] = {"DARKSERVE_SESSION_STORE=redis://h:99999", NULL};
    CHECK_INT_EQ(parse(&c, bad_env, err, sizeof err, NULL), -1);
    CHECK_MSG(strstr(err, "port"), "%s", err);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--session-store",
                       "redis://user:s3cret@h:6380/1", NULL), 0);
    char *dump = capture(srv_config_print, &c, NULL);
    CHECK_MSG(dump && strstr(dump, "redis://user:***@h:6380/1") && !strstr(dump, "s3cret"), "%s",
              dump ? dump : "");
    free(dump);
    srv_config_free(&c);
}

TEST(test_engine_bounds)
{
    static const struct {
        const char *flag, *bad, *range;
    } bad[] = {
        {"--max-batch", "257", "[1, 256]"},        {"--max-batch", "1024", "[1, 256]"},
        {"--prefill-chunk", "2049", "[1, 2048]"}, {"--prefill-chunk", "65536", "[1, 2048]"},
        {"--max-queue", "0", "[1, 1000000]"},
    };
    srv_config_t c;
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, bad[i].flag, bad[i].bad, NULL), -1);
        CHECK_MSG(strstr(err, bad[i].flag) && strstr(err, bad[i].range), "%s %s: '%s'",
                  bad[i].flag, bad[i].bad, err);
    }
    CHECK_INT_EQ(parse(&c, (char *[]){"DARKSERVE_MAX_QUEUE=0", NULL}, err, sizeof err, NULL), -1);
    CHECK(strstr(err, "DARKSERVE_MAX_QUEUE"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--max-batch", "256", "--prefill-chunk",
                       "2048", "--max-queue", "1", NULL),
                 0);
    CHECK_INT_EQ(c.max_batch, SRV_ENGINE_MAX_BATCH);
    CHECK_INT_EQ(c.prefill_chunk, SRV_ENGINE_DEFAULT_STEP_TOKENS);
    CHECK_INT_EQ(c.max_queue, 1);
    srv_config_free(&c);
}

/* --no-NAME is --NAME off for the on|off options (--no-ui, --no-decay), wins
 * over the environment like any flag, and exists for no other option. */
TEST(test_no_flags)
{
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.ui, 1);
    CHECK_INT_EQ(c.decay, 1);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--no-ui", "--port", "9", NULL), 0);
    CHECK_INT_EQ(c.ui, 0);
    CHECK_INT_EQ(c.port, 9);
    CHECK_INT_EQ(c.decay, 1);
    srv_config_free(&c);
    char *env[] = {"DARKSERVE_UI=on", "DARKSERVE_DECAY=bogus", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, "--no-decay", "--no-ui", NULL), 0);
    CHECK_INT_EQ(c.ui, 0);
    CHECK_INT_EQ(c.decay, 0);
    srv_config_free(&c);
    char *env_off[] = {"DARKSERVE_UI=off", NULL};
    CHECK_INT_EQ(parse(&c, env_off, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.ui, 0);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, env_off, err, sizeof err, "--ui", "on", NULL), 0);
    CHECK_INT_EQ(c.ui, 1);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--no-port", NULL), -1);
    CHECK(strstr(err, "--no-port"));
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--no-ui=1", NULL), -1);
    CHECK(strstr(err, "--no-ui"));
    char *help = capture(NULL, NULL, srv_config_help);
    CHECK(help && strstr(help, "--no-ui"));
    free(help);
}

/* --prompt-precision: auto by default, f32 or int8 by flag or environment,
 * any other word refused with the choices named. */
TEST(test_prompt_precision)
{
    srv_config_t c;
    char err[256];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.prompt_precision, SRV_PRECISION_AUTO);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--prompt-precision", "int8", NULL), 0);
    CHECK_INT_EQ(c.prompt_precision, SRV_PRECISION_INT8);
    srv_config_free(&c);
    char *env[] = {"DARKSERVE_PROMPT_PRECISION=int8", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.prompt_precision, SRV_PRECISION_INT8);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, "--prompt-precision", "f32", NULL), 0);
    CHECK_INT_EQ(c.prompt_precision, SRV_PRECISION_F32);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, "--prompt-precision", "auto", NULL), 0);
    CHECK_INT_EQ(c.prompt_precision, SRV_PRECISION_AUTO);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--prompt-precision", "f16", NULL), -1);
    CHECK_MSG(strstr(err, "--prompt-precision") && strstr(err, "int8") && strstr(err, "auto") &&
                  strstr(err, "f16"),
              "%s", err);
    /* the CLI commands' parser: the same words, nothing else */
    CHECK_INT_EQ(srv_cfg_precision_parse("auto"), SRV_PRECISION_AUTO);
    CHECK_INT_EQ(srv_cfg_precision_parse("f32"), SRV_PRECISION_F32);
    CHECK_INT_EQ(srv_cfg_precision_parse("int8"), SRV_PRECISION_INT8);
    CHECK_INT_EQ(srv_cfg_precision_parse("INT8"), -1);
    CHECK_INT_EQ(srv_cfg_precision_parse(""), -1);
    CHECK_INT_EQ(srv_cfg_precision_parse("f32 "), -1);
    CHECK_INT_EQ(srv_cfg_precision_parse(NULL), -1);
}

/* --model repeated (or comma-separated): several models, the first the
 * default; known short names resolve to their file in models/ unless a file
 * of that name exists; flags that fit one model only are refused. */
TEST(test_several_models)
{
    srv_config_t c;
    char err[512];
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.models.n, 1);
    CHECK_STR_EQ(c.models.v[0], "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", "a.gguf", "--model", "dir/b.gguf",
                       NULL),
                 0);
    CHECK_INT_EQ(c.models.n, 2);
    CHECK_STR_EQ(c.model, "a.gguf");
    CHECK_STR_EQ(c.models.v[1], "dir/b.gguf");
    srv_config_free(&c);
    char *const env[] = {"DARKSERVE_MODEL=gemma3-270m, smollm2-135m", NULL};
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, NULL), 0);
    CHECK_INT_EQ(c.models.n, 2);
    CHECK_STR_EQ(c.model, "models/gemma-3-270m-q4_k_m.gguf");
    CHECK_STR_EQ(c.models.v[1], "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    srv_config_free(&c);
    /* a flag replaces the environment's list */
    CHECK_INT_EQ(parse(&c, env, err, sizeof err, "--model", "x.gguf", NULL), 0);
    CHECK_INT_EQ(c.models.n, 1);
    CHECK_STR_EQ(c.model, "x.gguf");
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", "GEMMA3-270M", NULL), 0);
    CHECK_STR_EQ(c.model, "models/gemma-3-270m-q4_k_m.gguf");
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", ",", NULL), -1);
    CHECK(strstr(err, "--model") != NULL);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", "a.gguf,b.gguf", "--adapter",
                       "x.darkformer.gguf", NULL),
                 -1);
    CHECK(strstr(err, "--adapter") != NULL);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", "a.gguf,b.gguf",
                       "--session-store", "redis://127.0.0.1:6379", NULL),
                 -1);
    CHECK(strstr(err, "--session-store") != NULL);
    /* --models-dir: its .gguf files, by name; after --model, else instead
     * of the default */
    char dir[] = "/tmp/ds_models_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[256];
    static const char *const files[] = {"b.gguf", "a.GGUF", "notes.txt", ".hidden.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        int fd = open(p, O_CREAT | O_WRONLY, 0600);
        CHECK(fd >= 0);
        close(fd);
    }
    snprintf(p, sizeof p, "%s/sub.gguf", dir); /* a directory: not a model */
    CHECK(mkdir(p, 0700) == 0);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--models-dir", dir, NULL), 0);
    CHECK_INT_EQ(c.models.n, 2);
    snprintf(p, sizeof p, "%s/a.GGUF", dir);
    CHECK_STR_EQ(c.models.v[0], p);
    CHECK_STR_EQ(c.model, p);
    snprintf(p, sizeof p, "%s/b.gguf", dir);
    CHECK_STR_EQ(c.models.v[1], p);
    srv_config_free(&c);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--model", "x.gguf", "--models-dir", dir,
                       NULL),
                 0);
    CHECK_INT_EQ(c.models.n, 3);
    CHECK_STR_EQ(c.model, "x.gguf");
    srv_config_free(&c);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/sub.gguf", dir);
    rmdir(p);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--models-dir", dir, NULL), -1);
    CHECK(strstr(err, "holds no .gguf file") != NULL);
    rmdir(dir);
    CHECK_INT_EQ(parse(&c, no_env, err, sizeof err, "--models-dir", dir, NULL), -1);
    CHECK(strstr(err, "--models-dir") != NULL);
    /* the names */
    CHECK_STR_EQ(srv_known_model_name("models/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2-135m");
    CHECK_STR_EQ(srv_known_model_name("/x/gemma-3-270m-q4_k_m"), "gemma3-270m");
    CHECK(srv_known_model_name("models/tiny.gguf") == NULL);
    CHECK(srv_known_model_file("nope") == NULL);
}

int main(void)
{
    RUN(test_several_models);
    RUN(test_defaults);
    RUN(test_flags_and_env);
    RUN(test_sizes_and_durations);
    RUN(test_errors_name_the_flag);
    RUN(test_api_keys);
    RUN(test_engine_bounds);
    RUN(test_session_store);
    RUN(test_help_lists_every_option);
    RUN(test_no_flags);
    RUN(test_prompt_precision);
    return CHECK_DONE();
}
