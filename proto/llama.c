/* proto/llama.c — llama.cpp's native completion API (POST /completion,
 * /completions): its request fields on top of the OpenAI completions ones,
 * and the fields its answers and stream chunks carry (docs/API.md, "POST
 * /completion"). Fields of llama.cpp's samplers darkserve does not have are
 * refused unless they hold the value that turns them off.
 */
#include <math.h>
#include <string.h>

#include "proto/proto_impl.h"

void proto_llama_free(proto_llama_req_t *r)
{
    if (!r)
        return;
    proto_completion_free(&r->c);
    if (r->parts) {
        for (size_t i = 0; i < r->n_parts; i++) {
            px_free(r->parts[i].text);
            px_free(r->parts[i].tokens);
        }
        px_free(r->parts);
    }
    memset(r, 0, sizeof *r);
}

/* A "mixed" prompt: one array holding both strings and token ids, read as
 * one prompt in that order (consecutive ids form one part). 1 when prompt is
 * such an array (parsed into r->parts), 0 when it is not, <0 on error. */
static int parse_mixed(json_t *root, const proto_limits_t *lim, proto_llama_req_t *r,
                       proto_error_t *err)
{
    json_t *v = px_get(root, "prompt");
    if (!json_is_array(v))
        return 0;
    int ints = 0, strs = 0;
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        ints |= json_is_integer(e);
        strs |= json_is_string(e);
    }
    if (!(ints && strs))
        return 0;
    r->parts = px_malloc(n * sizeof *r->parts);
    if (!r->parts)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(r->parts, 0, n * sizeof *r->parts);
    int64_t left_bytes = lim->max_text_bytes, left_ids = lim->max_prompt_tokens;
    for (size_t i = 0; i < n;) {
        json_t *e = json_array_get(v, i);
        char ep[PROTO_ERROR_PARAM_MAX];
        px_paramf(ep, "prompt[%zu]", i);
        proto_prompt_t *p = &r->parts[r->n_parts++];
        if (json_is_string(e)) {
            size_t len = json_string_length(e);
            if ((int64_t)len > left_bytes)
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                       "'prompt' is too long: at most %lld bytes of text",
                                       (long long)lim->max_text_bytes);
            left_bytes -= (int64_t)len;
            if (!(p->text = px_strndup(json_string_value(e), len)))
                return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
            p->text_len = len;
            i++;
            continue;
        }
        size_t k = i;
        while (k < n && json_is_integer(json_array_get(v, k)))
            k++;
        if (k == i)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                   "'%s' must be a string or a token id (a mixed prompt)", ep);
        if ((int64_t)(k - i) > left_ids)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "prompt",
                                   "'prompt' has more than %lld token ids",
                                   (long long)lim->max_prompt_tokens);
        left_ids -= (int64_t)(k - i);
        if (!(p->tokens = px_malloc((k - i) * sizeof *p->tokens)))
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        for (size_t j = i; j < k; j++) {
            json_int_t id = json_integer_value(json_array_get(v, j));
            if (id < 0 || id >= lim->n_vocab) {
                px_paramf(ep, "prompt[%zu]", j);
                return proto_error_set(err, PROTO_ERR_INVALID_VALUE, ep,
                                       "'%s' must be a token id between 0 and %lld", ep,
                                       (long long)(lim->n_vocab - 1));
            }
            p->tokens[p->n_tokens++] = (int32_t)id;
        }
        i = k;
    }
    /* one (empty) prompt stands for the parts */
    r->c.prompts = px_malloc(sizeof *r->c.prompts);
    if (!r->c.prompts)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(r->c.prompts, 0, sizeof *r->c.prompts);
    r->c.n_prompts = 1;
    return 1;
}

/* A llama.cpp sampler field darkserve has no sampler for: absent, null or
 * the value that turns it off is fine; anything else is refused. */
static int off_only(json_t *root, const char *key, double off, proto_error_t *err)
{
    json_t *v = px_get(root, key);
    if (!v)
        return 0;
    if (json_is_number(v) && json_number_value(v) == off)
        return 0;
    if (json_is_boolean(v) && !json_is_true(v) && off == 0)
        return 0;
    char got[PX_VALUE_TEXT_MAX];
    px_value_text(v, got);
    return proto_error_set(err, PROTO_ERR_UNSUPPORTED, key,
                           "'%s' is not supported (got %s; only %g, which turns it off, is "
                           "accepted)",
                           key, got, off);
}

