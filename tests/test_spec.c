/* test_spec: defaults, derived fields, overrides, path resolution, and the bad-input corpus.
 *
 * The corpus lives in tests/corpus/spec/ (found through PS_SOURCE_ROOT). Every file there is a
 * case: y_*.json must load and build a model with no error and no warning; n_*.json must fail
 * with exactly the line in n_*.err; w_*.json must load with exactly the warning lines in w_*.warn.
 * The test chdirs into the corpus folder and loads each file by its basename, so the expected
 * lines start with that basename. Adding a file adds a case; a missing .err/.warn fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/model.h"
#include "src/spec.h"
#include "src/variant.h"

static const char *source_root(void)
{
    const char *r = getenv("PS_SOURCE_ROOT");
    return r && r[0] ? r : ".";
}

/* A spec with placeholders: batch, chunks and a pipeline tail to fill in. */
static struct ps_spec *parse_ok(const char *json, const char *name, const char *dir)
{
    struct ps_spec *s = NULL;
    struct ps_diag d;
    char buf[2048];
    ps_diag_clear(&d);
    int rc = ps_spec_parse(json, name, dir, &s, &d);
    if (rc) print_error("%s\n", ps_diag_format(&d, buf, sizeof(buf)));
    assert_int_equal(rc, 0);
    assert_non_null(s);
    return s;
}

static char *mlp(char *buf, size_t n, int batch, int chunks, const char *pipeline_extra,
                 const char *top_extra)
{
    snprintf(buf, n,
             "{\"pipescope\": 1, \"batch\": %d,%s \"model\": {\"input\": [8], \"layers\": ["
             "{\"op\": \"linear\", \"out\": 16}, {\"op\": \"relu\"}, {\"op\": \"linear\", "
             "\"out\": 4}], \"loss\": \"cross_entropy\"}, \"pipeline\": {\"balance\": [1, 2], "
             "\"chunks\": %d%s}}",
             batch, top_extra, chunks, pipeline_extra);
    return buf;
}

static void test_defaults(void **state)
{
    (void)state;
    char json[2048];
    struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 32, 8, "", ""), "dir/my.spec.json", "dir");
    assert_string_equal(s->path, "dir/my.spec.json");
    assert_string_equal(s->name, "my.spec");
    assert_int_equal(s->version, 1);
    assert_int_equal(s->batch, 32);
    assert_int_equal(s->n_input_dims, 1);
    assert_int_equal(s->input[0], 8);
    assert_int_equal(s->n_layers, 3);
    assert_int_equal(s->layers[0].op, PS_OP_LINEAR);
    assert_true(s->layers[0].bias);
    assert_int_equal(s->loss, PS_LOSS_CROSS_ENTROPY);
    assert_int_equal(s->n_classes, 4);
    assert_null(s->weights);
    assert_int_equal(s->schedule, PS_SCHED_GPIPE);
    assert_int_equal(s->checkpoint, PS_CKPT_EXCEPT_LAST);
    assert_int_equal(s->batchnorm, PS_BN_PLAIN);
    assert_true(s->phony);
    assert_false(s->fairscale);
    assert_int_equal(s->virtual_stages, 1);
    assert_int_equal(s->n_partitions, 2);
    assert_int_equal(s->devices[0].kind, PS_DEV_CUDA);
    assert_int_equal(s->devices[0].index, 0);
    assert_int_equal(s->devices[1].index, 1);
    assert_int_equal(s->device_id[1], 1);
    assert_int_equal(s->n_devices, 2);
    assert_int_equal(s->first_layer[0], 0);
    assert_int_equal(s->first_layer[1], 1);
    assert_int_equal(s->data_source, PS_DATA_SYNTHETIC);
    assert_int_equal(s->seed, 0);
    assert_int_equal(s->target_column, -1);
    assert_true(s->dev_flops == 6.7e13);
    assert_true(s->dev_mem_bw == 4.8e12);
    assert_true(s->dev_launch_us == 4);
    assert_true(s->link_bw == 4.5e11);
    assert_true(s->link_latency_us == 2);
    assert_null(s->costs);
    assert_int_equal(s->steps, 1);
    assert_true(s->lr == 0.01);
    assert_int_equal(s->n_warnings, 0);
    ps_spec_destroy(s);
}

