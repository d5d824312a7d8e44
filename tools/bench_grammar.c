/* tools/bench_grammar.c — the cost of a grammar's token mask per decoding
 * step next to the cost of the forward it constrains, for docs/GRAMMAR.md.
 *
 *   bench_grammar --model M [--grammar FILE] [--steps N] [--seed S]
 *                 [--threads T] [--prompt TEXT]
 *
 * Builds the vocabulary trie of M's tokenizer, compiles the grammar (by
 * default a nested JSON-like one: the example of docs/GRAMMAR.md with an
 * object at the root and numbers of at most 9 + 8 digits), and
 * generates N tokens under it at temperature 1: per step one single-token
 * forward (what a server does per generated token), core_grammar_mask,
 * core_sampler_sample_masked and core_grammar_accept, each timed. When a
 * string of the language is complete the grammar starts again (the model's
 * context goes on). Then the same token sequence is replayed through a
 * grammar without position tables (max_cache = 1: every mask walks the
 * trie) to show what the tables save. Prints medians, the 90th percentile
 * and the maximum (the first use of a position builds its table), and the
 * tables' memory.
 *
 *   bench_grammar --model M --grammar FILE --compile N [--text TEXT]
 *
 * measures the bounds of docs/GRAMMAR.md instead: compiling the grammar N
 * times with core_grammar_new's probe and N times without it (max_probe 1),
 * the medians of each in CPU time (the probe's cost is the difference);
 * then, after the bytes of TEXT (default none), the parse stacks, the first
 * mask (its positions' tables built) and a second one. No forward runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/text/grammar.h"
#include "core/model.h"
#include "core/sample.h"
#include "core/text/tokenizer.h"

static const char json_grammar[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
    "member ::= string ws \":\" ws value ws\n"
    "array  ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,8} ) ( \".\" [0-9]{1,8} )?\n"
    "ws     ::= [ \\t\\n]{0,8}\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[n] and prints median, p90 and max. */
static void report(const char *what, double *v, size_t n)
{
    if (n == 0)
        return;
    qsort(v, n, sizeof *v, cmp_d);
    printf("%-34s median %9.1f us   p90 %9.1f us   max %9.1f us   (%zu steps)\n", what, v[n / 2],
           v[(n * 9) / 10], v[n - 1], n);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            char *nb = realloc(b, cap);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
        }
        r = fread(b + n, 1, cap - n, f);
        n += r;
    } while (r > 0);
    fclose(f);
    *len = n;
    return b;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_grammar --model M [--grammar FILE] [--steps N] [--seed S] "
                    "[--threads T] [--prompt TEXT]\n"
                    "       bench_grammar --model M [--grammar FILE] --compile N [--text TEXT]\n");
    return 2;
}

/* CPU time of this thread in microseconds: the --compile figures hold on
 * a loaded machine, where wall time counts the other processes too. */
static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* --compile: compile cost with and without the probe, then one state's
 * stacks and masks (see the header); CPU time. */
