/* AVX2 integer products over KERN_QUANT_X8, the interleaved groups of kern/qdot_pack.c
 * (kern/qdot.h's kern__q40x8 .. kern__q80x8, kern__q2kx8 .. kern__q6kx8, kern__iq4xsx8): each
 * group's vectors hold one value quad of each of its 8 rows, lane r for row r, so the integer sums
 * land in their rows' lanes with no transpose and no horizontal sum, at every batch size. The
 * same integers and the same float order as the portable product: the same bits.
 *
 * Built twice (engine/meson.build): for the avx2 table, and with AVX-512 VL and VNNI for the
 * avx512 table on CPUs with VNNI, where vpdpbusd sums a sub-block's quads in int32 and 32
 * vector registers hold a group's operands without spilling. */
#include "engine/kern/prefetch.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_ymm.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#ifdef KERN_QDOT_VNNI
#define QMATMUL_X8 kern__qmatmul_x8_avx2_vnni
#else
#define QMATMUL_X8 kern__qmatmul_x8_avx2
#endif

#ifdef KERN_QDOT_VNNI
/* The sum over k < 8 of the quads w[k] . xs[4k .. 4k + 3] in two vpdpbusd chains (k even, k
 * odd) added at the end: the same integer as one chain, at half its latency (one activation row
 * has no other row's work to hide it behind). */
INLINE __m256i dot8v(const __m256i w[8], const int8_t *xs)
{
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[0], bcast4(xs));
    __m256i u = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[1], bcast4(xs + 4));
    for (int k = 2; k < 8; k += 2) {
        s = _mm256_dpbusd_epi32(s, w[k], bcast4(xs + 4 * k));
        u = _mm256_dpbusd_epi32(u, w[k + 1], bcast4(xs + 4 * k + 4));
    }
    return _mm256_add_epi32(s, u);
}
#endif

/* KERN_QUANT_X8 Q4_K and Q5_K (kern/qdot.h's kern__q4kx8, kern__q5kx8, alike up to qh): a group
 * of 8 rows' nb blocks at g times activation rows xq[0 .. tt), grp_q45k's integers on vectors
 * the layout holds ready: per sub-block j, w[k] (the low or high nibbles of qs[j / 2][k], for
 * Q5_K bit j of qh[0][k] above them) has row r's values 4k .. 4k + 3 in lane r, and the scales
 * and mins are 8 bytes a load; no transposes, no horizontal sums, one stream. The int16 form
 * sums 8 maddubs of 4-bit values (|8 * 2 * 15 * 127| < 2^15; 4 of 5-bit ones) and one madd with
 * (scale, scale) pairs; with VNNI vpdpbusd sums the quads in int32 and one vpmulld scales them
 * (|32 * 31 * 127 * 63| < 2^31). Either way each row's S and M are the reference's integers,
 * folded in its order: the same bits. Without VNNI the sub-block loop is unrolled: the shifts
 * and the scales' offsets become constants and the low and high nibbles share their loads (one
 * Zen 5 core, Q4_K 2048 x 2048, the avx2 table: 4 rows 1.36x, 16 rows 1.25x); with VNNI the same
 * was 0.93-0.97x at 4 and 8 rows. */
_Static_assert(offsetof(kern__q5kx8, sc) == offsetof(kern__q4kx8, sc) &&
                   offsetof(kern__q5kx8, mn) == offsetof(kern__q4kx8, mn),
               "Q4_K and Q5_K groups share their head");
