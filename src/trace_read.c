/* trace_read: Chrome/Kineto trace files -> struct ps_trace, mapped onto a graph (see
 * trace_read.h).
 *
 * Flow:   file --trace_json--> event --classify--> range | launch | gpu op | ignored
 *         per file: names -> nodes (fairscale occurrences), launches -> ranges (host thread,
 *                   enclosing interval), gpu ops -> launches (correlation id) => per-node spans
 *         all files: clocks (base time, then cross-file graph edges) => records
 *
 * Invariants of the result:
 *   R1. at most one record per graph node (several ranges of a node merge into their span);
 *   R2. a mapped record has the node's device and stream; unmapped records (recognised names the
 *       graph lacks) have node = UINT32_MAX and their own name;
 *   R3. every time is finite, |ts| < 2^53 us and 0 <= dur < 2^53 us for every event used;
 *   R4. what is kept per file is a few dozen bytes per used event, counted against the memory
 *       limit as it grows (memlimit.h): a trace too large for the limit is refused with the
 *       figure, never read until the kernel kills the process.
 * Validation is strict for the events that are used (task ranges, runtime calls and GPU work
 * with a correlation id: a wrong ts or dur there would silently skew a comparison) and lenient
 * for the rest, which are only counted.
 */
#include "src/trace_read.h"
#include "src/memlimit.h"
#include "src/trace_json.h"
#include "src/trace_names.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_US 9007199254740992.0 /* 2^53 */

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

/* ---- what one file keeps -------------------------------------------------------------------- */

struct rng { /* a task range: host-side, or a gpu_user_annotation on a stream */
    uint64_t k;
    double ts, dur;
    uint32_t node;       /* UINT32_MAX until resolved / when unmapped */
    uint32_t thr;        /* index into info->threads (host) */
    struct ps_tname nm;
    uint8_t by_id, gpu, named;
    uint32_t step;       /* training step: occurrence of its task on its side, in time order */
    int32_t gdev;        /* gpu annotation: device and stream */
    int64_t gstream;
    char name[48];       /* squeezed */
};

struct launch {
    uint64_t corr;
    double ts, dur;
    uint32_t thr;
    uint32_t rng;        /* enclosing task range, UINT32_MAX when none */
};

struct gop {
    uint64_t corr;
    double ts, dur;
    int32_t dev;
    int64_t stream;
};

struct frec { /* one node's measurement in one file, in that file's clock */
    uint32_t node;
    uint64_t first_k;
    double c0, c1, g0, g1, gfirst; /* host span, GPU span (NaN when none), first GPU start */
    int32_t gdev;
    int64_t gstream;
    uint8_t multi;
    uint32_t thr;
};

struct unm { /* an unmapped range, in its file's clock */
    uint64_t k;
    double ts, dur;
    int32_t dev;
    char name[48];
};

struct file {
    uint32_t ix;
    const char *name;
    struct ps_tj_meta meta;
    struct rng *r;
    size_t nr, cr;
    struct launch *l;
    size_t nl, cl;
    struct gop *o;
    size_t no, co;
    struct frec *f;
    size_t nf, cf;
    struct unm *u;
    size_t nu, cu;
};

struct reader {
    const struct ps_graph *g;
    struct ps_trace_read_info *info;
    struct ps_diag *d;
    struct name_id *map;
    bool has_wgrad;
    uint64_t limit, kept;
    int step;            /* training step to keep, -1 = the last */
    struct file *cur;
    /* info->threads by (file, pid, tid): open addressing, slot = index + 1, 0 = empty; a
       simulated trace has one thread per copy stream, so a linear search was quadratic */
    uint32_t *th_slot;
    uint32_t th_cap;     /* a power of two, at least twice the threads */
};

/* R4: grows an array, counting its bytes against the memory limit */
static int grow(struct reader *r, void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t c = *cap ? *cap * 2 : 256;
    uint64_t extra = (uint64_t)(c - *cap) * elem;
    if (r->kept + extra > r->limit) {
        char need[32], lim[32];
        ps_diag_set(r->d, -E2BIG, r->cur ? r->cur->name : "trace",
                    "reading this trace needs more than %s of memory for the events it keeps; "
                    "the limit is %s",
                    ps_memlimit_format((double)(r->kept + extra), need, sizeof(need)),
                    ps_memlimit_format((double)r->limit, lim, sizeof(lim)));
        ps_diag_hint(r->d, "profile fewer steps, or raise the limit with %s=SIZE (e.g. 64G)",
                     PS_MEMLIMIT_ENV);
        return -E2BIG;
    }
    void *q = realloc(*arr, c * elem);
    if (!q) return ps_diag_set(r->d, -ENOMEM, r->cur ? r->cur->name : "trace", "out of memory");
    *arr = q;
    *cap = c;
    r->kept += extra;
    return 0;
}

static bool is_int(const cJSON *x, double lo, double hi)
{
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) && x->valuedouble >= lo &&
           x->valuedouble <= hi && x->valuedouble == floor(x->valuedouble);
}

static uint32_t thread_hash(uint32_t file, const char *pid, long long tid)
{
    uint64_t h = 1469598103934665603ull ^ file;
    for (const char *c = pid; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= (uint64_t)tid * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h ^ (h >> 29));
}

static void thread_insert(struct reader *r, uint32_t k)
{
    const struct ps_trace_thread *t = &r->info->threads[k];
    uint32_t i = thread_hash(t->file, t->pid, t->tid) & (r->th_cap - 1);
    while (r->th_slot[i]) i = (i + 1) & (r->th_cap - 1);
    r->th_slot[i] = k + 1;
}

