/* tools/write_adapter.c — writes a DARKFormer adapter GGUF (docs/ADAPTER.md)
 * with core_features_adapter_write from raw matrices, then checks that the
 * model loads with it.
 *
 *   write_adapter --model M --kind darkformer|darkformer-is --features N
 *                 --window W [--seed S] [--mat MAT.f32] [--lambda LAMBDA.f32]
 *                 [--sinks S] [--prerope 0|1] [--decay DECAY.f32] [--mix MIX.f32]
 *                 [--lora PREFIX --lora-rank R] --out ADAPTER.gguf
 *   write_adapter --model M --kind flexformer-s|flexformer-n --features N --window W
 *                 --omega OMEGA.f32 [--omega2 OMEGA2.f32 --tau TAU.f32] [--radius RADIUS.f32]
 *                 [the options above]
 *   write_adapter --model M --from ADAPTER.gguf [--serve-window W] [--kv-bits 8|16]
 *                 [--memory N --memory-keep recall|recent --memory-heads all|L.H,...]
 *                 --out ADAPTER2.gguf
 *
 * --serve-window W, --kv-bits B (any mode): the serving defaults the adapter
 * carries (darkformer.serve_window, darkformer.kv_bits: the window and the
 * exact rows' bits `darkserve` uses when no flag says; chosen by measurement,
 * docs/QUALITY.md), beside the window it was trained with (--window); with
 * --from also the exact memory it is served with (darkformer.memory,
 * darkformer.memory_keep, darkformer.memory_heads; all three together).
 * --from: a copy of ADAPTER.gguf, every key and tensor as it is, with those
 * keys set (replaced when present), checked to load like the others.
 *
 * OMEGA.f32 / OMEGA2.f32 (Flexformer, what tools/convert.py train2 --kind and
 * tools/distill.py write): float32 [L][Hkv][N/2][Hd] frequencies; TAU.f32
 * float32 [L][Hkv] τ; flexformer-n needs all three. RADIUS.f32 (either kind,
 * optional): float32 [L][Hkv], the input sphere's radius (features.h).
 * MAT.f32 / LAMBDA.f32: raw little-endian float32 [L][Hkv][Hd][Hd] (what
 * tools/convert.py writes); --kind darkformer needs --mat, darkformer-is
 * needs --lambda; both may be given (one file then serves both kinds).
 * DECAY.f32: float32 [L][Hkv] decays γ; MIX.f32: float32 [L][H] mixing
 * log-weights β (DARKFormer v2, docs/ADAPTER.md). --lora: float32
 * PREFIX.{q_a,q_b,k_a,k_b,v_a,v_b,o_a,o_b}.f32 of rank R, the layouts of
 * core/lora.h (what tools/distill.py --lora writes). The
 * base model M gives the shapes and the fingerprint the adapter names.
 * After writing, the model is loaded with the adapter for every kind the
 * adapter carries tensors for, so a file that the kernels refuse is never
 * left behind (it is removed and the exit status is 1).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn/features.h"
#include "core/lora.h"
#include "core/model.h"
#include "tools/tool_args.h"

static void usage(void)
{
    fprintf(stderr, "usage: write_adapter --model M --kind darkformer|darkformer-is|flexformer-s|"
                    "flexformer-n --features N --window W [--seed S] [--mat MAT.f32] "
                    "[--lambda LAMBDA.f32] [--omega OMEGA.f32] [--omega2 OMEGA2.f32] "
                    "[--tau TAU.f32] [--radius RADIUS.f32] [--sinks S] [--prerope 0|1] "
                    "[--decay DECAY.f32] [--mix MIX.f32] [--lora PREFIX --lora-rank R] "
                    "[--serve-window W] "
                    "[--kv-bits 8|16] --out A.gguf\n"
                    "       write_adapter --model M --from A.gguf [--serve-window W] "
                    "[--kv-bits 8|16] [--memory N --memory-keep recall|recent "
                    "--memory-heads all|L.H,...] --out A2.gguf\n");
}

/* Reads exactly n floats from path into a new buffer. */
static float *read_f32(const char *path, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "write_adapter: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    float *buf = malloc(n * sizeof *buf);
    size_t got = buf ? fread(buf, sizeof *buf, n, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf || got != n || extra) {
        fprintf(stderr, "write_adapter: %s must hold exactly %zu float32 values\n",
                path, n);
        free(buf);
        return NULL;
    }
    return buf;
}

