/* tests/fuzz/fuzz_http.c — libFuzzer target: the HTTP request path of the
 * real application (srv_darkserve_app: every route of server/api_*.c behind
 * the checks of server/http/http.c), with no socket. Requests go in through
 * srv_http_inject (server/http/http.h), which runs what a connection's request
 * runs: request id, drain/auth/route/method/media-type/size checks, the
 * handler, deferred and streamed answers, the access line.
 *
 * The server is started once: the tiny fixture model ($DARKSERVE_TINY_MODEL,
 * or build/fixtures/tiny.gguf) with DARKFormer v2 attention as the default
 * configuration runs it (an adapter written at startup: identity M, 16
 * features, window 4, 2 sinks, features before RoPE, decays, mixing weights
 * and a rank-2 LoRA), a session directory
 * in a fresh temp directory, two API keys ("fuzz-user", and "fuzz-admin"
 * marked admin), and small limits so that one input costs milliseconds
 * (max_tokens at most 8, 4 sessions in memory, 16 on disk).
 *
 * Input: up to four requests separated by a line "===". Each request is
 *     METHOD URL
 *     Name: value          (any number of header lines)
 *                          (empty line)
 *     body bytes
 * Content-Length comes from the body, unless the request has Content-Length
 * or Transfer-Encoding lines of its own: then those are sent as given and
 * the body is delivered whole, so the request hook's framing rules judge
 * them (a Content-Length other than the body's, two that differ, one with
 * Transfer-Encoding: 400; a coding other than chunked: 501). Header names
 * need not be tokens (whitespace before the colon reaches the hook as a
 * connection's would). "$SID" anywhere in the URL or body stands for the id
 * of the last session this input created, so sequences of session
 * operations can be reached.
 *
 * Invariants checked on every answer: the request ends (within a bound), is
 * answered with a status in 100..599, never cut, never 500 (an internal
 * error is a bug the client can provoke); a JSON answer parses (generated
 * text may hold NUL, written \u0000: valid JSON), an error answer is a JSON
 * object with an "error" member. FUZZ_HTTP_VERBOSE=1 in the
 * environment prints every request's status and the start of its answer.
 */
#include "core/attn/features.h"
#include "server/api/api.h"
#include "server/config.h"
#include "server/http/http.h"
#include "server/http/http_test.h"
#include "server/base/log.h"
#include "server/base/metrics.h"
#include "server/daemon.h"
#include "tests/fuzz/fuzz_common.h"

#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#define FH_MAX_REQS 4
#define FH_MAX_HEADERS 32
#define FH_LINE_MAX 4096
#define FH_WAIT_NS (UINT64_C(20) * 1000000000u)

typedef struct fh_server {
    char dir[64];
    srv_config_t cfg;
    uv_loop_t loop;
    srv_metrics_t *metrics;
    srv_http_t *http;
    void *app;
    int closed;
} fh_server_t;

static fh_server_t *fh_srv;

/* Runs the loop until r is done; aborts past FH_WAIT_NS (a hang). */
static void fh_wait(srv_http_result_t *r)
{
    uint64_t t0 = uv_hrtime();
    while (!r->done) {
        uv_run(&fh_srv->loop, UV_RUN_ONCE);
        if (uv_hrtime() - t0 > FH_WAIT_NS) {
            fprintf(stderr, "fuzz_http: a request did not end within %llu s\n",
                    (unsigned long long)(FH_WAIT_NS / 1000000000u));
            abort();
        }
    }
}

/* A DARKFormer v2 adapter for the tiny model at path (fh_start's
 * configuration: every part of the default's attention, small). */
