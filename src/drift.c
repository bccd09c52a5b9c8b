/* drift: BatchNorm running-statistics drift per setting against a full-batch reference, measured
 * with the CPU executor and set next to the closed forms of SEMANTICS.md section 7 (drift.h).
 *
 * One run = a variant of the spec (variant.h) with (chunks, checkpoint, batchnorm) set -> graph ->
 * engine order -> ps_exec_run. Runs are grouped by chunks: the normalisation statistics of a group are the same
 * for every policy and checkpoint mode, and a group whose runs log none (deferred only) gets one
 * extra probe run (plain, never) to read them from. Everything a run needs for its report is
 * computed while its group is alive; the executor results are freed with the group.
 *
 * Invariants:
 *   D1. The spec is never written: every setting is a variant of it.
 *   D2. Every number comes from the executor's update log or final state; nothing is simulated
 *       except the expected update order (sim/bnorder), which is compared, never substituted.
 *   D3. Forward-only runs (BN adaptation) change nothing but the executor option and what is
 *       expected: the section 7 counts without the backward, and sim/bnorder's order over the
 *       forward part of the engine order only.
 */
#include "src/drift.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sim/bnorder.h"
#include "src/data.h"
#include "src/engine.h"
#include "src/schedule.h"
#include "kernels/exec.h"
#include "src/graph.h"
#include "viz/viz.h"

struct raw {
    struct ps_drift_setting s;
    struct ps_variant v;
    int m;
    struct ps_exec_result res;
    struct ps_bn_order bo;
    bool ok;
};

static void raw_finish(struct raw *r)
{
    ps_exec_result_finish(&r->res);
    ps_bn_order_finish(&r->bo);
    memset(r, 0, sizeof(*r));
}

static int run_one(const struct ps_spec *spec, const struct ps_model *model,
                   const struct ps_drift_setting *s, int steps, int64_t train_samples,
                   bool forward_only, struct raw *out, struct ps_diag *d)
{
    memset(out, 0, sizeof(*out));
    out->s = *s;
    struct ps_variant *v = &out->v;
    ps_variant_from_spec(spec, v);
    int rc = ps_variant_set_chunks(v, spec, s->chunks, d);
    if (rc) return rc;
    v->checkpoint = s->checkpoint;
    v->batchnorm = s->policy;
    out->m = v->mb_count;
    struct ps_graph *g = NULL;
    struct ps_order ord;
    memset(&ord, 0, sizeof(ord));
    rc = ps_schedule_build(spec, model, v, &g, d);
    if (!rc) rc = ps_schedule_order(g, &ord, d);
    struct ps_order fwd = ord; /* D3: the forward entries come first */
    if (forward_only) fwd.n = ord.n_fwd;
    if (!rc && ps_bn_order_build(g, &fwd, NULL, s->policy, &out->bo))
        rc = ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    if (!rc) {
        struct ps_exec_opts eo;
        ps_exec_opts_init(&eo);
        eo.trace = false;
        eo.steps = steps;
        eo.train_samples = train_samples;
        eo.forward_only = forward_only;
        rc = ps_exec_run(g, &ord, &eo, &out->res, d);
    }
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    if (rc) {
        char tag[96];
        snprintf(tag, sizeof(tag), " (chunks %d, %s, checkpoint %s)", s->chunks,
                 ps_bn_policy_name(s->policy), ps_checkpoint_name(s->checkpoint));
        size_t len = strnlen(d->where, sizeof(d->where));
        if (len + strlen(tag) < sizeof(d->where)) memcpy(d->where + len, tag, strlen(tag) + 1);
        raw_finish(out);
        return rc;
    }
    out->ok = true;
    return 0;
}

/* ---- statistics from the update log ---------------------------------------------------------- */

/* The statistics that normalised micro-batch i at layer l in `step`: the first logged non-commit
 * update of that micro-batch (forward or recompute: the same numbers, exec E3). */
