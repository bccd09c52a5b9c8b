/* study: the pipelines the commands share, between the core (spec, graph, schedules, analysis),
 * sim, the executors and the CLI. A study takes a const spec and variants of it, runs what it
 * needs and returns results with a struct ps_diag; it never prints and never exits, so a command
 * is argument parsing, calls into a study and printing.
 *
 *   simulate.c   one simulation of a variant (or of a hand-written plan) with its costs
 *   whatif.c     the no-phony what-if: the same variant without depend() edges
 *   drift.c      the BatchNorm drift sweep over chunks x policy x checkpoint (src/drift.h)
 *   sweep.c      the chunks x checkpoint x schedule sweep of simulations
 *   advise.c     the configuration search of `advise` (src/advise.h): schedule x chunks x
 *                checkpoint x BN policy with exact balance under a memory cap, Pareto front
 *   predict.c    one cost model calibrated on several measured runs, and its predictions of
 *                held-out runs (predicted vs measured makespan, bubble, per-device busy time)
 *   diagnose.c   diagnose's phases (check, simulate, execute + compare + calibrate, drift, BN
 *                adaptation), each one function
 *   report.c     diagnose's findings, page and report folder contents
 *
 * Layering: core (src) <- sim, kernels <- study (src/study) <- cli (src/cli); viz (writers) is
 * used by study and cli only.
 */
#ifndef PS_STUDY_H
#define PS_STUDY_H

#include <stdbool.h>

#include "sim/cores.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "src/analysis.h"
#include "src/advise.h"
#include "src/drift.h"
#include "kernels/exec.h"
#include "sim/calibrate.h"
#include "src/compare.h"
#include "src/schedule.h"

#include <cjson/cJSON.h>

/* ---- simulate.c ---------------------------------------------------------------------------- */

/* One simulation: the graph of the variant's schedule (or of a hand-written plan), its execution
 * order (the engine's for GPipe, the plan's otherwise), the costs (measured file or roofline)
 * and the simulator's result. */
struct ps_study_sim {
    struct ps_graph *g;
    struct ps_order order;
    double *cost;
    struct ps_sim sim;
    char *stuck; /* deadlock report, one line per stage */
};

/* plan may be NULL (the variant's schedule); costs may be NULL (roofline). Returns 0, -EDEADLK
 * (run->stuck filled) or another negative errno with diag. */
int ps_study_simulate(const struct ps_spec *spec, const struct ps_model *model,
                      const struct ps_variant *v, const struct ps_plan *plan,
                      const struct ps_costs *costs, struct ps_study_sim *run, struct ps_diag *diag);
void ps_study_sim_finish(struct ps_study_sim *run); /* accepts a zeroed struct */
/* Loads the costs file `override`, else spec->costs when set; *out NULL when neither is. Checks
 * the layer count against the spec. 0 or a negative errno with diag. */
int ps_study_costs(const struct ps_spec *spec, const char *override, struct ps_costs **out,
                   struct ps_diag *diag);

/* Compare + calibrate: the costs fitted to a measured trace of base's graph (sim/calibrate.h),
 * the spec's variant simulated again with them, and that simulation compared with the trace.
 * per_sample selects the costs file's unit. cores 0: simulated by the pipeline simulator (a GPU
 * run, or devices that each have a core); cores >= 1: as devices that are threads on that many
 * cores; PS_STUDY_SERIAL: as `run --serial`, one task after another in the order (sim/cores.h).
 * Those timelines replace sim_cal's, without launches. 0 or a negative errno with diag. */
#define PS_STUDY_SERIAL (-1)
int ps_study_calibrate(const struct ps_spec *spec, const struct ps_model *model,
                       const struct ps_study_sim *base, const struct ps_trace *meas,
                       bool per_sample, int cores, struct ps_calib *cal,
                       struct ps_study_sim *sim_cal, struct ps_compare *cmp_cal,
                       struct ps_diag *diag);

/* ---- whatif.c ------------------------------------------------------------------------------ */