static void fh_write_adapter(const char *path)
{
    core_model_t *m = fuzz_load_tiny(CORE_ATTN_PERFORMER, 4, NULL);
    const core_model_info_t *in = core_model_info(m);
    const int L = in->n_layer, Hkv = in->n_head_kv, H = in->n_head, hd = in->head_dim, r = 2;
    const int64_t D = in->n_embd, qd = (int64_t)H * hd, kvd = (int64_t)Hkv * hd;
    const int64_t size[8] = {r * D, qd * r, r * D, kvd * r, r * D, kvd * r, r * qd, D * r};
    float *mat = calloc((size_t)L * Hkv * hd * hd, sizeof *mat);
    float *decay = malloc((size_t)L * Hkv * sizeof *decay), *mix = malloc((size_t)L * H * sizeof *mix);
    float *lora[8];
    FUZZ_REQUIRE(mat && decay && mix);
    for (int i = 0; i < L * Hkv; i++) {
        decay[i] = 0.99f;
        for (int d = 0; d < hd; d++)
            mat[((size_t)i * hd + d) * hd + d] = 1.0f;
    }
    for (int i = 0; i < L * H; i++)
        mix[i] = -1.0f;
    for (int p = 0; p < 8; p++) {
        lora[p] = malloc((size_t)L * (size_t)size[p] * sizeof(float));
        FUZZ_REQUIRE(lora[p] != NULL);
        for (int64_t i = 0; i < L * size[p]; i++)
            lora[p][i] = (float)((i * 7919 + p * 104729) % 201 - 100) * 1e-3f;
    }
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = L, .n_head = H,
                                      .n_head_kv = Hkv, .head_dim = hd, .n_features = 16,
                                      .window = 4, .sinks = 2, .prerope = 1, .seed = 7,
                                      .base_fingerprint = in->fingerprint, .mat = mat,
                                      .decay = decay, .mix = mix, .lora_rank = r,
                                      .n_embd = (int)D};
    memcpy(d.lora, lora, sizeof d.lora);
    core_error_t err = {0};
    if (core_features_adapter_write(&d, path, &err) < 0) {
        fprintf(stderr, "fuzz_http setup: adapter: %s\n", err.msg);
        abort();
    }
    for (int p = 0; p < 8; p++)
        free(lora[p]);
    free(mat);
    free(decay);
    free(mix);
    core_model_free(m);
}

static void fh_start(void)
{
    fh_server_t *S = calloc(1, sizeof *S);
    FUZZ_REQUIRE(S != NULL);
    snprintf(S->dir, sizeof S->dir, "/tmp/darkserve-fuzz-http-XXXXXX");
    FUZZ_REQUIRE(mkdtemp(S->dir) != NULL);
    char keys[128], sessions[128], adapter[128];
    snprintf(keys, sizeof keys, "%s/keys", S->dir);
    snprintf(sessions, sizeof sessions, "%s/sessions", S->dir);
    snprintf(adapter, sizeof adapter, "%s/tiny.darkformer.gguf", S->dir);
    fh_write_adapter(adapter);
    FILE *f = fopen(keys, "w");
    FUZZ_REQUIRE(f != NULL);
    fputs("fuzz-user\nfuzz-admin admin\n", f);
    fclose(f);
    char *argv[] = {"--model",
                    (char *)fuzz_tiny_path(),
                    "--attn",
                    "darkformer",
                    "--adapter",
                    adapter,
                    "--threads",
                    "1",
                    "--session-dir",
                    sessions,
                    "--api-key-file",
                    keys,
                    "--max-tokens-limit",
                    "8",
                    "--max-sessions",
                    "4",
                    "--max-session-files",
                    "16",
                    "--max-batch",
                    "4",
                    "--generation-timeout",
                    "10",
                    "--log-level",
                    "error"};
    char err[512];
    if (srv_config_parse(&S->cfg, (int)(sizeof argv / sizeof argv[0]), argv, (char *const[]){NULL},
                         err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_http setup: %s\n", err);
        abort();
    }
    FUZZ_REQUIRE(srv_log_init(SRV_LOG_ERROR, SRV_LOG_FORMAT_TEXT, "", err, sizeof err) == 0);
    FUZZ_REQUIRE(uv_loop_init(&S->loop) == 0);
    S->metrics = srv_metrics_new();
    FUZZ_REQUIRE(S->metrics != NULL);
    srv_http_opts_t o = {.no_listen = 1,
                         .max_body = (size_t)S->cfg.max_body,
                         .api_keys = (const char *const *)S->cfg.api_keys.v,
                         .api_key_admin = S->cfg.api_key_admin,
                         .n_api_keys = S->cfg.api_keys.n,
                         .cors_origins = (const char *const[]){"https://example.org"},
                         .n_cors_origins = 1,
                         .metrics = S->metrics};
    S->http = srv_http_new(&S->loop, &o, err, sizeof err);
    if (!S->http) {
        fprintf(stderr, "fuzz_http setup: %s\n", err);
        abort();
    }
    srv_serve_ctx_t ctx = {&S->cfg, &S->loop, S->http, S->metrics, NULL};
    FUZZ_REQUIRE(srv_darkserve_app.start(&ctx, &S->app) == 0);
    fh_srv = S;
    /* the model loads on the threadpool: ready once /health says 200 */
    uint64_t t0 = uv_hrtime();
    for (;;) {
        srv_http_result_t r;
        FUZZ_REQUIRE(srv_http_inject(S->http,
                                     &(srv_http_inject_t){.method = "GET", .url = "/health"},
                                     &r) == 0);
        fh_wait(&r);
        int st = r.status;
        srv_http_result_free(&r);
        if (st == 200)
            break;
        FUZZ_REQUIRE(st == 503 && uv_hrtime() - t0 < FH_WAIT_NS);
        uv_run(&S->loop, UV_RUN_NOWAIT);
    }
}

static int fh_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Stops the application and the server, checks that the loop closes with
 * no handle left, removes the temp directory (the corpus replay calls it;
 * libFuzzer never returns). */
__attribute__((unused)) static int fuzz_http_shutdown(void)
{
    fh_server_t *S = fh_srv;
    if (!S)
        return 0;
    srv_darkserve_app.stop(S->app);
    srv_http_close(S->http, NULL, NULL);
    uv_run(&S->loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&S->loop);
    srv_metrics_free(S->metrics);
    srv_config_free(&S->cfg);
    nftw(S->dir, fh_rm, 16, FTW_DEPTH | FTW_PHYS);
    srv_log_shutdown();
    free(S);
    fh_srv = NULL;
    return rc;
}

static int fh_token(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              strchr("!#$%&'*+-.^_`|~", *s)))
            return 0;
    return 1;
}

