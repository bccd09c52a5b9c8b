/* plan: a schedule given as explicit per-lane action lists (SEMANTICS.md section 6), and the
 * graph built from it. Every schedule but GPipe generates one (src/sched/ behind the table of
 * schedule.h: 1F1B, interleaved 1F1B, ZB-H1); `simulate --actions` reads one by hand.
 *
 * A plan is one action list per lane (a host thread: one device's worker). An action is F (the
 * forward of micro-batch i on stage s), B (its backward; with split backward only the input
 * gradient) or W (the weight gradient, split backward only). The builder turns a plan into the
 * same graph type as GPipe, node for node:
 *
 *   F(i,s) -> Wo(i,s) -> C(i,s->s+1) -> W(i,s+1) -> F(i,s+1)          forward, DATA edges
 *   B(i,s+1) -> W'(i,s+1) -> C'(i,s+1->s) -> Wo'(i,s) -> B(i,s)       backward, DATA edges
 *   F(i,S-1) -> B(i,S-1)   (the loss gradient)    F(i,s) -> R(i,s) -> B(i,s)  (checkpointed)
 *   B(i,s) -> Wg(i,s)      (split backward)        B/Wg(*,s) -> opt(s)        (optimizer)
 *
 * and chains every node a lane issues with HOST edges in action order: an F action issues
 * W(i,s), F(i,s), Wo(i,s), C(i,s->s+1); a B action issues R(i,s), Wo'(i,s), B(i,s), W'(i,s),
 * C'(i,s->s-1) (R before the wait: recompute does not wait for the output gradient). No fork, join
 * or loss nodes; g->loss = g->root = PS_NONE, so the engine model does not apply: the execution
 * order of such a graph is ps_plan_order's.
 *
 * Invariants of a valid plan (ps_plan_build rejects the rest with -EINVAL):
 *   P1. every (i, s) has exactly one F and one B, and one W iff the plan splits backward;
 *   P2. all actions of one stage are in one lane;
 *   P3. a lane's device is the device of its stages.
 * A valid plan can still deadlock (an action list that waits for itself): ps_plan_order
 * reports it with -EDEADLK and ps_plan_stuck describes it, one line per stage.
 */
#ifndef PS_PLAN_H
#define PS_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/graph.h"

enum ps_action_kind { PS_ACT_F, PS_ACT_B, PS_ACT_W };

struct ps_action {
    uint8_t kind;    /* enum ps_action_kind */
    uint8_t overlap; /* DualPipeV: issued as one overlapped pair with the next action */
    int32_t mb;
    int32_t stage;
};

struct ps_plan {
    int n_lanes;
    int n_stages;
    int m;
    bool split;          /* backward split into B and W (zero-bubble schedules) */
    bool mixed;          /* split per (stage, micro-batch): a B with a W of the same cell is
                            the input gradient only (PyTorch's I), a B without one is the full
                            backward (DualPipeV, imported CSV schedules) */
    uint32_t *len;       /* actions per lane */
    struct ps_action **act;
    int *lane_device;    /* device id of each lane */
    uint32_t ignored;    /* imported communication/FSDP actions that were skipped */
    char *source;        /* the --actions file it was read from (errors name it), or NULL */
};

void ps_plan_finish(struct ps_plan *p); /* accepts a zeroed struct */

/* For generators: room for per_lane actions in each of `lanes` lists (0 or -ENOMEM; finish the
 * plan either way), appending one action, and the device of a stage (stage itself without a
 * spec). */
int ps_plan_alloc(struct ps_plan *p, int lanes, int stages, int m, uint32_t per_lane);
void ps_plan_push(struct ps_plan *p, int lane, enum ps_action_kind k, int mb, int stage);
int ps_plan_stage_device(const struct ps_spec *spec, int stage);

/* A hand-written plan: {"stages": [["F0","F1","B0","B1"], ...]}, one list per partition, tokens
 * F<i>, B<i> and W<i> (W anywhere splits backward for every stage); or, when the file does not
 * start with '{', PyTorch's schedule CSV (ps_plan_csv_parse). */
int ps_plan_load(const char *path, const struct ps_spec *spec, struct ps_plan *out,
                 struct ps_diag *diag);
int ps_plan_parse(const char *json, const char *name, const struct ps_spec *spec,
                  struct ps_plan *out, struct ps_diag *diag);

/* PyTorch pipelining's schedule CSV (plan_csv.c): one row per rank, cells in _Action's
 * grammar (2F0, 1I3, 0W1, 3B2, (0F7;7B3)OVERLAP_F_B; communication actions are skipped and
 * counted in out->ignored). Errors name the rank and step. */
int ps_plan_csv_parse(const char *text, const char *name, const struct ps_spec *spec,
                      struct ps_plan *out, struct ps_diag *diag);
/* The plan as that CSV (malloc'ed, NULL on out of memory). */
char *ps_plan_csv(const struct ps_plan *p);
/* The plan as PyTorch's timestep grid (_dump_csv of a pipeline_order with None entries): cell t
 * of row r is what rank r runs in step t, empty when idle, every input produced in an earlier
 * step. 0, -ENOMEM, or -EDEADLK when the plan cannot finish. *out is malloc'ed. */
int ps_plan_csv_grid(const struct ps_plan *p, char **out);

/* Builds the graph of a plan (see above) for variant v (checkpointing, optimizer). */
int ps_plan_build(const struct ps_spec *spec, const struct ps_model *model,
                  const struct ps_variant *v, const struct ps_plan *plan, struct ps_graph **out,
                  struct ps_diag *diag);

/* Execution order of a plan's graph: a topological order over DATA/PHONY/HOST edges
 * (first-in first-out, seeded in node order), thread = node device. -EDEADLK when some nodes can
 * never run (o->n < nodes; o->pos of those is UINT32_MAX), with diag naming the first one. */
int ps_plan_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag);
/* After -EDEADLK: one line per stage with a stuck action, "stage 1: F(1,1) (action 2) waits for
 * F(1,0)". Returns a malloc'ed string (empty when nothing is stuck) or NULL. */
char *ps_plan_stuck(const struct ps_graph *g, const struct ps_order *o);
/* After -EDEADLK: the cycle of waits that blocks the plan, in PyTorch's action names and in
 * dependency order ("0F2 on rank 0 (its step 6), needed by 1F2 on rank 1 (its step 4), then 1B1
 * in rank 1's list (step 5), ..., needed by 0F2 again"): each action needs the one before it,
 * across ranks through data, within a rank through its list order. Malloc'ed, NULL when nothing
 * is stuck or out of memory. */
char *ps_plan_cycle(const struct ps_graph *g, const struct ps_order *o);

#endif
