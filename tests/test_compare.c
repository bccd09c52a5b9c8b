/* test_compare: trace reader (corpus of bad traces with exact error lines), alignment by id and
 * by name, order inversions and dependency violations on hand-made traces, tolerance parsing and
 * exit logic, calibration recovering known costs from a synthetic trace (an independent truth:
 * costs chosen here, timeline from the simulator), and the PyTorch profiler golden trace.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "src/compare.h"
#include "sim/cost.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "sim/sim.h"
#include "src/spec.h"
#include "src/trace_read.h"
#include "src/schedule.h"
#include "sim/calibrate.h"

#define assert_rel(a, b, eps)                                                                 \
    do {                                                                                       \
        double x_ = (a), y_ = (b);                                                             \
        if (!(fabs(x_ - y_) <= (eps) * fmax(fabs(y_), 1e-300))) {                              \
            print_error("%.17g != %.17g (rel %.3g)\n", x_, y_, fabs(x_ - y_) / fabs(y_));      \
            fail();                                                                            \
        }                                                                                      \
    } while (0)

struct fx {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *g;
    struct ps_order o;
};

static void fx_parse(struct fx *f, const char *json)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(f, 0, sizeof(*f));
    assert_int_equal(ps_spec_parse(json, "t.json", ".", &f->spec, &d), 0);
    assert_int_equal(ps_model_build(f->spec, &f->model, &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f->spec, &o);
    assert_int_equal(ps_schedule_build(f->spec, f->model, &o, &f->g, &d), 0);
    assert_int_equal(ps_schedule_order(f->g, &f->o, &d), 0);
}

static void fx_file(struct fx *f, const char *rel)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", root ? root : "..", rel);
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(f, 0, sizeof(*f));
    assert_int_equal(ps_spec_load(path, &f->spec, &d), 0);
    assert_int_equal(ps_model_build(f->spec, &f->model, &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f->spec, &o);
    assert_int_equal(ps_schedule_build(f->spec, f->model, &o, &f->g, &d), 0);
    assert_int_equal(ps_schedule_order(f->g, &f->o, &d), 0);
}

static void fx_free(struct fx *f)
{
    ps_order_finish(&f->o);
    ps_graph_destroy(f->g);
    ps_model_destroy(f->model);
    ps_spec_destroy(f->spec);
}

/* simulate with roofline costs (or `c`) */
static void simulate(const struct fx *f, const struct ps_costs *c, struct ps_sim *s)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    double *cost = malloc(f->g->n_nodes * sizeof(double));
    assert_int_equal(ps_cost_fill(f->g, c, cost, &d), 0);
    struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(f->g, c)};
    assert_int_equal(ps_sim_run(f->g, &f->o, cost, &so, s, &d), 0);
    free(cost);
}

static const char *SMALL =
    "{\"pipescope\":1,\"batch\":6,\"model\":{\"input\":[8],\"layers\":["
    "{\"op\":\"linear\",\"out\":8},{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":8},"
    "{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":4}],\"loss\":\"sum\"},"
    "\"pipeline\":{\"balance\":[2,2,1],\"chunks\":3,\"checkpoint\":\"except_last\"}}";

/* ---- alignment ------------------------------------------------------------------------------ */

