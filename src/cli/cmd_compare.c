/* pipescope compare: a measured timeline against the simulation of the same spec.
 *
 *   compare SPEC --measured TRACE... [--simulated TRACE] [--costs FILE]
 *                [--tolerance makespan=0.2,task=0.5[,start=0.1]] [--calibrate COSTS.json]
 *                [--unit sample|micro_batch] [--step N] [--json FILE] [--svg FILE] [--dot FILE]
 *
 * TRACE is a Chrome trace: one written by pipescope (`run --trace`, `simulate --trace`) or by
 * the PyTorch profiler (examples/PROFILER.md): ranges named F(i,j)..., PyTorch pipelining's
 * PP:<stage><action><mb> or fairscale's chunk<i>-part<j>; .json or .json.gz. --measured may be
 * repeated and may name a folder: one file per rank, put on one clock (src/trace_read.h); a
 * large file is read with progress on stderr. A trace of several training steps gives its last
 * one, or step N with --step N (from 0). Without --simulated the
 * spec is simulated here (its costs, or --costs). Prints makespan error, per-task start and
 * duration errors, order inversions, dependency violations, bubble, recompute overhead and
 * copy/compute overlap; --svg draws measured lanes above simulated lanes on one time axis,
 * --dot colours the graph by each task's relative duration error. --calibrate fits the cost
 * model to the measured trace, writes it as a costs file (sim/COSTS.md), re-simulates and shows
 * the errors before and after.
 * Exit codes: 0 within tolerance, 1 a tolerance exceeded (or the measurement breaks a
 * dependency), 2 bad input or usage.
 */
#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cmp_report.h"
#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/report.h"
#include "viz/viz.h"
#include "sim/calibrate.h"

struct progress {
    const struct ps_cli *cli;
    int last_pct;
    uint32_t last_file;
};

/* "reading rank1.json: 412 MiB (40%)" every 10% once 64 MiB were read */
static void on_progress(void *ctx, uint32_t file, const char *path, uint64_t bytes,
                        uint64_t done, uint64_t size)
{
    struct progress *p = ctx;
    if (p->cli->verbosity < 0 || bytes < ((uint64_t)64 << 20)) return;
    if (file != p->last_file) p->last_file = file, p->last_pct = 0;
    if (size) { /* a plain file: every 10% */
        int pct = (int)(100.0 * (double)done / (double)size);
        if (pct < p->last_pct + 10) return;
        p->last_pct = pct - pct % 10;
        fprintf(stderr, "compare: reading %s: %llu MiB (%d%%)\n", path,
                (unsigned long long)(bytes >> 20), pct);
    } else { /* gzip or a pipe: every 256 MiB of text */
        int step = (int)(bytes >> 28);
        if (step <= p->last_pct) return;
        p->last_pct = step;
        fprintf(stderr, "compare: reading %s: %llu MiB of text\n", path,
                (unsigned long long)(bytes >> 20));
    }
}

/* --measured values: files, or folders expanded to their trace files */
struct paths {
    char **v;
    uint32_t n;
};

static int add_measured(struct paths *p, const char *arg, struct ps_diag *d)
{
    struct stat st;
    char **list = NULL;
    uint32_t n = 0;
    if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        int rc = ps_trace_list_folder(arg, &list, &n, d);
        if (rc) return rc;
    } else {
        list = malloc(sizeof(*list));
        if (!list || !(list[0] = strdup(arg))) {
            free(list);
            return ps_diag_set(d, -ENOMEM, arg, "out of memory");
        }
        n = 1;
    }
    char **q = realloc(p->v, (p->n + n) * sizeof(*q));
    if (!q) {
        for (uint32_t k = 0; k < n; k++) free(list[k]);
        free(list);
        return ps_diag_set(d, -ENOMEM, arg, "out of memory");
    }
    p->v = q;
    memcpy(p->v + p->n, list, n * sizeof(*list));
    p->n += n;
    free(list);
    return 0;
}

/* what the summary names besides the results */
struct shown {
    const char *meas_path, *sim_path, *cal_path, *costs;
    uint32_t n_files;
    int exceeded;
    const char *why;
};