static void test_layer_defaults(void **state)
{
    (void)state;
    const char *json =
        "{\"pipescope\": 1, \"batch\": 4, \"model\": {\"input\": [3, 8, 8], \"layers\": ["
        "{\"op\": \"conv2d\", \"out\": 4, \"kernel\": 3}, {\"op\": \"batchnorm\"},"
        "{\"op\": \"maxpool2d\", \"kernel\": 2}, {\"op\": \"dropout\"}, {\"op\": \"flatten\"}],"
        "\"loss\": \"sum\"}, \"pipeline\": {\"balance\": [5], \"chunks\": 2}}";
    struct ps_spec *s = parse_ok(json, "t.json", NULL);
    assert_int_equal(s->layers[0].stride, 1);
    assert_int_equal(s->layers[0].padding, 0);
    assert_true(s->layers[0].bias);
    assert_true(s->layers[1].momentum == 0.1);
    assert_false(s->layers[1].momentum_null);
    assert_true(s->layers[1].eps == 1e-5);
    assert_true(s->layers[1].affine);
    assert_int_equal(s->layers[2].stride, 2); /* default = kernel */
    assert_true(s->layers[3].p == 0.5);
    assert_int_equal(s->n_classes, 0); /* only for cross_entropy */
    ps_spec_destroy(s);
}

static void test_chunks_5_4(void **state)
{
    (void)state;
    char json[2048];
    struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 5, 4, "", ""), "spec.json", ".");
    assert_int_equal(s->chunks, 4);
    assert_int_equal(s->mb_count, 3);
    assert_int_equal(s->mb_size[0], 2);
    assert_int_equal(s->mb_size[1], 2);
    assert_int_equal(s->mb_size[2], 1);
    assert_int_equal(s->n_warnings, 1);
    assert_string_equal(s->warnings[0],
                        "spec.json: pipeline.chunks: 4 chunks of a batch of 5 give 3 "
                        "micro-batches (torch.chunk semantics); the pipeline runs with m=3");
    struct ps_variant v;
    ps_variant_from_spec(s, &v);
    assert_int_equal(v.mb_count, 3);
    assert_int_equal(ps_variant_checkpoint_stop(&v), 3); /* configured chunks - 1, not m - 1 */
    ps_spec_destroy(s);
}

static void test_chunks_32_8(void **state)
{
    (void)state;
    char json[2048];
    struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 32, 8, "", ""), "spec.json", ".");
    assert_int_equal(s->mb_count, 8);
    for (int i = 0; i < 8; i++) assert_int_equal(s->mb_size[i], 4);
    assert_int_equal(s->n_warnings, 0);
    ps_spec_destroy(s);
}

static void test_chunks_table(void **state)
{
    (void)state;
    /* torch.chunk: size = ceil(N/chunks), m = ceil(N/size) */
    static const struct { int n, chunks, m, last; } cases[] = {
        {1, 1, 1, 1}, {7, 7, 7, 1}, {10, 4, 4, 1}, {10, 8, 5, 2}, {17, 16, 9, 1}, {6, 4, 3, 2},
        {1048576, 65536, 65536, 16},
    };
    char json[2048];
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct ps_spec *s =
            parse_ok(mlp(json, sizeof(json), cases[k].n, cases[k].chunks, "", ""), "x.json", ".");
        assert_int_equal(s->mb_count, cases[k].m);
        assert_int_equal(s->mb_size[s->mb_count - 1], cases[k].last);
        int64_t sum = 0;
        for (int i = 0; i < s->mb_count; i++) sum += s->mb_size[i];
        assert_int_equal(sum, cases[k].n);
        assert_int_equal(s->n_warnings, cases[k].m != cases[k].chunks);
        ps_spec_destroy(s);
    }
}

/* A variant overrides chunks (sweep, drift) without touching the spec: torch.chunk sizes
 * worked by hand for a batch of 5. */
