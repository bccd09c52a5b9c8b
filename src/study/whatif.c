/* study/whatif: the no-phony what-if (study.h). torchgpipe's fork/join (depend()) edges are what
 * keeps the autograd engine from running a later micro-batch's backward or recompute early; the
 * what-if builds the same variant without them and asks the same questions: which ordering
 * invariants stop being guaranteed, and how peak activation memory moves as recomputes hoist.
 * `check`, `diagnose` and `simulate --no-phony` all take the variant from here.
 */
#include "src/study/study.h"

#include <math.h>
#include <string.h>

bool ps_study_whatif_applies(const struct ps_variant *v)
{
    const struct ps_schedule_ops *ops = ps_schedule_ops(v->schedule);
    return ops && ops->phony;
}

struct ps_variant ps_study_whatif_variant(const struct ps_variant *v)
{
    struct ps_variant w = *v;
    w.phony = false;
    return w;
}

void ps_study_whatif(const struct ps_spec *spec, const struct ps_model *model,
                     const struct ps_analysis *base, struct ps_whatif *w)
{
    memset(w, 0, sizeof(*w));
    struct ps_variant v;
    ps_variant_from_spec(spec, &v);
    if (!spec->phony || !ps_study_whatif_applies(&v)) return;
    struct ps_variant wv = ps_study_whatif_variant(&v);
    struct ps_diag d;
    ps_diag_clear(&d);
    w->ran = ps_schedule_build(spec, model, &wv, &w->g, &d) == 0 &&
             ps_schedule_order(w->g, &w->order, &d) == 0 &&
             ps_analysis_run(w->g, &w->order, NULL, &w->an, &d) == 0;
    if (!w->ran) return;
    for (int c = 0; c < PS_CHECK__COUNT; c++)
        if (!base->per_check[c]) w->lost += w->an.per_check[c];
    for (int k = 0; k < base->n_devices && base->mem && w->an.mem; k++)
        if (base->mem[k].peak_bytes > 0)
            w->mem_growth = fmax(w->mem_growth, (double)w->an.mem[k].peak_bytes /
                                                    (double)base->mem[k].peak_bytes);
}

void ps_study_whatif_finish(struct ps_whatif *w)
{
    ps_analysis_finish(&w->an);
    ps_order_finish(&w->order);
    ps_graph_destroy(w->g);
    memset(w, 0, sizeof(*w));
}
