/* exec_cpu: the `cpu` executor. Runs the task graph node by node in the order of a ps_order,
 * with the reference kernels of kernels/cpu, and reproduces torchgpipe's numerics.
 *
 * Buffers (allocated once per run, indexed by micro-batch i and layer l, L layers):
 *
 *     act[i][0] --layer 0--> act[i][1] --layer 1--> ... --layer L-1--> act[i][L]   (output)
 *     grad[i][l] = dLoss/d act[i][l], written by B from grad[i][l+1]
 *     saved[i][l] = what layer l keeps for backward: BN mean/invstd, pool indices, dropout mask
 *
 * Partition j owns layers [f, f+c). Its boundary tensors act[i][f] (input) and act[i][f+c]
 * (output, the next partition's input) always stay; the copies between partitions are no-ops
 * (one address space) and are not timed.
 *
 * Invariants per step:
 *   E1. live[i][l] says whether layer l's output and saved tensors for micro-batch i are those of
 *       a forward with grad. A checkpointed F(i,j) runs with grad off and then drops them (live =
 *       false, as torchgpipe keeps only the input); R(i,j) re-runs the forward with grad on and
 *       makes them live; B(i,j) refuses to run on anything not live.
 *   E2. BatchNorm running statistics change only as SEMANTICS.md section 7 says for
 *       g->var.batchnorm, and every change appends one ps_bn_update, in execution order:
 *         plain      every training forward, grad or not (F, and R again)     TRAIN
 *         deferred   F only (never R): accumulate; commit when `chunks` micro-batches were
 *                    tracked (the count persists across steps, as torchgpipe's module state)
 *         grad-only  forwards with grad only: F of a non-checkpointed task, and R
 *   E3. Dropout masks are a pure function of (seed, step, layer, micro-batch), so R reproduces
 *       F's mask exactly (torchgpipe restores the RNG state for the same effect).
 *   E4. The loss is that of the gathered mini-batch (sum | mse mean | cross_entropy mean over all
 *       N samples), computed per micro-batch with the mini-batch's normaliser, so the gradient of
 *       micro-batch i is ready as soon as its output is.
 *   E5. Parameter gradients accumulate over micro-batches and are zeroed before each step; the
 *       SGD step p -= lr * grad runs after every node of the order has run.
 */
#include "kernels/exec.h"
#include "kernels/exec_cuda.h"
#include "kernels/exec_priv.h"
#include "src/memlimit.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_config.h"

struct saved {
    float *bn_mean, *bn_invstd; /* BN: C each */
    int32_t *idx;               /* maxpool: per output element */
    uint8_t *mask;              /* dropout: per element */
};

struct exec {
    const struct ps_graph *g;
    const struct ps_spec *spec;
    const struct ps_model *model;
    struct ps_exec_result *res;
    struct ps_diag *d;
    int L, m, n, step, chunks;
    int ckpt_stop;
    int64_t batch, *mb_off, *mb_size;
    float **act, **grad;     /* [(i * (L + 1)) + l] */
    struct saved *saved;     /* [i * L + l] */
    bool *live;              /* [i * L + l] */
    float *xbatch, *rows;    /* the step's mini-batch */
    int64_t *labels;
    double *mb_loss;         /* per micro-batch contribution to the loss */
    bool *loss_done;         /* per micro-batch: loss and output gradient computed */
    double *tmp_mean, *tmp_var; /* BN statistics for the log (max channels) */
    struct timespec t0;      /* start of the step */
};

static size_t act_numel(const struct exec *ex, int i, int l)
{
    int64_t per = l < ex->L ? ex->model->layers[l].in_numel : ex->model->out_numel;
    return (size_t)(per * ex->mb_size[i]);
}

#define ACT(ex, i, l) ((ex)->act[(size_t)(i) * (size_t)((ex)->L + 1) + (size_t)(l)])
#define GRAD(ex, i, l) ((ex)->grad[(size_t)(i) * (size_t)((ex)->L + 1) + (size_t)(l)])
#define SAVED(ex, i, l) (&(ex)->saved[(size_t)(i) * (size_t)(ex)->L + (size_t)(l)])
#define LIVE(ex, i, l) ((ex)->live[(size_t)(i) * (size_t)(ex)->L + (size_t)(l)])

