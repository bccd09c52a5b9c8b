/* batchnorm: BatchNorm forward/backward and the running-statistics policies on the GPU, matching
 * kernels/cpu/batchnorm.c (SEMANTICS.md section 7) to fp32 rounding.
 *
 * Every operation is "per-channel reduction, then per-channel finalize, then (maybe) an
 * elementwise pass", over x laid out [N, C, S]:
 *
 *     reduce     grid (channel tiles, splits): each block sums its slice of rows of one channel
 *                (or, for small S, of 32 channels: a warp per channel walking its elements in
 *                memory order; for S < 4 a lane per channel) in double, ONE pass giving two sums:
 *                  stats     sum x,  sum x^2
 *                  backward  sum dy, sum dy (x - mean)
 *                  sum       sum x (bias gradients)
 *                and writes partial[split][C][2].
 *     finalize   one thread per channel adds the partials in split order (deterministic), then
 *                does the policy's arithmetic in double: mean, biased var, invstd, the EMA with
 *                the unbiased variance (train), the DeferredBatchNorm accumulate/commit, the
 *                backward coefficients, and the per-channel affine map of the elementwise pass.
 *     apply      y = x*scale + shift  |  dx = (dy - mean_dy - (x-mu) k) invstd w, in double per
 *                element like the CPU; 16-byte loads; one block row per (n, c) plane when planes
 *                are large (no division per element), grid-stride elementwise otherwise.
 *
 * Bandwidth (large planes, e.g. [256,256,56,56]): memory traffic is the minimum for a two-pass
 * plan, forward 12 B/element (x read by reduce and by apply, y written), backward 20 B/element.
 * Both plane kernels issue kUnroll independent 16-byte loads per thread before using any (a
 * plane of 3136 floats is 784 float4, so a 256-thread block has every load of a plane in
 * flight at once), and the reduce grid is sized to about four waves of resident blocks with
 * rows split evenly, so that the last, partial wave costs little.
 *
 * Invariants: num_batches_tracked lives on the host and changes at issue time exactly once per
 * train forward and per commit; the EMA factor is computed on the host (ps_cpu_bn_factor's rule)
 * and passed by value; nothing here allocates, so a layer's scratch (ps_cuda_bn_scratch bytes)
 * must be allocated up front. The variance comes from sum x^2/m - mean^2 in double (one pass),
 * where the CPU uses two passes: the two agree to ~1e-12 relative for activations whose mean is
 * not 1e6 times their spread.
 */
#include "kernels/cuda/common.cuh"

#include <math.h>

