/* exec_cuda: the `cuda` executor, behind the same interface as the cpu one (kernels/exec.h).
 *
 * ps_exec_cuda_run takes what ps_exec_run takes and fills the same struct ps_exec_result (loss
 * per step, wall time per step, the state after the last step, the BN update log, and the
 * timeline of the last step, PS_TRACE_CUDA, from CUPTI), plus the options only this backend
 * has. ps_exec_run (exec_cpu.c) is meant to dispatch PS_BACKEND_CUDA here.
 */
#ifndef PS_EXEC_CUDA_H
#define PS_EXEC_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/exec.h"

struct ps_exec_cuda_opts {
    bool virtual_devices; /* all graph devices on GPU 0, each with its own stream set */
    bool kernel_records;  /* the trace also gets one record per kernel/memcpy (name = kernel) */
};

/* Extra figures of a CUDA run (NULL-able out parameter of ps_exec_cuda_run). */
struct ps_exec_cuda_stats {
    int gpus;              /* physical GPUs used */
    uint32_t events;       /* cudaEvents: one per node another stream waits for (src/waits.h) */
    uint32_t waits;        /* cudaStreamWaitEvent calls per step */
    uint64_t cupti_records;
    uint64_t dropped;      /* CUPTI records dropped (also in res->trace.dropped) */
    uint64_t unmapped;     /* device records without a task id (should be 0) */
    uint64_t no_time;      /* CUPTI records skipped for a zero start or end (should be 0) */
};

/* 0 when a CUDA device can run here; else -ENOTSUP (not built) or -ENODEV with
 * "no CUDA device: <cudaGetErrorString>" in diag. */
int ps_exec_cuda_available(struct ps_diag *d);

/* The run. co NULL = defaults (virtual_devices off: the spec needs as many GPUs as devices).
 * Returns 0, -ENOTSUP, -ENODEV, or a negative errno with diag. */
int ps_exec_cuda_run(const struct ps_graph *g, const struct ps_order *order,
                     const struct ps_exec_opts *o, const struct ps_exec_cuda_opts *co,
                     struct ps_exec_result *res, struct ps_exec_cuda_stats *stats,
                     struct ps_diag *d);

/* The same two, reached through the module loader (kernels/cuda_loader.c): what the rest of
 * pipescope calls, so that only a CUDA run pays for loading cudart, cuBLAS and CUPTI. */
int ps_cuda_backend_available(struct ps_diag *d);
int ps_cuda_backend_run(const struct ps_graph *g, const struct ps_order *order,
                        const struct ps_exec_opts *o, const struct ps_exec_cuda_opts *co,
                        struct ps_exec_result *res, struct ps_exec_cuda_stats *stats,
                        struct ps_diag *d);

#endif
