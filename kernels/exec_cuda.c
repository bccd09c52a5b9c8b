/* exec_cuda: the `cuda` executor. Runs the task graph on CUDA streams, as torchgpipe does on GPUs,
 * with the kernels of kernels/cuda, and reproduces the cpu executor's numerics (exec_cpu.c:
 * the same buffers, dropout offsets, BN policies, loss per micro-batch and SGD step).
 *
 * Streams and devices. Graph stream s (graph.h: a compute stream per device, a copy stream per
 * (partition, micro-batch)) is one non-blocking cudaStream on GPU phys(device(s)): graph device
 * d runs on GPU d, or on GPU 0 for every d with virtual devices (each graph device keeps its own
 * stream set, so partitions still overlap as streams on one GPU). Boundary tensors exist on both
 * sides: the producer's output buffer and the consumer's input buffer, and C nodes move them with
 * cudaMemcpyPeerAsync (a device copy on one GPU) on the copy stream the graph names.
 *
 * Ordering: the host issues every node of the ps_order from this one thread, in order (forward:
 * host order with the tick barrier; backward: the engine order). A node with device work runs
 * on its graph stream; fork/join/loss' do no device work. Which earlier work a node waits for on
 * the device is src/waits.h's plan, the one the simulator times: wait nodes wait for the last
 * node issued on the stream they name, a copy is a two-way barrier with the destination copy
 * stream, and a backward node waits for the producers of the real gradients it consumes on
 * other streams. Phony and host edges make no stream wait (SEMANTICS.md sections 2-3):
 *
 *     producer u on stream A:  ... work(u) ... cudaEventRecord(ev[u], A)
 *     consumer v on stream B:  cudaStreamWaitEvent(B, ev[u]) ... work(v) ...
 *
 * Invariants:
 *   X1. One cudaEvent per node that some node of another stream waits for in the plan, and one
 *       cudaStreamWaitEvent per planned wait; nothing else orders streams: no device-wide or
 *       stream synchronisation inside a step. (Waits point backwards in the issue order, so every
 *       wait follows its event's record.) A no-op node with a stream (r(i,j)) still waits and
 *       records where the plan says, so it keeps its place in its stream's order.
 *   X2. Same-stream order needs nothing: a stream runs in issue order.
 *   X3. Between steps the host synchronises every GPU (to read the loss and the BN log), then
 *       refills the pinned input buffers.
 *   X4. With tracing, the last step's launches run under CUPTI with the node id pushed as
 *       external correlation id around each node's launches, so every kernel, memcpy and memset
 *       of the step maps to its node; the parameter update after the order is not traced.
 *   X5. num_batches_tracked and the DeferredBatchNorm counters live on the host and change at
 *       issue time, exactly as on the CPU; the statistics themselves stay on the GPU, and each
 *       update's mean/var is written to a device log slot and fetched after the step. A GPU's
 *       slots are one array, fetched with one copy.
 *   X6. Buffers read on another stream are not rewritten before that read is ordered. The one
 *       case the plan leaves open: the forward copy C(i,j->j+1) reads F(i,j)'s boundary output
 *       and nothing orders R(i,j) after it (for the first recompute of a device, R runs as soon as
 *       its stream is free; tests/test_waits.c shows the overlap), so a checkpointed task's
 *       recompute writes its boundary output to its own buffer (rpact), which its backward reads.
 */
#include "kernels/exec_cuda.h"
#include "kernels/exec_priv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda.h"
#include "src/waits.h"

/* per (micro-batch, layer) tensors kept for backward, on the layer's device */
struct saved {
    float *bn_mean, *bn_invstd;
    float *log_mean[3], *log_var[3]; /* BN update log slots: forward, recompute, commit */
    int32_t *idx;
    uint8_t *mask;
};

struct dlayer {           /* a layer's parameters and state on its device */
    int gpu, gdev;        /* physical GPU, graph device */
    float *w, *b, *dw, *db;
    struct ps_cuda_bn bn;
    struct ps_cuda_bn_accum acc;
    int tracked;
};

struct pending_log {      /* a BN update whose statistics are still on the GPU */
    uint32_t entry;
    int gpu;
    const float *mean, *var;
    size_t C;
};

struct xc {
    const struct ps_graph *g;
    const struct ps_spec *spec;
    const struct ps_model *model;
    const struct ps_exec_cuda_opts *co;
    struct ps_exec_result *res;
    struct ps_diag *d;
    int L, m, n, step, chunks;
    int64_t batch, *mb_off, *mb_size;
    int *part_of;            /* layer -> partition */
    int *gpu_of_dev;         /* graph device -> physical GPU */
    int n_gpus, cur_gpu;
    int *run_gpus, n_run_gpus; /* the GPUs this run uses, each once */
    /* streams and per-graph-device resources */
    ps_cuda_stream *stream;  /* graph stream -> cuda stream */
    int32_t *compute_of;     /* graph device -> its compute stream id */
    struct ps_cuda_blas **blas; /* per graph device (bound to its compute stream) */
    /* buffers, [(i * (L + 1)) + l] */
    float **act, **pact;     /* act: on the layer's device; pact: producer copy at boundaries */
    float **rpact;           /* a checkpointed task's recomputed boundary output (X6) */
    float **grad, **pgrad;   /* grad: dL/dact on layer l's device; pgrad: copy at boundaries */
    struct saved *saved;     /* [i * L + l] */
    bool *live;              /* [i * L + l]: exec_cpu.c E1 */
    struct dlayer *lay;
    float *h_x, *h_rows;     /* pinned step inputs */
    int64_t *h_labels;
    float *d_rows;           /* last device: targets */
    int64_t *d_labels;
    double *d_loss, *h_loss; /* per micro-batch */
    int64_t in_numel;
    /* ordering */
    int32_t *xstream;        /* node -> stream it runs on, -1 transparent */
    ps_cuda_event *ev;       /* node -> event (NULL when it has no cross-stream consumer) */
    uint32_t *wait_off, *wait_node; /* CSR: events each node waits for */
    uint32_t n_events, n_waits;
    bool *loss_done;
    struct pending_log *pend;
    size_t n_pend, cap_pend;
    /* every BN log slot of a GPU lives in one device array, fetched with one copy (X5) */
    float **log_dev, **log_host; /* per physical GPU of the run */
    size_t *log_len;             /* floats */
    int *log_gdev;               /* a graph device on that GPU (its compute stream copies) */
    struct ps_cupti *tracer;
};

#define ACT(x, i, l) ((x)->act[(size_t)(i) * (size_t)((x)->L + 1) + (size_t)(l)])
#define PACT(x, i, l) ((x)->pact[(size_t)(i) * (size_t)((x)->L + 1) + (size_t)(l)])
#define RPACT(x, i, l) ((x)->rpact[(size_t)(i) * (size_t)((x)->L + 1) + (size_t)(l)])
#define GRAD(x, i, l) ((x)->grad[(size_t)(i) * (size_t)((x)->L + 1) + (size_t)(l)])
#define PGRAD(x, i, l) ((x)->pgrad[(size_t)(i) * (size_t)((x)->L + 1) + (size_t)(l)])
#define SAVED(x, i, l) (&(x)->saved[(size_t)(i) * (size_t)(x)->L + (size_t)(l)])
#define LIVE(x, i, l) ((x)->live[(size_t)(i) * (size_t)(x)->L + (size_t)(l)])

