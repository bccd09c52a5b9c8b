/* test_traces: traces written by real frameworks, read onto pipescope's graphs (src/trace_read.c,
 * src/trace_names.c, src/trace_json.c).
 *
 * Independent truths:
 *   - fairscale: tests/golden/traces/fairscale-3x3.trace.json was recorded from fairscale's own
 *     Pipe (gen_fairscale.py, fairscale 146f160) by PyTorch 1.13's profiler. What must hold
 *     follows from fairscale's code, not from pipescope: each task's forward is one
 *     chunk<i>-part<j> range, a checkpointed task (i < checkpoint_stop = 2) has a second one at
 *     recompute, recomputes run after every forward and partition by partition from the last,
 *     and a real run breaks no dependency of the graph.
 *   - Kineto GPU attribution: two real ranks of a training job published by the Holistic Trace
 *     Analysis project (tests/golden/traces/hta, gzip as published, four annotations per rank
 *     renamed to PP: names); the spans, streams and the clock correction they must give are
 *     computed by make_hta_excerpt.py in Python from the same rule (hta-expected.json).
 *   - calibration: the PyTorch-shaped traces' kernels take 31 + 9 us (forward) and 35 + 28 + 7 us
 *     (backward) per micro-batch of 2 samples (gen_pp_kineto.py), so the fit must say 20 and 35
 *     us per sample.
 *   - names: the strings PyTorch pipelining writes are "PP:" + str(_Action), str = stage index,
 *     computation type value, micro-batch index (torch/distributed/pipelining/schedules.py,
 *     _Action.__repr__ and _get_profiler_function_name), e.g. PP:0F3, PP:2I1, PP:1SEND_F0.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sim/calibrate.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "src/compare.h"
#include "src/engine.h"
#include "src/file.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"
#include "src/trace_names.h"
#include "src/trace_read.h"
#include "src/variant.h"
#include "viz/viz.h"

struct fx {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *g;
    struct ps_order o;
};

static void src_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    snprintf(buf, n, "%s/%s", root ? root : "..", rel);
}

static void fx_file(struct fx *f, const char *rel)
{
    char path[1024];
    src_path(path, sizeof(path), rel);
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

static void simulate(const struct fx *f, struct ps_sim *s)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    double *cost = malloc(f->g->n_nodes * sizeof(double));
    assert_int_equal(ps_cost_fill(f->g, NULL, cost, &d), 0);
    struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(f->g, NULL)};
    assert_int_equal(ps_sim_run(f->g, &f->o, cost, &so, s, &d), 0);
    free(cost);
}

static const struct ps_trace_rec *rec_of(const struct ps_trace *t, uint32_t node)
{
    for (uint32_t k = 0; k < t->n; k++)
        if (t->r[k].node == node) return &t->r[k];
    return NULL;
}

static int read_or_print(const struct fx *f, const char *const *rel, uint32_t n,
                         struct ps_trace *t, struct ps_trace_read_info *in)
{
    char paths[8][1024];
    const char *p[8];
    for (uint32_t k = 0; k < n; k++) src_path(paths[k], sizeof(paths[k]), rel[k]), p[k] = paths[k];
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_trace_read_files(p, n, f->g, NULL, t, in, &d);
    if (rc) {
        char b[2048];
        print_error("%s\n", ps_diag_format(&d, b, sizeof(b)));
    }
    return rc;
}

/* ---- names ---------------------------------------------------------------------------------- */

