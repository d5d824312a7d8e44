/* server/config.c — the option table and everything it drives (see config.h).
 *
 * Defaults are written as text and go through the same parser as flags and
 * environment variables, so a default that violates its own bounds is caught
 * by the unit test that parses an empty command line.
 */
#include "server/config.h"

#include "core/attn/attn.h"
#include "server/attn_select.h"
#include "server/engine/engine.h"
#include "server/base/log.h"
#include "server/store/store.h"
#include "server/store/store_backend.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

_Static_assert(SRV_CFG_ATTN_EXACT == (int)CORE_ATTN_EXACT, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_PERFORMER == (int)CORE_ATTN_PERFORMER, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_DARKFORMER == (int)CORE_ATTN_DARKFORMER, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_DARKFORMER_IS == (int)CORE_ATTN_DARKFORMER_IS, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_FLEXFORMER_S == (int)CORE_ATTN_FLEXFORMER_S, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_FLEXFORMER_N == (int)CORE_ATTN_FLEXFORMER_N, "attn enum drift");
_Static_assert(SRV_CFG_ATTN_AUTO == SRV_ATTN_AUTO, "attn enum drift");
_Static_assert(SRV_CFG_LOG_DEBUG == (int)SRV_LOG_DEBUG, "log level enum drift");
_Static_assert(SRV_CFG_LOG_JSON == (int)SRV_LOG_FORMAT_JSON, "log format enum drift");

typedef enum opt_type {
    OPT_STR,      /* char * */
    OPT_INT,      /* int64_t */
    OPT_SIZE,     /* int64_t bytes */
    OPT_DURATION, /* int64_t seconds */
    OPT_ENUM,     /* int index into choices */
    OPT_LIST      /* srv_strlist_t */
} opt_type_t;

enum {
    OPT_SECRET = 1u,   /* masked by --print-config */
    OPT_NONEMPTY = 2u, /* "" is an error */
    OPT_ORIGINS = 4u,  /* each list item must be a CORS origin */
    OPT_URL = 8u       /* a URL whose password --print-config masks */
};

typedef struct opt {
    const char *name; /* flag without "--" */
    const char *env;  /* environment variable */
    opt_type_t type;
    unsigned flags;
    size_t off;       /* field in srv_config_t */
    const char *def;  /* default, as text */
    int64_t min, max; /* INT, SIZE, DURATION */
    const char *const *choices; /* ENUM, NULL-terminated */
    const char *metavar;
    const char *help;
} opt_t;

static const char *const onoff_choices[] = {"off", "on", NULL};
static const char *const attn_choices[] = {"exact",        "performer",    "darkformer",
                                           "darkformer-is", "flexformer-s", "flexformer-n",
                                           "auto",         NULL};
static const char *const precision_choices[] = {"f32", "int8", "auto", NULL};
static const char *const level_choices[] = {"error", "warn", "info", "debug", NULL};
static const char *const format_choices[] = {"text", "json", NULL};

int srv_cfg_precision_parse(const char *s)
{
    for (int i = 0; s && precision_choices[i]; i++)
        if (!strcmp(s, precision_choices[i]))
            return i;
    return -1;
}

#define KIB ((int64_t)1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)
#define DAY ((int64_t)86400)

#define O(field) offsetof(srv_config_t, field)