INLINE void grp_q45kx8(const uint8_t *g, size_t nb, int q5, const uint8_t *xq, size_t xrb,
                       size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    size_t bb = q5 ? sizeof(kern__q5kx8) : sizeof(kern__q4kx8);
    size_t qs = q5 ? offsetof(kern__q5kx8, qs) : offsetof(kern__q4kx8, qs);
    for (size_t b = 0; b < nb; b++) {
        const kern__q4kx8 *q = (const kern__q4kx8 *)(const void *)(g + b * bb); /* the head */
        const uint8_t *qsp = g + b * bb + qs, *qhp = g + b * bb + offsetof(kern__q5kx8, qh);
        kern_prefetch_l2(g + b * bb + KERN_PF_AHEAD, bb);
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->d));
        __m256 dm =
            _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->dmin)),
                          _mm256_set1_ps(-0.0f)); /* the min is subtracted */
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
#ifndef KERN_QDOT_VNNI
#pragma GCC unroll 8
#endif
        for (int j = 0; j < 8; j++) {
            __m256i w[8];
            for (int k = 0; k < 8; k++) {
                __m256i v = ld(qsp + 256 * (j / 2) + 32 * k);
                w[k] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
                if (q5) { /* bit j of each byte to bit 4 (what crosses bytes is masked) */
                    __m256i h = ld(qhp + 32 * k);
                    h = j < 4 ? _mm256_slli_epi16(h, 4 - j) : _mm256_srli_epi16(h, j - 4);
                    w[k] = _mm256_or_si256(w[k], _mm256_and_si256(h, m10));
                }
            }
            __m256i sc =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)q->sc[j]));
#ifndef KERN_QDOT_VNNI
            sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)); /* (scale, scale) */
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * j;
#ifdef KERN_QDOT_VNNI
                si[t] = _mm256_add_epi32(si[t], _mm256_mullo_epi32(dot8v(w, xs), sc));
#else
                __m256i v = q5 ? _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), sc),
                                                  _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), sc))
                               : _mm256_madd_epi16(mul8(w, xs, 8), sc);
                si[t] = _mm256_add_epi32(si[t], v);
#endif
            }
        }
        __m256i mi[8]; /* (min, min) pairs of sub-block j, row r in lane r */
        for (int j = 0; j < 8; j++) {
            mi[j] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)q->mn[j]));
            mi[j] = _mm256_or_si256(mi[j], _mm256_slli_epi32(mi[j], 16));
        }
        for (size_t t = 0; t < tt; t++) /* m[j] times bs[2 j] + bs[2 j + 1] */
            acc[t] = fold_q45k(acc[t], d, dm, si[t], mi,
                               (const kern__qx256 *)(const void *)(xq + t * xrb) + b);
    }
}

#ifndef KERN_QDOT_VNNI
/* (v, v) int16 pairs, row r in lane r, of 8 int8 at p: a sub-block's scales for madd */
INLINE __m256i pairs8(const int8_t *p)
{
    __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xaa);
}
#endif

/* The scaled sums of two 16-value sub-blocks of 8 rows, w[0..4) times scale s0 and w[4..8) times
 * s1, against the 32 activations at xs: with VNNI each sub-block's 4 quads by vpdpbusd, then one
 * vpmulld; otherwise int16 sums of n maddubs (2 or 4: what the values' size leaves room for)
 * before each madd by (scale, scale) pairs. Integers: the same sums either way. */
INLINE __m256i sub_pair(const __m256i w[8], const int8_t *xs, __m256i s0, __m256i s1, int n)
{
#ifdef KERN_QDOT_VNNI
    (void)n;
    __m256i a = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[0], bcast4(xs));
    __m256i c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[4], bcast4(xs + 16));
    for (int k = 1; k < 4; k++) {
        a = _mm256_dpbusd_epi32(a, w[k], bcast4(xs + 4 * k));
        c = _mm256_dpbusd_epi32(c, w[4 + k], bcast4(xs + 16 + 4 * k));
    }
    return _mm256_add_epi32(_mm256_mullo_epi32(a, s0), _mm256_mullo_epi32(c, s1));
#else
    __m256i u = _mm256_madd_epi16(mul8(w, xs, n), s0);
    __m256i z = _mm256_madd_epi16(mul8(w + 4, xs + 16, n), s1);
    if (n == 2) {
        u = _mm256_add_epi32(u, _mm256_madd_epi16(mul8(w + 2, xs + 8, 2), s0));
        z = _mm256_add_epi32(z, _mm256_madd_epi16(mul8(w + 6, xs + 24, 2), s1));
    }
    return _mm256_add_epi32(u, z);
