/* calibrate: the cost model (cost.h) fitted to a measured run, beside the model it fits.
 *
 * ps_calibrate fits, by linear least squares on the measured trace,
 *   F(i,j), R(i,j):  dur = s_i * Fp_j           (Fp_j: forward of partition j per sample)
 *   B(i,j) (+Wg):    dur = s_i * Bp_j
 *   C(...):          dur = bytes * u + lat      (u = 1e6 / bandwidth, in us per byte)
 *   host-bound starts:  start = (K_v + 1) * h + t0
 * where s_i is the size of micro-batch i, h the launch overhead and K_v the number of launches
 * the host issues before v (the simulator's issue rule, sim.h, counted with h = 1). A start is
 * host-bound when it lies after the end of every dependency and of the previous node on its
 * stream. The normal equations are column-scaled and solved by Cholesky with a rank guard: a
 * parameter whose pivot falls below 1e-10 of its column norm is not identifiable from this
 * trace (no copies, all copies the same size, no host-bound start) and keeps the spec's value.
 * The fit is iterated with weights 1/|residual| (IRLS towards least absolute deviations), so the
 * spikes of a shared CPU do not drag it; exact data gets the least-squares solution.
 * Per-layer costs split each partition's fit in proportion to the layers' roofline times.
 */
#ifndef PS_CALIBRATE_H
#define PS_CALIBRATE_H

#include <stdbool.h>
#include <stdint.h>

#include "sim/cost.h"
#include "src/diag.h"
#include "src/graph.h"
#include "src/trace.h"

enum ps_calib_param { PS_CAL_BANDWIDTH, PS_CAL_LATENCY, PS_CAL_LAUNCH, PS_CAL_OFFSET, PS_CAL__COUNT };

struct ps_calib {
    struct ps_costs *costs;   /* the fit as a costs file (cost.h), owned */
    int n_parts;
    double *part_fwd_us, *part_bwd_us; /* per sample, per partition; NaN = not fitted */
    bool fitted[PS_CAL__COUNT];        /* copy bandwidth, latency, launch overhead, clock offset */
    double value[PS_CAL__COUNT];       /* bytes/s, us, us, us */
    uint32_t n_obs, n_params, rank;
    uint32_t n_host_bound;             /* start observations used for the launch overhead */
    uint32_t n_trimmed;                /* outliers: residual > half the observation */
    double rms_us;                     /* residual of the fit */
};

/* Fits the costs to meas (records on g, run in `order`). per_sample selects the costs file's
 * unit ("sample", else "micro_batch" with the size of micro-batch 0). Returns 0, -EINVAL when
 * the trace has no F/B task of the graph (diag), -ENOMEM. */
int ps_calibrate(const struct ps_graph *g, const struct ps_order *order,
                 const struct ps_trace *meas, bool per_sample, struct ps_calib *out,
                 struct ps_diag *diag);
void ps_calib_finish(struct ps_calib *c); /* accepts a zeroed struct */

/* ---- several runs: a model that carries across micro-batch sizes -------------------------- *
 *
 * ps_calibrate_runs fits one cost model to several measured runs of the same model (same layers
 * and balance; chunks, checkpoint mode and schedule may differ), by the same weighted least
 * squares as ps_calibrate, with per partition j and micro-batch size s:
 *   F(i,j):          dur = Fa_j + s * Fb_j       (fixed + per-sample)
 *   R(i,j):          dur = Fa_j + Ra_j + s * (Fb_j + Rb_j)   (Ra, Rb: what R does not do that
 *                    F does, e.g. the cpu executor's R skips the last layer; columns after all
 *                    others, Ra last: runs with R at one size only fit Rb)
 *   F(i,j) checkpointed (no grad): dur = Fa_j + Ka_j + s * (Fb_j + Kb_j)   (Ka, Kb: what a
 *                    forward that keeps nothing saves; columns after R's)
 *   B(i,j) (+Wg):    dur = Ba_j + s * Bb_j
 *   C(...):          dur = bytes * u + lat
 *   host-bound starts of run r:  start = (K_v + 1) * h + t0_r   (one clock offset per run)
 * The per-sample columns come before the fixed ones, so runs of one micro-batch size (fixed and
 * per-sample terms collinear) fall back to the per-sample model of ps_calibrate. The standard
 * error of each parameter is the square root of the diagonal of the sandwich covariance
 * (X'WX)^-1 (sum_k w_k^2 r_k^2 x_k x_k') (X'WX)^-1 n / (n - rank) over the final IRLS weights w
 * and residuals r (rows of different kinds and scales keep their own spread): 0 for data the
 * model fits exactly. The fixed terms (Fa, Ba), the copy latency and the launch overhead are
 * constrained to be >= 0: a negative one is pinned at 0 and the rest refitted without it
 * (term_free keeps what it was). A negative fixed term of F or B says the per-sample cost grows
 * with the micro-batch size (a straight line through two sizes crosses zero above s = 0): its
 * pinning brings in that partition's s^2 term (Fc_j, Bc_j: F = Fa + s Fb + s^2 Fc, likewise R
 * and the checkpointed F; B = Ba + s Bb + s^2 Bc), itself >= 0, so the per-sample cost is
 * Fb + s Fc and the fit still passes through both sizes. B of a micro-batch the graph recomputes
 * on that partition (R right before it) is B + s * Hb_j (NaN when the runs cannot tell it from B:
 * then B of both is the same): R leaves the micro-batch's activations in the CPU's cache, where
 * a stored micro-batch's were written long before. The step's first B on partition j (in the
 * run's order) is B + s * Pb_j, Pb >= 0: its gradient buffers are the only ones no task has
 * touched since the previous step (sim/COSTS.md, measured). Per-layer costs: a partition's
 * per-sample terms split in proportion to its layers' roofline times, its fixed terms in equal
 * parts (the trace has one range per partition task, so the layers inside it are not seen). */
