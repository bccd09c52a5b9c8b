/* json: the report JSON (viz/REPORT.md, "Report JSON"), built with cJSON, numbers printed by us.
 *
 * cJSON prints doubles with 15 significant digits, which does not round-trip. Every number in
 * a report is therefore a cJSON *raw* item holding text we formatted: integral values below
 * 2^53 as integers ("3", not "3.0"), other finite doubles with %.17g (strtod gives back the same
 * bits), NaN and infinities as null (JSON has no spelling for them). Readers (cJSON_Parse, any
 * JSON library) see ordinary numbers.
 *
 * The report is one object; each command adds the sections it computed:
 *     ps_report_new()             {"pipescope": 1}
 *     ps_report_add_spec()        "spec":     the normalised spec, defaults applied, derived fields
 *     ps_report_add_graph()       "graph":    counts of nodes, edges, kinds, streams
 *     ps_report_add_analysis()    "analysis": violations, checks, critical path, memory, order
 *     (sim, exec, compare add theirs with ps_json_set and the ps_json_add_* helpers)
 *     ps_report_write()           formatted, atomically written (out.c), "-" = stdout
 * Names of nodes are task names (ps_node_name), so a report reads without the graph.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/variant.h"
#include "src/diag.h"
#include "viz/viz.h"

/* ---- numbers and helpers --------------------------------------------------------------- */

int ps_json_format_number(double v, char *buf, size_t len)
{
    if (!isfinite(v)) return -EDOM;
    if (v == trunc(v) && fabs(v) < 9007199254740992.0)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%.17g", v);
    return 0;
}

cJSON *ps_json_number(double v)
{
    char buf[40];
    if (ps_json_format_number(v, buf, sizeof(buf)) < 0) return cJSON_CreateNull();
    return cJSON_CreateRaw(buf);
}

