/* bnorder: the sequence of BatchNorm running-stat updates an execution implies
 * (SEMANTICS.md section 7), per BN layer, in execution order.
 *
 * A BN layer of partition j is called by every F(i,j) and every R(i,j). Which calls update
 * the running statistics depends on the policy:
 *   plain      every call, forward and recompute                       (GPipe except_last: 2m-1)
 *   deferred   one pooled commit, at the forward of micro-batch chunks-1 (none when the real m
 *              is smaller than chunks: torchgpipe then never commits)
 *   grad-only  only calls with grad enabled: the recompute of a checkpointed micro-batch, the
 *              forward of the others
 * Execution order is the simulated start time when given (ties by order position), else the
 * position in the order. The drift analysis replays these sequences on real statistics.
 */
#ifndef PS_BNORDER_H
#define PS_BNORDER_H

#include <stdbool.h>
#include <stdint.h>

#include "src/engine.h"
#include "src/graph.h"
#include "src/spec.h"

enum ps_bn_phase { PS_BN_FORWARD, PS_BN_RECOMPUTE };

struct ps_bn_update {
    int32_t mb;
    uint8_t phase;   /* enum ps_bn_phase */
    bool pooled;     /* deferred commit of the pooled statistics of all micro-batches */
    uint32_t node;   /* F(i,j) or R(i,j) */
    double t_us;     /* simulated start, or -1 */
};

struct ps_bn_layer_updates {
    int layer;       /* index in model.layers */
    int part;
    uint32_t n;
    struct ps_bn_update *u;
};

struct ps_bn_order {
    enum ps_bn_policy policy;
    int n_layers;    /* BN layers */
    struct ps_bn_layer_updates *layers;
};

/* start_us (may be NULL): per-node simulated start (struct ps_sim.start_us). Returns 0 or
 * -ENOMEM. */
int ps_bn_order_build(const struct ps_graph *g, const struct ps_order *o, const double *start_us,
                      enum ps_bn_policy policy, struct ps_bn_order *out);
void ps_bn_order_finish(struct ps_bn_order *b); /* accepts a zeroed struct */
const char *ps_bn_phase_name(enum ps_bn_phase p); /* "forward" | "recompute" */

#endif
