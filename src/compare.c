/* compare: measured vs simulated timelines on one graph (definitions in compare.h); the
 * calibration of the cost model to a measurement is sim/calibrate.c.
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

uint32_t *ps_compare_record_index(const struct ps_graph *g, const struct ps_trace *t)
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
    /* the compute records grouped by device in one pass (counting sort): a pass over every
       record per device cost devices x records */
    uint32_t *first = calloc((size_t)nd + 1, sizeof(uint32_t));
    if (!first) {
        free(all);
        free(dev);
        return -ENOMEM;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t k = 0; k < t->n; k++) {
            const struct ps_trace_rec *x = &t->r[k];
            if (x->node >= g->n_nodes || !isfinite(x->start_us) || !isfinite(x->dur_us)) continue;
            const struct ps_node *nn = &g->nodes[x->node];
            if (!is_compute_rec(g, nn)) continue;
            int d = nn->device >= 0 && nn->device < nd ? nn->device : 0;
            if (pass == 0) {
                first[d + 1]++;
                continue;
            }
            struct ival iv = {x->start_us - t0, x->start_us - t0 + x->dur_us};
            dev[first[d]++] = iv;
            all[na++] = iv;
            out->n[d] += x->dur_us > 0;
        }
        if (pass == 0)
            for (int d = 0; d < nd; d++) first[d + 1] += first[d];
    }
    for (int d = 0; d < nd; d++) {
        uint32_t lo = d ? first[d - 1] : 0, n = first[d] - lo; /* first[d] moved to d's end */
        out->busy[d] = ivals_len(dev + lo, merge_ivals(dev + lo, n));
    }
    free(first);
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
    uint32_t *first = NULL;
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
    /* the tasks of each stream in one pass (a counting sort by stream): linear in tasks +
       streams, where a scan of all tasks per stream was quadratic with many streams */
    first = malloc(((size_t)ns + 1) * sizeof(uint32_t));
    if (!first) {
        rc = -ENOMEM;
        goto out;
    }
    first[0] = 0;
    for (int32_t s = 0; s < ns; s++) first[s + 1] = first[s] + cnt[s];
    for (uint32_t k = 0; k < c->n_tasks; k++) {
        int32_t s = g->nodes[c->tasks[k].node].stream;
        if (s >= 0 && s < ns && isfinite(c->tasks[k].start_err))
            list[first[s]++] = (struct by_sim){c->tasks, k};
    }
    uint32_t w = 0;
    for (int32_t s = 0; s < ns; s++) {
        if (!cnt[s]) continue;
        uint32_t n = cnt[s];
        struct by_sim *ls = list + (first[s] - n); /* first[s] moved past the stream's tasks */
        qsort(ls, n, sizeof(*ls), cmp_by_sim);
        for (uint32_t k = 0; k < n; k++) seq[k] = c->tasks[ls[k].k].meas_start;
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
    free(first);
    free(list);
    free(seq);
    free(tmp);
    return rc;
}

/* per measured lane (device, CUDA stream): tasks sorted by lane, then by simulated start */
struct by_lane {
    int32_t dev;
    int64_t stream;
    double sim_start, sim_end, meas_start;
    uint32_t node;
};

static int cmp_by_lane(const void *x, const void *y)
{
    const struct by_lane *a = x, *b = y;
    if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
    if (a->stream != b->stream) return a->stream < b->stream ? -1 : 1;
    if (a->sim_start != b->sim_start) return a->sim_start < b->sim_start ? -1 : 1;
    if (a->sim_end != b->sim_end) return a->sim_end < b->sim_end ? -1 : 1;
    return a->node < b->node ? -1 : a->node > b->node;
}

