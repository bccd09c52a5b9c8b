/* test_gpu: the CUDA backend against the CPU backend (suite 'gpu'; exit 77 = skip, no device).
 *
 *  - every op: CUDA kernel vs kernels/cpu on random data, max |cuda - cpu| / max |cpu| <= 1e-4
 *    (dropout masks and values bit for bit: the same counter RNG);
 *  - BatchNorm running statistics under every policy (train, no-track, eval, deferred
 *    accumulate/commit, cumulative momentum) equal the CPU's, and num_batches_tracked exactly;
 *  - the executor: the same loss, BN update log and final state as the cpu executor, a trace in
 *    which every record maps to a node, and events that enforce the graph's order (no record of a
 *    node starts before the end of its DATA/PHONY predecessors' records on other streams).
 * Every comparison prints its error size and tolerance; the executor cases print theirs (loss,
 * BN statistics, final state, CUPTI records, the least cross-stream gap) and report every failed
 * check, then go on to the next case, so one run on a GPU shows all the cases that fail.
 * Nothing here times anything (benchmarks live in bench_gpu.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <errno.h>

#include <cmocka.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/cuda.h"
#include "src/diag.h"
#include "src/engine.h"
#include "kernels/exec.h"
#include "kernels/exec_cuda.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/schedule.h"

static ps_cuda_stream S;
static int n_gpus;

static void fail_diag(const struct ps_diag *d)
{
    char buf[2048];
    fail_msg("%s", ps_diag_format(d, buf, sizeof(buf)));
}

#define OK(call)                                                                               \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_) fail_msg("%s: %d", #call, rc_);                                               \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng_state = 12345;
static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rnd(size_t n, float scale, float shift)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    for (size_t k = 0; k < n; k++) p[k] = frand() * scale + shift;
    return p;
}

static void *dev_from(const void *h, size_t bytes)
{
    void *p = NULL;
    OK(ps_cuda_malloc(&p, bytes ? bytes : 4, NULL));
    if (h && bytes) OK(ps_cuda_memcpy_h2d(p, h, bytes, S, NULL));
    else OK(ps_cuda_memset(p, 0, bytes ? bytes : 4, S, NULL));
    return p;
}

static void *host_from(const void *dp, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    assert_non_null(h);
    OK(ps_cuda_memcpy_d2h(h, dp, bytes, S, NULL));
    OK(ps_cuda_stream_sync(S, NULL));
    return h;
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double mx = 0.0, err = 0.0;
    for (size_t k = 0; k < n; k++) {
        if (fabs((double)b[k]) > mx) mx = fabs((double)b[k]);
        double e = fabs((double)a[k] - (double)b[k]);
        if (e > err || isnan(e)) err = isnan(e) ? INFINITY : e;
    }
    return mx > 0 ? err / mx : err;
}

static void expect_close(const char *what, const float *dev, const float *cpu, size_t n)
{
    float *h = host_from(dev, n * sizeof(float));
    double e = rel_err(h, cpu, n);
    free(h);
    printf("  %s: max |gpu-cpu| / max |cpu| = %.3g (tol 1e-4)\n", what, e);
    if (!(e <= 1e-4)) fail_msg("%s: relative error %.3g > 1e-4", what, e);
}

/* ---- ops ------------------------------------------------------------------------------------ */

