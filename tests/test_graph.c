/* Tests of graph, engine and analysis against hand-worked cases.
 *
 * The m=2, n=2, except_last case is worked out by hand in the comments below: node and edge
 * counts, the sequence numbers each thread assigns, and the backward order the engine takes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim/sim.h"
#include "src/analysis.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/model.h"
#include "src/schedule.h"
#include "src/spec.h"

struct fix {
    struct ps_spec *spec;
    struct ps_model *model;
    struct ps_graph *g;
    struct ps_order o;
};

static void load(struct fix *f, int m, int n, const char *ckpt, bool phony, const char *variant,
                 const char *devices)
{
    char json[4096], layers[2048] = "", bal[512] = "";
    for (int j = 0; j < n; j++) {
        strcat(layers, j ? "," : "");
        strcat(layers, "{\"op\":\"linear\",\"out\":4},{\"op\":\"relu\"}");
        strcat(bal, j ? ",2" : "2");
    }
    snprintf(json, sizeof(json),
             "{\"pipescope\":1,\"batch\":%d,\"model\":{\"input\":[4],\"layers\":[%s],"
             "\"loss\":\"sum\"},\"pipeline\":{\"balance\":[%s],\"chunks\":%d,"
             "\"checkpoint\":\"%s\",\"phony\":%s,\"variant\":\"%s\"%s}}",
             2 * m, layers, bal, m, ckpt, phony ? "true" : "false", variant, devices);
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(f, 0, sizeof(*f));
    int rc = ps_spec_parse(json, "t.json", ".", &f->spec, &d);
    if (rc) fprintf(stderr, "%s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(ps_model_build(f->spec, &f->model, &d), 0);
    struct ps_variant o;
    ps_variant_from_spec(f->spec, &o);
    assert_int_equal(ps_schedule_build(f->spec, f->model, &o, &f->g, &d), 0);
    assert_int_equal(ps_graph_validate(f->g, &d), 0);
    assert_int_equal(ps_schedule_order(f->g, &f->o, &d), 0);
}

static void cpu_devices(int n, char *buf)
{
    strcpy(buf, ",\"devices\":[");
    for (int j = 0; j < n; j++) strcat(buf, j ? ",\"cpu\"" : "\"cpu\"");
    strcat(buf, "]");
}

static void unload(struct fix *f)
{
    ps_order_finish(&f->o);
    ps_graph_destroy(f->g);
    ps_model_destroy(f->model);
    ps_spec_destroy(f->spec);
}

static uint32_t count_edges(const struct ps_graph *g, enum ps_edge_kind k)
{
    uint32_t c = 0;
    for (uint32_t e = 0; e < g->n_edges; e++) c += g->edges[e].kind == k;
    return c;
}

static void task_order(const struct fix *f, char *out, size_t len)
{
    out[0] = '\0';
    char name[64];
    for (uint32_t k = 0; k < f->o.n; k++) {
        if (!ps_node_is_task(&f->g->nodes[f->o.node[k]])) continue;
        ps_node_name(f->g, f->o.node[k], name, sizeof(name));
        if (strlen(out) + strlen(name) + 2 < len) {
            strcat(out, out[0] ? " " : "");
            strcat(out, name);
        }
    }
}

/* m=2, n=2, except_last (stop 1), phony, one cpu device.
 * Forward nodes: F 4, C 2, W 2, Wo 2, fork/join 2 each (tasks (1,0) and (1,1)), rfork/r/rjoin
 * for micro-batch 0 on both partitions (6), loss 1: 21; with backward twins 42.
 * Forward data edges: fork(0,0) 1, C 2, W 2, F 3 (F(0,0) reads the raw input), Wo 2,
 * fork(0,1) 1, join(1,1) 1 (join(1,0) joins into the raw input), rfork 2, r(0,1) 1 (its
 * task input W(0,1); r(0,0)'s input is the raw input), rjoin 2, loss 2 = 19; phony: join 2,
 * r 2, rjoin 2 = 6. Backward twins repeat them reversed, and loss -> loss' starts backward:
 * data 19 + 19 + 1 = 39, phony 12. */
