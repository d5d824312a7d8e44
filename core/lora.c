/* core/lora.c — the adapter's low-rank projection updates (core/lora.h). */
#include "core/lora.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels/blas.h"
#include "core/tensor.h"

static const char *const lora_names[CORE_LORA_N] = {"q", "k", "v", "o"};

struct core_lora {
    int rank, n_layer;
    int64_t in[CORE_LORA_N], out[CORE_LORA_N];
    float *a[CORE_LORA_N]; /* [L][r][in] */
    float *b[CORE_LORA_N]; /* [L][r][out]: the file's [out][r] transposed, so that
                              the second product runs along out (a rank-long dot
                              product per output cost more than the multiply) */
    uint64_t digest;       /* core_lora_digest, of the file's order */
};

void core_lora_free(core_lora_t *lo)
{
    if (!lo)
        return;
    for (int w = 0; w < CORE_LORA_N; w++) {
        free(lo->a[w]);
        free(lo->b[w]);
    }
    free(lo);
}

int core_lora_rank(const core_lora_t *lo)
{
    return lo ? lo->rank : 0;
}

uint64_t core_lora_digest(const core_lora_t *lo)
{
    return lo ? lo->digest : 0;
}

/* FNV-1a over the 32-bit words of every A and B as the file holds them
 * (B [out][r]: taken before the transposition). */
static uint64_t lora_digest(const core_lora_t *lo)
{
    uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)lo->rank;
    for (int w = 0; w < CORE_LORA_N; w++) {
        const float *part[2] = {lo->a[w], lo->b[w]};
        for (int j = 0; j < 2; j++) {
            const int64_t cnt = (int64_t)lo->n_layer * lo->rank * (j ? lo->out[w] : lo->in[w]);
            for (int64_t i = 0; i < cnt; i++) {
                uint32_t bits;
                memcpy(&bits, &part[j][i], sizeof bits);
                h = (h ^ bits) * 0x100000001b3u;
            }
        }
    }
    return h ? h : 1;
}

/* Every layer's B [out][r] into [r][out], in place through tmp [out * r]. */
static void transpose_b(float *b, int n_layer, int64_t out, int64_t r, float *tmp)
{
    for (int l = 0; l < n_layer; l++) {
        float *bl = b + (int64_t)l * out * r;
        memcpy(tmp, bl, (size_t)(out * r) * sizeof *tmp);
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < r; k++)
                bl[k * out + o] = tmp[o * r + k];
    }
}

/* Copies tensor name, expected [rows][cols] (GGUF ne0 = cols, ne1 = rows),
 * to *dst and advances *dst. */
static int read_part(const core_gguf_t *g, const char *name, int64_t cols, int64_t rows,
                     float **dst, core_error_t *err)
{
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, name);
    if (!t)
        return core_error_set(err, CORE_ENOTFOUND, "adapter tensor '%s' is missing (a LoRA "
                              "needs q, k, v and o of every layer)", name);
    if (t->type != CORE_TTYPE_F32)
        return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s' has type %s, expected F32",
                              name, core_ttype_name(t->type));
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows || !t->data ||
        t->nbytes != (size_t)(cols * rows) * sizeof(float))
        return core_error_set(err, CORE_EFORMAT,
                              "adapter tensor '%s' has shape [%" PRId64 ", %" PRId64
                              "], expected [%" PRId64 ", %" PRId64 "]",
                              name, t->ne[0], t->ne[1], cols, rows);
    memcpy(*dst, t->data, t->nbytes);
    for (int64_t i = 0; i < cols * rows; i++)
        if (!isfinite((*dst)[i]))
            return core_error_set(err, CORE_EFORMAT, "adapter tensor '%s': element %" PRId64
                                  " is not finite", name, i);
    *dst += cols * rows;
    return 0;
}

int core_lora_load(const core_gguf_t *g, int n_layer, int64_t d, int64_t qd, int64_t kvd,
                   core_lora_t **out, core_error_t *err)
{
    *out = NULL;
    /* the rank comes from the first tensor; the buffers are sized after it */
    const core_gguf_tensor_t *t0 = core_gguf_find_tensor(g, "darkformer.blk.0.lora_q_a");
    if (!t0)
        return 0; /* an adapter without LoRA; parts of one are caught below */
    core_lora_t *lo = calloc(1, sizeof *lo);
    if (!lo)
        return core_error_set(err, CORE_ENOMEM, "out of memory for the adapter's LoRA");
    const int64_t in[CORE_LORA_N] = {d, d, d, qd}, o[CORE_LORA_N] = {qd, kvd, kvd, d};
    int rc = 0;
    int rank = t0->n_dims == 2 && t0->ne[1] >= 1 && t0->ne[1] <= CORE_LORA_MAX_RANK ? (int)t0->ne[1]
                                                                                   : 0;
    if (!rank) {
        rc = core_error_set(err, CORE_EFORMAT, "adapter tensor 'darkformer.blk.0.lora_q_a': rank "
                            "(second dimension) not in [1, %d]", CORE_LORA_MAX_RANK);
        goto fail;
    }
    lo->rank = rank;
    lo->n_layer = n_layer;
    for (int w = 0; w < CORE_LORA_N && rc == 0; w++) {
        lo->in[w] = in[w];
        lo->out[w] = o[w];
        lo->a[w] = malloc((size_t)n_layer * (size_t)rank * (size_t)in[w] * sizeof(float));
        lo->b[w] = malloc((size_t)n_layer * (size_t)rank * (size_t)o[w] * sizeof(float));
        if (!lo->a[w] || !lo->b[w])
            rc = core_error_set(err, CORE_ENOMEM, "out of memory for the adapter's LoRA");
        float *pa = lo->a[w], *pb = lo->b[w];
        for (int l = 0; l < n_layer && rc == 0; l++) {
            char name[96];
            for (int part = 0; part < 2 && rc == 0; part++) {
                snprintf(name, sizeof name, "darkformer.blk.%d.lora_%s_%c", l, lora_names[w],
                         part ? 'b' : 'a');
                rc = part ? read_part(g, name, rank, o[w], &pb, err)
                          : read_part(g, name, in[w], rank, &pa, err);
            }
        }
    }
    if (rc == 0) {
        lo->digest = lora_digest(lo);
        int64_t most = 0;
        for (int w = 0; w < CORE_LORA_N; w++)
            most = o[w] > most ? o[w] : most;
        float *tmp = malloc((size_t)(most * rank) * sizeof *tmp);
        if (!tmp) {
            rc = core_error_set(err, CORE_ENOMEM, "out of memory for the adapter's LoRA");
            goto fail;
        }
        for (int w = 0; w < CORE_LORA_N; w++)
            transpose_b(lo->b[w], n_layer, o[w], rank, tmp);
        free(tmp);
        *out = lo;
        return 0;
    }
fail:
    core_lora_free(lo);
    return rc;
}

void core_lora_add(const core_lora_t *lo, int layer, int which, int64_t n, const float *x,
                   int64_t ldx, float *y, int64_t ldy, float *scratch)
{
    const int64_t r = lo->rank, in = lo->in[which], out = lo->out[which];
    const float *a = lo->a[which] + (int64_t)layer * r * in;
    const float *b = lo->b[which] + (int64_t)layer * out * r;
    core_gemm_nt(n, r, in, 1.0f, x, ldx, a, in, 0.0f, scratch, r);
    core_gemm_nn(n, out, r, 1.0f, scratch, r, b, out, 1.0f, y, ldy);
}
