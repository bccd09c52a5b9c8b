/* kernels: the elementwise, dropout, pooling and loss kernels of the CUDA backend.
 *
 * Each kernel matches its CPU twin in kernels/cpu (same formula, same float/double rounding
 * points) so the two backends agree to fp32 rounding, and bit for bit where the CPU result is a
 * pure elementwise function (relu, dropout masks and values, SGD, add):
 *  - dropout uses the counter-based generator of kernels/cpu/rng.c, copied below as device
 *    functions: element i is kept iff uniform(seed, offset, i) >= p, scaled by 1/(1-p) computed
 *    in float on the host exactly as the CPU does;
 *  - maxpool keeps the first maximum in scan order (NaN wins) and its backward adds with
 *    atomicAdd (overlapping windows may pick the same input; the order of the adds is free);
 *  - losses reduce in double in one block (the model output is small) and write a device double.
 * Elementwise kernels are grid-stride with 16-byte (float4) accesses when pointers are aligned.
 */
#include "kernels/cuda/common.cuh"

extern "C" {
#include "kernels/cpu/kernels.h"
}

#include <math.h>

namespace {

using ps::kBlock;

__device__ __forceinline__ bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

__global__ void relu_fwd(const float *__restrict__ x, float *y, size_t count)
{
    size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (aligned16(x) && aligned16(y)) {
        size_t n4 = count / 4;
        for (size_t i = t; i < n4; i += stride) {
            float4 v = reinterpret_cast<const float4 *>(x)[i];
            v.x = v.x > 0.0f ? v.x : 0.0f;
            v.y = v.y > 0.0f ? v.y : 0.0f;
            v.z = v.z > 0.0f ? v.z : 0.0f;
            v.w = v.w > 0.0f ? v.w : 0.0f;
            reinterpret_cast<float4 *>(y)[i] = v;
        }
        for (size_t i = n4 * 4 + t; i < count; i += stride) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    } else {
        for (size_t i = t; i < count; i += stride) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}

__global__ void relu_bwd(const float *__restrict__ y, const float *dy, float *dx, size_t count)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* __fmul_rn: nvcc would contract p - lr*g into one fused multiply-add (one rounding), while the
 * CPU rounds the product first; the explicit product keeps SGD bit for bit equal to the CPU's. */
__global__ void sgd(float *p, const float *__restrict__ g, size_t count, float lr)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        p[i] -= __fmul_rn(lr, g[i]);
}

__global__ void add_inplace(float *y, const float *__restrict__ x, size_t count)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        y[i] += x[i];
}

/* ---- rng: kernels/cpu/rng.c, verbatim ---- */
#define GOLDEN 0x9E3779B97F4A7C15ull

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__host__ __device__ __forceinline__ uint64_t stream_key(uint64_t seed, uint64_t stream)
{
    return mix64(mix64(seed + GOLDEN) ^ (stream * 0xD1B54A32D192ED03ull + GOLDEN));
}

__device__ __forceinline__ float to_unit(uint64_t r)
{
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}

__global__ void dropout_fwd(const float *x, float *y, uint8_t *mask, size_t count, float p,
                            float scale, uint64_t key)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        bool keep = to_unit(mix64(key + (i + 1) * GOLDEN)) >= p;
        float v = x[i];
        y[i] = keep ? v * scale : 0.0f;
        if (mask) mask[i] = keep;
    }
}

__global__ void dropout_fill(const float *x, float *y, uint8_t *mask, size_t count, int keep)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        y[i] = keep ? x[i] : 0.0f;
        if (mask) mask[i] = (uint8_t)keep;
    }
}

__global__ void dropout_bwd(const float *dy, const uint8_t *__restrict__ mask, float *dx,
                            size_t count, float scale, int zero)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dx[i] = (!zero && mask[i]) ? dy[i] * scale : 0.0f;
}

/* ---- maxpool ---- */
struct pool {
    size_t planes, h, w, oh, ow, k, stride, pad;
};