static int use_gpu(struct xc *x, int gpu)
{
    if (x->cur_gpu == gpu) return 0;
    int rc = ps_cuda_set_device(gpu, x->d);
    if (rc == 0) x->cur_gpu = gpu;
    return rc;
}

/* is layer l+1 the first layer of another partition (its input crosses a boundary)? */
static bool boundary(const struct xc *x, int l)
{
    return l > 0 && l < x->L && x->part_of[l] != x->part_of[l - 1];
}

/* where layer l writes its output / reads its output gradient. At a boundary the forward writes
   the buffer the copy reads, and a recompute writes its own (X6); the backward of a checkpointed
   task reads the recomputed one. */
static float *out_buf(struct xc *x, int i, int l, bool recompute)
{
    if (!boundary(x, l + 1)) return ACT(x, i, l + 1);
    return recompute && RPACT(x, i, l + 1) ? RPACT(x, i, l + 1) : PACT(x, i, l + 1);
}

static float *gout_buf(struct xc *x, int i, int l)
{
    return boundary(x, l + 1) ? PGRAD(x, i, l + 1) : GRAD(x, i, l + 1);
}

static size_t numel(const struct xc *x, int i, int l)
{
    int64_t per = l < x->L ? x->model->layers[l].in_numel : x->model->out_numel;
    return (size_t)(per * x->mb_size[i]);
}

static int gdev_of_part(const struct xc *x, int j)
{
    return x->spec->device_id[j];
}

static ps_cuda_stream compute_stream(const struct xc *x, int gdev)
{
    return x->stream[x->compute_of[gdev]];
}

/* ---- BN log -------------------------------------------------------------------------------- */

/* The entry is appended now (log order = issue order, as on the CPU); its statistics are still
 * on the GPU and are fetched into it after the step (collect_step). */
static int log_update(struct xc *x, int l, int i, enum ps_exec_bn_phase ph, uint32_t node,
                      int64_t count, double factor, const float *dmean, const float *dvar)
{
    size_t C = x->lay[l].bn.channels;
    if (x->n_pend == x->cap_pend) {
        size_t c = x->cap_pend ? x->cap_pend * 2 : 64;
        struct pending_log *q = realloc(x->pend, c * sizeof(*q));
        if (!q) return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory for the BN log");
        x->pend = q;
        x->cap_pend = c;
    }
    struct ps_exec_bn_update *u;
    int rc = ps_exec_bn_log(x->res, l, x->step, i, ph, node, count, factor, C, &u, x->d);
    if (rc) return rc;
    x->pend[x->n_pend++] = (struct pending_log){.entry = x->res->n_bn - 1, .gpu = x->lay[l].gpu,
                                                .mean = dmean, .var = dvar, .C = C};
    return 0;
}

static double bn_factor(const struct ps_cuda_bn *bn)
{
    int64_t nbt = bn->num_batches_tracked;
    if (bn->cumulative) return nbt > 0 ? 1.0 / (double)nbt : 1.0;
    return bn->momentum;
}

/* ---- layers ----------------------------------------------------------------------------------- */

static int layer_forward(struct xc *x, int i, int l, bool grad, bool recompute, uint32_t node)
{
    const struct ps_layer *ly = &x->spec->layers[l];
    const struct ps_layer_info *li = &x->model->layers[l];
    struct dlayer *dl = &x->lay[l];
    struct saved *sv = SAVED(x, i, l);
    ps_cuda_stream s = compute_stream(x, dl->gdev);
    struct ps_cuda_blas *blas = x->blas[dl->gdev];
    size_t n = (size_t)x->mb_size[i];
    const float *in = ACT(x, i, l);
    float *y = out_buf(x, i, l, recompute);
    int rc = 0;
    switch (ly->op) {
    case PS_OP_LINEAR:
        rc = ps_cuda_linear_forward(blas, in, dl->w, dl->b, y, n, (size_t)li->in_numel,
                                    (size_t)li->out_numel, x->d);
        break;
    case PS_OP_CONV2D: {
        struct ps_conv2d_shape cs;
        ps_exec_conv_shape(&cs, ly, li, n);
        rc = ps_cuda_conv2d_forward(blas, &cs, in, dl->w, dl->b, y, x->d);
        break;
    }
    case PS_OP_MAXPOOL2D: {
        struct ps_pool2d_shape ps;
        ps_exec_pool_shape(&ps, ly, li, n);
        rc = ps_cuda_maxpool2d_forward(&ps, in, y, sv->idx, s, x->d);
        break;
    }
    case PS_OP_RELU: rc = ps_cuda_relu_forward(in, y, n * (size_t)li->in_numel, s, x->d); break;
    case PS_OP_FLATTEN:
        rc = ps_cuda_memcpy_d2d(y, in, n * (size_t)li->in_numel * sizeof(float), s, x->d);
        break;
    case PS_OP_DROPOUT: {
        rc = ps_cuda_dropout_forward(in, y, sv->mask, n * (size_t)li->in_numel, (float)ly->p,
                                     ps_exec_dropout_seed(x->spec),
                                     ps_exec_dropout_offset(x->step, x->L, x->m, l, i), s, x->d);
        break;
    }
    case PS_OP_BATCHNORM: {
        size_t C = dl->bn.channels, S = (size_t)(li->in_numel / (int64_t)C);
        int mode = ps_exec_bn_mode(x->g->var.batchnorm, grad);
        if (x->g->var.batchnorm == PS_BN_DEFERRED && !recompute) {
            rc = ps_cuda_bn_accumulate(&dl->acc, dl->bn.partial, in, n, S, s, x->d);
            if (rc) break;
            dl->tracked++;
            if (dl->tracked == x->chunks) {
                int64_t cnt = dl->acc.count;
                rc = ps_cuda_bn_commit(&dl->bn, &dl->acc, sv->log_mean[2], sv->log_var[2], s,
                                       x->d);
                if (rc) break;
                dl->tracked = 0;
                rc = log_update(x, l, i, PS_EXEC_BN_COMMIT, node, cnt, bn_factor(&dl->bn),
                                sv->log_mean[2], sv->log_var[2]);
                if (rc) break;
            }
        }
        int slot = recompute ? 1 : 0;
        rc = ps_cuda_bn_forward(&dl->bn, mode, in, y, n, S, sv->bn_mean, sv->bn_invstd,
                                mode == PS_BN_TRAIN ? sv->log_mean[slot] : NULL,
                                mode == PS_BN_TRAIN ? sv->log_var[slot] : NULL, s, x->d);
        if (rc) {
            snprintf(x->d->where, sizeof(x->d->where), "layer %d (batchnorm), micro-batch %d", l,
                     i);
            break;
        }
        if (mode == PS_BN_TRAIN)
            rc = log_update(x, l, i, recompute ? PS_EXEC_BN_RECOMPUTE : PS_EXEC_BN_FORWARD,
                            node, (int64_t)(n * S), bn_factor(&dl->bn), sv->log_mean[slot],
                            sv->log_var[slot]);
        break;
    }
    case PS_OP__COUNT: rc = ps_diag_set(x->d, -EINVAL, "exec", "layer %d: unknown op", l); break;
    }
    return rc;
}

