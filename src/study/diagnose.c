/* study/diagnose: the phases of `pipescope diagnose` (study.h), each a function over one
 * struct ps_diagnose, so a caller can time, report or skip them one by one.
 *
 *   check       analysis of the spec's graph with roofline costs, and the no-phony what-if
 *   simulate    the timeline with the spec's (or --costs) costs
 *   execute     CPU run (and CUDA when available), each compared with the simulation; the
 *               costs calibrated to the CPU run and the simulation with them, compared again
 *               (in-sample: how well the model fits); CPU runs at two other chunk counts and
 *               each of the three predicted by a fit to the other two (held out: the
 *               simulator's accuracy on a configuration it has not seen)
 *   drift       BatchNorm drift over chunks, plain vs deferred BN (models with BatchNorm)
 *   adaptation  one forward-only pass: does the configuration adapt BN statistics at all
 *
 * Invariants: a phase reads what the phases before it left in dg and writes only its own
 * fields; execute, drift and adaptation never fail (what could not run is a finding, with why).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/data.h"
#include "src/study/study.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void warn(struct ps_diagnose *dg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(struct ps_diagnose *dg, const char *fmt, ...)
{
    if (dg->n_warn >= PS_DIAGNOSE_MAX_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dg->warn[dg->n_warn++], sizeof(dg->warn[0]), fmt, ap);
    va_end(ap);
}

/* what the budget left out, with the command that runs it */
static void reduced(struct ps_diagnose *dg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reduced(struct ps_diagnose *dg, const char *fmt, ...)
{
    if (dg->bud.n_reduced >= PS_DIAGNOSE_MAX_REDUCED) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dg->bud.reduced[dg->bud.n_reduced++], sizeof(dg->bud.reduced[0]), fmt, ap);
    va_end(ap);
}

static void begin(struct ps_diagnose *dg, const char *phase)
{
    dg->bud.phase_t0 = now_s();
    const struct ps_study_progress *p = &dg->opts.progress;
    if (p->begin) p->begin(p->ctx, phase);
}

static void end(struct ps_diagnose *dg, const char *how)
{
    const struct ps_study_progress *p = &dg->opts.progress;
    if (p->end) p->end(p->ctx, how);
}

/* the executor's progress hook: shows progress, and stops a run that would end past the
   watched phase's deadline (plus its slack) */
static bool run_progress(void *ctx, double done, double total)
{
    struct ps_diagnose *dg = ctx;
    const struct ps_study_progress *p = &dg->opts.progress;
    double frac = total > 0 ? done / total : 0;
    double el = now_s() - dg->bud.phase_t0;
    ps_eta_observe(&dg->bud.eta, el, done, total);
    double eta_total = ps_eta_total(&dg->bud.eta);
    /* the progress line's ETA from the same estimate (the work fraction would repeat the
       first task's one-time costs over the whole run) */
    if (p->update)
        p->update(p->ctx, isfinite(eta_total) && eta_total > 0 ? fmin(el / eta_total, 1) : 0, 0, 0, NULL);
    if (dg->opts.budget_s <= 0) return true;
    if (el < 1.0 || !(frac > 0)) return true;
    /* no estimate yet: stop only once the run is already past its time */
    if (!isfinite(eta_total)) {
        if (dg->bud.phase_t0 + el <= dg->bud.deadline + dg->bud.slack) return true;
        eta_total = el / frac;
    }
    if (dg->bud.phase_t0 + eta_total <= dg->bud.deadline + dg->bud.slack) return true;
    dg->bud.stopped = true;
    dg->bud.eta_total = eta_total;
    return false;
}

static void drift_progress(void *ctx, int k, int n, const struct ps_drift_setting *s,
                           const char *what)
{
    (void)s;
    (void)what;
    struct ps_diagnose *dg = ctx;
    const struct ps_study_progress *p = &dg->opts.progress;
    if (p->update) p->update(p->ctx, n > 0 ? (double)(k - 1) / n : 0, k, n, "settings");
}

