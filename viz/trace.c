/* trace (viz): timelines as Chrome Trace Event Format, for Perfetto and chrome://tracing.
 *
 * The input is a struct ps_trace (src/trace.h), the same records whether the simulator or an
 * executor produced them, plus the graph for names. The output (viz/REPORT.md, "Chrome traces"):
 *
 *   {"traceEvents": [
 *     M process_name / process_sort_index   pid = device, named "cuda:0"
 *     M thread_name / thread_sort_index     tid = graph stream id ("compute", "copy p1 mb 3"),
 *                                           host records (stream -1) on tid PS_CHROME_HOST_TID
 *     X  name = task name (the record's own name when set), cat = ps_node_category,
 *        ts/dur in microseconds with 3 decimals, args = {"task", "mb", "partition", "kind"}
 *     s/f flow events, one id per cross-stream DATA/PHONY dependency between recorded nodes,
 *        each end at the middle of its slice ("bp":"e": bound to the enclosing slice)
 *     C  counter events when opts give them (the executor's activation memory per device):
 *        name = opts' counter_name, pid = device, args = {"bytes": value}, in the given order
 *   ], "displayTimeUnit": "ms", "otherData": {"pipescope": 1, "source", "dropped_records"}}
 *
 * Written directly (one event per line) rather than through cJSON, because traces are large.
 * Determinism: metadata sorted by (pid, tid), X events by (ts, pid, tid, record index), flows in
 * edge order; numbers in fixed formats. Records with a non-finite time are skipped.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/viz.h"

#define HOST_PID 1000000

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void fmt3(char *buf, size_t len, double v)
{
    snprintf(buf, len, "%.3f", v);
    if (strcmp(buf, "-0.000") == 0) snprintf(buf, len, "0.000");
}

static int32_t pid_of(const struct ps_trace_rec *r)
{
    return r->device >= 0 ? r->device : HOST_PID;
}

static int32_t tid_of(const struct ps_trace_rec *r)
{
    return r->stream >= 0 ? r->stream : PS_CHROME_HOST_TID;
}

static bool node_ok(const struct ps_graph *g, uint32_t v)
{
    return g && v != UINT32_MAX && v < g->n_nodes;
}

static _Thread_local const struct ps_trace *sort_trace; /* qsort context (single-threaded writer) */

static int cmp_rec(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    const struct ps_trace_rec *x = &sort_trace->r[i], *y = &sort_trace->r[j];
    if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
    if (pid_of(x) != pid_of(y)) return pid_of(x) < pid_of(y) ? -1 : 1;
    if (tid_of(x) != tid_of(y)) return tid_of(x) < tid_of(y) ? -1 : 1;
    return i < j ? -1 : i > j;
}

struct lane {
    int32_t pid, tid;
};

static int cmp_lane(const void *a, const void *b)
{
    const struct lane *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

/* Events are separated by ",\n": ev() starts one. */
static _Thread_local bool ev_first;

static void ev(FILE *f)
{
    if (!ev_first) fputs(",\n", f);
    ev_first = false;
}

static void meta(FILE *f, const char *what, int32_t pid, int32_t tid, const char *key,
                 const char *sval, long long ival)
{
    ev(f);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%" PRId32 ",\"tid\":%" PRId32
               ",\"args\":{\"%s\":",
            what, pid, tid, key);
    if (sval)
        jstr(f, sval);
    else
        fprintf(f, "%lld", ival);
    fputs("}}", f);
}

static void flow(FILE *f, const struct ps_trace *t, uint32_t id, const char *name, uint32_t ru,
                 uint32_t rv)
{
    char ts[48];
    const struct ps_trace_rec *u = &t->r[ru], *v = &t->r[rv];
    /* both ends at the middle of their slice, so that each binds to exactly that slice (at a
       slice boundary the enclosing slice would be ambiguous) */
    fmt3(ts, sizeof(ts), u->start_us + u->dur_us / 2);
    ev(f);
    fprintf(f,
            "{\"ph\":\"s\",\"id\":%" PRIu32 ",\"name\":\"%s\",\"cat\":\"dependency\",\"pid\":%" PRId32
            ",\"tid\":%" PRId32 ",\"ts\":%s}",
            id, name, pid_of(u), tid_of(u), ts);
    fmt3(ts, sizeof(ts), v->start_us + v->dur_us / 2);
    ev(f);
    fprintf(f,
            "{\"ph\":\"f\",\"bp\":\"e\",\"id\":%" PRIu32
            ",\"name\":\"%s\",\"cat\":\"dependency\",\"pid\":%" PRId32 ",\"tid\":%" PRId32
            ",\"ts\":%s}",
            id, name, pid_of(v), tid_of(v), ts);
}

