/* loss: the three losses a spec can name, forward (a double scalar) and backward (the gradient
 * with respect to the model output, times the upstream scalar g).
 *
 *   sum            L = sum(y)                                 dy = g
 *   mse            L = mean over ALL elements of (y - t)^2    dy = g * 2 (y - t) / count
 *   cross_entropy  L = mean_i [logsumexp(z_i) - z_i[label_i]] dz = g (softmax(z_i) - onehot_i) / N
 * These are torch.nn.functional's defaults (reduction='mean'; mse_loss averages over every
 * element, not per sample). Invariants: sums and log-sum-exp run in double with the row maximum
 * subtracted first, so large logits never overflow; labels are checked before anything is written.
 */
#include "kernels/cpu/kernels.h"

#include "src/diag.h"

#include <errno.h>
#include <math.h>

double ps_cpu_loss_sum_forward(const float *y, size_t count)
{
    double s = 0.0;
    for (size_t i = 0; i < count; i++) s += y[i];
    return s;
}

void ps_cpu_loss_sum_backward(float *dy, size_t count, float g)
{
    for (size_t i = 0; i < count; i++) dy[i] = g;
}

double ps_cpu_loss_mse_forward(const float *y, const float *t, size_t count)
{
    if (count == 0) return NAN; /* PyTorch: mean of nothing */
    double s = 0.0;
    for (size_t i = 0; i < count; i++) {
        double e = (double)y[i] - t[i];
        s += e * e;
    }
    return s / (double)count;
}

void ps_cpu_loss_mse_backward(const float *y, const float *t, float *dy, size_t count, float g)
{
    double k = 2.0 * g / (double)count;
    for (size_t i = 0; i < count; i++) dy[i] = (float)(k * ((double)y[i] - t[i]));
}

int ps_cpu_loss_check_labels(const int64_t *labels, size_t n, size_t k, struct ps_diag *d)
{
    if (n == 0 || k == 0)
        return ps_diag_set(d, -EINVAL, "cross_entropy", "empty input: %zu samples, %zu classes", n,
                           k);
    for (size_t i = 0; i < n; i++)
        if (labels[i] < 0 || (uint64_t)labels[i] >= k)
            return ps_diag_set(d, -EINVAL, "cross_entropy",
                               "label %lld of sample %zu is outside [0, %zu)",
                               (long long)labels[i], i, k);
    return 0;
}

/* log(sum(exp(z - max))) + max for one row. */
static double logsumexp(const float *z, size_t k, double *max_out)
{
    double mx = z[0];
    for (size_t j = 1; j < k; j++)
        if (z[j] > mx) mx = z[j];
    double s = 0.0;
    for (size_t j = 0; j < k; j++) s += exp((double)z[j] - mx);
    *max_out = mx;
    return log(s) + mx;
}

int ps_cpu_loss_cross_entropy_forward(const float *z, const int64_t *labels, size_t n, size_t k,
                                      double *loss, struct ps_diag *d)
{
    int rc = ps_cpu_loss_check_labels(labels, n, k, d);
    if (rc < 0) return rc;
    double s = 0.0, mx;
    for (size_t i = 0; i < n; i++) {
        const float *row = z + i * k;
        s += logsumexp(row, k, &mx) - row[labels[i]];
    }
    *loss = s / (double)n;
    return 0;
}

int ps_cpu_loss_cross_entropy_backward(const float *z, const int64_t *labels, float *dz,
                                       size_t n, size_t k, float g, struct ps_diag *d)
{
    int rc = ps_cpu_loss_check_labels(labels, n, k, d);
    if (rc < 0) return rc;
    double scale = (double)g / (double)n, mx;
    for (size_t i = 0; i < n; i++) {
        const float *row = z + i * k;
        double lse = logsumexp(row, k, &mx);
        for (size_t j = 0; j < k; j++) {
            double p = exp((double)row[j] - lse);
            dz[i * k + j] = (float)(scale * (p - (j == (size_t)labels[i] ? 1.0 : 0.0)));
        }
    }
    return 0;
}
