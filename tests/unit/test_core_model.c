/* core/model.c on the tiny fixture model (env DARKSERVE_TINY_MODEL): batching,
 * chunking and error behavior are checked against the model run in the
 * simplest way (one sequence, one call); correctness of that simplest way is
 * the numpy oracle's job (tests/reference/test_model_oracle.py). The loader's
 * validation runs on small models written here with the core GGUF writer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"
#include "core/state.h"
#include "core/tensor.h"

static core_model_t *tiny;     /* loaded once, default options */
static core_model_t *tiny_32;  /* the same with max_ctx = 32 */
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

static void rand_tokens(core_rng_t *r, int32_t *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)(core_rng_u64(r) % (uint64_t)V);
}

static core_attn_state_t *new_state(core_model_t *m)
{
    core_attn_state_t *s = NULL;
    core_error_t err = {0};
    if (core_attn_state_new(core_model_attn(m), &s, &err) < 0)
        printf("  state: %s\n", err.msg);
    return s;
}

/* Runs tokens through s in chunks of `chunk` (0 = one call); logits [n][V] of
 * every position into out (may be NULL). */
static int feed(core_model_t *m, core_attn_state_t *s, const int32_t *tok, int64_t n, int64_t chunk,
                float *out)
{
    if (chunk <= 0)
        chunk = n;
    for (int64_t i = 0; i < n; i += chunk) {
        core_batch_seq_t sq = {.state = s, .tokens = tok + i,
                               .n_tokens = n - i < chunk ? n - i : chunk,
                               .logits_mode = out ? CORE_LOGITS_ALL : CORE_LOGITS_NONE,
                               .logits = out ? out + i * V : NULL};
        core_error_t err = {0};
        int rc = core_model_forward(m, &sq, 1, &err);
        if (rc < 0) {
            printf("  forward: %s\n", err.msg);
            return rc;
        }
    }
    return 0;
}

TEST(tiny_info)
{
    const core_model_info_t *in = core_model_info(tiny);
    CHECK_STR_EQ(in->arch, "llama");
    CHECK_INT_EQ(in->n_layer, 3);
    CHECK_INT_EQ(in->n_embd, 64);
    CHECK_INT_EQ(in->n_ff, 128);
    CHECK_INT_EQ(in->n_head, 4);
    CHECK_INT_EQ(in->n_head_kv, 2);
    CHECK_INT_EQ(in->head_dim, 16);
    CHECK_INT_EQ(in->n_ctx_train, 512);
    CHECK_INT_EQ(in->tied_output, 0);
    CHECK_NEAR(in->rope_base, 10000.0, 1e-12);
    CHECK_NEAR(in->rope_scale, 1.0, 1e-12);
    CHECK(V >= 256 && V <= 1024);
    /* embeddings + output head + final norm + per layer: 2 norms, Q, K, V, O, 3 FFN */
    const uint64_t D = 64, FF = 128, qd = 64, kvd = 32, L = 3;
    const uint64_t want = 2 * (uint64_t)V * D + D + L * (2 * D + D * qd + 2 * D * kvd + qd * D + 3 * D * FF);
    CHECK_INT_EQ(in->n_params, want);
    CHECK_INT_EQ(strlen(in->fingerprint), 16);
    CHECK(strspn(in->fingerprint, "0123456789abcdef") == 16);
    CHECK_STR_EQ(core_model_info(tiny_32)->fingerprint, in->fingerprint);
    CHECK(core_model_gguf(tiny) != NULL);
    CHECK_INT_EQ(core_attn_config(core_model_attn(tiny_32))->max_ctx, 32);
    CHECK_INT_EQ(core_attn_config(core_model_attn(tiny))->max_ctx, 512);
}

/* The prompt rows' products on the f32 panels (off) or, where the CPU has
 * them, the AMX-BF16 tiles (on; core/kernels/qdot.h): the tolerance each is held
 * to when a prompt is fed in other pieces. The pieces change the attention
 * sums by float rounding; the panels carry that through as it is, the
 * tiles' bf16 split of every activation can turn a last-bit change into one
 * of ~2^-17 of that value (its lo part rounds the other way), measured up to
 * 2.9e-5 on this random-weight model. Returns how many modes there are
 * here (1 or 2); sets mode i and its tolerance. */
static int prompt_modes(int i, double *tol)
{
    const int n = core_q8_amx_panels_available() ? 2 : 1;
    if (i < n) {
        CHECK_INT_EQ(core_q8_force_amx_panels(i == 0 ? CORE_Q8_AMX_OFF : CORE_Q8_AMX_ON), 0);
        *tol = i == 0 ? 1e-5 : 1e-4;
    } else {
        CHECK_INT_EQ(core_q8_force_amx_panels(CORE_Q8_AMX_AUTO), 0);
    }
    return n;
}

TEST(chunked_prefill_matches_one_call)
{
    enum { N = 150 };
    core_rng_t r;
    core_rng_seed(&r, 1);
    int32_t tok[N];
    rand_tokens(&r, tok, N);
    float *ref = malloc((size_t)N * (size_t)V * sizeof *ref);
    float *got = malloc((size_t)N * (size_t)V * sizeof *got);
    const int64_t chunks[] = {1, 7, 64, 149};
    core_attn_state_t *s = new_state(tiny);
    double tol = 0;
    for (int mode = 0; mode < prompt_modes(mode, &tol); mode++) {
        core_attn_state_reset(s);
        CHECK_INT_EQ(feed(tiny, s, tok, N, 0, ref), 0);
        CHECK_INT_EQ(core_attn_state_pos(s), N);
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            core_attn_state_reset(s);
            memset(got, 0, (size_t)N * (size_t)V * sizeof *got);
            CHECK_INT_EQ(feed(tiny, s, tok, N, chunks[c], got), 0);
            /* A call of one token is a decode step: 8-bit activations
             * (core/kernels/qdot.h), measured up to 7.2e-2 of the largest |logit|
             * on this random-weight model; the other rows differ by float
             * rounding (prompt_modes). */
            for (int64_t i = 0; i < N; i++) {
                const int one = chunks[c] == 1 || (N % chunks[c] == 1 && i == N - 1);
                const double d = rel_diff(got + i * V, ref + i * V, 1, V);
                CHECK_MSG(d <= (one ? 1e-1 : tol), "mode %d chunk %lld row %lld: rel diff %.3g",
                          mode, (long long)chunks[c], (long long)i, d);
            }
        }
        /* the logits are not degenerate: positions differ from one another */
        CHECK(rel_diff(ref, ref + V, 1, V) > 1e-2);
    }
    core_attn_state_free(s);
    free(ref);
    free(got);
}

