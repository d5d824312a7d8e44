/* server/cli/cli_chat.c — `darkserve chat`: an interactive terminal client.
 *
 * A REPL over the native sessions API (docs/API.md): it creates a session
 * on the server, sends each line typed as a user message to
 * POST /v1/sessions/{id}/generate (SSE) and prints the reply as it streams,
 * and maps slash commands onto rollback, regenerate, export/import and the
 * session info. It talks HTTP through server/cli/http_client.h only; with
 * --model (or no --url) it first starts `darkserve serve` as a child process
 * on a free loopback port and stops it on exit.
 *
 * Signals: Ctrl-C (SIGINT) sets a flag the HTTP client polls, so it closes a
 * streamed reply (the server cancels the generation; what was generated stays
 * in the session) and at the prompt discards the line; SIGTERM and SIGHUP
 * quit like EOF. The child server runs in its own process group (the
 * terminal's Ctrl-C is ours, not its) and gets SIGTERM if we die
 * (PR_SET_PDEATHSIG).
 */
#include "server/cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"
#include "server/cli/cli_opts.h"
#include "server/config.h"
#include "server/cli/http_client.h"

#define LINE_MAX_BYTES 65536          /* one line typed */
#define JSON_MAX ((uint64_t)16 << 20) /* a JSON answer */
#define EVENT_MAX ((size_t)4 << 20)   /* one streamed event */
#define STATE_MAX ((uint64_t)4 << 30) /* a state blob, /save and /load */
#define LOG_MAX ((size_t)1 << 20)     /* what is read of the child's log */
#define BUSY_RETRIES 50               /* 409 session_busy: 50 x 100 ms */
#define MAX_SERVER_ARGS 64

static volatile sig_atomic_t g_interrupt; /* Ctrl-C: stop what runs now */
static volatile sig_atomic_t g_quit;      /* SIGTERM / SIGHUP: leave */

static void on_signal(int sig)
{
    g_interrupt = 1;
    if (sig != SIGINT)
        g_quit = 1;
}

typedef struct chat {
    srv_hc_url_t url;
    char url_text[600];
    const char *api_key;
    int timeout_ms;
    char sid[PROTO_SESSION_ID_LEN + 1];
    int64_t max_tokens; /* 0: the server's default */
    double temperature; /* NAN: the server's default */
    json_t *options;    /* --options: more fields of every generate; owned */
    /* the last reply */
    int have_last;
    int64_t last_tokens;
    double last_gen_ms, last_tps;
    char last_finish[16];
    /* the server we started, if any */
    pid_t child;
    char tmpdir[512];
} chat_t;

/* ---- HTTP helpers -------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The "error" of an answer body: {"error": {"message": …}} (this API) or
 * {"error": "…"} (Ollama's). Returns a new string or NULL; *code gets the
 * error code when there is one (borrowed from a static buffer of size n). */
static char *error_message(const char *body, size_t len, char *code, size_t n)
{
    if (code && n)
        code[0] = '\0';
    json_t *j = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    json_t *e = j ? json_object_get(j, "error") : NULL;
    const char *msg = NULL;
    if (json_is_string(e)) {
        msg = json_string_value(e);
    } else if (json_is_object(e)) {
        msg = json_string_value(json_object_get(e, "message"));
        const char *c = json_string_value(json_object_get(e, "code"));
        if (c && code && n)
            snprintf(code, n, "%s", c);
    }
    char *out = msg ? strdup(msg) : NULL;
    json_decref(j);
    return out;
}

static void print_http_error(int status, const srv_hc_buf_t *body)
{
    char *msg = body->data ? error_message(body->data, body->len, NULL, 0) : NULL;
    if (msg)
        fprintf(stderr, "error: %s (HTTP %d)\n", msg, status);
    else
        fprintf(stderr, "error: HTTP %d %.*s\n", status, (int)(body->len > 200 ? 200 : body->len),
                body->data ? body->data : "");
    free(msg);
}

static int is_busy(int status, const srv_hc_buf_t *body)
{
    char code[64];
    if (status != 409 || !body->data)
        return 0;
    free(error_message(body->data, body->len, code, sizeof code));
    return strcmp(code, "session_busy") == 0;
}

/* One request; the answer's body goes to out (bounded by out->max). A 409
 * session_busy is retried for a few seconds: right after a reply stopped
 * with Ctrl-C the server may still be ending its generation. Returns the
 * HTTP status, or a negative code after printing why. */
