/* test_exec: the CPU executor against PyTorch training runs (tests/golden/exec, made by
 * gen_exec.py), forward-only runs (ps_exec_opts.forward_only) against torchgpipe's GPipe and
 * fairscale's checkpoint_wrapper themselves (the same folder, cases_forward.txt), the BN update
 * log against SEMANTICS.md section 7's table, data loading and the state's save/load round trip.
 *
 * Errors vs PyTorch are normwise relative per tensor, max|got - want| / max|want| (as in
 * test_kernels): running statistics 1e-5, parameters 1e-4, loss 1e-5 (relative, per step),
 * num_batches_tracked exact. The largest error of each case is printed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "src/data.h"
#include "src/diag.h"
#include "src/analysis.h"
#include "src/engine.h"
#include "kernels/exec.h"
#include "sim/bnorder.h"
#include "sim/sim.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/npy.h"
#include "src/spec.h"
#include "src/schedule.h"

#define TOL_STATS 1e-5
#define TOL_PARAM 1e-4
#define TOL_LOSS 1e-5

static const char *root(void)
{
    const char *r = getenv("PS_SOURCE_ROOT");
    return r ? r : ".";
}

/* ---- a loaded spec with its model, graph and order ------------------------------------------ */

struct run {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *graph;
    struct ps_order order;
    struct ps_exec_result res;
};

static void fail_diag(const struct ps_diag *d)
{
    char buf[4096];
    fail_msg("%s", ps_diag_format(d, buf, sizeof(buf)));
}

static void build(struct run *r, struct ps_diag *d)
{
    if (ps_model_build(r->spec, &r->model, d)) fail_diag(d);
    struct ps_variant o;
    ps_variant_from_spec(r->spec, &o);
    if (ps_schedule_build(r->spec, r->model, &o, &r->graph, d)) fail_diag(d);
    if (ps_schedule_order(r->graph, &r->order, d)) fail_diag(d);
}

static void load_file(struct run *r, const char *path)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(r, 0, sizeof(*r));
    if (ps_spec_load(path, &r->spec, &d)) fail_diag(&d);
    build(r, &d);
}

static void load_str_in(struct run *r, const char *json, const char *dir)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(r, 0, sizeof(*r));
    if (ps_spec_parse(json, "test.json", dir, &r->spec, &d)) fail_diag(&d);
    build(r, &d);
}

static void load_str(struct run *r, const char *json) { load_str_in(r, json, "."); }

static void execute_mode(struct run *r, int steps, bool forward_only)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    o.steps = steps;
    o.forward_only = forward_only;
    if (ps_exec_run(r->graph, &r->order, &o, &r->res, &d)) fail_diag(&d);
}

static void execute(struct run *r, int steps) { execute_mode(r, steps, false); }

static void finish(struct run *r)
{
    ps_exec_result_finish(&r->res);
    ps_order_finish(&r->order);
    ps_graph_destroy(r->graph);
    ps_model_destroy(r->model);
    ps_spec_destroy(r->spec);
    memset(r, 0, sizeof(*r));
}

/* ---- goldens ------------------------------------------------------------------------------------ */

static double rel_err(const float *got, const float *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t k = 0; k < n; k++) {
        double e = fabs((double)got[k] - (double)want[k]);
        if (!(e <= num)) num = isnan(e) ? INFINITY : e;
        den = fmax(den, fabs((double)want[k]));
    }
    return den > 0 ? num / den : num;
}

struct golden_max {
    double stats, param, loss;
};

static void check_tensor(const char *dir, int layer, const char *name, const float *got,
                         int64_t n, double tol, double *maxe)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%.2000s/expected/%d.%s.npy", dir, layer, name);
    struct ps_npy a;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_npy_load(path, PS_NPY_F32, &a, &d)) fail_diag(&d);
    assert_int_equal((int64_t)a.numel, n);
    double e = rel_err(got, a.u.f32, a.numel);
    ps_npy_finish(&a);
    if (e > *maxe) *maxe = e;
    if (!(e <= tol)) fail_msg("%s: relative error %.3g > %.0e", path, e, tol);
}

/* One case of cases.txt (training) or cases_forward.txt (forward only: the parameters must come
 * back unchanged, the running statistics as PyTorch's, and the BN log must hold exactly one
 * entry per num_batches_tracked increment, since every case starts from 0). */
