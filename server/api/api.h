/* server/api/api.h — private to server/: the darkserve application that `serve`
 * runs (srv_darkserve_app): the model, tokenizer, chat template, engine and
 * session store, and the REST endpoints wired from HTTP to them.
 *
 * Files:
 *   api_app.c       srv_darkserve_app: start (load, engine, store, routes),
 *                   drain, stop; /health, /metrics
 *   api_hub.c       several models: the router in front of one app per model
 *                   (api_route), model names
 *   api_gen.c       a generation request in flight (api_gen_t): jobs
 *                   submitted to the engine, their events carried to the
 *                   HTTP stream on the loop thread, back-pressure, pings,
 *                   cancellation, the end of the request
 *   api_openai.c    /v1/completions, /v1/chat/completions, /v1/models (the
 *                   last two also without /v1), and llama.cpp's native
 *                   /completion and /completions
 *   api_fp.c        the system fingerprint of OpenAI responses
 *   api_ollama.c    Ollama's API: /api/chat, /api/generate, /api/tags, ...
 *   api_sessions.c  /v1/sessions...
 *   api_access.c    getting at a session: owners, api_session_acquire, the
 *                   read-back of an evicted one on the I/O thread
 *   api_misc.c      /tokenize, /detokenize
 *   api_embed.c     /v1/embeddings, /embedding(s), /api/embed(dings): the
 *                   engine's pooled hidden states in each API's shape
 *   api_prefix.c    the prefix-state cache (server/store/prefix_cache.h) in the
 *                   request flow: lookups and copies before a job, the
 *                   engine's snapshots inserted after it
 *   api_prefixes.c  /v1/prefixes: pin, list, unpin
 *   api_budget.c    the attention-state memory budget (--max-state-memory)
 *   api_bridge.c    proto structs -> core/engine parameters, and core /
 *                   engine / store errors -> HTTP statuses (DESIGN.md §6)
 *   api_faults.c    the session store's test faults (DARKSERVE_TEST_FAULT_FILE)
 *
 *   api_io.c        the I/O thread: store work that reads or writes whole
 *                   states (fork, export, import, delete, rollback, the
 *                   checkpoint a regenerate starts from, the write at the
 *                   end of a request, the sweep), off the loop
 *
 * Threads: everything here runs on the loop thread, except the engine's
 * notify/on_done callbacks (scheduler thread), which only queue the request
 * on app->ready and wake the loop (api_gen.c), and the work functions of
 * api_io_t items (I/O thread), which only call the store and build answers.
 * While the I/O thread runs, the loop thread reads no session file: it
 * acquires sessions with srv_store_acquire_in_memory and has the I/O
 * thread read an evicted one back (api_session_acquire); and it writes
 * none to make room: store calls made on it evict only sessions whose file
 * is current, leaving the rest to srv_store_settle (srv_store_no_io_here).
 * Without the thread (before it starts, after it stops) its work, reads
 * included, runs on the loop.
 */
#ifndef DARKSERVE_SERVER_API_H
#define DARKSERVE_SERVER_API_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/text/chat.h"
#include "core/model.h"
#include "core/sample.h"
#include "core/text/tokenizer.h"
#include "proto/proto.h"
#include "server/config.h"
#include "server/engine/engine.h"
#include "server/http/http.h"
#include "server/base/metrics.h"
#include "server/store/prefix_cache.h"
#include "server/daemon.h"
#include "server/store/store.h"

/* The application: `serve` runs it (server/main.c). */
extern const srv_app_t srv_darkserve_app;

typedef struct api_gen api_gen_t;

/* A piece of store work for the I/O thread (api_io.c): work runs there (or
 * inline once the app stops), then done runs on the loop thread and frees
 * the item. Embedded in the caller's struct. */
typedef struct api_io api_io_t;
struct api_io {
    api_io_t *next;
    void (*work)(api_io_t *io); /* I/O thread: store calls only, no HTTP, no engine */
    void (*done)(api_io_t *io); /* loop thread, after work */
};

typedef struct api_rsp_table api_rsp_table_t; /* stored responses (api_responses.c) */
typedef struct api_hub api_hub_t;             /* several models (api_hub.c) */

