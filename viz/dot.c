/* dot: the task graph as Graphviz DOT, built with cgraph (viz/REPORT.md, "Pictures").
 *
 * One cluster per device (`subgraph cluster_dev0 {label="cuda:0" ...}`, newrank=true so rank
 * constraints work across clusters); a node is named by its task (F(2,1), B(2,1), R(2,1),
 * C(2,0->1), W(2,1) ...) and sits in the cluster of the device that runs it; host-only nodes
 * without a device stay at the top level. Styles, one per meaning:
 *
 *     F  box, blue fill       (checkpointed: double border)     DATA    solid
 *     B  box, orange fill      Wg  box, light orange             PHONY   dashed
 *     R, r  grey fill (shaded: recomputation)                    HOST    dotted grey  (option)
 *     C  green cds, W/Wo octagon, fork/join small ellipse        STREAM  dotted blue  (option)
 *
 * Filters keep forward-phase or backward-phase nodes only. The "tasks only" view keeps the tasks
 * (F, B, R, Wg), the loss and optimizer nodes, and contracts every other node into edges: there
 * is an edge u -> v when v is reachable from u through contracted nodes only; its style is the
 * weakest kind needed on the best path (DATA < PHONY < HOST < STREAM), so a dependency that only
 * phony edges create stays dashed.
 *
 * Determinism (D1): nodes are created in index order, edges in edge-index order (contracted
 * edges: by source, then target index), attributes declared up front and set in a fixed order;
 * agwrite then prints the same bytes for the same graph.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz_gv.h"

/* ---- Graphviz messages ------------------------------------------------------------------ */


/* cgraph orders subgraphs (and writes them) by object ID, and its default ID discipline uses
 * the address of the interned name as the ID: the output order then depends on the heap. This
 * discipline hands out IDs in creation order and maps names itself (a hash table freed at
 * agclose; cgraph's own internal map would leak its subgraph entries): named objects get even IDs
 * 2(k+1) for the k-th distinct name, anonymous ones (edges) odd IDs. Same graph, same bytes. */
struct det_ids {
    Agraph_t *g;
    IDTYPE anon;     /* next odd ID */
    char **names;    /* by k: cgraph reference strings (agstrdup), freed with the graph */
    uint32_t n, cap;
    uint32_t *slot;  /* open addressing: k + 1, 0 = empty */
    uint32_t nslot;  /* power of two */
};

static uint32_t det_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void *det_open(Agraph_t *g, Agdisc_t *disc)
{
    (void)disc;
    struct det_ids *st = calloc(1, sizeof(*st));
    if (st) {
        st->anon = 1;
        st->g = g;
    }
    return st;
}

static int det_grow(struct det_ids *st)
{
    uint32_t ns = st->nslot ? st->nslot * 2 : 1024;
    uint32_t *slot = calloc(ns, sizeof(uint32_t));
    if (!slot) return -1;
    for (uint32_t k = 0; k < st->n; k++) {
        uint32_t h = det_hash(st->names[k]) & (ns - 1);
        while (slot[h]) h = (h + 1) & (ns - 1);
        slot[h] = k + 1;
    }
    free(st->slot);
    st->slot = slot;
    st->nslot = ns;
    return 0;
}

static long det_map(void *state, int objtype, char *str, IDTYPE *id, int createflag)
{
    (void)objtype;
    struct det_ids *st = state;
    if (!str) {
        *id = st->anon;
        st->anon += 2;
        return 1;
    }
    if (st->nslot) {
        uint32_t h = det_hash(str) & (st->nslot - 1);
        for (; st->slot[h]; h = (h + 1) & (st->nslot - 1))
            if (strcmp(st->names[st->slot[h] - 1], str) == 0) {
                *id = (IDTYPE)st->slot[h] * 2;
                return 1;
            }
    }
    if (!createflag) return 0;
    if ((st->n + 1) * 2 > st->nslot && det_grow(st)) return 0;
    if (st->n == st->cap) {
        uint32_t c = st->cap ? st->cap * 2 : 256;
        char **q = realloc(st->names, (size_t)c * sizeof(*q));
        if (!q) return 0;
        st->names = q;
        st->cap = c;
    }
    /* a cgraph reference string: agwrite asks it whether it is an HTML label */
    char *copy = agstrdup(st->g, str);
    if (!copy) return 0;
    st->names[st->n] = copy;
    uint32_t h = det_hash(str) & (st->nslot - 1);
    while (st->slot[h]) h = (h + 1) & (st->nslot - 1);
    st->slot[h] = ++st->n;
    *id = (IDTYPE)st->n * 2;
    return 1;
}

