/* Tests of the simulator (sim/sim.c), the cost file (sim/cost.c), the BN update order
 * (sim/bnorder.c) and balance (sim/balance.c).
 *
 * Oracles are closed forms (SEMANTICS.md section 6) under uniform test costs and free copies:
 * GPipe and 1F1B makespan (m+n-1)(f+b), bubble (n-1)/(m+n-1); interleaved 1F1B makespan
 * m(f+b) + (D-1)(f+b)/v, i.e. bubble/ideal (D-1)/(v m); ZB-H1 below 1F1B; peak in-flight
 * micro-batches m (GPipe) and n-s on stage s (1F1B); the zero-bubble family (ZB-H1, ZB-H2, ZB-V)
 * against the paper's makespans and memory, DualPipeV and looped BFS memory. Balance: the DP
 * against brute force.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <math.h>

#include "sim/balance.h"
#include "sim/bnorder.h"
#include "sim/cost.h"
#include "tests/sim_fixture.h"

#define EPS 1e-9

static void simulate(struct fx *f, struct ps_sim *s)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_sim_opts so = {.launch_us = 0};
    int rc = ps_sim_run(f->g, &f->o, f->cost, &so, s, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
}

static void closed_form(const char *sched, int m, int n, const char *ckpt)
{
    struct fx f;
    struct ps_diag d;
    int rc = fx_load(&f, sched, m, n, 1, ckpt, "plain", &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    double fw = 1.5, bw = 2.5;
    fx_costs(&f, fw, bw, 0, 0);
    struct ps_sim s;
    simulate(&f, &s);
    assert_near(s.makespan_us, (m + n - 1) * (fw + bw), EPS);
    assert_near(s.bubble_fraction, (double)(n - 1) / (m + n - 1), EPS);
    for (int dv = 0; dv < s.n_devices; dv++) {
        assert_near(s.dev[dv].busy_us, m * (fw + bw), EPS);
        uint32_t expect = strcmp(sched, "gpipe") == 0 ? (uint32_t)m
                          : (uint32_t)(n - dv < m ? n - dv : m);
        assert_int_equal(s.dev[dv].max_in_flight, expect);
    }
    ps_sim_finish(&s);
    fx_free(&f);
}

static void test_gpipe_closed_form(void **state)
{
    (void)state;
    closed_form("gpipe", 4, 3, "never");
    closed_form("gpipe", 8, 4, "never");
    closed_form("gpipe", 1, 2, "never");
}

static void test_1f1b_closed_form(void **state)
{
    (void)state;
    closed_form("1f1b", 4, 3, "never");
    closed_form("1f1b", 8, 4, "never");
    closed_form("1f1b", 2, 4, "never");
}

static void test_interleaved_closed_form(void **state)
{
    (void)state;
    int D = 4, v = 2, m = 8;
    struct fx f;
    struct ps_diag d;
    int rc = fx_load(&f, "interleaved-1f1b", m, D * v, v, "never", "plain", &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    double fw = 1.0, bw = 2.0; /* per device for the whole model chunk pair: f/v, b/v per stage */
    fx_costs(&f, fw / v, bw / v, 0, 0);
    struct ps_sim s;
    simulate(&f, &s);
    double ideal = m * (fw + bw);
    assert_near(s.makespan_us, ideal + (D - 1) * (fw + bw) / v, EPS);
    assert_near((s.makespan_us - ideal) / ideal, (double)(D - 1) / (v * m), EPS);
    ps_sim_finish(&s);
    fx_free(&f);
    /* m not a multiple of D runs in PyTorch's rounds of max(1, m/D) micro-batches (m = 6 on 4
       devices: one round of 6); a round count that does not divide m is refused (m = 9: rounds
       of 9/4 = 2 do not divide 9), as ScheduleInterleaved1F1B refuses it */
    assert_int_equal(fx_load(&f, "interleaved-1f1b", 6, D * v, v, "never", "plain", &d), 0);
    fx_free(&f);
    assert_int_equal(fx_load(&f, "interleaved-1f1b", 9, D * v, v, "never", "plain", &d), -EINVAL);
    fx_free(&f);
}