/* Prompt products through dequantized weight tiles: a tile of a few rows
 * (every matrix crosses many tile boundaries, the last tile partial) gives
 * the logits of the default one-tile products, and of the products that
 * read the blocks in place (a chunk of at most MODEL_TILE_MIN_ROWS rows). */
/* The tiny model with 7-row weight tiles (7 * 64 + 5 floats); NULL, with a
 * failed check, when it does not load. */
static core_model_t *load_small_tiles(void)
{
    core_model_opts_t o = {.tile_floats = 7 * 64 + 5};
    core_model_t *small = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_model_load(getenv("DARKSERVE_TINY_MODEL"), &o, &small, &err) == 0, "%s",
              err.msg);
    return small;
}

TEST(weight_tiles_match_one_tile)
{
    enum { N = 100 };
    core_model_t *small = load_small_tiles();
    if (!small)
        return;
    core_rng_t r;
    core_rng_seed(&r, 9);
    int32_t tok[N];
    rand_tokens(&r, tok, N);
    float *ref = malloc((size_t)N * (size_t)V * sizeof *ref);
    float *got = malloc((size_t)N * (size_t)V * sizeof *got);
    core_attn_state_t *s = new_state(tiny), *t = new_state(small);
    double tol = 0;
    for (int mode = 0; mode < prompt_modes(mode, &tol); mode++) {
        core_attn_state_reset(s);
        core_attn_state_reset(t);
        CHECK_INT_EQ(feed(tiny, s, tok, N, 0, ref), 0);
        CHECK_INT_EQ(feed(small, t, tok, N, 0, got), 0);
        double d = rel_diff(got, ref, N, V);
        /* sgemm rounds by its split; the tiles by their bf16 parts */
        CHECK_MSG(d <= tol, "mode %d small tiles: rel diff %.3g", mode, d);
        core_attn_state_reset(t);
        CHECK_INT_EQ(feed(small, t, tok, N, 20, got), 0); /* 20 rows: in place */
        d = rel_diff(got, ref, N, V);
        CHECK_MSG(d <= tol, "mode %d in place: rel diff %.3g", mode, d);
    }
    core_attn_state_free(s);
    core_attn_state_free(t);
    core_model_free(small);
    free(ref);
    free(got);
}

TEST(last_mode_equals_last_row_of_all)
{
    enum { N = 20 };
    core_rng_t r;
    core_rng_seed(&r, 2);
    int32_t tok[N];
    rand_tokens(&r, tok, N);
    float *all = malloc((size_t)N * (size_t)V * sizeof *all);
    float *last = malloc((size_t)V * sizeof *last);
    core_attn_state_t *s = new_state(tiny);
    CHECK_INT_EQ(feed(tiny, s, tok, N, 0, all), 0);
    core_attn_state_reset(s);
    core_batch_seq_t sq = {.state = s, .tokens = tok, .n_tokens = N,
                           .logits_mode = CORE_LOGITS_LAST, .logits = last};
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, NULL), 0);
    CHECK(rel_diff(last, all + (N - 1) * V, 1, V) <= 1e-5);
    core_attn_state_free(s);
    free(all);
    free(last);
}

/* The hidden rows (core_batch_seq_t.hidden) are the final-norm rows the
 * output head reads: multiplied by the head's weights (dequantized here, a
 * naive double dot) they give the logits of the same forward, at every
 * position, within the f32 prompt path's rounding. */
TEST(hidden_rows_give_the_logits)
{
    enum { N = 24 };
    const int64_t D = core_model_info(tiny)->n_embd;
    core_rng_t r;
    core_rng_seed(&r, 5);
    int32_t tok[N];
    rand_tokens(&r, tok, N);
    float *logits = malloc((size_t)N * (size_t)V * sizeof *logits);
    float *hid = malloc((size_t)N * (size_t)D * sizeof *hid);
    float *w = malloc((size_t)V * (size_t)D * sizeof *w);
    float *ref = malloc((size_t)N * (size_t)V * sizeof *ref);
    const core_gguf_tensor_t *t = core_gguf_find_tensor(core_model_gguf(tiny), "output.weight");
    CHECK(t != NULL);
    if (!t || !logits || !hid || !w || !ref)
        goto out;
    CHECK_INT_EQ(core_dequantize(t->type, t->data, w, (int64_t)V * D, NULL), 0);
    core_attn_state_t *s = new_state(tiny);
    core_batch_seq_t sq = {.state = s,
                           .tokens = tok,
                           .n_tokens = N,
                           .logits_mode = CORE_LOGITS_ALL,
                           .logits = logits,
                           .hidden = hid};
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, NULL), 0);
    for (int64_t i = 0; i < N; i++)
        for (int64_t v = 0; v < V; v++) {
            double acc = 0.0;
            for (int64_t d = 0; d < D; d++)
                acc += (double)hid[i * D + d] * (double)w[v * D + d];
            ref[i * V + v] = (float)acc;
        }
    CHECK(rel_diff(logits, ref, N, V) <= 1e-4);
    /* and they do not depend on the logits being asked for */
    float *hid2 = malloc((size_t)N * (size_t)D * sizeof *hid2);
    core_attn_state_reset(s);
    core_batch_seq_t sq2 = {
        .state = s, .tokens = tok, .n_tokens = N, .logits_mode = CORE_LOGITS_NONE, .hidden = hid2};
    CHECK_INT_EQ(core_model_forward(tiny, &sq2, 1, NULL), 0);
    CHECK(hid2 && memcmp(hid, hid2, (size_t)N * (size_t)D * sizeof *hid) == 0);
    free(hid2);
    core_attn_state_free(s);
out:
    free(logits);
    free(hid);
    free(w);
    free(ref);
}

