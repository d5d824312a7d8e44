/* tests/fuzz/fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Build and run (from the repository root):
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
 *     tests/fuzz/fuzz_gguf.c core/gguf.c core/tensor.c core/err.c -lm -o /tmp/fuzz_gguf
 *   /tmp/fuzz_gguf -max_total_time=120 -max_len=4096 /tmp/gguf-work tests/fuzz/corpus/gguf
 * (the first corpus directory collects new inputs; copy interesting ones into
 * tests/fuzz/corpus/gguf, which tests/unit/test_core_gguf.c replays).
 *
 * Any input must either open and then be walkable through every accessor, or
 * fail with a negative code and a message. The walk dequantizes the first row
 * of every tensor whose type is supported, touching the data the reader
 * vouched for.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/gguf.h"
#include "core/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t sink;

static void walk_arr(const core_gguf_arr_t *a)
{
    for (uint64_t i = 0; i < a->n; i++) {
        int64_t iv;
        double fv;
        core_gguf_str_t s;
        core_gguf_arr_t sub;
        if (core_gguf_arr_int(a, i, &iv) == 0) sink += (uint64_t)iv;
        if (core_gguf_arr_float(a, i, &fv) == 0) sink += fv != fv;
        if (core_gguf_arr_str(a, i, &s) == 0 && s.len) sink += (uint8_t)s.ptr[s.len - 1];
        if (core_gguf_arr_arr(a, i, &sub) == 0) walk_arr(&sub);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open_memory(data, size, &g, &err);
    if (rc != 0) {
        if (rc >= 0 || err.msg[0] == '\0' || g != NULL) abort();
        return 0;
    }
    for (int64_t i = 0; i < core_gguf_n_kv(g); i++) {
        const char *key = core_gguf_kv_key(g, i);
        int64_t iv;
        double fv;
        int bv;
        core_gguf_str_t s;
        core_gguf_arr_t a;
        if (core_gguf_find_key(g, key) != i) abort();
        if (core_gguf_kv_int(g, i, &iv, &err) == 0) sink += (uint64_t)iv;
        if (core_gguf_kv_float(g, i, &fv, &err) == 0) sink += fv != fv;
        if (core_gguf_get_bool(g, key, &bv, &err) == 0) sink += (uint64_t)bv;
        if (core_gguf_kv_str(g, i, &s, &err) == 0 && s.len) sink += (uint8_t)s.ptr[0];
        if (core_gguf_kv_arr(g, i, &a, &err) == 0) walk_arr(&a);
    }
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        if (core_gguf_find_tensor(g, t->name) != t) abort();
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
        /* Dequantize (a bounded prefix of) the first row. */
        int64_t n = t->ne[0];
        int64_t be = core_ttype_block_elems(t->type);
        if (n > 4096) n = 4096 - 4096 % (be ? be : 1);
        if (core_ttype_supported(t->type) && n > 0) {
            float *y = malloc((size_t)n * sizeof *y);
            if (y && core_dequantize(t->type, t->data, y, n, &err) != 0) abort();
            free(y);
        }
    }
    core_gguf_close(g);
    return 0;
}
