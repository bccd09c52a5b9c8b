/* pipescope simulate: the simulated timeline of a spec's schedule, with its summary.
 *
 *   simulate SPEC [--actions FILE] [--no-phony] [--optimizer] [--costs FILE]
 *                 [--trace FILE] [--svg FILE] [--json FILE]
 *
 * Prints makespan, throughput, per-device busy time, bubble and peak activation memory, the
 * recompute share of backward, the critical path and the BatchNorm update order the timeline
 * implies. --no-phony simulates the same spec without depend() edges next to it (two traces in
 * one Gantt). --actions runs a hand-written plan (schedule.h); a plan that deadlocks prints one
 * line per stage with what it waits for and exits 1.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim/bnorder.h"
#include "src/cli/cli.h"
#include "src/study/study.h"
#include "viz/report.h"
#include "viz/viz.h"

static void print_run(const struct ps_spec *s, const struct ps_study_sim *r, const char *title)
{
    const struct ps_sim *sim = &r->sim;
    const struct ps_graph *g = r->g;
    char b1[32], b2[64], b3[64];
    printf("%s\n", title);
    printf("  makespan %.3f us, throughput %.1f samples/s, bubble %.4f\n", sim->makespan_us,
           sim->makespan_us > 0 ? (double)s->batch / (sim->makespan_us * 1e-6) : 0.0,
           sim->bubble_fraction);
    for (int d = 0; d < sim->n_devices; d++) {
        const struct ps_sim_device *dv = &sim->dev[d];
        printf("  %-8s busy %.3f us, bubble %.4f, peak %s at %.3f us, in flight %u\n",
               ps_viz_device_name(g, d, b2, sizeof(b2)), dv->busy_us, dv->bubble_fraction,
               ps_viz_bytes((double)dv->peak_bytes, b1, sizeof(b1)), dv->peak_t_us,
               dv->max_in_flight);
    }
    printf("  forward %.3f us, backward %.3f us, recompute %.3f us (%.1f%% of backward, "
           "overhead %.1f%%)\n",
           sim->forward_us, sim->backward_us, sim->recompute_us, 100 * sim->recompute_share,
           100 * sim->recompute_overhead);
    if (sim->cp_n) {
        uint32_t tasks = 0;
        for (uint32_t k = 0; k < sim->cp_n; k++) tasks += ps_node_is_task(&g->nodes[sim->cp[k]]);
        printf("  critical path: %u nodes (%u tasks), %s ... %s\n", sim->cp_n, tasks,
               ps_node_name(g, sim->cp[0], b2, sizeof(b2)),
               ps_node_name(g, sim->cp[sim->cp_n - 1], b3, sizeof(b3)));
    }
}

struct name_id {
    char name[48];
    uint32_t id;
};

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct name_id *)a)->name, ((const struct name_id *)b)->name);
}

/* Re-keys the records of t (simulated on g2) to the node ids of g with the same task name, so
 * both traces of a Gantt refer to one graph; records without a twin keep their name. */
static void rekey(const struct ps_graph *g, const struct ps_graph *g2, struct ps_trace *t)
{
    struct name_id *map = malloc(((size_t)g->n_nodes + 1) * sizeof(*map));
    if (!map) return;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        ps_node_name(g, v, map[v].name, sizeof(map[v].name));
        map[v].id = v;
    }
    qsort(map, g->n_nodes, sizeof(*map), name_cmp);
    for (uint32_t k = 0; k < t->n; k++) {
        struct name_id key;
        ps_node_name(g2, t->r[k].node, key.name, sizeof(key.name));
        struct name_id *hit = bsearch(&key, map, g->n_nodes, sizeof(*map), name_cmp);
        if (hit) t->r[k].node = hit->id, t->r[k].stream = g->nodes[hit->id].stream;
        else {
            t->r[k].name = strdup(key.name);
            t->r[k].node = UINT32_MAX;
        }
    }
    free(map);
}