/* B sequences with different histories; one batched forward mixing prefill
 * chunks, single-token decode steps and every logits mode must equal running
 * each sequence alone, over several steps, bit for bit: core/model.c runs
 * each sequence's rows through the products it would get alone (the 8-bit
 * decode path would turn any last-bit difference into a visible one). */
/* A batch of sequences in mixed states (prompt chunks, decode rows) gives
 * every sequence the logits it gets alone, bit for bit, on model mdl. */
static void batched_check(core_model_t *mdl)
{
    enum { B = 7, STEPS = 3 };
    const int64_t prefix[B] = {0, 30, 12, 3, 70, 5, 9};
    /* tokens per step per sequence; more than 32 (MODEL_TILE_MIN_ROWS) go to
     * dequantized weight tiles, shared by the sequences of a step; six
     * decode rows in step 1 fill two of the per-row units the pool shares
     * out (core/model.c's layer_rows: LoRA, RoPE, RMSNorm, quantization) */
    const int64_t n_new[STEPS][B] = {
        {40, 1, 5, 1, 100, 1, 1}, {1, 1, 9, 1, 1, 1, 1}, {1, 80, 1, 2, 1, 1, 3}};
    const int mode[B] = {CORE_LOGITS_ALL, CORE_LOGITS_LAST, CORE_LOGITS_ALL, CORE_LOGITS_LAST,
                         CORE_LOGITS_NONE, CORE_LOGITS_LAST, CORE_LOGITS_ALL};
    core_rng_t r;
    core_rng_seed(&r, 3);
    core_attn_state_t *sb[B], *sa[B];
    int32_t *pre = malloc(100 * sizeof *pre);
    for (int b = 0; b < B; b++) {
        sb[b] = new_state(mdl);
        sa[b] = new_state(mdl);
        rand_tokens(&r, pre, prefix[b]);
        if (prefix[b] > 0) {
            CHECK_INT_EQ(feed(mdl, sb[b], pre, prefix[b], 0, NULL), 0);
            CHECK_INT_EQ(core_attn_state_copy(sa[b], sb[b], NULL), 0);
        }
    }
    int32_t *tok = malloc(200 * sizeof *tok);
    float *lb[B], *la[B];
    for (int b = 0; b < B; b++) {
        lb[b] = malloc(100 * (size_t)V * sizeof(float));
        la[b] = malloc(100 * (size_t)V * sizeof(float));
    }
    for (int st = 0; st < STEPS; st++) {
        core_batch_seq_t seqs[B];
        int64_t off = 0;
        for (int b = 0; b < B; b++) {
            rand_tokens(&r, tok + off, n_new[st][b]);
            seqs[b] = (core_batch_seq_t){.state = sb[b], .tokens = tok + off,
                                         .n_tokens = n_new[st][b], .logits_mode = mode[b],
                                         .logits = mode[b] ? lb[b] : NULL};
            off += n_new[st][b];
        }
        core_error_t err = {0};
        int rc = core_model_forward(mdl, seqs, B, &err);
        CHECK_MSG(rc == 0, "step %d: %s", st, err.msg);
        for (int b = 0; b < B; b++) {
            core_batch_seq_t one = seqs[b];
            one.state = sa[b];
            one.logits = mode[b] ? la[b] : NULL;
            CHECK_INT_EQ(core_model_forward(mdl, &one, 1, NULL), 0);
            CHECK_INT_EQ(core_attn_state_pos(sa[b]), core_attn_state_pos(sb[b]));
            if (mode[b]) {
                int64_t rows = mode[b] == CORE_LOGITS_ALL ? n_new[st][b] : 1;
                double d = rel_diff(lb[b], la[b], rows, V);
                CHECK_MSG(d == 0, "step %d seq %d: rel diff %.3g", st, b, d);
            }
        }
    }
    for (int b = 0; b < B; b++) {
        int64_t want = prefix[b];
        for (int st = 0; st < STEPS; st++)
            want += n_new[st][b];
        CHECK_INT_EQ(core_attn_state_pos(sb[b]), want);
        core_attn_state_free(sb[b]);
        core_attn_state_free(sa[b]);
        free(lb[b]);
        free(la[b]);
    }
    free(pre);
    free(tok);
}

TEST(batched_matches_alone)
{
    batched_check(tiny);
}

/* The same with weight tiles much smaller than a matrix: every tile is
 * dequantized once and shared by the long prompt sequences of a step. */
TEST(batched_matches_alone_small_tiles)
{
    core_model_t *small = load_small_tiles();
    if (!small)
        return;
    batched_check(small);
    core_model_free(small);
}

/* The tiny model with a DARKFormer adapter (M = I, 16 features, W = 8) that
 * carries a rank-2 LoRA drawn from lora_seed (0: no LoRA). */
static core_model_t *load_lora_model(uint64_t lora_seed)
{
    const core_model_info_t *in = core_model_info(tiny);
    const int L = in->n_layer, Hkv = in->n_head_kv, Hd = in->head_dim, r = 2;
    const int64_t D = in->n_embd, qd = (int64_t)in->n_head * Hd, kvd = (int64_t)Hkv * Hd;
    const int64_t size[8] = {r * D, qd * r, r * D, kvd * r, r * D, kvd * r, r * qd, D * r};
    float *mat = calloc((size_t)L * Hkv * Hd * Hd, sizeof *mat), *lora[8] = {0};
    core_rng_t rng;
    core_rng_seed(&rng, lora_seed);
    for (int i = 0; i < L * Hkv; i++)
        for (int d = 0; d < Hd; d++)
            mat[((size_t)i * Hd + d) * Hd + d] = 1.0f;
    for (int p = 0; p < 8 && lora_seed; p++) {
        lora[p] = malloc((size_t)L * (size_t)size[p] * sizeof(float));
        for (int64_t i = 0; i < L * size[p]; i++)
            lora[p][i] = (float)(core_rng_uniform(&rng) - 0.5) * 0.2f;
    }
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = L,
                                      .n_head = in->n_head, .n_head_kv = Hkv, .head_dim = Hd,
                                      .n_features = 16, .window = 8, .mat = mat,
                                      .lora_rank = lora_seed ? r : 0, .n_embd = (int)D};
    memcpy(d.lora, lora, sizeof d.lora);
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_model_lora_%d.gguf", (int)getpid());
    core_error_t err = {0};
    core_model_t *m = NULL;
    CHECK_MSG(core_features_adapter_write(&d, path, &err) == 0, "%s", err.msg);
    core_model_opts_t o = {.attn_kind = CORE_ATTN_DARKFORMER, .adapter_path = path,
                           .n_features = 16, .window = 8};
    CHECK_MSG(core_model_load(getenv("DARKSERVE_TINY_MODEL"), &o, &m, &err) == 0, "%s", err.msg);
    remove(path);
    free(mat);
    for (int p = 0; p < 8; p++)
        free(lora[p]);
    return m;
}

