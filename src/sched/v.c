/* sched/v: the two V-shaped schedules, two stages per rank (rank r holds stages r and 2D-1-r,
 * so the last stage sits on the first rank and the loss gradient turns round where the input
 * came in). Read from PyTorch's torch/distributed/pipelining/schedules.py.
 *
 * ZB-V (ScheduleZBVZeroBubble, Qi et al. 2024 section 6): with n = max(2D-1, m) slots rank r
 * runs 2(D-r)-1 forwards of its first stage, r pairs (F second stage, F first stage), D-r
 * triples (F, B, W of the second stage), then while forwards remain: F first, B W first,
 * F B W second; then r pairs (B first, B second), D-r pairs (B first, W first) and the remaining
 * W's of the second stage, then of the first. Slots of micro-batches >= m are dropped.
 *
 * DualPipeV (ScheduleDualPipeV, DeepSeek's DualPipe "V" variant): eight phases per rank; in the
 * main phase a forward of one stage and a FULL backward of the other run as one overlapped pair
 * (PyTorch's OVERLAP_F_B); the warm-up and the second half of the drain split backward into
 * B (input gradient) and W, with W's kept in a queue and run one at a time later. So a stage has
 * both kinds: a B with a W of the same micro-batch is the input gradient, one without is the
 * full backward (plan->mixed). PyTorch's regression artifact dualpipev_4rank_10mb.csv is
 * reproduced action for action (tests/golden/sched).
 */
#include "src/sched/gen.h"

#include <errno.h>
#include <stdlib.h>

static int v_ranks(const struct ps_spec *spec, int S, const char *name, struct ps_diag *diag)
{
    if (S % 2 == 0 && S >= 2) return S / 2;
    int rc = ps_diag_set(diag, -EINVAL, spec ? spec->path : "schedule",
                         "pipeline.balance: %s needs two stages per device (an even number of "
                         "partitions), not %d",
                         name, S);
    ps_diag_hint(diag, "split the model into 2 x devices partitions; rank r runs partitions r "
                       "and %s-1-r",
                 "2D");
    return rc;
}

/* one ZB-V slot: kept when its micro-batch exists (PyTorch pads the slots to max(2D-1, m)) */
static void act(struct ps_plan *p, int r, int m, enum ps_action_kind k, int mb, int stage)
{
    if (mb < m) ps_plan_push(p, r, k, mb, stage);
}

int ps_gen_zbv(const struct ps_spec *spec, int S, int m, struct ps_plan *p, struct ps_diag *diag)
{
    int D = v_ranks(spec, S, "zb-v", diag);
    if (D < 0) return D;
    int n = m > 2 * D - 1 ? m : 2 * D - 1;
    if (ps_plan_alloc(p, D, S, m, 6u * (uint32_t)n)) return -ENOMEM;
    p->split = true;
    for (int r = 0; r < D; r++) {
        p->lane_device[r] = ps_gen_lane_device(spec, r);
        int s0 = r, s1 = S - 1 - r, f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        for (int k = 0; k < 2 * (D - r) - 1; k++) act(p, r, m, PS_ACT_F, f0++, s0);
        for (int k = 0; k < r; k++) {
            act(p, r, m, PS_ACT_F, f1++, s1);
            act(p, r, m, PS_ACT_F, f0++, s0);
        }
        for (int k = 0; k < D - r; k++) {
            act(p, r, m, PS_ACT_F, f1++, s1);
            act(p, r, m, PS_ACT_B, b1, s1);
            act(p, r, m, PS_ACT_W, b1, s1);
            b1++;
        }
        while (f1 < f0 || f0 < n) {
            if (f0 < n) act(p, r, m, PS_ACT_F, f0++, s0);
            act(p, r, m, PS_ACT_B, b0, s0);
            act(p, r, m, PS_ACT_W, b0, s0);
            b0++;
            act(p, r, m, PS_ACT_F, f1++, s1);
            act(p, r, m, PS_ACT_B, b1, s1);
            act(p, r, m, PS_ACT_W, b1, s1);
            b1++;
        }
        int w0 = b0, w1 = b1;
        for (int k = 0; k < r; k++) {
            act(p, r, m, PS_ACT_B, b0++, s0);
            act(p, r, m, PS_ACT_B, b1++, s1);
        }
        for (int k = 0; k < D - r; k++) {
            act(p, r, m, PS_ACT_B, b0++, s0);
            act(p, r, m, PS_ACT_W, w0++, s0);
        }
        while (w1 < b1) act(p, r, m, PS_ACT_W, w1++, s1);
        while (w0 < b0) act(p, r, m, PS_ACT_W, w0++, s0);
    }
    return 0;
}

/* DualPipeV's per-rank state: micro-batch counters per (stage side, kind) and the W queue */
struct dpv {
    struct ps_plan *p;
    int r, s[2];
    int nf[2], nb[2];        /* next forward / backward micro-batch of side 0 and 1 */
    int *wq_stage, *wq_mb;   /* pending weight gradients, oldest first */
    int wq_head, wq_tail;
};