/* clang-format off */
static const opt_t opts[] = {
    {"host", "DARKSERVE_HOST", OPT_STR, OPT_NONEMPTY, O(host), "127.0.0.1", 0, 0, NULL, "ADDR",
     "address to listen on (IPv4, IPv6 or host name); 0.0.0.0 for all interfaces"},
    {"port", "DARKSERVE_PORT", OPT_INT, 0, O(port), "8080", 0, 65535, NULL, "N",
     "TCP port to listen on; 0 picks a free port"},
    {"max-connections", "DARKSERVE_MAX_CONNECTIONS", OPT_INT, 0, O(max_connections), "256",
     1, 100000, NULL, "N",
     "open client connections at most (idle, streaming and waiting ones)"},
    {"max-connections-per-address", "DARKSERVE_MAX_CONNECTIONS_PER_ADDRESS", OPT_INT, 0,
     O(max_conns_per_address), "64", 0, 100000, NULL, "N",
     "open connections of one client address at most; its further connections are closed at "
     "once, so one client cannot take every --max-connections slot. Behind a reverse proxy "
     "every client has the proxy's address: raise it to --max-connections or set 0 (no limit)"},
    {"max-body", "DARKSERVE_MAX_BODY", OPT_SIZE, 0, O(max_body), "1M", 1, GIB, NULL, "SIZE",
     "largest request body accepted; larger ones get 413"},
    {"max-uploads", "DARKSERVE_MAX_UPLOADS", OPT_INT, 0, O(max_uploads), "2", 1, 1024, NULL, "N",
     "request bodies over 1 MiB (state imports) received at once, each spooled to a file in "
     "--upload-dir as it arrives; more get 429 with Retry-After"},
    {"upload-dir", "DARKSERVE_UPLOAD_DIR", OPT_STR, 0, O(upload_dir), "", 0, 0, NULL, "DIR",
     "where bodies over 1 MiB are spooled while they arrive (unnamed temporary files, checked "
     "at startup); \"\" = $TMPDIR, else /tmp"},
    {"request-timeout", "DARKSERVE_REQUEST_TIMEOUT", OPT_DURATION, 0, O(request_timeout_s), "60s",
     0, DAY, NULL, "DURATION",
     "time a client has to send a whole request (headers and body), counted from the "
     "connection's start or the end of its previous response; 0 = no limit"},
    {"header-timeout", "DARKSERVE_HEADER_TIMEOUT", OPT_DURATION, 0, O(header_timeout_s), "10s",
     0, DAY, NULL, "DURATION",
     "time a new connection has to send the headers of its first request (later requests on "
     "a kept-alive connection: --request-timeout); 0 = no limit"},
    {"idle-timeout", "DARKSERVE_IDLE_TIMEOUT", OPT_DURATION, 0, O(idle_timeout_s), "30s",
     0, DAY, NULL, "DURATION",
     "close a connection with no I/O for this long (a stalled client, an idle keep-alive); 0 = "
     "never"},
    {"drain-timeout", "DARKSERVE_DRAIN_TIMEOUT", OPT_DURATION, 0, O(drain_timeout_s), "30s",
     0, DAY, NULL, "DURATION",
     "on SIGTERM/SIGINT, how long open requests may finish before they are cut"},
    {"api-key", "DARKSERVE_API_KEY", OPT_STR, OPT_SECRET, O(api_key), "", 0, 0, NULL, "KEY",
     "require this key (Authorization: Bearer KEY or X-Api-Key: KEY) on every route but "
     "/health; prefer --api-key-file or the environment, argv is visible to other users"},
    {"api-key-file", "DARKSERVE_API_KEY_FILE", OPT_STR, 0, O(api_key_file), "", 0, 0, NULL, "PATH",
     "file with accepted API keys, one per line ('#' comments); combines with --api-key. Each "
     "session belongs to the key that created it and is invisible to other keys; a line "
     "'KEY admin' marks an admin key, which sees every session"},
    {"cors-origin", "DARKSERVE_CORS_ORIGIN", OPT_LIST, OPT_ORIGINS, O(cors_origins), "",
     0, 0, NULL, "ORIGIN",
     "browser origin allowed by CORS (scheme://host[:port], or * for any); repeat the flag or "
     "separate with commas; none by default"},
    {"model", "DARKSERVE_MODEL", OPT_LIST, OPT_NONEMPTY, O(models),
     SRV_DEFAULT_MODEL, 0, 0, NULL, "PATH",
     "model GGUF file (Llama or Gemma 3 architecture), or a known model's short name "
     "(smollm2-135m, gemma3-270m: its file in models/); repeat the flag or separate with commas "
     "to serve several models: requests pick one by their \"model\" field, the first is the "
     "default"},
    {"models-dir", "DARKSERVE_MODELS_DIR", OPT_STR, 0, O(models_dir), "", 0, 0, NULL, "DIR",
     "serve every *.gguf file in DIR (in name order), after the --model ones when --model is "
     "given (else instead of the default model); empty = none"},
    {"adapter", "DARKSERVE_ADAPTER", OPT_STR, 0, O(adapter), "", 0, 0, NULL, "PATH",
     "DARKFormer adapter GGUF (learned covariances, features, window); empty = none"},
    {"attn", "DARKSERVE_ATTN", OPT_ENUM, 0, O(attn), "auto", 0, 0, attn_choices, "KIND",
     "attention: exact softmax (KV cache, bounded context), performer, darkformer, "
     "darkformer-is, flexformer-s or flexformer-n (constant-size state); auto = darkformer with --adapter or the model's "
     "adapter found beside it (<model dir>/adapters/<name>.darkformer.gguf, then "
     "<model without .gguf>.darkformer.gguf), else performer with sinks + window only "
     "(training-free, window " SRV_STR(SRV_ATTN_FALLBACK_WINDOW) " unless --window), with "
     "a warning"},
    {"features", "DARKSERVE_FEATURES", OPT_INT, 0, O(features), "0", 0,
     CORE_FEATURES_MAX_FEATURES, NULL, "M",
     "random features per KV head; 0 = the adapter's value or the built-in default"},
    {"window", "DARKSERVE_WINDOW", OPT_INT, 0, O(window), "-1", -1, CORE_FEATURES_MAX_WINDOW,
     NULL, "W",
     "exact-attention window of the hybrid (tokens); 0 = pure linear, -1 = the adapter's value "
     "or the built-in default (" SRV_STR(CORE_FEATURES_DEFAULT_WINDOW) "; "
     SRV_STR(SRV_ATTN_FALLBACK_WINDOW) " for the auto fallback)"},
    {"sinks", "DARKSERVE_SINKS", OPT_INT, 0, O(sinks), "-1", -1, CORE_FEATURES_MAX_SINKS, NULL,
     "S",
     "first tokens of a session kept and attended exactly forever (linear kinds); -1 = the "
     "adapter's value or the built-in default"},
    {"memory", "DARKSERVE_MEMORY", OPT_INT, 0, O(memory), "-1", -1, CORE_ATTN_MAX_MEMORY, NULL,
     "N",
     "exact memory rows per KV head kept beside the linear state, chosen by how badly the "
     "state would recall them (linear kinds with positive features; part of every session's "
     "state); 0 = off, -1 = the adapter's value or the built-in default ("
     SRV_STR(CORE_FEATURES_DEFAULT_MEMORY) ")"},
    {"memory-keep", "DARKSERVE_MEMORY_KEEP", OPT_STR, 0, O(memory_keep), "", 0, 0, NULL,
     "recall|recent",
     "which rows the exact memory keeps: recall = those the linear state would give back worst, "
     "recent = the newest (the window of the heads with a memory, longer by N rows); \"\" = "
     "the adapter's value or recall"},
    {"memory-heads", "DARKSERVE_MEMORY_HEADS", OPT_STR, 0, O(memory_heads), "", 0, 0, NULL,
     "all|L.H,...",
     "which KV heads have the exact memory: all, or a comma-separated list of layer.head pairs "
     "(the others keep only the window, sinks and linear state); \"\" = the adapter's value "
     "or all"},
    {"kv-bits", "DARKSERVE_KV_BITS", OPT_INT, 0, O(kv_bits), "-1", -1, 16, NULL, "8|16",
     "bits of each element of the exact rows of the linear kinds (window, sinks, memory): 16 "
     "halves, 8 bytes with a scale per row (about half a session's bytes); -1 = the adapter's "
     "value or the built-in default (" SRV_STR(CORE_FEATURES_DEFAULT_KV_BITS) ")"},
    {"decay", "DARKSERVE_DECAY", OPT_ENUM, 0, O(decay), "on", 0, 0, onoff_choices, "on|off",
     "the adapter's learned decay of the linear state; off = v1 behaviour (no decay)"},
    {"prompt-precision", "DARKSERVE_PROMPT_PRECISION", OPT_ENUM, 0, O(prompt_precision), "auto",
     0, 0, precision_choices, "auto|f32|int8",
     "activations of prompt tokens in the weight products: auto (the default) multiplies on "
     "Intel AMX-BF16 tiles where the CPU has them (each value split into two bf16 parts, "
     "within 2^-16 of f32, ~1.4x the prefill speed) and in f32 elsewhere; f32 always against "
     "dequantized weights in f32; "
     "int8: quantized to 8 bits per block of 32 as generated tokens always are, where every "
     "weight matrix has the packed kernel (Q4_0, Q4_1, Q8_0 on AVX2 or AVX-512 VNNI; elsewhere "
     "f32). "
     "int8 prefills ~1.7x faster, at ~0.4% higher perplexity, and a prompt served from the "
     "prefix cache or a session's turns may then get another greedy reply than the same "
     "prompt sent whole"},
    {"chat-template", "DARKSERVE_CHAT_TEMPLATE", OPT_STR, 0, O(chat_template), "",
     0, 0, NULL, "NAME",
     "chat template for /v1/chat/completions; empty = the model's own"},
    {"threads", "DARKSERVE_THREADS", OPT_INT, 0, O(threads), "0", 0, 1024, NULL, "N",
     "compute threads; 0 = one per CPU"},
    {"max-batch", "DARKSERVE_MAX_BATCH", OPT_INT, 0, O(max_batch), "16", 1,
     SRV_ENGINE_MAX_BATCH, NULL, "N",
     "sequences advanced together in one scheduler step"},
    {"prefill-chunk", "DARKSERVE_PREFILL_CHUNK", OPT_INT, 0, O(prefill_chunk), "256",
     1, SRV_ENGINE_DEFAULT_STEP_TOKENS, NULL, "N",
     "prompt tokens of one sequence processed per step (at most the rows of one batched "
     "forward)"},
    {"max-queue", "DARKSERVE_MAX_QUEUE", OPT_INT, 0, O(max_queue), "64", 1, 1000000, NULL, "N",
     "jobs waiting for the scheduler before new ones get 429"},
    {"generation-timeout", "DARKSERVE_GENERATION_TIMEOUT", OPT_DURATION, 0,
     O(generation_timeout_s), "10m", 0, DAY, NULL, "DURATION",
     "longest time one generation request may run, from its arrival to its last token; a "
     "request that runs out ends with finish_reason \"timeout\"; 0 = no limit"},
    {"max-tokens-limit", "DARKSERVE_MAX_TOKENS_LIMIT", OPT_INT, 0, O(max_tokens_limit), "4096",
     1, INT64_C(1) << 31, NULL, "N",
     "largest max_tokens a request may ask for"},
    {"max-prompt-tokens", "DARKSERVE_MAX_PROMPT_TOKENS", OPT_INT, 0, O(max_prompt_tokens),
     "131072", 1, INT64_C(1) << 24, NULL, "N",
     "most tokens one request may give the model to read: its prompts together, or a "
     "session's pending tokens and new text, or a prefix (about two minutes of prefill on one "
     "core at the default); more is 400 context_length_exceeded before any work. Longer text "
     "goes into a session in several appends"},
    {"max-sessions", "DARKSERVE_MAX_SESSIONS", OPT_INT, 0, O(max_sessions), "1024",
     1, 10000000, NULL, "N",
     "sessions kept in memory (least recently used spill to --session-dir); with several "
     "--model, split evenly between them"},
    {"max-session-bytes", "DARKSERVE_MAX_SESSION_BYTES", OPT_SIZE, 0, O(max_session_bytes), "1G",
     MIB, TIB, NULL, "SIZE",
     "memory for session states (least recently used spill); with several --model, split "
     "evenly between them"},
    {"max-state-memory", "DARKSERVE_MAX_STATE_MEMORY", OPT_SIZE, 0, O(max_state_memory), "4G",
     0, 1024 * TIB, NULL, "SIZE",
     "memory for all attention states: sessions in memory and the states requests in flight "
     "may grow to (n copies for n choices); a request that would not fit gets 429 (400 if it "
     "could never fit); idle sessions are moved to --session-dir to make room; with several "
     "--model, one pool for all of them; 0 = no limit"},
    {"max-session-disk", "DARKSERVE_MAX_SESSION_DISK", OPT_SIZE, 0, O(max_session_disk), "10G",
     0, 1024 * TIB, NULL, "SIZE",
     "bytes of session files kept in --session-dir; past it the least recently used idle "
     "sessions are deleted (file and memory); with several --model, split evenly between "
     "them; 0 = no limit"},
    {"max-session-files", "DARKSERVE_MAX_SESSION_FILES", OPT_INT, 0, O(max_session_files),
     "100000", 0, 100000000, NULL, "N",
     "session files kept in --session-dir; past it the least recently used idle sessions are "
     "deleted (file and memory); with several --model, split evenly between them; 0 = no "
     "limit"},
    {"session-dir", "DARKSERVE_SESSION_DIR", OPT_STR, OPT_NONEMPTY, O(session_dir), "./sessions",
     0, 0, NULL, "PATH",
     "directory where session states are persisted (with several --model, each model's in "
     "PATH/<model name>)"},
    {"session-store", "DARKSERVE_SESSION_STORE", OPT_STR, OPT_URL, O(session_store), "",
     0, 0, NULL, "URL",
     "where sessions are kept: empty = --session-dir (this process only); "
     "redis://[[user]:password@]host[:port][/db] = a Redis server shared by replicas, so any "
     "replica continues any session (--session-dir and --checkpoints are then unused: no "
     "rollback or regenerate; while Redis cannot be reached, session requests get 503 and "
     "/health says degraded)"},
    {"session-ttl", "DARKSERVE_SESSION_TTL", OPT_DURATION, 0, O(session_ttl_s), "24h",
     0, 3650 * DAY, NULL, "DURATION",
     "sessions unused for this long are deleted; 0 = never"},
    {"checkpoints", "DARKSERVE_CHECKPOINTS", OPT_INT, 0, O(checkpoints), "8",
     0, SRV_STORE_MAX_CHECKPOINTS, NULL, "K",
     "states kept per session at its last K turn boundaries, for rollback and regenerate "
     "(each a file of one state's size in --session-dir, counted in --max-session-disk, "
     "whose budget deletes checkpoints before sessions); 0 = none"},
    {"prefix-cache-mb", "DARKSERVE_PREFIX_CACHE_MB", OPT_INT, 0, O(prefix_cache_mb), "64",
     0, INT64_C(1024) * 1024, NULL, "MIB",
     "memory for the prefix-state cache: the attention state after shared prompt prefixes "
     "(system prompts, documents), so a request starting with one prefills only the rest; "
     "least recently used entries are evicted, pinned ones (POST /v1/prefixes) never; with "
     "several --model, split evenly between them (a cache each); 0 = off"},
    {"ui", "DARKSERVE_UI", OPT_ENUM, 0, O(ui), "on", 0, 0, onoff_choices, "on|off",
     "serve the web page (chat, sessions) at / and /ui/; off (or --no-ui) = / is 404"},
    {"log-level", "DARKSERVE_LOG_LEVEL", OPT_ENUM, 0, O(log_level), "info",
     0, 0, level_choices, "LEVEL",
     "least severe level logged"},
    {"log-format", "DARKSERVE_LOG_FORMAT", OPT_ENUM, 0, O(log_format), "text",
     0, 0, format_choices, "FORMAT",
     "text lines or one JSON object per line"},
    {"log-file", "DARKSERVE_LOG_FILE", OPT_STR, 0, O(log_file), "", 0, 0, NULL, "PATH",
     "append log lines to this file (reopened on SIGHUP); empty = stderr"},
};
/* clang-format on */

