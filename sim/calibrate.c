/* calibrate: least-squares fit of the cost model to a measured trace (calibrate.h), and the
 * small dense solver it uses. Records align with the graph by node id, as in compare.c.
 */
#include "sim/calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/compare.h"
#include "src/model.h"

/* ---- dense solver --------------------------------------------------------------------------- */

int ps_cholesky_solve(double *A, double *b, int n, double tol, double *x, bool *used)
{
    double *dsc = malloc(((size_t)n + 1) * sizeof(double));
    if (!dsc) return -ENOMEM;
    for (int i = 0; i < n; i++) dsc[i] = A[i * n + i] > 0 ? 1.0 / sqrt(A[i * n + i]) : 0.0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) A[i * n + j] *= dsc[i] * dsc[j];
        b[i] *= dsc[i];
    }
    /* L in the lower triangle of A; dependent columns get a zero column */
    int rank = 0;
    for (int k = 0; k < n; k++) {
        used[k] = false;
        if (dsc[k] == 0) {
            for (int i = k; i < n; i++) A[i * n + k] = 0;
            continue;
        }
        double d = A[k * n + k];
        for (int j = 0; j < k; j++) d -= A[k * n + j] * A[k * n + j];
        if (d <= tol) {
            for (int i = k; i < n; i++) A[i * n + k] = 0;
            continue;
        }
        used[k] = true;
        rank++;
        double l = sqrt(d);
        A[k * n + k] = l;
        for (int i = k + 1; i < n; i++) {
            double s = A[i * n + k];
            for (int j = 0; j < k; j++) s -= A[i * n + j] * A[k * n + j];
            A[i * n + k] = s / l;
        }
    }
    /* L y = b, then L^T z = y, over the used columns */
    for (int i = 0; i < n; i++) {
        if (!used[i]) {
            x[i] = 0;
            continue;
        }
        double s = b[i];
        for (int j = 0; j < i; j++) s -= A[i * n + j] * x[j];
        x[i] = s / A[i * n + i];
    }
    for (int i = n - 1; i >= 0; i--) {
        if (!used[i]) continue;
        double s = x[i];
        for (int j = i + 1; j < n; j++) s -= A[j * n + i] * x[j];
        x[i] = s / A[i * n + i];
    }
    for (int i = 0; i < n; i++) x[i] *= dsc[i];
    free(dsc);
    return rank;
}

/* ---- calibration ---------------------------------------------------------------------------- */

struct lsq {
    int np;
    uint32_t n_rows, cap;
    double *rows; /* n_rows x (np + 1): coefficients, then the observation */
};

static double *lsq_row(struct lsq *q)
{
    if (q->n_rows == q->cap) {
        uint32_t c = q->cap ? q->cap * 2 : 256;
        double *r = realloc(q->rows, (size_t)c * (size_t)(q->np + 1) * sizeof(double));
        if (!r) return NULL;
        q->rows = r;
        q->cap = c;
    }
    double *r = q->rows + (size_t)q->n_rows++ * (size_t)(q->np + 1);
    memset(r, 0, (size_t)(q->np + 1) * sizeof(double));
    return r;
}

static bool has_wgrad(const struct ps_graph *g, uint32_t b, uint32_t *wg)
{
    for (uint32_t k = g->out_off[b]; k < g->out_off[b + 1]; k++) {
        uint32_t d = g->edges[g->out_edge[k]].dst;
        if (g->nodes[d].kind == PS_NODE_WGRAD) {
            *wg = d;
            return true;
        }
    }
    return false;
}

/* roofline time of a layer per sample, forward or backward (shares within a partition) */
static double layer_roof(const struct ps_graph *g, int l, bool bwd)
{
    const struct ps_spec *s = g->spec;
    const struct ps_layer_info *L = &g->model->layers[l];
    double flops = s->dev_flops > 0 ? s->dev_flops : 6.7e13, bw = s->dev_mem_bw > 0 ? s->dev_mem_bw : 4.8e12;
    double a = (bwd ? L->bwd_flops : L->fwd_flops) / flops, b = (bwd ? L->bwd_bytes : L->fwd_bytes) / bw;
    return a > b ? a : b;
}

/* layer l's share of its partition p's roofline time (forward or backward), equal shares when
   the roofline gives the partition no time: how a partition's fitted time is split among its
   layers */
static double roof_share(const struct ps_graph *g, const struct ps_partition_info *p, int l,
                         bool bwd)
{
    double sum = 0;
    for (int k = p->first; k < p->first + p->count; k++) sum += layer_roof(g, k, bwd);
    return sum > 0 ? layer_roof(g, l, bwd) / sum : 1.0 / p->count;
}