static void test_variant_chunks(void **state)
{
    (void)state;
    char json[2048], buf[2048];
    struct ps_diag d;
    struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 5, 1, "", ""), "spec.json", ".");
    struct ps_variant v;
    ps_variant_from_spec(s, &v);
    assert_int_equal(v.chunks, 1);
    assert_int_equal(v.mb_count, 1);
    assert_int_equal(ps_variant_mb_size(&v, 0), 5);

    ps_diag_clear(&d);
    assert_int_equal(ps_variant_set_chunks(&v, s, 4, &d), 0); /* 2 2 1 */
    assert_int_equal(v.chunks, 4);
    assert_int_equal(v.mb_count, 3);
    assert_int_equal(ps_variant_mb_size(&v, 0), 2);
    assert_int_equal(ps_variant_mb_size(&v, 1), 2);
    assert_int_equal(ps_variant_mb_size(&v, 2), 1);
    assert_int_equal(ps_variant_set_chunks(&v, s, 5, &d), 0); /* 1 1 1 1 1 */
    assert_int_equal(v.mb_count, 5);
    assert_int_equal(ps_variant_mb_size(&v, 4), 1);
    /* the spec is untouched: its own chunks, split and warnings */
    assert_int_equal(s->chunks, 1);
    assert_int_equal(s->mb_count, 1);
    assert_int_equal(s->mb_size[0], 5);
    assert_int_equal(s->n_warnings, 0);

    assert_int_equal(ps_variant_set_chunks(&v, s, 6, &d), -EINVAL);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "spec.json: pipeline.chunks: 6 chunks exceed the batch of 5 samples "
                        "(hint: every micro-batch needs at least one sample: use chunks <= 5)");
    assert_int_equal(v.chunks, 5); /* unchanged on error */
    assert_int_equal(v.mb_count, 5);
    ps_diag_clear(&d);
    assert_int_equal(ps_variant_set_chunks(&v, s, 0, &d), -EINVAL);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "spec.json: pipeline.chunks: expected a positive number of chunks, found 0");
    ps_spec_destroy(s);
}

static void test_checkpoint_stop(void **state)
{
    (void)state;
    char json[2048];
    static const struct { const char *mode; int stop; } cases[] = {
        {", \"checkpoint\": \"always\"", 4},
        {", \"checkpoint\": \"except_last\"", 3},
        {", \"checkpoint\": \"never\"", 0},
    };
    for (int k = 0; k < 3; k++) {
        struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 8, 4, cases[k].mode, ""), "a", ".");
        struct ps_variant v;
        ps_variant_from_spec(s, &v);
        assert_int_equal(ps_variant_checkpoint_stop(&v), cases[k].stop);
        ps_spec_destroy(s);
    }
}

static void test_devices(void **state)
{
    (void)state;
    const char *json =
        "{\"pipescope\": 1, \"batch\": 4, \"model\": {\"input\": [2], \"layers\": ["
        "{\"op\": \"relu\"}, {\"op\": \"relu\"}, {\"op\": \"relu\"}, {\"op\": \"linear\", "
        "\"out\": 2}], \"loss\": \"sum\"}, \"pipeline\": {\"balance\": [1, 1, 1, 1], \"chunks\": "
        "2, \"devices\": [\"cuda:3\", \"cpu\", \"cuda:3\", \"cuda:0\"]}}";
    struct ps_spec *s = parse_ok(json, "d.json", ".");
    char buf[32];
    assert_int_equal(s->n_devices, 3);
    assert_int_equal(s->device_id[0], 0);
    assert_int_equal(s->device_id[1], 1);
    assert_int_equal(s->device_id[2], 0);
    assert_int_equal(s->device_id[3], 2);
    ps_device_format(&s->devices[0], buf, sizeof(buf));
    assert_string_equal(buf, "cuda:3");
    ps_device_format(&s->devices[1], buf, sizeof(buf));
    assert_string_equal(buf, "cpu");
    assert_int_equal(s->devices[1].index, -1);
    ps_spec_destroy(s);
}