#define N_OPTS (sizeof opts / sizeof opts[0])
_Static_assert(sizeof opts / sizeof opts[0] <= SRV_CFG_MAX_OPTS, "raise SRV_CFG_MAX_OPTS");

/* Longest api-key file accepted; keys are short, this only bounds a mistake. */
#define KEY_FILE_MAX ((size_t)64 * 1024)

/* Writes the message and evaluates to -1. A macro rather than a variadic
 * function: clang-analyzer misreads va_start in inlined variadic helpers. */
#define fail(err, errlen, ...) (snprintf((err), (errlen), __VA_ARGS__), -1)

static void *field(srv_config_t *cfg, const opt_t *o)
{
    return (char *)cfg + o->off;
}

static const void *cfield(const srv_config_t *cfg, const opt_t *o)
{
    return (const char *)cfg + o->off;
}

static void strlist_clear(srv_strlist_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int strlist_push(srv_strlist_t *l, const char *s, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, s, len);
    copy[len] = '\0';
    char **nv = realloc(l->v, (l->n + 1) * sizeof *nv);
    if (!nv) {
        free(copy);
        return -1;
    }
    nv[l->n++] = copy;
    l->v = nv;
    return 0;
}

/* Parses an unsigned decimal with an optional suffix from units[]; the
 * suffix match is case-insensitive. */
