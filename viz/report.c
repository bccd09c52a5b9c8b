/* report: the section writers of the report JSON (report.h). Numbers go through viz.h's JSON
 * helpers (%.17g, null for non-finite), so the same figure prints the same way in every
 * command's report.
 */
#include "viz/report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"

/* ---- units ---------------------------------------------------------------------------------- */

const char *ps_viz_time(double us, char *buf, int len)
{
    double a = fabs(us);
    if (!isfinite(us)) snprintf(buf, len, "n/a");
    else if (a >= 1e6) snprintf(buf, len, "%.3f s", us / 1e6);
    else if (a >= 1e3) snprintf(buf, len, "%.2f ms", us / 1e3);
    else if (a >= 1 || a == 0) snprintf(buf, len, "%.1f us", us);
    else snprintf(buf, len, "%.3f us", us); /* a non-zero time under 1 us never reads 0.0 */
    return buf;
}

const char *ps_viz_bytes(double b, char *buf, int len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4) {
        b /= 1024;
        k++;
    }
    snprintf(buf, len, k ? "%.1f %s" : "%.0f %s", b, u[k]);
    return buf;
}

/* ---- simulation ------------------------------------------------------------------------------ */

cJSON *ps_report_simulation(const struct ps_graph *g, const struct ps_sim *sim, int64_t batch)
{
    char buf[64];
    cJSON *o = cJSON_CreateObject();
    ps_json_add_number(o, "makespan_us", sim->makespan_us);
    ps_json_add_number(o, "throughput_samples_per_s",
                       sim->makespan_us > 0 ? (double)batch / (sim->makespan_us * 1e-6) : 0);
    ps_json_add_number(o, "bubble_fraction", sim->bubble_fraction);
    ps_json_add_number(o, "forward_us", sim->forward_us);
    ps_json_add_number(o, "backward_us", sim->backward_us);
    ps_json_add_number(o, "recompute_us", sim->recompute_us);
    ps_json_add_number(o, "recompute_share_of_backward", sim->recompute_share);
    ps_json_add_number(o, "recompute_overhead", sim->recompute_overhead);
    ps_json_add_number(o, "optimizer_us", sim->optimizer_us);
    ps_json_add_number(o, "copy_us", sim->copy_us);
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    for (int d = 0; d < sim->n_devices; d++) {
        const struct ps_sim_device *dv = &sim->dev[d];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "device", d);
        ps_json_add_string(x, "name", ps_viz_device_name(g, d, buf, sizeof(buf)));
        ps_json_add_number(x, "busy_us", dv->busy_us);
        ps_json_add_number(x, "bubble_fraction", dv->bubble_fraction);
        ps_json_add_number(x, "recompute_us", dv->recompute_us);
        ps_json_add_int(x, "peak_bytes", dv->peak_bytes);
        ps_json_add_number(x, "peak_t_us", dv->peak_t_us);
        ps_json_add_int(x, "max_in_flight", dv->max_in_flight);
        cJSON *mem = cJSON_AddArrayToObject(x, "memory");
        for (uint32_t k = 0; k < dv->n_mem; k++) {
            cJSON *p = cJSON_CreateArray();
            ps_json_add_number(p, NULL, dv->mem[k].t_us);
            ps_json_add_int(p, NULL, dv->mem[k].bytes);
            cJSON_AddItemToArray(mem, p);
        }
        cJSON_AddItemToArray(devs, x);
    }
    cJSON *cp = cJSON_CreateObject();
    ps_json_add_number(cp, "length_us", sim->cp_us);
    cJSON *nodes = cJSON_AddArrayToObject(cp, "tasks");
    for (uint32_t k = 0; k < sim->cp_n; k++)
        if (ps_node_is_task(&g->nodes[sim->cp[k]]))
            ps_json_add_string(nodes, NULL, ps_node_name(g, sim->cp[k], buf, sizeof(buf)));
    cJSON_AddItemToObject(o, "critical_path", cp);
    return o;
}