static int call(chat_t *c, const char *method, const char *path, const char *ctype,
                const void *body, size_t len, srv_hc_buf_t *out)
{
    char err[256];
    for (int attempt = 0;; attempt++) {
        out->len = 0;
        if (out->data)
            out->data[0] = '\0';
        srv_hc_request_t rq = {.method = method,
                               .path = path,
                               .bearer = c->api_key,
                               .content_type = ctype,
                               .body = body,
                               .body_len = len,
                               .timeout_ms = c->timeout_ms,
                               .body_max = out->max,
                               .cancel = &g_interrupt,
                               .on_body = srv_hc_buf_append,
                               .ud = out};
        int st = srv_hc_request(&c->url, &rq, err, sizeof err);
        if (st < 0) {
            if (st == SRV_HC_ECANCELED)
                fprintf(stderr, "interrupted\n");
            else
                fprintf(stderr, "error: %s %s: %s\n", method, path, err);
            return st;
        }
        if (attempt < BUSY_RETRIES && is_busy(st, out)) {
            sleep_ms(100);
            continue;
        }
        return st;
    }
}

/* A JSON request whose answer must be a JSON object with status want.
 * Returns the parsed answer (new reference) or NULL after printing why. */
static json_t *call_json(chat_t *c, const char *method, const char *path, json_t *body, int want)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !text) {
        fprintf(stderr, "error: out of memory\n");
        return NULL;
    }
    srv_hc_buf_t out = {.max = JSON_MAX};
    int st = call(c, method, path, text ? "application/json" : NULL, text, text ? strlen(text) : 0,
                  &out);
    free(text);
    json_t *j = NULL;
    if (st == want) {
        j = out.data ? json_loadb(out.data, out.len, JSON_ALLOW_NUL, NULL) : NULL;
        if (!json_is_object(j)) {
            fprintf(stderr, "error: %s %s: the answer is not a JSON object\n", method, path);
            json_decref(j);
            j = NULL;
        }
    } else if (st > 0) {
        print_http_error(st, &out);
    }
    srv_hc_buf_free(&out);
    return j;
}

