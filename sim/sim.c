/* sim: the simulator's single pass over an execution order (see sim.h for the rules and why a
 * pass over a fixed order is the whole discrete-event simulation).
 *
 * State per node: issue, start, end (doubles) and `why`, the predecessor whose time bound the
 * start (or the issue, when the host was the bottleneck), for the critical path. State per
 * stream and per host thread: the last node issued on it. Memory and in-flight counts come from
 * a second, sorted sweep over allocation and free events, device by device.
 */
#include "sim/sim.h"
#include "src/waits.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_sim_finish(struct ps_sim *s)
{
    if (!s) return;
    ps_trace_finish(&s->trace);
    if (s->dev)
        for (int d = 0; d < s->n_devices; d++) free(s->dev[d].mem);
    free(s->dev);
    free(s->start_us);
    free(s->end_us);
    free(s->issue_us);
    free(s->cp);
    memset(s, 0, sizeof(*s));
}

struct mev {
    double t;
    int64_t bytes;
    int32_t count;
    uint32_t node;
};

static int mev_cmp(const void *a, const void *b)
{
    const struct mev *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    /* frees before allocations at the same instant, then node index */
    if ((x->bytes < 0 || x->count < 0) != (y->bytes < 0 || y->count < 0))
        return (x->bytes < 0 || x->count < 0) ? -1 : 1;
    return x->node < y->node ? -1 : x->node > y->node;
}

/* the node after which the activations of B's task are freed: its Wg when split */
static uint32_t last_grad(const struct ps_graph *g, uint32_t b)
{
    for (uint32_t k = g->out_off[b]; k < g->out_off[b + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->out_edge[k]];
        if (e->kind == PS_EDGE_DATA && g->nodes[e->dst].kind == PS_NODE_WGRAD) return e->dst;
    }
    return b;
}

/* bytes a split backward keeps from B until Wg: the saved inputs of the linear/conv layers
   (dW = dY^T X needs X); everything else is freed when B ends */
static int64_t wgrad_keeps(const struct ps_graph *g, const struct ps_node *b)
{
    if (!g->model || !g->spec || b->part < 0 || b->part >= g->model->n_partitions || b->mb < 0)
        return 0;
    const struct ps_partition_info *p = &g->model->parts[b->part];
    int64_t keep = 0;
    for (int k = p->first; k < p->first + p->count; k++) {
        enum ps_op op = g->spec->layers[k].op;
        if ((op == PS_OP_LINEAR || op == PS_OP_CONV2D) && g->model->layers[k].params > 0)
            keep += g->model->layers[k].saved_bytes;
    }
    return keep * g->mb_size[b->mb];
}

