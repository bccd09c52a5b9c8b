/* model: what each layer of a spec computes, in shapes, parameters, FLOPs, bytes and autograd nodes.
 *
 * ps_model_build walks the layers in order, carrying the per-sample shape ([F] or [C,H,W]) and
 * whether the running tensor requires grad, and fills one ps_layer_info per layer, then sums the
 * layers of each partition (contiguous ranges from spec->balance). Everything is per sample except
 * params/buffers and the *_param_bytes fields, which are per call (one micro-batch).
 *
 * Shape rules are PyTorch's (groups=1, dilation=1, ceil_mode=False):
 *     linear     [F] -> [out]                  conv2d    [C,H,W] -> [out,Ho,Wo]
 *     batchnorm  [F] or [C,H,W], unchanged     maxpool2d [C,H,W] -> [C,Ho,Wo]
 *     flatten    [C,H,W] -> [C*H*W], [F] -> [F] relu, dropout: unchanged
 *     Ho = floor((H + 2*padding - kernel) / stride) + 1, must be >= 1.
 *
 * Cost factors (fp32, per sample; n = elements of the layer's input, o = of its output):
 *     op         forward FLOPs              backward FLOPs       fwd bytes        bwd bytes
 *     linear     2*in*out (+out bias)       2 x forward          4(n+o)           4(o+2n)
 *     conv2d     2*Cin*k*k*Cout*Ho*Wo (+o)  2 x forward          4(n+o)           4(o+2n)
 *     batchnorm  8 per element              2 x forward          4(2n+o)          4(2o+n)
 *     relu       1 per element              1 x forward          4(n+o)           4(2o+n)
 *     dropout    1 per element (p>0)        1 x forward          4(n+o)+n mask    4(o+n)+n
 *     maxpool2d  k*k per output element     n + o (zero + add)   4n+12o (indices) 4n+12o
 *     flatten    0 (a view)                 0                    0                0
 * Weights move once per call: forward reads params (+ BN reads and writes its running stats),
 * backward reads the weights and writes their gradients (2x params).
 *
 * Saved for backward (per sample), as autograd keeps it: linear, conv2d, batchnorm keep their
 * input; relu keeps its output; dropout a 1-byte mask (CUDA's native_dropout; the CPU path keeps
 * a float mask); maxpool2d its input and int64 indices per output; flatten nothing. saved_bytes
 * counts tensors per layer that keeps them, so a relu output kept again as the next linear's input
 * counts twice, and a layer that creates no autograd node keeps nothing; the activation memory of
 * tasks (below, "Activation memory") counts each kept tensor once.
 *
 * Autograd nodes come from one table (autograd_nodes() below). A node exists only when some input
 * of the op requires grad: the model input does not, and the running tensor does from the first
 * layer with parameters on. So a relu, dropout, maxpool2d or flatten before any parameterised
 * layer creates no node, exactly as in PyTorch.
 */
#include "src/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_NUMEL (INT64_C(1) << 31)
#define LIMIT_PARAMS (INT64_C(1) << 40)

/* The number of autograd nodes PyTorch 1.13 records for one layer in a forward with grad on
 * (CPU and CUDA agree):
 *   linear     2  TBackward0 (weight.t()) + AddmmBackward0; bias=false: TBackward0 + MmBackward0
 *   conv2d     1  ConvolutionBackward0
 *   batchnorm  1  NativeBatchNormBackward0 (CudnnBatchNormBackward0 on CUDA); 0 when it has no
 *                 affine parameters and its input does not require grad
 *   relu       1  ReluBackward0
 *   dropout    1  MulBackward0 (CPU) / NativeDropoutBackward0 (CUDA); p=0 returns its input: 0
 *   maxpool2d  1  MaxPool2DWithIndicesBackward0
 *   flatten    1  ViewBackward0 on [C,H,W]; flatten(1,-1) of an [N,F] tensor returns it: 0
 * Ops without parameters create nothing when their input does not require grad. */
static int autograd_nodes(const struct ps_layer *l, int n_in_dims, bool in_grad)
{
    switch (l->op) {
    case PS_OP_LINEAR:
        return 2;
    case PS_OP_CONV2D:
        return 1;
    case PS_OP_BATCHNORM:
        return (l->affine || in_grad) ? 1 : 0;
    case PS_OP_RELU:
        return in_grad ? 1 : 0;
    case PS_OP_DROPOUT:
        return in_grad && l->p > 0 ? 1 : 0;
    case PS_OP_MAXPOOL2D:
        return in_grad ? 1 : 0;
    case PS_OP_FLATTEN:
        return in_grad && n_in_dims == 3 ? 1 : 0;
    case PS_OP__COUNT:
        break;
    }
    return 0;
}

