/* cmp_report: text and JSON of a comparison and of a calibration (see cmp_report.h). */
#include "src/cli/cmp_report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"

const char *ps_cli_time(double us, char *buf, int len)
{
    double a = fabs(us);
    if (!isfinite(us)) snprintf(buf, len, "n/a");
    else if (a >= 1e6) snprintf(buf, len, "%.3f s", us / 1e6);
    else if (a >= 1e3) snprintf(buf, len, "%.2f ms", us / 1e3);
    else snprintf(buf, len, "%.1f us", us);
    return buf;
}

static const char *pct(double v, char *buf, int len, bool sign)
{
    if (!isfinite(v)) snprintf(buf, len, "n/a");
    else snprintf(buf, len, sign ? "%+.1f%%" : "%.1f%%", 100 * v);
    return buf;
}

const char *ps_cmp_oneline(const struct ps_compare *c, char *buf, int len)
{
    char a[32], b[32];
    snprintf(buf, len, "makespan error %s, duration error p95 %s, %llu order inversion%s, %u "
                       "dependency violation%s",
             pct(c->makespan_error, a, sizeof(a), true), pct(c->dur_rel.p95, b, sizeof(b), false),
             (unsigned long long)c->inversions, c->inversions == 1 ? "" : "s",
             c->n_dep_violations, c->n_dep_violations == 1 ? "" : "s");
    return buf;
}

static void worst(FILE *f, const struct ps_graph *g, const struct ps_compare *c,
                  const struct ps_compare_stat *s, bool rel)
{
    char nm[64], v[32];
    for (uint32_t k = 0; k < s->n_worst; k++) {
        const struct ps_compare_task *t = &c->tasks[s->worst[k]];
        double e = rel ? t->dur_rel : s == &c->start ? t->start_err : t->dur_err;
        if (rel) snprintf(v, sizeof(v), "%+.1f%%", 100 * e);
        else snprintf(v, sizeof(v), "%+.1f us", e);
        fprintf(f, "%s %s %s", k ? "," : " worst:", ps_node_name(g, t->node, nm, sizeof(nm)), v);
    }
    fputc('\n', f);
}

void ps_cmp_print(FILE *f, const struct ps_graph *g, const struct ps_compare *c)
{
    char a[32], b[32], x[32], nm[64];
    fprintf(f, "  makespan: measured %s, simulated %s, error %s ((measured - simulated) / "
               "measured)\n",
            ps_cli_time(c->meas_makespan_us, a, sizeof(a)),
            ps_cli_time(c->sim_makespan_us, b, sizeof(b)),
            pct(c->makespan_error, x, sizeof(x), true));
    fprintf(f, "  aligned: %u nodes; %u tasks only simulated, %u only measured, %u measured "
               "names not in the graph\n",
            c->n_aligned, c->n_sim_only, c->n_meas_only, c->n_unmatched);
    if (c->start.n) {
        fprintf(f, "  start error:    median %s, p95 %s,", ps_cli_time(c->start.median, a, sizeof(a)),
                ps_cli_time(c->start.p95, b, sizeof(b)));
        worst(f, g, c, &c->start, false);
        fprintf(f, "  duration error: median %s, p95 %s,", pct(c->dur_rel.median, a, sizeof(a), false),
                pct(c->dur_rel.p95, b, sizeof(b), false));
        worst(f, g, c, &c->dur_rel, true);
    }
    fprintf(f, "  order inversions: %llu of %llu pairs on %u stream%s\n",
            (unsigned long long)c->inversions, (unsigned long long)c->pairs, c->n_streams,
            c->n_streams == 1 ? "" : "s");
    for (uint32_t k = 0; k < c->n_streams; k++) {
        const struct ps_compare_stream *s = &c->streams[k];
        if (!s->inversions) continue;
        char st[64], dv[32];
        int32_t d = g->streams[s->stream].device;
        fprintf(f, "    %s %s: %llu of %llu pairs\n", ps_viz_device_name(g, d, dv, sizeof(dv)),
                ps_stream_name(g, s->stream, st, sizeof(st)), (unsigned long long)s->inversions,
                (unsigned long long)s->pairs);
    }
    if (!c->n_dep_violations) {
        fprintf(f, "  dependencies: all %u held in the measurement\n", c->n_deps_checked);
    } else {
        fprintf(f, "  dependencies: %u of %u broken in the measurement, e.g.", c->n_dep_violations,
                c->n_deps_checked);
        for (uint32_t k = 0; k < c->n_deps_kept && k < 3; k++) {
            char n2[64];
            fprintf(f, "%s %s started %.3f us before %s ended", k ? ";" : "",
                    ps_node_name(g, c->deps[k].dst, nm, sizeof(nm)), c->deps[k].early_us,
                    ps_node_name(g, c->deps[k].src, n2, sizeof(n2)));
        }
        fputc('\n', f);
    }
    fprintf(f, "  bubble per device (measured / simulated):");
    for (int d = 0; d < c->n_devices; d++) {
        char dv[32];
        fprintf(f, "%s %s %s / %s", d ? "," : "", ps_viz_device_name(g, d, dv, sizeof(dv)),
                pct(c->dev[d].meas_bubble, a, sizeof(a), false),
                pct(c->dev[d].sim_bubble, b, sizeof(b), false));
    }
    fputc('\n', f);
    fprintf(f, "  recompute overhead (R / (F + B)): measured %s, simulated %s\n",
            pct(c->meas_recompute_overhead, a, sizeof(a), false),
            pct(c->sim_recompute_overhead, b, sizeof(b), false));
    fprintf(f, "  copy/compute overlap: measured %s, simulated %s\n",
            isfinite(c->meas_copy_overlap) ? pct(c->meas_copy_overlap, a, sizeof(a), false)
                                           : "n/a (no copy time)",
            isfinite(c->sim_copy_overlap) ? pct(c->sim_copy_overlap, b, sizeof(b), false)
                                          : "n/a (no copy time)");
}