static void test_zbh1_below_1f1b(void **state)
{
    (void)state;
    int m = 8, n = 4;
    struct fx a, b;
    struct ps_diag d;
    assert_int_equal(fx_load(&a, "1f1b", m, n, 1, "never", "plain", &d), 0);
    assert_int_equal(fx_load(&b, "zb-h1", m, n, 1, "never", "plain", &d), 0);
    fx_costs(&a, 1, 2, 0, 0);
    fx_costs(&b, 1, 1, 1, 0);
    struct ps_sim sa, sb;
    simulate(&a, &sa);
    simulate(&b, &sb);
    assert_near(sa.makespan_us, (m + n - 1) * 3.0, EPS);
    assert_true(sb.makespan_us < sa.makespan_us);
    /* the zero-bubble paper's handcrafted bound: 3m + (n-1)(F+B-W) */
    assert_near(sb.makespan_us, 3.0 * m + (n - 1) * 1.0, EPS);
    for (int dv = 0; dv < sb.n_devices; dv++) assert_true(sb.dev[dv].max_in_flight <= (uint32_t)(n - dv));
    ps_sim_finish(&sa);
    ps_sim_finish(&sb);
    fx_free(&a);
    fx_free(&b);
}

/* Every row of the schedule table with a closed form (schedule.h) against the simulator, under
 * the uniform costs the forms assume: f = b = w = 1 for all, and f = 1.5, b = 2.5 for the rows
 * whose backward is not split. The numbers the forms must give are worked by hand above (the
 * closed_form cases) and in the interleaved and ZB-H1 tests; this loop holds a new row to its
 * own form. */
static void test_table_closed_forms(void **state)
{
    (void)state;
    int checked = 0;
    for (int k = 0; k < PS_SCHED__COUNT; k++) {
        const struct ps_schedule_ops *ops = ps_schedule_ops((enum ps_schedule)k);
        assert_non_null(ops);
        assert_int_equal(ps_schedule_by_name(ops->name), k);
        if (!ops->makespan) continue;
        int vs = ops->virtual_stages ? 2 : 1, m = 8, S = 4 * vs;
        for (int c = 0; c < 2; c++) {
            struct fx f;
            struct ps_diag d;
            int rc = fx_load(&f, ops->name, m, S, vs, "never", "plain", &d);
            if (rc) fprintf(stderr, "%s: %s: %s\n", ops->name, d.where, d.msg);
            assert_int_equal(rc, 0);
            bool split = false;
            for (uint32_t v = 0; v < f.g->n_nodes; v++) split |= f.g->nodes[v].kind == PS_NODE_WGRAD;
            double fw = c ? 1.5 : 1, bw = c ? 2.5 : 1, ww = split ? 1 : 0;
            if (c && split) {
                fx_free(&f);
                continue;
            }
            fx_costs(&f, fw, bw, ww, 0);
            struct ps_sim s;
            simulate(&f, &s);
            assert_near(s.makespan_us, ops->makespan(m, S, vs, fw, bw, ww), EPS);
            checked++;
            ps_sim_finish(&s);
            fx_free(&f);
        }
    }
    assert_true(checked >= 7); /* gpipe, 1f1b and interleaved twice each, zb-h1 once */
    assert_int_equal(ps_schedule_by_name("no-such-schedule"), -1);
}

