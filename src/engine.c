/* engine: PyTorch 1.13's autograd engine, modelled node by node (see engine.h).
 *
 * The ready queue of each engine thread is a std::priority_queue<NodeTask> ordered by
 * CompareNodeTaskTime: higher reentrant depth first, then higher sequence_nr. Sequence numbers
 * of different creating threads can be equal; which of two equal keys pops first then depends
 * on the binary heap's layout, so the heap below performs libstdc++'s push_heap/pop_heap moves
 * exactly (__push_heap, __adjust_heap) to pop in the same order as PyTorch.
 *
 * A checkpointed task's backward (Checkpoint.backward) runs a reentrant backward whose nodes
 * all have depth + 1 and therefore run before anything of the outer graph: it is one atomic step.
 */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct task {
    uint64_t seq;
    uint32_t node;
    uint16_t step; /* chain step: this entry stands for autograd node seq = node.seq - step */
};

struct heap {
    struct task *a;
    uint32_t n, cap;
};

static bool less(const struct task *x, const struct task *y)
{
    return x->seq < y->seq; /* same reentrant depth everywhere outside checkpoints */
}

static void push_heap_from(struct task *a, uint32_t hole, uint32_t top, struct task v)
{
    while (hole > top) {
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
    push_heap_from(h->a, h->n, 0, t);
    h->n++;
    return 0;
}

static struct task heap_pop(struct heap *h)
{
    struct task *a = h->a;
    struct task top = a[0];
    uint32_t len = h->n - 1; /* heap [0, len) after moving the last element out */
    if (len > 0) {
        struct task v = a[len];
        a[len] = a[0];
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
        push_heap_from(a, hole, 0, v);
    }
    h->n--;
    return top;
}

void ps_order_finish(struct ps_order *o)
{
    free(o->node);
    free(o->thread);
    free(o->step);
    free(o->pos);
    memset(o, 0, sizeof(*o));
}

static bool dep_edge(const struct ps_edge *e)
{
    return e->kind == PS_EDGE_DATA || e->kind == PS_EDGE_PHONY;
}

int ps_engine_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag)
{
    memset(o, 0, sizeof(*o));
    uint32_t nv = g->n_nodes;
    int nt = g->n_devices > 0 ? g->n_devices : 1;
    o->node = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->thread = malloc(((size_t)nv + 1) * sizeof(int32_t));
    o->step = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->pos = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *deps = calloc((size_t)nv + 1, sizeof(uint32_t));
    uint8_t *reach = calloc((size_t)nv + 1, 1);
    uint32_t *stack = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    struct heap *heaps = calloc((size_t)nt, sizeof(*heaps));
    struct task *running = malloc((size_t)nt * sizeof(*running));
    int rc = 0;
    if (!o->node || !o->thread || !o->step || !o->pos || !deps || !reach || !stack || !heaps ||
        !running) {
        rc = ps_diag_set(diag, -ENOMEM, "engine", "out of memory");
        goto out;
    }
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

    /* dependencies of nodes reachable from the root */
    uint32_t sp = 0;
    stack[sp++] = g->root;
    reach[g->root] = 1;
    while (sp) {
        uint32_t v = stack[--sp];
        for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->out_edge[k]];
            if (!dep_edge(e)) continue;
            deps[e->dst]++;
            if (!reach[e->dst]) {
                reach[e->dst] = 1;
                stack[sp++] = e->dst;
            }
        }
    }

    const struct ps_node *rn = &g->nodes[g->root];
    rc = heap_push(&heaps[rn->device < nt ? rn->device : 0],
                   (struct task){.seq = rn->seq, .node = g->root, .step = 0});
    if (rc) goto nomem;
    uint32_t done = 0, total = 0, step = 0;
    for (uint32_t v = 0; v < nv; v++) total += reach[v];
    while (done < total) {
        int busy = 0;
        for (int t = 0; t < nt; t++) {
            if (heaps[t].n == 0) {
                running[t].node = UINT32_MAX;
                continue;
            }
            running[t] = heap_pop(&heaps[t]);
            busy++;
            const struct ps_node *nd = &g->nodes[running[t].node];
            if (running[t].step == 0) {
                o->pos[running[t].node] = o->n;
                o->node[o->n] = running[t].node;
                o->thread[o->n] = t;
                o->step[o->n] = step;
                o->n++;
            }
            (void)nd;
        }
        if (!busy) break;
        /* deliveries become visible after the step, thread by thread */
        for (int t = 0; t < nt; t++) {
            struct task cur = running[t];
            if (cur.node == UINT32_MAX) continue;
            const struct ps_node *nd = &g->nodes[cur.node];
            bool atomic = nd->kind == PS_NODE_COMPUTE && nd->checkpointed;
            if (!atomic && (uint32_t)cur.step + 1 < nd->n_seq) {
                struct task nx = {.seq = nd->seq - cur.step - 1, .node = cur.node,
                                  .step = (uint16_t)(cur.step + 1)};
                if ((rc = heap_push(&heaps[t], nx))) goto nomem;
                continue;
            }
            done++;
            uint32_t v = cur.node;
            for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
                const struct ps_edge *e = &g->edges[g->out_edge[k]];
                if (!dep_edge(e)) continue;
                if (--deps[e->dst] == 0) {
                    const struct ps_node *dn = &g->nodes[e->dst];
                    int th = dn->device >= 0 && dn->device < nt ? dn->device : 0;
                    if ((rc = heap_push(&heaps[th], (struct task){.seq = dn->seq,
                                                                   .node = e->dst,
                                                                   .step = 0})))
                        goto nomem;
                }
            }
        }
        step++;
    }
    if (done < total) {
        char buf[64];
        uint32_t stuck = UINT32_MAX;
        for (uint32_t v = 0; v < nv && stuck == UINT32_MAX; v++)
            if (reach[v] && o->pos[v] == UINT32_MAX) stuck = v;
        rc = ps_diag_set(diag, -EDEADLK, "engine",
                         "backward is stuck: %u of %u nodes never became ready, e.g. %s",
                         total - done, total,
                         stuck == UINT32_MAX ? "?" : ps_node_name(g, stuck, buf, sizeof(buf)));
    }
    goto out;
nomem:
    rc = ps_diag_set(diag, -ENOMEM, "engine", "out of memory");
out:
    free(deps);
    free(reach);
    free(stack);
    if (heaps)
        for (int t = 0; t < nt; t++) free(heaps[t].a);
    free(heaps);
    free(running);
    if (rc && rc != -EDEADLK) ps_order_finish(o);
    return rc;
}