int ps_diagnose_init(struct ps_diagnose *dg, const struct ps_spec *spec,
                     const struct ps_model *model, const struct ps_graph *g,
                     const struct ps_order *order, const struct ps_diagnose_opts *opts,
                     struct ps_diag *diag)
{
    memset(dg, 0, sizeof(*dg));
    dg->spec = spec;
    dg->model = model;
    dg->g = g;
    dg->order = order;
    dg->opts = *opts;
    dg->runs[0].name = "cpu";
    dg->runs[1].name = "cuda";
    dg->adapt_updates = dg->adapt_layer = -1;
    dg->bud.t0 = now_s();
    dg->run_steps = opts->steps ? opts->steps : spec->steps > 0 ? spec->steps : 1;
    snprintf(dg->drift_why, sizeof(dg->drift_why), "it could not run");
    for (int l = 0; l < spec->n_layers; l++) dg->has_bn |= spec->layers[l].op == PS_OP_BATCHNORM;
    /* data that `run` refuses is bad input here too (exit 2, before anything is written); only
       a data file that is not there lets the rest of the report go on (the runs say why) */
    struct ps_data dt;
    memset(&dt, 0, sizeof(dt));
    int rc = ps_data_load(spec, model, spec->batch, &dt, diag);
    ps_data_finish(&dt);
    if (rc && rc != -ENOENT) return rc;
    ps_diag_clear(diag);
    return ps_study_costs(spec, opts->costs_path, &dg->costs, diag);
}

int ps_diagnose_check(struct ps_diagnose *dg, struct ps_diag *diag)
{
    dg->roofline = malloc(((size_t)dg->g->n_nodes + 1) * sizeof(double));
    if (!dg->roofline) return ps_diag_set(diag, -ENOMEM, "diagnose", "out of memory");
    ps_cost_fill_roofline(dg->g, dg->roofline);
    int rc = ps_analysis_run(dg->g, dg->order, dg->roofline, &dg->an, diag);
    if (rc) return rc;
    ps_study_whatif(dg->spec, dg->model, &dg->an, &dg->nophony);
    return 0;
}

int ps_diagnose_simulate(struct ps_diagnose *dg, struct ps_diag *diag)
{
    struct ps_variant v;
    ps_variant_from_spec(dg->spec, &v);
    return ps_study_simulate(dg->spec, dg->model, &v, NULL, dg->costs, &dg->sim, diag);
}

void ps_diagnose_schedules(struct ps_diagnose *dg)
{
    enum ps_schedule sched[PS_SCHED__COUNT];
    for (int k = 0; k < PS_SCHED__COUNT; k++) sched[k] = (enum ps_schedule)k;
    enum ps_checkpoint ck = dg->spec->checkpoint;
    int chunks = dg->spec->chunks;
    struct ps_sweep_opts o = {.chunks = &chunks, .n_chunks = 1, .ckpt = &ck, .n_ckpt = 1,
                              .sched = sched, .n_sched = PS_SCHED__COUNT};
    struct ps_diag d;
    ps_diag_clear(&d);
    ps_study_sweep(dg->spec, dg->model, dg->costs, &o, dg->sched_rows, &d);
    dg->n_sched_rows = PS_SCHED__COUNT;
}

void ps_diagnose_advise(struct ps_diagnose *dg)
{
    char why[160] = "";
    struct ps_advise_opts o = {.cap_auto = true, .costs = dg->costs};
    o.predict_drift = ps_study_advise_drift_default(dg->spec, dg->model, why, sizeof(why));
    o.drift_why = why;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_study_advise(dg->spec, dg->model, &o, &dg->advise, &d) ||
        (dg->advise.recommended >= 0 &&
         ps_study_advise_spec(dg->spec, &dg->advise.points[dg->advise.recommended],
                              &dg->advise_spec, &d))) {
        snprintf(dg->advise_why, sizeof(dg->advise_why), "%s", d.msg);
        ps_advise_finish(&dg->advise);
        return;
    }
    dg->have_advise = true;
}

/* up to two other chunk counts for the held-out check: half and twice the spec's, then a
   quarter and four times, within 1..batch and trainable (BatchNorm sees more than one value
   per channel) */
static int other_chunks(const struct ps_diagnose *dg, int *out)
{
    const struct ps_spec *spec = dg->spec;
    int c = spec->chunks, cand[4] = {c / 2, 2 * c, c / 4, 4 * c}, n = 0;
    for (int k = 0; k < 4 && n < 2; k++) {
        char why[192];
        if (cand[k] < 1 || cand[k] > spec->batch || cand[k] == c || (n && out[0] == cand[k]))
            continue;
        if (dg->has_bn && ps_drift_check_chunks(spec, dg->model, cand[k], why, sizeof(why)))
            continue;
        out[n++] = cand[k];
    }
    return n;
}