static void test_determinism_and_records(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 4, 3, 1, "except_last", "plain", &d), 0);
    f.cost = calloc(f.g->n_nodes, sizeof(double));
    assert_int_equal(ps_cost_fill(f.g, NULL, f.cost, &d), 0);
    struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(f.g, NULL)};
    struct ps_sim s1, s2;
    assert_int_equal(ps_sim_run(f.g, &f.o, f.cost, &so, &s1, &d), 0);
    assert_int_equal(ps_sim_run(f.g, &f.o, f.cost, &so, &s2, &d), 0);
    assert_int_equal(s1.trace.n, s2.trace.n);
    for (uint32_t k = 0; k < s1.trace.n; k++) {
        assert_int_equal(s1.trace.r[k].node, s2.trace.r[k].node);
        assert_int_equal(s1.trace.r[k].stream, s2.trace.r[k].stream);
        assert_true(s1.trace.r[k].start_us == s2.trace.r[k].start_us);
        assert_true(s1.trace.r[k].dur_us == s2.trace.r[k].dur_us);
    }
    /* one record per node with a stream; streams run one node at a time */
    uint32_t withs = 0;
    for (uint32_t v = 0; v < f.g->n_nodes; v++) withs += f.g->nodes[v].stream >= 0;
    assert_int_equal(s1.trace.n, withs);
    for (uint32_t a = 0; a < s1.trace.n; a++)
        for (uint32_t b = a + 1; b < s1.trace.n; b++) {
            const struct ps_trace_rec *x = &s1.trace.r[a], *y = &s1.trace.r[b];
            if (x->stream != y->stream || x->dur_us == 0 || y->dur_us == 0) continue;
            assert_true(x->start_us + x->dur_us <= y->start_us + 1e-9 ||
                        y->start_us + y->dur_us <= x->start_us + 1e-9);
        }
    /* recompute shows up and the critical path ends at the makespan */
    assert_true(s1.recompute_us > 0);
    assert_true(s1.cp_n > 2);
    assert_near(s1.end_us[s1.cp[s1.cp_n - 1]], s1.makespan_us, EPS);
    ps_sim_finish(&s1);
    ps_sim_finish(&s2);
    fx_free(&f);
}

/* A spec built here (not the fixture): one partition [linear 4->8, relu, linear 8->2], batch 4
 * in 2 micro-batches of 2, checkpoint `ckpt`, phony edges off (no depend() between micro-batches,
 * so the timelines below do not depend on how phony edges are timed). */
static void load_one_stage(struct fx *f, const char *sched, const char *ckpt)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"pipescope\":1,\"batch\":4,\"model\":{\"input\":[4],\"layers\":["
             "{\"op\":\"linear\",\"out\":8},{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":2}],"
             "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"%s\",\"balance\":[3],"
             "\"devices\":[\"cpu\"],\"chunks\":2,\"checkpoint\":\"%s\",\"phony\":false}}",
             sched, ckpt);
    struct ps_diag d;
    memset(f, 0, sizeof(*f));
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, "t.json", ".", &f->spec, &d);
    if (!rc) rc = ps_model_build(f->spec, &f->model, &d);
    struct ps_variant o;
    if (!rc) ps_variant_from_spec(f->spec, &o);
    if (!rc) rc = ps_schedule_build(f->spec, f->model, &o, &f->g, &d);
    if (!rc) rc = ps_schedule_order(f->g, &f->o, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
}

/* The launch rule (sim.h) worked by hand. One stage, m = 2, checkpoint never: the engine order
 * is F(0,0) F(1,0) loss loss' B(1,0) B(0,0), all on device 0's thread; F and B have a stream
 * (they pay the launch overhead h on the host), loss and loss' are host-only (h = 0).
 * Costs F = 0.5, B = 5, launch h = 1:
 *   F(0,0): issue 0;                     start = issue + h = 1;              end 1.5
 *   F(1,0): issue = issue(F00) + h = 1;  start = max(1 + h, end F00 1.5) = 2  (host-bound); end 2.5
 *   loss:   issue = max(issue(F10) + h) = 2; host-only, start = max(2, end F10 2.5) = 2.5
 *   loss':  issue 2, start 2.5
 *   B(1,0): issue = issue(loss') + 0 = 2; start = max(2 + h, end loss' 2.5, end F10) = 3; end 8
 *   B(0,0): issue = issue(B10) + h = 3;  start = max(3 + h, end B10 8) = 8 (device-bound); end 13
 * makespan 13. Without the node's own launch in its start, every start moves 1 earlier (12). */