/* Rows for the host-bound starts of one run: K_v by the simulator's issue rule with h = 1, E = end
 * of each node (its record's, or for a node without one the latest end among its dependencies);
 * a start is host-bound when it lies after the end of every dependency and of the previous node
 * on its stream: start = (K_v + 1) h + t0, columns cH and cO. */
static int host_rows(const struct ps_graph *g, const struct ps_order *order,
                     const struct ps_trace *meas, const uint32_t *rm, struct lsq *q, int cH,
                     int cO, uint32_t *n_host_bound)
{
    uint32_t nv = g->n_nodes;
    int nd = g->n_devices > 0 ? g->n_devices : 1, P = q->np;
    double *K = malloc(((size_t)nv + 1) * sizeof(double));
    double *E = malloc(((size_t)nv + 1) * sizeof(double));
    uint32_t *tlast = malloc(((size_t)nd + 1) * sizeof(uint32_t));
    uint32_t *slast = malloc(((size_t)g->n_streams + 1) * sizeof(uint32_t));
    int rc = K && E && tlast && slast ? 0 : -ENOMEM;
    for (int k = 0; !rc && k <= nd; k++) tlast[k] = PS_NONE;
    for (int32_t k = 0; !rc && k < g->n_streams; k++) slast[k] = PS_NONE;
    double span = ps_trace_makespan(meas);
    double tol = 1e-9 * (1.0 + span);
    for (uint32_t k = 0; !rc && k < order->n; k++) {
        uint32_t v = order->node[k];
        const struct ps_node *n = &g->nodes[v];
        int th = order->thread[k] >= 0 && order->thread[k] < nd ? order->thread[k] + 1 : 0;
        double iss = 0, dep = -INFINITY;
        if (tlast[th] != PS_NONE) iss = K[tlast[th]] + (g->nodes[tlast[th]].stream >= 0);
        for (uint32_t a = g->in_off[v]; a < g->in_off[v + 1]; a++) {
            const struct ps_edge *e = &g->edges[g->in_edge[a]];
            uint32_t u = e->src;
            if (order->pos[u] == UINT32_MAX || order->pos[u] >= k) continue;
            double iu = K[u] + (g->nodes[u].stream >= 0);
            if (iu > iss) iss = iu;
            if (e->kind != PS_EDGE_HOST && E[u] > dep) dep = E[u];
        }
        K[v] = iss;
        tlast[th] = v;
        if (n->stream >= 0) {
            uint32_t sp = slast[n->stream];
            if (sp != PS_NONE && E[sp] > dep) dep = E[sp];
            slast[n->stream] = v;
        }
        if (rm[v] == UINT32_MAX) {
            E[v] = dep;
            continue;
        }
        const struct ps_trace_rec *r = &meas->r[rm[v]];
        E[v] = r->start_us + r->dur_us;
        if (n->stream >= 0 && r->start_us > dep + tol) {
            double *row = lsq_row(q);
            if (!row) {
                rc = -ENOMEM;
                break;
            }
            row[cH] = iss + 1;
            row[cO] = 1;
            row[P] = r->start_us;
            (*n_host_bound)++;
        }
    }
    free(K);
    free(E);
    free(tlast);
    free(slast);
    return rc;
}

/* The weighted normal equations, iterated (IRLS towards least absolute deviations): pass 0 is
 * plain least squares; later passes weight each row by 1 / max(|residual|, 1e-6 |obs|), so a few
 * spikes of a shared CPU (page faults, preemption) do not drag a fit the way they drag a mean.
 * Exact data has residuals far below the floor: uniform weights, the least-squares solution at
 * every pass. x, used: q->np each; wt: q->n_rows, the final weights (max 1). Returns the rank or
 * -ENOMEM. */
static int irls_solve(const struct lsq *q, int passes, double *x, bool *used, double *wt)
{
    int P = q->np, rank = 0;
    double *A = calloc((size_t)P * (size_t)P, sizeof(double));
    double *bb = calloc((size_t)P, sizeof(double));
    double *xprev = calloc((size_t)P, sizeof(double));
    if (!A || !bb || !xprev) {
        rank = -ENOMEM;
        goto out;
    }
    for (uint32_t k = 0; k < q->n_rows; k++) wt[k] = 1;
    for (int pass = 0; pass < passes; pass++) {
        memset(A, 0, (size_t)P * (size_t)P * sizeof(double));
        memset(bb, 0, (size_t)P * sizeof(double));
        for (uint32_t k = 0; k < q->n_rows; k++) {
            const double *r = q->rows + (size_t)k * (size_t)(P + 1);
            for (int i = 0; i < P; i++) {
                if (r[i] == 0) continue;
                for (int j = 0; j < P; j++) A[i * P + j] += wt[k] * r[i] * r[j];
                bb[i] += wt[k] * r[i] * r[P];
            }
        }
        rank = ps_cholesky_solve(A, bb, P, 1e-10, x, used);
        if (rank < 0) goto out;
        if (pass + 1 == passes) break; /* the weights of this pass are the final ones */
        double wmax = 0, change = 0;
        for (uint32_t k = 0; k < q->n_rows; k++) {
            const double *r = q->rows + (size_t)k * (size_t)(P + 1);
            double p = 0;
            for (int i = 0; i < P; i++) p += r[i] * x[i];
            wt[k] = 1.0 / fmax(fabs(p - r[P]), 1e-6 * fabs(r[P]) + 1e-12);
            wmax = fmax(wmax, wt[k]);
        }
        for (uint32_t k = 0; k < q->n_rows; k++) wt[k] /= wmax;
        for (int i = 0; i < P; i++) {
            change = fmax(change, fabs(x[i] - xprev[i]) / fmax(fabs(x[i]), 1e-300));
            xprev[i] = x[i];
        }
        if (pass > 0 && change < 1e-12) break;
    }
out:
    free(A);
    free(bb);
    free(xprev);
    return rank;
}

