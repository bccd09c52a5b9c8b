/* Tests of the explicit-schedule builders (src/schedule.c): the generated action lists, the
 * graphs they build (validated by analysis.c's checks), the execution order, hand-written plans
 * and deadlock reports, and the GPipe optimizer helper.
 *
 * Note on analysis.c's backward-order check (I2, B(i+1,j) hb B(i,j)): it states GPipe's
 * descending backward order. 1F1B-style schedules run backward in ascending micro-batch order
 * (B(i,j) hb B(i+1,j)), so I2 and the second half of I3 fail by design on them; the tests assert
 * the ascending order instead and every other check as is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>

#include "src/analysis.h"
#include "tests/sim_fixture.h"

static void plan_str(const struct ps_plan *p, int lane, char *out, size_t len)
{
    out[0] = 0;
    for (uint32_t k = 0; k < p->len[lane]; k++) {
        char x[16];
        snprintf(x, sizeof(x), "%s%c%d", k ? " " : "", "FBW"[p->act[lane][k].kind],
                 p->act[lane][k].mb);
        strncat(out, x, len - strlen(out) - 1);
    }
}

static void test_1f1b_plan(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "1f1b", 4, 3, 1, "never", "plain", &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    struct ps_plan p;
    assert_int_equal(ps_schedule_plan(f.spec, &o, &p, &d), 0);
    char s[256];
    plan_str(&p, 0, s, sizeof(s));
    assert_string_equal(s, "F0 F1 F2 B0 F3 B1 B2 B3");
    plan_str(&p, 1, s, sizeof(s));
    assert_string_equal(s, "F0 F1 B0 F2 B1 F3 B2 B3");
    plan_str(&p, 2, s, sizeof(s));
    assert_string_equal(s, "F0 B0 F1 B1 F2 B2 F3 B3");
    ps_plan_finish(&p);
    fx_free(&f);
}

static void checks(const char *sched, int m, int n, int v, const char *ckpt)
{
    struct fx f;
    struct ps_diag d;
    int rc = fx_load(&f, sched, m, n, v, ckpt, "plain", &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(ps_graph_validate(f.g, &d), 0);
    assert_int_equal(f.o.n, f.g->n_nodes); /* every node runs */
    struct ps_analysis a;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.per_check[PS_CHECK_CYCLE], 0);
    assert_true(a.checked[PS_CHECK_FORWARD_ORDER] > 0);
    assert_int_equal(a.per_check[PS_CHECK_FORWARD_ORDER], 0);
    assert_int_equal(a.per_check[PS_CHECK_COPY_AFTER_PRODUCER], 0);
    assert_int_equal(a.per_check[PS_CHECK_COMPUTE_AFTER_WAIT], 0);
    assert_int_equal(a.per_check[PS_CHECK_RACE], 0);
    /* the ascending backward order is guaranteed by the host order */
    struct ps_hb *h = ps_hb_create(f.g);
    for (int j = 0; j < f.g->n; j++)
        for (int i = 0; i + 1 < m; i++) {
            assert_true(ps_hb(h, f.g->bwd[(size_t)i * f.g->n + j], f.g->bwd[(size_t)(i + 1) * f.g->n + j]));
            uint32_t r = f.g->rec[(size_t)i * f.g->n + j];
            if (r != PS_NONE) assert_true(ps_hb(h, r, f.g->bwd[(size_t)i * f.g->n + j]));
        }
    ps_hb_destroy(h);
    ps_analysis_finish(&a);
    fx_free(&f);
}

static void test_graph_checks(void **state)
{
    (void)state;
    checks("1f1b", 5, 3, 1, "never");
    checks("1f1b", 5, 3, 1, "except_last");
    checks("interleaved-1f1b", 4, 4, 2, "never");
    checks("interleaved-1f1b", 4, 6, 3, "always");
    checks("zb-h1", 6, 4, 1, "never");
}

static void test_zbh1_plan_split(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "zb-h1", 4, 2, 1, "never", "plain", &d), 0);
    uint32_t wg = 0;
    for (uint32_t v = 0; v < f.g->n_nodes; v++) wg += f.g->nodes[v].kind == PS_NODE_WGRAD;
    assert_int_equal(wg, 8);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    struct ps_plan p;
    assert_int_equal(ps_schedule_plan(f.spec, &o, &p, &d), 0);
    char s[256];
    plan_str(&p, 0, s, sizeof(s));
    assert_string_equal(s, "F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3");
    plan_str(&p, 1, s, sizeof(s));
    assert_string_equal(s, "F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3");
    ps_plan_finish(&p);
    fx_free(&f);
}

