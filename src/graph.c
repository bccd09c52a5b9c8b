/* graph: the arena of nodes, edges and streams that every schedule builds into (graph.h), with
 * the CSR adjacency, names, structural validation and stream order. It knows no schedule: the
 * builders live in src/sched/ behind the table of schedule.h (GPipe's mirrors torchgpipe 0.0.7
 * in src/sched/gpipe.c; the others go through plan.c), and nothing here includes them.
 */
#include "src/graph.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Big arrays (the graph at n=64, m=1024 is ~250 MB) are backed by transparent huge pages when
 * the kernel offers them on request: first touches then fault 2 MiB at a time instead of 4 KiB,
 * which was a quarter of build + check. */
void *ps_graph_big_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < 2 * huge) return malloc(bytes ? bytes : 1);
    size_t size = (bytes + huge - 1) & ~(huge - 1);
    void *p = aligned_alloc(huge, size);
    if (p) madvise(p, size, MADV_HUGEPAGE);
    return p;
}

static void *grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return p;
    uint32_t c = *cap ? *cap : 64;
    while (c < need) c = c > UINT32_MAX / 2 ? UINT32_MAX : c * 2;
    void *q = realloc(p, (size_t)c * elem);
    if (!q) {
        fprintf(stderr, "pipescope: out of memory (%zu bytes)\n", (size_t)c * elem);
        abort();
    }
    *cap = c;
    return q;
}

struct ps_graph *ps_graph_create(const struct ps_spec *spec, const struct ps_model *model,
                                 const struct ps_variant *opts, int m, int n)
{
    struct ps_graph *g = calloc(1, sizeof(*g));
    if (!g) return NULL;
    g->spec = spec;
    g->model = model;
    g->var = *opts;
    g->m = m;
    g->n = n;
    g->n_devices = spec ? spec->n_devices : n;
    g->loss = g->root = PS_NONE;
    g->checkpoint_stop = ps_variant_checkpoint_stop(opts);
    if (spec) {
        g->mb_size = malloc(((size_t)m + 1) * sizeof(*g->mb_size));
        if (!g->mb_size) {
            free(g);
            return NULL;
        }
        for (int i = 0; i < m; i++) g->mb_size[i] = ps_variant_mb_size(opts, i);
    }
    return g;
}

uint32_t ps_graph_add_node(struct ps_graph *g, const struct ps_node *proto)
{
    g->nodes = grow(g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes));
    g->nodes[g->n_nodes] = *proto;
    return g->n_nodes++;
}

void ps_graph_add_edge(struct ps_graph *g, uint32_t src, uint32_t dst, enum ps_edge_kind kind)
{
    if (src == PS_NONE || dst == PS_NONE) return;
    g->edges = grow(g->edges, &g->cap_edges, g->n_edges + 1, sizeof(*g->edges));
    g->edges[g->n_edges++] = (struct ps_edge){.src = src, .dst = dst, .kind = (uint8_t)kind};
}

int32_t ps_graph_add_stream(struct ps_graph *g, enum ps_stream_kind kind, int device, int part,
                            int mb)
{
    uint32_t cap = (uint32_t)g->cap_streams;
    g->streams = grow(g->streams, &cap, (uint32_t)g->n_streams + 1, sizeof(*g->streams));
    g->cap_streams = (int32_t)cap;
    g->streams[g->n_streams] =
        (struct ps_stream){.kind = (uint8_t)kind, .device = device, .part = part, .mb = mb};
    return g->n_streams++;
}

void ps_graph_destroy(struct ps_graph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->edges);
    free(g->streams);
    free(g->out_off);
    free(g->out_edge);
    free(g->in_off);
    free(g->in_edge);
    free(g->fwd);
    free(g->bwd);
    free(g->rec);
    free(g->mb_size);
    free(g);
}

