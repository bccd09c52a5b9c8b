/* conv2d: 2-D cross-correlation over NCHW tensors, as torch.nn.functional.conv2d (groups = 1,
 * dilation = 1, symmetric zero padding), lowered to matrix products with im2col.
 *
 * For one sample, col[K, P] with K = c_in*kh*kw rows and P = out_h*out_w columns holds the input
 * patch under each output position (zeros where the window hangs over the padding):
 *     col[(c*kh + i)*kw + j, oh*out_w + ow] = x[c, oh*stride - pad + i, ow*stride - pad + j]
 * Then, per sample:
 *     forward   y[c_out, P]  = W[c_out, K] * col + b
 *     backward  dW[c_out, K] += dy[c_out, P] * col^T
 *               dx: stride 1 (padding < kernel, square kernel): the convolution of dy, padded
 *                   by k-1-padding, with W transposed and flipped (conv_dx); otherwise
 *                   dcol[K, P] = W^T * dy, and col2im scatters (adds) dcol back into dx
 *               db[c_out]    += sums of dy over samples and positions (double)
 * col is implicit: the sgemm asks for packed panels of col or col^T (ps_cpu_sgemm_bsource) and
 * col_run writes them straight from the image into the gemm's cache-sized packing buffer, so
 * the K x P matrix (85 MB for 64 channels at 192x192) is never stored or read back from memory.
 * Only the strided dx fallback stores dcol. The weights (the left operand of the forward and dx
 * products) are packed once per call for all samples (ps_cpu_apack).
 * With the AVX-512 kernel and at least 8 output channels, the forward, the stride-1 dx and dw take
 * dconv.c's gathered product instead (same bits, no column panels at all).
 * Invariants: buffers are per call (malloc, freed before return); samples are processed in
 * order, so results do not depend on the thread count (the sgemm splits C, never K).
 */
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/dconv.h"

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

/* ---- implicit im2col: the gemm packs col (or col^T) panels straight from the image ---------- */

struct colsrc {
    const struct ps_conv2d_shape *s;
    const float *x; /* one sample [c_in, h, w] */
    size_t oh_n, ow_n;
};

/* Writes positions [q, q + cnt) of row r = (c*kh + i)*kw + j of col to d[0], d[step], ...:
 * output rows at a time, zeros where the window reads the padding. */
static void col_run(const struct colsrc *cs, size_t r, size_t q, size_t cnt, float *restrict d,
                    size_t step)
{
    const struct ps_conv2d_shape *s = cs->s;
    size_t j = r % s->kw, i = (r / s->kw) % s->kh, c = r / (s->kw * s->kh);
    size_t st = s->stride, pad = s->padding, ow_n = cs->ow_n;
    size_t lo, hi, rlo, rhi;
    valid_cols(s, j, ow_n, &lo, &hi);
    valid_rows(s, i, cs->oh_n, &rlo, &rhi);
    size_t oh = q / ow_n, ow = q % ow_n;
    while (cnt > 0) {
        size_t run = ow_n - ow < cnt ? ow_n - ow : cnt, e = ow + run;
        if (oh < rlo || oh >= rhi || lo >= hi) {
            for (size_t t = 0; t < run; t++) d[t * step] = 0.0f;
        } else {
            /* row[o*st + j - pad] is x[c, oh*st + i - pad, o*st + j - pad], inside for o in
             * [lo, hi) */
            const float *row = cs->x + (c * s->h + oh * st + i - pad) * s->w;
            size_t a = ow < lo ? lo : ow, b = e < hi ? e : hi, o = ow;
            if (a > e) a = e;
            if (b < a) b = a;
            for (; o < a; o++) d[(o - ow) * step] = 0.0f;
            if (a < b && st == 1 && step == 1)
                memcpy(d + (a - ow), row + (a + j - pad), (b - a) * sizeof(float));
            else
                for (o = a; o < b; o++) d[(o - ow) * step] = row[o * st + j - pad];
            for (o = b; o < e; o++) d[(o - ow) * step] = 0.0f;
        }
        d += run * step;
        cnt -= run;
        ow = 0;
        oh++;
    }
}

