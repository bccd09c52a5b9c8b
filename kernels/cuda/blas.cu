/* blas: linear and conv2d on cuBLAS, with PyTorch's row-major layouts.
 *
 * cuBLAS is column-major. A row-major matrix X [r, c] with leading dimension ld IS the
 * column-major X^T [c, r] with the same ld, so the row-major product C = op(A) op(B) is computed
 * as the column-major C^T = op(B)^T op(A)^T: cublasSgemm(opB, opA, n, m, k, B, ldb, A, lda, C, ldc)
 * with opX = T exactly when row-major op(X) transposes X. ps_cuda_sgemm is that one mapping, and
 * everything else is written in ps_cpu_sgemm's row-major terms:
 *
 *   linear   y[N,out]  = x[N,in] W^T            sgemm(N, T)
 *            dx[N,in]  = dy[N,out] W[out,in]    sgemm(N, N)
 *            dW[out,in] += dy^T x               sgemm(T, N, beta 1)
 *   conv2d   per sample n (strided-batched over a chunk of samples):
 *            col_n[K,P] = im2col(x_n)            K = c_in kh kw, P = out_h out_w
 *            y_n[c_out,P] = W[c_out,K] col_n    dW += dy_n col_n^T (per sample, beta 1)
 *            dcol_n = W^T dy_n, dx_n = col2im(dcol_n) (a gather: no atomics, deterministic)
 *            1x1, stride 1, no padding: col_n IS x_n (no im2col).
 * Bias gradients are per-channel sums in double (ps::channel_sum, shared with batchnorm.cu).
 * Math mode is CUBLAS_DEFAULT_MATH (true fp32, no TF32), so results match the CPU to ~1e-6.
 * The im2col workspace is grown only by ps_cuda_blas_reserve (or, when a call needs more than
 * one sample's worth, here: outside timed work, the executor reserves everything up front); the
 * bias-gradient scratch likewise by ps_cuda_blas_reserve_bias, so no cudaFree/cudaMalloc (each
 * a device-wide synchronisation) happens inside a step.
 */
#include "kernels/cuda/common.cuh"

#include <cublas_v2.h>
#include <stdlib.h>

extern "C" {
#include "kernels/cpu/kernels.h"
}

namespace ps {
int channel_sum(const float *x, float *out, size_t C, size_t n, size_t S, double *partial,
                cudaStream_t s, struct ps_diag *d);

int fail_blas(struct ps_diag *d, int status, const char *what)
{
    cublasStatus_t st = (cublasStatus_t)status;
    return ps_diag_set(d, st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, "cublas", "%s: %s",
                       what, cublasGetStatusString(st));
}
} // namespace ps

#define CUB(call)                                                                              \
    do {                                                                                       \
        cublasStatus_t ps_s_ = (call);                                                         \
        if (ps_s_ != CUBLAS_STATUS_SUCCESS) return ps::fail_blas(d, (int)ps_s_, #call);        \
    } while (0)

struct ps_cuda_blas {
    cublasHandle_t h;
    cudaStream_t s;
    float *ws;       /* im2col workspace */
    size_t ws_bytes;
    double *red;     /* reduction scratch for bias gradients */
    size_t red_bytes;
};

namespace {

constexpr size_t kRedBytes = 1u << 20;

__global__ void add_bias(float *y, const float *__restrict__ b, size_t C, size_t total, size_t P)
{
    size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gs)
        y[e] += b[(e / P) % C];
}

struct cshape {
    size_t c_in, h, w, kh, kw, stride, pad, oh, ow;
};

/* col[s][(c*kh+i)*kw+j][oh*ow_n+ow] for samples [0, ns) of x */
__global__ void im2col(cshape s, const float *__restrict__ x, float *col, size_t ns)
{
    size_t P = s.oh * s.ow, K = s.c_in * s.kh * s.kw, total = ns * K * P;
    size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gs) {
        size_t q = e % P, r = (e / P) % K, n = e / (P * K);
        size_t ow = q % s.ow, oh = q / s.ow;
        size_t j = r % s.kw, i = (r / s.kw) % s.kh, c = r / (s.kw * s.kh);
        long ih = (long)(oh * s.stride + i) - (long)s.pad;
        long iw = (long)(ow * s.stride + j) - (long)s.pad;
        float v = 0.0f;
        if (ih >= 0 && ih < (long)s.h && iw >= 0 && iw < (long)s.w)
            v = x[((n * s.c_in + c) * s.h + (size_t)ih) * s.w + (size_t)iw];
        col[e] = v;
    }
}