typedef struct unit {
    const char *suffix;
    int64_t mult;
} unit_t;

static int parse_scaled(const char *s, const unit_t *units, int64_t *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || v < 0)
        return -1;
    int64_t mult = 1;
    if (*end) {
        size_t k = 0;
        for (; units[k].suffix; k++)
            if (strcasecmp(end, units[k].suffix) == 0)
                break;
        if (!units[k].suffix)
            return -1;
        mult = units[k].mult;
    }
    if (v > INT64_MAX / mult)
        return -1;
    *out = (int64_t)v * mult;
    return 0;
}

/* Size and duration values of the table (SIZE, DURATION): 0 and *out, or -1
 * on a syntax error or overflow. */
static int srv_config_parse_size(const char *s, int64_t *out)
{
    static const unit_t units[] = {
        {"b", 1},      {"k", KIB},      {"kb", KIB}, {"kib", KIB}, {"m", MIB},
        {"mb", MIB},   {"mib", MIB},    {"g", GIB},  {"gb", GIB},  {"gib", GIB},
        {"t", TIB},    {"tb", TIB},     {"tib", TIB}, {NULL, 0},
    };
    return parse_scaled(s, units, out);
}

static int srv_config_parse_duration(const char *s, int64_t *out)
{
    static const unit_t units[] = {
        {"s", 1}, {"m", 60}, {"h", 3600}, {"d", DAY}, {NULL, 0},
    };
    return parse_scaled(s, units, out);
}

