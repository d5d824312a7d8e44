/* server/api/api_openai.c — the OpenAI-compatible endpoints:
 *   POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
 * the last two also without the /v1 prefix (/chat/completions, /models),
 * and llama.cpp's native POST /completion and /completions: one prompt and
 * one choice, answered with OpenAI's completion fields and llama.cpp's side
 * by side (proto_llama_fields_json), through the same jobs and events.
 *
 * One engine job per prompt (completions take up to 16), each with n choices;
 * choice index = prompt * n + sample, as OpenAI numbers them. Without
 * "session" every job runs on a fresh one-shot context; with it, the single
 * prompt (or the new messages) continues that session's state and the
 * session is saved when the job is done.
 */
#include "server/api/api.h"

#include "proto/tools.h"
#include "server/base/log.h"
#include "server/base/random.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One tool call of a non-streamed answer. */
typedef struct oa_call {
    char id[32]; /* "call_" and 24 random alphanumerics */
    char *name;  /* owned */
    api_acc_t args;
} oa_call_t;

typedef struct oa_choice {
    api_acc_t acc;  /* non-streamed: text and (for logprobs) tokens */
    int64_t offset; /* streamed completions: bytes of pieces so far (text_offset) */
    srv_finish_t finish;
    /* tool calling (chat with tools, tool_choice not "none") */
    proto_tool_parser_t *tp; /* NULL: the text is all content */
    oa_call_t *calls;        /* non-streamed: [n_calls] */
    size_t n_calls;
    int oom;
    api_gen_t *g; /* for the parser's callback */
    int index;    /* choice index */
    int eog_end;  /* it ended at an end-of-generation token */
} oa_choice_t;

typedef struct oa_req {
    int chat;
    int n;            /* choices per prompt */
    size_t n_choices; /* n_prompts * n */
    int logprobs;     /* -1 none, else alternatives */
    int include_usage;
    int stream;
    int session_chat; /* the session continued with a chat render */
    char id[48];
    int64_t created;
    char session_id[PROTO_SESSION_ID_LEN + 1];
    oa_choice_t *choices; /* [n_choices] */
    /* llama.cpp's native /completion: its fields beside OpenAI's */
    int native;
    int n_probs;       /* "completion_probabilities" of every token */
    int return_tokens; /* "tokens": the ids of the text */
    size_t n_stop;
    char stop_word[PROTO_MAX_STOP_BYTES + 1]; /* the one stop string, if one */
    char *settings;                           /* "generation_settings" JSON, owned */
    int anthropic; /* /v1/messages: the answer and its errors in Anthropic's shape */
    /* a streamed Messages answer: the content block open (0 none, 1 text,
     * 2 tool_use) and the next block's index */
    int blk_open;
    int blk_next;
    int64_t input_tokens; /* of the prompt, for message_start */
    /* /v1/responses: the answer in the Responses shape, its events numbered */
    int responses;
    int store;                               /* kept under r->id (api_responses_put) */
    char prev_id[PROTO_RESPONSE_ID_MAX + 1]; /* previous_response_id, "" = none */
    char owner[SRV_SESSION_OWNER_LEN + 1];   /* the caller's owner tag */
    char *echo;                              /* the request fields the answer repeats */
    int64_t seq;                             /* next sequence_number */
    int item_open;                           /* the output item open: 0, 1 message, 2 call */
    int item_next;                           /* next output_index */
    size_t item_from;                        /* the open message's text: acc.text + item_from */
    char msg_id[40];                         /* the open (or the answer's) message item id */
} oa_req_t;

static void oa_free(void *kd)
{
    oa_req_t *r = kd;
    if (!r)
        return;
    if (r->choices)
        for (size_t i = 0; i < r->n_choices; i++) {
            oa_choice_t *c = &r->choices[i];
            api_acc_free(&c->acc);
            proto_tool_parser_free(c->tp);
            for (size_t k = 0; k < c->n_calls; k++) {
                free(c->calls[k].name);
                api_acc_free(&c->calls[k].args);
            }
            free(c->calls);
        }
    free(r->choices);
    free(r->settings);
    free(r->echo);
    free(r);
}

static proto_resp_meta_t oa_meta(const api_gen_t *g, const oa_req_t *r)
{
    return (proto_resp_meta_t){.id = r->id,
                               .created = r->created,
                               .model = g->app->model_id,
                               .system_fingerprint = api_system_fingerprint(g->app)};
}

/* An end-of-generation token ends its choice and is no text: it is counted
 * in usage but not listed in logprobs (what OpenAI does). */
static int is_eog_event(const api_gen_t *g, const srv_event_t *ev)
{
    return ev->kind == SRV_EVENT_TOKEN && ev->finish == SRV_FINISH_STOP &&
           core_tokenizer_is_eog(g->app->tok, ev->token);
}

/* finish_reason to show in a chunk/choice: cancellations and errors are
 * reported by the end of the request instead. */
static const char *shown_finish(srv_finish_t f)
{
    if (f == SRV_FINISH_CANCELLED || f == SRV_FINISH_ERROR)
        return NULL;
    return api_finish_reason(f);
}

/* ---- a streamed Messages answer (Anthropic's events) ---- */

static void msg_event(api_gen_t *g, const proto_msg_ev_t *ev)
{
    size_t n = 0;
    char *f = proto_messages_event(ev, &n);
    if (!f) {
        SRV_LOG(SRV_LOG_ERROR, g->rid, "out of memory formatting an event");
        return;
    }
    api_gen_write_raw(g, f, n);
    proto_free(f);
}

/* Closes the open content block, if any. */
static void msg_block_close(api_gen_t *g, oa_req_t *r)
{
    if (!r->blk_open)
        return;
    msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_BLOCK_STOP, .index = r->blk_next - 1});
    r->blk_open = 0;
}

/* Text into a text block (one is opened when another kind, or none, is). */
static void msg_text(api_gen_t *g, oa_req_t *r, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (r->blk_open != 1) {
        msg_block_close(g, r);
        msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TEXT_START, .index = r->blk_next++});
        r->blk_open = 1;
    }
    msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TEXT_DELTA,
                                   .index = r->blk_next - 1,
                                   .text = text,
                                   .len = len});
}

/* stop_reason of the Messages answer whose first choice is c. */
static const char *msg_stop_reason(const oa_choice_t *c)
{
    if (c->finish == SRV_FINISH_STOP) {
        if (c->tp && proto_tool_parser_calls(c->tp) > 0)
            return "tool_use";
        return c->eog_end ? "end_turn" : "stop_sequence";
    }
    return c->finish == SRV_FINISH_LENGTH ? "max_tokens" : NULL;
}

/* ---- a streamed Responses answer (OpenAI's Responses events) ---- */

static void rsp_event(api_gen_t *g, oa_req_t *r, proto_rsp_ev_t ev)
{
    ev.seq = r->seq++;
    size_t n = 0;
    char *f = proto_responses_event(&ev, &n);
    if (!f) {
        SRV_LOG(SRV_LOG_ERROR, g->rid, "out of memory formatting an event");
        return;
    }
    api_gen_write_raw(g, f, n);
    proto_free(f);
}

/* The function_call item of call k ("fc_" beside its "call_" id). */
static proto_rsp_call_t rsp_call(const oa_call_t *k, char fc[40])
{
    snprintf(fc, 40, "fc_%s", k->id + 5);
    return (proto_rsp_call_t){fc, k->id, k->name, k->args.text ? k->args.text : "", k->args.len};
}

static void rsp_item_event(api_gen_t *g, oa_req_t *r, const char *type, const char *item)
{
    rsp_event(g, r, (proto_rsp_ev_t){.type = type, .item = item, .output_index = r->item_next - 1});
}

