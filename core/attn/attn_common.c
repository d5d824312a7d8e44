/* core/attn/attn_common.c — what every attention kind shares and calls: the
 * kinds' names, the sliding-window rule of a layer, which heads have the
 * exact memory, and the growable scratch
 * of core_attn_t (attn_impl.h). Below
 * attn.c's dispatch and the kinds' files (attn_exact.c, attn_linear.c,
 * features.c); calls nothing above it.
 */
#include "core/attn/attn_impl.h"

#include <stdio.h>
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

int core_attn_head_has_memory(const core_attn_cfg_t *cfg, size_t i)
{
    if (!cfg->memory)
        return 0;
    if (!cfg->memory_some)
        return 1;
    return i < CORE_ATTN_MAX_HEADS && (cfg->memory_mask[i / 64] >> (i % 64) & 1u);
}

size_t core_attn_memory_heads_before(const core_attn_cfg_t *cfg, size_t i)
{
    if (!cfg->memory)
        return 0;
    if (!cfg->memory_some)
        return i;
    size_t n = 0;
    for (size_t w = 0; w < i / 64 && w < CORE_ATTN_MAX_HEADS / 64; w++)
        n += (size_t)__builtin_popcountll(cfg->memory_mask[w]);
    if (i % 64 && i / 64 < CORE_ATTN_MAX_HEADS / 64)
        n += (size_t)__builtin_popcountll(cfg->memory_mask[i / 64] &
                                          ((UINT64_C(1) << (i % 64)) - 1));
    return n;
}

size_t core_attn_memory_heads(const core_attn_cfg_t *cfg)
{
    return core_attn_memory_heads_before(cfg, (size_t)cfg->n_layer * (size_t)cfg->n_head_kv);
}

int core_attn_memory_heads_parse(core_attn_cfg_t *cfg, const char *spec, core_error_t *err)
{
    memset(cfg->memory_mask, 0, sizeof cfg->memory_mask);
    cfg->memory_some = 0;
    if (!spec || !spec[0] || strcmp(spec, "all") == 0)
        return 0;
    if (strlen(spec) >= CORE_ATTN_HEADS_SPEC_MAX)
        return core_error_set(err, CORE_EINVAL, "memory heads: the list is longer than %d bytes",
                              CORE_ATTN_HEADS_SPEC_MAX - 1);
    const long nl = cfg->n_layer, nkv = cfg->n_head_kv;
    if (nl < 1 || nkv < 1 || (size_t)nl * (size_t)nkv > CORE_ATTN_MAX_HEADS)
        return core_error_set(err, CORE_EINVAL, "memory heads: a model of %ld layers and %ld KV "
                              "heads cannot list them (at most %d pairs)", nl, nkv,
                              CORE_ATTN_MAX_HEADS);
    const char *p = spec;
    for (;;) {
        const char *e = p;
        long v[2];
        for (int k = 0; k < 2; k++) {
            if (*e < '0' || *e > '9')
                goto bad;
            v[k] = 0;
            while (*e >= '0' && *e <= '9' && v[k] < 100000)
                v[k] = v[k] * 10 + (*e++ - '0');
            if (k == 0 && *e++ != '.')
                goto bad;
        }
        if (*e != ',' && *e != '\0')
            goto bad;
        if (v[0] >= nl || v[1] >= nkv)
            return core_error_set(err, CORE_EINVAL, "memory heads: '%.*s' is past the model's "
                                  "%ld layers and %ld KV heads", (int)(e - p), p, nl, nkv);
        const size_t i = (size_t)v[0] * (size_t)nkv + (size_t)v[1];
        if (cfg->memory_mask[i / 64] >> (i % 64) & 1u)
            return core_error_set(err, CORE_EINVAL, "memory heads: '%.*s' is listed twice",
                                  (int)(e - p), p);
        cfg->memory_mask[i / 64] |= UINT64_C(1) << (i % 64);
        if (*e == '\0')
            break;
        p = e + 1;
        continue;
    bad:
        return core_error_set(err, CORE_EINVAL, "memory heads: '%.40s' is not 'all' or a list of "
                              "layer.head pairs such as 6.1,14.0", p);
    }
    cfg->memory_some = 1;
    return 0;
}

size_t core_attn_memory_heads_format(const core_attn_cfg_t *cfg, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap)
        buf[0] = '\0';
    if (!cfg->memory_some) {
        n = (size_t)snprintf(buf, cap, "all");
        return n;
    }
    const size_t nh = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
    for (size_t i = 0; i < nh && i < CORE_ATTN_MAX_HEADS; i++) {
        if (!(cfg->memory_mask[i / 64] >> (i % 64) & 1u))
            continue;
        const int k = snprintf(n < cap ? buf + n : NULL, n < cap ? cap - n : 0, "%s%zu.%zu",
                               n ? "," : "", i / (size_t)cfg->n_head_kv,
                               i % (size_t)cfg->n_head_kv);
        n += k > 0 ? (size_t)k : 0;
    }
    return n;
}

static const char *const keep_names[] = {"recall", "recent"};

const char *core_attn_keep_name(int keep)
{
    return keep >= 0 && keep < 2 ? keep_names[keep] : NULL;
}

int core_attn_keep_parse(const char *name, int *keep)
{
    for (int i = 0; name && i < 2; i++)
        if (strcmp(name, keep_names[i]) == 0) {
            *keep = i;
            return 0;
        }
    return CORE_EINVAL;
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
        for (int64_t i = 0; i < half; i++) {
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
