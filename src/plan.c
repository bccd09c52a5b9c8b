/* plan: explicit per-lane action lists (plan.h) and the graphs built from them. The schedules in
 * src/sched/ generate plans; a user writes one by hand (--actions). Building a plan's graph,
 * ordering it and describing a deadlock are the same for all of them, so they live here once.
 */
#include "src/plan.h"
#include "src/file.h"
#include "src/json_in.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_plan_finish(struct ps_plan *p)
{
    if (!p) return;
    if (p->act)
        for (int l = 0; l < p->n_lanes; l++) free(p->act[l]);
    free(p->act);
    free(p->len);
    free(p->lane_device);
    free(p->source);
    memset(p, 0, sizeof(*p));
}

int ps_plan_alloc(struct ps_plan *p, int lanes, int stages, int m, uint32_t per_lane)
{
    memset(p, 0, sizeof(*p));
    p->n_lanes = lanes;
    p->n_stages = stages;
    p->m = m;
    p->len = calloc((size_t)lanes, sizeof(uint32_t));
    p->act = calloc((size_t)lanes, sizeof(*p->act));
    p->lane_device = calloc((size_t)lanes, sizeof(int));
    if (!p->len || !p->act || !p->lane_device) return -ENOMEM;
    for (int l = 0; l < lanes; l++)
        if (!(p->act[l] = malloc(((size_t)per_lane + 1) * sizeof(struct ps_action))))
            return -ENOMEM;
    return 0;
}

void ps_plan_push(struct ps_plan *p, int lane, enum ps_action_kind k, int mb, int stage)
{
    p->act[lane][p->len[lane]++] = (struct ps_action){.kind = (uint8_t)k, .mb = mb, .stage = stage};
}

int ps_plan_stage_device(const struct ps_spec *spec, int stage)
{
    return spec ? spec->device_id[stage] : stage;
}

/* ---- hand-written plans ------------------------------------------------------------------- */

int ps_plan_parse(const char *json, const char *name, const struct ps_spec *spec,
                  struct ps_plan *out, struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    static const struct ps_json_doc doc = {"an --actions plan", "{\"stages\": [[\"F0\", ...], ...]}"};
    cJSON *root;
    int prc = ps_json_parse_doc(json, strlen(json), name, &doc, &root, diag);
    if (prc) return prc;
    int rc = 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stages");
    int S = spec->n_partitions, m = spec->mb_count;
    if (!cJSON_IsArray(st)) {
        rc = ps_diag_set(diag, -EINVAL, name, "stages: expected an array of action lists");
        goto out;
    }
    if (cJSON_GetArraySize(st) != S) {
        rc = ps_diag_set(diag, -EINVAL, name, "stages: %d lists, but the spec has %d partitions",
                         cJSON_GetArraySize(st), S);
        goto out;
    }
    uint32_t most = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, st)
    {
        if (!cJSON_IsArray(l)) {
            rc = ps_diag_set(diag, -EINVAL, name, "stages: expected arrays of strings");
            goto out;
        }
        if ((uint32_t)cJSON_GetArraySize(l) > most) most = (uint32_t)cJSON_GetArraySize(l);
    }
    if ((rc = ps_plan_alloc(out, S, S, m, most))) {
        rc = ps_diag_set(diag, rc, name, "out of memory");
        goto out;
    }
    int s = 0;
    cJSON_ArrayForEach(l, st)
    {
        out->lane_device[s] = ps_plan_stage_device(spec, s);
        int k = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, l)
        {
            char where[64];
            snprintf(where, sizeof(where), "stages[%d][%d]", s, k);
            const char *t = cJSON_IsString(a) ? a->valuestring : NULL;
            char *end = NULL;
            long i = t && t[0] && t[1] ? strtol(t + 1, &end, 10) : -1;
            enum ps_action_kind kind = PS_ACT_F;
            if (t && t[0] == 'B') kind = PS_ACT_B;
            else if (t && t[0] == 'W') kind = PS_ACT_W;
            else if (!t || t[0] != 'F') i = -1;
            if (i < 0 || !end || *end) {
                rc = ps_diag_set(diag, -EINVAL, name, "%s: expected \"F<i>\", \"B<i>\" or \"W<i>\"",
                                 where);
                goto out;
            }
            if (i >= m) {
                rc = ps_diag_set(diag, -EINVAL, name,
                                 "%s: micro-batch %ld, but there are %d micro-batches", where, i,
                                 m);
                goto out;
            }
            if (kind == PS_ACT_W) out->split = true;
            ps_plan_push(out, s, kind, (int)i, s);
            k++;
        }
        s++;
    }
