/* npy: NumPy .npy arrays in and out (format versions 1.0 and 2.0, little-endian, C order).
 *
 * Readable dtypes: '<f4' '<f8' '<i4' '<i8' '|u1' '|b1' (and '|i1'), converted on load to what the
 * caller asks for: float32, or int64 (float files only when every value is an exact integer).
 * Written: version 1.0, '<f4' or '<i8', so numpy.load / torch.from_numpy read them back.
 * Every failure fills the ps_diag with where = the path as given and one line saying what was
 * expected and what was found.
 */
#ifndef PS_NPY_H
#define PS_NPY_H

#include <stddef.h>
#include <stdint.h>

struct ps_diag;

#define PS_NPY_MAX_DIMS 8
#define PS_NPY_MAX_NUMEL ((int64_t)1 << 31) /* more elements than this is an absurd shape */

enum ps_npy_kind { PS_NPY_F32, PS_NPY_I64 };

struct ps_npy {
    int ndim;                      /* 0 for a scalar (numel 1) */
    int64_t shape[PS_NPY_MAX_DIMS];
    size_t numel;
    char descr[8];                 /* dtype in the file, e.g. "<f8" */
    enum ps_npy_kind kind;         /* what `data` holds */
    union {
        float *f32;
        int64_t *i64;
        void *data;
    } u;
};

/* Loads `path`, converting the elements to `want`. On success *out owns its data (free with
 * ps_npy_finish); on failure *out is empty. Returns 0, -EINVAL (bad content), -ENOMEM, or the
 * negative errno of open/read. */
int ps_npy_load(const char *path, enum ps_npy_kind want, struct ps_npy *out, struct ps_diag *d);
/* The same from a buffer; `where` names it in errors. */
int ps_npy_parse(const void *buf, size_t len, const char *where, enum ps_npy_kind want,
                 struct ps_npy *out, struct ps_diag *d);
/* Frees the data and empties *a; accepts NULL. */
void ps_npy_finish(struct ps_npy *a);

/* Writes a version 1.0 file: '<f4' from floats, '<i8' from int64 (e.g. num_batches_tracked,
 * ndim 0 for a scalar). */
int ps_npy_save_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                    struct ps_diag *d);
int ps_npy_save_i64(const char *path, const int64_t *data, int ndim, const int64_t *shape,
                    struct ps_diag *d);

#endif
