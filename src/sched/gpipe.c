/* gpipe: the GPipe schedule, built the way torchgpipe 0.0.7 runs it, and its row of the
 * schedule table (schedule.h). Its graph is ordered by the autograd-engine model (engine.h).
 *
 * The builder replays Pipeline.run() of torchgpipe step by step (SEMANTICS.md sections 1-5) and
 * creates a node for every autograd Function it applies, in the same order and on the same
 * thread, so that the per-thread sequence numbers (graph.h, G3) are the ones PyTorch assigns:
 *
 *   for each tick k (tasks (i,j) with i+j = k, j ascending):
 *     fence   (main)   for each task: depend(X[i-1], X[i]) if i > 0  -> fork(i-1,j), join(i,j)
 *                                     copy X[i] if j > 0              -> C(i,j-1->j)
 *     compute (main)   for each task: wait if j > 0                   -> W(i,j)
 *             (worker) partition forward, or Checkpoint               -> F(i,j)
 *     collect (main)   for each task: wait if j < n-1                 -> Wo(i,j)
 *                                     if checkpointed: fork, Recompute, join -> rfork, r, rjoin
 *   then gather + loss (main)                                         -> loss
 *
 * X[i] names the node that produced micro-batch i's current tensor (cur[i] below). Every forward
 * node then gets its backward twin; backward edges are the forward edges reversed. With
 * variant.optimizer an optimizer step per partition follows every backward of it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/engine.h"
#include "src/schedule.h"

struct builder {
    struct ps_graph *g;
    uint64_t *seq;    /* per-thread counters: [0] main, [1 + d] worker of device d */
    uint32_t *cur;    /* cur[i]: producer of micro-batch i's current tensor (PS_NONE = input) */
    int32_t *cs;      /* copy stream cs[j][i] at cs[j*m + i], -1 until created */
    int32_t *compute; /* compute stream of each device */
    int64_t *mb_size;
};

static int dev_of(const struct ps_graph *g, int part)
{
    return g->spec ? g->spec->device_id[part] : part;
}

static int32_t copy_stream(struct builder *b, int part, int mb)
{
    struct ps_graph *g = b->g;
    int32_t *s = &b->cs[(size_t)part * (size_t)g->m + (size_t)mb];
    if (*s < 0) *s = ps_graph_add_stream(g, PS_STREAM_COPY, dev_of(g, part), part, mb);
    return *s;
}

static uint32_t mk(struct builder *b, enum ps_node_kind kind, enum ps_role role, int thread,
                   int n_seq, int mb, int part, int device, int32_t stream, int tick)
{
    struct ps_node nd = {0};
    nd.kind = (uint8_t)kind;
    nd.phase = PS_PHASE_FWD;
    nd.role = (uint8_t)role;
    nd.thread = (uint16_t)thread;
    nd.n_seq = (uint16_t)n_seq;
    nd.mb = mb;
    nd.part = part;
    nd.peer = -1;
    nd.device = device;
    nd.stream = stream;
    nd.wait_on = -1;
    nd.tick = tick;
    nd.twin = PS_NONE;
    /* the node stands for n_seq autograd nodes created in a row; seq is the last (G3) */
    b->seq[thread] += (uint64_t)n_seq;
    nd.seq = b->seq[thread] - 1;
    return ps_graph_add_node(b->g, &nd);
}

static double part_bytes_out(const struct ps_graph *g, int part, int64_t bs)
{
    return g->model ? (double)g->model->parts[part].out_numel * 4.0 * (double)bs : 0.0;
}

static void set_costs(struct builder *b, uint32_t v, int i, int j)
{
    struct ps_graph *g = b->g;
    struct ps_node *nd = &g->nodes[v];
    if (!g->model) return;
    const struct ps_partition_info *p = &g->model->parts[j];
    ps_node_set_forward_work(nd, p, (double)b->mb_size[i]);
}