static int thread_of(struct reader *r, const cJSON *pid, long long tid, uint32_t *out)
{
    struct ps_trace_read_info *in = r->info;
    char p[48];
    if (cJSON_IsString(pid)) snprintf(p, sizeof(p), "%s", pid->valuestring);
    else if (cJSON_IsNumber(pid)) snprintf(p, sizeof(p), "%.0f", pid->valuedouble);
    else snprintf(p, sizeof(p), "?");
    uint32_t file = r->cur->ix;
    if (r->th_cap) {
        for (uint32_t i = thread_hash(file, p, tid) & (r->th_cap - 1); r->th_slot[i];
             i = (i + 1) & (r->th_cap - 1)) {
            const struct ps_trace_thread *t = &in->threads[r->th_slot[i] - 1];
            if (t->file == file && t->tid == tid && strcmp(t->pid, p) == 0) {
                *out = r->th_slot[i] - 1;
                return 0;
            }
        }
    }
    if (2 * ((uint64_t)in->n_threads + 1) > r->th_cap) { /* grow the table, then the array */
        uint32_t cap = r->th_cap ? 2 * r->th_cap : 64;
        uint32_t *slot = calloc(cap, sizeof(uint32_t));
        if (!slot) return ps_diag_set(r->d, -ENOMEM, r->cur->name, "out of memory");
        free(r->th_slot);
        r->th_slot = slot;
        r->th_cap = cap;
        for (uint32_t k = 0; k < in->n_threads; k++) thread_insert(r, k);
    }
    if ((in->n_threads & (in->n_threads - 1)) == 0) { /* capacity doubles at powers of two */
        size_t want = in->n_threads ? 2 * (size_t)in->n_threads : 1;
        struct ps_trace_thread *q = realloc(in->threads, want * sizeof(*q));
        if (!q) return ps_diag_set(r->d, -ENOMEM, r->cur->name, "out of memory");
        in->threads = q;
    }
    struct ps_trace_thread *th = &in->threads[in->n_threads];
    memset(th, 0, sizeof(*th));
    snprintf(th->pid, sizeof(th->pid), "%s", p);
    th->tid = tid;
    th->device = -1;
    th->file = file;
    thread_insert(r, in->n_threads);
    *out = in->n_threads++;
    return 0;
}

/* ts and dur of a used event (R3) */
static int times(struct reader *r, const cJSON *e, uint64_t k, double *ts, double *dur)
{
    const char *nm = r->cur->name;
    unsigned long long kk = (unsigned long long)k;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "ts");
    const cJSON *du = cJSON_GetObjectItemCaseSensitive(e, "dur");
    if (!t) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].ts: missing", kk);
    if (!cJSON_IsNumber(t) || !isfinite(t->valuedouble))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].ts: expected a number", kk);
    if (fabs(t->valuedouble) >= MAX_US)
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%llu].ts: %.8g is not a time in microseconds (|ts| must "
                           "be below 2^53, 285 years)",
                           kk, t->valuedouble);
    if (!du) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].dur: missing", kk);
    if (!cJSON_IsNumber(du) || !isfinite(du->valuedouble) || du->valuedouble < 0)
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].dur: expected a number >= 0", kk);
    if (du->valuedouble >= MAX_US)
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%llu].dur: %.8g is not a duration in microseconds (it "
                           "must be below 2^53, 285 years)",
                           kk, du->valuedouble);
    *ts = t->valuedouble;
    *dur = du->valuedouble;
    return 0;
}

static bool cat_is(const cJSON *cat, const char *a, const char *b, const char *c)
{
    if (!cJSON_IsString(cat)) return false;
    const char *s = cat->valuestring;
    return (a && !strcmp(s, a)) || (b && !strcmp(s, b)) || (c && !strcmp(s, c));
}

/* One element of traceEvents. */
static int on_event(void *ctx, uint64_t k, const cJSON *e, struct ps_diag *d)
{
    struct reader *r = ctx;
    struct file *f = r->cur;
    struct ps_trace_read_info *in = r->info;
    const char *nm = f->name;
    unsigned long long kk = (unsigned long long)k;
    (void)d;
    if (!cJSON_IsObject(e))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu]: expected an object", kk);
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    if (!ph) return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].ph: missing", kk);
    if (!cJSON_IsString(ph))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].ph: expected a string", kk);
    if (strcmp(ph->valuestring, "X") != 0) {
        in->n_ignored++;
        return 0;
    }
    in->n_events++;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (!cJSON_IsString(name))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].name: expected a string", kk);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args))
        return ps_diag_set(r->d, -EINVAL, nm, "traceEvents[%llu].args: expected an object", kk);
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    const cJSON *task = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "task") : NULL;
    const cJSON *corr = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "correlation") : NULL;
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    char sq[64];
    squeeze(name->valuestring, sq, sizeof(sq));
    struct ps_tname tn;
    bool named = ps_tname_parse(name->valuestring, &tn);
    int rc;

    if (!task && named && tn.conv == PS_TN_PP_OTHER) {
        in->n_pytorch_other++;
        return 0;
    }
    bool is_range = task || named || ps_trace_task_like(sq);
    bool is_gpu_op = !is_range && corr && cat_is(cat, "kernel", "gpu_memcpy", "gpu_memset");
    bool is_launch = !is_range && corr && cat_is(cat, "cuda_runtime", "cuda_driver", NULL);
    if (!is_range && !is_gpu_op && !is_launch) {
        in->n_ignored++;
        return 0;
    }
    if (pid && !cJSON_IsString(pid) && !is_int(pid, -1e15, 1e15))
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%llu].pid: expected an integer or a string", kk);
    if (tid && !cJSON_IsString(tid) && !is_int(tid, -1e15, 1e15))
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%llu].tid: expected an integer or a string", kk);
    long long tv = cJSON_IsNumber(tid) ? (long long)tid->valuedouble : 0;
    uint32_t node = UINT32_MAX;
    if (task) {
        if (!is_int(task, 0, 4294967294.0))
            return ps_diag_set(r->d, -EINVAL, nm,
                               "traceEvents[%llu].args.task: expected a node id (an integer >= 0)",
                               kk);
        uint32_t id = (uint32_t)task->valuedouble;
        if (id >= r->g->n_nodes) {
            ps_diag_set(r->d, -EINVAL, nm,
                        "traceEvents[%llu].args.task: task %u is not a node of the graph (it has "
                        "%u nodes)",
                        kk, id, r->g->n_nodes);
            ps_diag_hint(r->d, "the trace was written for another spec");
            return -EINVAL;
        }
        char gn[64];
        ps_node_name(r->g, id, gn, sizeof(gn));
        if (ps_trace_task_like(sq) && strcmp(gn, sq) != 0) {
            ps_diag_set(r->d, -EINVAL, nm,
                        "traceEvents[%llu].args.task: task %u is %s in the spec's graph, but the "
                        "event is named %s",
                        kk, id, gn, sq);
            ps_diag_hint(r->d, "the trace was written for another spec");
            return -EINVAL;
        }
        node = id;
    }
    if (corr && !is_range && !is_int(corr, 0, 1.8e19))
        return ps_diag_set(r->d, -EINVAL, nm,
                           "traceEvents[%llu].args.correlation: expected an integer >= 0", kk);
    double ts = 0, du = 0;
    if ((rc = times(r, e, k, &ts, &du))) return rc;

    if (is_launch) {
        uint32_t th;
        if ((rc = thread_of(r, pid, tv, &th)) ||
            (rc = grow(r, (void **)&f->l, &f->cl, f->nl, sizeof(*f->l))))
            return rc;
        f->l[f->nl++] = (struct launch){(uint64_t)corr->valuedouble, ts, du, th, UINT32_MAX};
        in->n_launches++;
        return 0;
    }
    const cJSON *a_dev = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "device") : NULL;
    const cJSON *a_str = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "stream") : NULL;
    int32_t gdev = is_int(a_dev, 0, 1e6) ? (int32_t)a_dev->valuedouble
                   : is_int(pid, 0, 1e6)  ? (int32_t)pid->valuedouble
                                          : -1;
    int64_t gstr = is_int(a_str, -1e15, 1e15) ? (int64_t)a_str->valuedouble : tv;
    if (is_gpu_op) {
        if ((rc = grow(r, (void **)&f->o, &f->co, f->no, sizeof(*f->o)))) return rc;
        f->o[f->no++] = (struct gop){(uint64_t)corr->valuedouble, ts, du, gdev, gstr};
        in->n_gpu_ops++;
        return 0;
    }
    /* a task range */
    if ((rc = grow(r, (void **)&f->r, &f->cr, f->nr, sizeof(*f->r)))) return rc;
    struct rng *x = &f->r[f->nr];
    memset(x, 0, sizeof(*x));
    x->k = k;
    x->ts = ts;
    x->dur = du;
    x->node = node;
    x->by_id = task != NULL;
    x->named = named;
    x->nm = tn;
    x->gpu = cat_is(cat, "gpu_user_annotation", NULL, NULL);
    x->gdev = gdev;
    x->gstream = gstr;
    snprintf(x->name, sizeof(x->name), "%.*s", (int)sizeof(x->name) - 1, sq);
    if (!x->gpu && (rc = thread_of(r, pid, tv, &x->thr))) return rc;
    f->nr++;
    return 0;
}

