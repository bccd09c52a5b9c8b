/* compare: a measured timeline against a simulated one, and the cost model fitted to it.
 *
 * Both traces are records on one graph (trace.h; a file goes through trace_read.h first), so
 * tasks align by node id. Each trace is put on its own clock: time 0 is the start of its first
 * aligned task, and its makespan is the span of its aligned tasks (a CPU run records F/B/R only,
 * a simulation every node with a stream; comparing like with like). Definitions:
 *
 *   makespan_error   (measured - simulated) / measured
 *   start error      measured start - simulated start (us), per aligned F/B/R/Wg task
 *   duration error   measured - simulated (us), and relative: (measured - simulated) / measured
 *   order inversion  two aligned tasks of one graph stream that run in the opposite order in
 *                    the two traces (pairs counted by merge sort, per stream)
 *   dependency violation  a DATA/PHONY successor that starts before its predecessor ended in
 *                    the measurement (paths through nodes without a record count, as the
 *                    executor records tasks only); 2 ns of slack for the 3-decimal trace format
 *   bubble           per device: 1 - (union of its compute-stream records) / makespan
 *   recompute overhead   R time / (F + B + Wg time), as the simulator defines it
 *   copy/compute overlap the share of copy time during which some compute record runs
 *
 * Tolerances (`--tolerance makespan=0.2,task=0.5,start=0.1`): makespan bounds |makespan_error|,
 * task bounds the p95 of |relative duration error|, start (unset by default) bounds the p95 of
 * |start error| / measured makespan; a dependency violation in the measurement always fails.
 *
 * Calibration (ps_calibrate) fits, by linear least squares on the measured trace,
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
#ifndef PS_COMPARE_H
#define PS_COMPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sim/cost.h"
#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/trace.h"

struct ps_compare_task {
    uint32_t node;
    double sim_start, sim_dur;   /* NaN when the node has no simulated record */
    double meas_start, meas_dur; /* NaN when not measured */
    double start_err, dur_err, dur_rel; /* NaN unless both */
};

#define PS_COMPARE_WORST 5
struct ps_compare_stat {
    uint32_t n;
    double median, p95, max;           /* of |error| */
    uint32_t n_worst;
    uint32_t worst[PS_COMPARE_WORST];  /* indices into tasks[], largest |error| first */
};

struct ps_compare_stream {
    int32_t stream;
    uint32_t n_tasks;
    uint64_t pairs, inversions;
};

#define PS_COMPARE_MAX_DEPS 16
struct ps_compare_dep {
    uint32_t src, dst; /* dst started `early_us` before src ended */
    double early_us;
};

struct ps_compare_device {
    double sim_busy_us, meas_busy_us;
    double sim_bubble, meas_bubble;
    uint32_t sim_n, meas_n; /* compute records */
};

struct ps_compare {
    double sim_makespan_us, meas_makespan_us, makespan_error;
    uint32_t n_tasks;                 /* F/B/R/Wg and copy nodes in either trace */
    struct ps_compare_task *tasks;    /* node order */
    uint32_t n_aligned;               /* in both traces (any node kind) */
    uint32_t n_sim_only, n_meas_only; /* F/B/R/Wg tasks in one trace only */
    uint32_t n_unmatched;             /* measured records mapped to no node */
    struct ps_compare_stat start, dur, dur_rel;
    uint64_t inversions, pairs;
    uint32_t n_streams;
    struct ps_compare_stream *streams;
    uint32_t n_dep_violations, n_deps_checked, n_deps_kept;
    struct ps_compare_dep deps[PS_COMPARE_MAX_DEPS];
    int n_devices;
    struct ps_compare_device *dev;
    double sim_recompute_overhead, meas_recompute_overhead; /* NaN when no F/B */
    double sim_copy_us, meas_copy_us;
    double sim_copy_overlap, meas_copy_overlap;             /* NaN when no copy time */
};

/* Aligns meas against sim on g. Returns 0, -EINVAL when no task is in both (diag), -ENOMEM. */
int ps_compare_run(const struct ps_graph *g, const struct ps_trace *sim,
                   const struct ps_trace *meas, struct ps_compare *c, struct ps_diag *diag);
void ps_compare_finish(struct ps_compare *c); /* accepts a zeroed struct */

/* Per-node relative duration error (NaN where none), for a DOT coloured by error: a malloc'd
 * array of g->n_nodes values (free()), NULL when out of memory. */
double *ps_compare_node_errors(const struct ps_compare *c, const struct ps_graph *g);

struct ps_tolerance {
    double makespan, task, start; /* < 0 = not checked */
};
void ps_tolerance_init(struct ps_tolerance *t); /* makespan 0.2, task 0.5, start unchecked */
/* "makespan=0.2,task=0.5,start=0.1" (any subset, overriding). 0 or -EINVAL with diag. */
int ps_tolerance_parse(const char *s, struct ps_tolerance *t, struct ps_diag *diag);
/* Number of limits exceeded (dependency violations count as one); one line per excess is
 * written into why (may be NULL). */
int ps_compare_check(const struct ps_compare *c, const struct ps_tolerance *t, char *why,
                     size_t len);

/* ---- calibration ---------------------------------------------------------------------- */

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

/* Solves the n x n symmetric positive semi-definite system A x = b in place by Cholesky after
 * scaling to unit diagonal; pivots below tol (relative) mark a column dependent on earlier ones:
 * its x is 0 and used[k] false. Returns the rank. A is row-major, overwritten. */
int ps_cholesky_solve(double *A, double *b, int n, double tol, double *x, bool *used);

#endif
