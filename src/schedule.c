/* schedule: the table of schedules (schedule.h) and the entry points that dispatch through it.
 *
 * The rows come from schedules.def, each defined in its own file under src/sched/. Every graph
 * goes through ps_schedule_build, so the size limits (PS_GRAPH_MAX_NODES, the memory limit of
 * memlimit.h) are checked once, before any schedule allocates.
 */
#include "src/schedule.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "src/engine.h"
#include "src/memlimit.h"

#define PS_SCHEDULE_ROW(e, name, ops) extern const struct ps_schedule_ops ops;
#include "src/schedules.def"
#undef PS_SCHEDULE_ROW

static const struct ps_schedule_ops *const table[] = {
#define PS_SCHEDULE_ROW(e, name, ops) [PS_SCHED_##e] = &ops,
#include "src/schedules.def"
#undef PS_SCHEDULE_ROW
};

#define N_ROWS ((int)(sizeof(table) / sizeof(table[0])))

const struct ps_schedule_ops *ps_schedule_ops(enum ps_schedule kind)
{
    return (int)kind >= 0 && (int)kind < N_ROWS ? table[kind] : NULL;
}

int ps_schedule_by_name(const char *name)
{
    for (int k = 0; k < N_ROWS; k++)
        if (!strcmp(table[k]->name, name)) return k;
    return -1;
}

const char *ps_schedule_names(void)
{
    static char names[512];
    if (!names[0])
        for (int k = 0; k < N_ROWS; k++) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof(names) - len, "%s%s", k ? "," : "", table[k]->name);
        }
    return names;
}

int ps_schedule_plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                     struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    const struct ps_schedule_ops *ops = ps_schedule_ops(v->schedule);
    if (!ops || !ops->plan)
        return ps_diag_set(diag, -EINVAL, spec->path,
                           "pipeline.schedule: %s is built from clock cycles, not a plan",
                           ops ? ops->name : "?");
    int rc = ops->plan(spec, v, out, diag);
    if (rc == -ENOMEM) rc = ps_diag_set(diag, rc, spec->path, "out of memory");
    if (rc) ps_plan_finish(out);
    return rc;
}

int ps_schedule_build(const struct ps_spec *spec, const struct ps_model *model,
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

    const struct ps_schedule_ops *ops = ps_schedule_ops(opts->schedule);
    if (!ops) return ps_diag_set(diag, -EINVAL, spec->path, "pipeline.schedule: unknown schedule");
    if (ops->build) return ops->build(spec, model, opts, out, diag);
    struct ps_plan p;
    int rc = ps_schedule_plan(spec, opts, &p, diag);
    if (rc) return rc;
    rc = ps_plan_build(spec, model, opts, &p, out, diag);
    ps_plan_finish(&p);
    return rc;
}

double ps_schedule_makespan_fb(int m, int S, int vs, double f, double b, double w)
{
    (void)vs, (void)w;
    return (m + S - 1) * (f + b);
}

int ps_schedule_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag)
{
    /* a backward root is what the autograd-engine model starts from; a plan's graph has none
       (hand-written plans included, whatever the spec's schedule) and runs in its plan's order */
    return g->root != PS_NONE ? ps_engine_order(g, o, diag) : ps_plan_order(g, o, diag);
}

int ps_schedule_pytorch_note(enum ps_schedule kind, int S, int m, int vs, char *buf, size_t len)
{
    buf[0] = 0;
    if (kind == PS_SCHED_1F1B && m < S)
        return snprintf(buf, len,
                        "PyTorch's Schedule1F1B refuses %d micro-batches on %d stages (ValueError "
                        "\"Number of microbatches (%d) must be greater than or equal to the "
                        "number of stages (%d).\"): this program runs in pipescope only",
                        m, S, m, S) > 0;
    bool rounds = kind == PS_SCHED_INTERLEAVED || kind == PS_SCHED_INTERLEAVED_ZB ||
                  kind == PS_SCHED_ZBH1;
    if (!rounds || vs < 1 || S % vs != 0 || m < 1) return 0;
    int D = S / vs, r = m / D > 1 ? m / D : 1;
    if (m % r == 0) return 0;
    const char *cls = kind == PS_SCHED_INTERLEAVED ? "ScheduleInterleaved1F1B"
                                                   : "ScheduleInterleavedZeroBubble";
    return snprintf(buf, len,
                    "PyTorch's %s refuses %d micro-batches on %d ranks: they run in rounds of "
                    "max(1, m / %d) = %d, which must divide m (ValueError); this program runs in "
                    "pipescope only",
                    cls, m, D, D, r) > 0;
}
