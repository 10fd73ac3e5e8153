/* AVX2 + FMA + F16C products over quantized panels (kern/quant.h), compiled with avx2.c's flags.
 * Each super-block's planes are expanded to int8 Q with 32-byte shifts and masks (a pshufb for
 * the IQ4 levels) into an L1 buffer, then every panel line is widened as fmadd(S, Q, M), the
 * exact value (S * Q is exact), and multiplied in the in-order FMA chain of kern/ref.c: the bits
 * of the portable table. One or two rows read the blocks in place (one row: two panels at once);
 * from three rows on each 256-input chunk of a panel is widened once into an L1 buffer and every
 * row tile continues its chains over it (the scratch the table's matmul is offered is unused). */
#include "engine/kern/panel_loop.h"
#include "engine/kern/quant.h"

#include <immintrin.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern/quant_avx2.c needs -mavx2 -mfma -mf16c"
#endif

#define INLINE static inline __attribute__((always_inline))
#define PM 6 /* rows per tile, as avx2.c */
#define QBUF (256 * KERN_PANEL)

INLINE __m256i ld32(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

INLINE void st32(int8_t *p, __m256i v)
{
    _mm256_storeu_si256((__m256i *)(void *)p, v);
}

/* Q from raw: the IQ4 levels (a pshufb) or the bias. */
INLINE __m256i q_of(int fin, __m256i lut, __m256i bias, __m256i raw)
{
    if (fin == 2)
        return _mm256_shuffle_epi8(lut, raw);
    return fin == 1 ? _mm256_sub_epi8(raw, bias) : raw;
}

/* The int8 Q (T[k * 16 + c]) of one panel super-block: kern__q_expand_ref's values. The low bits
 * are stored, then the high bits (if any) or'ed in; the levels or the bias are applied in the
 * last pass over each vector, not in a pass of their own (a load and a store fewer per 32
 * values: kvs-bench-qmatmul, in the caches, measured IQ4_NL ~15% and Q4_0, Q5_0 ~8% faster). */
INLINE void expand_t(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, int8_t *T, int fin)
{
    size_t n = (size_t)f->sb * KERN_PANEL;
    const uint8_t *lo = ps + o->lo, *hi = ps + o->hi;
    const __m256i lut =
        f->lut ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)f->lut))
               : _mm256_setzero_si256();
    const __m256i bias = _mm256_set1_epi8((char)f->bias);
    if (f->lo_bits == 4) {
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        if (f->hi_bits == 0)
            for (size_t i = 0; i < n / 64; i++) {
                __m256i v = ld32(lo + 32 * i);
                st32(T + 64 * i, q_of(fin, lut, bias, _mm256_and_si256(v, m4)));
                st32(T + 64 * i + 32,
                     q_of(fin, lut, bias, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
            }
        else
            for (size_t i = 0; i < n / 64; i++) {
                __m256i v = ld32(lo + 32 * i);
                st32(T + 64 * i, _mm256_and_si256(v, m4));
                st32(T + 64 * i + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
    } else {
        const __m256i m2 = _mm256_set1_epi8(3);
        for (size_t i = 0; i < n / 128; i++) {
            __m256i v = ld32(lo + 32 * i);
            int q = f->hi_bits ? 0 : fin; /* the last pass over these vectors applies fin */
            st32(T + 128 * i, q_of(q, lut, bias, _mm256_and_si256(v, m2)));
            st32(T + 128 * i + 32,
                 q_of(q, lut, bias, _mm256_and_si256(_mm256_srli_epi16(v, 2), m2)));
            st32(T + 128 * i + 64,
                 q_of(q, lut, bias, _mm256_and_si256(_mm256_srli_epi16(v, 4), m2)));
            st32(T + 128 * i + 96,
                 q_of(q, lut, bias, _mm256_and_si256(_mm256_srli_epi16(v, 6), m2)));
        }
    }
    __m128i sh = _mm_cvtsi32_si128(f->lo_bits);
    if (f->hi_bits == 1) {
        const __m256i m1 = _mm256_set1_epi8(1);
        for (size_t i = 0; i < n / 256; i++) {
            __m256i h = ld32(hi + 32 * i);
            for (int s = 0; s < 8; s++) {
                __m256i b = _mm256_and_si256(_mm256_srli_epi16(h, s), m1);
                int8_t *t = T + 256 * i + 32 * s;
                st32(t, q_of(fin, lut, bias,
                             _mm256_or_si256(ld32((const uint8_t *)t), _mm256_sll_epi16(b, sh))));
            }
        }
    } else if (f->hi_bits == 2) {
        const __m256i m2 = _mm256_set1_epi8(3);
        for (size_t i = 0; i < n / 128; i++) {
            __m256i h = ld32(hi + 32 * i);
            for (int s = 0; s < 4; s++) {
                __m256i b = _mm256_and_si256(_mm256_srli_epi16(h, 2 * s), m2);
                int8_t *t = T + 128 * i + 32 * s;
                st32(t, q_of(fin, lut, bias,
                             _mm256_or_si256(ld32((const uint8_t *)t), _mm256_sll_epi16(b, sh))));
            }
        }
    }
}

/* fin constant in each copy: 0 Q = raw, 1 Q = raw - bias, 2 Q = lut[raw] */
static void expand(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, int8_t *T)
{
    if (f->lut)
        expand_t(f, o, ps, T, 2);
    else if (f->bias)
        expand_t(f, o, ps, T, 1);
    else
        expand_t(f, o, ps, T, 0);
}

INLINE __m256 cvtph8(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* 8 bf16 at p as floats (MXFP4's d): each shifted into the top half of its float */
INLINE __m256 bf16x8(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* S and M of the 16 rows (two vectors each) for sub-block j of a panel super-block. */
INLINE void scales(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, size_t j, __m256 S[2],
                   __m256 M[2])
{
    __m256 d0 = f->d_bf16 ? bf16x8(ps) : cvtph8(ps),
           d1 = f->d_bf16 ? bf16x8(ps + 16) : cvtph8(ps + 16);
    if (f->has_sc) {
        __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)(ps + o->sc + j * KERN_PANEL));
        S[0] = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        S[1] =
            _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))));
    } else {
        S[0] = d0;
        S[1] = d1;
    }
    if (!f->has_min) {
        M[0] = M[1] = _mm256_set1_ps(-0.0f);
        return;
    }
    __m256 m0 = cvtph8(ps + o->dm), m1 = cvtph8(ps + o->dm + 16);
    if (f->has_sc) {
        __m128i mi = _mm_loadu_si128((const __m128i *)(const void *)(ps + o->mi + j * KERN_PANEL));
        M[0] = _mm256_mul_ps(m0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mi)));
        M[1] =
            _mm256_mul_ps(m1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(mi, mi))));
    } else {
        M[0] = m0;
        M[1] = m1;
    }
}

