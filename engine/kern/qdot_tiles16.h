/* The AVX-512 integer products' 16-row tiles over the file's rows (kern/qdot.h): the pieces
 * every type's file shares (kern/qdot_avx512_legacy.c: Q8_0, Q4_0 .. Q5_1; kern/qdot_avx512_k.c:
 * Q2_K .. Q6_K; kern/qdot_avx512_iq4.c: IQ4_NL, IQ4_XS, MXFP4) and the loop over groups of 16
 * weight rows (QTILES16_DEFINE) that each type's entry point is; kern/qdot_avx512.c picks the entry
 * by type and sends a lone row of x to the AVX2 kernels.
 *
 * The AVX2 row kernels (kern/qdot_rows8.h) widened to 16 weight rows, one per 32-bit lane of a
 * zmm, each lane's float sum the reference's single accumulator. Per block each row's values
 * are unpacked into a ymm exactly as the AVX2 kernels do, rows r and r + 8 are paired in one
 * zmm, and a 16 x 8 transpose of 32-bit lanes (tr16) leaves lane r of vector k holding values
 * 4k .. 4k + 3 of row r. The maddubs / int16 sums / one madd per sub-block are AVX2's on twice
 * the rows, so the integer bounds kern/qdot_rows8.h states hold as they are; where the CPU has
 * VNNI, all but Q5_K and Q6_K sum each row's quads with vpdpbusd instead (and the K-quants'
 * scales come in by vpdpwssd). Every file including this one is built for the avx512 table and
 * again over simde for the tests (kern/avx512_isa.h). Header-only (always inlined). Not a public
 * header. */
#ifndef KVS_ENGINE_KERN_QDOT_TILES16_H
#define KVS_ENGINE_KERN_QDOT_TILES16_H

#include "engine/kern/avx512_isa.h"
#include "engine/kern/prefetch.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_zmm.h"

#include <string.h>

/* A type's entry point: tt (2 .. TT) rows of x at x (xrb bytes each) times outputs [n0, n1),
 * with its VNNI kernel where vnni (the native build only) and the type has one. */
#define QTILES16(type) KERN512(kern__qtiles16_##type)

void QTILES16(q8_0)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q4_0)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q4_1)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q5_0)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q5_1)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q2_k)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q3_k)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q4_k)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q5_k)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(q6_k)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                    size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(iq4_nl)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                      size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(iq4_xs)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                      size_t ldo, size_t n0, size_t n1, int vnni);
void QTILES16(mxfp4)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                     size_t ldo, size_t n0, size_t n1, int vnni);

/* v[i] = pair(row i, row i + 8) of 8 int32 each  :=  v[k] whose lane r is int32 k of row r: the
 * 8 x 8 transpose of kern/qdot_rows8.h's tr8 in each 256-bit half (its in-lane unpacks are the same
 * instructions on zmm), the last step's 128-bit moves as one two-source permute per vector. */
INLINE void tr16(__m512i v[8])
{
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int i = 0; i < 4; i++) {
        __m512i a = u[i], b = u[i + 4];
        v[i] = _mm512_permutex2var_epi64(a, lo, b);
        v[i + 4] = _mm512_permutex2var_epi64(a, hi, b);
    }
}

/* w[0..16) (one ymm per row) paired and transposed into v[0..8) */
INLINE void tr16y(const __m256i w[16], __m512i v[8])
{
    for (int r = 0; r < 8; r++)
        v[r] = pair(w[r], w[r + 8]);
    tr16(v);
}

INLINE short h16(const uint8_t *q)
{
    uint16_t h;
    memcpy(&h, q, 2);
    return (short)h;
}

/* The f16 at p[r] + off of each of the 16 rows, as floats in lanes 0..15: built in registers,
 * since 16 two-byte stores read back as one vector cannot be forwarded, and the load would wait
 * for them to retire. */
INLINE __m512 f16x16(const uint8_t *const p[16], size_t off)
{
    __m128i a = _mm_setr_epi16(h16(p[0] + off), h16(p[1] + off), h16(p[2] + off), h16(p[3] + off),
                               h16(p[4] + off), h16(p[5] + off), h16(p[6] + off), h16(p[7] + off));
    __m128i c =
        _mm_setr_epi16(h16(p[8] + off), h16(p[9] + off), h16(p[10] + off), h16(p[11] + off),
                       h16(p[12] + off), h16(p[13] + off), h16(p[14] + off), h16(p[15] + off));
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(a)), _mm256_cvtph_ps(c), 1);
}

/* MXFP4's E8M0 byte at p[r] of each of the 16 rows as its scale 2^(e - 128), lanes 0..15 */
INLINE __m512 e8m0x16(const uint8_t *const p[16])
{
    __m256 a = kern__e8m0_ps8(
        _mm256_setr_epi32(p[0][0], p[1][0], p[2][0], p[3][0], p[4][0], p[5][0], p[6][0], p[7][0]));
    __m256 c = kern__e8m0_ps8(_mm256_setr_epi32(p[8][0], p[9][0], p[10][0], p[11][0], p[12][0],
                                                p[13][0], p[14][0], p[15][0]));
    return _mm512_insertf32x8(_mm512_castps256_ps512(a), c, 1);
}

