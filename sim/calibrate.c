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
    double *K = malloc(((size_t)nv + 1) * sizeof(double));
    double *E = malloc(((size_t)nv + 1) * sizeof(double));
    double *A = calloc((size_t)P * (size_t)P, sizeof(double));
    double *bb = calloc((size_t)P, sizeof(double));
    double *x = calloc((size_t)P, sizeof(double));
    bool *used = calloc((size_t)P, sizeof(bool));
    int nd = g->n_devices > 0 ? g->n_devices : 1;
    uint32_t *tlast = malloc(((size_t)nd + 1) * sizeof(uint32_t));
    uint32_t *slast = malloc(((size_t)g->n_streams + 1) * sizeof(uint32_t));
    int rc = 0;
    if (!rm || !K || !E || !A || !bb || !x || !used || !tlast || !slast) goto nomem;

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
    /* host-bound starts: K_v by the simulator's issue rule with h = 1, E = end of each node
       (its record's, or for a node without one the latest end among its dependencies) */
    for (int k = 0; k <= nd; k++) tlast[k] = PS_NONE;
    for (int32_t k = 0; k < g->n_streams; k++) slast[k] = PS_NONE;
    double span = ps_trace_makespan(meas);
    double tol = 1e-9 * (1.0 + span);
    for (uint32_t k = 0; k < order->n; k++) {
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
            double *row = lsq_row(&q);
            if (!row) goto nomem;
            row[cH] = iss + 1;
            row[cO] = 1;
            row[P] = r->start_us;
            out->n_host_bound++;
        }
    }
    /* weighted normal equations, iterated (IRLS towards least absolute deviations): pass 0 is
       plain least squares; later passes weight each row by 1 / max(|residual|, 1e-6 |obs|), so
       a few spikes of a shared CPU (page faults, preemption) do not drag a partition's fit the
       way they drag a mean. Exact data has residuals far below the floor: uniform weights, the
       least-squares solution at every pass. */
    int rank = 0;
    double *wt = malloc(((size_t)q.n_rows + 1) * sizeof(double));
    double *xprev = calloc((size_t)P, sizeof(double));
    if (!wt || !xprev) {
        free(wt);
        free(xprev);
        goto nomem;
    }
    for (uint32_t k = 0; k < q.n_rows; k++) wt[k] = 1;
    for (int pass = 0; pass < 30; pass++) {
        memset(A, 0, (size_t)P * (size_t)P * sizeof(double));
        memset(bb, 0, (size_t)P * sizeof(double));
        for (uint32_t k = 0; k < q.n_rows; k++) {
            const double *r = q.rows + (size_t)k * (size_t)(P + 1);
            for (int i = 0; i < P; i++) {
                if (r[i] == 0) continue;
                for (int j = 0; j < P; j++) A[i * P + j] += wt[k] * r[i] * r[j];
                bb[i] += wt[k] * r[i] * r[P];
            }
        }
        rank = ps_cholesky_solve(A, bb, P, 1e-10, x, used);
        if (rank < 0) {
            free(wt);
            free(xprev);
            goto nomem;
        }
        double wmax = 0, change = 0;
        for (uint32_t k = 0; k < q.n_rows; k++) {
            const double *r = q.rows + (size_t)k * (size_t)(P + 1);
            double p = 0;
            for (int i = 0; i < P; i++) p += r[i] * x[i];
            wt[k] = 1.0 / fmax(fabs(p - r[P]), 1e-6 * fabs(r[P]) + 1e-12);
            wmax = fmax(wmax, wt[k]);
        }
        for (uint32_t k = 0; k < q.n_rows; k++) wt[k] /= wmax;
        for (int i = 0; i < P; i++) {
            change = fmax(change, fabs(x[i] - xprev[i]) / fmax(fabs(x[i]), 1e-300));
            xprev[i] = x[i];
        }
        if (pass > 0 && change < 1e-12) break;
    }
    free(xprev);
    free(wt);
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
        double sf = 0, sb = 0;
        for (int l = p->first; l < p->first + p->count; l++)
            sf += layer_roof(g, l, false), sb += layer_roof(g, l, true);
        for (int l = p->first; l < p->first + p->count; l++) {
            double shf = sf > 0 ? layer_roof(g, l, false) / sf : 1.0 / p->count;
            double shb = sb > 0 ? layer_roof(g, l, true) / sb : 1.0 / p->count;
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
    free(K);
    free(E);
    free(A);
    free(bb);
    free(x);
    free(used);
    free(tlast);
    free(slast);
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