/* dx[n][c][ih][iw] = sum of the col entries that read it (gather; overwrites dx) */
__global__ void col2im(cshape s, const float *__restrict__ col, float *dx, size_t ns)
{
    size_t P = s.oh * s.ow, K = s.c_in * s.kh * s.kw, total = ns * s.c_in * s.h * s.w;
    size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gs) {
        size_t iw = e % s.w, ih = (e / s.w) % s.h, c = (e / (s.w * s.h)) % s.c_in;
        size_t n = e / (s.w * s.h * s.c_in);
        const float *cn = col + n * K * P;
        float acc = 0.0f;
        for (size_t i = 0; i < s.kh; i++) {
            long t = (long)ih + (long)s.pad - (long)i;
            if (t < 0 || t % (long)s.stride) continue;
            size_t oh = (size_t)t / s.stride;
            if (oh >= s.oh) continue;
            for (size_t j = 0; j < s.kw; j++) {
                long u = (long)iw + (long)s.pad - (long)j;
                if (u < 0 || u % (long)s.stride) continue;
                size_t ow = (size_t)u / s.stride;
                if (ow >= s.ow) continue;
                acc += cn[((c * s.kh + i) * s.kw + j) * P + oh * s.ow + ow];
            }
        }
        dx[e] = acc;
    }
}

int ensure_red(struct ps_cuda_blas *b, size_t bytes, struct ps_diag *d)
{
    if (bytes <= b->red_bytes) return 0;
    CU(cudaStreamSynchronize(b->s));
    cudaFree(b->red);
    b->red = nullptr;
    b->red_bytes = 0;
    CU(cudaMalloc(&b->red, bytes));
    b->red_bytes = bytes;
    return 0;
}

int bias_grad(struct ps_cuda_blas *b, const float *dy, float *db, size_t C, size_t n, size_t P,
              struct ps_diag *d)
{
    int rc = ensure_red(b, ps_cuda_bn_scratch(C, n, P), d);
    if (rc < 0) return rc;
    return ps::channel_sum(dy, db, C, n, P, b->red, b->s, d);
}

int conv_check(const struct ps_conv2d_shape *s, cshape *c, struct ps_diag *d)
{
    if (!s->stride || !s->kh || !s->kw || !s->c_in || !s->c_out)
        return ps_diag_set(d, -EINVAL, "conv2d", "empty kernel or zero stride");
    c->oh = ps_cpu_conv2d_out_h(s);
    c->ow = ps_cpu_conv2d_out_w(s);
    if (!c->oh || !c->ow)
        return ps_diag_set(d, -EINVAL, "conv2d",
                           "kernel %zux%zu does not fit input %zux%zu with padding %zu", s->kh,
                           s->kw, s->h, s->w, s->padding);
    c->c_in = s->c_in;
    c->h = s->h;
    c->w = s->w;
    c->kh = s->kh;
    c->kw = s->kw;
    c->stride = s->stride;
    c->pad = s->padding;
    return 0;
}

bool conv_direct(const struct ps_conv2d_shape *s)
{
    return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->padding == 0;
}

/* samples per chunk that fit the workspace (grows to one sample when even that does not fit) */
int conv_chunk(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s, size_t *chunk,
               struct ps_diag *d)
{
    size_t per = ps_cuda_conv2d_workspace(s, 1);
    if (per == 0) {
        *chunk = s->n;
        return 0;
    }
    if (b->ws_bytes < per) {
        int rc = ps_cuda_blas_reserve(b, per, d);
        if (rc < 0) return rc;
    }
    *chunk = b->ws_bytes / per;
    if (*chunk > s->n) *chunk = s->n;
    return 0;
}

} // namespace

