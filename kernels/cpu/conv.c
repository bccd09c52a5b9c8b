/* conv2d: 2-D cross-correlation over NCHW tensors, as torch.nn.functional.conv2d (groups = 1,
 * dilation = 1, symmetric zero padding), lowered to matrix products with im2col.
 *
 * For one sample, col[K, P] with K = c_in*kh*kw rows and P = out_h*out_w columns holds the input
 * patch under each output position (zeros where the window hangs over the padding):
 *     col[(c*kh + i)*kw + j, oh*out_w + ow] = x[c, oh*stride - pad + i, ow*stride - pad + j]
 * Then, per sample:
 *     forward   y[c_out, P]  = W[c_out, K] * col + b
 *     backward  dW[c_out, K] += dy[c_out, P] * col^T
 *               dcol[K, P]   = W^T * dy,  and col2im scatters (adds) dcol back into dx
 *               db[c_out]    += sums of dy over samples and positions (double)
 * Invariants: the col buffer is per call (malloc, freed before return); samples are processed in
 * order, so results do not depend on the thread count (the sgemm splits C, never K).
 */
#include "cpu/kernels.h"

#include "diag.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t out_dim(size_t in, size_t k, size_t stride, size_t pad)
{
    if (stride == 0 || in + 2 * pad < k) return 0;
    return (in + 2 * pad - k) / stride + 1;
}

size_t ps_cpu_conv2d_out_h(const struct ps_conv2d_shape *s)
{
    return out_dim(s->h, s->kh, s->stride, s->padding);
}

size_t ps_cpu_conv2d_out_w(const struct ps_conv2d_shape *s)
{
    return out_dim(s->w, s->kw, s->stride, s->padding);
}

static int check_shape(const struct ps_conv2d_shape *s, struct ps_diag *d)
{
    if (s->stride == 0) return ps_diag_set(d, -EINVAL, "conv2d", "stride must be at least 1");
    if (s->kh == 0 || s->kw == 0 || s->c_in == 0 || s->c_out == 0)
        return ps_diag_set(d, -EINVAL, "conv2d", "kernel %zux%zu with %zu->%zu channels is empty",
                           s->kh, s->kw, s->c_in, s->c_out);
    if (ps_cpu_conv2d_out_h(s) == 0 || ps_cpu_conv2d_out_w(s) == 0)
        return ps_diag_set(d, -EINVAL, "conv2d",
                           "kernel %zux%zu does not fit input %zux%zu with padding %zu", s->kh,
                           s->kw, s->h, s->w, s->padding);
    return 0;
}

static void im2col(const struct ps_conv2d_shape *s, const float *x, float *col, size_t oh_n,
                   size_t ow_n)
{
    size_t p = oh_n * ow_n;
    for (size_t c = 0; c < s->c_in; c++)
        for (size_t i = 0; i < s->kh; i++)
            for (size_t j = 0; j < s->kw; j++) {
                float *row = col + ((c * s->kh + i) * s->kw + j) * p;
                for (size_t oh = 0; oh < oh_n; oh++) {
                    float *dst = row + oh * ow_n;
                    ptrdiff_t ih = (ptrdiff_t)(oh * s->stride + i) - (ptrdiff_t)s->padding;
                    if (ih < 0 || ih >= (ptrdiff_t)s->h) {
                        memset(dst, 0, ow_n * sizeof(float));
                        continue;
                    }
                    const float *src = x + (c * s->h + (size_t)ih) * s->w;
                    for (size_t ow = 0; ow < ow_n; ow++) {
                        ptrdiff_t iw = (ptrdiff_t)(ow * s->stride + j) - (ptrdiff_t)s->padding;
                        dst[ow] = (iw < 0 || iw >= (ptrdiff_t)s->w) ? 0.0f : src[iw];
                    }
                }
            }
}

