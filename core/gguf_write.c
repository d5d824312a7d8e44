/* core/gguf_write.c — GGUF v3 writer (core/gguf.h).
 *
 * Everything is serialized in memory by the setters, laid out on write, and
 * published with temp file + fsync + rename (+ fsync of the directory,
 * core/atomic_file.h) so a crash never leaves a half-written model behind.
 *
 * Little-endian host assumed, as GGUF files are little-endian in practice.
 */
#include "core/gguf.h"
#include "core/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/tensor.h"

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static int buf_put(buf_t *b, const void *src, size_t n)
{
    if (n > SIZE_MAX - b->len) return CORE_ENOMEM;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) {
            if (cap > SIZE_MAX / 2) return CORE_ENOMEM;
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) return CORE_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static int buf_u32(buf_t *b, uint32_t v) { return buf_put(b, &v, 4); }
static int buf_u64(buf_t *b, uint64_t v) { return buf_put(b, &v, 8); }
static int buf_str(buf_t *b, const char *s, size_t n)
{
    int rc = buf_u64(b, n);
    return rc ? rc : buf_put(b, s, n);
}

typedef struct wtensor {
    char *name;
    int type;
    uint32_t n_dims;
    int64_t ne[CORE_GGUF_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} wtensor_t;

struct core_gguf_writer {
    uint32_t alignment;
    buf_t kv;    /* serialized metadata entries */
    int64_t n_kv;
    char **keys; /* [n_kv] for duplicate detection */
    size_t keys_cap;
    wtensor_t *tensors;
    int64_t n_tensors;
    size_t tensors_cap;
};

static int w_has_key(const core_gguf_writer_t *w, const char *key)
{
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return 1;
    return 0;
}

/* Starts an entry: checks the key, records it, writes key and value type. The
 * caller appends the value; on failure the buffer is rolled back to *mark. */
static int w_begin(core_gguf_writer_t *w, const char *key, core_gguf_type_t type, size_t *mark)
{
    if (!w || !key) return CORE_EINVAL;
    size_t klen = strlen(key);
    if (klen == 0 || klen > GGUF_MAX_KEY_LEN || w_has_key(w, key)) return CORE_EINVAL;
    *mark = w->kv.len;
    int rc = buf_str(&w->kv, key, klen);
    if (!rc) rc = buf_u32(&w->kv, (uint32_t)type);
    if (rc) w->kv.len = *mark;
    return rc;
}

static int w_commit(core_gguf_writer_t *w, const char *key, size_t mark, int rc)
{
    if (!rc && (size_t)w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) rc = CORE_ENOMEM;
        else {
            w->keys = k;
            w->keys_cap = cap;
        }
    }
    char *copy = rc ? NULL : strdup(key);
    if (!rc && !copy) rc = CORE_ENOMEM;
    if (rc) {
        w->kv.len = mark;
        return rc;
    }
    w->keys[w->n_kv++] = copy;
    return 0;
}

static int int_fits(core_gguf_type_t t, int64_t v)
{
    switch (t) {
    case CORE_GGUF_TYPE_UINT8: return v >= 0 && v <= UINT8_MAX;
    case CORE_GGUF_TYPE_INT8: return v >= INT8_MIN && v <= INT8_MAX;
    case CORE_GGUF_TYPE_UINT16: return v >= 0 && v <= UINT16_MAX;
    case CORE_GGUF_TYPE_INT16: return v >= INT16_MIN && v <= INT16_MAX;
    case CORE_GGUF_TYPE_UINT32: return v >= 0 && v <= UINT32_MAX;
    case CORE_GGUF_TYPE_INT32: return v >= INT32_MIN && v <= INT32_MAX;
    case CORE_GGUF_TYPE_UINT64: return v >= 0;
    case CORE_GGUF_TYPE_INT64: return 1;
    default: return 0;
    }
}

