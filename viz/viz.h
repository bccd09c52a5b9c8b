/* viz: the writers of everything pipescope shows (viz/REPORT.md), and nothing else.
 *
 * Viz reads a graph, an analysis, an order or a trace and writes a file; it never derives the
 * schedule, checks anything or measures anything. Every writer comes in two forms: one that
 * writes to a FILE * (the caller owns it) and one that writes to a path through the atomic
 * writer of out.c, so a failed command never leaves a partial file ("-" means stdout).
 *
 *   out.c     ps_out_*: atomic files and folders (a temporary twin beside, then rename)
 *   dot.c     DOT through Graphviz cgraph: one cluster per device, task-named nodes
 *   svg.c     SVG of the same graph, laid out and rendered by Graphviz (gvc, engine "dot")
 *   json.c    report JSON with cJSON, numbers printed by us (%.17g, integers as integers)
 *   trace.c   Chrome Trace Event Format (Perfetto, chrome://tracing) from a struct ps_trace
 *   plot.c    own SVG: Gantt timelines (one or two traces) and line plots (sweeps, drift)
 *
 * Graph pictures are backends behind one ops table (struct ps_graph_format): "dot" and "svg".
 * Determinism: the same input gives the same bytes (node order = index order, attributes set in
 * a fixed order, numbers in fixed formats); the tests write everything twice and compare.
 */
#ifndef PS_VIZ_H
#define PS_VIZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "src/analysis.h"
#include "src/diag.h"
#include "src/engine.h"
#include "src/graph.h"
#include "src/spec.h"
#include "src/trace.h"

/* ---- atomic output files (out.c) ------------------------------------------------------- */

/* An output file being written (out.c has the rules). ps_out_open creates .NAME.tmp.RANDOM
 * beside PATH (or beside a link's target), or writes straight through to stdout ("-" or NULL),
 * a character device or a FIFO; ps_out_commit flushes, optionally fsyncs, closes (each checked)
 * and renames it over PATH; ps_out_abort closes and removes it, leaving any old PATH untouched.
 * Missing parent folders are created. After commit or abort the struct is zeroed, so abort
 * after a failed commit is harmless. New files get mode 0644; a replaced file keeps its mode. */
struct ps_out {
    FILE *f;     /* write here */
    char *path;  /* PATH as given, NULL for stdout */
    char *tmp;   /* temporary file's name in dirfd, NULL when written straight through */
    char *name;  /* last component of PATH (or of the link's target) */
    int dirfd;   /* the folder holding tmp and name */
    int slot;    /* cleanup registry slot (signals) */
    bool direct; /* device or FIFO: no temporary file */
    bool sync;   /* fsync before the rename (off by default) */
};

/* The marker file in every folder pipescope writes as a whole (-o DIR, --save-state DIR). */
#define PS_OUT_MARKER ".pipescope-output"

int ps_out_open(struct ps_out *o, const char *path, struct ps_diag *diag);
int ps_out_commit(struct ps_out *o, struct ps_diag *diag);
void ps_out_abort(struct ps_out *o); /* accepts a zeroed struct */
/* Deferred commits (out.c, O4): after ps_out_defer_begin, ps_out_commit leaves the complete
 * temporary file in place and folders wait as their twins; ps_out_defer_end(true) renames
 * every file over its PATH, then swaps every folder in; ps_out_defer_end(false) removes them.
 * Parent folders created meanwhile are removed again when empty. Returns 0 or -errno (diag). */
void ps_out_defer_begin(void);
int ps_out_defer_end(bool commit, struct ps_diag *diag);
/* Declares DIR an output folder of this command (needs a deferral): refuses, touching nothing,
 * a DIR that is a file, a link or a folder that is neither empty nor pipescope's (marker);
 * creates missing parents and DIR's temporary twin with the marker in it. *write_to is where
 * DIR's files go until ps_out_defer_end swaps the twin in (valid until then; the same for a
 * DIR declared twice). Returns 0 or -errno with diag. */
