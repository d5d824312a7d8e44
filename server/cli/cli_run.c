/* server/cli/cli_run.c — the one-shot commands that run the model:
 * `generate`, `perplexity` and `tokenize`.
 *
 * They share one way of loading a model (flags --model --attn --features
 * --window --adapter --ctx --threads) and print results to stdout, progress
 * and speed to stderr. */
#include "server/cli/cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/text/chat.h"
#include "core/attn/attn_linear.h"
#include "core/attn/features.h"
#include "core/model.h"
#include "core/sample.h"
#include "core/state.h"
#include "core/text/tokenizer.h"
#include "server/attn_select.h"
#include "server/cli/cli_opts.h"
#include "server/config.h"

#define MAX_FILE_BYTES ((size_t)256 << 20)
#define MAX_PROMPT_TOKENS 1000000

typedef struct load_args {
    const char *model, *attn, *adapter, *decay, *linear, *precision, *memory_keep, *memory_heads;
    int64_t features, window, sinks, memory, kv_bits, prerope, ctx, threads;
} load_args_t;

#define LOAD_OPTS(la)                                                                        \
    {"model", SRV_OPT_STR, &(la).model, 0, 0,                                                \
     "GGUF model file (default " SRV_DEFAULT_MODEL ")"},                                     \
    {"attn", SRV_OPT_STR, &(la).attn, 0, 0,                                                  \
     "attention: auto | exact | performer | darkformer | darkformer-is | flexformer-s | "    \
     "flexformer-n (default auto: "                                                          \
     "darkformer with --adapter or the adapter found beside the model, else performer with " \
     "sinks + window only)"},                                                                \
    {"features", SRV_OPT_INT, &(la).features, 0, CORE_FEATURES_MAX_FEATURES,                 \
     "random features M of linear kinds (0 = the adapter's, else "                           \
     SRV_STR(CORE_FEATURES_DEFAULT_M) ")"},                                                  \
    {"window", SRV_OPT_INT, &(la).window, -1, CORE_FEATURES_MAX_WINDOW,                      \
     "exact window W of hybrid attention (-1 = the adapter's, else "                         \
     SRV_STR(CORE_FEATURES_DEFAULT_WINDOW) "; " SRV_STR(SRV_ATTN_FALLBACK_WINDOW)            \
     " for the auto fallback)"},                                                             \
    {"adapter", SRV_OPT_STR, &(la).adapter, 0, 0, "DARKFormer adapter GGUF"},                \
    {"sinks", SRV_OPT_INT, &(la).sinks, -1, CORE_FEATURES_MAX_SINKS,                         \
     "exact sink tokens S of linear kinds (-1 = the adapter's, else "                        \
     SRV_STR(CORE_FEATURES_DEFAULT_SINKS) ")"},                                              \
    {"memory", SRV_OPT_INT, &(la).memory, -1, CORE_ATTN_MAX_MEMORY,                          \
     "exact memory rows per KV head of linear kinds (0 = off, -1 = the adapter's, else "     \
     SRV_STR(CORE_FEATURES_DEFAULT_MEMORY) ")"},                                             \
    {"memory-keep", SRV_OPT_STR, &(la).memory_keep, 0, 0,                                    \
     "recall | recent: which rows the exact memory keeps (default the adapter's, else "      \
     "recall)"},                                                                             \
    {"memory-heads", SRV_OPT_STR, &(la).memory_heads, 0, 0,                                  \
     "all | L.H,...: which KV heads have the exact memory (default the adapter's, else all)"}, \
    {"kv-bits", SRV_OPT_INT, &(la).kv_bits, -1, 16,                                          \
     "bits of the exact rows of linear kinds, 8 or 16 (-1 = the adapter's, else "            \
     SRV_STR(CORE_FEATURES_DEFAULT_KV_BITS) ")"},                                            \
    {"prerope", SRV_OPT_INT, &(la).prerope, -1, 1,                                           \
     "1: linear features on q, k before RoPE (-1 = the adapter's, else 0)"},                 \
    {"decay", SRV_OPT_STR, &(la).decay, 0, 0, "on | off: the adapter's learned decay"},      \
    {"linear", SRV_OPT_STR, &(la).linear, 0, 0,                                              \
     "on | off: off drops the linear branch (sinks + window only; default on, off for the "  \
     "auto fallback)"},                                                                      \
    {"ctx", SRV_OPT_INT, &(la).ctx, 0, 1 << 24,                                              \
     "exact attention KV capacity in tokens (0 = the model's context length)"},              \
    {"threads", SRV_OPT_INT, &(la).threads, 0, 256, "compute threads (0 = one per CPU)"},    \
    {"prompt-precision", SRV_OPT_STR, &(la).precision, 0, 0,                                 \
     "auto | f32 | int8: prompt activations in the weight products (default auto: AMX-BF16 "   \
     "tiles where the CPU has them, else f32; serve --help)"}