__global__ void maxpool_fwd(pool s, const float *__restrict__ x, float *y, int32_t *idx)
{
    size_t total = s.planes * s.oh * s.ow, gs = (size_t)gridDim.x * blockDim.x;
    for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += gs) {
        size_t ow = o % s.ow, oh = (o / s.ow) % s.oh, pl = o / (s.ow * s.oh);
        const float *xp = x + pl * s.h * s.w;
        long h0 = (long)(oh * s.stride) - (long)s.pad, h1 = h0 + (long)s.k;
        long w0 = (long)(ow * s.stride) - (long)s.pad, w1 = w0 + (long)s.k;
        if (h0 < 0) h0 = 0;
        if (h1 > (long)s.h) h1 = (long)s.h;
        if (w0 < 0) w0 = 0;
        if (w1 > (long)s.w) w1 = (long)s.w;
        float best = -INFINITY;
        size_t bi = (size_t)h0 * s.w + (size_t)w0;
        for (long ih = h0; ih < h1; ih++)
            for (long iw = w0; iw < w1; iw++) {
                size_t k = (size_t)ih * s.w + (size_t)iw;
                float v = xp[k];
                if (v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    bi = k;
                }
            }
        y[o] = best;
        if (idx) idx[o] = (int32_t)bi;
    }
}

__global__ void maxpool_bwd(pool s, const float *__restrict__ dy, const int32_t *__restrict__ idx,
                            float *dx)
{
    size_t total = s.planes * s.oh * s.ow, gs = (size_t)gridDim.x * blockDim.x;
    size_t op = s.oh * s.ow, plane = s.h * s.w;
    for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += gs)
        atomicAdd(&dx[(o / op) * plane + (size_t)idx[o]], dy[o]);
}

/* ---- losses: one block, double accumulation ---- */
__global__ void loss_sum(const float *__restrict__ y, size_t count, double *out)
{
    __shared__ double sm[32];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) s += y[i];
    s = ps::block_sum(s, sm);
    if (threadIdx.x == 0) *out = s;
}

__global__ void fill(float *p, size_t count, float v)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) p[i] = v;
}

__global__ void loss_mse(const float *__restrict__ y, const float *__restrict__ t, size_t count,
                         double *out)
{
    __shared__ double sm[32];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) {
        double e = (double)y[i] - t[i];
        s += e * e;
    }
    s = ps::block_sum(s, sm);
    if (threadIdx.x == 0) *out = count ? s / (double)count : (double)NAN;
}

__global__ void loss_mse_bwd(const float *y, const float *t, float *dy, size_t count, double k)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        dy[i] = (float)(k * ((double)y[i] - t[i]));
}

/* log(sum(exp(z - max))) + max of one row, by one warp */
__device__ double warp_lse(const float *row, size_t k)
{
    double mx = row[0];
    for (size_t j = threadIdx.x & 31; j < k; j += 32) mx = fmax(mx, (double)row[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double s = 0.0;
    for (size_t j = threadIdx.x & 31; j < k; j += 32) s += exp((double)row[j] - mx);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return log(s) + mx;
}

__global__ void loss_ce(const float *__restrict__ z, const int64_t *__restrict__ labels, size_t n,
                        size_t k, double *out)
{
    __shared__ double sm[32];
    int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double s = 0.0;
    for (size_t i = (size_t)warp; i < n; i += (size_t)nw) {
        const float *row = z + i * k;
        double lse = warp_lse(row, k);
        int64_t l = labels[i];
        double v = (l >= 0 && (uint64_t)l < k) ? lse - row[l] : (double)NAN;
        if ((threadIdx.x & 31) == 0) s += v;
    }
    s = ps::block_sum(s, sm);
    if (threadIdx.x == 0) *out = s / (double)n;
}

__global__ void loss_ce_bwd(const float *__restrict__ z, const int64_t *__restrict__ labels,
                            float *dz, size_t n, size_t k, double scale)
{
    size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < n; i += warps) {
        const float *row = z + i * k;
        double lse = warp_lse(row, k);
        int64_t l = labels[i];
        bool ok = l >= 0 && (uint64_t)l < k;
        for (size_t j = threadIdx.x & 31; j < k; j += 32) {
            double p = exp((double)row[j] - lse);
            dz[i * k + j] = ok ? (float)(scale * (p - (j == (size_t)l ? 1.0 : 0.0))) : NAN;
        }
    }
}

} // namespace