static cJSON *stat_json(const struct ps_graph *g, const struct ps_compare *c,
                        const struct ps_compare_stat *s, int which)
{
    cJSON *o = cJSON_CreateObject();
    char nm[64];
    ps_json_add_int(o, "n", s->n);
    ps_json_add_number(o, "median", s->median);
    ps_json_add_number(o, "p95", s->p95);
    ps_json_add_number(o, "max", s->max);
    cJSON *w = cJSON_AddArrayToObject(o, "worst");
    for (uint32_t k = 0; k < s->n_worst; k++) {
        const struct ps_compare_task *t = &c->tasks[s->worst[k]];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_string(x, "task", ps_node_name(g, t->node, nm, sizeof(nm)));
        ps_json_add_number(x, "error", which == 0 ? t->start_err : which == 1 ? t->dur_err : t->dur_rel);
        cJSON_AddItemToArray(w, x);
    }
    return o;
}

static cJSON *times(double start, double dur)
{
    if (!isfinite(start)) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    ps_json_add_number(o, "start_us", start);
    ps_json_add_number(o, "dur_us", dur);
    return o;
}

void ps_trace_info_print(FILE *f, const struct ps_trace_read_info *in)
{
    fprintf(f, "  ranges recognised: %u pipescope, %u PyTorch pipelining (PP:), %u fairscale (chunk-part)",
            in->n_pipescope_names, in->n_pytorch, in->n_fairscale);
    if (in->n_by_id) fprintf(f, ", %u by node id", in->n_by_id);
    if (in->n_pytorch_other)
        fprintf(f, "; %u PyTorch communication/sharding actions (not tasks)", in->n_pytorch_other);
    fputc('\n', f);
    if (in->n_rank_mismatch)
        fprintf(f, "  warning: %u PP: ranges ran on a rank that is not their stage's device in the "
                   "spec (pipeline.devices)\n",
                in->n_rank_mismatch);
    for (uint32_t k = 0; k < in->n_names && k < 8; k++)
        fprintf(f, "  not mapped: %s: %s\n", in->unmatched[k], in->unmatched_why[k]);
    if (in->n_unmatched > 8) fprintf(f, "  not mapped: %u more\n", in->n_unmatched - 8);
    if (in->n_gpu_ops || in->n_gpu_tasks)
        fprintf(f, "  gpu: %u tasks measured on the device (%u on several streams); %u of %u "
                   "kernels/copies attributed to a task range by correlation id\n",
                in->n_gpu_tasks, in->n_multi_stream, in->n_gpu_attributed, in->n_gpu_ops);
    if (in->n_files > 1) {
        fprintf(f, "  files: %u, put on one clock by", in->n_files);
        bool base = true;
        for (uint32_t k = 0; k < in->n_files; k++) base &= in->files[k].has_base;
        fprintf(f, "%s %u cross-file dependencies; residual clock skew %.3f us%s\n",
                base ? " baseTimeNanoseconds and" : "", in->n_cross_edges, in->residual_skew_us,
                in->clocks_inconsistent ? " (the dependencies contradict each other: not applied)"
                                        : "");
        for (uint32_t k = 0; k < in->n_files; k++) {
            const struct ps_trace_file_info *fi = &in->files[k];
            char r[32] = "no rank";
            if (fi->has_rank) snprintf(r, sizeof(r), "rank %lld", (long long)fi->rank);
            fprintf(f, "    %s (%s): %u tasks, offset %.3f us + skew %.3f us\n", fi->path, r,
                    fi->n_tasks, fi->base_offset_us, fi->skew_us);
        }
    }
}