/* ---- BN log ---------------------------------------------------------------------------- */

static int log_update(struct exec *ex, int l, int i, enum ps_exec_bn_phase ph, uint32_t node,
                      int64_t count, double factor, const double *mean, const double *var,
                      size_t C)
{
    struct ps_exec_bn_update *u;
    int rc = ps_exec_bn_log(ex->res, l, ex->step, i, ph, node, count, factor, C, &u, ex->d);
    if (rc) return rc;
    for (size_t c = 0; c < C; c++) {
        u->mean[c] = (float)mean[c];
        u->var[c] = (float)var[c];
    }
    return 0;
}

/* per-channel mean and UNBIASED variance of [n, C, S] (two passes, double) */
static void channel_stats(const float *x, size_t n, size_t C, size_t S, double *mean, double *var)
{
    double m = (double)(n * S);
    for (size_t c = 0; c < C; c++) {
        double s = 0.0;
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < S; k++) s += x[(i * C + c) * S + k];
        double mu = s / m, q = 0.0;
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < S; k++) {
                double t = x[(i * C + c) * S + k] - mu;
                q += t * t;
            }
        mean[c] = mu;
        var[c] = m > 1 ? q / (m - 1) : 0.0;
    }
}

/* ---- layers ------------------------------------------------------------------------------ */

static void bn_view(struct ps_bn *bn, const struct ps_layer *l, struct ps_layer_state *ls)
{
    memset(bn, 0, sizeof(*bn));
    bn->channels = (size_t)ls->channels;
    bn->eps = (float)l->eps;
    bn->momentum = (float)l->momentum;
    bn->cumulative = l->momentum_null;
    bn->weight = ls->weight;
    bn->bias = ls->bias;
    bn->running_mean = ls->running_mean;
    bn->running_var = ls->running_var;
    bn->num_batches_tracked = ls->num_batches_tracked;
}

/* Forward of layer l for micro-batch i. grad: autograd records (a forward with grad);
 * recompute: this is R(i,j). */
