/* AVX2 integer products (kern/qdot.h) over the file's rows.
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
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_ymm.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* Built twice (engine/meson.build): for the avx2 table, and with AVX-512 VL and VNNI flags for
 * the avx512 table's one-row products on CPUs with VNNI, where 32 vector registers hold a row
 * group's operands without spilling and vpdpwssd / vpdpbusd fold a madd and its add (measured
 * 7% (Q4_K) and 12% (Q6_K) faster at one row from the caches on Zen 4, kvs-bench-qmatmul pinned
 * to one core). Same integers, same float order: the same bits. */
#ifdef KERN_QDOT_VNNI
#define QMATMUL kern__qmatmul_avx2_vnni
#define QMATMUL_X8 kern__qmatmul_x8_avx2_vnni
#else
#define QMATMUL kern__qmatmul_avx2
#define QMATMUL_X8 kern__qmatmul_x8_avx2
#endif

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
 * (the same share of its contiguous 8 rows) are fetched. */
INLINE void prefetch_next(const uint8_t *next, size_t b, size_t bb)
{
    for (size_t o = 8 * bb * b; o < 8 * bb * (b + 1); o += 64)
        _mm_prefetch((const char *)(next + o), _MM_HINT_T0);
}

/* The IQ4 types' values are the signed levels lut[raw] (-127 .. 113): as for Q8_0, |w| meets x
 * carrying w's sign, and each maddubs (pairs of at most 2 * 127 * 127) is widened by its own
 * madd, here with the rows' sub-block scales as the int16 pairs where IQ4_XS has them. */

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

/* Q8_0 rows p[0..8) (34-byte blocks: d | 32 int8; iq4 0) or IQ4_NL ones (18: d | 16 nibble
 * bytes, Q4_0's order; iq4 1) times activation rows xq[0 .. tt): maddubs takes unsigned weights,
 * so |w| meets x carrying w's sign (sign_epi8 of the broadcast quad by each row's values);
 * products up to 128 * 127 leave no room to add two maddubs in int16, so each is widened by its
 * own madd. Transposing still pays: the 8 rows' block sums land in their lanes with no
 * horizontal sum. */
INLINE void grp_s8(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int iq4,
                   const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i one = _mm256_set1_epi16(1), lut = iq4_lut();
    size_t bb = iq4 ? 18 : 34;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        __m256i w[8], wa[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + bb * b;
            w[r] = iq4 ? iq4_vals(p[r] + 2, lut) : ld(p[r] + 2);
        }
        tr8(w);
        for (int k = 0; k < 8; k++)
            wa[k] = _mm256_sign_epi8(w[k], w[k]);
        __m256 dw = f16x8(p, 0);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m256i S = mul8s(w, wa, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), one);
            float dx;
            memcpy(&dx, xr + 4 * b, 4);
            acc[t] = fold8(acc[t], dw, _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
        }
    }
}

/* Q4_0 rows p[0..8) (18-byte blocks: d | 16 bytes, value j in the low nibble of byte j, j + 16
 * in its high one) times activation rows xq[0 .. tt); Q = nibble - 8, the 8 taken off through
 * the block sums of x. */
INLINE void grp_q4_0(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                     const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 18);
        const uint8_t *p[8];
        __m256i w[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 18 * b;
            __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2));
            w[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        }
        tr8(w);
        __m256 dw = f16x8(p, 0);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m256i S =
                _mm256_madd_epi16(mul8(w, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), 8), one);
            int16_t sx;
            float dx;
            memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
            memcpy(&dx, xr + 4 * b, 4);
            S = _mm256_sub_epi32(S, _mm256_set1_epi32(8 * sx));
            acc[t] = fold8(acc[t], dw, _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
        }
    }
}

/* The fifth bits of a Q5_0 / Q5_1 block (qh: bit i for value i) as 0x10 in byte i, byte i of the
 * unpacked row holding value i. */
