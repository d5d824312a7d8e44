/* core/attn/attn_linear.h — tuning and inspection of the linear attention kinds
 * (core/attn/attn_linear.c: darkformer, performer, darkformer-is, flexformer-s/-n)
 * beyond the generic interface of core/attn/attn.h: prefill chunk and state
 * precision, the feature maps and v2 parameters in use, a state's running
 * scales, and Flexformer's denominator counters. Every function refuses
 * (CORE_EINVAL or NULL) an attention that is not a linear kind.
 */
#ifndef DARKSERVE_CORE_ATTN_LINEAR_H
#define DARKSERVE_CORE_ATTN_LINEAR_H

#include <stdint.h>

#include "core/attn/attn.h"
#include "core/err.h"
#include "core/attn/features.h"

typedef struct core_attn_linear_opts {
    int chunk;      /* prefill chunk in tokens, 1..4096 (default 64); results do not depend on it */
    int fp64_state; /* 1: S and z of states created from now on accumulate in double */
    int memory_cap; /* 0: the default (4096); else the distance past which exact memory rows
                       are scored at that distance (tests: set before any state exists) */
} core_attn_linear_opts_t;

/* CORE_EINVAL if a is not a linear kind or an option is out of range. */
int core_attn_linear_set_opts(core_attn_t *a, const core_attn_linear_opts_t *o, core_error_t *err);
/* The feature map of (layer, KV head) (borrowed from a), NULL if a is not
 * linear or out of range. */
const core_features_t *core_attn_linear_features(const core_attn_t *a, int layer, int kv_head);
/* The v2 parameters in use for layer (borrowed from a): gam [Hkv] decays
 * (1 = none, also under decay_off), mix [H] log-weights of the linear part.
 * Returns 0 or CORE_EINVAL. */
int core_attn_linear_params(const core_attn_t *a, int layer, const float **gam, const float **mix);
/* Running log-scales of (layer, KV head), one per feature: c (out, caller-
 * owned) [M], c_i = max of feature i's logit over the keys absorbed into the
 * linear state so far (S̃ and z̃ hold Σ_t exp(logit_t,i − c_i)·…), −inf while
 * none has. Returns 0 or CORE_EINVAL. */
int core_attn_linear_state_scale(const core_attn_state_t *s, int layer, int kv_head, double *c);

/* Flexformer's signed denominators, counted over every query row with a
 * linear part since the last reset (core_attn_linear.c, "Signed
 * denominators"): with E the row's exact mass (sinks + window) and D its
 * linear estimate, both before the guard, rows counts the rows, neg those
 * with D < 0, below_half those with E + D < E/2 (the guard shrank the
 * linear branch), below_tenth those with E + D < E/10; pure_zero the pure
 * linear rows (no exact part) whose D <= 0 (output 0). */
typedef struct core_attn_den_stats {
    uint64_t rows, neg, below_half, below_tenth, pure_zero;
} core_attn_den_stats_t;
/* Reads (and with reset, zeroes) the counters of a. CORE_EINVAL if a is not linear. */
int core_attn_linear_den_stats(core_attn_t *a, core_attn_den_stats_t *out, int reset);

#endif
