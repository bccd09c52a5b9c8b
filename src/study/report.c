/* study/report: what diagnose found, in words and as a report folder (study.h): the findings
 * (a few lines the command prints and the page opens with), index.html with one section per
 * phase, report.json (one writer per section, viz/report.h), Chrome traces, SVG pictures, the
 * costs file calibrated to the CPU run and the documentation the page cites.
 *
 * Everything is written into the folder the caller names (the command's temporary twin of -o
 * DIR, published only when all of it succeeded). Findings are results, never errors.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/study/study.h"
#include "viz/docs.h"
#include "viz/html.h"
#include "viz/report.h"
#include "viz/viz.h"

static void finding(struct ps_diagnose *dg, struct ps_html *h, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finding(struct ps_diagnose *dg, struct ps_html *h, const char *fmt, ...)
{
    if (dg->n_findings >= PS_DIAGNOSE_MAX_FINDINGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dg->findings[dg->n_findings], sizeof(dg->findings[0]), fmt, ap);
    va_end(ap);
    ps_html_summary(h, dg->findings[dg->n_findings]);
    dg->n_findings++;
}

static const char *fmt(char *buf, int len, const char *f, double v)
{
    if (!isfinite(v)) snprintf(buf, len, "n/a");
    else snprintf(buf, len, f, v);
    return buf;
}

#define CELL(k) (cells[k] = bufs[k], bufs[k])

static const struct ps_drift_run *drift_find(const struct ps_drift *dr, int chunks,
                                             enum ps_bn_policy p, enum ps_checkpoint c)
{
    for (int k = 0; k < dr->n_runs; k++)
        if (dr->runs[k].s.chunks == chunks && dr->runs[k].s.policy == p &&
            dr->runs[k].s.checkpoint == c)
            return &dr->runs[k];
    return NULL;
}

/* Where held-out group j's micro-batch size lies against the sizes its fold was fitted to (the
   other groups'): "" between them, else "above the fitted 2-4" or "below ...": a fit read at
   two sizes says least about a third outside them (sim/COSTS.md). */
static const char *fold_range(const struct ps_predict *p, int j, char *buf, size_t len)
{
    int64_t s = ps_variant_mb_size(&p->runs[p->groups[j].first].var, 0), lo = INT64_MAX, hi = 0;
    for (int k = 0; k < p->n_groups; k++) {
        if (k == j) continue;
        int64_t t = ps_variant_mb_size(&p->runs[p->groups[k].first].var, 0);
        lo = t < lo ? t : lo;
        hi = t > hi ? t : hi;
    }
    buf[0] = 0;
    if (hi > 0 && (s < lo || s > hi))
        snprintf(buf, len, "%s the fitted %lld-%lld", s < lo ? "below" : "above",
                 (long long)lo, (long long)hi);
    return buf;
}

/* "; held out (each chunk count predicted by a fit to the others): chunks 4 +1.2%, ..." or
   why there are no held-out figures: the simulator's accuracy, never the in-sample fit */
static void held_out_words(const struct ps_diagnose *dg, char *buf, size_t len)
{
    const struct ps_predict *p = &dg->pred;
    if (!dg->have_pred) {
        snprintf(buf, len, "; no held-out accuracy: %.200s", dg->pred_why);
        return;
    }
    size_t o = (size_t)snprintf(buf, len, "; held out (each chunk count predicted by costs "
                                          "fitted to the others), makespan (predicted - "
                                          "measured) / measured:");
    for (int j = 0; j < p->n_groups && o < len; j++) {
        const struct ps_predict_group *gr = &p->groups[j];
        const struct ps_predict_run *r = &p->runs[gr->first];
        char rg[64];
        o += (size_t)snprintf(buf + o, len - o, "%s %s %+.1f%%", j ? "," : "", r->spec_path,
                              -100 * gr->error);
        if (*fold_range(p, j, rg, sizeof(rg)) && o < len)
            o += (size_t)snprintf(buf + o, len - o, " (%lld sample%s, %s)",
                                  (long long)ps_variant_mb_size(&r->var, 0),
                                  ps_variant_mb_size(&r->var, 0) == 1 ? "" : "s", rg);
    }
}

static const struct ps_diagnose_run *best_run(const struct ps_diagnose *dg)
{
    return dg->runs[1].have_cmp ? &dg->runs[1] : dg->runs[0].have_cmp ? &dg->runs[0] : NULL;
}

/* ---- files: traces, pictures, the calibrated costs ------------------------------------------ */

static int write_text(FILE *f, void *ctx, struct ps_diag *d)
{
    (void)d;
    fputs((const char *)ctx, f);
    fputc('\n', f);
    return ferror(f) ? -EIO : 0;
}