/* Closes the open output item of choice c, if any. */
static void rsp_close(api_gen_t *g, oa_req_t *r, oa_choice_t *c)
{
    const int oi = r->item_next - 1;
    if (r->item_open == 1) {
        const char *t = (c->acc.text ? c->acc.text : "") + r->item_from;
        const size_t n = c->acc.len - r->item_from;
        proto_rsp_ev_t ev = {.item_id = r->msg_id, .output_index = oi, .text = t, .len = n};
        ev.type = "response.output_text.done";
        rsp_event(g, r, ev);
        ev.type = "response.content_part.done";
        rsp_event(g, r, ev);
        const int cut = c->finish == SRV_FINISH_LENGTH || c->finish == SRV_FINISH_TIMEOUT;
        char *item =
            proto_responses_item_json(NULL, r->msg_id, cut ? "incomplete" : "completed", t, n);
        rsp_item_event(g, r, "response.output_item.done", item);
        proto_free(item);
    } else if (r->item_open == 2 && c->n_calls) {
        char fc[40];
        proto_rsp_call_t pc = rsp_call(&c->calls[c->n_calls - 1], fc);
        rsp_event(g, r,
                  (proto_rsp_ev_t){.type = "response.function_call_arguments.done",
                                   .item_id = fc,
                                   .output_index = oi,
                                   .text = pc.arguments,
                                   .len = pc.arguments_len,
                                   .name = pc.name});
        char *item = proto_responses_item_json(&pc, NULL, "completed", NULL, 0);
        rsp_item_event(g, r, "response.output_item.done", item);
        proto_free(item);
    }
    r->item_open = 0;
}

/* Opens a message item (its text starts at the choice's current end). */
static void rsp_open_message(api_gen_t *g, oa_req_t *r, oa_choice_t *c)
{
    rsp_close(g, r, c);
    char hex[25];
    srv_random_hex(hex, 12);
    snprintf(r->msg_id, sizeof r->msg_id, "msg_%s", hex);
    r->item_from = c->acc.len;
    r->item_open = 1;
    r->item_next++;
    char *item = proto_responses_item_json(NULL, r->msg_id, "in_progress", NULL, 0);
    rsp_item_event(g, r, "response.output_item.added", item);
    proto_free(item);
    rsp_event(g, r,
              (proto_rsp_ev_t){.type = "response.content_part.added",
                               .item_id = r->msg_id,
                               .output_index = r->item_next - 1,
                               .text = "",
                               .len = 0});
}

/* Text of choice c: kept, and sent as a delta of the open message item. */
static void rsp_text(api_gen_t *g, oa_req_t *r, oa_choice_t *c, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (r->item_open != 1)
        rsp_open_message(g, r, c);
    api_acc_text(&c->acc, text, len);
    rsp_event(g, r,
              (proto_rsp_ev_t){.type = "response.output_text.delta",
                               .item_id = r->msg_id,
                               .output_index = r->item_next - 1,
                               .text = text,
                               .len = len});
}

/* The parser's findings kept for the answer (content into acc, calls into
 * calls); id: a new call's "call_" id. */
static void keep_tool_ev(oa_choice_t *c, const proto_tool_ev_t *tev, const char *id)
{
    if (tev->kind == PROTO_TOOL_EV_CONTENT) {
        api_acc_text(&c->acc, tev->text, tev->len);
    } else if (tev->kind == PROTO_TOOL_EV_CALL) {
        oa_call_t *nc = realloc(c->calls, (c->n_calls + 1) * sizeof *nc);
        if (nc) /* the old block is gone: keep the new one, used or not */
            c->calls = nc;
        char *name = nc ? malloc(tev->len + 1) : NULL;
        if (!name) {
            c->oom = 1;
            return;
        }
        memcpy(name, tev->text, tev->len);
        name[tev->len] = '\0';
        oa_call_t *call = &c->calls[c->n_calls++];
        memset(call, 0, sizeof *call);
        snprintf(call->id, sizeof call->id, "%s", id);
        call->name = name;
    } else if (c->n_calls && (size_t)tev->index == c->n_calls - 1) {
        api_acc_text(&c->calls[tev->index].args, tev->text, tev->len);
    }
}

/* The parser's findings: content and calls, written as chunks (streamed)
 * or kept for the answer. */
static void oa_tool_ev(void *ud, const proto_tool_ev_t *tev)
{
    oa_choice_t *c = ud;
    api_gen_t *g = c->g;
    oa_req_t *r = g->kd;
    char id[32] = "";
    if (tev->kind == PROTO_TOOL_EV_CALL) {
        char hex[25];
        srv_random_hex(hex, 12);
        snprintf(id, sizeof id, "call_%s", hex);
    }
    if (!r->stream) {
        keep_tool_ev(c, tev, id);
        return;
    }
    if (r->responses) {
        if (tev->kind == PROTO_TOOL_EV_CONTENT) {
            rsp_text(g, r, c, tev->text, tev->len);
            return;
        }
        if (tev->kind == PROTO_TOOL_EV_CALL)
            rsp_close(g, r, c);
        keep_tool_ev(c, tev, id);
        if (!c->n_calls)
            return;
        char fc[40];
        proto_rsp_call_t pc = rsp_call(&c->calls[c->n_calls - 1], fc);
        if (tev->kind == PROTO_TOOL_EV_CALL) {
            r->item_open = 2;
            r->item_next++;
            char *item = proto_responses_item_json(&pc, NULL, "in_progress", NULL, 0);
            rsp_item_event(g, r, "response.output_item.added", item);
            proto_free(item);
        } else if (tev->len > 0) {
            rsp_event(g, r,
                      (proto_rsp_ev_t){.type = "response.function_call_arguments.delta",
                                       .item_id = fc,
                                       .output_index = r->item_next - 1,
                                       .text = tev->text,
                                       .len = tev->len});
        }
        return;
    }
    if (r->anthropic) {
        if (tev->kind == PROTO_TOOL_EV_CONTENT) {
            msg_text(g, r, tev->text, tev->len);
        } else if (tev->kind == PROTO_TOOL_EV_CALL) {
            msg_block_close(g, r);
            char tid[40], name[PROTO_MAX_TOOL_NAME + 1];
            snprintf(tid, sizeof tid, "toolu_%s", id + 5);
            snprintf(name, sizeof name, "%.*s", (int)tev->len, tev->text);
            msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TOOL_START,
                                           .index = r->blk_next++,
                                           .id = tid,
                                           .name = name});
            r->blk_open = 2;
        } else if (tev->len > 0) {
            msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_JSON_DELTA,
                                           .index = r->blk_next - 1,
                                           .text = tev->text,
                                           .len = tev->len});
        }
        return;
    }
    proto_resp_meta_t meta = oa_meta(g, r);
    char *j;
    if (tev->kind == PROTO_TOOL_EV_CONTENT) {
        proto_choice_t pc = {.index = c->index, .text = tev->text, .text_len = tev->len};
        j = proto_chat_chunk_json(&meta, &pc, 0, NULL);
    } else {
        proto_tool_call_t tc = {
            .index = tev->index, .arguments = tev->text, .arguments_len = tev->len};
        if (tev->kind == PROTO_TOOL_EV_CALL)
            tc = (proto_tool_call_t){tev->index, id, tev->text, "", 0};
        /* a name is short; its text is the event's, valid for this call */
        char name[PROTO_MAX_TOOL_NAME + 1];
        if (tc.name) {
            snprintf(name, sizeof name, "%.*s", (int)tev->len, tev->text);
            tc.name = name;
        }
        j = proto_chat_tool_chunk_json(&meta, c->index, &tc);
    }
    api_gen_write_json(g, j);
    proto_free(j);
}

/* finish_reason of choice c: "tool_calls" when it stopped after calls. */
static const char *choice_finish(const oa_choice_t *c, srv_finish_t f)
{
    if (c->tp && f == SRV_FINISH_STOP && proto_tool_parser_calls(c->tp) > 0)
        return "tool_calls";
    return shown_finish(f);
}

