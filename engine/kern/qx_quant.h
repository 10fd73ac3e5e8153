/* The activation quantizer (kern_qx_quantize's contract, kern/kern.h) as one always-inlined C
 * body, compiled by each table's file with its own flags: kern/qdot_ref.c for the portable
 * kern_qx_quantize, kern/avx2.c for its table's qx_quantize, where the compiler vectorizes it
 * 8 wide (the AVX-512 tables' is kern/qx_avx512.c, this arithmetic written out in zmm). Every
 * operation is elementwise IEEE arithmetic (no contraction: -ffp-contract=off), a max (exact in any
 * order) or an integer sum, so every copy writes the same bytes (tests/test_kernels.c compares
 * them). Not a public header. */
#ifndef KVS_ENGINE_KERN_QX_QUANT_H
#define KVS_ENGINE_KERN_QX_QUANT_H

#include "engine/kern/qdot.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* max |x[i]| over i < n, a NaN skipped (x > m ? x : m, which is what maxps does with x first):
 * the portable form; the max of a set is the same in any order, so a table may pass its own
 * vector one (the compilers keep this chain scalar: their max reductions need finite math). */
static inline __attribute__((always_inline)) float kern__qx_amax(const float *x, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

typedef float (*kern__qx_amax_fn)(const float *x, size_t n);

/* One block of n values: d and q as kern_qx_quantize says. Written so that compilers vectorize
 * it (this runs before each product): rounding to nearest even by adding and taking off 1.5 *
 * 2^23, which equals nearbyintf in the default rounding mode for |v| < 2^22 (here |x * id| <=
 * 127.5; the build never reassociates floats, so the pair is not folded away). */
static inline __attribute__((always_inline)) float
kern__qx_block(const float *x, size_t n, int8_t *q, kern__qx_amax_fn amax_of)
{
    float amax = amax_of(x, n);
    /* below 127 / FLT_MAX, 127 / amax would be inf and 0 * inf a NaN: such a block is all
     * zero, as a block of zeros is */
    if (!(amax >= 127.0f / FLT_MAX))
        amax = 0.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (size_t i = 0; i < n; i++) {
        float v = (x[i] * id + 12582912.0f) - 12582912.0f;
        /* x * id may round just past 127: clamp; a NaN (x NaN, or inf times 0 when an inf
         * made id 0) becomes 0, never a float-to-int conversion out of range */
        v = v == v ? v : 0.0f;
        q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
    }
    return amax / 127.0f;
}

/* kern_qx_quantize, the blocks' max |x| by amax_of */
static inline __attribute__((always_inline)) void kern__qx_quantize(kern_qx fmt, const float *x,
                                                                    size_t T, size_t ldx,
                                                                    size_t n_in, void *dst,
                                                                    kern__qx_amax_fn amax_of)
{
    size_t rb = kern_qx_row_bytes(fmt, n_in);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * ldx;
        uint8_t *row = (uint8_t *)dst + t * rb;
        if (fmt == KERN_QX_32) {
            size_t nb = n_in / 32;
            for (size_t b = 0; b < nb; b++) {
                int8_t *q = (int8_t *)(row + KERN_QX32_Q(nb) + 32 * b);
                float d = kern__qx_block(xr + 32 * b, 32, q, amax_of);
                int16_t s = 0;
                for (int k = 0; k < 32; k++)
                    s = (int16_t)(s + q[k]);
                memcpy(row + 4 * b, &d, 4);
                memcpy(row + KERN_QX32_S(nb) + 2 * b, &s, 2);
            }
        } else {
            for (size_t b = 0; b < n_in / 256; b++) {
                kern__qx256 blk;
                blk.d = kern__qx_block(xr + 256 * b, 256, blk.q, amax_of);
                for (int i = 0; i < 16; i++) {
                    int s = 0;
                    for (int k = 0; k < 16; k++)
                        s += blk.q[16 * i + k];
                    blk.bs[i] = (int16_t)s;
                }
                memcpy(row + b * sizeof blk, &blk, sizeof blk);
            }
        }
    }
}

#endif
