/* cuda_loader: the CUDA backend is a module (pipescope-cuda.so) loaded on first use.
 *
 * Linking cudart, cuBLAS and CUPTI into the binary costs about 0.35 s at every process start
 * (the dynamic loader maps several hundred MB), which every command would pay, GPU or not. So
 * the executor calls these two functions, which dlopen the module the first time a CUDA run is
 * asked for and forward to its ps_exec_cuda_available / ps_exec_cuda_run (kernels/exec_cuda.c).
 * The module is searched for at $PIPESCOPE_CUDA_MODULE, next to the executable, in
 * ../lib/pipescope/ relative to it, then by the dynamic loader's own search path.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/exec_cuda.h"
#include "ps_config.h"

#define MODULE "pipescope-cuda.so"

typedef int (*avail_fn)(struct ps_diag *);
typedef int (*run_fn)(const struct ps_graph *, const struct ps_order *,
                      const struct ps_exec_opts *, const struct ps_exec_cuda_opts *,
                      struct ps_exec_result *, struct ps_exec_cuda_stats *, struct ps_diag *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static avail_fn avail;
static run_fn run;
static char why[512];

static void *try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && !why[0]) snprintf(why, sizeof(why), "%s", dlerror());
    return h;
}

static void load(void)
{
    void *h = NULL;
    const char *env = getenv("PIPESCOPE_CUDA_MODULE");
    if (env && *env) h = try_open(env);
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (!h && n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        const char *rel[] = {"", "/..", "/../lib/pipescope"};
        for (size_t k = 0; !h && k < sizeof(rel) / sizeof(rel[0]); k++) {
            snprintf(path, sizeof(path), "%s%s/" MODULE, exe, rel[k]);
            if (access(path, R_OK) == 0) h = try_open(path);
        }
    }
    if (!h) h = try_open(MODULE);
    if (!h) return;
    avail = (avail_fn)(uintptr_t)dlsym(h, "ps_exec_cuda_available");
    run = (run_fn)(uintptr_t)dlsym(h, "ps_exec_cuda_run");
    if (!avail || !run) snprintf(why, sizeof(why), MODULE " lacks the executor entry points");
}

static int missing(struct ps_diag *d)
{
    if (!PS_HAVE_CUDA)
        return ps_diag_set(d, -ENOTSUP, "--backend cuda",
                           "the CUDA backend is not built: nvcc was not found when this "
                           "pipescope was configured");
    return ps_diag_set(d, -ENOTSUP, "--backend cuda", "cannot load the CUDA backend: %s",
                       why[0] ? why : MODULE " not found");
}

int ps_cuda_backend_available(struct ps_diag *d)
{
    if (!PS_HAVE_CUDA) return missing(d);
    pthread_once(&once, load);
    if (!avail || !run) return missing(d);
    return avail(d);
}

int ps_cuda_backend_run(const struct ps_graph *g, const struct ps_order *order,
                        const struct ps_exec_opts *o, const struct ps_exec_cuda_opts *co,
                        struct ps_exec_result *res, struct ps_exec_cuda_stats *stats,
                        struct ps_diag *d)
{
    if (!PS_HAVE_CUDA) return missing(d);
    pthread_once(&once, load);
    if (!avail || !run) return missing(d);
    return run(g, order, o, co, res, stats, d);
}
