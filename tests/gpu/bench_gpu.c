/* bench_gpu: figures for the CUDA backend (meson benchmark 'gpu'; prints, never asserts).
 *
 *   1. BatchNorm kernels on a large activation ([256,256,56,56] fp32 by default, 822 MB): time
 *      per call (CUDA events, median of 20), bytes moved (forward: x read twice for the
 *      statistics and the normalisation, y written once = 12 B/element; backward: x and dy read
 *      twice, dx written = 20 B/element) and the fraction of the H200's 4.8 TB/s; a device-to-
 *      device memcpy of the same size is printed as the achievable reference.
 *   2. A pipeline run (conv/BN/ReLU stages, 4 partitions, 8 micro-batches) on the cuda executor:
 *      median time per iteration without tracing, the traced iteration, the CUPTI overhead,
 *      records and dropped records.
 * Exit 77 (skip) without a device. Options: bench_gpu [N C H W] [steps].
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "src/diag.h"
#include "src/engine.h"
#include "kernels/exec.h"
#include "kernels/exec_cuda.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/schedule.h"

#define H200_PEAK 4.8e12

static int die(const struct ps_diag *d)
{
    char buf[2048];
    fprintf(stderr, "bench_gpu: %s\n", ps_diag_format(d, buf, sizeof(buf)));
    return 1;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { REPS = 20 };

static int call(int what, struct ps_cuda_bn *bn, float *x, float *y, float *dy, float *dx,
                float *sm, float *si, float *dw, float *db, size_t n, size_t S, size_t bytes,
                ps_cuda_stream s, struct ps_diag *d)
{
    if (what == 0) return ps_cuda_bn_forward(bn, 0, x, y, n, S, sm, si, NULL, NULL, s, d);
    if (what == 1) return ps_cuda_bn_backward(bn, true, x, dy, sm, si, dx, dw, db, n, S, s, d);
    return ps_cuda_memcpy_d2d(y, x, bytes, s, d);
}

/* Median milliseconds of REPS calls of `what` (0 bn fwd train, 1 bn bwd, 2 memcpy), after 3
 * warm-up calls. The REPS calls are enqueued back to back, each between its own pair of timing
 * events, and the host waits only at the end: the GPU never idles between calls, so no host
 * launch latency falls inside an event pair. */
static int timed(int what, struct ps_cuda_bn *bn, float *x, float *y, float *dy, float *dx,
                 float *sm, float *si, float *dw, float *db, size_t n, size_t S,
                 size_t bytes, ps_cuda_stream s, double *ms_out, struct ps_diag *d)
{
    ps_cuda_event a[REPS] = {NULL}, b[REPS] = {NULL};
    float ms[REPS];
    int rc = 0;
    for (int r = 0; r < REPS && !rc; r++) {
        rc = ps_cuda_event_create(&a[r], true, d);
        if (!rc) rc = ps_cuda_event_create(&b[r], true, d);
    }
    for (int r = 0; r < 3 && !rc; r++)
        rc = call(what, bn, x, y, dy, dx, sm, si, dw, db, n, S, bytes, s, d);
    if (!rc) rc = ps_cuda_stream_sync(s, d);
    for (int r = 0; r < REPS && !rc; r++) {
        rc = ps_cuda_event_record(a[r], s, d);
        if (!rc) rc = call(what, bn, x, y, dy, dx, sm, si, dw, db, n, S, bytes, s, d);
        if (!rc) rc = ps_cuda_event_record(b[r], s, d);
    }
    if (!rc) rc = ps_cuda_stream_sync(s, d);
    if (!rc) rc = ps_cuda_check("bench kernels", d);
    for (int r = 0; r < REPS && !rc; r++) rc = ps_cuda_event_elapsed_ms(a[r], b[r], &ms[r], d);
    for (int r = 0; r < REPS; r++) {
        ps_cuda_event_destroy(a[r]);
        ps_cuda_event_destroy(b[r]);
    }
    if (rc) return rc;
    qsort(ms, REPS, sizeof(float), cmp_f);
    *ms_out = ms[REPS / 2];
    return 0;
}

