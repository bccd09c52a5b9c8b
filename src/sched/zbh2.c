/* sched/zbh2: ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 3.1).
 *
 * ZB-H2 lets every rank keep up to 2D-1 micro-batches alive (the paper's (2p-1) M_B memory) so
 * that extra forwards fill the warm-up bubble before the first backward arrives, and moves the
 * weight-gradient passes W to the gaps of the drain. It is not in PyTorch; the authors generate
 * it with their heuristic scheduler under a 2p memory limit. pipescope builds it with a
 * deterministic unit-time list scheduler (F = B = W = 1, the paper's handcrafted assumption): at
 * every step each rank runs, in this priority,
 *     its next B when the gradient has arrived,
 *     else its next F when the input has arrived and fewer than min(m, 2D-1) micro-batches are
 *       alive on it (alive from F until its W),
 *     else its oldest pending W.
 * In unit time that schedule has no idle step between a rank's first action (step r) and its
 * last: the makespan is 3m + D - 1, the lower bound for a synchronised iteration (rank D-1 cannot
 * start before step D-1 and has 3m steps of work). The paper's bubble (p-1)(F+B-2W) is zero
 * under these assumptions because it counts iterations whose optimizer steps are not
 * synchronised (the parallelograms of consecutive iterations interlock); one synchronised
 * iteration keeps the D-1 steps of skew.
 */
#include "src/sched/gen.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int ps_gen_zbh2(const struct ps_spec *spec, int S, int m, struct ps_plan *p, struct ps_diag *diag)
{
    (void)diag;
    if (ps_plan_alloc(p, S, S, m, 3u * (uint32_t)m)) return -ENOMEM;
    p->split = true;
    size_t cells = (size_t)m * (size_t)S;
    int32_t *fe = malloc(cells * sizeof(int32_t)), *be = malloc(cells * sizeof(int32_t));
    int *nf = calloc((size_t)S, sizeof(int)), *nb = calloc((size_t)S, sizeof(int)),
        *nw = calloc((size_t)S, sizeof(int));
    if (!fe || !be || !nf || !nb || !nw) {
        free(fe), free(be), free(nf), free(nb), free(nw);
        return -ENOMEM;
    }
    for (size_t k = 0; k < cells; k++) fe[k] = be[k] = INT32_MAX; /* finish step, or never */
    int cap = 2 * S - 1 < m ? 2 * S - 1 : m, left = S;
    for (int32_t t = 0; left > 0; t++)
        for (int s = 0; s < S; s++) {
            if (nw[s] == m) continue;
            int i = nb[s], f = nf[s];
            bool b_ok = i < f && (s == S - 1 ? fe[(size_t)i * S + s] <= t
                                             : be[(size_t)i * S + s + 1] <= t);
            bool f_ok = f < m && f - nw[s] < cap && (s == 0 || fe[(size_t)f * S + s - 1] <= t);
            if (b_ok) {
                be[(size_t)i * S + s] = t + 1;
                ps_plan_push(p, s, PS_ACT_B, i, s);
                nb[s]++;
            } else if (f_ok) {
                fe[(size_t)f * S + s] = t + 1;
                ps_plan_push(p, s, PS_ACT_F, f, s);
                nf[s]++;
            } else if (nw[s] < nb[s]) {
                ps_plan_push(p, s, PS_ACT_W, nw[s], s);
                if (++nw[s] == m) left--;
            }
        }
    for (int s = 0; s < S; s++) p->lane_device[s] = ps_gen_lane_device(spec, s);
    free(fe), free(be), free(nf), free(nb), free(nw);
    return 0;
}

/* ---- row of the schedule table (schedule.h) -------------------------------------------------- */

static int plan(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                struct ps_diag *diag)
{
    return ps_gen_zbh2(spec, spec->n_partitions, v->mb_count, out, diag);
}

/* the paper's m (f + b + w) + (S - 1) max(f, f + b - 2w), exact for f = b = w */
static double makespan(int m, int S, int vs, double f, double b, double w)
{
    (void)vs;
    double tail = f + b - 2 * w;
    return m * (f + b + w) + (S - 1) * (f > tail ? f : tail);
}

const struct ps_schedule_ops ps_sched_zbh2 = {
    .name = "zb-h2",
    .plan = plan,
    .makespan = makespan,
};
