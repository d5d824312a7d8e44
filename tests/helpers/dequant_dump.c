/* tests/helpers/dequant_dump.c — drives core/gguf.c and core/tensor.c for the
 * Python reference tests (tests/reference/test_dequant.py).
 *
 *   dequant_dump list MODEL                     name<TAB>type<TAB>n_values per tensor
 *   dequant_dump tensor MODEL NAME OUT          one tensor as raw float32
 *   dequant_dump all MODEL OUT                  every tensor, file order, float32
 *   dequant_dump blocks TYPE NBLOCKS IN OUT     raw blocks of TYPE (name or id)
 *   dequant_dump f2h IN OUT | f2bf IN OUT       float32 -> fp16 / bf16 bits
 *   dequant_dump dot TYPE NBLOCKS IN X          core_dot_ref(blocks, X), %.17g
 *   dequant_dump dump GGUF                      metadata and tensor infos as text
 *   dequant_dump write-sample OUT               a GGUF from our writer
 *
 * OUT may be "-" for stdout. Exit status 0 on success, 1 on any error (the
 * message goes to stderr).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gguf.h"
#include "core/tensor.h"

static int fail(const char *what, const core_error_t *err)
{
    fprintf(stderr, "dequant_dump: %s: %s\n", what, err ? err->msg : "");
    return 1;
}

static FILE *open_out(const char *path)
{
    return strcmp(path, "-") == 0 ? stdout : fopen(path, "wb");
}

static int close_out(FILE *f)
{
    if (f == stdout) return fflush(f) != 0;
    return fclose(f) != 0;
}

/* Reads a whole file; *n gets its size. NULL on error. */
static void *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    void *p = malloc(sz ? (size_t)sz : 1);
    if (!p) goto fail;
    if (fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        goto fail;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
fail:
    fclose(f);
    return NULL;
}

static int parse_type(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end) return (int)v;
    for (int t = 0; t < CORE_TTYPE_COUNT_; t++)
        if (strcmp(core_ttype_name(t), s) == 0) return t;
    return -1;
}

