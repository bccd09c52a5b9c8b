/* elementwise: relu, gradient accumulation and the SGD step, one pass over contiguous memory.
 *
 * Invariants: every function here is a pure map over `count` floats, safe in place where the
 * header says so; relu's backward reads relu's OUTPUT (y > 0), as PyTorch's threshold_backward
 * does, so the input need not be kept. flatten has no kernel: NCHW memory is already [N, CHW].
 */
#include "cpu/kernels.h"

void ps_cpu_relu_forward(const float *x, float *y, size_t count)
{
    for (size_t i = 0; i < count; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ps_cpu_relu_backward(const float *y, const float *dy, float *dx, size_t count)
{
    for (size_t i = 0; i < count; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void ps_cpu_sgd_step(float *p, const float *g, size_t count, float lr)
{
    for (size_t i = 0; i < count; i++) p[i] -= lr * g[i];
}

void ps_cpu_add_inplace(float *y, const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++) y[i] += x[i];
}
