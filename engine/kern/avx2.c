/* The kernels for AVX2 + FMA + F16C, compiled with this file's own flags (engine/meson.build:
 * -mavx2 -mfma -mf16c) so a portable build carries them; kern_select runs them only on CPUs
 * whose CPUID (and OS) say so. Every operation gives the bits of ref.c (its top comment says
 * in what order). */
#include "engine/kern/f16c.h"
#include "engine/kern/kexp.h"
#include "engine/kern/kern.h"
#include "engine/kern/panel_loop.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qx_quant.h"

#include "engine/dtype.h"
#include "engine/kern/quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kern/avx2.c needs -mavx2 -mfma -mf16c"
#endif

#define INLINE static inline __attribute__((always_inline))
#define Q8P_QUANTS (2 * KERN_PANEL)
#define Q8P_BLOCK_BYTES (KERN_PANEL * (2 + KERN_QK8_0))

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 values at index i of an F32 or F16 array. */
INLINE __m256 load8(kern_type type, const uint8_t *p, size_t i)
{
    if (type == KERN_F32 || type == KERN_F32_PANEL)
        return _mm256_loadu_ps((const float *)(const void *)(p + 4 * i));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i)));
}

INLINE float f16_at(const uint8_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return _cvtsh_ss(h);
}

/* ---- panel products ----
 * An R x 16 tile: per k, the panel's 16 weights (two vectors, converted once) against R
 * broadcast x values, R * 2 accumulators; each output is one in-order FMA chain over k, so its
 * bits depend only on its x row and weight row, never on the batch. PM = 6 rows (12 sums) fill
 * AVX2's 16 registers. */
#define PM 6
#define PANEL_PF 4096 /* bytes ahead in the panel's stream */

/* acc[r] += x[r][k] * (w0, w1) for the tile's R rows. */
INLINE void panel_fma(int R, __m256 acc[][2], const float *x, size_t ldx, size_t k, __m256 w0,
                      __m256 w1)
{
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        __m256 b = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
        acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
    }
}

/* One R x 16 tile of panel type pt. A Q8_0 weight is widened as scale * int8 rounded to float,
 * the value a widened copy holds. */
INLINE void panel_tile(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp, size_t K,
                       float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf)
{
    __m256 acc[PM][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    if (pt == KERN_Q8_0_PANEL) {
        for (size_t b = 0; b < K / KERN_QK8_0; b++) {
            const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
            __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)blk));
            __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16)));
            for (size_t i = 0; i < KERN_QK8_0; i++) {
                const uint8_t *q = blk + Q8P_QUANTS + i * KERN_PANEL;
                _mm_prefetch((const char *)(q + PANEL_PF), _MM_HINT_T0);
                panel_pf_at(pf, b * KERN_QK8_0 + i);
                __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
                __m256 w0 = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
                __m256 w1 = _mm256_mul_ps(
                    d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))));
                panel_fma(R, acc, x, ldx, b * KERN_QK8_0 + i, w0, w1);
            }
        }
    } else {
        size_t esz = pt == KERN_F32_PANEL ? 4 : 2;
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * esz + PANEL_PF), _MM_HINT_T0);
            panel_pf_at(pf, k);
            panel_fma(R, acc, x, ldx, k, load8(pt, wp, k * KERN_PANEL),
                      load8(pt, wp, k * KERN_PANEL + 8));
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *o = out + (size_t)r * ldo;
        if (c0 == 0 && c1 == KERN_PANEL) {
            _mm256_storeu_ps(o, acc[r][0]);
            _mm256_storeu_ps(o + 8, acc[r][1]);
            continue;
        }
        float tmp[KERN_PANEL];
        _mm256_storeu_ps(tmp, acc[r][0]);
        _mm256_storeu_ps(tmp + 8, acc[r][1]);
        for (size_t c = c0; c < c1; c++)
            o[c] = tmp[c];
    }
}

/* panel_tile once per (type, R): every loop bound and branch in it a constant */
PANEL_DEFINE_TILE_R(panel_tile_r, panel_tile, PM)

/* A Q8_0 panel widened to an F32 one ([K][16], the values panel_tile would compute). */
static void panel_widen_q8(const uint8_t *wp, size_t K, float *dst)
{
    for (size_t b = 0; b < K / KERN_QK8_0; b++) {
        const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)blk));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16)));
        for (size_t i = 0; i < KERN_QK8_0; i++) {
            __m128i v =
                _mm_loadu_si128((const __m128i *)(const void *)(blk + Q8P_QUANTS + i * KERN_PANEL));
            float *d = dst + (b * KERN_QK8_0 + i) * KERN_PANEL;
            _mm256_storeu_ps(d, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
            _mm256_storeu_ps(d + 8, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                          _mm_unpackhi_epi64(v, v)))));
        }
    }
}

