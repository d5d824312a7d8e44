/* tests/unit/test_core_gguf.c — GGUF reader and writer.
 *
 * Small files are built byte by byte here (recording where each field sits so
 * that single fields can be corrupted), then: every accessor, v2/v3, alignment,
 * truncation at every byte, absurd counts and lengths, depth bombs, bad tensor
 * infos; the real model (env DARKSERVE_MODEL) intact, truncated and with a
 * corrupted tensor offset; writer round trips (including re-writing the real
 * model, which must reproduce it byte for byte); the fuzz corpus replayed.
 * Every rejected input is copied into an exactly sized heap buffer so that
 * ASan catches any read past its end.
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/gguf.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/unit/check.h"
#include "tests/unit/helpers.h"

/* ---- a little GGUF builder ---- */

typedef struct gb {
    uint8_t *p;
    size_t len, cap;
} gb_t;

static void gb_put(gb_t *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void gb_u8(gb_t *b, uint8_t v) { gb_put(b, &v, 1); }
static void gb_u32(gb_t *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gb_t *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gb_t *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_header(gb_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
static void gb_key(gb_t *b, const char *key, core_gguf_type_t t)
{
    gb_str(b, key);
    gb_u32(b, (uint32_t)t);
}
static void gb_pad(gb_t *b, size_t align)
{
    while (b->len % align) gb_u8(b, 0);
}
static void set_u32(gb_t *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void set_u64(gb_t *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* Positions of fields in the small file, for corrupting them. */
typedef struct small {
    gb_t b;
    size_t n_tensors, n_kv, version;
    size_t key1_len;     /* length of key 1 ("a.u32") */
    size_t u32_type;     /* value type of a.u32 */
    size_t arch_len;     /* string value length of general.architecture */
    size_t tok_type, tok_n, tok_s0_len; /* a.tokens: elem type, length, element 0 length */
    size_t nest_inner_n; /* a.nested: length of inner array 0 */
    size_t w_ndims, w_ne0, w_ne1, w_type, w_off;
    size_t q_name, q_ne0, q_type, q_off;
    size_t data_off;
} small_t;

/* A valid v3 file: 4 keys (string, uint32, string array, nested array), and
 * tensors w (F32 4x2 at 0) and q (Q8_0 32 at 32). It ends right after q's
 * data, so any shorter prefix is invalid. */
static small_t make_small(uint32_t version)
{
    small_t s;
    memset(&s, 0, sizeof s);
    gb_t *b = &s.b;
    s.version = 4;
    s.n_tensors = 8;
    s.n_kv = 16;
    gb_header(b, version, 2, 4);
    gb_str(b, "general.architecture");
    gb_u32(b, CORE_GGUF_TYPE_STRING);
    s.arch_len = b->len;
    gb_str(b, "llama");
    s.key1_len = b->len;
    gb_str(b, "a.u32");
    s.u32_type = b->len;
    gb_u32(b, CORE_GGUF_TYPE_UINT32);
    gb_u32(b, 7);
    gb_key(b, "a.tokens", CORE_GGUF_TYPE_ARRAY);
    s.tok_type = b->len;
    gb_u32(b, CORE_GGUF_TYPE_STRING);
    s.tok_n = b->len;
    gb_u64(b, 3);
    s.tok_s0_len = b->len;
    gb_str(b, "ab");
    gb_str(b, "c");
    gb_str(b, "");
    gb_key(b, "a.nested", CORE_GGUF_TYPE_ARRAY);
    gb_u32(b, CORE_GGUF_TYPE_ARRAY);
    gb_u64(b, 2);
    gb_u32(b, CORE_GGUF_TYPE_INT8);
    s.nest_inner_n = b->len;
    gb_u64(b, 2);
    gb_u8(b, 1);
    gb_u8(b, 0xfe);
    gb_u32(b, CORE_GGUF_TYPE_STRING);
    gb_u64(b, 1);
    gb_str(b, "z");
    /* tensor infos */
    gb_str(b, "w");
    s.w_ndims = b->len;
    gb_u32(b, 2);
    s.w_ne0 = b->len;
    gb_u64(b, 4);
    s.w_ne1 = b->len;
    gb_u64(b, 2);
    s.w_type = b->len;
    gb_u32(b, CORE_TTYPE_F32);
    s.w_off = b->len;
    gb_u64(b, 0);
    s.q_name = b->len;
    gb_str(b, "q");
    gb_u32(b, 1);
    s.q_ne0 = b->len;
    gb_u64(b, 32);
    s.q_type = b->len;
    gb_u32(b, CORE_TTYPE_Q8_0);
    s.q_off = b->len;
    gb_u64(b, 32);
    gb_pad(b, 32);
    s.data_off = b->len;
    for (int i = 0; i < 8; i++) {
        float f = (float)i - 2.5f;
        gb_put(b, &f, 4);
    }
    uint16_t d = core_fp32_to_fp16(0.5f);
    gb_put(b, &d, 2);
    for (int i = 0; i < 32; i++) gb_u8(b, (uint8_t)(int8_t)(i - 16));
    return s;
}

/* Opens a copy of (data, size) in an exactly sized buffer; expects failure
 * with code and a message containing each of the needles (NULL-terminated). */
static int expect_fail_(const void *data, size_t size, int code, const char *const *needles, int line)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (size) memcpy(copy, data, size);
    core_gguf_t *g = (core_gguf_t *)1;
    core_error_t err = {0};
    int rc = core_gguf_open_memory(copy, size, &g, &err);
    int ok = 1;
    if (rc != code || g != NULL || err.code != code) {
        printf("  line %d: rc %d (expected %d), msg \"%s\"\n", line, rc, code, err.msg);
        ok = 0;
    }
    for (; ok && *needles; needles++) {
        if (!strstr(err.msg, *needles)) {
            printf("  line %d: message \"%s\" lacks \"%s\"\n", line, err.msg, *needles);
            ok = 0;
        }
    }
    if (rc == 0) core_gguf_close(g);
    free(copy);
    return ok;
}
#define EXPECT_FAIL(data, size, code, ...)                                                   \
    do {                                                                                     \
        const char *const needles_[] = {__VA_ARGS__, NULL};                                  \
        CHECK(expect_fail_((data), (size), (code), needles_, __LINE__));                     \
    } while (0)

static core_gguf_t *open_ok(const void *data, size_t size)
{
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open_memory(data, size, &g, &err);
    if (rc != 0) printf("  open failed: %d %s\n", rc, err.msg);
    return g;
}

static int str_eq(core_gguf_str_t s, const char *z)
{
    return s.len == strlen(z) && memcmp(s.ptr, z, s.len) == 0;
}

/* ---- reading ---- */

TEST(small_file_reads_back)
{
    small_t s = make_small(3);
    core_gguf_t *g = open_ok(s.b.p, s.b.len);
    CHECK(g != NULL);
    if (!g) goto done;
    core_error_t err = {0};
    CHECK_INT_EQ(core_gguf_version(g), 3);
    CHECK_INT_EQ(core_gguf_alignment(g), 32);
    CHECK_INT_EQ(core_gguf_file_size(g), s.b.len);
    CHECK_INT_EQ(core_gguf_n_kv(g), 4);
    CHECK_STR_EQ(core_gguf_kv_key(g, 0), "general.architecture");
    CHECK_STR_EQ(core_gguf_kv_key(g, 3), "a.nested");
    CHECK(core_gguf_kv_key(g, 4) == NULL && core_gguf_kv_key(g, -1) == NULL);
    CHECK_INT_EQ(core_gguf_kv_type(g, 1), CORE_GGUF_TYPE_UINT32);
    CHECK_INT_EQ(core_gguf_find_key(g, "a.tokens"), 2);
    CHECK_INT_EQ(core_gguf_find_key(g, "a.token"), -1);

    core_gguf_str_t str;
    CHECK(core_gguf_get_str(g, "general.architecture", &str, &err) == 0 && str_eq(str, "llama"));
    int64_t iv = 0;
    double fv = 0;
    CHECK(core_gguf_get_int(g, "a.u32", &iv, &err) == 0 && iv == 7);
    CHECK(core_gguf_get_float(g, "a.u32", &fv, &err) == 0 && fv == 7.0);
    CHECK_INT_EQ(core_gguf_get_int(g, "nope", &iv, &err), CORE_ENOTFOUND);
    CHECK(strstr(err.msg, "nope") != NULL);
    CHECK_INT_EQ(core_gguf_get_str(g, "a.u32", &str, &err), CORE_EMISMATCH);
    CHECK(strstr(err.msg, "a.u32") != NULL);
    CHECK_INT_EQ(core_gguf_get_int(g, "general.architecture", &iv, &err), CORE_EMISMATCH);
    int bv;
    CHECK_INT_EQ(core_gguf_get_bool(g, "a.u32", &bv, &err), CORE_EMISMATCH);

    core_gguf_arr_t a, sub;
    CHECK(core_gguf_get_arr(g, "a.tokens", &a, &err) == 0);
    CHECK(a.type == CORE_GGUF_TYPE_STRING && a.n == 3);
    CHECK(core_gguf_arr_str(&a, 0, &str) == 0 && str_eq(str, "ab"));
    CHECK(core_gguf_arr_str(&a, 2, &str) == 0 && str_eq(str, ""));
    CHECK(core_gguf_arr_str(&a, 1, &str) == 0 && str_eq(str, "c"));
    CHECK_INT_EQ(core_gguf_arr_str(&a, 3, &str), CORE_ERANGE);
    CHECK_INT_EQ(core_gguf_arr_int(&a, 0, &iv), CORE_EMISMATCH);
    CHECK_INT_EQ(core_gguf_get_arr(g, "a.u32", &a, &err), CORE_EMISMATCH);

    CHECK(core_gguf_kv_arr(g, 3, &a, &err) == 0 && a.type == CORE_GGUF_TYPE_ARRAY && a.n == 2);
    CHECK(core_gguf_arr_arr(&a, 0, &sub) == 0 && sub.type == CORE_GGUF_TYPE_INT8 && sub.n == 2);
    CHECK(core_gguf_arr_int(&sub, 1, &iv) == 0 && iv == -2);
    CHECK(core_gguf_arr_float(&sub, 0, &fv) == 0 && fv == 1.0);
    CHECK_INT_EQ(core_gguf_arr_int(&sub, 2, &iv), CORE_ERANGE);
    CHECK(core_gguf_arr_arr(&a, 1, &sub) == 0 && sub.type == CORE_GGUF_TYPE_STRING && sub.n == 1);
    CHECK(core_gguf_arr_str(&sub, 0, &str) == 0 && str_eq(str, "z"));
    CHECK_INT_EQ(core_gguf_arr_arr(&a, 2, &sub), CORE_ERANGE);
    CHECK_INT_EQ(core_gguf_arr_str(&a, 0, &str), CORE_EMISMATCH);

    CHECK_INT_EQ(core_gguf_n_tensors(g), 2);
    const core_gguf_tensor_t *w = core_gguf_tensor(g, 0), *q = core_gguf_find_tensor(g, "q");
    CHECK(core_gguf_tensor(g, 2) == NULL && core_gguf_find_tensor(g, "x") == NULL);
    CHECK(w && q && q == core_gguf_tensor(g, 1));
    if (w && q) {
        CHECK_STR_EQ(w->name, "w");
        CHECK(w->n_dims == 2 && w->ne[0] == 4 && w->ne[1] == 2 && w->ne[2] == 1 && w->ne[3] == 1);
        CHECK(w->type == CORE_TTYPE_F32 && w->nbytes == 32 && w->offset == 0);
        CHECK((const uint8_t *)w->data == s.b.p + s.data_off);
        float f7;
        memcpy(&f7, (const uint8_t *)w->data + 28, 4);
        CHECK(f7 == 4.5f);
        CHECK(q->type == CORE_TTYPE_Q8_0 && q->nbytes == 34 && q->offset == 32);
        float y[32];
        CHECK(core_dequantize(q->type, q->data, y, 32, &err) == 0);
        CHECK(y[0] == -8.0f && y[31] == 7.5f);
    }
done:
    core_gguf_close(g);
    core_gguf_close(NULL);
    free(s.b.p);
}

TEST(version_2_is_read_and_others_refused)
{
    small_t s = make_small(2);
    core_gguf_t *g = open_ok(s.b.p, s.b.len);
    CHECK(g && core_gguf_version(g) == 2 && core_gguf_n_tensors(g) == 2);
    core_gguf_close(g);
    set_u32(&s.b, s.version, 1);
    EXPECT_FAIL(s.b.p, s.b.len, CORE_EUNSUPPORTED, "version 1");
    set_u32(&s.b, s.version, 4);
    EXPECT_FAIL(s.b.p, s.b.len, CORE_EUNSUPPORTED, "version 4");
    set_u32(&s.b, s.version, 0x03000000u); /* a big-endian v3 file */
    EXPECT_FAIL(s.b.p, s.b.len, CORE_EUNSUPPORTED, "version");
    set_u32(&s.b, s.version, 3);
    s.b.p[0] = 'g';
    EXPECT_FAIL(s.b.p, s.b.len, CORE_EFORMAT, "magic");
    EXPECT_FAIL(s.b.p, 0, CORE_EFORMAT, "truncated");
    free(s.b.p);
}

TEST(every_truncation_is_rejected)
{
    small_t s = make_small(3);
    for (size_t cut = 0; cut < s.b.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, s.b.p, cut);
        core_gguf_t *g = NULL;
        core_error_t err = {0};
        int rc = core_gguf_open_memory(copy, cut, &g, &err);
        CHECK_MSG(rc == CORE_EFORMAT && g == NULL && err.msg[0], "cut %zu: rc %d", cut, rc);
        /* Cut inside the data: the message names the tensor cut off. */
        if (cut >= s.data_off + 32) CHECK_MSG(strstr(err.msg, "'q'") != NULL, "cut %zu: %s", cut, err.msg);
        else if (cut >= s.data_off) CHECK_MSG(strstr(err.msg, "'w'") != NULL, "cut %zu: %s", cut, err.msg);
        else
            CHECK_MSG(strstr(err.msg, "truncated") || strstr(err.msg, "past end") || strstr(err.msg, "cannot fit"),
                      "cut %zu: %s", cut, err.msg);
        core_gguf_close(g);
        free(copy);
    }
    core_gguf_t *g = open_ok(s.b.p, s.b.len);
    CHECK(g != NULL);
    core_gguf_close(g);
    free(s.b.p);
}

TEST(absurd_counts_and_lengths_are_rejected)
{
    small_t s = make_small(3);
    gb_t *b = &s.b;
    set_u64(b, s.n_kv, UINT64_MAX);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "n_kv");
    set_u64(b, s.n_kv, 4);
    set_u64(b, s.n_tensors, UINT64_C(1) << 63);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "n_tensors");
    set_u64(b, s.n_tensors, 2);
    /* plausible for the file size, but beyond what we support */
    gb_t many = {0};
    gb_header(&many, 3, 0, 70000);
    for (int i = 0; i < 70000 * 13; i++) gb_u8(&many, 0);
    EXPECT_FAIL(many.p, many.len, CORE_EUNSUPPORTED, "70000 keys");
    free(many.p);
    /* more entries than are there: runs into the tensor infos and fails */
    set_u64(b, s.n_kv, 5);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "gguf");
    set_u64(b, s.n_kv, 4);

    uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 7, UINT64_C(1) << 63, 1u << 20};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        set_u64(b, s.key1_len, huge[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "metadata entry 1", "key");
        set_u64(b, s.key1_len, 5);
        set_u64(b, s.arch_len, huge[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "general.architecture");
        set_u64(b, s.arch_len, 5);
        set_u64(b, s.tok_n, huge[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.tokens");
        set_u64(b, s.tok_n, 3);
        set_u64(b, s.tok_s0_len, huge[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.tokens", "element 0");
        set_u64(b, s.tok_s0_len, 2);
        set_u64(b, s.nest_inner_n, huge[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.nested");
        set_u64(b, s.nest_inner_n, 2);
    }
    set_u64(b, s.key1_len, 0);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "empty key");
    set_u64(b, s.key1_len, 5);
    set_u32(b, s.u32_type, 13);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.u32", "type 13");
    set_u32(b, s.u32_type, UINT32_MAX);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.u32");
    set_u32(b, s.u32_type, CORE_GGUF_TYPE_UINT32);
    set_u32(b, s.tok_type, 99);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "a.tokens", "element type");
    set_u32(b, s.tok_type, CORE_GGUF_TYPE_STRING);
    core_gguf_t *g = open_ok(b->p, b->len); /* restored intact */
    CHECK(g != NULL);
    core_gguf_close(g);
    free(b->p);
}

/* key "bomb": depth nested arrays, the innermost an int32 [42]. */
static gb_t make_nested(int depth)
{
    gb_t b = {0};
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "bomb", CORE_GGUF_TYPE_ARRAY);
    for (int i = 0; i < depth - 1; i++) {
        gb_u32(&b, CORE_GGUF_TYPE_ARRAY);
        gb_u64(&b, 1);
    }
    gb_u32(&b, CORE_GGUF_TYPE_INT32);
    gb_u64(&b, 1);
    gb_u32(&b, 42);
    return b;
}

TEST(nesting_depth_is_bounded)
{
    gb_t b = make_nested(8);
    core_gguf_t *g = open_ok(b.p, b.len);
    CHECK(g != NULL);
    if (g) {
        core_gguf_arr_t a, sub;
        CHECK(core_gguf_get_arr(g, "bomb", &a, NULL) == 0);
        int levels = 1;
        while (a.type == CORE_GGUF_TYPE_ARRAY && core_gguf_arr_arr(&a, 0, &sub) == 0) {
            a = sub;
            levels++;
        }
        int64_t v = 0;
        CHECK_INT_EQ(levels, 8);
        CHECK(core_gguf_arr_int(&a, 0, &v) == 0 && v == 42);
    }
    core_gguf_close(g);
    free(b.p);
    b = make_nested(9);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "bomb", "nested");
    free(b.p);
    b = make_nested(100000);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "bomb", "nested");
    free(b.p);
}

TEST(bad_tensor_infos_are_rejected)
{
    small_t s = make_small(3);
    gb_t *b = &s.b;
    set_u32(b, s.w_ndims, 0);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'w'", "n_dims");
    set_u32(b, s.w_ndims, 5);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'w'", "n_dims");
    set_u32(b, s.w_ndims, 2);
    set_u64(b, s.w_ne0, UINT64_C(1) << 32);
    set_u64(b, s.w_ne1, UINT64_C(1) << 32);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'w'", "overflow");
    set_u64(b, s.w_ne1, 2);
    set_u64(b, s.w_ne0, UINT64_MAX);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'w'");
    set_u64(b, s.w_ne0, UINT64_C(1) << 62); /* fits int64 but 16 EiB of F32 */
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'w'");
    set_u64(b, s.w_ne0, 0);
    EXPECT_FAIL(b->p, b->len, CORE_EUNSUPPORTED, "'w'", "dimension 0");
    set_u64(b, s.w_ne0, 4);
    set_u64(b, s.q_ne0, 33);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'q'", "Q8_0");
    set_u64(b, s.q_ne0, 32);
    uint32_t bad_types[] = {4, 5, 31, 40, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        set_u32(b, s.q_type, bad_types[i]);
        EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'q'", "type id");
    }
    set_u32(b, s.q_type, CORE_TTYPE_Q8_0);
    set_u64(b, s.q_off, 33);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'q'", "alignment");
    set_u64(b, s.q_off, 64);
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'q'", "beyond");
    set_u64(b, s.q_off, UINT64_MAX - 31); /* aligned; offset + size wraps */
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "'q'", "beyond");
    set_u64(b, s.q_off, 32);
    b->p[s.q_name + 8] = 'w'; /* rename q to w */
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "duplicate", "'w'");
    b->p[s.q_name + 8] = 'q';
    set_u64(b, s.q_name, 0); /* empty name: the rest of the info shifts, but the name check comes first */
    EXPECT_FAIL(b->p, b->len, CORE_EFORMAT, "tensor info 1", "empty name");
    set_u64(b, s.q_name, 1);
    /* A type we know the size of but cannot dequantize is still readable. */
    set_u32(b, s.q_type, 20); /* IQ4_NL: 18 bytes per 32 */
    core_gguf_t *g = open_ok(b->p, b->len);
    CHECK(g && core_gguf_tensor(g, 1)->nbytes == 18 && !core_ttype_supported(20));
    core_gguf_close(g);
    free(b->p);
}

