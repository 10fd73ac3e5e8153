/* The zmm helpers of the AVX-512 integer products (kern/qdot_tiles16.h over the file's rows,
 * kern/qdot_x8_avx512.c over the interleaved groups): header-only, always inlined, so each file
 * compiles them with its own flags (natively, with VNNI, or over simde: kern/avx512_isa.h). Not
 * a public header. */
#ifndef KVS_ENGINE_KERN_QDOT_ZMM_H
#define KVS_ENGINE_KERN_QDOT_ZMM_H

#include "engine/kern/avx512_isa.h"
#include "engine/kern/qdot.h"

#include <stdint.h>
#include <string.h>

#define TT 32 /* activation rows of a tile: a weight block is unpacked once for all of them */

INLINE __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* rows r (low half) and r + 8 (high half) of a group in one zmm */
INLINE __m512i pair(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* int32 to float, rounded to nearest as vcvtdq2ps does: simde 0.7.4 has no 512-bit form, so the
 * emulated build converts the two halves (the same rounding of the same integers). */
INLINE __m512 cvt_ps(__m512i v)
{
#ifdef KERN_AVX512_EMULATED
    __m256 lo = _mm256_cvtepi32_ps(_mm512_castsi512_si256(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
#else
    return _mm512_cvtepi32_ps(v);
#endif
}

/* vpmaddwd: simde 0.7.4's native alias of _mm512_madd_epi16 takes the masked form's 4 arguments,
 * so the emulated build names simde's function */
INLINE __m512i madd16(__m512i a, __m512i b)
{
#ifdef KERN_AVX512_EMULATED
    return simde_mm512_madd_epi16(a, b);
#else
    return _mm512_madd_epi16(a, b);
#endif
}

/* acc + (w * dx) * s: the contract's one step (kern/qdot.h), two products then a sum */
INLINE __m512 fold16(__m512 acc, __m512 w, __m512 dx, __m512 s)
{
    return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(w, dx), s));
}

/* A 32-value block's fold (kern/qdot.h) for activation row xr (nb blocks, this one b): its exact
 * sum S less bias sx, then (d_w d_x) S, then for a min (mo) (m d_x) sx */
INLINE __m512 fold_leg16(__m512 acc, __m512i S, __m512 dw, __m512 dm, int bias, int mo,
                         const uint8_t *xr, size_t nb, size_t b)
{
    int16_t sx;
    float dx;
    memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
    memcpy(&dx, xr + 4 * b, 4);
    if (bias)
        S = _mm512_sub_epi32(S, _mm512_set1_epi32(bias * sx));
    __m512 vdx = _mm512_set1_ps(dx);
    acc = fold16(acc, dw, vdx, cvt_ps(S));
    return mo ? fold16(acc, dm, vdx, _mm512_set1_ps((float)sx)) : acc;
}

INLINE __m512i bcast4(const void *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm512_set1_epi32(v);
}

/* sum over k < n of maddubs(w[k], x[4k .. 4k + 3] in every lane), in int16 */
INLINE __m512i mul16(const __m512i *w, const int8_t *x, int n)
{
    __m512i s = _mm512_maddubs_epi16(w[0], bcast4(x));
    for (int k = 1; k < n; k++)
        s = _mm512_add_epi16(s, _mm512_maddubs_epi16(w[k], bcast4(x + 4 * k)));
    return s;
}

#endif