static size_t avx2_panel(const panel_job *j, const panel_step *s)
{
    return panel_float_step(j, s, panel_tile_r, panel_widen_q8);
}

/* kern/panel_loop.h's driver over 6-row tiles. */
void kern__avx2_matmul(const kern_mat *m, const float *x, size_t T, size_t ldx, const float *xp,
                       float *out, size_t ldo, size_t n0, size_t n1, float *scratch)
{
    (void)xp; /* no pack_x in the tables that use it: always NULL */
    if (m->type == KERN_QUANT_PANEL) {
        kern__quant_matmul_avx2(m, x, T, ldx, out, ldo, n0, n1, scratch);
        return;
    }
    panel_job j = {.m = m, .x = x, .ldx = ldx, .out = out, .ldo = ldo, .scratch = scratch};
    panel_loop(&j, T, n0, n1, PM, avx2_panel);
}

/* ---- vector helpers ---- */

INLINE float dot_any(const float *a, const uint8_t *b, kern_type bt, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(bt, b, i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(bt, b, i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(bt, b, i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        float bv;
        if (bt == KERN_F32)
            memcpy(&bv, b + 4 * i, 4);
        else
            bv = f16_at(b, i);
        s = fmaf(a[i], bv, s);
    }
    return s;
}

static float avx2_dot(const float *a, const float *b, size_t n)
{
    return dot_any(a, (const uint8_t *)b, KERN_F32, n);
}

static float avx2_dot_f16(const float *a, const uint16_t *b, size_t n)
{
    return dot_any(a, (const uint8_t *)b, KERN_F16, n);
}

static void avx2_axpy(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

static void avx2_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    const uint8_t *xb = (const uint8_t *)x;
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, load8(KERN_F16, xb, i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, f16_at(xb, i), y[i]);
}

/* ---- attention's runs of cache rows ---- */

/* Lane r: v[r]'s fold in dot_any's (hsum8's) order, ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7)), for 8
 * rows at once: each level adds the same pairs as the single fold, 7 adds and 14 shuffles
 * instead of 8 horizontal sums. The levels leave row 2 k + h in lane 4 h + k. */
INLINE __m256 fold8(const __m256 v[8])
{
    __m256 t[4], u[2];
    for (int i = 0; i < 4; i++) /* lanes 0-3: row 2i's v[j] + v[j + 4], 4-7: row 2i + 1's */
        t[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) /* (t0 + t2, t1 + t3) of rows 4i, 4i + 2 | 4i + 1, 4i + 3 */
        u[i] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 z = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Rows r0 .. r0 + 4 of wide (n floats each, n a multiple of 16) against a: dot_any's two
 * accumulators per row, added, into v[r0 ..]. */
INLINE void dot4_f32(const float *a, const float *wide, size_t n, int r0, __m256 v[8])
{
    __m256 s0[4], s1[4];
    for (int r = 0; r < 4; r++)
        s0[r] = s1[r] = _mm256_setzero_ps();
    for (size_t c = 0; c < n; c += 16) {
        __m256 a0 = _mm256_loadu_ps(a + c), a1 = _mm256_loadu_ps(a + c + 8);
        for (int r = 0; r < 4; r++) {
            const float *w = wide + (size_t)(r0 + r) * n + c;
            s0[r] = _mm256_fmadd_ps(a0, _mm256_load_ps(w), s0[r]);
            s1[r] = _mm256_fmadd_ps(a1, _mm256_load_ps(w + 8), s1[r]);
        }
    }
    for (int r = 0; r < 4; r++)
        v[r0 + r] = _mm256_add_ps(s0[r], s1[r]);
}

/* 8 rows at a time widened into wide (once for every head where the heads share their rows, as
 * under GQA), then each head's 8 dots from there and one fold. */
static void avx2_dot_f16_n(const kern_run *rn, const float *a, size_t lda, float *out, size_t ldo)
{
    size_t n = rn->n, m = rn->m;
    if (n % 16 || n > 256) {
        for (size_t h = 0; h < rn->g; h++)
            for (size_t i = 0; i < m; i++)
                out[h * ldo + i] =
                    dot_any(a + h * lda, (const uint8_t *)kern_run_row(rn, h, i), KERN_F16, n);
        return;
    }
    _Alignas(32) float wide[8 * 256];
    for (size_t i0 = 0; i0 < m; i0 += 8) {
        size_t mm = m - i0 < 8 ? m - i0 : 8;
        for (size_t h = 0; h < rn->g; h++) {
            if (h == 0 || rn->bh) /* the rows past m repeat row i0: not stored below */
                for (size_t r = 0; r < 8; r++) {
                    const uint8_t *row =
                        (const uint8_t *)kern_run_row(rn, h, i0 + (r < mm ? r : 0));
                    for (size_t c = 0; c < n; c += 8)
                        _mm256_store_ps(wide + r * n + c, load8(KERN_F16, row, c));
                }
            __m256 v[8];
            dot4_f32(a + h * lda, wide, n, 0, v);
            dot4_f32(a + h * lda, wide, n, 4, v);
            __m256 f = fold8(v);
            if (mm == 8) {
                _mm256_storeu_ps(out + h * ldo + i0, f);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, f);
                memcpy(out + h * ldo + i0, tmp, mm * sizeof(float));
            }
        }
    }
}

/* HG heads' y over 32 of their values, y in registers over the m rows: 4 HG independent FMA
 * chains; where the heads share their rows (bh = 0), a row's values widened once. */
INLINE void axpy_heads(const kern_run *rn, size_t d, float *y, size_t ldy, const float *w,
                       size_t ldw, int HG, int shared)
{
    __m256 acc[2][4];
    for (int h = 0; h < HG; h++)
        for (int c = 0; c < 4; c++)
            acc[h][c] = _mm256_loadu_ps(y + h * ldy + d + 8 * c);
    for (size_t i = 0; i < rn->m; i++) {
        const uint8_t *row = (const uint8_t *)rn->b + i * rn->stride + 2 * d;
        __m256 v[4];
        if (shared)
            for (int c = 0; c < 4; c++)
                v[c] = load8(KERN_F16, row, 8 * c);
        for (int h = 0; h < HG; h++) {
            __m256 wv = _mm256_set1_ps(w[h * ldw + i]);
            for (int c = 0; c < 4; c++)
                acc[h][c] = _mm256_fmadd_ps(
                    wv, shared ? v[c] : load8(KERN_F16, row + h * rn->bh, 8 * c), acc[h][c]);
        }
    }
    for (int h = 0; h < HG; h++)
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(y + h * ldy + d + 8 * c, acc[h][c]);
}

static void avx2_axpy_f16_n(const kern_run *rn, float *y, size_t ldy, const float *w, size_t ldw)
{
    if (rn->n % 32) {
        for (size_t h = 0; h < rn->g; h++)
            for (size_t i = 0; i < rn->m; i++)
                avx2_axpy_f16(y + h * ldy, w[h * ldw + i], kern_run_row(rn, h, i), rn->n);
        return;
    }
    for (size_t d = 0; d < rn->n; d += 32)
        for (size_t h = 0; h < rn->g; h += 2) {
            kern_run r = *rn;
            r.b = (const uint8_t *)rn->b + h * rn->bh;
            if (rn->g - h == 1)
                axpy_heads(&r, d, y + h * ldy, ldy, w + h * ldw, ldw, 1, 0);
            else if (rn->bh == 0)
                axpy_heads(&r, d, y + h * ldy, ldy, w + h * ldw, ldw, 2, 1);
            else
                axpy_heads(&r, d, y + h * ldy, ldy, w + h * ldw, ldw, 2, 0);
        }
}

/* ---- attention's softmax (kern/kexp.h: kern_exp in every lane, two ymm of sums) ---- */

/* kern_exp's and kern_expm1's common part: p = (e^r - 1) / r for x's r, and 2^k in *s */
INLINE __m256 exp8_poly(__m256 x, __m256 *r_out, __m256 *s)
{
    const __m256 shift = _mm256_set1_ps(KEXP_SHIFT);
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(KEXP_LOG2E), shift);
    __m256 k = _mm256_sub_ps(t, shift);
    __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-KEXP_LN2_HI), x);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(-KEXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(KEXP_C7), r, _mm256_set1_ps(KEXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KEXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KEXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KEXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KEXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shift));
    *s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    *r_out = r;
    return p;
}