extern "C" {

int ps_cuda_relu_forward(const float *x, float *y, size_t count, ps_cuda_stream s,
                         struct ps_diag *d)
{
    if (!count) return 0;
    relu_fwd<<<ps::grid_for(count / 4 + 1, kBlock), kBlock, 0, s>>>(x, y, count);
    LAUNCHED("relu_forward");
    return 0;
}

int ps_cuda_relu_backward(const float *y, const float *dy, float *dx, size_t count,
                          ps_cuda_stream s, struct ps_diag *d)
{
    if (!count) return 0;
    relu_bwd<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(y, dy, dx, count);
    LAUNCHED("relu_backward");
    return 0;
}

int ps_cuda_sgd_step(float *p, const float *g, size_t count, float lr, ps_cuda_stream s,
                     struct ps_diag *d)
{
    if (!count) return 0;
    sgd<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(p, g, count, lr);
    LAUNCHED("sgd_step");
    return 0;
}

int ps_cuda_add_inplace(float *y, const float *x, size_t count, ps_cuda_stream s,
                        struct ps_diag *d)
{
    if (!count) return 0;
    add_inplace<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(y, x, count);
    LAUNCHED("add_inplace");
    return 0;
}

int ps_cuda_dropout_forward(const float *x, float *y, uint8_t *mask, size_t count, float p,
                            uint64_t seed, uint64_t offset, ps_cuda_stream s, struct ps_diag *d)
{
    if (!count) return 0;
    unsigned g = ps::grid_for(count, kBlock);
    if (p <= 0.0f || p >= 1.0f) {
        dropout_fill<<<g, kBlock, 0, s>>>(x, y, mask, count, p <= 0.0f);
    } else {
        float scale = 1.0f / (1.0f - p);
        dropout_fwd<<<g, kBlock, 0, s>>>(x, y, mask, count, p, scale, stream_key(seed, offset));
    }
    LAUNCHED("dropout_forward");
    return 0;
}

int ps_cuda_dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t count,
                             float p, ps_cuda_stream s, struct ps_diag *d)
{
    if (!count) return 0;
    float scale = p <= 0.0f ? 1.0f : 1.0f / (1.0f - p);
    dropout_bwd<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(dy, mask, dx, count, scale,
                                                               p >= 1.0f);
    LAUNCHED("dropout_backward");
    return 0;
}

static int pool_shape(const struct ps_pool2d_shape *sh, pool *p, struct ps_diag *d)
{
    if (sh->kernel == 0 || sh->stride == 0 || 2 * sh->padding > sh->kernel)
        return ps_diag_set(d, -EINVAL, "maxpool2d", "bad kernel %zu, stride %zu, padding %zu",
                           sh->kernel, sh->stride, sh->padding);
    p->oh = ps_cpu_maxpool2d_out_h(sh);
    p->ow = ps_cpu_maxpool2d_out_w(sh);
    if (!p->oh || !p->ow)
        return ps_diag_set(d, -EINVAL, "maxpool2d", "kernel %zu does not fit input %zux%zu",
                           sh->kernel, sh->h, sh->w);
    if (sh->h * sh->w > (size_t)INT32_MAX)
        return ps_diag_set(d, -EOVERFLOW, "maxpool2d", "plane too large for indices");
    p->planes = sh->n * sh->c;
    p->h = sh->h;
    p->w = sh->w;
    p->k = sh->kernel;
    p->stride = sh->stride;
    p->pad = sh->padding;
    return 0;
}

