/* tools/record_qkv.c — records what attention sees in the exact model, for
 * the DARKFormer conversion (tools/convert.py) and the estimator error
 * measurements (tools/attn_error.py).
 *
 *   record_qkv --model M --text F --out DIR [--seqs N] [--len T] [--skip S]
 *              [--draws MMAX] [--seed SEED] [--ids-out IDS.npy]
 *
 * Tokenizes F as `darkserve perplexity` does (with the model's BOS/EOS
 * rule), cuts the ids into consecutive sequences of T tokens (after skipping
 * the first S sequences), and runs each from an empty exact state through the
 * model with a core_model_set_tap hook. Records the layers a linear kind
 * runs (core_attn_global_layers: every layer, or a sliding-window model's
 * global layers only) in the layout it sees them (a model that rotates RoPE
 * by halves has q and k permuted to pairs, core_attn_rope_pairs), and
 * numbers them as its adapter does (0 .. L-1 in order). Writes, per
 * recorded layer l (two digits):
 *   DIR/q_ll.npy  float32 [N][T][H][Hd]    queries after RoPE
 *   DIR/k_ll.npy  float32 [N][T][Hkv][Hd]  keys after RoPE
 *   DIR/v_ll.npy  float32 [N][T][Hkv][Hd]  values
 * and DIR/meta.json (shapes, model fingerprint, RoPE, the token span used,
 * "layers": the model's layer of each recorded one).
 * With --draws MMAX it also writes DIR/eps.npy, float64 [L][Hkv][MMAX][Hd]:
 * the standard feature draws ε of every (layer, KV head) from
 * core_features_draw under the model-level feature seed SEED (default 0,
 * what core_model_load uses), so Python trains against exactly the ω the
 * kernels use. ε for M < MMAX is the first M rows (blocks are drawn in
 * order from one stream).
 * With --ids-out it also writes every token id of F, int32 [n] (.npy), for
 * tools/distill.py; --seqs 0 then skips the recording (no q/k/v, no meta).
 *
 * Exit status 0 on success, 1 on a runtime failure, 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/attn/features.h"
#include "core/model.h"
#include "core/text/tokenizer.h"
#include "tools/tool_args.h"

#define MAX_TEXT_BYTES ((size_t)64 << 20)
#define MAX_LEN 4096
#define MAX_SEQS 100000

typedef struct rec {
    int n_layer;           /* L recorded */
    int *rec_of;           /* [model layers]: recorded index, or -1 */
    FILE **fq, **fk, **fv; /* [L] open .npy files, header written */
    int64_t rows_q, rows_kv; /* floats per token row: H*Hd, Hkv*Hd */
    int halves, n_head, n_head_kv, head_dim, n_rot; /* permute q, k to pairs (rope_halves) */
    float *pq, *pk;        /* [T][H*Hd], [T][Hkv*Hd] the permuted rows */
    int failed;
} rec_t;

static void usage(void)
{
    fprintf(stderr, "usage: record_qkv --model M --text F --out DIR [--seqs N] [--len T] "
                    "[--skip S] [--draws MMAX] [--seed SEED] [--ids-out IDS.npy]\n");
}

/* Writes a NumPy v1.0 header for a C-ordered array of dtype descr. */
static int npy_header(FILE *f, const char *descr, const int64_t *shape, int nd)
{
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     descr);
    for (int i = 0; i < nd; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRId64 "%s", shape[i],
                      nd == 1 ? "," : (i + 1 < nd ? ", " : ""));
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic(6) + version(2) + len(2) + dict + pad + '\n' is a multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    if (fwrite(pre, 1, sizeof pre, f) != sizeof pre || fwrite(dict, 1, (size_t)n, f) != (size_t)n)
        return -1;
    for (size_t i = 0; i < pad; i++)
        if (fputc(' ', f) == EOF)
            return -1;
    return fputc('\n', f) == EOF ? -1 : 0;
}

static FILE *open_npy(const char *dir, const char *what, int layer, const int64_t *shape, int nd)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%02d.npy", dir, what, layer);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "record_qkv: cannot create %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (npy_header(f, "<f4", shape, nd) < 0) {
        fprintf(stderr, "record_qkv: cannot write %s\n", path);
        fclose(f);
        return NULL;
    }
    return f;
}

static void tap(void *ud, int layer, int seq, int64_t pos0, int64_t n, const float *q,
                const float *k, const float *v)
{
    rec_t *r = ud;
    (void)seq;
    (void)pos0;
    if (r->failed || layer < 0 || (layer = r->rec_of[layer]) < 0)
        return;
    size_t nq = (size_t)(n * r->rows_q), nkv = (size_t)(n * r->rows_kv);
    if (r->halves) {
        core_attn_rope_pairs(q, r->pq, n, r->n_head, r->head_dim, r->n_rot);
        core_attn_rope_pairs(k, r->pk, n, r->n_head_kv, r->head_dim, r->n_rot);
        q = r->pq;
        k = r->pk;
    }
    if (fwrite(q, sizeof *q, nq, r->fq[layer]) != nq ||
        fwrite(k, sizeof *k, nkv, r->fk[layer]) != nkv ||
        fwrite(v, sizeof *v, nkv, r->fv[layer]) != nkv)
        r->failed = 1;
}

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(MAX_TEXT_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_TEXT_BYTES + 1, f) : 0;
    int bad = !buf || ferror(f) || n > MAX_TEXT_BYTES;
    fclose(f);
    if (bad) {
        free(buf);
        errno = buf ? EFBIG : ENOMEM;
        return NULL;
    }
    *len = n;
    return buf;
}

