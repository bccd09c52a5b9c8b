/* simrun: one simulation of a spec for the CLI (simulate, sweep, balance share it): graph of the
 * schedule (or of a hand-written plan), its execution order (the engine's for GPipe, the plan's
 * otherwise), costs (measured file or roofline) and the simulator's result. */
#ifndef PS_CLI_SIMRUN_H
#define PS_CLI_SIMRUN_H

#include "src/cli/cli.h"
#include "sim/cost.h"
#include "src/schedule.h"
#include "sim/sim.h"

struct ps_simrun {
    struct ps_graph *g;
    struct ps_order order;
    double *cost;
    struct ps_sim sim;
    char *stuck; /* deadlock report, one line per stage */
};

/* plan may be NULL (the spec's schedule); costs may be NULL (roofline). Returns 0, -EDEADLK
 * (run->stuck filled) or another negative errno with diag. */
int ps_simrun(const struct ps_spec *spec, const struct ps_model *model,
              const struct ps_variant *opts, const struct ps_plan *plan,
              const struct ps_costs *costs, struct ps_simrun *run, struct ps_diag *diag);
void ps_simrun_finish(struct ps_simrun *run);
/* Loads spec->costs when set (NULL otherwise); exit code on failure. */
int ps_simrun_costs(const struct ps_cli *cli, const struct ps_spec *spec, const char *override,
                    struct ps_costs **out);

#endif
