/* tools/tool_args.h — command-line helpers shared by the programs in tools/
 * (each is one .c file linked with libcore.a, so these are static inline). */
#ifndef DARKSERVE_TOOLS_TOOL_ARGS_H
#define DARKSERVE_TOOLS_TOOL_ARGS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/kernels/cpu.h"

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

/* 0, or -1 after saying why on stderr (prefixed with tool) when
 * DARKSERVE_ISA names a kernel path this CPU does not run or no path at all
 * (core/kernels/cpu.h): a benchmark must not report the best path's figures
 * as the one asked for. */
static inline int tool_isa_env_ok(const char *tool)
{
    if (!core_qdot_env_error())
        return 0;
    fprintf(stderr, "%s: %s\n", tool, core_qdot_env_error());
    return -1;
}

#endif
