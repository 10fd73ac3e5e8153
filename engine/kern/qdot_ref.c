/* The portable integer path: activations quantized per row (kern_qx_quantize) and the product of
 * a file's rows with them in the order kern/qdot.h defines, the oracle every table's qmatmul
 * equals bit for bit. Weight blocks are read through kern/quant.h's decoders (the unified
 * d, dm, sc, mi, raw form), so this file knows no bit layout of its own. */
#include "engine/kern/qdot.h"

#include "engine/dtype.h"
#include "engine/kern/quant.h"
#include "engine/kern/qx_quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

kern_qx kern_qdot_act(const kern_mat *w)
{
    if (w->type == KERN_Q8_0)
        return KERN_QX_32;
    if (w->type != KERN_QUANT && w->type != KERN_QUANT_X8)
        return KERN_QX_NONE;
    switch (w->qtype) {
    case KERN_GGML_Q8_0: /* a KERN_QUANT_X8 copy of KERN_Q8_0 rows */
    case KERN_GGML_Q4_0:
    case KERN_GGML_Q4_1:
    case KERN_GGML_Q5_0:
    case KERN_GGML_Q5_1:
    case KERN_GGML_IQ4_NL:
    case KERN_GGML_MXFP4: return KERN_QX_32;
    case KERN_GGML_Q2_K:
    case KERN_GGML_Q3_K:
    case KERN_GGML_Q4_K:
    case KERN_GGML_Q5_K:
    case KERN_GGML_Q6_K:
    case KERN_GGML_IQ4_XS: return KERN_QX_256;
    default: return KERN_QX_NONE;
    }
}

size_t kern_qx_row_bytes(kern_qx fmt, size_t n_in)
{
    if (fmt == KERN_QX_32)
        return n_in / 32 * 38;
    if (fmt == KERN_QX_256)
        return n_in / 256 * sizeof(kern__qx256);
    return 0;
}

void kern_qx_quantize(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in, void *dst)
{
    kern__qx_quantize(fmt, x, T, ldx, n_in, dst, kern__qx_amax);
}

/* One row of Q8_0 blocks times one quantized row (kern/qdot.h's KERN_QX_32 layout): one
 * accumulator, block by block. */
static float dot_q8_0(const uint8_t *row, size_t nb, const uint8_t *xr)
{
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        const int8_t *xq = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
        /* read as int8_t, not cast from uint8_t per value: Debian's GCC 12 with VNNI enabled
         * (-march=native on Zen 4/5, Sapphire Rapids) vectorizes sum += (int8_t)u8 * s8 into
         * vpdpbusd, which takes the weights as unsigned (wrong sums; meson.build probes for it) */
        const int8_t *wq = (const int8_t *)(blk + 2);
        int32_t sum = 0;
        for (int k = 0; k < 32; k++)
            sum += wq[k] * xq[k];
        float dx;
        memcpy(&dx, xr + 4 * b, 4);
        float p = (dtype_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) * dx) * (float)sum;
        acc = acc + p;
    }
    return acc;
}

/* One row of Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or MXFP4 blocks times one quantized row: one
 * accumulator, block by block; Q = raw - bias, the bias taken off through the block's sum of x
 * (IQ4_NL, MXFP4: Q = lut[raw]; MXFP4's d its bf16), then for Q4_1 / Q5_1 the min's term m * sx
 * (kern/qdot.h). */
static float dot32(const kern_mat *w, const uint8_t *row, const uint8_t *xr)
{
    const kern_qfmt *f = kern__qfmt(w->qtype);
    size_t nb = w->n_in / 32;
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const int8_t *xq = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
        kern_qblock qb;
        f->decode(row + b * f->file_bytes, &qb);
        int32_t sum = 0;
        for (int k = 0; k < 32; k++)
            sum += (f->lut ? f->lut[qb.raw[k]] : qb.raw[k]) * xq[k];
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        sum -= f->bias * sx;
        float p = (kern__q_d(f, qb.d) * dx) * (float)sum;
        acc = acc + p;
        if (f->has_min) {
            float pm = (dtype_f16_to_f32(qb.dm) * dx) * (float)sx;
            acc = acc + pm;
        }
    }
    return acc;
}

/* One row of a K-quant or IQ4_XS (sub-blocks of 16 or 32) times one quantized row, one
 * accumulator, block by block: the block's exact integer sum of the values' products (raw, or
 * IQ4_XS's lut[raw]) times their sub-block scales, less the bias (Q = raw - bias) through the
 * sums of 16 activations bs, then the mins' sum through bs (kern/qdot.h). */
static float dot256(const kern_mat *w, const uint8_t *row, const kern__qx256 *xq)
{
    const kern_qfmt *f = kern__qfmt(w->qtype);
    float acc = 0.0f;
    for (size_t b = 0; b < w->n_in / 256; b++) {
        kern_qblock qb;
        memset(&qb, 0, sizeof qb);
        f->decode(row + b * f->file_bytes, &qb);
        const kern__qx256 *x = &xq[b];
        int32_t S = 0, M = 0;
        for (int j = 0; j < 256 / f->sub; j++) {
            int32_t s = 0;
            for (int i = f->sub * j; i < f->sub * (j + 1); i++)
                s += (f->lut ? f->lut[qb.raw[i]] : qb.raw[i]) * x->q[i];
            S += qb.sc[j] * s;
        }
        for (int g = 0; g < 16; g++) {
            S -= f->bias * qb.sc[16 * g / f->sub] * x->bs[g];
            M += qb.mi[16 * g / f->sub] * x->bs[g];
        }
        float p = (dtype_f16_to_f32(qb.d) * x->d) * (float)S;
        acc = acc + p;
        if (f->has_min) {
            float pm = (dtype_f16_to_f32(qb.dm) * x->d) * (float)M;
            acc = acc + pm;
        }
    }
    return acc;
}

void kern_qmatmul_ref(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                      size_t n0, size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    size_t xb = kern_qx_row_bytes(fmt, w->n_in);
    if (w->type == KERN_QUANT_X8) { /* the file's rows back, one at a time, then as below */
        uint8_t row[KERN_X8_MAX_IN / 32 * 34]; /* 68 KiB at most (kern_qdot_x8_bytes): Q8_0's */
        for (size_t n = n0; n < n1; n++) {
            kern__x8_row(w, n, row);
            for (size_t t = 0; t < T; t++) {
                const uint8_t *xr = (const uint8_t *)xq + t * xb;
                out[t * ldo + n] = w->qtype == KERN_GGML_Q8_0 ? dot_q8_0(row, w->n_in / 32, xr)
                                   : fmt == KERN_QX_32
                                       ? dot32(w, row, xr)
                                       : dot256(w, row, (const kern__qx256 *)(const void *)xr);
            }
        }
        return;
    }
    for (size_t t = 0; t < T; t++) {
        const void *xr = (const uint8_t *)xq + t * xb;
        for (size_t n = n0; n < n1; n++) {
            const uint8_t *row = (const uint8_t *)w->data + n * w->row_bytes;
            out[t * ldo + n] = fmt == KERN_QX_256     ? dot256(w, row, xr)
                               : w->type == KERN_Q8_0 ? dot_q8_0(row, w->n_in / 32, xr)
                                                      : dot32(w, row, xr);
        }
    }
}
