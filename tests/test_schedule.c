/* Tests of the schedule table (src/schedule.c, src/sched/, src/plan.c): the generated action lists, the
 * graphs they build (validated by analysis.c's checks), the execution order, hand-written plans
 * and deadlock reports, and the optimizer step.
 *
 * Note on analysis.c's backward-order check (I2): on GPipe it states the engine's descending
 * order; on a plan it holds each stage to the direction its first two backwards take (1F1B-style
 * schedules ascend, LoopedBFS descends); test_backward_promise checks both and a stage that
 * breaks its own direction.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>

#include "src/analysis.h"
#include "src/file.h"
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
    /* ZB-H1 as in Qi et al. (ICLR 2024) and PyTorch's zero-bubble schedules: rank r runs
       D - r forwards, then lets r backwards pass before running one W after every B (the W of
       its oldest pending micro-batch); so a micro-batch's activations live from F to W and no
       rank holds more than D of them, whatever m */
    assert_string_equal(s, "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
    plan_str(&p, 1, s, sizeof(s));
    assert_string_equal(s, "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
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
    assert_int_equal(ps_plan_parse("{\"stages\":[[\"F0\",\"F1\",\"B0\",\"B1\"],"
                                            "[\"F0\",\"B0\",\"F1\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    struct ps_graph *g = NULL;
    assert_int_equal(ps_plan_build(f.spec, f.model, &o, &p, &g, &d), 0);
    struct ps_order ord;
    assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_plan_finish(&p);
    /* a deadlock: stage 1 runs F1 before F0, stage 0 waits for B0 before sending F1 */
    assert_int_equal(ps_plan_parse("{\"stages\":[[\"F0\",\"B0\",\"F1\",\"B1\"],"
                                            "[\"F1\",\"F0\",\"B0\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    assert_int_equal(ps_plan_build(f.spec, f.model, &o, &p, &g, &d), 0);
    ps_diag_clear(&d);
    assert_int_equal(ps_schedule_order(g, &ord, &d), -EDEADLK);
    char *stuck = ps_plan_stuck(g, &ord);
    assert_non_null(stuck);
    assert_string_equal(stuck, "stage 0: B(0,0) (action 1) waits for B(0,1)\n"
                               "stage 1: F(1,1) (action 0) waits for F(1,0)\n");
    free(stuck);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_plan_finish(&p);
    /* bad plans */
    ps_diag_clear(&d);
    assert_int_equal(ps_plan_parse("{\"stages\":[[\"F0\"]]}", "a.json", f.spec, &p, &d),
                     -EINVAL);
    ps_diag_clear(&d);
    assert_int_equal(ps_plan_parse("{\"stages\":[[\"F0\",\"X1\"],[]]}", "a.json", f.spec,
                                            &p, &d),
                     -EINVAL);
    assert_non_null(strstr(d.msg, "stages[0][1]"));
    ps_diag_clear(&d);
    assert_int_equal(ps_plan_parse("{\"stages\":[[\"F0\",\"F1\",\"B0\"],"
                                            "[\"F0\",\"B0\",\"F1\",\"B1\"]]}",
                                            "a.json", f.spec, &p, &d),
                     0);
    assert_int_equal(ps_plan_build(f.spec, f.model, &o, &p, &g, &d), -EINVAL);
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
    /* the same variant with the optimizer: the same nodes, then one step per partition */
    struct ps_variant ov;
    ps_variant_from_spec(f.spec, &ov);
    ov.optimizer = true;
    ps_graph_destroy(f.g);
    f.g = NULL;
    assert_int_equal(ps_schedule_build(f.spec, f.model, &ov, &f.g, &d), 0);
    assert_int_equal(f.g->n_nodes, n0 + 2);
    assert_int_equal(ps_graph_validate(f.g, &d), 0);
    assert_int_equal(ps_schedule_order(f.g, &f.o, &d), 0);
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

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

/* Per-rank orders of the PyTorch-defined schedules against tests/golden/sched: the CSVs that
 * gen_sched.py writes from its reading of torch/distributed/pipelining/schedules.py, itself
 * checked against two of PyTorch's own artifacts (DualPipeV 4 ranks m=10, interleaved zero bubble
 * 2x2 m=8). Each case: the generated plan written as CSV equals the file byte for byte, the file
 * read back writes the same bytes, and the graph runs every node (no deadlock). */
static void test_pytorch_orders(void **state)
{
    (void)state;
    char dir[1024], path[1400];
    const char *root = getenv("PS_SOURCE_ROOT");
    snprintf(dir, sizeof(dir), "%s/tests/golden/sched", root ? root : ".");
    snprintf(path, sizeof(path), "%s/cases.txt", dir);
    FILE *idx = fopen(path, "r");
    assert_non_null(idx);
    char name[64], file[256];
    int p, v, m, n = 0;
    while (fscanf(idx, "%63s %d %d %d %255s", name, &p, &v, &m, file) == 5) {
        bool vee = strcmp(name, "zb-v") == 0 || strcmp(name, "dualpipe-v") == 0;
        int S = vee ? 2 * p : p * v;
        struct fx f;
        struct ps_diag d;
        int rc = fx_load(&f, name, m, S, vee ? 1 : v, "never", "plain", &d);
        if (rc) fprintf(stderr, "%s: %s: %s\n", file, d.where, d.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(f.o.n, f.g->n_nodes);
        struct ps_variant o;
        ps_variant_from_spec(f.spec, &o);
        struct ps_plan plan, back;
        assert_int_equal(ps_schedule_plan(f.spec, &o, &plan, &d), 0);
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        char *want = slurp(path), *got = ps_plan_csv(&plan);
        assert_non_null(want);
        if (strcmp(got, want) != 0) fprintf(stderr, "%s:\n got  %s\n want %s\n", file, got, want);
        assert_string_equal(got, want);
        rc = ps_plan_load(path, f.spec, &back, &d);
        if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
        assert_int_equal(rc, 0);
        char *again = ps_plan_csv(&back);
        assert_string_equal(again, want);
        free(want), free(got), free(again);
        ps_plan_finish(&plan);
        ps_plan_finish(&back);
        fx_free(&f);
        n++;
    }
    fclose(idx);
    assert_true(n >= 100);
}

/* The programs PyTorch's own code computes (tests/golden/sched/pytorch/<name>.txt.gz, written by
 * gen_sched_pytorch.py from the real schedules.py with its imports stubbed: pipeline_order for
 * the multi-stage classes, the recorded _step_microbatches loop for ScheduleGPipe and
 * Schedule1F1B), p 2..8, v 1..4, m 1..4pv. Every case PyTorch builds equals pipescope's program
 * action for action; every case a PyTorch constructor refuses is one pipescope warns about
 * (ps_schedule_pytorch_note) or refuses itself. */
static int compare_case(const char *name, int p, int v, int m, const char *rows, bool refused,
                        int *warned)
{
    bool vee = strcmp(name, "zb-v") == 0 || strcmp(name, "dualpipe-v") == 0;
    /* PyTorch's interleaved zero bubble at one stage per rank is pipescope's zb-h1 */
    const char *ps = strcmp(name, "interleaved-zb") == 0 && v == 1 ? "zb-h1" : name;
    int S = p * v;
    struct fx f;
    struct ps_diag d;
    int rc = fx_load(&f, ps, m, S, vee ? 1 : v, "never", "plain", &d);
    if (refused) {
        char note[512];
        int k = rc == 0 ? ps_schedule_pytorch_note(f.spec->schedule, S, m, vee ? 2 : v,
                                                   note, sizeof(note))
                        : 0;
        fx_free(&f);
        if (rc == 0 && k == 1) (*warned)++;
        if (rc != 0 || k == 1) return 0;
        fprintf(stderr, "%s p=%d v=%d m=%d: PyTorch refuses it, pipescope runs it silently\n",
                name, p, v, m);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "%s p=%d v=%d m=%d: %s: %s\n", name, p, v, m, d.where, d.msg);
        fx_free(&f);
        return 1;
    }
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    struct ps_plan plan;
    int bad = 1;
    if (ps_schedule_plan(f.spec, &o, &plan, &d) == 0) {
        char *got = ps_plan_csv(&plan);
        for (char *c = got; *c; c++)
            if (*c == ',') *c = ' ';
        bad = strcmp(got, rows) != 0;
        if (bad) fprintf(stderr, "%s p=%d v=%d m=%d:\n got  %s want %s", name, p, v, m, got, rows);
        free(got);
        ps_plan_finish(&plan);
    }
    fx_free(&f);
    return bad;
}

static void test_pytorch_source_orders(void **state)
{
    (void)state;
    static const char *names[] = {"pytorch-gpipe", "1f1b", "looped-bfs", "interleaved-1f1b",
                                  "interleaved-zb", "zb-v", "dualpipe-v"};
    const char *root = getenv("PS_SOURCE_ROOT");
    int cases = 0, refusals = 0, warned = 0, bad = 0;
    for (size_t k = 0; k < sizeof(names) / sizeof(*names); k++) {
        char path[1200];
        snprintf(path, sizeof(path), "%s/tests/golden/sched/pytorch/%s.txt.gz", root ? root : ".",
                 names[k]);
        struct ps_file_opts fo = {.gzip = true};
        struct ps_diag d;
        char *text = NULL;
        size_t len = 0;
        int rc = ps_file_read(path, &fo, &text, &len, &d);
        if (rc) fprintf(stderr, "%s: %s\n", path, d.msg);
        assert_int_equal(rc, 0);
        char *line = text;
        while (*line) {
            char *end = strchr(line, '\n');
            assert_non_null(end);
            *end = 0;
            int p, v, m;
            if (sscanf(line, "refused p=%d v=%d m=%d:", &p, &v, &m) == 3) {
                refusals++;
                bad += compare_case(names[k], p, v, m, NULL, true, &warned);
                line = end + 1;
                continue;
            }
            assert_int_equal(sscanf(line, "case p=%d v=%d m=%d", &p, &v, &m), 3);
            /* the p rank lines that follow, joined as ps_plan_csv writes them */
            char *rows = end + 1, *r = rows;
            for (int i = 0; i < p; i++) {
                char *e = strchr(r, '\n');
                assert_non_null(e);
                r = e + 1;
            }
            char save = *r;
            *r = 0;
            bad += compare_case(names[k], p, v, m, rows, false, &warned);
            *r = save;
            cases++;
            line = r;
        }
        free(text);
    }
    fprintf(stderr, "PyTorch's schedules: %d programs compared, %d refusals (%d warned), %d differ\n",
            cases, refusals, warned, bad);
    assert_true(cases >= 3000);
    assert_int_equal(bad, 0);
}

/* PyTorch's own artifacts read as schedules: idle cells skipped, the graph runs */
static void test_pytorch_artifacts(void **state)
{
    (void)state;
    static const struct {
        const char *file, *sched;
        int S, m;
    } art[] = {{"pytorch_dualpipev_4rank_10mb.csv", "dualpipe-v", 8, 10},
               {"pytorch_zb1p_2rank_2stagep_compute.csv", "interleaved-zb", 4, 8}};
    for (size_t k = 0; k < sizeof(art) / sizeof(*art); k++) {
        char path[1200];
        const char *root = getenv("PS_SOURCE_ROOT");
        snprintf(path, sizeof(path), "%s/tests/golden/sched/%s", root ? root : ".", art[k].file);
        struct fx f;
        struct ps_diag d;
        assert_int_equal(fx_load(&f, art[k].sched, art[k].m, art[k].S, 2, "never", "plain", &d), 0);
        struct ps_plan plan;
        int rc = ps_plan_load(path, f.spec, &plan, &d);
        if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
        assert_int_equal(rc, 0);
        struct ps_graph *g = NULL;
        struct ps_variant o;
        ps_variant_from_spec(f.spec, &o);
        assert_int_equal(ps_plan_build(f.spec, f.model, &o, &plan, &g, &d), 0);
        struct ps_order ord;
        assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
        assert_int_equal(ord.n, g->n_nodes);
        ps_order_finish(&ord);
        ps_graph_destroy(g);
        ps_plan_finish(&plan);
        fx_free(&f);
    }
}

/* the CSV reader's errors and what it skips, each worked out from the rule */
static void test_csv_errors(void **state)
{
    (void)state;
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "1f1b", 2, 2, 1, "never", "plain", &d), 0);
    struct ps_plan p;
    static const struct {
        const char *csv, *msg;
    } bad[] = {
        {"0F0,0X1\n1F0\n", "rank 0, step 1: \"0X1\" is not an action (expected e.g. 2F0, 1I3, 0W1, 3B2 "
                           "or (0F7;7B3)OVERLAP_F_B)"},
        {"0F0,2F0\n", "rank 0, step 1: stage 2, but the spec has 2 partitions (stages 0..1)"},
        {"0F0,0F2\n", "rank 0, step 1: micro-batch 2, but the spec runs 2 micro-batches (0..1)"},
        {"0F0,0F1,0I0,0I1,0W0\n1F0,1F1,1B0,1B1\n",
         "stage 0: 0I1 (input gradient) has no 0W1 (weight gradient)"},
        {"0F0,0F1,0B0,0B1,0W0\n1F0,1F1,1B0,1B1\n",
         "stage 0: 0B0 is a full backward, so 0W0 cannot also appear (write 0I0 for the input "
         "gradient alone)"},
        {"0F0\n1F0\n0F1\n", "3 rows (ranks), but the spec has only 2 partitions (stages)"},
        {"\n\n", "no rows: expected one row per rank"},
        {"(0F0;1B0)OVERLAP\n", "rank 0, step 0: \"(0F0;1B0)OVERLAP\" is not an action (expected e.g. "
                               "2F0, 1I3, 0W1, 3B2 or (0F7;7B3)OVERLAP_F_B)"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(*bad); k++) {
        ps_diag_clear(&d);
        assert_int_equal(ps_plan_csv_parse(bad[k].csv, "s.csv", f.spec, &p, &d), -EINVAL);
        assert_string_equal(d.msg, bad[k].msg);
    }
    /* 1F1B on 2 stages with the lowered format's communication actions, quotes, CRLF and an idle
       cell: 7 communication actions skipped (4 on rank 0, 3 on rank 1), the compute actions kept in order */
    const char *ok = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,\"0B1\"\r\n"
                     ",1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\r\n";
    ps_diag_clear(&d);
    assert_int_equal(ps_plan_csv_parse(ok, "s.csv", f.spec, &p, &d), 0);
    assert_int_equal(p.ignored, 7);
    assert_int_equal(p.n_lanes, 2);
    char *out = ps_plan_csv(&p);
    assert_string_equal(out, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
    free(out);
    ps_plan_finish(&p);
    fx_free(&f);
}

/* I2 judges what the schedule promises: LoopedBFS's descending backwards and PyTorch's GPipe's
   ascending ones pass every check (on main LoopedBFS failed backward-order on every pair); a
   hand-written stage that starts descending (B1 B0) and then ascends (B2) fails once */
static void promise_ok(const char *sched, int m, int S, int v)
{
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, sched, m, S, v, "never", "plain", &d), 0);
    struct ps_analysis a;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.checked[PS_CHECK_BACKWARD_ORDER], (m - 1) * S);
    for (int c = 0; c < PS_CHECK__COUNT; c++) assert_int_equal(a.per_check[c], 0);
    assert_true(a.ok);
    ps_analysis_finish(&a);
    fx_free(&f);
}

static void test_backward_promise(void **state)
{
    (void)state;
    promise_ok("looped-bfs", 4, 4, 2);
    promise_ok("looped-bfs", 6, 6, 3);
    promise_ok("pytorch-gpipe", 5, 3, 1);
    struct fx f;
    struct ps_diag d;
    assert_int_equal(fx_load(&f, "1f1b", 3, 2, 1, "never", "plain", &d), 0);
    struct ps_plan p;
    assert_int_equal(ps_plan_csv_parse("0F0,0F1,0F2,0B1,0B0,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n",
                                       "s.csv", f.spec, &p, &d),
                     0);
    struct ps_variant o;
    ps_variant_from_spec(f.spec, &o);
    struct ps_graph *g = NULL;
    assert_int_equal(ps_plan_build(f.spec, f.model, &o, &p, &g, &d), 0);
    struct ps_order ord;
    assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
    struct ps_analysis a;
    assert_int_equal(ps_analysis_run(g, &ord, NULL, &a, &d), 0);
    assert_int_equal(a.checked[PS_CHECK_BACKWARD_ORDER], 4);
    assert_int_equal(a.per_check[PS_CHECK_BACKWARD_ORDER], 1);
    for (uint32_t k = 0; k < a.n_kept; k++)
        if (a.v[k].check == PS_CHECK_BACKWARD_ORDER) {
            assert_int_equal(g->nodes[a.v[k].a].part, 0);
            assert_int_equal(g->nodes[a.v[k].a].mb, 2);
        }
    ps_analysis_finish(&a);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_plan_finish(&p);
    fx_free(&f);
}

/* the configurations PyTorch's constructors raise ValueError for, worked out from their rules:
   Schedule1F1B needs m >= stages; the round-based schedules need max(1, m / ranks) to divide m */
static void test_pytorch_refusals(void **state)
{
    (void)state;
    char b[320];
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_1F1B, 4, 3, 1, b, sizeof(b)), 1);
    assert_string_equal(b, "PyTorch's Schedule1F1B refuses 3 micro-batches on 4 stages (ValueError "
                           "\"Number of microbatches (3) must be greater than or equal to the "
                           "number of stages (4).\"): this program runs in pipescope only");
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_1F1B, 4, 4, 1, b, sizeof(b)), 0);
    assert_string_equal(b, "");
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_ZBH1, 4, 9, 1, b, sizeof(b)), 1);
    assert_string_equal(b, "PyTorch's ScheduleInterleavedZeroBubble refuses 9 micro-batches on 4 "
                           "ranks: they run in rounds of max(1, m / 4) = 2, which must divide m "
                           "(ValueError); this program runs in pipescope only");
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_ZBH1, 4, 10, 1, b, sizeof(b)), 0);
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_ZBH1, 4, 7, 1, b, sizeof(b)), 0);
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_INTERLEAVED, 3, 7, 1, b, sizeof(b)), 1);
    assert_non_null(strstr(b, "ScheduleInterleaved1F1B refuses 7 micro-batches on 3 ranks"));
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_INTERLEAVED_ZB, 3, 11, 1, b, sizeof(b)), 1);
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_INTERLEAVED_ZB, 3, 9, 1, b, sizeof(b)), 0);
    /* schedules PyTorch has no such rule for, and GPipe */
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_LOOPED_BFS, 4, 9, 2, b, sizeof(b)), 0);
    assert_int_equal(ps_schedule_pytorch_note(PS_SCHED_PYTORCH_GPIPE, 4, 2, 1, b, sizeof(b)), 0);
    /* over p 2..8, m 1..4p at one stage per rank: 28 refusals of 1F1B (m < p) and, for each of the
       three round-based schedules, the m in 2p+1..4p that max(1, m / p) does not divide */
    int n1 = 0, nr = 0, want = 0;
    for (int p = 2; p <= 8; p++)
        for (int m = 1; m <= 4 * p; m++) {
            n1 += ps_schedule_pytorch_note(PS_SCHED_1F1B, p, m, 1, b, sizeof(b));
            nr += ps_schedule_pytorch_note(PS_SCHED_INTERLEAVED, p, m, 1, b, sizeof(b));
            want += m > 2 * p - 1 && m % (m / p) != 0;
        }
    assert_int_equal(n1, 28);
    assert_int_equal(nr, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1f1b_plan),
        cmocka_unit_test(test_graph_checks),
        cmocka_unit_test(test_zbh1_plan_split),
        cmocka_unit_test(test_hand_plan_and_deadlock),
        cmocka_unit_test(test_gpipe_optimizer),
        cmocka_unit_test(test_pytorch_orders),
        cmocka_unit_test(test_pytorch_source_orders),
        cmocka_unit_test(test_pytorch_artifacts),
        cmocka_unit_test(test_csv_errors),
        cmocka_unit_test(test_backward_promise),
        cmocka_unit_test(test_pytorch_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