typedef struct api_app {
    const srv_config_t *cfg; /* borrowed from serve */
    uv_loop_t *loop;
    srv_http_t *http;
    srv_metrics_t *metrics;

    core_model_t *model;   /* owned */
    core_tokenizer_t *tok; /* owned */
    core_chat_tmpl_t tmpl;
    srv_engine_t *engine; /* owned */
    srv_store_t *store;   /* owned */
    proto_limits_t limits;
    char model_id[128];     /* served model name ("SmolLM2-135M-Instruct") */
    char model_alias[32];   /* its short name when darkserve knows it ("smollm2-135m"), or "" */
    api_hub_t *hub;         /* several models: the router this app is one model of; NULL with one */
    char system_fp[24];     /* "fp_<16 hex>" once computed (api_system_fingerprint) */
    int64_t created;        /* unix seconds of the start */
    int64_t t_start_ns;     /* srv_engine_now_ns() at the start */
    int64_t gen_timeout_ns; /* per-job deadline; 0 = none */
    size_t state_max_body;  /* PUT /v1/sessions/{id}/state body limit (http; set before load) */
    /* owner tag of each configured API key (cfg->api_keys order); owned,
     * NULL when no keys are configured */
    char (*key_owner)[SRV_SESSION_OWNER_LEN + 1];
    size_t state_blob_max;  /* the largest blob this model's store makes (+ slack); after load */

    int ready;    /* model loaded, routes serving */
    int loading;  /* the background load (load_req) has not come back yet */
    int stop_pending; /* stop() came while loading: the load's callback cleans up */
    int load_rc;  /* load()'s result, written on the threadpool */
    uv_work_t load_req;
    srv_serve_t *serve;
    int draining; /* drain began: no new work */
    int stopping; /* stop hook running: finish everything synchronously */

    /* requests with events to deliver (scheduler -> loop); under mu */
    pthread_mutex_t mu;
    api_gen_t *ready_head;
    uv_async_t wake;
    uv_timer_t sweep_timer; /* srv_store_sweep */
    uv_prepare_t settle_check; /* every loop turn: srv_store_settle when the loop left work */
    uv_timer_t drain_timer; /* cancels generation just before the drain deadline */
    int handles_open;       /* uv handles not yet closed; the app is freed at 0 */

    api_gen_t *live; /* every request in flight (loop thread) */

    /* the I/O thread (api_io.c); queues under io_mu */
    pthread_t io_thread;
    pthread_mutex_t io_mu;
    pthread_cond_t io_cv;
    api_io_t *io_head, *io_tail;           /* waiting for the thread */
    api_io_t *io_done_head, *io_done_tail; /* waiting for the loop */
    int io_quit;
    int io_running;     /* loop thread: the thread runs (else submissions run inline) */
    size_t io_pending;  /* loop thread: submitted, done not run yet */
    int sweeping;       /* a sweep is queued or running */
    int settling;       /* a srv_store_settle is queued or running */

    /* one byte budget for all attention state (--max-state-memory): the
     * sessions in memory plus what requests in flight reserved for the
     * states they may grow (api_state_reserve) */
    size_t state_budget;      /* 0 = none */
    size_t state_reserved;    /* loop thread: reserved by requests in flight */
    size_t state_fixed_bytes; /* one state of a constant-size kind; 0 for exact */
    int trimming;             /* a trim of the session memory is queued */

    /* metrics the app owns (the engine and http register their own) */
    srv_series_t *m_sess_mem, *m_sess_disk, *m_sess_bytes;
    srv_series_t *m_sess_disk_bytes, *m_sess_evicted;
    uint64_t disk_evicted_seen; /* evictions already counted in m_sess_evicted */
    srv_series_t *m_persist_err;
    srv_metric_t *m_batch_steps; /* darkserve_engine_steps_by_batch_total{sequences} */
    uint64_t batch_seen[SRV_ENGINE_MAX_BATCH + 1];

    /* the prefix-state cache (api_prefix.c; loop thread); NULL before the
     * model is loaded and with --prefix-cache-mb 0 */
    srv_prefix_cache_t *prefix;
    srv_series_t *m_pfx_hits, *m_pfx_misses, *m_pfx_evictions, *m_pfx_inserts;
    srv_series_t *m_pfx_bytes, *m_pfx_entries, *m_pfx_pinned, *m_pfx_reserved;
    srv_prefix_cache_stats_t pfx_seen; /* counters already added to the metrics */
    /* snapshots planned and not yet inserted, by key (api_prefix.c): a
     * prefix some request in flight will insert is not copied again */
    struct api_pfx_pending *pfx_pending; /* [n_pfx_pending], owned */
    size_t n_pfx_pending, cap_pfx_pending;

    api_rsp_table_t *responses; /* POST /v1/responses with store (api_responses.c); owned */
} api_app_t;

/* ---- several models (api_hub.c) ----
 * `serve --model A --model B` runs one app per model (its own engine,
 * session store, prefix cache, I/O thread) behind one router, the hub: it
 * registers every route once and hands each request to the app of the
 * model it names (DESIGN.md "Several models"): the body's "model" (Ollama:
 * or "name"), GET /props?model=; a session's, a prefix's or a stored
 * response's routes, and a body that continues one ("session", "prefix",
 * "previous_response_id"), go to the app that holds it (a body naming
 * another model there: 400). No model named: the first
 * model (the default). An unknown name: 404 model_not_found in the API's
 * own shape. Lists (/v1/models, /api/tags, /api/ps, /v1/sessions,
 * /v1/prefixes), /health and /metrics go to the first app, whose handlers
 * cover every model through api_hub_app. */