static int layer_backward(struct xc *x, int i, int l)
{
    const struct ps_layer *ly = &x->spec->layers[l];
    const struct ps_layer_info *li = &x->model->layers[l];
    struct dlayer *dl = &x->lay[l];
    struct saved *sv = SAVED(x, i, l);
    ps_cuda_stream s = compute_stream(x, dl->gdev);
    struct ps_cuda_blas *blas = x->blas[dl->gdev];
    size_t n = (size_t)x->mb_size[i], cnt = n * (size_t)li->in_numel;
    const float *in = ACT(x, i, l), *y = out_buf(x, i, l, true), *dy = gout_buf(x, i, l);
    float *dx = l > 0 ? GRAD(x, i, l) : NULL;
    int rc = 0;
    switch (ly->op) {
    case PS_OP_LINEAR:
        rc = ps_cuda_linear_backward(blas, in, dl->w, dy, dx, dl->dw, dl->db, n,
                                     (size_t)li->in_numel, (size_t)li->out_numel, x->d);
        break;
    case PS_OP_CONV2D: {
        struct ps_conv2d_shape cs;
        ps_exec_conv_shape(&cs, ly, li, n);
        rc = ps_cuda_conv2d_backward(blas, &cs, in, dl->w, dy, dx, dl->dw, dl->db, x->d);
        break;
    }
    case PS_OP_MAXPOOL2D:
        if (dx) {
            struct ps_pool2d_shape ps;
            ps_exec_pool_shape(&ps, ly, li, n);
            rc = ps_cuda_maxpool2d_backward(&ps, dy, sv->idx, dx, s, x->d);
        }
        break;
    case PS_OP_RELU:
        if (dx) rc = ps_cuda_relu_backward(y, dy, dx, cnt, s, x->d);
        break;
    case PS_OP_FLATTEN:
        if (dx) rc = ps_cuda_memcpy_d2d(dx, dy, cnt * sizeof(float), s, x->d);
        break;
    case PS_OP_DROPOUT:
        if (dx) rc = ps_cuda_dropout_backward(dy, sv->mask, dx, cnt, (float)ly->p, s, x->d);
        break;
    case PS_OP_BATCHNORM: {
        size_t S = (size_t)(li->in_numel / (int64_t)dl->bn.channels);
        rc = ps_cuda_bn_backward(&dl->bn, true, in, dy, sv->bn_mean, sv->bn_invstd, dx, dl->dw,
                                 dl->db, n, S, s, x->d);
        break;
    }
    case PS_OP__COUNT: break;
    }
    return rc;
}

/* ---- loss: per micro-batch with the mini-batch's normaliser (exec_cpu.c E4) --------------- */

static int loss_mb(struct xc *x, int i)
{
    if (x->loss_done[i]) return 0;
    int jl = x->n - 1, gdev = gdev_of_part(x, jl);
    ps_cuda_stream s = compute_stream(x, gdev);
    size_t n = (size_t)x->mb_size[i], K = (size_t)x->model->out_numel;
    const float *out = ACT(x, i, x->L);
    float *dout = GRAD(x, i, x->L);
    double share = (double)n / (double)x->batch;
    int rc = 0;
    switch (x->spec->loss) {
    case PS_LOSS_SUM:
        rc = ps_cuda_loss_sum_forward(out, n * K, &x->d_loss[i], s, x->d);
        if (!rc) rc = ps_cuda_loss_sum_backward(dout, n * K, 1.0f, s, x->d);
        x->h_loss[i] = 1.0; /* scale of the device value */
        break;
    case PS_LOSS_MSE: {
        float *t = x->d_rows + x->mb_off[i] * (int64_t)K;
        rc = ps_cuda_memcpy_h2d(t, x->h_rows + x->mb_off[i] * (int64_t)K,
                                n * K * sizeof(float), s, x->d);
        if (!rc) rc = ps_cuda_loss_mse_forward(out, t, n * K, &x->d_loss[i], s, x->d);
        if (!rc) rc = ps_cuda_loss_mse_backward(out, t, dout, n * K, (float)share, s, x->d);
        x->h_loss[i] = share;
        break;
    }
    case PS_LOSS_CROSS_ENTROPY: {
        /* the kernels turn a bad label into NaN: refuse it here with the CPU's message */
        int64_t *lab = x->d_labels + x->mb_off[i];
        rc = ps_cpu_loss_check_labels(x->h_labels + x->mb_off[i], n, K, x->d);
        if (!rc)
            rc = ps_cuda_memcpy_h2d(lab, x->h_labels + x->mb_off[i], n * sizeof(int64_t), s, x->d);
        if (!rc) rc = ps_cuda_loss_ce_forward(out, lab, n, K, &x->d_loss[i], s, x->d);
        if (!rc) rc = ps_cuda_loss_ce_backward(out, lab, dout, n, K, (float)share, s, x->d);
        x->h_loss[i] = share;
        break;
    }
    }
    x->loss_done[i] = rc == 0;
    return rc;
}

/* ---- tasks ------------------------------------------------------------------------------------ */

static int task_forward(struct xc *x, int i, int j, bool grad, bool recompute, uint32_t node)
{
    int f = x->spec->first_layer[j], c = x->spec->balance[j];
    if (j == 0 && !recompute) { /* the micro-batch enters the pipeline */
        int gdev = gdev_of_part(x, 0);
        int rc = ps_cuda_memcpy_h2d(ACT(x, i, 0), x->h_x + x->mb_off[i] * x->in_numel,
                                    numel(x, i, 0) * sizeof(float), compute_stream(x, gdev), x->d);
        if (rc) return rc;
    }
    for (int l = f; l < f + c; l++) {
        int rc = layer_forward(x, i, l, grad, recompute, node);
        if (rc) return rc;
        LIVE(x, i, l) = grad;
    }
    return 0;
}

static int task_backward(struct xc *x, int i, int j, uint32_t node)
{
    int f = x->spec->first_layer[j], c = x->spec->balance[j];
    int rc = ps_exec_check_live(x->g, node, &LIVE(x, i, 0), f, c, x->d);
    if (rc) return rc;
    if (j == x->n - 1 && (rc = loss_mb(x, i))) return rc;
    for (int l = f + c - 1; l >= f; l--)
        if ((rc = layer_backward(x, i, l))) return rc;
    for (int l = f; l < f + c; l++) LIVE(x, i, l) = false; /* backward frees the graph */
    return 0;
}

/* A copy node: forward moves micro-batch i's activation from partition `part` to `peer`,
 * backward moves its gradient back (graph.h: the twin swaps part and peer). */
static int run_copy(struct xc *x, const struct ps_node *nd, ps_cuda_stream s)
{
    int i = nd->mb;
    if (nd->phase == PS_PHASE_FWD) {
        int b = x->spec->first_layer[nd->peer];
        int src = x->gpu_of_dev[gdev_of_part(x, nd->part)];
        int dst = x->gpu_of_dev[gdev_of_part(x, nd->peer)];
        return ps_cuda_memcpy_peer(ACT(x, i, b), dst, PACT(x, i, b), src,
                                   numel(x, i, b) * sizeof(float), s, x->d);
    }
    /* backward: part = the downstream partition (gradient source), peer = upstream */
    int b = x->spec->first_layer[nd->part];
    int src = x->gpu_of_dev[gdev_of_part(x, nd->part)];
    int dst = x->gpu_of_dev[gdev_of_part(x, nd->peer)];
    return ps_cuda_memcpy_peer(PGRAD(x, i, b), dst, GRAD(x, i, b), src,
                               numel(x, i, b) * sizeof(float), s, x->d);
}