int ps_calibrate(const struct ps_graph *g, const struct ps_order *order,
                 const struct ps_trace *meas, bool per_sample, struct ps_calib *out,
                 struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    if (!g->spec || !g->model)
        return ps_diag_set(diag, -EINVAL, "calibrate", "the graph has no spec and model");
    const struct ps_spec *spec = g->spec;
    int np_ = g->model->n_partitions;
    int P = 2 * np_ + PS_CAL__COUNT;
    int cU = 2 * np_ + PS_CAL_BANDWIDTH, cL = 2 * np_ + PS_CAL_LATENCY,
        cH = 2 * np_ + PS_CAL_LAUNCH, cO = 2 * np_ + PS_CAL_OFFSET;
    uint32_t nv = g->n_nodes;
    struct lsq q = {.np = P};
    uint32_t *rm = ps_compare_record_index(g, meas);
    double *x = calloc((size_t)P, sizeof(double));
    bool *used = calloc((size_t)P, sizeof(bool));
    int rc = 0;
    if (!rm || !x || !used) goto nomem;

    uint32_t n_task_rows = 0;
    /* durations */
    for (uint32_t v = 0; v < nv; v++) {
        if (rm[v] == UINT32_MAX) continue;
        const struct ps_node *n = &g->nodes[v];
        double dur = meas->r[rm[v]].dur_us;
        bool mb_ok = n->mb >= 0 && n->mb < g->m && g->mb_size && n->part >= 0 && n->part < np_;
        double s = mb_ok ? (double)g->mb_size[n->mb] : 0;
        double *r;
        if (n->kind == PS_NODE_COMPUTE && mb_ok) {
            int col = n->phase == PS_PHASE_FWD ? n->part : np_ + n->part;
            uint32_t wg;
            if (n->phase == PS_PHASE_BWD && has_wgrad(g, v, &wg)) {
                if (rm[wg] == UINT32_MAX) continue;
                dur += meas->r[rm[wg]].dur_us;
            }
            if (!(r = lsq_row(&q))) goto nomem;
            r[col] = s;
            r[P] = dur;
            n_task_rows++;
        } else if (n->kind == PS_NODE_RECOMPUTE && n->phase == PS_PHASE_BWD && mb_ok) {
            if (!(r = lsq_row(&q))) goto nomem;
            r[n->part] = s;
            r[P] = dur;
            n_task_rows++;
        } else if (n->kind == PS_NODE_COPY) {
            if (!(r = lsq_row(&q))) goto nomem;
            r[cU] = n->bytes;
            r[cL] = 1;
            r[P] = dur;
        }
    }
    if (!n_task_rows) {
        rc = ps_diag_set(diag, -EINVAL, "calibrate",
                         "the measured trace has no F, B or R task of the graph to fit");
        goto out;
    }
    rc = host_rows(g, order, meas, rm, &q, cH, cO, &out->n_host_bound);
    if (rc) goto nomem;
    double *wt = malloc(((size_t)q.n_rows + 1) * sizeof(double));
    int rank = wt ? irls_solve(&q, 30, x, used, wt) : -ENOMEM;
    free(wt);
    if (rank < 0) goto nomem;
    /* outliers for the report: rows the fit misses by more than half the observation */
    for (uint32_t k = 0; k < q.n_rows; k++) {
        const double *r = q.rows + (size_t)k * (size_t)(P + 1);
        double p = 0;
        for (int i = 0; i < P; i++) p += r[i] * x[i];
        out->n_trimmed += fabs(p - r[P]) > 0.5 * fabs(r[P]);
    }
    out->rank = (uint32_t)rank;
    out->n_obs = q.n_rows;
    out->n_params = (uint32_t)P;
    double ss = 0;
    for (uint32_t k = 0; k < q.n_rows; k++) {
        const double *r = q.rows + (size_t)k * (size_t)(P + 1);
        double p = 0;
        for (int i = 0; i < P; i++) p += r[i] * x[i];
        ss += (p - r[P]) * (p - r[P]);
    }
    out->rms_us = q.n_rows ? sqrt(ss / q.n_rows) : 0;

    /* results */
    out->n_parts = np_;
    out->part_fwd_us = malloc(((size_t)np_ + 1) * sizeof(double));
    out->part_bwd_us = malloc(((size_t)np_ + 1) * sizeof(double));
    if (!out->part_fwd_us || !out->part_bwd_us) goto nomem;
    for (int j = 0; j < np_; j++) {
        out->part_fwd_us[j] = used[j] ? fmax(x[j], 0) : NAN;
        out->part_bwd_us[j] = used[np_ + j] ? fmax(x[np_ + j], 0) : NAN;
    }
    out->fitted[PS_CAL_BANDWIDTH] = used[cU] && x[cU] > 0;
    out->value[PS_CAL_BANDWIDTH] = out->fitted[PS_CAL_BANDWIDTH] ? 1e6 / x[cU] : NAN;
    out->fitted[PS_CAL_LATENCY] = used[cL];
    out->value[PS_CAL_LATENCY] = used[cL] ? fmax(x[cL], 0) : NAN;
    out->fitted[PS_CAL_LAUNCH] = used[cH];
    out->value[PS_CAL_LAUNCH] = used[cH] ? fmax(x[cH], 0) : NAN;
    out->fitted[PS_CAL_OFFSET] = used[cO];
    out->value[PS_CAL_OFFSET] = used[cO] ? x[cO] : NAN;

    /* the costs file: per-layer shares of each partition's fit */
    struct ps_costs *c = calloc(1, sizeof(*c));
    if (!c) goto nomem;
    out->costs = c;
    c->per_sample = per_sample;
    c->micro_batch = (double)g->mb_size[0];
    double scale = per_sample ? 1.0 : c->micro_batch;
    c->n_layers = spec->n_layers;
    c->layers = calloc((size_t)c->n_layers, sizeof(*c->layers));
    if (!c->layers) goto nomem;
    for (int j = 0; j < np_; j++) {
        const struct ps_partition_info *p = &g->model->parts[j];
        for (int l = p->first; l < p->first + p->count; l++) {
            double shf = roof_share(g, p, l, false), shb = roof_share(g, p, l, true);
            /* not identifiable: the roofline's per-sample time */
            double f = isfinite(out->part_fwd_us[j]) ? out->part_fwd_us[j] * shf
                                                     : layer_roof(g, l, false) * 1e6;
            double b = isfinite(out->part_bwd_us[j]) ? out->part_bwd_us[j] * shb
                                                     : layer_roof(g, l, true) * 1e6;
            c->layers[l].forward_us = f * scale;
            c->layers[l].backward_us = b * scale;
            c->layers[l].wgrad_us = -1;
        }
    }
    c->copy_bandwidth = out->fitted[PS_CAL_BANDWIDTH] ? out->value[PS_CAL_BANDWIDTH] : -1;
    c->copy_latency_us = out->fitted[PS_CAL_LATENCY] ? out->value[PS_CAL_LATENCY] : -1;
    c->launch_overhead_us = out->fitted[PS_CAL_LAUNCH] ? out->value[PS_CAL_LAUNCH] : -1;
    /* optimizer steps: their mean per partition, when measured */
    uint32_t n_opt = 0;
    for (uint32_t v = 0; v < nv; v++) n_opt += g->nodes[v].kind == PS_NODE_OPTIM && rm[v] != UINT32_MAX;
    if (n_opt) {
        c->n_optimizer = np_;
        c->optimizer_us = calloc((size_t)np_ + 1, sizeof(double));
        double *cnt = calloc((size_t)np_ + 1, sizeof(double));
        if (!c->optimizer_us || !cnt) {
            free(cnt);
            goto nomem;
        }
        for (uint32_t v = 0; v < nv; v++) {
            const struct ps_node *n = &g->nodes[v];
            if (n->kind != PS_NODE_OPTIM || rm[v] == UINT32_MAX || n->part < 0 || n->part >= np_)
                continue;
            c->optimizer_us[n->part] += meas->r[rm[v]].dur_us;
            cnt[n->part]++;
        }
        for (int j = 0; j < np_; j++) c->optimizer_us[j] = cnt[j] ? c->optimizer_us[j] / cnt[j] : 0;
        free(cnt);
    }
    goto out;
nomem:
    rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
out:
    free(q.rows);
    free(rm);
    free(x);
    free(used);
    if (rc) ps_calib_finish(out);
    return rc;
}

