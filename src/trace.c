/* trace: a growable array of timeline records (see trace.h). */
#include "src/trace.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void ps_trace_init(struct ps_trace *t, enum ps_trace_source source)
{
    memset(t, 0, sizeof(*t));
    t->source = source;
}

int ps_trace_add(struct ps_trace *t, uint32_t node, int32_t device, int32_t stream,
                 double start_us, double dur_us, const char *name)
{
    if (t->n == t->cap) {
        uint32_t c = t->cap ? t->cap * 2 : 256;
        struct ps_trace_rec *q = realloc(t->r, (size_t)c * sizeof(*q));
        if (!q) return -ENOMEM;
        t->r = q;
        t->cap = c;
    }
    struct ps_trace_rec *r = &t->r[t->n];
    r->node = node;
    r->device = device;
    r->stream = stream;
    r->start_us = start_us;
    r->dur_us = dur_us;
    r->name = NULL;
    r->cpu_start_us = r->cpu_dur_us = NAN;
    r->lane_device = -1;
    r->lane_stream = -1;
    if (name && !(r->name = strdup(name))) return -ENOMEM;
    t->n++;
    return 0;
}

void ps_trace_finish(struct ps_trace *t)
{
    if (!t) return;
    for (uint32_t k = 0; k < t->n; k++) free(t->r[k].name);
    free(t->r);
    memset(t, 0, sizeof(*t));
}

double ps_trace_makespan(const struct ps_trace *t)
{
    if (!t->n) return 0;
    /* times are relative to the start of the run (0): a first record at 4 us (one launch
       later) still counts those 4 us, as the simulator's makespan does */
    double lo = 0, hi = t->r[0].start_us + t->r[0].dur_us;
    for (uint32_t k = 1; k < t->n; k++) {
        if (t->r[k].start_us < lo) lo = t->r[k].start_us;
        if (t->r[k].start_us + t->r[k].dur_us > hi) hi = t->r[k].start_us + t->r[k].dur_us;
    }
    return hi - lo;
}

const char *ps_trace_source_name(enum ps_trace_source s)
{
    switch (s) {
    case PS_TRACE_SIMULATED: return "simulated";
    case PS_TRACE_CPU: return "cpu";
    case PS_TRACE_CUDA: return "cuda";
    case PS_TRACE_IMPORTED: return "imported";
    }
    return "?";
}
