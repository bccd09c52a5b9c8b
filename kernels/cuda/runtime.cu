/* runtime: devices, memory, streams and events of the CUDA backend, behind plain C calls.
 *
 * Invariants: every runtime call's status is checked and turned into a negative errno plus a diag
 * ("cudaMalloc(...): out of memory"); -ENODEV is reserved for "there is no usable device" (no
 * driver, no GPU), so the CLI can exit 3 with that message. Streams are created non-blocking so
 * that nothing ever synchronises implicitly with the legacy default stream; ordering events are
 * created with cudaEventDisableTiming (cheaper to record and wait on).
 */
#include <unistd.h>
#include "kernels/cuda/common.cuh"

#include <stdio.h>

namespace ps {

int fail(struct ps_diag *d, cudaError_t e, const char *what)
{
    int code = e == cudaErrorMemoryAllocation ? -ENOMEM
             : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? -ENODEV
             : -EIO;
    return ps_diag_set(d, code, "cuda", "%s: %s (%s)", what, cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

/* The SM count sizes every grid, so it is asked once per device, not once per launch: the
   current device is remembered per thread by set_current (every cudaSetDevice here goes through
   it), and each device's count is cached when first needed (an attribute never changes). */
static thread_local int t_dev = -1;
static int g_sms[256];

int set_current(int dev)
{
    cudaError_t e = cudaSetDevice(dev);
    t_dev = e == cudaSuccess ? dev : -1;
    return (int)e;
}

int sm_count(void)
{
    int dev = t_dev, n = 0;
    if (dev < 0) {
        if (cudaGetDevice(&dev) != cudaSuccess) return 132;
        t_dev = dev;
    }
    if (dev < 256 && (n = __atomic_load_n(&g_sms[dev], __ATOMIC_RELAXED)) > 0) return n;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
        return 132;
    if (dev < 256) __atomic_store_n(&g_sms[dev], n, __ATOMIC_RELAXED);
    return n;
}

unsigned grid_for(size_t count, unsigned block)
{
    size_t blocks = (count + block - 1) / block;
    size_t cap = (size_t)sm_count() * 8;
    if (blocks > cap) blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

} // namespace ps

extern "C" {

bool ps_cuda_built(void) { return true; }

int ps_cuda_probe(int *n_devices, struct ps_diag *d)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (n_devices) *n_devices = 0;
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky status of the failed call */
        /* without any NVIDIA driver the runtime says "CUDA driver version is insufficient",
           which reads as if a driver were there but old: say what is missing instead */
        if (access("/proc/driver/nvidia/version", F_OK) != 0)
            return ps_diag_set(d, -ENODEV, "cuda",
                               "no CUDA device: this machine has no NVIDIA GPU driver "
                               "(/proc/driver/nvidia/version does not exist)");
        return ps_diag_set(d, -ENODEV, "cuda", "no CUDA device: %s", cudaGetErrorString(e));
    }
    if (n <= 0) return ps_diag_set(d, -ENODEV, "cuda", "no CUDA device: none found");
    if (n_devices) *n_devices = n;
    return 0;
}

int ps_cuda_device_info(int dev, char *name, size_t len, double *peak_bw, int *sms,
                        struct ps_diag *d)
{
    cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, dev));
    int clock_khz = 0, bus_bits = 0;
    /* memory clock (kHz) and bus width (bits): peak = 2 (DDR) * clock * bus / 8 */
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess)
        clock_khz = 0;
    if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess)
        bus_bits = 0;
    cudaGetLastError();
    if (peak_bw) *peak_bw = 2.0 * (double)clock_khz * 1e3 * (double)bus_bits / 8.0;
    if (sms) *sms = p.multiProcessorCount;
    if (name && len)
        snprintf(name, len, "%s (sm_%d%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor,
                 p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

int ps_cuda_set_device(int dev, struct ps_diag *d)
{
    CU((cudaError_t)ps::set_current(dev));
    return 0;
}

int ps_cuda_enable_peer(int dev, int peer, bool *ok, struct ps_diag *d)
{
    int can = 0;
    *ok = false;
    if (dev == peer) {
        *ok = true;
        return 0;
    }
    CU(cudaDeviceCanAccessPeer(&can, dev, peer));
    if (!can) return 0;
    CU((cudaError_t)ps::set_current(dev));
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
    } else if (e != cudaSuccess) {
        return ps::fail(d, e, "cudaDeviceEnablePeerAccess");
    }
    *ok = true;
    return 0;
}

