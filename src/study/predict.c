/* study/predict: does the simulator predict runs it has not seen (study.h)?
 *
 * Every run is a spec (a configuration of one model: chunks, checkpoint mode, schedule) and the
 * trace measured when it ran. The runs not held out are fitted together into one cost model
 * (sim/calibrate.h, ps_calibrate_runs: fixed + per-sample terms per partition, so the model
 * carries across micro-batch sizes); then every run, fitted or held out, is simulated with that
 * model and compared with its measurement (src/compare.h). A held-out run's errors are the
 * simulator's accuracy; a fitted run's are in-sample and say only how well the model fits.
 * Leave-one-out (ps_study_predict_loo, diagnose): each configuration in turn is held out and
 * predicted by a fit to the others, so every configuration's error is a held-out one.
 * Invariants: the fit never reads a held-out trace; runs keep the caller's order.
 */
#include "src/study/study.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/trace_read.h"
#include "viz/report.h"
#include "viz/viz.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of v[0..n) (sorted in place); NaN for n = 0 */
static double median(double *v, int n)
{
    if (n < 1) return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double mean_bubble(const struct ps_compare *c, bool sim)
{
    double b = 0;
    for (int d = 0; d < c->n_devices; d++) b += sim ? c->dev[d].sim_bubble : c->dev[d].meas_bubble;
    return c->n_devices ? b / c->n_devices : NAN;
}

/* groups by spec path; runs[k] of one group share the prediction */
static int make_groups(struct ps_predict *p, struct ps_diag *diag)
{
    free(p->groups);
    p->n_groups = 0;
    p->groups = calloc((size_t)p->n, sizeof(*p->groups));
    int *of = malloc((size_t)p->n * sizeof(int));
    double *v = malloc((size_t)p->n * sizeof(double));
    int rc = p->groups && of && v ? 0 : ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
    for (int k = 0; k < p->n && !rc; k++) {
        of[k] = -1;
        for (int j = 0; j < p->n_groups && of[k] < 0; j++)
            if (!strcmp(p->runs[p->groups[j].first].spec_path, p->runs[k].spec_path)) of[k] = j;
        if (of[k] < 0) {
            of[k] = p->n_groups++;
            p->groups[of[k]].first = k;
            p->groups[of[k]].holdout = p->runs[k].holdout;
        } else if (p->groups[of[k]].holdout != p->runs[k].holdout) {
            rc = ps_diag_set(diag, -EINVAL, p->runs[k].spec_path,
                             "given both to fit (--run) and to predict (--holdout): a held-out "
                             "configuration must not be fitted");
        }
        p->groups[of[k]].n_runs++;
    }
    int nho = 0;
    double sum = 0;
    p->max_holdout_error = p->mean_holdout_error = NAN;
    for (int j = 0; j < p->n_groups && !rc; j++) {
        struct ps_predict_group *gr = &p->groups[j];
        const struct ps_compare *c0 = &p->runs[gr->first].cmp;
        gr->pred_makespan_us = c0->sim_makespan_us;
        gr->pred_bubble = mean_bubble(c0, true);
        gr->n_devices = c0->n_devices < PS_PREDICT_MAX_DEVICES ? c0->n_devices
                                                               : PS_PREDICT_MAX_DEVICES;
        int m = 0;
        gr->meas_min_us = INFINITY;
        gr->meas_max_us = -INFINITY;
        for (int k = 0; k < p->n; k++)
            if (of[k] == j) {
                double t = p->runs[k].cmp.meas_makespan_us;
                v[m++] = t;
                gr->meas_min_us = fmin(gr->meas_min_us, t);
                gr->meas_max_us = fmax(gr->meas_max_us, t);
            }
        gr->meas_median_us = median(v, m);
        m = 0;
        for (int k = 0; k < p->n; k++)
            if (of[k] == j) v[m++] = mean_bubble(&p->runs[k].cmp, false);
        gr->meas_bubble = median(v, m);
        for (int d = 0; d < gr->n_devices; d++) {
            gr->pred_busy_us[d] = c0->dev[d].sim_busy_us;
            m = 0;
            for (int k = 0; k < p->n; k++)
                if (of[k] == j && d < p->runs[k].cmp.n_devices) v[m++] = p->runs[k].cmp.dev[d].meas_busy_us;
            gr->meas_busy_us[d] = median(v, m);
        }
        gr->meas_us = p->stat == PS_PREDICT_MIN ? gr->meas_min_us : gr->meas_median_us;
        gr->error = gr->meas_us > 0 ? (gr->meas_us - gr->pred_makespan_us) / gr->meas_us : NAN;
        if (gr->holdout && isfinite(gr->error)) {
            nho++;
            sum += fabs(gr->error);
            if (!(fabs(gr->error) <= p->max_holdout_error)) p->max_holdout_error = fabs(gr->error);
        }
    }
    if (nho) p->mean_holdout_error = sum / nho;
    free(of);
    free(v);
    return rc;
}

static int r_max(int a, int b)
{
    return a > b ? a : b;
}

/* every run simulated with the fit (again) and compared with its measurement */
static int predict_all(struct ps_predict *p, int cores, struct ps_diag *diag)
{
    int rc = 0;
    for (int k = 0; k < p->n && !rc; k++) {
        struct ps_predict_run *r = &p->runs[k];
        ps_compare_finish(&r->cmp);
        ps_cores_finish(&r->csim);
        ps_study_sim_finish(&r->pred);
        if ((rc = ps_study_simulate(r->spec, r->model, &r->var, NULL, p->fit.costs, &r->pred,
                                    diag)))
            break;
        const struct ps_trace *t = &r->pred.sim.trace;
        if (cores > 0) {
            if ((rc = ps_sim_cores(r->pred.g, &r->pred.order, r->pred.cost, cores, &r->csim, diag)))
                break;
            t = &r->csim.trace;
        }
        rc = ps_compare_run(r->pred.g, t, r->measured, &r->cmp, diag);
    }
    return rc;
}

/* Fits p->fit to the runs not held out (every run with all): with stat MIN only the least
   disturbed quarter of each configuration's runs (the smallest measured makespans, at least
   one; ties: the first given), so the costs are those of the machine's undisturbed speed, the
   speed the minimum measures (interference only ever adds time; a quarter rather than the one
   fastest run, so a task that occurs once per step is not read from one sample); with MEDIAN
   every run. Sets the runs' `fitted` and p->n_fitted. */
static int fit_runs(struct ps_predict *p, enum ps_calib_loss loss, enum ps_predict_stat stat,
                    bool all, struct ps_diag *diag)
{
    int n = p->n, n_fit = 0, rc = 0;
    ps_calib_fit_finish(&p->fit);
    struct ps_calib_run *cr = calloc((size_t)n, sizeof(*cr));
    double *span = calloc((size_t)n, sizeof(double));
    if (!cr || !span) {
        rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
        goto out;
    }
    for (int k = 0; k < n; k++) span[k] = ps_trace_makespan(p->runs[k].measured);
    for (int k = 0; k < n; k++) {
        struct ps_predict_run *r = &p->runs[k];
        r->fitted = all || !r->holdout;
        int same = 0, faster = 0;
        for (int j = 0; j < n && r->fitted && stat == PS_PREDICT_MIN; j++)
            if (!strcmp(p->runs[j].spec_path, r->spec_path)) {
                same++;
                faster += j != k && (span[j] < span[k] || (span[j] == span[k] && j < k));
            }
        if (stat == PS_PREDICT_MIN && faster >= (same + 3) / 4) r->fitted = false;
        if (r->fitted) cr[n_fit++] = (struct ps_calib_run){r->base.g, &r->base.order, r->measured};
    }
    p->n_fitted = n_fit;
    if (!n_fit) rc = ps_diag_set(diag, -EINVAL, "calibrate", "every run is held out: nothing to fit");
    else rc = ps_calibrate_runs(cr, n_fit, loss, &p->fit, diag);
out:
    free(cr);
    free(span);
    return rc;
}

/* fits the runs not held out, simulates every run with the fit and groups them (p->runs
   loaded, graphs built) */
static int fit_predict(struct ps_predict *p, enum ps_calib_loss loss, int cores,
                       enum ps_predict_stat stat, struct ps_diag *diag)
{
    int n = p->n, rc = 0;
    if ((rc = fit_runs(p, loss, stat, false, diag))) return rc;
    int maxd = 1;
    for (int k = 0; k < n; k++) maxd = r_max(maxd, p->runs[k].base.g->n_devices);
    if (maxd > PS_PREDICT_MAX_DEVICES) maxd = PS_PREDICT_MAX_DEVICES;
    for (int c = 0; c <= PS_PREDICT_MAX_DEVICES; c++) p->fit_error[c] = NAN;
    p->stat = stat;
    if (cores < 0) {
        /* model selection on the fitted configurations only */
        double best = INFINITY;
        for (int c = 0; c <= maxd && !rc; c++) {
            double sum = 0;
            int cnt = 0;
            if ((rc = predict_all(p, c, diag)) || (rc = make_groups(p, diag))) break;
            for (int j = 0; j < p->n_groups; j++)
                if (!p->groups[j].holdout && isfinite(p->groups[j].error))
                    sum += fabs(p->groups[j].error), cnt++;
            p->fit_error[c] = cnt ? sum / cnt : NAN;
            if (cnt && sum / cnt < best) best = sum / cnt, cores = c;
        }
        if (cores < 0) cores = 0;
    }
    if (!rc) rc = predict_all(p, cores, diag);
    p->cores = cores;
    if (!rc) rc = make_groups(p, diag);
    for (int j = 0; j < p->n_groups; j++) p->groups[j].cores = cores;
    return rc;
}

/* builds run k's graph (the configuration r->var of its spec) and checks it is the first run's
   model */
static int build_run(struct ps_predict *p, int k, struct ps_diag *diag)
{
    struct ps_predict_run *r = &p->runs[k];
    int rc = ps_study_simulate(r->spec, r->model, &r->var, NULL, NULL, &r->base, diag);
    if (!rc && k > 0) rc = ps_calib_same_model(p->runs[0].base.g, r->base.g, diag);
    return rc;
}

int ps_study_predict(const char *const *spec_paths, const char *const *trace_paths,
                     const bool *holdout, int n, enum ps_calib_loss loss, int cores,
                     enum ps_predict_stat stat, struct ps_predict *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    out->max_holdout_error = out->mean_holdout_error = NAN;
    if (n < 1) return ps_diag_set(diag, -EINVAL, "calibrate", "no run");
    out->runs = calloc((size_t)n, sizeof(*out->runs));
    if (!out->runs) return ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
    out->n = n;
    int rc = 0;
    for (int k = 0; k < n && !rc; k++) {
        struct ps_predict_run *r = &out->runs[k];
        r->spec_path = spec_paths[k];
        r->trace_path = trace_paths[k];
        r->holdout = holdout && holdout[k];
        r->measured = &r->meas;
        struct ps_trace_read_info info;
        memset(&info, 0, sizeof(info));
        if ((rc = ps_spec_load(r->spec_path, &r->spec, diag)) ||
            (rc = ps_model_build(r->spec, &r->model, diag)))
            break;
        ps_variant_from_spec(r->spec, &r->var);
        if ((rc = build_run(out, k, diag))) break;
        rc = ps_trace_read(r->trace_path, r->base.g, &r->meas, &info, diag);
        ps_trace_read_info_finish(&info);
    }
    if (!rc) rc = fit_predict(out, loss, cores, stat, diag);
    return rc;
}

int ps_study_predict_loo(const struct ps_spec *spec, const struct ps_model *model,
                         const struct ps_predict_input *in, int n, enum ps_calib_loss loss,
                         int cores, enum ps_predict_stat stat, struct ps_predict *out,
                         struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    out->max_holdout_error = out->mean_holdout_error = NAN;
    out->loo = true;
    out->runs = calloc((size_t)n + 1, sizeof(*out->runs));
    struct ps_compare *held = calloc((size_t)n + 1, sizeof(*held));
    int *grp = calloc((size_t)n + 1, sizeof(int)), *gcores = NULL;
    int rc = 0, ng = 0;
    if (!out->runs || !held || !grp) {
        rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
        goto out;
    }
    out->n = n;
    for (int k = 0; k < n && !rc; k++) {
        struct ps_predict_run *r = &out->runs[k];
        r->spec_path = in[k].name;
        r->borrowed = true;
        r->spec = (struct ps_spec *)spec;
        r->model = (struct ps_model *)model;
        r->var = in[k].var;
        r->measured = in[k].meas;
        grp[k] = -1;
        for (int j = 0; j < k && grp[k] < 0; j++)
            if (!strcmp(in[j].name, in[k].name)) grp[k] = grp[j];
        if (grp[k] < 0) grp[k] = ng++;
        rc = build_run(out, k, diag);
    }
    if (!rc && ng < 2)
        rc = ps_diag_set(diag, -EINVAL, "calibrate",
                         "leave-one-out needs two configurations at least, %d given", ng);
    if (!rc && !(gcores = calloc((size_t)ng, sizeof(int))))
        rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
    /* fold f: configuration f held out; its runs' comparisons are kept aside */
    for (int f = 0; f < ng && !rc; f++) {
        for (int k = 0; k < n; k++) out->runs[k].holdout = grp[k] == f;
        if ((rc = fit_predict(out, loss, cores, stat, diag))) break;
        gcores[f] = out->cores;
        for (int k = 0; k < n; k++)
            if (grp[k] == f) {
                held[k] = out->runs[k].cmp;
                memset(&out->runs[k].cmp, 0, sizeof(out->runs[k].cmp));
            }
    }
    if (rc) goto out;
    /* every run as held out, with its fold's comparison; the fit to them all for the costs */
    for (int k = 0; k < n; k++) {
        ps_compare_finish(&out->runs[k].cmp);
        out->runs[k].cmp = held[k];
        memset(&held[k], 0, sizeof(held[k]));
        out->runs[k].holdout = true;
    }
    if ((rc = make_groups(out, diag))) goto out;
    for (int j = 0; j < out->n_groups; j++) out->groups[j].cores = gcores[grp[out->groups[j].first]];
    rc = fit_runs(out, loss, stat, true, diag);
out:
    for (int k = 0; held && k < n; k++) ps_compare_finish(&held[k]);
    free(held);
    free(grp);
    free(gcores);
    return rc;
}

void ps_study_predict_finish(struct ps_predict *p)
{
    for (int k = 0; p->runs && k < p->n; k++) {
        struct ps_predict_run *r = &p->runs[k];
        ps_compare_finish(&r->cmp);
        ps_cores_finish(&r->csim);
        ps_study_sim_finish(&r->pred);
        ps_trace_finish(&r->meas);
        ps_study_sim_finish(&r->base);
        if (!r->borrowed) {
            ps_model_destroy(r->model);
            ps_spec_destroy(r->spec);
        }
    }
    free(p->runs);
    free(p->groups);
    ps_calib_fit_finish(&p->fit);
    memset(p, 0, sizeof(*p));
}

static cJSON *run_json(const struct ps_predict_run *r)
{
    const struct ps_compare *c = &r->cmp;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_string(o, "spec", r->spec_path);
    if (r->trace_path) ps_json_add_string(o, "trace", r->trace_path);
    ps_json_add_string(o, "role", r->holdout ? "held_out" : "fitted");
    ps_json_add_bool(o, "read_by_fit", r->fitted);
    ps_json_add_int(o, "chunks", r->var.chunks);
    ps_json_add_int(o, "micro_batch_size", (int)ps_variant_mb_size(&r->var, 0));
    ps_json_add_string(o, "checkpoint", ps_checkpoint_name(r->var.checkpoint));
    ps_json_add_number(o, "predicted_makespan_us", c->sim_makespan_us);
    ps_json_add_number(o, "measured_makespan_us", c->meas_makespan_us);
    ps_json_add_number(o, "makespan_error", c->makespan_error); /* (measured - predicted) / measured */
    cJSON *dv = cJSON_AddArrayToObject(o, "devices");
    for (int d = 0; dv && d < c->n_devices; d++) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "device", d);
        ps_json_add_number(x, "predicted_busy_us", c->dev[d].sim_busy_us);
        ps_json_add_number(x, "measured_busy_us", c->dev[d].meas_busy_us);
        ps_json_add_number(x, "predicted_bubble", c->dev[d].sim_bubble);
        ps_json_add_number(x, "measured_bubble", c->dev[d].meas_bubble);
        cJSON_AddItemToArray(dv, x);
    }
    return o;
}

