/* The AVX-512 integer products' 16-row tiles of the legacy 32-value types (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1) over the file's rows: each type's kernels, with VNNI and without, and its entry
 * point (kern/qdot_tiles16.h says how they work and how this file is built). */
#include "engine/kern/qdot_tiles16.h"

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
 * kern/qdot_rows8.h's grp_s8 (products up to 128 * 127 leave no room to add two in int16). */
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

/* Q4_0 (bb 18: d | qs (16), value j in the low nibble of qs[j], j + 16 in its high one; qo 2, no
 * qh, bias 8), Q4_1 (20: qo 4, min at 2), Q5_0 (22: qh at 2, qs at 6; bias 16) and Q5_1 (24: min
 * at 2, qh at 4, qs at 8); the bias comes off through the block sums of x, the min's term
 * (m * dx) * sx follows the scale's. The 5-bit values add 4 maddubs in int16, the 4-bit ones 8
 * (kern/qdot_avx2_legacy.c's grp_q4_0 and grp_leg). */
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
            acc[t] = fold_leg16(acc[t], S, dw, dm, bias, mo, xr, nb, b);
        }
    }
}

#ifndef KERN_AVX512_EMULATED
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
            acc[t] = fold_leg16(acc[t], S, dw, dm, bias, mo, xr, nb, b);
        }
    }
}
#endif

/* The entry points: K inputs, 32 a block */
/* clang-format off */
#define GRP_Q8_0(rows, next, K, x, xrb, tt, acc, si) grp_q8_0t(rows, next, (K) / 32, x, xrb, tt, acc)
#define GRPV_Q8_0(rows, next, K, x, xrb, tt, acc, si) grpv_q8_0(rows, next, (K) / 32, x, xrb, tt, acc)
#define LEG(g, bb, qo, ho, bias, mo) g(rows, next, (K) / 32, bb, qo, ho, bias, mo, x, xrb, tt, acc)
#define GRP_Q4_0(rows, next, K, x, xrb, tt, acc, si) LEG(grp_leg, 18, 2, -1, 8, 0)
#define GRPV_Q4_0(rows, next, K, x, xrb, tt, acc, si) LEG(grpv_leg, 18, 2, -1, 8, 0)
#define GRP_Q4_1(rows, next, K, x, xrb, tt, acc, si) LEG(grp_leg, 20, 4, -1, 0, 2)
#define GRPV_Q4_1(rows, next, K, x, xrb, tt, acc, si) LEG(grpv_leg, 20, 4, -1, 0, 2)
#define GRP_Q5_0(rows, next, K, x, xrb, tt, acc, si) LEG(grp_leg, 22, 6, 2, 16, 0)
#define GRPV_Q5_0(rows, next, K, x, xrb, tt, acc, si) LEG(grpv_leg, 22, 6, 2, 16, 0)
#define GRP_Q5_1(rows, next, K, x, xrb, tt, acc, si) LEG(grp_leg, 24, 8, 4, 0, 2)
#define GRPV_Q5_1(rows, next, K, x, xrb, tt, acc, si) LEG(grpv_leg, 24, 8, 4, 0, 2)
/* clang-format on */
QTILES16_DEFINE(q8_0, GRP_Q8_0, GRPV_Q8_0)
QTILES16_DEFINE(q4_0, GRP_Q4_0, GRPV_Q4_0)
QTILES16_DEFINE(q4_1, GRP_Q4_1, GRPV_Q4_1)
QTILES16_DEFINE(q5_0, GRP_Q5_0, GRPV_Q5_0)
QTILES16_DEFINE(q5_1, GRP_Q5_1, GRPV_Q5_1)
