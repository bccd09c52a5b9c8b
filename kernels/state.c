/* state: parameters and buffers of a model, in PyTorch's state_dict naming (see exec.h).
 *
 * The tensors of layer l of an nn.Sequential, as files of a weights folder:
 *   linear      l.weight [out, in]            l.bias [out]            (bias when "bias": true)
 *   conv2d      l.weight [out, cin, k, k]     l.bias [out]
 *   batchnorm   l.weight [C]  l.bias [C]      (affine)  l.running_mean [C]  l.running_var [C]
 *               l.num_batches_tracked []      (int64 scalar; shape [1] accepted on load)
 * Invariants: every tensor above exists after ps_state_init; num_batches_tracked is >= 0 on
 * load and the kernels saturate it at INT64_MAX (never wrap), so a saved state always loads; parameters and running statistics
 * are float32 and finite; loading rejects a file whose dtype is not a float (parameters) or not
 * an integer (num_batches_tracked), whose shape differs, or that is missing while a folder is
 * given. Saving writes the files into a folder the caller made; the CLI gives it the temporary
 * twin of --save-state DIR (viz/out.c), swapped in only when the whole command succeeded, so a
 * failed save never leaves a half-written state folder at DIR.
 */
#include "kernels/exec.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/npy.h"
#include "src/rng.h"

/* uniform in [0, 1) keyed by (seed, stream, index): splitmix64 finaliser */
#define mix64 ps_rng_splitmix64

