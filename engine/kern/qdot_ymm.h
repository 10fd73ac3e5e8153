/* The ymm helpers of the AVX2 integer products (kern/qdot_rows8.h over the file's rows,
 * kern/qdot_x8_avx2.c over the interleaved groups): header-only, always inlined, so that each
 * file compiles them with its own flags (both are built a second time with AVX-512 VL + VNNI,
 * engine/meson.build). Not a public header. */
#ifndef KVS_ENGINE_KERN_QDOT_YMM_H
#define KVS_ENGINE_KERN_QDOT_YMM_H

#include "engine/kern/qdot.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern/qdot_ymm.h needs -mavx2 -mfma -mf16c"
#endif
#if defined(KERN_QDOT_VNNI) && (!defined(__AVX512VNNI__) || !defined(__AVX512VL__))
#error "KERN_QDOT_VNNI needs -mavx512vnni -mavx512vl"
#endif

#define INLINE static inline __attribute__((always_inline))
#define TT 32 /* activation rows of a tile: a weight block is unpacked once for all of them */

INLINE __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* acc + (w * dx) * s: the contract's one step (kern/qdot.h), two products then a sum */
INLINE __m256 fold8(__m256 acc, __m256 w, __m256 dx, __m256 s)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(w, dx), s));
}

/* A 32-value block's fold (kern/qdot.h) for activation row xr (nb blocks, this one b): its exact
 * sum S less bias sx, then (d_w d_x) S, then for a min (mo) (m d_x) sx */
INLINE __m256 fold_leg8(__m256 acc, __m256i S, __m256 dw, __m256 dm, int bias, int mo,
                        const uint8_t *xr, size_t nb, size_t b)
{
    int16_t sx;
    float dx;
    memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
    memcpy(&dx, xr + 4 * b, 4);
    if (bias)
        S = _mm256_sub_epi32(S, _mm256_set1_epi32(bias * sx));
    __m256 vdx = _mm256_set1_ps(dx);
    acc = fold8(acc, dw, vdx, _mm256_cvtepi32_ps(S));
    return mo ? fold8(acc, dm, vdx, _mm256_set1_ps((float)sx)) : acc;
}

INLINE __m256i bcast4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* sum over k < n of maddubs(w[k], x[4k .. 4k + 3] in every lane), in int16 */
INLINE __m256i mul8(const __m256i *w, const int8_t *x, int n)
{
    __m256i s = _mm256_maddubs_epi16(w[0], bcast4(x));
    for (int k = 1; k < n; k++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k], bcast4(x + 4 * k)));
    return s;
}

/* The sum over k < 8 of the int16 pairs p[k] (lane r: row r's) times (bs[2 k], bs[2 k + 1]) of x:
 * a K-quant block's mins, or its bias's scales, through the sums of 16 activations. */
INLINE __m256i bs_sum8(const __m256i p[8], const kern__qx256 *x)
{
    __m256i B = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++)
        B = _mm256_add_epi32(
            B, _mm256_madd_epi16(p[k], bcast4((const int8_t *)(const void *)&x->bs[2 * k])));
    return B;
}

/* A Q4_K / Q5_K block's fold for one activation row: the scales' sum si, then the mins' (mi[j]:
 * (min, min) pairs of sub-block j), dm already negated */
INLINE __m256 fold_q45k(__m256 acc, __m256 d, __m256 dm, __m256i si, const __m256i mi[8],
                        const kern__qx256 *x)
{
    __m256 dx = _mm256_set1_ps(x->d);
    __m256 s1 = fold8(acc, d, dx, _mm256_cvtepi32_ps(si));
    return fold8(s1, dm, dx, _mm256_cvtepi32_ps(bs_sum8(mi, x)));
}

/* A Q6_K block's fold: Q = raw - 32, the 32 taken off through the sums of 16 activations (pr[k]:
 * (sc[2 k], sc[2 k + 1]) pairs) */
INLINE __m256 fold_q6k(__m256 acc, __m256 d, __m256i si, const __m256i pr[8], const kern__qx256 *x)
{
    __m256i S = _mm256_sub_epi32(si, _mm256_slli_epi32(bs_sum8(pr, x), 5));
    return fold8(acc, d, _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(S));
}

#endif