static int stream_gpu(const struct xc *x, int32_t st)
{
    return x->gpu_of_dev[x->g->streams[st].device];
}

static int run_node(struct xc *x, uint32_t v)
{
    const struct ps_node *nd = &x->g->nodes[v];
    int32_t st = x->xstream[v];
    /* a no-op with a stream (r(i,j)) still waits and records where the plan says (X1) */
    if (st < 0 && (x->ev[v] || x->wait_off[v + 1] > x->wait_off[v])) st = nd->stream;
    if (st < 0) return 0; /* transparent */
    int rc = use_gpu(x, stream_gpu(x, st));
    if (rc) return rc;
    ps_cuda_stream s = x->stream[st];
    if (x->tracer && (rc = ps_cupti_push(x->tracer, v, x->d))) return rc;
    for (uint32_t k = x->wait_off[v]; k < x->wait_off[v + 1] && !rc; k++)
        rc = ps_cuda_stream_wait(s, x->ev[x->wait_node[k]], x->d);
    if (!rc) switch ((enum ps_node_kind)nd->kind) {
        case PS_NODE_COMPUTE:
            if (nd->phase == PS_PHASE_FWD)
                rc = task_forward(x, nd->mb, nd->part, !nd->checkpointed, false, v);
            else
                rc = task_backward(x, nd->mb, nd->part, v);
            break;
        case PS_NODE_RECOMPUTE:
            if (nd->phase == PS_PHASE_BWD) rc = task_forward(x, nd->mb, nd->part, true, true, v);
            break;
        case PS_NODE_COPY: rc = run_copy(x, nd, s); break;
        case PS_NODE_LOSS:
            if (nd->phase == PS_PHASE_FWD)
                for (int i = 0; i < x->m && rc == 0; i++) rc = loss_mb(x, i);
            break;
        default: break; /* waits: only the stream waits above */
        }
    if (!rc && x->ev[v]) rc = ps_cuda_event_record(x->ev[v], s, x->d);
    if (x->tracer) {
        int rc2 = ps_cupti_pop(x->tracer, x->d);
        if (!rc) rc = rc2;
    }
    return rc;
}

/* ---- ordering plan (X1, X2) ----------------------------------------------------------------- */

/* The stream a node's work runs on, or -1 when it is transparent (no device work). */
static int32_t exec_stream(const struct xc *x, uint32_t v)
{
    const struct ps_node *nd = &x->g->nodes[v];
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE:
    case PS_NODE_COPY:
    case PS_NODE_WAIT: return nd->stream;
    case PS_NODE_RECOMPUTE: return nd->phase == PS_PHASE_BWD ? nd->stream : -1;
    case PS_NODE_LOSS:
        return nd->phase == PS_PHASE_FWD ? x->compute_of[gdev_of_part(x, x->n - 1)] : -1;
    default: return -1;
    }
}

/* The device waits of the order (src/waits.h, X1): per node, the nodes whose events it waits
 * for, and an event for every node some other node waits for. */
static int plan_waits(struct xc *x, const struct ps_order *o)
{
    const struct ps_graph *g = x->g;
    uint32_t N = g->n_nodes;
    struct ps_waits w = {0};
    x->xstream = malloc((size_t)N * sizeof(int32_t));
    x->ev = calloc(N, sizeof(ps_cuda_event));
    x->wait_off = calloc((size_t)N + 1, sizeof(uint32_t));
    bool *need = calloc(N, sizeof(bool));
    int rc = 0;
    if (!x->xstream || !x->ev || !x->wait_off || !need)
        rc = ps_diag_set(x->d, -ENOMEM, "exec", "out of memory planning stream waits");
    for (uint32_t v = 0; !rc && v < N; v++) {
        x->xstream[v] = exec_stream(x, v);
        /* the waits go on the node's stream and the layers launch on their device's compute
           stream (and cuBLAS handle): the two must be one stream, or nothing orders the work */
        const struct ps_node *nd = &g->nodes[v];
        bool task = nd->kind == PS_NODE_COMPUTE ||
                    (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD);
        if (task && x->xstream[v] != x->compute_of[gdev_of_part(x, nd->part)]) {
            char a[64];
            rc = ps_diag_set(x->d, -EINVAL, "exec",
                             "%s is on stream %d, not on its device's compute stream %d",
                             ps_node_name(g, v, a, sizeof(a)), (int)x->xstream[v],
                             (int)x->compute_of[gdev_of_part(x, nd->part)]);
        }
    }
    if (!rc) rc = ps_waits_plan(g, o, &w, x->d);
    if (!rc && !(x->wait_node = malloc(((size_t)w.n_waits + 1) * sizeof(uint32_t))))
        rc = ps_diag_set(x->d, -ENOMEM, "exec", "out of memory planning stream waits");
    uint32_t nw = 0;
    for (uint32_t v = 0; !rc && v < N; v++) {
        x->wait_off[v] = nw;
        uint32_t k = o->pos[v];
        if (k == UINT32_MAX) continue;
        for (uint32_t q = w.off[k]; q < w.off[k + 1]; q++) {
            uint32_t u = o->node[w.at[q]];
            x->wait_node[nw++] = u;
            need[u] = true;
        }
    }
    if (!rc) x->wait_off[N] = nw;
    x->n_waits = nw;
    for (uint32_t v = 0; !rc && v < N; v++) {
        if (!need[v]) continue;
        rc = use_gpu(x, stream_gpu(x, g->nodes[v].stream));
        if (!rc) rc = ps_cuda_event_create(&x->ev[v], false, x->d);
        if (!rc) x->n_events++;
    }
    ps_waits_finish(&w);
    free(need);
    return rc;
}

/* ---- setup ------------------------------------------------------------------------------------ */

static int dalloc(struct xc *x, void **p, size_t bytes, int gpu)
{
    int rc = use_gpu(x, gpu);
    if (!rc) rc = ps_cuda_malloc(p, bytes, x->d);
    return rc;
}

static int h2d_sync(struct xc *x, void *dst, const void *src, size_t bytes, int gdev)
{
    int rc = ps_cuda_memcpy_h2d(dst, src, bytes, compute_stream(x, gdev), x->d);
    if (!rc) rc = ps_cuda_stream_sync(compute_stream(x, gdev), x->d);
    return rc;
}

static int d2h_sync(struct xc *x, void *dst, const void *src, size_t bytes, int gdev)
{
    int rc = use_gpu(x, x->gpu_of_dev[gdev]);
    if (!rc) rc = ps_cuda_memcpy_d2h(dst, src, bytes, compute_stream(x, gdev), x->d);
    if (!rc) rc = ps_cuda_stream_sync(compute_stream(x, gdev), x->d);
    return rc;
}