/* Line k's 16 weights from the expanded Q. */
INLINE void line(const int8_t *T, size_t k, const __m256 S[2], const __m256 M[2], __m256 *w0,
                 __m256 *w1)
{
    /* two 8-byte loads, each folded into its vpmovsxbd */
    __m128i v0 = _mm_loadl_epi64((const __m128i *)(const void *)(T + k * KERN_PANEL));
    __m128i v1 = _mm_loadl_epi64((const __m128i *)(const void *)(T + k * KERN_PANEL + 8));
    *w0 = _mm256_fmadd_ps(S[0], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), M[0]);
    *w1 = _mm256_fmadd_ps(S[1], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), M[1]);
}

/* An R x (16 NP) tile over NP adjacent panels at wp (pbytes apart), read in place: NP = 2 for
 * one row keeps four independent chains in flight instead of two. */
INLINE void qtile(const kern_qfmt *f, const kern_qoff *o, int NP, int R, const float *x, size_t ldx,
                  const uint8_t *wp, size_t pbytes, size_t K, float *out, size_t ldo, size_t c0,
                  size_t c1)
{
    __m256 acc[PM][4];
    int8_t T[2][QBUF] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * NP; v++)
            acc[r][v] = _mm256_setzero_ps();
    size_t n_sub = f->sb / f->sub, sub = f->sub;
    for (size_t b = 0; b < K / f->sb; b++) {
        const uint8_t *ps[2];
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            ps[p] = wp + (size_t)p * pbytes + b * o->psb;
            expand(f, o, ps[p], T[p]);
        }
        for (size_t j = 0; j < n_sub; j++) {
            __m256 S[2][2], M[2][2];
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++)
                scales(f, o, ps[p], f->has_sc ? j : 0, S[p], M[p]);
            for (size_t k = j * sub; k < (j + 1) * sub; k++) {
                /* each panel's two weight vectors used as soon as made: with R = 1, NP = 2 the
                 * 4 sums, 8 scale vectors, x and 2 weights fit AVX2's 16 registers (no sum is
                 * spilled, which would put a store and a load in its chain) */
                const float *xk = x + b * f->sb + k;
                __m256 xb[PM];
#pragma GCC unroll 6
                for (int r = 0; r < R; r++)
                    xb[r] = _mm256_broadcast_ss(xk + (size_t)r * ldx);
#pragma GCC unroll 2
                for (int p = 0; p < NP; p++) {
                    __m256 w0, w1;
                    line(T[p], k, S[p], M[p], &w0, &w1);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        acc[r][2 * p] = _mm256_fmadd_ps(xb[r], w0, acc[r][2 * p]);
                        acc[r][2 * p + 1] = _mm256_fmadd_ps(xb[r], w1, acc[r][2 * p + 1]);
                    }
                }
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *orow = out + (size_t)r * ldo;
        float tmp[4 * 8];
