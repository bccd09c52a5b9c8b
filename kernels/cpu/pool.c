/* maxpool2d: the maximum over each kernel x kernel window of every (sample, channel) plane, as
 * torch.nn.functional.max_pool2d with ceil_mode=False and dilation 1.
 *
 * Invariants:
 *  1. Padding behaves as -inf: it never wins, and every window holds at least one real element
 *     (checked: padding <= kernel/2, PyTorch's own rule).
 *  2. idx records the winner as a flat h*W+w index inside its input plane (PyTorch's int64
 *     indices);
 *     ties keep the first element in row-major scan order; a NaN wins and stays.
 *  3. Backward zeroes dx and ADDS dy at each recorded index, so overlapping windows
 *     (stride < kernel) that picked the same input sum their gradients.
 */
#include "kernels/cpu/kernels.h"

#include "src/diag.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static size_t out_dim(size_t in, size_t k, size_t stride, size_t pad)
{
    if (stride == 0 || in + 2 * pad < k) return 0;
    return (in + 2 * pad - k) / stride + 1;
}

size_t ps_cpu_maxpool2d_out_h(const struct ps_pool2d_shape *s)
{
    return out_dim(s->h, s->kernel, s->stride, s->padding);
}

size_t ps_cpu_maxpool2d_out_w(const struct ps_pool2d_shape *s)
{
    return out_dim(s->w, s->kernel, s->stride, s->padding);
}

/* One step of the scan (invariant 2): v at flat index k replaces the best so far if it is
 * greater, or a NaN replacing a number. Written as selects, not branches: which element of a
 * window wins is data and mispredicts half the time. */
static inline void consider(float v, uint32_t k, float *best, uint32_t *bi)
{
    int take = (v > *best) | ((v != v) & (*best == *best));
    *best = take ? v : *best;
    *bi = take ? k : *bi;
}

/* The common 2x2, stride 2, no padding pool of one plane. */
static void pool2x2(const float *xp, size_t w, size_t oh_n, size_t ow_n, float *yp, int64_t *ip)
{
    for (size_t oh = 0; oh < oh_n; oh++) {
        const float *r0 = xp + 2 * oh * w, *r1 = r0 + w;
        uint32_t k0 = (uint32_t)(2 * oh * w), k1 = k0 + (uint32_t)w;
        for (size_t ow = 0; ow < ow_n; ow++) {
            uint32_t c = (uint32_t)(2 * ow);
            float best = r0[c];
            uint32_t bi = k0 + c;
            consider(r0[c + 1], k0 + c + 1, &best, &bi);
            consider(r1[c], k1 + c, &best, &bi);
            consider(r1[c + 1], k1 + c + 1, &best, &bi);
            yp[oh * ow_n + ow] = best;
            if (ip) ip[oh * ow_n + ow] = (int64_t)bi;
        }
    }
}

int ps_cpu_maxpool2d_forward(const struct ps_pool2d_shape *s, const float *x, float *y,
                             int64_t *idx, struct ps_diag *d)
{
    if (s->kernel == 0 || s->stride == 0)
        return ps_diag_set(d, -EINVAL, "maxpool2d", "kernel and stride must be at least 1");
    if (2 * s->padding > s->kernel)
        return ps_diag_set(d, -EINVAL, "maxpool2d",
                           "padding %zu is more than half the kernel size %zu", s->padding,
                           s->kernel);
    size_t oh_n = ps_cpu_maxpool2d_out_h(s), ow_n = ps_cpu_maxpool2d_out_w(s);
    if (oh_n == 0 || ow_n == 0)
        return ps_diag_set(d, -EINVAL, "maxpool2d", "kernel %zu does not fit input %zux%zu",
                           s->kernel, s->h, s->w);
    if (s->h * s->w > (size_t)INT32_MAX)
        return ps_diag_set(d, -EOVERFLOW, "maxpool2d", "plane %zux%zu too large for indices",
                           s->h, s->w);
    for (size_t pl = 0; pl < s->n * s->c; pl++) {
        const float *xp = x + pl * s->h * s->w;
        float *yp = y + pl * oh_n * ow_n;
        int64_t *ip = idx ? idx + pl * oh_n * ow_n : NULL;
        if (s->kernel == 2 && s->stride == 2 && s->padding == 0) {
            pool2x2(xp, s->w, oh_n, ow_n, yp, ip);
            continue;
        }
        for (size_t oh = 0; oh < oh_n; oh++) {
            ptrdiff_t h0 = (ptrdiff_t)(oh * s->stride) - (ptrdiff_t)s->padding;
            ptrdiff_t h1 = h0 + (ptrdiff_t)s->kernel;
            if (h0 < 0) h0 = 0;
            if (h1 > (ptrdiff_t)s->h) h1 = (ptrdiff_t)s->h;
            for (size_t ow = 0; ow < ow_n; ow++) {
                ptrdiff_t w0 = (ptrdiff_t)(ow * s->stride) - (ptrdiff_t)s->padding;
                ptrdiff_t w1 = w0 + (ptrdiff_t)s->kernel;
                if (w0 < 0) w0 = 0;
                if (w1 > (ptrdiff_t)s->w) w1 = (ptrdiff_t)s->w;
                float best = -INFINITY;
                uint32_t bi = (uint32_t)((size_t)h0 * s->w + (size_t)w0);
                for (ptrdiff_t ih = h0; ih < h1; ih++)
                    for (ptrdiff_t iw = w0; iw < w1; iw++) {
                        size_t k = (size_t)ih * s->w + (size_t)iw;
                        consider(xp[k], (uint32_t)k, &best, &bi);
                    }
                yp[oh * ow_n + ow] = best;
                if (ip) ip[oh * ow_n + ow] = (int64_t)bi;
            }
        }
    }
    return 0;
}

void ps_cpu_maxpool2d_backward(const struct ps_pool2d_shape *s, const float *dy,
                               const int64_t *idx, float *dx)
{
    size_t plane = s->h * s->w, op = ps_cpu_maxpool2d_out_h(s) * ps_cpu_maxpool2d_out_w(s);
    memset(dx, 0, s->n * s->c * plane * sizeof(float));
    for (size_t pl = 0; pl < s->n * s->c; pl++)
        for (size_t q = 0; q < op; q++) dx[pl * plane + (size_t)idx[pl * op + q]] += dy[pl * op + q];
}
