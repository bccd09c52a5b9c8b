/* analysis: static checks over the task graph (see analysis.h for the invariants I1-I5).
 *
 * hb queries run in two phases: a breadth-first search from u over DATA and PHONY edges limited
 * to 16 hops (the paths torchgpipe's graph provides are short: F(i,j) -> Wo -> fork -> join -> C
 * -> W -> F(i+1,j)), then, only when that finds nothing, a full depth-first search over every
 * kind of edge pruned by topological rank
 * (a node ranked after v cannot lead to v). Both use a visit stamp, so no clearing per query.
 */
#include "src/analysis.h"
#include "src/schedule.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const check_names[PS_CHECK__COUNT] = {
    [PS_CHECK_CYCLE] = "acyclic",
    [PS_CHECK_FORWARD_ORDER] = "forward-order",
    [PS_CHECK_BACKWARD_ORDER] = "backward-order",
    [PS_CHECK_RECOMPUTE] = "recompute-before-backward",
    [PS_CHECK_COPY_AFTER_PRODUCER] = "copy-after-producer",
    [PS_CHECK_COMPUTE_AFTER_WAIT] = "compute-after-wait",
    [PS_CHECK_RACE] = "stream-race",
};

const char *ps_check_name(enum ps_check c)
{
    return (unsigned)c < PS_CHECK__COUNT ? check_names[c] : "?";
}

static bool hb_edge(const struct ps_edge *e)
{
    return e->kind != PS_EDGE__COUNT; /* every kind orders execution */
}

int ps_analysis_topo(const struct ps_graph *g, uint32_t *order, uint32_t **cycle,
                     uint32_t *cycle_len)
{
    uint32_t nv = g->n_nodes;
    uint32_t *indeg = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (!indeg) return -ENOMEM;
    memset(indeg, 0, ((size_t)nv + 1) * sizeof(uint32_t));
    for (uint32_t e = 0; e < g->n_edges; e++)
        if (hb_edge(&g->edges[e])) indeg[g->edges[e].dst]++;
    uint32_t head = 0, tail = 0;
    for (uint32_t v = 0; v < nv; v++)
        if (!indeg[v]) order[tail++] = v;
    while (head < tail) {
        uint32_t v = order[head++];
        for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->out_edge[k]];
            if (hb_edge(e) && --indeg[e->dst] == 0) order[tail++] = e->dst;
        }
    }
    if (tail == nv) {
        free(indeg);
        return 0;
    }
    /* a cycle: every remaining node has a remaining predecessor; walk predecessors until a
       node repeats */
    uint32_t *seen = calloc((size_t)nv + 1, sizeof(uint32_t));
    uint32_t *path = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (!seen || !path) {
        free(seen);
        free(path);
        free(indeg);
        return -ENOMEM;
    }
    uint32_t v = 0;
    while (indeg[v] == 0) v++;
    uint32_t len = 0;
    while (!seen[v]) {
        seen[v] = ++len;
        path[len - 1] = v;
        uint32_t p = PS_NONE;
        for (uint32_t k = g->in_off[v]; k < g->in_off[v + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->in_edge[k]];
            if (hb_edge(e) && indeg[e->src]) {
                p = e->src;
                break;
            }
        }
        v = p;
    }
    /* path[seen[v]-1 .. len-1] is the cycle, walked backwards */
    uint32_t start = seen[v] - 1, n = len - start;
    uint32_t *cyc = malloc((size_t)n * sizeof(uint32_t));
    if (cyc)
        for (uint32_t k = 0; k < n; k++) cyc[k] = path[len - 1 - k];
    *cycle = cyc;
    *cycle_len = cyc ? n : 0;
    free(seen);
    free(path);
    free(indeg);
    return -ELOOP;
}

struct ps_hb {
    const struct ps_graph *g;
    uint32_t *rank;
    uint32_t *stamp;
    uint32_t cur;
    uint32_t *queue;
    uint8_t *depth;
};

