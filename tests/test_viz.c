/* test_viz: the writers of viz/ (DOT, report JSON, Chrome trace, Gantt and line plots, atomic
 * files) on a hand-built graph (viz_fixture.h) and on a GPipe graph built without the spec
 * parser. SVG through gvc lives in test_viz_gvc.c (Graphviz leaks there, no leak checker).
 *
 * The DOT golden file is tests/golden/viz/small.dot, a snapshot of pipescope's own output (a
 * regression check; the structure tests below check what it must contain). PS_REGEN_GOLDEN=1
 * rewrites it, and the program then exits 77 (skip): a rewrite is never a pass.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include <cmocka.h>

#include "viz/report.h"
#include "viz/viz.h"
#include "tests/viz_fixture.h"
#include "src/schedule.h"

static char tmpdir[256];
static bool g_regenerated; /* PS_REGEN_GOLDEN=1 rewrote a golden: report skip (77) */

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ps_test_viz.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char p[600];
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmpdir);
    return 0;
}

static const char *tmp(const char *name)
{
    static char buf[4][600];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 600, "%s/%s", tmpdir, name);
    return b;
}

static int count_dir_entries(const char *prefix)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static char *dot_string(const struct ps_graph *g, const struct ps_dot_opts *o)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    struct ps_diag d = {0};
    int rc = ps_dot_write(g, o, f, &d);
    fclose(f);
    if (rc) fprintf(stderr, "dot: %s\n", d.msg);
    assert_int_equal(rc, 0);
    return buf;
}

/* the "name" of a DOT node line: matches `"F(0,0)"` followed by a space and `[` */
static bool has_node(const char *dot, const char *name)
{
    char pat[96], pat2[96];
    snprintf(pat, sizeof(pat), "\t\"%s\"\t[", name);
    snprintf(pat2, sizeof(pat2), "\t%s\t[", name); /* agwrite quotes only when needed */
    return strstr(dot, pat) != NULL || strstr(dot, pat2) != NULL;
}

/* ---- DOT ------------------------------------------------------------------------------ */

static void test_dot_golden(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    assert_non_null(g);
    char *dot = dot_string(g, NULL);
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/golden/viz/small.dot", root ? root : ".");
    const char *regen = getenv("PS_REGEN_GOLDEN");
    if (regen && strcmp(regen, "1") == 0) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(dot, f);
        fclose(f);
        fprintf(stderr, "regenerated %s\n", path);
        g_regenerated = true;
    }
    char *golden = fx_slurp(path, NULL);
    if (!golden) fprintf(stderr, "missing %s (run with PS_REGEN_GOLDEN=1)\n", path);
    assert_non_null(golden);
    if (strcmp(golden, dot) != 0) fprintf(stderr, "--- got:\n%s", dot);
    assert_string_equal(golden, dot);
    free(golden);
    free(dot);
    ps_graph_destroy(g);
}

static void test_dot_structure(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    char *dot = dot_string(g, NULL);
    /* one cluster per device, labelled with the device */
    assert_int_equal(fx_count(dot, "subgraph cluster_"), g->n_devices);
    assert_non_null(strstr(dot, "subgraph cluster_dev0"));
    assert_non_null(strstr(dot, "label=\"cuda:1\""));
    assert_non_null(strstr(dot, "newrank=true"));
    /* phony edges dashed: fork->join, rfork->r, R->B(0,0), B(1,0)->R */
    assert_int_equal(fx_count(dot, "style=dashed"), 4);
    /* nodes named by task */
    const char *names[] = {"F(0,0)", "B(0,1)", "R(0,0)", "C(0,0->1)", "W(0,1)", "Wo(0,0)",
                           "fork(0,0)", "join(1,0)", "loss'", "opt(0)"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        if (!has_node(dot, names[k])) fprintf(stderr, "no node %s in\n%s", names[k], dot);
        assert_true(has_node(dot, names[k]));
    }
    /* checkpointed F(0,0) marked, recompute shaded */
    assert_non_null(strstr(dot, "peripheries=2"));
    assert_non_null(strstr(dot, "#c8c8c8"));
    /* host and stream edges are off by default */
    assert_null(strstr(dot, "dotted"));
    free(dot);

    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.host_edges = true;
    dot = dot_string(g, &o);
    assert_int_equal(fx_count(dot, "style=dotted"), 3); /* 3 host edges */
    assert_int_equal(fx_count(dot, "color=grey"), 3);
    free(dot);
    o.host_edges = false;
    o.stream_edges = true;
    dot = dot_string(g, &o);
    assert_int_equal(fx_count(dot, "style=dotted"), 1);
    free(dot);
    ps_graph_destroy(g);
}

static void test_dot_filters(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.filter = PS_DOT_FORWARD;
    char *dot = dot_string(g, &o);
    assert_true(has_node(dot, "F(0,0)"));
    assert_true(has_node(dot, "loss"));
    assert_false(has_node(dot, "B(0,0)"));
    assert_false(has_node(dot, "R(0,0)"));
    assert_false(has_node(dot, "loss'"));
    free(dot);
    o.filter = PS_DOT_BACKWARD;
    dot = dot_string(g, &o);
    assert_false(has_node(dot, "F(0,0)"));
    assert_true(has_node(dot, "B(0,0)"));
    assert_true(has_node(dot, "R(0,0)"));
    assert_true(has_node(dot, "C(0,1->0)"));
    free(dot);
    ps_graph_destroy(g);
}

