/* core/gguf_impl.h — what the GGUF reader (core/gguf.c) and writer
 * (core/gguf_write.c) share: the format's constants and our bounds on it,
 * the scalar type helpers, and access to a reader's array bytes (the
 * writer copies a reader's arrays as they are). Private to those two files.
 */
#ifndef DARKSERVE_CORE_GGUF_IMPL_H
#define DARKSERVE_CORE_GGUF_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/gguf.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24          /* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8              /* nesting of arrays in arrays */
#define GGUF_MAX_KEY_LEN 65535u       /* the spec's bound on key length */
#define GGUF_MAX_NAME_LEN 65535u      /* our bound on tensor name length */
#define GGUF_MAX_ALIGNMENT (1u << 30) /* beyond this, padding arithmetic gets silly */
/* Real models have tens of keys and at most tens of thousands of tensors;
 * the caps keep descriptor memory far below the file size on hostile input. */
#define GGUF_MAX_KV (1u << 16)
#define GGUF_MAX_TENSORS (1u << 20)
/* Smallest encodings, for bounding counts by the bytes left. */
#define GGUF_MIN_KV_BYTES 13     /* key len(8) + type(4) + 1-byte value */
#define GGUF_MIN_TINFO_BYTES 32  /* name len(8) + n_dims(4) + ne(8) + type(4) + offset(8) */

/* core_error_set returns its code; spelling the code out as the value lets
 * static analysis see that every failure path returns nonzero. code must be
 * free of side effects. */
#define GGUF_FAIL(err, code, ...) (core_error_set((err), (code), __VA_ARGS__), (code))

/* Bytes of one element of scalar type t; 0 for STRING, ARRAY and unknown
 * types. */
size_t core_gguf_scalar_size(core_gguf_type_t t);
/* 1 for the integer types (BOOL is not one), else 0. */
int core_gguf_is_int_type(core_gguf_type_t t);
/* Element 0 of reader array a of a scalar type: a->n elements of
 * core_gguf_scalar_size(a->type) bytes each, in the reader's buffer
 * (borrowed). */
const uint8_t *core_gguf_arr_data(const core_gguf_arr_t *a);

#endif
