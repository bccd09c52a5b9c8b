/* cost: the roofline cost model of a node and measured per-layer costs (see cost.h and
 * sim/COSTS.md). */
#include "sim/cost.h"
#include "src/file.h"
#include "src/json_in.h"
#include "src/memlimit.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double roof(const struct ps_graph *g, const struct ps_node *nd)
{
    const struct ps_spec *s = g->spec;
    double flops = s && s->dev_flops > 0 ? s->dev_flops : 6.7e13;
    double bw = s && s->dev_mem_bw > 0 ? s->dev_mem_bw : 4.8e12;
    double t = nd->flops / flops, tb = nd->bytes / bw;
    return (t > tb ? t : tb) * 1e6;
}

static double link_us(const struct ps_graph *g, const struct ps_costs *c, double bytes)
{
    const struct ps_spec *s = g->spec;
    double link = c && c->copy_bandwidth > 0 ? c->copy_bandwidth
                  : s && s->link_bw > 0      ? s->link_bw
                                             : 4.5e11;
    double lat = c && c->copy_latency_us >= 0 ? c->copy_latency_us : s ? s->link_latency_us : 2.0;
    return bytes / link * 1e6 + lat;
}

double ps_cost_roofline_us(const struct ps_graph *g, uint32_t v)
{
    const struct ps_node *nd = &g->nodes[v];
    double launch = g->spec ? g->spec->dev_launch_us : 4.0;
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE:
    case PS_NODE_WGRAD:
    case PS_NODE_OPTIM:
    case PS_NODE_LOSS: return roof(g, nd) + launch;
    case PS_NODE_RECOMPUTE: return nd->phase == PS_PHASE_FWD ? 0 : roof(g, nd) + launch;
    case PS_NODE_COPY: return link_us(g, NULL, nd->bytes);
    case PS_NODE_WAIT:
    case PS_NODE_FORK:
    case PS_NODE_JOIN:
    case PS_NODE__COUNT: return 0;
    }
    return 0;
}

int ps_cost_fill_roofline(const struct ps_graph *g, double *cost)
{
    if (!cost) return -ENOMEM;
    for (uint32_t v = 0; v < g->n_nodes; v++) cost[v] = ps_cost_roofline_us(g, v);
    return 0;
}

double ps_cost_launch_us(const struct ps_graph *g, const struct ps_costs *c)
{
    if (c && c->launch_overhead_us >= 0) return c->launch_overhead_us;
    return g->spec ? g->spec->dev_launch_us : 4.0;
}

static bool has_wgrad(const struct ps_graph *g, uint32_t b)
{
    for (uint32_t k = g->out_off[b]; k < g->out_off[b + 1]; k++)
        if (g->nodes[g->edges[g->out_edge[k]].dst].kind == PS_NODE_WGRAD) return true;
    return false;
}

/* measured weight-gradient time of a layer: as measured, else half the backward of linear/conv */
static double wgrad_of(const struct ps_graph *g, const struct ps_costs *c, int k)
{
    if (c->layers[k].wgrad_us >= 0) return c->layers[k].wgrad_us;
    enum ps_op op = g->spec->layers[k].op;
    return op == PS_OP_LINEAR || op == PS_OP_CONV2D ? 0.5 * c->layers[k].backward_us : 0;
}

