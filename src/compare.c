/* compare: measured vs simulated timelines on one graph, and calibration of the cost model
 * (definitions in compare.h).
 *
 * Invariants:
 *   C1. tasks[] is in node order and holds every F/B/R/Wg or copy node with a record in either
 *       trace; statistics use the tasks recorded in both (F/B/R/Wg only).
 *   C2. each trace is measured on its own clock (0 = first aligned record), so a constant
 *       offset between the two never shows up as an error.
 *   C3. results are deterministic: ties in sorts break on the node id.
 */
#include "src/compare.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model.h"

#define DEP_SLACK_US 0.002

/* ---- helpers -------------------------------------------------------------------------------- */

/* first record of each node, UINT32_MAX when none */
static uint32_t *index_records(const struct ps_graph *g, const struct ps_trace *t)
{
    uint32_t *ix = malloc(((size_t)g->n_nodes + 1) * sizeof(uint32_t));
    if (!ix) return NULL;
    for (uint32_t v = 0; v < g->n_nodes; v++) ix[v] = UINT32_MAX;
    for (uint32_t k = 0; k < t->n; k++) {
        const struct ps_trace_rec *r = &t->r[k];
        if (r->node < g->n_nodes && ix[r->node] == UINT32_MAX && isfinite(r->start_us) &&
            isfinite(r->dur_us))
            ix[r->node] = k;
    }
    return ix;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct ival {
    double a, b;
};

static int cmp_ival(const void *x, const void *y)
{
    const struct ival *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

/* merges sorted intervals in place; returns the count */
static uint32_t merge_ivals(struct ival *v, uint32_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof(*v), cmp_ival);
    uint32_t w = 0;
    for (uint32_t k = 1; k < n; k++) {
        if (v[k].a <= v[w].b) {
            if (v[k].b > v[w].b) v[w].b = v[k].b;
        } else {
            v[++w] = v[k];
        }
    }
    return w + 1;
}

static double ivals_len(const struct ival *v, uint32_t n)
{
    double s = 0;
    for (uint32_t k = 0; k < n; k++) s += v[k].b - v[k].a;
    return s;
}

/* length of [a,b) covered by the merged intervals u[0..n) */
static double covered(const struct ival *u, uint32_t n, double a, double b)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) { /* first interval ending after a */
        uint32_t mid = lo + (hi - lo) / 2;
        if (u[mid].b <= a) lo = mid + 1;
        else hi = mid;
    }
    double s = 0;
    for (uint32_t k = lo; k < n && u[k].a < b; k++) {
        double x = u[k].a > a ? u[k].a : a, y = u[k].b < b ? u[k].b : b;
        if (y > x) s += y - x;
    }
    return s;
}

static bool is_compute_rec(const struct ps_graph *g, const struct ps_node *nd)
{
    return nd->stream >= 0 && nd->stream < g->n_streams &&
           g->streams[nd->stream].kind == PS_STREAM_COMPUTE;
}

/* ---- per-trace figures: bubble, recompute overhead, copy overlap ---------------------------- */

struct trace_figs {
    double *busy;      /* per device */
    uint32_t *n;       /* compute records per device */
    double recompute_overhead, copy_us, copy_overlap;
};

