/* drift: how far BatchNorm running statistics move away from a non-pipelined run, and why
 * (SEMANTICS.md section 7), measured with the CPU executor.
 *
 * For every setting (chunks x policy x checkpoint) drift trains the spec with ps_exec_run and
 * compares it with ONE reference run: chunks 1, checkpoint never, plain BN (one update per step
 * from the whole mini-batch). Per BN layer it reports what was measured next to what the closed
 * forms of SEMANTICS.md predict:
 *
 *   updates        running-stat updates in the last step, and the count of the section 7 table
 *                  (plain m + checkpointed micro-batches, grad-only m, deferred 1 when m == chunks)
 *   order          the logged update sequence of the last step ("0f 1f 1r 0r", c = commit), and
 *                  whether sim/bnorder predicted exactly that sequence
 *   eff_momentum   1 - (1 - a)^U
 *   ema_residual   the EMA closed form r_T = (1-a)^T r_0 + sum_t a (1-a)^(T-t) u_t recomputed
 *                  from r_0 and every logged u_t (with its own factor), against the measured
 *                  running statistics: max over channels of |replay - measured| / max(1, |measured|)
 *   mean_err       |rm - rm_ref| / sqrt(rv_ref) per channel (in units of the reference channel's
 *                  standard deviation, as running means near 0 make a plain relative error blow up)
 *   var_err        |rv - rv_ref| / rv_ref per channel; both as max and mean over channels
 *   spread         std over micro-batches of the per-channel means (and UNBIASED variances) that
 *                  normalised the last step, averaged over channels. Normalisation statistics do
 *                  not depend on the policy or the checkpoint mode (exec E1-E3), so a deferred
 *                  run takes them from a plain or grad-only run at the same chunks (or a probe run)
 *   var_gap        what averaging micro-batch variances loses, relative to the full-batch variance
 *                  V of the last step, averaged over channels. measured: (V_ref - mean_i v_i)/V_ref
 *                  with V_ref from the reference run. predicted from the micro-batch statistics
 *                  alone: V_pool - mean_i v_i, where (N-1) V_pool = sum_i (n_i-1) v_i
 *                  + sum_i n_i (mu_i - mu)^2 -- the between-micro-batch variance of the means. The
 *                  two agree to float rounding while the setting and the reference feed the same
 *                  input to the layer: the first BN layer in the first step (or with lr 0). A
 *                  later BN layer sees inputs normalised with micro-batch statistics, which differ
 *                  from the reference's, and later steps see different weights.
 *   deferred_var_err  (deferred only) the predicted var_err of committing BIASED pooled statistics
 *                  where the reference commits UNBIASED ones: the reference's EMA replayed with
 *                  u_t (n-1)/n. Exact under the same proviso as var_gap (so for the first BN layer
 *                  with steps 1 or lr 0 it equals the measured var_err to float rounding).
 *
 * Train mode (convergence): every run keeps its loss curve, and with eval_rows > 0 the last
 * eval_rows samples of the data are held out of training (ps_exec_opts.train_samples) and
 * classified in eval mode (ps_exec_eval, running statistics) for an accuracy.
 *
 * Forward-only mode (BN adaptation, issue [bn-adaptation]): every run, the reference included,
 * makes `steps` train-mode forward passes and nothing else (ps_exec_opts.forward_only: no
 * recompute, no backward, no SGD step), as a user adapting BatchNorm statistics to new data does.
 * The expected counts are then those of ps_bn_forward_updates and ps_bn_adaptation says in words
 * which settings adapt their running statistics and which do not.
 *
 * Runs are deterministic: the same seed gives every run the same initial weights and the same
 * data order, so settings differ only in what the pipeline does.
 */
#ifndef PS_DRIFT_H
#define PS_DRIFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/model.h"
#include "src/spec.h"
#include "src/variant.h"


struct ps_drift_setting {
    int chunks;
    enum ps_checkpoint checkpoint;
    enum ps_bn_policy policy;
};

struct ps_drift_opts {
    int n_chunks;
    const int *chunks;                  /* NULL = {spec chunks} */
    int n_policies;
    const enum ps_bn_policy *policies;  /* NULL = {spec policy} */
    int n_checkpoints;
    const enum ps_checkpoint *checkpoints; /* NULL = {spec checkpoint} */
    int steps;                          /* 0 = spec->steps */
    bool train;                         /* convergence mode: loss curves, evaluation */
    int64_t eval_rows;                  /* held-out tail (train mode), 0 = none */
    bool forward_only;                  /* forward passes only (BN adaptation); not with train */
    /* called before every run (k of n; k counts from 1); s NULL for the reference */
    void (*progress)(void *ctx, int k, int n, const struct ps_drift_setting *s, const char *what);
    void *progress_ctx;
};

