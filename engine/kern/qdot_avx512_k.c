/* The AVX-512 integer products' 16-row tiles of the K-quants (Q2_K .. Q6_K) over the file's
 * rows: each type's kernels, with VNNI (not Q5_K, Q6_K: see grp_q45k's VNNI note) and without,
 * and its entry point (kern/qdot_tiles16.h says how they work and how this file is built). */
#include "engine/kern/qdot_tiles16.h"

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

/* Q2_K (q3 = 0) / Q3_K (q3 = 1) as kern/qdot_avx2_k.c's grp_q23k: sub-blocks of 16, values 0..7 add
 * 4 maddubs in int16. */
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
 * qs), as kern/qdot_avx2_k.c's grp_q45k. si: tt int32 vectors of scratch. */
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
 * of 16 activations, as kern/qdot_avx2_k.c's grp_q6k. */
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

#ifndef KERN_AVX512_EMULATED
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
#endif

/* The entry points: K inputs, 256 a block. Q5_K and Q6_K have no VNNI kernel: their sub-block
 * sums do not fit an int16, and the scale by vpmulld after vpdpbusd measured slower than
 * maddubs, int16 sums and one madd. */
/* clang-format off */
#define GRP_Q2_K(rows, next, K, x, xrb, tt, acc, si) grp_q23k(rows, next, (K) / 256, 0, x, xrb, tt, acc, si)
#define GRPV_Q2_K(rows, next, K, x, xrb, tt, acc, si) grpv_q23k(rows, next, (K) / 256, 0, x, xrb, tt, acc, si)
#define GRP_Q3_K(rows, next, K, x, xrb, tt, acc, si) grp_q23k(rows, next, (K) / 256, 1, x, xrb, tt, acc, si)
#define GRPV_Q3_K(rows, next, K, x, xrb, tt, acc, si) grpv_q23k(rows, next, (K) / 256, 1, x, xrb, tt, acc, si)
#define GRP_Q4_K(rows, next, K, x, xrb, tt, acc, si) grp_q45k(rows, next, (K) / 256, 0, x, xrb, tt, acc, si)
#define GRPV_Q4_K(rows, next, K, x, xrb, tt, acc, si) grpv_q4k(rows, next, (K) / 256, x, xrb, tt, acc, si)
#define GRP_Q5_K(rows, next, K, x, xrb, tt, acc, si) grp_q45k(rows, next, (K) / 256, 1, x, xrb, tt, acc, si)
#define GRP_Q6_K(rows, next, K, x, xrb, tt, acc, si) grp_q6k(rows, next, (K) / 256, x, xrb, tt, acc, si)
/* clang-format on */
QTILES16_DEFINE(q2_k, GRP_Q2_K, GRPV_Q2_K)
QTILES16_DEFINE(q3_k, GRP_Q3_K, GRPV_Q3_K)
QTILES16_DEFINE(q4_k, GRP_Q4_K, GRPV_Q4_K)
QTILES16_DEFINE(q5_k, GRP_Q5_K, GRP_Q5_K)
QTILES16_DEFINE(q6_k, GRP_Q6_K, GRP_Q6_K)