static void oa_event(api_gen_t *g, size_t ji, const srv_event_t *ev)
{
    oa_req_t *r = g->kd;
    size_t ci = ji * (size_t)r->n + (size_t)(ev->choice < 0 ? 0 : ev->choice);
    if (ci >= r->n_choices)
        return;
    oa_choice_t *c = &r->choices[ci];
    const int eog = is_eog_event(g, ev);
    const int with_lp = r->logprobs >= 0 && ev->kind == SRV_EVENT_TOKEN && !eog;
    /* llama.cpp's streamed chunks carry their token's id whatever
     * return_tokens says; its answer only with return_tokens */
    const int keep_id =
        r->native && (r->return_tokens || r->stream) && ev->kind == SRV_EVENT_TOKEN && !eog;
    if (ev->finish != SRV_FINISH_NONE) {
        c->finish = ev->finish;
        c->eog_end = eog;
    }

    if (!r->stream) {
        if (c->tp) {
            if (proto_tool_parser_feed(c->tp, ev->text, ev->len) < 0)
                c->oom = 1;
            if (ev->finish != SRV_FINISH_NONE && proto_tool_parser_finish(c->tp) < 0)
                c->oom = 1;
        } else {
            api_acc_text(&c->acc, ev->text, ev->len);
        }
        if (with_lp || keep_id)
            api_acc_token(&c->acc, ev);
        c->acc.finish = c->finish;
        return;
    }
    if (r->responses) { /* the end is response.completed, from done() */
        if (c->tp) {
            if (proto_tool_parser_feed(c->tp, ev->text, ev->len) < 0)
                c->oom = 1;
            if (ev->finish != SRV_FINISH_NONE && proto_tool_parser_finish(c->tp) < 0)
                c->oom = 1;
        } else {
            rsp_text(g, r, c, ev->text, ev->len);
        }
        c->acc.finish = c->finish;
        return;
    }
    if (r->native) /* the whole text, for has_new_line at the end */
        api_acc_text(&c->acc, ev->text, ev->len);

    proto_resp_meta_t meta = oa_meta(g, r);
    proto_token_logprob_t lp;
    proto_top_logprob_t top[CORE_SAMPLE_MAX_LOGPROBS];
    if (with_lp) {
        api_event_logprob(g->app->tok, ev, c->offset, &lp, top);
        c->offset += (int64_t)lp.piece_len;
    }
    if (c->tp) {
        /* the text goes through the parser; logprobs in chunks of their own */
        if (with_lp) {
            proto_choice_t lc = {
                .index = (int)ci, .has_logprobs = 1, .logprobs = &lp, .n_logprobs = 1};
            char *j = proto_chat_chunk_json(&meta, &lc, 0, NULL);
            api_gen_write_json(g, j);
            proto_free(j);
        }
        proto_tool_parser_feed(c->tp, ev->text, ev->len);
        if (ev->finish != SRV_FINISH_NONE) {
            proto_tool_parser_finish(c->tp);
            const char *tfin = r->anthropic ? NULL : choice_finish(c, ev->finish);
            if (tfin) {
                proto_choice_t end = {.index = (int)ci, .finish_reason = tfin};
                char *j = proto_chat_chunk_json(&meta, &end, 0, NULL);
                api_gen_write_json(g, j);
                proto_free(j);
            }
        }
        return;
    }
    if (r->anthropic) { /* the end is message_delta, from done() */
        msg_text(g, r, ev->text, ev->len);
        return;
    }
    const char *fin = ev->finish != SRV_FINISH_NONE ? shown_finish(ev->finish) : NULL;
    proto_choice_t pc = {.index = (int)ci,
                         .text = ev->text,
                         .text_len = ev->len,
                         .has_logprobs = with_lp,
                         .logprobs = with_lp ? &lp : NULL,
                         .n_logprobs = with_lp ? 1u : 0u};
    if (r->chat) {
        if (ev->len > 0 || with_lp) {
            char *j = proto_chat_chunk_json(&meta, &pc, 0, NULL);
            api_gen_write_json(g, j);
            proto_free(j);
        }
        if (fin) {
            proto_choice_t end = {.index = (int)ci, .finish_reason = fin};
            char *j = proto_chat_chunk_json(&meta, &end, 0, NULL);
            api_gen_write_json(g, j);
            proto_free(j);
        }
    } else if (ev->len > 0 || with_lp || fin || (r->native && ev->kind == SRV_EVENT_TOKEN)) {
        pc.finish_reason = fin;
        char *j = proto_completion_chunk_json(&meta, &pc, NULL);
        if (r->native) {
            const int32_t id = ev->token;
            proto_llama_fields_t f = {.content = ev->text,
                                      .content_len = ev->len,
                                      .tokens = keep_id ? &id : NULL,
                                      .n_tokens = keep_id ? 1u : 0u,
                                      .with_probs = r->n_probs > 0 && with_lp,
                                      .probs = with_lp ? &lp : NULL,
                                      .n_probs = with_lp ? 1u : 0u};
            char *jn = proto_llama_fields_json(j, &f);
            proto_free(j);
            j = jn;
        }
        api_gen_write_json(g, j);
        proto_free(j);
    }
}

/* llama.cpp's stop_type of a finished choice. */
static const char *native_stop_type(const oa_choice_t *c)
{
    if (c->finish == SRV_FINISH_STOP)
        return c->eog_end ? "eos" : "word";
    return c->finish == SRV_FINISH_LENGTH ? "limit" : "none";
}

/* The native fields of the end of the answer (choice 0, the only one). */
static proto_llama_fields_t native_end(api_gen_t *g, const oa_req_t *r)
{
    const oa_choice_t *c = &r->choices[0];
    const srv_job_result_t *res = g->jobs[0].submitted ? srv_job_result(g->jobs[0].job) : NULL;
    const char *st = native_stop_type(c);
    return (proto_llama_fields_t){
        .stop = 1,
        .stop_type = st,
        .stopping_word = strcmp(st, "word") == 0 && r->n_stop == 1 ? r->stop_word : "",
        .content_all = c->acc.text ? c->acc.text : "",
        .content_all_len = c->acc.len,
        .tokens_predicted = res ? res->completion_total : 0,
        .tokens_evaluated = res ? res->prompt_tokens : 0,
        .tokens_cached = res ? res->cached_tokens : 0,
        .prompt_ms = res && res->prefill_s > 0 ? res->prefill_s * 1e3 : 0,
        .predicted_ms = res && res->decode_s > 0 ? res->decode_s * 1e3 : 0,
        .settings = r->settings};
}

/* Sums the jobs' results (cached: prompt tokens from the prefix cache);
 * returns the first error message, if any, and the result it is from in
 * *err_res. */
static const char *oa_totals(api_gen_t *g, proto_usage_t *u, int64_t *cached, double *ttft_s,
                             const srv_job_result_t **err_res)
{
    const char *err = NULL;
    *err_res = NULL;
    u->prompt_tokens = u->completion_tokens = 0;
    *cached = 0;
    *ttft_s = -1;
    for (size_t i = 0; i < g->n_jobs; i++) {
        if (!g->jobs[i].submitted)
            continue;
        const srv_job_result_t *res = srv_job_result(g->jobs[i].job);
        if (!res)
            continue;
        u->prompt_tokens += res->prompt_tokens;
        u->completion_tokens += res->completion_total;
        *cached += res->cached_tokens;
        if (res->ttft_s >= 0 && (*ttft_s < 0 || res->ttft_s < *ttft_s))
            *ttft_s = res->ttft_s;
        for (int c = 0; c < res->n_choices; c++)
            if (res->finish[c] == SRV_FINISH_ERROR && !err) {
                err = res->error[0] ? res->error : "generation failed";
                *err_res = res;
            }
    }
    return err;
}

/* The response object of r now: status "in_progress" before the end (no
 * output, no usage), else the answer; e: the failure, if any. */
