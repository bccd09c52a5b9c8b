/* pipescope advise: which configuration to run (src/study/advise.c does the search).
 *
 *   advise SPEC [--memory-cap BYTES|auto] [--devices N] [--objective throughput|balanced]
 *               [--costs FILE] [--train N] [--no-drift | --predict-drift] [--exhaustive]
 *               [--all] [-o DIR] [--json FILE]
 *
 * Prints the Pareto front (throughput, peak memory per device, predicted BN drift) and the
 * recommendation in words; -o DIR writes advise.json, pareto.svg and recommended.json (the spec
 * of the recommended configuration, ready to run). The drift prediction runs one CPU forward
 * pass; it is left out (with the reason) when that pass would exceed 5 GFLOP unless
 * --predict-drift asks for it.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/report.h"
#include "viz/viz.h"

static int write_text(FILE *f, void *ctx, struct ps_diag *d)
{
    (void)d;
    fputs((const char *)ctx, f);
    fputc('\n', f);
    return ferror(f) ? -EIO : 0;
}

int ps_cmd_advise(struct ps_cli *cli)
{
    struct ps_advise_opts o = {.objective = PS_ADVISE_THROUGHPUT, .predict_drift = true};
    bool no_drift = false, force_drift = false, all = false;
    const char *costs_path = NULL, *v;
    for (int k = 0; k < cli->argc; k++) {
        char *end;
        if ((v = ps_cli_arg(cli, &k, "--memory-cap"))) {
            if (!strcmp(v, "auto")) {
                o.cap_auto = true;
                continue;
            }
            o.memory_cap = strtod(v, &end);
            if (end == v || *end || !(o.memory_cap > 0) || o.memory_cap > 1e30)
                return ps_cli_usage(cli, "--memory-cap must be a number of bytes > 0 or auto, "
                                    "not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--devices"))) {
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 4096)
                return ps_cli_usage(cli, "--devices must be an integer in 1..4096, not '%s'", v);
            o.devices = (int)x;
        } else if ((v = ps_cli_arg(cli, &k, "--train"))) {
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 100000)
                return ps_cli_usage(cli, "--train must be a number of steps in 1..100000, not "
                                    "'%s'", v);
            o.train_steps = (int)x;
        } else if ((v = ps_cli_arg(cli, &k, "--objective"))) {
            if (!strcmp(v, "balanced")) o.objective = PS_ADVISE_BALANCED;
            else if (strcmp(v, "throughput"))
                return ps_cli_usage(cli, "--objective: expected throughput or balanced");
        } else if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else if (ps_cli_flag(cli, k, "--no-drift")) no_drift = true;
        else if (ps_cli_flag(cli, k, "--predict-drift")) force_drift = true;
        else if (ps_cli_flag(cli, k, "--exhaustive")) o.no_prune = true;
        else if (ps_cli_flag(cli, k, "--all")) all = true;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (no_drift && force_drift)
        return ps_cli_usage(cli, "--no-drift and --predict-drift exclude each other");
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_costs *costs = NULL;
    struct ps_advise a;
    memset(&a, 0, sizeof(a));
    char *rec = NULL, why[160] = "";
    cJSON *root = NULL;
    int code = 0;
    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d) ||
        ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (o.devices > spec->n_layers) {
        code = ps_cli_usage(cli, "--devices %d: the model has only %d layers", o.devices,
                            spec->n_layers);
        goto out;
    }
    if (no_drift) {
        o.predict_drift = false;
        snprintf(why, sizeof(why), "not predicted (--no-drift)");
    } else if (!force_drift) {
        o.predict_drift = ps_study_advise_drift_default(spec, model, why, sizeof(why));
    }
    o.drift_why = why;
    o.costs = costs;
    if (ps_study_advise(spec, model, &o, &a, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (a.recommended >= 0 && ps_study_advise_spec(spec, &a.points[a.recommended], &rec, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    bool quiet = cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-"));
    if (!quiet) ps_advise_table(&a, stdout, all);
    if (cli->verbosity > 0) fprintf(stderr, "advise: search %.3f s\n", a.search_s);
    if (cli->json || cli->outdir) {
        root = ps_report_new();
        if (!root || ps_report_add_spec(root, spec) || ps_json_set(root, "advise", ps_advise_json(&a))) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
    }
    if (cli->json && ps_report_write(root, cli->json, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (cli->outdir) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/advise.json", cli->outdir_files);
        int rc = ps_report_write(root, path, &d);
        snprintf(path, sizeof(path), "%s/pareto.svg", cli->outdir_files);
        if (!rc && a.recommended >= 0) rc = ps_advise_plot(&a, path, &d);
        snprintf(path, sizeof(path), "%s/recommended.json", cli->outdir_files);
        if (!rc && rec) rc = ps_out_write(path, write_text, rec, &d);
        if (rc) code = ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    if (!code && a.recommended < 0) code = PS_EXIT_FOUND;
out:
    cJSON_Delete(root);
    free(rec);
    ps_advise_finish(&a);
    ps_costs_destroy(costs);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