namespace {

constexpr int kTarget = 4224; /* ~4 waves of 8 blocks per SM on an H200 (132 SMs); fixed so
                                 the scratch size is a pure function of the shape */
constexpr int kSmallS = 128;  /* below this spatial size, tile channels instead of rows */
constexpr int kUnroll = 4;    /* independent 16-byte loads in flight per thread */

enum { R_STATS, R_BWD, R_SUM };

struct geom {
    bool rows;      /* small-S kernel: 32 channels per block, threads over rows */
    unsigned tiles; /* blocks along channels */
    unsigned splits;
    size_t max_splits; /* bound on splits for any n' <= n (sizes the scratch) */
};

geom plan(size_t C, size_t n, size_t S)
{
    geom g;
    g.rows = S < (size_t)kSmallS;
    g.tiles = g.rows ? (unsigned)((C + 31) / 32) : (unsigned)C;
    size_t sp = ((size_t)kTarget + g.tiles - 1) / g.tiles;
    if (sp > n) sp = n;
    if (sp < 1) sp = 1;
    /* rows per split, then as many splits as needed: every split gets rows, evenly */
    size_t per = (n + sp - 1) / sp;
    g.splits = (unsigned)(per ? (n + per - 1) / per : 1);
    if (g.splits < 1) g.splits = 1;
    g.max_splits = sp;
    return g;
}

__device__ __forceinline__ void acc2(int op, float v, float gdy, double mu, double &a, double &b)
{
    if (op == R_STATS) {
        a += v;
        b += (double)v * v;
    } else if (op == R_BWD) {
        a += gdy;
        b += (double)gdy * ((double)v - mu);
    } else {
        a += v;
    }
}

/* One channel per block (blockIdx.x), rows [n0, n1) of split blockIdx.y. */
template <int OP>
__global__ void __launch_bounds__(256) reduce_planes(const float *__restrict__ x,
                                                     const float *__restrict__ dy,
                                                     const float *__restrict__ mean, size_t C,
                                                     size_t n, size_t S, double *partial)
{
    __shared__ double sm[32];
    size_t c = blockIdx.x, splits = gridDim.y, per = (n + splits - 1) / splits;
    size_t n0 = blockIdx.y * per, n1 = n0 + per < n ? n0 + per : n;
    double mu = OP == R_BWD ? (double)mean[c] : 0.0;
    double a = 0.0, b = 0.0;
    bool vec = (S % 4) == 0 && ((uintptr_t)x & 15u) == 0 && (OP != R_BWD || ((uintptr_t)dy & 15u) == 0);
    for (size_t i = n0; i < n1; i++) {
        size_t base = (i * C + c) * S;
        if (vec) {
            const float4 *x4 = reinterpret_cast<const float4 *>(x + base);
            const float4 *g4 = OP == R_BWD ? reinterpret_cast<const float4 *>(dy + base) : nullptr;
            size_t S4 = S / 4;
            for (size_t k0 = threadIdx.x; k0 < S4; k0 += (size_t)kUnroll * blockDim.x) {
                float4 v[kUnroll], g[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; u++) { /* all loads first */
                    size_t k = k0 + (size_t)u * blockDim.x;
                    v[u] = k < S4 ? __ldg(x4 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
                    g[u] = OP == R_BWD && k < S4 ? __ldg(g4 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    if (k0 + (size_t)u * blockDim.x >= S4) break;
                    acc2(OP, v[u].x, g[u].x, mu, a, b);
                    acc2(OP, v[u].y, g[u].y, mu, a, b);
                    acc2(OP, v[u].z, g[u].z, mu, a, b);
                    acc2(OP, v[u].w, g[u].w, mu, a, b);
                }
            }
        } else {
            for (size_t k = threadIdx.x; k < S; k += blockDim.x)
                acc2(OP, x[base + k], OP == R_BWD ? dy[base + k] : 0.0f, mu, a, b);
        }
    }
    a = ps::block_sum(a, sm);
    b = ps::block_sum(b, sm);
    if (threadIdx.x == 0) {
        partial[(blockIdx.y * C + c) * 2] = a;
        partial[(blockIdx.y * C + c) * 2 + 1] = b;
    }
}

/* S < 4 (BatchNorm1d's S = 1 above all): 32 channels per block (threadIdx.x, so a warp reads 32
   neighbouring channels: contiguous when S = 1), threadIdx.y over the elements of rows [n0, n1). */
template <int OP>
__global__ void __launch_bounds__(256) reduce_chan(const float *__restrict__ x,
                                                   const float *__restrict__ dy,
                                                   const float *__restrict__ mean, size_t C,
                                                   size_t n, size_t S, double *partial)
{
    __shared__ double sa[8][33], sb[8][33];
    size_t c = (size_t)blockIdx.x * 32 + threadIdx.x, splits = gridDim.y;
    size_t per = (n + splits - 1) / splits;
    size_t n0 = blockIdx.y * per, n1 = n0 + per < n ? n0 + per : n;
    double a = 0.0, b = 0.0;
    if (c < C) {
        double mu = OP == R_BWD ? (double)mean[c] : 0.0;
        size_t elems = (n1 > n0 ? n1 - n0 : 0) * S;
        for (size_t e = threadIdx.y; e < elems; e += blockDim.y) {
            size_t i = n0 + e / S, k = e % S, at = (i * C + c) * S + k;
            acc2(OP, x[at], OP == R_BWD ? dy[at] : 0.0f, mu, a, b);
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (unsigned r = 1; r < blockDim.y; r++) {
            a += sa[r][threadIdx.x];
            b += sb[r][threadIdx.x];
        }
        partial[(blockIdx.y * C + c) * 2] = a;
        partial[(blockIdx.y * C + c) * 2 + 1] = b;
    }
}

/* Small planes, 4 <= S < kSmallS: a block takes 32 channels and rows [n0, n1); warp w takes
   channels w, w+8, w+16, w+24 of them, and its lanes walk one channel's elements in memory
   order (row after row, S contiguous floats each), so a warp loads runs of S floats instead of
   32 floats S apart (one 32-byte sector per lane). (i, k) advance by 32 elements without a
   division. The lanes' sums meet by shuffles in a fixed order (deterministic). */
template <int OP>
__global__ void __launch_bounds__(256) reduce_rows(const float *__restrict__ x,
                                                   const float *__restrict__ dy,
                                                   const float *__restrict__ mean, size_t C,
                                                   size_t n, size_t S, double *partial)
{
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    size_t splits = gridDim.y, per = (n + splits - 1) / splits;
    size_t n0 = blockIdx.y * per, n1 = n0 + per < n ? n0 + per : n;
    size_t elems = (n1 > n0 ? n1 - n0 : 0) * S, q = 32 / S, r = 32 % S;
    for (unsigned cc = warp; cc < 32; cc += blockDim.x / 32) {
        size_t c = (size_t)blockIdx.x * 32 + cc;
        if (c >= C) break; /* the same for every lane of the warp */
        double mu = OP == R_BWD ? (double)mean[c] : 0.0, a = 0.0, b = 0.0;
        size_t i = n0 + lane / S, k = lane % S;
        for (size_t e = lane; e < elems; e += 32) {
            size_t at = (i * C + c) * S + k;
            acc2(OP, x[at], OP == R_BWD ? dy[at] : 0.0f, mu, a, b);
            i += q;
            k += r;
            if (k >= S) {
                k -= S;
                i++;
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, off);
            b += __shfl_down_sync(0xffffffffu, b, off);
        }
        if (lane == 0) {
            partial[(blockIdx.y * C + c) * 2] = a;
            partial[(blockIdx.y * C + c) * 2 + 1] = b;
        }
    }
}

template <int OP>
void launch_reduce(const geom &g, const float *x, const float *dy, const float *mean, size_t C,
                   size_t n, size_t S, double *partial, cudaStream_t s)
{
    dim3 grid(g.tiles, g.splits);
    if (g.rows && S < 4)
        reduce_chan<OP><<<grid, dim3(32, 8), 0, s>>>(x, dy, mean, C, n, S, partial);
    else if (g.rows)
        reduce_rows<OP><<<grid, 256, 0, s>>>(x, dy, mean, C, n, S, partial);
    else reduce_planes<OP><<<grid, 256, 0, s>>>(x, dy, mean, C, n, S, partial);
}

__device__ __forceinline__ void sum_partials(const double *partial, unsigned splits, size_t C,
                                             size_t c, double &a, double &b)
{
    a = 0.0;
    b = 0.0;
    for (unsigned k = 0; k < splits; k++) {
        a += partial[(k * C + c) * 2];
        b += partial[(k * C + c) * 2 + 1];
    }
}

/* Forward finalize: coef[c] = {scale, shift} (doubles) for the apply pass. mode as ps_bn_mode. */
__global__ void fin_forward(int mode, const double *partial, unsigned splits, size_t C, double m,
                            float eps, double factor, const float *weight, const float *bias,
                            float *rmean, float *rvar, float *save_mean, float *save_invstd,
                            float *log_mean, float *log_var, double *coef)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double mu, invstd;
    if (mode != 2) {
        double a, b;
        sum_partials(partial, splits, C, c, a, b);
        mu = a / m;
        double var = b / m - mu * mu;
        if (var < 0.0) var = 0.0;
        invstd = 1.0 / sqrt(var + (double)eps);
        if (mode == 0) {
            double unb = var * m / (m - 1.0);
            rmean[c] = (float)((1.0 - factor) * rmean[c] + factor * mu);
            rvar[c] = (float)((1.0 - factor) * rvar[c] + factor * unb);
            if (log_mean) log_mean[c] = (float)mu;
            if (log_var) log_var[c] = (float)unb;
        }
    } else {
        mu = rmean[c];
        invstd = 1.0 / sqrt((double)rvar[c] + (double)eps);
    }
    if (save_mean) save_mean[c] = (float)mu;
    if (save_invstd) save_invstd[c] = (float)invstd;
    double g = weight ? (double)weight[c] : 1.0, bb = bias ? (double)bias[c] : 0.0;
    double scale = invstd * g;
    coef[2 * c] = scale;
    coef[2 * c + 1] = bb - mu * scale;
}

/* Backward finalize: parameter gradients and coef[c] = {mu, mean_dy, k, invstd*w}. */
__global__ void fin_backward(bool training, const double *partial, unsigned splits, size_t C,
                             double m, const float *save_mean, const float *save_invstd,
                             const float *weight, float *dweight, float *dbias, double *coef)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sum_dy, sum_dy_xmu;
    sum_partials(partial, splits, C, c, sum_dy, sum_dy_xmu);
    double invstd = save_invstd[c];
    if (dweight) dweight[c] += (float)(sum_dy_xmu * invstd);
    if (dbias) dbias[c] += (float)sum_dy;
    double g = weight ? (double)weight[c] : 1.0;
    coef[4 * c] = save_mean[c];
    coef[4 * c + 1] = training ? sum_dy / m : 0.0;
    coef[4 * c + 2] = training ? sum_dy_xmu * invstd * invstd / m : 0.0;
    coef[4 * c + 3] = invstd * g;
}

__global__ void fin_accumulate(const double *partial, unsigned splits, size_t C, double *sum,
                               double *sum_sq)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a, b;
    sum_partials(partial, splits, C, c, a, b);
    sum[c] += a;
    sum_sq[c] += b;
}

__global__ void fin_commit(size_t C, double count, double factor, double *sum, double *sum_sq,
                           float *rmean, float *rvar, float *log_mean, float *log_var)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double mean = sum[c] / count, var = sum_sq[c] / count - mean * mean;
    rmean[c] = (float)((1.0 - factor) * rmean[c] + factor * mean);
    rvar[c] = (float)((1.0 - factor) * rvar[c] + factor * var);
    if (log_mean) log_mean[c] = (float)mean;
    if (log_var) log_var[c] = (float)var;
    sum[c] = 0.0;
    sum_sq[c] = 0.0;
}