static void test_linear(void **st)
{
    (void)st;
    size_t n = 37, in = 53, out = 29;
    float *x = rnd(n * in, 1, 0), *w = rnd(out * in, 0.2f, 0), *b = rnd(out, 0.1f, 0);
    float *dy = rnd(n * out, 1, 0);
    float *y = calloc(n * out, 4), *dx = calloc(n * in, 4), *dw = rnd(out * in, 0.01f, 0),
          *db = rnd(out, 0.01f, 0);
    float *d_x = dev_from(x, n * in * 4), *d_w = dev_from(w, out * in * 4),
          *d_b = dev_from(b, out * 4), *d_dy = dev_from(dy, n * out * 4), *d_y = dev_from(NULL, n * out * 4),
          *d_dx = dev_from(NULL, n * in * 4), *d_dw = dev_from(dw, out * in * 4),
          *d_db = dev_from(db, out * 4);
    struct ps_cuda_blas *bl;
    OK(ps_cuda_blas_create(&bl, S, NULL));
    OK(ps_cuda_linear_forward(bl, d_x, d_w, d_b, d_y, n, in, out, NULL));
    OK(ps_cuda_linear_backward(bl, d_x, d_w, d_dy, d_dx, d_dw, d_db, n, in, out, NULL));
    assert_int_equal(ps_cpu_linear_forward(x, w, b, y, n, in, out), 0);
    assert_int_equal(ps_cpu_linear_backward(x, w, dy, dx, dw, db, n, in, out), 0);
    expect_close("linear y", d_y, y, n * out);
    expect_close("linear dx", d_dx, dx, n * in);
    expect_close("linear dw", d_dw, dw, out * in);
    expect_close("linear db", d_db, db, out);
    ps_cuda_blas_destroy(bl);
    void *dp[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
    for (size_t k = 0; k < sizeof(dp) / sizeof(dp[0]); k++) ps_cuda_free(dp[k]);
    void *hp[] = {x, w, b, dy, y, dx, dw, db};
    for (size_t k = 0; k < sizeof(hp) / sizeof(hp[0]); k++) free(hp[k]);
}

static void conv_case(size_t n, size_t cin, size_t h, size_t w_, size_t cout, size_t k,
                      size_t stride, size_t pad, size_t reserve)
{
    struct ps_conv2d_shape s = {.n = n, .c_in = cin, .h = h, .w = w_, .c_out = cout, .kh = k,
                                .kw = k, .stride = stride, .padding = pad};
    size_t oh = ps_cpu_conv2d_out_h(&s), ow = ps_cpu_conv2d_out_w(&s);
    size_t nx = n * cin * h * w_, nw = cout * cin * k * k, ny = n * cout * oh * ow;
    float *x = rnd(nx, 1, 0), *w = rnd(nw, 0.3f, 0), *b = rnd(cout, 0.1f, 0), *dy = rnd(ny, 1, 0);
    float *y = calloc(ny, 4), *dx = calloc(nx, 4), *dw = calloc(nw, 4), *db = calloc(cout, 4);
    float *d_x = dev_from(x, nx * 4), *d_w = dev_from(w, nw * 4), *d_b = dev_from(b, cout * 4),
          *d_dy = dev_from(dy, ny * 4), *d_y = dev_from(NULL, ny * 4), *d_dx = dev_from(NULL, nx * 4),
          *d_dw = dev_from(NULL, nw * 4), *d_db = dev_from(NULL, cout * 4);
    struct ps_cuda_blas *bl;
    OK(ps_cuda_blas_create(&bl, S, NULL));
    if (reserve) OK(ps_cuda_blas_reserve(bl, reserve, NULL)); /* forces chunks of samples */
    OK(ps_cuda_conv2d_forward(bl, &s, d_x, d_w, d_b, d_y, NULL));
    OK(ps_cuda_conv2d_backward(bl, &s, d_x, d_w, d_dy, d_dx, d_dw, d_db, NULL));
    assert_int_equal(ps_cpu_conv2d_forward(&s, x, w, b, y, NULL), 0);
    assert_int_equal(ps_cpu_conv2d_backward(&s, x, w, dy, dx, dw, db, NULL), 0);
    expect_close("conv y", d_y, y, ny);
    expect_close("conv dx", d_dx, dx, nx);
    expect_close("conv dw", d_dw, dw, nw);
    expect_close("conv db", d_db, db, cout);
    ps_cuda_blas_destroy(bl);
    void *dp[] = {d_x, d_w, d_b, d_dy, d_y, d_dx, d_dw, d_db};
    for (size_t q = 0; q < sizeof(dp) / sizeof(dp[0]); q++) ps_cuda_free(dp[q]);
    void *hp[] = {x, w, b, dy, y, dx, dw, db};
    for (size_t q = 0; q < sizeof(hp) / sizeof(hp[0]); q++) free(hp[q]);
}

static void test_conv2d(void **st)
{
    (void)st;
    conv_case(3, 4, 9, 7, 5, 3, 1, 1, 0);
    conv_case(2, 3, 11, 11, 6, 3, 2, 1, 0);
    conv_case(4, 8, 6, 6, 3, 1, 1, 0, 0);  /* 1x1 direct */
    conv_case(5, 2, 8, 8, 4, 5, 1, 2, 4096); /* workspace of < 1 sample: grows, chunks of one */
}

static void test_pool_relu_dropout(void **st)
{
    (void)st;
    struct ps_pool2d_shape ps = {.n = 3, .c = 4, .h = 9, .w = 8, .kernel = 3, .stride = 2,
                                 .padding = 1};
    size_t oh = ps_cpu_maxpool2d_out_h(&ps), ow = ps_cpu_maxpool2d_out_w(&ps);
    size_t nx = 3 * 4 * 9 * 8, ny = 3 * 4 * oh * ow;
    float *x = rnd(nx, 1, 0), *dy = rnd(ny, 1, 0), *y = calloc(ny, 4), *dx = calloc(nx, 4);
    int64_t *idx = calloc(ny, sizeof(int64_t)); /* the cpu kernel keeps PyTorch's int64 */
    float *d_x = dev_from(x, nx * 4), *d_y = dev_from(NULL, ny * 4), *d_dy = dev_from(dy, ny * 4),
          *d_dx = dev_from(NULL, nx * 4);
    int32_t *d_idx = dev_from(NULL, ny * 4);
    OK(ps_cuda_maxpool2d_forward(&ps, d_x, d_y, d_idx, S, NULL));
    OK(ps_cuda_maxpool2d_backward(&ps, d_dy, d_idx, d_dx, S, NULL));
    assert_int_equal(ps_cpu_maxpool2d_forward(&ps, x, y, idx, NULL), 0);
    ps_cpu_maxpool2d_backward(&ps, dy, idx, dx);
    expect_close("maxpool y", d_y, y, ny);
    int32_t *hidx = host_from(d_idx, ny * 4);
    for (size_t k = 0; k < ny; k++) assert_int_equal(hidx[k], idx[k]);
    free(hidx);
    expect_close("maxpool dx", d_dx, dx, nx);

    /* relu */
    float *r = calloc(nx, 4), *dr = calloc(nx, 4), *g = rnd(nx, 1, 0);
    float *d_r = dev_from(NULL, nx * 4), *d_g = dev_from(g, nx * 4), *d_dr = dev_from(NULL, nx * 4);
    OK(ps_cuda_relu_forward(d_x, d_r, nx, S, NULL));
    OK(ps_cuda_relu_backward(d_r, d_g, d_dr, nx, S, NULL));
    ps_cpu_relu_forward(x, r, nx);
    ps_cpu_relu_backward(r, g, dr, nx);
    float *hr = host_from(d_r, nx * 4), *hdr = host_from(d_dr, nx * 4);
    assert_memory_equal(hr, r, nx * 4);
    assert_memory_equal(hdr, dr, nx * 4);
    free(hr);
    free(hdr);

    /* dropout: identical masks and values (same RNG), also p = 0 and p = 1 */
    const float ps_[] = {0.0f, 0.25f, 0.5f, 1.0f};
    for (size_t q = 0; q < 4; q++) {
        uint8_t *mask = calloc(nx, 1);
        float *yd = calloc(nx, 4), *gd = calloc(nx, 4);
        uint8_t *d_mask = dev_from(NULL, nx);
        float *d_yd = dev_from(NULL, nx * 4), *d_gd = dev_from(NULL, nx * 4);
        OK(ps_cuda_dropout_forward(d_x, d_yd, d_mask, nx, ps_[q], 99, 12345 + q, S, NULL));
        OK(ps_cuda_dropout_backward(d_g, d_mask, d_gd, nx, ps_[q], S, NULL));
        ps_cpu_dropout_forward(x, yd, mask, nx, ps_[q], 99, 12345 + q);
        ps_cpu_dropout_backward(g, mask, gd, nx, ps_[q]);
        uint8_t *hm = host_from(d_mask, nx);
        float *hy = host_from(d_yd, nx * 4), *hg = host_from(d_gd, nx * 4);
        assert_memory_equal(hm, mask, nx);
        assert_memory_equal(hy, yd, nx * 4);
        assert_memory_equal(hg, gd, nx * 4);
        free(hm);
        free(hy);
        free(hg);
        free(mask);
        free(yd);
        free(gd);
        ps_cuda_free(d_mask);
        ps_cuda_free(d_yd);
        ps_cuda_free(d_gd);
    }
    void *dp[] = {d_x, d_y, d_dy, d_dx, d_idx, d_r, d_g, d_dr};
    for (size_t q = 0; q < sizeof(dp) / sizeof(dp[0]); q++) ps_cuda_free(dp[q]);
    void *hp[] = {x, dy, y, dx, idx, r, dr, g};
    for (size_t q = 0; q < sizeof(hp) / sizeof(hp[0]); q++) free(hp[q]);
}

static void test_losses_sgd(void **st)
{
    (void)st;
    size_t n = 19, k = 7, cnt = n * k;
    float *z = rnd(cnt, 3, 0), *t = rnd(cnt, 1, 0), *dz = calloc(cnt, 4);
    int64_t *lab = malloc(n * sizeof(int64_t));
    for (size_t i = 0; i < n; i++) lab[i] = (int64_t)((i * 5 + 3) % k);
    float *d_z = dev_from(z, cnt * 4), *d_t = dev_from(t, cnt * 4), *d_dz = dev_from(NULL, cnt * 4);
    int64_t *d_lab = dev_from(lab, n * sizeof(int64_t));
    double *d_loss = dev_from(NULL, sizeof(double)), loss, ref;

    OK(ps_cuda_loss_sum_forward(d_z, cnt, d_loss, S, NULL));
    OK(ps_cuda_loss_sum_backward(d_dz, cnt, 0.5f, S, NULL));
    double *h = host_from(d_loss, 8);
    loss = *h;
    free(h);
    ref = ps_cpu_loss_sum_forward(z, cnt);
    assert_true(fabs(loss - ref) <= 1e-9 * (1 + fabs(ref)));
    ps_cpu_loss_sum_backward(dz, cnt, 0.5f);
    expect_close("sum dy", d_dz, dz, cnt);

    OK(ps_cuda_loss_mse_forward(d_z, d_t, cnt, d_loss, S, NULL));
    OK(ps_cuda_loss_mse_backward(d_z, d_t, d_dz, cnt, 0.75f, S, NULL));
    h = host_from(d_loss, 8);
    loss = *h;
    free(h);
    ref = ps_cpu_loss_mse_forward(z, t, cnt);
    assert_true(fabs(loss - ref) <= 1e-9 * (1 + fabs(ref)));
    ps_cpu_loss_mse_backward(z, t, dz, cnt, 0.75f);
    expect_close("mse dy", d_dz, dz, cnt);

    OK(ps_cuda_loss_ce_forward(d_z, d_lab, n, k, d_loss, S, NULL));
    OK(ps_cuda_loss_ce_backward(d_z, d_lab, d_dz, n, k, 0.5f, S, NULL));
    h = host_from(d_loss, 8);
    loss = *h;
    free(h);
    assert_int_equal(ps_cpu_loss_cross_entropy_forward(z, lab, n, k, &ref, NULL), 0);
    assert_true(fabs(loss - ref) <= 1e-9 * (1 + fabs(ref)));
    assert_int_equal(ps_cpu_loss_cross_entropy_backward(z, lab, dz, n, k, 0.5f, NULL), 0);
    expect_close("ce dz", d_dz, dz, cnt);

    /* SGD and accumulation: bit for bit */
    float *p = rnd(cnt, 1, 0), *d_p = dev_from(p, cnt * 4);
    OK(ps_cuda_sgd_step(d_p, d_t, cnt, 0.05f, S, NULL));
    OK(ps_cuda_add_inplace(d_p, d_z, cnt, S, NULL));
    ps_cpu_sgd_step(p, t, cnt, 0.05f);
    ps_cpu_add_inplace(p, z, cnt);
    float *hp = host_from(d_p, cnt * 4);
    assert_memory_equal(hp, p, cnt * 4);
    free(hp);
    void *dp[] = {d_z, d_t, d_dz, d_lab, d_loss, d_p};
    for (size_t q = 0; q < sizeof(dp) / sizeof(dp[0]); q++) ps_cuda_free(dp[q]);
    free(z);
    free(t);
    free(dz);
    free(lab);
    free(p);
}

/* ---- batchnorm: forward/backward in every mode, running stats under every policy ---------- */

struct bn_pair {
    struct ps_bn cpu;
    struct ps_cuda_bn gpu;
    float *w, *b, *rm, *rv;
    size_t C;
};

static void bn_pair_init(struct bn_pair *p, size_t C, size_t maxn, size_t Sp, bool cumulative,
                         bool affine)
{
    memset(p, 0, sizeof(*p));
    p->C = C;
    p->w = rnd(C, 0.5f, 1.0f);
    p->b = rnd(C, 0.5f, 0.0f);
    p->rm = calloc(C, 4);
    p->rv = malloc(C * 4);
    for (size_t c = 0; c < C; c++) p->rv[c] = 1.0f;
    p->cpu = (struct ps_bn){.channels = C, .eps = 1e-5f, .momentum = 0.1f,
                            .cumulative = cumulative, .weight = affine ? p->w : NULL,
                            .bias = affine ? p->b : NULL, .running_mean = p->rm,
                            .running_var = p->rv};
    p->gpu = (struct ps_cuda_bn){.channels = C, .eps = 1e-5f, .momentum = 0.1f,
                                 .cumulative = cumulative};
    if (affine) {
        p->gpu.weight = dev_from(p->w, C * 4);
        p->gpu.bias = dev_from(p->b, C * 4);
    }
    p->gpu.running_mean = dev_from(p->rm, C * 4);
    p->gpu.running_var = dev_from(p->rv, C * 4);
    p->gpu.partial = dev_from(NULL, ps_cuda_bn_scratch(C, maxn, Sp));
}

static void bn_pair_check(struct bn_pair *p, const char *what)
{
    assert_int_equal(p->gpu.num_batches_tracked, p->cpu.num_batches_tracked);
    char buf[96];
    snprintf(buf, sizeof(buf), "%s running_mean", what);
    expect_close(buf, p->gpu.running_mean, p->rm, p->C);
    snprintf(buf, sizeof(buf), "%s running_var", what);
    expect_close(buf, p->gpu.running_var, p->rv, p->C);
}

static void bn_pair_finish(struct bn_pair *p)
{
    ps_cuda_free((void *)p->gpu.weight);
    ps_cuda_free((void *)p->gpu.bias);
    ps_cuda_free(p->gpu.running_mean);
    ps_cuda_free(p->gpu.running_var);
    ps_cuda_free(p->gpu.partial);
    free(p->w);
    free(p->b);
    free(p->rm);
    free(p->rv);
}

/* one forward+backward in `mode` on [n, C, Sp], compared with the CPU */
static void bn_step(struct bn_pair *p, int mode, size_t n, size_t Sp, float shift)
{
    size_t C = p->C, cnt = n * C * Sp;
    float *x = rnd(cnt, 2.0f, shift), *dy = rnd(cnt, 1.0f, 0.0f), *y = calloc(cnt, 4),
          *dx = calloc(cnt, 4), *sm = calloc(C, 4), *si = calloc(C, 4), *dw = calloc(C, 4),
          *db = calloc(C, 4);
    float *d_x = dev_from(x, cnt * 4), *d_dy = dev_from(dy, cnt * 4), *d_y = dev_from(NULL, cnt * 4),
          *d_dx = dev_from(NULL, cnt * 4), *d_sm = dev_from(NULL, C * 4),
          *d_si = dev_from(NULL, C * 4), *d_dw = dev_from(NULL, C * 4), *d_db = dev_from(NULL, C * 4),
          *d_lm = dev_from(NULL, C * 4), *d_lv = dev_from(NULL, C * 4);
    OK(ps_cuda_bn_forward(&p->gpu, mode, d_x, d_y, n, Sp, d_sm, d_si, d_lm, d_lv, S, NULL));
    assert_int_equal(ps_cpu_bn_forward(&p->cpu, (enum ps_bn_mode)mode, x, y, n, Sp, sm, si, NULL), 0);
    bool training = mode != PS_BN_EVAL;
    OK(ps_cuda_bn_backward(&p->gpu, training, d_x, d_dy, d_sm, d_si, d_dx,
                           p->gpu.weight ? d_dw : NULL, p->gpu.bias ? d_db : NULL, n, Sp, S, NULL));
    ps_cpu_bn_backward(&p->cpu, training, x, dy, sm, si, dx, p->cpu.weight ? dw : NULL,
                       p->cpu.bias ? db : NULL, n, Sp);
    expect_close("bn y", d_y, y, cnt);
    expect_close("bn save_mean", d_sm, sm, C);
    expect_close("bn save_invstd", d_si, si, C);
    expect_close("bn dx", d_dx, dx, cnt);
    if (p->gpu.weight) {
        expect_close("bn dweight", d_dw, dw, C);
        expect_close("bn dbias", d_db, db, C);
    }
    bn_pair_check(p, mode == PS_BN_TRAIN ? "train" : mode == PS_BN_EVAL ? "eval" : "no-track");
    void *dp[] = {d_x, d_dy, d_y, d_dx, d_sm, d_si, d_dw, d_db, d_lm, d_lv};
    for (size_t q = 0; q < sizeof(dp) / sizeof(dp[0]); q++) ps_cuda_free(dp[q]);
    void *hp[] = {x, dy, y, dx, sm, si, dw, db};
    for (size_t q = 0; q < sizeof(hp) / sizeof(hp[0]); q++) free(hp[q]);
}

static void test_batchnorm_modes(void **st)
{
    (void)st;
    /* shapes: BN1d [N,C] and S = 2 (small-S kernel, a lane per channel), small planes 2x2, 7x7,
       10x10 (a warp per channel; 37 and 70 channels leave a tile partly empty), planes >= 128
       (plane kernel: 14x14 = 196), odd sizes (scalar paths) */
    const size_t shapes[][3] = {{33, 20, 1},  {5, 9, 2},    {6, 5, 49},   {7, 37, 49},
                                {9, 40, 4},   {5, 70, 100}, {4, 37, 196}, {4, 3, 160},
                                {3, 7, 131},  {2, 40, 256}};
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        size_t n = shapes[k][0], C = shapes[k][1], Sp = shapes[k][2];
        for (int cum = 0; cum < 2; cum++)
            for (int aff = 0; aff < 2; aff++) {
                struct bn_pair p;
                bn_pair_init(&p, C, n, Sp, cum, aff);
                bn_step(&p, PS_BN_TRAIN, n, Sp, 0.5f);
                bn_step(&p, PS_BN_TRAIN, n, Sp, -1.0f);
                bn_step(&p, PS_BN_TRAIN_NO_TRACK, n, Sp, 3.0f);
                bn_step(&p, PS_BN_EVAL, n, Sp, 0.0f);
                bn_step(&p, PS_BN_TRAIN, n, Sp, 2.0f);
                bn_pair_finish(&p);
            }
    }
}