static int write_files(const struct ps_diagnose *dg, const char *dir, struct ps_diag *diag)
{
    const struct ps_spec *spec = dg->spec;
    const struct ps_graph *g = dg->g;
    const struct ps_study_sim *sr = &dg->sim;
    const struct ps_study_sim *sr2 = &dg->sim_cal;
    const struct ps_diagnose_run *runs = dg->runs;
    const struct ps_calib *cal = &dg->cal;
    const struct ps_compare *ccal = &dg->cmp_cal;
    bool have_cal = dg->have_cal;
    bool have_drift = dg->have_drift;
    const struct ps_drift *dr = &dg->dr;
    const struct ps_diagnose_run *best = best_run(dg);
    char b1[64];
    char path[4200];
#define OUT(name) (snprintf(path, sizeof(path), "%s/%s", dir, name), path)
    if (ps_chrome_write_file(sr->g, &sr->sim.trace, NULL, OUT("simulated.json"), diag)) return diag->code ? diag->code : -EIO;
    for (int b = 0; b < 2; b++) {
        if (!runs[b].ok) continue;
        snprintf(b1, sizeof(b1), "measured-%s.json", runs[b].name);
        if (ps_chrome_write_file(g, &runs[b].res.trace, NULL, OUT(b1), diag)) return diag->code ? diag->code : -EIO;
    }
    struct ps_dot_opts dop;
    ps_dot_opts_init(&dop);
    bool big = g->n_nodes > 300;
    dop.tasks_only = big;
    dop.title = spec->name;
    if (ps_svg_write_file(g, &dop, OUT("graph.svg"), diag)) return diag->code ? diag->code : -EIO;
    if (best) {
        /* the CPU run against the simulation with the costs calibrated to it (same scale,
           comparable shapes: against the spec's GPU costs every task is ~100% off); without a
           calibration the two timelines get their own time axes */
        bool cal_sim = have_cal && best == &runs[0];
        const struct ps_study_sim *lower = cal_sim ? sr2 : sr;
        double *errs = ps_compare_node_errors(cal_sim ? ccal : &best->cmp, sr->g);
        struct ps_dot_opts eo = dop;
        eo.node_value = errs;
        eo.value_name = cal_sim ? "duration error vs the calibrated simulation, (measured - "
                                  "simulated) / measured"
                                : "duration error (measured - simulated) / measured";
        eo.tasks_only = true;
        int erc = !errs ? ps_diag_set(diag, -ENOMEM, "diagnose", "out of memory")
                        : ps_svg_write_file(sr->g, &eo, OUT("graph-errors.svg"), diag);
        free(errs);
        if (erc) return erc;
        struct ps_gantt_opts go = {
            .title = "measured (above) and simulated (below)",
            .label = best == &runs[1] ? "measured on cuda" : "measured on cpu",
            .label2 = cal_sim ? "simulated with the costs calibrated to this run" : "simulated",
            .issue2_us = lower->sim.issue_us,
            .launch2_us = lower->sim.launch_us};
        if (ps_plot_gantt_file(sr->g, &best->res.trace, &lower->sim.trace, &go,
                               OUT("timeline.svg"), diag))
            return diag->code ? diag->code : -EIO;
    }
    struct ps_gantt_opts gs = {.title = "simulated timeline", .label = "simulated",
                               .issue_us = sr->sim.issue_us, .launch_us = sr->sim.launch_us};
    if (ps_plot_gantt_file(sr->g, &sr->sim.trace, NULL, &gs, OUT("timeline-simulated.svg"), diag))
        return diag->code ? diag->code : -EIO;
    if (have_cal && ps_costs_write(cal->costs, OUT("costs-cpu.json"), diag)) return diag->code ? diag->code : -EIO;
    if (dg->have_advise && dg->advise.recommended >= 0 &&
        (ps_advise_plot(&dg->advise, OUT("pareto.svg"), diag) ||
         ps_out_write(OUT("recommended.json"), write_text, dg->advise_spec, diag)))
        return diag->code ? diag->code : -EIO;
    if (have_drift && (ps_drift_plot(dr, "var_err", OUT("drift-var.svg"), diag) ||
                       ps_drift_plot(dr, "mean_err", OUT("drift-mean.svg"), diag) ||
                       ps_drift_plot(dr, "var_gap", OUT("drift-gap.svg"), diag)))
        return diag->code ? diag->code : -EIO;
#undef OUT
    return 0;
}

/* ---- the findings ---------------------------------------------------------------------------- */

