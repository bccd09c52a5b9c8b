/* test_drift: BatchNorm running-statistics drift (src/study/drift.c, src/drift.c) and the executor hooks it uses
 * (forward_only, ps_exec_eval), checked against the closed forms of SEMANTICS.md section 7:
 *   - the EMA replayed from the update log equals the measured running statistics;
 *   - updates per step follow the section 7 table and sim/bnorder's order; a_eff = 1-(1-a)^U;
 *   - plain drift grows with chunks, deferred commits once and matches the reference up to the
 *     biased/unbiased variance factor, exactly where both see the same input;
 *   - the fairscale report (seed 2): checkpointed grad-only BN does not track in forward, tracks
 *     once at recompute (then equals a plain non-checkpointed module), plain tracks twice;
 *   - BN adaptation (forward-only drift): per pass plain m, grad-only the micro-batches that are
 *     not checkpointed, deferred 1 commit, in the orders worked out by hand below.
 * Small models and 1-2 steps, so the suite stays fast on two cores.
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

#include "src/drift.h"
#include "src/engine.h"
#include "kernels/exec.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/schedule.h"
#include "src/study/study.h"

static struct ps_spec *load_example(const char *name)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[4096];
    snprintf(path, sizeof(path), "%s/examples/%s", root ? root : ".", name);
    struct ps_spec *s = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_spec_load(path, &s, &d);
    if (rc) fprintf(stderr, "%s: %s\n", path, d.msg);
    assert_int_equal(rc, 0);
    return s;
}

static const int chunks4[] = {1, 2, 4, 8};
static const enum ps_bn_policy pols[] = {PS_BN_PLAIN, PS_BN_DEFERRED, PS_BN_GRAD_ONLY};

/* seed 1 (conv+BN over 4 partitions, except_last), one step */
static void test_seed1_drift(void **state)
{
    (void)state;
    struct ps_spec *s = load_example("seed1-convergence.json");
    struct ps_model *m = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    struct ps_drift_opts o = {.n_chunks = 4, .chunks = chunks4, .n_policies = 3,
                              .policies = pols, .steps = 1};
    struct ps_drift dr;
    int rc = ps_drift_run(s, m, &o, &dr, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(dr.n_runs, 12);
    assert_int_equal(s->chunks, 8); /* D1: restored */
    double plain_prev = -1;
    for (int k = 0; k < dr.n_runs; k++) {
        const struct ps_drift_run *r = &dr.runs[k];
        assert_int_equal(r->n_layers, 4);
        for (int j = 0; j < r->n_layers; j++) {
            const struct ps_drift_layer *l = &r->layers[j];
            /* EMA closed form from the logged u_t equals the measured running stats */
            assert_true(l->ema_residual_mean < 1e-6);
            assert_true(l->ema_residual_var < 1e-6);
            /* section 7 table and the simulated order */
            assert_int_equal(l->updates, l->expected_updates);
            assert_true(l->order_as_simulated);
            assert_true(fabs(l->eff_momentum - (1.0 - pow(0.9, l->updates))) < 1e-6);
        }
        const struct ps_drift_layer *l0 = &r->layers[0];
        /* the first BN layer sees the reference's input: the gap is predicted exactly */
        assert_true(fabs(l0->var_gap_measured - l0->var_gap_predicted) < 1e-5);
        if (r->s.policy == PS_BN_PLAIN)
            assert_int_equal(l0->updates, 2 * r->m - 1); /* except_last: 2m-1 */
        if (r->s.policy == PS_BN_GRAD_ONLY) assert_int_equal(l0->updates, r->m);
        if (r->s.policy == PS_BN_DEFERRED) {
            assert_int_equal(l0->updates, 1); /* one commit */
            assert_string_equal(l0->order, r->m == 1 ? "0c" : r->m == 2 ? "1c"
                                           : r->m == 4 ? "3c" : "7c");
            /* biased pooled = full-batch biased: only the Bessel factor is left */
            assert_true(l0->mean_err_max < 1e-5);
            assert_true(fabs(l0->var_err_mean - l0->deferred_var_err) < 1e-6);
            assert_true(l0->deferred_var_err > 0 && l0->deferred_var_err < 1e-4);
            assert_true(ps_drift_metric(r, "var_err") < 1e-3);
        }
        if (r->s.policy == PS_BN_PLAIN) {
            double v = ps_drift_metric(r, "var_err");
            if (r->s.chunks == 1) assert_true(v < 1e-7); /* chunks 1 = the reference */
            else assert_true(v > plain_prev + 0.05); /* drift grows with chunks */
            plain_prev = v;
        }
    }
    ps_drift_finish(&dr);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

/* plain + always: 2m updates, forward order then reverse recompute order */
static void test_plain_always(void **state)
{
    (void)state;
    struct ps_spec *s = load_example("seed1-convergence.json");
    struct ps_model *m = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    static const int c4[] = {4};
    static const enum ps_checkpoint ck[] = {PS_CKPT_ALWAYS};
    static const enum ps_bn_policy pl[] = {PS_BN_PLAIN, PS_BN_GRAD_ONLY};
    struct ps_drift_opts o = {.n_chunks = 1, .chunks = c4, .n_policies = 2, .policies = pl,
                              .n_checkpoints = 1, .checkpoints = ck, .steps = 2};
    struct ps_drift dr;
    assert_int_equal(ps_drift_run(s, m, &o, &dr, &d), 0);
    assert_int_equal(dr.n_runs, 2);
    for (int j = 0; j < 4; j++) {
        assert_int_equal(dr.runs[0].layers[j].updates, 8);
        assert_string_equal(dr.runs[0].layers[j].order, "0f 1f 2f 3f 3r 2r 1r 0r");
        assert_string_equal(dr.runs[1].layers[j].order, "3r 2r 1r 0r");
        assert_true(dr.runs[0].layers[j].ema_residual_var < 1e-6);
        assert_true(fabs(dr.runs[0].layers[j].eff_momentum - (1 - pow(0.9, 8))) < 1e-6);
    }
    ps_drift_finish(&dr);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

/* ---- seed 2: the fairscale report ------------------------------------------------------- */

static void run_seed2(const struct ps_spec *s, const struct ps_model *m, enum ps_checkpoint ck,
                      enum ps_bn_policy pol, bool forward_only, struct ps_exec_result *r)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_variant go;
    ps_variant_from_spec(s, &go);
    go.checkpoint = ck;
    go.batchnorm = pol;
    struct ps_graph *g = NULL;
    struct ps_order ord;
    memset(&ord, 0, sizeof(ord));
    assert_int_equal(ps_schedule_build(s, m, &go, &g, &d), 0);
    assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    o.trace = false;
    o.steps = 1;
    o.forward_only = forward_only;
    int rc = ps_exec_run(g, &ord, &o, r, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
}

static bool same_stats(const struct ps_exec_result *a, const struct ps_exec_result *b, double tol)
{
    const struct ps_layer_state *x = &a->state.layers[1], *y = &b->state.layers[1];
    for (int64_t c = 0; c < x->channels; c++)
        if (fabs((double)x->running_mean[c] - y->running_mean[c]) > tol ||
            fabs((double)x->running_var[c] - y->running_var[c]) > tol)
            return false;
    return true;
}

static void test_seed2_fairscale(void **state)
{
    (void)state;
    struct ps_spec *s = load_example("seed2-checkpoint-bn.json");
    struct ps_model *m = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    struct ps_exec_result ref_f, ck_f, ref_b, ck_b, plain_b;
    /* forward only: the plain module tracks once, the checkpointed grad-only one not at all */
    run_seed2(s, m, PS_CKPT_NEVER, PS_BN_PLAIN, true, &ref_f);
    run_seed2(s, m, PS_CKPT_ALWAYS, PS_BN_GRAD_ONLY, true, &ck_f);
    assert_int_equal(ref_f.n_bn, 1);
    assert_int_equal(ck_f.n_bn, 0);
    assert_int_equal(ck_f.state.layers[1].num_batches_tracked, 0);
    assert_float_equal(ck_f.state.layers[1].running_var[0], 1.0f, 0.0f);
    assert_false(same_stats(&ref_f, &ck_f, 1e-4));
    /* forward + backward: the recompute tracks once, now they match */
    run_seed2(s, m, PS_CKPT_NEVER, PS_BN_PLAIN, false, &ref_b);
    run_seed2(s, m, PS_CKPT_ALWAYS, PS_BN_GRAD_ONLY, false, &ck_b);
    assert_int_equal(ck_b.n_bn, 1);
    assert_int_equal(ck_b.bn[0].phase, PS_EXEC_BN_RECOMPUTE);
    assert_true(same_stats(&ref_b, &ck_b, 0.0));
    assert_int_equal(ck_b.state.layers[1].num_batches_tracked, 1);
    /* and the forward-only plain module already had the final statistics */
    assert_true(same_stats(&ref_f, &ref_b, 0.0));
    /* plain BN under checkpointing: updated twice (forward and recompute) */
    run_seed2(s, m, PS_CKPT_ALWAYS, PS_BN_PLAIN, false, &plain_b);
    assert_int_equal(plain_b.n_bn, 2);
    assert_int_equal(plain_b.state.layers[1].num_batches_tracked, 2);
    assert_false(same_stats(&ref_b, &plain_b, 1e-4));
    /* r -> (1-a)^2 r0 + a(2-a) u for a doubled update of the same u */
    const struct ps_exec_bn_update *u = &plain_b.bn[0];
    for (int64_t c = 0; c < plain_b.state.layers[1].channels; c++) {
        double want = 0.81 * 1.0 + 0.1 * 1.9 * u->var[c];
        assert_true(fabs(want - plain_b.state.layers[1].running_var[c]) < 1e-6);
        assert_float_equal(u->var[c], plain_b.bn[1].var[c], 0.0f);
    }
    ps_exec_result_finish(&ref_f);
    ps_exec_result_finish(&ck_f);
    ps_exec_result_finish(&ref_b);
    ps_exec_result_finish(&ck_b);
    ps_exec_result_finish(&plain_b);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

/* forward-only drift (BN adaptation), seed 1 at chunks 4 (m = 4), 2 passes: counts and orders
 * per pass by hand from SEMANTICS.md section 7 without the backward */
static void test_forward_only_drift(void **state)
{
    (void)state;
    struct ps_spec *s = load_example("seed1-convergence.json");
    struct ps_model *m = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    static const int c4[] = {4};
    static const enum ps_checkpoint ck[] = {PS_CKPT_ALWAYS, PS_CKPT_EXCEPT_LAST, PS_CKPT_NEVER};
    struct ps_drift_opts o = {.n_chunks = 1, .chunks = c4, .n_policies = 3, .policies = pols,
                              .n_checkpoints = 3, .checkpoints = ck, .steps = 2,
                              .forward_only = true};
    struct ps_drift dr;
    int rc = ps_drift_run(s, m, &o, &dr, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(dr.n_runs, 9);
    assert_true(dr.forward_only);
    assert_int_equal(dr.reference.layers[0].updates, 1);
    /* runs: policy-major (plain, deferred, grad-only), then always, except_last, never */
    static const int want_u[3][3] = {{4, 4, 4}, {1, 1, 1}, {0, 1, 4}};
    static const char *const want_o[3][3] = {{"0f 1f 2f 3f", "0f 1f 2f 3f", "0f 1f 2f 3f"},
                                             {"3c", "3c", "3c"},
                                             {"", "3f", "0f 1f 2f 3f"}};
    static const bool want_adapt[3][3] = {{true, true, true}, {true, true, true},
                                          {false, false, true}};
    for (int k = 0; k < 9; k++) {
        const struct ps_drift_run *r = &dr.runs[k];
        int p = k / 3, c = k % 3;
        assert_int_equal(r->s.policy, pols[p]);
        assert_int_equal(r->s.checkpoint, ck[c]);
        assert_int_equal(r->m, 4);
        struct ps_variant v;
        ps_variant_from_spec(s, &v);
        assert_int_equal(ps_variant_set_chunks(&v, s, 4, &d), 0);
        v.batchnorm = r->s.policy;
        v.checkpoint = r->s.checkpoint;
        assert_int_equal(ps_bn_forward_updates(&v), want_u[p][c]);
        char w[512];
        assert_int_equal(ps_bn_adaptation(&v, w, sizeof(w)), want_adapt[p][c]);
        assert_int_equal(r->adapts, want_adapt[p][c]);
        assert_string_equal(r->adaptation, w);
        assert_int_equal(r->n_layers, 4);
        for (int j = 0; j < r->n_layers; j++) {
            const struct ps_drift_layer *l = &r->layers[j];
            assert_int_equal(l->updates, want_u[p][c]);
            assert_int_equal(l->expected_updates, want_u[p][c]);
            assert_string_equal(l->order, want_o[p][c]);
            assert_true(l->order_as_simulated);
            assert_true(l->ema_residual_mean < 1e-6 && l->ema_residual_var < 1e-6);
            /* without a backward the checkpoint mode cannot matter to plain BN, and grad-only
               without checkpointing is plain BN */
            const struct ps_drift_layer *pl = &dr.runs[c].layers[j], *p0 = &dr.runs[0].layers[j];
            for (int64_t q = 0; q < l->channels; q++) {
                if (p == 0) assert_float_equal(l->running_var[q], p0->running_var[q], 0.0f);
                if (p == 2 && c == 2)
                    assert_float_equal(l->running_var[q], pl->running_var[q], 0.0f);
                if (p == 2 && c == 0) { /* not adapted: the initial statistics */
                    assert_float_equal(l->running_mean[q], 0.0f, 0.0f);
                    assert_float_equal(l->running_var[q], 1.0f, 0.0f);
                }
            }
        }
        if (p == 2 && c == 0) assert_true(ps_drift_metric(r, "var_err") > 0.05);
    }
    ps_drift_finish(&dr);
    /* forward-only passes do not train */
    struct ps_drift_opts t = o;
    t.train = true;
    assert_int_equal(ps_drift_run(s, m, &t, &dr, &d), -EINVAL);
    /* m < chunks (batch 3, chunks 4: 3 micro-batches of 1): grad-only except_last checkpoints
       all of them (stop = chunks - 1 = 3); deferred commits across passes, no per-pass count */
    struct ps_variant v = {.batchnorm = PS_BN_GRAD_ONLY, .checkpoint = PS_CKPT_EXCEPT_LAST,
                           .chunks = 4, .mb_count = 3};
    assert_int_equal(ps_bn_forward_updates(&v), 0);
    v.batchnorm = PS_BN_DEFERRED;
    assert_int_equal(ps_bn_forward_updates(&v), -1);
    assert_null(dr.runs);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

/* ps_exec_eval: BN normalises with the running statistics and leaves them alone */
static void test_eval(void **state)
{
    (void)state;
    const char *json =
        "{\"pipescope\": 1, \"batch\": 4, \"model\": {\"input\": [3], \"layers\": ["
        "{\"op\": \"batchnorm\"}, {\"op\": \"dropout\", \"p\": 0.5}, {\"op\": \"relu\"}], "
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [3], \"devices\": [\"cpu\"], "
        "\"chunks\": 1, \"schedule\": \"gpipe\", \"checkpoint\": \"never\", "
        "\"batchnorm\": \"plain\", \"phony\": true}}";
    struct ps_spec *s = NULL;
    struct ps_model *m = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, "eval.json", ".", &s, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    struct ps_state st;
    assert_int_equal(ps_state_init(&st, s, m, 0, &d), 0);
    for (int c = 0; c < 3; c++) {
        st.layers[0].running_mean[c] = (float)c;
        st.layers[0].running_var[c] = 4.0f;
        st.layers[0].weight[c] = 2.0f;
    }
    float x[6] = {1, 1, 5, -3, 2, 2}, y[6];
    assert_int_equal(ps_exec_eval(s, m, &st, x, 2, y, &d), 0);
    for (int k = 0; k < 6; k++) {
        double v = 2.0 * (x[k] - (k % 3)) / sqrt(4.0 + 1e-5);
        assert_true(fabs(y[k] - (v > 0 ? v : 0)) < 1e-5);
    }
    assert_float_equal(st.layers[0].running_var[0], 4.0f, 0.0f);
    assert_int_equal(st.layers[0].num_batches_tracked, 0);
    ps_state_finish(&st);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

static struct ps_spec *parse_json(const char *json, struct ps_model **m)
{
    struct ps_spec *s = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, "skip.json", ".", &s, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(ps_model_build(s, m, &d), 0);
    return s;
}

/* Settings that cannot train are skipped with the reason, the rest run (issue #12 point 3).
 * Worked by hand with torch.chunk's rule (size ceil(N/c), the last micro-batch holds the rest):
 *   flat BN, N = 6: c=2 -> 3,3; c=4 -> 2,2,2 (m=3); c=5 -> 2,2,2; c=6 -> 1 x 6: one value per
 *   channel, refused; c=7 > N, refused.  N = 5, c=3 -> 2,2,1: refused (the last holds 1).
 *   BN2d after a 2x2 map: c = N = 2 -> 1 sample x 4 pixels: 4 values per channel, allowed; on a
 *   1x1 map (after a 2x2 max pool) it is refused. */
static void test_skip_impossible(void **state)
{
    (void)state;
    char why[192];
    struct ps_model *m = NULL;
    struct ps_spec *s = parse_json(
        "{\"pipescope\": 1, \"batch\": 6, \"model\": {\"input\": [3], \"layers\": ["
        "{\"op\": \"linear\", \"out\": 4}, {\"op\": \"batchnorm\"}, {\"op\": \"relu\"}], "
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [2, 1], \"chunks\": 2}}",
        &m);
    assert_int_equal(ps_drift_check_chunks(s, m, 2, why, sizeof(why)), 0);
    assert_int_equal(ps_drift_check_chunks(s, m, 4, why, sizeof(why)), 0);
    assert_int_equal(ps_drift_check_chunks(s, m, 5, why, sizeof(why)), 0);
    assert_int_equal(ps_drift_check_chunks(s, m, 6, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "chunks 6: micro-batch 5 holds 1 sample, so batchnorm layer 1 sees "
                             "one value per channel (PyTorch refuses to train it)");
    assert_int_equal(ps_drift_check_chunks(s, m, 7, why, sizeof(why)), -EINVAL);
    assert_string_equal(why, "chunks 7: a batch of 6 samples allows chunks 1..6");

    /* a sweep with one impossible setting runs the others and lists the impossible one */
    static const int ch[] = {2, 6, 3};
    static const enum ps_bn_policy pol[] = {PS_BN_PLAIN, PS_BN_DEFERRED};
    struct ps_drift_opts o = {.n_chunks = 3, .chunks = ch, .n_policies = 2, .policies = pol,
                              .steps = 1};
    struct ps_drift dr;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_drift_run(s, m, &o, &dr, &d), 0);
    assert_int_equal(dr.n_runs, 4);
    assert_int_equal(dr.runs[0].s.chunks, 2);
    assert_int_equal(dr.runs[2].s.chunks, 3);
    assert_int_equal(dr.n_skipped, 2);
    assert_int_equal(dr.skipped[0].s.chunks, 6);
    assert_int_equal(dr.skipped[0].s.policy, PS_BN_PLAIN);
    assert_int_equal(dr.skipped[1].s.policy, PS_BN_DEFERRED);
    assert_non_null(strstr(dr.skipped[1].reason, "one value per channel"));
    ps_drift_finish(&dr);
    /* nothing left to run: an error that says why */
    static const int only6[] = {6};
    o.chunks = only6;
    o.n_chunks = 1;
    assert_int_equal(ps_drift_run(s, m, &o, &dr, &d), -EINVAL);
    assert_non_null(strstr(d.msg, "no drift setting can run: chunks 6:"));
    ps_model_destroy(m);
    ps_spec_destroy(s);

    s = parse_json("{\"pipescope\": 1, \"batch\": 5, \"model\": {\"input\": [3], \"layers\": ["
                   "{\"op\": \"batchnorm\"}], \"loss\": \"sum\"}, \"pipeline\": "
                   "{\"balance\": [1], \"chunks\": 1}}",
                   &m);
    assert_int_equal(ps_drift_check_chunks(s, m, 2, why, sizeof(why)), 0);
    assert_int_equal(ps_drift_check_chunks(s, m, 3, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "micro-batch 2 holds 1 sample, so batchnorm layer 0"));
    ps_model_destroy(m);
    ps_spec_destroy(s);

    s = parse_json("{\"pipescope\": 1, \"batch\": 2, \"model\": {\"input\": [1, 2, 2], "
                   "\"layers\": [{\"op\": \"batchnorm\"}, {\"op\": \"maxpool2d\", \"kernel\": 2}, "
                   "{\"op\": \"batchnorm\"}], \"loss\": \"sum\"}, \"pipeline\": "
                   "{\"balance\": [3], \"chunks\": 1}}",
                   &m);
    assert_int_equal(ps_drift_check_chunks(s, m, 1, why, sizeof(why)), 0);
    assert_int_equal(ps_drift_check_chunks(s, m, 2, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "batchnorm layer 2 sees one value per channel"));
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed1_drift),
        cmocka_unit_test(test_plain_always),
        cmocka_unit_test(test_seed2_fairscale),
        cmocka_unit_test(test_forward_only_drift),
        cmocka_unit_test(test_eval),
        cmocka_unit_test(test_skip_impossible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