static bool mb_stats(const struct ps_exec_result *res, int l, int step, int m,
                     const struct ps_exec_bn_update **out)
{
    for (int i = 0; i < m; i++) out[i] = NULL;
    for (uint32_t k = 0; k < res->n_bn; k++) {
        const struct ps_exec_bn_update *u = &res->bn[k];
        if (u->layer != l || u->step != step || u->phase == PS_EXEC_BN_COMMIT) continue;
        if (u->mb >= 0 && u->mb < m && !out[u->mb]) out[u->mb] = u;
    }
    for (int i = 0; i < m; i++)
        if (!out[i]) return false;
    return true;
}

static bool has_mb_stats(const struct raw *r, int l)
{
    const struct ps_exec_bn_update *tmp[4096];
    if (r->m > 4096) return false;
    return mb_stats(&r->res, l, r->res.steps - 1, r->m, tmp);
}

static const struct ps_exec_bn_update *last_update(const struct ps_exec_result *res, int l,
                                                   int step)
{
    const struct ps_exec_bn_update *last = NULL;
    for (uint32_t k = 0; k < res->n_bn; k++)
        if (res->bn[k].layer == l && res->bn[k].step == step) last = &res->bn[k];
    return last;
}

static int expected_updates(const struct ps_variant *v, bool forward_only)
{
    if (forward_only) return ps_bn_forward_updates(v);
    int m = v->mb_count, stop = ps_variant_checkpoint_stop(v);
    if (stop > m) stop = m;
    switch (v->batchnorm) {
    case PS_BN_PLAIN: return m + stop;
    case PS_BN_GRAD_ONLY: return m;
    case PS_BN_DEFERRED: return m == v->chunks ? 1 : -1;
    }
    return -1;
}

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

static char *order_string(const struct ps_exec_result *res, int l, int step)
{
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (uint32_t k = 0; k < res->n_bn; k++) {
        const struct ps_exec_bn_update *u = &res->bn[k];
        if (u->layer != l || u->step != step) continue;
        char item[24];
        int n = snprintf(item, sizeof(item), "%s%d%c", len ? " " : "", u->mb, "frc"[u->phase]);
        if (len + (size_t)n + 1 > cap) {
            cap = 2 * (len + (size_t)n + 1);
            char *t = realloc(s, cap);
            if (!t) {
                free(s);
                return NULL;
            }
            s = t;
        }
        memcpy(s + len, item, (size_t)n + 1);
        len += (size_t)n;
    }
    return s;
}

static bool order_matches(const struct raw *r, int l, int step)
{
    const struct ps_bn_layer_updates *lu = NULL;
    for (int k = 0; k < r->bo.n_layers; k++)
        if (r->bo.layers[k].layer == l) lu = &r->bo.layers[k];
    if (!lu) return false;
    uint32_t j = 0;
    for (uint32_t k = 0; k < r->res.n_bn; k++) {
        const struct ps_exec_bn_update *u = &r->res.bn[k];
        if (u->layer != l || u->step != step) continue;
        if (j >= lu->n) return false;
        const struct ps_bn_update *e = &lu->u[j++];
        bool commit = u->phase == PS_EXEC_BN_COMMIT;
        if (e->mb != u->mb || e->pooled != commit) return false;
        if (!commit && (e->phase == PS_BN_RECOMPUTE) != (u->phase == PS_EXEC_BN_RECOMPUTE))
            return false;
    }
    return j == lu->n;
}

/* max over channels of |EMA replay of every logged update - measured| / max(1, |measured|) */
static void ema_residual(const struct ps_exec_result *res, int l, const float *rm0,
                         const float *rv0, const float *rm, const float *rv, int64_t C,
                         double *rmean, double *rvar)
{
    *rmean = *rvar = 0.0;
    for (int64_t c = 0; c < C; c++) {
        double m = rm0[c], v = rv0[c];
        for (uint32_t k = 0; k < res->n_bn; k++) {
            const struct ps_exec_bn_update *u = &res->bn[k];
            if (u->layer != l) continue;
            m = (1.0 - u->factor) * m + u->factor * (double)u->mean[c];
            v = (1.0 - u->factor) * v + u->factor * (double)u->var[c];
        }
        double em = fabs(m - rm[c]) / fmax(1.0, fabs((double)rm[c]));
        double ev = fabs(v - rv[c]) / fmax(1.0, fabs((double)rv[c]));
        if (em > *rmean) *rmean = em;
        if (ev > *rvar) *rvar = ev;
    }
}

