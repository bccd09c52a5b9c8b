/* rng: a counter-based random generator and the dropout built on it.
 *
 * ps_cpu_rng_u64(seed, stream, index) is a pure function: the key is splitmix64's finaliser
 * applied to (seed, stream), and element `index` is the (index+1)-th output of splitmix64 started
 * from that key. No state is carried between calls, so
 *  1. a recompute that passes the same (seed, offset) redraws the identical dropout mask,
 *     whatever ran in between and in whatever order elements are visited;
 *  2. distinct streams (offsets) give independent-looking masks.
 * This deliberately does NOT reproduce PyTorch's generators (Philox on CUDA, mt19937 on CPU):
 * dropout masks differ from PyTorch's bit for bit; only the distribution (keep with probability
 * 1-p, scale 1/(1-p)) and the recompute-determinism match.
 */
#include "kernels/cpu/kernels.h"
#include "src/rng.h"

#define GOLDEN PS_RNG_GOLDEN
#define mix64 ps_rng_mix64

static uint64_t stream_key(uint64_t seed, uint64_t stream)
{
    return mix64(mix64(seed + GOLDEN) ^ (stream * UINT64_C(0xD1B54A32D192ED03) + GOLDEN));
}

static uint64_t draw(uint64_t key, uint64_t index)
{
    return mix64(key + (index + 1) * GOLDEN);
}

static float to_unit(uint64_t r)
{
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}

uint64_t ps_cpu_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return draw(stream_key(seed, stream), index);
}

float ps_cpu_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return to_unit(ps_cpu_rng_u64(seed, stream, index));
}

void ps_cpu_dropout_forward(const float *x, float *y, uint8_t *mask, size_t count, float p,
                            uint64_t seed, uint64_t offset)
{
    if (p <= 0.0f) {
        for (size_t i = 0; i < count; i++) {
            y[i] = x[i];
            if (mask) mask[i] = 1;
        }
        return;
    }
    if (p >= 1.0f) {
        for (size_t i = 0; i < count; i++) {
            y[i] = 0.0f;
            if (mask) mask[i] = 0;
        }
        return;
    }
    uint64_t key = stream_key(seed, offset);
    float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < count; i++) {
        uint8_t keep = to_unit(draw(key, i)) >= p;
        y[i] = keep ? x[i] * scale : 0.0f;
        if (mask) mask[i] = keep;
    }
}

void ps_cpu_dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t count,
                             float p)
{
    if (p >= 1.0f) {
        for (size_t i = 0; i < count; i++) dx[i] = 0.0f;
        return;
    }
    float scale = p <= 0.0f ? 1.0f : 1.0f / (1.0f - p);
    for (size_t i = 0; i < count; i++) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}