static long det_alloc(void *state, int objtype, IDTYPE id)
{
    (void)state;
    (void)objtype;
    (void)id;
    return 0; /* no caller-chosen IDs */
}

static void det_free(void *state, int objtype, IDTYPE id)
{
    (void)state;
    (void)objtype;
    (void)id;
}

static char *det_print(void *state, int objtype, IDTYPE id)
{
    (void)objtype;
    struct det_ids *st = state;
    if (id % 2 != 0 || id == 0 || id / 2 > st->n) return NULL;
    return st->names[id / 2 - 1];
}

static void det_close(void *state)
{
    struct det_ids *st = state;
    if (!st) return;
    free(st->names); /* the strings belong to the graph's string dictionary */
    free(st->slot);
    free(st);
}

static void det_register(void *state, int objtype, void *obj)
{
    (void)state;
    (void)objtype;
    (void)obj;
}

static Agiddisc_t det_id = {det_open, det_map, det_alloc, det_free, det_print, det_close,
                            det_register};
static Agdisc_t det_disc = {&AgMemDisc, &det_id, &AgIoDisc};

static _Thread_local char gv_msgs[1024];
static _Thread_local agusererrf gv_old;

static int gv_collect(char *msg)
{
    size_t n = strlen(gv_msgs);
    if (n + 1 < sizeof(gv_msgs)) snprintf(gv_msgs + n, sizeof(gv_msgs) - n, "%s", msg);
    return 0;
}

void ps_gv_capture_begin(void)
{
    gv_msgs[0] = '\0';
    gv_old = agseterrf(gv_collect);
}

const char *ps_gv_capture_end(void)
{
    agseterrf(gv_old);
    gv_old = NULL;
    size_t n = strlen(gv_msgs);
    while (n && (gv_msgs[n - 1] == '\n' || gv_msgs[n - 1] == ' ')) gv_msgs[--n] = '\0';
    return gv_msgs;
}

/* ---- building -------------------------------------------------------------------------- */

enum { ST_OUT = 0, ST_KEEP = 1, ST_CONTRACT = 2 };

enum gsym { G_NEWRANK, G_RANKDIR, G_LABEL, G_LABELLOC, G_STYLE, G_COLOR, G__N };
enum nsym { N_SHAPE, N_STYLE, N_FILLCOLOR, N_COLOR, N_PERIPHERIES, N_FONTSIZE, N_TOOLTIP, N__N };
enum esym { E_STYLE, E_COLOR, E__N };

struct cedge {
    uint32_t u, w;
    int kind;
    int keep;
};

struct dot {
    struct cedge *ce; /* tasks-only view: contracted edges before the reduction */
    uint32_t n_ce, cap_ce;
    const struct ps_graph *g;
    const struct ps_dot_opts *o;
    Agraph_t *G;
    Agsym_t *gs[G__N], *ns[N__N], *es[E__N];
    uint8_t *state;  /* per node: ST_* */
    Agnode_t **an;   /* per node: its cgraph node when drawn */
    double vlo, vhi; /* value scale */
    double dlo, dhi; /* range of the values themselves */
};

static Agsym_t *decl(Agraph_t *G, int kind, const char *name)
{
    return agattr(G, kind, (char *)name, (char *)"");
}

static void set(void *obj, Agsym_t *sym, const char *value)
{
    agxset(obj, sym, (char *)value);
}

static bool edge_allowed(const struct ps_dot_opts *o, int kind)
{
    switch (kind) {
    case PS_EDGE_DATA:
    case PS_EDGE_PHONY: return true;
    case PS_EDGE_HOST: return o->host_edges;
    case PS_EDGE_STREAM: return o->stream_edges;
    default: return false;
    }
}