static char *rsp_object(api_gen_t *g, oa_req_t *r, const proto_error_t *e, const proto_usage_t *u,
                        int64_t cached, int end)
{
    oa_choice_t *c = &r->choices[0];
    proto_rsp_call_t *calls = NULL;
    char(*fc)[40] = NULL;
    if (end && c->n_calls) {
        calls = calloc(c->n_calls, sizeof *calls);
        fc = calloc(c->n_calls, sizeof *fc);
        if (!calls || !fc) {
            free(calls);
            free(fc);
            return NULL;
        }
        for (size_t k = 0; k < c->n_calls; k++)
            calls[k] = rsp_call(&c->calls[k], fc[k]);
    }
    if (end && !r->msg_id[0]) {
        char hex[25];
        srv_random_hex(hex, 12);
        snprintf(r->msg_id, sizeof r->msg_id, "msg_%s", hex);
    }
    const int cut = c->finish == SRV_FINISH_LENGTH || c->finish == SRV_FINISH_TIMEOUT;
    proto_rsp_out_t o = {.id = r->id,
                         .created_at = r->created,
                         .model = g->app->model_id,
                         .status = !end  ? "in_progress"
                                   : e   ? "failed"
                                   : cut ? "incomplete"
                                         : "completed",
                         .incomplete_reason = !end || e || !cut                ? NULL
                                              : c->finish == SRV_FINISH_LENGTH ? "max_output_tokens"
                                                                               : "timeout",
                         .error_code = e ? e->code : NULL,
                         .error_message = e ? e->message : NULL,
                         .echo = r->echo,
                         .has_message = end && (c->acc.len > 0 || c->n_calls == 0),
                         .msg_id = r->msg_id,
                         .item_status = cut ? "incomplete" : "completed",
                         .text = c->acc.text ? c->acc.text : "",
                         .text_len = c->acc.len,
                         .calls = calls,
                         .n_calls = end ? c->n_calls : 0,
                         .with_usage = end && u,
                         .input_tokens = u ? u->prompt_tokens : 0,
                         .output_tokens = u ? u->completion_tokens : 0,
                         .cached_tokens = cached};
    char *j = proto_responses_json(&o);
    free(calls);
    free(fc);
    return j;
}

/* The end of a Responses answer: e is the failure, if any. */
static void rsp_done(api_gen_t *g, oa_req_t *r, const proto_error_t *e, const proto_usage_t *u,
                     int64_t cached)
{
    oa_choice_t *c = &r->choices[0];
    proto_error_t oom;
    if (!e && (c->acc.oom || c->oom)) {
        proto_error_set(&oom, PROTO_ERR_INTERNAL, NULL, "out of memory");
        e = &oom;
    }
    if (e && !r->stream) {
        api_gen_reply_error(g, e);
        return;
    }
    if (r->stream && !e) {
        if (r->item_next == 0) /* nothing said: one empty message */
            rsp_open_message(g, r, c);
        rsp_close(g, r, c);
    }
    char *j = rsp_object(g, r, e, u, cached, 1);
    if (j && !e && r->store && r->session_id[0])
        api_responses_put(g->app, r->id, r->session_id, r->owner, j);
    if (!r->stream) {
        api_gen_reply_json(g, 200, j); /* NULL: 500 out of memory */
    } else if (j) {
        const int cut = c->finish == SRV_FINISH_LENGTH || c->finish == SRV_FINISH_TIMEOUT;
        rsp_event(g, r,
                  (proto_rsp_ev_t){.type = e     ? "response.failed"
                                           : cut ? "response.incomplete"
                                                 : "response.completed",
                                   .response = j});
    }
    proto_free(j);
}

static void oa_prepare(api_gen_t *g)
{
    oa_req_t *r = g->kd;
    if (r->session_chat) {
        srv_session_set_turn_open(g->session, 1);
        srv_session_set_has_chat(g->session, 1);
    }
}

static void oa_done(api_gen_t *g)
{
    oa_req_t *r = g->kd;
    if (g->aborted)
        return;
    proto_usage_t u;
    double ttft_s;
    int64_t cached;
    const srv_job_result_t *err_res;
    const char *gen_err = oa_totals(g, &u, &cached, &ttft_s, &err_res);

    /* the session was written before done(): its save can fail, and then
     * the answer says so */
    char perr[256] = "";
    int persist_rc = api_gen_release_session(g, 1, perr, sizeof perr);

    const char *fin0 = r->n_choices ? api_finish_reason(r->choices[0].finish) : NULL;
    api_gen_log_done(g, r->session_id[0] ? r->session_id : NULL, u.prompt_tokens,
                     u.completion_tokens, ttft_s, fin0);

    if (g->cancelled)
        return;
    proto_error_t e;
    int failed = 1;
    if (g->shutdown)
        api_engine_error(SRV_ENGINE_ESTOPPED, NULL, &e);
    else if (gen_err)
        api_gen_job_error(g, err_res, gen_err, &e);
    else if (persist_rc < 0)
        api_persist_error(persist_rc, perr, &e);
    else
        failed = 0;

    if (r->responses) {
        rsp_done(g, r, failed ? &e : NULL, &u, cached);
        return;
    }
    if (r->stream) {
        if (failed) {
            api_gen_write_error(g, &e);
            return;
        }
        if (r->anthropic) {
            const oa_choice_t *c0 = &r->choices[0];
            if (r->blk_next == 0) /* nothing said: one empty text block */
                msg_event(
                    g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TEXT_START, .index = r->blk_next++});
            r->blk_open = 1;
            msg_block_close(g, r);
            const char *sr = msg_stop_reason(c0);
            msg_event(g,
                      &(proto_msg_ev_t){.kind = PROTO_MSG_EV_MESSAGE_DELTA,
                                        .stop_reason = sr,
                                        .stop_sequence =
                                            sr && strcmp(sr, "stop_sequence") == 0 && r->n_stop == 1
                                                ? r->stop_word
                                                : NULL,
                                        .output_tokens = u.completion_tokens});
            msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_MESSAGE_STOP});
            return;
        }
        proto_resp_meta_t meta = oa_meta(g, r);
        if (r->native) {
            char *j = proto_completion_chunk_json(&meta, NULL, &u);
            proto_llama_fields_t f = native_end(g, r);
            f.content = "";
            char *jn = proto_llama_fields_json(j, &f);
            api_gen_write_json(g, jn);
            proto_free(jn);
            proto_free(j);
        } else if (r->include_usage) {
            char *j = r->chat ? proto_chat_chunk_json(&meta, NULL, 0, &u)
                              : proto_completion_chunk_json(&meta, NULL, &u);
            char *jc = proto_usage_cached_json(j, cached);
            api_gen_write_json(g, jc);
            proto_free(jc);
            proto_free(j);
        }
        api_gen_write_raw(g, PROTO_SSE_DONE, strlen(PROTO_SSE_DONE));
        return;
    }
    if (failed) {
        if (r->anthropic) {
            char *ja = proto_anthropic_error_json(&e);
            api_gen_reply_json(g, e.status, ja); /* NULL: 500 out of memory */
            proto_free(ja);
        } else {
            api_gen_reply_error(g, &e);
        }
        return;
    }
    const size_t nc = r->n_choices ? r->n_choices : 1;
    proto_choice_t *pcs = calloc(nc, sizeof(proto_choice_t));
    proto_token_logprob_t **lps = calloc(nc, sizeof(proto_token_logprob_t *));
    proto_top_logprob_t **tops = calloc(nc, sizeof(proto_top_logprob_t *));
    proto_tool_call_t **tcs = calloc(nc, sizeof(proto_tool_call_t *));
    proto_choice_tools_t *cts = calloc(nc, sizeof(proto_choice_tools_t));
    int oom = !pcs || !lps || !tops || !tcs || !cts;
    for (size_t i = 0; !oom && i < r->n_choices; i++) {
        oa_choice_t *c = &r->choices[i];
        if (c->acc.oom || c->oom) {
            oom = 1;
            break;
        }
        pcs[i].index = (int)i;
        pcs[i].text = c->acc.text ? c->acc.text : "";
        pcs[i].text_len = c->acc.len;
        pcs[i].finish_reason = choice_finish(c, c->finish);
        if (c->n_calls) {
            if (!(tcs[i] = calloc(c->n_calls, sizeof *tcs[i]))) {
                oom = 1;
                break;
            }
            for (size_t k = 0; k < c->n_calls; k++) {
                if (c->calls[k].args.oom)
                    oom = 1;
                tcs[i][k] = (proto_tool_call_t){(int)k, c->calls[k].id, c->calls[k].name,
                                                c->calls[k].args.text ? c->calls[k].args.text : "",
                                                c->calls[k].args.len};
            }
            cts[i] = (proto_choice_tools_t){tcs[i], c->n_calls};
        }
        if (r->logprobs >= 0) {
            if (api_acc_logprobs(&c->acc, g->app->tok, &lps[i], &tops[i]) < 0) {
                oom = 1;
                break;
            }
            pcs[i].has_logprobs = 1;
            pcs[i].logprobs = lps[i];
            pcs[i].n_logprobs = c->acc.n_toks;
        }
    }
    char *j = NULL;
    if (!oom) {
        proto_resp_meta_t meta = oa_meta(g, r);
        j = r->chat ? proto_chat_tools_json(&meta, pcs, cts, r->n_choices, &u)
                    : proto_completion_json(&meta, pcs, r->n_choices, &u);
    }
    char *jc = proto_usage_cached_json(j, cached);
    if (r->native && jc) {
        const oa_choice_t *c0 = &r->choices[0];
        int32_t *ids = r->return_tokens ? malloc((c0->acc.n_toks + 1) * sizeof *ids) : NULL;
        for (size_t k = 0; ids && k < c0->acc.n_toks; k++)
            ids[k] = c0->acc.toks[k].id;
        proto_llama_fields_t f = native_end(g, r);
        f.content = f.content_all;
        f.content_len = f.content_all_len;
        f.tokens = ids;
        f.n_tokens = ids ? c0->acc.n_toks : 0;
        f.with_probs = r->n_probs > 0;
        f.probs = lps ? lps[0] : NULL;
        f.n_probs = r->n_probs > 0 ? c0->acc.n_toks : 0;
        char *jn = (r->return_tokens && !ids) ? NULL : proto_llama_fields_json(jc, &f);
        free(ids);
        proto_free(jc);
        jc = jn;
    }
    if (r->anthropic && jc) {
        const oa_choice_t *c0 = &r->choices[0];
        const char *sr = msg_stop_reason(c0);
        const int word = sr && strcmp(sr, "stop_sequence") == 0;
        proto_messages_end_t me = {.id = r->id,
                                   .model = g->app->model_id,
                                   .stop_reason = sr,
                                   .stop_sequence = word && r->n_stop == 1 ? r->stop_word : NULL};
        char *ja = proto_messages_json(jc, &me);
        proto_free(jc);
        jc = ja;
    }
    api_gen_reply_json(g, 200, jc); /* NULL: 500 out of memory */
    proto_free(jc);
    proto_free(j);
    for (size_t i = 0; lps && tops && tcs && i < r->n_choices; i++) {
        free(lps[i]);
        free(tops[i]);
        free(tcs[i]);
    }
    free(tcs);
    free(cts);
    free(lps);
    free(tops);
    free(pcs);
}

