/* The AVX2 integer products of the K-quants (Q2_K .. Q6_K, 256-value super-blocks) over the
 * file's rows: each type's 8-row kernels and its entry point (kern/qdot_rows8.h says how they
 * work and how this file is built). */
#include "engine/kern/qdot_rows8.h"

/* Q2_K rows p[0..8) (q3 = 0): scales (16: sc low nibble, m high) | qs (64) | d (2) | dmin (2);
 * Q3_K (q3 = 1): hmask (32) | qs (64) | scales (12) | d (2), Q = raw - 4, the 4 taken off
 * through the sums of 16 activations. Value 128 h + 32 s + l: bits 2 s of qs[32 h + l] (and for
 * Q3_K bit 4 h + s of hmask[l] as raw's bit 2). Sub-blocks of 16: the values (0..7) add 4
 * maddubs in int16 (|4 * 2 * 7 * 127| = 7112). */
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

/* Q4_K: d (2) | dmin (2) | scales (12) | qs (128): value 64 c + l in the low nibble of
 * qs[32 c + l], 64 c + 32 + l in its high one. Q5_K (q5 = 1): d | dmin | scales | qh (32) |
 * qs (128), the fifth bit of value 32 v + l bit v of qh[l]. */

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

/* The entry points: K inputs, 256 a block */
/* clang-format off */
#define X256(x) ((const kern__qx256 *)(const void *)(x))
#define ONE_Q2_K(rows, next, K, x, acc) one_q23k(rows, next, (K) / 256, 0, X256(x), acc)
#define GRP_Q2_K(rows, next, K, x, xrb, tt, acc, si) grp_q23k(rows, next, (K) / 256, 0, x, xrb, tt, acc, si)
#define ONE_Q3_K(rows, next, K, x, acc) one_q23k(rows, next, (K) / 256, 1, X256(x), acc)
#define GRP_Q3_K(rows, next, K, x, xrb, tt, acc, si) grp_q23k(rows, next, (K) / 256, 1, x, xrb, tt, acc, si)
#define ONE_Q4_K(rows, next, K, x, acc) one_q45k(rows, next, (K) / 256, 0, X256(x), acc)
#define GRP_Q4_K(rows, next, K, x, xrb, tt, acc, si) grp_q45k(rows, next, (K) / 256, 0, x, xrb, tt, acc, si)
#define ONE_Q5_K(rows, next, K, x, acc) one_q45k(rows, next, (K) / 256, 1, X256(x), acc)
#define GRP_Q5_K(rows, next, K, x, xrb, tt, acc, si) grp_q45k(rows, next, (K) / 256, 1, x, xrb, tt, acc, si)
#define ONE_Q6_K(rows, next, K, x, acc) one_q6k(rows, next, (K) / 256, X256(x), acc)
#define GRP_Q6_K(rows, next, K, x, xrb, tt, acc, si) grp_q6k(rows, next, (K) / 256, x, xrb, tt, acc, si)
/* clang-format on */
QROWS8_DEFINE(QROWS8(q2_k), ONE_Q2_K, GRP_Q2_K)
QROWS8_DEFINE(QROWS8(q3_k), ONE_Q3_K, GRP_Q3_K)
QROWS8_DEFINE(QROWS8(q4_k), ONE_Q4_K, GRP_Q4_K)
QROWS8_DEFINE(QROWS8(q5_k), ONE_Q5_K, GRP_Q5_K)
QROWS8_DEFINE(QROWS8(q6_k), ONE_Q6_K, GRP_Q6_K)
