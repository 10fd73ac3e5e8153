/* The integer path's shared definitions (kern/qdot_ref.c, kern/qdot_avx2*.c, kern/qdot_x8_avx2.c,
 * kern/qdot_avx512*.c): the quantized activation blocks and the fixed float order they all
 * follow. Not a public header: names carry the kern__ prefix.
 *
 * A weight block's product with an activation block is exact integer arithmetic. Nothing depends
 * on other rows, columns or the batch; each product is rounded, then summed (never fused).
 *
 * Every type, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (KERN_QX_32) and the K-quants Q2_K
 * .. Q6_K, IQ4_XS (KERN_QX_256): one float accumulator from 0, block by block:
 *     acc = acc + (d_w * d_x) * (float)S_b
 * S_b the block's exact integer sum (sub-block scales times their raw values' products, less
 * bias * sums of x: Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32; the IQ4 types' and MXFP4's values
 * are their levels, lut[raw], with no bias; MXFP4's d_w is its E8M0 byte's 2^(e - 128)), then
 * for a type with mins
 *     acc = acc + (dm_w * d_x) * (float)M_b
 * each a product, then a sum, the min's term after the scale's. M_b is the K-quants' sub-block
 * mins times the sums of x (dm_w = -dmin), and Q4_1's and Q5_1's block sum of x sx (dm_w = m,
 * w = d q + m). So the AVX2 kernels put 8 weight rows in the 8 lanes of a vector (one output
 * each, no horizontal sum) and add the products of a sub-block's 8 rows in int16 (not Q8_0's)
 * before one madd per sub-block; the AVX-512 ones do the same with 16 rows a zmm (vpdpbusd's
 * exact int32 sums instead for all but Q5_K and Q6_K where the CPU has VNNI), and hand one row of x
 * to the AVX2 kernels. */
#ifndef KVS_ENGINE_KERN_QDOT_H
#define KVS_ENGINE_KERN_QDOT_H

#include "engine/kern/kern.h"

#include <stddef.h>
#include <stdint.h>

#define KERN_GGML_Q4_0 2
#define KERN_GGML_Q4_1 3
#define KERN_GGML_Q5_0 6
#define KERN_GGML_Q5_1 7
#define KERN_GGML_Q8_0 8
#define KERN_GGML_Q2_K 10
#define KERN_GGML_Q3_K 11
#define KERN_GGML_Q4_K 12
#define KERN_GGML_Q5_K 13
#define KERN_GGML_Q6_K 14
#define KERN_GGML_IQ4_NL 20
#define KERN_GGML_IQ4_XS 23
#define KERN_GGML_MXFP4 39

/* A KERN_QX_32 row of nb blocks: the nb float scales d first, then the nb int16 sums of each
 * block's 32 q (Q4_0, Q5_0 take their bias of 8, 16 off through them; Q4_1, Q5_1 their min), then
 * the nb runs of 32 int8 q (38 bytes a block), so that 8 consecutive blocks' scales and sums are
 * one vector load each. */
#define KERN_QX32_S(nb) (4 * (nb))
#define KERN_QX32_Q(nb) (6 * (nb))

/* KERN_QX_256 block; bs[i] = q[16 i] + ... + q[16 i + 15] */
typedef struct kern__qx256 {
    float d;
    int16_t bs[16];
    int8_t q[256];
} kern__qx256;

/* KERN_QUANT_X8 Q4_K (kern/qdot_pack.c): block b of a group of 8 rows (rows 8 g .. 8 g + 7),
 * the groups' nb blocks one after another. qs[c][k] holds, in bytes 4 r .. 4 r + 3, row r's file
 * bytes qs[32 c + 4 k .. 32 c + 4 k + 3] (so the low nibbles of qs[c][0 .. 8) are sub-block 2 c
 * of all 8 rows, the high ones sub-block 2 c + 1, a row's quad per 32-bit lane); sc[j][r],
 * mn[j][r] row r's 6-bit scale and min of sub-block j. 1184 bytes for the file's 8 x 144. */
#define KERN_X8_MAX_IN 65536 /* inputs of the widest matrix given the layout */