static int analyse_layer(const struct raw *r, const struct raw *src, const struct raw *ref,
                         const struct ps_state *st0, int l, struct ps_drift_layer *out,
                         bool is_ref, bool forward_only)
{
    const struct ps_layer_state *ls = &r->res.state.layers[l];
    const struct ps_layer_state *lr = &ref->res.state.layers[l];
    int64_t C = ls->channels;
    int last = r->res.steps - 1;
    memset(out, 0, sizeof(*out));
    out->layer = l;
    out->channels = C;
    out->running_mean = malloc((size_t)C * sizeof(float));
    out->running_var = malloc((size_t)C * sizeof(float));
    out->order = order_string(&r->res, l, last);
    if (!out->running_mean || !out->running_var || !out->order) return -ENOMEM;
    memcpy(out->running_mean, ls->running_mean, (size_t)C * sizeof(float));
    memcpy(out->running_var, ls->running_var, (size_t)C * sizeof(float));
    for (uint32_t k = 0; k < r->res.n_bn; k++)
        out->updates += r->res.bn[k].layer == l && r->res.bn[k].step == last;
    out->expected_updates = is_ref ? 1 : expected_updates(&r->v, forward_only);
    out->order_as_simulated = order_matches(r, l, last);
    const struct ps_exec_bn_update *lu = last_update(&r->res, l, last);
    out->momentum = lu ? lu->factor : NAN;
    out->eff_momentum = lu ? 1.0 - pow(1.0 - lu->factor, out->updates) : 0.0;
    ema_residual(&r->res, l, st0->layers[l].running_mean, st0->layers[l].running_var,
                 ls->running_mean, ls->running_var, C, &out->ema_residual_mean,
                 &out->ema_residual_var);

    /* error against the reference */
    double sm = 0, sv = 0;
    out->mean_err_max = out->var_err_max = 0.0;
    for (int64_t c = 0; c < C; c++) {
        double sd = sqrt(fmax((double)lr->running_var[c], 1e-30));
        double em = fabs((double)ls->running_mean[c] - lr->running_mean[c]) / sd;
        double ev = fabs((double)ls->running_var[c] - lr->running_var[c]) /
                    fmax((double)lr->running_var[c], 1e-30);
        sm += em;
        sv += ev;
        out->mean_err_max = fmax(out->mean_err_max, em);
        out->var_err_max = fmax(out->var_err_max, ev);
    }
    out->mean_err_mean = sm / (double)C;
    out->var_err_mean = sv / (double)C;

    /* micro-batch statistics of the last step: spread and the variance gap */
    out->mean_spread = out->var_spread = NAN;
    out->var_gap_measured = out->var_gap_predicted = NAN;
    const struct ps_exec_bn_update *mb[4096];
    const struct ps_exec_bn_update *ru = last_update(&ref->res, l, ref->res.steps - 1);
    int m = src ? src->m : 0;
    if (src && m <= 4096 && mb_stats(&src->res, l, src->res.steps - 1, m, mb) && ru) {
        double asm_ = 0, asv = 0, agm = 0, agp = 0;
        for (int64_t c = 0; c < C; c++) {
            double N = 0, mu = 0, mm = 0, vv = 0;
            for (int i = 0; i < m; i++) {
                N += (double)mb[i]->count;
                mu += (double)mb[i]->count * mb[i]->mean[c];
                mm += mb[i]->mean[c];
                vv += mb[i]->var[c];
            }
            mu /= N;
            mm /= m;
            vv /= m;
            double dm = 0, dv = 0, within = 0, between = 0;
            for (int i = 0; i < m; i++) {
                dm += (mb[i]->mean[c] - mm) * (mb[i]->mean[c] - mm);
                dv += (mb[i]->var[c] - vv) * (mb[i]->var[c] - vv);
                within += (double)(mb[i]->count - 1) * mb[i]->var[c];
                between += (double)mb[i]->count * (mb[i]->mean[c] - mu) * (mb[i]->mean[c] - mu);
            }
            asm_ += sqrt(dm / m);
            asv += sqrt(dv / m);
            double vpool = (within + between) / (N - 1);
            double vref = fmax((double)ru->var[c], 1e-30);
            agm += ((double)ru->var[c] - vv) / vref;
            agp += (vpool - vv) / vref;
        }
        out->mean_spread = asm_ / (double)C;
        out->var_spread = asv / (double)C;
        out->var_gap_measured = agm / (double)C;
        out->var_gap_predicted = agp / (double)C;
    }

    /* deferred: the reference replayed with biased statistics */
    out->deferred_var_err = NAN;
    if (!is_ref && r->s.policy == PS_BN_DEFERRED) {
        double acc = 0;
        for (int64_t c = 0; c < C; c++) {
            double v = st0->layers[l].running_var[c];
            for (uint32_t k = 0; k < ref->res.n_bn; k++) {
                const struct ps_exec_bn_update *u = &ref->res.bn[k];
                if (u->layer != l) continue;
                double n = (double)u->count;
                v = (1.0 - u->factor) * v + u->factor * (double)u->var[c] * (n - 1) / n;
            }
            acc += fabs(v - lr->running_var[c]) / fmax((double)lr->running_var[c], 1e-30);
        }
        out->deferred_var_err = acc / (double)C;
    }
    return 0;
}

