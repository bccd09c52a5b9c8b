/* data: the training samples a `run` consumes (src/SPEC.md, "data").
 *
 * Sources:
 *   synthetic  seeded and reproducible: input elements N(0,1) (Box-Muller over a splitmix64
 *              counter generator keyed by (seed, sample, element)); cross_entropy labels uniform
 *              in [0, classes); mse targets N(0,1) rows; sum needs no targets.
 *   npy        inputs [S, ...input] (float), targets [S] integer labels (cross_entropy) or
 *              [S, ...output] rows (mse).
 *   csv        a .csv or .csv.gz file (read through zlib, which handles both), one sample per
 *              row; target_column (negative counts from the end) is the label or target value,
 *              every other column is a feature and their count must equal the input's numel.
 *              A first line with a field that is not a number is a header and skipped.
 * Step s uses samples s*batch .. s*batch + batch - 1, wrapping around modulo S.
 * Validation: NaN/Inf anywhere, labels that are not integers in [0, classes), and shape
 * mismatches are errors naming the file (and the row for csv).
 */
#ifndef PS_DATA_H
#define PS_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"
#include "src/model.h"
#include "src/spec.h"

enum ps_target_kind { PS_TARGET_NONE, PS_TARGET_LABELS, PS_TARGET_ROWS };

struct ps_data {
    int64_t n_samples;     /* S */
    int64_t in_numel;      /* per sample */
    float *x;              /* [S, in_numel]; NULL for synthetic data (drawn by ps_data_rows) */
    enum ps_target_kind target;
    int64_t classes;       /* labels: valid range [0, classes) */
    int64_t *labels;       /* [S] */
    int64_t out_numel;     /* rows: per sample */
    float *rows;           /* [S, out_numel]; NULL for synthetic data */
    bool synthetic;        /* x and rows are drawn when asked for, from seed: a run of many
                              steps holds one mini-batch of them, not every step's */
    uint64_t seed;
};

/* Loads or generates the data of a spec; synthetic data gets `synthetic_samples` samples
 * (e.g. batch * steps). Returns 0 or a negative errno with diag. */
int ps_data_load(const struct ps_spec *spec, const struct ps_model *model,
                 int64_t synthetic_samples, struct ps_data *out, struct ps_diag *d);
/* Copies samples first .. first + count - 1 (wrapping) into x [count, in_numel] and labels
 * [count] or rows [count, out_numel] (any may be NULL: not wanted, or not of this target kind). */
void ps_data_rows(const struct ps_data *dt, int64_t first, int64_t count, float *x,
                  int64_t *labels, float *rows);
/* The mini-batch of step `step`: samples step * batch .. (ps_data_rows). */
void ps_data_batch(const struct ps_data *dt, int64_t step, int64_t batch, float *x,
                   int64_t *labels, float *rows);
void ps_data_finish(struct ps_data *dt); /* accepts a zeroed struct */

#endif