static void test_counts_m2n2(void **state)
{
    (void)state;
    struct fix f;
    char dev[256];
    cpu_devices(2, dev);
    load(&f, 2, 2, "except_last", true, "torchgpipe", dev);
    assert_int_equal(f.g->n_nodes, 42);
    assert_int_equal(count_edges(f.g, PS_EDGE_DATA), 39);
    assert_int_equal(count_edges(f.g, PS_EDGE_PHONY), 12);
    assert_int_equal(f.g->checkpoint_stop, 1);
    unload(&f);
}

/* More combinations, each worked out by hand (forward part; backward twins double it, plus the
 * loss -> loss' edge):
 * m=1, n=1, never: F, loss = 2 forward nodes (4 in all); data edges: loss <- F = 1, so 1+1+1 = 3.
 * m=3, n=1, always (stop 3): F 3, fork/join 2 each (tasks (1,0) and (2,0)), rfork/r/rjoin 3 each,
 *   loss = 17 (34). Data: fork(0,0) <- rjoin(0,0), fork(1,0) <- rjoin(1,0) (2); F(1,0) <- join,
 *   F(2,0) <- join (2); rfork <- F (3); r(1,0), r(2,0) <- their joined input (2); rjoin <- rfork
 *   (3); loss <- fork(0,0), fork(1,0), rjoin(2,0) (3) = 15 -> 31. Phony: join 2, r 3, rjoin 3 = 8
 *   -> 16.
 * m=2, n=3, never: F 6, C/W/Wo 2x2 each (12), fork/join 3 each (6), loss = 25 (50). Data: micro-
 *   batch 0: Wo, fork, C, W, F, Wo, fork, C, W, F, fork = 11; micro-batch 1: F(1,0) <- join, Wo,
 *   join(1,1), C, W, F, Wo, join(1,2), C, W, F = 11; loss 2: 24 -> 49. Phony: the 3 joins -> 6. */
static void test_counts_more(void **state)
{
    (void)state;
    struct {
        int m, n;
        const char *ckpt;
        uint32_t nodes, data, phony;
    } c[] = {{1, 1, "never", 4, 3, 0}, {3, 1, "always", 34, 31, 16}, {2, 3, "never", 50, 49, 6}};
    for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
        struct fix f;
        char dev[256];
        cpu_devices(c[k].n, dev);
        load(&f, c[k].m, c[k].n, c[k].ckpt, true, "torchgpipe", dev);
        assert_int_equal(f.g->n_nodes, c[k].nodes);
        assert_int_equal(count_edges(f.g, PS_EDGE_DATA), c[k].data);
        assert_int_equal(count_edges(f.g, PS_EDGE_PHONY), c[k].phony);
        unload(&f);
    }
}

/* Sequence numbers (main M, worker W): tick 0: F(0,0)=W0, Wo(0,0)=M0, rfork M1, r M2, rjoin M3;
 * tick 1: fork(0,0) M4, join(1,0) M5, C(0,0->1) M6, W(0,1) M7, F(1,0)=W1..W3, F(0,1)=W4,
 * Wo(1,0) M8, rfork(0,1) M9, r(0,1) M10, rjoin(0,1) M11; tick 2: fork(0,1) M12, join(1,1) M13,
 * C(1,0->1) M14, W(1,1) M15, F(1,1)=W5..W7; loss M16..M17.
 * Backward by hand: loss' -> B(1,1) (7,6,5) -> W'(1,1) 15 -> C' 14 -> join'(1,1) 13 makes
 * Wo'(1,0) 8 and fork'(0,1) 12 ready; 12 -> rjoin'(0,1) 11 -> R(0,1) 10 -> rfork'(0,1) 9 ->
 * B(0,1) ready (4) beside Wo'(1,0) 8: 8 runs, B(1,0) ready (3); 4 runs: B(0,1); then W'(0,1) 7,
 * C' 6, B(1,0) 3..1, join'(1,0) 5, fork'(0,0) 4, rjoin' 3, R(0,0) 2, rfork' 1, Wo'(0,0) 0,
 * B(0,0). */
