/* tools/bench_decode.c — decode speed and session state size at a given
 * context length, for docs/QUALITY.md.
 *
 *   bench_decode --model M [--attn K] [--features N] [--window W] [--sinks S] [--memory N]
 *                [--adapter A] --ctx P[,P2,...] [--tokens N] [--runs R] [--threads T]
 *                [--isa generic|avx2|avx512vnni|neon|neon-dotprod] [--amx auto|on|off] [--vs P2] [--batch B]
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
 * (core/attn/attn_impl.h: the payload is, per layer, K then V rows). The decoded
 * tokens themselves run through the full model.
 *
 * --vs P2: a second state brought to P2 as well, and the R runs alternate
 * between the two (P, then P2, ...), so that a shared machine's changing
 * load falls on both alike; both medians and their ratio are printed.
 * --ctx P1,P2,... (at most 8): one state per context, the runs alternating
 * over all of them in that order (--vs P2 adds one more). Linear kinds fill
 * one state through the contexts in increasing order and keep a copy at
 * each (core_attn_state_copy), so 512,4096,16384,65536 costs one 64K fill,
 * not 86K tokens of fills; each line's "fill" is then the time from the
 * previous context to its own.
 * --threads T: the model's compute threads (and BLAS's), 0 = one per CPU;
 * --isa forces the quantized kernels onto one variant (core_qdot_force_isa);
 * --amx the packed kernel's batches onto Intel AMX tiles or off them
 * (core_q8_force_amx; auto, the default, as darkserve runs).
 * --batch B: B sessions at each context (copies of the one state), every
 * step one forward of B single-token sequences (batched decode, what the
 * server's scheduler runs with B streams); tokens/s counts all B.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/attn/attn_impl.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/kernels/qdot.h"
#include "core/rng.h"
#include "tools/tool_args.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Brings state st from its position to ctx with random q, k, v drawn from
 * rng (see the top). Exact attention: st must be at position 0. */
static int fill(core_model_t *mdl, core_attn_kind_t kind, core_attn_state_t *st, int64_t ctx,
                core_rng_t *rngp, core_error_t *err)
{
    const core_model_info_t *in = core_model_info(mdl);
    const int64_t chunk = 256, qd = (int64_t)in->n_head * in->head_dim,
                  kvd = (int64_t)in->n_head_kv * in->head_dim;
    core_attn_t *a = core_model_attn(mdl);
    core_rng_t rng = *rngp;
    int rc = 0;
    if (kind == CORE_ATTN_EXACT && ctx > 0) {
        size_t nf = (size_t)ctx * (size_t)kvd * 2 * (size_t)in->n_layer;
        float *payload = malloc(nf * sizeof *payload); /* [L][K, V][P][Hkv*Hd] */
        if (!payload)
            return core_error_set(err, CORE_ENOMEM, "out of memory for a %zu-float KV payload",
                                  nf);
        for (size_t i = 0; i < nf; i++)
            payload[i] = (float)core_rng_normal(&rng);
        rc = a->vt->state_load(st, ctx, payload, nf * sizeof *payload, err);
        free(payload);
        if (rc < 0)
            return rc;
        st->pos = ctx;
        return 0;
    }
    float *q = malloc((size_t)(chunk * qd) * sizeof *q);
    float *k = malloc((size_t)(chunk * kvd) * sizeof *k);
    float *v = malloc((size_t)(chunk * kvd) * sizeof *v);
    float *out = malloc((size_t)(chunk * qd) * sizeof *out);
    if (!q || !k || !v || !out)
        rc = core_error_set(err, CORE_ENOMEM, "out of memory");
    for (int64_t p = core_attn_state_pos(st); rc == 0 && p < ctx; p += chunk) {
        int64_t n = ctx - p < chunk ? ctx - p : chunk;
        if ((rc = core_attn_reserve(a, st, n, err)) < 0)
            break;
        for (int l = 0; rc == 0 && l < in->n_layer; l++) {
            for (int64_t i = 0; i < n * qd; i++)
                q[i] = (float)core_rng_normal(&rng);
            for (int64_t i = 0; i < n * kvd; i++) {
                k[i] = (float)core_rng_normal(&rng);
                v[i] = (float)core_rng_normal(&rng);
            }
            rc = core_attn_forward(a, st, l, n, q, k, v, out, err);
        }
        if (rc == 0)
            core_attn_advance(st, n);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    *rngp = rng;
    return rc < 0 ? rc : 0;
}

#define MAX_CTX 8

/* "P" or "P1,P2,..." -> at[0..*n), appended after the *n already there. */
static int parse_ctx_list(const char *s, int64_t *at, int *n)
{
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_CTX || parse_i64(t, 0, (int64_t)1 << 30, &at[*n]) < 0)
            return -1;
        (*n)++;
    }
    return *n > 0 ? 0 : -1;
}

#define MAX_BATCH 64

/* n single-token decode steps on the nb states st[] at once (what a server
 * does per generated token of nb streams). */