static int layer_forward(struct exec *ex, int i, int l, bool grad, bool recompute, uint32_t node)
{
    const struct ps_layer *ly = &ex->spec->layers[l];
    const struct ps_layer_info *li = &ex->model->layers[l];
    struct ps_layer_state *ls = &ex->res->state.layers[l];
    struct saved *sv = SAVED(ex, i, l);
    size_t n = (size_t)ex->mb_size[i];
    const float *x = ACT(ex, i, l);
    float *y = ACT(ex, i, l + 1);
    int rc = 0;
    switch (ly->op) {
    case PS_OP_LINEAR:
        rc = ps_cpu_linear_forward(x, ls->weight, ls->bias, y, n, (size_t)li->in_numel,
                                   (size_t)li->out_numel);
        if (rc) rc = ps_diag_set(ex->d, rc, "exec", "linear layer %d: out of memory", l);
        break;
    case PS_OP_CONV2D: {
        struct ps_conv2d_shape s;
        ps_exec_conv_shape(&s, ly, li, n);
        rc = ps_cpu_conv2d_forward(&s, x, ls->weight, ls->bias, y, ex->d);
        break;
    }
    case PS_OP_MAXPOOL2D: {
        struct ps_pool2d_shape s;
        ps_exec_pool_shape(&s, ly, li, n);
        rc = ps_cpu_maxpool2d_forward(&s, x, y, sv->idx, ex->d);
        break;
    }
    case PS_OP_RELU: ps_cpu_relu_forward(x, y, n * (size_t)li->in_numel); break;
    case PS_OP_FLATTEN: memcpy(y, x, n * (size_t)li->in_numel * sizeof(float)); break;
    case PS_OP_DROPOUT: {
        ps_cpu_dropout_forward(x, y, sv->mask, n * (size_t)li->in_numel, (float)ly->p,
                               ps_exec_dropout_seed(ex->spec),
                               ps_exec_dropout_offset(ex->step, ex->L, ex->m, l, i));
        break;
    }
    case PS_OP_BATCHNORM: {
        struct ps_bn bn;
        bn_view(&bn, ly, ls);
        size_t C = (size_t)ls->channels, S = (size_t)(li->in_numel / ls->channels);
        enum ps_bn_mode mode = ps_exec_bn_mode(ex->g->var.batchnorm, grad);
        if (ex->g->var.batchnorm == PS_BN_DEFERRED && !recompute) {
            /* torchgpipe DeferredBatchNorm._track, then _commit when tracked == chunks */
            struct ps_bn_accum acc = {.channels = C, .sum = ls->sum, .sum_sq = ls->sum_sq,
                                      .count = ls->count};
            ps_cpu_bn_accumulate(&acc, x, n, S);
            ls->count = acc.count;
            ls->tracked++;
            if (ls->tracked == ex->chunks) {
                for (size_t c = 0; c < C; c++) {
                    ex->tmp_mean[c] = ls->sum[c] / (double)ls->count;
                    ex->tmp_var[c] =
                        ls->sum_sq[c] / (double)ls->count - ex->tmp_mean[c] * ex->tmp_mean[c];
                }
                int64_t cnt = ls->count;
                if ((rc = ps_cpu_bn_commit(&bn, &acc, ex->d))) break;
                ls->count = 0;
                ls->tracked = 0;
                ls->num_batches_tracked = bn.num_batches_tracked;
                rc = log_update(ex, l, i, PS_EXEC_BN_COMMIT, node, cnt,
                                ps_cpu_bn_factor(&bn, bn.num_batches_tracked), ex->tmp_mean,
                                ex->tmp_var, C);
                if (rc) break;
            }
        }
        if (mode == PS_BN_TRAIN) channel_stats(x, n, C, S, ex->tmp_mean, ex->tmp_var);
        rc = ps_cpu_bn_forward(&bn, mode, x, y, n, S, sv->bn_mean, sv->bn_invstd, ex->d);
        if (rc) {
            char where[64];
            snprintf(where, sizeof(where), "layer %d (batchnorm), micro-batch %d", l, i);
            snprintf(ex->d->where, sizeof(ex->d->where), "%s", where);
            break;
        }
        if (mode == PS_BN_TRAIN) {
            ls->num_batches_tracked = bn.num_batches_tracked;
            rc = log_update(ex, l, i, recompute ? PS_EXEC_BN_RECOMPUTE : PS_EXEC_BN_FORWARD,
                            node, (int64_t)(n * S), ps_cpu_bn_factor(&bn, bn.num_batches_tracked),
                            ex->tmp_mean, ex->tmp_var, C);
        }
        break;
    }
    case PS_OP__COUNT: rc = ps_diag_set(ex->d, -EINVAL, "exec", "layer %d: unknown op", l); break;
    }
    return rc;
}

static int layer_backward(struct exec *ex, int i, int l)
{
    const struct ps_layer *ly = &ex->spec->layers[l];
    const struct ps_layer_info *li = &ex->model->layers[l];
    struct ps_layer_state *ls = &ex->res->state.layers[l];
    struct saved *sv = SAVED(ex, i, l);
    size_t n = (size_t)ex->mb_size[i];
    const float *x = ACT(ex, i, l), *y = ACT(ex, i, l + 1), *dy = GRAD(ex, i, l + 1);
    float *dx = l > 0 ? GRAD(ex, i, l) : NULL; /* the model input needs no gradient */
    size_t cnt = n * (size_t)li->in_numel;
    int rc = 0;
    switch (ly->op) {
    case PS_OP_LINEAR:
        rc = ps_cpu_linear_backward(x, ls->weight, dy, dx, ls->dweight, ls->dbias, n,
                                    (size_t)li->in_numel, (size_t)li->out_numel);
        if (rc) rc = ps_diag_set(ex->d, rc, "exec", "linear layer %d: out of memory", l);
        break;
    case PS_OP_CONV2D: {
        struct ps_conv2d_shape s;
        ps_exec_conv_shape(&s, ly, li, n);
        rc = ps_cpu_conv2d_backward(&s, x, ls->weight, dy, dx, ls->dweight, ls->dbias, ex->d);
        break;
    }
    case PS_OP_MAXPOOL2D: {
        if (!dx) break;
        struct ps_pool2d_shape s;
        ps_exec_pool_shape(&s, ly, li, n);
        ps_cpu_maxpool2d_backward(&s, dy, sv->idx, dx);
        break;
    }
    case PS_OP_RELU:
        if (dx) ps_cpu_relu_backward(y, dy, dx, cnt);
        break;
    case PS_OP_FLATTEN:
        if (dx) memcpy(dx, dy, cnt * sizeof(float));
        break;
    case PS_OP_DROPOUT:
        if (dx) ps_cpu_dropout_backward(dy, sv->mask, dx, cnt, (float)ly->p);
        break;
    case PS_OP_BATCHNORM: {
        struct ps_bn bn;
        bn_view(&bn, ly, ls);
        size_t S = (size_t)(li->in_numel / ls->channels);
        ps_cpu_bn_backward(&bn, true, x, dy, sv->bn_mean, sv->bn_invstd, dx, ls->dweight,
                           ls->dbias, n, S);
        break;
    }
    case PS_OP__COUNT: break;
    }
    return rc;
}

