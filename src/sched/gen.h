/* sched/gen: generators of the per-rank action lists of the schedules PyTorch's
 * torch.distributed.pipelining and the zero-bubble paper define (private to src/sched/).
 *
 * Every generator fills a plan with one lane per device (rank) and returns 0, -ENOMEM, or
 * -EINVAL with diag saying which pipeline setting cannot be scheduled and how to fix it.
 * S = partitions (stages), m = micro-batches, v = stages per device.
 *
 * Stage placement:  loop  stage s on rank s % D            (interleaved, looped BFS, ZB1P)
 *                   V     rank r holds stages r and 2D-1-r (ZB-V, DualPipeV)
 * A lane runs on the device of partition r (its first stage); the devices the spec lists for
 * the other stages of the lane are not consulted.
 */
#ifndef PS_SCHED_GEN_H
#define PS_SCHED_GEN_H

#include <stdbool.h>

#include "src/diag.h"
#include "src/schedule.h"
#include "src/spec.h"

static inline int ps_gen_lane_device(const struct ps_spec *spec, int r)
{
    return spec ? spec->device_id[r] : r;
}

/* PyTorch's round-based 1F1B family (_get_1f1b_rank_ops): interleaved 1F1B when m is not a
 * multiple of the devices (zb = false), interleaved zero bubble / ZB1P (zb = true); with v = 1
 * and zb = true it is ZB-H1. */
int ps_gen_rounds(const struct ps_spec *spec, int S, int m, int v, bool zb, struct ps_plan *p,
                  struct ps_diag *diag);
/* ScheduleLoopedBFS: every forward of a rank's first stage, then its next stage's, ...; then the
 * backwards stage by stage in reverse, micro-batches descending. */
int ps_gen_looped_bfs(const struct ps_spec *spec, int S, int m, int v, struct ps_plan *p,
                      struct ps_diag *diag);
/* ScheduleZBVZeroBubble: two stages per rank in a V, split backward. */
int ps_gen_zbv(const struct ps_spec *spec, int S, int m, struct ps_plan *p, struct ps_diag *diag);
/* ScheduleDualPipeV: V placement, overlapped forward+backward pairs, mixed full/split backward. */
int ps_gen_dualpipev(const struct ps_spec *spec, int S, int m, struct ps_plan *p,
                     struct ps_diag *diag);
/* ZB-H2 (Qi et al., ICLR 2024, section 3.1): the unit-time schedule with 2D-1 micro-batches in
 * flight per rank (counted until W), backward first, then forward, weight gradients in the gaps. */
int ps_gen_zbh2(const struct ps_spec *spec, int S, int m, struct ps_plan *p, struct ps_diag *diag);

#endif