struct ps_hb *ps_hb_create(const struct ps_graph *g)
{
    struct ps_hb *h = calloc(1, sizeof(*h));
    uint32_t nv = g->n_nodes;
    if (!h) return NULL;
    h->g = g;
    h->rank = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    h->stamp = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    h->queue = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    h->depth = ps_graph_big_alloc((size_t)nv + 1);
    uint32_t *order = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (h->stamp) memset(h->stamp, 0, ((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *cyc = NULL, clen = 0;
    if (!h->rank || !h->stamp || !h->queue || !h->depth || !order ||
        ps_analysis_topo(g, order, &cyc, &clen) != 0) {
        free(cyc);
        free(order);
        ps_hb_destroy(h);
        return NULL;
    }
    for (uint32_t k = 0; k < nv; k++) h->rank[order[k]] = k;
    free(order);
    return h;
}

void ps_hb_destroy(struct ps_hb *h)
{
    if (!h) return;
    free(h->rank);
    free(h->stamp);
    free(h->queue);
    free(h->depth);
    free(h);
}

bool ps_hb(struct ps_hb *h, uint32_t u, uint32_t v)
{
    const struct ps_graph *g = h->g;
    if (u == PS_NONE || v == PS_NONE || u == v) return false;
    uint32_t rv = h->rank[v];
    if (h->rank[u] >= rv) return false;
    /* phase 1: bounded breadth-first search */
    if (++h->cur == 0) {
        memset(h->stamp, 0, (size_t)g->n_nodes * sizeof(uint32_t));
        h->cur = 1;
    }
    uint32_t head = 0, tail = 0;
    h->queue[tail++] = u;
    h->stamp[u] = h->cur;
    h->depth[u] = 0;
    bool truncated = false;
    while (head < tail) {
        uint32_t x = h->queue[head++];
        for (uint32_t k = g->out_off[x]; k < g->out_off[x + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->out_edge[k]];
            uint32_t y = e->dst;
            if (e->kind != PS_EDGE_DATA && e->kind != PS_EDGE_PHONY) {
                truncated = true; /* host/stream edges are left to phase 2 */
                continue;
            }
            if (y == v) return true;
            if (h->stamp[y] == h->cur || h->rank[y] > rv) continue;
            if (h->depth[x] >= 16) {
                truncated = true;
                continue;
            }
            h->stamp[y] = h->cur;
            h->depth[y] = (uint8_t)(h->depth[x] + 1);
            h->queue[tail++] = y;
        }
    }
    if (!truncated) return false;
    /* phase 2: exhaustive search pruned by rank */
    if (++h->cur == 0) {
        memset(h->stamp, 0, (size_t)g->n_nodes * sizeof(uint32_t));
        h->cur = 1;
    }
    uint32_t sp = 0;
    h->queue[sp++] = u;
    h->stamp[u] = h->cur;
    while (sp) {
        uint32_t x = h->queue[--sp];
        for (uint32_t k = g->out_off[x]; k < g->out_off[x + 1]; k++) {
            uint32_t y = g->edges[g->out_edge[k]].dst;
            if (y == v) return true;
            if (h->stamp[y] == h->cur || h->rank[y] > rv) continue;
            h->stamp[y] = h->cur;
            h->queue[sp++] = y;
        }
    }
    return false;
}

static void add_violation(struct ps_analysis *a, const struct ps_graph *g, enum ps_check c,
                          uint32_t x, uint32_t y, const char *what)
{
    a->n_violations++;
    a->per_check[c]++;
    a->ok = false;
    if (a->n_kept >= PS_ANALYSIS_MAX_KEPT) return;
    struct ps_violation *v = &a->v[a->n_kept++];
    char bx[64], by[64];
    v->check = c;
    v->a = x;
    v->b = y;
    snprintf(v->msg, sizeof(v->msg), "%s %s %s", ps_node_name(g, x, bx, sizeof(bx)), what,
             ps_node_name(g, y, by, sizeof(by)));
}

static void expect_hb(struct ps_analysis *a, struct ps_hb *h, enum ps_check c, uint32_t x,
                      uint32_t y)
{
    if (x == PS_NONE || y == PS_NONE) return;
    a->checked[c]++;
    if (!ps_hb(h, x, y))
        add_violation(a, h->g, c, x, y, "is not guaranteed to run before");
}

/* twin of a forward node found by walking F(i,j)'s input chain: the wait W(i,j) */
static uint32_t pred_of_kind(const struct ps_graph *g, uint32_t v, enum ps_node_kind kind,
                             enum ps_role role)
{
    for (uint32_t k = g->in_off[v]; k < g->in_off[v + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->in_edge[k]];
        const struct ps_node *s = &g->nodes[e->src];
        if (e->kind == PS_EDGE_DATA && s->kind == kind && s->role == role) return e->src;
    }
    return PS_NONE;
}

static uint32_t succ_of_kind(const struct ps_graph *g, uint32_t v, enum ps_node_kind kind)
{
    for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->out_edge[k]];
        if (e->kind == PS_EDGE_DATA && g->nodes[e->dst].kind == kind) return e->dst;
    }
    return PS_NONE;
}

/* Streams on which a tensor is visible, as it travels through waits and copies. */
struct vis {
    int32_t s[6];
    int n;
};

static bool vis_has(const struct vis *v, int32_t s)
{
    for (int k = 0; k < v->n; k++)
        if (v->s[k] == s) return true;
    return false;
}

static void vis_add(struct vis *v, int32_t s)
{
    if (s >= 0 && !vis_has(v, s) && v->n < 6) v->s[v->n++] = s;
}

static bool passes_through(const struct ps_node *nd)
{
    return nd->kind == PS_NODE_FORK || nd->kind == PS_NODE_JOIN || nd->kind == PS_NODE_WAIT ||
           (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_FWD);
}

static void race_walk(struct ps_analysis *a, const struct ps_graph *g, uint32_t producer,
                      uint32_t x, struct vis vis, int depth)
{
    if (depth > 64) return;
    for (uint32_t k = g->out_off[x]; k < g->out_off[x + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->out_edge[k]];
        if (e->kind != PS_EDGE_DATA) continue;
        const struct ps_node *y = &g->nodes[e->dst];
        if (passes_through(y)) {
            struct vis nv = vis;
            if (y->kind == PS_NODE_WAIT && vis_has(&vis, y->wait_on)) vis_add(&nv, y->stream);
            race_walk(a, g, producer, e->dst, nv, depth + 1);
            continue;
        }
        if (y->stream < 0) continue; /* host-only consumer */
        a->checked[PS_CHECK_RACE]++;
        if (!vis_has(&vis, y->stream))
            add_violation(a, g, PS_CHECK_RACE, producer, e->dst,
                          "writes a tensor read without an event by");
    }
}

static void check_races(struct ps_analysis *a, const struct ps_graph *g)
{
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (nd->stream < 0 || passes_through(nd)) continue;
        struct vis vis = {.n = 0};
        vis_add(&vis, nd->stream);
        if (nd->kind == PS_NODE_COPY) vis_add(&vis, nd->wait_on); /* two-way barrier */
        race_walk(a, g, v, v, vis, 0);
    }
}

