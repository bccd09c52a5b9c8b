/* bnorder: BatchNorm update sequences implied by an execution (see bnorder.h). */
#include "sim/bnorder.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *ps_bn_phase_name(enum ps_bn_phase p)
{
    return p == PS_BN_RECOMPUTE ? "recompute" : "forward";
}

void ps_bn_order_finish(struct ps_bn_order *b)
{
    if (!b) return;
    if (b->layers)
        for (int k = 0; k < b->n_layers; k++) free(b->layers[k].u);
    free(b->layers);
    memset(b, 0, sizeof(*b));
}

struct key {
    double t;
    uint32_t pos;
    struct ps_bn_update u;
};

static int key_cmp(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

int ps_bn_order_build(const struct ps_graph *g, const struct ps_order *o, const double *start_us,
                      enum ps_bn_policy policy, struct ps_bn_order *out)
{
    memset(out, 0, sizeof(*out));
    out->policy = policy;
    const struct ps_spec *s = g->spec;
    if (!s) return 0;
    for (int k = 0; k < s->n_layers; k++) out->n_layers += s->layers[k].op == PS_OP_BATCHNORM;
    if (!out->n_layers) return 0;
    out->layers = calloc((size_t)out->n_layers, sizeof(*out->layers));
    /* calls per partition, sorted once; every BN layer of the partition shares them */
    struct key **per = calloc((size_t)g->n, sizeof(*per));
    uint32_t *np = calloc((size_t)g->n, sizeof(uint32_t));
    int rc = 0;
    if (!out->layers || !per || !np) rc = -ENOMEM;
    for (int j = 0; j < g->n && !rc; j++)
        if (!(per[j] = malloc(((size_t)g->m * 2 + 1) * sizeof(struct key)))) rc = -ENOMEM;
    for (uint32_t k = 0; k < o->n && !rc; k++) {
        uint32_t v = o->node[k];
        const struct ps_node *nd = &g->nodes[v];
        bool fwd = nd->kind == PS_NODE_COMPUTE && nd->phase == PS_PHASE_FWD;
        bool rec = nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD;
        if ((!fwd && !rec) || nd->part < 0 || nd->part >= g->n || nd->mb < 0) continue;
        bool upd = false, pooled = false;
        switch (policy) {
        case PS_BN_PLAIN: upd = true; break;
        case PS_BN_DEFERRED: upd = pooled = fwd && nd->mb == g->var.chunks - 1; break;
        case PS_BN_GRAD_ONLY: upd = rec || (fwd && !nd->checkpointed); break;
        }
        if (!upd || np[nd->part] >= (uint32_t)g->m * 2) continue;
        double t = start_us ? start_us[v] : -1;
        per[nd->part][np[nd->part]++] = (struct key){
            .t = start_us ? t : (double)k,
            .pos = k,
            .u = {.mb = nd->mb, .phase = rec ? PS_BN_RECOMPUTE : PS_BN_FORWARD, .pooled = pooled,
                  .node = v, .t_us = t}};
    }
    for (int j = 0; j < g->n && !rc; j++) qsort(per[j], np[j], sizeof(struct key), key_cmp);
    int b = 0;
    for (int k = 0; k < s->n_layers && !rc; k++) {
        if (s->layers[k].op != PS_OP_BATCHNORM) continue;
        int j = 0;
        while (j + 1 < s->n_partitions && s->first_layer[j + 1] <= k) j++;
        struct ps_bn_layer_updates *L = &out->layers[b++];
        L->layer = k;
        L->part = j;
        if (j >= g->n) continue;
        L->u = malloc(((size_t)np[j] + 1) * sizeof(*L->u));
        if (!L->u) {
            rc = -ENOMEM;
            break;
        }
        L->n = np[j];
        for (uint32_t q = 0; q < np[j]; q++) L->u[q] = per[j][q].u;
    }
    if (per)
        for (int j = 0; j < g->n; j++) free(per[j]);
    free(per);
    free(np);
    if (rc) ps_bn_order_finish(out);
    return rc;
}
