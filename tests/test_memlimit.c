/* Tests for memlimit (src/memlimit.h): PIPESCOPE_MEM_LIMIT parsing, the cap by ulimit -v, the
 * error line and hint, and the estimates that graph and exec check against it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "kernels/exec.h"
#include "src/graph.h"
#include "src/memlimit.h"
#include "src/model.h"
#include "src/spec.h"

static void test_env_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {{"1", 1},          {"4096", 4096},          {"64K", 64u << 10},
              {"1.5M", 3u << 19}, {"16G", (uint64_t)16 << 30}, {"2GiB", (uint64_t)2 << 30},
              {"1t", (uint64_t)1 << 40}};
    struct ps_diag d;
    for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
        setenv(PS_MEMLIMIT_ENV, ok[k].s, 1);
        uint64_t v = 0;
        ps_diag_clear(&d);
        assert_int_equal(ps_memlimit_get(&v, &d), 0);
        assert_true(v <= ok[k].v); /* ulimit -v may cap it */
    }
    static const char *const bad[] = {"lots", "0", "-5G", "12Q", "G", "1e30T"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        setenv(PS_MEMLIMIT_ENV, bad[k], 1);
        uint64_t v = 0;
        ps_diag_clear(&d);
        assert_int_equal(ps_memlimit_get(&v, &d), -EINVAL);
        assert_string_equal(d.where, PS_MEMLIMIT_ENV);
        assert_non_null(strstr(d.msg, "is not a size"));
    }
    unsetenv(PS_MEMLIMIT_ENV);
}

static void test_check_message(void **state)
{
    (void)state;
    setenv(PS_MEMLIMIT_ENV, "1G", 1);
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_memlimit_check(1e9, "s.json", "this", "do less", &d), 0);
    assert_int_equal(ps_memlimit_check(2e9, "s.json", "the graph", "use fewer chunks", &d), -E2BIG);
    char buf[2048];
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "s.json: the graph would need 1.86 GiB of memory; the limit is 1 GiB "
                        "(hint: use fewer chunks, or raise the limit with PIPESCOPE_MEM_LIMIT=SIZE "
                        "(e.g. 64G))");
    unsetenv(PS_MEMLIMIT_ENV);
}

static void test_rlimit_caps(void **state)
{
    (void)state;
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_DATA, &old), 0);
    struct rlimit rl = old;
    rl.rlim_cur = (rlim_t)8 << 30;
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < rl.rlim_cur) skip();
    assert_int_equal(setrlimit(RLIMIT_DATA, &rl), 0);
    setenv(PS_MEMLIMIT_ENV, "1T", 1); /* an explicit limit cannot go past ulimit either */
    uint64_t v = 0;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_memlimit_get(&v, &d), 0);
    assert_true(v <= ((uint64_t)6 << 30));
    unsetenv(PS_MEMLIMIT_ENV);
    assert_int_equal(setrlimit(RLIMIT_DATA, &old), 0);
}

static void test_estimates(void **state)
{
    (void)state;
    /* the graph estimate grows with m x n and bounds what a build allocates */
    double small = ps_graph_estimate_bytes(4, 2, PS_CKPT_EXCEPT_LAST);
    double big = ps_graph_estimate_bytes(65536, 48, PS_CKPT_EXCEPT_LAST);
    assert_true(small > 0 && big > 1e10 && big > 1000 * small);
    /* exec: activations x batch, synthetic data x steps */
    struct ps_spec *s;
    struct ps_model *m;
    struct ps_diag d;
    ps_diag_clear(&d);
    const char *json = "{\"pipescope\": 1, \"batch\": 1024, \"model\": {\"input\": [1000], "
                       "\"layers\": [{\"op\": \"linear\", \"out\": 1000}, {\"op\": \"relu\"}], "
                       "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [2], \"chunks\": 4}}";
    assert_int_equal(ps_spec_parse(json, "t.json", ".", &s, &d), 0);
    assert_int_equal(ps_model_build(s, &m, &d), 0);
    double one = ps_exec_estimate_bytes(s, m, s->mb_count, 1),
           many = ps_exec_estimate_bytes(s, m, s->mb_count, 1000);
    /* at least: weights+grads 8 * 1.001e6, activations+grads 2 layers x 1024 x 1000 x 8 */
    assert_true(one >= 8.0 * 1001000 + 2.0 * 1024 * 1000 * 8);
    /* 1000 steps: the BN log only (none here) and the step times; synthetic inputs are drawn
       per mini-batch, never 1000 steps of them at once (labels: cross_entropy only) */
    assert_true(many - one < 1e6);
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_sizes),
        cmocka_unit_test(test_check_message),
        cmocka_unit_test(test_rlimit_caps),
        cmocka_unit_test(test_estimates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