static void test_batchnorm_deferred(void **st)
{
    (void)st;
    size_t C = 6, Sp = 25, mbs[] = {5, 5, 3};
    for (int cum = 0; cum < 2; cum++) {
        struct bn_pair p;
        bn_pair_init(&p, C, 5, Sp, cum, true);
        double sum[6] = {0}, sq[6] = {0}, *d_sum = dev_from(NULL, C * 8), *d_sq = dev_from(NULL, C * 8);
        struct ps_bn_accum acc = {.channels = C, .sum = sum, .sum_sq = sq};
        struct ps_cuda_bn_accum gacc = {.channels = C, .sum = d_sum, .sum_sq = d_sq};
        OK(ps_cuda_bn_accum_reset(&gacc, S, NULL));
        float *d_lm = dev_from(NULL, C * 4), *d_lv = dev_from(NULL, C * 4);
        for (int step = 0; step < 3; step++) {
            for (size_t i = 0; i < 3; i++) {
                size_t cnt = mbs[i] * C * Sp;
                float *x = rnd(cnt, 1.5f, (float)i - 1.0f), *d_x = dev_from(x, cnt * 4);
                OK(ps_cuda_bn_accumulate(&gacc, p.gpu.partial, d_x, mbs[i], Sp, S, NULL));
                ps_cpu_bn_accumulate(&acc, x, mbs[i], Sp);
                assert_int_equal(gacc.count, acc.count);
                /* the micro-batch itself is normalised without tracking */
                float *d_y = dev_from(NULL, cnt * 4), *y = calloc(cnt, 4);
                OK(ps_cuda_bn_forward(&p.gpu, PS_BN_TRAIN_NO_TRACK, d_x, d_y, mbs[i], Sp, NULL,
                                      NULL, NULL, NULL, S, NULL));
                assert_int_equal(ps_cpu_bn_forward(&p.cpu, PS_BN_TRAIN_NO_TRACK, x, y, mbs[i], Sp,
                                                   NULL, NULL, NULL), 0);
                expect_close("deferred y", d_y, y, cnt);
                ps_cuda_free(d_x);
                ps_cuda_free(d_y);
                free(x);
                free(y);
            }
            OK(ps_cuda_bn_commit(&p.gpu, &gacc, d_lm, d_lv, S, NULL));
            assert_int_equal(ps_cpu_bn_commit(&p.cpu, &acc, NULL), 0);
            assert_int_equal(gacc.count, 0);
            bn_pair_check(&p, "deferred commit");
        }
        struct ps_diag d;
        ps_diag_clear(&d);
        assert_int_equal(ps_cuda_bn_commit(&p.gpu, &gacc, NULL, NULL, S, &d), -EINVAL);
        ps_cuda_free(d_sum);
        ps_cuda_free(d_sq);
        ps_cuda_free(d_lm);
        ps_cuda_free(d_lv);
        bn_pair_finish(&p);
    }
}