#define API_HUB_MAX_MODELS 8 /* models one server runs at most */

/* The router of several models (srv_darkserve_app makes it when the
 * configuration names more than one, api_app.c): checks the names, makes
 * each model's configuration (api_hub_cfg: a shallow copy of the server's
 * with that model, its session directory and its shares of the budgets).
 * has_response(app, id): 1 when app holds stored response id
 * (api_responses_has). NULL after logging why. */
api_hub_t *api_hub_new(const srv_serve_ctx_t *ctx,
                       int (*has_response)(const api_app_t *app, const char *id));
/* Model i's configuration (borrowed from hub, which outlives its apps). */
const srv_config_t *api_hub_cfg(const api_hub_t *hub, size_t i);
/* app (started with api_hub_cfg(hub, i) and hub) is model i. */
void api_hub_add(api_hub_t *hub, size_t i, api_app_t *app);
/* A start that failed: frees the hub when no app was added (else it goes
 * with the last of those). */
void api_hub_abandon(api_hub_t *hub);
/* One model's app (api_app.c): starts it with cfg (borrowed, outlives the
 * app; cfg->model is its model) under hub (NULL: the only model): routes,
 * then the load in the background. 0 and *out, or -1 after logging why. */
int api_app_start(const srv_serve_ctx_t *ctx, const srv_config_t *cfg, api_hub_t *hub,
                  api_app_t **out);
void api_app_drain(api_app_t *app);
void api_app_stop(api_app_t *app);
/* Registers a route of app: straight on the HTTP server with one model;
 * through the hub's router with several (the first app's registration
 * makes the route, the others' join it). */
int api_route(api_app_t *app, const char *method, const char *pattern, srv_handler_fn fn,
              const srv_route_opts_t *opts);
/* How many models the server runs (1 without a hub), and the i-th one's
 * app (app itself without a hub). */
size_t api_hub_count(const api_app_t *app);
api_app_t *api_hub_app(const api_app_t *app, size_t i);
/* Loop thread, once app's model is in and its routes can serve: sets the
 * server ready when every model is (without a hub: at once). */
void api_hub_ready(api_app_t *app);
/* 1 when name names app's model: its id or short name, any case, with or
 * without Ollama's ":latest" tag. */
int api_model_named(const api_app_t *app, const char *name);
/* "'A', 'B'": the names of every model, for error messages. */
void api_model_names(const api_app_t *app, char *out, size_t len);
/* app freed its handles: the hub (if any) is freed with its last app. */
void api_hub_app_gone(api_app_t *app);

/* ---- session owners (api_access.c) ----
 * With API keys configured, a session belongs to the key that created it
 * (its owner tag: the first 16 bytes of SHA-256 of a fixed prefix and the
 * key, in hex; a session file never holds the key). Other keys get 404 for
 * it and do not see it in lists; admin keys see and use every session.
 * Without keys there are no owners: everyone sees everything. Sessions
 * made while no keys were configured have no owner and are then visible to
 * admin keys only. */
typedef struct api_caller {
    const char *owner; /* tag new sessions get ("" without keys); borrowed from app */
    int all;           /* sees every session (admin key, or no keys) */
} api_caller_t;

/* Fills app->key_owner from cfg->api_keys. Returns 0 or -1 (out of memory). */
int api_owner_tags_init(api_app_t *app);
/* Who is asking (loop thread, in the handler). */
void api_caller(const api_app_t *app, srv_req_t *req, api_caller_t *c);
/* 1 if c may see and use a session whose owner tag is owner. */
int api_caller_may(const api_caller_t *c, const char *owner);
/* 0 when session id exists and c may use it; else answers req (404 for a
 * session of another owner, exactly as for one that does not exist) and
 * returns -1. */
int api_session_check(api_app_t *app, srv_req_t *req, const api_caller_t *c, const char *id);

/* Installs the session store's test faults when DARKSERVE_TEST_FAULT_FILE
 * is set (api_faults.c says how); no-op otherwise. */
void api_store_fault_install(srv_store_t *st);
/* I/O thread, right after api_session_acquire's read: the test mode
 * evict-after-read moves the idle sessions, that one included, back to
 * disk (api_faults.c); no-op otherwise. */
void api_store_fault_after_read(srv_store_t *st);
/* Loop thread, right before api_session_acquire's acquire: the test modes
 * evict-before-acquire(-stall) drop the idle sessions whose file is current
 * from memory, as if the I/O thread had evicted them that instant
 * (api_faults.c); no-op otherwise. */
void api_store_fault_before_acquire(srv_store_t *st);