/* ---- evaluation --------------------------------------------------------------------------- */

struct evalset {
    const float *x;
    const int64_t *labels;
    int64_t n;
};

static double accuracy(const struct ps_spec *spec, const struct ps_model *model,
                       const struct ps_state *st, const struct evalset *ev, struct ps_diag *d,
                       int *rc)
{
    if (!ev || ev->n <= 0 || !ev->labels) return NAN;
    int64_t K = model->out_numel;
    float *out = malloc((size_t)(ev->n * K) * sizeof(float));
    if (!out) {
        *rc = ps_diag_set(d, -ENOMEM, "drift", "out of memory");
        return NAN;
    }
    *rc = ps_exec_eval(spec, model, st, ev->x, ev->n, out, d);
    int64_t good = 0;
    for (int64_t s = 0; s < ev->n && !*rc; s++) {
        int64_t best = 0;
        for (int64_t k = 1; k < K; k++)
            if (out[s * K + k] > out[s * K + best]) best = k;
        good += best == ev->labels[s];
    }
    free(out);
    return *rc ? NAN : (double)good / (double)ev->n;
}

/* ---- the run -------------------------------------------------------------------------------- */

static int fill_run(const struct ps_spec *spec, const struct ps_model *model, const struct raw *r,
                    const struct raw *src, const struct raw *ref, const struct ps_state *st0,
                    const struct evalset *ev, bool is_ref, bool forward_only,
                    struct ps_drift_run *out, struct ps_diag *d)
{
    memset(out, 0, sizeof(*out));
    out->s = r->s;
    out->reference = is_ref;
    out->m = r->m;
    out->steps = r->res.steps;
    out->loss = malloc((size_t)r->res.steps * sizeof(double));
    if (!out->loss) return ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    memcpy(out->loss, r->res.loss, (size_t)r->res.steps * sizeof(double));
    int tail = r->res.steps < 10 ? r->res.steps : 10;
    double fl = 0, us = 0;
    for (int k = r->res.steps - tail; k < r->res.steps; k++) fl += r->res.loss[k];
    for (int k = 0; k < r->res.steps; k++) us += r->res.step_us[k];
    out->final_loss = fl / tail;
    out->us_per_step = us / r->res.steps;
    if (forward_only && !is_ref) {
        char w[512];
        out->adapts = ps_bn_adaptation(&r->v, w, sizeof(w));
        if (!(out->adaptation = strdup(w)))
            return ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    }
    int rc = 0;
    out->accuracy = accuracy(spec, model, &r->res.state, ev, d, &rc);
    if (rc) return rc;
    for (int l = 0; l < spec->n_layers; l++) out->n_layers += spec->layers[l].op == PS_OP_BATCHNORM;
    out->layers = calloc((size_t)(out->n_layers ? out->n_layers : 1), sizeof(*out->layers));
    if (!out->layers) return ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    int k = 0;
    for (int l = 0; l < spec->n_layers; l++) {
        if (spec->layers[l].op != PS_OP_BATCHNORM) continue;
        if (analyse_layer(r, src, ref, st0, l, &out->layers[k++], is_ref, forward_only))
            return ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    }
    return 0;
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
    int64_t size = (n + chunks - 1) / chunks, m = (n + size - 1) / size;
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

static void progress(const struct ps_drift_opts *o, int k, int n, const struct ps_drift_setting *s,
                     const char *what)
{
    if (o->progress) o->progress(o->progress_ctx, k, n, s, what);
}

int ps_drift_run(const struct ps_spec *spec, const struct ps_model *model, const struct ps_drift_opts *o,
                 struct ps_drift *out, struct ps_diag *d)
{
    memset(out, 0, sizeof(*out));
    out->spec = spec;
    out->train = o->train;
    out->forward_only = o->forward_only;
    if (o->train && o->forward_only)
        return ps_diag_set(d, -EINVAL, "drift", "forward-only passes do not train: not with train");
    int n_ch = o->chunks ? o->n_chunks : 1, n_po = o->policies ? o->n_policies : 1;
    int n_ck = o->checkpoints ? o->n_checkpoints : 1;
    if (n_ch < 1 || n_po < 1 || n_ck < 1)
        return ps_diag_set(d, -EINVAL, "drift", "nothing to run: empty chunks/policy list");
    const int saved_chunks = spec->chunks;
    const enum ps_checkpoint saved_ckpt = spec->checkpoint;
    const enum ps_bn_policy saved_pol = spec->batchnorm;
    int steps = o->steps > 0 ? o->steps : spec->steps;
    out->steps = steps;

