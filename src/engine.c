/* engine: PyTorch 1.13's autograd engine, modelled node by node (see engine.h).
 *
 * The ready queue of each engine thread is a std::priority_queue<NodeTask> ordered by
 * CompareNodeTaskTime: higher reentrant depth first, then higher sequence_nr. Sequence numbers of
 * different creating threads collide (G3 in graph.h), and which of two equal keys pops first then
 * depends on the binary heap's layout; so the heap below performs libstdc++'s push_heap/pop_heap
 * moves exactly (__push_heap, __adjust_heap), and everything PyTorch pushes onto that heap is
 * pushed here too, in the same order:
 *   - a graph node that stands for several autograd nodes (a partition's forward: its "program",
 *     ps_engine_program) runs them one by one, each pushing its next_functions in order;
 *   - AccumulateGrad nodes of parameters (sequence_nr UINT64_MAX) are pushed when their last
 *     gradient arrives: once per step for the tasks that recorded a graph, once per recompute;
 *   - the checkpoint phony is one leaf per device, its AccumulateGrad runs after the last
 *     Checkpoint backward;
 *   - Checkpoint.backward runs a reentrant backward of the recomputed program (depth 1) on the
 *     same queue before it pushes its own next_functions ([phony, input]).
 * The harness in tests/golden/order reproduces 726 recorded orders with this model and fails
 * on 91 of them when ties break by push order instead.
 */
#include "src/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- partition programs ---------------------------------------------------------------- */

static int add_node(struct ps_prog_node *prog, int *n)
{
    if (*n >= PS_PROG_MAX) return -1;
    memset(&prog[*n], 0, sizeof(prog[*n]));
    return (*n)++;
}

static void add_ref(struct ps_prog_node *nd, enum ps_ref_kind k, int arg)
{
    nd->next[nd->n_next++] = (struct ps_prog_ref){.kind = (uint8_t)k, .arg = (uint16_t)arg};
}

int ps_engine_program(const struct ps_spec *spec, const struct ps_model *model, int part,
                      bool input_requires_grad, struct ps_prog_node *prog, int *n_params)
{
    int n = 0, np = 0;
    int cur = -1;                 /* node producing the current tensor, -1 = partition input */
    bool rg = input_requires_grad; /* does the current tensor require grad */
    int first = spec->first_layer[part], count = spec->balance[part];
    for (int l = first; l < first + count; l++) {
        const struct ps_layer *ly = &spec->layers[l];
        int in_dims = model ? model->layers[l].n_in_dims : 1;
#define INPUT_REF(nd)                                                                          \
    do {                                                                                       \
        if (rg) add_ref((nd), cur >= 0 ? PS_REF_PREV : PS_REF_INPUT, cur >= 0 ? cur : 0);      \
    } while (0)
        switch (ly->op) {
        case PS_OP_LINEAR: {
            int w = np++, b = ly->bias ? np++ : -1;
            int t = add_node(prog, &n);
            if (t < 0) return -1;
            add_ref(&prog[t], PS_REF_PARAM, w);
            int a = add_node(prog, &n);
            if (a < 0) return -1;
            if (b >= 0) add_ref(&prog[a], PS_REF_PARAM, b);
            INPUT_REF(&prog[a]);
            add_ref(&prog[a], PS_REF_PREV, t);
            cur = a;
            rg = true;
            break;
        }
        case PS_OP_CONV2D: {
            int w = np++, b = ly->bias ? np++ : -1;
            int c = add_node(prog, &n);
            if (c < 0) return -1;
            INPUT_REF(&prog[c]);
            add_ref(&prog[c], PS_REF_PARAM, w);
            if (b >= 0) add_ref(&prog[c], PS_REF_PARAM, b);
            cur = c;
            rg = true;
            break;
        }
        case PS_OP_BATCHNORM: {
            int w = ly->affine ? np++ : -1, b = ly->affine ? np++ : -1;
            if (!rg && !ly->affine) break;
            int c = add_node(prog, &n);
            if (c < 0) return -1;
            INPUT_REF(&prog[c]);
            if (w >= 0) {
                add_ref(&prog[c], PS_REF_PARAM, w);
                add_ref(&prog[c], PS_REF_PARAM, b);
            }
            cur = c;
            rg = true;
            break;
        }
        case PS_OP_DROPOUT:
            if (ly->p <= 0) break;
            /* fall through */
        case PS_OP_RELU:
        case PS_OP_MAXPOOL2D:
        case PS_OP_FLATTEN: {
            if (!rg || (ly->op == PS_OP_FLATTEN && in_dims != 3)) break;
            int c = add_node(prog, &n);
            if (c < 0) return -1;
            INPUT_REF(&prog[c]);
            cur = c;
            break;
        }
        case PS_OP__COUNT: break;
        }
#undef INPUT_REF
    }
    if (n_params) *n_params = np;
    return n;
}