__global__ void fin_sum(const double *partial, unsigned splits, size_t C, float *out)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a, b;
    sum_partials(partial, splits, C, c, a, b);
    out[c] += (float)a;
}

__device__ __forceinline__ float fwd1(float x, double sc, double sh)
{
    return (float)((double)x * sc + sh);
}

__device__ __forceinline__ float bwd1(float x, float g, const double *k)
{
    return (float)(((double)g - k[1] - ((double)x - k[0]) * k[2]) * k[3]);
}

/* One block row per (n, c) plane: blockIdx.x strides over planes. */
__global__ void __launch_bounds__(256) apply_fwd_planes(const float *__restrict__ x, float *y,
                                                        size_t C, size_t planes, size_t S,
                                                        const double *__restrict__ coef)
{
    bool vec = (S % 4) == 0 && (((uintptr_t)x | (uintptr_t)y) & 15u) == 0;
    for (size_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        size_t c = pl % C;
        double sc = coef[2 * c], sh = coef[2 * c + 1];
        const float *xp = x + pl * S;
        float *yp = y + pl * S;
        if (vec) {
            size_t S4 = S / 4;
            const float4 *x4 = reinterpret_cast<const float4 *>(xp);
            float4 *y4 = reinterpret_cast<float4 *>(yp);
            for (size_t k0 = threadIdx.x; k0 < S4; k0 += (size_t)kUnroll * blockDim.x) {
                float4 v[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    size_t k = k0 + (size_t)u * blockDim.x;
                    if (k < S4) v[u] = __ldg(x4 + k);
                }
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    size_t k = k0 + (size_t)u * blockDim.x;
                    if (k >= S4) break;
                    float4 o;
                    o.x = fwd1(v[u].x, sc, sh);
                    o.y = fwd1(v[u].y, sc, sh);
                    o.z = fwd1(v[u].z, sc, sh);
                    o.w = fwd1(v[u].w, sc, sh);
                    y4[k] = o;
                }
            }
        } else {
            for (size_t k = threadIdx.x; k < S; k += blockDim.x) yp[k] = fwd1(xp[k], sc, sh);
        }
    }
}

