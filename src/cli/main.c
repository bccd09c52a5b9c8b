/* pipescope: git-style subcommands over one command table (uftrace's layout).
 *
 *   pipescope COMMAND SPEC [--json FILE] [--trace FILE] [--svg FILE] [-o DIR] [-q|-v] [options]
 */
#include <stdio.h>
#include <string.h>

#include "src/cli/cli.h"
#include "ps_config.h"
#include "viz/viz.h"

/* LeakSanitizer reads this in sanitized builds: Graphviz's layout engine (libgvc) leaks
 * internally on every layout (TOOLCHAIN.md). Only gvc: leaks through cgraph alone are ours. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libgvc.so\n";
}

static int cmd_version(struct ps_cli *cli)
{
    printf("pipescope %s\n", PS_VERSION);
    for (int k = 0; k < cli->argc; k++)
        if (strcmp(cli->argv[k], "--build-options") == 0) {
            printf("backends: cpu%s\n", PS_HAVE_CUDA ? " cuda" : "");
            printf("cuda: %s\n", PS_HAVE_CUDA ? "built (nvcc, cuBLAS, CUPTI)"
                                              : "not built (no nvcc at configure time)");
        }
    return 0;
}

const struct ps_cmd ps_commands[] = {
    {"check", "static checks: cycles, ordering invariants, races, memory, no-phony what-if",
     "check SPEC [--json FILE]", ps_cmd_check},
    {"graph", "the task graph as DOT/SVG/JSON, or the engine's execution order",
     "graph SPEC [--order] [--forward|--backward|--all] [--tasks] [--dot FILE] [--svg FILE] "
     "[--json FILE] [--no-phony] [--iteration N]",
     ps_cmd_graph},
    {"run", "train for real (cpu reference kernels): loss, BN statistics, measured timeline; "
     "--forward-only: train-mode forwards only (BN adaptation)",
     "run SPEC [--backend cpu|cuda] [--virtual-devices] [--steps N] [--forward-only] "
     "[--save-state DIR] [--trace FILE] [--json FILE]",
     ps_cmd_run},
    {"drift", "BN running-statistics drift vs a full-batch reference; convergence (--train); "
     "which settings adapt BN statistics without backward (--forward-only)",
     "drift SPEC [--chunks 1,2,4,8,16,32] [--policy plain,deferred,grad-only] "
     "[--checkpoint always,except_last,never] [--steps N] [--train N [--eval-rows R] | "
     "--forward-only] [-o DIR] [--json FILE] [--svg FILE]",
     ps_cmd_drift},
    {"compare", "measured vs simulated timeline: errors, inversions, bubble; calibration",
     "compare SPEC --measured TRACE [--simulated TRACE] [--costs FILE] "
     "[--tolerance makespan=0.2,task=0.5[,start=0.1]] [--calibrate COSTS.json] "
     "[--unit sample|micro_batch] [--json FILE] [--svg FILE] [--dot FILE]",
     ps_cmd_compare},
    {"diagnose", "everything this machine can do, as a report folder with index.html",
     "diagnose SPEC -o DIR [--chunks 1,2,4,...] [--no-drift] [--costs FILE] [--steps N]", ps_cmd_diagnose},
    {"simulate", "simulated timeline: makespan, bubble, memory, recompute, BN update order",
     "simulate SPEC [--actions FILE] [--no-phony] [--optimizer] [--costs FILE] [--trace FILE] "
     "[--svg FILE] [--json FILE]",
     ps_cmd_simulate},
    {"sweep", "simulate over chunks x checkpoint x schedule: table, JSON, line plots",
     "sweep SPEC [--chunks 1,2,4,...] [--checkpoint always,except_last,never] "
     "[--schedule gpipe,1f1b,interleaved-1f1b,zb-h1] [--costs FILE] [-o DIR] [--json FILE]",
     ps_cmd_sweep},
    {"balance", "exact min-max partition vs the spec's balance and torchgpipe's heuristic",
     "balance SPEC [--by time|memory] [--partitions N] [--memory-cap BYTES] [--costs FILE] "
     "[--json FILE]",
     ps_cmd_balance},
    {"version", "version and build options", "version [--build-options]", cmd_version},
    {NULL, NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pipescope COMMAND SPEC [options]\n\ncommands:\n");
    for (const struct ps_cmd *c = ps_commands; c->name; c++)
        fprintf(f, "  %-9s %s\n", c->name, c->summary);
    fprintf(f, "\nshared options: --json FILE (- for stdout), --trace FILE, --svg FILE, -o DIR, "
               "-q, -v\n'pipescope help COMMAND' shows a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? PS_EXIT_INPUT : 0;
    }
    if (strcmp(argv[1], "help") == 0) {
        for (const struct ps_cmd *c = ps_commands; c->name && argc > 2; c++)
            if (strcmp(c->name, argv[2]) == 0) {
                printf("usage: pipescope %s\n  %s\n", c->usage, c->summary);
                return 0;
            }
        usage(stdout);
        return 0;
    }
    const struct ps_cmd *cmd = NULL;
    for (const struct ps_cmd *c = ps_commands; c->name; c++)
        if (strcmp(c->name, argv[1]) == 0) cmd = c;
    if (!cmd) {
        fprintf(stderr, "pipescope: unknown command '%s'\n", argv[1]);
        usage(stderr);
        return PS_EXIT_INPUT;
    }
    /* shared options; the rest goes to the command */
    struct ps_cli cli = {.cmd = cmd->name};
    static char *rest[4096];
    int nrest = 0;
    for (int k = 2; k < argc; k++) {
        const char *a = argv[k];
        const char **slot = NULL;
        if (!strcmp(a, "--json")) slot = &cli.json;
        else if (!strcmp(a, "--trace")) slot = &cli.trace;
        else if (!strcmp(a, "--svg")) slot = &cli.svg;
        else if (!strcmp(a, "-o")) slot = &cli.outdir;
        if (slot) {
            if (k + 1 >= argc) {
                fprintf(stderr, "pipescope %s: option %s needs a value\n", cmd->name, a);
                return PS_EXIT_INPUT;
            }
            *slot = argv[++k];
            continue;
        }
        if (!strcmp(a, "-q")) cli.verbosity = -1;
        else if (!strcmp(a, "-v")) cli.verbosity = 1;
        else if (a[0] != '-' && !cli.spec_path && strcmp(cmd->name, "version") != 0)
            cli.spec_path = a;
        else if (nrest < (int)(sizeof(rest) / sizeof(rest[0])))
            rest[nrest++] = argv[k];
    }
    cli.argc = nrest;
    cli.argv = rest;
    /* every output file of a command appears when it ends, or none when it fails (viz/out.c,
       O4); diagnose builds its folder as DIR.tmp and renames it itself */
    bool defer = strcmp(cmd->name, "diagnose") != 0;
    if (defer) ps_out_defer_begin();
    int code = cmd->run(&cli);
    if (defer) {
        struct ps_diag d;
        ps_diag_clear(&d);
        if (ps_out_defer_end(code == PS_EXIT_OK || code == PS_EXIT_FOUND, &d))
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    return code;
}