void ps_calib_finish(struct ps_calib *c)
{
    if (!c) return;
    ps_costs_destroy(c->costs);
    free(c->part_fwd_us);
    free(c->part_bwd_us);
    memset(c, 0, sizeof(*c));
}

/* ---- several runs (calibrate.h) ----------------------------------------------------------- */

/* The inverse of the used block of the P x P matrix N (row-major, kept) into inv (P x P; rows
 * and columns of unused parameters 0). */
static int inverse_used(const double *N, int P, const bool *used, double *inv)
{
    double *A = malloc((size_t)P * (size_t)P * sizeof(double) + 1);
    double *e = malloc((size_t)P * sizeof(double) + 1), *y = malloc((size_t)P * sizeof(double) + 1);
    bool *u2 = malloc((size_t)P + 1);
    int rc = A && e && y && u2 ? 0 : -ENOMEM;
    memset(inv, 0, (size_t)P * (size_t)P * sizeof(double));
    for (int k = 0; k < P && !rc; k++) {
        if (!used[k]) continue;
        memcpy(A, N, (size_t)P * (size_t)P * sizeof(double));
        for (int i = 0; i < P; i++) e[i] = i == k;
        if (ps_cholesky_solve(A, e, P, 1e-10, y, u2) < 0) rc = -ENOMEM;
        for (int i = 0; i < P && !rc; i++) inv[i * P + k] = used[i] ? y[i] : 0;
    }
    free(A);
    free(e);
    free(y);
    free(u2);
    return rc;
}