/* "on" / "off" -> 1 / 0; -1 otherwise. */
static int srv_cli_onoff(const char *s, int *out)
{
    if (strcmp(s, "on") == 0)
        *out = 1;
    else if (strcmp(s, "off") == 0)
        *out = 0;
    else
        return -1;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int load_model(const char *cmd, const load_args_t *la, core_model_t **m,
                      core_tokenizer_t **tok)
{
    core_error_t err = {0};
    srv_attn_request_t rq = {.kind = SRV_ATTN_AUTO, .adapter = la->adapter,
                             .n_features = (int)la->features, .window = (int)la->window,
                             .sinks = (int)la->sinks, .memory = (int)la->memory,
                             .kv_bits = (int)la->kv_bits, .prerope = (int)la->prerope,
                             .memory_keep = la->memory_keep, .memory_heads = la->memory_heads,
                             .linear = -1, .max_ctx = la->ctx};
    if (la->attn && srv_attn_parse(la->attn, &rq.kind) < 0) {
        fprintf(stderr,
                "darkserve %s: --attn must be auto, exact, performer, darkformer, "
                "darkformer-is, flexformer-s or flexformer-n, got '%s'\n",
                cmd, la->attn);
        return 2;
    }
    int decay_on = 1;
    if ((la->decay && srv_cli_onoff(la->decay, &decay_on) < 0) ||
        (la->linear && srv_cli_onoff(la->linear, &rq.linear) < 0)) {
        fprintf(stderr, "darkserve %s: --decay and --linear take on or off\n", cmd);
        return 2;
    }
    rq.decay_off = !decay_on;
    const int precision =
        la->precision ? srv_cfg_precision_parse(la->precision) : SRV_PRECISION_AUTO;
    if (precision < 0) {
        fprintf(stderr, "darkserve %s: --prompt-precision takes auto, f32 or int8, got '%s'\n", cmd,
                la->precision);
        return 2;
    }
    const int prompt_int8 = precision == SRV_PRECISION_INT8;
    const int prompt_f32 = precision == SRV_PRECISION_F32;
    const char *path = la->model ? la->model : SRV_DEFAULT_MODEL;
    srv_attn_choice_t *ch = malloc(sizeof *ch);
    if (!ch) {
        fprintf(stderr, "darkserve %s: out of memory\n", cmd);
        return 1;
    }
    if (srv_attn_select(path, &rq, ch, &err) < 0) {
        fprintf(stderr, "darkserve %s: %s\n", cmd, err.msg);
        free(ch);
        return 1;
    }
    if (ch->fallback)
        fprintf(stderr, "darkserve: %s\n", ch->note);
    ch->mo.n_threads = (int)la->threads;
    ch->mo.prompt_int8 = prompt_int8;
    ch->mo.prompt_f32 = prompt_f32;
    int rc = core_model_load(path, &ch->mo, m, &err);
    if (rc < 0) {
        fprintf(stderr, "darkserve %s: cannot load %s: %s\n", cmd, path, err.msg);
        if (rc == CORE_EMISMATCH && ch->discovered)
            fprintf(stderr, "darkserve %s: (found beside the model by --attn auto; pass --adapter "
                            "PATH or --attn KIND)\n",
                    cmd);
        free(ch);
        return 1;
    }
    char desc[CORE_MODEL_PATH_MAX + 256];
    srv_attn_describe(core_attn_config(core_model_attn(*m)), ch->adapter, desc, sizeof desc);
    fprintf(stderr, "darkserve %s: attention %s\n", cmd, desc);
    int warn = 0;
    const char *rows = srv_prompt_rows_note(*m, prompt_int8, &warn);
    if (rows)
        fprintf(stderr, "darkserve %s: %s\n", cmd, rows);
    free(ch);
    if (core_tokenizer_from_gguf(core_model_gguf(*m), tok, &err) < 0) {
        fprintf(stderr, "darkserve %s: tokenizer of %s: %s\n", cmd, path, err.msg);
        core_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

/* Runs n tokens through state s in pieces of at most batch tokens; logits of
 * the last token into last_logits [V] (may be NULL). */
static int prefill(core_model_t *m, core_attn_state_t *s, const int32_t *ids, int64_t n,
                   int64_t batch, float *last_logits, core_error_t *err)
{
    for (int64_t i = 0; i < n; i += batch) {
        int64_t k = n - i < batch ? n - i : batch;
        core_batch_seq_t seq = {.state = s, .tokens = ids + i, .n_tokens = k,
                                .logits_mode = (i + k == n && last_logits) ? CORE_LOGITS_LAST
                                                                           : CORE_LOGITS_NONE,
                                .logits = last_logits};
        int rc = core_model_forward(m, &seq, 1, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 16;
            if (ncap > MAX_FILE_BYTES + 1)
                ncap = MAX_FILE_BYTES + 1;
            if (ncap == cap) { /* over the bound */
                free(buf);
                fclose(f);
                errno = EFBIG;
                return NULL;
            }
            char *p = realloc(buf, ncap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || n > MAX_FILE_BYTES) {
        free(buf);
        errno = bad ? EIO : EFBIG;
        return NULL;
    }
    *len = n;
    return buf;
}

/* The prompt's token ids (new *ids): the prompt as it is, or with --chat
 * rendered by the chat template (tmpl_name's, else the model's) as a user
 * message after an optional system one. 0, or 1 after printing why not. */
static int generate_prompt(core_model_t *m, core_tokenizer_t *tok, const char *prompt,
                           const char *system, int chat, const char *tmpl_name, int32_t **ids,
                           size_t *n_ids)
{
    core_error_t err = {0};
    char *text = NULL;
    size_t text_len = strlen(prompt);
    unsigned flags = CORE_TOK_ADD_SPECIAL;
    if (chat) {
        core_chat_tmpl_t tmpl;
        core_gguf_str_t tt = {NULL, 0};
        char *tmpl_text = NULL;
        if (core_gguf_get_str(core_model_gguf(m), "tokenizer.chat_template", &tt, NULL) == 0) {
            tmpl_text = strndup(tt.ptr, (size_t)tt.len);
            if (!tmpl_text) {
                fprintf(stderr, "darkserve generate: out of memory\n");
                return 1;
            }
        }
        int rc = core_chat_tmpl_init(tmpl_name, tmpl_text, &tmpl, &err);
        free(tmpl_text);
        if (rc < 0) {
            fprintf(stderr, "darkserve generate: chat template: %s\n", err.msg);
            return 1;
        }
        core_chat_msg_t msgs[2];
        size_t nm = 0;
        if (system)
            msgs[nm++] = (core_chat_msg_t){"system", system};
        msgs[nm++] = (core_chat_msg_t){"user", prompt};
        core_chat_opts_t co = {.add_generation_prompt = 1};
        if (core_chat_render(&tmpl, msgs, nm, &co, CORE_CHAT_MAX_OUTPUT, &text, &text_len, &err) < 0) {
            fprintf(stderr, "darkserve generate: %s\n", err.msg);
            free(text);
            return 1;
        }
        flags |= CORE_TOK_PARSE_SPECIAL;
    }
    int status = 1;
    if (core_tokenizer_encode_alloc(tok, text ? text : prompt, text_len, 0, MAX_PROMPT_TOKENS, flags,
                                    ids, n_ids, &err) < 0)
        fprintf(stderr, "darkserve generate: cannot tokenize the prompt: %s\n", err.msg);
    else if (*n_ids == 0)
        fprintf(stderr, "darkserve generate: the prompt has no tokens\n");
    else
        status = 0;
    free(text);
    return status;
}

/* Samples up to max_tokens tokens from logits[V] (the prompt's last row)
 * on, writing each piece to stdout as it comes; piece holds
 * core_tok_stream_max_out(tok) bytes. *n_gen and *finish ("length",
 * "stop") say how it ended. 0, or -1 with err set. */
static int generate_tokens(core_model_t *m, core_tokenizer_t *tok, core_attn_state_t *st,
                           core_sampler_t *smp, core_sample_ws_t *ws, float *logits, int64_t V,
                           char *piece, int64_t max_tokens, int64_t *n_gen_out,
                           const char **finish_out, core_error_t *err)
{
    core_tok_stream_t ts;
    core_tok_stream_init(&ts, tok, 0);
    int64_t n_gen = 0;
    const char *finish = "length";
    while (n_gen < max_tokens) {
        core_sample_result_t res;
        if (core_sampler_sample(smp, ws, logits, V, &res, err) < 0)
            return -1;
        n_gen++;
        if (core_tokenizer_is_eog(tok, res.token)) {
            finish = "stop";
            break;
        }
        size_t n_out = 0;
        if (core_tok_stream_push(&ts, res.token, piece, core_tok_stream_max_out(tok), &n_out, err) < 0)
            return -1;
        fwrite(piece, 1, n_out, stdout);
        fflush(stdout);
        if (n_gen == max_tokens)
            break;
        int32_t t = res.token;
        core_batch_seq_t seq = {.state = st, .tokens = &t, .n_tokens = 1,
                                .logits_mode = CORE_LOGITS_LAST, .logits = logits};
        if (core_model_forward(m, &seq, 1, err) < 0)
            return -1;
    }
    size_t n_out = 0;
    core_tok_stream_flush(&ts, piece, core_tok_stream_max_out(tok), &n_out, NULL);
    fwrite(piece, 1, n_out, stdout);
    printf("\n");
    fflush(stdout);
    *n_gen_out = n_gen;
    *finish_out = finish;
    return 0;
}

int srv_cli_generate(int argc, char **argv)
{
    load_args_t la = {.window = -1, .sinks = -1, .memory = -1, .kv_bits = -1, .prerope = -1};
    const char *prompt = NULL, *system = NULL, *tmpl_name = NULL;
    int chat = 0, no_stream_stats = 0;
    int64_t max_tokens = 128, top_k = 40, seed = -1, batch = 512;
    double temperature = 0.8, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0;
    const srv_opt_t opts[] = {
        LOAD_OPTS(la),
        {"prompt", SRV_OPT_STR, &prompt, 0, 0, "prompt text (required)"},
        {"chat", SRV_OPT_FLAG, &chat, 0, 0, "wrap the prompt as a user message in the chat template"},
        {"system", SRV_OPT_STR, &system, 0, 0, "system message (with --chat)"},
        {"chat-template", SRV_OPT_STR, &tmpl_name, 0, 0,
         "chatml | llama2 | llama3 | gemma (default: detected from the model)"},
        {"max-tokens", SRV_OPT_INT, &max_tokens, 1, 1000000, "tokens to generate at most"},
        {"temperature", SRV_OPT_FLOAT, &temperature, 0, 100, "sampling temperature (0 = greedy)"},
        {"top-k", SRV_OPT_INT, &top_k, 0, 1 << 22, "keep the k most likely tokens (0 = off)"},
        {"top-p", SRV_OPT_FLOAT, &top_p, 1e-9, 1, "nucleus probability mass (1 = off)"},
        {"min-p", SRV_OPT_FLOAT, &min_p, 0, 1, "drop tokens below min-p x the top probability"},
        {"repeat-penalty", SRV_OPT_FLOAT, &repeat_penalty, 1e-6, 100, "repetition penalty (1 = off)"},
        {"seed", SRV_OPT_INT, &seed, -1, (double)INT64_MAX, "sampling seed (-1 = from the clock)"},
        {"batch", SRV_OPT_INT, &batch, 1, CORE_MODEL_MAX_ROWS, "prompt tokens per forward"},
        {"quiet", SRV_OPT_FLAG, &no_stream_stats, 0, 0, "do not print speed to stderr"},
    };
    static const char usage[] = "--prompt TEXT [options]";
    const char *pos[1];
    int n_pos = 0;
    int rc = srv_opts_parse("generate", usage, opts, sizeof opts / sizeof opts[0], argc, argv, pos,
                            0, &n_pos);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (!prompt) {
        fprintf(stderr, "darkserve generate: --prompt is required (see --help)\n");
        return 2;
    }
    if (system && !chat) {
        fprintf(stderr, "darkserve generate: --system needs --chat\n");
        return 2;
    }

    core_error_t err = {0};
    core_model_t *m = NULL;
    core_tokenizer_t *tok = NULL;
    core_attn_state_t *st = NULL;
    core_sampler_t *smp = NULL;
    core_sample_ws_t *ws = NULL;
    char *piece = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int status = 1;

    core_chat_tmpl_t tmpl;
    /* Validate the override before the (slow) model load. */
    if (chat && tmpl_name && core_chat_tmpl_from_name(tmpl_name, &tmpl, &err) < 0) {
        fprintf(stderr, "darkserve generate: --chat-template: %s\n", err.msg);
        return 2;
    }
    rc = load_model("generate", &la, &m, &tok);
    if (rc != 0)
        return rc;

    size_t n_ids = 0;
    if (generate_prompt(m, tok, prompt, system, chat, tmpl_name, &ids, &n_ids) != 0)
        goto done;

    const core_model_info_t *info = core_model_info(m);
    int64_t V = info->n_vocab;
    logits = malloc((size_t)V * sizeof *logits);
    piece = malloc(core_tok_stream_max_out(tok) + 1);
    ws = core_sample_ws_new();
    if (!logits || !piece || !ws)
        goto oom;
    core_sample_params_t sp;
    core_sample_params_default(&sp);
    sp.temperature = (float)temperature;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)repeat_penalty;
    sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL);
    if (core_sampler_new(&sp, &smp, &err) < 0) {
        fprintf(stderr, "darkserve generate: %s\n", err.msg);
        status = 2;
        goto done;
    }
    if (core_attn_state_new(core_model_attn(m), &st, &err) < 0)
        goto fail;

    double t0 = now_s();
    if (prefill(m, st, ids, (int64_t)n_ids, batch, logits, &err) < 0)
        goto fail;
    double t1 = now_s();

    int64_t n_gen = 0;
    const char *finish = "length";
    if (generate_tokens(m, tok, st, smp, ws, logits, V, piece, max_tokens, &n_gen, &finish, &err) < 0)
        goto fail;
    double t2 = now_s();
    if (!no_stream_stats)
        fprintf(stderr,
                "prompt: %zu tokens in %.3f s (%.1f tokens/s); generated: %" PRId64
                " tokens in %.3f s (%.1f tokens/s); finish: %s; seed %" PRIu64 "\n",
                n_ids, t1 - t0, (double)n_ids / (t1 - t0), n_gen, t2 - t1,
                (double)n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9), finish, sp.seed);
    status = 0;
    goto done;
oom:
    fprintf(stderr, "darkserve generate: out of memory\n");
    goto done;
fail:
    fprintf(stderr, "darkserve generate: %s\n", err.msg);
done:
    core_sample_ws_free(ws);
    core_sampler_free(smp);
    core_attn_state_free(st);
    free(logits);
    free(piece);
    free(ids);
    core_tokenizer_free(tok);
    core_model_free(m);
    return status;
}

/* -log softmax(logits)[target], in double. */
static double nll(const float *logits, int64_t V, int32_t target)
{
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] > mx)
            mx = logits[i];
    /* sum >= 1: the largest logit contributes exp(0). */
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum > 1.0 ? sum : 1.0) + mx - (double)logits[target];
}

