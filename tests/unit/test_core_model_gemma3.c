/* core/model.c's gemma3 path on the tiny gemma3 fixture (env
 * DARKSERVE_TINY_GEMMA, tests/fixtures/make_tiny_gemma3.py: a sliding window
 * of 8, seven layers, layer 5 global): chunked prefill and one token at a
 * time against one call, batching, the linear kinds on the global layer
 * (chunked prefill, export -> import -> continue bit for bit through the
 * local layers' rings, constant state bytes, adapters of the other family
 * refused). Whether one call is
 * right is the numpy oracle's job (tests/reference/test_gemma3_oracle.py).
 * The loader's gemma3 checks and the logit soft-capping run on small models
 * written here with the core GGUF writer. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/attn/features.h"
#include "core/crc32.h"
#include "core/gguf.h"
#include "core/kernels/qdot.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/state.h"
#include "core/tensor.h"

static core_model_t *tiny; /* the fixture, default options */
static const char *tiny_path;
static int V;

/* max over rows of max_j |a - b| / max_j |b| */
static double rel_diff(const float *a, const float *b, int64_t rows, int64_t n)
{
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        double e = 0.0, s = 0.0;
        for (int64_t j = 0; j < n; j++) {
            double d = fabs((double)a[r * n + j] - b[r * n + j]);
            e = d > e ? d : e;
            s = fabs(b[r * n + j]) > s ? fabs(b[r * n + j]) : s;
        }
        if (s > 0 && e / s > worst)
            worst = e / s;
        if (s == 0 && e > worst)
            worst = e;
    }
    return worst;
}

static core_attn_state_t *new_state(core_model_t *m)
{
    core_attn_state_t *s = NULL;
    core_error_t err = {0};
    if (core_attn_state_new(core_model_attn(m), &s, &err) < 0)
        printf("  state: %s\n", err.msg);
    return s;
}

/* Runs tok[0..n) through s in chunks of `chunk` (0 = one call); the logits
 * [n][nv] of every position into out. */
static int feed(core_model_t *m, core_attn_state_t *s, const int32_t *tok, int64_t n, int64_t chunk,
                int nv, float *out)
{
    if (chunk <= 0)
        chunk = n;
    for (int64_t i = 0; i < n; i += chunk) {
        core_batch_seq_t sq = {.state = s,
                               .tokens = tok + i,
                               .n_tokens = n - i < chunk ? n - i : chunk,
                               .logits_mode = CORE_LOGITS_ALL,
                               .logits = out + i * nv};
        core_error_t err = {0};
        int rc = core_model_forward(m, &sq, 1, &err);
        if (rc < 0) {
            printf("  forward: %s\n", err.msg);
            return rc;
        }
    }
    return 0;
}

TEST(tiny_gemma3_info)
{
    const core_model_info_t *in = core_model_info(tiny);
    CHECK_STR_EQ(in->arch, "gemma3");
    CHECK_INT_EQ(in->n_layer, 7);
    CHECK_INT_EQ(in->n_embd, 64);
    CHECK_INT_EQ(in->n_ff, 256);
    CHECK_INT_EQ(in->n_head, 4);
    CHECK_INT_EQ(in->n_head_kv, 1);
    CHECK_INT_EQ(in->head_dim, 64); /* attention.key_length, not D / H */
    CHECK_INT_EQ(in->tied_output, 1);
    CHECK_NEAR(in->rope_base, 1e6, 1e-6);
    CHECK_NEAR(in->rms_eps, 1e-6, 1e-12);
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(tiny));
    CHECK_INT_EQ(c->swa_window, 8);
    CHECK_INT_EQ(c->swa_period, 6);
    CHECK_INT_EQ(core_attn_layer_window(c, 0), 8);
    CHECK_INT_EQ(core_attn_layer_window(c, 5), 0);
    CHECK_INT_EQ(core_attn_layer_window(c, 6), 8);
}

/* The tiny fixture with a linear kind on its global layer: performer (no
 * adapter needed) with v2's sinks, window and features before RoPE, so the
 * halves-to-pairs permutation, the sinks' re-rotation and the window all
 * run; its local layers keep their rings. */
static core_model_t *load_linear(void)
{
    core_model_opts_t o = {.attn_kind = CORE_ATTN_PERFORMER, .n_features = 16, .window = 4,
                           .sinks = 2, .prerope = 1};
    core_model_t *m = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_model_load(tiny_path, &o, &m, &err) == 0, "%s", err.msg);
    return m;
}