#endif
}

/* KERN_QUANT_X8 Q6_K: grp_q6k's integers on the interleaved layout. Values 128 h + 32 s + l of
 * a block: the low (s < 2) or high nibble of ql[2 h + s % 2], bits 2 s, 2 s + 1 of qh[h] above
 * them; w[0..4) sub-block 8 h + 2 s, w[4..8) the next. The int16 form adds only 2 maddubs
 * (|2 * 2 * 63 * 127| < 2^15) before each madd; with VNNI vpdpbusd sums a sub-block's 4 quads in
 * int32 and one vpmulld scales them. Q = raw - 32, the 32 taken off through the sums of 16
 * activations, as there. */
INLINE void grp_q6kx8(const kern__q6kx8 *g, size_t nb, const uint8_t *xq, size_t xrb, size_t tt,
                      __m256 *acc, __m256i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (size_t b = 0; b < nb; b++) {
        const kern__q6kx8 *q = g + b;
        kern_prefetch_l2((const uint8_t *)q + KERN_PF_AHEAD, sizeof *q);
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->d));
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            int h = v / 4, sv = v % 4;
            __m256i w[8];
            for (int k = 0; k < 8; k++) {
                __m256i l = ld(q->ql[2 * h + sv % 2][k]), hb = ld(q->qh[h][k]);
                if (sv >= 2)
                    l = _mm256_srli_epi16(l, 4);
                /* bits 2 s, 2 s + 1 of each byte to bits 4, 5 (what crosses bytes is masked) */
                hb = sv == 0   ? _mm256_slli_epi16(hb, 4)
                     : sv == 1 ? _mm256_slli_epi16(hb, 2)
                     : sv == 3 ? _mm256_srli_epi16(hb, 2)
                               : hb;
                w[k] = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(hb, m30));
            }
            const int8_t *s0p = q->sc[2 * v], *s1p = q->sc[2 * v + 1];
#ifdef KERN_QDOT_VNNI
            __m256i s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)s0p));
            __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)s1p));
#else
            __m256i s0 = pairs8(s0p), s1 = pairs8(s1p);
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] = _mm256_add_epi32(si[t], sub_pair(w, xs, s0, s1, 2));
            }
        }
        __m256i pr[8]; /* lane r: (sc[2 k], sc[2 k + 1]) of row r, for the bias through bs */
        for (int k = 0; k < 8; k++) {
            __m256i lo =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)q->sc[2 * k]));
            __m256i hi = _mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(const void *)q->sc[2 * k + 1]));
            pr[k] = _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xaa);
        }
        for (size_t t = 0; t < tt; t++) /* sc[2 k] bs[2 k] + sc[2 k + 1] bs[2 k + 1] */
            acc[t] = fold_q6k(acc[t], d, si[t], pr,
                              (const kern__qx256 *)(const void *)(xq + t * xrb) + b);
    }
}

/* Sub-block j's scale of the 8 rows of a Q3_K group (int8, less 32), or of a Q2_K group the low
 * nibble (mn = 0) or high nibble (mn = 1: its min) of sc[j], as int32 lanes */
INLINE __m256i scale_q23k(const uint8_t *p, int q3, int j, int mn)
{
    const uint8_t *sc = p + (q3 ? offsetof(kern__q3kx8, sc) : offsetof(kern__q2kx8, sc)) + 8 * j;
    __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)sc);
    if (q3)
        return _mm256_cvtepi8_epi32(v);
    __m256i u = _mm256_cvtepu8_epi32(v);
    return mn ? _mm256_srli_epi32(u, 4) : _mm256_and_si256(u, _mm256_set1_epi32(0x0f));
}