/* ---- names -> nodes ------------------------------------------------------------------------- */

static uint32_t lookup(const struct reader *r, const char *name)
{
    struct name_id key;
    if (strlen(name) >= sizeof(key.name)) return UINT32_MAX;
    snprintf(key.name, sizeof(key.name), "%s", name);
    const struct name_id *hit = bsearch(&key, r->map, r->g->n_nodes, sizeof(*r->map), name_cmp);
    return hit ? hit->id : UINT32_MAX;
}

static int unmatched(struct reader *r, struct file *f, struct rng *x, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int unmatched(struct reader *r, struct file *f, struct rng *x, const char *fmt, ...)
{
    struct ps_trace_read_info *in = r->info;
    in->n_unmatched++;
    if (in->n_names < PS_TRACE_READ_MAX_NAMES) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        uint32_t q = in->n_names++;
        in->unmatched[q] = strdup(x->name);
        in->unmatched_why[q] = strdup(why);
        if (!in->unmatched[q] || !in->unmatched_why[q])
            return ps_diag_set(r->d, -ENOMEM, f->name, "out of memory");
    }
    int rc = grow(r, (void **)&f->u, &f->cu, f->nu, sizeof(*f->u));
    if (rc) return rc;
    struct unm *u = &f->u[f->nu++];
    u->k = x->k;
    u->ts = x->ts;
    u->dur = x->dur;
    u->dev = x->gpu ? x->gdev : -1;
    snprintf(u->name, sizeof(u->name), "%s", x->name);
    return 0;
}

