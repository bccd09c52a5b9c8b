/* graph: the full task graph of one training iteration, forward and backward.
 *
 * One node per executed operation. For GPipe the graph mirrors, node for node, the autograd
 * graph torchgpipe 0.0.7 builds (SEMANTICS.md sections 1-5): in forward, per task (i, j)
 * (i = micro-batch, j = partition):
 *
 *     ... -> fork(i,j-1) -> join(i,j) -> C(i,j-1->j) -> W(i,j) -> F(i,j) -> Wo(i,j) -> rfork(i,j) -> rjoin(i,j) -> fork(i,j) -> ...
 *              |  phony       ^                                                 |   phony    ^
 *              v              | (from fork(i-1,j))                              +--> r(i,j) --+
 *         join(i+1,j-1)
 *
 * join/fork are depend() (absent with phony=false, and on partition 0 in the fairscale
 * variant), rfork/r/rjoin exist only for checkpointed tasks, C/W only for j > 0 and Wo only for
 * j < n-1. Every forward node is an autograd Function and has a backward twin (phase BWD):
 * F's twin is B(i,j) (the partition's backward chain, or the Checkpoint node's backward), r's twin
 * is R(i,j) (the recomputation). Backward edges are the forward edges reversed (a gradient
 * flows from the consumer's twin to the producer's twin), in the producer's input order.
 *
 * Invariants (checked by ps_graph_validate, relied on everywhere downstream):
 *   G1. Nodes and edges live in arrays; everything refers to them by uint32 index. Node order is
 *       creation order, so indices, DOT and JSON are deterministic.
 *   G2. Forward node u and backward twin u' satisfy twin[u] = u', twin[u'] = u.
 *   G3. seq is PyTorch's per-thread creation counter (at::sequence_number is thread_local):
 *       nodes created by the main thread (fork, join, copy, wait, recompute, loss) and by each
 *       device's worker thread (partition ops, Checkpoint) count separately. A B node stands for
 *       a chain of n_seq autograd nodes numbered seq, seq-1, ..., seq-n_seq+1.
 *   G4. DATA and PHONY edges are the dependencies autograd enforces; HOST edges are host-side
 *       order (the clock-cycle fence of GPipe, the per-stage action order of 1F1B-style
 *       schedules); STREAM edges (added by ps_graph_add_stream_order) are issue order on a stream.
 *   G5. After ps_graph_finalize the CSR adjacency (out_off/out_edge, in_off/in_edge) is valid and
 *       lists edges of a node in insertion order.
 */
#ifndef PS_GRAPH_H
#define PS_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/variant.h"

#define PS_NONE UINT32_MAX

enum ps_node_kind {
    PS_NODE_COMPUTE,   /* FWD: F(i,j), the partition forward (Checkpoint forward when checkpointed);
                          BWD: B(i,j), its backward (input and weight gradient unless zb-h1) */
    PS_NODE_RECOMPUTE, /* FWD: r(i,j), the Recompute Function's no-op forward; BWD: R(i,j) */
    PS_NODE_WGRAD,     /* BWD only, zb-h1: Wg(i,j), the weight-gradient half of B */
    PS_NODE_COPY,      /* C(i,j-1->j) in forward, C(i,j->j-1) in backward */
    PS_NODE_WAIT,      /* W(i,j): compute waits its input copy stream (role IN), Wo(i,j): copy stream
                          waits compute (role OUT); the backward twin waits the other way */
    PS_NODE_FORK,      /* fork(i,j) of depend() (role DEPEND) or rfork(i,j) (role RECOMPUTE) */
    PS_NODE_JOIN,      /* join(i,j) of depend() (role DEPEND) or rjoin(i,j) (role RECOMPUTE) */
    PS_NODE_LOSS,      /* gather + loss; its twin is the root of backward */
    PS_NODE_OPTIM,     /* optimizer step of one partition (part = j) */
    PS_NODE__COUNT
};

enum ps_phase { PS_PHASE_FWD = 0, PS_PHASE_BWD = 1 };
enum ps_role { PS_ROLE_NONE = 0, PS_ROLE_IN, PS_ROLE_OUT, PS_ROLE_DEPEND, PS_ROLE_RECOMPUTE };
enum ps_edge_kind { PS_EDGE_DATA, PS_EDGE_PHONY, PS_EDGE_HOST, PS_EDGE_STREAM, PS_EDGE__COUNT };
enum ps_stream_kind { PS_STREAM_COMPUTE, PS_STREAM_COPY };