/* KERN_QUANT_X8 Q2_K (q3 = 0) and Q3_K (q3 = 1), as grp_q6kx8. Values 128 h + 32 s + l of a
 * block (v = 4 h + s): bits 2 s of qs[h], for Q3_K bit v of hm[0] at bit 2 above them; w[0..4)
 * sub-block 2 v, w[4..8) the next. The int16 form adds 4 maddubs of values below 8 (|4 * 2 * 7 *
 * 127| < 2^15) before each madd; with VNNI vpdpbusd and one vpmulld, as there. Q3_K: Q = raw - 4,
 * the 4 taken off through the sums of 16 activations, folded as (d_w d_x) S. Q2_K: its scales
 * and mins are the low and high nibbles of sc[j]; S, then the mins' M through the same sums,
 * folded with -dmin: one_q23k's integers and order, the same bits. */
INLINE void grp_q23kx8(const uint8_t *g, size_t nb, int q3, const uint8_t *xq, size_t xrb,
                       size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    size_t bb = q3 ? sizeof(kern__q3kx8) : sizeof(kern__q2kx8);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * bb;
        const kern__q3kx8 *q3p = (const kern__q3kx8 *)(const void *)p;
        const kern__q2kx8 *q2p = (const kern__q2kx8 *)(const void *)p;
        const uint8_t(*qs)[8][32] = q3 ? q3p->qs : q2p->qs;
        kern_prefetch_l2(p + KERN_PF_AHEAD, bb);
        __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(q3 ? q3p->d : q2p->d)));
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            int h = v / 4, sv = v % 4;
            __m256i w[8];
            for (int k = 0; k < 8; k++) {
                __m256i l = _mm256_and_si256(_mm256_srli_epi16(ld(qs[h][k]), 2 * sv), m3);
                if (q3) { /* bit v of each byte to bit 2 (what crosses bytes is masked) */
                    __m256i hb = ld(q3p->hm[0][k]);
                    hb = v >= 2 ? _mm256_srli_epi16(hb, v - 2) : _mm256_slli_epi16(hb, 2 - v);
                    l = _mm256_or_si256(l, _mm256_and_si256(hb, m4));
                }
                w[k] = l;
            }
            __m256i s0 = scale_q23k(p, q3, 2 * v, 0), s1 = scale_q23k(p, q3, 2 * v + 1, 0);
#ifndef KERN_QDOT_VNNI
            s0 = _mm256_blend_epi16(s0, _mm256_slli_epi32(s0, 16), 0xaa); /* (scale, scale) */
            s1 = _mm256_blend_epi16(s1, _mm256_slli_epi32(s1, 16), 0xaa);
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] = _mm256_add_epi32(si[t], sub_pair(w, xs, s0, s1, 4));
            }
        }
        __m256i pr[8]; /* lane r: Q3_K's (sc[2 k], sc[2 k + 1]) of row r, or Q2_K's mins */
        for (int k = 0; k < 8; k++) {
            __m256i lo = scale_q23k(p, q3, 2 * k, 1), hi = scale_q23k(p, q3, 2 * k + 1, 1);
            pr[k] = _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xaa);
        }
        __m256 dm =
            q3 ? d
               : _mm256_xor_ps(
                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q2p->dmin)),
                     _mm256_set1_ps(-0.0f)); /* the min is subtracted */
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m256 dx = _mm256_set1_ps(x->d);
            __m256i B = bs_sum8(pr, x);
            if (q3) { /* sc[2 k] bs[2 k] + sc[2 k + 1] bs[2 k + 1], times the bias 4 */
                acc[t] =
                    fold8(acc[t], d, dx,
                          _mm256_cvtepi32_ps(_mm256_sub_epi32(si[t], _mm256_slli_epi32(B, 2))));
            } else {
                acc[t] = fold8(acc[t], d, dx, _mm256_cvtepi32_ps(si[t]));
                acc[t] = fold8(acc[t], dm, dx, _mm256_cvtepi32_ps(B));
            }
        }
    }
}