/* Holds session id for a handler on the loop thread (after
 * api_session_check). In memory: 0 and *out (held: the handler releases
 * it). Else 1 and the handler returns at once: req was answered (the
 * store's error, e.g. 404 or 409 busy), or the session is on disk and is
 * admitted against --max-state-memory (429 state_memory_full when its
 * state does not fit now), read back on the I/O thread, and the handler
 * runs again (srv_stream_rerun). A session evicted again before that
 * rerun (or between any check and the acquire: the acquire itself says
 * where the session is, srv_store_acquire_in_memory) goes round again, up
 * to 3 reads; then 503 session_store_busy with Retry-After. The loop never
 * reads a session file while the I/O thread runs; without it (stopping)
 * the acquire reads it here. */
int api_session_acquire(api_app_t *app, srv_req_t *req, const char *id, srv_session_t **out);

/* What the I/O thread reads before a handler runs again (api_session_bring). */
typedef enum api_bring_kind {
    API_BRING_SESSION, /* the session (a shared store: acquired and held for the handler) */
    API_BRING_REDO,    /* the checkpoint a regenerate starts from */
    API_BRING_META     /* a shared store: the session's metadata (owner, counts) */
} api_bring_kind_t;
/* Reads session id (API_BRING_SESSION: it is not in memory), the checkpoint
 * a regenerate starts from (API_BRING_REDO) or a shared store's metadata of
 * it (API_BRING_META) on the I/O thread, then runs req's handler again.
 * Always 1 (req answered, or it runs again). api_access.c. */
int api_session_bring(api_app_t *app, srv_req_t *req, const char *id, api_bring_kind_t kind);
/* Answers a deferred stream (srv_stream_defer) with json (NULL: a 500 out of
 * memory; 429 and 503 carry Retry-After) and releases it; with e's JSON
 * (api_access.c). */
void api_defer_reply_json(srv_stream_t *st, int status, const char *json);
void api_defer_reply_error(srv_stream_t *st, const proto_error_t *e);

/* ---- the I/O thread (api_io.c); loop thread ---- */

/* Starts the thread. Returns 0 or -1. */
int api_io_start(api_app_t *app);
/* Queues io (borrowed until its done ran): work on the I/O thread in
 * submission order, then done on the loop thread. After api_io_stop (or
 * without a thread) both run before this returns. */
void api_io_submit(api_app_t *app, api_io_t *io);
/* Runs the done callbacks of finished work (from app->wake). */
void api_io_pump(api_app_t *app);
/* Lets the thread finish everything queued, joins it, runs the done
 * callbacks; later submissions run inline. No-op without a thread. */
void api_io_stop(api_app_t *app);

/* ---- route registration (one per file) ---- */
int api_openai_routes(api_app_t *app);
int api_ollama_routes(api_app_t *app);
int api_sessions_routes(api_app_t *app);
int api_misc_routes(api_app_t *app);
int api_embed_routes(api_app_t *app);
int api_prefix_routes(api_app_t *app);

/* ---- stored responses (api_responses.c; loop thread) ----
 * Response ids of POST /v1/responses with "store" mapped onto the sessions
 * they ran on (see the file's comment). */
#define API_RESPONSES_MAX 4096              /* entries kept; the oldest go first */
#define API_RESPONSES_MAX_BYTES (64u << 20) /* of stored answers */
#define API_RESPONSES_MAX_BRANCHES 256      /* copies made, not yet taken by their requests */
int api_responses_routes(api_app_t *app);
/* 1 when app holds the stored response id (whoever may see it). */
int api_responses_has(const api_app_t *app, const char *id);   /* GET and DELETE /v1/responses/{id} */
void api_responses_free(api_app_t *app);
/* The session of response id as who sees it: 0, or -1 when there is no
 * such response (or it is another key's). */
int api_responses_find(api_app_t *app, const char *id, const api_caller_t *who,
                       char session[PROTO_SESSION_ID_LEN + 1]);
/* Keeps response id (answer json, copied) on session, owned by owner. */
void api_responses_put(api_app_t *app, const char *id, const char *session, const char *owner,
                       const char *json);
/* A fork of session (owned by owner) for req to continue: 0 with its id in
 * out when the fork made for req is ready (the handler runs again);
 * otherwise 1: the fork is made on the I/O thread and the handler runs
 * again, or req was answered (admission, out of memory, the store's
 * error). */
int api_responses_branch(api_app_t *app, srv_req_t *req, const char *session, const char *owner,
                         char out[PROTO_SESSION_ID_LEN + 1]);
/* The copy fork (api_responses_branch's out) was taken by its request. */
void api_responses_branch_taken(api_app_t *app, const char *fork);

/* "fp_<16 hex>" of the binary's build id, the model fingerprint and the
 * attention configuration (api_fp.c); borrowed from app. NULL before the
 * model is loaded. Loop thread. */
const char *api_system_fingerprint(api_app_t *app);
/* Every field of the attention configuration and the digest of its learned
 * parameters as text into buf[len] (what api_system_fingerprint and the
 * prefix cache's namespace hash); returns its length. */
size_t api_attn_config_text(const api_app_t *app, char *buf, size_t len);