cJSON *ps_cmp_json(const struct ps_graph *g, const struct ps_compare *c,
                   const struct ps_trace *meas, const struct ps_trace_read_info *info,
                   const struct ps_tolerance *tol, int exceeded, const char *why)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char nm[64];
    ps_json_add_number(o, "makespan_error", c->makespan_error);
    ps_json_add_number(o, "measured_makespan_us", c->meas_makespan_us);
    ps_json_add_number(o, "simulated_makespan_us", c->sim_makespan_us);
    ps_json_add_string(o, "measured_source", ps_trace_source_name(meas->source));
    ps_json_add_int(o, "aligned", c->n_aligned);
    ps_json_add_int(o, "simulated_only", c->n_sim_only);
    ps_json_add_int(o, "measured_only", c->n_meas_only);
    uint32_t *mix = malloc(((size_t)g->n_nodes + 1) * sizeof(uint32_t)); /* node -> record */
    if (mix) {
        for (uint32_t v = 0; v < g->n_nodes; v++) mix[v] = UINT32_MAX;
        for (uint32_t k = meas->n; k-- > 0;)
            if (meas->r[k].node < g->n_nodes) mix[meas->r[k].node] = k;
    }
    cJSON *ts = cJSON_AddArrayToObject(o, "tasks");
    for (uint32_t k = 0; k < c->n_tasks; k++) {
        const struct ps_compare_task *t = &c->tasks[k];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_string(x, "task", ps_node_name(g, t->node, nm, sizeof(nm)));
        ps_json_add_int(x, "node", t->node);
        cJSON_AddItemToObject(x, "simulated", times(t->sim_start, t->sim_dur));
        cJSON *mj = times(t->meas_start, t->meas_dur);
        const struct ps_trace_rec *mr = mix && mix[t->node] != UINT32_MAX ? &meas->r[mix[t->node]] : NULL;
        if (mj && mr && isfinite(mr->cpu_start_us) && isfinite(mr->start_us)) {
            cJSON *h = cJSON_AddObjectToObject(mj, "host");
            ps_json_add_number(h, "start_us", t->meas_start + (mr->cpu_start_us - mr->start_us));
            ps_json_add_number(h, "dur_us", mr->cpu_dur_us);
        }
        if (mj && mr && mr->lane_stream >= 0) {
            ps_json_add_int(mj, "gpu", mr->lane_device);
            ps_json_add_int(mj, "cuda_stream", mr->lane_stream);
        }
        cJSON_AddItemToObject(x, "measured", mj);
        if (isfinite(t->start_err)) {
            ps_json_add_number(x, "start_error_us", t->start_err);
            ps_json_add_number(x, "dur_error_us", t->dur_err);
            ps_json_add_number(x, "dur_error_rel", t->dur_rel);
        }
        cJSON_AddItemToArray(ts, x);
    }
    free(mix);
    cJSON *um = cJSON_AddArrayToObject(o, "unmatched_measured");
    for (uint32_t k = 0; k < meas->n; k++)
        if (meas->r[k].node >= g->n_nodes)
            ps_json_add_string(um, NULL, meas->r[k].name ? meas->r[k].name : "?");
    cJSON_AddItemToObject(o, "start_error_us", stat_json(g, c, &c->start, 0));
    cJSON_AddItemToObject(o, "dur_error_us", stat_json(g, c, &c->dur, 1));
    cJSON_AddItemToObject(o, "dur_error_rel", stat_json(g, c, &c->dur_rel, 2));
    ps_json_add_int(o, "order_inversions", (int64_t)c->inversions);
    ps_json_add_int(o, "order_pairs", (int64_t)c->pairs);
    cJSON *ss = cJSON_AddArrayToObject(o, "streams");
    for (uint32_t k = 0; k < c->n_streams; k++) {
        const struct ps_compare_stream *s = &c->streams[k];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "stream", s->stream);
        ps_json_add_string(x, "name", ps_stream_name(g, s->stream, nm, sizeof(nm)));
        ps_json_add_int(x, "device", g->streams[s->stream].device);
        ps_json_add_int(x, "tasks", s->n_tasks);
        ps_json_add_int(x, "pairs", (int64_t)s->pairs);
        ps_json_add_int(x, "inversions", (int64_t)s->inversions);
        cJSON_AddItemToArray(ss, x);
    }
    cJSON *dv = cJSON_AddObjectToObject(o, "dependency_violations");
    ps_json_add_int(dv, "count", c->n_dep_violations);
    ps_json_add_int(dv, "checked", c->n_deps_checked);
    cJSON *ex = cJSON_AddArrayToObject(dv, "examples");
    for (uint32_t k = 0; k < c->n_deps_kept; k++) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_string(x, "before", ps_node_name(g, c->deps[k].src, nm, sizeof(nm)));
        ps_json_add_string(x, "after", ps_node_name(g, c->deps[k].dst, nm, sizeof(nm)));
        ps_json_add_number(x, "early_us", c->deps[k].early_us);
        cJSON_AddItemToArray(ex, x);
    }
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    for (int d = 0; d < c->n_devices; d++) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "device", d);
        ps_json_add_string(x, "name", ps_viz_device_name(g, d, nm, sizeof(nm)));
        ps_json_add_number(x, "measured_bubble", c->dev[d].meas_bubble);
        ps_json_add_number(x, "simulated_bubble", c->dev[d].sim_bubble);
        ps_json_add_number(x, "measured_busy_us", c->dev[d].meas_busy_us);
        ps_json_add_number(x, "simulated_busy_us", c->dev[d].sim_busy_us);
        cJSON_AddItemToArray(devs, x);
    }
    cJSON *rc = cJSON_AddObjectToObject(o, "recompute_overhead");
    ps_json_add_number(rc, "measured", c->meas_recompute_overhead);
    ps_json_add_number(rc, "simulated", c->sim_recompute_overhead);
    cJSON *ov = cJSON_AddObjectToObject(o, "copy_compute_overlap");
    ps_json_add_number(ov, "measured", c->meas_copy_overlap);
    ps_json_add_number(ov, "simulated", c->sim_copy_overlap);
    ps_json_add_number(ov, "measured_copy_us", c->meas_copy_us);
    ps_json_add_number(ov, "simulated_copy_us", c->sim_copy_us);
    if (info) {
        cJSON *rd = cJSON_AddObjectToObject(o, "measured_trace");
        ps_json_add_string(rd, "format", info->pipescope ? "pipescope" : info->kineto ? "kineto" : "legacy");
        ps_json_add_int(rd, "x_events", info->n_events);
        ps_json_add_int(rd, "by_id", info->n_by_id);
        ps_json_add_int(rd, "by_name", info->n_by_name);
        ps_json_add_int(rd, "merged", info->n_merged);
        ps_json_add_int(rd, "ignored", info->n_ignored);
        ps_json_add_int(rd, "unmatched", info->n_unmatched);
        cJSON *nmj = cJSON_AddObjectToObject(rd, "names");
        ps_json_add_int(nmj, "pipescope", info->n_pipescope_names);
        ps_json_add_int(nmj, "pytorch", info->n_pytorch);
        ps_json_add_int(nmj, "fairscale", info->n_fairscale);
        ps_json_add_int(nmj, "pytorch_other_actions", info->n_pytorch_other);
        ps_json_add_int(nmj, "pytorch_rank_mismatch", info->n_rank_mismatch);
        cJSON *whyj = cJSON_AddArrayToObject(rd, "unmatched_why");
        for (uint32_t k = 0; k < info->n_names; k++) {
            cJSON *x = cJSON_CreateObject();
            ps_json_add_string(x, "name", info->unmatched[k]);
            ps_json_add_string(x, "why", info->unmatched_why[k]);
            cJSON_AddItemToArray(whyj, x);
        }
        cJSON *gp = cJSON_AddObjectToObject(rd, "gpu");
        ps_json_add_int(gp, "runtime_calls", info->n_launches);
        ps_json_add_int(gp, "gpu_ops", info->n_gpu_ops);
        ps_json_add_int(gp, "gpu_ops_attributed", info->n_gpu_attributed);
        ps_json_add_int(gp, "tasks_on_gpu", info->n_gpu_tasks);
        ps_json_add_int(gp, "tasks_on_several_streams", info->n_multi_stream);
        cJSON *fl = cJSON_AddArrayToObject(rd, "files");
        for (uint32_t k = 0; k < info->n_files; k++) {
            const struct ps_trace_file_info *fi = &info->files[k];
            cJSON *x = cJSON_CreateObject();
            ps_json_add_string(x, "path", fi->path);
            if (fi->has_rank) ps_json_add_int(x, "rank", fi->rank);
            if (fi->world_size > 0) ps_json_add_int(x, "world_size", fi->world_size);
            if (fi->has_base) ps_json_add_int(x, "base_time_ns", fi->base_ns);
            ps_json_add_int(x, "bytes", (int64_t)fi->bytes);
            ps_json_add_int(x, "events", (int64_t)fi->n_elements);
            ps_json_add_int(x, "tasks", fi->n_tasks);
            ps_json_add_number(x, "base_offset_us", fi->base_offset_us);
            ps_json_add_number(x, "skew_correction_us", fi->skew_us);
            cJSON_AddItemToArray(fl, x);
        }
        cJSON *ck = cJSON_AddObjectToObject(rd, "clocks");
        ps_json_add_int(ck, "cross_file_edges", info->n_cross_edges);
        ps_json_add_number(ck, "residual_skew_us", info->residual_skew_us);
        ps_json_add_bool(ck, "consistent", !info->clocks_inconsistent);
        if (info->clocks_inconsistent) ps_json_add_number(ck, "contradiction_us", info->inconsistency_us);
        cJSON *th = cJSON_AddArrayToObject(rd, "threads");
        for (uint32_t k = 0; k < info->n_threads; k++) {
            cJSON *x = cJSON_CreateObject();
            ps_json_add_string(x, "pid", info->threads[k].pid);
            ps_json_add_int(x, "tid", info->threads[k].tid);
            ps_json_add_int(x, "device", info->threads[k].device);
            ps_json_add_int(x, "tasks", info->threads[k].n_tasks);
            if (info->n_files > 1) ps_json_add_int(x, "file", info->threads[k].file);
            cJSON_AddItemToArray(th, x);
        }
    }
    if (tol) {
        cJSON *t = cJSON_AddObjectToObject(o, "tolerance");
        if (tol->makespan >= 0) ps_json_add_number(t, "makespan", tol->makespan);
        if (tol->task >= 0) ps_json_add_number(t, "task", tol->task);
        if (tol->start >= 0) ps_json_add_number(t, "start", tol->start);
        ps_json_add_bool(o, "ok", exceeded == 0);
        cJSON *w = cJSON_AddArrayToObject(o, "exceeded");
        for (const char *p = why; p && *p;) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            char line[256];
            snprintf(line, sizeof(line), "%.*s", (int)n, p);
            ps_json_add_string(w, NULL, line);
            p = nl ? nl + 1 : p + n;
        }
    }
    return o;
}

