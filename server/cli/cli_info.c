/* server/cli/cli_info.c — `darkserve info MODEL`: what a GGUF file holds, without
 * loading weights: architecture and sizes, tensor types, tokenizer. */
#include "server/cli/cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/gguf.h"
#include "core/tensor.h"
#include "server/cli/cli_opts.h"

static void print_str_key(const core_gguf_t *g, const char *label, const char *key)
{
    core_gguf_str_t s;
    if (core_gguf_get_str(g, key, &s, NULL) == 0)
        printf("%-22s %.*s\n", label, (int)(s.len > 200 ? 200 : s.len), s.ptr);
}

static void print_int_key(const core_gguf_t *g, const char *label, const char *key)
{
    int64_t v;
    if (core_gguf_get_int(g, key, &v, NULL) == 0)
        printf("%-22s %" PRId64 "\n", label, v);
}

static void print_float_key(const core_gguf_t *g, const char *label, const char *key)
{
    double v;
    if (core_gguf_get_float(g, key, &v, NULL) == 0)
        printf("%-22s %g\n", label, v);
}

int srv_cli_info(int argc, char **argv)
{
    static const char usage[] = "MODEL.gguf";
    const char *pos[1];
    int n_pos = 0;
    int rc = srv_opts_parse("info", usage, NULL, 0, argc, argv, pos, 1, &n_pos);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "darkserve info: expected one MODEL path (usage: darkserve info %s)\n", usage);
        return 2;
    }
    core_error_t err = {0};
    core_gguf_t *g = NULL;
    if (core_gguf_open(pos[0], &g, &err) < 0) {
        fprintf(stderr, "darkserve info: %s: %s\n", pos[0], err.msg);
        return 1;
    }
    core_gguf_str_t arch = {"?", 1};
    core_gguf_get_str(g, "general.architecture", &arch, NULL);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(arch.len > 40 ? 40 : arch.len), arch.ptr);
    char key[128];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, prefix), key)

    printf("%-22s %s\n", "file", pos[0]);
    printf("%-22s %u (alignment %u, %zu bytes)\n", "gguf version", core_gguf_version(g),
           core_gguf_alignment(g), core_gguf_file_size(g));
    printf("%-22s %s\n", "architecture", prefix);
    print_str_key(g, "name", "general.name");
    print_int_key(g, "layers", ARCH_KEY("block_count"));
    print_int_key(g, "embedding", ARCH_KEY("embedding_length"));
    print_int_key(g, "feed-forward", ARCH_KEY("feed_forward_length"));
    print_int_key(g, "heads", ARCH_KEY("attention.head_count"));
    print_int_key(g, "kv heads", ARCH_KEY("attention.head_count_kv"));
    print_int_key(g, "context length", ARCH_KEY("context_length"));
    print_float_key(g, "rope base", ARCH_KEY("rope.freq_base"));
    print_float_key(g, "rms eps", ARCH_KEY("attention.layer_norm_rms_epsilon"));
#undef ARCH_KEY

    int64_t n_t = core_gguf_n_tensors(g);
    int64_t per_type[CORE_TTYPE_COUNT_] = {0};
    uint64_t n_params = 0;
    for (int64_t i = 0; i < n_t; i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        uint64_t ne = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            ne *= (uint64_t)t->ne[d];
        n_params += ne;
        if (t->type >= 0 && t->type < CORE_TTYPE_COUNT_)
            per_type[t->type]++;
    }
    printf("%-22s %" PRId64 " (%.1fM parameters)\n", "tensors", n_t, (double)n_params / 1e6);
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++)
        if (per_type[t])
            printf("%-22s %s x %" PRId64 "\n", "", core_ttype_name(t), per_type[t]);

    print_str_key(g, "tokenizer", "tokenizer.ggml.model");
    print_str_key(g, "pre-tokenizer", "tokenizer.ggml.pre");
    core_gguf_arr_t toks;
    if (core_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) == 0)
        printf("%-22s %" PRIu64 "\n", "vocabulary", toks.n);
    print_int_key(g, "bos id", "tokenizer.ggml.bos_token_id");
    print_int_key(g, "eos id", "tokenizer.ggml.eos_token_id");
    core_gguf_str_t tmpl;
    printf("%-22s %s\n", "chat template",
           core_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL) == 0 ? "present" : "none");
    core_gguf_close(g);
    return 0;
}
