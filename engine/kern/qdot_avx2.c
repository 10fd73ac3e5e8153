/* AVX2 integer products (kern/qdot.h) over the file's rows: each weight block is unpacked once
 * into registers (nibbles and high bits with shifts and masks; Q4_0 / Q8_0 made unsigned with
 * their signs moved onto x, 8 blocks at a time), then multiplied with every activation row of a
 * tile by maddubs
 * (u8 x s8 pairs into s16: no pair can saturate, |2 * 63 * 127| < 2^15 for Q6_K, 2 * 128 * 127
 * for Q8_0) and madd (the pairs times the sub-block scales into the 8 int32 lanes). The lanes'
 * float fold and final sum are qdot_ref.c's, so the bits are the portable table's. */
#include "engine/kern/qdot.h"

#include <immintrin.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern/qdot_avx2.c needs -mavx2 -mfma -mf16c"
#endif

#define INLINE static inline __attribute__((always_inline))
#define TT 32 /* activation rows whose sums stay in a tile while one weight row is read */

INLINE __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

INLINE float f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* acc + s * lane (kern/qdot.h: a product then a sum) */
INLINE __m256 fold(__m256 acc, float s, __m256i lane)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(lane)));
}

/* kern__qx_hsum's order */
INLINE float hsum(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* The sum of each of v[0..8)'s 8 int32 lanes, v[i]'s in lane i (integers: any order is exact). */
INLINE __m256i hsum8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20),
                            _mm256_permute2x128_si256(a, c, 0x31));
}

/* Blocks b0 .. b0 + g (g <= 8) of row `row` of Q8_0 (q8 = 1) or Q4_0 blocks times activation
 * rows xs[0 .. tt): the g blocks are unpacked once (Q8_0's signs moved onto x; Q4_0 kept as its
 * unsigned nibbles, the 8 taken off through the row's block sums of x), and each row's g
 * whole-block sums folded into acc lanes 0 .. g with one vector multiply and add (kern/qdot.h);
 * lanes past g add (0 * 0) * 0. Called with g = 8 as a constant for full groups. */
INLINE void group32(const uint8_t *row, size_t b0, size_t g, size_t nb, int q8, const uint8_t *xq,
                    size_t xrb, size_t tt, __m256 *acc)
{
    size_t bb = q8 ? 34 : 18;
    const __m256i one = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0f);
    __m256i w[8], wa[8];
    uint16_t h[8] = {0};
    for (size_t i = 0; i < g; i++) {
        const uint8_t *p = row + (b0 + i) * bb;
        memcpy(&h[i], p, 2);
        if (q8) {
            w[i] = ld(p + 2);
            wa[i] = _mm256_sign_epi8(w[i], w[i]);
        } else {
            __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(p + 2));
            wa[i] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        }
    }
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)g), lanes);
    for (size_t t = 0; t < tt; t++) {
        const uint8_t *xr = xq + t * xrb;
        const uint8_t *q = xr + KERN_QX32_Q(nb) + 32 * b0;
        __m256i sum[8];
#pragma GCC unroll 8
        for (size_t i = 0; i < 8; i++) {
            __m256i x = i < g ? ld(q + 32 * i) : _mm256_setzero_si256();
            if (q8)
                x = _mm256_sign_epi8(x, w[i]);
            sum[i] = i < g ? _mm256_madd_epi16(_mm256_maddubs_epi16(wa[i], x), one)
                           : _mm256_setzero_si256();
        }
        __m256i S = hsum8(sum);
        if (!q8) { /* Q = nibble - 8: S = sum(nibble * x) - 8 sum(x), the row's sums in lanes */
            __m128i xs =
                _mm_loadu_si128((const __m128i *)(const void *)(xr + KERN_QX32_S(nb) + 2 * b0));
            __m256i xs32 = _mm256_and_si256(_mm256_cvtepi16_epi32(xs), mask);
            S = _mm256_sub_epi32(S, _mm256_slli_epi32(xs32, 3));
        }
        const float *dp = (const float *)(const void *)(xr + 4 * b0);
        __m256 dx = g == 8 ? _mm256_loadu_ps(dp) : _mm256_maskload_ps(dp, mask);
        __m256 p = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(S));
        acc[t] = _mm256_add_ps(acc[t], p);
    }
}

/* Row `row` of Q8_0 (q8 = 1) or Q4_0 blocks times activation rows xs[0 .. tt). */
INLINE void row32(const uint8_t *row, size_t nb, int q8, const uint8_t *xq, size_t xrb, size_t tt,
                  __m256 *acc)
{
    size_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8)
        group32(row, b0, 8, nb, q8, xq, xrb, tt, acc);
    if (b0 < nb)
        group32(row, b0, nb - b0, nb, q8, xq, xrb, tt, acc);
}

/* The 12 scale bytes of a Q4_K block as sc[0..7] (bytes 0..7) and m[0..7] (bytes 8..15), four
 * at a time: sc[j], m[j] (j < 4) are the low 6 bits of s[j], s[j + 4]; sc[j + 4] is the low
 * nibble of s[j + 8] over the top 2 bits of s[j], m[j + 4] the high nibble over those of
 * s[j + 4]. */
INLINE __m128i scales_k4(const uint8_t *s)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    return _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
}

/* Int16 element e of both 128-bit halves of v in every element of that half. */
#define BCAST16(v, e0, e1)                                                                         \
    _mm256_shuffle_epi8(                                                                           \
        v, _mm256_set_epi8(2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), \
                           2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), \
                           2 * (e1) + 1, 2 * (e1), 2 * (e1) + 1, 2 * (e1), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), 2 * (e0) + 1, 2 * (e0), \
                           2 * (e0) + 1, 2 * (e0)))

