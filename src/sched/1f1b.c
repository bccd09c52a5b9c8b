/* 1f1b: PipeDream-Flush (one forward, one backward), a row of the schedule table (schedule.h).
 *
 * Stage s: w = min(S-s-1, m) warm-up forwards, then (F, B) pairs, then the drain backwards; at
 * most S - s micro-batches in flight on stage s. The graph is plan.c's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/schedule.h"

static int gen_1f1b(const struct ps_spec *spec, int S, int m, struct ps_plan *p)
{
    if (ps_plan_alloc(p, S, S, m, 2u * (uint32_t)m)) return -ENOMEM;
    for (int s = 0; s < S; s++) {
        p->lane_device[s] = ps_plan_stage_device(spec, s);
        int w = S - s - 1 < m ? S - s - 1 : m;
        for (int i = 0; i < w; i++) ps_plan_push(p, s, PS_ACT_F, i, s);
        for (int k = 0; k < m - w; k++) {
            ps_plan_push(p, s, PS_ACT_F, w + k, s);
            ps_plan_push(p, s, PS_ACT_B, k, s);
        }
        for (int k = m - w; k < m; k++) ps_plan_push(p, s, PS_ACT_B, k, s);
    }
    return 0;
}

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    (void)diag;
    return gen_1f1b(spec, spec->n_partitions, v->mb_count, out);
}

const struct ps_schedule_ops ps_sched_1f1b = {
    .name = "1f1b",
    .build = NULL,
    .plan = plan,
    .makespan = ps_schedule_makespan_fb,
    .phony = false,
    .engine_order = false,
    .virtual_stages = false,
};
