/* viz_fixture: a small hand-built task graph and trace, and file helpers, shared by the viz
 * tests (test_viz.c, test_viz_gvc.c). No spec parser involved: spec = NULL, model = NULL, so
 * device d of the graph is named "cuda:d".
 *
 * Forward (devices: 0 = F(.,0) side, 1 = F(.,1) side):
 *
 *   F(0,0) -> Wo(0,0) -> C(0,0->1) -> W(0,1) -> F(0,1) -> loss
 *     |  \--> fork(0,0) ..phony..> join(1,0) -> F(1,0) ----^
 *     +--> rfork(0,0) ..phony..> r(0,0)            (F(0,0) is checkpointed)
 *   backward: loss' -> B(0,1) -> C(0,1->0) -> R(0,0) ..> B(0,0);  loss' -> B(1,0) ..> R(0,0)
 *   host: F(0,0) -> F(1,0), B(0,0) -> opt(0), B(1,0) -> opt(0);  stream: F(0,0) -> F(1,0)
 */
#ifndef PS_VIZ_FIXTURE_H
#define PS_VIZ_FIXTURE_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/graph.h"
#include "src/trace.h"

static inline uint32_t fx_node(struct ps_graph *g, enum ps_node_kind kind, enum ps_phase phase,
                               enum ps_role role, int mb, int part, int dev, int32_t stream)
{
    struct ps_node nd = {0};
    nd.kind = (uint8_t)kind;
    nd.phase = (uint8_t)phase;
    nd.role = (uint8_t)role;
    nd.mb = mb;
    nd.part = part;
    nd.peer = -1;
    nd.device = dev;
    nd.stream = stream;
    nd.wait_on = -1;
    nd.tick = -1;
    nd.twin = PS_NONE;
    nd.n_seq = 1;
    return ps_graph_add_node(g, &nd);
}

static inline void fx_twin(struct ps_graph *g, uint32_t a, uint32_t b)
{
    g->nodes[a].twin = b;
    g->nodes[b].twin = a;
}

