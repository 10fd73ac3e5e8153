/* The AVX2 integer products over the file's rows (kern/qdot.h): the pieces every type's file
 * shares (kern/qdot_avx2_legacy.c: Q8_0, Q4_0 .. Q5_1; kern/qdot_avx2_k.c: Q2_K .. Q6_K;
 * kern/qdot_avx2_iq4.c: IQ4_NL, IQ4_XS, MXFP4) and the loop over rows of x and groups of 8 weight
 * rows (QROWS8_DEFINE) that each type's entry point is; kern/qdot_avx2.c picks the entry by type.
 *
 * Every type takes 8 weight rows at a time, one per 32-bit lane: per block, each row's values
 * are unpacked with shifts and masks and the 8 rows transposed (an 8 x 8 transpose of 4-value
 * groups), so that lane r of vector k holds values 4k .. 4k + 3 of row r. Four activations
 * broadcast to every lane then meet all 8 rows in one maddubs (u8 x s8 pairs into s16), a
 * sub-block's maddubs are added in int16 (no sum can overflow: |8 * 2 * 15 * 127|,
 * |4 * 2 * 31 * 127| and |2 * 2 * 63 * 127| are below 2^15 for the 4-, 5- and 6-bit values; the
 * 2- and 3-bit ones add a 16-value sub-block's 4), and one madd with the rows' sub-block scales
 * gives each row's int32 sum in its lane. So nothing is summed across lanes, a sub-block costs
 * one madd instead of one per 32 values, and each lane's float sum is the reference's single
 * accumulator. A weight block is unpacked once per tile of up to TT activation rows.
 *
 * Q8_0's signed values are made unsigned with their signs moved onto x (per row and value: one
 * sign_epi8 per maddubs), and its products of up to 128 * 127 leave no room to add in int16, so
 * each maddubs is widened by its own madd; the transposed form still beats one row at a time
 * with a horizontal sum per 8 blocks (measured 1.6x at 16 rows). */

/* Every file including this one is built twice (engine/meson.build): for the avx2 table, and
 * with AVX-512 VL and VNNI flags for the avx512 table's one-row products on CPUs with VNNI, where
 * 32 vector registers hold a row group's operands without spilling and vpdpwssd / vpdpbusd fold
 * a madd and its add (measured 7% (Q4_K) and 12% (Q6_K) faster at one row from the caches on
 * Zen 4, kvs-bench-qmatmul pinned to one core). Same integers, same float order: the same bits.
 * Header-only (always inlined), so each file compiles it with its own flags. Not a public
 * header. */
#ifndef KVS_ENGINE_KERN_QDOT_ROWS8_H
#define KVS_ENGINE_KERN_QDOT_ROWS8_H

#include "engine/kern/prefetch.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_ymm.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* A type's entry point: kern__qmatmul_avx2's contract (kern/qdot.h) for one weight type. */
typedef void (*kern_qrows8_fn)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                               size_t n0, size_t n1);

#ifdef KERN_QDOT_VNNI
#define QROWS8(type) kern__qrows8_vnni_##type
#else
#define QROWS8(type) kern__qrows8_##type
#endif

/* The entry points, one per type (the files above) */
void QROWS8(q8_0)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q4_0)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q4_1)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q5_0)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q5_1)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q2_k)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q3_k)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q4_k)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q5_k)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(q6_k)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                  size_t n1);
void QROWS8(iq4_nl)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                    size_t n1);
void QROWS8(iq4_xs)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                    size_t n1);
void QROWS8(mxfp4)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                   size_t n1);

/* The sum of each of v[0..8)'s 8 int32 lanes, v[i]'s in lane i (integers: any order is exact). */
INLINE __m256i hsum8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20),
                            _mm256_permute2x128_si256(a, c, 0x31));
}

/* v[k] := the vector whose lane r is lane k of v[r] (an 8 x 8 transpose of 32-bit lanes). */
INLINE void tr8(__m256i v[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* The f16 at p[r] + off of each of the 8 rows, as floats in lanes 0..7. */
INLINE __m256 f16x8(const uint8_t *const p[8], size_t off)
{
    uint16_t h[8];
    for (int r = 0; r < 8; r++)
        memcpy(&h[r], p[r] + off, 2);
    /* inserted, not stored and reloaded: eight 2-byte stores read back by one 16-byte load
     * cannot be forwarded, and stall */
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3],
                                          (short)h[4], (short)h[5], (short)h[6], (short)h[7]));
}

