/* proto/embed.c — the embedding endpoints' requests and answers, in the four
 * shapes clients send them (OpenAI's /v1/embeddings, llama.cpp's /embedding,
 * Ollama's /api/embed and its older /api/embeddings), and the normalization
 * of a vector the request asks for (llama.cpp's embd_normalize numbering).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto_impl.h"

void proto_embed_free(proto_embed_req_t *r)
{
    if (!r)
        return;
    px_free(r->model);
    if (r->inputs) {
        for (size_t i = 0; i < r->n_inputs; i++) {
            px_free(r->inputs[i].text);
            px_free(r->inputs[i].tokens);
        }
        px_free(r->inputs);
    }
    memset(r, 0, sizeof *r);
}

/* One input at param: a string, or (tokens_ok) an array of token ids. */
static int one_input(json_t *v, const char *param, int tokens_ok, const proto_limits_t *lim,
                     int64_t *left, proto_prompt_t *p, proto_error_t *err)
{
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        if ((int64_t)n > *left)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                                   "'%s' is too long: inputs may total at most %lld bytes", param,
                                   (long long)*left);
        *left -= (int64_t)n;
        p->text = px_strndup(json_string_value(v), n);
        if (!p->text)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        p->text_len = n;
        return 0;
    }
    if (tokens_ok && json_is_array(v))
        return px_parse_token_ids(v, param, lim->max_prompt_tokens, lim->n_vocab, 0, &p->tokens,
                                  &p->n_tokens, err);
    return proto_error_set(err, PROTO_ERR_INVALID_VALUE, param,
                           tokens_ok ? "'%s' must be a string or an array of token ids"
                                     : "'%s' must be a string",
                           param);
}

/* The inputs at key: one string, an array of strings or, where token ids
 * are taken, one array of ids or an array of such arrays. */