int srv_cli_perplexity(int argc, char **argv)
{
    load_args_t la = {.window = -1, .sinks = -1, .memory = -1, .kv_bits = -1, .prerope = -1};
    const char *file = NULL, *nll_out = NULL;
    int64_t chunk = 512, batch = 512, limit = 0;
    float *nlls = NULL; /* [n_ids] per predicted token, NaN where not scored */
    int buckets = 0;
    /* position buckets (of the scored token inside its chunk) for --buckets */
    static const int64_t bk_lo[] = {0, 1024, 4096, 8192, 16384, 32768, 65536};
    static const char *const bk_name[] = {"0-1K", "1-4K", "4-8K", "8-16K", "16-32K", "32-64K", "64K+"};
    enum { N_BK = sizeof bk_lo / sizeof bk_lo[0] };
    double bk_nll[N_BK] = {0};
    int64_t bk_n[N_BK] = {0};
    const srv_opt_t opts[] = {
        LOAD_OPTS(la),
        {"file", SRV_OPT_STR, &file, 0, 0, "text file to score (required)"},
        {"chunk", SRV_OPT_INT, &chunk, 0, 1 << 24,
         "tokens per independently scored chunk (0 = the whole text as one stream)"},
        {"batch", SRV_OPT_INT, &batch, 1, CORE_MODEL_MAX_ROWS, "tokens per forward"},
        {"limit", SRV_OPT_INT, &limit, 0, 1 << 30, "score at most this many tokens (0 = all)"},
        {"buckets", SRV_OPT_FLAG, &buckets, 0, 0,
         "also print perplexity per position in the chunk: 0-1K 1-4K 4-8K 8-16K 16-32K 32-64K 64K+"},
        {"nll-out", SRV_OPT_STR, &nll_out, 0, 0,
         "write every token's negative log-likelihood (float32 little-endian, one per token of "
         "the text, NaN where not scored) for tools/ppl_buckets.py"},
    };
    static const char usage[] =
        "--file TEXT [options]\n\n"
        "Splits the tokenized text into chunks of --chunk tokens, runs each from an empty state\n"
        "and scores every token of a chunk but its first. The last line is exactly\n"
        "'perplexity: <float> tokens: <int>' (tokens scored).";
    const char *pos[1];
    int n_pos = 0;
    int rc = srv_opts_parse("perplexity", usage, opts, sizeof opts / sizeof opts[0], argc, argv,
                            pos, 0, &n_pos);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (!file) {
        fprintf(stderr, "darkserve perplexity: --file is required (see --help)\n");
        return 2;
    }
    size_t len = 0;
    char *text = read_file(file, &len);
    if (!text) {
        fprintf(stderr, "darkserve perplexity: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    core_error_t err = {0};
    core_model_t *m = NULL;
    core_tokenizer_t *tok = NULL;
    core_attn_state_t *st = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int status = 1;
    rc = load_model("perplexity", &la, &m, &tok);
    if (rc != 0) {
        free(text);
        return rc;
    }
    size_t n_ids = 0;
    if (core_tokenizer_encode_alloc(tok, text, len, MAX_FILE_BYTES, MAX_FILE_BYTES,
                                    CORE_TOK_ADD_SPECIAL, &ids, &n_ids, &err) < 0)
        goto fail;
    if (limit > 0 && (size_t)limit + 1 < n_ids)
        n_ids = (size_t)limit + 1;
    if (chunk == 0)
        chunk = (int64_t)n_ids;
    if (n_ids < 2) {
        fprintf(stderr, "darkserve perplexity: %s has fewer than 2 tokens\n", file);
        goto done;
    }
    int64_t V = core_model_info(m)->n_vocab;
    logits = malloc((size_t)batch * (size_t)V * sizeof *logits);
    nlls = nll_out ? malloc(n_ids * sizeof *nlls) : NULL;
    for (size_t i = 0; nlls && i < n_ids; i++)
        nlls[i] = NAN;
    if (!logits || (nll_out && !nlls)) {
        fprintf(stderr, "darkserve perplexity: out of memory\n");
        goto done;
    }
    if (core_attn_state_new(core_model_attn(m), &st, &err) < 0)
        goto fail;
    double sum_nll = 0, t0 = now_s();
    int64_t n_scored = 0;
    for (int64_t c0 = 0; c0 + 1 < (int64_t)n_ids; c0 += chunk) {
        int64_t cn = (int64_t)n_ids - c0 < chunk ? (int64_t)n_ids - c0 : chunk;
        if (cn < 2)
            break;
        core_attn_state_reset(st);
        double chunk_nll = 0;
        for (int64_t i = 0; i < cn; i += batch) {
            int64_t k = cn - i < batch ? cn - i : batch;
            core_batch_seq_t seq = {.state = st, .tokens = ids + c0 + i, .n_tokens = k,
                                    .logits_mode = CORE_LOGITS_ALL, .logits = logits};
            if (core_model_forward(m, &seq, 1, &err) < 0)
                goto fail;
            /* logits row r predicts token c0 + i + r + 1 */
            for (int64_t r = 0; r < k && i + r + 1 < cn; r++) {
                double e = nll(logits + r * V, V, ids[c0 + i + r + 1]);
                chunk_nll += e;
                if (nlls)
                    nlls[c0 + i + r + 1] = (float)e;
                int b = N_BK - 1;
                while (b > 0 && i + r + 1 < bk_lo[b])
                    b--;
                bk_nll[b] += e;
                bk_n[b]++;
            }
        }
        sum_nll += chunk_nll;
        n_scored += cn - 1;
        /* the state at the chunk's end: what a session of that length holds */
        fprintf(stderr, "[%" PRId64 "/%zu] chunk ppl %.4f, running ppl %.4f, %.1f tokens/s, "
                "state %zu bytes (blob %zu) at position %" PRId64 "\n",
                c0 + cn, n_ids, exp(chunk_nll / (double)(cn - 1)), exp(sum_nll / (double)n_scored),
                (double)(c0 + cn) / (now_s() - t0), core_attn_state_bytes(st),
                core_state_size(st, NULL, 0, 0), core_attn_state_pos(st));
    }
    for (int b = 0; buckets && b < N_BK; b++)
        if (bk_n[b] > 0)
            printf("bucket %s: perplexity %.4f tokens %" PRId64 "\n", bk_name[b],
                   exp(bk_nll[b] / (double)bk_n[b]), bk_n[b]);
    if (nlls) {
        FILE *f = fopen(nll_out, "wb");
        if (!f || fwrite(nlls, sizeof *nlls, n_ids, f) != n_ids || fclose(f) != 0) {
            fprintf(stderr, "darkserve perplexity: cannot write %s: %s\n", nll_out,
                    strerror(errno));
            goto done;
        }
    }
    core_attn_den_stats_t ds;
    if (core_attn_kind_is_trig(core_attn_config(core_model_attn(m))->kind) &&
        core_attn_linear_den_stats(core_model_attn(m), &ds, 0) == 0 && ds.rows > 0)
        fprintf(stderr, "signed denominators: %" PRIu64 " rows with a linear part, D < 0: %.4f%%, "
                "E + D < E/2 (guarded): %.4f%%, E + D < E/10: %.4f%%, pure linear D <= 0: %"
                PRIu64 "\n", ds.rows, 100.0 * (double)ds.neg / (double)ds.rows,
                100.0 * (double)ds.below_half / (double)ds.rows,
                100.0 * (double)ds.below_tenth / (double)ds.rows, ds.pure_zero);
    printf("perplexity: %.4f tokens: %" PRId64 "\n", exp(sum_nll / (double)n_scored), n_scored);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "darkserve perplexity: %s\n", err.msg);
done:
    core_attn_state_free(st);
    free(logits);
    free(nlls);
    free(ids);
    free(text);
    core_tokenizer_free(tok);
    core_model_free(m);
    return status;
}

static void print_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\\' || c == '\'')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