static int bench_compile(const char *gtext, size_t glen, const core_grammar_vocab_t *gv, long n,
                         const char *text, int64_t V)
{
    double *t_on = malloc((size_t)n * sizeof *t_on), *t_off = malloc((size_t)n * sizeof *t_off);
    uint64_t *allow = malloc(CORE_GRAMMAR_MASK_WORDS(V) * sizeof *allow);
    core_grammar_ws_t *ws = core_grammar_ws_new();
    core_grammar_t *g = NULL;
    core_grammar_state_t st = {0};
    core_error_t err = {0};
    core_grammar_limits_t off = {.max_probe = 1};
    int rc = 0, status = 0;
    if (!t_on || !t_off || !allow || !ws) {
        fprintf(stderr, "bench_grammar: out of memory\n");
        status = 1;
        goto out;
    }
    for (long i = 0; i < n && rc == 0; i++) {
        double t0 = cpu_us();
        rc = core_grammar_new(gtext, glen, gv, &off, &g, &err);
        t_off[i] = cpu_us() - t0;
        core_grammar_free(g);
        g = NULL;
        if (rc < 0)
            break;
        t0 = cpu_us();
        rc = core_grammar_new(gtext, glen, gv, NULL, &g, &err);
        t_on[i] = cpu_us() - t0;
        if (rc == 0 && i + 1 < n) {
            core_grammar_free(g);
            g = NULL;
        }
    }
    if (rc < 0) {
        printf("refused: %s\n", err.msg);
        goto out;
    }
    report("compile, probe on (CPU)", t_on, (size_t)n);
    report("compile, probe off (CPU)", t_off, (size_t)n);
    if (core_grammar_state_init(&st, g, &err) < 0 ||
        core_grammar_accept_bytes(&st, ws, text, strlen(text), &err) < 0) {
        printf("after the text: %s\n", err.msg);
        goto out;
    }
    double t0 = cpu_us();
    rc = core_grammar_mask(&st, ws, allow, V, &err);
    double t_first = cpu_us() - t0;
    t0 = cpu_us();
    if (rc == 0)
        rc = core_grammar_mask(&st, ws, allow, V, &err);
    double t_again = cpu_us() - t0;
    if (rc < 0)
        printf("mask: %s\n", err.msg);
    else
        printf("after %zu bytes: %u parse stacks; first mask %.1f us CPU (tables: %zu KiB), "
               "again %.1f us\n",
               strlen(text), (unsigned)st.n_stacks, t_first, core_grammar_cache_bytes(g) >> 10,
               t_again);
out:
    core_grammar_state_clear(&st);
    core_grammar_free(g);
    core_grammar_ws_free(ws);
    free(t_on);
    free(t_off);
    free(allow);
    return status;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *gpath = NULL;
    const char *prompt = "Write a JSON object that describes a book, with nested fields:\n";
    const char *after = ""; /* --text */
    long steps = 200, seed = 1, threads = 0, compile_n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        char *end = NULL;
        errno = 0;
        if (!strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--grammar"))
            gpath = v;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--steps"))
            steps = strtol(v, &end, 10);
        else if (!strcmp(a, "--seed"))
            seed = strtol(v, &end, 10);
        else if (!strcmp(a, "--threads"))
            threads = strtol(v, &end, 10);
        else if (!strcmp(a, "--compile"))
            compile_n = strtol(v, &end, 10);
        else if (!strcmp(a, "--text"))
            after = v;
        else
            return usage();
        if (end && (*end || errno))
            return usage();
        i++;
    }
    if (!model_path || steps < 1 || steps > 100000 || threads < 0 || threads > 64 ||
        compile_n < 0 || compile_n > 100000)
        return usage();

    core_error_t err = {0};
    core_model_opts_t mo = {.max_ctx = 8192, .n_threads = (int)threads};
    core_model_t *m = NULL;
    core_tokenizer_t *tok = NULL;
    if (core_model_load(model_path, &mo, &m, &err) < 0 ||
        core_tokenizer_from_gguf(core_model_gguf(m), &tok, &err) < 0) {
        fprintf(stderr, "bench_grammar: %s: %s\n", model_path, err.msg);
        return 1;
    }
    const int64_t V = core_model_info(m)->n_vocab;
    size_t glen = strlen(json_grammar);
    char *gtext = (char *)json_grammar;
    if (gpath && !(gtext = read_file(gpath, &glen))) {
        fprintf(stderr, "bench_grammar: cannot read %s\n", gpath);
        return 1;
    }

    double t0 = now_us();
    core_grammar_vocab_t *gv = NULL;
    if (core_grammar_vocab_from_tokenizer(tok, &gv, &err) < 0) {
        fprintf(stderr, "bench_grammar: vocabulary: %s\n", err.msg);
        return 1;
    }
    double t_vocab = now_us() - t0;
    if (compile_n)
        return bench_compile(gtext, glen, gv, compile_n, after, V);
    core_grammar_limits_t nocache = {.max_cache = 1};
    core_grammar_t *g = NULL, *g0 = NULL;
    t0 = now_us();
    if (core_grammar_new(gtext, glen, gv, NULL, &g, &err) < 0 ||
        core_grammar_new(gtext, glen, gv, &nocache, &g0, &err) < 0) {
        fprintf(stderr, "bench_grammar: grammar: %s\n", err.msg);
        return 1;
    }
    double t_compile = (now_us() - t0) / 2;

    core_attn_state_t *st = NULL;
    core_sample_params_t sp;
    core_sample_params_default(&sp);
    sp.seed = (uint64_t)seed;
    core_sampler_t *smp = NULL;
    core_sample_ws_t *sws = core_sample_ws_new();
    core_grammar_ws_t *gws = core_grammar_ws_new();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = malloc((size_t)V * sizeof *logits);
    uint64_t *allow = malloc(CORE_GRAMMAR_MASK_WORDS(V) * sizeof *allow);
    int32_t *toks = malloc((size_t)steps * sizeof *toks);
    double *t_fwd = malloc((size_t)steps * sizeof *t_fwd);
    double *t_mask = malloc((size_t)steps * sizeof *t_mask);
    double *t_acc = malloc((size_t)steps * sizeof *t_acc);
    double *t_mask0 = malloc((size_t)steps * sizeof *t_mask0);
    if (!sws || !gws || !logits || !allow || !toks || !t_fwd || !t_mask || !t_acc || !t_mask0 ||
        core_attn_state_new(core_model_attn(m), &st, &err) < 0 ||
        core_sampler_new(&sp, &smp, &err) < 0 ||
        core_tokenizer_encode_alloc(tok, prompt, strlen(prompt), 0, 1 << 20, CORE_TOK_ADD_SPECIAL,
                                    &ids, &n_ids, &err) < 0 ||
        n_ids == 0) {
        fprintf(stderr, "bench_grammar: setup: %s\n", err.msg[0] ? err.msg : "out of memory");
        return 1;
    }
    core_batch_seq_t b = {st, ids, (int64_t)n_ids, CORE_LOGITS_LAST, logits, NULL};
    if (core_model_forward(m, &b, 1, &err) < 0) {
        fprintf(stderr, "bench_grammar: prefill: %s\n", err.msg);
        return 1;
    }

    core_grammar_state_t gs;
    if (core_grammar_state_init(&gs, g, &err) < 0) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    int restarts = 0;
    long n = 0;
    for (; n < steps; n++) {
        double a = now_us();
        int rc = core_grammar_mask(&gs, gws, allow, V, &err);
        double c = now_us();
        core_sample_result_t r;
        if (rc == 0)
            rc = core_sampler_sample_masked(smp, sws, logits, V, allow, &r, &err);
        double d = now_us();
        if (rc == 0)
            rc = core_grammar_accept(&gs, gws, r.token, &err);
        double e = now_us();
        if (rc < 0) {
            fprintf(stderr, "bench_grammar: step %ld: %s\n", n, err.msg);
            break;
        }
        t_mask[n] = c - a;
        t_acc[n] = e - d;
        toks[n] = r.token;
        if (!core_grammar_state_can_continue(&gs)) {
            /* a whole string: start the grammar again, keep the context */
            core_grammar_state_clear(&gs);
            if (core_grammar_state_init(&gs, g, &err) < 0)
                break;
            restarts++;
        }
        b = (core_batch_seq_t){st, &toks[n], 1, CORE_LOGITS_LAST, logits, NULL};
        a = now_us();
        rc = core_model_forward(m, &b, 1, &err);
        t_fwd[n] = now_us() - a;
        if (rc < 0) {
            fprintf(stderr, "bench_grammar: forward: %s\n", err.msg);
            break;
        }
    }
    core_grammar_state_clear(&gs);

    /* the same tokens through a grammar without tables */
    long n0 = 0;
    core_grammar_state_t gs0;
    if (core_grammar_state_init(&gs0, g0, &err) == 0) {
        for (; n0 < n; n0++) {
            double a = now_us();
            int rc = core_grammar_mask(&gs0, gws, allow, V, &err);
            t_mask0[n0] = now_us() - a;
            if (rc < 0 || core_grammar_accept(&gs0, gws, toks[n0], &err) < 0)
                break;
            if (!core_grammar_state_can_continue(&gs0)) {
                core_grammar_state_clear(&gs0);
                if (core_grammar_state_init(&gs0, g0, &err) < 0)
                    break;
            }
        }
        core_grammar_state_clear(&gs0);
    }

    printf("model %s: V = %lld tokens, trie of %zu nodes built in %.1f ms; grammar compiled in "
           "%.2f ms\n",
           model_path, (long long)V, core_grammar_vocab_nodes(gv), t_vocab / 1e3, t_compile / 1e3);
    printf("%ld steps, %d complete strings; position tables: %.1f MiB\n", n, restarts,
           (double)core_grammar_cache_bytes(g) / (1 << 20));
    char text[512];
    size_t tl = 0;
    core_tokenizer_decode(tok, toks, n < 60 ? (size_t)n : 60, 0, text, sizeof text - 1, &tl, NULL);
    if (tl > sizeof text - 1)
        tl = sizeof text - 1; /* cut: a prefix was written */
    text[tl] = '\0';
    printf("text: %s%s\n", text, n > 60 ? " ..." : "");
    report("forward (1 token)", t_fwd, (size_t)n);
    report("mask (tables)", t_mask, (size_t)n);
    report("mask (no tables: whole trie)", t_mask0, (size_t)n0);
    report("accept", t_acc, (size_t)n);

    if (gtext != json_grammar)
        free(gtext);
    free(ids);
    free(logits);
    free(allow);
    free(toks);
    free(t_fwd);
    free(t_mask);
    free(t_acc);
    free(t_mask0);
    core_sampler_free(smp);
    core_sample_ws_free(sws);
    core_grammar_ws_free(gws);
    core_grammar_free(g);
    core_grammar_free(g0);
    core_grammar_vocab_free(gv);
    core_attn_state_free(st);
    core_tokenizer_free(tok);
    core_model_free(m);
    return 0;
}