static int memory(const struct ps_graph *g, const struct ps_order *o, struct ps_sim *s)
{
    int nd = s->n_devices;
    uint32_t *cnt = calloc((size_t)nd, sizeof(uint32_t));
    if (!cnt) return -ENOMEM;
    for (uint32_t k = 0; k < o->n; k++) {
        const struct ps_node *n = &g->nodes[o->node[k]];
        if (n->device < 0 || n->device >= nd) continue;
        if (n->act_bytes || n->kind == PS_NODE_COMPUTE || n->kind == PS_NODE_RECOMPUTE ||
            n->kind == PS_NODE_WGRAD)
            cnt[n->device] += 2;
        int64_t tmp, out;
        int od;
        ps_node_mem(g, o->node[k], &tmp, &out, &od);
        if (out && od >= 0 && od < nd) cnt[od]++;
    }
    struct mev **ev = calloc((size_t)nd, sizeof(*ev));
    uint32_t *ne = calloc((size_t)nd, sizeof(uint32_t));
    int rc = 0;
    if (!ev || !ne) rc = -ENOMEM;
    for (int d = 0; d < nd && !rc; d++)
        if (!(ev[d] = malloc(((size_t)cnt[d] + 1) * sizeof(struct mev)))) rc = -ENOMEM;
    /* a task's high-water is held from its start to its end, where its net change remains; a
       forward's output reaches the next partition's device when it ends; B frees at its end
       (src/model.c "Activation memory") */
    for (uint32_t k = 0; k < o->n && !rc; k++) {
        uint32_t v = o->node[k];
        const struct ps_node *n = &g->nodes[v];
        int d = n->device;
        if (d < 0 || d >= nd) continue;
        bool fwd_task = n->kind == PS_NODE_COMPUTE && n->phase == PS_PHASE_FWD;
        bool bwd_task = n->kind == PS_NODE_COMPUTE && n->phase == PS_PHASE_BWD;
        int64_t tmp, out;
        int od;
        ps_node_mem(g, v, &tmp, &out, &od);
        if (tmp || fwd_task)
            ev[d][ne[d]++] = (struct mev){s->start_us[v], tmp, fwd_task ? 1 : 0, v};
        if (out && od >= 0 && od < nd) ev[od][ne[od]++] = (struct mev){s->end_us[v], out, 0, v};
        if (bwd_task) {
            int64_t fr = -n->act_bytes;
            uint32_t lg = last_grad(g, v);
            int64_t keep = lg != v ? wgrad_keeps(g, n) : 0;
            if (keep > fr) keep = fr;
            if (keep < 0) keep = 0;
            ev[d][ne[d]++] = (struct mev){s->end_us[v], -(fr - keep), -1, v};
            if (lg != v) ev[d][ne[d]++] = (struct mev){s->end_us[lg], -keep, 0, lg};
        } else if (n->act_bytes - tmp) {
            ev[d][ne[d]++] = (struct mev){s->end_us[v], n->act_bytes - tmp, 0, v};
        }
    }
    for (int d = 0; d < nd && !rc; d++) {
        struct ps_sim_device *dv = &s->dev[d];
        qsort(ev[d], ne[d], sizeof(struct mev), mev_cmp);
        dv->mem = malloc(((size_t)ne[d] + 2) * sizeof(*dv->mem));
        if (!dv->mem) {
            rc = -ENOMEM;
            break;
        }
        int64_t cur = 0;
        int32_t inflight = 0;
        dv->mem[dv->n_mem++] = (struct ps_sim_mem_point){0, 0};
        for (uint32_t k = 0; k < ne[d]; k++) {
            cur += ev[d][k].bytes;
            inflight += ev[d][k].count;
            if (inflight > (int32_t)dv->max_in_flight) dv->max_in_flight = (uint32_t)inflight;
            if (cur > dv->peak_bytes) {
                dv->peak_bytes = cur;
                dv->peak_t_us = ev[d][k].t;
            }
            if (k + 1 < ne[d] && ev[d][k + 1].t == ev[d][k].t) continue;
            struct ps_sim_mem_point *last = &dv->mem[dv->n_mem - 1];
            if (last->t_us == ev[d][k].t) last->bytes = cur;
            else if (last->bytes != cur)
                dv->mem[dv->n_mem++] = (struct ps_sim_mem_point){ev[d][k].t, cur};
        }
    }
    if (ev)
        for (int d = 0; d < nd; d++) free(ev[d]);
    free(ev);
    free(ne);
    free(cnt);
    return rc;
}


void ps_sim_prog_finish(struct ps_sim_prog *p)
{
    free(p->node);
    free(p->tprev);
    free(p->sprev);
    free(p->launch);
    free(p->pred_off);
    free(p->pred);
    memset(p, 0, sizeof(*p));
}

/* Does edge e into v bound v's start (besides issue)? STREAM edges are stream order; a DATA
   edge carries a tensor whose producer's end bounds a host-only consumer (fork, join, loss pass
   it on) and a backward consumer fed through such a node (the loss's own time). Device waits
   between streams come from the wait plan (waits.h); PHONY and HOST edges order issue only. */
static bool bounds_start(const struct ps_graph *g, const struct ps_edge *e)
{
    const struct ps_node *u = &g->nodes[e->src], *v = &g->nodes[e->dst];
    if (e->kind == PS_EDGE_STREAM) return true;
    if (e->kind != PS_EDGE_DATA) return false;
    if (u->kind == PS_NODE_RECOMPUTE && u->phase == PS_PHASE_BWD) return false; /* no gradient */
    return v->stream < 0 || (u->stream < 0 && v->phase == PS_PHASE_BWD);
}

