/* variant: one configuration of a parsed spec, as an immutable value.
 *
 * A spec is read once and never written afterwards. Everything that sweeps, compares or
 * overrides (sweep's chunks x checkpoint x schedule grid, drift's chunks x BN policy, --no-phony,
 * --optimizer, a later training iteration) makes a struct ps_variant instead: the spec's
 * pipeline settings plus the overrides. Graph building, the engine order, the simulator and the
 * executors read the pipeline settings from the variant their graph was built with (g->var),
 * never from the spec.
 *
 * Invariants of a variant made by ps_variant_from_spec / ps_variant_set_chunks:
 *   V1. 1 <= chunks <= batch, and mb_count = ceil(batch / ceil(batch / chunks)) (torch.chunk
 *       semantics); every micro-batch holds mb_len samples but the last, which holds the rest.
 *   V2. checkpoint_stop (SEMANTICS.md section 5) is computed from the configured chunks, not
 *       from the real m, here and only here (ps_variant_checkpoint_stop).
 *   V3. virtual_stages >= 1.
 */
#ifndef PS_VARIANT_H
#define PS_VARIANT_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/spec.h"

struct ps_variant {
    enum ps_schedule schedule;
    enum ps_checkpoint checkpoint;
    enum ps_bn_policy batchnorm;
    bool phony;        /* depend() edges */
    bool fairscale;    /* no depend() on partition 0 */
    int chunks;        /* configured chunks (checkpoint_stop uses it) */
    int mb_count;      /* real m (V1) */
    int64_t batch;     /* mini-batch N (the spec's; variants do not change it) */
    int64_t mb_len;    /* samples of every micro-batch but the last (V1) */
    int virtual_stages;
    bool optimizer;    /* add an optimizer step per partition after backward */
    int iteration;     /* training iteration in the same process (0 = first): the main thread's
                          sequence counter has moved on by the nodes earlier iterations created,
                          while each forward's fresh worker threads start again at 0 */
};

/* The spec's own configuration (optimizer off, iteration 0). */
void ps_variant_from_spec(const struct ps_spec *spec, struct ps_variant *v);
/* Sets chunks and re-derives mb_count and mb_len; -EINVAL with diag (the spec's message for
 * pipeline.chunks) when chunks is not in 1..batch. v is unchanged on error. */
int ps_variant_set_chunks(struct ps_variant *v, const struct ps_spec *spec, int chunks,
                          struct ps_diag *diag);
/* Samples in micro-batch i (0 <= i < mb_count). */
int64_t ps_variant_mb_size(const struct ps_variant *v, int i);
/* checkpoint_stop of SEMANTICS.md section 5: micro-batches i < stop are checkpointed (V2). */
int ps_variant_checkpoint_stop(const struct ps_variant *v);

#endif