int ps_calib_same_model(const struct ps_graph *g0, const struct ps_graph *g, struct ps_diag *diag)
{
    const struct ps_spec *spec = g0->spec;
    const char *name = g->spec && g->spec->path ? g->spec->path : "calibrate";
    const char *first = spec && spec->path ? spec->path : "the first run";
    if (!spec || !g0->model || !g->spec || !g->model)
        return ps_diag_set(diag, -EINVAL, name, "the graph has no spec and model");
    if (g->spec->n_layers != spec->n_layers)
        return ps_diag_set(diag, -EINVAL, name,
                           "model.layers: %d layers, the first run (%s) has %d: one cost model "
                           "is fitted to and predicts runs of the same model",
                           g->spec->n_layers, first, spec->n_layers);
    int np_ = g0->model->n_partitions;
    if (g->model->n_partitions != np_)
        return ps_diag_set(diag, -EINVAL, name,
                           "pipeline.balance: %d partitions, the first run (%s) has %d",
                           g->model->n_partitions, first, np_);
    for (int j = 0; j < np_; j++)
        if (g->model->parts[j].first != g0->model->parts[j].first ||
            g->model->parts[j].count != g0->model->parts[j].count)
            return ps_diag_set(diag, -EINVAL, name,
                               "pipeline.balance[%d]: %d layers, the first run (%s) has %d", j,
                               g->model->parts[j].count, first, g0->model->parts[j].count);
    return 0;
}