cJSON *ps_report_bn_order(const struct ps_bn_order *b)
{
    cJSON *o = cJSON_CreateObject();
    ps_json_add_string(o, "policy", ps_bn_policy_name(b->policy));
    cJSON *ls = cJSON_AddArrayToObject(o, "layers");
    for (int k = 0; k < b->n_layers; k++) {
        cJSON *l = cJSON_CreateObject();
        ps_json_add_int(l, "layer", b->layers[k].layer);
        ps_json_add_int(l, "partition", b->layers[k].part);
        cJSON *us = cJSON_AddArrayToObject(l, "updates");
        for (uint32_t q = 0; q < b->layers[k].n; q++) {
            const struct ps_bn_update *u = &b->layers[k].u[q];
            cJSON *x = cJSON_CreateObject();
            ps_json_add_int(x, "mb", u->mb);
            ps_json_add_string(x, "phase", ps_bn_phase_name(u->phase));
            if (u->pooled) ps_json_add_bool(x, "pooled", true);
            ps_json_add_number(x, "t_us", u->t_us);
            cJSON_AddItemToArray(us, x);
        }
        cJSON_AddItemToArray(ls, l);
    }
    return o;
}

/* ---- execution ------------------------------------------------------------------------------- */

static cJSON *float_array(const float *v, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t k = 0; a && k < n; k++) ps_json_add_number(a, NULL, (double)v[k]);
    return a;
}

static int add_memory(cJSON *ex, const struct ps_exec_result *r, const struct ps_mem *sim)
{
    const struct ps_exec_memory *m = &r->mem;
    cJSON *arr = cJSON_AddArrayToObject(ex, "memory");
    if (!arr) return -ENOMEM;
    for (int dv = 0; dv < m->n_devices; dv++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) return -ENOMEM;
        cJSON_AddItemToArray(arr, o);
        ps_json_add_int(o, "device", dv);
        ps_json_add_int(o, "peak_bytes", m->peak_bytes[dv]);
        ps_json_add_int(o, "peak_step", m->peak_step[dv]);
        ps_json_add_number(o, "peak_t_us", m->peak_t_us[dv]);
        if (sim) {
            ps_json_add_int(o, "simulated_peak_bytes", sim[dv].peak_bytes);
            if (sim[dv].peak_bytes > 0)
                ps_json_add_number(o, "measured_over_simulated",
                                   (double)m->peak_bytes[dv] / (double)sim[dv].peak_bytes);
        }
        cJSON *pts = cJSON_AddArrayToObject(o, "last_step");
        if (!pts) return -ENOMEM;
        for (uint32_t k = 0; k < m->n_points; k++) {
            if (m->points[k].device != dv) continue;
            cJSON *pt = cJSON_CreateArray();
            if (!pt) return -ENOMEM;
            cJSON_AddItemToArray(pts, pt);
            ps_json_add_number(pt, NULL, m->points[k].t_us);
            ps_json_add_int(pt, NULL, m->points[k].bytes);
        }
    }
    return 0;
}

cJSON *ps_report_execution(const struct ps_graph *g, const char *backend, bool forward_only,
                           bool serial, const struct ps_exec_result *r, const struct ps_mem *sim)
{
    cJSON *ex = cJSON_CreateObject();
    if (!ex) return NULL;
    ps_json_add_string(ex, "backend", backend);
    ps_json_add_int(ex, "steps", r->steps);
    if (forward_only) ps_json_add_bool(ex, "forward_only", true);
    ps_json_add_int(ex, "micro_batches", g->m);
    ps_json_add_number(ex, "makespan_us", ps_trace_makespan(&r->trace));
    ps_json_add_int(ex, "dropped_records", (int64_t)r->trace.dropped);
    ps_json_add_number(ex, "total_us", r->total_us);
    cJSON *loss = cJSON_AddArrayToObject(ex, "loss");
    cJSON *us = cJSON_AddArrayToObject(ex, "step_us");
    for (int k = 0; k < r->steps; k++) {
        ps_json_add_number(loss, NULL, r->loss[k]);
        ps_json_add_number(us, NULL, r->step_us[k]);
    }
    if (r->mem.n_devices) {
        ps_json_add_bool(ex, "device_threads", !serial && r->mem.n_devices > 1);
        if (add_memory(ex, r, sim)) {
            cJSON_Delete(ex);
            return NULL;
        }
    }
    return ex;
}