INLINE __m256i bits5(const uint8_t *qhp)
{
    uint32_t qh;
    memcpy(&qh, qhp, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* A Q4_1 / Q5_0 / Q5_1 block's 32 raw values at p (block start), value i in byte i: the 16 qs
 * bytes at qo (value j in the low nibble of byte j, j + 16 in its high one), the fifth bits' qh
 * at ho (ho < 0: none). */
INLINE __m256i raw32(const uint8_t *p, int qo, int ho)
{
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p + qo));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return ho < 0 ? w : _mm256_or_si256(w, bits5(p + ho));
}

/* Q4_1 (bb 20: d | m | qs; qo 4, no qh), Q5_0 (22: d | qh | qs; bias 16) and Q5_1 (24: d | m |
 * qh | qs) rows p[0..8) times activation rows xq[0 .. tt), as grp_q4_0; mo: the offset of the
 * min m (0: none), whose term (m * dx) * sx follows the scale's. The 5-bit values (0..31) add
 * at most 4 maddubs in int16 (|4 * 2 * 31 * 127| = 31496 < 2^15; 8 would not fit), the 4-bit
 * ones 8 (|8 * 2 * 15 * 127| = 30480). */
INLINE void grp_leg(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int bb, int qo,
                    int ho, int bias, int mo, const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i one = _mm256_set1_epi16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[8];
        __m256i w[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + (size_t)bb * b;
            w[r] = raw32(p[r], qo, ho);
        }
        tr8(w);
        __m256 dw = f16x8(p, 0), dm = mo ? f16x8(p, (size_t)mo) : _mm256_setzero_ps();
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            const int8_t *xs = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
            __m256i S = ho < 0 ? _mm256_madd_epi16(mul8(w, xs, 8), one)
                               : _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), one),
                                                  _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), one));
            int16_t sx;
            float dx;
            memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
            memcpy(&dx, xr + 4 * b, 4);
            if (bias)
                S = _mm256_sub_epi32(S, _mm256_set1_epi32(bias * sx));
            __m256 vdx = _mm256_set1_ps(dx);
            acc[t] = fold8(acc[t], dw, vdx, _mm256_cvtepi32_ps(S));
            if (mo)
                acc[t] = fold8(acc[t], dm, vdx, _mm256_set1_ps((float)sx));
        }
    }
}

/* Q2_K rows p[0..8) (q3 = 0): scales (16: sc low nibble, m high) | qs (64) | d (2) | dmin (2);
 * Q3_K (q3 = 1): hmask (32) | qs (64) | scales (12) | d (2), Q = raw - 4, the 4 taken off
 * through the sums of 16 activations. Value 128 h + 32 s + l: bits 2 s of qs[32 h + l] (and for
 * Q3_K bit 4 h + s of hmask[l] as raw's bit 2). Sub-blocks of 16: the values (0..7) add 4
 * maddubs in int16 (|4 * 2 * 7 * 127| = 7112). */
INLINE __m128i scales_q3k(const uint8_t *s)
{
    uint32_t a0, a1, t;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&t, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    uint32_t s0 = (a0 & m4) | (t & m2) << 4, s1 = (a1 & m4) | ((t >> 2) & m2) << 4;
    uint32_t s2 = ((a0 >> 4) & m4) | ((t >> 4) & m2) << 4;
    uint32_t s3 = ((a1 >> 4) & m4) | ((t >> 6) & m2) << 4;
    return _mm_sub_epi8(_mm_set_epi32((int)s3, (int)s2, (int)s1, (int)s0), _mm_set1_epi8(32));
}

/* The 32 raw values 32 v .. 32 v + 31 of the Q2_K / Q3_K block at p, value 32 v + i in byte i. */
INLINE __m256i raw_q23k(const uint8_t *p, int q3, int v)
{
    __m256i c =
        _mm256_srl_epi16(ld(p + (q3 ? 32 : 16) + 32 * (v / 4)), _mm_cvtsi32_si128(2 * (v % 4)));
    c = _mm256_and_si256(c, _mm256_set1_epi8(3));
    if (q3) {
        __m256i h = _mm256_srl_epi16(ld(p), _mm_cvtsi32_si128(v));
        c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 2));
    }
    return c;
}