enum ps_calib_term { PS_CALT_FWD_FIXED, PS_CALT_FWD_SAMPLE, PS_CALT_BWD_FIXED, PS_CALT_BWD_SAMPLE,
                     PS_CALT_REC_FIXED, PS_CALT_REC_SAMPLE, /* R minus F; NaN: R = F */
                     PS_CALT_CKPT_FIXED, PS_CALT_CKPT_SAMPLE, /* checkpointed F minus F */
                     PS_CALT_FWD_SQ, PS_CALT_BWD_SQ, /* x s^2 (0: not used) */
                     PS_CALT_BREC_SAMPLE, /* B of a recomputed micro-batch minus B */
                     PS_CALT_FIRST_B, /* the step's first B minus B */
                     PS_CALT__COUNT };

struct ps_calib_run {
    const struct ps_graph *g;
    const struct ps_order *order;
    const struct ps_trace *meas;
};

struct ps_calib_fit {
    struct ps_costs *costs;                  /* unit "sample" with fixed terms, owned */
    int n_parts, n_runs;
    double *term[PS_CALT__COUNT];            /* per partition, us; NaN = not identifiable */
    double *term_sd[PS_CALT__COUNT];         /* standard error, us */
    double *term_free[PS_CALT__COUNT];       /* a fixed term pinned at 0: what the fit without
                                                the constraint gave (< 0); NaN: not pinned */
    bool fitted[PS_CAL_OFFSET];              /* copy bandwidth, latency, launch overhead */
    double value[PS_CAL_OFFSET], sd[PS_CAL_OFFSET]; /* bytes/s, us, us */
    double free_value[PS_CAL_OFFSET];        /* latency or launch overhead pinned at 0: the
                                                unconstrained value; NaN: not pinned */
    uint32_t n_obs, n_params, rank, n_host_bound, n_trimmed;
    double rms_us;
};

/* PS_CAL_ROBUST: the IRLS fit (towards least absolute deviations: typical task times, a shared
 * CPU's preemptions left out); PS_CAL_MEAN: plain least squares (mean task times: on a machine
 * whose other load preempts tasks at a steady rate, the expected delay is part of the cost). */
enum ps_calib_loss { PS_CAL_ROBUST, PS_CAL_MEAN };

/* Fits over runs[0..n). Returns 0, -EINVAL (diag) when the runs are not of one model (layer
 * count, balance) or have no F/B task to fit, -ENOMEM. */
int ps_calibrate_runs(const struct ps_calib_run *runs, int n, enum ps_calib_loss loss,
                      struct ps_calib_fit *out, struct ps_diag *diag);
void ps_calib_fit_finish(struct ps_calib_fit *f); /* accepts a zeroed struct */
/* 0 when g is a run of g0's model (layer count, balance), else -EINVAL with diag naming g's
 * spec and the field. */
int ps_calib_same_model(const struct ps_graph *g0, const struct ps_graph *g, struct ps_diag *diag);

/* Solves the n x n symmetric positive semi-definite system A x = b in place by Cholesky after
 * scaling to unit diagonal; pivots below tol (relative) mark a column dependent on earlier ones:
 * its x is 0 and used[k] false. Returns the rank. A is row-major, overwritten. */
int ps_cholesky_solve(double *A, double *b, int n, double tol, double *x, bool *used);

#endif
