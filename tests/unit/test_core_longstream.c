/* A constant-size state over a long stream, through the whole (tiny) model:
 * the linear kinds' state bytes do not depend on the tokens seen, and
 * 1,000,000 tokens streamed through the model leave every logit finite
 * (DARKFormer issue: "no NaN/Inf after 1,000,000 tokens streamed through the
 * tiny model"). Runs on Performer (no adapter needed; DARKFormer and IS share
 * the kernels and their recurrences, tested in test_core_attn_linear.c), pure
 * and hybrid (a fifth of the stream), and on Flexformer-n untrained and
 * Flexformer-s with an adapter (signed features, sinks, window, pre-RoPE;
 * issue "Flexformer kernels": 10^6-token streams on the tiny model).
 * DARKSERVE_LONGSTREAM_TOKENS overrides the count (>= 100000; make asan
 * uses 100000); make test uses the million. */
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/rng.h"

static const char *tiny_path;

enum { CHUNK = CORE_MODEL_MAX_ROWS }; /* rows per forward at most */

/* Feeds n random tokens in forwards of CHUNK rows, checking the last row's
 * logits of every forward; returns the number of non-finite logits seen and
 * the state bytes at the two probe positions. */
static int64_t stream(core_model_t *m, core_attn_state_t *st, int64_t n, int64_t probe_a,
                      int64_t probe_b, size_t *bytes_a, size_t *bytes_b)
{
    const core_model_info_t *mi = core_model_info(m);
    int32_t *toks = malloc(sizeof(int32_t) * CHUNK);
    float *logits = malloc(sizeof(float) * (size_t)mi->n_vocab);
    core_rng_t r;
    core_rng_seed(&r, 42);
    int64_t bad = 0;
    core_error_t err = {0};
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < CHUNK ? n - done : CHUNK;
        /* stop exactly at the probe positions */
        if (done < probe_a && done + k > probe_a)
            k = probe_a - done;
        else if (done < probe_b && done + k > probe_b)
            k = probe_b - done;
        for (int64_t i = 0; i < k; i++)
            toks[i] = (int32_t)(core_rng_u64(&r) % (uint64_t)mi->n_vocab);
        core_batch_seq_t seq = {.state = st, .tokens = toks, .n_tokens = k,
                                .logits_mode = CORE_LOGITS_LAST, .logits = logits};
        if (core_model_forward(m, &seq, 1, &err) < 0) {
            printf("  forward at %lld failed: %s\n", (long long)done, err.msg);
            bad = -1;
            break;
        }
        for (int64_t v = 0; v < mi->n_vocab; v++)
            bad += !isfinite(logits[v]);
        done += k;
        if (done == probe_a)
            *bytes_a = core_attn_state_bytes(st);
        if (done == probe_b)
            *bytes_b = core_attn_state_bytes(st);
    }
    free(toks);
    free(logits);
    return bad;
}

static void run_kind(core_attn_kind_t kind, int window, int sinks, int64_t n, const char *adapter)
{
    core_error_t err = {0};
    core_model_t *m = NULL;
    core_model_opts_t o = {.attn_kind = kind, .n_features = 32, .window = window,
                           .seed = 7, .sinks = sinks, .prerope = sinks > 0,
                           .adapter_path = adapter};
    CHECK_MSG(core_model_load(tiny_path, &o, &m, &err) == 0, "%s", err.msg);
    if (!m)
        return;
    core_attn_state_t *st = NULL;
    CHECK(core_attn_state_new(core_model_attn(m), &st, &err) == 0);
    size_t b1k = 0, b100k = 0;
    int64_t bad = stream(m, st, n, 1000, 100000, &b1k, &b100k);
    CHECK_MSG(bad == 0, "window %d: %lld non-finite logits (or a failed forward)", window,
              (long long)bad);
    CHECK_INT_EQ(core_attn_state_pos(st), n);
    CHECK(b1k > 0);
    CHECK_MSG(b1k == b100k, "window %d: state %zu bytes at 1,000 tokens, %zu at 100,000", window,
              b1k, b100k);
    CHECK_INT_EQ(core_attn_state_bytes(st), b1k);
    core_attn_state_free(st);
    core_model_free(m);
}