#pragma GCC unroll 4
        for (int v = 0; v < 2 * NP; v++)
            _mm256_storeu_ps(tmp + 8 * v, acc[r][v]);
        for (size_t c = c0; c < c1; c++)
            orow[c] = tmp[c];
    }
}

/* One row against two adjacent panels (out[0..32)), read in place: four independent chains
 * instead of two, so the FMA latency no longer bounds a decode step. Named variables rather than
 * qtile's arrays: the 4 sums, 8 scale vectors, x and 2 weights fit AVX2's 16 registers, and gcc
 * keeps them there (with the arrays it spilled a sum, a store and a load in its chain). */
static void qrow2(const kern_qfmt *f, const kern_qoff *o, const float *x, const uint8_t *wp,
                  size_t pbytes, size_t K, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int8_t T0[QBUF] __attribute__((aligned(32))), T1[QBUF] __attribute__((aligned(32)));
    size_t n_sub = f->sb / f->sub, sub = f->sub;
    for (size_t b = 0; b < K / f->sb; b++) {
        const uint8_t *p0 = wp + b * o->psb, *p1 = p0 + pbytes;
        expand(f, o, p0, T0);
        expand(f, o, p1, T1);
        for (size_t j = 0; j < n_sub; j++) {
            __m256 S0[2], M0[2], S1[2], M1[2];
            scales(f, o, p0, f->has_sc ? j : 0, S0, M0);
            scales(f, o, p1, f->has_sc ? j : 0, S1, M1);
            const float *xk = x + b * f->sb;
            for (size_t k = j * sub; k < (j + 1) * sub; k++) {
                __m256 xb = _mm256_broadcast_ss(xk + k), w0, w1;
                line(T0, k, S0, M0, &w0, &w1);
                a0 = _mm256_fmadd_ps(xb, w0, a0);
                a1 = _mm256_fmadd_ps(xb, w1, a1);
                line(T1, k, S1, M1, &w0, &w1);
                a2 = _mm256_fmadd_ps(xb, w0, a2);
                a3 = _mm256_fmadd_ps(xb, w1, a3);
            }
        }
    }
    _mm256_storeu_ps(out, a0);
    _mm256_storeu_ps(out + 8, a1);
    _mm256_storeu_ps(out + 16, a2);
    _mm256_storeu_ps(out + 24, a3);
}

#define QTILE(t, R) t(f, o, 1, R, x, ldx, wp, 0, K, out, ldo, c0, c1)
static void qtile_r(const kern_qfmt *f, const kern_qoff *o, int R, const float *x, size_t ldx,
                    const uint8_t *wp, size_t K, float *out, size_t ldo, size_t c0, size_t c1)
{
    PANEL_SWITCH(R, PM, QTILE, qtile)
}

