/* pipescope diagnose: everything this machine can find out about a spec, as one report folder.
 *
 *   diagnose SPEC -o DIR [--chunks 1,2,4,...] [--no-drift] [--costs FILE] [--steps N]
 *
 * Steps: static checks with the no-phony what-if (check), the task graph (graph), the simulated
 * timeline (simulate), a real run on the CPU (and on CUDA when ps_exec_backend_available says
 * so), measured vs simulated (compare, plus a calibration of the costs to the CPU run), and a
 * BatchNorm drift sweep over chunks for plain and deferred BN (drift), and one forward-only
 * train-mode pass of the spec as it is (BN adaptation: does a pass without backward update the
 * running statistics, and from how many micro-batches; ps_bn_adaptation). Then:
 *
 *   DIR/index.html        static page, no JavaScript: findings, tables, linked SVGs
 *   DIR/report.json       the report JSON (spec, graph, analysis, simulation, execution,
 *                         comparison, drift)
 *   DIR/simulated.json, DIR/measured-cpu.json (-cuda.json)   Chrome traces for Perfetto
 *   DIR/graph.svg, graph-errors.svg, timeline.svg, drift-*.svg, costs-cpu.json
 *
 * and prints the main findings in plain words on stdout. Everything is written into DIR's
 * temporary twin, swapped in only when all of it succeeded (viz/out.c: an earlier DIR is
 * replaced then, and only when pipescope wrote it), so a failed diagnose leaves no partial
 * folder behind.
 * Exit codes: 0 ok (findings are results, not failures), 2 bad input or usage.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "src/cli/cmp_report.h"
#include "src/cli/progress.h"
#include "sim/cost.h"
#include "src/drift.h"
#include "kernels/exec.h"
#include "viz/docs.h"
#include "viz/html.h"
#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/report.h"
#include "viz/viz.h"
#include "sim/calibrate.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct diag_run {
    const char *name; /* "cpu", "cuda" */
    bool ok;
    char why[512];
    struct ps_exec_result res;
    struct ps_compare cmp;
    bool have_cmp;
};

struct findings {
    char line[16][512];
    int n;
};

static void finding(struct findings *f, struct ps_html *h, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finding(struct findings *f, struct ps_html *h, const char *fmt, ...)
{
    if (f->n >= 16) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->line[f->n], sizeof(f->line[0]), fmt, ap);
    va_end(ap);
    ps_html_summary(h, f->line[f->n]);
    f->n++;
}

static const char *fmt(char *buf, int len, const char *f, double v)
{
    if (!isfinite(v)) snprintf(buf, len, "n/a");
    else snprintf(buf, len, f, v);
    return buf;
}

#define CELL(k) (cells[k] = bufs[k], bufs[k])

/* ---- the time budget (issue #12: about 60 s of work on 2 cores by default) ---------------- *
 * The CPU run is watched through the executor's progress hook: once it has run for a second,
 * the FLOPs done so far give its total time; when that ends past the phase's deadline (plus a
 * quarter of the phase's share of the budget) the run stops and is retried with one step, or
 * skipped. The drift sweep is planned from the CPU run's measured step time: fewer steps per
 * setting first, then fewer chunk values (the spec's own first). Every reduction is written
 * down with the command that runs the rest; --full turns the budget off. */
struct budget {
    double limit_s;    /* <= 0: --full */
    double t0;         /* start of diagnose */
    double deadline;   /* the watched phase must end by this (absolute, s) */
    double slack;      /* tolerance beyond the deadline, s */
    bool stopped;      /* the hook stopped a run */
    double eta_total;  /* the stopped run's estimated total time, s */
    struct ps_progress pr;
    int n_reduced;
    char reduced[6][400];
};

static void reduced(struct budget *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reduced(struct budget *b, const char *fmt, ...)
{
    if (b->n_reduced >= 6) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->reduced[b->n_reduced++], sizeof(b->reduced[0]), fmt, ap);
    va_end(ap);
}

static bool run_progress(void *ctx, double done, double total)
{
    struct budget *b = ctx;
    double frac = total > 0 ? done / total : 0;
    ps_progress_update(&b->pr, frac, 0, 0, NULL);
    if (b->limit_s <= 0) return true;
    double el = ps_progress_now() - b->pr.t0;
    if (el < 1.0 || !(frac > 0)) return true;
    double eta_total = el / frac;
    if (b->pr.t0 + eta_total <= b->deadline + b->slack) return true;
    b->stopped = true;
    b->eta_total = eta_total;
    return false;
}

static void drift_progress(void *ctx, int k, int n, const struct ps_drift_setting *s,
                           const char *what)
{
    (void)s;
    (void)what;
    struct budget *b = ctx;
    ps_progress_update(&b->pr, n > 0 ? (double)(k - 1) / n : 0, k, n, "settings");
}

static const struct ps_drift_run *drift_find(const struct ps_drift *dr, int chunks,
                                             enum ps_bn_policy p, enum ps_checkpoint c)
{
    for (int k = 0; k < dr->n_runs; k++)
        if (dr->runs[k].s.chunks == chunks && dr->runs[k].s.policy == p &&
            dr->runs[k].s.checkpoint == c)
            return &dr->runs[k];
    return NULL;
}

