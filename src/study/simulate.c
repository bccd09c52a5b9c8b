/* study/simulate: build, order, cost and simulate one variant, and the same after calibrating
 * the costs to a measurement (study.h). */
#include "src/study/study.h"

#include "sim/cores.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ps_study_simulate(const struct ps_spec *spec, const struct ps_model *model,
                      const struct ps_variant *opts, const struct ps_plan *plan,
                      const struct ps_costs *costs, struct ps_study_sim *run, struct ps_diag *diag)
{
    memset(run, 0, sizeof(*run));
    int rc = plan ? ps_plan_build(spec, model, opts, plan, &run->g, diag)
                  : ps_schedule_build(spec, model, opts, &run->g, diag);
    if (rc) return rc;
    rc = ps_schedule_order(run->g, &run->order, diag);
    if (rc == -EDEADLK && run->g->root == PS_NONE) run->stuck = ps_plan_stuck(run->g, &run->order);
    if (rc) return rc;
    run->cost = malloc(((size_t)run->g->n_nodes + 1) * sizeof(double));
    if (!run->cost) return ps_diag_set(diag, -ENOMEM, spec->path, "out of memory");
    if ((rc = ps_cost_fill(run->g, costs, run->cost, diag)) ||
        (rc = ps_cost_add_first_backward(run->g, &run->order, costs, run->cost, diag)))
        return rc;
    struct ps_sim_opts so = {.launch_us = ps_cost_launch_us(run->g, costs)};
    return ps_sim_run(run->g, &run->order, run->cost, &so, &run->sim, diag);
}

void ps_study_sim_finish(struct ps_study_sim *run)
{
    ps_sim_finish(&run->sim);
    free(run->cost);
    free(run->stuck);
    ps_order_finish(&run->order);
    ps_graph_destroy(run->g);
    memset(run, 0, sizeof(*run));
}

int ps_study_costs(const struct ps_spec *spec, const char *override, struct ps_costs **out,
                   struct ps_diag *diag)
{
    *out = NULL;
    const char *path = override ? override : spec->costs;
    if (!path) return 0;
    int rc = ps_costs_load(path, out, diag);
    if (rc) return rc;
    if ((*out)->n_layers != spec->n_layers) {
        rc = ps_diag_set(diag, -EINVAL, path, "layers: %d entries, but the model has %d layers",
                         (*out)->n_layers, spec->n_layers);
        ps_costs_destroy(*out);
        *out = NULL;
    }
    return rc;
}

/* sim's timeline replaced by the devices-as-threads one on `cores` cores, or the serial one
 * (PS_STUDY_SERIAL); no launches */
static int as_threads(struct ps_study_sim *sim, int cores, struct ps_diag *diag)
{
    struct ps_cores_result cr = {0};
    int rc = cores == PS_STUDY_SERIAL
                 ? ps_sim_serial(sim->g, &sim->order, sim->cost, &cr, diag)
                 : ps_sim_cores(sim->g, &sim->order, sim->cost, cores, &cr, diag);
    if (rc) return rc;
    struct ps_trace t = sim->sim.trace;
    sim->sim.trace = cr.trace;
    cr.trace = t;
    sim->sim.makespan_us = cr.makespan_us;
    free(sim->sim.issue_us);
    sim->sim.issue_us = NULL;
    sim->sim.launch_us = 0;
    ps_cores_finish(&cr);
    return 0;
}

int ps_study_calibrate(const struct ps_spec *spec, const struct ps_model *model,
                       const struct ps_study_sim *base, const struct ps_trace *meas,
                       bool per_sample, int cores, struct ps_calib *cal,
                       struct ps_study_sim *sim_cal, struct ps_compare *cmp_cal,
                       struct ps_diag *diag)
{
    struct ps_variant v;
    ps_variant_from_spec(spec, &v);
    int rc = ps_calibrate(base->g, &base->order, meas, per_sample, cal, diag);
    if (!rc && cores != 0) {
        /* threads on cores, or one sequence: a start waits for a core, not for a launch, so the
           start-time gaps are not launch overhead (the task durations are fitted apart) */
        cal->fitted[PS_CAL_LAUNCH] = false;
        cal->costs->launch_overhead_us = 0;
    }
    if (!rc) rc = ps_study_simulate(spec, model, &v, NULL, cal->costs, sim_cal, diag);
    if (!rc && cores != 0) rc = as_threads(sim_cal, cores, diag);
    if (!rc) rc = ps_compare_run(sim_cal->g, &sim_cal->sim.trace, meas, cmp_cal, diag);
    return rc;
}
