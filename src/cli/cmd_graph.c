/* pipescope graph: the task graph as DOT or SVG, its counts, or the engine's execution order.
 *
 * --order prints the execution order of viz/REPORT.md: one task per line, F(i,j) forward, R(i,j)
 * recompute, B(i,j) backward; with several devices, each device's order under "# device X".
 */
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"
#include "viz/viz.h"

static void print_order(const struct ps_ctx *ctx, FILE *f)
{
    const struct ps_graph *g = ctx->graph;
    const struct ps_order *o = &ctx->order;
    char name[64], dev[32];
    for (int d = 0; d < g->n_devices; d++) {
        if (g->n_devices > 1) {
            int p = 0;
            while (p < ctx->spec->n_partitions && ctx->spec->device_id[p] != d) p++;
            ps_device_format(&ctx->spec->devices[p], dev, sizeof(dev));
            fprintf(f, "# device %s\n", dev);
        }
        for (uint32_t k = 0; k < o->n; k++) {
            const struct ps_node *nd = &g->nodes[o->node[k]];
            if (!ps_node_is_task(nd) || nd->device != d) continue;
            fprintf(f, "%s\n", ps_node_name(g, o->node[k], name, sizeof(name)));
        }
    }
}

int ps_cmd_graph(struct ps_cli *cli)
{
    bool order = false, nophony = false, tasks = false;
    int iteration = 0;
    enum ps_dot_filter filter = PS_DOT_ALL;
    const char *dot = NULL, *v;
    for (int k = 0; k < cli->argc; k++) {
        if (ps_cli_flag(cli, k, "--order")) order = true;
        else if (ps_cli_flag(cli, k, "--no-phony")) nophony = true;
        else if (ps_cli_flag(cli, k, "--tasks")) tasks = true;
        else if (ps_cli_flag(cli, k, "--forward")) filter = PS_DOT_FORWARD;
        else if (ps_cli_flag(cli, k, "--backward")) filter = PS_DOT_BACKWARD;
        else if (ps_cli_flag(cli, k, "--all")) filter = PS_DOT_ALL;
        else if ((v = ps_cli_arg(cli, &k, "--dot"))) dot = v;
        else if ((v = ps_cli_arg(cli, &k, "--iteration"))) {
            char *end;
            long it = strtol(v, &end, 10);
            if (!*v || *end || it < 0 || it > 1000000)
                return ps_cli_usage(cli, "--iteration needs an integer in [0, 1000000]");
            iteration = (int)it;
        }
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (dot && !*dot) return ps_cli_usage(cli, "--dot needs a file");
    struct ps_ctx ctx;
    int rc = ps_ctx_load(&ctx, cli, NULL);
    if (rc) return rc;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (nophony || iteration) {
        struct ps_variant o;
        ps_variant_from_spec(ctx.spec, &o);
        o.phony = !nophony && ctx.spec->phony;
        o.iteration = iteration;
        if ((rc = ps_ctx_rebuild(&ctx, &o, &d))) {
            ps_ctx_finish(&ctx);
            return ps_cli_fail(&d, PS_EXIT_INPUT);
        }
    }
    const struct ps_graph *g = ctx.graph;
    int code = 0;
    struct ps_dot_opts vo;
    ps_dot_opts_init(&vo);
    vo.filter = filter;
    vo.tasks_only = tasks;
    vo.title = ctx.spec->name;
    if (dot && ps_dot_write_file(g, &vo, dot, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
    if (!code && cli->svg && ps_svg_write_file(g, &vo, cli->svg, &d))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
    if (!code && cli->json) {
        cJSON *root = ps_report_new();
        ps_report_add_spec(root, ctx.spec);
        ps_report_add_graph(root, g);
        cJSON *an = cJSON_CreateObject();
        if (an) {
            cJSON *ord = ps_report_order(g, &ctx.order);
            if (ord) cJSON_AddItemToObject(an, "order", ord);
            ps_json_set(root, "analysis", an);
        }
        if (ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
        cJSON_Delete(root);
    }
    if (!code && order) print_order(&ctx, stdout);
    if (!code && !order && cli->verbosity >= 0 && !(cli->json && !strcmp(cli->json, "-"))) {
        uint32_t by_kind[PS_EDGE__COUNT] = {0};
        for (uint32_t e = 0; e < g->n_edges; e++) by_kind[g->edges[e].kind]++;
        printf("graph: %u nodes, %u edges (%u data, %u phony, %u host), %d streams\n", g->n_nodes,
               g->n_edges, by_kind[PS_EDGE_DATA], by_kind[PS_EDGE_PHONY], by_kind[PS_EDGE_HOST],
               g->n_streams);
    }
    ps_ctx_finish(&ctx);
    return code;
}
