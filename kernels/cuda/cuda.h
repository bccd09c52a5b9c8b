/* cuda: the CUDA backend's C-callable API (kernels, cuBLAS products, streams, events, CUPTI).
 *
 * Plain C declarations: no CUDA header is needed to use them. The implementation lives in
 * the .cu files of kernels/cuda (nvcc) and kernels/cuda/cupti.c; when the build has no CUDA (meson feature
 * `cuda` off or nvcc missing) kernels/cuda/stub.c defines every function here to return -ENOTSUP
 * (or do nothing), so callers never need an #ifdef (src/HACKING.md, convention 6).
 *
 * Conventions (the same as kernels/cpu/kernels.h, which these kernels match numerically):
 *  - float32, row-major, NCHW; "[N,C,S]" has S = H*W spatial elements per channel.
 *  - Forward outputs and input gradients are OVERWRITTEN; parameter gradients are ACCUMULATED.
 *  - Pointers named d_* (or documented as device) are device memory of the current device.
 *  - Every launch is asynchronous on the given stream (NULL = the legacy default stream; the
 *    executor never uses it). A function returns 0, or a negative errno with `d` (may be NULL)
 *    naming the call and the CUDA/cuBLAS error string: -ENOTSUP (not built), -ENODEV (no device),
 *    -ENOMEM (allocation), -EINVAL (bad sizes), -EIO (a CUDA/cuBLAS call failed).
 *  - Reductions (BN statistics, bias gradients, losses) accumulate in double, like the CPU.
 *
 * Stream and event handles are the runtime's own types: ps_cuda_stream is cudaStream_t and
 * ps_cuda_event is cudaEvent_t (both are pointers to opaque driver structs).
 */
#ifndef PS_KERNELS_CUDA_H
#define PS_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ps_diag;
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st *ps_cuda_stream; /* == cudaStream_t */
typedef struct CUevent_st *ps_cuda_event;   /* == cudaEvent_t */

/* ---- runtime (runtime.cu) ------------------------------------------------------------------ */

/* Whether this binary was built with CUDA (true in runtime.cu, false in stub.c). */
bool ps_cuda_built(void);
/* Counts devices. No driver or no GPU: -ENODEV with "no CUDA device: <cudaGetErrorString>".
 * Not built: -ENOTSUP. */
int ps_cuda_probe(int *n_devices, struct ps_diag *d);
/* "NVIDIA H200 (sm_90, 132 SMs, 141 GiB)" and the peak memory bandwidth in bytes/s (from the
 * memory clock and bus width; 0 when unknown). */
int ps_cuda_device_info(int dev, char *name, size_t len, double *peak_bw, int *sm_count,
                        struct ps_diag *d);
int ps_cuda_set_device(int dev, struct ps_diag *d);
/* Enables peer access dev -> peer when possible (already enabled is fine); *ok says whether. */
int ps_cuda_enable_peer(int dev, int peer, bool *ok, struct ps_diag *d);

int ps_cuda_malloc(void **p, size_t bytes, struct ps_diag *d);     /* zero bytes gives NULL, 0 */
void ps_cuda_free(void *p);                                         /* accepts NULL */
int ps_cuda_host_alloc(void **p, size_t bytes, struct ps_diag *d); /* pinned host memory */
void ps_cuda_host_free(void *p);                                    /* accepts NULL */

/* Asynchronous copies on a stream (host memory should be pinned for real asynchrony). */
int ps_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d);
int ps_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d);
int ps_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d);
/* Between devices (cudaMemcpyPeerAsync); the same device degenerates to a device copy. */
int ps_cuda_memcpy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes,
                        ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_memset(void *p, int value, size_t bytes, ps_cuda_stream s, struct ps_diag *d);