static int check_load(const char *model, const char *adapter, core_attn_kind_t kind, int m, int w,
                      uint64_t seed, int sinks, int prerope)
{
    core_model_opts_t mo = {.attn_kind = kind, .n_features = m, .window = w, .seed = seed,
                            .adapter_path = adapter, .max_ctx = 64, .sinks = sinks,
                            .prerope = prerope};
    core_model_t *mdl = NULL;
    core_error_t err = {0};
    if (core_model_load(model, &mo, &mdl, &err) < 0) {
        fprintf(stderr, "write_adapter: the model does not load with %s as %s: %s\n", adapter,
                core_attn_kind_name(kind), err.msg);
        return 1;
    }
    core_model_free(mdl);
    return 0;
}

/* Copies key i of g into w (adapters hold scalars and strings only). */
static int copy_key(const core_gguf_t *g, int64_t i, core_gguf_writer_t *w, core_error_t *err)
{
    const char *key = core_gguf_kv_key(g, i);
    const core_gguf_type_t t = core_gguf_kv_type(g, i);
    int64_t iv;
    double fv;
    core_gguf_str_t sv;
    switch (t) {
    case CORE_GGUF_TYPE_STRING:
        if (core_gguf_kv_str(g, i, &sv, err) < 0)
            return -1;
        return core_gguf_writer_set_str(w, key, sv.ptr, (size_t)sv.len);
    case CORE_GGUF_TYPE_FLOAT32:
    case CORE_GGUF_TYPE_FLOAT64:
        if (core_gguf_kv_float(g, i, &fv, err) < 0)
            return -1;
        return core_gguf_writer_set_float(w, key, t, fv);
    case CORE_GGUF_TYPE_BOOL:
        if (core_gguf_kv_int(g, i, &iv, err) < 0)
            return -1;
        return core_gguf_writer_set_bool(w, key, iv != 0);
    case CORE_GGUF_TYPE_ARRAY:
        fprintf(stderr, "write_adapter: key %s is an array (an adapter holds none)\n", key);
        return -1;
    default:
        if (core_gguf_kv_int(g, i, &iv, err) < 0)
            return -1;
        return core_gguf_writer_set_int(w, key, t, iv);
    }
}

/* The serving keys --from sets: each where given (> 0; the memory's three
 * together). */
typedef struct serving {
    int window, kv_bits, memory;
    const char *keep, *heads;
} serving_t;

static int is_memory_key(const char *key)
{
    return !strcmp(key, "darkformer.memory") || !strcmp(key, "darkformer.memory_keep") ||
           !strcmp(key, "darkformer.memory_heads");
}

/* write_adapter --from: src's keys and tensors into out, with the serving
 * keys of sv set. */
