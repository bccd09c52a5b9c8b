/* pipescope: git-style subcommands over one command table (uftrace's layout).
 *
 *   pipescope COMMAND SPEC [--json FILE] [--trace FILE] [--svg FILE] [-o DIR] [-q|-v] [options]
 */
#include <errno.h>
#include <stdbool.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "src/cli/cli.h"
#include "ps_config.h"
#include "viz/viz.h"

/* LeakSanitizer reads this in sanitized builds: Graphviz's layout engine (libgvc) leaks
 * internally on every layout (src/HACKING.md, toolchain facts). Only gvc: leaks through
 * cgraph alone are ours. */
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

/* Each command's --help text: purpose, every option with its default, an example. The spec
 * format is src/SPEC.md; what the checks mean is src/SEMANTICS.md. */
#define SHARED_Q "  -q, -v             quieter (errors only) / more detail on stderr (default: neither)\n"
#define SHARED_JSON "  --json FILE        write the report JSON (viz/REPORT.md) to FILE, - = stdout (default: none)\n"

static const char help_check[] =
    "Checks the task graph statically: acyclicity, the ordering invariants of src/SEMANTICS.md as\n"
    "happens-before over every execution the graph allows, stream races, peak activation memory\n"
    "per device and the critical path; then the same without the phony (fork/join) edges.\n"
    "Exit 1 when an invariant is violated or the schedule deadlocks.\n"
    "\noptions:\n"
    "  --actions FILE     check this schedule instead of the spec's: PyTorch's schedule CSV or a\n"
    "                     JSON plan (src/SPEC.md); a deadlock is reported as the cycle of waits\n"
    "                     that forms it (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexamples:\n  pipescope check examples/seed1-convergence.json\n"
    "  pipescope check examples/small-3x3.json --actions my_schedule.csv\n";

static const char help_graph[] =
    "Prints the task graph's size and writes it as DOT or SVG, or prints the order in which\n"
    "PyTorch's autograd engine runs the tasks (--order).\n"
    "\noptions:\n"
    "  --order            print the engine's F/R/B execution order instead (default: off)\n"
    "  --forward, --backward, --all\n"
    "                     which half of the graph DOT/SVG draw (default: --all)\n"
    "  --tasks            draw only F/R/B/copy tasks, not every autograd node (default: off)\n"
    "  --dot FILE         write Graphviz DOT (default: none)\n"
    "  --svg FILE         write an SVG laid out by Graphviz (default: none)\n"
    "  --no-phony         build the graph without the fork/join phony edges (default: with)\n"
    "  --iteration N      which training iteration's sequence numbers to model (default: 0)\n"
    SHARED_JSON SHARED_Q
    "\nexamples:\n  pipescope graph examples/small-3x3.json --order\n"
    "  pipescope graph examples/small-3x3.json --tasks --svg out/small.svg\n";

static const char help_run[] =
    "Trains the spec for real with pipescope's reference kernels: loss per step, BatchNorm\n"
    "running statistics and their update log, the measured timeline, and the activation memory\n"
    "per device (peak beside the simulator's model; --json and --trace: over time).\n"
    "\noptions:\n"
    "  --backend cpu|cuda  which executor (default: cpu; cuda exits 3 when no GPU is usable)\n"
    "  --virtual-devices  run a multi-device spec on one GPU, one stream set per partition\n"
    "                     (default: off)\n"
    "  --steps N          training steps (default: the spec's train.steps, else 1)\n"
    "  --forward-only     train-mode forward passes only, no backward or optimizer step: which\n"
    "                     BN policy adapts its running statistics (default: off)\n"
    "  --serial           cpu: run the order as one sequence instead of one thread per device;\n"
    "                     same results bit for bit (default: a thread per device)\n"
    "  --save-state DIR   write the trained state as PyTorch-named .npy files (default: none)\n"
    "  --trace FILE       write the measured timeline as a Chrome trace (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope run examples/seed1-convergence.json --steps 3 --trace out/run.json\n";