TEST(duplicate_keys_are_rejected)
{
    gb_t b = {0};
    gb_header(&b, 3, 0, 3);
    gb_key(&b, "x.a", CORE_GGUF_TYPE_UINT8);
    gb_u8(&b, 1);
    gb_key(&b, "x.b", CORE_GGUF_TYPE_UINT8);
    gb_u8(&b, 2);
    gb_key(&b, "x.a", CORE_GGUF_TYPE_UINT8);
    gb_u8(&b, 3);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "duplicate", "x.a");
    free(b.p);
}

/* A file with general.alignment of the given type and value and one F32
 * tensor "t" at offset off. */
static gb_t make_aligned(core_gguf_type_t atype, uint64_t align, uint64_t off)
{
    gb_t b = {0};
    gb_header(&b, 3, 1, 1);
    gb_key(&b, "general.alignment", atype);
    if (atype == CORE_GGUF_TYPE_UINT64) gb_u64(&b, align);
    else gb_u32(&b, (uint32_t)align);
    gb_str(&b, "t");
    gb_u32(&b, 1);
    gb_u64(&b, 2);
    gb_u32(&b, CORE_TTYPE_F32);
    gb_u64(&b, off);
    gb_pad(&b, align && align < 4096 ? align : 32);
    for (uint64_t i = 0; i < off + 8; i++) gb_u8(&b, (uint8_t)i);
    return b;
}

