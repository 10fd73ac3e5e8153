/* The AVX2 integer products of the legacy 32-value types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) over
 * the file's rows: each type's 8-row kernels and its entry point (kern/qdot_rows8.h says how
 * they work and how this file is built). */
#include "engine/kern/qdot_rows8.h"

/* Q4_0 rows p[0..8) (18-byte blocks: d | 16 bytes, value j in the low nibble of byte j, j + 16
 * in its high one) times activation rows xq[0 .. tt); Q = nibble - 8, the 8 taken off through
 * the block sums of x. */
INLINE void grp_q4_0(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                     const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 18);
        const uint8_t *p[8];
        __m256i w[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 18 * b;
            __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2));
            w[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        }
        tr8(w);
        __m256 dw = f16x8(p, 0);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m256i S =
                _mm256_madd_epi16(mul8(w, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), 8), one);
            int16_t sx;
            float dx;
            memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
            memcpy(&dx, xr + 4 * b, 4);
            S = _mm256_sub_epi32(S, _mm256_set1_epi32(8 * sx));
            acc[t] = fold8(acc[t], dw, _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
        }
    }
}

/* Q4_1 (bb 20: d | m | qs; qo 4, no qh), Q5_0 (22: d | qh | qs; bias 16) and Q5_1 (24: d | m |
 * qh | qs) rows p[0..8) times activation rows xq[0 .. tt), as grp_q4_0; mo: the offset of the
 * min m (0: none), whose term (m * dx) * sx follows the scale's. The 5-bit values (0..31) add
 * at most 4 maddubs in int16 (|4 * 2 * 31 * 127| = 31496 < 2^15; 8 would not fit), the 4-bit
 * ones 8 (|8 * 2 * 15 * 127| = 30480). */
INLINE void grp_leg(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int bb, int qo,
                    int ho, int bias, int mo, const uint8_t *xq, size_t xrb, size_t tt, __m256 *acc)
{
    const __m256i one = _mm256_set1_epi16(1);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[8];
        __m256i w[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + (size_t)bb * b;
            w[r] = raw32(p[r], qo, ho);
        }
        tr8(w);
        __m256 dw = f16x8(p, 0), dm = mo ? f16x8(p, (size_t)mo) : _mm256_setzero_ps();
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            const int8_t *xs = (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b);
            __m256i S = ho < 0 ? _mm256_madd_epi16(mul8(w, xs, 8), one)
                               : _mm256_add_epi32(_mm256_madd_epi16(mul8(w, xs, 4), one),
                                                  _mm256_madd_epi16(mul8(w + 4, xs + 16, 4), one));
            acc[t] = fold_leg8(acc[t], S, dw, dm, bias, mo, xr, nb, b);
        }
    }
}

INLINE void one_q4_0(const uint8_t *const rows[8], const uint8_t *next, size_t nb,
                     const uint8_t *xr, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, 18);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + 18 * b;
            __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p[r] + 2));
            __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
            s[r] = dot_quads(w, x);
        }
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        __m256i S = _mm256_sub_epi32(hsum8(s), _mm256_set1_epi32(8 * sx));
        *acc = fold8(*acc, f16x8(p, 0), _mm256_set1_ps(dx), _mm256_cvtepi32_ps(S));
    }
}

/* grp_leg's types, one activation row. */
INLINE void one_leg(const uint8_t *const rows[8], const uint8_t *next, size_t nb, int bb, int qo,
                    int ho, int bias, int mo, const uint8_t *xr, __m256 *acc)
{
    for (size_t b = 0; b < nb; b++) {
        prefetch_next(next, b, (size_t)bb);
        const uint8_t *p[8];
        __m256i x = ld(xr + KERN_QX32_Q(nb) + 32 * b), s[8];
        for (int r = 0; r < 8; r++) {
            p[r] = rows[r] + (size_t)bb * b;
            s[r] = dot_quads(raw32(p[r], qo, ho), x);
        }
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        __m256i S = hsum8(s);
        if (bias)
            S = _mm256_sub_epi32(S, _mm256_set1_epi32(bias * sx));
        __m256 vdx = _mm256_set1_ps(dx);
        *acc = fold8(*acc, f16x8(p, 0), vdx, _mm256_cvtepi32_ps(S));
        if (mo)
            *acc = fold8(*acc, f16x8(p, (size_t)mo), vdx, _mm256_set1_ps((float)sx));
    }
}

/* The entry points: K inputs, 32 a block */
/* clang-format off */
#define ONE_Q8_0(rows, next, K, x, acc) one_s8(rows, next, (K) / 32, 0, x, acc)
#define GRP_Q8_0(rows, next, K, x, xrb, tt, acc, si) grp_s8(rows, next, (K) / 32, 0, x, xrb, tt, acc)
#define ONE_Q4_0(rows, next, K, x, acc) one_q4_0(rows, next, (K) / 32, x, acc)
#define GRP_Q4_0(rows, next, K, x, xrb, tt, acc, si) grp_q4_0(rows, next, (K) / 32, x, xrb, tt, acc)
#define ONE_Q4_1(rows, next, K, x, acc) one_leg(rows, next, (K) / 32, 20, 4, -1, 0, 2, x, acc)
#define GRP_Q4_1(rows, next, K, x, xrb, tt, acc, si) \
    grp_leg(rows, next, (K) / 32, 20, 4, -1, 0, 2, x, xrb, tt, acc)
#define ONE_Q5_0(rows, next, K, x, acc) one_leg(rows, next, (K) / 32, 22, 6, 2, 16, 0, x, acc)
#define GRP_Q5_0(rows, next, K, x, xrb, tt, acc, si) \
    grp_leg(rows, next, (K) / 32, 22, 6, 2, 16, 0, x, xrb, tt, acc)
#define ONE_Q5_1(rows, next, K, x, acc) one_leg(rows, next, (K) / 32, 24, 8, 4, 0, 2, x, acc)
#define GRP_Q5_1(rows, next, K, x, xrb, tt, acc, si) \
    grp_leg(rows, next, (K) / 32, 24, 8, 4, 0, 2, x, xrb, tt, acc)
/* clang-format on */
QROWS8_DEFINE(QROWS8(q8_0), ONE_Q8_0, GRP_Q8_0)
QROWS8_DEFINE(QROWS8(q4_0), ONE_Q4_0, GRP_Q4_0)
QROWS8_DEFINE(QROWS8(q4_1), ONE_Q4_1, GRP_Q4_1)
QROWS8_DEFINE(QROWS8(q5_0), ONE_Q5_0, GRP_Q5_0)
QROWS8_DEFINE(QROWS8(q5_1), ONE_Q5_1, GRP_Q5_1)