static void test_dot_tasks_only(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.tasks_only = true;
    char *dot = dot_string(g, &o);
    assert_false(has_node(dot, "fork(0,0)"));
    assert_false(has_node(dot, "join(1,0)"));
    assert_false(has_node(dot, "Wo(0,0)"));
    assert_false(has_node(dot, "C(0,0->1)"));
    assert_false(has_node(dot, "r(0,0)"));
    assert_true(has_node(dot, "F(0,0)"));
    assert_true(has_node(dot, "R(0,0)"));
    /* contracted: F(0,0) -> F(0,1) through Wo, C, W (data, solid) */
    assert_non_null(strstr(dot, "\"F(0,0)\" -> \"F(0,1)\";"));
    /* F(0,0) -> F(1,0) only through fork ..phony.. join: dashed */
    assert_non_null(strstr(dot, "\"F(0,0)\" -> \"F(1,0)\"\t[style=dashed]"));
    /* B(0,1) -> R(0,0) through the gradient copy */
    assert_non_null(strstr(dot, "\"B(0,1)\" -> \"R(0,0)\";"));
    free(dot);
    ps_graph_destroy(g);
}

static const char *color_cb(const struct ps_graph *g, uint32_t v, void *ctx, char *buf, int len)
{
    (void)ctx;
    if (g->nodes[v].kind != PS_NODE_LOSS) return NULL;
    snprintf(buf, (size_t)len, "gold");
    return buf;
}

static void test_dot_values(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    double *val = malloc(g->n_nodes * sizeof(double));
    for (uint32_t v = 0; v < g->n_nodes; v++) val[v] = NAN;
    val[0] = -0.5; /* F(0,0): blue end */
    val[4] = 0.5;  /* F(0,1): red end */
    val[7] = 0;    /* F(1,0): white */
    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.node_value = val;
    o.value_name = "timing error";
    o.color = color_cb;
    char *dot = dot_string(g, &o);
    assert_non_null(strstr(dot, "fillcolor=\"#2c7bb6\""));
    assert_non_null(strstr(dot, "fillcolor=\"#d7191c\""));
    assert_non_null(strstr(dot, "fillcolor=\"#ffffff\""));
    assert_non_null(strstr(dot, "fillcolor=gold"));
    assert_non_null(strstr(dot, "timing error: -0.5 .. 0.5"));
    free(dot);
    /* values all near 1 (a simulation 100x too fast): every one is dark red, none white; the
       label gives the values' own range and the colour scale's */
    val[0] = 0.999;
    val[4] = 1.0;
    val[7] = 0.9995;
    o.color = NULL;
    dot = dot_string(g, &o);
    assert_null(strstr(dot, "fillcolor=\"#ffffff\""));
    /* by hand: 0.999 of the way from white to red = (215.04, 25.23, 28.23) -> #d7191c, as 1 */
    const char *p = dot;
    int reds = 0;
    while ((p = strstr(p, "fillcolor=\"#d7191c\""))) reds++, p++;
    assert_int_equal(reds, 3);
    assert_non_null(strstr(dot, "timing error: 0.999 .. 1 (colours: blue -1, white 0, red 1)"));
    free(dot);
    char c[8];
    assert_string_equal(ps_viz_color_scale(1, 0, 1, c), "#d7191c");
    assert_string_equal(ps_viz_color_scale(0, 0, 1, c), "#ffffff");
    assert_string_equal(ps_viz_color_scale(-9, -1, 1, c), "#2c7bb6");
    free(val);
    ps_graph_destroy(g);
}