static int trace_figures(const struct ps_graph *g, const struct ps_trace *t, double t0,
                         struct trace_figs *out)
{
    int nd = g->n_devices > 0 ? g->n_devices : 1;
    struct ival *all = malloc(((size_t)t->n + 1) * sizeof(*all));
    struct ival *dev = malloc(((size_t)t->n + 1) * sizeof(*dev));
    out->busy = calloc((size_t)nd, sizeof(double));
    out->n = calloc((size_t)nd, sizeof(uint32_t));
    if (!all || !dev || !out->busy || !out->n) {
        free(all);
        free(dev);
        return -ENOMEM;
    }
    double f = 0, b = 0, r = 0, copy = 0;
    uint32_t na = 0;
    for (int d = 0; d < nd; d++) {
        uint32_t n = 0;
        for (uint32_t k = 0; k < t->n; k++) {
            const struct ps_trace_rec *x = &t->r[k];
            if (x->node >= g->n_nodes || !isfinite(x->start_us) || !isfinite(x->dur_us)) continue;
            const struct ps_node *nn = &g->nodes[x->node];
            int nd_dev = nn->device >= 0 && nn->device < nd ? nn->device : 0;
            if (nd_dev != d || !is_compute_rec(g, nn)) continue;
            dev[n++] = (struct ival){x->start_us - t0, x->start_us - t0 + x->dur_us};
            all[na++] = dev[n - 1];
            out->n[d] += x->dur_us > 0;
        }
        out->busy[d] = ivals_len(dev, merge_ivals(dev, n));
    }
    uint32_t nu = merge_ivals(all, na);
    double over = 0;
    for (uint32_t k = 0; k < t->n; k++) {
        const struct ps_trace_rec *x = &t->r[k];
        if (x->node >= g->n_nodes || !isfinite(x->start_us) || !isfinite(x->dur_us)) continue;
        const struct ps_node *nn = &g->nodes[x->node];
        switch ((enum ps_node_kind)nn->kind) {
        case PS_NODE_COMPUTE:
            if (nn->phase == PS_PHASE_FWD) f += x->dur_us;
            else b += x->dur_us;
            break;
        case PS_NODE_WGRAD: b += x->dur_us; break;
        case PS_NODE_RECOMPUTE:
            if (nn->phase == PS_PHASE_BWD) r += x->dur_us;
            break;
        case PS_NODE_COPY:
            copy += x->dur_us;
            over += covered(all, nu, x->start_us - t0, x->start_us - t0 + x->dur_us);
            break;
        default: break;
        }
    }
    out->recompute_overhead = f + b > 0 ? r / (f + b) : NAN;
    out->copy_us = copy;
    out->copy_overlap = copy > 0 ? over / copy : NAN;
    free(all);
    free(dev);
    return 0;
}

/* ---- order inversions ----------------------------------------------------------------------- */

static uint64_t count_inversions(double *a, double *tmp, uint32_t n)
{
    if (n < 2) return 0;
    uint32_t h = n / 2;
    uint64_t c = count_inversions(a, tmp, h) + count_inversions(a + h, tmp, n - h);
    uint32_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (a[j] < a[i]) {
            c += h - i;
            tmp[k++] = a[j++];
        } else {
            tmp[k++] = a[i++];
        }
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof(double));
    return c;
}

struct by_sim {
    const struct ps_compare_task *t;
    uint32_t k;
};

static int cmp_by_sim(const void *x, const void *y)
{
    const struct by_sim *p = x, *q = y;
    const struct ps_compare_task *a = &p->t[p->k], *b = &q->t[q->k];
    if (a->sim_start != b->sim_start) return a->sim_start < b->sim_start ? -1 : 1;
    double ea = a->sim_start + a->sim_dur, eb = b->sim_start + b->sim_dur;
    if (ea != eb) return ea < eb ? -1 : 1;
    return a->node < b->node ? -1 : a->node > b->node;
}

static int inversions(const struct ps_graph *g, struct ps_compare *c)
{
    int32_t ns = g->n_streams;
    uint32_t *cnt = calloc((size_t)ns + 1, sizeof(uint32_t));
    struct by_sim *list = malloc(((size_t)c->n_tasks + 1) * sizeof(*list));
    double *seq = malloc(((size_t)c->n_tasks + 1) * sizeof(double));
    double *tmp = malloc(((size_t)c->n_tasks + 1) * sizeof(double));
    int rc = 0;
    if (!cnt || !list || !seq || !tmp) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t k = 0; k < c->n_tasks; k++) {
        const struct ps_compare_task *t = &c->tasks[k];
        int32_t s = g->nodes[t->node].stream;
        if (s >= 0 && s < ns && isfinite(t->start_err)) cnt[s]++;
    }
    for (int32_t s = 0; s < ns; s++) c->n_streams += cnt[s] > 0;
    c->streams = calloc((size_t)c->n_streams + 1, sizeof(*c->streams));
    if (!c->streams) {
        rc = -ENOMEM;
        goto out;
    }
    uint32_t w = 0;
    for (int32_t s = 0; s < ns; s++) {
        if (!cnt[s]) continue;
        uint32_t n = 0;
        for (uint32_t k = 0; k < c->n_tasks; k++)
            if (g->nodes[c->tasks[k].node].stream == s && isfinite(c->tasks[k].start_err))
                list[n++] = (struct by_sim){c->tasks, k};
        qsort(list, n, sizeof(*list), cmp_by_sim);
        for (uint32_t k = 0; k < n; k++) seq[k] = c->tasks[list[k].k].meas_start;
        struct ps_compare_stream *st = &c->streams[w++];
        st->stream = s;
        st->n_tasks = n;
        st->pairs = (uint64_t)n * (n - 1) / 2;
        st->inversions = count_inversions(seq, tmp, n);
        c->inversions += st->inversions;
        c->pairs += st->pairs;
    }