static const api_gen_ops_t oa_ops = {
    .event = oa_event, .prepare = oa_prepare, .done = oa_done, .free = oa_free};

/* ---- handlers ---- */

typedef struct oa_input {
    int32_t *ids;
    size_t n;
} oa_input_t;

static void inputs_free(oa_input_t *in, size_t n)
{
    if (!in)
        return;
    for (size_t i = 0; i < n; i++)
        free(in[i].ids);
    free(in);
}

/* 1 when chat request cr has its output parsed for tool calls. */
static int tools_on(const proto_chat_req_t *cr)
{
    return cr && cr->n_tools && cr->tool_choice != PROTO_TOOL_CHOICE_NONE;
}

/* A tool-call parser per choice of r (g's), for chat request cr. */
static int tool_parsers(api_gen_t *g, oa_req_t *r, const proto_chat_req_t *cr)
{
    const int forced =
        cr->tool_choice == PROTO_TOOL_CHOICE_REQUIRED || cr->tool_choice == PROTO_TOOL_CHOICE_NAMED;
    const char *names[PROTO_MAX_TOOLS];
    size_t nn = 0;
    for (size_t i = 0; i < cr->n_tools; i++)
        if (cr->tool_choice != PROTO_TOOL_CHOICE_NAMED || i == cr->tool_named)
            names[nn++] = cr->tools[i].name;
    const int max_calls = cr->parallel_tool_calls ? PROTO_MAX_TOOL_CALLS : 1;
    for (size_t i = 0; i < r->n_choices; i++) {
        oa_choice_t *c = &r->choices[i];
        c->g = g;
        c->index = (int)i;
        c->tp = proto_tool_parser_new(names, nn, forced, max_calls, oa_tool_ev, c);
        if (!c->tp)
            return -1;
    }
    return 0;
}

/* The common tail of both endpoints: session (held or NULL), token inputs
 * [n_in] (owned, freed here), the parsed options; cr: the chat request
 * (tools), NULL for completions; bounds[n_bounds]: the prefix lengths of
 * in[0] to insert into the prefix cache. Answers req. */