static int64_t jint(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static double jnum(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

/* Makes the session in answer j (the short or full object) the current one. */
static int take_session(chat_t *c, const json_t *j)
{
    const char *id = json_string_value(json_object_get(j, "id"));
    if (!id || !proto_session_id_valid(id, strlen(id))) {
        fprintf(stderr, "error: the answer has no valid session id\n");
        return -1;
    }
    memcpy(c->sid, id, PROTO_SESSION_ID_LEN + 1);
    c->have_last = 0;
    return 0;
}

/* POST /v1/sessions with body (NULL: empty session). Returns the answer. */
static json_t *create_session(chat_t *c, json_t *body)
{
    json_t *empty = body ? NULL : json_object();
    json_t *j = call_json(c, "POST", "/v1/sessions", body ? body : empty, 201);
    json_decref(empty);
    return j;
}

static json_t *session_info(chat_t *c, const char *id)
{
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    return call_json(c, "GET", path, NULL, 200);
}

/* ---- streamed replies ---------------------------------------------------- */

typedef struct reply {
    chat_t *c;
    int status, sse;
    srv_sse_t ev;
    srv_hc_buf_t other; /* a non-SSE answer (an error) */
    int printed, at_line_start, done, failed;
} reply_t;

static int reply_head(void *ud, int status, const char *ctype)
{
    reply_t *r = ud;
    r->status = status;
    r->sse = status == 200 && strncmp(ctype, "text/event-stream", 17) == 0;
    return 0;
}

static int reply_body(void *ud, const char *data, size_t len)
{
    reply_t *r = ud;
    if (r->sse)
        return srv_sse_feed(&r->ev, data, len) == 0 ? 0 : -1;
    return srv_hc_buf_append(&r->other, data, len);
}

/* Writes to the terminal with write(2), not stdio: a Ctrl-C that lands
 * while a long reply blocks on a full terminal makes write() return early
 * (EINTR, or a short count), which would leave stdio's stream in an error
 * state and lose what follows ("[stopped]"). Here the rest is written. */
static void out_write(const char *s, size_t n)
{
    fflush(stdout);
    while (n) {
        ssize_t w = write(1, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void out_str(const char *s)
{
    out_write(s, strlen(s));
}

static void reply_newline(reply_t *r)
{
    if (!r->at_line_start)
        out_str("\n");
    r->at_line_start = 1;
}

static int reply_event(void *ud, const char *data, size_t len)
{
    reply_t *r = ud;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0)
        return 0;
    /* model text may hold NUL, sent as \u0000 (docs/API.md) */
    json_error_t jerr;
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(j)) {
        json_decref(j);
        reply_newline(r);
        fprintf(stderr, "error: the server sent an event that is not a JSON object (%s)\n",
                j ? "another JSON value" : jerr.text);
        r->failed = 1;
        return -1;
    }
    json_t *e = json_object_get(j, "error");
    json_t *text = json_object_get(j, "text");
    if (e) {
        char *msg = error_message(data, len, NULL, 0);
        reply_newline(r);
        fprintf(stderr, "error: %s\n", msg ? msg : "the stream ended with an error");
        free(msg);
        r->failed = 1;
    } else if (json_is_true(json_object_get(j, "done"))) {
        chat_t *c = r->c;
        json_t *usage = json_object_get(j, "usage");
        json_t *tm = json_object_get(j, "timings");
        c->have_last = 1;
        c->last_tokens = jint(usage, "completion_tokens");
        c->last_gen_ms = jnum(tm, "generation_ms");
        c->last_tps = jnum(tm, "generation_tokens_per_second");
        const char *fin = json_string_value(json_object_get(j, "finish_reason"));
        snprintf(c->last_finish, sizeof c->last_finish, "%s", fin ? fin : "?");
        if (fin && strcmp(fin, "timeout") == 0) {
            reply_newline(r);
            out_str("[the server's generation timeout ended the reply]\n");
        }
        r->done = 1;
    } else if (json_is_string(text)) {
        size_t n = json_string_length(text);
        if (n) {
            out_write(json_string_value(text), n);
            r->printed = 1;
            r->at_line_start = json_string_value(text)[n - 1] == '\n';
        }
    }
    json_decref(j);
    return 0;
}

static json_t *gen_body(const chat_t *c)
{
    json_t *o = c->options ? json_deep_copy(c->options) : json_object();
    if (o && (json_object_set_new(o, "stream", json_true()) != 0 ||
              json_object_set_new(o, "stream_format", json_string("sse")) != 0)) {
        json_decref(o);
        o = NULL;
    }
    if (o && c->max_tokens > 0)
        json_object_set_new(o, "max_tokens", json_integer(c->max_tokens));
    if (o && !isnan(c->temperature))
        json_object_set_new(o, "temperature", json_real(c->temperature));
    return o;
}

/* POSTs body (owned, freed here) to path and prints the streamed reply.
 * Returns 0 when the reply ended normally, -1 otherwise (said why). */
static int stream_reply(chat_t *c, const char *path, json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        fprintf(stderr, "error: out of memory\n");
        return -1;
    }
    reply_t r = {.c = c, .at_line_start = 1};
    r.other.max = JSON_MAX;
    char err[256];
    int st = 0;
    for (int attempt = 0; attempt <= BUSY_RETRIES; attempt++) {
        srv_sse_free(&r.ev);
        if (srv_sse_init(&r.ev, EVENT_MAX, reply_event, &r) < 0)
            break;
        r.other.len = 0;
        r.sse = 0;
        srv_hc_request_t rq = {.method = "POST",
                               .path = path,
                               .bearer = c->api_key,
                               .content_type = "application/json",
                               .body = text,
                               .body_len = strlen(text),
                               .timeout_ms = c->timeout_ms,
                               .body_max = UINT64_MAX,
                               .cancel = &g_interrupt,
                               .on_head = reply_head,
                               .on_body = reply_body,
                               .ud = &r};
        st = srv_hc_request(&c->url, &rq, err, sizeof err);
        if (st < 0 || !is_busy(st, &r.other))
            break;
        sleep_ms(100);
    }
    int rc = -1;
    if (st == SRV_HC_ECANCELED) {
        reply_newline(&r);
        out_str("[stopped]\n");
    } else if (st < 0) {
        reply_newline(&r);
        if (r.ev.failed && !r.failed)
            fprintf(stderr, "error: %s\n", r.ev.err);
        else if (!r.failed)
            fprintf(stderr, "error: %s\n", err);
    } else if (!r.sse) {
        print_http_error(st, &r.other);
    } else if (!r.done) {
        reply_newline(&r);
        if (!r.failed)
            fprintf(stderr, "error: the stream ended before its last event\n");
    } else {
        reply_newline(&r);
        rc = r.failed ? -1 : 0;
    }
    srv_sse_free(&r.ev);
    srv_hc_buf_free(&r.other);
    free(text);
    return rc;
}

/* ---- commands ------------------------------------------------------------ */

static void cmd_turn(chat_t *c, const char *line)
{
    json_t *body = gen_body(c);
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", line);
    if (!body || !msgs) {
        json_decref(body);
        json_decref(msgs);
        fprintf(stderr, "error: the line is not valid UTF-8 (or out of memory)\n");
        return;
    }
    json_object_set_new(body, "messages", msgs);
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s/generate", c->sid);
    stream_reply(c, path, body);
}

static void cmd_regenerate(chat_t *c)
{
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s/regenerate", c->sid);
    stream_reply(c, path, gen_body(c));
}

static void cmd_rollback(chat_t *c, const char *arg)
{
    long long n = 1;
    if (*arg) {
        char *end = NULL;
        errno = 0;
        n = strtoll(arg, &end, 10);
        if (errno || *end || n < 1 || n > 1000000000) {
            fprintf(stderr, "usage: /rollback [N]   (N turns to undo, default 1)\n");
            return;
        }
    }
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s/rollback", c->sid);
    json_t *body = json_pack("{s:I}", "turns", (json_int_t)n);
    json_t *j = call_json(c, "POST", path, body, 200);
    json_decref(body);
    if (!j)
        return;
    c->have_last = 0;
    printf("rolled back %lld turn%s: %" PRId64 " tokens, %" PRId64 " turns\n", n, n == 1 ? "" : "s",
           jint(j, "tokens"), jint(j, "turns"));
    json_decref(j);
}

static void print_bytes(int64_t b)
{
    if (b >= (int64_t)1 << 20)
        printf("%" PRId64 " bytes (%.1f MiB)", b, (double)b / (1 << 20));
    else
        printf("%" PRId64 " bytes (%.1f KiB)", b, (double)b / 1024);
}

static void cmd_stats(chat_t *c)
{
    json_t *j = session_info(c, c->sid);
    if (!j)
        return;
    json_t *ck = json_object_get(j, "checkpoints");
    const char *kind = json_string_value(json_object_get(json_object_get(j, "attention"), "kind"));
    printf("session      %s\n", c->sid);
    printf("tokens       %" PRId64 "\n", jint(j, "tokens"));
    printf("turns        %" PRId64 " (%zu checkpoints)\n", jint(j, "turns"), json_array_size(ck));
    printf("state        ");
    print_bytes(jint(j, "state_bytes"));
    printf("\n");
    if (kind)
        printf("attention    %s\n", kind);
    if (c->have_last)
        printf("last reply   %" PRId64 " tokens in %.2f s, %.1f tokens/s (%s)\n", c->last_tokens,
               c->last_gen_ms / 1000.0, c->last_tps, c->last_finish);
    else
        printf("last reply   none since this session began or was rolled back\n");
    json_decref(j);
}

static int write_file(const char *path, const char *data, size_t len)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.part", path) >= (int)sizeof tmp) {
        fprintf(stderr, "error: path too long\n");
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "error: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    int saved = errno;
    int ok = off == len && fsync(fd) == 0;
    if (!ok && off == len)
        saved = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        fprintf(stderr, "error: cannot write %s: %s\n", path, strerror(saved));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void cmd_save(chat_t *c, const char *file)
{
    if (!*file) {
        fprintf(stderr, "usage: /save FILE\n");
        return;
    }
    json_t *info = session_info(c, c->sid);
    if (!info)
        return;
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s/state", c->sid);
    srv_hc_buf_t blob = {.max = STATE_MAX};
    int st = call(c, "GET", path, NULL, NULL, 0, &blob);
    if (st == 200 && write_file(file, blob.data ? blob.data : "", blob.len) == 0)
        printf("saved session %s to %s: %zu bytes, %" PRId64 " tokens, %" PRId64 " turns\n", c->sid,
               file, blob.len, jint(info, "tokens"), jint(info, "turns"));
    else if (st > 0 && st != 200)
        print_http_error(st, &blob);
    srv_hc_buf_free(&blob);
    json_decref(info);
}

/* Reads a whole file of at most STATE_MAX bytes into b. */
static int read_file(const char *file, srv_hc_buf_t *b)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > STATE_MAX) {
        fprintf(stderr, "error: %s is not a regular file of at most %" PRIu64 " bytes\n", file,
                STATE_MAX);
        close(fd);
        return -1;
    }
    b->max = STATE_MAX;
    char chunk[65536];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
            break;
        }
        if (r == 0) {
            close(fd);
            return 0;
        }
        if (srv_hc_buf_append(b, chunk, (size_t)r) != 0) {
            fprintf(stderr, "error: %s: out of memory or over %" PRIu64 " bytes\n", file,
                    STATE_MAX);
            break;
        }
    }
    close(fd);
    return -1;
}