/* The held-out check: CPU runs at the spec's chunks and at up to two other chunk counts (the
   CPU run's executor mode and steps, one thread per kernel call, PS_DIAGNOSE_REPS runs of each
   when they are cheap), then leave-one-out over the configurations. Never fails: pred_why says
   why there are no figures. */
static void held_out(struct ps_diagnose *dg)
{
    const struct ps_spec *spec = dg->spec;
    int ch[2], nc = other_chunks(dg, ch);
    if (!nc) {
        snprintf(dg->pred_why, sizeof(dg->pred_why),
                 "no other chunk count fits the batch of %lld (held-out predictions need runs at "
                 "two micro-batch sizes at least)",
                 (long long)spec->batch);
        return;
    }
    int steps = dg->runs[0].res.steps > 0 ? dg->runs[0].res.steps : 1;
    if (dg->opts.budget_s > 0) {
        /* a run costs about the CPU run, twice with one kernel thread (+30% for more
           micro-batches); leave most of what is left to the drift sweep */
        double left = dg->opts.budget_s - (now_s() - dg->bud.t0);
        if (2.6 * (nc + 1) * dg->cpu_run_s > 0.25 * left) {
            snprintf(dg->pred_why, sizeof(dg->pred_why),
                     "skipped to fit the time budget of %.0f s (%d more CPU runs of about %.1f s)",
                     dg->opts.budget_s, nc + 1, 2 * dg->cpu_run_s);
            char also[32] = "";
            if (nc > 1) snprintf(also, sizeof(also), " and %d", ch[1]);
            reduced(dg, "the held-out accuracy check was skipped: pipescope run %s --steps %d "
                        "--trace T.json with pipeline.chunks %d%s, then pipescope calibrate --run "
                        "SPEC T.json ... --holdout SPEC T.json",
                    spec->path, steps, ch[0], also);
            return;
        }
    }
    /* repetitions when all of them cost little (the machine's speed drifts between runs: the
       least disturbed ones measure the simulator, not the noise) */
    dg->pred_reps = 1;
    if (PS_DIAGNOSE_REPS * 2.6 * (nc + 1) * dg->cpu_run_s <=
        0.1 * (dg->opts.budget_s > 0 ? dg->opts.budget_s : 60.0))
        dg->pred_reps = PS_DIAGNOSE_REPS;
    begin(dg, "held-out runs");
    struct ps_predict_input in[3 * PS_DIAGNOSE_REPS];
    int n = 0, chunks[3] = {spec->chunks, ch[0], nc > 1 ? ch[1] : 0};
    struct ps_variant var[3];
    bool ok[3] = {false, false, false};
    for (int k = 0; k <= nc; k++) {
        ps_variant_from_spec(spec, &var[k]);
        snprintf(dg->pred_name[k], sizeof(dg->pred_name[k]), "chunks %d", chunks[k]);
    }
    struct ps_diag d;
    ps_diag_clear(&d);
    for (int r = 0; r < dg->pred_reps; r++)
        for (int k = 0; k <= nc; k++) {
            if (r && !ok[k]) continue; /* its first run failed */
            struct ps_study_sim sr;
            memset(&sr, 0, sizeof(sr));
            int rc = k ? ps_variant_set_chunks(&var[k], spec, chunks[k], &d) : 0;
            if (!rc) rc = ps_study_simulate(spec, dg->model, &var[k], NULL, NULL, &sr, &d);
            if (!rc) {
                struct ps_exec_opts eo;
                ps_exec_opts_init(&eo);
                eo.backend = PS_BACKEND_CPU;
                eo.steps = steps;
                /* one thread per kernel call: the kernels split large calls across threads
                   above a work threshold, a step in a task's cost against its micro-batch size
                   that the per-partition cost model does not have (README, diagnose) */
                eo.kernel_threads = 1;
                rc = ps_exec_run(sr.g, &sr.order, &eo, &dg->extra[dg->n_extra], &d);
            }
            ps_study_sim_finish(&sr);
            if (rc) {
                ps_diag_format(&d, dg->pred_why, sizeof(dg->pred_why));
                warn(dg, "the CPU run at chunks %d (held-out check) failed: %s", chunks[k],
                     dg->pred_why);
                ps_diag_clear(&d);
                continue;
            }
            ok[k] = true;
            int e = dg->n_extra++;
            in[n++] = (struct ps_predict_input){dg->pred_name[k], var[k], &dg->extra[e].trace};
        }
    end(dg, "done");
    if (n < 2) {
        if (!dg->pred_why[0])
            snprintf(dg->pred_why, sizeof(dg->pred_why), "no run at another chunk count");
        return;
    }
    /* diagnose's CPU runs are serial (one task at a time, in the order's sequence): devices
       as threads on one core (sim/cores.h) is that run's timing model exactly */
    if (ps_study_predict_loo(spec, dg->model, in, n, PS_CAL_ROBUST, 1,
                             dg->pred_reps > 1 ? PS_PREDICT_MIN : PS_PREDICT_MEDIAN, &dg->pred,
                             &d)) {
        ps_diag_format(&d, dg->pred_why, sizeof(dg->pred_why));
        ps_study_predict_finish(&dg->pred);
        return;
    }
    dg->have_pred = true;
}