static const char help_drift[] =
    "BatchNorm running-statistics drift: trains each (chunks, policy, checkpoint) setting and\n"
    "compares the running statistics with a full-batch reference (chunks 1, plain BN, no\n"
    "checkpointing); --train N is convergence mode (loss curves, held-out accuracy). A setting\n"
    "where BatchNorm would see one value per channel is skipped with the reason; the rest run.\n"
    "\noptions:\n"
    "  --chunks LIST      micro-batch counts, e.g. 1,2,4,8 (default: the spec's chunks)\n"
    "  --policy LIST      plain,deferred,grad-only (default: the spec's pipeline.batchnorm)\n"
    "  --checkpoint LIST  always,except_last,never (default: the spec's pipeline.checkpoint)\n"
    "  --steps N          steps per setting in drift mode (default: the spec's train.steps)\n"
    "  --train N          convergence mode with N steps per setting (default: off)\n"
    "  --eval-rows R      held-out rows for accuracy in --train mode (default: 297 for csv\n"
    "                     data, else none)\n"
    "  --forward-only     train-mode forwards only: which settings adapt BN statistics without\n"
    "                     a backward, against sim/bnorder (default: off)\n"
    "  -o DIR             write drift.json and the plots into DIR (default: none)\n"
    "  --svg FILE         write the main plot (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope drift examples/seed1-convergence.json --chunks 1,2,4,8 "
    "--policy plain,deferred -o out/drift\n";

static const char help_compare[] =
    "Compares a measured timeline (pipescope's own `run --trace`, or PyTorch-profiler traces with\n"
    "task-named ranges, PyTorch pipelining's PP:<stage><F|I|W|B><mb> or fairscale's\n"
    "chunk<i>-part<j>; Kineto GPU kernels are attributed to their task and stream) against the\n"
    "simulation of the same spec: makespan error, per-task start and duration errors, order\n"
    "inversions, broken dependencies, bubble. --calibrate fits the cost model to the\n"
    "measurement. Exit 1 when a tolerance is exceeded. See examples/PROFILER.md.\n"
    "\noptions:\n"
    "  --measured TRACE   a measured Chrome trace, .json or .json.gz (required); repeat it, or\n"
    "                     name a folder, for one file per rank (put on one clock)\n"
    "  --step N           the training step to compare when a trace holds several (from 0;\n"
    "                     default: the last)\n"
    "  --simulated TRACE  a simulated trace to compare with (default: simulate the spec here)\n"
    "  --costs FILE       per-layer costs for that simulation, sim/COSTS.md (default: the\n"
    "                     spec's costs, else its hardware roofline)\n"
    "  --tolerance makespan=X,task=Y[,start=Z]\n"
    "                     relative limits: makespan error, p95 task-duration error, p95 start\n"
    "                     error as a share of the makespan (default: makespan=0.2,task=0.5,\n"
    "                     start unchecked)\n"
    "  --calibrate FILE   fit the costs to the measurement and write them as a costs file\n"
    "                     (default: none)\n"
    "  --unit sample|micro_batch  unit of the calibrated costs (default: sample)\n"
    "  --svg FILE         measured and simulated timelines, one above the other (default: none)\n"
    "  --dot FILE         the graph coloured by each task's duration error (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope run examples/small-3x3.json --trace out/m.json\n"
    "  pipescope compare examples/small-3x3.json --measured out/m.json --calibrate out/costs.json\n";