static int setup_devices(struct xc *x)
{
    const struct ps_graph *g = x->g;
    int ndev = x->spec->n_devices, rc = ps_cuda_probe(&x->n_gpus, x->d);
    if (rc) return rc;
    bool virt = x->co && x->co->virtual_devices;
    if (!virt && x->n_gpus < ndev) {
        rc = ps_diag_set(x->d, -ENODEV, "--backend cuda",
                         "the spec places partitions on %d devices but %d GPU%s found", ndev,
                         x->n_gpus, x->n_gpus == 1 ? " was" : "s were");
        ps_diag_hint(x->d, "run with --virtual-devices to give each device its own streams on "
                           "GPU 0");
        return rc;
    }
    x->gpu_of_dev = calloc((size_t)ndev, sizeof(int));
    x->run_gpus = calloc((size_t)ndev, sizeof(int));
    x->compute_of = malloc((size_t)ndev * sizeof(int32_t));
    x->blas = calloc((size_t)ndev, sizeof(*x->blas));
    x->stream = calloc((size_t)g->n_streams, sizeof(ps_cuda_stream));
    if (!x->gpu_of_dev || !x->run_gpus || !x->compute_of || !x->blas || !x->stream)
        return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory");
    for (int k = 0; k < ndev; k++) {
        x->gpu_of_dev[k] = virt ? 0 : k;
        x->compute_of[k] = -1;
    }
    x->n_run_gpus = virt ? 1 : ndev;
    for (int k = 0; k < x->n_run_gpus; k++) x->run_gpus[k] = k;
    x->cur_gpu = -1;
    /* peer access between the GPUs used (a failed enable falls back to staged copies) */
    for (int a = 0; !virt && a < ndev && !rc; a++)
        for (int b = 0; b < ndev && !rc; b++) {
            bool ok;
            if (a != b) rc = ps_cuda_enable_peer(a, b, &ok, x->d);
        }
    x->cur_gpu = -1;
    for (int32_t s = 0; s < g->n_streams && !rc; s++) {
        const struct ps_stream *st = &g->streams[s];
        rc = use_gpu(x, x->gpu_of_dev[st->device]);
        if (!rc) rc = ps_cuda_stream_create(&x->stream[s], x->d);
        if (!rc && st->kind == PS_STREAM_COMPUTE && x->compute_of[st->device] < 0)
            x->compute_of[st->device] = s;
    }
    for (int k = 0; k < ndev && !rc; k++) {
        if (x->compute_of[k] < 0)
            return ps_diag_set(x->d, -EINVAL, "exec", "device %d has no compute stream", k);
        rc = use_gpu(x, x->gpu_of_dev[k]);
        if (!rc) rc = ps_cuda_blas_create(&x->blas[k], x->stream[x->compute_of[k]], x->d);
    }
    return rc;
}