int ps_out_folder(const char *dir, const char **write_to, struct ps_diag *diag);
/* Before any computation: PATH can be written (missing parents created, a temporary file made
 * and removed beside it; a device checked for write access). Returns 0 or -errno with diag. */
int ps_out_check(const char *path, struct ps_diag *diag);
/* Flushes stdout; -EIO/-ENOSPC... with diag ("stdout: write error: ...") if any write to it
 * failed. */
int ps_out_stdout_check(struct ps_diag *diag);
/* open, write(f, ctx, diag), commit; abort when write returns < 0. Returns 0 or -errno. */
int ps_out_write(const char *path, int (*write)(FILE *f, void *ctx, struct ps_diag *diag),
                 void *ctx, struct ps_diag *diag);

/* Name of distinct device `device` of the graph's spec ("cuda:0", "cpu"); without a spec (or
 * out of range) "cuda:N" (src/SPEC.md's default: partition j on cuda:j). Returns buf. */
const char *ps_viz_device_name(const struct ps_graph *g, int device, char *buf, int len);

/* Colour of value v on a scale [lo, hi] as "#rrggbb" (buf holds 8 bytes): white -> red when
 * lo >= 0, blue -> white (at 0) -> red when lo < 0 < hi, values clamped. Returns buf. */
const char *ps_viz_color_scale(double v, double lo, double hi, char buf[8]);

/* ---- graph pictures: DOT (dot.c) and SVG (svg.c) -------------------------------------- */

enum ps_dot_filter {
    PS_DOT_ALL,      /* --all */
    PS_DOT_FORWARD,  /* --forward: forward-phase nodes only */
    PS_DOT_BACKWARD, /* --backward: backward-phase nodes only */
};

/* Fill colour of a node ("#rrggbb" or a Graphviz colour name written into buf), or NULL for
 * the default. */
typedef const char *(*ps_dot_color_fn)(const struct ps_graph *g, uint32_t node, void *ctx,
                                       char *buf, int len);

struct ps_dot_opts {
    enum ps_dot_filter filter;
    bool tasks_only;   /* contract fork/join/wait/copy/r nodes into edges between tasks */
    bool host_edges;   /* draw HOST edges (dotted grey) */
    bool stream_edges; /* draw STREAM edges (dotted blue) */
    const char *rankdir; /* NULL = "LR" */
    const char *title;   /* graph label, NULL = none */
    /* Colour nodes by a value (e.g. timing error): node_value[v] for every node, NaN = no
     * value. Scale [value_min, value_max]; both 0 = the range of the finite values (made
     * symmetric around 0 when it spans 0). value_name (optional) goes into the label. */
    const double *node_value;
    double value_min, value_max;
    const char *value_name;
    /* Per-node colour callback; wins over node_value when it returns non-NULL. */
    ps_dot_color_fn color;
    void *color_ctx;
};

void ps_dot_opts_init(struct ps_dot_opts *o); /* PS_DOT_ALL, data + phony edges, rankdir LR */

/* o may be NULL (defaults). Return 0 or a negative errno (diag filled). */
int ps_dot_write(const struct ps_graph *g, const struct ps_dot_opts *o, FILE *f,
                 struct ps_diag *diag);
int ps_dot_write_file(const struct ps_graph *g, const struct ps_dot_opts *o, const char *path,
                      struct ps_diag *diag);

/* The node shapes and edge styles of the DOT/SVG graphs as a small standalone SVG (malloc'd,
 * NUL-terminated; NULL when out of memory). */
char *ps_dot_legend_svg(void);

/* SVG laid out by Graphviz's dot engine. ps_svg_render returns a malloc'd, NUL-terminated
 * buffer (free()) and its length. */
int ps_svg_render(const struct ps_graph *g, const struct ps_dot_opts *o, char **data,
                  size_t *len, struct ps_diag *diag);
int ps_svg_write(const struct ps_graph *g, const struct ps_dot_opts *o, FILE *f,
                 struct ps_diag *diag);
