/* pipescope balance: the exact contiguous partition of the layers, how far the spec's balance is
 * from it, and torchgpipe's block-partition heuristic on the same costs (SEMANTICS.md 8).
 *
 *   balance SPEC [--by time|memory] [--partitions N] [--memory-cap BYTES] [--costs FILE]
 *
 * Per-layer time: forward + backward of one micro-batch (measured costs when given, else the
 * roofline), what torchgpipe's balance_by_time profiles. Per-layer memory: parameters with
 * their gradients (8 bytes each) plus the activations it saves for the whole mini-batch (GPipe
 * without checkpointing keeps every micro-batch until its backward). --by memory minimises the
 * largest per-partition memory; --memory-cap minimises time with no partition above the cap.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim/balance.h"
#include "sim/cost.h"
#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/viz.h"

static void print_bal(const char *what, const int *bal, int P, double mx, double best,
                      const char *unit)
{
    printf("  %-22s [", what);
    for (int p = 0; p < P; p++) printf("%s%d", p ? ", " : "", bal[p]);
    printf("]  slowest %.6g %s", mx, unit);
    if (best > 0) printf("  (+%.1f%% vs exact)", mx > best ? 100 * (mx - best) / best : 0.0);
    printf("\n");
}

int ps_cmd_balance(struct ps_cli *cli)
{
    const char *by = "time", *costs_path = NULL, *v;
    int P = 0;
    double cap = 0;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--by"))) by = v;
        else if ((v = ps_cli_arg(cli, &k, "--partitions"))) {
            char *end;
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 4096)
                return ps_cli_usage(cli, "--partitions must be an integer in 1..4096, not '%s'", v);
            P = (int)x;
        } else if ((v = ps_cli_arg(cli, &k, "--memory-cap"))) {
            char *end;
            cap = strtod(v, &end);
            if (end == v || *end || !(cap > 0) || cap > 1e30)
                return ps_cli_usage(cli, "--memory-cap must be a number of bytes > 0, not '%s'", v);
        } else if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    bool bymem = !strcmp(by, "memory");
    if (!bymem && strcmp(by, "time")) return ps_cli_usage(cli, "--by: expected time or memory");
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_costs *costs = NULL;
    double *t = NULL, *mem = NULL;
    int *bal = NULL, *heur = NULL;
    int code = 0;
    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    int L = spec->n_layers;
    if (P <= 0) P = spec->n_partitions;
    if (P > L) {
        code = ps_cli_usage(cli, "--partitions %d: the model has only %d layers", P, L);
        goto out;
    }
    t = calloc((size_t)L, sizeof(double));
    mem = calloc((size_t)L, sizeof(double));
    bal = calloc((size_t)P, sizeof(int));
    heur = calloc((size_t)P, sizeof(int));
    if (!t || !mem || !bal || !heur) goto out;
    ps_study_layer_time(spec, model, costs, (double)spec->mb_size[0], t);
    for (int k = 0; k < L; k++)
        mem[k] = 8.0 * (double)model->layers[k].params +
                 (double)model->layers[k].saved_bytes * (double)spec->batch;
    const double *obj = bymem ? mem : t;
    const char *unit = bymem ? "bytes" : "us";
    double best = 0;
    int rc = ps_balance_exact(obj, !bymem && cap > 0 ? mem : NULL, cap, L, P, bal, &best);
    if (rc == -ENOSPC) {
        printf("no partition into %d blocks keeps every block under %.6g bytes\n", P, cap);
        code = PS_EXIT_FOUND;
        goto out;
    }
    ps_balance_blockpartition(obj, L, P, heur);
    if (cli->verbosity >= 0 && !(cli->json && !strcmp(cli->json, "-"))) {
        printf("spec: %s, %d layers into %d partitions, by %s%s (micro-batch of %lld samples, "
               "%s costs)\n",
               spec->path, L, P, by, cap > 0 && !bymem ? " under a memory cap" : "",
               (long long)spec->mb_size[0], costs ? "measured" : "roofline");
        print_bal("exact", bal, P, best, 0, unit);
        if (P == spec->n_partitions)
            print_bal("spec balance", spec->balance, P, ps_balance_max(obj, L, spec->balance, P),
                      best, unit);
        print_bal("torchgpipe heuristic", heur, P, ps_balance_max(obj, L, heur, P), best, unit);
    }
    if (cli->json) {
        cJSON *root = ps_report_new();
        cJSON *o = cJSON_CreateObject();
        ps_json_add_string(o, "by", by);
        ps_json_add_int(o, "partitions", P);
        cJSON *arr = cJSON_AddArrayToObject(o, "layer_costs");
        for (int k = 0; k < L; k++) ps_json_add_number(arr, NULL, obj[k]);
        const int *bs3[3] = {bal, P == spec->n_partitions ? spec->balance : NULL, heur};
        const char *nm[3] = {"exact", "spec", "torchgpipe"};
        for (int q = 0; q < 3; q++) {
            if (!bs3[q]) continue;
            cJSON *x = cJSON_CreateObject();
            cJSON *b = cJSON_AddArrayToObject(x, "balance");
            for (int p = 0; p < P; p++) ps_json_add_int(b, NULL, bs3[q][p]);
            ps_json_add_number(x, "slowest", ps_balance_max(obj, L, bs3[q], P));
            cJSON_AddItemToObject(o, nm[q], x);
        }
        ps_json_set(root, "balance", o);
        if (ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
        cJSON_Delete(root);
    }
out:
    free(t);
    free(mem);
    free(bal);
    free(heur);
    ps_costs_destroy(costs);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
