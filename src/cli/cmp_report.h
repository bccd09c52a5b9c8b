/* cmp_report: the comparison of compare.h as text and as the report JSON's "comparison"
 * section (FORMATS.md), shared by `compare` and `diagnose`; the costs file writer of
 * calibration (sim/COSTS.md). */
#ifndef PS_CLI_CMP_REPORT_H
#define PS_CLI_CMP_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "src/compare.h"
#include "src/trace_read.h"

/* "211.3 us", "35.20 ms", "1.204 s" */
const char *ps_cli_time(double us, char *buf, int len);

/* The readable summary (indented two spaces), without a title line. */
void ps_cmp_print(FILE *f, const struct ps_graph *g, const struct ps_compare *c);
/* One line: "makespan error +12.3%, duration error p95 8.1%, 0 inversions". */
const char *ps_cmp_oneline(const struct ps_compare *c, char *buf, int len);

/* The "comparison" object. info (may be NULL) adds the reader's counts and unmatched names. */
cJSON *ps_cmp_json(const struct ps_graph *g, const struct ps_compare *c,
                   const struct ps_trace *meas, const struct ps_trace_read_info *info,
                   const struct ps_tolerance *tol, int exceeded, const char *why);
/* The reader's account: names per convention, what was not mapped and why, GPU attribution,
 * files and clocks (indented two spaces). */
void ps_trace_info_print(FILE *f, const struct ps_trace_read_info *in);
/* {"fitted": ..., "costs": ..., "before": ..., "after": ...} of a calibration. */
cJSON *ps_calib_json(const struct ps_calib *cal, const struct ps_compare *before,
                     const struct ps_compare *after);
void ps_calib_print(FILE *f, const struct ps_calib *cal);

/* sim/COSTS.md JSON, numbers with %.17g; atomically to path ("-" = stdout). */
cJSON *ps_costs_json(const struct ps_costs *c);
int ps_costs_write(const struct ps_costs *c, const char *path, struct ps_diag *diag);

#endif