__global__ void apply_fwd_flat(const float *__restrict__ x, float *y, size_t C, size_t total,
                               size_t S, const double *__restrict__ coef)
{
    size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gs) {
        size_t c = (e / S) % C;
        y[e] = fwd1(x[e], coef[2 * c], coef[2 * c + 1]);
    }
}

__global__ void __launch_bounds__(256) apply_bwd_planes(const float *__restrict__ x,
                                                        const float *__restrict__ dy, float *dx,
                                                        size_t C, size_t planes, size_t S,
                                                        const double *__restrict__ coef)
{
    bool vec = (S % 4) == 0 && (((uintptr_t)x | (uintptr_t)dy | (uintptr_t)dx) & 15u) == 0;
    for (size_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        const double *k = coef + 4 * (pl % C);
        double kk[4] = {k[0], k[1], k[2], k[3]};
        const float *xp = x + pl * S, *gp = dy + pl * S;
        float *dp = dx + pl * S;
        if (vec) {
            size_t S4 = S / 4;
            const float4 *x4 = reinterpret_cast<const float4 *>(xp);
            const float4 *g4 = reinterpret_cast<const float4 *>(gp);
            float4 *d4 = reinterpret_cast<float4 *>(dp);
            for (size_t q0 = threadIdx.x; q0 < S4; q0 += (size_t)kUnroll * blockDim.x) {
                float4 v[kUnroll], g[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    size_t q = q0 + (size_t)u * blockDim.x;
                    if (q < S4) {
                        v[u] = __ldg(x4 + q);
                        g[u] = __ldg(g4 + q);
                    }
                }
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    size_t q = q0 + (size_t)u * blockDim.x;
                    if (q >= S4) break;
                    float4 o;
                    o.x = bwd1(v[u].x, g[u].x, kk);
                    o.y = bwd1(v[u].y, g[u].y, kk);
                    o.z = bwd1(v[u].z, g[u].z, kk);
                    o.w = bwd1(v[u].w, g[u].w, kk);
                    d4[q] = o;
                }
            }
        } else {
            for (size_t q = threadIdx.x; q < S; q += blockDim.x) dp[q] = bwd1(xp[q], gp[q], kk);
        }
    }
}