static double uni(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t z = mix64(seed ^ mix64(stream * UINT64_C(0xd1b54a32d192ed03) ^ mix64(index)));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* The tensors a layer has, for load and save. */
enum tensor { T_WEIGHT, T_BIAS, T_RMEAN, T_RVAR, T_NBT, T__COUNT };
static const char *const tensor_names[T__COUNT] = {"weight", "bias", "running_mean",
                                                   "running_var", "num_batches_tracked"};

static bool has_tensor(const struct ps_layer *l, enum tensor t)
{
    switch (l->op) {
    case PS_OP_LINEAR:
    case PS_OP_CONV2D: return t == T_WEIGHT || (t == T_BIAS && l->bias);
    case PS_OP_BATCHNORM: return t >= T_RMEAN || l->affine;
    default: return false;
    }
}

/* shape of tensor t of layer k; returns ndim */
static int tensor_shape(const struct ps_spec *spec, const struct ps_model *model, int k,
                        enum tensor t, int64_t *shape)
{
    const struct ps_layer *l = &spec->layers[k];
    const struct ps_layer_info *li = &model->layers[k];
    if (t == T_NBT) return 0;
    if (l->op == PS_OP_BATCHNORM) {
        shape[0] = li->channels;
        return 1;
    }
    if (t == T_BIAS) {
        shape[0] = l->out;
        return 1;
    }
    if (l->op == PS_OP_LINEAR) {
        shape[0] = l->out;
        shape[1] = li->in_numel;
        return 2;
    }
    shape[0] = l->out;
    shape[1] = li->in[0];
    shape[2] = l->kernel;
    shape[3] = l->kernel;
    return 4;
}

static int64_t numel_of(const int64_t *s, int nd)
{
    int64_t n = 1;
    for (int k = 0; k < nd; k++) n *= s[k];
    return n;
}

static float **slot_f(struct ps_layer_state *ls, enum tensor t)
{
    switch (t) {
    case T_WEIGHT: return &ls->weight;
    case T_BIAS: return &ls->bias;
    case T_RMEAN: return &ls->running_mean;
    case T_RVAR: return &ls->running_var;
    default: return NULL;
    }
}

static void fmt_shape(const int64_t *s, int nd, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "(");
    for (int k = 0; k < nd && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", k ? ", " : "", (long long)s[k]);
    if (o < len) snprintf(buf + o, len - o, nd == 1 ? ",)" : ")");
}

static int load_tensor(struct ps_layer_state *ls, const struct ps_spec *spec,
                       const struct ps_model *model, int k, enum tensor t, struct ps_diag *d)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%d.%s.npy", spec->weights, k, tensor_names[t]);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ps_diag_set(d, -ENOENT, path, "missing: layer %d (%s) needs its %s in the weights folder",
                    k, ps_op_name(spec->layers[k].op), tensor_names[t]);
        ps_diag_hint(d, "a weights folder must hold the full state_dict of the model "
                        "(torch.save each tensor with numpy.save), or leave model.weights out");
        return -ENOENT;
    }
    int64_t want[4];
    int nd = tensor_shape(spec, model, k, t, want);
    struct ps_npy a;
    int rc = ps_npy_load(path, t == T_NBT ? PS_NPY_I64 : PS_NPY_F32, &a, d);
    if (rc) return rc;
    bool is_float = a.descr[1] == 'f';
    if (t == T_NBT ? is_float : !is_float) {
        ps_diag_set(d, -EINVAL, path, "dtype '%s': expected %s", a.descr,
                    t == T_NBT ? "an integer (int64)" : "float32 or float64");
        ps_npy_finish(&a);
        return -EINVAL;
    }
    bool ok = a.ndim == nd;
    for (int q = 0; ok && q < nd; q++) ok = a.shape[q] == want[q];
    if (t == T_NBT && a.ndim == 1 && a.shape[0] == 1) ok = true;
    if (!ok) {
        char w[96], g[96];
        fmt_shape(want, nd, w, sizeof(w));
        fmt_shape(a.shape, a.ndim, g, sizeof(g));
        ps_diag_set(d, -EINVAL, path, "shape %s: layer %d (%s) expects %s", g, k,
                    ps_op_name(spec->layers[k].op), w);
        ps_npy_finish(&a);
        return -EINVAL;
    }
    if (t == T_NBT) {
        ls->num_batches_tracked = a.u.i64[0];
        ps_npy_finish(&a);
        if (ls->num_batches_tracked < 0)
            return ps_diag_set(d, -EINVAL, path, "num_batches_tracked is negative");
        return 0;
    }
    for (size_t q = 0; q < a.numel; q++)
        if (!isfinite(a.u.f32[q])) {
            ps_diag_set(d, -EINVAL, path, "element %zu is %s", q,
                        isnan(a.u.f32[q]) ? "NaN" : "infinite (or too large for float32)");
            ps_npy_finish(&a);
            return -EINVAL;
        }
    if (t == T_RVAR)
        for (size_t q = 0; q < a.numel; q++)
            if (a.u.f32[q] < 0) {
                ps_diag_set(d, -EINVAL, path, "element %zu is negative (%g), a variance cannot be",
                            q, (double)a.u.f32[q]);
                ps_npy_finish(&a);
                return -EINVAL;
            }
    memcpy(*slot_f(ls, t), a.u.f32, a.numel * sizeof(float));
    ps_npy_finish(&a);
    return 0;
}

