/* pipescope sweep: simulate a spec over chunks x checkpoint modes x schedules.
 *
 *   sweep SPEC --chunks 1,2,4,...,64 [--checkpoint always,except_last,never]
 *              [--schedule gpipe,1f1b,...] [--costs FILE] [-o DIR] [--json FILE]
 *
 * Prints one row per configuration (makespan, throughput, bubble, peak activation memory,
 * recompute overhead), progress on stderr; -o DIR writes sweep.json and line plots
 * (makespan.svg, throughput.svg, bubble.svg, memory.svg; x = chunks, one line per
 * schedule/checkpoint pair). Configurations that cannot be built (chunks above the batch,
 * interleaved with m not a multiple of the devices) are skipped with a warning.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/viz.h"
#include "viz/report.h"

static int parse_names(const char *s, const char *const *names, int n_names, int *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        size_t len = strcspn(p, ",");
        int hit = -1;
        for (int k = 0; k < n_names; k++)
            if (strlen(names[k]) == len && !strncmp(names[k], p, len)) hit = k;
        if (hit < 0) return -1;
        out[n++] = hit;
        p += len;
        if (*p == ',') p++;
    }
    return n;
}

static const char *const ckpts[] = {"always", "except_last", "never"};

struct show {
    const struct ps_cli *cli;
    bool quiet;
    bool tty; /* stderr is a terminal: the one-line counter (a file or pipe gets no \r) */
};

static void before(void *ctx, int k, int n, const struct ps_sweep_row *r)
{
    const struct show *sh = ctx;
    if (sh->cli->verbosity >= 0 && sh->tty)
        fprintf(stderr, "\r\033[Ksweep: %d/%d %s %s chunks=%d", k, n,
                ps_schedule_ops(r->sched)->name, ckpts[r->ckpt], r->chunks);
}

static void after(void *ctx, int k, int n, const struct ps_sweep_row *r)
{
    (void)k, (void)n;
    const struct show *sh = ctx;
    const char *sched = ps_schedule_ops(r->sched)->name;
    if (!r->ok) {
        if (sh->cli->verbosity >= 0 && sh->tty) fputs("\r\033[K", stderr); /* clear the counter */
        if (r->bad_chunks) ps_cli_warn(sh->cli, "chunks=%d skipped: %s", r->chunks, r->why);
        else
            ps_cli_warn(sh->cli, "%s %s chunks=%d skipped: %s", sched, ckpts[r->ckpt], r->chunks,
                        r->why);
        return;
    }
    if (sh->quiet) return;
    char mb[32];
    printf("%-17s %-11s %6d %4d %4d %14.3f %14.1f %8.4f %12s %9.1f%%\n", sched, ckpts[r->ckpt],
           r->chunks, r->m, r->devices, r->makespan, r->throughput, r->bubble,
           ps_viz_bytes((double)r->peak, mb, sizeof(mb)), 100 * r->recompute);
    fflush(stdout);
}


/* -o DIR: sweep.json and one line plot per figure, x = chunks, one line per schedule/checkpoint */
static int write_folder(const struct ps_cli *cli, const cJSON *root, const struct ps_sweep_opts *o,
                        const struct ps_sweep_row *rows, struct ps_diag *d)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/sweep.json", cli->outdir_files);
    int code = 0, nc = o->n_chunks, nk = o->n_ckpt;
    if (ps_report_write(root, path, d)) code = ps_cli_fail(d, PS_EXIT_INPUT);
    static const char *const what[] = {"makespan", "throughput", "bubble", "memory"};
    static const char *const ylab[] = {"makespan", "samples/s", "bubble fraction",
                                       "peak activation memory"};
    static const enum ps_plot_unit yunit[] = {PS_UNIT_US, PS_UNIT_NONE, PS_UNIT_NONE,
                                              PS_UNIT_BYTES};
    int nser = o->n_sched * nk;
    double *x = malloc((size_t)nc * sizeof(double));
    double *y = malloc((size_t)nser * (size_t)nc * sizeof(double));
    struct ps_plot_series *ser = calloc((size_t)nser, sizeof(*ser));
    char(*names)[64] = calloc((size_t)nser, 64);
    for (int w = 0; w < 4 && !code && x && y && ser && names; w++) {
        for (int c = 0; c < nc; c++) x[c] = o->chunks[c];
        for (int s = 0; s < nser; s++) {
            snprintf(names[s], 64, "%s %s", ps_schedule_ops(o->sched[s / nk])->name,
                     ckpts[o->ckpt[s % nk]]);
            ser[s].name = names[s];
            ser[s].y = y + (size_t)s * nc;
            for (int c = 0; c < nc; c++) {
                const struct ps_sweep_row *r = &rows[s * nc + c];
                double val = w == 0 ? r->makespan : w == 1 ? r->throughput
                                            : w == 2   ? r->bubble
                                                       : (double)r->peak;
                y[(size_t)s * nc + c] = r->ok ? val : NAN;
            }
        }
        struct ps_line_plot lp = {.title = what[w], .xlabel = "chunks", .ylabel = ylab[w],
                                  .y_unit = yunit[w],
                                  .n = (uint32_t)nc, .x = x, .log2_x = true, .y_zero = true,
                                  .n_series = (uint32_t)nser, .series = ser};
        snprintf(path, sizeof(path), "%s/%s.svg", cli->outdir_files, what[w]);
        if (ps_plot_lines_file(&lp, path, d)) code = ps_cli_fail(d, PS_EXIT_INPUT);
    }
    free(x);
    free(y);
    free(ser);
    free(names);
    return code;
}