/* The 16 sub-block scales (and Q2_K's mins) of the block at p as int16. */
INLINE void scales_q23k(const uint8_t *p, int q3, __m256i *sc, __m256i *mi)
{
    if (q3) {
        *sc = _mm256_cvtepi8_epi16(scales_q3k(p + 96));
        *mi = _mm256_setzero_si256();
    } else {
        __m128i s = _mm_loadu_si128((const __m128i *)(const void *)p);
        *sc = _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(0x0f)));
        *mi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
    }
}

INLINE void grp_q23k(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int q3,
                     const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i dup0 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                          0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup1 = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2,
                                          3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
    size_t bb = q3 ? 110 : 84;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        /* transposed: lane r of pr[k] is (sc[2 k], sc[2 k + 1]) of row r, of pm[k] its mins */
        __m256i pr[8], pm[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * bb;
            scales_q23k(p[r], q3, &pr[r], &pm[r]);
        }
        tr8(pr);
        if (!q3)
            tr8(pm);
        __m256 d = f16x8(p, q3 ? 108 : 80);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) { /* values 32 v .. 32 v + 31: sub-blocks 2 v, 2 v + 1 */
            __m256i w[8];
            for (int r = 0; r < 8; r++)
                w[r] = raw_q23k(p[r], q3, v);
            tr8(w);
            __m256i s0 = _mm256_shuffle_epi8(pr[v], dup0), s1 = _mm256_shuffle_epi8(pr[v], dup1);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] = _mm256_add_epi32(
                    si[t], _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), s0),
                                            _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), s1)));
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m256i B = _mm256_setzero_si256(); /* the bias's or the mins' sum through bs */
            for (int k = 0; k < 8; k++) {
                __m256i bs = bcast4((const int8_t *)(const void *)&x->bs[2 * k]);
                B = _mm256_add_epi32(B, _mm256_madd_epi16(q3 ? pr[k] : pm[k], bs));
            }
            __m256i S = q3 ? _mm256_sub_epi32(si[t], _mm256_slli_epi32(B, 2)) : si[t];
            __m256 dx = _mm256_set1_ps(x->d);
            acc[t] = fold8(acc[t], d, dx, _mm256_cvtepi32_ps(S));
            if (!q3) {
                __m256 dm = _mm256_xor_ps(f16x8(p, 82), _mm256_set1_ps(-0.0f));
                acc[t] = fold8(acc[t], dm, dx, _mm256_cvtepi32_ps(B));
            }
        }
    }
}

/* Q4_K rows p[0..8): d (2) | dmin (2) | scales (12) | qs (128): value 64 c + l in the low
 * nibble of qs[32 c + l], 64 c + 32 + l in its high one. Q5_K (q5 = 1): d | dmin | scales |
 * qh (32) | qs (128), the fifth bit of value 32 v + l bit v of qh[l]. si: tt int32 vectors of
 * scratch. */
INLINE void grp_q45k(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int q5,
                     const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    size_t bb = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        /* per row sc[0..7] | m[0..7] as int16, each doubled into a 32-bit lane; transposed,
         * a[j] (j < 4) and c[j - 4] hold sub-block j's scale of each row, a[4 + j] and c[j] its
         * min */
        __m256i a[8], c[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * bb;
            __m256i e = _mm256_cvtepu8_epi16(scales_k4(p[r] + 4));
            a[r] = _mm256_unpacklo_epi16(e, e);
            c[r] = _mm256_unpackhi_epi16(e, e);
        }
        tr8(a);
        tr8(c);
        __m256i sc[8] = {a[0], a[1], a[2], a[3], c[0], c[1], c[2], c[3]};
        __m256i mi[8] = {a[4], a[5], a[6], a[7], c[4], c[5], c[6], c[7]};
        __m256 d = f16x8(p, 0), dm = f16x8(p, 2);
        dm = _mm256_xor_ps(dm, _mm256_set1_ps(-0.0f)); /* the min is subtracted */
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i w[8];
            for (int r = 0; r < 8; r++) {
                __m256i q = ld(p[r] + qs + 32 * (j / 2));
                w[r] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
                if (q5) {
                    __m256i h = _mm256_srl_epi16(ld(p[r] + 16), _mm_cvtsi32_si128(j));
                    w[r] = _mm256_or_si256(w[r], _mm256_slli_epi16(_mm256_and_si256(h, m1), 4));
                }
            }
            tr8(w);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * j;
                __m256i v;
                if (q5)
                    v = _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), sc[j]),
                                         _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), sc[j]));
                else
                    v = _mm256_madd_epi16(mul8(w, xs, 8), sc[j]);
                si[t] = _mm256_add_epi32(si[t], v);
            }
        }
        for (size_t t = 0; t < tt; t++) /* m[j] times bs[2 j] + bs[2 j + 1] */
            acc[t] = fold_q45k(acc[t], d, dm, si[t], mi,
                               (const kern__qx256 *)(const void *)(xq + t * xrb) + b);
    }
}

