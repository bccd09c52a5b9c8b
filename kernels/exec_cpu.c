/* exec_cpu: the `cpu` executor. Runs the task graph node by node in the order of a ps_order,
 * with the reference kernels of kernels/cpu, and reproduces torchgpipe's numerics.
 *
 * Buffers, indexed by micro-batch i and layer l, L layers:
 *
 *     act[i][0] --layer 0--> act[i][1] --layer 1--> ... --layer L-1--> act[i][L]   (output)
 *     grad[i][l] = dLoss/d act[i][l], written by B from grad[i][l+1]
 *     saved[i][l] = what layer l keeps for backward: BN mean/invstd, pool indices, dropout mask
 *
 * Partition j owns layers [f, f+c). The copies between partitions are no-ops (one address space)
 * and are not timed.
 *
 * Memory as torchgpipe has it (M1-M4, the model's A1-A5 in src/model.c "Activation memory").
 * act[i][l] is layer l's INPUT and belongs to the device the partition holding layer l runs on
 * (the graph's: torchgpipe copies a partition's input onto its device; an interleaved plan puts
 * several stages on one device); act[i][L] belongs to the last partition. Buffers are allocated
 * when a task produces them and freed after their last use:
 *   M1. A forward with grad (F of a task that is not checkpointed, or R) keeps what PyTorch's
 *       autograd saves (ps_layer_keeps, ps_model_keeps_buffer): the input of conv2d, linear,
 *       batchnorm and maxpool2d, the output of relu (one buffer when the next layer keeps it as
 *       its input; a partition's last relu keeps its input instead, the same size on the same
 *       device, as its output leaves for the next device), int64 pool indices and 1-byte dropout
 *       masks (none at p = 0); every other buffer is freed as soon as the next layer has read it.
 *       relu's backward tests its output, or its input when it is last: y > 0 exactly when x > 0.
 *       A flatten inside a partition is a view (ps_flatten_view): act[i][l+1] aliases act[i][l]
 *       (alias[], owning nothing), and the storage goes when neither is kept.
 *   M2. A checkpointed F keeps only its input (for R) and its output (the next partition's
 *       input); every intermediate is freed right after the next layer has read it. R does not
 *       run the partition's last layer when it is conv2d, linear, relu or flatten (no side
 *       effect, and no backward reads its output); otherwise (batchnorm statistics, pool
 *       indices, dropout mask) it writes that output into a scratch buffer freed when R ends.
 *   M3. B(i,j) frees each gradient once the layer below has its own, each buffer once the layer
 *       that reads it (a relu: its output) is done, and every buffer of its layers for
 *       micro-batch i by its end. The model output goes as soon as F(i,n-1) has
 *       computed its loss and output gradient (E4).
 *   M4. Workspace is cache-sized and kept per thread (kernels/cpu/scratch.c: the sgemm's
 *       packing buffers, the gathered convolution's rows and tiles; conv2d never stores its
 *       column matrix, kernels/cpu/conv.c).
 *   M5. A freed buffer (activation, gradient, saved tensor, scratch) goes to its device's cache
 *       and serves the next request of the same size on that device; the caches are freed when
 *       the run ends, or when malloc fails (then it is tried once more). Counted bytes are
 *       buffers in use; the caches are not counted.
 * The executor counts, per device, the bytes of activations and saved tensors alive (act and
 * pool indices / dropout masks; gradients live only inside one B and BN statistics are C floats,
 * neither is counted): the peak over all steps, and every change in the last step
 * (ps_exec_memory). The model predicts the peak (src/analysis.c along the same order, from node
 * act_bytes and ps_node_mem): exactly in the serial mode (tests/test_exec.c).
 *
 * Devices on threads (ps_exec_opts.device_threads): one worker per device, as torchgpipe's one
 * worker per device. Each worker runs its device's tasks in the order's sequence and, before a
 * task, waits only for the tasks it depends on through DATA edges on other devices (Wait nodes
 * and real gradients, SEMANTICS.md sections 2-3; phony edges order host issue only and are not
 * waited for). Nothing numerical depends on the interleaving: each device's parameters,
 * gradients and BN state are touched only by its worker, in the order's sequence, so results are
 * bitwise those of the serial mode; the BN log is put back into the order's sequence after each
 * step. The serial mode (the default of ps_exec_opts_init) runs the order as one sequence.
 * Hand-off: a worker whose dependency has not ended first spins for up to SPIN_US, reading the
 * done flags (release on mark, acquire on read), and only then blocks on the condition variable;
 * it spins only when every worker can have a CPU of its own (devices <= CPUs this process may
 * run on), so a spinning worker never keeps the one it waits for off a core. Measured on the
 * 2-core machine (seed1, batch 64, 2 devices, chunks 4 and 16): a task that waited less than
 * SPIN_US for the other device starts 0.3-0.7 us after it ends instead of 21-36 us (the futex
 * wake-up); a longer wait still pays the wake-up.
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
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps_config.h"

struct saved {
    float *bn_mean, *bn_invstd; /* BN: C each */
    int64_t *idx;               /* maxpool: per output element (int64, as PyTorch keeps them) */
    uint8_t *mask;              /* dropout: per element */
};

/* Freed buffers of one device, kept for the next request of the same size (M5): a stack, the
 * most recently freed last. */
struct bufcache {
    struct cached_buf {
        size_t bytes;
        void *p;
    } *v;
    size_t n, cap;
};

/* What the workers of one run share. With one worker (serial) the mutex is never taken. */
struct shared {
    bool threaded;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *done;           /* per node: its work ended in this step (under mu) */
    int failed;              /* first error of any worker (under mu) */
    struct ps_diag *d;       /* the caller's diag, filled from the first failing worker */
    uint32_t *dep_off, *dep; /* per work node: work nodes on other devices it waits for */
    int n_dev;
    bool spin;               /* spin before blocking in wait_deps (n_dev <= usable CPUs) */
    int64_t *cur;            /* activation bytes alive per device */
    struct bufcache *cache;  /* per device (under mu) */
    struct ps_exec_memory *mem;
    bool record;             /* the last step: keep every change */
    uint32_t cap_points;
    /* the device workers live for the whole run (their kernel workspace with them): the run
       starts step gen by bumping it; a worker that ended its part of the step decrements
       running; quit ends them (all under mu) */
    pthread_cond_t go, idle;
    uint64_t gen;
    int running;
    bool quit;
};