static void page_findings(struct ps_diagnose *dg, struct ps_html *h)
{
    const struct ps_spec *spec = dg->spec;
    const struct ps_graph *g = dg->g;
    const struct ps_analysis *an = &dg->an;
    bool whatif = dg->nophony.ran;
    const struct ps_study_sim *sr = &dg->sim;
    const struct ps_diagnose_run *runs = dg->runs;
    bool have_drift = dg->have_drift;
    const struct ps_drift *dr = &dg->dr;
    char b1[64], b2[64];
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
    for (int c = 0; c < PS_CHECK__COUNT; c++) n_checks += an->checked[c] > 0;
    char wi[512] = "";
    if (whatif) {
        if (dg->nophony.lost)
            snprintf(wi, sizeof(wi),
                     "; without phony edges backward order is not guaranteed (%u pairs) and peak "
                     "memory grows %.1fx",
                     dg->nophony.lost, dg->nophony.mem_growth);
        else
            snprintf(wi, sizeof(wi), "; without phony edges every invariant still holds");
    }
    if (an->ok)
        finding(dg, h, "checks: all %d invariants hold%s", n_checks, wi);
    else
        finding(dg, h, "checks: %u violation%s of the ordering invariants (see the checks table)%s",
                an->n_violations, an->n_violations == 1 ? "" : "s", wi);
    /* findings: timing */
    const struct ps_sim *sim = &sr->sim;
    if (runs[0].have_cmp) {
        const struct ps_compare *c = &runs[0].cmp;
        bool target_cpu = true;
        for (int j = 0; j < spec->n_partitions; j++) target_cpu &= spec->devices[j].kind == PS_DEV_CPU;
        /* the comparison measures both timelines from their first task's start to their last
           task's end ("task span"), so the simulated value here is the makespan less the first
           launch; name it so the two numbers never look like one quantity with two values */
        if (!target_cpu || fabs(c->makespan_error) > 0.5) {
            char cb[320] = "";
            held_out_words(dg, cb, sizeof(cb));
            finding(dg, h, "task span simulated %s, measured on CPU %s: %s%s",
                    ps_viz_time(c->sim_makespan_us, b1, sizeof(b1)),
                    ps_viz_time(c->meas_makespan_us, b2, sizeof(b2)),
                    target_cpu ? "the cost model does not fit this CPU"
                               : "the CPU is not the target device (use --costs for real GPU "
                                 "times)",
                    cb);
        } else {
            finding(dg, h, "task span simulated %s, measured on CPU %s (error %+.1f%%)",
                    ps_viz_time(c->sim_makespan_us, b1, sizeof(b1)),
                    ps_viz_time(c->meas_makespan_us, b2, sizeof(b2)), 100 * c->makespan_error);
        }
        if (dg->have_pred && target_cpu && fabs(c->makespan_error) <= 0.5) {
            char cb[320];
            held_out_words(dg, cb, sizeof(cb));
            finding(dg, h, "the simulator's accuracy on CPU configurations it was not fitted to%s",
                    cb);
        }
        finding(dg, h,
                "measured order matches the simulation up to %llu inversion%s of %llu pairs; the "
                "CPU run broke %u of %u dependencies",
                (unsigned long long)c->inversions, c->inversions == 1 ? "" : "s",
                (unsigned long long)c->pairs, c->n_dep_violations, c->n_deps_checked);
    } else {
        finding(dg, h, "simulated makespan %s; no CPU run to compare with (%s)",
                ps_viz_time(sim->makespan_us, b1, sizeof(b1)), runs[0].why);
    }
    if (runs[1].have_cmp)
        finding(dg, h, "task span measured on CUDA %s against simulated %s (error %+.1f%%)",
                ps_viz_time(runs[1].cmp.meas_makespan_us, b1, sizeof(b1)),
                ps_viz_time(runs[1].cmp.sim_makespan_us, b2, sizeof(b2)),
                100 * runs[1].cmp.makespan_error);
    finding(dg, h, "bubble %.1f%% of the simulated makespan on average; recompute costs %.1f%% of forward + backward",
            100 * sim->bubble_fraction, 100 * sim->recompute_overhead);
    /* findings: BN */
    if (have_drift) {
        const struct ps_drift_run *pl = drift_find(dr, spec->chunks, PS_BN_PLAIN, spec->checkpoint);
        const struct ps_drift_run *de = drift_find(dr, spec->chunks, PS_BN_DEFERRED, spec->checkpoint);
        if (pl && pl->n_layers) {
            int worst = 0;
            for (int k = 1; k < pl->n_layers; k++)
                if (pl->layers[k].var_err_max > pl->layers[worst].var_err_max) worst = k;
            double dv = NAN;
            if (de)
                for (int k = 0; k < de->n_layers; k++)
                    if (de->layers[k].layer == pl->layers[worst].layer) dv = de->layers[k].var_err_max;
            finding(dg, h,
                    "BN layer %d: running_var %.1f%% off the full-batch value at chunks=%d with "
                    "plain BN (%d updates per step); deferred BN: %s",
                    pl->layers[worst].layer, 100 * pl->layers[worst].var_err_max, spec->chunks,
                    pl->layers[worst].updates, fmt(b1, sizeof(b1), "%.1f%%", 100 * dv));
        }
        if (dr->n_skipped)
            finding(dg, h, "drift: %d setting%s skipped (%s)", dr->n_skipped,
                    dr->n_skipped == 1 ? "" : "s", dr->skipped[0].reason);
    }

    if (dg->adapt_updates >= 0) {
        char w[512];
        bool ok = ps_bn_adaptation(&g->var, w, sizeof(w));
        finding(dg, h,
                "BN adaptation%s: one forward-only train-mode pass (no backward) updated layer "
                "%d's running statistics %d time%s for %d micro-batch%s; %s, checkpoint %s: %s",
                ok ? "" : " WARNING", dg->adapt_layer, dg->adapt_updates, dg->adapt_updates == 1 ? "" : "s",
                g->var.mb_count, g->var.mb_count == 1 ? "" : "es",
                ps_bn_policy_name(g->var.batchnorm), ps_checkpoint_name(g->var.checkpoint), w);
    }

    /* findings: what the time budget left out, and how to run it */
    if (dg->bud.n_reduced) {
        char what[400] = "";
        for (int k = 0, o2 = 0; k < dg->bud.n_reduced && o2 < 380; k++) {
            /* the first clause of each note: "the CPU run was skipped (...)" */
            const char *colon = strstr(dg->bud.reduced[k], ": pipescope");
            int len = colon ? (int)(colon - dg->bud.reduced[k]) : (int)strlen(dg->bud.reduced[k]);
            o2 += snprintf(what + o2, sizeof(what) - (size_t)o2, "%s%.*s", k ? "; " : "", len,
                           dg->bud.reduced[k]);
        }
        finding(dg, h, "time budget %.0f s: %s. The commands for the rest are in the 'Budget' "
                        "section; pipescope diagnose %s -o %s --full runs everything",
                dg->opts.budget_s, what, spec->path, dg->opts.outdir ? dg->opts.outdir : "DIR");
    }
}