TEST(general_alignment_is_honoured_and_checked)
{
    gb_t b = make_aligned(CORE_GGUF_TYPE_UINT32, 64, 64);
    core_gguf_t *g = open_ok(b.p, b.len);
    CHECK(g && core_gguf_alignment(g) == 64);
    if (g) {
        const core_gguf_tensor_t *t = core_gguf_find_tensor(g, "t");
        /* header + kv + info = 83 bytes, padded to 128; tensor at +64 */
        CHECK(t && (const uint8_t *)t->data == b.p + 128 + 64);
    }
    core_gguf_close(g);
    free(b.p);
    b = make_aligned(CORE_GGUF_TYPE_UINT32, 64, 32);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "'t'", "alignment 64");
    free(b.p);
    b = make_aligned(CORE_GGUF_TYPE_UINT32, 48, 0);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "general.alignment", "48");
    free(b.p);
    b = make_aligned(CORE_GGUF_TYPE_UINT32, 0, 0);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "general.alignment");
    free(b.p);
    b = make_aligned(CORE_GGUF_TYPE_UINT64, 32, 0);
    EXPECT_FAIL(b.p, b.len, CORE_EFORMAT, "general.alignment", "uint32");
    free(b.p);
}

TEST(getters_convert_types)
{
    gb_t b = {0};
    gb_header(&b, 3, 0, 7);
    gb_key(&b, "u64.big", CORE_GGUF_TYPE_UINT64);
    gb_u64(&b, UINT64_MAX);
    gb_key(&b, "i8", CORE_GGUF_TYPE_INT8);
    gb_u8(&b, 0x80);
    gb_key(&b, "b", CORE_GGUF_TYPE_BOOL);
    gb_u8(&b, 1);
    gb_key(&b, "f32", CORE_GGUF_TYPE_FLOAT32);
    float f = -1.25f;
    gb_put(&b, &f, 4);
    gb_key(&b, "f64", CORE_GGUF_TYPE_FLOAT64);
    double d = 1e-300;
    gb_put(&b, &d, 8);
    gb_key(&b, "i64", CORE_GGUF_TYPE_INT64);
    gb_u64(&b, (uint64_t)INT64_MIN);
    gb_key(&b, "arr", CORE_GGUF_TYPE_ARRAY);
    gb_u32(&b, CORE_GGUF_TYPE_UINT64);
    gb_u64(&b, 2);
    gb_u64(&b, 5);
    gb_u64(&b, UINT64_MAX);
    core_gguf_t *g = open_ok(b.p, b.len);
    CHECK(g != NULL);
    if (g) {
        core_error_t err = {0};
        int64_t iv;
        double fv;
        int bv;
        CHECK_INT_EQ(core_gguf_get_int(g, "u64.big", &iv, &err), CORE_ERANGE);
        CHECK(strstr(err.msg, "u64.big") != NULL);
        CHECK(core_gguf_get_float(g, "u64.big", &fv, &err) == 0 && fv == 18446744073709551616.0);
        CHECK(core_gguf_get_int(g, "i8", &iv, &err) == 0 && iv == -128);
        CHECK(core_gguf_get_int(g, "b", &iv, &err) == 0 && iv == 1);
        CHECK(core_gguf_get_bool(g, "b", &bv, &err) == 0 && bv == 1);
        CHECK(core_gguf_get_float(g, "f32", &fv, &err) == 0 && fv == -1.25);
        CHECK_INT_EQ(core_gguf_get_int(g, "f32", &iv, &err), CORE_EMISMATCH);
        CHECK(strstr(err.msg, "f32") != NULL);
        CHECK(core_gguf_get_float(g, "f64", &fv, &err) == 0 && fv == 1e-300);
        CHECK(core_gguf_get_int(g, "i64", &iv, &err) == 0 && iv == INT64_MIN);
        CHECK(core_gguf_kv_int(g, 5, &iv, &err) == 0 && iv == INT64_MIN);
        CHECK_INT_EQ(core_gguf_kv_int(g, 7, &iv, &err), CORE_ENOTFOUND);
        CHECK_INT_EQ(core_gguf_kv_int(g, -1, &iv, &err), CORE_ENOTFOUND);
        core_gguf_str_t s;
        CHECK_INT_EQ(core_gguf_kv_str(g, 0, &s, &err), CORE_EMISMATCH);
        core_gguf_arr_t a;
        CHECK(core_gguf_get_arr(g, "arr", &a, &err) == 0 && a.n == 2);
        CHECK(core_gguf_arr_int(&a, 0, &iv) == 0 && iv == 5);
        CHECK_INT_EQ(core_gguf_arr_int(&a, 1, &iv), CORE_ERANGE);
        CHECK(core_gguf_arr_float(&a, 1, &fv) == 0 && fv == 18446744073709551616.0);
        CHECK_INT_EQ(core_gguf_arr_str(&a, 0, &s), CORE_EMISMATCH);
        CHECK_INT_EQ(core_gguf_arr_arr(&a, 0, &a), CORE_EMISMATCH);
    }
    core_gguf_close(g);
    free(b.p);
}

