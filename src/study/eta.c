/* study/eta: how long a CPU run will take, from the executor's progress hook while it runs.
 *
 * The hook reports the work done so far (a roofline weight per task, kernels/exec_cpu.c) and
 * the total. Dividing the time so far by the fraction done overestimates a step badly: the
 * first task of a step carries one-time costs (first touch of the activation and workspace
 * memory, weight packing) that can be thirty times an ordinary task (schedules-8stage: 6.1 s
 * for a task that then takes 0.21 s), so after that task the fraction done is ~1/500 of the
 * work and the guess is hundreds of times the step. ps_eta keeps that first substantial task
 * apart: its time counts once, and the rest of the work is paced by the tasks after it. Until
 * some work after it is seen (5% of the total) there is no estimate, except when the first
 * report already covers a large part of the run (the threaded executor reports once per step):
 * then the plain proportion is right.
 */
#include <math.h>
#include <string.h>

#include "src/study/study.h"

#define ETA_MIN_AFTER 0.05 /* fraction of the work seen after the warm-up before estimating */
#define ETA_BIG_FIRST 0.10 /* a first report this large is a whole step, not one task */

void ps_eta_init(struct ps_eta *e)
{
    memset(e, 0, sizeof(*e));
}

void ps_eta_observe(struct ps_eta *e, double t_s, double done, double total)
{
    double inc = done - e->done;
    e->t = t_s;
    e->done = done;
    e->total = total;
    /* zero-work tasks (waits, forks) weigh 1 each: the warm-up is the first task above that */
    if (!e->warm && inc > 1.5) {
        e->warm = true;
        e->warm_t = t_s;
        e->warm_done = done;
    }
}

double ps_eta_total(const struct ps_eta *e)
{
    if (!e->warm || !(e->total > 0)) return NAN;
    double after = e->done - e->warm_done;
    if (after >= ETA_MIN_AFTER * e->total && e->t > e->warm_t)
        return e->t + (e->total - e->done) * (e->t - e->warm_t) / after;
    if (e->warm_done >= ETA_BIG_FIRST * e->total) return e->t * e->total / e->done;
    return NAN;
}
