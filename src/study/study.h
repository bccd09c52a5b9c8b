/* study: the pipelines the commands share, between the core (spec, graph, schedules, analysis),
 * sim, the executors and the CLI. A study takes a const spec and variants of it, runs what it
 * needs and returns results with a struct ps_diag; it never prints and never exits, so a command
 * is argument parsing, calls into a study and printing.
 *
 *   simulate.c   one simulation of a variant (or of a hand-written plan) with its costs
 *   whatif.c     the no-phony what-if: the same variant without depend() edges
 *   drift.c      the BatchNorm drift sweep over chunks x policy x checkpoint (src/drift.h)
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

#include "sim/cost.h"
#include "sim/sim.h"
#include "src/analysis.h"
#include "src/drift.h"
#include "src/schedule.h"

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

/* ---- drift.c -------------------------------------------------------------------------------- */

/* Runs every setting and the reference, each a variant of the (unchanged) spec. Settings that
 * ps_drift_check_chunks refuses are listed in out->skipped instead; when every setting is
 * refused, or the reference cannot run, it fails. Returns 0 or a negative errno with diag (a
 * setting that fails names its chunks/policy/checkpoint). */
int ps_drift_run(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_drift_opts *o, struct ps_drift *out, struct ps_diag *d);
#endif