/* While block b of a group of 16 rows is read, the next group's bytes of block b (the same share
 * of its contiguous 16 rows) are fetched: 16 short streams start each group, which the hardware
 * prefetchers learn too late (kern/qdot_rows8.h's prefetch_next). */
INLINE void prefetch_next(const uint8_t *next, size_t b, size_t bb)
{
    kern_prefetch_l2(next + 16 * bb * b, 16 * bb);
}

/* Block b (bb bytes) of the 16 rows of a legacy type or IQ4_NL: p[r] its start in row r, w[k]
 * lane r raw values 4k .. 4k + 3 of row r (kern/qdot_x86.h's raw32: qs at qo, qh at ho). */
INLINE void unpack_leg(const uint8_t *const rows[16], size_t b, int bb, int qo, int ho,
                       const uint8_t *p[16], __m512i w[8])
{
    __m256i y[16];
    for (int r = 0; r < 16; r++) {
        p[r] = rows[r] + (size_t)bb * b;
        y[r] = raw32(p[r], qo, ho);
    }
    tr16y(y, w);
}

/* ---- VNNI (vpdpbusd: u8 x s8 quads summed into each int32 lane, exact, no saturation) ----
 * Only the native build has them: the avx512 table requires F/BW/VL/DQ alone, so these are
 * compiled for VNNI by attribute and chosen per call where the CPU has it; the emulated copy
 * runs the BW kernels above, so both forms are held to the reference on this machine. */
#ifndef KERN_AVX512_EMULATED
#define VNNI static __attribute__((target("avx512vnni")))

/* sum over k < n of the quads w[k] . x[4k .. 4k + 3], added to s */
INLINE __attribute__((target("avx512vnni"))) __m512i dot16(__m512i s, const __m512i *w,
                                                           const int8_t *x, int n)
{
    for (int k = 0; k < n; k++)
        s = _mm512_dpbusd_epi32(s, w[k], bcast4(x + 4 * k));
    return s;
}

/* Block b of 16 rows whose 32 values w (transposed quads) are the weights plus 128, unsigned,
 * times activation rows xq[0 .. tt) (KERN_QX_32): S = the vpdpbusd sum less 128 sx, folded with
 * the rows' scales dw (Q8_0, IQ4_NL and MXFP4) */
INLINE __attribute__((target("avx512vnni"))) void fold_u128(const __m512i w[8], __m512 dw,
                                                            const uint8_t *xq, size_t xrb,
                                                            size_t tt, size_t nb, size_t b,
                                                            __m512 *acc)
{
    for (size_t t = 0; t < tt; t++) {
        const uint8_t *xr = xq + t * xrb;
        __m512i S =
            dot16(_mm512_setzero_si512(), w, (const int8_t *)(xr + KERN_QX32_Q(nb) + 32 * b), 8);
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        S = _mm512_sub_epi32(S, _mm512_set1_epi32(128 * sx));
        acc[t] = fold16(acc[t], dw, _mm512_set1_ps(dx), cvt_ps(S));
    }
}
#else
#define VNNI_OR(grpv, grp) grp /* the emulated copy: no VNNI kernels */
#endif
#ifndef VNNI_OR
#define VNNI_OR(grpv, grp) grpv
#endif

/* Defines the entry point QTILES16(type): each group of 16 weight rows (n .. n + 15;
 * past the end the last row again, not stored) through GRPV(rows, next, K, x, xrb, tt, acc, si)
 * where vnni, else GRP(...) (the same arguments), the wanted outputs stored. next: the following
 * group's first row, which the kernels prefetch. */
#define QTILES16_DEFINE(type, GRP, GRPV)                                                           \
    void QTILES16(type)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,    \
                        size_t ldo, size_t n0, size_t n1, int vnni)                                \
    {                                                                                              \
        const uint8_t *base = (const uint8_t *)w->data;                                            \
        size_t K = w->n_in;                                                                        \
        __m512 acc[TT];                                                                            \
        __m512i si[TT]; /* the K-quants' scratch */                                                \
        (void)si;                                                                                  \
        for (size_t n = n0; n < n1; n += 16) {                                                     \
            size_t nr = n1 - n < 16 ? n1 - n : 16;                                                 \
            const uint8_t *rows[16];                                                               \
            for (size_t r = 0; r < 16; r++)                                                        \
                rows[r] = base + (n + (r < nr ? r : nr - 1)) * w->row_bytes;                       \
            const uint8_t *next = n + 32 <= w->n_out ? base + (n + 16) * w->row_bytes : rows[0];   \
            for (size_t t = 0; t < tt; t++)                                                        \
                acc[t] = _mm512_setzero_ps();                                                      \
            if (vnni)                                                                              \
                VNNI_OR(GRPV, GRP)(rows, next, K, x, xrb, tt, acc, si);                            \
            else                                                                                   \
                GRP(rows, next, K, x, xrb, tt, acc, si);                                           \
            for (size_t t = 0; t < tt; t++) {                                                      \
                float *o = out + t * ldo + n;                                                      \
                if (nr == 16) {                                                                    \
                    _mm512_storeu_ps(o, acc[t]);                                                   \
                } else {                                                                           \
                    float l[16];                                                                   \
                    _mm512_storeu_ps(l, acc[t]);                                                   \
                    memcpy(o, l, nr * sizeof(float));                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#endif