static bool in_filter(const struct ps_dot_opts *o, const struct ps_node *nd)
{
    switch (o->filter) {
    case PS_DOT_FORWARD: return nd->phase == PS_PHASE_FWD;
    case PS_DOT_BACKWARD: return nd->phase == PS_PHASE_BWD;
    case PS_DOT_ALL: break;
    }
    return true;
}

static bool kept_in_tasks_view(const struct ps_node *nd)
{
    return ps_node_is_task(nd) || nd->kind == PS_NODE_LOSS || nd->kind == PS_NODE_OPTIM;
}

void ps_dot_opts_init(struct ps_dot_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->filter = PS_DOT_ALL;
}

static void style_node(struct dot *d, uint32_t v, Agnode_t *n)
{
    const struct ps_node *nd = &d->g->nodes[v];
    bool bw = nd->phase == PS_PHASE_BWD;
    const char *shape = "ellipse", *style = "", *fill = "", *color = "", *per = "", *fs = "";
    char tip[160] = "", cbuf[64];
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE:
        shape = "box";
        style = "filled";
        fill = bw ? "#fbd9b5" : "#cfe0f3";
        color = bw ? "#a0522d" : "#1f4e79";
        if (!bw && nd->checkpointed) {
            per = "2";
            snprintf(tip, sizeof(tip), "checkpointed");
        }
        break;
    case PS_NODE_RECOMPUTE:
        shape = bw ? "box" : "ellipse";
        style = "filled";
        fill = bw ? "#c8c8c8" : "#e4e4e4";
        color = "#555555";
        if (!bw) fs = "10";
        break;
    case PS_NODE_WGRAD:
        shape = "box";
        style = "filled";
        fill = "#fdebd3";
        color = "#a0522d";
        break;
    case PS_NODE_COPY:
        shape = "cds";
        style = "filled";
        fill = "#d5ecd4";
        color = "#2e7d32";
        fs = "10";
        break;
    case PS_NODE_WAIT:
        shape = "octagon";
        color = "#555555";
        fs = "10";
        break;
    case PS_NODE_FORK:
    case PS_NODE_JOIN:
        shape = "ellipse";
        color = "#777777";
        fs = "10";
        break;
    case PS_NODE_LOSS:
        shape = "doubleoctagon";
        break;
    case PS_NODE_OPTIM:
        shape = "component";
        break;
    case PS_NODE__COUNT: break;
    }
    /* colouring: callback first, then values */
    const char *c = NULL;
    if (d->o->color) c = d->o->color(d->g, v, d->o->color_ctx, cbuf, (int)sizeof(cbuf));
    if (!c && d->o->node_value && isfinite(d->o->node_value[v])) {
        double x = d->o->node_value[v];
        c = ps_viz_color_scale(x, d->vlo, d->vhi, cbuf);
        size_t k = strlen(tip);
        snprintf(tip + k, sizeof(tip) - k, "%s%s = %.6g", k ? ", " : "",
                 d->o->value_name ? d->o->value_name : "value", x);
    }
    if (c) {
        fill = c;
        style = "filled";
    }
    set(n, d->ns[N_SHAPE], shape);
    set(n, d->ns[N_STYLE], style);
    set(n, d->ns[N_FILLCOLOR], fill);
    set(n, d->ns[N_COLOR], color);
    set(n, d->ns[N_PERIPHERIES], per);
    set(n, d->ns[N_FONTSIZE], fs);
    set(n, d->ns[N_TOOLTIP], tip);
}

static int add_edge(struct dot *d, uint32_t u, uint32_t v, int kind)
{
    Agedge_t *e = agedge(d->G, d->an[u], d->an[v], NULL, 1);
    if (!e) return -ENOMEM;
    switch (kind) {
    case PS_EDGE_PHONY: set(e, d->es[E_STYLE], "dashed"); break;
    case PS_EDGE_HOST:
        set(e, d->es[E_STYLE], "dotted");
        set(e, d->es[E_COLOR], "grey");
        break;
    case PS_EDGE_STREAM:
        set(e, d->es[E_STYLE], "dotted");
        set(e, d->es[E_COLOR], "#1f77b4");
        break;
    default: break;
    }
    return 0;
}