/* ---- page sections ----------------------------------------------------------------------------- */

static void page_checks(const struct ps_diagnose *dg, struct ps_html *h)
{
    const struct ps_spec *spec = dg->spec;
    const struct ps_graph *g = dg->g;
    const struct ps_analysis *an = &dg->an;
    const struct ps_analysis *wan = &dg->nophony.an;
    bool whatif = dg->nophony.ran;
    const struct ps_study_sim *sr = &dg->sim;
    const struct ps_sim *sim = &dg->sim.sim;
    bool big = g->n_nodes > 300;
    char b1[64], b2[64], b3[64], b4[64], b5[64];
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
            if (!an->checked[c]) continue;
            char bufs[4][64];
            const char *cells[4];
            snprintf(CELL(0), 64, "%s", ps_check_name(c));
            snprintf(CELL(1), 64, "%u", an->checked[c]);
            snprintf(CELL(2), 64, "%u", an->per_check[c]);
            if (whatif) snprintf(CELL(3), 64, "%u", wan->per_check[c]);
            else snprintf(CELL(3), 64, "n/a");
            ps_html_row(h, cells);
        }
        for (uint32_t k = 0; k < an->n_kept && k < 10; k++) ps_html_para(h, "violation: %s", an->v[k].msg);
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
        for (int k = 0; k < an->n_devices; k++) {
            char bufs[5][64];
            const char *cells[5];
            ps_viz_device_name(g, k, CELL(0), 64);
            ps_viz_bytes(an->mem ? (double)an->mem[k].peak_bytes : NAN, CELL(1), 64);
            if (whatif && wan->mem) ps_viz_bytes((double)wan->mem[k].peak_bytes, CELL(2), 64);
            else snprintf(CELL(2), 64, "n/a");
            ps_viz_bytes(k < sim->n_devices ? (double)sim->dev[k].peak_bytes : NAN, CELL(3), 64);
            ps_viz_time(k < sim->n_devices ? sim->dev[k].peak_t_us : NAN, CELL(4), 64);
            ps_html_row(h, cells);
        }
    }
    ps_html_section(h, "simulation", "Simulation");
    ps_html_para(h, "makespan %s, bubble %.1f%%, forward %s, backward %s, recompute %s (%.1f%% of "
                    "forward + backward), copies %s; costs: %s.",
                 ps_viz_time(sim->makespan_us, b1, sizeof(b1)), 100 * sim->bubble_fraction,
                 ps_viz_time(sim->forward_us, b2, sizeof(b2)),
                 ps_viz_time(sim->backward_us, b3, sizeof(b3)),
                 ps_viz_time(sim->recompute_us, b4, sizeof(b4)), 100 * sim->recompute_overhead,
                 ps_viz_time(sim->copy_us, b5, sizeof(b5)),
                 dg->costs ? (dg->opts.costs_path ? dg->opts.costs_path : spec->costs) : "roofline (spec hardware)");
    {
        const char *head[] = {"device", "busy", "bubble", "forward", "backward", "recompute", "in flight"};
        ps_html_table(h, "per device (simulated)", 7, head);
        for (int k = 0; k < sim->n_devices; k++) {
            const struct ps_sim_device *dv = &sim->dev[k];
            char bufs[7][64];
            const char *cells[7];
            ps_viz_device_name(sr->g, k, CELL(0), 64);
            ps_viz_time(dv->busy_us, CELL(1), 64);
            snprintf(CELL(2), 64, "%.1f%%", 100 * dv->bubble_fraction);
            ps_viz_time(dv->forward_us, CELL(3), 64);
            ps_viz_time(dv->backward_us, CELL(4), 64);
            ps_viz_time(dv->recompute_us, CELL(5), 64);
            snprintf(CELL(6), 64, "%u", dv->max_in_flight);
            ps_html_row(h, cells);
        }
    }
    ps_html_image(h, "timeline-simulated.svg", "simulated timeline",
                  "simulated timeline (simulated.json opens in Perfetto)");
}