static void test_names(void **state)
{
    (void)state;
    struct ps_tname t;
    assert_true(ps_tname_parse("PP:0F3", &t));
    assert_true(t.conv == PS_TN_PP && t.kind == 'F' && t.part == 0 && t.mb == 3);
    assert_true(ps_tname_parse("PP:12I104", &t));
    assert_true(t.conv == PS_TN_PP && t.kind == 'I' && t.part == 12 && t.mb == 104);
    assert_true(ps_tname_parse("PP:2W1", &t) && t.kind == 'W');
    assert_true(ps_tname_parse("PP:1B0", &t) && t.kind == 'B');
    assert_true(ps_tname_parse("PP:1SEND_F0", &t) && t.conv == PS_TN_PP_OTHER && t.part == 1);
    assert_true(ps_tname_parse("PP:3RECV_B12", &t) && t.conv == PS_TN_PP_OTHER);
    assert_true(ps_tname_parse("PP:0UNSHARD", &t) && t.conv == PS_TN_PP_OTHER);
    assert_true(ps_tname_parse("PP:2REDUCE_GRAD", &t) && t.conv == PS_TN_PP_OTHER);
    assert_true(ps_tname_parse("PP:(0F1;1B0)OVERLAP_F_B", &t) && t.conv == PS_TN_PP_OTHER);
    assert_false(ps_tname_parse("PP:0F", &t));     /* a compute action has a micro-batch */
    assert_false(ps_tname_parse("PP:0F3x", &t));
    assert_false(ps_tname_parse("PP:F3", &t));
    assert_false(ps_tname_parse("PP:0X3", &t));
    assert_false(ps_tname_parse("PP:0SEND_F0x", &t));
    assert_true(ps_tname_parse("chunk2-part1", &t));
    assert_true(t.conv == PS_TN_FAIRSCALE && t.mb == 2 && t.part == 1);
    assert_false(ps_tname_parse("chunk2-part1-x", &t));
    assert_false(ps_tname_parse("chunk2-rank1", &t)); /* fairscale's distributed pipeline: not Pipe */
    assert_false(ps_tname_parse("chunk-part1", &t));
    assert_true(ps_tname_parse("F(0, 1)", &t) && t.conv == PS_TN_PIPESCOPE && t.part == 1);
    assert_true(ps_tname_parse("Wg(3,2)", &t) && t.kind == 'W' && t.mb == 3);
    assert_false(ps_tname_parse("F(0,1", &t));
    assert_false(ps_tname_parse("PP:123456789F0", &t)); /* more than 8 digits */
    assert_false(ps_tname_parse("aten::linear", &t));
}

/* ---- fairscale's Pipe, recorded ------------------------------------------------------------- */

static void test_fairscale_pipe(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "tests/golden/traces/fairscale-3x3.spec.json");
    const char *rel[] = {"tests/golden/traces/fairscale-3x3.trace.json"};
    struct ps_trace t;
    struct ps_trace_read_info in;
    assert_int_equal(read_or_print(&f, rel, 1, &t, &in), 0);
    int m = f.g->m, n = f.g->n;
    assert_int_equal(m, 3);
    assert_int_equal(n, 3);
    /* 3 x 3 forwards, 2 x 3 recomputes (micro-batches 0 and 1 are checkpointed) */
    assert_int_equal(in.n_fairscale, 15);
    assert_int_equal(in.n_by_name, 15);
    assert_int_equal(in.n_unmatched, 0);
    assert_int_equal(in.n_merged, 0);
    double last_f_end = -INFINITY, first_r = INFINITY;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            const struct ps_trace_rec *F = rec_of(&t, f.g->fwd[i * n + j]);
            assert_non_null(F);
            last_f_end = fmax(last_f_end, F->start_us + F->dur_us);
            uint32_t rv = f.g->rec[i * n + j];
            assert_true((rv != PS_NONE) == (i < 2));
            if (rv == PS_NONE) continue;
            const struct ps_trace_rec *R = rec_of(&t, rv);
            assert_non_null(R);
            first_r = fmin(first_r, R->start_us);
            /* backward runs from the last partition: R(i,j+1) before R(i,j) */
            if (j + 1 < n) {
                const struct ps_trace_rec *R1 = rec_of(&t, f.g->rec[i * n + j + 1]);
                assert_true(R1->start_us + R1->dur_us <= R->start_us);
            }
        }
    assert_true(last_f_end <= first_r); /* every recompute after every forward */
    /* forwards in GPipe's clock order on the one worker: F(i,j) before F(i+1,j) */
    for (int i = 0; i + 1 < m; i++)
        for (int j = 0; j < n; j++)
            assert_true(rec_of(&t, f.g->fwd[i * n + j])->start_us <
                        rec_of(&t, f.g->fwd[(i + 1) * n + j])->start_us);
    struct ps_sim s;
    simulate(&f, &s);
    struct ps_compare c;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_compare_run(f.g, &s.trace, &t, &c, &d), 0);
    assert_int_equal(c.n_aligned, 15);
    assert_int_equal(c.n_dep_violations, 0);
    assert_true(c.n_deps_checked > 0);
    ps_compare_finish(&c);
    ps_sim_finish(&s);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* ---- PyTorch pipelining, one trace per rank ------------------------------------------------ */

