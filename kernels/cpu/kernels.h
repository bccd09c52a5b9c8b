/* CPU reference kernels: the arithmetic the `cpu` executor runs, checked against PyTorch goldens.
 *
 * Conventions shared by every kernel (read these once, they are not repeated per function):
 *  - Storage is float32, row-major, NCHW like PyTorch. A "[N,C,S]" tensor has S = H*W spatial
 *    elements per channel (S = 1 for [N,C] tensors). Reductions (sums, BN statistics, losses)
 *    accumulate in double.
 *  - Forward outputs and input gradients (dx) are OVERWRITTEN. Parameter gradients (dw, db,
 *    dweight, dbias) are ACCUMULATED (+=), like PyTorch's .grad, so micro-batches can add into
 *    one buffer; zero them before the first micro-batch. Any gradient pointer may be NULL to skip it.
 *  - Kernels that cannot fail return void. Kernels that can (bad sizes, out-of-range labels, no
 *    memory) return 0 or a negative errno and fill the optional `struct ps_diag *d` (may be NULL)
 *    with where = the kernel name. They never print.
 *  - Buffers must not alias unless a function says so (relu and dropout allow y == x).
 *  - flatten needs no kernel: a contiguous [N,C,H,W] buffer already is [N,C*H*W].
 */
#ifndef PS_KERNELS_CPU_H
#define PS_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ps_diag;

/* ---- threads and sgemm (gemm.c) ---------------------------------------------------------- */

/* Worker threads used by large sgemm calls; n <= 0 restores the default (online CPUs, max 16).
 * Small problems always run on the calling thread. */
void ps_cpu_set_threads(int n);
/* The same for sgemm calls made by the calling thread only (the executor's device workers share
 * the cores); n <= 0 falls back to ps_cpu_set_threads' setting. */
void ps_cpu_set_threads_local(int n);
int ps_cpu_threads(void);

/* Per-thread workspace (scratch.c): the slot's buffer of at least bytes, 64-byte aligned, kept
 * for the thread's next call (NULL: no memory). Each kernel family has its slot. */
enum ps_cpu_scratch_slot { PS_CPU_SCRATCH_GEMM, PS_CPU_SCRATCH_DCONV, PS_CPU_SCRATCH_SLOTS };
void *ps_cpu_scratch(enum ps_cpu_scratch_slot slot, size_t bytes);
/* Frees the calling thread's workspace (threads that exit free theirs). */
void ps_cpu_scratch_release(void);

/* The sgemm kernel in use: "plain", "fma" (AVX2) or "avx512", the widest this CPU runs by
 * default. ps_cpu_gemm_use selects one of those this CPU runs (NULL = the default again), for
 * tests and benchmarks; -ENOTSUP for an unknown name or one the CPU lacks. The fma and avx512
 * kernels give bitwise identical results. */
const char *ps_cpu_gemm_kernel(void);
int ps_cpu_gemm_use(const char *name);

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major. op(A) is [M,K]: A is [M,K] with leading
 * dimension lda, or [K,M] when trans_a. op(B) is [K,N]: B is [K,N], or [N,K] when trans_b.
 * beta == 0 ignores the old contents of C (NaNs included). Returns 0 or -ENOMEM. */
int ps_cpu_sgemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                 const float *a, size_t lda, const float *b, size_t ldb, float beta, float *c,
                 size_t ldc);

/* The same product with op(B) [K,N] produced by its owner while packing (conv2d's implicit
 * im2col: the column matrix is never stored whole). pack writes rows [p0, p0+kc) and columns
 * [j0, j0+width) of op(B) as dst[p*W + j] and zeroes columns width..W-1; it may be called from
 * several threads at once. Same arithmetic as ps_cpu_sgemm on the stored matrix. */
struct ps_cpu_bsource {
    void (*pack)(const void *ctx, size_t p0, size_t kc, size_t j0, size_t width, float *dst,
                 size_t W);
    const void *ctx;
};
int ps_cpu_sgemm_bsource(bool trans_a, size_t m, size_t n, size_t k, float alpha, const float *a,
                         size_t lda, const struct ps_cpu_bsource *b, float beta, float *c,
                         size_t ldc);