/* The no-phony what-if (SEMANTICS.md): the same variant without depend() edges, its engine
 * order and its analysis, next to the spec's. */
struct ps_whatif {
    bool ran;              /* the schedule has depend() edges, the spec uses them, all built */
    struct ps_graph *g;
    struct ps_order order;
    struct ps_analysis an;
    uint32_t lost;         /* violations of checks that hold with phony edges */
    double mem_growth;     /* max over devices of peak activations without / with */
};

/* True when v's schedule has depend() edges (the what-if changes something). */
bool ps_study_whatif_applies(const struct ps_variant *v);
/* v without depend() edges. */
struct ps_variant ps_study_whatif_variant(const struct ps_variant *v);
/* Builds, orders and analyses the what-if of the spec's own variant, when the spec uses phony
 * edges and its schedule has them (w->ran false otherwise, or when a step fails: the what-if is
 * extra information, never an error). base is the spec's analysis, for lost and mem_growth. */
void ps_study_whatif(const struct ps_spec *spec, const struct ps_model *model,
                     const struct ps_analysis *base, struct ps_whatif *w);
void ps_study_whatif_finish(struct ps_whatif *w); /* accepts a zeroed struct */

/* ---- predict.c ----------------------------------------------------------------------------- */

/* One measured run: its spec (any chunks, checkpoint mode or schedule of one model), its trace,
 * and, after the fit, its simulation with the fitted costs against the measurement. */
struct ps_predict_run {
    const char *spec_path, *trace_path; /* the caller's; spec_path names the configuration (runs
                                           with one name are repetitions of it), trace_path may
                                           be NULL (a trace in memory) */
    bool holdout;                       /* predicted, not fitted */
    bool fitted;                        /* read by the fit (not held out; with PS_PREDICT_MIN
                                           among the least disturbed quarter of its
                                           configuration's runs) */
    bool borrowed;                      /* spec, model and measurement are the caller's */
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_variant var;              /* the configuration */
    struct ps_study_sim base;           /* graph and order (roofline costs) */
    struct ps_trace meas;               /* loaded from trace_path (not borrowed) */
    const struct ps_trace *measured;    /* &meas, or the caller's trace */
    struct ps_study_sim pred;           /* with the fitted costs */
    struct ps_cores_result csim;        /* pred's graph on `cores` cores (when cores > 0) */
    struct ps_compare cmp;              /* pred (or csim) against the measurement */
};

/* The runs of one spec (repetitions of one configuration: a shared machine's noise), summed up:
 * the prediction is one number, the measurements are spread; errors are against their median,
 * or their minimum (the run the machine's other load disturbed least: interference only ever
 * adds time). The statistic also chooses what the fit reads: with the minimum, only the least
 * disturbed quarter of each fitted configuration's runs (costs at the speed the minimum
 * measures); with the median, every run. */
enum ps_predict_stat { PS_PREDICT_MEDIAN, PS_PREDICT_MIN };
#define PS_PREDICT_MAX_DEVICES 8
struct ps_predict_group {
    int first;                          /* index of its first run */
    int n_runs;
    bool holdout;
    int cores;                          /* how it was simulated (ps_predict.cores) */
    double pred_makespan_us, meas_median_us, meas_min_us, meas_max_us;
    double meas_us;                     /* the median or the minimum (ps_predict_stat) */
    double error;                       /* (meas_us - predicted) / meas_us */
    double pred_bubble, meas_bubble;    /* mean over devices; measured: median over runs */
    int n_devices;                      /* up to PS_PREDICT_MAX_DEVICES */
    double pred_busy_us[PS_PREDICT_MAX_DEVICES], meas_busy_us[PS_PREDICT_MAX_DEVICES]; /* median */
};

