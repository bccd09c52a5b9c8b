/* exec_eval: the model in evaluation mode (PyTorch's model.eval() under torch.no_grad()).
 *
 * No pipeline and no micro-batches: torchgpipe runs evaluation without checkpointing and its
 * BatchNorm then normalises with the running statistics, so splitting changes nothing. Every
 * layer runs on a block of up to EVAL_BLOCK samples, ping-ponging between two buffers sized for
 * the largest activation.
 *
 * Invariants:
 *   V1. The state is read only: running statistics and num_batches_tracked never change.
 *   V2. BatchNorm uses (running_mean, running_var + eps); dropout is the identity.
 */
#include "kernels/exec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define EVAL_BLOCK 256

static int eval_layer(const struct ps_layer *ly, const struct ps_layer_info *li,
                      const struct ps_layer_state *ls, const float *x, float *y, size_t n,
                      struct ps_diag *d)
{
    switch (ly->op) {
    case PS_OP_LINEAR:
        if (ps_cpu_linear_forward(x, ls->weight, ls->bias, y, n, (size_t)li->in_numel,
                                  (size_t)li->out_numel))
            return ps_diag_set(d, -ENOMEM, "eval", "out of memory");
        return 0;
    case PS_OP_CONV2D: {
        struct ps_conv2d_shape s = {
            .n = n, .c_in = (size_t)li->in[0], .h = (size_t)li->in[1], .w = (size_t)li->in[2],
            .c_out = (size_t)ly->out, .kh = (size_t)ly->kernel, .kw = (size_t)ly->kernel,
            .stride = (size_t)(ly->stride > 0 ? ly->stride : 1), .padding = (size_t)ly->padding};
        return ps_cpu_conv2d_forward(&s, x, ls->weight, ls->bias, y, d);
    }
    case PS_OP_MAXPOOL2D: {
        struct ps_pool2d_shape s = {
            .n = n, .c = (size_t)li->in[0], .h = (size_t)li->in[1], .w = (size_t)li->in[2],
            .kernel = (size_t)ly->kernel,
            .stride = (size_t)(ly->stride > 0 ? ly->stride : ly->kernel),
            .padding = (size_t)ly->padding};
        return ps_cpu_maxpool2d_forward(&s, x, y, NULL, d);
    }
    case PS_OP_RELU: ps_cpu_relu_forward(x, y, n * (size_t)li->in_numel); return 0;
    case PS_OP_FLATTEN:
    case PS_OP_DROPOUT: memcpy(y, x, n * (size_t)li->in_numel * sizeof(float)); return 0;
    case PS_OP_BATCHNORM: {
        struct ps_bn bn = {.channels = (size_t)ls->channels, .eps = (float)ly->eps,
                           .momentum = (float)ly->momentum, .cumulative = ly->momentum_null,
                           .weight = ls->weight, .bias = ls->bias,
                           .running_mean = ls->running_mean, .running_var = ls->running_var,
                           .num_batches_tracked = ls->num_batches_tracked};
        return ps_cpu_bn_forward(&bn, PS_BN_EVAL, x, y, n,
                                 (size_t)(li->in_numel / ls->channels), NULL, NULL, d);
    }
    case PS_OP__COUNT: break;
    }
    return ps_diag_set(d, -EINVAL, "eval", "unknown op");
}

int ps_exec_eval(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_state *st, const float *x, int64_t n, float *out,
                 struct ps_diag *d)
{
    if (!spec || !model || !st || st->n_layers != spec->n_layers || n < 0)
        return ps_diag_set(d, -EINVAL, "eval", "no model state to evaluate");
    int64_t maxc = model->out_numel;
    for (int l = 0; l < model->n_layers; l++)
        if (model->layers[l].in_numel > maxc) maxc = model->layers[l].in_numel;
    float *buf[2];
    buf[0] = malloc((size_t)(maxc * EVAL_BLOCK) * sizeof(float));
    buf[1] = malloc((size_t)(maxc * EVAL_BLOCK) * sizeof(float));
    int rc = 0;
    if (!buf[0] || !buf[1]) rc = ps_diag_set(d, -ENOMEM, "eval", "out of memory");
    int64_t in = model->layers[0].in_numel;
    for (int64_t s0 = 0; s0 < n && !rc; s0 += EVAL_BLOCK) {
        size_t b = (size_t)(n - s0 < EVAL_BLOCK ? n - s0 : EVAL_BLOCK);
        memcpy(buf[0], x + s0 * in, b * (size_t)in * sizeof(float));
        int cur = 0;
        for (int l = 0; l < spec->n_layers && !rc; l++, cur ^= 1)
            rc = eval_layer(&spec->layers[l], &model->layers[l], &st->layers[l], buf[cur],
                            buf[cur ^ 1], b, d);
        if (!rc)
            memcpy(out + s0 * model->out_numel, buf[cur],
                   b * (size_t)model->out_numel * sizeof(float));
    }
    free(buf[0]);
    free(buf[1]);
    return rc;
}