/* Q6_K rows p[0..8): ql (128) | qh (64) | scales (16, int8) | d (2); per half h of 128 values,
 * value l (l < 32) from the low nibble of ql[l] and bits 0-1 of qh[l], 32 + l from ql[32 + l]
 * and bits 2-3, 64 + l from the high nibble of ql[l] and bits 4-5, 96 + l from ql[32 + l] and
 * bits 6-7. Q = raw - 32, the 32 taken off through the sums of 16 activations. */
INLINE void grp_q6k(const uint8_t *const rows[8], const uint8_t *next, size_t nb, const uint8_t *xq,
                    size_t xrb, size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    /* a 32-bit lane's low / high int16 in both of its halves */
    const __m256i dup0 = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                          0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i dup1 = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2,
                                          3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 210);
        const uint8_t *p[8];
        __m256i pr[8]; /* transposed: lane r of pr[k] is (sc[2 k], sc[2 k + 1]) of row r */
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * 210;
            pr[r] =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p[r] + 192)));
        }
        tr8(pr);
        __m256 d = f16x8(p, 208);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) { /* values 32 v .. 32 v + 31: sub-blocks 2 v, 2 v + 1 */
            int h = v / 4, s = v % 4;
            __m256i w[8];
            for (int r = 0; r < 8; r++) {
                __m256i l = ld(p[r] + 64 * h + 32 * (s % 2)), qh = ld(p[r] + 128 + 32 * h);
                if (s >= 2)
                    l = _mm256_srli_epi16(l, 4);
                qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s));
                w[r] = _mm256_or_si256(_mm256_and_si256(l, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            }
            tr8(w);
            __m256i s0 = _mm256_shuffle_epi8(pr[v], dup0), s1 = _mm256_shuffle_epi8(pr[v], dup1);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                __m256i u = _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 2), s0),
                                             _mm256_madd_epi16(mul8(w + 2, xs + 8, 2), s0));
                __m256i z = _mm256_add_epi32(_mm256_madd_epi16(mul8(w + 4, xs + 16, 2), s1),
                                             _mm256_madd_epi16(mul8(w + 6, xs + 24, 2), s1));
                si[t] = _mm256_add_epi32(si[t], _mm256_add_epi32(u, z));
            }
        }
        for (size_t t = 0; t < tt; t++) /* sc[2 k] bs[2 k] + sc[2 k + 1] bs[2 k + 1] */
            acc[t] = fold_q6k(acc[t], d, si[t], pr,
                              (const kern__qx256 *)(const void *)(xq + t * xrb) + b);
    }
}

/* IQ4_XS rows p[0..8) (136-byte blocks: d | scales_h (2) | scales_l (4) | qs (128)): sub-block j
 * (values 32 j .. 32 j + 31, qs[16 j .. 16 j + 15] in Q4_0's order) has the 6-bit scale
 * (low nibble j of scales_l) | (bits 2 j, 2 j + 1 of scales_h) << 4, less 32. */
INLINE void grp_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i lut = iq4_lut();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const uint8_t *p[8];
        __m256i sc[8]; /* lane r of sc[j]: row r's (scale j, scale j) int16 pair */
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m128i s16 = kern__iq4xs_scales(p[r]);
            sc[r] = _mm256_cvtepu16_epi32(s16);
            sc[r] = _mm256_or_si256(sc[r], _mm256_slli_epi32(sc[r], 16));
        }
        tr8(sc);
        __m256 d = f16x8(p, 0);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i w[8], wa[8];
            for (int r = 0; r < 8; r++)
                w[r] = iq4_vals(p[r] + 8 + 16 * j, lut);
            tr8(w);
            for (int k = 0; k < 8; k++)
                wa[k] = _mm256_sign_epi8(w[k], w[k]);
            __m256i scj = sc[j];
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                si[t] = _mm256_add_epi32(si[t], mul8s(w, wa, x->q + 32 * j, scj));
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            acc[t] = fold8(acc[t], d, _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(si[t]));
        }
    }
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

