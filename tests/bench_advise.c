/* Benchmark of `pipescope advise`'s search (meson benchmark(), figures only, no assertions on
 * time): wall seconds, configurations, simulations and pruned configurations of
 *   1. examples/unet-timeline.json (60 layers, 8 devices), without a cap and with the spec's own
 *      peak as the cap (advise --memory-cap auto), pruned and --exhaustive (targets < 5 s on 2
 *      cores);
 *   2. a 64-layer spec (32 x linear 512 + relu, batch 256) on 16 devices, the same way (target
 *      < 30 s).
 * The drift prediction's forward pass is left out as advise leaves it out for these specs (over
 * 5 GFLOP for unet; the 64-layer spec has no BatchNorm).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/model.h"
#include "src/spec.h"
#include "src/study/study.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const char *name, const char *path)
{
    struct ps_spec *spec = NULL;
    struct ps_model *model = NULL;
    struct ps_diag d;
    ps_diag_clear(&d);
    if (ps_spec_load(path, &spec, &d) || ps_model_build(spec, &model, &d)) {
        fprintf(stderr, "%s: %s\n", d.where, d.msg);
        exit(1);
    }
    for (int cap = 0; cap < 2; cap++)
        for (int np = 0; np < 2; np++) {
            struct ps_advise_opts o = {.cap_auto = cap == 1, .no_prune = np == 1,
                                       .drift_why = "left out by the benchmark"};
            struct ps_advise a;
            double t0 = now();
            if (ps_study_advise(spec, model, &o, &a, &d)) {
                fprintf(stderr, "%s: %s\n", d.where, d.msg);
                exit(1);
            }
            double s = now() - t0;
            printf("advise %-28s %-9s %-10s %7.3f s  %4d configurations, %4d simulations, %4d "
                   "pruned, %s\n", name, cap ? "cap auto" : "no cap", np ? "exhaustive" : "pruned",
                   s, a.n_configs, a.n_simulated, a.n_pruned,
                   a.exhaustive ? "exhaustive" : "not exhaustive");
            fflush(stdout);
            ps_advise_finish(&a);
        }
    ps_model_destroy(model);
    ps_spec_destroy(spec);
}

int main(void)
{
    const char *root = getenv("PS_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof(path), "%s/examples/unet-timeline.json", root ? root : ".");
    run("unet-timeline (8 devices)", path);

    char tmp[] = "/tmp/bench_advise_XXXXXX";
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) return 1;
    fprintf(f, "{\"pipescope\":1,\"name\":\"n64\",\"batch\":256,\"model\":{\"input\":[512],"
               "\"layers\":[");
    for (int j = 0; j < 32; j++)
        fprintf(f, "%s{\"op\":\"linear\",\"out\":512},{\"op\":\"relu\"}", j ? "," : "");
    fprintf(f, "],\"loss\":\"sum\"},\"pipeline\":{\"schedule\":\"gpipe\",\"balance\":[");
    for (int j = 0; j < 16; j++) fprintf(f, "%s4", j ? "," : "");
    fprintf(f, "],\"chunks\":16,\"checkpoint\":\"except_last\"}}\n");
    fclose(f);
    run("64 layers (16 devices)", tmp);
    unlink(tmp);
    return 0;
}