static int setup_buffers(struct xc *x, const struct ps_data *dt)
{
    int m = x->m, L = x->L, rc = 0;
    size_t na = (size_t)m * (size_t)(L + 1), ns = (size_t)m * (size_t)L;
    const struct ps_spec *spec = x->spec;
    x->act = calloc(na, sizeof(float *));
    x->pact = calloc(na, sizeof(float *));
    x->rpact = calloc(na, sizeof(float *));
    x->grad = calloc(na, sizeof(float *));
    x->pgrad = calloc(na, sizeof(float *));
    x->saved = calloc(ns, sizeof(struct saved));
    x->live = calloc(ns ? ns : 1, sizeof(bool));
    x->lay = calloc((size_t)L, sizeof(struct dlayer));
    x->loss_done = calloc((size_t)m, sizeof(bool));
    x->mb_off = calloc((size_t)m, sizeof(int64_t));
    x->h_loss = calloc((size_t)m, sizeof(double));
    if (!x->act || !x->pact || !x->rpact || !x->grad || !x->pgrad || !x->saved || !x->live ||
        !x->lay || !x->loss_done || !x->mb_off || !x->h_loss)
        return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory");
    int gl = x->gpu_of_dev[gdev_of_part(x, x->n - 1)], g0 = x->gpu_of_dev[gdev_of_part(x, 0)];
    int64_t mbmax = 1;
    for (int i = 0, off = 0; i < m; i++) {
        x->mb_off[i] = off;
        off += (int)x->mb_size[i];
        if (x->mb_size[i] > mbmax) mbmax = x->mb_size[i];
    }
    /* pinned inputs, device targets and losses */
    x->in_numel = dt->in_numel;
    rc = use_gpu(x, g0);
    if (!rc)
        rc = ps_cuda_host_alloc((void **)&x->h_x,
                                (size_t)(x->batch * dt->in_numel) * sizeof(float), x->d);
    if (!rc && dt->labels) {
        rc = ps_cuda_host_alloc((void **)&x->h_labels, (size_t)x->batch * sizeof(int64_t), x->d);
        if (!rc) rc = dalloc(x, (void **)&x->d_labels, (size_t)x->batch * sizeof(int64_t), gl);
    }
    if (!rc && dt->target == PS_TARGET_ROWS) {
        size_t bytes = (size_t)(x->batch * dt->out_numel) * sizeof(float);
        rc = ps_cuda_host_alloc((void **)&x->h_rows, bytes, x->d);
        if (!rc) rc = dalloc(x, (void **)&x->d_rows, bytes, gl);
    }
    if (!rc) rc = dalloc(x, (void **)&x->d_loss, (size_t)m * sizeof(double), gl);
    /* layer state */
    for (int l = 0; l < L && !rc; l++) {
        const struct ps_layer *ly = &spec->layers[l];
        const struct ps_layer_info *li = &x->model->layers[l];
        struct ps_layer_state *ls = &x->res->state.layers[l];
        struct dlayer *dl = &x->lay[l];
        dl->gdev = gdev_of_part(x, x->part_of[l]);
        dl->gpu = x->gpu_of_dev[dl->gdev];
        size_t nw = (size_t)ls->n_weight * sizeof(float), nb = (size_t)ls->n_bias * sizeof(float);
        if (ls->weight) {
            rc = dalloc(x, (void **)&dl->w, nw, dl->gpu);
            if (!rc) rc = dalloc(x, (void **)&dl->dw, nw, dl->gpu);
            if (!rc) rc = h2d_sync(x, dl->w, ls->weight, nw, dl->gdev);
        }
        if (!rc && ls->bias) {
            rc = dalloc(x, (void **)&dl->b, nb, dl->gpu);
            if (!rc) rc = dalloc(x, (void **)&dl->db, nb, dl->gpu);
            if (!rc) rc = h2d_sync(x, dl->b, ls->bias, nb, dl->gdev);
        }
        if (!rc && ly->op == PS_OP_BATCHNORM) {
            size_t C = (size_t)ls->channels, cb = C * sizeof(float);
            struct ps_cuda_bn *bn = &dl->bn;
            bn->channels = C;
            bn->eps = (float)ly->eps;
            bn->momentum = (float)ly->momentum;
            bn->cumulative = ly->momentum_null;
            bn->weight = dl->w;
            bn->bias = dl->b;
            bn->num_batches_tracked = ls->num_batches_tracked;
            rc = dalloc(x, (void **)&bn->running_mean, cb, dl->gpu);
            if (!rc) rc = dalloc(x, (void **)&bn->running_var, cb, dl->gpu);
            if (!rc) rc = h2d_sync(x, bn->running_mean, ls->running_mean, cb, dl->gdev);
            if (!rc) rc = h2d_sync(x, bn->running_var, ls->running_var, cb, dl->gdev);
            size_t S = (size_t)(li->in_numel / ls->channels);
            if (!rc)
                rc = dalloc(x, (void **)&bn->partial, ps_cuda_bn_scratch(C, (size_t)mbmax, S),
                            dl->gpu);
            dl->acc.channels = C;
            if (!rc) rc = dalloc(x, (void **)&dl->acc.sum, C * sizeof(double), dl->gpu);
            if (!rc) rc = dalloc(x, (void **)&dl->acc.sum_sq, C * sizeof(double), dl->gpu);
            if (!rc && ls->sum) rc = h2d_sync(x, dl->acc.sum, ls->sum, C * sizeof(double), dl->gdev);
            if (!rc && ls->sum_sq)
                rc = h2d_sync(x, dl->acc.sum_sq, ls->sum_sq, C * sizeof(double), dl->gdev);
            dl->acc.count = ls->count;
            dl->tracked = ls->tracked;
        }
        if (!rc && ly->op == PS_OP_CONV2D) {
            struct ps_conv2d_shape cs;
            ps_exec_conv_shape(&cs, ly, li, (size_t)mbmax);
            size_t want = ps_cuda_conv2d_workspace(&cs, (size_t)mbmax);
            size_t one = ps_cuda_conv2d_workspace(&cs, 1), cap = (size_t)256 << 20;
            if (want > cap) want = one > cap ? one : cap - cap % (one ? one : 1);
            rc = use_gpu(x, dl->gpu);
            if (!rc) rc = ps_cuda_blas_reserve(x->blas[dl->gdev], want, x->d);
            if (!rc && dl->b)
                rc = ps_cuda_blas_reserve_bias(x->blas[dl->gdev], cs.c_out, (size_t)mbmax,
                                               ps_cpu_conv2d_out_h(&cs) * ps_cpu_conv2d_out_w(&cs),
                                               x->d);
        }
        if (!rc && ly->op == PS_OP_LINEAR && dl->b) {
            rc = use_gpu(x, dl->gpu);
            if (!rc)
                rc = ps_cuda_blas_reserve_bias(x->blas[dl->gdev], (size_t)li->out_numel,
                                               (size_t)mbmax, 1, x->d);
        }
    }
    /* activations, gradients and saved tensors per micro-batch */
    for (int i = 0; i < m && !rc; i++) {
        for (int l = 0; l <= L && !rc; l++) {
            size_t bytes = numel(x, i, l) * sizeof(float);
            int gpu = l < L ? x->lay[l].gpu : gl;
            rc = dalloc(x, (void **)&ACT(x, i, l), bytes, gpu);
            if (!rc) rc = dalloc(x, (void **)&GRAD(x, i, l), bytes, gpu);
            if (!rc && boundary(x, l)) {
                int pg = x->lay[l - 1].gpu;
                rc = dalloc(x, (void **)&PACT(x, i, l), bytes, pg);
                uint32_t r = x->g->rec
                                 ? x->g->rec[(size_t)i * (size_t)x->n + (size_t)x->part_of[l - 1]]
                                 : PS_NONE;
                if (!rc && r != PS_NONE) rc = dalloc(x, (void **)&RPACT(x, i, l), bytes, pg);
                if (!rc) rc = dalloc(x, (void **)&PGRAD(x, i, l), bytes, pg);
            }
        }
        for (int l = 0; l < L && !rc; l++) {
            const struct ps_layer *ly = &spec->layers[l];
            const struct ps_layer_info *li = &x->model->layers[l];
            struct saved *sv = SAVED(x, i, l);
            size_t cnt = (size_t)x->mb_size[i];
            int gpu = x->lay[l].gpu;
            if (ly->op == PS_OP_BATCHNORM) {
                size_t cb = (size_t)li->channels * sizeof(float);
                rc = dalloc(x, (void **)&sv->bn_mean, cb, gpu);
                if (!rc) rc = dalloc(x, (void **)&sv->bn_invstd, cb, gpu);
            } else if (ly->op == PS_OP_MAXPOOL2D) {
                rc = dalloc(x, (void **)&sv->idx, cnt * (size_t)li->out_numel * sizeof(int32_t),
                            gpu);
            } else if (ly->op == PS_OP_DROPOUT) {
                rc = dalloc(x, (void **)&sv->mask, cnt * (size_t)li->out_numel, gpu);
            }
        }
    }
    /* the BN log slots: forward, recompute and commit mean/var of every (micro-batch, layer) */
    int ng = x->n_run_gpus;
    x->log_dev = calloc((size_t)ng + 1, sizeof(float *));
    x->log_host = calloc((size_t)ng + 1, sizeof(float *));
    x->log_len = calloc((size_t)ng + 1, sizeof(size_t));
    x->log_gdev = calloc((size_t)ng + 1, sizeof(int));
    if (!rc && (!x->log_dev || !x->log_host || !x->log_len || !x->log_gdev))
        rc = ps_diag_set(x->d, -ENOMEM, "exec", "out of memory");
    for (int l = 0; l < L && !rc; l++)
        if (spec->layers[l].op == PS_OP_BATCHNORM) {
            x->log_len[x->lay[l].gpu] += (size_t)m * 6 * (size_t)x->model->layers[l].channels;
            x->log_gdev[x->lay[l].gpu] = x->lay[l].gdev;
        }
    for (int k = 0; k < ng && !rc; k++) {
        if (!x->log_len[k]) continue;
        rc = dalloc(x, (void **)&x->log_dev[k], x->log_len[k] * sizeof(float), k);
        if (!rc && !(x->log_host[k] = malloc(x->log_len[k] * sizeof(float))))
            rc = ps_diag_set(x->d, -ENOMEM, "exec", "out of memory for the BN log");
        x->log_len[k] = 0; /* refilled below as slots are handed out */
    }
    for (int i = 0; i < m && !rc; i++)
        for (int l = 0; l < L; l++) {
            if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
            struct saved *sv = SAVED(x, i, l);
            int gpu = x->lay[l].gpu;
            size_t C = (size_t)x->model->layers[l].channels;
            for (int k = 0; k < 3; k++) {
                sv->log_mean[k] = x->log_dev[gpu] + x->log_len[gpu];
                sv->log_var[k] = sv->log_mean[k] + C;
                x->log_len[gpu] += 2 * C;
            }
        }
    return rc;
}

