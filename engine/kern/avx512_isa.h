/* The AVX-512 intrinsics kern/avx512.c, kern/quant_avx512.c and kern/qdot_avx512*.c are written
 * in: the compiler's own (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c),
 * or, with KERN_AVX512_EMULATED, SIMD Everywhere's portable versions of the same names over AVX2 +
 * FMA (libsimde-dev), so the tests run these very sources on a CPU without AVX-512. Not a public
 * header: the emulated copy exists for tests/test_kernels.c only and is never linked into kvserve.
 *
 * simde 0.7.4 lacks the 512-bit vcvtph2ps, vcvtps2ph, vpmovsxbd / vpmovzxbd, vcvtdq2ps, vpsrad,
 * vextractf32x8 and vshufi64x2; the helpers below are written with operations both have (a
 * half-to-float pair of ymm conversions, a byte shuffle plus an exponent trick for integers) so
 * native and emulated tables execute the same arithmetic. */
#ifndef KVS_ENGINE_KERN_AVX512_ISA_H
#define KVS_ENGINE_KERN_AVX512_ISA_H

#include <stdint.h>

#ifdef KERN_AVX512_EMULATED
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
/* Each zmm operation must become native ymm FMA / F16C operations: simde's generic fallback for a
 * fused multiply-add is a * b + c, which under -ffp-contract=off rounds twice and would make the
 * bit-exactness tests compare other arithmetic than the native table's. */
#if !defined(SIMDE_X86_AVX2_NATIVE) || !defined(SIMDE_X86_FMA_NATIVE) ||                           \
    !defined(SIMDE_X86_F16C_NATIVE) || !SIMDE_NATURAL_VECTOR_SIZE_LE(256)
#error "the emulated AVX-512 kernels need -mavx2 -mfma -mf16c (simde's fused ymm path)"
#endif
#define KERN512(name) name##_emu
/* a macro in simde with no native alias: named here for both builds */
#define k512_shuffle_f32x4 simde_mm512_shuffle_f32x4
#else
#include <immintrin.h>
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) ||                   \
    !defined(__AVX512DQ__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern/avx512.c needs -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
#endif
#define KERN512(name) name
#define k512_shuffle_f32x4 _mm512_shuffle_f32x4
#endif

#define INLINE static inline __attribute__((always_inline))

/* 16 halves at p as floats: one vcvtph2ps zmm natively; over simde, which has no 512-bit
 * conversion in 0.7.4, two ymm conversions and an insert. Either is exact, so the same values. */
INLINE __m512 k512_cvtph(const void *p)
{
#ifdef KERN_AVX512_EMULATED
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
#else
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#endif
}

/* The upper 8 floats of v. */
INLINE __m256 k512_hi8(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* 16 bytes at p, byte c in the low byte of 32-bit lane c, the other bytes zero (one vpshufb over
 * the 16 bytes broadcast to every 128-bit lane). */
INLINE __m512i k512_bytes_to_lanes(const void *p)
{
    const __m512i idx =
        _mm512_set_epi32((int)0x8080800f, (int)0x8080800e, (int)0x8080800d, (int)0x8080800c,
                         (int)0x8080800b, (int)0x8080800a, (int)0x80808009, (int)0x80808008,
                         (int)0x80808007, (int)0x80808006, (int)0x80808005, (int)0x80808004,
                         (int)0x80808003, (int)0x80808002, (int)0x80808001, (int)0x80808000);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), idx);
}

/* 16 int8 at p as floats, exactly: with 0x4b000080 xor'ed in, lane c is the float 2^23 + 128 + q
 * (q + 128 in the low byte, 2^23's exponent above), and subtracting 2^23 + 128 is exact. */
INLINE __m512 k512_i8_ps(const void *p)
{
    __m512i v = _mm512_xor_si512(k512_bytes_to_lanes(p), _mm512_set1_epi32(0x4b000080));
    return _mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(8388736.0f));
}

/* 16 uint8 at p as floats, exactly (2^23 + u, minus 2^23). */
INLINE __m512 k512_u8_ps(const void *p)
{
    __m512i v = _mm512_xor_si512(k512_bytes_to_lanes(p), _mm512_set1_epi32(0x4b000000));
    return _mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(8388608.0f));
}

#endif
