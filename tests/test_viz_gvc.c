/* test_viz_gvc: SVG of the task graph through Graphviz's gvc (layout engine "dot").
 *
 * Separate from test_viz because Graphviz leaks ~11-13 KB inside gvLayout per layout: this
 * executable runs with ASAN_OPTIONS=detect_leaks=0 (tests/meson.build), the others with the
 * leak checker on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "viz/viz.h"
#include "tests/viz_fixture.h"

static void test_svg_render(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    assert_non_null(g);
    struct ps_diag d = {0};
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    int rc = ps_svg_render(g, NULL, &a, &la, &d);
    if (rc) fprintf(stderr, "svg: %s: %s\n", d.where, d.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(ps_svg_render(g, NULL, &b, &lb, &d), 0);
    /* deterministic bytes */
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    assert_int_equal(fx_xml_check(a), 0);
    assert_non_null(strstr(a, "<svg"));
    /* clusters, task-named nodes, dashed phony edges */
    assert_non_null(strstr(a, "<title>cluster_dev0</title>"));
    assert_non_null(strstr(a, ">cuda:1</text>"));
    assert_non_null(strstr(a, "<title>F(0,0)</title>"));
    assert_non_null(strstr(a, "<title>C(0,0&#45;&gt;1)</title>"));
    assert_non_null(strstr(a, "stroke-dasharray=\"5,2\""));
    free(a);
    free(b);
    ps_graph_destroy(g);
}

static void test_svg_file(void **state)
{
    (void)state;
    struct ps_graph *g = fx_small_graph();
    struct ps_diag d = {0};
    char dir[] = "/tmp/ps_test_viz_gvc.XXXXXX", p1[128], p2[128];
    assert_non_null(mkdtemp(dir));
    snprintf(p1, sizeof(p1), "%s/g1.svg", dir);
    snprintf(p2, sizeof(p2), "%s/g2.svg", dir);
    struct ps_dot_opts o;
    ps_dot_opts_init(&o);
    o.tasks_only = true;
    o.title = "tasks only";
    assert_int_equal(ps_svg_write_file(g, &o, p1, &d), 0);
    const struct ps_graph_format *fmt = ps_graph_format_find(p2);
    assert_non_null(fmt);
    assert_string_equal(fmt->name, "svg");
    assert_int_equal(ps_graph_format_write_file(fmt, g, &o, p2, &d), 0);
    size_t l1, l2;
    char *a = fx_slurp(p1, &l1), *b = fx_slurp(p2, &l2);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    assert_null(strstr(a, "<title>fork(0,0)</title>"));
    assert_int_equal(fx_xml_python(p1) == 1, 0);
    free(a);
    free(b);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
    ps_graph_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svg_render),
        cmocka_unit_test(test_svg_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