/* ---- api_bridge.c: parameters and errors ---- */

/* proto generation options -> core sampling parameters. A request without a
 * seed gets a random one (so reseeding is always on: the same seed gives the
 * same output). */
void api_sample_params(const proto_gen_params_t *p, core_sample_params_t *out);

/* Answers req with a proto error object. */
void api_reply_proto(srv_req_t *req, const proto_error_t *e);
/* 1 for the route of Anthropic's Messages API, whose every error has
 * Anthropic's shape ({"type":"error","error":{...}}); the error JSON of e
 * in the shape of route (NULL when out of memory). */
int api_anthropic_route(const char *route);
char *api_error_json_for(const char *route, const proto_error_t *e);
/* Answers req with an error of this kind; msg is printf-style. */
void api_reply_kind(srv_req_t *req, proto_errkind_t kind, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Fills e for an engine submit error (SRV_ENGINE_E*), with its message;
 * returns 1 if the answer needs Retry-After (queue full). */
int api_engine_error(int code, const char *msg, proto_error_t *e);
/* Answers req for an engine submit error (adds Retry-After on 429). */
void api_reply_engine(srv_req_t *req, int code, const char *msg);
/* Fills e for a session store error (SRV_STORE_E*); id may be NULL; detail
 * (may be NULL or "": the code's description) is the err[] the store call
 * filled. */
void api_store_error(int code, const char *id, const char *detail, proto_error_t *e);
void api_reply_store(srv_req_t *req, int code, const char *id, const char *detail);
/* Fills e for a session save that failed with store code rc (msg: what
 * happened): 507 insufficient_storage when the disk is full or read-only
 * (SRV_STORE_ENOSPACE), else 500. */
void api_persist_error(int rc, const char *msg, proto_error_t *e);
/* Fills e for a core error (CORE_E*) met while preparing a request. */
void api_core_error(int code, const char *param, const char *msg, proto_error_t *e);
/* The prefill budget (--max-prompt-tokens): 0 when n tokens (what a request
 * gives the model to read) fit it, else -1 with e filled: 400
 * context_length_exceeded naming param and both counts. The engine checks
 * the whole input of a job again at submit (a session's pending tokens
 * included). */
int api_input_budget(const api_app_t *app, size_t n, const char *param, proto_error_t *e);
/* OpenAI finish_reason of an engine finish: "stop", "length", "timeout",
 * "cancelled", "error"; NULL for NONE. */
const char *api_finish_reason(srv_finish_t f);

/* ---- text helpers (api_bridge.c) ---- */

/* Tokenizes text[0..len) as the model sees a prompt (special token texts
 * recognised; BOS added when add_special and the model wants one). *ids is
 * malloc'd (caller frees), also when *n == 0. Returns 0, or a negative CORE_E*
 * with the message in ce. */
int api_tokenize(const api_app_t *app, const char *text, size_t len, int add_special, int32_t **ids,
                 size_t *n, core_error_t *ce);
/* Renders proto messages with the chat template and tokenizes the result:
 * a whole conversation (cont = 0) or the continuation of a session's one
 * (cont = 1, open = the turn it ends in, core_chat_open_t: 0 none, 1 its
 * assistant turn, 2 a Gemma user turn holding system text); gen_prompt opens an
 * assistant turn; add_special as for api_tokenize. Message contents are
 * plain text (special-token texts in them stay text) unless parse_special.
 * *ids is malloc'd (caller frees). Returns 0 or a negative CORE_E* (ce). */
int api_chat_tokens(const api_app_t *app, const proto_message_t *msgs, size_t n, int cont, int open,
                    int gen_prompt, int parse_special, int add_special, int32_t **ids,
                    size_t *n_ids, core_error_t *ce);
/* The same with tools[n_tools] (borrowed; none when 0) listed in the
 * system prompt. Either way, role tool messages and assistant tool_calls
 * are written in darkserve's generic tool format (proto/tools.h). */
int api_chat_tokens_tools(const api_app_t *app, const proto_message_t *msgs, size_t n,
                          const proto_tool_t *tools, size_t n_tools, int cont, int open,
                          int gen_prompt, int parse_special, int add_special, int32_t **ids,
                          size_t *n_ids, core_error_t *ce);
/* The turn (core_chat_open_t) that api_chat_tokens(msgs, n, cont, open,
 * gen_prompt) leaves open: CORE_CHAT_OPEN_USER when a Gemma session's
 * render ends in system text (the next user message continues that turn),
 * else CORE_CHAT_OPEN_NONE. */
int api_chat_leaves_open(const api_app_t *app, const proto_message_t *msgs, size_t n, int cont,
                         int open, int gen_prompt);
/* The text the chat template makes of msgs[n] with an assistant turn
 * opened (what a chat request gives the model, before tokenization), as
 * /apply-template answers it. *text is malloc'd (caller frees). Returns 0
 * or a negative CORE_E* (ce). */
int api_chat_text(const api_app_t *app, const proto_message_t *msgs, size_t n, char **text,
                  size_t *len, core_error_t *ce);
/* The vocabulary's fill-in-the-middle markers <fim_prefix>, <fim_suffix>,
 * <fim_middle> (StarCoder's names, SmolLM2's vocabulary has them) into
 * out[3]: 1 when all three are single tokens, else 0. */
int api_fim_tokens(const api_app_t *app, int32_t out[3]);
/* ---- api_gen.c: per-choice accumulation (non-streamed answers) ---- */

typedef struct api_tokrec {
    int32_t id;
    float logprob;
    int32_t n_top;
    core_sample_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS];
} api_tokrec_t;