cJSON *ps_costs_json(const struct ps_costs *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_int(o, "pipescope_costs", 1);
    ps_json_add_string(o, "unit", c->per_sample ? "sample" : "micro_batch");
    if (!c->per_sample) ps_json_add_number(o, "micro_batch_size", c->micro_batch);
    cJSON *ls = cJSON_AddArrayToObject(o, "layers");
    for (int k = 0; k < c->n_layers; k++) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_number(x, "forward_us", c->layers[k].forward_us);
        ps_json_add_number(x, "backward_us", c->layers[k].backward_us);
        if (c->layers[k].wgrad_us >= 0) ps_json_add_number(x, "wgrad_us", c->layers[k].wgrad_us);
        cJSON_AddItemToArray(ls, x);
    }
    if (c->copy_bandwidth > 0 || c->copy_latency_us >= 0) {
        cJSON *cp = cJSON_AddObjectToObject(o, "copy");
        if (c->copy_bandwidth > 0) ps_json_add_number(cp, "bandwidth", c->copy_bandwidth);
        if (c->copy_latency_us >= 0) ps_json_add_number(cp, "latency_us", c->copy_latency_us);
    }
    if (c->launch_overhead_us >= 0) ps_json_add_number(o, "launch_overhead_us", c->launch_overhead_us);
    if (c->optimizer_us) {
        cJSON *op = cJSON_AddArrayToObject(o, "optimizer_us");
        for (int k = 0; k < c->n_optimizer; k++) ps_json_add_number(op, NULL, c->optimizer_us[k]);
    }
    return o;
}