/* Rows [b0 * sb, b0 * sb + n) of panel wp widened into dst ([n][16]). */
static void widen_chunk(const kern_qfmt *f, const kern_qoff *o, const uint8_t *wp, size_t b0,
                        size_t n, float *dst)
{
    int8_t T[QBUF] __attribute__((aligned(32)));
    size_t n_sub = f->sb / f->sub, sub = f->sub;
    for (size_t b = b0; b < b0 + n / f->sb; b++, dst += (size_t)f->sb * KERN_PANEL) {
        const uint8_t *ps = wp + b * o->psb;
        expand(f, o, ps, T);
        for (size_t j = 0; j < n_sub; j++) {
            __m256 S[2], M[2];
            scales(f, o, ps, f->has_sc ? j : 0, S, M);
            for (size_t k = j * sub; k < (j + 1) * sub; k++) {
                __m256 w0, w1;
                line(T, k, S, M, &w0, &w1);
                _mm256_store_ps(dst + k * KERN_PANEL, w0);
                _mm256_store_ps(dst + k * KERN_PANEL + 8, w1);
            }
        }
    }
}

/* An R x 16 tile continuing its chains over n widened inputs w ([n][16]): the sums start at
 * +0 (first) or at the values out holds (stored floats: exact), so chunk after chunk is one
 * in-order FMA chain over k. */
INLINE void ftile(int R, const float *x, size_t ldx, const float *w, size_t n, float *out,
                  size_t ldo, size_t c0, size_t c1, bool first)
{
    __m256 acc[PM][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        if (first || c0 != 0 || c1 != KERN_PANEL) {
            float tmp[KERN_PANEL] = {0};
            for (size_t c = c0; c < c1 && !first; c++)
                tmp[c] = out[(size_t)r * ldo + c];
            acc[r][0] = _mm256_loadu_ps(tmp);
            acc[r][1] = _mm256_loadu_ps(tmp + 8);
        } else {
            acc[r][0] = _mm256_loadu_ps(out + (size_t)r * ldo);
            acc[r][1] = _mm256_loadu_ps(out + (size_t)r * ldo + 8);
        }
    }
    for (size_t k = 0; k < n; k++) {
        __m256 w0 = _mm256_load_ps(w + k * KERN_PANEL), w1 = _mm256_load_ps(w + k * KERN_PANEL + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float tmp[KERN_PANEL];
        _mm256_storeu_ps(tmp, acc[r][0]);
        _mm256_storeu_ps(tmp + 8, acc[r][1]);
        for (size_t c = c0; c < c1; c++)
            out[(size_t)r * ldo + c] = tmp[c];
    }
}

/* ftile once per R */
PANEL_DEFINE_FTILE_R(ftile_r, ftile, PM)

/* From 3 rows on, each chunk of the panel is widened once into L1 and every row tile continues
 * its chains over it (in the tile, the R x 2 sums and 4 scale vectors would no longer fit the
 * 16 registers); one row reads two whole panels at once where it may. */
static size_t qpanel(const panel_job *j, const panel_step *s)
{
    if (s->tc > 2) {
        panel_widened_step(j, s, widen_chunk, ftile_r);
        return 1;
    }
    size_t K = j->m->n_in;
    if (s->tc == 1 && panel_pair_whole(s)) {
        qrow2(j->f, &j->o, j->x + s->t0 * j->ldx, s->wp, s->pbytes, K,
              j->out + s->t0 * j->ldo + s->base);
        return 2;
    }
    for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R)
        qtile_r(j->f, &j->o, panel_rows(s, t), j->x + t * j->ldx, j->ldx, s->wp, K,
                j->out + t * j->ldo + s->base, j->ldo, s->c0, s->c1);
    return 1;
}

/* kern/panel_loop.h's driver; the scratch offered is unused (the chunks live on the stack). */
void kern__quant_matmul_avx2(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                             size_t ldo, size_t n0, size_t n1, float *scratch)
{
    (void)scratch;
    panel_job j = {.m = m, .x = x, .ldx = ldx, .out = out, .ldo = ldo, .f = kern__qfmt(m->qtype)};
    j.o = kern__qoff(j.f);
    panel_loop(&j, T, n0, n1, PM, qpanel);
}