static int copy_with_serving(const char *src, const serving_t *sv, const char *out)
{
    const int serve_window = sv->window, kv_bits = sv->kv_bits;
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    if (core_gguf_open(src, &g, &err) < 0) {
        fprintf(stderr, "write_adapter: cannot read %s: %s\n", src, err.msg);
        return -1;
    }
    core_gguf_writer_t *w = core_gguf_writer_new(core_gguf_alignment(g));
    int rc = w ? 0 : -1;
    for (int64_t i = 0; !rc && i < core_gguf_n_kv(g); i++) {
        const char *key = core_gguf_kv_key(g, i);
        if ((serve_window > 0 && !strcmp(key, "darkformer.serve_window")) ||
            (kv_bits > 0 && !strcmp(key, "darkformer.kv_bits")) ||
            (sv->memory > 0 && is_memory_key(key)))
            continue;
        rc = copy_key(g, i, w, &err);
    }
    if (!rc && serve_window > 0)
        rc = core_gguf_writer_set_int(w, "darkformer.serve_window", CORE_GGUF_TYPE_UINT32,
                                      serve_window);
    if (!rc && kv_bits > 0)
        rc = core_gguf_writer_set_int(w, "darkformer.kv_bits", CORE_GGUF_TYPE_UINT32, kv_bits);
    if (!rc && sv->memory > 0)
        rc = core_gguf_writer_set_int(w, "darkformer.memory", CORE_GGUF_TYPE_UINT32, sv->memory);
    if (!rc && sv->memory > 0)
        rc = core_gguf_writer_set_str(w, "darkformer.memory_keep", sv->keep, strlen(sv->keep));
    if (!rc && sv->memory > 0)
        rc = core_gguf_writer_set_str(w, "darkformer.memory_heads", sv->heads, strlen(sv->heads));
    for (int64_t i = 0; !rc && i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        rc = core_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                         t->nbytes);
    }
    if (!rc)
        rc = core_gguf_writer_write(w, out, &err);
    if (rc)
        fprintf(stderr, "write_adapter: cannot copy %s to %s: %s\n", src, out,
                err.msg[0] ? err.msg : "a key or tensor was refused");
    core_gguf_writer_free(w);
    core_gguf_close(g);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *kind_s = NULL, *mat_p = NULL, *lam_p = NULL, *out = NULL;
    const char *dec_p = NULL, *mix_p = NULL, *lora_p = NULL, *om_p = NULL, *om2_p = NULL;
    const char *tau_p = NULL, *rad_p = NULL, *from = NULL, *keep = NULL, *heads = NULL;
    int64_t m = 0, w = -1, seed = 0, sinks = 0, prerope = 0, rank = 0, serve_w = 0, kv_bits = 0;
    int64_t memory = 0;
    int keep_v = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!bad && !strcmp(a, "--model"))
            model = v;
        else if (!bad && !strcmp(a, "--kind"))
            kind_s = v;
        else if (!bad && !strcmp(a, "--mat"))
            mat_p = v;
        else if (!bad && !strcmp(a, "--lambda"))
            lam_p = v;
        else if (!bad && !strcmp(a, "--out"))
            out = v;
        else if (!bad && !strcmp(a, "--decay"))
            dec_p = v;
        else if (!bad && !strcmp(a, "--mix"))
            mix_p = v;
        else if (!bad && !strcmp(a, "--omega"))
            om_p = v;
        else if (!bad && !strcmp(a, "--omega2"))
            om2_p = v;
        else if (!bad && !strcmp(a, "--tau"))
            tau_p = v;
        else if (!bad && !strcmp(a, "--radius"))
            rad_p = v;
        else if (!bad && !strcmp(a, "--lora"))
            lora_p = v;
        else if (!bad && !strcmp(a, "--lora-rank"))
            bad = parse_i64(v, 1, CORE_LORA_MAX_RANK, &rank);
        else if (!bad && !strcmp(a, "--sinks"))
            bad = parse_i64(v, 0, CORE_FEATURES_MAX_SINKS, &sinks);
        else if (!bad && !strcmp(a, "--prerope"))
            bad = parse_i64(v, 0, 1, &prerope);
        else if (!bad && !strcmp(a, "--features"))
            bad = parse_i64(v, 1, CORE_FEATURES_MAX_FEATURES, &m);
        else if (!bad && !strcmp(a, "--window"))
            bad = parse_i64(v, 0, CORE_FEATURES_MAX_WINDOW, &w);
        else if (!bad && !strcmp(a, "--seed"))
            bad = parse_i64(v, 0, INT64_MAX, &seed);
        else if (!bad && !strcmp(a, "--from"))
            from = v;
        else if (!bad && !strcmp(a, "--serve-window"))
            bad = parse_i64(v, 1, CORE_FEATURES_MAX_WINDOW, &serve_w);
        else if (!bad && !strcmp(a, "--kv-bits"))
            bad = parse_i64(v, 8, 16, &kv_bits) || (kv_bits != 8 && kv_bits != 16);
        else if (!bad && !strcmp(a, "--memory"))
            bad = parse_i64(v, 1, CORE_ATTN_MAX_MEMORY, &memory);
        else if (!bad && !strcmp(a, "--memory-keep"))
            bad = core_attn_keep_parse(keep = v, &keep_v) < 0;
        else if (!bad && !strcmp(a, "--memory-heads"))
            heads = v;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "write_adapter: bad option or value near '%s'\n", a);
            usage();
            return 2;
        }
        i++;
    }
    if (from) { /* the copy: nothing else but the serving keys */
        if (!model || !out || kind_s || mat_p || lam_p || dec_p || mix_p || lora_p || om_p ||
            om2_p || tau_p || rad_p || m || w >= 0 || (!serve_w && !kv_bits && !memory) ||
            !memory != !keep || !memory != !heads) {
            usage();
            return 2;
        }
        core_features_settings_t fs = {.window = -1, .sinks = -1, .prerope = -1, .memory = -1,
                                       .memory_keep = -1, .kv_bits = -1};
        core_error_t err = {0};
        const serving_t sv = {(int)serve_w, (int)kv_bits, (int)memory, keep, heads};
        if (copy_with_serving(from, &sv, out) < 0)
            return 1;
        if (core_features_resolve(out, &fs, &err) < 0) {
            fprintf(stderr, "write_adapter: %s: %s\n", out, err.msg);
            remove(out);
            return 1;
        }
        /* loaded as the kind the copy was written for (a Flexformer adapter
         * has no M) */
        core_features_adapter_info_t ai;
        core_gguf_t *ag = NULL;
        if (core_gguf_open(out, &ag, &err) < 0 || core_features_adapter_info(ag, &ai, &err) < 0) {
            fprintf(stderr, "write_adapter: %s: %s\n", out, err.msg);
            core_gguf_close(ag);
            remove(out);
            return 1;
        }
        core_gguf_close(ag);
        core_model_opts_t mo = {.attn_kind = ai.kind, .n_features = fs.n_features,
                                .window = fs.window, .seed = fs.seed, .adapter_path = out,
                                .max_ctx = 64, .sinks = fs.sinks, .prerope = fs.prerope,
                                .kv_bits = fs.kv_bits, .memory = fs.memory,
                                .memory_keep = fs.memory_keep, .memory_heads = fs.memory_heads};
        core_model_t *mdl = NULL;
        if (core_model_load(model, &mo, &mdl, &err) < 0) {
            fprintf(stderr, "write_adapter: the model does not load with %s: %s\n", out, err.msg);
            remove(out);
            return 1;
        }
        core_model_free(mdl);
        printf("wrote %s: %s with serve window %d, %d-bit rows, memory %d (%s, heads %s)\n", out,
               from, fs.window, fs.kv_bits, fs.memory, core_attn_keep_name(fs.memory_keep),
               fs.memory_heads);
        return 0;
    }
    core_attn_kind_t kind;
    if (!model || !kind_s || !out || m < 1 || w < 0 || core_attn_kind_parse(kind_s, &kind) < 0 ||
        (kind != CORE_ATTN_DARKFORMER && kind != CORE_ATTN_DARKFORMER_IS &&
         !core_attn_kind_is_trig(kind)) ||
        (kind == CORE_ATTN_DARKFORMER && !mat_p) || (kind == CORE_ATTN_DARKFORMER_IS && !lam_p) ||
        (core_attn_kind_is_trig(kind) && (!om_p || m % 2)) ||
        (kind == CORE_ATTN_FLEXFORMER_N && (!om2_p || !tau_p)) || (rad_p && !om_p) ||
        !lora_p != !rank) {
        usage();
        return 2;
    }

    int status = 1;
    core_error_t err = {0};
    core_model_t *mdl = NULL;
    float *mat = NULL, *lam = NULL, *dec = NULL, *mix = NULL, *lora[8] = {0};
    float *om = NULL, *om2 = NULL, *tau = NULL, *rad = NULL;
    if (core_model_load(model, NULL, &mdl, &err) < 0) {
        fprintf(stderr, "write_adapter: cannot load %s: %s\n", model, err.msg);
        return 1;
    }
    const core_model_info_t *in = core_model_info(mdl);
    /* the layers a linear kind runs: a sliding-window model's global ones */
    const int n_layer = core_attn_global_layers(core_attn_config(core_model_attn(mdl)));
    size_t n = (size_t)n_layer * (size_t)in->n_head_kv * (size_t)in->head_dim *
               (size_t)in->head_dim;
    if ((mat_p && !(mat = read_f32(mat_p, n))) || (lam_p && !(lam = read_f32(lam_p, n))) ||
        (dec_p && !(dec = read_f32(dec_p, (size_t)n_layer * (size_t)in->n_head_kv))) ||
        (mix_p && !(mix = read_f32(mix_p, (size_t)n_layer * (size_t)in->n_head))))
        goto done;
    size_t n_om = (size_t)n_layer * (size_t)in->n_head_kv * (size_t)(m / 2) *
                  (size_t)in->head_dim;
    if ((om_p && !(om = read_f32(om_p, n_om))) || (om2_p && !(om2 = read_f32(om2_p, n_om))) ||
        (tau_p && !(tau = read_f32(tau_p, (size_t)n_layer * (size_t)in->n_head_kv))) ||
        (rad_p && !(rad = read_f32(rad_p, (size_t)n_layer * (size_t)in->n_head_kv))))
        goto done;
    if (lora_p && n_layer != in->n_layer) {
        fprintf(stderr, "write_adapter: a LoRA covers every layer; %s has sliding-window "
                        "layers, whose adapter describes its %d global layers only\n",
                model, n_layer);
        goto done;
    }
    if (lora_p) {
        const size_t L = (size_t)n_layer, D = (size_t)in->n_embd,
                     qd = (size_t)in->n_head * (size_t)in->head_dim,
                     kvd = (size_t)in->n_head_kv * (size_t)in->head_dim;
        const size_t width[8] = {D, qd, D, kvd, D, kvd, qd, D}; /* in of A, out of B */
        static const char *const part[8] = {"q_a", "q_b", "k_a", "k_b", "v_a", "v_b", "o_a", "o_b"};
        for (int i = 0; i < 8; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s.%s.f32", lora_p, part[i]);
            if (!(lora[i] = read_f32(path, L * (size_t)rank * width[i])))
                goto done;
        }
    }
    core_features_adapter_desc_t d = {
        .kind = kind, .n_layer = n_layer, .n_head = in->n_head, .n_head_kv = in->n_head_kv,
        .head_dim = in->head_dim, .n_features = (int)m, .window = (int)w, .sinks = (int)sinks,
        .prerope = (int)prerope, .seed = (uint64_t)seed, .base_fingerprint = in->fingerprint,
        .mat = mat, .lambda = lam, .decay = dec, .mix = mix, .lora_rank = (int)rank,
        .n_embd = in->n_embd, .omega = om, .omega2 = om2, .tau = tau, .radius = rad,
        .serve_window = (int)serve_w, .kv_bits = (int)kv_bits};
    memcpy(d.lora, lora, sizeof lora);
    if (core_features_adapter_write(&d, out, &err) < 0) {
        fprintf(stderr, "write_adapter: cannot write %s: %s\n", out, err.msg);
        goto done;
    }
    if ((mat && check_load(model, out, CORE_ATTN_DARKFORMER, (int)m, (int)w, (uint64_t)seed,
                           (int)sinks, (int)prerope)) ||
        (lam && check_load(model, out, CORE_ATTN_DARKFORMER_IS, (int)m, (int)w, (uint64_t)seed,
                           (int)sinks, (int)prerope)) ||
        (om && check_load(model, out, kind == CORE_ATTN_FLEXFORMER_N ? kind
                                                                     : CORE_ATTN_FLEXFORMER_S,
                          (int)m, (int)w, (uint64_t)seed, (int)sinks, (int)prerope))) {
        remove(out);
        goto done;
    }
    printf("wrote %s: %s, M=%" PRId64 ", W=%" PRId64 ", seed %" PRId64 ", base %s%s%s%s\n", out,
           kind_s, m, w, seed, in->fingerprint, mat ? ", tensors M" : "",
           lam ? ", tensors lambda" : "", rank ? ", LoRA" : "");
    if (om)
        printf("  Flexformer frequencies%s%s\n", om2 ? ", omega2 and tau" : "",
               rad ? ", input sphere" : "");
    status = 0;
done:
    free(mat);
    free(lam);
    free(dec);
    free(mix);
    free(om);
    free(om2);
    free(tau);
    free(rad);
    for (int i = 0; i < 8; i++)
        free(lora[i]);
    core_model_free(mdl);
    return status;
}
