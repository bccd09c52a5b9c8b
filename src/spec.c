/* spec: the pipeline spec of src/SPEC.md, read with cJSON and validated into struct ps_spec.
 *
 * This file owns the front door: every byte a user writes passes through here, so every rejection
 * names the place ("FILE: json.path", or "FILE:LINE:COL" for malformed JSON) and says what was
 * expected and what was found. Validation runs in a fixed order so the reported (first) error is
 * deterministic:
 *   1. read the file (file.h), parse it (json_in.h: exactly one value, syntax errors by line:col,
 *      nesting, \u0000, duplicate keys);
 *   2. (in 1: json_in.h rejects duplicate keys, which cJSON silently keeps);
 *   3. top level: "pipescope" version first (a future format may differ everywhere), then unknown
 *      keys, then name, batch, model, pipeline, data, hardware, costs, train, each object checking
 *      its unknown keys before its fields, fields in the order src/SPEC.md lists them;
 *   4. cross-field rules (balance sum, chunks <= batch, devices per partition) as each becomes
 *      decidable, then the derived fields (first_layer, device_id, mb_count, mb_size).
 * Invariants after success are those listed in spec.h. Layer shapes are checked by model.c; this
 * file only computes n_classes with a silent walk (0 when the shapes do not chain).
 *
 * Micro-batches follow torch.chunk: size = ceil(N / chunks), m = ceil(N / size), the last one
 * holds the remainder. N=5, chunks=4 gives 2,2,1 (m=3): a warning says so.
 */
#include "src/spec.h"

#include "src/file.h"
#include "src/json_in.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_BATCH (INT64_C(1) << 20)
#define LIMIT_CHUNKS 65536
#define LIMIT_LAYERS 4096
#define LIMIT_PARTITIONS 4096
#define LIMIT_DIM (INT64_C(1) << 24)
#define LIMIT_NUMEL (INT64_C(1) << 31)
#define LIMIT_STEPS (INT64_C(1) << 20)
#define LIMIT_VSTAGES 4096
#define LIMIT_CUDA_INDEX 65535
#define LIMIT_SEED (INT64_C(1) << 53)
#define LIMIT_FILE_BYTES (16L << 20)

#define PATH_LEN 256

/* ---- names ---------------------------------------------------------------------------------- */

static const char *const op_names[] = {"linear",  "conv2d",    "batchnorm", "relu",
                                       "dropout", "maxpool2d", "flatten"};
