/* test_core_lora.c — core/lora.c: the low-rank update against a naive
 * double reference, and the loader's answers to adapters that carry a
 * broken LoRA (missing part, wrong shape, other rank, non-finite value).
 * That the model applies it where the oracle says is
 * tests/reference/test_lora_oracle.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/attn/features.h"
#include "core/gguf.h"
#include "core/lora.h"
#include "core/tensor.h"

enum { L = 2, D = 12, QD = 8, KVD = 4, R = 3 };

static const char *const part_name[8] = {"q_a", "q_b", "k_a", "k_b", "v_a", "v_b", "o_a", "o_b"};
/* [rows][cols] of each part (A: [r][in], B: [out][r]) */
static const int part_rows[8] = {R, QD, R, KVD, R, KVD, R, D};
static const int part_cols[8] = {D, R, D, R, D, R, QD, R};

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Writes an adapter with the LoRA parts (one buffer per part, [L][rows][cols]);
 * skip names one part left out of layer 1; bad_rank gives that part's
 * layer 1 one more rank row or column; nan puts a NaN in it. */
static int write_lora_adapter(const char *path, float *const parts[8], int skip, int bad_rank,
                              int nan)
{
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    int rc = core_gguf_writer_set_str(w, "general.architecture", "darkformer-adapter", 18);
    float big[(D + 1) * (QD + 1)];
    for (int l = 0; l < L && !rc; l++)
        for (int p = 0; p < 8 && !rc; p++) {
            char name[64];
            snprintf(name, sizeof name, "darkformer.blk.%d.lora_%s", l, part_name[p]);
            int rows = part_rows[p], cols = part_cols[p];
            const float *src = parts[p] + (size_t)l * rows * cols;
            if (l == 1 && p == skip)
                continue;
            if (l == 1 && p == bad_rank) {
                if (p % 2 == 0)
                    rows++;
                else
                    cols++;
                memset(big, 0, sizeof big);
                src = big;
            }
            if (l == 1 && p == nan) {
                memcpy(big, src, (size_t)rows * cols * sizeof(float));
                big[1] = NAN;
                src = big;
            }
            const int64_t ne[2] = {cols, rows};
            rc = core_gguf_writer_add_tensor(w, name, CORE_TTYPE_F32, 2, ne, src,
                                             (size_t)rows * cols * sizeof(float));
        }
    core_error_t err = {0};
    if (!rc)
        rc = core_gguf_writer_write(w, path, &err);
    core_gguf_writer_free(w);
    return rc;
}

static int load(const char *path, core_lora_t **lo, core_error_t *err)
{
    core_gguf_t *g = NULL;
    int rc = core_gguf_open(path, &g, err);
    if (rc == 0)
        rc = core_lora_load(g, L, D, QD, KVD, lo, err);
    core_gguf_close(g);
    return rc;
}

static float *parts[8];
static char path[64];

static void make_parts(void)
{
    unsigned s = 7;
    for (int p = 0; p < 8; p++) {
        size_t n = (size_t)L * part_rows[p] * part_cols[p];
        parts[p] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            parts[p][i] = frand(&s);
    }
    snprintf(path, sizeof path, "/tmp/test_lora_%d.gguf", (int)getpid());
}

TEST(test_add_matches_reference)
{
    CHECK(write_lora_adapter(path, parts, -1, -1, -1) == 0);
    core_lora_t *lo = NULL;
    core_error_t err = {0};
    CHECK(load(path, &lo, &err) == 0);
    CHECK(lo != NULL);
    if (!lo)
        return;
    CHECK_INT_EQ(core_lora_rank(lo), R);
    enum { N = 5 };
    const int in[4] = {D, D, D, QD}, out[4] = {QD, KVD, KVD, D};
    unsigned s = 99;
    for (int l = 0; l < L; l++)
        for (int wch = 0; wch < CORE_LORA_N; wch++) {
            const int ldx = in[wch] + 3, ldy = out[wch] + 2;
            float x[N * (QD + D + 3)], y[N * (QD + D + 2)], y0[N * (QD + D + 2)], scratch[N * R];
            for (int i = 0; i < N * ldx; i++)
                x[i] = frand(&s);
            for (int i = 0; i < N * ldy; i++)
                y[i] = y0[i] = frand(&s);
            core_lora_add(lo, l, wch, N, x, ldx, y, ldy, scratch);
            const float *a = parts[2 * wch] + (size_t)l * R * in[wch];
            const float *b = parts[2 * wch + 1] + (size_t)l * out[wch] * R;
            double worst = 0.0;
            for (int t = 0; t < N; t++)
                for (int o = 0; o < ldy; o++) {
                    double ref = y0[t * ldy + o];
                    if (o < out[wch])
                        for (int j = 0; j < R; j++) {
                            double ax = 0.0;
                            for (int i = 0; i < in[wch]; i++)
                                ax += (double)a[j * in[wch] + i] * x[t * ldx + i];
                            ref += (double)b[o * R + j] * ax;
                        }
                    double e = fabs(ref - y[t * ldy + o]);
                    worst = e > worst ? e : worst;
                }
            CHECK_MSG(worst < 1e-4, "layer %d proj %d: max error %g", l, wch, worst);
        }
    core_lora_free(lo);
    remove(path);
}

