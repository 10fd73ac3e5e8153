/* Helpers the x86 integer-product files share (kern/qdot_avx2.c, kern/qdot_avx512.c):
 * header-only, always inlined, so that each compiles them with its own target flags (and the
 * emulated AVX-512 copy with its own). SSE / AVX2 operations only. Not a public header. */
#ifndef KVS_ENGINE_KERN_QDOT_X86_H
#define KVS_ENGINE_KERN_QDOT_X86_H

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

#endif
