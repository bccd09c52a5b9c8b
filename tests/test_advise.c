/* test_advise: the configuration search of `pipescope advise` (src/study/advise.c, src/advise.c)
 * against independent truth:
 *   - brute force: on a 7-layer spec with BatchNorm on 2 devices, every schedule x stages per
 *     device x chunks x checkpoint with EVERY balance (all compositions of the layers) is built
 *     here from its own JSON and simulated; per configuration the balance with the least slowest
 *     stage among those whose simulated peak fits the cap (ties: lexicographically smallest)
 *     gives the truth, and its Pareto front (computed here) must equal the search's, pruned and
 *     unpruned, with and without a binding cap (configuration by configuration: equal objectives,
 *     "no balance fits" only where none does, pruned ones beaten by a simulated point); the
 *     recommendation must be brute force's fastest point;
 *   - no front point is dominated by any feasible point, every feasible point off the front is
 *     dominated or equalled by one on it, and the pruning bounds hold at every simulated point
 *     (seed 1 and the 7-layer spec);
 *   - the same search twice gives byte-identical JSON;
 *   - the drift closed form on hand-worked numbers, and the predicted drift against `drift`'s
 *     measured var_err on seed 1 (3 training steps, chunks 2 and 8, three policies) within
 *     |predicted - measured| <= 0.05 measured + 0.001 (the bound README.md states).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/advise.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"
#include "src/study/study.h"
#include "viz/report.h"

#define L7 7
static const char *const layers7 =
    "[{\"op\":\"linear\",\"out\":256},{\"op\":\"batchnorm\",\"momentum\":0.1,\"eps\":1e-5},"
    "{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":512},{\"op\":\"batchnorm\",\"momentum\":0.1,"
    "\"eps\":1e-5},{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":4}]";

/* the spec text of one configuration, written here (not by the code under test) */
static void spec_text(char *buf, size_t len, int sched, int vs, int S, const int *bal, int chunks,
                      int ck)
{
    char b[128] = "";
    for (int j = 0; j < S; j++)
        snprintf(b + strlen(b), sizeof(b) - strlen(b), "%s%d", j ? "," : "", bal[j]);
    char v[48] = "";
    if (ps_schedule_ops((enum ps_schedule)sched)->virtual_stages)
        snprintf(v, sizeof(v), ",\"virtual_stages\":%d", vs);
    snprintf(buf, len,
             "{\"pipescope\":1,\"name\":\"adv7\",\"batch\":8,\"model\":{\"input\":[64],\"layers\":%s,"
             "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"%s\",\"balance\":[%s],\"chunks\":%d,"
             "\"checkpoint\":\"%s\",\"batchnorm\":\"plain\"%s},\"data\":{\"source\":\"synthetic\","
             "\"seed\":0},\"train\":{\"steps\":1,\"lr\":0.0},\"hardware\":{\"device\":"
             "{\"flops\":1e9,\"mem_bandwidth\":1e9,\"launch_overhead_us\":1}}}",
             layers7, ps_schedule_name((enum ps_schedule)sched), b, chunks,
             ps_checkpoint_name((enum ps_checkpoint)ck), v);
}

static char spec_path[256];