static void golden_case(const char *name, bool forward_only, struct golden_max *gm)
{
    char dir[PATH_MAX / 2], path[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/tests/golden/exec/cases/%s", root(), name);
    snprintf(path, sizeof(path), "%s/spec.json", dir);
    struct run r;
    load_file(&r, path);
    execute_mode(&r, 0, forward_only);
    memset(gm, 0, sizeof(*gm));
    for (int l = 0; l < r.spec->n_layers; l++) {
        const struct ps_layer_state *ls = &r.res.state.layers[l];
        if (ls->weight) check_tensor(dir, l, "weight", ls->weight, ls->n_weight, TOL_PARAM, &gm->param);
        if (ls->bias) check_tensor(dir, l, "bias", ls->bias, ls->n_bias, TOL_PARAM, &gm->param);
        if (ls->running_mean) {
            check_tensor(dir, l, "running_mean", ls->running_mean, ls->channels, TOL_STATS,
                         &gm->stats);
            check_tensor(dir, l, "running_var", ls->running_var, ls->channels, TOL_STATS,
                         &gm->stats);
            snprintf(path, sizeof(path), "%s/expected/%d.num_batches_tracked.npy", dir, l);
            struct ps_npy a;
            struct ps_diag d;
            ps_diag_clear(&d);
            if (ps_npy_load(path, PS_NPY_I64, &a, &d)) fail_diag(&d);
            if (a.u.i64[0] != ls->num_batches_tracked)
                fail_msg("%s: num_batches_tracked %lld, expected %lld", path,
                         (long long)ls->num_batches_tracked, (long long)a.u.i64[0]);
            int64_t logged = 0;
            for (uint32_t k = 0; k < r.res.n_bn; k++) logged += r.res.bn[k].layer == l;
            if (forward_only && logged != a.u.i64[0])
                fail_msg("%s: %lld BN updates logged, expected %lld", path, (long long)logged,
                         (long long)a.u.i64[0]);
            ps_npy_finish(&a);
        }
    }
    snprintf(path, sizeof(path), "%s/loss.npy", dir);
    struct ps_npy a;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_npy_load(path, PS_NPY_F32, &a, &d)) fail_diag(&d);
    assert_int_equal((int)a.numel, r.res.steps);
    for (int s = 0; s < r.res.steps; s++) {
        double e = fabs(r.res.loss[s] - a.u.f32[s]) / fmax(fabs((double)a.u.f32[s]), 1e-6);
        if (e > gm->loss) gm->loss = e;
        if (!(e <= TOL_LOSS))
            fail_msg("%s: step %d loss %.9g, expected %.9g", path, s, r.res.loss[s],
                     (double)a.u.f32[s]);
    }
    ps_npy_finish(&a);
    finish(&r);
}

static int golden_list(const char *list, bool forward_only)
{
    char path[PATH_MAX], line[256];
    snprintf(path, sizeof(path), "%s/tests/golden/exec/%s", root(), list);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    struct golden_max all = {0};
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) continue;
        struct golden_max gm;
        golden_case(line, forward_only, &gm);
        fprintf(stderr, "  %-30s max rel err: running stats %.2e, params %.2e, loss %.2e\n",
                line, gm.stats, gm.param, gm.loss);
        all.stats = fmax(all.stats, gm.stats);
        all.param = fmax(all.param, gm.param);
        all.loss = fmax(all.loss, gm.loss);
        n++;
    }
    fclose(f);
    fprintf(stderr, "  %d %s cases, worst: running stats %.2e, params %.2e, loss %.2e\n", n,
            list, all.stats, all.param, all.loss);
    return n;
}

static void test_goldens(void **state)
{
    (void)state;
    assert_true(golden_list("cases.txt", false) >= 18);
}

/* forward only (issue [bn-adaptation]): made by torchgpipe's GPipe and fairscale's
 * checkpoint_wrapper themselves, every policy x checkpoint mode */
static void test_goldens_forward_only(void **state)
{
    (void)state;
    assert_true(golden_list("cases_forward.txt", true) >= 21);
}

/* ---- BN update order, SEMANTICS.md section 7 ------------------------------------------------------ */

static const char *bn_spec(char *buf, size_t len, const char *ckpt, const char *policy, int batch)
{
    snprintf(buf, len,
             "{\"pipescope\": 1, \"name\": \"bn-order\", \"batch\": %d,"
             " \"model\": {\"input\": [6], \"layers\": ["
             "  {\"op\": \"linear\", \"out\": 5}, {\"op\": \"batchnorm\"}, {\"op\": \"relu\"},"
             "  {\"op\": \"linear\", \"out\": 4}, {\"op\": \"batchnorm\", \"momentum\": null},"
             "  {\"op\": \"dropout\", \"p\": 0.25}, {\"op\": \"linear\", \"out\": 3}],"
             "  \"loss\": \"cross_entropy\"},"
             " \"pipeline\": {\"balance\": [2, 3, 2], \"devices\": [\"cpu\", \"cpu\", \"cpu\"],"
             "  \"chunks\": 4, \"checkpoint\": \"%s\", \"batchnorm\": \"%s\"},"
             " \"data\": {\"source\": \"synthetic\", \"seed\": 7},"
             " \"train\": {\"steps\": 2, \"lr\": 0.05}}",
             batch, ckpt, policy);
    return buf;
}