struct exec {
    const struct ps_graph *g;
    const struct ps_spec *spec;
    const struct ps_model *model;
    struct ps_exec_result *res;
    struct ps_diag *d;
    struct shared *sh;
    int L, m, n, step, chunks;
    int ckpt_stop;
    int64_t batch, *mb_off, *mb_size;
    int *layer_dev;          /* [L + 1]: device owning act[i][l] (l = L: the last partition's) */
    float **act, **grad;     /* [(i * (L + 1)) + l] */
    bool *alias;             /* [(i * (L + 1)) + l]: act[i][l] is a view of act[i][l-1] (M1) */
    struct saved *saved;     /* [i * L + l] */
    bool *live;              /* [i * L + l] */
    float *xbatch, *rows;    /* the step's mini-batch */
    int64_t *labels;
    double *mb_loss;         /* per micro-batch contribution to the loss */
    bool *loss_done;         /* per micro-batch: loss and output gradient computed */
    bool *held_in;           /* per micro-batch: a task holds its slice of the mini-batch */
    double *tmp_mean, *tmp_var; /* BN statistics for the log (max channels; one per worker) */
    struct ps_cpu_convcache *wpack; /* [L]: conv2d weights packed, invalidated by the SGD step */
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
#define ALIAS(ex, i, l) ((ex)->alias[(size_t)(i) * (size_t)((ex)->L + 1) + (size_t)(l)])

static void lock(struct exec *ex)
{
    if (ex->sh->threaded) pthread_mutex_lock(&ex->sh->mu);
}

static void unlock(struct exec *ex)
{
    if (ex->sh->threaded) pthread_mutex_unlock(&ex->sh->mu);
}

/* ---- memory (M1-M4) ------------------------------------------------------------------------ */

/* M5: buffers are recycled, not returned to malloc. Every step allocates and frees the same
 * buffers (activations, gradients, pool indices, scratch); freed to glibc, the next step's got
 * other addresses (small allocations kept across steps, such as the BN log's, split the freed
 * space), so the heap crept upwards and each step touched pages it had never touched: seed1 at
 * chunks 16 (2 device threads) took 1094 page faults a step, its RSS grew 4.7 MB a step (26 MB
 * after 3 steps, 166 MB after 30) and partition 0's forward of micro-batches 3-15 ran at twice
 * the time of 0-2 (84-103 against 47-51 us a sample). Reusing a freed buffer of the same size
 * on the same device, the most recently freed first (still in the cache), as PyTorch's CUDA
 * caching allocator does, makes every step after the first touch the memory the first one
 * did. Accounting (mem_note) is unchanged: it counts buffers in use, not cached ones. */
static void *cache_take(struct bufcache *c, size_t bytes)
{
    for (size_t k = c->n; k-- > 0;)
        if (c->v[k].bytes == bytes) {
            void *p = c->v[k].p;
            memmove(c->v + k, c->v + k + 1, (c->n - k - 1) * sizeof(*c->v));
            c->n--;
            return p;
        }
    return NULL;
}

/* false: no room to cache it (the caller frees it) */
static bool cache_put(struct bufcache *c, void *p, size_t bytes)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        struct cached_buf *v = realloc(c->v, cap * sizeof(*v));
        if (!v) return false;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (struct cached_buf){bytes, p};
    return true;
}

static void cache_free(struct bufcache *c)
{
    for (size_t k = 0; k < c->n; k++) free(c->v[k].p);
    free(c->v);
    *c = (struct bufcache){0};
}

/* bytes alive on dev change by delta: peak, and in the last step one point of the series
   (under mu) */
static int mem_note_locked(struct exec *ex, int dev, int64_t delta)
{
    struct shared *sh = ex->sh;
    struct ps_exec_memory *m = sh->mem;
    int rc = 0;
    double t = ps_exec_now_us(&ex->t0);
    int64_t now = sh->cur[dev] += delta;
    if (now > m->peak_bytes[dev]) {
        m->peak_bytes[dev] = now;
        m->peak_t_us[dev] = t;
        m->peak_step[dev] = ex->step;
    }
    if (sh->record) {
        if (m->n_points == sh->cap_points) {
            uint32_t c = sh->cap_points ? 2 * sh->cap_points : 256;
            struct ps_exec_mem_point *q = realloc(m->points, (size_t)c * sizeof(*q));
            if (q) {
                m->points = q;
                sh->cap_points = c;
            }
        }
        if (m->n_points < sh->cap_points)
            m->points[m->n_points++] = (struct ps_exec_mem_point){t, now, dev};
        else
            rc = -ENOMEM;
    }
    return rc;
}

static int mem_note(struct exec *ex, int dev, int64_t delta)
{
    lock(ex);
    int rc = mem_note_locked(ex, dev, delta);
    unlock(ex);
    return rc ? ps_diag_set(ex->d, rc, "exec", "out of memory for the memory series") : 0;
}

/* A buffer of bytes on dev: a cached one, else malloc's; counted when counted is true. */
static void *buf_take(struct exec *ex, size_t bytes, int dev, bool counted, const char *what)
{
    bytes = bytes ? bytes : 1;
    lock(ex);
    void *p = cache_take(&ex->sh->cache[dev], bytes);
    unlock(ex);
    if (!p && !(p = malloc(bytes))) {
        /* the caches hold buffers of other sizes: give them back and try once more */
        lock(ex);
        for (int k = 0; k < ex->sh->n_dev; k++) cache_free(&ex->sh->cache[k]);
        unlock(ex);
        if (!(p = malloc(bytes))) {
            ps_diag_set(ex->d, -ENOMEM, "exec", "out of memory for the %s", what);
            return NULL;
        }
    }
    if (counted && mem_note(ex, dev, (int64_t)bytes)) {
        lock(ex);
        if (!cache_put(&ex->sh->cache[dev], p, bytes)) free(p);
        unlock(ex);
        return NULL;
    }
    return p;
}