/* The sum over k < 8 of signed values w[k] (row r in lane r) times the activation quads at xs:
 * with VNNI w holds the values plus 128 (unsigned) and the caller takes 128 sx off; otherwise wa[k]
 * = |w[k]| meets x with w's signs (the sign trick), each maddubs widened by its own madd (|2 * 128
 * * 127| leaves no room to add two in int16). Exact int32 sums either way. */
INLINE __m256i sdot8(const __m256i w[8], const __m256i wa[8], const int8_t *xs)
{
#ifdef KERN_QDOT_VNNI
    (void)wa;
    return dot8v(w, xs);
#else
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        s = _mm256_add_epi32(
            s, _mm256_madd_epi16(
                   _mm256_maddubs_epi16(wa[k], _mm256_sign_epi8(bcast4(xs + 4 * k), w[k])),
                   _mm256_set1_epi16(1)));
    return s;
#endif
}

/* The levels of table lut (IQ4_XS's and IQ4_NL's, or MXFP4's) for sdot8: plus 128 with VNNI,
 * signed otherwise */
INLINE __m256i lut_levels8(int lut)
{
#ifdef KERN_QDOT_VNNI
    return _mm256_broadcastsi128_si256(kern__lut_levels(lut, 1));
#else
    return _mm256_broadcastsi128_si256(kern__lut_levels(lut, 0));
#endif
}

/* IQ4_XS's and IQ4_NL's */
INLINE __m256i iq4_levels8(void)
{
    return lut_levels8(KERN_LUT_IQ4);
}

/* KERN_QUANT_X8 IQ4_XS (kern/qdot.h's kern__iq4xsx8): sub-block j as a Q4_0 block of the group,
 * its nibbles' levels by one vpshufb, sdot8's exact sum (less 128 times its 32 activations' sum
 * with VNNI) times the sub-block's scales (vpmulld: the sums need all 32 bits), added in int32;
 * the block's S folded as (d_w d_x) S: the reference's integers and order. */
INLINE void grp_iq4xsx8(const kern__iq4xsx8 *g, size_t nb, const uint8_t *xq, size_t xrb, size_t tt,
                        __m256 *acc, __m256i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), levels = iq4_levels8();
    for (size_t b = 0; b < nb; b++) {
        const kern__iq4xsx8 *q = g + b;
        kern_prefetch_l2((const uint8_t *)q + KERN_PF_AHEAD, sizeof *q);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i w[8], wa[8];
            for (int k = 0; k < 4; k++) {
                __m256i v = ld(q->qs[j][k]);
                w[k] = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, m4));
                w[4 + k] =
                    _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            for (int k = 0; k < 8; k++)
                wa[k] = _mm256_abs_epi8(w[k]); /* unused with VNNI */
            __m256i sc =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)q->sc[j]));
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                __m256i s = sdot8(w, wa, x->q + 32 * j);
#ifdef KERN_QDOT_VNNI
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(128 * (x->bs[2 * j] + x->bs[2 * j + 1])));
#endif
                si[t] = _mm256_add_epi32(si[t], _mm256_mullo_epi32(s, sc));
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->d));
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            acc[t] = fold8(acc[t], d, _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(si[t]));
        }
    }
}