static void free_all(struct xc *x)
{
    size_t na = (size_t)x->m * (size_t)(x->L + 1), ns = (size_t)x->m * (size_t)x->L;
    const struct ps_graph *g = x->g;
    if (x->n_run_gpus > 0) (void)ps_cuda_sync_gpus(x->run_gpus, x->n_run_gpus, NULL);
    for (size_t k = 0; k < na; k++) {
        if (x->act) ps_cuda_free(x->act[k]);
        if (x->pact) ps_cuda_free(x->pact[k]);
        if (x->rpact) ps_cuda_free(x->rpact[k]);
        if (x->grad) ps_cuda_free(x->grad[k]);
        if (x->pgrad) ps_cuda_free(x->pgrad[k]);
    }
    for (size_t k = 0; x->saved && k < ns; k++) {
        struct saved *sv = &x->saved[k];
        ps_cuda_free(sv->bn_mean);
        ps_cuda_free(sv->bn_invstd);
        for (int q = 0; q < 3; q++) {
            sv->log_mean[q] = sv->log_var[q] = NULL; /* in log_dev */
        }
        ps_cuda_free(sv->idx);
        ps_cuda_free(sv->mask);
    }
    for (int l = 0; x->lay && l < x->L; l++) {
        struct dlayer *dl = &x->lay[l];
        ps_cuda_free(dl->w);
        ps_cuda_free(dl->b);
        ps_cuda_free(dl->dw);
        ps_cuda_free(dl->db);
        ps_cuda_free(dl->bn.running_mean);
        ps_cuda_free(dl->bn.running_var);
        ps_cuda_free(dl->bn.partial);
        ps_cuda_free(dl->acc.sum);
        ps_cuda_free(dl->acc.sum_sq);
    }
    ps_cuda_host_free(x->h_x);
    ps_cuda_host_free(x->h_labels);
    ps_cuda_host_free(x->h_rows);
    ps_cuda_free(x->d_labels);
    ps_cuda_free(x->d_rows);
    ps_cuda_free(x->d_loss);
    for (uint32_t v = 0; x->ev && v < g->n_nodes; v++) ps_cuda_event_destroy(x->ev[v]);
    for (int k = 0; x->blas && k < x->spec->n_devices; k++)
        if (x->blas[k]) { /* cuBLAS releases its resources on the handle's device */
            (void)ps_cuda_set_device(x->gpu_of_dev[k], NULL);
            ps_cuda_blas_destroy(x->blas[k]);
        }
    for (int32_t s = 0; x->stream && s < g->n_streams; s++) ps_cuda_stream_destroy(x->stream[s]);
    free(x->act);
    free(x->pact);
    free(x->rpact);
    free(x->grad);
    free(x->pgrad);
    free(x->saved);
    free(x->live);
    free(x->lay);
    free(x->loss_done);
    free(x->mb_off);
    free(x->h_loss);
    free(x->xstream);
    free(x->ev);
    free(x->wait_off);
    free(x->wait_node);
    free(x->pend);
    free(x->part_of);
    for (int k = 0; k < x->n_run_gpus; k++) {
        if (x->log_dev) ps_cuda_free(x->log_dev[k]);
        if (x->log_host) free(x->log_host[k]);
    }
    free(x->log_dev);
    free(x->log_host);
    free(x->log_len);
    free(x->log_gdev);
    free(x->gpu_of_dev);
    free(x->run_gpus);
    free(x->compute_of);
    free(x->blas);
    free(x->stream);
}

/* ---- the step -------------------------------------------------------------------------------- */

static int zero_grads(struct xc *x)
{
    int rc = 0;
    for (int l = 0; l < x->L && !rc; l++) {
        struct dlayer *dl = &x->lay[l];
        struct ps_layer_state *ls = &x->res->state.layers[l];
        ps_cuda_stream s = compute_stream(x, dl->gdev);
        rc = use_gpu(x, dl->gpu);
        if (!rc && dl->dw)
            rc = ps_cuda_memset(dl->dw, 0, (size_t)ls->n_weight * sizeof(float), s, x->d);
        if (!rc && dl->db)
            rc = ps_cuda_memset(dl->db, 0, (size_t)ls->n_bias * sizeof(float), s, x->d);
    }
    return rc;
}

static int sgd_all(struct xc *x)
{
    int rc = 0;
    float lr = (float)x->spec->lr;
    for (int l = 0; l < x->L && !rc; l++) {
        struct dlayer *dl = &x->lay[l];
        struct ps_layer_state *ls = &x->res->state.layers[l];
        ps_cuda_stream s = compute_stream(x, dl->gdev);
        rc = use_gpu(x, dl->gpu);
        if (!rc && dl->dw) rc = ps_cuda_sgd_step(dl->w, dl->dw, (size_t)ls->n_weight, lr, s, x->d);
        if (!rc && dl->db) rc = ps_cuda_sgd_step(dl->b, dl->db, (size_t)ls->n_bias, lr, s, x->d);
    }
    return rc;
}

/* After the step's final sync: losses and BN log from the GPU. */
static int collect_step(struct xc *x, double *loss)
{
    double dl[64], *buf = x->m <= 64 ? dl : malloc((size_t)x->m * sizeof(double));
    if (!buf) return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory");
    int gdev = gdev_of_part(x, x->n - 1);
    int rc = d2h_sync(x, buf, x->d_loss, (size_t)x->m * sizeof(double), gdev);
    *loss = 0.0;
    for (int i = 0; i < x->m && !rc; i++) *loss += buf[i] * x->h_loss[i];
    if (buf != dl) free(buf);
    /* one copy of each GPU's log array, then the step's entries from it (X5) */
    for (int k = 0; k < x->n_run_gpus && !rc; k++) {
        bool any = false;
        for (size_t q = 0; q < x->n_pend && !any; q++) any = x->pend[q].gpu == k;
        if (any)
            rc = d2h_sync(x, x->log_host[k], x->log_dev[k], x->log_len[k] * sizeof(float),
                          x->log_gdev[k]);
    }
    for (size_t k = 0; k < x->n_pend && !rc; k++) {
        struct pending_log *p = &x->pend[k];
        struct ps_exec_bn_update *u = &x->res->bn[p->entry];
        const float *h = x->log_host[p->gpu];
        memcpy(u->mean, h + (p->mean - x->log_dev[p->gpu]), p->C * sizeof(float));
        memcpy(u->var, h + (p->var - x->log_dev[p->gpu]), p->C * sizeof(float));
    }
    x->n_pend = 0;
    return rc;
}

/* Device records of the traced step -> one trace record per node (first start to last end),
 * plus one per kernel/copy when asked. */
static int build_trace(struct xc *x, const struct ps_cupti_result *cr)
{
    const struct ps_graph *g = x->g;
    uint32_t N = g->n_nodes;
    int64_t *lo = malloc((size_t)N * sizeof(int64_t)), *hi = malloc((size_t)N * sizeof(int64_t));
    if (!lo || !hi) {
        free(lo);
        free(hi);
        return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory for the trace");
    }
    for (uint32_t v = 0; v < N; v++) {
        lo[v] = INT64_MAX;
        hi[v] = INT64_MIN;
    }
    int rc = 0;
    for (size_t k = 0; k < cr->n && !rc; k++) {
        const struct ps_cupti_rec *r = &cr->r[k];
        bool dev = r->kind == PS_CUPTI_KERNEL || r->kind == PS_CUPTI_MEMCPY ||
                   r->kind == PS_CUPTI_MEMCPY_PEER || r->kind == PS_CUPTI_MEMSET;
        if (!dev || r->external >= N) continue;
        uint32_t v = (uint32_t)r->external;
        if (r->start_ns < lo[v]) lo[v] = r->start_ns;
        if (r->end_ns > hi[v]) hi[v] = r->end_ns;
        if (x->co && x->co->kernel_records)
            rc = ps_trace_add(&x->res->trace, v, g->nodes[v].device, x->xstream[v],
                              (double)r->start_ns * 1e-3, (double)(r->end_ns - r->start_ns) * 1e-3,
                              r->name ? r->name : ps_cupti_kind_name((enum ps_cupti_kind)r->kind));
    }
    for (uint32_t v = 0; v < N && !rc; v++)
        if (lo[v] != INT64_MAX)
            rc = ps_trace_add(&x->res->trace, v, g->nodes[v].device, x->xstream[v],
                              (double)lo[v] * 1e-3, (double)(hi[v] - lo[v]) * 1e-3, NULL);
    x->res->trace.dropped = cr->dropped;
    free(lo);
    free(hi);
    if (rc) return ps_diag_set(x->d, -ENOMEM, "exec", "out of memory for the trace");
    return 0;
}