/* every schedule at the spec's chunks and checkpoint mode, side by side */
static void page_schedules(const struct ps_diagnose *dg, struct ps_html *h)
{
    if (!dg->n_sched_rows) return;
    const struct ps_sweep_row *own = NULL;
    for (int k = 0; k < dg->n_sched_rows; k++)
        if (dg->sched_rows[k].sched == dg->spec->schedule && dg->sched_rows[k].ok)
            own = &dg->sched_rows[k];
    ps_html_section(h, "schedules", "Schedules");
    ps_html_para_link(h, "Every schedule pipescope knows, simulated with the same costs at chunks "
                         "and checkpoint mode of the spec (", "semantics.html#s6",
                      "src/SEMANTICS.md section 6",
                      "). Schedules with two stages per device run the same partitions on half the "
                      "devices; peak memory is the most any device holds.");
    const char *head[] = {"schedule", "devices", "makespan", "vs the spec's", "bubble",
                          "peak memory", "recompute"};
    ps_html_table(h, NULL, 7, head);
    for (int k = 0; k < dg->n_sched_rows; k++) {
        const struct ps_sweep_row *r = &dg->sched_rows[k];
        char bufs[7][96];
        const char *cells[7];
        snprintf(CELL(0), 96, "%s%s", ps_schedule_ops(r->sched)->name,
                 r->sched == dg->spec->schedule ? " (the spec's)" : "");
        if (!r->ok) {
            snprintf(CELL(1), 96, "-");
            snprintf(CELL(2), 96, "cannot run: %.80s", r->why);
            for (int c = 3; c < 7; c++) cells[c] = NULL;
            ps_html_row(h, cells);
            continue;
        }
        snprintf(CELL(1), 96, "%d", r->devices);
        ps_viz_time(r->makespan, CELL(2), 96);
        if (own && own->makespan > 0) snprintf(CELL(3), 96, "%.2fx", r->makespan / own->makespan);
        else cells[3] = NULL;
        snprintf(CELL(4), 96, "%.1f%%", 100 * r->bubble);
        ps_viz_bytes((double)r->peak, CELL(5), 96);
        snprintf(CELL(6), 96, "%.1f%%", 100 * r->recompute);
        ps_html_row(h, cells);
    }
}

/* advise's Pareto front and recommendation, as `advise --memory-cap auto` prints them */
static void page_advise(const struct ps_diagnose *dg, struct ps_html *h)
{
    ps_html_section(h, "advise", "Which configuration to run");
    if (!dg->have_advise) {
        ps_html_para(h, "no configuration search (%s)", dg->advise_why);
        return;
    }
    const struct ps_advise *a = &dg->advise;
    char cap[64];
    ps_viz_bytes(a->memory_cap, cap, sizeof(cap));
    ps_html_para(h, "pipescope advise searched %d configurations on %d device%s (every schedule, "
                 "chunks, checkpoint mode and BN policy, each with the exact min-max time balance) "
                 "under a cap of %s per device, the spec's own peak: %d simulated, %d pruned by "
                 "bounds, %d cannot run; %s. BN drift: %s.", a->n_configs, a->devices,
                 a->devices == 1 ? "" : "s", cap,
                 a->n_simulated, a->n_pruned, a->n_skipped,
                 a->exhaustive ? "exhaustive" : "not exhaustive (some configurations over the cap "
                                                "were rebalanced by a conservative memory model)",
                 a->drift_note);
    if (a->recommended < 0) {
        ps_html_para(h, "nothing fits the cap");
        return;
    }
    char line[512];
    ps_advise_sentence(a, &a->points[a->recommended], line, sizeof(line));
    ps_html_para(h, "recommended: %s (recommended.json is its spec, ready to run)", line);
    const char *head[] = {"schedule", "stages per device", "chunks", "checkpoint", "BN",
                          "samples/s", "peak memory", "BN drift"};
    ps_html_table(h, "the Pareto front", 8, head);
    for (int i = 0; i < a->n_points; i++) {
        const struct ps_advise_point *p = &a->points[i];
        if (!p->on_front) continue;
        char bufs[8][96];
        const char *cells[8];
        snprintf(CELL(0), 96, "%s%s", ps_schedule_name((enum ps_schedule)p->schedule),
                 i == a->recommended ? " (recommended)" : "");
        snprintf(CELL(1), 96, "%d", p->virtual_stages);
        snprintf(CELL(2), 96, "%d", p->chunks);
        snprintf(CELL(3), 96, "%s", ps_checkpoint_name(p->checkpoint));
        snprintf(CELL(4), 96, "%s", ps_bn_policy_name(p->policy));
        snprintf(CELL(5), 96, "%.1f", p->throughput);
        ps_viz_bytes((double)p->peak_bytes, CELL(6), 96);
        if (isnan(p->drift)) cells[7] = NULL;
        else snprintf(CELL(7), 96, "%.3g%%", 100 * p->drift);
        ps_html_row(h, cells);
    }
    ps_html_image(h, "pareto.svg", "Pareto front",
                  "peak memory per device against throughput: the front per BN policy, the spec, "
                  "the recommendation and the cap");
}

