/* study/predict: does the simulator predict runs it has not seen (study.h)?
 *
 * Every run is a spec (a configuration of one model: chunks, checkpoint mode, schedule) and the
 * trace measured when it ran. The runs not held out are fitted together into one cost model
 * (sim/calibrate.h, ps_calibrate_runs: fixed + per-sample terms per partition, so the model
 * carries across micro-batch sizes); then every run, fitted or held out, is simulated with that
 * model and compared with its measurement (src/compare.h). A held-out run's errors are the
 * simulator's accuracy; a fitted run's are in-sample and say only how well the model fits.
 * Invariants: the fit never reads a held-out trace; runs keep the caller's order.
 */
#include "src/study/study.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/trace_read.h"

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
        struct ps_variant v;
        ps_variant_from_spec(r->spec, &v);
        if ((rc = ps_study_simulate(r->spec, r->model, &v, NULL, p->fit.costs, &r->pred, diag)))
            break;
        const struct ps_trace *t = &r->pred.sim.trace;
        if (cores > 0) {
            if ((rc = ps_sim_cores(r->pred.g, &r->pred.order, r->pred.cost, cores, &r->csim, diag)))
                break;
            t = &r->csim.trace;
        }
        rc = ps_compare_run(r->pred.g, t, &r->meas, &r->cmp, diag);
    }
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
    struct ps_calib_run *cr = calloc((size_t)n, sizeof(*cr));
    int rc = 0, n_fit = 0;
    if (!out->runs || !cr) {
        rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
        goto out;
    }
    out->n = n;
    for (int k = 0; k < n && !rc; k++) {
        struct ps_predict_run *r = &out->runs[k];
        r->spec_path = spec_paths[k];
        r->trace_path = trace_paths[k];
        r->holdout = holdout && holdout[k];
        struct ps_variant v;
        struct ps_trace_read_info info;
        memset(&info, 0, sizeof(info));
        if ((rc = ps_spec_load(r->spec_path, &r->spec, diag)) ||
            (rc = ps_model_build(r->spec, &r->model, diag)))
            break;
        ps_variant_from_spec(r->spec, &v);
        if ((rc = ps_study_simulate(r->spec, r->model, &v, NULL, NULL, &r->base, diag)) ||
            (k > 0 && (rc = ps_calib_same_model(out->runs[0].base.g, r->base.g, diag))))
            break;
        rc = ps_trace_read(r->trace_path, r->base.g, &r->meas, &info, diag);
        ps_trace_read_info_finish(&info);
        if (rc) break;
        if (!r->holdout) cr[n_fit++] = (struct ps_calib_run){r->base.g, &r->base.order, &r->meas};
    }
    if (rc) goto out;
    if (!n_fit) {
        rc = ps_diag_set(diag, -EINVAL, "calibrate", "every run is held out: nothing to fit");
        goto out;
    }
    if ((rc = ps_calibrate_runs(cr, n_fit, loss, &out->fit, diag))) goto out;
    int maxd = 1;
    for (int k = 0; k < n; k++) maxd = r_max(maxd, out->runs[k].base.g->n_devices);
    if (maxd > PS_PREDICT_MAX_DEVICES) maxd = PS_PREDICT_MAX_DEVICES;
    for (int c = 0; c <= PS_PREDICT_MAX_DEVICES; c++) out->fit_error[c] = NAN;
    out->stat = stat;
    if (cores < 0) {
        /* model selection on the fitted configurations only */
        double best = INFINITY;
        for (int c = 0; c <= maxd && !rc; c++) {
            double sum = 0;
            int cnt = 0;
            if ((rc = predict_all(out, c, diag)) || (rc = make_groups(out, diag))) break;
            for (int j = 0; j < out->n_groups; j++)
                if (!out->groups[j].holdout && isfinite(out->groups[j].error))
                    sum += fabs(out->groups[j].error), cnt++;
            out->fit_error[c] = cnt ? sum / cnt : NAN;
            if (cnt && sum / cnt < best) best = sum / cnt, cores = c;
        }
        if (cores < 0) cores = 0;
    }
    if (!rc) rc = predict_all(out, cores, diag);
    out->cores = cores;
    if (!rc) rc = make_groups(out, diag);
out:
    free(cr);
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
        ps_model_destroy(r->model);
        ps_spec_destroy(r->spec);
    }
    free(p->runs);
    free(p->groups);
    ps_calib_fit_finish(&p->fit);
    memset(p, 0, sizeof(*p));
}
