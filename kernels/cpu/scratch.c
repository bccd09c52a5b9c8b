/* Per-thread kernel workspace (the executor's M4): sgemm's packing buffers and the gathered
 * convolution's row copies, tiles and index lists.
 *
 * A kernel call used to take its workspace from malloc and give it back before returning. The
 * executor's steps repeat the same calls, yet glibc placed the workspace of each step at higher
 * addresses than the last (other allocations made between calls split the freed space), so every
 * step wrote to pages the process had never touched: on seed1 at chunks 16 with 2 device threads,
 * about 900 page faults a step, nearly all inside the convolution's tile products, and the
 * forward of partition 0 at twice its cost for most micro-batches (measured with
 * `perf record -e page-faults -d`; sim/COSTS.md). Here each thread keeps, per slot, the largest
 * buffer it has asked for: after a thread's first calls, no kernel call allocates.
 *
 * Invariants:
 *  1. ps_cpu_scratch(slot, bytes) returns a 64-byte aligned buffer of at least bytes, private to
 *     the calling thread, whose contents are undefined (a kernel writes before it reads).
 *  2. A slot's buffer stays valid until the same thread asks that slot again or releases; a
 *     kernel never holds a slot across a call to another kernel that uses the same slot.
 *  3. A thread's buffers are freed when it exits (a thread-specific key's destructor) or when it
 *     calls ps_cpu_scratch_release (the main thread, at the end of a run).
 */
#include "kernels/cpu/kernels.h"

#include <pthread.h>
#include <stdlib.h>

struct slot {
    void *p;
    size_t cap;
};

static _Thread_local struct slot tl_slots[PS_CPU_SCRATCH_SLOTS];
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static int exit_key_ok;

static void release(struct slot *s)
{
    for (int k = 0; k < PS_CPU_SCRATCH_SLOTS; k++) {
        free(s[k].p);
        s[k] = (struct slot){0};
    }
}

static void on_exit_thread(void *v) { release(v); }

static void make_key(void) { exit_key_ok = pthread_key_create(&exit_key, on_exit_thread) == 0; }

void *ps_cpu_scratch(enum ps_cpu_scratch_slot slot, size_t bytes)
{
    struct slot *s = &tl_slots[slot];
    bytes = (bytes + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    if (s->p && s->cap >= bytes) return s->p;
    pthread_once(&exit_once, make_key);
    if (exit_key_ok && !pthread_getspecific(exit_key)) pthread_setspecific(exit_key, tl_slots);
    free(s->p);
    s->p = aligned_alloc(64, bytes);
    s->cap = s->p ? bytes : 0;
    return s->p;
}

void ps_cpu_scratch_release(void) { release(tl_slots); }
