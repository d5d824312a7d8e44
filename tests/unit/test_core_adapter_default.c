/* The committed default DARKFormer adapter (the one core_model_adapter_find
 * discovers beside the default model, or env DARKSERVE_ADAPTER) with the
 * default model (env DARKSERVE_MODEL): its keys name the model it was
 * trained for and a valid configuration, the model loads with it in the
 * configuration it carries (sinks, pre-RoPE, decays, mixing weights), a
 * prompt (the head of tests/data/heldout.txt, env DARKSERVE_DATA) produces
 * finite logits at every position, the learned parameters are in effect (the
 * logits differ from Performer's with the same draws, sinks and window: the
 * untrained adapter, M = I, no decay, equal weights), the trained adapter
 * predicts the held-out text better than that untrained one (mean NLL over
 * the positions where the linear part takes part), and its greedy choice
 * agrees with exact attention's on most of those positions. (Quality
 * numbers are docs/QUALITY.md's business.) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/text/tokenizer.h"

static const char *model_path;
static char adapter_path[4096];

/* The prompt: the head of the held-out text (env DARKSERVE_DATA), long
 * enough that the linear part of a hybrid with the adapter's window takes
 * part (positions >= W). */
#define PROMPT_BYTES 4000
static char prose[PROMPT_BYTES + 1];
static int32_t toks[4096]; /* the prompt's token ids (set by run) */

/* Loads the model with opts, runs the prose prompt, returns [n][V] logits
 * (caller frees) and the token count; NULL on failure (message printed). */
static float *run(const core_model_opts_t *o, int64_t *n_out, int *V_out)
{
    core_model_t *m = NULL;
    core_tokenizer_t *tok = NULL;
    core_attn_state_t *st = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n = 0;
    core_error_t err = {0};
    if (core_model_load(model_path, o, &m, &err) < 0 ||
        core_tokenizer_from_gguf(core_model_gguf(m), &tok, &err) < 0 ||
        core_tokenizer_encode_alloc(tok, prose, strlen(prose), 0, 4096, CORE_TOK_ADD_SPECIAL, &ids,
                                    &n, &err) < 0 ||
        core_attn_state_new(core_model_attn(m), &st, &err) < 0) {
        printf("  %s (%s): %s\n", model_path, core_attn_kind_name(o->attn_kind), err.msg);
        goto done;
    }
    int V = core_model_info(m)->n_vocab;
    logits = malloc(n * (size_t)V * sizeof *logits);
    if (!logits)
        goto done;
    core_batch_seq_t sq = {.state = st, .tokens = ids, .n_tokens = (int64_t)n,
                           .logits_mode = CORE_LOGITS_ALL, .logits = logits};
    if (core_model_forward(m, &sq, 1, &err) < 0) {
        printf("  forward (%s): %s\n", core_attn_kind_name(o->attn_kind), err.msg);
        free(logits);
        logits = NULL;
        goto done;
    }
    *n_out = (int64_t)n;
    *V_out = V;
    memcpy(toks, ids, n * sizeof *ids);
done:
    core_attn_state_free(st);
    free(ids);
    core_tokenizer_free(tok);
    core_model_free(m);
    return logits;
}

/* −log softmax(x)[y] in double. */
static double nll(const float *x, int n, int y)
{
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++)
        mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    return log(s) + mx - x[y];
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