static inline struct ps_graph *fx_small_graph(void)
{
    struct ps_variant o = {0};
    o.schedule = PS_SCHED_GPIPE;
    o.checkpoint = PS_CKPT_EXCEPT_LAST;
    o.phony = true;
    o.chunks = 2;
    o.virtual_stages = 1;
    struct ps_graph *g = ps_graph_create(NULL, NULL, &o, 2, 2);
    if (!g) return NULL;
    int32_t c0 = ps_graph_add_stream(g, PS_STREAM_COMPUTE, 0, -1, -1);
    int32_t c1 = ps_graph_add_stream(g, PS_STREAM_COMPUTE, 1, -1, -1);
    int32_t k00 = ps_graph_add_stream(g, PS_STREAM_COPY, 0, 0, 0);
    int32_t k10 = ps_graph_add_stream(g, PS_STREAM_COPY, 1, 1, 0);
    const enum ps_phase F = PS_PHASE_FWD, B = PS_PHASE_BWD;
    uint32_t f00 = fx_node(g, PS_NODE_COMPUTE, F, PS_ROLE_NONE, 0, 0, 0, c0);      /* 0 */
    g->nodes[f00].checkpointed = 1;
    uint32_t wo = fx_node(g, PS_NODE_WAIT, F, PS_ROLE_OUT, 0, 0, 0, k00);          /* 1 */
    g->nodes[wo].wait_on = c0;
    uint32_t cp = fx_node(g, PS_NODE_COPY, F, PS_ROLE_NONE, 0, 0, 0, k00);         /* 2 */
    g->nodes[cp].peer = 1;
    g->nodes[cp].wait_on = k10;
    uint32_t wi = fx_node(g, PS_NODE_WAIT, F, PS_ROLE_IN, 0, 1, 1, c1);            /* 3 */
    g->nodes[wi].wait_on = k10;
    uint32_t f01 = fx_node(g, PS_NODE_COMPUTE, F, PS_ROLE_NONE, 0, 1, 1, c1);      /* 4 */
    uint32_t fk = fx_node(g, PS_NODE_FORK, F, PS_ROLE_DEPEND, 0, 0, 0, -1);        /* 5 */
    uint32_t jn = fx_node(g, PS_NODE_JOIN, F, PS_ROLE_DEPEND, 1, 0, 0, -1);        /* 6 */
    uint32_t f10 = fx_node(g, PS_NODE_COMPUTE, F, PS_ROLE_NONE, 1, 0, 0, c0);      /* 7 */
    uint32_t rf = fx_node(g, PS_NODE_FORK, F, PS_ROLE_RECOMPUTE, 0, 0, 0, -1);     /* 8 */
    uint32_t r = fx_node(g, PS_NODE_RECOMPUTE, F, PS_ROLE_NONE, 0, 0, 0, c0);      /* 9 */
    uint32_t loss = fx_node(g, PS_NODE_LOSS, F, PS_ROLE_NONE, -1, 1, 1, -1);       /* 10 */
    uint32_t lossb = fx_node(g, PS_NODE_LOSS, B, PS_ROLE_NONE, -1, 1, 1, -1);      /* 11 */
    uint32_t b01 = fx_node(g, PS_NODE_COMPUTE, B, PS_ROLE_NONE, 0, 1, 1, c1);      /* 12 */
    uint32_t cb = fx_node(g, PS_NODE_COPY, B, PS_ROLE_NONE, 0, 1, 1, k10);         /* 13 */
    g->nodes[cb].peer = 0;
    g->nodes[cb].wait_on = k00;
    uint32_t rb = fx_node(g, PS_NODE_RECOMPUTE, B, PS_ROLE_NONE, 0, 0, 0, c0);     /* 14 */
    uint32_t b00 = fx_node(g, PS_NODE_COMPUTE, B, PS_ROLE_NONE, 0, 0, 0, c0);      /* 15 */
    uint32_t b10 = fx_node(g, PS_NODE_COMPUTE, B, PS_ROLE_NONE, 1, 0, 0, c0);      /* 16 */
    uint32_t opt = fx_node(g, PS_NODE_OPTIM, F, PS_ROLE_NONE, -1, 0, 0, c0);       /* 17 */
    fx_twin(g, f00, b00);
    fx_twin(g, f01, b01);
    fx_twin(g, f10, b10);
    fx_twin(g, r, rb);
    fx_twin(g, loss, lossb);
    fx_twin(g, cp, cb);
    ps_graph_add_edge(g, f00, wo, PS_EDGE_DATA);
    ps_graph_add_edge(g, wo, cp, PS_EDGE_DATA);
    ps_graph_add_edge(g, cp, wi, PS_EDGE_DATA);
    ps_graph_add_edge(g, wi, f01, PS_EDGE_DATA);
    ps_graph_add_edge(g, f01, loss, PS_EDGE_DATA);
    ps_graph_add_edge(g, f00, fk, PS_EDGE_DATA);
    ps_graph_add_edge(g, fk, jn, PS_EDGE_PHONY);
    ps_graph_add_edge(g, jn, f10, PS_EDGE_DATA);
    ps_graph_add_edge(g, f10, loss, PS_EDGE_DATA);
    ps_graph_add_edge(g, f00, rf, PS_EDGE_DATA);
    ps_graph_add_edge(g, rf, r, PS_EDGE_PHONY);
    ps_graph_add_edge(g, f00, f10, PS_EDGE_HOST);
    ps_graph_add_edge(g, f00, f10, PS_EDGE_STREAM);
    ps_graph_add_edge(g, lossb, b01, PS_EDGE_DATA);
    ps_graph_add_edge(g, b01, cb, PS_EDGE_DATA);
    ps_graph_add_edge(g, cb, rb, PS_EDGE_DATA);
    ps_graph_add_edge(g, rb, b00, PS_EDGE_PHONY);
    ps_graph_add_edge(g, lossb, b10, PS_EDGE_DATA);
    ps_graph_add_edge(g, b10, rb, PS_EDGE_PHONY);
    ps_graph_add_edge(g, b00, opt, PS_EDGE_HOST);
    ps_graph_add_edge(g, b10, opt, PS_EDGE_HOST);
    if (ps_graph_finalize(g) != 0) {
        ps_graph_destroy(g);
        return NULL;
    }
    return g;
}

/* A timeline of the small graph: 13 records, one of them unmapped and one renamed.
 * Cross-stream DATA/PHONY edges between recorded nodes: F(0,0)->Wo, C->W(0,1), F(0,1)->loss,
 * F(1,0)->loss, B(0,1)->C', C'->R(0,0): 6 flows. */