static void fwd(struct dpv *d, int k)
{
    ps_plan_push(d->p, d->r, PS_ACT_F, d->nf[k]++, d->s[k]);
}

/* a backward of side k: full (its W is part of it) or input gradient only (W queued) */
static void bwd(struct dpv *d, int k, bool input_only)
{
    int mb = d->nb[k]++;
    ps_plan_push(d->p, d->r, PS_ACT_B, mb, d->s[k]);
    if (input_only) {
        d->wq_stage[d->wq_tail] = d->s[k];
        d->wq_mb[d->wq_tail++] = mb;
    }
}

/* the overlapped pair: forward of side f, full backward of the other side */
static void overlap(struct dpv *d, int f)
{
    fwd(d, f);
    d->p->act[d->r][d->p->len[d->r] - 1].overlap = 1;
    bwd(d, !f, false);
}

static void pending_w(struct dpv *d)
{
    if (d->wq_head == d->wq_tail) return;
    int st = d->wq_stage[d->wq_head], mb = d->wq_mb[d->wq_head++];
    ps_plan_push(d->p, d->r, PS_ACT_W, mb, st);
}

int ps_gen_dualpipev(const struct ps_spec *spec, int S, int m, struct ps_plan *p,
                     struct ps_diag *diag)
{
    int D = v_ranks(spec, S, "dualpipe-v", diag);
    if (D < 0) return D;
    if (m < S) {
        int rc = ps_diag_set(diag, -EINVAL, spec ? spec->path : "schedule",
                             "pipeline.chunks: dualpipe-v needs at least as many micro-batches "
                             "as stages (%d), not %d",
                             S, m);
        ps_diag_hint(diag, "set pipeline.chunks to %d or more", S);
        return rc;
    }
    if (ps_plan_alloc(p, D, S, m, 6u * (uint32_t)m)) return -ENOMEM;
    p->split = p->mixed = true;
    int *ws = malloc(2 * (size_t)m * sizeof(int)), *wm = malloc(2 * (size_t)m * sizeof(int));
    if (!ws || !wm) {
        free(ws), free(wm);
        return -ENOMEM;
    }
    for (int r = 0; r < D; r++) {
        p->lane_device[r] = ps_gen_lane_device(spec, r);
        struct dpv d = {.p = p, .r = r, .s = {r, S - 1 - r}, .wq_stage = ws, .wq_mb = wm};
        for (int k = 0; k < (D - r - 1) * 2; k++) fwd(&d, 0);          /* 1: F0 */
        for (int k = 0; k < r + 1; k++) fwd(&d, 0), fwd(&d, 1);        /* 2: F0 F1 */
        for (int k = 0; k < D - r - 1; k++) {                           /* 3: I1 W F1 */
            bwd(&d, 1, true);
            pending_w(&d);
            fwd(&d, 1);
        }
        for (int k = 0; k < m - 2 * D + r + 1; k++) {                   /* 4: F0B1 F1B0 */
            if (k == 0 && r == D - 1) {
                fwd(&d, 0);
                bwd(&d, 1, false);
            } else {
                overlap(&d, 0);
            }
            overlap(&d, 1);
        }
        for (int k = 0; k < D - r - 1; k++) {                           /* 5: B1 F1B0 */
            bwd(&d, 1, false);
            overlap(&d, 1);
        }
        bool zb = false;                                                /* 6: B1 B0 */
        for (int k = 0; k < r + 1; k++) {
            if (k == (r + 1) / 2 && r % 2 == 1) zb = true;
            bwd(&d, 1, zb);
            if (k == (r + 1) / 2 && r % 2 == 0) zb = true;
            bwd(&d, 0, zb);
        }
        for (int k = 0; k < D - r - 1; k++) {                           /* 7: W B0 */
            pending_w(&d);
            bwd(&d, 0, zb);
        }
        for (int k = 0; k < r + 1; k++) pending_w(&d);                  /* 8: W */
    }
    free(ws), free(wm);
    return 0;
}

/* ---- rows of the schedule table (schedule.h) ------------------------------------------------- */

static int plan_zbv(const struct ps_spec *spec, const struct ps_variant *v, struct ps_plan *out,
                    struct ps_diag *diag)
{
    return ps_gen_zbv(spec, spec->n_partitions, v->mb_count, out, diag);
}

static int plan_dualpipev(const struct ps_spec *spec, const struct ps_variant *v,
                          struct ps_plan *out, struct ps_diag *diag)
{
    return ps_gen_dualpipev(spec, spec->n_partitions, v->mb_count, out, diag);
}

/* two stages per rank whatever pipeline.virtual_stages says (spec.c warns) */
const struct ps_schedule_ops ps_sched_zbv = {.name = "zb-v", .plan = plan_zbv};
const struct ps_schedule_ops ps_sched_dualpipev = {.name = "dualpipe-v", .plan = plan_dualpipev};