/* ---- the executor ------------------------------------------------------------------------- */

struct run {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *graph;
    struct ps_order order;
};

/* the test net on [3, hw, hw] inputs: its first BatchNorm sees hw x hw planes */
static void load(struct run *r, const char *ckpt, const char *policy, const char *loss,
                 int parts, int hw)
{
    char js[2048];
    snprintf(js, sizeof(js),
             "{\"pipescope\": 1, \"name\": \"gpu\", \"batch\": 24,"
             " \"model\": {\"input\": [3, %d, %d], \"layers\": ["
             "  {\"op\": \"conv2d\", \"out\": 6, \"kernel\": 3, \"padding\": 1},"
             "  {\"op\": \"batchnorm\"}, {\"op\": \"relu\"}, {\"op\": \"maxpool2d\", \"kernel\": 2},"
             "  {\"op\": \"flatten\"}, {\"op\": \"linear\", \"out\": 12},"
             "  {\"op\": \"batchnorm\", \"momentum\": null}, {\"op\": \"dropout\", \"p\": 0.2},"
             "  {\"op\": \"linear\", \"out\": 5}], \"loss\": \"%s\"},"
             " \"pipeline\": {\"balance\": %s, \"chunks\": 4, \"checkpoint\": \"%s\","
             "  \"batchnorm\": \"%s\"},"
             " \"data\": {\"source\": \"synthetic\", \"seed\": 3},"
             " \"train\": {\"steps\": 3, \"lr\": 0.05}}",
             hw, hw, loss, parts == 3 ? "[3, 3, 3]" : "[5, 4]", ckpt, policy);
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(r, 0, sizeof(*r));
    if (ps_spec_parse(js, "gpu.json", ".", &r->spec, &d)) fail_diag(&d);
    if (ps_model_build(r->spec, &r->model, &d)) fail_diag(&d);
    struct ps_variant o;
    ps_variant_from_spec(r->spec, &o);
    if (ps_schedule_build(r->spec, r->model, &o, &r->graph, &d)) fail_diag(&d);
    if (ps_schedule_order(r->graph, &r->order, &d)) fail_diag(&d);
}