static int lane_inversions(const struct ps_trace *m, const uint32_t *rm, struct ps_compare *c)
{
    struct by_lane *v = malloc(((size_t)c->n_tasks + 1) * sizeof(*v));
    double *seq = malloc(((size_t)c->n_tasks + 1) * sizeof(double));
    double *tmp = malloc(((size_t)c->n_tasks + 1) * sizeof(double));
    int rc = 0;
    if (!v || !seq || !tmp) {
        rc = -ENOMEM;
        goto out;
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < c->n_tasks; k++) {
        const struct ps_compare_task *t = &c->tasks[k];
        if (!isfinite(t->start_err)) continue;
        const struct ps_trace_rec *r = &m->r[rm[t->node]];
        if (r->lane_stream < 0) continue;
        v[n++] = (struct by_lane){r->lane_device, r->lane_stream, t->sim_start,
                                  t->sim_start + t->sim_dur, t->meas_start, t->node};
    }
    qsort(v, n, sizeof(*v), cmp_by_lane);
    for (uint32_t a = 0; a < n;) {
        uint32_t b = a;
        while (b < n && v[b].dev == v[a].dev && v[b].stream == v[a].stream) b++;
        c->n_lanes++;
        a = b;
    }
    c->lanes = calloc((size_t)c->n_lanes + 1, sizeof(*c->lanes));
    if (!c->lanes) {
        rc = -ENOMEM;
        goto out;
    }
    uint32_t w = 0;
    for (uint32_t a = 0; a < n;) {
        uint32_t b = a;
        while (b < n && v[b].dev == v[a].dev && v[b].stream == v[a].stream) b++;
        for (uint32_t k = a; k < b; k++) seq[k - a] = v[k].meas_start;
        struct ps_compare_lane *l = &c->lanes[w++];
        l->device = v[a].dev;
        l->stream = v[a].stream;
        l->n_tasks = b - a;
        l->pairs = (uint64_t)(b - a) * (b - a - 1) / 2;
        l->inversions = count_inversions(seq, tmp, b - a);
        c->lane_inversions += l->inversions;
        c->lane_pairs += l->pairs;
        a = b;
    }
out:
    free(v);
    free(seq);
    free(tmp);
    return rc;
}

/* ---- dependency violations in the measurement ----------------------------------------------- */

/* Every recorded task w is checked once, against the latest end among the recorded tasks that
 * reach it along data and phony edges through nodes without a record (copies, waits, joins);
 * it is a violation when it started more than DEP_SLACK_US before that end, reported with the
 * task that ended last. One pass in topological order (Kahn), each node passing on the latest
 * end that flows into it, so the cost is O(nodes + edges); enumerating the pairs instead was
 * quadratic (a join between m micro-batches links m x m pairs). */
static int dependencies(const struct ps_graph *g, const struct ps_trace *m, const uint32_t *rm,
                        struct ps_compare *c)
{
    uint32_t nv = g->n_nodes;
    uint32_t *indeg = calloc((size_t)nv + 1, sizeof(uint32_t));
    uint32_t *queue = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *from = malloc(((size_t)nv + 1) * sizeof(uint32_t)); /* task giving need[] */
    double *need = malloc(((size_t)nv + 1) * sizeof(double));     /* latest end flowing in */
    if (!indeg || !queue || !from || !need) {
        free(indeg);
        free(queue);
        free(from);
        free(need);
        return -ENOMEM;
    }
    for (uint32_t x = 0; x < nv; x++) {
        need[x] = -INFINITY;
        from[x] = UINT32_MAX;
        for (uint32_t a = g->out_off[x]; a < g->out_off[x + 1]; a++) {
            const struct ps_edge *e = &g->edges[g->out_edge[a]];
            if (e->kind == PS_EDGE_DATA || e->kind == PS_EDGE_PHONY) indeg[e->dst]++;
        }
    }
    uint32_t qh = 0, qt = 0;
    for (uint32_t x = 0; x < nv; x++)
        if (!indeg[x]) queue[qt++] = x;
    while (qh < qt) {
        uint32_t x = queue[qh++];
        double out = need[x];
        uint32_t out_from = from[x];
        if (rm[x] != UINT32_MAX) {
            const struct ps_trace_rec *r = &m->r[rm[x]];
            if (from[x] != UINT32_MAX) {
                c->n_deps_checked++;
                double early = need[x] - r->start_us;
                if (early > DEP_SLACK_US) {
                    c->n_dep_violations++;
                    if (c->n_deps_kept < PS_COMPARE_MAX_DEPS)
                        c->deps[c->n_deps_kept++] = (struct ps_compare_dep){from[x], x, early};
                }
            }
            out = r->start_us + r->dur_us; /* a recorded task passes on its own end only */
            out_from = x;
        }
        for (uint32_t a = g->out_off[x]; a < g->out_off[x + 1]; a++) {
            const struct ps_edge *e = &g->edges[g->out_edge[a]];
            if (e->kind != PS_EDGE_DATA && e->kind != PS_EDGE_PHONY) continue;
            uint32_t w = e->dst;
            if (out_from != UINT32_MAX &&
                (out > need[w] || (out == need[w] && out_from < from[w]))) {
                need[w] = out;
                from[w] = out_from;
            }
            if (--indeg[w] == 0) queue[qt++] = w;
        }
    }
    free(indeg);
    free(queue);
    free(from);
    free(need);
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
    uint32_t *rs = ps_compare_record_index(g, sim), *rm = ps_compare_record_index(g, meas);
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
        stat(g, c, W_REL, &c->dur_rel) || inversions(g, c) || lane_inversions(meas, rm, c) ||
        dependencies(g, meas, rm, c))
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
    free(c->lanes);
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