/* expected: a string like "0f 1f 2f 3f 3r 2r 1r 0r" (mb, phase f|r|c) for ONE step */
static void check_order(const char *ckpt, const char *policy, const char *expected)
{
    char js[2048];
    struct run r;
    load_str(&r, bn_spec(js, sizeof(js), ckpt, policy, 16));
    execute(&r, 2);
    for (int layer = 1; layer <= 4; layer += 3) {
        for (int step = 0; step < 2; step++) {
            char got[256] = "";
            size_t o = 0;
            for (uint32_t k = 0; k < r.res.n_bn; k++) {
                const struct ps_exec_bn_update *u = &r.res.bn[k];
                if (u->layer != layer || u->step != step) continue;
                o += (size_t)snprintf(got + o, sizeof(got) - o, "%s%d%c", o ? " " : "", u->mb,
                                      "frc"[u->phase]);
            }
            if (strcmp(got, expected) != 0)
                fail_msg("%s/%s layer %d step %d: updates '%s', expected '%s'", ckpt, policy,
                         layer, step, got, expected);
        }
    }
    /* nbt counts the updates of the step (commits count once) */
    int per_step = 0;
    for (const char *p = expected; *p; p++) per_step += *p == 'f' || *p == 'r' || *p == 'c';
    assert_int_equal(r.res.state.layers[1].num_batches_tracked, 2 * per_step);
    finish(&r);
}

static void test_bn_order(void **state)
{
    (void)state;
    check_order("never", "plain", "0f 1f 2f 3f");
    check_order("always", "plain", "0f 1f 2f 3f 3r 2r 1r 0r");
    check_order("except_last", "plain", "0f 1f 2f 3f 2r 1r 0r");
    check_order("never", "deferred", "3c");
    check_order("always", "deferred", "3c");
    check_order("except_last", "deferred", "3c");
    check_order("never", "grad-only", "0f 1f 2f 3f");
    check_order("always", "grad-only", "3r 2r 1r 0r");
    check_order("except_last", "grad-only", "3f 2r 1r 0r");
}

/* the logged statistics are those of the micro-batch (plain: unbiased var), and a recompute
 * logs the same statistics as the forward of the same micro-batch */
static void test_bn_log_values(void **state)
{
    (void)state;
    char js[2048];
    struct run r;
    load_str(&r, bn_spec(js, sizeof(js), "always", "plain", 16));
    execute(&r, 1);
    assert_int_equal(r.res.n_bn, 16);
    for (uint32_t a = 0; a < r.res.n_bn; a++)
        for (uint32_t b = 0; b < r.res.n_bn; b++) {
            const struct ps_exec_bn_update *x = &r.res.bn[a], *y = &r.res.bn[b];
            if (x->layer != y->layer || x->mb != y->mb || x->phase != PS_EXEC_BN_FORWARD ||
                y->phase != PS_EXEC_BN_RECOMPUTE)
                continue;
            int C = x->layer == 1 ? 5 : 4;
            for (int c = 0; c < C; c++) {
                assert_float_equal(x->mean[c], y->mean[c], 0.0);
                assert_float_equal(x->var[c], y->var[c], 0.0);
            }
            assert_int_equal(x->count, 4);
        }
    finish(&r);
}

/* the model's numerics do not depend on checkpointing (plain BN: only running stats differ) */
static void test_checkpoint_invariance(void **state)
{
    (void)state;
    char js[2048];
    struct run a, b;
    load_str(&a, bn_spec(js, sizeof(js), "never", "plain", 16));
    load_str(&b, bn_spec(js, sizeof(js), "always", "plain", 16));
    execute(&a, 3);
    execute(&b, 3);
    for (int s = 0; s < 3; s++) assert_float_equal(a.res.loss[s], b.res.loss[s], 0.0);
    for (int l = 0; l < a.spec->n_layers; l++) {
        const struct ps_layer_state *x = &a.res.state.layers[l], *y = &b.res.state.layers[l];
        if (x->weight) assert_memory_equal(x->weight, y->weight, (size_t)x->n_weight * 4);
        if (x->bias) assert_memory_equal(x->bias, y->bias, (size_t)x->n_bias * 4);
    }
    /* the trace holds every F, B and R of the last step */
    assert_int_equal(a.res.trace.n, 2u * 4u * 3u);
    assert_int_equal(b.res.trace.n, 3u * 4u * 3u);
    for (uint32_t k = 0; k < b.res.trace.n; k++) assert_true(b.res.trace.r[k].dur_us >= 0.0);
    finish(&a);
    finish(&b);
}

/* ---- devices on threads (ps_exec_opts.device_threads) --------------------------------------- */

static void execute_threads(struct run *r, int steps, bool threads)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    assert_false(o.device_threads); /* serial by default */
    o.steps = steps;
    o.device_threads = threads;
    if (ps_exec_run(r->graph, &r->order, &o, &r->res, &d)) fail_diag(&d);
}

/* a spec file's text with its "devices" list removed: every partition on its own device */
static char *spec_own_devices(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    char *a = strstr(text, "\"devices\"");
    if (a) {
        char *b = strchr(a, ']');
        assert_non_null(b);
        b++;
        while (*b == ' ' || *b == '\n' || *b == ',') b++;
        memmove(a, b, strlen(b) + 1);
    }
    return text;
}

/* Threaded and serial runs give the same bits: loss, parameters, running statistics and the BN
 * log in the same order (layer, step, micro-batch, phase, node, values). */