static void test_dot_file_deterministic(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_diag d = {0};
    const struct ps_graph_format *fmt = ps_graph_format_find("out/x.dot");
    assert_non_null(fmt);
    assert_string_equal(fmt->name, "dot");
    assert_non_null(ps_graph_format_find("svg"));
    assert_null(ps_graph_format_find("x.png"));
    assert_int_equal(ps_graph_format_write_file(fmt, g, NULL, tmp("a.dot"), &d), 0);
    assert_int_equal(ps_dot_write_file(g, NULL, tmp("b.dot"), &d), 0);
    size_t la, lb;
    char *a = fx_slurp(tmp("a.dot"), &la), *b = fx_slurp(tmp("b.dot"), &lb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    assert_int_equal(count_dir_entries(".a.dot.tmp"), 0);
    ps_graph_destroy(g);
}

/* ---- a GPipe graph from the real builder, without the spec parser --------------------- */

struct gp {
    struct ps_spec spec;
    int balance[2], first[2], did[2];
    int64_t mbs[4];
    struct ps_device devs[2];
    struct ps_layer layers[3];
    struct ps_graph *g;
};

static void gp_init(struct gp *p)
{
    memset(p, 0, sizeof(*p));
    struct ps_spec *s = &p->spec;
    s->path = (char *)"gp.json";
    s->version = 1;
    s->name = (char *)"gp";
    s->batch = 8;
    s->n_input_dims = 1;
    s->input[0] = 4;
    s->n_layers = 3;
    s->layers = p->layers;
    p->layers[0] = (struct ps_layer){.op = PS_OP_LINEAR, .out = 4, .bias = true};
    p->layers[1] = (struct ps_layer){.op = PS_OP_BATCHNORM, .momentum_null = true, .eps = 1e-5,
                                     .affine = true};
    p->layers[2] = (struct ps_layer){.op = PS_OP_RELU};
    s->loss = PS_LOSS_SUM;
    s->schedule = PS_SCHED_GPIPE;
    s->n_partitions = 2;
    p->balance[0] = 2;
    p->balance[1] = 1;
    p->first[0] = 0;
    p->first[1] = 2;
    p->did[0] = 0;
    p->did[1] = 1;
    s->balance = p->balance;
    s->first_layer = p->first;
    s->device_id = p->did;
    p->devs[0] = (struct ps_device){PS_DEV_CUDA, 0};
    p->devs[1] = (struct ps_device){PS_DEV_CUDA, 1};
    s->devices = p->devs;
    s->n_devices = 2;
    s->chunks = 4;
    s->mb_count = 4;
    for (int i = 0; i < 4; i++) p->mbs[i] = 2;
    s->mb_size = p->mbs;
    s->checkpoint = PS_CKPT_EXCEPT_LAST;
    s->batchnorm = PS_BN_PLAIN;
    s->phony = true;
    s->virtual_stages = 1;
    s->data_source = PS_DATA_SYNTHETIC;
    s->seed = 18446744073709551615ull;
    s->dev_flops = 6.7e13;
    s->dev_mem_bw = 4.8e12;
    s->dev_launch_us = 4;
    s->link_bw = 4.5e11;
    s->link_latency_us = 2;
    s->steps = 3;
    s->lr = 0.05;
    struct ps_variant o;
    ps_variant_from_spec(s, &o);
    struct ps_diag d = {0};
    int rc = ps_schedule_build(s, NULL, &o, &p->g, &d);
    if (rc) fprintf(stderr, "build: %s\n", d.msg);
    assert_int_equal(rc, 0);
}

static void test_gpipe_report(void **state)
{
    (void)state;
    struct gp p;
    gp_init(&p);
    struct ps_graph *g = p.g;
    struct ps_diag d = {0};
    struct ps_order ord = {0};
    assert_int_equal(ps_schedule_order(g, &ord, &d), 0);
    struct ps_analysis a = {0};
    assert_int_equal(ps_analysis_run(g, &ord, NULL, &a, &d), 0);

    cJSON *root = ps_report_new();
    assert_non_null(root);
    assert_int_equal(ps_report_add_spec(root, &p.spec), 0);
    assert_int_equal(ps_report_add_graph(root, g), 0);
    assert_int_equal(ps_report_add_analysis(root, g, &a, &ord), 0);
    assert_int_equal(ps_report_add_graph(root, g), 0); /* replaced, not duplicated */
    assert_int_equal(ps_report_write(root, tmp("report.json"), &d), 0);
    cJSON_Delete(root);

    char *text = fx_slurp(tmp("report.json"), NULL);
    assert_non_null(text);
    assert_int_equal(fx_count(text, "\"graph\":"), 1);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(j, "pipescope")->valueint, 1);
    /* spec */
    cJSON *sp = cJSON_GetObjectItem(j, "spec");
    cJSON *pl = cJSON_GetObjectItem(sp, "pipeline");
    assert_int_equal(cJSON_GetObjectItem(pl, "mb_count")->valueint, 4);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(pl, "mb_size")), 4);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(pl, "devices"), 1)->valuestring,
                        "cuda:1");
    assert_string_equal(cJSON_GetObjectItem(pl, "checkpoint")->valuestring, "except_last");
    cJSON *layers = cJSON_GetObjectItem(cJSON_GetObjectItem(sp, "model"), "layers");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 1), "momentum")));
    assert_non_null(strstr(text, "\"seed\":\t18446744073709551615"));
    assert_non_null(strstr(text, "\"flops\":\t67000000000000"));
    assert_non_null(strstr(text, "\"lr\":\t0.050000000000000003"));
    /* graph */
    cJSON *gr = cJSON_GetObjectItem(j, "graph");
    assert_int_equal(cJSON_GetObjectItem(gr, "nodes")->valueint, (int)g->n_nodes);
    assert_int_equal(cJSON_GetObjectItem(gr, "edges")->valueint, (int)g->n_edges);
    int phony = 0, comp = 0;
    for (uint32_t e = 0; e < g->n_edges; e++) phony += g->edges[e].kind == PS_EDGE_PHONY;
    for (uint32_t v = 0; v < g->n_nodes; v++) comp += g->nodes[v].kind == PS_NODE_COMPUTE;
    assert_int_equal(cJSON_GetObjectItem(gr, "phony_edges")->valueint, phony);
    assert_int_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(gr, "kinds"), "compute")->valueint, comp);
    /* analysis */
    cJSON *an = cJSON_GetObjectItem(j, "analysis");
    assert_true(cJSON_IsBool(cJSON_GetObjectItem(an, "ok")));
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItem(an, "ok")), a.ok);
    cJSON *checks = cJSON_GetObjectItem(an, "checks");
    assert_int_equal(cJSON_GetArraySize(checks), PS_CHECK__COUNT);
    assert_non_null(cJSON_GetObjectItem(
        cJSON_GetObjectItem(checks, ps_check_name(PS_CHECK_FORWARD_ORDER)), "checked"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(an, "memory")), 2);
    cJSON *order = cJSON_GetObjectItem(an, "order");
    assert_true(cJSON_IsObject(order));
    cJSON *o0 = cJSON_GetObjectItem(order, "cuda:0"), *o1 = cJSON_GetObjectItem(order, "cuda:1");
    assert_non_null(o0);
    assert_non_null(o1);
    /* every F/B/R task listed exactly once across devices: 4 mbs x 2 parts x (F + B), and R
     * for the checkpointed micro-batches 0..2 (except_last) on both partitions */
    assert_int_equal(cJSON_GetArraySize(o0) + cJSON_GetArraySize(o1), 4 * 2 * 2 + 3 * 2);
    assert_string_equal(cJSON_GetArrayItem(o0, 0)->valuestring, "F(0,0)");
    assert_null(cJSON_GetObjectItem(an, "critical_path")); /* no costs given */
    cJSON_Delete(j);
    free(text);

    /* tasks-only DOT of the real graph: only tasks, loss, and edges between them */
    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.tasks_only = true;
    char *dot = dot_string(g, &o);
    assert_false(has_node(dot, "fork(0,0)"));
    assert_true(has_node(dot, "R(1,1)"));
    assert_non_null(strstr(dot, "\"F(0,0)\" -> \"F(0,1)\";"));
    assert_non_null(strstr(dot, "\"F(0,0)\" -> \"F(1,0)\"\t[style=dashed]"));
    free(dot);

    ps_analysis_finish(&a);
    ps_order_finish(&ord);
    ps_graph_destroy(g);
}

