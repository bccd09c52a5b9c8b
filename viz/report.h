/* report: one writer per section of the report JSON (viz/REPORT.md's stable names), used by every
 * command that emits the section, so `simulate --json`, `run --json`, `compare --json` and
 * diagnose's report.json carry the same fields for the same thing:
 *
 *   section       writer                    written by
 *   spec, graph,  ps_report_add_spec/_graph/ check, simulate, run, diagnose (viz.h)
 *   analysis        _analysis
 *   simulation    ps_report_simulation      simulate, diagnose
 *   batchnorm     ps_report_bn_order        simulate (the simulated update order)
 *                 ps_report_bn_updates      run (the measured updates and final statistics)
 *   execution     ps_report_execution       run (one backend), diagnose (one per backend)
 *   comparison    ps_cmp_json               compare, diagnose
 *     calibration ps_calib_json, with the fitted costs file of ps_costs_json; calibrate's fit
 *                 ps_calib_fit_json
 *   drift         ps_drift_json             drift, diagnose (plots: ps_drift_plot)
 *   advise        ps_advise_json            advise, diagnose (table: ps_advise_table, plot:
 *                                           ps_advise_plot)
 *
 * Writers only: each takes the results of the layer that computed them and returns a new cJSON
 * object (NULL when out of memory); the caller attaches it with ps_json_set.
 * Adding a section: a writer here (report.c, or a file of its own), its row above, and a call in
 * each command that emits it.
 */
#ifndef PS_VIZ_REPORT_H
#define PS_VIZ_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "kernels/exec.h"
#include "sim/bnorder.h"
#include "sim/calibrate.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "src/analysis.h"
#include "src/compare.h"
#include "src/advise.h"
#include "src/drift.h"
#include "src/trace_read.h"

/* Human units for text and pages: "211.3 us", "35.20 ms", "1.204 s" ("n/a" when not finite);
 * "12.3 MiB". Return buf. */
const char *ps_viz_time(double us, char *buf, int len);
const char *ps_viz_bytes(double b, char *buf, int len);

/* "simulation": makespan, throughput, bubble, time per kind, per-device figures with the memory
 * curve, critical path. batch gives the throughput. */
cJSON *ps_report_simulation(const struct ps_graph *g, const struct ps_sim *sim, int64_t batch);
/* "batchnorm" of a simulation: the update order the timeline implies. */
cJSON *ps_report_bn_order(const struct ps_bn_order *b);
/* "execution" of one backend's run of graph g; with the executor's memory measurement, per device
 * (sim: the simulated peaks along the executed order, may be NULL; serial: --serial ran the
 * devices on one thread). */
cJSON *ps_report_execution(const struct ps_graph *g, const char *backend, bool forward_only,
                           bool serial, const struct ps_exec_result *r, const struct ps_mem *sim);
/* "batchnorm" of a run: every logged update and the final running statistics. */
cJSON *ps_report_bn_updates(const struct ps_spec *s, const struct ps_exec_result *r);

/* The "comparison" object. info (may be NULL) adds the reader's counts and unmatched names. */
cJSON *ps_cmp_json(const struct ps_graph *g, const struct ps_compare *c,
                   const struct ps_trace *meas, const struct ps_trace_read_info *info,
                   const struct ps_tolerance *tol, int exceeded, const char *why);
/* The "fit" of `calibrate` (sim/calibrate.h ps_calibrate_runs): every term with its standard
 * error, null where not identifiable (viz/REPORT.md, calibration). */
cJSON *ps_calib_fit_json(const struct ps_calib_fit *f);
/* {"fitted": ..., "costs": ..., "before": ..., "after": ...} of a calibration. */
cJSON *ps_calib_json(const struct ps_calib *cal, const struct ps_compare *before,
                     const struct ps_compare *after);

/* The costs file (sim/cost.h's format, read by ps_costs_load), numbers with %.17g; written
 * atomically to path ("-" = stdout). */
cJSON *ps_costs_json(const struct ps_costs *c);
int ps_costs_write(const struct ps_costs *c, const char *path, struct ps_diag *diag);

/* The "drift" section of the report JSON (viz/REPORT.md, "drift"). NULL when out of
 * memory. */
cJSON *ps_drift_json(const struct ps_drift *dr);
/* Line plots: metric against chunks, one line per policy (and checkpoint mode when several);
 * "loss" plots the loss curves of train mode against the step. Returns 0 or -errno. */
int ps_drift_plot(const struct ps_drift *dr, const char *metric, const char *path,
                  struct ps_diag *d);

/* The "advise" section: the search's counts, the spec's own figures, the recommendation, the
 * Pareto front and every point with its status. NULL when out of memory. */
cJSON *ps_advise_json(const struct ps_advise *a);
/* The front as a text table (all: every other point too, with its reason), then the
 * recommendation in words. 0 or -EIO. */
int ps_advise_table(const struct ps_advise *a, FILE *f, bool all);
/* Peak memory per device against throughput: the front per BN policy, and the spec. */
int ps_advise_plot(const struct ps_advise *a, const char *path, struct ps_diag *d);
const char *ps_advise_status_name(int status); /* "feasible", "pruned", ... */

#endif