/* ---- loss (E4) ------------------------------------------------------------------------------ */

static int loss_mb(struct exec *ex, int i)
{
    if (ex->loss_done[i]) return 0;
    size_t n = (size_t)ex->mb_size[i], K = (size_t)ex->model->out_numel;
    const float *out = ACT(ex, i, ex->L);
    float *dout = GRAD(ex, i, ex->L);
    double N = (double)ex->batch;
    int rc = 0;
    switch (ex->spec->loss) {
    case PS_LOSS_SUM:
        ex->mb_loss[i] = ps_cpu_loss_sum_forward(out, n * K);
        ps_cpu_loss_sum_backward(dout, n * K, 1.0f);
        break;
    case PS_LOSS_MSE: {
        const float *t = ex->rows + ex->mb_off[i] * (int64_t)K;
        double share = (double)n / N;
        ex->mb_loss[i] = ps_cpu_loss_mse_forward(out, t, n * K) * share;
        ps_cpu_loss_mse_backward(out, t, dout, n * K, (float)share);
        break;
    }
    case PS_LOSS_CROSS_ENTROPY: {
        const int64_t *lab = ex->labels + ex->mb_off[i];
        double share = (double)n / N, v = 0.0;
        rc = ps_cpu_loss_cross_entropy_forward(out, lab, n, K, &v, ex->d);
        if (!rc) rc = ps_cpu_loss_cross_entropy_backward(out, lab, dout, n, K, (float)share, ex->d);
        ex->mb_loss[i] = v * share;
        break;
    }
    }
    ex->loss_done[i] = rc == 0;
    return rc;
}

/* ---- tasks ----------------------------------------------------------------------------------- */

static int task_forward(struct exec *ex, int i, int j, bool grad, bool recompute, uint32_t node)
{
    int f = ex->spec->first_layer[j], c = ex->spec->balance[j];
    for (int l = f; l < f + c; l++) {
        int rc = layer_forward(ex, i, l, grad, recompute, node);
        if (rc) return rc;
        LIVE(ex, i, l) = grad;
    }
    return 0;
}

static int task_backward(struct exec *ex, int i, int j, uint32_t node)
{
    int f = ex->spec->first_layer[j], c = ex->spec->balance[j];
    int rc = ps_exec_check_live(ex->g, node, &LIVE(ex, i, 0), f, c, ex->d);
    if (rc) return rc;
    if (j == ex->n - 1 && (rc = loss_mb(ex, i))) return rc;
    for (int l = f + c - 1; l >= f; l--)
        if ((rc = layer_backward(ex, i, l))) return rc;
    for (int l = f; l < f + c; l++) LIVE(ex, i, l) = false; /* backward frees the graph */
    return 0;
}