struct ps_predict {
    int n;
    struct ps_predict_run *runs;
    int n_groups;                       /* runs grouped by spec path, first appearance order */
    struct ps_predict_group *groups;
    struct ps_calib_fit fit;            /* over the runs that are not held out (leave-one-out:
                                           over every run); with PS_PREDICT_MIN the least
                                           disturbed quarter of each configuration's runs */
    int n_fitted;                       /* runs the fit read */
    bool loo;                           /* leave-one-out: each group predicted by a fit to the
                                           others (ps_study_predict_loo) */
    int cores;                          /* 0: the simulator (sim.h); N: sim/cores.h on N cores
                                           (leave-one-out: the last fold's; groups say theirs) */
    enum ps_predict_stat stat;
    double fit_error[PS_PREDICT_MAX_DEVICES + 1]; /* auto: mean |makespan error| of the fitted
                                                     runs with 0..D cores (NaN: not tried) */
    double max_holdout_error;           /* max |error| over held-out groups; NaN: none */
    double mean_holdout_error;          /* mean |error| over held-out groups; NaN: none */
};

/* Loads every spec and trace, fits one cost model to the runs not held out (ps_calibrate_runs
 * with `loss`) and simulates every run with it: with the simulator (cores 0), with devices as
 * threads on `cores` CPU cores (sim/cores.h), or, cores < 0, with whichever of 0, 1, ..., D
 * (the devices) gives the fitted runs the smallest mean |makespan error| (held-out runs are not
 * looked at for the choice). Errors compare with each configuration's `stat`. At least one run must be fitted; a spec given
 * both to fit and to hold out is an error. 0 or a negative errno with diag (the file that
 * failed). */
int ps_study_predict(const char *const *spec_paths, const char *const *trace_paths,
                     const bool *holdout, int n, enum ps_calib_loss loss, int cores,
                     enum ps_predict_stat stat, struct ps_predict *out, struct ps_diag *diag);

/* A configuration measured in memory (diagnose): its name (runs with one name are repetitions),
 * the configuration of the caller's spec and the trace of its run. */
struct ps_predict_input {
    const char *name;
    struct ps_variant var;
    const struct ps_trace *meas;
};
/* Leave-one-out over configurations measured in memory (spec and model the caller's, as the
 * traces, all outliving out): every configuration is predicted by a fit to all the others
 * (cores as ps_study_predict, chosen per fold on that fold's fitted runs), so every group is
 * held out and its error is the simulator's accuracy on a configuration it has not seen;
 * out->fit is then the fit to every run (the costs to use). Needs two configurations at least.
 * 0 or a negative errno with diag. */
int ps_study_predict_loo(const struct ps_spec *spec, const struct ps_model *model,
                         const struct ps_predict_input *in, int n, enum ps_calib_loss loss,
                         int cores, enum ps_predict_stat stat, struct ps_predict *out,
                         struct ps_diag *diag);
void ps_study_predict_finish(struct ps_predict *p); /* accepts a zeroed struct */
/* calibrate's and diagnose's JSON of a prediction (viz/REPORT.md, calibration): the fit, how
 * the runs were simulated, the held-out errors and every run's predicted vs measured figures. */
cJSON *ps_predict_json(const struct ps_predict *p, enum ps_calib_loss loss);

/* ---- drift.c -------------------------------------------------------------------------------- */

/* Runs every setting and the reference, each a variant of the (unchanged) spec. Settings that
 * ps_drift_check_chunks refuses are listed in out->skipped instead; when every setting is
 * refused, or the reference cannot run, it fails. Returns 0 or a negative errno with diag (a
 * setting that fails names its chunks/policy/checkpoint). */
int ps_drift_run(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_drift_opts *o, struct ps_drift *out, struct ps_diag *d);
/* ---- sweep.c -------------------------------------------------------------------------------- */

/* One configuration of a sweep: the spec with chunks, checkpoint mode and schedule set. */
struct ps_sweep_row {
    int chunks, m;               /* configured chunks, real micro-batches */
    int devices;                 /* devices the schedule ran on */
    enum ps_schedule sched;
    enum ps_checkpoint ckpt;
    bool ok;
    bool bad_chunks;             /* the spec cannot take these chunks (no schedule was tried) */
    char why[PS_DIAG_MSG_MAX];   /* not ok: why */
    double makespan, throughput, bubble, recompute;
    int64_t peak;                /* the highest peak activation memory of any device */
};

