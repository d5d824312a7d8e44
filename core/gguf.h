/* core/gguf.h — GGUF (v2, v3) reader over mmap, and a writer.
 *
 * The reader validates everything against the file size before use: counts,
 * string lengths, array lengths (also nested), tensor dims, types, offsets and
 * data extents, general.alignment. A malformed file yields CORE_EFORMAT with a
 * message naming the key / tensor / byte offset; never an out-of-bounds read.
 *
 * Ownership: core_gguf_t owns its mapping; every pointer it hands out
 * (strings, tensor data, array data) is borrowed and lives until
 * core_gguf_close(). Strings from the file are NOT NUL-terminated: use the
 * (ptr, len) pair. Tensor names and keys are returned NUL-terminated copies
 * owned by the reader.
 */
#ifndef DARKSERVE_CORE_GGUF_H
#define DARKSERVE_CORE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef enum core_gguf_type {
    CORE_GGUF_TYPE_UINT8 = 0,
    CORE_GGUF_TYPE_INT8 = 1,
    CORE_GGUF_TYPE_UINT16 = 2,
    CORE_GGUF_TYPE_INT16 = 3,
    CORE_GGUF_TYPE_UINT32 = 4,
    CORE_GGUF_TYPE_INT32 = 5,
    CORE_GGUF_TYPE_FLOAT32 = 6,
    CORE_GGUF_TYPE_BOOL = 7,
    CORE_GGUF_TYPE_STRING = 8,
    CORE_GGUF_TYPE_ARRAY = 9,
    CORE_GGUF_TYPE_UINT64 = 10,
    CORE_GGUF_TYPE_INT64 = 11,
    CORE_GGUF_TYPE_FLOAT64 = 12
} core_gguf_type_t;

#define CORE_GGUF_MAX_DIMS 4

typedef struct core_gguf core_gguf_t;

typedef struct core_gguf_str {
    const char *ptr; /* borrowed, not NUL-terminated */
    uint64_t len;
} core_gguf_str_t;

/* A (possibly nested) array value. Elements are accessed through the
 * core_gguf_arr_* functions, which bounds-check i. */
typedef struct core_gguf_arr {
    const core_gguf_t *g;
    core_gguf_type_t type; /* element type */
    uint64_t n;            /* element count */
    const void *impl;      /* reader-private */
} core_gguf_arr_t;

typedef struct core_gguf_tensor {
    const char *name;                 /* NUL-terminated, owned by the reader */
    uint32_t n_dims;                  /* 1..CORE_GGUF_MAX_DIMS */
    int64_t ne[CORE_GGUF_MAX_DIMS];   /* ne[0] = row length (innermost); unused = 1 */
    int type;                         /* core_ttype_t */
    uint64_t offset;                  /* relative to the data section */
    const void *data;                 /* borrowed, inside the mapping */
    size_t nbytes;                    /* validated to lie inside the file */
} core_gguf_tensor_t;

/* Opens and validates a file. *out is new; free with core_gguf_close(). */
int core_gguf_open(const char *path, core_gguf_t **out, core_error_t *err);
/* Same over a caller-owned buffer that must outlive the reader (tests, fuzz). */
int core_gguf_open_memory(const void *data, size_t size, core_gguf_t **out, core_error_t *err);
void core_gguf_close(core_gguf_t *g); /* NULL is a no-op */
/* Hands the pages of a mapped file inside [p, p + n) back to the kernel (a
 * copy of them is kept elsewhere): they leave the process's resident set and
 * are read from the file again if touched. A no-op for a file read into
 * memory (core_gguf_open_memory) or a range outside the mapping. */
void core_gguf_release(const core_gguf_t *g, const void *p, size_t n);

uint32_t core_gguf_version(const core_gguf_t *g);
uint32_t core_gguf_alignment(const core_gguf_t *g);
size_t core_gguf_file_size(const core_gguf_t *g);

/* Metadata: keys in file order. */
int64_t core_gguf_n_kv(const core_gguf_t *g);
const char *core_gguf_kv_key(const core_gguf_t *g, int64_t i);        /* NULL if i out of range */
core_gguf_type_t core_gguf_kv_type(const core_gguf_t *g, int64_t i);
int64_t core_gguf_find_key(const core_gguf_t *g, const char *key);    /* -1 if absent */

