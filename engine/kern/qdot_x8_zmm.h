/* The zmm helpers of the products over KERN_QUANT_X8 (kern/qdot_pack.c), two groups of 8 rows
 * a zmm (group a in lanes 0..7, the next one, c, in lanes 8..15): kern/qdot_x8_avx512.c's
 * kernels and kern/qdot_amx.c's tiles. Header-only, always inlined, as kern/qdot_zmm.h. Not a
 * public header. */
#ifndef KVS_ENGINE_KERN_QDOT_X8_ZMM_H
#define KVS_ENGINE_KERN_QDOT_X8_ZMM_H

#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_zmm.h"

/* 8 halves at a and 8 at c as floats, lanes 0..15 */
INLINE __m512 f16x16(const uint16_t *a, const uint16_t *c)
{
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)a));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)c));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* MXFP4's 8 E8M0 bytes at a and 8 at c as their scales 2^(e - 128), lanes 0..15 */
INLINE __m512 e8x16(const uint8_t *a, const uint8_t *c)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(kern__e8m0x8(a)), kern__e8m0x8(c), 1);
}

/* The rows' scales of a 32-value block of both groups at qa, qc: f16 d, or MXFP4's E8M0 bytes
 * (e8) */
INLINE __m512 leg_scales16(const uint8_t *qa, const uint8_t *qc, int e8)
{
    return e8 ? e8x16(qa, qc)
              : f16x16((const uint16_t *)(const void *)qa, (const uint16_t *)(const void *)qc);
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

/* Bits 2 s, 2 s + 1 of each byte of v at bits 0, 1 (constant shifts, as bit_to4) */
INLINE __m512i bits2(__m512i v, int s)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    switch (s) {
    case 0: return _mm512_and_si512(v, m3);
    case 1: return _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
    case 2: return _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
    default: return _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
    }
}

/* Bit j of each byte of h at bit 2 (constant shifts; what crosses bytes is masked) */
INLINE __m512i bit_to2(__m512i h, int j)
{
    const __m512i m4 = _mm512_set1_epi8(4);
    switch (j) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(h, 2), m4);
    case 1: return _mm512_and_si512(_mm512_slli_epi16(h, 1), m4);
    case 2: return _mm512_and_si512(h, m4);
    default: return _mm512_and_si512(_mm512_srli_epi16(bit_to4(h, j), 2), m4);
    }
}

/* kern/qdot_x8_avx2.c's scale_q23k for groups a (lanes 0..7) and c (lanes 8..15) */
INLINE __m512i scale_q23k(const uint8_t *a, const uint8_t *c, int q3, int j, int mn)
{
    size_t o = (q3 ? offsetof(kern__q3kx8, sc) : offsetof(kern__q2kx8, sc)) + 8 * (size_t)j;
    if (q3)
        return i8x16((const int8_t *)(a + o), (const int8_t *)(c + o));
    __m512i u = u8x16(a + o, c + o);
    return mn ? _mm512_srli_epi32(u, 4) : _mm512_and_si512(u, _mm512_set1_epi32(0x0f));
}

/* Q6_K (kern__q6kx8): the 6-bit values of quad k of run v = 4 h + s of both groups' blocks qa,
 * qc: the low (s < 2) or high nibble of ql[2 h + s % 2], bits 2 s, 2 s + 1 of qh[h] above them */
INLINE __m512i q6k_vals(const kern__q6kx8 *qa, const kern__q6kx8 *qc, int v, int k)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    int h = v / 4, sv = v % 4;
    __m512i l = pair(ld(qa->ql[2 * h + sv % 2][k]), ld(qc->ql[2 * h + sv % 2][k]));
    __m512i hb = pair(ld(qa->qh[h][k]), ld(qc->qh[h][k]));
    if (sv >= 2)
        l = _mm512_srli_epi16(l, 4);
    /* bits 2 s, 2 s + 1 of each byte to bits 4, 5 (what crosses bytes is masked) */
    hb = sv == 0   ? _mm512_slli_epi16(hb, 4)
         : sv == 1 ? _mm512_slli_epi16(hb, 2)
         : sv == 3 ? _mm512_srli_epi16(hb, 2)
                   : hb;
    return _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(hb, m30));
}

/* One 32-value block of both groups (kern__q40x8 .. kern__q80x8 at qa, qc: qh at ho, qs at qo)
 * as w[k], quad k (values 4 k .. 4 k + 3) of the 16 rows: Q8_0's (s8) qs[k] whole, else the low
 * nibbles of qs[k] for k < 4 and the high ones of qs[k - 4] after, qh's bit k above w[k]'s nibble
 * (ho != 0), and IQ4_NL's and MXFP4's (lut) looked up in levels (their table's) */
INLINE void leg_vals(const uint8_t *qa, const uint8_t *qc, size_t ho, size_t qo, int lut, int s8,
                     __m512i levels, __m512i w[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    if (s8) {
        for (int k = 0; k < 8; k++)
            w[k] = pair(ld(qa + qo + 32 * k), ld(qc + qo + 32 * k));
    } else {
        for (int k = 0; k < 4; k++) {
            __m512i v = pair(ld(qa + qo + 32 * k), ld(qc + qo + 32 * k));
            w[k] = _mm512_and_si512(v, m4);
            w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
    }
    if (ho) {
        __m512i h = pair(ld(qa + ho), ld(qc + ho));
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_or_si512(w[k], _mm512_and_si512(bit_to4(h, k), m10));
    }
    if (lut)
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_shuffle_epi8(levels, w[k]);
}

#endif