static void test_pytorch_pp_ranks(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "tests/golden/traces/pp-1f1b-2x4.spec.json");
    const char *rel[] = {"tests/golden/traces/pp-1f1b/rank0.json",
                         "tests/golden/traces/pp-1f1b/rank1.json"};
    struct ps_trace t;
    struct ps_trace_read_info in;
    assert_int_equal(read_or_print(&f, rel, 2, &t, &in), 0);
    /* 2 stages x 4 micro-batches x (F, B), each a host range and a gpu_user_annotation */
    assert_int_equal(in.n_pytorch, 32);
    assert_int_equal(in.n_unmatched, 0);
    assert_int_equal(in.n_rank_mismatch, 0);
    /* per rank: UNSHARD, RESHARD, REDUCE_GRAD, 4 SEND and 4 RECV (gen_pp_kineto.py's lowering) */
    assert_int_equal(in.n_pytorch_other, 22);
    /* per rank 4 x 2 forward kernels + 4 x 3 backward kernels, all launched inside a task */
    assert_int_equal(in.n_gpu_ops, 40);
    assert_int_equal(in.n_gpu_attributed, 40);
    assert_int_equal(in.n_gpu_tasks, 16);
    assert_int_equal(in.n_files, 2);
    assert_true(in.files[0].has_rank && in.files[0].rank == 0);
    assert_true(in.files[1].has_rank && in.files[1].rank == 1);
    /* rank 1's base time is 250 us small; the tightest forward edge has 20 us of slack, so the
       least correction that lets no cross-rank edge run backwards is 230 us */
    assert_true(in.files[0].base_offset_us == 250.0 && in.files[1].base_offset_us == 0.0);
    assert_true(fabs(in.files[1].skew_us - 230.0) < 1e-6);
    assert_true(in.files[0].skew_us == 0.0);
    assert_true(fabs(in.residual_skew_us - 230.0) < 1e-6);
    assert_false(in.clocks_inconsistent);
    assert_int_equal(in.n_cross_edges, 8); /* F(i,0) -> F(i,1) and B(i,1) -> B(i,0) */
    int n = f.g->n;
    for (uint32_t v = 0; v < f.g->n_nodes; v++) {
        const struct ps_node *nd = &f.g->nodes[v];
        if (!ps_node_is_task(nd)) continue;
        const struct ps_trace_rec *r = rec_of(&t, v);
        assert_non_null(r);
        bool fwd = nd->phase == PS_PHASE_FWD;
        /* the device span: kernels back to back, 31 + 9 us forward, 35 + 28 + 7 us backward */
        assert_true(r->dur_us == (fwd ? 40.0 : 70.0));
        /* the host range: 2 us, one 6 us launch per kernel, 1 us */
        assert_true(r->cpu_dur_us == (fwd ? 15.0 : 21.0));
        assert_true(r->cpu_start_us < r->start_us); /* launched before it ran */
        assert_int_equal(r->lane_device, nd->part);
        assert_int_equal(r->lane_stream, 7);
    }
    (void)n;
    struct ps_sim s;
    simulate(&f, &s);
    struct ps_compare c;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_compare_run(f.g, &s.trace, &t, &c, &d), 0);
    assert_int_equal(c.n_aligned, 16);
    assert_int_equal(c.n_dep_violations, 0);
    assert_int_equal(c.inversions, 0);
    /* the measured lanes: stream 7 of GPU 0 and of GPU 1, 8 tasks each, in 1F1B order */
    assert_int_equal(c.n_lanes, 2);
    assert_true(c.lanes[0].device == 0 && c.lanes[0].stream == 7 && c.lanes[0].n_tasks == 8);
    assert_true(c.lanes[1].device == 1 && c.lanes[1].stream == 7 && c.lanes[1].n_tasks == 8);
    assert_int_equal(c.lane_pairs, 2 * 28);
    assert_int_equal(c.lane_inversions, 0);
    /* the side-by-side picture draws measured tasks on their real CUDA streams */
    char svg[] = "/tmp/pipescope-test-gantt-XXXXXX";
    int fd = mkstemp(svg);
    assert_true(fd >= 0);
    close(fd);
    struct ps_gantt_opts go = {.title = "pp", .label = "measured", .label2 = "simulated"};
    assert_int_equal(ps_plot_gantt_file(f.g, &t, &s.trace, &go, svg, &d), 0);
    char *pic = NULL;
    size_t plen = 0;
    struct ps_file_opts fo = {.factor = 1};
    assert_int_equal(ps_file_read(svg, &fo, &pic, &plen, &d), 0);
    unlink(svg);
    assert_non_null(strstr(pic, "cuda:0 CUDA stream 7 (measured)"));
    assert_non_null(strstr(pic, "cuda:1 CUDA stream 7 (measured)"));
    assert_non_null(strstr(pic, "cuda:0 compute")); /* the simulated lanes */
    free(pic);
    /* calibration from these traces recovers the kernels' times: micro-batches of 2 samples,
       forward 40 us -> 20 us per sample, backward 70 us -> 35 us per sample, both stages */
    struct ps_calib cal;
    assert_int_equal(ps_calibrate(f.g, &f.o, &t, true, &cal, &d), 0);
    for (int j = 0; j < 2; j++) {
        assert_true(fabs(cal.part_fwd_us[j] - 20.0) < 1e-6);
        assert_true(fabs(cal.part_bwd_us[j] - 35.0) < 1e-6);
    }
    ps_calib_finish(&cal);
    ps_compare_finish(&c);
    ps_sim_finish(&s);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* I and W on a schedule that splits backward (zb-h1), and where it does not (1f1b) */