static void rand_tokens(uint64_t seed, int32_t *tok, int n)
{
    core_rng_t r;
    core_rng_seed(&r, seed);
    tok[0] = 2;
    for (int i = 1; i < n; i++)
        tok[i] = (int32_t)(7 + core_rng_u64(&r) % (uint64_t)(V - 7));
}

/* 50 tokens (six windows of 8) one call against chunks: prompt rows differ
 * by float rounding only; a call of one token is a decode row, 8-bit
 * activations for the Q8_0 and Q5_0 matrices (measured 9.3e-3 of the largest
 * |logit| against the oracle on this model). */
static void check_chunked(core_model_t *m)
{
    enum { N = 50 };
    int32_t tok[N];
    rand_tokens(11, tok, N);
    float *ref = malloc((size_t)N * (size_t)V * sizeof *ref);
    float *got = malloc((size_t)N * (size_t)V * sizeof *got);
    core_attn_state_t *s = new_state(m);
    CHECK(ref && got && s);
    if (!ref || !got || !s)
        goto done;
    CHECK_INT_EQ(feed(m, s, tok, N, 0, V, ref), 0);
    const int64_t chunks[] = {1, 5, 8, 13, 49};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        core_attn_state_reset(s);
        CHECK_INT_EQ(feed(m, s, tok, N, chunks[c], V, got), 0);
        for (int64_t i = 0; i < N; i++) {
            const int one = chunks[c] == 1 || (N % chunks[c] == 1 && i == N - 1);
            const double d = rel_diff(got + i * V, ref + i * V, 1, V);
            CHECK_MSG(d <= (one ? 5e-2 : 1e-3), "chunk %lld row %lld: rel diff %.3g",
                      (long long)chunks[c], (long long)i, d);
        }
    }
    CHECK(rel_diff(ref, ref + V, 1, V) > 1e-2); /* not degenerate */
done:
    core_attn_state_free(s);
    free(ref);
    free(got);
}

TEST(chunked_prefill_matches_one_call)
{
    check_chunked(tiny);
}

/* A decode row and a prompt in one forward give each the bits it gets alone. */
TEST(batched_matches_alone)
{
    enum { P = 20, N = 12 };
    int32_t pre[P], tok[N];
    for (int i = 0; i < P; i++)
        pre[i] = (int32_t)(7 + (i * 13) % (V - 7));
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(7 + (i * 29 + 5) % (V - 7));
    float *a1 = malloc((size_t)V * sizeof *a1), *b1 = malloc((size_t)N * (size_t)V * sizeof *b1);
    float *a2 = malloc((size_t)V * sizeof *a2), *b2 = malloc((size_t)N * (size_t)V * sizeof *b2);
    float *scratch = malloc((size_t)P * (size_t)V * sizeof *scratch);
    core_attn_state_t *sa = new_state(tiny), *sb = new_state(tiny);
    if (!a1 || !b1 || !a2 || !b2 || !scratch || !sa || !sb) {
        CHECK(0);
        goto done;
    }
    /* alone: sa has the P-token prefix, then one decode token; sb a prompt of N */
    CHECK_INT_EQ(feed(tiny, sa, pre, P, 0, V, scratch), 0);
    CHECK_INT_EQ(feed(tiny, sa, tok, 1, 0, V, a1), 0);
    CHECK_INT_EQ(feed(tiny, sb, tok, N, 0, V, b1), 0);
    core_attn_state_reset(sa);
    core_attn_state_reset(sb);
    CHECK_INT_EQ(feed(tiny, sa, pre, P, 0, V, scratch), 0);
    core_batch_seq_t b[2] = {
        {.state = sb, .tokens = tok, .n_tokens = N, .logits_mode = CORE_LOGITS_ALL, .logits = b2},
        {.state = sa, .tokens = tok, .n_tokens = 1, .logits_mode = CORE_LOGITS_LAST, .logits = a2},
    };
    core_error_t err = {0};
    CHECK_MSG(core_model_forward(tiny, b, 2, &err) == 0, "%s", err.msg);
    CHECK(rel_diff(a2, a1, 1, V) == 0.0);
    CHECK(rel_diff(b2, b1, N, V) == 0.0);
done:
    core_attn_state_free(sa);
    core_attn_state_free(sb);
    free(a1);
    free(b1);
    free(a2);
    free(b2);
    free(scratch);
}