out:
    free(cnt);
    free(list);
    free(seq);
    free(tmp);
    return rc;
}

/* ---- dependency violations in the measurement ----------------------------------------------- */

static int dependencies(const struct ps_graph *g, const struct ps_trace *m, const uint32_t *rm,
                        struct ps_compare *c)
{
    uint32_t nv = g->n_nodes;
    uint32_t *seen = calloc((size_t)nv + 1, sizeof(uint32_t));
    uint32_t *queue = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    if (!seen || !queue) {
        free(seen);
        free(queue);
        return -ENOMEM;
    }
    for (uint32_t u = 0; u < nv; u++) {
        if (rm[u] == UINT32_MAX) continue;
        const struct ps_trace_rec *ru = &m->r[rm[u]];
        double end = ru->start_us + ru->dur_us;
        uint32_t qh = 0, qt = 0;
        queue[qt++] = u;
        seen[u] = u + 1;
        while (qh < qt) {
            uint32_t x = queue[qh++];
            for (uint32_t a = g->out_off[x]; a < g->out_off[x + 1]; a++) {
                const struct ps_edge *e = &g->edges[g->out_edge[a]];
                if (e->kind != PS_EDGE_DATA && e->kind != PS_EDGE_PHONY) continue;
                uint32_t w = e->dst;
                if (seen[w] == u + 1) continue;
                seen[w] = u + 1;
                if (rm[w] == UINT32_MAX) {
                    queue[qt++] = w;
                    continue;
                }
                c->n_deps_checked++;
                double early = end - m->r[rm[w]].start_us;
                if (early <= DEP_SLACK_US) continue;
                c->n_dep_violations++;
                if (c->n_deps_kept < PS_COMPARE_MAX_DEPS)
                    c->deps[c->n_deps_kept++] = (struct ps_compare_dep){u, w, early};
            }
        }
    }
    free(seen);
    free(queue);
    return 0;
}

/* ---- statistics ----------------------------------------------------------------------------- */

enum which { W_START, W_DUR, W_REL };

static double err_of(const struct ps_compare_task *t, enum which w)
{
    return w == W_START ? t->start_err : w == W_DUR ? t->dur_err : t->dur_rel;
}

static _Thread_local const struct ps_compare_task *stat_tasks;
static _Thread_local enum which stat_which;