typedef struct kern__q4kx8 {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8], mn[8][8];
    uint8_t qs[4][8][32];
} kern__q4kx8;

/* KERN_QUANT_X8 Q5_K: Q4_K's groups, with qh (one run of 32 bytes: bit j of byte l the fifth bit
 * of value 32 j + l) grouped by quads the same way. 1440 bytes for the file's 8 x 176. */
typedef struct kern__q5kx8 {
    uint16_t d[8], dmin[8];
    uint8_t sc[8][8], mn[8][8];
    uint8_t qh[1][8][32];
    uint8_t qs[4][8][32];
} kern__q5kx8;

/* KERN_QUANT_X8 Q6_K: the same grouping of ql (4 runs of 32 bytes) and qh (2 runs) by quads,
 * sc[j][r] row r's int8 scale of 16-value sub-block j. 1680 bytes for the file's 8 x 210. */
typedef struct kern__q6kx8 {
    uint16_t d[8];
    int8_t sc[16][8];
    uint8_t ql[4][8][32], qh[2][8][32];
} kern__q6kx8;

/* KERN_QUANT_X8 Q3_K: qs (2 runs of 32 bytes: bits 2 s of byte l of run h the low bits of value
 * 128 h + 32 s + l) and hmask (1 run: bit 4 h + s of byte l its high bit) grouped by quads as
 * Q6_K's, sc[j][r] row r's 6-bit scale of 16-value sub-block j less 32. 912 bytes for the file's 8
 * x 110. */
typedef struct kern__q3kx8 {
    uint16_t d[8];
    int8_t sc[16][8];
    uint8_t hm[1][8][32], qs[2][8][32];
} kern__q3kx8;

/* KERN_QUANT_X8 Q2_K: qs grouped by quads as Q3_K's, sc[j][r] row r's file byte of sub-block j
 * (its scale in the low nibble, its min in the high one). The file's 8 x 84 bytes. */
typedef struct kern__q2kx8 {
    uint16_t d[8], dmin[8];
    uint8_t sc[16][8];
    uint8_t qs[2][8][32];
} kern__q2kx8;

/* KERN_QUANT_X8 Q4_0: block b of a group of 8 rows, their f16 scales, then qs[k] holding in
 * bytes 4 r .. 4 r + 3 row r's file bytes qs[4 k .. 4 k + 3] (the low nibbles values 4 k .. 4 k + 3
 * of all 8 rows, the high ones values 16 + 4 k ..). 144 bytes, the file's 8 x 18. */
typedef struct kern__q40x8 {
    uint16_t d[8];
    uint8_t qs[4][32];
} kern__q40x8;

/* KERN_QUANT_X8 Q4_1, Q5_0, Q5_1: Q4_0's groups, with the rows' f16 mins m after d (Q4_1, Q5_1)
 * and their fifth bits qh before qs (Q5_0, Q5_1): bit k of byte 4 r + i is row r's fifth bit of
 * the value whose low bits lane r's byte i of w[k] holds (value 4 k + i for k < 4, 16 + 4 (k - 4)
 * + i for the high nibbles), so one shift per k puts it above its nibble. 160, 176 and 192 bytes,
 * the file's 8 x 20, 22 and 24. */
typedef struct kern__q41x8 {
    uint16_t d[8], m[8];
    uint8_t qs[4][32];
} kern__q41x8;

typedef struct kern__q50x8 {
    uint16_t d[8];
    uint8_t qh[32];
    uint8_t qs[4][32];
} kern__q50x8;

typedef struct kern__q51x8 {
    uint16_t d[8], m[8];
    uint8_t qh[32];
    uint8_t qs[4][32];
} kern__q51x8;

/* KERN_QUANT_X8 Q8_0 (a KERN_Q8_0 matrix so packed takes qtype KERN_GGML_Q8_0): Q4_0's groups with
 * 8 runs of quads, qs[k] holding in bytes 4 r .. 4 r + 3 row r's values 4 k .. 4 k + 3. 272 bytes,
 * the file's 8 x 34. */
