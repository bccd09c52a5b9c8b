/* schedule: the table of pipeline schedules, one row per schedule kind (schedules.def), and the
 * entry points every caller uses to build and order the graph of a variant.
 *
 *   ps_schedule_build(spec, model, variant)   size checks, then the row's build, or its plan
 *                                             built by plan.c; the optimizer step when asked
 *   ps_schedule_order(graph)                  the autograd engine's order for a graph with a
 *                                             backward root (GPipe), the plan's order otherwise
 *   ps_schedule_plan(spec, variant)           the row's per-rank program (action lists)
 *
 * A row says what the schedule is; callers ask the row instead of testing for a schedule kind:
 *
 *     name          pipeline.schedule value
 *     build         its own graph builder, or NULL: the graph of `plan` (plan.c)
 *     plan          per-rank action lists, or NULL (GPipe: torchgpipe's clock cycles)
 *     makespan      closed form under uniform costs (f, b, w per stage and micro-batch, free
 *                   copies), or NULL where none is known; test_sim checks each against the
 *                   simulator
 *     phony         the graph has depend() fork/join edges, so the no-phony what-if applies
 *     engine_order  its backward order is derived by the autograd-engine model (engine.h)
 *     virtual_stages  it reads pipeline.virtual_stages
 *
 * Layering: graph.c (arena) <- engine.c, plan.c <- src/sched/ <- schedule.c; nothing below
 * includes this header.
 */
#ifndef PS_SCHEDULE_H
#define PS_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

#include "src/diag.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/plan.h"
#include "src/spec.h"
#include "src/variant.h"

struct ps_schedule_ops {
    const char *name;
    int (*build)(const struct ps_spec *spec, const struct ps_model *model,
                 const struct ps_variant *v, struct ps_graph **out, struct ps_diag *diag);
    int (*plan)(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag);
    /* m micro-batches, S stages on S / vs devices (vs model chunks per device) */
    double (*makespan)(int m, int S, int vs, double f, double b, double w);
    bool phony;
    bool engine_order;
    bool virtual_stages;
};

/* The closed form GPipe, torchgpipe's and PyTorch's, and 1F1B share under uniform costs
 * (src/SEMANTICS.md section 6): (m + S - 1)(f + b); their ops' .makespan. */
double ps_schedule_makespan_fb(int m, int S, int vs, double f, double b, double w);

/* The row of a schedule kind (NULL for a value outside the enum). */
const struct ps_schedule_ops *ps_schedule_ops(enum ps_schedule kind);
/* The kind of a pipeline.schedule name, or -1. */
int ps_schedule_by_name(const char *name);
/* "gpipe,1f1b,..." (every row, table order); a static string. */
const char *ps_schedule_names(void);

/* Builds the graph of variant v. Returns 0 or a negative errno (-E2BIG when the graph would
 * exceed the size or memory limit, with the numbers in diag). */
int ps_schedule_build(const struct ps_spec *spec, const struct ps_model *model,
                      const struct ps_variant *v, struct ps_graph **out, struct ps_diag *diag);
/* The execution order of a built graph (see above). -EDEADLK when it gets stuck. */
int ps_schedule_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag);
/* The generated action lists of v's schedule; -EINVAL for a schedule without a plan (GPipe). */
int ps_schedule_plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                     struct ps_diag *diag);
/* 1 with a one-line note in buf when PyTorch's constructor for this schedule raises for S
 * stages, m micro-batches and vs stages per rank although pipescope runs it (Schedule1F1B with
 * m < S; the round-based schedules with m not a multiple of max(1, m / ranks)); 0 otherwise. */
int ps_schedule_pytorch_note(enum ps_schedule kind, int S, int m, int vs, char *buf, size_t len);

#endif
