/* core/gguf.c — GGUF v2/v3 reader (mmap or caller memory).
 *
 * Reader: one validating pass over the header, metadata and tensor infos.
 * Every length is compared with the bytes that remain before it is used, and
 * every count is bounded by the smallest encoding of one element before it
 * sizes an allocation, so the memory we allocate is at most a small constant
 * times the file size whatever the file claims. Arrays keep an index built in
 * that pass (element offsets for strings, child descriptors for nested arrays)
 * so element i is found in O(1): the tokenizer reads 49152-entry string arrays
 * by index. Nesting is bounded (GGUF_MAX_DEPTH) so a depth bomb cannot blow the
 * stack. Keys and tensor names go into hash tables, which also reject
 * duplicates without an O(n^2) scan on hostile counts.
 *
 * The writer is core/gguf_write.c.
 *
 * Little-endian host assumed, as GGUF files are little-endian in practice.
 */
#include "core/gguf.h"
#include "core/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/tensor.h"

typedef struct arr_impl arr_impl_t;
struct arr_impl {
    core_gguf_type_t type; /* element type */
    uint64_t n;
    size_t data; /* scalars: offset of element 0 in the buffer */
    size_t *str; /* strings: [n] offsets of each element's length field */
    arr_impl_t *sub; /* arrays: [n] child descriptors */
};

typedef struct kv {
    char *key; /* owned, NUL-terminated */
    core_gguf_type_t type;
    size_t val; /* offset of the value in the buffer */
    arr_impl_t arr; /* when type is ARRAY */
} kv_t;

/* Open addressing over indices into kvs / tensors; slot value -1 is empty. */
typedef struct htab {
    int64_t *slot;
    size_t mask;
} htab_t;

struct core_gguf {
    const uint8_t *base;
    size_t size;
    int mapped; /* base is our mmap */
    uint32_t version;
    uint32_t alignment;
    size_t data_off; /* start of the data section */
    int64_t n_kv;
    kv_t *kvs;
    int64_t n_tensors;
    core_gguf_tensor_t *tensors;
    htab_t kv_idx;
    htab_t tensor_idx;
};

/* ---- byte cursor ---- */

typedef struct cur {
    const uint8_t *base;
    size_t size;
    size_t pos;
    core_error_t *err;
} cur_t;

static size_t cur_left(const cur_t *c) { return c->size - c->pos; }

/* Reads n bytes; on shortage records which field and where. */
static int cur_read(cur_t *c, void *dst, size_t n, const char *what, const char *ctx)
{
    if (cur_left(c) < n)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: truncated: %s%s%s needs %zu bytes at offset %zu, file size %zu",
                              ctx ? ctx : "", ctx ? ": " : "", what, n, c->pos, c->size);
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int cur_u32(cur_t *c, uint32_t *v, const char *what, const char *ctx)
{
    return cur_read(c, v, sizeof *v, what, ctx);
}

static int cur_u64(cur_t *c, uint64_t *v, const char *what, const char *ctx)
{
    return cur_read(c, v, sizeof *v, what, ctx);
}

/* A string: u64 length then bytes. Gives the offset of the bytes and length. */
static int cur_str(cur_t *c, size_t *off, uint64_t *len, uint64_t max_len, const char *what,
                   const char *ctx)
{
    size_t at = c->pos;
    int rc = cur_u64(c, len, what, ctx);
    if (rc) return rc;
    if (*len > max_len)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: %s%s%s length %" PRIu64 " at offset %zu exceeds limit %" PRIu64,
                              ctx ? ctx : "", ctx ? ": " : "", what, *len, at, max_len);
    if (*len > cur_left(c))
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: %s%s%s length %" PRIu64 " at offset %zu runs past end of file (size %zu)",
                              ctx ? ctx : "", ctx ? ": " : "", what, *len, at, c->size);
    *off = c->pos;
    c->pos += (size_t)*len;
    return 0;
}