static bool cross(const struct ps_trace *t, uint32_t ru, uint32_t rv)
{
    return pid_of(&t->r[ru]) != pid_of(&t->r[rv]) || tid_of(&t->r[ru]) != tid_of(&t->r[rv]);
}

/* Flow events; returns -ENOMEM or 0. */
static int flows(FILE *f, const struct ps_graph *g, const struct ps_trace *t,
                 const struct ps_chrome_opts *o)
{
    uint32_t nv = g->n_nodes;
    uint32_t *rec = malloc((nv ? nv : 1) * sizeof(uint32_t)); /* first record of each node */
    if (!rec) return -ENOMEM;
    for (uint32_t v = 0; v < nv; v++) rec[v] = UINT32_MAX;
    for (uint32_t k = 0; k < t->n; k++) {
        const struct ps_trace_rec *r = &t->r[k];
        if (node_ok(g, r->node) && rec[r->node] == UINT32_MAX && isfinite(r->start_us) &&
            isfinite(r->dur_us))
            rec[r->node] = k;
    }
    uint32_t id = 0;
    if (!o->flows_via_unrecorded || !g->out_off) {
        for (uint32_t e = 0; e < g->n_edges; e++) {
            const struct ps_edge *ed = &g->edges[e];
            if (ed->kind != PS_EDGE_DATA && ed->kind != PS_EDGE_PHONY) continue;
            uint32_t ru = rec[ed->src], rv = rec[ed->dst];
            if (ru == UINT32_MAX || rv == UINT32_MAX || !cross(t, ru, rv)) continue;
            flow(f, t, ++id, ps_edge_kind_name((enum ps_edge_kind)ed->kind), ru, rv);
        }
        free(rec);
        return 0;
    }
    /* through unrecorded nodes: BFS from each recorded node over DATA/PHONY edges */
    uint32_t *seen = calloc(nv ? nv : 1, sizeof(uint32_t));
    uint32_t *queue = malloc((nv ? nv : 1) * sizeof(uint32_t));
    if (!seen || !queue) {
        free(rec);
        free(seen);
        free(queue);
        return -ENOMEM;
    }
    for (uint32_t u = 0; u < nv; u++) {
        if (rec[u] == UINT32_MAX) continue;
        uint32_t qh = 0, qt = 0;
        queue[qt++] = u;
        seen[u] = u + 1;
        while (qh < qt) {
            uint32_t x = queue[qh++];
            for (uint32_t a = g->out_off[x]; a < g->out_off[x + 1]; a++) {
                const struct ps_edge *ed = &g->edges[g->out_edge[a]];
                if (ed->kind != PS_EDGE_DATA && ed->kind != PS_EDGE_PHONY) continue;
                uint32_t w = ed->dst;
                if (seen[w] == u + 1) continue;
                seen[w] = u + 1;
                if (rec[w] == UINT32_MAX)
                    queue[qt++] = w;
                else if (cross(t, rec[u], rec[w]))
                    flow(f, t, ++id, x == u ? ps_edge_kind_name((enum ps_edge_kind)ed->kind)
                                            : "dependency",
                         rec[u], rec[w]);
            }
        }
    }
    free(rec);
    free(seen);
    free(queue);
    return 0;
}