static int cmp_fairscale(const void *a, const void *b, void *ctx)
{
    const struct rng *r = ctx, *x = &r[*(const uint32_t *)a], *y = &r[*(const uint32_t *)b];
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    if (x->nm.mb != y->nm.mb) return x->nm.mb < y->nm.mb ? -1 : 1;
    if (x->nm.part != y->nm.part) return x->nm.part < y->nm.part ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

static const struct rng *qs_base;
static int cmp_fs_qsort(const void *a, const void *b) { return cmp_fairscale(a, b, (void *)qs_base); }

static int cmp_step(const void *a, const void *b)
{
    const struct rng *x = &qs_base[*(const uint32_t *)a], *y = &qs_base[*(const uint32_t *)b];
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    if (x->node != y->node) return x->node < y->node ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* A file may hold several training steps (a profiler schedule with active > 1): the n-th range
   of a task (in time, host and GPU side apart; nested or overlapping ranges count once) belongs
   to step n (fairscale: counted above with
   its recompute). One step is kept, r->step or else the last; the others are left out. */
static int pick_step(struct reader *r, struct file *f)
{
    struct ps_trace_read_info *in = r->info;
    uint32_t n = 0;
    for (size_t q = 0; q < f->nr; q++) n += !f->r[q].by_id && f->r[q].node != UINT32_MAX;
    uint32_t *ix = malloc(((size_t)n + 1) * sizeof(uint32_t));
    if (!ix) return ps_diag_set(r->d, -ENOMEM, f->name, "out of memory");
    n = 0;
    for (size_t q = 0; q < f->nr; q++)
        if (!f->r[q].by_id && f->r[q].node != UINT32_MAX) ix[n++] = (uint32_t)q;
    qs_base = f->r;
    qsort(ix, n, sizeof(uint32_t), cmp_step);
    uint32_t steps = n ? 1 : 0;
    double end = -INFINITY;
    for (uint32_t q = 0, occ = 0; q < n; q++) {
        struct rng *x = &f->r[ix[q]];
        const struct rng *p = q ? &f->r[ix[q - 1]] : NULL;
        /* a range that starts before the previous one of its task ended is nested in it or
           overlaps it (the same work named twice): the same step */
        if (!(p && p->gpu == x->gpu && p->node == x->node)) occ = 0, end = -INFINITY;
        else if (x->ts >= end) occ++;
        end = fmax(end, x->ts + x->dur);
        if (x->nm.conv != PS_TN_FAIRSCALE) x->step = occ;
        if (x->step + 1 > steps) steps = x->step + 1;
    }
    free(ix);
    if (steps > in->n_steps) in->n_steps = steps;
    if (r->step >= 0 && (uint32_t)r->step >= steps && steps) {
        ps_diag_set(r->d, -EINVAL, f->name, "--step %d, but this trace holds %u training step%s",
                    r->step, steps, steps == 1 ? "" : "s");
        ps_diag_hint(r->d, "steps count from 0 (the n-th range of each task is step n)");
        return -EINVAL;
    }
    uint32_t keep = r->step >= 0 ? (uint32_t)r->step : steps ? steps - 1 : 0;
    in->step = keep;
    for (size_t q = 0; q < f->nr; q++) {
        struct rng *x = &f->r[q];
        if (x->by_id || x->node == UINT32_MAX || x->step == keep) continue;
        x->node = UINT32_MAX;
        in->n_by_name--;
        in->n_other_steps++;
    }
    return 0;
}

/* maps every range of f to a node or to the unmatched list (with the reason) */
static int resolve_names(struct reader *r, struct file *f)
{
    const struct ps_graph *g = r->g;
    struct ps_trace_read_info *in = r->info;
    const char *sched = g->spec ? ps_schedule_name(g->spec->schedule) : "this";
    int rc;
    /* fairscale: occurrence order per task (and per side: host ranges, GPU annotations) */
    uint32_t nfs = 0;
    for (size_t q = 0; q < f->nr; q++) nfs += f->r[q].nm.conv == PS_TN_FAIRSCALE && !f->r[q].by_id;
    uint32_t *fs = malloc(((size_t)nfs + 1) * sizeof(uint32_t));
    if (!fs) return ps_diag_set(r->d, -ENOMEM, f->name, "out of memory");
    nfs = 0;
    for (size_t q = 0; q < f->nr; q++)
        if (f->r[q].nm.conv == PS_TN_FAIRSCALE && !f->r[q].by_id) fs[nfs++] = (uint32_t)q;
    qs_base = f->r;
    qsort(fs, nfs, sizeof(uint32_t), cmp_fs_qsort);
    /* per training step a task's function runs once, and once more at recompute when the
       graph checkpoints it (it has R(i,j)): occurrence o is step o / per, F when o % per == 0 */
    for (uint32_t q = 0, occ = 0, per = 1; q < nfs; q++) {
        struct rng *x = &f->r[fs[q]];
        const struct rng *p = q ? &f->r[fs[q - 1]] : NULL;
        bool same = p && p->gpu == x->gpu && p->nm.mb == x->nm.mb && p->nm.part == x->nm.part;
        occ = same ? occ + 1 : 0;
        if (!same) {
            char rn[48];
            snprintf(rn, sizeof(rn), "R(%d,%d)", x->nm.mb, x->nm.part);
            per = lookup(r, rn) != UINT32_MAX ? 2 : 1;
        }
        x->step = occ / per;
        x->nm.kind = occ % per == 0 ? 'F' : 'R';
    }
    free(fs);

    for (size_t q = 0; q < f->nr; q++) {
        struct rng *x = &f->r[q];
        if (x->by_id) {
            in->n_by_id++;
            continue;
        }
        char want[64] = "";
        const struct ps_tname *t = &x->nm;
        if (!x->named) {
            if ((rc = unmatched(r, f, x, "shaped like a task, but no node of the graph has this "
                                         "name")))
                return rc;
            continue;
        }
        in->n_pipescope_names += t->conv == PS_TN_PIPESCOPE;
        in->n_pytorch += t->conv == PS_TN_PP;
        in->n_fairscale += t->conv == PS_TN_FAIRSCALE;
        if (t->conv != PS_TN_PIPESCOPE && t->part >= g->n) {
            rc = unmatched(r, f, x, "%s %d, but the spec has %d (pipeline.balance)",
                           t->conv == PS_TN_PP ? "stage" : "partition", t->part, g->n);
            if (rc) return rc;
            continue;
        }
        if (t->conv != PS_TN_PIPESCOPE && t->mb >= g->m) {
            rc = unmatched(r, f, x, "micro-batch %d, but the spec has %d", t->mb, g->m);
            if (rc) return rc;
            continue;
        }
        if (t->conv == PS_TN_PIPESCOPE) {
            snprintf(want, sizeof(want), "%s", x->name);
        } else if (t->conv == PS_TN_PP) {
            if (t->kind == 'F') snprintf(want, sizeof(want), "F(%d,%d)", t->mb, t->part);
            else if (t->kind == 'B') snprintf(want, sizeof(want), "B(%d,%d)", t->mb, t->part);
            else if (!r->has_wgrad) {
                rc = unmatched(r, f, x,
                               "%s: the spec's schedule (%s) does not split backward into input "
                               "and weight gradients (schedule zb-h1 does)",
                               t->kind == 'I' ? "an input-gradient action"
                                              : "a weight-gradient action",
                               sched);
                if (rc) return rc;
                continue;
            } else if (t->kind == 'I') {
                snprintf(want, sizeof(want), "B(%d,%d)", t->mb, t->part);
            } else {
                snprintf(want, sizeof(want), "Wg(%d,%d)", t->mb, t->part);
            }
        } else { /* fairscale */
            if (t->kind == 'F') {
                snprintf(want, sizeof(want), "F(%d,%d)", t->mb, t->part);
            } else {
                snprintf(want, sizeof(want), "R(%d,%d)", t->mb, t->part);
            }
        }
        uint32_t v = lookup(r, want);
        if (v == UINT32_MAX) {
            rc = t->conv == PS_TN_PIPESCOPE
                     ? unmatched(r, f, x, "no node of the graph has this name")
                     : unmatched(r, f, x, "stands for %s, which the spec's graph does not have",
                                 want);
            if (rc) return rc;
            continue;
        }
        x->node = v;
        in->n_by_name++;
        if (t->conv == PS_TN_PP && f->meta.has_rank && g->nodes[v].device != f->meta.rank)
            in->n_rank_mismatch++;
    }
    return pick_step(r, f);
}

/* ---- GPU attribution ------------------------------------------------------------------------ */

struct hslot {
    uint64_t corr;
    uint32_t launch; /* UINT32_MAX = empty */
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static const struct rng *sort_base;
static int cmp_host(const void *a, const void *b)
{
    const struct rng *x = &sort_base[*(const uint32_t *)a], *y = &sort_base[*(const uint32_t *)b];
    if (x->thr != y->thr) return x->thr < y->thr ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) return x->dur > y->dur ? -1 : 1; /* outer first */
    return x->k < y->k ? -1 : x->k > y->k;
}

/* innermost host range of thread th enclosing [ts, ts+dur]: the last one starting at or before
   ts (sorted by thread, start, outer first) whose end covers it, searching back a little for
   nesting */
static uint32_t enclosing(const struct file *f, const uint32_t *hs, uint32_t nh, uint32_t th,
                          double ts, double dur)
{
    uint32_t lo = 0, hi = nh;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct rng *x = &f->r[hs[mid]];
        if (x->thr < th || (x->thr == th && x->ts <= ts)) lo = mid + 1;
        else hi = mid;
    }
    for (uint32_t q = lo, steps = 0; q-- > 0 && steps < 64; steps++) {
        const struct rng *x = &f->r[hs[q]];
        if (x->thr != th) break;
        if (x->ts + x->dur >= ts + dur) return hs[q];
    }
    return UINT32_MAX;
}

static int attribute(struct reader *r, struct file *f, uint32_t *of_node, uint32_t *gop_rng)
{
    (void)of_node;
    uint32_t nh = 0;
    for (size_t q = 0; q < f->nr; q++) nh += !f->r[q].gpu;
    uint32_t *hs = malloc(((size_t)nh + 1) * sizeof(uint32_t));
    size_t hcap = 16;
    while (hcap < 2 * f->nl + 2) hcap *= 2;
    struct hslot *h = malloc(hcap * sizeof(*h));
    if (!hs || !h) {
        free(hs);
        free(h);
        return ps_diag_set(r->d, -ENOMEM, f->name, "out of memory");
    }
    nh = 0;
    for (size_t q = 0; q < f->nr; q++)
        if (!f->r[q].gpu) hs[nh++] = (uint32_t)q;
    sort_base = f->r;
    qsort(hs, nh, sizeof(uint32_t), cmp_host);
    for (size_t q = 0; q < hcap; q++) h[q].launch = UINT32_MAX;
    for (size_t q = 0; q < f->nl; q++) {
        struct launch *l = &f->l[q];
        l->rng = enclosing(f, hs, nh, l->thr, l->ts, l->dur);
        if (l->rng == UINT32_MAX) continue;
        size_t s = mix(l->corr) & (hcap - 1);
        while (h[s].launch != UINT32_MAX && h[s].corr != l->corr) s = (s + 1) & (hcap - 1);
        h[s] = (struct hslot){l->corr, (uint32_t)q};
    }
    for (size_t q = 0; q < f->no; q++) {
        gop_rng[q] = UINT32_MAX;
        size_t s = mix(f->o[q].corr) & (hcap - 1);
        while (h[s].launch != UINT32_MAX && h[s].corr != f->o[q].corr) s = (s + 1) & (hcap - 1);
        if (h[s].launch == UINT32_MAX) continue;
        gop_rng[q] = f->l[h[s].launch].rng;
        r->info->n_gpu_attributed++;
    }
    free(hs);
    free(h);
    return 0;
}

/* per-node spans of f (frec), host threads' task counts */
static int spans(struct reader *r, struct file *f, uint32_t *fix)
{
    uint32_t *gop_rng = malloc((f->no + 1) * sizeof(uint32_t));
    if (!gop_rng) return ps_diag_set(r->d, -ENOMEM, f->name, "out of memory");
    int rc = attribute(r, f, NULL, gop_rng);
    if (rc) {
        free(gop_rng);
        return rc;
    }
    /* fix[node] = index into f->f, reset afterwards */
    for (size_t q = 0; q < f->nr; q++) {
        struct rng *x = &f->r[q];
        if (x->node == UINT32_MAX) continue;
        uint32_t v = x->node;
        if (fix[v] == UINT32_MAX) {
            if ((rc = grow(r, (void **)&f->f, &f->cf, f->nf, sizeof(*f->f)))) break;
            fix[v] = (uint32_t)f->nf;
            f->f[f->nf++] = (struct frec){v, x->k, NAN, NAN, NAN, NAN, NAN, -1, -1, 0, UINT32_MAX};
        } else {
            r->info->n_merged++;
        }
        struct frec *p = &f->f[fix[v]];
        if (x->k < p->first_k) p->first_k = x->k;
        if (x->gpu) {
            p->g0 = isnan(p->g0) ? x->ts : fmin(p->g0, x->ts);
            p->g1 = isnan(p->g1) ? x->ts + x->dur : fmax(p->g1, x->ts + x->dur);
            if (isnan(p->gfirst) || x->ts < p->gfirst) {
                if (!isnan(p->gfirst) && p->gstream != x->gstream) p->multi = 1;
                p->gfirst = x->ts, p->gdev = x->gdev, p->gstream = x->gstream;
            } else if (p->gstream != x->gstream) {
                p->multi = 1;
            }
        } else {
            p->c0 = isnan(p->c0) ? x->ts : fmin(p->c0, x->ts);
            p->c1 = isnan(p->c1) ? x->ts + x->dur : fmax(p->c1, x->ts + x->dur);
            if (p->thr == UINT32_MAX) p->thr = x->thr;
            struct ps_trace_thread *th = &r->info->threads[x->thr];
            th->n_tasks++;
            if (th->device < 0) th->device = r->g->nodes[v].device;
        }
    }
    for (size_t q = 0; !rc && q < f->no; q++) {
        if (gop_rng[q] == UINT32_MAX) continue;
        const struct rng *x = &f->r[gop_rng[q]];
        if (x->node == UINT32_MAX) continue;
        struct frec *p = &f->f[fix[x->node]];
        const struct gop *o = &f->o[q];
        p->g0 = isnan(p->g0) ? o->ts : fmin(p->g0, o->ts);
        p->g1 = isnan(p->g1) ? o->ts + o->dur : fmax(p->g1, o->ts + o->dur);
        if (isnan(p->gfirst) || o->ts < p->gfirst) {
            if (!isnan(p->gfirst) && p->gstream != o->stream) p->multi = 1;
            p->gfirst = o->ts, p->gdev = o->dev, p->gstream = o->stream;
        } else if (p->gstream != o->stream) {
            p->multi = 1;
        }
    }
    for (size_t q = 0; q < f->nf; q++) {
        fix[f->f[q].node] = UINT32_MAX;
        r->info->n_gpu_tasks += !isnan(f->f[q].g0);
        r->info->n_multi_stream += f->f[q].multi;
    }
    free(gop_rng);
    return rc;
}

/* ---- one file ------------------------------------------------------------------------------- */

static void file_free_raw(struct reader *r, struct file *f)
{
    r->kept -= (uint64_t)f->cr * sizeof(*f->r) + (uint64_t)f->cl * sizeof(*f->l) +
               (uint64_t)f->co * sizeof(*f->o);
    free(f->r);
    free(f->l);
    free(f->o);
    f->r = NULL;
    f->l = NULL;
    f->o = NULL;
    f->nr = f->cr = f->nl = f->cl = f->no = f->co = 0;
}

static void file_free(struct file *f)
{
    free(f->r);
    free(f->l);
    free(f->o);
    free(f->f);
    free(f->u);
    memset(f, 0, sizeof(*f));
}

struct prog {
    const struct ps_trace_read_opts *o;
    uint32_t file;
    const char *path;
};

static void tj_progress(void *ctx, uint64_t bytes, uint64_t done, uint64_t size)
{
    struct prog *p = ctx;
    p->o->progress(p->o->ctx, p->file, p->path, bytes, done, size);
}

/* reads one file (path, or the buffer when mem != NULL) into f: frec and unmatched lists */
static int read_one(struct reader *r, struct file *f, const char *path, const char *mem,
                    size_t len, const struct ps_trace_read_opts *opts, uint32_t *fix)
{
    r->cur = f;
    struct prog pg = {opts, f->ix, path};
    struct ps_tj_opts to = {0};
    if (opts && opts->progress) to.progress = tj_progress, to.progress_ctx = &pg;
    int rc = mem ? ps_tj_read_mem(mem, len, f->name, &to, on_event, r, &f->meta, r->d)
                 : ps_tj_read_file(path, f->name, &to, on_event, r, &f->meta, r->d);
    if (!rc) rc = resolve_names(r, f);
    if (!rc) rc = spans(r, f, fix);
    file_free_raw(r, f);
    return rc;
}

/* ---- clocks across files -------------------------------------------------------------------- */

static double fr_start(const struct frec *p) { return isnan(p->g0) ? p->c0 : p->g0; }
static double fr_end(const struct frec *p) { return isnan(p->g1) ? p->c1 : p->g1; }

/* base offsets, then the smallest corrections x with x_b - x_a >= L(a,b) for every cross-file
   dependency a:u -> b:v, L = end(u) - start(v) on the base clock (a difference-constraint
   system, solved by relaxation from x = 0: Bellman-Ford over n files) */
static int align(struct reader *r, struct file *fs, uint32_t nf, double *off)
{
    const struct ps_graph *g = r->g;
    struct ps_trace_read_info *in = r->info;
    int64_t b0 = INT64_MAX;
    bool all_base = true;
    for (uint32_t k = 0; k < nf; k++) {
        if (fs[k].meta.has_base) b0 = fs[k].meta.base_ns < b0 ? fs[k].meta.base_ns : b0;
        else all_base = false;
    }
    for (uint32_t k = 0; k < nf; k++) {
        off[k] = all_base ? (double)(fs[k].meta.base_ns - b0) / 1000.0 : 0;
        in->files[k].base_offset_us = off[k];
    }
    if (nf < 2) return 0;
    uint32_t nv = g->n_nodes;
    uint32_t *fof = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *rix = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    uint32_t *seen = calloc((size_t)nv + 1, sizeof(uint32_t));
    uint32_t *queue = malloc(((size_t)nv + 1) * sizeof(uint32_t));
    double *L = malloc((size_t)nf * nf * sizeof(double));
    double *x = calloc(nf, sizeof(double));
    int rc = 0;
    if (!fof || !rix || !seen || !queue || !L || !x) {
        rc = ps_diag_set(r->d, -ENOMEM, "trace", "out of memory");
        goto out;
    }
    for (uint32_t v = 0; v < nv; v++) fof[v] = UINT32_MAX;
    for (size_t q = 0; q < (size_t)nf * nf; q++) L[q] = -INFINITY;
    for (uint32_t k = 0; k < nf; k++)
        for (size_t q = 0; q < fs[k].nf; q++)
            if (fof[fs[k].f[q].node] == UINT32_MAX) fof[fs[k].f[q].node] = k, rix[fs[k].f[q].node] = (uint32_t)q;
    for (uint32_t u = 0; u < nv; u++) {
        if (fof[u] == UINT32_MAX) continue;
        uint32_t a = fof[u];
        double end = fr_end(&fs[a].f[rix[u]]) + off[a];
        uint32_t qh = 0, qt = 0;
        queue[qt++] = u;
        seen[u] = u + 1;
        while (qh < qt) {
            uint32_t y = queue[qh++];
            for (uint32_t e = g->out_off[y]; e < g->out_off[y + 1]; e++) {
                const struct ps_edge *ed = &g->edges[g->out_edge[e]];
                if (ed->kind != PS_EDGE_DATA && ed->kind != PS_EDGE_PHONY) continue;
                uint32_t w = ed->dst;
                if (seen[w] == u + 1) continue;
                seen[w] = u + 1;
                if (fof[w] == UINT32_MAX) {
                    queue[qt++] = w;
                    continue;
                }
                uint32_t b = fof[w];
                if (b == a) continue;
                in->n_cross_edges++;
                double l = end - (fr_start(&fs[b].f[rix[w]]) + off[b]);
                if (l > L[(size_t)a * nf + b]) L[(size_t)a * nf + b] = l;
            }
        }
    }
    bool changed = true;
    for (uint32_t it = 0; it <= nf && changed; it++) {
        changed = false;
        for (uint32_t a = 0; a < nf; a++)
            for (uint32_t b = 0; b < nf; b++) {
                double l = L[(size_t)a * nf + b];
                if (isfinite(l) && x[b] < x[a] + l - 1e-9) x[b] = x[a] + l, changed = true;
            }
    }
    if (changed) { /* a positive cycle: the edges contradict each other */
        in->clocks_inconsistent = true;
        double worst = 0;
        for (uint32_t a = 0; a < nf; a++)
            for (uint32_t b = 0; b < nf; b++) {
                double l1 = L[(size_t)a * nf + b], l2 = L[(size_t)b * nf + a];
                if (isfinite(l1) && isfinite(l2) && l1 + l2 > worst) worst = l1 + l2;
            }
        in->inconsistency_us = worst;
        memset(x, 0, nf * sizeof(double));
    }
    double lo = 0;
    for (uint32_t k = 0; k < nf; k++) lo = fmin(lo, x[k]);
    for (uint32_t k = 0; k < nf; k++) {
        in->files[k].skew_us = x[k] - lo;
        off[k] += x[k] - lo;
        if (fabs(x[k] - lo) > in->residual_skew_us) in->residual_skew_us = fabs(x[k] - lo);
    }
out:
    free(fof);
    free(rix);
    free(seen);
    free(queue);
    free(L);
    free(x);
    return rc;
}

/* ---- the whole read ------------------------------------------------------------------------- */

struct order_key {
    uint32_t file;
    uint64_t k;
    uint32_t q;
    bool unm;
};

static int cmp_order(const void *a, const void *b)
{
    const struct order_key *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    if (x->k != y->k) return x->k < y->k ? -1 : 1;
    return x->unm - y->unm;
}

static int emit(struct reader *r, struct file *fs, uint32_t nf, const double *off,
                struct ps_trace *out)
{
    const struct ps_graph *g = r->g;
    size_t total = 0;
    for (uint32_t k = 0; k < nf; k++) total += fs[k].nf + fs[k].nu;
    struct order_key *ok = malloc((total + 1) * sizeof(*ok));
    uint32_t *rec_of = malloc(((size_t)g->n_nodes + 1) * sizeof(uint32_t));
    if (!ok || !rec_of) {
        free(ok);
        free(rec_of);
        return ps_diag_set(r->d, -ENOMEM, "trace", "out of memory");
    }
    size_t n = 0;
    for (uint32_t k = 0; k < nf; k++) {
        for (size_t q = 0; q < fs[k].nf; q++) ok[n++] = (struct order_key){k, fs[k].f[q].first_k, (uint32_t)q, false};
        for (size_t q = 0; q < fs[k].nu; q++) ok[n++] = (struct order_key){k, fs[k].u[q].k, (uint32_t)q, true};
    }
    qsort(ok, n, sizeof(*ok), cmp_order);
    for (uint32_t v = 0; v < g->n_nodes; v++) rec_of[v] = UINT32_MAX;
    int rc = 0;
    for (size_t q = 0; q < n && !rc; q++) {
        double o = off[ok[q].file];
        if (ok[q].unm) {
            const struct unm *u = &fs[ok[q].file].u[ok[q].q];
            rc = ps_trace_add(out, UINT32_MAX, u->dev, -1, u->ts + o, u->dur, u->name);
            continue;
        }
        const struct frec *p = &fs[ok[q].file].f[ok[q].q];
        const struct ps_node *nd = &g->nodes[p->node];
        double s = fr_start(p) + o, e = fr_end(p) + o;
        r->info->files[ok[q].file].n_tasks++;
        uint32_t ri = rec_of[p->node];
        if (ri != UINT32_MAX) { /* R1: the same node in another file */
            struct ps_trace_rec *x = &out->r[ri];
            double e0 = x->start_us + x->dur_us;
            x->start_us = fmin(x->start_us, s);
            x->dur_us = fmax(e0, e) - x->start_us;
            r->info->n_merged++;
            continue;
        }
        rec_of[p->node] = out->n;
        if ((rc = ps_trace_add(out, p->node, nd->device, nd->stream, s, e - s, NULL))) break;
        struct ps_trace_rec *x = &out->r[out->n - 1];
        if (!isnan(p->c0)) x->cpu_start_us = p->c0 + o, x->cpu_dur_us = p->c1 - p->c0;
        if (!isnan(p->g0)) x->lane_device = p->gdev, x->lane_stream = p->gstream;
    }
    if (rc) rc = ps_diag_set(r->d, rc, "trace", "out of memory");
    free(ok);
    free(rec_of);
    return rc;
}

static int read_all(const char *const *paths, uint32_t nfiles, const char *mem, size_t len,
                    const struct ps_graph *g, const struct ps_trace_read_opts *opts,
                    struct ps_trace *out, struct ps_trace_read_info *info, struct ps_diag *diag)
{
    struct ps_trace_read_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof(*info));
    ps_trace_init(out, PS_TRACE_IMPORTED);
    struct reader r = {.g = g, .info = info, .d = diag, .step = opts ? opts->step : -1};
    struct file *fs = calloc((size_t)nfiles + 1, sizeof(*fs));
    info->files = calloc((size_t)nfiles + 1, sizeof(*info->files));
    r.map = malloc(((size_t)g->n_nodes + 1) * sizeof(*r.map));
    uint32_t *fix = malloc(((size_t)g->n_nodes + 1) * sizeof(uint32_t));
    double *off = calloc((size_t)nfiles + 1, sizeof(double));
    int rc = 0;
    if (!fs || !info->files || !r.map || !fix || !off) {
        rc = ps_diag_set(diag, -ENOMEM, nfiles ? paths[0] : "trace", "out of memory");
        goto out;
    }
    info->n_files = nfiles;
    if ((rc = ps_memlimit_get(&r.limit, diag))) goto out;
    for (uint32_t v = 0; v < g->n_nodes; v++) {
        ps_node_name(g, v, r.map[v].name, sizeof(r.map[v].name));
        r.map[v].id = v;
        fix[v] = UINT32_MAX;
        r.has_wgrad |= g->nodes[v].kind == PS_NODE_WGRAD;
    }
    qsort(r.map, g->n_nodes, sizeof(*r.map), name_cmp);
    for (uint32_t k = 0; k < nfiles && !rc; k++) {
        fs[k].ix = k;
        fs[k].name = paths[k];
        if (!(info->files[k].path = strdup(paths[k]))) {
            rc = ps_diag_set(diag, -ENOMEM, paths[k], "out of memory");
            break;
        }
        rc = read_one(&r, &fs[k], paths[k], mem, len, opts, fix);
        struct ps_trace_file_info *fi = &info->files[k];
        fi->has_rank = fs[k].meta.has_rank;
        fi->rank = fs[k].meta.rank;
        fi->world_size = fs[k].meta.world_size;
        fi->has_base = fs[k].meta.has_base;
        fi->base_ns = fs[k].meta.base_ns;
        fi->bytes = fs[k].meta.bytes;
        fi->n_elements = fs[k].meta.n_elements;
        if (fs[k].meta.pipescope) {
            info->pipescope = true;
            const char *s = fs[k].meta.source;
            if (!strcmp(s, "simulated")) out->source = PS_TRACE_SIMULATED;
            else if (!strcmp(s, "cpu")) out->source = PS_TRACE_CPU;
            else if (!strcmp(s, "cuda")) out->source = PS_TRACE_CUDA;
        } else if (fs[k].meta.object) {
            info->kineto = true;
        }
    }
    if (rc) goto out;
    size_t mapped = 0;
    for (uint32_t k = 0; k < nfiles; k++) mapped += fs[k].nf;
    if (!mapped) {
        const char *where = nfiles == 1 ? paths[0] : "--measured";
        ps_diag_set(diag, -EINVAL, where,
                    "no event names a task of the graph (%u X events%s, none with args.task or a "
                    "name such as F(0,0), PP:0F0 or chunk0-part0%s)",
                    info->n_events, nfiles > 1 ? " in all files" : "",
                    info->n_unmatched ? "; some names are recognised but name no task of the "
                                        "spec's graph"
                                      : "");
        if (info->n_unmatched && info->n_names)
            ps_diag_hint(diag, "%s: %s", info->unmatched[0], info->unmatched_why[0]);
        else
            ps_diag_hint(diag, "name record_function ranges F(i,j), B(i,j), R(i,j): see "
                               "examples/PROFILER.md");
        rc = -EINVAL;
        goto out;
    }
    if ((rc = align(&r, fs, nfiles, off)) || (rc = emit(&r, fs, nfiles, off, out))) goto out;
    if (!info->pipescope || nfiles > 1) { /* relative to the first mapped record */
        double t0 = INFINITY;
        for (uint32_t q = 0; q < out->n; q++)
            if (out->r[q].node != UINT32_MAX) {
                t0 = fmin(t0, out->r[q].start_us);
                if (!isnan(out->r[q].cpu_start_us)) t0 = fmin(t0, out->r[q].cpu_start_us);
            }
        for (uint32_t q = 0; q < out->n; q++) {
            out->r[q].start_us -= t0;
            out->r[q].cpu_start_us -= t0;
        }
    }
out:
    if (fs)
        for (uint32_t k = 0; k < nfiles; k++) file_free(&fs[k]);
    free(fs);
    free(r.map);
    free(r.th_slot);
    free(fix);
    free(off);
    if (rc || info == &local) ps_trace_read_info_finish(info);
    if (rc) ps_trace_finish(out);
    return rc;
}

