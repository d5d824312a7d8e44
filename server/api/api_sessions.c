/* server/api/api_sessions.c — the native sessions API (docs/API.md "Sessions"):
 *   POST   /v1/sessions                  create (optionally ingest a system
 *                                        prompt or a history)
 *   GET    /v1/sessions                  list, paged by id
 *   GET    /v1/sessions/{id}             the full session object
 *   DELETE /v1/sessions/{id}
 *   POST   /v1/sessions/{id}/append      ingest text or messages
 *   POST   /v1/sessions/{id}/generate    optionally ingest, then generate
 *                                        (NDJSON by default, SSE, or one JSON)
 *   POST   /v1/sessions/{id}/fork        copy into a new session
 *   GET    /v1/sessions/{id}/state       export the binary state
 *   PUT    /v1/sessions/{id}/state       import a binary state
 *   POST   /v1/sessions/{id}/rollback    back to the state before the last n turns
 *   POST   /v1/sessions/{id}/regenerate  the last turn's reply again
 *
 * Every append or generate (and a completion with "session") is a turn
 * (server/store/store.h "Turns and checkpoints"): opened on the held session
 * right before its engine job is submitted, so that a request that fails
 * before that leaves no turn behind (its release without persist undoes
 * it).
 *
 * Ingesting (create, append) keeps the last token of the new text pending:
 * the engine would otherwise absorb all of it, and a later /generate with no
 * new text would have no logits to sample from. Pending tokens are part of
 * the session's history (engine.h "the pending rule"), so this changes no
 * result, only when that token is fed.
 */
#include "server/api/api.h"

#include "core/state.h"
#include "server/base/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- helpers ---- */

/* The proto view of si; its checkpoints go into ck[SRV_STORE_MAX_CHECKPOINTS]
 * (borrowed by *out). */
static void session_info_json(api_app_t *app, const srv_session_info_t *si,
                              proto_session_info_t *out, proto_checkpoint_t *ck)
{
    const core_attn_cfg_t *ac = core_attn_config(core_model_attn(app->model));
    const int linear = ac->kind != CORE_ATTN_EXACT;
    for (size_t i = 0; i < si->n_checkpoints; i++)
        ck[i] = (proto_checkpoint_t){si->checkpoints[i].turn, si->checkpoints[i].tokens,
                                     (int64_t)si->checkpoints[i].bytes};
    *out = (proto_session_info_t){
        .id = si->id,
        .tokens = si->tokens,
        .state_bytes = (int64_t)si->state_bytes,
        .created = si->created,
        .last_used = si->last_used,
        .attn_kind = core_attn_kind_name(ac->kind),
        .attn_features = linear ? ac->n_features : 0,
        .attn_window = linear ? ac->window : 0,
        .attn_memory = linear ? ac->memory : 0,
        .attn_memory_keep = linear && ac->memory ? core_attn_keep_name(ac->memory_keep) : NULL,
        .attn_memory_heads = linear ? (int64_t)core_attn_memory_heads(ac) : 0,
        .attn_kv_bits = linear ? (ac->kv_bits == 8 ? 8 : 16) : 0,
        .turns = si->turns,
        .checkpoints = ck,
        .n_checkpoints = si->n_checkpoints,
        .has_pending_grammar = si->pending_grammar >= 0,
        .pending_grammar_bytes = si->pending_grammar,
        .model = app->model_id,
    };
}

/* The session object of si (full or short); NULL when out of memory. */
static char *info_json(api_app_t *app, const srv_session_info_t *si, int full)
{
    proto_session_info_t pi;
    proto_checkpoint_t ck[SRV_STORE_MAX_CHECKPOINTS];
    session_info_json(app, si, &pi, ck);
    return proto_session_json(&pi, full);
}

/* Builds the session object of id (full or short); NULL + *code (and the
 * store's detail in err[errlen]) on error. */
static char *session_json(api_app_t *app, const char *id, int full, int *code, char *err,
                          size_t errlen)
{
    srv_session_info_t si;
    *code = srv_store_info(app->store, id, &si, err, errlen);
    if (*code < 0)
        return NULL;
    char *j = info_json(app, &si, full);
    if (!j)
        *code = SRV_STORE_ENOMEM;
    return j;
}

/* The {id} of the path, or NULL after answering 404 for a malformed one
 * (a well-formed id that does not exist is the store's 404). */
static const char *path_id(srv_req_t *req)
{
    const char *id = srv_req_param(req, "id");
    if (!id || !proto_session_id_valid(id, strlen(id))) {
        api_reply_kind(req, PROTO_ERR_SESSION_NOT_FOUND, NULL,
                       "session '%.64s' not found (a session id is 32 lowercase hex characters)",
                       id ? id : "");
        return NULL;
    }
    return id;
}

/* Tokens of new input for session s: raw text, or messages through the chat
 * template (continuing the session's conversation). gen_prompt opens an
 * assistant turn. Sets *chat when the template was used, and *open_after
 * to the turn the render leaves open (api_chat_leaves_open: a Gemma
 * session's system text alone leaves its user turn open). Answers req and
 * returns -1 on error. */
static int session_input(api_app_t *app, srv_req_t *req, srv_session_t *s, const char *text,
                         size_t text_len, const proto_message_t *msgs, size_t n_msgs,
                         int gen_prompt, int parse_special, int32_t **ids, size_t *n, int *chat,
                         int *open_after)
{
    core_error_t ce = {0};
    proto_error_t e;
    const int empty = srv_session_tokens(s) == 0;
    *ids = NULL;
    *n = 0;
    *chat = 0;
    *open_after = 0;
    if (msgs) {
        const int open = srv_session_turn_open(s);
        if (api_chat_tokens(app, msgs, n_msgs, !empty, open, gen_prompt, parse_special, empty, ids,
                            n, &ce) < 0) {
            api_core_error(ce.code, "messages", ce.msg, &e);
            api_reply_proto(req, &e);
            return -1;
        }
        *chat = 1;
        *open_after = api_chat_leaves_open(app, msgs, n_msgs, !empty, open, gen_prompt);
        return 0;
    }
    if (text) {
        if (api_tokenize(app, text, text_len, empty, ids, n, &ce) < 0) {
            api_core_error(ce.code, "text", ce.msg, &e);
            api_reply_proto(req, &e);
            return -1;
        }
    }
    return 0;
}

/* Appends tok to the context's pending tokens (and the sampler's penalty
 * history, which covers pending tokens). */
static int pend_last(srv_seq_ctx_t *ctx, int32_t tok)
{
    int32_t *buf = malloc((ctx->n_pending + 1) * sizeof *buf);
    if (!buf)
        return SRV_ENGINE_ENOMEM;
    if (ctx->n_pending)
        memcpy(buf, ctx->pending, ctx->n_pending * sizeof *buf);
    buf[ctx->n_pending] = tok;
    int rc = srv_seq_ctx_set_pending(ctx, buf, ctx->n_pending + 1);
    free(buf);
    if (rc == 0 && ctx->sampler)
        core_sampler_accept(ctx->sampler, tok, NULL);
    return rc;
}