static void cmd_load(chat_t *c, const char *file)
{
    if (!*file) {
        fprintf(stderr, "usage: /load FILE\n");
        return;
    }
    srv_hc_buf_t blob = {.max = STATE_MAX};
    if (read_file(file, &blob) != 0) {
        srv_hc_buf_free(&blob);
        return;
    }
    json_t *made = create_session(c, NULL);
    const char *id = made ? json_string_value(json_object_get(made, "id")) : NULL;
    if (!id || strlen(id) != 32) {
        if (made)
            fprintf(stderr, "error: the answer has no session id\n");
        json_decref(made);
        srv_hc_buf_free(&blob);
        return;
    }
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/%s/state", id);
    srv_hc_buf_t out = {.max = JSON_MAX};
    int st = call(c, "PUT", path, "application/octet-stream", blob.data ? blob.data : "", blob.len,
                  &out);
    json_t *j = st == 200 && out.data ? json_loadb(out.data, out.len, JSON_ALLOW_NUL, NULL) : NULL;
    if (json_is_object(j) && take_session(c, j) == 0) {
        printf("loaded %s into session %s: %" PRId64 " tokens, %" PRId64 " turns\n", file, c->sid,
               jint(j, "tokens"), jint(j, "turns"));
    } else {
        if (st > 0 && st != 200)
            print_http_error(st, &out);
        else if (st == 200)
            fprintf(stderr, "error: the import's answer is not a session object\n");
        snprintf(path, sizeof path, "/v1/sessions/%s", id);
        srv_hc_buf_t del = {.max = JSON_MAX};
        call(c, "DELETE", path, NULL, NULL, 0, &del);
        srv_hc_buf_free(&del);
    }
    json_decref(j);
    json_decref(made);
    srv_hc_buf_free(&out);
    srv_hc_buf_free(&blob);
}