/* ---- linear kinds: the global layer (layer 5 of the fixture's 7) only ---- */

TEST(linear_kinds_run_the_global_layers)
{
    core_model_t *m = load_linear();
    if (!m)
        return;
    const core_attn_cfg_t *c = core_attn_config(core_model_attn(m));
    CHECK_INT_EQ(c->kind, CORE_ATTN_PERFORMER);
    CHECK_INT_EQ(c->rope_halves, 1);
    CHECK_INT_EQ(core_attn_global_layers(c), 1);
    /* every linear kind loads (darkformer-is and darkformer need their
     * adapter's tensors: no adapter, no load, as on any model) */
    const core_attn_kind_t kinds[] = {CORE_ATTN_FLEXFORMER_S, CORE_ATTN_FLEXFORMER_N};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        core_model_opts_t o = {.attn_kind = kinds[i], .n_features = 16, .window = 4};
        core_model_t *k = NULL;
        core_error_t err = {0};
        CHECK_MSG(core_model_load(tiny_path, &o, &k, &err) == 0, "%s: %s",
                  core_attn_kind_name(kinds[i]), err.msg);
        core_model_free(k);
    }
    /* the memory on every head runs; a head list (model layers) is refused */
    for (int some = 0; some < 2; some++) {
        core_model_opts_t o = {.attn_kind = CORE_ATTN_PERFORMER, .n_features = 16, .window = 4,
                               .sinks = 2, .prerope = 1, .memory = 8,
                               .memory_keep = CORE_ATTN_KEEP_RECENT,
                               .memory_heads = some ? "5.0" : NULL};
        core_model_t *k = NULL;
        core_error_t err = {0};
        const int rc = core_model_load(tiny_path, &o, &k, &err);
        if (some)
            CHECK_MSG(rc == CORE_EINVAL && strstr(err.msg, "--memory-heads"), "%d %s", rc,
                      err.msg);
        else
            CHECK_MSG(rc == 0, "%s", err.msg);
        core_model_free(k);
    }
    /* the linear global layer changes the logits past its window + sinks
     * (not before: there it is exact), the local layers stay exact */
    enum { N = 24 };
    int32_t tok[N];
    rand_tokens(3, tok, N);
    float *a = malloc((size_t)N * (size_t)V * sizeof *a), *b = malloc((size_t)N * (size_t)V * sizeof *b);
    core_attn_state_t *sa = new_state(tiny), *sb = new_state(m);
    CHECK(a && b && sa && sb);
    if (a && b && sa && sb && feed(tiny, sa, tok, N, 0, V, a) == 0 && feed(m, sb, tok, N, 0, V, b) == 0) {
        /* the linear kind's exact rows are halves (16-bit rows) */
        const double in = rel_diff(b, a, 6, V), out = rel_diff(b + (N - 1) * V, a + (N - 1) * V, 1, V);
        CHECK_MSG(in < 1e-3, "within window + sinks: %.3g", in);
        CHECK_MSG(out > 10 * in, "past them: %.3g (within: %.3g)", out, in);
    }
    core_attn_state_free(sa);
    core_attn_state_free(sb);
    free(a);
    free(b);
    core_model_free(m);
}

/* Prompt chunks against one call, with the linear global layer. */
TEST(linear_chunked_prefill_matches_one_call)
{
    core_model_t *m = load_linear();
    if (m)
        check_chunked(m);
    core_model_free(m);
}

/* A state saved past several wraps of the rings (window 8: 7 rows), loaded
 * into a new one, continues bit for bit as the original; exact and linear. */