TEST(big_string_array_is_indexed)
{
    /* 49152 strings of varying length: element i is "tok<i>". */
    enum { N = 49152 };
    gb_t b = {0};
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "tokenizer.ggml.tokens", CORE_GGUF_TYPE_ARRAY);
    gb_u32(&b, CORE_GGUF_TYPE_STRING);
    gb_u64(&b, N);
    char tmp[32];
    for (int i = 0; i < N; i++) {
        snprintf(tmp, sizeof tmp, "tok%d", i);
        gb_str(&b, tmp);
    }
    core_gguf_t *g = open_ok(b.p, b.len);
    CHECK(g != NULL);
    if (g) {
        core_gguf_arr_t a;
        CHECK(core_gguf_get_arr(g, "tokenizer.ggml.tokens", &a, NULL) == 0 && a.n == N);
        core_rng_t r;
        core_rng_seed(&r, 1);
        int bad = 0;
        for (int k = 0; k < 200000; k++) {
            uint64_t i = core_rng_u64(&r) % N;
            core_gguf_str_t s;
            snprintf(tmp, sizeof tmp, "tok%" PRIu64, i);
            if (core_gguf_arr_str(&a, i, &s) != 0 || !str_eq(s, tmp)) bad++;
        }
        CHECK_INT_EQ(bad, 0);
    }
    core_gguf_close(g);
    free(b.p);
}

/* ---- the real model ---- */

static const char *model_path(void)
{
    const char *p = getenv("DARKSERVE_MODEL");
    return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fwrite(p, 1, n, f) == n ? 0 : -1;
    return fclose(f) == 0 ? rc : -1;
}

TEST(real_model_reads)
{
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open(model_path(), &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", model_path(), err.msg);
    if (rc) return;
    core_gguf_str_t s;
    int64_t iv;
    CHECK_INT_EQ(core_gguf_version(g), 3);
    CHECK_INT_EQ(core_gguf_alignment(g), 32);
    CHECK(core_gguf_get_str(g, "general.architecture", &s, &err) == 0 && str_eq(s, "llama"));
    CHECK(core_gguf_get_str(g, "tokenizer.ggml.pre", &s, &err) == 0 && str_eq(s, "smollm"));
    CHECK(core_gguf_get_int(g, "llama.block_count", &iv, &err) == 0 && iv == 30);
    CHECK(core_gguf_get_int(g, "llama.embedding_length", &iv, &err) == 0 && iv == 576);
    core_gguf_arr_t a;
    CHECK(core_gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &err) == 0 && a.n == 49152);
    CHECK(core_gguf_arr_str(&a, 0, &s) == 0 && str_eq(s, "<|endoftext|>"));
    CHECK(core_gguf_arr_str(&a, 2, &s) == 0 && str_eq(s, "<|im_end|>"));
    CHECK(core_gguf_get_arr(g, "tokenizer.ggml.merges", &a, &err) == 0 && a.n > 0);
    CHECK_INT_EQ(core_gguf_n_tensors(g), 272);
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == CORE_TTYPE_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    size_t total = 0;
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) total += core_gguf_tensor(g, i)->nbytes;
    CHECK(total < core_gguf_file_size(g) && total > core_gguf_file_size(g) / 2);
    core_gguf_close(g);
}