/* ---- hash tables ---- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int htab_init(htab_t *t, int64_t n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap <<= 1;
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->slot) return CORE_ENOMEM;
    for (size_t i = 0; i < cap; i++) t->slot[i] = -1;
    t->mask = cap - 1;
    return 0;
}

/* Finds name; names(i) maps an index to its string. */
typedef const char *(*name_of_fn)(const core_gguf_t *g, int64_t i);

static int64_t htab_find(const htab_t *t, const core_gguf_t *g, name_of_fn names, const char *s,
                         size_t *slot_out)
{
    size_t i = (size_t)hash_str(s) & t->mask;
    while (t->slot[i] >= 0) {
        if (strcmp(names(g, t->slot[i]), s) == 0) {
            if (slot_out) *slot_out = i;
            return t->slot[i];
        }
        i = (i + 1) & t->mask;
    }
    if (slot_out) *slot_out = i;
    return -1;
}

static const char *kv_name(const core_gguf_t *g, int64_t i) { return g->kvs[i].key; }
static const char *tensor_name(const core_gguf_t *g, int64_t i) { return g->tensors[i].name; }

/* ---- parsing ---- */

size_t core_gguf_scalar_size(core_gguf_type_t t)
{
    switch (t) {
    case CORE_GGUF_TYPE_UINT8:
    case CORE_GGUF_TYPE_INT8:
    case CORE_GGUF_TYPE_BOOL: return 1;
    case CORE_GGUF_TYPE_UINT16:
    case CORE_GGUF_TYPE_INT16: return 2;
    case CORE_GGUF_TYPE_UINT32:
    case CORE_GGUF_TYPE_INT32:
    case CORE_GGUF_TYPE_FLOAT32: return 4;
    case CORE_GGUF_TYPE_UINT64:
    case CORE_GGUF_TYPE_INT64:
    case CORE_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static int valid_type(uint32_t t) { return t <= CORE_GGUF_TYPE_FLOAT64; }

static void arr_free(arr_impl_t *a)
{
    if (a->sub) {
        for (uint64_t i = 0; i < a->n; i++) arr_free(&a->sub[i]);
        free(a->sub);
    }
    free(a->str);
    a->sub = NULL;
    a->str = NULL;
}

/* Parses an array body (type, n, elements) at the cursor into *a. key names
 * the metadata key for messages; depth counts enclosing arrays. */
static int parse_arr(cur_t *c, arr_impl_t *a, const char *key, int depth)
{
    size_t at = c->pos;
    uint32_t et;
    uint64_t n;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = cur_u32(c, &et, "array element type", key))) return rc;
    if ((rc = cur_u64(c, &n, "array length", key))) return rc;
    if (!valid_type(et))
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: key '%s': array at offset %zu has invalid element type %" PRIu32,
                              key, at, et);
    if (et == CORE_GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_DEPTH)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: key '%s': arrays nested deeper than %d at offset %zu", key,
                              GGUF_MAX_DEPTH, at);
    a->type = (core_gguf_type_t)et;
    size_t es = core_gguf_scalar_size(a->type);
    /* Smallest element: a scalar's size, an empty string (8), an empty array (12). */
    size_t min_elem = es ? es : (et == CORE_GGUF_TYPE_STRING ? 8 : 12);
    if (n > cur_left(c) / min_elem)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: key '%s': array length %" PRIu64 " at offset %zu cannot fit in the %zu bytes left",
                              key, n, at, cur_left(c));
    a->n = n;
    if (es) {
        a->data = c->pos;
        c->pos += (size_t)n * es;
        return 0;
    }
    if (et == CORE_GGUF_TYPE_STRING) {
        a->str = malloc((size_t)(n ? n : 1) * sizeof *a->str);
        if (!a->str) return GGUF_FAIL(c->err, CORE_ENOMEM, "gguf: key '%s': out of memory", key);
        for (uint64_t i = 0; i < n; i++) {
            size_t off;
            uint64_t len;
            a->str[i] = c->pos;
            if ((rc = cur_str(c, &off, &len, SIZE_MAX, "array string", key))) {
                /* Name the element too; the cursor message has the offset. */
                char msg[CORE_ERROR_MSG_MAX];
                if (c->err) {
                    memcpy(msg, c->err->msg, sizeof msg);
                    core_error_set(c->err, rc, "%s (element %" PRIu64 " of %" PRIu64 ")", msg, i, n);
                }
                return rc;
            }
        }
        return 0;
    }
    a->sub = calloc((size_t)(n ? n : 1), sizeof *a->sub);
    if (!a->sub) return GGUF_FAIL(c->err, CORE_ENOMEM, "gguf: key '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++) {
        if ((rc = parse_arr(c, &a->sub[i], key, depth + 1))) return rc;
    }
    return 0;
}

