/* tests/helpers/logits_dump.c — runs core/model.c on token ids for the Python
 * oracle tests (tests/reference/test_model_oracle.py) and by hand for timing.
 *
 *   logits_dump MODEL [--tokens 1,2,3 | --tokens-file F] [--logits OUT]
 *               [--greedy N] [--chunk K] [--max-ctx N] [--info] [--time]
 *
 * --tokens / --tokens-file  prompt ids, comma- or whitespace-separated
 * --logits OUT              float32 logits of every prompt position, [T][V]
 *                           (CORE_LOGITS_ALL), raw little-endian; without it
 *                           the prefill asks for the last position only
 * --greedy N                prints "greedy: id id ..." — N argmax tokens
 *                           decoded one at a time after the prompt
 * --chunk K                 prefill in chunks of K tokens (default: one call)
 * --max-ctx N               exact attention capacity (default: the model's)
 * --threads N               compute threads (default 0: one per CPU)
 * --isa NAME                quantized kernels forced onto generic, avx2,
 *                           avx512vnni, neon or neon-dotprod (default: the
 *                           best this CPU runs)
 * --adapter A               DARKFormer attention with adapter A and its
 *                           settings (default: exact attention)
 * --prompt-int8             prompt rows in 8 bits (core_model_opts.prompt_int8)
 * --prompt-f32              prompt rows in f32 even where the CPU has AMX-BF16
 *                           tiles (core_model_opts.prompt_f32); stdout's
 *                           "prompt: int8|bf16t|f32" line says which ran
 * --info                    prints the model info fields
 * --time                    prints prefill / decode wall and CPU time, peak RSS
 *
 * Exit status 0 on success, 1 on any error (message on stderr).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/attn/features.h"
#include "core/model.h"
#include "core/kernels/qdot.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all BLAS threads): less disturbed than
 * wall time when other work shares the machine. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Parses ids separated by commas or whitespace from s; appends to *ids. */