/* Reserves for g the growth of session s's state by `more` tokens (the
 * store counts what it holds now). */
static int session_reserve(api_gen_t *g, srv_session_t *s, int64_t more, proto_error_t *e)
{
    size_t have = core_attn_state_bytes(srv_session_ctx(s)->state);
    size_t end = api_state_bound(g->app, srv_session_tokens(s) + more);
    return api_gen_reserve(g, end > have ? end - have : 0, e);
}

/* ---- ingest (create, append) ---- */

typedef struct ingest {
    int status;   /* 201 create, 200 append */
    int has_last; /* last token to leave pending */
    int32_t last;
    int set_chat; /* messages were rendered: chat started, the turn as they left it */
    int open_after; /* that turn (core_chat_open_t) */
    int oom;      /* pending the last token failed */
    size_t cached; /* create: tokens taken from the prefix cache */
    char id[PROTO_SESSION_ID_LEN + 1];
} ingest_t;

/* The last changes before the session is written: pend the last token,
 * set the flags. */
static void ingest_apply(srv_session_t *s, ingest_t *k)
{
    if (k->has_last && pend_last(srv_session_ctx(s), k->last) < 0)
        k->oom = 1;
    if (k->set_chat) {
        srv_session_set_turn_open(s, k->open_after);
        srv_session_set_has_chat(s, 1);
    }
}

/* The answer once the session was written (rc, perr: the write's result):
 * the short session object (*json, proto_free) and 0, or e and -1. */
static int ingest_answer(api_app_t *app, const ingest_t *k, const char *job_err, int shutdown,
                         int rc, const char *perr, proto_error_t *e, char **json)
{
    *json = NULL;
    if (k->oom) {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory ingesting the text");
        return -1;
    }
    if (job_err) {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "ingest failed: %s", job_err);
        return -1;
    }
    if (shutdown) {
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, e);
        return -1;
    }
    if (rc < 0) {
        api_persist_error(rc, perr, e);
        if (k->status == 201) /* a create that was never acknowledged: not kept */
            srv_store_delete(app->store, k->id, NULL, 0);
        return -1;
    }
    char err[SRV_STORE_ERR_MAX] = "";
    *json = session_json(app, k->id, 0, &rc, err, sizeof err);
    if (!*json) {
        api_store_error(rc, k->id, err, e);
        return -1;
    }
    if (k->status == 201) { /* a create says what the prefix cache gave it */
        char *j = proto_json_add_int(*json, "cached_tokens", (int64_t)k->cached);
        proto_free(*json);
        *json = j;
        if (!j) {
            proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return -1;
        }
    }
    return 0;
}

static void ingest_prepare(api_gen_t *g)
{
    ingest_apply(g->session, g->kd);
}

static void ingest_done(api_gen_t *g)
{
    ingest_t *k = g->kd;
    if (g->aborted)
        return;
    const char *job_err = NULL;
    const srv_job_result_t *res = g->jobs[0].submitted ? srv_job_result(g->jobs[0].job) : NULL;
    if (res && res->finish[0] == SRV_FINISH_ERROR)
        job_err = res->error[0] ? res->error : "ingest failed";
    if (res)
        SRV_LOG(SRV_LOG_INFO, g->rid,
                "ingest route=%s session=%s prompt_tokens=%" PRId64 " total_ms=%.1f%s", g->route,
                k->id, res->prompt_tokens + (k->has_last ? 1 : 0),
                (double)(srv_engine_now_ns() - g->t_start_ns) / 1e6,
                g->cancelled ? " (client gone)" : "");
    char perr[256] = "";
    int rc = api_gen_release_session(g, 1, perr, sizeof perr);
    if (g->cancelled)
        return;
    proto_error_t e;
    char *j = NULL;
    if (ingest_answer(g->app, k, job_err, g->shutdown, rc, perr, &e, &j) < 0)
        api_gen_reply_error(g, &e);
    else
        api_gen_reply_json(g, k->status, j);
    proto_free(j);
}

static const api_gen_ops_t ingest_ops = {
    .prepare = ingest_prepare, .done = ingest_done, .free = free};

/* An ingest with nothing for the engine: the session is only written (on
 * the I/O thread), then answered. */
typedef struct ingest_io {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    srv_stream_t *stream;
    srv_session_t *s;
    ingest_t k;
    int rc;
    char perr[256];
    char rid[72];
} ingest_io_t;

static void ingest_io_work(api_io_t *io)
{
    ingest_io_t *w = (ingest_io_t *)io;
    srv_session_touch(w->s);
    char d[SRV_STORE_ERR_MAX] = "";
    w->rc = srv_store_release(w->app->store, w->s, 1, d, sizeof d);
    if (w->rc < 0) {
        /* a detail too long for perr is cut short (the result is tested, so
         * GCC's -Wformat-truncation takes the cut as meant) */
        if (snprintf(w->perr, sizeof w->perr,
                     "session state could not be saved (%s); the session keeps its previous "
                     "state",
                     *d ? d : srv_store_strerror(w->rc)) < 0)
            w->perr[0] = '\0';
    }
}

static void ingest_io_done(api_io_t *io)
{
    ingest_io_t *w = (ingest_io_t *)io;
    if (w->rc < 0) {
        srv_series_add(w->app->m_persist_err, 1);
        SRV_LOG(SRV_LOG_ERROR, w->rid, "%s", w->perr);
    }
    proto_error_t e;
    char *j = NULL;
    if (ingest_answer(w->app, &w->k, NULL, 0, w->rc, w->perr, &e, &j) < 0)
        api_defer_reply_error(w->stream, &e);
    else
        api_defer_reply_json(w->stream, w->k.status, j);
    proto_free(j);
    free(w);
}

/* Opens the turn of a request on held session s (input[n] its new tokens,
 * flags SRV_TURN_*). 0, or -1 after answering req (s still held). */
static int turn_begin(api_app_t *app, srv_req_t *req, srv_session_t *s, const int32_t *input,
                      size_t n, unsigned flags)
{
    char err[SRV_STORE_ERR_MAX] = "";
    if (srv_store_turn_begin(app->store, s, input, n, flags, err, sizeof err) == 0)
        return 0;
    api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "session turn: %s", err);
    return -1;
}

/* Ingests ids[n] (owned, freed here) into s (held) and answers req with the
 * short session object. An append of tokens is a turn; a create is not
 * (its state is the one after 0 turns). A create (prefix_id non-NULL, ""
 * = none) starts from the longest cached prefix of the tokens it feeds
 * and inserts them, all but the pending last one, into the cache. */
