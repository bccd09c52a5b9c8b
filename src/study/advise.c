/* study/advise: the configuration search of `pipescope advise` (src/advise.h holds the result
 * and what follows from it alone).
 *
 * For D devices the search visits every schedule row, its stages per device (1 or 2 for rows
 * without virtual_stages, kept when the schedule's graph runs on exactly D devices: 2 for the
 * V-shaped schedules; 2 and 4 for rows that read virtual_stages), every chunks value (powers of
 * two and divisors of the batch up to the batch, minus those where BatchNorm would see one
 * value per channel) and every checkpoint mode. Each configuration gets the exact min-max
 * time balance of its S stages (sim/balance.h) with every stage under the cap at one
 * micro-batch's activations (a necessary condition: -ENOSPC proves no balance fits), is built
 * as a derived spec (the spec's JSON with the pipeline fields replaced) and simulated. When the
 * simulated peak exceeds the cap and the layers have at most ADVISE_MAX_BALANCES balances, every
 * balance is simulated in order of its slowest stage until one fits (still the exact min-max
 * among those that fit; none fitting is a proof); with more, it is rebalanced once with every
 * stage charged the simulated in-flight count of micro-batches (a conservative model: that
 * balance is not proven optimal, and the point and the search say so).
 *
 * Pruning (A2 of advise.h) uses bounds valid for any balance: makespan >= the total work over
 * D devices (each node costs at least its own FLOPs or bytes at the device's rates, so a
 * device's busy time is at least its summed FLOPs or bytes) and >= the forward and backward of
 * the first micro-batch through every layer; peak >= the parameters over D and the largest
 * layer's parameters. Configurations are evaluated in descending order of the throughput
 * bound, so strong points come first.
 *
 * The BN drift of a (chunks, checkpoint, policy) point is predicted by ps_advise_var_err from
 * the per-channel batch variance at every BN layer, read from one forward-only pass of the spec
 * (chunks 1, plain BN, running variance 1 at the start): V = (r - (1 - a)) / a.
 */
#include "src/study/study.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cJSON.h"
#include "sim/balance.h"
#include "src/advise.h"
#include "src/file.h"

void ps_study_layer_time(const struct ps_spec *spec, const struct ps_model *model,
                         const struct ps_costs *costs, double bs, double *t)
{
    double flops = spec->dev_flops > 0 ? spec->dev_flops : 6.7e13;
    double bw = spec->dev_mem_bw > 0 ? spec->dev_mem_bw : 4.8e12;
    for (int k = 0; k < spec->n_layers; k++) {
        const struct ps_layer_info *li = &model->layers[k];
        if (costs) {
            double sc = costs->per_sample ? bs : bs / costs->micro_batch;
            t[k] = (costs->layers[k].forward_us + costs->layers[k].backward_us) * sc;
        } else {
            double f = li->fwd_flops * bs / flops, fb = (li->fwd_bytes * bs) / bw;
            double b = li->bwd_flops * bs / flops, bb = (li->bwd_bytes * bs) / bw;
            t[k] = ((f > fb ? f : fb) + (b > bb ? b : bb)) * 1e6;
        }
    }
}

/* Lower bounds on the device time of forward + backward of bs samples, per layer: a node costs
 * at least its FLOPs or its bytes at the device's rates (the roofline takes the larger of the
 * node's sums), so a device's busy time is at least its summed FLOPs and at least its summed
 * bytes. fl and by get the two per layer (measured costs: both the measured time, linear in the
 * samples). */
static void work_lb(const struct ps_spec *spec, const struct ps_model *model,
                    const struct ps_costs *costs, double bs, double *fl, double *by)
{
    double flops = spec->dev_flops > 0 ? spec->dev_flops : 6.7e13;
    double bw = spec->dev_mem_bw > 0 ? spec->dev_mem_bw : 4.8e12;
    for (int k = 0; k < spec->n_layers; k++) {
        const struct ps_layer_info *li = &model->layers[k];
        if (costs) {
            fl[k] = by[k] = (costs->layers[k].forward_us + costs->layers[k].backward_us) *
                            (costs->per_sample ? bs : bs / costs->micro_batch);
        } else {
            fl[k] = (li->fwd_flops + li->bwd_flops) * bs / flops * 1e6;
            by[k] = (li->fwd_bytes + li->bwd_bytes) * bs / bw * 1e6;
        }
    }
}

/* the same for the forward alone */
static void fwd_lb(const struct ps_spec *spec, const struct ps_model *model,
                   const struct ps_costs *costs, double bs, double *fl, double *by)
{
    double flops = spec->dev_flops > 0 ? spec->dev_flops : 6.7e13;
    double bw = spec->dev_mem_bw > 0 ? spec->dev_mem_bw : 4.8e12;
    for (int k = 0; k < spec->n_layers; k++) {
        const struct ps_layer_info *li = &model->layers[k];
        if (costs) {
            fl[k] = by[k] = costs->layers[k].forward_us *
                            (costs->per_sample ? bs : bs / costs->micro_batch);
        } else {
            fl[k] = li->fwd_flops * bs / flops * 1e6;
            by[k] = li->fwd_bytes * bs / bw * 1e6;
        }
    }
}