INLINE __m256 exp8(__m256 x)
{
    __m256 r, s, p = exp8_poly(x, &r, &s);
    __m256 y = _mm256_mul_ps(_mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f)), s);
    y = _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(KEXP_MIN), _CMP_GE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

INLINE __m256 expm1_8(__m256 x)
{
    __m256 r, s, p = exp8_poly(x, &r, &s);
    __m256 y = _mm256_fmadd_ps(s, _mm256_mul_ps(p, r), _mm256_sub_ps(s, _mm256_set1_ps(1.0f)));
    y = _mm256_blendv_ps(_mm256_set1_ps(-1.0f), y,
                         _mm256_cmp_ps(x, _mm256_set1_ps(KEXP_MIN), _CMP_GE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static float avx2_softmax(float *sc, size_t n, float *max)
{
    size_t n16 = n / 16 * 16;
    float lanes[16];
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (size_t i = 0; i < n16; i += 16) {
        __m256 v0 = _mm256_loadu_ps(sc + i), v1 = _mm256_loadu_ps(sc + i + 8);
        m0 = _mm256_blendv_ps(m0, v0, _mm256_cmp_ps(v0, m0, _CMP_GT_OQ));
        m1 = _mm256_blendv_ps(m1, v1, _mm256_cmp_ps(v1, m1, _CMP_GT_OQ));
    }
    _mm256_storeu_ps(lanes, m0);
    _mm256_storeu_ps(lanes + 8, m1);
    float mx = kexp_max_tail(lanes, sc, n16, n);
    __m256 mv = _mm256_set1_ps(mx), s0 = _mm256_setzero_ps(), s1 = s0;
    for (size_t i = 0; i < n16; i += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), mv));
        __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i + 8), mv));
        _mm256_storeu_ps(sc + i, e0);
        _mm256_storeu_ps(sc + i + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    _mm256_storeu_ps(lanes, s0);
    _mm256_storeu_ps(lanes + 8, s1);
    *max = mx;
    return kexp_sum_tail(lanes, sc, n16, n, mx);
}