/* ---- the ready queue ------------------------------------------------------------------- */

enum item_kind { IT_NODE, IT_ACC };

struct task {
    uint64_t seq;
    uint32_t id;    /* graph node (IT_NODE) or accumulator (IT_ACC) */
    uint16_t k;     /* program node index within the graph node */
    uint8_t depth;  /* reentrant depth */
    uint8_t kind;
};

struct heap {
    struct task *a;
    uint32_t n, cap;
};

static bool less(const struct task *x, const struct task *y)
{
    if (x->depth != y->depth) return x->depth < y->depth;
    return x->seq < y->seq;
}

static void push_heap_from(struct task *a, uint32_t hole, struct task v)
{
    while (hole > 0) {
        uint32_t parent = (hole - 1) / 2;
        if (!less(&a[parent], &v)) break;
        a[hole] = a[parent];
        hole = parent;
    }
    a[hole] = v;
}

static int heap_push(struct heap *h, struct task t)
{
    if (h->n == h->cap) {
        uint32_t c = h->cap ? h->cap * 2 : 64;
        struct task *q = realloc(h->a, (size_t)c * sizeof(*q));
        if (!q) return -ENOMEM;
        h->a = q;
        h->cap = c;
    }
    h->a[h->n] = t;
    push_heap_from(h->a, h->n, t);
    h->n++;
    return 0;
}

static struct task heap_pop(struct heap *h)
{
    struct task *a = h->a;
    struct task top = a[0];
    uint32_t len = h->n - 1; /* std::pop_heap: the last element moves out, [0, len) re-heaped */
    if (len > 0) {
        struct task v = a[len];
        uint32_t hole = 0, child = 0;
        while (child < (len - 1) / 2) {
            child = 2 * (child + 1);
            if (less(&a[child], &a[child - 1])) child--;
            a[hole] = a[child];
            hole = child;
        }
        if ((len & 1) == 0 && child == (len - 2) / 2) {
            child = 2 * (child + 1);
            a[hole] = a[child - 1];
            hole = child - 1;
        }
        push_heap_from(a, hole, v);
    }
    h->n--;
    return top;
}

static bool dep_edge(const struct ps_edge *e)
{
    return e->kind == PS_EDGE_DATA || e->kind == PS_EDGE_PHONY;
}

/* ---- the engine ------------------------------------------------------------------------ */

struct prog_cache {
    struct ps_prog_node *nodes; /* PS_PROG_MAX */
    int n, n_params;
};

struct eng {
    const struct ps_graph *g;
    struct ps_order *o;
    int nt;
    struct heap *heaps;
    uint32_t *deps;        /* graph node dependencies */
    uint8_t *reach;
    /* programs: 2 per partition (input requires grad or not) */
    struct prog_cache *progs;
    uint32_t *prog_off;    /* per graph node: offset of its program's local deps, or UINT32_MAX */
    uint32_t *ldeps;       /* local dependencies of program nodes */
    uint32_t *acc_base;    /* per partition: first accumulator id of its parameters */
    uint32_t *accdeps;     /* per accumulator: outstanding gradients */
    uint32_t n_acc;
    uint32_t phony_acc0;   /* accumulator id of device d's checkpoint phony: phony_acc0 + d */
    uint32_t step;
};

static const struct prog_cache *prog_of(struct eng *e, uint32_t v)
{
    const struct ps_graph *g = e->g;
    const struct ps_node *nd = &g->nodes[v];
    if (nd->kind != PS_NODE_COMPUTE || nd->part < 0 || !g->spec) return NULL;
    uint32_t f = nd->twin;
    bool rg = f != PS_NONE && ps_graph_in_degree(g, f) > 0;
    if (f != PS_NONE) {
        rg = false;
        for (uint32_t k = g->in_off[f]; k < g->in_off[f + 1]; k++)
            rg |= g->edges[g->in_edge[k]].kind == PS_EDGE_DATA;
    }
    return &e->progs[2 * nd->part + (rg ? 1 : 0)];
}

