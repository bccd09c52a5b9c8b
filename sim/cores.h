/* cores: the simulator for devices that are host threads sharing fewer CPU cores than there are
 * devices (the cpu executor's worker per device, kernels/exec_cpu.c, on a small or busy machine).
 *
 * The executor's rules: device d's worker runs its work nodes (F, B, R, Wg and the loss; copies,
 * waits and fork/join are no-ops in one address space and take no time) in the order's sequence,
 * and before a node waits for the work nodes on other devices behind its DATA in-edges (through
 * nodes without work); phony and host edges order nothing. A worker needs a core to run. Cores
 * are handed out the way a scheduler that does not preempt a running thread for one it has just
 * woken does: a worker keeps its core while its next node is ready when the previous one ends
 * (run until it blocks); a free core goes to the worker that has been ready longest (ties: the
 * lower device). With as many cores as devices this is the plain pipeline without launch costs;
 * with one core the devices take turns, each running until it has to wait.
 * Deterministic: the same graph, order, costs and cores give the same trace.
 */
#ifndef PS_CORES_H
#define PS_CORES_H

#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/trace.h"

struct ps_cores_result {
    struct ps_trace trace; /* one record per work node with a stream */
    double makespan_us;
};

/* cost_us[v]: device time of node v (cost.h's ps_cost_fill). cores >= 1. Returns 0, -EINVAL
 * (diag) when the order cannot run (a dependency never ends) or -ENOMEM. */
int ps_sim_cores(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                 int cores, struct ps_cores_result *out, struct ps_diag *diag);
void ps_cores_finish(struct ps_cores_result *r); /* accepts a zeroed struct */

/* The serial executor (`run --serial`): every work node in the order's sequence, each starting
 * when the one before it ends, whatever its device. Same result struct; 0 or -ENOMEM. */
int ps_sim_serial(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                  struct ps_cores_result *out, struct ps_diag *diag);

#endif
