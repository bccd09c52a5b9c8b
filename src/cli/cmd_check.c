/* pipescope check: the static analysis of analysis.h as a readable summary (and JSON).
 *
 * Runs the checks on the spec's graph, then the no-phony what-if: the same graph without
 * depend() edges, which invariants it no longer guarantees (with one example pair each) and
 * how the engine's order and the peak activation memory change when recomputes hoist.
 * Exit 0 when every check holds on the spec's graph, 1 otherwise.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"
#include "src/study/study.h"
#include "sim/cost.h"
#include "viz/viz.h"
#include "viz/report.h"

static void print_checks(const struct ps_graph *g, const struct ps_analysis *a, const char *ind)
{
    char buf[64];
    for (int c = 0; c < PS_CHECK__COUNT; c++) {
        if (!a->checked[c]) continue;
        if (!a->per_check[c]) {
            printf("%s%-27s ok    (%u checked)\n", ind, ps_check_name(c), a->checked[c]);
            continue;
        }
        printf("%s%-27s FAIL  %u of %u", ind, ps_check_name(c), a->per_check[c], a->checked[c]);
        for (uint32_t k = 0; k < a->n_kept; k++)
            if (a->v[k].check == (enum ps_check)c) {
                printf(", e.g. %s", a->v[k].msg);
                break;
            }
        printf("\n");
    }
    if (a->cycle_len) {
        printf("%scycle:", ind);
        for (uint32_t k = 0; k < a->cycle_len; k++)
            printf(" %s ->", ps_node_name(g, a->cycle[k], buf, sizeof(buf)));
        printf(" %s\n", ps_node_name(g, a->cycle[0], buf, sizeof(buf)));
    }
}

static void print_memory(const struct ps_ctx *ctx, const struct ps_analysis *a,
                         const struct ps_analysis *b)
{
    char d[32], x[32], y[32];
    for (int k = 0; k < a->n_devices; k++) {
        int p = 0;
        while (p < ctx->spec->n_partitions && ctx->spec->device_id[p] != k) p++;
        ps_device_format(&ctx->spec->devices[p], d, sizeof(d));
        double pa = (double)a->mem[k].peak_bytes;
        if (!b) {
            printf("  %-8s %s\n", d, ps_viz_bytes(pa, x, sizeof(x)));
            continue;
        }
        double pb = (double)b->mem[k].peak_bytes;
        printf("  %-8s %s -> %s (%+.0f%%)\n", d, ps_viz_bytes(pa, x, sizeof(x)),
               ps_viz_bytes(pb, y, sizeof(y)), pa > 0 ? 100.0 * (pb - pa) / pa : 0.0);
    }
}

/* first position where two task orders differ, or -1 */
static int order_diff(const struct ps_graph *g1, const struct ps_order *o1,
                      const struct ps_graph *g2, const struct ps_order *o2, char *a, char *b)
{
    uint32_t i1 = o1->n_fwd, i2 = o2->n_fwd;
    int pos = 0;
    for (;;) {
        while (i1 < o1->n && !ps_node_is_task(&g1->nodes[o1->node[i1]])) i1++;
        while (i2 < o2->n && !ps_node_is_task(&g2->nodes[o2->node[i2]])) i2++;
        if (i1 >= o1->n || i2 >= o2->n) return i1 >= o1->n && i2 >= o2->n ? -1 : pos;
        ps_node_name(g1, o1->node[i1], a, 64);
        ps_node_name(g2, o2->node[i2], b, 64);
        if (strcmp(a, b)) return pos;
        i1++, i2++, pos++;
    }
}