TEST(test_no_lora_is_null)
{
    core_gguf_writer_t *w = core_gguf_writer_new(0);
    CHECK(core_gguf_writer_set_str(w, "general.architecture", "darkformer-adapter", 18) == 0);
    core_error_t err = {0};
    CHECK(core_gguf_writer_write(w, path, &err) == 0);
    core_gguf_writer_free(w);
    core_lora_t *lo = (core_lora_t *)1;
    CHECK(load(path, &lo, &err) == 0);
    CHECK(lo == NULL);
    CHECK_INT_EQ(core_lora_rank(NULL), 0);
    remove(path);
}

TEST(test_broken_lora_refused)
{
    core_error_t err = {0};
    core_lora_t *lo = NULL;
    for (int p = 0; p < 8; p++) {
        CHECK(write_lora_adapter(path, parts, p, -1, -1) == 0);
        memset(&err, 0, sizeof err);
        CHECK_INT_EQ(load(path, &lo, &err), CORE_ENOTFOUND);
        CHECK(lo == NULL);
        char want[64];
        snprintf(want, sizeof want, "'darkformer.blk.1.lora_%s' is missing", part_name[p]);
        CHECK_MSG(strstr(err.msg, want) != NULL, "%s", err.msg);

        CHECK(write_lora_adapter(path, parts, -1, p, -1) == 0);
        memset(&err, 0, sizeof err);
        CHECK_INT_EQ(load(path, &lo, &err), CORE_EFORMAT);
        snprintf(want, sizeof want, "'darkformer.blk.1.lora_%s' has shape", part_name[p]);
        CHECK_MSG(strstr(err.msg, want) != NULL, "%s", err.msg);

        CHECK(write_lora_adapter(path, parts, -1, -1, p) == 0);
        memset(&err, 0, sizeof err);
        CHECK_INT_EQ(load(path, &lo, &err), CORE_EFORMAT);
        CHECK_MSG(strstr(err.msg, "not finite") != NULL, "%s", err.msg);
    }
    remove(path);
}

TEST(test_writer_round_trip)
{
    /* core_features_adapter_write lays the parts out the way the loader reads them */
    float mat[L * 2 * 4 * 4];
    memset(mat, 0, sizeof mat);
    core_features_adapter_desc_t d = {.kind = CORE_ATTN_DARKFORMER, .n_layer = L, .n_head = 2,
                                      .n_head_kv = 1, .head_dim = 4, .n_features = 4,
                                      .window = 8, .mat = mat, .lora_rank = R, .n_embd = D};
    /* this desc: qd = 2 * 4 = QD, kvd = 1 * 4 = KVD */
    memcpy(d.lora, parts, sizeof d.lora);
    core_error_t err = {0};
    CHECK(core_features_adapter_write(&d, path, &err) == 0);
    core_lora_t *lo = NULL;
    CHECK(load(path, &lo, &err) == 0);
    CHECK(lo && core_lora_rank(lo) == R);
    float x[QD], y[D] = {0}, y2[D] = {0}, scratch[R];
    for (int i = 0; i < QD; i++)
        x[i] = (float)i - 3.0f;
    if (lo)
        core_lora_add(lo, 1, CORE_LORA_O, 1, x, QD, y, D, scratch);
    for (int o = 0; o < D; o++) /* the same product straight from the parts */
        for (int j = 0; j < R; j++) {
            float ax = 0.0f;
            for (int i = 0; i < QD; i++)
                ax += parts[6][(size_t)R * QD + (size_t)j * QD + i] * x[i];
            y2[o] += parts[7][(size_t)D * R + (size_t)o * R + j] * ax;
        }
    for (int o = 0; o < D; o++)
        CHECK(fabsf(y[o] - y2[o]) < 1e-4f);
    d.lora[3] = NULL;
    CHECK_INT_EQ(core_features_adapter_write(&d, path, &err), CORE_EINVAL);
    core_lora_free(lo);
    remove(path);
}

int main(void)
{
    make_parts();
    RUN(test_add_matches_reference);
    RUN(test_no_lora_is_null);
    RUN(test_broken_lora_refused);
    RUN(test_writer_round_trip);
    for (int p = 0; p < 8; p++)
        free(parts[p]);
    printf("%d passed, %d failed\n", check_tests_passed, check_tests_failed);
    return check_tests_failed != 0;
}
