/* batchnorm: per-channel normalisation over [N, C, S] (S = 1 for BatchNorm1d on [N,C], S = H*W
 * for BatchNorm2d), and the running statistics of SEMANTICS.md section 7, reproduced exactly.
 *
 * Per channel c, over its m = N*S elements:
 *     mu = mean(x), v = mean((x - mu)^2)                 two passes, in double; v is BIASED
 *     y  = (x - mu) / sqrt(v + eps) * weight + bias      (train modes; eval uses the running stats)
 * Running statistics, three ways of touching them:
 *
 *   PS_BN_TRAIN (plain BN, every training forward)    nbt += 1, a = factor(nbt)
 *                                                     rm = (1-a) rm + a mu
 *                                                     rv = (1-a) rv + a v m/(m-1)   UNBIASED
 *   PS_BN_TRAIN_NO_TRACK                              nothing changes (deferred BN's micro-batch
 *                                                     forward, recompute, grad-only without grad)
 *   accumulate ... commit (DeferredBatchNorm)         accumulate: sum += x, sum_sq += x^2,
 *                                                     count += m (per micro-batch, non-recompute)
 *                                                     commit: nbt += 1, a = factor(nbt),
 *                                                     mean = sum/count,
 *                                                     var = sum_sq/count - mean^2   BIASED
 *                                                     same EMA, then the accumulator is reset
 *
 * factor(nbt) = momentum, or 1/nbt for momentum=None (cumulative average), nbt AFTER the
 * increment, so the first cumulative update replaces the initial (0, 1) outright.
 * Invariants: num_batches_tracked changes exactly once per PS_BN_TRAIN forward and once per
 * commit, never otherwise; the EMA is computed in double and stored as float; training needs
 * m >= 2 (PyTorch refuses one value per channel too).
 */
#include "kernels/cpu/kernels.h"

#include "src/diag.h"

#include <errno.h>
#include <math.h>
#include <string.h>

double ps_cpu_bn_factor(const struct ps_bn *bn, int64_t nbt_after)
{
    if (bn->cumulative) return nbt_after > 0 ? 1.0 / (double)nbt_after : 1.0;
    return bn->momentum;
}

static void ema(struct ps_bn *bn, size_t c, double a, double mean, double var)
{
    bn->running_mean[c] = (float)((1.0 - a) * bn->running_mean[c] + a * mean);
    bn->running_var[c] = (float)((1.0 - a) * bn->running_var[c] + a * var);
}

/* The channel's reductions run over its n contiguous runs of `spatial` floats in LANES
 * interleaved double partial sums (element k of a run goes to lane k % LANES, the tail of a run to
 * lane 0), added pairwise at the end. Independent lanes are what lets gcc vectorise the loop
 * (at -O2 too: the inner loop has a fixed trip count) without reassociating anything itself; the
 * order differs from one running sum only by double rounding, far below float precision. */
enum { LANES = 8 };

/* The elementwise passes (normalise, dx) convert 4 floats to 4 doubles and back with GCC vector
 * types: the same operations as the scalar tail, element by element, but vector code at -O2
 * (where gcc does not vectorise the mixed float/double loop by itself). */
typedef float flt4 __attribute__((vector_size(4 * sizeof(float)), aligned(sizeof(float))));
typedef double dbl4 __attribute__((vector_size(4 * sizeof(double)), aligned(sizeof(float))));