    struct ps_state st0;
    struct ps_data dt;
    struct raw ref, *group = NULL, probe;
    memset(&st0, 0, sizeof(st0));
    memset(&dt, 0, sizeof(dt));
    memset(&ref, 0, sizeof(ref));
    memset(&probe, 0, sizeof(probe));
    struct evalset ev = {0}, *evp = NULL;
    int64_t train_samples = 0;
    int rc = ps_state_init(&st0, spec, model, spec->seed, d);
    if (!rc && o->train && o->eval_rows > 0) {
        rc = ps_data_load(spec, model, (int64_t)steps * spec->batch, &dt, d);
        if (!rc && (dt.target != PS_TARGET_LABELS || dt.n_samples - o->eval_rows < spec->batch))
            rc = ps_diag_set(d, -EINVAL, spec->path,
                             dt.target != PS_TARGET_LABELS
                                 ? "evaluation needs class labels (loss cross_entropy)"
                                 : "%lld samples leave fewer than one batch for training after "
                                   "holding out %lld",
                             (long long)dt.n_samples, (long long)o->eval_rows);
        if (!rc) {
            train_samples = dt.n_samples - o->eval_rows;
            ev.n = o->eval_rows;
            ev.x = dt.x + train_samples * dt.in_numel;
            ev.labels = dt.labels + train_samples;
            evp = &ev;
            out->train_rows = train_samples;
            out->eval_rows = o->eval_rows;
        }
    }
    int total = n_ch * n_po * n_ck + 1, done = 0;
    out->runs = calloc((size_t)(n_ch * n_po * n_ck), sizeof(*out->runs));
    out->skipped = calloc((size_t)(n_ch * n_po * n_ck), sizeof(*out->skipped));
    group = calloc((size_t)(n_po * n_ck), sizeof(*group));
    if (!rc && (!out->runs || !out->skipped || !group))
        rc = ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    /* settings that cannot run are listed, not run; the rest still run */
    char why[192];
    for (int ic = 0; ic < n_ch && !rc; ic++) {
        int c = o->chunks ? o->chunks[ic] : saved_chunks;
        if (!ps_drift_check_chunks(spec, model, c, why, sizeof(why))) continue;
        for (int ip = 0; ip < n_po; ip++)
            for (int ik = 0; ik < n_ck; ik++) {
                struct ps_drift_skip *sk = &out->skipped[out->n_skipped++];
                sk->s = (struct ps_drift_setting){
                    c, o->checkpoints ? o->checkpoints[ik] : saved_ckpt,
                    o->policies ? o->policies[ip] : saved_pol};
                snprintf(sk->reason, sizeof(sk->reason), "%s", why);
                total--;
            }
    }
    if (!rc && out->n_skipped == n_ch * n_po * n_ck)
        rc = ps_diag_set(d, -EINVAL, spec->path, "no drift setting can run: %s",
                         out->skipped[0].reason);