static void test_alignment_scaled(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, SMALL);
    struct ps_sim s;
    simulate(&f, NULL, &s);
    /* "measured": the tasks only, twice as slow, on a clock that starts at 1000 us */
    struct ps_trace m;
    ps_trace_init(&m, PS_TRACE_CPU);
    uint32_t tasks = 0;
    for (uint32_t k = 0; k < s.trace.n; k++) {
        const struct ps_trace_rec *r = &s.trace.r[k];
        if (!ps_node_is_task(&f.g->nodes[r->node])) continue;
        tasks++;
        assert_int_equal(ps_trace_add(&m, r->node, r->device, r->stream, 1000 + 2 * r->start_us,
                                      2 * r->dur_us, NULL), 0);
    }
    assert_int_equal(tasks, 9 + 9 + 6); /* F, B, R (except_last: 2 of 3 checkpointed) */
    struct ps_compare c;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_compare_run(f.g, &s.trace, &m, &c, &d), 0);
    assert_int_equal(c.n_aligned, tasks);
    assert_int_equal(c.n_sim_only, 0);
    assert_int_equal(c.n_meas_only, 0);
    assert_rel(c.makespan_error, 0.5, 1e-12);
    assert_rel(c.dur_rel.median, 0.5, 1e-12);
    assert_rel(c.dur_rel.max, 0.5, 1e-12);
    assert_int_equal(c.inversions, 0);
    assert_int_equal(c.n_dep_violations, 0);
    assert_true(c.n_deps_checked > 0);
    /* the simulation against itself: no error at all */
    struct ps_compare c2;
    assert_int_equal(ps_compare_run(f.g, &s.trace, &s.trace, &c2, &d), 0);
    assert_true(fabs(c2.makespan_error) < 1e-15);
    assert_true(c2.start.max == 0 && c2.dur.max == 0);
    struct ps_tolerance tol;
    ps_tolerance_init(&tol);
    assert_int_equal(ps_compare_check(&c2, &tol, NULL, 0), 0);
    ps_compare_finish(&c);
    ps_compare_finish(&c2);
    ps_trace_finish(&m);
    ps_sim_finish(&s);
    fx_free(&f);
}

/* Copy/compute overlap and recompute overhead of a hand-made trace (compare.h's definitions):
 * compute F(0,0) [0,10] and F(1,0) [12,20] on device 0, F(0,1) [30,40] on device 1, R(0,0)
 * [45,47], B(0,0) [50,60]; one copy [5,35]. The copy is covered by compute over [5,10], [12,20]
 * and [30,35]: 18 of its 30 us, overlap 0.6. Recompute overhead R / (F + B) = 2 / (28 + 10). */
static void test_overlap_by_hand(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, SMALL);
    const struct ps_graph *g = f.g;
    uint32_t copy = PS_NONE;
    for (uint32_t v = 0; v < g->n_nodes && copy == PS_NONE; v++)
        if (g->nodes[v].kind == PS_NODE_COPY) copy = v;
    assert_true(copy != PS_NONE);
    struct {
        uint32_t v;
        double s, e;
    } rec[] = {{g->fwd[0 * 3 + 0], 0, 10},  {g->fwd[1 * 3 + 0], 12, 20}, {g->fwd[0 * 3 + 1], 30, 40},
               {g->rec[0 * 3 + 0], 45, 47}, {g->bwd[0 * 3 + 0], 50, 60}, {copy, 5, 35}};
    struct ps_trace m;
    ps_trace_init(&m, PS_TRACE_CPU);
    for (size_t k = 0; k < sizeof(rec) / sizeof(rec[0]); k++) {
        const struct ps_node *n = &g->nodes[rec[k].v];
        assert_int_equal(ps_trace_add(&m, rec[k].v, n->device, n->stream, rec[k].s,
                                      rec[k].e - rec[k].s, NULL), 0);
    }
    struct ps_compare c;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_compare_run(g, &m, &m, &c, &d), 0);
    assert_rel(c.meas_copy_us, 30, 1e-12);
    assert_rel(c.meas_copy_overlap, 0.6, 1e-12);
    assert_rel(c.meas_recompute_overhead, 2.0 / 38.0, 1e-12);
    ps_compare_finish(&c);
    ps_trace_finish(&m);
    fx_free(&f);
}