/* /system TEXT (a new session with that system prompt) and /new (empty). */
static void cmd_new(chat_t *c, const char *system)
{
    json_t *body = system ? json_pack("{s:s}", "system", system) : NULL;
    if (system && !body) {
        fprintf(stderr, "error: the text is not valid UTF-8\n");
        return;
    }
    json_t *j = create_session(c, body);
    json_decref(body);
    if (j && take_session(c, j) == 0)
        printf("new session %s%s: %" PRId64 " tokens\n", c->sid,
               system ? " with that system prompt" : "", jint(j, "tokens"));
    json_decref(j);
}

static void cmd_help(void)
{
    printf("Type a message and press Enter; the reply streams as it is generated.\n"
           "Ctrl-C stops a reply (what was generated stays); Ctrl-D or /quit leaves.\n"
           "A line that starts with '//' sends the rest of it, starting with '/'.\n\n"
           "  /rollback [N]   undo the last N turns (default 1)\n"
           "  /regenerate     replace the last reply with a new one\n"
           "  /save FILE      export the session state to FILE\n"
           "  /load FILE      import a state from FILE into a new session and go on there\n"
           "  /system TEXT    start a new session with this system prompt\n"
           "  /new            start a new empty session\n"
           "  /stats          tokens, turns, state size, the last reply's speed\n"
           "  /help           this text\n"
           "  /quit           leave (also /exit)\n");
}

/* Runs one line; returns 1 to quit. */
static int run_line(chat_t *c, char *line)
{
    if (line[0] != '/' || line[1] == '/') {
        cmd_turn(c, line[0] == '/' ? line + 1 : line);
        return 0;
    }
    char *arg = line + 1 + strcspn(line + 1, " \t");
    if (*arg)
        *arg++ = '\0';
    arg += strspn(arg, " \t");
    const char *cmd = line + 1;
    if (strcmp(cmd, "quit") == 0 || strcmp(cmd, "exit") == 0)
        return 1;
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "?") == 0)
        cmd_help();
    else if (strcmp(cmd, "rollback") == 0)
        cmd_rollback(c, arg);
    else if (strcmp(cmd, "regenerate") == 0)
        cmd_regenerate(c);
    else if (strcmp(cmd, "save") == 0)
        cmd_save(c, arg);
    else if (strcmp(cmd, "load") == 0)
        cmd_load(c, arg);
    else if (strcmp(cmd, "system") == 0) {
        if (*arg)
            cmd_new(c, arg);
        else
            fprintf(stderr, "usage: /system TEXT   (/new starts a session without one)\n");
    } else if (strcmp(cmd, "new") == 0)
        cmd_new(c, NULL);
    else if (strcmp(cmd, "stats") == 0)
        cmd_stats(c);
    else
        fprintf(stderr, "unknown command '/%s' (/help lists them)\n", cmd);
    return 0;
}

/* ---- reading lines ------------------------------------------------------- */

typedef struct reader {
    char buf[LINE_MAX_BYTES + 1];
    size_t len;
    int eof, skipping; /* skipping: the rest of a line over the bound */
} reader_t;

/* Reads one line from fd 0 into r->buf (NUL-terminated, without its end).
 * Returns its length (>= 0), -1 at the end of input, -2 when Ctrl-C or a
 * quit signal interrupted, -3 for a line over LINE_MAX_BYTES (dropped). */