static void unload(struct run *r)
{
    ps_order_finish(&r->order);
    ps_graph_destroy(r->graph);
    ps_model_destroy(r->model);
    ps_spec_destroy(r->spec);
}

/* the producers with device records of the tensors node v reads: DATA edges only, through nodes
   without records (fork, join, waits, loss', r). Phony edges carry no tensor and order the host
   only (SEMANTICS.md section 2), so the device need not follow them. */
static void preds_with_records(const struct ps_graph *g, uint32_t v, const int32_t *rec,
                               uint32_t *out, uint32_t *n_out, uint32_t *stack, uint32_t *mark)
{
    uint32_t sp = 0;
    for (uint32_t k = g->in_off[v]; k < g->in_off[v + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->in_edge[k]];
        if (e->kind == PS_EDGE_DATA) stack[sp++] = e->src;
    }
    while (sp) {
        uint32_t w = stack[--sp];
        if (mark[w] == v + 1) continue;
        mark[w] = v + 1;
        if (rec[w] >= 0) {
            out[(*n_out)++] = w;
            continue;
        }
        for (uint32_t k = g->in_off[w]; k < g->in_off[w + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->in_edge[k]];
            if (e->kind == PS_EDGE_DATA) stack[sp++] = e->src;
        }
    }
}

/* The executor cases report every failed check (with its sizes) and go on to the next case, so
 * one run shows every case that fails, not only the first; test_exec_policies fails at the end. */