__global__ void apply_bwd_flat(const float *__restrict__ x, const float *__restrict__ dy,
                               float *dx, size_t C, size_t total, size_t S,
                               const double *__restrict__ coef)
{
    size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gs)
        dx[e] = bwd1(x[e], dy[e], coef + 4 * ((e / S) % C));
}

unsigned fin_grid(size_t C)
{
    return (unsigned)((C + 255) / 256);
}

unsigned plane_grid(size_t planes)
{
    size_t cap = (size_t)ps::sm_count() * 8;
    return (unsigned)(planes < cap ? (planes ? planes : 1) : cap);
}

/* Scratch layout: partials (max_splits * C * 2 doubles), then coefficients (4 * C doubles);
 * max_splits grows with n, so a scratch sized for the largest micro-batch fits every smaller one. */
double *coef_of(double *partial, const geom &g, size_t C)
{
    return partial + g.max_splits * C * 2;
}

double bn_factor(const struct ps_cuda_bn *bn, int64_t nbt_after)
{
    if (bn->cumulative) return nbt_after > 0 ? 1.0 / (double)nbt_after : 1.0;
    return bn->momentum;
}

} // namespace

namespace ps {

/* Bias gradient over [n, C, S]: out[c] += sum (used by linear and conv2d). */
int channel_sum(const float *x, float *out, size_t C, size_t n, size_t S, double *partial,
                cudaStream_t s, struct ps_diag *d)
{
    geom g = plan(C, n, S);
    launch_reduce<R_SUM>(g, x, nullptr, nullptr, C, n, S, partial, s);
    LAUNCHED("bias gradient reduce");
    fin_sum<<<fin_grid(C), 256, 0, s>>>(partial, g.splits, C, out);
    LAUNCHED("bias gradient finalize");
    return 0;
}

} // namespace ps

