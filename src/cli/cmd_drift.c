/* pipescope drift: BatchNorm running-statistics drift against a full-batch reference (src/drift.h).
 *
 *   pipescope drift SPEC [--chunks 1,2,4,...] [--policy plain,deferred,grad-only]
 *                        [--checkpoint always,except_last,never] [--steps N]
 *                        [--train N [--eval-rows R] | --forward-only] [-o DIR] [--json FILE]
 *                        [--svg FILE]
 *
 * Drift mode prints one line per (setting, BN layer): updates per step (measured / section 7
 * table), whether the order is the simulated one, effective momentum, running-stat errors against
 * the reference, micro-batch spread, the running_var gap (measured / predicted) and the residual
 * of the EMA closed form. --train N is convergence mode: N steps per setting, loss curves and,
 * for cross_entropy specs, the accuracy in eval mode (running statistics) on the last R samples,
 * which training never sees (R defaults to 297 for csv data, as in examples/digits-bn.json, else
 * 0). -o DIR writes drift.json and the plots (drift-var.svg, drift-mean.svg, drift-spread.svg;
 * train mode: loss.svg, accuracy.svg); --svg FILE writes the main plot (var error against chunks,
 * or the loss curves). Progress goes to stderr.
 * --forward-only (BN adaptation): every setting and the reference make train-mode forward passes
 * only (no backward, no SGD step); the table is the drift table with the forward-only update
 * counts, followed by one line per setting saying in words whether it adapts its running
 * statistics (ps_bn_adaptation) and how far they end from plain BN's full-batch reference.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/cli/cli.h"
#include "src/drift.h"
#include "viz/report.h"
#include "viz/viz.h"
#include "src/study/study.h"

static int parse_count(const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < 1 || x > (1 << 20)) return -1;
    *out = (int)x;
    return 0;
}

/* "a,b,c" against names[]; fills out (cap entries) and returns the count, or -1. */
static int parse_names(const char *s, const char *const *names, int n_names, int *out, int cap)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int k = 0;
        while (k < n_names && !(strlen(names[k]) == len && !strncmp(names[k], p, len))) k++;
        if (k == n_names || n == cap) return -1;
        out[n++] = k;
        p += len + (e ? 1 : 0);
    }
    return n ? n : -1;
}

static void on_progress(void *ctx, int k, int n, const struct ps_drift_setting *s,
                        const char *what)
{
    const struct ps_cli *cli = ctx;
    if (cli->verbosity < 0) return;
    if (!s)
        fprintf(stderr, "drift: [%d/%d] reference: chunks 1, plain, checkpoint never\n", k, n);
    else
        fprintf(stderr, "drift: [%d/%d] %s: chunks %d, %s, checkpoint %s\n", k, n, what,
                s->chunks, ps_bn_policy_name(s->policy), ps_checkpoint_name(s->checkpoint));
}

static void print_drift(const struct ps_drift *dr)
{
    printf("%-6s %-3s %-9s %-11s %5s %7s %3s %7s %9s %9s %9s %9s %9s %9s %9s %9s %9s %8s\n",
           "chunks",
           "m", "policy", "checkpoint", "layer", "U/exp", "ord", "a_eff", "mean_max",
           "mean_avg", "var_max", "var_avg", "sprd_mu", "sprd_var", "gap_meas", "gap_pred",
           "var_pred", "ema_res");
    for (int k = -1; k < dr->n_runs; k++) {
        const struct ps_drift_run *r = k < 0 ? &dr->reference : &dr->runs[k];
        for (int j = 0; j < r->n_layers; j++) {
            const struct ps_drift_layer *l = &r->layers[j];
            char u[16];
            snprintf(u, sizeof(u), "%d/%d", l->updates, l->expected_updates);
            printf("%-6d %-3d %-9s %-11s %5d %7s %3s %7.4f %9.3g %9.3g %9.3g %9.3g %9.3g %9.3g "
                   "%9.3g %9.3g %9.3g %8.1e\n",
                   r->s.chunks, r->m, ps_bn_policy_name(r->s.policy),
                   k < 0 ? "(reference)" : ps_checkpoint_name(r->s.checkpoint), l->layer, u,
                   l->order_as_simulated ? "yes" : "NO", l->eff_momentum, l->mean_err_max,
                   l->mean_err_mean, l->var_err_max, l->var_err_mean, l->mean_spread,
                   l->var_spread, l->var_gap_measured, l->var_gap_predicted,
                   l->deferred_var_err, fmax(l->ema_residual_mean, l->ema_residual_var));
        }
    }
    if (dr->forward_only)
        printf("U/exp = updates in the last forward-only pass / expected for a pass without "
               "backward (plain m, grad-only the micro-batches not checkpointed, deferred 1); "
               "ord = the order sim/bnorder predicts for the forward part; a_eff = 1-(1-a)^U\n");
    else
        printf("U/exp = updates in the last step / src/SEMANTICS.md section 7 table; ord = the order "
               "sim/bnorder predicts; a_eff = 1-(1-a)^U\n");
    printf("mean/var errors vs the reference: |rm - rm_ref| / sqrt(rv_ref), |rv - rv_ref| / "
           "rv_ref; gap = running_var underestimate from averaging micro-batch variances "
           "(last step, relative); ema_res = closed-form EMA replay of the update log vs the "
           "measured running stats; var_pred (deferred) = var_avg predicted from committing BIASED "
           "pooled statistics where the reference commits UNBIASED ones\n");
}