static void check_export_import(core_model_t *m)
{
    enum { P = 37, N = 12 };
    int32_t pre[P], tok[N];
    rand_tokens(21, pre, P);
    rand_tokens(22, tok, N);
    float *scr = malloc((size_t)P * (size_t)V * sizeof *scr);
    float *a = malloc((size_t)N * (size_t)V * sizeof *a), *b = malloc((size_t)N * (size_t)V * sizeof *b);
    core_attn_state_t *s = new_state(m), *t = new_state(m);
    void *blob = NULL;
    CHECK(scr && a && b && s && t);
    if (!scr || !a || !b || !s || !t)
        goto done;
    CHECK_INT_EQ(feed(m, s, pre, P, 10, V, scr), 0);
    core_state_desc_t d = {.fingerprint = core_model_info(m)->fingerprint, .state = s};
    size_t n = core_state_size(s, NULL, 0, 0), len = 0;
    blob = malloc(n);
    CHECK(blob != NULL);
    if (!blob)
        goto done;
    core_error_t err = {0};
    CHECK_MSG(core_state_save(&d, blob, n, &len, &err) == 0, "%s", err.msg);
    CHECK_MSG(core_state_load(blob, len, d.fingerprint, t, NULL, NULL, NULL, NULL, NULL, &err) == 0,
              "%s", err.msg);
    CHECK_INT_EQ(core_attn_state_pos(t), P);
    /* the same continuation, in the same chunks */
    CHECK_INT_EQ(feed(m, s, tok, N, 5, V, a), 0);
    CHECK_INT_EQ(feed(m, t, tok, N, 5, V, b), 0);
    CHECK_MSG(memcmp(a, b, (size_t)N * (size_t)V * sizeof *a) == 0, "%s: continuation differs",
              core_attn_kind_name(core_attn_config(core_model_attn(m))->kind));
    /* a payload without the rings' header (the exact cache of every layer
     * written before the rings) is refused as such: the tag's first byte
     * changed, the checksum made right again */
    unsigned char *u = blob;
    u[CORE_STATE_HEADER_BYTES] ^= 0x55;
    uint32_t crc = core_crc32(0, u, len - 4);
    for (int i = 0; i < 4; i++)
        u[len - 4 + (size_t)i] = (unsigned char)(crc >> (8 * i));
    core_attn_state_reset(t);
    CHECK_INT_EQ(core_state_load(blob, len, NULL, t, NULL, NULL, NULL, NULL, NULL, &err),
                 CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "ring") != NULL, "%s", err.msg);
    CHECK_INT_EQ(core_attn_state_pos(t), 0);
done:
    free(blob);
    core_attn_state_free(s);
    core_attn_state_free(t);
    free(scr);
    free(a);
    free(b);
}

TEST(export_import_continue_is_bit_identical)
{
    check_export_import(tiny);
    core_model_t *m = load_linear();
    if (m)
        check_export_import(m);
    core_model_free(m);
}

/* With a linear global layer the whole state is constant: its bytes and its
 * blob's at 40 tokens and at 700 (87 wraps of the rings); exact grows. */
TEST(linear_state_bytes_are_constant)
{
    enum { N = 700 };
    core_model_t *m = load_linear();
    int32_t *tok = malloc(N * sizeof *tok);
    float *lg = malloc((size_t)V * sizeof *lg);
    core_attn_state_t *s = m ? new_state(m) : NULL, *e = new_state(tiny);
    CHECK(tok && lg && s && e);
    if (!tok || !lg || !s || !e)
        goto done;
    rand_tokens(5, tok, N);
    size_t bytes[2], blob[2], ebytes[2];
    for (int i = 0, at = 0; i < 2; i++) {
        const int upto = i == 0 ? 40 : N;
        for (; at < upto; at += 20) {
            core_batch_seq_t sq = {.state = s, .tokens = tok + at, .n_tokens = 20,
                                   .logits_mode = CORE_LOGITS_LAST, .logits = lg};
            core_batch_seq_t se = sq;
            se.state = e;
            core_error_t err = {0};
            CHECK_MSG(core_model_forward(m, &sq, 1, &err) == 0, "%s", err.msg);
            /* the exact control up to the fixture's context of 256 */
            if (at < 200)
                CHECK_MSG(core_model_forward(tiny, &se, 1, &err) == 0, "%s", err.msg);
        }
        bytes[i] = core_attn_state_bytes(s);
        blob[i] = core_state_size(s, NULL, 0, 0);
        ebytes[i] = core_attn_state_bytes(e);
    }
    CHECK_INT_EQ(core_attn_state_pos(s), N);
    CHECK_MSG(bytes[0] == bytes[1], "state bytes %zu at 40, %zu at %d", bytes[0], bytes[1], N);
    CHECK_MSG(blob[0] == blob[1], "blob bytes %zu at 40, %zu at %d", blob[0], blob[1], N);
    CHECK(ebytes[1] > ebytes[0]); /* the exact global layer keeps every key (200 of them) */
done:
    core_attn_state_free(s);
    core_attn_state_free(e);
    core_model_free(m);
    free(tok);
    free(lg);
}