/* op(B) = col [K, P]: rows are (c, i, j), columns output positions */
static void pack_col(const void *ctx, size_t p0, size_t kc, size_t j0, size_t width, float *dst,
                     size_t W)
{
    for (size_t p = 0; p < kc; p++) {
        float *d = dst + p * W;
        col_run(ctx, p0 + p, j0, width, d, 1);
        for (size_t j = width; j < W; j++) d[j] = 0.0f;
    }
}

/* op(B) = col^T [P, K]: rows are output positions, columns (c, i, j) */
static void pack_col_t(const void *ctx, size_t p0, size_t kc, size_t j0, size_t width,
                       float *dst, size_t W)
{
    for (size_t j = 0; j < width; j++) col_run(ctx, j0 + j, p0, kc, dst + j, W);
    for (size_t p = 0; p < kc && width < W; p++)
        for (size_t j = width; j < W; j++) dst[p * W + j] = 0.0f;
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
    return ps_cpu_conv2d_forward_cached(s, x, w, b, y, NULL, d);
}

int ps_cpu_conv2d_forward_cached(const struct ps_conv2d_shape *s, const float *x, const float *w,
                                 const float *b, float *y, struct ps_cpu_convcache *cache,
                                 struct ps_diag *d)
{
    int rc = check_shape(s, d);
    if (rc < 0) return rc;
    if (ps_cpu_dconv_usable(s->c_out)) {
        rc = ps_cpu_dconv_forward(s, x, w, b, y, cache);
        if (rc == -ENOMEM) return ps_diag_set(d, rc, "conv2d", "out of memory");
        if (rc != -EOVERFLOW) return rc;
    }
    size_t oh = ps_cpu_conv2d_out_h(s), ow = ps_cpu_conv2d_out_w(s), p = oh * ow;
    size_t k = s->c_in * s->kh * s->kw;
    bool direct = s->kh == 1 && s->kw == 1 && s->stride == 1 && s->padding == 0;
    struct ps_cpu_apack wp; /* the weights, packed once for every sample */
    rc = ps_cpu_apack_make(&wp, false, s->c_out, k, w, k);
    for (size_t n = 0; n < s->n && rc == 0; n++) {
        const float *xn = x + n * s->c_in * s->h * s->w;
        float *yn = y + n * s->c_out * p;
        struct colsrc cs = {s, xn, oh, ow};
        struct ps_cpu_bsource src = {pack_col, &cs};
        rc = ps_cpu_sgemm_apacked(&wp, p, 1.0f, xn, p, direct ? NULL : &src, 0.0f, yn, p);
        if (b && rc == 0)
            for (size_t c = 0; c < s->c_out; c++) add_bias(yn + c * p, p, b[c]);
    }
    ps_cpu_apack_free(&wp);
    if (rc < 0) return ps_diag_set(d, rc, "conv2d", "out of memory in sgemm");
    return 0;
}

/* dx of a stride-1 convolution is itself a convolution: of dy, padded by k-1-padding, with the
 * weight transposed in (c_out, c_in) and flipped in space (wt[c][o][kh-1-i][kw-1-j] =
 * w[o][c][i][j]); its output has the input's size. One gemm per sample with K = c_out*kh*kw,
 * no column matrix and no scatter. Needs padding <= k-1 in both directions. */
static bool dx_as_conv(const struct ps_conv2d_shape *s)
{
    return s->stride == 1 && s->padding < s->kh && s->padding < s->kw;
}

