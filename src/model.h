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

struct ps_partition_info {
    int first, count;            /* layers [first, first+count) */
    double fwd_flops, fwd_bytes, bwd_flops, bwd_bytes; /* per sample */
    int64_t params;
    int64_t in_numel, out_numel; /* boundary tensors, per sample */
    int64_t saved_bytes;         /* per sample, all layers of the partition */
    int autograd_nodes;
    double fwd_param_bytes, bwd_param_bytes; /* per call (added by model.c) */
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
void ps_model_destroy(struct ps_model *m); /* accepts NULL */

#endif