/* ---- JSON numbers ---------------------------------------------------------------------- */

static void check_bits(cJSON *root, const char *key, double want)
{
    cJSON *it = cJSON_GetObjectItem(root, key);
    assert_non_null(it);
    assert_true(cJSON_IsRaw(it));
    double got = strtod(it->valuestring, NULL);
    assert_memory_equal(&got, &want, sizeof(double));
}

static void test_json_numbers(void **state)
{
    (void)state;
    cJSON *root = ps_report_new();
    double a = 0.1, b = 0.2;
    volatile double sum = a + b;
    ps_json_add_number(root, "sum", sum);
    ps_json_add_number(root, "tiny", 1e-300);
    ps_json_add_number(root, "huge", 1.7976931348623157e308);
    ps_json_add_number(root, "three", 3.0);
    ps_json_add_number(root, "negzero", -0.0);
    ps_json_add_number(root, "nan", NAN);
    ps_json_add_number(root, "inf", INFINITY);
    ps_json_add_int(root, "big", INT64_MAX);
    check_bits(root, "sum", sum);
    check_bits(root, "tiny", 1e-300);
    check_bits(root, "huge", 1.7976931348623157e308);
    check_bits(root, "negzero", -0.0);
    assert_string_equal(cJSON_GetObjectItem(root, "three")->valuestring, "3");
    assert_string_equal(cJSON_GetObjectItem(root, "big")->valuestring, "9223372036854775807");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(root, "nan")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(root, "inf")));
    char *s = cJSON_PrintUnformatted(root);
    assert_non_null(strstr(s, "\"sum\":0.30000000000000004"));
    assert_non_null(strstr(s, "\"three\":3,"));
    cJSON *back = cJSON_Parse(s);
    assert_non_null(back);
    double got = cJSON_GetObjectItem(back, "sum")->valuedouble;
    double want = sum;
    assert_memory_equal(&got, &want, sizeof(double));
    got = cJSON_GetObjectItem(back, "tiny")->valuedouble;
    want = 1e-300;
    assert_memory_equal(&got, &want, sizeof(double));
    cJSON_Delete(back);
    free(s);
    /* ps_json_set replaces */
    assert_int_equal(ps_json_set(root, "three", ps_json_number(4)), 0);
    assert_string_equal(cJSON_GetObjectItem(root, "three")->valuestring, "4");
    cJSON_Delete(root);
}

/* ---- Chrome trace ---------------------------------------------------------------------- */

static int count_ph(cJSON *events, const char *ph, const char *name)
{
    int n = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        cJSON *p = cJSON_GetObjectItem(e, "ph");
        cJSON *nm = cJSON_GetObjectItem(e, "name");
        if (p && strcmp(p->valuestring, ph) == 0 &&
            (!name || (nm && strcmp(nm->valuestring, name) == 0)))
            n++;
    }
    return n;
}