static void shape_str(char *buf, size_t n, int nd, const int64_t *d)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)d[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int layer_err(const struct ps_spec *s, struct ps_diag *diag, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int layer_err(const struct ps_spec *s, struct ps_diag *diag, int i, const char *fmt, ...)
{
    char where[PS_DIAG_WHERE_MAX];
    snprintf(where, sizeof(where), "%s: model.layers[%d]", s->path, i);
    va_list ap;
    va_start(ap, fmt);
    int rc = ps_diag_vset(diag, -EINVAL, where, fmt, ap);
    va_end(ap);
    return rc;
}

/* Output height/width of a conv2d/maxpool2d window; reports when the window does not fit. */
static int window_out(const struct ps_spec *s, struct ps_diag *diag, int i,
                      const struct ps_layer *l, struct ps_layer_info *li)
{
    for (int k = 1; k < 3; k++) {
        int64_t padded = li->in[k] + 2 * l->padding;
        if (padded < l->kernel) {
            int rc = layer_err(s, diag, i,
                               "%s kernel %lld does not fit the padded input %lldx%lld "
                               "(output size floor((%s + 2*%lld - %lld) / %lld) + 1 would be < 1)",
                               ps_op_name(l->op), (long long)l->kernel,
                               (long long)(li->in[1] + 2 * l->padding),
                               (long long)(li->in[2] + 2 * l->padding), k == 1 ? "H" : "W",
                               (long long)l->padding, (long long)l->kernel, (long long)l->stride);
            ps_diag_hint(diag, "use a kernel of at most %lld or more padding", (long long)padded);
            return rc;
        }
        li->out[k] = (padded - l->kernel) / l->stride + 1;
    }
    return 0;
}

static int fill_layer(const struct ps_spec *s, struct ps_diag *diag, int i, struct ps_layer_info *li)
{
    const struct ps_layer *l = &s->layers[i];
    char shp[96];
    int rc;
    li->n_out_dims = li->n_in_dims;
    memcpy(li->out, li->in, sizeof(li->out));
    li->channels = li->in[0];

    /* shape */
    switch (l->op) {
    case PS_OP_LINEAR:
        if (li->n_in_dims != 1) {
            shape_str(shp, sizeof(shp), li->n_in_dims, li->in);
            rc = layer_err(s, diag, i, "linear needs a flat input but gets %s", shp);
            ps_diag_hint(diag, "add {\"op\": \"flatten\"} before it");
            return rc;
        }
        li->out[0] = l->out;
        break;
    case PS_OP_CONV2D:
    case PS_OP_MAXPOOL2D:
        if (li->n_in_dims != 3) {
            shape_str(shp, sizeof(shp), li->n_in_dims, li->in);
            return layer_err(s, diag, i, "%s needs [C,H,W] input but gets %s", ps_op_name(l->op),
                             shp);
        }
        if ((rc = window_out(s, diag, i, l, li))) return rc;
        if (l->op == PS_OP_CONV2D) li->out[0] = l->out;
        break;
    case PS_OP_FLATTEN:
        if (li->n_in_dims == 3) li->out[0] = li->in[0] * li->in[1] * li->in[2];
        li->n_out_dims = 1;
        li->out[1] = li->out[2] = 0;
        break;
    case PS_OP_BATCHNORM:
    case PS_OP_RELU:
    case PS_OP_DROPOUT:
    case PS_OP__COUNT:
        break;
    }
    double out_numel = 1;
    for (int k = 0; k < li->n_out_dims; k++) out_numel *= (double)li->out[k];
    if (out_numel > (double)LIMIT_NUMEL) {
        shape_str(shp, sizeof(shp), li->n_out_dims, li->out);
        return layer_err(s, diag, i,
                         "output %s has %.0f elements per sample, more than the limit of %lld (2^31)",
                         shp, out_numel, (long long)LIMIT_NUMEL);
    }
    li->out_numel = (int64_t)out_numel;
    const double n = (double)li->in_numel, o = (double)li->out_numel;

    /* parameters */
    double params = 0;
    int64_t out_hw = li->n_out_dims == 3 ? li->out[1] * li->out[2] : 1;
    switch (l->op) {
    case PS_OP_LINEAR:
        params = (double)li->in[0] * (double)l->out + (l->bias ? (double)l->out : 0);
        break;
    case PS_OP_CONV2D:
        params = (double)l->out * (double)li->in[0] * (double)l->kernel * (double)l->kernel +
                 (l->bias ? (double)l->out : 0);
        break;
    case PS_OP_BATCHNORM:
        params = l->affine ? 2.0 * (double)li->channels : 0;
        li->buffers = 2 * li->channels + 1; /* running_mean, running_var, num_batches_tracked */
        break;
    default:
        break;
    }
    if (params > (double)LIMIT_PARAMS)
        return layer_err(s, diag, i,
                         "%s has %.0f parameters, more than the limit of %lld (2^40) per layer",
                         ps_op_name(l->op), params, (long long)LIMIT_PARAMS);
    li->params = (int64_t)params;

    /* FLOPs, bytes, saved tensors: see the table at the top of the file */
    li->autograd_nodes = autograd_nodes(l, li->n_in_dims, li->in_requires_grad);
    switch (l->op) {
    case PS_OP_LINEAR:
        li->fwd_flops = 2.0 * n * (double)l->out + (l->bias ? (double)l->out : 0);
        li->bwd_flops = 2.0 * li->fwd_flops;
        li->fwd_bytes = 4.0 * (n + o);
        li->bwd_bytes = 4.0 * (o + 2.0 * n);
        li->saved_bytes = 4 * li->in_numel;
        break;
    case PS_OP_CONV2D:
        li->fwd_flops = 2.0 * (double)li->in[0] * (double)l->kernel * (double)l->kernel *
                            (double)l->out * (double)out_hw +
                        (l->bias ? o : 0);
        li->bwd_flops = 2.0 * li->fwd_flops;
        li->fwd_bytes = 4.0 * (n + o);
        li->bwd_bytes = 4.0 * (o + 2.0 * n);
        li->saved_bytes = 4 * li->in_numel;
        break;
    case PS_OP_BATCHNORM:
        li->fwd_flops = 8.0 * n;
        li->bwd_flops = 2.0 * li->fwd_flops;
        li->fwd_bytes = 4.0 * (2.0 * n + o);
        li->bwd_bytes = 4.0 * (2.0 * o + n);
        li->saved_bytes = 4 * li->in_numel;
        break;
    case PS_OP_RELU:
        li->fwd_flops = n;
        li->bwd_flops = n;
        li->fwd_bytes = 4.0 * (n + o);
        li->bwd_bytes = 4.0 * (2.0 * o + n);
        li->saved_bytes = 4 * li->out_numel;
        break;
    case PS_OP_DROPOUT:
        if (l->p > 0) {
            li->fwd_flops = n;
            li->bwd_flops = n;
            li->fwd_bytes = 4.0 * (n + o) + n;
            li->bwd_bytes = 4.0 * (o + n) + n;
            li->saved_bytes = li->in_numel;
        }
        break;
    case PS_OP_MAXPOOL2D:
        li->fwd_flops = (double)l->kernel * (double)l->kernel * o;
        li->bwd_flops = n + o;
        li->fwd_bytes = 4.0 * n + 12.0 * o;
        li->bwd_bytes = 4.0 * n + 12.0 * o;
        li->saved_bytes = 4 * li->in_numel + 8 * li->out_numel;
        break;
    case PS_OP_FLATTEN:
    case PS_OP__COUNT:
        break;
    }
    if (li->autograd_nodes == 0) li->saved_bytes = 0;
    li->fwd_param_bytes = 4.0 * (double)li->params + 8.0 * (double)(li->buffers ? li->buffers - 1 : 0);
    li->bwd_param_bytes = 8.0 * (double)li->params;
    return 0;
}

/* ---- Activation memory (src/SEMANTICS.md section 9) ---------------------------------------
 *
 * What a partition's tasks keep alive on its device, per sample (the graph builders multiply by
 * the micro-batch size). Buffers are the tensors between layers: buffer b is layer b's input and
 * layer b-1's output, 4 bytes per element; buffer L is the model output. A buffer exists from the
 * layer that writes it until its last reader is done with it, and is counted once however many
 * layers keep it (autograd saves the same tensor, not a copy):
 *   A1. A forward with grad (F of a task that is not checkpointed, or R) keeps, until B(i,j) ends,
 *       every buffer some layer's backward keeps (ps_layer_keeps) and each layer's extra saved
 *       tensors; any other buffer goes as soon as the next layer has read it. A flatten inside a
 *       partition returns a view (ps_flatten_view): its output is its input's storage, kept when
 *       either is.
 *   A2. A checkpointed F keeps only its input (for R); every intermediate goes once read.
 *   A3. R re-runs the forward with grad from the kept input. It skips the partition's last layer
 *       when nothing reads its output (ps_recompute_skips); otherwise that output is a scratch
 *       buffer freed when R ends.
 *   A4. F hands its output to the next partition's device (out_bytes, counted there from this F
 *       on: torchgpipe copies it while the next device computes); the last partition's output is
 *       consumed by the loss at the end of F.
 *   A5. B(i,j) frees everything its micro-batch keeps on the partition, input included.
 * Gradients (each lives inside one B), BN statistics (C floats) and kernel workspace are not
 * counted. peak is the high-water above the start of the task, net the change at its end; they
 * come from walking the layers in the order the executor allocates and frees (kernels/exec_cpu.c
 * M1-M4 follows the same rules). */

void ps_layer_keeps(const struct ps_layer *l, const struct ps_layer_info *li, struct ps_keeps *k)
{
    *k = (struct ps_keeps){false, false, 0};
    switch (l->op) {
    case PS_OP_LINEAR:    /* addmm saves mat1 */
    case PS_OP_CONV2D:    /* convolution saves its input and weight */
    case PS_OP_BATCHNORM: /* native_batch_norm saves its input (and C-float statistics) */
        k->input = true;
        break;
    case PS_OP_RELU: /* threshold_backward(grad, result, 0) */
        k->output = true;
        break;
    case PS_OP_MAXPOOL2D: /* max_pool2d_with_indices_backward(grad, self, ..., indices) */
        k->input = true;
        k->extra = 8 * li->out_numel;
        break;
    case PS_OP_DROPOUT: /* native_dropout's bool mask; p = 0 returns its input */
        if (l->p > 0) k->extra = li->in_numel;
        break;
    case PS_OP_FLATTEN: /* a view */
    case PS_OP__COUNT:
        break;
    }
}

int64_t ps_layer_kept_bytes(const struct ps_spec *s, const struct ps_model *m, int l)
{
    struct ps_keeps k;
    ps_layer_keeps(&s->layers[l], &m->layers[l], &k);
    return (k.input ? 4 * m->layers[l].in_numel : 0) + k.extra;
}

bool ps_recompute_skips(enum ps_op op)
{
    return op == PS_OP_CONV2D || op == PS_OP_LINEAR || op == PS_OP_RELU || op == PS_OP_FLATTEN;
}

bool ps_model_keeps_buffer(const struct ps_spec *s, const struct ps_model *m, int f, int e, int b)
{
    struct ps_keeps k;
    if (b < e) {
        ps_layer_keeps(&s->layers[b], &m->layers[b], &k);
        if (k.input) return true;
    }
    if (b > f) {
        ps_layer_keeps(&s->layers[b - 1], &m->layers[b - 1], &k);
        if (k.output) return true;
    }
    if (b == e - 1) {
        ps_layer_keeps(&s->layers[b], &m->layers[b], &k);
        if (k.output) return true;
    }
    return false;
}

bool ps_flatten_view(const struct ps_spec *s, int f, int e, int l)
{
    return l > 0 && l >= f && l < e - 1 && s->layers[l].op == PS_OP_FLATTEN;
}

bool ps_model_keeps_storage(const struct ps_spec *s, const struct ps_model *m, int f, int e, int b,
                            bool grad)
{
    for (;;) {
        if (grad ? ps_model_keeps_buffer(s, m, f, e, b) : b == f) return true;
        if (b - 1 < f || !ps_flatten_view(s, f, e, b - 1)) return false;
        b--;
    }
}

enum walk { WALK_FWD, WALK_CKPT, WALK_REC };

static int64_t buf_bytes(const struct ps_model *m, int b)
{
    return 4 * (b < m->n_layers ? m->layers[b].in_numel : m->out_numel);
}

/* One task of partition j, layer by layer (A1-A4). At its start the device holds the partition's
 * input when it is counted (in_bytes; for R always: the checkpointed F kept it). */
static struct ps_task_mem walk_task(const struct ps_spec *s, const struct ps_model *m, int j,
                                    enum walk w)
{
    const struct ps_partition_info *p = &m->parts[j];
    int f = p->first, e = p->first + p->count;
    bool grad = w != WALK_CKPT, last_part = j == m->n_partitions - 1;
    bool in_counted = w == WALK_REC || f > 0;
    int64_t cur = 0, peak = 0, scratch = 0;
    for (int l = f; l < e; l++) {
        bool last = l == e - 1, view = ps_flatten_view(s, f, e, l);
        if (last && w == WALK_REC && ps_recompute_skips(s->layers[l].op)) break;
        if (last && w == WALK_REC) scratch = buf_bytes(m, e);
        else if (!view && (!last || last_part)) cur += buf_bytes(m, l + 1);
        cur += scratch;
        if (grad) {
            struct ps_keeps k;
            ps_layer_keeps(&s->layers[l], &m->layers[l], &k);
            cur += k.extra;
        }
        if (cur > peak) peak = cur;
        if (view) continue; /* the storage lives on as the next buffer: decided there */
        bool keep = ps_model_keeps_storage(s, m, f, e, l, grad);
        if (!keep && (l > f || in_counted)) cur -= buf_bytes(m, l);
        if (keep && l == f && !in_counted) cur += buf_bytes(m, l);
        if (cur > peak) peak = cur;
    }
    cur -= scratch;
    if (w != WALK_REC && last_part) cur -= buf_bytes(m, e); /* the loss (A4) */
    return (struct ps_task_mem){cur, peak};
}

static void task_memory(const struct ps_spec *s, struct ps_model *m, int j)
{
    struct ps_partition_info *p = &m->parts[j];
    p->in_bytes = p->first > 0 ? buf_bytes(m, p->first) : 0;
    p->out_bytes = j < m->n_partitions - 1 ? buf_bytes(m, p->first + p->count) : 0;
    p->fwd = walk_task(s, m, j, WALK_FWD);
    p->fwd_ckpt = walk_task(s, m, j, WALK_CKPT);
    p->rec = walk_task(s, m, j, WALK_REC);
}

int ps_model_build(const struct ps_spec *s, struct ps_model **out, struct ps_diag *diag)
{
    *out = NULL;
    struct ps_model *m = calloc(1, sizeof(*m));
    if (!m) return ps_diag_set(diag, -ENOMEM, s->path, "out of memory");
    m->spec = s;
    m->n_layers = s->n_layers;
    m->n_partitions = s->n_partitions;
    m->layers = calloc((size_t)(s->n_layers > 0 ? s->n_layers : 1), sizeof(*m->layers));
    m->parts = calloc((size_t)(s->n_partitions > 0 ? s->n_partitions : 1), sizeof(*m->parts));
    if (!m->layers || !m->parts) {
        ps_model_destroy(m);
        return ps_diag_set(diag, -ENOMEM, s->path, "out of memory");
    }

    int nd = s->n_input_dims;
    int64_t d[PS_SPEC_MAX_DIMS] = {0};
    memcpy(d, s->input, sizeof(d));
    bool grad = false;
    for (int i = 0; i < s->n_layers; i++) {
        struct ps_layer_info *li = &m->layers[i];
        li->n_in_dims = nd;
        memcpy(li->in, d, sizeof(d));
        li->in_numel = 1;
        for (int k = 0; k < nd; k++) li->in_numel *= d[k];
        li->in_requires_grad = grad;
        int rc = fill_layer(s, diag, i, li);
        if (rc) {
            ps_model_destroy(m);
            return rc;
        }
        grad = grad || li->params > 0;
        nd = li->n_out_dims;
        memcpy(d, li->out, sizeof(d));
        m->total_params += li->params;
    }
    m->out_numel = s->n_layers > 0 ? m->layers[s->n_layers - 1].out_numel : 0;

    for (int j = 0; j < s->n_partitions; j++) {
        struct ps_partition_info *p = &m->parts[j];
        p->first = s->first_layer[j];
        p->count = s->balance[j];
        for (int i = p->first; i < p->first + p->count && i < s->n_layers; i++) {
            const struct ps_layer_info *li = &m->layers[i];
            p->fwd_flops += li->fwd_flops;
            p->fwd_bytes += li->fwd_bytes;
            p->bwd_flops += li->bwd_flops;
            p->bwd_bytes += li->bwd_bytes;
            p->fwd_param_bytes += li->fwd_param_bytes;
            p->bwd_param_bytes += li->bwd_param_bytes;
            p->params += li->params;
            p->saved_bytes += li->saved_bytes;
            p->autograd_nodes += li->autograd_nodes;
        }
        if (p->count > 0 && p->first + p->count <= s->n_layers) {
            p->in_numel = m->layers[p->first].in_numel;
            p->out_numel = m->layers[p->first + p->count - 1].out_numel;
            task_memory(s, m, j);
        }
    }
    *out = m;
    return 0;
}

void ps_model_destroy(struct ps_model *m)
{
    if (!m) return;
    free(m->layers);
    free(m->parts);
    free(m);
}