static int n_bad;

static bool check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool check(bool ok, const char *fmt, ...)
{
    if (ok) return true;
    va_list ap;
    va_start(ap, fmt);
    printf("    FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_bad++;
    return false;
}

/* max relative error over a case's checks of one kind */
static void worst(double *w, double e)
{
    if (e > *w || isnan(e)) *w = isnan(e) ? INFINITY : e;
}

static void check_trace(const struct run *r, const struct ps_trace *t)
{
    const struct ps_graph *g = r->graph;
    if (!check(t->source == PS_TRACE_CUDA && t->n > 0, "trace: source %d, %u records", (int)t->source,
               t->n))
        return;
    int32_t *rec = malloc(g->n_nodes * sizeof(int32_t));
    for (uint32_t v = 0; v < g->n_nodes; v++) rec[v] = -1;
    uint32_t bad_rec = 0, missing = 0;
    for (uint32_t k = 0; k < t->n; k++) {
        const struct ps_trace_rec *x = &t->r[k];
        bool ok = check(x->node < g->n_nodes, "trace record %u: node %u of %u", k, x->node,
                        g->n_nodes) &&
                  check(x->dur_us >= 0.0 && x->start_us >= 0.0,
                        "trace record %u: start %.3f us, duration %.3f us", k, x->start_us, x->dur_us) &&
                  check(g->nodes[x->node].kind == PS_NODE_LOSS ||
                            x->stream == g->nodes[x->node].stream,
                        "trace record %u: stream %d, the plan assigned %d", k, (int)x->stream,
                        (int)g->nodes[x->node].stream) &&
                  check(rec[x->node] < 0, "trace: node %u has two records", x->node);
        if (!ok) {
            if (++bad_rec >= 5) break; /* enough to see the pattern */
            continue;
        }
        rec[x->node] = (int32_t)k;
    }
    /* every task ran on the GPU */
    for (uint32_t v = 0; v < g->n_nodes; v++)
        if (ps_node_is_task(&g->nodes[v]) && r->order.pos[v] != UINT32_MAX && rec[v] < 0) missing++;
    check(missing == 0, "trace: %u tasks without a record", missing);
    /* events enforce every data dependency across streams: a record starts no earlier than the
     * end of its predecessors' records on other streams, less 1 ns of timestamp rounding */
    const double slack = 1e-3;
    uint32_t *fr = malloc((g->n_nodes + 1) * sizeof(uint32_t));
    uint32_t *stack = malloc((g->n_edges + g->n_nodes + 1) * sizeof(uint32_t));
    uint32_t *mark = calloc(g->n_nodes, sizeof(uint32_t));
    uint32_t checked = 0, early = 0;
    double min_gap = INFINITY;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        if (rec[v] < 0) continue;
        uint32_t nf = 0;
        preds_with_records(g, v, rec, fr, &nf, stack, mark);
        const struct ps_trace_rec *b = &t->r[rec[v]];
        for (uint32_t k = 0; k < nf; k++) {
            const struct ps_trace_rec *a = &t->r[rec[fr[k]]];
            if (a->stream == b->stream) continue;
            checked++;
            double gap = b->start_us - (a->start_us + a->dur_us);
            if (gap < min_gap) min_gap = gap;
            if (gap + slack < 0 && ++early <= 5) {
                char na[64], nb[64];
                check(false, "%s starts at %.3f us, %.3f us before its predecessor %s ends (slack %.3f us)",
                      ps_node_name(g, v, nb, sizeof(nb)), b->start_us, -gap,
                      ps_node_name(g, fr[k], na, sizeof(na)), slack);
            }
        }
    }
    check(early == 0, "trace: %u of %u cross-stream waits not enforced", early, checked);
    check(checked > 0, "trace: no cross-stream dependency to check");
    printf("    trace: %u records, %u cross-stream waits checked, least gap %.3f us (slack %.3f us)\n",
           t->n, checked, min_gap, slack);
    free(fr);
    free(stack);
    free(mark);
    free(rec);
}