static struct ps_spec *load7(void)
{
    snprintf(spec_path, sizeof(spec_path), "/tmp/test_advise_%d.json", (int)getpid());
    int bal[2] = {4, 3};
    char text[2048];
    spec_text(text, sizeof(text), PS_SCHED_GPIPE, 1, 2, bal, 4, PS_CKPT_EXCEPT_LAST);
    FILE *f = fopen(spec_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    struct ps_spec *spec = NULL;
    struct ps_diag d;
    assert_int_equal(ps_spec_load(spec_path, &spec, &d), 0);
    return spec;
}

struct bf {
    double thr;
    int64_t peak;
    int sched, vs, chunks, ck;
    bool feasible; /* some balance fits the cap */
};

static struct bf pts[4096];
static int n_pts;

/* simulate one composition; 0 with throughput and peak (activations + 8 bytes per parameter on
 * the busiest device), -1 when it cannot run or does not run on D devices */
static int bf_sim(int sched, int vs, int S, const int *bal, int chunks, int ck, int D, double *thr,
                  int64_t *peak)
{
    char text[2048];
    spec_text(text, sizeof(text), sched, vs, S, bal, chunks, ck);
    struct ps_spec *s = NULL;
    struct ps_model *m = NULL;
    struct ps_diag d;
    int rc = -1;
    if (ps_spec_parse(text, "bf", "/tmp", &s, &d) || ps_model_build(s, &m, &d)) goto out;
    struct ps_variant v;
    ps_variant_from_spec(s, &v);
    struct ps_study_sim run;
    if (ps_study_simulate(s, m, &v, NULL, NULL, &run, &d) == 0 && run.sim.n_devices == D) {
        int64_t pb[8] = {0};
        int dev_of[8];
        for (int j = 0; j < S; j++) dev_of[j] = -1;
        for (uint32_t k = 0; k < run.g->n_nodes; k++) {
            const struct ps_node *nd = &run.g->nodes[k];
            if (nd->kind == PS_NODE_COMPUTE && nd->part >= 0 && dev_of[nd->part] < 0)
                dev_of[nd->part] = nd->device;
        }
        for (int j = 0; j < S; j++) pb[dev_of[j]] += 8 * m->parts[j].params;
        *peak = 0;
        for (int dv = 0; dv < D; dv++)
            if (run.sim.dev[dv].peak_bytes + pb[dv] > *peak) *peak = run.sim.dev[dv].peak_bytes + pb[dv];
        *thr = 8.0 / (run.sim.makespan_us * 1e-6);
        rc = 0;
    }
    ps_study_sim_finish(&run);
out:
    ps_model_destroy(m);
    ps_spec_destroy(s);
    return rc;
}

/* next composition of L into S positive parts in lexicographic order; false after the last */
static bool next_comp(int *b, int S, int L)
{
    for (int j = S - 2; j >= 0; j--) {
        int rest = 0;
        for (int k = j + 1; k < S; k++) rest += b[k];
        if (rest - 1 >= S - 1 - j) {
            b[j]++;
            rest--;
            for (int k = j + 1; k < S - 1; k++) b[k] = 1;
            b[S - 1] = rest - (S - 2 - j);
            return true;
        }
    }
    (void)L;
    return false;
}

static bool dom(const struct bf *a, const struct bf *b)
{
    return a->thr >= b->thr && a->peak <= b->peak && (a->thr > b->thr || a->peak < b->peak);
}

/* brute force: the front's (throughput, peak) pairs of every configuration's best balance.
 * Drift is left out: per (chunks, checkpoint) it is the search's closed form, tested below. */
static int brute_front(const struct ps_spec *spec, const struct ps_model *model, double cap,
                       struct bf *front, struct bf *best)
{
    int n = 0, D = 2;
    double t[L7];
    for (int k = 0; k < PS_SCHED__COUNT; k++) {
        bool virt = ps_schedule_ops((enum ps_schedule)k)->virtual_stages;
        for (int vps = 1; vps <= 4; vps *= 2) {
            int S = D * vps;
            if (S > L7 || (virt && vps == 1) || (!virt && vps == 4)) continue;
            /* chunks 8 leaves one sample per micro-batch: BatchNorm1d cannot train it */
            for (int chunks = 1; chunks <= 4; chunks *= 2) {
                ps_study_layer_time(spec, model, NULL, (double)ps_microbatch_len(8, chunks), t);
                for (int ck = 0; ck < 3; ck++) {
                    int b[8], bestb[8];
                    for (int j = 0; j < S - 1; j++) b[j] = 1;
                    b[S - 1] = L7 - (S - 1);
                    double bmx = INFINITY, bthr = 0;
                    int64_t bpk = 0;
                    bool any = false;
                    do {
                        double mx = 0;
                        for (int j = 0, l = 0; j < S; j++) {
                            double s = 0;
                            for (int q = 0; q < b[j]; q++) s += t[l++];
                            if (s > mx) mx = s;
                        }
                        if (mx > bmx * (1 + 1e-12)) continue;
                        double thr;
                        int64_t pk;
                        if (bf_sim(k, virt ? vps : 1, S, b, chunks, ck, D, &thr, &pk)) continue;
                        if (cap > 0 && (double)pk > cap) continue;
                        if (mx < bmx * (1 - 1e-12) || !any) {
                            bmx = mx;
                            bthr = thr;
                            bpk = pk;
                            memcpy(bestb, b, sizeof(b));
                            any = true;
                        }
                    } while (next_comp(b, S, L7));
                    bool runs = false;
                    if (!any) { /* does it run at all, whatever the cap? */
                        int b1[8];
                        for (int j = 0; j < S - 1; j++) b1[j] = 1;
                        b1[S - 1] = L7 - (S - 1);
                        double thr;
                        int64_t pk;
                        runs = bf_sim(k, virt ? vps : 1, S, b1, chunks, ck, D, &thr, &pk) == 0;
                    }
                    if (any || runs)
                        pts[n++] = (struct bf){bthr, bpk, k, vps, chunks, ck, any};

                }
            }
        }
    }
    int nf = 0;
    n_pts = n;
    best->thr = -1;
    for (int i = 0; i < n; i++) {
        if (!pts[i].feasible) continue;
        bool d = false;
        for (int j = 0; j < n && !d; j++) d = pts[j].feasible && dom(&pts[j], &pts[i]);
        if (d) continue;
        bool dup = false;
        for (int j = 0; j < nf; j++) dup |= front[j].thr == pts[i].thr && front[j].peak == pts[i].peak;
        if (!dup) front[nf++] = pts[i];
        if (pts[i].thr > best->thr || (pts[i].thr == best->thr && pts[i].peak < best->peak))
            *best = pts[i];
    }
    return nf;
}

/* A1 and the bounds, from the points alone */
static void check_front(const struct ps_advise *a)
{
    int nf = 0;
    for (int i = 0; i < a->n_points; i++) {
        const struct ps_advise_point *p = &a->points[i];
        if (p->status != PS_ADV_FEASIBLE) continue;
        assert_true(p->throughput <= p->bound_throughput * (1 + 1e-9));
        assert_true(p->peak_bytes >= p->bound_peak);
        if (a->memory_cap > 0) assert_true((double)p->peak_bytes <= a->memory_cap);
        bool dominated = false, covered = p->on_front;
        for (int j = 0; j < a->n_points; j++) {
            const struct ps_advise_point *q = &a->points[j];
            if (q->status != PS_ADV_FEASIBLE) continue;
            bool le = q->throughput >= p->throughput && q->peak_bytes <= p->peak_bytes &&
                      (isnan(q->drift) || isnan(p->drift) || q->drift <= p->drift);
            bool strict = le && (q->throughput > p->throughput || q->peak_bytes < p->peak_bytes ||
                                 (!isnan(q->drift) && !isnan(p->drift) && q->drift < p->drift));
            dominated |= strict;
            if (q->on_front && le) covered = true;
        }
        if (p->on_front) assert_false(dominated);
        assert_true(covered);
        nf += p->on_front;
    }
    assert_true(nf > 0);
    assert_true(a->recommended >= 0 && a->points[a->recommended].on_front);
}

static void search(const struct ps_spec *spec, const struct ps_model *model, double cap,
                   bool no_prune, struct ps_advise *a)
{
    struct ps_advise_opts o = {.memory_cap = cap, .no_prune = no_prune, .predict_drift = true};
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_study_advise(spec, model, &o, a, &d);
    if (rc) fprintf(stderr, "advise: %s\n", d.msg);
    assert_int_equal(rc, 0);
}

/* pareto.svg: the memory cap is drawn first (beneath every marker), the spec and the
   recommendation last (on top), and each entry keeps a fixed look: "your spec" always in the
   palette's fourth colour, the cap in its sixth, whichever other series are drawn */
static void check_plot(const struct ps_advise *a)
{
    char path[] = "/tmp/ps_test_pareto_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_advise_plot(a, path, &d), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char svg[1 << 20];
    size_t n = fread(svg, 1, sizeof(svg) - 1, f);
    svg[n] = 0;
    fclose(f);
    unlink(path);
    const char *leg = strstr(svg, "<g id=\"legend\">");
    assert_non_null(leg);
    const char *cap = strstr(leg, ">memory cap<"), *spec = strstr(leg, ">your spec<"),
               *front = strstr(leg, ">Pareto front");
    assert_non_null(cap);
    assert_non_null(spec);
    assert_non_null(front);
    assert_true(cap < front && front < spec);
    /* the legend line just before each name carries its colour */
    const char *want[2][2] = {{">memory cap<", "#edc948"}, {">your spec<", "#76b7b2"}};
    for (int k = 0; k < 2; k++) {
        const char *at = strstr(leg, want[k][0]), *c = NULL;
        for (const char *q = leg; (q = strstr(q, "stroke=\"#")) && q < at; q++) c = q;
        assert_non_null(c);
        assert_memory_equal(c + 8, want[k][1], 7);
    }
}

static void compare_brute(const struct ps_spec *spec, const struct ps_model *model, double cap)
{
    static struct bf front[4096];
    struct bf best = {0};
    int nf = brute_front(spec, model, cap, front, &best);
    assert_true(nf > 0);
    for (int np = 0; np < 2; np++) {
        struct ps_advise a;
        search(spec, model, cap, np == 1, &a);
        check_front(&a);
        /* 7 layers: every balance fits ADVISE_MAX_BALANCES, so the search claims exhaustive */
        assert_true(a.exhaustive);
        /* every configuration counted once: simulated (fit or over the cap), pruned by bounds,
           or cannot run (as the report prints them) */
        assert_int_equal(a.n_configs, a.n_simulated + a.n_pruned + a.n_skipped);
        printf("cap %.0f %s: %d configurations, %d simulated, %d pruned, %s; brute-force front %d "
               "points\n", cap, np ? "unpruned" : "pruned", a.n_configs, a.n_simulated, a.n_pruned,
               a.exhaustive ? "exhaustive" : "not exhaustive", nf);
        /* (throughput, peak) of the search's front, drift set aside: every brute-force front
         * pair is reached by a search front point and no search point beats brute force */
        for (int i = 0; i < nf; i++) {
            bool hit = false;
            for (int j = 0; j < a.n_points && !hit; j++)
                hit = a.points[j].status == PS_ADV_FEASIBLE &&
                      a.points[j].throughput == front[i].thr && a.points[j].peak_bytes == front[i].peak;
            if (!hit)
                fprintf(stderr, "missing %s vps %d chunks %d %s: %.3f %lld\n",
                        ps_schedule_name(front[i].sched), front[i].vs, front[i].chunks,
                        ps_checkpoint_name(front[i].ck), front[i].thr, (long long)front[i].peak);
            assert_true(hit);
        }
        for (int j = 0; j < a.n_points; j++) {
            const struct ps_advise_point *p = &a.points[j];
            if (p->status != PS_ADV_FEASIBLE) continue;
            /* a brute-force front pair is never strictly dominated by a search point */
            for (int i = 0; i < nf; i++) {
                struct bf q = {p->throughput, p->peak_bytes, 0, 0, 0, 0, true};
                assert_false(dom(&q, &front[i]));
            }
        }
        /* configuration by configuration */
        int exact = 0, proven = 0, pruned = 0, over = 0;
        for (int j = 0; j < a.n_points; j++) {
            const struct ps_advise_point *p = &a.points[j];
            if (p->policy != PS_BN_PLAIN || p->status == PS_ADV_SKIPPED) continue;
            const struct bf *t = NULL;
            for (int i = 0; i < n_pts; i++)
                if (pts[i].sched == p->schedule && pts[i].vs == p->virtual_stages &&
                    pts[i].chunks == p->chunks && pts[i].ck == (int)p->checkpoint)
                    t = &pts[i];
            assert_non_null(t);
            if (p->status == PS_ADV_FEASIBLE && p->balance_exact) {
                assert_true(t->feasible);
                assert_true(p->throughput == t->thr && p->peak_bytes == t->peak);
                exact++;
            } else if (p->status == PS_ADV_NO_BALANCE) {
                assert_false(t->feasible); /* "proven" must be true */
                proven++;
            } else if (p->status == PS_ADV_PRUNED) {
                /* its true objectives are reached or beaten by a simulated point */
                bool beaten = !t->feasible;
                for (int q = 0; q < a.n_points && !beaten; q++)
                    beaten = a.points[q].status == PS_ADV_FEASIBLE &&
                             a.points[q].throughput >= t->thr && a.points[q].peak_bytes <= t->peak;
                assert_true(beaten);
                pruned++;
            } else {
                over++;
            }
        }
        printf("  per configuration: %d equal to brute force, %d proven over the cap, %d pruned "
               "(each beaten), %d over the cap or rebalanced\n", exact, proven, pruned, over);
        const struct ps_advise_point *r = &a.points[a.recommended];
        assert_true(r->throughput == best.thr);
        assert_true(r->peak_bytes == best.peak);
        if (cap > 0) check_plot(&a);
        ps_advise_finish(&a);
    }
}

static void test_brute_force(void **state)
{
    (void)state;
    struct ps_spec *spec = load7();
    struct ps_model *model = NULL;
    struct ps_diag d;
    assert_int_equal(ps_model_build(spec, &model, &d), 0);
    compare_brute(spec, model, 0);
    /* a cap between the front's smallest and largest peak, so it binds */
    struct ps_advise a;
    search(spec, model, 0, true, &a);
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < a.n_points; i++)
        if (a.points[i].on_front) {
            if (a.points[i].peak_bytes < lo) lo = a.points[i].peak_bytes;
            if (a.points[i].peak_bytes > hi) hi = a.points[i].peak_bytes;
        }
    ps_advise_finish(&a);
    assert_true(lo < hi);
    compare_brute(spec, model, (double)(lo + hi) / 2);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    unlink(spec_path);
}

