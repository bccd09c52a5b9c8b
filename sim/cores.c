/* cores: devices as threads on fewer cores (cores.h). One event per work node: among the workers
 * whose next node can start, the earliest start wins; a worker that continues on the core it
 * holds starts when its previous node ends, any other when its node is ready and a core is free.
 * Starts never decrease, so a dependency still running when a start is chosen ends after it.
 */
#include "sim/cores.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static bool is_work(const struct ps_node *nd)
{
    return ps_node_is_task(nd) || (nd->kind == PS_NODE_LOSS && nd->phase == PS_PHASE_FWD);
}

int ps_sim_cores(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                 int cores, struct ps_cores_result *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    ps_trace_init(&out->trace, PS_TRACE_SIMULATED);
    if (cores < 1) return ps_diag_set(diag, -EINVAL, "simulate", "cores: %d, expected >= 1", cores);
    uint32_t N = g->n_nodes;
    int nd = g->n_devices > 0 ? g->n_devices : 1;
    int last_dev = g->spec && g->model && g->model->n_partitions > 0
                       ? g->spec->device_id[g->model->n_partitions - 1]
                       : nd - 1;
    /* per device: its work nodes in the order's sequence */
    uint32_t *seq = malloc(((size_t)order->n + 1) * sizeof(uint32_t));
    uint32_t *seq_off = calloc((size_t)nd + 2, sizeof(uint32_t));
    uint32_t *next = calloc((size_t)nd + 1, sizeof(uint32_t));
    double *end = malloc(((size_t)N + 1) * sizeof(double));
    double *tfree = calloc((size_t)nd + 1, sizeof(double));
    double *core_t = calloc((size_t)cores + 1, sizeof(double));
    int *holder = malloc(((size_t)cores + 1) * sizeof(int));
    double *ready = malloc(((size_t)nd + 1) * sizeof(double));
    int *dev_of = malloc(((size_t)N + 1) * sizeof(int));
    uint32_t *stack = malloc(((size_t)g->n_edges + 2) * sizeof(uint32_t));
    uint32_t *stamp = calloc((size_t)N + 1, sizeof(uint32_t));
    int rc = 0;
    if (!seq || !seq_off || !next || !end || !tfree || !core_t || !holder || !dev_of || !stack ||
        !stamp || !ready) {
        rc = ps_diag_set(diag, -ENOMEM, "simulate", "out of memory");
        goto out;
    }
    for (uint32_t v = 0; v < N; v++) {
        end[v] = NAN;
        int d = g->nodes[v].device;
        dev_of[v] = d >= 0 && d < nd ? d : (last_dev >= 0 && last_dev < nd ? last_dev : 0);
    }
    for (int c = 0; c < cores; c++) holder[c] = -1;
    for (uint32_t k = 0; k < order->n; k++)
        if (is_work(&g->nodes[order->node[k]])) seq_off[dev_of[order->node[k]] + 1]++;
    for (int d = 0; d < nd; d++) seq_off[d + 1] += seq_off[d];
    for (uint32_t k = 0; k < order->n; k++) {
        uint32_t v = order->node[k];
        if (is_work(&g->nodes[v])) seq[seq_off[dev_of[v]] + next[dev_of[v]]++] = v;
    }
    memset(next, 0, (size_t)nd * sizeof(uint32_t));
    uint32_t total = seq_off[nd], done = 0;
    while (done < total) {
        /* ready time of each worker's next node: its dependencies through DATA edges (NaN:
           one has not started yet) */
        for (int d = 0; d < nd; d++) {
            ready[d] = NAN;
            if (next[d] == seq_off[d + 1] - seq_off[d]) continue;
            uint32_t v = seq[seq_off[d] + next[d]], sp = 0;
            uint32_t mark = done * (uint32_t)nd + (uint32_t)d + 1;
            double r = tfree[d];
            bool known = true;
            stack[sp++] = v;
            stamp[v] = mark;
            while (sp && known) {
                uint32_t u = stack[--sp];
                for (uint32_t e = g->in_off[u]; e < g->in_off[u + 1] && known; e++) {
                    const struct ps_edge *ed = &g->edges[g->in_edge[e]];
                    uint32_t w = ed->src;
                    if (ed->kind != PS_EDGE_DATA || stamp[w] == mark) continue;
                    stamp[w] = mark;
                    if (!is_work(&g->nodes[w])) stack[sp++] = w;
                    else if (isnan(end[w])) known = false;
                    else r = fmax(r, end[w]);
                }
            }
            if (known) ready[d] = r;
        }
        /* the earliest start: a worker continuing on its core when its previous node ends, or
           one taking a core no one continues on */
        int best = -1, best_core = -1;
        double best_t = INFINITY, best_ready = INFINITY;
        for (int d = 0; d < nd; d++) {
            if (isnan(ready[d])) continue;
            int cc = -1;
            double t = INFINITY;
            for (int c = 0; c < cores; c++)
                if (holder[c] == d && ready[d] <= core_t[c]) cc = c, t = core_t[c];
            int fc = -1;
            for (int c = 0; c < cores && cc < 0; c++) {
                int h = holder[c];
                if (h >= 0 && h != d && !isnan(ready[h]) && ready[h] <= core_t[c]) continue;
                if (fmax(ready[d], core_t[c]) < t) t = fmax(ready[d], core_t[c]), fc = c;
            }
            if (cc < 0) cc = fc;
            if (cc >= 0 && (t < best_t || (t == best_t && ready[d] < best_ready)))
                best = d, best_t = t, best_ready = ready[d], best_core = cc;
        }
        if (best < 0) {
            rc = ps_diag_set(diag, -EINVAL, "simulate",
                             "the order cannot run: every worker waits for a node that never ends");
            goto out;
        }
        uint32_t v = seq[seq_off[best] + next[best]++];
        double e = best_t + cost_us[v];
        end[v] = e;
        tfree[best] = e;
        core_t[best_core] = e;
        holder[best_core] = best;
        done++;
        const struct ps_node *n = &g->nodes[v];
        if (n->stream >= 0 && ps_trace_add(&out->trace, v, n->device, n->stream, best_t,
                                           cost_us[v], NULL)) {
            rc = ps_diag_set(diag, -ENOMEM, "simulate", "out of memory");
            goto out;
        }
        out->makespan_us = fmax(out->makespan_us, e);
    }
out:
    free(seq);
    free(seq_off);
    free(next);
    free(end);
    free(tfree);
    free(core_t);
    free(holder);
    free(ready);
    free(dev_of);
    free(stack);
    free(stamp);
    if (rc) ps_cores_finish(out);
    return rc;
}

void ps_cores_finish(struct ps_cores_result *r)
{
    ps_trace_finish(&r->trace);
    memset(r, 0, sizeof(*r));
}

int ps_sim_serial(const struct ps_graph *g, const struct ps_order *order, const double *cost_us,
                  struct ps_cores_result *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    ps_trace_init(&out->trace, PS_TRACE_SIMULATED);
    double t = 0;
    for (uint32_t k = 0; k < order->n; k++) {
        uint32_t v = order->node[k];
        const struct ps_node *n = &g->nodes[v];
        if (!is_work(n)) continue;
        if (n->stream >= 0 &&
            ps_trace_add(&out->trace, v, n->device, n->stream, t, cost_us[v], NULL))
            return ps_diag_set(diag, -ENOMEM, "simulate", "out of memory");
        t += cost_us[v];
    }
    out->makespan_us = t;
    return 0;
}
