/* AVX-512 integer products (kern/qdot.h): kern/qdot_avx2.c's tile kernels widened to 16 weight
 * rows, one per 32-bit lane of a zmm, each lane's float sum the reference's single accumulator.
 *
 * Per block each row's values are unpacked into a ymm exactly as qdot_avx2.c does, rows r and
 * r + 8 are paired in one zmm, and a 16 x 8 transpose of 32-bit lanes (tr16) leaves lane r of
 * vector k holding values 4k .. 4k + 3 of row r. The maddubs / int16 sums / one madd per
 * sub-block are AVX2's on twice the rows, so the integer bounds qdot_avx2.c states hold as they
 * are; where the CPU has VNNI, all but Q5_K and Q6_K sum each row's quads with vpdpbusd instead
 * (and the K-quants' scales come in by vpdpwssd). A tile of one activation row (a decode step) goes
 * to kern__qmatmul_avx2, which follows the same contract, so the bits do not change. */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_zmm.h"

#include <string.h>

/* v[i] = pair(row i, row i + 8) of 8 int32 each  :=  v[k] whose lane r is int32 k of row r: the
 * 8 x 8 transpose of qdot_avx2.c's tr8 in each 256-bit half (its in-lane unpacks are the same
 * instructions on zmm), the last step's 128-bit moves as one two-source permute per vector. */
INLINE void tr16(__m512i v[8])
{
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int i = 0; i < 4; i++) {
        __m512i a = u[i], b = u[i + 4];
        v[i] = _mm512_permutex2var_epi64(a, lo, b);
        v[i + 4] = _mm512_permutex2var_epi64(a, hi, b);
    }
}

/* w[0..16) (one ymm per row) paired and transposed into v[0..8) */
INLINE void tr16y(const __m256i w[16], __m512i v[8])
{
    for (int r = 0; r < 8; r++)
        v[r] = pair(w[r], w[r + 8]);
    tr16(v);
}

INLINE short h16(const uint8_t *q)
{
    uint16_t h;
    memcpy(&h, q, 2);
    return (short)h;
}

/* The f16 at p[r] + off of each of the 16 rows, as floats in lanes 0..15: built in registers,
 * since 16 two-byte stores read back as one vector cannot be forwarded, and the load would wait
 * for them to retire. */
INLINE __m512 f16x16(const uint8_t *const p[16], size_t off)
{
    __m128i a = _mm_setr_epi16(h16(p[0] + off), h16(p[1] + off), h16(p[2] + off), h16(p[3] + off),
                               h16(p[4] + off), h16(p[5] + off), h16(p[6] + off), h16(p[7] + off));
    __m128i c =
        _mm_setr_epi16(h16(p[8] + off), h16(p[9] + off), h16(p[10] + off), h16(p[11] + off),
                       h16(p[12] + off), h16(p[13] + off), h16(p[14] + off), h16(p[15] + off));
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(a)), _mm256_cvtph_ps(c), 1);
}

/* While block b of a group of 16 rows is read, the next group's bytes of block b (the same share
 * of its contiguous 16 rows) are fetched: 16 short streams start each group, which the hardware
 * prefetchers learn too late (qdot_avx2.c's prefetch_next). */
INLINE void prefetch_next(const uint8_t *next, size_t b, size_t bb)
{
    for (size_t o = 16 * bb * b; o < 16 * bb * (b + 1); o += 64)
        _mm_prefetch((const char *)(next + o), _MM_HINT_T0);
}

/* Block b of the 16 rows: p[r] its start in row r, w[k] lane r values 4k .. 4k + 3 of row r. */
INLINE void unpack_q8_0(const uint8_t *const rows[16], size_t b, const uint8_t *p[16], __m512i w[8])
{
    __m256i y[16];
    for (int r = 0; r < 16; r++) {
        p[r] = rows[r] + 34 * b;
        y[r] = ld(p[r] + 2);
    }
    tr16y(y, w);
}

/* Q8_0 (34-byte blocks: d | 32 int8): maddubs takes unsigned weights, so |w| meets x negated
 * where w < 0 (AVX-512 has no vpsignb: a masked subtraction from 0; |x| <= 127, so it is exact;
 * where w = 0 the product is 0 either way); each maddubs is widened by its own madd, as in
 * qdot_avx2.c (products up to 128 * 127 leave no room to add two in int16). */