/* The 8 rows of a group are 8 short streams the hardware prefetchers learn too late (each
 * group starts 8 new ones): while block b of a group is read, the next group's bytes of block b
 * (the same share of its contiguous 8 rows) are fetched into L2 (kern/prefetch.h). */
INLINE void prefetch_next(const uint8_t *next, size_t b, size_t bb)
{
    kern_prefetch_l2(next + 8 * bb * b, 8 * bb);
}

/* The IQ4 types' values are the signed levels lut[raw] (-127 .. 113; MXFP4's -12 .. 12): as for
 * Q8_0, |w| meets x carrying w's sign, and each maddubs (pairs of at most 2 * 127 * 127) is
 * widened by its own madd, here with the rows' sub-block scales as the int16 pairs where IQ4_XS
 * has them. */

/* The level table in both 128-bit halves */
INLINE __m256i iq4_lut(void)
{
    return _mm256_broadcastsi128_si256(kern__iq4_levels(0));
}

/* The 32 values of the 16 nibble bytes at q (value j in the low nibble of byte j, j + 16 in its
 * high one), value i in byte i. */
INLINE __m256i iq4_vals(const uint8_t *q, __m256i lut)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
    return _mm256_shuffle_epi8(
        lut, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f)));
}

/* The sum over k < 8 of (w[k] . x[4k .. 4k + 3]) * sc in int32, lane r row r's (w transposed, wa
 * its magnitudes, sc int16 pairs) */
INLINE __m256i mul8s(const __m256i w[8], const __m256i wa[8], const int8_t *x, __m256i sc)
{
    __m256i S = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        S = _mm256_add_epi32(
            S, _mm256_madd_epi16(
                   _mm256_maddubs_epi16(wa[k], _mm256_sign_epi8(bcast4(x + 4 * k), w[k])), sc));
    return S;
}

/* acc + the int16 pair products of a and b summed into int32 lanes; with VNNI one vpdpwssd
 * (exact either way: no pair here comes near the int32 range) */
INLINE __m256i madd_add(__m256i acc, __m256i a, __m256i b)
{
#ifdef KERN_QDOT_VNNI
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* The u8 x s8 quads of w and x summed into int32 lanes; with VNNI one vpdpbusd. The same
 * integers: each caller's maddubs pairs stay below 2^15 (|2 * 128 * 127| at most), so
 * maddubs never saturates. */
INLINE __m256i dot_quads(__m256i w, __m256i x)
{
#ifdef KERN_QDOT_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

/* One activation row (a decode step): reading the weights dominates, so each row's block is
 * multiplied as the file lays it out (lanes over its inputs), and the 8 rows' int32 lanes are
 * summed into one vector of their exact block sums S, lane r for row r (hsum8), before the float
 * fold the tile kernels above make: the same integers, the same order, the same bits, without
 * the transposes whose cost a single row cannot share. */

/* Int16 element e of both 128-bit halves of v in every element of that half. */
#define BCAST16(v, e0, e1)                                                                         \
    _mm256_shuffle_epi8(                                                                           \
        v, _mm256_set_epi8(2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), \
                           2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), \
                           2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0)))

/* The scales of the 32-value signed types' blocks at p[0..8) (s8_kind's): the f16 at byte 0, or
 * MXFP4's E8M0 byte there widened */
INLINE __m256 s8_scales(const uint8_t *const p[8], int lut)
{
    if (lut != KERN_LUT_MXFP4)
        return f16x8(p, 0);
    return kern__e8m0_ps8(
        _mm256_setr_epi32(p[0][0], p[1][0], p[2][0], p[3][0], p[4][0], p[5][0], p[6][0], p[7][0]));
}

/* A signed 32-value block's bytes (lut 0: Q8_0's 34, KERN_LUT_IQ4: IQ4_NL's 18, KERN_LUT_MXFP4:
 * MXFP4's 17) and where its values start (after the f16 d, or MXFP4's byte e) */
#define S8_BYTES(lut) ((lut) == 0 ? 34 : (lut) == KERN_LUT_IQ4 ? 18 : 17)
#define S8_VALS(lut) ((lut) == KERN_LUT_MXFP4 ? 1 : 2)