static double sum(const double *x, int n)
{
    double s = 0;
    for (int k = 0; k < n; k++) s += x[k];
    return s;
}

/* min over balances of the largest stage sum of x (S stages); 0 when S > n */
static double minmax(const double *x, int n, int S, int *scratch)
{
    double mx = 0;
    return ps_balance_exact(x, NULL, 0, n, S, scratch, &mx) ? 0 : mx;
}

/* the spec's JSON with the pipeline fields of a configuration */
static cJSON *derive_json(const cJSON *root, int sched, int vs, int S, const int *bal, int chunks,
                          enum ps_checkpoint ck, enum ps_bn_policy pol, bool cpu)
{
    cJSON *r = cJSON_Duplicate(root, 1);
    if (!r) return NULL;
    cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pipeline");
    if (!p) p = cJSON_AddObjectToObject(r, "pipeline");
    if (!p) goto fail;
    static const char *const keys[] = {"schedule", "balance", "chunks", "checkpoint",
                                       "batchnorm", "virtual_stages", "devices"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        cJSON_DeleteItemFromObjectCaseSensitive(p, keys[k]);
    cJSON *b = cJSON_CreateArray();
    if (!b || !cJSON_AddItemToObject(p, "balance", b)) goto fail;
    for (int j = 0; j < S; j++) cJSON_AddItemToArray(b, cJSON_CreateNumber(bal[j]));
    if (!cJSON_AddStringToObject(p, "schedule", ps_schedule_name((enum ps_schedule)sched)) ||
        !cJSON_AddNumberToObject(p, "chunks", chunks) ||
        !cJSON_AddStringToObject(p, "checkpoint", ps_checkpoint_name(ck)) ||
        !cJSON_AddStringToObject(p, "batchnorm", ps_bn_policy_name(pol)))
        goto fail;
    if (ps_schedule_ops((enum ps_schedule)sched)->virtual_stages &&
        !cJSON_AddNumberToObject(p, "virtual_stages", vs))
        goto fail;
    if (cpu) {
        cJSON *dv = cJSON_CreateArray();
        if (!dv || !cJSON_AddItemToObject(p, "devices", dv)) goto fail;
        for (int j = 0; j < S; j++) cJSON_AddItemToArray(dv, cJSON_CreateString("cpu"));
    }
    return r;
fail:
    cJSON_Delete(r);
    return NULL;
}

static int derive_spec(const cJSON *root, const struct ps_spec *spec, int sched, int vs, int S,
                       const int *bal, int chunks, enum ps_checkpoint ck, enum ps_bn_policy pol,
                       struct ps_spec **out, struct ps_diag *d)
{
    *out = NULL;
    cJSON *r = derive_json(root, sched, vs, S, bal, chunks, ck, pol, false);
    char *text = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    if (!text) return ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
    int rc = ps_spec_parse(text, spec->path, spec->dir, out, d);
    free(text);
    return rc;
}

struct ctx {
    const struct ps_spec *spec;
    const struct ps_model *model;
    const struct ps_advise_opts *o;
    const cJSON *root;
    int L, D;
    double *t, *mem;
    /* BN layers: per channel batch variance V, values per channel n, momentum a */
    int n_bn;
    int *bn_layer;
    int64_t *bn_ch;
    double **bn_var, *bn_n, *bn_a;
};

/* simulate one balance: 0 (makespan, peak filled), -EDEADLK/-EINVAL (cannot run) */
static int sim_one(struct ctx *c, int sched, int vs, int S, const int *bal, int chunks,
                   enum ps_checkpoint ck, double *makespan, int64_t *peak, int *devices,
                   uint32_t *in_flight, bool *split, struct ps_diag *d)
{
    struct ps_spec *s2 = NULL;
    struct ps_model *m2 = NULL;
    int *dev_of = NULL;
    int64_t *pbytes = NULL;
    struct ps_study_sim run;
    memset(&run, 0, sizeof(run));
    int rc = derive_spec(c->root, c->spec, sched, vs, S, bal, chunks, ck, c->spec->batchnorm, &s2,
                         d);
    if (!rc) rc = ps_model_build(s2, &m2, d);
    struct ps_variant v;
    if (!rc) {
        ps_variant_from_spec(s2, &v);
        rc = ps_study_simulate(s2, m2, &v, NULL, c->o->costs, &run, d);
    }
    if (!rc) {
        *makespan = run.sim.makespan_us;
        *devices = run.sim.n_devices;
        dev_of = calloc((size_t)S, sizeof(int));
        pbytes = calloc((size_t)run.sim.n_devices + 1, sizeof(int64_t));
        if (!dev_of || !pbytes) rc = ps_diag_set(d, -ENOMEM, c->spec->path, "out of memory");
    }
    if (!rc) {
        for (int j = 0; j < S; j++) dev_of[j] = -1;
        *split = false;
        for (uint32_t k = 0; k < run.g->n_nodes; k++) {
            const struct ps_node *nd = &run.g->nodes[k];
            if (nd->kind == PS_NODE_WGRAD) *split = true;
            if (nd->kind == PS_NODE_COMPUTE && nd->part >= 0 && nd->part < S &&
                dev_of[nd->part] < 0 && nd->device >= 0 && nd->device < run.sim.n_devices)
                dev_of[nd->part] = nd->device;
        }
        for (int j = 0; j < S; j++)
            if (dev_of[j] >= 0) pbytes[dev_of[j]] += 8 * m2->parts[j].params;
        *peak = 0;
        *in_flight = 1;
        for (int dv = 0; dv < run.sim.n_devices; dv++) {
            int64_t b = run.sim.dev[dv].peak_bytes + pbytes[dv];
            if (b > *peak) *peak = b;
            if (run.sim.dev[dv].max_in_flight > *in_flight)
                *in_flight = run.sim.dev[dv].max_in_flight;
        }
    }
    free(dev_of);
    free(pbytes);
    ps_study_sim_finish(&run);
    ps_model_destroy(m2);
    ps_spec_destroy(s2);
    return rc;
}

/* mem per layer with k micro-batches of mb samples in flight: a lower bound of what a stage of
 * these layers holds (ps_layer_kept_bytes), so a balance it rules out cannot fit */
static void layer_mem(struct ctx *c, double mb, double k)
{
    for (int l = 0; l < c->L; l++)
        c->mem[l] = 8.0 * (double)c->model->layers[l].params +
                    (double)ps_layer_kept_bytes(c->spec, c->model, l) * mb * k;
}

static void predict_drift(const struct ctx *c, int chunks, enum ps_checkpoint ck,
                          enum ps_bn_policy pol, struct ps_advise_point *p)
{
    p->drift = NAN;
    p->drift_measured = NAN;
    if (c->n_bn == 0) {
        p->drift = c->bn_var ? 0 : NAN;
        return;
    }
    if (!c->bn_var) return;
    struct ps_variant v;
    ps_variant_from_spec(c->spec, &v);
    struct ps_diag d;
    if (ps_variant_set_chunks(&v, c->spec, chunks, &d)) return;
    v.checkpoint = ck;
    v.batchnorm = pol;
    int T = c->spec->steps > 0 ? c->spec->steps : 1;
    double s = 0;
    for (int k = 0; k < c->n_bn; k++) {
        double e = 0;
        for (int64_t ch = 0; ch < c->bn_ch[k]; ch++)
            e += ps_advise_var_err(c->bn_var[k][ch], c->bn_n[k], c->bn_a[k], T, &v);
        s += c->bn_ch[k] ? e / (double)c->bn_ch[k] : 0;
    }
    p->drift = s / c->n_bn;
}

/* the batch variance per channel at every BN layer, from one forward-only pass */
static void bn_statistics(struct ctx *c, struct ps_advise *a)
{
    const struct ps_spec *spec = c->spec;
    int nbn = 0;
    for (int l = 0; l < spec->n_layers; l++) nbn += spec->layers[l].op == PS_OP_BATCHNORM;
    if (!nbn) {
        a->drift_predicted = true;
        c->bn_var = calloc(1, sizeof(double *));
        snprintf(a->drift_note, sizeof(a->drift_note), "the model has no BatchNorm layer");
        return;
    }
    if (!c->o->predict_drift) {
        snprintf(a->drift_note, sizeof(a->drift_note), "%s", c->o->drift_why && c->o->drift_why[0] ? c->o->drift_why
                 : "drift prediction off");
        return;
    }
    if (spec->weights) {
        snprintf(a->drift_note, sizeof(a->drift_note), "not predicted: the spec loads weights, so "
                 "the running variance does not start at 1 (use --train N to measure)");
        return;
    }
    for (int l = 0; l < spec->n_layers; l++)
        if (spec->layers[l].op == PS_OP_BATCHNORM && spec->layers[l].momentum_null) {
            snprintf(a->drift_note, sizeof(a->drift_note), "not predicted: batchnorm layer %d "
                     "uses a cumulative average (momentum null)", l);
            return;
        }
    int one = 1;
    enum ps_bn_policy plain = PS_BN_PLAIN;
    enum ps_checkpoint never = PS_CKPT_NEVER;
    struct ps_drift_opts o = {.n_chunks = 1, .chunks = &one, .n_policies = 1, .policies = &plain,
                              .n_checkpoints = 1, .checkpoints = &never, .steps = 1,
                              .forward_only = true};
    struct ps_drift dr;
    memset(&dr, 0, sizeof(dr));
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_drift_run(spec, c->model, &o, &dr, &d)) {
        snprintf(a->drift_note, sizeof(a->drift_note), "not predicted: the forward pass failed: "
                 "%.140s", d.msg);
        ps_drift_finish(&dr);
        return;
    }
    const struct ps_drift_run *r = &dr.reference;
    c->n_bn = r->n_layers;
    c->bn_layer = calloc((size_t)c->n_bn + 1, sizeof(int));
    c->bn_ch = calloc((size_t)c->n_bn + 1, sizeof(int64_t));
    c->bn_var = calloc((size_t)c->n_bn + 1, sizeof(double *));
    c->bn_n = calloc((size_t)c->n_bn + 1, sizeof(double));
    c->bn_a = calloc((size_t)c->n_bn + 1, sizeof(double));
    bool ok = c->bn_layer && c->bn_ch && c->bn_var && c->bn_n && c->bn_a;
    for (int k = 0; ok && k < c->n_bn; k++) {
        const struct ps_drift_layer *l = &r->layers[k];
        const struct ps_layer_info *li = &c->model->layers[l->layer];
        double a_ = l->momentum;
        c->bn_layer[k] = l->layer;
        c->bn_ch[k] = l->channels;
        c->bn_a[k] = a_;
        c->bn_n[k] = (double)spec->batch * (li->n_in_dims == 3 ? (double)(li->in[1] * li->in[2]) : 1);
        if (!(c->bn_var[k] = malloc((size_t)(l->channels + 1) * sizeof(double)))) ok = false;
        for (int64_t ch = 0; ok && ch < l->channels; ch++)
            c->bn_var[k][ch] = a_ > 0 ? ((double)l->running_var[ch] - (1 - a_)) / a_ : 0;
    }
    ps_drift_finish(&dr);
    if (!ok) {
        snprintf(a->drift_note, sizeof(a->drift_note), "not predicted: out of memory");
        for (int k = 0; c->bn_var && k < c->n_bn; k++) free(c->bn_var[k]);
        free(c->bn_var);
        c->bn_var = NULL;
        c->n_bn = 0;
        return;
    }
    a->drift_predicted = true;
    snprintf(a->drift_note, sizeof(a->drift_note), "predicted from one forward pass (chunks 1): "
             "running variance after %d step%s vs chunks 1 plain BN, mean over channels and %d "
             "BN layer%s", spec->steps > 0 ? spec->steps : 1, spec->steps == 1 ? "" : "s",
             c->n_bn, c->n_bn == 1 ? "" : "s");
}