int ps_calibrate_runs(const struct ps_calib_run *runs, int n, enum ps_calib_loss loss,
                      struct ps_calib_fit *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    if (n < 1) return ps_diag_set(diag, -EINVAL, "calibrate", "no run to fit");
    const struct ps_graph *g0 = runs[0].g;
    if (!g0->spec || !g0->model)
        return ps_diag_set(diag, -EINVAL, "calibrate", "the graph has no spec and model");
    const struct ps_spec *spec = g0->spec;
    int np_ = g0->model->n_partitions;
    for (int r = 1; r < n; r++) {
        int rc = ps_calib_same_model(g0, runs[r].g, diag);
        if (rc) return rc;
    }
    /* columns: per-sample terms first (collinear fixed terms are the ones dropped) */
    int cFb = 0, cBb = np_, cFa = 2 * np_, cBa = 3 * np_, cU = 4 * np_, cL = cU + 1, cH = cU + 2,
        cRb = cU + 3, cRa = cRb + np_, cKb = cRa + np_, cKa = cKb + np_, cFc = cKa + np_,
        cBc = cFc + np_, cHb = cBc + np_, cPB = cHb + np_, cO = cPB + np_;
    int P = cO + n;
    struct lsq q = {.np = P};
    double *x = calloc((size_t)P, sizeof(double)), *wt = NULL, *N = NULL, *inv = NULL, *var = NULL;
    double *freev = NULL;
    bool *used = calloc((size_t)P, sizeof(bool)), *pinned = NULL;
    uint32_t *rm = NULL;
    uint8_t *rec = NULL, *first = NULL;
    int rc = 0;
    uint32_t n_task_rows = 0;
    if (!x || !used) goto nomem;
    for (int r = 0; r < n; r++) {
        const struct ps_graph *g = runs[r].g;
        const struct ps_trace *meas = runs[r].meas;
        free(rm);
        free(rec);
        free(first);
        rec = first = NULL;
        if (!(rm = ps_compare_record_index(g, meas)) || !(rec = ps_cost_recomputed(g)) ||
            !(first = ps_cost_first_backward(g, runs[r].order)))
            goto nomem;
        for (uint32_t v = 0; v < g->n_nodes; v++) {
            if (rm[v] == UINT32_MAX) continue;
            const struct ps_node *nd = &g->nodes[v];
            double dur = meas->r[rm[v]].dur_us;
            bool mb_ok = nd->mb >= 0 && nd->mb < g->m && g->mb_size && nd->part >= 0 &&
                         nd->part < np_;
            double s = mb_ok ? (double)g->mb_size[nd->mb] : 0;
            double *row;
            bool fwd = (nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_FWD) ||
                       (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD);
            if (mb_ok && (fwd || (nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_BWD))) {
                uint32_t wg;
                if (!fwd && has_wgrad(g, v, &wg)) {
                    if (rm[wg] == UINT32_MAX) continue;
                    dur += meas->r[rm[wg]].dur_us;
                }
                if (!(row = lsq_row(&q))) goto nomem;
                row[(fwd ? cFb : cBb) + nd->part] = s;
                row[(fwd ? cFa : cBa) + nd->part] = 1;
                if (nd->kind == PS_NODE_RECOMPUTE) {
                    row[cRb + nd->part] = s;
                    row[cRa + nd->part] = 1;
                }
                if (nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_FWD && nd->checkpointed) {
                    row[cKb + nd->part] = s;
                    row[cKa + nd->part] = 1;
                }
                if (!fwd && rec[(size_t)nd->mb * (size_t)g->n + (size_t)nd->part])
                    row[cHb + nd->part] = s;
                if (first[v]) row[cPB + nd->part] = s;
                row[P] = dur;
                n_task_rows++;
            } else if (nd->kind == PS_NODE_COPY) {
                if (!(row = lsq_row(&q))) goto nomem;
                row[cU] = nd->bytes;
                row[cL] = 1;
                row[P] = dur;
            }
        }
        if ((rc = host_rows(g, runs[r].order, meas, rm, &q, cH, cO + r, &out->n_host_bound)))
            goto nomem;
    }
    if (!n_task_rows) {
        rc = ps_diag_set(diag, -EINVAL, "calibrate",
                         "the measured traces have no F, B or R task of their graphs to fit");
        goto out;
    }
    if (!(wt = malloc(((size_t)q.n_rows + 1) * sizeof(double)))) goto nomem;
    /* fixed costs, the copy latency and the launch overhead cannot be negative: a column whose
       fit comes out negative is pinned at 0 (its entries cleared in every row) and the fit is
       redone without it, until none is (an active set: each round pins one more column, the
       most negative relative to its standard scale, so at most P rounds) */
    if (!(pinned = calloc((size_t)P, sizeof(bool))) || !(freev = malloc((size_t)P * sizeof(double))))
        goto nomem;
    int rank;
    for (int c = 0; c < P; c++) freev[c] = NAN;
    for (;;) {
        rank = irls_solve(&q, loss == PS_CAL_MEAN ? 1 : 30, x, used, wt);
        if (rank < 0) goto nomem;
        int worst = -1;
        for (int c = 0; c < P; c++) {
            bool cons = (c >= cFa && c < cU) || c == cL || c == cH || (c >= cFc && c < cHb) ||
                        (c >= cPB && c < cO);
            if (cons && used[c] && x[c] < 0 && (worst < 0 || x[c] < x[worst])) worst = c;
        }
        if (worst < 0) break;
        pinned[worst] = true;
        freev[worst] = x[worst];
        for (uint32_t k = 0; k < q.n_rows; k++) q.rows[(size_t)k * (size_t)(P + 1) + worst] = 0;
        /* a negative fixed F or B term: the partition's s^2 column comes in (s^2 from the
           row's per-sample entry) */
        int sq = -1, per = -1;
        if (worst >= cFa && worst < cFa + np_) sq = cFc + worst - cFa, per = cFb + worst - cFa;
        if (worst >= cBa && worst < cBa + np_) sq = cBc + worst - cBa, per = cBb + worst - cBa;
        if (sq >= 0 && !pinned[sq])
            for (uint32_t k = 0; k < q.n_rows; k++) {
                double *r = q.rows + (size_t)k * (size_t)(P + 1);
                r[sq] = r[per] * r[per];
            }
    }
    /* residuals, outliers and the covariance over the final weights: the sandwich
       (X'WX)^-1 (sum w^2 r^2 x x') (X'WX)^-1 x n / (n - rank), so rows of different kinds and
       scales (durations of us, starts of ms) each bring their own spread */
    N = calloc((size_t)P * (size_t)P, sizeof(double));
    inv = calloc((size_t)P * (size_t)P, sizeof(double));
    double *M = calloc((size_t)P * (size_t)P, sizeof(double));
    var = calloc((size_t)P, sizeof(double));
    if (!N || !inv || !M || !var) {
        free(M);
        goto nomem;
    }
    double ss = 0;
    for (uint32_t k = 0; k < q.n_rows; k++) {
        const double *r = q.rows + (size_t)k * (size_t)(P + 1);
        double p = 0;
        for (int i = 0; i < P; i++) p += r[i] * x[i];
        double e = p - r[P];
        ss += e * e;
        out->n_trimmed += fabs(e) > 0.5 * fabs(r[P]);
        for (int i = 0; i < P; i++) {
            if (r[i] == 0) continue;
            for (int j = 0; j < P; j++) {
                N[i * P + j] += wt[k] * r[i] * r[j];
                M[i * P + j] += wt[k] * wt[k] * e * e * r[i] * r[j];
            }
        }
    }
    if (inverse_used(N, P, used, inv)) {
        free(M);
        goto nomem;
    }
    double corr = q.n_rows > (uint32_t)rank ? (double)q.n_rows / (double)(q.n_rows - (uint32_t)rank) : 0;
    for (int i = 0; i < P; i++) {
        double v = 0;
        for (int a = 0; a < P && used[i]; a++) {
            if (inv[i * P + a] == 0) continue;
            for (int b = 0; b < P; b++) v += inv[i * P + a] * M[a * P + b] * inv[b * P + i];
        }
        var[i] = used[i] ? fmax(v * corr, 0) : NAN;
    }
    free(M);
    out->n_obs = q.n_rows;
    out->n_params = (uint32_t)P;
    out->rank = (uint32_t)rank;
    out->rms_us = sqrt(ss / q.n_rows);
    out->n_parts = np_;
    out->n_runs = n;
    for (int t = 0; t < PS_CALT__COUNT; t++) {
        out->term[t] = malloc(((size_t)np_ + 1) * sizeof(double));
        out->term_sd[t] = malloc(((size_t)np_ + 1) * sizeof(double));
        out->term_free[t] = malloc(((size_t)np_ + 1) * sizeof(double));
        if (!out->term[t] || !out->term_sd[t] || !out->term_free[t]) goto nomem;
        for (int j = 0; j < np_; j++) {
            int c = t == PS_CALT_FWD_FIXED    ? cFa + j
                    : t == PS_CALT_FWD_SAMPLE ? cFb + j
                    : t == PS_CALT_BWD_FIXED  ? cBa + j
                    : t == PS_CALT_BWD_SAMPLE ? cBb + j
                    : t == PS_CALT_REC_FIXED  ? cRa + j
                    : t == PS_CALT_REC_SAMPLE ? cRb + j
                    : t == PS_CALT_CKPT_FIXED ? cKa + j
                    : t == PS_CALT_CKPT_SAMPLE ? cKb + j
                    : t == PS_CALT_FWD_SQ     ? cFc + j
                    : t == PS_CALT_BWD_SQ     ? cBc + j
                    : t == PS_CALT_BREC_SAMPLE ? cHb + j
                                              : cPB + j;
            bool sqt = t == PS_CALT_FWD_SQ || t == PS_CALT_BWD_SQ; /* not brought in: 0 */
            out->term[t][j] = used[c] ? x[c] : pinned[c] || sqt ? 0 : NAN;
            out->term_sd[t][j] = used[c] ? sqrt(var[c]) : pinned[c] || sqt ? 0 : NAN;
            out->term_free[t][j] = freev[c];
        }
    }
    int cpar[PS_CAL_OFFSET] = {cU, cL, cH};
    for (int k = 0; k < PS_CAL_OFFSET; k++) {
        int c = cpar[k];
        out->fitted[k] = (used[c] || pinned[c]) && (k != PS_CAL_BANDWIDTH || x[c] > 0);
        out->free_value[k] = freev[c];
        double sd = used[c] ? sqrt(var[c]) : pinned[c] ? 0 : NAN;
        if (k == PS_CAL_BANDWIDTH) {
            out->value[k] = out->fitted[k] ? 1e6 / x[c] : NAN;
            out->sd[k] = out->fitted[k] ? 1e6 * sd / (x[c] * x[c]) : NAN;
        } else {
            out->value[k] = out->fitted[k] ? fmax(x[c], 0) : NAN;
            out->sd[k] = sd;
        }
    }
    /* the costs file: per-sample terms split by roofline shares, fixed terms in equal parts;
       a negative fitted term (noise around 0) is clamped to 0, a term not identifiable is 0
       (fixed) or the roofline (per sample) */
    struct ps_costs *c = calloc(1, sizeof(*c));
    if (!c) goto nomem;
    out->costs = c;
    c->per_sample = true;
    c->micro_batch = 1;
    /* the s^2 terms (when there are any) hold between the sizes they were fitted at, no
       further: a curvature read from two or three sizes says nothing past the largest
       (sim/COSTS.md) */
    bool any_sq = false;
    for (int j = 0; j < np_; j++)
        any_sq |= out->term[PS_CALT_FWD_SQ][j] > 0 || out->term[PS_CALT_BWD_SQ][j] > 0;
    for (int r = 0; any_sq && r < n; r++)
        for (int i = 0; runs[r].g->mb_size && i < runs[r].g->m; i++)
            c->sq_max_scale = fmax(c->sq_max_scale, (double)runs[r].g->mb_size[i]);
    c->n_layers = spec->n_layers;
    c->layers = calloc((size_t)c->n_layers, sizeof(*c->layers));
    if (!c->layers) goto nomem;
    for (int j = 0; j < np_; j++) {
        const struct ps_partition_info *p = &g0->model->parts[j];
        for (int l = p->first; l < p->first + p->count; l++) {
            double shf = roof_share(g0, p, l, false), shb = roof_share(g0, p, l, true);
            double fb = out->term[PS_CALT_FWD_SAMPLE][j], bb = out->term[PS_CALT_BWD_SAMPLE][j];
            double fa = out->term[PS_CALT_FWD_FIXED][j], ba = out->term[PS_CALT_BWD_FIXED][j];
            struct ps_cost_layer *L = &c->layers[l];
            L->forward_us = isfinite(fb) ? fmax(fb, 0) * shf : layer_roof(g0, l, false) * 1e6;
            L->backward_us = isfinite(bb) ? fmax(bb, 0) * shb : layer_roof(g0, l, true) * 1e6;
            L->forward_fixed_us = isfinite(fa) ? fmax(fa, 0) / p->count : 0;
            L->backward_fixed_us = isfinite(ba) ? fmax(ba, 0) / p->count : 0;
            L->forward_sq_us = fmax(out->term[PS_CALT_FWD_SQ][j], 0) * shf;
            L->backward_sq_us = fmax(out->term[PS_CALT_BWD_SQ][j], 0) * shb;
            L->wgrad_us = -1;
            double kb = out->term[PS_CALT_CKPT_SAMPLE][j], ka = out->term[PS_CALT_CKPT_FIXED][j];
            if (isfinite(kb) || isfinite(ka)) {
                L->checkpointed_set = true;
                L->checkpointed_us = isfinite(fb) ? fmax(fb + (isfinite(kb) ? kb : 0), 0) * shf
                                                  : L->forward_us;
                L->checkpointed_fixed_us =
                    isfinite(fa) ? fmax(fa + (isfinite(ka) ? ka : 0), 0) / p->count
                                 : L->forward_fixed_us;
            }
            double pb = out->term[PS_CALT_FIRST_B][j];
            L->first_backward_us = isfinite(pb) ? fmax(pb, 0) * shb : 0;
            double hb = out->term[PS_CALT_BREC_SAMPLE][j];
            if (isfinite(hb)) {
                L->backward_recomputed_set = true;
                L->backward_recomputed_us = isfinite(bb) ? fmax(bb + hb, 0) * shb : L->backward_us;
            }
            double rb = out->term[PS_CALT_REC_SAMPLE][j], ra = out->term[PS_CALT_REC_FIXED][j];
            if (isfinite(rb) || isfinite(ra)) {
                L->recompute_set = true;
                L->recompute_us = isfinite(fb) ? fmax(fb + (isfinite(rb) ? rb : 0), 0) * shf
                                               : L->forward_us;
                L->recompute_fixed_us =
                    isfinite(fa) ? fmax(fa + (isfinite(ra) ? ra : 0), 0) / p->count
                                 : L->forward_fixed_us;
            }
        }
    }
    c->copy_bandwidth = out->fitted[PS_CAL_BANDWIDTH] ? out->value[PS_CAL_BANDWIDTH] : -1;
    c->copy_latency_us = out->fitted[PS_CAL_LATENCY] ? out->value[PS_CAL_LATENCY] : -1;
    c->launch_overhead_us = out->fitted[PS_CAL_LAUNCH] ? out->value[PS_CAL_LAUNCH] : -1;
    goto out;
nomem:
    rc = ps_diag_set(diag, -ENOMEM, "calibrate", "out of memory");
out:
    free(q.rows);
    free(rm);
    free(rec);
    free(first);
    free(x);
    free(used);
    free(wt);
    free(N);
    free(inv);
    free(var);
    free(pinned);
    free(freev);
    if (rc) ps_calib_fit_finish(out);
    return rc;
}

void ps_calib_fit_finish(struct ps_calib_fit *f)
{
    if (!f) return;
    ps_costs_destroy(f->costs);
    for (int t = 0; t < PS_CALT__COUNT; t++) {
        free(f->term[t]);
        free(f->term_sd[t]);
        free(f->term_free[t]);
    }
    memset(f, 0, sizeof(*f));
}
