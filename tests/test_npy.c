/* test_npy: the .npy reader and writer: round trips, every readable dtype, version 2.0 headers,
 * and the bad-input corpus tests/corpus/npy (n_*.npy must fail with the line in n_*.err). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "src/diag.h"
#include "src/npy.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_corpus[PATH_MAX];

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("PS_SOURCE_ROOT");
    snprintf(g_corpus, sizeof(g_corpus), "%s/tests/corpus/npy", root ? root : ".");
    return chdir(g_corpus) == 0 ? 0 : -1;
}

static void tmp_path(char *buf, size_t len, const char *name)
{
    const char *dir = getenv("PS_BUILD_ROOT");
    snprintf(buf, len, "%s/test_npy_%ld_%s", dir ? dir : "/tmp", (long)getpid(), name);
}

static void test_round_trip_f32(void **state)
{
    (void)state;
    char path[PATH_MAX];
    tmp_path(path, sizeof(path), "rt.npy");
    float data[2 * 3 * 4];
    for (int i = 0; i < 24; i++) data[i] = (float)i * 0.25f - 3.0f;
    int64_t shape[3] = {2, 3, 4};
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_npy_save_f32(path, data, 3, shape, &d), 0);

    struct ps_npy a;
    assert_int_equal(ps_npy_load(path, PS_NPY_F32, &a, &d), 0);
    assert_int_equal(a.ndim, 3);
    assert_int_equal(a.shape[0], 2);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.shape[2], 4);
    assert_int_equal(a.numel, 24);
    assert_string_equal(a.descr, "<f4");
    assert_memory_equal(a.u.f32, data, sizeof(data));
    ps_npy_finish(&a);

    /* numpy's layout: data starts at a multiple of 64 */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char pre[10];
    assert_int_equal(fread(pre, 1, 10, f), 10);
    fclose(f);
    assert_int_equal(pre[6], 1);
    assert_int_equal(pre[7], 0);
    assert_int_equal((10 + pre[8] + 256 * pre[9]) % 64, 0);
    unlink(path);
    ps_npy_finish(NULL);
}

static void test_round_trip_i64_scalar(void **state)
{
    (void)state;
    char path[PATH_MAX];
    tmp_path(path, sizeof(path), "nbt.npy");
    int64_t v = 123456789012LL;
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_npy_save_i64(path, &v, 0, NULL, &d), 0);
    struct ps_npy a;
    assert_int_equal(ps_npy_load(path, PS_NPY_I64, &a, &d), 0);
    assert_int_equal(a.ndim, 0);
    assert_int_equal(a.numel, 1);
    assert_string_equal(a.descr, "<i8");
    assert_int_equal(a.u.i64[0], v);
    ps_npy_finish(&a);
    unlink(path);
}

struct yfile {
    const char *name, *descr;
    int ndim;
    int64_t shape[2];
    size_t numel;
};