static const char help_diagnose[] =
    "Runs everything this machine can about a spec (checks, graph, simulation, a CPU run, and a\n"
    "CUDA run when a GPU is usable, measured vs simulated with a calibration, a BatchNorm drift\n"
    "sweep) and writes DIR/index.html, DIR/report.json and the traces and pictures; prints the\n"
    "main findings. DIR appears only when everything succeeded.\n"
    "\noptions:\n"
    "  -o DIR             the report folder (required)\n"
    "  --chunks LIST      chunks of the drift sweep (default: 1,2,4,... up to the batch, stopping\n"
    "                     before BatchNorm would see one value per channel, plus the spec's\n"
    "                     chunks); settings that cannot train are skipped with the reason\n"
    "  --no-drift         skip the drift sweep (default: run it when the model has BatchNorm)\n"
    "  --steps N          training steps of the runs and of each drift setting, 1..1000\n"
    "                     (default: the spec's train.steps, else 1)\n"
    "  --costs FILE       per-layer costs for the simulation, sim/COSTS.md (default: the spec's\n"
    "                     costs, else its hardware roofline)\n"
    "  --budget SECONDS   time budget for the CPU run, the drift sweep and the forward-only pass:\n"
    "                     fewer steps, fewer settings or skipped, each reduction reported with\n"
    "                     the command that runs the rest (default: 60)\n"
    "  --full             no budget: run everything, however long (default: off)\n" SHARED_Q
    "\nProgress goes to stderr for every phase longer than a second (one updating line on a\n"
    "terminal, plain lines otherwise; none with -q).\n"
    "\nexample:\n  pipescope diagnose examples/seed1-convergence.json -o out/seed1\n";

static const char help_simulate[] =
    "Simulates the spec's schedule on its devices and streams: makespan, throughput, busy time\n"
    "and bubble per device, peak activation memory, recompute share, critical path and the\n"
    "BatchNorm update order the timeline implies.\n"
    "\noptions:\n"
    "  --costs FILE       per-layer costs, sim/COSTS.md (default: the spec's costs, else its\n"
    "                     hardware roofline)\n"
    "  --no-phony         also simulate without the fork/join edges, side by side (default: off)\n"
    "  --optimizer        add the optimizer step per partition (default: off)\n"
    "  --actions FILE     run a hand-written per-stage plan instead of the schedule (default: none)\n"
    "  --trace FILE       write the simulated timeline as a Chrome trace (default: none)\n"
    "  --svg FILE         write the timeline as an SVG Gantt chart (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope simulate examples/unet-timeline.json --svg out/unet.svg\n";

static const char help_sweep[] =
    "Simulates every combination of chunks x checkpoint mode x schedule: makespan, throughput,\n"
    "bubble, peak memory and recompute overhead as a table, JSON and line plots.\n"
    "\noptions:\n"
    "  --chunks LIST      micro-batch counts (default: 1,2,4,8,16,32,64)\n"
    "  --checkpoint LIST  always,except_last,never (default: the spec's pipeline.checkpoint)\n"
    "  --schedule LIST    names from gpipe,1f1b,interleaved-1f1b,zb-h1,zb-h2,zb-v,looped-bfs,\n"
    "                     interleaved-zb,dualpipe-v,pytorch-gpipe, or all; the dev column says how many\n"
    "                     devices each runs on (default: the spec's schedule)\n"
    "  --costs FILE       per-layer costs, sim/COSTS.md (default: the spec's costs, else its\n"
    "                     hardware roofline)\n"
    "  -o DIR             write sweep.json and the plots into DIR (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope sweep examples/unet-timeline.json --chunks 1,2,4,8,16,32 -o out/sweep\n";

static const char help_schedule[] =
    "Prints a schedule's program rank by rank in PyTorch pipelining's action grammar\n"
    "(<stage><F|I|W|B><micro-batch>: F forward, I input gradient, W weight gradient, B full\n"
    "backward) with the most stage activations each rank keeps alive, validates it (every stage\n"
    "and micro-batch has F and B or I+W; the graph runs to the end, else the cycle of waits that\n"
    "deadlocks it, exit 1) and writes the CSV that PyTorch's _load_csv reads.\n"
    "\noptions:\n"
    "  --schedule NAME    a built-in schedule (default: the spec's pipeline.schedule)\n"
    "  --chunks N         micro-batches (default: the spec's pipeline.chunks)\n"
    "  --virtual-stages V stages per device for interleaved-1f1b, looped-bfs, interleaved-zb\n"
    "                     (default: the spec's pipeline.virtual_stages)\n"
    "  --actions FILE     read a plan instead: PyTorch's schedule CSV or a JSON plan\n"
    "                     (src/SPEC.md) (default: none)\n"
    "  --csv FILE         write the schedule as PyTorch's CSV (default: none)\n"
    SHARED_Q
    "\nexamples:\n  pipescope schedule examples/small-3x3.json --schedule zb-h1 --chunks 6\n"
    "  pipescope schedule examples/small-3x3.json --schedule 1f1b --csv out/1f1b.csv\n";