static int parse_kv(core_gguf_t *g, cur_t *c, kv_t *kv, int64_t idx)
{
    size_t at = c->pos, koff;
    uint64_t klen;
    uint32_t t;
    char ctx[64];
    int rc;
    snprintf(ctx, sizeof ctx, "metadata entry %" PRId64, idx);
    if ((rc = cur_str(c, &koff, &klen, GGUF_MAX_KEY_LEN, "key", ctx))) return rc;
    if (klen == 0)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: %s: empty key at offset %zu", ctx, at);
    if (memchr(c->base + koff, 0, (size_t)klen))
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: %s: key at offset %zu contains a NUL byte",
                              ctx, at);
    kv->key = malloc((size_t)klen + 1);
    if (!kv->key) return GGUF_FAIL(c->err, CORE_ENOMEM, "gguf: out of memory");
    memcpy(kv->key, c->base + koff, (size_t)klen);
    kv->key[klen] = '\0';
    size_t slot;
    if (htab_find(&g->kv_idx, g, kv_name, kv->key, &slot) >= 0)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: duplicate key '%s' at offset %zu", kv->key, at);
    size_t tat = c->pos;
    if ((rc = cur_u32(c, &t, "value type", kv->key))) return rc;
    if (!valid_type(t))
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: key '%s': invalid value type %" PRIu32 " at offset %zu",
                              kv->key, t, tat);
    kv->type = (core_gguf_type_t)t;
    kv->val = c->pos;
    size_t es = core_gguf_scalar_size(kv->type);
    if (es) {
        if (cur_left(c) < es)
            return GGUF_FAIL(c->err, CORE_EFORMAT,
                                  "gguf: truncated: key '%s': value needs %zu bytes at offset %zu, file size %zu",
                                  kv->key, es, c->pos, c->size);
        c->pos += es;
    } else if (kv->type == CORE_GGUF_TYPE_STRING) {
        size_t off;
        uint64_t len;
        if ((rc = cur_str(c, &off, &len, SIZE_MAX, "string value", kv->key))) return rc;
    } else {
        if ((rc = parse_arr(c, &kv->arr, kv->key, 0))) return rc;
    }
    /* Index only once fully parsed, so the table never names a broken entry. */
    g->kv_idx.slot[slot] = idx;
    return 0;
}

static int get_alignment(core_gguf_t *g, core_error_t *err)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = core_gguf_find_key(g, "general.alignment");
    if (i < 0) return 0;
    const kv_t *kv = &g->kvs[i];
    if (kv->type != CORE_GGUF_TYPE_UINT32)
        return GGUF_FAIL(err, CORE_EFORMAT, "gguf: key 'general.alignment' has type %d, expected uint32",
                              (int)kv->type);
    uint32_t a;
    memcpy(&a, g->base + kv->val, sizeof a);
    if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
        return GGUF_FAIL(err, CORE_EFORMAT,
                              "gguf: key 'general.alignment' = %" PRIu32 " is not a power of two <= %u", a,
                              GGUF_MAX_ALIGNMENT);
    g->alignment = a;
    return 0;
}