static void test_var_err_closed_form(void **state)
{
    (void)state;
    struct ps_variant v = {.schedule = PS_SCHED_GPIPE, .checkpoint = PS_CKPT_NEVER,
                           .batchnorm = PS_BN_PLAIN, .chunks = 2, .mb_count = 2, .batch = 8,
                           .mb_len = 4, .virtual_stages = 1};
    /* V = 2, a = 0.1, one step: reference 0.9 + 0.1 * 2 = 1.1; plain with 2 updates:
     * 0.81 + 0.19 * 2 = 1.19; error 0.09 / 1.1 */
    assert_true(fabs(ps_advise_var_err(2, 8, 0.1, 1, &v) - 0.09 / 1.1) < 1e-12);
    /* checkpoint always: 2 forwards + 2 recomputes = 4 updates: 0.6561 + 0.3439 * 2 */
    v.checkpoint = PS_CKPT_ALWAYS;
    assert_true(fabs(ps_advise_updates_per_step(&v) - 4) < 1e-12);
    assert_true(fabs(ps_advise_var_err(2, 8, 0.1, 1, &v) - fabs(0.6561 + 0.6878 - 1.1) / 1.1) < 1e-12);
    /* grad-only: 2 updates whatever the checkpoint */
    v.batchnorm = PS_BN_GRAD_ONLY;
    assert_true(fabs(ps_advise_var_err(2, 8, 0.1, 1, &v) - 0.09 / 1.1) < 1e-12);
    /* deferred: one commit of the biased variance 2 * 7/8: 0.9 + 0.175 = 1.075 vs 1.1 */
    v.batchnorm = PS_BN_DEFERRED;
    assert_true(fabs(ps_advise_var_err(2, 8, 0.1, 1, &v) - 0.025 / 1.1) < 1e-12);
    /* V = 1 (the running variance's start): no drift for any count */
    v.batchnorm = PS_BN_PLAIN;
    assert_true(ps_advise_var_err(1, 8, 0.1, 3, &v) < 1e-15);
}

