/* rng: the one mixing function every seeded generator in pipescope is built on.
 *
 * splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with good avalanche.
 * Generators key it with (seed, stream, index) so that every draw is a pure function of its
 * coordinates: dropout masks (kernels/cpu/rng.c, repeated by a recompute), synthetic data
 * (src/data.c) and PyTorch-style initial weights (kernels/state.c).
 */
#ifndef PS_RNG_H
#define PS_RNG_H

#include <stdint.h>

#define PS_RNG_GOLDEN UINT64_C(0x9E3779B97F4A7C15)

static inline uint64_t ps_rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* one splitmix64 step from state z: the golden-ratio increment, then the finaliser */
static inline uint64_t ps_rng_splitmix64(uint64_t z)
{
    return ps_rng_mix64(z + PS_RNG_GOLDEN);
}

#endif