/* x * sigmoid(v) * u, the gated MLPs' tail (kern/kexp.h): with e = kern_exp(-|v|),
 * (v >= 0 ? x : x * e) / (1 + e) * u, so 1 + e never cancels. SiLU is gate8(x, x, u). */
INLINE __m256 gate8(__m256 x, __m256 v, __m256 u)
{
    __m256 e = exp8(_mm256_or_ps(v, _mm256_set1_ps(-0.0f))); /* -|v| */
    __m256 num =
        _mm256_blendv_ps(_mm256_mul_ps(x, e), x, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ));
    return _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void avx2_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        _mm256_storeu_ps(g + i, gate8(x, x, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = kern_silu(g[i]) * u[i];
}

static void avx2_gelu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 c = _mm256_mul_ps(_mm256_set1_ps(KGELU_A), _mm256_mul_ps(x, x));
        __m256 v = _mm256_mul_ps(_mm256_set1_ps(KGELU_2K), _mm256_fmadd_ps(c, x, x));
        _mm256_storeu_ps(g + i, gate8(x, v, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = kern_gelu(g[i]) * u[i];
}

static void avx2_softcap(float *x, size_t n, float scale, float cap)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), sc = _mm256_set1_ps(scale), cp = _mm256_set1_ps(cap);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_div_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), cp);
        __m256 a = _mm256_andnot_ps(sign, y);
        __m256 m = expm1_8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), a));
        __m256 t = _mm256_div_ps(_mm256_xor_ps(m, sign), _mm256_add_ps(_mm256_set1_ps(2.0f), m));
        t = _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, y)); /* copysign */
        _mm256_storeu_ps(x + i, _mm256_mul_ps(cp, t));
    }
    for (; i < n; i++)
        x[i] = kern_softcap(x[i], scale, cap);
}

static void avx2_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    float scale = 1.0f / sqrtf(avx2_dot(x, x, n) / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* max |x| of n (a multiple of 8) values, a NaN skipped: _mm256_max_ps(a, m) is a > m ? a : m */
static inline __attribute__((always_inline)) float avx2_qx_amax(const float *x, size_t n)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8)
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), m);
    float l[8];
    _mm256_storeu_ps(l, m);
    return kern__qx_amax(l, 8);
}

/* kern/qx_quant.h's quantizer under this file's flags (the compiler's vectors, the same bytes) */
static void avx2_qx_quantize(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in,
                             void *dst)
{
    kern__qx_quantize(fmt, x, T, ldx, n_in, dst, avx2_qx_amax);
}

const kern_ops kern_avx2_ops = {
    .name = "avx2",
    .matmul = kern__avx2_matmul,
    .dot = avx2_dot,
    .dot_f16 = avx2_dot_f16,
    .axpy = avx2_axpy,
    .axpy_f16 = avx2_axpy_f16,
    .to_f16 = kern__to_f16_f16c,
    .rmsnorm = avx2_rmsnorm,
    .qmatmul = kern__qmatmul_avx2,
    .softmax = avx2_softmax,
    .silu_mul = avx2_silu_mul,
    .gelu_mul = avx2_gelu_mul,
    .softcap = avx2_softcap,
    .qx_quantize = avx2_qx_quantize,
    .dot_f16_n = avx2_dot_f16_n,
    .axpy_f16_n = avx2_axpy_f16_n,
};
