/* Tests of the device wait plan (src/waits.c) and of the simulated GPU timeline it gives
 * (sim/sim.c), against timelines worked out by hand from SEMANTICS.md sections 2, 3 and 5:
 * phony and host edges order issue only, a wait node waits for the last entry of the stream it
 * names, a copy is a two-way barrier, and backward real gradients across streams get the
 * engine's sync. Launch overhead is 0 in every case here, so the host issues everything at
 * t = 0 and the device rules alone make the timeline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "src/analysis.h"
#include "src/waits.h"
#include "tests/sim_fixture.h"

#define EPS 1e-9

static uint32_t node(const struct fx *f, const char *name)
{
    char b[64];
    for (uint32_t v = 0; v < f->g->n_nodes; v++)
        if (strcmp(ps_node_name(f->g, v, b, sizeof(b)), name) == 0) return v;
    print_error("no node %s\n", name);
    fail();
    return PS_NONE;
}

/* F = f[j], B = b[j], R = F of its partition, copies (both ways) = c, the rest free */
static void costs(struct fx *f, const double *fw, const double *bw, double c)
{
    free(f->cost);
    f->cost = calloc((size_t)f->g->n_nodes + 1, sizeof(double));
    for (uint32_t v = 0; v < f->g->n_nodes; v++) {
        const struct ps_node *nd = &f->g->nodes[v];
        if (nd->kind == PS_NODE_COMPUTE)
            f->cost[v] = nd->phase == PS_PHASE_FWD ? fw[nd->part] : bw[nd->part];
        else if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD)
            f->cost[v] = fw[nd->part];
        else if (nd->kind == PS_NODE_COPY)
            f->cost[v] = c;
    }
}

static void simulate(struct fx *f, struct ps_sim *s)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_sim_opts so = {.launch_us = 0};
    int rc = ps_sim_run(f->g, &f->o, f->cost, &so, s, &d);
    if (rc) print_error("%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
}

static void span(const struct fx *f, const struct ps_sim *s, const char *name, double st, double en)
{
    uint32_t v = node(f, name);
    if (!(s->start_us[v] - st <= EPS && st - s->start_us[v] <= EPS && s->end_us[v] - en <= EPS &&
          en - s->end_us[v] <= EPS)) {
        print_error("%s: [%g, %g], expected [%g, %g]\n", name, s->start_us[v], s->end_us[v], st,
                    en);
        fail();
    }
}

static bool overlap(const struct fx *f, const struct ps_sim *s, const char *a, const char *b)
{
    uint32_t u = node(f, a), v = node(f, b);
    return s->start_us[u] < s->end_us[v] && s->start_us[v] < s->end_us[u];
}

/* GPipe, m = 3, n = 2 on two devices, checkpoint always. F(.,0) = 2, F(.,1) = 3 (device 1 is
 * slower), B(.,0) = 4, B(.,1) = 6, R = F, every copy 1 (both ways).
 *
 * Forward. compute0 runs F(0,0) [0,2], F(1,0) [2,4], F(2,0) [4,6]. Wo(i,0) waits for compute0,
 * so C(i,0->1) starts when F(i,0) ends: C(0) [2,3], C(1) [4,5], C(2) [6,7]. It does NOT wait for
 * F(i-1,1) (the phony of depend() orders the host only); the old rule started C(1) at
 * F(0,1).end = 6, after F(2,0) had ended. compute1: F(0,1) [3,6] (W(0,1) waits for C(0));
 * F(1,1) [6,9] (stream order: C(1) ended at 5); F(2,1) [9,12].
 *
 * Backward, per partition R(2), B(2), R(1), B(1), R(0), B(0) (the engine order). compute1:
 * R(2,1) [12,15], B(2,1) [15,21], R(1,1) [21,24], B(1,1) [24,30], R(0,1) [30,33],
 * B(0,1) [33,39]. W'(i,1) waits for compute1, so the gradient copies run C'(2) [21,22],
 * C'(1) [30,31], C'(0) [39,40]. compute0: R(2,0) has nothing to wait for but the stream:
 * [6,8]. B(2,0) waits (Wo'(2,0)) for C'(2): [22,26]. R(1,0) does not wait for C'(1): [26,28],
 * inside B(1,1) [24,30]; B(1,0) waits for C'(1): [31,35]. R(0,0) [35,37] inside B(0,1) [33,39];
 * B(0,0) [40,44]. Makespan 44.
 */