int ps_cmd_simulate(struct ps_cli *cli)
{
    const char *actions = NULL, *costs_path = NULL, *v;
    bool nophony = false, optimizer = false;
    for (int k = 0; k < cli->argc; k++) {
        if (ps_cli_flag(cli, k, "--no-phony")) nophony = true;
        else if (ps_cli_flag(cli, k, "--optimizer")) optimizer = true;
        else if ((v = ps_cli_arg(cli, &k, "--actions"))) actions = v;
        else if ((v = ps_cli_arg(cli, &k, "--costs"))) costs_path = v;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if ((actions && !*actions) || (costs_path && !*costs_path))
        return ps_cli_usage(cli, "--actions and --costs need a file");
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_costs *costs = NULL;
    struct ps_plan plan;
    memset(&plan, 0, sizeof(plan));
    struct ps_study_sim a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    struct ps_bn_order bn;
    memset(&bn, 0, sizeof(bn));
    int code = PS_EXIT_OK, rc;
    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    for (int k = 0; k < spec->n_warnings; k++) ps_cli_warn(cli, "%s", spec->warnings[k]);
    if (ps_study_costs(spec, costs_path, &costs, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (actions && ps_plan_load(actions, spec, &plan, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    struct ps_variant o;
    ps_variant_from_spec(spec, &o);
    o.optimizer = optimizer;
    rc = ps_study_simulate(spec, model, &o, actions ? &plan : NULL, costs, &a, &d);
    if (rc == -EDEADLK) {
        printf("deadlock: %s\n%s", d.msg, a.stuck ? a.stuck : "");
        code = PS_EXIT_FOUND;
        goto out;
    }
    if (rc) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    bool whatif = nophony && !actions && ps_study_whatif_applies(&o);
    if (nophony && !whatif)
        ps_cli_warn(cli, "--no-phony applies to gpipe (fork/join edges) only; ignored");
    if (whatif) {
        struct ps_variant wv = ps_study_whatif_variant(&o);
        if (ps_study_simulate(spec, model, &wv, NULL, costs, &b, &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
    }
    if (ps_bn_order_build(a.g, &a.order, a.sim.start_us, spec->batchnorm, &bn)) {
        ps_diag_set(&d, -ENOMEM, "simulate", "out of memory");
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    bool quiet = cli->verbosity < 0 || (cli->json && !strcmp(cli->json, "-"));
    if (!quiet) {
        printf("spec: %s (%s)\n", spec->path, spec->name ? spec->name : "");
        printf("pipeline: %s%s, m=%d, n=%d stages on %d device%s, checkpoint %s, batchnorm %s, "
               "costs %s\n",
               actions ? "hand-written plan " : ps_schedule_name(spec->schedule),
               actions ? actions : "", spec->mb_count, a.g->n, a.g->n_devices,
               a.g->n_devices == 1 ? "" : "s",
               ps_checkpoint_name(spec->checkpoint), ps_bn_policy_name(spec->batchnorm),
               costs ? (costs_path ? costs_path : spec->costs) : "roofline");
        print_run(spec, &a, whatif ? "simulated (with phony edges):" : "simulated:");
        if (whatif) {
            print_run(spec, &b, "simulated without phony (fork/join) edges:");
            printf("  makespan %+.3f us (%+.1f%%)\n", b.sim.makespan_us - a.sim.makespan_us,
                   a.sim.makespan_us > 0
                       ? 100 * (b.sim.makespan_us - a.sim.makespan_us) / a.sim.makespan_us
                       : 0.0);
        }
        for (int k = 0; k < bn.n_layers; k++) {
            printf("batchnorm layer %d (partition %d, %s): %u update%s:", bn.layers[k].layer,
                   bn.layers[k].part, ps_bn_policy_name(bn.policy), bn.layers[k].n,
                   bn.layers[k].n == 1 ? "" : "s");
            for (uint32_t q = 0; q < bn.layers[k].n && q < 64; q++)
                printf(" %c%d%s", bn.layers[k].u[q].phase == PS_BN_RECOMPUTE ? 'r' : 'f',
                       bn.layers[k].u[q].mb, bn.layers[k].u[q].pooled ? "(pooled)" : "");
            printf("%s\n", bn.layers[k].n > 64 ? " ..." : "");
        }
    }
    if (cli->trace && ps_chrome_write_file(a.g, &a.sim.trace, NULL, cli->trace, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (cli->svg) {
        if (whatif) rekey(a.g, b.g, &b.sim.trace);
        struct ps_gantt_opts go = {.title = spec->name,
                                   .label = whatif ? "with phony edges" : NULL,
                                   .label2 = whatif ? "without phony edges" : NULL,
                                   .issue_us = whatif ? NULL : a.sim.issue_us,
                                   .launch_us = a.sim.launch_us};
        if (ps_plot_gantt_file(a.g, &a.sim.trace, whatif ? &b.sim.trace : NULL, &go, cli->svg,
                               &d)) {
            code = ps_cli_fail(&d, PS_EXIT_INPUT);
            goto out;
        }
    }
    if (cli->json) {
        cJSON *root = ps_report_new();
        ps_report_add_spec(root, spec);
        ps_report_add_graph(root, a.g);
        cJSON *sj = ps_report_simulation(a.g, &a.sim, spec->batch);
        if (whatif) cJSON_AddItemToObject(sj, "no_phony", ps_report_simulation(b.g, &b.sim, spec->batch));
        ps_json_set(root, "simulation", sj);
        ps_json_set(root, "batchnorm", ps_report_bn_order(&bn));
        if (ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
        cJSON_Delete(root);
    }
out:
    ps_bn_order_finish(&bn);
    ps_study_sim_finish(&a);
    ps_study_sim_finish(&b);
    ps_plan_finish(&plan);
    ps_costs_destroy(costs);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