/* Is s "*" or "scheme://host[:port]" with nothing after the authority? */
static int valid_origin(const char *s)
{
    if (strcmp(s, "*") == 0)
        return 1;
    const char *p = strstr(s, "://");
    if (!p || p == s)
        return 0;
    for (const char *q = s; q < p; q++)
        if (!isalnum((unsigned char)*q) && *q != '+' && *q != '-' && *q != '.')
            return 0;
    p += 3;
    if (!*p)
        return 0;
    for (; *p; p++)
        if (*p == '/' || *p == '?' || *p == '#' || isspace((unsigned char)*p) ||
            (unsigned char)*p < 0x21)
            return 0;
    return 1;
}

static void format_size(int64_t v, char *buf, size_t n)
{
    if (v >= TIB && v % TIB == 0)
        snprintf(buf, n, "%lldT", (long long)(v / TIB));
    else if (v >= GIB && v % GIB == 0)
        snprintf(buf, n, "%lldG", (long long)(v / GIB));
    else if (v >= MIB && v % MIB == 0)
        snprintf(buf, n, "%lldM", (long long)(v / MIB));
    else if (v >= KIB && v % KIB == 0)
        snprintf(buf, n, "%lldK", (long long)(v / KIB));
    else
        snprintf(buf, n, "%lld", (long long)v);
}

static void format_duration(int64_t v, char *buf, size_t n)
{
    if (v >= DAY && v % DAY == 0)
        snprintf(buf, n, "%lldd", (long long)(v / DAY));
    else if (v >= 3600 && v % 3600 == 0)
        snprintf(buf, n, "%lldh", (long long)(v / 3600));
    else if (v >= 60 && v % 60 == 0)
        snprintf(buf, n, "%lldm", (long long)(v / 60));
    else
        snprintf(buf, n, "%llds", (long long)v);
}

static void format_bound(const opt_t *o, int64_t v, char *buf, size_t n)
{
    if (o->type == OPT_SIZE)
        format_size(v, buf, n);
    else if (o->type == OPT_DURATION)
        format_duration(v, buf, n);
    else
        snprintf(buf, n, "%lld", (long long)v);
}

static void choices_text(const opt_t *o, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t k = 0; o->choices[k]; k++) {
        int w = snprintf(buf + len, n - len, "%s%s", k ? "|" : "", o->choices[k]);
        if (w < 0 || (size_t)w >= n - len)
            break;
        len += (size_t)w;
    }
}

/* Sets one option from text. who is "--name" or "DARKSERVE_NAME" for the
 * message. append: for lists, add to the current list instead of replacing. */
static int set_value(srv_config_t *cfg, const opt_t *o, const char *val, const char *who,
                     int append, char *err, size_t errlen)
{
    char lo[32], hi[32];
    switch (o->type) {
    case OPT_STR: {
        if ((o->flags & OPT_NONEMPTY) && !*val)
            return fail(err, errlen, "%s must not be empty", who);
        char *copy = strdup(val);
        if (!copy)
            return fail(err, errlen, "out of memory");
        char **dst = field(cfg, o);
        free(*dst);
        *dst = copy;
        return 0;
    }
    case OPT_INT:
    case OPT_SIZE:
    case OPT_DURATION: {
        int64_t v = 0;
        int bad;
        const char *what;
        if (o->type == OPT_INT) {
            char *end = NULL;
            errno = 0;
            long long ll = strtoll(val, &end, 10);
            bad = errno || end == val || *end;
            v = ll;
            what = "an integer";
        } else if (o->type == OPT_SIZE) {
            bad = srv_config_parse_size(val, &v) != 0;
            what = "a size (bytes, or with a K/M/G/T suffix)";
        } else {
            bad = srv_config_parse_duration(val, &v) != 0;
            what = "a duration (seconds, or with an s/m/h/d suffix)";
        }
        format_bound(o, o->min, lo, sizeof lo);
        format_bound(o, o->max, hi, sizeof hi);
        if (bad)
            return fail(err, errlen, "%s expects %s in [%s, %s], got '%s'", who, what, lo, hi,
                        val);
        if (v < o->min || v > o->max)
            return fail(err, errlen, "%s must be in [%s, %s], got '%s'", who, lo, hi, val);
        *(int64_t *)field(cfg, o) = v;
        return 0;
    }
    case OPT_ENUM: {
        for (int k = 0; o->choices[k]; k++) {
            if (strcmp(val, o->choices[k]) == 0) {
                *(int *)field(cfg, o) = k;
                return 0;
            }
        }
        char list[160];
        choices_text(o, list, sizeof list);
        return fail(err, errlen, "%s must be one of %s, got '%s'", who, list, val);
    }
    case OPT_LIST: {
        srv_strlist_t *l = field(cfg, o);
        if (!append)
            strlist_clear(l);
        const char *p = val;
        while (*p) {
            while (*p == ',' || isspace((unsigned char)*p))
                p++;
            const char *start = p;
            while (*p && *p != ',')
                p++;
            const char *end = p;
            while (end > start && isspace((unsigned char)end[-1]))
                end--;
            if (end == start)
                continue;
            if (strlist_push(l, start, (size_t)(end - start)))
                return fail(err, errlen, "out of memory");
            if ((o->flags & OPT_ORIGINS) && !valid_origin(l->v[l->n - 1]))
                return fail(err, errlen,
                            "%s: '%s' is not an origin (expected scheme://host[:port] or *)", who,
                            l->v[l->n - 1]);
        }
        return 0;
    }
    }
    return fail(err, errlen, "%s: internal error (option type)", who);
}