int ps_costs_write(const struct ps_costs *c, const char *path, struct ps_diag *diag)
{
    cJSON *o = ps_costs_json(c);
    if (!o) return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    int rc = ps_report_write(o, path, diag);
    cJSON_Delete(o);
    return rc;
}

static const char *const param_name[PS_CAL__COUNT] = {"copy_bandwidth", "copy_latency_us",
                                                      "launch_overhead_us", "clock_offset_us"};

cJSON *ps_calib_json(const struct ps_calib *cal, const struct ps_compare *before,
                     const struct ps_compare *after)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_int(o, "observations", cal->n_obs);
    ps_json_add_int(o, "parameters", cal->n_params);
    ps_json_add_int(o, "rank", cal->rank);
    ps_json_add_int(o, "host_bound_starts", cal->n_host_bound);
    ps_json_add_int(o, "outliers", cal->n_trimmed);
    ps_json_add_number(o, "rms_us", cal->rms_us);
    cJSON *p = cJSON_AddArrayToObject(o, "partitions");
    for (int j = 0; j < cal->n_parts; j++) {
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "partition", j);
        ps_json_add_number(x, "forward_us_per_sample", cal->part_fwd_us[j]);
        ps_json_add_number(x, "backward_us_per_sample", cal->part_bwd_us[j]);
        cJSON_AddItemToArray(p, x);
    }
    cJSON *f = cJSON_AddObjectToObject(o, "fitted");
    for (int k = 0; k < PS_CAL__COUNT; k++)
        if (cal->fitted[k]) ps_json_add_number(f, param_name[k], cal->value[k]);
        else cJSON_AddNullToObject(f, param_name[k]);
    cJSON_AddItemToObject(o, "costs", ps_costs_json(cal->costs));
    const struct ps_compare *cs[2] = {before, after};
    const char *key[2] = {"before", "after"};
    for (int k = 0; k < 2; k++) {
        if (!cs[k]) continue;
        cJSON *x = cJSON_AddObjectToObject(o, key[k]);
        ps_json_add_number(x, "makespan_error", cs[k]->makespan_error);
        ps_json_add_number(x, "simulated_makespan_us", cs[k]->sim_makespan_us);
        ps_json_add_number(x, "dur_error_rel_median", cs[k]->dur_rel.median);
        ps_json_add_number(x, "dur_error_rel_p95", cs[k]->dur_rel.p95);
        ps_json_add_number(x, "start_error_us_p95", cs[k]->start.p95);
    }
    return o;
}