/* the held-out table: each CPU configuration predicted by costs fitted to the others */
static void page_held_out(const struct ps_diagnose *dg, struct ps_html *h)
{
    const struct ps_predict *p = &dg->pred;
    if (!dg->runs[0].ok) return;
    if (!dg->have_pred) {
        ps_html_para(h, "Simulator accuracy on configurations it was not fitted to: not measured "
                        "(%s).", dg->pred_why);
        return;
    }
    char reps[200] = "";
    if (dg->pred_reps > 1)
        snprintf(reps, sizeof(reps),
                 "; %d runs of each configuration, in interleaved rounds: the fit reads the least "
                 "disturbed quarter and the table compares the minimum",
                 dg->pred_reps);
    ps_html_para(h,
                 "Simulator accuracy on configurations it was not fitted to: CPU runs at the "
                 "spec's chunks and at other chunk counts (%d step%s each, the last step "
                 "compared, one thread per kernel call%s), each predicted by costs fitted to the "
                 "other configurations only (fixed + per-sample terms per partition, "
                 "sim/calibrate.h) and simulated as the CPU executor ran them (cores: N = "
                 "devices as threads on N cores, sim/cores.h; the serial run is one core). A micro-batch size outside the sizes its fold was "
                 "fitted to is marked: a fit read at two sizes says least about a third beyond "
                 "them. Held-out makespan error: mean %.1f%%, max %.1f%%.",
                 dg->runs[0].res.steps, dg->runs[0].res.steps == 1 ? "" : "s", reps,
                 100 * p->mean_holdout_error, 100 * p->max_holdout_error);
    const char *head[] = {"configuration", "micro-batch", "predicted", "measured",
                          "error (pred - meas) / meas", "bubble predicted / measured",
                          "busy per device predicted / measured", "cores"};
    ps_html_table(h, "held out: predicted by a fit to the other configurations", 8, head);
    for (int j = 0; j < p->n_groups; j++) {
        const struct ps_predict_group *gr = &p->groups[j];
        const struct ps_predict_run *r = &p->runs[gr->first];
        char c[8][160];
        const char *cells[8];
        for (int k = 0; k < 8; k++) cells[k] = c[k];
        snprintf(c[0], sizeof(c[0]), "%s", r->spec_path);
        char rg[64];
        fold_range(p, j, rg, sizeof(rg));
        snprintf(c[1], sizeof(c[1]), "%lld%s%s%s", (long long)ps_variant_mb_size(&r->var, 0),
                 *rg ? " (" : "", rg, *rg ? ")" : "");
        ps_viz_time(gr->pred_makespan_us, c[2], sizeof(c[2]));
        ps_viz_time(gr->meas_us, c[3], sizeof(c[3]));
        snprintf(c[4], sizeof(c[4]), "%+.1f%%", -100 * gr->error);
        snprintf(c[5], sizeof(c[5]), "%.1f%% / %.1f%%", 100 * gr->pred_bubble,
                 100 * gr->meas_bubble);
        size_t o = 0;
        c[6][0] = 0;
        for (int d = 0; d < gr->n_devices && o < sizeof(c[6]); d++) {
            char a[32], b[32];
            o += (size_t)snprintf(c[6] + o, sizeof(c[6]) - o, "%s%s / %s", d ? ", " : "",
                                  ps_viz_time(gr->pred_busy_us[d], a, sizeof(a)),
                                  ps_viz_time(gr->meas_busy_us[d], b, sizeof(b)));
        }
        snprintf(c[7], sizeof(c[7]), "%d", gr->cores);
        ps_html_row(h, cells);
    }
}