static const char *const loss_names[] = {"sum", "mse", "cross_entropy"};
static const char *const sched_names[] = {
#define PS_SCHEDULE_ROW(e, name, ops) name,
#include "src/schedules.def"
#undef PS_SCHEDULE_ROW
};
static const char *const ckpt_names[] = {"always", "except_last", "never"};
static const char *const bn_names[] = {"plain", "deferred", "grad-only"};
static const char *const source_names[] = {"synthetic", "npy", "csv"};
static const char *const variant_names[] = {"torchgpipe", "fairscale"};
static const char *const optimizer_names[] = {"sgd"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *ps_op_name(enum ps_op op)
{
    return (unsigned)op < (unsigned)COUNT(op_names) ? op_names[op] : "?";
}
const char *ps_checkpoint_name(enum ps_checkpoint c)
{
    return (unsigned)c < (unsigned)COUNT(ckpt_names) ? ckpt_names[c] : "?";
}
const char *ps_bn_policy_name(enum ps_bn_policy p)
{
    return (unsigned)p < (unsigned)COUNT(bn_names) ? bn_names[p] : "?";
}
const char *ps_schedule_name(enum ps_schedule s)
{
    return (unsigned)s < (unsigned)COUNT(sched_names) ? sched_names[s] : "?";
}
const char *ps_loss_name(enum ps_loss l)
{
    return (unsigned)l < (unsigned)COUNT(loss_names) ? loss_names[l] : "?";
}

void ps_device_format(const struct ps_device *d, char *buf, int len)
{
    if (!buf || len <= 0) return;
    if (d->kind == PS_DEV_CPU)
        snprintf(buf, (size_t)len, "cpu");
    else
        snprintf(buf, (size_t)len, "cuda:%d", d->index);
}

/* ---- context and error helpers ------------------------------------------------------------- */

struct ctx {
    const char *file; /* as given, for messages */
    struct ps_diag *diag;
    struct ps_spec *spec;
};

static int verr(struct ctx *c, int code, const char *path, const char *fmt, va_list ap)
{
    char where[PS_DIAG_WHERE_MAX];
    if (path && path[0])
        snprintf(where, sizeof(where), "%s: %s", c->file, path);
    else
        snprintf(where, sizeof(where), "%s", c->file);
    return ps_diag_vset(c->diag, code, where, fmt, ap);
}

static int err(struct ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int err(struct ctx *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = verr(c, -EINVAL, path, fmt, ap);
    va_end(ap);
    return rc;
}

static int oom(struct ctx *c)
{
    return ps_diag_set(c->diag, -ENOMEM, c->file, "out of memory");
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void path_key(char *buf, size_t n, const char *parent, const char *key)
{
    ps_json_path_key(buf, n, parent, key);
}

static void path_index(char *buf, size_t n, const char *parent, int i)
{
    ps_json_path_index(buf, n, parent, i);
}

/* Shortest decimal that reads back as the same double. */
static void fmt_num(char *buf, size_t n, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Describes a JSON value for "found ...". */
static void describe(const cJSON *v, char *buf, size_t n)
{
    if (!v) {
        snprintf(buf, n, "nothing");
    } else if (cJSON_IsNull(v)) {
        snprintf(buf, n, "null");
    } else if (cJSON_IsTrue(v)) {
        snprintf(buf, n, "true");
    } else if (cJSON_IsFalse(v)) {
        snprintf(buf, n, "false");
    } else if (cJSON_IsNumber(v)) {
        fmt_num(buf, n, v->valuedouble);
    } else if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        size_t len = strlen(s);
        if (len > 40)
            snprintf(buf, n, "string \"%.37s...\"", s);
        else
            snprintf(buf, n, "string \"%s\"", s);
    } else if (cJSON_IsArray(v)) {
        snprintf(buf, n, "an array");
    } else if (cJSON_IsObject(v)) {
        snprintf(buf, n, "an object");
    } else {
        snprintf(buf, n, "an invalid value");
    }
}

static int expected(struct ctx *c, const char *path, const char *what, const cJSON *v)
{
    char found[96];
    describe(v, found, sizeof(found));
    return err(c, path, "expected %s, found %s", what, found);
}

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 99;
    int d[41][41];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

/* The closest of `names` to `s` when it is a plausible typo, else NULL. */
static const char *closest(const char *s, const char *const *names, int n)
{
    const char *best = NULL;
    int bestd = 3;
    for (int i = 0; i < n; i++) {
        if (strcasecmp(s, names[i]) == 0) return names[i];
        int d = edit_distance(s, names[i]);
        if (d < bestd) {
            bestd = d;
            best = names[i];
        }
    }
    return best;
}

static void join_names(char *buf, size_t n, const char *const *names, int count)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", names[i]);
}

/* ---- typed getters --------------------------------------------------------------------------- */

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static int missing(struct ctx *c, const char *path, const char *what)
{
    return err(c, path, "required field is missing (expected %s)", what);
}

static int as_int(struct ctx *c, const cJSON *v, const char *path, int64_t *out)
{
    if (!cJSON_IsNumber(v)) return expected(c, path, "an integer", v);
    double d = v->valuedouble;
    if (!isfinite(d) || floor(d) != d) return expected(c, path, "an integer", v);
    if (d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return expected(c, path, "an integer within int64 range", v);
    *out = (int64_t)d;
    return 0;
}

/* Reads an optional (def_ok) or required integer field into *out. Returns 1 when absent. */
static int get_int(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                   bool required, int64_t *out, char *path, size_t pathlen)
{
    path_key(path, pathlen, parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return required ? missing(c, path, "an integer") : 1;
    return as_int(c, v, path, out);
}

static int check_min(struct ctx *c, const char *path, int64_t v, int64_t min, const char *what)
{
    if (v >= min) return 0;
    if (min == 1)
        return err(c, path, "expected a positive %s, found %lld", what, (long long)v);
    return err(c, path, "expected an integer >= %lld, found %lld", (long long)min, (long long)v);
}

static int check_limit(struct ctx *c, const char *path, int64_t v, int64_t limit,
                       const char *limit_text)
{
    if (v <= limit) return 0;
    return err(c, path, "%lld exceeds the limit of %lld (%s)", (long long)v, (long long)limit,
               limit_text);
}

static int get_number(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                      bool required, double *out, char *path, size_t pathlen)
{
    path_key(path, pathlen, parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return required ? missing(c, path, "a number") : 1;
    if (!cJSON_IsNumber(v)) return expected(c, path, "a number", v);
    if (!isfinite(v->valuedouble)) return expected(c, path, "a finite number", v);
    *out = v->valuedouble;
    return 0;
}

/* Checks lo <(=) x <(=) hi; NAN bounds are open. */
static int check_range(struct ctx *c, const char *path, double x, double lo, bool lo_incl,
                       double hi, bool hi_incl)
{
    bool ok = true;
    if (!isnan(lo)) ok = ok && (lo_incl ? x >= lo : x > lo);
    if (!isnan(hi)) ok = ok && (hi_incl ? x <= hi : x < hi);
    if (ok) return 0;
    char xs[40], ls[40], hs[40];
    fmt_num(xs, sizeof(xs), x);
    fmt_num(ls, sizeof(ls), lo);
    fmt_num(hs, sizeof(hs), hi);
    if (isnan(hi)) return err(c, path, "expected a number %s %s, found %s", lo_incl ? ">=" : ">", ls, xs);
    if (isnan(lo)) return err(c, path, "expected a number %s %s, found %s", hi_incl ? "<=" : "<", hs, xs);
    return err(c, path, "expected a number in %c%s, %s%c, found %s", lo_incl ? '[' : '(', ls, hs,
               hi_incl ? ']' : ')', xs);
}

static int get_bool(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                    bool *out)
{
    char path[PATH_LEN];
    path_key(path, sizeof(path), parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return 1;
    if (!cJSON_IsBool(v)) return expected(c, path, "true or false", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_string(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                      bool required, const char **out, char *path, size_t pathlen)
{
    path_key(path, pathlen, parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return required ? missing(c, path, "a string") : 1;
    if (!cJSON_IsString(v)) return expected(c, path, "a string", v);
    if (v->valuestring[0] == '\0') return expected(c, path, "a non-empty string", v);
    *out = v->valuestring;
    return 0;
}

/* An enum given by name: `noun` names the kind in messages ("op", "schedule"). */
static int get_enum(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                    bool required, const char *noun, const char *const *names, int n, int *out)
{
    char path[PATH_LEN], list[256];
    path_key(path, sizeof(path), parent, key);
    const cJSON *v = get(obj, key);
    join_names(list, sizeof(list), names, n);
    if (!v) {
        if (!required) return 1;
        return err(c, path, "required field is missing (expected one of %s)", list);
    }
    if (!cJSON_IsString(v)) {
        char what[300];
        snprintf(what, sizeof(what), "a string (one of %s)", list);
        return expected(c, path, what, v);
    }
    for (int i = 0; i < n; i++)
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = i;
            return 0;
        }
    int rc = err(c, path, "unknown %s \"%s\" (expected one of %s)", noun, v->valuestring, list);
    const char *near = closest(v->valuestring, names, n);
    if (near) ps_diag_hint(c->diag, "did you mean \"%s\"?", near);
    return rc;
}

static int get_object(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                      bool required, const cJSON **out, char *path, size_t pathlen)
{
    path_key(path, pathlen, parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return required ? missing(c, path, "an object") : 1;
    if (!cJSON_IsObject(v)) return expected(c, path, "an object", v);
    *out = v;
    return 0;
}

static int get_array(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                     bool required, const char *what, const cJSON **out, char *path,
                     size_t pathlen)
{
    path_key(path, pathlen, parent, key);
    const cJSON *v = get(obj, key);
    if (!v) return required ? missing(c, path, what) : 1;
    if (!cJSON_IsArray(v)) return expected(c, path, what, v);
    *out = v;
    return 0;
}

/* Rejects keys not in `valid` (NULL-terminated), naming the key, with a hint listing valid keys. */
static int check_keys(struct ctx *c, const cJSON *obj, const char *path, const char *const *valid,
                      const char *context)
{
    int n = 0;
    while (valid[n]) n++;
    for (const cJSON *k = obj->child; k; k = k->next) {
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = strcmp(k->string, valid[i]) == 0;
        if (found) continue;
        char kp[PATH_LEN], list[512];
        path_key(kp, sizeof(kp), path, k->string);
        join_names(list, sizeof(list), valid, n);
        int rc = err(c, kp, "unknown key%s", context ? context : "");
        const char *near = closest(k->string, valid, n);
        if (near)
            ps_diag_hint(c->diag, "did you mean \"%s\"? valid keys: %s", near, list);
        else
            ps_diag_hint(c->diag, "valid keys: %s", list);
        return rc;
    }
    return 0;
}

/* ---- paths ----------------------------------------------------------------------------------- */

static char *resolve(const char *dir, const char *p)
{
    if (p[0] == '/' || !dir || !dir[0] || strcmp(dir, ".") == 0) return xstrdup(p);
    size_t ld = strlen(dir), lp = strlen(p);
    int slash = dir[ld - 1] != '/';
    char *r = malloc(ld + (size_t)slash + lp + 1);
    if (!r) return NULL;
    memcpy(r, dir, ld);
    if (slash) r[ld] = '/';
    memcpy(r + ld + (size_t)slash, p, lp + 1);
    return r;
}

static int get_path(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                    bool required, char **out)
{
    char path[PATH_LEN];
    const char *s = NULL;
    int rc = get_string(c, obj, parent, key, required, &s, path, sizeof(path));
    if (rc) return rc;
    *out = resolve(c->spec->dir, s);
    return *out ? 0 : oom(c);
}

/* ---- warnings -------------------------------------------------------------------------------- */

static int add_warning(struct ps_spec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_warning(struct ps_spec *s, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    char **w = realloc(s->warnings, sizeof(*w) * (size_t)(s->n_warnings + 1));
    if (!w) return -ENOMEM;
    s->warnings = w;
    w[s->n_warnings] = xstrdup(buf);
    if (!w[s->n_warnings]) return -ENOMEM;
    s->n_warnings++;
    return 0;
}

/* ---- model ----------------------------------------------------------------------------------- */

static const char *const keys_top[] = {"pipescope", "name",     "batch", "model", "pipeline",
                                       "data",      "hardware", "costs", "train", NULL};
static const char *const keys_model[] = {"input", "layers", "loss", "weights", NULL};
static const char *const keys_linear[] = {"op", "out", "bias", NULL};
static const char *const keys_conv[] = {"op", "out", "kernel", "stride", "padding", "bias", NULL};
static const char *const keys_bn[] = {"op", "momentum", "eps", "affine", NULL};
static const char *const keys_plain[] = {"op", NULL};
static const char *const keys_dropout[] = {"op", "p", NULL};
static const char *const keys_pool[] = {"op", "kernel", "stride", "padding", NULL};
static const char *const keys_pipeline[] = {"schedule",  "balance", "devices",
                                            "chunks",    "checkpoint", "batchnorm",
                                            "phony",     "variant", "virtual_stages", NULL};
static const char *const keys_synthetic[] = {"source", "seed", NULL};
static const char *const keys_npy[] = {"source", "seed", "inputs", "targets", NULL};
static const char *const keys_csv[] = {"source", "seed", "path", "target_column", NULL};
static const char *const keys_hw[] = {"device", "link", NULL};
static const char *const keys_hw_dev[] = {"flops", "mem_bandwidth", "launch_overhead_us", NULL};
static const char *const keys_hw_link[] = {"bandwidth", "latency_us", NULL};
static const char *const keys_train[] = {"steps", "optimizer", "lr", NULL};

/* A size field: integer, >= min, <= 2^24. Absent -> keeps *out (a default) unless required. */
static int get_dim(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                   bool required, int64_t min, int64_t *out)
{
    char path[PATH_LEN];
    int64_t v;
    int rc = get_int(c, obj, parent, key, required, &v, path, sizeof(path));
    if (rc == 1) return 0;
    if (rc) return rc;
    if ((rc = check_min(c, path, v, min, min == 1 ? "size" : "integer"))) return rc;
    if ((rc = check_limit(c, path, v, LIMIT_DIM, "2^24"))) return rc;
    *out = v;
    return 0;
}

static int parse_layer(struct ctx *c, const cJSON *lj, const char *lp, struct ps_layer *l)
{
    int rc, op = 0;
    if (!cJSON_IsObject(lj)) return expected(c, lp, "a layer object like {\"op\": \"relu\"}", lj);
    if ((rc = get_enum(c, lj, lp, "op", true, "op", op_names, COUNT(op_names), &op)) != 0)
        return rc;
    static const char *const *const keys_of[PS_OP__COUNT] = {
        [PS_OP_LINEAR] = keys_linear, [PS_OP_CONV2D] = keys_conv,   [PS_OP_BATCHNORM] = keys_bn,
        [PS_OP_RELU] = keys_plain,    [PS_OP_DROPOUT] = keys_dropout, [PS_OP_MAXPOOL2D] = keys_pool,
        [PS_OP_FLATTEN] = keys_plain,
    };
    char ctxt[64];
    snprintf(ctxt, sizeof(ctxt), " for op \"%s\"", op_names[op]);
    if ((rc = check_keys(c, lj, lp, keys_of[op], ctxt))) return rc;

    memset(l, 0, sizeof(*l));
    l->op = (enum ps_op)op;
    l->bias = true;
    l->affine = true;
    l->momentum = 0.1;
    l->eps = 1e-5;
    l->stride = 1;
    char path[PATH_LEN];
    switch (l->op) {
    case PS_OP_LINEAR:
        if ((rc = get_dim(c, lj, lp, "out", true, 1, &l->out))) return rc;
        if (get_bool(c, lj, lp, "bias", &l->bias) < 0) return c->diag->code;
        break;
    case PS_OP_CONV2D:
        if ((rc = get_dim(c, lj, lp, "out", true, 1, &l->out))) return rc;
        if ((rc = get_dim(c, lj, lp, "kernel", true, 1, &l->kernel))) return rc;
        if ((rc = get_dim(c, lj, lp, "stride", false, 1, &l->stride))) return rc;
        if ((rc = get_dim(c, lj, lp, "padding", false, 0, &l->padding))) return rc;
        if (get_bool(c, lj, lp, "bias", &l->bias) < 0) return c->diag->code;
        break;
    case PS_OP_MAXPOOL2D:
        if ((rc = get_dim(c, lj, lp, "kernel", true, 1, &l->kernel))) return rc;
        l->stride = l->kernel;
        if ((rc = get_dim(c, lj, lp, "stride", false, 1, &l->stride))) return rc;
        if ((rc = get_dim(c, lj, lp, "padding", false, 0, &l->padding))) return rc;
        if (l->padding * 2 > l->kernel) {
            path_key(path, sizeof(path), lp, "padding");
            rc = err(c, path,
                     "padding %lld is more than half the kernel %lld (PyTorch's max_pool2d rejects it)",
                     (long long)l->padding, (long long)l->kernel);
            ps_diag_hint(c->diag, "use a padding of at most %lld", (long long)(l->kernel / 2));
            return rc;
        }
        break;
    case PS_OP_BATCHNORM: {
        const cJSON *m = get(lj, "momentum");
        path_key(path, sizeof(path), lp, "momentum");
        if (m && cJSON_IsNull(m)) {
            l->momentum_null = true;
            l->momentum = 0.0;
        } else if (m) {
            if ((rc = get_number(c, lj, lp, "momentum", false, &l->momentum, path, sizeof(path))))
                return rc;
            if ((rc = check_range(c, path, l->momentum, 0, true, 1, true))) {
                ps_diag_hint(c->diag, "null means a cumulative moving average");
                return rc;
            }
        }
        rc = get_number(c, lj, lp, "eps", false, &l->eps, path, sizeof(path));
        if (rc < 0) return rc;
        if (rc == 0 && (rc = check_range(c, path, l->eps, 0, false, NAN, false))) return rc;
        if (get_bool(c, lj, lp, "affine", &l->affine) < 0) return c->diag->code;
        break;
    }
    case PS_OP_DROPOUT:
        l->p = 0.5;
        rc = get_number(c, lj, lp, "p", false, &l->p, path, sizeof(path));
        if (rc < 0) return rc;
        if (rc == 0 && (rc = check_range(c, path, l->p, 0, true, 1, false))) return rc;
        break;
    case PS_OP_RELU:
    case PS_OP_FLATTEN:
    case PS_OP__COUNT:
        break;
    }
    return 0;
}

/* A silent walk over the shapes (model.c owns the rules and their errors). Returns the output
 * channels/features of the model, 0 when the shapes do not chain. *bn_one is set to the first
 * batchnorm layer that sees a single value per channel in the smallest micro-batch (PyTorch
 * raises in training), or -1. */
static int64_t walk_shapes(const struct ps_spec *s, int *bn_one)
{
    int nd = s->n_input_dims;
    int64_t d[3] = {s->input[0], s->input[1], s->input[2]};
    int64_t smallest = s->mb_size && s->mb_count > 0 ? s->mb_size[s->mb_count - 1] : 2;
    *bn_one = -1;
    for (int i = 0; i < s->n_layers; i++) {
        const struct ps_layer *l = &s->layers[i];
        switch (l->op) {
        case PS_OP_LINEAR:
            if (nd != 1) return 0;
            d[0] = l->out;
            break;
        case PS_OP_CONV2D:
        case PS_OP_MAXPOOL2D:
            if (nd != 3) return 0;
            for (int k = 1; k < 3; k++) {
                int64_t o = (d[k] + 2 * l->padding - l->kernel);
                if (o < 0) return 0;
                d[k] = o / l->stride + 1;
            }
            if (l->op == PS_OP_CONV2D) d[0] = l->out;
            break;
        case PS_OP_FLATTEN:
            if (nd == 3) d[0] = d[0] * d[1] * d[2];
            nd = 1;
            break;
        case PS_OP_BATCHNORM:
            if (*bn_one < 0 && smallest * (nd == 3 ? d[1] * d[2] : 1) == 1) *bn_one = i;
            break;
        default:
            break;
        }
    }
    return d[0];
}

static int parse_model(struct ctx *c, const cJSON *mj)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN], ep[PATH_LEN];
    int rc;
    if ((rc = check_keys(c, mj, "model", keys_model, NULL))) return rc;

    const cJSON *in = NULL;
    if ((rc = get_array(c, mj, "model", "input", true, "an array [features] or [C,H,W]", &in,
                        path, sizeof(path))))
        return rc;
    int nd = cJSON_GetArraySize(in);
    if (nd != 1 && nd != 3)
        return err(c, path, "expected [features] or [C,H,W], found an array of %d element%s", nd,
                   nd == 1 ? "" : "s");
    s->n_input_dims = nd;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        path_index(ep, sizeof(ep), path, i);
        int64_t v;
        if ((rc = as_int(c, cJSON_GetArrayItem(in, i), ep, &v))) return rc;
        if ((rc = check_min(c, ep, v, 1, "size"))) return rc;
        if ((rc = check_limit(c, ep, v, LIMIT_DIM, "2^24"))) return rc;
        s->input[i] = v;
        numel *= v;
        if (numel > LIMIT_NUMEL)
            return err(c, path, "%lld elements per sample exceed the limit of %lld (2^31)",
                       (long long)numel, (long long)LIMIT_NUMEL);
    }

    const cJSON *layers = NULL;
    if ((rc = get_array(c, mj, "model", "layers", true, "an array of layers", &layers, path,
                        sizeof(path))))
        return rc;
    int n = cJSON_GetArraySize(layers);
    if (n == 0) return err(c, path, "expected at least one layer, found an empty array");
    if (n > LIMIT_LAYERS)
        return err(c, path, "%d layers exceed the limit of %d", n, LIMIT_LAYERS);
    s->layers = calloc((size_t)n, sizeof(*s->layers));
    if (!s->layers) return oom(c);
    s->n_layers = n;
    int i = 0;
    for (const cJSON *lj = layers->child; lj; lj = lj->next, i++) {
        path_index(ep, sizeof(ep), path, i);
        if ((rc = parse_layer(c, lj, ep, &s->layers[i]))) return rc;
    }

    int loss = 0;
    if ((rc = get_enum(c, mj, "model", "loss", true, "loss", loss_names, COUNT(loss_names),
                       &loss)))
        return rc;
    s->loss = (enum ps_loss)loss;
    if ((rc = get_path(c, mj, "model", "weights", false, &s->weights)) < 0) return rc;
    return 0;
}

/* ---- pipeline -------------------------------------------------------------------------------- */

static int parse_device(struct ctx *c, const cJSON *v, const char *path, struct ps_device *d)
{
    if (!cJSON_IsString(v)) return expected(c, path, "a device string \"cpu\" or \"cuda:N\"", v);
    const char *s = v->valuestring;
    if (strcmp(s, "cpu") == 0) {
        d->kind = PS_DEV_CPU;
        d->index = -1;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) == 0) {
        const char *n = s + 5;
        size_t len = strlen(n);
        bool digits = len > 0 && len <= 6 && strspn(n, "0123456789") == len;
        if (digits && (n[0] != '0' || len == 1)) {
            long idx = strtol(n, NULL, 10);
            if (idx > LIMIT_CUDA_INDEX)
                return err(c, path, "device index %ld exceeds the limit of %d", idx,
                           LIMIT_CUDA_INDEX);
            d->kind = PS_DEV_CUDA;
            d->index = (int)idx;
            return 0;
        }
    }
    int rc = err(c, path, "unknown device \"%s\" (expected \"cpu\" or \"cuda:N\")", s);
    if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0)
        ps_diag_hint(c->diag, "name the device index, e.g. \"cuda:0\"");
    return rc;
}

int64_t ps_microbatch_len(int64_t batch, int chunks)
{
    return (batch + chunks - 1) / chunks;
}

int ps_microbatch_count(int64_t batch, int chunks)
{
    int64_t size = ps_microbatch_len(batch, chunks);
    return (int)((batch + size - 1) / size);
}

static void derive_microbatches(struct ps_spec *s)
{
    int64_t size = ps_microbatch_len(s->batch, s->chunks);
    s->mb_count = ps_microbatch_count(s->batch, s->chunks);
    for (int i = 0; i < s->mb_count; i++)
        s->mb_size[i] = i + 1 < s->mb_count ? size : s->batch - size * (s->mb_count - 1);
}

/* All warnings derive from the spec's fields: recomputed from scratch after every change. */
static int make_warnings(struct ps_spec *s)
{
    for (int i = 0; i < s->n_warnings; i++) free(s->warnings[i]);
    free(s->warnings);
    s->warnings = NULL;
    s->n_warnings = 0;

    int bn_one;
    int64_t classes = walk_shapes(s, &bn_one);
    s->n_classes = s->loss == PS_LOSS_CROSS_ENTROPY ? classes : 0;
    if (s->mb_count != s->chunks &&
        add_warning(s,
                    "%s: pipeline.chunks: %d chunks of a batch of %lld give %d micro-batches "
                    "(torch.chunk semantics); the pipeline runs with m=%d",
                    s->path, s->chunks, (long long)s->batch, s->mb_count, s->mb_count))
        return -ENOMEM;
    if (bn_one >= 0 &&
        add_warning(s,
                    "%s: model.layers[%d]: micro-batch %d holds %lld sample%s, so batchnorm sees 1 "
                    "value per channel (PyTorch raises \"Expected more than 1 value per channel "
                    "when training\")",
                    s->path, bn_one, s->mb_count - 1, (long long)s->mb_size[s->mb_count - 1],
                    s->mb_size[s->mb_count - 1] == 1 ? "" : "s"))
        return -ENOMEM;
    if (s->virtual_stages != 1 && s->schedule != PS_SCHED_INTERLEAVED &&
        s->schedule != PS_SCHED_LOOPED_BFS && s->schedule != PS_SCHED_INTERLEAVED_ZB &&
        add_warning(s,
                    "%s: pipeline.virtual_stages: %d is ignored by schedule \"%s\" (only "
                    "interleaved-1f1b, looped-bfs and interleaved-zb use virtual stages; zb-v and "
                    "dualpipe-v always place two)",
                    s->path, s->virtual_stages, sched_names[s->schedule]))
        return -ENOMEM;
    return 0;
}

static int check_chunks(struct ctx *c, const char *path, int64_t v, int64_t batch)
{
    int rc;
    if ((rc = check_min(c, path, v, 1, "number of chunks"))) return rc;
    if ((rc = check_limit(c, path, v, LIMIT_CHUNKS, "2^16"))) return rc;
    if (v > batch) {
        rc = err(c, path, "%lld chunks exceed the batch of %lld samples", (long long)v,
                 (long long)batch);
        ps_diag_hint(c->diag, "every micro-batch needs at least one sample: use chunks <= %lld",
                     (long long)batch);
        return rc;
    }
    return 0;
}

static int parse_pipeline(struct ctx *c, const cJSON *pj)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN], ep[PATH_LEN];
    int rc, e;
    if ((rc = check_keys(c, pj, "pipeline", keys_pipeline, NULL))) return rc;

    e = PS_SCHED_GPIPE;
    if ((rc = get_enum(c, pj, "pipeline", "schedule", false, "schedule", sched_names,
                       COUNT(sched_names), &e)) < 0)
        return rc;
    s->schedule = (enum ps_schedule)e;

    const cJSON *bal = NULL;
    if ((rc = get_array(c, pj, "pipeline", "balance", true, "an array of layer counts", &bal,
                        path, sizeof(path))))
        return rc;
    int n = cJSON_GetArraySize(bal);
    if (n == 0) return err(c, path, "expected at least one partition, found an empty array");
    if (n > LIMIT_PARTITIONS)
        return err(c, path, "%d partitions exceed the limit of %d", n, LIMIT_PARTITIONS);
    s->balance = calloc((size_t)n, sizeof(int));
    s->first_layer = calloc((size_t)n, sizeof(int));
    s->devices = calloc((size_t)n, sizeof(*s->devices));
    s->device_id = calloc((size_t)n, sizeof(int));
    if (!s->balance || !s->first_layer || !s->devices || !s->device_id) return oom(c);
    s->n_partitions = n;
    int64_t sum = 0;
    for (int j = 0; j < n; j++) {
        int64_t v;
        path_index(ep, sizeof(ep), path, j);
        if ((rc = as_int(c, cJSON_GetArrayItem(bal, j), ep, &v))) return rc;
        if (v < 1) {
            rc = err(c, ep, "expected a positive number of layers, found %lld", (long long)v);
            ps_diag_hint(c->diag, "every partition needs at least one layer");
            return rc;
        }
        if (v > LIMIT_LAYERS)
            return err(c, ep, "%lld layers exceed the limit of %d", (long long)v, LIMIT_LAYERS);
        s->first_layer[j] = (int)sum;
        s->balance[j] = (int)v;
        sum += v;
    }
    if (sum != s->n_layers)
        return err(c, path, "sums to %lld layer%s but model.layers has %d", (long long)sum,
                   sum == 1 ? "" : "s", s->n_layers);

    const cJSON *dev = NULL;
    rc = get_array(c, pj, "pipeline", "devices", false, "an array of device strings", &dev, path,
                   sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        int nd = cJSON_GetArraySize(dev);
        if (nd != n)
            return err(c, path, "has %d device%s but pipeline.balance has %d partition%s", nd,
                       nd == 1 ? "" : "s", n, n == 1 ? "" : "s");
        for (int j = 0; j < n; j++) {
            path_index(ep, sizeof(ep), path, j);
            if ((rc = parse_device(c, cJSON_GetArrayItem(dev, j), ep, &s->devices[j]))) return rc;
        }
    } else {
        for (int j = 0; j < n; j++) s->devices[j] = (struct ps_device){PS_DEV_CUDA, j};
    }
    s->n_devices = 0;
    for (int j = 0; j < n; j++) {
        int id = -1;
        for (int k = 0; k < j && id < 0; k++)
            if (s->devices[k].kind == s->devices[j].kind &&
                s->devices[k].index == s->devices[j].index)
                id = s->device_id[k];
        s->device_id[j] = id >= 0 ? id : s->n_devices++;
    }

    int64_t chunks;
    if ((rc = get_int(c, pj, "pipeline", "chunks", true, &chunks, path, sizeof(path)))) return rc;
    if ((rc = check_chunks(c, path, chunks, s->batch))) return rc;
    s->chunks = (int)chunks;

    e = PS_CKPT_EXCEPT_LAST;
    if ((rc = get_enum(c, pj, "pipeline", "checkpoint", false, "checkpoint mode", ckpt_names,
                       COUNT(ckpt_names), &e)) < 0)
        return rc;
    s->checkpoint = (enum ps_checkpoint)e;
    e = PS_BN_PLAIN;
    if ((rc = get_enum(c, pj, "pipeline", "batchnorm", false, "batchnorm policy", bn_names,
                       COUNT(bn_names), &e)) < 0)
        return rc;
    s->batchnorm = (enum ps_bn_policy)e;
    if (get_bool(c, pj, "pipeline", "phony", &s->phony) < 0) return c->diag->code;
    e = 0;
    if ((rc = get_enum(c, pj, "pipeline", "variant", false, "variant", variant_names,
                       COUNT(variant_names), &e)) < 0)
        return rc;
    s->fairscale = e == 1;
    int64_t v = 1;
    rc = get_int(c, pj, "pipeline", "virtual_stages", false, &v, path, sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = check_min(c, path, v, 1, "number of virtual stages"))) return rc;
        if ((rc = check_limit(c, path, v, LIMIT_VSTAGES, "4096"))) return rc;
    }
    s->virtual_stages = (int)v;
    return 0;
}

/* ---- data, hardware, train ------------------------------------------------------------------ */

static int parse_data(struct ctx *c, const cJSON *dj)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN];
    int rc, src = PS_DATA_SYNTHETIC;
    if ((rc = get_enum(c, dj, "data", "source", false, "data source", source_names,
                       COUNT(source_names), &src)) < 0)
        return rc;
    s->data_source = (enum ps_data_source)src;
    const char *const *keys =
        src == PS_DATA_NPY ? keys_npy : src == PS_DATA_CSV ? keys_csv : keys_synthetic;
    char ctxt[64];
    snprintf(ctxt, sizeof(ctxt), " for source \"%s\"", source_names[src]);
    if ((rc = check_keys(c, dj, "data", keys, ctxt))) return rc;
    int64_t seed;
    rc = get_int(c, dj, "data", "seed", false, &seed, path, sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = check_min(c, path, seed, 0, "seed"))) return rc;
        if ((rc = check_limit(c, path, seed, LIMIT_SEED, "2^53"))) return rc;
        s->seed = (uint64_t)seed;
    }
    if (src == PS_DATA_NPY) {
        if ((rc = get_path(c, dj, "data", "inputs", true, &s->data_inputs))) return rc;
        if ((rc = get_path(c, dj, "data", "targets", true, &s->data_targets))) return rc;
    } else if (src == PS_DATA_CSV) {
        if ((rc = get_path(c, dj, "data", "path", true, &s->data_csv))) return rc;
        int64_t col;
        rc = get_int(c, dj, "data", "target_column", false, &col, path, sizeof(path));
        if (rc < 0) return rc;
        if (rc == 0) {
            if (col < -65536 || col > 65535)
                return err(c, path, "expected a column index in [-65536, 65535], found %lld",
                           (long long)col);
            s->target_column = (int)col;
        }
    }
    return 0;
}