    struct ps_drift_setting rs = {1, PS_CKPT_NEVER, PS_BN_PLAIN};
    if (!rc) {
        progress(o, ++done, total, NULL, "reference");
        rc = run_one(spec, model, &rs, steps, train_samples, o->forward_only, &ref, d);
    }
    if (!rc)
        rc = fill_run(spec, model, &ref, &ref, &ref, &st0, evp, true, o->forward_only,
                      &out->reference, d);

    for (int ic = 0; ic < n_ch && !rc; ic++) {
        int ng = 0;
        if (ps_drift_check_chunks(spec, model, o->chunks ? o->chunks[ic] : saved_chunks, why,
                                  sizeof(why)))
            continue;
        for (int ip = 0; ip < n_po && !rc; ip++)
            for (int ik = 0; ik < n_ck && !rc; ik++) {
                struct ps_drift_setting s = {
                    o->chunks ? o->chunks[ic] : saved_chunks,
                    o->checkpoints ? o->checkpoints[ik] : saved_ckpt,
                    o->policies ? o->policies[ip] : saved_pol};
                progress(o, ++done, total, &s, "run");
                rc = run_one(spec, model, &s, steps, train_samples, o->forward_only, &group[ng++],
                             d);
            }
        /* the normalisation statistics of this chunks value */
        const struct raw *src = NULL;
        for (int k = 0; k < ng && !rc && !src; k++)
            if (group[k].ok && spec->n_layers > 0) {
                bool all = true;
                for (int l = 0; l < spec->n_layers; l++)
                    if (spec->layers[l].op == PS_OP_BATCHNORM) all &= has_mb_stats(&group[k], l);
                if (all) src = &group[k];
            }
        if (!rc && !src && ng > 0) {
            struct ps_drift_setting ps = {group[0].s.chunks, PS_CKPT_NEVER, PS_BN_PLAIN};
            progress(o, done, total, &ps, "probe");
            rc = run_one(spec, model, &ps, steps, train_samples, o->forward_only, &probe, d);
            src = &probe;
        }
        for (int k = 0; k < ng && !rc; k++) {
            rc = fill_run(spec, model, &group[k], src, &ref, &st0, evp, false, o->forward_only,
                          &out->runs[out->n_runs], d);
            out->n_runs++;
        }
        for (int k = 0; k < ng; k++) raw_finish(&group[k]);
        raw_finish(&probe);
    }