static void test_engine_order_m2n2(void **state)
{
    (void)state;
    struct fix f;
    char dev[256], got[1024];
    cpu_devices(2, dev);
    load(&f, 2, 2, "except_last", true, "torchgpipe", dev);
    task_order(&f, got, sizeof(got));
    assert_string_equal(got, "F(0,0) F(1,0) F(0,1) F(1,1) B(1,1) R(0,1) B(0,1) B(1,0) R(0,0) "
                             "B(0,0)");
    unload(&f);
}

static void test_analysis_ok_and_nophony(void **state)
{
    (void)state;
    struct fix f;
    char dev[256];
    cpu_devices(3, dev);
    load(&f, 4, 3, "except_last", true, "torchgpipe", dev);
    struct ps_analysis a;
    struct ps_diag d;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_true(a.ok);
    assert_int_equal(a.checked[PS_CHECK_FORWARD_ORDER], 3 * 3);
    assert_int_equal(a.checked[PS_CHECK_BACKWARD_ORDER], 3 * 3);
    /* R(i,j) hb B(i,j) for the 3 checkpointed micro-batches, B(i+1,j) hb R(i,j) for all 3 */
    assert_int_equal(a.checked[PS_CHECK_RECOMPUTE], 3 * 3 + 3 * 3);
    assert_true(a.checked[PS_CHECK_RACE] > 0);
    ps_analysis_finish(&a);
    unload(&f);

    load(&f, 4, 3, "except_last", false, "torchgpipe", dev);
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_false(a.ok);
    /* without depend() nothing orders backward of different micro-batches */
    assert_int_equal(a.per_check[PS_CHECK_BACKWARD_ORDER], 3 * 3);
    assert_true(a.per_check[PS_CHECK_RECOMPUTE] > 0);
    /* forward order still holds: the host's clock-cycle barrier */
    assert_int_equal(a.per_check[PS_CHECK_FORWARD_ORDER], 0);
    ps_analysis_finish(&a);
    unload(&f);

    /* fairscale skips depend() on partition 0 only */
    load(&f, 4, 3, "never", true, "fairscale", dev);
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.per_check[PS_CHECK_BACKWARD_ORDER], 3);
    for (uint32_t k = 0; k < a.n_kept; k++)
        if (a.v[k].check == PS_CHECK_BACKWARD_ORDER) assert_int_equal(f.g->nodes[a.v[k].a].part, 0);
    ps_analysis_finish(&a);
    unload(&f);
}

static void test_race_detected(void **state)
{
    (void)state;
    struct fix f;
    char dev[256];
    cpu_devices(2, dev);
    load(&f, 2, 2, "never", true, "torchgpipe", dev);
    /* break the event of W(1,1): compute no longer waits for the copy stream */
    for (uint32_t v = 0; v < f.g->n_nodes; v++) {
        struct ps_node *nd = &f.g->nodes[v];
        if (nd->kind == PS_NODE_WAIT && nd->role == PS_ROLE_IN && nd->phase == PS_PHASE_FWD &&
            nd->mb == 1 && nd->part == 1)
            nd->wait_on = -1;
    }
    struct ps_analysis a;
    struct ps_diag d;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.per_check[PS_CHECK_RACE], 1);
    char n1[64], n2[64];
    for (uint32_t k = 0; k < a.n_kept; k++)
        if (a.v[k].check == PS_CHECK_RACE) {
            assert_string_equal(ps_node_name(f.g, a.v[k].a, n1, sizeof(n1)), "C(1,0->1)");
            assert_string_equal(ps_node_name(f.g, a.v[k].b, n2, sizeof(n2)), "F(1,1)");
        }
    ps_analysis_finish(&a);
    unload(&f);
}

static void test_cycle_reported(void **state)
{
    (void)state;
    struct fix f;
    char dev[256];
    cpu_devices(2, dev);
    load(&f, 2, 2, "never", true, "torchgpipe", dev);
    /* B(0,0) before F(1,1): F(1,1) -> ... -> B(0,0) already holds, so this closes a cycle */
    ps_graph_add_edge(f.g, f.g->bwd[0], f.g->fwd[3], PS_EDGE_HOST);
    assert_int_equal(ps_graph_finalize(f.g), 0);
    struct ps_analysis a;
    struct ps_diag d;
    assert_int_equal(ps_analysis_run(f.g, NULL, NULL, &a, &d), 0);
    assert_false(a.ok);
    assert_int_equal(a.per_check[PS_CHECK_CYCLE], 1);
    assert_true(a.cycle_len >= 2);
    /* every consecutive pair of the reported cycle is an edge */
    for (uint32_t k = 0; k < a.cycle_len; k++) {
        uint32_t x = a.cycle[k], y = a.cycle[(k + 1) % a.cycle_len];
        bool found = false;
        for (uint32_t q = f.g->out_off[x]; q < f.g->out_off[x + 1]; q++)
            found |= f.g->edges[f.g->out_edge[q]].dst == y;
        assert_true(found);
    }
    ps_analysis_finish(&a);
    unload(&f);
}