static int cmp_worst(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    double ea = fabs(err_of(&stat_tasks[a], stat_which)), eb = fabs(err_of(&stat_tasks[b], stat_which));
    if (ea != eb) return ea > eb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int stat(const struct ps_graph *g, struct ps_compare *c, enum which w,
                struct ps_compare_stat *s)
{
    double *v = malloc(((size_t)c->n_tasks + 1) * sizeof(double));
    uint32_t *ix = malloc(((size_t)c->n_tasks + 1) * sizeof(uint32_t));
    if (!v || !ix) {
        free(v);
        free(ix);
        return -ENOMEM;
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < c->n_tasks; k++) {
        double e = err_of(&c->tasks[k], w);
        if (!isfinite(e) || !ps_node_is_task(&g->nodes[c->tasks[k].node])) continue;
        v[n] = fabs(e);
        ix[n++] = k;
    }
    memset(s, 0, sizeof(*s));
    s->n = n;
    s->median = s->p95 = s->max = NAN;
    if (n) {
        qsort(v, n, sizeof(double), cmp_double);
        s->median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        uint32_t r = (uint32_t)ceil(0.95 * n);
        s->p95 = v[(r ? r : 1) - 1];
        s->max = v[n - 1];
        stat_tasks = c->tasks;
        stat_which = w;
        qsort(ix, n, sizeof(uint32_t), cmp_worst);
        s->n_worst = n < PS_COMPARE_WORST ? n : PS_COMPARE_WORST;
        memcpy(s->worst, ix, s->n_worst * sizeof(uint32_t));
    }
    free(v);
    free(ix);
    return 0;
}

/* ---- the comparison ------------------------------------------------------------------------- */

int ps_compare_run(const struct ps_graph *g, const struct ps_trace *sim,
                   const struct ps_trace *meas, struct ps_compare *c, struct ps_diag *diag)
{
    memset(c, 0, sizeof(*c));
    uint32_t *rs = index_records(g, sim), *rm = index_records(g, meas);
    struct trace_figs fs = {0}, fm = {0};
    int rc = 0;
    if (!rs || !rm) goto nomem;
    /* C2: clocks and makespans over the aligned records */
    double s0 = INFINITY, s1 = -INFINITY, m0 = INFINITY, m1 = -INFINITY;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        if (rs[v] == UINT32_MAX || rm[v] == UINT32_MAX) continue;
        const struct ps_trace_rec *a = &sim->r[rs[v]], *b = &meas->r[rm[v]];
        c->n_aligned++;
        s0 = fmin(s0, a->start_us), s1 = fmax(s1, a->start_us + a->dur_us);
        m0 = fmin(m0, b->start_us), m1 = fmax(m1, b->start_us + b->dur_us);
    }
    if (!c->n_aligned) {
        rc = ps_diag_set(diag, -EINVAL, "compare",
                         "no task is in both traces (the simulated trace has %u records, the "
                         "measured one %u)",
                         sim->n, meas->n);
        ps_diag_hint(diag, "both traces must come from the same spec");
        goto out;
    }
    c->sim_makespan_us = s1 - s0;
    c->meas_makespan_us = m1 - m0;
    c->makespan_error = c->meas_makespan_us > 0
                            ? (c->meas_makespan_us - c->sim_makespan_us) / c->meas_makespan_us
                            : NAN;
    /* C1: tasks */
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        bool kind = ps_node_is_task(nd) || nd->kind == PS_NODE_COPY;
        if (kind && (rs[v] != UINT32_MAX || rm[v] != UINT32_MAX)) c->n_tasks++;
        if (ps_node_is_task(nd) && (rs[v] == UINT32_MAX) != (rm[v] == UINT32_MAX)) {
            if (rs[v] == UINT32_MAX) c->n_meas_only++;
            else c->n_sim_only++;
        }
    }
    for (uint32_t k = 0; k < meas->n; k++) c->n_unmatched += meas->r[k].node >= g->n_nodes;
    c->tasks = calloc((size_t)c->n_tasks + 1, sizeof(*c->tasks));
    if (!c->tasks) goto nomem;
    uint32_t w = 0;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (!(ps_node_is_task(nd) || nd->kind == PS_NODE_COPY)) continue;
        if (rs[v] == UINT32_MAX && rm[v] == UINT32_MAX) continue;
        struct ps_compare_task *t = &c->tasks[w++];
        t->node = v;
        t->sim_start = t->sim_dur = t->meas_start = t->meas_dur = NAN;
        t->start_err = t->dur_err = t->dur_rel = NAN;
        if (rs[v] != UINT32_MAX)
            t->sim_start = sim->r[rs[v]].start_us - s0, t->sim_dur = sim->r[rs[v]].dur_us;
        if (rm[v] != UINT32_MAX)
            t->meas_start = meas->r[rm[v]].start_us - m0, t->meas_dur = meas->r[rm[v]].dur_us;
        if (rs[v] != UINT32_MAX && rm[v] != UINT32_MAX) {
            t->start_err = t->meas_start - t->sim_start;
            t->dur_err = t->meas_dur - t->sim_dur;
            if (t->meas_dur > 0) t->dur_rel = t->dur_err / t->meas_dur;
        }
    }
    if (stat(g, c, W_START, &c->start) || stat(g, c, W_DUR, &c->dur) ||
        stat(g, c, W_REL, &c->dur_rel) || inversions(g, c) || dependencies(g, meas, rm, c))
        goto nomem;
    if (trace_figures(g, sim, s0, &fs) || trace_figures(g, meas, m0, &fm)) goto nomem;
    c->n_devices = g->n_devices > 0 ? g->n_devices : 1;
    c->dev = calloc((size_t)c->n_devices, sizeof(*c->dev));
    if (!c->dev) goto nomem;
    for (int d = 0; d < c->n_devices; d++) {
        struct ps_compare_device *x = &c->dev[d];
        x->sim_busy_us = fs.busy[d];
        x->meas_busy_us = fm.busy[d];
        x->sim_n = fs.n[d];
        x->meas_n = fm.n[d];
        x->sim_bubble = c->sim_makespan_us > 0 ? 1 - fs.busy[d] / c->sim_makespan_us : NAN;
        x->meas_bubble = c->meas_makespan_us > 0 ? 1 - fm.busy[d] / c->meas_makespan_us : NAN;
    }
    c->sim_recompute_overhead = fs.recompute_overhead;
    c->meas_recompute_overhead = fm.recompute_overhead;
    c->sim_copy_us = fs.copy_us;
    c->meas_copy_us = fm.copy_us;
    c->sim_copy_overlap = fs.copy_overlap;
    c->meas_copy_overlap = fm.copy_overlap;
    goto out;