int ps_cmd_check(struct ps_cli *cli)
{
    const char *actions = NULL, *v;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--actions"))) actions = v;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (actions && !*actions) return ps_cli_usage(cli, "--actions needs a file");
    struct ps_ctx ctx;
    int rc = ps_ctx_load(&ctx, cli, NULL);
    if (rc) return rc;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (actions) {
        /* a schedule from a file (PyTorch's CSV or a JSON plan) replaces the spec's own */
        char *cycle = NULL;
        rc = ps_ctx_use_plan(&ctx, actions, &cycle, &d);
        if (rc == -EDEADLK) {
            printf("schedule %s deadlocks; the cycle of waits: %s\n", actions,
                   cycle ? cycle : "(out of memory)");
            free(cycle);
            ps_ctx_finish(&ctx);
            return PS_EXIT_FOUND;
        }
        if (rc) {
            ps_ctx_finish(&ctx);
            return ps_cli_fail(&d, PS_EXIT_INPUT);
        }
    }
    const struct ps_spec *s = ctx.spec;
    struct ps_graph *g = ctx.graph;
    double *cost = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
    ps_cost_fill_roofline(g, cost);
    struct ps_analysis a;
    if (ps_analysis_run(g, &ctx.order, cost, &a, &d)) {
        free(cost);
        ps_ctx_finish(&ctx);
        return ps_cli_fail(&d, PS_EXIT_INPUT);
    }
    const struct ps_schedule_ops *ops = ps_schedule_ops(s->schedule);
    struct ps_whatif w;
    memset(&w, 0, sizeof(w));
    if (!actions) ps_study_whatif(s, ctx.model, &a, &w); /* a file's schedule has no phony edges */
    bool whatif = w.ran;
    const struct ps_graph *gw = w.g;
    const struct ps_analysis *bw = &w.an;

    int code = a.ok ? PS_EXIT_OK : PS_EXIT_FOUND;
    /* with --json - the report owns stdout: the human text would make it unparseable */
    if (cli->verbosity >= 0 && !(cli->json && !strcmp(cli->json, "-"))) {
        char dev[32];
        printf("spec: %s (%s)\n", s->path, s->name);
        printf("pipeline: %s, m=%d micro-batches (chunks %d), n=%d partitions on %d device%s, "
               "checkpoint %s (stop %d), batchnorm %s, phony %s%s\n",
               ps_schedule_name(s->schedule), s->mb_count, s->chunks, s->n_partitions,
               s->n_devices, s->n_devices > 1 ? "s" : "", ps_checkpoint_name(s->checkpoint),
               g->checkpoint_stop, ps_bn_policy_name(s->batchnorm),
               !ops->phony ? "n/a (explicit schedule)" : s->phony ? "on" : "off",
               s->fairscale ? " (fairscale variant)" : "");
        if (actions) printf("schedule: %s (in place of the spec's; every rank's actions run)\n", actions);
        uint32_t ph = 0;
        for (uint32_t e = 0; e < g->n_edges; e++) ph += g->edges[e].kind == PS_EDGE_PHONY;
        printf("graph: %u nodes, %u edges (%u phony)\n", g->n_nodes, g->n_edges, ph);
        printf("checks:\n");
        print_checks(g, &a, "  ");
        printf("peak activation memory per device (%s order):\n",
               ops->engine_order && !actions ? "engine" : "schedule");
        if (a.mem) print_memory(&ctx, &a, NULL);
        if (a.cp.n) {
            char b1[64], b2[64];
            printf("critical path (roofline costs): %.1f us over %u nodes, %s ... %s\n",
                   a.cp.length_us, a.cp.n, ps_node_name(g, a.cp.nodes[0], b1, sizeof(b1)),
                   ps_node_name(g, a.cp.nodes[a.cp.n - 1], b2, sizeof(b2)));
        }
        if (whatif) {
            printf("what-if without phony (fork/join) edges:\n");
            bool any = false;
            for (int c = 0; c < PS_CHECK__COUNT; c++)
                if (bw->per_check[c] && !a.per_check[c]) any = true;
            if (!any) printf("  every invariant still holds\n");
            else print_checks(gw, bw, "  ");
            char x[64], y[64];
            int p = order_diff(g, &ctx.order, gw, &w.order, x, y);
            if (p < 0)
                printf("  the engine's backward order is unchanged\n");
            else
                printf("  the engine's backward order changes at task %d: %s instead of %s\n", p,
                       y, x);
            if (a.mem && bw->mem) {
                printf("  peak activation memory as recomputes hoist:\n");
                print_memory(&ctx, &a, bw);
            }
        }
        (void)dev;
        printf("result: %s\n", a.ok ? "ok" : "violations found");
    }
    if (cli->json) {
        cJSON *root = ps_report_new();
        ps_report_add_spec(root, s);
        ps_report_add_graph(root, g);
        ps_report_add_analysis(root, g, &a, &ctx.order);
        if (whatif) {
            /* the same analysis section for the graph without depend() edges */
            cJSON *tmp = ps_report_new();
            ps_report_add_analysis(tmp, gw, bw, &w.order);
            cJSON *sec = cJSON_DetachItemFromObject(tmp, "analysis");
            if (sec) ps_json_set(root, "no_phony", sec);
            cJSON_Delete(tmp);
        }
        if (ps_report_write(root, cli->json, &d)) code = ps_cli_fail(&d, PS_EXIT_INPUT);
        cJSON_Delete(root);
    }
    free(cost);
    ps_analysis_finish(&a);
    ps_study_whatif_finish(&w);
    ps_ctx_finish(&ctx);
    return code;
}
