/* study/drift: BatchNorm running-statistics drift per setting against a full-batch reference,
 * measured with the CPU executor and set next to the closed forms of SEMANTICS.md section 7
 * (src/drift.h has the result types, viz/drift.c writes them).
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

#include "sim/bnorder.h"
#include "src/data.h"
#include "src/engine.h"
#include "src/schedule.h"
#include "kernels/exec.h"
#include "src/graph.h"
#include "src/study/study.h"

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
    float *ev_x = NULL;
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
            /* the held-out tail as rows of its own (synthetic data is drawn on request) */
            if (!(ev_x = malloc((size_t)(o->eval_rows * dt.in_numel) * sizeof(float))))
                rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory for the evaluation rows");
            else
                ps_data_rows(&dt, train_samples, o->eval_rows, ev_x, NULL, NULL);
            ev.x = ev_x;
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
    free(ev_x);
    if (rc) ps_drift_finish(out);
    return rc;
}