INLINE void grp_q8_0t(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                      const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    const __m512i one = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 34);
        const uint8_t *p[16];
        __m512i w[8], wa[8];
        __mmask64 neg[8];
        unpack_q8_0(rows, b, p, w);
        for (int k = 0; k < 8; k++) {
            wa[k] = _mm512_abs_epi8(w[k]);
            neg[k] = _mm512_movepi8_mask(w[k]);
        }
        __m512 dw = f16x16(p, 0);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            const int8_t *xs = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
            __m512i S = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i xb = bcast4(xs + 4 * k);
                xb = _mm512_mask_sub_epi8(xb, neg[k], zero, xb);
                S = _mm512_add_epi32(S, madd16(_mm512_maddubs_epi16(wa[k], xb), one));
            }
            float dx;
            memcpy(&dx, xr + 4 * b, 4);
            acc[t] = fold16(acc[t], dw, _mm512_set1_ps(dx), cvt_ps(S));
        }
    }
}

/* The fifth bits of a Q5_0 / Q5_1 block (qh: bit i for value i) as 0x10 in byte i. */
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

/* A Q4_0 / Q4_1 / Q5_0 / Q5_1 block's 32 raw values at p, value i in byte i: qs at qo, qh at ho (ho
 * < 0: none), as qdot_avx2.c's raw32. */
INLINE __m256i raw32(const uint8_t *p, int qo, int ho)
{
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p + qo));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return ho < 0 ? w : _mm256_or_si256(w, bits5(p + ho));
}

INLINE void unpack_leg(const uint8_t *const rows[16], size_t b, int bb, int qo, int ho,
                       const uint8_t *p[16], __m512i w[8])
{
    __m256i y[16];
    for (int r = 0; r < 16; r++) {
        p[r] = rows[r] + (size_t)bb * b;
        y[r] = raw32(p[r], qo, ho);
    }
    tr16y(y, w);
}

/* Q4_0 (bb 18: d | qs (16), value j in the low nibble of qs[j], j + 16 in its high one; qo 2, no
 * qh, bias 8), Q4_1 (20: qo 4, min at 2), Q5_0 (22: qh at 2, qs at 6; bias 16) and Q5_1 (24: min
 * at 2, qh at 4, qs at 8); the bias comes off through the block sums of x, the min's term
 * (m * dx) * sx follows the scale's. The 5-bit values add 4 maddubs in int16, the 4-bit ones 8
 * (qdot_avx2.c's grp_q4_0 and grp_leg). */
INLINE void grp_leg(const uint8_t *const rows[16], const uint8_t *next, size_t nb, int bb, int qo,
                    int ho, int bias, int mo, const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    const __m512i one = _mm512_set1_epi16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[16];
        __m512i w[8];
        unpack_leg(rows, b, bb, qo, ho, p, w);
        __m512 dw = f16x16(p, 0), dm = mo ? f16x16(p, (size_t)mo) : _mm512_setzero_ps();
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            const int8_t *xs = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
            __m512i S = ho < 0 ? madd16(mul16(w, xs, 8), one)
                               : _mm512_add_epi32(madd16(mul16(w, xs, 4), one),
                                                  madd16(mul16(w + 4, xs + 16, 4), one));
            int16_t sx;
            float dx;
            memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
            memcpy(&dx, xr + 4 * b, 4);
            if (bias)
                S = _mm512_sub_epi32(S, _mm512_set1_epi32(bias * sx));
            __m512 vdx = _mm512_set1_ps(dx);
            acc[t] = fold16(acc[t], dw, vdx, cvt_ps(S));
            if (mo)
                acc[t] = fold16(acc[t], dm, vdx, _mm512_set1_ps((float)sx));
        }
    }
}

/* Q2_K / Q3_K scales and raw values, as qdot_avx2.c's scales_q3k, raw_q23k and scales_q23k. */
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

/* a 32-bit lane's low (dup0) / high (dup1) int16 in both of its halves */
INLINE __m512i dup16(int hi)
{
    const __m128i d0 = _mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m128i d1 = _mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
    return _mm512_broadcast_i32x4(hi ? d1 : d0);
}

