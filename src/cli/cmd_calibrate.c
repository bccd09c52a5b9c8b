/* pipescope calibrate: one cost model from several measured runs, and how well it predicts runs
 * it was not fitted to.
 *
 *   calibrate --run SPEC TRACE [--run SPEC TRACE ...] [--holdout SPEC TRACE ...] [-o COSTS]
 *             [--fit robust|mean] [--json FILE]
 *
 * Each SPEC is a configuration of one model (same layers and balance; chunks, checkpoint mode and
 * schedule may differ) and TRACE the Chrome trace measured when it ran (`run SPEC --trace`, or a
 * profiler's, as `compare` reads them). The --run runs are fitted together (src/study/predict.c,
 * sim/calibrate.h ps_calibrate_runs); every run is then simulated with the fit and compared with
 * its measurement. The table shows held-out runs first: their errors are the simulator's
 * accuracy; the fitted runs' errors are in-sample. Runs of one spec are repetitions of one
 * configuration (a shared machine's noise): one line, the median measurement and its range. -o writes the fit as a costs file
 * (sim/COSTS.md). Exit codes: 0 ok, 2 bad input or usage.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/report.h"
#include "viz/viz.h"

#define MAX_RUNS 256

static void print_term(const char *what, double v, double sd, double free_v)
{
    if (isfinite(free_v))
        printf("  %-22s %10.3f (constrained >= 0: the unconstrained fit gave %.3f)\n", what, v,
               free_v);
    else if (isfinite(v)) printf("  %-22s %10.3f +- %.3f\n", what, v, isfinite(sd) ? sd : 0.0);
    else printf("  %-22s not identifiable from these runs\n", what);
}

static void print_group(const struct ps_predict *p, const struct ps_predict_group *gr)
{
    const struct ps_predict_run *r = &p->runs[gr->first];
    const struct ps_variant *v = &r->base.g->var;
    printf("  %-34.34s %6d %-11s %8.3f %8.3f", r->spec->name ? r->spec->name : r->spec_path,
           v->chunks, ps_checkpoint_name(v->checkpoint), gr->pred_makespan_us / 1e3,
           gr->meas_us / 1e3);
    if (gr->n_runs > 1)
        printf(" [%.3f..%.3f, %d runs]", gr->meas_min_us / 1e3, gr->meas_max_us / 1e3, gr->n_runs);
    printf(" %+7.1f%%  %5.1f%% %5.1f%% ", -100 * gr->error, 100 * gr->pred_bubble,
           100 * gr->meas_bubble);
    for (int d = 0; d < gr->n_devices; d++)
        printf(" %.3f/%.3f", gr->pred_busy_us[d] / 1e3, gr->meas_busy_us[d] / 1e3);
    printf("\n");
}

int ps_cmd_calibrate(struct ps_cli *cli)
{
    const char *specs[MAX_RUNS], *traces[MAX_RUNS];
    bool hold[MAX_RUNS];
    int n = 0;
    enum ps_calib_loss loss = PS_CAL_ROBUST;
    int cores = 0;
    enum ps_predict_stat stat = PS_PREDICT_MEDIAN;
    for (int k = 0; k < cli->argc; k++) {
        const char *a = cli->argv[k];
        bool run = !strcmp(a, "--run"), ho = !strcmp(a, "--holdout");
        const char *v;
        if ((v = ps_cli_arg(cli, &k, "--fit"))) {
            if (!strcmp(v, "robust")) loss = PS_CAL_ROBUST;
            else if (!strcmp(v, "mean")) loss = PS_CAL_MEAN;
            else return ps_cli_usage(cli, "--fit must be robust or mean, not '%s'", v);
            continue;
        }
        if ((v = ps_cli_arg(cli, &k, "--measured"))) {
            if (!strcmp(v, "median")) stat = PS_PREDICT_MEDIAN;
            else if (!strcmp(v, "min")) stat = PS_PREDICT_MIN;
            else return ps_cli_usage(cli, "--measured must be median or min, not '%s'", v);
            continue;
        }
        if ((v = ps_cli_arg(cli, &k, "--cores"))) {
            char *e;
            long c = strtol(v, &e, 10);
            if (!strcmp(v, "auto")) cores = -1;
            else if (e == v || *e || c < 0 || c > 64)
                return ps_cli_usage(cli, "--cores must be auto or 0..64, not '%s'", v);
            else cores = (int)c;
            continue;
        }
        if (!run && !ho && a[0] != '-')
            return ps_cli_usage(cli, "'%s': calibrate takes its specs with --run SPEC TRACE", a);
        if (!run && !ho) return ps_cli_usage(cli, "unknown option '%s'", a);
        if (k + 2 >= cli->argc || !*cli->argv[k + 1] || !*cli->argv[k + 2] ||
            cli->argv[k + 1][0] == '-' || cli->argv[k + 2][0] == '-')
            return ps_cli_usage(cli, "%s needs SPEC TRACE", a);
        if (n == MAX_RUNS) return ps_cli_usage(cli, "at most %d runs", MAX_RUNS);
        specs[n] = cli->argv[k + 1];
        traces[n] = cli->argv[k + 2];
        hold[n++] = ho;
        k += 2;
    }
    int n_fit = 0;
    for (int k = 0; k < n; k++) n_fit += !hold[k];
    if (!n_fit) return ps_cli_usage(cli, "at least one --run SPEC TRACE is required");
    struct ps_diag d;
    ps_diag_clear(&d);
    if (cli->outdir && ps_out_check(cli->outdir, &d)) return ps_cli_fail(&d, PS_EXIT_INPUT);
    struct ps_predict p;
    int code = PS_EXIT_OK;
    if (ps_study_predict(specs, traces, hold, n, loss, cores, stat, &p, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (cli->outdir && ps_costs_write(p.fit.costs, cli->outdir, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    const struct ps_calib_fit *f = &p.fit;
    bool quiet = cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-"));
    if (!quiet) {
        int n_cfg = 0;
        for (int j = 0; j < p.n_groups; j++) n_cfg += !p.groups[j].holdout;
        printf("calibrate: %d run%s to fit (%d configuration%s), %d held out", n_fit,
               n_fit == 1 ? "" : "s", n_cfg, n_cfg == 1 ? "" : "s", n - n_fit);
        if (p.n_fitted < n_fit)
            printf("; the fit reads %d: the least disturbed quarter (smallest makespans) of "
                   "each configuration's runs, as --measured min compares", p.n_fitted);
        printf("\n");
        printf("fit: %u observations, %u parameters, rank %u, %u host-bound starts, %u outliers, "
               "rms %.3f us\n",
               f->n_obs, f->n_params, f->rank, f->n_host_bound, f->n_trimmed, f->rms_us);
        for (int j = 0; j < f->n_parts; j++) {
            char w[64];
            static const char *const tn[PS_CALT__COUNT] = {"F fixed us", "F us/sample",
                                                           "B fixed us", "B us/sample",
                                                           "R-F fixed us", "R-F us/sample",
                                                           "Fckpt-F fixed us",
                                                           "Fckpt-F us/sample",
                                                           "F us/sample^2", "B us/sample^2",
                                                           "Brec-B us/sample",
                                                           "B1st-B us/sample"};
            for (int t = 0; t < PS_CALT__COUNT; t++) {
                snprintf(w, sizeof(w), "partition %d %s", j, tn[t]);
                print_term(w, f->term[t][j], f->term_sd[t][j], f->term_free[t][j]);
            }
        }
        print_term("copy bandwidth B/s", f->value[PS_CAL_BANDWIDTH], f->sd[PS_CAL_BANDWIDTH], NAN);
        print_term("copy latency us", f->value[PS_CAL_LATENCY], f->sd[PS_CAL_LATENCY],
                   f->free_value[PS_CAL_LATENCY]);
        print_term("launch overhead us", f->value[PS_CAL_LAUNCH], f->sd[PS_CAL_LAUNCH],
                   f->free_value[PS_CAL_LAUNCH]);
        if (cli->outdir) printf("costs written to %s\n", cli->outdir);
        if (cores < 0) {
            printf("cores (chosen on the fitted runs, mean |makespan error|):");
            for (int c = 0; c <= PS_PREDICT_MAX_DEVICES; c++)
                if (isfinite(p.fit_error[c]))
                    printf(" %s%d: %.1f%%", c ? "" : "simulator ", c, 100 * p.fit_error[c]);
            printf("\n");
        }
        if (p.cores) printf("simulated as devices on threads sharing %d core%s (sim/cores.h)\n",
                            p.cores, p.cores == 1 ? "" : "s");
        else printf("simulated by the pipeline simulator (sim/sim.h)\n");
        printf("predicted (simulated with the fit) vs measured makespan in ms (the %s of a\n"
               "configuration's runs, [min..max]), error = (predicted - measured) / measured, mean\n"
               "bubble predicted and measured (median), busy ms per device predicted/measured:\n",
               stat == PS_PREDICT_MIN ? "minimum" : "median");
        printf("  %-34s %6s %-11s %8s %8s %8s  %6s %6s  busy\n", "run", "chunks", "checkpoint",
               "pred", "meas", "error", "bubble", "meas");
        for (int role = 1; role >= 0; role--) {
            bool any = false;
            for (int j = 0; j < p.n_groups; j++) any |= p.groups[j].holdout == role;
            if (!any) continue;
            printf(" %s:\n", role ? "held out" : "fitted (in-sample)");
            for (int j = 0; j < p.n_groups; j++)
                if (p.groups[j].holdout == role) print_group(&p, &p.groups[j]);
        }
        if (isfinite(p.max_holdout_error))
            printf("held-out makespan error: mean %.1f%%, max %.1f%%\n",
                   100 * p.mean_holdout_error, 100 * p.max_holdout_error);
    }
    if (cli->json) {
        cJSON *root = ps_report_new();
        cJSON_AddItemToObject(root, "calibration", ps_predict_json(&p, loss));
        if (ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
        cJSON_Delete(root);
    }
out:
    ps_study_predict_finish(&p);
    return code;
}
