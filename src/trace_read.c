/* trace_read: Chrome trace JSON -> struct ps_trace, mapped onto a graph (see trace_read.h).
 *
 * Invariants of the result:
 *   R1. at most one record per graph node (several events of a node merge into their span);
 *   R2. a mapped record has the node's device and stream; unmapped records (task-like names
 *       the graph lacks) have node = UINT32_MAX and their own name;
 *   R3. every time is finite and every duration >= 0.
 * Validation is strict for the events that map to tasks (a wrong ts or dur there would silently
 * skew a comparison) and lenient for the rest: the profiler's own events are only counted.
 */
#include "src/trace_read.h"
#include "src/file.h"
#include "src/memlimit.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct name_id {
    char name[48];
    uint32_t id;
};

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct name_id *)a)->name, ((const struct name_id *)b)->name);
}

bool ps_trace_task_like(const char *name)
{
    static const char *const pre[] = {"F(", "B(", "R(", "Wg("};
    size_t n = strlen(name);
    if (n < 3 || name[n - 1] != ')') return false;
    for (size_t k = 0; k < sizeof(pre) / sizeof(pre[0]); k++)
        if (strncmp(name, pre[k], strlen(pre[k])) == 0) return true;
    return false;
}

/* name without blanks ("F(0, 1)" -> "F(0,1)") into buf */
static void squeeze(const char *s, char *buf, size_t len)
{
    size_t k = 0;
    for (; *s && k + 1 < len; s++)
        if (*s != ' ' && *s != '\t') buf[k++] = *s;
    buf[k] = '\0';
}