static int get_positive(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                        bool zero_ok, double *out)
{
    char path[PATH_LEN];
    int rc = get_number(c, obj, parent, key, false, out, path, sizeof(path));
    if (rc) return rc < 0 ? rc : 0;
    return check_range(c, path, *out, 0, zero_ok, NAN, false);
}

/* get_positive, then within [lo, hi]: rates of at least lo (so a time is not a division by a
 * denormal) and at most hi (so sums over millions of tasks stay finite), issue [data-safety] 9. */
static int get_sane(struct ctx *c, const cJSON *obj, const char *parent, const char *key,
                    bool zero_ok, double lo, double hi, double *out)
{
    double v = *out;
    int rc = get_positive(c, obj, parent, key, zero_ok, &v);
    if (rc || v == *out) return rc;
    char path[PATH_LEN];
    path_key(path, sizeof(path), parent, key);
    if ((rc = check_range(c, path, v, zero_ok && v == 0 ? 0 : lo, true, hi, true))) return rc;
    *out = v;
    return 0;
}

static int parse_hardware(struct ctx *c, const cJSON *hj)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN];
    const cJSON *o = NULL;
    int rc;
    if ((rc = check_keys(c, hj, "hardware", keys_hw, NULL))) return rc;
    rc = get_object(c, hj, "hardware", "device", false, &o, path, sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = check_keys(c, o, path, keys_hw_dev, NULL))) return rc;
        if ((rc = get_sane(c, o, path, "flops", false, 1e3, 1e18, &s->dev_flops))) return rc;
        if ((rc = get_sane(c, o, path, "mem_bandwidth", false, 1e3, 1e16, &s->dev_mem_bw)))
            return rc;
        if ((rc = get_sane(c, o, path, "launch_overhead_us", true, 0, 1e9, &s->dev_launch_us)))
            return rc;
    }
    rc = get_object(c, hj, "hardware", "link", false, &o, path, sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = check_keys(c, o, path, keys_hw_link, NULL))) return rc;
        if ((rc = get_sane(c, o, path, "bandwidth", false, 1e3, 1e16, &s->link_bw))) return rc;
        if ((rc = get_sane(c, o, path, "latency_us", true, 0, 1e9, &s->link_latency_us)))
            return rc;
    }
    return 0;
}