extern "C" {

int ps_cuda_blas_create(struct ps_cuda_blas **out, ps_cuda_stream s, struct ps_diag *d)
{
    *out = nullptr;
    struct ps_cuda_blas *b = (struct ps_cuda_blas *)calloc(1, sizeof(*b));
    if (!b) return ps_diag_set(d, -ENOMEM, "cublas", "out of memory");
    b->s = s;
    cublasStatus_t st = cublasCreate(&b->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return ps::fail_blas(d, (int)st, "cublasCreate");
    }
    int rc = 0;
    if ((st = cublasSetStream(b->h, s)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(b->h, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetPointerMode(b->h, CUBLAS_POINTER_MODE_HOST)) != CUBLAS_STATUS_SUCCESS)
        rc = ps::fail_blas(d, (int)st, "cublasSetStream/MathMode/PointerMode");
    if (rc == 0) rc = ensure_red(b, kRedBytes, d);
    if (rc < 0) {
        ps_cuda_blas_destroy(b);
        return rc;
    }
    *out = b;
    return 0;
}

void ps_cuda_blas_destroy(struct ps_cuda_blas *b)
{
    if (!b) return;
    if (b->h) (void)cublasDestroy(b->h);
    if (b->ws) (void)cudaFree(b->ws);
    if (b->red) (void)cudaFree(b->red);
    free(b);
}

int ps_cuda_blas_reserve_bias(struct ps_cuda_blas *b, size_t channels, size_t n, size_t spatial,
                              struct ps_diag *d)
{
    return ensure_red(b, ps_cuda_bn_scratch(channels, n, spatial), d);
}

int ps_cuda_blas_reserve(struct ps_cuda_blas *b, size_t bytes, struct ps_diag *d)
{
    if (bytes <= b->ws_bytes) return 0;
    CU(cudaStreamSynchronize(b->s)); /* the old workspace may still be in use */
    if (b->ws) cudaFree(b->ws);
    b->ws = nullptr;
    b->ws_bytes = 0;
    CU(cudaMalloc(&b->ws, bytes));
    b->ws_bytes = bytes;
    return 0;
}

int ps_cuda_sgemm(struct ps_cuda_blas *b, bool trans_a, bool trans_b, size_t m, size_t n,
                  size_t k, float alpha, const float *a, size_t lda, const float *bm, size_t ldb,
                  float beta, float *c, size_t ldc, struct ps_diag *d)
{
    if (m == 0 || n == 0) return 0;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        return ps_diag_set(d, -EOVERFLOW, "cublas", "sgemm %zux%zux%zu exceeds int sizes", m, n,
                           k);

    CUB(cublasSgemm(b->h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                    (int)n, (int)m, (int)k, &alpha, bm, (int)ldb, a, (int)lda, &beta, c,
                    (int)ldc));
    return 0;
}

static int sgemm_batched(struct ps_cuda_blas *b, bool trans_a, bool trans_b, size_t m, size_t n,
                         size_t k, const float *a, size_t lda, long long sa, const float *bm,
                         size_t ldb, long long sb, float beta, float *c, size_t ldc, long long sc,
                         size_t batch, struct ps_diag *d)
{
    const float one = 1.0f;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || batch > INT32_MAX)
        return ps_diag_set(d, -EOVERFLOW, "cublas", "batched sgemm exceeds int sizes");
    CUB(cublasSgemmStridedBatched(b->h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                  &one, bm, (int)ldb, sb, a, (int)lda, sa, &beta, c, (int)ldc, sc,
                                  (int)batch));
    return 0;
}

int ps_cuda_linear_forward(struct ps_cuda_blas *b, const float *x, const float *w,
                           const float *bias, float *y, size_t n, size_t in, size_t out,
                           struct ps_diag *d)
{
    int rc = ps_cuda_sgemm(b, false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out, d);
    if (rc < 0 || !bias || !n || !out) return rc;
    add_bias<<<ps::grid_for(n * out, 256), 256, 0, b->s>>>(y, bias, out, n * out, 1);
    LAUNCHED("linear bias");
    return 0;
}

int ps_cuda_linear_backward(struct ps_cuda_blas *b, const float *x, const float *w,
                            const float *dy, float *dx, float *dw, float *db, size_t n, size_t in,
                            size_t out, struct ps_diag *d)
{
    int rc = 0;
    if (dx) rc = ps_cuda_sgemm(b, false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in, d);
    if (rc == 0 && dw)
        rc = ps_cuda_sgemm(b, true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in, d);
    if (rc == 0 && db && n && out) rc = bias_grad(b, dy, db, out, n, 1, d);
    return rc;
}

size_t ps_cuda_conv2d_workspace(const struct ps_conv2d_shape *s, size_t samples)
{
    if (conv_direct(s)) return 0;
    size_t P = ps_cpu_conv2d_out_h(s) * ps_cpu_conv2d_out_w(s);
    return samples * s->c_in * s->kh * s->kw * P * sizeof(float);
}

int ps_cuda_conv2d_forward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s,
                           const float *x, const float *w, const float *bias, float *y,
                           struct ps_diag *d)
{
    cshape c;
    int rc = conv_check(s, &c, d);
    if (rc < 0 || !s->n) return rc;
    size_t P = c.oh * c.ow, K = s->c_in * s->kh * s->kw, in_sz = s->c_in * s->h * s->w;
    size_t chunk;
    if ((rc = conv_chunk(b, s, &chunk, d)) < 0) return rc;
    bool direct = conv_direct(s);
    for (size_t n0 = 0; n0 < s->n; n0 += chunk) {
        size_t ns = s->n - n0 < chunk ? s->n - n0 : chunk;
        const float *xn = x + n0 * in_sz;
        if (!direct) {
            im2col<<<ps::grid_for(ns * K * P, 256), 256, 0, b->s>>>(c, xn, b->ws, ns);
            LAUNCHED("conv2d im2col");
        }
        rc = sgemm_batched(b, false, false, s->c_out, P, K, w, K, 0, direct ? xn : b->ws, P,
                           (long long)(direct ? in_sz : K * P), 0.0f, y + n0 * s->c_out * P, P,
                           (long long)(s->c_out * P), ns, d);
        if (rc < 0) return rc;
    }
    if (bias) {
        add_bias<<<ps::grid_for(s->n * s->c_out * P, 256), 256, 0, b->s>>>(
            y, bias, s->c_out, s->n * s->c_out * P, P);
        LAUNCHED("conv2d bias");
    }
    return 0;
}