int core_gguf_writer_set_int(core_gguf_writer_t *w, const char *key, core_gguf_type_t type, int64_t v)
{
    if (!w || !key || type == CORE_GGUF_TYPE_BOOL || !core_gguf_is_int_type(type)) return CORE_EINVAL;
    if (!int_fits(type, v)) return CORE_ERANGE;
    /* The reader takes the layout from this key: it must agree with ours. */
    if (strcmp(key, "general.alignment") == 0 &&
        (type != CORE_GGUF_TYPE_UINT32 || (uint64_t)v != w->alignment))
        return CORE_EINVAL;
    size_t mark;
    int rc = w_begin(w, key, type, &mark);
    if (rc) return rc;
    /* Little-endian: the low bytes of v are the value in any width. */
    rc = buf_put(&w->kv, &v, core_gguf_scalar_size(type));
    return w_commit(w, key, mark, rc);
}

int core_gguf_writer_set_float(core_gguf_writer_t *w, const char *key, core_gguf_type_t type, double v)
{
    if (type != CORE_GGUF_TYPE_FLOAT32 && type != CORE_GGUF_TYPE_FLOAT64) return CORE_EINVAL;
    size_t mark;
    int rc = w_begin(w, key, type, &mark);
    if (rc) return rc;
    if (type == CORE_GGUF_TYPE_FLOAT32) {
        float f = (float)v;
        rc = buf_put(&w->kv, &f, 4);
    } else {
        rc = buf_put(&w->kv, &v, 8);
    }
    return w_commit(w, key, mark, rc);
}

int core_gguf_writer_set_bool(core_gguf_writer_t *w, const char *key, int v)
{
    size_t mark;
    int rc = w_begin(w, key, CORE_GGUF_TYPE_BOOL, &mark);
    if (rc) return rc;
    uint8_t b = v != 0;
    rc = buf_put(&w->kv, &b, 1);
    return w_commit(w, key, mark, rc);
}

int core_gguf_writer_set_str(core_gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    if (!s && len) return CORE_EINVAL;
    size_t mark;
    int rc = w_begin(w, key, CORE_GGUF_TYPE_STRING, &mark);
    if (rc) return rc;
    rc = buf_str(&w->kv, s, len);
    return w_commit(w, key, mark, rc);
}

/* Serializes a reader's array body (type, n, elements) into b. */
static int w_copy_arr(buf_t *b, const core_gguf_arr_t *a, int depth)
{
    if (depth >= GGUF_MAX_DEPTH) return CORE_EINVAL;
    int rc = buf_u32(b, (uint32_t)a->type);
    if (!rc) rc = buf_u64(b, a->n);
    size_t es = core_gguf_scalar_size(a->type);
    if (rc) return rc;
    if (es) return buf_put(b, core_gguf_arr_data(a), (size_t)a->n * es);
    for (uint64_t i = 0; i < a->n && !rc; i++) {
        if (a->type == CORE_GGUF_TYPE_STRING) {
            core_gguf_str_t s = {NULL, 0};
            rc = core_gguf_arr_str(a, i, &s);
            if (!rc) rc = buf_str(b, s.ptr, (size_t)s.len);
        } else {
            core_gguf_arr_t sub;
            rc = core_gguf_arr_arr(a, i, &sub);
            if (!rc) rc = w_copy_arr(b, &sub, depth + 1);
        }
    }
    return rc;
}