struct target {
    uint32_t v;
    int kind;
};

static int cmp_target(const void *a, const void *b)
{
    const struct target *x = a, *y = b;
    return x->v < y->v ? -1 : x->v > y->v;
}

/* Contracted edges are collected first, then transitively reduced: an edge u -> w is dropped
 * when w is also reachable from another successor of u (torchgpipe's graph has many such
 * shortcuts through fork/join and the recompute lane, e.g. F(0,0) -> F(2,0) via r(1,0), which
 * would otherwise bury the picture). Skipped above PS_DOT_REDUCE_MAX kept nodes (cost). */
#define PS_DOT_REDUCE_MAX 4000

static int push_cedge(struct dot *d, uint32_t u, uint32_t w, int kind)
{
    if (d->n_ce == d->cap_ce) {
        uint32_t c = d->cap_ce ? d->cap_ce * 2 : 256;
        struct cedge *q = realloc(d->ce, (size_t)c * sizeof(*q));
        if (!q) return -ENOMEM;
        d->ce = q;
        d->cap_ce = c;
    }
    d->ce[d->n_ce++] = (struct cedge){u, w, kind, 1};
    return 0;
}

static int reduce_and_add(struct dot *d, uint32_t *seen, uint32_t *stack)
{
    uint32_t nv = d->g->n_nodes, kept = 0, ne = d->n_ce;
    for (uint32_t v = 0; v < nv; v++) kept += d->state[v] == ST_KEEP;
    if (kept <= PS_DOT_REDUCE_MAX && ne) {
        /* CSR over the contracted edges (they are grouped by source already) */
        uint32_t *off = calloc((size_t)nv + 1, sizeof(uint32_t));
        if (!off) return -ENOMEM;
        for (uint32_t e = 0; e < ne; e++) off[d->ce[e].u + 1]++;
        for (uint32_t v = 0; v < nv; v++) off[v + 1] += off[v];
        memset(seen, 0, (size_t)nv * sizeof(uint32_t));
        uint32_t stamp = 0;
        for (uint32_t u = 0; u < nv; u++) {
            if (off[u] == off[u + 1]) continue;
            /* per edge kind k of u's edges: everything reachable from u's successors in one or
               more further steps over edges of kind <= k only. An edge of kind k is redundant
               only when such a path exists: a data edge is never dropped in favour of a path
               that needs a phony edge (B(1,1) -> B(1,0) stays solid next to B(1,1) -> R(1,0) ->
               B(1,0) in a checkpointed GPipe) */
            for (int k = 0; k < PS_EDGE__COUNT; k++) {
                bool has = false;
                for (uint32_t e = off[u]; e < off[u + 1]; e++) has |= d->ce[e].kind == k;
                if (!has) continue;
                stamp++;
                uint32_t sp = 0;
                for (uint32_t e = off[u]; e < off[u + 1]; e++)
                    if (d->ce[e].kind <= k) stack[sp++] = d->ce[e].w;
                while (sp) {
                    uint32_t x = stack[--sp];
                    for (uint32_t e = off[x]; e < off[x + 1]; e++) {
                        uint32_t y = d->ce[e].w;
                        if (d->ce[e].kind > k || seen[y] == stamp) continue;
                        seen[y] = stamp;
                        stack[sp++] = y;
                    }
                }
                for (uint32_t e = off[u]; e < off[u + 1]; e++)
                    if (d->ce[e].kind == k && seen[d->ce[e].w] == stamp) d->ce[e].keep = 0;
            }
        }
        free(off);
    }
    int rc = 0;
    for (uint32_t e = 0; e < ne && !rc; e++)
        if (d->ce[e].keep) rc = add_edge(d, d->ce[e].u, d->ce[e].w, d->ce[e].kind);
    return rc;
}

/* Tasks-only edges: for each kept node u (index order), the kept nodes reachable through
 * contracted nodes; kind = smallest k such that a path uses only allowed kinds <= k. */