static void test_chrome_trace(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_trace t;
    assert_int_equal(fx_small_trace(&t), 0);
    struct ps_diag d = {0};
    assert_int_equal(ps_chrome_write_file(g, &t, NULL, tmp("t1.json"), &d), 0);
    assert_int_equal(ps_chrome_write_file(g, &t, NULL, tmp("t2.json"), &d), 0);
    size_t l1, l2;
    char *a = fx_slurp(tmp("t1.json"), &l1), *b = fx_slurp(tmp("t2.json"), &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    free(b);

    cJSON *j = cJSON_Parse(a);
    if (!j) fprintf(stderr, "invalid JSON:\n%s\n", a);
    assert_non_null(j);
    cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
    assert_true(cJSON_IsArray(ev));
    assert_int_equal(count_ph(ev, "X", NULL), (int)t.n);
    assert_int_equal(count_ph(ev, "M", "process_name"), 2);
    /* threads: dev0 {compute, copy p0 mb 0}, dev1 {compute, copy p1 mb 0, host} */
    assert_int_equal(count_ph(ev, "M", "thread_name"), 5);
    assert_int_equal(count_ph(ev, "s", NULL), 6);
    assert_int_equal(count_ph(ev, "f", NULL), 6);
    assert_non_null(strstr(a, "\"args\":{\"name\":\"cuda:1\"}"));
    assert_non_null(strstr(a, "\"args\":{\"name\":\"copy p0 mb 0\"}"));
    assert_non_null(strstr(a, "\"tid\":1000000"));
    assert_non_null(strstr(a, "\"dur\":20.123,"));
    /* the X event of F(0,1) */
    cJSON *e, *x = NULL;
    cJSON_ArrayForEach(e, ev)
    {
        cJSON *nm = cJSON_GetObjectItem(e, "name");
        if (nm && strcmp(nm->valuestring, "F(0,1)") == 0) x = e;
    }
    assert_non_null(x);
    assert_string_equal(cJSON_GetObjectItem(x, "cat")->valuestring, "forward");
    assert_int_equal(cJSON_GetObjectItem(x, "pid")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(x, "tid")->valueint, 1);
    assert_true(cJSON_GetObjectItem(x, "ts")->valuedouble == 16.5);
    cJSON *args = cJSON_GetObjectItem(x, "args");
    assert_int_equal(cJSON_GetObjectItem(args, "task")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(args, "mb")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(args, "partition")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(args, "kind")->valuestring, "compute");
    /* renamed record keeps its name; escaping survives the round trip */
    assert_int_equal(count_ph(ev, "X", "B(1,0) \"renamed\""), 1);
    assert_int_equal(count_ph(ev, "X", "kernel<x>&y"), 1);
    /* each flow id has one start and one finish */
    cJSON_ArrayForEach(e, ev)
    {
        cJSON *p = cJSON_GetObjectItem(e, "ph");
        if (strcmp(p->valuestring, "s") != 0) continue;
        int id = cJSON_GetObjectItem(e, "id")->valueint, fin = 0;
        cJSON *f;
        cJSON_ArrayForEach(f, ev)
        {
            cJSON *pf = cJSON_GetObjectItem(f, "ph");
            if (strcmp(pf->valuestring, "f") == 0 && cJSON_GetObjectItem(f, "id")->valueint == id)
                fin++;
        }
        assert_int_equal(fin, 1);
    }
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "otherData"), "source")->valuestring,
        "simulated");
    cJSON_Delete(j);
    free(a);

    /* no flows / flows through unrecorded nodes (fork/join: F(0,0) ..> F(1,0) stays on one
     * stream, so still 6), and no graph at all */
    struct ps_chrome_opts o = {.no_flows = true};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(ps_chrome_write(g, &t, &o, f, &d), 0);
    fclose(f);
    j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(count_ph(cJSON_GetObjectItem(j, "traceEvents"), "s", NULL), 0);
    cJSON_Delete(j);
    free(buf);
    o = (struct ps_chrome_opts){.flows_via_unrecorded = true};
    f = open_memstream(&buf, &len);
    assert_int_equal(ps_chrome_write(g, &t, &o, f, &d), 0);
    fclose(f);
    j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(count_ph(cJSON_GetObjectItem(j, "traceEvents"), "s", NULL), 6);
    cJSON_Delete(j);
    free(buf);
    f = open_memstream(&buf, &len);
    assert_int_equal(ps_chrome_write(NULL, &t, NULL, f, &d), 0);
    fclose(f);
    j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(count_ph(cJSON_GetObjectItem(j, "traceEvents"), "X", NULL), (int)t.n);
    cJSON_Delete(j);
    free(buf);
    /* counter events (the executor's memory): one "C" event per value, in the given order */
    static const struct ps_chrome_counter ctr[] = {{0, 1.5, 4096}, {1, 2.25, 64}, {0, 3.0, 0}};
    o = (struct ps_chrome_opts){.no_flows = true, .counters = ctr, .n_counters = 3,
                                .counter_name = "activation bytes"};
    f = open_memstream(&buf, &len);
    assert_int_equal(ps_chrome_write(g, &t, &o, f, &d), 0);
    fclose(f);
    assert_non_null(strstr(buf, "{\"ph\":\"C\",\"name\":\"activation bytes\",\"pid\":0,"
                                "\"ts\":1.500,\"args\":{\"bytes\":4096}}"));
    assert_non_null(strstr(buf, "\"pid\":1,\"ts\":2.250,\"args\":{\"bytes\":64}}"));
    j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(count_ph(cJSON_GetObjectItem(j, "traceEvents"), "C", NULL), 3);
    assert_int_equal(count_ph(cJSON_GetObjectItem(j, "traceEvents"), "X", NULL), (int)t.n);
    cJSON_Delete(j);
    free(buf);
    /* empty trace */
    struct ps_trace empty;
    ps_trace_init(&empty, PS_TRACE_CPU);
    f = open_memstream(&buf, &len);
    assert_int_equal(ps_chrome_write(g, &empty, NULL, f, &d), 0);
    fclose(f);
    j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "traceEvents")), 0);
    cJSON_Delete(j);
    free(buf);

    ps_trace_finish(&t);
    ps_graph_destroy(g);
}