static void test_corpus_good(void **state)
{
    (void)state;
    static const struct yfile ys[] = {
        {"y_v1_f4.npy", "<f4", 2, {3, 4}, 12}, {"y_v2_f8.npy", "<f8", 2, {2, 3}, 6},
        {"y_i4.npy", "<i4", 1, {5, 0}, 5},     {"y_i8_scalar.npy", "<i8", 0, {0, 0}, 1},
        {"y_u1.npy", "|u1", 1, {4, 0}, 4},     {"y_b1.npy", "|b1", 1, {3, 0}, 3},
        {"y_empty.npy", "<f4", 2, {0, 3}, 0},  {"y_dquote.npy", "<f4", 1, {2, 0}, 2},
    };
    for (size_t k = 0; k < sizeof(ys) / sizeof(ys[0]); k++) {
        const struct yfile *y = &ys[k];
        for (int want = 0; want < 2; want++) {
            struct ps_npy a;
            struct ps_diag d;
            ps_diag_clear(&d);
            int rc = ps_npy_load(y->name, want ? PS_NPY_I64 : PS_NPY_F32, &a, &d);
            if (rc != 0) {
                char buf[2048];
                fail_msg("%s: %s", y->name, ps_diag_format(&d, buf, sizeof(buf)));
            }
            assert_string_equal(a.descr, y->descr);
            assert_int_equal(a.ndim, y->ndim);
            for (int i = 0; i < y->ndim; i++) assert_int_equal(a.shape[i], y->shape[i]);
            assert_int_equal(a.numel, y->numel);
            for (size_t i = 0; i < a.numel; i++) {
                int64_t expect = (int64_t)i;
                if (strcmp(y->name, "y_i8_scalar.npy") == 0) expect = 7;
                if (strcmp(y->name, "y_b1.npy") == 0) expect = (i + 1) % 2;
                if (want) assert_int_equal(a.u.i64[i], expect);
                else assert_true(a.u.f32[i] == (float)expect);
            }
            ps_npy_finish(&a);
        }
    }
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void test_corpus_bad(void **state)
{
    (void)state;
    DIR *dir = opendir(".");
    assert_non_null(dir);
    int checked = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strncmp(e->d_name, "n_", 2) != 0 || !ends_with(e->d_name, ".npy")) continue;
        char errname[512], expect[2048] = "", got[2048];
        snprintf(errname, sizeof(errname), "%.*s.err", (int)strlen(e->d_name) - 4, e->d_name);
        FILE *f = fopen(errname, "r");
        if (!f) fail_msg("%s has no %s", e->d_name, errname);
        size_t n = fread(expect, 1, sizeof(expect) - 1, f);
        fclose(f);
        expect[n] = '\0';
        if (n && expect[n - 1] == '\n') expect[n - 1] = '\0';

        struct ps_npy a;
        struct ps_diag d;
        ps_diag_clear(&d);
        int rc = ps_npy_load(e->d_name, PS_NPY_F32, &a, &d);
        if (rc == 0) fail_msg("%s loaded but must fail", e->d_name);
        assert_int_equal(rc, d.code);
        assert_null(a.u.data);
        ps_diag_format(&d, got, sizeof(got));
        if (strcmp(got, expect) != 0)
            fail_msg("%s:\n  expected: %s\n  got:      %s", e->d_name, expect, got);
        checked++;
    }
    closedir(dir);
    assert_true(checked >= 10);
}

static void test_missing_file(void **state)
{
    (void)state;
    struct ps_npy a;
    struct ps_diag d;
    ps_diag_clear(&d);
    char buf[1024];
    assert_int_equal(ps_npy_load("no_such_file.npy", PS_NPY_F32, &a, &d), -ENOENT);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "no_such_file.npy: cannot open: No such file or directory");
}

static void test_float_as_int(void **state)
{
    (void)state;
    /* A '<f4' file of integral values reads as int64; 0.5 does not. */
    char path[PATH_MAX];
    tmp_path(path, sizeof(path), "labels.npy");
    float v[3] = {1.0f, 2.0f, 0.5f};
    int64_t shape[1] = {3};
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_npy_save_f32(path, v, 1, shape, &d), 0);
    struct ps_npy a;
    assert_int_equal(ps_npy_load(path, PS_NPY_I64, &a, &d), -EINVAL);
    assert_string_equal(d.msg, "element 2 is 0.5, not an integer (dtype '<f4' read as int64)");
    shape[0] = 2;
    ps_diag_clear(&d);
    assert_int_equal(ps_npy_save_f32(path, v, 1, shape, &d), 0);
    assert_int_equal(ps_npy_load(path, PS_NPY_I64, &a, &d), 0);
    assert_int_equal(a.u.i64[1], 2);
    ps_npy_finish(&a);
    unlink(path);
}

static void test_parse_every_truncation(void **state)
{
    (void)state;
    /* Every strict prefix of a valid file fails cleanly (no crash, no success). */
    FILE *f = fopen("y_v2_f8.npy", "rb");
    assert_non_null(f);
    unsigned char buf[512];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_true(n > 64);
    for (size_t len = 0; len < n; len++) {
        struct ps_npy a;
        struct ps_diag d;
        ps_diag_clear(&d);
        assert_int_equal(ps_npy_parse(buf, len, "mem", PS_NPY_F32, &a, &d), -EINVAL);
        assert_int_equal(d.count, 1);
    }
    struct ps_npy a;
    assert_int_equal(ps_npy_parse(buf, n, "mem", PS_NPY_F32, &a, NULL), 0);
    assert_true(a.u.f32[5] == 5.0f);
    ps_npy_finish(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_f32),
        cmocka_unit_test(test_round_trip_i64_scalar),
        cmocka_unit_test(test_corpus_good),
        cmocka_unit_test(test_corpus_bad),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_float_as_int),
        cmocka_unit_test(test_parse_every_truncation),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