int ps_svg_write_file(const struct ps_graph *g, const struct ps_dot_opts *o, const char *path,
                      struct ps_diag *diag);

/* The ops table of graph formats. */
struct ps_graph_format {
    const char *name; /* "dot", "svg" */
    const char *ext;  /* ".dot", ".svg" */
    int (*write)(const struct ps_graph *g, const struct ps_dot_opts *o, FILE *f,
                 struct ps_diag *diag);
};
extern const struct ps_graph_format ps_graph_formats[];
extern const int ps_graph_n_formats;
/* By name ("svg") or by the extension of a path ("out/g.dot"); NULL when unknown. */
const struct ps_graph_format *ps_graph_format_find(const char *name_or_path);
int ps_graph_format_write_file(const struct ps_graph_format *fmt, const struct ps_graph *g,
                               const struct ps_dot_opts *o, const char *path,
                               struct ps_diag *diag);

/* ---- report JSON (json.c) -------------------------------------------------------------- */

/* Numbers: cJSON prints 15 digits, so numbers are cJSON raw items that we format: integers
 * as integers, other finite doubles with %.17g (exact round trip), NaN/inf as null. */
int ps_json_format_number(double v, char *buf, size_t len); /* -EDOM when not finite */
cJSON *ps_json_number(double v); /* raw number, or a null item when not finite */
cJSON *ps_json_int(int64_t v);
/* Add to an object (or to an array when key is NULL); return the item or NULL (ENOMEM). */
cJSON *ps_json_add_number(cJSON *obj, const char *key, double v);
cJSON *ps_json_add_int(cJSON *obj, const char *key, int64_t v);
cJSON *ps_json_add_string(cJSON *obj, const char *key, const char *s); /* NULL s -> null */
cJSON *ps_json_add_bool(cJSON *obj, const char *key, bool b);
/* Adds item under key, replacing an existing key (so a section can be rebuilt). Takes
 * ownership of item (freed on failure). Returns 0 or -ENOMEM. */
int ps_json_set(cJSON *obj, const char *key, cJSON *item);

/* {"pipescope": 1}; NULL when out of memory. Free with cJSON_Delete. */
cJSON *ps_report_new(void);
/* "spec": the normalised spec, every field with its default applied, plus derived mb_count,
 * mb_size, first_layer, device_id, n_devices, checkpoint_stop. */
int ps_report_add_spec(cJSON *root, const struct ps_spec *spec);
/* "graph": {"nodes", "edges", "phony_edges", "kinds": {kind: count}, "edge_kinds", "streams",
 * "micro_batches", "partitions", "devices"}. */
int ps_report_add_graph(cJSON *root, const struct ps_graph *g);
/* "analysis": {"ok", "n_violations", "violations": [{"check", "nodes", "message"}],
 * "checks": {name: {"checked", "violations"}}, "cycle" (when one was found),
 * "critical_path" (when computed), "memory" and "order" (when order != NULL)}. */
int ps_report_add_analysis(cJSON *root, const struct ps_graph *g, const struct ps_analysis *a,
                           const struct ps_order *order);
/* F/R/B/Wg task names in execution order: an array with one device, else an object
 * {"cuda:0": [...], "cuda:1": [...]} keyed by the device whose thread ran them. */
cJSON *ps_report_order(const struct ps_graph *g, const struct ps_order *order);
/* Prints (formatted, trailing newline) and writes atomically; "-" = stdout. */
int ps_report_write(const cJSON *root, const char *path, struct ps_diag *diag);
int ps_report_fprint(const cJSON *root, FILE *f, struct ps_diag *diag);

/* ---- Chrome trace (trace.c) ------------------------------------------------------------ */

#define PS_CHROME_HOST_TID 1000000 /* tid of host records (stream -1) */

/* One value of a counter track ("C" event): from t_us on, `value` on device `pid`. */
struct ps_chrome_counter {
    int32_t pid;
    double t_us;
    int64_t value;
};