/* Peak memory of one partition [linear 4->4, relu], checkpoint never, m = 4 micro-batches of 2
 * samples, worked by hand (src/model.c "Activation memory"). Per sample: the linear keeps its
 * input (4 floats, 16 B); the relu keeps its output, which is the model output and leaves the
 * partition, so its input (16 B, the same size) stands for it: 32 B per sample, 64 B per
 * micro-batch kept until B. Inside F(i) the model output (2 x 4 floats = 32 B) lives until the
 * loss at F's end. So when backward starts 4 x 64 = 256 B are kept, and the peak is inside F(3):
 * 3 x 64 kept + 64 of its own + its 32 B output = 288 B. */
static void test_memory_never(void **state)
{
    (void)state;
    struct fix f;
    char dev[256];
    cpu_devices(1, dev);
    load(&f, 4, 1, "never", true, "torchgpipe", dev);
    struct ps_analysis a;
    struct ps_diag d;
    assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
    assert_int_equal(a.mem[0].peak_bytes, 288);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(f.g->nodes[f.g->fwd[i]].act_bytes, 64);
        assert_int_equal(f.g->nodes[f.g->bwd[i]].act_bytes, -64);
    }
    ps_analysis_finish(&a);
    unload(&f);
}

/* Activation bytes and peak memory, worked by hand (src/model.c "Activation memory"). One
 * partition [linear 4->8, relu, linear 8->2], batch 4 in 2 micro-batches of 2 samples, one
 * device. Buffers per sample: b0 the input (4 floats, 16 B), b1 the first linear's output (32 B),
 * b2 the relu's output (32 B), b3 the model output (2 floats, 8 B).
 *   F plain keeps b0 (the linear's input) and b2 (the relu's output, which is also the second
 *          linear's input: one tensor, counted once): 48 B per sample, 96 B per micro-batch. While
 *          it runs: b1 (32) then b0 kept (48), b2 (80, the high-water), b1 freed (48), b3 (56),
 *          freed by the loss: net 96, peak 160 per micro-batch.
 *   F checkpointed keeps only b0: net 32; the same high-water 160 (b0 + b1 + b2 at the relu).
 *   R from b0: b1 (32), b2 (64, the high-water), b1 freed; it skips the last linear (nothing
 *          reads its output): net 64, peak 128 per micro-batch.
 *   B frees everything of its micro-batch: -96 (plain 96, or checkpointed 32 + R 64).
 * GPipe (F0 F1 | B1 R0 B0 with except_last; F0 F1 | R1 B1 R0 B0 with always):
 *   except_last: F0 peak 160, then 32; F1 32 + 160 = 192, then 128; B1 32; R0 32 + 128 = 160.
 *                Peak 192.
 *   always:      F0 160 -> 32; F1 32 + 160 = 192 -> 64; R1 64 + 128 = 192 -> 128; B1 -> 32;
 *                R0 160. Peak 192.
 *   never:       F0 160 -> 96; F1 96 + 160 = 256 -> 192. Peak 256.
 * 1F1B on one stage (F0 [R0] B0 F1 [R1] B1): one micro-batch alive at a time: peak 160.
 * The same peak holds in the engine-order analysis (`check`) and in the simulated timeline,
 * which holds a task's high-water from its start to its end. */