static int run_node(struct exec *ex, uint32_t v, bool record)
{
    const struct ps_node *nd = &ex->g->nodes[v];
    bool timed = false;
    double t = 0.0;
    int rc = 0;
    if (record && ps_node_is_task(nd)) {
        timed = true;
        t = ps_exec_now_us(&ex->t0);
    }
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE:
        if (nd->phase == PS_PHASE_FWD)
            rc = task_forward(ex, nd->mb, nd->part, !nd->checkpointed, false, v);
        else
            rc = task_backward(ex, nd->mb, nd->part, v);
        break;
    case PS_NODE_RECOMPUTE:
        if (nd->phase == PS_PHASE_BWD) rc = task_forward(ex, nd->mb, nd->part, true, true, v);
        break;
    case PS_NODE_LOSS:
        if (nd->phase == PS_PHASE_FWD)
            for (int i = 0; i < ex->m && rc == 0; i++) rc = loss_mb(ex, i);
        break;
    default: break; /* copies, waits, fork/join: no work in one address space */
    }
    if (timed && rc == 0) {
        double e = ps_exec_now_us(&ex->t0);
        if (ps_trace_add(&ex->res->trace, v, nd->device, nd->stream, t, e - t, NULL))
            rc = ps_diag_set(ex->d, -ENOMEM, "exec", "out of memory for the trace");
    }
    return rc;
}

/* ---- setup and the step loop ----------------------------------------------------------------- */

static void free_buffers(struct exec *ex)
{
    size_t na = (size_t)ex->m * (size_t)(ex->L + 1), ns = (size_t)ex->m * (size_t)ex->L;
    if (ex->act)
        for (size_t k = 0; k < na; k++) free(ex->act[k]);
    if (ex->grad)
        for (size_t k = 0; k < na; k++) free(ex->grad[k]);
    if (ex->saved)
        for (size_t k = 0; k < ns; k++) {
            free(ex->saved[k].bn_mean);
            free(ex->saved[k].bn_invstd);
            free(ex->saved[k].idx);
            free(ex->saved[k].mask);
        }
    free(ex->act);
    free(ex->grad);
    free(ex->saved);
    free(ex->live);
    free(ex->xbatch);
    free(ex->rows);
    free(ex->labels);
    free(ex->mb_loss);
    free(ex->loss_done);
    free(ex->mb_off);
    free(ex->tmp_mean);
    free(ex->tmp_var);
}

static int alloc_buffers(struct exec *ex, const struct ps_data *dt)
{
    int m = ex->m, L = ex->L;
    size_t na = (size_t)m * (size_t)(L + 1), ns = (size_t)m * (size_t)L;
    ex->act = calloc(na, sizeof(float *));
    ex->grad = calloc(na, sizeof(float *));
    ex->saved = calloc(ns, sizeof(struct saved));
    ex->live = calloc(ns, sizeof(bool));
    ex->mb_loss = calloc((size_t)m, sizeof(double));
    ex->loss_done = calloc((size_t)m, sizeof(bool));
    ex->mb_off = calloc((size_t)m, sizeof(int64_t));
    ex->xbatch = malloc((size_t)(ex->batch * dt->in_numel) * sizeof(float));
    if (dt->labels) ex->labels = malloc((size_t)ex->batch * sizeof(int64_t));
    if (dt->rows) ex->rows = malloc((size_t)(ex->batch * dt->out_numel) * sizeof(float));
    int64_t maxc = 1;
    for (int l = 0; l < L; l++)
        if (ex->model->layers[l].channels > maxc) maxc = ex->model->layers[l].channels;
    ex->tmp_mean = malloc((size_t)maxc * sizeof(double));
    ex->tmp_var = malloc((size_t)maxc * sizeof(double));
    if (!ex->act || !ex->grad || !ex->saved || !ex->live || !ex->mb_loss || !ex->loss_done ||
        !ex->mb_off || !ex->xbatch || (dt->labels && !ex->labels) || (dt->rows && !ex->rows) ||
        !ex->tmp_mean || !ex->tmp_var)
        return -ENOMEM;
    int64_t off = 0;
    for (int i = 0; i < m; i++) {
        ex->mb_off[i] = off;
        off += ex->mb_size[i];
        for (int l = 0; l <= L; l++) {
            size_t c = act_numel(ex, i, l);
            /* act[i][0] points into the mini-batch; the others are owned */
            if (l > 0 && !(ACT(ex, i, l) = malloc(c * sizeof(float)))) return -ENOMEM;
            if (l > 0 && !(GRAD(ex, i, l) = malloc(c * sizeof(float)))) return -ENOMEM;
        }
        for (int l = 0; l < L; l++) {
            const struct ps_layer *ly = &ex->spec->layers[l];
            const struct ps_layer_info *li = &ex->model->layers[l];
            struct saved *sv = SAVED(ex, i, l);
            size_t cnt = (size_t)ex->mb_size[i];
            if (ly->op == PS_OP_BATCHNORM) {
                sv->bn_mean = malloc((size_t)li->channels * sizeof(float));
                sv->bn_invstd = malloc((size_t)li->channels * sizeof(float));
                if (!sv->bn_mean || !sv->bn_invstd) return -ENOMEM;
            } else if (ly->op == PS_OP_MAXPOOL2D) {
                if (!(sv->idx = malloc(cnt * (size_t)li->out_numel * sizeof(int32_t))))
                    return -ENOMEM;
            } else if (ly->op == PS_OP_DROPOUT) {
                if (!(sv->mask = malloc(cnt * (size_t)li->out_numel))) return -ENOMEM;
            }
        }
    }
    return 0;
}