/* Every composition of L layers into S non-empty stages (n of them, S ints each), ordered by
 * the slowest stage's time; stages within 1e-12 (relative) of a group's fastest count as tied and
 * keep lexicographic order, as ps_balance_exact breaks ties. NULL when there are more than max
 * (or out of memory). */
struct comp_sort {
    const double *mx;
    const int *b;
    int S;
};
static struct comp_sort g_cs; /* qsort has no context argument; set just before each sort */

static int by_lex(const void *x, const void *y)
{
    const int *a = g_cs.b + (size_t)*(const int *)x * (size_t)g_cs.S;
    const int *b = g_cs.b + (size_t)*(const int *)y * (size_t)g_cs.S;
    for (int j = 0; j < g_cs.S; j++)
        if (a[j] != b[j]) return a[j] - b[j];
    return 0;
}

static int by_mx(const void *x, const void *y)
{
    double a = g_cs.mx[*(const int *)x], b = g_cs.mx[*(const int *)y];
    if (a != b) return a < b ? -1 : 1;
    return by_lex(x, y);
}

static int *compositions(const double *t, int L, int S, int max, int *n, int **order)
{
    double cnt = 1; /* C(L-1, S-1) */
    for (int k = 1; k <= S - 1; k++) cnt = cnt * (L - S + k) / k;
    *n = 0;
    *order = NULL;
    if (cnt > max) return NULL;
    int N = (int)(cnt + 0.5);
    int *all = malloc((size_t)N * (size_t)S * sizeof(int));
    int *ord = malloc((size_t)N * sizeof(int));
    double *mx = malloc((size_t)N * sizeof(double));
    int *b = malloc((size_t)S * sizeof(int));
    if (!all || !ord || !mx || !b) goto fail;
    for (int j = 0; j < S - 1; j++) b[j] = 1;
    b[S - 1] = L - (S - 1);
    for (int k = 0; k < N; k++) {
        memcpy(all + (size_t)k * (size_t)S, b, (size_t)S * sizeof(int));
        double m = 0;
        for (int j = 0, l = 0; j < S; j++) {
            double st = 0;
            for (int q = 0; q < b[j]; q++) st += t[l++];
            if (st > m) m = st;
        }
        mx[k] = m;
        ord[k] = k;
        /* the next composition in lexicographic order */
        for (int j = S - 2; j >= 0; j--) {
            int rest = 0;
            for (int q = j + 1; q < S; q++) rest += b[q];
            if (rest - 1 >= S - 1 - j) {
                b[j]++;
                rest--;
                for (int q = j + 1; q < S - 1; q++) b[q] = 1;
                b[S - 1] = rest - (S - 2 - j);
                break;
            }
        }
    }
    g_cs = (struct comp_sort){mx, all, S};
    qsort(ord, (size_t)N, sizeof(int), by_mx);
    for (int g = 0; g < N;) {
        int e = g + 1;
        while (e < N && mx[ord[e]] <= mx[ord[g]] * (1 + 1e-12)) e++;
        qsort(ord + g, (size_t)(e - g), sizeof(int), by_lex);
        g = e;
    }
    free(mx);
    free(b);
    *n = N;
    *order = ord;
    return all;
fail:
    free(all);
    free(ord);
    free(mx);
    free(b);
    return NULL;
}

