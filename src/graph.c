/* graph: arena of nodes and edges, and the GPipe builder that mirrors torchgpipe 0.0.7.
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
 * node then gets its backward twin; backward edges are the forward edges reversed.
 */
#include "src/graph.h"
#include "src/engine.h"
#include "src/schedule.h"
#include "src/memlimit.h"

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

/* ---- GPipe builder -------------------------------------------------------------------- */

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
    double bs = (double)b->mb_size[i];
    nd->flops = p->fwd_flops * bs;
    nd->bytes = p->fwd_bytes * bs + p->fwd_param_bytes; /* weights read once per micro-batch */
}

double ps_graph_estimate_bytes(int m, int n, enum ps_checkpoint c)
{
    uint64_t nodes, edges;
    ps_graph_estimate(m, n, c, &nodes, &edges);
    /* the arrays, CSR and lookups, plus the per-node arrays of order, analysis and simulation */
    return (double)nodes * (double)(sizeof(struct ps_node) + 128) +
           (double)(edges + nodes) * (double)(sizeof(struct ps_edge) + 8);
}

int ps_graph_build(const struct ps_spec *spec, const struct ps_model *model,
                   const struct ps_variant *opts, struct ps_graph **out, struct ps_diag *diag)
{
    *out = NULL;
    int m = opts->mb_count, n = spec->n_partitions;
    uint64_t est_nodes, est_edges;
    ps_graph_estimate(m, n, opts->checkpoint, &est_nodes, &est_edges);
    if (est_nodes > PS_GRAPH_MAX_NODES) {
        ps_diag_set(diag, -E2BIG, spec->path,
                    "%d micro-batches x %d partitions would need %.3g graph nodes; the limit is %u",
                    m, n, (double)est_nodes, PS_GRAPH_MAX_NODES);
        ps_diag_hint(diag, "use fewer chunks or partitions");
        return -E2BIG;
    }
    char what[160];
    snprintf(what, sizeof(what), "the graph of %d micro-batches x %d partitions (%.3g nodes)", m,
             n, (double)est_nodes);
    int mrc = ps_memlimit_check(ps_graph_estimate_bytes(m, n, opts->checkpoint), spec->path,
                                what, "use fewer chunks or partitions", diag);
    if (mrc) return mrc;
    if (opts->schedule != PS_SCHED_GPIPE) {
        return ps_schedule_build(spec, model, opts, out, diag);
    }

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
            if (model) {
                const struct ps_partition_info *p = &model->parts[j];
                g->nodes[f].act_bytes = ck ? p->in_numel * 4 * b.mb_size[i]
                                           : p->saved_bytes * b.mb_size[i];
            }
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
                if (model) g->nodes[r].act_bytes = model->parts[j].saved_bytes * b.mb_size[i];
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
    int rc = ps_graph_finalize(g);
    if (rc) {
        ps_graph_destroy(g);
        return ps_diag_set(diag, rc, spec->path, "out of memory building the graph");
    }
    *out = g;
    return 0;
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

#include "src/engine.h"

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