static void page_comparison(const struct ps_diagnose *dg, struct ps_html *h)
{
    const struct ps_graph *g = dg->g;
    const struct ps_diagnose_run *runs = dg->runs;
    const struct ps_calib *cal = &dg->cal;
    const struct ps_compare *ccal = &dg->cmp_cal;
    bool have_cal = dg->have_cal;
    const struct ps_diagnose_run *best = best_run(dg);
    char b1[64], b2[64], b3[64], b4[64], b5[64];
    ps_html_section(h, "comparison", "Measured vs simulated");
    for (int b = 0; b < 2; b++) {
        const struct ps_diagnose_run *r = &runs[b];
        if (!r->ok) {
            ps_html_para(h, "%s: not run (%s)", r->name, r->why);
            continue;
        }
        if (!r->have_cmp) continue;
        const struct ps_compare *c = &r->cmp;
        const char *head[] = {"metric", "measured", "simulated", "error (meas - sim) / meas"};
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
        ps_viz_time(c->meas_makespan_us, CELL(1), 64);
        ps_viz_time(c->sim_makespan_us, CELL(2), 64);
        snprintf(CELL(3), 64, "%+.1f%%", 100 * c->makespan_error);
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "task duration error, median / p95");
        snprintf(CELL(1), 64, "%.28s / %.28s", fmt(b1, 32, "%.1f%%", 100 * c->dur_rel.median),
                 fmt(b2, 32, "%.1f%%", 100 * c->dur_rel.p95));
        snprintf(CELL(2), 64, " ");
        snprintf(CELL(3), 64, " ");
        ps_html_row(h, cells);
        snprintf(CELL(0), 64, "task start error, median / p95");
        snprintf(CELL(1), 64, "%s / %s", ps_viz_time(c->start.median, b1, 32),
                 ps_viz_time(c->start.p95, b2, 32));
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
            bool span_worse = fabs(ccal->makespan_error) > fabs(c->makespan_error);
            bool med_worse = ccal->dur_rel.median > c->dur_rel.median;
            bool p95_worse = ccal->dur_rel.p95 > c->dur_rel.p95;
            ps_html_para(h,
                         "In-sample fit (how well per-partition costs describe the run they "
                         "were fitted to, not the simulator's accuracy: that is the held-out "
                         "table below): calibrated to this run (costs-cpu.json, %u "
                         "observations, rank %u of %u, %s%s): task span error ((measured - "
                         "simulated) / measured, the table's sign) %+.1f%% -> %+.1f%%%s; task "
                         "duration error median %s -> %s%s, p95 %s -> %s%s.%s",
                         cal->n_obs, cal->rank, cal->n_params,
                         dg->cal_cores ? "simulated as the serial run it is: one task after "
                                         "another in the order, no launches"
                                       : "launch overhead ",
                         dg->cal_cores ? ""
                         : cal->fitted[PS_CAL_LAUNCH]
                             ? ps_viz_time(cal->value[PS_CAL_LAUNCH], b1, 32)
                             : "not fitted",
                         100 * c->makespan_error, 100 * ccal->makespan_error,
                         span_worse ? " (worse)" : "",
                         fmt(b4, 32, "%.1f%%", 100 * c->dur_rel.median),
                         fmt(b5, 32, "%.1f%%", 100 * ccal->dur_rel.median),
                         med_worse ? " (worse)" : "",
                         fmt(b2, 32, "%.1f%%", 100 * c->dur_rel.p95),
                         fmt(b3, 32, "%.1f%%", 100 * ccal->dur_rel.p95),
                         p95_worse ? " (worse)" : "",
                         span_worse || med_worse || p95_worse
                             ? " The fit is a least-squares compromise over all tasks: where a "
                               "figure got worse, per-partition costs cannot describe this run "
                               "(launch- or host-bound tasks, uneven layers)."
                             : "");
        }
    }
    page_held_out(dg, h);
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
}

static void page_batchnorm(const struct ps_diagnose *dg, struct ps_html *h)
{
    const struct ps_spec *spec = dg->spec;
    const struct ps_diagnose_run *runs = dg->runs;
    bool have_drift = dg->have_drift;
    bool has_bn = dg->has_bn;
    const struct ps_drift *dr = &dg->dr;
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
            for (int k = 0; k < dr->n_runs; k++) {
                const struct ps_drift_run *r = &dr->runs[k];
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
            for (int k = 0; k < dr->n_skipped; k++)
                ps_html_para(h, "skipped: chunks %d, %s BN, checkpoint %s: %s",
                             dr->skipped[k].s.chunks, ps_bn_policy_name(dr->skipped[k].s.policy),
                             ps_checkpoint_name(dr->skipped[k].s.checkpoint),
                             dr->skipped[k].reason);
        } else {
            ps_html_para(h, "no drift sweep (%s)", dg->opts.drift ? dg->drift_why : "--no-drift");
        }
    }
    if (dg->bud.n_reduced) {
        ps_html_section(h, "budget", "Budget");
        ps_html_para(h, "diagnose fits its work into a time budget (%.0f s here, --budget SECONDS "
                        "changes it, --full turns it off). This run left out:",
                     dg->opts.budget_s);
        for (int k = 0; k < dg->bud.n_reduced; k++) ps_html_para(h, "%s", dg->bud.reduced[k]);
    }
    ps_html_section(h, "files", "Files");
    /* what write_files wrote, no more */
    const struct ps_diagnose_run *best = best_run(dg);
    bool measured = dg->runs[0].ok || dg->runs[1].ok;
    bool adv = dg->have_advise && dg->advise.recommended >= 0;
    ps_html_para(h, "report.json (the whole report), simulated.json%s (Chrome traces: open them "
                    "in Perfetto or chrome://tracing), graph.svg, timeline-simulated.svg%s%s%s%s.",
                 measured ? " and measured-*.json" : "",
                 best ? ", timeline.svg, graph-errors.svg" : "",
                 adv ? ", pareto.svg, recommended.json (the recommended configuration's spec)" : "",
                 dg->have_drift ? ", drift-var.svg, drift-mean.svg, drift-gap.svg" : "",
                 dg->have_cal ? ", costs-cpu.json (costs calibrated to the CPU run: pass it with "
                                "--costs)"
                              : "");
    ps_html_para_link(h, "Every file, JSON field and picture of this folder is described in ",
                      "report-format.html", "viz/REPORT.md", " (a copy).");
}

/* ---- report.json and the cited documentation --------------------------------------------------- */

