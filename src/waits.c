/* waits: the device waits of an execution order (rules and invariants in waits.h).
 *
 * One pass over the order keeps, per stream, the last entry that runs on it (`run`) and the last
 * entry issued on it (`reg`: the same, or a copy whose barrier names the stream). Each entry's
 * candidate waits go to a small list keyed by the producer's stream, where the latest entry wins
 * (W2). The GRAD producers of an entry come from its DATA predecessors: a stream node is one, a
 * host-only node stands for its own producers, summarised when the pass reaches it (latest entry
 * per stream, as W2 keeps), so no search runs twice over the same nodes (B(i,n-1) of every
 * micro-batch meets the loss and, behind it, F(k,n-1) of all of them).
 */
#include "src/waits.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ps_waits_finish(struct ps_waits *w)
{
    if (!w) return;
    free(w->sprev);
    free(w->off);
    free(w->at);
    free(w->kind);
    memset(w, 0, sizeof(*w));
}

const char *ps_wait_kind_name(enum ps_wait_kind k)
{
    switch (k) {
    case PS_WAIT_EVENT:
        return "event";
    case PS_WAIT_BARRIER:
        return "barrier";
    case PS_WAIT_GRAD:
        return "grad";
    }
    return "?";
}

struct cand {
    int32_t stream; /* the producer's stream */
    uint32_t at;
    uint8_t kind;
};

struct ctx {
    const struct ps_graph *g;
    const struct ps_order *o;
    struct cand *c;
    uint32_t nc, cap;
    /* producer summaries of host-only entries: sum[hoff[k] .. hoff[k] + hlen[k]) */
    struct cand *sum;
    uint32_t nsum, capsum;
    uint32_t *hoff, *hlen;
};

static int add(struct ctx *x, int32_t self, uint32_t at, enum ps_wait_kind kind)
{
    int32_t s = x->g->nodes[x->o->node[at]].stream;
    if (s == self) return 0; /* W1: the stream order covers it */
    for (uint32_t k = 0; k < x->nc; k++)
        if (x->c[k].stream == s) {
            if (at > x->c[k].at) x->c[k] = (struct cand){s, at, (uint8_t)kind};
            return 0;
        }
    if (x->nc == x->cap) {
        uint32_t cap = x->cap ? x->cap * 2 : 8;
        struct cand *q = realloc(x->c, cap * sizeof(*q));
        if (!q) return -ENOMEM;
        x->c = q;
        x->cap = cap;
    }
    x->c[x->nc++] = (struct cand){s, at, (uint8_t)kind};
    return 0;
}

static bool no_gradient(const struct ps_node *nd)
{
    return nd->kind == PS_NODE_RECOMPUTE && nd->phase == PS_PHASE_BWD;
}

/* the stream nodes whose real gradients reach entry k's node v along DATA edges, through
   host-only nodes (their summaries), into x->c */
static int grad_producers(struct ctx *x, uint32_t k, uint32_t v, int32_t self)
{
    const struct ps_graph *g = x->g;
    for (uint32_t q = g->in_off[v]; q < g->in_off[v + 1]; q++) {
        const struct ps_edge *e = &g->edges[g->in_edge[q]];
        uint32_t u = e->src, pu = x->o->pos[u];
        if (e->kind != PS_EDGE_DATA || pu == UINT32_MAX || pu >= k || no_gradient(&g->nodes[u]))
            continue;
        int rc = 0;
        if (g->nodes[u].stream >= 0) {
            rc = add(x, self, pu, PS_WAIT_GRAD);
        } else {
            for (uint32_t h = x->hoff[pu]; h < x->hoff[pu] + x->hlen[pu] && !rc; h++)
                rc = add(x, self, x->sum[h].at, PS_WAIT_GRAD);
        }
        if (rc) return rc;
    }
    return 0;
}

/* keeps host-only entry k's producers (x->c) as its summary */
static int keep_summary(struct ctx *x, uint32_t k)
{
    if (x->nsum + x->nc > x->capsum) {
        uint32_t cap = x->capsum ? x->capsum : 64;
        while (x->nsum + x->nc > cap)
            cap *= 2;
        struct cand *q = realloc(x->sum, (size_t)cap * sizeof(*q));
        if (!q) return -ENOMEM;
        x->sum = q;
        x->capsum = cap;
    }
    x->hoff[k] = x->nsum;
    x->hlen[k] = x->nc;
    memcpy(x->sum + x->nsum, x->c, (size_t)x->nc * sizeof(*x->c));
    x->nsum += x->nc;
    return 0;
}

