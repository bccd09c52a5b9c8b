/* schedule: explicit per-stage action lists (see schedule.h). */
#include "schedule.h"

#include <errno.h>

int ps_schedule_build(const struct ps_spec *spec, const struct ps_model *model,
                      const struct ps_graph_opts *opts, struct ps_graph **out,
                      struct ps_diag *diag)
{
    (void)model;
    *out = NULL;
    return ps_diag_set(diag, -ENOTSUP, spec->path, "pipeline.schedule: '%s' is not available",
                       ps_schedule_name(opts->schedule));
}