int core_gguf_writer_set_arr(core_gguf_writer_t *w, const char *key, core_gguf_type_t elem_type,
                             const void *data, uint64_t n)
{
    /* Scalars are packed as in the file. Two extensions of the header's
     * contract, both reading element structs (borrowed) instead of packed
     * bytes: elem_type STRING takes n core_gguf_str_t (strings that may hold
     * NUL bytes), elem_type ARRAY takes n core_gguf_arr_t from an open reader
     * whose contents are copied (the only way to write nested arrays). */
    size_t es = core_gguf_scalar_size(elem_type);
    if (elem_type != CORE_GGUF_TYPE_ARRAY && elem_type != CORE_GGUF_TYPE_STRING && !es) return CORE_EINVAL;
    if (n && !data) return CORE_EINVAL;
    size_t esz = es ? es : elem_type == CORE_GGUF_TYPE_STRING ? sizeof(core_gguf_str_t) : sizeof(core_gguf_arr_t);
    if (n > SIZE_MAX / esz) return CORE_ERANGE;
    if (elem_type == CORE_GGUF_TYPE_STRING) {
        const core_gguf_str_t *sv = data;
        for (uint64_t i = 0; i < n; i++)
            if ((!sv[i].ptr && sv[i].len) || sv[i].len > SIZE_MAX) return CORE_EINVAL;
    }
    size_t mark;
    int rc = w_begin(w, key, CORE_GGUF_TYPE_ARRAY, &mark);
    if (rc) return rc;
    rc = buf_u32(&w->kv, (uint32_t)elem_type);
    if (!rc) rc = buf_u64(&w->kv, n);
    if (!rc && es) rc = buf_put(&w->kv, data, (size_t)n * es);
    if (!rc && elem_type == CORE_GGUF_TYPE_STRING) {
        const core_gguf_str_t *sv = data;
        for (uint64_t i = 0; i < n && !rc; i++) rc = buf_str(&w->kv, sv[i].ptr, (size_t)sv[i].len);
    }
    if (!rc && elem_type == CORE_GGUF_TYPE_ARRAY) {
        const core_gguf_arr_t *subs = data;
        for (uint64_t i = 0; i < n && !rc; i++) rc = w_copy_arr(&w->kv, &subs[i], 1);
    }
    return w_commit(w, key, mark, rc);
}

int core_gguf_writer_set_arr_str(core_gguf_writer_t *w, const char *key, const char *const *strs, uint64_t n)
{
    if (n && !strs) return CORE_EINVAL;
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i]) return CORE_EINVAL;
    size_t mark;
    int rc = w_begin(w, key, CORE_GGUF_TYPE_ARRAY, &mark);
    if (rc) return rc;
    rc = buf_u32(&w->kv, CORE_GGUF_TYPE_STRING);
    if (!rc) rc = buf_u64(&w->kv, n);
    for (uint64_t i = 0; i < n && !rc; i++) rc = buf_str(&w->kv, strs[i], strlen(strs[i]));
    return w_commit(w, key, mark, rc);
}

core_gguf_writer_t *core_gguf_writer_new(uint32_t alignment)
{
    if (alignment == 0) alignment = GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) != 0 || alignment > GGUF_MAX_ALIGNMENT) return NULL;
    core_gguf_writer_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = alignment;
    /* A reader assumes 32 unless told: say so when we differ. */
    if (alignment != GGUF_DEFAULT_ALIGNMENT &&
        core_gguf_writer_set_int(w, "general.alignment", CORE_GGUF_TYPE_UINT32, alignment) != 0) {
        core_gguf_writer_free(w);
        return NULL;
    }
    return w;
}

void core_gguf_writer_free(core_gguf_writer_t *w)
{
    if (!w) return;
    free(w->kv.p);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w);
}

int core_gguf_writer_add_tensor(core_gguf_writer_t *w, const char *name, int type, uint32_t n_dims,
                                const int64_t *ne, const void *data, size_t nbytes)
{
    if (!w || !name || !ne || n_dims == 0 || n_dims > CORE_GGUF_MAX_DIMS) return CORE_EINVAL;
    size_t nlen = strlen(name);
    if (nlen > GGUF_MAX_NAME_LEN || core_ttype_block_bytes(type) == 0) return CORE_EINVAL;
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return CORE_EINVAL;
    int64_t rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return CORE_EINVAL;
        if (d > 0) {
            if (ne[d] > INT64_MAX / rows) return CORE_ERANGE;
            rows *= ne[d];
        }
    }
    size_t row;
    int rc = core_ttype_row_bytes(type, ne[0], &row);
    if (rc) return rc;
    if (row != 0 && (uint64_t)rows > SIZE_MAX / row) return CORE_ERANGE;
    if (row * (size_t)rows != nbytes || (nbytes && !data)) return CORE_EINVAL;
    if ((size_t)w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 16;
        wtensor_t *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return CORE_ENOMEM;
        w->tensors = t;
        w->tensors_cap = cap;
    }
    wtensor_t *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return CORE_ENOMEM;
    }
    if (nbytes) memcpy(t->data, data, nbytes);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < CORE_GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    w->n_tensors++;
    return 0;
}