static const opt_t *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

/* "--no-NAME" for an on|off option NAME means "--NAME off"; the option, or
 * NULL when arg is not such a flag. */
static const opt_t *negated_opt(const char *arg)
{
    if (strncmp(arg, "--no-", 5) != 0 || strchr(arg, '='))
        return NULL;
    const opt_t *o = find_opt(arg + 5, strlen(arg + 5));
    return o && o->choices == onoff_choices ? o : NULL;
}

static const char *env_lookup(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

/* Appends a key and whether it is an admin key. */
static int push_key(srv_config_t *cfg, const char *key, size_t len, int admin)
{
    unsigned char *na = realloc(cfg->api_key_admin, cfg->api_keys.n + 1);
    if (!na)
        return -1;
    cfg->api_key_admin = na;
    if (strlist_push(&cfg->api_keys, key, len))
        return -1;
    cfg->api_key_admin[cfg->api_keys.n - 1] = (unsigned char)(admin ? 1 : 0);
    return 0;
}

/* Reads --api-key-file: one key per line, optionally followed by white space
 * and the word "admin"; blank lines and '#' comments skipped; surrounding
 * white space trimmed. */
static int load_key_file(srv_config_t *cfg, char *err, size_t errlen)
{
    const char *path = cfg->api_key_file;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, "--api-key-file: cannot open '%s': %s", path, strerror(errno));
    char *buf = malloc(KEY_FILE_MAX + 1);
    if (!buf) {
        fclose(f);
        return fail(err, errlen, "out of memory");
    }
    size_t n = fread(buf, 1, KEY_FILE_MAX + 1, f);
    int rd_err = ferror(f);
    fclose(f);
    int rc = 0;
    size_t found = 0;
    if (rd_err) {
        rc = fail(err, errlen, "--api-key-file: cannot read '%s'", path);
        goto done;
    }
    if (n > KEY_FILE_MAX) {
        rc = fail(err, errlen, "--api-key-file: '%s' is larger than %zu bytes", path, KEY_FILE_MAX);
        goto done;
    }
    buf[n] = '\0';
    for (char *line = buf; line && *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *end = line + strlen(line);
        while (isspace((unsigned char)*line))
            line++;
        while (end > line && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*line && *line != '#') {
            char *c = line;
            for (; *c && *c != ' ' && *c != '\t'; c++) {
                if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7E) {
                    rc = fail(err, errlen,
                              "--api-key-file: '%s': a key contains a non-printable character",
                              path);
                    goto done;
                }
            }
            size_t klen = (size_t)(c - line);
            while (*c == ' ' || *c == '\t')
                c++;
            int admin = 0;
            if (strcmp(c, "admin") == 0) {
                admin = 1;
            } else if (*c) {
                rc = fail(err, errlen,
                          "--api-key-file: '%s': after a key only the word 'admin' may follow "
                          "(got '%.32s'); keys contain no spaces",
                          path, c);
                goto done;
            }
            if (push_key(cfg, line, klen, admin)) {
                rc = fail(err, errlen, "out of memory");
                goto done;
            }
            found++;
        }
        line = next;
    }
    if (!found)
        rc = fail(err, errlen, "--api-key-file: '%s' contains no key", path);
done:
    free(buf);
    return rc;
}

static const struct {
    const char *name, *file;
} known_models[] = {
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
};

const char *srv_known_model_file(const char *name)
{
    for (size_t i = 0; i < sizeof known_models / sizeof known_models[0]; i++)
        if (strcasecmp(name, known_models[i].name) == 0)
            return known_models[i].file;
    return NULL;
}

const char *srv_known_model_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcasecmp(base + n - 5, ".gguf") == 0)
        n -= 5;
    for (size_t i = 0; i < sizeof known_models / sizeof known_models[0]; i++) {
        const char *f = known_models[i].file;
        if (strlen(f) == n + 5 && strncasecmp(base, f, n) == 0)
            return known_models[i].name;
    }
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* --models-dir: its *.gguf files (regular files, by name) join the models;
 * they replace the default model when --model was not given. */
