/* study/sweep: the simulated cost of a spec over chunks x checkpoint modes x schedules
 * (study.h). Every configuration is a variant of the unchanged spec; one that cannot be built
 * (chunks above the batch, interleaved with m not a multiple of the devices) is a row that says
 * why, and the sweep goes on.
 */
#include <stdio.h>
#include <string.h>

#include "src/study/study.h"
#include "viz/viz.h"

static void fill(struct ps_sweep_row *r, const struct ps_sim *sim, int64_t batch)
{
    r->ok = true;
    r->makespan = sim->makespan_us;
    r->throughput = r->makespan > 0 ? (double)batch / (r->makespan * 1e-6) : 0;
    r->bubble = sim->bubble_fraction;
    r->recompute = sim->recompute_overhead;
    r->devices = sim->n_devices;
    for (int dv = 0; dv < sim->n_devices; dv++)
        if (sim->dev[dv].peak_bytes > r->peak) r->peak = sim->dev[dv].peak_bytes;
}

int ps_study_sweep(const struct ps_spec *spec, const struct ps_model *model,
                   const struct ps_costs *costs, const struct ps_sweep_opts *o,
                   struct ps_sweep_row *rows, struct ps_diag *diag)
{
    int total = o->n_sched * o->n_ckpt * o->n_chunks, done = 0, n_ok = 0;
    for (int a = 0; a < o->n_sched; a++)
        for (int b = 0; b < o->n_ckpt; b++)
            for (int c = 0; c < o->n_chunks; c++) {
                struct ps_sweep_row *r = &rows[done++];
                memset(r, 0, sizeof(*r));
                r->chunks = o->chunks[c];
                r->sched = o->sched[a];
                r->ckpt = o->ckpt[b];
                if (o->before) o->before(o->ctx, done, total, r);
                ps_diag_clear(diag);
                struct ps_variant v;
                ps_variant_from_spec(spec, &v);
                if (ps_variant_set_chunks(&v, spec, r->chunks, diag)) {
                    r->bad_chunks = true;
                } else {
                    v.schedule = r->sched;
                    v.checkpoint = r->ckpt;
                    r->m = v.mb_count;
                    struct ps_study_sim run;
                    if (ps_study_simulate(spec, model, &v, NULL, costs, &run, diag) == 0) {
                        fill(r, &run.sim, spec->batch);
                        n_ok++;
                    }
                    ps_study_sim_finish(&run);
                }
                if (!r->ok) snprintf(r->why, sizeof(r->why), "%s", diag->msg);
                if (o->after) o->after(o->ctx, done, total, r);
            }
    return n_ok;
}

cJSON *ps_sweep_json(const struct ps_sweep_row *rows, int n)
{
    static const char *const ckpts[] = {"always", "except_last", "never"};
    cJSON *root = ps_report_new();
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; k < n; k++) {
        const struct ps_sweep_row *r = &rows[k];
        cJSON *x = cJSON_CreateObject();
        ps_json_add_string(x, "schedule", ps_schedule_ops(r->sched)->name);
        ps_json_add_string(x, "checkpoint", ckpts[r->ckpt]);
        ps_json_add_int(x, "chunks", r->chunks);
        ps_json_add_bool(x, "ok", r->ok);
        if (r->ok) {
            ps_json_add_int(x, "devices", r->devices);
            ps_json_add_number(x, "makespan_us", r->makespan);
            ps_json_add_number(x, "throughput_samples_per_s", r->throughput);
            ps_json_add_number(x, "bubble_fraction", r->bubble);
            ps_json_add_int(x, "peak_bytes", r->peak);
            ps_json_add_number(x, "recompute_overhead", r->recompute);
        } else {
            ps_json_add_string(x, "why", r->why);
        }
        cJSON_AddItemToArray(arr, x);
    }
    ps_json_set(root, "sweep", arr);
    return root;
}