int ps_graph_finalize(struct ps_graph *g)
{
    free(g->out_off);
    free(g->out_edge);
    free(g->in_off);
    free(g->in_edge);
    uint32_t nv = g->n_nodes, ne = g->n_edges;
    g->out_off = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    g->in_off = ps_graph_big_alloc(((size_t)nv + 1) * sizeof(uint32_t));
    g->out_edge = ps_graph_big_alloc(((size_t)ne + 1) * sizeof(uint32_t));
    g->in_edge = ps_graph_big_alloc(((size_t)ne + 1) * sizeof(uint32_t));
    if (g->out_off) memset(g->out_off, 0, ((size_t)nv + 1) * sizeof(uint32_t));
    if (g->in_off) memset(g->in_off, 0, ((size_t)nv + 1) * sizeof(uint32_t));
    if (!g->out_off || !g->in_off || !g->out_edge || !g->in_edge) return -ENOMEM;
    for (uint32_t e = 0; e < ne; e++) {
        g->out_off[g->edges[e].src + 1]++;
        g->in_off[g->edges[e].dst + 1]++;
    }
    for (uint32_t v = 0; v < nv; v++) {
        g->out_off[v + 1] += g->out_off[v];
        g->in_off[v + 1] += g->in_off[v];
    }
    uint32_t *po = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *pi = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (!po || !pi) {
        free(po);
        free(pi);
        return -ENOMEM;
    }
    memcpy(po, g->out_off, ((size_t)nv + 1) * sizeof(uint32_t));
    memcpy(pi, g->in_off, ((size_t)nv + 1) * sizeof(uint32_t));
    for (uint32_t e = 0; e < ne; e++) {
        g->out_edge[po[g->edges[e].src]++] = e;
        g->in_edge[pi[g->edges[e].dst]++] = e;
    }
    free(po);
    free(pi);
    return 0;
}

int ps_graph_filter_edges(struct ps_graph *g, bool (*keep)(const struct ps_edge *, void *),
                          void *ctx)
{
    uint32_t w = 0;
    for (uint32_t e = 0; e < g->n_edges; e++)
        if (keep(&g->edges[e], ctx)) g->edges[w++] = g->edges[e];
    g->n_edges = w;
    return ps_graph_finalize(g);
}

void ps_graph_estimate(int m, int n, enum ps_checkpoint c, uint64_t *nodes, uint64_t *edges)
{
    /* per task at most: F, W, Wo, C, fork, join, rfork, r, rjoin, each twice */
    uint64_t t = (uint64_t)m * (uint64_t)n;
    uint64_t per = c == PS_CKPT_NEVER ? 12 : 18;
    *nodes = t * per + 4 + 2 * (uint64_t)n;
    *edges = t * (per * 2 + 4) + 4 * (uint64_t)m;
}

double ps_graph_estimate_bytes(int m, int n, enum ps_checkpoint c)
{
    uint64_t nodes, edges;
    ps_graph_estimate(m, n, c, &nodes, &edges);
    /* the arrays, CSR and lookups, plus the per-node arrays of order, analysis and simulation */
    return (double)nodes * (double)(sizeof(struct ps_node) + 128) +
           (double)(edges + nodes) * (double)(sizeof(struct ps_edge) + 8);
}

/* ---- names and checks ------------------------------------------------------------------ */

static const char *const kind_names[PS_NODE__COUNT] = {
    [PS_NODE_COMPUTE] = "compute", [PS_NODE_RECOMPUTE] = "recompute", [PS_NODE_WGRAD] = "wgrad",
    [PS_NODE_COPY] = "copy",       [PS_NODE_WAIT] = "wait",           [PS_NODE_FORK] = "fork",
    [PS_NODE_JOIN] = "join",       [PS_NODE_LOSS] = "loss",           [PS_NODE_OPTIM] = "optimizer",
};

const char *ps_node_kind_name(enum ps_node_kind k)
{
    return (unsigned)k < PS_NODE__COUNT ? kind_names[k] : "?";
}

const char *ps_edge_kind_name(enum ps_edge_kind k)
{
    static const char *const names[PS_EDGE__COUNT] = {"data", "phony", "host", "stream"};
    return (unsigned)k < PS_EDGE__COUNT ? names[k] : "?";
}

bool ps_node_is_task(const struct ps_node *nd)
{
    return nd->kind == PS_NODE_COMPUTE || nd->kind == PS_NODE_WGRAD ||
           (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD);
}