static int add_models_dir(srv_config_t *cfg, char *err, size_t errlen)
{
    DIR *d = opendir(cfg->models_dir);
    if (!d)
        return fail(err, errlen, "--models-dir %s: %s", cfg->models_dir, strerror(errno));
    srv_strlist_t found = {0};
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n <= 5 || de->d_name[0] == '.' || strcasecmp(de->d_name + n - 5, ".gguf") != 0)
            continue;
        char path[4096];
        int w = snprintf(path, sizeof path, "%s/%s", cfg->models_dir, de->d_name);
        struct stat sb;
        if (w < 0 || (size_t)w >= sizeof path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (strlist_push(&found, path, (size_t)w))
            rc = fail(err, errlen, "out of memory");
    }
    closedir(d);
    if (rc == 0 && found.n == 0)
        rc = fail(err, errlen, "--models-dir %s holds no .gguf file", cfg->models_dir);
    if (rc == 0) {
        qsort(found.v, found.n, sizeof found.v[0], cmp_str);
        const opt_t *mo = find_opt("model", 5);
        if (cfg->source[mo - opts] == SRV_CFG_SRC_DEFAULT)
            strlist_clear(&cfg->models);
        for (size_t i = 0; i < found.n && rc == 0; i++)
            if (strlist_push(&cfg->models, found.v[i], strlen(found.v[i])))
                rc = fail(err, errlen, "out of memory");
    }
    strlist_clear(&found);
    return rc;
}

static int validate(srv_config_t *cfg, char *err, size_t errlen)
{
    strlist_clear(&cfg->api_keys);
    free(cfg->api_key_admin);
    cfg->api_key_admin = NULL;
    if (*cfg->api_key) {
        for (const char *c = cfg->api_key; *c; c++)
            if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7E)
                return fail(err, errlen,
                            "--api-key contains a space or a non-printable character");
        if (push_key(cfg, cfg->api_key, strlen(cfg->api_key), 0))
            return fail(err, errlen, "out of memory");
    }
    if (*cfg->api_key_file && load_key_file(cfg, err, errlen))
        return -1;
    if (*cfg->models_dir && add_models_dir(cfg, err, errlen) < 0)
        return -1;
    if (cfg->models.n == 0)
        return fail(err, errlen, "--model must name at least one model");
    for (size_t i = 0; i < cfg->models.n; i++) {
        const char *file = srv_known_model_file(cfg->models.v[i]);
        if (!file || access(cfg->models.v[i], F_OK) == 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "models/%s", file);
        char *copy = strdup(path);
        if (!copy)
            return fail(err, errlen, "out of memory");
        free(cfg->models.v[i]);
        cfg->models.v[i] = copy;
    }
    free(cfg->model);
    if (!(cfg->model = strdup(cfg->models.v[0])))
        return fail(err, errlen, "out of memory");
    if (cfg->models.n > 1 && *cfg->adapter)
        return fail(err, errlen,
                    "--adapter names one model's adapter: with several --model, keep each "
                    "adapter beside its model (<model dir>/adapters/<name>.darkformer.gguf), "
                    "where --attn auto finds it");
    if (cfg->models.n > 1 && *cfg->session_store)
        return fail(err, errlen,
                    "--session-store (a shared store) serves one model: with several --model, "
                    "use --session-dir");
    if (*cfg->session_store) {
        srv_store_redis_url_t u;
        char why[400];
        if (srv_store_redis_url_parse(cfg->session_store, &u, why, sizeof why) < 0)
            return fail(err, errlen, "--session-store: %s", why);
    }
    return 0;
}

/* Zeroes cfg (no allocation). srv_config_free on a zeroed struct is a no-op. */
static void srv_config_init(srv_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
}

void srv_config_free(srv_config_t *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (o->type == OPT_STR)
            free(*(char **)field(cfg, o));
        else if (o->type == OPT_LIST)
            strlist_clear(field(cfg, o));
    }
    strlist_clear(&cfg->api_keys);
    free(cfg->api_key_admin);
    free(cfg->model);
    memset(cfg, 0, sizeof *cfg);
}

int srv_config_parse(srv_config_t *cfg, int argc, char **argv, char *const *envp, char *err,
                     size_t errlen)
{
    char no_err[1];
    if (!err || !errlen) {
        err = no_err;
        errlen = sizeof no_err;
    }
    char who[96];
    unsigned char list_from_flag[SRV_CFG_MAX_OPTS] = {0};
    srv_config_init(cfg);
    /* --help wins over everything, even a broken environment variable. */
    for (int a = 0; a < argc; a++) {
        if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
            cfg->want_help = 1;
            return 0;
        }
    }
    if (!envp)
        envp = environ;
    for (size_t i = 0; i < N_OPTS; i++) {
        snprintf(who, sizeof who, "default of --%s", opts[i].name);
        if (set_value(cfg, &opts[i], opts[i].def, who, 0, err, errlen))
            goto fail;
        cfg->source[i] = SRV_CFG_SRC_DEFAULT;
    }
    /* Options given as flags ignore their environment variable entirely, so
     * a flag can fix a bad value inherited from the environment. */
    unsigned char by_flag[SRV_CFG_MAX_OPTS] = {0};
    for (int a = 0; a < argc; a++) {
        if (strncmp(argv[a], "--", 2) != 0)
            continue;
        const opt_t *neg = negated_opt(argv[a]);
        if (neg) {
            by_flag[neg - opts] = 1;
            continue;
        }
        const char *eq = strchr(argv[a] + 2, '=');
        const opt_t *o =
            find_opt(argv[a] + 2, eq ? (size_t)(eq - argv[a] - 2) : strlen(argv[a] + 2));
        if (o) {
            by_flag[o - opts] = 1;
            if (!eq)
                a++; /* skip its value */
        }
    }
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *v = env_lookup(envp, opts[i].env);
        if (!v || by_flag[i])
            continue;
        if (set_value(cfg, &opts[i], v, opts[i].env, 0, err, errlen))
            goto fail;
        cfg->source[i] = SRV_CFG_SRC_ENV;
    }
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--print-config") == 0) {
            cfg->want_print = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
            (void)fail(err, errlen, "unexpected argument '%s' (options start with --; see --help)",
                 arg);
            goto fail;
        }
        const opt_t *neg = negated_opt(arg);
        if (neg) {
            size_t idx = (size_t)(neg - opts);
            snprintf(who, sizeof who, "%s", arg);
            if (set_value(cfg, neg, "off", who, 0, err, errlen))
                goto fail;
            cfg->source[idx] = SRV_CFG_SRC_FLAG;
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const opt_t *o = find_opt(name, nlen);
        if (!o) {
            (void)fail(err, errlen, "unknown option '--%.*s' (see --help)", (int)nlen, name);
            goto fail;
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (a + 1 < argc) {
            val = argv[++a];
        } else {
            (void)fail(err, errlen, "--%s needs a value (%s)", o->name, o->metavar);
            goto fail;
        }
        size_t idx = (size_t)(o - opts);
        snprintf(who, sizeof who, "--%s", o->name);
        if (set_value(cfg, o, val, who, list_from_flag[idx], err, errlen))
            goto fail;
        list_from_flag[idx] = 1;
        cfg->source[idx] = SRV_CFG_SRC_FLAG;
    }
    if (validate(cfg, err, errlen))
        goto fail;
    return 0;
fail:
    srv_config_free(cfg);
    return -1;
}