static int parse_tensor_info(core_gguf_t *g, cur_t *c, core_gguf_tensor_t *t, int64_t idx)
{
    size_t at = c->pos, noff;
    uint64_t nlen;
    uint32_t nd, type;
    char ctx[64];
    int rc;
    snprintf(ctx, sizeof ctx, "tensor info %" PRId64, idx);
    if ((rc = cur_str(c, &noff, &nlen, GGUF_MAX_NAME_LEN, "name", ctx))) return rc;
    if (nlen == 0) return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: %s: empty name at offset %zu", ctx, at);
    if (memchr(c->base + noff, 0, (size_t)nlen))
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: %s: name at offset %zu contains a NUL byte", ctx, at);
    char *name = malloc((size_t)nlen + 1);
    if (!name) return GGUF_FAIL(c->err, CORE_ENOMEM, "gguf: out of memory");
    memcpy(name, c->base + noff, (size_t)nlen);
    name[nlen] = '\0';
    t->name = name;
    if ((rc = cur_u32(c, &nd, "n_dims", name))) return rc;
    if (nd == 0 || nd > CORE_GGUF_MAX_DIMS)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: tensor '%s': n_dims %" PRIu32 " not in 1..%d (offset %zu)",
                              name, nd, CORE_GGUF_MAX_DIMS, at);
    t->n_dims = nd;
    uint64_t ne[CORE_GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < nd; d++) {
        if ((rc = cur_u64(c, &ne[d], "dimension", name))) return rc;
    }
    if ((rc = cur_u32(c, &type, "type", name))) return rc;
    if ((rc = cur_u64(c, &t->offset, "data offset", name))) return rc;

    int64_t prod = 1;
    for (uint32_t d = 0; d < CORE_GGUF_MAX_DIMS; d++) {
        if (ne[d] == 0)
            return GGUF_FAIL(c->err, CORE_EUNSUPPORTED, "gguf: tensor '%s': dimension %" PRIu32 " is 0",
                                  name, d);
        if (ne[d] > (uint64_t)INT64_MAX || (int64_t)ne[d] > INT64_MAX / prod)
            return GGUF_FAIL(c->err, CORE_EFORMAT,
                                  "gguf: tensor '%s': element count overflows at dimension %" PRIu32
                                  " (ne=%" PRIu64 ")",
                                  name, d, ne[d]);
        t->ne[d] = (int64_t)ne[d];
        prod *= t->ne[d];
    }
    if (core_ttype_block_bytes((int)type) == 0 || type >= CORE_TTYPE_COUNT_)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: tensor '%s': unknown type id %" PRIu32, name, type);
    t->type = (int)type;
    size_t row;
    rc = core_ttype_row_bytes(t->type, t->ne[0], &row);
    if (rc)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: tensor '%s': row length %" PRId64 " is not a multiple of %s's block of %" PRId64,
                              name, t->ne[0], core_ttype_name(t->type), core_ttype_block_elems(t->type));
    uint64_t rows = (uint64_t)(prod / t->ne[0]);
    if (row != 0 && rows > SIZE_MAX / row)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: tensor '%s': byte size overflows", name);
    t->nbytes = row * (size_t)rows;
    if (t->offset % g->alignment != 0)
        return GGUF_FAIL(c->err, CORE_EFORMAT,
                              "gguf: tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                              name, t->offset, g->alignment);
    size_t slot;
    if (htab_find(&g->tensor_idx, g, tensor_name, name, &slot) >= 0)
        return GGUF_FAIL(c->err, CORE_EFORMAT, "gguf: duplicate tensor name '%s' (tensor info %" PRId64 ")",
                              name, idx);
    g->tensor_idx.slot[slot] = idx;
    return 0;
}