static int contracted_edges(struct dot *d)
{
    const struct ps_graph *g = d->g;
    uint32_t nv = g->n_nodes;
    uint32_t *seen = calloc(nv ? nv : 1, sizeof(uint32_t));   /* BFS stamp */
    uint32_t *found = calloc(nv ? nv : 1, sizeof(uint32_t));  /* target stamp (per u) */
    uint32_t *queue = malloc((nv ? nv : 1) * sizeof(uint32_t));
    struct target *tg = malloc((nv ? nv : 1) * sizeof(struct target));
    int rc = 0;
    if (!seen || !found || !queue || !tg) {
        rc = -ENOMEM;
        goto out;
    }
    uint32_t stamp = 0, ustamp = 0;
    for (uint32_t u = 0; u < nv && !rc; u++) {
        if (d->state[u] != ST_KEEP) continue;
        ustamp++;
        uint32_t nt = 0;
        for (int k = 0; k < PS_EDGE__COUNT; k++) {
            if (!edge_allowed(d->o, k)) continue;
            stamp++;
            uint32_t qh = 0, qt = 0;
            queue[qt++] = u;
            seen[u] = stamp;
            while (qh < qt) {
                uint32_t x = queue[qh++];
                for (uint32_t a = g->out_off[x]; a < g->out_off[x + 1]; a++) {
                    const struct ps_edge *e = &g->edges[g->out_edge[a]];
                    if (e->kind > k || !edge_allowed(d->o, e->kind)) continue;
                    uint32_t w = e->dst;
                    if (w == u || seen[w] == stamp) continue;
                    seen[w] = stamp;
                    if (d->state[w] == ST_KEEP) {
                        if (found[w] != ustamp) {
                            found[w] = ustamp;
                            tg[nt++] = (struct target){w, k};
                        }
                    } else if (d->state[w] == ST_CONTRACT) {
                        queue[qt++] = w;
                    }
                }
            }
        }
        qsort(tg, nt, sizeof(*tg), cmp_target);
        for (uint32_t t = 0; t < nt && !rc; t++) rc = push_cedge(d, u, tg[t].v, tg[t].kind);
    }
    if (!rc) rc = reduce_and_add(d, seen, queue);
out:
    free(seen);
    free(found);
    free(queue);
    free(tg);
    free(d->ce);
    d->ce = NULL;
    d->n_ce = d->cap_ce = 0;
    return rc;
}

static void value_range(struct dot *d)
{
    const struct ps_dot_opts *o = d->o;
    d->vlo = o->value_min;
    d->vhi = o->value_max;
    if (!o->node_value || o->value_min != 0 || o->value_max != 0) return;
    bool any = false;
    for (uint32_t v = 0; v < d->g->n_nodes; v++) {
        double x = o->node_value[v];
        if (d->state[v] != ST_KEEP || !isfinite(x)) continue;
        if (!any || x < d->vlo) d->vlo = x;
        if (!any || x > d->vhi) d->vhi = x;
        any = true;
    }
    d->dlo = d->vlo;
    d->dhi = d->vhi;
    /* errors: white is 0, red the largest positive, blue the largest negative magnitude, so the
       colour of a value says how large it is (values all in 0.999..1 are all dark red, not a
       white-to-red ramp over a 0.1% range) */
    double m = fmax(fabs(d->vlo), fabs(d->vhi));
    if (m > 0) {
        d->vlo = -m;
        d->vhi = m;
    }
}

