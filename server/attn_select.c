/* server/attn_select.c — --attn auto and the attention settings (see
 * attn_select.h). */
#include "server/attn_select.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/attn/features.h"

int srv_attn_parse(const char *name, int *kind)
{
    if (strcmp(name, "auto") == 0) {
        *kind = SRV_ATTN_AUTO;
        return 0;
    }
    core_attn_kind_t k;
    if (core_attn_kind_parse(name, &k) < 0)
        return CORE_EINVAL;
    *kind = (int)k;
    return 0;
}

static int set_adapter(srv_attn_choice_t *out, const char *path, core_error_t *err)
{
    size_t n = strlen(path);
    if (n >= sizeof out->adapter)
        return core_error_set(err, CORE_ERANGE, "adapter path too long: %.200s...", path);
    memcpy(out->adapter, path, n + 1);
    out->mo.adapter_path = out->adapter;
    return 0;
}

int srv_attn_select(const char *model_path, const srv_attn_request_t *rq, srv_attn_choice_t *out,
                    core_error_t *err)
{
    memset(out, 0, sizeof *out);
    const int have_adapter = rq->adapter && rq->adapter[0];
    int rc;
    core_features_settings_t fs = {.n_features = rq->n_features, .window = rq->window,
                                   .sinks = rq->sinks, .prerope = rq->prerope,
                                   .memory = rq->memory, .memory_keep = -1,
                                   .kv_bits = rq->kv_bits};
    const int keep_asked = rq->memory_keep && rq->memory_keep[0],
              heads_asked = rq->memory_heads && rq->memory_heads[0];
    if (keep_asked && core_attn_keep_parse(rq->memory_keep, &fs.memory_keep) < 0)
        return core_error_set(err, CORE_EINVAL, "--memory-keep must be recall or recent, got "
                              "'%.40s'", rq->memory_keep);
    if (heads_asked) {
        if (strlen(rq->memory_heads) >= sizeof fs.memory_heads)
            return core_error_set(err, CORE_EINVAL, "--memory-heads is longer than %zu bytes",
                                  sizeof fs.memory_heads - 1);
        memcpy(fs.memory_heads, rq->memory_heads, strlen(rq->memory_heads) + 1);
    }
    out->mo.max_ctx = rq->max_ctx;
    out->mo.decay_off = rq->decay_off;
    out->mo.linear_off = rq->linear == 0;
    if (have_adapter && (rc = set_adapter(out, rq->adapter, err)) < 0)
        return rc;
    if (rq->kind != SRV_ATTN_AUTO) {
        out->mo.attn_kind = (core_attn_kind_t)rq->kind;
    } else if (have_adapter) {
        out->mo.attn_kind = CORE_ATTN_DARKFORMER;
    } else {
        core_error_t why = {0};
        rc = core_model_adapter_find(model_path, out->adapter, sizeof out->adapter, &why);
        if (rc == 0) {
            out->mo.attn_kind = CORE_ATTN_DARKFORMER;
            out->mo.adapter_path = out->adapter;
            out->discovered = 1;
        } else if (rc == CORE_ENOTFOUND && core_model_file_local_layers(model_path)) {
            out->mo.attn_kind = CORE_ATTN_EXACT;
            out->fallback = 1;
            snprintf(out->note, sizeof out->note,
                     "%s; sliding-window model: its global layers need the adapter for "
                     "linear attention, using exact",
                     why.msg);
        } else if (rc == CORE_ENOTFOUND) {
            out->mo.attn_kind = CORE_ATTN_PERFORMER;
            out->mo.linear_off = rq->linear != 1;
            if (fs.window < 0)
                fs.window = SRV_ATTN_FALLBACK_WINDOW;
            out->fallback = 1;
            snprintf(out->note, sizeof out->note,
                     "%s; using performer with sinks + window only (training-free); pass "
                     "--adapter PATH or --attn KIND",
                     why.msg);
        } else {
            return core_error_set(err, rc, "%s", why.msg);
        }
    }
    if ((rc = core_features_resolve(out->mo.adapter_path, &fs, err)) < 0) {
        char msg[CORE_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        return core_error_set(err, rc, "adapter %s: %s", out->mo.adapter_path, msg);
    }
    out->mo.n_features = fs.n_features;
    out->mo.window = fs.window;
    /* sinks are a linear kinds' setting: exact attention sees every token
     * anyway, and its state blobs must say 0 (core/state.c refuses others) */
    out->mo.sinks = out->mo.attn_kind == CORE_ATTN_EXACT ? 0 : fs.sinks;
    out->mo.prerope = fs.prerope;
    out->mo.seed = fs.seed;
    /* the memory is a linear kind's, beside its window and linear state:
     * exact attention, the training-free fallback (no linear branch) and
     * Flexformer have none unless it was asked for (then the model's load
     * refuses the combination with its reason) */
    const int memoryless = out->mo.attn_kind == CORE_ATTN_EXACT || out->mo.linear_off ||
                           core_attn_kind_is_trig(out->mo.attn_kind);
    out->mo.memory = memoryless && rq->memory < 0 ? 0 : fs.memory;
    /* which rows and heads: asked for without a memory, they could not be
     * honoured (the adapter's own values just go unused) */
    if (!out->mo.memory && (keep_asked || heads_asked))
        return core_error_set(err, CORE_EINVAL, "--memory-%s needs the exact memory (--memory "
                              "N > 0)", keep_asked ? "keep" : "heads");
    out->mo.memory_keep = fs.memory_keep;
    memcpy(out->memory_heads, fs.memory_heads, sizeof out->memory_heads);
    out->mo.memory_heads = out->memory_heads;
    /* 8-bit rows are the linear kinds' (exact attention refuses them when
     * asked for: core_attn_new) */
    out->mo.kv_bits = out->mo.attn_kind == CORE_ATTN_EXACT && rq->kv_bits <= 0 ? 16 : fs.kv_bits;
    return 0;
}

const char *srv_prompt_rows_note(const core_model_t *m, int asked_int8, int *warn)
{
    *warn = 0;
    if (core_model_prompt_int8(m))
        return "prompt rows in 8 bits (--prompt-precision int8)";
    *warn = asked_int8;
    if (core_model_prompt_amx(m))
        return asked_int8 ? "--prompt-precision int8 needs every matrix packed (Q4_0, Q4_1, "
                            "Q8_0): prompt rows stay on the Intel AMX-BF16 tiles"
                          : "prompt rows on Intel AMX-BF16 tiles (two bf16 parts a value, within "
                            "2^-16 of f32; --prompt-precision f32 for the f32 products)";
    return asked_int8 ? "--prompt-precision int8: prompt rows stay f32 (it needs the AVX2 or "
                        "AVX-512 VNNI kernels and Q4_0, Q4_1 or Q8_0 weights throughout)"
                      : NULL;
}

void srv_attn_describe(const core_attn_cfg_t *ac, const char *adapter, char *buf, size_t cap)
{
    const char *ad = adapter && adapter[0] ? adapter : "none";
    /* a sliding-window model: the kind is its global layers' */
    char swa[128] = "";
    if (ac->swa_window > 0) {
        const int ng = core_attn_global_layers(ac);
        snprintf(swa, sizeof swa, "; on the %d global layer%s, the %d local ones exact in a "
                 "ring of their %" PRId64 "-token window", ng, ng == 1 ? "" : "s",
                 ac->n_layer - ng, ac->swa_window);
    }
    if (ac->kind == CORE_ATTN_EXACT) {
        snprintf(buf, cap, "exact (exact context %" PRId64 ", adapter %s%s)", ac->max_ctx, ad, swa);
        return;
    }
    char mem[96] = "";
    if (ac->memory)
        snprintf(mem, sizeof mem, ", memory %d (%s, %zu of %d KV heads)", ac->memory,
                 core_attn_keep_name(ac->memory_keep), core_attn_memory_heads(ac),
                 ac->n_layer * ac->n_head_kv);
    if (ac->kv_bits == 8)
        snprintf(mem + strlen(mem), sizeof mem - strlen(mem), ", 8-bit rows");
    snprintf(buf, cap,
             "%s (features %d, window %d, sinks %d%s%s%s%s, exact context %" PRId64
             ", adapter %s%s)",
             core_attn_kind_name(ac->kind), ac->n_features, ac->window, ac->sinks, mem,
             ac->prerope ? ", pre-RoPE" : "", ac->decay_off ? ", decay off" : "",
             ac->linear_off ? ", linear branch off" : "", ac->max_ctx, ad, swa);
}