static void print_result(const struct ps_spec *spec, const struct ps_graph *g,
                         const struct ps_trace *tm, const struct ps_trace_read_info *info,
                         const struct ps_compare *cmp, const struct ps_calib *cal,
                         const struct ps_compare *cmp2, const struct shown *sh)
{
    char line[256];
    printf("compare: %s (%s)\n", spec->path, spec->name ? spec->name : "");
    printf("  measured:  %s%s (%s trace, %u tasks mapped: %u by id, %u by name; %u events "
           "ignored)\n",
           sh->n_files > 1 ? "" : sh->meas_path, sh->n_files > 1 ? "several files" : "", info->pipescope ? ps_trace_source_name(tm->source) : info->kineto ? "kineto" : "profiler",
           tm->n - cmp->n_unmatched, info->n_by_id, info->n_by_name,
           info->n_ignored);
    ps_trace_info_print(stdout, info);
    printf("  simulated: %s\n",
           sh->sim_path ? sh->sim_path : sh->costs ? sh->costs : "from the spec (roofline costs)");
    ps_cmp_print(stdout, g, cmp);
    if (cal) {
        printf("calibration (written to %s):\n", sh->cal_path);
        ps_calib_print(stdout, cal);
        char a[256];
        printf("  before: %s\n", ps_cmp_oneline(cmp, line, sizeof(line)));
        printf("  after:  %s\n", ps_cmp_oneline(cmp2, a, sizeof(a)));
    }
    if (sh->exceeded) printf("result: exceeds the tolerance:\n%s", sh->why);
    else printf("result: within tolerance (%s)\n", ps_cmp_oneline(cmp, line, sizeof(line)));
}

/* what --svg, --dot and --json write */
struct outputs {
    const struct ps_spec *spec;
    const struct ps_graph *g;
    const struct ps_study_sim *run;
    const struct ps_trace *sim, *tm;
    const struct ps_trace_read_info *info;
    const struct ps_compare *cmp;
    const struct ps_calib *cal; /* NULL without --calibrate */
    const struct ps_compare *cmp2;
    const struct ps_tolerance *tol;
    int exceeded;
    const char *why, *dot;
};

static int write_outputs(const struct ps_cli *cli, const struct outputs *o, struct ps_diag *d)
{
    if (cli->svg) {
        struct ps_gantt_opts go = {.title = o->spec->name, .label = "measured", .label2 = "simulated"};
        if (o->sim == &o->run->sim.trace) {
            go.issue2_us = o->run->sim.issue_us;
            go.launch2_us = o->run->sim.launch_us;
        }
        if (ps_plot_gantt_file(o->g, o->tm, o->sim, &go, cli->svg, d)) {
            return ps_cli_fail(d, PS_EXIT_INPUT);
        }
    }
    if (o->dot) {
        double *errs = ps_compare_node_errors(o->cmp, o->g);
        struct ps_dot_opts dop;
        ps_dot_opts_init(&dop);
        dop.tasks_only = o->g->n_nodes > 400;
        dop.node_value = errs;
        dop.value_name = "duration error (measured - simulated) / measured";
        dop.title = o->spec->name;
        int rc = !errs ? ps_diag_set(d, -ENOMEM, "compare", "out of memory")
                       : ps_dot_write_file(o->g, &dop, o->dot, d);
        free(errs);
        if (rc) return ps_cli_fail(d, PS_EXIT_INPUT);
    }
    if (cli->json) {
        cJSON *root = ps_report_new();
        ps_report_add_spec(root, o->spec);
        ps_report_add_graph(root, o->g);
        cJSON *cj = ps_cmp_json(o->g, o->cmp, o->tm, o->info, o->tol, o->exceeded, o->why);
        if (o->cal && cj) cJSON_AddItemToObject(cj, "calibration", ps_calib_json(o->cal, o->cmp, o->cmp2));
        ps_json_set(root, "comparison", cj);
        int rc = ps_report_write(root, cli->json, d);
        cJSON_Delete(root);
        if (rc) return ps_cli_fail(d, PS_EXIT_INPUT);
    }
    return 0;
}

