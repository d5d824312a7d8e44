/* tools/state_bytes.c — the bytes a session's state holds after N tokens,
 * for a model and its attention settings, without running the model.
 *
 *   state_bytes --model M [--adapter A] [--tokens N] [--seed S]
 *
 * A session's state is its attention state (core/attn/attn.h): the model
 * keeps nothing else per sequence. This feeds N tokens of random q, k, v
 * (N(0, 1) rows from core/rng.h, seed S) through every layer of the
 * model's attention as core_model_forward would (reserve, each layer,
 * advance; 4,096 tokens a call) and prints, at 1,024 tokens and at every
 * power of two from there to N (and at N), the state's bytes
 * (core_attn_state_bytes), the bytes written (core_attn_state_bytes_held)
 * and a saved blob's (core_state_size). With --adapter the attention is
 * DARKFormer with the adapter's settings (core_features_resolve: its serve
 * window, sinks, 8-bit rows); without, exact with the model's context (N
 * must fit it). What the values are does not change the sizes; the model
 * is loaded for its shapes (and to check the adapter belongs to it).
 *
 * Exit status 0 on success, 1 on a runtime failure, 2 on bad usage.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn/features.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/state.h"
#include "tools/tool_args.h"

#define CHUNK 4096

static void usage(void)
{
    fprintf(stderr, "usage: state_bytes --model M [--adapter A] [--tokens N] [--seed S]\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL;
    int64_t n_tok = 65536, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!bad && !strcmp(a, "--model"))
            model = v;
        else if (!bad && !strcmp(a, "--adapter"))
            adapter = v;
        else if (!bad && !strcmp(a, "--tokens"))
            bad = parse_i64(v, 1, (int64_t)1 << 40, &n_tok);
        else if (!bad && !strcmp(a, "--seed"))
            bad = parse_i64(v, 0, INT64_MAX, &seed);
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "state_bytes: bad option or value near '%s'\n", a);
            usage();
            return 2;
        }
        i++;
    }
    if (!model) {
        usage();
        return 2;
    }
    core_error_t err = {0};
    core_model_opts_t mo = {.attn_kind = CORE_ATTN_EXACT, .n_threads = 1};
    core_features_settings_t fs = {.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                   .kv_bits = -1};
    if (adapter) {
        if (core_features_resolve(adapter, &fs, &err) < 0) {
            fprintf(stderr, "state_bytes: %s: %s\n", adapter, err.msg);
            return 1;
        }
        mo = (core_model_opts_t){.attn_kind = CORE_ATTN_DARKFORMER, .adapter_path = adapter,
                                 .n_features = fs.n_features, .window = fs.window,
                                 .sinks = fs.sinks, .prerope = fs.prerope, .memory = fs.memory,
                                 .kv_bits = fs.kv_bits, .seed = fs.seed, .n_threads = 1};
    }
    int status = 1;
    core_model_t *m = NULL;
    core_attn_state_t *st = NULL;
    float *q = NULL, *kv = NULL, *out = NULL;
    if (core_model_load(model, &mo, &m, &err) < 0 ||
        core_attn_state_new(core_model_attn(m), &st, &err) < 0) {
        fprintf(stderr, "state_bytes: %s\n", err.msg);
        goto done;
    }
    core_attn_t *at = core_model_attn(m);
    const core_attn_cfg_t *c = core_attn_config(at);
    const size_t nq = (size_t)c->n_head * (size_t)c->head_dim,
                 nkv = (size_t)c->n_head_kv * (size_t)c->head_dim;
    q = malloc(CHUNK * nq * sizeof *q);
    kv = malloc(CHUNK * 2 * nkv * sizeof *kv);
    out = malloc(CHUNK * nq * sizeof *out);
    if (!q || !kv || !out) {
        fprintf(stderr, "state_bytes: out of memory\n");
        goto done;
    }
    core_rng_t r;
    core_rng_seed(&r, (uint64_t)seed);
    printf("model %s, attention %s%s%s\n", model, core_attn_kind_name(c->kind),
           adapter ? " with " : "", adapter ? adapter : "");
    printf("%12s %14s %14s %14s\n", "tokens", "state bytes", "bytes written", "blob bytes");
    int64_t next = 1024;
    while (core_attn_state_pos(st) < n_tok) {
        const int64_t pos = core_attn_state_pos(st);
        int64_t n = n_tok - pos < CHUNK ? n_tok - pos : CHUNK;
        if (pos < next && pos + n > next)
            n = next - pos; /* stop at the next report */
        if (core_attn_reserve(at, st, n, &err) < 0)
            goto fail;
        for (int l = 0; l < c->n_layer; l++) {
            for (size_t i = 0; i < (size_t)n * nq; i++)
                q[i] = (float)core_rng_normal(&r);
            for (size_t i = 0; i < (size_t)n * 2 * nkv; i++)
                kv[i] = (float)core_rng_normal(&r);
            if (core_attn_forward(at, st, l, n, q, kv, kv + (size_t)n * nkv, out, &err) < 0)
                goto fail;
        }
        core_attn_advance(st, n);
        const int64_t p = core_attn_state_pos(st);
        if (p == next || p == n_tok) {
            printf("%12" PRId64 " %14zu %14zu %14zu\n", p, core_attn_state_bytes(st),
                   core_attn_state_bytes_held(st), core_state_size(st, NULL, 0, 0));
            fflush(stdout);
            while (next <= p)
                next *= 2;
        }
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "state_bytes: at %" PRId64 " tokens: %s\n", core_attn_state_pos(st), err.msg);
done:
    free(q);
    free(kv);
    free(out);
    core_attn_state_free(st);
    core_model_free(m);
    return status;
}
