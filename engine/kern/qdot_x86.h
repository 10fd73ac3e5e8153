/* Helpers the x86 integer-product files share (kern/qdot_avx2.c, kern/qdot_avx512.c):
 * header-only, always inlined, so that each compiles them with its own target flags (and the
 * emulated AVX-512 copy with its own). SSE / AVX2 operations only. Not a public header. */
#ifndef KVS_ENGINE_KERN_QDOT_X86_H
#define KVS_ENGINE_KERN_QDOT_X86_H

#include <immintrin.h>
#include <stdint.h>

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

/* Sub-block j's scale of the IQ4_XS block at p (d | scales_h | scales_l[4] | qs): nibble j of
 * scales_l over bits 2 j, 2 j + 1 of scales_h, less 32. */
static inline __attribute__((always_inline)) int kern__iq4xs_scale(const uint8_t *p, int j)
{
    unsigned sh = (unsigned)(p[2] | p[3] << 8);
    return (((p[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | ((sh >> (2 * j)) & 3) << 4) - 32;
}

#endif