static void test_launch_timeline(void **state)
{
    (void)state;
    struct fx f;
    load_one_stage(&f, "gpipe", "never");
    fx_costs(&f, 0.5, 5, 0, 0);
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_sim_opts so = {.launch_us = 1};
    struct ps_sim s;
    assert_int_equal(ps_sim_run(f.g, &f.o, f.cost, &so, &s, &d), 0);
    const uint32_t F0 = f.g->fwd[0], F1 = f.g->fwd[1], B0 = f.g->bwd[0], B1 = f.g->bwd[1];
    assert_near(s.start_us[F0], 1, EPS);
    assert_near(s.end_us[F0], 1.5, EPS);
    assert_near(s.start_us[F1], 2, EPS);
    assert_near(s.start_us[f.g->loss], 2.5, EPS);
    assert_near(s.start_us[B1], 3, EPS);
    assert_near(s.end_us[B1], 8, EPS);
    assert_near(s.start_us[B0], 8, EPS);
    assert_near(s.makespan_us, 13, EPS);
    ps_sim_finish(&s);
    /* free kernels: the host alone sets the pace, one h per streamed node of the thread's chain
       F00 F10 B10 B00, each starting h after its issue: 1, 2, 3, 4 */
    fx_costs(&f, 0, 0, 0, 0);
    assert_int_equal(ps_sim_run(f.g, &f.o, f.cost, &so, &s, &d), 0);
    assert_near(s.start_us[F0], 1, EPS);
    assert_near(s.start_us[F1], 2, EPS);
    assert_near(s.start_us[B1], 3, EPS);
    assert_near(s.start_us[B0], 4, EPS);
    assert_near(s.makespan_us, 4, EPS);
    ps_sim_finish(&s);
    fx_free(&f);
}

/* Recompute statistics in closed form (sim.h: overhead = R / (F + B), share = R / (R + B)) under
 * uniform costs F = f, B = b, R = r, free copies: every (i,j) runs one F and one B, and with
 * except_last every micro-batch but the last is recomputed on each of the n partitions, with
 * always all m are. So overhead = k r / (m (f + b)) and share = k r / (k r + m b), k the
 * recomputed micro-batches: always 3 r / (3 (f+b)) = 1 / 4 = 25%; except_last (m = 4, k = 3):
 * 3 / 16 = 18.75%, share 3 / 13. */
static void test_recompute_closed_form(void **state)
{
    (void)state;
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int q = 0; q < 2; q++)
        for (int al = 0; al < 2; al++) {
            int m = al ? 3 : 4, n = 3, k = al ? m : m - 1;
            double fw = 1.5, bw = 2.5, rw = 1;
            struct fx f;
            struct ps_diag d;
            assert_int_equal(
                fx_load(&f, scheds[q], m, n, 1, al ? "always" : "except_last", "plain", &d), 0);
            fx_costs(&f, fw, bw, 0, rw);
            struct ps_sim s;
            simulate(&f, &s);
            assert_near(s.recompute_us, k * n * rw, EPS);
            assert_near(s.forward_us, m * n * fw, EPS);
            assert_near(s.backward_us, m * n * bw, EPS);
            assert_near(s.recompute_overhead, k * rw / (m * (fw + bw)), EPS);
            assert_near(s.recompute_share, k * rw / (k * rw + m * bw), EPS);
            assert_near(s.recompute_overhead, al ? 0.25 : 0.1875, EPS);
            ps_sim_finish(&s);
            fx_free(&f);
        }
}