static int parse_inputs(json_t *root, const char *key, int tokens_ok, int array_ok,
                        const proto_limits_t *lim, proto_embed_req_t *r, proto_error_t *err)
{
    json_t *v = px_get(root, key);
    if (!v)
        return proto_error_set(err, PROTO_ERR_MISSING, key, "'%s' is required", key);
    int64_t left = lim->max_text_bytes;
    int flat_ids =
        json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0));
    if (!json_is_array(v) || flat_ids || !array_ok) {
        if (flat_ids && !tokens_ok)
            return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                                   "'%s' must be a string or an array of strings", key);
        r->inputs = px_malloc(sizeof *r->inputs);
        if (!r->inputs)
            return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
        memset(r->inputs, 0, sizeof *r->inputs);
        r->n_inputs = 1;
        return one_input(v, key, tokens_ok, lim, &left, &r->inputs[0], err);
    }
    size_t n = json_array_size(v);
    if (n == 0)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key, "'%s' must not be an empty array",
                               key);
    if (n > PROTO_MAX_EMBED_INPUTS)
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, key,
                               "'%s' has %zu inputs; at most %d are taken in one request", key, n,
                               PROTO_MAX_EMBED_INPUTS);
    r->inputs = px_malloc(n * sizeof *r->inputs);
    if (!r->inputs)
        return proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "out of memory");
    memset(r->inputs, 0, n * sizeof *r->inputs);
    r->n_inputs = n;
    for (size_t i = 0; i < n; i++) {
        char ep[PROTO_ERROR_PARAM_MAX];
        px_paramf(ep, "%s[%zu]", key, i);
        int rc = one_input(json_array_get(v, i), ep, tokens_ok, lim, &left, &r->inputs[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_pooling(json_t *root, proto_embed_api_t api, proto_embed_req_t *r,
                         proto_error_t *err)
{
    json_t *v = px_get(root, "pooling");
    r->pooling = PROTO_POOL_MEAN;
    if (!v)
        return 0;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "mean") == 0)
        r->pooling = PROTO_POOL_MEAN;
    else if (strcmp(s, "last") == 0)
        r->pooling = PROTO_POOL_LAST;
    else if (strcmp(s, "none") == 0)
        r->pooling = PROTO_POOL_NONE;
    else
        return proto_error_set(err, PROTO_ERR_INVALID_VALUE, "pooling",
                               "'pooling' must be \"mean\", \"last\" or \"none\"");
    if (r->pooling == PROTO_POOL_NONE && api != PROTO_EMBED_LLAMA)
        return proto_error_set(err, PROTO_ERR_UNSUPPORTED, "pooling",
                               "'pooling': \"none\" (one vector per token) is answered by "
                               "POST /embedding only; this API holds one vector per input");
    return 0;
}

int proto_embed_parse(const char *body, size_t len, proto_embed_api_t api,
                      const proto_limits_t *lim_in, proto_embed_req_t *out, proto_error_t *err)
{
    proto_limits_t lim;
    int rc = 0;
    memset(out, 0, sizeof *out);
    out->api = api;
    px_limits_resolve(lim_in, &lim);
    json_t *root = px_load_object(body, len, 0, err, &rc);
    if (!root)
        return rc;
    if ((rc = px_read_string(root, "model", PROTO_MAX_NAME_BYTES, &out->model, NULL, err)) < 0)
        goto fail;
    if ((api == PROTO_EMBED_OLLAMA || api == PROTO_EMBED_OLLAMA_V1) && !out->model) {
        rc = proto_error_set(err, PROTO_ERR_MISSING, "model", "'model' is required");
        goto fail;
    }
    switch (api) {
    case PROTO_EMBED_OPENAI: rc = parse_inputs(root, "input", 1, 1, &lim, out, err); break;
    case PROTO_EMBED_LLAMA: {
        const int has_in = px_get(root, "input") != NULL, has_c = px_get(root, "content") != NULL;
        if (has_in && has_c) {
            rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "content",
                                 "give 'content' or 'input', not both");
            break;
        }
        rc = parse_inputs(root, has_in ? "input" : "content", 1, 1, &lim, out, err);
        break;
    }
    case PROTO_EMBED_OLLAMA: rc = parse_inputs(root, "input", 0, 1, &lim, out, err); break;
    case PROTO_EMBED_OLLAMA_V1: rc = parse_inputs(root, "prompt", 0, 0, &lim, out, err); break;
    default:
        rc = proto_error_set(err, PROTO_ERR_INTERNAL, NULL, "unknown embedding API %d", (int)api);
    }
    if (rc < 0)
        goto fail;
    if ((rc = parse_pooling(root, api, out, err)) < 0)
        goto fail;
    /* Ollama's /api/embeddings answers the raw vector, the others a
     * Euclidean-normalized one, as each API does */
    int64_t norm = api == PROTO_EMBED_OLLAMA_V1 ? -1 : 2;
    if ((rc = px_read_int(root, "embd_normalize", -1, PROTO_MAX_EMBED_NORM, "between -1 and 64",
                          &norm, err)) < 0)
        goto fail;
    out->normalize = (int)norm;
    if (api == PROTO_EMBED_OPENAI) {
        json_t *v = px_get(root, "encoding_format");
        if (v) {
            const char *s = json_is_string(v) ? json_string_value(v) : "";
            if (strcmp(s, "base64") == 0) {
                out->base64 = 1;
            } else if (strcmp(s, "float") != 0) {
                rc = proto_error_set(err, PROTO_ERR_INVALID_VALUE, "encoding_format",
                                     "'encoding_format' must be \"float\" or \"base64\"");
                goto fail;
            }
        }
    }
    if (api == PROTO_EMBED_OPENAI || api == PROTO_EMBED_OLLAMA) {
        if ((rc = px_read_int(root, "dimensions", 1, INT32_MAX, "of at least 1", &out->dimensions,
                              err)) < 0)
            goto fail;
    }
    if (api == PROTO_EMBED_OLLAMA) {
        int truncate = 1; /* read for its type; an input is never cut (docs/API.md) */
        if ((rc = px_read_bool(root, "truncate", &truncate, err)) < 0)
            goto fail;
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    proto_embed_free(out);
    return rc;
}

void proto_embed_normalize(float *v, size_t n, int mode)
{
    if (mode < 0)
        return;
    double s = 0.0;
    if (mode == 0) { /* the largest magnitude scaled to the int16 range */
        for (size_t i = 0; i < n; i++)
            s = fmax(s, fabs((double)v[i]));
        s /= 32760.0;
    } else if (mode == 1) {
        for (size_t i = 0; i < n; i++)
            s += fabs((double)v[i]);
    } else if (mode == 2) {
        for (size_t i = 0; i < n; i++)
            s += (double)v[i] * (double)v[i];
        s = sqrt(s);
    } else {
        for (size_t i = 0; i < n; i++)
            s += pow(fabs((double)v[i]), (double)mode);
        s = pow(s, 1.0 / (double)mode);
    }
    if (!(s > 0.0) || !isfinite(s))
        return; /* a zero vector stays zero */
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((double)v[i] / s);
}

/* ------------------------------------------------------------- answers */

/* One value as JSON: 9 significant digits reproduce a float exactly; a
 * non-finite one (never seen from a finite model) becomes 0. */
static int put_float(px_buf_t *b, float f)
{
    return isfinite(f) ? px_buf_printf(b, "%.9g", (double)f) : px_buf_printf(b, "0");
}

static int put_vector(px_buf_t *b, const float *v, size_t n)
{
    int rc = px_buf_printf(b, "[");
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (i)
            rc = px_buf_printf(b, ",");
        if (rc == 0)
            rc = put_float(b, v[i]);
    }
    return rc ? rc : px_buf_printf(b, "]");
}