out:
    cJSON_Delete(root);
    if (rc) ps_plan_finish(out);
    return rc;
}

int ps_plan_load(const char *path, const struct ps_spec *spec, struct ps_plan *out,
                 struct ps_diag *diag)
{
    memset(out, 0, sizeof(*out));
    struct ps_file_opts fo = {.factor = 8.0}; /* text + cJSON tree */
    char *buf;
    size_t n;
    int rc = ps_file_read(path, &fo, &buf, &n, diag);
    if (rc) return rc;
    const char *nul = memchr(buf, '\0', n);
    if (nul) { /* the parsers read up to the first NUL: the rest of the row would be lost */
        int line, col;
        ps_file_line_col(buf, (size_t)(nul - buf), &line, &col);
        char where[PS_DIAG_WHERE_MAX];
        snprintf(where, sizeof(where), "%s:%d", path, line);
        free(buf);
        return ps_diag_set(diag, -EINVAL, where, "a NUL byte in the line (not a text file?)");
    }
    const char *first = buf;
    while (*first == ' ' || *first == '\t' || *first == '\n' || *first == '\r') first++;
    rc = *first == '{' ? ps_plan_parse(buf, path, spec, out, diag)
                       : ps_plan_csv_parse(buf, path, spec, out, diag);
    free(buf);
    if (rc == 0 && !(out->source = strdup(path))) {
        ps_plan_finish(out);
        return ps_diag_set(diag, -ENOMEM, path, "out of memory");
    }
    return rc;
}

/* ---- graph of a plan ---------------------------------------------------------------------- */

struct pb {
    struct ps_graph *g;
    const struct ps_plan *plan;
    int S, m;
    int32_t *compute; /* per device */
    int32_t *cs;      /* cs[s*m + i] */
    uint64_t *seq;    /* per thread */
    uint32_t *W, *Wo, *C;   /* forward W(i,s), Wo(i,s), C(i,s->s+1) at [i*S+s] */
    uint32_t *W2, *Wo2, *C2; /* their backward twins W'(i,s), Wo'(i,s), C'(i,s->s-1) */
    uint32_t *Wg;
    uint8_t *has_w;         /* the cell's backward is split: a W action exists for it */
    uint8_t *turn;          /* turn[s]: stages s and s+1 run in one lane (a V's turn): the
                               output stays on the device, no wait or copy (PyTorch passes it
                               locally, "V-schedule special case") */
    uint32_t *stage_last;   /* last gradient node of each stage, for the optimizer */
    int *stage_dev;
    uint32_t prev;          /* host chain of the current lane */
};

static int32_t cstream(struct pb *b, int s, int i)
{
    int32_t *p = &b->cs[(size_t)s * b->m + i];
    if (*p < 0) *p = ps_graph_add_stream(b->g, PS_STREAM_COPY, b->stage_dev[s], s, i);
    return *p;
}

static uint32_t node(struct pb *b, enum ps_node_kind kind, enum ps_phase ph, enum ps_role role,
                     int mb, int part, int dev, int32_t stream, int32_t wait_on, int tick)
{
    struct ps_node nd = {0};
    nd.kind = (uint8_t)kind;
    nd.phase = (uint8_t)ph;
    nd.role = (uint8_t)role;
    nd.thread = (uint16_t)(1 + dev);
    nd.n_seq = 1;
    nd.mb = mb;
    nd.part = part;
    nd.peer = -1;
    nd.device = dev;
    nd.stream = stream;
    nd.wait_on = wait_on;
    nd.tick = tick;
    nd.twin = PS_NONE;
    nd.seq = b->seq[1 + dev]++;
    uint32_t v = ps_graph_add_node(b->g, &nd);
    ps_graph_add_edge(b->g, b->prev, v, PS_EDGE_HOST);
    b->prev = v;
    return v;
}

