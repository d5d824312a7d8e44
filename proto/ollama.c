/* proto/ollama.c — Ollama's API: POST /api/generate and /api/chat requests
 * (with their "options"), POST /api/show, and the response shapes of
 * generate/chat lines, /api/tags, /api/ps, /api/show and errors.
 *
 * Field names and defaults are Ollama's (docs/API.md, "Ollama API"); the
 * checks are darkserve's: every value is typed and bounded, and fields
 * whose meaning darkserve cannot honour are refused instead of ignored.
 * Options are the exception, as in Ollama: an option darkserve has no use
 * for (num_ctx, num_gpu, mirostat, ...) is ignored and named in `ignored`.
 */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"
#include "proto/schema.h"

/* Ollama's sampling defaults (api.DefaultOptions). */
#define OLLAMA_TEMPERATURE 0.8
#define OLLAMA_TOP_K 40
#define OLLAMA_TOP_P 0.9
#define OLLAMA_REPEAT_PENALTY 1.1
#define OLLAMA_REPEAT_LAST_N 64

void proto_ollama_free(proto_ollama_req_t *r)
{
    if (!r)
        return;
    px_free(r->model);
    px_gen_params_free(&r->p);
    px_free(r->prompt);
    px_free(r->system);
    px_free(r->context);
    px_messages_free(r->messages, r->n_messages);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- options */

/* The list is for a log line: a name longer than 64 bytes is shown by its
 * start and "...", and a list that does not fit ends with "..."; a cut is
 * always marked. */
static void note_ignored(proto_ollama_req_t *r, const char *key)
{
    size_t have = strlen(r->ignored);
    size_t kl = strlen(key);
    int n = snprintf(r->ignored + have, sizeof r->ignored - have, "%s%.*s%s", have ? "," : "",
                     kl > 64 ? 61 : (int)kl, key, kl > 64 ? "..." : "");
    if (n < 0 || (size_t)n >= sizeof r->ignored - have)
        memcpy(r->ignored + sizeof r->ignored - 4, "...", 4);
}

/* options.<key> as a sampler number in [lo, hi] (lo excluded when lo_open). */
static int opt_number(json_t *v, const char *key, double lo, double hi, int lo_open,
                      const char *range, double *out, proto_error_t *err)
{
    char param[PROTO_ERROR_PARAM_MAX];
    px_paramf(param, "options.%s", key);
    return px_sampler_number(v, param, lo, hi, lo_open, range, out, err);
}

static int opt_int(json_t *v, const char *key, int64_t lo, int64_t hi, const char *range,
                   int64_t *out, proto_error_t *err)
{
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        *out = json_integer_value(v);
        return 0;
    }
    char param[PROTO_ERROR_PARAM_MAX], got[PX_VALUE_TEXT_MAX];
    px_paramf(param, "options.%s", key);
    px_value_text(v, got);
    return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                           "'%s' must be an integer %s (got %s)", param, range, got);
}

static int opt_stop(json_t *v, proto_gen_params_t *p, proto_error_t *err)
{
    size_t count = json_is_array(v) ? json_array_size(v) : 1;
    if ((!json_is_array(v) && !json_is_string(v)) || count > PROTO_MAX_STOP)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "options.stop",
                               "'options.stop' must be a string or an array of at most %d "
                               "strings",
                               PROTO_MAX_STOP);
    for (size_t i = 0; i < count; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        size_t n = json_is_string(s) ? json_string_length(s) : 0;
        if (!json_is_string(s) || n == 0 || n > PROTO_MAX_STOP_BYTES) {
            char ep[PROTO_ERROR_PARAM_MAX];
            px_paramf(ep, json_is_array(v) ? "options.stop[%zu]" : "options.stop", i);
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s' must be a string of 1 to %d bytes", ep,
                                   PROTO_MAX_STOP_BYTES);
        }
        p->stop[p->n_stop] = px_strndup(json_string_value(s), n);
        if (!p->stop[p->n_stop])
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        p->n_stop++;
    }
    return 0;
}

