/* core/rng.h — small deterministic PRNG (xoshiro256**, seeded by splitmix64).
 *
 * Used wherever darkserve needs reproducible randomness: sampling (same seed ->
 * same tokens) and random-feature draws (same seed -> same ω). The state is a
 * plain value: copy it to fork a stream, store it to resume it.
 */
#ifndef DARKSERVE_CORE_RNG_H
#define DARKSERVE_CORE_RNG_H

#include <stdint.h>

typedef struct core_rng {
    uint64_t s[4];
} core_rng_t;

void core_rng_seed(core_rng_t *r, uint64_t seed);
uint64_t core_rng_u64(core_rng_t *r);
/* Uniform in [0, 1) with 53 random bits. */
double core_rng_uniform(core_rng_t *r);
/* Standard normal (Box-Muller on two uniforms; no cached spare, so the stream
 * position depends only on the number of calls). */
double core_rng_normal(core_rng_t *r);

#endif