static int conv_dx(const struct ps_conv2d_shape *s, const float *w, const float *dy, float *dx)
{
    size_t kk = s->kh * s->kw, oh = ps_cpu_conv2d_out_h(s), ow = ps_cpu_conv2d_out_w(s);
    float *wt = malloc(s->c_in * s->c_out * kk * sizeof(float));
    if (!wt) return -ENOMEM;
    for (size_t o = 0; o < s->c_out; o++)
        for (size_t c = 0; c < s->c_in; c++)
            for (size_t t = 0; t < kk; t++)
                wt[(c * s->c_out + o) * kk + (kk - 1 - t)] = w[(o * s->c_in + c) * kk + t];
    /* the transposed convolution's shape: input dy [c_out, oh, ow], output [c_in, h, w] */
    struct ps_conv2d_shape t = {1,      s->c_out, oh, ow, s->c_in, s->kh,
                                s->kw,  1,        0};
    size_t ph = s->kh - 1 - s->padding;
    t.padding = ph; /* square kernels in this executor: kh == kw, one padding */
    size_t p = s->h * s->w, k = s->c_out * kk;
    struct ps_cpu_apack wp;
    int rc = ps_cpu_apack_make(&wp, false, s->c_in, k, wt, k);
    free(wt);
    for (size_t n = 0; n < s->n && rc == 0; n++) {
        struct colsrc cs = {&t, dy + n * s->c_out * oh * ow, s->h, s->w};
        struct ps_cpu_bsource src = {pack_col, &cs};
        rc = ps_cpu_sgemm_apacked(&wp, p, 1.0f, NULL, 0, &src, 0.0f, dx + n * s->c_in * p, p);
    }
    ps_cpu_apack_free(&wp);
    return rc;
}

int ps_cpu_conv2d_backward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                           const float *dy, float *dx, float *dw, float *db, struct ps_diag *d)
{
    return ps_cpu_conv2d_backward_cached(s, x, w, dy, dx, dw, db, NULL, d);
}

int ps_cpu_conv2d_backward_cached(const struct ps_conv2d_shape *s, const float *x,
                                  const float *w, const float *dy, float *dx, float *dw,
                                  float *db, struct ps_cpu_convcache *cache, struct ps_diag *d)
{
    int rc = check_shape(s, d);
    if (rc < 0) return rc;
    size_t oh = ps_cpu_conv2d_out_h(s), ow = ps_cpu_conv2d_out_w(s), p = oh * ow;
    size_t k = s->c_in * s->kh * s->kw, in_sz = s->c_in * s->h * s->w;
    bool fast_dx = dx_as_conv(s) && s->kh == s->kw;
    float *col = dx && !fast_dx ? malloc(k * p * sizeof(float)) : NULL;
    double *bacc = db ? calloc(s->c_out, sizeof(double)) : NULL;
    if ((dx && !fast_dx && !col) || (db && !bacc)) {
        free(col);
        free(bacc);
        return ps_diag_set(d, -ENOMEM, "conv2d", "out of memory for the column matrix");
    }
    if (dx && fast_dx) {
        rc = ps_cpu_dconv_usable(s->c_in) ? ps_cpu_dconv_dx(s, w, dy, dx, cache) : -EOVERFLOW;
        if (rc == -EOVERFLOW) rc = conv_dx(s, w, dy, dx);
    }
    bool gathered_dw = false;
    if (dw && rc == 0 && ps_cpu_dconv_usable(s->c_out)) {
        rc = ps_cpu_dconv_dw(s, x, dy, dw);
        gathered_dw = rc == 0;
        if (rc == -EOVERFLOW) rc = 0;
    }
    for (size_t n = 0; n < s->n && rc == 0; n++) {
        const float *dyn = dy + n * s->c_out * p;
        if (dw && !gathered_dw) {
            struct colsrc cs = {s, x + n * in_sz, oh, ow};
            struct ps_cpu_bsource src = {pack_col_t, &cs};
            rc = ps_cpu_sgemm_bsource(false, s->c_out, k, p, 1.0f, dyn, p, &src, 1.0f, dw, k);
        }
        if (dx && !fast_dx && rc == 0) {
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
