/* exec_common: the executors' shared decisions (exec_priv.h), so that the cpu and the cuda
 * executor cannot drift apart on what runs: setup and the order check, shapes, dropout streams,
 * BN modes, the BN update log, the live-activation check and the loss check.
 *
 * Invariant: nothing here touches a kernel or a device; every function is the single definition
 * of a rule that exec_cpu.c's header (E1-E5) states.
 */
#include "kernels/exec_priv.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/schedule.h"

double ps_exec_now_us(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e6 + (double)(t.tv_nsec - t0->tv_nsec) * 1e-3;
}

void ps_exec_pool_shape(struct ps_pool2d_shape *s, const struct ps_layer *l,
                        const struct ps_layer_info *li, size_t n)
{
    s->n = n;
    s->c = (size_t)li->in[0];
    s->h = (size_t)li->in[1];
    s->w = (size_t)li->in[2];
    s->kernel = (size_t)l->kernel;
    s->stride = (size_t)(l->stride > 0 ? l->stride : l->kernel);
    s->padding = (size_t)l->padding;
}

void ps_exec_conv_shape(struct ps_conv2d_shape *s, const struct ps_layer *l,
                        const struct ps_layer_info *li, size_t n)
{
    s->n = n;
    s->c_in = (size_t)li->in[0];
    s->h = (size_t)li->in[1];
    s->w = (size_t)li->in[2];
    s->c_out = (size_t)l->out;
    s->kh = s->kw = (size_t)l->kernel;
    s->stride = (size_t)(l->stride > 0 ? l->stride : 1);
    s->padding = (size_t)l->padding;
}

uint64_t ps_exec_dropout_seed(const struct ps_spec *spec)
{
    return spec->seed ^ UINT64_C(0x5eed0d20);
}

uint64_t ps_exec_dropout_offset(int step, int L, int m, int l, int i)
{
    return ((uint64_t)step * (uint64_t)L + (uint64_t)l) * (uint64_t)m + (uint64_t)i;
}

enum ps_bn_mode ps_exec_bn_mode(enum ps_bn_policy policy, bool grad)
{
    if (policy == PS_BN_PLAIN || (policy == PS_BN_GRAD_ONLY && grad)) return PS_BN_TRAIN;
    return PS_BN_TRAIN_NO_TRACK;
}

int ps_exec_bn_log(struct ps_exec_result *r, int layer, int step, int mb,
                   enum ps_exec_bn_phase phase, uint32_t node, int64_t count, double factor,
                   size_t C, struct ps_exec_bn_update **out, struct ps_diag *d)
{
    *out = NULL;
    if (r->n_bn == r->cap_bn) {
        uint32_t c = r->cap_bn ? r->cap_bn * 2 : 64;
        struct ps_exec_bn_update *q = realloc(r->bn, (size_t)c * sizeof(*q));
        if (!q) return ps_diag_set(d, -ENOMEM, "exec", "out of memory for the BN log");
        r->bn = q;
        r->cap_bn = c;
    }
    struct ps_exec_bn_update *u = &r->bn[r->n_bn];
    memset(u, 0, sizeof(*u));
    u->layer = layer;
    u->step = step;
    u->mb = mb;
    u->phase = (uint8_t)phase;
    u->node = node;
    u->count = count;
    u->factor = factor;
    u->mean = malloc((C ? C : 1) * sizeof(float));
    u->var = malloc((C ? C : 1) * sizeof(float));
    if (!u->mean || !u->var) {
        free(u->mean);
        free(u->var);
        return ps_diag_set(d, -ENOMEM, "exec", "out of memory for the BN log");
    }
    r->n_bn++;
    *out = u;
    return 0;
}

int ps_exec_check_live(const struct ps_graph *g, uint32_t node, const bool *live_row, int f,
                       int c, struct ps_diag *d)
{
    char name[64];
    for (int l = f; l < f + c; l++)
        if (!live_row[l])
            return ps_diag_set(d, -EINVAL, "exec",
                               "%s runs before the activations of layer %d exist (a checkpointed "
                               "task needs its recompute first)",
                               ps_node_name(g, node, name, sizeof(name)), l);
    return 0;
}

int ps_exec_setup(struct ps_exec_setup *su, const struct ps_graph *g,
                  const struct ps_order *order, const struct ps_exec_opts *o,
                  enum ps_trace_source source, struct ps_exec_result *res, struct ps_diag *d)
{
    memset(su, 0, sizeof(*su));
    const struct ps_spec *spec = g->spec;
    const struct ps_model *model = g->model;
    if (!spec || !model)
        return ps_diag_set(d, -EINVAL, "exec", "the graph has no spec or model to run");
    if (!order) {
        int rc = ps_schedule_order(g, &su->own, d);
        if (rc) return rc;
        order = &su->own;
    }
    su->order = order;
    int steps = su->steps = o->steps > 0 ? o->steps : spec->steps;
    ps_trace_init(&res->trace, source);
    res->steps = steps;
    res->loss = calloc((size_t)steps, sizeof(double));
    res->step_us = calloc((size_t)steps, sizeof(double));
    if (!res->loss || !res->step_us) return ps_diag_set(d, -ENOMEM, "exec", "out of memory");
    int rc = ps_state_init(&res->state, spec, model, spec->seed, d);
    if (!rc) rc = ps_data_load(spec, model, (int64_t)steps * spec->batch, &su->data, d);
    if (rc) return rc;
    if (o->train_samples > 0 && o->train_samples < su->data.n_samples)
        su->data.n_samples = o->train_samples; /* the tail is held out (ps_exec_eval) */
    /* the tasks the order must run in every step */
    uint32_t want_f = (uint32_t)g->m * (uint32_t)g->n, nf = 0, nb = 0;
    for (uint32_t k = 0; k < order->n; k++) {
        const struct ps_node *nd = &g->nodes[order->node[k]];
        if (nd->kind == PS_NODE_COMPUTE) *(nd->phase == PS_PHASE_FWD ? &nf : &nb) += 1;
    }
    if (o->forward_only) nb = want_f; /* backward is not run */
    if (nf != want_f || nb != want_f)
        return ps_diag_set(d, -EDEADLK, spec->path,
                           "the execution order runs %u forward and %u backward tasks of %u; "
                           "backward got stuck (see 'pipescope check')",
                           nf, nb, want_f);
    return 0;
}

void ps_exec_setup_finish(struct ps_exec_setup *su)
{
    ps_data_finish(&su->data);
    ps_order_finish(&su->own);
    memset(su, 0, sizeof(*su));
}

int ps_exec_check_loss(const struct ps_exec_result *res, int s, const struct ps_spec *spec,
                       struct ps_diag *d)
{
    double loss = res->loss[s];
    if (isfinite(loss)) return 0;
    int rc = ps_diag_set(d, -ERANGE, spec->path, "step %d: the loss is %s", s,
                         isnan(loss) ? "NaN" : "infinite");
    ps_diag_hint(d, "lower train.lr");
    return rc;
}
