/* qdot_check.h — helpers the core/qdot tests share (test_core_qdot.c,
 * test_core_qdot_q8.c): the ISA variants to run, bitwise float equality,
 * Higham's gamma and f16 scale writing. Header-only, static. */
#ifndef DARKSERVE_TESTS_QDOT_CHECK_H
#define DARKSERVE_TESTS_QDOT_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/kernels/qdot.h"
#include "core/tensor.h"

/* Every ISA variant this CPU runs into isas ([CORE_QDOT_ISA_COUNT_]), best
 * last; returns how many. */
static inline int isa_list(core_qdot_isa_t *isas)
{
    int n = 0;
    for (int i = 0; i < CORE_QDOT_ISA_COUNT_; i++)
        if (core_qdot_isa_runs((core_qdot_isa_t)i))
            isas[n++] = (core_qdot_isa_t)i;
    if (n < CORE_QDOT_ISA_COUNT_)
        printf("  note: this CPU runs %d of %d ISA variants; the others are not tested here\n", n,
               (int)CORE_QDOT_ISA_COUNT_);
    return n;
}

/* Bitwise equality (NaN padding must survive untouched, bit for bit). */
static inline int same_bits(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    return x == y;
}

/* gamma(n) = n u / (1 - n u), u = 2^-24 */
static inline double gamma_n(double n)
{
    const double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

static inline void put_half(unsigned char *p, float v)
{
    uint16_t h = core_fp32_to_fp16(v);
    memcpy(p, &h, sizeof h);
}

#endif