/* Q4_K: d (2) | dmin (2) | scales (12) | qs (128): value 64 c + l in the low nibble of
 * qs[32 c + l], 64 c + 32 + l in its high one. Q5_K (q5 = 1): d | dmin | scales | qh (32) |
 * qs (128), the fifth bit of value 32 v + l bit v of qh[l]. */

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

/* Q8_0 (iq4 0) or IQ4_NL (iq4 1: the 32 levels of the block's nibbles for its int8 values) */
INLINE void one_s8(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int iq4,
                   const uint8_t *xr, __m256 *acc)
{
    const __m256i lut = iq4_lut();
    size_t bb = iq4 ? 18 : 34;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + bb * b;
            __m256i w = iq4 ? iq4_vals(p[r] + 2, lut) : ld(p[r] + 2);
            s[r] = dot_quads(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        }
        float dx;
        memcpy(&dx, xr + 4 * b, 4);
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(dx), _mm256_cvtepi32_ps(hsum8(s)));
    }
}

#ifdef KERN_QDOT_VNNI
/* IQ4_XS, one row of x, with VNNI: half a block (4 sub-blocks, 64 bytes) a zmm load, whose low
 * nibbles are the first 16 values of each sub-block (one per 128-bit lane) and whose high ones
 * the last 16; x is reordered to match once per block for all 8 rows. The levels plus 128 (one
 * vpshufb each) meet x in two vpdpbusd into the same lanes, which start from -128 times each
 * sub-block's sum of x (lane 4 i), then each 128-bit lane times its sub-block's scale (vpmulld);
 * the 8 rows' int32 lanes are summed as the ymm kernels' (measured on a Zen 5 core, 5632 x 2048
 * in the caches: 35 Gweights/s for the ymm kernel below, 40 for two sub-blocks a zmm, ~50 so). */
INLINE void one_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const kern__qx256 *xb, __m256 *acc)
{
    const __m512i lutu = _mm512_broadcast_i32x4(kern__iq4_levels(1));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* per half h: sub-block 4 h + i's value in 128-bit lane i (its scale, and its sum in lane 4 i)
     */
    const __m512i idx[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const kern__qx256 *x = xb + b;
        /* -128 times the sum of each sub-block's 32 x: (bs[2 j] + bs[2 j + 1]) * -128, lane j */
        __m512i X = _mm512_castsi256_si512(_mm256_madd_epi16(ld(x->bs), _mm256_set1_epi16(-128)));
        __m512i xlo[2], xhi[2], corr[2];
        for (int h = 0; h < 2; h++) {
            __m512i a = _mm512_loadu_si512((const void *)(x->q + 128 * h));
            __m512i c = _mm512_loadu_si512((const void *)(x->q + 128 * h + 64));
            xlo[h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
            xhi[h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
            corr[h] = _mm512_maskz_permutexvar_epi32(0x1111, idx[h], X);
        }
        const uint8_t *p[8];
        __m256i s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(kern__iq4xs_scales(p[r])));
            __m512i a = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i v = _mm512_loadu_si512((const void *)(p[r] + 8 + 64 * h));
                __m512i lo = _mm512_shuffle_epi8(lutu, _mm512_and_si512(v, m4));
                __m512i hi =
                    _mm512_shuffle_epi8(lutu, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                __m512i u =
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr[h], lo, xlo[h]), hi, xhi[h]);
                a = _mm512_add_epi32(a,
                                     _mm512_mullo_epi32(u, _mm512_permutexvar_epi32(idx[h], sc)));
            }
            s[r] = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
        }
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(hsum8(s)));
    }
}
#else
/* IQ4_XS (grp_iq4xs's layout): per sub-block the maddubs pairs of |w| and x carrying w's sign,
 * widened by one madd with the sub-block's scale */