/* A DARKFormer adapter with Mat = I for the model at path, for the layers its
 * linear kind runs (a gemma3's global ones), naming fingerprint fp. */
static int write_identity_adapter(const char *model, const char *path, const char *fp)
{
    core_model_t *m = NULL;
    core_error_t err = {0};
    if (core_model_load(model, NULL, &m, &err) < 0)
        return -1;
    const core_model_info_t *in = core_model_info(m);
    const int hd = in->head_dim, L = core_attn_global_layers(core_attn_config(core_model_attn(m)));
    const size_t n = (size_t)L * (size_t)in->n_head_kv * (size_t)hd * (size_t)hd;
    float *mat = calloc(n, sizeof *mat);
    int rc = CORE_ENOMEM;
    if (mat) {
        for (size_t b = 0; b < n; b += (size_t)hd * hd)
            for (int i = 0; i < hd; i++)
                mat[b + (size_t)i * hd + i] = 1.0f;
        core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = L,
                                          .n_head = in->n_head, .n_head_kv = in->n_head_kv,
                                          .head_dim = hd, .n_features = 16, .window = 4,
                                          .sinks = 2, .prerope = 1, .seed = 5,
                                          .base_fingerprint = fp, .mat = mat};
        rc = core_features_adapter_write(&d, path, &err);
        CHECK_MSG(rc == 0, "adapter: %s", err.msg);
    }
    free(mat);
    core_model_free(m);
    return rc;
}

/* A Gemma adapter on the Llama fixture and the Llama one on Gemma are
 * refused (by fingerprint; without one, by their layers and shapes); each
 * loads on its own model. */
TEST(adapter_of_the_other_family_is_refused)
{
    const char *llama = getenv("DARKSERVE_TINY_MODEL");
    CHECK_MSG(llama != NULL, "DARKSERVE_TINY_MODEL is not set (run through make unit)");
    if (!llama)
        return;
    core_model_t *lm = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_model_load(llama, NULL, &lm, &err) == 0, "%s", err.msg);
    if (!lm)
        return;
    char dir[] = "/tmp/darkserve_gemma_adapter_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char ga[80], la[80], gn[80], ln[80];
    snprintf(ga, sizeof ga, "%s/gemma.gguf", dir);
    snprintf(la, sizeof la, "%s/llama.gguf", dir);
    snprintf(gn, sizeof gn, "%s/gemma-nofp.gguf", dir);
    snprintf(ln, sizeof ln, "%s/llama-nofp.gguf", dir);
    CHECK_INT_EQ(write_identity_adapter(tiny_path, ga, core_model_info(tiny)->fingerprint), 0);
    CHECK_INT_EQ(write_identity_adapter(llama, la, core_model_info(lm)->fingerprint), 0);
    CHECK_INT_EQ(write_identity_adapter(tiny_path, gn, NULL), 0);
    CHECK_INT_EQ(write_identity_adapter(llama, ln, NULL), 0);
    core_model_opts_t o = {.attn_kind = CORE_ATTN_DARKFORMER, .n_features = 16, .window = 4,
                           .sinks = 2, .prerope = 1, .seed = 5};
    core_model_t *m = NULL;
    /* each on its own model */
    const char *own[2][2] = {{tiny_path, ga}, {llama, la}};
    for (int i = 0; i < 2; i++) {
        o.adapter_path = own[i][1];
        CHECK_MSG(core_model_load(own[i][0], &o, &m, &err) == 0, "%s: %s", own[i][1], err.msg);
        core_model_free(m);
        m = NULL;
    }
    /* crossed: the fingerprint says whose it is */
    const char *cross[2][2] = {{llama, ga}, {tiny_path, la}};
    for (int i = 0; i < 2; i++) {
        o.adapter_path = cross[i][1];
        CHECK_INT_EQ(core_model_load(cross[i][0], &o, &m, &err), CORE_EMISMATCH);
        CHECK(m == NULL);
        CHECK_MSG(strstr(err.msg, "fingerprint") != NULL, "%s", err.msg);
    }
    /* no fingerprint: the tensors do not fit the other model */
    const char *nofp[2][2] = {{llama, gn}, {tiny_path, ln}};
    for (int i = 0; i < 2; i++) {
        o.adapter_path = nofp[i][1];
        int rc = core_model_load(nofp[i][0], &o, &m, &err);
        CHECK_MSG(rc < 0, "%s loaded on %s", nofp[i][1], nofp[i][0]);
        CHECK(m == NULL);
        printf("  %s on %s: %s\n", nofp[i][1], nofp[i][0], err.msg);
    }
    unlink(ga);
    unlink(la);
    unlink(gn);
    unlink(ln);
    rmdir(dir);
    core_model_free(lm);
}

