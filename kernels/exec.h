/* exec: runs the task graph for real and reports what happened (the README's Layout).
 *
 * Two parts:
 *   state (state.c)     the model's parameters and buffers, by layer, in PyTorch's state_dict
 *                       naming: loaded from a folder of .npy files or initialised from a seed
 *                       like PyTorch's defaults, and saved back the same way.
 *   executor (exec_cpu.c)  `train.steps` SGD steps; each step runs every node of the graph in the
 *                       order of a struct ps_order (the autograd engine's order by default):
 *                       F(i,j) partition forwards, the loss on the gathered output, R(i,j)
 *                       recomputes and B(i,j) backwards, then p -= lr * grad for every parameter.
 *
 * The executor reproduces torchgpipe's numerics (SEMANTICS.md sections 5 and 7): a checkpointed
 * F runs without recording (its activations are dropped, only its input is kept) and R re-runs it
 * with grad on, with the same dropout mask, just before B; BatchNorm running statistics change
 * according to g->var.batchnorm, and every change is logged (struct ps_exec_bn_update) in the order it
 * happened. The measured timeline (one record per executed F/B/R node, CLOCK_MONOTONIC, of the
 * LAST step, relative to that step's start) uses the simulator's record format.
 *
 * Seeded initialisation (own RNG, PyTorch's distributions, reproducible across machines):
 *   linear / conv2d weight and bias   uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
 *                                     (= kaiming_uniform_(a=sqrt(5)) for the weight), fan_in =
 *                                     in features, or c_in * k * k
 *   batchnorm                         weight 1, bias 0, running_mean 0, running_var 1, nbt 0
 * The uniforms come from a splitmix64 counter generator keyed by (seed, layer, tensor, element).
 */
#ifndef PS_EXEC_H
#define PS_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/trace.h"

/* ---- state: parameters and buffers (state.c) ----------------------------------------------- */

/* One layer's tensors; NULL when the layer has none. Gradients have the parameters' shapes. */
struct ps_layer_state {
    float *weight, *bias;           /* linear [out,in]/[out], conv [out,cin,k,k]/[out], BN [C]/[C] */
    float *dweight, *dbias;
    int64_t n_weight, n_bias;       /* element counts */
    float *running_mean, *running_var; /* BN [C] */
    int64_t num_batches_tracked;       /* BN */
    int64_t channels;                  /* BN: C */
    /* DeferredBatchNorm tracking (persists across steps, as torchgpipe's module attributes) */
    double *sum, *sum_sq;
    int64_t count;                     /* elements per channel tracked so far */
    int tracked;                       /* micro-batches tracked since the last commit */
};

struct ps_state {
    int n_layers;
    struct ps_layer_state *layers;
};

/* Loads spec->weights when set (every tensor of the state_dict must be there, with the right
 * shape and dtype: float for parameters and running stats, integer for num_batches_tracked),
 * else initialises from `seed` as described above. Errors name the file. Returns 0 or -errno. */
int ps_state_init(struct ps_state *st, const struct ps_spec *spec, const struct ps_model *model,
                  uint64_t seed, struct ps_diag *d);
/* Writes every tensor as DIR/<layer>.<name>.npy (float32; num_batches_tracked int64 scalar).
 * DIR must exist; the CLI passes the temporary twin of --save-state DIR (viz/out.c). */
int ps_state_save(const struct ps_state *st, const struct ps_spec *spec,
                  const struct ps_model *model, const char *dir, struct ps_diag *d);
void ps_state_zero_grad(struct ps_state *st);
void ps_state_finish(struct ps_state *st); /* accepts a zeroed struct */

/* ---- executor (exec_cpu.c) ------------------------------------------------------------------ */

enum ps_backend { PS_BACKEND_CPU, PS_BACKEND_CUDA };

enum ps_exec_bn_phase {
    PS_EXEC_BN_FORWARD,   /* plain / grad-only: a training forward updated the running stats */
    PS_EXEC_BN_RECOMPUTE, /* plain / grad-only: the recompute R(i,j) updated them */
    PS_EXEC_BN_COMMIT,    /* deferred: the pooled statistics were committed */
};

/* One change of one BN layer's running statistics. mean/var are the statistics fed into the
 * EMA (plain: micro-batch mean and UNBIASED variance; commit: pooled mean and BIASED variance),
 * factor is the EMA factor a, count the elements per channel they were computed from. */