static int build(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_variant *opts, struct ps_graph **out, struct ps_diag *diag)
{
    *out = NULL;
    int m = opts->mb_count, n = spec->n_partitions;
    uint64_t est_nodes, est_edges;
    ps_graph_estimate(m, n, opts->checkpoint, &est_nodes, &est_edges);
    struct ps_graph *g = ps_graph_create(spec, model, opts, m, n);
    if (!g) return ps_diag_set(diag, -ENOMEM, spec->path, "out of memory building the graph");
    /* reserve the estimate (an upper bound) once instead of growing by doubling */
    g->nodes = ps_graph_big_alloc((size_t)est_nodes * sizeof(*g->nodes));
    g->edges = ps_graph_big_alloc((size_t)(est_edges + est_nodes) * sizeof(*g->edges));
    if (!g->nodes || !g->edges) {
        ps_graph_destroy(g);
        return ps_diag_set(diag, -ENOMEM, spec->path, "out of memory building the graph");
    }
    g->cap_nodes = (uint32_t)est_nodes;
    g->cap_edges = (uint32_t)(est_edges + est_nodes);
    struct builder b = {0};
    b.g = g;
    b.seq = calloc((size_t)spec->n_devices + 1, sizeof(*b.seq));
    b.cur = malloc((size_t)m * sizeof(*b.cur));
    b.cs = malloc((size_t)m * (size_t)n * sizeof(*b.cs));
    b.compute = malloc((size_t)spec->n_devices * sizeof(*b.compute));
    b.mb_size = g->mb_size;
    g->fwd = malloc((size_t)m * (size_t)n * sizeof(uint32_t));
    g->bwd = malloc((size_t)m * (size_t)n * sizeof(uint32_t));
    g->rec = malloc((size_t)m * (size_t)n * sizeof(uint32_t));
    /* inputs of each task, for Recompute's edges: tin[i*n+j] */
    uint32_t *tin = malloc((size_t)m * (size_t)n * sizeof(uint32_t));
    uint32_t *pending = malloc((size_t)2 * n * sizeof(uint32_t));
    struct ps_prog_node *prog = malloc(PS_PROG_MAX * sizeof(*prog));
    if (!g || !pending || !prog || !b.seq || !b.cur || !b.cs || !b.compute || !g->fwd || !g->bwd || !g->rec || !tin) {
        free(b.seq);
        free(b.cur);
        free(b.cs);
        free(b.compute);
        free(tin);
        free(pending);
        free(prog);
        ps_graph_destroy(g);
        return ps_diag_set(diag, -ENOMEM, spec->path, "out of memory building the graph");
    }
    for (int i = 0; i < m; i++) b.cur[i] = PS_NONE;
    for (size_t k = 0; k < (size_t)m * (size_t)n; k++) {
        b.cs[k] = -1;
        g->fwd[k] = g->bwd[k] = g->rec[k] = tin[k] = PS_NONE;
    }
    for (int d = 0; d < spec->n_devices; d++)
        b.compute[d] = ps_graph_add_stream(g, PS_STREAM_COMPUTE, d, -1, -1);

    int stop = g->checkpoint_stop;

    /* Host program order (HOST edges): main-thread nodes in creation order; the tasks of a
       tick come after the tick's last issued node, and the next main-thread node comes after
       all of them (the host waits for every task of the tick before it goes on). */
    uint32_t host_prev = PS_NONE;
    int n_pending = 0;
#define HOST_CHAIN(v)                                                                          \
    do {                                                                                       \
        ps_graph_add_edge(g, host_prev, (v), PS_EDGE_HOST);                                    \
        for (int pp = 0; pp < n_pending; pp++)                                                 \
            ps_graph_add_edge(g, pending[pp], (v), PS_EDGE_HOST);                              \
        n_pending = 0;                                                                         \
        host_prev = (v);                                                                       \
    } while (0)

    for (int k = 0; k < m + n - 1; k++) {
        int jlo = k - m + 1 > 0 ? k - m + 1 : 0, jhi = k < n - 1 ? k : n - 1;
        /* fence */
        for (int j = jlo; j <= jhi; j++) {
            int i = k - j;
            bool dep = opts->phony && i > 0 && !(opts->fairscale && j == 0);
            if (dep) {
                /* depend(X[i-1], X[i]): fork the output of (i-1, j), join into X[i] */
                int dj = dev_of(g, j);
                uint32_t f = mk(&b, PS_NODE_FORK, PS_ROLE_DEPEND, 0, 1, i - 1, j, dj, -1, k);
                ps_graph_add_edge(g, b.cur[i - 1], f, PS_EDGE_DATA);
                b.cur[i - 1] = f;
                HOST_CHAIN(f);
                int jd = dev_of(g, j > 0 ? j - 1 : 0);
                uint32_t jn = mk(&b, PS_NODE_JOIN, PS_ROLE_DEPEND, 0, 1, i, j, jd, -1, k);
                ps_graph_add_edge(g, b.cur[i], jn, PS_EDGE_DATA);
                ps_graph_add_edge(g, f, jn, PS_EDGE_PHONY);
                b.cur[i] = jn;
                HOST_CHAIN(jn);
            }
            if (j > 0) {
                uint32_t c = mk(&b, PS_NODE_COPY, PS_ROLE_NONE, 0, 1, i, j - 1, dev_of(g, j - 1),
                                copy_stream(&b, j - 1, i), k);
                g->nodes[c].peer = j;
                g->nodes[c].wait_on = copy_stream(&b, j, i); /* two-way barrier */
                g->nodes[c].bytes = part_bytes_out(g, j - 1, b.mb_size[i]);
                ps_graph_add_edge(g, b.cur[i], c, PS_EDGE_DATA);
                b.cur[i] = c;
                HOST_CHAIN(c);
            }
        }
        /* compute: waits, then the worker runs every task of the tick */
        for (int j = jlo; j <= jhi; j++) {
            int i = k - j;
            int dj = dev_of(g, j);
            if (j > 0) {
                uint32_t w =
                    mk(&b, PS_NODE_WAIT, PS_ROLE_IN, 0, 1, i, j, dj, b.compute[dj], k);
                g->nodes[w].wait_on = copy_stream(&b, j, i);
                ps_graph_add_edge(g, b.cur[i], w, PS_EDGE_DATA);
                b.cur[i] = w;
                HOST_CHAIN(w);
            }
        }
        uint32_t issue = host_prev;
        /* tasks of the previous tick that no host node has waited for yet (nothing to collect,
           as with one partition and no checkpoint): this tick is issued after them */
        int n_prev = n_pending;
        for (int pp = 0; pp < n_prev; pp++) pending[n + pp] = pending[pp];
        n_pending = 0;
        for (int j = jlo; j <= jhi; j++) {
            int i = k - j;
            int dj = dev_of(g, j);
            bool ck = i < stop;
            /* a checkpointed forward records only the Checkpoint node; a plain one records the
               partition's autograd program, which depends on whether its input needs grad */
            int nseq = ck ? 1
                          : (model ? ps_engine_program(spec, model, j, b.cur[i] != PS_NONE, prog,
                                                       NULL)
                                   : 1);
            if (nseq < 1) nseq = 1;
            uint32_t f = mk(&b, PS_NODE_COMPUTE, PS_ROLE_NONE, 1 + dj, nseq, i, j, dj,
                            b.compute[dj], k);
            g->nodes[f].checkpointed = ck;
            set_costs(&b, f, i, j);
            tin[(size_t)i * n + j] = b.cur[i];
            ps_graph_add_edge(g, b.cur[i], f, PS_EDGE_DATA);
            ps_graph_add_edge(g, issue, f, PS_EDGE_HOST);
            for (int pp = 0; pp < n_prev; pp++) ps_graph_add_edge(g, pending[n + pp], f, PS_EDGE_HOST);
            pending[n_pending++] = f;
            b.cur[i] = f;
            g->fwd[(size_t)i * n + j] = f;
        }
        /* collect: in schedule order, the output wait and the recompute lane */
        for (int j = jlo; j <= jhi; j++) {
            int i = k - j;
            int dj = dev_of(g, j);
            uint32_t f = g->fwd[(size_t)i * n + j];
            if (j < n - 1) {
                uint32_t w = mk(&b, PS_NODE_WAIT, PS_ROLE_OUT, 0, 1, i, j, dj,
                                copy_stream(&b, j, i), k);
                g->nodes[w].wait_on = b.compute[dj];
                ps_graph_add_edge(g, b.cur[i], w, PS_EDGE_DATA);
                b.cur[i] = w;
                HOST_CHAIN(w);
            }
            if (g->nodes[f].checkpointed) {
                uint32_t rf = mk(&b, PS_NODE_FORK, PS_ROLE_RECOMPUTE, 0, 1, i, j, dj, -1, k);
                ps_graph_add_edge(g, b.cur[i], rf, PS_EDGE_DATA);
                HOST_CHAIN(rf);
                uint32_t r = mk(&b, PS_NODE_RECOMPUTE, PS_ROLE_NONE, 0, 1, i, j, dj,
                                b.compute[dj], k);
                ps_graph_add_edge(g, rf, r, PS_EDGE_PHONY);
                ps_graph_add_edge(g, tin[(size_t)i * n + j], r, PS_EDGE_DATA);
                HOST_CHAIN(r);
                uint32_t rj = mk(&b, PS_NODE_JOIN, PS_ROLE_RECOMPUTE, 0, 1, i, j, dj, -1, k);
                ps_graph_add_edge(g, rf, rj, PS_EDGE_DATA);
                ps_graph_add_edge(g, r, rj, PS_EDGE_PHONY);
                HOST_CHAIN(rj);
                b.cur[i] = rj;
                g->rec[(size_t)i * n + j] = r;
                set_costs(&b, r, i, j);
            }
        }
    }
    /* gather + loss: torch.cat (one node) and the loss (one node), main thread */
    int dl = dev_of(g, n - 1);
    uint32_t loss = mk(&b, PS_NODE_LOSS, PS_ROLE_NONE, 0, 2, -1, n - 1, dl, -1, m + n - 1);
    for (int i = 0; i < m; i++) ps_graph_add_edge(g, b.cur[i], loss, PS_EDGE_DATA);
    HOST_CHAIN(loss);
    free(pending);
    free(prog);
    g->loss = loss;

    if (opts->iteration > 0) {
        /* one iteration of the main thread: its forward nodes, then the graphs the recomputes
           record during backward (main thread, grad on) */
        uint64_t per = b.seq[0];
        prog = malloc(PS_PROG_MAX * sizeof(*prog));
        for (size_t t = 0; prog && t < (size_t)m * (size_t)n; t++)
            if (g->rec[t] != PS_NONE) {
                int np = ps_engine_program(spec, model, (int)(t % (size_t)n),
                                           tin[t] != PS_NONE, prog, NULL);
                per += np > 0 ? (uint64_t)np : 0;
            }
        free(prog);
        for (uint32_t v = 0; v < g->n_nodes; v++)
            if (g->nodes[v].thread == 0) g->nodes[v].seq += (uint64_t)opts->iteration * per;
    }
    /* backward twins: one per forward node, in forward creation order */
    uint32_t nf = g->n_nodes;
    for (uint32_t v = 0; v < nf; v++) {
        struct ps_node nd = g->nodes[v];
        nd.phase = PS_PHASE_BWD;
        nd.twin = v;
        nd.tick = -1;
        if (nd.kind == PS_NODE_WAIT) {
            /* the backward wait waits the other way */
            int32_t s = nd.stream;
            nd.stream = nd.wait_on;
            nd.wait_on = s;
        } else if (nd.kind == PS_NODE_COPY) {
            /* gradient copy C(i,j->j-1) on the downstream copy stream, barrier upstream */
            int32_t s = nd.stream;
            int p = nd.part;
            nd.stream = nd.wait_on;
            nd.wait_on = s;
            nd.part = nd.peer;
            nd.peer = p;
            nd.device = dev_of(g, nd.part);
        } else if (nd.kind == PS_NODE_COMPUTE && g->model) {
            const struct ps_partition_info *p = &g->model->parts[nd.part];
            double bs = (double)b.mb_size[nd.mb];
            nd.flops = p->bwd_flops * bs;
            nd.bytes = p->bwd_bytes * bs + p->bwd_param_bytes;
            nd.act_bytes = 0;
        } else if (nd.kind == PS_NODE_RECOMPUTE) {
            /* r(i,j) is a no-op in forward; its twin R(i,j) does the work and allocates */
            g->nodes[v].flops = g->nodes[v].bytes = 0;
            g->nodes[v].act_bytes = 0;
        } else {
            nd.act_bytes = 0;
        }
        uint32_t t = ps_graph_add_node(g, &nd);
        g->nodes[v].twin = t;
    }
    g->root = g->nodes[loss].twin;
    for (size_t k = 0; k < (size_t)m * (size_t)n; k++) {
        g->bwd[k] = g->nodes[g->fwd[k]].twin;
        if (g->rec[k] != PS_NONE) g->rec[k] = g->nodes[g->rec[k]].twin;
    }
    /* backward edges: reversed data/phony edges, grouped by consumer in its input order */
    uint32_t nfe = g->n_edges;
    uint32_t *byc = malloc(((size_t)nf + 1) * sizeof(uint32_t));
    uint32_t *order = malloc(((size_t)nfe + 1) * sizeof(uint32_t));
    if (!byc || !order) {
        free(byc);
        free(order);
        free(b.seq);
        free(b.cur);
        free(b.cs);
        free(b.compute);
        free(tin);
        ps_graph_destroy(g);
        return ps_diag_set(diag, -ENOMEM, spec->path, "out of memory building the graph");
    }
    memset(byc, 0, ((size_t)nf + 1) * sizeof(uint32_t));
    for (uint32_t e = 0; e < nfe; e++)
        if (g->edges[e].kind == PS_EDGE_DATA || g->edges[e].kind == PS_EDGE_PHONY)
            byc[g->edges[e].dst + 1]++;
    for (uint32_t v = 0; v < nf; v++) byc[v + 1] += byc[v];
    for (uint32_t e = 0; e < nfe; e++)
        if (g->edges[e].kind == PS_EDGE_DATA || g->edges[e].kind == PS_EDGE_PHONY)
            order[byc[g->edges[e].dst]++] = e;
    /* byc[v] is now the end of v's list; walk consumers in creation order */
    uint32_t start = 0;
    for (uint32_t v = 0; v < nf; v++) {
        for (uint32_t k = start; k < byc[v]; k++) {
            const struct ps_edge e = g->edges[order[k]];
            ps_graph_add_edge(g, g->nodes[e.dst].twin, g->nodes[e.src].twin,
                              (enum ps_edge_kind)e.kind);
        }
        start = byc[v];
    }
    free(byc);
    free(order);
    /* loss.backward() starts once the loss exists */
    ps_graph_add_edge(g, loss, g->root, PS_EDGE_DATA);
    free(b.seq);
    free(b.cur);
    free(b.cs);
    free(b.compute);
    free(tin);
#undef HOST_CHAIN
    ps_graph_set_memory(g);
    int rc = ps_graph_finalize(g);
    if (rc) {
        ps_graph_destroy(g);
        return ps_diag_set(diag, rc, spec->path, "out of memory building the graph");
    }
    *out = g;
    return 0;
}