void ps_diagnose_execute(struct ps_diagnose *dg)
{
    const struct ps_spec *spec = dg->spec;
    for (int b = 0; b < 2; b++) {
        struct ps_diagnose_run *r = &dg->runs[b];
        struct ps_exec_opts eo;
        ps_exec_opts_init(&eo);
        eo.backend = b ? PS_BACKEND_CUDA : PS_BACKEND_CPU;
        eo.steps = dg->opts.steps;
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
            double share = dg->opts.budget_s * (dg->opts.drift && dg->has_bn ? 0.5 : 0.85);
            dg->bud.deadline = dg->bud.t0 + share;
            dg->bud.slack = 0.25 * share;
            dg->bud.stopped = false;
            eo.progress = run_progress;
            eo.progress_ctx = dg;
            ps_eta_init(&dg->bud.eta);
            begin(dg, "cpu run");
            rrc = ps_exec_run(dg->g, dg->order, &eo, &r->res, &rd);
            double est_step = dg->bud.eta_total / dg->run_steps;
            if (rrc && dg->bud.stopped && dg->run_steps > 1 &&
                now_s() + est_step <= dg->bud.deadline + dg->bud.slack) {
                dg->bud.stopped = false;
                eo.steps = 1;
                ps_diag_clear(&rd);
                ps_eta_init(&dg->bud.eta);
                dg->bud.phase_t0 = now_s();
                rrc = ps_exec_run(dg->g, dg->order, &eo, &r->res, &rd);
                if (!rrc)
                    reduced(dg,
                            "the CPU run trained 1 step instead of %d (one step takes about "
                            "%.1f s): pipescope run %s --steps %d --trace measured.json",
                            dg->run_steps, est_step, spec->path, dg->run_steps);
            }
            end(dg, rrc && dg->bud.stopped ? "stopped (over the budget)" : "done");
            dg->cpu_run_s = now_s() - dg->bud.phase_t0;
            if (rrc && dg->bud.stopped) {
                snprintf(r->why, sizeof(r->why),
                         "skipped: one training step would take roughly %.0f s on this CPU "
                         "(estimated from its first %.1f s), beyond the time budget of %.0f s",
                         dg->bud.eta_total / dg->run_steps, now_s() - dg->bud.phase_t0, dg->opts.budget_s);
                reduced(dg,
                        "the CPU run was skipped (one step would take about %.0f s): pipescope "
                        "run %s --steps 1 --trace measured.json",
                        dg->bud.eta_total / dg->run_steps, spec->path);
                continue;
            }
        } else {
            rrc = ps_exec_run(dg->g, dg->order, &eo, &r->res, &rd);
        }
        if (rrc) {
            ps_diag_format(&rd, r->why, sizeof(r->why));
            /* the examples' real data set comes with Debian's scikit-learn */
            size_t wl = strlen(r->why);
            if (strstr(r->why, "/sklearn/") && wl + 60 < sizeof(r->why))
                snprintf(r->why + wl, sizeof(r->why) - wl,
                         " (hint: apt-get install python3-sklearn ships it)");
            warn(dg, "%s run failed: %s", r->name, r->why);
            continue;
        }
        r->ok = true;
        if (ps_compare_run(dg->sim.g, &dg->sim.sim.trace, &r->res.trace, &r->cmp, &rd) == 0) r->have_cmp = true;
    }
    const struct ps_diagnose_run *cpu = &dg->runs[0];
    if (cpu->ok && cpu->have_cmp) {
        struct ps_diag cd;
        ps_diag_clear(&cd);
        /* the CPU run is serial: one task after another in the order is its timing model */
        dg->cal_cores = PS_STUDY_SERIAL;
        dg->have_cal = ps_study_calibrate(dg->spec, dg->model, &dg->sim, &cpu->res.trace, true,
                                          dg->cal_cores, &dg->cal, &dg->sim_cal, &dg->cmp_cal,
                                          &cd) == 0;
    }
    if (cpu->ok) held_out(dg);
    else snprintf(dg->pred_why, sizeof(dg->pred_why), "the CPU run did not happen");
}