static const char help_advise[] =
    "Answers \"which configuration should I run?\": searches every schedule, chunks value (powers\n"
    "of two and divisors of the batch), checkpoint mode and BatchNorm policy, each with the exact\n"
    "min-max time balance under the memory cap, prunes only with valid bounds, and prints the\n"
    "Pareto front (throughput, peak memory per device, predicted BN running-variance drift) and a\n"
    "recommendation in words. Exit 1 when nothing fits the cap.\n"
    "\noptions:\n"
    "  --memory-cap BYTES|auto  peak memory per device allowed (auto: the spec's own simulated\n"
    "                     peak; default: none)\n"
    "  --devices N        devices to plan for (default: the spec's)\n"
    "  --objective throughput|balanced  the fastest front point, or the fastest whose predicted\n"
    "                     drift is at most 1% (default: throughput)\n"
    "  --costs FILE       per-layer costs, sim/COSTS.md (default: the spec's costs, else its\n"
    "                     hardware roofline)\n"
    "  --train N          measure the drift with N-step CPU trainings at the three best front\n"
    "                     points (default: predicted only)\n"
    "  --no-drift         do not predict the drift (default: predict it when the forward pass\n"
    "                     it reads is at most 5 GFLOP)\n"
    "  --predict-drift    predict it whatever the forward pass costs (default: off)\n"
    "  --exhaustive       simulate every configuration, no pruning (default: prune by bounds)\n"
    "  --all              list every point, not only the front (default: the front)\n"
    "  -o DIR             write advise.json, pareto.svg and recommended.json into DIR\n"
    "                     (default: none)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope advise examples/seed2-checkpoint-bn.json --memory-cap auto -o out/advise\n";

static const char help_balance[] =
    "Finds the exact min-max contiguous partition of the layers and compares the spec's balance\n"
    "and torchgpipe's balance_by_time heuristic with it.\n"
    "\noptions:\n"
    "  --by time|memory   what to balance (default: time)\n"
    "  --partitions N     number of partitions (default: the spec's)\n"
    "  --memory-cap BYTES with --by time: no partition may hold more (default: no cap)\n"
    "  --costs FILE       per-layer costs, sim/COSTS.md (default: the spec's costs, else its\n"
    "                     hardware roofline)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope balance examples/unet-timeline.json\n";

static const char help_calibrate[] =
    "Fits one cost model to several measured runs of one model (same layers and balance; chunks,\n"
    "checkpoint mode and schedule may differ), per partition a fixed time per task plus a time per\n"
    "sample for forward (and recompute) and backward, with terms of their own for a checkpointed\n"
    "forward, the backward of a recomputed micro-batch and the step's first backward\n"
    "(sim/COSTS.md), and copy and launch costs, each with its standard error; then simulates\n"
    "every run with it and prints predicted vs measured makespan, bubble and busy time per\n"
    "device, held-out runs first (their errors are the simulator's accuracy; the fitted runs' are\n"
    "in-sample). Runs of one SPEC are repetitions of one configuration: one line with the\n"
    "median (or minimum) measured makespan and its range.\n"
    "\noptions:\n"
    "  --run SPEC TRACE     a run to fit: its spec and its measured Chrome trace (run --trace,\n"
    "                       or a profiler's, as compare reads them); repeat it (at least one)\n"
    "  --holdout SPEC TRACE a run to predict, never fitted; repeat it (default: none)\n"
    "  -o COSTS             write the fit as a costs file, sim/COSTS.md (default: not written)\n"
    "  --fit robust|mean    robust: typical task times, outliers (a shared CPU's preemptions)\n"
    "                       weighed down; mean: plain least squares, mean task times with the\n"
    "                       expected delay of a steady load in them (default: robust)\n"
    "  --cores auto|N       0: the pipeline simulator; N: devices as threads sharing N CPU\n"
    "                       cores, each running until it has to wait (the cpu executor on a\n"
    "                       small or busy machine); auto: the one of 0..devices that fits the\n"
    "                       --run runs best (default: 0)\n"
    "  --measured median|min the measured makespan of a configuration given several times:\n"
    "                       the median of its runs, or the minimum (the least disturbed by\n"
    "                       other load; the fit then reads only the least disturbed quarter of\n"
    "                       each --run configuration's runs, so its costs are at that speed)\n"
    "                       (default: median)\n"
    SHARED_JSON SHARED_Q
    "\nexample:\n  pipescope calibrate --run c2.json c2.trace.json --run c16.json c16.trace.json "
    "\\\n      --holdout c8.json c8.trace.json -o costs.json\n";