int ps_state_init(struct ps_state *st, const struct ps_spec *spec, const struct ps_model *model,
                  uint64_t seed, struct ps_diag *d)
{
    memset(st, 0, sizeof(*st));
    st->n_layers = spec->n_layers;
    st->layers = calloc((size_t)spec->n_layers, sizeof(*st->layers));
    if (!st->layers) return ps_diag_set(d, -ENOMEM, spec->path, "out of memory for the state");
    for (int k = 0; k < spec->n_layers; k++) {
        const struct ps_layer *l = &spec->layers[k];
        struct ps_layer_state *ls = &st->layers[k];
        int64_t sh[4];
        bool fail = false;
        if (has_tensor(l, T_WEIGHT)) {
            ls->n_weight = numel_of(sh, tensor_shape(spec, model, k, T_WEIGHT, sh));
            ls->weight = calloc((size_t)ls->n_weight, sizeof(float));
            ls->dweight = calloc((size_t)ls->n_weight, sizeof(float));
            fail |= !ls->weight || !ls->dweight;
        }
        if (has_tensor(l, T_BIAS)) {
            ls->n_bias = numel_of(sh, tensor_shape(spec, model, k, T_BIAS, sh));
            ls->bias = calloc((size_t)ls->n_bias, sizeof(float));
            ls->dbias = calloc((size_t)ls->n_bias, sizeof(float));
            fail |= !ls->bias || !ls->dbias;
        }
        if (l->op == PS_OP_BATCHNORM) {
            size_t C = (size_t)model->layers[k].channels;
            ls->channels = (int64_t)C;
            ls->running_mean = calloc(C, sizeof(float));
            ls->running_var = calloc(C, sizeof(float));
            ls->sum = calloc(C, sizeof(double));
            ls->sum_sq = calloc(C, sizeof(double));
            fail |= !ls->running_mean || !ls->running_var || !ls->sum || !ls->sum_sq;
        }
        if (fail) {
            ps_state_finish(st);
            return ps_diag_set(d, -ENOMEM, spec->path, "out of memory for the state");
        }
        /* defaults */
        if (l->op == PS_OP_BATCHNORM) {
            for (int64_t c = 0; c < ls->channels; c++) {
                ls->running_var[c] = 1.0f;
                if (ls->weight) ls->weight[c] = 1.0f;
            }
        } else if (ls->weight) {
            const struct ps_layer_info *li = &model->layers[k];
            double fan_in = l->op == PS_OP_LINEAR ? (double)li->in_numel
                                                  : (double)(li->in[0] * l->kernel * l->kernel);
            double bound = 1.0 / sqrt(fan_in);
            for (int64_t q = 0; q < ls->n_weight; q++)
                ls->weight[q] = (float)((2.0 * uni(seed, (uint64_t)k * 4 + 0, (uint64_t)q) - 1.0) *
                                        bound);
            for (int64_t q = 0; q < ls->n_bias; q++)
                ls->bias[q] =
                    (float)((2.0 * uni(seed, (uint64_t)k * 4 + 1, (uint64_t)q) - 1.0) * bound);
        }
        if (!spec->weights) continue;
        for (int t = 0; t < T__COUNT; t++) {
            if (!has_tensor(l, (enum tensor)t)) continue;
            int rc = load_tensor(ls, spec, model, k, (enum tensor)t, d);
            if (rc) {
                ps_state_finish(st);
                return rc;
            }
        }
    }
    return 0;
}

void ps_state_zero_grad(struct ps_state *st)
{
    for (int k = 0; k < st->n_layers; k++) {
        struct ps_layer_state *ls = &st->layers[k];
        if (ls->dweight) memset(ls->dweight, 0, (size_t)ls->n_weight * sizeof(float));
        if (ls->dbias) memset(ls->dbias, 0, (size_t)ls->n_bias * sizeof(float));
    }
}

void ps_state_finish(struct ps_state *st)
{
    if (!st) return;
    for (int k = 0; k < st->n_layers && st->layers; k++) {
        struct ps_layer_state *ls = &st->layers[k];
        free(ls->weight);
        free(ls->bias);
        free(ls->dweight);
        free(ls->dbias);
        free(ls->running_mean);
        free(ls->running_var);
        free(ls->sum);
        free(ls->sum_sq);
    }
    free(st->layers);
    memset(st, 0, sizeof(*st));
}

int ps_state_save(const struct ps_state *st, const struct ps_spec *spec,
                  const struct ps_model *model, const char *dir, struct ps_diag *d)
{
    char path[PATH_MAX];
    int rc = 0;
    for (int k = 0; k < st->n_layers && rc == 0; k++) {
        const struct ps_layer *l = &spec->layers[k];
        const struct ps_layer_state *ls = &st->layers[k];
        for (int t = 0; t < T__COUNT && rc == 0; t++) {
            if (!has_tensor(l, (enum tensor)t)) continue;
            int64_t sh[4];
            int nd = tensor_shape(spec, model, k, (enum tensor)t, sh);
            if (snprintf(path, sizeof(path), "%s/%d.%s.npy", dir, k, tensor_names[t]) >=
                (int)sizeof(path))
                return ps_diag_set(d, -ENAMETOOLONG, dir, "path too long");
            if (t == T_NBT)
                rc = ps_npy_save_i64(path, &ls->num_batches_tracked, 0, sh, d);
            else {
                float **s = slot_f((struct ps_layer_state *)ls, (enum tensor)t);
                rc = ps_npy_save_f32(path, *s, nd, sh, d);
            }
        }
    }
    return rc;
}
