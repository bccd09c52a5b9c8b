/* cli: the pipescope command line. One file per subcommand (cmd_*.c), one table in main.c.
 *
 * Exit codes (src/HACKING.md): 0 ok, 1 violations found or a comparison exceeded tolerance,
 * 2 bad input or usage, 3 a backend is unavailable. Human-readable text goes to stdout,
 * warnings, progress and the one-line error to stderr. Only this folder may exit or print.
 */
#ifndef PS_CLI_H
#define PS_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "src/analysis.h"
#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"

enum { PS_EXIT_OK = 0, PS_EXIT_FOUND = 1, PS_EXIT_INPUT = 2, PS_EXIT_BACKEND = 3 };

/* Options every command shares (src/HACKING.md). */
struct ps_cli {
    const char *cmd;
    const char *spec_path;
    const char *json;  /* --json FILE ("-" = stdout) */
    const char *trace; /* --trace FILE */
    const char *svg;   /* --svg FILE */
    const char *outdir;/* -o DIR */
    const char *outdir_files; /* where -o DIR's files are written: DIR's temporary twin until the
                                 command has succeeded (viz/out.c ps_out_folder), set by main.c */
    int verbosity;     /* -q: -1, default 0, -v: 1 */
    int argc;          /* command-specific arguments left after the shared ones */
    char **argv;
};

/* A loaded spec with everything derived from it. */
struct ps_ctx {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *graph;
    struct ps_order order;
};

struct ps_cmd {
    const char *name;
    const char *summary;
    const char *usage;
    int (*run)(struct ps_cli *cli);
    /* `pipescope CMD --help`: what it is for, every option with its default, an example */
    const char *help;
    bool outdir; /* takes -o DIR (a folder pipescope writes as a whole) */
};

/* Prints "pipescope: <where>: <message>" on stderr and returns PS_EXIT_INPUT (or `code`). */
int ps_cli_fail(const struct ps_diag *d, int code);
/* Error lines name `user` (an output folder as given) where they would name `twin` (the
 * temporary twin its files are written into). */
void ps_cli_alias_folder(const char *twin, const char *user);
int ps_cli_usage(const struct ps_cli *cli, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ps_cli_warn(const struct ps_cli *cli, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ps_cli_info(const struct ps_cli *cli, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Loads the spec, builds model, graph (with `opts` when not NULL) and the engine order; prints
 * spec warnings. Returns 0 or an exit code after printing the error. */
int ps_ctx_load(struct ps_ctx *ctx, const struct ps_cli *cli, const struct ps_variant *opts);
/* Rebuilds graph and order with other options on the same spec. */
int ps_ctx_rebuild(struct ps_ctx *ctx, const struct ps_variant *opts, struct ps_diag *d);
void ps_ctx_finish(struct ps_ctx *ctx);
/* Replaces the graph and order by those of the plan in PATH (PyTorch's schedule CSV or a JSON
 * plan). -EDEADLK when the plan cannot run, with *cycle (malloc'ed) the cycle of waits. */
int ps_ctx_use_plan(struct ps_ctx *ctx, const char *path, char **cycle, struct ps_diag *d);

/* Argument helpers for cmd_*.c: "--name value" or "--name=value". Returns the value and advances
 * *k, or NULL when argv[*k] is not that option. */
const char *ps_cli_arg(struct ps_cli *cli, int *k, const char *name);
bool ps_cli_flag(struct ps_cli *cli, int k, const char *name);
/* Parses "1,2,4,8" into a new int array; returns count or -1. */
int ps_cli_int_list(const char *s, int **out);

int ps_cmd_check(struct ps_cli *cli);
int ps_cmd_graph(struct ps_cli *cli);
int ps_cmd_simulate(struct ps_cli *cli);
int ps_cmd_sweep(struct ps_cli *cli);
int ps_cmd_balance(struct ps_cli *cli);
int ps_cmd_schedule(struct ps_cli *cli);
int ps_cmd_run(struct ps_cli *cli);
int ps_cmd_compare(struct ps_cli *cli);
int ps_cmd_calibrate(struct ps_cli *cli);
int ps_cmd_diagnose(struct ps_cli *cli);
int ps_cmd_drift(struct ps_cli *cli);
int ps_cmd_advise(struct ps_cli *cli);

extern const struct ps_cmd ps_commands[];

#endif
