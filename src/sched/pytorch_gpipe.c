/* pytorch_gpipe: PyTorch's ScheduleGPipe (torch.distributed.pipelining), a row of the schedule
 * table (schedule.h).
 *
 * One stage per rank; every rank runs all m forwards, then all m backwards in ascending
 * micro-batch order: F0 F1 ... F(m-1) B0 B1 ... B(m-1). torchgpipe's GPipe (the `gpipe` row)
 * runs the same forwards but its backwards descend (the autograd engine orders them through the
 * phony edges); this row is the program a torch.distributed.pipelining user runs. The graph is
 * plan.c's; under uniform costs the makespan is GPipe's, (m + S - 1)(f + b).
 */
#include <errno.h>
#include <stdint.h>

#include "src/schedule.h"

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    (void)diag;
    int S = spec->n_partitions, m = v->mb_count;
    if (ps_plan_alloc(out, S, S, m, 2u * (uint32_t)m)) return -ENOMEM;
    for (int s = 0; s < S; s++) {
        out->lane_device[s] = ps_plan_stage_device(spec, s);
        for (int i = 0; i < m; i++) ps_plan_push(out, s, PS_ACT_F, i, s);
        for (int i = 0; i < m; i++) ps_plan_push(out, s, PS_ACT_B, i, s);
    }
    return 0;
}

const struct ps_schedule_ops ps_sched_pytorch_gpipe = {
    .name = "pytorch-gpipe",
    .build = NULL,
    .plan = plan,
    .makespan = ps_schedule_makespan_fb,
    .phony = false,
    .engine_order = false,
    .virtual_stages = false,
};