static void test_hand_worked_timeline(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 3, 2, 1, "always", "plain", &d), 0);
    const double fw[2] = {2, 3}, bw[2] = {4, 6};
    costs(&f, fw, bw, 1);
    struct ps_sim s;
    simulate(&f, &s);
    span(&f, &s, "F(0,0)", 0, 2);
    span(&f, &s, "F(1,0)", 2, 4);
    span(&f, &s, "F(2,0)", 4, 6);
    span(&f, &s, "C(0,0->1)", 2, 3);
    span(&f, &s, "C(1,0->1)", 4, 5);
    span(&f, &s, "C(2,0->1)", 6, 7);
    span(&f, &s, "F(0,1)", 3, 6);
    span(&f, &s, "F(1,1)", 6, 9);
    span(&f, &s, "F(2,1)", 9, 12);
    span(&f, &s, "R(2,1)", 12, 15);
    span(&f, &s, "B(2,1)", 15, 21);
    span(&f, &s, "R(1,1)", 21, 24);
    span(&f, &s, "B(1,1)", 24, 30);
    span(&f, &s, "R(0,1)", 30, 33);
    span(&f, &s, "B(0,1)", 33, 39);
    span(&f, &s, "C(2,1->0)", 21, 22);
    span(&f, &s, "C(1,1->0)", 30, 31);
    span(&f, &s, "C(0,1->0)", 39, 40);
    span(&f, &s, "R(2,0)", 6, 8);
    span(&f, &s, "B(2,0)", 22, 26);
    span(&f, &s, "R(1,0)", 26, 28);
    span(&f, &s, "B(1,0)", 31, 35);
    span(&f, &s, "R(0,0)", 35, 37);
    span(&f, &s, "B(0,0)", 40, 44);
    assert_near(s.makespan_us, 44, EPS);
    /* the two overlaps the rules exist for */
    assert_true(overlap(&f, &s, "C(1,0->1)", "F(2,0)"));
    assert_true(overlap(&f, &s, "R(1,0)", "B(1,1)"));
    assert_true(overlap(&f, &s, "R(0,0)", "B(0,1)"));
    ps_sim_finish(&s);
    fx_free(&f);
}

/* The plan of GPipe m = 2, n = 2, never, entry by entry (waiter <- producer, kind), worked out
 * from the rules: forward W(i,1) waits for C(i,0->1) (the copy's barrier put it on cs[1][i]),
 * Wo(i,0) for F(i,0); backward W'(i,1) for B(i,1), Wo'(i,0) for C'(i,1->0), and that copy's
 * barrier waits for the last entry of cs[0][i], the forward C(i,0->1). W'(i,1) is the first
 * entry that runs on cs[1][i], where the forward copy's barrier was the last thing issued, so it
 * also waits for C(i,0->1) (implied by B(i,1) here, but the rule does not look). Nothing waits for
 * a phony: C(1,0->1) does not wait for F(0,1), B(0,1) not for C'(1,1->0). The GRAD producers of
 * B(i,1) (the loss, through host-only nodes: F(.,1)) are on its own stream: no wait. */
static void test_plan_2x2(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 2, 2, 1, "never", "plain", &d), 0);
    struct ps_waits w;
    assert_int_equal(ps_waits_plan(f.g, &f.o, &w, &d), 0);
    char got[1024] = "";
    for (uint32_t k = 0; k < w.n; k++)
        for (uint32_t q = w.off[k]; q < w.off[k + 1]; q++) {
            char a[64], b[64], line[160];
            snprintf(line, sizeof(line), "%s<-%s:%s ", ps_node_name(f.g, f.o.node[k], a, sizeof(a)),
                     ps_node_name(f.g, f.o.node[w.at[q]], b, sizeof(b)),
                     ps_wait_kind_name((enum ps_wait_kind)w.kind[q]));
            strcat(got, line);
        }
    assert_string_equal(
        got, "Wo(0,0)<-F(0,0):event W(0,1)<-C(0,0->1):event Wo(1,0)<-F(1,0):event "
             "W(1,1)<-C(1,0->1):event W'(1,1)<-C(1,0->1):barrier W'(1,1)<-B(1,1):event "
             "C(1,1->0)<-C(1,0->1):barrier Wo'(1,0)<-C(1,1->0):event "
             "W'(0,1)<-C(0,0->1):barrier W'(0,1)<-B(0,1):event C(0,1->0)<-C(0,0->1):barrier "
             "Wo'(0,0)<-C(0,1->0):event ");
    ps_waits_finish(&w);
    fx_free(&f);
}

