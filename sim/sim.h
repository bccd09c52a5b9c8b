/* sim: a deterministic discrete-event simulator of a task graph over devices x streams.
 *
 * Input: the graph, an execution order (struct ps_order: the host's issue order, each entry
 * with the host thread that issues it) and a cost per node (device time in microseconds, from
 * cost.h or a test's own array). Rules, for every node v that runs (order->pos[v] set):
 *
 *   issue(v) = max( issue(u) + h(u)  for every predecessor u (any edge kind),
 *                   issue(p) + h(p)  for p the previous entry of v's host thread )
 *   start(v) = max( issue(v) + h(v),
 *                   end(q)           for q the previous entry of v's stream in the order,
 *                   end(u)           for every device wait of v (waits.h: wait nodes, copy
 *                                    barriers, the engine's sync of real gradients),
 *                   end(u)           for every STREAM predecessor u, and for every DATA
 *                                    predecessor u when v is host-only or v is a backward node
 *                                    fed through a host-only node (the loss's own time) )
 *   end(v)   = start(v) + cost(v)
 *
 * with h(x) = launch overhead when x has a stream (a kernel launch or event call on the host)
 * and 0 for host-only nodes (fork, join, loss). PHONY and HOST edges order the host only: the
 * GPipe clock-cycle fence orders kernel launches, not kernel execution (SEMANTICS.md section 1),
 * and a phony carries no tensor, so no stream waits for it (section 2). So C(i,j-1->j) overlaps
 * F(i-1,j), and R(i,j) overlaps B(i,j+1) (section 5). A forward DATA edge between streams with
 * no wait node is a race, not an order (analysis.h reports it; the timeline shows it).
 *
 * Because every stream's order and every thread's order is fixed by `order`, no event ever
 * competes for a resource: the event queue of a classic discrete-event engine pops events in
 * an order that cannot change any time, and the simulation reduces to one pass over the order
 * (which must be topological; otherwise -EINVAL names the offending pair). Ties therefore need
 * no rule for the times; records are emitted in node-index order, so output is byte-stable.
 *
 * Outputs: one trace record per node that runs and has a stream, the makespan, per-device busy
 * time (compute streams) and bubble fraction (1 - busy / makespan), forward/backward/recompute
 * time, activation memory over time per device (a node's act_bytes are allocated at its start
 * and freed when B(i,j) ends; with a split backward, the saved inputs of linear/conv layers stay
 * until Wg(i,j) ends, as the weight gradient reads them), in-flight micro-batches (F started, B
 * not ended) and the critical path of the simulated timeline (each node's binding
 * constraint, followed back from the node that ends last).
 */
#ifndef PS_SIM_H
#define PS_SIM_H

#include <stdint.h>

#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/trace.h"

struct ps_sim_opts {
    double launch_us; /* host time per node with a stream; cost.h's ps_cost_launch_us */
};

struct ps_sim_mem_point {
    double t_us;
    int64_t bytes; /* activation bytes alive from t_us on */
};

struct ps_sim_device {
    double busy_us;           /* time its compute stream(s) run nodes */
    double bubble_fraction;   /* 1 - busy / makespan */
    double forward_us, backward_us, recompute_us, optimizer_us;
    int64_t peak_bytes;
    double peak_t_us;
    uint32_t n_mem;
    struct ps_sim_mem_point *mem; /* step function, time ascending */
    uint32_t max_in_flight;   /* most tasks (i,j) on it with F started and B not ended */
};

struct ps_sim {
    struct ps_trace trace;
    double makespan_us;
    double bubble_fraction;   /* mean over devices */
    double forward_us, backward_us, recompute_us, optimizer_us, copy_us;
    double recompute_share;    /* recompute / (backward + recompute) */
    double recompute_overhead; /* recompute / (forward + backward) */
    int n_devices;
    struct ps_sim_device *dev;
    double *start_us, *end_us; /* per node; -1 for nodes that never run */
    double *issue_us;          /* per node: when the host issued it (its launch starts); -1 */
    double launch_us;          /* the launch overhead h of the rules above */
    uint32_t cp_n;
    uint32_t *cp;              /* critical path, first to last */
    double cp_us;
};

/* The order compiled for repeated timing passes: everything indexed by order position, so a
 * pass reads its predecessors' times from nearby, already written slots. ps_sim_run compiles
 * and runs one pass; sweeps over costs (calibration, what-ifs) compile once and step often. */
struct ps_sim_prog {
    uint32_t n;          /* order entries */
    uint32_t *node;      /* node of each position */
    uint32_t *tprev;     /* previous position of the same host thread, UINT32_MAX when none */
    uint32_t *sprev;     /* previous position of the same stream, UINT32_MAX when none */
    uint8_t *launch;     /* 1 when the node has a stream (pays the launch overhead) */
    uint32_t *pred_off;  /* predecessors of position k: pred[pred_off[k] .. pred_off[k+1]) */
    uint32_t *pred;      /* position | PS_SIM_HOST_EDGE: orders issue only (PHONY, HOST, most
                            DATA edges); | PS_SIM_DEVICE_WAIT: bounds the start only (waits.h) */
};
#define PS_SIM_HOST_EDGE 0x80000000u
#define PS_SIM_DEVICE_WAIT 0x40000000u

int ps_sim_compile(const struct ps_graph *g, const struct ps_order *order,
                   struct ps_sim_prog *p, struct ps_diag *diag);
void ps_sim_prog_finish(struct ps_sim_prog *p); /* accepts a zeroed struct */
/* One timing pass (sim.h's rules). issue/start/end are per position; why (optional, per
 * position) gets the position that bound each start, UINT32_MAX when none. Returns the end of
 * the last node to finish. */
double ps_sim_step(const struct ps_sim_prog *p, const double *cost_us, double launch_us,
                   double *issue, double *start, double *end, uint32_t *why);

/* Simulates. cost_us[v] is the device time of node v. Returns 0, -EINVAL when the order is not
 * an execution order (diag names the pair), or -ENOMEM. */
int ps_sim_run(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
               const struct ps_sim_opts *opts, struct ps_sim *out, struct ps_diag *diag);
void ps_sim_finish(struct ps_sim *s); /* accepts a zeroed struct */

#endif