static void buf_give(struct exec *ex, void *p, size_t bytes, int dev, bool counted)
{
    if (!p) return;
    bytes = bytes ? bytes : 1;
    lock(ex);
    if (!cache_put(&ex->sh->cache[dev], p, bytes)) free(p);
    int rc = counted ? mem_note_locked(ex, dev, -(int64_t)bytes) : 0;
    unlock(ex);
    (void)rc; /* a point lost for memory is not an error here */
}

static void *mem_alloc(struct exec *ex, size_t bytes, int dev)
{
    return buf_take(ex, bytes, dev, true, "activations");
}

static void mem_free(struct exec *ex, void *p, size_t bytes, int dev)
{
    buf_give(ex, p, bytes, dev, true);
}

/* act[i][l], allocated when missing. l = 0 is the micro-batch's slice of the mini-batch (one
 * buffer for the run): counted from the first task that keeps it (hold_input) to its drop, as
 * torchgpipe's device 0 holds its copy of the micro-batch. */
static float *act_get(struct exec *ex, int i, int l)
{
    float **a = &ACT(ex, i, l);
    if (!*a) *a = mem_alloc(ex, act_numel(ex, i, l) * sizeof(float), ex->layer_dev[l]);
    return *a;
}

static void act_drop(struct exec *ex, int i, int l)
{
    float **a = &ACT(ex, i, l);
    if (ALIAS(ex, i, l)) { /* a flatten's view: the storage is act[i][l-1]'s */
        ALIAS(ex, i, l) = false;
        *a = NULL;
        return;
    }
    if (l == 0 && ex->held_in[i]) {
        ex->held_in[i] = false;
        mem_note(ex, ex->layer_dev[0], -(int64_t)(act_numel(ex, i, 0) * sizeof(float)));
    }
    if (l == 0 || !*a) return;
    mem_free(ex, *a, act_numel(ex, i, l) * sizeof(float), ex->layer_dev[l]);
    *a = NULL;
}

static int hold_input(struct exec *ex, int i)
{
    if (ex->held_in[i]) return 0;
    ex->held_in[i] = true;
    return mem_note(ex, ex->layer_dev[0], (int64_t)(act_numel(ex, i, 0) * sizeof(float)));
}

/* gradients: not counted (each lives inside one B, or from the loss to B(i,n-1)) */
static float *grad_get(struct exec *ex, int i, int l)
{
    float **gp = &ex->grad[(size_t)i * (size_t)(ex->L + 1) + (size_t)l];
    if (!*gp)
        *gp = buf_take(ex, act_numel(ex, i, l) * sizeof(float), ex->layer_dev[l], false,
                       "gradients");
    return *gp;
}

static void grad_drop(struct exec *ex, int i, int l)
{
    float **gp = &ex->grad[(size_t)i * (size_t)(ex->L + 1) + (size_t)l];
    buf_give(ex, *gp, act_numel(ex, i, l) * sizeof(float), ex->layer_dev[l], false);
    *gp = NULL;
}

static size_t idx_bytes(const struct exec *ex, int i, int l)
{
    return (size_t)(ex->model->layers[l].out_numel * ex->mb_size[i]) * sizeof(int64_t);
}

static size_t mask_bytes(const struct exec *ex, int i, int l)
{
    return (size_t)(ex->model->layers[l].out_numel * ex->mb_size[i]);
}

/* pool indices / dropout mask of layer l for a forward with grad */
static int saved_get(struct exec *ex, int i, int l)
{
    struct saved *sv = &ex->saved[(size_t)i * (size_t)ex->L + (size_t)l];
    enum ps_op op = ex->spec->layers[l].op;
    int dev = ex->layer_dev[l];
    if (op == PS_OP_MAXPOOL2D && !sv->idx && !(sv->idx = mem_alloc(ex, idx_bytes(ex, i, l), dev)))
        return -ENOMEM;
    if (op == PS_OP_DROPOUT && ex->spec->layers[l].p > 0 && !sv->mask &&
        !(sv->mask = mem_alloc(ex, mask_bytes(ex, i, l), dev)))
        return -ENOMEM;
    return 0;
}

static void saved_drop(struct exec *ex, int i, int l)
{
    struct saved *sv = &ex->saved[(size_t)i * (size_t)ex->L + (size_t)l];
    mem_free(ex, sv->idx, idx_bytes(ex, i, l), ex->layer_dev[l]);
    mem_free(ex, sv->mask, mask_bytes(ex, i, l), ex->layer_dev[l]);
    sv->idx = NULL;
    sv->mask = NULL;
}

/* ---- BN log ---------------------------------------------------------------------------- */