void ps_diagnose_drift(struct ps_diagnose *dg)
{
    const struct ps_spec *spec = dg->spec;
    if (dg->opts.drift && dg->has_bn) {
        int defc[16], nd = 0;
        if (!dg->opts.chunks) {
            /* 1, 2, 4, ... up to the batch, stopping before BatchNorm would see one value per
               channel (those settings cannot train; --chunks can still ask for them) */
            char why[192];
            for (int c = 1; c <= spec->batch && nd < 15; c *= 2) {
                if (ps_drift_check_chunks(spec, dg->model, c, why, sizeof(why))) break;
                defc[nd++] = c;
            }
            bool in = false;
            for (int k = 0; k < nd; k++) in |= defc[k] == spec->chunks;
            if (!in) defc[nd++] = spec->chunks;
        }
        enum ps_bn_policy pol[2] = {PS_BN_PLAIN, PS_BN_DEFERRED};
        const int *list = dg->opts.chunks ? dg->opts.chunks : defc;
        int nl = dg->opts.chunks ? dg->opts.n_chunks : nd;
        int dsteps = dg->run_steps, plan[64], np = 0;
        for (int k = 0; k < nl && np < 64; k++) plan[np++] = list[k];
        bool drift_fits = true;
        if (dg->opts.budget_s > 0) {
            /* cost of one setting: its steps at the CPU run's step time (+20% for the extra
               micro-batch overheads); the reference run counts as one more setting, and a
               forward-only pass and the files are left room for */
            double step_s = NAN;
            if (dg->runs[0].ok && dg->runs[0].res.steps > 0) {
                step_s = 0;
                for (int k = 0; k < dg->runs[0].res.steps; k++) step_s += dg->runs[0].res.step_us[k];
                step_s = 1.2e-6 * step_s / dg->runs[0].res.steps;
            }
            double left = dg->opts.budget_s - (now_s() - dg->bud.t0) - (isfinite(step_s) ? 0.5 * step_s : 0) - 1;
            char all[256] = "";
            for (int k = 0, o2 = 0; k < nl && o2 < 240; k++)
                o2 += snprintf(all + o2, sizeof(all) - (size_t)o2, "%s%d", k ? "," : "", list[k]);
            /* a CPU run that failed (not stopped for time): the sweep would fail the same way */
            bool cpu_failed = !dg->runs[0].ok && dg->runs[0].why[0] && !dg->bud.stopped;
            if (cpu_failed) {
                drift_fits = false;
                snprintf(dg->drift_why, sizeof(dg->drift_why),
                         "skipped: it trains as the CPU run does, and that run failed: %.300s",
                         dg->runs[0].why);
            } else if (!isfinite(step_s) || left < 3 * step_s) {
                drift_fits = false;
                snprintf(dg->drift_why, sizeof(dg->drift_why),
                         "skipped to fit the time budget of %.0f s%s", dg->opts.budget_s,
                         isfinite(step_s) ? "" : " (its cost is estimated from the CPU run, which did not fit)");
                reduced(dg, "the BatchNorm drift sweep was skipped: pipescope drift %s --chunks %s "
                              "--policy plain,deferred --steps %d -o drift",
                        spec->path, all, dg->run_steps);
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
                    reduced(dg, "the drift sweep ran %d of its %d chunk values; the rest: "
                                  "pipescope drift %s --chunks %s --policy plain,deferred --steps %d -o drift",
                            np, nl, spec->path, rest, dsteps);
                }
                if (dsteps < dg->run_steps)
                    reduced(dg, "the drift sweep trained %d step%s per setting instead of %d",
                            dsteps, dsteps == 1 ? "" : "s", dg->run_steps);
            }
        }
        struct ps_drift_opts dopt = {.n_chunks = np,
                                     .chunks = plan,
                                     .n_policies = 2,
                                     .policies = pol,
                                     .steps = dsteps,
                                     .progress = drift_progress,
                                     .progress_ctx = dg};
        struct ps_diag dd;
        ps_diag_clear(&dd);
        begin(dg, "drift sweep");
        if (drift_fits && ps_drift_run(spec, dg->model, &dopt, &dg->dr, &dd) == 0) dg->have_drift = true;
        else if (drift_fits) {
            ps_diag_format(&dd, dg->drift_why, sizeof(dg->drift_why));
            warn(dg, "drift sweep skipped: %s", dg->drift_why);
        }
        end(dg, "done");
    }
}

