/* viz/advise: the "advise" section of the report JSON, its text table and the Pareto plot,
 * written from a configuration search (src/advise.h). Writers only: every number comes from the
 * search; JSON rows keep the search's order (deterministic), the table lists the front first,
 * fastest first.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/advise.h"
#include "viz/report.h"
#include "viz/viz.h"

const char *ps_advise_status_name(int s)
{
    static const char *const n[] = {"feasible", "over_cap", "no_balance", "pruned", "skipped"};
    return s >= 0 && s < 5 ? n[s] : "unknown";
}

static cJSON *point_json(const struct ps_advise_point *p)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_string(o, "schedule", ps_schedule_name((enum ps_schedule)p->schedule));
    ps_json_add_int(o, "stages_per_device", p->virtual_stages);
    ps_json_add_int(o, "stages", p->stages);
    ps_json_add_int(o, "devices", p->devices);
    ps_json_add_int(o, "chunks", p->chunks);
    ps_json_add_int(o, "micro_batches", p->m);
    ps_json_add_string(o, "checkpoint", ps_checkpoint_name(p->checkpoint));
    ps_json_add_string(o, "batchnorm", ps_bn_policy_name(p->policy));
    ps_json_add_string(o, "status", ps_advise_status_name(p->status));
    if (p->status == PS_ADV_FEASIBLE) {
        ps_json_add_number(o, "makespan_us", p->makespan_us);
        ps_json_add_number(o, "throughput_samples_per_s", p->throughput);
        ps_json_add_int(o, "peak_bytes", p->peak_bytes);
        cJSON *b = cJSON_AddArrayToObject(o, "balance");
        for (int j = 0; b && p->balance && j < p->stages; j++) ps_json_add_int(b, NULL, p->balance[j]);
        ps_json_add_bool(o, "balance_exact", p->balance_exact);
        ps_json_add_bool(o, "pareto", p->on_front);
    }
    ps_json_add_number(o, "bn_drift_predicted", p->drift);
    if (!isnan(p->drift_measured)) ps_json_add_number(o, "bn_drift_measured", p->drift_measured);
    if (p->status != PS_ADV_SKIPPED) {
        ps_json_add_number(o, "throughput_bound", p->bound_throughput);
        ps_json_add_int(o, "peak_bound", p->bound_peak);
    }
    if (p->why[0]) ps_json_add_string(o, "reason", p->why);
    return o;
}

cJSON *ps_advise_json(const struct ps_advise *a)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_int(o, "devices", a->devices);
    if (a->memory_cap > 0) ps_json_add_number(o, "memory_cap_bytes", a->memory_cap);
    else cJSON_AddNullToObject(o, "memory_cap_bytes");
    ps_json_add_bool(o, "memory_cap_auto", a->cap_auto);
    ps_json_add_string(o, "objective", a->objective == PS_ADVISE_BALANCED ? "balanced"
                                                                          : "throughput");
    ps_json_add_bool(o, "exhaustive", a->exhaustive);
    ps_json_add_int(o, "configurations", a->n_configs);
    ps_json_add_int(o, "simulated", a->n_simulated);
    ps_json_add_int(o, "pruned", a->n_pruned);
    ps_json_add_int(o, "skipped", a->n_skipped);
    ps_json_add_int(o, "rebalanced", a->n_rebalanced);
    ps_json_add_bool(o, "drift_predicted", a->drift_predicted);
    ps_json_add_string(o, "drift_note", a->drift_note);
    if (a->train_steps > 0) ps_json_add_int(o, "train_steps", a->train_steps);
    cJSON *s = cJSON_AddObjectToObject(o, "spec");
    if (s) {
        ps_json_add_number(s, "makespan_us", a->spec_makespan_us);
        ps_json_add_number(s, "throughput_samples_per_s", a->spec_throughput);
        ps_json_add_int(s, "peak_bytes", a->spec_peak);
        ps_json_add_number(s, "bn_drift_predicted", a->spec_drift);
    }
    if (a->recommended >= 0) {
        char line[512];
        ps_advise_sentence(a, &a->points[a->recommended], line, sizeof(line));
        ps_json_add_string(o, "recommendation", line);
        cJSON_AddItemToObject(o, "recommended", point_json(&a->points[a->recommended]));
    } else {
        cJSON_AddNullToObject(o, "recommendation");
    }
    cJSON *f = cJSON_AddArrayToObject(o, "pareto_front");
    cJSON *all = cJSON_AddArrayToObject(o, "points");
    for (int i = 0; i < a->n_points; i++) {
        if (f && a->points[i].on_front) cJSON_AddItemToArray(f, point_json(&a->points[i]));
        if (all) cJSON_AddItemToArray(all, point_json(&a->points[i]));
    }
    return o;
}

static void row(FILE *f, const struct ps_advise_point *p, bool rec)
{
    char mem[32] = "-", thr[32] = "-", dr[32] = "-", bal[24] = "";
    if (p->status == PS_ADV_FEASIBLE) {
        snprintf(mem, sizeof(mem), "%.4g MiB", (double)p->peak_bytes / 1048576.0);
        snprintf(thr, sizeof(thr), "%.1f", p->throughput);
    }
    if (!isnan(p->drift)) snprintf(dr, sizeof(dr), "%.3g%%", 100 * p->drift);
    if (p->status == PS_ADV_FEASIBLE && !p->balance_exact) snprintf(bal, sizeof(bal), " (rebalanced)");
    char meas[48] = "";
    if (!isnan(p->drift_measured))
        snprintf(meas, sizeof(meas), " (trained: %.3g%%)", 100 * p->drift_measured);
    fprintf(f, "%s %-16s %3d %6d %-11s %-9s %12s %11s %9s%s%s\n", rec ? "*" : " ",
            ps_schedule_name((enum ps_schedule)p->schedule), p->virtual_stages, p->chunks,
            ps_checkpoint_name(p->checkpoint), ps_bn_policy_name(p->policy), thr, mem, dr, meas,
            bal);
}

int ps_advise_table(const struct ps_advise *a, FILE *f, bool all)
{
    char cap[32] = "none";
    if (a->memory_cap > 0) snprintf(cap, sizeof(cap), "%.4g MiB", a->memory_cap / 1048576.0);
    fprintf(f, "search: %d configurations on %d device%s, %d simulated, %d pruned by bounds, "
            "%d skipped, memory cap %s%s; %s\n", a->n_configs, a->devices,
            a->devices == 1 ? "" : "s", a->n_simulated, a->n_pruned, a->n_skipped, cap,
            a->cap_auto ? " (auto: the spec's own peak)" : "",
            a->exhaustive ? "exhaustive (every configuration simulated or bounded out, every "
                            "balance the exact min-max)"
                          : "NOT exhaustive: some configurations over the cap were rebalanced by "
                            "a conservative memory model or given up");
    fprintf(f, "BN drift: %s\n", a->drift_note);
    fprintf(f, "  %-16s %3s %6s %-11s %-9s %12s %11s %9s\n", "schedule", "spd", "chunks",
            "checkpoint", "bn", "samples/s", "peak_mem", "drift");
    /* the front by throughput, fastest first (ties: table order) */
    int *idx = malloc(((size_t)a->n_points + 1) * sizeof(int)), n = 0;
    if (!idx) return -ENOMEM;
    for (int i = 0; i < a->n_points; i++)
        if (a->points[i].on_front) {
            int k = n++;
            while (k > 0 && a->points[idx[k - 1]].throughput < a->points[i].throughput) {
                idx[k] = idx[k - 1];
                k--;
            }
            idx[k] = i;
        }
    for (int k = 0; k < n; k++) row(f, &a->points[idx[k]], idx[k] == a->recommended);
    free(idx);
    if (all)
        for (int i = 0; i < a->n_points; i++)
            if (!a->points[i].on_front) {
                row(f, &a->points[i], false);
                if (a->points[i].why[0]) fprintf(f, "      %s\n", a->points[i].why);
            }
    if (a->recommended >= 0) {
        char line[512];
        ps_advise_sentence(a, &a->points[a->recommended], line, sizeof(line));
        fprintf(f, "recommended: %s\n", line);
    } else {
        fprintf(f, "recommended: nothing fits the memory cap\n");
    }
    return ferror(f) ? -EIO : 0;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int ps_advise_plot(const struct ps_advise *a, const char *path, struct ps_diag *d)
{
    /* x: throughput of every front point and of the spec; one series per BN policy (its front
     * points, peak memory against throughput), one for the spec as written, one for the
     * recommendation and the memory cap as a horizontal line */
    int n = 0;
    double *x = malloc(((size_t)a->n_points + 1) * sizeof(double));
    double *y = malloc(6 * ((size_t)a->n_points + 1) * sizeof(double));
    if (!x || !y) {
        free(x);
        free(y);
        return ps_diag_set(d, -ENOMEM, path, "out of memory");
    }
    for (int i = 0; i < a->n_points; i++)
        if (a->points[i].on_front) x[n++] = a->points[i].throughput;
    x[n++] = a->spec_throughput;
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || x[i] != x[u - 1]) x[u++] = x[i];
    for (int k = 0; k < 6 * u; k++) y[k] = NAN;
    for (int i = 0; i < a->n_points; i++) {
        const struct ps_advise_point *p = &a->points[i];
        if (!p->on_front) continue;
        for (int k = 0; k < u; k++)
            if (x[k] == p->throughput) y[(size_t)p->policy * (size_t)u + (size_t)k] = (double)p->peak_bytes;
    }
    const struct ps_advise_point *rec = a->recommended >= 0 ? &a->points[a->recommended] : NULL;
    for (int k = 0; k < u; k++) {
        if (x[k] == a->spec_throughput) y[3 * (size_t)u + (size_t)k] = (double)a->spec_peak;
        if (rec && x[k] == rec->throughput) y[4 * (size_t)u + (size_t)k] = (double)rec->peak_bytes;
        if (a->memory_cap > 0) y[5 * (size_t)u + (size_t)k] = a->memory_cap;
    }
    struct ps_plot_series ser[6];
    char names[6][48];
    int ns = 0;
    /* drawn in this order, the later on top: the cap beneath every marker, the spec and the
       recommendation above the fronts; each keeps its look whatever else is drawn */
    static const int draw[6] = {5, 0, 1, 2, 3, 4};
    for (int di = 0; di < 6; di++) {
        int s = draw[di];
        bool any = false;
        for (int k = 0; k < u; k++) any |= !isnan(y[(size_t)s * (size_t)u + (size_t)k]);
        if (!any) continue;
        if (s < 3) snprintf(names[ns], sizeof(names[ns]), "Pareto front, %s BN",
                            ps_bn_policy_name((enum ps_bn_policy)s));
        else snprintf(names[ns], sizeof(names[ns]), "%s",
                      s == 3 ? "your spec" : s == 4 ? "recommended" : "memory cap");
        ser[ns].name = names[ns];
        ser[ns].y = y + (size_t)s * (size_t)u;
        ser[ns].style = 1 + s;
        ns++;
    }
    struct ps_line_plot lp = {.title = "advise: peak memory per device against throughput",
                              .xlabel = "samples/s", .ylabel = "peak memory per device",
                              .y_unit = PS_UNIT_BYTES, .n = (uint32_t)u, .x = x,
                              .y_zero = true, .n_series = (uint32_t)ns, .series = ser};
    int rc = ps_plot_lines_file(&lp, path, d);
    free(x);
    free(y);
    return rc;
}