/* src[0..n) with "$SID" replaced by sid, NUL-terminated (new malloc'd). */
static char *fh_subst(const char *src, size_t n, const char *sid, size_t *out_len)
{
    size_t sl = strlen(sid), cap = n + 1, o = 0;
    for (size_t i = 0; i + 4 <= n; i++)
        if (memcmp(src + i, "$SID", 4) == 0)
            cap += sl;
    char *out = malloc(cap);
    FUZZ_REQUIRE(out != NULL);
    for (size_t i = 0; i < n;) {
        if (i + 4 <= n && memcmp(src + i, "$SID", 4) == 0) {
            memcpy(out + o, sid, sl);
            o += sl;
            i += 4;
        } else {
            out[o++] = src[i++];
        }
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

static void fh_check(const char *method, const char *url, const srv_http_result_t *r)
{
    if (r->cut || r->status < 100 || r->status > 599 || r->status == 500) {
        fprintf(stderr, "fuzz_http: %s %s -> status %d%s: %.*s\n", method, url, r->status,
                r->cut ? " (cut)" : "", (int)(r->body_len < 2000 ? r->body_len : 2000),
                r->body ? r->body : "");
        abort();
    }
    const int json = r->content_type && strncasecmp(r->content_type, "application/json", 16) == 0;
    if (!json || strcasecmp(method, "HEAD") == 0)
        return;
    json_error_t je;
    json_t *j = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &je);
    if (!j || (r->status >= 400 && (!json_is_object(j) || !json_object_get(j, "error")))) {
        fprintf(stderr, "fuzz_http: %s %s -> %d with a bad JSON body: %.*s\n", method, url,
                r->status, (int)(r->body_len < 2000 ? r->body_len : 2000), r->body ? r->body : "");
        abort();
    }
    json_decref(j);
}

/* Remembers the id of a session a create answered with. */
static void fh_note_session(const char *method, const char *url, const srv_http_result_t *r,
                            char sid[SRV_SESSION_ID_LEN + 1])
{
    if (r->status != 201 || strcmp(method, "POST") != 0 || strcmp(url, "/v1/sessions") != 0 ||
        !r->body)
        return;
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    const char *id = json_string_value(json_object_get(j, "id"));
    if (id && srv_session_id_valid(id))
        snprintf(sid, SRV_SESSION_ID_LEN + 1, "%s", id);
    json_decref(j);
}

/* Runs one request of the input: data[0..n). */
static void fh_one(const char *data, size_t n, char sid[SRV_SESSION_ID_LEN + 1])
{
    const char *end = data + n, *p = data;
    const char *nl = memchr(p, '\n', n);
    const char *le = nl ? nl : end;
    char line[FH_LINE_MAX];
    size_t ll = (size_t)(le - p) < sizeof line - 1 ? (size_t)(le - p) : sizeof line - 1;
    memcpy(line, p, ll);
    line[ll] = '\0';
    if (ll && line[ll - 1] == '\r')
        line[--ll] = '\0';
    p = nl ? nl + 1 : end;
    char *sp = strchr(line, ' ');
    if (!sp)
        return;
    *sp = '\0';
    const char *method = line;
    if (!fh_token(method) || strlen(sp + 1) != ll - (size_t)(sp + 1 - line))
        return; /* NUL in the request line: MHD refuses it before us */
    char *url = fh_subst(sp + 1, strlen(sp + 1), sid, NULL);
    char hbuf[FH_MAX_HEADERS][2][512];
    const char *hv[2 * (FH_MAX_HEADERS + 1)];
    size_t nh = 0;
    int framed = 0; /* the input frames its body itself */
    while (p < end) {
        nl = memchr(p, '\n', (size_t)(end - p));
        le = nl ? nl : end;
        size_t hl = (size_t)(le - p);
        const char *hp = p;
        p = nl ? nl + 1 : end;
        if (hl && hp[hl - 1] == '\r')
            hl--;
        if (hl == 0)
            break; /* the body follows */
        const char *colon = memchr(hp, ':', hl);
        if (!colon || nh == FH_MAX_HEADERS || memchr(hp, '\0', hl))
            continue;
        size_t nlen = (size_t)(colon - hp);
        const char *v = colon + 1;
        while (v < hp + hl && (*v == ' ' || *v == '\t'))
            v++;
        size_t vlen = (size_t)(hp + hl - v);
        if (nlen == 0 || nlen >= sizeof hbuf[0][0] || vlen >= sizeof hbuf[0][1])
            continue;
        memcpy(hbuf[nh][0], hp, nlen);
        hbuf[nh][0][nlen] = '\0';
        memcpy(hbuf[nh][1], v, vlen);
        hbuf[nh][1][vlen] = '\0';
        if (strcasecmp(hbuf[nh][0], "Content-Length") == 0 ||
            strcasecmp(hbuf[nh][0], "Transfer-Encoding") == 0)
            framed = 1;
        hv[2 * nh] = hbuf[nh][0];
        hv[2 * nh + 1] = hbuf[nh][1];
        nh++;
    }
    size_t blen = 0;
    char *body = fh_subst(p, (size_t)(end - p), sid, &blen);
    char clen[32];
    if (blen && !framed) {
        snprintf(clen, sizeof clen, "%zu", blen);
        hv[2 * nh] = "Content-Length";
        hv[2 * nh + 1] = clen;
        nh++;
    }
    srv_http_inject_t in = {.method = method,
                            .url = url,
                            .headers = hv,
                            .n_headers = nh,
                            .body = blen ? body : NULL,
                            .body_len = blen};
    srv_http_result_t r;
    if (srv_http_inject(fh_srv->http, &in, &r) == 0) {
        fh_wait(&r);
        if (getenv("FUZZ_HTTP_VERBOSE")) /* what each request got, for writing seeds */
            fprintf(stderr, "%s %s -> %d %.*s\n", method, url, r.status,
                    (int)(r.body_len < 160 ? r.body_len : 160), r.body ? r.body : "");
        fh_check(method, url, &r);
        fh_note_session(method, url, &r, sid);
        srv_http_result_free(&r);
    }
    free(url);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fh_srv)
        fh_start();
    char sid[SRV_SESSION_ID_LEN + 1];
    memset(sid, '0', SRV_SESSION_ID_LEN);
    sid[SRV_SESSION_ID_LEN] = '\0';
    const char *p = (const char *)data, *end = p + size;
    for (int i = 0; i < FH_MAX_REQS && p < end; i++) {
        const char *sep = NULL;
        for (const char *q = p; q + 5 <= end; q++)
            if (memcmp(q, "\n===\n", 5) == 0) {
                sep = q;
                break;
            }
        const char *re = sep ? sep + 1 : end;
        fh_one(p, (size_t)(re - p), sid);
        p = sep ? sep + 5 : end;
    }
    return 0;
}
