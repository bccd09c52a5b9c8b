/* compare: a measured timeline against a simulated one.
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
 *                    the two traces (pairs counted by merge sort, per stream); the same per
 *                    measured lane (the real CUDA stream of a GPU-attributed task)
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
 * The calibration of the cost model to a measured trace is sim/calibrate.h.
 */
#ifndef PS_COMPARE_H
#define PS_COMPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* A measured lane: the real CUDA stream a task's kernels ran on (trace_read.h), when the
 * measurement has them; inversions counted there as on graph streams. */
struct ps_compare_lane {
    int32_t device;
    int64_t stream;
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
    uint32_t n_lanes;                 /* measured CUDA streams (0 without GPU attribution) */
    struct ps_compare_lane *lanes;
    uint64_t lane_inversions, lane_pairs;
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

/* The first record of each node of g in t (UINT32_MAX when none; finite start and duration
 * only), malloc'ed; NULL when out of memory. */
uint32_t *ps_compare_record_index(const struct ps_graph *g, const struct ps_trace *t);

#endif