/* Q8_0 rows p[0..8) (34-byte blocks: d | 32 int8; lut 0), IQ4_NL ones (18: d | 16 nibble bytes,
 * Q4_0's order; KERN_LUT_IQ4) or MXFP4 ones (17: e | 16 nibble bytes; KERN_LUT_MXFP4) times
 * activation rows xq[0 .. tt): maddubs takes unsigned weights,
 * so |w| meets x carrying w's sign (sign_epi8 of the broadcast quad by each row's values);
 * products up to 128 * 127 leave no room to add two maddubs in int16, so each is widened by its
 * own madd. Transposing still pays: the 8 rows' block sums land in their lanes with no
 * horizontal sum. */
INLINE void grp_s8(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int lut,
                   const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i one = _mm256_set1_epi16(1),
                  levels = _mm256_broadcastsi128_si256(kern__lut_levels(lut, 0));
    size_t bb = S8_BYTES(lut);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        __m256i w[8], wa[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + bb * b;
            w[r] = lut ? iq4_vals(p[r] + S8_VALS(lut), levels) : ld(p[r] + 2);
        }
        tr8(w);
        for (int k = 0; k < 8; k++)
            wa[k] = _mm256_sign_epi8(w[k], w[k]);
        __m256 dw = s8_scales(p, lut);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m256i S = mul8s(w, wa, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), one);
            float dx;
            memcpy(&dx, xr + 4 * b, 4);
            acc[t] = fold8(acc[t], dw, _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
        }
    }
}

/* Q8_0 (lut 0), IQ4_NL or MXFP4 (the 32 levels of the block's nibbles for its int8 values) */
INLINE void one_s8(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int lut,
                   const uint8_t *xr, __m256 *acc)
{
    const __m256i levels = _mm256_broadcastsi128_si256(kern__lut_levels(lut, 0));
    size_t bb = S8_BYTES(lut);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + bb * b;
            __m256i w = lut ? iq4_vals(p[r] + S8_VALS(lut), levels) : ld(p[r] + 2);
            s[r] = dot_quads(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        }
        float dx;
        memcpy(&dx, xr + 4 * b, 4);
        *acc = fold8(*acc, s8_scales(p, lut), _mm256_set1_ps(dx), _mm256_cvtepi32_ps(hsum8(s)));
    }
}

/* Defines the entry point name: for rows of x in tiles of up to TT, each group of 8 weight rows
 * (n .. n + 7; past the end the last row again, not stored) through ONE(rows, next, K, x, acc)
 * for a lone row of x, GRP(rows, next, K, x, xrb, tt, acc, si) for a tile, the wanted outputs
 * stored. next: the following group's first row, which the kernels prefetch. */
#define QROWS8_DEFINE(name, ONE, GRP)                                                              \
    void name(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,      \
              size_t n1)                                                                           \
    {                                                                                              \
        size_t xrb = kern_qx_row_bytes(kern_qdot_act(w), w->n_in), K = w->n_in;                    \
        const uint8_t *base = (const uint8_t *)w->data;                                            \
        __m256 acc[TT];                                                                            \
        __m256i si[TT]; /* the K-quants' scratch */                                                \
        (void)si;                                                                                  \
        for (size_t t0 = 0; t0 < T; t0 += TT) {                                                    \
            size_t tt = T - t0 < TT ? T - t0 : TT;                                                 \
            const uint8_t *x = (const uint8_t *)xq + t0 * xrb;                                     \
            for (size_t n = n0; n < n1; n += 8) {                                                  \
                size_t nr = n1 - n < 8 ? n1 - n : 8;                                               \
                const uint8_t *rows[8];                                                            \
                for (size_t r = 0; r < 8; r++)                                                     \
                    rows[r] = base + (n + (r < nr ? r : nr - 1)) * w->row_bytes;                   \
                const uint8_t *next =                                                              \
                    n + 16 <= w->n_out ? base + (n + 8) * w->row_bytes : rows[0];                  \
                for (size_t t = 0; t < tt; t++)                                                    \
                    acc[t] = _mm256_setzero_ps();                                                  \
                if (tt == 1)                                                                       \
                    ONE(rows, next, K, x, acc);                                                    \
                else                                                                               \
                    GRP(rows, next, K, x, xrb, tt, acc, si);                                       \
                for (size_t t = 0; t < tt; t++) {                                                  \
                    float *o = out + (t0 + t) * ldo + n;                                           \
                    if (nr == 8) {                                                                 \
                        _mm256_storeu_ps(o, acc[t]);                                               \
                    } else {                                                                       \
                        float l[8];                                                                \
                        _mm256_storeu_ps(l, acc[t]);                                               \
                        memcpy(o, l, nr * sizeof(float));                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#endif