static int write_draws(const char *dir, const core_model_info_t *in, int n_layer, int mmax,
                       uint64_t seed)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/eps.npy", dir);
    size_t per = (size_t)mmax * (size_t)in->head_dim;
    double *eps = malloc(per * sizeof *eps); /* [MMAX][Hd] */
    FILE *f = fopen(path, "wb");
    int rc = 1;
    if (!eps || !f) {
        fprintf(stderr, "record_qkv: cannot write %s: %s\n", path, strerror(errno));
        goto done;
    }
    const int64_t shape[4] = {n_layer, in->n_head_kv, mmax, in->head_dim};
    if (npy_header(f, "<f8", shape, 4) < 0)
        goto done;
    for (int l = 0; l < n_layer; l++)
        for (int h = 0; h < in->n_head_kv; h++) {
            core_error_t err = {0};
            if (core_features_draw(core_features_stream_seed(seed, l, h), in->head_dim, mmax, eps,
                                   &err) < 0) {
                fprintf(stderr, "record_qkv: draws: %s\n", err.msg);
                goto done;
            }
            if (fwrite(eps, sizeof *eps, per, f) != per)
                goto done;
        }
    rc = 0;
done:
    if (f && fclose(f) != 0)
        rc = 1;
    free(eps);
    return rc;
}