static size_t pad_to(size_t x, size_t a) { return (a - x % a) % a; }

static int write_zeros(core_afile_t *af, size_t n)
{
    static const uint8_t zeros[64];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (core_afile_write(af, zeros, k))
            return -1;
        n -= k;
    }
    return 0;
}

int core_gguf_writer_write(const core_gguf_writer_t *w, const char *path, core_error_t *err)
{
    if (!w || !path) return GGUF_FAIL(err, CORE_EINVAL, "gguf writer: invalid argument");
    buf_t head = {0};
    char *tmp = NULL;
    core_afile_t af;
    int rc = 0;

    /* Header, metadata and tensor infos in memory; data is streamed after. */
    rc = buf_put(&head, GGUF_MAGIC, 4);
    if (!rc) rc = buf_u32(&head, 3);
    if (!rc) rc = buf_u64(&head, (uint64_t)w->n_tensors);
    if (!rc) rc = buf_u64(&head, (uint64_t)w->n_kv);
    if (!rc) rc = buf_put(&head, w->kv.p, w->kv.len);
    size_t off = 0;
    for (int64_t i = 0; i < w->n_tensors && !rc; i++) {
        const wtensor_t *t = &w->tensors[i];
        rc = buf_str(&head, t->name, strlen(t->name));
        if (!rc) rc = buf_u32(&head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && !rc; d++) rc = buf_u64(&head, (uint64_t)t->ne[d]);
        if (!rc) rc = buf_u32(&head, (uint32_t)t->type);
        if (!rc) rc = buf_u64(&head, off);
        off += t->nbytes + pad_to(t->nbytes, w->alignment);
    }
    if (rc) {
        rc = GGUF_FAIL(err, CORE_ENOMEM, "gguf writer: out of memory");
        goto fail;
    }

    size_t plen = strlen(path);
    tmp = malloc(plen + 16);
    if (!tmp) {
        rc = GGUF_FAIL(err, CORE_ENOMEM, "gguf writer: out of memory");
        goto fail;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    /* temp file, fsync, rename, fsync of the directory (core/atomic_file.h) */
    if (core_afile_open(&af, AT_FDCWD, path, tmp, 0600) != 0) {
        rc = GGUF_FAIL(err, CORE_EIO, "gguf writer: cannot create temp file for '%s': %s", path,
                       strerror(af.errnum));
        goto fail;
    }
    if (fchmod(af.fd, 0644) != 0) {
        af.errnum = errno;
        core_afile_abort(&af);
        goto io_fail;
    }
    if (core_afile_write(&af, head.p, head.len) != 0 ||
        (w->n_tensors > 0 && write_zeros(&af, pad_to(head.len, w->alignment)) != 0))
        goto io_fail;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const wtensor_t *t = &w->tensors[i];
        if (core_afile_write(&af, t->data, t->nbytes) != 0 ||
            write_zeros(&af, pad_to(t->nbytes, w->alignment)) != 0)
            goto io_fail;
    }
    /* a failed fsync of the directory is no error here: the file is in place */
    if (core_afile_commit(&af) != 0 && !af.renamed)
        goto io_fail;
    free(tmp);
    free(head.p);
    return 0;

io_fail:
    rc = GGUF_FAIL(err, CORE_EIO, "gguf writer: writing '%s': %s", path, strerror(af.errnum));
fail:
    free(tmp);
    free(head.p);
    return rc;
}
