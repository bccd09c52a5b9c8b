/* fuzz_spec: the spec front door, as far as a spec alone reaches without files.
 *
 * Input: spec JSON text. ps_spec_parse; on success ps_model_build and, for small pipelines
 * (the cap below keeps the fuzzer from spending its time building big graphs, whose size
 * limit tests/test_graph.c checks), the task graph of the spec's schedule, its structural
 * validation, the execution order, the roofline costs and a simulation. Then the chunks override
 * that sweep and drift use (a variant). Contract checked: a failure leaves *out NULL and an error message;
 * a success keeps the invariants of spec.h (balance sums to the layers, 1 <= mb_count <= chunks).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim/cost.h"
#include "src/engine.h"
#include "tests/fuzz/fuzz.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "sim/sim.h"
#include "src/spec.h"

#define FUZZ_MAX_INPUT (64 * 1024)
#define FUZZ_MAX_NODES 4000u /* graph size the target still builds and simulates */

static void check_spec(const struct ps_spec *s)
{
    FUZZ_CHECK(s->n_layers >= 1 && s->n_partitions >= 1);
    int sum = 0;
    for (int j = 0; j < s->n_partitions; j++) {
        FUZZ_CHECK(s->balance[j] >= 1);
        FUZZ_CHECK(s->first_layer[j] == sum);
        sum += s->balance[j];
        FUZZ_CHECK(s->device_id[j] >= 0 && s->device_id[j] < s->n_devices);
    }
    FUZZ_CHECK(sum == s->n_layers);
    FUZZ_CHECK(s->chunks >= 1 && s->mb_count >= 1 && s->mb_count <= s->chunks);
    int64_t total = 0;
    for (int i = 0; i < s->mb_count; i++) {
        FUZZ_CHECK(s->mb_size[i] >= 1);
        total += s->mb_size[i];
    }
    FUZZ_CHECK(total == s->batch);
}

static void graph_and_sim(const struct ps_spec *s, const struct ps_model *m,
                          const struct ps_variant *vo)
{
    struct ps_variant o;
    if (vo) o = *vo;
    else ps_variant_from_spec(s, &o);
    uint64_t nodes, edges;
    ps_graph_estimate(o.mb_count, s->n_partitions * o.virtual_stages, o.checkpoint, &nodes,
                      &edges);
    if (nodes > FUZZ_MAX_NODES) return;
    struct ps_graph *g = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_schedule_build(s, m, &o, &g, &d);
    if (rc) {
        FUZZ_CHECK(rc < 0 && !g && d.msg[0]);
        return;
    }
    ps_diag_clear(&d);
    rc = ps_graph_validate(g, &d);
    if (rc) fprintf(stderr, "fuzz_spec: invalid graph: %s\n", d.msg);
    FUZZ_CHECK(rc == 0);
    struct ps_order order;
    memset(&order, 0, sizeof(order));
    ps_diag_clear(&d);
    rc = ps_schedule_order(g, &order, &d);
    if (rc == 0) {
        double *cost = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
        FUZZ_CHECK(cost != NULL);
        ps_diag_clear(&d);
        if (ps_cost_fill(g, NULL, cost, &d) == 0) {
            struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(g, NULL)};
            struct ps_sim sim;
            memset(&sim, 0, sizeof(sim));
            ps_diag_clear(&d);
            rc = ps_sim_run(g, &order, cost, &so, &sim, &d);
            FUZZ_CHECK(rc == 0 || d.msg[0]);
            ps_sim_finish(&sim);
        }
        free(cost);
    } else {
        FUZZ_CHECK(rc < 0 && d.msg[0]);
    }
    ps_order_finish(&order);
    ps_graph_destroy(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT) return 0;
    char *json = malloc(size + 1);
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    struct ps_spec *s = (struct ps_spec *)1;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, "fuzz.json", "/nonexistent", &s, &d);
    free(json);
    if (rc) {
        FUZZ_CHECK(rc < 0 && s == NULL && d.msg[0] && d.code == rc);
        return 0;
    }
    check_spec(s);
    struct ps_model *m = NULL;
    ps_diag_clear(&d);
    rc = ps_model_build(s, &m, &d);
    if (rc) {
        FUZZ_CHECK(rc < 0 && m == NULL && d.msg[0]);
    } else {
        FUZZ_CHECK(m->n_layers == s->n_layers && m->n_partitions == s->n_partitions);
        graph_and_sim(s, m, NULL);
        /* the override sweep and drift apply (a variant): a size derived from the input */
        ps_diag_clear(&d);
        int chunks = 1 + (int)(size % 9);
        struct ps_variant v;
        ps_variant_from_spec(s, &v);
        if (ps_variant_set_chunks(&v, s, chunks, &d) == 0) {
            FUZZ_CHECK(v.chunks == chunks && v.mb_count >= 1 && v.mb_count <= chunks);
            int64_t total = 0;
            for (int i = 0; i < v.mb_count; i++) {
                FUZZ_CHECK(ps_variant_mb_size(&v, i) >= 1);
                total += ps_variant_mb_size(&v, i);
            }
            FUZZ_CHECK(total == s->batch);
            graph_and_sim(s, m, &v);
        } else {
            FUZZ_CHECK(d.msg[0]);
        }
    }
    ps_model_destroy(m);
    ps_spec_destroy(s);
    return 0;
}