int ps_cmd_diagnose(struct ps_cli *cli)
{
    const char *costs_path = NULL, *v;
    int *chunks = NULL, n_chunks = 0, steps = 0;
    bool drift_on = true;
    double budget_s = 60;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else if ((v = ps_cli_arg(cli, &k, "--budget"))) {
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || !(x >= 1) || x > 1e6) {
                free(chunks);
                return ps_cli_usage(cli, "--budget takes seconds, 1 or more, not '%s'", v);
            }
            budget_s = x;
        } else if (ps_cli_flag(cli, k, "--full")) budget_s = 0;
        else if ((v = ps_cli_arg(cli, &k, "--chunks"))) {
            free(chunks);
            chunks = NULL;
            if ((n_chunks = ps_cli_int_list(v, &chunks)) < 0)
                return ps_cli_usage(cli, "--chunks takes a list like 1,2,4,8, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--steps"))) {
            char *end;
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 1000) {
                free(chunks);
                return ps_cli_usage(cli, "--steps must be an integer in 1..1000, not '%s'", v);
            }
            steps = (int)x;
        } else if (ps_cli_flag(cli, k, "--no-drift")) drift_on = false;
        else {
            free(chunks);
            return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
        }
    }
    if (!cli->outdir || !*cli->outdir) {
        free(chunks);
        return ps_cli_usage(cli, "-o DIR is required");
    }
    if (costs_path && !*costs_path) {
        free(chunks);
        return ps_cli_usage(cli, "--costs needs a file");
    }
    double t_start = now_s();
    struct budget bud = {.limit_s = budget_s, .t0 = t_start};
    ps_progress_init(&bud.pr, cli);
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_ctx ctx;
    int code = ps_ctx_load(&ctx, cli, NULL);
    if (code) {
        free(chunks);
        return code;
    }
    struct ps_spec *spec = ctx.spec;
    struct ps_graph *g = ctx.graph;
    struct ps_costs *costs = NULL;
    struct ps_analysis an;
    memset(&an, 0, sizeof(an));
    struct ps_whatif nophony;
    memset(&nophony, 0, sizeof(nophony));
    struct ps_study_sim sr, sr2;
    memset(&sr, 0, sizeof(sr));
    memset(&sr2, 0, sizeof(sr2));
    struct diag_run runs[2];
    memset(runs, 0, sizeof(runs));
    runs[0].name = "cpu";
    runs[1].name = "cuda";
    struct ps_calib cal;
    memset(&cal, 0, sizeof(cal));
    struct ps_compare ccal;
    memset(&ccal, 0, sizeof(ccal));
    bool have_cal = false;
    struct ps_drift dr;
    memset(&dr, 0, sizeof(dr));
    bool have_drift = false;
    char drift_why[1024] = "it could not run";
    struct ps_html *h = ps_html_create(spec->name ? spec->name : spec->path);
    cJSON *root = ps_report_new();
    double *cost = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
    double *errs = NULL;
    struct findings fi = {.n = 0};
    char path[4200], b1[64], b2[64], b3[64], b4[64], b5[64], b6[64];
    const char *tmpdir = cli->outdir_files; /* DIR's twin (main.c, viz/out.c) */
    if (!h || !root || !cost) {
        code = ps_cli_fail(&(struct ps_diag){.where = "diagnose", .msg = "out of memory"}, PS_EXIT_INPUT);
        goto out;
    }
    if (ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    code = PS_EXIT_INPUT;

    /* ---- check ---------------------------------------------------------------------------- */
    ps_cost_fill_roofline(g, cost);
    if (ps_analysis_run(g, &ctx.order, cost, &an, &d)) goto fail;
    ps_study_whatif(spec, ctx.model, &an, &nophony);
    bool whatif = nophony.ran;
    const struct ps_analysis wan = nophony.an;
    ps_cli_info(cli, "diagnose: checks done (%.2f s)", now_s() - t_start);

    /* ---- simulate ------------------------------------------------------------------------- */
    struct ps_variant o;
    ps_variant_from_spec(spec, &o);
    if (ps_study_simulate(spec, ctx.model, &o, NULL, costs, &sr, &d)) goto fail;
    ps_cli_info(cli, "diagnose: simulated (%.2f s)", now_s() - t_start);

    /* ---- run: cpu, and cuda when there is one --------------------------------------------- */
    bool has_bn = false;
    for (int l = 0; l < spec->n_layers; l++) has_bn |= spec->layers[l].op == PS_OP_BATCHNORM;
    const int run_steps = steps ? steps : spec->steps > 0 ? spec->steps : 1;
    for (int b = 0; b < 2; b++) {
        struct diag_run *r = &runs[b];
        struct ps_exec_opts eo;
        ps_exec_opts_init(&eo);
        eo.backend = b ? PS_BACKEND_CUDA : PS_BACKEND_CPU;
        eo.steps = steps;
        eo.virtual_devices = b == 1;
        struct ps_diag rd;
        ps_diag_clear(&rd);
        if (!ps_exec_backend_available(eo.backend, &rd)) {
            ps_diag_format(&rd, r->why, sizeof(r->why));
            continue;
        }
        int rrc;
        if (b == 0) {
            /* the CPU run gets half the budget when a drift sweep follows, else most of it */
            double share = bud.limit_s * (drift_on && has_bn ? 0.5 : 0.85);
            bud.deadline = t_start + share;
            bud.slack = 0.25 * share;
            bud.stopped = false;
            eo.progress = run_progress;
            eo.progress_ctx = &bud;
            ps_progress_begin(&bud.pr, "cpu run");
            rrc = ps_exec_run(g, &ctx.order, &eo, &r->res, &rd);
            double est_step = bud.eta_total / run_steps;
            if (rrc && bud.stopped && run_steps > 1 &&
                ps_progress_now() + est_step <= bud.deadline + bud.slack) {
                bud.stopped = false;
                eo.steps = 1;
                ps_diag_clear(&rd);
                rrc = ps_exec_run(g, &ctx.order, &eo, &r->res, &rd);
                if (!rrc)
                    reduced(&bud,
                            "the CPU run trained 1 step instead of %d (one step takes about "
                            "%.1f s): pipescope run %s --steps %d --trace measured.json",
                            run_steps, est_step, spec->path, run_steps);
            }
            ps_progress_end(&bud.pr, rrc && bud.stopped ? "stopped (over the budget)" : "done");
            if (rrc && bud.stopped) {
                snprintf(r->why, sizeof(r->why),
                         "skipped: one training step would take roughly %.0f s on this CPU "
                         "(estimated from its first %.1f s), beyond the time budget of %.0f s",
                         bud.eta_total / run_steps, ps_progress_now() - bud.pr.t0, bud.limit_s);
                reduced(&bud,
                        "the CPU run was skipped (one step would take about %.0f s): pipescope "
                        "run %s --steps 1 --trace measured.json",
                        bud.eta_total / run_steps, spec->path);
                continue;
            }
        } else {
            rrc = ps_exec_run(g, &ctx.order, &eo, &r->res, &rd);
        }
        if (rrc) {
            ps_diag_format(&rd, r->why, sizeof(r->why));
            ps_cli_warn(cli, "%s run failed: %s", r->name, r->why);
            continue;
        }
        r->ok = true;
        if (ps_compare_run(sr.g, &sr.sim.trace, &r->res.trace, &r->cmp, &rd) == 0) r->have_cmp = true;
        ps_cli_info(cli, "diagnose: %s run done (%.2f s)", r->name, now_s() - t_start);
    }
    if (runs[0].ok && runs[0].have_cmp) {
        struct ps_diag cd;
        ps_diag_clear(&cd);
        if (ps_calibrate(sr.g, &sr.order, &runs[0].res.trace, true, &cal, &cd) == 0 &&
            ps_study_simulate(spec, ctx.model, &o, NULL, cal.costs, &sr2, &cd) == 0 &&
            ps_compare_run(sr2.g, &sr2.sim.trace, &runs[0].res.trace, &ccal, &cd) == 0)
            have_cal = true;
    }

    /* ---- drift ---------------------------------------------------------------------------- */
    if (drift_on && has_bn) {
        int defc[16], nd = 0;
        if (!chunks) {
            /* 1, 2, 4, ... up to the batch, stopping before BatchNorm would see one value per
               channel (those settings cannot train; --chunks can still ask for them) */
            char why[192];
            for (int c = 1; c <= spec->batch && nd < 15; c *= 2) {
                if (ps_drift_check_chunks(spec, ctx.model, c, why, sizeof(why))) break;
                defc[nd++] = c;
            }
            bool in = false;
            for (int k = 0; k < nd; k++) in |= defc[k] == spec->chunks;
            if (!in) defc[nd++] = spec->chunks;
        }
        enum ps_bn_policy pol[2] = {PS_BN_PLAIN, PS_BN_DEFERRED};
        int *list = chunks ? chunks : defc, nl = chunks ? n_chunks : nd;
        int dsteps = run_steps, plan[64], np = 0;
        for (int k = 0; k < nl && np < 64; k++) plan[np++] = list[k];
        bool drift_fits = true;
        if (bud.limit_s > 0) {
            /* cost of one setting: its steps at the CPU run's step time (+20% for the extra
               micro-batch overheads); the reference run counts as one more setting, and a
               forward-only pass and the files are left room for */
            double step_s = NAN;
            if (runs[0].ok && runs[0].res.steps > 0) {
                step_s = 0;
                for (int k = 0; k < runs[0].res.steps; k++) step_s += runs[0].res.step_us[k];
                step_s = 1.2e-6 * step_s / runs[0].res.steps;
            }
            double left = bud.limit_s - (now_s() - t_start) - (isfinite(step_s) ? 0.5 * step_s : 0) - 1;
            char all[256] = "";
            for (int k = 0, o2 = 0; k < nl && o2 < 240; k++)
                o2 += snprintf(all + o2, sizeof(all) - (size_t)o2, "%s%d", k ? "," : "", list[k]);
            if (!isfinite(step_s) || left < 3 * step_s) {
                drift_fits = false;
                snprintf(drift_why, sizeof(drift_why),
                         "skipped to fit the time budget of %.0f s%s", bud.limit_s,
                         isfinite(step_s) ? "" : " (its cost is estimated from the CPU run, which did not fit)");
                reduced(&bud, "the BatchNorm drift sweep was skipped: pipescope drift %s --chunks %s "
                              "--policy plain,deferred --steps %d -o drift",
                        spec->path, all, run_steps);
            } else {
                double per = 2 * np + 1;
                if (per * dsteps * step_s > left) {
                    int fit = (int)floor(left / (per * step_s));
                    dsteps = fit < 1 ? 1 : fit < dsteps ? fit : dsteps;
                }
                if (per * dsteps * step_s > left) {
                    /* fewer chunk values: the spec's own first, then in list order */
                    int keep = (int)floor((left / (dsteps * step_s) - 1) / 2);
                    if (keep < 1) keep = 1;
                    int sel[64], ns = 0;
                    for (int k = 0; k < np && ns < keep; k++)
                        if (plan[k] == spec->chunks) sel[ns++] = plan[k];
                    for (int k = 0; k < np && ns < keep; k++)
                        if (plan[k] != spec->chunks) sel[ns++] = plan[k];
                    char rest[256] = "";
                    for (int k = 0, o2 = 0; k < np && o2 < 240; k++) {
                        bool in = false;
                        for (int j = 0; j < ns; j++) in |= sel[j] == plan[k];
                        if (!in) o2 += snprintf(rest + o2, sizeof(rest) - (size_t)o2, "%s%d", o2 ? "," : "", plan[k]);
                    }
                    /* ascending, as the tables and plots show chunks */
                    for (int a = 1; a < ns; a++)
                        for (int c = a; c > 0 && sel[c - 1] > sel[c]; c--) {
                            int t = sel[c];
                            sel[c] = sel[c - 1];
                            sel[c - 1] = t;
                        }
                    np = ns;
                    memcpy(plan, sel, (size_t)ns * sizeof(int));
                    reduced(&bud, "the drift sweep ran %d of its %d chunk values; the rest: "
                                  "pipescope drift %s --chunks %s --policy plain,deferred --steps %d -o drift",
                            np, nl, spec->path, rest, dsteps);
                }
                if (dsteps < run_steps)
                    reduced(&bud, "the drift sweep trained %d step%s per setting instead of %d",
                            dsteps, dsteps == 1 ? "" : "s", run_steps);
            }
        }
        struct ps_drift_opts dopt = {.n_chunks = np,
                                     .chunks = plan,
                                     .n_policies = 2,
                                     .policies = pol,
                                     .steps = dsteps,
                                     .progress = drift_progress,
                                     .progress_ctx = &bud};
        struct ps_diag dd;
        ps_diag_clear(&dd);
        ps_progress_begin(&bud.pr, "drift sweep");
        if (drift_fits && ps_drift_run(spec, ctx.model, &dopt, &dr, &dd) == 0) have_drift = true;
        else if (drift_fits) {
            ps_diag_format(&dd, drift_why, sizeof(drift_why));
            ps_cli_warn(cli, "drift sweep skipped: %s", drift_why);
        }
        ps_progress_end(&bud.pr, "done");
        ps_cli_info(cli, "diagnose: drift done (%.2f s)", now_s() - t_start);
    }

    /* ---- BN adaptation: one forward-only pass of the spec as it is ------------------------- */
    int adapt_updates = -1, adapt_layer = -1;
    if (has_bn) {
        struct ps_exec_opts fo;
        ps_exec_opts_init(&fo);
        fo.steps = 1;
        fo.trace = false;
        fo.forward_only = true;
        /* within what is left of the budget (at least 5 s) */
        bud.deadline = bud.limit_s > 0 ? fmax(t_start + bud.limit_s, now_s() + 5) : 0;
        bud.slack = 0;
        bud.stopped = false;
        fo.progress = run_progress;
        fo.progress_ctx = &bud;
        ps_progress_begin(&bud.pr, "BN adaptation pass");
        struct ps_exec_result fr;
        struct ps_diag fd;
        ps_diag_clear(&fd);
        int frc = ps_exec_run(g, &ctx.order, &fo, &fr, &fd);
        ps_progress_end(&bud.pr, frc && bud.stopped ? "stopped (over the budget)" : "done");
        if (frc && bud.stopped) {
            reduced(&bud, "the BN adaptation pass was skipped (a forward pass would take about "
                          "%.0f s): pipescope run %s --forward-only --steps 1",
                    bud.eta_total, spec->path);
        } else if (frc == 0) {
            /* the BN layer with the fewest updates: the one adaptation misses most */
            for (int l = 0; l < spec->n_layers; l++) {
                if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
                int u = 0;
                for (uint32_t k = 0; k < fr.n_bn; k++) u += fr.bn[k].layer == l;
                if (adapt_updates < 0 || u < adapt_updates) {
                    adapt_updates = u;
                    adapt_layer = l;
                }
            }
            ps_exec_result_finish(&fr);
        } else {
            char w[1024];
            ps_cli_warn(cli, "BN adaptation pass skipped: %s", ps_diag_format(&fd, w, sizeof(w)));
        }
    }

    /* ---- files into DIR's twin, swapped in when the command has succeeded ------------------ */
#define OUT(name) (snprintf(path, sizeof(path), "%s/%s", tmpdir, name), path)
    if (ps_chrome_write_file(sr.g, &sr.sim.trace, NULL, OUT("simulated.json"), &d)) goto fail;
    for (int b = 0; b < 2; b++) {
        if (!runs[b].ok) continue;
        snprintf(b1, sizeof(b1), "measured-%s.json", runs[b].name);
        if (ps_chrome_write_file(g, &runs[b].res.trace, NULL, OUT(b1), &d)) goto fail;
    }
    struct ps_dot_opts dop;
    ps_dot_opts_init(&dop);
    bool big = g->n_nodes > 300;
    dop.tasks_only = big;
    dop.title = spec->name;
    if (ps_svg_write_file(g, &dop, OUT("graph.svg"), &d)) goto fail;
    const struct diag_run *best = runs[1].have_cmp ? &runs[1] : runs[0].have_cmp ? &runs[0] : NULL;
    if (best) {
        /* the CPU run against the simulation with the costs calibrated to it (same scale,
           comparable shapes: against the spec's GPU costs every task is ~100% off); without a
           calibration the two timelines get their own time axes */
        bool cal_sim = have_cal && best == &runs[0];
        const struct ps_study_sim *lower = cal_sim ? &sr2 : &sr;
        errs = ps_compare_node_errors(cal_sim ? &ccal : &best->cmp, sr.g);
        struct ps_dot_opts eo = dop;
        eo.node_value = errs;
        eo.value_name = cal_sim ? "duration error vs the calibrated simulation, (measured - "
                                  "simulated) / measured"
                                : "duration error (measured - simulated) / measured";
        eo.tasks_only = true;
        if (!errs || ps_svg_write_file(sr.g, &eo, OUT("graph-errors.svg"), &d)) goto fail;
        struct ps_gantt_opts go = {
            .title = "measured (above) and simulated (below)",
            .label = best == &runs[1] ? "measured on cuda" : "measured on cpu",
            .label2 = cal_sim ? "simulated with the costs calibrated to this run" : "simulated",
            .issue2_us = lower->sim.issue_us,
            .launch2_us = lower->sim.launch_us};
        if (ps_plot_gantt_file(sr.g, &best->res.trace, &lower->sim.trace, &go,
                               OUT("timeline.svg"), &d))
            goto fail;
    }
    struct ps_gantt_opts gs = {.title = "simulated timeline", .label = "simulated",
                               .issue_us = sr.sim.issue_us, .launch_us = sr.sim.launch_us};
    if (ps_plot_gantt_file(sr.g, &sr.sim.trace, NULL, &gs, OUT("timeline-simulated.svg"), &d))
        goto fail;
    if (have_cal && ps_costs_write(cal.costs, OUT("costs-cpu.json"), &d)) goto fail;
    if (have_drift && (ps_drift_plot(&dr, "var_err", OUT("drift-var.svg"), &d) ||
                       ps_drift_plot(&dr, "mean_err", OUT("drift-mean.svg"), &d) ||
                       ps_drift_plot(&dr, "var_gap", OUT("drift-gap.svg"), &d)))
        goto fail;

    /* ---- the page and the findings -------------------------------------------------------- */
    {
        char sub[1024];
        snprintf(sub, sizeof(sub),
                 "%s: %s, batch %lld in %d micro-batches (chunks %d), %d partitions on %d "
                 "device%s, checkpoint %s, batchnorm %s, phony edges %s",
                 spec->path, ps_schedule_name(spec->schedule), (long long)spec->batch,
                 spec->mb_count, spec->chunks, spec->n_partitions, spec->n_devices,
                 spec->n_devices == 1 ? "" : "s", ps_checkpoint_name(spec->checkpoint),
                 ps_bn_policy_name(spec->batchnorm), spec->phony ? "on" : "off");
        ps_html_subtitle(h, sub);
    }
    /* findings: checks */
    int n_checks = 0;
    for (int c = 0; c < PS_CHECK__COUNT; c++) n_checks += an.checked[c] > 0;
    char wi[512] = "";
    if (whatif) {
        if (nophony.lost)
            snprintf(wi, sizeof(wi),
                     "; without phony edges backward order is not guaranteed (%u pairs) and peak "
                     "memory grows %.1fx",
                     nophony.lost, nophony.mem_growth);
        else
            snprintf(wi, sizeof(wi), "; without phony edges every invariant still holds");
    }
    if (an.ok)
        finding(&fi, h, "checks: all %d invariants hold%s", n_checks, wi);
    else
        finding(&fi, h, "checks: %u violation%s of the ordering invariants (see the checks table)%s",
                an.n_violations, an.n_violations == 1 ? "" : "s", wi);
    /* findings: timing */
    const struct ps_sim *sim = &sr.sim;
    if (runs[0].have_cmp) {
        const struct ps_compare *c = &runs[0].cmp;
        bool target_cpu = true;
        for (int j = 0; j < spec->n_partitions; j++) target_cpu &= spec->devices[j].kind == PS_DEV_CPU;
        /* the comparison measures both timelines from their first task's start to their last
           task's end ("task span"), so the simulated value here is the makespan less the first
           launch; name it so the two numbers never look like one quantity with two values */
        if (!target_cpu || fabs(c->makespan_error) > 0.5) {
            char cb[320] = "";
            if (have_cal) {
                /* honest: the makespan AND the per-task errors, and say when a fit made one worse */
                bool span_worse = fabs(ccal.makespan_error) > fabs(c->makespan_error);
                bool p95_worse = ccal.dur_rel.p95 > c->dur_rel.p95;
                snprintf(cb, sizeof(cb),
                         "; costs calibrated to this run (costs-cpu.json): span error %+.1f%% -> "
                         "%+.1f%%%s, p95 task duration error %.0f%% -> %.0f%%%s",
                         100 * c->makespan_error, 100 * ccal.makespan_error,
                         span_worse ? " (worse)" : "", 100 * c->dur_rel.p95,
                         100 * ccal.dur_rel.p95, p95_worse ? " (worse)" : "");
            }
            finding(&fi, h, "task span simulated %s, measured on CPU %s: %s%s",
                    ps_cli_time(c->sim_makespan_us, b1, sizeof(b1)),
                    ps_cli_time(c->meas_makespan_us, b2, sizeof(b2)),
                    target_cpu ? "the cost model does not fit this CPU"
                               : "the CPU is not the target device (use --costs for real GPU "
                                 "times)",
                    cb);
        } else {
            finding(&fi, h, "task span simulated %s, measured on CPU %s (error %+.1f%%)",
                    ps_cli_time(c->sim_makespan_us, b1, sizeof(b1)),
                    ps_cli_time(c->meas_makespan_us, b2, sizeof(b2)), 100 * c->makespan_error);
        }
        finding(&fi, h,
                "measured order matches the simulation up to %llu inversion%s of %llu pairs; the "
                "CPU run broke %u of %u dependencies",
                (unsigned long long)c->inversions, c->inversions == 1 ? "" : "s",
                (unsigned long long)c->pairs, c->n_dep_violations, c->n_deps_checked);
    } else {
        finding(&fi, h, "simulated makespan %s; no CPU run to compare with (%s)",
                ps_cli_time(sim->makespan_us, b1, sizeof(b1)), runs[0].why);
    }
    if (runs[1].have_cmp)
        finding(&fi, h, "task span measured on CUDA %s against simulated %s (error %+.1f%%)",
                ps_cli_time(runs[1].cmp.meas_makespan_us, b1, sizeof(b1)),
                ps_cli_time(runs[1].cmp.sim_makespan_us, b2, sizeof(b2)),
                100 * runs[1].cmp.makespan_error);
    finding(&fi, h, "bubble %.1f%% of the simulated makespan on average; recompute costs %.1f%% of forward + backward",
            100 * sim->bubble_fraction, 100 * sim->recompute_overhead);
    /* findings: BN */
    if (have_drift) {
        const struct ps_drift_run *pl = drift_find(&dr, spec->chunks, PS_BN_PLAIN, spec->checkpoint);
        const struct ps_drift_run *de = drift_find(&dr, spec->chunks, PS_BN_DEFERRED, spec->checkpoint);
        if (pl && pl->n_layers) {
            int worst = 0;
            for (int k = 1; k < pl->n_layers; k++)
                if (pl->layers[k].var_err_max > pl->layers[worst].var_err_max) worst = k;
            double dv = NAN;
            if (de)
                for (int k = 0; k < de->n_layers; k++)
                    if (de->layers[k].layer == pl->layers[worst].layer) dv = de->layers[k].var_err_max;
            finding(&fi, h,
                    "BN layer %d: running_var %.1f%% off the full-batch value at chunks=%d with "
                    "plain BN (%d updates per step); deferred BN: %s",
                    pl->layers[worst].layer, 100 * pl->layers[worst].var_err_max, spec->chunks,
                    pl->layers[worst].updates, fmt(b1, sizeof(b1), "%.1f%%", 100 * dv));
        }
        if (dr.n_skipped)
            finding(&fi, h, "drift: %d setting%s skipped (%s)", dr.n_skipped,
                    dr.n_skipped == 1 ? "" : "s", dr.skipped[0].reason);
    }

    if (adapt_updates >= 0) {
        char w[512];
        bool ok = ps_bn_adaptation(&g->var, w, sizeof(w));
        finding(&fi, h,
                "BN adaptation%s: one forward-only train-mode pass (no backward) updated layer "
                "%d's running statistics %d time%s for %d micro-batch%s; %s, checkpoint %s: %s",
                ok ? "" : " WARNING", adapt_layer, adapt_updates, adapt_updates == 1 ? "" : "s",
                g->var.mb_count, g->var.mb_count == 1 ? "" : "es",
                ps_bn_policy_name(g->var.batchnorm), ps_checkpoint_name(g->var.checkpoint), w);
    }

    /* findings: what the time budget left out, and how to run it */
    if (bud.n_reduced) {
        char what[400] = "";
        for (int k = 0, o2 = 0; k < bud.n_reduced && o2 < 380; k++) {
            /* the first clause of each note: "the CPU run was skipped (...)" */
            const char *colon = strstr(bud.reduced[k], ": pipescope");
            int len = colon ? (int)(colon - bud.reduced[k]) : (int)strlen(bud.reduced[k]);
            o2 += snprintf(what + o2, sizeof(what) - (size_t)o2, "%s%.*s", k ? "; " : "", len,
                           bud.reduced[k]);
        }
        finding(&fi, h, "time budget %.0f s: %s. The commands for the rest are in the 'Budget' "
                        "section; pipescope diagnose %s -o %s --full runs everything",
                bud.limit_s, what, spec->path, cli->outdir);
    }

    /* sections */
    ps_html_section(h, "checks", "Checks");
    {
        const char *head[] = {"check", "pairs checked", "violations", "without phony edges"};
        ps_html_para_link(h, "What each check means: ", "semantics.html#checks",
                          "src/SEMANTICS.md, 'Checks'",
                          " (a copy of pipescope's documentation; the task names F, B, R, C, W "
                          "are in its first table).");
        ps_html_table(h, "ordering invariants (src/SEMANTICS.md), as happens-before queries on "
                         "the graph", 4, head);
        for (int c = 0; c < PS_CHECK__COUNT; c++) {
            if (!an.checked[c]) continue;
            char bufs[4][64];
            const char *cells[4];
            snprintf(CELL(0), 64, "%s", ps_check_name(c));
            snprintf(CELL(1), 64, "%u", an.checked[c]);
            snprintf(CELL(2), 64, "%u", an.per_check[c]);
            if (whatif) snprintf(CELL(3), 64, "%u", wan.per_check[c]);
            else snprintf(CELL(3), 64, "n/a");
            ps_html_row(h, cells);
        }
        for (uint32_t k = 0; k < an.n_kept && k < 10; k++) ps_html_para(h, "violation: %s", an.v[k].msg);
    }
    ps_html_section(h, "graph", "Task graph");
    ps_html_para(h, "%u nodes, %u edges; %s. Data edges solid, phony (fork/join) edges dashed, "
                    "recompute shaded.",
                 g->n_nodes, g->n_edges,
                 big ? "tasks-only view (fork/join/copy/wait contracted into edges)" : "every node");
    ps_html_image_wide(h, "graph.svg", "dependency graph",
                       "the task graph at full size (scroll, or click to open graph.svg)");
    {
        char *legend = ps_dot_legend_svg();
        if (legend)
            ps_html_svg(h, legend, "node shapes and edge styles (src/SEMANTICS.md has the task "
                                   "names)");
        free(legend);
    }
    ps_html_section(h, "memory", "Memory");
    {
        const char *head[] = {"device", "peak activations (engine order)", "without phony edges",
                              "simulated peak", "at"};
        ps_html_table(h, "activation memory per device", 5, head);
        for (int k = 0; k < an.n_devices; k++) {
            char bufs[5][64];
            const char *cells[5];
            ps_viz_device_name(g, k, CELL(0), 64);
            ps_cli_bytes(an.mem ? (double)an.mem[k].peak_bytes : NAN, CELL(1), 64);
            if (whatif && wan.mem) ps_cli_bytes((double)wan.mem[k].peak_bytes, CELL(2), 64);
            else snprintf(CELL(2), 64, "n/a");
            ps_cli_bytes(k < sim->n_devices ? (double)sim->dev[k].peak_bytes : NAN, CELL(3), 64);
            ps_cli_time(k < sim->n_devices ? sim->dev[k].peak_t_us : NAN, CELL(4), 64);
            ps_html_row(h, cells);
        }
    }
    ps_html_section(h, "simulation", "Simulation");
    ps_html_para(h, "makespan %s, bubble %.1f%%, forward %s, backward %s, recompute %s (%.1f%% of "
                    "forward + backward), copies %s; costs: %s.",
                 ps_cli_time(sim->makespan_us, b1, sizeof(b1)), 100 * sim->bubble_fraction,
                 ps_cli_time(sim->forward_us, b2, sizeof(b2)),
                 ps_cli_time(sim->backward_us, b3, sizeof(b3)),
                 ps_cli_time(sim->recompute_us, b4, sizeof(b4)), 100 * sim->recompute_overhead,
                 ps_cli_time(sim->copy_us, b5, sizeof(b5)),
                 costs ? (costs_path ? costs_path : spec->costs) : "roofline (spec hardware)");
    {
        const char *head[] = {"device", "busy", "bubble", "forward", "backward", "recompute", "in flight"};
        ps_html_table(h, "per device (simulated)", 7, head);
        for (int k = 0; k < sim->n_devices; k++) {
            const struct ps_sim_device *dv = &sim->dev[k];
            char bufs[7][64];
            const char *cells[7];
            ps_viz_device_name(sr.g, k, CELL(0), 64);
            ps_cli_time(dv->busy_us, CELL(1), 64);
            snprintf(CELL(2), 64, "%.1f%%", 100 * dv->bubble_fraction);
            ps_cli_time(dv->forward_us, CELL(3), 64);
            ps_cli_time(dv->backward_us, CELL(4), 64);
            ps_cli_time(dv->recompute_us, CELL(5), 64);
            snprintf(CELL(6), 64, "%u", dv->max_in_flight);
            ps_html_row(h, cells);
        }
    }
    ps_html_image(h, "timeline-simulated.svg", "simulated timeline",
                  "simulated timeline (simulated.json opens in Perfetto)");
    ps_html_section(h, "comparison", "Measured vs simulated");
    for (int b = 0; b < 2; b++) {
        const struct diag_run *r = &runs[b];
        if (!r->ok) {
            ps_html_para(h, "%s: not run (%s)", r->name, r->why);
            continue;
        }
        if (!r->have_cmp) continue;
        const struct ps_compare *c = &r->cmp;
        const char *head[] = {"metric", "measured", "simulated", "error"};
        char cap[128];
        if (r->res.steps == 1)
            snprintf(cap, sizeof(cap), "%s run (measured-%s.json), its only step", r->name,
                     r->name);
        else
            snprintf(cap, sizeof(cap), "%s run (measured-%s.json), the last of its %d steps",
                     r->name, r->name, r->res.steps);
        ps_html_table(h, cap, 4, head);
        char bufs[4][64];
        const char *cells[4];
        snprintf(CELL(0), 64, "task span (first start to last end)");
        ps_cli_time(c->meas_makespan_us, CELL(1), 64);
        ps_cli_time(c->sim_makespan_us, CELL(2), 64);
        snprintf(CELL(3), 64, "%+.1f%%", 100 * c->makespan_error);
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "task duration error, median / p95");
        snprintf(CELL(1), 64, "%.28s / %.28s", fmt(b1, 32, "%.1f%%", 100 * c->dur_rel.median),
                 fmt(b2, 32, "%.1f%%", 100 * c->dur_rel.p95));
        snprintf(CELL(2), 64, " ");
        snprintf(CELL(3), 64, " ");
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "task start error, median / p95");
        snprintf(CELL(1), 64, "%s / %s", ps_cli_time(c->start.median, b1, 32),
                 ps_cli_time(c->start.p95, b2, 32));
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "order inversions (pairs)");
        snprintf(CELL(1), 64, "%llu of %llu", (unsigned long long)c->inversions,
                 (unsigned long long)c->pairs);
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "dependency violations");
        snprintf(CELL(1), 64, "%u of %u", c->n_dep_violations, c->n_deps_checked);
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "recompute overhead R/(F+B)");
        fmt(CELL(1), 64, "%.1f%%", 100 * c->meas_recompute_overhead);
        fmt(CELL(2), 64, "%.1f%%", 100 * c->sim_recompute_overhead);
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "copy/compute overlap");
        fmt(CELL(1), 64, "%.1f%%", 100 * c->meas_copy_overlap);
        fmt(CELL(2), 64, "%.1f%%", 100 * c->sim_copy_overlap);
        ps_html_row(h, cells);
        for (int k = 0; k < c->n_devices; k++) {
            char dn[32];
            snprintf(CELL(0), 64, "bubble %s", ps_viz_device_name(g, k, dn, sizeof(dn)));
            fmt(CELL(1), 64, "%.1f%%", 100 * c->dev[k].meas_bubble);
            fmt(CELL(2), 64, "%.1f%%", 100 * c->dev[k].sim_bubble);
            ps_html_row(h, cells);
        }
        if (b == 0 && have_cal) {
            bool span_worse = fabs(ccal.makespan_error) > fabs(c->makespan_error);
            bool med_worse = ccal.dur_rel.median > c->dur_rel.median;
            bool p95_worse = ccal.dur_rel.p95 > c->dur_rel.p95;
            ps_html_para(h,
                         "calibrated to this run (costs-cpu.json, %u observations, rank %u of %u, "
                         "launch overhead %s): task span error %+.1f%% -> %+.1f%%%s; task "
                         "duration error median %s -> %s%s, p95 %s -> %s%s.%s",
                         cal.n_obs, cal.rank, cal.n_params,
                         cal.fitted[PS_CAL_LAUNCH] ? ps_cli_time(cal.value[PS_CAL_LAUNCH], b1, 32) : "not fitted",
                         100 * c->makespan_error, 100 * ccal.makespan_error,
                         span_worse ? " (worse)" : "",
                         fmt(b4, 32, "%.1f%%", 100 * c->dur_rel.median),
                         fmt(b5, 32, "%.1f%%", 100 * ccal.dur_rel.median),
                         med_worse ? " (worse)" : "",
                         fmt(b2, 32, "%.1f%%", 100 * c->dur_rel.p95),
                         fmt(b3, 32, "%.1f%%", 100 * ccal.dur_rel.p95),
                         p95_worse ? " (worse)" : "",
                         span_worse || med_worse || p95_worse
                             ? " The fit is a least-squares compromise over all tasks: where a "
                               "figure got worse, per-partition costs cannot describe this run "
                               "(launch- or host-bound tasks, uneven layers)."
                             : "");
        }
    }
    if (best) {
        ps_html_image(h, "timeline.svg", "measured and simulated timelines",
                      have_cal && best == &runs[0]
                          ? "measured lanes above; below, the simulation with the costs "
                            "calibrated to this run (costs-cpu.json)"
                          : "measured lanes above, simulated lanes below, each on its own time "
                            "axis when their spans differ by more than 2x");
        ps_html_image_wide(h, "graph-errors.svg", "graph coloured by error",
                      have_cal && best == &runs[0]
                          ? "tasks coloured by relative duration error against the calibrated "
                            "simulation (white: equal, red: measured slower, blue: faster)"
                          : "tasks coloured by relative duration error (white: equal, red: "
                            "measured slower, blue: faster)");
    }
    ps_html_section(h, "batchnorm", "BatchNorm statistics");
    if (has_bn)
        ps_html_para_link(h, "How each BN policy updates the running statistics, and the closed "
                             "forms these tables are checked against: ",
                          "semantics.html#s7", "src/SEMANTICS.md section 7", ".");
    if (!has_bn) {
        ps_html_para(h, "the model has no BatchNorm layer");
    } else {
        if (runs[0].ok) {
            const struct ps_exec_result *r = &runs[0].res;
            const char *head[] = {"layer", "updates in the last step", "running_mean[0..3]",
                                  "running_var[0..3]", "num_batches_tracked"};
            ps_html_table(h, "after the CPU run", 5, head);
            for (int l = 0; l < spec->n_layers; l++) {
                if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
                const struct ps_layer_state *ls = &r->state.layers[l];
                char bufs[5][160];
                const char *cells[5];
                snprintf(CELL(0), 160, "%d", l);
                char *p = CELL(1);
                p[0] = '\0';
                for (uint32_t k = 0; k < r->n_bn; k++)
                    if (r->bn[k].layer == l && r->bn[k].step == r->steps - 1 && strlen(p) < 140) {
                        char x[16];
                        snprintf(x, sizeof(x), "%s%d%c", p[0] ? " " : "", r->bn[k].mb,
                                 "frc"[r->bn[k].phase]);
                        strcat(p, x);
                    }
                p = CELL(2);
                p[0] = '\0';
                char *q = CELL(3);
                q[0] = '\0';
                for (int c = 0; c < 4 && c < ls->channels; c++) {
                    char x[32];
                    snprintf(x, sizeof(x), "%s%.4g", c ? " " : "", (double)ls->running_mean[c]);
                    strcat(p, x);
                    snprintf(x, sizeof(x), "%s%.4g", c ? " " : "", (double)ls->running_var[c]);
                    strcat(q, x);
                }
                snprintf(CELL(4), 160, "%lld", (long long)ls->num_batches_tracked);
                ps_html_row(h, cells);
            }
        }
        if (have_drift) {
            const char *head[] = {"chunks", "m", "policy", "BN layer", "updates", "var error max",
                                  "mean error max", "var gap measured", "var gap predicted"};
            ps_html_table(h, "drift against the full-batch reference (chunks 1, plain BN)", 9, head);
            for (int k = 0; k < dr.n_runs; k++) {
                const struct ps_drift_run *r = &dr.runs[k];
                for (int l = 0; l < r->n_layers; l++) {
                    const struct ps_drift_layer *L = &r->layers[l];
                    char bufs[9][64];
                    const char *cells[9];
                    snprintf(CELL(0), 64, "%d", r->s.chunks);
                    snprintf(CELL(1), 64, "%d", r->m);
                    snprintf(CELL(2), 64, "%s", ps_bn_policy_name(r->s.policy));
                    snprintf(CELL(3), 64, "%d", L->layer);
                    snprintf(CELL(4), 64, "%d", L->updates);
                    fmt(CELL(5), 64, "%.2f%%", 100 * L->var_err_max);
                    fmt(CELL(6), 64, "%.3g", L->mean_err_max);
                    fmt(CELL(7), 64, "%.3g", L->var_gap_measured);
                    fmt(CELL(8), 64, "%.3g", L->var_gap_predicted);
                    ps_html_row(h, cells);
                }
            }
            ps_html_image(h, "drift-var.svg", "running_var error against chunks",
                          "running_var error against chunks, plain vs deferred BN");
            ps_html_image(h, "drift-mean.svg", "running_mean error against chunks",
                          "running_mean error against chunks");
            ps_html_image(h, "drift-gap.svg", "variance gap against chunks",
                          "what averaging micro-batch variances loses");
            for (int k = 0; k < dr.n_skipped; k++)
                ps_html_para(h, "skipped: chunks %d, %s BN, checkpoint %s: %s",
                             dr.skipped[k].s.chunks, ps_bn_policy_name(dr.skipped[k].s.policy),
                             ps_checkpoint_name(dr.skipped[k].s.checkpoint),
                             dr.skipped[k].reason);
        } else {
            ps_html_para(h, "no drift sweep (%s)", drift_on ? drift_why : "--no-drift");
        }
    }
    if (bud.n_reduced) {
        ps_html_section(h, "budget", "Budget");
        ps_html_para(h, "diagnose fits its work into a time budget (%.0f s here, --budget SECONDS "
                        "changes it, --full turns it off). This run left out:",
                     bud.limit_s);
        for (int k = 0; k < bud.n_reduced; k++) ps_html_para(h, "%s", bud.reduced[k]);
    }
    ps_html_section(h, "files", "Files");
    ps_html_para(h, "report.json (the whole report), simulated.json and measured-*.json (Chrome "
                    "traces: open them in Perfetto or chrome://tracing), graph.svg, timeline.svg, "
                    "drift-*.svg, costs-cpu.json (costs calibrated to the CPU run: pass it with "
                    "--costs).");
    ps_html_para_link(h, "Every file, JSON field and picture of this folder is described in ",
                      "report-format.html", "viz/REPORT.md", " (a copy).");

    /* report.json */
    ps_report_add_spec(root, spec);
    ps_report_add_graph(root, g);
    ps_report_add_analysis(root, g, &an, &ctx.order);
    ps_json_set(root, "simulation", ps_report_simulation(sr.g, sim, spec->batch));
    if (runs[0].ok || runs[1].ok) {
        cJSON *ex = cJSON_CreateObject();
        for (int b = 0; b < 2; b++) {
            const struct diag_run *r = &runs[b];
            if (r->ok) {
                ps_json_set(ex, r->name, ps_report_execution(g, r->name, false, false, &r->res, NULL));
                continue;
            }
            cJSON *x = cJSON_AddObjectToObject(ex, r->name);
            ps_json_add_string(x, "unavailable", r->why);
        }
        ps_json_set(root, "execution", ex);
    }
    if (best) {
        struct ps_tolerance tol;
        ps_tolerance_init(&tol);
        char why[1024];
        int ex = ps_compare_check(&best->cmp, &tol, why, sizeof(why));
        cJSON *cj = ps_cmp_json(sr.g, &best->cmp, &best->res.trace, NULL, &tol, ex, why);
        if (cj && have_cal && best == &runs[0])
            cJSON_AddItemToObject(cj, "calibration", ps_calib_json(&cal, &runs[0].cmp, &ccal));
        ps_json_set(root, "comparison", cj);
    }
    if (have_drift) ps_json_set(root, "drift", ps_drift_json(&dr));
    {
        cJSON *fj = cJSON_CreateArray();
        for (int k = 0; k < fi.n; k++) ps_json_add_string(fj, NULL, fi.line[k]);
        ps_json_set(root, "findings", fj);
        cJSON *bj = cJSON_CreateObject();
        if (bj) {
            cJSON_AddNumberToObject(bj, "limit_s", bud.limit_s);
            cJSON_AddBoolToObject(bj, "full", bud.limit_s <= 0);
            cJSON *rj = cJSON_AddArrayToObject(bj, "reduced");
            for (int k = 0; rj && k < bud.n_reduced; k++) ps_json_add_string(rj, NULL, bud.reduced[k]);
            ps_json_set(root, "budget", bj);
        }
    }
    if (ps_report_write(root, OUT("report.json"), &d)) goto fail;
    if (ps_html_write_file(h, OUT("index.html"), &d)) goto fail;
    /* the documentation the page cites, so the folder reads without the source tree */
    for (const struct ps_doc *doc = ps_docs; doc->path; doc++) {
        const char *out = !strcmp(doc->path, "src/SEMANTICS.md") ? "semantics.html"
                          : !strcmp(doc->path, "viz/REPORT.md")  ? "report-format.html"
                                                                 : NULL;
        if (!out) continue;
        struct ps_html *dh = ps_html_create(doc->path);
        if (!dh) {
            ps_diag_set(&d, -ENOMEM, "diagnose", "out of memory");
            goto fail;
        }
        ps_html_doc(dh, doc->text);
        int drc = ps_html_write_file(dh, OUT(out), &d);
        ps_html_destroy(dh);
        if (drc) goto fail;
    }

    if (cli->verbosity >= 0) {
        printf("diagnose: %s -> %s/index.html (%.1f s)\n", spec->name ? spec->name : spec->path,
               cli->outdir, now_s() - t_start);
        for (int k = 0; k < fi.n; k++) printf("  %s\n", fi.line[k]);
    }
    (void)b6;
    code = PS_EXIT_OK;
    goto out;
fail:
    code = ps_cli_fail(&d, PS_EXIT_INPUT);
out:
    free(errs);
    free(cost);
    free(chunks);
    cJSON_Delete(root);
    ps_html_destroy(h);
    ps_drift_finish(&dr);
    ps_compare_finish(&ccal);
    ps_calib_finish(&cal);
    for (int b = 0; b < 2; b++) {
        ps_compare_finish(&runs[b].cmp);
        if (runs[b].ok) ps_exec_result_finish(&runs[b].res);
    }
    ps_study_sim_finish(&sr);
    ps_study_sim_finish(&sr2);
    ps_analysis_finish(&an);
    ps_study_whatif_finish(&nophony);
    ps_costs_destroy(costs);
    ps_ctx_finish(&ctx);
    return code;
}
