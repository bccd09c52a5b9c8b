/* cmp_report: text and JSON of a comparison and of a calibration (see cmp_report.h). */
#include "src/cli/cmp_report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"


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
            ps_viz_time(c->meas_makespan_us, a, sizeof(a)),
            ps_viz_time(c->sim_makespan_us, b, sizeof(b)),
            pct(c->makespan_error, x, sizeof(x), true));
    fprintf(f, "  aligned: %u nodes; %u tasks only simulated, %u only measured, %u measured "
               "names not in the graph\n",
            c->n_aligned, c->n_sim_only, c->n_meas_only, c->n_unmatched);
    if (c->start.n) {
        fprintf(f, "  start error:    median %s, p95 %s,", ps_viz_time(c->start.median, a, sizeof(a)),
                ps_viz_time(c->start.p95, b, sizeof(b)));
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
    if (c->n_lanes) {
        fprintf(f, "  order inversions on the measured CUDA streams: %llu of %llu pairs on %u "
                   "stream%s\n",
                (unsigned long long)c->lane_inversions, (unsigned long long)c->lane_pairs,
                c->n_lanes, c->n_lanes == 1 ? "" : "s");
        for (uint32_t k = 0; k < c->n_lanes; k++) {
            const struct ps_compare_lane *l = &c->lanes[k];
            fprintf(f, "    gpu %d stream %lld: %u tasks, %llu of %llu pairs\n", l->device,
                    (long long)l->stream, l->n_tasks, (unsigned long long)l->inversions,
                    (unsigned long long)l->pairs);
        }
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


void ps_trace_info_print(FILE *f, const struct ps_trace_read_info *in)
{
    fprintf(f, "  ranges recognised: %u pipescope, %u PyTorch pipelining (PP:), %u fairscale (chunk-part)",
            in->n_pipescope_names, in->n_pytorch, in->n_fairscale);
    if (in->n_by_id) fprintf(f, ", %u by node id", in->n_by_id);
    if (in->n_pytorch_other)
        fprintf(f, "; %u PyTorch communication/sharding actions (not tasks)", in->n_pytorch_other);
    fputc('\n', f);
    if (in->n_steps > 1)
        fprintf(f, "  steps: the trace holds %u training steps; step %u is compared (--step N "
                   "picks another), %u ranges of the others left out\n",
                in->n_steps, in->step, in->n_other_steps);
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


void ps_calib_print(FILE *f, const struct ps_calib *cal)
{
    char a[32], b[32];
    fprintf(f, "  fit: %u observations (%u outliers), %u parameters, rank %u, rms residual "
               "%s\n",
            cal->n_obs, cal->n_trimmed, cal->n_params, cal->rank,
            ps_viz_time(cal->rms_us, a, sizeof(a)));
    for (int j = 0; j < cal->n_parts; j++)
        fprintf(f, "  partition %d: forward %s, backward %s per sample\n", j,
                isfinite(cal->part_fwd_us[j]) ? ps_viz_time(cal->part_fwd_us[j], a, sizeof(a)) : "not measured",
                isfinite(cal->part_bwd_us[j]) ? ps_viz_time(cal->part_bwd_us[j], b, sizeof(b)) : "not measured");
    if (cal->fitted[PS_CAL_BANDWIDTH])
        fprintf(f, "  copy bandwidth %.4g GB/s\n", cal->value[PS_CAL_BANDWIDTH] / 1e9);
    else
        fprintf(f, "  copy bandwidth: not identifiable from this trace (kept the spec's)\n");
    if (cal->fitted[PS_CAL_LATENCY])
        fprintf(f, "  copy latency %s\n", ps_viz_time(cal->value[PS_CAL_LATENCY], a, sizeof(a)));
    else
        fprintf(f, "  copy latency: not identifiable from this trace (kept the spec's)\n");
    if (cal->fitted[PS_CAL_LAUNCH])
        fprintf(f, "  launch overhead %s (from %u host-bound starts)\n",
                ps_viz_time(cal->value[PS_CAL_LAUNCH], a, sizeof(a)), cal->n_host_bound);
    else
        fprintf(f, "  launch overhead: not identifiable from this trace (kept the spec's)\n");
}
