/* core/kernels/kvrow.h — the rows the linear attention kinds keep exact: the
 * window, the sinks and the exact memory (core/attn/attn_linear.c).
 *
 * A row is one key or one value of head_dim (Hd) elements, stored in one of
 * two formats:
 *   CORE_KVROW_F16: Hd halves (core/kernels/half.h), 2·Hd bytes;
 *   CORE_KVROW_Q8:  a float scale d, then Hd signed bytes q_i in
 *                   [−127, 127]; element i is the float product q_i·d.
 *                   4 + Hd bytes: at Hd = 64, 53% of the half row.
 * Q8 rounds a row x as d = max_i |x_i| / 127 (0 for a zero row) and q_i the
 * nearest integer to x_i / d, ties to even; finite values beyond
 * ±CORE_KVROW_MAX saturate first. Every element is then within d/2 of the
 * saturated input, and unpacking a packed row and packing it again gives
 * the same bytes.
 *
 * Every key and value is rounded once, when it enters a state, so every
 * later read (the exact scores and sums, the keys joining the linear state,
 * a saved payload) sees the same number however the tokens were chunked.
 * Rows are in native byte order in memory (payloads order them
 * little-endian: core_kvrow_to_le / core_kvrow_from_le). Pointers are
 * borrowed; rows of one call lie core_kvrow_bytes apart; n ≥ 0.
 */
#ifndef DARKSERVE_CORE_KVROW_H
#define DARKSERVE_CORE_KVROW_H

#include <stddef.h>
#include <stdint.h>

typedef enum core_kvrow_fmt {
    CORE_KVROW_F16 = 0,
    CORE_KVROW_Q8 = 1
} core_kvrow_fmt_t;

/* The largest magnitude a row element keeps (the largest finite half). */
#define CORE_KVROW_MAX 65504.0f

/* The longest row core_kvrow_round takes. */
#define CORE_KVROW_MAX_HD 1024

/* Bytes of one row of hd elements. */
size_t core_kvrow_bytes(core_kvrow_fmt_t f, int64_t hd);
/* Bits a format keeps per element (16, 8), and the format of bits (16, 8);
 * -1 for anything else. */
int core_kvrow_bits(core_kvrow_fmt_t f);
int core_kvrow_fmt_of_bits(int bits, core_kvrow_fmt_t *f);
/* n rows of hd floats (x, rows hd apart) rounded into rows at dst. Finite
 * inputs only for Q8 (a non-finite element makes the row's scale NaN:
 * core_kvrow_valid refuses it); F16 keeps infinities as half does. */
void core_kvrow_pack(core_kvrow_fmt_t f, const float *x, void *dst, int64_t n, int64_t hd);
/* n rows at src into x [n][hd], exact. */
void core_kvrow_unpack(core_kvrow_fmt_t f, const void *src, float *x, int64_t n, int64_t hd);
/* y = x rounded as core_kvrow_pack stores it (one row; y may be x). */
void core_kvrow_round(core_kvrow_fmt_t f, const float *x, float *y, int64_t hd);
/* 1 if the n rows at src are what a pack of finite rows can give (F16:
 * every half finite; Q8: the scale finite, ≥ 0 and at most
 * CORE_KVROW_MAX/127, every q_i in [−127, 127]); 0 otherwise. */
int core_kvrow_valid(core_kvrow_fmt_t f, const void *src, int64_t n, int64_t hd);
/* n rows between native order (rows) and little-endian bytes (le). */
void core_kvrow_to_le(core_kvrow_fmt_t f, const void *rows, unsigned char *le, int64_t n,
                      int64_t hd);
void core_kvrow_from_le(core_kvrow_fmt_t f, const unsigned char *le, void *rows, int64_t n,
                        int64_t hd);

#endif