/* KERN_QUANT_X8 Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and Q8_0 (kern/qdot.h's kern__q40x8 ..
 * kern__q80x8: bb bytes a block of the group, m at mo, qh at ho, qs at qo; 0: none; the rows'
 * scales the f16 d at 0, or MXFP4's E8M0 bytes e there (e8)): per block, qs[k]'s low nibbles are
 * values 4 k .. 4 k + 3 of the 8 rows (row r in lane r), the high ones values 16 + 4 k ..: w[0 ..
 * 8) meet the activation quads in order; bit k of qh, moved to bit 4, is w[k]'s fifth bit;
 * IQ4_NL's and MXFP4's (lut) values are the levels their nibbles look up in their tables; Q8_0's
 * (s8) are qs[k] whole. The int16 form sums 8 maddubs of 4-bit values (|8 * 2 * 15 * 127| <
 * 2^15), 4 of 5-bit ones (|4 * 2 * 31 * 127| < 2^15), then madd by ones; signed values (IQ4_NL,
 * MXFP4, Q8_0) meet x by the sign trick, each maddubs madd'ed alone (|2 * 128 * 127| leaves no
 * room for two). With VNNI 8 vpdpbusd, the signed values plus 128 (unsigned: the levels so looked
 * up, Q8_0's w ^ 0x80) with 128 sx taken off after. S = that - bias sx (Q = raw - bias through
 * the block's activation sum), folded as (d_w d_x) S, then for a min (m d_x) sx: the reference's
 * integers and order (grp_leg and grp_s8 over the file's rows). */
INLINE void grp_legx8(const uint8_t *g, size_t nb, size_t bb, size_t mo, size_t ho, size_t qo,
                      int bias, int lut, int s8, int e8, const uint8_t *xq, size_t xrb, size_t tt,
                      __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    const __m256i levels = lut_levels8(lut);
#ifdef KERN_QDOT_VNNI
    bias += lut || s8 ? 128 : 0;
#endif
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = g + b * bb;
        kern_prefetch_l2(q + KERN_PF_AHEAD, bb);
        __m256 d = e8 ? kern__e8m0x8(q)
                      : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q));
        __m256 dm = mo ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(q + mo)))
                       : _mm256_setzero_ps();
        __m256i w[8];
        if (s8) {
            for (int k = 0; k < 8; k++) {
                w[k] = ld(q + qo + 32 * k);
#ifdef KERN_QDOT_VNNI
                w[k] = _mm256_xor_si256(w[k], _mm256_set1_epi8((char)0x80));
#endif
            }
        } else {
            for (int k = 0; k < 4; k++) {
                __m256i v = ld(q + qo + 32 * k);
                w[k] = _mm256_and_si256(v, m4);
                w[4 + k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
        }
        if (ho) { /* bit k of each byte to bit 4 (what crosses bytes is masked) */
            __m256i h = ld(q + ho);
            for (int k = 0; k < 8; k++) {
                __m256i hk = k < 4 ? _mm256_slli_epi16(h, 4 - k) : _mm256_srli_epi16(h, k - 4);
                w[k] = _mm256_or_si256(w[k], _mm256_and_si256(hk, m10));
            }
        }
        if (lut)
            for (int k = 0; k < 8; k++)
                w[k] = _mm256_shuffle_epi8(levels, w[k]);
#ifndef KERN_QDOT_VNNI
        __m256i wa[8]; /* signed values: |w|, for the sign trick */
        for (int k = 0; k < 8; k++)
            wa[k] = lut || s8 ? _mm256_abs_epi8(w[k]) : w[k];
#endif
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            const int8_t *xs = (const int8_t *)(const void *)(xr + KERN_QX32_Q(nb) + 32 * b);
#ifdef KERN_QDOT_VNNI
            __m256i s = dot8v(w, xs);
#else
            const __m256i one = _mm256_set1_epi16(1);
            __m256i s;
            if (lut || s8) {
                s = sdot8(w, wa, xs);
            } else if (ho) {
                s = _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), one),
                                     _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), one));
            } else {
                s = _mm256_madd_epi16(mul8(w, xs, 8), one);
            }
#endif
            acc[t] = fold_leg8(acc[t], s, d, dm, bias, mo != 0, xr, nb, b);
        }
    }
}