static int64_t read_line(reader_t *r, size_t *consumed)
{
    for (;;) {
        char *nl = memchr(r->buf, '\n', r->len);
        if (nl || (r->eof && r->len)) {
            size_t n = nl ? (size_t)(nl - r->buf) : r->len;
            *consumed = nl ? n + 1 : n;
            r->buf[n] = '\0';
            if (n && r->buf[n - 1] == '\r')
                r->buf[--n] = '\0';
            if (r->skipping) {
                r->skipping = 0;
                return -3;
            }
            return (int64_t)n;
        }
        if (r->eof)
            return -1;
        if (r->len == LINE_MAX_BYTES) {
            r->skipping = 1;
            r->len = 0;
        }
        ssize_t got = read(0, r->buf + r->len, LINE_MAX_BYTES - r->len);
        if (got < 0 && errno == EINTR) {
            if (g_interrupt) {
                r->len = 0;
                r->skipping = 0;
                return -2;
            }
            continue;
        }
        if (got <= 0)
            r->eof = 1;
        else
            r->len += (size_t)got;
    }
}

static void reader_drop(reader_t *r, size_t n)
{
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

/* ---- the server we may start --------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void print_log_tail(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char buf[4096];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "--- the server's log (end) ---\n%s%s------\n", buf,
            n && buf[n - 1] != '\n' ? "\n" : "");
}

static void server_stop(chat_t *c)
{
    if (c->child > 0) {
        kill(c->child, SIGTERM);
        int status;
        pid_t w = 0;
        for (int i = 0; i < 300 && (w = waitpid(c->child, &status, WNOHANG)) == 0; i++)
            sleep_ms(50);
        if (w == 0) {
            kill(c->child, SIGKILL);
            waitpid(c->child, &status, 0);
        }
        c->child = 0;
    }
    if (c->tmpdir[0]) {
        nftw(c->tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        c->tmpdir[0] = '\0';
    }
}

/* The URL of the child's "listening on http://…" log line, or 0 chars. */
static int find_listen_url(const char *log, char *url, size_t n)
{
    int fd = open(log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char *buf = malloc(LOG_MAX + 1);
    ssize_t got = buf ? read(fd, buf, LOG_MAX) : -1;
    close(fd);
    int found = 0;
    if (got > 0) {
        buf[got] = '\0';
        const char *p = strstr(buf, "listening on http://");
        if (p) {
            p += strlen("listening on ");
            size_t k = strcspn(p, " \t\r\n");
            if (k < n) {
                memcpy(url, p, k);
                url[k] = '\0';
                found = 1;
            }
        }
    }
    free(buf);
    return found;
}

static int server_start(chat_t *c, const char *model, const char **extra, int n_extra,
                        int start_timeout_s)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(c->tmpdir, sizeof c->tmpdir, "%s/darkserve-chat-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(c->tmpdir)) {
        fprintf(stderr, "darkserve chat: cannot make a folder for the server (%s): %s\n", c->tmpdir,
                strerror(errno));
        c->tmpdir[0] = '\0';
        return -1;
    }
    char log[600], sessions[600];
    snprintf(log, sizeof log, "%s/server.log", c->tmpdir);
    snprintf(sessions, sizeof sessions, "%s/sessions", c->tmpdir);
    const char *argv[MAX_SERVER_ARGS + 16];
    int n = 0;
    argv[n++] = "darkserve";
    argv[n++] = "serve";
    argv[n++] = "--host";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--session-dir";
    argv[n++] = sessions;
    argv[n++] = "--drain-timeout";
    argv[n++] = "5s";
    if (model) {
        argv[n++] = "--model";
        argv[n++] = model;
    }
    for (int i = 0; i < n_extra; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "darkserve chat: cannot start the server: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int nfd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (lfd < 0 || nfd < 0)
            _exit(127);
        dup2(nfd, 0);
        dup2(nfd, 1);
        dup2(lfd, 2);
        execv("/proc/self/exe", (char *const *)argv);
        fprintf(stderr, "darkserve chat: cannot run the server: %s\n", strerror(errno));
        _exit(127);
    }
    c->child = pid;
    printf("starting darkserve serve%s%s (log: %s) …\n", model ? " --model " : "",
           model ? model : "", log);
    fflush(stdout);
    char url[300] = "";
    for (int64_t waited = 0;; waited += 100) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            c->child = 0;
            fprintf(stderr, "darkserve chat: the server exited (%s %d) before it was ready\n",
                    WIFEXITED(status) ? "status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            print_log_tail(log);
            return -1;
        }
        if (g_interrupt) {
            fprintf(stderr, "darkserve chat: interrupted while the server started\n");
            return -1;
        }
        if (waited > (int64_t)start_timeout_s * 1000) {
            fprintf(stderr, "darkserve chat: the server was not ready after %d s\n",
                    start_timeout_s);
            print_log_tail(log);
            return -1;
        }
        if (!url[0] && find_listen_url(log, url, sizeof url)) {
            char err[256];
            if (srv_hc_url_parse(url, &c->url, err, sizeof err) < 0) {
                fprintf(stderr, "darkserve chat: %s\n", err);
                return -1;
            }
            snprintf(c->url_text, sizeof c->url_text, "%s", url);
        }
        if (url[0]) {
            srv_hc_buf_t out = {.max = JSON_MAX};
            char err[256];
            srv_hc_request_t rq = {.method = "GET",
                                   .path = "/health",
                                   .timeout_ms = 5000,
                                   .body_max = JSON_MAX,
                                   .cancel = &g_interrupt,
                                   .on_body = srv_hc_buf_append,
                                   .ud = &out};
            int st = srv_hc_request(&c->url, &rq, err, sizeof err);
            srv_hc_buf_free(&out);
            if (st == 200)
                return 0;
        }
        sleep_ms(100);
    }
}