static int parse(core_gguf_t *g, core_error_t *err)
{
    cur_t c = {g->base, g->size, 0, err};
    char magic[4];
    uint64_t n_tensors, n_kv;
    int rc;
    if ((rc = cur_read(&c, magic, 4, "magic", NULL))) return rc;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return GGUF_FAIL(err, CORE_EFORMAT, "gguf: bad magic at offset 0 (not a GGUF file)");
    if ((rc = cur_u32(&c, &g->version, "version", NULL))) return rc;
    if (g->version == 1)
        return GGUF_FAIL(err, CORE_EUNSUPPORTED, "gguf: version 1 (offset 4) is not supported, only 2 and 3");
    if (g->version != 2 && g->version != 3)
        return GGUF_FAIL(err, CORE_EUNSUPPORTED,
                              "gguf: unsupported version %" PRIu32 " at offset 4 (supported: 2, 3; a big-endian file reads as 0x03000000)",
                              g->version);
    if ((rc = cur_u64(&c, &n_tensors, "n_tensors", NULL))) return rc;
    if ((rc = cur_u64(&c, &n_kv, "n_kv", NULL))) return rc;
    if (n_kv > cur_left(&c) / GGUF_MIN_KV_BYTES)
        return GGUF_FAIL(err, CORE_EFORMAT, "gguf: n_kv %" PRIu64 " (offset 16) cannot fit in a file of %zu bytes (truncated or corrupt)",
                              n_kv, g->size);
    if (n_tensors > cur_left(&c) / GGUF_MIN_TINFO_BYTES)
        return GGUF_FAIL(err, CORE_EFORMAT,
                              "gguf: n_tensors %" PRIu64 " (offset 8) cannot fit in a file of %zu bytes (truncated or corrupt)", n_tensors,
                              g->size);

    if (n_kv > GGUF_MAX_KV || n_tensors > GGUF_MAX_TENSORS)
        return GGUF_FAIL(err, CORE_EUNSUPPORTED,
                              "gguf: %" PRIu64 " keys / %" PRIu64 " tensors exceed the supported %u / %u", n_kv,
                              n_tensors, GGUF_MAX_KV, GGUF_MAX_TENSORS);
    g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kvs);
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return GGUF_FAIL(err, CORE_ENOMEM, "gguf: out of memory");
    if (htab_init(&g->kv_idx, (int64_t)n_kv) || htab_init(&g->tensor_idx, (int64_t)n_tensors))
        return GGUF_FAIL(err, CORE_ENOMEM, "gguf: out of memory");

    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1; /* so close() frees the partly parsed entry */
        if ((rc = parse_kv(g, &c, &g->kvs[i], (int64_t)i))) return rc;
    }
    if ((rc = get_alignment(g, err))) return rc;
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = (int64_t)i + 1;
        if ((rc = parse_tensor_info(g, &c, &g->tensors[i], (int64_t)i))) return rc;
    }
    /* The data section starts at the next multiple of the alignment; with no
     * tensors a file may end right after the infos. */
    size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_off = c.pos + pad;
    if (n_tensors > 0 && g->data_off > g->size)
        return GGUF_FAIL(err, CORE_EFORMAT,
                              "gguf: truncated: data section would start at offset %zu, file size %zu", g->data_off,
                              g->size);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        core_gguf_tensor_t *t = &g->tensors[i];
        size_t room = g->size - g->data_off;
        if (t->offset > room || t->nbytes > room - t->offset)
            return GGUF_FAIL(err, CORE_EFORMAT,
                                  "gguf: tensor '%s': data [%" PRIu64 ", +%zu) relative to the data section at offset %zu "
                                  "lies beyond the end of the file (size %zu)",
                                  t->name, t->offset, t->nbytes, g->data_off, g->size);
        t->data = g->base + g->data_off + t->offset;
    }
    return 0;
}