typedef struct api_acc {
    char *text; /* owned [len] generated text (valid UTF-8 from the engine) */
    size_t len, cap;
    api_tokrec_t *toks; /* owned [n_toks] sampled tokens (when kept) */
    size_t n_toks, cap_toks;
    srv_finish_t finish; /* NONE until the choice ended */
    int oom;             /* an append failed: answer 500 */
} api_acc_t;

void api_acc_text(api_acc_t *a, const char *s, size_t n);
void api_acc_token(api_acc_t *a, const srv_event_t *ev);
void api_acc_free(api_acc_t *a);
/* proto logprob entries for a->toks[0..n): *lps [n] and *tops [n * 20] are
 * malloc'd (caller frees both); pieces are borrowed from tok. text_offset is
 * the byte offset of each token's piece in the concatenation of the pieces.
 * Returns 0 or -1 (out of memory). */
int api_acc_logprobs(const api_acc_t *a, const core_tokenizer_t *tok, proto_token_logprob_t **lps,
                     proto_top_logprob_t **tops);
/* One event's token as a proto logprob entry; top[] caller-owned [20]. */
void api_event_logprob(const core_tokenizer_t *tok, const srv_event_t *ev, int64_t offset,
                       proto_token_logprob_t *lp, proto_top_logprob_t *top);

/* ---- api_gen.c: a generation request in flight ---- */

/* What the prefix-state cache does for one job (api_prefix.c). */
typedef struct api_prefix_plan {
    size_t cached;                        /* prompt tokens from the cache (spec.n_cached) */
    size_t snap_at[SRV_ENGINE_MAX_SNAPS]; /* [n_snap] prefix lengths to insert (spec.snap_at) */
    size_t est[SRV_ENGINE_MAX_SNAPS];     /* [n_snap] bytes reserved in the cache for each */
    uint64_t key[SRV_ENGINE_MAX_SNAPS];   /* [n_snap] their keys in app->pfx_pending */
    size_t n_snap;
    int32_t *toks; /* owned [snap_at[n_snap - 1]]: the prompt the keys are cut from */
} api_prefix_plan_t;

typedef struct api_gen_job {
    srv_job_t *job;     /* caller's reference (released at the end) */
    api_prefix_plan_t pfx;
    srv_seq_ctx_t own;  /* one-shot context (state and sampler owned here) */
    srv_seq_ctx_t *ctx; /* &own, or the session's (borrowed) */
    int done_ev;        /* its DONE event was popped */
    int submitted;
} api_gen_job_t;

typedef struct api_gen_ops {
    /* Loop thread: one event of job ji (TOKEN or END). */
    void (*event)(api_gen_t *g, size_t ji, const srv_event_t *ev);
    /* Loop thread: every job is done, before the held session is written
     * (on the I/O thread): the last changes to it (flags, pending tokens).
     * Not called for an aborted request nor without a session. May be NULL. */
    void (*prepare)(api_gen_t *g);
    /* Loop thread: every job is done (srv_job_result valid) and the session
     * was written (api_gen_release_session gives the result). Writes the
     * final frames or the deferred reply. */
    void (*done)(api_gen_t *g);
    /* Frees the kind's data (g->kd). May be NULL. */
    void (*free)(void *kd);
} api_gen_ops_t;

struct api_gen {
    api_app_t *app;
    const api_gen_ops_t *ops;
    void *kd;                  /* the kind's data, owned (ops->free) */
    char rid[72];              /* request id, for log lines */
    char route[48];            /* matched pattern, for the log line */
    srv_stream_t *stream;      /* producer reference; NULL once closed/replied */
    int streaming;             /* 1: stream opened (frames); 0: deferred reply */
    proto_stream_format_t fmt; /* framing when streaming */
    srv_session_t *session;    /* held (busy) until released; NULL if none */
    int64_t t_start_ns;

    int cancelled; /* client gone (on_cancel) */
    int aborted;   /* abandoned before the answer started (api_gen_abort) */
    int shutdown;  /* cancelled by the drain deadline */
    int finished;  /* the end ran (ops->done) */
    int destroyed; /* released; freed by the ping timer's close callback */
    int closing;   /* final frames queued; close when flushed */
    char *held;    /* frames waiting for stream space */
    size_t held_len, held_cap;
    uint64_t bytes_out;     /* framed bytes handed to the stream */
    uint64_t bytes_at_tick; /* bytes_out at the last ping tick */
    int ping_on;
    uv_timer_t ping;