/* ---- optimizer ---------------------------------------------------------------------------- */

/* An optimizer step per partition (PS_NODE_OPTIM, after every B(i,j)), then re-finalizes. */
static int add_optimizer(struct ps_graph *g)
{
    for (int j = 0; j < g->n; j++) {
        int dev = g->spec ? g->spec->device_id[j] : j;
        int32_t comp = -1;
        for (int32_t s = 0; s < g->n_streams && comp < 0; s++)
            if (g->streams[s].kind == PS_STREAM_COMPUTE && g->streams[s].device == dev) comp = s;
        struct ps_node nd = {0};
        nd.kind = PS_NODE_OPTIM;
        nd.phase = PS_PHASE_BWD;
        nd.thread = (uint16_t)(1 + dev);
        nd.n_seq = 1;
        nd.mb = -1;
        nd.part = j;
        nd.peer = -1;
        nd.device = dev;
        nd.stream = comp;
        nd.wait_on = -1;
        nd.tick = -1;
        nd.twin = PS_NONE;
        ps_node_set_optim_cost(&nd, g->model, j);
        uint32_t v = ps_graph_add_node(g, &nd);
        for (int i = 0; i < g->m; i++)
            if (g->bwd) ps_graph_add_edge(g, g->bwd[(size_t)i * g->n + j], v, PS_EDGE_DATA);
    }
    return ps_graph_finalize(g);
}

static int build_gpipe(const struct ps_spec *spec, const struct ps_model *model,
                       const struct ps_variant *v, struct ps_graph **out, struct ps_diag *diag)
{
    int rc = build(spec, model, v, out, diag);
    if (rc || !v->optimizer) return rc;
    if ((rc = add_optimizer(*out))) {
        ps_graph_destroy(*out);
        *out = NULL;
        return ps_diag_set(diag, rc, spec->path, "out of memory");
    }
    return 0;
}

const struct ps_schedule_ops ps_sched_gpipe = {
    .name = "gpipe",
    .build = build_gpipe,
    .plan = NULL,
    .makespan = ps_schedule_makespan_fb,
    .phony = true,
    .engine_order = true,
    .virtual_stages = false,
};