static void value_text(const srv_config_t *cfg, const opt_t *o, char *buf, size_t n)
{
    const void *p = cfield(cfg, o);
    switch (o->type) {
    case OPT_STR: {
        const char *s = *(char *const *)p;
        if ((o->flags & OPT_SECRET) && s && *s)
            snprintf(buf, n, "<secret>");
        else if ((o->flags & OPT_URL) && s && *s)
            srv_store_redis_url_redact(s, buf, n);
        else
            snprintf(buf, n, "%s", s ? s : "");
        return;
    }
    case OPT_INT:
        snprintf(buf, n, "%lld", (long long)*(const int64_t *)p);
        return;
    case OPT_SIZE:
        format_size(*(const int64_t *)p, buf, n);
        return;
    case OPT_DURATION:
        format_duration(*(const int64_t *)p, buf, n);
        return;
    case OPT_ENUM:
        snprintf(buf, n, "%s", o->choices[*(const int *)p]);
        return;
    case OPT_LIST: {
        const srv_strlist_t *l = p;
        size_t len = 0;
        buf[0] = '\0';
        for (size_t k = 0; k < l->n; k++) {
            int w = snprintf(buf + len, n - len, "%s%s", k ? "," : "", l->v[k]);
            if (w < 0 || (size_t)w >= n - len)
                break;
            len += (size_t)w;
        }
        return;
    }
    }
}

void srv_config_print(const srv_config_t *cfg, FILE *f)
{
    static const char *const src_names[] = {"default", "env", "flag"};
    char buf[1024];
    for (size_t i = 0; i < N_OPTS; i++) {
        value_text(cfg, &opts[i], buf, sizeof buf);
        unsigned src = cfg->source[i] <= SRV_CFG_SRC_FLAG ? cfg->source[i] : 0;
        fprintf(f, "%-18s %s  (%s)\n", opts[i].name, *buf ? buf : "\"\"", src_names[src]);
    }
}

/* Writes text wrapped at ~78 columns with the given indent. */
static void wrap(FILE *f, const char *text, int indent)
{
    const int width = 78;
    int col = indent;
    fprintf(f, "%*s", indent, "");
    const char *p = text;
    while (*p) {
        const char *w = p;
        while (*p && *p != ' ')
            p++;
        int len = (int)(p - w);
        if (col > indent && col + 1 + len > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", len, w);
        col += len;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

void srv_config_help(FILE *f)
{
    char line[512], lo[32], hi[32], list[160];
    fprintf(f, "usage: darkserve serve [options]\n\n"
               "Runs the HTTP daemon. Every option can also be set through the environment\n"
               "variable shown; flags win over the environment. Sizes take K/M/G/T suffixes\n"
               "(binary: 1M = 1048576 bytes); durations are seconds or take s/m/h/d.\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (o->choices == onoff_choices)
            fprintf(f, "  --%s %s, --no-%s   [env %s]\n", o->name, o->metavar, o->name, o->env);
        else
            fprintf(f, "  --%s %s   [env %s]\n", o->name, o->metavar, o->env);
        wrap(f, o->help, 6);
        int len = 0;
        if (o->type == OPT_ENUM) {
            choices_text(o, list, sizeof list);
            len = snprintf(line, sizeof line, "one of %s; ", list);
        } else if (o->type != OPT_STR && o->type != OPT_LIST) {
            format_bound(o, o->min, lo, sizeof lo);
            format_bound(o, o->max, hi, sizeof hi);
            len = snprintf(line, sizeof line, "range %s..%s; ", lo, hi);
        }
        if (len < 0)
            len = 0;
        snprintf(line + len, sizeof line - (size_t)len, "default %s%s%s",
                 *o->def ? "" : "\"", *o->def ? o->def : "", *o->def ? "" : "\"");
        wrap(f, line, 6);
    }
    fprintf(f, "  --print-config\n      print the effective configuration (secrets masked) and "
               "exit\n  --help\n      this text\n");
}