/* The same with an adapter that carries a LoRA (core/lora.c): its products
 * are grouped like the weights' so batching changes nothing either. */
TEST(batched_matches_alone_with_lora)
{
    core_model_t *m = load_lora_model(11);
    if (m)
        batched_check(m);
    core_model_free(m);
}

/* Where the CPU and OS run Intel AMX tiles: a decode step of
 * CORE_Q8_AMX_MIN_ROWS + 1 sequences (its packed products on the tiles, as
 * the server runs such a batch) gives the logits of the same step with the
 * tiles off, bit for bit; and a mixed batch with the tiles forced for every
 * row count still gives each sequence its logits alone. */
TEST(amx_tiles_match_vector_units)
{
    if (!core_q8_amx_available()) {
        printf("  (skipped: no AMX tiles on this CPU or OS)\n");
        return;
    }
    enum { B = CORE_Q8_AMX_MIN_ROWS + 1 };
    core_rng_t r;
    core_rng_seed(&r, 31);
    core_attn_state_t *st[2][B];
    int32_t pre[8], tok[B];
    float *lg[2];
    lg[0] = malloc((size_t)B * (size_t)V * sizeof(float));
    lg[1] = malloc((size_t)B * (size_t)V * sizeof(float));
    for (int b = 0; b < B; b++) {
        st[0][b] = new_state(tiny);
        st[1][b] = new_state(tiny);
        rand_tokens(&r, pre, 3 + b % 5);
        CHECK_INT_EQ(feed(tiny, st[0][b], pre, 3 + b % 5, 0, NULL), 0);
        CHECK_INT_EQ(core_attn_state_copy(st[1][b], st[0][b], NULL), 0);
    }
    rand_tokens(&r, tok, B);
    for (int off = 0; off < 2; off++) { /* tiles (AUTO), then the vector units */
        CHECK_INT_EQ(core_q8_force_amx(off ? CORE_Q8_AMX_OFF : CORE_Q8_AMX_AUTO), 0);
        core_batch_seq_t seqs[B];
        for (int b = 0; b < B; b++)
            seqs[b] = (core_batch_seq_t){.state = st[off][b], .tokens = tok + b, .n_tokens = 1,
                                         .logits_mode = CORE_LOGITS_LAST,
                                         .logits = lg[off] + (size_t)b * V};
        CHECK_INT_EQ(core_model_forward(tiny, seqs, B, NULL), 0);
    }
    CHECK_MSG(memcmp(lg[0], lg[1], (size_t)B * (size_t)V * sizeof(float)) == 0,
              "a decode step of %d rows differs on the tiles", (int)B);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_ON), 0);
    batched_check(tiny);
    CHECK_INT_EQ(core_q8_force_amx(CORE_Q8_AMX_AUTO), 0);
    for (int b = 0; b < B; b++) {
        core_attn_state_free(st[0][b]);
        core_attn_state_free(st[1][b]);
    }
    free(lg[0]);
    free(lg[1]);
}

/* The LoRA shapes the keys and values a state holds, so it is part of the
 * parameter digest: a state made under one LoRA is refused under another or
 * under none, and accepted under the same one. */
TEST(state_digest_covers_the_lora)
{
    core_model_t *m[3] = {load_lora_model(11), load_lora_model(12), load_lora_model(0)};
    core_model_t *same = load_lora_model(11);
    if (!m[0] || !m[1] || !m[2] || !same)
        goto out;
    uint64_t dg[3];
    for (int i = 0; i < 3; i++)
        dg[i] = core_state_params_digest(core_model_attn(m[i]));
    CHECK(dg[0] != dg[1] && dg[0] != dg[2] && dg[1] != dg[2]);
    CHECK(dg[0] == core_state_params_digest(core_model_attn(same)));
    core_attn_state_t *s = new_state(m[0]);
    int32_t tok[20];
    core_rng_t r;
    core_rng_seed(&r, 5);
    rand_tokens(&r, tok, 20);
    CHECK_INT_EQ(feed(m[0], s, tok, 20, 0, NULL), 0);
    core_state_desc_t d = {.fingerprint = core_model_info(m[0])->fingerprint, .state = s};
    size_t n = core_state_size(s, NULL, 0, 0), len = 0;
    void *blob = malloc(n);
    CHECK_INT_EQ(core_state_save(&d, blob, n, &len, NULL), 0);
    core_model_t *into[3] = {m[1], m[2], same};
    for (int i = 0; i < 3; i++) {
        core_attn_state_t *t = new_state(into[i]);
        core_error_t err = {0};
        int rc = core_state_load(blob, len, NULL, t, NULL, NULL, NULL, NULL, NULL, &err);
        if (i < 2) {
            CHECK_INT_EQ(rc, CORE_EMISMATCH);
            CHECK_MSG(strstr(err.msg, "other darkformer parameters") != NULL, "%s", err.msg);
        } else {
            CHECK_MSG(rc == 0, "%s", err.msg);
            CHECK_INT_EQ(core_attn_state_pos(t), 20);
        }
        core_attn_state_free(t);
    }
    free(blob);
    core_attn_state_free(s);
out:
    for (int i = 0; i < 3; i++)
        core_model_free(m[i]);
    core_model_free(same);
}

