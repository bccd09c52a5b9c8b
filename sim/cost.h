/* cost: how long a graph node takes, for the simulator and the critical path.
 *
 * Roofline by default: a compute node takes max(flops / device flops, bytes / memory bandwidth)
 * plus the launch overhead; a copy takes bytes / link bandwidth plus the link latency; host-only
 * nodes (fork, join) and waits take no time. Measured per-layer costs (spec "costs") replace
 * the roofline for the nodes they cover.
 */
#ifndef PS_COST_H
#define PS_COST_H

#include "graph.h"

/* Duration of node v in microseconds under the spec's hardware model. */
double ps_cost_roofline_us(const struct ps_graph *g, uint32_t v);
/* Fills cost[v] for every node (roofline). Returns 0 or -ENOMEM when cost is NULL. */
int ps_cost_fill_roofline(const struct ps_graph *g, double *cost);

#endif