static void twin(struct ps_graph *g, uint32_t a, uint32_t c)
{
    if (a == PS_NONE || c == PS_NONE) return;
    g->nodes[a].twin = c;
    g->nodes[c].twin = a;
}

/* FLOPs and bytes of the weight-gradient half of a partition's backward, per sample: the
 * weight gradient of a linear or conv layer costs as much as its forward (dW = dY^T X), the
 * rest of the backward (input gradients, BN, relu...) is the B half. */
static void wgrad_share(const struct ps_model *model, int part, double *wf, double *wb)
{
    *wf = *wb = 0;
    if (!model || !model->spec) return;
    const struct ps_partition_info *p = &model->parts[part];
    for (int k = p->first; k < p->first + p->count; k++) {
        enum ps_op op = model->spec->layers[k].op;
        if ((op == PS_OP_LINEAR || op == PS_OP_CONV2D) && model->layers[k].params > 0) {
            *wf += model->layers[k].fwd_flops;
            *wb += model->layers[k].bwd_bytes * 0.5;
        }
    }
}

static int validate_plan(const struct ps_spec *spec, const struct ps_plan *p, struct ps_diag *d)
{
    const char *w = p->source ? p->source : spec ? spec->path : "plan";
    int S = p->n_stages, m = p->m;
    size_t cells = (size_t)S * (size_t)m;
    uint8_t *seen = calloc(cells, 3);
    int *lane_of = malloc((size_t)S * sizeof(int));
    if (!seen || !lane_of) {
        free(seen);
        free(lane_of);
        return ps_diag_set(d, -ENOMEM, w, "out of memory");
    }
    for (int s = 0; s < S; s++) lane_of[s] = -1;
    static const char kc[] = "FBW";
    int rc = 0;
    for (int l = 0; l < p->n_lanes && !rc; l++)
        for (uint32_t k = 0; k < p->len[l] && !rc; k++) {
            const struct ps_action *a = &p->act[l][k];
            if (a->stage < 0 || a->stage >= S || a->mb < 0 || a->mb >= m || a->kind > PS_ACT_W) {
                rc = ps_diag_set(d, -EINVAL, w, "lane %d action %u: out of range", l, k);
                break;
            }
            if (lane_of[a->stage] >= 0 && lane_of[a->stage] != l)
                rc = ps_diag_set(d, -EINVAL, w, "stage %d has actions in lanes %d and %d",
                                 a->stage, lane_of[a->stage], l);
            lane_of[a->stage] = l;
            uint8_t *c = &seen[((size_t)a->mb * S + a->stage) * 3 + a->kind];
            if (*c)
                rc = ps_diag_set(d, -EINVAL, w, "stage %d: %c%d appears twice", a->stage,
                                 kc[a->kind], a->mb);
            *c = 1;
        }
    for (size_t c = 0; c < cells && !rc; c++)
        for (int k = 0; k < (p->split && !p->mixed ? 3 : 2) && !rc; k++)
            if (!seen[c * 3 + k])
                rc = ps_diag_set(d, -EINVAL, w, "stage %d: %c%d is missing", (int)(c % S),
                                 kc[k], (int)(c / S));
    free(seen);
    free(lane_of);
    return rc;
}

