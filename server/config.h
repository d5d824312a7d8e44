/* server/config.h — the daemon's configuration (`darkserve serve`).
 *
 * One declarative table (config.c) lists every option once: flag name,
 * environment variable, type, default, bounds, help. The same table drives
 * command-line parsing, environment variables, --help, --print-config and
 * validation, so they cannot drift apart.
 *
 * Precedence: built-in default < DARKSERVE_* environment variable < flag.
 * Flags take `--name VALUE` or `--name=VALUE`; unknown flags, missing values,
 * out-of-range numbers and unknown enum words are errors whose message names
 * the flag (or the environment variable) and the accepted values. Positional
 * arguments are errors.
 *
 * Value syntax:
 *   int       decimal integer ("-1" allowed where the range allows it)
 *   size      bytes, optional binary suffix K, M, G, T (also KB/KiB, any case):
 *             "1M" = 1048576, "512K" = 524288
 *   duration  whole seconds, optional suffix s, m, h, d: "30", "30s", "5m",
 *             "1h"; 0 usually means "no limit" (see the option's help)
 *   enum      one of the listed words
 *   list      comma-separated; the flag may also be repeated. Flags replace
 *             the environment's list rather than extending it.
 * An on|off option NAME also takes the flag --no-NAME, the same as
 * --NAME off.
 *
 * Not thread-safe; parse once at startup and treat the struct as read-only.
 */
#ifndef DARKSERVE_SERVER_CONFIG_H
#define DARKSERVE_SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Values of --attn; equal to core_attn_kind_t (core/attn/attn.h), and AUTO to
 * SRV_ATTN_AUTO (server/attn_select.h), checked in config.c. */
typedef enum srv_cfg_attn {
    SRV_CFG_ATTN_EXACT = 0,
    SRV_CFG_ATTN_PERFORMER = 1,
    SRV_CFG_ATTN_DARKFORMER = 2,
    SRV_CFG_ATTN_DARKFORMER_IS = 3,
    SRV_CFG_ATTN_FLEXFORMER_S = 4,
    SRV_CFG_ATTN_FLEXFORMER_N = 5,
    SRV_CFG_ATTN_AUTO = 6
} srv_cfg_attn_t;

/* --prompt-precision, in its choices' order */
typedef enum { SRV_PRECISION_F32, SRV_PRECISION_INT8, SRV_PRECISION_AUTO } srv_cfg_precision_t;
/* A --prompt-precision word ("auto", "f32", "int8") as its srv_cfg_precision_t,
 * or -1: the one list serve's option and the CLI commands both read. */
int srv_cfg_precision_parse(const char *s);

/* Values of --log-level; equal to srv_log_level_t (server/base/log.h). */
typedef enum srv_cfg_log_level {
    SRV_CFG_LOG_ERROR = 0,
    SRV_CFG_LOG_WARN = 1,
    SRV_CFG_LOG_INFO = 2,
    SRV_CFG_LOG_DEBUG = 3
} srv_cfg_log_level_t;

/* Values of --log-format; equal to srv_log_format_t. */
typedef enum srv_cfg_log_format { SRV_CFG_LOG_TEXT = 0, SRV_CFG_LOG_JSON = 1 } srv_cfg_log_format_t;

/* A list of owned strings. */
typedef struct srv_strlist {
    char **v; /* owned, v[0..n) each owned */
    size_t n;
} srv_strlist_t;

/* Largest number of table entries (checked at compile time in config.c). */
/* The models darkserve knows by a short name (what `make run MODEL=NAME`
 * fetches into models/, and a name requests may use for them):
 * smollm2-135m (SmolLM2-135M-Instruct.Q4_1.gguf), gemma3-270m
 * (gemma-3-270m-q4_k_m.gguf). The file name in models/ of short name
 * `name` (any case), or NULL. */
const char *srv_known_model_file(const char *name);
/* The short name of the known model whose file is `path`'s last component
 * (with or without ".gguf", any case), or NULL. */
const char *srv_known_model_name(const char *path);

/* The model serve and the CLI commands load when none is given. */
#define SRV_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/* A number constant as text: help texts print defaults and bounds through
 * it from the constants that hold them. */
#define SRV_STR_(x) #x
#define SRV_STR(x) SRV_STR_(x)

#define SRV_CFG_MAX_OPTS 56

/* Where an option's effective value came from. */
typedef enum srv_cfg_source {
    SRV_CFG_SRC_DEFAULT = 0,
    SRV_CFG_SRC_ENV = 1,
    SRV_CFG_SRC_FLAG = 2
} srv_cfg_source_t;

/* Every string is owned by the struct (freed by srv_config_free) and never
 * NULL after a successful parse; "" means "not set". */