static void ingest(api_app_t *app, srv_req_t *req, srv_session_t *s, int32_t *ids, size_t n,
                   int status, int set_chat, int open_after, const char *prefix_id)
{
    ingest_t k = {.status = status, .set_chat = set_chat, .open_after = open_after};
    snprintf(k.id, sizeof k.id, "%s", srv_session_id(s));
    if (status != 201 && n > 0 &&
        turn_begin(app, req, s, ids, n, set_chat ? SRV_TURN_CHAT : 0u) < 0) {
        free(ids);
        srv_store_release(app->store, s, 0, NULL, 0);
        return;
    }
    if (n > 0) {
        k.has_last = 1;
        k.last = ids[n - 1];
        n--;
    }
    srv_seq_ctx_t *ctx = srv_session_ctx(s);
    if (n == 0 && prefix_id && prefix_id[0]) { /* nothing a prefix could start */
        free(ids);
        srv_store_release(app->store, s, 0, NULL, 0);
        srv_store_delete(app->store, k.id, NULL, 0);
        api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "prefix",
                       "the session's text is too short to continue the prefix '%s'",
                       prefix_id);
        return;
    }
    if (n == 0 && ctx->n_pending == 0) {
        free(ids);
        ingest_io_t *w = calloc(1, sizeof *w);
        srv_stream_t *st = w ? srv_stream_defer(req, NULL) : NULL;
        if (!st) { /* a failed defer answered 500 */
            free(w);
            srv_store_release(app->store, s, 0, NULL, 0);
            if (!w)
                api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return;
        }
        ingest_apply(s, &k);
        *w = (ingest_io_t){.io = {.work = ingest_io_work, .done = ingest_io_done},
                           .app = app, .stream = st, .s = s, .k = k};
        snprintf(w->rid, sizeof w->rid, "%s", srv_req_id(req));
        api_io_submit(app, &w->io);
        return;
    }
    ingest_t *kd = malloc(sizeof *kd);
    api_gen_t *g = kd ? api_gen_new(app, req, &ingest_ops, kd, 1) : NULL;
    if (!g) { /* api_gen_new freed kd */
        free(ids);
        srv_store_release(app->store, s, 0, NULL, 0);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    *kd = k;
    g->session = s;
    g->jobs[0].ctx = ctx;
    proto_error_t ae;
    if (session_reserve(g, s, (int64_t)n + 1, &ae) < 0) {
        free(ids);
        api_gen_abort(g);
        api_reply_admit(req, &ae);
        return;
    }
    srv_job_spec_t spec;
    srv_job_spec_init(&spec);
    spec.prompt = ids;
    spec.n_prompt = n;
    spec.max_tokens = 0;
    if (prefix_id) {
        const size_t bound = n;
        if (api_prefix_plan(g, 0, &spec, ids, n, n, prefix_id, &bound,
                            n >= API_PREFIX_MIN_TOKENS ? 1 : 0, &ae) < 0) {
            free(ids);
            api_gen_abort(g);
            srv_store_delete(app->store, k.id, NULL, 0);
            api_reply_proto(req, &ae);
            return;
        }
        kd->cached = g->jobs[0].pfx.cached;
    }
    char err[512];
    int rc = api_gen_submit(g, 0, &spec, err, sizeof err);
    free(ids);
    if (rc < 0) {
        api_gen_abort(g);
        api_reply_engine(req, rc, err);
        return;
    }
    api_gen_start(g, req, 0, PROTO_STREAM_NDJSON);
}