void ps_diagnose_adaptation(struct ps_diagnose *dg)
{
    const struct ps_spec *spec = dg->spec;
    if (dg->has_bn) {
        struct ps_exec_opts fo;
        ps_exec_opts_init(&fo);
        fo.steps = 1;
        fo.trace = false;
        fo.forward_only = true;
        /* within what is left of the budget (at least 5 s) */
        dg->bud.deadline = dg->opts.budget_s > 0 ? fmax(dg->bud.t0 + dg->opts.budget_s, now_s() + 5) : 0;
        dg->bud.slack = 0;
        dg->bud.stopped = false;
        fo.progress = run_progress;
        fo.progress_ctx = dg;
        ps_eta_init(&dg->bud.eta);
        begin(dg, "BN adaptation pass");
        struct ps_exec_result fr;
        struct ps_diag fd;
        ps_diag_clear(&fd);
        int frc = ps_exec_run(dg->g, dg->order, &fo, &fr, &fd);
        end(dg, frc && dg->bud.stopped ? "stopped (over the budget)" : "done");
        if (frc && dg->bud.stopped) {
            reduced(dg, "the BN adaptation pass was skipped (a forward pass would take about "
                          "%.0f s): pipescope run %s --forward-only --steps 1",
                    dg->bud.eta_total, spec->path);
        } else if (frc == 0) {
            /* the BN layer with the fewest updates: the one adaptation misses most */
            for (int l = 0; l < spec->n_layers; l++) {
                if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
                int u = 0;
                for (uint32_t k = 0; k < fr.n_bn; k++) u += fr.bn[k].layer == l;
                if (dg->adapt_updates < 0 || u < dg->adapt_updates) {
                    dg->adapt_updates = u;
                    dg->adapt_layer = l;
                }
            }
            ps_exec_result_finish(&fr);
        } else {
            char w[1024];
            warn(dg, "BN adaptation pass skipped: %s", ps_diag_format(&fd, w, sizeof(w)));
        }
    }
}

void ps_diagnose_finish(struct ps_diagnose *dg)
{
    ps_advise_finish(&dg->advise);
    free(dg->advise_spec);
    ps_drift_finish(&dg->dr);
    ps_compare_finish(&dg->cmp_cal);
    ps_study_sim_finish(&dg->sim_cal);
    ps_study_predict_finish(&dg->pred);
    for (int k = 0; k < dg->n_extra; k++) ps_exec_result_finish(&dg->extra[k]);
    ps_calib_finish(&dg->cal);
    for (int b = 0; b < 2; b++) {
        ps_compare_finish(&dg->runs[b].cmp);
        if (dg->runs[b].ok) ps_exec_result_finish(&dg->runs[b].res);
    }
    ps_study_sim_finish(&dg->sim);
    ps_study_whatif_finish(&dg->nophony);
    ps_analysis_finish(&dg->an);
    free(dg->roofline);
    ps_costs_destroy(dg->costs);
    memset(dg, 0, sizeof(*dg));
}
