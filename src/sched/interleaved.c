/* interleaved: Megatron-LM's interleaved 1F1B, a row of the schedule table (schedule.h).
 *
 * forward_backward_pipelining_with_interleaving: D devices, v model chunks, stage = chunk*D +
 * device; device r runs (D-r-1)*2 + (v-1)*D warm-up forwards (all of them when m == D), then 1F1B
 * over the m*v virtual micro-batches; virtual micro-batch k is micro-batch (k / (D v)) D + k % D of
 * chunk (k % (D v)) / D (backward: chunk v-1 minus that). When m is not a multiple of D it runs
 * PyTorch's rounds instead (rounds.c), as ScheduleInterleaved1F1B does. The graph is plan.c's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/sched/gen.h"

static void virt(int k, int D, int v, bool fwd, int r, int *mb, int *stage)
{
    int grp = k / (D * v), kin = k % (D * v);
    int chunk = kin / D;
    if (!fwd) chunk = v - 1 - chunk;
    *mb = grp * D + kin % D;
    *stage = chunk * D + r;
}

static int gen_interleaved(const struct ps_spec *spec, int S, int m, int v, struct ps_plan *p,
                           struct ps_diag *diag)
{
    const char *where = spec ? spec->path : "schedule";
    if (v < 1 || S % v != 0)
        return ps_diag_set(diag, -EINVAL, where,
                           "pipeline.virtual_stages: %d partitions cannot be split into %d "
                           "model chunks per device",
                           S, v);
    int D = S / v;
    if (m % D != 0) return ps_gen_rounds(spec, S, m, v, false, p, diag);
    if (ps_plan_alloc(p, D, S, m, 2u * (uint32_t)m * (uint32_t)v)) return -ENOMEM;
    int total = m * v;
    for (int r = 0; r < D; r++) {
        p->lane_device[r] = ps_plan_stage_device(spec, r);
        int warm = m == D ? total : (D - r - 1) * 2 + (v - 1) * D;
        if (warm > total) warm = total;
        int mb, st;
        for (int k = 0; k < warm; k++) {
            virt(k, D, v, true, r, &mb, &st);
            ps_plan_push(p, r, PS_ACT_F, mb, st);
        }
        for (int k = 0; k < total - warm; k++) {
            virt(warm + k, D, v, true, r, &mb, &st);
            ps_plan_push(p, r, PS_ACT_F, mb, st);
            virt(k, D, v, false, r, &mb, &st);
            ps_plan_push(p, r, PS_ACT_B, mb, st);
        }
        for (int k = total - warm; k < total; k++) {
            virt(k, D, v, false, r, &mb, &st);
            ps_plan_push(p, r, PS_ACT_B, mb, st);
        }
    }
    return 0;
}

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    return gen_interleaved(spec, spec->n_partitions, v->mb_count, v->virtual_stages, out, diag);
}

/* per stage f, b (a device runs vs stages): m vs (f + b) of work plus (D - 1)(f + b) of bubble,
 * D = S / vs devices (SEMANTICS.md section 6); Megatron's order, m a multiple of D */
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