int ps_waits_plan(const struct ps_graph *g, const struct ps_order *o, struct ps_waits *w,
                  struct ps_diag *diag)
{
    memset(w, 0, sizeof(*w));
    uint32_t n = o->n;
    int32_t ns = g->n_streams;
    struct ctx x = {.g = g, .o = o};
    uint32_t *run = malloc(((size_t)ns + 1) * sizeof(uint32_t));
    uint32_t *reg = malloc(((size_t)ns + 1) * sizeof(uint32_t));
    x.hoff = calloc((size_t)n + 1, sizeof(uint32_t));
    x.hlen = calloc((size_t)n + 1, sizeof(uint32_t));
    w->n = n;
    w->sprev = malloc(((size_t)n + 1) * sizeof(uint32_t));
    w->off = malloc(((size_t)n + 2) * sizeof(uint32_t));
    uint32_t cap = n + 16;
    w->at = malloc((size_t)cap * sizeof(uint32_t));
    w->kind = malloc((size_t)cap);
    int rc = 0;
    if (!run || !reg || !x.hoff || !x.hlen || !w->sprev || !w->off || !w->at || !w->kind)
        rc = -ENOMEM;
    for (int32_t s = 0; !rc && s < ns; s++)
        run[s] = reg[s] = UINT32_MAX;
    uint32_t nw = 0;
    for (uint32_t k = 0; !rc && k < n; k++) {
        uint32_t v = o->node[k];
        const struct ps_node *nd = &g->nodes[v];
        int32_t s = nd->stream;
        w->off[k] = nw;
        w->sprev[k] = UINT32_MAX;
        x.nc = 0;
        if (s < 0 || s >= ns) { /* host-only: its producers, for the entries it feeds */
            rc = grad_producers(&x, k, v, -1);
            if (!rc) rc = keep_summary(&x, k);
            continue;
        }
        w->sprev[k] = run[s];
        /* the barrier's second half: a copy issued on this stream from another one */
        if (reg[s] != UINT32_MAX && reg[s] != run[s]) rc = add(&x, s, reg[s], PS_WAIT_BARRIER);
        int32_t t = nd->wait_on;
        bool waits = nd->kind == PS_NODE_WAIT || nd->kind == PS_NODE_COPY;
        if (!rc && waits && t >= 0 && t < ns && reg[t] != UINT32_MAX)
            rc = add(&x, s, reg[t], nd->kind == PS_NODE_WAIT ? PS_WAIT_EVENT : PS_WAIT_BARRIER);
        if (!rc && nd->phase == PS_PHASE_BWD) rc = grad_producers(&x, k, v, s);
        if (rc) break;
        if (nw + x.nc > cap) {
            while (nw + x.nc > cap)
                cap *= 2;
            uint32_t *a = realloc(w->at, (size_t)cap * sizeof(uint32_t));
            if (a) w->at = a;
            uint8_t *b = realloc(w->kind, (size_t)cap);
            if (b) w->kind = b;
            if (!a || !b) {
                rc = -ENOMEM;
                break;
            }
        }
        /* by position, so the plan does not depend on the search's visiting order */
        for (uint32_t i = 1; i < x.nc; i++)
            for (uint32_t j = i; j > 0 && x.c[j - 1].at > x.c[j].at; j--) {
                struct cand tmp = x.c[j];
                x.c[j] = x.c[j - 1];
                x.c[j - 1] = tmp;
            }
        for (uint32_t i = 0; i < x.nc; i++) {
            w->at[nw] = x.c[i].at;
            w->kind[nw++] = x.c[i].kind;
        }
        run[s] = reg[s] = k;
        if (nd->kind == PS_NODE_COPY && t >= 0 && t < ns) reg[t] = k;
    }
    if (!rc) {
        w->off[n] = nw;
        w->n_waits = nw;
    }
    free(run);
    free(reg);
    free(x.hoff);
    free(x.hlen);
    free(x.sum);
    free(x.c);
    if (rc) {
        ps_waits_finish(w);
        return ps_diag_set(diag, rc, "waits", "out of memory planning the stream waits");
    }
    return 0;
}

bool ps_waits_before(const struct ps_waits *w, const struct ps_graph *g, const struct ps_order *o,
                     uint32_t a, uint32_t b)
{
    if (a >= b || b >= w->n) return false;
    int32_t sa = g->nodes[o->node[a]].stream;
    uint32_t span = b - a + 1;
    uint8_t *seen = calloc(span, 1);
    uint32_t *stack = malloc((size_t)span * sizeof(uint32_t));
    bool found = false;
    uint32_t sp = 0;
    if (seen && stack) {
        stack[sp++] = b;
        seen[b - a] = 1;
    }
    while (sp && !found) {
        uint32_t k = stack[--sp];
        /* an entry of a's stream at or after a ends after a */
        if (k == a || (sa >= 0 && g->nodes[o->node[k]].stream == sa && k != b)) {
            found = true;
            break;
        }
        /* what k waits for: q = 0 its stream predecessor, then its waits */
        uint32_t nq = w->off[k + 1] - w->off[k];
        for (uint32_t q = 0; q <= nq; q++) {
            uint32_t p = q == 0 ? w->sprev[k] : w->at[w->off[k] + q - 1];
            if (p == UINT32_MAX || p < a || seen[p - a]) continue;
            seen[p - a] = 1;
            stack[sp++] = p;
        }
    }
    free(seen);
    free(stack);
    return found;
}