/* Block b of the 16 rows of a Q2_K (q3 = 0) / Q3_K (q3 = 1) group: p[r] its start in row r,
 * the scales transposed (lane r of pr[k] is (sc[2 k], sc[2 k + 1]) of row r, of pm[k] its
 * mins, Q2_K only); returns the rows' d. Shared by the BW and the VNNI tile kernels. */
INLINE __m512 prep_q23k(const uint8_t *const rows[16], size_t b, size_t bb, int q3,
                        const uint8_t *p[16], __m512i pr[8], __m512i pm[8])
{
    __m256i ys[16], ym[16];
    for (int r = 0; r < 16; r++) {
        p[r] = rows[r] + b * bb;
        scales_q23k(p[r], q3, &ys[r], &ym[r]);
    }
    tr16y(ys, pr);
    if (!q3)
        tr16y(ym, pm);
    return f16x16(p, q3 ? 108 : 80);
}

/* The contract's fold of block b for activation rows t < tt, from their scaled sums si[t]:
 * Q3_K's bias of 4 (or Q2_K's mins) through the sums of x, then d's term and the mins' term. */
INLINE void fold_q23k(const uint8_t *const p[16], int q3, const __m512i pr[8], const __m512i pm[8],
                      __m512 d, const uint8_t *xq, size_t xrb, size_t b, size_t tt, __m512 *acc,
                      const __m512i *si)
{
    __m512 dm = q3 ? _mm512_setzero_ps() : _mm512_xor_ps(f16x16(p, 82), _mm512_set1_ps(-0.0f));
    for (size_t t = 0; t < tt; t++) {
        const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
        __m512i B = _mm512_setzero_si512(); /* the bias's or the mins' sum through bs */
        for (int k = 0; k < 8; k++)
            B = _mm512_add_epi32(B, madd16(q3 ? pr[k] : pm[k], bcast4(&x->bs[2 * k])));
        __m512i S = q3 ? _mm512_sub_epi32(si[t], _mm512_slli_epi32(B, 2)) : si[t];
        __m512 dx = _mm512_set1_ps(x->d);
        acc[t] = fold16(acc[t], d, dx, cvt_ps(S));
        if (!q3)
            acc[t] = fold16(acc[t], dm, dx, cvt_ps(B));
    }
}

/* Q2_K (q3 = 0) / Q3_K (q3 = 1) as qdot_avx2.c's grp_q23k: sub-blocks of 16, values 0..7 add 4
 * maddubs in int16. */
INLINE void grp_q23k(const uint8_t *const rows[16], const uint8_t *next, size_t nb, int q3,
                     const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m512i dup0 = dup16(0), dup1 = dup16(1);
    size_t bb = q3 ? 110 : 84;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[16];
        __m512i pr[8], pm[8];
        __m512 d = prep_q23k(rows, b, bb, q3, p, pr, pm);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int v = 0; v < 8; v++) { /* values 32 v .. 32 v + 31: sub-blocks 2 v, 2 v + 1 */
            __m256i y[16];
            for (int r = 0; r < 16; r++)
                y[r] = raw_q23k(p[r], q3, v);
            __m512i w[8];
            tr16y(y, w);
            __m512i s0 = _mm512_shuffle_epi8(pr[v], dup0), s1 = _mm512_shuffle_epi8(pr[v], dup1);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] =
                    _mm512_add_epi32(si[t], _mm512_add_epi32(madd16(mul16(w, xs, 4), s0),
                                                             madd16(mul16(w + 4, xs + 16, 4), s1)));
            }
        }
        fold_q23k(p, q3, pr, pm, d, xq, xrb, b, tt, acc, si);
    }
}

/* Block b's scales: p[r] its start in row r; per row sc[0..7] | m[0..7] as int16, each doubled
 * into a 32-bit lane, transposed so that lane r of sc[j], mi[j] holds sub-block j's scale and
 * min of row r. */
INLINE void scales_q45k(const uint8_t *const rows[16], size_t b, size_t bb, const uint8_t *p[16],
                        __m512i sc[8], __m512i mi[8])
{
    __m256i ya[16], yc[16];
    for (int r = 0; r < 16; r++) {
        p[r] = rows[r] + b * bb;
        __m256i e = _mm256_cvtepu8_epi16(scales_k4(p[r] + 4));
        ya[r] = _mm256_unpacklo_epi16(e, e);
        yc[r] = _mm256_unpackhi_epi16(e, e);
    }
    __m512i a[8], c[8];
    tr16y(ya, a);
    tr16y(yc, c);
    for (int j = 0; j < 4; j++) {
        sc[j] = a[j];
        sc[4 + j] = c[j];
        mi[j] = a[4 + j];
        mi[4 + j] = c[4 + j];
    }
}

