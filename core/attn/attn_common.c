/* core/attn/attn_common.c — what every attention kind shares and calls: the
 * kinds' names, the sliding-window rule of a layer and the growable scratch
 * of core_attn_t (attn_impl.h). Below
 * attn.c's dispatch and the kinds' files (attn_exact.c, attn_linear.c,
 * features.c); calls nothing above it.
 */
#include "core/attn/attn_impl.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"exact",        "performer",   "darkformer",
                                         "darkformer-is", "flexformer-s", "flexformer-n"};

int64_t core_attn_layer_window(const core_attn_cfg_t *cfg, int layer)
{
    if (cfg->swa_window <= 0 || cfg->swa_period < 1)
        return 0;
    return layer % cfg->swa_period == cfg->swa_period - 1 ? 0 : cfg->swa_window;
}

int core_attn_global_layers(const core_attn_cfg_t *cfg)
{
    int n = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        n += core_attn_layer_window(cfg, l) == 0;
    return n;
}

void core_attn_rope_pairs(const float *in, float *out, int64_t n, int nh, int hd, int n_rot)
{
    const int half = n_rot / 2;
    for (int64_t r = 0; r < n * nh; r++) {
        const float *x = in + r * hd;
        float *y = out + r * hd;
        for (int i = 0; i < half; i++) {
            y[2 * i] = x[i];
            y[2 * i + 1] = x[i + half];
        }
        for (int i = n_rot; i < hd; i++)
            y[i] = x[i];
    }
}

const char *core_attn_kind_name(core_attn_kind_t kind)
{
    if ((unsigned)kind < sizeof kind_names / sizeof kind_names[0])
        return kind_names[kind];
    return "unknown";
}

int core_attn_kind_parse(const char *name, core_attn_kind_t *out)
{
    for (size_t i = 0; name && i < sizeof kind_names / sizeof kind_names[0]; i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            *out = (core_attn_kind_t)i;
            return 0;
        }
    }
    return CORE_EINVAL;
}

int core_attn_kind_is_trig(core_attn_kind_t kind)
{
    return kind == CORE_ATTN_FLEXFORMER_S || kind == CORE_ATTN_FLEXFORMER_N;
}

float *core_attn_scratch(core_attn_t *a, size_t n, core_error_t *err)
{
    if (n <= a->scratch_n)
        return a->scratch;
    float *p = realloc(a->scratch, n * sizeof *p);
    if (!p) {
        core_error_set(err, CORE_ENOMEM, "out of memory for %zu attention scratch floats", n);
        return NULL;
    }
    a->scratch = p;
    a->scratch_n = n;
    return p;
}
