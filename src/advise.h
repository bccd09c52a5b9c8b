/* advise: the result of `pipescope advise` (the search itself is src/study/advise.c) and what
 * follows from it alone: the Pareto front, the recommendation, and the closed form of the
 * BatchNorm running-variance drift each (chunks, checkpoint, policy) setting implies.
 *
 * A configuration is (schedule, virtual stages, chunks, checkpoint) with the exact min-max time
 * balance of its stages (sim/balance.h) under the memory cap; a point is a configuration with a
 * BN policy. Three objectives: throughput (samples/s, higher is better), peak memory per device
 * (simulated activations + 8 bytes per parameter for weights and gradients, lower is better)
 * and predicted BN drift (lower is better; NaN = not predicted, then it is left out of the
 * comparison).
 *
 * Invariants of a filled struct ps_advise:
 *   A1. every point with on_front set is feasible, and no feasible point dominates it
 *       (ps_advise_dominates); of points with equal objectives only the first is on the front;
 *   A2. a configuration is `pruned` only when, for every policy, an evaluated feasible point
 *       dominates or equals its optimistic corner (throughput upper bound, memory lower bound,
 *       its exact predicted drift), so pruning never removes a front point's objectives;
 *   A3. `recommended` is a front point (or -1 when nothing is feasible).
 */
#ifndef PS_ADVISE_H
#define PS_ADVISE_H

#include <stdbool.h>
#include <stdint.h>

#include "src/spec.h"
#include "src/variant.h"

enum ps_advise_objective { PS_ADVISE_THROUGHPUT, PS_ADVISE_BALANCED };

/* drift at or below this is "no drift worth a change of plan" for --objective balanced */
#define PS_ADVISE_DRIFT_OK 0.01

enum ps_advise_status {
    PS_ADV_FEASIBLE,       /* simulated, fits the cap */
    PS_ADV_OVER_CAP,       /* simulated, no balance tried fits the cap (not proven impossible) */
    PS_ADV_NO_BALANCE,     /* proven: no balance fits even with one micro-batch in flight */
    PS_ADV_PRUNED,         /* bounds prove it dominated (A2) */
    PS_ADV_SKIPPED,        /* cannot run: schedule's constraints, BN one value per channel */
};

struct ps_advise_point {
    int schedule;          /* enum ps_schedule */
    int virtual_stages;    /* model chunks per device the variant asks for (1 unless the row reads it) */
    int stages, devices;
    int chunks, m;
    enum ps_checkpoint checkpoint;
    enum ps_bn_policy policy;
    enum ps_advise_status status;
    bool balance_exact;    /* the balance is the exact min-max under the cap (else rebalanced by
                              a conservative memory model, not proven optimal) */
    int *balance;          /* stages entries; NULL unless simulated */
    double makespan_us, throughput;
    int64_t peak_bytes;
    double drift;          /* predicted var_err, NaN when not predicted */
    double drift_measured; /* with --train at the best candidates, NaN otherwise */
    double bound_throughput; /* optimistic bounds used for pruning */
    int64_t bound_peak;
    bool on_front;
    char why[160];         /* skipped / over-cap reason */
};

struct ps_advise {
    const struct ps_spec *spec;     /* not owned */
    int devices;
    double memory_cap;              /* bytes, 0 = none */
    bool cap_auto;                  /* the cap is the spec's own peak */
    enum ps_advise_objective objective;
    bool drift_predicted;
    char drift_note[200];           /* why not predicted, or the assumption */
    int train_steps;                /* --train N (0 = none) */
    /* the spec as written */
    double spec_throughput, spec_makespan_us, spec_drift;
    int64_t spec_peak;
    int n_points;
    struct ps_advise_point *points;
    int n_configs, n_simulated, n_pruned, n_skipped, n_rebalanced;
    bool exhaustive;                /* every configuration was decided by simulation or bound */
    int recommended;                /* index into points, -1 = none */
    double search_s;                /* wall time of the search */
};

/* a dominates b: no worse in every objective, better in one (drift compared when both are
 * predicted). */
bool ps_advise_dominates(const struct ps_advise_point *a, const struct ps_advise_point *b);
/* Marks on_front (A1); returns the number of front points. */
int ps_advise_front(struct ps_advise *a);
/* The recommendation (A3): throughput = the fastest front point (ties: less memory, less drift,
 * table order); balanced = the fastest front point with drift <= PS_ADVISE_DRIFT_OK, else the one
 * with the least drift. Sets a->recommended and returns it. */
int ps_advise_recommend(struct ps_advise *a);
/* "chunks 8, 1f1b, except_last, deferred BN: 2.1x the throughput of your spec, 61% of its
 * memory, BN drift 0.1%" */
void ps_advise_sentence(const struct ps_advise *a, const struct ps_advise_point *p, char *buf,
                        size_t len);
void ps_advise_finish(struct ps_advise *a); /* accepts a zeroed struct */

/* Closed form of the running-variance drift (SEMANTICS.md section 7, drift.h's var_err) of one
 * BN channel after T training steps from running variance r0 = 1, for a channel whose batch
 * variance is V (unbiased, n values per channel in the mini-batch), against the reference (one
 * update per step from the whole batch, momentum a):
 *   reference     r_ref = q^T + (1 - q^T) V,            q = 1 - a
 *   plain/grad-only, U updates per step of micro-batch variances (expected value V each):
 *                 r = q^(UT) + (1 - q^(UT)) V
 *   deferred      one pooled commit per step of the BIASED variance V (n-1)/n:
 *                 r = q^(UT) + (1 - q^(UT)) V (n-1)/n   (U = m / chunks when m < chunks)
 *   var_err = |r - r_ref| / r_ref
 * U is drift.h's expected count in training: plain m + checkpointed, grad-only m. */
double ps_advise_var_err(double V, double n, double a, int T, const struct ps_variant *v);
/* Running-stat updates per training step of v (the SEMANTICS.md section 7 table); deferred with
 * m < chunks gives the fraction m / chunks. */
double ps_advise_updates_per_step(const struct ps_variant *v);

#endif