TEST(overflow_in_batch_leaves_every_state_untouched)
{
    core_rng_t r;
    core_rng_seed(&r, 4);
    int32_t pre[30], tok[8];
    rand_tokens(&r, pre, 30);
    rand_tokens(&r, tok, 8);
    core_attn_state_t *a = new_state(tiny_32), *b = new_state(tiny_32), *ref = new_state(tiny_32);
    CHECK_INT_EQ(feed(tiny_32, a, pre, 10, 0, NULL), 0);
    CHECK_INT_EQ(feed(tiny_32, b, pre, 30, 0, NULL), 0);
    CHECK_INT_EQ(core_attn_state_copy(ref, a, NULL), 0);
    float *la = malloc(2 * (size_t)V * sizeof *la), *lb = malloc(5 * (size_t)V * sizeof *lb);
    for (int64_t i = 0; i < 2 * V; i++)
        la[i] = 12345.0f;
    core_batch_seq_t seqs[2] = {
        {.state = a, .tokens = tok, .n_tokens = 2, .logits_mode = CORE_LOGITS_ALL, .logits = la},
        {.state = b, .tokens = tok + 2, .n_tokens = 5, .logits_mode = CORE_LOGITS_LAST,
         .logits = lb},
    };
    core_error_t err = {0};
    CHECK_INT_EQ(core_model_forward(tiny_32, seqs, 2, &err), CORE_ECONTEXT);
    CHECK_STR_EQ(err.msg, "context length 32 exceeded: have 30, need 35");
    CHECK_INT_EQ(core_attn_state_pos(a), 10);
    CHECK_INT_EQ(core_attn_state_pos(b), 30);
    CHECK(la[0] == 12345.0f && la[2 * V - 1] == 12345.0f);
    /* a continues exactly as if the failed batch never happened */
    float *lr = malloc(2 * (size_t)V * sizeof *lr);
    CHECK_INT_EQ(feed(tiny_32, a, tok, 2, 0, la), 0);
    CHECK_INT_EQ(feed(tiny_32, ref, tok, 2, 0, lr), 0);
    CHECK(rel_diff(la, lr, 2, V) == 0.0);
    /* b can still use its last two slots */
    seqs[1].n_tokens = 2;
    CHECK_INT_EQ(core_model_forward(tiny_32, &seqs[1], 1, &err), 0);
    CHECK_INT_EQ(core_attn_state_pos(b), 32);
    core_attn_state_free(a);
    core_attn_state_free(b);
    core_attn_state_free(ref);
    free(la);
    free(lb);
    free(lr);
}

TEST(bad_batches_are_refused)
{
    core_attn_state_t *s = new_state(tiny), *s2 = new_state(tiny);
    int32_t tok[3] = {1, 2, 3};
    float *lg = malloc(3 * (size_t)V * sizeof *lg);
    core_error_t err = {0};
    core_batch_seq_t sq = {.state = s, .tokens = tok, .n_tokens = 3,
                           .logits_mode = CORE_LOGITS_ALL, .logits = lg};
    tok[1] = V;
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    tok[1] = -1;
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, &err), CORE_EINVAL);
    tok[1] = 2;
    sq.logits = NULL;
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, &err), CORE_EINVAL);
    sq.logits = lg;
    sq.n_tokens = 0;
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, &err), CORE_EINVAL);
    sq.n_tokens = 3;
    sq.logits_mode = 7;
    CHECK_INT_EQ(core_model_forward(tiny, &sq, 1, &err), CORE_EINVAL);
    sq.logits_mode = CORE_LOGITS_LAST;
    core_batch_seq_t two[2] = {sq, sq};
    CHECK_INT_EQ(core_model_forward(tiny, two, 2, &err), CORE_EINVAL);
    CHECK(strstr(err.msg, "share") != NULL);
    /* more rows than one forward may carry */
    int32_t *big = calloc(4097, sizeof *big);
    core_batch_seq_t many[2] = {
        {.state = s, .tokens = big, .n_tokens = 4000, .logits_mode = CORE_LOGITS_NONE},
        {.state = s2, .tokens = big, .n_tokens = 97, .logits_mode = CORE_LOGITS_NONE},
    };
    CHECK_INT_EQ(core_model_forward(tiny, many, 2, &err), CORE_ERANGE);
    CHECK(strstr(err.msg, "4096") != NULL);
    /* the message's running total must not overflow for an absurd count */
    many[1].n_tokens = INT64_MAX;
    CHECK_INT_EQ(core_model_forward(tiny, many, 2, &err), CORE_ERANGE);
    CHECK(strstr(err.msg, "brings it to 9223372036854779807)") != NULL);
    CHECK_INT_EQ(core_attn_state_pos(s), 0);
    CHECK_INT_EQ(core_attn_state_pos(s2), 0);
    CHECK_INT_EQ(core_model_forward(tiny, NULL, 0, &err), 0);
    free(big);
    free(lg);
    core_attn_state_free(s);
    core_attn_state_free(s2);
}

TEST(fork_continues_like_the_original)
{
    core_rng_t r;
    core_rng_seed(&r, 5);
    int32_t pre[40], tok[6];
    rand_tokens(&r, pre, 40);
    rand_tokens(&r, tok, 6);
    core_attn_state_t *s = new_state(tiny), *f = new_state(tiny);
    CHECK_INT_EQ(feed(tiny, s, pre, 40, 0, NULL), 0);
    CHECK_INT_EQ(core_attn_state_copy(f, s, NULL), 0);
    float *a = malloc(6 * (size_t)V * sizeof *a), *b = malloc(6 * (size_t)V * sizeof *b);
    CHECK_INT_EQ(feed(tiny, s, tok, 6, 1, a), 0);
    CHECK_INT_EQ(feed(tiny, f, tok, 6, 1, b), 0);
    CHECK(rel_diff(b, a, 6, V) == 0.0);
    core_attn_state_free(s);
    core_attn_state_free(f);
    free(a);
    free(b);
}

/* ---- loader validation on small models written with the core GGUF writer */

typedef struct synth {
    const char *arch;        /* general.architecture */
    const char *skip_tensor; /* omit this tensor */
    const char *bad_tensor;  /* give this tensor one row too many */
    const char *skip_key;    /* omit this key */
    int n_head_kv;           /* llama.attention.head_count_kv */
    int tied;                /* omit output.weight */
    const char *extra_key;   /* an extra uint32 key set to 8 */
    int rope_freqs;          /* add a rope_freqs.weight tensor */
    int half;                /* F16 or BF16: every value rounded to that type, */
    int half_mats;           /* and the matrices stored in it (else F32) */
    int64_t tile_floats;     /* load option (0: the default) */
} synth_t;