int ps_cost_fill(const struct ps_graph *g, const struct ps_costs *c, double *cost,
                 struct ps_diag *diag)
{
    if (c && (!g->spec || !g->model || c->n_layers != g->spec->n_layers))
        return ps_diag_set(diag, -EINVAL, "costs", "layers: %d entries, but the model has %d layers",
                           c->n_layers, g->spec ? g->spec->n_layers : 0);
    uint8_t *rec = NULL;
    if (c && !(rec = ps_cost_recomputed(g)))
        return ps_diag_set(diag, -ENOMEM, "costs", "out of memory");
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        double t = 0;
        switch ((enum ps_node_kind)nd->kind) {
        case PS_NODE_COMPUTE:
        case PS_NODE_WGRAD:
        case PS_NODE_RECOMPUTE:
        case PS_NODE_OPTIM:
        case PS_NODE_LOSS: t = roof(g, nd); break;
        case PS_NODE_COPY: t = link_us(g, c, nd->bytes); break;
        default: t = 0; break;
        }
        if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_FWD) t = 0;
        if (c && nd->part >= 0 && nd->part < g->model->n_partitions) {
            const struct ps_partition_info *p = &g->model->parts[nd->part];
            double scale = 0;
            if (nd->mb >= 0 && nd->mb < g->m && g->mb_size) {
                double bs = (double)g->mb_size[nd->mb];
                scale = c->per_sample ? bs : bs / c->micro_batch;
            }
            double f = 0, b = 0, w = 0, f0 = 0, b0 = 0, r = 0, r0 = 0, q = 0, q0 = 0, f2 = 0,
                   b2 = 0, br = 0;
            for (int k = p->first; k < p->first + p->count; k++) {
                const struct ps_cost_layer *cl = &c->layers[k];
                q += cl->checkpointed_set ? cl->checkpointed_us : cl->forward_us;
                q0 += cl->checkpointed_set ? cl->checkpointed_fixed_us : cl->forward_fixed_us;
                f2 += cl->forward_sq_us;
                b2 += cl->backward_sq_us;
                r += cl->recompute_set ? cl->recompute_us : cl->forward_us;
                r0 += cl->recompute_set ? cl->recompute_fixed_us : cl->forward_fixed_us;
                f += c->layers[k].forward_us;
                b += c->layers[k].backward_us;
                br += cl->backward_recomputed_set ? cl->backward_recomputed_us : cl->backward_us;
                w += wgrad_of(g, c, k);
                f0 += c->layers[k].forward_fixed_us;
                b0 += c->layers[k].backward_fixed_us;
            }
            /* scale^2, but not extrapolated past the largest fitted scale */
            double s2 = scale * (c->sq_max_scale > 0 ? fmin(scale, c->sq_max_scale) : scale);
            if (nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_FWD)
                t = (nd->checkpointed ? q0 + q * scale : f0 + f * scale) + f2 * s2;
            else if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD)
                t = r0 + r * scale + f2 * s2;
            else if (nd->kind == PS_NODE_COMPUTE) {
                bool recomputed = nd->mb >= 0 && nd->mb < g->m && rec[nd->mb * g->n + nd->part];
                double bb = recomputed ? br : b;
                t = b0 + (has_wgrad(g, v) ? bb - w : bb) * scale + b2 * s2;
            }
            else if (nd->kind == PS_NODE_WGRAD) t = w * scale;
            else if (nd->kind == PS_NODE_OPTIM && c->optimizer_us && nd->part < c->n_optimizer)
                t = c->optimizer_us[nd->part];
        }
        cost[v] = t;
    }
    free(rec);
    return 0;
}

uint8_t *ps_cost_first_backward(const struct ps_graph *g, const struct ps_order *order)
{
    uint8_t *first = calloc(g->n_nodes ? g->n_nodes : 1, 1);
    uint8_t *seen = calloc(g->n > 0 ? (size_t)g->n : 1, 1);
    if (!first || !seen) {
        free(first);
        free(seen);
        return NULL;
    }
    for (uint32_t k = 0; k < order->n; k++) {
        uint32_t v = order->node[k];
        const struct ps_node *nd = &g->nodes[v];
        if (nd->kind != PS_NODE_COMPUTE || nd->phase != PS_PHASE_BWD || nd->part < 0 ||
            nd->part >= g->n || seen[nd->part])
            continue;
        seen[nd->part] = 1;
        first[v] = 1;
    }
    free(seen);
    return first;
}

int ps_cost_add_first_backward(const struct ps_graph *g, const struct ps_order *order,
                               const struct ps_costs *c, double *cost, struct ps_diag *diag)
{
    if (!c || !g->model) return 0;
    uint8_t *first = ps_cost_first_backward(g, order);
    if (!first) return ps_diag_set(diag, -ENOMEM, "costs", "out of memory");
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (!first[v] || nd->part >= g->model->n_partitions || nd->mb < 0 || nd->mb >= g->m ||
            !g->mb_size)
            continue;
        double bs = (double)g->mb_size[nd->mb], scale = c->per_sample ? bs : bs / c->micro_batch;
        const struct ps_partition_info *p = &g->model->parts[nd->part];
        for (int k = p->first; k < p->first + p->count && k < c->n_layers; k++)
            cost[v] += c->layers[k].first_backward_us * scale;
    }
    free(first);
    return 0;
}