static int64_t n_tokens(void)
{
    const char *env = getenv("DARKSERVE_LONGSTREAM_TOKENS");
    return env && atoll(env) >= 100000 ? atoll(env) : 1000000;
}

TEST(million_tokens_pure_linear)
{
    run_kind(CORE_ATTN_PERFORMER, 0, 0, n_tokens(), NULL);
}

/* The window ring is the only extra state of the hybrid; a fifth of the
 * stream exercises it as well and keeps the suite's time down. */
TEST(long_stream_hybrid_window)
{
    run_kind(CORE_ATTN_PERFORMER, 16, 0, n_tokens() / 5 > 100000 ? n_tokens() / 5 : 100000, NULL);
}

/* Flexformer's signed state (untrained: Performer's trigonometric features)
 * with sinks, window and pre-RoPE features, over the whole stream. */
TEST(million_tokens_flexformer)
{
    run_kind(CORE_ATTN_FLEXFORMER_N, 16, 4, n_tokens(), NULL);
}

/* Flexformer-s with an adapter for the tiny model (learned-looking ω: the
 * Performer law scaled by 0.8 with a fixed seed, decays 0.99–0.999, mixing
 * log-weights in [−1, 0.5]), over the whole stream: the -s feature path,
 * the adapter's decays and weights, and the signed decayed state. */
TEST(million_tokens_flexformer_s_adapter)
{
    core_error_t err = {0};
    core_model_t *m = NULL;
    core_model_opts_t o = {.attn_kind = CORE_ATTN_EXACT};
    CHECK_MSG(core_model_load(tiny_path, &o, &m, &err) == 0, "%s", err.msg);
    if (!m)
        return;
    const core_model_info_t *mi = core_model_info(m);
    int L = mi->n_layer, H = mi->n_head, hkv = mi->n_head_kv, hd = mi->head_dim, mf = 16;
    float *om = malloc(sizeof(float) * (size_t)L * hkv * mf * hd);
    float *dec = malloc(sizeof(float) * (size_t)L * hkv);
    float *mix = malloc(sizeof(float) * (size_t)L * H);
    core_rng_t r;
    core_rng_seed(&r, 91);
    for (size_t i = 0; i < (size_t)L * hkv * mf * hd; i++)
        om[i] = (float)(0.8 * core_rng_normal(&r));
    for (int i = 0; i < L * hkv; i++)
        dec[i] = (float)(0.99 + 0.009 * core_rng_uniform(&r));
    for (int i = 0; i < L * H; i++)
        mix[i] = (float)(1.5 * core_rng_uniform(&r) - 1.0);
    char path[96];
    snprintf(path, sizeof path, "/tmp/darkserve_longstream_%d.gguf", (int)getpid());
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_FLEXFORMER_S, .n_layer = L, .n_head = H,
                                      .n_head_kv = hkv, .head_dim = hd, .n_features = 2 * mf,
                                      .window = 16, .sinks = 4, .prerope = 1, .seed = 7,
                                      .base_fingerprint = mi->fingerprint, .decay = dec,
                                      .mix = mix, .omega = om};
    int rc = core_features_adapter_write(&d, path, &err);
    CHECK_MSG(rc == 0, "adapter: %s", err.msg);
    core_model_free(m);
    free(om);
    free(dec);
    free(mix);
    if (rc == 0)
        run_kind(CORE_ATTN_FLEXFORMER_S, 16, 4, n_tokens(), path);
    unlink(path);
}

int main(void)
{
    tiny_path = getenv("DARKSERVE_TINY_MODEL");
    if (!tiny_path) {
        printf("DARKSERVE_TINY_MODEL is not set (make unit sets it)\n");
        return 1;
    }
    RUN(million_tokens_pure_linear);
    RUN(long_stream_hybrid_window);
    RUN(million_tokens_flexformer);
    RUN(million_tokens_flexformer_s_adapter);
    return CHECK_DONE();
}