/* op(A) [M,K] packed once for several products with the same left operand (conv2d's weights
 * over the samples of a micro-batch): the gemm then reads its panels instead of packing them per
 * call and per column block. Same arithmetic, same bits. ps_cpu_sgemm_apacked takes B as a
 * matrix [K,N] (b, ldb) or, when bs is not NULL, from its source. make returns 0 or -ENOMEM. */
struct ps_cpu_apack {
    size_t m, k;
    float *buf;
};
int ps_cpu_apack_make(struct ps_cpu_apack *ap, bool trans_a, size_t m, size_t k, const float *a,
                      size_t lda);
void ps_cpu_apack_free(struct ps_cpu_apack *ap); /* accepts a zeroed struct */
int ps_cpu_sgemm_apacked(const struct ps_cpu_apack *a, size_t n, float alpha, const float *b,
                         size_t ldb, const struct ps_cpu_bsource *bs, float beta, float *c,
                         size_t ldc);

/* ---- linear (linear.c): y[N,out] = x[N,in] W^T + b, W is [out,in] like PyTorch ------------ */

int ps_cpu_linear_forward(const float *x, const float *w, const float *b, float *y, size_t n,
                          size_t in, size_t out);
/* dx[N,in] = dy W (overwritten); dw[out,in] += dy^T x; db[out] += sum over rows of dy. */
int ps_cpu_linear_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                           float *db, size_t n, size_t in, size_t out);

/* ---- conv2d (conv.c): im2col + sgemm, square or rectangular kernel, symmetric padding ------ */

struct ps_conv2d_shape {
    size_t n, c_in, h, w;       /* input [n, c_in, h, w] */
    size_t c_out, kh, kw;       /* weight [c_out, c_in, kh, kw], bias [c_out] */
    size_t stride, padding;     /* same in both directions */
};
/* Output height/width: floor((h + 2*padding - kh) / stride) + 1; 0 when the kernel does not fit. */
size_t ps_cpu_conv2d_out_h(const struct ps_conv2d_shape *s);
size_t ps_cpu_conv2d_out_w(const struct ps_conv2d_shape *s);
/* b may be NULL (no bias). y is [n, c_out, out_h, out_w]. */
int ps_cpu_conv2d_forward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                          const float *b, float *y, struct ps_diag *d);
/* dx overwritten; dw, db accumulated; any of them may be NULL. */
int ps_cpu_conv2d_backward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                           const float *dy, float *dx, float *dw, float *db, struct ps_diag *d);

/* The weights of one conv2d layer packed for the products (dconv.c), kept from call to call while
 * they do not change: the executor keeps one per layer and invalidates it after the optimizer step.
 * Zero-initialise; any call may pass NULL instead (packed per call). */
struct ps_cpu_convcache {
    float *fwd, *dx;             /* packed for the forward / input-gradient product */
    size_t fwd_bytes, dx_bytes;
    bool fwd_valid, dx_valid;
};
void ps_cpu_convcache_invalidate(struct ps_cpu_convcache *c); /* the weights changed */
void ps_cpu_convcache_free(struct ps_cpu_convcache *c);       /* accepts a zeroed struct */
/* ps_cpu_conv2d_forward / _backward with a cache (same results, same bits). */
int ps_cpu_conv2d_forward_cached(const struct ps_conv2d_shape *s, const float *x, const float *w,
                                 const float *b, float *y, struct ps_cpu_convcache *cache,
                                 struct ps_diag *d);
int ps_cpu_conv2d_backward_cached(const struct ps_conv2d_shape *s, const float *x,
                                  const float *w, const float *dy, float *dx, float *dw,
                                  float *db, struct ps_cpu_convcache *cache, struct ps_diag *d);

/* ---- maxpool2d (pool.c): ceil_mode false, padding counts as -inf -------------------------- */

