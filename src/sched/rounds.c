/* sched/rounds: PyTorch's round-based 1F1B family (torch/distributed/pipelining/schedules.py,
 * _get_warmup_ops and _get_1f1b_rank_ops), for D ranks with v stages each (stage = chunk*D + r).
 *
 * Micro-batches go in rounds: rounds = max(1, m / D), per = m / rounds, which must divide m
 * (m = 10 on 4 ranks: 2 rounds of 5; m = 9 cannot be split). Rank r runs
 *     warm = min((v-1) per + f (D-1-r), v m)    forwards (f = 2 for 1F1B, 1 for zero bubble),
 * then one forward and one backward per step until the forwards run out, then the backwards.
 * Step k's forward runs chunk (k / per) % v; the k-th backward runs chunk v-1 - ((k / per) % v),
 * micro-batches counted per stage. Zero bubble splits every backward into B (input gradient) and
 * W (weight gradient): rank r lets r backwards pass, then runs one W after every B, always the W
 * of its oldest pending backward, and drains the rest at the end. With v = 1 that is ZB-H1:
 *     rank 0 of 4, m = 8:  F0 F1 F2 F3 B0 W0 F4 B1 W1 ... B7 W7
 *     rank 3 of 4, m = 8:  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 ... B7 W4 W5 W6 W7
 * so a micro-batch's activations stay alive from F to W and each rank holds at most D of them
 * (1F1B's first-rank peak). Idle steps of PyTorch's lists (None) are not kept: the builder's
 * dependencies make a rank wait where PyTorch pads.
 */
#include "src/sched/gen.h"

#include <errno.h>
#include <stdlib.h>

static int fwd_stage(int k, int per, int v, int D, int r)
{
    return ((k / per) % v) * D + r;
}

static int bwd_stage(int k, int warm, int per, int v, int D, int r)
{
    return (v - 1 - ((k - warm) / per) % v) * D + r;
}

int ps_gen_rounds(const struct ps_spec *spec, int S, int m, int v, bool zb, struct ps_plan *p,
                  struct ps_diag *diag)
{
    const char *where = spec ? spec->path : "schedule";
    const char *name = zb ? (v == 1 ? "zb-h1" : "interleaved-zb") : "interleaved-1f1b";
    if (v < 1 || S % v != 0)
        return ps_diag_set(diag, -EINVAL, where,
                           "pipeline.virtual_stages: %d partitions cannot be split into %d "
                           "stages per device",
                           S, v);
    int D = S / v, per = m;
    if (v > 1) {
        int rounds = m / D > 1 ? m / D : 1;
        if (m % rounds != 0) {
            int rc = ps_diag_set(diag, -EINVAL, where,
                                 "pipeline.chunks: %s runs micro-batches in rounds of max(1, m/%d) "
                                 "= %d, which must divide m = %d (as PyTorch's schedule requires)",
                                 name, D, rounds, m);
            ps_diag_hint(diag, "use fewer than %d micro-batches, or a multiple of %d", 2 * D, D);
            return rc;
        }
        per = m / rounds;
    }
    int total = v * m;
    if (ps_plan_alloc(p, D, S, m, (uint32_t)total * (zb ? 3u : 2u))) return -ENOMEM;
    p->split = zb;
    int *nf = calloc((size_t)S, sizeof(int)), *nb = calloc((size_t)S, sizeof(int)),
        *nw = calloc((size_t)S, sizeof(int)), *bstep = malloc((size_t)total * sizeof(int));
    if (!nf || !nb || !nw || !bstep) {
        free(nf), free(nb), free(nw), free(bstep);
        return -ENOMEM;
    }
    for (int r = 0; r < D; r++) {
        p->lane_device[r] = ps_gen_lane_device(spec, r);
        int warm = (v - 1) * per + (zb ? 1 : 2) * (D - 1 - r);
        if (warm > total) warm = total;
        int nbs = 0, wdone = 0;
        for (int k = 0; k < total + warm; k++) {
            if (k < total) {
                int s = fwd_stage(k, per, v, D, r);
                ps_plan_push(p, r, PS_ACT_F, nf[s]++, s);
            }
            if (k < warm) continue;
            int s = bwd_stage(k, warm, per, v, D, r);
            ps_plan_push(p, r, PS_ACT_B, nb[s]++, s);
            bstep[nbs++] = k;
            if (zb && k - warm >= r) {
                int ws = bwd_stage(bstep[wdone++], warm, per, v, D, r);
                ps_plan_push(p, r, PS_ACT_W, nw[ws]++, ws);
            }
        }
        while (zb && wdone < nbs) {
            int ws = bwd_stage(bstep[wdone++], warm, per, v, D, r);
            ps_plan_push(p, r, PS_ACT_W, nw[ws]++, ws);
        }
    }
    free(nf), free(nb), free(nw), free(bstep);
    return 0;
}

int ps_gen_looped_bfs(const struct ps_spec *spec, int S, int m, int v, struct ps_plan *p,
                      struct ps_diag *diag)
{
    if (v < 1 || S % v != 0)
        return ps_diag_set(diag, -EINVAL, spec ? spec->path : "schedule",
                           "pipeline.virtual_stages: %d partitions cannot be split into %d "
                           "stages per device",
                           S, v);
    int D = S / v;
    if (ps_plan_alloc(p, D, S, m, 2u * (uint32_t)m * (uint32_t)v)) return -ENOMEM;
    for (int r = 0; r < D; r++) {
        p->lane_device[r] = ps_gen_lane_device(spec, r);
        for (int c = 0; c < v; c++)
            for (int i = 0; i < m; i++) ps_plan_push(p, r, PS_ACT_F, i, c * D + r);
        for (int c = v - 1; c >= 0; c--)
            for (int i = m - 1; i >= 0; i--) ps_plan_push(p, r, PS_ACT_B, i, c * D + r);
    }
    return 0;
}

/* ---- rows of the schedule table (schedule.h) ------------------------------------------------- */

static int plan_looped_bfs(const struct ps_spec *spec, const struct ps_variant *v,
                           struct ps_plan *out, struct ps_diag *diag)
{
    return ps_gen_looped_bfs(spec, spec->n_partitions, v->mb_count, v->virtual_stages, out, diag);
}

static int plan_interleaved_zb(const struct ps_spec *spec, const struct ps_variant *v,
                               struct ps_plan *out, struct ps_diag *diag)
{
    return ps_gen_rounds(spec, spec->n_partitions, v->mb_count, v->virtual_stages, true, out,
                         diag);
}

const struct ps_schedule_ops ps_sched_looped_bfs = {
    .name = "looped-bfs",
    .plan = plan_looped_bfs,
    .virtual_stages = true,
};

const struct ps_schedule_ops ps_sched_interleaved_zb = {
    .name = "interleaved-zb",
    .plan = plan_interleaved_zb,
    .virtual_stages = true,
};