/* Program node count of graph node v as the engine runs it: its own program for a partition
 * forward that recorded a graph, 2 (cat, sum) for the loss, else 1. */
static int prog_len(struct eng *e, uint32_t v)
{
    const struct ps_node *nd = &e->g->nodes[v];
    if (nd->kind == PS_NODE_LOSS) return 2;
    if (nd->kind == PS_NODE_COMPUTE && !nd->checkpointed) {
        const struct prog_cache *p = prog_of(e, v);
        if (p && p->n > 0) return p->n;
    }
    return 1;
}

static int push_node(struct eng *e, int t, uint32_t v, int k, uint8_t depth)
{
    const struct ps_node *nd = &e->g->nodes[v];
    int len = prog_len(e, v);
    struct task tk = {.seq = nd->seq - (uint64_t)(len - 1 - k), .id = v, .k = (uint16_t)k,
                      .depth = depth, .kind = IT_NODE};
    return heap_push(&e->heaps[t], tk);
}

static int push_acc(struct eng *e, int t, uint32_t acc, uint8_t depth)
{
    struct task tk = {.seq = UINT64_MAX, .id = acc, .k = 0, .depth = depth, .kind = IT_ACC};
    return heap_push(&e->heaps[t], tk);
}

static int thread_of(struct eng *e, uint32_t v)
{
    int d = e->g->nodes[v].device;
    return d >= 0 && d < e->nt ? d : 0;
}

/* graph node v delivers its gradients: edges in next_functions order */
static int deliver_input(struct eng *e, uint32_t v)
{
    const struct ps_graph *g = e->g;
    for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
        const struct ps_edge *ed = &g->edges[g->out_edge[k]];
        if (!dep_edge(ed)) continue;
        if (--e->deps[ed->dst] == 0) {
            uint32_t w = ed->dst;
            int rc = push_node(e, thread_of(e, w), w, prog_len(e, w) - 1, 0);
            if (rc) return rc;
        }
    }
    return 0;
}

/* Checkpoint.backward: torch.autograd.backward on the recomputed program, depth 1, same queue */
static int run_reentrant(struct eng *e, int t, const struct prog_cache *p)
{
    if (!p || p->n == 0) return 0;
    uint32_t ld[PS_PROG_MAX];
    memset(ld, 0, (size_t)p->n * sizeof(uint32_t));
    for (int q = 0; q < p->n; q++)
        for (int r = 0; r < p->nodes[q].n_next; r++)
            if (p->nodes[q].next[r].kind == PS_REF_PREV) ld[p->nodes[q].next[r].arg]++;
    struct heap *h = &e->heaps[t];
    int rc = heap_push(h, (struct task){.seq = (uint64_t)(p->n - 1), .id = 0,
                                        .k = (uint16_t)(p->n - 1), .depth = 1, .kind = IT_NODE});
    if (rc) return rc;
    uint32_t outstanding = 1;
    while (outstanding) {
        struct task tk = heap_pop(h);
        outstanding--;
        if (tk.kind == IT_ACC) continue;
        const struct ps_prog_node *pn = &p->nodes[tk.k];
        for (int r = 0; r < pn->n_next; r++) {
            const struct ps_prog_ref *ref = &pn->next[r];
            if (ref->kind == PS_REF_PREV) {
                if (--ld[ref->arg] == 0) {
                    rc = heap_push(h, (struct task){.seq = ref->arg, .id = 0, .k = ref->arg,
                                                    .depth = 1, .kind = IT_NODE});
                    outstanding++;
                }
            } else {
                /* a parameter, or the detached input leaf: its own AccumulateGrad, ready now */
                rc = push_acc(e, t, UINT32_MAX, 1);
                outstanding++;
            }
            if (rc) return rc;
        }
    }
    return 0;
}

static void record(struct eng *e, uint32_t v, int t)
{
    struct ps_order *o = e->o;
    if (o->pos[v] != UINT32_MAX) return;
    o->pos[v] = o->n;
    o->node[o->n] = v;
    o->thread[o->n] = t;
    o->step[o->n] = e->step;
    o->n++;
}