/* A deliberately removed wait: W(1,1) no longer waits for cs[1][1]. Copies cost 5, so
 * C(0,0->1) runs [2,7] and C(1,0->1) [4,9]. With F(.,1) = 3: F(0,1) [7,10], F(1,1) [10,13]
 * (stream order binds). With F(.,1) = 1: F(0,1) [7,8] and F(1,1) waits for its copy: [9,10].
 * Without the wait it starts at F(0,1).end = 8 while the copy still writes its input: the
 * timeline shows the race, and the stream-race check reports C(1,0->1) -> F(1,1). */
static void test_removed_wait(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    const double fw[2] = {2, 3}, bw[2] = {4, 6};
    assert_int_equal(fx_load(&f, "gpipe", 3, 2, 1, "always", "plain", &d), 0);
    costs(&f, fw, bw, 5);
    struct ps_sim s;
    simulate(&f, &s);
    span(&f, &s, "C(0,0->1)", 2, 7);
    span(&f, &s, "F(0,1)", 7, 10);
    span(&f, &s, "C(1,0->1)", 4, 9);
    span(&f, &s, "F(1,1)", 10, 13);
    ps_sim_finish(&s);
    /* now with F(0,1) short enough for the race to show: F(.,1) = 1 */
    const double fw2[2] = {2, 1};
    costs(&f, fw2, bw, 5);
    simulate(&f, &s);
    span(&f, &s, "F(0,1)", 7, 8);
    span(&f, &s, "F(1,1)", 9, 10);
    ps_sim_finish(&s);
    uint32_t w = node(&f, "W(1,1)");
    f.g->nodes[w].wait_on = -1;
    simulate(&f, &s);
    span(&f, &s, "C(1,0->1)", 4, 9);
    span(&f, &s, "F(1,1)", 8, 9); /* starts before its input has arrived */
    ps_sim_finish(&s);
    struct ps_analysis a;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.per_check[PS_CHECK_RACE], 1);
    char n1[64], n2[64];
    for (uint32_t k = 0; k < a.n_kept; k++)
        if (a.v[k].check == PS_CHECK_RACE) {
            assert_string_equal(ps_node_name(f.g, a.v[k].a, n1, sizeof(n1)), "C(1,0->1)");
            assert_string_equal(ps_node_name(f.g, a.v[k].b, n2, sizeof(n2)), "F(1,1)");
        }
    ps_analysis_finish(&a);
    fx_free(&f);
}

/* Buffer reuse. F(i,0)'s output is read by the copy C(i,0->1) and rewritten by the recompute
 * R(i,0) of the same micro-batch. With phony edges as device waits R(i,0) waited for the
 * gradient copy and so for everything before it; now nothing orders R(2,0) (the first backward
 * work of device 0) after C(2,0->1): in the hand-worked timeline R(2,0) [6,8] overlaps
 * C(2,0->1) [6,7], so an executor that recomputes into the buffer the copy reads has a race
 * (exec_cuda.c gives recomputed boundary outputs their own buffers). For i < 2, R(i,0) comes
 * after B(i+1,0), which waits (via C'(i+1), B(i+1,1), F(i+1,1) on compute1, F(i,1), W(i,1)) for
 * C(i,0->1): ordered. */
static void test_reuse_hazard(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 3, 2, 1, "always", "plain", &d), 0);
    struct ps_waits w;
    assert_int_equal(ps_waits_plan(f.g, &f.o, &w, &d), 0);
#define POS(name) f.o.pos[node(&f, name)]
    assert_false(ps_waits_before(&w, f.g, &f.o, POS("C(2,0->1)"), POS("R(2,0)")));
    assert_true(ps_waits_before(&w, f.g, &f.o, POS("C(1,0->1)"), POS("R(1,0)")));
    assert_true(ps_waits_before(&w, f.g, &f.o, POS("C(0,0->1)"), POS("R(0,0)")));
    /* stream order and a chain of waits: F(2,1) after C(2,0->1); B(2,0) after B(2,1) */
    assert_true(ps_waits_before(&w, f.g, &f.o, POS("C(2,0->1)"), POS("F(2,1)")));
    assert_true(ps_waits_before(&w, f.g, &f.o, POS("B(2,1)"), POS("B(2,0)")));
    /* and not the other way round, nor a phony's order: F(0,1) does not precede C(1,0->1) */
    assert_false(ps_waits_before(&w, f.g, &f.o, POS("F(0,1)"), POS("C(1,0->1)")));
    assert_false(ps_waits_before(&w, f.g, &f.o, POS("B(1,1)"), POS("R(1,0)")));
