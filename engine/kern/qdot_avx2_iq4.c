/* The AVX2 integer products of the types whose nibbles look levels up (IQ4_NL and MXFP4:
 * 32-value blocks, Q8_0's signed-level kernels of kern/qdot_rows8.h over the nibbles' levels;
 * IQ4_XS: 256-value super-blocks) over the file's rows: each type's 8-row kernels and its entry
 * point (kern/qdot_rows8.h says how they work and how this file is built). */
#include "engine/kern/qdot_rows8.h"

/* IQ4_XS rows p[0..8) (136-byte blocks: d | scales_h (2) | scales_l (4) | qs (128)): sub-block j
 * (values 32 j .. 32 j + 31, qs[16 j .. 16 j + 15] in Q4_0's order) has the 6-bit scale
 * (low nibble j of scales_l) | (bits 2 j, 2 j + 1 of scales_h) << 4, less 32. */
INLINE void grp_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc, __m256i *si)
{
    const __m256i lut = iq4_lut();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const uint8_t *p[8];
        __m256i sc[8]; /* lane r of sc[j]: row r's (scale j, scale j) int16 pair */
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m128i s16 = kern__iq4xs_scales(p[r]);
            sc[r] = _mm256_cvtepu16_epi32(s16);
            sc[r] = _mm256_or_si256(sc[r], _mm256_slli_epi32(sc[r], 16));
        }
        tr8(sc);
        __m256 d = f16x8(p, 0);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i w[8], wa[8];
            for (int r = 0; r < 8; r++)
                w[r] = iq4_vals(p[r] + 8 + 16 * j, lut);
            tr8(w);
            for (int k = 0; k < 8; k++)
                wa[k] = _mm256_sign_epi8(w[k], w[k]);
            __m256i scj = sc[j];
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                si[t] = _mm256_add_epi32(si[t], mul8s(w, wa, x->q + 32 * j, scj));
            }
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            acc[t] = fold8(acc[t], d, _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(si[t]));
        }
    }
}

#ifdef KERN_QDOT_VNNI
/* IQ4_XS, one row of x, with VNNI: half a block (4 sub-blocks, 64 bytes) a zmm load, whose low
 * nibbles are the first 16 values of each sub-block (one per 128-bit lane) and whose high ones
 * the last 16; x is reordered to match once per block for all 8 rows. The levels plus 128 (one
 * vpshufb each) meet x in two vpdpbusd into the same lanes, which start from -128 times each
 * sub-block's sum of x (lane 4 i), then each 128-bit lane times its sub-block's scale (vpmulld);
 * the 8 rows' int32 lanes are summed as the ymm kernels' (measured on a Zen 5 core, 5632 x 2048
 * in the caches: 35 Gweights/s for the ymm kernel below, 40 for two sub-blocks a zmm, ~50 so). */
INLINE void one_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const kern__qx256 *xb, __m256 *acc)
{
    const __m512i lutu = _mm512_broadcast_i32x4(kern__iq4_levels(1));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* per half h: sub-block 4 h + i's value in 128-bit lane i (its scale, and its sum in lane 4 i)
     */
    const __m512i idx[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const kern__qx256 *x = xb + b;
        /* -128 times the sum of each sub-block's 32 x: (bs[2 j] + bs[2 j + 1]) * -128, lane j */
        __m512i X = _mm512_castsi256_si512(_mm256_madd_epi16(ld(x->bs), _mm256_set1_epi16(-128)));
        __m512i xlo[2], xhi[2], corr[2];
        for (int h = 0; h < 2; h++) {
            __m512i a = _mm512_loadu_si512((const void *)(x->q + 128 * h));
            __m512i c = _mm512_loadu_si512((const void *)(x->q + 128 * h + 64));
            xlo[h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
            xhi[h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
            corr[h] = _mm512_maskz_permutexvar_epi32(0x1111, idx[h], X);
        }
        const uint8_t *p[8];
        __m256i s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(kern__iq4xs_scales(p[r])));
            __m512i a = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i v = _mm512_loadu_si512((const void *)(p[r] + 8 + 64 * h));
                __m512i lo = _mm512_shuffle_epi8(lutu, _mm512_and_si512(v, m4));
                __m512i hi =
                    _mm512_shuffle_epi8(lutu, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                __m512i u =
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr[h], lo, xlo[h]), hi, xhi[h]);
                a = _mm512_add_epi32(a,
                                     _mm512_mullo_epi32(u, _mm512_permutexvar_epi32(idx[h], sc)));
            }
            s[r] = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
        }
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(hsum8(s)));
    }
}
#else
/* IQ4_XS (grp_iq4xs's layout): per sub-block the maddubs pairs of |w| and x carrying w's sign,
 * widened by one madd with the sub-block's scale */
INLINE void one_iq4xs(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                      const kern__qx256 *xb, __m256 *acc)
{
    const __m256i lut = iq4_lut();
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 136);
        const kern__qx256 *x = xb + b;
        const uint8_t *p[8];
        __m256i s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 136 * b;
            __m256i sr = _mm256_setzero_si256();
            __m128i s16 = kern__iq4xs_scales(p[r]);
            for (int j = 0; j < 8; j++) {
                /* scale j in every word: a pshufb of its two bytes */
                __m256i sc = _mm256_broadcastsi128_si256(
                    _mm_shuffle_epi8(s16, _mm_set1_epi16((short)(2 * j | (2 * j + 1) << 8))));
                __m256i w = iq4_vals(p[r] + 8 + 16 * j, lut), xj = ld(x->q + 32 * j);
                sr = _mm256_add_epi32(
                    sr,
                    _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xj, w)), sc));
            }
            s[r] = sr;
        }
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(x->d), _mm256_cvtepi32_ps(hsum8(s)));
    }
}
#endif

/* The entry points */
/* clang-format off */
#define ONE_IQ4_NL(rows, next, K, x, acc) one_s8(rows, next, (K) / 32, KERN_LUT_IQ4, x, acc)
#define GRP_IQ4_NL(rows, next, K, x, xrb, tt, acc, si) grp_s8(rows, next, (K) / 32, KERN_LUT_IQ4, x, xrb, tt, acc)
#define ONE_MXFP4(rows, next, K, x, acc) one_s8(rows, next, (K) / 32, KERN_LUT_MXFP4, x, acc)
#define GRP_MXFP4(rows, next, K, x, xrb, tt, acc, si) grp_s8(rows, next, (K) / 32, KERN_LUT_MXFP4, x, xrb, tt, acc)
#define ONE_IQ4_XS(rows, next, K, x, acc) \
    one_iq4xs(rows, next, (K) / 256, (const kern__qx256 *)(const void *)(x), acc)
#define GRP_IQ4_XS(rows, next, K, x, xrb, tt, acc, si) grp_iq4xs(rows, next, (K) / 256, x, xrb, tt, acc, si)
/* clang-format on */
QROWS8_DEFINE(QROWS8(iq4_nl), ONE_IQ4_NL, GRP_IQ4_NL)
QROWS8_DEFINE(QROWS8(iq4_xs), ONE_IQ4_XS, GRP_IQ4_XS)
QROWS8_DEFINE(QROWS8(mxfp4), ONE_MXFP4, GRP_MXFP4)