void ps_calib_print(FILE *f, const struct ps_calib *cal)
{
    char a[32], b[32];
    fprintf(f, "  fit: %u observations (%u outliers), %u parameters, rank %u, rms residual "
               "%s\n",
            cal->n_obs, cal->n_trimmed, cal->n_params, cal->rank,
            ps_cli_time(cal->rms_us, a, sizeof(a)));
    for (int j = 0; j < cal->n_parts; j++)
        fprintf(f, "  partition %d: forward %s, backward %s per sample\n", j,
                isfinite(cal->part_fwd_us[j]) ? ps_cli_time(cal->part_fwd_us[j], a, sizeof(a)) : "not measured",
                isfinite(cal->part_bwd_us[j]) ? ps_cli_time(cal->part_bwd_us[j], b, sizeof(b)) : "not measured");
    if (cal->fitted[PS_CAL_BANDWIDTH])
        fprintf(f, "  copy bandwidth %.4g GB/s\n", cal->value[PS_CAL_BANDWIDTH] / 1e9);
    else
        fprintf(f, "  copy bandwidth: not identifiable from this trace (kept the spec's)\n");
    if (cal->fitted[PS_CAL_LATENCY])
        fprintf(f, "  copy latency %s\n", ps_cli_time(cal->value[PS_CAL_LATENCY], a, sizeof(a)));
    else
        fprintf(f, "  copy latency: not identifiable from this trace (kept the spec's)\n");
    if (cal->fitted[PS_CAL_LAUNCH])
        fprintf(f, "  launch overhead %s (from %u host-bound starts)\n",
                ps_cli_time(cal->value[PS_CAL_LAUNCH], a, sizeof(a)), cal->n_host_bound);
    else
        fprintf(f, "  launch overhead: not identifiable from this trace (kept the spec's)\n");
}