static int write_report(const struct ps_diagnose *dg, struct ps_html *h, const char *dir,
                        struct ps_diag *diag)
{
    const struct ps_spec *spec = dg->spec;
    const struct ps_graph *g = dg->g;
    const struct ps_analysis *an = &dg->an;
    const struct ps_study_sim *sr = &dg->sim;
    const struct ps_diagnose_run *runs = dg->runs;
    const struct ps_calib *cal = &dg->cal;
    const struct ps_compare *ccal = &dg->cmp_cal;
    bool have_cal = dg->have_cal;
    bool have_drift = dg->have_drift;
    const struct ps_drift *dr = &dg->dr;
    const struct ps_sim *sim = &dg->sim.sim;
    const struct ps_diagnose_run *best = best_run(dg);
    cJSON *root = ps_report_new();
    if (!root) return ps_diag_set(diag, -ENOMEM, "diagnose", "out of memory");
    char path[4200];
#define OUT(name) (snprintf(path, sizeof(path), "%s/%s", dir, name), path)
    ps_report_add_spec(root, spec);
    ps_report_add_graph(root, g);
    ps_report_add_analysis(root, g, an, dg->order);
    ps_json_set(root, "simulation", ps_report_simulation(sr->g, sim, spec->batch));
    if (runs[0].ok || runs[1].ok) {
        cJSON *ex = cJSON_CreateObject();
        for (int b = 0; b < 2; b++) {
            const struct ps_diagnose_run *r = &runs[b];
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
        cJSON *cj = ps_cmp_json(sr->g, &best->cmp, &best->res.trace, NULL, &tol, ex, why);
        if (cj && have_cal && best == &runs[0])
            cJSON_AddItemToObject(cj, "calibration", ps_calib_json(cal, &runs[0].cmp, ccal));
        ps_json_set(root, "comparison", cj);
    }
    if (dg->have_pred) ps_json_set(root, "held_out", ps_predict_json(&dg->pred, PS_CAL_ROBUST));
    else if (runs[0].ok) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_string(x, "unavailable", dg->pred_why);
        ps_json_set(root, "held_out", x);
    }
    if (dg->n_sched_rows) {
        cJSON *sw = ps_sweep_json(dg->sched_rows, dg->n_sched_rows);
        if (sw) ps_json_set(root, "schedules", cJSON_DetachItemFromObject(sw, "sweep"));
        cJSON_Delete(sw);
    }
    if (dg->have_advise) ps_json_set(root, "advise", ps_advise_json(&dg->advise));
    if (have_drift) ps_json_set(root, "drift", ps_drift_json(dr));
    {
        cJSON *fj = cJSON_CreateArray();
        for (int k = 0; k < dg->n_findings; k++) ps_json_add_string(fj, NULL, dg->findings[k]);
        ps_json_set(root, "findings", fj);
        cJSON *bj = cJSON_CreateObject();
        if (bj) {
            cJSON_AddNumberToObject(bj, "limit_s", dg->opts.budget_s);
            cJSON_AddBoolToObject(bj, "full", dg->opts.budget_s <= 0);
            cJSON *rj = cJSON_AddArrayToObject(bj, "reduced");
            for (int k = 0; rj && k < dg->bud.n_reduced; k++)
                ps_json_add_string(rj, NULL, dg->bud.reduced[k]);
            ps_json_set(root, "budget", bj);
        }
    }
    int rc = ps_report_write(root, OUT("report.json"), diag);
    cJSON_Delete(root);
    if (rc) return rc;
    if (ps_html_write_file(h, OUT("index.html"), diag)) return diag->code ? diag->code : -EIO;
    /* the documentation the page cites, so the folder reads without the source tree */
    for (const struct ps_doc *doc = ps_docs; doc->path; doc++) {
        const char *out = !strcmp(doc->path, "src/SEMANTICS.md") ? "semantics.html"
                          : !strcmp(doc->path, "viz/REPORT.md")  ? "report-format.html"
                                                                 : NULL;
        if (!out) continue;
        struct ps_html *dh = ps_html_create(doc->path);
        if (!dh) return ps_diag_set(diag, -ENOMEM, "diagnose", "out of memory");
        ps_html_doc(dh, doc->text);
        int drc = ps_html_write_file(dh, OUT(out), diag);
        ps_html_destroy(dh);
        if (drc) return diag->code ? diag->code : -EIO;
    }
#undef OUT
    return 0;
}

int ps_diagnose_write(struct ps_diagnose *dg, const char *dir, struct ps_diag *diag)
{
    int rc = write_files(dg, dir, diag);
    if (rc) return rc;
    struct ps_html *h = ps_html_create(dg->spec->name ? dg->spec->name : dg->spec->path);
    if (!h) return ps_diag_set(diag, -ENOMEM, "diagnose", "out of memory");
    dg->n_findings = 0;
    page_findings(dg, h);
    page_checks(dg, h);
    page_schedules(dg, h);
    page_advise(dg, h);
    page_comparison(dg, h);
    page_batchnorm(dg, h);
    rc = write_report(dg, h, dir, diag);
    ps_html_destroy(h);
    return rc;
}