struct ps_pool2d_shape {
    size_t n, c, h, w;
    size_t kernel, stride, padding; /* PyTorch's default stride is the kernel size */
};
size_t ps_cpu_maxpool2d_out_h(const struct ps_pool2d_shape *s);
size_t ps_cpu_maxpool2d_out_w(const struct ps_pool2d_shape *s);
/* idx (may be NULL) receives, per output, the flat index h*W+w of the max inside its input plane,
 * like PyTorch's return_indices (int64, as PyTorch keeps them for backward). Ties keep the first
 * in scan order; NaN wins. */
int ps_cpu_maxpool2d_forward(const struct ps_pool2d_shape *s, const float *x, float *y,
                             int64_t *idx, struct ps_diag *d);
/* dx overwritten: zero, then dy scattered (added) to the recorded indices. */
void ps_cpu_maxpool2d_backward(const struct ps_pool2d_shape *s, const float *dy,
                               const int64_t *idx, float *dx);

/* ---- batchnorm (batchnorm.c): 1d [N,C] (spatial 1) and 2d [N,C,H,W] (spatial H*W) ---------- */

/* One BN layer's parameters and running state. The arrays belong to the caller (C floats each);
 * weight/bias NULL means affine=False. num_batches_tracked is kept here, by value. */
struct ps_bn {
    size_t channels;
    float eps;              /* PyTorch default 1e-5 */
    float momentum;         /* EMA factor a when !cumulative (PyTorch default 0.1) */
    bool cumulative;        /* momentum=None: a = 1/num_batches_tracked (after the increment) */
    const float *weight, *bias;
    float *running_mean, *running_var; /* init 0 and 1 */
    int64_t num_batches_tracked;       /* init 0 */
};

enum ps_bn_mode {
    PS_BN_TRAIN,          /* normalise with batch statistics AND update running stats (plain BN) */
    PS_BN_TRAIN_NO_TRACK, /* normalise with batch statistics, running stats untouched (deferred BN,
                             recompute, grad-only BN without grad) */
    PS_BN_EVAL,           /* normalise with the running statistics */
};

/* The EMA factor the next update will use: momentum, or 1/nbt where nbt is the value after the
 * increment. */
double ps_cpu_bn_factor(const struct ps_bn *bn, int64_t nbt_after);

/* y = (x - mean) * invstd * weight + bias, per channel. Train modes: mean and BIASED variance of
 * the n*spatial elements of each channel (needs n*spatial >= 2, else -EINVAL). PS_BN_TRAIN then
 * does SEMANTICS.md section 7: nbt += 1; a = factor; running_mean = (1-a) rm + a mean;
 * running_var = (1-a) rv + a var * m/(m-1) (UNBIASED, m = n*spatial).
 * save_mean/save_invstd (C floats each, may be NULL) receive the statistics used, for backward:
 * batch mean and 1/sqrt(var_biased + eps) in train modes, running ones in eval. */
int ps_cpu_bn_forward(struct ps_bn *bn, enum ps_bn_mode mode, const float *x, float *y, size_t n,
                      size_t spatial, float *save_mean, float *save_invstd, struct ps_diag *d);
/* The same, also giving the batch statistics of train modes in double (the mean and UNBIASED
 * variance the running-statistics update uses; either pointer may be NULL). */
int ps_cpu_bn_forward_stats(struct ps_bn *bn, enum ps_bn_mode mode, const float *x, float *y,
                            size_t n, size_t spatial, float *save_mean, float *save_invstd,
                            double *batch_mean, double *batch_var, struct ps_diag *d);
/* Backward from the saved statistics. training = the forward used batch statistics (both train
 * modes): dx includes the terms through mean and variance; eval: dx = dy * weight * invstd.
 * dx overwritten, dweight/dbias accumulated. */
void ps_cpu_bn_backward(const struct ps_bn *bn, bool training, const float *x, const float *dy,
                        const float *save_mean, const float *save_invstd, float *dx,
                        float *dweight, float *dbias, size_t n, size_t spatial);

/* DeferredBatchNorm tracking (torchgpipe): per-channel sum, sum of squares, element count pooled
 * over the micro-batches of one mini-batch. sum and sum_sq are caller-owned arrays of C doubles. */