static const char help_version[] =
    "Prints pipescope's version.\n"
    "\noptions:\n"
    "  --build-options    also list the backends this build has (default: off)\n"
    "\nexample:\n  pipescope version --build-options\n";

const struct ps_cmd ps_commands[] = {
    {"check", "static checks: cycles, ordering invariants, races, memory, no-phony what-if",
     "check SPEC [--actions FILE] [--json FILE]", ps_cmd_check, help_check, false},
    {"graph", "the task graph as DOT/SVG/JSON, or the engine's execution order",
     "graph SPEC [--order] [--forward|--backward|--all] [--tasks] [--dot FILE] [--svg FILE] "
     "[--json FILE] [--no-phony] [--iteration N]",
     ps_cmd_graph, help_graph, false},
    {"run", "train for real (cpu reference kernels): loss, BN statistics, measured timeline and "
     "activation memory per device (a thread per device; --serial: one sequence); "
     "--forward-only: train-mode forwards only (BN adaptation)",
     "run SPEC [--backend cpu|cuda] [--virtual-devices] [--steps N] [--forward-only] "
     "[--serial] [--save-state DIR] [--trace FILE] [--json FILE]",
     ps_cmd_run, help_run, false},
    {"drift", "BN running-statistics drift vs a full-batch reference; convergence (--train); "
     "which settings adapt BN statistics without backward (--forward-only)",
     "drift SPEC [--chunks 1,2,4,8,16,32] [--policy plain,deferred,grad-only] "
     "[--checkpoint always,except_last,never] [--steps N] [--train N [--eval-rows R] | "
     "--forward-only] [-o DIR] [--json FILE] [--svg FILE]",
     ps_cmd_drift, help_drift, true},
    {"compare", "measured vs simulated timeline: errors, inversions, bubble; calibration",
     "compare SPEC --measured TRACE|DIR [--measured ...] [--step N] [--simulated TRACE] "
     "[--costs FILE] [--tolerance makespan=0.2,task=0.5[,start=0.1]] [--calibrate COSTS.json] "
     "[--unit sample|micro_batch] [--json FILE] [--svg FILE] [--dot FILE]",
     ps_cmd_compare, help_compare, false},
    {"calibrate", "one cost model from several measured runs; predicted vs measured held-out runs",
     "calibrate --run SPEC TRACE [--run SPEC TRACE ...] [--holdout SPEC TRACE ...] [-o COSTS] "
     "[--fit robust|mean] [--cores auto|N] [--measured median|min] [--json FILE]",
     ps_cmd_calibrate, help_calibrate, false},
    {"diagnose", "everything this machine can do, as a report folder with index.html",
     "diagnose SPEC -o DIR [--chunks 1,2,4,...] [--no-drift] [--costs FILE] [--steps N] "
     "[--budget SECONDS | --full]",
     ps_cmd_diagnose, help_diagnose, true},
    {"simulate", "simulated timeline: makespan, bubble, memory, recompute, BN update order",
     "simulate SPEC [--actions FILE] [--no-phony] [--optimizer] [--costs FILE] [--trace FILE] "
     "[--svg FILE] [--json FILE]",
     ps_cmd_simulate, help_simulate, false},
    {"sweep", "simulate over chunks x checkpoint x schedule: table, JSON, line plots",
     "sweep SPEC [--chunks 1,2,4,...] [--checkpoint always,except_last,never] "
     "[--schedule LIST|all] [--costs FILE] [-o DIR] [--json FILE]",
     ps_cmd_sweep, help_sweep, true},
    {"advise", "which configuration to run: schedule x chunks x checkpoint x BN policy under a "
     "memory cap, Pareto front, recommended spec",
     "advise SPEC [--memory-cap BYTES|auto] [--devices N] [--objective throughput|balanced] "
     "[--train N] [-o DIR] [--json FILE]",
     ps_cmd_advise, help_advise, true},
    {"balance", "exact min-max partition vs the spec's balance and torchgpipe's heuristic",
     "balance SPEC [--by time|memory] [--partitions N] [--memory-cap BYTES] [--costs FILE] "
     "[--json FILE]",
     ps_cmd_balance, help_balance, false},
    {"schedule", "a schedule's per-rank program: validated, in PyTorch's CSV",
     "schedule SPEC [--schedule NAME] [--chunks N] [--virtual-stages V] [--actions FILE] "
     "[--csv FILE]",
     ps_cmd_schedule, help_schedule, false},
    {"version", "version and build options", "version [--build-options]", cmd_version,
     help_version, false},
    {NULL, NULL, NULL, NULL, NULL, false},
};

