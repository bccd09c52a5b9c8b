/* Benchmark (meson benchmark(), figures only, no assertions on time): compare (src/compare.c)
 * on traces of growing size, to show it is near-linear in the number of tasks (issue
 * [data-safety] 10: 5 s for 49k tasks and 75 s for 196k before).
 *
 * For n = 64 partitions and m = 1024 ... 8192 micro-batches (GPipe, except_last) it builds the
 * graph and its order, then writes two traces itself, in the order's sequence: "simulated"
 * (every task 1 us, one after another) and "measured" (durations varied by a fixed pattern,
 * a few tasks started early so dependency violations are found), and times ps_compare_run
 * alone. Prints tasks, records, seconds and tasks per second per size; the growth factor
 * between sizes is what to read (x2 tasks should cost about x2 time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/compare.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"
#include "src/trace.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct ps_spec *make_spec(int m, int n)
{
    size_t cap = (size_t)n * 64 + 1024;
    char *layers = calloc(cap, 1), *bal = calloc((size_t)n * 4 + 16, 1);
    char *json = malloc(cap + (size_t)n * 4 + 1024);
    for (int j = 0; j < n; j++) {
        strcat(layers, j ? "," : "");
        strcat(layers, "{\"op\":\"linear\",\"out\":16},{\"op\":\"relu\"}");
        strcat(bal, j ? ",2" : "2");
    }
    sprintf(json,
            "{\"pipescope\":1,\"batch\":%d,\"model\":{\"input\":[16],\"layers\":[%s],"
            "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"gpipe\",\"balance\":[%s],\"chunks\":%d,"
            "\"checkpoint\":\"except_last\"}}",
            m, layers, bal, m);
    struct ps_spec *s = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_spec_parse(json, "bench.json", ".", &s, &d)) {
        fprintf(stderr, "%s: %s\n", d.where, d.msg);
        exit(1);
    }
    free(layers);
    free(bal);
    free(json);
    return s;
}

static int run_case(int m, int n, double *prev_s, uint32_t *prev_tasks)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_spec *s = make_spec(m, n);
    struct ps_model *model = NULL;
    struct ps_graph *g = NULL;
    struct ps_variant v;
    struct ps_order o;
    if (ps_model_build(s, &model, &d)) return 1;
    ps_variant_from_spec(s, &v);
    if (ps_schedule_build(s, model, &v, &g, &d) || ps_schedule_order(g, &o, &d)) {
        fprintf(stderr, "%s: %s\n", d.where, d.msg);
        return 1;
    }
    struct ps_trace sim, meas;
    ps_trace_init(&sim, PS_TRACE_SIMULATED);
    ps_trace_init(&meas, PS_TRACE_CPU);
    double t_sim = 0, t_meas = 0;
    uint32_t k = 0;
    for (uint32_t i = 0; i < o.n; i++) {
        uint32_t x = o.node[i];
        const struct ps_node *nd = &g->nodes[x];
        if (!ps_node_is_task(nd)) continue;
        double dm = 0.5 + (double)(k * 2654435761u % 1000) / 1000.0;
        /* one task in 10007 starts 200 us early, before its dependencies ended */
        double early = k % 10007 == 5000 ? 200.0 : 0;
        if (ps_trace_add(&sim, x, nd->device, nd->stream, t_sim, 1.0, NULL) ||
            ps_trace_add(&meas, x, nd->device, nd->stream, t_meas - early, dm, NULL))
            return 1;
        t_sim += 1.0;
        t_meas += dm;
        k++;
    }
    struct ps_compare c;
    double t0 = now();
    if (ps_compare_run(g, &sim, &meas, &c, &d)) {
        fprintf(stderr, "%s: %s\n", d.where, d.msg);
        return 1;
    }
    double secs = now() - t0;
    printf("compare n=%d m=%-5d %9u graph nodes %8u tasks: %7.3f s, %6.2f M tasks/s, "
           "%u dependencies checked, %u broken, %llu inversions",
           n, m, g->n_nodes, c.n_tasks, secs, c.n_tasks / secs / 1e6, c.n_deps_checked,
           c.n_dep_violations, (unsigned long long)c.inversions);
    if (*prev_s > 0)
        printf("; x%.2f tasks -> x%.2f time", (double)c.n_tasks / *prev_tasks, secs / *prev_s);
    printf("\n");
    fflush(stdout);
    *prev_s = secs;
    *prev_tasks = c.n_tasks;
    ps_compare_finish(&c);
    ps_trace_finish(&sim);
    ps_trace_finish(&meas);
    ps_order_finish(&o);
    ps_graph_destroy(g);
    ps_model_destroy(model);
    ps_spec_destroy(s);
    return 0;
}

int main(int argc, char **argv)
{
    int max_m = argc > 1 ? atoi(argv[1]) : 8192;
    double prev = 0;
    uint32_t prev_tasks = 0;
    for (int m = 1024; m <= max_m; m *= 2)
        if (run_case(m, 64, &prev, &prev_tasks)) return 1;
    return 0;
}