static int parse_native(json_t *root, const proto_limits_t *lim, proto_llama_req_t *r,
                        proto_error_t *err)
{
    int rc;
    int64_t np = 0;
    if ((rc = px_read_int(root, "n_predict", -1, lim->max_tokens_limit,
                          "between -1 (the server's limit) and the max_tokens limit", &np, err)) <
        0)
        return rc;
    if (rc == 0) {
        if (np == 0)
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "n_predict",
                                   "'n_predict': 0 (evaluate the prompt only) is not supported; "
                                   "give -1 or at least 1");
        json_t *mt = px_get(root, "max_tokens");
        int64_t want = np < 0 ? lim->max_tokens_limit : np;
        if (mt && (!json_is_integer(mt) || json_integer_value(mt) != want))
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "n_predict",
                                   "'n_predict' and 'max_tokens' disagree; give one of them");
        r->c.p.max_tokens = want;
    }
    int64_t probs = 0;
    if ((rc = px_read_int(root, "n_probs", 0, PROTO_MAX_LOGPROBS, "between 0 and 20", &probs,
                          err)) < 0)
        return rc;
    if (probs > 0) {
        if (r->c.p.logprobs >= 0)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "n_probs",
                                   "'n_probs' and 'logprobs' cannot be given together");
        r->c.p.logprobs = (int)probs;
        r->n_probs = (int)probs;
    }
    if ((rc = px_read_bool(root, "ignore_eos", &r->ignore_eos, err)) < 0 ||
        (rc = px_read_bool(root, "return_tokens", &r->return_tokens, err)) < 0)
        return rc;
    /* the prefix cache is always on and never changes an answer: both
     * values are honoured (docs/API.md) */
    int cache = 1;
    if ((rc = px_read_bool(root, "cache_prompt", &cache, err)) < 0)
        return rc;
    /* darkserve never drops context, so what n_keep would keep is kept */
    int64_t keep = 0;
    if ((rc = px_read_int(root, "n_keep", -1, INT32_MAX, "of at least -1", &keep, err)) < 0)
        return rc;
    int64_t slot = -1;
    if ((rc = px_read_int(root, "id_slot", -1, 0, "of -1 or 0 (darkserve has no slots)", &slot,
                          err)) < 0)
        return rc;
    static const struct {
        const char *key;
        double off;
    } off[] = {{"mirostat", 0},
               {"typical_p", 1},
               {"tfs_z", 1},
               {"dynatemp_range", 0},
               {"xtc_probability", 0},
               {"dry_multiplier", 0},
               {"top_n_sigma", -1},
               {"n_indent", 0},
               {"t_max_predict_ms", 0},
               {"penalize_nl", 0},
               {"post_sampling_probs", 0},
               {"timings_per_token", 0},
               {"n_cmpl", 1}};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if ((rc = off_only(root, off[i].key, off[i].off, err)) < 0)
            return rc;
    static const char *const never[] = {
        "samplers",        "lora",         "response_fields", "image_data",
        "multimodal_data", "input_prefix", "input_suffix"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) {
        json_t *v = px_get(root, never[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0) &&
            !(json_is_string(v) && json_string_length(v) == 0))
            return proto_error_set(err, PROTO_ERR_UNSUPPORTED, never[i],
                                   "'%s' is not supported by darkserve's /completion", never[i]);
    }
    if (r->c.p.n != 1)
        return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "n",
                               "'n' above 1 is answered by /v1/completions; /completion gives "
                               "one completion per prompt");
    return 0;
}

/* llama.cpp's list form of logit_bias, [[id, bias], ...] (bias false: the
 * token is never sampled), as the object form {"<id>": bias} the common
 * parser reads (false: -100, which bans it); a text in place of an id is
 * refused. 0, or an error. */