int ps_dot_build(const struct ps_graph *g, const struct ps_dot_opts *opts, Agraph_t **out,
                 struct ps_diag *diag)
{
    struct ps_dot_opts defaults;
    if (!opts) {
        ps_dot_opts_init(&defaults);
        opts = &defaults;
    }
    *out = NULL;
    if (!g->out_off)
        return ps_diag_set(diag, -EINVAL, "graph", "the graph is not finalized");
    struct dot d = {.g = g, .o = opts};
    uint32_t nv = g->n_nodes;
    int nd_dev = g->n_devices > 0 ? g->n_devices : 0;
    d.state = calloc(nv ? nv : 1, 1);
    d.an = calloc(nv ? nv : 1, sizeof(*d.an));
    Agraph_t **cl = calloc((size_t)nd_dev + 1, sizeof(*cl));
    bool *used = calloc((size_t)nd_dev + 1, sizeof(*used));
    int rc = 0;
    char name[96], buf[256];
    ps_gv_capture_begin();
    if (!d.state || !d.an || !cl || !used) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t v = 0; v < nv; v++) {
        const struct ps_node *nd = &g->nodes[v];
        if (!in_filter(opts, nd)) continue;
        d.state[v] = (!opts->tasks_only || kept_in_tasks_view(nd)) ? ST_KEEP : ST_CONTRACT;
        if (d.state[v] == ST_KEEP && nd->device >= 0 && nd->device < nd_dev) used[nd->device] = 1;
    }
    value_range(&d);

    d.G = agopen((char *)"pipescope", Agdirected, &det_disc);
    if (!d.G) {
        rc = -ENOMEM;
        goto fail;
    }
    /* declarations first, in a fixed order (D1) */
    static const char *const gnames[G__N] = {"newrank", "rankdir", "label",
                                             "labelloc", "style",   "color"};
    static const char *const nnames[N__N] = {"shape",       "style",    "fillcolor", "color",
                                             "peripheries", "fontsize", "tooltip"};
    static const char *const enames[E__N] = {"style", "color"};
    for (int k = 0; k < G__N; k++) d.gs[k] = decl(d.G, AGRAPH, gnames[k]);
    for (int k = 0; k < N__N; k++) d.ns[k] = decl(d.G, AGNODE, nnames[k]);
    for (int k = 0; k < E__N; k++) d.es[k] = decl(d.G, AGEDGE, enames[k]);
    for (int k = 0; k < G__N; k++)
        if (!d.gs[k]) rc = -ENOMEM;
    for (int k = 0; k < N__N; k++)
        if (!d.ns[k]) rc = -ENOMEM;
    for (int k = 0; k < E__N; k++)
        if (!d.es[k]) rc = -ENOMEM;
    if (rc) goto fail;

    set(d.G, d.gs[G_NEWRANK], "true");
    set(d.G, d.gs[G_RANKDIR], opts->rankdir ? opts->rankdir : "LR");
    {
        char label[512] = "";
        if (opts->title) snprintf(label, sizeof(label), "%s", opts->title);
        if (opts->node_value) {
            size_t k = strlen(label);
            if (opts->value_min != 0 || opts->value_max != 0)
                snprintf(label + k, sizeof(label) - k, "%s%s: %.3g .. %.3g", k ? "\n" : "",
                         opts->value_name ? opts->value_name : "value", d.vlo, d.vhi);
            else
                snprintf(label + k, sizeof(label) - k,
                         "%s%s: %.3g .. %.3g (colours: blue %.3g, white 0, red %.3g)",
                         k ? "\n" : "", opts->value_name ? opts->value_name : "value", d.dlo,
                         d.dhi, d.vlo, d.vhi);
        }
        if (label[0]) {
            set(d.G, d.gs[G_LABEL], label);
            set(d.G, d.gs[G_LABELLOC], "t");
        }
    }
    for (int dev = 0; dev < nd_dev; dev++) {
        if (!used[dev]) continue;
        snprintf(name, sizeof(name), "cluster_dev%d", dev);
        cl[dev] = agsubg(d.G, name, 1);
        if (!cl[dev]) {
            rc = -ENOMEM;
            goto fail;
        }
        set(cl[dev], d.gs[G_LABEL], ps_viz_device_name(g, dev, buf, (int)sizeof(buf)));
        set(cl[dev], d.gs[G_STYLE], "rounded");
        set(cl[dev], d.gs[G_COLOR], "#999999");
    }
    for (uint32_t v = 0; v < nv; v++) {
        if (d.state[v] != ST_KEEP) continue;
        const struct ps_node *nd = &g->nodes[v];
        ps_node_name(g, v, name, (int)sizeof(name));
        if (agnode(d.G, name, 0)) { /* names are unique in built graphs; keep it so anyway */
            size_t k = strlen(name);
            snprintf(name + k, sizeof(name) - k, "#%u", v);
        }
        Agraph_t *home = nd->device >= 0 && nd->device < nd_dev ? cl[nd->device] : d.G;
        d.an[v] = agnode(home, name, 1);
        if (!d.an[v]) {
            rc = -ENOMEM;
            goto fail;
        }
        style_node(&d, v, d.an[v]);
    }
    if (opts->tasks_only) {
        rc = contracted_edges(&d);
    } else {
        for (uint32_t e = 0; e < g->n_edges && !rc; e++) {
            const struct ps_edge *ed = &g->edges[e];
            if (!edge_allowed(opts, ed->kind)) continue;
            if (d.state[ed->src] != ST_KEEP || d.state[ed->dst] != ST_KEEP) continue;
            rc = add_edge(&d, ed->src, ed->dst, ed->kind);
        }
    }
    if (rc) goto fail;
    ps_gv_capture_end();
    free(d.state);
    free(d.an);
    free(cl);
    free(used);
    *out = d.G;
    return 0;