/* ---- small gemma3 models written with the core GGUF writer ---- */

enum { S_L = 2, S_D = 32, S_H = 2, S_HD = 16, S_FF = 64, S_V = 40 };

typedef struct synth {
    const char *skip_tensor; /* omit this tensor */
    const char *bad_tensor;  /* give this tensor one row too many */
    const char *skip_key;    /* omit this key */
    const char *float_key;   /* set this float key to float_val */
    double float_val;
    const char *int_key; /* set (or override) this uint32 key to int_val */
    int64_t int_val;
} synth_t;

static int add_tensor(core_gguf_writer_t *w, const synth_t *o, const char *name, int64_t ne0,
                      int64_t ne1, int norm, core_rng_t *r)
{
    if (o->skip_tensor && strcmp(name, o->skip_tensor) == 0)
        return 0;
    if (o->bad_tensor && strcmp(name, o->bad_tensor) == 0)
        ne1 = (ne1 > 0 ? ne1 : 1) + 1;
    int64_t ne[2] = {ne0, ne1 > 0 ? ne1 : 1};
    size_t n = (size_t)(ne[0] * ne[1]);
    float *data = malloc(n * sizeof *data);
    if (!data)
        return CORE_ENOMEM;
    for (size_t i = 0; i < n; i++)
        data[i] = (float)((norm ? 1.0 : 0.0) + (norm ? 0.1 : 0.3) * core_rng_normal(r));
    int rc = core_gguf_writer_add_tensor(w, name, CORE_TTYPE_F32, ne1 > 0 ? 2 : 1, ne, data,
                                         n * sizeof *data);
    free(data);
    return rc;
}

static int write_synth(const char *path, const synth_t *o)
{
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    core_rng_t r;
    core_rng_seed(&r, 5);
    struct {
        const char *key;
        int64_t v;
    } ints[] = {{"gemma3.block_count", S_L},
                {"gemma3.context_length", 64},
                {"gemma3.embedding_length", S_D},
                {"gemma3.feed_forward_length", S_FF},
                {"gemma3.attention.head_count", S_H},
                {"gemma3.attention.head_count_kv", 1},
                {"gemma3.attention.key_length", S_HD},
                {"gemma3.attention.value_length", S_HD},
                {"gemma3.attention.sliding_window", 4},
                {"gemma3.vocab_size", S_V}};
    int rc = core_gguf_writer_set_str(w, "general.architecture", "gemma3", 6);
    for (size_t i = 0; rc == 0 && i < sizeof ints / sizeof ints[0]; i++) {
        if ((o->skip_key && strcmp(o->skip_key, ints[i].key) == 0) ||
            (o->int_key && strcmp(o->int_key, ints[i].key) == 0))
            continue;
        rc = core_gguf_writer_set_int(w, ints[i].key, CORE_GGUF_TYPE_UINT32, ints[i].v);
    }
    if (rc == 0 && o->int_key)
        rc = core_gguf_writer_set_int(w, o->int_key, CORE_GGUF_TYPE_UINT32, o->int_val);
    if (rc == 0)
        rc = core_gguf_writer_set_float(w, "gemma3.rope.freq_base", CORE_GGUF_TYPE_FLOAT32, 1e6);
    if (rc == 0 && o->float_key)
        rc = core_gguf_writer_set_float(w, o->float_key, CORE_GGUF_TYPE_FLOAT32, o->float_val);
    if (rc == 0)
        rc = add_tensor(w, o, "token_embd.weight", S_D, S_V, 0, &r);
    if (rc == 0)
        rc = add_tensor(w, o, "output_norm.weight", S_D, 0, 1, &r);
    for (int l = 0; rc == 0 && l < S_L; l++) {
        struct {
            const char *suffix;
            int64_t ne0, ne1;
        } t[] = {{"attn_norm", S_D, 0},
                 {"attn_q", S_D, S_H * S_HD},
                 {"attn_k", S_D, S_HD},
                 {"attn_v", S_D, S_HD},
                 {"attn_q_norm", S_HD, 0},
                 {"attn_k_norm", S_HD, 0},
                 {"attn_output", S_H * S_HD, S_D},
                 {"post_attention_norm", S_D, 0},
                 {"ffn_norm", S_D, 0},
                 {"ffn_gate", S_D, S_FF},
                 {"ffn_up", S_D, S_FF},
                 {"ffn_down", S_FF, S_D},
                 {"post_ffw_norm", S_D, 0}};
        for (size_t i = 0; rc == 0 && i < sizeof t / sizeof t[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].suffix);
            rc = add_tensor(w, o, name, t[i].ne0, t[i].ne1, t[i].ne1 == 0, &r);
        }
    }
    core_error_t err = {0};
    if (rc == 0)
        rc = core_gguf_writer_write(w, path, &err);
    if (rc != 0)
        printf("  write_synth: %d %s\n", rc, err.msg);
    core_gguf_writer_free(w);
    return rc;
}

