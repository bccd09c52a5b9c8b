/* trace_read: a Chrome Trace Event Format file back into timeline records (trace.h).
 *
 * Reads what pipescope writes (viz/trace.c: X events with args.task = graph node id) and what
 * PyTorch's profiler writes (Kineto's {"traceEvents": [...]} and the legacy profiler's bare
 * array) when its record_function ranges are named after tasks: F(i,j), B(i,j), R(i,j)
 * (examples/PROFILER.md). Every record is mapped to a node of the given graph:
 *
 *   1. args.task (an integer) names the node by id; the event's name must then be that node's
 *      name when it looks like a task name (a mismatch means the trace belongs to another spec);
 *   2. otherwise the event's name (blanks removed) is looked up among the graph's node names;
 *   3. an X event whose name looks like a task ("F(", "B(", "R(", "Wg(" ... ")") but names no
 *      node is kept unmapped (node = UINT32_MAX, its own name) and listed as unmatched; any other
 *      event (aten:: ops, M/s/f/i events) is ignored and counted.
 * Several events of one node (CUDA kernels carrying the same task id, nested duplicate ranges)
 * merge into one record spanning them. A mapped record takes the node's device and stream, so
 * lanes line up with a simulation of the same graph; the measured (pid, tid) pairs are listed
 * in info->threads. Times: pipescope traces keep theirs; other traces are shifted so that the
 * first mapped event starts at 0.
 *
 * Errors name the file and the JSON path: "t.json: traceEvents[3].dur: expected a number >= 0",
 * or "t.json:2:17: not valid JSON" with the line and column where parsing stopped.
 */
#ifndef PS_TRACE_READ_H
#define PS_TRACE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/graph.h"
#include "src/trace.h"

#define PS_TRACE_READ_MAX_NAMES 64

struct ps_trace_thread {
    char pid[48];      /* process as written (a number or Kineto's/legacy's string) */
    long long tid;
    int32_t device;    /* device of the tasks it ran (first seen), -1 when none */
    uint32_t n_tasks;  /* mapped events on it */
};

struct ps_trace_read_info {
    bool pipescope;        /* otherData.pipescope present: ids are graph node ids */
    bool kineto;           /* {"traceEvents": ...} without otherData.pipescope */
    uint32_t n_events;     /* X events */
    uint32_t n_by_id, n_by_name;
    uint32_t n_merged;     /* further events of an already mapped node */
    uint32_t n_ignored;    /* X events naming no task, and non-X events */
    uint32_t n_unmatched;  /* task-like names that are no node of the graph */
    uint32_t n_names;      /* kept of them (at most PS_TRACE_READ_MAX_NAMES) */
    char *unmatched[PS_TRACE_READ_MAX_NAMES];
    uint32_t n_threads;
    struct ps_trace_thread *threads;
};

/* Reads path into out (initialised here; source PS_TRACE_IMPORTED, or PS_TRACE_CPU/CUDA/
 * SIMULATED from a pipescope trace's otherData.source). info may be NULL. Returns 0 or a
 * negative errno with diag (out and info are then empty). */
int ps_trace_read(const char *path, const struct ps_graph *g, struct ps_trace *out,
                  struct ps_trace_read_info *info, struct ps_diag *diag);
/* The same from memory; `name` is the file name used in errors. */
int ps_trace_parse(const char *json, size_t len, const char *name, const struct ps_graph *g,
                   struct ps_trace *out, struct ps_trace_read_info *info, struct ps_diag *diag);
void ps_trace_read_info_finish(struct ps_trace_read_info *info); /* accepts a zeroed struct */

/* True for names shaped like a task: F(..), B(..), R(..), Wg(..) with a closing parenthesis. */
bool ps_trace_task_like(const char *name);

#endif