struct ps_exec_bn_update {
    int32_t layer, step, mb;
    uint8_t phase;     /* enum ps_exec_bn_phase */
    uint32_t node;     /* graph node that ran it (F or R) */
    int64_t count;
    double factor;
    float *mean, *var; /* channels each, owned by the result */
};

struct ps_exec_opts {
    enum ps_backend backend;
    int steps;       /* 0 = spec->steps */
    bool trace;      /* record the timeline of the last step */
    bool virtual_devices; /* cuda: every graph device on GPU 0 with its own stream set */
    /* Added for drift (issue [cpu-execution]); zero = the behaviour above. Both backends. */
    int64_t train_samples; /* > 0: steps wrap over the first train_samples samples only, so
                              the rest can be held out for ps_exec_eval */
    bool forward_only;     /* run only the forward pass (F tasks and the loss) of each step:
                              no recompute, no backward, no SGD step */
    /* Added for issue [executor-scale]; cpu only. */
    bool device_threads;   /* one worker thread per device (torchgpipe's), synchronised by
                              DATA edges only; false = the serial mode. Same results, bit for
                              bit; only the timeline differs */
    /* Progress (cpu backend): called after every task with the work done so far and the work
     * of the whole run (all steps), each task weighed max(FLOPs, 5 x bytes) + 1; returning false
     * stops the run with -ECANCELED. NULL = none. diagnose uses it for its time budget. */
    bool (*progress)(void *ctx, double done, double total);
    void *progress_ctx;
    /* cpu: threads one kernel call may use (0: ps_cpu_threads(), shared among the device
       workers). Kernels split a call across threads only above a work threshold, a step in a
       task's cost against its micro-batch size; 1 keeps every task on one thread. */
    int kernel_threads;
};

/* Measured activation memory (cpu; exec_cpu.c M1-M4): bytes of activations and saved tensors
 * alive per device. */
struct ps_exec_mem_point {
    double t_us;   /* from the start of the last step */
    int64_t bytes; /* alive on `device` from t_us on */
    int32_t device;
};

struct ps_exec_memory {
    int n_devices;             /* 0 when not measured (cuda) */
    int64_t *peak_bytes;       /* per device: the most alive at once, over all steps */
    double *peak_t_us;         /* when, from the start of its step */
    int32_t *peak_step;
    uint32_t n_points;
    struct ps_exec_mem_point *points; /* every change in the last step, in time order */
};

struct ps_exec_result {
    int steps;
    double *loss;        /* per step */
    double *step_us;     /* wall time per step */
    double total_us;
    struct ps_state state; /* after the last step */
    uint32_t n_bn, cap_bn;
    struct ps_exec_bn_update *bn;
    struct ps_trace trace; /* PS_TRACE_CPU */
    struct ps_exec_memory mem;
};

void ps_exec_opts_init(struct ps_exec_opts *o); /* cpu, spec steps, trace on, serial */

/* Runs the training. `order` NULL = the engine order of g (computed here). The data is loaded
 * from the spec (data.h). Returns 0, -ENOTSUP for the cuda backend when it is not built, or a
 * negative errno with diag (bad weights or data name the file). res is valid only on success. */
int ps_exec_run(const struct ps_graph *g, const struct ps_order *order,
                const struct ps_exec_opts *o, struct ps_exec_result *res, struct ps_diag *d);
void ps_exec_result_finish(struct ps_exec_result *res); /* accepts a zeroed struct */
/* Host bytes a run of `steps` steps with m micro-batches needs at most (state, activations, BN
 * update log, synthetic labels); ps_exec_run refuses with -E2BIG above memlimit.h's limit before
 * allocating. */
double ps_exec_estimate_bytes(const struct ps_spec *spec, const struct ps_model *model, int m,
                              int steps);

/* Evaluation (exec_eval.c): forward only, eval mode, as PyTorch's model.eval() under no_grad:
 * BatchNorm normalises with the running statistics (never updates them), dropout is the
 * identity. x [n, in_numel] -> out [n, out_numel], in blocks, no pipeline (eval uses no
 * micro-batches in torchgpipe either). Returns 0 or a negative errno with diag. */
int ps_exec_eval(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_state *st, const float *x, int64_t n, float *out,
                 struct ps_diag *d);

/* Whether a backend can run here; on false, why (diag) — e.g. "not built: no nvcc at build time". */
bool ps_exec_backend_available(enum ps_backend b, struct ps_diag *d);
const char *ps_exec_bn_phase_name(enum ps_exec_bn_phase p);

#endif