typedef struct kern__q80x8 {
    uint16_t d[8];
    int8_t qs[8][32];
} kern__q80x8;

/* KERN_QUANT_X8 MXFP4: Q4_0's groups with the rows' E8M0 exponent bytes e in place of the f16
 * scales (the kernels widen them to 2^(e - 128)). 136 bytes, the file's 8 x 17. */
typedef struct kern__mxfp4x8 {
    uint8_t e[8];
    uint8_t qs[4][32];
} kern__mxfp4x8;

/* The level tables the lut column below names: IQ4_NL's (ggml's kvalues_iq4nl), MXFP4's (E2M1's
 * values doubled) */
#define KERN_LUT_IQ4 1
#define KERN_LUT_MXFP4 2

/* The 32-value types' group layouts, spelled once for the packer (kern/qdot_pack.c) and the
 * kernel files: X(qtype, group struct, the file block's bytes, its m's and qh's offsets (0: none),
 * its quads; the group's m's and qh's offsets (0: none); the value bias (Q = nibble - bias), levels
 * looked up (KERN_LUT_IQ4, KERN_LUT_MXFP4; 0: none), signed bytes (Q8_0), an E8M0 scale byte (the
 * file's first, the group's e[8]; MXFP4) rather than an f16). IQ4_NL's and MXFP4's nibbles sit in
 * Q4_0's layout. */
#define KERN_LEG_X8_TYPES(X)                                                                       \
    X(KERN_GGML_Q4_0, kern__q40x8, 18, 0, 0, 4, 0, 0, 8, 0, 0, 0)                                  \
    X(KERN_GGML_IQ4_NL, kern__q40x8, 18, 0, 0, 4, 0, 0, 0, KERN_LUT_IQ4, 0, 0)                     \
    X(KERN_GGML_MXFP4, kern__mxfp4x8, 17, 0, 0, 4, 0, 0, 0, KERN_LUT_MXFP4, 0, 1)                  \
    X(KERN_GGML_Q4_1, kern__q41x8, 20, 2, 0, 4, offsetof(kern__q41x8, m), 0, 0, 0, 0, 0)           \
    X(KERN_GGML_Q5_0, kern__q50x8, 22, 0, 2, 4, 0, offsetof(kern__q50x8, qh), 16, 0, 0, 0)         \
    X(KERN_GGML_Q5_1, kern__q51x8, 24, 2, 4, 4, offsetof(kern__q51x8, m),                          \
      offsetof(kern__q51x8, qh), 0, 0, 0, 0)                                                       \
    X(KERN_GGML_Q8_0, kern__q80x8, 34, 0, 0, 8, 0, 0, 0, 0, 1, 0)

/* KERN_QUANT_X8 IQ4_XS: the rows' f16 d, sc[j][r] row r's scale of 32-value sub-block j (its 6
 * bits less 32), then each sub-block as a Q4_0 block of the group: qs[j][k] holding in bytes
 * 4 r .. 4 r + 3 row r's file bytes qs[16 j + 4 k .. 16 j + 4 k + 3] (the low nibbles values 4 k ..
 * of the sub-block, the high ones 16 + 4 k ..). 1104 bytes for the file's 8 x 136. */
typedef struct kern__iq4xsx8 {
    uint16_t d[8];
    int8_t sc[8][8];
    uint8_t qs[8][4][32];
} kern__iq4xsx8;

/* Row n of a KERN_QUANT_X8 matrix as the file's blocks (n_in / 256 * 84, 110, 136, 144, 176 or 210
 * bytes, or n_in / 32 * 18, 20, 22, 24 or 34 at row), bit for bit: what the portable product reads.
 */
void kern__x8_row(const kern_mat *w, size_t n, uint8_t *row);

/* The AVX2 qmatmul (kern/qdot_avx2.c and its types' files, built only where the compiler has AVX2
 * flags). */
void kern__qmatmul_avx2(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                        size_t n0, size_t n1);

/* The same built with AVX-512 VL and VNNI (KERN_HAVE_QDOT_VNNI): kern__qmatmul_avx512's
 * one-row products on CPUs with VNNI. */