cJSON *ps_report_bn_updates(const struct ps_spec *s, const struct ps_exec_result *r)
{
    cJSON *bn = cJSON_CreateObject();
    if (!bn) return NULL;
    ps_json_add_string(bn, "policy", ps_bn_policy_name(s->batchnorm));
    cJSON *layers = cJSON_AddArrayToObject(bn, "layers");
    for (int l = 0; l < s->n_layers && layers; l++) {
        if (s->layers[l].op != PS_OP_BATCHNORM) continue;
        const struct ps_layer_state *ls = &r->state.layers[l];
        cJSON *lo = cJSON_CreateObject();
        if (!lo) break;
        cJSON_AddItemToArray(layers, lo);
        ps_json_add_int(lo, "layer", l);
        cJSON *ups = cJSON_AddArrayToObject(lo, "updates");
        for (uint32_t k = 0; k < r->n_bn && ups; k++) {
            const struct ps_exec_bn_update *u = &r->bn[k];
            if (u->layer != l) continue;
            cJSON *uo = cJSON_CreateObject();
            if (!uo) break;
            cJSON_AddItemToArray(ups, uo);
            ps_json_add_int(uo, "step", u->step);
            ps_json_add_int(uo, "mb", u->mb);
            ps_json_add_string(uo, "phase", ps_exec_bn_phase_name((enum ps_exec_bn_phase)u->phase));
            ps_json_add_int(uo, "count", u->count);
            ps_json_add_number(uo, "factor", u->factor);
            cJSON_AddItemToObject(uo, "mean", float_array(u->mean, ls->channels));
            cJSON_AddItemToObject(uo, "var", float_array(u->var, ls->channels));
        }
        cJSON_AddItemToObject(lo, "running_mean", float_array(ls->running_mean, ls->channels));
        cJSON_AddItemToObject(lo, "running_var", float_array(ls->running_var, ls->channels));
        ps_json_add_int(lo, "num_batches_tracked", ls->num_batches_tracked);
    }
    return bn;
}

/* ---- comparison, calibration, costs ---------------------------------------------------------- */

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
    cJSON *ls = cJSON_AddArrayToObject(o, "measured_streams");
    for (uint32_t k = 0; k < c->n_lanes; k++) {
        const struct ps_compare_lane *l = &c->lanes[k];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_int(x, "gpu", l->device);
        ps_json_add_int(x, "cuda_stream", l->stream);
        ps_json_add_int(x, "tasks", l->n_tasks);
        ps_json_add_int(x, "pairs", (int64_t)l->pairs);
        ps_json_add_int(x, "inversions", (int64_t)l->inversions);
        cJSON_AddItemToArray(ls, x);
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
        if (c->layers[k].forward_fixed_us > 0)
            ps_json_add_number(x, "forward_fixed_us", c->layers[k].forward_fixed_us);
        if (c->layers[k].backward_fixed_us > 0)
            ps_json_add_number(x, "backward_fixed_us", c->layers[k].backward_fixed_us);
        if (c->layers[k].forward_sq_us > 0)
            ps_json_add_number(x, "forward_sq_us", c->layers[k].forward_sq_us);
        if (c->layers[k].backward_sq_us > 0)
            ps_json_add_number(x, "backward_sq_us", c->layers[k].backward_sq_us);
        if (c->layers[k].checkpointed_set) {
            ps_json_add_number(x, "checkpointed_us", c->layers[k].checkpointed_us);
            ps_json_add_number(x, "checkpointed_fixed_us", c->layers[k].checkpointed_fixed_us);
        }
        if (c->layers[k].recompute_set) {
            ps_json_add_number(x, "recompute_us", c->layers[k].recompute_us);
            ps_json_add_number(x, "recompute_fixed_us", c->layers[k].recompute_fixed_us);
        }
        if (c->layers[k].backward_recomputed_set)
            ps_json_add_number(x, "backward_recomputed_us", c->layers[k].backward_recomputed_us);
        if (c->layers[k].first_backward_us > 0)
            ps_json_add_number(x, "first_backward_us", c->layers[k].first_backward_us);
        cJSON_AddItemToArray(ls, x);
    }
    if (c->copy_bandwidth > 0 || c->copy_latency_us >= 0) {
        cJSON *cp = cJSON_AddObjectToObject(o, "copy");
        if (c->copy_bandwidth > 0) ps_json_add_number(cp, "bandwidth", c->copy_bandwidth);
        if (c->copy_latency_us >= 0) ps_json_add_number(cp, "latency_us", c->copy_latency_us);
    }
    if (c->launch_overhead_us >= 0) ps_json_add_number(o, "launch_overhead_us", c->launch_overhead_us);
    if (c->sq_max_scale > 0) ps_json_add_number(o, "sq_max_scale", c->sq_max_scale);
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