int core_gguf_open_memory(const void *data, size_t size, core_gguf_t **out, core_error_t *err)
{
    if (!out || (!data && size)) return GGUF_FAIL(err, CORE_EINVAL, "gguf: invalid argument");
    *out = NULL;
    core_gguf_t *g = calloc(1, sizeof *g);
    if (!g) return GGUF_FAIL(err, CORE_ENOMEM, "gguf: out of memory");
    g->base = data;
    g->size = size;
    int rc = parse(g, err);
    if (rc) {
        core_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int core_gguf_open(const char *path, core_gguf_t **out, core_error_t *err)
{
    if (!out || !path) return GGUF_FAIL(err, CORE_EINVAL, "gguf: invalid argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return GGUF_FAIL(err, CORE_EIO, "gguf: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return GGUF_FAIL(err, CORE_EIO, "gguf: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return GGUF_FAIL(err, CORE_EINVAL, "gguf: '%s' is not a regular file", path);
    }
    if (st.st_size < GGUF_HEADER_BYTES) {
        close(fd);
        return GGUF_FAIL(err, CORE_EFORMAT, "gguf: '%s': truncated: %lld bytes is shorter than the header",
                              path, (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return GGUF_FAIL(err, CORE_ERANGE, "gguf: '%s' is too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return GGUF_FAIL(err, CORE_EIO, "gguf: cannot map '%s': %s", path, strerror(e));
    core_gguf_t *g = NULL;
    int rc = core_gguf_open_memory(p, size, &g, err);
    if (rc) {
        munmap(p, size);
        if (err) {
            char msg[CORE_ERROR_MSG_MAX];
            memcpy(msg, err->msg, sizeof msg);
            core_error_set(err, rc, "%s: %s", path, msg);
        }
        return rc;
    }
    g->mapped = 1;
    *out = g;
    return 0;
}

void core_gguf_release(const core_gguf_t *g, const void *p, size_t n)
{
    if (!g || !g->mapped || n == 0)
        return;
    /* whole pages inside [p, p + n) of the mapping only */
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p, hi = lo + n;
    const uintptr_t a = (lo + pg - 1) / pg * pg, b = hi / pg * pg;
    if (lo < (uintptr_t)g->base || hi > (uintptr_t)g->base + g->size || b <= a)
        return;
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

void core_gguf_close(core_gguf_t *g)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kvs[i].key);
        arr_free(&g->kvs[i].arr);
    }
    free(g->kvs);
    for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->tensors);
    free(g->kv_idx.slot);
    free(g->tensor_idx.slot);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g);
}

uint32_t core_gguf_version(const core_gguf_t *g) { return g->version; }
uint32_t core_gguf_alignment(const core_gguf_t *g) { return g->alignment; }
size_t core_gguf_file_size(const core_gguf_t *g) { return g->size; }
int64_t core_gguf_n_kv(const core_gguf_t *g) { return g->n_kv; }

const char *core_gguf_kv_key(const core_gguf_t *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].key : NULL;
}

core_gguf_type_t core_gguf_kv_type(const core_gguf_t *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].type : (core_gguf_type_t)-1;
}

int64_t core_gguf_find_key(const core_gguf_t *g, const char *key)
{
    if (!key) return -1;
    return htab_find(&g->kv_idx, g, kv_name, key, NULL);
}

/* ---- typed access ---- */

int core_gguf_is_int_type(core_gguf_type_t t)
{
    switch (t) {
    case CORE_GGUF_TYPE_UINT8:
    case CORE_GGUF_TYPE_INT8:
    case CORE_GGUF_TYPE_UINT16:
    case CORE_GGUF_TYPE_INT16:
    case CORE_GGUF_TYPE_UINT32:
    case CORE_GGUF_TYPE_INT32:
    case CORE_GGUF_TYPE_UINT64:
    case CORE_GGUF_TYPE_INT64:
    case CORE_GGUF_TYPE_BOOL: return 1;
    default: return 0;
    }
}

/* Decodes a scalar integer at p. CORE_ERANGE when a uint64 exceeds int64. */
static int load_int(core_gguf_type_t t, const uint8_t *p, int64_t *out)
{
    switch (t) {
    case CORE_GGUF_TYPE_UINT8: *out = p[0]; return 0;
    /* two's complement by arithmetic: no conversion through signed char */
    case CORE_GGUF_TYPE_INT8: *out = (int64_t)p[0] - (p[0] >= 0x80 ? 256 : 0); return 0;
    case CORE_GGUF_TYPE_BOOL: *out = p[0] != 0; return 0;
    case CORE_GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
    case CORE_GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return 0; }
    case CORE_GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
    case CORE_GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return 0; }
    case CORE_GGUF_TYPE_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return 0; }
    case CORE_GGUF_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return CORE_ERANGE;
        *out = (int64_t)v;
        return 0;
    }
    default: return CORE_EMISMATCH;
    }
}