fail: {
    const char *msg = ps_gv_capture_end();
    if (d.G) agclose(d.G);
    free(d.state);
    free(d.an);
    free(cl);
    free(used);
    if (rc == -ENOMEM)
        return ps_diag_set(diag, rc, "graphviz", "out of memory building the graph%s%s",
                           msg[0] ? ": " : "", msg);
    return ps_diag_set(diag, rc, "graphviz", "cannot build the graph: %s", msg);
}
}

int ps_dot_write(const struct ps_graph *g, const struct ps_dot_opts *o, FILE *f,
                 struct ps_diag *diag)
{
    Agraph_t *G;
    int rc = ps_dot_build(g, o, &G, diag);
    if (rc < 0) return rc;
    ps_gv_capture_begin();
    int w = agwrite(G, f);
    const char *msg = ps_gv_capture_end();
    agclose(G);
    if (w != 0 || ferror(f))
        return ps_diag_set(diag, -EIO, "dot", "cannot write the graph%s%s", msg[0] ? ": " : "",
                           msg);
    return 0;
}

struct dot_args {
    const struct ps_graph *g;
    const struct ps_dot_opts *o;
    int (*write)(const struct ps_graph *, const struct ps_dot_opts *, FILE *, struct ps_diag *);
};

static int write_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    struct dot_args *a = ctx;
    return a->write(a->g, a->o, f, diag);
}

int ps_graph_format_write_file(const struct ps_graph_format *fmt, const struct ps_graph *g,
                               const struct ps_dot_opts *o, const char *path,
                               struct ps_diag *diag)
{
    struct dot_args a = {g, o, fmt->write};
    return ps_out_write(path, write_cb, &a, diag);
}

int ps_dot_write_file(const struct ps_graph *g, const struct ps_dot_opts *o, const char *path,
                      struct ps_diag *diag)
{
    struct dot_args a = {g, o, ps_dot_write};
    return ps_out_write(path, write_cb, &a, diag);
}

/* ---- the ops table of graph formats ----------------------------------------------------- */

const struct ps_graph_format ps_graph_formats[] = {
    {"dot", ".dot", ps_dot_write},
    {"svg", ".svg", ps_svg_write},
};
const int ps_graph_n_formats = (int)(sizeof(ps_graph_formats) / sizeof(ps_graph_formats[0]));

const struct ps_graph_format *ps_graph_format_find(const char *s)
{
    if (!s) return NULL;
    const char *dot = strrchr(s, '.'), *slash = strrchr(s, '/');
    for (int k = 0; k < ps_graph_n_formats; k++) {
        const struct ps_graph_format *f = &ps_graph_formats[k];
        if (strcmp(s, f->name) == 0) return f;
        if (dot && (!slash || dot > slash) && strcmp(dot, f->ext) == 0) return f;
    }
    if (dot && (!slash || dot > slash) && strcmp(dot, ".gv") == 0) return &ps_graph_formats[0];
    return NULL;
}

