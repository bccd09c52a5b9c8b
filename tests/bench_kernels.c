/* Benchmark (meson benchmark 'kernels', figures only, nothing asserted on time): the CPU
 * kernels on unet-timeline's large layers (micro-batch of 2 samples at 192x192 and 96x96),
 * one thread and the default thread count. Per case: CPU seconds per call (the process's
 * CPU time, so a busy shared machine inflates it less than wall time), and GFLOP/s of wall
 * time for the convolution's multiply-adds (2*c_in*k*k*c_out*P per sample).
 *
 *     bench_kernels [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/kernels.h"

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *filled(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof(float));
    if (!p) exit(1);
    for (size_t i = 0; i < n; i++) p[i] = (float)ps_cpu_rng_uniform(seed, 0, i) - 0.5f;
    return p;
}

static void conv_case(size_t n, size_t cin, size_t cout, size_t hw, int reps)
{
    struct ps_conv2d_shape s = {n, cin, hw, hw, cout, 3, 3, 1, 1};
    size_t in = n * cin * hw * hw, out = n * cout * hw * hw;
    float *x = filled(in, 1), *w = filled(cout * cin * 9, 2), *b = filled(cout, 3);
    float *y = malloc(out * sizeof(float)), *dx = malloc(in * sizeof(float));
    float *dw = calloc(cout * cin * 9, sizeof(float)), *db = calloc(cout, sizeof(float));
    if (!y || !dx || !dw || !db) exit(1);
    double flop = 2.0 * (double)(n * cin * 9 * cout * hw * hw);
    for (int pass = 0; pass < 2; pass++) {
        double w0 = wall(), c0 = cpu();
        for (int r = 0; r < reps; r++) ps_cpu_conv2d_forward(&s, x, w, b, y, NULL);
        double wf = (wall() - w0) / reps, cf = (cpu() - c0) / reps;
        w0 = wall();
        c0 = cpu();
        for (int r = 0; r < reps; r++) ps_cpu_conv2d_backward(&s, x, w, y, dx, dw, db, NULL);
        double wb = (wall() - w0) / reps, cb = (cpu() - c0) / reps;
        if (pass == 1)
            printf("conv3x3 n=%zu %4zu->%-4zu %3zux%-3zu threads %2d  fwd %7.1f ms cpu %7.1f ms "
                   "%6.1f GFLOP/s   bwd %7.1f ms cpu %7.1f ms %6.1f GFLOP/s\n",
                   n, cin, cout, hw, hw, ps_cpu_threads(), wf * 1e3, cf * 1e3, flop / wf * 1e-9,
                   wb * 1e3, cb * 1e3, 2 * flop / wb * 1e-9);
    }
    free(x), free(w), free(b), free(y), free(dx), free(dw), free(db);
}

static void gemm_case(size_t m, size_t n, size_t k, bool ta, bool tb, int reps)
{
    float *a = filled(m * k, 4), *b = filled(k * n, 5), *c = malloc(m * n * sizeof(float));
    if (!c) exit(1);
    double w0 = wall(), c0 = cpu();
    for (int r = 0; r < reps; r++)
        ps_cpu_sgemm(ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n);
    double wt = (wall() - w0) / reps, ct = (cpu() - c0) / reps;
    printf("sgemm %5zux%-6zux%-5zu ta=%d tb=%d threads %2d  %7.1f ms cpu %7.1f ms %6.1f GFLOP/s\n",
           m, n, k, ta, tb, ps_cpu_threads(), wt * 1e3, ct * 1e3, 2.0 * (double)(m * n * k) / wt * 1e-9);
    free(a), free(b), free(c);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 2;
    if (reps < 1) reps = 1;
    for (int t = 1; t >= 0; t--) {
        ps_cpu_set_threads(t); /* 1, then the default */
        gemm_case(64, 36864, 576, false, false, reps);  /* conv 64->64 at 192x192 forward */
        gemm_case(64, 576, 36864, false, true, reps);   /* its weight gradient */
        gemm_case(576, 36864, 64, true, false, reps);   /* its input gradient (dcol) */
        conv_case(2, 64, 64, 192, reps);
        conv_case(2, 256, 256, 48, reps);
        conv_case(2, 1024, 1024, 12, reps);
    }
    return 0;
}
