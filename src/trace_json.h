/* trace_json: the events of a Chrome trace file, one at a time, in bounded memory.
 *
 * A Kineto trace of a real training step is hundreds of megabytes of JSON (a few hundred bytes
 * per event, millions of events); cJSON's tree of a whole file takes several times its text. So
 * the reader never holds the file: a small tokenizer walks the top level of the document
 *
 *     { "schemaVersion": 1, "distributedInfo": {...}, "traceEvents": [ {ev}, {ev}, ... ],
 *       "baseTimeNanoseconds": 1727..., "otherData": {...} }        (or a bare array [ {ev} ... ])
 *
 * and hands each element of traceEvents, parsed alone by cJSON, to a callback, then frees it.
 * The other top-level members are kept only when they are small metadata the importer uses
 * (distributedInfo, baseTimeNanoseconds, otherData); all others are skipped without being
 * stored. Memory is the buffer of the largest single element (at most PS_TJ_MAX_ELEMENT) plus
 * what the callback keeps, whatever the file is: a regular file, a FIFO, a device, or a gzip
 * stream. Bytes come through src/file.h (the one bounded input reader, gzip decompressed on the
 * fly), so `trace.json.gz` is read directly.
 *
 * Errors name the file and where: "t.json:3:17: not valid JSON" (line and column of the
 * uncompressed text), "t.json: traceEvents[12]: an event of more than 16 MiB", "t.json: trailing
 * data after the JSON document". The callback's own errors pass through unchanged.
 */
#ifndef PS_TRACE_JSON_H
#define PS_TRACE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "src/diag.h"

#define PS_TJ_MAX_ELEMENT ((size_t)16 << 20)

struct ps_tj_meta {
    bool object;          /* {"traceEvents": ...}; false for a bare array of events */
    bool has_events;      /* traceEvents was present (always true for a bare array) */
    bool pipescope;       /* otherData.pipescope present */
    char source[16];      /* otherData.source ("simulated", "cpu", "cuda"), "" when none */
    bool has_rank;        /* distributedInfo.rank */
    int64_t rank, world_size; /* world_size -1 when absent */
    bool has_base;        /* baseTimeNanoseconds (read exactly, as an integer) */
    int64_t base_ns;
    uint64_t n_elements;  /* elements of traceEvents seen */
    uint64_t bytes;       /* uncompressed bytes read */
};

/* Called for each element of traceEvents (k = its index); a non-zero return stops reading and
 * is returned (the callback fills diag). The element is freed after the call. */
typedef int (*ps_tj_event_fn)(void *ctx, uint64_t k, const cJSON *ev, struct ps_diag *d);
/* Progress: uncompressed bytes read so far; for a plain regular file also the bytes of it
 * consumed and its size (both 0 for a gzip stream or a pipe, whose total is unknown). */
typedef void (*ps_tj_progress_fn)(void *ctx, uint64_t bytes, uint64_t file_done,
                                  uint64_t file_size);

struct ps_tj_opts {
    ps_tj_progress_fn progress; /* may be NULL; called about every 16 MiB */
    void *progress_ctx;
    size_t max_element;         /* 0 = PS_TJ_MAX_ELEMENT */
};

/* Streams the file at path (plain or gzip). `name` is used in errors (NULL = path). Returns 0 or
 * a negative errno with diag. */
int ps_tj_read_file(const char *path, const char *name, const struct ps_tj_opts *opts,
                    ps_tj_event_fn fn, void *ctx, struct ps_tj_meta *meta, struct ps_diag *d);
/* The same over a buffer (not necessarily NUL-terminated). */
int ps_tj_read_mem(const char *buf, size_t len, const char *name, const struct ps_tj_opts *opts,
                   ps_tj_event_fn fn, void *ctx, struct ps_tj_meta *meta, struct ps_diag *d);

#endif