static void test_hand_plan_and_deadlock(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 2, 2, 1, "never", "plain", &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    struct ps_plan p;
    /* a valid hand-written plan (1F1B on 2 stages) */
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_plan_parse("{\"stages\":[[\"F0\",\"F1\",\"B0\",\"B1\"],"
                                            "[\"F0\",\"B0\",\"F1\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    struct ps_graph *g = NULL;
    assert_int_equal(ps_schedule_build_plan(f.spec, f.model, &o, &p, &g, &d), 0);
    struct ps_order ord;
    assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_plan_finish(&p);
    /* a deadlock: stage 1 runs F1 before F0, stage 0 waits for B0 before sending F1 */
    assert_int_equal(ps_schedule_plan_parse("{\"stages\":[[\"F0\",\"B0\",\"F1\",\"B1\"],"
                                            "[\"F1\",\"F0\",\"B0\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    assert_int_equal(ps_schedule_build_plan(f.spec, f.model, &o, &p, &g, &d), 0);
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_order(g, &ord, &d), -EDEADLK);
    char *stuck = ps_schedule_stuck(g, &ord);
    assert_non_null(stuck);
    assert_string_equal(stuck, "stage 0: B(0,0) (action 1) waits for B(0,1)\n"
                               "stage 1: F(1,1) (action 0) waits for F(1,0)\n");
    free(stuck);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_plan_finish(&p);
    /* bad plans */
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_plan_parse("{\"stages\":[[\"F0\"]]}", "a.json", f.spec, &p, &d),
                     -EINVAL);
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_plan_parse("{\"stages\":[[\"F0\",\"X1\"],[]]}", "a.json", f.spec,
                                            &p, &d),
                     -EINVAL);
    assert_non_null(strstr(d.msg, "stages[0][1]"));
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_plan_parse("{\"stages\":[[\"F0\",\"F1\",\"B0\"],"
                                            "[\"F0\",\"B0\",\"F1\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    assert_int_equal(ps_schedule_build_plan(f.spec, f.model, &o, &p, &g, &d), -EINVAL);
    assert_non_null(strstr(d.msg, "B1 is missing"));
    ps_plan_finish(&p);
    fx_free(&f);
}

static void test_gpipe_optimizer(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 3, 2, 1, "except_last", "plain", &d), 0);
    ps_order_finish(&f.o);
    uint32_t n0 = f.g->n_nodes;
    assert_int_equal(ps_schedule_add_optimizer(f.g), 0);
    assert_int_equal(f.g->n_nodes, n0 + 2);
    assert_int_equal(ps_graph_validate(f.g, &d), 0);
    assert_int_equal(ps_engine_order(f.g, &f.o, &d), 0);
    /* each optimizer step runs after every backward of its partition */
    for (int j = 0; j < 2; j++) {
        uint32_t opt = n0 + (uint32_t)j;
        assert_int_equal(f.g->nodes[opt].kind, PS_NODE_OPTIM);
        assert_true(f.o.pos[opt] != UINT32_MAX);
        for (int i = 0; i < 3; i++) assert_true(f.o.pos[f.g->bwd[i * 2 + j]] < f.o.pos[opt]);
    }
    fx_free(&f);
    /* explicit schedules add it themselves */
    assert_int_equal(fx_load(&f, "1f1b", 3, 2, 1, "never", "plain", &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    o.optimizer = true;
    struct ps_graph *g;
    assert_int_equal(ps_schedule_build(f.spec, f.model, &o, &g, &d), 0);
    uint32_t opts = 0;
    for (uint32_t v = 0; v < g->n_nodes; v++) opts += g->nodes[v].kind == PS_NODE_OPTIM;
    assert_int_equal(opts, 2);
    ps_graph_destroy(g);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1f1b_plan),
        cmocka_unit_test(test_graph_checks),
        cmocka_unit_test(test_zbh1_plan_split),
        cmocka_unit_test(test_hand_plan_and_deadlock),
        cmocka_unit_test(test_gpipe_optimizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
