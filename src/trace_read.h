/* trace_read: Chrome Trace Event Format files back into timeline records (trace.h), mapped onto
 * the task graph.
 *
 * Reads what pipescope writes (viz/trace.c: X events with args.task = graph node id) and what
 * profilers write: Kineto's {"traceEvents": [...]} (plain or .json.gz, one file per rank) and
 * the legacy profiler's bare array. Files are streamed one event at a time (trace_json.h), so
 * memory follows what is kept, not the file's size. Every range is mapped to a node:
 *
 *   1. args.task (an integer) names the node by id; the event's name must then be that node's
 *      name when it looks like a task name (a mismatch means the trace belongs to another spec);
 *   2. otherwise the name is recognised (trace_names.h): pipescope's F(i,j) B(i,j) R(i,j)
 *      Wg(i,j), PyTorch pipelining's PP:<stage><F|I|W|B><mb>, fairscale's chunk<i>-part<j>
 *      (1st range F, 2nd R), and looked up among the graph's node names;
 *   2a. a file that holds several training steps (the n-th range of a task is step n; for
 *      fairscale the recompute counts with its forward) gives one of them (opts->step, else the
 *      last); the ranges of the others are counted and left out;
 *   3. a recognised name that names no node (a stage or micro-batch the spec lacks, a W range
 *      where the schedule does not split backward, a 3rd fairscale range) is kept unmapped
 *      (node = UINT32_MAX, its own name) and listed with the reason; PyTorch's communication
 *      actions (PP:1SEND_F0 ...) are counted, not mapped; any other event is ignored and counted.
 *
 * GPU attribution (Kineto): a CUDA runtime call (cat cuda_runtime / cuda_driver) belongs to the
 * innermost task range on its host thread that encloses it; the kernels, copies and memsets with
 * the same args.correlation (the id Kineto's ac2g flow arrows also carry) belong to that task,
 * and so does a gpu_user_annotation of the task's name. A task with GPU work is measured by the
 * span of that work on the device (start of its first kernel to end of its last), and its lane
 * is the real stream (lane_device, lane_stream); the host range is kept as cpu_start_us /
 * cpu_dur_us, so launch overhead and host stalls stay visible. A task without GPU work is its
 * host range. Several ranges of one node merge into one record spanning them.
 *
 * Several files (one per rank): each file's times are put on one clock by its
 * baseTimeNanoseconds (Kineto: unix time = base + ts), then refined with the graph's cross-file
 * data edges, which must not run backwards: every file gets the smallest correction that makes
 * each successor start after its predecessor ended; the corrections are reported as the residual
 * clock skew. Times are then shifted so the first mapped task starts at 0 (pipescope's own single
 * traces keep theirs).
 *
 * Errors name the file and the JSON path: "t.json: traceEvents[3].dur: expected a number >= 0",
 * "t.json: traceEvents[7].ts: 9.2e+18 is not a time in microseconds (|ts| must be below 2^53)",
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
#define PS_TRACE_READ_MAX_FILES 4096

struct ps_trace_thread {
    char pid[48];      /* process as written (a number or Kineto's/legacy's string) */
    long long tid;
    int32_t device;    /* device of the tasks it ran (first seen), -1 when none */
    uint32_t n_tasks;  /* mapped events on it */
    uint32_t file;     /* index into files[] */
};

struct ps_trace_file_info {
    char *path;
    bool has_rank, has_base;
    int64_t rank, world_size, base_ns;
    uint64_t bytes;          /* uncompressed */
    uint64_t n_elements;     /* traceEvents */
    uint32_t n_tasks;        /* nodes mapped from this file */
    double base_offset_us;   /* from baseTimeNanoseconds, relative to the earliest file */
    double skew_us;          /* correction the graph's cross-file edges required */
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
    char *unmatched_why[PS_TRACE_READ_MAX_NAMES]; /* the reason, one per kept name */
    /* names recognised per convention (trace_names.h) */
    uint32_t n_pipescope_names, n_pytorch, n_fairscale;
    uint32_t n_pytorch_other;  /* PyTorch communication / sharding actions (not tasks) */
    uint32_t n_rank_mismatch;  /* PyTorch stages whose device is not the file's rank */
    uint32_t n_steps;          /* training steps in a file (the most of any file) */
    uint32_t step;             /* the one kept */
    uint32_t n_other_steps;    /* ranges of the other steps, left out */
    /* GPU attribution */
    uint32_t n_launches;       /* runtime calls with a correlation id */
    uint32_t n_gpu_ops;        /* kernels, copies, memsets with one */
    uint32_t n_gpu_attributed; /* of them, launched inside a task range */
    uint32_t n_gpu_tasks;      /* records measured on the GPU */
    uint32_t n_multi_stream;   /* of them, with work on more than one stream */
    /* files and clocks */
    uint32_t n_files;
    struct ps_trace_file_info *files;
    uint32_t n_cross_edges;    /* graph dependencies between tasks of different files */
    double residual_skew_us;   /* largest |correction| */
    bool clocks_inconsistent;  /* the cross-file edges contradict each other */
    double inconsistency_us;   /* by how much */
    uint32_t n_threads;
    struct ps_trace_thread *threads;
};

/* Progress of a long read, for the CLI's stderr: file index, uncompressed bytes so far, the
 * compressed (on-disk) bytes consumed and the file's size on disk (0 = unknown). */
typedef void (*ps_trace_progress_fn)(void *ctx, uint32_t file, const char *path, uint64_t bytes,
                                     uint64_t file_done, uint64_t file_size);
struct ps_trace_read_opts {
    ps_trace_progress_fn progress;
    void *ctx;
    int step; /* the training step to compare when a file holds several; -1 = the last */
};

/* Reads path into out (initialised here; source PS_TRACE_IMPORTED, or PS_TRACE_CPU/CUDA/
 * SIMULATED from a pipescope trace's otherData.source). info may be NULL. Returns 0 or a
 * negative errno with diag (out and info are then empty). */
int ps_trace_read(const char *path, const struct ps_graph *g, struct ps_trace *out,
                  struct ps_trace_read_info *info, struct ps_diag *diag);
/* Several files (one per rank), put on one clock (see above). */
int ps_trace_read_files(const char *const *paths, uint32_t n, const struct ps_graph *g,
                        const struct ps_trace_read_opts *opts, struct ps_trace *out,
                        struct ps_trace_read_info *info, struct ps_diag *diag);
/* The trace files of a folder: its *.json and *.json.gz entries (not hidden ones), sorted by
 * name, as malloc'd "dir/name" strings in *paths (free each and the array). Returns 0, or
 * -ENOENT when there is none, or another negative errno, with diag. */
int ps_trace_list_folder(const char *dir, char ***paths, uint32_t *n, struct ps_diag *diag);
/* The same from memory; `name` is the file name used in errors. */
int ps_trace_parse(const char *json, size_t len, const char *name, const struct ps_graph *g,
                   struct ps_trace *out, struct ps_trace_read_info *info, struct ps_diag *diag);
void ps_trace_read_info_finish(struct ps_trace_read_info *info); /* accepts a zeroed struct */

/* True for names shaped like a task: F(..), B(..), R(..), Wg(..) with a closing parenthesis. */
bool ps_trace_task_like(const char *name);

#endif