static void line_col(const char *json, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = json; p < at && *p; p++) {
        if (*p == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

struct reader {
    const char *name;
    const struct ps_graph *g;
    struct ps_trace *t;
    struct ps_trace_read_info *info;
    struct ps_diag *d;
    struct name_id *map;
    uint32_t *rec_of; /* node -> record index */
};

static int add_thread(struct reader *r, const cJSON *pid, long long tid, int32_t device)
{
    struct ps_trace_read_info *in = r->info;
    char p[48];
    if (cJSON_IsString(pid)) snprintf(p, sizeof(p), "%s", pid->valuestring);
    else if (cJSON_IsNumber(pid)) snprintf(p, sizeof(p), "%.0f", pid->valuedouble);
    else snprintf(p, sizeof(p), "?");
    for (uint32_t k = 0; k < in->n_threads; k++)
        if (in->threads[k].tid == tid && strcmp(in->threads[k].pid, p) == 0) {
            in->threads[k].n_tasks++;
            return 0;
        }
    struct ps_trace_thread *q = realloc(in->threads, (in->n_threads + 1) * sizeof(*q));
    if (!q) return -ENOMEM;
    in->threads = q;
    struct ps_trace_thread *th = &q[in->n_threads++];
    memset(th, 0, sizeof(*th));
    snprintf(th->pid, sizeof(th->pid), "%s", p);
    th->tid = tid;
    th->device = device;
    th->n_tasks = 1;
    return 0;
}

static bool is_int(const cJSON *x, double lo, double hi)
{
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) && x->valuedouble >= lo &&
           x->valuedouble <= hi && x->valuedouble == floor(x->valuedouble);
}

/* One X event (k = index in traceEvents). Returns 0 or an error. */
static int event(struct reader *r, const cJSON *e, int k)
{
    const char *nm = r->name;
    struct ps_trace_read_info *in = r->info;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (!cJSON_IsString(name))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].name: expected a string", k);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].args: expected an object", k);
    const cJSON *task = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "task") : NULL;
    char sq[64];
    squeeze(name->valuestring, sq, sizeof(sq));
    uint32_t node = UINT32_MAX;
    bool by_id = false;
    if (task) {
        if (!is_int(task, 0, 4294967294.0))
            return ps_diag_set(r->d, -EINVAL, nm,
                               "traceEvents[%d].args.task: expected a node id (an integer >= 0)", k);
        uint32_t id = (uint32_t)task->valuedouble;
        if (id >= r->g->n_nodes) {
            ps_diag_set(r->d, -EINVAL, nm,
                        "traceEvents[%d].args.task: task %u is not a node of the graph (it has "
                        "%u nodes)",
                        k, id, r->g->n_nodes);
            ps_diag_hint(r->d, "the trace was written for another spec");
            return -EINVAL;
        }
        char gn[64];
        ps_node_name(r->g, id, gn, sizeof(gn));
        if (ps_trace_task_like(sq) && strcmp(gn, sq) != 0) {
            ps_diag_set(r->d, -EINVAL, nm,
                        "traceEvents[%d].args.task: task %u is %s in the spec's graph, but the "
                        "event is named %s",
                        k, id, gn, sq);
            ps_diag_hint(r->d, "the trace was written for another spec");
            return -EINVAL;
        }
        node = id;
        by_id = true;
    } else {
        struct name_id key;
        snprintf(key.name, sizeof(key.name), "%.*s", (int)sizeof(key.name) - 1, sq);
        const struct name_id *hit =
            strlen(sq) < sizeof(key.name)
                ? bsearch(&key, r->map, r->g->n_nodes, sizeof(*r->map), name_cmp)
                : NULL;
        if (hit) node = hit->id;
    }
    bool keep = node != UINT32_MAX || ps_trace_task_like(sq);
    if (!keep) {
        in->n_ignored++;
        return 0;
    }
    /* a task: its times must be right */
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
    if (!ts) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].ts: missing", k);
    if (!cJSON_IsNumber(ts) || !isfinite(ts->valuedouble))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].ts: expected a number", k);
    if (!dur) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].dur: missing", k);
    if (!cJSON_IsNumber(dur) || !isfinite(dur->valuedouble) || dur->valuedouble < 0)
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].dur: expected a number >= 0", k);
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    if (pid && !cJSON_IsString(pid) && !is_int(pid, -1e15, 1e15))
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%d].pid: expected an integer or a string", k);
    if (tid && !cJSON_IsString(tid) && !is_int(tid, -1e15, 1e15))
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%d].tid: expected an integer or a string", k);
    long long tv = cJSON_IsNumber(tid) ? (long long)tid->valuedouble : 0;
    double st = ts->valuedouble, du = dur->valuedouble;
    int rc;
    if (node == UINT32_MAX) {
        if (in->n_names < PS_TRACE_READ_MAX_NAMES && !(in->unmatched[in->n_names++] = strdup(sq)))
            return ps_diag_set(r->d, -ENOMEM, nm, "out of memory");
        in->n_unmatched++;
        int32_t dev = cJSON_IsNumber(pid) && pid->valuedouble >= 0 && pid->valuedouble < 1e6
                          ? (int32_t)pid->valuedouble
                          : -1;
        if ((rc = ps_trace_add(r->t, UINT32_MAX, dev, -1, st, du, sq)))
            return ps_diag_set(r->d, rc, nm, "out of memory");
        return 0;
    }
    const struct ps_node *nd = &r->g->nodes[node];
    if (by_id) in->n_by_id++;
    else in->n_by_name++;
    if ((rc = add_thread(r, pid, tv, nd->device))) return ps_diag_set(r->d, rc, nm, "out of memory");
    uint32_t ri = r->rec_of[node];
    if (ri != UINT32_MAX) { /* R1: merge into the span */
        struct ps_trace_rec *x = &r->t->r[ri];
        double e0 = x->start_us + x->dur_us, e1 = st + du;
        if (st < x->start_us) x->start_us = st;
        x->dur_us = (e1 > e0 ? e1 : e0) - x->start_us;
        in->n_merged++;
        return 0;
    }
    r->rec_of[node] = r->t->n;
    if ((rc = ps_trace_add(r->t, node, nd->device, nd->stream, st, du, NULL)))
        return ps_diag_set(r->d, rc, nm, "out of memory");
    return 0;
}

