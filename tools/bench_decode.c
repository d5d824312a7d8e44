/* tools/bench_decode.c — decode speed and session state size at a given
 * context length, for docs/QUALITY.md.
 *
 *   bench_decode --model M [--attn K] [--features N] [--window W] [--sinks S]
 *                [--adapter A] --ctx P [--tokens N] [--runs R] [--threads T]
 *                [--isa generic|avx2|avx512vnni]
 *
 * Brings one session's attention state to position P, then times R runs of
 * N single-token decode steps (core_model_forward of one token with its last
 * logits, what a server does per generated token) and prints each run's
 * tokens/s, their median, and core_attn_state_bytes at P.
 *
 * The context is synthetic: a real 32K-token prefill through the whole model
 * costs far too long on a small shared machine, and the cost of a decode
 * step does not depend on what the keys are, only on how many there are
 * (exact) or not at all (linear kinds). Linear kinds are filled through the
 * attention interface alone (core_attn_reserve / core_attn_forward per layer
 * / core_attn_advance) with random q, k, v rows of unit-variance entries, in
 * chunks of 256. Exact attention would cost O(P²) that way, so its KV cache
 * is loaded with P random rows through the kind's state_load entry
 * (core/attn_impl.h: the payload is, per layer, K then V rows). The decoded
 * tokens themselves run through the full model.
 *
 * --threads T: the model's compute threads (and BLAS's), 0 = one per CPU;
 * --isa forces the quantized kernels onto one variant (core_qdot_force_isa).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/attn_impl.h"
#include "core/blas.h"
#include "core/features.h"
#include "core/model.h"
#include "core/qdot.h"
#include "core/rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *attn = "exact", *adapter = NULL, *isa = NULL;
    int64_t m = 0, w = -1, sinks = -1, ctx = -1, n_tok = 32, runs = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!bad && !strcmp(a, "--model"))
            model = v;
        else if (!bad && !strcmp(a, "--attn"))
            attn = v;
        else if (!bad && !strcmp(a, "--adapter"))
            adapter = v;
        else if (!bad && !strcmp(a, "--isa"))
            isa = v;
        else if (!bad && !strcmp(a, "--features"))
            bad = parse_i64(v, 0, 65536, &m);
        else if (!bad && !strcmp(a, "--window"))
            bad = parse_i64(v, 0, 1 << 20, &w);
        else if (!bad && !strcmp(a, "--sinks"))
            bad = parse_i64(v, 0, 1024, &sinks);
        else if (!bad && !strcmp(a, "--ctx"))
            bad = parse_i64(v, 0, (int64_t)1 << 30, &ctx);
        else if (!bad && !strcmp(a, "--tokens"))
            bad = parse_i64(v, 1, 100000, &n_tok);
        else if (!bad && !strcmp(a, "--runs"))
            bad = parse_i64(v, 1, 1000, &runs);
        else if (!bad && !strcmp(a, "--threads"))
            bad = parse_i64(v, 0, 256, &threads);
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "bench_decode: bad option or value near '%s'\n", a);
            return 2;
        }
        i++;
    }
    core_model_opts_t mo = {0};
    core_error_t err = {0};
    if (!model || ctx < 0 || core_attn_kind_parse(attn, &mo.attn_kind) < 0) {
        fprintf(stderr, "usage: bench_decode --model M [--attn K] [--features N] [--window W] "
                        "[--sinks S] [--adapter A] --ctx P [--tokens N] [--runs R] [--threads T] "
                        "[--isa NAME]\n");
        return 2;
    }
    if (isa) {
        int found = 0;
        for (int i = 0; i < CORE_QDOT_ISA_COUNT_; i++)
            if (!strcmp(isa, core_qdot_isa_name((core_qdot_isa_t)i))) {
                found = 1;
                if (core_qdot_force_isa((core_qdot_isa_t)i) < 0) {
                    fprintf(stderr, "bench_decode: this CPU cannot run --isa %s\n", isa);
                    return 1;
                }
            }
        if (!found) {
            fprintf(stderr, "bench_decode: unknown --isa %s\n", isa);
            return 2;
        }
    }
    /* Linear kinds: flags, then the adapter's settings, then the defaults
     * (core_features_resolve), as darkserve itself does. */
    core_features_settings_t fs = {.n_features = (int)m, .window = (int)w, .sinks = (int)sinks,
                                   .prerope = -1};
    if (mo.attn_kind != CORE_ATTN_EXACT && core_features_resolve(adapter, &fs, &err) < 0) {
        fprintf(stderr, "bench_decode: --adapter %s: %s\n", adapter, err.msg);
        return 1;
    }
    mo.n_features = fs.n_features;
    mo.window = mo.attn_kind != CORE_ATTN_EXACT ? fs.window : 0;
    mo.sinks = mo.attn_kind != CORE_ATTN_EXACT ? fs.sinks : 0;
    mo.prerope = mo.attn_kind != CORE_ATTN_EXACT ? fs.prerope : 0;
    mo.seed = fs.seed;
    mo.adapter_path = adapter;
    mo.max_ctx = ctx + n_tok * runs + 8;
    core_blas_set_threads((int)threads);
    mo.n_threads = (int)threads;

    int status = 1;
    core_model_t *mdl = NULL;
    core_attn_state_t *st = NULL;
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL, *logits = NULL;
    double *tps = NULL;
    if (core_model_load(model, &mo, &mdl, &err) < 0 ||
        core_attn_state_new(core_model_attn(mdl), &st, &err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        goto done;
    }
    const core_model_info_t *in = core_model_info(mdl);
    const int64_t chunk = 256, qd = (int64_t)in->n_head * in->head_dim,
                  kvd = (int64_t)in->n_head_kv * in->head_dim;
    q = malloc((size_t)(chunk * qd) * sizeof *q);
    k = malloc((size_t)(chunk * kvd) * sizeof *k);
    v = malloc((size_t)(chunk * kvd) * sizeof *v);
    out = malloc((size_t)(chunk * qd) * sizeof *out);
    logits = malloc((size_t)in->n_vocab * sizeof *logits);
    tps = malloc((size_t)runs * sizeof *tps);
    if (!q || !k || !v || !out || !logits || !tps) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto done;
    }
    core_rng_t rng;
    core_rng_seed(&rng, 1);
    core_attn_t *a = core_model_attn(mdl);
    double t0 = now_s();
    if (mo.attn_kind == CORE_ATTN_EXACT && ctx > 0) {
        size_t nf = (size_t)ctx * (size_t)kvd * 2 * (size_t)in->n_layer;
        float *payload = malloc(nf * sizeof *payload); /* [L][K, V][P][Hkv*Hd] */
        if (!payload) {
            fprintf(stderr, "bench_decode: out of memory for a %zu-float KV payload\n", nf);
            goto done;
        }
        for (size_t i = 0; i < nf; i++)
            payload[i] = (float)core_rng_normal(&rng);
        int rc = a->vt->state_load(st, ctx, payload, nf * sizeof *payload, &err);
        free(payload);
        if (rc < 0)
            goto fail;
        st->pos = ctx;
    }
    for (int64_t p = mo.attn_kind == CORE_ATTN_EXACT ? ctx : 0; p < ctx; p += chunk) {
        int64_t n = ctx - p < chunk ? ctx - p : chunk;
        if (core_attn_reserve(a, st, n, &err) < 0)
            goto fail;
        for (int l = 0; l < in->n_layer; l++) {
            for (int64_t i = 0; i < n * qd; i++)
                q[i] = (float)core_rng_normal(&rng);
            for (int64_t i = 0; i < n * kvd; i++) {
                k[i] = (float)core_rng_normal(&rng);
                v[i] = (float)core_rng_normal(&rng);
            }
            if (core_attn_forward(a, st, l, n, q, k, v, out, &err) < 0)
                goto fail;
        }
        core_attn_advance(st, n);
    }
    double t1 = now_s();
    size_t bytes = core_attn_state_bytes(st);
    int32_t tok = 1000;
    for (int64_t r = 0; r < runs; r++) {
        double s0 = now_s();
        for (int64_t i = 0; i < n_tok; i++) {
            core_batch_seq_t sq = {.state = st, .tokens = &tok, .n_tokens = 1,
                                   .logits_mode = CORE_LOGITS_LAST, .logits = logits};
            if (core_model_forward(mdl, &sq, 1, &err) < 0)
                goto fail;
            tok = (int32_t)((tok * 7 + 13) % in->n_vocab); /* any token: the cost is the same */
        }
        tps[r] = (double)n_tok / (now_s() - s0);
    }
    printf("attn %s M=%" PRId64 " W=%" PRId64 " ctx %" PRId64 " threads %d isa %s: state %zu bytes; "
           "fill %.1f s; decode tokens/s:",
           attn, m, w, ctx, core_model_threads(mdl), core_qdot_isa_name(core_qdot_isa()), bytes,
           t1 - t0);
    for (int64_t r = 0; r < runs; r++)
        printf(" %.2f", tps[r]);
    qsort(tps, (size_t)runs, sizeof *tps, cmp_d);
    printf("; median %.2f\n", tps[runs / 2]);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "bench_decode: %s\n", err.msg);
done:
    free(q);
    free(k);
    free(v);
    free(out);
    free(logits);
    free(tps);
    core_attn_state_free(st);
    core_model_free(mdl);
    return status;
}