struct ps_chrome_opts {
    bool no_flows;    /* omit flow events */
    /* counter events after the slices, in the given order (e.g. the executor's memory) */
    const struct ps_chrome_counter *counters;
    uint32_t n_counters;
    const char *counter_name; /* the track's name; its one arg is "bytes" */
    bool flows_via_unrecorded; /* also draw a dependency that passes through nodes without a
                                  record (fork/join on the host), as one flow */
};

/* X events (ts/dur in us with 3 decimals), M events naming processes (devices) and threads
 * (streams), s/f flow events for DATA/PHONY edges between recorded nodes on different
 * (device, stream). g may be NULL (names then come from the records only). o may be NULL. */
int ps_chrome_write(const struct ps_graph *g, const struct ps_trace *t,
                    const struct ps_chrome_opts *o, FILE *f, struct ps_diag *diag);
int ps_chrome_write_file(const struct ps_graph *g, const struct ps_trace *t,
                         const struct ps_chrome_opts *o, const char *path, struct ps_diag *diag);

/* ---- own SVG plots (plot.c) ------------------------------------------------------------- */

struct ps_gantt_opts {
    const char *title;  /* NULL = none */
    const char *label;  /* name of the first trace, NULL = its source ("simulated") */
    const char *label2; /* name of the second trace */
    double width;       /* px, 0 = 1200 */
    /* simulated traces: when the host issued each node (struct ps_sim issue_us, per node) and
     * the launch overhead; draws a "launches" lane per device. NULL = none. */
    const double *issue_us, *issue2_us;
    double launch_us, launch2_us;
};

/* Gantt timeline: one lane per (device, stream) with records, named after what ran it (a CPU
 * run's lanes say "cpu"), boxes coloured by category, micro-batch number in boxes wide enough,
 * time axis in us/ms/s, lane labels, legend. t2 (optional) is drawn below t: on the same time
 * axis when the two spans are within a factor 2 of each other, else each block on its own axis
 * (a 100x shorter trace would be an empty block on a shared axis). g may be NULL; o may be
 * NULL. Each block is a <g id="traceK" data-x0 data-x1> group so tests can measure it. */
int ps_plot_gantt(const struct ps_graph *g, const struct ps_trace *t, const struct ps_trace *t2,
                  const struct ps_gantt_opts *o, FILE *f, struct ps_diag *diag);
int ps_plot_gantt_file(const struct ps_graph *g, const struct ps_trace *t,
                       const struct ps_trace *t2, const struct ps_gantt_opts *o,
                       const char *path, struct ps_diag *diag);

struct ps_plot_series {
    const char *name;
    const double *y; /* n values (struct ps_line_plot), NaN = no point */
    int style;       /* 1 + a fixed look (colour, dash, marker), so that a series named the same
                        looks the same in every report; 0 = by its place in the list */
};

enum ps_plot_unit { PS_UNIT_NONE, PS_UNIT_BYTES, PS_UNIT_US };

/* Line plot: series told apart by colour, then dash pattern (10 colours x 4 dashes) and marker;
 * the legend beside the plot is as wide as its longest name; with y_unit the y values are shown
 * in KiB/MiB/GiB or us/ms/s (the unit chosen from the largest value, named in the y label). */
struct ps_line_plot {
    const char *title, *xlabel, *ylabel; /* NULL = none */
    enum ps_plot_unit y_unit;
    uint32_t n;                 /* points per series */
    const double *x;            /* n x values */
    bool log2_x;                /* log2 x axis (x <= 0 skipped) */
    bool y_zero;                /* include 0 in the y range */
    bool log_y_auto;            /* log10 y axis when the values are >= 0 and the positive ones
                                   span 100x or more (zeros are then left out, as gaps) */
    uint32_t n_series;
    const struct ps_plot_series *series;
    double width, height;       /* px, 0 = 720 x 440 */
};

int ps_plot_lines(const struct ps_line_plot *p, FILE *f, struct ps_diag *diag);
int ps_plot_lines_file(const struct ps_line_plot *p, const char *path, struct ps_diag *diag);

#endif
