/* exec_priv: what the cpu and the cuda executors share (kernels/exec_common.c); private to the
 * executors, never included outside kernels/.
 *
 * Both executors run the same task graph in the same ps_order with the same numerics, so
 * everything that decides WHAT runs lives here once: the run's setup (order, steps, state, data,
 * the check that the order runs every task), the layer shapes, the dropout stream of a
 * (step, layer, micro-batch), the BatchNorm mode of a forward under each policy, the BN update
 * log, the E1 check that a backward has live activations, and the loss check after a step. Only
 * HOW it runs (host arrays and kernels/cpu, or device buffers, streams and kernels/cuda) stays in
 * exec_cpu.c and exec_cuda.c.
 */
#ifndef PS_EXEC_PRIV_H
#define PS_EXEC_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kernels/cpu/kernels.h"
#include "src/data.h"
#include "kernels/exec.h"

/* Microseconds since t0 (CLOCK_MONOTONIC). */
double ps_exec_now_us(const struct timespec *t0);

/* Kernel shapes of layer l for n samples. */
void ps_exec_pool_shape(struct ps_pool2d_shape *s, const struct ps_layer *l,
                        const struct ps_layer_info *li, size_t n);
void ps_exec_conv_shape(struct ps_conv2d_shape *s, const struct ps_layer *l,
                        const struct ps_layer_info *li, size_t n);

/* Dropout (E3): the generator's seed and the stream of (step, layer l, micro-batch i), so a
 * recompute redraws the forward's mask. */
uint64_t ps_exec_dropout_seed(const struct ps_spec *spec);
uint64_t ps_exec_dropout_offset(int step, int L, int m, int l, int i);

/* E2: the BN mode of a forward: PS_BN_TRAIN for plain, and for grad-only with grad on;
 * PS_BN_TRAIN_NO_TRACK otherwise (deferred tracks through accumulate/commit). */
enum ps_bn_mode ps_exec_bn_mode(enum ps_bn_policy policy, bool grad);

/* Appends one entry to the BN update log with room for C floats of mean and var (left for the
 * caller to fill) and returns it in *out. -ENOMEM with diag. */
int ps_exec_bn_log(struct ps_exec_result *r, int layer, int step, int mb,
                   enum ps_exec_bn_phase phase, uint32_t node, int64_t count, double factor,
                   size_t C, struct ps_exec_bn_update **out, struct ps_diag *d);

/* E1: B(i,j) (node) refuses to run unless layers [f, f+c) of its micro-batch are live
 * (live_row = the micro-batch's row of L flags). -EINVAL with diag. */
int ps_exec_check_live(const struct ps_graph *g, uint32_t node, const bool *live_row, int f,
                       int c, struct ps_diag *d);

/* What a run needs before its first step, and gives back after its last. */
struct ps_exec_setup {
    const struct ps_order *order; /* the caller's, or `own` */
    struct ps_order own;
    int steps;
    struct ps_data data;
};
/* Checks spec and model, computes the engine order when `order` is NULL, sizes res (steps,
 * loss, step_us, an empty trace of `source`), initialises the state, loads the data (honouring
 * o->train_samples), and checks that the order runs every F and (unless o->forward_only) every
 * B task once. Call ps_exec_setup_finish whatever it returns. */
int ps_exec_setup(struct ps_exec_setup *su, const struct ps_graph *g,
                  const struct ps_order *order, const struct ps_exec_opts *o,
                  enum ps_trace_source source, struct ps_exec_result *res, struct ps_diag *d);
void ps_exec_setup_finish(struct ps_exec_setup *su);

/* After step s: -ERANGE with diag and hint when its loss is not finite. */
int ps_exec_check_loss(const struct ps_exec_result *res, int s, const struct ps_spec *spec,
                       struct ps_diag *d);

#endif