/* ---- legend ------------------------------------------------------------------------------ */

/* The node shapes and edge styles of style_node/add_edge, drawn by hand as a small SVG (the
 * report shows it under the graph). Same colours as above; keep the two in step. */
char *ps_dot_legend_svg(void)
{
    static const char *const items[][2] = {
        {"<rect x='4' y='4' width='36' height='20' fill='#cfe0f3' stroke='#1f4e79'/>",
         "F(i,j) forward"},
        {"<rect x='4' y='4' width='36' height='20' fill='#cfe0f3' stroke='#1f4e79'/>"
         "<rect x='7' y='7' width='30' height='14' fill='none' stroke='#1f4e79'/>",
         "F checkpointed (double border)"},
        {"<rect x='4' y='4' width='36' height='20' fill='#fbd9b5' stroke='#a0522d'/>",
         "B(i,j) backward"},
        {"<rect x='4' y='4' width='36' height='20' fill='#fdebd3' stroke='#a0522d'/>",
         "Wg(i,j) weight gradient"},
        {"<rect x='4' y='4' width='36' height='20' fill='#c8c8c8' stroke='#555555'/>",
         "R(i,j) recompute"},
        {"<ellipse cx='22' cy='14' rx='16' ry='9' fill='#e4e4e4' stroke='#555555'/>",
         "r(i,j) recompute's forward side"},
        {"<polygon points='4,4 34,4 40,14 34,24 4,24 10,14' fill='#d5ecd4' stroke='#2e7d32'/>",
         "C(i,j-&gt;k) copy"},
        {"<polygon points='14,4 30,4 40,10 40,18 30,24 14,24 4,18 4,10' fill='none' "
         "stroke='#555555'/>",
         "W, Wo: stream waits"},
        {"<ellipse cx='22' cy='14' rx='16' ry='9' fill='none' stroke='#777777'/>",
         "fork / join (phony)"},
        {"<polygon points='14,3 30,3 41,10 41,18 30,25 14,25 3,18 3,10' fill='none' "
         "stroke='#000000'/><polygon points='15,6 29,6 38,11 38,17 29,22 15,22 6,17 6,11' "
         "fill='none' stroke='#000000'/>",
         "loss"},
        {"<rect x='8' y='4' width='32' height='20' fill='none' stroke='#000000'/>"
         "<rect x='4' y='8' width='8' height='4' fill='#ffffff' stroke='#000000'/>"
         "<rect x='4' y='16' width='8' height='4' fill='#ffffff' stroke='#000000'/>",
         "opt(j) optimizer step"},
        {"<line x1='2' y1='14' x2='36' y2='14' stroke='#000000'/>"
         "<polygon points='36,10 43,14 36,18' fill='#000000'/>",
         "data edge: a tensor or gradient flows"},
        {"<line x1='2' y1='14' x2='36' y2='14' stroke='#000000' stroke-dasharray='5,3'/>"
         "<polygon points='36,10 43,14 36,18' fill='#000000'/>",
         "phony edge: ordering only (fork/join)"},
    };
    enum { N = sizeof(items) / sizeof(items[0]), COLS = 3 };
    const double cw = 300, rh = 30;
    const int rows = (N + COLS - 1) / COLS;
    size_t cap = 8192;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t k = (size_t)snprintf(buf, cap,
                                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
                                "height=\"%d\" font-family=\"Helvetica, Arial, sans-serif\" "
                                "font-size=\"12\">\n",
                                (int)(cw * COLS), (int)(rh * rows + 8));
    for (int i = 0; i < N && k < cap; i++) {
        double x = (i % COLS) * cw, y = (i / COLS) * rh + 2;
        k += (size_t)snprintf(buf + k, cap - k,
                              "<g transform=\"translate(%.0f,%.0f)\">%s<text x=\"50\" y=\"18\">"
                              "%s</text></g>\n",
                              x, y, items[i][0], items[i][1]);
    }
    if (k + 8 >= cap) {
        free(buf);
        return NULL;
    }
    memcpy(buf + k, "</svg>\n", 8);
    return buf;
}