void ps_exec_opts_init(struct ps_exec_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->backend = PS_BACKEND_CPU;
    o->trace = true;
}

bool ps_exec_backend_available(enum ps_backend b, struct ps_diag *d)
{
    if (b == PS_BACKEND_CPU) return true;
    if (!PS_HAVE_CUDA) {
        ps_diag_set(d, -ENOTSUP, "--backend cuda",
                    "the CUDA backend is not built: nvcc was not found when this pipescope "
                    "was configured");
        ps_diag_hint(d, "install the CUDA toolkit and reconfigure with meson -Dcuda=enabled, "
                        "or use --backend cpu");
        return false;
    }
    /* built: is there a device? ("no CUDA device: <cudaGetErrorString>") */
    return ps_cuda_backend_available(d) == 0;
}

const char *ps_exec_bn_phase_name(enum ps_exec_bn_phase p)
{
    switch (p) {
    case PS_EXEC_BN_FORWARD: return "forward";
    case PS_EXEC_BN_RECOMPUTE: return "recompute";
    case PS_EXEC_BN_COMMIT: return "commit";
    }
    return "?";
}

void ps_exec_result_finish(struct ps_exec_result *res)
{
    if (!res) return;
    free(res->loss);
    free(res->step_us);
    ps_state_finish(&res->state);
    for (uint32_t k = 0; k < res->n_bn; k++) {
        free(res->bn[k].mean);
        free(res->bn[k].var);
    }
    free(res->bn);
    ps_trace_finish(&res->trace);
    memset(res, 0, sizeof(*res));
}

double ps_exec_estimate_bytes(const struct ps_spec *spec, const struct ps_model *model, int m,
                              int steps)
{
    double batch = (double)spec->batch, bytes = 0, bn_channels = 0;
    /* weights, gradients and buffers (state.c) */
    bytes += 8.0 * (double)model->total_params;
    for (int l = 0; l < model->n_layers; l++) {
        const struct ps_layer_info *li = &model->layers[l];
        bytes += 8.0 * (double)li->buffers;
        /* activation and gradient of every layer output, per sample; pool indices, masks */
        bytes += batch * 8.0 * (double)li->out_numel;
        if (spec->layers[l].op == PS_OP_MAXPOOL2D) bytes += batch * 4.0 * (double)li->out_numel;
        if (spec->layers[l].op == PS_OP_DROPOUT) bytes += batch * (double)li->out_numel;
        if (spec->layers[l].op == PS_OP_BATCHNORM) bn_channels += (double)li->channels;
    }
    /* the mini-batch and its targets */
    double in = model->n_layers ? (double)model->layers[0].in_numel : 0;
    bytes += batch * (4.0 * in + 8.0 + 4.0 * (double)model->out_numel);
    /* the BN update log: every step, up to three updates per micro-batch and layer */
    bytes += (double)steps * 3.0 * (double)m *
             (bn_channels * 8.0 + (double)sizeof(struct ps_exec_bn_update));
    bytes += (double)steps * 16.0;
    /* synthetic data: steps x batch samples */
    if (spec->data_source == PS_DATA_SYNTHETIC)
        bytes += (double)steps * batch * (4.0 * in + 8.0 + 4.0 * (double)model->out_numel);
    return bytes;
}