static void print_help(const struct ps_cmd *c)
{
    printf("usage: pipescope %s\n\n%s", c->usage, c->help);
    printf("\nSPEC is a pipeline spec (JSON, src/SPEC.md); examples/ holds ready ones. Exit codes:\n"
           "0 ok, 1 violations or a tolerance exceeded, 2 bad input or usage, 3 backend "
           "unavailable.\n");
}

/* The output `path` is the spec itself (by device and inode: also through a link): refused here,
 * before the command prints or computes anything. viz/out.c checks every input again when the
 * outputs commit (weights and data are read later). */
static int spec_is_output(const struct ps_cli *cli, const char *path, struct ps_diag *d)
{
    struct stat a, b;
    if (!path || !cli->spec_path || stat(path, &a) != 0 || stat(cli->spec_path, &b) != 0 ||
        !S_ISREG(a.st_mode) || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        return 0;
    ps_diag_set(d, -EEXIST, path, "input file is the same as output file");
    ps_diag_hint(d, "give the output another name; pipescope does not replace what it reads");
    return -EEXIST;
}

/* Every place the command will write, checked (and its missing folders made) before it computes
 * anything: the shared --json/--trace/--svg, the command options that name output files or
 * folders, and -o DIR. Returns 0 or the exit code after printing the error. */
static int prepare_outputs(const struct ps_cmd *cmd, struct ps_cli *cli)
{
    static const struct {
        const char *opt;
        bool folder;
    } outputs[] = {{"--dot", false}, {"--calibrate", false}, {"--save-state", true}};
    struct ps_diag d;
    ps_diag_clear(&d);
    const char *files[] = {cli->json, cli->trace, cli->svg};
    for (size_t k = 0; k < sizeof(files) / sizeof(files[0]); k++)
        if (files[k] && (spec_is_output(cli, files[k], &d) || ps_out_check(files[k], &d)))
            return ps_cli_fail(&d, PS_EXIT_INPUT);
    for (int k = 0; k < cli->argc; k++) {
        for (size_t j = 0; j < sizeof(outputs) / sizeof(outputs[0]); j++) {
            size_t n = strlen(outputs[j].opt);
            const char *a = cli->argv[k], *v = NULL;
            if (!strcmp(a, outputs[j].opt) && k + 1 < cli->argc) v = cli->argv[k + 1];
            else if (!strncmp(a, outputs[j].opt, n) && a[n] == '=') v = a + n + 1;
            if (!v || !*v) continue; /* the command says what is missing */
            const char *w;
            if (outputs[j].folder ? ps_out_folder(v, &w, &d)
                                  : spec_is_output(cli, v, &d) || ps_out_check(v, &d))
                return ps_cli_fail(&d, PS_EXIT_INPUT);
            if (outputs[j].folder) ps_cli_alias_folder(w, v);
        }
    }
    if (cmd->outdir && cli->outdir && ps_out_folder(cli->outdir, &cli->outdir_files, &d))
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    if (cli->outdir_files) ps_cli_alias_folder(cli->outdir_files, cli->outdir);
    return 0;
}

/* The first option of the command's own given a second time, or NULL: each takes one value,
 * except those the command says to repeat. */
static const char *repeated_option(const struct ps_cmd *cmd, int n, char **argv)
{
    static const struct {
        const char *cmd, *opt;
    } repeatable[] = {{"compare", "--measured"}, {"calibrate", "--run"}, {"calibrate", "--holdout"}};
    for (int k = 0; k < n; k++) {
        if (strncmp(argv[k], "--", 2) || !argv[k][2]) continue;
        size_t len = strcspn(argv[k], "=");
        bool ok = false;
        for (size_t r = 0; r < sizeof(repeatable) / sizeof(repeatable[0]); r++)
            ok |= !strcmp(cmd->name, repeatable[r].cmd) && strlen(repeatable[r].opt) == len &&
                  !strncmp(argv[k], repeatable[r].opt, len);
        if (ok) continue;
        for (int j = 0; j < k; j++)
            if (strcspn(argv[j], "=") == len && !strncmp(argv[j], argv[k], len)) return argv[k];
    }
    return NULL;
}

/* Open files: Graphviz's plugins, an output's folder and its temporary, the executors' trace
 * files. Below PS_MIN_FILES a command would fail in some later step with a misleading message
 * (a missing Graphviz plugin), so the soft limit is raised towards the hard one, or refused. */
#define PS_MIN_FILES 64
static bool enough_files(const struct ps_cmd *cmd)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 1024)
        return true;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 1024 ? 1024 : rl.rlim_max;
    if (want > rl.rlim_cur) {
        rl.rlim_cur = want;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur >= PS_MIN_FILES) return true;
    fprintf(stderr, "pipescope %s: only %llu open files allowed (ulimit -n); pipescope needs at "
            "least %d\n", cmd->name, (unsigned long long)rl.rlim_cur, PS_MIN_FILES);
    return false;
}

