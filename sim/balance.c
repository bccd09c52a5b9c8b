/* balance: exact min-max contiguous partitions and torchgpipe's block-partition heuristic (see
 * balance.h). */
#include "sim/balance.h"

#include <errno.h>
#include <float.h>
#include <stdbool.h>
#include <stdlib.h>

double ps_balance_max(const double *cost, int L, const int *bal, int P)
{
    double best = 0;
    int k = 0;
    for (int p = 0; p < P; p++) {
        double s = 0;
        for (int q = 0; q < bal[p] && k < L; q++) s += cost[k++];
        if (s > best) best = s;
    }
    return best;
}

int ps_balance_exact(const double *cost, const double *mem, double cap, int L, int P, int *bal,
                     double *max_cost)
{
    if (P < 1 || P > L) return -EINVAL;
    size_t W = (size_t)L + 1;
    double *pre = malloc(W * sizeof(double)), *pm = malloc(W * sizeof(double));
    double *dp = malloc((size_t)(P + 1) * W * sizeof(double));
    int *arg = malloc((size_t)(P + 1) * W * sizeof(int));
    if (!pre || !pm || !dp || !arg) {
        free(pre), free(pm), free(dp), free(arg);
        return -ENOMEM;
    }
    pre[0] = pm[0] = 0;
    for (int i = 0; i < L; i++) {
        pre[i + 1] = pre[i] + cost[i];
        pm[i + 1] = pm[i] + (mem ? mem[i] : 0);
    }
    bool capped = mem && cap > 0;
    /* dp[k][i]: best max over the first i layers in k blocks; arg: start of the last block */
    for (size_t x = 0; x < (size_t)(P + 1) * W; x++) dp[x] = DBL_MAX, arg[x] = -1;
    dp[0] = 0;
    for (int k = 1; k <= P; k++)
        for (int i = k; i <= L - (P - k); i++)
            for (int j = k - 1; j < i; j++) {
                double prev = dp[(size_t)(k - 1) * W + j];
                if (prev == DBL_MAX) continue;
                if (capped && pm[i] - pm[j] > cap) continue;
                double blk = pre[i] - pre[j];
                double v = prev > blk ? prev : blk;
                /* strict < keeps the smallest j, i.e. earlier blocks as small as possible */
                if (v < dp[(size_t)k * W + i]) dp[(size_t)k * W + i] = v, arg[(size_t)k * W + i] = j;
            }
    int rc = 0;
    if (dp[(size_t)P * W + L] == DBL_MAX) {
        rc = -ENOSPC;
    } else {
        int i = L;
        for (int k = P; k >= 1; k--) {
            int j = arg[(size_t)k * W + i];
            bal[k - 1] = i - j;
            i = j;
        }
        if (max_cost) *max_cost = dp[(size_t)P * W + L];
    }
    free(pre), free(pm), free(dp), free(arg);
    return rc;
}

int ps_balance_blockpartition(const double *cost, int L, int P, int *bal)
{
    if (P < 1 || P > L) return -EINVAL;
    double *x = malloc((size_t)L * sizeof(double));
    int *splits = malloc((size_t)P * sizeof(int));
    if (!x || !splits) {
        free(x), free(splits);
        return -ENOMEM;
    }
    double lo = cost[0], hi = cost[0];
    for (int i = 1; i < L; i++) {
        if (cost[i] < lo) lo = cost[i];
        if (cost[i] > hi) hi = cost[i];
    }
    double range = hi - lo;
    for (int i = 0; i < L; i++) x[i] = range == 0 ? 0 : (cost[i] - lo) / range;
    for (int p = 0; p < P - 1; p++) splits[p] = L / P * (p + 1);
    splits[P - 1] = L;
#define BLOCK(i, out)                                                                          \
    do {                                                                                       \
        int a_ = (i) > 0 ? splits[(i) - 1] : 0;                                                \
        double s_ = 0;                                                                         \
        for (int q_ = a_; q_ < splits[i]; q_++) s_ += x[q_];                                   \
        out = s_;                                                                              \
    } while (0)
    /* Python's max()/min() over (size, index) tuples: max takes the largest index among equal
       sizes, min the smallest. The cap guards against cycling, which the original does not. */
    for (long guard = 0; guard < 100000L * P; guard++) {
        double maxs = -1, b;
        int p = 0;
        for (int i = 0; i < P; i++) {
            BLOCK(i, b);
            if (b >= maxs) maxs = b, p = i;
        }
        bool restart = false;
        while (!restart && guard++ < 100000L * P) {
            double mins = DBL_MAX;
            int q = 0;
            for (int i = 0; i < P; i++) {
                BLOCK(i, b);
                if (b < mins) mins = b, q = i;
            }
            if (maxs <= mins + 1) goto done;
            int h;
            if (p < q) {
                h = q - 1;
                splits[h] -= 1;
            } else {
                h = q + 1;
                splits[q] += 1;
            }
            restart = p == h;
        }
    }
done:
#undef BLOCK
    for (int p = 0; p < P; p++) bal[p] = splits[p] - (p ? splits[p - 1] : 0);
    free(x), free(splits);
    return 0;
}