static int load_synth(const synth_t *o, core_model_t **out, core_error_t *err)
{
    char path[] = "/tmp/darkserve_gemma3_test_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -100;
    close(fd);
    int rc = write_synth(path, o);
    rc = rc == 0 ? core_model_load(path, NULL, out, err) : -100;
    unlink(path);
    return rc;
}

static void expect_reject(const synth_t *o, int code, const char *needle)
{
    core_model_t *m = NULL;
    core_error_t err = {0};
    int rc = load_synth(o, &m, &err);
    CHECK_MSG(rc == code, "expected %d, got %d (%s)", code, rc, err.msg);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' does not name '%s'", err.msg, needle);
    CHECK(m == NULL);
    core_model_free(m);
}

/* Logits of tokens 0..n-1 through a synthetic model (n <= 8). */
static int synth_logits(const synth_t *o, int n, float *out)
{
    core_model_t *m = NULL;
    core_error_t err = {0};
    int rc = load_synth(o, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc < 0)
        return rc;
    int32_t tok[8];
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(i * 5 % S_V);
    core_attn_state_t *s = new_state(m);
    rc = s ? feed(m, s, tok, n, 0, S_V, out) : -1;
    core_attn_state_free(s);
    core_model_free(m);
    return rc;
}

TEST(loader_accepts_valid_synthetic)
{
    core_model_t *m = NULL;
    core_error_t err = {0};
    synth_t o = {0};
    CHECK_MSG(load_synth(&o, &m, &err) == 0, "%s", err.msg);
    if (m) {
        CHECK_STR_EQ(core_model_info(m)->arch, "gemma3");
        CHECK_INT_EQ(core_model_info(m)->tied_output, 1);
        CHECK_INT_EQ(core_model_info(m)->n_vocab, S_V);
    }
    core_model_free(m);
}