/* the numbers of one case: loss, the BN update log and the final state, cuda vs cpu */
static void compare_results(const struct ps_exec_result *gpu, const struct ps_exec_result *cpu)
{
    const double tol = 1e-4;
    double e_loss = 0, e_bn = 0, e_state = 0;
    if (!check(gpu->steps == cpu->steps, "steps %d (cuda) vs %d (cpu)", gpu->steps, cpu->steps))
        return;
    for (int s = 0; s < cpu->steps; s++)
        worst(&e_loss, fabs(gpu->loss[s] - cpu->loss[s]) / (1.0 + fabs(cpu->loss[s])));
    if (check(gpu->n_bn == cpu->n_bn, "BN updates %u (cuda) vs %u (cpu)", gpu->n_bn, cpu->n_bn))
        for (uint32_t k = 0; k < cpu->n_bn; k++) {
            const struct ps_exec_bn_update *a = &gpu->bn[k], *b = &cpu->bn[k];
            if (!check(a->layer == b->layer && a->step == b->step && a->mb == b->mb &&
                           a->phase == b->phase && a->node == b->node && a->count == b->count &&
                           fabs(a->factor - b->factor) <= 1e-12,
                       "BN update %u: layer %d step %d mb %d node %u count %lld factor %.17g (cuda) vs "
                       "layer %d step %d mb %d node %u count %lld factor %.17g (cpu)",
                       k, (int)a->layer, (int)a->step, (int)a->mb, (unsigned)a->node,
                       (long long)a->count, a->factor, (int)b->layer, (int)b->step, (int)b->mb,
                       (unsigned)b->node, (long long)b->count, b->factor))
                break;
            size_t C = (size_t)cpu->state.layers[b->layer].channels;
            worst(&e_bn, rel_err(a->mean, b->mean, C));
            worst(&e_bn, rel_err(a->var, b->var, C));
        }
    for (int l = 0; l < cpu->state.n_layers; l++) {
        const struct ps_layer_state *a = &gpu->state.layers[l], *b = &cpu->state.layers[l];
        check(a->num_batches_tracked == b->num_batches_tracked,
              "layer %d: num_batches_tracked %lld (cuda) vs %lld (cpu)", l,
              (long long)a->num_batches_tracked, (long long)b->num_batches_tracked);
        if (b->weight) worst(&e_state, rel_err(a->weight, b->weight, (size_t)b->n_weight));
        if (b->bias) worst(&e_state, rel_err(a->bias, b->bias, (size_t)b->n_bias));
        if (b->running_mean) {
            worst(&e_state, rel_err(a->running_mean, b->running_mean, (size_t)b->channels));
            worst(&e_state, rel_err(a->running_var, b->running_var, (size_t)b->channels));
        }
    }
    printf("    loss max |cuda-cpu|/(1+|cpu|) = %.3g, BN mean/var max rel = %.3g, final state max "
           "rel = %.3g (tol %.0e)\n", e_loss, e_bn, e_state, tol);
    check(e_loss <= tol, "loss error %.3g > %.0e", e_loss, tol);
    check(e_bn <= tol, "BN statistics error %.3g > %.0e", e_bn, tol);
    check(e_state <= tol, "final state error %.3g > %.0e", e_state, tol);
}

