/* tests/helpers/sample_dump.c — drives core/sample for Python oracles and
 * measures it.
 *
 *   sample_dump bench [V] [iters]
 *       times core_sampler_sample on random logits for several parameter sets
 *       and prints microseconds per sample (a benchmark, not a test).
 *   sample_dump run
 *       reads one case from stdin and prints what the sampler does with it:
 *         stdin:  T TOP_K TOP_P MIN_P REPEAT LAST_N PRESENCE FREQUENCY SEED NLOGPROBS
 *                 NHIST h_1 .. h_NHIST
 *                 V z_1 .. z_V          (%a or decimal floats; "-inf" allowed)
 *         stdout: "dist N" then N lines "id prob"          (core_sampler_dist)
 *                 "token ID LOGPROB"                         (core_sampler_sample)
 *                 "top N" then N lines "id logprob"
 *       Exit status 2 and the error message on stderr if a call fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "core/sample.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_case {
    const char *name;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t n_logprobs;
} bench_case_t;

static int bench(int64_t V, int iters)
{
    static const bench_case_t cases[] = {
        {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f, 0},
        {"T=1, no filter", 1.0f, 0, 1.0f, 0.0f, 1.0f, 0},
        {"T=0.8 top_k=40", 0.8f, 40, 1.0f, 0.0f, 1.0f, 0},
        {"T=0.8 top_p=0.95", 0.8f, 0, 0.95f, 0.0f, 1.0f, 0},
        {"T=0.8 min_p=0.05", 0.8f, 0, 1.0f, 0.05f, 1.0f, 0},
        {"T=0.8 top_k=40 top_p=0.95 min_p=0.05", 0.8f, 40, 0.95f, 0.05f, 1.0f, 0},
        {"T=0.8 top_p=0.95 repeat=1.1 logprobs=20", 0.8f, 0, 0.95f, 0.0f, 1.1f, 20},
    };
    /* "peaked": a normal background plus a few strong candidates, like an LM
     * that is fairly sure; "flat": the background alone, so top-p must reach
     * deep into the vocabulary (the partial selection falls back to a sort). */
    static const char *const shapes[] = {"peaked", "flat"};
    core_sample_ws_t *ws = core_sample_ws_new();
    float *x = malloc((size_t)V * sizeof *x);
    if (!ws || !x)
        return 1;
    core_rng_t r;
    core_rng_seed(&r, 1);
    printf("V=%lld, %d samples per case, microseconds per sample\n", (long long)V, iters);
    /* Machine yardstick: the cost of one expf pass over V logits. */
    for (int64_t i = 0; i < V; i++)
        x[i] = (float)(2.0 * core_rng_normal(&r));
    double acc = 0.0, y0 = now_s();
    for (int it = 0; it < iters; it++)
        for (int64_t i = 0; i < V; i++)
            acc += (double)expf(x[i] - (float)it * 1e-3f);
    printf("  (one expf pass over V: %.1f us; checksum %g)\n", (now_s() - y0) * 1e6 / iters, acc);
    for (int sh = 0; sh < 2; sh++) {
        for (int64_t i = 0; i < V; i++)
            x[i] = (float)(2.0 * core_rng_normal(&r));
        if (sh == 0)
            for (int k = 0; k < 8; k++)
                x[core_rng_u64(&r) % (uint64_t)V] += 14.0f - (float)k;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            core_sample_params_t p;
            core_sample_params_default(&p);
            p.temperature = cases[c].temperature;
            p.top_k = cases[c].top_k;
            p.top_p = cases[c].top_p;
            p.min_p = cases[c].min_p;
            p.repeat_penalty = cases[c].repeat_penalty;
            p.n_logprobs = cases[c].n_logprobs;
            p.seed = 7;
            core_sampler_t *s = NULL;
            core_error_t e = {0};
            if (core_sampler_new(&p, &s, &e) != 0) {
                fprintf(stderr, "%s\n", e.msg);
                return 2;
            }
            core_sample_result_t res;
            core_sampler_sample(s, ws, x, V, &res, NULL); /* warm the workspace */
            double t0 = now_s();
            for (int i = 0; i < iters; i++)
                core_sampler_sample(s, ws, x, V, &res, NULL);
            double us = (now_s() - t0) * 1e6 / iters;
            printf("  %-7s %-42s %8.1f\n", shapes[sh], cases[c].name, us);
            core_sampler_free(s);
        }
    }
    free(x);
    core_sample_ws_free(ws);
    return 0;
}

static int run_case(void)
{
    core_sample_params_t p;
    core_sample_params_default(&p);
    unsigned long long seed;
    int nh;
    long long V;
    if (scanf("%f %d %f %f %f %d %f %f %llu %d", &p.temperature, &p.top_k, &p.top_p, &p.min_p,
              &p.repeat_penalty, &p.repeat_last_n, &p.presence_penalty, &p.frequency_penalty,
              &seed, &p.n_logprobs) != 10)
        goto bad;
    p.seed = seed;
    core_sampler_t *s = NULL;
    core_error_t e = {0};
    if (core_sampler_new(&p, &s, &e) != 0)
        goto fail;
    if (scanf("%d", &nh) != 1 || nh < 0 || nh > 100000)
        goto bad;
    for (int i = 0; i < nh; i++) {
        int32_t t;
        if (scanf("%d", &t) != 1 || core_sampler_accept(s, t, &e) != 0)
            goto bad;
    }
    if (scanf("%lld", &V) != 1 || V <= 0 || V > CORE_SAMPLE_MAX_VOCAB)
        goto bad;
    float *x = malloc((size_t)V * sizeof *x);
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    double *probs = malloc((size_t)V * sizeof *probs);
    core_sample_ws_t *ws = core_sample_ws_new();
    if (!x || !ids || !probs || !ws)
        goto bad;
    for (long long i = 0; i < V; i++)
        if (scanf("%f", &x[i]) != 1)
            goto bad;
    size_t n = 0;
    if (core_sampler_dist(s, ws, x, V, ids, probs, (size_t)V, &n, &e) != 0)
        goto fail;
    printf("dist %zu\n", n);
    for (size_t i = 0; i < n; i++)
        printf("%d %.17g\n", ids[i], probs[i]);
    core_sample_result_t res;
    if (core_sampler_sample(s, ws, x, V, &res, &e) != 0)
        goto fail;
    printf("token %d %.9g\ntop %d\n", res.token, (double)res.logprob, res.n_top);
    for (int i = 0; i < res.n_top; i++)
        printf("%d %.9g\n", res.top[i].id, (double)res.top[i].logprob);
    return 0;
fail:
    fprintf(stderr, "sample_dump: %s\n", e.msg);
    return 2;
bad:
    fprintf(stderr, "sample_dump: malformed input\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "bench") == 0) {
        int64_t V = argc > 2 ? atoll(argv[2]) : 49152;
        int iters = argc > 3 ? atoi(argv[3]) : 2000;
        if (V <= 0 || V > CORE_SAMPLE_MAX_VOCAB || iters <= 0)
            return 1;
        return bench(V, iters);
    }
    if (argc == 2 && strcmp(argv[1], "run") == 0)
        return run_case();
    fprintf(stderr, "usage: sample_dump bench [V] [iters] | sample_dump run < case\n");
    return 1;
}