static int parse_options(json_t *root, const proto_limits_t *lim, proto_ollama_req_t *r,
                         proto_error_t *err)
{
    proto_gen_params_t *p = &r->p;
    proto_sampling_t *s = &p->sampling;
    json_t *o = px_get(root, "options");
    if (!o)
        return 0;
    if (!json_is_object(o))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "options",
                               "'options' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        int rc = 0;
        int64_t i64 = 0;
        char range[PROTO_ERROR_PARAM_MAX]; /* px_paramf writes that much */
        if (json_is_null(v))
            continue; /* null = absent, as everywhere */
        if (!strcmp(key, "temperature")) {
            rc = opt_number(v, key, 0, 2, 0, "between 0 and 2", &s->temperature, err);
        } else if (!strcmp(key, "top_p")) {
            rc = opt_number(v, key, 0, 1, 1, "greater than 0 and at most 1", &s->top_p, err);
        } else if (!strcmp(key, "min_p")) {
            rc = opt_number(v, key, 0, 1, 0, "between 0 and 1", &s->min_p, err);
        } else if (!strcmp(key, "repeat_penalty")) {
            rc = opt_number(v, key, 0, FLT_MAX, 1, PX_REPEAT_PENALTY_RANGE, &s->repeat_penalty,
                            err);
        } else if (!strcmp(key, "presence_penalty")) {
            rc = opt_number(v, key, -2, 2, 0, "between -2 and 2", &s->presence_penalty, err);
        } else if (!strcmp(key, "frequency_penalty")) {
            rc = opt_number(v, key, -2, 2, 0, "between -2 and 2", &s->frequency_penalty, err);
        } else if (!strcmp(key, "top_k")) {
            rc = opt_int(v, key, 0, INT32_MAX, "of at least 0 (0 disables it)", &i64, err);
            s->top_k = (int32_t)i64;
        } else if (!strcmp(key, "repeat_last_n")) {
            px_paramf(range, "between -1 and %d (-1: all the tokens kept for penalties)",
                      PROTO_OLLAMA_MAX_REPEAT_LAST_N);
            rc = opt_int(v, key, -1, PROTO_OLLAMA_MAX_REPEAT_LAST_N, range, &i64, err);
            r->repeat_last_n = (int32_t)i64;
        } else if (!strcmp(key, "seed")) {
            rc = opt_int(v, key, INT64_MIN, INT64_MAX, "(-1: random)", &i64, err);
            s->has_seed = i64 != -1;
            s->seed = i64;
        } else if (!strcmp(key, "num_predict")) {
            px_paramf(range, "between -2 and %lld (-1, -2 or 0: until the end, at most %lld)",
                      (long long)lim->max_tokens_limit, (long long)lim->max_tokens_limit);
            rc = opt_int(v, key, -2, lim->max_tokens_limit, range, &i64, err);
            r->unlimited = i64 <= 0;
            p->max_tokens = i64 > 0 ? i64 : lim->max_tokens_limit;
        } else if (!strcmp(key, "stop")) {
            rc = opt_stop(v, p, err);
        } else {
            note_ignored(r, key);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------- top level */

/* A field darkserve cannot honour: absent, null, false, "" or an empty
 * array/object are fine; anything else is refused. */
static int refuse_unless_empty(json_t *root, const char *key, const char *why, proto_error_t *err)
{
    json_t *v = px_get(root, key);
    if (!v || json_is_false(v) || (json_is_string(v) && json_string_length(v) == 0) ||
        (json_is_array(v) && json_array_size(v) == 0) ||
        (json_is_object(v) && json_object_size(v) == 0))
        return 0;
    char got[PX_VALUE_TEXT_MAX];
    px_value_text(v, got);
    return proto_error_set(err, PROTO_ERR_UNSUPPORTED, key, "'%s' is not supported (%s; got %s)",
                           key, why, got);
}

/* "format": "json" (any JSON object) or a JSON Schema object; "" is none.
 * Either becomes the request's grammar (proto/schema.h). */
static int parse_format(json_t *root, proto_gen_params_t *p, proto_error_t *err)
{
    json_t *v = px_get(root, "format");
    int rc;
    if (!v || (json_is_string(v) && json_string_length(v) == 0))
        return 0;
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "json") != 0)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "format",
                                   "'format' must be \"json\" or a JSON Schema object");
        rc = proto_schema_object_grammar(&p->grammar, &p->grammar_len, err);
    } else if (json_is_object(v)) {
        rc = proto_schema_grammar(v, "format", "format", &p->grammar, &p->grammar_len, err);
    } else {
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "format",
                               "'format' must be \"json\" or a JSON Schema object");
    }
    if (rc == 0)
        p->grammar_param = "format";
    return rc;
}