/* Q4_K: d (2) | dmin (2) | scales (12) | qs (128): value 64 c + l in the low nibble of
 * qs[32 c + l], 64 c + 32 + l in its high one. Q5_K (q5 = 1): d | dmin | scales | qh (32) |
 * qs (128), the fifth bit of value 32 v + l bit v of qh[l]. */
INLINE void row_q45k(const uint8_t *row, size_t nb, int q5, const uint8_t *xq, size_t xrb,
                     size_t tt, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
    size_t bb = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = row + b * bb;
        __m256i u[8], sc[8];
        __m128i sm = scales_k4(p + 4); /* sc bytes 0..7, m bytes 8..15 */
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        sc[0] = BCAST16(sc16, 0, 0);
        sc[1] = BCAST16(sc16, 1, 1);
        sc[2] = BCAST16(sc16, 2, 2);
        sc[3] = BCAST16(sc16, 3, 3);
        sc[4] = BCAST16(sc16, 4, 4);
        sc[5] = BCAST16(sc16, 5, 5);
        sc[6] = BCAST16(sc16, 6, 6);
        sc[7] = BCAST16(sc16, 7, 7);
        __m128i m8 = _mm_unpackhi_epi64(sm, sm);
        __m256i miv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m[i / 2] */
        for (int c = 0; c < 4; c++) {
            __m256i q = ld(p + qs + 32 * c);
            u[2 * c] = _mm256_and_si256(q, m4);
            u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        }
        if (q5) {
            __m256i qh = ld(p + 16);
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
                u[v] = _mm256_or_si256(
                    u[v], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, v), m1), 4));
        }
        float d = f16(p), dm = -f16(p + 2);
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
                s = _mm256_add_epi32(
                    s, _mm256_madd_epi16(_mm256_maddubs_epi16(u[v], ld(x->q + 32 * v)), sc[v]));
            __m256 a = fold(acc[t], d * x->d, s);
            acc[t] = fold(a, dm * x->d, _mm256_madd_epi16(ld(x->bs), miv));
        }
    }
}

/* ql (128) | qh (64) | scales (16, int8) | d (2); per half of 128 values, value l (l < 32) from
 * the low nibble of ql[l] and bits 0-1 of qh[l], 32 + l from ql[32 + l] and bits 2-3, 64 + l
 * from the high nibble of ql[l] and bits 4-5, 96 + l from ql[32 + l] and bits 6-7. Q = raw - 32,
 * the 32 taken off through the sums of 16 activations. */
INLINE void row_q6k(const uint8_t *row, size_t nb, const uint8_t *xq, size_t xrb, size_t tt,
                    __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = row + b * 210;
        __m256i u[8], sc[8];
        for (int h = 0; h < 2; h++) {
            __m256i l0 = ld(p + 64 * h), l1 = ld(p + 64 * h + 32), qh = ld(p + 128 + 32 * h);
            u[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            u[4 * h + 1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            u[4 * h + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            u[4 * h + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
        }
        const int8_t *s8 = (const int8_t *)(p + 192);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)s8));
        /* vector v: sc[2 v] in its low half, sc[2 v + 1] in its high one */
        __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
        __m256i hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
        sc[0] = BCAST16(lo, 0, 1);
        sc[1] = BCAST16(lo, 2, 3);
        sc[2] = BCAST16(lo, 4, 5);
        sc[3] = BCAST16(lo, 6, 7);
        sc[4] = BCAST16(hi, 0, 1);
        sc[5] = BCAST16(hi, 2, 3);
        sc[6] = BCAST16(hi, 4, 5);
        sc[7] = BCAST16(hi, 6, 7);
        float d = f16(p + 208);
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
                s = _mm256_add_epi32(
                    s, _mm256_madd_epi16(_mm256_maddubs_epi16(u[v], ld(x->q + 32 * v)), sc[v]));
            s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(ld(x->bs), sc16), 5));
            acc[t] = fold(acc[t], d * x->d, s);
        }
    }
}

void kern__qmatmul_avx2(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                        size_t n0, size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), K = w->n_in;
    int kind = w->type == KERN_Q8_0 ? 0 : (int)w->qtype;
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        for (size_t n = n0; n < n1; n++) {
            const uint8_t *row = (const uint8_t *)w->data + n * w->row_bytes;
            __m256 acc[TT];
            for (size_t t = 0; t < tt; t++)
                acc[t] = _mm256_setzero_ps();
            /* one row (a decode step) in a copy of its own: its sum stays in a register */
            if (tt == 1)
                switch (kind) {
                case 0: row32(row, K / 32, 1, x, xrb, 1, acc); break;
                case KERN_GGML_Q4_0: row32(row, K / 32, 0, x, xrb, 1, acc); break;
                case KERN_GGML_Q4_K: row_q45k(row, K / 256, 0, x, xrb, 1, acc); break;
                case KERN_GGML_Q5_K: row_q45k(row, K / 256, 1, x, xrb, 1, acc); break;
                default: row_q6k(row, K / 256, x, xrb, 1, acc); break;
                }
            else
                switch (kind) {
                case 0: row32(row, K / 32, 1, x, xrb, tt, acc); break;
                case KERN_GGML_Q4_0: row32(row, K / 32, 0, x, xrb, tt, acc); break;
                case KERN_GGML_Q4_K: row_q45k(row, K / 256, 0, x, xrb, tt, acc); break;
                case KERN_GGML_Q5_K: row_q45k(row, K / 256, 1, x, xrb, tt, acc); break;
                default: row_q6k(row, K / 256, x, xrb, tt, acc); break;
                }
            for (size_t t = 0; t < tt; t++)
                out[(t0 + t) * ldo + n] = hsum(acc[t]);
        }
    }
}
