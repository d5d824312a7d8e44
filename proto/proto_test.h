/* proto/proto_test.h — for tests and fuzz targets only: the parts of
 * proto/ (proto/proto.h) that no production code calls.
 *
 * The UTF-8 checks below state what proto_utf8_sanitize guarantees (its
 * output is well-formed) and what the data-driven cases in
 * tests/data/proto (gen_utf8.py) expect of a byte string; the server itself
 * only sanitizes.
 *
 * Implemented in proto/util.c; nothing under proto/ other than that file
 * includes this header.
 */
#ifndef DARKSERVE_PROTO_PROTO_TEST_H
#define DARKSERVE_PROTO_PROTO_TEST_H

#include <stddef.h>

/* 1 when s[0..len) is well-formed UTF-8 (NUL bytes allowed). */
int proto_utf8_valid(const char *s, size_t len);

/* Length of the longest prefix of s[0..len) that does not end inside an
 * incomplete (but so far valid) multibyte sequence: a streamer could emit
 * that much and keep the rest for the next token. */
size_t proto_utf8_complete_prefix(const char *s, size_t len);

#endif
