/* test_proto_embed.c — the embedding requests and answers of proto/embed.c:
 * each API's fields and defaults, the normalizations against a naive double
 * reference, base64 against a hand-encoded vector, every answer shape parsed
 * back with jansson, and allocation failures at every point (an error or
 * NULL, never a crash or a leak under ASan). The refusals end to end are in
 * tests/integration/test_api_embeddings.py. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/unit/alloc_fail.h"
#include "tests/unit/check.h"

static int parse(const char *body, proto_embed_api_t api, proto_embed_req_t *r, proto_error_t *e)
{
    proto_limits_t lim = {.n_vocab = 100};
    return proto_embed_parse(body, strlen(body), api, &lim, r, e);
}

TEST(defaults_per_api)
{
    proto_embed_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse("{\"input\":\"hi\"}", PROTO_EMBED_OPENAI, &r, &e), 0);
    CHECK_INT_EQ((int)r.n_inputs, 1);
    CHECK_STR_EQ(r.inputs[0].text, "hi");
    CHECK_INT_EQ(r.pooling, PROTO_POOL_MEAN);
    CHECK_INT_EQ(r.normalize, 2);
    CHECK_INT_EQ(r.base64, 0);
    CHECK(r.model == NULL && r.dimensions == 0);
    proto_embed_free(&r);
    CHECK_INT_EQ(parse("{\"model\":\"m\",\"prompt\":\"hi\"}", PROTO_EMBED_OLLAMA_V1, &r, &e), 0);
    CHECK_INT_EQ(r.normalize, -1); /* Ollama's older route gives the raw vector */
    CHECK_STR_EQ(r.model, "m");
    proto_embed_free(&r);
    CHECK_INT_EQ(parse("{\"content\":[[1,2],[3]],\"pooling\":\"none\",\"embd_normalize\":-1}",
                       PROTO_EMBED_LLAMA, &r, &e),
                 0);
    CHECK_INT_EQ((int)r.n_inputs, 2);
    CHECK_INT_EQ((int)r.inputs[0].n_tokens, 2);
    CHECK_INT_EQ(r.inputs[1].tokens[0], 3);
    CHECK_INT_EQ(r.pooling, PROTO_POOL_NONE);
    CHECK_INT_EQ(r.normalize, -1);
    proto_embed_free(&r);
    CHECK_INT_EQ(parse("{\"input\":[5,6],\"encoding_format\":\"base64\",\"dimensions\":64}",
                       PROTO_EMBED_OPENAI, &r, &e),
                 0);
    CHECK_INT_EQ((int)r.inputs[0].n_tokens, 2);
    CHECK_INT_EQ(r.base64, 1);
    CHECK_INT_EQ((int)r.dimensions, 64);
    proto_embed_free(&r);
    proto_embed_free(&r); /* zeroed: harmless twice */
}