/* Runs one popped task on thread t. */
static int execute(struct eng *e, int t, struct task tk)
{
    const struct ps_graph *g = e->g;
    if (tk.kind == IT_ACC) return 0;
    uint32_t v = tk.id;
    const struct ps_node *nd = &g->nodes[v];
    int len = prog_len(e, v);
    if (tk.k == len - 1) record(e, v, t);
    int rc;
    if (nd->kind == PS_NODE_COMPUTE && nd->checkpointed) {
        /* Checkpoint.backward: the recomputed graph first, then [phony, input] */
        if ((rc = run_reentrant(e, t, prog_of(e, v)))) return rc;
        uint32_t acc = e->phony_acc0 + (uint32_t)thread_of(e, v);
        if (--e->accdeps[acc] == 0 && (rc = push_acc(e, t, acc, 0))) return rc;
        return deliver_input(e, v);
    }
    if (nd->kind == PS_NODE_LOSS) {
        if (tk.k == 1) return push_node(e, t, v, 0, 0); /* sum -> cat */
        return deliver_input(e, v);
    }
    const struct prog_cache *p = nd->kind == PS_NODE_COMPUTE ? prog_of(e, v) : NULL;
    if (!p || p->n == 0) return deliver_input(e, v);
    const struct ps_prog_node *pn = &p->nodes[tk.k];
    uint32_t *ld = &e->ldeps[e->prog_off[v]];
    for (int r = 0; r < pn->n_next; r++) {
        const struct ps_prog_ref *ref = &pn->next[r];
        rc = 0;
        switch ((enum ps_ref_kind)ref->kind) {
        case PS_REF_PREV:
            if (--ld[ref->arg] == 0) rc = push_node(e, t, v, ref->arg, 0);
            break;
        case PS_REF_PARAM: {
            uint32_t acc = e->acc_base[nd->part] + ref->arg;
            if (--e->accdeps[acc] == 0) rc = push_acc(e, t, acc, 0);
            break;
        }
        case PS_REF_INPUT: rc = deliver_input(e, v); break;
        }
        if (rc) return rc;
    }
    return 0;
}

