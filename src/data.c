/* data: synthetic, .npy and .csv(.gz) training samples (see data.h).
 *
 * Invariants after a successful ps_data_load:
 *   1. n_samples >= 1, x holds n_samples * in_numel finite floats.
 *   2. target LABELS: every label is an integer in [0, classes); ROWS: n_samples * out_numel
 *      finite floats; NONE for the sum loss (targets given anyway are ignored).
 * The synthetic generator is a pure function of (seed, sample, element), so any sample can be
 * drawn in any order and the data of step s never depends on how many steps run; its inputs and
 * rows are drawn when a mini-batch asks for them (labels, 8 bytes a sample, are kept), so a run
 * holds one mini-batch of them whatever its number of steps.
 */
#include "src/data.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


#include "src/file.h"
#include "src/memlimit.h"
#include "src/npy.h"
#include "src/rng.h"

/* ---- synthetic ------------------------------------------------------------------------- */

#define mix64 ps_rng_splitmix64

/* uniform in (0, 1) with 53 random bits, keyed by (seed, stream, index) */
static double uni(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t z = mix64(seed ^ mix64(stream * UINT64_C(0x632be59bd9b4e019) ^ mix64(index)));
    return ((double)(z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    double u1 = uni(seed, stream, 2 * index), u2 = uni(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

enum { STREAM_INPUT = 1, STREAM_LABEL = 2, STREAM_ROW = 3 };

static int gen_synthetic(struct ps_data *dt, const struct ps_spec *spec, int64_t samples,
                         struct ps_diag *d)
{
    char what[96];
    snprintf(what, sizeof(what), "synthetic labels of %lld samples", (long long)samples);
    int rc = ps_memlimit_check((double)samples * 8.0, spec->path, what, "use fewer steps", d);
    if (rc) return rc;
    dt->n_samples = samples;
    dt->synthetic = true;
    dt->seed = spec->seed;
    if (dt->target == PS_TARGET_LABELS) {
        dt->labels = malloc((size_t)samples * sizeof(int64_t));
        if (!dt->labels) return ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
        for (int64_t k = 0; k < samples; k++) {
            int64_t c = (int64_t)(uni(spec->seed, STREAM_LABEL, (uint64_t)k) * (double)dt->classes);
            dt->labels[k] = c < dt->classes ? c : dt->classes - 1;
        }
    }
    return 0;
}

/* synthetic sample s: its inputs (and rows) as gen_synthetic laid them out in the stream */
static void draw_sample(const struct ps_data *dt, int64_t s, float *x, float *rows)
{
    if (x)
        for (int64_t e = 0; e < dt->in_numel; e++)
            x[e] = (float)normal(dt->seed, STREAM_INPUT, (uint64_t)(s * dt->in_numel + e));
    if (rows && dt->target == PS_TARGET_ROWS)
        for (int64_t e = 0; e < dt->out_numel; e++)
            rows[e] = (float)normal(dt->seed, STREAM_ROW, (uint64_t)(s * dt->out_numel + e));
}

/* ---- checks shared by npy and csv -------------------------------------------------------- */

static int check_finite(const float *v, int64_t n, int64_t per, const char *where,
                        const char *what, struct ps_diag *d)
{
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(v[k]))
            return ps_diag_set(d, -EINVAL, where, "%s of sample %lld: element %lld is %s", what,
                               (long long)(k / per), (long long)(k % per),
                               isnan(v[k]) ? "NaN" : "infinite");
    return 0;
}

static int check_labels(const int64_t *l, int64_t n, int64_t classes, const char *where,
                        struct ps_diag *d)
{
    for (int64_t k = 0; k < n; k++)
        if (l[k] < 0 || l[k] >= classes) {
            ps_diag_set(d, -EINVAL, where, "label of sample %lld is %lld, expected 0..%lld",
                        (long long)k, (long long)l[k], (long long)(classes - 1));
            ps_diag_hint(d, "the model's last layer has %lld outputs (classes)",
                         (long long)classes);
            return -EINVAL;
        }
    return 0;
}

static void shape_str(const int64_t *s, int nd, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int k = 0; k < nd && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", k ? ", " : "", (long long)s[k]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* [S, dims...] or [S, numel] */
static bool per_sample_matches(const struct ps_npy *a, int nd, const int64_t *dims, int64_t numel)
{
    if (a->ndim < 1) return false;
    if (a->ndim == 2 && a->shape[1] == numel) return true;
    if (a->ndim != nd + 1) return false;
    for (int k = 0; k < nd; k++)
        if (a->shape[k + 1] != dims[k]) return false;
    return true;
}

/* ---- npy --------------------------------------------------------------------------------- */

static int load_npy(struct ps_data *dt, const struct ps_spec *spec, const struct ps_model *model,
                    struct ps_diag *d)
{
    char want[64], got[160];
    if (!spec->data_inputs)
        return ps_diag_set(d, -EINVAL, spec->path, "data.inputs: missing for source \"npy\"");
    struct ps_npy a;
    int rc = ps_npy_load(spec->data_inputs, PS_NPY_F32, &a, d);
    if (rc) return rc;
    if (!per_sample_matches(&a, spec->n_input_dims, spec->input, dt->in_numel) ||
        a.shape[0] < 1) {
        int64_t ws[PS_SPEC_MAX_DIMS + 1];
        ws[0] = -1;
        memcpy(ws + 1, spec->input, (size_t)spec->n_input_dims * sizeof(int64_t));
        shape_str(ws + 1, spec->n_input_dims, want, sizeof(want));
        shape_str(a.shape, a.ndim, got, sizeof(got));
        ps_diag_set(d, -EINVAL, spec->data_inputs,
                    "shape %s does not match the model input: expected [S] + %s (S >= 1)", got,
                    want);
        ps_npy_finish(&a);
        return -EINVAL;
    }
    dt->n_samples = a.shape[0];
    dt->x = a.u.f32; /* ownership moves */
    if ((rc = check_finite(dt->x, dt->n_samples * dt->in_numel, dt->in_numel, spec->data_inputs,
                           "input", d)))
        return rc;
    if (dt->target == PS_TARGET_NONE) return 0;
    if (!spec->data_targets)
        return ps_diag_set(d, -EINVAL, spec->path,
                           "data.targets: missing, the %s loss needs targets",
                           ps_loss_name(spec->loss));
    struct ps_npy t;
    rc = ps_npy_load(spec->data_targets,
                     dt->target == PS_TARGET_LABELS ? PS_NPY_I64 : PS_NPY_F32, &t, d);
    if (rc) return rc;
    const struct ps_layer_info *last = &model->layers[model->n_layers - 1];
    if (dt->target == PS_TARGET_LABELS) {
        if (t.ndim != 1 || t.shape[0] != dt->n_samples) {
            shape_str(t.shape, t.ndim, got, sizeof(got));
            ps_diag_set(d, -EINVAL, spec->data_targets,
                        "shape %s: expected [%lld] integer labels, one per input sample", got,
                        (long long)dt->n_samples);
            ps_npy_finish(&t);
            return -EINVAL;
        }
        if (t.descr[1] == 'f') {
            ps_diag_set(d, -EINVAL, spec->data_targets,
                        "dtype '%s': expected integer labels (int32 or int64)", t.descr);
            ps_npy_finish(&t);
            return -EINVAL;
        }
        dt->labels = t.u.i64;
        return check_labels(dt->labels, dt->n_samples, dt->classes, spec->data_targets, d);
    }
    if (!per_sample_matches(&t, last->n_out_dims, last->out, dt->out_numel) ||
        t.shape[0] != dt->n_samples) {
        shape_str(t.shape, t.ndim, got, sizeof(got));
        shape_str(last->out, last->n_out_dims, want, sizeof(want));
        ps_diag_set(d, -EINVAL, spec->data_targets,
                    "shape %s: expected [%lld] + %s target rows, one per input sample", got,
                    (long long)dt->n_samples, want);
        ps_npy_finish(&t);
        return -EINVAL;
    }
    dt->rows = t.u.f32;
    return check_finite(dt->rows, dt->n_samples * dt->out_numel, dt->out_numel,
                        spec->data_targets, "target", d);
}

/* ---- csv --------------------------------------------------------------------------------- */

/* Splits a line at commas in place; returns the field count (fields[] gets at most max). */
static int split(char *s, char **fields, int max)
{
    int n = 0;
    size_t L = strlen(s);
    while (L && (s[L - 1] == '\n' || s[L - 1] == '\r')) s[--L] = '\0';
    char *p = s;
    for (;;) {
        if (n < max) fields[n] = p;
        n++;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

static bool parse_num(const char *s, double *v)
{
    while (*s == ' ' || *s == '\t') s++;
    char *end;
    *v = strtod(s, &end);
    if (end == s) return false;
    while (*end == ' ' || *end == '\t') end++;
    return *end == '\0';
}

static int load_csv(struct ps_data *dt, const struct ps_spec *spec, struct ps_diag *d)
{
    const char *path = spec->data_csv;
    char where[PS_DIAG_WHERE_MAX];
    if (!path) return ps_diag_set(d, -EINVAL, spec->path, "data.path: missing for source \"csv\"");
    if (dt->target == PS_TARGET_ROWS && dt->out_numel != 1)
        return ps_diag_set(d, -EINVAL, path,
                           "a csv target column holds one value per row, but the model has %lld "
                           "outputs for the mse loss",
                           (long long)dt->out_numel);
    struct ps_file_lines f;
    int frc = ps_file_lines_open(&f, path, d); /* plain or gzip, each line within the limit */
    if (frc) return frc;
    int want_cols = (int)dt->in_numel + 1;
    char **fields = malloc((size_t)want_cols * sizeof(char *));
    char *line = NULL;
    size_t line_len = 0, cap_rows = 0;
    int rc = 0;
    long lineno = 0;
    int64_t S = 0;
    if (!fields) rc = ps_diag_set(d, -ENOMEM, path, "out of memory");
    while (rc == 0) {
        int got = ps_file_lines_next(&f, &line, &line_len, d);
        if (got < 0) rc = got;
        if (got <= 0) break;
        lineno = f.lineno;
        int nf = split(line, fields, want_cols);
        if (nf == 1 && fields[0][0] == '\0') continue; /* empty line */
        snprintf(where, sizeof(where), "%s:%ld", path, lineno);
        if (lineno == 1) {
            bool header = false;
            double v;
            for (int k = 0; k < nf && k < want_cols; k++)
                if (!parse_num(fields[k], &v)) header = true;
            if (header) continue;
        }
        if (nf != want_cols) {
            rc = ps_diag_set(d, -EINVAL, where,
                             "%d columns, expected %d (%lld features for input numel + 1 target)",
                             nf, want_cols, (long long)dt->in_numel);
            break;
        }
        if ((size_t)S == cap_rows) {
            size_t nc = cap_rows ? cap_rows * 2 : 256;
            char what[96];
            snprintf(what, sizeof(what), "%lld rows of %lld features", (long long)nc,
                     (long long)dt->in_numel);
            if ((rc = ps_memlimit_check((double)nc * (4.0 * (double)dt->in_numel + 8.0), path,
                                        what, "use a smaller file", d)))
                break;
            float *nx = realloc(dt->x, nc * (size_t)dt->in_numel * sizeof(float));
            if (nx) dt->x = nx;
            void *nt = NULL;
            if (dt->target == PS_TARGET_LABELS) {
                nt = realloc(dt->labels, nc * sizeof(int64_t));
                if (nt) dt->labels = nt;
            } else {
                nt = realloc(dt->rows, nc * sizeof(float));
                if (nt) dt->rows = nt;
            }
            if (!nx || !nt) {
                rc = ps_diag_set(d, -ENOMEM, path, "out of memory at row %lld", (long long)S);
                break;
            }
            cap_rows = nc;
        }
        int tc = spec->target_column < 0 ? want_cols + spec->target_column : spec->target_column;
        if (tc < 0 || tc >= want_cols) {
            rc = ps_diag_set(d, -EINVAL, where, "target_column %d is outside the %d columns",
                             spec->target_column, want_cols);
            break;
        }
        float *xr = dt->x + S * dt->in_numel;
        int fk = 0;
        for (int k = 0; k < want_cols && rc == 0; k++) {
            double v;
            if (!parse_num(fields[k], &v)) {
                rc = ps_diag_set(d, -EINVAL, where, "column %d: '%.40s' is not a number", k + 1,
                                 fields[k]);
                break;
            }
            if (!isfinite(v)) {
                rc = ps_diag_set(d, -EINVAL, where, "column %d is %s", k + 1,
                                 isnan(v) ? "NaN" : "infinite");
                break;
            }
            if ((k != tc || dt->target == PS_TARGET_ROWS) && fabs(v) > FLT_MAX) {
                rc = ps_diag_set(d, -EINVAL, where, "column %d: %g is out of float32 range", k + 1,
                                 v);
                break;
            }
            if (k != tc) {
                xr[fk++] = (float)v;
                continue;
            }
            if (dt->target == PS_TARGET_LABELS) {
                if (v != floor(v) || v < 0 || v >= (double)dt->classes) {
                    rc = ps_diag_set(d, -EINVAL, where,
                                     "label (column %d) is %g, expected an integer in 0..%lld",
                                     k + 1, v, (long long)(dt->classes - 1));
                    break;
                }
                dt->labels[S] = (int64_t)v;
            } else if (dt->target == PS_TARGET_ROWS) {
                dt->rows[S] = (float)v;
            }
        }
        if (rc == 0) S++;
    }
    ps_file_lines_close(&f);
    free(fields);
    if (rc == 0 && S == 0) rc = ps_diag_set(d, -EINVAL, path, "no data rows");
    dt->n_samples = S;
    return rc;
}

/* ---- public -------------------------------------------------------------------------------- */

int ps_data_load(const struct ps_spec *spec, const struct ps_model *model,
                 int64_t synthetic_samples, struct ps_data *out, struct ps_diag *d)
{
    memset(out, 0, sizeof(*out));
    out->in_numel = model->layers[0].in_numel;
    out->out_numel = model->out_numel;
    switch (spec->loss) {
    case PS_LOSS_SUM: out->target = PS_TARGET_NONE; break;
    case PS_LOSS_MSE: out->target = PS_TARGET_ROWS; break;
    case PS_LOSS_CROSS_ENTROPY:
        out->target = PS_TARGET_LABELS;
        out->classes = model->out_numel;
        break;
    }
    int rc;
    switch (spec->data_source) {
    case PS_DATA_SYNTHETIC:
        rc = gen_synthetic(out, spec, synthetic_samples > 0 ? synthetic_samples : spec->batch, d);
        break;
    case PS_DATA_NPY: rc = load_npy(out, spec, model, d); break;
    case PS_DATA_CSV: rc = load_csv(out, spec, d); break;
    default: rc = ps_diag_set(d, -EINVAL, spec->path, "data.source: unknown"); break;
    }
    if (rc) ps_data_finish(out);
    return rc;
}

void ps_data_rows(const struct ps_data *dt, int64_t first, int64_t count, float *x,
                  int64_t *labels, float *rows)
{
    for (int64_t b = 0; b < count; b++) {
        int64_t s = (int64_t)(((uint64_t)first + (uint64_t)b) % (uint64_t)dt->n_samples);
        float *xb = x ? x + b * dt->in_numel : NULL;
        float *rb = rows ? rows + b * dt->out_numel : NULL;
        if (labels && dt->labels) labels[b] = dt->labels[s];
        if (dt->synthetic) {
            draw_sample(dt, s, xb, rb);
            continue;
        }
        if (xb) memcpy(xb, dt->x + s * dt->in_numel, (size_t)dt->in_numel * sizeof(float));
        if (rb && dt->rows)
            memcpy(rb, dt->rows + s * dt->out_numel, (size_t)dt->out_numel * sizeof(float));
    }
}

void ps_data_batch(const struct ps_data *dt, int64_t step, int64_t batch, float *x,
                   int64_t *labels, float *rows)
{
    ps_data_rows(dt, (int64_t)((uint64_t)step * (uint64_t)batch), batch, x, labels, rows);
}

void ps_data_finish(struct ps_data *dt)
{
    if (!dt) return;
    free(dt->x);
    free(dt->labels);
    free(dt->rows);
    memset(dt, 0, sizeof(*dt));
}