static void mem_bump(int64_t *cur, struct ps_mem *mem, int d, int64_t bytes, uint32_t k)
{
    if (cur[d] + bytes > mem[d].peak_bytes) {
        mem[d].peak_bytes = cur[d] + bytes;
        mem[d].peak_entry = k;
    }
}

void ps_analysis_memory(const struct ps_graph *g, const struct ps_order *order, struct ps_mem *mem)
{
    int nd_ = g->n_devices > 0 ? g->n_devices : 1;
    int64_t *cur = calloc((size_t)nd_, sizeof(int64_t));
    for (int d = 0; d < nd_; d++) mem[d] = (struct ps_mem){0, 0};
    if (!cur) return;
    /* each node in turn: its high-water while it runs, the output it hands on, its net change */
    for (uint32_t k = 0; k < order->n; k++) {
        uint32_t v = order->node[k];
        const struct ps_node *nd = &g->nodes[v];
        int d = nd->device >= 0 && nd->device < nd_ ? nd->device : 0;
        int64_t tmp, out;
        int od;
        ps_node_mem(g, v, &tmp, &out, &od);
        mem_bump(cur, mem, d, tmp, k);
        if (out && od >= 0 && od < nd_) {
            cur[od] += out;
            mem_bump(cur, mem, od, 0, k);
        }
        cur[d] += nd->act_bytes;
        mem_bump(cur, mem, d, 0, k);
    }
    free(cur);
}

static int critical_path(const struct ps_graph *g, const uint32_t *topo, const double *cost,
                         struct ps_critical_path *cp)
{
    uint32_t nv = g->n_nodes;
    double *dist = malloc(((size_t)nv + 1) * sizeof(double));
    uint32_t *prev = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (!dist || !prev) {
        free(dist);
        free(prev);
        return -ENOMEM;
    }
    uint32_t best = PS_NONE;
    for (uint32_t k = 0; k < nv; k++) {
        uint32_t v = topo[k];
        double d = 0;
        uint32_t p = PS_NONE;
        for (uint32_t q = g->in_off[v]; q < g->in_off[v + 1]; q++) {
            uint32_t s = g->edges[g->in_edge[q]].src;
            if (dist[s] > d || (p == PS_NONE && dist[s] >= d)) {
                d = dist[s];
                p = s;
            }
        }
        dist[v] = d + cost[v];
        prev[v] = p;
        if (best == PS_NONE || dist[v] > dist[best]) best = v;
    }
    cp->length_us = best == PS_NONE ? 0 : dist[best];
    uint32_t n = 0;
    for (uint32_t v = best; v != PS_NONE; v = prev[v]) n++;
    cp->nodes = malloc(((size_t)n + 1) * sizeof(uint32_t));
    if (!cp->nodes) n = 0;
    cp->n = n;
    uint32_t k = n;
    for (uint32_t v = best; v != PS_NONE && k > 0; v = prev[v]) cp->nodes[--k] = v;
    free(dist);
    free(prev);
    return 0;
}