TEST(loader_rejects_bad_gemma3_models)
{
    const char *names[] = {"blk.0.attn_q_norm.weight",
                           "blk.1.attn_k_norm.weight",
                           "blk.0.post_attention_norm.weight",
                           "blk.1.post_ffw_norm.weight",
                           "blk.0.attn_q.weight",
                           "blk.1.ffn_down.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        synth_t miss = {.skip_tensor = names[i]};
        expect_reject(&miss, CORE_EFORMAT, names[i]);
        synth_t bad = {.bad_tensor = names[i]};
        expect_reject(&bad, CORE_EFORMAT, names[i]);
    }
    const char *keys[] = {"gemma3.attention.sliding_window", "gemma3.block_count",
                          "gemma3.embedding_length"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        synth_t k = {.skip_key = keys[i]};
        expect_reject(&k, CORE_EFORMAT, keys[i]);
    }
    synth_t w0 = {.int_key = "gemma3.attention.sliding_window", .int_val = 0};
    expect_reject(&w0, CORE_ERANGE, "sliding_window");
    synth_t per = {.int_key = "gemma3.attention.sliding_window_pattern", .int_val = 0};
    expect_reject(&per, CORE_ERANGE, "sliding_window_pattern");
    synth_t kv = {.int_key = "gemma3.attention.head_count_kv", .int_val = 3};
    expect_reject(&kv, CORE_EFORMAT, "head_count");
    synth_t rot = {.int_key = "gemma3.rope.dimension_count", .int_val = 8};
    expect_reject(&rot, CORE_EFORMAT, "gemma3.rope.dimension_count");
    synth_t cap = {.float_key = "gemma3.attn_logit_softcapping", .float_val = 50.0};
    expect_reject(&cap, CORE_EUNSUPPORTED, "attn_logit_softcapping");
    synth_t neg = {.float_key = "gemma3.final_logit_softcapping", .float_val = -1.0};
    expect_reject(&neg, CORE_ERANGE, "final_logit_softcapping");
    synth_t sc = {.float_key = "gemma3.attention.scale", .float_val = 0.0};
    expect_reject(&sc, CORE_ERANGE, "gemma3.attention.scale");
    synth_t nan_sc = {.float_key = "gemma3.attention.scale", .float_val = NAN};
    expect_reject(&nan_sc, CORE_ERANGE, "gemma3.attention.scale");
    synth_t base = {.float_key = "gemma3.rope.freq_base_swa", .float_val = 0.5};
    expect_reject(&base, CORE_ERANGE, "gemma3.rope.freq_base_swa");
}

/* final_logit_softcapping c: every logit is c·tanh(z/c) of the uncapped one. */
TEST(final_logit_softcapping)
{
    enum { N = 6 };
    float plain[N * S_V], capped[N * S_V];
    synth_t o = {0};
    synth_t c = {.float_key = "gemma3.final_logit_softcapping", .float_val = 0.75};
    if (synth_logits(&o, N, plain) < 0 || synth_logits(&c, N, capped) < 0)
        return;
    double worst = 0.0, zmax = 0.0;
    for (int i = 0; i < N * S_V; i++) {
        const double want = 0.75 * tanh(plain[i] / 0.75);
        worst = fmax(worst, fabs(capped[i] - want));
        zmax = fmax(zmax, fabs(plain[i]));
        CHECK(fabs(capped[i]) <= 0.75);
    }
    CHECK_MSG(worst < 1e-6, "capped logits off by %.3g", worst);
    CHECK_MSG(zmax > 1.5, "logits too small (%.3g) for the cap to show", zmax);
}

/* attention.scale: 1/sqrt(Hd) written out is the default, bit for bit; another
 * scale changes the logits. */
TEST(attention_scale_from_the_file)
{
    enum { N = 6 };
    float dflt[N * S_V], same[N * S_V], other[N * S_V];
    synth_t o = {0};
    synth_t s1 = {.float_key = "gemma3.attention.scale", .float_val = 0.25}; /* 1/sqrt(16) */
    synth_t s2 = {.float_key = "gemma3.attention.scale", .float_val = 0.05};
    if (synth_logits(&o, N, dflt) < 0 || synth_logits(&s1, N, same) < 0 ||
        synth_logits(&s2, N, other) < 0)
        return;
    CHECK(rel_diff(same, dflt, N, S_V) == 0.0);
    CHECK(rel_diff(other, dflt, N, S_V) > 1e-3);
}

int main(void)
{
    tiny_path = getenv("DARKSERVE_TINY_GEMMA");
    if (!tiny_path) {
        printf("DARKSERVE_TINY_GEMMA is not set (run through make unit)\n");
        return 1;
    }
    core_error_t err = {0};
    if (core_model_load(tiny_path, NULL, &tiny, &err) < 0) {
        printf("cannot load %s: %s\n", tiny_path, err.msg);
        return 1;
    }
    V = core_model_info(tiny)->n_vocab;
    RUN(tiny_gemma3_info);
    RUN(chunked_prefill_matches_one_call);
    RUN(batched_matches_alone);
    RUN(linear_kinds_run_the_global_layers);
    RUN(linear_chunked_prefill_matches_one_call);
    RUN(export_import_continue_is_bit_identical);
    RUN(linear_state_bytes_are_constant);
    RUN(adapter_of_the_other_family_is_refused);
    RUN(loader_accepts_valid_synthetic);
    RUN(loader_rejects_bad_gemma3_models);
    RUN(final_logit_softcapping);
    RUN(attention_scale_from_the_file);
    core_model_free(tiny);
    return CHECK_DONE();
}