static int bench_bn(size_t N, size_t C, size_t H, size_t W, double peak, struct ps_diag *d)
{
    size_t S = H * W, cnt = N * C * S, bytes = cnt * sizeof(float);
    float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL, *sm = NULL, *si = NULL, *w = NULL,
          *bb = NULL, *rm = NULL, *rv = NULL, *dw = NULL, *db = NULL;
    double *part = NULL;
    ps_cuda_stream s = NULL;
    int rc = ps_cuda_stream_create(&s, d);
    if (!rc) rc = ps_cuda_malloc((void **)&x, bytes, d);
    if (!rc) rc = ps_cuda_malloc((void **)&y, bytes, d);
    if (!rc) rc = ps_cuda_malloc((void **)&dy, bytes, d);
    if (!rc) rc = ps_cuda_malloc((void **)&dx, bytes, d);
    float *cbufs[8] = {NULL};
    for (int k = 0; k < 8 && !rc; k++) {
        rc = ps_cuda_malloc((void **)&cbufs[k], C * sizeof(float), d);
        if (!rc) rc = ps_cuda_memset(cbufs[k], 0, C * sizeof(float), s, d);
    }
    if (!rc) {
        sm = cbufs[0], si = cbufs[1], w = cbufs[2], bb = cbufs[3];
        rm = cbufs[4], rv = cbufs[5], dw = cbufs[6], db = cbufs[7];
        rc = ps_cuda_malloc((void **)&part, ps_cuda_bn_scratch(C, N, S), d);
    }
    /* any finite contents will do: 0x3c (a float near 0.0115) */
    if (!rc) rc = ps_cuda_memset(x, 0x3c, bytes, s, d);
    if (!rc) rc = ps_cuda_memset(dy, 0x3b, bytes, s, d);
    struct ps_cuda_bn bn = {.channels = C, .eps = 1e-5f, .momentum = 0.1f, .weight = w,
                            .bias = bb, .running_mean = rm, .running_var = rv, .partial = part};
    double f_ms = 0, b_ms = 0, c_ms = 0;
    if (!rc) rc = timed(0, &bn, x, y, dy, dx, sm, si, dw, db, N, S, bytes, s, &f_ms, d);
    if (!rc) rc = timed(1, &bn, x, y, dy, dx, sm, si, dw, db, N, S, bytes, s, &b_ms, d);
    if (!rc) rc = timed(2, &bn, x, y, dy, dx, sm, si, dw, db, N, S, bytes, s, &c_ms, d);
    if (!rc) {
        double fb = 12.0 * (double)cnt, bb_ = 20.0 * (double)cnt, cb = 2.0 * (double)bytes;
        printf("batchnorm [%zu,%zu,%zu,%zu] fp32, %.0f MB per tensor\n", N, C, H, W,
               (double)bytes / 1e6);
        printf("  forward (train)   %8.3f ms  %7.1f GB/s  %5.1f%% of 4.8 TB/s  (12 B/elem: "
               "stats read, normalise read+write)\n",
               f_ms, fb / (f_ms * 1e-3) / 1e9, 100.0 * fb / (f_ms * 1e-3) / H200_PEAK);
        printf("  backward          %8.3f ms  %7.1f GB/s  %5.1f%% of 4.8 TB/s  (20 B/elem)\n",
               b_ms, bb_ / (b_ms * 1e-3) / 1e9, 100.0 * bb_ / (b_ms * 1e-3) / H200_PEAK);
        printf("  memcpy d2d (ref)  %8.3f ms  %7.1f GB/s  %5.1f%% of 4.8 TB/s\n", c_ms,
               cb / (c_ms * 1e-3) / 1e9, 100.0 * cb / (c_ms * 1e-3) / H200_PEAK);
        if (peak > 0)
            printf("  (device-reported peak from clock x bus width: %.2f TB/s)\n", peak / 1e12);
    }
    ps_cuda_free(x);
    ps_cuda_free(y);
    ps_cuda_free(dy);
    ps_cuda_free(dx);
    for (int k = 0; k < 8; k++) ps_cuda_free(cbufs[k]);
    ps_cuda_free(part);
    ps_cuda_stream_destroy(s);
    return rc;
}

static const char *pipeline_spec =
    "{\"pipescope\": 1, \"name\": \"bench\", \"batch\": 128,"
    " \"model\": {\"input\": [64, 56, 56], \"layers\": ["
    "  {\"op\": \"conv2d\", \"out\": 64, \"kernel\": 3, \"padding\": 1}, {\"op\": \"batchnorm\"},"
    "  {\"op\": \"relu\"},"
    "  {\"op\": \"conv2d\", \"out\": 64, \"kernel\": 3, \"padding\": 1}, {\"op\": \"batchnorm\"},"
    "  {\"op\": \"relu\"},"
    "  {\"op\": \"conv2d\", \"out\": 128, \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
    "  {\"op\": \"batchnorm\"}, {\"op\": \"relu\"},"
    "  {\"op\": \"conv2d\", \"out\": 128, \"kernel\": 3, \"padding\": 1}, {\"op\": \"batchnorm\"},"
    "  {\"op\": \"relu\"}, {\"op\": \"maxpool2d\", \"kernel\": 4}, {\"op\": \"flatten\"},"
    "  {\"op\": \"linear\", \"out\": 10}], \"loss\": \"cross_entropy\"},"
    " \"pipeline\": {\"balance\": [3, 3, 3, 6], \"chunks\": 8, \"checkpoint\": \"except_last\","
    "  \"batchnorm\": \"plain\"},"
    " \"data\": {\"source\": \"synthetic\", \"seed\": 1},"
    " \"train\": {\"steps\": %d, \"lr\": 0.01}}";

