/* drift: the results of a BatchNorm drift sweep (drift.h) and what follows from a variant alone:
 * how many running-statistics updates a forward-only pass makes and whether it adapts BN
 * (SEMANTICS.md section 7), which chunks can train at all, and the metrics averaged over a
 * run's BN layers. The sweep itself runs the executor and lives in the study layer
 * (src/study/drift.c); its JSON and plots are viz/drift.c.
 */
#include "src/drift.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* checkpointed micro-batches among the real m */
static int stop_of(const struct ps_variant *v)
{
    int stop = ps_variant_checkpoint_stop(v);
    return stop > v->mb_count ? v->mb_count : stop;
}

int ps_bn_forward_updates(const struct ps_variant *v)
{
    int m = v->mb_count;
    switch (v->batchnorm) {
    case PS_BN_PLAIN: return m;
    case PS_BN_GRAD_ONLY: return m - stop_of(v);
    case PS_BN_DEFERRED: return m == v->chunks ? 1 : -1;
    }
    return -1;
}

bool ps_bn_adaptation(const struct ps_variant *v, char *buf, size_t len)
{
    static const char fix[] = "fix: plain BN for the adaptation passes, or run them with "
                              "checkpointing disabled and grad enabled";
    int m = v->mb_count, chunks = v->chunks, stop = stop_of(v);
    switch (v->batchnorm) {
    case PS_BN_PLAIN:
        snprintf(buf, len, "adapts: %d update%s per pass, one per micro-batch forward "
                 "(plain BN updates in every train-mode forward, checkpointed or not)",
                 m, m == 1 ? "" : "s");
        return true;
    case PS_BN_DEFERRED:
        if (m == chunks)
            snprintf(buf, len, "adapts: 1 commit per pass, the pooled statistics of %s%d "
                     "micro-batch%s (torchgpipe's DeferredBatchNorm tracks every forward that is "
                     "not a recompute, so it needs no backward)", m == 1 ? "its " : "all ", m,
                     m == 1 ? "" : "es");
        else
            snprintf(buf, len, "adapts across passes: the %d micro-batch%s of a pass are "
                     "tracked, and the pooled statistics are committed each time %d were "
                     "tracked (chunks), not once per pass", m, m == 1 ? "" : "es", chunks);
        return true;
    case PS_BN_GRAD_ONLY:
        if (stop == 0) {
            snprintf(buf, len, "adapts: %d update%s per pass (nothing is checkpointed, every "
                     "forward runs with grad)", m, m == 1 ? "" : "s");
            return true;
        }
        if (stop >= m)
            snprintf(buf, len, "does NOT adapt: 0 updates per pass; every micro-batch is "
                     "checkpointed, so its forward runs without grad and fairscale's "
                     "patch_batchnorm skips the update (it happens only in a backward's "
                     "recompute); %s", fix);
        else
            snprintf(buf, len, "adapts only from %d of %d micro-batches: %d update%s per pass "
                     "(the checkpointed ones run without grad and are skipped); %s", m - stop, m,
                     m - stop, m - stop == 1 ? "" : "s", fix);
        return false;
    }
    snprintf(buf, len, "unknown policy");
    return false;
}

static void run_finish(struct ps_drift_run *r)
{
    free(r->loss);
    free(r->adaptation);
    for (int k = 0; r->layers && k < r->n_layers; k++) {
        free(r->layers[k].order);
        free(r->layers[k].running_mean);
        free(r->layers[k].running_var);
    }
    free(r->layers);
    memset(r, 0, sizeof(*r));
}

void ps_drift_finish(struct ps_drift *dr)
{
    if (!dr) return;
    run_finish(&dr->reference);
    for (int k = 0; dr->runs && k < dr->n_runs; k++) run_finish(&dr->runs[k]);
    free(dr->runs);
    free(dr->skipped);
    memset(dr, 0, sizeof(*dr));
}

int ps_drift_check_chunks(const struct ps_spec *spec, const struct ps_model *model, int chunks,
                          char *why, size_t len)
{
    int64_t n = spec->batch;
    if (chunks < 1 || chunks > n) {
        snprintf(why, len, "chunks %d: a batch of %lld samples allows chunks 1..%lld", chunks,
                 (long long)n, (long long)n);
        return -EINVAL;
    }
    /* torch.chunk: micro-batches of ceil(N/chunks), the last holds the rest */
    int64_t size = ps_microbatch_len(n, chunks), m = ps_microbatch_count(n, chunks);
    int64_t last = n - size * (m - 1);
    for (int l = 0; l < spec->n_layers && model && l < model->n_layers; l++) {
        if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
        const struct ps_layer_info *li = &model->layers[l];
        int64_t spatial = li->n_in_dims == 3 ? li->in[1] * li->in[2] : 1;
        if (last * spatial == 1) {
            snprintf(why, len,
                     "chunks %d: micro-batch %lld holds 1 sample, so batchnorm layer %d sees one "
                     "value per channel (PyTorch refuses to train it)",
                     chunks, (long long)(m - 1), l);
            return -EINVAL;
        }
    }
    return 0;
}

double ps_drift_metric(const struct ps_drift_run *r, const char *metric)
{
    if (!r->n_layers) return NAN;
    double s = 0;
    for (int k = 0; k < r->n_layers; k++) {
        const struct ps_drift_layer *l = &r->layers[k];
        if (!strcmp(metric, "var_err")) s += l->var_err_mean;
        else if (!strcmp(metric, "mean_err")) s += l->mean_err_mean;
        else if (!strcmp(metric, "var_spread")) s += l->var_spread;
        else if (!strcmp(metric, "mean_spread")) s += l->mean_spread;
        else if (!strcmp(metric, "var_gap")) s += l->var_gap_measured;
        else return NAN;
    }
    return s / r->n_layers;
}