/* compositions enumerated when the min-max balance does not fit the cap */
#define ADVISE_MAX_BALANCES 256

struct config {
    int sched, vs, chunks;
    enum ps_checkpoint ck;
    double ub_thr;
    int64_t lb_peak;
};

static int by_bound(const void *x, const void *y)
{
    const struct config *a = x, *b = y;
    if (a->ub_thr != b->ub_thr) return a->ub_thr > b->ub_thr ? -1 : 1;
    if (a->sched != b->sched) return a->sched - b->sched;
    if (a->vs != b->vs) return a->vs - b->vs;
    if (a->chunks != b->chunks) return a->chunks - b->chunks;
    return (int)a->ck - (int)b->ck;
}

static struct ps_advise_point *add_point(struct ps_advise *a, int *cap)
{
    if (a->n_points == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        struct ps_advise_point *p = realloc(a->points, (size_t)nc * sizeof(*p));
        if (!p) return NULL;
        a->points = p;
        *cap = nc;
    }
    struct ps_advise_point *p = &a->points[a->n_points++];
    memset(p, 0, sizeof(*p));
    p->drift = NAN;
    p->drift_measured = NAN;
    return p;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ps_study_advise(const struct ps_spec *spec, const struct ps_model *model,
                    const struct ps_advise_opts *o, struct ps_advise *a, struct ps_diag *d)
{
    double t0 = now_s();
    memset(a, 0, sizeof(*a));
    a->spec = spec;
    a->recommended = -1;
    a->objective = o->objective;
    a->exhaustive = true;
    struct ctx c = {.spec = spec, .model = model, .o = o, .L = spec->n_layers};
    c.D = o->devices > 0 ? o->devices
          : ps_study_advise_cpu(spec) ? spec->n_partitions
                                      : spec->n_devices;
    a->devices = c.D;
    char *text = NULL;
    struct config *cf = NULL;
    double *fl = NULL;
    int *bal = NULL, rc = 0, cap_points = 0, ncf = 0;
    int *chunks = NULL;
    cJSON *root = NULL;
    size_t len;
    if ((rc = ps_file_read(spec->path, NULL, &text, &len, d))) goto out;
    if (!(root = cJSON_Parse(text))) {
        rc = ps_diag_set(d, -EINVAL, spec->path, "not valid JSON");
        goto out;
    }
    c.root = root;
    c.t = calloc((size_t)c.L + 1, sizeof(double));
    c.mem = calloc((size_t)c.L + 1, sizeof(double));
    bal = calloc((size_t)c.L + 1, sizeof(int));
    chunks = calloc(64 + (size_t)spec->batch, sizeof(int));
    if (!c.t || !c.mem || !bal || !chunks) {
        rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
        goto out;
    }

    /* the spec as written: throughput and peak of its own balance */
    {
        double ms;
        int64_t pk;
        int dv;
        uint32_t inf;
        bool split;
        rc = sim_one(&c, spec->schedule, spec->virtual_stages, spec->n_partitions, spec->balance,
                     spec->chunks, spec->checkpoint, &ms, &pk, &dv, &inf, &split, d);
        if (rc) goto out;
        a->spec_makespan_us = ms;
        a->spec_throughput = ms > 0 ? (double)spec->batch / (ms * 1e-6) : 0;
        a->spec_peak = pk;
    }
    a->memory_cap = o->memory_cap;
    if (o->cap_auto) {
        a->cap_auto = true;
        a->memory_cap = (double)a->spec_peak;
    }
    bn_statistics(&c, a);
    {
        struct ps_advise_point sp;
        memset(&sp, 0, sizeof(sp));
        predict_drift(&c, spec->chunks, spec->checkpoint, spec->batchnorm, &sp);
        a->spec_drift = sp.drift;
    }

    /* chunks: powers of two and divisors of the batch */
    int nch = 0;
    for (int64_t x = 1; x <= spec->batch; x++) {
        bool pow2 = (x & (x - 1)) == 0;
        if (pow2 || spec->batch % x == 0) chunks[nch++] = (int)x;
    }
    int npol = 1;
    enum ps_bn_policy pols[3] = {spec->batchnorm, PS_BN_PLAIN, PS_BN_PLAIN};
    if (c.n_bn > 0) {
        npol = 3;
        pols[0] = PS_BN_PLAIN;
        pols[1] = PS_BN_DEFERRED;
        pols[2] = PS_BN_GRAD_ONLY;
    }

    /* bounds (file comment): whole-batch work per layer, parameters */
    fl = calloc(2 * ((size_t)c.L + 1), sizeof(double));
    double *by = fl ? fl + c.L + 1 : NULL;
    if (!fl) {
        rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
        goto out;
    }
    work_lb(spec, model, o->costs, (double)spec->batch, fl, by);
    double work = sum(fl, c.L) > sum(by, c.L) ? sum(fl, c.L) : sum(by, c.L);
    int64_t tparams = 0;
    for (int l = 0; l < c.L; l++) tparams += model->layers[l].params;
    cf = calloc((size_t)PS_SCHED__COUNT * 2 * (size_t)nch * 3, sizeof(*cf));
    if (!cf) {
        rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
        goto out;
    }
    for (int k = 0; k < PS_SCHED__COUNT; k++) {
        const struct ps_schedule_ops *ops = ps_schedule_ops((enum ps_schedule)k);
        int vps_list[2] = {1, 2};
        if (ops->virtual_stages) vps_list[0] = 2, vps_list[1] = 4;
        for (int q = 0; q < 2; q++) {
            int vps = vps_list[q], S = c.D * vps;
            if (S > c.L) continue;
            /* does this schedule put S stages on D devices? probe with the largest chunks */
            ps_study_layer_time(spec, model, o->costs, 1, c.t);
            double mx;
            if (ps_balance_exact(c.t, NULL, 0, c.L, S, bal, &mx)) continue;
            double ms;
            int64_t pk;
            int dv = 0;
            uint32_t inf;
            struct ps_diag pd;
            ps_diag_clear(&pd);
            int vs = ops->virtual_stages ? vps : 1;
            bool split = false;
            if (sim_one(&c, k, vs, S, bal, chunks[nch - 1], PS_CKPT_NEVER, &ms, &pk, &dv, &inf,
                        &split, &pd) || dv != c.D)
                continue;
            for (int ci = 0; ci < nch; ci++)
                for (int ck = 0; ck < 3; ck++) {
                    struct config *x = &cf[ncf++];
                    x->sched = k;
                    x->vs = vs;
                    x->chunks = chunks[ci];
                    x->ck = (enum ps_checkpoint)ck;
                    /* makespan >= the busiest stage's whole-batch work, the total work over
                     * D devices, and micro-batch 0's forward and backward through every layer
                     * (its forward only when the schedule splits the backward: a stage's weight
                     * gradient may overlap the previous stage's input gradient) */
                    double lb = work / c.D;
                    double st = minmax(fl, c.L, S, bal), sb = minmax(by, c.L, S, bal);
                    if (st > lb) lb = st;
                    if (sb > lb) lb = sb;
                    double *pf = c.t, *pb = c.mem; /* scratch */
                    double mb0 = (double)ps_microbatch_len(spec->batch, chunks[ci]);
                    if (split) fwd_lb(spec, model, o->costs, mb0, pf, pb);
                    else work_lb(spec, model, o->costs, mb0, pf, pb);
                    double path = sum(pf, c.L) > sum(pb, c.L) ? sum(pf, c.L) : sum(pb, c.L);
                    if (path > lb) lb = path;
                    x->ub_thr = lb > 0 ? (double)spec->batch / (lb * 1e-6) : INFINITY;
                    /* peak >= the parameters over D, and the largest stage's parameters and
                     * one micro-batch's saved activations (every stage holds them from its
                     * forward, or its recompute, until its backward) */
                    layer_mem(&c, (double)ps_microbatch_len(spec->batch, chunks[ci]), 1);
                    int64_t pm = (int64_t)minmax(c.mem, c.L, S, bal);
                    x->lb_peak = 8 * ((tparams + c.D - 1) / c.D);
                    if (pm > x->lb_peak) x->lb_peak = pm;
                    /* S is D * vps, kept in vs for virtual rows and recomputed below */
                    if (!ops->virtual_stages) x->vs = -vps;
                }
        }
    }
    qsort(cf, (size_t)ncf, sizeof(*cf), by_bound);
    a->n_configs = ncf;
    for (int i = 0; i < ncf; i++) {
        struct config *x = &cf[i];
        int vps = x->vs < 0 ? -x->vs : x->vs, vs = x->vs < 0 ? 1 : x->vs, S = c.D * vps;
        char why[160] = "";
        int first = a->n_points;
        struct ps_advise_point base;
        memset(&base, 0, sizeof(base));
        base.schedule = x->sched;
        base.virtual_stages = vps;
        base.stages = S;
        base.devices = c.D;
        base.chunks = x->chunks;
        base.m = ps_microbatch_count(spec->batch, x->chunks);
        base.checkpoint = x->ck;
        base.bound_throughput = x->ub_thr;
        base.bound_peak = x->lb_peak;
        base.drift = base.drift_measured = NAN;
        if (ps_drift_check_chunks(spec, model, x->chunks, why, sizeof(why))) {
            base.status = PS_ADV_SKIPPED;
        } else if (!o->no_prune) {
            /* A2: pruned when every policy's optimistic corner is dominated or equalled */
            bool all = true;
            for (int pi = 0; pi < npol && all; pi++) {
                struct ps_advise_point corner = base;
                corner.throughput = x->ub_thr;
                corner.peak_bytes = x->lb_peak;
                predict_drift(&c, x->chunks, x->ck, pols[pi], &corner);
                bool hit = false;
                for (int j = 0; j < a->n_points && !hit; j++) {
                    const struct ps_advise_point *q = &a->points[j];
                    if (q->status != PS_ADV_FEASIBLE) continue;
                    hit = q->throughput >= corner.throughput &&
                          q->peak_bytes <= corner.peak_bytes &&
                          (isnan(q->drift) || isnan(corner.drift) || q->drift <= corner.drift);
                }
                all = hit;
            }
            if (all) base.status = PS_ADV_PRUNED;
        }
        if (base.status == PS_ADV_SKIPPED || base.status == PS_ADV_PRUNED) {
            if (base.status == PS_ADV_PRUNED) a->n_pruned++;
            else a->n_skipped++;
            for (int pi = 0; pi < npol; pi++) {
                struct ps_advise_point *p = add_point(a, &cap_points);
                if (!p) {
                    rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
                    goto out;
                }
                *p = base;
                p->policy = pols[pi];
                snprintf(p->why, sizeof(p->why), "%s", why);
                if (base.status == PS_ADV_PRUNED) predict_drift(&c, x->chunks, x->ck, pols[pi], p);
            }
            continue;
        }
        /* the exact min-max time balance, every stage under the cap at one micro-batch */
        double mb = (double)ps_microbatch_len(spec->batch, x->chunks), mx;
        ps_study_layer_time(spec, model, o->costs, mb, c.t);
        layer_mem(&c, mb, 1);
        double capv = a->memory_cap;
        int brc = ps_balance_exact(c.t, capv > 0 ? c.mem : NULL, capv, c.L, S, bal, &mx);
        double ms = 0;
        int64_t pk = 0;
        int dv = 0;
        uint32_t inf = 1;
        bool exact = true, split = false;
        if (brc == -ENOSPC) {
            a->n_skipped++; /* cannot run: configurations = simulated + pruned + skipped */
            base.status = PS_ADV_NO_BALANCE;
            snprintf(why, sizeof(why), "no balance of %d stages keeps one micro-batch of every "
                     "stage under the cap", S);
        } else if (brc) {
            rc = ps_diag_set(d, brc, spec->path, "balance: %s", strerror(-brc));
            goto out;
        } else {
            struct ps_diag sd;
            ps_diag_clear(&sd);
            int src = sim_one(&c, x->sched, vs, S, bal, x->chunks, x->ck, &ms, &pk, &dv, &inf,
                              &split, &sd);
            if (!src) a->n_simulated++; /* once per configuration, retried balances included */
            if (src == -ENOMEM) {
                *d = sd;
                rc = src;
                goto out;
            }
            if (src) {
                base.status = PS_ADV_SKIPPED;
                snprintf(why, sizeof(why), "%.158s", sd.msg);
            } else if (capv > 0 && (double)pk > capv) {
                /* small enough: every balance, slowest stage first, until one fits (exact);
                 * else rebalance once with every stage charged the in-flight count */
                int ncomp = 0, *ord = NULL;
                int *all = compositions(c.t, c.L, S, ADVISE_MAX_BALANCES, &ncomp, &ord);
                int *b2 = calloc((size_t)S, sizeof(int));
                double ms2 = 0, mx2;
                int64_t pk2 = 0;
                uint32_t inf2;
                bool fit = false, tried_all = false;
                if (all && b2) {
                    tried_all = true;
                    for (int q = 0; q < ncomp && !fit; q++) {
                        memcpy(b2, all + (size_t)ord[q] * (size_t)S, (size_t)S * sizeof(int));
                        ps_diag_clear(&sd);
                        if (sim_one(&c, x->sched, vs, S, b2, x->chunks, x->ck, &ms2, &pk2, &dv,
                                    &inf2, &split, &sd))
                            continue;
                        fit = (double)pk2 <= capv;
                    }
                } else if (b2) {
                    layer_mem(&c, mb, inf);
                    if (!ps_balance_exact(c.t, c.mem, capv, c.L, S, b2, &mx2)) {
                        ps_diag_clear(&sd);
                        if (!sim_one(&c, x->sched, vs, S, b2, x->chunks, x->ck, &ms2, &pk2, &dv,
                                     &inf2, &split, &sd))
                            fit = (double)pk2 <= capv;
                    }
                }
                if (fit) {
                    memcpy(bal, b2, (size_t)S * sizeof(int));
                    ms = ms2;
                    pk = pk2;
                    exact = tried_all;
                    if (!tried_all) a->n_rebalanced++;
                } else if (tried_all) {
                    base.status = PS_ADV_NO_BALANCE;
                    snprintf(why, sizeof(why), "none of the %d balances of %d stages fits the cap "
                             "(each simulated)", ncomp, S);
                } else {
                    base.status = PS_ADV_OVER_CAP;
                    snprintf(why, sizeof(why), "simulated peak %lld bytes over the cap, also "
                             "rebalanced for %u micro-batches in flight", (long long)pk, inf);
                    base.peak_bytes = pk;
                }
                free(b2);
                free(all);
                free(ord);
            }
        }
        if (base.status == PS_ADV_OVER_CAP) a->exhaustive = false;
        if (base.status == PS_ADV_SKIPPED) a->n_skipped++;
        if (!exact) a->exhaustive = false;
        for (int pi = 0; pi < npol; pi++) {
            struct ps_advise_point *p = add_point(a, &cap_points);
            if (!p) {
                rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
                goto out;
            }
            *p = base;
            p->policy = pols[pi];
            snprintf(p->why, sizeof(p->why), "%s", why);
            if (base.status == PS_ADV_FEASIBLE) {
                p->makespan_us = ms;
                p->throughput = ms > 0 ? (double)spec->batch / (ms * 1e-6) : 0;
                p->peak_bytes = pk;
                p->balance_exact = exact;
                p->balance = malloc((size_t)S * sizeof(int));
                if (!p->balance) {
                    rc = ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
                    goto out;
                }
                memcpy(p->balance, bal, (size_t)S * sizeof(int));
            }
            predict_drift(&c, x->chunks, x->ck, pols[pi], p);
        }
        (void)first;
    }
    ps_advise_front(a);
    ps_advise_recommend(a);

    /* --train N: measured drift at the best candidates (the recommendation first) */
    if (o->train_steps > 0 && c.n_bn > 0 && a->recommended >= 0) {
        a->train_steps = o->train_steps;
        int picked[3] = {a->recommended, -1, -1}, np = 1;
        for (int n = 1; n < 3; n++) {
            int best = -1;
            for (int i = 0; i < a->n_points; i++) {
                const struct ps_advise_point *p = &a->points[i];
                bool used = false;
                for (int u = 0; u < np; u++) used |= picked[u] == i;
                if (!p->on_front || used) continue;
                if (best < 0 || p->throughput > a->points[best].throughput) best = i;
            }
            if (best >= 0) picked[np++] = best;
        }
        for (int u = 0; u < np; u++) {
            struct ps_advise_point *p = &a->points[picked[u]];
            struct ps_drift_opts to = {.n_chunks = 1, .chunks = &p->chunks, .n_policies = 1,
                                       .policies = &p->policy, .n_checkpoints = 1,
                                       .checkpoints = &p->checkpoint, .steps = o->train_steps};
            struct ps_drift dr;
            memset(&dr, 0, sizeof(dr));
            if ((rc = ps_drift_run(spec, model, &to, &dr, d))) {
                ps_drift_finish(&dr);
                goto out;
            }
            if (dr.n_runs > 0) p->drift_measured = ps_drift_metric(&dr.runs[0], "var_err");
            ps_drift_finish(&dr);
        }
    }
out:
    a->search_s = now_s() - t0;
    for (int k = 0; c.bn_var && k < c.n_bn; k++) free(c.bn_var[k]);
    free(c.bn_var);
    free(c.bn_layer);
    free(c.bn_ch);
    free(c.bn_n);
    free(c.bn_a);
    free(c.t);
    free(c.mem);
    free(bal);
    free(chunks);
    free(cf);
    free(fl);
    free(text);
    cJSON_Delete(root);
    return rc;
}

bool ps_study_advise_drift_default(const struct ps_spec *spec, const struct ps_model *model,
                                   char *why, size_t len)
{
    double fwd = 0;
    for (int l = 0; l < spec->n_layers; l++) fwd += model->layers[l].fwd_flops;
    fwd *= (double)spec->batch;
    if (fwd <= PS_ADVISE_FORWARD_FLOPS) return true;
    snprintf(why, len, "not predicted: the forward pass it reads is %.3g GFLOP on the CPU (limit "
             "%.0f; advise --predict-drift runs it)", fwd * 1e-9, PS_ADVISE_FORWARD_FLOPS * 1e-9);
    return false;
}

bool ps_study_advise_cpu(const struct ps_spec *spec)
{
    for (int j = 0; j < spec->n_partitions; j++)
        if (spec->devices[j].kind != PS_DEV_CPU) return false;
    return true;
}

int ps_study_advise_spec(const struct ps_spec *spec, const struct ps_advise_point *p,
                         char **json, struct ps_diag *d)
{
    *json = NULL;
    char *text = NULL;
    size_t len;
    int rc = ps_file_read(spec->path, NULL, &text, &len, d);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return ps_diag_set(d, -EINVAL, spec->path, "not valid JSON");
    int vs = ps_schedule_ops((enum ps_schedule)p->schedule)->virtual_stages ? p->virtual_stages : 1;
    cJSON *r = derive_json(root, p->schedule, vs, p->stages, p->balance, p->chunks,
                           p->checkpoint, p->policy, ps_study_advise_cpu(spec));
    cJSON_Delete(root);
    if (r) *json = cJSON_Print(r);
    cJSON_Delete(r);
    return *json ? 0 : ps_diag_set(d, -ENOMEM, spec->path, "out of memory");
}