static void test_pytorch_split_backward(void **state)
{
    (void)state;
    static const char *const ZB =
        "{\"pipescope\":1,\"batch\":4,\"model\":{\"input\":[8],\"layers\":["
        "{\"op\":\"linear\",\"out\":8},{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":4}],"
        "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"zb-h1\",\"balance\":[2,1],"
        "\"devices\":[\"cuda:0\",\"cuda:1\"],\"chunks\":2,\"checkpoint\":\"never\"}}";
    static const char TR[] =
        "{\"traceEvents\": ["
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1F0\",\"pid\":1,\"tid\":1,\"ts\":10,\"dur\":5},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1I0\",\"pid\":1,\"tid\":1,\"ts\":20,\"dur\":5},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1W0\",\"pid\":1,\"tid\":1,\"ts\":30,\"dur\":5},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1B1\",\"pid\":1,\"tid\":1,\"ts\":40,\"dur\":5},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1F7\",\"pid\":1,\"tid\":1,\"ts\":50,\"dur\":5}"
        "], \"distributedInfo\": {\"rank\": 1, \"world_size\": 2}}";
    struct ps_diag d;
    ps_diag_clear(&d);
    struct fx f;
    memset(&f, 0, sizeof(f));
    assert_int_equal(ps_spec_parse(ZB, "zb.json", ".", &f.spec, &d), 0);
    assert_int_equal(ps_model_build(f.spec, &f.model, &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    assert_int_equal(ps_schedule_build(f.spec, f.model, &o, &f.g, &d), 0);
    assert_int_equal(ps_schedule_order(f.g, &f.o, &d), 0);
    struct ps_trace t;
    struct ps_trace_read_info in;
    assert_int_equal(ps_trace_parse(TR, sizeof(TR) - 1, "t.json", f.g, &t, &in, &d), 0);
    char nm[64];
    const char *want[] = {"F(0,1)", "B(0,1)", "Wg(0,1)", "B(1,1)"};
    for (int k = 0; k < 4; k++) {
        assert_true(t.r[k].node != UINT32_MAX);
        assert_string_equal(ps_node_name(f.g, t.r[k].node, nm, sizeof(nm)), want[k]);
    }
    assert_int_equal(in.n_by_name, 4);
    assert_int_equal(in.n_unmatched, 1); /* PP:1F7: micro-batch 7 of 2 */
    assert_string_equal(in.unmatched[0], "PP:1F7");
    assert_string_equal(in.unmatched_why[0], "micro-batch 7, but the spec has 2");
    assert_int_equal(in.n_rank_mismatch, 0); /* stage 1 on cuda:1, rank 1 */
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);

    /* 1f1b: I and W name no task; B does */
    fx_file(&f, "tests/golden/traces/pp-1f1b-2x4.spec.json");
    assert_int_equal(ps_trace_parse(TR, sizeof(TR) - 1, "t.json", f.g, &t, &in, &d), 0);
    assert_int_equal(in.n_by_name, 2); /* PP:1F0, PP:1B1 */
    assert_int_equal(in.n_unmatched, 3); /* PP:1I0, PP:1W0, PP:1F7 (micro-batch 7 of 4) */
    assert_string_equal(in.unmatched[0], "PP:1I0");
    assert_string_equal(in.unmatched_why[0],
                        "an input-gradient action: the spec's schedule (1f1b) does not split "
                        "backward into input and weight gradients (schedule zb-h1 does)");
    assert_string_equal(in.unmatched[1], "PP:1W0");
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* ---- real multi-stream Kineto traces (Holistic Trace Analysis), gzip, two ranks ------------ */

static void test_hta_gpu_attribution(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "tests/golden/traces/pp-1f1b-2x4.spec.json");
    const char *rel[] = {"tests/golden/traces/hta/rank0.json.gz",
                         "tests/golden/traces/hta/rank1.json.gz"};
    struct ps_trace t;
    struct ps_trace_read_info in;
    assert_int_equal(read_or_print(&f, rel, 2, &t, &in), 0);
    char path[1024];
    src_path(path, sizeof(path), "tests/golden/traces/hta-expected.json");
    char *text = NULL;
    size_t len = 0;
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_file_opts fo = {.factor = 8};
    assert_int_equal(ps_file_read(path, &fo, &text, &len, &d), 0);
    cJSON *exp = cJSON_Parse(text);
    assert_non_null(exp);
    const cJSON *skew = cJSON_GetObjectItemCaseSensitive(exp, "skew_us");
    assert_true(fabs(in.files[0].skew_us - cJSON_GetArrayItem(skew, 0)->valuedouble) < 1e-6);
    assert_true(fabs(in.files[1].skew_us - cJSON_GetArrayItem(skew, 1)->valuedouble) < 1e-6);
    assert_true(in.files[1].skew_us > 1000); /* the real clocks needed a correction */
    assert_false(in.clocks_inconsistent);
    assert_int_equal(in.n_pytorch, 8);
    assert_int_equal(in.n_gpu_tasks, 8);
    const cJSON *tasks = cJSON_GetObjectItemCaseSensitive(exp, "tasks"), *e;
    int n_checked = 0, n_multi = 0;
    cJSON_ArrayForEach(e, tasks)
    {
        int s = -1, i = -1;
        char kind = 0;
        assert_int_equal(sscanf(e->string, "PP:%d%c%d", &s, &kind, &i), 3);
        char want[32], nm[64];
        snprintf(want, sizeof(want), "%c(%d,%d)", kind, i, s);
        const struct ps_trace_rec *r = NULL;
        for (uint32_t k = 0; k < t.n && !r; k++)
            if (t.r[k].node != UINT32_MAX &&
                !strcmp(ps_node_name(f.g, t.r[k].node, nm, sizeof(nm)), want))
                r = &t.r[k];
        assert_non_null(r);
#define NUM(key) cJSON_GetObjectItemCaseSensitive(e, key)->valuedouble
        assert_true(fabs(r->start_us - NUM("start_us")) < 1e-6);
        assert_true(fabs(r->dur_us - NUM("dur_us")) < 1e-6);
        assert_true(fabs(r->cpu_start_us - NUM("cpu_start_us")) < 1e-6);
        assert_true(fabs(r->cpu_dur_us - NUM("cpu_dur_us")) < 1e-6);
        assert_int_equal(r->lane_stream, (int64_t)NUM("stream"));
        assert_int_equal(r->lane_device, (int32_t)NUM("device"));
#undef NUM
        n_multi += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "several_streams"));
        n_checked++;
    }
    assert_int_equal(n_checked, 8);
    assert_int_equal((int)in.n_multi_stream, n_multi);
    assert_true(n_multi > 0); /* tasks whose kernels ran on several real streams */
    cJSON_Delete(exp);
    free(text);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