struct ps_drift_layer {
    int layer;
    int64_t channels;
    int updates, expected_updates;      /* in the last step; expected -1 = no closed form */
    char *order;                        /* last step, "0f 1f 1r 0r" */
    bool order_as_simulated;
    double momentum, eff_momentum;      /* a of the last update, 1-(1-a)^U */
    double ema_residual_mean, ema_residual_var;
    double mean_err_max, mean_err_mean, var_err_max, var_err_mean;
    double mean_spread, var_spread;
    double var_gap_measured, var_gap_predicted;
    double deferred_var_err;            /* NaN unless deferred */
    float *running_mean, *running_var;  /* final, channels each */
};

struct ps_drift_run {
    struct ps_drift_setting s;
    bool reference;
    int m;                              /* real micro-batches */
    int steps;
    double *loss;                       /* per step */
    double final_loss;                  /* mean of the last min(10, steps) losses */
    double accuracy;                    /* eval mode on the held-out rows, NaN without */
    double us_per_step;                 /* mean wall time per step */
    int n_layers;                       /* BN layers */
    struct ps_drift_layer *layers;
    bool adapts;                        /* forward-only runs: ps_bn_adaptation's verdict */
    char *adaptation;                   /* and its words; NULL otherwise (and for the reference) */
};

/* A setting that cannot run, and why: BatchNorm would see one value per channel in the smallest
 * micro-batch (PyTorch refuses to train that), or chunks exceed the batch. The other settings
 * still run (a sweep never fails as a whole for one impossible setting). */
struct ps_drift_skip {
    struct ps_drift_setting s;
    char reason[192];
};

struct ps_drift {
    const struct ps_spec *spec;         /* not owned */
    bool train;
    bool forward_only;
    int steps;
    int64_t train_rows, eval_rows;      /* train mode */
    struct ps_drift_run reference;
    int n_runs;                         /* chunks-major, then policy, then checkpoint */
    struct ps_drift_run *runs;
    int n_skipped;                      /* in the same order */
    struct ps_drift_skip *skipped;
};

/* Whether `chunks` can be trained: 0, or -EINVAL with the reason in why (chunks outside
 * 1..batch, or a BatchNorm layer that would see a single value per channel in the smallest
 * micro-batch: smallest micro-batch x H x W == 1 at its input). */
int ps_drift_check_chunks(const struct ps_spec *spec, const struct ps_model *model, int chunks,
                          char *why, size_t len);

void ps_drift_finish(struct ps_drift *dr); /* accepts a zeroed struct */

/* BN adaptation: running-statistics updates ONE forward-only train-mode pass of variant v makes
 * in each BN layer (SEMANTICS.md section 7 without the backward; m = v->mb_count real
 * micro-batches):
 *   plain      m    (every train-mode forward, with grad or without)
 *   grad-only  m - checkpointed micro-batches (ps_variant_checkpoint_stop, at most m): a
 *              checkpointed forward runs without grad and fairscale's patch_batchnorm skips it;
 *              its update would come in the recompute of a backward
 *   deferred   1 when m == chunks (the pooled statistics of all m, committed at the forward of
 *              micro-batch chunks-1: torchgpipe's DeferredBatchNorm tracks every forward that is
 *              not a recompute); -1 (no per-pass count) when m < chunks, where commits happen
 *              once chunks micro-batches were tracked, across passes. */
int ps_bn_forward_updates(const struct ps_variant *v);
/* The same in words, with the fix when a forward-only pass does not adapt the statistics from
 * every micro-batch (plain BN for the adaptation passes, or no checkpointing for them, with grad
 * enabled: under torch.no_grad() fairscale's patched BN never updates, checkpointed or not).
 * Forward-only passes here run with grad enabled, as a training forward. Returns true when it
 * does adapt from every micro-batch. */
bool ps_bn_adaptation(const struct ps_variant *v, char *buf, size_t len);

/* Averages over the BN layers of a run (NaN when it has none): "var_err", "mean_err",
 * "var_spread", "mean_spread", "var_gap". */
double ps_drift_metric(const struct ps_drift_run *r, const char *metric);

#endif
