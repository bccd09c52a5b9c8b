/* variant: the spec's pipeline settings plus overrides, as a value (variant.h). The micro-batch
 * split follows torch.chunk: ceil(batch / chunks) samples per chunk, so fewer than `chunks`
 * micro-batches can come out (V1); spec.c derives the spec's own split with the same helpers.
 */
#include "src/variant.h"

#include <string.h>

void ps_variant_from_spec(const struct ps_spec *spec, struct ps_variant *v)
{
    memset(v, 0, sizeof(*v));
    v->schedule = spec->schedule;
    v->checkpoint = spec->checkpoint;
    v->batchnorm = spec->batchnorm;
    v->phony = spec->phony;
    v->fairscale = spec->fairscale;
    v->batch = spec->batch;
    v->chunks = spec->chunks;
    v->mb_len = ps_microbatch_len(spec->batch, spec->chunks);
    v->mb_count = ps_microbatch_count(spec->batch, spec->chunks);
    v->virtual_stages = spec->virtual_stages > 0 ? spec->virtual_stages : 1;
    v->optimizer = false;
    v->iteration = 0;
}

int ps_variant_set_chunks(struct ps_variant *v, const struct ps_spec *spec, int chunks,
                          struct ps_diag *diag)
{
    int rc = ps_spec_check_chunks(spec, chunks, diag);
    if (rc) return rc;
    v->chunks = chunks;
    v->mb_len = ps_microbatch_len(v->batch, chunks);
    v->mb_count = ps_microbatch_count(v->batch, chunks);
    return 0;
}

int64_t ps_variant_mb_size(const struct ps_variant *v, int i)
{
    return i + 1 < v->mb_count ? v->mb_len : v->batch - v->mb_len * (v->mb_count - 1);
}

int ps_variant_checkpoint_stop(const struct ps_variant *v)
{
    switch (v->checkpoint) {
    case PS_CKPT_ALWAYS: return v->chunks;
    case PS_CKPT_EXCEPT_LAST: return v->chunks - 1;
    case PS_CKPT_NEVER: return 0;
    }
    return 0;
}