static int parse_train(struct ctx *c, const cJSON *tj)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN];
    int rc, opt = 0;
    if ((rc = check_keys(c, tj, "train", keys_train, NULL))) return rc;
    int64_t steps;
    rc = get_int(c, tj, "train", "steps", false, &steps, path, sizeof(path));
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = check_min(c, path, steps, 1, "number of steps"))) return rc;
        if ((rc = check_limit(c, path, steps, LIMIT_STEPS, "2^20"))) return rc;
        s->steps = (int)steps;
    }
    if ((rc = get_enum(c, tj, "train", "optimizer", false, "optimizer", optimizer_names,
                       COUNT(optimizer_names), &opt)) < 0)
        return rc;
    return get_positive(c, tj, "train", "lr", true, &s->lr);
}

/* ---- top level -------------------------------------------------------------------------------- */

static char *file_stem(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strrchr(base, '.');
    size_t len = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    char *r = malloc(len + 1);
    if (!r) return NULL;
    memcpy(r, base, len);
    r[len] = '\0';
    return r;
}

/* Valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF) without C0/C1 controls or DEL. */
static int check_name(struct ctx *c, const char *path, const char *t)
{
    const unsigned char *p = (const unsigned char *)t;
    for (size_t i = 0; p[i];) {
        unsigned ch = p[i], cp, n;
        if (ch < 0x80) cp = ch, n = 1;
        else if (ch >= 0xC2 && ch <= 0xDF) cp = ch & 0x1F, n = 2;
        else if (ch >= 0xE0 && ch <= 0xEF) cp = ch & 0x0F, n = 3;
        else if (ch >= 0xF0 && ch <= 0xF4) cp = ch & 0x07, n = 4;
        else return err(c, path, "byte %zu is not UTF-8 (0x%02x)", i, ch);
        for (unsigned k = 1; k < n; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return err(c, path, "byte %zu is not UTF-8 (0x%02x)", i, ch);
            cp = cp << 6 | (p[i + k] & 0x3F);
        }
        if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return err(c, path, "byte %zu is not UTF-8 (0x%02x)", i, ch);
        if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0))
            return err(c, path, "a control character (U+%04X) at byte %zu; names are printed on "
                                "terminals and in reports", cp, i);
        i += n;
    }
    return 0;
}