/* core_gguf_release: a mapped tensor's pages go and come back with the same
 * bytes; a GGUF in caller memory is never touched (MADV_DONTNEED on
 * anonymous memory would zero it). */
TEST(release_keeps_the_bytes)
{
    core_gguf_t *g = NULL;
    core_error_t err = {0};
    int rc = core_gguf_open(model_path(), &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", model_path(), err.msg);
    if (rc) return;
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    if (!t) {
        core_gguf_close(g);
        return;
    }
    unsigned char *before = malloc(t->nbytes);
    CHECK(before != NULL);
    if (before) {
        memcpy(before, t->data, t->nbytes);
        core_gguf_release(g, t->data, t->nbytes);
        CHECK(memcmp(before, t->data, t->nbytes) == 0);
        core_gguf_release(g, (const char *)t->data - 1, 2); /* no whole page: nothing */
        core_gguf_release(g, before, t->nbytes);             /* not the mapping: nothing */
        CHECK(memcmp(before, t->data, t->nbytes) == 0);
    }
    free(before);
    core_gguf_close(g);

    /* the same file read into memory: its tensor's whole pages stay */
    FILE *f = fopen(model_path(), "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    const size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *img = NULL;
    CHECK(posix_memalign((void **)&img, 4096, size) == 0);
    if (img && fread(img, 1, size, f) == size &&
        core_gguf_open_memory(img, size, &g, &err) == 0) {
        t = core_gguf_find_tensor(g, "token_embd.weight");
        unsigned char *copy = t ? malloc(t->nbytes) : NULL;
        CHECK(copy != NULL);
        if (copy) {
            memcpy(copy, t->data, t->nbytes);
            core_gguf_release(g, t->data, t->nbytes);
            CHECK(memcmp(copy, t->data, t->nbytes) == 0);
        }
        free(copy);
        core_gguf_close(g);
    } else {
        CHECK(!"cannot read the model into memory");
    }
    fclose(f);
    free(img);
}

/* Position of tensor `name`'s offset field in a GGUF image, or 0. */
static size_t find_offset_field(const uint8_t *p, size_t n, const char *name, uint32_t n_dims)
{
    size_t len = strlen(name);
    uint8_t pat[256];
    uint64_t l = len;
    memcpy(pat, &l, 8);
    memcpy(pat + 8, name, len);
    const uint8_t *hit = memmem(p, n, pat, 8 + len);
    if (!hit) return 0;
    return (size_t)(hit - p) + 8 + len + 4 + 8 * (size_t)n_dims + 4;
}

TEST(real_model_damaged_copies_are_rejected)
{
    size_t n = 0;
    uint8_t *img = (uint8_t *)slurp(model_path(), &n);
    CHECK_MSG(img != NULL, "cannot read %s", model_path());
    if (!img) return;
    core_gguf_t *g = open_ok(img, n);
    CHECK(g != NULL);
    char dir[] = "/tmp/test_core_gguf.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/damaged.gguf", dir);
    if (!g) goto done;

    /* First 60%: the message names the first tensor (file order) cut off. */
    size_t cut = n / 10 * 6;
    const char *victim = NULL;
    for (int64_t i = 0; i < core_gguf_n_tensors(g) && !victim; i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        if ((size_t)((const uint8_t *)t->data - img) + t->nbytes > cut) victim = t->name;
    }
    CHECK(victim != NULL && write_file(path, img, cut) == 0);
    core_gguf_t *bad = NULL;
    core_error_t err = {0};
    CHECK_INT_EQ(core_gguf_open(path, &bad, &err), CORE_EFORMAT);
    CHECK(bad == NULL);
    char needle[300];
    snprintf(needle, sizeof needle, "tensor '%s'", victim ? victim : "?");
    CHECK_MSG(strstr(err.msg, needle) && strstr(err.msg, "beyond") && strstr(err.msg, path), "%s", err.msg);

    /* One tensor's offset corrupted: past the end, then misaligned. */
    const core_gguf_tensor_t *t = core_gguf_find_tensor(g, "blk.10.attn_q.weight");
    CHECK(t != NULL);
    if (!t) goto done;
    size_t at = find_offset_field(img, n, t->name, t->n_dims);
    uint64_t orig;
    memcpy(&orig, img + at, 8);
    CHECK(at != 0 && orig == t->offset);
    uint64_t far = t->offset + (UINT64_C(1) << 32);
    memcpy(img + at, &far, 8);
    CHECK(write_file(path, img, n) == 0);
    CHECK_INT_EQ(core_gguf_open(path, &bad, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "'blk.10.attn_q.weight'") && strstr(err.msg, "beyond"), "%s", err.msg);
    uint64_t odd = t->offset + 1;
    memcpy(img + at, &odd, 8);
    CHECK(write_file(path, img, n) == 0);
    CHECK_INT_EQ(core_gguf_open(path, &bad, &err), CORE_EFORMAT);
    CHECK_MSG(strstr(err.msg, "'blk.10.attn_q.weight'") && strstr(err.msg, "alignment"), "%s", err.msg);
    memcpy(img + at, &orig, 8);
done:
    core_gguf_close(g);
    unlink(path);
    rmdir(dir);
    free(img);
}

/* ---- writer ---- */

/* Number of entries in dir other than . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void fill_random(core_rng_t *r, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)core_rng_u64(r);
}

TEST(writer_round_trip)
{
    uint32_t aligns[] = {0, 128};
    small_t src = make_small(3); /* the nested array comes from a reader */
    core_gguf_t *sg = open_ok(src.b.p, src.b.len);
    CHECK(sg != NULL);
    if (!sg) return;
    core_gguf_arr_t nested, nested_elems[2];
    core_gguf_get_arr(sg, "a.nested", &nested, NULL);
    core_gguf_arr_arr(&nested, 0, &nested_elems[0]);
    core_gguf_arr_arr(&nested, 1, &nested_elems[1]);
    char dir[] = "/tmp/test_core_gguf_w.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/out.gguf", dir);
    core_rng_t r;
    core_rng_seed(&r, 42);
    for (size_t ai = 0; ai < 2; ai++) {
        core_gguf_writer_t *w = core_gguf_writer_new(aligns[ai]);
        CHECK(w != NULL);
        if (!w) continue;
        CHECK(core_gguf_writer_set_int(w, "u8", CORE_GGUF_TYPE_UINT8, 255) == 0);
        CHECK(core_gguf_writer_set_int(w, "i8", CORE_GGUF_TYPE_INT8, -128) == 0);
        CHECK(core_gguf_writer_set_int(w, "u16", CORE_GGUF_TYPE_UINT16, 65535) == 0);
        CHECK(core_gguf_writer_set_int(w, "i16", CORE_GGUF_TYPE_INT16, -32768) == 0);
        CHECK(core_gguf_writer_set_int(w, "u32", CORE_GGUF_TYPE_UINT32, UINT32_MAX) == 0);
        CHECK(core_gguf_writer_set_int(w, "i32", CORE_GGUF_TYPE_INT32, INT32_MIN) == 0);
        CHECK(core_gguf_writer_set_int(w, "u64", CORE_GGUF_TYPE_UINT64, INT64_MAX) == 0);
        CHECK(core_gguf_writer_set_int(w, "i64", CORE_GGUF_TYPE_INT64, INT64_MIN) == 0);
        CHECK(core_gguf_writer_set_float(w, "f32", CORE_GGUF_TYPE_FLOAT32, 0.1) == 0);
        CHECK(core_gguf_writer_set_float(w, "f64", CORE_GGUF_TYPE_FLOAT64, 0.1) == 0);
        CHECK(core_gguf_writer_set_bool(w, "bool", 7) == 0);
        CHECK(core_gguf_writer_set_str(w, "str", "a\0b", 3) == 0);
        CHECK(core_gguf_writer_set_str(w, "empty", NULL, 0) == 0);
        int16_t i16s[3] = {-1, 2, -3};
        CHECK(core_gguf_writer_set_arr(w, "arr.i16", CORE_GGUF_TYPE_INT16, i16s, 3) == 0);
        double f64s[2] = {1e300, -0.0};
        CHECK(core_gguf_writer_set_arr(w, "arr.f64", CORE_GGUF_TYPE_FLOAT64, f64s, 2) == 0);
        uint8_t bools[2] = {1, 0};
        CHECK(core_gguf_writer_set_arr(w, "arr.bool", CORE_GGUF_TYPE_BOOL, bools, 2) == 0);
        CHECK(core_gguf_writer_set_arr(w, "arr.empty", CORE_GGUF_TYPE_UINT32, NULL, 0) == 0);
        const char *strs[3] = {"x", "", "long string"};
        CHECK(core_gguf_writer_set_arr_str(w, "arr.str", strs, 3) == 0);
        core_gguf_str_t sv[2] = {{"p\0q", 3}, {"", 0}};
        CHECK(core_gguf_writer_set_arr(w, "arr.str2", CORE_GGUF_TYPE_STRING, sv, 2) == 0);
        CHECK(core_gguf_writer_set_arr(w, "arr.nested", CORE_GGUF_TYPE_ARRAY, nested_elems, 2) == 0);

        /* tensors of several types with random contents */
        const int ttypes[] = {CORE_TTYPE_F32, CORE_TTYPE_F16, CORE_TTYPE_BF16, CORE_TTYPE_Q8_0,
                              CORE_TTYPE_Q4_1, CORE_TTYPE_Q4_K, CORE_TTYPE_Q6_K, 20 /* IQ4_NL */};
        enum { NT = sizeof ttypes / sizeof ttypes[0] };
        uint8_t *tdata[NT];
        size_t tbytes[NT];
        for (int i = 0; i < NT; i++) {
            int64_t ne[3] = {core_ttype_block_elems(ttypes[i]) * (i + 1), 3, 2};
            if (ne[0] < 8) ne[0] = 8 + i;
            core_ttype_row_bytes(ttypes[i], ne[0], &tbytes[i]);
            tbytes[i] *= 6;
            tdata[i] = malloc(tbytes[i]);
            fill_random(&r, tdata[i], tbytes[i]);
            char name[32];
            snprintf(name, sizeof name, "t%d.%s", i, core_ttype_name(ttypes[i]));
            CHECK(core_gguf_writer_add_tensor(w, name, ttypes[i], 3, ne, tdata[i], tbytes[i]) == 0);
        }
        core_error_t err = {0};
        CHECK_MSG(core_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
        core_gguf_writer_free(w);
        CHECK_INT_EQ(count_entries(dir), 1); /* no temp file left behind */

        core_gguf_t *g = NULL;
        CHECK_MSG(core_gguf_open(path, &g, &err) == 0, "%s", err.msg);
        if (g) {
            uint32_t align = aligns[ai] ? aligns[ai] : 32;
            int64_t iv;
            double fv;
            int bv;
            core_gguf_str_t s;
            core_gguf_arr_t a, sub;
            CHECK_INT_EQ(core_gguf_version(g), 3);
            CHECK_INT_EQ(core_gguf_alignment(g), align);
            CHECK_INT_EQ(core_gguf_find_key(g, "general.alignment") >= 0, align != 32);
            CHECK(core_gguf_get_int(g, "u8", &iv, NULL) == 0 && iv == 255);
            CHECK(core_gguf_get_int(g, "i8", &iv, NULL) == 0 && iv == -128);
            CHECK(core_gguf_get_int(g, "u16", &iv, NULL) == 0 && iv == 65535);
            CHECK(core_gguf_get_int(g, "i16", &iv, NULL) == 0 && iv == -32768);
            CHECK(core_gguf_get_int(g, "u32", &iv, NULL) == 0 && iv == UINT32_MAX);
            CHECK(core_gguf_get_int(g, "i32", &iv, NULL) == 0 && iv == INT32_MIN);
            CHECK(core_gguf_get_int(g, "u64", &iv, NULL) == 0 && iv == INT64_MAX);
            CHECK(core_gguf_get_int(g, "i64", &iv, NULL) == 0 && iv == INT64_MIN);
            for (int64_t k = 0; k < core_gguf_n_kv(g); k++) {
                const char *key = core_gguf_kv_key(g, k);
                static const struct { const char *key; core_gguf_type_t t; } want[] = {
                    {"u8", CORE_GGUF_TYPE_UINT8}, {"i8", CORE_GGUF_TYPE_INT8}, {"u16", CORE_GGUF_TYPE_UINT16},
                    {"i16", CORE_GGUF_TYPE_INT16}, {"u32", CORE_GGUF_TYPE_UINT32}, {"i32", CORE_GGUF_TYPE_INT32},
                    {"u64", CORE_GGUF_TYPE_UINT64}, {"i64", CORE_GGUF_TYPE_INT64}, {"f32", CORE_GGUF_TYPE_FLOAT32},
                    {"f64", CORE_GGUF_TYPE_FLOAT64}, {"bool", CORE_GGUF_TYPE_BOOL}, {"str", CORE_GGUF_TYPE_STRING}};
                for (size_t j = 0; j < sizeof want / sizeof want[0]; j++)
                    if (strcmp(key, want[j].key) == 0) CHECK_MSG(core_gguf_kv_type(g, k) == want[j].t, "%s", key);
            }
            CHECK(core_gguf_get_float(g, "f32", &fv, NULL) == 0 && fv == (double)0.1f);
            CHECK(core_gguf_get_float(g, "f64", &fv, NULL) == 0 && fv == 0.1);
            CHECK(core_gguf_get_bool(g, "bool", &bv, NULL) == 0 && bv == 1);
            CHECK(core_gguf_get_str(g, "str", &s, NULL) == 0 && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
            CHECK(core_gguf_get_str(g, "empty", &s, NULL) == 0 && s.len == 0);
            CHECK(core_gguf_get_arr(g, "arr.i16", &a, NULL) == 0 && a.type == CORE_GGUF_TYPE_INT16 && a.n == 3);
            CHECK(core_gguf_arr_int(&a, 2, &iv) == 0 && iv == -3);
            CHECK(core_gguf_get_arr(g, "arr.f64", &a, NULL) == 0 && a.n == 2);
            CHECK(core_gguf_arr_float(&a, 0, &fv) == 0 && fv == 1e300);
            CHECK(core_gguf_arr_float(&a, 1, &fv) == 0 && fv == 0.0 && signbit(fv));
            CHECK(core_gguf_get_arr(g, "arr.bool", &a, NULL) == 0 && a.type == CORE_GGUF_TYPE_BOOL);
            CHECK(core_gguf_arr_int(&a, 0, &iv) == 0 && iv == 1);
            CHECK(core_gguf_get_arr(g, "arr.empty", &a, NULL) == 0 && a.n == 0 && a.type == CORE_GGUF_TYPE_UINT32);
            CHECK(core_gguf_get_arr(g, "arr.str", &a, NULL) == 0 && a.n == 3);
            CHECK(core_gguf_arr_str(&a, 2, &s) == 0 && str_eq(s, "long string"));
            CHECK(core_gguf_arr_str(&a, 1, &s) == 0 && s.len == 0);
            CHECK(core_gguf_get_arr(g, "arr.str2", &a, NULL) == 0 && a.n == 2);
            CHECK(core_gguf_arr_str(&a, 0, &s) == 0 && s.len == 3 && memcmp(s.ptr, "p\0q", 3) == 0);
            CHECK(core_gguf_get_arr(g, "arr.nested", &a, NULL) == 0 && a.n == 2 && a.type == CORE_GGUF_TYPE_ARRAY);
            CHECK(core_gguf_arr_arr(&a, 0, &sub) == 0 && sub.type == CORE_GGUF_TYPE_INT8 && sub.n == 2);
            CHECK(core_gguf_arr_int(&sub, 1, &iv) == 0 && iv == -2);
            CHECK(core_gguf_arr_arr(&a, 1, &sub) == 0 && sub.type == CORE_GGUF_TYPE_STRING);
            CHECK(core_gguf_arr_str(&sub, 0, &s) == 0 && str_eq(s, "z"));

            CHECK_INT_EQ(core_gguf_n_tensors(g), NT);
            for (int i = 0; i < NT && i < core_gguf_n_tensors(g); i++) {
                const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
                CHECK(t->type == ttypes[i] && t->n_dims == 3 && t->ne[1] == 3 && t->ne[2] == 2 && t->ne[3] == 1);
                CHECK(t->nbytes == tbytes[i] && memcmp(t->data, tdata[i], tbytes[i]) == 0);
                CHECK(t->offset % align == 0 && ((uintptr_t)t->data % align) == 0);
            }
            core_gguf_close(g);
        }
        for (int i = 0; i < NT; i++) free(tdata[i]);
    }
    unlink(path);
    rmdir(dir);
    core_gguf_close(sg);
    free(src.b.p);
}

TEST(writer_rejects_bad_input)
{
    CHECK(core_gguf_writer_new(3) == NULL);
    CHECK(core_gguf_writer_new(1u << 31) == NULL);
    core_gguf_writer_free(NULL);
    core_gguf_writer_t *w = core_gguf_writer_new(32);
    CHECK(w != NULL);
    if (!w) return;
    CHECK(core_gguf_writer_set_int(w, "k", CORE_GGUF_TYPE_UINT32, 1) == 0);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "k", CORE_GGUF_TYPE_UINT32, 2), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_str(w, "k", "x", 1), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "big", CORE_GGUF_TYPE_UINT8, 256), CORE_ERANGE);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "neg", CORE_GGUF_TYPE_UINT64, -1), CORE_ERANGE);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "f", CORE_GGUF_TYPE_FLOAT32, 1), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_float(w, "f", CORE_GGUF_TYPE_INT32, 1), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "", CORE_GGUF_TYPE_UINT8, 1), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_int(w, "general.alignment", CORE_GGUF_TYPE_UINT32, 64), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_set_arr(w, "a", CORE_GGUF_TYPE_UINT8, NULL, 2), CORE_EINVAL);
    const char *nul[1] = {NULL};
    CHECK_INT_EQ(core_gguf_writer_set_arr_str(w, "a", nul, 1), CORE_EINVAL);
    float x[32] = {0};
    int64_t ne[2] = {32, 1};
    CHECK(core_gguf_writer_add_tensor(w, "t", CORE_TTYPE_F32, 2, ne, x, sizeof x) == 0);
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "t", CORE_TTYPE_F32, 2, ne, x, sizeof x), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "u", CORE_TTYPE_F32, 2, ne, x, sizeof x - 4), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "u", CORE_TTYPE_Q8_0, 2, ne, x, 34), 0);
    int64_t ne31[1] = {31};
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "v", CORE_TTYPE_Q8_0, 1, ne31, x, 34), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "v", 4, 1, ne, x, 34), CORE_EINVAL);
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "v", CORE_TTYPE_F32, 5, ne, x, sizeof x), CORE_EINVAL);
    int64_t ne0[1] = {0};
    CHECK_INT_EQ(core_gguf_writer_add_tensor(w, "v", CORE_TTYPE_F32, 1, ne0, x, 0), CORE_EINVAL);

    /* A failed write leaves nothing behind; a good one replaces the target. */
    core_error_t err = {0};
    CHECK_INT_EQ(core_gguf_writer_write(w, "/nonexistent-dir/x.gguf", &err), CORE_EIO);
    CHECK(strstr(err.msg, "/nonexistent-dir/x.gguf") != NULL);
    char dir[] = "/tmp/test_core_gguf_e.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    CHECK(write_file(path, "old", 3) == 0);
    CHECK(core_gguf_writer_write(w, path, &err) == 0);
    CHECK_INT_EQ(count_entries(dir), 1);
    core_gguf_t *g = NULL;
    CHECK(core_gguf_open(path, &g, &err) == 0 && core_gguf_n_tensors(g) == 2);
    core_gguf_close(g);
    unlink(path);
    rmdir(dir);
    core_gguf_writer_free(w);
}