/* Non-blocking streams (they never synchronise with the legacy default stream). */
int ps_cuda_stream_create(ps_cuda_stream *s, struct ps_diag *d);
void ps_cuda_stream_destroy(ps_cuda_stream s); /* accepts NULL */
int ps_cuda_stream_sync(ps_cuda_stream s, struct ps_diag *d);
/* Events for ordering only (cudaEventDisableTiming), or with timing for benchmarks. */
int ps_cuda_event_create(ps_cuda_event *e, bool timing, struct ps_diag *d);
void ps_cuda_event_destroy(ps_cuda_event e); /* accepts NULL */
int ps_cuda_event_record(ps_cuda_event e, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_stream_wait(ps_cuda_stream s, ps_cuda_event e, struct ps_diag *d);
int ps_cuda_event_sync(ps_cuda_event e, struct ps_diag *d);
int ps_cuda_event_elapsed_ms(ps_cuda_event a, ps_cuda_event b, float *ms, struct ps_diag *d);
/* cudaDeviceSynchronize on the current device (between iterations and before a CUPTI flush,
 * never inside an iteration). */
int ps_cuda_device_sync(struct ps_diag *d);
/* The same on each of the n GPUs listed (a run's own, not every visible GPU), restoring the
 * current one (between iterations, before a CUPTI flush). */
int ps_cuda_sync_gpus(const int *gpus, int n, struct ps_diag *d);
/* Reports (and clears) an asynchronous error of earlier launches. */
int ps_cuda_check(const char *where, struct ps_diag *d);

/* ---- cuBLAS (blas.cu): a handle bound to one stream, with an im2col workspace ------------- */

struct ps_cuda_blas;
int ps_cuda_blas_create(struct ps_cuda_blas **b, ps_cuda_stream s, struct ps_diag *d);
void ps_cuda_blas_destroy(struct ps_cuda_blas *b); /* accepts NULL */
/* Grows the workspace to at least `bytes` (cudaMalloc: call it before timed work, never inside
 * an iteration). conv2d uses at most ps_cuda_conv2d_workspace() bytes and processes samples in
 * chunks that fit what is reserved (one sample at least; it grows to that if needed). */
int ps_cuda_blas_reserve(struct ps_cuda_blas *b, size_t bytes, struct ps_diag *d);
/* Grows the bias-gradient scratch to what [n, channels, spatial] needs (setup, not mid-step). */
int ps_cuda_blas_reserve_bias(struct ps_cuda_blas *b, size_t channels, size_t n, size_t spatial,
                              struct ps_diag *d);

/* C[M,N] = alpha op(A) op(B) + beta C, row-major with leading dimensions, as ps_cpu_sgemm. */
int ps_cuda_sgemm(struct ps_cuda_blas *b, bool trans_a, bool trans_b, size_t m, size_t n,
                  size_t k, float alpha, const float *a, size_t lda, const float *bm, size_t ldb,
                  float beta, float *c, size_t ldc, struct ps_diag *d);

/* linear, W [out,in] like PyTorch: y = x W^T + b; dx = dy W; dw += dy^T x; db += colsum(dy). */
int ps_cuda_linear_forward(struct ps_cuda_blas *b, const float *x, const float *w,
                           const float *bias, float *y, size_t n, size_t in, size_t out,
                           struct ps_diag *d);
int ps_cuda_linear_backward(struct ps_cuda_blas *b, const float *x, const float *w,
                            const float *dy, float *dx, float *dw, float *db, size_t n, size_t in,
                            size_t out, struct ps_diag *d);

/* conv2d via im2col + cuBLAS (shape struct of kernels/cpu/kernels.h). */
struct ps_conv2d_shape;
size_t ps_cuda_conv2d_workspace(const struct ps_conv2d_shape *s, size_t samples);
int ps_cuda_conv2d_forward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s,
                           const float *x, const float *w, const float *bias, float *y,
                           struct ps_diag *d);
int ps_cuda_conv2d_backward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s,
                            const float *x, const float *w, const float *dy, float *dx, float *dw,
                            float *db, struct ps_diag *d);

/* ---- batchnorm (batchnorm.cu) ---------------------------------------------------------------- */

/* Device twin of struct ps_bn: arrays are device memory, num_batches_tracked is kept on the
 * host (it changes at issue time, deterministically, exactly as on the CPU). */
struct ps_cuda_bn {
    size_t channels;
    float eps, momentum;
    bool cumulative;
    const float *weight, *bias;        /* device, NULL = affine=False */
    float *running_mean, *running_var; /* device */
    int64_t num_batches_tracked;
    double *partial;                   /* device scratch, ps_cuda_bn_scratch() bytes */
};
/* Scratch bytes a BN layer needs for inputs of n samples x spatial (partial sums). */
size_t ps_cuda_bn_scratch(size_t channels, size_t n, size_t spatial);

/* mode: 0 train (update running stats), 1 train without tracking, 2 eval (enum ps_bn_mode).
 * save_mean/save_invstd (device, C floats, may be NULL) as on the CPU. log_mean/log_var (device,
 * C floats each, may be NULL): in mode 0 they receive the mean and UNBIASED variance fed into
 * the EMA (for struct ps_bn_update). Needs n*spatial >= 2 in train modes (-EINVAL). */