static int parse_ids(const char *s, int32_t **ids, int64_t *n, int64_t *cap)
{
    while (*s) {
        if (*s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "logits_dump: bad token id near '%.16s'\n", s);
            return -1;
        }
        if (*n == *cap) {
            int64_t nc = *cap ? *cap * 2 : 256;
            int32_t *p = realloc(*ids, (size_t)nc * sizeof *p);
            if (!p)
                return -1;
            *ids = p;
            *cap = nc;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 0;
}

static char *slurp_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0)
            break;
        n += r;
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: logits_dump MODEL [--tokens ids | --tokens-file F] [--logits OUT] "
                        "[--greedy N] [--chunk K] [--max-ctx N] [--threads N] [--isa NAME] [--adapter A] "
                        "[--prompt-int8] [--prompt-f32] "
                        "[--info] [--time]\n");
        return 1;
    }
    const char *model_path = argv[1], *logits_path = NULL, *adapter = NULL;
    int32_t *ids = NULL;
    int64_t n_ids = 0, cap_ids = 0, n_greedy = 0, chunk = 0, max_ctx = 0, threads = 0;
    int info = 0, timing = 0, prompt_int8 = 0, prompt_f32 = 0, rc = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--info") == 0) {
            info = 1;
        } else if (strcmp(a, "--time") == 0) {
            timing = 1;
        } else if (strcmp(a, "--prompt-int8") == 0) {
            prompt_int8 = 1;
        } else if (strcmp(a, "--prompt-f32") == 0) {
            prompt_f32 = 1;
        } else if (!val) {
            fprintf(stderr, "logits_dump: %s needs a value\n", a);
            return 1;
        } else if (strcmp(a, "--tokens") == 0) {
            if (parse_ids(val, &ids, &n_ids, &cap_ids) < 0)
                return 1;
            i++;
        } else if (strcmp(a, "--tokens-file") == 0) {
            char *text = slurp_text(val);
            if (!text) {
                fprintf(stderr, "logits_dump: cannot read %s\n", val);
                return 1;
            }
            int r = parse_ids(text, &ids, &n_ids, &cap_ids);
            free(text);
            if (r < 0)
                return 1;
            i++;
        } else if (strcmp(a, "--logits") == 0) {
            logits_path = val;
            i++;
        } else if (strcmp(a, "--greedy") == 0) {
            n_greedy = strtoll(val, NULL, 10);
            i++;
        } else if (strcmp(a, "--chunk") == 0) {
            chunk = strtoll(val, NULL, 10);
            i++;
        } else if (strcmp(a, "--max-ctx") == 0) {
            max_ctx = strtoll(val, NULL, 10);
            i++;
        } else if (strcmp(a, "--adapter") == 0) {
            adapter = val;
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            threads = strtoll(val, NULL, 10);
            i++;
        } else if (strcmp(a, "--isa") == 0) {
            int found = -1;
            for (int k = 0; k < CORE_QDOT_ISA_COUNT_; k++)
                if (strcmp(val, core_qdot_isa_name((core_qdot_isa_t)k)) == 0)
                    found = k;
            if (found < 0 || core_qdot_force_isa((core_qdot_isa_t)found) < 0) {
                fprintf(stderr, "logits_dump: --isa %s: unknown, or this CPU cannot run it\n", val);
                return 1;
            }
            i++;
        } else {
            fprintf(stderr, "logits_dump: unknown option %s\n", a);
            return 1;
        }
    }

    core_error_t err = {0};
    core_model_t *m = NULL;
    core_attn_state_t *st = NULL;
    float *logits = NULL, *last = NULL;
    FILE *out = NULL;
    if (threads < 0 || threads > 256) {
        fprintf(stderr, "logits_dump: --threads %lld out of range [0, 256]\n", (long long)threads);
        return 1;
    }
    core_model_opts_t opts = {.attn_kind = CORE_ATTN_EXACT, .max_ctx = max_ctx,
                              .n_threads = (int)threads, .prompt_int8 = prompt_int8,
                              .prompt_f32 = prompt_f32};
    if (adapter) {
        core_features_settings_t fs = {.window = -1, .sinks = -1, .prerope = -1};
        if (core_features_resolve(adapter, &fs, &err) < 0) {
            fprintf(stderr, "logits_dump: adapter %s: %s\n", adapter, err.msg);
            return 1;
        }
        opts.attn_kind = CORE_ATTN_DARKFORMER;
        opts.adapter_path = adapter;
        opts.n_features = fs.n_features;
        opts.window = fs.window;
        opts.sinks = fs.sinks;
        opts.prerope = fs.prerope;
        opts.seed = fs.seed;
    }
    double t0 = now_s();
    if (core_model_load(model_path, &opts, &m, &err) < 0) {
        fprintf(stderr, "logits_dump: load %s: %s\n", model_path, err.msg);
        goto done;
    }
    double t_load = now_s() - t0;
    const core_model_info_t *in = core_model_info(m);
    const int64_t V = in->n_vocab;
    if (info) {
        printf("arch %s\nname %s\nn_layer %d\nn_embd %d\nn_ff %d\nn_head %d\nn_head_kv %d\n"
               "head_dim %d\nn_vocab %d\nn_ctx_train %" PRId64 "\nrope_base %g\nrope_scale %g\n"
               "rms_eps %g\ntied_output %d\nn_params %" PRIu64 "\nfingerprint %s\n",
               in->arch, in->name, in->n_layer, in->n_embd, in->n_ff, in->n_head, in->n_head_kv,
               in->head_dim, in->n_vocab, in->n_ctx_train, in->rope_base, in->rope_scale,
               in->rms_eps, in->tied_output, in->n_params, in->fingerprint);
    }
    if (n_ids == 0) {
        if (timing)
            printf("load %.3f s\npeak rss %ld KiB\n", t_load, peak_rss_kib());
        rc = 0;
        goto done;
    }
    if (core_attn_state_new(core_model_attn(m), &st, &err) < 0) {
        fprintf(stderr, "logits_dump: state: %s\n", err.msg);
        goto done;
    }
    /* [T][V] with --logits, else [1][V] */
    printf("prompt: %s\n", core_model_prompt_int8(m)  ? "int8"
                            : core_model_prompt_amx(m) ? "bf16t"
                                                       : "f32");
    const int mode = logits_path ? CORE_LOGITS_ALL : CORE_LOGITS_LAST;
    logits = malloc((size_t)(logits_path ? n_ids : 1) * (size_t)V * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "logits_dump: out of memory for %" PRId64 " x %" PRId64 " logits\n", n_ids,
                V);
        goto done;
    }
    if (chunk <= 0)
        chunk = n_ids;
    t0 = now_s();
    double c0 = cpu_s();
    for (int64_t i = 0; i < n_ids; i += chunk) {
        core_batch_seq_t sq = {
            .state = st,
            .tokens = ids + i,
            .n_tokens = n_ids - i < chunk ? n_ids - i : chunk,
            .logits_mode = mode,
            .logits = logits_path ? logits + i * V : logits,
        };
        if (core_model_forward(m, &sq, 1, &err) < 0) {
            fprintf(stderr, "logits_dump: forward at token %" PRId64 ": %s\n", i, err.msg);
            goto done;
        }
    }
    double t_prefill = now_s() - t0, c_prefill = cpu_s() - c0;
    if (logits_path) {
        out = fopen(logits_path, "wb");
        if (!out || fwrite(logits, sizeof *logits, (size_t)(n_ids * V), out) != (size_t)(n_ids * V)) {
            fprintf(stderr, "logits_dump: cannot write %s\n", logits_path);
            goto done;
        }
        if (fclose(out) != 0) {
            out = NULL;
            fprintf(stderr, "logits_dump: cannot write %s\n", logits_path);
            goto done;
        }
        out = NULL;
    }
    double t_decode = 0.0, c_decode = 0.0;
    if (n_greedy > 0) {
        last = malloc((size_t)V * sizeof *last);
        if (!last)
            goto done;
        int32_t tok = argmax(logits + (logits_path ? n_ids - 1 : 0) * V, V);
        printf("greedy:");
        t0 = now_s();
        c0 = cpu_s();
        for (int64_t i = 0; i < n_greedy; i++) {
            printf(" %d", (int)tok);
            if (i + 1 == n_greedy)
                break;
            core_batch_seq_t sq = {
                .state = st, .tokens = &tok, .n_tokens = 1, .logits_mode = CORE_LOGITS_LAST,
                .logits = last,
            };
            if (core_model_forward(m, &sq, 1, &err) < 0) {
                printf("\n");
                fprintf(stderr, "logits_dump: decode step %" PRId64 ": %s\n", i, err.msg);
                goto done;
            }
            tok = argmax(last, V);
        }
        t_decode = now_s() - t0;
        c_decode = cpu_s() - c0;
        printf("\n");
    }
    if (timing) {
        printf("load %.3f s\nprefill %" PRId64 " tokens %.3f s (%.1f tok/s), cpu %.3f s\n", t_load,
               n_ids, t_prefill, (double)n_ids / t_prefill, c_prefill);
        if (n_greedy > 1)
            printf("decode %" PRId64 " tokens %.3f s (%.1f tok/s), cpu %.3f s\n", n_greedy - 1,
                   t_decode, (double)(n_greedy - 1) / t_decode, c_decode);
        printf("state bytes %zu\npeak rss %ld KiB\n", core_attn_state_bytes(st), peak_rss_kib());
    }
    rc = 0;
done:
    if (out)
        fclose(out);
    free(last);
    free(logits);
    free(ids);
    core_attn_state_free(st);
    core_model_free(m);
    return rc;
}