const char *ps_node_category(const struct ps_node *nd)
{
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE: return nd->phase == PS_PHASE_FWD ? "forward" : "backward";
    case PS_NODE_RECOMPUTE: return nd->phase == PS_PHASE_BWD ? "recompute" : "fork";
    case PS_NODE_WGRAD: return "backward";
    case PS_NODE_COPY: return "copy";
    case PS_NODE_WAIT: return "wait";
    case PS_NODE_FORK: return "fork";
    case PS_NODE_JOIN: return "join";
    case PS_NODE_LOSS: return "loss";
    case PS_NODE_OPTIM: return "optimizer";
    case PS_NODE__COUNT: break;
    }
    return "?";
}

const char *ps_node_name(const struct ps_graph *g, uint32_t id, char *buf, int len)
{
    const struct ps_node *nd = &g->nodes[id];
    bool bw = nd->phase == PS_PHASE_BWD;
    const char *pr = bw ? "'" : "";
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE: snprintf(buf, len, "%c(%d,%d)", bw ? 'B' : 'F', nd->mb, nd->part); break;
    case PS_NODE_RECOMPUTE:
        snprintf(buf, len, "%s(%d,%d)", bw ? "R" : "r", nd->mb, nd->part);
        break;
    case PS_NODE_WGRAD: snprintf(buf, len, "Wg(%d,%d)", nd->mb, nd->part); break;
    case PS_NODE_COPY: snprintf(buf, len, "C(%d,%d->%d)", nd->mb, nd->part, nd->peer); break;
    case PS_NODE_WAIT:
        snprintf(buf, len, "%s%s(%d,%d)", nd->role == PS_ROLE_OUT ? "Wo" : "W", pr, nd->mb,
                 nd->part);
        break;
    case PS_NODE_FORK:
    case PS_NODE_JOIN:
        snprintf(buf, len, "%s%s%s(%d,%d)", nd->role == PS_ROLE_RECOMPUTE ? "r" : "",
                 nd->kind == PS_NODE_FORK ? "fork" : "join", pr, nd->mb, nd->part);
        break;
    case PS_NODE_LOSS: snprintf(buf, len, "loss%s", pr); break;
    case PS_NODE_OPTIM: snprintf(buf, len, "opt(%d)", nd->part); break;
    case PS_NODE__COUNT: snprintf(buf, len, "?"); break;
    }
    return buf;
}

const char *ps_stream_name(const struct ps_graph *g, int32_t s, char *buf, int len)
{
    if (s < 0 || s >= g->n_streams) {
        snprintf(buf, len, "host");
        return buf;
    }
    const struct ps_stream *st = &g->streams[s];
    if (st->kind == PS_STREAM_COMPUTE)
        snprintf(buf, len, "compute");
    else
        snprintf(buf, len, "copy p%d mb %d", st->part, st->mb);
    return buf;
}

int ps_graph_validate(const struct ps_graph *g, struct ps_diag *diag)
{
    char a[64], b[64];
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (nd->kind >= PS_NODE__COUNT)
            return ps_diag_set(diag, -EINVAL, "graph", "node %u has kind %u", v, nd->kind);
        if (nd->twin != PS_NONE) {
            if (nd->twin >= g->n_nodes || g->nodes[nd->twin].twin != v ||
                g->nodes[nd->twin].phase == nd->phase)
                return ps_diag_set(diag, -EINVAL, "graph", "G2: %s and its twin disagree",
                                   ps_node_name(g, v, a, sizeof(a)));
        }
        if (nd->stream >= g->n_streams || nd->wait_on >= g->n_streams)
            return ps_diag_set(diag, -EINVAL, "graph", "node %s: stream out of range",
                               ps_node_name(g, v, a, sizeof(a)));
    }
    for (uint32_t e = 0; e < g->n_edges; e++) {
        const struct ps_edge *ed = &g->edges[e];
        if (ed->src >= g->n_nodes || ed->dst >= g->n_nodes || ed->kind >= PS_EDGE__COUNT)
            return ps_diag_set(diag, -EINVAL, "graph", "G1: edge %u out of range", e);
        if (ed->src == ed->dst)
            return ps_diag_set(diag, -EINVAL, "graph", "edge %u is a self loop on %s", e,
                               ps_node_name(g, ed->src, a, sizeof(a)));
        (void)b;
    }
    if (!g->out_off || g->out_off[g->n_nodes] != g->n_edges || g->in_off[g->n_nodes] != g->n_edges)
        return ps_diag_set(diag, -EINVAL, "graph", "G5: adjacency not built");
    return 0;
}

