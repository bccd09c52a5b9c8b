/* elementwise: relu, gradient accumulation and the SGD step, one pass over contiguous memory.
 *
 * Invariants: every function here is a pure map over `count` floats, safe in place where the
 * header says so; relu's backward reads relu's OUTPUT (y > 0), as PyTorch's threshold_backward
 * does, so the input need not be kept. flatten has no kernel: NCHW memory is already [N, CHW].
 */
#include "kernels/cpu/kernels.h"

/* relu and its backward go in blocks of 8: each block is read whole into a local array before
 * anything is stored (so y == x and dx == dy stay correct without alias checks), and the
 * fixed-length loops are vector code at -O2 too. Every element is loaded unconditionally: a
 * select, not a branch on the (random) sign. */
enum { BLOCK = 8 };

void ps_cpu_relu_forward(const float *x, float *y, size_t count)
{
    size_t i = 0;
    for (; i + BLOCK <= count; i += BLOCK) {
        float t[BLOCK];
        for (size_t j = 0; j < BLOCK; j++) t[j] = x[i + j] > 0.0f ? x[i + j] : 0.0f;
        for (size_t j = 0; j < BLOCK; j++) y[i + j] = t[j];
    }
    for (; i < count; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ps_cpu_relu_backward(const float *y, const float *dy, float *dx, size_t count)
{
    size_t i = 0;
    for (; i + BLOCK <= count; i += BLOCK) {
        float t[BLOCK];
        for (size_t j = 0; j < BLOCK; j++) {
            float g = dy[i + j];
            t[j] = y[i + j] > 0.0f ? g : 0.0f;
        }
        for (size_t j = 0; j < BLOCK; j++) dx[i + j] = t[j];
    }
    for (; i < count; i++) {
        float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

void ps_cpu_sgd_step(float *p, const float *g, size_t count, float lr)
{
    for (size_t i = 0; i < count; i++) p[i] -= lr * g[i];
}

void ps_cpu_add_inplace(float *y, const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++) y[i] += x[i];
}