    /* the session's write at the end (I/O thread; see api_gen_release_session) */
    api_io_t persist_io;
    srv_session_t *persist_s; /* the session being written */
    int persisting;           /* written now: done() and the free wait */
    int persisted;            /* written; persist_rc / persist_err hold the result */
    int persist_rc;
    char persist_err[256];

    size_t reserved; /* bytes of app->state_reserved held by g (given back at the end) */
    core_grammar_t *grammar; /* the request's "grammar" (api_gen_grammar) or NULL; every job
                                samples under it; freed with g, after every on_done */
    const char *grammar_param; /* the field the grammar came from ("grammar", "response_format",
                                  "format", "tools"; static), for errors met while generating */

    api_gen_t *next_ready; /* app->ready list (under app->mu) */
    int queued;            /* on app->ready (under app->mu) */
    atomic_int n_on_done;  /* on_done callbacks run (scheduler thread) */
    api_gen_t *live_prev, *live_next;

    size_t n_jobs;
    api_gen_job_t jobs[]; /* [n_jobs] */
};

/* New request with n_jobs job slots for req (loop thread, in the handler).
 * kd is owned by g from now on (ops->free). Does not answer req. NULL when
 * out of memory (kd freed). */
api_gen_t *api_gen_new(api_app_t *app, srv_req_t *req, const api_gen_ops_t *ops, void *kd,
                       size_t n_jobs);
/* Makes job slot ji a one-shot context: a fresh attention state and a
 * sampler with params. Returns 0 or a negative CORE_E* (ce). */
int api_gen_oneshot(api_gen_t *g, size_t ji, const core_sample_params_t *params, core_error_t *ce);
/* Compiles p->grammar, when the request has one, into g->grammar against
 * the engine's vocabulary (and checks that generation can start under it).
 * Returns 0, or -1 with e filled: 400 invalid_value, param "grammar", the
 * message giving the line and column of the fault. */
int api_gen_grammar(api_gen_t *g, const proto_gen_params_t *p, proto_error_t *e);
/* The error of a job that ended with finish "error" (res, msg its message):
 * a bound the request's grammar met while generating (res->grammar_bound)
 * is the request's fault, 400 invalid_value naming the grammar's field;
 * anything else 500 "generation failed". */
void api_gen_job_error(const api_gen_t *g, const srv_job_result_t *res, const char *msg,
                       proto_error_t *e);
/* Submits spec for slot ji (notify/on_done/ud/ctx/req_id/deadline/grammar
 * filled here). Returns 0 or the engine's error (msg in err). */
int api_gen_submit(api_gen_t *g, size_t ji, srv_job_spec_t *spec, char *err, size_t errlen);
/* Starts the answer (after every job was submitted): streaming = 1 opens the
 * stream now (status 200, content type of fmt, SSE headers and pings);
 * 0 defers the reply. On failure the request was answered (500), the jobs
 * are cancelled and g finishes by itself. */
void api_gen_start(api_gen_t *g, srv_req_t *req, int streaming, proto_stream_format_t fmt);
/* Abandons g before api_gen_start (a later submit failed): cancels what was
 * submitted, releases the session without persisting; the caller answers
 * req. g finishes by itself. */
void api_gen_abort(api_gen_t *g);

/* Frame helpers for ops (loop thread). Frames json as SSE/NDJSON and writes
 * it (or holds it until there is room). json is borrowed. */
void api_gen_write_json(api_gen_t *g, const char *json);
void api_gen_write_raw(api_gen_t *g, const char *bytes, size_t len);
/* An error event (frame of proto_error_json); SSE also gets [DONE] after. */
void api_gen_write_error(api_gen_t *g, const proto_error_t *e);
/* Deferred answer: status + JSON body. */
void api_gen_reply_json(api_gen_t *g, int status, const char *json);
void api_gen_reply_error(api_gen_t *g, const proto_error_t *e);
/* Releases the held session (persist = write it to the store first). On a
 * persist error returns it with a message in err (the previous good state
 * stays on disk). No-op returning 0 when there is no session. In done(),
 * the session was already written on the I/O thread at the end of the
 * jobs: returns that write's result. */
int api_gen_release_session(api_gen_t *g, int persist, char *err, size_t errlen);

/* ---- the prefix-state cache (api_prefix.c; loop thread) ----
 * An entry holds the state after its tokens, all of them absorbed. A job
 * that generates needs the logits of its last prompt token, and an ingest
 * keeps its last token pending (api_sessions.c), so a prompt of n tokens
 * can use an entry of at most n - 1, and the prefixes inserted at a message
 * boundary are the rendered text up to it less its last token: the same
 * key for a chat request and a session created with the same messages. */