/* Sub-block j's 32 values (0..15, Q5_K's 0..31) of the 16 blocks at p, transposed. */
INLINE void unpack_q45k(const uint8_t *const p[16], int q5, int j, __m512i w[8])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    size_t qs = q5 ? 48 : 16;
    __m256i y[16];
    for (int r = 0; r < 16; r++) {
        __m256i q = ld(p[r] + qs + 32 * (j / 2));
        y[r] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
        if (q5) {
            __m256i h = _mm256_srl_epi16(ld(p[r] + 16), _mm_cvtsi32_si128(j));
            y[r] = _mm256_or_si256(y[r], _mm256_slli_epi16(_mm256_and_si256(h, m1), 4));
        }
    }
    tr16y(y, w);
}

/* Q4_K (q5 = 0: d | dmin | scales (12) | qs (128)) and Q5_K (q5 = 1: d | dmin | scales | qh (32) |
 * qs), as qdot_avx2.c's grp_q45k. si: tt int32 vectors of scratch. */
INLINE void grp_q45k(const uint8_t *const rows[16], const uint8_t *next, size_t nb, int q5,
                     const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    size_t bb = q5 ? 176 : 144;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[16];
        __m512i sc[8], mi[8];
        scales_q45k(rows, b, bb, p, sc, mi);
        __m512 d = f16x16(p, 0), dm = f16x16(p, 2);
        dm = _mm512_xor_ps(dm, _mm512_set1_ps(-0.0f)); /* the min is subtracted */
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
            unpack_q45k(p, q5, j, w);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * j;
                __m512i v;
                if (q5)
                    v = _mm512_add_epi32(madd16(mul16(w, xs, 4), sc[j]),
                                         madd16(mul16(w + 4, xs + 16, 4), sc[j]));
                else
                    v = madd16(mul16(w, xs, 8), sc[j]);
                si[t] = _mm512_add_epi32(si[t], v);
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512i M = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) /* m[j] times bs[2 j] + bs[2 j + 1] */
                M = _mm512_add_epi32(M, madd16(mi[j], bcast4(&x->bs[2 * j])));
            __m512 dx = _mm512_set1_ps(x->d);
            __m512 s1 = fold16(acc[t], d, dx, cvt_ps(si[t]));
            acc[t] = fold16(s1, dm, dx, cvt_ps(M));
        }
    }
}

/* Q6_K: ql (128) | qh (64) | scales (16, int8) | d (2), Q = raw - 32 taken off through the sums
 * of 16 activations, as qdot_avx2.c's grp_q6k. */
INLINE void grp_q6k(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                    const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const __m512i dup0 = dup16(0), dup1 = dup16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 210);
        const uint8_t *p[16];
        __m256i ys[16];
        for (int r = 0; r < 16; r++) {
            p[r] = rows[r] + b * 210;
            ys[r] =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p[r] + 192)));
        }
        __m512i pr[8]; /* transposed: lane r of pr[k] is (sc[2 k], sc[2 k + 1]) of row r */
        tr16y(ys, pr);
        __m512 d = f16x16(p, 208);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int v = 0; v < 8; v++) { /* values 32 v .. 32 v + 31: sub-blocks 2 v, 2 v + 1 */
            int h = v / 4, s = v % 4;
            __m256i y[16];
            for (int r = 0; r < 16; r++) {
                __m256i l = ld(p[r] + 64 * h + 32 * (s % 2)), qh = ld(p[r] + 128 + 32 * h);
                if (s >= 2)
                    l = _mm256_srli_epi16(l, 4);
                qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s));
                y[r] = _mm256_or_si256(_mm256_and_si256(l, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            }
            __m512i w[8];
            tr16y(y, w);
            __m512i s0 = _mm512_shuffle_epi8(pr[v], dup0), s1 = _mm512_shuffle_epi8(pr[v], dup1);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                __m512i u = _mm512_add_epi32(madd16(mul16(w, xs, 2), s0),
                                             madd16(mul16(w + 2, xs + 8, 2), s0));
                __m512i z = _mm512_add_epi32(madd16(mul16(w + 4, xs + 16, 2), s1),
                                             madd16(mul16(w + 6, xs + 24, 2), s1));
                si[t] = _mm512_add_epi32(si[t], _mm512_add_epi32(u, z));
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512i B = _mm512_setzero_si512();
            for (int k = 0; k < 8; k++) /* sc[2 k] bs[2 k] + sc[2 k + 1] bs[2 k + 1] */
                B = _mm512_add_epi32(B, madd16(pr[k], bcast4(&x->bs[2 * k])));
            __m512i S = _mm512_sub_epi32(si[t], _mm512_slli_epi32(B, 5));
            acc[t] = fold16(acc[t], d, _mm512_set1_ps(x->d), cvt_ps(S));
        }
    }
}