struct ps_sweep_opts {
    const int *chunks;
    int n_chunks;
    const enum ps_checkpoint *ckpt;
    int n_ckpt;
    const enum ps_schedule *sched;
    int n_sched;
    /* called before and after each row (k counts from 1 to n); may be NULL */
    void (*before)(void *ctx, int k, int n, const struct ps_sweep_row *r);
    void (*after)(void *ctx, int k, int n, const struct ps_sweep_row *r);
    void *ctx;
};

/* Simulates every configuration, schedule-major, then checkpoint, then chunks, into rows
 * (n_sched x n_ckpt x n_chunks of them). A configuration that cannot be built is a row with ok
 * false and why. Returns how many ran; diag holds the last failure (for a sweep where none ran). */
int ps_study_sweep(const struct ps_spec *spec, const struct ps_model *model,
                   const struct ps_costs *costs, const struct ps_sweep_opts *o,
                   struct ps_sweep_row *rows, struct ps_diag *diag);
/* The report's "sweep" section for n rows: a report object holding {"sweep": [...]}, one object
 * per configuration (sweep -o/--json writes it; diagnose moves the array to "schedules"). */
cJSON *ps_sweep_json(const struct ps_sweep_row *rows, int n);

/* ---- diagnose.c, report.c ----------------------------------------------------------------- */

/* diagnose: everything this machine can find out about a spec, one phase per function. The
 * command calls them in order (check, simulate, execute, drift, adaptation, write) and may time
 * or report each; a phase needs the ones before it. Warnings (a backend that failed, a drift
 * sweep that could not run) are results, kept in warn[] for the command to print. */
/* Progress of a long phase, for a command to show (every hook may be NULL). */
struct ps_study_progress {
    void *ctx;
    void (*begin)(void *ctx, const char *phase);
    /* frac in [0, 1]; i/n (n > 0) counts `unit`s */
    void (*update)(void *ctx, double frac, int i, int n, const char *unit);
    void (*end)(void *ctx, const char *how);
};

struct ps_diagnose_opts {
    const char *costs_path;  /* --costs, or NULL for the spec's */
    const int *chunks;       /* drift's chunks, NULL = 1, 2, 4, ... up to the batch */
    int n_chunks;
    int steps;               /* 0 = the spec's */
    bool drift;              /* run the drift sweep (when the model has BatchNorm) */
    double budget_s;         /* time budget of the whole diagnose, s; <= 0: --full */
    const char *outdir;      /* -o DIR, for the commands the findings suggest */
    struct ps_study_progress progress;
};

/* An estimate of a CPU run's total time from the executor's progress reports (study/eta.c):
 * the first substantial task (one-time costs) counts once, the rest is paced by the tasks after
 * it. ps_eta_total is NAN until it can tell. */
struct ps_eta {
    double t, done, total;     /* the latest report: s since the run began, work done, work */
    bool warm;                 /* the first substantial task has ended */
    double warm_t, warm_done;  /* when, and the work done by then */
};
void ps_eta_init(struct ps_eta *e);
void ps_eta_observe(struct ps_eta *e, double t_s, double done, double total);
double ps_eta_total(const struct ps_eta *e);

/* The time budget (about 60 s of work on 2 cores by default). The CPU run is watched through the
 * executor's progress hook: once it has run for a second, ps_eta gives its total time (the
 * first task's one-time costs counted once, the rest paced by the tasks after it); when that
 * ends past the phase's deadline (plus a quarter of the phase's share of the
 * budget) the run stops and is retried with one step, or skipped. The drift sweep is planned
 * from the CPU run's measured step time: fewer steps per setting first, then fewer chunk values
 * (the spec's own first). Every reduction is written down with the command that runs the rest. */