struct ps_node {
    uint8_t kind;      /* enum ps_node_kind */
    uint8_t phase;     /* enum ps_phase */
    uint8_t role;      /* enum ps_role */
    uint8_t checkpointed;
    uint16_t thread;   /* creating thread: 0 = main, 1 + device id = that device's worker */
    uint16_t n_seq;    /* autograd nodes this node stands for (G3) */
    int32_t mb;        /* micro-batch i, -1 when none */
    int32_t part;      /* partition j (stage for 1F1B-style schedules), -1 when none */
    int32_t peer;      /* copy: the other partition; -1 otherwise */
    int32_t device;    /* device id running it (engine thread in backward) */
    int32_t stream;    /* index into graph->streams, -1 for host-only nodes (fork, join, loss) */
    int32_t wait_on;   /* wait: the stream waited for (the waiter is `stream`); -1 otherwise */
    int32_t tick;      /* forward clock cycle (GPipe) or action index, -1 when none */
    uint32_t twin;     /* forward <-> backward counterpart, PS_NONE when none (G2) */
    uint64_t seq;      /* creation sequence number in its thread (G3) */
    double flops;      /* work of the node (whole micro-batch) */
    double bytes;      /* bytes moved (memory traffic, or link bytes for copies) */
    int64_t act_bytes; /* change of its device's activation bytes when it ends (src/model.c
                          "Activation memory"): F, R what they keep (less an input they free),
                          B minus everything its micro-batch keeps on the partition;
                          ps_node_mem gives the rest */
};

struct ps_edge {
    uint32_t src, dst; /* src must happen before dst */
    uint8_t kind;      /* enum ps_edge_kind */
};

struct ps_stream {
    uint8_t kind;      /* enum ps_stream_kind */
    int32_t device;
    int32_t part, mb;  /* copy stream cs[part][mb]; compute: part = -1, mb = -1 */
};


struct ps_graph {
    const struct ps_spec *spec;   /* not owned */
    const struct ps_model *model; /* not owned */
    struct ps_variant var;        /* the configuration it was built for (variant.h) */
    int64_t *mb_size;             /* samples of each micro-batch (m entries; NULL without spec) */
    int m, n;                     /* micro-batches, partitions (stages) */
    int n_devices;
    int checkpoint_stop;

    uint32_t n_nodes, cap_nodes;
    struct ps_node *nodes;
    uint32_t n_edges, cap_edges;
    struct ps_edge *edges;
    int32_t n_streams, cap_streams;
    struct ps_stream *streams;

    /* CSR adjacency, valid after ps_graph_finalize (G5) */
    uint32_t *out_off, *out_edge, *in_off, *in_edge;

    /* lookups for GPipe-style graphs: index of F(i,j) is fwd[i*n+j], B(i,j) is bwd[i*n+j],
       R(i,j) rec[i*n+j] (PS_NONE when not checkpointed); root = backward root (loss twin) */
    uint32_t *fwd, *bwd, *rec;
    uint32_t loss, root;
};

void ps_graph_destroy(struct ps_graph *g); /* accepts NULL */

/* Construction, used by the schedule builders (src/sched/, plan.c; build a schedule with
 * ps_schedule_build, schedule.h) and by tests. */
struct ps_graph *ps_graph_create(const struct ps_spec *spec, const struct ps_model *model,
                                 const struct ps_variant *opts, int m, int n);
uint32_t ps_graph_add_node(struct ps_graph *g, const struct ps_node *proto);
void ps_graph_add_edge(struct ps_graph *g, uint32_t src, uint32_t dst, enum ps_edge_kind kind);
int32_t ps_graph_add_stream(struct ps_graph *g, enum ps_stream_kind kind, int device, int part,
                            int mb);
int ps_graph_finalize(struct ps_graph *g); /* builds CSR; 0 or -ENOMEM */
/* Removes every edge for which keep(edge) is false, then re-finalizes (what-if and tests). */
int ps_graph_filter_edges(struct ps_graph *g, bool (*keep)(const struct ps_edge *, void *),
                          void *ctx);

