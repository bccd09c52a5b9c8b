/* interleaved: PyTorch's ScheduleInterleaved1F1B, a row of the schedule table (schedule.h).
 *
 * D devices, v model chunks, stage = chunk*D + device; the program is PyTorch's round-based 1F1B
 * (rounds.c): device r runs (v-1) per + 2 (D-r-1) warm-up forwards, per = m / max(1, m / D), then
 * 1F1B. When m is a multiple of D this is Megatron-LM's interleaved order too, except at m == D,
 * where Megatron runs every forward first and PyTorch keeps 1F1B (p = 2, m = 2, rank 1:
 * 1F0 1B0 1F1 1B1); pipescope follows PyTorch there. The graph is plan.c's.
 */
#include "src/sched/gen.h"

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    return ps_gen_rounds(spec, spec->n_partitions, v->mb_count, v->virtual_stages, false, out,
                         diag);
}

/* per stage f, b (a device runs vs stages): m vs (f + b) of work plus (D - 1)(f + b) of bubble,
 * D = S / vs devices (SEMANTICS.md section 6); m a multiple of D */
static double makespan(int m, int S, int vs, double f, double b, double w)
{
    (void)w;
    return m * vs * (f + b) + (S / vs - 1) * (f + b);
}

const struct ps_schedule_ops ps_sched_interleaved = {
    .name = "interleaved-1f1b",
    .build = NULL,
    .plan = plan,
    .makespan = makespan,
    .phony = false,
    .engine_order = false,
    .virtual_stages = true,
};
