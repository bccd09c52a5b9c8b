/* pipescope diagnose: everything this machine can find out about a spec, as one report folder.
 *
 *   diagnose SPEC -o DIR [--chunks 1,2,4,...] [--no-drift] [--costs FILE] [--steps N]
 *
 * Steps: static checks with the no-phony what-if (check), the task graph (graph), the simulated
 * timeline (simulate), a real run on the CPU (and on CUDA when ps_exec_backend_available says
 * so), measured vs simulated (compare, plus a calibration of the costs to the CPU run), and a
 * BatchNorm drift sweep over chunks for plain and deferred BN (drift), and one forward-only
 * train-mode pass of the spec as it is (BN adaptation: does a pass without backward update the
 * running statistics, and from how many micro-batches; ps_bn_adaptation). Then:
 *
 *   DIR/index.html        static page, no JavaScript: findings, tables, linked SVGs
 *   DIR/report.json       the report JSON (spec, graph, analysis, simulation, execution,
 *                         comparison, drift)
 *   DIR/simulated.json, DIR/measured-cpu.json (-cuda.json)   Chrome traces for Perfetto
 *   DIR/graph.svg, graph-errors.svg, timeline.svg, drift-*.svg, costs-cpu.json
 *
 * and prints the main findings in plain words on stdout. Everything is written into DIR's
 * temporary twin, swapped in only when all of it succeeded (viz/out.c: an earlier DIR is
 * replaced then, and only when pipescope wrote it), so a failed diagnose leaves no partial
 * folder behind.
 * Exit codes: 0 ok (findings are results, not failures), 2 bad input or usage.
 */
#include <stdio.h>
#include <stdlib.h>

#include "src/cli/cli.h"
#include "src/cli/progress.h"
#include "src/study/study.h"

static double now_s(void)
{
    return ps_progress_now();
}

/* the study's progress hooks, shown by progress.h */
static void pr_begin(void *ctx, const char *phase)
{
    ps_progress_begin(ctx, phase);
}

static void pr_update(void *ctx, double frac, int i, int n, const char *unit)
{
    ps_progress_update(ctx, frac, i, n, unit);
}

static void pr_end(void *ctx, const char *how)
{
    ps_progress_end(ctx, how);
}

/* prints the warnings a phase left (from `from` on) and its time */
static void phase_done(const struct ps_cli *cli, const struct ps_diagnose *dg, int *from,
                       const char *what, double t_start)
{
    for (; *from < dg->n_warn; (*from)++) ps_cli_warn(cli, "%s", dg->warn[*from]);
    ps_cli_info(cli, "diagnose: %s (%.2f s)", what, now_s() - t_start);
}

int ps_cmd_diagnose(struct ps_cli *cli)
{
    const char *costs_path = NULL, *v;
    int *chunks = NULL, n_chunks = 0, steps = 0;
    bool drift_on = true;
    double budget_s = 60;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else if ((v = ps_cli_arg(cli, &k, "--budget"))) {
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || !(x >= 1) || x > 1e6) {
                free(chunks);
                return ps_cli_usage(cli, "--budget takes seconds, 1 or more, not '%s'", v);
            }
            budget_s = x;
        } else if (ps_cli_flag(cli, k, "--full")) budget_s = 0;
        else if ((v = ps_cli_arg(cli, &k, "--chunks"))) {
            free(chunks);
            chunks = NULL;
            if ((n_chunks = ps_cli_int_list(v, &chunks)) < 0)
                return ps_cli_usage(cli, "--chunks takes a list like 1,2,4,8, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--steps"))) {
            char *end;
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 1000) {
                free(chunks);
                return ps_cli_usage(cli, "--steps must be an integer in 1..1000, not '%s'", v);
            }
            steps = (int)x;
        } else if (ps_cli_flag(cli, k, "--no-drift")) drift_on = false;
        else {
            free(chunks);
            return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
        }
    }
    if (!cli->outdir || !*cli->outdir) {
        free(chunks);
        return ps_cli_usage(cli, "-o DIR is required");
    }
    if (costs_path && !*costs_path) {
        free(chunks);
        return ps_cli_usage(cli, "--costs needs a file");
    }
    double t_start = now_s();
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_ctx ctx;
    int code = ps_ctx_load(&ctx, cli, NULL);
    if (code) {
        free(chunks);
        return code;
    }
    struct ps_progress pr;
    ps_progress_init(&pr, cli);
    struct ps_diagnose_opts opts = {.costs_path = costs_path, .chunks = chunks,
                                    .n_chunks = n_chunks, .steps = steps, .drift = drift_on,
                                    .budget_s = budget_s, .outdir = cli->outdir,
                                    .progress = {&pr, pr_begin, pr_update, pr_end}};
    struct ps_diagnose dg;
    int warned = 0;
    if (ps_diagnose_init(&dg, ctx.spec, ctx.model, ctx.graph, &ctx.order, &opts, &d) ||
        ps_diagnose_check(&dg, &d))
        goto fail;
    phase_done(cli, &dg, &warned, "checks done", t_start);
    if (ps_diagnose_simulate(&dg, &d)) goto fail;
    ps_diagnose_schedules(&dg);
    ps_diagnose_advise(&dg);
    phase_done(cli, &dg, &warned, "simulated", t_start);
    ps_diagnose_execute(&dg);
    phase_done(cli, &dg, &warned, "runs done", t_start);
    ps_diagnose_drift(&dg);
    phase_done(cli, &dg, &warned, "drift done", t_start);
    ps_diagnose_adaptation(&dg);
    phase_done(cli, &dg, &warned, "BN adaptation done", t_start);
    /* into DIR's twin (main.c, viz/out.c), swapped in when the command has succeeded */
    if (ps_diagnose_write(&dg, cli->outdir_files, &d)) goto fail;
    if (cli->verbosity >= 0) {
        const struct ps_spec *spec = ctx.spec;
        printf("diagnose: %s -> %s/index.html (%.1f s)\n", spec->name ? spec->name : spec->path,
               cli->outdir, now_s() - t_start);
        for (int k = 0; k < dg.n_findings; k++) printf("  %s\n", dg.findings[k]);
    }
    code = PS_EXIT_OK;
    goto out;
fail:
    code = ps_cli_fail(&d, PS_EXIT_INPUT);
out:
    ps_diagnose_finish(&dg);
    free(chunks);
    ps_ctx_finish(&ctx);
    return code;
}