int srv_cli_tokenize(int argc, char **argv)
{
    const char *model = NULL;
    int no_special = 0, no_bos = 0, ids_only = 0;
    const srv_opt_t opts[] = {
        {"model", SRV_OPT_STR, &model, 0, 0, "GGUF model file (default " SRV_DEFAULT_MODEL ")"},
        {"no-parse-special", SRV_OPT_FLAG, &no_special, 0, 0,
         "treat special-token texts like <|im_start|> as plain text"},
        {"no-bos", SRV_OPT_FLAG, &no_bos, 0, 0, "do not add BOS/EOS even if the model asks"},
        {"ids", SRV_OPT_FLAG, &ids_only, 0, 0, "print only the ids, one line"},
    };
    static const char usage[] = "[--model M] [options] TEXT";
    const char *pos[1];
    int n_pos = 0;
    int rc = srv_opts_parse("tokenize", usage, opts, sizeof opts / sizeof opts[0], argc, argv, pos,
                            1, &n_pos);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "darkserve tokenize: expected one TEXT argument (usage: darkserve tokenize %s)\n",
                usage);
        return 2;
    }
    core_error_t err = {0};
    core_gguf_t *g = NULL;
    core_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    const char *path = model ? model : SRV_DEFAULT_MODEL;
    int status = 1;
    if (core_gguf_open(path, &g, &err) < 0 || core_tokenizer_from_gguf(g, &tok, &err) < 0) {
        fprintf(stderr, "darkserve tokenize: %s: %s\n", path, err.msg);
        goto done;
    }
    unsigned flags = (no_special ? 0u : CORE_TOK_PARSE_SPECIAL) | (no_bos ? 0u : CORE_TOK_ADD_SPECIAL);
    if (core_tokenizer_encode_alloc(tok, pos[0], strlen(pos[0]), 0, MAX_PROMPT_TOKENS, flags, &ids,
                                    &n, &err) < 0) {
        fprintf(stderr, "darkserve tokenize: %s\n", err.msg);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        size_t plen = 0;
        const char *p = core_tokenizer_piece(tok, ids[i], &plen);
        printf("%6d -> '", ids[i]);
        print_escaped(p, plen);
        printf("'\n");
    }
    if (ids_only)
        printf("\n");
    status = 0;
done:
    free(ids);
    core_tokenizer_free(tok);
    core_gguf_close(g);
    return status;
}