static int log_update(struct exec *ex, int l, int i, enum ps_exec_bn_phase ph, uint32_t node,
                      int64_t count, double factor, const double *mean, const double *var,
                      size_t C)
{
    struct ps_exec_bn_update *u;
    lock(ex);
    int rc = ps_exec_bn_log(ex->res, l, ex->step, i, ph, node, count, factor, C, &u, ex->d);
    for (size_t c = 0; c < C && !rc; c++) {
        u->mean[c] = (float)mean[c];
        u->var[c] = (float)var[c];
    }
    unlock(ex);
    return rc;
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

/* Forward of layer l for micro-batch i into y. grad: autograd records (a forward with grad: pool
 * indices and dropout masks are kept); recompute: this is R(i,j). */
static int layer_forward(struct exec *ex, int i, int l, float *y, bool grad, bool recompute,
                         uint32_t node)
{
    const struct ps_layer *ly = &ex->spec->layers[l];
    const struct ps_layer_info *li = &ex->model->layers[l];
    struct ps_layer_state *ls = &ex->res->state.layers[l];
    struct saved *sv = SAVED(ex, i, l);
    size_t n = (size_t)ex->mb_size[i];
    const float *x = ACT(ex, i, l);
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
        rc = ps_cpu_conv2d_forward_cached(&s, x, ls->weight, ls->bias, y, &ex->wpack[l],
                                          ex->d);
        break;
    }
    case PS_OP_MAXPOOL2D: {
        struct ps_pool2d_shape s;
        ps_exec_pool_shape(&s, ly, li, n);
        rc = ps_cpu_maxpool2d_forward(&s, x, y, grad ? sv->idx : NULL, ex->d);
        break;
    }
    case PS_OP_RELU: ps_cpu_relu_forward(x, y, n * (size_t)li->in_numel); break;
    case PS_OP_FLATTEN: /* a view (y == x) inside a partition, else a copy (M1) */
        if (y != x) memcpy(y, x, n * (size_t)li->in_numel * sizeof(float));
        break;
    case PS_OP_DROPOUT: {
        ps_cpu_dropout_forward(x, y, grad ? sv->mask : NULL, n * (size_t)li->in_numel,
                               (float)ly->p,
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
        /* the log gets the statistics the running-statistics update used */
        bool tr = mode == PS_BN_TRAIN;
        rc = ps_cpu_bn_forward_stats(&bn, mode, x, y, n, S, sv->bn_mean, sv->bn_invstd,
                                     tr ? ex->tmp_mean : NULL, tr ? ex->tmp_var : NULL, ex->d);
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

static int layer_backward(struct exec *ex, int i, int l, float *dx)
{
    const struct ps_layer *ly = &ex->spec->layers[l];
    const struct ps_layer_info *li = &ex->model->layers[l];
    struct ps_layer_state *ls = &ex->res->state.layers[l];
    struct saved *sv = SAVED(ex, i, l);
    size_t n = (size_t)ex->mb_size[i];
    const float *x = ACT(ex, i, l), *dy = GRAD(ex, i, l + 1);
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
        rc = ps_cpu_conv2d_backward_cached(&s, x, ls->weight, dy, dx, ls->dweight, ls->dbias,
                                           &ex->wpack[l], ex->d);
        break;
    }
    case PS_OP_MAXPOOL2D: {
        if (!dx) break;
        struct ps_pool2d_shape s;
        ps_exec_pool_shape(&s, ly, li, n);
        ps_cpu_maxpool2d_backward(&s, dy, sv->idx, dx);
        break;
    }
    case PS_OP_RELU: /* y > 0 exactly where x > 0: its output, or its input when last (M1) */
        if (dx) ps_cpu_relu_backward(ACT(ex, i, l + 1) ? ACT(ex, i, l + 1) : x, dy, dx, cnt);
        break;
    case PS_OP_FLATTEN:
        if (dx) memcpy(dx, dy, cnt * sizeof(float));
        break;
    case PS_OP_DROPOUT:
        if (dx && sv->mask) ps_cpu_dropout_backward(dy, sv->mask, dx, cnt, (float)ly->p);
        else if (dx) memcpy(dx, dy, cnt * sizeof(float)); /* p = 0: the identity */
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
    float *dout = grad_get(ex, i, ex->L);
    if (!dout) return -ENOMEM;
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
    if (rc == 0) act_drop(ex, i, ex->L); /* the backward reads only its gradient (M3) */
    return rc;
}

/* ---- tasks ----------------------------------------------------------------------------------- */

static int task_forward(struct exec *ex, int i, int j, bool grad, bool recompute, uint32_t node)
{
    int f = ex->spec->first_layer[j], c = ex->spec->balance[j];
    int rc = 0, dev = ex->layer_dev[f];
    float *scratch = NULL; /* R's last output (M2) */
    size_t scratch_bytes = act_numel(ex, i, f + c) * sizeof(float);
    for (int l = f; l < f + c && !rc; l++) {
        enum ps_op op = ex->spec->layers[l].op;
        bool last = l == f + c - 1, view = ps_flatten_view(ex->spec, f, f + c, l);
        if (last && recompute && ps_recompute_skips(op)) {
            LIVE(ex, i, l) = true; /* its input is kept (M1), its output unused */
            break;
        }
        float *y = view                  ? (ALIAS(ex, i, l + 1) = true, ACT(ex, i, l + 1) = ACT(ex, i, l))
                   : last && recompute ? (scratch = mem_alloc(ex, scratch_bytes, dev))
                                       : act_get(ex, i, l + 1);
        if (!y || (grad && saved_get(ex, i, l))) return -ENOMEM;
        rc = layer_forward(ex, i, l, y, grad, recompute, node);
        LIVE(ex, i, l) = grad;
        if (view) continue; /* its input's storage lives on as its output */
        /* M1, M2: the input of layer l goes when nothing will read it again (with the storage
           it is a view of) */
        bool keep = ps_model_keeps_storage(ex->spec, ex->model, f, f + c, l, grad);
        for (int b = l; !keep; b--) {
            bool was_view = ALIAS(ex, i, b);
            act_drop(ex, i, b);
            if (!was_view) break;
        }
        if (keep && l == 0 && !rc)
            rc = hold_input(ex, i);
    }
    mem_free(ex, scratch, scratch_bytes, dev);
    /* E4: micro-batch i's loss and output gradient as soon as its output exists (M3) */
    if (!rc && !recompute && j == ex->n - 1) rc = loss_mb(ex, i);
    return rc;
}

static int task_backward(struct exec *ex, int i, int j, uint32_t node)
{
    int f = ex->spec->first_layer[j], c = ex->spec->balance[j];
    int rc = ps_exec_check_live(ex->g, node, &LIVE(ex, i, 0), f, c, ex->d);
    if (rc) return rc;
    if (j == ex->n - 1 && (rc = loss_mb(ex, i))) return rc;
    for (int l = f + c - 1; l >= f; l--) {
        float *dx = NULL; /* the model input needs no gradient */
        if (l > 0 && !(dx = grad_get(ex, i, l))) return -ENOMEM;
        if ((rc = layer_backward(ex, i, l, dx))) return rc;
        grad_drop(ex, i, l + 1); /* M3 */
        if (l + 1 < f + c) act_drop(ex, i, l + 1); /* read by layer l when it is a relu */
        saved_drop(ex, i, l);
        LIVE(ex, i, l) = false; /* backward frees the graph */
    }
    act_drop(ex, i, f);
    return 0;
}

/* Frees whatever a step left (forward-only steps run no B); counted as freed. */
static void step_cleanup(struct exec *ex)
{
    for (int i = 0; i < ex->m; i++) {
        for (int l = 0; l <= ex->L; l++) {
            act_drop(ex, i, l);
            grad_drop(ex, i, l);
        }
        for (int l = 0; l < ex->L; l++) saved_drop(ex, i, l);
    }
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
        lock(ex);
        if (ps_trace_add(&ex->res->trace, v, nd->device, nd->stream, t, e - t, NULL))
            rc = -ENOMEM;
        unlock(ex);
        if (rc) rc = ps_diag_set(ex->d, rc, "exec", "out of memory for the trace");
    }
    if (rc == -ENOMEM && ex->d->code == 0)
        rc = ps_diag_set(ex->d, rc, "exec", "out of memory for the activations");
    return rc;
}

/* ---- setup and the step loop ----------------------------------------------------------------- */

static void free_buffers(struct exec *ex)
{
    size_t na = (size_t)ex->m * (size_t)(ex->L + 1), ns = (size_t)ex->m * (size_t)ex->L;
    if (ex->act)
        for (size_t k = 0; k < na; k++)
            if (!ex->alias || !ex->alias[k]) free(ex->act[k]); /* a view owns nothing */
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
    free(ex->alias);
    free(ex->xbatch);
    free(ex->rows);
    free(ex->labels);
    free(ex->mb_loss);
    free(ex->loss_done);
    free(ex->held_in);
    free(ex->mb_off);
    free(ex->layer_dev);
    free(ex->tmp_mean);
    free(ex->tmp_var);
    for (int l = 0; ex->wpack && l < ex->L; l++) ps_cpu_convcache_free(&ex->wpack[l]);
    free(ex->wpack);
}

static int alloc_buffers(struct exec *ex, const struct ps_data *dt)
{
    int m = ex->m, L = ex->L;
    size_t na = (size_t)m * (size_t)(L + 1), ns = (size_t)m * (size_t)L;
    ex->act = calloc(na, sizeof(float *));
    ex->grad = calloc(na, sizeof(float *));
    ex->saved = calloc(ns, sizeof(struct saved));
    ex->live = calloc(ns, sizeof(bool));
    ex->alias = calloc(na, sizeof(bool));
    ex->wpack = calloc((size_t)L, sizeof(struct ps_cpu_convcache));
    ex->mb_loss = calloc((size_t)m, sizeof(double));
    ex->loss_done = calloc((size_t)m, sizeof(bool));
    ex->held_in = calloc((size_t)m, sizeof(bool));
    ex->mb_off = calloc((size_t)m, sizeof(int64_t));
    ex->layer_dev = calloc((size_t)L + 1, sizeof(int));
    ex->xbatch = malloc((size_t)(ex->batch * dt->in_numel) * sizeof(float));
    bool want_rows = dt->target == PS_TARGET_ROWS;
    if (dt->labels) ex->labels = malloc((size_t)ex->batch * sizeof(int64_t));
    if (want_rows) ex->rows = malloc((size_t)(ex->batch * dt->out_numel) * sizeof(float));
    if (!ex->act || !ex->grad || !ex->saved || !ex->live || !ex->wpack || !ex->mb_loss ||
        !ex->loss_done || !ex->held_in || !ex->alias || !ex->mb_off || !ex->layer_dev ||
        !ex->xbatch || (dt->labels && !ex->labels) || (want_rows && !ex->rows))
        return -ENOMEM;
    for (int j = 0; j < ex->n; j++) {
        /* the device its tasks run on (an interleaved plan puts several stages on one) */
        uint32_t f0 = ex->g->fwd ? ex->g->fwd[j] : PS_NONE;
        int dev = f0 != PS_NONE && ex->g->nodes[f0].device >= 0 ? ex->g->nodes[f0].device
                                                                 : ex->spec->device_id[j];
        for (int l = ex->spec->first_layer[j]; l < ex->spec->first_layer[j] + ex->spec->balance[j];
             l++)
            ex->layer_dev[l] = dev;
    }
    ex->layer_dev[L] = L > 0 ? ex->layer_dev[L - 1] : 0;
    int64_t off = 0;
    for (int i = 0; i < m; i++) {
        ex->mb_off[i] = off;
        off += ex->mb_size[i];
        for (int l = 0; l < L; l++) {
            /* BN statistics: C floats, kept for the run (the other buffers come and go, M1-M3) */
            const struct ps_layer_info *li = &ex->model->layers[l];
            struct saved *sv = SAVED(ex, i, l);
            if (ex->spec->layers[l].op == PS_OP_BATCHNORM) {
                sv->bn_mean = malloc((size_t)li->channels * sizeof(float));
                sv->bn_invstd = malloc((size_t)li->channels * sizeof(float));
                if (!sv->bn_mean || !sv->bn_invstd) return -ENOMEM;
            }
        }
    }
    return 0;
}

/* BN statistics scratch of one worker */
static int alloc_tmp(struct exec *ex)
{
    int64_t maxc = 1;
    for (int l = 0; l < ex->L; l++)
        if (ex->model->layers[l].channels > maxc) maxc = ex->model->layers[l].channels;
    ex->tmp_mean = malloc((size_t)maxc * sizeof(double));
    ex->tmp_var = malloc((size_t)maxc * sizeof(double));
    return ex->tmp_mean && ex->tmp_var ? 0 : -ENOMEM;
}

/* ---- devices on threads ------------------------------------------------------------------- */

/* Nodes with work (or a record) for the cpu executor; the others pass no data of their own. */
static bool is_work(const struct ps_node *nd)
{
    return ps_node_is_task(nd) || (nd->kind == PS_NODE_LOSS && nd->phase == PS_PHASE_FWD);
}

/* The worker (device) that runs node v: its device, the last partition's for host nodes. */
static int worker_of(const struct exec *ex, const struct ps_node *nd)
{
    int d = nd->device;
    return d >= 0 && d < ex->sh->n_dev ? d : ex->layer_dev[ex->L];
}

/* Per work node, the work nodes on other devices it waits for: the nearest work nodes behind its
 * DATA in-edges, through nodes without work (copies, waits, fork/join, gather). */
static int build_deps(struct exec *ex, const struct ps_order *order)
{
    const struct ps_graph *g = ex->g;
    struct shared *sh = ex->sh;
    uint32_t N = g->n_nodes, cap = 1024, n = 0;
    sh->dep_off = calloc((size_t)N + 1, sizeof(uint32_t));
    sh->dep = malloc(cap * sizeof(uint32_t));
    uint32_t *stack = malloc(((size_t)g->n_edges + 1) * sizeof(uint32_t));
    uint32_t *stamp = calloc(N ? N : 1, sizeof(uint32_t));
    int rc = sh->dep_off && sh->dep && stack && stamp ? 0 : -ENOMEM;
    bool *in_order = calloc(N ? N : 1, sizeof(bool));
    if (!in_order) rc = -ENOMEM;
    for (uint32_t k = 0; k < order->n && !rc; k++) in_order[order->node[k]] = true;
    for (uint32_t v = 0; v < N && !rc; v++) {
        sh->dep_off[v] = n;
        const struct ps_node *nd = &g->nodes[v];
        if (!is_work(nd) || !in_order[v]) continue;
        int me = worker_of(ex, nd);
        uint32_t sp = 0;
        stack[sp++] = v;
        stamp[v] = v + 1;
        while (sp && !rc) {
            uint32_t u = stack[--sp];
            for (uint32_t e = g->in_off[u]; e < g->in_off[u + 1]; e++) {
                const struct ps_edge *ed = &g->edges[g->in_edge[e]];
                uint32_t w = ed->src;
                if (ed->kind != PS_EDGE_DATA || stamp[w] == v + 1) continue;
                stamp[w] = v + 1;
                const struct ps_node *wn = &g->nodes[w];
                if (!is_work(wn) || !in_order[w]) {
                    if (sp < g->n_edges + 1) stack[sp++] = w;
                    continue;
                }
                if (worker_of(ex, wn) == me) continue; /* earlier in the same worker's sequence */
                if (n == cap) {
                    uint32_t *q = realloc(sh->dep, 2 * (size_t)cap * sizeof(uint32_t));
                    if (!q) {
                        rc = -ENOMEM;
                        break;
                    }
                    sh->dep = q;
                    cap *= 2;
                }
                sh->dep[n++] = w;
            }
        }
    }
    if (sh->dep_off) sh->dep_off[N] = n;
    free(stack);
    free(stamp);
    free(in_order);
    return rc;
}

/* longest spin before a worker blocks, us: a hand-off to a worker already waiting takes about
   1 us instead of a futex wake-up; a longer wait costs at most this much CPU */
#define SPIN_US 100.0

/* CPUs this process may run on (its affinity mask; the online count where that is unknown) */
static int usable_cpus(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

static void mark_done(struct exec *ex, uint32_t v)
{
    struct shared *sh = ex->sh;
    pthread_mutex_lock(&sh->mu);
    __atomic_store_n(&sh->done[v], 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

/* a worker's dependencies of v have all ended (acquire: their buffers are visible) */
static bool deps_done(const struct shared *sh, uint32_t v)
{
    for (uint32_t k = sh->dep_off[v]; k < sh->dep_off[v + 1]; k++)
        if (!__atomic_load_n(&sh->done[sh->dep[k]], __ATOMIC_ACQUIRE)) return false;
    return true;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* false when another worker failed */
static bool wait_deps(struct exec *ex, uint32_t v)
{
    struct shared *sh = ex->sh;
    if (sh->spin) {
        /* done without the mutex: taking it here would often find the marking worker still
           holding it, and sleep on it as long as on the condition variable */
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (uint32_t it = 1;; it++) {
            if (__atomic_load_n(&sh->failed, __ATOMIC_ACQUIRE)) return false;
            if (deps_done(sh, v)) return true;
            cpu_relax();
            if (it % 64) continue;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) * 1e6 + (double)(t.tv_nsec - t0.tv_nsec) * 1e-3 >
                SPIN_US)
                break;
        }
    }
    bool ok = true;
    pthread_mutex_lock(&sh->mu);
    for (uint32_t k = sh->dep_off[v]; k < sh->dep_off[v + 1] && ok; k++) {
        while (!sh->done[sh->dep[k]] && !sh->failed) pthread_cond_wait(&sh->cv, &sh->mu);
        ok = !sh->failed;
    }
    pthread_mutex_unlock(&sh->mu);
    return ok;
}

struct worker {
    struct exec ex; /* a copy: own diag and BN scratch, the rest shared */
    struct ps_diag d;
    const struct ps_order *order;
    int dev;
    bool forward_only, record;
    int gemm_threads;
    int rc;
    struct shared *sh;
    pthread_t tid;
    bool started;
};

/* A device's part of one step. */
static void worker_step(struct worker *w)
{
    struct exec *ex = &w->ex;
    struct shared *sh = ex->sh;
    ps_cpu_set_threads_local(w->gemm_threads);
    for (uint32_t k = 0; k < w->order->n && !w->rc; k++) {
        uint32_t v = w->order->node[k];
        const struct ps_node *nd = &ex->g->nodes[v];
        if (!is_work(nd) || worker_of(ex, nd) != w->dev) continue;
        if (w->forward_only && nd->phase != PS_PHASE_FWD) continue;
        if (!wait_deps(ex, v)) break;
        w->rc = run_node(ex, v, w->record);
        if (w->rc) {
            pthread_mutex_lock(&sh->mu);
            if (!sh->failed) {
                __atomic_store_n(&sh->failed, w->rc, __ATOMIC_RELEASE);
                *sh->d = w->d;
            }
            pthread_cond_broadcast(&sh->cv);
            pthread_mutex_unlock(&sh->mu);
        } else {
            mark_done(ex, v);
        }
    }
}

/* A device's worker: every step of the run, then its workspace goes with it. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct shared *sh = w->sh;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        while (sh->gen == seen && !sh->quit) pthread_cond_wait(&sh->go, &sh->mu);
        bool quit = sh->quit;
        seen = sh->gen;
        pthread_mutex_unlock(&sh->mu);
        if (quit) break;
        worker_step(w);
        pthread_mutex_lock(&sh->mu);
        if (--sh->running == 0) pthread_cond_signal(&sh->idle);
        pthread_mutex_unlock(&sh->mu);
    }
    return NULL;
}

/* Starts a worker per device; false: a thread could not start (those that did are ended). */
static bool start_workers(struct shared *sh, struct worker *w)
{
    for (int k = 0; k < sh->n_dev; k++) {
        w[k].sh = sh;
        if (pthread_create(&w[k].tid, NULL, worker_main, &w[k]) != 0) break;
        w[k].started = true;
    }
    if (sh->n_dev > 0 && w[sh->n_dev - 1].started) return true;
    return false;
}

static void stop_workers(struct shared *sh, struct worker *w)
{
    pthread_mutex_lock(&sh->mu);
    sh->quit = true;
    pthread_cond_broadcast(&sh->go);
    pthread_mutex_unlock(&sh->mu);
    for (int k = 0; k < sh->n_dev; k++)
        if (w[k].started) pthread_join(w[k].tid, NULL);
}

struct bn_key {
    uint32_t pos, k;
};

static int bn_key_cmp(const void *a, const void *b)
{
    const struct bn_key *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* The BN log entries [from, n_bn) in the order's sequence (by node position; entries of one
 * node keep their order), as the serial mode writes them. */
static int sort_bn_log(struct ps_exec_result *r, uint32_t from, const struct ps_order *order)
{
    uint32_t cnt = r->n_bn - from;
    if (cnt < 2) return 0;
    struct bn_key *key = malloc((size_t)cnt * sizeof(*key));
    struct ps_exec_bn_update *tmp = malloc((size_t)cnt * sizeof(*tmp));
    if (!key || !tmp) {
        free(key);
        free(tmp);
        return -ENOMEM;
    }
    for (uint32_t k = 0; k < cnt; k++) key[k] = (struct bn_key){order->pos[r->bn[from + k].node], k};
    qsort(key, cnt, sizeof(*key), bn_key_cmp);
    for (uint32_t k = 0; k < cnt; k++) tmp[k] = r->bn[from + key[k].k];
    memcpy(r->bn + from, tmp, (size_t)cnt * sizeof(*tmp));
    free(key);
    free(tmp);
    return 0;
}

/* One step with a worker per device. */
static int run_step_threaded(struct exec *ex, struct worker *w, const struct ps_order *order,
                             bool forward_only, bool record, int kernel_threads)
{
    struct shared *sh = ex->sh;
    int nd = sh->n_dev;
    memset(sh->done, 0, ex->g->n_nodes);
    sh->failed = 0;
    uint32_t bn0 = ex->res->n_bn;
    int per = kernel_threads > 0 ? kernel_threads : ps_cpu_threads() / nd;
    for (int k = 0; k < nd; k++) {
        double *tm = w[k].ex.tmp_mean, *tv = w[k].ex.tmp_var;
        w[k].ex = *ex;
        w[k].ex.tmp_mean = tm;
        w[k].ex.tmp_var = tv;
        ps_diag_clear(&w[k].d);
        w[k].ex.d = &w[k].d;
        w[k].order = order;
        w[k].dev = k;
        w[k].forward_only = forward_only;
        w[k].record = record;
        w[k].gemm_threads = per > 1 ? per : 1;
        w[k].rc = 0;
    }
    pthread_mutex_lock(&sh->mu);
    sh->running = nd;
    sh->gen++;
    pthread_cond_broadcast(&sh->go);
    while (sh->running > 0) pthread_cond_wait(&sh->idle, &sh->mu);
    pthread_mutex_unlock(&sh->mu);
    if (sh->failed) return sh->failed;
    if (sort_bn_log(ex->res, bn0, order))
        return ps_diag_set(ex->d, -ENOMEM, "exec", "out of memory for the BN log");
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
    free(res->mem.peak_bytes);
    free(res->mem.peak_t_us);
    free(res->mem.peak_step);
    free(res->mem.points);
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
        if (spec->layers[l].op == PS_OP_MAXPOOL2D) bytes += batch * 8.0 * (double)li->out_numel;
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
    /* synthetic data: the labels of steps x batch samples (inputs and rows are drawn per
       mini-batch, src/data.h) */
    if (spec->data_source == PS_DATA_SYNTHETIC && spec->loss == PS_LOSS_CROSS_ENTROPY)
        bytes += (double)steps * batch * 8.0;
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
    struct shared sh;
    memset(&sh, 0, sizeof(sh));
    struct exec ex;
    memset(&ex, 0, sizeof(ex));
    ex.g = g;
    ex.spec = spec;
    ex.model = g->model;
    ex.res = res;
    ex.d = d;
    ex.sh = &sh;
    ex.L = spec ? spec->n_layers : 0;
    ex.m = g->m;
    ex.n = g->n;
    ex.chunks = g->var.chunks;
    ex.batch = spec ? spec->batch : 0;
    ex.mb_size = g->mb_size;
    order = su.order;
    int steps = su.steps;
    const struct ps_data *dt = &su.data;
    if (!rc && (alloc_buffers(&ex, dt) || alloc_tmp(&ex)))
        rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory for the activations");
    /* memory accounting: one counter per device */
    struct ps_exec_memory *mem = &res->mem;
    sh.d = d;
    sh.mem = mem;
    sh.n_dev = g->n_devices > 0 ? g->n_devices : 1;
    for (int l = 0; !rc && l <= ex.L; l++)
        if (ex.layer_dev[l] >= sh.n_dev) sh.n_dev = ex.layer_dev[l] + 1;
    if (!rc) {
        mem->n_devices = sh.n_dev;
        sh.cur = calloc((size_t)sh.n_dev, sizeof(int64_t));
        sh.cache = calloc((size_t)sh.n_dev, sizeof(struct bufcache));
        mem->peak_bytes = calloc((size_t)sh.n_dev, sizeof(int64_t));
        mem->peak_t_us = calloc((size_t)sh.n_dev, sizeof(double));
        mem->peak_step = calloc((size_t)sh.n_dev, sizeof(int32_t));
        if (!sh.cur || !sh.cache || !mem->peak_bytes || !mem->peak_t_us || !mem->peak_step)
            rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory");
    }
    /* devices on threads: only when there is more than one */
    struct worker *w = NULL;
    bool sync_init = false;
    if (o->kernel_threads > 0) ps_cpu_set_threads_local(o->kernel_threads); /* serial mode */
    if (!rc && o->device_threads && sh.n_dev > 1) {
        sh.threaded = true;
        sh.spin = sh.n_dev <= usable_cpus();
        sh.done = calloc(g->n_nodes ? g->n_nodes : 1, 1);
        w = calloc((size_t)sh.n_dev, sizeof(*w));
        if (!sh.done || !w || build_deps(&ex, order))
            rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory for the device threads");
        for (int k = 0; k < sh.n_dev && !rc; k++) {
            w[k].ex = ex;
            if (alloc_tmp(&w[k].ex))
                rc = ps_diag_set(d, -ENOMEM, "exec", "out of memory for the device threads");
        }
        if (!rc) {
            /* the mutex guards short updates (memory counters, the trace, done flags) that
               both workers make around every allocation: with a CPU each, an adaptive mutex
               spins briefly instead of sleeping on a futex (a wake-up costs 25-100 us here) */
            pthread_mutexattr_t ma;
            pthread_mutexattr_init(&ma);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
            if (sh.spin) pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
            pthread_mutex_init(&sh.mu, &ma);
            pthread_mutexattr_destroy(&ma);
            pthread_cond_init(&sh.cv, NULL);
            pthread_cond_init(&sh.go, NULL);
            pthread_cond_init(&sh.idle, NULL);
            sync_init = true;
            if (!start_workers(&sh, w))
                rc = ps_diag_set(d, -EAGAIN, "exec",
                                 "cannot start a thread per device (use the serial mode)");
        }
    }
    /* progress: the work of the tasks that run, per step, as a CPU roofline would weigh it:
       max(FLOPs, 5 x bytes moved) (+1 each, so no task weighs nothing) */
    double work_step = 0, work_done = 0;
#define WORK(nd) (fmax((nd)->flops, 5.0 * (nd)->bytes) + 1)
    if (o->progress)
        for (uint32_t k = 0; k < order->n; k++)
            if (!o->forward_only || ex.g->nodes[order->node[k]].phase == PS_PHASE_FWD)
                work_step += WORK(&ex.g->nodes[order->node[k]]);
    struct timespec run0;
    clock_gettime(CLOCK_MONOTONIC, &run0);
    for (int s = 0; s < steps && !rc; s++) {
        ex.step = s;
        /* the mini-batch first: drawing synthetic data is not the step's work */
        ps_data_batch(dt, s, ex.batch, ex.xbatch, ex.labels, ex.rows);
        clock_gettime(CLOCK_MONOTONIC, &ex.t0);
        for (int i = 0; i < ex.m; i++) {
            ACT(&ex, i, 0) = ex.xbatch + ex.mb_off[i] * dt->in_numel;
            ex.loss_done[i] = false;
            ex.mb_loss[i] = 0.0;
        }
        memset(ex.live, 0, (size_t)ex.m * (size_t)ex.L * sizeof(bool));
        ps_state_zero_grad(&res->state);
        bool record = o->trace && s == steps - 1;
        sh.record = s == steps - 1;
        if (sh.threaded) {
            rc = run_step_threaded(&ex, w, order, o->forward_only, record, o->kernel_threads);
            /* threaded: progress once per step */
            if (!rc && o->progress) {
                work_done += work_step;
                if (!o->progress(o->progress_ctx, work_done, work_step * steps))
                    rc = ps_diag_set(d, -ECANCELED, "exec", "stopped by its caller");
            }
        } else {
            for (uint32_t k = 0; k < order->n && !rc; k++) {
                if (o->forward_only && ex.g->nodes[order->node[k]].phase != PS_PHASE_FWD)
                    continue;
                rc = run_node(&ex, order->node[k], record);
                if (!rc && o->progress) {
                    work_done += WORK(&ex.g->nodes[order->node[k]]);
                    if (!o->progress(o->progress_ctx, work_done, work_step * steps))
                        rc = ps_diag_set(d, -ECANCELED, "exec", "stopped by its caller");
                }
            }
        }
        step_cleanup(&ex);
#undef WORK
        if (rc) break;
        double loss = 0.0;
        for (int i = 0; i < ex.m; i++) loss += ex.mb_loss[i];
        res->loss[s] = loss;
        for (int l = 0; l < ex.L && !o->forward_only; l++) {
            struct ps_layer_state *ls = &res->state.layers[l];
            ps_cpu_convcache_invalidate(&ex.wpack[l]);
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
    if (sync_init) {
        stop_workers(&sh, w);
        pthread_mutex_destroy(&sh.mu);
        pthread_cond_destroy(&sh.cv);
        pthread_cond_destroy(&sh.go);
        pthread_cond_destroy(&sh.idle);
    }
    ps_cpu_scratch_release(); /* the serial mode's kernel workspace */
    if (o->kernel_threads > 0) ps_cpu_set_threads_local(0);
    for (int k = 0; w && k < sh.n_dev; k++) {
        free(w[k].ex.tmp_mean);
        free(w[k].ex.tmp_var);
    }
    free(w);
    free(sh.done);
    free(sh.dep_off);
    free(sh.dep);
    free(sh.cur);
    for (int k = 0; sh.cache && k < sh.n_dev; k++) cache_free(&sh.cache[k]);
    free(sh.cache);
    free_buffers(&ex);
    ps_exec_setup_finish(&su);
    if (rc) ps_exec_result_finish(res);
    return rc;
}