/* front and recommendation on hand-made points: A fast, big, drifting; B slower, smaller, calm;
 * C dominated by B; D equal to B (only the first of equals is on the front); E infeasible */
static void test_front_by_hand(void **state)
{
    (void)state;
    struct ps_advise_point pt[5];
    memset(pt, 0, sizeof(pt));
    double thr[5] = {300, 200, 150, 200, 900};
    int64_t pk[5] = {100, 50, 60, 50, 10};
    double dr[5] = {0.05, 0.001, 0.002, 0.001, 0};
    for (int i = 0; i < 5; i++) {
        pt[i].throughput = thr[i];
        pt[i].peak_bytes = pk[i];
        pt[i].drift = dr[i];
        pt[i].drift_measured = NAN;
        pt[i].status = i == 4 ? PS_ADV_OVER_CAP : PS_ADV_FEASIBLE;
    }
    struct ps_advise a = {.n_points = 5, .points = pt, .objective = PS_ADVISE_THROUGHPUT};
    assert_int_equal(ps_advise_front(&a), 2);
    assert_true(pt[0].on_front && pt[1].on_front);
    assert_false(pt[2].on_front || pt[3].on_front || pt[4].on_front);
    assert_true(ps_advise_dominates(&pt[1], &pt[2]));
    assert_false(ps_advise_dominates(&pt[1], &pt[3]) || ps_advise_dominates(&pt[0], &pt[1]));
    assert_int_equal(ps_advise_recommend(&a), 0); /* the fastest */
    a.objective = PS_ADVISE_BALANCED;
    assert_int_equal(ps_advise_recommend(&a), 1); /* A drifts 5% > 1%: the fastest calm one */
    /* nothing calm: B and D drift 3%, C 2% (now on the front: it drifts less than B) */
    pt[1].drift = pt[3].drift = 0.03;
    pt[2].drift = 0.02;
    assert_int_equal(ps_advise_front(&a), 3);
    assert_true(pt[2].on_front && !pt[3].on_front);
    assert_int_equal(ps_advise_recommend(&a), 2); /* the least drift */
    /* drift not predicted: two objectives only, so C (slower and bigger than B) stays dominated */
    for (int i = 0; i < 5; i++) pt[i].drift = NAN;
    assert_int_equal(ps_advise_front(&a), 2);
    assert_false(pt[2].on_front);
    a.spec_throughput = 100;
    a.spec_peak = 200;
    char line[256];
    ps_advise_sentence(&a, &pt[0], line, sizeof(line));
    assert_non_null(strstr(line, "3.00x the throughput of your spec, 50% of its memory"));
}