TEST(default_adapter_loads_and_predicts)
{
    core_gguf_t *g = NULL;
    core_model_t *base = NULL;
    float *lin = NULL, *perf = NULL, *ex = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open(adapter_path, &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", adapter_path, err.msg);
    if (rc)
        return;
    core_features_adapter_info_t info = {.kind = CORE_ATTN_EXACT, .n_features = 0, .window = -1,
                                         .sinks = 0, .prerope = 0};
    rc = core_features_adapter_info(g, &info, &err);
    CHECK_MSG(rc == 0, "adapter keys: %s", err.msg);
    CHECK(info.kind == CORE_ATTN_DARKFORMER);
    CHECK(info.n_features >= 1 && info.n_features <= 4096);
    CHECK(info.window >= 0);
    core_gguf_close(g);
    if (rc || info.kind != CORE_ATTN_DARKFORMER || info.n_features < 1 || info.window < 0)
        return;

    /* trained for this model */
    rc = core_model_load(model_path, NULL, &base, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    CHECK_STR_EQ(info.base_fingerprint, core_model_info(base)->fingerprint);
    core_model_free(base);

    core_model_opts_t o = {.attn_kind = CORE_ATTN_DARKFORMER, .n_features = info.n_features,
                           .window = info.window, .seed = info.seed, .adapter_path = adapter_path,
                           .sinks = info.sinks, .prerope = info.prerope};
    core_model_opts_t op = o, oe = {.attn_kind = CORE_ATTN_EXACT, .max_ctx = 4096};
    op.attn_kind = CORE_ATTN_PERFORMER;
    op.adapter_path = NULL;
    int64_t n = 0, n2 = 0, n3 = 0;
    int V = 0, V2 = 0, V3 = 0;
    lin = run(&o, &n, &V);
    perf = run(&op, &n2, &V2);
    ex = run(&oe, &n3, &V3);
    CHECK(lin && perf && ex);
    if (!lin || !perf || !ex)
        goto done;
    CHECK(n == n2 && n == n3 && V == V2 && V == V3);
    CHECK_MSG(n >= info.window + 64, "the prompt has %lld tokens, too few for W = %d",
              (long long)n, info.window);
    if (n < info.window + 64 || n != n2 || n != n3)
        goto done;
    int finite = 1;
    double diff = 0;
    for (int64_t i = 0; i < n * V; i++) {
        finite &= isfinite(lin[i]);
        diff = fmax(diff, fabs((double)lin[i] - perf[i]));
    }
    CHECK_MSG(finite, "non-finite logits with the default adapter");
    CHECK_MSG(diff > 1e-2, "logits equal Performer's (max diff %g): M is not in effect", diff);
    /* positions before W are exact attention in both */
    int agree = 0, agree_p = 0;
    int64_t t0 = info.window + info.sinks, n_lin = n - 1 - t0;
    double nll_d = 0, nll_p = 0, nll_e = 0;
    for (int64_t t = t0; t < n - 1; t++) {
        int e = argmax(ex + t * V, V);
        agree += argmax(lin + t * V, V) == e;
        agree_p += argmax(perf + t * V, V) == e;
        nll_d += nll(lin + t * V, V, toks[t + 1]);
        nll_p += nll(perf + t * V, V, toks[t + 1]);
        nll_e += nll(ex + t * V, V, toks[t + 1]);
    }
    printf("  positions %lld..%lld: greedy agreement with exact: darkformer %d, untrained %d of "
           "%lld; perplexity darkformer %.3f, untrained %.3f, exact %.3f (M=%d, W=%d, S=%d)\n",
           (long long)t0, (long long)n - 2, agree, agree_p, (long long)n_lin,
           exp(nll_d / (double)n_lin), exp(nll_p / (double)n_lin), exp(nll_e / (double)n_lin),
           info.n_features, info.window, info.sinks);
    CHECK_MSG(nll_d < nll_p, "the trained adapter predicts the held-out text no better than the "
              "untrained one (mean NLL %.4f vs %.4f)", nll_d / (double)n_lin,
              nll_p / (double)n_lin);
    CHECK_MSG(2 * agree >= n_lin, "darkformer agrees with exact on %d of %lld positions", agree,
              (long long)n_lin);
done:
    free(lin);
    free(perf);
    free(ex);
}

int main(void)
{
    model_path = getenv("DARKSERVE_MODEL");
    if (!model_path) {
        printf("DARKSERVE_MODEL is not set (run through make unit)\n");
        return 1;
    }
    const char *ad = getenv("DARKSERVE_ADAPTER");
    if (ad && *ad) {
        snprintf(adapter_path, sizeof adapter_path, "%s", ad);
    } else {
        /* the one darkserve finds beside the default model */
        core_error_t err = {0};
        if (core_model_adapter_find(model_path, adapter_path, sizeof adapter_path, &err) < 0) {
            printf("%s\n", err.msg);
            return 1;
        }
    }
    const char *data = getenv("DARKSERVE_DATA");
    if (!data) {
        printf("DARKSERVE_DATA is not set (run through make unit)\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/heldout.txt", data);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(prose, 1, PROMPT_BYTES, f) : 0;
    if (f)
        fclose(f);
    while (got > 0 && prose[got - 1] != ' ') /* end on a word boundary */
        got--;
    prose[got] = '\0';
    if (got < PROMPT_BYTES / 2) {
        printf("cannot read %s\n", path);
        return 1;
    }
    RUN(default_adapter_loads_and_predicts);
    return CHECK_DONE();
}