static double lanes_total(const double *acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum of x over the channel's runs */
static double channel_sum(const float *x, size_t n, size_t stride, size_t spatial)
{
    double acc[LANES] = {0};
    for (size_t i = 0; i < n; i++) {
        const float *xp = x + i * stride;
        size_t k = 0;
        for (; k + LANES <= spatial; k += LANES)
            for (size_t j = 0; j < LANES; j++) acc[j] += xp[k + j];
        for (; k < spatial; k++) acc[0] += xp[k];
    }
    return lanes_total(acc);
}

/* sum of (x - mu)^2 over the channel's runs */
static double channel_sq_dev(const float *x, size_t n, size_t stride, size_t spatial, double mu)
{
    double acc[LANES] = {0};
    for (size_t i = 0; i < n; i++) {
        const float *xp = x + i * stride;
        size_t k = 0;
        for (; k + LANES <= spatial; k += LANES)
            for (size_t j = 0; j < LANES; j++) {
                double t = xp[k + j] - mu;
                acc[j] += t * t;
            }
        for (; k < spatial; k++) {
            double t = xp[k] - mu;
            acc[0] += t * t;
        }
    }
    return lanes_total(acc);
}

int ps_cpu_bn_forward(struct ps_bn *bn, enum ps_bn_mode mode, const float *x, float *y, size_t n,
                      size_t spatial, float *save_mean, float *save_invstd, struct ps_diag *d)
{
    return ps_cpu_bn_forward_stats(bn, mode, x, y, n, spatial, save_mean, save_invstd, NULL, NULL,
                                   d);
}

int ps_cpu_bn_forward_stats(struct ps_bn *bn, enum ps_bn_mode mode, const float *x, float *y,
                            size_t n, size_t spatial, float *save_mean, float *save_invstd,
                            double *batch_mean, double *batch_var, struct ps_diag *d)
{
    size_t C = bn->channels, m = n * spatial, stride = C * spatial;
    bool train = mode != PS_BN_EVAL;
    if (train && m < 2)
        return ps_diag_set(d, -EINVAL, "batchnorm",
                           "expected more than 1 value per channel when training, got %zu", m);
    double a = 0.0;
    if (mode == PS_BN_TRAIN) {
        if (bn->num_batches_tracked < INT64_MAX) bn->num_batches_tracked += 1; /* saturates, never wraps */
        a = ps_cpu_bn_factor(bn, bn->num_batches_tracked);
    }
    for (size_t c = 0; c < C; c++) {
        const float *xc = x + c * spatial;
        double mu, invstd;
        if (train) {
            mu = channel_sum(xc, n, stride, spatial) / (double)m;
            double q = channel_sq_dev(xc, n, stride, spatial, mu);
            double var = q / (double)m;
            invstd = 1.0 / sqrt(var + (double)bn->eps);
            if (mode == PS_BN_TRAIN) ema(bn, c, a, mu, q / (double)(m - 1));
            if (batch_mean) batch_mean[c] = mu;
            if (batch_var) batch_var[c] = q / (double)(m - 1);
        } else {
            mu = bn->running_mean[c];
            invstd = 1.0 / sqrt((double)bn->running_var[c] + (double)bn->eps);
        }
        if (save_mean) save_mean[c] = (float)mu;
        if (save_invstd) save_invstd[c] = (float)invstd;
        double g = bn->weight ? bn->weight[c] : 1.0, b = bn->bias ? bn->bias[c] : 0.0;
        double scale = invstd * g, shift = b - mu * scale;
        for (size_t i = 0; i < n; i++) {
            const float *xp = xc + i * stride;
            float *yp = y + c * spatial + i * stride;
            size_t k = 0;
            for (; k + 4 <= spatial; k += 4) {
                dbl4 v = __builtin_convertvector(*(const flt4 *)(xp + k), dbl4);
                *(flt4 *)(yp + k) = __builtin_convertvector(v * scale + shift, flt4);
            }
            for (; k < spatial; k++) yp[k] = (float)(xp[k] * scale + shift);
        }
    }
    return 0;
}

void ps_cpu_bn_backward(const struct ps_bn *bn, bool training, const float *x, const float *dy,
                        const float *save_mean, const float *save_invstd, float *dx,
                        float *dweight, float *dbias, size_t n, size_t spatial)
{
    size_t C = bn->channels, m = n * spatial, stride = C * spatial;
    for (size_t c = 0; c < C; c++) {
        double mu = save_mean[c], invstd = save_invstd[c];
        double acc_dy[LANES] = {0}, acc_dy_xmu[LANES] = {0};
        for (size_t i = 0; i < n; i++) {
            const float *xp = x + c * spatial + i * stride, *gp = dy + c * spatial + i * stride;
            size_t k = 0;
            for (; k + LANES <= spatial; k += LANES)
                for (size_t j = 0; j < LANES; j++) {
                    acc_dy[j] += gp[k + j];
                    acc_dy_xmu[j] += gp[k + j] * (xp[k + j] - mu);
                }
            for (; k < spatial; k++) {
                acc_dy[0] += gp[k];
                acc_dy_xmu[0] += gp[k] * (xp[k] - mu);
            }
        }
        double sum_dy = lanes_total(acc_dy), sum_dy_xmu = lanes_total(acc_dy_xmu);
        if (dweight) dweight[c] += (float)(sum_dy_xmu * invstd);
        if (dbias) dbias[c] += (float)sum_dy;
        if (!dx) continue;
        double g = bn->weight ? bn->weight[c] : 1.0;
        double mean_dy = training ? sum_dy / (double)m : 0.0;
        double k_xmu = training ? sum_dy_xmu * invstd * invstd / (double)m : 0.0;
        for (size_t i = 0; i < n; i++) {
            const float *xp = x + c * spatial + i * stride, *gp = dy + c * spatial + i * stride;
            float *dp = dx + c * spatial + i * stride;
            size_t k = 0;
            for (; k + 4 <= spatial; k += 4) {
                dbl4 gv = __builtin_convertvector(*(const flt4 *)(gp + k), dbl4);
                dbl4 xv = __builtin_convertvector(*(const flt4 *)(xp + k), dbl4);
                dbl4 r = (gv - mean_dy - (xv - mu) * k_xmu) * invstd * g;
                *(flt4 *)(dp + k) = __builtin_convertvector(r, flt4);
            }
            for (; k < spatial; k++)
                dp[k] = (float)((gp[k] - mean_dy - (xp[k] - mu) * k_xmu) * invstd * g);
        }
    }
}

void ps_cpu_bn_accum_reset(struct ps_bn_accum *acc)
{
    memset(acc->sum, 0, acc->channels * sizeof(double));
    memset(acc->sum_sq, 0, acc->channels * sizeof(double));
    acc->count = 0;
}

void ps_cpu_bn_accumulate(struct ps_bn_accum *acc, const float *x, size_t n, size_t spatial)
{
    size_t C = acc->channels;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < C; c++) {
            const float *xp = x + (i * C + c) * spatial;
            double s = 0.0, q = 0.0;
            for (size_t k = 0; k < spatial; k++) {
                s += xp[k];
                q += (double)xp[k] * xp[k];
            }
            acc->sum[c] += s;
            acc->sum_sq[c] += q;
        }
    acc->count += (int64_t)(n * spatial);
}

int ps_cpu_bn_commit(struct ps_bn *bn, struct ps_bn_accum *acc, struct ps_diag *d)
{
    if (acc->count <= 0)
        return ps_diag_set(d, -EINVAL, "batchnorm", "commit with no accumulated statistics");
    if (bn->num_batches_tracked < INT64_MAX) bn->num_batches_tracked += 1; /* saturates, never wraps */
    double a = ps_cpu_bn_factor(bn, bn->num_batches_tracked);
    for (size_t c = 0; c < bn->channels; c++) {
        double mean = acc->sum[c] / (double)acc->count;
        double var = acc->sum_sq[c] / (double)acc->count - mean * mean;
        ema(bn, c, a, mean, var);
    }
    ps_cpu_bn_accum_reset(acc);
    return 0;
}