/* Writes ids [n] as an int32 .npy file. */
static int write_ids(const char *path, const int32_t *ids, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "record_qkv: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    const int64_t shape[1] = {(int64_t)n};
    int bad = npy_header(f, "<i4", shape, 1) != 0 || fwrite(ids, sizeof *ids, n, f) != n;
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "record_qkv: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text_path = NULL, *out = NULL, *ids_out = NULL;
    int64_t n_seq = 16, len = 512, skip = 0, draws = 0, seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!bad && !strcmp(a, "--model"))
            model = v;
        else if (!bad && !strcmp(a, "--text"))
            text_path = v;
        else if (!bad && !strcmp(a, "--out"))
            out = v;
        else if (!bad && !strcmp(a, "--ids-out"))
            ids_out = v;
        else if (!bad && !strcmp(a, "--seqs"))
            bad = parse_i64(v, 0, MAX_SEQS, &n_seq);
        else if (!bad && !strcmp(a, "--len"))
            bad = parse_i64(v, 2, MAX_LEN, &len);
        else if (!bad && !strcmp(a, "--skip"))
            bad = parse_i64(v, 0, MAX_SEQS, &skip);
        else if (!bad && !strcmp(a, "--draws"))
            bad = parse_i64(v, 0, CORE_FEATURES_MAX_FEATURES, &draws);
        else if (!bad && !strcmp(a, "--seed"))
            bad = parse_i64(v, 0, INT64_MAX, &seed);
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "record_qkv: bad option or value near '%s'\n", a);
            usage();
            return 2;
        }
        i++;
    }
    if (!model || !text_path || !out) {
        usage();
        return 2;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "record_qkv: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }

    int status = 1;
    core_error_t err = {0};
    core_model_t *m = NULL;
    core_tokenizer_t *tok = NULL;
    core_attn_state_t *st = NULL;
    int32_t *ids = NULL;
    size_t text_len = 0, n_ids = 0;
    rec_t r = {0};
    char *text = read_text(text_path, &text_len);
    if (!text) {
        fprintf(stderr, "record_qkv: cannot read %s: %s\n", text_path, strerror(errno));
        return 1;
    }
    core_model_opts_t mo = {.attn_kind = CORE_ATTN_EXACT, .max_ctx = len};
    if (core_model_load(model, &mo, &m, &err) < 0 ||
        core_tokenizer_from_gguf(core_model_gguf(m), &tok, &err) < 0 ||
        core_tokenizer_encode_alloc(tok, text, text_len, MAX_TEXT_BYTES, MAX_TEXT_BYTES,
                                    CORE_TOK_ADD_SPECIAL, &ids, &n_ids, &err) < 0 ||
        core_attn_state_new(core_model_attn(m), &st, &err) < 0) {
        fprintf(stderr, "record_qkv: %s\n", err.msg);
        goto done;
    }
    const core_model_info_t *in = core_model_info(m);
    const core_attn_cfg_t *ac = core_attn_config(core_model_attn(m));
    const int n_rec = core_attn_global_layers(ac);
    if ((uint64_t)(skip + n_seq) * (uint64_t)len > n_ids) {
        fprintf(stderr, "record_qkv: %s has %zu tokens, fewer than (%" PRId64 " + %" PRId64
                        ") x %" PRId64 "\n", text_path, n_ids, skip, n_seq, len);
        goto done;
    }
    if (ids_out && write_ids(ids_out, ids, n_ids) != 0)
        goto done;
    if (n_seq == 0 && draws == 0) {
        status = 0;
        goto done;
    }
    if (n_seq == 0) {
        status = write_draws(out, in, n_rec, (int)draws, (uint64_t)seed) != 0;
        goto done;
    }
    r.n_layer = n_rec;
    r.rows_q = (int64_t)in->n_head * in->head_dim;
    r.rows_kv = (int64_t)in->n_head_kv * in->head_dim;
    r.halves = ac->rope_halves;
    r.n_head = in->n_head;
    r.n_head_kv = in->n_head_kv;
    r.head_dim = in->head_dim;
    r.n_rot = ac->n_rot;
    r.rec_of = calloc((size_t)in->n_layer, sizeof *r.rec_of);
    r.fq = calloc((size_t)n_rec, sizeof *r.fq);
    r.fk = calloc((size_t)n_rec, sizeof *r.fk);
    r.fv = calloc((size_t)n_rec, sizeof *r.fv);
    r.pq = r.halves ? malloc((size_t)(len * r.rows_q) * sizeof *r.pq) : NULL;
    r.pk = r.halves ? malloc((size_t)(len * r.rows_kv) * sizeof *r.pk) : NULL;
    if (!r.rec_of || !r.fq || !r.fk || !r.fv || (r.halves && (!r.pq || !r.pk))) {
        fprintf(stderr, "record_qkv: out of memory\n");
        goto done;
    }
    for (int l = 0, i = 0; l < in->n_layer; l++)
        r.rec_of[l] = core_attn_layer_window(ac, l) == 0 ? i++ : -1;
    for (int l = 0; l < n_rec; l++) {
        const int64_t sq[4] = {n_seq, len, in->n_head, in->head_dim};
        const int64_t skv[4] = {n_seq, len, in->n_head_kv, in->head_dim};
        if (!(r.fq[l] = open_npy(out, "q", l, sq, 4)) || !(r.fk[l] = open_npy(out, "k", l, skv, 4)) ||
            !(r.fv[l] = open_npy(out, "v", l, skv, 4)))
            goto done;
    }
    core_model_set_tap(m, tap, &r);
    for (int64_t s = 0; s < n_seq; s++) {
        core_attn_state_reset(st);
        core_batch_seq_t bs = {.state = st, .tokens = ids + (skip + s) * len, .n_tokens = len,
                               .logits_mode = CORE_LOGITS_NONE};
        if (core_model_forward(m, &bs, 1, &err) < 0) {
            fprintf(stderr, "record_qkv: sequence %" PRId64 ": %s\n", s, err.msg);
            goto done;
        }
        if (r.failed) {
            fprintf(stderr, "record_qkv: writing under %s failed\n", out);
            goto done;
        }
        fprintf(stderr, "\rrecord_qkv: %" PRId64 "/%" PRId64 " sequences", s + 1, n_seq);
    }
    fprintf(stderr, "\n");
    core_model_set_tap(m, NULL, NULL);
    if (draws > 0 && write_draws(out, in, n_rec, (int)draws, (uint64_t)seed) != 0)
        goto done;

    char path[4096];
    snprintf(path, sizeof path, "%s/meta.json", out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "record_qkv: cannot create %s: %s\n", path, strerror(errno));
        goto done;
    }
    fprintf(f,
            "{\"model\": \"%s\", \"fingerprint\": \"%s\", \"text\": \"%s\", \"text_tokens\": %zu,\n"
            " \"n_seq\": %" PRId64 ", \"len\": %" PRId64 ", \"skip\": %" PRId64 ",\n"
            " \"n_layer\": %d, \"n_head\": %d, \"n_head_kv\": %d, \"head_dim\": %d,\n"
            " \"rope_base\": %.17g, \"draws\": %" PRId64 ", \"seed\": %" PRId64 ",\n"
            " \"layers\": [",
            model, in->fingerprint, text_path, n_ids, n_seq, len, skip, n_rec, in->n_head,
            in->n_head_kv, in->head_dim, in->rope_base, draws, seed);
    for (int l = 0, i = 0; l < in->n_layer; l++)
        if (r.rec_of[l] >= 0)
            fprintf(f, "%s%d", i++ ? ", " : "", l);
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "record_qkv: writing %s failed\n", path);
        goto done;
    }
    status = 0;
done:
    if (m)
        core_model_set_tap(m, NULL, NULL);
    for (int l = 0; l < r.n_layer; l++) {
        FILE *fs[3] = {r.fq ? r.fq[l] : NULL, r.fk ? r.fk[l] : NULL, r.fv ? r.fv[l] : NULL};
        for (int j = 0; j < 3; j++)
            if (fs[j] && fclose(fs[j]) != 0)
                status = 1;
    }
    free(r.fq);
    free(r.fk);
    free(r.fv);
    free(r.rec_of);
    free(r.pq);
    free(r.pk);
    core_attn_state_free(st);
    free(ids);
    free(text);
    core_tokenizer_free(tok);
    core_model_free(m);
    return status;
}
