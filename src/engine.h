/* engine: the order in which PyTorch's autograd engine runs the graph (SEMANTICS.md section 4).
 *
 * Forward order is host order: the tasks of each device's worker thread in creation order.
 * Backward order is derived, never assumed: a node is ready when every gradient edge into it
 * (from nodes reachable from the root) has delivered, each device's engine thread pops the ready
 * node with the highest (reentrant depth, sequence number), and a node standing for a chain of
 * autograd nodes (G3 in graph.h) runs its chain step by step, so that a ready node of another
 * thread's counter can cut in, as it does in PyTorch. Several engine threads run in lockstep:
 * in each step every thread with work runs one autograd node, and what it makes ready becomes
 * visible in the next step.
 */
#ifndef PS_ENGINE_H
#define PS_ENGINE_H

#include <stdint.h>

#include "src/diag.h"
#include "src/graph.h"

/* The autograd nodes one partition forward records, in creation order (PyTorch 1.13): linear =
 * TBackward0 [weight] + AddmmBackward0 [bias, input, T] (MmBackward0 [input, T] without bias),
 * conv2d = ConvolutionBackward0 [input, weight, bias], batchnorm = NativeBatchNormBackward0
 * [input, weight, bias], relu/maxpool2d/dropout/flatten(of [C,H,W]) one node [input], each only
 * when an input requires grad. next[] lists a node's next_functions in order: the previous node
 * of the program, the partition's input, or a parameter's AccumulateGrad. */
enum ps_ref_kind { PS_REF_PREV, PS_REF_INPUT, PS_REF_PARAM };
struct ps_prog_ref {
    uint8_t kind;  /* enum ps_ref_kind */
    uint16_t arg;  /* PREV: node index; PARAM: parameter index within the partition */
};
struct ps_prog_node {
    uint8_t n_next;
    struct ps_prog_ref next[3];
};
#define PS_PROG_MAX 4096
/* Fills prog (capacity PS_PROG_MAX) for partition `part` whose input requires grad or not;
 * returns the node count (0 when nothing is recorded) and the parameter count in *n_params. */
int ps_engine_program(const struct ps_spec *spec, const struct ps_model *model, int part,
                      bool input_requires_grad, struct ps_prog_node *prog, int *n_params);

/* Derives the execution order of a graph with a backward root (GPipe's; a graph without one gets
 * its forward host order only: order any graph with ps_schedule_order, schedule.h). Returns 0, or
 * -EDEADLK when backward gets stuck (diag names the waiting nodes), or -ENOMEM. */
int ps_engine_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag);

#endif