cJSON *ps_json_int(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

static cJSON *attach(cJSON *obj, const char *key, cJSON *item)
{
    if (!item) return NULL;
    bool ok = key ? cJSON_AddItemToObject(obj, key, item) : cJSON_AddItemToArray(obj, item);
    if (!ok) {
        cJSON_Delete(item);
        return NULL;
    }
    return item;
}

cJSON *ps_json_add_number(cJSON *obj, const char *key, double v)
{
    return attach(obj, key, ps_json_number(v));
}

cJSON *ps_json_add_int(cJSON *obj, const char *key, int64_t v)
{
    return attach(obj, key, ps_json_int(v));
}

cJSON *ps_json_add_string(cJSON *obj, const char *key, const char *s)
{
    return attach(obj, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

cJSON *ps_json_add_bool(cJSON *obj, const char *key, bool b)
{
    return attach(obj, key, cJSON_CreateBool(b));
}

int ps_json_set(cJSON *obj, const char *key, cJSON *item)
{
    if (!item) return -ENOMEM;
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) {
        if (!cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item)) {
            cJSON_Delete(item);
            return -ENOMEM;
        }
        return 0;
    }
    return attach(obj, key, item) ? 0 : -ENOMEM;
}

/* Allocation failures are counted in *bad and checked once per section (cJSON items added
 * to a NULL parent are simply dropped). */
struct jb {
    int bad;
};

static cJSON *obj(struct jb *b, cJSON *parent, const char *key)
{
    cJSON *o = cJSON_CreateObject();
    if (parent && !attach(parent, key, o)) {
        b->bad++;
        return NULL;
    }
    if (!o) b->bad++;
    return o;
}

static cJSON *arr(struct jb *b, cJSON *parent, const char *key)
{
    cJSON *a = cJSON_CreateArray();
    if (parent && !attach(parent, key, a)) {
        b->bad++;
        return NULL;
    }
    if (!a) b->bad++;
    return a;
}

static void num(struct jb *b, cJSON *o, const char *key, double v)
{
    if (!o || !ps_json_add_number(o, key, v)) b->bad++;
}

static void integer(struct jb *b, cJSON *o, const char *key, int64_t v)
{
    if (!o || !ps_json_add_int(o, key, v)) b->bad++;
}

static void str(struct jb *b, cJSON *o, const char *key, const char *s)
{
    if (!o || !ps_json_add_string(o, key, s)) b->bad++;
}

static void boolean(struct jb *b, cJSON *o, const char *key, bool v)
{
    if (!o || !ps_json_add_bool(o, key, v)) b->bad++;
}

static int finish(struct jb *b, cJSON *root, const char *key, cJSON *section)
{
    if (b->bad || !section) {
        cJSON_Delete(section);
        return -ENOMEM;
    }
    return ps_json_set(root, key, section);
}

cJSON *ps_report_new(void)
{
    cJSON *root = cJSON_CreateObject();
    if (root && !ps_json_add_int(root, "pipescope", 1)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---- spec ------------------------------------------------------------------------------ */

static const char *data_source_name(enum ps_data_source s)
{
    switch (s) {
    case PS_DATA_SYNTHETIC: return "synthetic";
    case PS_DATA_NPY: return "npy";
    case PS_DATA_CSV: return "csv";
    }
    return "?";
}

static void add_layer(struct jb *b, cJSON *layers, const struct ps_layer *l)
{
    cJSON *o = obj(b, layers, NULL);
    str(b, o, "op", ps_op_name(l->op));
    switch (l->op) {
    case PS_OP_LINEAR:
        integer(b, o, "out", l->out);
        boolean(b, o, "bias", l->bias);
        break;
    case PS_OP_CONV2D:
        integer(b, o, "out", l->out);
        integer(b, o, "kernel", l->kernel);
        integer(b, o, "stride", l->stride);
        integer(b, o, "padding", l->padding);
        boolean(b, o, "bias", l->bias);
        break;
    case PS_OP_BATCHNORM:
        if (l->momentum_null) {
            if (o && !attach(o, "momentum", cJSON_CreateNull())) b->bad++;
        } else {
            num(b, o, "momentum", l->momentum);
        }
        num(b, o, "eps", l->eps);
        boolean(b, o, "affine", l->affine);
        break;
    case PS_OP_DROPOUT: num(b, o, "p", l->p); break;
    case PS_OP_MAXPOOL2D:
        integer(b, o, "kernel", l->kernel);
        integer(b, o, "stride", l->stride);
        integer(b, o, "padding", l->padding);
        break;
    case PS_OP_RELU:
    case PS_OP_FLATTEN:
    case PS_OP__COUNT: break;
    }
}

int ps_report_add_spec(cJSON *root, const struct ps_spec *s)
{
    struct jb b = {0};
    char buf[64];
    cJSON *sp = obj(&b, NULL, NULL);
    integer(&b, sp, "pipescope", s->version);
    str(&b, sp, "name", s->name);
    /* a file name is any bytes; JSON holds UTF-8 only: what is not printable UTF-8 is \xNN */
    size_t plen = 4 * strlen(s->path) + 1;
    char *path = malloc(plen);
    if (path) ps_diag_escape(s->path, path, plen);
    str(&b, sp, "file", path);
    free(path);
    integer(&b, sp, "batch", s->batch);

    cJSON *m = obj(&b, sp, "model");
    cJSON *in = arr(&b, m, "input");
    for (int k = 0; k < s->n_input_dims; k++) integer(&b, in, NULL, s->input[k]);
    cJSON *layers = arr(&b, m, "layers");
    for (int k = 0; k < s->n_layers; k++) add_layer(&b, layers, &s->layers[k]);
    str(&b, m, "loss", ps_loss_name(s->loss));
    if (s->loss == PS_LOSS_CROSS_ENTROPY) integer(&b, m, "n_classes", s->n_classes);
    str(&b, m, "weights", s->weights);

    cJSON *p = obj(&b, sp, "pipeline");
    str(&b, p, "schedule", ps_schedule_name(s->schedule));
    str(&b, p, "variant", s->fairscale ? "fairscale" : "torchgpipe");
    cJSON *bal = arr(&b, p, "balance");
    cJSON *devs = arr(&b, p, "devices");
    cJSON *first = arr(&b, p, "first_layer");
    cJSON *did = arr(&b, p, "device_id");
    for (int j = 0; j < s->n_partitions; j++) {
        if (s->balance) integer(&b, bal, NULL, s->balance[j]);
        if (s->devices) {
            ps_device_format(&s->devices[j], buf, (int)sizeof(buf));
            str(&b, devs, NULL, buf);
        }
        if (s->first_layer) integer(&b, first, NULL, s->first_layer[j]);
        if (s->device_id) integer(&b, did, NULL, s->device_id[j]);
    }
    integer(&b, p, "n_devices", s->n_devices);
    integer(&b, p, "chunks", s->chunks);
    integer(&b, p, "mb_count", s->mb_count);
    cJSON *mbs = arr(&b, p, "mb_size");
    for (int i = 0; s->mb_size && i < s->mb_count; i++) integer(&b, mbs, NULL, s->mb_size[i]);
    str(&b, p, "checkpoint", ps_checkpoint_name(s->checkpoint));
    struct ps_variant own;
    ps_variant_from_spec(s, &own);
    integer(&b, p, "checkpoint_stop", ps_variant_checkpoint_stop(&own));
    str(&b, p, "batchnorm", ps_bn_policy_name(s->batchnorm));
    boolean(&b, p, "phony", s->phony);
    integer(&b, p, "virtual_stages", s->virtual_stages > 0 ? s->virtual_stages : 1);

    cJSON *d = obj(&b, sp, "data");
    str(&b, d, "source", data_source_name(s->data_source));
    char seed[32];
    snprintf(seed, sizeof(seed), "%" PRIu64, s->seed);
    if (d && !attach(d, "seed", cJSON_CreateRaw(seed))) b.bad++;
    if (s->data_source == PS_DATA_NPY) {
        str(&b, d, "inputs", s->data_inputs);
        str(&b, d, "targets", s->data_targets);
    } else if (s->data_source == PS_DATA_CSV) {
        str(&b, d, "path", s->data_csv);
        integer(&b, d, "target_column", s->target_column);
    }

    cJSON *hw = obj(&b, sp, "hardware");
    cJSON *hd = obj(&b, hw, "device");
    num(&b, hd, "flops", s->dev_flops);
    num(&b, hd, "mem_bandwidth", s->dev_mem_bw);
    num(&b, hd, "launch_overhead_us", s->dev_launch_us);
    cJSON *hl = obj(&b, hw, "link");
    num(&b, hl, "bandwidth", s->link_bw);
    num(&b, hl, "latency_us", s->link_latency_us);
    str(&b, sp, "costs", s->costs);

    cJSON *t = obj(&b, sp, "train");
    integer(&b, t, "steps", s->steps);
    str(&b, t, "optimizer", "sgd");
    num(&b, t, "lr", s->lr);

    if (s->n_warnings > 0) {
        cJSON *w = arr(&b, sp, "warnings");
        for (int k = 0; k < s->n_warnings; k++) str(&b, w, NULL, s->warnings[k]);
    }
    return finish(&b, root, "spec", sp);
}

/* ---- graph ----------------------------------------------------------------------------- */

int ps_report_add_graph(cJSON *root, const struct ps_graph *g)
{
    struct jb b = {0};
    uint32_t kinds[PS_NODE__COUNT] = {0}, ekinds[PS_EDGE__COUNT] = {0};
    for (uint32_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].kind < PS_NODE__COUNT) kinds[g->nodes[v].kind]++;
    for (uint32_t e = 0; e < g->n_edges; e++)
        if (g->edges[e].kind < PS_EDGE__COUNT) ekinds[g->edges[e].kind]++;
    cJSON *gr = obj(&b, NULL, NULL);
    integer(&b, gr, "nodes", g->n_nodes);
    integer(&b, gr, "edges", g->n_edges);
    integer(&b, gr, "phony_edges", ekinds[PS_EDGE_PHONY]);
    cJSON *k = obj(&b, gr, "kinds");
    for (int i = 0; i < PS_NODE__COUNT; i++)
        integer(&b, k, ps_node_kind_name((enum ps_node_kind)i), kinds[i]);
    cJSON *ek = obj(&b, gr, "edge_kinds");
    for (int i = 0; i < PS_EDGE__COUNT; i++)
        integer(&b, ek, ps_edge_kind_name((enum ps_edge_kind)i), ekinds[i]);
    integer(&b, gr, "streams", g->n_streams);
    integer(&b, gr, "micro_batches", g->m);
    integer(&b, gr, "partitions", g->n);
    integer(&b, gr, "devices", g->n_devices);
    integer(&b, gr, "checkpoint_stop", g->checkpoint_stop);
    return finish(&b, root, "graph", gr);
}

/* ---- analysis -------------------------------------------------------------------------- */

static void name_into(struct jb *b, cJSON *a, const struct ps_graph *g, uint32_t v)
{
    char buf[96];
    if (v == PS_NONE || v >= g->n_nodes) return;
    str(b, a, NULL, ps_node_name(g, v, buf, (int)sizeof(buf)));
}

cJSON *ps_report_order(const struct ps_graph *g, const struct ps_order *order)
{
    struct jb b = {0};
    char buf[64];
    cJSON *out;
    int nd = g->n_devices;
    if (nd <= 1) {
        out = arr(&b, NULL, NULL);
        for (uint32_t k = 0; k < order->n; k++)
            if (ps_node_is_task(&g->nodes[order->node[k]])) name_into(&b, out, g, order->node[k]);
    } else {
        out = obj(&b, NULL, NULL);
        bool other = false;
        for (int d = 0; d < nd; d++) {
            cJSON *a = arr(&b, out, ps_viz_device_name(g, d, buf, (int)sizeof(buf)));
            for (uint32_t k = 0; k < order->n; k++) {
                int32_t th = order->thread ? order->thread[k] : g->nodes[order->node[k]].device;
                if (th < 0 || th >= nd) other = true;
                if (th == d && ps_node_is_task(&g->nodes[order->node[k]]))
                    name_into(&b, a, g, order->node[k]);
            }
        }
        if (other) {
            cJSON *a = arr(&b, out, "host");
            for (uint32_t k = 0; k < order->n; k++) {
                int32_t th = order->thread ? order->thread[k] : g->nodes[order->node[k]].device;
                if ((th < 0 || th >= nd) && ps_node_is_task(&g->nodes[order->node[k]]))
                    name_into(&b, a, g, order->node[k]);
            }
        }
    }
    if (b.bad) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

int ps_report_add_analysis(cJSON *root, const struct ps_graph *g, const struct ps_analysis *a,
                           const struct ps_order *order)
{
    struct jb b = {0};
    char buf[96];
    cJSON *an = obj(&b, NULL, NULL);
    boolean(&b, an, "ok", a->ok);
    integer(&b, an, "n_violations", a->n_violations);
    cJSON *vs = arr(&b, an, "violations");
    for (uint32_t k = 0; k < a->n_kept && a->v; k++) {
        const struct ps_violation *v = &a->v[k];
        cJSON *o = obj(&b, vs, NULL);
        str(&b, o, "check", ps_check_name(v->check));
        cJSON *nodes = arr(&b, o, "nodes");
        name_into(&b, nodes, g, v->a);
        name_into(&b, nodes, g, v->b);
        str(&b, o, "message", v->msg);
    }
    cJSON *ch = obj(&b, an, "checks");
    for (int c = 0; c < PS_CHECK__COUNT; c++) {
        cJSON *o = obj(&b, ch, ps_check_name((enum ps_check)c));
        integer(&b, o, "checked", a->checked[c]);
        integer(&b, o, "violations", a->per_check[c]);
    }
    if (a->cycle && a->cycle_len) {
        cJSON *cy = arr(&b, an, "cycle");
        for (uint32_t k = 0; k < a->cycle_len; k++) name_into(&b, cy, g, a->cycle[k]);
    }
    if (a->cp.n && a->cp.nodes) {
        cJSON *cp = obj(&b, an, "critical_path");
        num(&b, cp, "length_us", a->cp.length_us);
        cJSON *nodes = arr(&b, cp, "nodes");
        for (uint32_t k = 0; k < a->cp.n; k++) name_into(&b, nodes, g, a->cp.nodes[k]);
    }
    if (order && a->mem) {
        cJSON *mem = arr(&b, an, "memory");
        for (int d = 0; d < a->n_devices; d++) {
            cJSON *o = obj(&b, mem, NULL);
            integer(&b, o, "device", d);
            str(&b, o, "name", ps_viz_device_name(g, d, buf, (int)sizeof(buf)));
            integer(&b, o, "peak_bytes", a->mem[d].peak_bytes);
            if (a->mem[d].peak_bytes > 0 && a->mem[d].peak_entry < order->n)
                str(&b, o, "peak_at",
                    ps_node_name(g, order->node[a->mem[d].peak_entry], buf, (int)sizeof(buf)));
        }
    }
    if (order) {
        cJSON *ord = ps_report_order(g, order);
        if (!ord || !attach(an, "order", ord)) b.bad++;
    }
    return finish(&b, root, "analysis", an);
}

/* ---- writing --------------------------------------------------------------------------- */

int ps_report_fprint(const cJSON *root, FILE *f, struct ps_diag *diag)
{
    char *s = cJSON_Print(root);
    if (!s) return ps_diag_set(diag, -ENOMEM, "report", "out of memory printing the report");
    size_t n = strlen(s);
    size_t w = fwrite(s, 1, n, f);
    free(s);
    if (w != n || fputc('\n', f) == EOF || ferror(f))
        return ps_diag_set(diag, -EIO, "report", "write error");
    return 0;
}

static int report_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    return ps_report_fprint(ctx, f, diag);
}

int ps_report_write(const cJSON *root, const char *path, struct ps_diag *diag)
{
    return ps_out_write(path, report_cb, (void *)root, diag);
}
