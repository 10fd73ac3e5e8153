/* The block-quantized weight types' panel layout, shared by kern/quant_pack.c (packing, row
 * widening), kern/quant_ref.c and kern/quant_avx2.c (products). Not a public header: names carry
 * the kern__ prefix.
 *
 * Every supported type's weight is one formula over small integers and f16 scales, each type
 * being a choice of fields (struct kern_qfmt):
 *     S = f16(d) * sc         (sc = 1 without sub-block scales: Q4_0 .. Q5_1, IQ4_NL, MXFP4;
 *                              MXFP4's d is a bf16, its E8M0 byte's 2^(e - 128), exact)
 *     M = f16(dm) * mi        (mi = 1 without sub-block scales; M = -0 for types without a min)
 *     w = S * Q + M           Q = lut[raw] (IQ4) or raw - bias, raw = lo | hi << lo_bits
 * dm is stored negated for the K-quants (their value is S * q - dmin * m), so the sum is always
 * "+ M". S * Q is exact in float32 for every type (at most 24 significant bits, see
 * docs/ARCHITECTURE.md), so the one rounding is the final add, and a fused multiply-add gives the
 * same bits as the two operations of the reference dequantizer: w is the value of
 * engine/dtype's to_f32, bit for bit (tests/test_kernels.c checks every type).
 *
 * A panel (KERN_PANEL = 16 rows) of n_in inputs is n_in / sb super-blocks of psb bytes:
 *     d[16] f16 | dm[16] f16 (has_min) | sc[n_sub][16] int8 (has_sc) | mi[n_sub][16] u8
 *     (has_sc && has_min) | lo plane | hi plane
 * The planes hold raw for the k-major array T[k * 16 + c] (input k of the super-block, row c),
 * laid out so that one 32-byte load expands with shifts and masks alone:
 *     lo_bits 4: byte 32 m + t holds T[64 m + t] (low nibble) and T[64 m + 32 + t] (high)
 *     lo_bits 2 and hi_bits 2: byte 32 m + t holds T[128 m + 32 s + t] at bits 2 s, 2 s + 1
 *     hi_bits 1: byte 32 m + t holds T[256 m + 32 s + t] at bit s
 * Per row that is exactly the file's bytes for Q4_0 .. Q5_1, IQ4_NL and Q6_K, and 4 bytes (Q3_K,
 * Q4_K, Q5_K), 2 (IQ4_XS) or 16 (Q2_K, whose scale nibbles become bytes) more per super-block, 1
 * more per block for MXFP4 (its exponent byte as a bf16 d). */
#ifndef KVS_ENGINE_KERN_QUANT_H
#define KVS_ENGINE_KERN_QUANT_H

#include "engine/dtype.h"
#include "engine/kern/kern.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One row's block in the unified form: d, dm as f16 bits (dm already negated where the type
 * subtracts), the sub-block scales and mins, and raw (unbiased) quants of every value. */
typedef struct kern_qblock {
    uint16_t d, dm;
    int8_t sc[16];
    uint8_t mi[16];
    uint8_t raw[256];
} kern_qblock;

typedef struct kern_qfmt {
    uint32_t id;         /* ggml type id */
    uint16_t sb;         /* values per (super-)block: 32 or 256 */
    uint16_t sub;        /* values per sub-block sharing sc / mi (sb without sub-block scales) */
    uint16_t file_bytes; /* bytes per block in the file */
    uint8_t lo_bits;     /* 2 or 4 */
    uint8_t hi_bits;     /* 0, 1 or 2 */
    uint8_t bias;        /* Q = raw - bias (without lut) */
    bool has_sc, has_min;
    bool d_bf16;       /* d is a bf16 (MXFP4: its E8M0 scale widened), not an f16 */
    const int8_t *lut; /* Q = lut[raw] (IQ4, MXFP4), or NULL */
    void (*decode)(const uint8_t *blk, kern_qblock *out);
} kern_qfmt;

/* The format of ggml type id, or NULL if kvserve has no kernels for it. */
const kern_qfmt *kern__qfmt(uint32_t id);

/* The value of a block's d bits (kern_qblock.d, a panel's d[16]) in format f. */
static inline float kern__q_d(const kern_qfmt *f, uint16_t d)
{
    return f->d_bf16 ? dtype_bf16_to_f32(d) : dtype_f16_to_f32(d);
}

/* Byte offsets inside one panel super-block (all rows). */
typedef struct kern_qoff {
    size_t dm, sc, mi, lo, hi, psb;
} kern_qoff;

static inline kern_qoff kern__qoff(const kern_qfmt *f)
{
    kern_qoff o;
    size_t n_sub = f->has_sc ? f->sb / f->sub : 0;
    o.dm = 2 * KERN_PANEL;
    o.sc = o.dm + (f->has_min ? 2 * KERN_PANEL : 0);
    o.mi = o.sc + n_sub * KERN_PANEL;
    o.lo = o.mi + (f->has_min ? n_sub * KERN_PANEL : 0);
    o.hi = o.lo + (size_t)f->sb * KERN_PANEL * f->lo_bits / 8;
    o.psb = o.hi + (size_t)f->sb * KERN_PANEL * f->hi_bits / 8;
    return o;
}

/* The int8 Q of one panel super-block (sb * 16 values, k-major T) from its planes: the portable
 * expansion, which the vector one must equal. */
void kern__q_expand_ref(const kern_qfmt *f, const uint8_t *psb, int8_t *T);

/* kern_mat_to_panels and kern_rows_to_f32 for the quantized types (panel.c calls them). */
void kern__quant_pack(const kern_mat *src, void *dst, kern_mat *out);
void kern__quant_rows(const kern_mat *m, size_t r0, size_t nr, float *dst);

/* Portable product over a KERN_QUANT_PANEL matrix (ref.c's matmul contract and bits). */
void kern__quant_matmul_ref(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                            size_t ldo, size_t n0, size_t n1);
/* Super-block b of panel p of a KERN_QUANT_PANEL matrix widened to F32 ([sb][16]): exact. */
void kern__quant_widen_sb(const kern_mat *m, size_t p, size_t b, float *dst);
/* The AVX2 product (kern/quant_avx2.c, built only where the compiler has AVX2 flags). */
void kern__quant_matmul_avx2(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                             size_t ldo, size_t n0, size_t n1, float *scratch);
/* The AVX-512 product (kern/quant_avx512.c) and its simde-emulated copy, built for the tests only
 * (kern/avx512_isa.h). */
void kern__quant_matmul_avx512(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                               size_t ldo, size_t n0, size_t n1, float *scratch);
void kern__quant_matmul_avx512_emu(const kern_mat *m, const float *x, size_t T, size_t ldx,
                                   float *out, size_t ldo, size_t n0, size_t n1, float *scratch);

#endif