static void print_adaptation(const struct ps_drift *dr)
{
    printf("BN adaptation (train-mode forward passes only, no backward; reference: plain BN, "
           "chunks 1):\n");
    for (int k = 0; k < dr->n_runs; k++) {
        const struct ps_drift_run *r = &dr->runs[k];
        int u = r->n_layers ? r->layers[0].updates : 0;
        bool same = true;
        for (int j = 0; j < r->n_layers; j++) same &= r->layers[j].updates == u;
        char ups[48];
        if (same) snprintf(ups, sizeof(ups), "%d update%s", u, u == 1 ? "" : "s");
        else snprintf(ups, sizeof(ups), "updates differ by layer");
        printf("  chunks %d, %s, checkpoint %s: %s in the last pass, running_var %.3g off the "
               "reference -- %s\n",
               r->s.chunks, ps_bn_policy_name(r->s.policy), ps_checkpoint_name(r->s.checkpoint),
               ups, ps_drift_metric(r, "var_err"), r->adaptation ? r->adaptation : "");
    }
}

static void print_train(const struct ps_drift *dr)
{
    if (dr->eval_rows)
        printf("training on samples 0..%lld, evaluating (eval mode, running statistics) on the "
               "last %lld\n",
               (long long)dr->train_rows - 1, (long long)dr->eval_rows);
    printf("%-6s %-3s %-9s %-11s %12s %12s %10s %10s\n", "chunks", "m", "policy", "checkpoint",
           "final_loss", "accuracy", "var_err", "ms/step");
    for (int k = -1; k < dr->n_runs; k++) {
        const struct ps_drift_run *r = k < 0 ? &dr->reference : &dr->runs[k];
        char acc[32];
        /* no held-out labelled rows (synthetic data, --eval-rows not given): no accuracy */
        if (isfinite(r->accuracy)) snprintf(acc, sizeof(acc), "%.4f", r->accuracy);
        else snprintf(acc, sizeof(acc), "-");
        printf("%-6d %-3d %-9s %-11s %12.5f %12s %10.3g %10.3f\n", r->s.chunks, r->m,
               ps_bn_policy_name(r->s.policy),
               k < 0 ? "(reference)" : ps_checkpoint_name(r->s.checkpoint), r->final_loss, acc,
               ps_drift_metric(r, "var_err"), r->us_per_step / 1000.0);
    }
    printf("final_loss: mean training loss of the last min(10, steps) steps; var_err: running_var "
           "relative error vs the reference, mean over channels and BN layers%s\n",
           dr->eval_rows ? ""
                         : "; accuracy '-': no held-out labelled rows (csv or npy labels with "
                           "--eval-rows R)");
}

static int write_outputs(const struct ps_cli *cli, const struct ps_drift *dr,
                         const struct ps_spec *spec, struct ps_diag *d)
{
    if (cli->svg && ps_drift_plot(dr, dr->train ? "loss" : "var_err", cli->svg, d)) return -1;
    cJSON *root = NULL;
    if (cli->json || cli->outdir) {
        root = ps_report_new();
        cJSON *sec = root ? ps_drift_json(dr) : NULL;
        if (!root || !sec || ps_report_add_spec(root, spec) || ps_json_set(root, "drift", sec)) {
            cJSON_Delete(root);
            return ps_diag_set(d, -ENOMEM, "drift", "out of memory building the report");
        }
    }
    int rc = 0;
    if (cli->json) rc = ps_report_write(root, cli->json, d);
    if (!rc && cli->outdir) {
        const char *train[][2] = {{"loss.svg", "loss"}, {"accuracy.svg", "accuracy"},
                                  {"drift-var.svg", "var_err"}};
        const char *drift[][2] = {{"drift-var.svg", "var_err"},
                                  {"drift-mean.svg", "mean_err"},
                                  {"drift-spread.svg", "mean_spread"}};
        char path[4096];
        snprintf(path, sizeof(path), "%s/drift.json", cli->outdir_files);
        if (!rc) rc = ps_report_write(root, path, d);
        for (int k = 0; k < 3 && !rc; k++) {
            const char *const *pl = dr->train ? train[k] : drift[k];
            snprintf(path, sizeof(path), "%s/%s", cli->outdir_files, pl[0]);
            rc = ps_drift_plot(dr, pl[1], path, d);
        }
    }
    cJSON_Delete(root);
    return rc;
}