#define API_PREFIX_MIN_TOKENS 16 /* shorter prefixes are not inserted */
#define API_PREFIX_MAX_PINNED 64 /* POST /v1/prefixes entries at once */

/* Creates app->prefix from --prefix-cache-mb (after the model is loaded;
 * none with 0). Returns 0 or -1 (out of memory). */
int api_prefix_init(api_app_t *app);
void api_prefix_free(api_app_t *app);
void api_prefix_register_metrics(api_app_t *app);
/* Brings the prefix metrics up to date (at scrape time). */
void api_prefix_refresh_metrics(api_app_t *app);
/* Message boundaries of a chat prompt ids[n_ids] rendered from msgs[n]
 * (with tools, as api_chat_tokens_tools renders them): the key lengths to
 * insert, ascending, into out[SRV_ENGINE_MAX_SNAPS]; returns how many. The
 * boundary after the first message and the last ones are kept, and before
 * them the end of the template's default system prompt when the
 * conversation does not open with a system message. */
size_t api_prefix_chat_bounds(const api_app_t *app, const proto_message_t *msgs, size_t n,
                              const proto_tool_t *tools, size_t n_tools, int parse_special,
                              const int32_t *ids, size_t n_ids, size_t *out);
/* Plans job slot ji of g (its context fresh: position 0, nothing pending)
 * for prompt toks[n] (borrowed): with prefix_id ("" = none) the request
 * names a cached prefix, which must start the prompt; either way the
 * longest cached prefix of at most max_cached tokens is copied into the
 * context's state, and the lengths bounds[n_bounds] (ascending) not cached
 * yet become snapshots to insert. Fills g->jobs[ji].pfx and the spec's
 * n_cached / snap_at / n_snap. 0, or -1 with e (404 unknown prefix, 400
 * a prompt that does not continue it, 500). */
int api_prefix_plan(api_gen_t *g, size_t ji, srv_job_spec_t *spec, const int32_t *toks, size_t n,
                    size_t max_cached, const char *prefix_id, const size_t *bounds,
                    size_t n_bounds, proto_error_t *e);
/* Inserts job ji's snapshots once its prefill is over (called with every
 * event of the job, and at its DONE; a no-op before and after). */
void api_prefix_harvest(api_gen_t *g, size_t ji);
/* Gives back what a plan holds (reservations, pending keys, tokens): after
 * the harvest, or for a job that will not run. */
void api_prefix_drop(api_app_t *app, api_prefix_plan_t *pl);
/* What the cache counts an entry at: the bytes its state has written. */
size_t api_prefix_entry_bytes(const core_attn_state_t *st);
/* An entry's bytes before its state exists (a state at tokens positions). */
size_t api_prefix_entry_estimate(const api_app_t *app, int64_t tokens);

/* ---- the state memory budget (api_gen.c; loop thread) ---- */

/* Upper bound of the bytes one attention state holds once it has seen
 * `tokens` tokens (exact: its KV cache, which grows by doubling up to the
 * context; other kinds: constant). */
size_t api_state_bound(const api_app_t *app, int64_t tokens);
/* Admission: 0 when `bytes` more state fit the budget next to the sessions
 * that cannot be evicted now and what requests in flight reserved; else -1
 * with e: 429 state_memory_full (the caller adds Retry-After), or 400
 * state_memory_exceeded when bytes alone exceed the budget. Nothing is
 * held. When the sessions in memory and the reservations together pass
 * the budget, a trim moves idle sessions to disk (I/O thread). */
int api_state_admit(api_app_t *app, size_t bytes, proto_error_t *e);
/* api_state_admit, and holds the bytes for g until it ends. */
int api_gen_reserve(api_gen_t *g, size_t bytes, proto_error_t *e);
/* Answers req with e from a failed admission (Retry-After on 429 and 503). */
void api_reply_admit(srv_req_t *req, const proto_error_t *e);

/* Wakes the loop (scheduler thread): g has events or finished a job. */
void api_gen_wake(api_app_t *app, api_gen_t *g);
/* Loop thread: delivers the events of every ready request. */
void api_gen_pump_ready(api_app_t *app);
/* Loop thread: cancels every generation in flight (drain deadline). */
void api_gen_cancel_all(api_app_t *app, int shutdown);
/* Loop thread, stop hook, after srv_engine_stop (every on_done ran): the
 * streams are already cancelled by the server; finishes and frees every
 * request (sessions are released and saved). */
void api_gen_shutdown(api_app_t *app);

/* The one log line per finished generation: route, session (NULL = none),
 * tokens in/out, time to first token (ttft_s < 0: none), total time, finish
 * reason (NULL = none); shares the request id with the access line. */
void api_gen_log_done(const api_gen_t *g, const char *session, int64_t prompt_tokens,
                      int64_t completion_tokens, double ttft_s, const char *finish);

#endif
