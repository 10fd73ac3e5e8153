/* Helpers the x86 integer-product files share (kern/qdot_rows8.h, kern/qdot_tiles16.h):
 * header-only, always inlined, so that each compiles them with its own target flags (and the
 * emulated AVX-512 copy with its own). SSE / AVX2 operations only. Not a public header. */
#ifndef KVS_ENGINE_KERN_QDOT_X86_H
#define KVS_ENGINE_KERN_QDOT_X86_H

#include "engine/kern/qdot.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 12 scale bytes of a Q4_K block as sc[0..7] (bytes 0..7) and m[0..7] (bytes 8..15), four
 * at a time: sc[j], m[j] (j < 4) are the low 6 bits of s[j], s[j + 4]; sc[j + 4] is the low
 * nibble of s[j + 8] over the top 2 bits of s[j], m[j + 4] the high nibble over those of
 * s[j + 4]. */
static inline __attribute__((always_inline)) __m128i scales_k4(const uint8_t *s)
{
    /* on vectors (7 operations, not 20 scalar ones and the inserts): 16 bytes from s, the 12
     * scale bytes and 4 of the block's next field, as words w0 w1 w2 (w3 unused) */
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* w0 w2 w1 w2 */
    __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* w0 w0 w1 w1 */
    a = _mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4));
    __m128i lo = _mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* the top 2 bits of each byte of w0 (w1) to bits 4..5 of the same byte */
    __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* The IQ4 types' 16 levels (ggml's kvalues_iq4nl, kern/quant_pack.c's IQ4_LEVELS), as signed
 * bytes, or plus 128 as unsigned ones (vpdpbusd's operand): a vpshufb looks nibbles up in them. */
static inline __attribute__((always_inline)) __m128i kern__iq4_levels(int plus128)
{
    __m128i v =
        _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return plus128 ? _mm_xor_si128(v, _mm_set1_epi8((char)0x80)) : v;
}

/* MXFP4's 16 levels (E2M1's values doubled, kern/quant_pack.c's MXFP4_LEVELS), the same two
 * ways */
static inline __attribute__((always_inline)) __m128i kern__mxfp4_levels(int plus128)
{
    __m128i v = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return plus128 ? _mm_xor_si128(v, _mm_set1_epi8((char)0x80)) : v;
}

/* The levels of table lut (kern/qdot.h's KERN_LUT_IQ4, KERN_LUT_MXFP4), the same two ways */
static inline __attribute__((always_inline)) __m128i kern__lut_levels(int lut, int plus128)
{
    return lut == KERN_LUT_MXFP4 ? kern__mxfp4_levels(plus128) : kern__iq4_levels(plus128);
}

/* MXFP4's scales from its E8M0 bytes e (int32 lanes, 0 .. 255): 2^(e - 128), the bits of
 * engine/dtype.h's dtype_e8m0_half_bits ((e - 1) << 23, or 0x00200000 << e for the subnormal
 * e < 2) */
static inline __attribute__((always_inline)) __m256 kern__e8m0_ps8(__m256i e)
{
    __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, lt2));
}

/* The 8 E8M0 bytes at p (a group's e[8]) as kern__e8m0_ps8's scales */
static inline __attribute__((always_inline)) __m256 kern__e8m0x8(const uint8_t *p)
{
    return kern__e8m0_ps8(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

/* The 8 sub-block scales of the IQ4_XS block at p (d | scales_h | scales_l[4] | qs) as int16:
 * nibble j of scales_l over bits 2 j, 2 j + 1 of scales_h, less 32. Shifts by a lane's own count
 * as multiplies (SSE2 has no variable 16-bit shift): the nibbles as (w * 16) >> 4 or w >> 4 of the
 * byte doubled into a word, the 2-bit fields as (sh << (14 - 2 j)) >> 14 in 16 bits. */
static inline __attribute__((always_inline)) __m128i kern__iq4xs_scales(const uint8_t *p)
{
    int32_t sl;
    memcpy(&sl, p + 4, 4);
    __m128i w = _mm_shuffle_epi8(_mm_cvtsi32_si128(sl), _mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2,
                                                                      -1, 2, -1, 3, -1, 3, -1));
    __m128i lo = _mm_and_si128(
        _mm_srli_epi16(_mm_mullo_epi16(w, _mm_setr_epi16(16, 1, 16, 1, 16, 1, 16, 1)), 4),
        _mm_set1_epi16(0x0f));
    __m128i sh = _mm_set1_epi16((short)(p[2] | p[3] << 8));
    __m128i hi =
        _mm_srli_epi16(_mm_mullo_epi16(sh, _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6,
                                                          1 << 4, 1 << 2, 1)),
                       14);
    return _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
}

/* ---- the legacy types' and Q2_K / Q3_K's unpacking, which the AVX2 and AVX-512 tiles share ----
 */

/* The fifth bits of a Q5_0 / Q5_1 block (qh: bit i for value i) as 0x10 in byte i, byte i of the
 * unpacked row holding value i. */
static inline __attribute__((always_inline)) __m256i bits5(const uint8_t *qhp)
{
    uint32_t qh;
    memcpy(&qh, qhp, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* A Q4_0 / Q4_1 / Q5_0 / Q5_1 (or IQ4_NL) block's 32 raw values at p (block start), value i in
 * byte i: the 16 qs bytes at qo (value j in the low nibble of byte j, j + 16 in its high one),
 * the fifth bits' qh at ho (ho < 0: none). */
static inline __attribute__((always_inline)) __m256i raw32(const uint8_t *p, int qo, int ho)
{
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p + qo));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return ho < 0 ? w : _mm256_or_si256(w, bits5(p + ho));
}

/* The 16 6-bit scales of a Q3_K block (12 bytes at s: low nibbles, then 2 high bits
 * each) as int8, less 32 */
static inline __attribute__((always_inline)) __m128i scales_q3k(const uint8_t *s)
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

/* The 32 raw values 32 v .. 32 v + 31 of the Q2_K / Q3_K block at p, value 32 v + i in byte i. */
static inline __attribute__((always_inline)) __m256i raw_q23k(const uint8_t *p, int q3, int v)
{
    __m256i c = _mm256_srl_epi16(
        _mm256_loadu_si256((const __m256i *)(const void *)(p + (q3 ? 32 : 16) + 32 * (v / 4))),
        _mm_cvtsi32_si128(2 * (v % 4)));
    c = _mm256_and_si256(c, _mm256_set1_epi8(3));
    if (q3) {
        __m256i h = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(const void *)p),
                                     _mm_cvtsi32_si128(v));
        c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 2));
    }
    return c;
}

/* The 16 sub-block scales (and Q2_K's mins) of the block at p as int16. */
static inline __attribute__((always_inline)) void scales_q23k(const uint8_t *p, int q3, __m256i *sc,
                                                              __m256i *mi)
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

#endif
