/* common: helpers shared by the .cu files of the CUDA backend (private; never included from C).
 *
 * Every CUDA and cuBLAS call goes through CU()/CUB(), which turn a failure into a negative errno
 * and a diag naming the call and the error string; launches are followed by LAUNCHED(), which
 * picks up configuration errors (cudaGetLastError) without synchronising.
 */
#ifndef PS_CUDA_COMMON_CUH
#define PS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
extern "C" {
#include "src/diag.h"
}

namespace ps {

int fail(struct ps_diag *d, cudaError_t e, const char *what);
int fail_blas(struct ps_diag *d, int status, const char *what);
/* Blocks for a 1-D grid-stride launch over `count` items, capped at a few waves. */
unsigned grid_for(size_t count, unsigned block);
int sm_count(void);
int set_current(int dev); /* cudaSetDevice, remembered for sm_count; returns the cudaError_t */

constexpr unsigned kBlock = 256;

/* Block-wide sum of a double (blockDim.x a multiple of 32, at most 1024). All threads get it. */
__device__ inline double block_sum(double v, double *smem)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* smem may be reused by a previous call */
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < nw ? smem[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

} // namespace ps

#define CU(call)                                                                               \
    do {                                                                                       \
        cudaError_t ps_e_ = (call);                                                            \
        if (ps_e_ != cudaSuccess) return ps::fail(d, ps_e_, #call);                            \
    } while (0)

#define LAUNCHED(what)                                                                         \
    do {                                                                                       \
        cudaError_t ps_e_ = cudaGetLastError();                                                \
        if (ps_e_ != cudaSuccess) return ps::fail(d, ps_e_, what);                             \
    } while (0)

#endif