static int parse(struct reader *r, const cJSON *root)
{
    const char *nm = r->name;
    const cJSON *evs = root;
    if (cJSON_IsObject(root)) {
        evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
        if (!evs)
            return ps_diag_set(r->d, -EINVAL, nm,
                               "traceEvents: missing (not a Chrome trace: expected an object with "
                               "\"traceEvents\" or an array of events)");
        if (!cJSON_IsArray(evs))
            return ps_diag_set(r->d, -EINVAL, nm, "traceEvents: expected an array");
        const cJSON *od = cJSON_GetObjectItemCaseSensitive(root, "otherData");
        const cJSON *ps = cJSON_IsObject(od) ? cJSON_GetObjectItemCaseSensitive(od, "pipescope") : NULL;
        r->info->pipescope = ps != NULL;
        r->info->kineto = ps == NULL;
        const cJSON *src = ps ? cJSON_GetObjectItemCaseSensitive(od, "source") : NULL;
        if (cJSON_IsString(src)) {
            if (!strcmp(src->valuestring, "simulated")) r->t->source = PS_TRACE_SIMULATED;
            else if (!strcmp(src->valuestring, "cpu")) r->t->source = PS_TRACE_CPU;
            else if (!strcmp(src->valuestring, "cuda")) r->t->source = PS_TRACE_CUDA;
        }
    } else if (!cJSON_IsArray(root)) {
        return ps_diag_set(r->d, -EINVAL, nm,
                           "expected a JSON object with \"traceEvents\" or an array of events");
    }
    int k = 0, rc;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        if (!cJSON_IsObject(e))
            return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d]: expected an object", k);
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if (!ph) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].ph: missing", k);
        if (!cJSON_IsString(ph))
            return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%d].ph: expected a string", k);
        if (strcmp(ph->valuestring, "X") == 0) {
            r->info->n_events++;
            if ((rc = event(r, e, k))) return rc;
        } else {
            r->info->n_ignored++;
        }
        k++;
    }
    if (r->t->n == 0 || r->info->n_by_id + r->info->n_by_name == 0) {
        ps_diag_set(r->d, -EINVAL, nm,
                    "no event names a task of the graph (%u X events, none with args.task or a "
                    "name such as F(0,0))",
                    r->info->n_events);
        ps_diag_hint(r->d, "name record_function ranges F(i,j), B(i,j), R(i,j): see "
                           "examples/PROFILER.md");
        return -EINVAL;
    }
    if (!r->info->pipescope) { /* relative to the first mapped event */
        double t0 = INFINITY;
        for (uint32_t q = 0; q < r->t->n; q++)
            if (r->t->r[q].node != UINT32_MAX && r->t->r[q].start_us < t0) t0 = r->t->r[q].start_us;
        for (uint32_t q = 0; q < r->t->n; q++) r->t->r[q].start_us -= t0;
    }
    return 0;
}

int ps_trace_parse(const char *json, size_t len, const char *name, const struct ps_graph *g,
                   struct ps_trace *out, struct ps_trace_read_info *info, struct ps_diag *diag)
{
    struct ps_trace_read_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof(*info));
    ps_trace_init(out, PS_TRACE_IMPORTED);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        int line, col;
        line_col(json, end ? end : json, &line, &col);
        char where[PS_DIAG_WHERE_MAX];
        snprintf(where, sizeof(where), "%s:%d:%d", name, line, col);
        if (info == &local) ps_trace_read_info_finish(info);
        return ps_diag_set(diag, -EINVAL, where, "not valid JSON");
    }
    struct reader r = {.name = name, .g = g, .t = out, .info = info, .d = diag};
    r.map = malloc(((size_t)g->n_nodes + 1) * sizeof(*r.map));
    r.rec_of = malloc(((size_t)g->n_nodes + 1) * sizeof(*r.rec_of));
    int rc;
    if (!r.map || !r.rec_of) {
        rc = ps_diag_set(diag, -ENOMEM, name, "out of memory");
    } else {
        for (uint32_t v = 0; v < g->n_nodes; v++) {
            ps_node_name(g, v, r.map[v].name, sizeof(r.map[v].name));
            r.map[v].id = v;
            r.rec_of[v] = UINT32_MAX;
        }
        qsort(r.map, g->n_nodes, sizeof(*r.map), name_cmp);
        rc = parse(&r, root);
    }
    free(r.map);
    free(r.rec_of);
    cJSON_Delete(root);
    if (rc || info == &local) ps_trace_read_info_finish(info);
    if (rc) ps_trace_finish(out);
    return rc;
}

int ps_trace_read(const char *path, const struct ps_graph *g, struct ps_trace *out,
                  struct ps_trace_read_info *info, struct ps_diag *diag)
{
    if (info) memset(info, 0, sizeof(*info));
    ps_trace_init(out, PS_TRACE_IMPORTED);
    /* text + cJSON tree; a .json.gz trace is decompressed on the way in */
    struct ps_file_opts fo = {.factor = 8.0, .gzip = true};
    char *buf;
    size_t n;
    int frc = ps_file_read(path, &fo, &buf, &n, diag);
    if (frc) return frc;
    if (n == 0) {
        free(buf);
        return ps_diag_set(diag, -EINVAL, path, "empty file (expected a Chrome trace)");
    }
    int rc = ps_trace_parse(buf, n, path, g, out, info, diag);
    free(buf);
    return rc;
}

void ps_trace_read_info_finish(struct ps_trace_read_info *info)
{
    if (!info) return;
    for (uint32_t k = 0; k < info->n_names; k++) free(info->unmatched[k]);
    free(info->threads);
    memset(info, 0, sizeof(*info));
}
