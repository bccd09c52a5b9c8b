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
#include "kernels/cpu/kernels.h"

#include "src/diag.h"

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

/* The output columns ow in [*lo, *hi) whose input column ow*stride + j - pad lies inside [0, w);
 * the others read the zero padding. */
static void valid_cols(const struct ps_conv2d_shape *s, size_t j, size_t ow_n, size_t *lo,
                       size_t *hi)
{
    size_t st = s->stride, pad = s->padding;
    size_t l = pad > j ? (pad - j + st - 1) / st : 0;          /* first ow with iw >= 0 */
    size_t h = s->w + pad > j ? (s->w + pad - j + st - 1) / st : 0; /* first ow with iw >= w */
    if (h > ow_n) h = ow_n;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* The rows oh in [*lo, *hi) whose input row oh*stride + i - pad lies inside [0, h). */
static void valid_rows(const struct ps_conv2d_shape *s, size_t i, size_t oh_n, size_t *lo,
                       size_t *hi)
{
    struct ps_conv2d_shape t = *s;
    t.w = s->h;
    valid_cols(&t, i, oh_n, lo, hi);
}

static void im2col(const struct ps_conv2d_shape *s, const float *x, float *col, size_t oh_n,
                   size_t ow_n)
{
    size_t p = oh_n * ow_n, st = s->stride, pad = s->padding;
    for (size_t c = 0; c < s->c_in; c++)
        for (size_t i = 0; i < s->kh; i++) {
            size_t rlo, rhi;
            valid_rows(s, i, oh_n, &rlo, &rhi);
            for (size_t j = 0; j < s->kw; j++) {
                float *row = col + ((c * s->kh + i) * s->kw + j) * p;
                size_t lo, hi;
                valid_cols(s, j, ow_n, &lo, &hi);
                if (lo == hi) rlo = rhi = 0;
                memset(row, 0, rlo * ow_n * sizeof(float));
                memset(row + rhi * ow_n, 0, (oh_n - rhi) * ow_n * sizeof(float));
                if (rlo == rhi) continue;
                /* src[oh * st * w + ow * st + j - pad] is x[c, oh*st + i - pad, ow*st + j - pad]
                 * (oh counted from rlo) */
                const float *src = x + (c * s->h + rlo * st + i - pad) * s->w;
                float *dst = row + rlo * ow_n;
                if (st == 1 && ow_n == s->w) {
                    /* Output rows are as long as input rows: the valid rows are one contiguous
                     * copy, whose elements outside [lo, hi) in each row (read from the
                     * neighbouring input row) are then zeroed. The copy starts at the first valid
                     * element and ends at the last, so it reads inside x. */
                    size_t cnt = (rhi - rlo) * ow_n;
                    memcpy(dst + lo, src + lo + j - pad, (cnt - lo - (ow_n - hi)) * sizeof(float));
                    for (size_t oh = 0; oh < rhi - rlo; oh++) {
                        for (size_t ow = 0; ow < lo; ow++) dst[oh * ow_n + ow] = 0.0f;
                        for (size_t ow = hi; ow < ow_n; ow++) dst[oh * ow_n + ow] = 0.0f;
                    }
                    continue;
                }
                for (size_t oh = 0; oh < rhi - rlo; oh++, dst += ow_n, src += st * s->w) {
                    for (size_t ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    for (size_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * st + j - pad];
                    for (size_t ow = hi; ow < ow_n; ow++) dst[ow] = 0.0f;
                }
            }
        }
}

/* dx (one sample) += col2im(dcol). */
static void col2im_add(const struct ps_conv2d_shape *s, const float *col, float *dx, size_t oh_n,
                       size_t ow_n)
{
    size_t p = oh_n * ow_n, st = s->stride;
    for (size_t c = 0; c < s->c_in; c++)
        for (size_t i = 0; i < s->kh; i++)
            for (size_t j = 0; j < s->kw; j++) {
                const float *row = col + ((c * s->kh + i) * s->kw + j) * p;
                size_t lo, hi;
                valid_cols(s, j, ow_n, &lo, &hi);
                for (size_t oh = 0; oh < oh_n && lo < hi; oh++) {
                    ptrdiff_t ih = (ptrdiff_t)(oh * st + i) - (ptrdiff_t)s->padding;
                    if (ih < 0 || ih >= (ptrdiff_t)s->h) continue;
                    float *dst = dx + (c * s->h + (size_t)ih) * s->w + lo * st + j - s->padding;
                    const float *src = row + oh * ow_n;
                    if (st == 1)
                        for (size_t ow = lo; ow < hi; ow++) dst[ow - lo] += src[ow];
                    else
                        for (size_t ow = lo; ow < hi; ow++) dst[(ow - lo) * st] += src[ow];
                }
            }
}

/* The bias add and the bias-gradient sum over one output plane go in blocks of 8 with fixed-length
 * inner loops (vector code at -O2 too); the sum keeps 8 independent double lanes. */
enum { BLOCK = 8 };

static void add_bias(float *y, size_t count, float b)
{
    size_t q = 0;
    for (; q + BLOCK <= count; q += BLOCK)
        for (size_t j = 0; j < BLOCK; j++) y[q + j] += b;
    for (; q < count; q++) y[q] += b;
}

static double row_sum(const float *x, size_t count)
{
    double acc[BLOCK] = {0};
    size_t q = 0;
    for (; q + BLOCK <= count; q += BLOCK)
        for (size_t j = 0; j < BLOCK; j++) acc[j] += x[q + j];
    for (; q < count; q++) acc[0] += x[q];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
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
                add_bias(yn + c * p, p, b[c]);
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
                bacc[c] += row_sum(dyn + c * p, p);
    }
    if (bacc && rc == 0)
        for (size_t c = 0; c < s->c_out; c++) db[c] += (float)bacc[c];
    free(col);
    free(bacc);
    if (rc < 0) return ps_diag_set(d, rc, "conv2d", "out of memory in sgemm");
    return 0;
}