int ps_cuda_maxpool2d_forward(const struct ps_pool2d_shape *sh, const float *x, float *y,
                              int32_t *idx, ps_cuda_stream s, struct ps_diag *d)
{
    pool p;
    int rc = pool_shape(sh, &p, d);
    if (rc < 0) return rc;
    size_t total = p.planes * p.oh * p.ow;
    if (!total) return 0;
    maxpool_fwd<<<ps::grid_for(total, kBlock), kBlock, 0, s>>>(p, x, y, idx);
    LAUNCHED("maxpool2d_forward");
    return 0;
}

int ps_cuda_maxpool2d_backward(const struct ps_pool2d_shape *sh, const float *dy,
                               const int32_t *idx, float *dx, ps_cuda_stream s,
                               struct ps_diag *d)
{
    pool p;
    int rc = pool_shape(sh, &p, d);
    if (rc < 0) return rc;
    CU(cudaMemsetAsync(dx, 0, p.planes * p.h * p.w * sizeof(float), s));
    size_t total = p.planes * p.oh * p.ow;
    if (!total) return 0;
    maxpool_bwd<<<ps::grid_for(total, kBlock), kBlock, 0, s>>>(p, dy, idx, dx);
    LAUNCHED("maxpool2d_backward");
    return 0;
}

int ps_cuda_loss_sum_forward(const float *y, size_t count, double *d_loss, ps_cuda_stream s,
                             struct ps_diag *d)
{
    loss_sum<<<1, 1024, 0, s>>>(y, count, d_loss);
    LAUNCHED("loss_sum_forward");
    return 0;
}

int ps_cuda_loss_sum_backward(float *dy, size_t count, float g, ps_cuda_stream s,
                              struct ps_diag *d)
{
    if (!count) return 0;
    fill<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(dy, count, g);
    LAUNCHED("loss_sum_backward");
    return 0;
}

int ps_cuda_loss_mse_forward(const float *y, const float *t, size_t count, double *d_loss,
                             ps_cuda_stream s, struct ps_diag *d)
{
    loss_mse<<<1, 1024, 0, s>>>(y, t, count, d_loss);
    LAUNCHED("loss_mse_forward");
    return 0;
}

int ps_cuda_loss_mse_backward(const float *y, const float *t, float *dy, size_t count, float g,
                              ps_cuda_stream s, struct ps_diag *d)
{
    if (!count) return 0;
    double k = 2.0 * g / (double)count;
    loss_mse_bwd<<<ps::grid_for(count, kBlock), kBlock, 0, s>>>(y, t, dy, count, k);
    LAUNCHED("loss_mse_backward");
    return 0;
}

int ps_cuda_loss_ce_forward(const float *z, const int64_t *labels, size_t n, size_t k,
                            double *d_loss, ps_cuda_stream s, struct ps_diag *d)
{
    if (!n || !k)
        return ps_diag_set(d, -EINVAL, "cross_entropy", "empty input: %zu samples, %zu classes",
                           n, k);
    loss_ce<<<1, 1024, 0, s>>>(z, labels, n, k, d_loss);
    LAUNCHED("loss_ce_forward");
    return 0;
}

int ps_cuda_loss_ce_backward(const float *z, const int64_t *labels, float *dz, size_t n, size_t k,
                             float g, ps_cuda_stream s, struct ps_diag *d)
{
    if (!n || !k)
        return ps_diag_set(d, -EINVAL, "cross_entropy", "empty input: %zu samples, %zu classes",
                           n, k);
    double scale = (double)g / (double)n;
    loss_ce_bwd<<<ps::grid_for(n * 32, kBlock), kBlock, 0, s>>>(z, labels, dz, n, k, scale);
    LAUNCHED("loss_ce_backward");
    return 0;
}

} /* extern "C" */
