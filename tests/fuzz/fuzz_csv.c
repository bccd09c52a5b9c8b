/* fuzz_csv: the csv / csv.gz reader of src/data.c, through ps_data_load as `run` calls it.
 *
 * The reader takes a path (zlib's gzopen reads plain and gzip files alike), so the input goes
 * to one memfd that the spec names as /proc/self/fd/N: the real code path, zlib included, with
 * no file on disk. The first input byte picks the model the rows must fit (1..4 features; loss
 * cross_entropy with 3 classes, mse with one output, or sum) and the target column (-4..3); the
 * rest is the file. Contract checked: a failure leaves the data empty and says why; a success
 * has n_samples >= 1 and finite features, labels in [0, classes), finite targets.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "src/data.h"
#include "tests/fuzz/fuzz.h"
#include "src/model.h"
#include "src/spec.h"

#define N_VARIANTS 96 /* 4 feature counts x 3 losses x 8 target columns */

static int g_fd = -1;
static struct ps_spec *g_spec[N_VARIANTS];
static struct ps_model *g_model[N_VARIANTS];

static void cleanup(void)
{
    for (int k = 0; k < N_VARIANTS; k++) {
        ps_model_destroy(g_model[k]);
        ps_spec_destroy(g_spec[k]);
        g_model[k] = NULL;
        g_spec[k] = NULL;
    }
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
}

static int variant(int v, struct ps_spec **s, struct ps_model **m)
{
    if (g_spec[v]) {
        *s = g_spec[v];
        *m = g_model[v];
        return 0;
    }
    static const char *const losses[] = {"cross_entropy", "mse", "sum"};
    static const int outs[] = {3, 1, 2};
    int features = 1 + v % 4, loss = (v / 4) % 3, col = v / 12 - 4;
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"pipescope\": 1, \"batch\": 2, \"model\": {\"input\": [%d], \"layers\": "
             "[{\"op\": \"linear\", \"out\": %d}], \"loss\": \"%s\"}, \"pipeline\": {\"balance\": "
             "[1], \"chunks\": 1}, \"data\": {\"source\": \"csv\", \"path\": \"/proc/self/fd/%d\", "
             "\"target_column\": %d}}",
             features, outs[loss], losses[loss], g_fd, col);
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_spec_parse(json, "fuzz.json", "/", &g_spec[v], &d) ||
        ps_model_build(g_spec[v], &g_model[v], &d)) {
        fprintf(stderr, "fuzz_csv: variant %d: %s\n", v, d.msg);
        abort();
    }
    *s = g_spec[v];
    *m = g_model[v];
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20)) return 0;
    if (g_fd < 0) {
        g_fd = memfd_create("fuzz_csv", 0);
        FUZZ_CHECK(g_fd >= 0);
        atexit(cleanup);
    }
    FUZZ_CHECK(ftruncate(g_fd, 0) == 0);
    FUZZ_CHECK(pwrite(g_fd, data + 1, size - 1, 0) == (ssize_t)(size - 1));
    struct ps_spec *s;
    struct ps_model *m;
    variant(data[0] % N_VARIANTS, &s, &m);
    struct ps_data dt;
    struct ps_diag d;
    ps_diag_clear(&d);
    int rc = ps_data_load(s, m, 0, &dt, &d);
    if (rc) {
        FUZZ_CHECK(rc < 0 && d.msg[0] && dt.x == NULL && dt.labels == NULL && dt.rows == NULL);
        return 0;
    }
    FUZZ_CHECK(dt.n_samples >= 1 && dt.in_numel == m->layers[0].in_numel);
    for (int64_t k = 0; k < dt.n_samples * dt.in_numel; k++) FUZZ_CHECK(isfinite(dt.x[k]));
    if (dt.target == PS_TARGET_LABELS)
        for (int64_t k = 0; k < dt.n_samples; k++)
            FUZZ_CHECK(dt.labels[k] >= 0 && dt.labels[k] < dt.classes);
    if (dt.target == PS_TARGET_ROWS)
        for (int64_t k = 0; k < dt.n_samples * dt.out_numel; k++) FUZZ_CHECK(isfinite(dt.rows[k]));
    /* the batch copy `run` does every step, wrapping around */
    float x[2 * 4], rows[2 * 3];
    int64_t labels[2];
    ps_data_batch(&dt, 3, 2, x, labels, rows);
    ps_data_finish(&dt);
    return 0;
}