/* Typed getters by key. CORE_ENOTFOUND when absent, CORE_EMISMATCH when the
 * stored type does not convert (get_int accepts any integer type and bool and
 * fails with CORE_ERANGE if a uint64 does not fit; get_float accepts floats and
 * integers). The message names the key. */
int core_gguf_get_int(const core_gguf_t *g, const char *key, int64_t *out, core_error_t *err);
int core_gguf_get_float(const core_gguf_t *g, const char *key, double *out, core_error_t *err);
int core_gguf_get_bool(const core_gguf_t *g, const char *key, int *out, core_error_t *err);
int core_gguf_get_str(const core_gguf_t *g, const char *key, core_gguf_str_t *out, core_error_t *err);
int core_gguf_get_arr(const core_gguf_t *g, const char *key, core_gguf_arr_t *out, core_error_t *err);
/* Same by index (for dumping every key). */
int core_gguf_kv_int(const core_gguf_t *g, int64_t i, int64_t *out, core_error_t *err);
int core_gguf_kv_float(const core_gguf_t *g, int64_t i, double *out, core_error_t *err);
int core_gguf_kv_str(const core_gguf_t *g, int64_t i, core_gguf_str_t *out, core_error_t *err);
int core_gguf_kv_arr(const core_gguf_t *g, int64_t i, core_gguf_arr_t *out, core_error_t *err);

/* Array elements; CORE_ERANGE if i >= n, CORE_EMISMATCH on a wrong type. */
int core_gguf_arr_int(const core_gguf_arr_t *a, uint64_t i, int64_t *out);
int core_gguf_arr_float(const core_gguf_arr_t *a, uint64_t i, double *out);
int core_gguf_arr_str(const core_gguf_arr_t *a, uint64_t i, core_gguf_str_t *out);
int core_gguf_arr_arr(const core_gguf_arr_t *a, uint64_t i, core_gguf_arr_t *out);

/* Tensors in file order. */
int64_t core_gguf_n_tensors(const core_gguf_t *g);
const core_gguf_tensor_t *core_gguf_tensor(const core_gguf_t *g, int64_t i);      /* NULL if out of range */
const core_gguf_tensor_t *core_gguf_find_tensor(const core_gguf_t *g, const char *name); /* NULL if absent */

/* ---- writer (version 3) ---- */
typedef struct core_gguf_writer core_gguf_writer_t;

/* New empty writer; alignment 0 means the default 32. Free with _free(). */
core_gguf_writer_t *core_gguf_writer_new(uint32_t alignment);
void core_gguf_writer_free(core_gguf_writer_t *w); /* NULL is a no-op */
/* Keys are copied. Adding a key twice is CORE_EINVAL. */
int core_gguf_writer_set_int(core_gguf_writer_t *w, const char *key, core_gguf_type_t type, int64_t v);
int core_gguf_writer_set_float(core_gguf_writer_t *w, const char *key, core_gguf_type_t type, double v);
int core_gguf_writer_set_bool(core_gguf_writer_t *w, const char *key, int v);
int core_gguf_writer_set_str(core_gguf_writer_t *w, const char *key, const char *s, size_t len);
/* Array of scalars: data holds n elements of elem_type packed as in the file. */
int core_gguf_writer_set_arr(core_gguf_writer_t *w, const char *key, core_gguf_type_t elem_type,
                             const void *data, uint64_t n);
/* Array of NUL-terminated strings (copied). */
int core_gguf_writer_set_arr_str(core_gguf_writer_t *w, const char *key, const char *const *strs, uint64_t n);
/* Tensor data is copied; nbytes must equal the size implied by type and ne. */
int core_gguf_writer_add_tensor(core_gguf_writer_t *w, const char *name, int type, uint32_t n_dims,
                                const int64_t *ne, const void *data, size_t nbytes);
/* Writes atomically (temp file, fsync, rename). */
int core_gguf_writer_write(const core_gguf_writer_t *w, const char *path, core_error_t *err);

#endif