static int copy_state_back(struct xc *x)
{
    int rc = 0;
    for (int l = 0; l < x->L && !rc; l++) {
        struct dlayer *dl = &x->lay[l];
        struct ps_layer_state *ls = &x->res->state.layers[l];
        size_t nw = (size_t)ls->n_weight * sizeof(float), nb = (size_t)ls->n_bias * sizeof(float);
        if (dl->w) rc = d2h_sync(x, ls->weight, dl->w, nw, dl->gdev);
        if (!rc && dl->dw && ls->dweight) rc = d2h_sync(x, ls->dweight, dl->dw, nw, dl->gdev);
        if (!rc && dl->b) rc = d2h_sync(x, ls->bias, dl->b, nb, dl->gdev);
        if (!rc && dl->db && ls->dbias) rc = d2h_sync(x, ls->dbias, dl->db, nb, dl->gdev);
        if (!rc && dl->bn.running_mean) {
            size_t cb = dl->bn.channels * sizeof(float), cd = dl->bn.channels * sizeof(double);
            rc = d2h_sync(x, ls->running_mean, dl->bn.running_mean, cb, dl->gdev);
            if (!rc) rc = d2h_sync(x, ls->running_var, dl->bn.running_var, cb, dl->gdev);
            if (!rc && ls->sum) rc = d2h_sync(x, ls->sum, dl->acc.sum, cd, dl->gdev);
            if (!rc && ls->sum_sq) rc = d2h_sync(x, ls->sum_sq, dl->acc.sum_sq, cd, dl->gdev);
            ls->num_batches_tracked = dl->bn.num_batches_tracked;
            ls->count = dl->acc.count;
            ls->tracked = dl->tracked;
        }
    }
    return rc;
}

int ps_exec_cuda_available(struct ps_diag *d)
{
    int n = 0;
    return ps_cuda_probe(&n, d);
}

int ps_exec_cuda_run(const struct ps_graph *g, const struct ps_order *order,
                     const struct ps_exec_opts *o, const struct ps_exec_cuda_opts *co,
                     struct ps_exec_result *res, struct ps_exec_cuda_stats *stats,
                     struct ps_diag *d)
{
    memset(res, 0, sizeof(*res));
    if (stats) memset(stats, 0, sizeof(*stats));
    struct ps_exec_opts defo;
    if (!o) {
        ps_exec_opts_init(&defo);
        o = &defo;
    }
    const struct ps_spec *spec = g->spec;
    if (!spec || !g->model)
        return ps_diag_set(d, -EINVAL, "exec", "the graph has no spec or model to run");
    for (uint32_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].kind == PS_NODE_WGRAD)
            return ps_diag_set(d, -ENOTSUP, "--backend cuda",
                               "the cuda executor does not split backward into B and W (zb-h1)");
    int rc = ps_exec_cuda_available(d);
    if (rc) return rc;
    struct ps_exec_setup su;
    rc = ps_exec_setup(&su, g, order, o, PS_TRACE_CUDA, res, d);
    order = su.order;
    int steps = su.steps;
    struct xc x;
    memset(&x, 0, sizeof(x));
    x.g = g;
    x.spec = spec;
    x.model = g->model;
    x.co = co;
    x.res = res;
    x.d = d;
    x.L = spec->n_layers;
    x.m = g->m;
    x.n = g->n;
    x.chunks = g->var.chunks;
    x.batch = spec->batch;
    x.mb_size = g->mb_size;
    x.part_of = malloc((size_t)x.L * sizeof(int));
    if (!rc && !x.part_of) rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory");
    for (int j = 0; !rc && j < x.n; j++)
        for (int l = spec->first_layer[j]; l < spec->first_layer[j] + spec->balance[j]; l++)
            x.part_of[l] = j;
    if (!rc) rc = setup_devices(&x);
    if (!rc) rc = setup_buffers(&x, &su.data);
    if (!rc) rc = plan_waits(&x, order);
    if (!rc) rc = zero_grads(&x);
    if (!rc) rc = ps_cuda_sync_gpus(x.run_gpus, x.n_run_gpus, d);
    struct timespec run0, t0;
    clock_gettime(CLOCK_MONOTONIC, &run0);
    for (int s = 0; s < steps && !rc; s++) {
        x.step = s;
        /* the mini-batch first: drawing synthetic data is not the step's work */
        ps_data_batch(&su.data, s, x.batch, x.h_x, x.h_labels, x.h_rows);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < x.m; i++) x.loss_done[i] = false;
        memset(x.live, 0, (size_t)x.m * (size_t)x.L * sizeof(bool));
        bool traced = o->trace && s == steps - 1;
        if (traced) rc = ps_cupti_start(&x.tracer, d);
        for (uint32_t k = 0; k < order->n && !rc; k++)
            if (!o->forward_only || g->nodes[order->node[k]].phase == PS_PHASE_FWD)
                rc = run_node(&x, order->node[k]);
        if (x.tracer) {
            struct ps_cupti_result cr;
            int rc2 = ps_cuda_sync_gpus(x.run_gpus, x.n_run_gpus, rc ? NULL : d);
            if (!rc2) rc2 = ps_cupti_stop(x.tracer, &cr, rc ? NULL : d);
            else (void)ps_cupti_stop(x.tracer, &cr, NULL);
            x.tracer = NULL;
            if (!rc) rc = rc2;
            if (!rc) rc = build_trace(&x, &cr);
            if (!rc && stats) {
                stats->cupti_records = cr.n;
                stats->dropped = cr.dropped;
                stats->unmapped = cr.unmapped;
                stats->no_time = cr.no_time;
            }
            ps_cupti_result_finish(&cr);
        }
        if (!rc && !o->forward_only) rc = sgd_all(&x);
        bool last = s == steps - 1;
        if (!rc) rc = ps_cuda_sync_gpus(x.run_gpus, x.n_run_gpus, d);
        if (!rc) rc = collect_step(&x, &res->loss[s]);
        if (!rc && last) rc = copy_state_back(&x); /* grads of the last step, as the cpu */
        if (!rc && !last) rc = zero_grads(&x);
        res->step_us[s] = ps_exec_now_us(&t0);
        if (!rc) rc = ps_exec_check_loss(res, s, spec, d);
    }
    res->total_us = ps_exec_now_us(&run0);
    if (x.tracer) { /* an error left it running */
        struct ps_cupti_result cr;
        (void)ps_cupti_stop(x.tracer, &cr, NULL);
        ps_cupti_result_finish(&cr);
    }
    if (stats) {
        stats->gpus = co && co->virtual_devices ? 1 : spec->n_devices;
        stats->events = x.n_events;
        stats->waits = x.n_waits;
    }
    free_all(&x);
    ps_exec_setup_finish(&su);
    if (rc) ps_exec_result_finish(res);
    return rc;
}