static void same_bits(const struct run *a, const struct run *b)
{
    assert_int_equal(a->res.steps, b->res.steps);
    assert_memory_equal(a->res.loss, b->res.loss, (size_t)a->res.steps * sizeof(double));
    for (int l = 0; l < a->spec->n_layers; l++) {
        const struct ps_layer_state *x = &a->res.state.layers[l], *y = &b->res.state.layers[l];
        if (x->weight) assert_memory_equal(x->weight, y->weight, (size_t)x->n_weight * 4);
        if (x->bias) assert_memory_equal(x->bias, y->bias, (size_t)x->n_bias * 4);
        if (x->running_mean) {
            assert_memory_equal(x->running_mean, y->running_mean, (size_t)x->channels * 4);
            assert_memory_equal(x->running_var, y->running_var, (size_t)x->channels * 4);
            assert_int_equal(x->num_batches_tracked, y->num_batches_tracked);
        }
    }
    assert_int_equal(a->res.n_bn, b->res.n_bn);
    for (uint32_t k = 0; k < a->res.n_bn; k++) {
        const struct ps_exec_bn_update *u = &a->res.bn[k], *v = &b->res.bn[k];
        assert_int_equal(u->layer, v->layer);
        assert_int_equal(u->step, v->step);
        assert_int_equal(u->mb, v->mb);
        assert_int_equal(u->phase, v->phase);
        assert_int_equal(u->node, v->node);
        size_t C = (size_t)a->res.state.layers[u->layer].channels;
        assert_memory_equal(u->mean, v->mean, C * 4);
        assert_memory_equal(u->var, v->var, C * 4);
    }
    assert_int_equal(a->res.trace.n, b->res.trace.n);
}

static void test_device_threads(void **state)
{
    (void)state;
    char path[PATH_MAX], line[256];
    snprintf(path, sizeof(path), "%s/tests/golden/exec/cases.txt", root());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int cases = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) continue;
        char dir[PATH_MAX / 2];
        snprintf(dir, sizeof(dir), "%s/tests/golden/exec/cases/%s", root(), line);
        snprintf(path, sizeof(path), "%s/spec.json", dir);
        struct run a, b;
        load_str_in(&a, spec_own_devices(path), dir);
        load_str_in(&b, spec_own_devices(path), dir);
        assert_true(a.graph->n_devices >= 2);
        execute_threads(&a, 0, false);
        execute_threads(&b, 0, true);
        same_bits(&a, &b);
        finish(&a);
        finish(&b);
        cases++;
    }
    fclose(f);
    assert_true(cases >= 18);
    /* three devices, dropout, every checkpoint mode and BN policy, more steps */
    static const char *ck[] = {"never", "except_last", "always"};
    static const char *pol[] = {"plain", "deferred", "grad-only"};
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < 3; p++) {
            char js[2048];
            bn_spec(js, sizeof(js), ck[c], pol[p], 14);
            char *dv = strstr(js, " \"devices\"");
            char *end = strstr(dv, "],") + 2;
            memmove(dv, end, strlen(end) + 1);
            struct run a, b;
            load_str(&a, js);
            load_str(&b, js);
            assert_int_equal(a.graph->n_devices, 3);
            execute_threads(&a, 3, false);
            execute_threads(&b, 3, true);
            same_bits(&a, &b);
            finish(&a);
            finish(&b);
        }
}

/* ---- measured activation memory (exec_cpu.c M1-M4), worked by hand ---------------------------- */

/* linear(4->8), relu | linear(8->2), sum loss, batch 4 in 2 micro-batches of 2 samples, each
 * partition on its own device. Bytes per micro-batch: input 2*4*4 = 32, relu's input 2*8*4 = 64,
 * the second linear's input 64, the output 2*2*4 = 16 (gone once its loss is computed). */
static const char *mem_spec(char *buf, size_t len, const char *ckpt)
{
    snprintf(buf, len,
             "{\"pipescope\": 1, \"name\": \"mem\", \"batch\": 4,"
             " \"model\": {\"input\": [4], \"layers\": ["
             "  {\"op\": \"linear\", \"out\": 8}, {\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 2}],"
             "  \"loss\": \"sum\"},"
             " \"pipeline\": {\"balance\": [2, 1], \"chunks\": 2, \"checkpoint\": \"%s\"},"
             " \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": 2}}",
             ckpt);
    return buf;
}

static void check_memory(const char *ckpt, int64_t want0, int64_t want1, bool threads)
{
    char js[1024];
    struct run r;
    load_str(&r, mem_spec(js, sizeof(js), ckpt));
    execute_threads(&r, 2, threads);
    const struct ps_exec_memory *m = &r.res.mem;
    assert_int_equal(m->n_devices, 2);
    if (m->peak_bytes[0] != want0 || m->peak_bytes[1] != want1)
        fail_msg("checkpoint %s%s: peaks %lld, %lld bytes, expected %lld, %lld", ckpt,
                 threads ? " (threads)" : "", (long long)m->peak_bytes[0],
                 (long long)m->peak_bytes[1], (long long)want0, (long long)want1);
    /* the last step's series: time order, its maximum is the peak (both steps are alike), and
     * everything is freed by the end of the step */
    int64_t max[2] = {0, 0}, last[2] = {-1, -1};
    for (uint32_t k = 0; k < m->n_points; k++) {
        const struct ps_exec_mem_point *p = &m->points[k];
        assert_true(p->device == 0 || p->device == 1);
        if (k) assert_true(p->t_us >= m->points[k - 1].t_us);
        if (p->bytes > max[p->device]) max[p->device] = p->bytes;
        last[p->device] = p->bytes;
    }
    assert_int_equal(max[0], want0);
    assert_int_equal(max[1], want1);
    assert_int_equal(last[0], 0);
    assert_int_equal(last[1], 0);
    finish(&r);
}