static int decode(core_model_t *mdl, core_attn_state_t **st, int nb, int64_t n, int32_t *tok,
                  core_error_t *err)
{
    const core_model_info_t *in = core_model_info(mdl);
    float *logits = malloc((size_t)nb * (size_t)in->n_vocab * sizeof *logits);
    if (!logits)
        return core_error_set(err, CORE_ENOMEM, "out of memory");
    int rc = 0;
    int32_t toks[MAX_BATCH];
    core_batch_seq_t sq[MAX_BATCH];
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        for (int b = 0; b < nb; b++) {
            toks[b] = (int32_t)((*tok + 31 * b) % in->n_vocab);
            sq[b] = (core_batch_seq_t){.state = st[b], .tokens = &toks[b], .n_tokens = 1,
                                       .logits_mode = CORE_LOGITS_LAST,
                                       .logits = logits + (size_t)b * (size_t)in->n_vocab};
        }
        rc = core_model_forward(mdl, sq, nb, err);
        *tok = (int32_t)((*tok * 7 + 13) % in->n_vocab); /* any token: the cost is the same */
    }
    free(logits);
    return rc < 0 ? rc : 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *attn = "exact", *adapter = NULL, *isa = NULL, *amx = NULL;
    const char *heads = NULL;
    int keep = -1;
    int64_t m = 0, w = -1, sinks = -1, memory = -1, kv_bits = -1, n_tok = 32, runs = 5, threads = 0, vs = -1, batch = 1;
    if (tool_isa_env_ok("bench_decode") < 0)
        return 2;
    int64_t at[MAX_CTX + 1];
    int n_st = 0;
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
        else if (!bad && !strcmp(a, "--amx"))
            amx = v;
        else if (!bad && !strcmp(a, "--features"))
            bad = parse_i64(v, 0, 65536, &m);
        else if (!bad && !strcmp(a, "--window"))
            bad = parse_i64(v, 0, 1 << 20, &w);
        else if (!bad && !strcmp(a, "--sinks"))
            bad = parse_i64(v, 0, 1024, &sinks);
        else if (!bad && !strcmp(a, "--memory"))
            bad = parse_i64(v, 0, CORE_ATTN_MAX_MEMORY, &memory);
        else if (!bad && !strcmp(a, "--memory-keep"))
            bad = core_attn_keep_parse(v, &keep) < 0;
        else if (!bad && !strcmp(a, "--memory-heads"))
            heads = v;
        else if (!bad && !strcmp(a, "--kv-bits"))
            bad = parse_i64(v, 8, 16, &kv_bits) || (kv_bits != 8 && kv_bits != 16);
        else if (!bad && !strcmp(a, "--ctx"))
            bad = n_st > 0 || parse_ctx_list(v, at, &n_st) < 0;
        else if (!bad && !strcmp(a, "--tokens"))
            bad = parse_i64(v, 1, 100000, &n_tok);
        else if (!bad && !strcmp(a, "--vs"))
            bad = parse_i64(v, 0, (int64_t)1 << 30, &vs);
        else if (!bad && !strcmp(a, "--runs"))
            bad = parse_i64(v, 1, 1000, &runs);
        else if (!bad && !strcmp(a, "--threads"))
            bad = parse_i64(v, 0, 256, &threads);
        else if (!bad && !strcmp(a, "--batch"))
            bad = parse_i64(v, 1, MAX_BATCH, &batch);
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
    if (!model || n_st == 0 || core_attn_kind_parse(attn, &mo.attn_kind) < 0) {
        fprintf(stderr, "usage: bench_decode --model M [--attn K] [--features N] [--window W] "
                        "[--sinks S] [--memory N] [--memory-keep recall|recent] [--memory-heads all|L.H,...] [--kv-bits 8|16] [--adapter A] --ctx P[,P2,...] [--tokens N] [--runs R] "
                        "[--threads T] [--isa NAME] [--amx auto|on|off] [--vs P2] [--batch B]\n");
        return 2;
    }
    if (amx) {
        static const char *const names[] = {"auto", "off", "on"}; /* modes -1, 0, 1 */
        int mode = 2; /* none of them */
        for (int i = 0; i < 3; i++)
            if (!strcmp(amx, names[i]))
                mode = i - 1;
        if (mode == 2 || core_q8_force_amx((core_q8_amx_mode_t)mode) < 0) {
            fprintf(stderr, "bench_decode: --amx %s: unknown, or this CPU or OS cannot run it\n",
                    amx);
            return 2;
        }
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
                                   .prerope = -1, .memory = (int)memory, .memory_keep = keep,
                                   .kv_bits = (int)kv_bits};
    if (heads)
        snprintf(fs.memory_heads, sizeof fs.memory_heads, "%s", heads);
    if (mo.attn_kind != CORE_ATTN_EXACT && core_features_resolve(adapter, &fs, &err) < 0) {
        fprintf(stderr, "bench_decode: --adapter %s: %s\n", adapter, err.msg);
        return 1;
    }
    mo.n_features = fs.n_features;
    mo.window = mo.attn_kind != CORE_ATTN_EXACT ? fs.window : 0;
    mo.sinks = mo.attn_kind != CORE_ATTN_EXACT ? fs.sinks : 0;
    mo.prerope = mo.attn_kind != CORE_ATTN_EXACT ? fs.prerope : 0;
    mo.memory = mo.attn_kind != CORE_ATTN_EXACT ? fs.memory : 0;
    mo.kv_bits = mo.attn_kind != CORE_ATTN_EXACT ? fs.kv_bits : 0;
    mo.memory_keep = fs.memory_keep;
    mo.memory_heads = fs.memory_heads;
    mo.seed = fs.seed;
    mo.adapter_path = adapter;
    if (vs >= 0)
        at[n_st++] = vs;
    int64_t ctx_max = 0;
    for (int i = 0; i < n_st; i++)
        ctx_max = at[i] > ctx_max ? at[i] : ctx_max;
    mo.max_ctx = ctx_max + n_tok * runs + 8;
    /* core_model_load puts BLAS on one thread: the pool is the parallelism */
    mo.n_threads = (int)threads;

    int status = 1;
    core_model_t *mdl = NULL;
    core_attn_state_t *st[MAX_CTX + 1][MAX_BATCH] = {{NULL}}, *acc = NULL;
    double *tps = NULL;
    if (core_model_load(model, &mo, &mdl, &err) < 0) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        goto done;
    }
    tps = malloc((size_t)(n_st * runs) * sizeof *tps);
    if (!tps) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto done;
    }
    double fill_s[MAX_CTX + 1] = {0};
    core_rng_t rng;
    core_rng_seed(&rng, 1);
    if (mo.attn_kind == CORE_ATTN_EXACT) {
        for (int i = 0; i < n_st; i++) { /* each its own KV cache, loaded whole */
            double t0 = now_s();
            core_rng_seed(&rng, 1);
            if (core_attn_state_new(core_model_attn(mdl), &st[i][0], &err) < 0 ||
                fill(mdl, mo.attn_kind, st[i][0], at[i], &rng, &err) < 0)
                goto fail;
            fill_s[i] = now_s() - t0;
        }
    } else { /* one state through the contexts in increasing order, a copy at each */
        if (core_attn_state_new(core_model_attn(mdl), &acc, &err) < 0)
            goto fail;
        int done_mask[MAX_CTX + 1] = {0};
        for (int k = 0; k < n_st; k++) {
            int i = -1;
            for (int j = 0; j < n_st; j++)
                if (!done_mask[j] && (i < 0 || at[j] < at[i]))
                    i = j;
            done_mask[i] = 1;
            double t0 = now_s();
            if (fill(mdl, mo.attn_kind, acc, at[i], &rng, &err) < 0 ||
                core_attn_state_new(core_model_attn(mdl), &st[i][0], &err) < 0 ||
                core_attn_state_copy(st[i][0], acc, &err) < 0)
                goto fail;
            fill_s[i] = now_s() - t0;
        }
        core_attn_state_free(acc);
        acc = NULL;
    }
    for (int i = 0; i < n_st; i++) /* the batch: copies of each context's state */
        for (int b = 1; b < batch; b++)
            if (core_attn_state_new(core_model_attn(mdl), &st[i][b], &err) < 0 ||
                core_attn_state_copy(st[i][b], st[i][0], &err) < 0)
                goto fail;
    int32_t tok = core_model_info(mdl)->n_vocab > 1000 ? 1000 : 1;
    for (int64_t r = 0; r < runs; r++)
        for (int i = 0; i < n_st; i++) { /* alternating: the load falls on both alike */
            double s0 = now_s();
            if (decode(mdl, st[i], (int)batch, n_tok, &tok, &err) < 0)
                goto fail;
            tps[i * runs + r] = (double)(n_tok * batch) / (now_s() - s0);
        }
    double med[MAX_CTX + 1];
    for (int i = 0; i < n_st; i++) {
        double *t = tps + i * runs;
        printf("attn %s M=%" PRId64 " W=%" PRId64 " ctx %" PRId64 " threads %d isa %s%s: state %zu "
               "bytes; fill %.1f s; decode tokens/s:",
               attn, m, w, at[i], core_model_threads(mdl), core_qdot_isa_name(core_qdot_isa()),
               core_q8_amx_used(batch) ? "+amx" : "",
               core_attn_state_bytes(st[i][0]), fill_s[i]);
        for (int64_t r = 0; r < runs; r++)
            printf(" %.2f", t[r]);
        qsort(t, (size_t)runs, sizeof *t, cmp_d);
        med[i] = t[runs / 2];
        printf("; median %.2f\n", med[i]);
        if (batch > 1) /* a line of its own: scripts/bench.py reads the one above whole */
            printf("  batch %" PRId64 ": the tokens/s above count all %" PRId64 " sequences\n",
                   batch, batch);
    }
    if (n_st == 2)
        printf("ratio of the medians, ctx %" PRId64 " / ctx %" PRId64 ": %.3f (runs alternated)\n",
               at[0], at[1], med[0] / med[1]);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "bench_decode: %s\n", err.msg);
done:
    free(tps);
    for (int i = 0; i < n_st; i++)
        for (int b = 0; b < batch; b++)
            core_attn_state_free(st[i][b]);
    core_attn_state_free(acc);
    core_model_free(mdl);
    return status;
}