int ps_cmd_compare(struct ps_cli *cli)
{
    const char *meas_path = NULL, *meas_arg[64], *sim_path = NULL, *tol_s = NULL, *cal_path = NULL,
               *costs_path = NULL, *dot = NULL, *unit = "sample", *v;
    int n_meas = 0, step = -1;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--measured"))) {
            if (n_meas >= 64) return ps_cli_usage(cli, "--measured: at most 64 (use a folder)");
            if (!*v) return ps_cli_usage(cli, "--measured TRACE is required");
            meas_arg[n_meas++] = meas_path = v;
        }
        else if ((v = ps_cli_arg(cli, &k, "--simulated"))) sim_path = v;
        else if ((v = ps_cli_arg(cli, &k, "--tolerance"))) tol_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--calibrate"))) cal_path = v;
        else if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else if ((v = ps_cli_arg(cli, &k, "--dot"))) dot = v;
        else if ((v = ps_cli_arg(cli, &k, "--unit"))) unit = v;
        else if ((v = ps_cli_arg(cli, &k, "--step"))) {
            char *end;
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 0 || x > 1000000000)
                return ps_cli_usage(cli, "--step must be a training step number >= 0, not '%s'", v);
            step = (int)x;
        }
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    if (!meas_path || !*meas_path) return ps_cli_usage(cli, "--measured TRACE is required");
    if ((sim_path && !*sim_path) || (cal_path && !*cal_path) || (costs_path && !*costs_path) ||
        (dot && !*dot))
        return ps_cli_usage(cli, "--simulated, --calibrate, --costs and --dot need a file");
    if (strcmp(unit, "sample") && strcmp(unit, "micro_batch"))
        return ps_cli_usage(cli, "--unit must be sample or micro_batch, not '%s'", unit);
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_tolerance tol;
    ps_tolerance_init(&tol);
    if (tol_s && ps_tolerance_parse(tol_s, &tol, &d)) return ps_cli_fail(&d, PS_EXIT_INPUT);

    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_costs *costs = NULL;
    struct ps_study_sim run, run2;
    memset(&run, 0, sizeof(run));
    memset(&run2, 0, sizeof(run2));
    struct ps_trace tm, ts;
    memset(&tm, 0, sizeof(tm));
    memset(&ts, 0, sizeof(ts));
    struct ps_trace_read_info info, sinfo;
    memset(&info, 0, sizeof(info));
    memset(&sinfo, 0, sizeof(sinfo));
    struct ps_compare cmp, cmp2;
    memset(&cmp, 0, sizeof(cmp));
    memset(&cmp2, 0, sizeof(cmp2));
    struct ps_calib cal;
    memset(&cal, 0, sizeof(cal));
    struct paths mp = {0};
    int code = PS_EXIT_OK;
    char why[2048] = "";

    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    for (int k = 0; k < spec->n_warnings; k++) ps_cli_warn(cli, "%s", spec->warnings[k]);
    if (ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    struct ps_variant o;
    ps_variant_from_spec(spec, &o);
    if (ps_study_simulate(spec, model, &o, NULL, costs, &run, &d)) {
        code = ps_cli_fail(&d, run.stuck ? PS_EXIT_FOUND : PS_EXIT_INPUT);
        goto out;
    }
    const struct ps_graph *g = run.g;
    for (int k = 0; k < n_meas; k++)
        if (add_measured(&mp, meas_arg[k], &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
    struct progress pr = {cli, 0, 0};
    struct ps_trace_read_opts ro = {on_progress, &pr, step};
    if (ps_trace_read_files((const char *const *)mp.v, mp.n, g, &ro, &tm, &info, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    const struct ps_trace *sim = &run.sim.trace;
    if (sim_path) {
        if (ps_trace_read(sim_path, g, &ts, &sinfo, &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
        sim = &ts;
    }
    if (ps_compare_run(g, sim, &tm, &cmp, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    int exceeded = ps_compare_check(&cmp, &tol, why, sizeof(why));
    if (cal_path) {
        if (ps_study_calibrate(spec, model, &run, &tm, !strcmp(unit, "sample"), 0, &cal, &run2,
                               &cmp2, &d) ||
            ps_costs_write(cal.costs, cal_path, &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
    }
    bool quiet = cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-"));
    if (!quiet) {
        struct shown sh = {meas_path, sim_path, cal_path, costs ? (costs_path ? costs_path : spec->costs) : NULL,
                           mp.n, exceeded, why};
        print_result(spec, g, &tm, &info, &cmp, cal_path ? &cal : NULL, &cmp2, &sh);
    }
    struct outputs outs = {spec, g, &run, sim, &tm, &info, &cmp, cal_path ? &cal : NULL, &cmp2, &tol,
                           exceeded, why, dot};
    if ((code = write_outputs(cli, &outs, &d))) goto out;
    code = exceeded ? PS_EXIT_FOUND : PS_EXIT_OK;
out:
    for (uint32_t k = 0; k < mp.n; k++) free(mp.v[k]);
    free(mp.v);
    ps_calib_finish(&cal);
    ps_compare_finish(&cmp);
    ps_compare_finish(&cmp2);
    ps_trace_read_info_finish(&info);
    ps_trace_read_info_finish(&sinfo);
    ps_trace_finish(&tm);
    ps_trace_finish(&ts);
    ps_study_sim_finish(&run);
    ps_study_sim_finish(&run2);
    ps_costs_destroy(costs);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