cJSON *ps_predict_json(const struct ps_predict *p, enum ps_calib_loss loss)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddItemToObject(o, "fit", ps_calib_fit_json(&p->fit));
    ps_json_add_string(o, "fit_loss", loss == PS_CAL_MEAN ? "mean" : "robust");
    ps_json_add_string(o, "held_out", p->loo ? "leave_one_out" : "given");
    ps_json_add_int(o, "cores", p->cores);
    ps_json_add_string(o, "measured", p->stat == PS_PREDICT_MIN ? "min" : "median");
    ps_json_add_number(o, "max_held_out_makespan_error", p->max_holdout_error);
    ps_json_add_number(o, "mean_held_out_makespan_error", p->mean_holdout_error);
    cJSON *rs = cJSON_AddArrayToObject(o, "runs");
    for (int k = 0; rs && k < p->n; k++) {
        cJSON *x = run_json(&p->runs[k]);
        if (p->loo && x) {
            const struct ps_predict_group *gr = NULL;
            for (int j = 0; j < p->n_groups && !gr; j++)
                if (!strcmp(p->runs[p->groups[j].first].spec_path, p->runs[k].spec_path))
                    gr = &p->groups[j];
            if (gr) ps_json_add_int(x, "cores", gr->cores);
        }
        cJSON_AddItemToArray(rs, x);
    }
    return o;
}