int ps_sim_compile(const struct ps_graph *g, const struct ps_order *o, struct ps_sim_prog *p,
                   struct ps_diag *diag)
{
    memset(p, 0, sizeof(*p));
    uint32_t n = o->n;
    int nd = g->n_devices > 0 ? g->n_devices : 1;
    int nthr = nd + 1; /* thread t at index t + 1; out-of-range threads share index 0 */
    for (uint32_t k = 0; k < n; k++) {
        uint32_t v = o->node[k];
        for (uint32_t q = g->in_off[v]; q < g->in_off[v + 1]; q++) {
            const struct ps_edge *e = &g->edges[g->in_edge[q]];
            uint32_t pu = o->pos[e->src];
            if (pu != UINT32_MAX && pu >= k) {
                char a[64], b[64];
                return ps_diag_set(diag, -EINVAL, "simulator",
                                   "the order runs %s before its predecessor %s",
                                   ps_node_name(g, v, a, sizeof(a)),
                                   ps_node_name(g, e->src, b, sizeof(b)));
            }
        }
    }
    struct ps_waits wp;
    int rc = ps_waits_plan(g, o, &wp, diag);
    if (rc) return rc;
    uint32_t ne = wp.n_waits;
    for (uint32_t k = 0; k < n; k++) ne += ps_graph_in_degree(g, o->node[k]);
    p->n = n;
    p->node = malloc(((size_t)n + 1) * sizeof(uint32_t));
    p->tprev = malloc(((size_t)n + 1) * sizeof(uint32_t));
    p->sprev = malloc(((size_t)n + 1) * sizeof(uint32_t));
    p->launch = malloc((size_t)n + 1);
    p->pred_off = malloc(((size_t)n + 2) * sizeof(uint32_t));
    p->pred = malloc(((size_t)ne + 1) * sizeof(uint32_t));
    uint32_t *tlast = malloc((size_t)nthr * sizeof(uint32_t));
    if (!p->node || !p->tprev || !p->sprev || !p->launch || !p->pred_off || !p->pred || !tlast) {
        free(tlast);
        ps_waits_finish(&wp);
        ps_sim_prog_finish(p);
        return ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
    }
    for (int k = 0; k < nthr; k++) tlast[k] = UINT32_MAX;
    uint32_t w = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t v = o->node[k];
        const struct ps_node *nd_ = &g->nodes[v];
        int th = o->thread[k] >= 0 && o->thread[k] < nd ? o->thread[k] + 1 : 0;
        p->node[k] = v;
        p->tprev[k] = tlast[th];
        tlast[th] = k;
        p->launch[k] = nd_->stream >= 0;
        p->sprev[k] = wp.sprev[k];
        p->pred_off[k] = w;
        for (uint32_t q = g->in_off[v]; q < g->in_off[v + 1]; q++) {
            const struct ps_edge *e = &g->edges[g->in_edge[q]];
            uint32_t pu = o->pos[e->src];
            if (pu == UINT32_MAX) continue;
            p->pred[w++] = pu | (bounds_start(g, e) ? 0 : PS_SIM_HOST_EDGE);
        }
        for (uint32_t q = wp.off[k]; q < wp.off[k + 1]; q++)
            p->pred[w++] = wp.at[q] | PS_SIM_DEVICE_WAIT;
    }
    p->pred_off[n] = w;
    free(tlast);
    ps_waits_finish(&wp);
    return 0;
}

double ps_sim_step(const struct ps_sim_prog *p, const double *cost, double launch, double *issue,
                   double *start, double *end, uint32_t *why)
{
    double last = 0;
    for (uint32_t k = 0; k < p->n; k++) {
        double iss = 0, st = 0;
        uint32_t wi = UINT32_MAX, ws = UINT32_MAX;
        uint32_t tp = p->tprev[k];
        if (tp != UINT32_MAX) {
            iss = issue[tp] + (p->launch[tp] ? launch : 0);
            wi = tp;
        }
        for (uint32_t q = p->pred_off[k]; q < p->pred_off[k + 1]; q++) {
            uint32_t f = p->pred[q], pu = f & ~(PS_SIM_HOST_EDGE | PS_SIM_DEVICE_WAIT);
            if (!(f & PS_SIM_DEVICE_WAIT)) {
                double iu = issue[pu] + (p->launch[pu] ? launch : 0);
                if (iu > iss) iss = iu, wi = pu;
            }
            if (!(f & PS_SIM_HOST_EDGE) && end[pu] > st) st = end[pu], ws = pu;
        }
        uint32_t sp = p->sprev[k];
        if (sp != UINT32_MAX && end[sp] > st) st = end[sp], ws = sp;
        issue[k] = iss;
        double ready = iss + (p->launch[k] ? launch : 0);
        if (ws == UINT32_MAX || ready > st) st = ready, ws = UINT32_MAX; /* host-bound */
        if (why) why[k] = ws != UINT32_MAX ? ws : wi;
        start[k] = st;
        end[k] = st + cost[p->node[k]];
        if (end[k] > last) last = end[k];
    }
    return last;
}