extern "C" {

size_t ps_cuda_bn_scratch(size_t channels, size_t n, size_t spatial)
{
    geom g = plan(channels, n ? n : 1, spatial);
    return (g.max_splits * channels * 2 + 4 * channels) * sizeof(double);
}

int ps_cuda_bn_forward(struct ps_cuda_bn *bn, int mode, const float *x, float *y, size_t n,
                       size_t spatial, float *save_mean, float *save_invstd, float *log_mean,
                       float *log_var, ps_cuda_stream s, struct ps_diag *d)
{
    size_t C = bn->channels, m = n * spatial;
    if (mode < 0 || mode > 2) return ps_diag_set(d, -EINVAL, "batchnorm", "bad mode %d", mode);
    if (mode != 2 && m < 2)
        return ps_diag_set(d, -EINVAL, "batchnorm",
                           "expected more than 1 value per channel when training, got %zu", m);
    if (!C || !n || !spatial) return 0;
    geom g = plan(C, n, spatial);
    double *coef = coef_of(bn->partial, g, C);
    double factor = 0.0;
    if (mode == 0) {
        if (bn->num_batches_tracked < INT64_MAX) bn->num_batches_tracked += 1; /* saturates, never wraps */
        factor = bn_factor(bn, bn->num_batches_tracked);
    }
    if (mode != 2) {
        launch_reduce<R_STATS>(g, x, nullptr, nullptr, C, n, spatial, bn->partial, s);
        LAUNCHED("batchnorm statistics");
    }
    fin_forward<<<fin_grid(C), 256, 0, s>>>(mode, bn->partial, g.splits, C, (double)m, bn->eps,
                                           factor, bn->weight, bn->bias, bn->running_mean,
                                           bn->running_var, save_mean, save_invstd, log_mean,
                                           log_var, coef);
    LAUNCHED("batchnorm finalize");
    size_t planes = n * C;
    if (spatial >= (size_t)kSmallS)
        apply_fwd_planes<<<plane_grid(planes), 256, 0, s>>>(x, y, C, planes, spatial, coef);
    else
        apply_fwd_flat<<<ps::grid_for(planes * spatial, 256), 256, 0, s>>>(x, y, C,
                                                                          planes * spatial,
                                                                          spatial, coef);
    LAUNCHED("batchnorm normalise");
    return 0;
}

int ps_cuda_bn_backward(const struct ps_cuda_bn *bn, bool training, const float *x,
                        const float *dy, const float *save_mean, const float *save_invstd,
                        float *dx, float *dweight, float *dbias, size_t n, size_t spatial,
                        ps_cuda_stream s, struct ps_diag *d)
{
    size_t C = bn->channels, m = n * spatial;
    if (!C || !m) return 0;
    geom g = plan(C, n, spatial);
    double *coef = coef_of(bn->partial, g, C);
    launch_reduce<R_BWD>(g, x, dy, save_mean, C, n, spatial, bn->partial, s);
    LAUNCHED("batchnorm backward reduce");
    fin_backward<<<fin_grid(C), 256, 0, s>>>(training, bn->partial, g.splits, C, (double)m,
                                            save_mean, save_invstd, bn->weight, dweight, dbias,
                                            coef);
    LAUNCHED("batchnorm backward finalize");
    if (!dx) return 0;
    size_t planes = n * C;
    if (spatial >= (size_t)kSmallS)
        apply_bwd_planes<<<plane_grid(planes), 256, 0, s>>>(x, dy, dx, C, planes, spatial, coef);
    else
        apply_bwd_flat<<<ps::grid_for(planes * spatial, 256), 256, 0, s>>>(x, dy, dx, C,
                                                                          planes * spatial,
                                                                          spatial, coef);
    LAUNCHED("batchnorm backward dx");
    return 0;
}

int ps_cuda_bn_accum_reset(struct ps_cuda_bn_accum *acc, ps_cuda_stream s, struct ps_diag *d)
{
    CU(cudaMemsetAsync(acc->sum, 0, acc->channels * sizeof(double), s));
    CU(cudaMemsetAsync(acc->sum_sq, 0, acc->channels * sizeof(double), s));
    acc->count = 0;
    return 0;
}

int ps_cuda_bn_accumulate(struct ps_cuda_bn_accum *acc, double *partial, const float *x,
                          size_t n, size_t spatial, ps_cuda_stream s, struct ps_diag *d)
{
    size_t C = acc->channels;
    if (!C || !n || !spatial) return 0;
    geom g = plan(C, n, spatial);
    launch_reduce<R_STATS>(g, x, nullptr, nullptr, C, n, spatial, partial, s);
    LAUNCHED("batchnorm accumulate reduce");
    fin_accumulate<<<fin_grid(C), 256, 0, s>>>(partial, g.splits, C, acc->sum, acc->sum_sq);
    LAUNCHED("batchnorm accumulate");
    acc->count += (int64_t)(n * spatial);
    return 0;
}

int ps_cuda_bn_commit(struct ps_cuda_bn *bn, struct ps_cuda_bn_accum *acc, float *log_mean,
                      float *log_var, ps_cuda_stream s, struct ps_diag *d)
{
    if (acc->count <= 0)
        return ps_diag_set(d, -EINVAL, "batchnorm", "commit with no accumulated statistics");
    if (bn->num_batches_tracked < INT64_MAX) bn->num_batches_tracked += 1; /* saturates, never wraps */
    double factor = bn_factor(bn, bn->num_batches_tracked);
    size_t C = bn->channels;
    fin_commit<<<fin_grid(C), 256, 0, s>>>(C, (double)acc->count, factor, acc->sum, acc->sum_sq,
                                          bn->running_mean, bn->running_var, log_mean, log_var);
    LAUNCHED("batchnorm commit");
    acc->count = 0;
    return 0;
}

} /* extern "C" */