int ps_cuda_malloc(void **p, size_t bytes, struct ps_diag *d)
{
    *p = NULL;
    if (bytes == 0) return 0;
    CU(cudaMalloc(p, bytes));
    return 0;
}

void ps_cuda_free(void *p)
{
    if (p) (void)cudaFree(p);
}

int ps_cuda_host_alloc(void **p, size_t bytes, struct ps_diag *d)
{
    *p = NULL;
    if (bytes == 0) return 0;
    CU(cudaMallocHost(p, bytes));
    return 0;
}

void ps_cuda_host_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

int ps_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d)
{
    if (bytes) CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return 0;
}

int ps_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d)
{
    if (bytes) CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return 0;
}

int ps_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, ps_cuda_stream s,
                       struct ps_diag *d)
{
    if (bytes) CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return 0;
}

int ps_cuda_memcpy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes,
                        ps_cuda_stream s, struct ps_diag *d)
{
    if (!bytes) return 0;
    if (dst_dev == src_dev) CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    else CU(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, s));
    return 0;
}

int ps_cuda_memset(void *p, int value, size_t bytes, ps_cuda_stream s, struct ps_diag *d)
{
    if (bytes) CU(cudaMemsetAsync(p, value, bytes, s));
    return 0;
}

int ps_cuda_stream_create(ps_cuda_stream *s, struct ps_diag *d)
{
    *s = NULL;
    CU(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    return 0;
}

void ps_cuda_stream_destroy(ps_cuda_stream s)
{
    if (s) (void)cudaStreamDestroy(s);
}

int ps_cuda_stream_sync(ps_cuda_stream s, struct ps_diag *d)
{
    CU(cudaStreamSynchronize(s));
    return 0;
}

int ps_cuda_event_create(ps_cuda_event *e, bool timing, struct ps_diag *d)
{
    *e = NULL;
    CU(cudaEventCreateWithFlags(e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return 0;
}

void ps_cuda_event_destroy(ps_cuda_event e)
{
    if (e) (void)cudaEventDestroy(e);
}

int ps_cuda_event_record(ps_cuda_event e, ps_cuda_stream s, struct ps_diag *d)
{
    CU(cudaEventRecord(e, s));
    return 0;
}

int ps_cuda_stream_wait(ps_cuda_stream s, ps_cuda_event e, struct ps_diag *d)
{
    CU(cudaStreamWaitEvent(s, e, 0));
    return 0;
}

int ps_cuda_event_sync(ps_cuda_event e, struct ps_diag *d)
{
    CU(cudaEventSynchronize(e));
    return 0;
}

int ps_cuda_event_elapsed_ms(ps_cuda_event a, ps_cuda_event b, float *ms, struct ps_diag *d)
{
    CU(cudaEventElapsedTime(ms, a, b));
    return 0;
}

int ps_cuda_device_sync(struct ps_diag *d)
{
    CU(cudaDeviceSynchronize());
    return 0;
}

int ps_cuda_sync_gpus(const int *gpus, int n, struct ps_diag *d)
{
    int cur = 0;
    CU(cudaGetDevice(&cur));
    for (int k = 0; k < n; k++) {
        CU((cudaError_t)ps::set_current(gpus[k]));
        CU(cudaDeviceSynchronize());
    }
    CU((cudaError_t)ps::set_current(cur));
    return 0;
}

int ps_cuda_check(const char *where, struct ps_diag *d)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ps::fail(d, e, where);
    return 0;
}

} /* extern "C" */