static void test_memory_by_hand(void **state)
{
    (void)state;
    /* never: device 0 keeps input + relu input of both micro-batches, 2 * (32 + 64) = 192;
     * device 1 the second linear's inputs, 2 * 64, plus micro-batch 1's output while its
     * forward ends, 16: 144 */
    check_memory("never", 192, 144, false);
    check_memory("never", 192, 144, true);
    /* always: a checkpointed F keeps its input only, 32 on device 0 and 64 on device 1 per
     * micro-batch; R(i,0) rebuilds relu's input (64) and skips relu (its output is not read),
     * so device 0 peaks at 32 + 32 + 64 = 128; R(i,1) skips the linear it consists of, so
     * device 1 peaks during F(1,1): 64 + 64 + 16 = 144 */
    check_memory("always", 128, 144, false);
    check_memory("always", 128, 144, true);
}

/* The model (src/model.c "Activation memory", src/analysis.c along the order) equals the
 * executor's measured peak per device, byte for byte, in the serial mode: both follow the same
 * buffers in the same order (exec_cpu.c M1-M4 and the model's A1-A5 are one rule set, the
 * executor by allocating and freeing real buffers, the model by walking the layer table), so any
 * difference is a bug on one side. With device threads the interleaving of devices changes
 * when a partition's input arrives on the next device, so only the serial mode is exact.
 * Specs: conv/bn/relu/pool/flatten/linear in two partitions with uneven micro-batches (batch 5 in
 * 3), an MLP with dropout p > 0 and p = 0 in three partitions under 1F1B, the interleaved plan
 * (four stages on two devices), a model starting with layers without parameters, with a flatten
 * (a view) after a relu and at a partition's start; each under never, except_last and always. */
static void test_memory_matches_model(void **state)
{
    (void)state;
    static const char *const cases[] = {
        "\"batch\": 5, \"model\": {\"input\": [2, 6, 6], \"layers\": ["
        "{\"op\": \"conv2d\", \"out\": 3, \"kernel\": 3, \"padding\": 1}, {\"op\": \"batchnorm\"},"
        "{\"op\": \"relu\"}, {\"op\": \"conv2d\", \"out\": 4, \"kernel\": 3}, {\"op\": \"relu\"},"
        "{\"op\": \"maxpool2d\", \"kernel\": 2}, {\"op\": \"flatten\"}, {\"op\": \"linear\", \"out\": 3}],"
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [3, 5], \"chunks\": 3, \"checkpoint\": \"%s\"}",
        "\"batch\": 6, \"model\": {\"input\": [5], \"layers\": ["
        "{\"op\": \"linear\", \"out\": 7}, {\"op\": \"relu\"}, {\"op\": \"dropout\", \"p\": 0.3},"
        "{\"op\": \"linear\", \"out\": 6}, {\"op\": \"relu\"}, {\"op\": \"dropout\", \"p\": 0},"
        "{\"op\": \"linear\", \"out\": 2}], \"loss\": \"sum\"}, \"pipeline\": {\"schedule\": \"1f1b\","
        "\"balance\": [2, 3, 2], \"chunks\": 3, \"checkpoint\": \"%s\"}",
        "\"batch\": 8, \"model\": {\"input\": [6], \"layers\": ["
        "{\"op\": \"linear\", \"out\": 8}, {\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 8},"
        "{\"op\": \"batchnorm\"}, {\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 5},"
        "{\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 2}], \"loss\": \"sum\"},"
        "\"pipeline\": {\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2,"
        "\"balance\": [2, 2, 2, 2], \"chunks\": 4, \"checkpoint\": \"%s\"}",
        "\"batch\": 4, \"model\": {\"input\": [2, 4, 4], \"layers\": ["
        "{\"op\": \"relu\"}, {\"op\": \"maxpool2d\", \"kernel\": 2}, {\"op\": \"conv2d\", \"out\": 2,"
        "\"kernel\": 1}, {\"op\": \"relu\"}, {\"op\": \"flatten\"}, {\"op\": \"linear\", \"out\": 2}],"
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [2, 2, 2], \"chunks\": 2, \"checkpoint\": \"%s\"}",
        "\"batch\": 4, \"model\": {\"input\": [2, 4, 4], \"layers\": ["
        "{\"op\": \"relu\"}, {\"op\": \"maxpool2d\", \"kernel\": 2}, {\"op\": \"conv2d\", \"out\": 2,"
        "\"kernel\": 1}, {\"op\": \"relu\"}, {\"op\": \"flatten\"}, {\"op\": \"linear\", \"out\": 2}],"
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [2, 4], \"chunks\": 2, \"checkpoint\": \"%s\"}",
    };
    static const char *const ckpts[] = {"never", "except_last", "always"};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        for (size_t k = 0; k < 3; k++) {
            char body[2048], js[2600];
            snprintf(body, sizeof(body), cases[c], ckpts[k]);
            snprintf(js, sizeof(js),
                     "{\"pipescope\": 1, %s, \"data\": {\"source\": \"synthetic\", \"seed\": 1},"
                     " \"train\": {\"steps\": 1}}",
                     body);
            struct run r;
            load_str(&r, js);
            execute_threads(&r, 2, false);
            const struct ps_exec_memory *m = &r.res.mem;
            assert_int_equal(m->n_devices, r.graph->n_devices);
            struct ps_mem *sim = calloc((size_t)m->n_devices, sizeof(*sim));
            assert_non_null(sim);
            ps_analysis_memory(r.graph, &r.order, sim);
            for (int d = 0; d < m->n_devices; d++) {
                if (m->peak_bytes[d] != sim[d].peak_bytes || m->peak_bytes[d] <= 0)
                    fail_msg("case %zu, checkpoint %s, device %d: measured %lld bytes, model %lld",
                             c, ckpts[k], d, (long long)m->peak_bytes[d],
                             (long long)sim[d].peak_bytes);
            }
            free(sim);
            finish(&r);
        }
}