static struct ps_spec *load_example(const char *name)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/examples/%s", root ? root : ".", name);
    struct ps_spec *spec = NULL;
    struct ps_diag d;
    assert_int_equal(ps_spec_load(path, &spec, &d), 0);
    return spec;
}

static void test_seed1_front_and_drift(void **state)
{
    (void)state;
    struct ps_spec *spec = load_example("seed1-convergence.json");
    struct ps_model *model = NULL;
    struct ps_diag d;
    assert_int_equal(ps_model_build(spec, &model, &d), 0);
    struct ps_advise a, b;
    search(spec, model, 0, false, &a);
    search(spec, model, 0, true, &b);
    check_front(&a);
    check_front(&b);
    assert_true(a.drift_predicted);
    /* determinism: the same search twice gives byte-identical JSON */
    {
        struct ps_advise a2;
        search(spec, model, 0, false, &a2);
        cJSON *j1 = ps_advise_json(&a), *j2 = ps_advise_json(&a2);
        char *t1 = cJSON_PrintUnformatted(j1), *t2 = cJSON_PrintUnformatted(j2);
        assert_non_null(t1);
        assert_non_null(t2);
        assert_string_equal(t1, t2);
        free(t1);
        free(t2);
        cJSON_Delete(j1);
        cJSON_Delete(j2);
        ps_advise_finish(&a2);
    }
    /* the same front objectives pruned and unpruned */
    for (int i = 0; i < a.n_points; i++) {
        if (!a.points[i].on_front) continue;
        bool hit = false;
        for (int j = 0; j < b.n_points && !hit; j++)
            hit = b.points[j].on_front && b.points[j].throughput == a.points[i].throughput &&
                  b.points[j].peak_bytes == a.points[i].peak_bytes &&
                  b.points[j].drift == a.points[i].drift;
        assert_true(hit);
    }
    /* predicted vs measured: drift's own sweep, the spec's 3 training steps */
    int chunks[2] = {2, 8};
    enum ps_bn_policy pol[3] = {PS_BN_PLAIN, PS_BN_DEFERRED, PS_BN_GRAD_ONLY};
    struct ps_drift_opts o = {.n_chunks = 2, .chunks = chunks, .n_policies = 3, .policies = pol};
    struct ps_drift dr;
    memset(&dr, 0, sizeof(dr));
    assert_int_equal(ps_drift_run(spec, model, &o, &dr, &d), 0);
    int compared = 0;
    for (int r = 0; r < dr.n_runs; r++) {
        const struct ps_drift_run *run = &dr.runs[r];
        double meas = ps_drift_metric(run, "var_err");
        for (int i = 0; i < b.n_points; i++) {
            const struct ps_advise_point *p = &b.points[i];
            if (p->chunks != run->s.chunks || p->checkpoint != run->s.checkpoint ||
                p->policy != run->s.policy || p->schedule != PS_SCHED_GPIPE)
                continue;
            printf("chunks %d %s %s: predicted %.5f measured %.5f\n", p->chunks,
                   ps_checkpoint_name(p->checkpoint), ps_bn_policy_name(p->policy), p->drift, meas);
            assert_true(fabs(p->drift - meas) <= 0.05 * meas + 0.001);
            compared++;
            break;
        }
    }
    assert_int_equal(compared, 6);
    ps_drift_finish(&dr);
    ps_advise_finish(&a);
    ps_advise_finish(&b);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_var_err_closed_form),
        cmocka_unit_test(test_front_by_hand),
        cmocka_unit_test(test_brute_force),
        cmocka_unit_test(test_seed1_front_and_drift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
