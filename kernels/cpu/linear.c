/* linear: a fully connected layer, y = x W^T + b, with W stored [out, in] as in PyTorch.
 *
 * All three products go through ps_cpu_sgemm without copying or transposing anything:
 *   forward   y[N,out]   = x[N,in] * W^T            (sgemm with trans_b)
 *   backward  dx[N,in]   = dy[N,out] * W[out,in]     (overwritten)
 *             dW[out,in] += dy^T * x                 (sgemm with trans_a, beta = 1: accumulated)
 *             db[out]    += column sums of dy, summed in double
 * Invariant: parameter gradients accumulate (PyTorch .grad semantics), the input gradient does not.
 */
#include "kernels/cpu/kernels.h"

#include <errno.h>
#include <stdlib.h>

int ps_cpu_linear_forward(const float *x, const float *w, const float *b, float *y, size_t n,
                          size_t in, size_t out)
{
    int rc = ps_cpu_sgemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    if (rc < 0 || !b) return rc;
    for (size_t i = 0; i < n; i++) {
        float *row = y + i * out;
        for (size_t j = 0; j < out; j++) row[j] += b[j];
    }
    return 0;
}

int ps_cpu_linear_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                           float *db, size_t n, size_t in, size_t out)
{
    int rc = 0;
    if (dx) rc = ps_cpu_sgemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    if (rc == 0 && dw) rc = ps_cpu_sgemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (rc < 0 || !db) return rc;
    double *acc = calloc(out ? out : 1, sizeof(double));
    if (!acc) return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < out; j++) acc[j] += dy[i * out + j];
    for (size_t j = 0; j < out; j++) db[j] += (float)acc[j];
    free(acc);
    return 0;
}