static void test_stream_order_edges(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "gpipe", 3, 2, 1, "except_last", "plain", &d), 0);
    fx_costs(&f, 1, 2, 0, 1);
    struct ps_sim s1, s2;
    simulate(&f, &s1);
    uint32_t e0 = f.g->n_edges;
    assert_int_equal(ps_graph_add_stream_order(f.g, &f.o), 0);
    assert_true(f.g->n_edges > e0);
    assert_int_equal(ps_graph_validate(f.g, &d), 0);
    simulate(&f, &s2); /* the stream edges agree with the order: same timeline */
    assert_near(s1.makespan_us, s2.makespan_us, EPS);
    ps_sim_finish(&s1);
    ps_sim_finish(&s2);
    fx_free(&f);
}

static void check_bn(const char *sched, const char *ckpt, const char *bn, const char *expect)
{
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, sched, 3, 2, 1, ckpt, bn, &d), 0);
    fx_costs(&f, 1, 2, 0, 1);
    struct ps_sim s;
    simulate(&f, &s);
    struct ps_bn_order b;
    assert_int_equal(ps_bn_order_build(f.g, &f.o, s.start_us, f.spec->batchnorm, &b), 0);
    assert_int_equal(b.n_layers, 2);
    char got[256] = "";
    for (uint32_t k = 0; k < b.layers[0].n; k++) {
        char x[16];
        snprintf(x, sizeof(x), "%s%c%d", k ? " " : "",
                 b.layers[0].u[k].phase == PS_BN_RECOMPUTE ? 'r' : 'f', b.layers[0].u[k].mb);
        strcat(got, x);
    }
    assert_string_equal(got, expect);
    ps_bn_order_finish(&b);
    ps_sim_finish(&s);
    fx_free(&f);
}

static void test_bn_order(void **state)
{
    (void)state;
    /* SEMANTICS.md section 7, m = 3 */
    check_bn("gpipe", "never", "plain", "f0 f1 f2");
    check_bn("gpipe", "always", "plain", "f0 f1 f2 r2 r1 r0");
    check_bn("gpipe", "except_last", "plain", "f0 f1 f2 r1 r0");
    check_bn("gpipe", "except_last", "deferred", "f2");
    check_bn("gpipe", "always", "grad-only", "r2 r1 r0");
    check_bn("gpipe", "except_last", "grad-only", "f2 r1 r0");
    /* 1F1B on 2 stages: stage 0 runs F0 F1 B0 F2 B1 B2 */
    check_bn("1f1b", "except_last", "plain", "f0 f1 r0 f2 r1");
}

static void test_costs_file(void **state)
{
    (void)state;
    struct ps_diag d;
    struct ps_costs *c = NULL;
    const char *ok = "{\"pipescope_costs\":1,\"unit\":\"sample\",\"layers\":["
                     "{\"forward_us\":1,\"backward_us\":2},{\"forward_us\":0.5,\"backward_us\":0.5},"
                     "{\"forward_us\":1,\"backward_us\":2,\"wgrad_us\":1},{\"forward_us\":0,\"backward_us\":0}],"
                     "\"copy\":{\"bandwidth\":1e9,\"latency_us\":3},\"launch_overhead_us\":0}";
    ps_diag_clear(&d);
    assert_int_equal(ps_costs_parse(ok, "c.json", &c, &d), 0);
    struct fx f;
    assert_int_equal(fx_load(&f, "gpipe", 2, 2, 1, "never", "plain", &d), 0);
    f.cost = calloc(f.g->n_nodes, sizeof(double));
    assert_int_equal(ps_cost_fill(f.g, c, f.cost, &d), 0);
    assert_near(ps_cost_launch_us(f.g, c), 0, EPS);
    /* F(0,0): 2 samples x (1 + 0.5) us; B(0,1): 2 x 2 us; copies: bytes/1e9 + 3 us */
    assert_near(f.cost[f.g->fwd[0]], 3.0, EPS);
    assert_near(f.cost[f.g->bwd[1]], 4.0, EPS);
    for (uint32_t v = 0; v < f.g->n_nodes; v++)
        if (f.g->nodes[v].kind == PS_NODE_COPY)
            assert_near(f.cost[v], f.g->nodes[v].bytes / 1e9 * 1e6 + 3, EPS);
    ps_costs_destroy(c);
    /* wrong layer count is refused when filling */
    const char *three = "{\"pipescope_costs\":1,\"unit\":\"micro_batch\",\"micro_batch_size\":2,"
                        "\"layers\":[{\"forward_us\":1,\"backward_us\":2}]}";
    assert_int_equal(ps_costs_parse(three, "c.json", &c, &d), 0);
    ps_diag_clear(&d);
    assert_int_equal(ps_cost_fill(f.g, c, f.cost, &d), -EINVAL);
    ps_costs_destroy(c);
    ps_diag_clear(&d);
    assert_int_equal(ps_costs_parse("{\"pipescope_costs\":1,\"unit\":\"x\"}", "c.json", &c, &d),
                     -EINVAL);
    ps_diag_clear(&d);
    assert_int_equal(ps_costs_parse("{\"pipescope_costs\":1,\"unit\":\"sample\",\"layers\":[{\"forward_us\":-1,\"backward_us\":0}]}",
                                    "c.json", &c, &d),
                     -EINVAL);
    assert_non_null(strstr(d.msg, "layers[0].forward_us"));
    fx_free(&f);
}