int ps_trace_parse(const char *json, size_t len, const char *name, const struct ps_graph *g,
                   struct ps_trace *out, struct ps_trace_read_info *info, struct ps_diag *diag)
{
    const char *paths[1] = {name};
    return read_all(paths, 1, json ? json : "", len, g, NULL, out, info, diag);
}

int ps_trace_read_files(const char *const *paths, uint32_t n, const struct ps_graph *g,
                        const struct ps_trace_read_opts *opts, struct ps_trace *out,
                        struct ps_trace_read_info *info, struct ps_diag *diag)
{
    if (n == 0 || n > PS_TRACE_READ_MAX_FILES) {
        if (info) memset(info, 0, sizeof(*info));
        ps_trace_init(out, PS_TRACE_IMPORTED);
        return ps_diag_set(diag, -EINVAL, "--measured", "%u trace files (expected 1 to %u)", n,
                           PS_TRACE_READ_MAX_FILES);
    }
    return read_all(paths, n, NULL, 0, g, opts, out, info, diag);
}

int ps_trace_read(const char *path, const struct ps_graph *g, struct ps_trace *out,
                  struct ps_trace_read_info *info, struct ps_diag *diag)
{
    return ps_trace_read_files(&path, 1, g, NULL, out, info, diag);
}

static bool trace_name(const char *s)
{
    size_t n = strlen(s);
    if (s[0] == '.') return false;
    return (n > 5 && !strcmp(s + n - 5, ".json")) || (n > 8 && !strcmp(s + n - 8, ".json.gz"));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ps_trace_list_folder(const char *dir, char ***paths, uint32_t *n, struct ps_diag *diag)
{
    *paths = NULL;
    *n = 0;
    DIR *dp = opendir(dir);
    if (!dp) return ps_diag_set(diag, -errno, dir, "cannot open folder: %s", strerror(errno));
    char **v = NULL;
    uint32_t k = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (!trace_name(e->d_name)) continue;
        if (k >= PS_TRACE_READ_MAX_FILES) {
            rc = ps_diag_set(diag, -E2BIG, dir, "more than %u trace files", PS_TRACE_READ_MAX_FILES);
            break;
        }
        char **q = realloc(v, (k + 1) * sizeof(*v));
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        char *p = malloc(l);
        if (q) v = q;
        if (!q || !p) {
            free(p);
            rc = ps_diag_set(diag, -ENOMEM, dir, "out of memory");
            break;
        }
        snprintf(p, l, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) != 0) { /* a dangling link is a trace that cannot be read, not none */
            rc = ps_diag_set(diag, -errno, p, "cannot read the trace: %s", strerror(errno));
            free(p);
            break;
        }
        if (S_ISDIR(st.st_mode)) {
            free(p);
            continue;
        }
        v[k++] = p;
    }
    closedir(dp);
    if (!rc && !k) rc = ps_diag_set(diag, -ENOENT, dir, "no trace file (*.json or *.json.gz) in this folder");
    if (rc) {
        for (uint32_t q = 0; q < k; q++) free(v[q]);
        free(v);
        return rc;
    }
    qsort(v, k, sizeof(*v), cmp_str);
    *paths = v;
    *n = k;
    return 0;
}

void ps_trace_read_info_finish(struct ps_trace_read_info *info)
{
    if (!info) return;
    for (uint32_t k = 0; k < info->n_names; k++) free(info->unmatched[k]), free(info->unmatched_why[k]);
    for (uint32_t k = 0; k < info->n_files; k++) free(info->files[k].path);
    free(info->files);
    free(info->threads);
    memset(info, 0, sizeof(*info));
}