/* ---- VNNI (vpdpbusd: u8 x s8 quads summed into each int32 lane, exact, no saturation) ----
 * Only the native build has them: the avx512 table requires F/BW/VL/DQ alone, so these are
 * compiled for VNNI by attribute and chosen per call where the CPU has it; the emulated copy
 * runs the BW kernels above, so both forms are held to the reference on this machine. */
#ifndef KERN_AVX512_EMULATED
#define VNNI static __attribute__((target("avx512vnni")))

/* sum over k < n of the quads w[k] . x[4k .. 4k + 3], added to s */
INLINE __attribute__((target("avx512vnni"))) __m512i dot16(__m512i s, const __m512i *w,
                                                           const int8_t *x, int n)
{
    for (int k = 0; k < n; k++)
        s = _mm512_dpbusd_epi32(s, w[k], bcast4(x + 4 * k));
    return s;
}

/* Block b of 16 rows whose 32 values w (transposed quads) are the weights plus 128, unsigned,
 * times activation rows xq[0 .. tt) (KERN_QX_32): S = the vpdpbusd sum less 128 sx, folded with
 * the rows' scales dw (Q8_0 and IQ4_NL) */
INLINE __attribute__((target("avx512vnni"))) void fold_u128(const __m512i w[8], __m512 dw,
                                                            const uint8_t *xq, size_t xrb,
                                                            size_t tt, size_t nb, size_t b,
                                                            __m512 *acc)
{
    for (size_t t = 0; t < tt; t++) {
        const uint8_t *xr = xq + t * xrb;
        __m512i S =
            dot16(_mm512_setzero_si512(), w, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), 8);
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        S = _mm512_sub_epi32(S, _mm512_set1_epi32(128 * sx));
        acc[t] = fold16(acc[t], dw, _mm512_set1_ps(dx), cvt_ps(S));
    }
}

/* Q8_0: w + 128 (w ^ 0x80) is unsigned, and sum (w + 128) x = S + 128 sx. */
VNNI void grpv_q8_0(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                    const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 34);
        const uint8_t *p[16];
        __m512i w[8];
        unpack_q8_0(rows, b, p, w);
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_xor_si512(w[k], flip);
        fold_u128(w, f16x16(p, 0), xq, xrb, tt, nb, b, acc);
    }
}

/* Q4_0, Q4_1, Q5_0, Q5_1 as grp_leg, the 32 values' products in one int32 sum per row. */
VNNI void grpv_leg(const uint8_t *const rows[16], const uint8_t *next, size_t nb, int bb, int qo,
                   int ho, int bias, int mo, const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[16];
        __m512i w[8];
        unpack_leg(rows, b, bb, qo, ho, p, w);
        __m512 dw = f16x16(p, 0), dm = mo ? f16x16(p, (size_t)mo) : _mm512_setzero_ps();
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m512i S = dot16(_mm512_setzero_si512(), w,
                              (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), 8);
            int16_t sx;
            float dx;
            memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
            memcpy(&dx, xr + 4 * b, 4);
            if (bias)
                S = _mm512_sub_epi32(S, _mm512_set1_epi32(bias * sx));
            __m512 vdx = _mm512_set1_ps(dx);
            acc[t] = fold16(acc[t], dw, vdx, cvt_ps(S));
            if (mo)
                acc[t] = fold16(acc[t], dm, vdx, _mm512_set1_ps((float)sx));
        }
    }
}