/* The shared options each command acts on; any other is refused before anything is written
 * (accepted and ignored, it would look like a file that was never written). */
static int refuse_shared(const struct ps_cli *cli)
{
    static const struct {
        const char *cmd, *takes;
    } t[] = {{"check", "--json"},          {"graph", "--json --svg"},
             {"run", "--json --trace"},    {"drift", "--json --svg -o"},
             {"compare", "--json --svg"},  {"calibrate", "--json -o"},
             {"diagnose", "-o"},           {"simulate", "--json --trace --svg"},
             {"sweep", "--json -o"},       {"advise", "--json -o"},
             {"balance", "--json"},        {"schedule", ""},
             {"version", ""}};
    const char *takes = NULL;
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++)
        if (!strcmp(t[k].cmd, cli->cmd)) takes = t[k].takes;
    if (!takes) return 0;
    const struct {
        const char *opt, *val;
    } given[] = {{"--json", cli->json}, {"--trace", cli->trace}, {"--svg", cli->svg},
                 {"-o", cli->outdir}};
    for (size_t k = 0; k < sizeof(given) / sizeof(given[0]); k++) {
        if (!given[k].val) continue;
        size_t n = strlen(given[k].opt);
        const char *p = strstr(takes, given[k].opt);
        if (p && (p[n] == ' ' || p[n] == 0)) continue;
        return ps_cli_usage(cli, "%s is not an option of %s, which would write nothing there "
                            "(its shared output options: %s)",
                            given[k].opt, cli->cmd, *takes ? takes : "none");
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pipescope COMMAND SPEC [options]\n\ncommands:\n");
    for (const struct ps_cmd *c = ps_commands; c->name; c++)
        fprintf(f, "  %-9s %s\n", c->name, c->summary);
    fprintf(f, "\nshared options (a command refuses those its help does not list): --json FILE (- for\nstdout), --trace FILE, --svg FILE, -o DIR, "
               "-q, -v\n'pipescope help COMMAND' or 'pipescope COMMAND --help' shows a command's options,\ntheir defaults and an example. The spec format: src/SPEC.md.\n");
}

