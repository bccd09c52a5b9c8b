/* schedule: graph builders for schedules given as explicit per-stage action lists
 * (SEMANTICS.md section 6): 1F1B (PipeDream-Flush), interleaved 1F1B (Megatron) and ZB-H1.
 * GPipe is built by graph.c from torchgpipe's clock cycles and the autograd-engine model.
 */
#ifndef PS_SCHEDULE_H
#define PS_SCHEDULE_H

#include "diag.h"
#include "graph.h"

int ps_schedule_build(const struct ps_spec *spec, const struct ps_model *model,
                      const struct ps_graph_opts *opts, struct ps_graph **out,
                      struct ps_diag *diag);

#endif