INLINE void one_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const kern__qx256 *xb, __m256 *acc)
{
    const __m256i lut = iq4_lut();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const kern__qx256 *x = xb + b;
        const uint8_t *p[8];
        __m256i s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m256i sr = _mm256_setzero_si256();
            __m128i s16 = kern__iq4xs_scales(p[r]);
            for (int j = 0; j < 8; j++) {
                /* scale j in every word: a pshufb of its two bytes */
                __m256i sc = _mm256_broadcastsi128_si256(
                    _mm_shuffle_epi8(s16, _mm_set1_epi16((short)(2 * j | (2 * j + 1) << 8))));
                __m256i w = iq4_vals(p[r] + 8 + 16 * j, lut), xj = ld(x->q + 32 * j);
                sr = _mm256_add_epi32(
                    sr,
                    _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xj, w)), sc));
            }
            s[r] = sr;
        }
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(hsum8(s)));
    }
}
#endif

INLINE void one_q4_0(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                     const uint8_t *xr, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 18);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 18 * b;
            __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2));
            __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
            s[r] = dot_quads(w, x);
        }
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        __m256i S = _mm256_sub_epi32(hsum8(s), _mm256_set1_epi32(8 * sx));
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
    }
}

INLINE void one_q45k(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int q5,
                     const kern__qx256 *xb, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    size_t bb = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const kern__qx256 *x = xb + b;
        const uint8_t *p[8];
        __m256i s[8], mn[8];
        __m256i bs = ld(x->bs);
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * bb;
            __m128i sm = scales_k4(p[r] + 4); /* sc bytes 0..7, m bytes 8..15 */
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            __m128i m8 = _mm_unpackhi_epi64(sm, sm);
            mn[r] = _mm256_madd_epi16(bs, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
            __m256i qh = q5 ? ld(p[r] + 16) : _mm256_setzero_si256();
            __m256i acc32 = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m256i q = ld(p[r] + qs + 32 * c);
                __m256i u0 = _mm256_and_si256(q, m4);
                __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (q5) {
                    u0 = _mm256_or_si256(
                        u0,
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4));
                    u1 = _mm256_or_si256(
                        u1, _mm256_slli_epi16(
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4));
                }
                __m256i s0 = c == 0   ? BCAST16(sc16, 0, 0)
                             : c == 1 ? BCAST16(sc16, 2, 2)
                             : c == 2 ? BCAST16(sc16, 4, 4)
                                      : BCAST16(sc16, 6, 6);
                __m256i s1 = c == 0   ? BCAST16(sc16, 1, 1)
                             : c == 1 ? BCAST16(sc16, 3, 3)
                             : c == 2 ? BCAST16(sc16, 5, 5)
                                      : BCAST16(sc16, 7, 7);
                acc32 = madd_add(acc32, _mm256_maddubs_epi16(u0, ld(x->q + 64 * c)), s0);
                acc32 = madd_add(acc32, _mm256_maddubs_epi16(u1, ld(x->q + 64 * c + 32)), s1);
            }
            s[r] = acc32;
        }
        __m256 dx = _mm256_set1_ps(x->d);
        __m256 dm = _mm256_xor_ps(f16x8(p, 2), _mm256_set1_ps(-0.0f));
        __m256 a = fold8(*acc, f16x8(p, 0), dx, _mm256_cvtepi32_ps(hsum8(s)));
        *acc = fold8(a, dm, dx, _mm256_cvtepi32_ps(hsum8(mn)));
    }
}