/* ---- plots ----------------------------------------------------------------------------- */

/* well-formed XML (our checker always, python3's xml.etree when `full`: it is slow to start) */
static void check_svg_file(const char *path, bool full)
{
    char *s = fx_slurp(path, NULL);
    assert_non_null(s);
    int rc = fx_xml_check(s);
    if (rc) fprintf(stderr, "%s: not well formed (%d)\n", path, rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(s, "<svg"));
    free(s);
    if (!full) return;
    rc = fx_xml_python(path);
    if (rc == 77) fprintf(stderr, "python3 not found: xml.etree check skipped\n");
    else assert_int_equal(rc, 0);
}

static void test_gantt(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_trace t, t2;
    assert_int_equal(fx_small_trace(&t), 0);
    assert_int_equal(fx_small_trace(&t2), 0);
    t2.source = PS_TRACE_CUDA;
    for (uint32_t k = 0; k < t2.n; k++) {
        t2.r[k].start_us *= 1.1;
        t2.r[k].dur_us *= 1.2;
    }
    struct ps_diag d = {0};
    struct ps_gantt_opts o = {.title = "small <pipeline> & co", .label = "simulated",
                              .label2 = "measured"};
    assert_int_equal(ps_plot_gantt_file(g, &t, &t2, &o, tmp("g1.svg"), &d), 0);
    assert_int_equal(ps_plot_gantt_file(g, &t, &t2, &o, tmp("g2.svg"), &d), 0);
    size_t l1, l2;
    char *a = fx_slurp(tmp("g1.svg"), &l1), *b = fx_slurp(tmp("g2.svg"), &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    check_svg_file(tmp("g1.svg"), true);
    /* lanes of both blocks, legend, time axis in us (span < 1 ms) */
    assert_int_equal(fx_count(a, ">cuda:0 compute</text>"), 2);
    assert_int_equal(fx_count(a, ">cuda:1 host</text>"), 2);
    assert_non_null(strstr(a, ">time (us)</text>"));
    assert_non_null(strstr(a, ">recompute</text>"));
    assert_non_null(strstr(a, ">measured: makespan"));
    assert_non_null(strstr(a, "small &lt;pipeline&gt; &amp; co"));
    free(a);
    free(b);
    /* single trace, no graph, ms axis */
    for (uint32_t k = 0; k < t.n; k++) {
        t.r[k].start_us *= 100;
        t.r[k].dur_us *= 100;
    }
    assert_int_equal(ps_plot_gantt_file(NULL, &t, NULL, NULL, tmp("g3.svg"), &d), 0);
    check_svg_file(tmp("g3.svg"), false);
    a = fx_slurp(tmp("g3.svg"), NULL);
    assert_non_null(strstr(a, ">time (ms)</text>"));
    free(a);
    ps_trace_finish(&t);
    ps_trace_finish(&t2);
    ps_graph_destroy(g);
}

static void test_lines(void **state)
{
    (void)state;
    double x[6] = {1, 2, 4, 8, 16, 32};
    double y1[6] = {1.5, 1.2, 1.0, 0.9, 0.85, 0.84};
    double y2[6] = {0.1, NAN, 0.3, 0.35, 0.4, 0.41};
    struct ps_plot_series s[2] = {{"plain BN", y1, 0}, {"deferred <BN>", y2, 0}};
    struct ps_line_plot p = {.title = "drift", .xlabel = "chunks", .ylabel = "error",
                             .n = 6, .x = x, .log2_x = true, .y_zero = true, .n_series = 2,
                             .series = s};
    struct ps_diag d = {0};
    assert_int_equal(ps_plot_lines_file(&p, tmp("l1.svg"), &d), 0);
    assert_int_equal(ps_plot_lines_file(&p, tmp("l2.svg"), &d), 0);
    size_t l1, l2;
    char *a = fx_slurp(tmp("l1.svg"), &l1), *b = fx_slurp(tmp("l2.svg"), &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    check_svg_file(tmp("l1.svg"), true);
    assert_non_null(strstr(a, ">32</text>"));
    assert_non_null(strstr(a, ">chunks (log2 scale)</text>"));
    assert_non_null(strstr(a, "deferred &lt;BN&gt;"));
    assert_int_equal(fx_count(a, "<polyline"), 3); /* the NaN splits series 2 */
    free(a);
    free(b);
    /* linear axis, constant series, empty plot */
    double yc[6] = {2, 2, 2, 2, 2, 2};
    struct ps_plot_series sc = {"const", yc, 0};
    p.log2_x = false;
    p.y_zero = false;
    p.series = &sc;
    p.n_series = 1;
    assert_int_equal(ps_plot_lines_file(&p, tmp("l3.svg"), &d), 0);
    check_svg_file(tmp("l3.svg"), false);
    p.n = 0;
    assert_int_equal(ps_plot_lines_file(&p, tmp("l4.svg"), &d), 0);
    check_svg_file(tmp("l4.svg"), false);
}

/* Units and legends a user can read: 12 series (more than the 10 colours) end up with dashed
 * lines for the repeats, the legend's longest name fits inside the picture, bytes are shown in
 * GiB (1.5e9 B = 1.397 GiB: ticks 0 .. 1.5 step 0.5, never "1.5e+09") and the unit is named in
 * the y label. */
static void test_lines_units_legend(void **state)
{
    (void)state;
    double x[3] = {1, 2, 4};
    double y[12][3];
    struct ps_plot_series s[12];
    char names[12][48];
    for (int k = 0; k < 12; k++) {
        for (int i = 0; i < 3; i++) y[k][i] = 1.5e9 * (i + 1) / 3 * (k + 1) / 12;
        snprintf(names[k], sizeof(names[k]), "interleaved-1f1b except_last %d", k);
        s[k] = (struct ps_plot_series){names[k], y[k], 0};
    }
    struct ps_line_plot p = {.title = "memory", .xlabel = "chunks", .ylabel = "peak memory",
                             .y_unit = PS_UNIT_BYTES, .n = 3, .x = x, .log2_x = true,
                             .y_zero = true, .n_series = 12, .series = s};
    struct ps_diag d = {0};
    assert_int_equal(ps_plot_lines_file(&p, tmp("l5.svg"), &d), 0);
    char *a = fx_slurp(tmp("l5.svg"), NULL);
    check_svg_file(tmp("l5.svg"), true);
    assert_null(strstr(a, "e+09"));
    assert_non_null(strstr(a, ">peak memory (GiB)</text>"));
    assert_non_null(strstr(a, ">1.5</text>"));
    assert_non_null(strstr(a, ">0.5</text>"));
    /* series 10 and 11 reuse colours 0 and 1, dashed (polyline and legend line each) */
    assert_int_equal(fx_count(a, "stroke-dasharray"), 4);
    /* the legend text ends inside the picture: width >= x of the last name + its length */
    double W = 0;
    assert_int_equal(sscanf(strstr(a, "width=\"") + 7, "%lf", &W), 1);
    const char *t = strstr(a, "interleaved-1f1b except_last 11</text>");
    assert_non_null(t);
    while (t > a && strncmp(t, "<text x=\"", 9) != 0) t--;
    double tx = 0;
    assert_int_equal(sscanf(t + 9, "%lf", &tx), 1);
    assert_true(tx + 6.6 * strlen("interleaved-1f1b except_last 11") <= W);
    free(a);
    /* one point 5000x above the next (drift at 2 samples per micro-batch): a log axis from
       10^floor(log10 0.05) = 0.01 to 10^ceil(log10 266) = 1000, one tick per decade; the 0 is
       left out as a gap (two points remain: one polyline) */
    double x3[3] = {1, 2, 4}, yl[3] = {0, 0.05, 266};
    struct ps_plot_series sl = {"plain", yl, 0};
    struct ps_line_plot pl = {.ylabel = "var error", .n = 3, .x = x3, .log2_x = true,
                              .y_zero = true, .log_y_auto = true, .n_series = 1, .series = &sl};
    assert_int_equal(ps_plot_lines_file(&pl, tmp("l7.svg"), &d), 0);
    a = fx_slurp(tmp("l7.svg"), NULL);
    assert_non_null(strstr(a, ">var error (log scale, 0 not shown)</text>"));
    assert_non_null(strstr(a, ">0.01</text>"));
    assert_non_null(strstr(a, ">1000</text>"));
    assert_int_equal(fx_count(a, "<polyline"), 1);
    free(a);
    /* times: 2.5e6 us is shown in s */
    double yt[3] = {2.5e5, 1.2e6, 2.5e6};
    struct ps_plot_series st = {"gpipe", yt, 0};
    p.y_unit = PS_UNIT_US;
    p.ylabel = "makespan";
    p.series = &st;
    p.n_series = 1;
    assert_int_equal(ps_plot_lines_file(&p, tmp("l6.svg"), &d), 0);
    a = fx_slurp(tmp("l6.svg"), NULL);
    assert_non_null(strstr(a, ">makespan (s)</text>"));
    assert_non_null(strstr(a, ">2.5</text>"));
    free(a);
    /* two series with the same points (drift's var_gap does not depend on the BN policy): the
       second is drawn exactly over the first, so its legend says so; a third that differs in one
       point does not */
    double ya[3] = {1, 2, 3}, yb[3] = {1, 2, 3}, yc[3] = {1, 2, 3.5};
    struct ps_plot_series sc[3] = {{"plain", ya, 0}, {"deferred", yb, 0}, {"grad-only", yc, 0}};
    struct ps_line_plot pc = {.n = 3, .x = x3, .n_series = 3, .series = sc};
    assert_int_equal(ps_plot_lines_file(&pc, tmp("l8.svg"), &d), 0);
    a = fx_slurp(tmp("l8.svg"), NULL);
    assert_non_null(strstr(a, ">deferred (= plain: the lines coincide)</text>"));
    assert_non_null(strstr(a, ">grad-only</text>"));
    free(a);
}

/* ---- atomic files ---------------------------------------------------------------------- */

static void test_out_atomic(void **state)
{
    (void)state;
    struct ps_diag d = {0};
    struct ps_out o;
    const char *path = tmp("atomic.txt");
    /* abort on a new file: nothing left */
    assert_int_equal(ps_out_open(&o, path, &d), 0);
    fputs("partial", o.f);
    ps_out_abort(&o);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(count_dir_entries("atomic.txt"), 0);
    assert_int_equal(count_dir_entries(".atomic.txt"), 0);
    /* commit */
    assert_int_equal(ps_out_open(&o, path, &d), 0);
    assert_int_equal(count_dir_entries(".atomic.txt.tmp."), 1);
    assert_int_not_equal(access(path, F_OK), 0); /* not there before the commit */
    fputs("old content\n", o.f);
    o.sync = true;
    assert_int_equal(ps_out_commit(&o, &d), 0);
    assert_null(o.f);
    ps_out_abort(&o); /* harmless after commit */
    char *s = fx_slurp(path, NULL);
    assert_string_equal(s, "old content\n");
    free(s);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    /* abort over an existing file keeps it */
    assert_int_equal(ps_out_open(&o, path, &d), 0);
    fputs("new but broken", o.f);
    ps_out_abort(&o);
    s = fx_slurp(path, NULL);
    assert_string_equal(s, "old content\n");
    free(s);
    assert_int_equal(count_dir_entries("atomic.txt"), 1);
    /* a writer that fails leaves the old file too */
    struct ps_graph *g = fx_small_graph();
    g->out_off = (free(g->out_off), NULL); /* not finalized: ps_dot_build refuses */
    int rc = ps_dot_write_file(g, NULL, path, &d);
    assert_true(rc < 0);
    assert_int_not_equal(d.code, 0);
    s = fx_slurp(path, NULL);
    assert_string_equal(s, "old content\n");
    free(s);
    assert_int_equal(count_dir_entries("atomic.txt"), 1);
    ps_graph_destroy(g);
    /* folders that do not exist are made */
    ps_diag_clear(&d);
    cJSON *root = ps_report_new();
    rc = ps_report_write(root, tmp("no/such/dir/r.json"), &d);
    assert_int_equal(rc, 0);
    s = fx_slurp(tmp("no/such/dir/r.json"), NULL);
    assert_non_null(strstr(s, "\"pipescope\":\t1"));
    free(s);
    assert_int_equal(unlink(tmp("no/such/dir/r.json")), 0);
    assert_int_equal(rmdir(tmp("no/such/dir")), 0);
    assert_int_equal(rmdir(tmp("no/such")), 0);
    assert_int_equal(rmdir(tmp("no")), 0);
    /* a folder under a file cannot be: the error names the file */
    rc = ps_report_write(root, tmp("atomic.txt/r.json"), &d);
    cJSON_Delete(root);
    assert_int_equal(rc, -ENOTDIR);
    assert_string_equal(d.where, tmp("atomic.txt"));
    assert_int_equal(count_dir_entries("atomic.txt"), 1);
}

/* a time under 1 us keeps its digits: seed 2's simulated forward (0.007 us) read "0.0 us" beside
   a recompute share of 44.3% of it */
static void test_time_small(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(ps_viz_time(0.007, b, sizeof(b)), "0.007 us");
    assert_string_equal(ps_viz_time(0, b, sizeof(b)), "0.0 us");
    assert_string_equal(ps_viz_time(16.009, b, sizeof(b)), "16.0 us");
    assert_string_equal(ps_viz_time(1500, b, sizeof(b)), "1.50 ms");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_golden),
        cmocka_unit_test(test_dot_structure),
        cmocka_unit_test(test_dot_filters),
        cmocka_unit_test(test_dot_tasks_only),
        cmocka_unit_test(test_dot_values),
        cmocka_unit_test(test_dot_file_deterministic),
        cmocka_unit_test(test_gpipe_report),
        cmocka_unit_test(test_json_numbers),
        cmocka_unit_test(test_chrome_trace),
        cmocka_unit_test(test_gantt),
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_lines_units_legend),
        cmocka_unit_test(test_out_atomic),
        cmocka_unit_test(test_time_small),
    };
    int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
    if (rc == 0 && g_regenerated) {
        fprintf(stderr, "SKIP: PS_REGEN_GOLDEN=1 rewrote a golden; rerun without it\n");
        return 77;
    }
    return rc;
}
