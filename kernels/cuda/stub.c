/* stub: the CUDA backend when it is not built (meson feature `cuda` off, or no nvcc).
 *
 * Every entry point of kernels/cuda/cuda.h exists and returns -ENOTSUP (ps_cuda_probe and
 * ps_cupti_start also say why in the diag), so callers compile and link the same way in both
 * configurations and contain no #ifdef (src/HACKING.md, convention 6). Generated from
 * cuda.h's prototypes; keep the two in step (the build fails on a missing or mismatched one).
 */
#include "kernels/cuda/cuda.h"

#include <errno.h>
#include <string.h>

#include "src/diag.h"

bool ps_cuda_built(void)
{
    return false;
}

int ps_cuda_probe(int *n_devices, struct ps_diag *d)
{
    if (n_devices) *n_devices = 0;
    return ps_diag_set(d, -ENOTSUP, "cuda", "not built: no nvcc at build time (meson feature 'cuda')");
}

int ps_cuda_device_info(int dev, char *name, size_t len, double *peak_bw, int *sm_count, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_set_device(int dev, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_enable_peer(int dev, int peer, bool *ok, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_malloc(void **p, size_t bytes, struct ps_diag *d)
{
    *p = NULL;
    return -ENOTSUP;
}

void ps_cuda_free(void *p)
{
}

int ps_cuda_host_alloc(void **p, size_t bytes, struct ps_diag *d)
{
    *p = NULL;
    return -ENOTSUP;
}

void ps_cuda_host_free(void *p)
{
}

int ps_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_memcpy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_memset(void *p, int value, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_stream_create(ps_cuda_stream *s, struct ps_diag *d)
{
    return -ENOTSUP;
}

void ps_cuda_stream_destroy(ps_cuda_stream s)
{
}

int ps_cuda_stream_sync(ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_event_create(ps_cuda_event *e, bool timing, struct ps_diag *d)
{
    return -ENOTSUP;
}

void ps_cuda_event_destroy(ps_cuda_event e)
{
}

int ps_cuda_event_record(ps_cuda_event e, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_stream_wait(ps_cuda_stream s, ps_cuda_event e, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_event_sync(ps_cuda_event e, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_event_elapsed_ms(ps_cuda_event a, ps_cuda_event b, float *ms, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_device_sync(struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_sync_gpus(const int *gpus, int n, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_check(const char *where, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_blas_create(struct ps_cuda_blas **b, ps_cuda_stream s, struct ps_diag *d)
{
    *b = NULL;
    return -ENOTSUP;
}

void ps_cuda_blas_destroy(struct ps_cuda_blas *b)
{
}

int ps_cuda_blas_reserve(struct ps_cuda_blas *b, size_t bytes, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_blas_reserve_bias(struct ps_cuda_blas *b, size_t channels, size_t n, size_t spatial,
                              struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_sgemm(struct ps_cuda_blas *b, bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda, const float *bm, size_t ldb, float beta, float *c, size_t ldc, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_linear_forward(struct ps_cuda_blas *b, const float *x, const float *w, const float *bias, float *y, size_t n, size_t in, size_t out, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_linear_backward(struct ps_cuda_blas *b, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, size_t n, size_t in, size_t out, struct ps_diag *d)
{
    return -ENOTSUP;
}

size_t ps_cuda_conv2d_workspace(const struct ps_conv2d_shape *s, size_t samples)
{
    return 0;
}

int ps_cuda_conv2d_forward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s, const float *x, const float *w, const float *bias, float *y, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_conv2d_backward(struct ps_cuda_blas *b, const struct ps_conv2d_shape *s, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, struct ps_diag *d)
{
    return -ENOTSUP;
}

size_t ps_cuda_bn_scratch(size_t channels, size_t n, size_t spatial)
{
    return 0;
}

int ps_cuda_bn_forward(struct ps_cuda_bn *bn, int mode, const float *x, float *y, size_t n, size_t spatial, float *save_mean, float *save_invstd, float *log_mean, float *log_var, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_bn_backward(const struct ps_cuda_bn *bn, bool training, const float *x, const float *dy, const float *save_mean, const float *save_invstd, float *dx, float *dweight, float *dbias, size_t n, size_t spatial, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_bn_accum_reset(struct ps_cuda_bn_accum *acc, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_bn_accumulate(struct ps_cuda_bn_accum *acc, double *partial, const float *x, size_t n, size_t spatial, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_bn_commit(struct ps_cuda_bn *bn, struct ps_cuda_bn_accum *acc, float *log_mean, float *log_var, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_relu_forward(const float *x, float *y, size_t count, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_relu_backward(const float *y, const float *dy, float *dx, size_t count, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_sgd_step(float *p, const float *g, size_t count, float lr, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_add_inplace(float *y, const float *x, size_t count, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_dropout_forward(const float *x, float *y, uint8_t *mask, size_t count, float p, uint64_t seed, uint64_t offset, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t count, float p, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_maxpool2d_forward(const struct ps_pool2d_shape *sh, const float *x, float *y, int32_t *idx, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_maxpool2d_backward(const struct ps_pool2d_shape *sh, const float *dy, const int32_t *idx, float *dx, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_sum_forward(const float *y, size_t count, double *d_loss, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_sum_backward(float *dy, size_t count, float g, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_mse_forward(const float *y, const float *t, size_t count, double *d_loss, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_mse_backward(const float *y, const float *t, float *dy, size_t count, float g, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_ce_forward(const float *z, const int64_t *labels, size_t n, size_t k, double *d_loss, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cuda_loss_ce_backward(const float *z, const int64_t *labels, float *dz, size_t n, size_t k, float g, ps_cuda_stream s, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cupti_start(struct ps_cupti **t, struct ps_diag *d)
{
    *t = NULL;
    return ps_diag_set(d, -ENOTSUP, "cupti", "not built: no nvcc at build time");
}

int ps_cupti_push(struct ps_cupti *t, uint64_t id, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cupti_pop(struct ps_cupti *t, struct ps_diag *d)
{
    return -ENOTSUP;
}

int ps_cupti_stop(struct ps_cupti *t, struct ps_cupti_result *res, struct ps_diag *d)
{
    if (res) memset(res, 0, sizeof(*res));
    return -ENOTSUP;
}

void ps_cupti_result_finish(struct ps_cupti_result *res)
{
}

const char *ps_cupti_kind_name(enum ps_cupti_kind k)
{
    return "?";
}