static void test_paths(void **state)
{
    (void)state;
    char json[2048];
    const char *extra = " \"costs\": \"p.json\", \"data\": {\"source\": \"npy\", \"inputs\": "
                        "\"x.npy\", \"targets\": \"/abs/y.npy\"},";
    struct ps_spec *s = parse_ok(mlp(json, sizeof(json), 4, 2, "", extra), "a/b/s.json", "a/b");
    assert_string_equal(s->costs, "a/b/p.json");
    assert_string_equal(s->data_inputs, "a/b/x.npy");
    assert_string_equal(s->data_targets, "/abs/y.npy");
    ps_spec_destroy(s);
    s = parse_ok(json, "s.json", ".");
    assert_string_equal(s->data_inputs, "x.npy");
    ps_spec_destroy(s);
    s = parse_ok(json, "/s.json", "/");
    assert_string_equal(s->data_inputs, "/x.npy");
    ps_spec_destroy(s);
    s = parse_ok(json, "s.json", "dir/");
    assert_string_equal(s->data_inputs, "dir/x.npy");
    ps_spec_destroy(s);

    /* ps_spec_load takes the folder from the path as given */
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/corpus/spec/y_full.json", source_root());
    struct ps_diag d;
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_load(path, &s, &d), 0);
    char want[4200];
    assert_string_equal(s->path, path);
    snprintf(want, sizeof(want), "%s/tests/corpus/spec/weights/", source_root());
    assert_string_equal(s->weights, want);
    snprintf(want, sizeof(want), "%s/tests/corpus/spec/profile.json", source_root());
    assert_string_equal(s->costs, want);
    snprintf(want, sizeof(want), "%s/tests/corpus/spec/y.npy", source_root());
    assert_string_equal(s->data_targets, want);
    assert_string_equal(s->name, "full");
    assert_true(s->fairscale);
    assert_false(s->phony);
    assert_int_equal(s->seed, 7);
    assert_int_equal(s->steps, 3);
    assert_true(s->lr == 0.05);
    assert_true(s->dev_flops == 1e12);
    assert_true(s->link_latency_us == 0);
    ps_spec_destroy(s);
}

static void test_unreadable(void **state)
{
    (void)state;
    struct ps_spec *s = (struct ps_spec *)1;
    struct ps_diag d;
    char buf[2048];
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_load("/nonexistent/spec.json", &s, &d), -ENOENT);
    assert_null(s);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "/nonexistent/spec.json: cannot read the spec: No such file or directory");
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_load("/", &s, &d), -EISDIR);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "/: cannot read the spec: Is a directory");
    ps_spec_destroy(NULL);
}

static void test_parse_errors(void **state)
{
    (void)state;
    struct ps_spec *s = NULL;
    struct ps_diag d;
    char buf[2048];
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_parse("{\n  \"pipescope\": 1,\n  \"x\": [1, 2,]\n}", "m.json", NULL,
                                   &s, &d),
                     -EINVAL);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "m.json:3:13: malformed JSON: trailing comma before ']' (hint: JSON does "
                        "not allow a comma after the last element)");
    assert_int_equal(d.count, 1);
    ps_diag_clear(&d);
    assert_int_equal(ps_spec_parse("{\"a\": {\"b\": [{\"c\": 1, \"c\": 2}]}}", NULL, NULL, &s, &d),
                     -EINVAL);
    assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)),
                        "<string>: a.b[0].c: duplicate key (an object may name each key only once)");
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(ps_op_name(PS_OP_MAXPOOL2D), "maxpool2d");
    assert_string_equal(ps_op_name(PS_OP__COUNT), "?");
    assert_string_equal(ps_checkpoint_name(PS_CKPT_EXCEPT_LAST), "except_last");
    assert_string_equal(ps_bn_policy_name(PS_BN_GRAD_ONLY), "grad-only");
    assert_string_equal(ps_schedule_name(PS_SCHED_INTERLEAVED), "interleaved-1f1b");
    assert_string_equal(ps_schedule_name(PS_SCHED_ZBH1), "zb-h1");
    assert_string_equal(ps_loss_name(PS_LOSS_CROSS_ENTROPY), "cross_entropy");
}

/* ---- corpus ------------------------------------------------------------------------------------ */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1024, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

static char *sibling(const char *json, const char *ext)
{
    size_t n = strlen(json) - 5; /* ".json" */
    char *p = malloc(n + strlen(ext) + 1);
    memcpy(p, json, n);
    strcpy(p + n, ext);
    return p;
}