/* deferred with fewer real micro-batches than chunks: the commit waits for `chunks` tracked
 * micro-batches, across steps (torchgpipe's counter is module state) */
static void test_deferred_short(void **state)
{
    (void)state;
    char js[2048];
    struct run r;
    load_str(&r, bn_spec(js, sizeof(js), "never", "deferred", 6)); /* 2,2,2: m = 3 */
    assert_int_equal(r.spec->mb_count, 3);
    execute(&r, 4); /* 12 micro-batches tracked: commits at (step 1, mb 0), (2, 1), (3, 2) */
    int n = 0;
    for (uint32_t k = 0; k < r.res.n_bn; k++) {
        const struct ps_exec_bn_update *u = &r.res.bn[k];
        if (u->layer != 1) continue;
        assert_int_equal(u->phase, PS_EXEC_BN_COMMIT);
        assert_int_equal(u->step, n + 1);
        assert_int_equal(u->mb, n);
        assert_int_equal(u->count, 8);
        n++;
    }
    assert_int_equal(n, 3);
    finish(&r);
}

/* The simulator's BN update sequence for one iteration (sim/bnorder.c, what `simulate` prints)
 * against what the executor actually did in its first step, for every policy and checkpoint
 * mode, with full batches (16 and 12 in chunks 4: m = 4) and short ones where torchgpipe makes fewer
 * micro-batches than chunks (6 -> 2,2,2 and 9 -> 3,3,3: m = 3; a deferred BN then commits
 * nothing in the first step, as test_deferred_short shows over four steps). The executor's log
 * is the truth here: it runs the BN kernels and counts what they committed. */
static void test_bn_order_sim_vs_exec(void **state)
{
    (void)state;
    const char *ckpts[] = {"never", "except_last", "always"};
    const char *pols[] = {"plain", "deferred", "grad-only"};
    const int batches[] = {16, 6, 9, 12};
    int compared = 0;
    for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++)
        for (int ci = 0; ci < 3; ci++)
            for (int pi = 0; pi < 3; pi++) {
                char js[2048];
                struct run r;
                load_str(&r, bn_spec(js, sizeof(js), ckpts[ci], pols[pi], batches[bi]));
                execute(&r, 1);
                /* simulate the same graph and order (unit costs, launch 1) */
                double *cost = calloc(r.graph->n_nodes + 1, sizeof(double));
                for (uint32_t v = 0; v < r.graph->n_nodes; v++)
                    cost[v] = ps_node_is_task(&r.graph->nodes[v]) ? 1 : 0;
                struct ps_sim_opts so = {.launch_us = 1};
                struct ps_sim sim;
                struct ps_diag d;
                ps_diag_clear(&d);
                if (ps_sim_run(r.graph, &r.order, cost, &so, &sim, &d)) fail_diag(&d);
                struct ps_bn_order b;
                assert_int_equal(
                    ps_bn_order_build(r.graph, &r.order, sim.start_us, r.spec->batchnorm, &b), 0);
                assert_int_equal(b.n_layers, 2);
                for (int k = 0; k < b.n_layers; k++) {
                    char want[256] = "", got[256] = "";
                    size_t o = 0;
                    for (uint32_t q = 0; q < r.res.n_bn; q++) {
                        const struct ps_exec_bn_update *u = &r.res.bn[q];
                        if (u->layer != b.layers[k].layer || u->step != 0) continue;
                        o += (size_t)snprintf(want + o, sizeof(want) - o, "%s%d%c", o ? " " : "",
                                              u->mb, "frc"[u->phase]);
                    }
                    o = 0;
                    for (uint32_t q = 0; q < b.layers[k].n; q++) {
                        const struct ps_bn_update *u = &b.layers[k].u[q];
                        char ph = u->pooled ? 'c' : u->phase == PS_BN_RECOMPUTE ? 'r' : 'f';
                        o += (size_t)snprintf(got + o, sizeof(got) - o, "%s%d%c", o ? " " : "",
                                              u->mb, ph);
                    }
                    if (strcmp(got, want) != 0)
                        fail_msg("batch %d, %s/%s, layer %d: simulated '%s', executor '%s'",
                                 batches[bi], ckpts[ci], pols[pi], b.layers[k].layer, got, want);
                    compared++;
                }
                ps_bn_order_finish(&b);
                ps_sim_finish(&sim);
                free(cost);
                finish(&r);
            }
    assert_int_equal(compared, 4 * 3 * 3 * 2);
}