/* Q4_K: each half sub-block's 16 products in int32 by vpdpbusd, |sum| <= 16 * 15 * 127 = 30480,
 * so its low 16 bits are it as an int16 and vpdpwssd against (scale, 0) pairs adds scale * sum:
 * 10 multiplies per 32 values and row of x, no int16 adds (Q5_K's 31s would not fit). */
VNNI void grpv_q4k(const uint8_t *const rows[16], const uint8_t *next, size_t nb, const uint8_t *xq,
                   size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 144);
        const uint8_t *p[16];
        __m512i sc[8], mi[8];
        scales_q45k(rows, b, 144, p, sc, mi);
        __m512 d = f16x16(p, 0), dm = f16x16(p, 2);
        dm = _mm512_xor_ps(dm, _mm512_set1_ps(-0.0f)); /* the min is subtracted */
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
            unpack_q45k(p, 0, j, w);
            __m512i s0 = _mm512_and_si512(sc[j], _mm512_set1_epi32(0xffff));
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * j;
                __m512i lo = dot16(_mm512_setzero_si512(), w, xs, 4);
                __m512i hi = dot16(_mm512_setzero_si512(), w + 4, xs + 16, 4);
                si[t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(si[t], lo, s0), hi, s0);
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512i M = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) /* m[j] times bs[2 j] + bs[2 j + 1] */
                M = _mm512_add_epi32(M, madd16(mi[j], bcast4(&x->bs[2 * j])));
            __m512 dx = _mm512_set1_ps(x->d);
            __m512 s1 = fold16(acc[t], d, dx, cvt_ps(si[t]));
            acc[t] = fold16(s1, dm, dx, cvt_ps(M));
        }
    }
}

/* Q2_K / Q3_K as grp_q23k: a 16-value sub-block's products sum to at most 16 * 7 * 127 = 14224
 * in magnitude, so vpdpbusd's int32 is its own low int16 and vpdpwssd against (scale, 0) pairs
 * adds scale * sum exactly (grpv_q4k's form). */
VNNI void grpv_q23k(const uint8_t *const rows[16], const uint8_t *next, size_t nb, int q3,
                    const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m512i low = _mm512_set1_epi32(0xffff);
    size_t bb = q3 ? 110 : 84;
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, bb);
        const uint8_t *p[16];
        __m512i pr[8], pm[8];
        __m512 d = prep_q23k(rows, b, bb, q3, p, pr, pm);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int v = 0; v < 8; v++) { /* values 32 v .. 32 v + 31: sub-blocks 2 v, 2 v + 1 */
            __m256i y[16];
            for (int r = 0; r < 16; r++)
                y[r] = raw_q23k(p[r], q3, v);
            __m512i w[8];
            tr16y(y, w);
            /* (sc[2 v], 0) and (sc[2 v + 1], 0) pairs */
            __m512i s0 = _mm512_and_si512(pr[v], low), s1 = _mm512_srli_epi32(pr[v], 16);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                __m512i lo = dot16(_mm512_setzero_si512(), w, xs, 4);
                __m512i hi = dot16(_mm512_setzero_si512(), w + 4, xs + 16, 4);
                si[t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(si[t], lo, s0), hi, s1);
            }
        }
        fold_q23k(p, q3, pr, pm, d, xq, xrb, b, tt, acc, si);
    }
}

/* The IQ4 types: the raw nibbles as the legacy types unpack them, then their levels plus 128
 * (unsigned, 1 .. 241) by one vpshufb; sum (lut + 128) x = S + 128 sx, as for Q8_0. */
INLINE __m512i iq4_lut_u(void)
{
    return _mm512_broadcast_i32x4(kern__iq4_levels(1));
}

VNNI void grpv_iq4nl(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                     const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    const __m512i lut = iq4_lut_u();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 18);
        const uint8_t *p[16];
        __m512i w[8];
        unpack_leg(rows, b, 18, 2, -1, p, w);
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_shuffle_epi8(lut, w[k]);
        fold_u128(w, f16x16(p, 0), xq, xrb, tt, nb, b, acc);
    }
}

/* IQ4_XS (qdot_avx2.c's grp_iq4xs layout): sub-block j's 32 values are a legacy block's nibbles
 * at 8 + 16 j; its sum less 128 times its 32 activations' sum, times its scale (vpmulld: the
 * sums need all 32 bits), added in int32. */
