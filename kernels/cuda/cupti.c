/* cupti: the measured GPU timeline, from CUPTI's Activity API.
 *
 * Enabled kinds: concurrent kernels (CONCURRENT_KERNEL keeps kernels overlapping, KERNEL would
 * serialise them), memcpy, peer memcpy (MEMCPY2), memset, synchronisation, runtime API, driver
 * API and external correlation. The executor pushes the graph node id as external correlation id
 * (CUSTOM0) around each task's launches; CUPTI then emits, per runtime API call made under the
 * push, an EXTERNAL_CORRELATION record (external id, correlation id), and every kernel/memcpy
 * carries the correlation id of the call that launched it. Joining the two maps every device
 * record to its node. External correlation records are written only beside the API records of
 * an enabled kind: RUNTIME for our own launches, DRIVER for work launched through the driver
 * API, as cuBLAS does on Hopper (cuLaunchKernelEx); without DRIVER those GEMMs had no node.
 * Driver API records themselves are not kept.
 *
 * Records with a zero start or end (cupti_activity.h: timestamps could not be collected) are
 * skipped and counted (ps_cupti_result.no_time), never placed at the trace's origin.
 *
 *     host:   push(node) -> cudaLaunchKernel [corr 17] -> pop
 *     CUPTI:  EXTERNAL_CORRELATION {ext = node, corr = 17}   KERNEL {corr = 17, start, end}
 *
 * Buffers: the requested callback hands CUPTI an 8 MiB buffer from malloc and never waits; the
 * completed callback (a CUPTI thread) parses it into our arrays under a mutex that the run
 * thread never takes while tracing, then frees it. A failed malloc returns no buffer, and CUPTI
 * counts the records it drops; the count is read (and reset) with
 * cuptiActivityGetNumDroppedRecords after the final flush and reported, never hidden.
 * Timestamps are kept as int64 nanoseconds relative to the start (absolute ones exceed 2^53).
 * One tracer per process at a time (CUPTI's callbacks are process-wide).
 */
#include "kernels/cuda/cuda.h"

/* CUPTI's headers are not -Wpedantic clean (enumerators beyond int) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cupti.h>
#pragma GCC diagnostic pop
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/diag.h"

#define BUF_BYTES (8u << 20)

struct ext_pair {
    uint32_t corr;
    uint64_t ext;
};

struct ps_cupti {
    pthread_mutex_t mu;
    uint64_t t0;
    struct ps_cupti_rec *r;
    size_t n, cap;
    struct ext_pair *x;
    size_t nx, capx;
    uint64_t dropped;
    uint64_t no_time; /* device/API records skipped for a zero start or end */
    int oom; /* records lost to our own allocation failures */
};

static struct ps_cupti *g_tracer;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMCPY2,           CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,   CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,            CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};
#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

static int cupti_fail(struct ps_diag *d, CUptiResult r, const char *what)
{
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    /* without a driver CUPTI answers CUPTI_ERROR_UNKNOWN (999) or NOT_INITIALIZED */
    int code = (r == CUPTI_ERROR_UNKNOWN || r == CUPTI_ERROR_NOT_INITIALIZED ||
                r == CUPTI_ERROR_INVALID_DEVICE)
                   ? -ENODEV
                   : -EIO;
    return ps_diag_set(d, code, "cupti", "%s: %s (%d)", what, s, (int)r);
}

#define CK(call)                                                                               \
    do {                                                                                       \
        CUptiResult ps_r_ = (call);                                                            \
        if (ps_r_ != CUPTI_SUCCESS) return cupti_fail(d, ps_r_, #call);                        \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *p = NULL;
    if (posix_memalign(&p, 8, BUF_BYTES) != 0) p = NULL;
    *buffer = p;
    *size = p ? BUF_BYTES : 0;
    *max_records = 0;
}

static struct ps_cupti_rec *add_rec(struct ps_cupti *t)
{
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 4096;
        struct ps_cupti_rec *q = realloc(t->r, c * sizeof(*q));
        if (!q) {
            t->oom++;
            return NULL;
        }
        t->r = q;
        t->cap = c;
    }
    struct ps_cupti_rec *r = &t->r[t->n++];
    memset(r, 0, sizeof(*r));
    r->device = UINT32_MAX;
    r->stream = UINT32_MAX;
    r->external = UINT64_MAX;
    return r;
}

