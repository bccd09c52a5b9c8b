/* advise: Pareto front, recommendation and the drift closed form of a configuration search
 * (advise.h). Everything here follows from the filled points alone; the search that fills them
 * (simulation, balance, bounds) is src/study/advise.c. Ties are broken by table order, so the
 * front and the recommendation are deterministic.
 */
#include "src/advise.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool drift_cmp(const struct ps_advise_point *p, const struct ps_advise_point *q)
{
    return !isnan(p->drift) && !isnan(q->drift);
}

bool ps_advise_dominates(const struct ps_advise_point *a, const struct ps_advise_point *b)
{
    if (a->throughput < b->throughput || a->peak_bytes > b->peak_bytes) return false;
    bool dc = drift_cmp(a, b);
    if (dc && a->drift > b->drift) return false;
    return a->throughput > b->throughput || a->peak_bytes < b->peak_bytes ||
           (dc && a->drift < b->drift);
}

static bool same(const struct ps_advise_point *a, const struct ps_advise_point *b)
{
    return a->throughput == b->throughput && a->peak_bytes == b->peak_bytes &&
           (!drift_cmp(a, b) || a->drift == b->drift);
}

int ps_advise_front(struct ps_advise *a)
{
    int n = 0;
    for (int i = 0; i < a->n_points; i++) {
        struct ps_advise_point *p = &a->points[i];
        p->on_front = false;
        if (p->status != PS_ADV_FEASIBLE) continue;
        bool dom = false;
        for (int j = 0; j < a->n_points && !dom; j++) {
            const struct ps_advise_point *q = &a->points[j];
            if (j == i || q->status != PS_ADV_FEASIBLE) continue;
            dom = ps_advise_dominates(q, p) || (j < i && same(q, p));
        }
        p->on_front = !dom;
        n += p->on_front;
    }
    return n;
}

/* better for the throughput objective: faster, then less memory, then less drift */
static bool faster(const struct ps_advise_point *p, const struct ps_advise_point *q)
{
    if (p->throughput != q->throughput) return p->throughput > q->throughput;
    if (p->peak_bytes != q->peak_bytes) return p->peak_bytes < q->peak_bytes;
    return drift_cmp(p, q) && p->drift < q->drift;
}

int ps_advise_recommend(struct ps_advise *a)
{
    int best = -1, calm = -1;
    for (int i = 0; i < a->n_points; i++) {
        const struct ps_advise_point *p = &a->points[i];
        if (!p->on_front) continue;
        if (best < 0 || faster(p, &a->points[best])) best = i;
        if (a->objective == PS_ADVISE_BALANCED) {
            bool ok = isnan(p->drift) || p->drift <= PS_ADVISE_DRIFT_OK;
            const struct ps_advise_point *c = calm >= 0 ? &a->points[calm] : NULL;
            bool c_ok = c && (isnan(c->drift) || c->drift <= PS_ADVISE_DRIFT_OK);
            if (!c || (ok && !c_ok) || (ok && c_ok && faster(p, c)) ||
                (!ok && !c_ok && p->drift < c->drift))
                calm = i;
        }
    }
    a->recommended = a->objective == PS_ADVISE_BALANCED ? calm : best;
    return a->recommended;
}

void ps_advise_sentence(const struct ps_advise *a, const struct ps_advise_point *p, char *buf,
                        size_t len)
{
    char vs[32] = "";
    if (p->virtual_stages > 1) snprintf(vs, sizeof(vs), " (%d stages per device)", p->virtual_stages);
    char drift[64];
    if (isnan(p->drift)) snprintf(drift, sizeof(drift), "BN drift not predicted");
    else snprintf(drift, sizeof(drift), "BN drift %.2g%%", 100 * p->drift);
    int w = snprintf(buf, len, "chunks %d, %s%s, %s, %s BN on %d device%s: ", p->chunks,
                     ps_schedule_name((enum ps_schedule)p->schedule), vs,
                     ps_checkpoint_name(p->checkpoint), ps_bn_policy_name(p->policy), p->devices,
                     p->devices == 1 ? "" : "s");
    if (w < 0 || (size_t)w >= len) return;
    if (a->spec_throughput > 0 && a->spec_peak > 0)
        snprintf(buf + w, len - (size_t)w, "%.2fx the throughput of your spec, %.0f%% of its "
                 "memory, %s", p->throughput / a->spec_throughput,
                 100.0 * (double)p->peak_bytes / (double)a->spec_peak, drift);
    else
        snprintf(buf + w, len - (size_t)w, "%.1f samples/s, %s", p->throughput, drift);
}

void ps_advise_finish(struct ps_advise *a)
{
    if (!a) return;
    for (int i = 0; a->points && i < a->n_points; i++) free(a->points[i].balance);
    free(a->points);
    memset(a, 0, sizeof(*a));
}

double ps_advise_updates_per_step(const struct ps_variant *v)
{
    int m = v->mb_count, stop = ps_variant_checkpoint_stop(v);
    if (stop > m) stop = m;
    switch (v->batchnorm) {
    case PS_BN_PLAIN: return m + stop;
    case PS_BN_GRAD_ONLY: return m;
    case PS_BN_DEFERRED: return m == v->chunks ? 1 : (double)m / v->chunks;
    }
    return 1;
}

double ps_advise_var_err(double V, double n, double a, int T, const struct ps_variant *v)
{
    double q = 1 - a, U = ps_advise_updates_per_step(v);
    double qt = pow(q, T), qu = pow(q, U * T);
    double ref = qt + (1 - qt) * V;
    double u = v->batchnorm == PS_BN_DEFERRED && n > 1 ? V * (n - 1) / n : V;
    double r = qu + (1 - qu) * u;
    return ref > 0 ? fabs(r - ref) / ref : NAN;
}
