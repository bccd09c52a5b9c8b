/* model: what the layers of a spec compute, without running them.
 *
 * For every layer: the per-sample output shape, parameter count, forward FLOPs and bytes moved
 * per sample, activation bytes kept for backward per sample, and the number of autograd nodes
 * that PyTorch 1.13 records for it (the engine model needs it: backward sequence numbers are
 * creation order). Partitions are contiguous layer ranges from `balance`.
 *
 * Shape rules (PyTorch's): linear needs a flat [F] input; conv2d and maxpool2d need [C,H,W];
 * batchnorm takes either; flatten turns [C,H,W] into [C*H*W]; output sizes follow
 * floor((H + 2p - k) / s) + 1 and must be >= 1.
 */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/spec.h"

struct ps_layer_info {
    int n_in_dims, n_out_dims;
    int64_t in[PS_SPEC_MAX_DIMS], out[PS_SPEC_MAX_DIMS];
    int64_t in_numel, out_numel; /* per sample */
    int64_t params;              /* trainable parameter count */
    int64_t buffers;             /* running stats etc. */
    double fwd_flops;            /* per sample */
    double fwd_bytes;            /* per sample, fp32: reads + writes of activations (weights: below) */
    double bwd_flops;            /* per sample (input grad + weight grad) */
    double bwd_bytes;
    int64_t saved_bytes;         /* per sample: what autograd keeps for backward */
    int autograd_nodes;          /* nodes PyTorch 1.13 creates in a forward with grad */
    /* Added by model.c: fp32 bytes of weights (and BN running stats) moved once per call,
     * independent of the number of samples; fwd_bytes/bwd_bytes above count activations only.
     * A call on b samples moves b * fwd_bytes + fwd_param_bytes. */
    double fwd_param_bytes, bwd_param_bytes;
    int64_t channels;            /* C of [C,H,W] or F of [F] at the input (BN: its features) */
    bool in_requires_grad;       /* some tensor feeding this layer requires grad */
};

/* What a layer's backward keeps from a forward with grad (model.c "Activation memory"). */
struct ps_keeps {
    bool input;     /* its input tensor */
    bool output;    /* its output tensor */
    int64_t extra;  /* bytes per sample of other saved tensors: pool indices, dropout mask */
};

/* One task's effect on its device's activation bytes, per sample. */
struct ps_task_mem {
    int64_t net;    /* change when the task ends (negative when it frees its input) */
    int64_t peak;   /* high-water above the bytes at its start, reached while it runs (>= 0) */
};

struct ps_partition_info {
    int first, count;            /* layers [first, first+count) */
    double fwd_flops, fwd_bytes, bwd_flops, bwd_bytes; /* per sample */
    int64_t params;
    int64_t in_numel, out_numel; /* boundary tensors, per sample */
    int64_t saved_bytes;         /* per sample, all layers of the partition */
    int autograd_nodes;
    double fwd_param_bytes, bwd_param_bytes; /* per call (added by model.c) */
    /* Activation memory of its tasks, per sample (model.c "Activation memory"): */
    int64_t in_bytes;            /* its input, on its device from the previous partition's F on
                                    (0 for the first partition: the mini-batch slice counts only
                                    once a task keeps it) */
    int64_t out_bytes;           /* its output, put on the next partition's device by F (0 for the
                                    last partition: the loss consumes it inside F) */
    struct ps_task_mem fwd;      /* F with grad (not checkpointed) */
    struct ps_task_mem fwd_ckpt; /* checkpointed F (no grad) */
    struct ps_task_mem rec;      /* R: the recompute of a checkpointed F */
};

struct ps_model {
    const struct ps_spec *spec; /* not owned */
    int n_layers;
    struct ps_layer_info *layers;
    int n_partitions;
    struct ps_partition_info *parts;
    int64_t total_params;
    int64_t out_numel;          /* per-sample model output */
};

int ps_model_build(const struct ps_spec *spec, struct ps_model **out, struct ps_diag *diag);

/* What layer l keeps for its backward (the one table the executor and the model share). */
void ps_layer_keeps(const struct ps_layer *l, const struct ps_layer_info *li, struct ps_keeps *k);

/* Whether a forward with grad keeps buffer b (layer b's input, the output of layer b-1) of the
 * partition [f, e) alive until the backward: layer b keeps its input, layer b-1 inside the
 * partition keeps its output, or b is the input of the partition's last layer and that layer keeps
 * its output (which leaves the device: its input, the same size, stands for it). */
bool ps_model_keeps_buffer(const struct ps_spec *s, const struct ps_model *m, int f, int e, int b);

/* Whether layer l is a flatten whose output is a view of its input in the partition [f, e), as
 * PyTorch's flatten is: not the model's first layer (the mini-batch slice is not an activation
 * until a task keeps it) and not the partition's last (its output leaves for the next device or
 * the loss: a copy). */
bool ps_flatten_view(const struct ps_spec *s, int f, int e, int l);

/* Whether the storage of buffer b stays once layer b has read it: a forward with grad (grad) keeps
 * it when it or a buffer it is a view of is kept (ps_model_keeps_buffer); a checkpointed forward
 * keeps only the partition's input. */
bool ps_model_keeps_storage(const struct ps_spec *s, const struct ps_model *m, int f, int e, int b,
                            bool grad);

/* Bytes per sample that a forward with grad keeps for layer l in any partition: its input when
 * it keeps it, and its extra saved tensors. Summed over layers, a lower bound of what a partition
 * keeps per micro-batch sample (a relu's output is left out: the next layer may keep the same
 * tensor, and it is then counted there). */
int64_t ps_layer_kept_bytes(const struct ps_spec *s, const struct ps_model *m, int l);

/* Whether a recompute can skip the partition's last layer l: no side effect (running statistics,
 * pool indices, dropout mask) and no backward reads its output. */
bool ps_recompute_skips(enum ps_op op);
void ps_model_destroy(struct ps_model *m); /* accepts NULL */

#endif