static int logit_bias_pairs(json_t *root, proto_error_t *err)
{
    json_t *v = px_get(root, "logit_bias");
    if (!json_is_array(v))
        return 0;
    json_t *o = json_object();
    if (!o)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        json_t *id = json_array_get(e, 0), *b = json_array_get(e, 1);
        char ep[PROTO_ERROR_PARAM_MAX];
        px_paramf(ep, "logit_bias[%zu]", i);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(id) ||
            json_integer_value(id) < 0 || !(json_is_number(b) || json_is_false(b))) {
            json_decref(o);
            return proto_error_set(
                err, json_is_string(id) ? PROTO_ERR_UNSUPPORTED : PROTO_ERR_INVALID_VALUE, ep,
                "'%s' must be [token id, bias] (a bias between -100 and 100, "
                "or false); texts in place of ids are not supported (POST "
                "/tokenize gives ids)",
                ep);
        }
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(id));
        if (json_object_set_new(o, key, json_is_false(b) ? json_real(-100.0) : json_incref(b)) <
            0) {
            json_decref(o);
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        }
    }
    if (json_object_set_new(root, "logit_bias", o) < 0)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    return 0;
}

static int parse_root(json_t *root, const proto_limits_t *lim_in, proto_llama_req_t *out,
                      proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    px_limits_resolve(lim_in, &lim);
    if ((rc = logit_bias_pairs(root, err)) < 0)
        goto fail;
    if ((rc = px_parse_gen_params(root, &lim, PX_GEN_COMPLETION, &out->c.p, err)) < 0)
        goto fail;
    if ((rc = px_completion_unsupported(root, &out->c.p, err)) < 0)
        goto fail;
    if ((rc = parse_native(root, &lim, out, err)) < 0)
        goto fail;
    if ((rc = parse_mixed(root, &lim, out, err)) < 0)
        goto fail;
    if (rc == 0 && (rc = px_parse_prompt(root, &lim, &out->c, err)) < 0)
        goto fail;
    if (out->c.n_prompts > 1) {
        rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, "prompt",
                             "several prompts are answered by /v1/completions; /completion "
                             "takes one (a string, token ids, or both mixed in one array)");
        goto fail;
    }
    return 0;
fail:
    proto_llama_free(out);
    return rc < 0 ? rc : PROTO_EINVAL;
}

int proto_llama_parse(const char *body, size_t len, const proto_limits_t *lim,
                      proto_llama_req_t *out, proto_error_t *err)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    rc = parse_root(root, lim, out, err);
    json_decref(root);
    return rc;
}

void proto_infill_free(proto_infill_req_t *r)
{
    if (!r)
        return;
    proto_llama_free(&r->l);
    px_free(r->prefix);
    px_free(r->suffix);
    memset(r, 0, sizeof *r);
}

int proto_infill_parse(const char *body, size_t len, const proto_limits_t *lim_in,
                       proto_infill_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    if ((rc = px_read_string(root, "input_prefix", (size_t)lim.max_text_bytes, &out->prefix,
                             &out->prefix_len, err)) < 0 ||
        (rc = px_read_string(root, "input_suffix", (size_t)lim.max_text_bytes, &out->suffix,
                             &out->suffix_len, err)) < 0)
        goto fail;
    json_t *extra = px_get(root, "input_extra");
    if (extra && !(json_is_array(extra) && json_array_size(extra) == 0)) {
        rc = proto_error_set(err, PROTO_ERR_UNSUPPORTED, "input_extra",
                             "'input_extra' (context from other files) is not supported");
        goto fail;
    }
    /* the rest is /completion's; the prompt, the text after the prefix at
     * the cursor, is optional here */
    (void)json_object_del(root, "input_prefix"); /* -1: it was absent */
    (void)json_object_del(root, "input_suffix");
    if (!px_get(root, "prompt") && json_object_set_new(root, "prompt", json_string("")) < 0) {
        rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        goto fail;
    }
    if ((rc = parse_root(root, &lim, &out->l, err)) < 0)
        goto fail;
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_infill_free(out);
    return rc;
}

/* ------------------------------------------------------------- answers */