static int parse_root(struct ctx *c, const cJSON *root)
{
    struct ps_spec *s = c->spec;
    char path[PATH_LEN];
    const cJSON *o = NULL;
    int rc;
    if (!cJSON_IsObject(root)) {
        char found[96];
        describe(root, found, sizeof(found));
        return err(c, NULL, "expected a JSON object at the top level, found %s", found);
    }

    int64_t version;
    if ((rc = get_int(c, root, "", "pipescope", true, &version, path, sizeof(path)))) {
        if (!get(root, "pipescope")) ps_diag_hint(c->diag, "start the spec with \"pipescope\": 1");
        return rc;
    }
    if (version != 1)
        return err(c, path, "unsupported format version %lld (this build reads version 1)",
                   (long long)version);
    s->version = 1;
    if ((rc = check_keys(c, root, "", keys_top, NULL))) return rc;

    const char *name = NULL;
    rc = get_string(c, root, "", "name", false, &name, path, sizeof(path));
    if (rc < 0) return rc;
    /* the name goes into report.json, HTML, SVG and the terminal: valid UTF-8 (a JSON reader
       rejects anything else) and no control characters (escape sequences would reach the
       terminal), issue [data-safety] 9 */
    if (rc == 0 && (rc = check_name(c, path, name))) return rc;
    if (name) {
        s->name = xstrdup(name);
    } else {
        /* the file's stem: any name the file system allows, so escaped rather than refused */
        char *stem = file_stem(s->path);
        size_t len = stem ? 4 * strlen(stem) + 1 : 0;
        s->name = stem ? malloc(len) : NULL;
        if (s->name) ps_diag_escape(stem, s->name, len);
        free(stem);
    }
    if (!s->name) return oom(c);

    int64_t batch;
    if ((rc = get_int(c, root, "", "batch", true, &batch, path, sizeof(path)))) return rc;
    if ((rc = check_min(c, path, batch, 1, "batch size"))) return rc;
    if ((rc = check_limit(c, path, batch, LIMIT_BATCH, "2^20"))) return rc;
    s->batch = batch;

    if ((rc = get_object(c, root, "", "model", true, &o, path, sizeof(path)))) return rc;
    if ((rc = parse_model(c, o))) return rc;
    if ((rc = get_object(c, root, "", "pipeline", true, &o, path, sizeof(path)))) return rc;
    if ((rc = parse_pipeline(c, o))) return rc;
    rc = get_object(c, root, "", "data", false, &o, path, sizeof(path));
    if (rc < 0 || (rc == 0 && (rc = parse_data(c, o)))) return rc;
    rc = get_object(c, root, "", "hardware", false, &o, path, sizeof(path));
    if (rc < 0 || (rc == 0 && (rc = parse_hardware(c, o)))) return rc;
    if ((rc = get_path(c, root, "", "costs", false, &s->costs)) < 0) return rc;
    rc = get_object(c, root, "", "train", false, &o, path, sizeof(path));
    if (rc < 0 || (rc == 0 && (rc = parse_train(c, o)))) return rc;

    /* derived */
    s->mb_size = calloc((size_t)s->chunks, sizeof(int64_t));
    if (!s->mb_size) return oom(c);
    derive_microbatches(s);
    if (make_warnings(s)) return oom(c);
    return 0;
}

