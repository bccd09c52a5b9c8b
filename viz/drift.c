/* viz/drift: the "drift" section of the report JSON and the drift line plots, written from the
 * results of a drift sweep (src/drift.h). Writers only: every number comes from the sweep.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/drift.h"
#include "viz/viz.h"
#include "viz/report.h"

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
                                 .log_y_auto = !loss,
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