#undef POS
    const double fw[2] = {2, 3}, bw[2] = {4, 6};
    costs(&f, fw, bw, 1);
    struct ps_sim s;
    simulate(&f, &s);
    assert_true(overlap(&f, &s, "R(2,0)", "C(2,0->1)"));
    ps_sim_finish(&s);
    ps_waits_finish(&w);
    fx_free(&f);
}

/* The device respects every data dependency (the independent truth the GPU test checks on a real
 * trace): for each stream node v and each producer u of a tensor it reads (DATA edges, through
 * host-only nodes) on another stream, u ends before v starts in every timing the plan allows.
 * And the plan is no stronger than SEMANTICS.md asks: phony-only orders stay open. Over GPipe and
 * 1F1B in the three checkpoint modes. */
static void data_deps(const char *sched, int m, int n, const char *ckpt, uint32_t *checked)
{
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, sched, m, n, 1, ckpt, "plain", &d), 0);
    const struct ps_graph *g = f.g;
    struct ps_waits w;
    assert_int_equal(ps_waits_plan(g, &f.o, &w, &d), 0);
    uint32_t *stack = malloc(((size_t)g->n_edges + 1) * sizeof(uint32_t));
    uint32_t *mark = calloc((size_t)g->n_nodes + 1, sizeof(uint32_t));
    for (uint32_t k = 0; k < w.n; k++) {
        uint32_t v = f.o.node[k];
        int32_t sv = g->nodes[v].stream;
        /* W1, W2 */
        for (uint32_t q = w.off[k]; q < w.off[k + 1]; q++) {
            assert_true(w.at[q] < k);
            int32_t su = g->nodes[f.o.node[w.at[q]]].stream;
            assert_true(su != sv);
            for (uint32_t r = w.off[k]; r < q; r++)
                assert_true(g->nodes[f.o.node[w.at[r]]].stream != su);
        }
        if (sv < 0) continue;
        uint32_t sp = 0;
        stack[sp++] = v;
        while (sp) {
            uint32_t y = stack[--sp];
            for (uint32_t e = g->in_off[y]; e < g->in_off[y + 1]; e++) {
                const struct ps_edge *ed = &g->edges[g->in_edge[e]];
                uint32_t u = ed->src;
                if (ed->kind != PS_EDGE_DATA || mark[u] == k + 1 || f.o.pos[u] == UINT32_MAX)
                    continue;
                mark[u] = k + 1;
                if (g->nodes[u].stream < 0) {
                    stack[sp++] = u;
                } else if (g->nodes[u].stream != sv) {
                    (*checked)++;
                    if (!ps_waits_before(&w, g, &f.o, f.o.pos[u], k)) {
                        char a[64], b[64];
                        print_error("%s %s: %s is not ordered after %s\n", sched, ckpt,
                                    ps_node_name(g, v, a, sizeof(a)),
                                    ps_node_name(g, u, b, sizeof(b)));
                        fail();
                    }
                }
            }
        }
    }
    if (strcmp(sched, "gpipe") == 0 && n > 1 && m > 1) {
        /* depend()'s phony: C(1,0->1) need not wait for F(0,1); nor B(0,1) for C'(1,1->0) */
        uint32_t f01 = f.o.pos[node(&f, "F(0,1)")], c1 = f.o.pos[node(&f, "C(1,0->1)")];
        uint32_t c1b = f.o.pos[node(&f, "C(1,1->0)")], b01 = f.o.pos[node(&f, "B(0,1)")];
        assert_false(ps_waits_before(&w, g, &f.o, f01, c1));
        assert_false(ps_waits_before(&w, g, &f.o, c1b, b01));
    }
    free(stack);
    free(mark);
    ps_waits_finish(&w);
    fx_free(&f);
}

static void test_data_deps_ordered(void **state)
{
    (void)state;
    uint32_t checked = 0;
    const char *ck[] = {"never", "except_last", "always"};
    for (int c = 0; c < 3; c++) {
        data_deps("gpipe", 4, 3, ck[c], &checked);
        data_deps("1f1b", 4, 3, ck[c], &checked);
    }
    data_deps("gpipe", 1, 2, "always", &checked);
    assert_true(checked > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_worked_timeline), cmocka_unit_test(test_plan_2x2),
        cmocka_unit_test(test_removed_wait),         cmocka_unit_test(test_reuse_hazard),
        cmocka_unit_test(test_data_deps_ordered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