INLINE void one_q6k(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                    const kern__qx256 *xb, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 210);
        const kern__qx256 *x = xb + b;
        const uint8_t *p[8];
        __m256i s[8];
        __m256i bs = ld(x->bs);
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * 210;
            __m256i sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p[r] + 192)));
            /* vector v: sc[2 v] in its low half, sc[2 v + 1] in its high one */
            __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
            __m256i acc32 = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            acc32 = _mm256_sub_epi32(_mm256_setzero_si256(), acc32);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i l0 = ld(p[r] + 64 * h), l1 = ld(p[r] + 64 * h + 32);
                __m256i qh = ld(p[r] + 128 + 32 * h);
                __m256i u[4];
                /* each 2-bit field of qh moved straight to bits 4..5 of its byte (a 16-bit
                 * shift, then the mask drops what crossed from the neighbouring byte) */
                u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                u[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_and_si256(qh, m30));
                u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                __m256i v = h ? hi : lo;
                __m256i sc[4] = {BCAST16(v, 0, 1), BCAST16(v, 2, 3), BCAST16(v, 4, 5),
                                 BCAST16(v, 6, 7)};
                for (int i = 0; i < 4; i++)
                    acc32 = madd_add(acc32, _mm256_maddubs_epi16(u[i], ld(x->q + 128 * h + 32 * i)),
                                     sc[i]);
            }
            s[r] = acc32;
        }
        *acc = fold8(*acc, f16x8(p, 208), _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(hsum8(s)));
    }
}

/* grp_leg's types, one activation row. */
INLINE void one_leg(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int bb, int qo,
                    int ho, int bias, int mo, const uint8_t *xr, __m256 *acc)
{
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + (size_t)bb * b;
            s[r] = dot_quads(raw32(p[r], qo, ho), x);
        }
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        __m256i S = hsum8(s);
        if (bias)
            S = _mm256_sub_epi32(S, _mm256_set1_epi32(bias * sx));
        __m256 vdx = _mm256_set1_ps(dx);
        *acc = fold8(*acc, f16x8(p, 0), vdx, _mm256_cvtepi32_ps(S));
        if (mo)
            *acc = fold8(*acc, f16x8(p, (size_t)mo), vdx, _mm256_set1_ps((float)sx));
    }
}

/* grp_q23k's types, one activation row: per row, values 128 h + 32 s + l in file order, the
 * lower 16 lanes sub-block 8 h + 2 s, the upper 8 h + 2 s + 1. */
INLINE void one_q23k(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int q3,
                     const kern__qx256 *xb, __m256 *acc)
{
    size_t bb = q3 ? 110 : 84;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const kern__qx256 *x = xb + b;
        const uint8_t *p[8];
        __m256i s[8], mn[8];
        __m256i bs = ld(x->bs);
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + b * bb;
            __m256i sc16, mi16;
            scales_q23k(p[r], q3, &sc16, &mi16);
            mn[r] = _mm256_madd_epi16(bs, mi16);
            __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
            __m256i acc32 = q3 ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                                  _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 2))
                               : _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                __m256i h = v < 4 ? lo : hi;
                __m256i sc = v % 4 == 0   ? BCAST16(h, 0, 1)
                             : v % 4 == 1 ? BCAST16(h, 2, 3)
                             : v % 4 == 2 ? BCAST16(h, 4, 5)
                                          : BCAST16(h, 6, 7);
                acc32 = madd_add(
                    acc32, _mm256_maddubs_epi16(raw_q23k(p[r], q3, v), ld(x->q + 32 * v)), sc);
            }
            s[r] = acc32;
        }
        __m256 dx = _mm256_set1_ps(x->d);
        *acc = fold8(*acc, f16x8(p, q3 ? 108 : 80), dx, _mm256_cvtepi32_ps(hsum8(s)));
        if (!q3) {
            __m256 dm = _mm256_xor_ps(f16x8(p, 82), _mm256_set1_ps(-0.0f));
            *acc = fold8(*acc, dm, dx, _mm256_cvtepi32_ps(hsum8(mn)));
        }
    }
}