static int parse_messages(json_t *root, const proto_limits_t *lim, proto_ollama_req_t *r,
                          proto_error_t *err)
{
    json_t *v = px_get(root, "messages");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "messages",
                               "'messages' must be an array of messages");
    size_t count = json_array_size(v);
    if (count == 0)
        return 0;
    if (count > PROTO_MAX_MESSAGES)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "messages",
                               "'messages' has %zu messages; at most %d are allowed", count,
                               PROTO_MAX_MESSAGES);
    r->messages = px_malloc(count * sizeof *r->messages);
    if (!r->messages)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(r->messages, 0, count * sizeof *r->messages);
    r->n_messages = count;
    int64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        char mp[PROTO_ERROR_PARAM_MAX], fp[PROTO_ERROR_PARAM_MAX];
        px_paramf(mp, "messages[%zu]", i);
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, mp,
                                   "'%s' must be an object with 'role' and 'content'", mp);
        px_paramf(fp, "%s.role", mp);
        json_t *role = px_get(m, "role");
        const char *rs = json_is_string(role) ? json_string_value(role) : NULL;
        if (rs && strlen(rs) != json_string_length(role))
            rs = NULL;
        if (!role)
            return proto_error_set(err, PROTO_ERR_MISSING, fp, "'%s' is required", fp);
        if (rs && !strcmp(rs, "system"))
            r->messages[i].role = PROTO_ROLE_SYSTEM;
        else if (rs && !strcmp(rs, "user"))
            r->messages[i].role = PROTO_ROLE_USER;
        else if (rs && !strcmp(rs, "assistant"))
            r->messages[i].role = PROTO_ROLE_ASSISTANT;
        else if (rs && !strcmp(rs, "tool"))
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                   "'%s' 'tool' is not supported (darkserve has no tool calling)",
                                   fp);
        else
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp,
                                   "'%s' must be one of 'system', 'user', 'assistant'", fp);
        px_paramf(fp, "%s.images", mp);
        if (refuse_unless_empty(m, "images", "darkserve serves a text-only model", err) < 0)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                   "'%s' is not supported (darkserve serves a text-only model)",
                                   fp);
        px_paramf(fp, "%s.tool_calls", mp);
        if (refuse_unless_empty(m, "tool_calls", "darkserve has no tool calling", err) < 0)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, fp,
                                   "'%s' is not supported (darkserve has no tool calling)", fp);
        px_paramf(fp, "%s.content", mp);
        json_t *c = px_get(m, "content");
        if (c && !json_is_string(c))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, fp, "'%s' must be a string", fp);
        size_t n = c ? json_string_length(c) : 0;
        total += (int64_t)n;
        if (total > lim->max_text_bytes)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "messages",
                                   "'messages' content must total at most %lld bytes",
                                   (long long)lim->max_text_bytes);
        r->messages[i].content = px_strndup(c ? json_string_value(c) : "", n);
        if (!r->messages[i].content)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        r->messages[i].content_len = n;
    }
    return 0;
}

static int parse_text(json_t *root, const char *key, const proto_limits_t *lim, char **out,
                      size_t *len, proto_error_t *err)
{
    int rc = px_read_string(root, key, (size_t)lim->max_text_bytes, out, len, err);
    return rc < 0 ? rc : 0;
}

