/* cost: how long a graph node takes, for the simulator and the critical path.
 *
 * Roofline by default: a compute node takes max(flops / device flops, bytes / memory bandwidth);
 * a copy takes bytes / link bandwidth plus the link latency; host-only nodes (fork, join) and
 * waits take no time. The FLOPs come from model.c: a backward costs about twice its forward for
 * linear and conv (bwd_flops = 2 fwd_flops: input gradient + weight gradient, each as much as
 * the forward), a recompute is a forward, and with a split backward (zb-h1) the weight-gradient
 * half of linear/conv layers goes to Wg and the rest stays in B (plan.c). An optimizer step
 * (SGD) is 2 FLOPs and 12 bytes per parameter of its partition.
 *
 * ps_cost_roofline_us includes the launch overhead (the static critical path of `check` uses
 * it); ps_cost_fill gives device time only, because the simulator charges the launch overhead on
 * the host (sim.h), once per node.
 *
 * Measured per-layer costs (spec "costs", format in sim/COSTS.md) replace the roofline for the
 * nodes they cover: F, B, R, Wg from per-layer forward/backward times, copies from the measured
 * link, the optimizer from per-partition times.
 */
#ifndef PS_COST_H
#define PS_COST_H

#include <stdbool.h>

#include "src/diag.h"
#include "src/graph.h"

struct ps_cost_layer {
    double forward_us, backward_us;
    double wgrad_us; /* part of backward_us that is the weight gradient; < 0 = not measured */
    /* time per task that does not scale with the micro-batch size (launch, allocation, loop
       set-up), added once to F/R and once to B of the layer's partition; 0 = none */
    double forward_fixed_us, backward_fixed_us;
    /* recompute (R) time when it differs from the forward's (the cpu executor's R skips a
       partition's last layer when nothing reads its output); recompute_set false = forward's */
    bool recompute_set;
    double recompute_us, recompute_fixed_us;
    /* a checkpointed forward's time (F without grad: torchgpipe's checkpointed micro-batches
       keep nothing and run no autograd bookkeeping) when it differs from the forward's;
       checkpointed_set false = forward's */
    bool checkpointed_set;
    double checkpointed_us, checkpointed_fixed_us;
    /* time x scale^2 added to every F, R (forward_sq_us) and B (backward_sq_us) of the layer's
       partition: a per-sample time that grows with the micro-batch size; 0 = none */
    double forward_sq_us, backward_sq_us;
    /* B time per sample of a micro-batch that was recomputed (R runs right before its B, so B
       finds its activations in the CPU's cache; a stored micro-batch's were written long
       before) when it differs from backward_us; backward_recomputed_set false = backward's */
    bool backward_recomputed_set;
    double backward_recomputed_us;
    /* time per sample added to the first B of the layer's partition in each step (the order's
       first): its gradients go to memory no task has touched since the previous step, where
       every later B reuses the buffers the B before it freed, still in the CPU's cache; 0 =
       none */
    double first_backward_us;
};

struct ps_costs {
    bool per_sample;           /* "unit": "sample"; else "micro_batch" */
    double micro_batch;        /* samples the per-micro-batch times were measured with */
    int n_layers;
    struct ps_cost_layer *layers;
    double copy_bandwidth;     /* bytes/s; <= 0 = spec hardware.link */
    double copy_latency_us;    /* < 0 = spec */
    double launch_overhead_us; /* < 0 = spec */
    /* the largest scale the x scale^2 terms were fitted at: above it they grow as scale x
       sq_max_scale (the per-sample time stays at its value there); <= 0 = no limit */
    double sq_max_scale;
    int n_optimizer;
    double *optimizer_us;      /* per partition, NULL = roofline */
};

/* Duration of node v in microseconds under the spec's hardware model (launch included). */
double ps_cost_roofline_us(const struct ps_graph *g, uint32_t v);
/* Fills cost[v] for every node (roofline, launch included). Returns 0 or -ENOMEM when cost is
 * NULL. */
int ps_cost_fill_roofline(const struct ps_graph *g, double *cost);

/* Per (micro-batch i, partition j), at [i * g->n + j]: 1 when the graph recomputes micro-batch
 * i on partition j (it has that R node), else 0. Caller frees; NULL: no memory. */
uint8_t *ps_cost_recomputed(const struct ps_graph *g);

/* Per node: 1 when it is the first B of its partition in `order`, else 0. Caller frees; NULL:
 * no memory. */
uint8_t *ps_cost_first_backward(const struct ps_graph *g, const struct ps_order *order);
/* Adds the costs' first_backward_us (summed over a partition's layers) x scale to the first B
 * of each partition in `order` (ps_cost_fill costs nodes without an order). 0 or -ENOMEM
 * (diag). */
int ps_cost_add_first_backward(const struct ps_graph *g, const struct ps_order *order,
                               const struct ps_costs *c, double *cost, struct ps_diag *diag);

/* Device time of every node for the simulator: measured costs where `c` (may be NULL) covers
 * the node, roofline otherwise; no launch overhead. Returns 0 or -EINVAL (diag) when `c` does not
 * fit the model (layer count). */
int ps_cost_fill(const struct ps_graph *g, const struct ps_costs *c, double *cost,
                 struct ps_diag *diag);
/* The launch overhead the simulator charges per node: the costs file's, else the spec's. */
double ps_cost_launch_us(const struct ps_graph *g, const struct ps_costs *c);

int ps_costs_load(const char *path, struct ps_costs **out, struct ps_diag *diag);
/* The largest duration a costs file may give (us): 1000 s per task, so that a makespan summed
 * over millions of tasks stays finite. */
#define PS_COSTS_MAX_US 1e9

int ps_costs_parse(const char *json, const char *name, struct ps_costs **out,
                   struct ps_diag *diag);
void ps_costs_destroy(struct ps_costs *c); /* accepts NULL */

#endif