static void h_create(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_session_create_req_t cr;
    proto_error_t e;
    if (proto_session_create_parse(body, len, &app->limits, &cr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    char why[512];
    if (srv_store_health(app->store, why, sizeof why) < 0) { /* it could not be saved */
        proto_error_set(&e, PROTO_ERR_UNAVAILABLE, NULL, "%s", why);
        e.code = "session_store_unavailable";
        api_reply_admit(req, &e);
        proto_session_create_free(&cr);
        return;
    }
    /* a new session is a new state: admitted like a request's (its ingest
     * reserves its growth later) */
    if (api_state_admit(app, api_state_bound(app, 0), &e) < 0) {
        api_reply_admit(req, &e);
        proto_session_create_free(&cr);
        return;
    }
    srv_session_t *s = NULL;
    char err[SRV_STORE_ERR_MAX] = "";
    int rc = srv_store_create(app->store, &s, err, sizeof err);
    if (rc < 0) {
        api_reply_store(req, rc, NULL, err);
        proto_session_create_free(&cr);
        return;
    }
    api_caller_t who;
    api_caller(app, req, &who);
    srv_session_set_owner(s, who.owner, NULL, 0); /* a tag from api_owner_tags_init: valid */
    int32_t *ids = NULL;
    size_t n = 0;
    int chat = 0, open_after = 0;
    if (cr.system || cr.messages) {
        proto_message_t sys = {
            .role = PROTO_ROLE_SYSTEM, .content = cr.system, .content_len = cr.system_len};
        const proto_message_t *msgs = cr.system ? &sys : cr.messages;
        size_t nm = cr.system ? 1 : cr.n_messages;
        if (session_input(app, req, s, NULL, 0, msgs, nm, 0, cr.parse_special, &ids, &n, &chat,
                          &open_after) < 0) {
            /* a session that never held anything is not kept */
            char id[PROTO_SESSION_ID_LEN + 1];
            snprintf(id, sizeof id, "%s", srv_session_id(s));
            srv_store_release(app->store, s, 0, NULL, 0);
            srv_store_delete(app->store, id, NULL, 0);
            proto_session_create_free(&cr);
            return;
        }
    }
    char prefix[PROTO_PREFIX_ID_LEN + 1];
    memcpy(prefix, cr.prefix, sizeof prefix);
    proto_session_create_free(&cr);
    ingest(app, req, s, ids, n, 201, chat, open_after, prefix);
}

static void h_append(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *id = path_id(req);
    if (!id)
        return;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_session_append_req_t ar;
    proto_error_t e;
    if (proto_session_append_parse(body, len, &app->limits, &ar, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    api_caller_t who;
    api_caller(app, req, &who);
    srv_session_t *s = NULL;
    if (api_session_check(app, req, &who, id) < 0 || api_session_acquire(app, req, id, &s)) {
        proto_session_append_free(&ar);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int chat = 0, open_after = 0;
    int rc = session_input(app, req, s, ar.text, ar.text_len, ar.messages, ar.n_messages, 0,
                           ar.parse_special, &ids, &n, &chat, &open_after);
    proto_session_append_free(&ar);
    if (rc < 0) {
        srv_store_release(app->store, s, 0, NULL, 0);
        return;
    }
    ingest(app, req, s, ids, n, 200, chat, open_after, NULL);
}

/* ---- generate ---- */

typedef struct sgen {
    int stream;
    int logprobs; /* -1 none */
    int set_chat; /* messages rendered with a generation prompt */
    char id[PROTO_SESSION_ID_LEN + 1];
    api_acc_t acc; /* non-streamed: text, tokens */
    srv_finish_t finish;
    /* under a grammar: what the session keeps when the reply stops before
     * the grammar is complete (srv_session_pending_grammar) */
    char *gtext; /* [gtext_len] the grammar's text (owned); NULL: no grammar */
    size_t gtext_len;
    api_acc_t reply; /* its text: the reply's bytes under it, a continued reply's
                        earlier bytes, then every sampled token's piece */
    int reply_over;  /* past SRV_PENDING_GRAMMAR_MAX: nothing is kept */
    int complete;    /* an end-of-generation token ended it: the grammar is done */
} sgen_t;

static void sgen_free(void *kd)
{
    sgen_t *k = kd;
    if (!k)
        return;
    api_acc_free(&k->acc);
    free(k->gtext);
    api_acc_free(&k->reply);
    free(k);
}

/* Appends p[n] to k's reply under the grammar; past the bound it is dropped. */
static void sgen_reply_add(sgen_t *k, const char *p, size_t n)
{
    if (k->reply_over || !n)
        return;
    if (n > SRV_PENDING_GRAMMAR_MAX - k->gtext_len - k->reply.len) {
        k->reply_over = 1;
        return;
    }
    api_acc_text(&k->reply, p, n);
    k->reply_over = k->reply.oom;
}

/* (Before the session is written.) The pending grammar the reply leaves on
 * the held session: its grammar
 * and bytes when it had a grammar and stopped before an end-of-generation
 * token (max_tokens, a stop string, a cancel), else none. */
static void sgen_pending(api_gen_t *g, const srv_job_result_t *res)
{
    sgen_t *k = g->kd;
    const int keep = k->gtext && !k->complete && res && res->finish[0] != SRV_FINISH_ERROR;
    if (keep && k->reply_over)
        SRV_LOG(SRV_LOG_WARN, g->rid,
                "session %s: the unfinished reply under its grammar is not kept: grammar and "
                "reply are over %zu bytes",
                k->id, SRV_PENDING_GRAMMAR_MAX);
    char err[SRV_STORE_ERR_MAX] = "";
    int rc = keep && !k->reply_over
                 ? srv_session_set_pending_grammar(g->session, k->gtext, k->gtext_len,
                                                   k->reply.text, k->reply.len, err, sizeof err)
                 : srv_session_set_pending_grammar(g->session, NULL, 0, NULL, 0, err, sizeof err);
    if (rc < 0)
        SRV_LOG(SRV_LOG_WARN, g->rid, "session %s: pending grammar not kept: %s", k->id, err);
}

static void sgen_event(api_gen_t *g, size_t ji, const srv_event_t *ev)
{
    (void)ji;
    sgen_t *k = g->kd;
    if (ev->finish != SRV_FINISH_NONE)
        k->finish = ev->finish;
    if (k->gtext && ev->kind == SRV_EVENT_TOKEN) {
        /* the grammar advanced by every sampled token's bytes, also past a
         * stop string (the session's history holds them) */
        size_t pl = 0;
        const char *piece = core_tokenizer_piece(g->app->tok, ev->token, &pl);
        if (core_tokenizer_is_eog(g->app->tok, ev->token))
            k->complete = 1;
        else if (piece)
            sgen_reply_add(k, piece, pl);
    }
    if (!k->stream) {
        api_acc_text(&k->acc, ev->text, ev->len);
        if (ev->kind == SRV_EVENT_TOKEN)
            api_acc_token(&k->acc, ev);
        return;
    }
    if (ev->kind != SRV_EVENT_TOKEN) {
        /* a tail without a token (cancel, timeout): still text */
        if (ev->len) {
            proto_gen_token_t t = {.text = ev->text, .text_len = ev->len, .id = -1};
            char *j = proto_generate_token_json(&t);
            api_gen_write_json(g, j);
            proto_free(j);
        }
        return;
    }
    proto_token_logprob_t lp;
    proto_top_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS];
    if (k->logprobs >= 0)
        api_event_logprob(g->app->tok, ev, 0, &lp, top);
    proto_gen_token_t t = {.text = ev->text,
                           .text_len = ev->len,
                           .id = ev->token,
                           .lp = k->logprobs >= 0 ? &lp : NULL};
    char *j = proto_generate_token_json(&t);
    api_gen_write_json(g, j);
    proto_free(j);
}

static void sgen_prepare(api_gen_t *g)
{
    sgen_t *k = g->kd;
    if (k->set_chat) {
        srv_session_set_turn_open(g->session, 1);
        srv_session_set_has_chat(g->session, 1);
    }
    sgen_pending(g, g->jobs[0].submitted ? srv_job_result(g->jobs[0].job) : NULL);
}

static void sgen_done(api_gen_t *g)
{
    sgen_t *k = g->kd;
    if (g->aborted)
        return;
    const srv_job_result_t *res = g->jobs[0].submitted ? srv_job_result(g->jobs[0].job) : NULL;
    const char *job_err = NULL;
    if (res && res->finish[0] == SRV_FINISH_ERROR)
        job_err = res->error[0] ? res->error : "generation failed";
    char perr[256] = "";
    int prc = api_gen_release_session(g, 1, perr, sizeof perr);
    proto_usage_t u = {0, 0};
    proto_timings_t tm = {0, 0, 0};
    if (res) {
        u.prompt_tokens = res->prompt_tokens;
        u.completion_tokens = res->completion_total;
        tm.queue_ms = res->queue_s > 0 ? res->queue_s * 1e3 : 0;
        tm.prompt_ms = res->prefill_s > 0 ? res->prefill_s * 1e3 : 0;
        tm.generation_ms = res->decode_s > 0 ? res->decode_s * 1e3 : 0;
        api_gen_log_done(g, k->id, u.prompt_tokens, u.completion_tokens, res->ttft_s,
                         api_finish_reason(res->finish[0]));
    }
    if (g->cancelled)
        return;
    proto_error_t e;
    int failed = 1;
    if (g->shutdown)
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, &e);
    else if (job_err)
        api_gen_job_error(g, res, job_err, &e);
    else if (prc < 0)
        api_persist_error(prc, perr, &e);
    else
        failed = 0;
    const char *fin = api_finish_reason(k->finish);
    if (!fin)
        fin = "length";
    /* the session as the request left it (its turns, its checkpoints) */
    srv_session_info_t si;
    proto_session_info_t pinfo;
    proto_checkpoint_t ck[SRV_STORE_MAX_CHECKPOINTS];
    const proto_session_info_t *sp = NULL;
    if (!failed && srv_store_info(g->app->store, k->id, &si, NULL, 0) == 0) {
        session_info_json(g->app, &si, &pinfo, ck);
        sp = &pinfo;
    }
    if (k->stream) {
        if (failed) {
            api_gen_write_error(g, &e);
            return;
        }
        char *j = proto_generate_done_session_json(fin, &u, &tm, sp);
        api_gen_write_json(g, j);
        proto_free(j);
        if (g->fmt == PROTO_STREAM_SSE)
            api_gen_write_raw(g, PROTO_SSE_DONE, strlen(PROTO_SSE_DONE));
        return;
    }
    if (failed || k->acc.oom) {
        if (!failed)
            proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        api_gen_reply_error(g, &e);
        return;
    }
    int32_t *ids = malloc((k->acc.n_toks ? k->acc.n_toks : 1) * sizeof *ids);
    proto_token_logprob_t *lps = NULL;
    proto_top_logprob_t *tops = NULL;
    char *j = NULL;
    if (ids && (k->logprobs < 0 || api_acc_logprobs(&k->acc, g->app->tok, &lps, &tops) == 0)) {
        for (size_t i = 0; i < k->acc.n_toks; i++)
            ids[i] = k->acc.toks[i].id;
        j = proto_generate_session_json(k->id, k->acc.text ? k->acc.text : "", k->acc.len, ids,
                                        k->acc.n_toks, k->logprobs >= 0 ? lps : NULL, fin, &u,
                                        &tm, sp);
    }
    api_gen_reply_json(g, 200, j);
    proto_free(j);
    free(ids);
    free(lps);
    free(tops);
}

static const api_gen_ops_t sgen_ops = {
    .event = sgen_event, .prepare = sgen_prepare, .done = sgen_done, .free = sgen_free};

/* A grammar the reply follows: the request's, or the session's pending one
 * to continue (text, and the reply's bytes so far); all borrowed. */
typedef struct sgen_grammar {
    const char *text, *reply;
    size_t text_len, reply_len;
    int resume;
} sgen_grammar_t;

/* Compiles the reply's grammar into g->grammar and, for a continued reply,
 * its state after the bytes so far into *st (cleared by the caller). */
static int sgen_grammar(api_gen_t *g, const proto_generate_req_t *gr, const sgen_grammar_t *sg,
                        core_grammar_state_t *st, proto_error_t *e)
{
    sgen_t *k = g->kd;
    proto_gen_params_t p = gr->p;
    if (sg->resume) {
        p.grammar = (char *)(uintptr_t)sg->text;
        p.grammar_len = sg->text_len;
        p.grammar_param = "continue_grammar";
    }
    if (!p.grammar)
        return 0;
    if (api_gen_grammar(g, &p, e) < 0)
        return -1;
    k->gtext = malloc(p.grammar_len);
    if (!k->gtext)
        return proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memcpy(k->gtext, p.grammar, p.grammar_len);
    k->gtext_len = p.grammar_len;
    if (p.grammar_len > SRV_PENDING_GRAMMAR_MAX)
        k->reply_over = 1;
    if (!sg->resume)
        return 0;
    sgen_reply_add(k, sg->reply, sg->reply_len);
    core_error_t ce = {0};
    core_grammar_ws_t *ws = core_grammar_ws_new();
    int rc = ws ? core_grammar_state_init(st, g->grammar, &ce) : CORE_ENOMEM;
    if (rc == 0)
        rc = core_grammar_accept_bytes(st, ws, sg->reply, sg->reply_len, &ce);
    core_grammar_ws_free(ws);
    if (rc == CORE_ENOMEM || k->reply_over)
        return proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory");
    if (rc < 0)
        return proto_error_set(e, PROTO_ERR_INTERNAL, NULL,
                               "the session's pending reply does not follow its grammar: %s",
                               ce.msg);
    return 0;
}

/* Generates on held session s from ids[n] (owned, freed here) with the
 * options of gr under the grammar sg, and answers req. set_chat: the input
 * is a chat render. redo: a regenerate, on the checkpoint
 * srv_store_redo_begin swapped in (the last turn again, not a new one). */
static void sgen_run(api_app_t *app, srv_req_t *req, srv_session_t *s,
                     const proto_generate_req_t *gr, const sgen_grammar_t *sg, int32_t *ids,
                     size_t n, int set_chat, int redo)
{
    sgen_t *k = calloc(1, sizeof *k);
    api_gen_t *g = k ? api_gen_new(app, req, &sgen_ops, k, 1) : NULL;
    if (!g) {
        free(ids);
        srv_store_release(app->store, s, 0, NULL, 0);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    k->stream = gr->p.stream;
    k->logprobs = gr->p.logprobs;
    k->set_chat = set_chat;
    snprintf(k->id, sizeof k->id, "%s", srv_session_id(s));
    g->session = s;
    g->jobs[0].ctx = srv_session_ctx(s);
    proto_error_t ae;
    if (session_reserve(g, s, (int64_t)n + gr->p.max_tokens, &ae) < 0) {
        free(ids);
        api_gen_abort(g);
        api_reply_admit(req, &ae);
        return;
    }
    core_grammar_state_t gst = {0};
    if (sgen_grammar(g, gr, sg, &gst, &ae) < 0) {
        core_grammar_state_clear(&gst);
        free(ids);
        api_gen_abort(g);
        api_reply_proto(req, &ae);
        return;
    }
    const unsigned flags = SRV_TURN_REPLY | (set_chat ? SRV_TURN_CHAT : 0u);
    if (!redo && turn_begin(app, req, s, ids, n, flags) < 0) {
        core_grammar_state_clear(&gst);
        free(ids);
        api_gen_abort(g);
        return;
    }
    srv_job_spec_t spec;
    srv_job_spec_init(&spec);
    spec.prompt = ids;
    spec.n_prompt = n;
    spec.max_tokens = gr->p.max_tokens;
    api_sample_params(&gr->p, &spec.params);
    spec.reseed = 1;
    spec.stops = (const char *const *)gr->p.stop;
    spec.n_stops = gr->p.n_stop;
    spec.grammar_start = sg->resume ? &gst : NULL;
    char err[512];
    int rc = api_gen_submit(g, 0, &spec, err, sizeof err);
    core_grammar_state_clear(&gst);
    free(ids);
    if (rc < 0) { /* the release that follows undoes the turn or the redo */
        api_gen_abort(g);
        api_reply_engine(req, rc, err);
        return;
    }
    api_gen_start(g, req, gr->p.stream, gr->format);
}

typedef int (*gen_parse_fn)(const char *body, size_t len, const proto_limits_t *lim,
                            proto_generate_req_t *out, proto_error_t *err);

/* The start of generate and regenerate: the path id (*id), the body
 * (parse into *gr), the caller's right to the session, the session held.
 * NULL when req was answered or runs again (then *gr is freed). */
static srv_session_t *gen_begin(api_app_t *app, srv_req_t *req, gen_parse_fn parse,
                                proto_generate_req_t *gr, const char **id)
{
    *id = path_id(req);
    if (!*id)
        return NULL;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_error_t e;
    if (parse(body, len, &app->limits, gr, &e) < 0) {
        api_reply_proto(req, &e);
        return NULL;
    }
    api_caller_t who;
    api_caller(app, req, &who);
    srv_session_t *s = NULL;
    if (api_session_check(app, req, &who, *id) < 0 || api_session_acquire(app, req, *id, &s)) {
        proto_generate_free(gr);
        return NULL;
    }
    return s;
}

static void h_generate(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *id = NULL;
    proto_generate_req_t gr;
    srv_session_t *s = gen_begin(app, req, proto_generate_parse, &gr, &id);
    if (!s)
        return;
    sgen_grammar_t sg = {0};
    if (gr.continue_grammar &&
        !srv_session_pending_grammar(s, &sg.text, &sg.text_len, &sg.reply, &sg.reply_len)) {
        srv_store_release(app->store, s, 0, NULL, 0);
        proto_generate_free(&gr);
        api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "continue_grammar",
                       "session %s has no pending grammar: only a generate under a grammar "
                       "that stopped before the grammar was complete leaves one, until the "
                       "session's next generate",
                       id);
        return;
    }
    sg.resume = gr.continue_grammar;
    int32_t *ids = NULL;
    size_t n = 0;
    int chat = 0, open_after = 0; /* with the generation prompt: none */
    if (session_input(app, req, s, gr.text, gr.text_len, gr.messages, gr.n_messages, 1,
                      gr.parse_special, &ids, &n, &chat, &open_after) < 0) {
        srv_store_release(app->store, s, 0, NULL, 0);
        proto_generate_free(&gr);
        return;
    }
    if (n == 0 && srv_session_ctx(s)->n_pending == 0) {
        free(ids);
        srv_store_release(app->store, s, 0, NULL, 0);
        proto_generate_free(&gr);
        api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "text",
                       "the session is empty and the request brings no 'text' or 'messages' "
                       "to generate from");
        return;
    }
    sgen_run(app, req, s, &gr, &sg, ids, n, chat, 0);
    proto_generate_free(&gr);
}

/* ---- regenerate ---- */

/* POST /v1/sessions/{id}/regenerate: the last turn's reply replaced by a
 * new one. The checkpoint before the last turn is read on the I/O thread
 * first (srv_store_redo_prepare: it also says when there is nothing to
 * regenerate), then this handler runs again, swaps it in and feeds the
 * last turn's input again: the history is never re-read. */
static void h_regenerate(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *id = NULL;
    proto_generate_req_t gr;
    srv_session_t *s = gen_begin(app, req, proto_regenerate_parse, &gr, &id);
    if (!s)
        return;
    if (srv_store_remote(app->store)) {
        srv_store_release(app->store, s, 0, NULL, 0);
        proto_generate_free(&gr);
        proto_error_t e;
        proto_error_set(&e, PROTO_ERR_CONFLICT, NULL,
                        "session %s is kept in a shared store (--session-store), which keeps no "
                        "checkpoints: regenerate and rollback are not available",
                        id);
        e.code = "checkpoint_not_found";
        api_reply_proto(req, &e);
        return;
    }
    char err[SRV_STORE_ERR_MAX] = "";
    int rc = srv_store_redo_begin(app->store, s, err, sizeof err);
    if (rc == SRV_STORE_EEVICTED) { /* not read yet: on the I/O thread, then again */
        srv_store_release(app->store, s, 0, NULL, 0);
        api_session_bring(app, req, id, API_BRING_REDO);
        proto_generate_free(&gr);
        return;
    }
    unsigned flags = 0;
    const int32_t *in = NULL;
    size_t n = 0;
    int32_t *ids = NULL;
    if (rc == 0 && srv_session_last_turn(s, &flags, &in, &n) && n)
        ids = malloc(n * sizeof *ids);
    if (rc < 0 || (n && !ids)) {
        srv_store_release(app->store, s, 0, NULL, 0);
        if (rc < 0)
            api_reply_store(req, rc, id, err);
        else
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        proto_generate_free(&gr);
        return;
    }
    if (n)
        memcpy(ids, in, n * sizeof *ids);
    const sgen_grammar_t sg = {0};
    sgen_run(app, req, s, &gr, &sg, ids, n, (flags & SRV_TURN_CHAT) != 0, 1);
    proto_generate_free(&gr);
}

/* ---- plain session operations ---- */

/* The list answer (*json, proto_free) of the sessions owner may see (NULL
 * = every one) after `after` ("" = from the start), or -1 with e. */
static int by_id(const void *a, const void *b)
{
    const srv_session_info_t *x = a, *y = b;
    return strcmp(x->id, y->id);
}

/* The sessions of every model (api_hub_app), ordered by id: each model's
 * store lists its first `limit` after `after`, and the first `limit` of
 * them all are the page. */
static int list_json(api_app_t *app, const char *owner, const char *after, size_t limit,
                     char **json, proto_error_t *e)
{
    *json = NULL;
    const size_t n_apps = api_hub_count(app);
    srv_session_info_t *si = calloc(limit * n_apps, sizeof *si);
    api_app_t **of = calloc(limit * n_apps, sizeof(void *));
    proto_session_info_t *pi = calloc(limit, sizeof *pi);
    proto_checkpoint_t *ck = calloc(limit * SRV_STORE_MAX_CHECKPOINTS, sizeof *ck);
    size_t n = 0;
    int more = 0, rc = -1;
    if (!si || !pi || !ck || !of) {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    for (size_t a = 0; a < n_apps; a++) {
        api_app_t *m = api_hub_app(app, a);
        char err[SRV_STORE_ERR_MAX] = "";
        size_t got = 0;
        int more_here = 0;
        int src = srv_store_list_owned(m->store, owner, after[0] ? after : NULL, limit, si + n,
                                       &got, &more_here, err, sizeof err);
        if (src < 0) {
            api_store_error(src, NULL, err, e);
            goto out;
        }
        for (size_t i = 0; i < got; i++)
            of[n + i] = m;
        more |= more_here;
        n += got;
    }
    if (n_apps > 1) {
        /* merge: insertion sort by id, each entry keeping its model */
        for (size_t i = 1; i < n; i++) {
            srv_session_info_t t = si[i];
            api_app_t *tm = of[i];
            size_t j = i;
            while (j > 0 && by_id(&si[j - 1], &t) > 0) {
                si[j] = si[j - 1];
                of[j] = of[j - 1];
                j--;
            }
            si[j] = t;
            of[j] = tm;
        }
    }
    if (n > limit) {
        n = limit;
        more = 1;
    }
    for (size_t i = 0; i < n; i++)
        session_info_json(of[i], &si[i], &pi[i], ck + i * SRV_STORE_MAX_CHECKPOINTS);
    *json = proto_session_list_json(pi, n, more);
    if (!*json) {
        proto_error_set(e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(si);
    free(of);
    free(pi);
    free(ck);
    return rc;
}

/* A list from a shared store: asked on the I/O thread. */
typedef struct list_io {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    srv_stream_t *stream;
    char owner[SRV_SESSION_OWNER_LEN + 1];
    int all;
    char after[PROTO_SESSION_ID_LEN + 1];
    size_t limit;
    char *json;
    proto_error_t e;
    int rc;
} list_io_t;

static void list_work(api_io_t *io)
{
    list_io_t *w = (list_io_t *)io;
    w->rc = list_json(w->app, w->all ? NULL : w->owner, w->after, w->limit, &w->json, &w->e);
}

static void list_done(api_io_t *io)
{
    list_io_t *w = (list_io_t *)io;
    if (w->rc < 0)
        api_defer_reply_error(w->stream, &w->e);
    else
        api_defer_reply_json(w->stream, 200, w->json);
    proto_free(w->json);
    free(w);
}

static void h_list(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    proto_kv_t kv[2];
    size_t nkv = 0;
    static const char *const keys[] = {"limit", "after"};
    for (size_t i = 0; i < 2; i++) {
        const char *v = srv_req_query(req, keys[i]);
        if (v)
            kv[nkv++] = (proto_kv_t){keys[i], v};
    }
    proto_session_list_req_t lr;
    proto_error_t e;
    if (proto_session_list_parse(kv, nkv, &lr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    api_caller_t who;
    api_caller(app, req, &who);
    if (srv_store_remote(app->store) && app->io_running) {
        list_io_t *w = calloc(1, sizeof *w);
        if (!w) {
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return;
        }
        *w = (list_io_t){.io = {.work = list_work, .done = list_done}, .app = app,
                         .all = who.all, .limit = (size_t)lr.limit};
        snprintf(w->owner, sizeof w->owner, "%s", who.owner);
        snprintf(w->after, sizeof w->after, "%s", lr.after);
        if (!(w->stream = srv_stream_defer(req, NULL))) { /* answered 500 */
            free(w);
            return;
        }
        api_io_submit(app, &w->io);
        return;
    }
    char *j = NULL;
    if (list_json(app, who.all ? NULL : who.owner, lr.after, (size_t)lr.limit, &j, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

static void h_get(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    const char *id = path_id(req);
    if (!id)
        return;
    if (srv_store_remote(app->store) && app->io_running && srv_req_runs(req) == 1) {
        /* another replica may have moved it on: as the shared store has it */
        api_session_bring(app, req, id, API_BRING_META);
        return;
    }
    api_caller_t who;
    api_caller(app, req, &who);
    if (api_session_check(app, req, &who, id) < 0)
        return;
    int rc = 0;
    char err[SRV_STORE_ERR_MAX] = "";
    char *j = session_json(app, id, 1, &rc, err, sizeof err);
    if (!j) {
        api_reply_store(req, rc, id, err);
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

/* ---- operations that read or write a whole state (I/O thread) ----
 * delete, fork, export, import and rollback run on the I/O thread
 * (api_io.c); the handler checks what it can, defers the answer, and the
 * completion answers. */

enum sop_kind { SOP_DELETE, SOP_FORK, SOP_EXPORT, SOP_IMPORT, SOP_ROLLBACK };

typedef struct sop {
    api_io_t io; /* first: the item is the struct */
    api_app_t *app;
    srv_stream_t *stream;
    enum sop_kind kind;
    char id[PROTO_SESSION_ID_LEN + 1];
    char owner[SRV_SESSION_OWNER_LEN + 1]; /* fork: the copy's owner tag */
    srv_body_t in;                         /* import: the request body (owned) */
    void *blob;     /* export: the state (owned), answered as it is */
    size_t blob_len;
    int64_t turns;  /* rollback: how many */
    int status;
    char *json;     /* the answer otherwise (proto_free), or small; neither = out of memory */
    char small[128];
} sop_t;

static void sop_work(api_io_t *io)
{
    sop_t *o = (sop_t *)io;
    api_app_t *app = o->app;
    char err[SRV_STORE_ERR_MAX] = "";
    const char *eid = o->id;
    char nid[PROTO_SESSION_ID_LEN + 1] = "";
    int rc = 0;
    switch (o->kind) {
    case SOP_DELETE:
        rc = srv_store_delete(app->store, o->id, err, sizeof err);
        if (rc == 0) {
            snprintf(o->small, sizeof o->small,
                     "{\"id\":\"%s\",\"object\":\"session.deleted\",\"deleted\":true}", o->id);
            o->status = 200;
        }
        break;
    case SOP_FORK:
        rc = srv_store_fork_owned(app->store, o->id, o->owner, nid, err, sizeof err);
        if (rc == 0) {
            eid = nid;
            o->status = 201;
            o->json = session_json(app, nid, 0, &rc, err, sizeof err);
        }
        break;
    case SOP_EXPORT:
        rc = srv_store_export(app->store, o->id, &o->blob, &o->blob_len, err, sizeof err);
        o->status = 200;
        break;
    case SOP_IMPORT:
        rc = srv_store_import(app->store, o->id, o->in.data, o->in.len, err, sizeof err);
        srv_body_free(&o->in);
        if (rc == 0) {
            o->status = 200;
            o->json = session_json(app, o->id, 0, &rc, err, sizeof err);
        }
        break;
    case SOP_ROLLBACK: {
        srv_session_info_t si;
        rc = srv_store_rollback(app->store, o->id, o->turns, &si, err, sizeof err);
        if (rc == 0) {
            o->status = 200;
            o->json = info_json(app, &si, 1);
        }
        break;
    }
    }
    if (rc < 0 && rc != SRV_STORE_ENOMEM) {
        proto_error_t e;
        api_store_error(rc, eid, err, &e);
        if (rc == SRV_STORE_ENOCKPT)
            snprintf(e.param, sizeof e.param, "turns");
        proto_free(o->json);
        o->json = proto_error_json(&e);
        o->status = e.status;
    }
}

static void sop_done(api_io_t *io)
{
    sop_t *o = (sop_t *)io;
    if (o->kind == SOP_EXPORT && o->blob) {
        char disp[96];
        snprintf(disp, sizeof disp, "attachment; filename=\"%s.dsst\"", o->id);
        srv_stream_add_header(o->stream, "Content-Disposition", disp);
        /* the blob is the answer: no copy of it is made */
        srv_stream_reply_take(o->stream, 200, "application/octet-stream", o->blob, o->blob_len);
        o->blob = NULL;
    } else {
        api_defer_reply_json(o->stream, o->status, o->json ? o->json : o->small[0] ? o->small : NULL);
    }
    free(o->blob);
    srv_body_free(&o->in);
    proto_free(o->json);
    free(o);
}

/* The common start: the path id, the caller's right to the session, the
 * deferred answer. NULL after answering req. */
static sop_t *sop_begin(api_app_t *app, srv_req_t *req, enum sop_kind kind, api_caller_t *who)
{
    const char *id = path_id(req);
    if (!id)
        return NULL;
    api_caller(app, req, who);
    if (api_session_check(app, req, who, id) < 0)
        return NULL;
    sop_t *o = calloc(1, sizeof *o);
    if (!o) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    o->io.work = sop_work;
    o->io.done = sop_done;
    o->app = app;
    o->kind = kind;
    snprintf(o->id, sizeof o->id, "%s", id);
    return o;
}

/* Defers req's answer and queues o; frees o when the defer fails (which
 * answered 500). */
static void sop_submit(api_app_t *app, srv_req_t *req, sop_t *o)
{
    o->stream = srv_stream_defer(req, NULL);
    if (!o->stream) {
        srv_body_free(&o->in);
        free(o);
        return;
    }
    api_io_submit(app, &o->io);
}

static void h_delete(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    api_caller_t who;
    sop_t *o = sop_begin(app, req, SOP_DELETE, &who);
    if (o)
        sop_submit(app, req, o);
}

/* Admission of `bytes` more state for a fork or an import (0, or answered
 * 429/400 and o freed). */
static int sop_admit(api_app_t *app, srv_req_t *req, sop_t *o, size_t bytes)
{
    proto_error_t e;
    if (api_state_admit(app, bytes, &e) == 0)
        return 0;
    srv_body_free(&o->in);
    free(o);
    api_reply_admit(req, &e);
    return -1;
}

static void h_fork(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    api_caller_t who;
    sop_t *o = sop_begin(app, req, SOP_FORK, &who);
    if (!o)
        return;
    /* the copy is a new state in memory */
    srv_session_info_t si;
    if (srv_store_info(app->store, o->id, &si, NULL, 0) == 0 &&
        sop_admit(app, req, o, api_state_bound(app, si.tokens)) < 0)
        return;
    snprintf(o->owner, sizeof o->owner, "%s", who.owner);
    sop_submit(app, req, o);
}

static void h_export(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    api_caller_t who;
    sop_t *o = sop_begin(app, req, SOP_EXPORT, &who);
    if (o)
        sop_submit(app, req, o);
}

static void h_import(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    api_caller_t who;
    sop_t *o = sop_begin(app, req, SOP_IMPORT, &who);
    if (!o)
        return;
    size_t n = 0;
    const char *blob = srv_req_body(req, &n);
    core_state_info_t bi;
    core_error_t ce = {0};
    const int peeked = core_state_peek(blob, n, &bi, &ce) == 0;
    if (peeked && strcmp(bi.fingerprint, core_model_info(app->model)->fingerprint) != 0) {
        /* a session stays bound to its model: name both when the server
         * runs the blob's (the store's own check says the rest) */
        for (size_t i = 0; i < api_hub_count(app); i++) {
            const api_app_t *m = api_hub_app(app, i);
            if (m == app || !m->model ||
                strcmp(bi.fingerprint, core_model_info(m->model)->fingerprint) != 0)
                continue;
            free(o);
            proto_error_t e;
            proto_error_set(&e, PROTO_ERR_INVALID_VALUE, NULL,
                            "the state belongs to model '%s'; session '%s' is bound to model '%s' (a "
                            "state cannot move to another model)",
                            m->model_id, srv_req_param(req, "id"), app->model_id);
            e.code = "state_model_mismatch";
            api_reply_proto(req, &e);
            return;
        }
    }
    if (n == 0 || n > app->state_blob_max) {
        free(o);
        if (n == 0)
            api_reply_kind(req, PROTO_ERR_INVALID_VALUE, NULL,
                           "the body must be a session state blob (GET /v1/sessions/{id}/state)");
        else
            api_reply_kind(req, PROTO_ERR_TOO_LARGE, NULL,
                           "a state blob of %zu bytes is larger than any this model makes (%zu)",
                           n, app->state_blob_max);
        return;
    }
    /* the imported state takes memory: as much as the blob's history needs,
     * less what the session holds now (a blob the store will refuse is let
     * through, for the store's error) */
    srv_session_info_t si;
    if (peeked && srv_store_info(app->store, o->id, &si, NULL, 0) == 0) {
        size_t need = api_state_bound(app, bi.pos + (int64_t)bi.n_pending);
        size_t have = si.in_memory ? api_state_bound(app, si.tokens) : 0;
        if (need > have && sop_admit(app, req, o, need - have) < 0)
            return;
    }
    /* the body moves to the I/O thread: the request may end (client gone)
     * before the import does */
    if (srv_req_take_body(req, &o->in) < 0) {
        free(o);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    sop_submit(app, req, o);
}

/* POST /v1/sessions/{id}/rollback {"turns": n}: the checkpoint's file
 * becomes the session's (a rename on the I/O thread; the state is read
 * back only when the session is in memory). */
static void h_rollback(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_rollback_req_t rr;
    proto_error_t e;
    if (!path_id(req))
        return;
    if (proto_rollback_parse(body, len, &rr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    api_caller_t who;
    sop_t *o = sop_begin(app, req, SOP_ROLLBACK, &who);
    if (!o)
        return;
    o->turns = rr.turns;
    sop_submit(app, req, o);
}

int api_sessions_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    srv_route_opts_t blob = {.flags = 0, .max_body = app->state_max_body};
    int rc = 0;
    rc |= api_route(app, "POST", "/v1/sessions", h_create, &json);
    rc |= api_route(app, "GET", "/v1/sessions", h_list, NULL);
    rc |= api_route(app, "GET", "/v1/sessions/{id}", h_get, NULL);
    rc |= api_route(app, "DELETE", "/v1/sessions/{id}", h_delete, NULL);
    rc |= api_route(app, "POST", "/v1/sessions/{id}/append", h_append, &json);
    rc |= api_route(app, "POST", "/v1/sessions/{id}/generate", h_generate, &json);
    rc |= api_route(app, "POST", "/v1/sessions/{id}/fork", h_fork, &json);
    rc |= api_route(app, "GET", "/v1/sessions/{id}/state", h_export, NULL);
    rc |= api_route(app, "PUT", "/v1/sessions/{id}/state", h_import, &blob);
    rc |= api_route(app, "POST", "/v1/sessions/{id}/rollback", h_rollback, &json);
    rc |= api_route(app, "POST", "/v1/sessions/{id}/regenerate", h_regenerate, &json);
    return rc ? -1 : 0;
}