int ps_sim_run(const struct ps_graph *g, const struct ps_order *o, const double *cost,
               const struct ps_sim_opts *opts, struct ps_sim *s, struct ps_diag *diag)
{
    memset(s, 0, sizeof(*s));
    ps_trace_init(&s->trace, PS_TRACE_SIMULATED);
    uint32_t nv = g->n_nodes;
    int nd = g->n_devices > 0 ? g->n_devices : 1;
    double launch = opts ? opts->launch_us : 0;
    s->n_devices = nd;
    s->dev = calloc((size_t)nd, sizeof(*s->dev));
    s->start_us = malloc(((size_t)nv + 1) * sizeof(double));
    s->end_us = malloc(((size_t)nv + 1) * sizeof(double));
    s->issue_us = malloc(((size_t)nv + 1) * sizeof(double));
    s->launch_us = launch;
    double *issue = malloc(((size_t)nv + 1) * sizeof(double));
    uint32_t *why = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    int rc = 0;
    if (!s->dev || !s->start_us || !s->end_us || !s->issue_us || !issue || !why) {
        rc = ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
        goto out;
    }
    for (uint32_t v = 0; v < nv; v++) s->start_us[v] = s->end_us[v] = s->issue_us[v] = -1;

    double *start = s->start_us, *end = s->end_us;
    const struct ps_node *nodes = g->nodes;
    struct ps_sim_prog prog;
    if ((rc = ps_sim_compile(g, o, &prog, diag))) goto out;
    double *pst = malloc(((size_t)prog.n + 1) * sizeof(double));
    double *pen = malloc(((size_t)prog.n + 1) * sizeof(double));
    uint32_t *pwhy = malloc(((size_t)prog.n + 1) * sizeof(uint32_t));
    if (!pst || !pen || !pwhy) {
        free(pst);
        free(pen);
        free(pwhy);
        ps_sim_prog_finish(&prog);
        rc = ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
        goto out;
    }
    ps_sim_step(&prog, cost, launch, issue, pst, pen, pwhy);
    for (uint32_t k = 0; k < prog.n; k++) {
        uint32_t v = prog.node[k];
        start[v] = pst[k];
        end[v] = pen[k];
        s->issue_us[v] = issue[k];
        why[v] = pwhy[k] == UINT32_MAX ? PS_NONE : prog.node[pwhy[k]];
    }
    free(pst);
    free(pen);
    free(pwhy);
    ps_sim_prog_finish(&prog);

    /* records, statistics; the trace is sized once (no regrowth copies) */
    uint32_t nrec = 0;
    for (uint32_t v = 0; v < nv; v++) nrec += end[v] >= 0 && nodes[v].stream >= 0;
    if (nrec && !(s->trace.r = malloc((size_t)nrec * sizeof(*s->trace.r)))) {
        rc = ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
        goto out;
    }
    s->trace.cap = nrec;
    uint32_t last = PS_NONE;
    for (uint32_t v = 0; v < nv; v++) {
        if (end[v] < 0) continue;
        if (last == PS_NONE || end[v] > end[last]) last = v;
        const struct ps_node *n = &nodes[v];
        double dur = end[v] - start[v];
        if (n->stream >= 0 &&
            (rc = ps_trace_add(&s->trace, v, n->device, n->stream, start[v], dur, NULL))) {
            rc = ps_diag_set(diag, rc, "simulator", "out of memory");
            goto out;
        }
        if (n->kind == PS_NODE_COPY) s->copy_us += dur;
        if (n->stream < 0 || g->streams[n->stream].kind != PS_STREAM_COMPUTE) continue;
        int d = n->device >= 0 && n->device < nd ? n->device : 0;
        struct ps_sim_device *dv = &s->dev[d];
        dv->busy_us += dur;
        switch ((enum ps_node_kind)n->kind) {
        case PS_NODE_COMPUTE:
            if (n->phase == PS_PHASE_FWD) dv->forward_us += dur;
            else dv->backward_us += dur;
            break;
        case PS_NODE_WGRAD: dv->backward_us += dur; break;
        case PS_NODE_RECOMPUTE: dv->recompute_us += dur; break;
        case PS_NODE_OPTIM: dv->optimizer_us += dur; break;
        default: break;
        }
    }
    s->makespan_us = last == PS_NONE ? 0 : end[last];
    for (int d = 0; d < nd; d++) {
        struct ps_sim_device *dv = &s->dev[d];
        dv->bubble_fraction = s->makespan_us > 0 ? 1.0 - dv->busy_us / s->makespan_us : 0;
        s->bubble_fraction += dv->bubble_fraction / nd;
        s->forward_us += dv->forward_us;
        s->backward_us += dv->backward_us;
        s->recompute_us += dv->recompute_us;
        s->optimizer_us += dv->optimizer_us;
    }
    s->recompute_share = s->recompute_us + s->backward_us > 0
                             ? s->recompute_us / (s->recompute_us + s->backward_us)
                             : 0;
    s->recompute_overhead = s->forward_us + s->backward_us > 0
                                ? s->recompute_us / (s->forward_us + s->backward_us)
                                : 0;
    /* critical path: binding constraints back from the node that ends last */
    uint32_t n_cp = 0;
    for (uint32_t v = last; v != PS_NONE && n_cp <= nv; v = why[v]) n_cp++;
    s->cp = malloc(((size_t)n_cp + 1) * sizeof(uint32_t));
    if (!s->cp) {
        rc = ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
        goto out;
    }
    s->cp_n = n_cp;
    s->cp_us = s->makespan_us;
    uint32_t k = n_cp;
    for (uint32_t v = last; v != PS_NONE && k > 0; v = why[v]) s->cp[--k] = v;
    if (memory(g, o, s)) rc = ps_diag_set(diag, -ENOMEM, "simulator", "out of memory");
out:
    free(issue);
    free(why);
    if (rc) ps_sim_finish(s);
    return rc;
}