static int load_float(core_gguf_type_t t, const uint8_t *p, double *out)
{
    if (t == CORE_GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    if (t == CORE_GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return 0;
    }
    if (t == CORE_GGUF_TYPE_UINT64) {
        uint64_t v;
        memcpy(&v, p, 8);
        *out = (double)v;
        return 0;
    }
    int64_t v;
    int rc = load_int(t, p, &v);
    if (rc) return rc;
    *out = (double)v;
    return 0;
}

static const char *type_name(core_gguf_type_t t)
{
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                        "bool", "string", "array", "uint64", "int64", "float64"};
    return ((unsigned)t < sizeof names / sizeof names[0]) ? names[t] : "invalid";
}

static int kv_at(const core_gguf_t *g, int64_t i, const kv_t **kv, core_error_t *err)
{
    if (!g || i < 0 || i >= g->n_kv)
        return GGUF_FAIL(err, CORE_ENOTFOUND, "gguf: metadata index %" PRId64 " out of range", i);
    *kv = &g->kvs[i];
    return 0;
}

static int mismatch(core_error_t *err, const kv_t *kv, const char *want)
{
    return GGUF_FAIL(err, CORE_EMISMATCH, "gguf: key '%s' has type %s, expected %s", kv->key,
                          type_name(kv->type), want);
}

int core_gguf_kv_int(const core_gguf_t *g, int64_t i, int64_t *out, core_error_t *err)
{
    const kv_t *kv = NULL;
    int rc = kv_at(g, i, &kv, err);
    if (rc) return rc;
    if (!core_gguf_is_int_type(kv->type)) return mismatch(err, kv, "an integer");
    rc = load_int(kv->type, g->base + kv->val, out);
    if (rc)
        return GGUF_FAIL(err, rc, "gguf: key '%s': uint64 value does not fit in int64", kv->key);
    return 0;
}

int core_gguf_kv_float(const core_gguf_t *g, int64_t i, double *out, core_error_t *err)
{
    const kv_t *kv = NULL;
    int rc = kv_at(g, i, &kv, err);
    if (rc) return rc;
    if (!core_gguf_is_int_type(kv->type) && kv->type != CORE_GGUF_TYPE_FLOAT32 && kv->type != CORE_GGUF_TYPE_FLOAT64)
        return mismatch(err, kv, "a number");
    return load_float(kv->type, g->base + kv->val, out);
}

int core_gguf_kv_str(const core_gguf_t *g, int64_t i, core_gguf_str_t *out, core_error_t *err)
{
    const kv_t *kv = NULL;
    int rc = kv_at(g, i, &kv, err);
    if (rc) return rc;
    if (kv->type != CORE_GGUF_TYPE_STRING) return mismatch(err, kv, "string");
    memcpy(&out->len, g->base + kv->val, 8);
    out->ptr = (const char *)g->base + kv->val + 8;
    return 0;
}

int core_gguf_kv_arr(const core_gguf_t *g, int64_t i, core_gguf_arr_t *out, core_error_t *err)
{
    const kv_t *kv = NULL;
    int rc = kv_at(g, i, &kv, err);
    if (rc) return rc;
    if (kv->type != CORE_GGUF_TYPE_ARRAY) return mismatch(err, kv, "array");
    out->g = g;
    out->type = kv->arr.type;
    out->n = kv->arr.n;
    out->impl = &kv->arr;
    return 0;
}

static int64_t find_or_err(const core_gguf_t *g, const char *key, core_error_t *err)
{
    int64_t i = g && key ? core_gguf_find_key(g, key) : -1;
    if (i < 0) core_error_set(err, CORE_ENOTFOUND, "gguf: key '%s' not found", key ? key : "(null)");
    return i;
}

int core_gguf_get_int(const core_gguf_t *g, const char *key, int64_t *out, core_error_t *err)
{
    int64_t i = find_or_err(g, key, err);
    return i < 0 ? CORE_ENOTFOUND : core_gguf_kv_int(g, i, out, err);
}

