/* spec: the pipeline spec (src/SPEC.md), parsed and validated into plain structs.
 *
 * The spec is the product's front door. ps_spec_load() reads a JSON file with cJSON, rejects
 * duplicate keys, unknown ops, wrong types and impossible values, and reports the FIRST error
 * as "FILE: json.path: expected X, found Y" in a struct ps_diag. Warnings (for example: the real
 * number of micro-batches differs from `chunks`, torch.chunk semantics) are collected in
 * spec->warnings and printed by the CLI on stderr.
 *
 * Invariants after a successful load:
 *   1. model.n_layers >= 1, every layer has a known op, shapes chain (checked by ps_model_build).
 *   2. pipeline.n_partitions == length of balance, every balance entry >= 1, sum == n_layers.
 *   3. 1 <= chunks <= batch; mb_count (real m) = ceil(batch / ceil(batch / chunks)) <= chunks.
 *   4. device[j] is set for every partition (default "cuda:j"); device_id[j] indexes the
 *      distinct devices in order of first appearance; n_devices distinct devices.
 *   5. relative paths (weights, data, costs) are resolved against the spec file's folder.
 *   6. nothing writes into a spec after it is loaded: overrides make a variant (variant.h).
 */
#ifndef PS_SPEC_H
#define PS_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "src/diag.h"

#define PS_SPEC_MAX_DIMS 3 /* per-sample shape: [F] or [C,H,W] */

enum ps_op {
    PS_OP_LINEAR,
    PS_OP_CONV2D,
    PS_OP_BATCHNORM, /* BatchNorm1d on [F], BatchNorm2d on [C,H,W] */
    PS_OP_RELU,
    PS_OP_DROPOUT,
    PS_OP_MAXPOOL2D,
    PS_OP_FLATTEN,
    PS_OP__COUNT
};

enum ps_loss { PS_LOSS_SUM, PS_LOSS_MSE, PS_LOSS_CROSS_ENTROPY };
/* one value per row of src/schedules.def (the schedule table, schedule.h) */
enum ps_schedule {
#define PS_SCHEDULE_ROW(e, name, ops) PS_SCHED_##e,
#include "src/schedules.def"
#undef PS_SCHEDULE_ROW
    PS_SCHED__COUNT
};
enum ps_checkpoint { PS_CKPT_ALWAYS, PS_CKPT_EXCEPT_LAST, PS_CKPT_NEVER };
enum ps_bn_policy { PS_BN_PLAIN, PS_BN_DEFERRED, PS_BN_GRAD_ONLY };
enum ps_data_source { PS_DATA_SYNTHETIC, PS_DATA_NPY, PS_DATA_CSV };
enum ps_device_kind { PS_DEV_CPU, PS_DEV_CUDA };

struct ps_layer {
    enum ps_op op;
    /* linear: out, bias. conv2d: out, kernel, stride, padding, bias. maxpool2d: kernel, stride
     * (default = kernel), padding. batchnorm: momentum (momentum_null = cumulative average), eps,
     * affine. dropout: p. */
    int64_t out;
    int64_t kernel, stride, padding;
    bool bias;
    double momentum;
    bool momentum_null;
    double eps;
    bool affine;
    double p;
};

struct ps_device {
    enum ps_device_kind kind;
    int index; /* N of "cuda:N"; -1 for cpu */
};

struct ps_spec {
    char *path;     /* the spec file as given */
    char *dir;      /* folder of the spec file, for relative paths */
    int version;    /* "pipescope": 1 */
    char *name;
    int64_t batch;  /* N */

    /* model */
    int n_input_dims;
    int64_t input[PS_SPEC_MAX_DIMS];
    int n_layers;
    struct ps_layer *layers;
    enum ps_loss loss;
    int64_t n_classes; /* informative, from the last layer's output for cross_entropy */
    char *weights;     /* resolved folder, or NULL */

    /* pipeline */
    enum ps_schedule schedule;
    int n_partitions;
    int *balance;                /* layers per partition */
    int *first_layer;            /* first layer index of each partition (derived) */
    struct ps_device *devices;   /* device of each partition */
    int *device_id;              /* distinct-device index of each partition (derived) */
    int n_devices;               /* distinct devices (derived) */
    int chunks;                  /* requested */
    int mb_count;                /* real m (torch.chunk semantics, derived) */
    int64_t *mb_size;            /* size of each real micro-batch (derived) */
    enum ps_checkpoint checkpoint;
    enum ps_bn_policy batchnorm;
    bool phony;
    bool fairscale;              /* pipeline.variant "fairscale": no depend edge on partition 0 */
    int virtual_stages;          /* interleaved 1F1B: model chunks per device (v), default 1 */

    /* data */
    enum ps_data_source data_source;
    uint64_t seed;
    char *data_inputs, *data_targets; /* npy: resolved paths */
    char *data_csv;                   /* csv: resolved path */
    int target_column;                /* csv: column of the label, negative counts from the end */

    /* hardware cost model */
    double dev_flops, dev_mem_bw, dev_launch_us;
    double link_bw, link_latency_us;
    char *costs; /* resolved path or NULL */

    /* train */
    int steps;
    double lr;

    /* warnings, one line each, owned */
    int n_warnings;
    char **warnings;
};

/* Parses and validates. Returns 0 or a negative errno (diag filled). */
int ps_spec_load(const char *path, struct ps_spec **out, struct ps_diag *diag);
/* The same from a string; `name` is used as the file name in error messages and `dir` for paths. */
int ps_spec_parse(const char *json, const char *name, const char *dir, struct ps_spec **out,
                  struct ps_diag *diag);
void ps_spec_destroy(struct ps_spec *spec); /* accepts NULL */

/* Checks a chunks value against this spec (1..batch, the limit) with the message of
 * pipeline.chunks; used by variants (variant.h), which carry every override. 0 or -EINVAL. */
int ps_spec_check_chunks(const struct ps_spec *spec, int chunks, struct ps_diag *diag);
/* torch.chunk semantics: samples per chunk, ceil(batch / chunks), and the real number of
 * micro-batches, ceil(batch / that) (can be fewer than chunks). */
int64_t ps_microbatch_len(int64_t batch, int chunks);
int ps_microbatch_count(int64_t batch, int chunks);

const char *ps_op_name(enum ps_op op);
const char *ps_checkpoint_name(enum ps_checkpoint c);
const char *ps_bn_policy_name(enum ps_bn_policy p);
const char *ps_schedule_name(enum ps_schedule s);
const char *ps_loss_name(enum ps_loss l);
/* "cpu", "cuda:3" */
void ps_device_format(const struct ps_device *d, char *buf, int len);

#endif
