/* pipescope run: trains for real with an executor (kernels/exec.h) and reports what happened.
 *
 *   pipescope run SPEC [--backend cpu|cuda] [--virtual-devices] [--steps N] [--forward-only]
 *                 [--serial] [--save-state DIR] [--trace FILE] [--json FILE]
 *
 * Prints the loss of every step and, per BatchNorm layer, how its running statistics were
 * updated in one step (e.g. "0f 1f 2f 3f 3r 2r 1r 0r": micro-batch and f = forward,
 * r = recompute, c = deferred commit) with the final statistics. --forward-only makes every step
 * a train-mode forward pass only (no recompute, no backward, no SGD step: the parameters stay as
 * loaded), as when BatchNorm statistics are adapted to new data, and says in words whether the
 * spec's BN policy and checkpoint mode adapt them in such passes (ps_bn_adaptation). Outputs are written only after
 * the whole run succeeded, each atomically (the state folder as a temporary twin swapped in,
 * viz/out.c), so a failed run leaves no output file behind.
 * The cpu backend runs one worker thread per device (torchgpipe's) unless --serial; results are
 * the same bit for bit, the timeline differs. It measures the activation memory per device
 * (kernels/exec_cpu.c M1-M4) and prints and reports the peak beside the simulator's memory model
 * along the same order (src/analysis.c), and the last step's memory over time (--json
 * execution.memory, --trace as Chrome counter events "activation bytes").
 * Exit codes: 0 ok, 2 bad input (spec, weights, data) or usage, 3 backend unavailable,
 * 1 the execution order got stuck (a graph without its dependencies, see `check`).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/analysis.h"
#include "src/cli/cli.h"
#include "src/cli/progress.h"
#include "src/study/study.h"
#include "src/drift.h"
#include "kernels/exec.h"
#include "viz/report.h"
#include "viz/viz.h"

static int parse_steps(const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < 1 || x > (1 << 20)) return -1;
    *out = (int)x;
    return 0;
}

static void print_floats(const char *label, const float *v, int64_t n)
{
    printf("    %-13s", label);
    int64_t show = n > 8 ? 8 : n;
    for (int64_t c = 0; c < show; c++) printf(" %.6g", (double)v[c]);
    if (n > show) printf(" ... (%lld channels)", (long long)n);
    printf("\n");
}

static void print_bn(const struct ps_spec *s, const struct ps_exec_result *r, const char *unit)
{
    int last = r->steps - 1;
    for (int l = 0; l < s->n_layers; l++) {
        if (s->layers[l].op != PS_OP_BATCHNORM) continue;
        const struct ps_layer_state *ls = &r->state.layers[l];
        int total = 0, in_last = 0;
        for (uint32_t k = 0; k < r->n_bn; k++)
            if (r->bn[k].layer == l) {
                total++;
                in_last += r->bn[k].step == last;
            }
        printf("  layer %d: %d update%s in %d %s%s, %d in the last:", l, total,
               total == 1 ? "" : "s", r->steps, unit,
               r->steps == 1 ? "" : strcmp(unit, "pass") ? "s" : "es", in_last);
        for (uint32_t k = 0; k < r->n_bn; k++) {
            const struct ps_exec_bn_update *u = &r->bn[k];
            if (u->layer == l && u->step == last) printf(" %d%c", u->mb, "frc"[u->phase]);
        }
        printf("\n");
        print_floats("running_mean", ls->running_mean, ls->channels);
        print_floats("running_var", ls->running_var, ls->channels);
        printf("    num_batches_tracked %lld\n", (long long)ls->num_batches_tracked);
    }
}

/* The simulator's peak per device along the executed order (NULL when not measured). */
static struct ps_mem *simulated_peaks(const struct ps_ctx *ctx, const struct ps_exec_result *r)
{
    if (r->mem.n_devices == 0) return NULL;
    int nd = ctx->graph->n_devices > r->mem.n_devices ? ctx->graph->n_devices : r->mem.n_devices;
    struct ps_mem *m = calloc((size_t)nd, sizeof(*m));
    if (m) ps_analysis_memory(ctx->graph, &ctx->order, m);
    return m;
}