#define PS_DIAGNOSE_MAX_REDUCED 6
struct ps_diagnose_budget {
    double t0;               /* start of diagnose (s, monotonic) */
    double deadline;         /* the watched phase must end by this (absolute, s) */
    double slack;            /* tolerance beyond the deadline, s */
    double phase_t0;         /* start of the watched phase */
    bool stopped;            /* the hook stopped a run */
    double eta_total;        /* the stopped run's estimated total time, s */
    struct ps_eta eta;       /* the watched run's estimator */
    int n_reduced;
    char reduced[PS_DIAGNOSE_MAX_REDUCED][400];
};

struct ps_diagnose_run {
    const char *name;        /* "cpu", "cuda" */
    bool ok;
    char why[512];           /* not run: why */
    struct ps_exec_result res;
    struct ps_compare cmp;   /* against the simulation */
    bool have_cmp;
};

#define PS_DIAGNOSE_MAX_FINDINGS 16
#define PS_DIAGNOSE_MAX_WARN 4

struct ps_diagnose {
    const struct ps_spec *spec;
    const struct ps_model *model;
    const struct ps_graph *g;          /* the spec's graph and its engine order */
    const struct ps_order *order;
    struct ps_diagnose_opts opts;
    struct ps_diagnose_budget bud;
    int run_steps;                     /* the steps a run trains (opts.steps, else the spec's) */
    struct ps_costs *costs;            /* NULL: roofline */
    /* check */
    double *roofline;
    struct ps_analysis an;
    struct ps_whatif nophony;
    /* simulate */
    struct ps_study_sim sim;
    /* schedules: every schedule at the spec's chunks and checkpoint mode */
    int n_sched_rows;
    struct ps_sweep_row sched_rows[PS_SCHED__COUNT];
    /* advise: the configuration search under the spec's own peak (advise --memory-cap auto) */
    bool have_advise;
    struct ps_advise advise;
    char *advise_spec;                 /* recommended.json's text, NULL without a recommendation */
    char advise_why[PS_DIAG_MSG_MAX];  /* why there is no advise section */
    /* execute */
    struct ps_diagnose_run runs[2];    /* cpu, cuda */
    bool have_cal;                     /* costs calibrated to the CPU run, simulated again */
    int cal_cores;                     /* ... simulated so (ps_study_calibrate's cores) */
    struct ps_calib cal;
    struct ps_study_sim sim_cal;
    struct ps_compare cmp_cal;
    /* held out: the CPU run and CPU runs at other chunk counts (the same steps), each predicted
       by a fit to the others (ps_study_predict_loo): the simulator's accuracy. When they are
       cheap, each configuration runs PS_DIAGNOSE_REPS times (the CPU run is the first of its
       own), rounds interleaved, and the fit reads the least disturbed quarter (PS_PREDICT_MIN) */
    double cpu_run_s;                  /* the CPU run's wall time */
#define PS_DIAGNOSE_REPS 5
    int pred_reps;                     /* runs of each configuration (1 or PS_DIAGNOSE_REPS) */
    int n_extra;
    struct ps_exec_result extra[3 * PS_DIAGNOSE_REPS];
    char pred_name[3][32];
    bool have_pred;
    struct ps_predict pred;
    char pred_why[600];                /* no held-out figures: why */
    /* drift */
    bool has_bn;
    bool have_drift;
    char drift_why[1024];
    struct ps_drift dr;
    /* BN adaptation: the fewest updates a BN layer got in one forward-only pass (-1: not run) */
    int adapt_updates, adapt_layer;
    /* results in words */
    int n_findings;
    char findings[PS_DIAGNOSE_MAX_FINDINGS][512];
    int n_warn;
    char warn[PS_DIAGNOSE_MAX_WARN][1100];
};

/* Loads the costs (0 or a negative errno with diag). The spec, model, graph and order stay the
 * caller's and must outlive dg. */
int ps_diagnose_init(struct ps_diagnose *dg, const struct ps_spec *spec,
                     const struct ps_model *model, const struct ps_graph *g,
                     const struct ps_order *order, const struct ps_diagnose_opts *opts,
                     struct ps_diag *diag);