    raw_finish(&ref);
    free(group);
    ps_state_finish(&st0);
    ps_data_finish(&dt);
    if (rc) ps_drift_finish(out);
    return rc;
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

/* ---- JSON ------------------------------------------------------------------------------------ */

static cJSON *floats(const float *v, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t k = 0; a && k < n; k++) ps_json_add_number(a, NULL, (double)v[k]);
    return a;
}

static cJSON *run_json(const struct ps_drift_run *r, bool train)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (r->adaptation) {
        ps_json_add_bool(o, "adapts", r->adapts);
        ps_json_add_string(o, "adaptation", r->adaptation);
    }
    ps_json_add_bool(o, "reference", r->reference);
    ps_json_add_int(o, "chunks", r->s.chunks);
    ps_json_add_int(o, "micro_batches", r->m);
    ps_json_add_string(o, "policy", ps_bn_policy_name(r->s.policy));
    ps_json_add_string(o, "checkpoint", ps_checkpoint_name(r->s.checkpoint));
    ps_json_add_int(o, "steps", r->steps);
    ps_json_add_number(o, "final_loss", r->final_loss);
    ps_json_add_number(o, "accuracy", r->accuracy);
    ps_json_add_number(o, "us_per_step", r->us_per_step);
    if (train) {
        cJSON *loss = cJSON_AddArrayToObject(o, "loss");
        for (int k = 0; loss && k < r->steps; k++) ps_json_add_number(loss, NULL, r->loss[k]);
    }
    cJSON *ls = cJSON_AddArrayToObject(o, "layers");
    for (int k = 0; ls && k < r->n_layers; k++) {
        const struct ps_drift_layer *l = &r->layers[k];
        cJSON *lo = cJSON_CreateObject();
        if (!lo) break;
        cJSON_AddItemToArray(ls, lo);
        ps_json_add_int(lo, "layer", l->layer);
        ps_json_add_int(lo, "updates", l->updates);
        ps_json_add_int(lo, "expected_updates", l->expected_updates);
        ps_json_add_string(lo, "order", l->order);
        ps_json_add_bool(lo, "order_as_simulated", l->order_as_simulated);
        ps_json_add_number(lo, "momentum", l->momentum);
        ps_json_add_number(lo, "effective_momentum", l->eff_momentum);
        cJSON *e = cJSON_AddObjectToObject(lo, "ema_residual");
        if (e) {
            ps_json_add_number(e, "running_mean", l->ema_residual_mean);
            ps_json_add_number(e, "running_var", l->ema_residual_var);
        }
        cJSON *er = cJSON_AddObjectToObject(lo, "error");
        if (er) {
            ps_json_add_number(er, "mean_max", l->mean_err_max);
            ps_json_add_number(er, "mean_mean", l->mean_err_mean);
            ps_json_add_number(er, "var_max", l->var_err_max);
            ps_json_add_number(er, "var_mean", l->var_err_mean);
            ps_json_add_number(er, "var_mean_predicted_deferred", l->deferred_var_err);
        }
        cJSON *sp = cJSON_AddObjectToObject(lo, "spread");
        if (sp) {
            ps_json_add_number(sp, "mean", l->mean_spread);
            ps_json_add_number(sp, "var", l->var_spread);
        }
        cJSON *g = cJSON_AddObjectToObject(lo, "var_gap");
        if (g) {
            ps_json_add_number(g, "measured", l->var_gap_measured);
            ps_json_add_number(g, "predicted", l->var_gap_predicted);
        }
        cJSON_AddItemToObject(lo, "running_mean", floats(l->running_mean, l->channels));
        cJSON_AddItemToObject(lo, "running_var", floats(l->running_var, l->channels));
    }
    return o;
}

cJSON *ps_drift_json(const struct ps_drift *dr)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_int(o, "steps", dr->steps);
    ps_json_add_bool(o, "train", dr->train);
    if (dr->forward_only) ps_json_add_bool(o, "forward_only", true);
    if (dr->eval_rows) {
        ps_json_add_int(o, "train_rows", dr->train_rows);
        ps_json_add_int(o, "eval_rows", dr->eval_rows);
    }
    cJSON_AddItemToObject(o, "reference", run_json(&dr->reference, dr->train));
    cJSON *a = cJSON_AddArrayToObject(o, "runs");
    for (int k = 0; a && k < dr->n_runs; k++)
        cJSON_AddItemToArray(a, run_json(&dr->runs[k], dr->train));
    cJSON *sk = cJSON_AddArrayToObject(o, "skipped");
    for (int k = 0; sk && k < dr->n_skipped; k++) {
        const struct ps_drift_skip *x = &dr->skipped[k];
        cJSON *e = cJSON_CreateObject();
        if (!e) continue;
        ps_json_add_int(e, "chunks", x->s.chunks);
        cJSON_AddStringToObject(e, "policy", ps_bn_policy_name(x->s.policy));
        cJSON_AddStringToObject(e, "checkpoint", ps_checkpoint_name(x->s.checkpoint));
        cJSON_AddStringToObject(e, "reason", x->reason);
        cJSON_AddItemToArray(sk, e);
    }
    return o;
}

/* ---- plots -------------------------------------------------------------------------------- */

