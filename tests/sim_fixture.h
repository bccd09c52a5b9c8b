/* Shared fixture of test_sim.c and test_schedule.c: a spec of n partitions (linear + relu each)
 * built from a JSON string, its model, a graph of the given schedule and its execution order,
 * and uniform test costs (F = f, B = b, Wg = w, R = r, everything else free). */
#ifndef PS_SIM_FIXTURE_H
#define PS_SIM_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "sim/sim.h"
#include "src/spec.h"

/* cmocka 1.1.5 has no assert_double_equal */
#define assert_near(a, b, eps)                                                                \
    do {                                                                                       \
        double x_ = (a), y_ = (b);                                                             \
        if (!(x_ - y_ <= (eps) && y_ - x_ <= (eps))) {                                         \
            print_error("%.17g != %.17g\n", x_, y_);                                           \
            fail();                                                                            \
        }                                                                                      \
    } while (0)

struct fx {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *g;
    struct ps_order o;
    double *cost;
};

static inline int fx_load(struct fx *f, const char *sched, int m, int n, int v, const char *ckpt,
                   const char *bn, struct ps_diag *d)
{
    char json[8192], layers[4096] = "", bal[1024] = "";
    for (int j = 0; j < n; j++) {
        strcat(layers, j ? "," : "");
        strcat(layers, "{\"op\":\"linear\",\"out\":4},{\"op\":\"batchnorm\"}");
        strcat(bal, j ? ",2" : "2");
    }
    snprintf(json, sizeof(json),
             "{\"pipescope\":1,\"batch\":%d,\"model\":{\"input\":[4],\"layers\":[%s],"
             "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"%s\",\"balance\":[%s],\"chunks\":%d,"
             "\"checkpoint\":\"%s\",\"batchnorm\":\"%s\",\"virtual_stages\":%d}}",
             2 * m, layers, sched, bal, m, ckpt, bn, v);
    memset(f, 0, sizeof(*f));
    ps_diag_clear(d);
    int rc = ps_spec_parse(json, "t.json", ".", &f->spec, d);
    if (!rc) rc = ps_model_build(f->spec, &f->model, d);
    if (rc) return rc;
    struct ps_variant o;
    ps_variant_from_spec(f->spec, &o);
    rc = ps_schedule_build(f->spec, f->model, &o, &f->g, d);
    if (rc) return rc;
    rc = ps_schedule_order(f->g, &f->o, d);
    return rc;
}

static inline void fx_costs(struct fx *f, double fw, double bw, double ww, double rw)
{
    free(f->cost);
    f->cost = calloc((size_t)f->g->n_nodes + 1, sizeof(double));
    for (uint32_t v = 0; v < f->g->n_nodes; v++) {
        const struct ps_node *nd = &f->g->nodes[v];
        if (nd->kind == PS_NODE_COMPUTE) f->cost[v] = nd->phase == PS_PHASE_FWD ? fw : bw;
        else if (nd->kind == PS_NODE_WGRAD) f->cost[v] = ww;
        else if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD) f->cost[v] = rw;
    }
}

static inline void fx_free(struct fx *f)
{
    free(f->cost);
    ps_order_finish(&f->o);
    ps_graph_destroy(f->g);
    ps_model_destroy(f->model);
    ps_spec_destroy(f->spec);
    memset(f, 0, sizeof(*f));
}

#endif