void QMATMUL(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
             size_t n1)
{
    if (w->type == KERN_QUANT_X8) {
        QMATMUL_X8(w, xq, T, out, ldo, n0, n1);
        return;
    }
    kern_qx fmt = kern_qdot_act(w);
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), K = w->n_in;
    int kind = w->type == KERN_Q8_0 ? 0 : (int)w->qtype;
    const uint8_t *base = (const uint8_t *)w->data;
    __m256 acc[TT];
    __m256i si[TT];
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        for (size_t n = n0; n < n1; n += 8) {
            size_t nr = n1 - n < 8 ? n1 - n : 8;
            const uint8_t *rows[8];
            for (size_t r = 0; r < 8; r++) /* past the end: the last row again, not stored */
                rows[r] = base + (n + (r < nr ? r : nr - 1)) * w->row_bytes;
            const uint8_t *next = n + 16 <= w->n_out ? base + (n + 8) * w->row_bytes : rows[0];
            for (size_t t = 0; t < tt; t++)
                acc[t] = _mm256_setzero_ps();
            if (tt == 1)
                switch (kind) {
                case 0: one_s8(rows, next, K / 32, 0, x, acc); break;
                case KERN_GGML_Q4_0: one_q4_0(rows, next, K / 32, x, acc); break;
                case KERN_GGML_Q4_1: one_leg(rows, next, K / 32, 20, 4, -1, 0, 2, x, acc); break;
                case KERN_GGML_Q5_0: one_leg(rows, next, K / 32, 22, 6, 2, 16, 0, x, acc); break;
                case KERN_GGML_Q5_1: one_leg(rows, next, K / 32, 24, 8, 4, 0, 2, x, acc); break;
                case KERN_GGML_Q2_K:
                    one_q23k(rows, next, K / 256, 0, (const kern__qx256 *)(const void *)x, acc);
                    break;
                case KERN_GGML_Q3_K:
                    one_q23k(rows, next, K / 256, 1, (const kern__qx256 *)(const void *)x, acc);
                    break;
                case KERN_GGML_Q4_K:
                    one_q45k(rows, next, K / 256, 0, (const kern__qx256 *)(const void *)x, acc);
                    break;
                case KERN_GGML_Q5_K:
                    one_q45k(rows, next, K / 256, 1, (const kern__qx256 *)(const void *)x, acc);
                    break;
                case KERN_GGML_IQ4_NL: one_s8(rows, next, K / 32, 1, x, acc); break;
                case KERN_GGML_IQ4_XS:
                    one_iq4xs(rows, next, K / 256, (const kern__qx256 *)(const void *)x, acc);
                    break;
                default:
                    one_q6k(rows, next, K / 256, (const kern__qx256 *)(const void *)x, acc);
                    break;
                }
            else
                switch (kind) {
                case 0: grp_s8(rows, next, K / 32, 0, x, xrb, tt, acc); break;
                case KERN_GGML_Q4_0: grp_q4_0(rows, next, K / 32, x, xrb, tt, acc); break;
                case KERN_GGML_Q4_1:
                    grp_leg(rows, next, K / 32, 20, 4, -1, 0, 2, x, xrb, tt, acc);
                    break;
                case KERN_GGML_Q5_0:
                    grp_leg(rows, next, K / 32, 22, 6, 2, 16, 0, x, xrb, tt, acc);
                    break;
                case KERN_GGML_Q5_1:
                    grp_leg(rows, next, K / 32, 24, 8, 4, 0, 2, x, xrb, tt, acc);
                    break;
                case KERN_GGML_Q2_K: grp_q23k(rows, next, K / 256, 0, x, xrb, tt, acc, si); break;
                case KERN_GGML_Q3_K: grp_q23k(rows, next, K / 256, 1, x, xrb, tt, acc, si); break;
                case KERN_GGML_Q4_K: grp_q45k(rows, next, K / 256, 0, x, xrb, tt, acc, si); break;
                case KERN_GGML_Q5_K: grp_q45k(rows, next, K / 256, 1, x, xrb, tt, acc, si); break;
                case KERN_GGML_IQ4_NL: grp_s8(rows, next, K / 32, 1, x, xrb, tt, acc); break;
                case KERN_GGML_IQ4_XS: grp_iq4xs(rows, next, K / 256, x, xrb, tt, acc, si); break;
                default: grp_q6k(rows, next, K / 256, x, xrb, tt, acc, si); break;
                }
            for (size_t t = 0; t < tt; t++) {
                float *o = out + (t0 + t) * ldo + n;
                if (nr == 8) {
                    _mm256_storeu_ps(o, acc[t]);
                } else {
                    float l[8];
                    _mm256_storeu_ps(l, acc[t]);
                    memcpy(o, l, nr * sizeof(float));
                }
            }
        }
    }
}