/* ---- stream order (added for the simulator) ---------------------------------------------- */

int ps_graph_add_stream_order(struct ps_graph *g, const struct ps_order *order)
{
    int32_t ns = g->n_streams;
    uint32_t *last = malloc(((size_t)ns + 1) * sizeof(uint32_t));
    if (!last) return -ENOMEM;
    for (int32_t s = 0; s < ns; s++) last[s] = PS_NONE;
    for (uint32_t k = 0; k < order->n; k++) {
        uint32_t v = order->node[k];
        int32_t s = g->nodes[v].stream;
        if (s < 0 || s >= ns) continue;
        if (last[s] != PS_NONE) ps_graph_add_edge(g, last[s], v, PS_EDGE_STREAM);
        last[s] = v;
    }
    free(last);
    return ps_graph_finalize(g);
}

void ps_order_finish(struct ps_order *o)
{
    free(o->node);
    free(o->thread);
    free(o->step);
    free(o->pos);
    memset(o, 0, sizeof(*o));
}

void ps_node_set_optim_cost(struct ps_node *nd, const struct ps_model *model, int part)
{
    /* SGD: w -= lr * g: read w and g, write w, 2 FLOPs per parameter */
    double params = model ? (double)model->parts[part].params : 0.0;
    nd->flops = 2.0 * params;
    nd->bytes = 12.0 * params;
}

void ps_node_set_forward_work(struct ps_node *nd, const struct ps_partition_info *p, double bs)
{
    nd->flops = p->fwd_flops * bs;
    nd->bytes = p->fwd_bytes * bs + p->fwd_param_bytes;
}

/* ---- activation memory (src/model.c "Activation memory") ----------------------------------- */

static const struct ps_task_mem *task_mem(const struct ps_graph *g, const struct ps_node *nd)
{
    if (!g->model || !g->mb_size || nd->part < 0 || nd->part >= g->model->n_partitions ||
        nd->mb < 0 || nd->mb >= g->m)
        return NULL;
    const struct ps_partition_info *p = &g->model->parts[nd->part];
    if (nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_FWD)
        return nd->checkpointed ? &p->fwd_ckpt : &p->fwd;
    if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD) return &p->rec;
    return NULL;
}

void ps_graph_set_memory(struct ps_graph *g)
{
    if (!g->model || !g->mb_size || !g->fwd || !g->bwd) return;
    for (int i = 0; i < g->m; i++)
        for (int j = 0; j < g->n && j < g->model->n_partitions; j++) {
            size_t c = (size_t)i * (size_t)g->n + (size_t)j;
            int64_t bs = g->mb_size[i], kept = g->model->parts[j].in_bytes * bs;
            uint32_t v[2] = {g->fwd[c], g->rec ? g->rec[c] : PS_NONE};
            for (int k = 0; k < 2; k++) {
                if (v[k] == PS_NONE) continue;
                const struct ps_task_mem *t = task_mem(g, &g->nodes[v[k]]);
                g->nodes[v[k]].act_bytes = t ? t->net * bs : 0;
                kept += g->nodes[v[k]].act_bytes;
            }
            if (g->bwd[c] != PS_NONE) g->nodes[g->bwd[c]].act_bytes = -kept;
        }
}

void ps_node_mem(const struct ps_graph *g, uint32_t v, int64_t *tmp, int64_t *out, int *out_dev)
{
    const struct ps_node *nd = &g->nodes[v];
    const struct ps_task_mem *t = task_mem(g, nd);
    *tmp = t ? t->peak * g->mb_size[nd->mb] : 0;
    *out = 0;
    *out_dev = -1;
    if (!t || nd->phase != PS_PHASE_FWD || !g->fwd || nd->part + 1 >= g->n) return;
    uint32_t next = g->fwd[(size_t)nd->mb * (size_t)g->n + (size_t)nd->part + 1];
    if (next == PS_NONE) return;
    *out = g->model->parts[nd->part].out_bytes * g->mb_size[nd->mb];
    *out_dev = g->nodes[next].device;
}