/* ---- state save / load -------------------------------------------------------------------------- */

static void rm_rf(const char *dir)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_state_roundtrip(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/ps_exec_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char dir[256], js[4096];
    snprintf(dir, sizeof(dir), "%s/state", tmpl);
    struct run a, b;
    load_str(&a, bn_spec(js, sizeof(js), "except_last", "plain", 16));
    execute(&a, 2);
    struct ps_diag d;
    ps_diag_clear(&d);
    /* into an existing folder (the CLI gives the twin of --save-state DIR, viz/out.c) */
    assert_int_equal(mkdir(dir, 0755), 0);
    if (ps_state_save(&a.res.state, a.spec, a.model, dir, &d)) fail_diag(&d);
    /* saving again rewrites the same files */
    if (ps_state_save(&a.res.state, a.spec, a.model, dir, &d)) fail_diag(&d);
    struct stat sb;
    char p[PATH_MAX + 32];
    snprintf(p, sizeof(p), "%s/4.num_batches_tracked.npy", dir);
    assert_int_equal(stat(p, &sb), 0);
    /* load it back through a spec with model.weights */
    char *spec_js = strdup(bn_spec(js, sizeof(js), "except_last", "plain", 16));
    char *w = strstr(spec_js, "\"loss\"");
    assert_non_null(w);
    snprintf(js, sizeof(js), "%.*s\"weights\": \"%s\", %s", (int)(w - spec_js), spec_js, dir, w);
    free(spec_js);
    memset(&b, 0, sizeof(b));
    ps_diag_clear(&d);
    if (ps_spec_parse(js, "rt.json", tmpl, &b.spec, &d)) fail_diag(&d);
    build(&b, &d);
    struct ps_state st;
    if (ps_state_init(&st, b.spec, b.model, 99, &d)) fail_diag(&d);
    for (int l = 0; l < st.n_layers; l++) {
        const struct ps_layer_state *x = &a.res.state.layers[l], *y = &st.layers[l];
        if (x->weight) assert_memory_equal(x->weight, y->weight, (size_t)x->n_weight * 4);
        if (x->running_var) {
            assert_memory_equal(x->running_var, y->running_var, (size_t)x->channels * 4);
            assert_int_equal(x->num_batches_tracked, y->num_batches_tracked);
        }
    }
    ps_state_finish(&st);
    /* a missing file names itself */
    snprintf(p, sizeof(p), "%s/3.bias.npy", dir);
    assert_int_equal(unlink(p), 0);
    ps_diag_clear(&d);
    assert_int_equal(ps_state_init(&st, b.spec, b.model, 99, &d), -ENOENT);
    assert_non_null(strstr(d.where, "3.bias.npy"));
    finish(&a);
    finish(&b);
    rm_rf(tmpl);
}

/* seeded init: PyTorch's bounds, reproducible */
static void test_state_init(void **state)
{
    (void)state;
    char js[2048];
    struct run r;
    load_str(&r, bn_spec(js, sizeof(js), "never", "plain", 16));
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_state a, b;
    if (ps_state_init(&a, r.spec, r.model, 5, &d)) fail_diag(&d);
    if (ps_state_init(&b, r.spec, r.model, 5, &d)) fail_diag(&d);
    const struct ps_layer_state *l0 = &a.layers[0];
    assert_int_equal(l0->n_weight, 30);
    double bound = 1.0 / sqrt(6.0), mx = 0;
    for (int k = 0; k < 30; k++) {
        assert_true(fabs(l0->weight[k]) <= bound);
        mx = fmax(mx, fabs(l0->weight[k]));
    }
    assert_true(mx > 0.5 * bound);
    assert_memory_equal(a.layers[3].weight, b.layers[3].weight, 20 * 4);
    assert_float_equal(a.layers[1].weight[0], 1.0, 0.0);
    assert_float_equal(a.layers[1].running_var[2], 1.0, 0.0);
    assert_float_equal(a.layers[1].running_mean[2], 0.0, 0.0);
    ps_state_finish(&a);
    ps_state_finish(&b);
    finish(&r);
}

/* ---- data ------------------------------------------------------------------------------------- */