struct ps_bn_accum {
    size_t channels;
    double *sum, *sum_sq;
    int64_t count; /* elements per channel so far */
};
void ps_cpu_bn_accum_reset(struct ps_bn_accum *acc);
/* Adds one micro-batch [n, C, spatial]; touches nothing else. */
void ps_cpu_bn_accumulate(struct ps_bn_accum *acc, const float *x, size_t n, size_t spatial);
/* Commits the pooled statistics once: nbt += 1; a = factor; mean = sum/count;
 * var = sum_sq/count - mean^2 (BIASED, as torchgpipe); the same EMA; then resets acc.
 * count == 0 is -EINVAL (nothing to commit). */
int ps_cpu_bn_commit(struct ps_bn *bn, struct ps_bn_accum *acc, struct ps_diag *d);

/* ---- elementwise (elementwise.c) ---------------------------------------------------------- */

void ps_cpu_relu_forward(const float *x, float *y, size_t count);               /* y may be x */
/* dx = dy where y > 0, else 0 (y is relu's output, as PyTorch saves it). dx may be dy. */
void ps_cpu_relu_backward(const float *y, const float *dy, float *dx, size_t count);
/* SGD without momentum or weight decay: p -= lr * g. */
void ps_cpu_sgd_step(float *p, const float *g, size_t count, float lr);
/* y += x (gradient accumulation across micro-batches). */
void ps_cpu_add_inplace(float *y, const float *x, size_t count);

/* ---- rng and dropout (rng.c) ------------------------------------------------------------- */

/* Counter-based generator: a pure function of (seed, stream, index), a splitmix64-style mix.
 * Any element can be drawn in any order, so a recompute with the same (seed, stream) reproduces
 * a mask exactly. It does NOT reproduce PyTorch's Philox/MT streams bit for bit. */
uint64_t ps_cpu_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 24 random bits. */
float ps_cpu_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Inverted dropout: element i is kept iff ps_cpu_rng_uniform(seed, offset, i) >= p, and kept
 * elements are scaled by 1/(1-p); p >= 1 zeroes everything, p <= 0 copies. `offset` names the
 * stream of this call (e.g. one per step, layer and micro-batch). mask (count bytes, 1 = kept)
 * may be NULL; y may be x. */
void ps_cpu_dropout_forward(const float *x, float *y, uint8_t *mask, size_t count, float p,
                            uint64_t seed, uint64_t offset);
/* dx = dy * mask / (1-p). dx may be dy. */
void ps_cpu_dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t count,
                             float p);

/* ---- losses (loss.c); `g` is the upstream gradient of the scalar loss (1 for a root) ------- */

/* sum: L = sum(y); dy = g everywhere. */
double ps_cpu_loss_sum_forward(const float *y, size_t count);
void ps_cpu_loss_sum_backward(float *dy, size_t count, float g);
/* mse (PyTorch reduction 'mean' over ALL elements): L = mean((y - t)^2); dy = g*2(y-t)/count. */
double ps_cpu_loss_mse_forward(const float *y, const float *t, size_t count);
void ps_cpu_loss_mse_backward(const float *y, const float *t, float *dy, size_t count, float g);
/* -EINVAL with diag naming the first label outside [0, k) (or an empty input); 0 otherwise.
 * The cross-entropy functions check with it; the cuda executor checks its host labels too. */
int ps_cpu_loss_check_labels(const int64_t *labels, size_t n, size_t k, struct ps_diag *d);
/* cross_entropy over logits [N,K] and labels in [0,K): L = mean_i -log_softmax(z_i)[label_i];
 * dz = g (softmax(z) - onehot) / N. A label out of range is -EINVAL; *loss gets L. */
int ps_cpu_loss_cross_entropy_forward(const float *z, const int64_t *labels, size_t n, size_t k,
                                      double *loss, struct ps_diag *d);
int ps_cpu_loss_cross_entropy_backward(const float *z, const int64_t *labels, float *dz,
                                       size_t n, size_t k, float g, struct ps_diag *d);

#endif