/* Group g of w (KERN_QUANT_X8) times activation rows xq[0 .. tt). */
INLINE void grp_x8(const kern_mat *w, size_t g, size_t nb, const uint8_t *xq, size_t xrb, size_t tt,
                   __m256 *acc, __m256i *si)
{
#define LEG(id, T, file, mo, ho, nq, gm, gh, bias, lut, s8, e8)                                    \
    if (w->qtype == id)                                                                            \
        grp_legx8((const uint8_t *)w->data + g * nb * sizeof(T), nb, sizeof(T), gm, gh,            \
                  offsetof(T, qs), bias, lut, s8, e8, xq, xrb, tt, acc);                           \
    else
    KERN_LEG_X8_TYPES(LEG)
#undef LEG
    if (w->qtype == KERN_GGML_Q6_K)
        grp_q6kx8((const kern__q6kx8 *)w->data + g * nb, nb, xq, xrb, tt, acc, si);
    else if (w->qtype == KERN_GGML_IQ4_XS)
        grp_iq4xsx8((const kern__iq4xsx8 *)w->data + g * nb, nb, xq, xrb, tt, acc, si);
    else if (w->qtype == KERN_GGML_Q3_K)
        grp_q23kx8((const uint8_t *)w->data + g * nb * sizeof(kern__q3kx8), nb, 1, xq, xrb, tt, acc,
                   si);
    else if (w->qtype == KERN_GGML_Q2_K)
        grp_q23kx8((const uint8_t *)w->data + g * nb * sizeof(kern__q2kx8), nb, 0, xq, xrb, tt, acc,
                   si);
    else if (w->qtype == KERN_GGML_Q5_K)
        grp_q45kx8((const uint8_t *)w->data + g * nb * sizeof(kern__q5kx8), nb, 1, xq, xrb, tt, acc,
                   si);
    else
        grp_q45kx8((const uint8_t *)w->data + g * nb * sizeof(kern__q4kx8), nb, 0, xq, xrb, tt, acc,
                   si);
}

/* qmatmul over KERN_QUANT_X8: every batch size, 8 outputs a group (the wanted ones stored). */
void QMATMUL_X8(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), nb = w->n_in / (fmt == KERN_QX_32 ? 32 : 256);
    __m256 acc[TT];
    __m256i si[TT];
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        for (size_t g = n0 / 8; 8 * g < n1; g++) {
            for (size_t t = 0; t < tt; t++)
                acc[t] = _mm256_setzero_ps();
#ifdef KERN_QDOT_VNNI
            /* up to KERN_X8_FEW_ROWS rows of x (a decode step of a few sequences) as constants,
             * so that their sums stay in the 32 registers (kern/qdot.h says why these rows come
             * here) */
            _Static_assert(KERN_X8_FEW_ROWS == 4, "a case for each of the few rows");
            switch (tt) {
            case 1: grp_x8(w, g, nb, x, xrb, 1, acc, si); break;
            case 2: grp_x8(w, g, nb, x, xrb, 2, acc, si); break;
            case 3: grp_x8(w, g, nb, x, xrb, 3, acc, si); break;
            case 4: grp_x8(w, g, nb, x, xrb, 4, acc, si); break;
            default: grp_x8(w, g, nb, x, xrb, tt, acc, si);
            }
#else
            /* one row of x (a decode step) as a constant, so that its sums stay in registers
             * (more rows as constants spill the 16: Q6_K and Q4_0 at 2 rows were slower) */
            if (tt == 1)
                grp_x8(w, g, nb, x, xrb, 1, acc, si);
            else
                grp_x8(w, g, nb, x, xrb, tt, acc, si);
#endif
            size_t c0 = n0 > 8 * g ? n0 - 8 * g : 0, c1 = n1 - 8 * g < 8 ? n1 - 8 * g : 8;
            for (size_t t = 0; t < tt; t++) {
                float *o = out + (t0 + t) * ldo + 8 * g;
                if (c0 == 0 && c1 == 8) {
                    _mm256_storeu_ps(o, acc[t]);
                } else {
                    float l[8];
                    _mm256_storeu_ps(l, acc[t]);
                    memcpy(o + c0, l + c0, (c1 - c0) * sizeof(float));
                }
            }
        }
    }
}