static int64_t n_values(const core_gguf_tensor_t *t)
{
    int64_t n = 1;
    for (int d = 0; d < CORE_GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

static int dequant_tensor(const core_gguf_tensor_t *t, FILE *out)
{
    core_error_t err = {0};
    int64_t n = n_values(t);
    /* Row by row keeps the buffer small: [ne0] */
    float *row = malloc((size_t)t->ne[0] * sizeof *row);
    size_t rb;
    if (!row || core_ttype_row_bytes(t->type, t->ne[0], &rb) != 0) {
        free(row);
        fprintf(stderr, "dequant_dump: %s: bad row\n", t->name);
        return 1;
    }
    const uint8_t *p = t->data;
    for (int64_t r = 0; r < n / t->ne[0]; r++) {
        if (core_dequantize(t->type, p + (size_t)r * rb, row, t->ne[0], &err) != 0) {
            free(row);
            return fail(t->name, &err);
        }
        if (fwrite(row, sizeof *row, (size_t)t->ne[0], out) != (size_t)t->ne[0]) {
            free(row);
            return fail("write", NULL);
        }
    }
    free(row);
    return 0;
}

static int cmd_model(int argc, char **argv)
{
    core_error_t err = {0};
    core_gguf_t *g = NULL;
    if (core_gguf_open(argv[2], &g, &err) != 0) return fail("open", &err);
    int rc = 0;
    if (strcmp(argv[1], "list") == 0) {
        for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
            const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
            printf("%s\t%s\t%" PRId64 "\n", t->name, core_ttype_name(t->type), n_values(t));
        }
    } else if (strcmp(argv[1], "tensor") == 0 && argc == 5) {
        const core_gguf_tensor_t *t = core_gguf_find_tensor(g, argv[3]);
        FILE *out = t ? open_out(argv[4]) : NULL;
        if (!t || !out) {
            fprintf(stderr, "dequant_dump: no tensor '%s' or cannot open output\n", argv[3]);
            rc = 1;
        } else {
            rc = dequant_tensor(t, out);
            rc |= close_out(out);
        }
    } else if (strcmp(argv[1], "all") == 0 && argc == 4) {
        FILE *out = open_out(argv[3]);
        if (!out) rc = fail("open output", NULL);
        for (int64_t i = 0; out && !rc && i < core_gguf_n_tensors(g); i++)
            rc = dequant_tensor(core_gguf_tensor(g, i), out);
        if (out) rc |= close_out(out);
    } else {
        rc = fail("bad arguments", NULL);
    }
    core_gguf_close(g);
    return rc;
}

static int cmd_blocks(int argc, char **argv)
{
    if (argc != 6) return fail("usage: blocks TYPE NBLOCKS IN OUT", NULL);
    int type = parse_type(argv[2]);
    int64_t nb = strtoll(argv[3], NULL, 10);
    int64_t be = core_ttype_block_elems(type);
    size_t bb = core_ttype_block_bytes(type);
    size_t n_in = 0;
    uint8_t *in = slurp(argv[4], &n_in);
    if (!in || be == 0 || nb < 0 || n_in != (size_t)nb * bb) {
        free(in);
        return fail("bad type, block count or input size", NULL);
    }
    int64_t n = nb * be;
    float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
    core_error_t err = {0};
    int rc = 0;
    if (!y) rc = fail("out of memory", NULL);
    else if (core_dequantize(type, in, y, n, &err) != 0) rc = fail("dequantize", &err);
    else {
        FILE *out = open_out(argv[5]);
        if (!out || fwrite(y, sizeof *y, (size_t)n, out) != (size_t)n) rc = fail("write", NULL);
        if (out) rc |= close_out(out);
    }
    free(y);
    free(in);
    return rc;
}

static int cmd_convert(int argc, char **argv)
{
    if (argc != 4) return fail("usage: f2h|f2bf IN OUT", NULL);
    size_t n_in = 0;
    uint8_t *in = slurp(argv[2], &n_in);
    if (!in || n_in % 4) {
        free(in);
        return fail("bad input", NULL);
    }
    size_t n = n_in / 4;
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    int bf = strcmp(argv[1], "f2bf") == 0;
    int rc = 0;
    if (!h) rc = fail("out of memory", NULL);
    for (size_t i = 0; h && i < n; i++) {
        float f;
        memcpy(&f, in + 4 * i, 4);
        h[i] = bf ? core_fp32_to_bf16(f) : core_fp32_to_fp16(f);
    }
    if (h) {
        FILE *out = open_out(argv[3]);
        if (!out || fwrite(h, sizeof *h, n, out) != n) rc = fail("write", NULL);
        if (out) rc |= close_out(out);
    }
    free(h);
    free(in);
    return rc;
}

static int cmd_dot(int argc, char **argv)
{
    if (argc != 6) return fail("usage: dot TYPE NBLOCKS IN X", NULL);
    int type = parse_type(argv[2]);
    int64_t nb = strtoll(argv[3], NULL, 10);
    size_t n_in = 0, n_x = 0;
    uint8_t *in = slurp(argv[4], &n_in);
    float *x = slurp(argv[5], &n_x);
    int64_t n = nb * core_ttype_block_elems(type);
    int rc = 0;
    if (!in || !x || n_in != (size_t)nb * core_ttype_block_bytes(type) || n_x != (size_t)n * 4)
        rc = fail("bad input", NULL);
    else
        printf("%.17g\n", core_dot_ref(type, in, x, n));
    free(in);
    free(x);
    return rc;
}

static void print_str(core_gguf_str_t s)
{
    /* Escape so that the Python side can parse one value per line. */
    putchar('"');
    for (uint64_t i = 0; i < s.len; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f) printf("\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void print_arr(const core_gguf_arr_t *a)
{
    printf("[");
    for (uint64_t i = 0; i < a->n; i++) {
        if (i) printf(",");
        int64_t iv;
        double fv;
        core_gguf_str_t s;
        core_gguf_arr_t sub;
        if (a->type == CORE_GGUF_TYPE_STRING && core_gguf_arr_str(a, i, &s) == 0) print_str(s);
        else if (a->type == CORE_GGUF_TYPE_ARRAY && core_gguf_arr_arr(a, i, &sub) == 0) print_arr(&sub);
        else if (a->type == CORE_GGUF_TYPE_FLOAT32 || a->type == CORE_GGUF_TYPE_FLOAT64) {
            core_gguf_arr_float(a, i, &fv);
            printf("%.17g", fv);
        } else if (a->type == CORE_GGUF_TYPE_UINT64) {
            /* may exceed int64: print through double only if it must */
            if (core_gguf_arr_int(a, i, &iv) == 0) printf("%" PRId64, iv);
            else {
                core_gguf_arr_float(a, i, &fv);
                printf("%.17g", fv);
            }
        } else if (core_gguf_arr_int(a, i, &iv) == 0) printf("%" PRId64, iv);
        else printf("?");
    }
    printf("]");
}

/* One line per key: KEY<TAB>TYPE<TAB>VALUE; then per tensor:
 * TENSOR<TAB>name<TAB>type<TAB>ne0,ne1..<TAB>offset<TAB>fnv1a64(data). */
static int cmd_dump(int argc, char **argv)
{
    if (argc != 3) return fail("usage: dump GGUF", NULL);
    core_error_t err = {0};
    core_gguf_t *g = NULL;
    if (core_gguf_open(argv[2], &g, &err) != 0) return fail("open", &err);
    static const char *const tn[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                     "bool", "string", "array", "uint64", "int64", "float64"};
    printf("VERSION\t%" PRIu32 "\nALIGNMENT\t%" PRIu32 "\n", core_gguf_version(g), core_gguf_alignment(g));
    for (int64_t i = 0; i < core_gguf_n_kv(g); i++) {
        core_gguf_type_t t = core_gguf_kv_type(g, i);
        printf("KV\t%s\t%s\t", core_gguf_kv_key(g, i), tn[t]);
        int64_t iv;
        double fv;
        core_gguf_str_t s;
        core_gguf_arr_t a;
        if (t == CORE_GGUF_TYPE_STRING && core_gguf_kv_str(g, i, &s, &err) == 0) print_str(s);
        else if (t == CORE_GGUF_TYPE_ARRAY && core_gguf_kv_arr(g, i, &a, &err) == 0) print_arr(&a);
        else if ((t == CORE_GGUF_TYPE_FLOAT32 || t == CORE_GGUF_TYPE_FLOAT64) &&
                 core_gguf_kv_float(g, i, &fv, &err) == 0)
            printf("%.17g", fv);
        else if (core_gguf_kv_int(g, i, &iv, &err) == 0) printf("%" PRId64, iv);
        else if (core_gguf_kv_float(g, i, &fv, &err) == 0) printf("%.17g", fv);
        printf("\n");
    }
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        uint64_t h = 1469598103934665603ull;
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) h = (h ^ p[k]) * 1099511628211ull;
        printf("TENSOR\t%s\t%s\t", t->name, core_ttype_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%" PRId64, d ? "," : "", t->ne[d]);
        printf("\t%" PRIu64 "\t%016" PRIx64 "\n", t->offset, h);
    }
    core_gguf_close(g);
    return 0;
}

/* A file exercising every scalar type, strings and arrays, and tensors of
 * several types. The Python test regenerates the same values to compare. */
static int cmd_write_sample(int argc, char **argv)
{
    if (argc != 3) return fail("usage: write-sample OUT", NULL);
    core_gguf_writer_t *w = core_gguf_writer_new(64);
    if (!w) return fail("writer_new", NULL);
    int rc = 0;
    rc |= core_gguf_writer_set_str(w, "general.architecture", "llama", 5);
    rc |= core_gguf_writer_set_int(w, "t.u8", CORE_GGUF_TYPE_UINT8, 200);
    rc |= core_gguf_writer_set_int(w, "t.i8", CORE_GGUF_TYPE_INT8, -100);
    rc |= core_gguf_writer_set_int(w, "t.u16", CORE_GGUF_TYPE_UINT16, 60000);
    rc |= core_gguf_writer_set_int(w, "t.i16", CORE_GGUF_TYPE_INT16, -30000);
    rc |= core_gguf_writer_set_int(w, "t.u32", CORE_GGUF_TYPE_UINT32, 4000000000);
    rc |= core_gguf_writer_set_int(w, "t.i32", CORE_GGUF_TYPE_INT32, -2000000000);
    rc |= core_gguf_writer_set_int(w, "t.u64", CORE_GGUF_TYPE_UINT64, INT64_C(9000000000000000000));
    rc |= core_gguf_writer_set_int(w, "t.i64", CORE_GGUF_TYPE_INT64, INT64_C(-9000000000000000000));
    rc |= core_gguf_writer_set_float(w, "t.f32", CORE_GGUF_TYPE_FLOAT32, 0.1);
    rc |= core_gguf_writer_set_float(w, "t.f64", CORE_GGUF_TYPE_FLOAT64, 0.1);
    rc |= core_gguf_writer_set_bool(w, "t.bool", 1);
    rc |= core_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo \"w\"", 10);
    int32_t ai[3] = {-1, 0, 1};
    rc |= core_gguf_writer_set_arr(w, "t.arr_i32", CORE_GGUF_TYPE_INT32, ai, 3);
    float af[2] = {1.5f, -2.25f};
    rc |= core_gguf_writer_set_arr(w, "t.arr_f32", CORE_GGUF_TYPE_FLOAT32, af, 2);
    const char *as[3] = {"a", "", "\xe4\xb8\xad"};
    rc |= core_gguf_writer_set_arr_str(w, "t.arr_str", as, 3);
    /* Nested arrays can only be copied from a reader: build a tiny GGUF in
     * memory holding t.nested = [[1, 2], ["x"]]. */
    static const uint8_t nested_src[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, /* header */
        1, 0, 0, 0, 0, 0, 0, 0, 'n', 9, 0, 0, 0,                                          /* key, ARRAY */
        9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,                                               /* of 2 ARRAYs */
        5, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,                       /* int32 [1, 2] */
        8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x'};                 /* string ["x"] */
    core_gguf_t *src = NULL;
    core_gguf_arr_t outer, inner[2];
    if (core_gguf_open_memory(nested_src, sizeof nested_src, &src, NULL) != 0 ||
        core_gguf_get_arr(src, "n", &outer, NULL) != 0 || core_gguf_arr_arr(&outer, 0, &inner[0]) != 0 ||
        core_gguf_arr_arr(&outer, 1, &inner[1]) != 0)
        rc = 1;
    else
        rc |= core_gguf_writer_set_arr(w, "t.nested", CORE_GGUF_TYPE_ARRAY, inner, 2);
    core_gguf_close(src);
    float f32[2 * 3];
    for (int i = 0; i < 6; i++) f32[i] = (float)i * 0.5f - 1.0f;
    int64_t ne_f32[2] = {3, 2};
    rc |= core_gguf_writer_add_tensor(w, "f32", CORE_TTYPE_F32, 2, ne_f32, f32, sizeof f32);
    uint8_t q[2 * 20];
    for (int i = 0; i < 40; i++) q[i] = (uint8_t)(i * 37 + 11);
    q[0] = 0x00, q[1] = 0x3c, q[2] = 0x00, q[3] = 0xbc; /* d = 1, m = -1 */
    q[20] = 0x00, q[21] = 0x38, q[22] = 0x00, q[23] = 0x00;
    int64_t ne_q[1] = {64};
    rc |= core_gguf_writer_add_tensor(w, "q4_1", CORE_TTYPE_Q4_1, 1, ne_q, q, sizeof q);
    core_error_t err = {0};
    if (rc != 0) {
        core_gguf_writer_free(w);
        return fail("building sample", NULL);
    }
    rc = core_gguf_writer_write(w, argv[2], &err);
    core_gguf_writer_free(w);
    return rc ? fail("write", &err) : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return fail("no command (see the file's header comment)", NULL);
    const char *c = argv[1];
    if ((strcmp(c, "list") == 0 || strcmp(c, "tensor") == 0 || strcmp(c, "all") == 0) && argc >= 3)
        return cmd_model(argc, argv);
    if (strcmp(c, "blocks") == 0) return cmd_blocks(argc, argv);
    if (strcmp(c, "f2h") == 0 || strcmp(c, "f2bf") == 0) return cmd_convert(argc, argv);
    if (strcmp(c, "dot") == 0) return cmd_dot(argc, argv);
    if (strcmp(c, "dump") == 0) return cmd_dump(argc, argv);
    if (strcmp(c, "write-sample") == 0) return cmd_write_sample(argc, argv);
    return fail("unknown command", NULL);
}
