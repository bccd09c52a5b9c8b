/* cmp_report: the comparison of compare.h and a calibration as text, for `compare` and
 * `diagnose` (their JSON is viz/report.h's). */
#ifndef PS_CLI_CMP_REPORT_H
#define PS_CLI_CMP_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "src/compare.h"
#include "src/trace_read.h"
#include "sim/calibrate.h"
#include "viz/report.h"

/* The readable summary (indented two spaces), without a title line. */
void ps_cmp_print(FILE *f, const struct ps_graph *g, const struct ps_compare *c);
/* One line: "makespan error +12.3%, duration error p95 8.1%, 0 inversions". */
const char *ps_cmp_oneline(const struct ps_compare *c, char *buf, int len);

/* The reader's account: names per convention, what was not mapped and why, GPU attribution,
 * files and clocks (indented two spaces). */
void ps_trace_info_print(FILE *f, const struct ps_trace_read_info *in);
void ps_calib_print(FILE *f, const struct ps_calib *cal);


#endif