static void test_checkpoint_bytes_and_peak(void **state)
{
    (void)state;
    const struct {
        const char *sched, *ckpt;
        int64_t f0, f1, peak;
    } cases[] = {
        {"gpipe", "except_last", 32, 96, 192},
        {"gpipe", "always", 32, 32, 192},
        {"gpipe", "never", 96, 96, 256},
        {"1f1b", "except_last", 32, 96, 160},
        {"1f1b", "always", 32, 32, 160},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char json[1024];
        snprintf(json, sizeof(json),
                 "{\"pipescope\":1,\"batch\":4,\"model\":{\"input\":[4],\"layers\":["
                 "{\"op\":\"linear\",\"out\":8},{\"op\":\"relu\"},{\"op\":\"linear\",\"out\":2}],"
                 "\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"%s\",\"balance\":[3],"
                 "\"devices\":[\"cpu\"],\"chunks\":2,\"checkpoint\":\"%s\",\"phony\":false}}",
                 cases[c].sched, cases[c].ckpt);
        struct fix f;
        struct ps_diag d;
        ps_diag_clear(&d);
        memset(&f, 0, sizeof(f));
        assert_int_equal(ps_spec_parse(json, "t.json", ".", &f.spec, &d), 0);
        assert_int_equal(ps_model_build(f.spec, &f.model, &d), 0);
        struct ps_variant o;
        ps_variant_from_spec(f.spec, &o);
        assert_int_equal(ps_schedule_build(f.spec, f.model, &o, &f.g, &d), 0);
        assert_int_equal(ps_schedule_order(f.g, &f.o, &d), 0);
        const struct ps_graph *g = f.g;
        if (g->nodes[g->fwd[0]].act_bytes != cases[c].f0 ||
            g->nodes[g->fwd[1]].act_bytes != cases[c].f1)
            fail_msg("%s/%s: F bytes %lld %lld, expected %lld %lld", cases[c].sched,
                     cases[c].ckpt, (long long)g->nodes[g->fwd[0]].act_bytes,
                     (long long)g->nodes[g->fwd[1]].act_bytes, (long long)cases[c].f0,
                     (long long)cases[c].f1);
        for (int i = 0; i < 2; i++) {
            if (g->rec[i] != PS_NONE) assert_int_equal(g->nodes[g->rec[i]].act_bytes, 64);
            assert_int_equal(g->nodes[g->bwd[i]].act_bytes, -96);
        }
        struct ps_analysis a;
        assert_int_equal(ps_analysis_run(f.g, &f.o, NULL, &a, &d), 0);
        if (a.mem[0].peak_bytes != cases[c].peak)
            fail_msg("%s/%s: check's peak %lld, expected %lld", cases[c].sched, cases[c].ckpt,
                     (long long)a.mem[0].peak_bytes, (long long)cases[c].peak);
        ps_analysis_finish(&a);
        /* the simulator, with any costs (F 1, B 2, R 1, launch 1) */
        double *cost = calloc(g->n_nodes, sizeof(double));
        for (uint32_t v = 0; v < g->n_nodes; v++) {
            const struct ps_node *n = &g->nodes[v];
            if (n->kind == PS_NODE_COMPUTE) cost[v] = n->phase == PS_PHASE_FWD ? 1 : 2;
            else if (n->kind == PS_NODE_RECOMPUTE && n->phase == PS_PHASE_BWD) cost[v] = 1;
        }
        struct ps_sim_opts so = {.launch_us = 1};
        struct ps_sim s;
        assert_int_equal(ps_sim_run(g, &f.o, cost, &so, &s, &d), 0);
        if (s.dev[0].peak_bytes != cases[c].peak)
            fail_msg("%s/%s: simulated peak %lld, expected %lld", cases[c].sched, cases[c].ckpt,
                     (long long)s.dev[0].peak_bytes, (long long)cases[c].peak);
        /* everything is freed by the end of the iteration */
        assert_int_equal(s.dev[0].mem[s.dev[0].n_mem - 1].bytes, 0);
        ps_sim_finish(&s);
        free(cost);
        unload(&f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_m2n2),
        cmocka_unit_test(test_counts_more),
        cmocka_unit_test(test_engine_order_m2n2),
        cmocka_unit_test(test_analysis_ok_and_nophony),
        cmocka_unit_test(test_race_detected),
        cmocka_unit_test(test_cycle_reported),
        cmocka_unit_test(test_memory_never),
        cmocka_unit_test(test_checkpoint_bytes_and_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