static void test_alignment_by_name(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, SMALL);
    const char *json =
        "[{\"name\":\"F(0, 0)\",\"ph\":\"X\",\"ts\":5000,\"dur\":10,\"pid\":\"CPU functions\",\"tid\":1},"
        "{\"name\":\"aten::addmm\",\"ph\":\"X\",\"ts\":5001,\"dur\":5,\"pid\":\"CPU functions\",\"tid\":1},"
        "{\"name\":\"F(0,1)\",\"ph\":\"X\",\"ts\":5020,\"dur\":10,\"pid\":\"CPU functions\",\"tid\":1},"
        "{\"name\":\"F(0,1)\",\"ph\":\"X\",\"ts\":5025,\"dur\":10,\"pid\":\"CPU functions\",\"tid\":1},"
        "{\"name\":\"B(7,7)\",\"ph\":\"X\",\"ts\":5100,\"dur\":1,\"pid\":\"CPU functions\",\"tid\":1}]";
    struct ps_trace t;
    struct ps_trace_read_info in;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_trace_parse(json, strlen(json), "x.json", f.g, &t, &in, &d), 0);
    assert_int_equal(in.n_by_name, 3);
    assert_int_equal(in.n_merged, 1);
    assert_int_equal(in.n_ignored, 1);
    assert_int_equal(in.n_unmatched, 1);
    assert_string_equal(in.unmatched[0], "B(7,7)");
    assert_int_equal(t.n, 3);
    assert_int_equal(t.r[0].node, f.g->fwd[0]);
    assert_true(t.r[0].start_us == 0); /* shifted to the first mapped event */
    assert_int_equal(t.r[1].node, f.g->fwd[1]);
    assert_true(t.r[1].start_us == 20 && t.r[1].dur_us == 15); /* merged span */
    assert_int_equal(t.r[1].device, f.g->nodes[f.g->fwd[1]].device);
    assert_int_equal(t.r[2].node, UINT32_MAX);
    assert_int_equal(in.n_threads, 1);
    assert_string_equal(in.threads[0].pid, "CPU functions");
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* ---- inversions and dependencies ------------------------------------------------------------ */

static void test_inversions(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, "{\"pipescope\":1,\"batch\":4,\"model\":{\"input\":[4],\"layers\":["
                 "{\"op\":\"linear\",\"out\":4},{\"op\":\"linear\",\"out\":4}],\"loss\":\"sum\"},"
                 "\"pipeline\":{\"balance\":[1,1],\"chunks\":4,\"checkpoint\":\"never\"}}");
    const struct ps_graph *g = f.g;
    uint32_t F[4];
    for (int i = 0; i < 4; i++) F[i] = g->fwd[i * 2 + 0];
    int32_t dev = g->nodes[F[0]].device, st = g->nodes[F[0]].stream;
    struct ps_trace s, m;
    ps_trace_init(&s, PS_TRACE_SIMULATED);
    ps_trace_init(&m, PS_TRACE_CPU);
    /* simulated A B C D; measured D A C B: ranks [1,3,2,0] -> 4 inversions */
    double ms[4] = {1, 3, 2, 0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ps_trace_add(&s, F[i], dev, st, 10.0 * i, 5, NULL), 0);
        assert_int_equal(ps_trace_add(&m, F[i], dev, st, 10.0 * ms[i], 5, NULL), 0);
    }
    struct ps_compare c;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_compare_run(g, &s, &m, &c, &d), 0);
    assert_int_equal(c.inversions, 4);
    assert_int_equal(c.pairs, 6);
    assert_int_equal(c.n_streams, 1);
    assert_int_equal(c.streams[0].stream, st);
    /* depend() (phony) orders the forwards of one partition: D A C B breaks F(1,0) -> F(2,0)
       and F(2,0) -> F(3,0) */
    assert_int_equal(c.n_dep_violations, 2);
    ps_compare_finish(&c);
    ps_trace_finish(&s);
    ps_trace_finish(&m);
    fx_free(&f);
}