static int parse_generate(json_t *root, const proto_limits_t *lim, proto_ollama_req_t *r,
                          proto_error_t *err)
{
    int rc;
    if ((rc = parse_text(root, "prompt", lim, &r->prompt, &r->prompt_len, err)) < 0)
        return rc;
    if ((rc = parse_text(root, "system", lim, &r->system, &r->system_len, err)) < 0)
        return rc;
    if ((int64_t)(r->prompt_len + r->system_len) > lim->max_text_bytes)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt",
                               "'prompt' and 'system' must total at most %lld bytes",
                               (long long)lim->max_text_bytes);
    if ((rc = px_read_bool(root, "raw", &r->raw, err)) < 0)
        return rc;
    json_t *c = px_get(root, "context");
    if (c) {
        if (!json_is_array(c))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "context",
                                   "'context' must be an array of token ids");
        int64_t max = lim->max_prompt_tokens < PROTO_OLLAMA_MAX_CONTEXT ? lim->max_prompt_tokens
                                                                        : PROTO_OLLAMA_MAX_CONTEXT;
        if ((rc = px_parse_token_ids(c, "context", max, lim->n_vocab, 1, &r->context, &r->n_context,
                                     err)) < 0)
            return rc;
    }
    if ((rc = refuse_unless_empty(root, "suffix", "no fill-in-the-middle", err)) < 0)
        return rc;
    if ((rc = refuse_unless_empty(root, "template",
                                  "darkserve renders the model's chat template itself; use "
                                  "'raw': true to send a prompt already templated",
                                  err)) < 0)
        return rc;
    return refuse_unless_empty(root, "images", "darkserve serves a text-only model", err);
}

static int parse_logprobs(json_t *root, proto_ollama_req_t *r, proto_error_t *err)
{
    int want = 0, rc;
    int64_t k = 0;
    char range[PROTO_ERROR_PARAM_MAX]; /* px_paramf writes that much */
    px_paramf(range, "between 0 and %d", PROTO_MAX_LOGPROBS);
    if ((rc = px_read_bool(root, "logprobs", &want, err)) < 0)
        return rc;
    rc = px_read_int(root, "top_logprobs", 0, PROTO_MAX_LOGPROBS, range, &k, err);
    if (rc < 0)
        return rc;
    if (rc == 0 && k > 0 && !want)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "top_logprobs",
                               "'top_logprobs' requires 'logprobs' to be true");
    r->p.logprobs = want ? (int)k : -1;
    return 0;
}

int proto_ollama_parse(const char *body, size_t len, int chat, const proto_limits_t *lim_in,
                       proto_ollama_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    out->chat = chat;
    proto_gen_params_t *p = &out->p;
    p->n = 1;
    p->logprobs = -1;
    p->stream = 1;
    p->max_tokens = lim.max_tokens_limit;
    out->unlimited = 1;
    p->sampling.temperature = OLLAMA_TEMPERATURE;
    p->sampling.top_k = OLLAMA_TOP_K;
    p->sampling.top_p = OLLAMA_TOP_P;
    p->sampling.repeat_penalty = OLLAMA_REPEAT_PENALTY;
    out->repeat_last_n = OLLAMA_REPEAT_LAST_N;

    size_t mlen = 0;
    if ((rc = px_read_string(root, "model", PROTO_MAX_NAME_BYTES, &out->model, &mlen, err)) < 0)
        goto fail;
    if (!out->model || mlen == 0) {
        rc = proto_error_set(err, PROTO_ERR_MISSING, "model", "model is required");
        goto fail;
    }
    if ((rc = px_read_bool(root, "stream", &p->stream, err)) < 0)
        goto fail;
    json_t *ka = px_get(root, "keep_alive"); /* the model never unloads: accepted, no effect */
    if (ka && !json_is_string(ka) && !json_is_number(ka)) {
        rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "keep_alive",
                             "'keep_alive' must be a duration string (\"5m\") or a number of "
                             "seconds");
        goto fail;
    }
    if ((rc = parse_format(root, p, err)) < 0)
        goto fail;
    json_t *think = px_get(root, "think");
    if (think && !json_is_boolean(think) && !json_is_string(think)) {
        rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "think",
                             "'think' must be a boolean or a string");
        goto fail;
    }
    if ((rc = refuse_unless_empty(root, "think", "the model does not think", err)) < 0)
        goto fail;
    if ((rc = parse_logprobs(root, out, err)) < 0)
        goto fail;
    /* on both routes: /api/generate has no tools either, and a field
     * darkserve cannot honour is refused, never ignored */
    if ((rc = refuse_unless_empty(root, "tools", "darkserve has no tool calling", err)) < 0)
        goto fail;
    if (chat) {
        if ((rc = parse_messages(root, &lim, out, err)) < 0)
            goto fail;
    } else if ((rc = parse_generate(root, &lim, out, err)) < 0) {
        goto fail;
    }
    if ((rc = parse_options(root, &lim, out, err)) < 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_ollama_free(out);
    return rc;
}

