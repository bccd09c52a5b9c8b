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

#include <cmocka.h>

#include "sim/cost.h"
#include "sim/sim.h"
#include "src/compare.h"
#include "src/engine.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"
#include "src/trace_names.h"
#include "src/trace_read.h"
#include "src/variant.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_fairscale_pipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