/* Copies every key and tensor of g into a new writer. */
static core_gguf_writer_t *copy_into_writer(const core_gguf_t *g)
{
    core_gguf_writer_t *w = core_gguf_writer_new(core_gguf_alignment(g));
    int rc = w ? 0 : -1;
    for (int64_t i = 0; i < core_gguf_n_kv(g) && !rc; i++) {
        const char *key = core_gguf_kv_key(g, i);
        core_gguf_type_t t = core_gguf_kv_type(g, i);
        if (strcmp(key, "general.alignment") == 0) continue; /* the writer adds it */
        int64_t iv;
        double fv;
        core_gguf_str_t s;
        core_gguf_arr_t a;
        switch (t) {
        case CORE_GGUF_TYPE_FLOAT32:
        case CORE_GGUF_TYPE_FLOAT64:
            rc = core_gguf_kv_float(g, i, &fv, NULL) || core_gguf_writer_set_float(w, key, t, fv);
            break;
        case CORE_GGUF_TYPE_BOOL:
            rc = core_gguf_kv_int(g, i, &iv, NULL) || core_gguf_writer_set_bool(w, key, (int)iv);
            break;
        case CORE_GGUF_TYPE_STRING:
            rc = core_gguf_kv_str(g, i, &s, NULL) || core_gguf_writer_set_str(w, key, s.ptr, (size_t)s.len);
            break;
        case CORE_GGUF_TYPE_ARRAY: {
            rc = core_gguf_kv_arr(g, i, &a, NULL);
            if (rc) break;
            if (a.type == CORE_GGUF_TYPE_STRING) {
                core_gguf_str_t *sv = malloc((a.n ? a.n : 1) * sizeof *sv);
                for (uint64_t k = 0; k < a.n; k++) core_gguf_arr_str(&a, k, &sv[k]);
                rc = core_gguf_writer_set_arr(w, key, a.type, sv, a.n);
                free(sv);
            } else if (a.type == CORE_GGUF_TYPE_ARRAY) {
                core_gguf_arr_t *av = malloc((a.n ? a.n : 1) * sizeof *av);
                for (uint64_t k = 0; k < a.n; k++) core_gguf_arr_arr(&a, k, &av[k]);
                rc = core_gguf_writer_set_arr(w, key, a.type, av, a.n);
                free(av);
            } else {
                /* repack scalars at their width (little-endian low bytes) */
                size_t es = a.type == CORE_GGUF_TYPE_UINT64 || a.type == CORE_GGUF_TYPE_INT64 ||
                                    a.type == CORE_GGUF_TYPE_FLOAT64 ? 8
                            : a.type == CORE_GGUF_TYPE_UINT32 || a.type == CORE_GGUF_TYPE_INT32 ||
                                    a.type == CORE_GGUF_TYPE_FLOAT32 ? 4
                            : a.type == CORE_GGUF_TYPE_UINT16 || a.type == CORE_GGUF_TYPE_INT16 ? 2 : 1;
                uint8_t *buf = malloc((size_t)(a.n ? a.n : 1) * es);
                for (uint64_t k = 0; k < a.n; k++) {
                    if (a.type == CORE_GGUF_TYPE_FLOAT32) {
                        core_gguf_arr_float(&a, k, &fv);
                        float f = (float)fv;
                        memcpy(buf + k * es, &f, 4);
                    } else if (a.type == CORE_GGUF_TYPE_FLOAT64) {
                        core_gguf_arr_float(&a, k, &fv);
                        memcpy(buf + k * es, &fv, 8);
                    } else {
                        core_gguf_arr_int(&a, k, &iv);
                        memcpy(buf + k * es, &iv, es);
                    }
                }
                rc = core_gguf_writer_set_arr(w, key, a.type, buf, a.n);
                free(buf);
            }
            break;
        }
        default:
            rc = core_gguf_kv_int(g, i, &iv, NULL) || core_gguf_writer_set_int(w, key, t, iv);
            break;
        }
        if (rc) printf("  copy: key %s failed (%d)\n", key, rc);
    }
    for (int64_t i = 0; i < core_gguf_n_tensors(g) && !rc; i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        rc = core_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    if (rc) {
        core_gguf_writer_free(w);
        return NULL;
    }
    return w;
}

TEST(rewriting_the_real_model_reproduces_it)
{
    /* The model was written by llama.cpp's converter (gguf-py): same layout
     * rules as ours, so a faithful copy must be identical byte for byte. */
    size_t n = 0;
    uint8_t *img = (uint8_t *)slurp(model_path(), &n);
    CHECK_MSG(img != NULL, "cannot read %s", model_path());
    if (!img) return;
    core_gguf_t *g = open_ok(img, n);
    core_gguf_writer_t *w = g ? copy_into_writer(g) : NULL;
    CHECK(w != NULL);
    char dir[] = "/tmp/test_core_gguf_m.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/copy.gguf", dir);
    core_error_t err = {0};
    if (w) CHECK_MSG(core_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
    size_t m = 0;
    uint8_t *copy = w ? (uint8_t *)slurp(path, &m) : NULL;
    CHECK(copy != NULL && m == n);
    if (copy && m == n) {
        size_t i = 0;
        while (i < n && img[i] == copy[i]) i++;
        CHECK_MSG(i == n, "first difference at byte %zu of %zu", i, n);
    }
    free(copy);
    core_gguf_writer_free(w);
    core_gguf_close(g);
    unlink(path);
    rmdir(dir);
    free(img);
}

/* ---- fuzz corpus replay ---- */

/* Touches everything a successful open hands out. */
static void walk_arr(const core_gguf_arr_t *a, uint64_t *sink)
{
    for (uint64_t i = 0; i < a->n; i++) {
        int64_t iv = 0;
        double fv = 0;
        core_gguf_str_t s = {0};
        core_gguf_arr_t sub;
        if (core_gguf_arr_int(a, i, &iv) == 0) *sink += (uint64_t)iv;
        if (core_gguf_arr_float(a, i, &fv) == 0) *sink += (uint64_t)(fv != fv);
        if (core_gguf_arr_str(a, i, &s) == 0 && s.len) *sink += (uint8_t)s.ptr[s.len - 1];
        if (core_gguf_arr_arr(a, i, &sub) == 0) walk_arr(&sub, sink);
    }
}

static uint64_t walk(const core_gguf_t *g)
{
    uint64_t sink = 0;
    for (int64_t i = 0; i < core_gguf_n_kv(g); i++) {
        int64_t iv;
        double fv;
        core_gguf_str_t s;
        core_gguf_arr_t a;
        sink += strlen(core_gguf_kv_key(g, i));
        if (core_gguf_kv_int(g, i, &iv, NULL) == 0) sink += (uint64_t)iv;
        if (core_gguf_kv_float(g, i, &fv, NULL) == 0) sink += (uint64_t)(fv != fv);
        if (core_gguf_kv_str(g, i, &s, NULL) == 0 && s.len) sink += (uint8_t)s.ptr[0];
        if (core_gguf_kv_arr(g, i, &a, NULL) == 0) walk_arr(&a, &sink);
    }
    for (int64_t i = 0; i < core_gguf_n_tensors(g); i++) {
        const core_gguf_tensor_t *t = core_gguf_tensor(g, i);
        if (core_gguf_find_tensor(g, t->name) != t) sink += 1000000;
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    return sink;
}

TEST(fuzz_corpus_replays)
{
    const char *dirname = "tests/fuzz/corpus/gguf";
    DIR *d = opendir(dirname);
    CHECK_MSG(d != NULL, "cannot open %s (run from the repository root)", dirname);
    if (!d) return;
    int files = 0, opened = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dirname, e->d_name);
        size_t n = 0;
        uint8_t *p = (uint8_t *)slurp(path, &n);
        CHECK_MSG(p != NULL, "%s", path);
        if (!p) continue;
        uint8_t *exact = malloc(n ? n : 1); /* exactly sized, for ASan */
        memcpy(exact, p, n);
        free(p);
        core_gguf_t *g = NULL;
        core_error_t err = {0};
        int rc = core_gguf_open_memory(exact, n, &g, &err);
        if (rc == 0) {
            opened++;
            (void)walk(g);
        } else {
            CHECK_MSG(err.msg[0] != '\0' && rc < 0, "%s: rc %d, empty message", path, rc);
        }
        core_gguf_close(g);
        free(exact);
        files++;
    }
    closedir(d);
    CHECK_MSG(files >= 10, "only %d corpus files", files);
    CHECK(opened >= 1);
}

int main(void)
{
    RUN(small_file_reads_back);
    RUN(version_2_is_read_and_others_refused);
    RUN(every_truncation_is_rejected);
    RUN(absurd_counts_and_lengths_are_rejected);
    RUN(nesting_depth_is_bounded);
    RUN(bad_tensor_infos_are_rejected);
    RUN(duplicate_keys_are_rejected);
    RUN(general_alignment_is_honoured_and_checked);
    RUN(getters_convert_types);
    RUN(big_string_array_is_indexed);
    RUN(real_model_reads);
    RUN(real_model_damaged_copies_are_rejected);
    RUN(release_keeps_the_bytes);
    RUN(writer_round_trip);
    RUN(writer_rejects_bad_input);
    RUN(rewriting_the_real_model_reproduces_it);
    RUN(fuzz_corpus_replays);
    return CHECK_DONE();
}
