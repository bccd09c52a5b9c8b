/* pipescope schedule: the per-rank program of a schedule (built-in or read from a CSV/JSON plan),
 * in PyTorch pipelining's action grammar, checked statically, and written as PyTorch's CSV.
 *
 *   schedule SPEC [--schedule NAME] [--chunks N] [--virtual-stages V] [--actions FILE] [--csv FILE]
 *
 * Each rank's actions are printed as <stage><F|I|W|B><micro-batch> (I = input gradient of a split
 * backward, B = full backward), with the most micro-batch stages it keeps alive at once (from F to
 * its B, or to its W when split). The plan is validated as check does: every (stage, micro-batch)
 * has one F and one B or I+W, and its graph runs to the end; a plan that deadlocks is reported
 * with the cycle of waits that forms it, exit 1. --csv writes the CSV that
 * PipelineScheduleMulti._load_csv reads as a timestep grid with idle (empty) cells, as _dump_csv
 * writes it, so both PyTorch executors run it unchanged: PipelineScheduleMulti step by step and
 * _PipelineScheduleRuntime rank by rank (it skips the idle cells). A plan that deadlocks is
 * written back to back, as read (it has no grid).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "src/cli/cli.h"
#include "src/schedule.h"
#include "viz/viz.h"

/* most stage activations alive at once in one lane: +1 at F, -1 at the action that frees it */
static int peak_alive(const struct ps_plan *p, int lane, const uint8_t *has_w)
{
    int alive = 0, peak = 0;
    for (uint32_t k = 0; k < p->len[lane]; k++) {
        const struct ps_action *a = &p->act[lane][k];
        size_t c = (size_t)a->mb * p->n_stages + a->stage;
        if (a->kind == PS_ACT_F) alive++;
        else if (a->kind == PS_ACT_W || !has_w[c]) alive--;
        if (alive > peak) peak = alive;
    }
    return peak;
}

/* GPipe has no per-rank plan: its forward follows torchgpipe's clock cycles and its backward
   the autograd engine's order, so the program each device runs is the engine's order (the same
   as `graph SPEC --order`) */
static int print_engine_order(struct ps_cli *cli, const char *name)
{
    struct ps_ctx ctx;
    int rc = ps_ctx_load(&ctx, cli, NULL);
    if (rc) return rc;
    const struct ps_graph *g = ctx.graph;
    if (cli->verbosity >= 0) {
        printf("%s: torchgpipe's clock cycles in forward, the autograd engine's order in backward "
               "(no action list; --csv needs one); %d device%s, m=%d micro-batches:\n",
               name, g->n_devices, g->n_devices == 1 ? "" : "s", ctx.spec->chunks);
        char task[64], dev[32];
        for (int d = 0; d < g->n_devices; d++) {
            int p = 0;
            while (p < ctx.spec->n_partitions && ctx.spec->device_id[p] != d) p++;
            ps_device_format(&ctx.spec->devices[p], dev, sizeof(dev));
            printf("device %s:\n ", dev);
            for (uint32_t k = 0; k < ctx.order.n; k++) {
                const struct ps_node *nd = &g->nodes[ctx.order.node[k]];
                if (!ps_node_is_task(nd) || nd->device != d) continue;
                printf(" %s", ps_node_name(g, ctx.order.node[k], task, sizeof(task)));
            }
            printf("\n");
        }
    }
    ps_ctx_finish(&ctx);
    return PS_EXIT_OK;
}

static int write_csv(FILE *f, void *ctx, struct ps_diag *d)
{
    (void)d;
    return fputs((const char *)ctx, f) < 0 ? -EIO : 0;
}

