/* trace: the timeline records that the simulator and every executor produce alike.
 *
 * One record per executed node (or per measured kernel/memcpy that maps to a node): device
 * (Chrome trace pid), stream (graph stream id, Chrome trace tid), start and duration in
 * microseconds relative to the start of the run. Viz and compare read only this, so they never
 * know whether a timeline was simulated or measured (src/HACKING.md, convention 5).
 */
#ifndef PS_TRACE_H
#define PS_TRACE_H

#include <stdint.h>

#include "src/diag.h"

enum ps_trace_source { PS_TRACE_SIMULATED, PS_TRACE_CPU, PS_TRACE_CUDA, PS_TRACE_IMPORTED };

struct ps_trace_rec {
    uint32_t node;     /* graph node id, UINT32_MAX when it maps to none */
    int32_t device;    /* pid */
    int32_t stream;    /* graph stream id (tid); -1 = host */
    double start_us;
    double dur_us;
    char *name;        /* owned; NULL means the graph node's name */
    /* measured traces only (trace_read.h); ps_trace_add sets NaN and -1 */
    double cpu_start_us, cpu_dur_us; /* the host-side range that issued the work */
    int32_t lane_device;             /* GPU the task's kernels and copies ran on, -1 = none */
    int64_t lane_stream;             /* CUDA stream they ran on (the first one), -1 = none */
};

struct ps_trace {
    enum ps_trace_source source;
    uint32_t n, cap;
    struct ps_trace_rec *r;
    uint64_t dropped;  /* records lost by the tracer (CUPTI) */
};

void ps_trace_init(struct ps_trace *t, enum ps_trace_source source);
/* Appends a record (name copied when not NULL). Returns 0 or -ENOMEM. */
int ps_trace_add(struct ps_trace *t, uint32_t node, int32_t device, int32_t stream,
                 double start_us, double dur_us, const char *name);
void ps_trace_finish(struct ps_trace *t); /* frees records; accepts a zeroed struct */
/* End of the last record, measured from the start of the run (time 0, or the first record when
 * one starts before 0). */
double ps_trace_makespan(const struct ps_trace *t);
const char *ps_trace_source_name(enum ps_trace_source s);

#endif