int ps_engine_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag)
{
    memset(o, 0, sizeof(*o));
    struct eng e = {.g = g, .o = o};
    uint32_t nv = g->n_nodes;
    int np = g->spec ? g->spec->n_partitions : 0;
    e.nt = g->n_devices > 0 ? g->n_devices : 1;
    o->node = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->thread = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(int32_t));
    o->step = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->pos = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    e.deps = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    e.reach = ps_graph_big_alloc((size_t)nv + 1);
    e.prog_off = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *stack = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (e.deps) memset(e.deps, 0, ((size_t)nv + 1) * sizeof(uint32_t));
    if (e.reach) memset(e.reach, 0, (size_t)nv + 1);
    e.heaps = calloc((size_t)e.nt, sizeof(*e.heaps));
    e.progs = calloc((size_t)2 * np + 1, sizeof(*e.progs));
    e.acc_base = calloc((size_t)np + 1, sizeof(uint32_t));
    struct task *running = malloc((size_t)e.nt * sizeof(*running));
    int rc = 0;
    if (!o->node || !o->thread || !o->step || !o->pos || !e.deps || !e.reach || !e.prog_off ||
        !stack || !e.heaps || !e.progs || !e.acc_base || !running)
        goto nomem;
    for (uint32_t v = 0; v < nv; v++) o->pos[v] = UINT32_MAX;

    /* forward: host order = creation order */
    for (uint32_t v = 0; v < nv; v++) {
        if (g->nodes[v].phase != PS_PHASE_FWD) continue;
        o->pos[v] = o->n;
        o->node[o->n] = v;
        o->thread[o->n] = g->nodes[v].device;
        o->step[o->n] = o->n;
        o->n++;
    }
    o->n_fwd = o->n;
    if (g->root == PS_NONE) goto out;

    /* partition programs and accumulator ids */
    for (int j = 0; j < np; j++) {
        e.acc_base[j] = e.n_acc;
        int npar = 0;
        for (int rg = 0; rg < 2; rg++) {
            struct prog_cache *p = &e.progs[2 * j + rg];
            if (!(p->nodes = malloc(PS_PROG_MAX * sizeof(*p->nodes)))) goto nomem;
            p->n = ps_engine_program(g->spec, g->model, j, rg, p->nodes, &p->n_params);
            if (p->n < 0) p->n = 0;
            npar = p->n_params;
        }
        e.n_acc += (uint32_t)npar;
    }
    e.phony_acc0 = e.n_acc;
    e.n_acc += (uint32_t)e.nt;
    if (!(e.accdeps = calloc((size_t)e.n_acc + 1, sizeof(uint32_t)))) goto nomem;

    /* reachability from the root, dependencies, program-local dependencies */
    uint32_t sp = 0, total = 0, nld = 0;
    stack[sp++] = g->root;
    e.reach[g->root] = 1;
    while (sp) {
        uint32_t v = stack[--sp];
        total++;
        for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
            const struct ps_edge *ed = &g->edges[g->out_edge[k]];
            if (!dep_edge(ed)) continue;
            e.deps[ed->dst]++;
            if (!e.reach[ed->dst]) {
                e.reach[ed->dst] = 1;
                stack[sp++] = ed->dst;
            }
        }
    }
    for (uint32_t v = 0; v < nv; v++) {
        e.prog_off[v] = UINT32_MAX;
        if (!e.reach[v]) continue;
        const struct ps_node *nd = &g->nodes[v];
        if (nd->kind != PS_NODE_COMPUTE) continue;
        if (nd->checkpointed) {
            e.accdeps[e.phony_acc0 + (uint32_t)thread_of(&e, v)]++;
            continue;
        }
        const struct prog_cache *p = prog_of(&e, v);
        if (!p || !p->n) continue;
        e.prog_off[v] = nld;
        nld += (uint32_t)p->n;
        for (int q = 0; q < p->n; q++)
            for (int r = 0; r < p->nodes[q].n_next; r++)
                if (p->nodes[q].next[r].kind == PS_REF_PARAM)
                    e.accdeps[e.acc_base[nd->part] + p->nodes[q].next[r].arg]++;
    }
    if (!(e.ldeps = calloc((size_t)nld + 1, sizeof(uint32_t)))) goto nomem;
    for (uint32_t v = 0; v < nv; v++) {
        if (e.prog_off[v] == UINT32_MAX) continue;
        const struct prog_cache *p = prog_of(&e, v);
        for (int q = 0; q < p->n; q++)
            for (int r = 0; r < p->nodes[q].n_next; r++)
                if (p->nodes[q].next[r].kind == PS_REF_PREV)
                    e.ldeps[e.prog_off[v] + p->nodes[q].next[r].arg]++;
    }

    if ((rc = push_node(&e, thread_of(&e, g->root), g->root, prog_len(&e, g->root) - 1, 0)))
        goto nomem;
    /* lockstep: in each step every thread with work runs one autograd node; what it makes ready
       is pushed after the step, thread by thread */
    for (;;) {
        int busy = 0;
        for (int t = 0; t < e.nt; t++) {
            running[t].kind = 0xff;
            if (e.heaps[t].n == 0) continue;
            running[t] = heap_pop(&e.heaps[t]);
            busy++;
        }
        if (!busy) break;
        for (int t = 0; t < e.nt; t++) {
            if (running[t].kind == 0xff) continue;
            if ((rc = execute(&e, t, running[t]))) goto nomem;
        }
        e.step++;
    }
    uint32_t done = 0;
    for (uint32_t v = 0; v < nv; v++) done += e.reach[v] && o->pos[v] != UINT32_MAX;
    if (done < total) {
        char buf[64];
        uint32_t stuck = UINT32_MAX;
        for (uint32_t v = 0; v < nv && stuck == UINT32_MAX; v++)
            if (e.reach[v] && o->pos[v] == UINT32_MAX) stuck = v;
        rc = ps_diag_set(diag, -EDEADLK, "engine",
                         "backward is stuck: %u of %u nodes never became ready, e.g. %s",
                         total - done, total,
                         stuck == UINT32_MAX ? "?" : ps_node_name(g, stuck, buf, sizeof(buf)));
    }
    goto out;
nomem:
    rc = ps_diag_set(diag, -ENOMEM, "engine", "out of memory");
out:
    free(e.deps);
    free(e.reach);
    free(e.prog_off);
    free(e.ldeps);
    free(e.accdeps);
    free(e.acc_base);
    if (e.progs)
        for (int j = 0; j < 2 * np; j++) free(e.progs[j].nodes);
    free(e.progs);
    free(stack);
    if (e.heaps)
        for (int t = 0; t < e.nt; t++) free(e.heaps[t].a);
    free(e.heaps);
    free(running);
    if (rc && rc != -EDEADLK) ps_order_finish(o);
    return rc;
}