nomem:
    rc = ps_diag_set(diag, -ENOMEM, "compare", "out of memory");
out:
    free(fs.busy);
    free(fs.n);
    free(fm.busy);
    free(fm.n);
    free(rs);
    free(rm);
    if (rc) ps_compare_finish(c);
    return rc;
}

void ps_compare_finish(struct ps_compare *c)
{
    if (!c) return;
    free(c->tasks);
    free(c->streams);
    free(c->dev);
    memset(c, 0, sizeof(*c));
}

double *ps_compare_node_errors(const struct ps_compare *c, const struct ps_graph *g)
{
    double *v = malloc(((size_t)g->n_nodes + 1) * sizeof(double));
    if (!v) return NULL;
    for (uint32_t k = 0; k < g->n_nodes; k++) v[k] = NAN;
    for (uint32_t k = 0; k < c->n_tasks; k++) v[c->tasks[k].node] = c->tasks[k].dur_rel;
    return v;
}

/* ---- tolerances ----------------------------------------------------------------------------- */

void ps_tolerance_init(struct ps_tolerance *t)
{
    t->makespan = 0.2;
    t->task = 0.5;
    t->start = -1;
}

int ps_tolerance_parse(const char *s, struct ps_tolerance *t, struct ps_diag *diag)
{
    const char *p = s;
    if (!*p) return ps_diag_set(diag, -EINVAL, "--tolerance", "empty (expected makespan=0.2,task=0.5)");
    while (*p) {
        const char *eq = strchr(p, '=');
        const char *comma = strchr(p, ',');
        if (!comma) comma = p + strlen(p);
        if (!eq || eq > comma)
            return ps_diag_set(diag, -EINVAL, "--tolerance",
                               "'%.*s': expected NAME=VALUE (makespan, task or start)",
                               (int)(comma - p), p);
        char *end;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (end != comma || errno || !isfinite(v) || v < 0)
            return ps_diag_set(diag, -EINVAL, "--tolerance",
                               "'%.*s': expected a number >= 0 (a relative error, 0.2 = 20%%)",
                               (int)(comma - p), p);
        size_t n = (size_t)(eq - p);
        if (n == 8 && !strncmp(p, "makespan", n)) t->makespan = v;
        else if (n == 4 && !strncmp(p, "task", n)) t->task = v;
        else if (n == 5 && !strncmp(p, "start", n)) t->start = v;
        else
            return ps_diag_set(diag, -EINVAL, "--tolerance",
                               "unknown limit '%.*s' (expected makespan, task or start)", (int)n, p);
        p = *comma ? comma + 1 : comma;
    }
    return 0;
}

static void append(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *why, size_t len, const char *fmt, ...)
{
    if (!why || !len) return;
    size_t used = strlen(why);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, len - used, fmt, ap);
    va_end(ap);
}

int ps_compare_check(const struct ps_compare *c, const struct ps_tolerance *t, char *why,
                     size_t len)
{
    int n = 0;
    if (why && len) why[0] = '\0';
    if (t->makespan >= 0 && isfinite(c->makespan_error) && fabs(c->makespan_error) > t->makespan) {
        n++;
        append(why, len, "makespan error %+.1f%% exceeds the tolerance of %.1f%%\n",
               100 * c->makespan_error, 100 * t->makespan);
    }
    if (t->task >= 0 && c->dur_rel.n && c->dur_rel.p95 > t->task) {
        n++;
        append(why, len, "task duration error p95 %.1f%% exceeds the tolerance of %.1f%%\n",
               100 * c->dur_rel.p95, 100 * t->task);
    }
    if (t->start >= 0 && c->start.n && c->meas_makespan_us > 0 &&
        c->start.p95 / c->meas_makespan_us > t->start) {
        n++;
        append(why, len,
               "task start error p95 %.1f%% of the makespan exceeds the tolerance of %.1f%%\n",
               100 * c->start.p95 / c->meas_makespan_us, 100 * t->start);
    }
    if (c->n_dep_violations) {
        n++;
        append(why, len, "the measurement breaks %u dependenc%s of the graph\n",
               c->n_dep_violations, c->n_dep_violations == 1 ? "y" : "ies");
    }
    return n;
}

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
    uint32_t *rm = index_records(g, meas);
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
