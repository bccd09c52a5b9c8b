/* trace_names: the names frameworks give pipeline work in the profiler, and the graph task each
 * one stands for.
 *
 *   convention   range name        source                                          graph task
 *   pipescope    F(i,j) B(i,j)     examples/PROFILER.md, pipescope's own traces     the same name
 *                R(i,j) Wg(i,j)
 *   pytorch      PP:<s>F<i>        torch.distributed.pipelining: every action of    F(i,s)
 *                PP:<s>I<i>        a schedule runs inside                           B(i,s) (input grad;
 *                                  record_function(_get_profiler_function_name(a))    needs a split backward)
 *                PP:<s>W<i>        = "PP:" + str(_Action), str = stage index,       Wg(i,s)
 *                PP:<s>B<i>        computation type, micro-batch index              B(i,s) (full backward)
 *                PP:<s>SEND_F<i>   (schedules.py); communication and FSDP actions   not a task: counted
 *                RECV_F, SEND_B,   (SEND/RECV, UNSHARD, RESHARD, REDUCE_GRAD,
 *                ... OVERLAP_F_B   OVERLAP_F_B) are profiled the same way
 *   fairscale    chunk<i>-part<j>  fairscale.nn.pipe.pipeline: the partition call   1st range: F(i,j)
 *                                  of task (i, j) runs inside                       2nd range: R(i,j)
 *                                  record_function("chunk%d-part%d"); for a
 *                                  checkpointed task the same function runs again
 *                                  at recompute (Recompute.backward)
 *
 * A PyTorch stage index s is pipescope's partition s: both number stages along the model, and
 * both place stage s of an interleaved schedule on device s mod D as virtual stage s div D
 * (pipeline.devices, pipeline.virtual_stages), so the stage names its partition, device and
 * virtual stage through the spec.
 */
#ifndef PS_TRACE_NAMES_H
#define PS_TRACE_NAMES_H

#include <stdbool.h>
#include <stdint.h>

enum ps_tname_conv {
    PS_TN_NONE,       /* not a pipeline name */
    PS_TN_PIPESCOPE,  /* F(i,j) ... */
    PS_TN_PP,         /* PyTorch pipelining compute action */
    PS_TN_PP_OTHER,   /* PyTorch pipelining communication / sharding / combined action */
    PS_TN_FAIRSCALE,  /* chunk<i>-part<j> */
};

struct ps_tname {
    enum ps_tname_conv conv;
    char kind;        /* F, B, R, W (weight gradient), I (input gradient); 0 for PP_OTHER */
    int32_t mb, part; /* micro-batch and partition (PyTorch: stage); -1 when absent */
};

/* Parses a range name (blanks inside pipescope's parentheses ignored). Numbers above 10^8 are
 * not recognised. Returns out->conv != PS_TN_NONE. */
bool ps_tname_parse(const char *name, struct ps_tname *out);
const char *ps_tname_conv_name(enum ps_tname_conv c); /* "pipescope", "pytorch", "fairscale" */

#endif