enum { S_D = 32, S_H = 2, S_HD = 16, S_FF = 64, S_V = 40 };

static int add_f32(core_gguf_writer_t *w, const synth_t *o, const char *name, int64_t ne0,
                   int64_t ne1, core_rng_t *r)
{
    if (o->skip_tensor && strcmp(name, o->skip_tensor) == 0)
        return 0;
    if (o->bad_tensor && strcmp(name, o->bad_tensor) == 0)
        ne1 = (ne1 > 0 ? ne1 : 1) + 1;
    int64_t ne[2] = {ne0, ne1 > 0 ? ne1 : 1};
    size_t n = (size_t)(ne[0] * ne[1]);
    float *data = malloc(n * sizeof *data);
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        data[i] = (float)(0.2 * core_rng_normal(r));
        if (o->half == CORE_TTYPE_F16)
            data[i] = core_fp16_to_fp32(h[i] = core_fp32_to_fp16(data[i]));
        else if (o->half == CORE_TTYPE_BF16)
            data[i] = core_bf16_to_fp32(h[i] = core_fp32_to_bf16(data[i]));
    }
    int rc = o->half_mats && ne1 > 0
                 ? core_gguf_writer_add_tensor(w, name, o->half, 2, ne, h, n * sizeof *h)
                 : core_gguf_writer_add_tensor(w, name, CORE_TTYPE_F32, ne1 > 0 ? 2 : 1, ne, data,
                                               n * sizeof *data);
    free(data);
    free(h);
    return rc;
}

static int write_synth(const char *path, const synth_t *o)
{
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    core_rng_t r;
    core_rng_seed(&r, 9);
    const int kvh = o->n_head_kv ? o->n_head_kv : 1;
    struct {
        const char *key;
        int64_t v;
    } ints[] = {{"llama.block_count", 1},          {"llama.context_length", 64},
                {"llama.embedding_length", S_D},   {"llama.feed_forward_length", S_FF},
                {"llama.attention.head_count", S_H}, {"llama.attention.head_count_kv", kvh},
                {"llama.vocab_size", S_V}};
    int rc = core_gguf_writer_set_str(w, "general.architecture", o->arch, strlen(o->arch));
    for (size_t i = 0; rc == 0 && i < sizeof ints / sizeof ints[0]; i++) {
        if (o->skip_key && strcmp(o->skip_key, ints[i].key) == 0)
            continue;
        rc = core_gguf_writer_set_int(w, ints[i].key, CORE_GGUF_TYPE_UINT32, ints[i].v);
    }
    if (rc == 0 && o->extra_key)
        rc = core_gguf_writer_set_int(w, o->extra_key, CORE_GGUF_TYPE_UINT32, 8);
    if (rc == 0)
        rc = core_gguf_writer_set_float(w, "llama.rope.freq_base", CORE_GGUF_TYPE_FLOAT32, 10000.0);
    if (rc == 0 && o->rope_freqs)
        rc = add_f32(w, o, "rope_freqs.weight", S_HD / 2, 0, &r);
    const int64_t kvd = (int64_t)kvh * S_HD;
    if (rc == 0)
        rc = add_f32(w, o, "token_embd.weight", S_D, S_V, &r);
    if (rc == 0)
        rc = add_f32(w, o, "output_norm.weight", S_D, 0, &r);
    if (rc == 0 && !o->tied)
        rc = add_f32(w, o, "output.weight", S_D, S_V, &r);
    struct {
        const char *name;
        int64_t ne0, ne1;
    } t[] = {{"blk.0.attn_norm.weight", S_D, 0},    {"blk.0.attn_q.weight", S_D, S_H * S_HD},
             {"blk.0.attn_k.weight", S_D, kvd},     {"blk.0.attn_v.weight", S_D, kvd},
             {"blk.0.attn_output.weight", S_H * S_HD, S_D},
             {"blk.0.ffn_norm.weight", S_D, 0},     {"blk.0.ffn_gate.weight", S_D, S_FF},
             {"blk.0.ffn_up.weight", S_D, S_FF},    {"blk.0.ffn_down.weight", S_FF, S_D}};
    for (size_t i = 0; rc == 0 && i < sizeof t / sizeof t[0]; i++)
        rc = add_f32(w, o, t[i].name, t[i].ne0, t[i].ne1, &r);
    core_error_t err = {0};
    if (rc == 0)
        rc = core_gguf_writer_write(w, path, &err);
    if (rc != 0)
        printf("  write_synth: %d %s\n", rc, err.msg);
    core_gguf_writer_free(w);
    return rc;
}

/* Writes a synthetic model and loads it; returns the load result, err filled. */
static int load_synth(const synth_t *o, core_model_t **out, core_error_t *err)
{
    char path[] = "/tmp/darkserve_model_test_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -100;
    close(fd);
    int rc = write_synth(path, o);
    core_model_opts_t opts = {.tile_floats = o->tile_floats};
    if (rc == 0)
        rc = core_model_load(path, &opts, out, err);
    else
        rc = -100;
    unlink(path);
    return rc;
}