/* ---- balance -------------------------------------------------------------------------------- */

static double brute(const double *c, int L, int P, int k, int start, int *bal, double cur,
                    double best)
{
    if (k == P - 1) {
        double s = 0;
        for (int i = start; i < L; i++) s += c[i];
        double v = s > cur ? s : cur;
        return v < best ? v : best;
    }
    for (int len = 1; start + len <= L - (P - k - 1); len++) {
        double s = 0;
        for (int i = start; i < start + len; i++) s += c[i];
        bal[k] = len;
        best = brute(c, L, P, k + 1, start + len, bal, s > cur ? s : cur, best);
    }
    return best;
}

static void test_balance_dp_vs_brute(void **state)
{
    (void)state;
    unsigned seed = 12345;
    for (int trial = 0; trial < 300; trial++) {
        seed = seed * 1103515245u + 12345u;
        int L = 1 + (int)((seed >> 16) % 9);
        seed = seed * 1103515245u + 12345u;
        int P = 1 + (int)((seed >> 16) % (unsigned)L);
        double c[16];
        for (int i = 0; i < L; i++) {
            seed = seed * 1103515245u + 12345u;
            c[i] = (double)((seed >> 16) % 100) / 7.0;
        }
        int bal[16], tmp[16];
        double mx = 0;
        assert_int_equal(ps_balance_exact(c, NULL, 0, L, P, bal, &mx), 0);
        double want = brute(c, L, P, 0, 0, tmp, 0, 1e300);
        assert_near(mx, want, 1e-9);
        int sum = 0;
        for (int p = 0; p < P; p++) {
            assert_true(bal[p] >= 1);
            sum += bal[p];
        }
        assert_int_equal(sum, L);
        assert_near(ps_balance_max(c, L, bal, P), mx, 1e-9);
        /* the heuristic is never better than the optimum */
        assert_int_equal(ps_balance_blockpartition(c, L, P, tmp), 0);
        sum = 0;
        for (int p = 0; p < P; p++) sum += tmp[p];
        assert_int_equal(sum, L);
        assert_true(ps_balance_max(c, L, tmp, P) >= mx - 1e-9);
    }
    /* a memory cap that forbids the time optimum */
    double t[4] = {1, 1, 1, 3}, mem[4] = {5, 1, 1, 1};
    int bal[2];
    double mx;
    assert_int_equal(ps_balance_exact(t, mem, 5, 4, 2, bal, &mx), 0);
    assert_int_equal(bal[0], 1);
    assert_near(mx, 5, 1e-9);
    assert_int_equal(ps_balance_exact(t, mem, 4, 4, 2, bal, &mx), -ENOSPC);
    assert_int_equal(ps_balance_exact(t, NULL, 0, 4, 5, bal, &mx), -EINVAL);
}