TEST(errors_name_the_field)
{
    static const struct {
        proto_embed_api_t api;
        const char *body, *param;
        const char *code;
    } cases[] = {
        {PROTO_EMBED_OPENAI, "{}", "input", "missing_required_parameter"},
        {PROTO_EMBED_OPENAI, "{\"input\":3}", "input", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":[]}", "input", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":[\"a\",1]}", "input[1]", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":[1,100]}", "input[1]", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":\"a\",\"pooling\":\"none\"}", "pooling",
         "unsupported_parameter"},
        {PROTO_EMBED_OPENAI, "{\"input\":\"a\",\"pooling\":1}", "pooling", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":\"a\",\"encoding_format\":\"x\"}", "encoding_format",
         "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":\"a\",\"dimensions\":0}", "dimensions", "invalid_value"},
        {PROTO_EMBED_OPENAI, "{\"input\":\"a\",\"embd_normalize\":-2}", "embd_normalize",
         "invalid_value"},
        {PROTO_EMBED_LLAMA, "{\"input\":\"a\",\"content\":\"b\"}", "content", "invalid_value"},
        {PROTO_EMBED_LLAMA, "{}", "content", "missing_required_parameter"},
        {PROTO_EMBED_OLLAMA, "{\"input\":\"a\"}", "model", "missing_required_parameter"},
        {PROTO_EMBED_OLLAMA, "{\"model\":\"m\",\"input\":[1]}", "input", "invalid_value"},
        {PROTO_EMBED_OLLAMA, "{\"model\":\"m\",\"input\":\"a\",\"truncate\":1}", "truncate",
         "invalid_value"},
        {PROTO_EMBED_OLLAMA_V1, "{\"model\":\"m\",\"prompt\":[\"a\"]}", "prompt", "invalid_value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proto_embed_req_t r;
        proto_error_t e;
        CHECK_INT_EQ(parse(cases[i].body, cases[i].api, &r, &e), PROTO_EINVAL);
        CHECK_STR_EQ(e.param, cases[i].param);
        CHECK_STR_EQ(e.code, cases[i].code);
        CHECK(r.inputs == NULL && r.model == NULL);
    }
    char big[4096];
    strcpy(big, "{\"input\":[");
    for (int i = 0; i <= PROTO_MAX_EMBED_INPUTS; i++)
        strcat(big, i ? ",\"a\"" : "\"a\"");
    strcat(big, "]}");
    proto_embed_req_t r;
    proto_error_t e;
    CHECK_INT_EQ(parse(big, PROTO_EMBED_OPENAI, &r, &e), PROTO_EINVAL);
    CHECK_STR_EQ(e.param, "input");
}

/* The naive reference: the norm in double, written out per mode. */
static void ref_normalize(const float *v, double *out, int n, int mode)
{
    double s = 0;
    for (int i = 0; i < n; i++) {
        double a = fabs(v[i]);
        if (mode == 0)
            s = a > s ? a : s;
        else
            s += pow(a, mode);
    }
    s = mode == 0 ? s / 32760.0 : pow(s, 1.0 / mode);
    for (int i = 0; i < n; i++)
        out[i] = mode < 0 ? v[i] : v[i] / s;
}

TEST(normalization_against_the_reference)
{
    enum { N = 37 };
    for (int mode = -1; mode <= 9; mode++) {
        float v[N];
        double want[N];
        for (int i = 0; i < N; i++)
            v[i] = (float)sin(1.0 + i * 0.7) * (i % 5 == 0 ? 9.0f : 1.0f);
        ref_normalize(v, want, N, mode);
        proto_embed_normalize(v, N, mode);
        for (int i = 0; i < N; i++)
            CHECK_NEAR(v[i], want[i], 1e-6 * (fabs(want[i]) + 1));
    }
    float z[3] = {0, 0, 0};
    proto_embed_normalize(z, 3, 2);
    CHECK(z[0] == 0 && z[1] == 0 && z[2] == 0);
}

TEST(answer_shapes)
{
    const float a[4] = {1.0f, -0.5f, 0.25f, 3.0f}; /* two rows of 2 */
    const float b[2] = {0.1f, 2.0f};
    const float *vecs[2] = {a, b};
    size_t rows[2] = {2, 1};
    proto_embed_resp_t r = {.api = PROTO_EMBED_LLAMA,
                            .model = "m",
                            .vecs = vecs,
                            .rows = rows,
                            .n = 2,
                            .dim = 2,
                            .prompt_tokens = 3};
    char *s = proto_embed_json(&r);
    CHECK_STR_EQ(s, "[{\"index\":0,\"embedding\":[[1,-0.5],[0.25,3]]},"
                    "{\"index\":1,\"embedding\":[[0.100000001,2]]}]");
    proto_free(s);
    rows[0] = 1;
    r.api = PROTO_EMBED_OPENAI;
    s = proto_embed_json(&r);
    json_t *j = json_loads(s, 0, NULL);
    CHECK(j != NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "list");
    CHECK_INT_EQ(
        (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 3);
    json_t *d1 = json_array_get(json_object_get(j, "data"), 1);
    CHECK_INT_EQ((int)json_integer_value(json_object_get(d1, "index")), 1);
    CHECK((float)json_real_value(json_array_get(json_object_get(d1, "embedding"), 0)) == 0.1f);
    json_decref(j);
    proto_free(s);
    /* base64: 1.0f = 00 00 80 3f, -0.5f = 00 00 00 bf (little-endian) */
    r.base64 = 1;
    r.n = 1;
    s = proto_embed_json(&r);
    CHECK(s && strstr(s, "\"embedding\":\"AACAPwAAAL8=\"") != NULL);
    proto_free(s);
    r.api = PROTO_EMBED_OLLAMA;
    r.n = 2;
    s = proto_embed_json(&r);
    CHECK_STR_EQ(s, "{\"model\":\"m\",\"embeddings\":[[1,-0.5],[0.100000001,2]],"
                    "\"total_duration\":0,\"load_duration\":0,\"prompt_eval_count\":3}");
    proto_free(s);
    r.api = PROTO_EMBED_OLLAMA_V1;
    s = proto_embed_json(&r);
    CHECK_STR_EQ(s, "{\"embedding\":[1,-0.5]}");
    proto_free(s);
}

/* ---- allocation failures ---- */

static int op(void)
{
    proto_embed_req_t r;
    proto_error_t e;
    int ok = parse("{\"model\":\"a\",\"input\":[\"x\",\"yy\"],\"pooling\":\"last\"}",
                   PROTO_EMBED_OPENAI, &r, &e) == 0;
    proto_embed_free(&r);
    ok &= parse("{\"content\":[[1,2],[3]]}", PROTO_EMBED_LLAMA, &r, &e) == 0;
    proto_embed_free(&r);
    const float a[3] = {1, 2, 3};
    const float *vecs[1] = {a};
    size_t rows[1] = {1};
    for (int api = PROTO_EMBED_OPENAI; api <= PROTO_EMBED_OLLAMA_V1; api++) {
        proto_embed_resp_t o = {.api = (proto_embed_api_t)api,
                                .model = "m",
                                .vecs = vecs,
                                .rows = rows,
                                .n = 1,
                                .dim = 3,
                                .base64 = api == 0};
        char *s = proto_embed_json(&o);
        ok &= s != NULL;
        proto_free(s);
    }
    return ok;
}

TEST(allocation_failures)
{
    check_alloc_failures(op);
}

int main(void)
{
    RUN(defaults_per_api);
    RUN(errors_name_the_field);
    RUN(normalization_against_the_reference);
    RUN(answer_shapes);
    RUN(allocation_failures);
    return CHECK_DONE();
}
