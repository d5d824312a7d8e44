/* tools/tool_args.h — command-line helpers shared by the programs in tools/
 * (each is one .c file linked with libcore.a, so these are static inline). */
#ifndef DARKSERVE_TOOLS_TOOL_ARGS_H
#define DARKSERVE_TOOLS_TOOL_ARGS_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* A whole decimal integer in [lo, hi] into *out: 0, else -1 (out untouched). */
static inline int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

#endif