/* makespan and per-device peak activation bytes of a schedule under uniform costs; the peak in
 * units of what one micro-batch keeps on a stage (every partition of the fixture is the same:
 * [linear 4->4, batchnorm] keeps its input and the batchnorm's, 2 x 16 B per sample; F(0,0) of the
 * first stage keeps exactly that). The stage boundary tensor (a stage's input arriving from the
 * previous device before its F runs, or the last stage's output until its loss at the end of F)
 * is 16 B per sample: half a unit (src/model.c "Activation memory"). */
static double zb_run(const char *sched, int m, int S, int v, double fw, double bw, double ww,
                     double *peak, int *ndev)
{
    struct fx f;
    struct ps_diag d;
    int rc = fx_load(&f, sched, m, S, v, "never", "plain", &d);
    if (rc) fprintf(stderr, "%s m=%d: %s\n", sched, m, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(f.o.n, f.g->n_nodes); /* no deadlock */
    fx_costs(&f, fw, bw, ww, 0);
    struct ps_sim s;
    simulate(&f, &s);
    double a = (double)f.g->nodes[f.g->fwd[0]].act_bytes;
    for (int k = 0; k < s.n_devices; k++) peak[k] = (double)s.dev[k].peak_bytes / a;
    *ndev = s.n_devices;
    double ms = s.makespan_us;
    ps_sim_finish(&s);
    fx_free(&f);
    return ms;
}

/* ZB-H1 (Qi et al. 2024): makespan m(F+B+W) + (p-1)(F+B-W) (the paper's handcrafted schedule,
 * W no longer than F or B); peak activation memory: the first device holds p micro-batches at
 * its peak, exactly as in 1F1B, for every m, and no device holds more; later devices keep the
 * W-half (the linear layers' inputs, half of the fixture's saved bytes) of up to r micro-batches
 * beyond 1F1B's, because rank r lets r backwards pass before its first W, plus at most one
 * boundary tensor (half a unit). In 1F1B rank k > 0 peaks at p-k micro-batches and the input of
 * the next one, which the previous rank sent during warm-up (the last rank: its output before the
 * loss). */
static void test_zbh1_memory_and_closed_form(void **state)
{
    (void)state;
    int p = 4, nd;
    double one[8], zb[8], first[8];
    static const double cost[][3] = {{1, 1, 1}, {2, 2, 1}, {1, 2, 1}};
    for (int m = 4; m <= 32; m *= 2) {
        zb_run("1f1b", m, p, 1, 2, 2, 0, one, &nd);
        for (size_t c = 0; c < 3; c++) {
            double F = cost[c][0], B = cost[c][1], W = cost[c][2];
            double ms = zb_run("zb-h1", m, p, 1, F, B, W, zb, &nd);
            assert_near(ms, m * (F + B + W) + (p - 1) * (F + B - W), EPS);
        }
        assert_near(zb[0], one[0], EPS);
        assert_near(zb[0], (double)p, EPS);
        for (int k = 1; k < nd; k++) assert_near(one[k], (p - k) + 0.5, EPS);
        for (int k = 0; k < nd; k++) {
            assert_true(zb[k] <= one[0] + EPS);
            double kept = (p - k) + 0.5 * k; /* rank k: p-k whole, k W-halves */
            if (zb[k] < kept - EPS || zb[k] > kept + 0.5 + EPS)
                fail_msg("zb-h1 m=%d rank %d: peak %g units, expected %g (+ at most 0.5)", m, k,
                         zb[k], kept);
            if (m > 4) assert_near(zb[k], first[k], EPS); /* does not grow with m */
            first[k] = zb[k];
        }
    }
}

/* ZB-H2: 2p-1 micro-batches alive on the first device (the paper's (2p-1) M_B) and a makespan
 * m(F+B+W) + (p-1) max(F, F+B-2W): the paper's bubble (p-1)(F+B-2W) when B >= 2W, and below
 * that the synchronised lower bound (the last device cannot start before (p-1)F and then never
 * idles; the paper's zero bubble at F = B = W needs consecutive iterations to overlap, which one
 * synchronised iteration cannot show). ZB-H2 never takes longer than ZB-H1. */
static void test_zbh2_closed_form(void **state)
{
    (void)state;
    int p = 4, nd;
    double pk[8], pk1[8];
    static const double cost[][3] = {{1, 1, 1}, {2, 2, 1}, {1, 2, 1}, {1, 3, 1}, {1, 4, 1}};
    for (int m = 2 * p; m <= 4 * p; m += p)
        for (size_t c = 0; c < 5; c++) {
            double F = cost[c][0], B = cost[c][1], W = cost[c][2];
            double ms = zb_run("zb-h2", m, p, 1, F, B, W, pk, &nd);
            double bubble = F + B - 2 * W > F ? F + B - 2 * W : F;
            assert_near(ms, m * (F + B + W) + (p - 1) * bubble, EPS);
            double h1 = zb_run("zb-h1", m, p, 1, F, B, W, pk1, &nd);
            assert_true(ms <= h1 + EPS);
            assert_near(pk[0], 2.0 * p - 1, EPS);
            for (int k = 0; k < nd; k++) assert_true(pk[k] <= 2.0 * p - 1 + EPS);
        }
}

/* The V schedules (two stages per device, rank r holds stages r and 2p-1-r) and looped BFS,
 * with one forward's activations of one stage as the unit:
 *  ZB-V in unit time reaches the synchronised lower bound 6m + (p-1) (each rank has 2 stages x 3
 *  passes x m of work, the last rank starts at p-1), holding at most 2p stage activations per
 *  rank: 1F1B's first-device peak (p micro-batches of the device's two stages), and half a unit
 *  of a boundary tensor;
 *  DualPipeV holds at most 2p+1 (one more, in the last rank's first forward+backward) and half a
 *  unit of a boundary tensor;
 *  looped BFS runs every forward of both stages first, so each rank holds v m, and the last rank,
 *  whose second stage is the model's last, also its last output until the loss: half a unit. */
static void test_v_and_bfs_memory(void **state)
{
    (void)state;
    int p = 4, nd;
    double pk[8];
    for (int m = 2 * p; m <= 4 * p; m += 2 * p) {
        double ms = zb_run("zb-v", m, 2 * p, 1, 1, 1, 1, pk, &nd);
        assert_int_equal(nd, p);
        assert_near(ms, 6.0 * m + (p - 1), EPS);
        for (int k = 0; k < nd; k++) assert_true(pk[k] <= 2.0 * p + 0.5 + EPS);
        zb_run("dualpipe-v", m, 2 * p, 1, 1, 1, 1, pk, &nd);
        assert_int_equal(nd, p);
        for (int k = 0; k < nd; k++) assert_true(pk[k] <= 2.0 * p + 1.5 + EPS);
        zb_run("looped-bfs", m, 2 * p, 2, 1, 2, 0, pk, &nd);
        for (int k = 0; k < nd; k++) assert_near(pk[k], 2.0 * m + (k == nd - 1 ? 0.5 : 0), EPS);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpipe_closed_form),
        cmocka_unit_test(test_1f1b_closed_form),
        cmocka_unit_test(test_interleaved_closed_form),
        cmocka_unit_test(test_zbh1_below_1f1b),
        cmocka_unit_test(test_zbh1_memory_and_closed_form),
        cmocka_unit_test(test_zbh2_closed_form),
        cmocka_unit_test(test_v_and_bfs_memory),
        cmocka_unit_test(test_table_closed_forms),
        cmocka_unit_test(test_determinism_and_records),
        cmocka_unit_test(test_launch_timeline),
        cmocka_unit_test(test_recompute_closed_form),
        cmocka_unit_test(test_stream_order_edges),
        cmocka_unit_test(test_bn_order),
        cmocka_unit_test(test_costs_file),
        cmocka_unit_test(test_balance_dp_vs_brute),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