static void corpus_case(void **state)
{
    const char *file = *state;
    struct ps_spec *s = NULL;
    struct ps_model *m = NULL;
    struct ps_diag d;
    char buf[4096];
    ps_diag_clear(&d);
    int rc = ps_spec_load(file, &s, &d);
    if (rc == 0) rc = ps_model_build(s, &m, &d);
    if (file[0] == 'y' || file[0] == 'w') {
        if (rc) print_error("%s: unexpected error: %s\n", file, ps_diag_format(&d, buf, sizeof(buf)));
        assert_int_equal(rc, 0);
        size_t o = 0;
        buf[0] = '\0';
        for (int i = 0; i < s->n_warnings; i++)
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s\n", s->warnings[i]);
        if (file[0] == 'y') {
            assert_string_equal(buf, "");
        } else {
            char *wp = sibling(file, ".warn");
            char *want = read_all(wp);
            if (!want) print_error("%s: no %s with the expected warnings\n", file, wp);
            free(wp);
            assert_non_null(want);
            assert_true(s->n_warnings > 0);
            assert_string_equal(buf, want);
            free(want);
        }
    } else {
        char *ep = sibling(file, ".err");
        char *want = read_all(ep);
        if (!want) print_error("%s: no %s with the expected error\n", file, ep);
        free(ep);
        assert_non_null(want);
        if (rc == 0) print_error("%s: loaded without error, expected: %s", file, want);
        assert_true(rc < 0);
        assert_int_equal(d.code, rc);
        size_t n = strlen(want);
        if (n && want[n - 1] == '\n') want[n - 1] = '\0';
        assert_string_equal(ps_diag_format(&d, buf, sizeof(buf)), want);
        free(want);
    }
    ps_model_destroy(m);
    ps_spec_destroy(s);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int n_names;
static char **names;

/* Every file in the corpus folder is a case or an expectation of one; counts are a floor. */
static void corpus_consistency(void **state)
{
    (void)state;
    int y = 0, n = 0, w = 0;
    for (int i = 0; i < n_names; i++) {
        const char *f = names[i];
        if (ends_with(f, ".json")) {
            if (f[0] == 'y' && f[1] == '_') y++;
            else if (f[0] == 'n' && f[1] == '_') n++;
            else if (f[0] == 'w' && f[1] == '_') w++;
            else fail_msg("corpus file %s is not named y_, n_ or w_", f);
        } else if (ends_with(f, ".err") || ends_with(f, ".warn")) {
            size_t base = strlen(f) - (ends_with(f, ".err") ? 4 : 5);
            char json[512];
            snprintf(json, sizeof(json), "%.*s.json", (int)base, f);
            if (access(json, R_OK) != 0) fail_msg("%s has no %s", f, json);
            if ((f[0] == 'n') != ends_with(f, ".err")) fail_msg("%s: wrong prefix for its kind", f);
        } else {
            fail_msg("unexpected file %s in the corpus", f);
        }
    }
    print_message("corpus: %d y_, %d n_, %d w_\n", y, n, w);
    assert_true(y + n + w >= 35);
    assert_true(y >= 5 && n >= 25 && w >= 2);
}

int main(void)
{
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_layer_defaults),
        cmocka_unit_test(test_chunks_5_4),   cmocka_unit_test(test_chunks_32_8),
        cmocka_unit_test(test_chunks_table), cmocka_unit_test(test_variant_chunks),
        cmocka_unit_test(test_checkpoint_stop), cmocka_unit_test(test_devices),
        cmocka_unit_test(test_paths),        cmocka_unit_test(test_unreadable),
        cmocka_unit_test(test_parse_errors), cmocka_unit_test(test_names),
    };
    int failed = cmocka_run_group_tests_name("spec", unit, NULL, NULL);

    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tests/corpus/spec", source_root());
    if (chdir(dir) != 0) {
        fprintf(stderr, "cannot enter the corpus folder %s: %s\n", dir, strerror(errno));
        return 1;
    }
    DIR *dp = opendir(".");
    if (!dp) return 1;
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        if (n_names == cap) names = realloc(names, sizeof(*names) * (size_t)(cap = cap ? cap * 2 : 64));
        names[n_names++] = strdup(e->d_name);
    }
    closedir(dp);
    qsort(names, (size_t)n_names, sizeof(*names), by_name);

    struct CMUnitTest *cases = calloc((size_t)n_names + 1, sizeof(*cases));
    int n = 0;
    cases[n++] = (struct CMUnitTest){"corpus_consistency", corpus_consistency, NULL, NULL, NULL};
    for (int i = 0; i < n_names; i++)
        if (ends_with(names[i], ".json"))
            cases[n++] = (struct CMUnitTest){names[i], corpus_case, NULL, NULL, names[i]};
    failed += _cmocka_run_group_tests("spec_corpus", cases, (size_t)n, NULL, NULL);
    free(cases);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    return failed ? 1 : 0;
}