static void oa_run(api_app_t *app, srv_req_t *req, int chat, const proto_gen_params_t *p,
                   const proto_chat_req_t *cr, srv_session_t *sess, oa_input_t *in, size_t n_in,
                   int session_chat, const size_t *bounds, size_t n_bounds,
                   const proto_llama_req_t *nat, int anthropic, const proto_responses_req_t *rq,
                   const char *owner)
{
    char err[512];
    oa_req_t *r = calloc(1, sizeof *r);
    if (r)
        r->choices = calloc(n_in * (size_t)p->n, sizeof *r->choices);
    if (!r || !r->choices) {
        oa_free(r);
        inputs_free(in, n_in);
        if (sess)
            srv_store_release(app->store, sess, 0, NULL, 0);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    r->chat = chat;
    r->n = p->n;
    r->n_choices = n_in * (size_t)p->n;
    r->logprobs = p->logprobs;
    r->include_usage = p->stream && p->include_usage;
    r->stream = p->stream;
    r->session_chat = session_chat;
    r->created = (int64_t)time(NULL);
    r->n_stop = p->n_stop;
    if (p->n_stop == 1)
        snprintf(r->stop_word, sizeof r->stop_word, "%s", p->stop[0]);
    if (nat) {
        r->native = 1;
        r->n_probs = nat->n_probs;
        r->return_tokens = nat->return_tokens;
    }
    char hex[33];
    srv_random_hex(hex, 12);
    snprintf(r->id, sizeof r->id, "%s%s",
             rq          ? "resp_"
             : anthropic ? "msg_"
             : chat      ? "chatcmpl-"
                         : "cmpl-",
             hex);
    if (rq) {
        r->responses = 1;
        r->store = rq->store;
        snprintf(r->prev_id, sizeof r->prev_id, "%s", rq->previous_id);
        snprintf(r->owner, sizeof r->owner, "%s", owner ? owner : "");
        r->echo = strdup(rq->echo ? rq->echo : "{}");
        if (!r->echo) {
            oa_free(r);
            inputs_free(in, n_in);
            if (sess)
                srv_store_release(app->store, sess, 0, NULL, 0);
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
            return;
        }
    }
    r->anthropic = anthropic;
    r->input_tokens = (int64_t)in[0].n;
    if (sess)
        snprintf(r->session_id, sizeof r->session_id, "%s", srv_session_id(sess));

    api_gen_t *g = api_gen_new(app, req, &oa_ops, r, n_in);
    if (!g) {
        inputs_free(in, n_in);
        if (sess)
            srv_store_release(app->store, sess, 0, NULL, 0);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    g->session = sess;
    if (tools_on(cr) && tool_parsers(g, r, cr) < 0) {
        api_gen_abort(g);
        inputs_free(in, n_in);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }

    /* the state memory this request may take, before anything is allocated:
     * per input, n states grown to the end of the answer, less the
     * session's own state, which the store counts already */
    size_t need = 0;
    {
        int64_t t0 = sess ? srv_session_tokens(sess) : 0;
        size_t have = sess ? core_attn_state_bytes(srv_session_ctx(sess)->state) : 0;
        for (size_t i = 0; i < n_in; i++) {
            size_t one = api_state_bound(app, t0 + (int64_t)in[i].n + p->max_tokens);
            need += one * (size_t)p->n;
        }
        need = need > have ? need - have : 0;
    }
    proto_error_t ae;
    if (api_gen_reserve(g, need, &ae) < 0) {
        api_gen_abort(g);
        inputs_free(in, n_in);
        api_reply_admit(req, &ae);
        return;
    }
    /* a session continued is a turn (server/store/store.h); a failure before
     * the job is submitted undoes it (the release without persist) */
    char terr[SRV_STORE_ERR_MAX] = "";
    if (sess && srv_store_turn_begin(app->store, sess, in[0].ids, in[0].n,
                                     SRV_TURN_REPLY | (session_chat ? SRV_TURN_CHAT : 0u), terr,
                                     sizeof terr) < 0) {
        api_gen_abort(g);
        inputs_free(in, n_in);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "session turn: %s", terr);
        return;
    }

    if (api_gen_grammar(g, p, &ae) < 0) {
        api_gen_abort(g);
        inputs_free(in, n_in);
        api_reply_proto(req, &ae);
        return;
    }
    core_sample_params_t sp;
    api_sample_params(p, &sp);
    if (nat && !(r->settings = proto_llama_settings_json(nat, (int64_t)sp.seed))) {
        api_gen_abort(g);
        inputs_free(in, n_in);
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n_in; i++) {
        core_error_t ce = {0};
        if (sess) {
            g->jobs[i].ctx = srv_session_ctx(sess);
        } else if (api_gen_oneshot(g, i, &sp, &ce) < 0) {
            proto_error_t e;
            api_core_error(ce.code, NULL, ce.msg, &e);
            api_gen_abort(g);
            inputs_free(in, n_in);
            api_reply_proto(req, &e);
            return;
        }
        srv_job_spec_t spec;
        srv_job_spec_init(&spec);
        spec.prompt = in[i].ids;
        spec.n_prompt = in[i].n;
        spec.max_tokens = p->max_tokens;
        spec.n_choices = p->n;
        spec.params = sp;
        spec.reseed = 1;
        spec.stops = (const char *const *)p->stop;
        spec.n_stops = p->n_stop;
        spec.ignore_eos = nat && nat->ignore_eos;
        /* a one-shot context starts from the longest cached prefix */
        if (!sess && api_prefix_plan(g, i, &spec, in[i].ids, in[i].n, in[i].n ? in[i].n - 1 : 0,
                                     p->prefix, i == 0 ? bounds : NULL, i == 0 ? n_bounds : 0,
                                     &ae) < 0) {
            api_gen_abort(g);
            inputs_free(in, n_in);
            api_reply_proto(req, &ae);
            return;
        }
        int rc = api_gen_submit(g, i, &spec, err, sizeof err);
        if (rc < 0) {
            api_gen_abort(g);
            inputs_free(in, n_in);
            if (rc == SRV_ENGINE_EINVAL && strstr(err, "n_choices")) {
                api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "n",
                               "'n' must be at most %lld on this server (--max-batch)",
                               (long long)app->cfg->max_batch);
                return;
            }
            if (rc == SRV_ENGINE_EINVAL && strstr(err, "nothing to sample")) {
                api_reply_kind(req, PROTO_ERR_INVALID_VALUE, chat ? "messages" : "prompt",
                               "'%s' is empty and there is nothing to continue from",
                               chat ? "messages" : "prompt");
                return;
            }
            api_reply_engine(req, rc, err);
            return;
        }
    }
    inputs_free(in, n_in);
    api_gen_start(g, req, p->stream, PROTO_STREAM_SSE);
    if (p->stream && rq) {
        char *j = rsp_object(g, r, NULL, NULL, 0, 0);
        rsp_event(g, r, (proto_rsp_ev_t){.type = "response.created", .response = j});
        rsp_event(g, r, (proto_rsp_ev_t){.type = "response.in_progress", .response = j});
        proto_free(j);
        if (!r->choices[0].tp)
            rsp_open_message(g, r, &r->choices[0]);
    } else if (p->stream && anthropic) {
        msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_MESSAGE_START,
                                       .id = r->id,
                                       .model = app->model_id,
                                       .input_tokens = r->input_tokens});
        if (!r->choices[0].tp) { /* all text: its block opens at once, as Anthropic's does */
            msg_event(g,
                      &(proto_msg_ev_t){.kind = PROTO_MSG_EV_TEXT_START, .index = r->blk_next++});
            r->blk_open = 1;
        }
        msg_event(g, &(proto_msg_ev_t){.kind = PROTO_MSG_EV_PING});
    } else if (p->stream && chat) {
        /* every choice opens with the assistant role, as OpenAI streams do */
        proto_resp_meta_t meta = oa_meta(g, r);
        for (size_t i = 0; i < r->n_choices; i++) {
            proto_choice_t pc = {.index = (int)i, .text = "", .text_len = 0};
            char *j = proto_chat_chunk_json(&meta, &pc, 1, NULL);
            api_gen_write_json(g, j);
            proto_free(j);
        }
    }
}

/* Acquires the request's session, or answers req and returns -1. */
static int take_session(api_app_t *app, srv_req_t *req, const char *id, srv_session_t **out)
{
    *out = NULL;
    if (!id[0])
        return 0;
    api_caller_t who;
    api_caller(app, req, &who);
    if (api_session_check(app, req, &who, id) < 0 || api_session_acquire(app, req, id, out))
        return -1; /* answered, or runs again once the session is read */
    return 0;
}

/* 1 after answering 400 when p has both "prefix" and "session". */
static int prefix_with_session(srv_req_t *req, const proto_gen_params_t *p)
{
    if (!p->session[0] || !p->prefix[0])
        return 0;
    api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "prefix",
                   "'prefix' starts a new context from a cached state; it cannot be combined "
                   "with 'session'");
    return 1;
}

