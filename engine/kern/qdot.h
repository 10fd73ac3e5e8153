/* The integer path's shared definitions (kern/qdot_ref.c, kern/qdot_avx2.c): the quantized
 * activation blocks and the fixed float order both files follow. Not a public header: names
 * carry the kern__ prefix.
 *
 * A weight block's product with an activation block is exact integer arithmetic. Every output
 * is summed in 8 float accumulators acc[0..7], starting at 0, in block order, each step a
 * product then a sum (never fused); last the 8 are summed as kern__qx_hsum does. Nothing
 * depends on other rows, columns or the batch.
 *
 * Q4_0, Q8_0 (KERN_QX_32): block b's whole integer sum S_b of 32 products goes to one
 * accumulator, acc[b % 8] = acc[b % 8] + (d_w * d_x) * (float)S_b, so that AVX2 folds 8 blocks
 * with one vector multiply and add (a fold per block took as many instructions as its products).
 *
 * K-quants (KERN_QX_256): split into 8 int32 lanes as AVX2's maddubs + madd leave it: lane m
 * holds input 4m .. 4m + 3 of each run of 32 inputs (times the sub-block scale of those inputs).
 * Per block and lane:  acc[m] = acc[m] + (d_w * d_x) * (float)lane[m], and for a type with mins
 * acc[m] = acc[m] + (dm_w * d_x) * (float)mlane[m]. */
#ifndef KVS_ENGINE_KERN_QDOT_H
#define KVS_ENGINE_KERN_QDOT_H

#include "engine/kern/kern.h"

#include <stdint.h>

#define KERN_GGML_Q4_0 2
#define KERN_GGML_Q8_0 8
#define KERN_GGML_Q4_K 12
#define KERN_GGML_Q5_K 13
#define KERN_GGML_Q6_K 14

/* A KERN_QX_32 row of nb blocks: the nb float scales d first, then the nb int16 sums of each
 * block's 32 q (Q4_0 takes its bias of 8 off through them), then the nb runs of 32 int8 q (38
 * bytes a block), so that 8 consecutive blocks' scales and sums are one vector load each. */
#define KERN_QX32_S(nb) (4 * (nb))
#define KERN_QX32_Q(nb) (6 * (nb))

/* KERN_QX_256 block; bs[i] = q[16 i] + ... + q[16 i + 15] */
typedef struct kern__qx256 {
    float d;
    int16_t bs[16];
    int8_t q[256];
} kern__qx256;

/* The 8 lanes summed: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), AVX2's fold of the
 * high half onto the low one, then of the high pair, then of the odd lane. */
static inline float kern__qx_hsum(const float a[8])
{
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    float u0 = s0 + s2, u1 = s1 + s3;
    return u0 + u1;
}

/* The AVX2 qmatmul (kern/qdot_avx2.c, built only where the compiler has AVX2 flags). */
void kern__qmatmul_avx2(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                        size_t n0, size_t n1);

#endif
