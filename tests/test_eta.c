/* eta: diagnose's estimate of a CPU run's time from the executor's progress reports
 * (src/study/eta.c). The truth: hand-worked report sequences (a slow first task, zero-work
 * tasks, a threaded once-per-step run) and the measured per-task timelines of three examples'
 * steps (tests/golden/eta/, one `run --steps 1 --serial` each): replayed report by report, every
 * estimate diagnose could act on (after 1 s) lies within 2x of the step's measured time. The
 * replay reads recorded times only, so nothing here depends on this machine's speed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "src/study/study.h"

/* a first task of 6 s (one-time costs), then 99 tasks of 0.2 s, all of work 1000: the step
   takes 25.8 s; after the first task alone there is no estimate (time / fraction said 600 s) */
static void test_first_task_counts_once(void **state)
{
    (void)state;
    struct ps_eta e;
    ps_eta_init(&e);
    double total = 100 * 1000.0;
    ps_eta_observe(&e, 6.0, 1000, total);
    assert_true(isnan(ps_eta_total(&e)));
    double t = 6.0;
    for (int k = 2; k <= 100; k++) {
        t += 0.2;
        ps_eta_observe(&e, t, k * 1000.0, total);
        double est = ps_eta_total(&e);
        if (k - 1 < 5) {
            assert_true(isnan(est)); /* under 5% of the work seen after the first task */
            continue;
        }
        /* the same answer at every report: watching longer does not raise it */
        assert_true(fabs(est - 25.8) < 1e-9);
    }
}

/* zero-work tasks (weight 1: waits, forks) before the first compute are not the warm-up */
static void test_zero_work_not_warmup(void **state)
{
    (void)state;
    struct ps_eta e;
    ps_eta_init(&e);
    double total = 3 + 20 * 100.0;
    ps_eta_observe(&e, 0.1, 1, total);
    ps_eta_observe(&e, 0.2, 2, total);
    ps_eta_observe(&e, 0.3, 3, total);
    assert_false(e.warm);
    ps_eta_observe(&e, 2.3, 103, total); /* the first compute: 2 s */
    assert_true(e.warm);
    for (int k = 2; k <= 4; k++) ps_eta_observe(&e, 2.3 + 0.5 * (k - 1), 3 + k * 100.0, total);
    /* 3 tasks after the warm-up at 0.5 s each: 16 to go, 8 s more */
    assert_true(fabs(ps_eta_total(&e) - (3.8 + 8.0)) < 1e-9);
}

/* the threaded executor reports once per step: the first report is a quarter of 4 steps */
static void test_once_per_step(void **state)
{
    (void)state;
    struct ps_eta e;
    ps_eta_init(&e);
    ps_eta_observe(&e, 3.0, 500, 2000);
    assert_true(fabs(ps_eta_total(&e) - 12.0) < 1e-9);
}

/* a measured step replayed: every estimate after 1 s (diagnose's first look) within 2x */
static void replay(const char *name, double *worst_lo, double *worst_hi, int *n_est)
{
    char path[1024];
    const char *root = getenv("PS_SOURCE_ROOT");
    snprintf(path, sizeof(path), "%s/tests/golden/eta/%s.txt", root ? root : ".", name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    double *w = NULL, *t = NULL, total = 0;
    size_t n = 0, cap = 0;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            w = realloc(w, cap * sizeof(*w));
            t = realloc(t, cap * sizeof(*t));
            assert_non_null(w);
            assert_non_null(t);
        }
        assert_int_equal(sscanf(line, "%lf %lf", &w[n], &t[n]), 2);
        total += w[n++];
    }
    fclose(f);
    assert_true(n > 100);
    double T = t[n - 1] * 1e-6, done = 0;
    struct ps_eta e;
    ps_eta_init(&e);
    *worst_lo = *worst_hi = 1;
    *n_est = 0;
    for (size_t k = 0; k < n; k++) {
        done += w[k];
        ps_eta_observe(&e, t[k] * 1e-6, done, total);
        double est = ps_eta_total(&e);
        if (t[k] * 1e-6 < 1.0 || isnan(est)) continue;
        (*n_est)++;
        *worst_lo = fmin(*worst_lo, est / T);
        *worst_hi = fmax(*worst_hi, est / T);
    }
    free(w);
    free(t);
    print_message("%s: step %.1f s, %d estimates, %.2f..%.2f x the step\n", name, T, *n_est,
                  *worst_lo, *worst_hi);
}

static void test_measured_steps(void **state)
{
    (void)state;
    const char *names[] = {"schedules-8stage", "unet-timeline"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        double lo, hi;
        int n;
        replay(names[k], &lo, &hi, &n);
        assert_true(n > 100);
        assert_true(lo >= 0.5);
        assert_true(hi <= 2.0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_task_counts_once),
        cmocka_unit_test(test_zero_work_not_warmup),
        cmocka_unit_test(test_once_per_step),
        cmocka_unit_test(test_measured_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