int ps_drift_plot(const struct ps_drift *dr, const char *metric, const char *path,
                  struct ps_diag *d)
{
    /* series = distinct (policy, checkpoint) in run order; x = distinct chunks */
    int ns = 0, nx = 0;
    struct ps_drift_setting keys[64];
    double xs[256];
    bool loss = !strcmp(metric, "loss");
    for (int k = 0; k < dr->n_runs; k++) {
        const struct ps_drift_setting *s = &dr->runs[k].s;
        int j = 0;
        while (j < ns && !(keys[j].policy == s->policy && keys[j].checkpoint == s->checkpoint &&
                           (!loss || keys[j].chunks == s->chunks)))
            j++;
        if (j == ns && ns < 64) keys[ns++] = *s;
        j = 0;
        while (j < nx && xs[j] != s->chunks) j++;
        if (j == nx && nx < 256) xs[nx++] = s->chunks;
    }
    bool several_ck = false;
    for (int j = 1; j < ns; j++) several_ck |= keys[j].checkpoint != keys[0].checkpoint;
    if (loss) {
        nx = dr->steps;
        ns += 1; /* + reference */
    }
    double *x = calloc((size_t)nx, sizeof(double));
    double *y = calloc((size_t)(nx * ns), sizeof(double));
    struct ps_plot_series *se = calloc((size_t)ns, sizeof(*se));
    char(*names)[96] = calloc((size_t)ns, sizeof(*names));
    int rc = 0;
    if (!x || !y || !se || !names) rc = ps_diag_set(d, -ENOMEM, "drift", "out of memory");
    for (int j = 0; !rc && j < ns; j++) {
        se[j].name = names[j];
        se[j].y = y + (size_t)j * (size_t)nx;
        for (int i = 0; i < nx; i++) y[(size_t)j * (size_t)nx + (size_t)i] = NAN;
        if (loss && j == ns - 1) {
            snprintf(names[j], sizeof(names[j]), "reference (full batch)");
            for (int i = 0; i < nx; i++) y[(size_t)j * (size_t)nx + (size_t)i] = dr->reference.loss[i];
            continue;
        }
        if (loss)
            snprintf(names[j], sizeof(names[j]), "chunks %d %s%s%s", keys[j].chunks,
                     ps_bn_policy_name(keys[j].policy), several_ck ? " " : "",
                     several_ck ? ps_checkpoint_name(keys[j].checkpoint) : "");
        else
            snprintf(names[j], sizeof(names[j]), "%s%s%s", ps_bn_policy_name(keys[j].policy),
                     several_ck ? " " : "",
                     several_ck ? ps_checkpoint_name(keys[j].checkpoint) : "");
    }
    for (int k = 0; !rc && k < dr->n_runs; k++) {
        const struct ps_drift_run *r = &dr->runs[k];
        int j = 0;
        while (j < ns && !(keys[j].policy == r->s.policy && keys[j].checkpoint == r->s.checkpoint &&
                           (!loss || keys[j].chunks == r->s.chunks)))
            j++;
        if (j == ns) continue;
        if (loss) {
            for (int i = 0; i < nx && i < r->steps; i++)
                y[(size_t)j * (size_t)nx + (size_t)i] = r->loss[i];
        } else {
            int i = 0;
            while (i < nx && xs[i] != r->s.chunks) i++;
            if (i < nx)
                y[(size_t)j * (size_t)nx + (size_t)i] =
                    !strcmp(metric, "accuracy") ? r->accuracy : ps_drift_metric(r, metric);
        }
    }
    if (!rc) {
        for (int i = 0; i < nx; i++) x[i] = loss ? i : xs[i];
        char title[160];
        const char *ylabel = !strcmp(metric, "var_err")    ? "running_var relative error (mean)"
                             : !strcmp(metric, "mean_err") ? "running_mean error / std (mean)"
                             : !strcmp(metric, "accuracy") ? "eval accuracy (running stats)"
                             : loss                        ? "training loss"
                                                           : metric;
        snprintf(title, sizeof(title), "%s: %s vs %s", dr->spec && dr->spec->name ? dr->spec->name : "drift",
                 loss ? "loss" : ylabel, loss ? "step" : "chunks");
        struct ps_line_plot p = {.title = title,
                                 .xlabel = loss ? "step" : "chunks",
                                 .ylabel = ylabel,
                                 .n = (uint32_t)nx,
                                 .x = x,
                                 .log2_x = !loss,
                                 .y_zero = !loss,
                                 .n_series = (uint32_t)ns,
                                 .series = se};
        rc = ps_plot_lines_file(&p, path, d);
    }
    free(x);
    free(y);
    free(se);
    free(names);
    return rc;
}