/* ---- several training steps in one file ----------------------------------------------------- */

static int read_text(const struct fx *f, const char *text, int step, struct ps_trace *t,
                     struct ps_trace_read_info *in, struct ps_diag *d)
{
    char path[] = "/tmp/pipescope-test-steps-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    const char *p[1] = {path};
    struct ps_trace_read_opts o = {.step = step};
    ps_diag_clear(d);
    int rc = ps_trace_read_files(p, 1, f->g, &o, t, in, d);
    unlink(path);
    return rc;
}

static void test_steps(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "tests/golden/traces/fairscale-3x3.spec.json");
    /* fairscale, two steps of task (0,0) (checkpointed: forward, recompute, forward, recompute)
       and of (2,0) (not checkpointed: one range per step) */
    static const char FS[] =
        "[{\"name\": \"chunk0-part0\", \"ph\": \"X\", \"ts\": 0, \"dur\": 10, \"tid\": 1, \"pid\": \"CPU functions\"},"
        " {\"name\": \"chunk2-part0\", \"ph\": \"X\", \"ts\": 20, \"dur\": 10, \"tid\": 1, \"pid\": \"CPU functions\"},"
        " {\"name\": \"chunk0-part0\", \"ph\": \"X\", \"ts\": 40, \"dur\": 5, \"tid\": 1, \"pid\": \"CPU functions\"},"
        " {\"name\": \"chunk0-part0\", \"ph\": \"X\", \"ts\": 100, \"dur\": 11, \"tid\": 1, \"pid\": \"CPU functions\"},"
        " {\"name\": \"chunk2-part0\", \"ph\": \"X\", \"ts\": 120, \"dur\": 12, \"tid\": 1, \"pid\": \"CPU functions\"},"
        " {\"name\": \"chunk0-part0\", \"ph\": \"X\", \"ts\": 140, \"dur\": 6, \"tid\": 1, \"pid\": \"CPU functions\"}]";
    struct ps_trace t;
    struct ps_trace_read_info in;
    struct ps_diag d;
    int n = f.g->n;
    assert_int_equal(read_text(&f, FS, -1, &t, &in, &d), 0);
    assert_int_equal(in.n_steps, 2);
    assert_int_equal(in.step, 1);
    assert_int_equal(in.n_other_steps, 3);
    assert_int_equal(t.n, 3);
    /* the last step: F(0,0) at 100 (the first kept record, time 0), F(2,0) at 120, R(0,0) at 140 */
    assert_true(rec_of(&t, f.g->fwd[0 * n + 0])->start_us == 0 && rec_of(&t, f.g->fwd[0])->dur_us == 11);
    assert_true(rec_of(&t, f.g->fwd[2 * n + 0])->start_us == 20 && rec_of(&t, f.g->fwd[2 * n])->dur_us == 12);
    assert_true(rec_of(&t, f.g->rec[0])->start_us == 40 && rec_of(&t, f.g->rec[0])->dur_us == 6);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    assert_int_equal(read_text(&f, FS, 0, &t, &in, &d), 0);
    assert_int_equal(in.step, 0);
    assert_true(rec_of(&t, f.g->fwd[0])->dur_us == 10 && rec_of(&t, f.g->rec[0])->dur_us == 5);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    assert_int_equal(read_text(&f, FS, 2, &t, &in, &d), -EINVAL);
    assert_string_equal(d.msg, "--step 2, but this trace holds 2 training steps");
    assert_int_equal(t.n, 0);
    fx_free(&f);
}