static void test_dependency_violation(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, SMALL);
    const struct ps_graph *g = f.g;
    uint32_t a = g->fwd[0 * 3 + 0], b = g->fwd[0 * 3 + 1], c2 = g->fwd[0 * 3 + 2];
    for (int bad = 0; bad < 2; bad++) {
        struct ps_trace m;
        ps_trace_init(&m, PS_TRACE_CPU);
        /* F(0,0) -> copy -> wait -> F(0,1) -> ... -> F(0,2): paths through unrecorded nodes */
        ps_trace_add(&m, a, 0, g->nodes[a].stream, 0, 10, NULL);
        ps_trace_add(&m, b, 1, g->nodes[b].stream, bad ? 6 : 10, 10, NULL);
        ps_trace_add(&m, c2, 2, g->nodes[c2].stream, bad ? 30 : 20.001, 10, NULL);
        struct ps_compare c;
        struct ps_diag d;
        ps_diag_clear(&d);
        assert_int_equal(ps_compare_run(g, &m, &m, &c, &d), 0);
        assert_true(c.n_deps_checked >= 2);
        assert_int_equal(c.n_dep_violations, bad ? 1 : 0);
        if (bad) {
            assert_int_equal(c.deps[0].src, a);
            assert_int_equal(c.deps[0].dst, b);
            assert_rel(c.deps[0].early_us, 4, 1e-12);
            struct ps_tolerance t = {-1, -1, -1};
            char why[256];
            assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 1);
            assert_string_equal(why, "the measurement breaks 1 dependency of the graph\n");
        }
        ps_compare_finish(&c);
        ps_trace_finish(&m);
    }
    fx_free(&f);
}

/* ---- tolerances ----------------------------------------------------------------------------- */

static void test_tolerance(void **state)
{
    (void)state;
    struct ps_tolerance t;
    struct ps_diag d;
    ps_tolerance_init(&t);
    assert_true(t.makespan == 0.2 && t.task == 0.5 && t.start < 0);
    ps_diag_clear(&d);
    assert_int_equal(ps_tolerance_parse("task=0.25,start=0.1", &t, &d), 0);
    assert_true(t.makespan == 0.2 && t.task == 0.25 && t.start == 0.1);
    const char *bad[][2] = {
        {"makespan", "'makespan': expected NAME=VALUE (makespan, task or start)"},
        {"speed=1", "unknown limit 'speed' (expected makespan, task or start)"},
        {"task=-1", "'task=-1': expected a number >= 0 (a relative error, 0.2 = 20%)"},
        {"task=0.1x", "'task=0.1x': expected a number >= 0 (a relative error, 0.2 = 20%)"},
        {"", "empty (expected makespan=0.2,task=0.5)"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        ps_diag_clear(&d);
        assert_int_equal(ps_tolerance_parse(bad[k][0], &t, &d), -EINVAL);
        assert_string_equal(d.where, "--tolerance");
        assert_string_equal(d.msg, bad[k][1]);
    }
    /* exit logic on a hand-filled comparison */
    struct ps_compare c;
    memset(&c, 0, sizeof(c));
    c.makespan_error = -0.19;
    c.dur_rel.n = 10;
    c.dur_rel.p95 = 0.49;
    c.start.n = 10;
    c.start.p95 = 30;
    c.meas_makespan_us = 100;
    ps_tolerance_init(&t);
    char why[512];
    assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 0);
    assert_string_equal(why, "");
    c.makespan_error = -0.21;
    assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 1);
    assert_string_equal(why, "makespan error -21.0% exceeds the tolerance of 20.0%\n");
    c.dur_rel.p95 = 0.51;
    assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 2);
    t.start = 0.25; /* 30 us of 100 us */
    assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 3);
    t.makespan = t.task = t.start = -1; /* nothing checked */
    assert_int_equal(ps_compare_check(&c, &t, why, sizeof(why)), 0);
}

/* ---- calibration ---------------------------------------------------------------------------- */

static void test_cholesky_rank(void **state)
{
    (void)state;
    /* columns 0 and 1 identical: rank 2 of 3, the second one dropped */
    double A[9] = {4, 4, 2, 4, 4, 2, 2, 2, 5}, b[3] = {8, 8, 9}, x[3];
    bool used[3];
    assert_int_equal(ps_cholesky_solve(A, b, 3, 1e-10, x, used), 2);
    assert_true(used[0] && !used[1] && used[2]);
    assert_true(x[1] == 0);
    /* 4 x0 + 2 x2 = 8, 2 x0 + 5 x2 = 9 -> x0 = 1.375, x2 = 1.25 */
    assert_rel(x[0], 1.375, 1e-14);
    assert_rel(x[2], 1.25, 1e-14);
}