VNNI void grpv_iq4xs(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                     const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m512i lut = iq4_lut_u();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const uint8_t *p[16];
        /* the 16 rows' 8 scales (int16, row r at 8 r) in 4 zmm; scj gathers scale j of each */
        int16_t s16[16][8];
        for (int r = 0; r < 16; r++)
            _mm_storeu_si128((__m128i *)(void *)s16[r], kern__iq4xs_scales(rows[r] + 136 * b));
        __m512i z[4];
        for (int i = 0; i < 4; i++)
            z[i] = _mm512_loadu_si512((const void *)s16[4 * i]);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
            unpack_leg(rows, b, 136, 8 + 16 * j, -1, p, w);
            for (int k = 0; k < 8; k++)
                w[k] = _mm512_shuffle_epi8(lut, w[k]);
            const __m512i idx = _mm512_add_epi16(
                _mm512_set1_epi16((short)j),
                _mm512_zextsi128_si512(_mm_setr_epi16(0, 8, 16, 24, 32, 40, 48, 56)));
            __m512i lo = _mm512_permutex2var_epi16(z[0], idx, z[1]); /* rows 0-7, words 0-7 */
            __m512i hi = _mm512_permutex2var_epi16(z[2], idx, z[3]); /* rows 8-15 */
            __m512i scj = _mm512_cvtepi16_epi32(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm512_castsi512_si128(lo)), _mm512_castsi512_si128(hi), 1));
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                __m512i s = dot16(_mm512_setzero_si512(), w, x->q + 32 * j, 8);
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * (x->bs[2 * j] + x->bs[2 * j + 1])));
                si[t] = _mm512_add_epi32(si[t], _mm512_mullo_epi32(s, scj));
            }
        }
        __m512 d = f16x16(p, 0);
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            acc[t] = fold16(acc[t], d, _mm512_set1_ps(x->d), cvt_ps(si[t]));
        }
    }
}

/* The VNNI tile kernel for kind (kern__qmatmul_avx512's), if there is one: 0 if not. Q5_K and
 * Q6_K have none: their sub-block sums do not fit an int16, and the scale by vpmulld after
 * vpdpbusd measured slower than maddubs, int16 sums and one madd. */
VNNI int grpv(int kind, const uint8_t *const rows[16], const uint8_t *next, size_t K,
              const uint8_t *x, size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    switch (kind) {
    case 0: grpv_q8_0(rows, next, K / 32, x, xrb, tt, acc); return 1;
    case KERN_GGML_Q4_0: grpv_leg(rows, next, K / 32, 18, 2, -1, 8, 0, x, xrb, tt, acc); return 1;
    case KERN_GGML_Q4_1: grpv_leg(rows, next, K / 32, 20, 4, -1, 0, 2, x, xrb, tt, acc); return 1;
    case KERN_GGML_Q5_0: grpv_leg(rows, next, K / 32, 22, 6, 2, 16, 0, x, xrb, tt, acc); return 1;
    case KERN_GGML_Q5_1: grpv_leg(rows, next, K / 32, 24, 8, 4, 0, 2, x, xrb, tt, acc); return 1;
    case KERN_GGML_Q2_K: grpv_q23k(rows, next, K / 256, 0, x, xrb, tt, acc, si); return 1;
    case KERN_GGML_Q3_K: grpv_q23k(rows, next, K / 256, 1, x, xrb, tt, acc, si); return 1;
    case KERN_GGML_Q4_K: grpv_q4k(rows, next, K / 256, x, xrb, tt, acc, si); return 1;
    case KERN_GGML_IQ4_NL: grpv_iq4nl(rows, next, K / 32, x, xrb, tt, acc); return 1;
    case KERN_GGML_IQ4_XS: grpv_iq4xs(rows, next, K / 256, x, xrb, tt, acc, si); return 1;
    default: return 0;
    }
}
#endif

void KERN512(kern__qmatmul_avx512)(const kern_mat *w, const void *xq, size_t T, float *out,
                                   size_t ldo, size_t n0, size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), K = w->n_in;
    int kind = w->type == KERN_Q8_0 ? 0 : (int)w->qtype;
    const uint8_t *base = (const uint8_t *)w->data;
    __m512 acc[TT];
    __m512i si[TT];