static void h_completions(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_completion_req_t cr;
    proto_error_t e;
    if (proto_completion_parse(body, len, &app->limits, &cr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    if (prefix_with_session(req, &cr.p)) {
        proto_completion_free(&cr);
        return;
    }
    if (cr.p.session[0] && cr.n_prompts != 1) {
        api_reply_kind(req, PROTO_ERR_INVALID_VALUE, "session",
                       "'session' continues one prompt; got %zu prompts", cr.n_prompts);
        proto_completion_free(&cr);
        return;
    }
    srv_session_t *sess = NULL;
    if (take_session(app, req, cr.p.session, &sess) < 0) {
        proto_completion_free(&cr);
        return;
    }
    oa_input_t *in = calloc(cr.n_prompts, sizeof *in);
    if (!in) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cr.n_prompts; i++) {
        const proto_prompt_t *pr = &cr.prompts[i];
        if (pr->tokens) {
            in[i].ids = malloc((pr->n_tokens ? pr->n_tokens : 1) * sizeof *in[i].ids);
            if (!in[i].ids) {
                api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
                goto fail;
            }
            memcpy(in[i].ids, pr->tokens, pr->n_tokens * sizeof *in[i].ids);
            in[i].n = pr->n_tokens;
            continue;
        }
        core_error_t ce = {0};
        int first = !sess || srv_session_tokens(sess) == 0;
        if (api_tokenize(app, pr->text ? pr->text : "", pr->text_len, first, &in[i].ids, &in[i].n,
                         &ce) < 0) {
            char param[32];
            snprintf(param, sizeof param, cr.n_prompts > 1 ? "prompt[%zu]" : "prompt", i);
            api_core_error(ce.code, param, ce.msg, &e);
            api_reply_proto(req, &e);
            goto fail;
        }
    }
    /* the budget is the request's: its prompts together */
    size_t total = 0;
    for (size_t i = 0; i < cr.n_prompts; i++)
        total += in[i].n;
    if (api_input_budget(app, total, "prompt", &e) < 0) {
        api_reply_proto(req, &e);
        goto fail;
    }
    oa_run(app, req, 0, &cr.p, NULL, sess, in, cr.n_prompts, 0, NULL, 0, NULL, 0, NULL, NULL);
    proto_completion_free(&cr);
    return;
fail:
    inputs_free(in, cr.n_prompts);
    if (sess)
        srv_store_release(app->store, sess, 0, NULL, 0);
    proto_completion_free(&cr);
}

/* POST /completion, /completions: llama.cpp's native API, answered with
 * OpenAI's completion fields and llama.cpp's side by side (one prompt, one
 * choice), so clients of either shape read it. */
static void h_native(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_llama_req_t lr;
    proto_error_t e;
    if (proto_llama_parse(body, len, &app->limits, &lr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    srv_session_t *sess = NULL;
    oa_input_t *in = NULL;
    if (prefix_with_session(req, &lr.c.p) || take_session(app, req, lr.c.p.session, &sess) < 0)
        goto out;
    in = calloc(1, sizeof *in);
    if (!in) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    /* the prompt's parts in order (one part unless it mixes text and ids) */
    const proto_prompt_t *parts = lr.parts ? lr.parts : lr.c.prompts;
    const size_t n_parts = lr.parts ? lr.n_parts : 1;
    const int first = !sess || srv_session_tokens(sess) == 0;
    for (size_t k = 0; k < n_parts; k++) {
        const proto_prompt_t *pr = &parts[k];
        int32_t *ids = NULL;
        size_t n = 0;
        if (pr->tokens) {
            n = pr->n_tokens;
            ids = malloc((n ? n : 1) * sizeof *ids);
            if (ids)
                memcpy(ids, pr->tokens, n * sizeof *ids);
        } else {
            core_error_t ce = {0};
            if (api_tokenize(app, pr->text ? pr->text : "", pr->text_len, first && k == 0, &ids, &n,
                             &ce) < 0) {
                api_core_error(ce.code, "prompt", ce.msg, &e);
                api_reply_proto(req, &e);
                goto fail;
            }
        }
        int32_t *all = ids ? realloc(in->ids, (in->n + n + 1) * sizeof *all) : NULL;
        if (!all) {
            free(ids);
            api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
            goto fail;
        }
        memcpy(all + in->n, ids, n * sizeof *ids);
        free(ids);
        in->ids = all;
        in->n += n;
    }
    if (api_input_budget(app, in->n, "prompt", &e) < 0) {
        api_reply_proto(req, &e);
        goto fail;
    }
    oa_run(app, req, 0, &lr.c.p, NULL, sess, in, 1, 0, NULL, 0, &lr, 0, NULL, NULL);
    goto out;
fail:
    inputs_free(in, 1);
    if (sess)
        srv_store_release(app->store, sess, 0, NULL, 0);
out:
    proto_llama_free(&lr);
}

/* Appends ids[n] to in (0, or -1 when out of memory). */
static int input_add(oa_input_t *in, const int32_t *ids, size_t n)
{
    int32_t *all = realloc(in->ids, (in->n + n + 1) * sizeof *all);
    if (!all)
        return -1;
    if (n)
        memcpy(all + in->n, ids, n * sizeof *ids);
    in->ids = all;
    in->n += n;
    return 0;
}

/* Appends the tokens of text (plain text: special-token texts in it stay
 * text; the model's BOS when bos). 0, or -1 after answering req. */
static int input_text(api_app_t *app, srv_req_t *req, oa_input_t *in, const char *text, size_t len,
                      int bos, const char *param)
{
    int32_t *ids = NULL;
    size_t n = 0;
    core_error_t ce = {0};
    unsigned flags = bos ? CORE_TOK_ADD_SPECIAL : 0u;
    if (core_tokenizer_encode_alloc(app->tok, text ? text : "", len, 0,
                                    (size_t)app->limits.max_prompt_tokens, flags, &ids, &n,
                                    &ce) < 0) {
        proto_error_t e;
        api_core_error(ce.code, param, ce.msg, &e);
        api_reply_proto(req, &e);
        free(ids);
        return -1;
    }
    int rc = input_add(in, ids, n);
    free(ids);
    if (rc < 0)
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return rc;
}

/* POST /infill (llama.cpp's): the model writes what goes between
 * input_prefix and input_suffix, from the fill-in-the-middle prompt
 * <fim_prefix>prefix<fim_suffix>suffix<fim_middle>prompt (prefix, suffix and
 * middle first: the order SmolLM2 and StarCoder were trained on); a model
 * without those tokens gets 400. Answered as /completion. */
static void h_infill(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_infill_req_t ir;
    proto_error_t e;
    if (proto_infill_parse(body, len, &app->limits, &ir, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    int32_t fim[3];
    oa_input_t *in = NULL;
    if (!api_fim_tokens(app, fim)) {
        api_reply_kind(req, PROTO_ERR_UNSUPPORTED, NULL,
                       "this model's vocabulary has no fill-in-the-middle tokens (<fim_prefix>, "
                       "<fim_suffix>, <fim_middle>): /infill needs a model trained for it");
        goto out;
    }
    if (ir.l.c.p.session[0] || ir.l.c.p.prefix[0]) {
        api_reply_kind(req, PROTO_ERR_UNSUPPORTED, ir.l.c.p.session[0] ? "session" : "prefix",
                       "/infill starts from its own prompt; 'session' and 'prefix' are not "
                       "taken");
        goto out;
    }
    if (!(in = calloc(1, sizeof *in))) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto out;
    }
    /* the BOS the model wants, then the markers around the plain texts */
    if (input_text(app, req, in, "", 0, 1, "input_prefix") < 0 || input_add(in, &fim[0], 1) < 0 ||
        input_text(app, req, in, ir.prefix, ir.prefix_len, 0, "input_prefix") < 0 ||
        input_add(in, &fim[1], 1) < 0 ||
        input_text(app, req, in, ir.suffix, ir.suffix_len, 0, "input_suffix") < 0 ||
        input_add(in, &fim[2], 1) < 0)
        goto fail;
    const proto_prompt_t *parts = ir.l.parts ? ir.l.parts : ir.l.c.prompts;
    const size_t n_parts = ir.l.parts ? ir.l.n_parts : 1;
    for (size_t k = 0; k < n_parts; k++) {
        if (parts[k].tokens
                ? input_add(in, parts[k].tokens, parts[k].n_tokens) < 0
                : input_text(app, req, in, parts[k].text, parts[k].text_len, 0, "prompt") < 0)
            goto fail;
    }
    if (api_input_budget(app, in->n, "input_prefix", &e) < 0) {
        api_reply_proto(req, &e);
        goto fail;
    }
    oa_run(app, req, 0, &ir.l.c.p, NULL, NULL, in, 1, 0, NULL, 0, &ir.l, 0, NULL, NULL);
    goto out;
fail:
    inputs_free(in, 1);
out:
    proto_infill_free(&ir);
}

static void h_chat(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_chat_req_t cr;
    proto_error_t e;
    if (proto_chat_parse(body, len, &app->limits, &cr, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    if (prefix_with_session(req, &cr.p)) {
        proto_chat_free(&cr);
        return;
    }
    srv_session_t *sess = NULL;
    if (take_session(app, req, cr.p.session, &sess) < 0) {
        proto_chat_free(&cr);
        return;
    }
    core_error_t ce = {0};
    int empty = !sess || srv_session_tokens(sess) == 0;
    oa_input_t *in = calloc(1, sizeof *in);
    if (!in) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    /* tool_choice "none": the tools are not shown to the model at all */
    if (api_chat_tokens_tools(app, cr.messages, cr.n_messages, cr.tools,
                              tools_on(&cr) ? cr.n_tools : 0, !empty,
                              sess ? srv_session_turn_open(sess) : 0, 1, cr.parse_special, empty,
                              &in->ids, &in->n, &ce) < 0) {
        api_core_error(ce.code, "messages", ce.msg, &e);
        api_reply_proto(req, &e);
        goto fail;
    }
    if (api_input_budget(app, in->n, "messages", &e) < 0) {
        api_reply_proto(req, &e);
        goto fail;
    }
    size_t bounds[SRV_ENGINE_MAX_SNAPS];
    size_t n_bounds = sess ? 0
                           : api_prefix_chat_bounds(app, cr.messages, cr.n_messages, cr.tools,
                                                    tools_on(&cr) ? cr.n_tools : 0,
                                                    cr.parse_special, in->ids, in->n, bounds);
    oa_run(app, req, 1, &cr.p, &cr, sess, in, 1, sess != NULL, bounds, n_bounds, NULL, 0, NULL,
           NULL);
    proto_chat_free(&cr);
    return;
fail:
    inputs_free(in, 1);
    if (sess)
        srv_store_release(app->store, sess, 0, NULL, 0);
    proto_chat_free(&cr);
}

/* Answers an error in Anthropic's shape. */
static void reply_anthropic(srv_req_t *req, const proto_error_t *e)
{
    char *j = proto_anthropic_error_json(e);
    srv_reply_json(req, j ? e->status : 500,
                   j ? j
                     : "{\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                       "\"message\":\"out of memory\"}}");
    proto_free(j);
}

/* POST /v1/messages: Anthropic's Messages API, the subset docs/API.md lists,
 * run as the chat request it stands for. */
static void h_messages(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_chat_req_t cr;
    proto_error_t e;
    if (proto_messages_parse(body, len, &app->limits, &cr, &e) < 0) {
        reply_anthropic(req, &e);
        return;
    }
    core_error_t ce = {0};
    oa_input_t *in = calloc(1, sizeof *in);
    if (!in) {
        proto_error_set(&e, PROTO_ERR_INTERNAL, NULL, "out of memory");
        reply_anthropic(req, &e);
        goto out;
    }
    if (api_chat_tokens_tools(app, cr.messages, cr.n_messages, cr.tools,
                              tools_on(&cr) ? cr.n_tools : 0, 0, 0, 1, 0, 1, &in->ids, &in->n,
                              &ce) < 0) {
        api_core_error(ce.code, "messages", ce.msg, &e);
        reply_anthropic(req, &e);
        inputs_free(in, 1);
        goto out;
    }
    if (api_input_budget(app, in->n, "messages", &e) < 0) {
        reply_anthropic(req, &e);
        inputs_free(in, 1);
        goto out;
    }
    size_t bounds[SRV_ENGINE_MAX_SNAPS];
    size_t n_bounds =
        api_prefix_chat_bounds(app, cr.messages, cr.n_messages, cr.tools,
                               tools_on(&cr) ? cr.n_tools : 0, 0, in->ids, in->n, bounds);
    oa_run(app, req, 1, &cr.p, &cr, NULL, in, 1, 0, bounds, n_bounds, NULL, 1, NULL, NULL);
out:
    proto_chat_free(&cr);
}

/* POST /v1/messages/count_tokens: the prompt's tokens of a Messages
 * request, as /v1/messages renders it (nothing runs). */
static void h_messages_count(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_chat_req_t cr;
    proto_error_t e;
    if (proto_messages_count_parse(body, len, &app->limits, &cr, &e) < 0) {
        reply_anthropic(req, &e);
        return;
    }
    core_error_t ce = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (api_chat_tokens_tools(app, cr.messages, cr.n_messages, cr.tools,
                              tools_on(&cr) ? cr.n_tools : 0, 0, 0, 1, 0, 1, &ids, &n, &ce) < 0) {
        api_core_error(ce.code, "messages", ce.msg, &e);
        reply_anthropic(req, &e);
    } else {
        char j[64];
        snprintf(j, sizeof j, "{\"input_tokens\":%zu}", n);
        srv_reply_json(req, 200, j);
    }
    free(ids);
    proto_chat_free(&cr);
}

/* POST /v1/responses: OpenAI's Responses API, the subset docs/API.md lists,
 * run as the chat request it stands for; with "store" on a session of its
 * own (a new one, or a copy of previous_response_id's: api_responses.c). */
static void h_responses(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    size_t len = 0;
    const char *body = srv_req_body(req, &len);
    proto_responses_req_t rq;
    proto_error_t e;
    if (proto_responses_parse(body, len, &app->limits, &rq, &e) < 0) {
        api_reply_proto(req, &e);
        return;
    }
    proto_chat_req_t *cr = &rq.chat;
    api_caller_t who;
    api_caller(app, req, &who);
    srv_session_t *sess = NULL;
    oa_input_t *in = NULL;
    int fresh = 0;
    if (rq.previous_id[0]) {
        char sid[PROTO_SESSION_ID_LEN + 1], fork[PROTO_SESSION_ID_LEN + 1];
        if (!rq.store) {
            api_reply_kind(req, PROTO_ERR_UNSUPPORTED, "store",
                           "'previous_response_id' with 'store': false is not supported: the "
                           "continuation runs on a copy of the stored response's session, "
                           "which is a stored response");
            goto out;
        }
        if (api_responses_find(app, rq.previous_id, &who, sid) < 0) {
            api_reply_kind(req, PROTO_ERR_NOT_FOUND, "previous_response_id",
                           "Previous response with id '%s' not found.", rq.previous_id);
            goto out;
        }
        /* the response keeps its state: the continuation runs on a copy */
        if (api_responses_branch(app, req, sid, who.owner, fork) != 0)
            goto out; /* answered, or runs again once the copy is made */
        if (take_session(app, req, fork, &sess) < 0)
            goto out; /* answered, or runs again once the session is read */
        api_responses_branch_taken(app, fork);
        fresh = 1;
    } else if (rq.store) {
        char why[512], err[SRV_STORE_ERR_MAX] = "";
        if (srv_store_health(app->store, why, sizeof why) < 0) {
            proto_error_set(&e, PROTO_ERR_UNAVAILABLE, NULL, "%s", why);
            e.code = "session_store_unavailable";
            api_reply_admit(req, &e);
            goto out;
        }
        int rc = srv_store_create(app->store, &sess, err, sizeof err);
        if (rc < 0) {
            api_reply_store(req, rc, NULL, err);
            goto out;
        }
        srv_session_set_owner(sess, who.owner, NULL, 0);
        fresh = 1;
    }
    core_error_t ce = {0};
    const int empty = !sess || srv_session_tokens(sess) == 0;
    if (!(in = calloc(1, sizeof *in))) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    if (api_chat_tokens_tools(
            app, cr->messages, cr->n_messages, cr->tools, tools_on(cr) ? cr->n_tools : 0, !empty,
            sess ? srv_session_turn_open(sess) : 0, 1, 0, empty, &in->ids, &in->n, &ce) < 0) {
        api_core_error(ce.code, "input", ce.msg, &e);
        api_reply_proto(req, &e);
        goto fail;
    }
    if (api_input_budget(app, in->n, "input", &e) < 0) {
        api_reply_proto(req, &e);
        goto fail;
    }
    size_t bounds[SRV_ENGINE_MAX_SNAPS];
    size_t n_bounds =
        sess ? 0
             : api_prefix_chat_bounds(app, cr->messages, cr->n_messages, cr->tools,
                                      tools_on(cr) ? cr->n_tools : 0, 0, in->ids, in->n, bounds);
    oa_run(app, req, 1, &cr->p, cr, sess, in, 1, sess != NULL, bounds, n_bounds, NULL, 0, &rq,
           who.owner);
    goto out;
fail:
    inputs_free(in, 1);
    if (sess) {
        char id[PROTO_SESSION_ID_LEN + 1];
        snprintf(id, sizeof id, "%s", srv_session_id(sess));
        srv_store_release(app->store, sess, 0, NULL, 0);
        if (fresh) /* a session that never held anything is not kept */
            srv_store_delete(app->store, id, NULL, 0);
    }
out:
    proto_responses_free(&rq);
}

static void h_models(srv_req_t *req, void *ud)
{
    api_app_t *app = ud;
    proto_model_entry_t m[8];
    size_t n = api_hub_count(app);
    n = n < 8 ? n : 8;
    for (size_t i = 0; i < n; i++) {
        const api_app_t *a = api_hub_app(app, i);
        m[i] = (proto_model_entry_t){.id = a->model_id, .created = a->created,
                                     .owned_by = "darkserve"};
    }
    char *j = proto_models_json(m, n);
    if (!j) {
        api_reply_kind(req, PROTO_ERR_INTERNAL, NULL, "out of memory");
        return;
    }
    srv_reply_json(req, 200, j);
    proto_free(j);
}

int api_openai_routes(api_app_t *app)
{
    srv_route_opts_t json = {.flags = SRV_ROUTE_JSON};
    int rc = 0;
    rc |= api_route(app, "POST", "/v1/completions", h_completions, &json);
    rc |= api_route(app, "POST", "/v1/chat/completions", h_chat, &json);
    rc |= api_route(app, "GET", "/v1/models", h_models, NULL);
    rc |= api_route(app, "POST", "/completion", h_native, &json);
    rc |= api_route(app, "POST", "/completions", h_native, &json);
    rc |= api_route(app, "POST", "/infill", h_infill, &json);
    rc |= api_route(app, "POST", "/v1/messages", h_messages, &json);
    rc |= api_route(app, "POST", "/v1/messages/count_tokens", h_messages_count, &json);
    rc |= api_route(app, "POST", "/v1/responses", h_responses, &json);
    rc |= api_route(app, "POST", "/chat/completions", h_chat, &json);
    rc |= api_route(app, "GET", "/models", h_models, NULL);
    return rc ? -1 : 0;
}