/* glibc's allocator, tuned for the executors' pattern (every task allocates its activations and
   the step frees them all): without this, freed memory at the top of a thread's heap goes back
   to the kernel and large buffers are mapped afresh, so the next micro-batch faults it in
   again, page by page. Measured on conv32 (examples/conv32.json, chunks 16 never, 13 steps, 2
   device threads): 41989 page faults and 22.5 ms per step, the forward of partition 0 621 us;
   with the heap grown 64 MiB at a time and buffers under 32 MiB taken from it: 8256 faults
   (those of loading), 19.1 ms, 440 us. Results do not depend on where buffers lie. */
static void tune_allocator(void)
{
#if defined(M_TOP_PAD) && defined(M_MMAP_THRESHOLD)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TOP_PAD, 64 << 20);
#endif
}

int main(int argc, char **argv)
{
    tune_allocator();
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? PS_EXIT_INPUT : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("pipescope %s\n", PS_VERSION);
        return 0;
    }
    bool help = strcmp(argv[1], "help") == 0;
    if (help && (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        usage(stdout);
        return 0;
    }
    const char *name = help ? argv[2] : argv[1];
    const struct ps_cmd *cmd = NULL;
    for (const struct ps_cmd *c = ps_commands; c->name; c++)
        if (strcmp(c->name, name) == 0) cmd = c;
    if (!cmd) {
        fprintf(stderr, "pipescope: unknown command '%s'\n", name);
        usage(stderr);
        return PS_EXIT_INPUT;
    }
    /* "pipescope CMD --help" anywhere before a "--" is the same as "pipescope help CMD" */
    for (int k = 2; k < argc && !help; k++) {
        if (!strcmp(argv[k], "--")) break;
        help = !strcmp(argv[k], "--help") || !strcmp(argv[k], "-h");
    }
    if (help) {
        print_help(cmd);
        return 0;
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
            if (*slot) {
                fprintf(stderr, "pipescope %s: option %s given twice; it takes one value\n",
                        cmd->name, a);
                return PS_EXIT_INPUT;
            }
            *slot = argv[++k];
            continue;
        }
        if (!strcmp(a, "-q")) cli.verbosity = -1;
        else if (!strcmp(a, "-v")) cli.verbosity = 1;
        else if (a[0] != '-' && !cli.spec_path && strcmp(cmd->name, "version") != 0 &&
                 strcmp(cmd->name, "calibrate") != 0) /* calibrate: --run SPEC TRACE */
            cli.spec_path = a;
        else if (nrest < (int)(sizeof(rest) / sizeof(rest[0])))
            rest[nrest++] = argv[k];
        else {
            fprintf(stderr, "pipescope %s: more than %zu arguments\n", cmd->name,
                    sizeof(rest) / sizeof(rest[0]));
            return PS_EXIT_INPUT;
        }
    }
    if (!enough_files(cmd)) return PS_EXIT_INPUT;
    const char *twice = repeated_option(cmd, nrest, rest);
    if (twice) {
        fprintf(stderr, "pipescope %s: option %.*s given twice; it takes one value\n", cmd->name,
                (int)strcspn(twice, "="), twice);
        return PS_EXIT_INPUT;
    }
    /* a closed pipe or a file size limit is a write error that removes the temporaries, not
       a death that leaves them */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    cli.argc = nrest;
    cli.argv = rest;
    /* every output of a command appears when it ends, or none when it fails; output folders
       are written as temporary twins and swapped in then (viz/out.c, O4) */
    ps_out_defer_begin();
    int code = refuse_shared(&cli);
    if (code == 0) code = prepare_outputs(cmd, &cli);
    if (code == 0) code = cmd->run(&cli);
    struct ps_diag d;
    ps_diag_clear(&d);
    /* a failed write to stdout (a full disk, /dev/full) fails the command too */
    if (ps_out_stdout_check(&d) && (code == PS_EXIT_OK || code == PS_EXIT_FOUND))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
    ps_diag_clear(&d);
    if (ps_out_defer_end(code == PS_EXIT_OK || code == PS_EXIT_FOUND, &d))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
    return code;
}