int core_gguf_get_float(const core_gguf_t *g, const char *key, double *out, core_error_t *err)
{
    int64_t i = find_or_err(g, key, err);
    return i < 0 ? CORE_ENOTFOUND : core_gguf_kv_float(g, i, out, err);
}

int core_gguf_get_bool(const core_gguf_t *g, const char *key, int *out, core_error_t *err)
{
    int64_t i = find_or_err(g, key, err);
    if (i < 0) return CORE_ENOTFOUND;
    const kv_t *kv = &g->kvs[i];
    if (kv->type != CORE_GGUF_TYPE_BOOL) return mismatch(err, kv, "bool");
    *out = g->base[kv->val] != 0;
    return 0;
}

int core_gguf_get_str(const core_gguf_t *g, const char *key, core_gguf_str_t *out, core_error_t *err)
{
    int64_t i = find_or_err(g, key, err);
    return i < 0 ? CORE_ENOTFOUND : core_gguf_kv_str(g, i, out, err);
}

int core_gguf_get_arr(const core_gguf_t *g, const char *key, core_gguf_arr_t *out, core_error_t *err)
{
    int64_t i = find_or_err(g, key, err);
    return i < 0 ? CORE_ENOTFOUND : core_gguf_kv_arr(g, i, out, err);
}

static const arr_impl_t *arr_impl(const core_gguf_arr_t *a) { return a->impl; }

const uint8_t *core_gguf_arr_data(const core_gguf_arr_t *a)
{
    return a->g->base + arr_impl(a)->data;
}

int core_gguf_arr_int(const core_gguf_arr_t *a, uint64_t i, int64_t *out)
{
    const arr_impl_t *ai = arr_impl(a);
    if (i >= ai->n) return CORE_ERANGE;
    if (!core_gguf_is_int_type(ai->type)) return CORE_EMISMATCH;
    return load_int(ai->type, a->g->base + ai->data + (size_t)i * core_gguf_scalar_size(ai->type), out);
}

int core_gguf_arr_float(const core_gguf_arr_t *a, uint64_t i, double *out)
{
    const arr_impl_t *ai = arr_impl(a);
    if (i >= ai->n) return CORE_ERANGE;
    size_t es = core_gguf_scalar_size(ai->type);
    if (!es) return CORE_EMISMATCH;
    return load_float(ai->type, a->g->base + ai->data + (size_t)i * es, out);
}

int core_gguf_arr_str(const core_gguf_arr_t *a, uint64_t i, core_gguf_str_t *out)
{
    const arr_impl_t *ai = arr_impl(a);
    if (i >= ai->n) return CORE_ERANGE;
    if (ai->type != CORE_GGUF_TYPE_STRING) return CORE_EMISMATCH;
    const uint8_t *p = a->g->base + ai->str[i];
    memcpy(&out->len, p, 8);
    out->ptr = (const char *)p + 8;
    return 0;
}

int core_gguf_arr_arr(const core_gguf_arr_t *a, uint64_t i, core_gguf_arr_t *out)
{
    const arr_impl_t *ai = arr_impl(a);
    if (i >= ai->n) return CORE_ERANGE;
    if (ai->type != CORE_GGUF_TYPE_ARRAY) return CORE_EMISMATCH;
    out->g = a->g;
    out->type = ai->sub[i].type;
    out->n = ai->sub[i].n;
    out->impl = &ai->sub[i];
    return 0;
}

int64_t core_gguf_n_tensors(const core_gguf_t *g) { return g->n_tensors; }

const core_gguf_tensor_t *core_gguf_tensor(const core_gguf_t *g, int64_t i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const core_gguf_tensor_t *core_gguf_find_tensor(const core_gguf_t *g, const char *name)
{
    if (!name) return NULL;
    int64_t i = htab_find(&g->tensor_idx, g, tensor_name, name, NULL);
    return i < 0 ? NULL : &g->tensors[i];
}