int ps_analysis_run(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                    struct ps_analysis *a, struct ps_diag *diag)
{
    memset(a, 0, sizeof(*a));
    a->ok = true;
    a->v = calloc(PS_ANALYSIS_MAX_KEPT, sizeof(*a->v));
    uint32_t *topo = ps_graph_big_alloc(((size_t)g->n_nodes + 1) * sizeof(uint32_t));
    if (!a->v || !topo) {
        free(topo);
        return ps_diag_set(diag, -ENOMEM, "analysis", "out of memory");
    }
    a->checked[PS_CHECK_CYCLE] = 1;
    int rc = ps_analysis_topo(g, topo, &a->cycle, &a->cycle_len);
    if (rc == -ELOOP) {
        add_violation(a, g, PS_CHECK_CYCLE, a->cycle_len ? a->cycle[0] : 0,
                      a->cycle_len > 1 ? a->cycle[1] : 0, "is on a cycle with");
        free(topo);
        return 0; /* no hb on a cyclic graph */
    }
    if (rc) {
        free(topo);
        return ps_diag_set(diag, rc, "analysis", "out of memory");
    }
    struct ps_hb *h = ps_hb_create(g);
    if (!h) {
        free(topo);
        return ps_diag_set(diag, -ENOMEM, "analysis", "out of memory");
    }
    int m = g->m, n = g->n;
    /* a backward the autograd engine orders (GPipe's) runs each partition's micro-batches in
       reverse (the phony edges make it so); a plan promises the order it lists, one direction per
       stage: ascending (1F1B, interleaved, ZB-H1, PyTorch's GPipe) or descending (LoopedBFS), read
       from the stage's first two backwards, and every later pair must keep it */
    const struct ps_schedule_ops *ops = ps_schedule_ops(g->var.schedule);
    bool engine = ops && ops->engine_order;
    if (g->fwd && g->bwd) {
        for (int j = 0; j < n; j++) {
            bool reverse = engine;
            if (!engine && m > 1 && g->bwd[j] != PS_NONE && g->bwd[n + j] != PS_NONE)
                reverse = ps_hb(h, g->bwd[n + j], g->bwd[j]);
            for (int i = 0; i < m; i++) {
                size_t t = (size_t)i * n + j;
                uint32_t F = g->fwd[t], B = g->bwd[t];
                uint32_t R = g->rec ? g->rec[t] : PS_NONE;
                if (i + 1 < m) {
                    expect_hb(a, h, PS_CHECK_FORWARD_ORDER, F, g->fwd[t + n]);
                    if (reverse) {
                        expect_hb(a, h, PS_CHECK_BACKWARD_ORDER, g->bwd[t + n], B);
                        if (R != PS_NONE) expect_hb(a, h, PS_CHECK_RECOMPUTE, g->bwd[t + n], R);
                    } else {
                        expect_hb(a, h, PS_CHECK_BACKWARD_ORDER, B, g->bwd[t + n]);
                        uint32_t R1 = g->rec ? g->rec[t + n] : PS_NONE;
                        if (R1 != PS_NONE) expect_hb(a, h, PS_CHECK_RECOMPUTE, B, R1);
                    }
                }
                if (R != PS_NONE) expect_hb(a, h, PS_CHECK_RECOMPUTE, R, B);
                if (F == PS_NONE) continue;
                if (j > 0) {
                    uint32_t W = pred_of_kind(g, F, PS_NODE_WAIT, PS_ROLE_IN);
                    expect_hb(a, h, PS_CHECK_COMPUTE_AFTER_WAIT, W, F);
                    uint32_t C = W == PS_NONE ? PS_NONE : pred_of_kind(g, W, PS_NODE_COPY, 0);
                    expect_hb(a, h, PS_CHECK_COPY_AFTER_PRODUCER, g->fwd[t - 1], C);
                    if (C != PS_NONE)
                        expect_hb(a, h, PS_CHECK_COPY_AFTER_PRODUCER, B, g->nodes[C].twin);
                }
                if (j < n - 1 && B != PS_NONE) {
                    uint32_t Wo = succ_of_kind(g, F, PS_NODE_WAIT);
                    if (Wo != PS_NONE)
                        expect_hb(a, h, PS_CHECK_COMPUTE_AFTER_WAIT, g->nodes[Wo].twin, B);
                }
            }
        }
    }
    check_races(a, g);
    ps_hb_destroy(h);
    a->n_devices = g->n_devices > 0 ? g->n_devices : 1;
    if (order) {
        a->mem = calloc((size_t)a->n_devices, sizeof(*a->mem));
        if (a->mem) ps_analysis_memory(g, order, a->mem);
    }
    if (cost_us) critical_path(g, topo, cost_us, &a->cp);
    free(topo);
    return 0;
}

void ps_analysis_finish(struct ps_analysis *a)
{
    if (!a) return;
    free(a->v);
    free(a->cycle);
    free(a->mem);
    free(a->cp.nodes);
    memset(a, 0, sizeof(*a));
}