/* GET /health on a server given by --url, waiting while it loads its model.
 * Returns 0 or -1 after saying why. */
static int server_check(chat_t *c, int start_timeout_s)
{
    for (int64_t waited = 0;; waited += 500) {
        srv_hc_buf_t out = {.max = JSON_MAX};
        char err[256];
        srv_hc_request_t rq = {.method = "GET",
                               .path = "/health",
                               .bearer = c->api_key,
                               .timeout_ms = c->timeout_ms,
                               .body_max = JSON_MAX,
                               .cancel = &g_interrupt,
                               .on_body = srv_hc_buf_append,
                               .ud = &out};
        int st = srv_hc_request(&c->url, &rq, err, sizeof err);
        char code[64] = "";
        if (st == 503 && out.data)
            free(error_message(out.data, out.len, code, sizeof code));
        int loading = st == 503 && (strcmp(code, "loading") == 0 ||
                                    (out.data && strstr(out.data, "\"loading\"")));
        if (st == 200 || (!loading && st > 0)) {
            if (st != 200) {
                fprintf(stderr, "darkserve chat: %s/health: ", c->url_text);
                print_http_error(st, &out);
            }
            srv_hc_buf_free(&out);
            return st == 200 ? 0 : -1;
        }
        srv_hc_buf_free(&out);
        if (st < 0) {
            fprintf(stderr, "darkserve chat: cannot reach the server at %s: %s\n", c->url_text,
                    err);
            return -1;
        }
        if (waited > (int64_t)start_timeout_s * 1000) {
            fprintf(stderr, "darkserve chat: %s was still loading its model after %d s\n",
                    c->url_text, start_timeout_s);
            return -1;
        }
        sleep_ms(500);
    }
}

/* ---- main ---------------------------------------------------------------- */

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a blocked read() returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int repl(chat_t *c)
{
    reader_t *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "darkserve chat: out of memory\n");
        return 1;
    }
    while (!g_quit) {
        g_interrupt = 0;
        clearerr(stdout); /* a write that a signal cut short is no reason to stop */
        out_str("> ");
        size_t used = 0;
        int64_t n = read_line(r, &used);
        if (n == -1) {
            printf("\n");
            break;
        }
        if (n == -2) {
            printf("\n");
            continue;
        }
        if (n == -3) {
            fprintf(stderr, "error: line over %d bytes, not sent\n", LINE_MAX_BYTES);
            reader_drop(r, used);
            continue;
        }
        g_interrupt = 0; /* a Ctrl-C that came while the line was typed */
        char *line = r->buf;
        while (*line == ' ' || *line == '\t')
            line++;
        int quit = 0;
        if (*line) {
            /* run_line may read no more input: the line stays in r->buf until
             * it is done */
            quit = run_line(c, line);
        }
        reader_drop(r, used);
        if (quit)
            break;
    }
    free(r);
    fflush(stdout);
    return 0;
}