static int add_report(cJSON *root, const struct ps_ctx *ctx, const char *backend, bool fwd,
                      bool serial, const struct ps_exec_result *r, const struct ps_mem *sim)
{
    if (ps_json_set(root, "execution", ps_report_execution(ctx->graph, backend, fwd, serial, r, sim)))
        return -ENOMEM;
    return ps_json_set(root, "batchnorm", ps_report_bn_updates(ctx->spec, r));
}

/* progress on stderr during a long run (progress.h: nothing under a second, a line every few
   seconds off a terminal), its ETA from study/eta.c */
struct run_progress {
    struct ps_progress pr;
    struct ps_eta eta;
    double t0;
};

static bool run_progress_hook(void *ctx, double done, double total)
{
    struct run_progress *rp = ctx;
    double el = ps_progress_now() - rp->t0;
    ps_eta_observe(&rp->eta, el, done, total);
    double est = ps_eta_total(&rp->eta);
    double frac = isfinite(est) && est > 0 ? fmin(el / est, 1) : 0; /* 0: ETA unknown yet */
    ps_progress_update(&rp->pr, frac, 0, 0, NULL);
    return true;
}

int ps_cmd_run(struct ps_cli *cli)
{
    const char *backend = "cpu", *save = NULL, *v;
    int steps = 0;
    bool virt = false, fwd = false, serial = false;
    for (int k = 0; k < cli->argc; k++) {
        if (ps_cli_flag(cli, k, "--virtual-devices")) {
            virt = true;
        } else if (ps_cli_flag(cli, k, "--serial")) {
            serial = true;
        } else if (ps_cli_flag(cli, k, "--forward-only")) {
            fwd = true;
        } else if ((v = ps_cli_arg(cli, &k, "--backend"))) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                return ps_cli_usage(cli, "--backend must be cpu or cuda, not '%s'", v);
            backend = v;
        } else if ((v = ps_cli_arg(cli, &k, "--steps"))) {
            if (parse_steps(v, &steps))
                return ps_cli_usage(cli, "--steps must be an integer in 1..1048576, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--save-state"))) {
            if (!*v) return ps_cli_usage(cli, "--save-state needs a folder");
            save = v;
        } else {
            return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
        }
    }
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_exec_opts o;
    ps_exec_opts_init(&o);
    o.backend = strcmp(backend, "cuda") == 0 ? PS_BACKEND_CUDA : PS_BACKEND_CPU;
    o.steps = steps;
    o.virtual_devices = virt;
    o.forward_only = fwd;
    o.device_threads = !serial;
    if (!ps_exec_backend_available(o.backend, &d)) return ps_cli_fail(&d, PS_EXIT_BACKEND);

    struct ps_ctx ctx;
    int rc = ps_ctx_load(&ctx, cli, NULL);
    if (rc) return rc;
    const struct ps_spec *s = ctx.spec;
    struct ps_exec_result r;
    struct run_progress rp;
    ps_progress_init(&rp.pr, cli);
    ps_eta_init(&rp.eta);
    ps_progress_begin(&rp.pr, o.forward_only ? "forward passes" : "training");
    rp.t0 = ps_progress_now();
    o.progress = run_progress_hook;
    o.progress_ctx = &rp;
    rc = ps_exec_run(ctx.graph, &ctx.order, &o, &r, &d);
    ps_progress_end(&rp.pr, rc ? "failed" : "done");
    if (rc) {
        ps_ctx_finish(&ctx);
        return ps_cli_fail(&d, rc == -ENOTSUP ? PS_EXIT_BACKEND
                               : rc == -EDEADLK ? PS_EXIT_FOUND
                                                : PS_EXIT_INPUT);
    }
    int code = PS_EXIT_OK;
    struct ps_mem *sim = simulated_peaks(&ctx, &r);
    /* with --json - the report owns stdout: the human text would make it unparseable */
    if (cli->verbosity >= 0 && !(cli->json && !strcmp(cli->json, "-"))) {
        printf("run: %s on %s, %d %s, batch %lld in %d micro-batches (chunks %d), "
               "checkpoint %s, batchnorm %s\n",
               s->name ? s->name : s->path, backend, r.steps,
               fwd ? (r.steps == 1 ? "forward-only pass (train mode, no backward, no SGD step)"
                                   : "forward-only passes (train mode, no backward, no SGD step)")
                   : (r.steps == 1 ? "step" : "steps"),
               (long long)s->batch, s->mb_count, s->chunks, ps_checkpoint_name(s->checkpoint),
               ps_bn_policy_name(s->batchnorm));
        for (int k = 0; k < r.steps; k++)
            printf("  step %d  loss %.9g  (%.3f ms)\n", k, r.loss[k], r.step_us[k] / 1000.0);
        if (r.mem.n_devices) {
            printf("activation memory per device, measured peak (simulated peak along the same "
                   "order), %s:\n",
                   !serial && r.mem.n_devices > 1 ? "a thread per device" : "serial");
            for (int dv = 0; dv < r.mem.n_devices; dv++)
                printf("  device %d  %.3f MB (%.3f MB)%s\n", dv, 1e-6 * (double)r.mem.peak_bytes[dv],
                       sim ? 1e-6 * (double)sim[dv].peak_bytes : 0.0, sim ? "" : " (no model)");
        }
        bool any = false;
        for (int l = 0; l < s->n_layers; l++) any |= s->layers[l].op == PS_OP_BATCHNORM;
        if (any) {
            printf("batchnorm running statistics (f = forward, r = recompute, c = commit):\n");
            print_bn(s, &r, fwd ? "pass" : "step");
            if (fwd) {
                char w[512];
                ps_bn_adaptation(&ctx.graph->var, w, sizeof(w));
                printf("BN adaptation: %s, checkpoint %s: %s\n", ps_bn_policy_name(s->batchnorm),
                       ps_checkpoint_name(s->checkpoint), w);
            }
        }
    }
    struct ps_chrome_counter *ctr = NULL;
    struct ps_chrome_opts co = {0};
    if (cli->trace && r.mem.n_points && (ctr = calloc(r.mem.n_points, sizeof(*ctr)))) {
        for (uint32_t k = 0; k < r.mem.n_points; k++)
            ctr[k] = (struct ps_chrome_counter){r.mem.points[k].device, r.mem.points[k].t_us,
                                                r.mem.points[k].bytes};
        co.counters = ctr;
        co.n_counters = r.mem.n_points;
        co.counter_name = "activation bytes";
    }
    if (cli->trace && ps_chrome_write_file(ctx.graph, &r.trace, &co, cli->trace, &d))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
    free(ctr);
    if (code == PS_EXIT_OK && cli->json) {
        cJSON *root = ps_report_new();
        if (!root || ps_report_add_spec(root, s) || add_report(root, &ctx, backend, fwd, serial, &r, sim)) {
            ps_diag_set(&d, -ENOMEM, cli->json, "out of memory building the report");
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
        } else if (ps_report_write(root, cli->json, &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
        }
        cJSON_Delete(root);
    }
    /* into the state folder's twin (made by main.c before the run), swapped in when the
       command ends (viz/out.c) */
    const char *save_files;
    if (code == PS_EXIT_OK && save &&
        (ps_out_folder(save, &save_files, &d) ||
         ps_state_save(&r.state, s, ctx.model, save_files, &d)))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
    free(sim);
    ps_exec_result_finish(&r);
    ps_ctx_finish(&ctx);
    return code;
}
