/* dconv.c's entry points for conv.c: conv2d forward and stride-1 input gradient as a gathered
 * product (AVX-512). Private to kernels/cpu; the executor sees only kernels.h. */
#ifndef PS_KERNELS_CPU_DCONV_H
#define PS_KERNELS_CPU_DCONV_H

#include "kernels/cpu/kernels.h"

/* True when this machine runs the gathered product for n_out output channels (the AVX-512
 * kernel is selected and n_out >= 8). */
bool ps_cpu_dconv_usable(size_t n_out);
/* y = conv2d(x, w) + b; 0, -ENOMEM, or -EOVERFLOW when a chunk is too large for 32-bit offsets
 * (the caller then takes conv.c's path). cache may be NULL. */
int ps_cpu_dconv_forward(const struct ps_conv2d_shape *s, const float *x, const float *w,
                         const float *b, float *y, struct ps_cpu_convcache *cache);
/* dx (overwritten) of a stride-1 convolution with a square kernel and padding < kernel. */
int ps_cpu_dconv_dx(const struct ps_conv2d_shape *s, const float *w, const float *dy, float *dx,
                    struct ps_cpu_convcache *cache);

/* dw (accumulated, as conv.c) += the weight gradient of dy; -ENOMEM or -EOVERFLOW as above. */
int ps_cpu_dconv_dw(const struct ps_conv2d_shape *s, const float *x, const float *dy, float *dw);

#endif