static void test_data_csv(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/ps_csv_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char path[PATH_MAX], js[4096];
    snprintf(path, sizeof(path), "%s/d.csv.gz", tmpl);
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    gzprintf(f, "a,b,c,label\n");
    for (int k = 0; k < 5; k++) gzprintf(f, "%d,%d.5,%d,%d\n", k, k, -k, k % 3);
    gzclose(f);
    snprintf(js, sizeof(js),
             "{\"pipescope\": 1, \"batch\": 4, \"model\": {\"input\": [3], \"layers\": ["
             "{\"op\": \"linear\", \"out\": 3}], \"loss\": \"cross_entropy\"},"
             " \"pipeline\": {\"balance\": [1], \"chunks\": 2},"
             " \"data\": {\"source\": \"csv\", \"path\": \"d.csv.gz\", \"target_column\": -1}}");
    struct run r;
    memset(&r, 0, sizeof(r));
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_spec_parse(js, "csv.json", tmpl, &r.spec, &d)) fail_diag(&d);
    build(&r, &d);
    struct ps_data dt;
    if (ps_data_load(r.spec, r.model, 0, &dt, &d)) fail_diag(&d);
    assert_int_equal(dt.n_samples, 5);
    assert_float_equal(dt.x[3 * 3 + 1], 3.5, 0.0);
    assert_int_equal(dt.labels[4], 1);
    float x[12];
    int64_t lab[4];
    ps_data_batch(&dt, 1, 4, x, lab, NULL); /* samples 4, 0, 1, 2 */
    assert_int_equal(lab[0], 1);
    assert_float_equal(x[3], 0.0, 0.0);
    ps_data_finish(&dt);
    execute(&r, 2);
    assert_true(isfinite(r.res.loss[1]));
    finish(&r);
    /* an out-of-range label names the row */
    f = gzopen(path, "wb");
    gzprintf(f, "1,2,3,0\n1,2,3,7\n");
    gzclose(f);
    memset(&r, 0, sizeof(r));
    if (ps_spec_parse(js, "csv.json", tmpl, &r.spec, &d)) fail_diag(&d);
    build(&r, &d);
    ps_diag_clear(&d);
    assert_int_equal(ps_data_load(r.spec, r.model, 0, &dt, &d), -EINVAL);
    assert_non_null(strstr(d.where, "d.csv.gz:2"));
    finish(&r);
    rm_rf(tmpl);
}

static void test_data_synthetic(void **state)
{
    (void)state;
    char js[2048];
    struct run r;
    load_str(&r, bn_spec(js, sizeof(js), "never", "plain", 16));
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_data a, b;
    if (ps_data_load(r.spec, r.model, 64, &a, &d)) fail_diag(&d);
    if (ps_data_load(r.spec, r.model, 32, &b, &d)) fail_diag(&d);
    /* drawn on request: nothing stored but the labels */
    assert_true(a.synthetic && !a.x && !a.rows && a.labels);
    static float ax[64 * 6], bx[32 * 6], wx[4 * 6];
    ps_data_rows(&a, 0, 64, ax, NULL, NULL);
    ps_data_rows(&b, 0, 32, bx, NULL, NULL);
    assert_memory_equal(ax, bx, 32 * 6 * sizeof(float)); /* sample k never depends on S */
    ps_data_rows(&b, 31, 2, wx, NULL, NULL);                /* samples 31 and 0: wrapping */
    assert_memory_equal(wx, bx + 31 * 6, 6 * sizeof(float));
    assert_memory_equal(wx + 6, bx, 6 * sizeof(float));
    int64_t lab[4];
    ps_data_batch(&a, 3, 4, wx, lab, NULL); /* samples 12..15, drawn again: the same */
    assert_memory_equal(wx, ax + 12 * 6, 4 * 6 * sizeof(float));
    assert_true(lab[0] == a.labels[12] && lab[3] == a.labels[15]);
    double s = 0, q = 0;
    for (int k = 0; k < 64 * 6; k++) {
        s += ax[k];
        q += (double)ax[k] * ax[k];
    }
    s /= 384;
    q = q / 384 - s * s;
    assert_true(fabs(s) < 0.2 && fabs(q - 1.0) < 0.25);
    for (int k = 0; k < 64; k++) assert_true(a.labels[k] >= 0 && a.labels[k] < 3);
    ps_data_finish(&a);
    ps_data_finish(&b);
    finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_goldens_forward_only),
        cmocka_unit_test(test_bn_order),
        cmocka_unit_test(test_bn_log_values),
        cmocka_unit_test(test_checkpoint_invariance),
        cmocka_unit_test(test_deferred_short),
        cmocka_unit_test(test_bn_order_sim_vs_exec),
        cmocka_unit_test(test_device_threads),
        cmocka_unit_test(test_memory_by_hand),
        cmocka_unit_test(test_memory_matches_model),
        cmocka_unit_test(test_state_roundtrip),
        cmocka_unit_test(test_state_init),
        cmocka_unit_test(test_data_csv),
        cmocka_unit_test(test_data_synthetic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