int ps_cmd_schedule(struct ps_cli *cli)
{
    const char *sched = NULL, *chunks_s = NULL, *vs_s = NULL, *actions = NULL, *csv = NULL, *v;
    for (int k = 0; k < cli->argc; k++) {
        if ((v = ps_cli_arg(cli, &k, "--schedule"))) sched = v;
        else if ((v = ps_cli_arg(cli, &k, "--chunks"))) chunks_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--virtual-stages"))) vs_s = v;
        else if ((v = ps_cli_arg(cli, &k, "--actions"))) actions = v;
        else if ((v = ps_cli_arg(cli, &k, "--csv"))) csv = v;
        else return ps_cli_usage(cli, "unknown option '%s'", cli->argv[k]);
    }
    if (!cli->spec_path) return ps_cli_usage(cli, "missing SPEC");
    int kind = -1, chunks = 0, vs = 0;
    if (sched && (kind = ps_schedule_by_name(sched)) < 0)
        return ps_cli_usage(cli, "--schedule: unknown schedule '%s' (expected one of %s)", sched,
                            ps_schedule_names());
    char *end = NULL;
    if (chunks_s && ((chunks = (int)strtol(chunks_s, &end, 10)) < 1 || *end))
        return ps_cli_usage(cli, "--chunks: expected a positive number, not '%s'", chunks_s);
    if (vs_s && ((vs = (int)strtol(vs_s, &end, 10)) < 1 || *end))
        return ps_cli_usage(cli, "--virtual-stages: expected a positive number, not '%s'", vs_s);
    if (actions && (sched || chunks_s || vs_s))
        return ps_cli_usage(cli, "--actions reads a whole plan: it does not mix with --schedule, "
                                 "--chunks or --virtual-stages");
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_graph *g = NULL;
    struct ps_order o;
    struct ps_plan plan;
    memset(&o, 0, sizeof(o));
    memset(&plan, 0, sizeof(plan));
    char *text = NULL, *stuck = NULL, *grid = NULL;
    uint8_t *has_w = NULL;
    int code = PS_EXIT_OK, rc;
    if (ps_spec_load(cli->spec_path, &spec, &d) || ps_model_build(spec, &model, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    for (int k = 0; k < spec->n_warnings; k++) ps_cli_warn(cli, "%s", spec->warnings[k]);
    struct ps_variant var;
    ps_variant_from_spec(spec, &var);
    if (kind >= 0) var.schedule = (enum ps_schedule)kind;
    if (vs) var.virtual_stages = vs;
    if (chunks && ps_variant_set_chunks(&var, spec, chunks, &d)) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    const char *name = actions ? actions : ps_schedule_ops(var.schedule)->name;
    char note[320];
    if (!actions && ps_schedule_pytorch_note(var.schedule, spec->n_partitions, var.mb_count,
                                             var.virtual_stages, note, sizeof(note)))
        ps_cli_warn(cli, "%s", note);
    rc = actions ? ps_plan_load(actions, spec, &plan, &d) : ps_schedule_plan(spec, &var, &plan, &d);
    if (rc && !actions && !ps_schedule_ops(var.schedule)->plan && !csv && !chunks && !vs) {
        code = print_engine_order(cli, name);
        goto out;
    }
    if (rc) {
        if (!actions && !ps_schedule_ops(var.schedule)->plan)
            ps_diag_hint(&d, "'pipescope graph SPEC --order' prints the order torchgpipe's autograd "
                             "engine gives it; as an action list, 'looped-bfs' with one stage per "
                             "device has the same fill-drain shape");
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (!(text = ps_plan_csv(&plan)) ||
        !(has_w = calloc((size_t)plan.n_stages * (size_t)plan.m + 1, 1))) {
        ps_diag_set(&d, -ENOMEM, "schedule", "out of memory");
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    bool split = false;
    for (int l = 0; l < plan.n_lanes; l++)
        for (uint32_t k = 0; k < plan.len[l]; k++)
            if (plan.act[l][k].kind == PS_ACT_W) {
                has_w[(size_t)plan.act[l][k].mb * plan.n_stages + plan.act[l][k].stage] = 1;
                split = true;
            }
    /* static validation: the plan's graph runs every node, or the cycle that blocks it */
    rc = ps_plan_build(spec, model, &var, &plan, &g, &d);
    if (!rc) rc = ps_plan_order(g, &o, &d);
    if (rc && rc != -EDEADLK) {
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (rc == -EDEADLK) {
        stuck = ps_plan_cycle(g, &o);
        code = PS_EXIT_FOUND;
    }
    if (cli->verbosity >= 0) {
        printf("%s: %d rank%s, %d stages, m=%d micro-batches%s\n", name, plan.n_lanes,
               plan.n_lanes == 1 ? "" : "s", plan.n_stages, plan.m,
               split ? ", backward split into I (input gradient) and W (weight gradient)" : "");
        if (plan.ignored)
            printf("skipped %u communication action%s (SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD): the "
                   "graph models every transfer as a copy\n",
                   plan.ignored, plan.ignored == 1 ? "" : "s");
        const char *row = text;
        for (int l = 0; l < plan.n_lanes; l++) {
            char dev[32];
            ps_viz_device_name(g, plan.lane_device[l], dev, sizeof(dev));
            const char *eol = strchr(row, '\n');
            int len = eol ? (int)(eol - row) : (int)strlen(row);
            int shown = len > 160 && cli->verbosity < 1 ? 160 : len;
            printf("rank %d (%s), at most %d stage activation%s alive:\n  ", l, dev,
                   peak_alive(&plan, l, has_w), peak_alive(&plan, l, has_w) == 1 ? "" : "s");
            for (int k = 0; k < shown; k++) putchar(row[k] == ',' ? ' ' : row[k]);
            printf("%s\n", shown < len ? " ... (-v shows all)" : "");
            row = eol ? eol + 1 : row + len;
        }
        if (stuck) printf("DEADLOCK: %s\n", stuck);
        else printf("valid: every (stage, micro-batch) has F and B or I+W, and all %u graph nodes run\n",
                    g->n_nodes);
    }
    if (csv && !stuck && (rc = ps_plan_csv_grid(&plan, &grid))) {
        ps_diag_set(&d, rc, csv, rc == -ENOMEM ? "out of memory" : "the plan cannot finish");
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
        goto out;
    }
    if (csv && ps_out_write(csv, write_csv, grid ? grid : text, &d))
        code = ps_cli_fail(&d, PS_EXIT_INPUT);
out:
    free(grid);
    free(text);
    free(stuck);
    free(has_w);
    ps_plan_finish(&plan);
    ps_order_finish(&o);
    ps_graph_destroy(g);
    ps_model_destroy(model);
    ps_spec_destroy(spec);
    return code;
}