cJSON *ps_calib_fit_json(const struct ps_calib_fit *f)
{
    static const char *const term[PS_CALT__COUNT] = {
        "forward_fixed_us",  "forward_us_per_sample",          "backward_fixed_us",
        "backward_us_per_sample", "recompute_minus_forward_fixed_us",
        "recompute_minus_forward_us_per_sample", "checkpointed_minus_forward_fixed_us",
        "checkpointed_minus_forward_us_per_sample", "forward_us_per_sample_squared",
        "backward_us_per_sample_squared", "recomputed_backward_minus_backward_us_per_sample",
        "first_backward_minus_backward_us_per_sample"};
    static const char *const par[PS_CAL_OFFSET] = {"copy_bandwidth", "copy_latency_us",
                                                   "launch_overhead_us"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    ps_json_add_int(o, "runs", f->n_runs);
    ps_json_add_int(o, "observations", f->n_obs);
    ps_json_add_int(o, "parameters", f->n_params);
    ps_json_add_int(o, "rank", f->rank);
    ps_json_add_int(o, "host_bound_starts", f->n_host_bound);
    ps_json_add_int(o, "outliers", f->n_trimmed);
    ps_json_add_number(o, "rms_us", f->rms_us);
    cJSON *p = cJSON_AddArrayToObject(o, "partitions");
    for (int j = 0; p && j < f->n_parts; j++) {
        cJSON *x = cJSON_CreateObject(), *sd = cJSON_CreateObject();
        ps_json_add_int(x, "partition", j);
        cJSON *pin = NULL;
        for (int t = 0; t < PS_CALT__COUNT; t++) {
            ps_json_add_number(x, term[t], f->term[t][j]);
            ps_json_add_number(sd, term[t], f->term_sd[t][j]);
            if (f->term_free[t] && isfinite(f->term_free[t][j])) {
                if (!pin) pin = cJSON_CreateObject();
                ps_json_add_number(pin, term[t], f->term_free[t][j]);
            }
        }
        cJSON_AddItemToObject(x, "standard_error", sd);
        if (pin) cJSON_AddItemToObject(x, "constrained", pin);
        cJSON_AddItemToArray(p, x);
    }
    for (int k = 0; k < PS_CAL_OFFSET; k++) {
        cJSON *x = cJSON_AddObjectToObject(o, par[k]);
        ps_json_add_number(x, "value", f->fitted[k] ? f->value[k] : NAN);
        ps_json_add_number(x, "standard_error", f->fitted[k] ? f->sd[k] : NAN);
        if (k != PS_CAL_BANDWIDTH && isfinite(f->free_value[k]))
            ps_json_add_number(x, "unconstrained", f->free_value[k]);
    }
    return o;
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