char *proto_llama_settings_json(const proto_llama_req_t *r, int64_t seed)
{
    const proto_gen_params_t *p = &r->c.p;
    json_t *o = json_object();
    json_t *stop = json_array();
    int bad = !o || !stop;
    for (size_t i = 0; !bad && i < p->n_stop; i++)
        bad |= json_array_append_new(stop, px_str(p->stop[i], strlen(p->stop[i])));
    bad |= json_object_set_new(o, "n_predict", json_integer(p->max_tokens));
    bad |= json_object_set_new(o, "seed", json_integer(seed));
    bad |= json_object_set_new(o, "temperature", px_real(p->sampling.temperature, 0));
    bad |= json_object_set_new(o, "top_k", json_integer(p->sampling.top_k));
    bad |= json_object_set_new(o, "top_p", px_real(p->sampling.top_p, 0));
    bad |= json_object_set_new(o, "min_p", px_real(p->sampling.min_p, 0));
    bad |= json_object_set_new(o, "repeat_penalty", px_real(p->sampling.repeat_penalty, 0));
    bad |= json_object_set_new(o, "presence_penalty", px_real(p->sampling.presence_penalty, 0));
    bad |= json_object_set_new(o, "frequency_penalty", px_real(p->sampling.frequency_penalty, 0));
    bad |= json_object_set_new(o, "n_probs", json_integer(r->n_probs));
    bad |= json_object_set_new(o, "ignore_eos", json_boolean(r->ignore_eos));
    bad |= json_object_set_new(o, "stream", json_boolean(p->stream));
    bad |= json_object_set_new(o, "grammar", px_cstr_or_null(p->grammar ? p->grammar : ""));
    bad |= json_object_set_new(o, "stop", stop);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return px_dump(o);
}

char *proto_llama_fields_json(const char *json, const proto_llama_fields_t *f)
{
    json_t *root = json ? json_loads(json, JSON_ALLOW_NUL, NULL) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    int bad = 0;
    bad |= json_object_set_new(root, "index", json_integer(0));
    bad |= json_object_set_new(root, "id_slot", json_integer(0));
    bad |= json_object_set_new(root, "content", px_str(f->content, f->content_len));
    json_t *toks = json_array();
    for (size_t i = 0; toks && i < f->n_tokens; i++)
        bad |= json_array_append_new(toks, json_integer(f->tokens[i]));
    bad |= json_object_set_new(root, "tokens", toks);
    bad |= json_object_set_new(root, "stop", json_boolean(f->stop));
    if (f->with_probs) {
        json_t *probs = json_array();
        for (size_t i = 0; probs && i < f->n_probs; i++) {
            json_t *e = px_chat_logprob_entry(&f->probs[i]);
            bad |= !e || json_object_set_new(e, "id", json_integer(f->probs[i].id));
            json_t *tops = e ? json_object_get(e, "top_logprobs") : NULL;
            for (size_t k = 0; tops && k < f->probs[i].n_top; k++)
                bad |= json_object_set_new(json_array_get(tops, k), "id",
                                           json_integer(f->probs[i].top[k].id));
            bad |= json_array_append_new(probs, e);
        }
        bad |= json_object_set_new(root, "completion_probabilities", probs);
    }
    if (f->stop) {
        bad |= json_object_set_new(root, "stop_type", px_cstr_or_null(f->stop_type));
        bad |= json_object_set_new(root, "stopping_word",
                                   px_cstr_or_null(f->stopping_word ? f->stopping_word : ""));
        bad |= json_object_set_new(root, "tokens_predicted", json_integer(f->tokens_predicted));
        bad |= json_object_set_new(root, "tokens_evaluated", json_integer(f->tokens_evaluated));
        bad |= json_object_set_new(root, "tokens_cached", json_integer(f->tokens_cached));
        bad |= json_object_set_new(root, "truncated", json_false());
        bad |= json_object_set_new(
            root, "has_new_line",
            json_boolean(f->content_all && memchr(f->content_all, '\n', f->content_all_len)));
        json_t *t = json_object();
        const double pn = (double)f->tokens_evaluated - (double)f->tokens_cached;
        const double dn = (double)f->tokens_predicted;
        bad |= json_object_set_new(t, "prompt_n", json_integer((json_int_t)pn));
        bad |= json_object_set_new(t, "prompt_ms", px_real(f->prompt_ms, 0));
        bad |= json_object_set_new(t, "prompt_per_token_ms",
                                   px_real(pn > 0 ? f->prompt_ms / pn : 0, 0));
        bad |= json_object_set_new(t, "prompt_per_second",
                                   px_real(f->prompt_ms > 0 ? pn * 1e3 / f->prompt_ms : 0, 0));
        bad |= json_object_set_new(t, "predicted_n", json_integer((json_int_t)dn));
        bad |= json_object_set_new(t, "predicted_ms", px_real(f->predicted_ms, 0));
        bad |= json_object_set_new(t, "predicted_per_token_ms",
                                   px_real(dn > 0 ? f->predicted_ms / dn : 0, 0));
        bad |=
            json_object_set_new(t, "predicted_per_second",
                                px_real(f->predicted_ms > 0 ? dn * 1e3 / f->predicted_ms : 0, 0));
        bad |= json_object_set_new(root, "timings", t);
    }
    if (bad) {
        json_decref(root);
        return NULL;
    }
    char *out = px_dump(root);
    if (!out || !f->stop)
        return out;
    /* "generation_settings" is already JSON text: spliced in before the
     * closing brace rather than parsed again */
    const char *set = f->settings ? f->settings : "{}";
    px_buf_t b = {0};
    size_t n = strlen(out);
    if (px_buf_append(out, n - 1, &b) < 0 ||
        px_buf_printf(&b, ",\"generation_settings\":%s}", set) < 0 || b.failed) {
        px_free(b.p);
        b.p = NULL;
    }
    px_free(out);
    return b.p;
}