/* Two ranks whose cross-rank edges contradict each other: F(0,0) [0, 10] on rank 0 and F(0,1)
   [5, 15] on rank 1 need rank 1 moved by >= 5 us; B(0,1) [95, 99] before B(0,0) [100, 110] allows
   at most 1 us. No move satisfies both: nothing is moved, and the contradiction is 5 - 1 = 4 us. */
static void test_clocks_contradict(void **state)
{
    (void)state;
    struct fx f;
    fx_file(&f, "tests/golden/traces/pp-1f1b-2x4.spec.json");
    static const char *const TXT[2] = {
        "{\"traceEvents\": ["
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:0F0\",\"pid\":1,\"tid\":1,\"ts\":0,\"dur\":10},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:0B0\",\"pid\":1,\"tid\":1,\"ts\":100,\"dur\":10}],"
        "\"distributedInfo\": {\"rank\": 0}}",
        "{\"traceEvents\": ["
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1F0\",\"pid\":2,\"tid\":2,\"ts\":5,\"dur\":10},"
        "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"PP:1B0\",\"pid\":2,\"tid\":2,\"ts\":95,\"dur\":4}],"
        "\"distributedInfo\": {\"rank\": 1}}"};
    char paths[2][64];
    const char *p[2];
    for (int k = 0; k < 2; k++) {
        snprintf(paths[k], sizeof(paths[k]), "/tmp/pipescope-test-clock-XXXXXX");
        int fd = mkstemp(paths[k]);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, TXT[k], strlen(TXT[k])), (ssize_t)strlen(TXT[k]));
        close(fd);
        p[k] = paths[k];
    }
    struct ps_trace t;
    struct ps_trace_read_info in;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_trace_read_files(p, 2, f.g, NULL, &t, &in, &d);
    unlink(paths[0]);
    unlink(paths[1]);
    assert_int_equal(rc, 0);
    assert_int_equal(in.n_cross_edges, 2);
    assert_true(in.clocks_inconsistent);
    assert_true(fabs(in.inconsistency_us - 4.0) < 1e-9);
    assert_true(in.files[0].skew_us == 0 && in.files[1].skew_us == 0);
    ps_trace_read_info_finish(&in);
    ps_trace_finish(&t);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_fairscale_pipe),
        cmocka_unit_test(test_pytorch_pp_ranks),
        cmocka_unit_test(test_pytorch_split_backward),
        cmocka_unit_test(test_hta_gpu_attribution),
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_clocks_contradict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