void kern__qmatmul_avx2_vnni(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                             size_t n0, size_t n1);

/* KERN_QUANT_X8's AVX2 products (kern/qdot_x8_avx2.c), and the same file built with AVX-512 VL
 * and VNNI (KERN_HAVE_QDOT_VNNI); kern__qmatmul_avx2 and kern__qmatmul_avx512 hand them every
 * interleaved matrix. */
void kern__qmatmul_x8_avx2(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                           size_t n0, size_t n1);
void kern__qmatmul_x8_avx2_vnni(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                                size_t n0, size_t n1);
/* Rows of x up to which kern__qmatmul_avx512 may hand an interleaved matrix to the VNNI build
 * of the AVX2 products rather than to the two-group zmm ones (a decode step of a few sequences;
 * kern/qdot_avx512.c's few_rows_ymm says how many for each type): the zmm kernels unpack a
 * weight block once for 16 rows, at a cost a few rows do not pay back (one Zen 5 core streaming
 * 64 matrices of 2048 x 2048, Q4_K at 2 rows took 1.65x the time of one row). The ymm kernels
 * are unrolled for each row count up to this, so that each row's sums stay in registers. */
#define KERN_X8_FEW_ROWS 4

/* KERN_QUANT_X8's AVX-512 products from two rows of x on (kern/qdot_x8_avx512.c: two groups a
 * zmm), built with VNNI too (KERN_HAVE_QDOT_VNNI), and over simde for the tests;
 * kern__qmatmul_avx512 hands them every interleaved matrix with T > 1, but where the CPU has
 * VNNI most types only from a few rows on (KERN_X8_FEW_ROWS above). */
void kern__qmatmul_x8_avx512(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                             size_t n0, size_t n1);
void kern__qmatmul_x8_avx512_vnni(const kern_mat *w, const void *xq, size_t T, float *out,
                                  size_t ldo, size_t n0, size_t n1);
void kern__qmatmul_x8_avx512_emu(const kern_mat *w, const void *xq, size_t T, float *out,
                                 size_t ldo, size_t n0, size_t n1);

/* kern/qx_avx512.c: kern_qx_quantize's bytes in zmm, the AVX-512 tables' qx_quantize (and its
 * copy over simde for the tests) */
void kern__qx_quantize_avx512(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in,
                              void *dst);
void kern__qx_quantize_avx512_emu(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in,
                                  void *dst);

/* kern/qdot_amx.c: whether the CPU has AMX-INT8 and this process may use it (asked once), the
 * KERN_QUANT_X8 types it has tiles for, and their tile products for rows t < T16 of xq (a
 * multiple of 16): the bits of kern__qmatmul_x8_avx512_vnni. */
int kern__amx_ready(void);
int kern__amx_takes(const kern_mat *w); /* the types it has tiles for */
void kern__qmatmul_x8_amx(const kern_mat *w, const void *xq, size_t T16, float *out, size_t ldo,
                          size_t n0, size_t n1);

/* The AVX-512 qmatmul (kern/qdot_avx512.c and its types' files, AVX-512 F/BW/VL/DQ), and its copy
 * over simde for the tests (kern/avx512_isa.h); both hand the tiles they do not cover to
 * kern__qmatmul_avx2. */
void kern__qmatmul_avx512(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                          size_t n0, size_t n1);
void kern__qmatmul_avx512_emu(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                              size_t n0, size_t n1);
/* kern__qmatmul_avx512 with one row of the 32-value types on a zmm stream, for AMD Zen 5
 * (kern_avx512_cvt_ops). The same bits. */
void kern__qmatmul_avx512_leg(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                              size_t n0, size_t n1);
/* kern__qmatmul_avx512 for CPUs that run AVX-512 as two 256-bit halves (kern_avx512_halves_ops):
 * one row of Q2_K and Q3_K on the ymm kernel, the rest as there. The same bits. */
void kern__qmatmul_avx512_halves(const kern_mat *w, const void *xq, size_t T, float *out,
                                 size_t ldo, size_t n0, size_t n1);

#endif