int ps_cmd_drift(struct ps_cli *cli)
{
    static const char *const pol_names[] = {"plain", "deferred", "grad-only"};
    static const char *const ck_names[] = {"always", "except_last", "never"};
    int *chunks = NULL, n_chunks = 0, pol[3], n_pol = 0, ck[3], n_ck = 0, steps = 0, train = 0;
    int eval_rows = -1;
    bool forward_only = false;
    const char *v;
    int code = PS_EXIT_OK;
    for (int k = 0; k < cli->argc && code == PS_EXIT_OK; k++) {
        if ((v = ps_cli_arg(cli, &k, "--chunks"))) {
            free(chunks);
            chunks = NULL;
            if ((n_chunks = ps_cli_int_list(v, &chunks)) < 0)
                code = ps_cli_usage(cli, "--chunks takes a list like 1,2,4,8, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--policy"))) {
            if ((n_pol = parse_names(v, pol_names, 3, pol, 3)) < 0)
                code = ps_cli_usage(cli, "--policy takes plain,deferred,grad-only, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--checkpoint"))) {
            if ((n_ck = parse_names(v, ck_names, 3, ck, 3)) < 0)
                code = ps_cli_usage(cli, "--checkpoint takes always,except_last,never, not '%s'",
                                    v);
        } else if ((v = ps_cli_arg(cli, &k, "--steps"))) {
            if (parse_count(v, &steps))
                code = ps_cli_usage(cli, "--steps must be an integer in 1..1048576, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--train"))) {
            if (parse_count(v, &train))
                code = ps_cli_usage(cli, "--train must be an integer in 1..1048576, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--eval-rows"))) {
            if (parse_count(v, &eval_rows))
                code = ps_cli_usage(cli, "--eval-rows must be a positive integer, not '%s'", v);
        } else if (ps_cli_flag(cli, k, "--forward-only")) {
            forward_only = true;
        } else {
            code = ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
        }
    }
    if (!code && forward_only && train)
        code = ps_cli_usage(cli, "--forward-only runs no training: not with --train");
    if (code) {
        free(chunks);
        return code;
    }
    struct ps_ctx ctx;
    int rc = ps_ctx_load(&ctx, cli, NULL);
    if (rc) {
        free(chunks);
        return rc;
    }
    struct ps_spec *spec = ctx.spec;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (spec->data_source == PS_DATA_CSV && access(spec->data_csv, R_OK) != 0) {
        ps_diag_set(&d, -ENOENT, spec->path, "data.path: cannot read %s", spec->data_csv);
        if (strstr(spec->data_csv, "sklearn"))
            ps_diag_hint(&d, "this is scikit-learn's copy of a data set: apt-get install "
                             "python3-sklearn");
        free(chunks);
        ps_ctx_finish(&ctx);
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    enum ps_bn_policy policies[3];
    enum ps_checkpoint ckpts[3];
    for (int k = 0; k < n_pol; k++) policies[k] = (enum ps_bn_policy)pol[k];
    for (int k = 0; k < n_ck; k++) ckpts[k] = (enum ps_checkpoint)ck[k];
    struct ps_drift_opts o = {.n_chunks = n_chunks,
                              .chunks = chunks,
                              .n_policies = n_pol,
                              .policies = n_pol ? policies : NULL,
                              .n_checkpoints = n_ck,
                              .checkpoints = n_ck ? ckpts : NULL,
                              .steps = train ? train : steps,
                              .train = train > 0,
                              .forward_only = forward_only,
                              .progress = on_progress,
                              .progress_ctx = cli};
    if (train)
        o.eval_rows = eval_rows > 0 ? eval_rows : spec->data_source == PS_DATA_CSV ? 297 : 0;
    struct ps_drift dr;
    rc = ps_drift_run(spec, ctx.model, &o, &dr, &d);
    free(chunks);
    if (rc) {
        ps_ctx_finish(&ctx);
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    /* with --json - the report owns stdout: the human text would make it unparseable */
    if (cli->verbosity >= 0 && !(cli->json && !strcmp(cli->json, "-"))) {
        printf("drift: %s, batch %lld, %d %s per setting, reference: chunks 1, plain BN, "
               "checkpoint never\n",
               spec->name ? spec->name : spec->path, (long long)spec->batch, dr.steps,
               forward_only ? (dr.steps == 1 ? "forward-only pass" : "forward-only passes")
                            : (dr.steps == 1 ? "step" : "steps"));
        if (dr.train) print_train(&dr);
        else print_drift(&dr);
        if (forward_only) print_adaptation(&dr);
        for (int k = 0; k < dr.n_skipped; k++)
            printf("skipped: chunks %d, %s, checkpoint %s: %s\n", dr.skipped[k].s.chunks,
                   ps_bn_policy_name(dr.skipped[k].s.policy),
                   ps_checkpoint_name(dr.skipped[k].s.checkpoint), dr.skipped[k].reason);
    }
    /* a warning too, so -q and --json - still say what was left out */
    if (dr.n_skipped && (cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-"))))
        fprintf(stderr, "pipescope: drift: %d setting%s skipped: %s\n", dr.n_skipped,
                dr.n_skipped == 1 ? "" : "s", dr.skipped[0].reason);
    if (write_outputs(cli, &dr, spec, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
    ps_drift_finish(&dr);
    ps_ctx_finish(&ctx);
    return code;
}
