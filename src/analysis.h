/* analysis: what the graph guarantees in EVERY execution, and what one execution costs.
 *
 * Happens-before (hb) is reachability over DATA, PHONY and HOST edges: u hb v when every
 * execution the graph allows runs u before v. The ordering invariants of SEMANTICS.md are
 * checked as hb queries, so an invariant that holds in the engine's one order but is not
 * enforced by the graph is reported (that is what the no-phony what-if shows):
 *   I1 forward-order   F(i,j) hb F(i+1,j)
 *   I2 backward-order  B(i+1,j) hb B(i,j) (GPipe); a plan keeps the direction of each stage's
 *                      first two backwards (1F1B ascends: B(i,j) hb B(i+1,j); LoopedBFS descends)
 *   I3 recompute       R(i,j) hb B(i,j), and B(i+1,j) hb R(i,j) (1F1B-style: B(i-1,j) hb R(i,j)):
 *                      R(i,j) runs right before B(i,j) among partition j's backward work
 *   I4 copy-after-producer  F(i,j-1) hb C(i,j-1->j); B(i,j) hb C(i,j->j-1)
 *   I5 compute-after-wait   W(i,j) hb F(i,j); Wo'(i,j) hb B(i,j)
 * Races: a tensor produced on one stream and consumed on another with no event (wait node or
 * copy barrier) on its way. Memory: activation bytes alive per device along the engine order.
 */
#ifndef PS_ANALYSIS_H
#define PS_ANALYSIS_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"

enum ps_check {
    PS_CHECK_CYCLE,
    PS_CHECK_FORWARD_ORDER,
    PS_CHECK_BACKWARD_ORDER,
    PS_CHECK_RECOMPUTE,
    PS_CHECK_COPY_AFTER_PRODUCER,
    PS_CHECK_COMPUTE_AFTER_WAIT,
    PS_CHECK_RACE,
    PS_CHECK__COUNT
};

struct ps_violation {
    enum ps_check check;
    uint32_t a, b;   /* expected a hb b (race: a producer, b consumer; cycle: a node on it) */
    char msg[256];
};

struct ps_mem {
    int64_t peak_bytes;   /* activation bytes alive at the peak */
    uint32_t peak_entry;  /* order entry at which the peak is reached */
};

struct ps_critical_path {
    double length_us;
    uint32_t n;
    uint32_t *nodes;      /* from first to last */
};

struct ps_analysis {
    bool ok;
    uint32_t n_violations;      /* total found */
    uint32_t n_kept;            /* kept in `v` (at most PS_ANALYSIS_MAX_KEPT) */
    struct ps_violation *v;
    uint32_t per_check[PS_CHECK__COUNT];
    uint32_t checked[PS_CHECK__COUNT]; /* number of pairs checked */
    uint32_t *cycle;            /* node ids of one cycle, when found */
    uint32_t cycle_len;
    int n_devices;
    struct ps_mem *mem;         /* per device, along the engine order */
    struct ps_critical_path cp;
};
#define PS_ANALYSIS_MAX_KEPT 64

const char *ps_check_name(enum ps_check c);

/* Topological order over DATA/PHONY/HOST/STREAM edges; on a cycle returns -ELOOP and fills
 * cycle/cycle_len with one cycle (first node repeated at the end is not included). */
int ps_analysis_topo(const struct ps_graph *g, uint32_t *order, uint32_t **cycle,
                     uint32_t *cycle_len);

/* u hb v (see above). `ctx` caches work between queries; create it once per graph. */
struct ps_hb;
struct ps_hb *ps_hb_create(const struct ps_graph *g);
bool ps_hb(struct ps_hb *h, uint32_t u, uint32_t v);
void ps_hb_destroy(struct ps_hb *h);

/* Runs every check. `order` may be NULL (memory is then skipped); `cost_us` may be NULL
 * (critical path skipped). Returns 0 (violations are results, not errors) or -ENOMEM. */
int ps_analysis_run(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                    struct ps_analysis *a, struct ps_diag *diag);
void ps_analysis_finish(struct ps_analysis *a);

/* Activation memory per device along an order (a->mem must hold n_devices entries). */
void ps_analysis_memory(const struct ps_graph *g, const struct ps_order *order,
                        struct ps_mem *mem);

#endif