/* Line and column (1-based; columns count UTF-8 code points) of byte `pos` in `text`. */
static int parse_text(struct ctx *c, const char *json, size_t len)
{
    static const struct ps_json_doc doc = {"a spec", "{\"pipescope\": 1, ...}"};
    cJSON *root;
    int rc = ps_json_parse_doc(json, len, c->file, &doc, &root, c->diag);
    if (rc) return rc;
    rc = parse_root(c, root);
    cJSON_Delete(root);
    return rc;
}

static struct ps_spec *spec_new(const char *path, const char *dir)
{
    struct ps_spec *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->path = xstrdup(path);
    s->dir = xstrdup(dir);
    s->schedule = PS_SCHED_GPIPE;
    s->checkpoint = PS_CKPT_EXCEPT_LAST;
    s->batchnorm = PS_BN_PLAIN;
    s->phony = true;
    s->virtual_stages = 1;
    s->data_source = PS_DATA_SYNTHETIC;
    s->target_column = -1;
    s->dev_flops = 6.7e13;
    s->dev_mem_bw = 4.8e12;
    s->dev_launch_us = 4;
    s->link_bw = 4.5e11;
    s->link_latency_us = 2;
    s->steps = 1;
    s->lr = 0.01;
    if (!s->path || !s->dir) {
        ps_spec_destroy(s);
        return NULL;
    }
    return s;
}