int proto_ollama_show_parse(const char *body, size_t len, char **name, proto_error_t *err)
{
    int rc = 0;
    *name = NULL;
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    const char *key = px_get(root, "model") ? "model" : "name";
    size_t n = 0;
    rc = px_read_string(root, key, PROTO_MAX_NAME_BYTES, name, &n, err);
    if (rc == 0 && n == 0) {
        px_free(*name);
        *name = NULL;
        rc = 1;
    }
    if (rc == 1)
        rc = proto_error_set(err, PROTO_ERR_MISSING, "model", "model is required");
    json_decref(root);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------- responses */

static json_t *fail_tree(json_t *j)
{
    json_decref(j);
    return NULL;
}

char *proto_ollama_resp_json(const proto_ollama_resp_t *r)
{
    json_t *o = json_object();
    int bad = 0;
    bad |= json_object_set_new(o, "model", px_cstr_or_null(r->model ? r->model : ""));
    bad |=
        json_object_set_new(o, "created_at", px_cstr_or_null(r->created_at ? r->created_at : ""));
    json_t *text = px_str(r->text, r->text ? r->text_len : 0);
    if (r->chat) {
        json_t *m = json_object();
        bad |= json_object_set_new(m, "role", json_string("assistant"));
        bad |= json_object_set_new(m, "content", text);
        bad |= json_object_set_new(o, "message", m);
    } else {
        bad |= json_object_set_new(o, "response", text);
    }
    bad |= json_object_set_new(o, "done", json_boolean(r->done));
    if (r->done)
        bad |= json_object_set_new(o, "done_reason",
                                   px_cstr_or_null(r->done_reason ? r->done_reason : "stop"));
    if (r->context) {
        json_t *a = json_array();
        for (size_t i = 0; i < r->n_context; i++)
            bad |= json_array_append_new(a, json_integer(r->context[i]));
        bad |= json_object_set_new(o, "context", a);
    }
    if (r->with_stats) {
        bad |= json_object_set_new(o, "total_duration", json_integer(r->total_duration));
        bad |= json_object_set_new(o, "load_duration", json_integer(r->load_duration));
        bad |= json_object_set_new(o, "prompt_eval_count", json_integer(r->prompt_eval_count));
        bad |=
            json_object_set_new(o, "prompt_eval_duration", json_integer(r->prompt_eval_duration));
        bad |= json_object_set_new(o, "eval_count", json_integer(r->eval_count));
        bad |= json_object_set_new(o, "eval_duration", json_integer(r->eval_duration));
    }
    if (r->with_logprobs) {
        json_t *a = json_array();
        for (size_t i = 0; i < r->n_logprobs; i++)
            bad |= json_array_append_new(a, px_chat_logprob_entry(&r->logprobs[i]));
        bad |= json_object_set_new(o, "logprobs", a);
    }
    return bad ? (json_decref(o), NULL) : px_dump(o);
}

static json_t *details(const proto_ollama_model_t *m)
{
    json_t *d = json_object(), *fam = json_array();
    int bad = 0;
    bad |= json_array_append_new(fam, px_cstr_or_null(m->family ? m->family : ""));
    bad |= json_object_set_new(d, "parent_model", json_string(""));
    bad |= json_object_set_new(d, "format", json_string("gguf"));
    bad |= json_object_set_new(d, "family", px_cstr_or_null(m->family ? m->family : ""));
    bad |= json_object_set_new(d, "families", fam);
    bad |= json_object_set_new(d, "parameter_size",
                               px_cstr_or_null(m->parameter_size ? m->parameter_size : ""));
    bad |= json_object_set_new(d, "quantization_level",
                               px_cstr_or_null(m->quantization_level ? m->quantization_level : ""));
    return bad ? fail_tree(d) : d;
}

char *proto_ollama_models_json(const proto_ollama_model_t *m, size_t n, int ps)
{
    json_t *root = json_object(), *arr = json_array();
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_object();
        bad |= json_object_set_new(e, "name", px_cstr_or_null(m[i].name ? m[i].name : ""));
        bad |= json_object_set_new(e, "model", px_cstr_or_null(m[i].name ? m[i].name : ""));
        if (!ps)
            bad |= json_object_set_new(e, "modified_at",
                                       px_cstr_or_null(m[i].modified_at ? m[i].modified_at : ""));
        bad |= json_object_set_new(e, "size", json_integer(m[i].size));
        bad |= json_object_set_new(e, "digest", px_cstr_or_null(m[i].digest ? m[i].digest : ""));
        bad |= json_object_set_new(e, "details", details(&m[i]));
        if (ps) {
            bad |= json_object_set_new(e, "expires_at",
                                       px_cstr_or_null(m[i].expires_at ? m[i].expires_at : ""));
            bad |= json_object_set_new(e, "size_vram", json_integer(0));
            if (m[i].context_length > 0)
                bad |= json_object_set_new(e, "context_length", json_integer(m[i].context_length));
        }
        bad |= json_array_append_new(arr, e);
    }
    bad |= json_object_set_new(root, "models", arr);
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_ollama_show_json(const proto_ollama_model_t *m, const proto_ollama_info_t *in,
                             const char *modelfile, const char *template_text)
{
    json_t *root = json_object(), *mi = json_object(), *caps = json_array();
    int bad = 0;
    px_buf_t key = {0}; /* "<arch>.<name>": as long as the model's architecture name */
    const char *arch = in->arch ? in->arch : "";
    bad |= json_object_set_new(mi, "general.architecture", px_cstr_or_null(arch));
    bad |= json_object_set_new(mi, "general.name", px_cstr_or_null(in->name ? in->name : ""));
    bad |= json_object_set_new(mi, "general.parameter_count", json_integer(in->n_params));
    static const char *const keys[] = {
        "context_length",       "embedding_length",        "feed_forward_length", "block_count",
        "attention.head_count", "attention.head_count_kv", "vocab_size"};
    const int64_t vals[] = {in->n_ctx_train, in->n_embd,    in->n_ff,   in->n_layer,
                            in->n_head,      in->n_head_kv, in->n_vocab};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        key.n = 0;
        bad |= px_buf_printf(&key, "%s.%s", arch, keys[i]) < 0;
        bad |= bad || json_object_set_new(mi, key.p, json_integer(vals[i]));
    }
    key.n = 0;
    bad |= px_buf_printf(&key, "%s.rope.freq_base", arch) < 0;
    bad |= bad || json_object_set_new(mi, key.p, px_real(in->rope_base, 0));
    px_free(key.p);
    bad |= json_object_set_new(mi, "darkserve.attention",
                               px_cstr_or_null(in->attention ? in->attention : ""));
    if (in->system_fingerprint)
        bad |= json_object_set_new(mi, "darkserve.system_fingerprint",
                                   px_cstr_or_null(in->system_fingerprint));
    bad |= json_array_append_new(caps, json_string("completion"));
    bad |= json_object_set_new(root, "modelfile", px_cstr_or_null(modelfile ? modelfile : ""));
    bad |= json_object_set_new(root, "parameters", json_string(""));
    bad |=
        json_object_set_new(root, "template", px_cstr_or_null(template_text ? template_text : ""));
    bad |= json_object_set_new(root, "details", details(m));
    bad |= json_object_set_new(root, "model_info", mi);
    bad |= json_object_set_new(root, "capabilities", caps);
    bad |= json_object_set_new(root, "modified_at",
                               px_cstr_or_null(m->modified_at ? m->modified_at : ""));
    return bad ? (json_decref(root), NULL) : px_dump(root);
}

char *proto_ollama_error_json(const proto_error_t *err)
{
    json_t *o = json_object();
    int bad = json_object_set_new(o, "error", px_str(err->message, strlen(err->message)));
    return bad ? (json_decref(o), NULL) : px_dump(o);
}