int ps_cuda_conv2d_backward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s,
                            const float *x, const float *w, const float *dy, float *dx, float *dw,
                            float *db, struct ps_diag *d)
{
    cshape c;
    int rc = conv_check(s, &c, d);
    if (rc < 0 || !s->n) return rc;
    size_t P = c.oh * c.ow, K = s->c_in * s->kh * s->kw, in_sz = s->c_in * s->h * s->w;
    size_t chunk;
    if ((rc = conv_chunk(b, s, &chunk, d)) < 0) return rc;
    bool direct = conv_direct(s);
    for (size_t n0 = 0; n0 < s->n && (dw || dx); n0 += chunk) {
        size_t ns = s->n - n0 < chunk ? s->n - n0 : chunk;
        const float *xn = x + n0 * in_sz, *dyn = dy + n0 * s->c_out * P;
        if (dw) {
            if (!direct) {
                im2col<<<ps::grid_for(ns * K * P, 256), 256, 0, b->s>>>(c, xn, b->ws, ns);
                LAUNCHED("conv2d im2col");
            }
            for (size_t q = 0; q < ns; q++) {
                const float *colq = direct ? xn + q * in_sz : b->ws + q * K * P;
                rc = ps_cuda_sgemm(b, false, true, s->c_out, K, P, 1.0f, dyn + q * s->c_out * P,
                                   P, colq, P, 1.0f, dw, K, d);
                if (rc < 0) return rc;
            }
        }
        if (dx) {
            float *dst = direct ? dx + n0 * in_sz : b->ws;
            rc = sgemm_batched(b, true, false, K, P, s->c_out, w, K, 0, dyn, P,
                               (long long)(s->c_out * P), 0.0f, dst, P, (long long)(K * P), ns, d);
            if (rc < 0) return rc;
            if (!direct) {
                col2im<<<ps::grid_for(ns * in_sz, 256), 256, 0, b->s>>>(c, b->ws, dx + n0 * in_sz,
                                                                       ns);
                LAUNCHED("conv2d col2im");
            }
        }
    }
    if (db) return bias_grad(b, dy, db, s->c_out, s->n, P, d);
    return 0;
}

} /* extern "C" */