static void test_calibration_recovers_costs(void **state)
{
    (void)state;
    struct fx f;
    /* 3 partitions: [linear] [linear, relu] [linear]; batch 10 in chunks 4 = 3,3,3,1 samples,
       so copies have 2 sizes per boundary (bandwidth and latency separable) */
    fx_parse(&f, "{\"pipescope\":1,\"batch\":10,\"model\":{\"input\":[16],\"layers\":["
                 "{\"op\":\"linear\",\"out\":32},{\"op\":\"linear\",\"out\":24},{\"op\":\"relu\"},"
                 "{\"op\":\"linear\",\"out\":8}],\"loss\":\"sum\"},"
                 "\"pipeline\":{\"balance\":[1,2,1],\"chunks\":4,\"checkpoint\":\"except_last\"}}");
    assert_int_equal(f.spec->mb_count, 4);
    struct ps_cost_layer L[4] = {{5, 9, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {7, 11, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {1.5, 2, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {3, 6, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}};
    struct ps_costs truth = {.per_sample = true, .micro_batch = 1, .n_layers = 4, .layers = L,
                             .copy_bandwidth = 2e9, .copy_latency_us = 3, .launch_overhead_us = 2.5};
    struct ps_sim s;
    simulate(&f, &truth, &s);
    for (int unit = 0; unit < 2; unit++) {
        struct ps_calib cal;
        struct ps_diag d;
        ps_diag_clear(&d);
        assert_int_equal(ps_calibrate(f.g, &f.o, &s.trace, unit == 0, &cal, &d), 0);
        double sc = unit == 0 ? 1 : 3; /* micro_batch unit: the size of micro-batch 0 */
        assert_int_equal(cal.costs->per_sample, unit == 0);
        if (unit) assert_rel(cal.costs->micro_batch, 3, 0);
        /* partition sums per sample */
        assert_rel(cal.part_fwd_us[0], 5, 1e-6);
        assert_rel(cal.part_fwd_us[1], 8.5, 1e-6);
        assert_rel(cal.part_fwd_us[2], 3, 1e-6);
        assert_rel(cal.part_bwd_us[0], 9, 1e-6);
        assert_rel(cal.part_bwd_us[1], 13, 1e-6);
        assert_rel(cal.part_bwd_us[2], 6, 1e-6);
        /* single-layer partitions recover the layer; the others their sum */
        assert_rel(cal.costs->layers[0].forward_us, 5 * sc, 1e-6);
        assert_rel(cal.costs->layers[3].backward_us, 6 * sc, 1e-6);
        assert_rel(cal.costs->layers[1].forward_us + cal.costs->layers[2].forward_us, 8.5 * sc, 1e-6);
        assert_true(cal.fitted[PS_CAL_BANDWIDTH] && cal.fitted[PS_CAL_LATENCY] && cal.fitted[PS_CAL_LAUNCH]);
        assert_rel(cal.value[PS_CAL_BANDWIDTH], 2e9, 1e-6);
        assert_rel(cal.value[PS_CAL_LATENCY], 3, 1e-6);
        assert_rel(cal.value[PS_CAL_LAUNCH], 2.5, 1e-6);
        assert_true(cal.n_host_bound >= 2);
        assert_true(cal.rms_us < 1e-6);
        /* re-simulating with the fit reproduces the timeline */
        struct ps_sim s2;
        simulate(&f, cal.costs, &s2);
        assert_rel(s2.makespan_us, s.makespan_us, 1e-6);
        ps_sim_finish(&s2);
        ps_calib_finish(&cal);
    }
    /* without copies (a CPU run records tasks only): bandwidth and latency stay unfitted */
    struct ps_trace m;
    ps_trace_init(&m, PS_TRACE_CPU);
    for (uint32_t k = 0; k < s.trace.n; k++)
        if (ps_node_is_task(&f.g->nodes[s.trace.r[k].node]))
            ps_trace_add(&m, s.trace.r[k].node, s.trace.r[k].device, s.trace.r[k].stream,
                         s.trace.r[k].start_us, s.trace.r[k].dur_us, NULL);
    struct ps_calib cal;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_calibrate(f.g, &f.o, &m, true, &cal, &d), 0);
    assert_false(cal.fitted[PS_CAL_BANDWIDTH]);
    assert_false(cal.fitted[PS_CAL_LATENCY]);
    assert_true(cal.costs->copy_bandwidth < 0 && cal.costs->copy_latency_us < 0);
    assert_rel(cal.part_bwd_us[1], 13, 1e-6);
    ps_calib_finish(&cal);
    ps_trace_finish(&m);
    ps_sim_finish(&s);
    fx_free(&f);
}

/* Calibration is robust to outliers (compare.h: IRLS with weights 1 / |residual|, towards least
 * absolute deviations). The truth is the costs chosen here, not the calibrator's output:
 * a timeline simulated with known costs (launch overhead 20 us, so most starts are host-bound),
 * then a few records spoiled the way a shared CPU spoils them: three forwards and a backward 4x
 * slower, one copy 10x slower, and the last forward of partition 1 started 300 us late. Least
 * squares would drag every fitted value; the L1 fit ignores the few bad rows and recovers
 * each cost and the launch overhead to 1e-6. */
static void test_calibration_outliers(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, "{\"pipescope\":1,\"batch\":10,\"model\":{\"input\":[16],\"layers\":["
                 "{\"op\":\"linear\",\"out\":32},{\"op\":\"linear\",\"out\":24},{\"op\":\"relu\"},"
                 "{\"op\":\"linear\",\"out\":8}],\"loss\":\"sum\"},"
                 "\"pipeline\":{\"balance\":[1,2,1],\"chunks\":4,\"checkpoint\":\"except_last\"}}");
    struct ps_cost_layer L[4] = {{5, 9, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {7, 11, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {1.5, 2, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}, {3, 6, -1, 0, 0, false, 0, 0, false, 0, 0, 0, 0, false, 0, 0}};
    struct ps_costs truth = {.per_sample = true, .micro_batch = 1, .n_layers = 4, .layers = L,
                             .copy_bandwidth = 2e9, .copy_latency_us = 3, .launch_overhead_us = 20};
    struct ps_sim s;
    simulate(&f, &truth, &s);
    const struct ps_graph *g = f.g;
    struct ps_trace m;
    ps_trace_init(&m, PS_TRACE_CPU);
    int n_copy = 0, spoiled = 0;
    for (uint32_t k = 0; k < s.trace.n; k++) {
        const struct ps_trace_rec *r = &s.trace.r[k];
        double st = r->start_us, dur = r->dur_us;
        if (r->node == g->fwd[0 * 3 + 0] || r->node == g->fwd[2 * 3 + 1] ||
            r->node == g->fwd[1 * 3 + 2] || r->node == g->bwd[3 * 3 + 1])
            dur *= 4, spoiled++;
        if (g->nodes[r->node].kind == PS_NODE_COPY && n_copy++ == 2) dur *= 10, spoiled++;
        if (r->node == g->fwd[3 * 3 + 1]) st += 300, spoiled++;
        assert_int_equal(ps_trace_add(&m, r->node, r->device, r->stream, st, dur, NULL), 0);
    }
    assert_int_equal(spoiled, 6);
    struct ps_calib cal;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_calibrate(g, &f.o, &m, true, &cal, &d), 0);
    /* partition sums per sample, as in test_calibration_recovers_costs */
    assert_rel(cal.part_fwd_us[0], 5, 1e-6);
    assert_rel(cal.part_fwd_us[1], 8.5, 1e-6);
    assert_rel(cal.part_fwd_us[2], 3, 1e-6);
    assert_rel(cal.part_bwd_us[0], 9, 1e-6);
    assert_rel(cal.part_bwd_us[1], 13, 1e-6);
    assert_rel(cal.part_bwd_us[2], 6, 1e-6);
    assert_rel(cal.value[PS_CAL_BANDWIDTH], 2e9, 1e-6);
    assert_rel(cal.value[PS_CAL_LATENCY], 3, 1e-6);
    assert_rel(cal.value[PS_CAL_LAUNCH], 20, 1e-6);
    assert_true(cal.n_host_bound >= 10);
    /* the five spoiled durations miss the fit by more than half their value */
    assert_int_equal(cal.n_trimmed, 5);
    ps_calib_finish(&cal);
    ps_trace_finish(&m);
    ps_sim_finish(&s);
    fx_free(&f);
}

/* The L1 answer in closed form: one partition, 5 micro-batches of 2 samples, checkpoint never,
 * forwards measured 10, 10.2, 20, 21, 50 us and backwards 20, 21, 26, 23, 22 us, back to back on
 * the stream (no start is host-bound but the first). The F rows fit one parameter Fp with
 * 2 Fp ~ dur, the B rows one Bp: least absolute deviations gives the median, Fp = 20 / 2 = 10
 * and Bp = 22 / 2 = 11 us per sample. Least squares would give the means, 11.12 and 11.2;
 * weights 1 / residual^2 are drawn to the point nearest the mean (21), weights
 * 1 / sqrt|residual| to a point between median and mean. IRLS stops within its residual floor (1e-6 of the
 * observation) of the median. */
static void test_calibration_median(void **state)
{
    (void)state;
    struct fx f;
    fx_parse(&f, "{\"pipescope\":1,\"batch\":10,\"model\":{\"input\":[4],\"layers\":["
                 "{\"op\":\"linear\",\"out\":4}],\"loss\":\"sum\"},"
                 "\"pipeline\":{\"balance\":[1],\"chunks\":5,\"checkpoint\":\"never\"}}");
    const struct ps_graph *g = f.g;
    assert_int_equal(f.spec->mb_count, 5);
    const double fd[5] = {10, 10.2, 20, 21, 50}, bd[5] = {20, 21, 26, 23, 22};
    struct ps_trace m;
    ps_trace_init(&m, PS_TRACE_CPU);
    double t = 0;
    for (uint32_t k = 0; k < f.o.n; k++) {
        uint32_t v = f.o.node[k];
        const struct ps_node *n = &g->nodes[v];
        if (n->kind != PS_NODE_COMPUTE) continue;
        double dur = n->phase == PS_PHASE_FWD ? fd[n->mb] : bd[n->mb];
        assert_int_equal(ps_trace_add(&m, v, n->device, n->stream, t, dur, NULL), 0);
        t += dur;
    }
    assert_int_equal(m.n, 10);
    struct ps_calib cal;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_calibrate(g, &f.o, &m, true, &cal, &d), 0);
    assert_rel(cal.part_fwd_us[0], 10, 1e-5);
    assert_rel(cal.part_bwd_us[0], 11, 1e-5);
    assert_int_equal(cal.n_host_bound, 1);
    ps_calib_finish(&cal);
    ps_trace_finish(&m);
    fx_free(&f);
}

/* ---- the reader's corpus -------------------------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 16);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    fclose(f);
    b[n] = '\0';
    while (n && (b[n - 1] == '\n')) b[--n] = '\0';
    return b;
}

static void test_reader_corpus(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "examples/small-3x3.json");
    const char *root = getenv("PS_SOURCE_ROOT");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tests/corpus/trace", root ? root : "..");
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(dir), 0);
    DIR *dp = opendir(".");
    assert_non_null(dp);
    struct dirent *e;
    int n_bad = 0, n_good = 0, failures = 0;
    while ((e = readdir(dp))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
        bool bad = e->d_name[0] == 'n';
        struct ps_trace t;
        struct ps_trace_read_info in;
        struct ps_diag d;
        ps_diag_clear(&d);
        int rc = ps_trace_read(e->d_name, f.g, &t, &in, &d);
        if (!bad) {
            n_good++;
            if (rc) {
                char buf[2048];
                print_error("%s: unexpected error %s\n", e->d_name, ps_diag_format(&d, buf, sizeof(buf)));
                failures++;
            } else if (t.n == 0) {
                failures++;
            }
            ps_trace_read_info_finish(&in);
            ps_trace_finish(&t);
            continue;
        }
        n_bad++;
        char errp[512];
        snprintf(errp, sizeof(errp), "%.*s.err", (int)(len - 5), e->d_name);
        char *want = slurp(errp);
        char got[2048];
        ps_diag_format(&d, got, sizeof(got));
        if (rc == 0 || !want || strcmp(want, got) != 0) {
            print_error("%s:\n  got  '%s'\n  want '%s'\n", e->d_name, got, want ? want : "(no .err)");
            failures++;
        }
        assert_int_equal(t.n, 0);
        assert_int_equal(in.n_threads, 0);
        free(want);
    }
    closedir(dp);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(failures, 0);
    assert_true(n_bad >= 15);
    assert_true(n_good >= 2);
    fx_free(&f);
}

static void test_kineto_layout(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "examples/small-3x3.json");
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/corpus/trace/y_kineto.json", root ? root : "..");
    struct ps_trace t;
    struct ps_trace_read_info in;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_trace_read(path, f.g, &t, &in, &d), 0);
    assert_true(in.kineto);
    assert_int_equal(t.n, 2);
    assert_int_equal(t.r[0].node, f.g->fwd[0]);
    assert_true(t.r[0].start_us == 0 && t.r[0].dur_us == 12.5);
    assert_int_equal(t.r[1].node, f.g->bwd[0]);
    /* B(0,0): host range [200, 230], gpu_user_annotation [205, 235] on stream 7 of GPU 0 (file
       times minus the first task's 100): measured on the device, the host range kept */
    assert_true(t.r[1].start_us == 105 && t.r[1].dur_us == 30);
    assert_true(t.r[1].cpu_start_us == 100 && t.r[1].cpu_dur_us == 30);
    assert_int_equal(t.r[1].lane_device, 0);
    assert_int_equal(t.r[1].lane_stream, 7);
    assert_true(isnan(t.r[0].cpu_start_us) == 0 && t.r[0].lane_stream == -1);
    assert_int_equal(in.n_merged, 1);
    assert_int_equal(in.n_gpu_tasks, 1);
    assert_int_equal(in.n_threads, 2); /* host threads that ran tasks: 4250 (F), 4242 (B) */
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* ---- the PyTorch profiler golden (examples/profile_torchgpipe.py) --------------------------- */

static void test_profiler_golden(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "examples/small-3x3.json");
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/golden/compare/kineto_small.json", root ? root : "..");
    struct ps_trace t;
    struct ps_trace_read_info in;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_trace_read(path, f.g, &t, &in, &d);
    if (rc) {
        char buf[2048];
        print_error("%s\n", ps_diag_format(&d, buf, sizeof(buf)));
    }
    assert_int_equal(rc, 0);
    uint32_t tasks = 0;
    for (uint32_t v = 0; v < f.g->n_nodes; v++) tasks += ps_node_is_task(&f.g->nodes[v]);
    assert_int_equal(tasks, 9 + 9 + 6);
    assert_int_equal(in.n_by_name, tasks); /* every F/B/R range named, once */
    assert_int_equal(in.n_unmatched, 0);
    assert_int_equal(in.n_merged, 0);
    struct ps_sim s;
    simulate(&f, NULL, &s);
    struct ps_compare c;
    assert_int_equal(ps_compare_run(f.g, &s.trace, &t, &c, &d), 0);
    assert_int_equal(c.n_sim_only, 0);
    assert_int_equal(c.n_meas_only, 0);
    assert_int_equal(c.dur_rel.n, tasks);
    assert_int_equal(c.n_dep_violations, 0); /* the torchgpipe run respects the graph */
    ps_compare_finish(&c);
    ps_sim_finish(&s);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_scaled),
        cmocka_unit_test(test_overlap_by_hand),
        cmocka_unit_test(test_alignment_by_name),
        cmocka_unit_test(test_inversions),
        cmocka_unit_test(test_dependency_violation),
        cmocka_unit_test(test_tolerance),
        cmocka_unit_test(test_cholesky_rank),
        cmocka_unit_test(test_calibration_recovers_costs),
        cmocka_unit_test(test_calibration_outliers),
        cmocka_unit_test(test_calibration_median),
        cmocka_unit_test(test_reader_corpus),
        cmocka_unit_test(test_kineto_layout),
        cmocka_unit_test(test_profiler_golden),
    };
    return cmocka_run_group_tests_name("compare", tests, NULL, NULL);
}