/* malloc for big arrays, on transparent huge pages where the kernel allows (free with free()). */
void *ps_graph_big_alloc(size_t bytes);

/* Checks the structural invariants G1-G5. Returns 0 or -EINVAL with diag. */
int ps_graph_validate(const struct ps_graph *g, struct ps_diag *diag);

/* Upper bound of nodes and edges for a spec before building (for the size limit). */
void ps_graph_estimate(int m, int n, enum ps_checkpoint c, uint64_t *nodes, uint64_t *edges);
#define PS_GRAPH_MAX_NODES (50u * 1000u * 1000u)
/* Bytes the graph and the per-node arrays of its order, analysis and simulation take, at most
 * (ps_schedule_build checks it against memlimit.h before allocating). */
double ps_graph_estimate_bytes(int m, int n, enum ps_checkpoint c);

/* Task name as in viz/REPORT.md: F(2,1), B(2,1), R(2,1), C(2,0->1), W(2,1), Wo(2,1), fork(2,1),
 * join(2,1), rfork(2,1), rjoin(2,1), r(2,1), loss, loss', opt(1), Wg(2,1); backward twins of
 * copy/wait/fork/join carry a prime: W'(2,1). Returns buf. */
const char *ps_node_name(const struct ps_graph *g, uint32_t id, char *buf, int len);
const char *ps_node_kind_name(enum ps_node_kind k);
const char *ps_edge_kind_name(enum ps_edge_kind k);
/* Trace category (viz/REPORT.md): forward | backward | recompute | copy | wait | fork | join | ... */
const char *ps_node_category(const struct ps_node *nd);
/* "compute", "copy mb 3" */
const char *ps_stream_name(const struct ps_graph *g, int32_t s, char *buf, int len);

/* True for F, B, R, Wg nodes (the tasks the order output lists). */
bool ps_node_is_task(const struct ps_node *nd);

/* Adjacency helpers (after finalize). */
static inline uint32_t ps_graph_out_degree(const struct ps_graph *g, uint32_t v)
{
    return g->out_off[v + 1] - g->out_off[v];
}
static inline uint32_t ps_graph_in_degree(const struct ps_graph *g, uint32_t v)
{
    return g->in_off[v + 1] - g->in_off[v];
}

/* An execution order of a graph's nodes: the autograd engine's (engine.h) or a plan's (plan.h),
 * chosen by ps_schedule_order (schedule.h). */
struct ps_order {
    uint32_t n;       /* entries: every executed node, forward first, then backward */
    uint32_t *node;   /* node id of each entry */
    int32_t *thread;  /* device whose thread ran it */
    uint32_t *step;   /* engine step at which it started (forward: creation rank) */
    uint32_t n_fwd;   /* entries [0, n_fwd) are the forward pass */
    uint32_t *pos;    /* pos[node] = entry index, UINT32_MAX when the node never runs */
};
void ps_order_finish(struct ps_order *o); /* frees; accepts a zeroed struct */

/* Sets act_bytes of every F, R and B of a graph with a model (src/model.c "Activation memory");
 * the builders call it once fwd, rec and bwd are final. */
void ps_graph_set_memory(struct ps_graph *g);

/* Node v's activation memory beyond act_bytes: *tmp, the high-water above its device's bytes at
 * its start while it runs; *out, for a forward task, the output it puts on the next partition's
 * device *out_dev (-1 and 0 bytes when none). All 0 without a model. */
void ps_node_mem(const struct ps_graph *g, uint32_t v, int64_t *tmp, int64_t *out, int *out_dev);

/* Optimizer step cost of partition `part` (SGD: 2 FLOPs and 12 bytes per parameter). */
void ps_node_set_optim_cost(struct ps_node *nd, const struct ps_model *model, int part);

/* Adds a STREAM edge between consecutive nodes of each stream in `order` (issue order on a
 * stream), then re-finalizes. Returns 0 or -ENOMEM. */
int ps_graph_add_stream_order(struct ps_graph *g, const struct ps_order *order);

/* The work of one forward (or recompute) of partition p on a micro-batch of bs samples: its FLOPs
 * and memory traffic, the weights read once per call. */
void ps_node_set_forward_work(struct ps_node *nd, const struct ps_partition_info *p, double bs);

#endif