uint8_t *ps_cost_recomputed(const struct ps_graph *g)
{
    size_t n = (size_t)(g->m > 0 ? g->m : 1) * (size_t)(g->n > 0 ? g->n : 1);
    uint8_t *rec = calloc(n, 1);
    if (!rec) return NULL;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD && nd->mb >= 0 &&
            nd->mb < g->m && nd->part >= 0 && nd->part < g->n)
            rec[(size_t)nd->mb * (size_t)g->n + (size_t)nd->part] = 1;
    }
    return rec;
}

void ps_costs_destroy(struct ps_costs *c)
{
    if (!c) return;
    free(c->layers);
    free(c->optimizer_us);
    free(c);
}

static int num(const cJSON *o, const char *key, bool req, double lo, double *out, const char *name,
               const char *path, struct ps_diag *d)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x) {
        if (req) return ps_diag_set(d, -EINVAL, name, "%s%s: missing", path, key);
        return 0;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble < lo)
        return ps_diag_set(d, -EINVAL, name, "%s%s: expected a number >= %g", path, key, lo);
    /* upper bounds, so sums over a million tasks stay finite (issue [data-safety] 9) */
    double hi = INFINITY;
    if (strstr(key, "_us")) hi = PS_COSTS_MAX_US;
    else if (!strcmp(key, "bandwidth")) hi = 1e16;
    else if (!strcmp(key, "micro_batch_size") || !strcmp(key, "sq_max_scale")) hi = 1048576;
    if (x->valuedouble > hi)
        return ps_diag_set(d, -EINVAL, name, "%s%s: %g is more than %g", path, key, x->valuedouble,
                           hi);
    *out = x->valuedouble;
    return 0;
}