/* Byte i of the vector's little-endian float32 bytes. */
static unsigned vec_byte(const float *v, size_t i)
{
    uint32_t u;
    memcpy(&u, &v[i / 4], 4);
    return (unsigned)(u >> (8 * (i % 4))) & 0xffu;
}

/* The vector's little-endian float32 bytes in standard base64, quoted. */
static int put_base64(px_buf_t *b, const float *v, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int rc = px_buf_printf(b, "\"");
    const size_t nb = n * 4;
    for (size_t i = 0; i < nb && rc == 0; i += 3) {
        const size_t k = nb - i < 3 ? nb - i : 3; /* bytes in this group */
        uint32_t g = vec_byte(v, i) << 16;
        if (k > 1)
            g |= vec_byte(v, i + 1) << 8;
        if (k > 2)
            g |= vec_byte(v, i + 2);
        char o[4] = {'=', '=', '=', '='};
        for (size_t c = 0; c <= k; c++)
            o[c] = a[(g >> (18 - 6 * c)) & 63u];
        rc = px_buf_append(o, 4, b);
    }
    return rc ? rc : px_buf_printf(b, "\"");
}

/* A JSON string of s ("" for NULL), made valid UTF-8. */
static int put_string(px_buf_t *b, const char *s)
{
    json_t *j = px_str(s ? s : "", s ? strlen(s) : 0);
    if (!j)
        return -1;
    int rc = json_dump_callback(j, px_buf_append, b, JSON_ENCODE_ANY);
    json_decref(j);
    return rc;
}

char *proto_embed_json(const proto_embed_resp_t *r)
{
    px_buf_t b = {0};
    int rc = 0;
    switch (r->api) {
    case PROTO_EMBED_OPENAI:
        rc = px_buf_printf(&b, "{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < r->n && rc == 0; i++) {
            rc = px_buf_printf(
                &b, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
            if (rc == 0)
                rc = r->base64 ? put_base64(&b, r->vecs[i], r->dim)
                               : put_vector(&b, r->vecs[i], r->dim);
            if (rc == 0)
                rc = px_buf_printf(&b, "}");
        }
        if (rc == 0)
            rc = px_buf_printf(&b, "],\"model\":");
        if (rc == 0)
            rc = put_string(&b, r->model);
        if (rc == 0)
            rc = px_buf_printf(&b, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                               (long long)r->prompt_tokens, (long long)r->prompt_tokens);
        break;
    case PROTO_EMBED_LLAMA:
        rc = px_buf_printf(&b, "[");
        for (size_t i = 0; i < r->n && rc == 0; i++) {
            rc = px_buf_printf(&b, "%s{\"index\":%zu,\"embedding\":[", i ? "," : "", i);
            for (size_t t = 0; t < r->rows[i] && rc == 0; t++) {
                if (t)
                    rc = px_buf_printf(&b, ",");
                if (rc == 0)
                    rc = put_vector(&b, r->vecs[i] + t * r->dim, r->dim);
            }
            if (rc == 0)
                rc = px_buf_printf(&b, "]}");
        }
        if (rc == 0)
            rc = px_buf_printf(&b, "]");
        break;
    case PROTO_EMBED_OLLAMA:
        rc = px_buf_printf(&b, "{\"model\":");
        if (rc == 0)
            rc = put_string(&b, r->model);
        if (rc == 0)
            rc = px_buf_printf(&b, ",\"embeddings\":[");
        for (size_t i = 0; i < r->n && rc == 0; i++) {
            if (i)
                rc = px_buf_printf(&b, ",");
            if (rc == 0)
                rc = put_vector(&b, r->vecs[i], r->dim);
        }
        if (rc == 0)
            rc = px_buf_printf(&b,
                               "],\"total_duration\":%lld,\"load_duration\":0,"
                               "\"prompt_eval_count\":%lld}",
                               (long long)r->total_duration_ns, (long long)r->prompt_tokens);
        break;
    case PROTO_EMBED_OLLAMA_V1:
        rc = px_buf_printf(&b, "{\"embedding\":");
        if (rc == 0)
            rc = put_vector(&b, r->n ? r->vecs[0] : NULL, r->n ? r->dim : 0);
        if (rc == 0)
            rc = px_buf_printf(&b, "}");
        break;
    default: rc = -1;
    }
    if (rc != 0 || b.failed) {
        px_free(b.p);
        return NULL;
    }
    return b.p;
}
