/* Benchmarks (meson benchmark(), figures only, no assertions on time):
 *   1. [foundation] graph build + check for n=64, m=1024, except_last: nodes, edges, seconds,
 *      nodes/s, peak RSS (targets < 1 s, < 1 GiB);
 *   2. the simulation step alone on that graph: simulated nodes per second on one core
 *      (target >= 20 million/s), best of 5;
 *   3. build + check + simulate end to end for GPipe and 1F1B (targets < 2 s, < 1 GiB).
 * Each end-to-end case runs in a child process so its peak RSS is its own (getrusage
 * RUSAGE_CHILDREN after wait).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/analysis.h"
#include "sim/cost.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "sim/sim.h"
#include "src/spec.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct ps_spec *make_spec(const char *sched, int m, int n)
{
    size_t cap = (size_t)n * 64 + 1024;
    char *layers = calloc(cap, 1), *bal = calloc((size_t)n * 4 + 16, 1);
    char *json = malloc(cap + (size_t)n * 4 + 1024);
    for (int j = 0; j < n; j++) {
        strcat(layers, j ? "," : "");
        strcat(layers, "{\"op\":\"linear\",\"out\":64},{\"op\":\"relu\"}");
        strcat(bal, j ? ",2" : "2");
    }
    sprintf(json,
            "{\"pipescope\":1,\"batch\":%d,\"model\":{\"input\":[64],\"layers\":[%s],"
            "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"%s\",\"balance\":[%s],\"chunks\":%d,"
            "\"checkpoint\":\"except_last\"}}",
            m, layers, sched, bal, m);
    struct ps_spec *s = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_spec_parse(json, "bench.json", ".", &s, &d)) {
        fprintf(stderr, "%s: %s\n", d.where, d.msg);
        exit(1);
    }
    free(layers), free(bal), free(json);
    return s;
}

static int order_of(struct ps_graph *g, struct ps_order *o, struct ps_diag *d)
{
    return ps_schedule_order(g, o, d);
}

/* one case: build (+ order + check) [+ simulate]; prints one line */
static int run_case(const char *sched, int m, int n, int simulate)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    double t0 = now();
    struct ps_spec *s = make_spec(sched, m, n);
    struct ps_model *model = NULL;
    struct ps_graph *g = NULL;
    struct ps_variant o;
    if (ps_model_build(s, &model, &d)) return 1;
    ps_variant_from_spec(s, &o);
    if (ps_schedule_build(s, model, &o, &g, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        return 1;
    }
    double t1 = now();
    struct ps_order ord;
    if (order_of(g, &ord, &d)) return 1;
    double t2 = now();
    struct ps_analysis a;
    if (ps_analysis_run(g, &ord, NULL, &a, &d)) return 1;
    double t3 = now();
    double tsim = 0;
    if (simulate) {
        double *cost = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
        ps_cost_fill(g, NULL, cost, &d);
        struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(g, NULL)};
        struct ps_sim sim;
        double ts = now();
        if (ps_sim_run(g, &ord, cost, &so, &sim, &d)) return 1;
        tsim = now() - ts;
        ps_sim_finish(&sim);
        free(cost);
    }
    double t4 = now();
    printf("%-6s n=%d m=%d except_last: %u nodes, %u edges; build %.3f s, order %.3f s, check "
           "%.3f s%s%.3f s, total %.3f s, %.2f M nodes/s (total)\n",
           sched, n, m, g->n_nodes, g->n_edges, t1 - t0, t2 - t1, t3 - t2,
           simulate ? ", simulate " : "", simulate ? tsim : 0.0, t4 - t0,
           g->n_nodes / (t4 - t0) / 1e6);
    ps_analysis_finish(&a);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
    ps_model_destroy(model);
    ps_spec_destroy(s);
    return 0;
}

static void in_child(const char *what, const char *sched, int m, int n, int simulate)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) exit(run_case(sched, m, n, simulate));
    int st = 0;
    waitpid(pid, &st, 0);
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru); /* max over children so far: cases run smallest first */
    printf("  %s: exit %d, peak RSS %.1f MiB (max over the benchmark's children so far)\n", what,
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, (double)ru.ru_maxrss / 1024.0);
}

int main(int argc, char **argv)
{
    int m = argc > 1 ? atoi(argv[1]) : 1024, n = argc > 2 ? atoi(argv[2]) : 64;
    /* 2. simulation step alone */
    {
        struct ps_diag d;
        ps_diag_clear(&d);
        struct ps_spec *s = make_spec("gpipe", m, n);
        struct ps_model *model = NULL;
        struct ps_graph *g = NULL;
        struct ps_variant o;
        ps_model_build(s, &model, &d);
        ps_variant_from_spec(s, &o);
        if (ps_schedule_build(s, model, &o, &g, &d)) return 1;
        struct ps_order ord;
        if (ps_schedule_order(g, &ord, &d)) return 1;
        double *cost = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
        ps_cost_fill(g, NULL, cost, &d);
        struct ps_sim_opts so = {.launch_us = 4};
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            struct ps_sim sim;
            double t = now();
            if (ps_sim_run(g, &ord, cost, &so, &sim, &d)) return 1;
            t = now() - t;
            if (t < best) best = t;
            ps_sim_finish(&sim);
        }
        printf("full simulation (compile + timing pass + records, stats, memory, critical path), "
               "gpipe n=%d m=%d except_last: %u nodes in %.4f s = %.1f M nodes/s (best of 5)\n",
               n, m, ord.n, best, ord.n / best / 1e6);
        /* the timing pass alone, on the compiled order (what a sweep over costs repeats) */
        struct ps_sim_prog prog;
        double tc = now();
        if (ps_sim_compile(g, &ord, &prog, &d)) return 1;
        tc = now() - tc;
        double *iss = malloc(((size_t)prog.n + 1) * sizeof(double));
        double *st = malloc(((size_t)prog.n + 1) * sizeof(double));
        double *en = malloc(((size_t)prog.n + 1) * sizeof(double));
        double bs = 1e30, mk = 0;
        for (int r = 0; r < 5; r++) {
            double t = now();
            mk = ps_sim_step(&prog, cost, 4, iss, st, en, NULL);
            t = now() - t;
            if (t < bs) bs = t;
        }
        printf("simulation step (timing pass over the compiled order, makespan %.1f us): %u nodes "
               "in %.4f s = %.1f M simulated nodes/s (best of 5, one core; target >= 20); "
               "compile %.4f s once\n",
               mk, prog.n, bs, prog.n / bs / 1e6, tc);
        free(iss);
        free(st);
        free(en);
        ps_sim_prog_finish(&prog);
        free(cost);
        ps_order_finish(&ord);
        ps_graph_destroy(g);
        ps_model_destroy(model);
        ps_spec_destroy(s);
    }
    /* 1. and 3. */
    printf("[foundation] graph build + check (targets < 1 s, < 1 GiB):\n");
    in_child("build+check", "gpipe", m, n, 0);
    printf("build + check + simulate (targets < 2 s, < 1 GiB):\n");
    in_child("gpipe end to end", "gpipe", m, n, 1);
    in_child("1f1b end to end", "1f1b", m, n, 1);
    return 0;
}
