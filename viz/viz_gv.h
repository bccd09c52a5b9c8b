/* viz_gv: private glue between dot.c and svg.c (the Graphviz types stay out of viz.h). */
#ifndef PS_VIZ_GV_H
#define PS_VIZ_GV_H

#include <graphviz/cgraph.h>

#include "viz/viz.h"

/* Builds the cgraph graph that ps_dot_write prints (agclose it). o may be NULL. */
int ps_dot_build(const struct ps_graph *g, const struct ps_dot_opts *o, Agraph_t **out,
                 struct ps_diag *diag);

/* While capturing, Graphviz's messages go to a buffer instead of stderr (library code never
 * prints). ps_gv_capture_end restores the previous handler and returns the captured text
 * ("" when none), valid until the next capture on this thread. */
void ps_gv_capture_begin(void);
const char *ps_gv_capture_end(void);

#endif