int ps_costs_parse(const char *json, const char *name, struct ps_costs **out,
                   struct ps_diag *diag)
{
    *out = NULL;
    static const struct ps_json_doc doc = {"a costs file", "{\"pipescope_costs\": 1, ...}"};
    cJSON *root;
    int prc = ps_json_parse_doc(json, strlen(json), name, &doc, &root, diag);
    if (prc) return prc;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ps_diag_set(diag, -EINVAL, name, "not a JSON object");
    }
    struct ps_costs *c = calloc(1, sizeof(*c));
    int rc = 0;
    if (!c) {
        rc = ps_diag_set(diag, -ENOMEM, name, "out of memory");
        goto out;
    }
    c->copy_latency_us = -1;
    c->launch_overhead_us = -1;
    double ver = 0;
    if ((rc = num(root, "pipescope_costs", true, 1, &ver, name, "", diag))) goto out;
    if (ver != 1) {
        rc = ps_diag_set(diag, -EINVAL, name, "pipescope_costs: version %g, expected 1", ver);
        goto out;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "unit");
    if (!cJSON_IsString(u) ||
        (strcmp(u->valuestring, "sample") && strcmp(u->valuestring, "micro_batch"))) {
        rc = ps_diag_set(diag, -EINVAL, name, "unit: expected \"sample\" or \"micro_batch\"");
        goto out;
    }
    c->per_sample = !strcmp(u->valuestring, "sample");
    if (!c->per_sample &&
        (rc = num(root, "micro_batch_size", true, 1, &c->micro_batch, name, "", diag)))
        goto out;
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!cJSON_IsArray(ls) || cJSON_GetArraySize(ls) < 1) {
        rc = ps_diag_set(diag, -EINVAL, name, "layers: expected a non-empty array");
        goto out;
    }
    c->n_layers = cJSON_GetArraySize(ls);
    c->layers = calloc((size_t)c->n_layers, sizeof(*c->layers));
    if (!c->layers) {
        rc = ps_diag_set(diag, -ENOMEM, name, "out of memory");
        goto out;
    }
    int k = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, ls)
    {
        char p[48];
        snprintf(p, sizeof(p), "layers[%d].", k);
        struct ps_cost_layer *cl = &c->layers[k++];
        cl->wgrad_us = -1;
        if ((rc = num(l, "forward_us", true, 0, &cl->forward_us, name, p, diag)) ||
            (rc = num(l, "backward_us", true, 0, &cl->backward_us, name, p, diag)) ||
            (rc = num(l, "wgrad_us", false, 0, &cl->wgrad_us, name, p, diag)) ||
            (rc = num(l, "forward_fixed_us", false, 0, &cl->forward_fixed_us, name, p, diag)) ||
            (rc = num(l, "backward_fixed_us", false, 0, &cl->backward_fixed_us, name, p, diag)))
            goto out;
        cl->recompute_us = -1;
        cl->recompute_fixed_us = -1;
        if ((rc = num(l, "recompute_us", false, 0, &cl->recompute_us, name, p, diag)) ||
            (rc = num(l, "recompute_fixed_us", false, 0, &cl->recompute_fixed_us, name, p, diag)))
            goto out;
        cl->recompute_set = cl->recompute_us >= 0 || cl->recompute_fixed_us >= 0;
        if (cl->recompute_us < 0) cl->recompute_us = cl->forward_us;
        if (cl->recompute_fixed_us < 0) cl->recompute_fixed_us = cl->forward_fixed_us;
        cl->checkpointed_us = -1;
        cl->checkpointed_fixed_us = -1;
        if ((rc = num(l, "checkpointed_us", false, 0, &cl->checkpointed_us, name, p, diag)) ||
            (rc = num(l, "checkpointed_fixed_us", false, 0, &cl->checkpointed_fixed_us, name, p,
                      diag)))
            goto out;
        cl->backward_recomputed_us = -1;
        if ((rc = num(l, "forward_sq_us", false, 0, &cl->forward_sq_us, name, p, diag)) ||
            (rc = num(l, "backward_sq_us", false, 0, &cl->backward_sq_us, name, p, diag)) ||
            (rc = num(l, "backward_recomputed_us", false, 0, &cl->backward_recomputed_us, name, p,
                      diag)) ||
            (rc = num(l, "first_backward_us", false, 0, &cl->first_backward_us, name, p, diag)))
            goto out;
        cl->backward_recomputed_set = cl->backward_recomputed_us >= 0;
        if (!cl->backward_recomputed_set) cl->backward_recomputed_us = cl->backward_us;
        cl->checkpointed_set = cl->checkpointed_us >= 0 || cl->checkpointed_fixed_us >= 0;
        if (cl->checkpointed_us < 0) cl->checkpointed_us = cl->forward_us;
        if (cl->checkpointed_fixed_us < 0) cl->checkpointed_fixed_us = cl->forward_fixed_us;
        if (cl->wgrad_us > cl->backward_us) {
            rc = ps_diag_set(diag, -EINVAL, name, "%swgrad_us: more than backward_us", p);
            goto out;
        }
    }
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(root, "copy");
    if (cp && ((rc = num(cp, "bandwidth", false, 1, &c->copy_bandwidth, name, "copy.", diag)) ||
               (rc = num(cp, "latency_us", false, 0, &c->copy_latency_us, name, "copy.", diag))))
        goto out;
    if ((rc = num(root, "launch_overhead_us", false, 0, &c->launch_overhead_us, name, "", diag)))
        goto out;
    if ((rc = num(root, "sq_max_scale", false, 0, &c->sq_max_scale, name, "", diag))) goto out;
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(root, "optimizer_us");
    if (op) {
        if (!cJSON_IsArray(op)) {
            rc = ps_diag_set(diag, -EINVAL, name, "optimizer_us: expected an array (per partition)");
            goto out;
        }
        c->n_optimizer = cJSON_GetArraySize(op);
        c->optimizer_us = calloc((size_t)c->n_optimizer + 1, sizeof(double));
        if (!c->optimizer_us) {
            rc = ps_diag_set(diag, -ENOMEM, name, "out of memory");
            goto out;
        }
        k = 0;
        cJSON_ArrayForEach(l, op)
        {
            if (!cJSON_IsNumber(l) || l->valuedouble < 0) {
                rc = ps_diag_set(diag, -EINVAL, name, "optimizer_us[%d]: expected a number >= 0", k);
                goto out;
            }
            if (l->valuedouble > PS_COSTS_MAX_US) {
                rc = ps_diag_set(diag, -EINVAL, name, "optimizer_us[%d]: %g is more than %g", k,
                                 l->valuedouble, PS_COSTS_MAX_US);
                goto out;
            }
            c->optimizer_us[k++] = l->valuedouble;
        }
    }
out:
    cJSON_Delete(root);
    if (rc) {
        ps_costs_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int ps_costs_load(const char *path, struct ps_costs **out, struct ps_diag *diag)
{
    *out = NULL;
    struct ps_file_opts fo = {.factor = 8.0}; /* text + cJSON tree */
    char *buf;
    size_t n;
    int rc = ps_file_read(path, &fo, &buf, &n, diag);
    if (rc) return rc;
    rc = ps_costs_parse(buf, path, out, diag);
    free(buf);
    return rc;
}