int ps_plan_build(const struct ps_spec *spec, const struct ps_model *model,
                  const struct ps_variant *opts, const struct ps_plan *plan, struct ps_graph **out,
                  struct ps_diag *diag)
{
    *out = NULL;
    const char *where = spec ? spec->path : "plan";
    int rc = validate_plan(spec, plan, diag);
    if (rc) return rc;
    int S = plan->n_stages, m = plan->m;
    size_t cells = (size_t)S * (size_t)m;
    struct ps_graph *g = ps_graph_create(spec, model, opts, m, S);
    if (!g) return ps_diag_set(diag, -ENOMEM, where, "out of memory");
    int ndev = 0;
    for (int l = 0; l < plan->n_lanes; l++)
        if (plan->lane_device[l] + 1 > ndev) ndev = plan->lane_device[l] + 1;
    g->n_devices = ndev;
    struct pb b = {.g = g, .plan = plan, .S = S, .m = m, .prev = PS_NONE};
    b.compute = malloc((size_t)ndev * sizeof(int32_t));
    b.cs = malloc(cells * sizeof(int32_t));
    b.seq = calloc((size_t)ndev + 1, sizeof(uint64_t));
    b.W = malloc(cells * sizeof(uint32_t));
    b.Wo = malloc(cells * sizeof(uint32_t));
    b.C = malloc(cells * sizeof(uint32_t));
    b.Wg = malloc(cells * sizeof(uint32_t));
    b.W2 = malloc(cells * sizeof(uint32_t));
    b.Wo2 = malloc(cells * sizeof(uint32_t));
    b.C2 = malloc(cells * sizeof(uint32_t));
    b.has_w = calloc(cells, 1);
    b.turn = calloc((size_t)S, 1);
    int *lane_of = malloc((size_t)S * sizeof(int));
    b.stage_last = malloc((size_t)S * sizeof(uint32_t));
    b.stage_dev = malloc((size_t)S * sizeof(int));
    g->fwd = malloc(cells * sizeof(uint32_t));
    g->bwd = malloc(cells * sizeof(uint32_t));
    g->rec = malloc(cells * sizeof(uint32_t));
    if (!b.compute || !b.cs || !b.seq || !b.W || !b.Wo || !b.C || !b.Wg || !b.stage_last ||
        !b.stage_dev || !g->fwd || !g->bwd || !g->rec || !b.W2 || !b.Wo2 || !b.C2 || !b.has_w ||
        !b.turn || !lane_of) {
        rc = ps_diag_set(diag, -ENOMEM, where, "out of memory building the graph");
        goto out;
    }
    for (size_t c = 0; c < cells; c++) {
        b.cs[c] = -1;
        b.W[c] = b.Wo[c] = b.C[c] = b.Wg[c] = b.W2[c] = b.Wo2[c] = b.C2[c] = PS_NONE;
        g->fwd[c] = g->bwd[c] = g->rec[c] = PS_NONE;
    }
    for (int l = 0; l < plan->n_lanes; l++)
        for (uint32_t k = 0; k < plan->len[l]; k++) {
            const struct ps_action *a = &plan->act[l][k];
            b.stage_dev[a->stage] = plan->lane_device[l];
            lane_of[a->stage] = l;
            if (a->kind == PS_ACT_W) b.has_w[(size_t)a->mb * S + a->stage] = 1;
        }
    for (int s = 0; s + 1 < S; s++) b.turn[s] = lane_of[s] == lane_of[s + 1];
    for (int s = 0; s < S; s++) b.stage_last[s] = PS_NONE;
    for (int d = 0; d < ndev; d++) b.compute[d] = ps_graph_add_stream(g, PS_STREAM_COMPUTE, d, -1, -1);
    int stop = g->checkpoint_stop;

