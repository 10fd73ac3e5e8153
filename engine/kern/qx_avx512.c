/* The AVX-512 tables' activation quantizer: kern/qx_quant.h's contract written out in zmm, one
 * 32-value block two registers, where the compiler's vectorization of that C body kept each
 * block's max |x| and its sums scalar (perf, one Zen 5, a TinyLlama Q4_0 prefill: 4.8 % of its
 * samples, 1.5 % with this). The same arithmetic in the same order: max |x| with a NaN skipped
 * (maxps keeps its second operand when the first is a NaN; the lanes' maxima, never NaN, in any
 * order), id = 127 / amax in scalar as there, v = (x id + 1.5 2^23) - 1.5 2^23, a NaN to 0,
 * clamped to +-127; so the same bytes (tests/test_kernels.c compares every table's with
 * kern_qx_quantize's). Compiled with avx512.c's flags (and over simde for the tests,
 * kern/avx512_isa.h). */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/qdot.h"

#include <float.h>
#include <string.h>

/* the lanes' max of |x| over n values (a multiple of 16) at x, NaNs skipped */
INLINE __m512 amax16(const float *x, size_t n)
{
    const __m512 abs = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 m = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16)
        m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + i), abs), m);
    return m;
}

/* max over the lanes of m (none NaN: the max of a set, whatever the order) */
INLINE float hmax(__m512 m)
{
    __m256 a = _mm256_max_ps(_mm512_castps512_ps256(m),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1)));
    __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_max_ps(b, _mm_movehl_ps(b, b));
    b = _mm_max_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}

/* kern/qx_quant.h's scale: amax below 127 / FLT_MAX counts as 0 (127 / amax would be inf) */
INLINE float inv_scale(float *amax)
{
    if (!(*amax >= 127.0f / FLT_MAX))
        *amax = 0.0f;
    return *amax > 0.0f ? 127.0f / *amax : 0.0f;
}

/* 16 values at x times id, rounded to nearest even, a NaN 0, clamped to +-127, as int32: the
 * integral v read from the mantissa of v + 1.5 2^23 (exact; simde 0.7.4, the tests' copy, has no
 * 512-bit vcvtps2dq) */
INLINE __m512i quant16(const float *x, __m512 id)
{
    const __m512 magic = _mm512_set1_ps(12582912.0f), lim = _mm512_set1_ps(127.0f);
    __m512 v = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x), id), magic), magic);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
    return _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(v, magic)),
                            _mm512_castps_si512(magic));
}

/* the low bytes of v's 16 int32 lanes (each in -127..127): a byte shuffle gathers each 128-bit
 * lane's four into its first dword, a dword permute the four dwords (simde 0.7.4, the tests'
 * copy, has no vpmovdb) */
INLINE __m128i bytes16(__m512i v)
{
    const __m512i lo = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    v = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_shuffle_epi8(v, lo));
    return _mm512_castsi512_si128(v);
}

/* the sum of the 16 int32 lanes of v */
INLINE int sum16(__m512i v)
{
    __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_add_epi32(b, _mm_unpackhi_epi64(b, b));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 1));
    return _mm_cvtsi128_si32(b);
}

void KERN512(kern__qx_quantize_avx512)(kern_qx fmt, const float *x, size_t T, size_t ldx,
                                       size_t n_in, void *dst)
{
    size_t rb = kern_qx_row_bytes(fmt, n_in);
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * ldx;
        uint8_t *row = (uint8_t *)dst + t * rb;
        if (fmt == KERN_QX_32) {
            size_t nb = n_in / 32;
            for (size_t b = 0; b < nb; b++) {
                const float *xb = xr + 32 * b;
                float amax = hmax(amax16(xb, 32));
                __m512 id = _mm512_set1_ps(inv_scale(&amax));
                __m512i q0 = quant16(xb, id), q1 = quant16(xb + 16, id);
                _mm_storeu_si128((__m128i *)(void *)(row + KERN_QX32_Q(nb) + 32 * b), bytes16(q0));
                _mm_storeu_si128((__m128i *)(void *)(row + KERN_QX32_Q(nb) + 32 * b + 16),
                                 bytes16(q1));
                float d = amax / 127.0f;
                int16_t s = (int16_t)sum16(_mm512_add_epi32(q0, q1));
                memcpy(row + 4 * b, &d, 4);
                memcpy(row + KERN_QX32_S(nb) + 2 * b, &s, 2);
            }
        } else {
            for (size_t b = 0; b < n_in / 256; b++) {
                const float *xb = xr + 256 * b;
                kern__qx256 blk;
                float amax = hmax(amax16(xb, 256));
                __m512 id = _mm512_set1_ps(inv_scale(&amax));
                for (int i = 0; i < 16; i++) {
                    __m512i q = quant16(xb + 16 * i, id);
                    _mm_storeu_si128((__m128i *)(void *)(blk.q + 16 * i), bytes16(q));
                    blk.bs[i] = (int16_t)sum16(q);
                }
                blk.d = amax / 127.0f;
                memcpy(row + b * sizeof blk, &blk, sizeof blk);
            }
        }
    }
}