int ps_chrome_write(const struct ps_graph *g, const struct ps_trace *t,
                    const struct ps_chrome_opts *o, FILE *f, struct ps_diag *diag)
{
    static const struct ps_chrome_opts defaults = {0};
    if (!o) o = &defaults;
    uint32_t n = t->n;
    uint32_t *idx = malloc((n ? n : 1) * sizeof(uint32_t));
    struct lane *lanes = malloc((n ? n : 1) * sizeof(struct lane));
    if (!idx || !lanes) {
        free(idx);
        free(lanes);
        return ps_diag_set(diag, -ENOMEM, "trace", "out of memory");
    }
    uint32_t ni = 0;
    for (uint32_t k = 0; k < n; k++)
        if (isfinite(t->r[k].start_us) && isfinite(t->r[k].dur_us)) idx[ni++] = k;
    sort_trace = t;
    qsort(idx, ni, sizeof(*idx), cmp_rec);
    for (uint32_t k = 0; k < ni; k++)
        lanes[k] = (struct lane){pid_of(&t->r[idx[k]]), tid_of(&t->r[idx[k]])};
    qsort(lanes, ni, sizeof(*lanes), cmp_lane);

    char buf[256], ts[48], dur[48];
    fputs("{\"traceEvents\":[\n", f);
    ev_first = true;
    /* metadata: processes then their threads, sorted */
    for (uint32_t k = 0; k < ni; k++) {
        if (k && lanes[k].pid == lanes[k - 1].pid && lanes[k].tid == lanes[k - 1].tid) continue;
        int32_t pid = lanes[k].pid, tid = lanes[k].tid;
        if (k == 0 || lanes[k].pid != lanes[k - 1].pid) {
            const char *pn = pid == HOST_PID ? "host"
                                             : ps_viz_device_name(g, pid, buf, (int)sizeof(buf));
            meta(f, "process_name", pid, 0, "name", pn, 0);
            meta(f, "process_sort_index", pid, 0, "sort_index", NULL, pid);
        }
        const char *tn;
        if (tid == PS_CHROME_HOST_TID)
            tn = "host";
        else if (g && tid < g->n_streams)
            tn = ps_stream_name(g, tid, buf, (int)sizeof(buf));
        else {
            snprintf(buf, sizeof(buf), "stream %" PRId32, tid);
            tn = buf;
        }
        meta(f, "thread_name", pid, tid, "name", tn, 0);
        meta(f, "thread_sort_index", pid, tid, "sort_index", NULL, tid);
    }
    /* complete events */
    for (uint32_t k = 0; k < ni; k++) {
        const struct ps_trace_rec *r = &t->r[idx[k]];
        bool has = node_ok(g, r->node);
        const struct ps_node *nd = has ? &g->nodes[r->node] : NULL;
        const char *name = r->name;
        if (!name && has) name = ps_node_name(g, r->node, buf, (int)sizeof(buf));
        if (!name) {
            snprintf(buf, sizeof(buf), "record %" PRIu32, idx[k]);
            name = buf;
        }
        const char *cat = nd ? ps_node_category(nd) : t->source == PS_TRACE_CUDA ? "kernel" : "other";
        fmt3(ts, sizeof(ts), r->start_us);
        fmt3(dur, sizeof(dur), r->dur_us);
        ev(f);
        fputs("{\"ph\":\"X\",\"name\":", f);
        jstr(f, name);
        fprintf(f, ",\"cat\":\"%s\",\"pid\":%" PRId32 ",\"tid\":%" PRId32 ",\"ts\":%s,\"dur\":%s,\"args\":{",
                cat, pid_of(r), tid_of(r), ts, dur);
        if (nd) {
            fprintf(f, "\"task\":%" PRIu32, r->node);
            if (nd->mb >= 0) fprintf(f, ",\"mb\":%" PRId32, nd->mb);
            if (nd->part >= 0) fprintf(f, ",\"partition\":%" PRId32, nd->part);
            fprintf(f, ",\"kind\":\"%s\"", ps_node_kind_name((enum ps_node_kind)nd->kind));
        } else if (r->node != UINT32_MAX) {
            fprintf(f, "\"task\":%" PRIu32, r->node);
        }
        fputs("}}", f);
    }
    for (uint32_t k = 0; k < o->n_counters; k++) {
        const struct ps_chrome_counter *c = &o->counters[k];
        if (!isfinite(c->t_us)) continue;
        fmt3(ts, sizeof(ts), c->t_us);
        ev(f);
        fputs("{\"ph\":\"C\",\"name\":", f);
        jstr(f, o->counter_name ? o->counter_name : "counter");
        fprintf(f, ",\"pid\":%" PRId32 ",\"ts\":%s,\"args\":{\"bytes\":%" PRId64 "}}", c->pid, ts,
                c->value);
    }
    int rc = 0;
    if (g && !o->no_flows) rc = flows(f, g, t, o);
    free(idx);
    free(lanes);
    if (rc) return ps_diag_set(diag, rc, "trace", "out of memory");
    fprintf(f,
            "%s],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"pipescope\":1,\"source\":\"%s\","
            "\"dropped_records\":%" PRIu64 "}}\n",
            ev_first ? "" : "\n", ps_trace_source_name(t->source), t->dropped);
    if (ferror(f)) return ps_diag_set(diag, -EIO, "trace", "write error");
    return 0;
}

struct chrome_args {
    const struct ps_graph *g;
    const struct ps_trace *t;
    const struct ps_chrome_opts *o;
};

static int chrome_cb(FILE *f, void *ctx, struct ps_diag *diag)
{
    struct chrome_args *a = ctx;
    return ps_chrome_write(a->g, a->t, a->o, f, diag);
}

int ps_chrome_write_file(const struct ps_graph *g, const struct ps_trace *t,
                         const struct ps_chrome_opts *o, const char *path, struct ps_diag *diag)
{
    struct chrome_args a = {g, t, o};
    return ps_out_write(path, chrome_cb, &a, diag);
}