char *proto_llama_props_json(const proto_llama_props_t *p)
{
    json_t *o = json_object(), *dgs = json_object(), *par = json_object(), *mod = json_object();
    int bad = !o || !dgs || !par || !mod;
    bad |= json_object_set_new(par, "n_predict", json_integer(p->n_predict));
    bad |= json_object_set_new(par, "temperature", px_real(1.0, 0));
    bad |= json_object_set_new(par, "top_k", json_integer(0));
    bad |= json_object_set_new(par, "top_p", px_real(1.0, 0));
    bad |= json_object_set_new(par, "min_p", px_real(0.0, 0));
    bad |= json_object_set_new(par, "repeat_penalty", px_real(1.0, 0));
    bad |= json_object_set_new(par, "presence_penalty", px_real(0.0, 0));
    bad |= json_object_set_new(par, "frequency_penalty", px_real(0.0, 0));
    bad |= json_object_set_new(par, "n_probs", json_integer(0));
    bad |= json_object_set_new(par, "ignore_eos", json_false());
    bad |= json_object_set_new(par, "stream", json_false());
    bad |= json_object_set_new(dgs, "id", json_integer(0));
    bad |= json_object_set_new(dgs, "n_ctx", json_integer(p->n_ctx));
    bad |= json_object_set_new(dgs, "params", par);
    bad |= json_object_set_new(o, "default_generation_settings", dgs);
    bad |= json_object_set_new(o, "total_slots", json_integer(p->total_slots));
    bad |= json_object_set_new(o, "model_alias", px_cstr_or_null(p->model_alias));
    bad |= json_object_set_new(o, "model_path", px_cstr_or_null(p->model_path));
    bad |= json_object_set_new(mod, "vision", json_false());
    bad |= json_object_set_new(mod, "audio", json_false());
    bad |= json_object_set_new(o, "modalities", mod);
    bad |= json_object_set_new(
        o, "chat_template", px_str(p->chat_template, p->chat_template ? p->chat_template_len : 0));
    bad |= json_object_set_new(o, "bos_token", px_cstr_or_null(p->bos_token));
    bad |= json_object_set_new(o, "eos_token", px_cstr_or_null(p->eos_token));
    bad |= json_object_set_new(o, "build_info", px_cstr_or_null(p->build_info));
    bad |= json_object_set_new(o, "infill", json_boolean(p->infill));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return px_dump(o);
}

char *proto_prompt_json(const char *text, size_t len)
{
    json_t *o = json_object();
    int bad = json_object_set_new(o, "prompt", px_str(text, text ? len : 0));
    return bad ? (json_decref(o), NULL) : px_dump(o);
}