/* dx (one sample) += col2im(dcol). */
static void col2im_add(const struct ps_conv2d_shape *s, const float *col, float *dx, size_t oh_n,
                       size_t ow_n)
{
    size_t p = oh_n * ow_n;
    for (size_t c = 0; c < s->c_in; c++)
        for (size_t i = 0; i < s->kh; i++)
            for (size_t j = 0; j < s->kw; j++) {
                const float *row = col + ((c * s->kh + i) * s->kw + j) * p;
                for (size_t oh = 0; oh < oh_n; oh++) {
                    ptrdiff_t ih = (ptrdiff_t)(oh * s->stride + i) - (ptrdiff_t)s->padding;
                    if (ih < 0 || ih >= (ptrdiff_t)s->h) continue;
                    float *dst = dx + (c * s->h + (size_t)ih) * s->w;
                    const float *src = row + oh * ow_n;
                    for (size_t ow = 0; ow < ow_n; ow++) {
                        ptrdiff_t iw = (ptrdiff_t)(ow * s->stride + j) - (ptrdiff_t)s->padding;
                        if (iw >= 0 && iw < (ptrdiff_t)s->w) dst[iw] += src[ow];
                    }
                }
            }
}

int ps_cpu_conv2d_forward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                          const float *b, float *y, struct ps_diag *d)
{
    int rc = check_shape(s, d);
    if (rc < 0) return rc;
    size_t oh = ps_cpu_conv2d_out_h(s), ow = ps_cpu_conv2d_out_w(s), p = oh * ow;
    size_t k = s->c_in * s->kh * s->kw;
    bool direct = s->kh == 1 && s->kw == 1 && s->stride == 1 && s->padding == 0;
    float *col = direct ? NULL : malloc(k * p * sizeof(float));
    if (!direct && !col) return ps_diag_set(d, -ENOMEM, "conv2d", "out of memory for im2col");
    for (size_t n = 0; n < s->n; n++) {
        const float *xn = x + n * s->c_in * s->h * s->w;
        float *yn = y + n * s->c_out * p;
        if (!direct) im2col(s, xn, col, oh, ow);
        rc = ps_cpu_sgemm(false, false, s->c_out, p, k, 1.0f, w, k, direct ? xn : col, p, 0.0f,
                          yn, p);
        if (rc < 0) break;
        if (b)
            for (size_t c = 0; c < s->c_out; c++)
                for (size_t q = 0; q < p; q++) yn[c * p + q] += b[c];
    }
    free(col);
    if (rc < 0) return ps_diag_set(d, rc, "conv2d", "out of memory in sgemm");
    return 0;
}

int ps_cpu_conv2d_backward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                           const float *dy, float *dx, float *dw, float *db, struct ps_diag *d)
{
    int rc = check_shape(s, d);
    if (rc < 0) return rc;
    size_t oh = ps_cpu_conv2d_out_h(s), ow = ps_cpu_conv2d_out_w(s), p = oh * ow;
    size_t k = s->c_in * s->kh * s->kw, in_sz = s->c_in * s->h * s->w;
    float *col = (dw || dx) ? malloc(k * p * sizeof(float)) : NULL;
    double *bacc = db ? calloc(s->c_out, sizeof(double)) : NULL;
    if (((dw || dx) && !col) || (db && !bacc)) {
        free(col);
        free(bacc);
        return ps_diag_set(d, -ENOMEM, "conv2d", "out of memory for im2col");
    }
    for (size_t n = 0; n < s->n && rc == 0; n++) {
        const float *dyn = dy + n * s->c_out * p;
        if (dw) {
            im2col(s, x + n * in_sz, col, oh, ow);
            rc = ps_cpu_sgemm(false, true, s->c_out, k, p, 1.0f, dyn, p, col, p, 1.0f, dw, k);
        }
        if (dx && rc == 0) {
            rc = ps_cpu_sgemm(true, false, k, p, s->c_out, 1.0f, w, k, dyn, p, 0.0f, col, p);
            float *dxn = dx + n * in_sz;
            memset(dxn, 0, in_sz * sizeof(float));
            if (rc == 0) col2im_add(s, col, dxn, oh, ow);
        }
        if (bacc)
            for (size_t c = 0; c < s->c_out; c++)
                for (size_t q = 0; q < p; q++) bacc[c] += dyn[c * p + q];
    }
    if (bacc && rc == 0)
        for (size_t c = 0; c < s->c_out; c++) db[c] += (float)bacc[c];
    free(col);
    free(bacc);
    if (rc < 0) return ps_diag_set(d, rc, "conv2d", "out of memory in sgemm");
    return 0;
}