int ps_cuda_bn_forward(struct ps_cuda_bn *bn, int mode, const float *x, float *y, size_t n,
                       size_t spatial, float *save_mean, float *save_invstd, float *log_mean,
                       float *log_var, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_bn_backward(const struct ps_cuda_bn *bn, bool training, const float *x,
                        const float *dy, const float *save_mean, const float *save_invstd,
                        float *dx, float *dweight, float *dbias, size_t n, size_t spatial,
                        ps_cuda_stream s, struct ps_diag *d);
/* DeferredBatchNorm: device sums (C doubles each); count kept on the host. */
struct ps_cuda_bn_accum {
    size_t channels;
    double *sum, *sum_sq; /* device */
    int64_t count;
};
int ps_cuda_bn_accum_reset(struct ps_cuda_bn_accum *acc, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_bn_accumulate(struct ps_cuda_bn_accum *acc, double *partial, const float *x,
                          size_t n, size_t spatial, ps_cuda_stream s, struct ps_diag *d);
/* nbt += 1; EMA with the pooled mean and BIASED variance; sums reset. log_* as above (biased). */
int ps_cuda_bn_commit(struct ps_cuda_bn *bn, struct ps_cuda_bn_accum *acc, float *log_mean,
                      float *log_var, ps_cuda_stream s, struct ps_diag *d);

/* ---- elementwise, dropout, pooling, losses (kernels.cu) ------------------------------------ */

int ps_cuda_relu_forward(const float *x, float *y, size_t count, ps_cuda_stream s,
                         struct ps_diag *d);
int ps_cuda_relu_backward(const float *y, const float *dy, float *dx, size_t count,
                          ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_sgd_step(float *p, const float *g, size_t count, float lr, ps_cuda_stream s,
                     struct ps_diag *d);
int ps_cuda_add_inplace(float *y, const float *x, size_t count, ps_cuda_stream s,
                        struct ps_diag *d);
/* The counter-based generator of kernels/cpu/rng.c: identical masks for identical
 * (seed, offset). mask: count bytes (device), may be NULL. */
int ps_cuda_dropout_forward(const float *x, float *y, uint8_t *mask, size_t count, float p,
                            uint64_t seed, uint64_t offset, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t count,
                             float p, ps_cuda_stream s, struct ps_diag *d);

struct ps_pool2d_shape;
int ps_cuda_maxpool2d_forward(const struct ps_pool2d_shape *sh, const float *x, float *y,
                              int32_t *idx, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_maxpool2d_backward(const struct ps_pool2d_shape *sh, const float *dy,
                               const int32_t *idx, float *dx, ps_cuda_stream s,
                               struct ps_diag *d);

/* Losses write the scalar to *d_loss (device double). Labels (device int64) must be in [0, k):
 * the caller checks them on the host (an out-of-range row yields NaN). */
int ps_cuda_loss_sum_forward(const float *y, size_t count, double *d_loss, ps_cuda_stream s,
                             struct ps_diag *d);
int ps_cuda_loss_sum_backward(float *dy, size_t count, float g, ps_cuda_stream s,
                              struct ps_diag *d);
int ps_cuda_loss_mse_forward(const float *y, const float *t, size_t count, double *d_loss,
                             ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_loss_mse_backward(const float *y, const float *t, float *dy, size_t count, float g,
                              ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_loss_ce_forward(const float *z, const int64_t *labels, size_t n, size_t k,
                            double *d_loss, ps_cuda_stream s, struct ps_diag *d);
int ps_cuda_loss_ce_backward(const float *z, const int64_t *labels, float *dz, size_t n, size_t k,
                             float g, ps_cuda_stream s, struct ps_diag *d);

/* ---- CUPTI activity tracer (cupti.c) ---------------------------------------------------------- */

enum ps_cupti_kind {
    PS_CUPTI_KERNEL,
    PS_CUPTI_MEMCPY,
    PS_CUPTI_MEMCPY_PEER,
    PS_CUPTI_MEMSET,
    PS_CUPTI_SYNC,    /* stream/event synchronisation (stream wait event, ...) */
    PS_CUPTI_RUNTIME, /* host-side runtime API call */
};

/* One activity, timestamps in ns relative to the tracer's start. */
struct ps_cupti_rec {
    uint8_t kind;       /* enum ps_cupti_kind */
    uint32_t device;    /* CUPTI device id (runtime API: UINT32_MAX) */
    uint32_t stream;    /* CUPTI stream id (UINT32_MAX when none) */
    uint32_t correlation;
    uint64_t external;  /* external correlation id pushed around the launch, UINT64_MAX = none */
    int64_t start_ns, end_ns;
    uint64_t bytes;     /* memcpy/memset */
    char *name;         /* kernel name (owned), or NULL */
};

struct ps_cupti_result {
    size_t n;
    struct ps_cupti_rec *r;
    uint64_t dropped;   /* records CUPTI dropped (cuptiActivityGetNumDroppedRecords) */
    uint64_t unmapped;  /* device records with no external correlation id */
    uint64_t no_time;   /* records skipped: CUPTI gave a zero start or end */
};

struct ps_cupti;
/* Enables the activity kinds (concurrent kernels, memcpy, peer memcpy, memset,
 * synchronisation, runtime and driver API, external correlation) and notes the start timestamp. One tracer
 * at a time per process (-EBUSY). Without a driver CUPTI fails: -ENODEV with its message. */
int ps_cupti_start(struct ps_cupti **t, struct ps_diag *d);
/* External correlation (task id) around a task's launches. */
int ps_cupti_push(struct ps_cupti *t, uint64_t id, struct ps_diag *d);
int ps_cupti_pop(struct ps_cupti *t, struct ps_diag *d);
/* Flushes, disables the kinds and returns every record with its external id resolved. The
 * caller synchronises the GPUs it traced first (CUPTI flushes only completed work). The tracer is
 * destroyed (also on error). */
int ps_cupti_stop(struct ps_cupti *t, struct ps_cupti_result *res, struct ps_diag *d);
void ps_cupti_result_finish(struct ps_cupti_result *res); /* accepts a zeroed struct */
const char *ps_cupti_kind_name(enum ps_cupti_kind k);

#ifdef __cplusplus
}
#endif

#endif