static inline int fx_small_trace(struct ps_trace *t)
{
    ps_trace_init(t, PS_TRACE_SIMULATED);
    int rc = 0;
    rc |= ps_trace_add(t, 0, 0, 0, 0, 10, NULL);       /* F(0,0) */
    rc |= ps_trace_add(t, 1, 0, 2, 10, 1, NULL);       /* Wo(0,0) */
    rc |= ps_trace_add(t, 2, 0, 2, 11, 5, NULL);       /* C(0,0->1) */
    rc |= ps_trace_add(t, 3, 1, 1, 16, 0.5, NULL);     /* W(0,1) */
    rc |= ps_trace_add(t, 4, 1, 1, 16.5, 10, NULL);    /* F(0,1) */
    rc |= ps_trace_add(t, 7, 0, 0, 10, 10, NULL);      /* F(1,0) */
    rc |= ps_trace_add(t, 10, 1, -1, 26.5, 1, NULL);   /* loss (host) */
    rc |= ps_trace_add(t, 12, 1, 1, 30, 20, NULL);     /* B(0,1) */
    rc |= ps_trace_add(t, 16, 0, 0, 35, 20, "B(1,0) \"renamed\""); /* B(1,0) */
    rc |= ps_trace_add(t, 13, 1, 3, 50, 5, NULL);      /* C(0,1->0) */
    rc |= ps_trace_add(t, 14, 0, 0, 55, 10, NULL);     /* R(0,0) */
    rc |= ps_trace_add(t, 15, 0, 0, 65, 20.123456, NULL); /* B(0,0) */
    rc |= ps_trace_add(t, UINT32_MAX, 0, 0, 1, 2, "kernel<x>&y"); /* unmapped */
    return rc;
}

static inline char *fx_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            char *q = realloc(buf, cap * 2);
            if (!q) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = q;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static inline int fx_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Minimal XML well-formedness check: prolog, comments, DOCTYPE, balanced tags with quoted
 * attributes, entities in text, a single root. Returns 0 when well formed. */
static inline int fx_xml_check(const char *s)
{
    const char *stack[256];
    size_t stlen[256];
    int depth = 0, roots = 0;
    const char *p = s;
    while (*p) {
        if (*p != '<') {
            if (*p == '&') {
                const char *semi = strchr(p, ';');
                if (!semi || semi - p > 10) return -1;
                p = semi + 1;
                continue;
            }
            if (depth == 0 && !isspace((unsigned char)*p)) return -2;
            p++;
            continue;
        }
        if (strncmp(p, "<?", 2) == 0) {
            const char *e = strstr(p, "?>");
            if (!e) return -3;
            p = e + 2;
        } else if (strncmp(p, "<!--", 4) == 0) {
            const char *e = strstr(p + 4, "-->");
            if (!e) return -4;
            p = e + 3;
        } else if (strncmp(p, "<!", 2) == 0) {
            const char *e = strchr(p, '>');
            if (!e) return -5;
            p = e + 1;
        } else if (p[1] == '/') {
            const char *n = p + 2, *e = n;
            while (*e && !isspace((unsigned char)*e) && *e != '>') e++;
            if (depth == 0 || stlen[depth - 1] != (size_t)(e - n) ||
                strncmp(stack[depth - 1], n, (size_t)(e - n)) != 0)
                return -6;
            depth--;
            while (isspace((unsigned char)*e)) e++;
            if (*e != '>') return -7;
            p = e + 1;
        } else {
            const char *n = p + 1, *e = n;
            if (!isalpha((unsigned char)*n) && *n != '_') return -8;
            while (*e && !isspace((unsigned char)*e) && *e != '>' && *e != '/') e++;
            const char *q = e;
            for (;;) { /* attributes */
                while (isspace((unsigned char)*q)) q++;
                if (*q == '>' || (q[0] == '/' && q[1] == '>')) break;
                if (!isalpha((unsigned char)*q) && *q != '_' && *q != ':') return -9;
                while (*q && *q != '=' && !isspace((unsigned char)*q)) q++;
                while (isspace((unsigned char)*q)) q++;
                if (*q++ != '=') return -10;
                while (isspace((unsigned char)*q)) q++;
                char quote = *q++;
                if (quote != '"' && quote != '\'') return -11;
                while (*q && *q != quote) {
                    if (*q == '<') return -12;
                    q++;
                }
                if (!*q) return -13;
                q++;
            }
            if (depth == 0 && ++roots > 1) return -14;
            if (*q == '/') {
                p = q + 2;
            } else {
                if (depth == 256) return -15;
                stack[depth] = n;
                stlen[depth] = (size_t)(e - n);
                depth++;
                p = q + 1;
            }
        }
    }
    return depth == 0 && roots == 1 ? 0 : -16;
}

/* Runs python3's xml.etree on a file: 0 ok, 1 parse error, 77 no python3. */
static inline int fx_xml_python(const char *path)
{
    char cmd[1024];
    if (system("python3 -c 'import xml.etree.ElementTree' >/dev/null 2>&1") != 0) return 77;
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' '%s'",
             path);
    return system(cmd) == 0 ? 0 : 1;
}

#endif