#ifndef KERN_AVX512_EMULATED
    int vnni = __builtin_cpu_supports("avx512vnni");
#endif
    /* The interleaved layout (kern/qdot_pack.c) needs no transposes, which is what the 16-row
     * tiles below spend their shuffles on: two of its groups a zmm from two rows of x on
     * (kern/qdot_x8_avx512.c), for one row Q4_K's group as one stream on zmm where the CPU has
     * VNNI (the same file) and the ymm kernels otherwise (kern/qdot_x8_avx2.c). */
    if (w->type == KERN_QUANT_X8 && T > 1) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
        if (vnni) {
            kern__qmatmul_x8_avx512_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
#endif
        KERN512(kern__qmatmul_x8_avx512)(w, xq, T, out, ldo, n0, n1);
        return;
    }
    if (w->type == KERN_QUANT_X8) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
        if (vnni && w->qtype == KERN_GGML_Q4_K) { /* one group's stream, zmm (one_q4k) */
            kern__qmatmul_x8_avx512_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
        if (vnni) {
            kern__qmatmul_x8_avx2_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
#endif
        kern__qmatmul_x8_avx2(w, xq, T, out, ldo, n0, n1);
        return;
    }
    /* The IQ4 types have 16-row tiles with VNNI only (grpv_iq4nl, grpv_iq4xs): otherwise, and
     * for one row, the AVX2 kernels */
    if (kind == KERN_GGML_IQ4_NL || kind == KERN_GGML_IQ4_XS) {
#ifndef KERN_AVX512_EMULATED
        if (!vnni || T == 1)
#endif
        {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
            if (vnni) {
                kern__qmatmul_avx2_vnni(w, xq, T, out, ldo, n0, n1);
                return;
            }
#endif
            kern__qmatmul_avx2(w, xq, T, out, ldo, n0, n1);
            return;
        }
    }
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        /* One row of x (a decode step): AVX2's one-row kernels, the same bits, built again with
         * VL + VNNI where the CPU has VNNI (kern/qdot_avx2.c). zmm forms of them (64 values a
         * vector against x as it lies, the 16 rows' lanes reduced after; BW for the K-quants,
         * vpdpbusd for Q8_0 and Q4_0) measured no faster on the Intel Xeon, in the caches or not;
         * likely because zmm work issues on ports 0 and 5 only, where the scales' and inserts'
         * shuffles crowd port 5. */
        if (tt == 1) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
            if (vnni) {
                kern__qmatmul_avx2_vnni(w, x, 1, out + t0 * ldo, ldo, n0, n1);
                continue;
            }
#endif
            kern__qmatmul_avx2(w, x, 1, out + t0 * ldo, ldo, n0, n1);
            continue;
        }
        for (size_t n = n0; n < n1; n += 16) {
            size_t nr = n1 - n < 16 ? n1 - n : 16;
            const uint8_t *rows[16];
            for (size_t r = 0; r < 16; r++) /* past the end: the last row again, not stored */
                rows[r] = base + (n + (r < nr ? r : nr - 1)) * w->row_bytes;
            const uint8_t *next = n + 32 <= w->n_out ? base + (n + 16) * w->row_bytes : rows[0];
            for (size_t t = 0; t < tt; t++)
                acc[t] = _mm512_setzero_ps();
            int done = 0;
#ifndef KERN_AVX512_EMULATED
            if (vnni)
                done = grpv(kind, rows, next, K, x, xrb, tt, acc, si);
#endif
            if (!done)
                switch (kind) {
                case 0: grp_q8_0t(rows, next, K / 32, x, xrb, tt, acc); break;
                case KERN_GGML_Q4_0:
                    grp_leg(rows, next, K / 32, 18, 2, -1, 8, 0, x, xrb, tt, acc);
                    break;
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
                default: grp_q6k(rows, next, K / 256, x, xrb, tt, acc, si); break;
                }
            for (size_t t = 0; t < tt; t++) {
                float *o = out + (t0 + t) * ldo + n;
                if (nr == 16) {
                    _mm512_storeu_ps(o, acc[t]);
                } else {
                    float l[16];
                    _mm512_storeu_ps(l, acc[t]);
                    memcpy(o, l, nr * sizeof(float));
                }
            }
        }
    }
}
