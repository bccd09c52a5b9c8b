/* zbh1: ZB-H1 of the zero-bubble paper (backward split into B and W), a row of the schedule
 * table (schedule.h). The lists are PyTorch's ZB1P with one stage per rank (rounds.c): one W
 * after every B once rank r has let r backwards pass, so the first device's peak activations
 * equal 1F1B's. The graph is plan.c's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/sched/gen.h"

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    return ps_gen_rounds(spec, spec->n_partitions, v->mb_count, 1, true, out, diag);
}

/* the paper's handcrafted bound m (f + b + w) + (S - 1)(f + b - w), exact for f = b = w, the
 * costs the plan is generated for */
static double makespan(int m, int S, int vs, double f, double b, double w)
{
    (void)vs;
    return m * (f + b + w) + (S - 1) * (f + b - w);
}

const struct ps_schedule_ops ps_sched_zbh1 = {
    .name = "zb-h1",
    .build = NULL,
    .plan = plan,
    .makespan = makespan,
    .phony = false,
    .engine_order = false,
    .virtual_stages = false,
};