TEST(loader_accepts_valid_synthetic)
{
    core_model_t *m = NULL, *mt = NULL;
    core_error_t err = {0};
    synth_t o = {.arch = "llama"};
    int rc = load_synth(&o, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    synth_t t = {.arch = "llama", .tied = 1};
    rc = load_synth(&t, &mt, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (m && mt) {
        CHECK_INT_EQ(core_model_info(m)->tied_output, 0);
        CHECK_INT_EQ(core_model_info(mt)->tied_output, 1);
        CHECK_INT_EQ(core_model_info(m)->n_vocab, S_V);
        CHECK_INT_EQ(core_model_info(m)->head_dim, S_HD);
        CHECK(strcmp(core_model_info(m)->fingerprint, core_model_info(mt)->fingerprint) != 0);
        CHECK(strcmp(core_model_info(m)->fingerprint, core_model_info(tiny)->fingerprint) != 0);
        /* the tied model runs */
        core_attn_state_t *s = new_state(mt);
        int32_t tok[2] = {3, 39};
        float lg[S_V];
        core_batch_seq_t sq = {.state = s, .tokens = tok, .n_tokens = 2,
                               .logits_mode = CORE_LOGITS_LAST, .logits = lg};
        CHECK_INT_EQ(core_model_forward(mt, &sq, 1, NULL), 0);
        CHECK(isfinite(lg[0]) && isfinite(lg[S_V - 1]));
        core_attn_state_free(s);
    }
    core_model_free(m);
    core_model_free(mt);
    core_model_free(NULL);
}

/* F16 and BF16 matrices are read in place (core/qdot), not copied to f32:
 * a model whose matrices are stored in F16 (BF16) gives the logits of the
 * same model stored in F32 with the same values, on every path: a prompt of
 * more than 32 rows (dequantized weight tiles of 3 rows, many per matrix,
 * the last partial), one of at most 32 (read in place, f32 activations) and
 * decode rows (read in place). Up to float rounding: the products sum in
 * other orders. */
TEST(half_matrices_match_f32)
{
    const int halves[] = {CORE_TTYPE_F16, CORE_TTYPE_BF16};
    enum { N = 45 };
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 7 + 3) % S_V);
    for (int h = 0; h < 2; h++) {
        core_model_t *m[2] = {NULL, NULL}; /* values as F32, the same as F16/BF16 */
        for (int k = 0; k < 2; k++) {
            synth_t o = {
                .arch = "llama", .half = halves[h], .half_mats = k, .tile_floats = 3 * S_D};
            core_error_t err = {0};
            CHECK_MSG(load_synth(&o, &m[k], &err) == 0, "%s", err.msg);
        }
        if (!m[0] || !m[1])
            goto next;
        const int64_t chunks[] = {0, 20, 1}; /* one call (tiles), in place, decode */
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            float lg[2][N * S_V];
            for (int k = 0; k < 2; k++) {
                core_attn_state_t *s = new_state(m[k]);
                const int64_t step = chunks[c] ? chunks[c] : N;
                for (int64_t i = 0; i < N; i += step) {
                    core_batch_seq_t sq = {.state = s,
                                           .tokens = tok + i,
                                           .n_tokens = N - i < step ? N - i : step,
                                           .logits_mode = CORE_LOGITS_ALL,
                                           .logits = lg[k] + i * S_V};
                    CHECK_INT_EQ(core_model_forward(m[k], &sq, 1, NULL), 0);
                }
                core_attn_state_free(s);
            }
            int finite = 1; /* rel_diff passes NaN over */
            for (int i = 0; i < N * S_V; i++)
                finite &= isfinite(lg[0][i]) && isfinite(lg[1][i]);
            CHECK(finite);
            const double d = rel_diff(lg[1], lg[0], N, S_V);
            CHECK_MSG(d <= 1e-5, "%s chunk %lld: rel diff %.3g", h ? "BF16" : "F16",
                      (long long)chunks[c], d);
            CHECK(rel_diff(lg[0], lg[0] + S_V, 1, S_V) > 1e-2); /* not degenerate */
        }
    next:
        core_model_free(m[0]);
        core_model_free(m[1]);
    }
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

TEST(loader_rejects_bad_models)
{
    const char *names[] = {"token_embd.weight",      "output_norm.weight",   "blk.0.attn_q.weight",
                           "blk.0.attn_k.weight",    "blk.0.attn_output.weight",
                           "blk.0.ffn_up.weight",    "blk.0.ffn_down.weight", "blk.0.ffn_norm.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        synth_t miss = {.arch = "llama", .skip_tensor = names[i]};
        expect_reject(&miss, CORE_EFORMAT, names[i]);
        synth_t bad = {.arch = "llama", .bad_tensor = names[i]};
        expect_reject(&bad, CORE_EFORMAT, names[i]);
    }
    synth_t bad_out = {.arch = "llama", .bad_tensor = "output.weight"};
    expect_reject(&bad_out, CORE_EFORMAT, "output.weight");
    synth_t no_key = {.arch = "llama", .skip_key = "llama.feed_forward_length"};
    expect_reject(&no_key, CORE_EFORMAT, "llama.feed_forward_length");
    synth_t arch = {.arch = "gpt2"};
    expect_reject(&arch, CORE_EUNSUPPORTED, "gpt2");
    synth_t moe = {.arch = "llama", .extra_key = "llama.expert_count"};
    expect_reject(&moe, CORE_EUNSUPPORTED, "llama.expert_count");
    synth_t freqs = {.arch = "llama", .rope_freqs = 1};
    expect_reject(&freqs, CORE_EUNSUPPORTED, "rope_freqs.weight");
    synth_t heads = {.arch = "llama", .n_head_kv = 3};
    expect_reject(&heads, CORE_EFORMAT, "head_count");
    core_model_t *m = NULL;
    core_error_t err = {0};
    CHECK(core_model_load("/nonexistent/model.gguf", NULL, &m, &err) < 0);
    CHECK(m == NULL);
}

static const char *tiny_path;

/* A DARKFormer adapter with Mat = I for the tiny model that names base model
 * fp (NULL = no darkformer.base_fingerprint key). */
static int write_identity_adapter(const char *path, const char *fp)
{
    const core_model_info_t *in = core_model_info(tiny);
    const int hd = in->head_dim;
    const size_t n = (size_t)in->n_layer * (size_t)in->n_head_kv * (size_t)hd * (size_t)hd;
    float *mat = calloc(n, sizeof *mat);
    if (!mat)
        return CORE_ENOMEM;
    for (size_t b = 0; b < n; b += (size_t)hd * hd)
        for (int i = 0; i < hd; i++)
            mat[b + (size_t)i * hd + i] = 1.0f;
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = in->n_layer,
                                      .n_head = in->n_head, .n_head_kv = in->n_head_kv,
                                      .head_dim = hd, .n_features = 16, .window = 4, .sinks = 2,
                                      .seed = 5, .base_fingerprint = fp, .mat = mat};
    core_error_t err = {0};
    int rc = core_features_adapter_write(&d, path, &err);
    CHECK_MSG(rc == 0, "adapter: %s", err.msg);
    free(mat);
    return rc;
}