/* one executor case; returns its number of failed checks (0: passed) */
static int exec_case(const char *ckpt, const char *policy, const char *loss, int parts, int hw)
{
    printf("  exec checkpoint %s, policy %s, loss %s, %d partitions, %dx%d:\n", ckpt, policy, loss,
           parts, hw, hw);
    n_bad = 0;
    struct run r;
    load(&r, ckpt, policy, loss, parts, hw);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    o.trace = true;
    struct ps_exec_result cpu, gpu;
    struct ps_diag d;
    char buf[2048];
    ps_diag_clear(&d);
    o.backend = PS_BACKEND_CPU;
    if (!check(ps_exec_run(r.graph, &r.order, &o, &cpu, &d) == 0, "cpu run: %s",
               ps_diag_format(&d, buf, sizeof(buf)))) {
        unload(&r);
        return n_bad;
    }
    struct ps_exec_cuda_opts co = {.virtual_devices = n_gpus < r.spec->n_devices};
    struct ps_exec_cuda_stats stats;
    o.backend = PS_BACKEND_CUDA;
    if (check(ps_exec_cuda_run(r.graph, &r.order, &o, &co, &gpu, &stats, &d) == 0, "cuda run: %s",
              ps_diag_format(&d, buf, sizeof(buf)))) {
        compare_results(&gpu, &cpu);
        /* the trace; GEMMs are launched through the driver API too */
        printf("    CUPTI: %llu records, %llu unmapped, %llu dropped (trace %llu), %llu without "
               "timestamps (skipped), %u events\n", (unsigned long long)stats.cupti_records,
               (unsigned long long)stats.unmapped, (unsigned long long)stats.dropped,
               (unsigned long long)gpu.trace.dropped, (unsigned long long)stats.no_time,
               stats.events);
        check(stats.unmapped == 0 && stats.dropped == 0 && gpu.trace.dropped == 0,
              "CUPTI records unmapped %llu, dropped %llu (trace %llu): want 0",
              (unsigned long long)stats.unmapped, (unsigned long long)stats.dropped,
              (unsigned long long)gpu.trace.dropped);
        check(stats.events > 0, "no CUDA events recorded");
        check_trace(&r, &gpu.trace);
        ps_exec_result_finish(&gpu);
    }
    ps_exec_result_finish(&cpu);
    unload(&r);
    printf("    %s\n", n_bad ? "FAILED" : "ok");
    return n_bad;
}

static void test_exec_policies(void **st)
{
    (void)st;
    const char *ck[] = {"never", "except_last", "always"};
    const char *pol[] = {"plain", "deferred", "grad-only"};
    int bad = 0, cases = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++, cases++) bad += exec_case(ck[a], pol[b], "cross_entropy", 2, 8) > 0;
    bad += exec_case("except_last", "plain", "mse", 3, 8) > 0;
    bad += exec_case("always", "deferred", "sum", 3, 8) > 0;
    /* BatchNorm on 7x7 (small-plane kernel) and 14x14 (plane kernel) planes */
    bad += exec_case("always", "plain", "cross_entropy", 2, 7) > 0;
    bad += exec_case("except_last", "deferred", "cross_entropy", 3, 14) > 0;
    cases += 4;
    if (bad) fail_msg("%d of %d executor cases failed (each one's checks above)", bad, cases);
}

static void test_exec_no_gpus_without_virtual(void **st)
{
    (void)st;
    struct run r;
    load(&r, "never", "plain", "sum", 3, 8);
    if (n_gpus >= r.spec->n_devices) {
        unload(&r);
        skip();
    }
    struct ps_exec_result res;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_exec_cuda_run(r.graph, &r.order, NULL, NULL, &res, NULL, &d), -ENODEV);
    assert_non_null(strstr(d.hint, "--virtual-devices"));
    unload(&r);
}

int main(void)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_cuda_probe(&n_gpus, &d) != 0) {
        char buf[1200];
        fprintf(stderr, "test_gpu: skipped: %s\n", ps_diag_format(&d, buf, sizeof(buf)));
        return 77;
    }
    if (ps_cuda_set_device(0, &d) || ps_cuda_stream_create(&S, &d)) {
        char buf[1200];
        fprintf(stderr, "test_gpu: %s\n", ps_diag_format(&d, buf, sizeof(buf)));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_pool_relu_dropout),
        cmocka_unit_test(test_losses_sgd),
        cmocka_unit_test(test_batchnorm_modes),
        cmocka_unit_test(test_batchnorm_deferred),
        cmocka_unit_test(test_exec_policies),
        cmocka_unit_test(test_exec_no_gpus_without_virtual),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ps_cuda_stream_destroy(S);
    return rc;
}