static int64_t rel(const struct ps_cupti *t, uint64_t ts)
{
    return (int64_t)(ts - t->t0);
}

/* The fields every timed record has, whatever its struct version: correlation id and start/end
 * timestamps (relative to the trace start); device records also have device and stream. */
#define TIMED(r, kind_, rec)                                                                       \
    do {                                                                                           \
        (r)->kind = (kind_);                                                                       \
        (r)->correlation = (rec)->correlationId;                                                   \
        (r)->start_ns = rel(t, (rec)->start);                                                      \
        (r)->end_ns = rel(t, (rec)->end);                                                          \
    } while (0)
#define ON_DEVICE(r, kind_, rec)                                                                   \
    do {                                                                                           \
        TIMED(r, kind_, rec);                                                                      \
        (r)->device = (rec)->deviceId;                                                             \
        (r)->stream = (rec)->streamId;                                                             \
    } while (0)

/* a timed record without timestamps: counted, not kept */
#define UNTIMED(rec) ((rec)->start == 0 || (rec)->end == 0)

static void parse(struct ps_cupti *t, CUpti_Activity *a)
{
    struct ps_cupti_rec *r;
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        if (UNTIMED(k)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        ON_DEVICE(r, PS_CUPTI_KERNEL, k);
        r->name = k->name ? strdup(k->name) : NULL;
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
        if (UNTIMED(m)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        ON_DEVICE(r, PS_CUPTI_MEMCPY, m);
        r->bytes = m->bytes;
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const CUpti_ActivityMemcpyPtoP4 *m = (const CUpti_ActivityMemcpyPtoP4 *)a;
        if (UNTIMED(m)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        ON_DEVICE(r, PS_CUPTI_MEMCPY_PEER, m);
        r->bytes = m->bytes;
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
        if (UNTIMED(m)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        ON_DEVICE(r, PS_CUPTI_MEMSET, m);
        r->bytes = m->bytes;
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const CUpti_ActivitySynchronization2 *s = (const CUpti_ActivitySynchronization2 *)a;
        if (UNTIMED(s)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        TIMED(r, PS_CUPTI_SYNC, s);
        r->stream = s->streamId;
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const CUpti_ActivityAPI *api = (const CUpti_ActivityAPI *)a;
        if (UNTIMED(api)) {
            t->no_time++;
            return;
        }
        if (!(r = add_rec(t))) return;
        TIMED(r, PS_CUPTI_RUNTIME, api);
        break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const CUpti_ActivityExternalCorrelation *e = (const CUpti_ActivityExternalCorrelation *)a;
        if (e->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return;
        if (t->nx == t->capx) {
            size_t c = t->capx ? t->capx * 2 : 4096;
            struct ext_pair *q = realloc(t->x, c * sizeof(*q));
            if (!q) {
                t->oom++;
                return;
            }
            t->x = q;
            t->capx = c;
        }
        t->x[t->nx].corr = e->correlationId;
        t->x[t->nx].ext = e->externalId;
        t->nx++;
        break;
    }
    default: break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)size;
    pthread_mutex_lock(&g_lock);
    struct ps_cupti *t = g_tracer;
    if (t && buffer && valid) {
        pthread_mutex_lock(&t->mu);
        CUpti_Activity *a = NULL;
        while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) parse(t, a);
        size_t dropped = 0;
        if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS)
            t->dropped += dropped;
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&g_lock);
    free(buffer);
}

int ps_cupti_start(struct ps_cupti **out, struct ps_diag *d)
{
    *out = NULL;
    struct ps_cupti *t = calloc(1, sizeof(*t));
    if (!t) return ps_diag_set(d, -ENOMEM, "cupti", "out of memory");
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return ps_diag_set(d, -ENOMEM, "cupti", "pthread_mutex_init failed");
    }
    pthread_mutex_lock(&g_lock);
    bool busy = g_tracer != NULL;
    if (!busy) g_tracer = t;
    pthread_mutex_unlock(&g_lock);
    if (busy) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        return ps_diag_set(d, -EBUSY, "cupti", "a CUPTI tracer is already running");
    }
    int rc = 0;
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) rc = cupti_fail(d, r, "cuptiActivityRegisterCallbacks");
    size_t enabled = 0;
    for (; rc == 0 && enabled < N_KINDS; enabled++) {
        r = cuptiActivityEnable(kinds[enabled]);
        if (r != CUPTI_SUCCESS) rc = cupti_fail(d, r, "cuptiActivityEnable");
    }
    if (rc == 0) {
        size_t dropped = 0; /* reset the counter: only this run's losses are reported */
        (void)cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped);
        r = cuptiGetTimestamp(&t->t0);
        if (r != CUPTI_SUCCESS) rc = cupti_fail(d, r, "cuptiGetTimestamp");
    }
    if (rc < 0) {
        for (size_t k = 0; k < enabled; k++) (void)cuptiActivityDisable(kinds[k]);
        pthread_mutex_lock(&g_lock);
        g_tracer = NULL;
        pthread_mutex_unlock(&g_lock);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int ps_cupti_push(struct ps_cupti *t, uint64_t id, struct ps_diag *d)
{
    (void)t;
    CK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id));
    return 0;
}