TEST(adapter_of_another_model_is_refused)
{
    char dir[] = "/tmp/darkserve_adapter_fp_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char good[64], wrong[64], none[64];
    snprintf(good, sizeof good, "%s/good.gguf", dir);
    snprintf(wrong, sizeof wrong, "%s/wrong.gguf", dir);
    snprintf(none, sizeof none, "%s/none.gguf", dir);
    const char *fp = core_model_info(tiny)->fingerprint;
    CHECK_INT_EQ(write_identity_adapter(good, fp), 0);
    CHECK_INT_EQ(write_identity_adapter(wrong, "0123456789abcdef"), 0);
    CHECK_INT_EQ(write_identity_adapter(none, NULL), 0);

    core_model_opts_t o = {.attn_kind = CORE_ATTN_DARKFORMER, .n_features = 16, .window = 4,
                           .seed = 5, .adapter_path = wrong};
    core_model_t *m = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_model_load(tiny_path, &o, &m, &err), CORE_EMISMATCH);
    CHECK(m == NULL);
    CHECK_MSG(strstr(err.msg, wrong) && strstr(err.msg, "0123456789abcdef") && strstr(err.msg, fp),
              "message '%s' names the adapter and both fingerprints", err.msg);
    /* whatever the kind: the adapter was given for this model */
    o.attn_kind = CORE_ATTN_EXACT;
    CHECK_INT_EQ(core_model_load(tiny_path, &o, &m, &err), CORE_EMISMATCH);
    CHECK(m == NULL);

    o.attn_kind = CORE_ATTN_DARKFORMER;
    const char *ok[] = {good, none}; /* its own fingerprint, or none recorded */
    for (int i = 0; i < 2; i++) {
        o.adapter_path = ok[i];
        int rc = core_model_load(tiny_path, &o, &m, &err);
        CHECK_MSG(rc == 0, "%s: %s", ok[i], err.msg);
        core_model_free(m);
        m = NULL;
    }
    unlink(good);
    unlink(wrong);
    unlink(none);
    rmdir(dir);
}

/* Whole pages of [p, p + n) mapped into this process now (/proc/self/pagemap,
 * bit 63); -1 when it cannot be read. */
static long present_pages(const void *p, size_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) / pg, b = ((uintptr_t)p + n) / pg;
    FILE *f = fopen("/proc/self/pagemap", "rb");
    if (!f)
        return -1;
    long count = 0;
    for (uintptr_t i = a; i < b; i++) {
        uint64_t e = 0;
        if (fseeko(f, (off_t)(i * sizeof e), SEEK_SET) != 0 || fread(&e, sizeof e, 1, f) != 1) {
            count = -1;
            break;
        }
        count += (long)(e >> 63);
    }
    fclose(f);
    return count;
}

/* Where the decode kernel reads a packed copy of the weights, nothing reads
 * the file's pages of those matrices after the load: not the prompt rows
 * (tiles of 40 rows, 10 rows in place), not the embedding lookups (tied
 * output), not decode. Their pages stay out of the resident set, so the
 * weights are not resident twice. */
TEST(packed_weights_leave_the_file_unread)
{
    if (!core_q8_pack_supported(CORE_TTYPE_Q4_1) || !core_q8_pack_supported(CORE_TTYPE_Q8_0)) {
        printf("  (skipped: this CPU's kernels do not pack)\n");
        return;
    }
    core_model_t *m = NULL;
    core_error_t err = {0};
    CHECK_MSG(core_model_load(tiny_path, NULL, &m, &err) == 0, "%s", err.msg);
    if (!m)
        return;
    core_rng_t r;
    core_rng_seed(&r, 12);
    int32_t tok[51];
    rand_tokens(&r, tok, 51);
    core_attn_state_t *s = new_state(m);
    CHECK_INT_EQ(feed(m, s, tok, 40, 0, NULL), 0);
    CHECK_INT_EQ(feed(m, s, tok + 40, 10, 0, NULL), 0);
    CHECK_INT_EQ(feed(m, s, tok + 50, 1, 0, NULL), 0);
    const core_gguf_t *g = core_model_gguf(m);
    int checked = 0;
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        if (t->n_dims != 2 || !core_q8_pack_supported(t->type) || t->ne[0] % CORE_Q8_BLOCK)
            continue;
        if (!strcmp(t->name, "token_embd.weight") && !core_model_info(m)->tied_output)
            continue; /* packed only as the output, and only when it is one */
        const long n = present_pages(t->data, t->nbytes);
        CHECK_MSG(n == 0, "%s: %ld pages of the file mapped", t->name, n);
        checked++;
    }
    CHECK(checked > 0);
    core_attn_state_free(s);
    core_model_free(m);
}

int main(void)
{
    const char *path = getenv("DARKSERVE_TINY_MODEL");
    tiny_path = path;
    core_error_t err = {0};
    if (!path) {
        printf("DARKSERVE_TINY_MODEL is not set (run through make unit)\n");
        return 1;
    }
    core_model_opts_t o32 = {.attn_kind = CORE_ATTN_EXACT, .max_ctx = 32};
    if (core_model_load(path, NULL, &tiny, &err) < 0 ||
        core_model_load(path, &o32, &tiny_32, &err) < 0) {
        printf("cannot load %s: %s\n", path, err.msg);
        return 1;
    }
    V = core_model_info(tiny)->n_vocab;
    RUN(tiny_info);
    RUN(chunked_prefill_matches_one_call);
    RUN(weight_tiles_match_one_tile);
    RUN(last_mode_equals_last_row_of_all);
    RUN(hidden_rows_give_the_logits);
    RUN(batched_matches_alone);
    RUN(batched_matches_alone_small_tiles);
    RUN(batched_matches_alone_with_lora);
    RUN(amx_tiles_match_vector_units);
    RUN(state_digest_covers_the_lora);
    RUN(overflow_in_batch_leaves_every_state_untouched);
    RUN(bad_batches_are_refused);
    RUN(fork_continues_like_the_original);
    RUN(loader_accepts_valid_synthetic);
    RUN(half_matrices_match_f32);
    RUN(loader_rejects_bad_models);
    RUN(adapter_of_another_model_is_refused);
    RUN(packed_weights_leave_the_file_unread);
    core_model_free(tiny);
    core_model_free(tiny_32);
    return CHECK_DONE();
}