static int bench_pipeline(int steps, int gpus, struct ps_diag *d)
{
    char js[4096];
    snprintf(js, sizeof(js), pipeline_spec, steps);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_graph *g = NULL;
    struct ps_order order;
    memset(&order, 0, sizeof(order));
    int rc = ps_spec_parse(js, "bench.json", ".", &spec, d);
    if (!rc) rc = ps_model_build(spec, &model, d);
    struct ps_variant go;
    if (!rc) {
        ps_variant_from_spec(spec, &go);
        rc = ps_schedule_build(spec, model, &go, &g, d);
    }
    if (!rc) rc = ps_schedule_order(g, &order, d);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    o.backend = PS_BACKEND_CUDA;
    o.steps = steps;
    struct ps_exec_cuda_opts co = {.virtual_devices = spec && gpus < spec->n_devices};
    struct ps_exec_result plain, traced;
    struct ps_exec_cuda_stats st0, st1;
    memset(&plain, 0, sizeof(plain));
    memset(&traced, 0, sizeof(traced));
    o.trace = false;
    if (!rc) rc = ps_exec_cuda_run(g, &order, &o, &co, &plain, &st0, d);
    o.trace = true;
    if (!rc) rc = ps_exec_cuda_run(g, &order, &o, &co, &traced, &st1, d);
    if (!rc) {
        double *t = malloc((size_t)steps * sizeof(double));
        int k = 0;
        for (int s = 1; s < steps; s++) t[k++] = plain.step_us[s]; /* step 0 warms up */
        qsort(t, (size_t)k, sizeof(double), cmp_d);
        double med = k ? t[k / 2] : plain.step_us[0];
        double tr = traced.step_us[steps - 1];
        double untr_last = plain.step_us[steps - 1];
        printf("pipeline: batch %lld, %d partitions, %d micro-batches, %s, %u nodes\n",
               (long long)spec->batch, spec->n_partitions, spec->mb_count,
               co.virtual_devices ? "virtual devices on GPU 0" : "one GPU per partition",
               g->n_nodes);
        printf("  events %u, stream waits per step %u\n", st0.events, st0.waits);
        printf("  time per iteration (median of %d, no tracing)  %10.1f us\n", k, med);
        printf("  traced iteration (CUPTI on, incl. flush)        %10.1f us\n", tr);
        printf("  CUPTI overhead vs median                        %+9.1f %%\n",
               100.0 * (tr - med) / med);
        printf("  (same step untraced in the first run            %10.1f us)\n", untr_last);
        printf("  measured makespan of the traced step (trace)    %10.1f us\n",
               ps_trace_makespan(&traced.trace));
        printf("  CUPTI records %llu, dropped %llu, unmapped %llu, without timestamps %llu, "
               "trace records %u\n",
               (unsigned long long)st1.cupti_records, (unsigned long long)st1.dropped,
               (unsigned long long)st1.unmapped, (unsigned long long)st1.no_time,
               traced.trace.n);
        printf("  loss: first %.6g last %.6g\n", plain.loss[0], plain.loss[steps - 1]);
        free(t);
    }
    ps_exec_result_finish(&plain);
    ps_exec_result_finish(&traced);
    ps_order_finish(&order);
    ps_graph_destroy(g);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return rc;
}

int main(int argc, char **argv)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    int gpus = 0;
    if (ps_cuda_probe(&gpus, &d)) {
        char buf[1200];
        printf("bench_gpu: skipped: %s\n", ps_diag_format(&d, buf, sizeof(buf)));
        return 77;
    }
    size_t N = 256, C = 256, H = 56, W = 56;
    int steps = 10;
    if (argc >= 5) {
        N = strtoul(argv[1], NULL, 10);
        C = strtoul(argv[2], NULL, 10);
        H = strtoul(argv[3], NULL, 10);
        W = strtoul(argv[4], NULL, 10);
    }
    if (argc >= 6) steps = atoi(argv[5]);
    if (steps < 2) steps = 2;
    char name[256];
    double peak = 0;
    int sms = 0;
    if (ps_cuda_set_device(0, &d) || ps_cuda_device_info(0, name, sizeof(name), &peak, &sms, &d))
        return die(&d);
    printf("device: %s, %d GPU%s\n", name, gpus, gpus == 1 ? "" : "s");
    if (bench_bn(N, C, H, W, peak, &d)) return die(&d);
    if (bench_pipeline(steps, gpus, &d)) return die(&d);
    return 0;
}
