/* fuzz_trace: the Chrome / Kineto trace importer (src/trace_read.c) and the comparison that
 * consumes what it imports (src/compare.c).
 *
 * The graph is examples/small-3x3.json's (3 partitions x 3 micro-batches, checkpointed), built
 * and simulated once; each input is a trace file that ps_trace_parse maps onto it (the buffer is
 * not NUL-terminated, so a read past its end is an ASan report). An imported trace is then
 * compared with the simulation. Contract checked: a failure leaves the trace empty and says why;
 * a success maps records to real nodes (or UINT32_MAX with a name) with finite times.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/compare.h"
#include "src/engine.h"
#include "tests/fuzz/fuzz.h"
#include "src/graph.h"
#include "src/model.h"
#include "sim/sim.h"
#include "sim/cost.h"
#include "src/spec.h"
#include "src/trace_read.h"
#include "src/schedule.h"

static const char SPEC[] =
    "{\"pipescope\": 1, \"batch\": 6, \"model\": {\"input\": [8], \"layers\": ["
    "{\"op\": \"linear\", \"out\": 8}, {\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 8},"
    "{\"op\": \"relu\"}, {\"op\": \"linear\", \"out\": 4}], \"loss\": \"sum\"},"
    "\"pipeline\": {\"balance\": [2, 2, 1], \"devices\": [\"cpu\", \"cpu\", \"cpu\"],"
    "\"chunks\": 3, \"checkpoint\": \"except_last\"}}";

static struct {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *g;
    struct ps_order order;
    double *cost;
    struct ps_sim sim;
} G;

static void cleanup(void)
{
    ps_sim_finish(&G.sim);
    free(G.cost);
    ps_order_finish(&G.order);
    ps_graph_destroy(G.g);
    ps_model_destroy(G.model);
    ps_spec_destroy(G.spec);
    memset(&G, 0, sizeof(G));
}

static void setup(void)
{
    struct ps_diag d;
    ps_diag_clear(&d);
    struct ps_variant o;
    int rc = ps_spec_parse(SPEC, "fuzz.json", "/", &G.spec, &d);
    if (!rc) rc = ps_model_build(G.spec, &G.model, &d);
    if (!rc) {
        ps_variant_from_spec(G.spec, &o);
        rc = ps_schedule_build(G.spec, G.model, &o, &G.g, &d);
    }
    if (!rc) rc = ps_schedule_order(G.g, &G.order, &d);
    if (!rc) {
        G.cost = malloc(((size_t)G.g->n_nodes + 1) * sizeof(double));
        rc = G.cost ? ps_cost_fill(G.g, NULL, G.cost, &d) : -1;
    }
    struct ps_sim_opts so = {.launch_us = 1};
    if (!rc) rc = ps_sim_run(G.g, &G.order, G.cost, &so, &G.sim, &d);
    if (rc) {
        fprintf(stderr, "fuzz_trace: setup: %s\n", d.msg);
        abort();
    }
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20)) return 0;
    if (!G.g) setup();
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct ps_trace t;
    struct ps_trace_read_info info;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_trace_parse(buf, size, "fuzz.json", G.g, &t, &info, &d);
    free(buf);
    if (rc) {
        FUZZ_CHECK(rc < 0 && d.msg[0] && t.n == 0 && t.r == NULL && info.n_names == 0 &&
                   info.threads == NULL);
        return 0;
    }
    for (uint32_t k = 0; k < t.n; k++) {
        const struct ps_trace_rec *r = &t.r[k];
        FUZZ_CHECK(r->node == UINT32_MAX ? r->name != NULL : r->node < G.g->n_nodes);
        FUZZ_CHECK(isfinite(r->start_us) && isfinite(r->dur_us) && r->dur_us >= 0);
    }
    FUZZ_CHECK(info.n_names <= PS_TRACE_READ_MAX_NAMES);
    struct ps_compare c;
    memset(&c, 0, sizeof(c));
    ps_diag_clear(&d);
    rc = ps_compare_run(G.g, &G.sim.trace, &t, &c, &d);
    if (rc == 0) {
        double *err = ps_compare_node_errors(&c, G.g);
        free(err);
    } else {
        FUZZ_CHECK(rc < 0 && d.msg[0]);
    }
    ps_compare_finish(&c);
    ps_trace_read_info_finish(&info);
    ps_trace_finish(&t);
    return 0;
}