static int parse_into(const char *json, size_t len, const char *name, const char *dir,
                      struct ps_spec **out, struct ps_diag *diag)
{
    *out = NULL;
    struct ps_spec *s = spec_new(name, dir);
    if (!s) return ps_diag_set(diag, -ENOMEM, name, "out of memory");
    struct ctx c = {name, diag, s};
    int rc = parse_text(&c, json, len);
    if (rc) {
        ps_spec_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int ps_spec_parse(const char *json, const char *name, const char *dir, struct ps_spec **out,
                  struct ps_diag *diag)
{
    if (!name) name = "<string>";
    if (!dir) dir = ".";
    return parse_into(json, strlen(json), name, dir, out, diag);
}

int ps_spec_load(const char *path, struct ps_spec **out, struct ps_diag *diag)
{
    *out = NULL;
    /* a spec is small: the 16 MiB cap, not the memory limit, is what bounds it */
    struct ps_file_opts fo = {.noun = "the spec", .factor = 1, .max_bytes = LIMIT_FILE_BYTES};
    char *buf;
    size_t len;
    int rc = ps_file_read(path, &fo, &buf, &len, diag);
    if (rc) return rc;

    char *dir = xstrdup(path);
    if (!dir) {
        free(buf);
        return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    rc = parse_into(buf, len, path, dir, out, diag);
    free(dir);
    free(buf);
    return rc;
}

void ps_spec_destroy(struct ps_spec *s)
{
    if (!s) return;
    free(s->path);
    free(s->dir);
    free(s->name);
    free(s->layers);
    free(s->weights);
    free(s->balance);
    free(s->first_layer);
    free(s->devices);
    free(s->device_id);
    free(s->mb_size);
    free(s->data_inputs);
    free(s->data_targets);
    free(s->data_csv);
    free(s->costs);
    for (int i = 0; i < s->n_warnings; i++) free(s->warnings[i]);
    free(s->warnings);
    free(s);
}

int ps_spec_check_chunks(const struct ps_spec *s, int chunks, struct ps_diag *diag)
{
    struct ctx c = {s->path, diag, NULL};
    return check_chunks(&c, "pipeline.chunks", chunks, s->batch);
}