int ps_cupti_pop(struct ps_cupti *t, struct ps_diag *d)
{
    (void)t;
    uint64_t last = 0;
    CK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last));
    return 0;
}

static int cmp_pair(const void *a, const void *b)
{
    const struct ext_pair *x = a, *y = b;
    return x->corr < y->corr ? -1 : x->corr > y->corr;
}

static uint64_t lookup(const struct ext_pair *x, size_t n, uint32_t corr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x[mid].corr < corr) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && x[lo].corr == corr ? x[lo].ext : UINT64_MAX;
}

int ps_cupti_stop(struct ps_cupti *t, struct ps_cupti_result *res, struct ps_diag *d)
{
    memset(res, 0, sizeof(*res));
    if (!t) return ps_diag_set(d, -EINVAL, "cupti", "no tracer");
    /* the caller has synchronised its GPUs: the flush returns every record */
    int rc = 0;
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS && rc == 0) rc = cupti_fail(d, r, "cuptiActivityFlushAll");
    for (size_t k = 0; k < N_KINDS; k++) {
        r = cuptiActivityDisable(kinds[k]);
        if (r != CUPTI_SUCCESS && rc == 0) rc = cupti_fail(d, r, "cuptiActivityDisable");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS)
        t->dropped += dropped;
    pthread_mutex_lock(&g_lock);
    g_tracer = NULL; /* late buffers are freed unparsed */
    pthread_mutex_unlock(&g_lock);

    if (t->nx) qsort(t->x, t->nx, sizeof(*t->x), cmp_pair);
    uint64_t unmapped = 0;
    for (size_t k = 0; k < t->n; k++) {
        struct ps_cupti_rec *x = &t->r[k];
        x->external = lookup(t->x, t->nx, x->correlation);
        bool device = x->kind == PS_CUPTI_KERNEL || x->kind == PS_CUPTI_MEMCPY ||
                      x->kind == PS_CUPTI_MEMCPY_PEER || x->kind == PS_CUPTI_MEMSET;
        if (device && x->external == UINT64_MAX) unmapped++;
    }
    res->n = t->n;
    res->r = t->r;
    res->dropped = t->dropped + (uint64_t)t->oom;
    res->unmapped = unmapped;
    res->no_time = t->no_time;
    free(t->x);
    pthread_mutex_destroy(&t->mu);
    free(t);
    if (rc < 0) {
        ps_cupti_result_finish(res);
        return rc;
    }
    return 0;
}

void ps_cupti_result_finish(struct ps_cupti_result *res)
{
    if (!res) return;
    for (size_t k = 0; k < res->n; k++) free(res->r[k].name);
    free(res->r);
    memset(res, 0, sizeof(*res));
}

const char *ps_cupti_kind_name(enum ps_cupti_kind k)
{
    switch (k) {
    case PS_CUPTI_KERNEL: return "kernel";
    case PS_CUPTI_MEMCPY: return "memcpy";
    case PS_CUPTI_MEMCPY_PEER: return "memcpy";
    case PS_CUPTI_MEMSET: return "memset";
    case PS_CUPTI_SYNC: return "sync";
    case PS_CUPTI_RUNTIME: return "runtime";
    }
    return "?";
}