int srv_cli_chat(int argc, char **argv)
{
    static const char usage[] = "[--url URL | --model MODEL.gguf] [options] [-- SERVE-OPTIONS]";
    const char *url = NULL, *model = NULL, *session = NULL, *system = NULL, *key = NULL;
    const char *options = NULL;
    int64_t max_tokens = 0, timeout_s = 300, start_timeout_s = 300;
    double temperature = NAN;
    const srv_opt_t opts[] = {
        {"url", SRV_OPT_STR, &url, 0, 0,
         "a running server (http://HOST:PORT); without it chat starts `darkserve serve` on a "
         "free loopback port and stops it on exit"},
        {"model", SRV_OPT_STR, &model, 0, 0,
         "the model of the server chat starts (default: the server's default, "
         "$DARKSERVE_MODEL or " SRV_DEFAULT_MODEL ")"},
        {"session", SRV_OPT_STR, &session, 0, 0, "continue this session instead of a new one"},
        {"system", SRV_OPT_STR, &system, 0, 0, "system prompt of the first session"},
        {"max-tokens", SRV_OPT_INT, &max_tokens, 1, 1 << 30,
         "longest reply in tokens (default: the server's, " SRV_STR(PROTO_DEFAULT_MAX_TOKENS) ")"},
        {"temperature", SRV_OPT_FLOAT, &temperature, 0, 2,
         "sampling temperature, 0 = greedy (default: the server's, 1)"},
        {"options", SRV_OPT_STR, &options, 0, 0,
         "a JSON object of more fields for every reply, e.g. '{\"top_p\": 0.9, \"seed\": 7}' "
         "(sampling parameters of docs/API.md)"},
        {"api-key", SRV_OPT_STR, &key, 0, 0,
         "API key of a server that needs one (default $DARKSERVE_API_KEY)"},
        {"timeout", SRV_OPT_INT, &timeout_s, 1, 86400,
         "seconds to wait for the server to send anything before giving up on a request"},
        {"start-timeout", SRV_OPT_INT, &start_timeout_s, 1, 86400,
         "seconds a server may take to load its model"},
    };
    const char *extra[MAX_SERVER_ARGS];
    int n_extra = 0;
    int rc = srv_opts_parse("chat", usage, opts, sizeof opts / sizeof opts[0], argc, argv, extra,
                            MAX_SERVER_ARGS, &n_extra);
    if (rc != 0) {
        if (rc > 0)
            printf("\nOptions after -- go to the `darkserve serve` that chat starts (not with "
                   "--url).\nIn the chat, /help lists the commands.\n");
        return rc > 0 ? 0 : 2;
    }
    if (url && (model || n_extra)) {
        fprintf(stderr, "darkserve chat: --url talks to a running server: --model and server "
                        "options after -- are for the server chat starts itself\n");
        return 2;
    }
    if (session && !url) {
        fprintf(stderr, "darkserve chat: --session needs --url (a server chat starts has no "
                        "sessions yet)\n");
        return 2;
    }
    if (session && system) {
        fprintf(stderr, "darkserve chat: --session and --system cannot go together\n");
        return 2;
    }

    chat_t *c = calloc(1, sizeof *c);
    if (!c)
        return 1;
    c->api_key = key ? key : getenv("DARKSERVE_API_KEY");
    if (c->api_key && !*c->api_key)
        c->api_key = NULL;
    c->timeout_ms = (int)timeout_s * 1000;
    c->max_tokens = max_tokens;
    c->temperature = temperature;
    if (options) {
        json_error_t jerr;
        c->options = json_loads(options, 0, &jerr);
        if (!json_is_object(c->options)) {
            fprintf(stderr, "darkserve chat: --options must be a JSON object%s%s\n",
                    c->options ? "" : ": ", c->options ? "" : jerr.text);
            json_decref(c->options);
            free(c);
            return 2;
        }
    }
    install_signals();
    rc = 1;
    if (url) {
        char err[256];
        if (srv_hc_url_parse(url, &c->url, err, sizeof err) < 0) {
            fprintf(stderr, "darkserve chat: --url %s\n", err);
            rc = 2;
            goto out;
        }
        snprintf(c->url_text, sizeof c->url_text, "%s", url);
        if (server_check(c, (int)start_timeout_s) != 0)
            goto out;
    } else if (server_start(c, model, extra, n_extra, (int)start_timeout_s) != 0) {
        goto out;
    }

    json_t *j = NULL;
    if (session) {
        j = strlen(session) == 32 && strspn(session, "0123456789abcdef") == 32
                ? session_info(c, session)
                : NULL;
        if (!j)
            fprintf(stderr, "darkserve chat: no session '%s' on %s\n", session, c->url_text);
    } else {
        json_t *body = system ? json_pack("{s:s}", "system", system) : NULL;
        if (system && !body)
            fprintf(stderr, "darkserve chat: --system is not valid UTF-8\n");
        else
            j = create_session(c, body);
        json_decref(body);
    }
    if (!j || take_session(c, j) != 0) {
        json_decref(j);
        goto out;
    }
    printf("darkserve chat: session %s on %s, %" PRId64 " tokens. /help lists the commands, "
           "Ctrl-D quits.\n",
           c->sid, c->url_text, jint(j, "tokens"));
    json_decref(j);
    rc = repl(c);
    if (url && rc == 0)
        fprintf(stderr, "the session stays on the server: darkserve chat --url %s --session %s\n",
                c->url_text, c->sid);
out:
    server_stop(c);
    json_decref(c->options);
    free(c);
    return rc;
}
