/* The zmm helpers of the products over KERN_QUANT_X8 (kern/qdot_pack.c), two groups of 8 rows
 * a zmm (group a in lanes 0..7, the next one, c, in lanes 8..15): kern/qdot_x8_avx512.c's
 * kernels and kern/qdot_amx.c's tiles. Header-only, always inlined, as kern/qdot_zmm.h. Not a
 * public header. */
#ifndef KVS_ENGINE_KERN_QDOT_X8_ZMM_H
#define KVS_ENGINE_KERN_QDOT_X8_ZMM_H

#include "engine/kern/qdot_zmm.h"

/* 8 halves at a and 8 at c as floats, lanes 0..15 */
INLINE __m512 f16x16(const uint16_t *a, const uint16_t *c)
{
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)a));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)c));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* 8 unsigned (u8x16) or signed (i8x16) bytes at a and 8 at c as int32 lanes 0..15 */
INLINE __m512i u8x16(const uint8_t *a, const uint8_t *c)
{
    return pair(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)a)),
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)c)));
}

INLINE __m512i i8x16(const int8_t *a, const int8_t *c)
{
    return pair(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)a)),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)c)));
}

/* int32 lanes v (|v| < 2^15) as (v, v) int16 pairs: madd's operand for a sub-block's scale */
INLINE __m512i pairs16(__m512i v)
{
    return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xffff)),
                           _mm512_slli_epi32(v, 16));
}

/* The sum over k < 8 of the int16 pairs p[k] (lane r: row r's) times (bs[2 k], bs[2 k + 1]) of x:
 * a K-quant block's mins, or Q6_K's bias's scales, through the sums of 16 activations. */
INLINE __m512i bs_sum16(const __m512i p[8], const kern__qx256 *x)
{
    __m512i B = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++)
        B = _mm512_add_epi32(B, madd16(p[k], bcast4((const int8_t *)(const void *)&x->bs[2 * k])));
    return B;
}

/* Bit j of each byte of h moved to bit 4, by a constant shift per case: simde's emulated shifts
 * (the tests' copy) take immediates only; j is a constant wherever this is inlined. */
INLINE __m512i bit_to4(__m512i h, int j)
{
    switch (j) {
    case 0: return _mm512_slli_epi16(h, 4);
    case 1: return _mm512_slli_epi16(h, 3);
    case 2: return _mm512_slli_epi16(h, 2);
    case 3: return _mm512_slli_epi16(h, 1);
    case 4: return h;
    case 5: return _mm512_srli_epi16(h, 1);
    case 6: return _mm512_srli_epi16(h, 2);
    default: return _mm512_srli_epi16(h, 3);
    }
}

#endif
