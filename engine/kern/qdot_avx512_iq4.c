/* The AVX-512 integer products' 16-row tiles of the types whose nibbles look levels up (IQ4_NL,
 * IQ4_XS, MXFP4) over the file's rows: VNNI kernels only (without VNNI, and for the emulated copy,
 * the AVX2 kernels run every tile: kern/qdot_avx512.c), and their entry points
 * (kern/qdot_tiles16.h says how they work). */
#include "engine/kern/qdot_tiles16.h"

#ifndef KERN_AVX512_EMULATED
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

/* MXFP4: IQ4_NL's kernel over 17-byte blocks (the E8M0 byte, then the nibbles) with MXFP4's
 * levels plus 128 (116 .. 140) */
VNNI void grpv_mxfp4(const uint8_t *const rows[16], const uint8_t *next, size_t nb,
                     const uint8_t *xq, size_t xrb, size_t tt, __m512 *acc)
{
    const __m512i lut = _mm512_broadcast_i32x4(kern__mxfp4_levels(1));
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 17);
        const uint8_t *p[16];
        __m512i w[8];
        unpack_leg(rows, b, 17, 1, -1, p, w);
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_shuffle_epi8(lut, w[k]);
        fold_u128(w, e8m0x16(p), xq, xrb, tt, nb, b, acc);
    }
}

/* IQ4_XS (kern/qdot_avx2_iq4.c's grp_iq4xs layout): sub-block j's 32 values are a legacy block's
 * nibbles at 8 + 16 j; its sum less 128 times its 32 activations' sum, times its scale (vpmulld:
 * the sums need all 32 bits), added in int32. */
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

/* The entry points (called with vnni only) */
/* clang-format off */
#define GRPV_IQ4_NL(rows, next, K, x, xrb, tt, acc, si) grpv_iq4nl(rows, next, (K) / 32, x, xrb, tt, acc)
#define GRPV_IQ4_XS(rows, next, K, x, xrb, tt, acc, si) grpv_iq4xs(rows, next, (K) / 256, x, xrb, tt, acc, si)
#define GRPV_MXFP4(rows, next, K, x, xrb, tt, acc, si) grpv_mxfp4(rows, next, (K) / 32, x, xrb, tt, acc)
/* clang-format on */
QTILES16_DEFINE(iq4_nl, GRPV_IQ4_NL, GRPV_IQ4_NL)
QTILES16_DEFINE(iq4_xs, GRPV_IQ4_XS, GRPV_IQ4_XS)
QTILES16_DEFINE(mxfp4, GRPV_MXFP4, GRPV_MXFP4)
#endif