typedef struct srv_config {
    /* network */
    char *host;                /* listen address (IPv4, IPv6 or name) */
    int64_t port;              /* 0 = ephemeral (tests) */
    int64_t max_connections;   /* open connections, suspended ones included */
    int64_t max_body;          /* bytes of request body accepted, else 413 */
    int64_t max_uploads;       /* bodies over 1 MiB received at once, else 429 */
    char *upload_dir;          /* where those are spooled; "" = $TMPDIR or /tmp */
    int64_t max_conns_per_address; /* open connections of one client address; 0 = no limit */
    int64_t request_timeout_s; /* time to receive a whole request; 0 = none */
    int64_t header_timeout_s;  /* time to receive a new connection's first headers; 0 = none */
    int64_t idle_timeout_s;    /* inactivity before a connection is closed; 0 = none */
    int64_t drain_timeout_s;   /* SIGTERM: how long open streams may finish */
    char *api_key;             /* secret; "" = none */
    char *api_key_file;        /* file with one key per line; "" = none */
    srv_strlist_t cors_origins; /* allowed Origin values; "*" = any */
    /* model */
    srv_strlist_t models;      /* GGUF paths (--model, repeatable), short names resolved */
    char *model;               /* derived: models.v[0], the default model */
    char *models_dir;          /* --models-dir: its *.gguf files join models; "" = none */
    char *adapter;             /* DARKFormer adapter GGUF; "" = none */
    int attn;                  /* srv_cfg_attn_t; AUTO by default */
    int64_t features;          /* random features m; 0 = from adapter/default */
    int64_t window;            /* exact window W; -1 = from adapter/default */
    int64_t sinks;             /* exact sink tokens S; -1 = from adapter/default */
    int64_t memory;            /* exact memory rows λ per KV head; -1 = from adapter/default */
    int64_t kv_bits;           /* bits of the exact rows (8, 16); -1 = from adapter/default */
    char *memory_keep;         /* "recall" | "recent"; "" = from adapter/default (recall) */
    char *memory_heads;        /* "all" or layer.head pairs; "" = from adapter/default (all) */
    int decay;                 /* 1 on (the adapter's learned decay), 0 off */
    int prompt_precision;      /* --prompt-precision: srv_cfg_precision_t */
    char *chat_template;       /* "" = the model's own template */
    /* scheduling */
    int64_t threads;           /* compute threads; 0 = all CPUs */
    int64_t max_batch;         /* sequences per step */
    int64_t prefill_chunk;     /* prompt tokens per sequence per step */
    int64_t max_queue;         /* waiting jobs before 429 */
    int64_t max_tokens_limit;  /* upper bound on a request's max_tokens */
    int64_t max_prompt_tokens; /* tokens one request may give the model to read (prefill) */
    int64_t generation_timeout_s; /* deadline of one generation request; 0 = none */
    /* sessions */
    int64_t max_sessions;      /* sessions kept in memory */
    int64_t max_session_bytes; /* bytes of session state kept in memory */
    int64_t max_state_memory;  /* bytes of all attention state (sessions + requests); 0 = none */
    int64_t max_session_disk;  /* bytes of session files in session_dir; 0 = no bound */
    int64_t max_session_files; /* session files in session_dir; 0 = no bound */
    char *session_dir;         /* spill/persist directory */
    char *session_store;       /* "" = session_dir; redis://... = a shared store (server/store/store_backend.h) */
    int64_t session_ttl_s;     /* idle sessions expire; 0 = never */
    int64_t checkpoints;       /* turn checkpoints kept per session; 0 = none */
    int64_t prefix_cache_mb;   /* MiB of the prefix-state cache; 0 = off */
    /* web page */
    int ui;                    /* 1 on: GET / serves the page (server/ui/ui.h), 0 off */
    /* logging */
    int log_level;             /* srv_cfg_log_level_t */
    int log_format;            /* srv_cfg_log_format_t */
    char *log_file;            /* "" = stderr */

    /* Derived by validation: --api-key plus the keys of --api-key-file. */
    srv_strlist_t api_keys;
    unsigned char *api_key_admin; /* owned [api_keys.n]: 1 = admin ("KEY admin" in the file) */
    /* Set by --help / --print-config; the caller prints and exits 0. */
    int want_help;
    int want_print;
    unsigned char source[SRV_CFG_MAX_OPTS]; /* srv_cfg_source_t per table entry */
} srv_config_t;

/* Fills cfg from defaults, then the environment, then argv[0..argc) (the
 * arguments after the subcommand name; argv[0] is an option, not a program
 * name), then validates. envp: NULL-terminated "NAME=value" array, or NULL
 * for the process environment. Returns 0, or -1 with a message naming the
 * flag in err[errlen]; on error cfg holds no allocations.
 * --help sets want_help and stops parsing (validation skipped). */
int srv_config_parse(srv_config_t *cfg, int argc, char **argv, char *const *envp, char *err,
                     size_t errlen);

/* Frees every string in cfg and zeroes it. NULL is a no-op. */
void srv_config_free(srv_config_t *cfg);

/* Prints the option reference to f. */
void srv_config_help(FILE *f);

/* Prints the effective configuration, one "name value (source)" line per
 * option; secrets are masked. */
void srv_config_print(const srv_config_t *cfg, FILE *f);

#endif
