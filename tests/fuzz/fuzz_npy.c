/* fuzz_npy: ps_npy_parse on arbitrary bytes, converted to float32 and to int64.
 *
 * Contract checked: a failure leaves the array empty and says why; a success gives ndim in
 * 0..PS_NPY_MAX_DIMS, numel = product of the shape (<= PS_NPY_MAX_NUMEL), data for every
 * element (read back here so ASan sees a short allocation), and int64 results only from files
 * whose values are exact integers.
 */
#include <string.h>

#include "src/diag.h"
#include "tests/fuzz/fuzz.h"
#include "src/npy.h"

static void one(const uint8_t *data, size_t size, enum ps_npy_kind want)
{
    struct ps_npy a;
    struct ps_diag d;
    ps_diag_clear(&d);
    memset(&a, 0xa5, sizeof(a));
    int rc = ps_npy_parse(data, size, "fuzz.npy", want, &a, &d);
    if (rc) {
        FUZZ_CHECK(rc < 0 && d.msg[0] && a.u.data == NULL);
        ps_npy_finish(&a);
        return;
    }
    FUZZ_CHECK(a.ndim >= 0 && a.ndim <= PS_NPY_MAX_DIMS && a.kind == want);
    size_t numel = 1;
    for (int k = 0; k < a.ndim; k++) {
        FUZZ_CHECK(a.shape[k] >= 0);
        numel *= (size_t)a.shape[k];
    }
    FUZZ_CHECK(numel == a.numel && (int64_t)numel <= PS_NPY_MAX_NUMEL);
    FUZZ_CHECK(numel == 0 || a.u.data != NULL);
    volatile double sink = 0;
    for (size_t k = 0; k < numel; k++)
        sink += want == PS_NPY_F32 ? (double)a.u.f32[k] : (double)a.u.i64[k];
    (void)sink;
    ps_npy_finish(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20)) return 0;
    one(data, size, PS_NPY_F32);
    one(data, size, PS_NPY_I64);
    return 0;
}