int ps_exec_run(const struct ps_graph *g, const struct ps_order *order,
                const struct ps_exec_opts *o, struct ps_exec_result *res, struct ps_diag *d)
{
    memset(res, 0, sizeof(*res));
    struct ps_exec_opts defo;
    if (!o) {
        ps_exec_opts_init(&defo);
        o = &defo;
    }
    if (!ps_exec_backend_available(o->backend, d)) return -ENOTSUP;
    if (g->spec && g->model) {
        const struct ps_spec *sp = g->spec;
        char what[160];
        int st = o->steps > 0 ? o->steps : sp->steps;
        snprintf(what, sizeof(what), "running batch %lld for %d step%s", (long long)sp->batch, st,
                 st == 1 ? "" : "s");
        int rc = ps_memlimit_check(ps_exec_estimate_bytes(sp, g->model, g->m, st), sp->path, what,
                                   "use a smaller batch, model or fewer steps", d);
        if (rc) return rc;
    }
    if (o->backend == PS_BACKEND_CUDA) {
        struct ps_exec_cuda_opts co = {.virtual_devices = o->virtual_devices};
        return ps_cuda_backend_run(g, order, o, &co, res, NULL, d);
    }
    struct ps_exec_setup su;
    int rc = ps_exec_setup(&su, g, order, o, PS_TRACE_CPU, res, d);
    const struct ps_spec *spec = g->spec;
    struct exec ex;
    memset(&ex, 0, sizeof(ex));
    ex.g = g;
    ex.spec = spec;
    ex.model = g->model;
    ex.res = res;
    ex.d = d;
    ex.L = spec ? spec->n_layers : 0;
    ex.m = g->m;
    ex.n = g->n;
    ex.chunks = g->var.chunks;
    ex.batch = spec ? spec->batch : 0;
    ex.mb_size = g->mb_size;
    order = su.order;
    int steps = su.steps;
    const struct ps_data *dt = &su.data;
    if (!rc && alloc_buffers(&ex, dt))
        rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory for the activations");
    struct timespec run0;
    clock_gettime(CLOCK_MONOTONIC, &run0);
    for (int s = 0; s < steps && !rc; s++) {
        ex.step = s;
        clock_gettime(CLOCK_MONOTONIC, &ex.t0);
        ps_data_batch(dt, s, ex.batch, ex.xbatch, ex.labels, ex.rows);
        for (int i = 0; i < ex.m; i++) {
            ACT(&ex, i, 0) = ex.xbatch + ex.mb_off[i] * dt->in_numel;
            ex.loss_done[i] = false;
            ex.mb_loss[i] = 0.0;
        }
        memset(ex.live, 0, (size_t)ex.m * (size_t)ex.L * sizeof(bool));
        ps_state_zero_grad(&res->state);
        bool record = o->trace && s == steps - 1;
        for (uint32_t k = 0; k < order->n && !rc; k++)
            if (!o->forward_only || ex.g->nodes[order->node[k]].phase == PS_PHASE_FWD)
                rc = run_node(&ex, order->node[k], record);
        if (rc) break;
        double loss = 0.0;
        for (int i = 0; i < ex.m; i++) loss += ex.mb_loss[i];
        res->loss[s] = loss;
        for (int l = 0; l < ex.L && !o->forward_only; l++) {
            struct ps_layer_state *ls = &res->state.layers[l];
            if (ls->dweight)
                ps_cpu_sgd_step(ls->weight, ls->dweight, (size_t)ls->n_weight, (float)spec->lr);
            if (ls->dbias)
                ps_cpu_sgd_step(ls->bias, ls->dbias, (size_t)ls->n_bias, (float)spec->lr);
        }
        res->step_us[s] = ps_exec_now_us(&ex.t0);
        rc = ps_exec_check_loss(res, s, spec, d);
    }
    res->total_us = ps_exec_now_us(&run0);
    for (int i = 0; i < ex.m && ex.act; i++) ACT(&ex, i, 0) = NULL; /* not owned */
    free_buffers(&ex);
    ps_exec_setup_finish(&su);
    if (rc) ps_exec_result_finish(res);
    return rc;
}