    /* nodes, lane by lane, in action order; edges into nodes of other stages are added in a
       second pass once every node exists */
    for (int l = 0; l < plan->n_lanes; l++) {
        b.prev = PS_NONE;
        int dev = plan->lane_device[l];
        int32_t comp = b.compute[dev];
        for (uint32_t k = 0; k < plan->len[l]; k++) {
            const struct ps_action *a = &plan->act[l][k];
            int i = a->mb, s = a->stage, t = (int)k;
            size_t c = (size_t)i * S + s;
            double bs = g->mb_size ? (double)g->mb_size[i] : 1.0;
            const struct ps_partition_info *pi = model ? &model->parts[s] : NULL;
            bool ck = i < stop;
            bool in_copy = s > 0 && !b.turn[s - 1], out_copy = s < S - 1 && !b.turn[s];
            if (a->kind == PS_ACT_F) {
                if (in_copy)
                    b.W[c] = node(&b, PS_NODE_WAIT, PS_PHASE_FWD, PS_ROLE_IN, i, s, dev, comp,
                                  cstream(&b, s, i), t);
                uint32_t f = node(&b, PS_NODE_COMPUTE, PS_PHASE_FWD, PS_ROLE_NONE, i, s, dev,
                                  comp, -1, t);
                g->fwd[c] = f;
                g->nodes[f].checkpointed = ck;
                if (pi) ps_node_set_forward_work(&g->nodes[f], pi, bs);
                if (out_copy) {
                    b.Wo[c] = node(&b, PS_NODE_WAIT, PS_PHASE_FWD, PS_ROLE_OUT, i, s, dev,
                                   cstream(&b, s, i), comp, t);
                    uint32_t cp = node(&b, PS_NODE_COPY, PS_PHASE_FWD, PS_ROLE_NONE, i, s, dev,
                                       cstream(&b, s, i), cstream(&b, s + 1, i), t);
                    g->nodes[cp].peer = s + 1;
                    if (pi) g->nodes[cp].bytes = (double)pi->out_numel * 4.0 * bs;
                    b.C[c] = cp;
                }
            } else if (a->kind == PS_ACT_B) {
                if (ck) {
                    uint32_t r = node(&b, PS_NODE_RECOMPUTE, PS_PHASE_BWD, PS_ROLE_NONE, i, s, dev,
                                      comp, -1, t);
                    g->rec[c] = r;
                    if (pi) ps_node_set_forward_work(&g->nodes[r], pi, bs);
                }
                if (out_copy)
                    b.Wo2[c] = node(&b, PS_NODE_WAIT, PS_PHASE_BWD, PS_ROLE_OUT, i, s, dev, comp,
                                    cstream(&b, s, i), t);
                uint32_t bb = node(&b, PS_NODE_COMPUTE, PS_PHASE_BWD, PS_ROLE_NONE, i, s, dev,
                                   comp, -1, t);
                g->bwd[c] = bb;
                if (pi) {
                    double wf = 0, wb = 0;
                    if (b.has_w[c]) wgrad_share(model, s, &wf, &wb);
                    g->nodes[bb].flops = (pi->bwd_flops - wf) * bs;
                    /* weights move once per call, as in sched/gpipe.c; Wg writes the gradients */
                    g->nodes[bb].bytes = (pi->bwd_bytes - wb) * bs +
                                         (b.has_w[c] ? 0.5 : 1.0) * pi->bwd_param_bytes;
                }
                b.stage_last[s] = bb;
                if (in_copy) {
                    b.W2[c] = node(&b, PS_NODE_WAIT, PS_PHASE_BWD, PS_ROLE_IN, i, s, dev,
                                   cstream(&b, s, i), comp, t);
                    uint32_t c2 = node(&b, PS_NODE_COPY, PS_PHASE_BWD, PS_ROLE_NONE, i, s, dev,
                                       cstream(&b, s, i), cstream(&b, s - 1, i), t);
                    b.C2[c] = c2;
                    g->nodes[c2].peer = s - 1;
                    if (model) g->nodes[c2].bytes = (double)model->parts[s - 1].out_numel * 4.0 * bs;
                }
            } else {
                uint32_t w = node(&b, PS_NODE_WGRAD, PS_PHASE_BWD, PS_ROLE_NONE, i, s, dev, comp,
                                  -1, t);
                b.Wg[c] = w;
                if (pi) {
                    double wf, wb;
                    wgrad_share(model, s, &wf, &wb);
                    g->nodes[w].flops = wf * bs;
                    g->nodes[w].bytes = wb * bs + (pi ? 0.5 * pi->bwd_param_bytes : 0);
                }
                b.stage_last[s] = w;
            }
        }
        if (opts->optimizer) {
            for (int s = 0; s < S; s++) {
                if (b.stage_dev[s] != dev) continue;
                bool mine = false;
                for (uint32_t k = 0; k < plan->len[l] && !mine; k++)
                    mine = plan->act[l][k].stage == s;
                if (!mine) continue;
                uint32_t o = node(&b, PS_NODE_OPTIM, PS_PHASE_BWD, PS_ROLE_NONE, -1, s, dev, comp,
                                  -1, (int)plan->len[l]);
                ps_node_set_optim_cost(&g->nodes[o], model, s);
                for (int i = 0; i < m; i++) {
                    size_t c = (size_t)i * S + s;
                    ps_graph_add_edge(g, g->bwd[c], o, PS_EDGE_DATA);
                    ps_graph_add_edge(g, b.Wg[c], o, PS_EDGE_DATA);
                }
            }
        }
    }
    /* second pass: tie twins and add the data edges */
    for (size_t c = 0; c < cells; c++) {
        int s = (int)(c % (size_t)S);
        uint32_t F = g->fwd[c], B = g->bwd[c], R = g->rec[c];
        twin(g, F, B);
        twin(g, b.Wo[c], b.Wo2[c]);
        twin(g, b.W[c], b.W2[c]);
        if (s > 0) twin(g, b.C[c - 1], b.C2[c]);
        /* forward chain into F(i,s): through Wo, C, W, or straight at a V's turn */
        if (s > 0 && b.turn[s - 1]) {
            ps_graph_add_edge(g, g->fwd[c - 1], F, PS_EDGE_DATA);
        } else if (s > 0) {
            ps_graph_add_edge(g, g->fwd[c - 1], b.Wo[c - 1], PS_EDGE_DATA);
            ps_graph_add_edge(g, b.Wo[c - 1], b.C[c - 1], PS_EDGE_DATA);
            ps_graph_add_edge(g, b.C[c - 1], b.W[c], PS_EDGE_DATA);
            ps_graph_add_edge(g, b.W[c], F, PS_EDGE_DATA);
        }
        if (R != PS_NONE) {
            ps_graph_add_edge(g, F, R, PS_EDGE_DATA);
            ps_graph_add_edge(g, R, B, PS_EDGE_DATA);
        }
        /* backward chain into B(i,s) */
        if (s == S - 1) {
            ps_graph_add_edge(g, F, B, PS_EDGE_DATA);
        } else {
            uint32_t Bn = g->bwd[c + 1];
            if (b.turn[s]) {
                ps_graph_add_edge(g, Bn, B, PS_EDGE_DATA);
            } else {
                ps_graph_add_edge(g, Bn, b.W2[c + 1], PS_EDGE_DATA);
                ps_graph_add_edge(g, b.W2[c + 1], b.C2[c + 1], PS_EDGE_DATA);
                ps_graph_add_edge(g, b.C2[c + 1], b.Wo2[c], PS_EDGE_DATA);
                ps_graph_add_edge(g, b.Wo2[c], B, PS_EDGE_DATA);
            }
            /* the saved activations: B also reads what F stored */
            ps_graph_add_edge(g, F, B, PS_EDGE_DATA);
        }
        if (b.Wg[c] != PS_NONE) ps_graph_add_edge(g, B, b.Wg[c], PS_EDGE_DATA);
    }
    ps_graph_set_memory(g);
    rc = ps_graph_finalize(g);
    if (rc) rc = ps_diag_set(diag, rc, where, "out of memory building the graph");
out:
    free(b.compute);
    free(b.cs);
    free(b.seq);
    free(b.W);
    free(b.Wo);
    free(b.C);
    free(b.Wg);
    free(b.W2);
    free(b.Wo2);
    free(b.C2);
    free(b.has_w);
    free(b.turn);
    free(lane_of);
    free(b.stage_last);
    free(b.stage_dev);
    if (rc) {
        ps_graph_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ---- execution order ---------------------------------------------------------------------- */

static bool order_edge(const struct ps_edge *e)
{
    return e->kind != PS_EDGE_STREAM;
}

int ps_plan_order(const struct ps_graph *g, struct ps_order *o, struct ps_diag *diag)
{
    memset(o, 0, sizeof(*o));
    uint32_t nv = g->n_nodes;
    o->node = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->thread = malloc(((size_t)nv + 1) * sizeof(int32_t));
    o->step = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    o->pos = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *indeg = calloc((size_t)nv + 1, sizeof(uint32_t));
    if (!o->node || !o->thread || !o->step || !o->pos || !indeg) {
        free(indeg);
        ps_order_finish(o);
        return ps_diag_set(diag, -ENOMEM, "schedule", "out of memory");
    }
    for (uint32_t e = 0; e < g->n_edges; e++)
        if (order_edge(&g->edges[e])) indeg[g->edges[e].dst]++;
    uint32_t tail = 0;
    for (uint32_t v = 0; v < nv; v++) {
        o->pos[v] = UINT32_MAX;
        if (!indeg[v]) o->node[tail++] = v;
    }
    for (uint32_t head = 0; head < tail; head++) {
        uint32_t v = o->node[head];
        o->pos[v] = head;
        o->thread[head] = g->nodes[v].device;
        o->step[head] = head;
        for (uint32_t k = g->out_off[v]; k < g->out_off[v + 1]; k++) {
            const struct ps_edge *e = &g->edges[g->out_edge[k]];
            if (order_edge(e) && --indeg[e->dst] == 0) o->node[tail++] = e->dst;
        }
    }
    o->n = tail;
    o->n_fwd = 0;
    while (o->n_fwd < o->n && g->nodes[o->node[o->n_fwd]].phase == PS_PHASE_FWD) o->n_fwd++;
    free(indeg);
    if (tail == nv) return 0;
    char buf[64];
    uint32_t first = UINT32_MAX;
    for (uint32_t v = 0; v < nv && first == UINT32_MAX; v++)
        if (o->pos[v] == UINT32_MAX && ps_node_is_task(&g->nodes[v])) first = v;
    return ps_diag_set(diag, -EDEADLK, "schedule",
                       "the schedule deadlocks: %u of %u nodes can never run, e.g. %s", nv - tail,
                       nv, first == UINT32_MAX ? "?" : ps_node_name(g, first, buf, sizeof(buf)));
}

/* the unexecuted task of another stage (or a data predecessor of stage `part`) that blocks v,
   found through waits, copies and the stage's own earlier nodes */
static uint32_t blocker(const struct ps_graph *g, const struct ps_order *o, uint32_t v, int part,
                        int depth)
{
    for (uint32_t k = g->in_off[v]; k < g->in_off[v + 1]; k++) {
        const struct ps_edge *e = &g->edges[g->in_edge[k]];
        if (!order_edge(e) || o->pos[e->src] != UINT32_MAX) continue;
        const struct ps_node *u = &g->nodes[e->src];
        if (ps_node_is_task(u) && u->part != part) return e->src;
        if (depth < 12) {
            uint32_t x = blocker(g, o, e->src, part, depth + 1);
            if (x != PS_NONE) return x;
        }
    }
    return PS_NONE;
}

char *ps_plan_stuck(const struct ps_graph *g, const struct ps_order *o)
{
    size_t cap = 256 + (size_t)g->n * 160, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = 0;
    for (int s = 0; s < g->n; s++) {
        uint32_t first = PS_NONE;
        for (uint32_t v = 0; v < g->n_nodes; v++) {
            const struct ps_node *nd = &g->nodes[v];
            if (nd->part != s || !ps_node_is_task(nd) || o->pos[v] != UINT32_MAX) continue;
            if (first == PS_NONE || nd->tick < g->nodes[first].tick) first = v;
        }
        if (first == PS_NONE) continue;
        char a[64], c[64];
        uint32_t w = blocker(g, o, first, s, 0);
        int k = snprintf(out + len, cap - len, "stage %d: %s (action %d) waits for %s\n", s,
                         ps_node_name(g, first, a, sizeof(a)), g->nodes[first].tick,
                         w == PS_NONE ? "an earlier action of its own list"
                                      : ps_node_name(g, w, c, sizeof(c)));
        if (k > 0 && (size_t)k < cap - len) len += (size_t)k;
    }
    return out;
}

/* the plan action a node belongs to: its stage, micro-batch and PyTorch kind letter (the waits
   and copies of an action belong to it; B is written I when its cell has a weight-gradient node) */
static char action_kind(const struct ps_graph *g, uint32_t v)
{
    const struct ps_node *nd = &g->nodes[v];
    if (nd->phase == PS_PHASE_FWD) return 'F';
    if (nd->kind == PS_NODE_WGRAD) return 'W';
    if (g->bwd && nd->mb >= 0 && nd->part >= 0) {
        uint32_t b = g->bwd[(size_t)nd->mb * g->n + nd->part];
        for (uint32_t k = b == PS_NONE ? 0 : g->out_off[b]; b != PS_NONE && k < g->out_off[b + 1]; k++)
            if (g->nodes[g->edges[g->out_edge[k]].dst].kind == PS_NODE_WGRAD) return 'I';
    }
    return 'B';
}

static bool same_action(const struct ps_graph *g, uint32_t a, uint32_t b)
{
    const struct ps_node *x = &g->nodes[a], *y = &g->nodes[b];
    return x->part == y->part && x->mb == y->mb && action_kind(g, a) == action_kind(g, b);
}

char *ps_plan_cycle(const struct ps_graph *g, const struct ps_order *o)
{
    uint32_t nv = g->n_nodes, start = PS_NONE;
    for (uint32_t v = 0; v < nv && start == PS_NONE; v++)
        if (o->pos[v] == UINT32_MAX && ps_node_is_task(&g->nodes[v])) start = v;
    if (start == PS_NONE) return NULL;
    /* every node left out of the order has a predecessor left out too (Kahn's algorithm stopped
       before it), so walking back through such predecessors must meet a node twice */
    uint32_t *seen = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *path = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint8_t *ek = malloc((size_t)nv + 1); /* ek[k]: kind of the edge path[k] -> path[k-1] */
    if (!seen || !path || !ek) {
        free(seen);
        free(path);
        free(ek);
        return NULL;
    }
    for (uint32_t v = 0; v < nv; v++) seen[v] = UINT32_MAX;
    uint32_t n = 0, v = start;
    uint8_t kind = PS_EDGE_DATA;
    while (seen[v] == UINT32_MAX) {
        seen[v] = n;
        ek[n] = kind;
        path[n++] = v;
        uint32_t next = PS_NONE;
        for (uint32_t k = g->in_off[v]; k < g->in_off[v + 1] && next == PS_NONE; k++) {
            const struct ps_edge *e = &g->edges[g->in_edge[k]];
            if (order_edge(e) && o->pos[e->src] == UINT32_MAX) next = e->src, kind = e->kind;
        }
        if (next == PS_NONE) break; /* cannot happen after -EDEADLK; guards the loop */
        v = next;
    }
    uint8_t close = kind; /* the edge path[first] -> path[n-1] that closes the cycle */
    /* path[seen[v]..n) walked backwards is the cycle; list its actions in dependency order,
       one entry per action */
    uint32_t first = seen[v] == UINT32_MAX ? 0 : seen[v];
    size_t cap = 128 + (size_t)(n - first) * 96, len = 0;
    char *out = malloc(cap);
    if (!out) {
        free(seen);
        free(path);
        return NULL;
    }
    out[0] = 0;
    /* a host edge is the rank's own list order; data (and phony) edges are needs */
    uint32_t prev = PS_NONE, head = PS_NONE;
    for (uint32_t k = n; k-- > first;) {
        uint32_t x = path[k];
        if (prev != PS_NONE && same_action(g, prev, x)) continue;
        const struct ps_node *nd = &g->nodes[x];
        uint8_t in = k + 1 < n ? ek[k + 1] : close; /* the head's link is printed last */
        int w;
        if (prev == PS_NONE) {
            head = x;
            w = snprintf(out + len, cap - len, "%d%c%d on rank %d (its step %d)", nd->part,
                         action_kind(g, x), nd->mb, nd->device, nd->tick);
        } else {
            w = snprintf(out + len, cap - len,
                         in == PS_EDGE_HOST ? ", then %d%c%d in rank %d's list (step %d)"
                                            : ", needed by %d%c%d on rank %d (its step %d)",
                         nd->part, action_kind(g, x), nd->mb, nd->device, nd->tick);
        }
        if (w > 0 && (size_t)w < cap - len) len += (size_t)w;
        prev = x;
    }
    if (head != PS_NONE) {
        int w = snprintf(out + len, cap - len, ", %s %d%c%d again",
                         close == PS_EDGE_HOST ? "then" : "needed by", g->nodes[head].part,
                         action_kind(g, head), g->nodes[head].mb);
        if (w > 0 && (size_t)w < cap - len) len += (size_t)w;
    }
    free(seen);
    free(path);
    free(ek);
    return out;
}