/* Static checks on the spec's graph (roofline costs) and the no-phony what-if. */
int ps_diagnose_check(struct ps_diagnose *dg, struct ps_diag *diag);
/* The simulated timeline with the costs. */
int ps_diagnose_simulate(struct ps_diagnose *dg, struct ps_diag *diag);
/* Simulates every schedule at the spec's chunks and checkpoint mode (a schedule that cannot
 * take them is a row saying why): the report's side-by-side table of makespan, bubble, peak
 * memory and devices. */
void ps_diagnose_schedules(struct ps_diagnose *dg);
/* advise's search with the spec's own simulated peak as the memory cap and the drift predicted
 * when advise would predict it: the report's "advise" section, pareto.svg and recommended.json.
 * Never fails: without a result advise_why says why. */
void ps_diagnose_advise(struct ps_diagnose *dg);
/* A real run on the CPU, and on CUDA when there is one, each compared with the simulation; the
 * costs calibrated to the CPU run and simulated again. Never fails: a run that cannot happen
 * says why in runs[b].why. */
void ps_diagnose_execute(struct ps_diagnose *dg);
/* The BatchNorm drift sweep (plain and deferred BN over chunks), when asked and the model has
 * BatchNorm. */
void ps_diagnose_drift(struct ps_diagnose *dg);
/* One forward-only train-mode pass of the spec as it is (does it adapt BN statistics). */
void ps_diagnose_adaptation(struct ps_diagnose *dg);
/* report.c: the findings (dg->findings), index.html, report.json, traces, pictures and the
 * calibrated costs file, into the folder dir. 0 or a negative errno with diag. */
int ps_diagnose_write(struct ps_diagnose *dg, const char *dir, struct ps_diag *diag);
void ps_diagnose_finish(struct ps_diagnose *dg); /* accepts a zeroed struct */

/* ---- advise.c ------------------------------------------------------------------------------- */

struct ps_advise_opts {
    int devices;                  /* 0 = the spec's */
    double memory_cap;            /* bytes per device, 0 = none */
    bool cap_auto;                /* the cap is the spec's own simulated peak */
    enum ps_advise_objective objective;
    bool no_prune;                /* evaluate every configuration (the brute-force check) */
    bool predict_drift;           /* run the forward pass that the drift prediction reads */
    const char *drift_why;        /* why not, when predict_drift is false ("" = none) */
    const struct ps_costs *costs; /* NULL = roofline */
    int train_steps;              /* > 0: measure drift with short trainings at the best three */
};

/* forward FLOPs of one whole-batch pass above which advise leaves the drift prediction out */
#define PS_ADVISE_FORWARD_FLOPS 5e9
/* Whether advise predicts the drift by default (the forward pass is at most
 * PS_ADVISE_FORWARD_FLOPS); when not, why says so. */
bool ps_study_advise_drift_default(const struct ps_spec *spec, const struct ps_model *model,
                                   char *why, size_t len);
/* Per-layer forward + backward time of bs samples (measured costs when given, else the
 * roofline), what balance and advise split into stages. */
void ps_study_layer_time(const struct ps_spec *spec, const struct ps_model *model,
                         const struct ps_costs *costs, double bs, double *t);
/* The search (advise.h). 0 or a negative errno with diag; configurations that cannot run are
 * points with status PS_ADV_SKIPPED and their reason, never an error. */
int ps_study_advise(const struct ps_spec *spec, const struct ps_model *model,
                    const struct ps_advise_opts *o, struct ps_advise *a, struct ps_diag *d);
/* The spec file of point p: the spec's own JSON with p's pipeline fields (pipeline.devices
 * dropped, every stage on its default device cuda:j, or "cpu" for a CPU spec), pretty-printed,
 * malloc'd. */
int ps_study_advise_spec(const struct ps_spec *spec, const struct ps_advise_point *p, char **json,
                         struct ps_diag *d);
/* Every partition on "cpu": the search simulates one device per stage (the CPU executor runs a
 * thread per partition) and the recommended spec keeps "cpu" for every stage. */
bool ps_study_advise_cpu(const struct ps_spec *spec);
#endif