int ps_cmd_sweep(struct ps_cli *cli)
{
    const char *scheds[PS_SCHED__COUNT];
    for (int k = 0; k < PS_SCHED__COUNT; k++) scheds[k] = ps_schedule_ops(k)->name;
    const char *chunks_s = NULL, *ck_s = NULL, *sc_s = NULL, *costs_path = NULL, *v;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--chunks"))) chunks_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--checkpoint"))) ck_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--schedule"))) sc_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    int *chunks = NULL, nc;
    if (!chunks_s) chunks_s = "1,2,4,8,16,32,64";
    if ((nc = ps_cli_int_list(chunks_s, &chunks)) < 0)
        return ps_cli_usage(cli, "--chunks: expected a list like 1,2,4,8");
    int ck[8], sc[2 * PS_SCHED__COUNT], nk = 0, ns = 0;
    if (ck_s && (nk = parse_names(ck_s, ckpts, 3, ck, 8)) <= 0) {
        free(chunks);
        return ps_cli_usage(cli, "--checkpoint: expected always,except_last,never");
    }
    if (sc_s && strcmp(sc_s, "all") == 0)
        for (ns = 0; ns < PS_SCHED__COUNT; ns++) sc[ns] = ns;
    else if (sc_s && (ns = parse_names(sc_s, scheds, PS_SCHED__COUNT, sc, 2 * PS_SCHED__COUNT)) <= 0) {
        free(chunks);
        return ps_cli_usage(cli, "--schedule: expected %s", ps_schedule_names());
    }
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_costs *costs = NULL;
    struct ps_sweep_row *rows = NULL;
    int code = 0;
    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d) ||
        ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    enum ps_checkpoint ckv[8];
    enum ps_schedule scv[2 * PS_SCHED__COUNT];
    for (int k = 0; k < nk; k++) ckv[k] = (enum ps_checkpoint)ck[k];
    for (int k = 0; k < ns; k++) scv[k] = (enum ps_schedule)sc[k];
    if (!nk) ckv[nk++] = spec->checkpoint;
    if (!ns) scv[ns++] = spec->schedule;
    int total = nc * nk * ns;
    rows = calloc((size_t)total, sizeof(*rows));
    if (!rows) {
        code = ps_cli_fail(&(struct ps_diag){.where = "sweep", .msg = "out of memory"}, PS_EXIT_INPUT);
        goto out;
    }
    struct show sh = {cli, cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-")),
                      isatty(STDERR_FILENO) == 1};
    if (!sh.quiet)
        printf("%-17s %-11s %6s %4s %4s %14s %14s %8s %12s %10s\n", "schedule", "checkpoint",
               "chunks", "m", "dev", "makespan_us", "samples/s", "bubble", "peak_mem", "recompute");
    struct ps_sweep_opts so = {.chunks = chunks, .n_chunks = nc, .ckpt = ckv, .n_ckpt = nk,
                               .sched = scv, .n_sched = ns, .before = before, .after = after,
                               .ctx = &sh};
    int n_ok = ps_study_sweep(spec, model, costs, &so, rows, &d);
    if (cli->verbosity >= 0)
        fprintf(stderr, "%ssweep: %d configurations done.\n", sh.tty ? "\r\033[K" : "", total);
    if (n_ok == 0) {
        /* nothing to report: the last configuration's error says why */
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    cJSON *root = cli->json || cli->outdir ? ps_sweep_json(rows, total) : NULL;
    if (cli->json && ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
    if (!code && cli->outdir) code = write_folder(cli, root, &so, rows, &d);
    cJSON_Delete(root);
out:
    free(rows);
    free(chunks);
    ps_costs_destroy(costs);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
