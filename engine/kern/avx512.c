/* The kernels for AVX-512 (F, BW, VL, DQ) + FMA + F16C, compiled with this file's own flags
 * (engine/meson.build) so a portable build carries them; kern_select runs them only where CPUID
 * and the OS's saved state say so. The same source is compiled a second time over simde for the
 * tests (kern/avx512_isa.h). Every operation gives the bits of ref.c: one zmm holds a panel's 16
 * rows at one input, and dot keeps ref's 16 partial sums in one zmm (ref's order is that of two
 * 8-lane AVX2 accumulators, so a second zmm accumulator would change the bits). */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/f16c.h"
#include "engine/kern/kern.h"
#include "engine/kern/panel_loop.h"
#include "engine/kern/qdot.h"

#include "engine/dtype.h"
#include "engine/kern/quant.h"

#include <math.h>
#include <string.h>

#define Q8P_QUANTS (2 * KERN_PANEL)
#define Q8P_BLOCK_BYTES (KERN_PANEL * (2 + KERN_QK8_0))

/* ---- panel products ----
 * An R x 16 tile: per k, the panel's 16 weights (one zmm, converted once) against R broadcast x
 * values, R accumulators; each output is one in-order FMA chain over k, so its bits depend only
 * on its x row and weight row, never on the batch. PM = 16 rows: 16 sums, the weights and the
 * conversion constants use about 22 of the 32 zmm registers (AVX2's tile is 6 rows). */
#define PM 16
#define PANEL_PF 4096 /* bytes ahead in the panel's stream */

INLINE void panel_fma(int R, __m512 acc[], const float *x, size_t ldx, size_t k, __m512 w)
{
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)r * ldx + k]), w, acc[r]);
}

/* Line i of a Q8_0 panel block: scale * int8, rounded to float (the value a widened copy holds). */
INLINE __m512 q8_line(const uint8_t *blk, __m512 d, size_t i)
{
    return _mm512_mul_ps(d, k512_i8_ps(blk + Q8P_QUANTS + i * KERN_PANEL));
}

INLINE void store_cols(float *o, __m512 acc, size_t c0, size_t c1)
{
    if (c0 == 0 && c1 == KERN_PANEL) {
        _mm512_storeu_ps(o, acc);
        return;
    }
    float tmp[KERN_PANEL];
    _mm512_storeu_ps(tmp, acc);
    for (size_t c = c0; c < c1; c++)
        o[c] = tmp[c];
}

INLINE void panel_tile(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp, size_t K,
                       float *out, size_t ldo, size_t c0, size_t c1)
{
    __m512 acc[PM];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    if (pt == KERN_Q8_0_PANEL) {
        for (size_t b = 0; b < K / KERN_QK8_0; b++) {
            const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
            __m512 d = k512_cvtph(blk);
            for (size_t i = 0; i < KERN_QK8_0; i++) {
                _mm_prefetch((const char *)(blk + Q8P_QUANTS + i * KERN_PANEL + PANEL_PF),
                             _MM_HINT_T0);
                panel_fma(R, acc, x, ldx, b * KERN_QK8_0 + i, q8_line(blk, d, i));
            }
        }
    } else if (pt == KERN_F16_PANEL) {
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * 2 + PANEL_PF), _MM_HINT_T0);
            panel_fma(R, acc, x, ldx, k, k512_cvtph(wp + k * KERN_PANEL * 2));
        }
    } else {
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * 4 + PANEL_PF), _MM_HINT_T0);
            panel_fma(R, acc, x, ldx, k,
                      _mm512_loadu_ps((const float *)(const void *)(wp + k * KERN_PANEL * 4)));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        store_cols(out + (size_t)r * ldo, acc[r], c0, c1);
}

/* panel_tile once per (type, R): every loop bound and branch in it a constant */
PANEL_DEFINE_TILE_R(panel_tile_r, panel_tile, PM)

/* A Q8_0 panel widened to an F32 one ([K][16], the values panel_tile would compute). */
static void panel_widen_q8(const uint8_t *wp, size_t K, float *dst)
{
    for (size_t b = 0; b < K / KERN_QK8_0; b++) {
        const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
        __m512 d = k512_cvtph(blk);
        for (size_t i = 0; i < KERN_QK8_0; i++)
            _mm512_storeu_ps(dst + (b * KERN_QK8_0 + i) * KERN_PANEL, q8_line(blk, d, i));
    }
}

static size_t avx512_panel(const panel_job *j, const panel_step *s)
{
    return panel_float_step(j, s, panel_tile_r, panel_widen_q8);
}

/* kern/panel_loop.h's driver over 16-row tiles. */
static void avx512_matmul(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                          size_t ldo, size_t n0, size_t n1, float *scratch)
{
    if (m->type == KERN_QUANT_PANEL) {
        KERN512(kern__quant_matmul_avx512)(m, x, T, ldx, out, ldo, n0, n1, scratch);
        return;
    }
    panel_job j = {.m = m, .x = x, .ldx = ldx, .out = out, .ldo = ldo, .scratch = scratch};
    panel_loop(&j, T, n0, n1, PM, avx512_panel);
}

/* ---- vector helpers ---- */

INLINE float f16_at(const uint8_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return _cvtsh_ss(h);
}

/* ref.c's order: lane j of s is partial sum j over the 16-wide blocks; an 8-wide block goes to
 * sums 0..7 (the low half), then v = low + high and the 8-lane fold, then the tail in order. */
INLINE float dot_any(const float *a, const uint8_t *b, int f16, size_t n)
{
    __m512 s = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_fmadd_ps(
            _mm512_loadu_ps(a + i),
            f16 ? k512_cvtph(b + 2 * i) : _mm512_loadu_ps((const float *)(const void *)b + i), s);
    __m256 lo = _mm512_castps512_ps256(s), hi = k512_hi8(s);
    for (; i + 8 <= n; i += 8)
        lo = _mm256_fmadd_ps(
            _mm256_loadu_ps(a + i),
            f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b + 2 * i)))
                : _mm256_loadu_ps((const float *)(const void *)b + i),
            lo);
    __m256 v = _mm256_add_ps(lo, hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    float r = _mm_cvtss_f32(q);
    for (; i < n; i++) {
        float bv;
        if (f16)
            bv = f16_at(b, i);
        else
            memcpy(&bv, b + 4 * i, 4);
        r = fmaf(a[i], bv, r);
    }
    return r;
}

static float avx512_dot(const float *a, const float *b, size_t n)
{
    return dot_any(a, (const uint8_t *)b, 0, n);
}

static float avx512_dot_f16(const float *a, const uint16_t *b, size_t n)
{
    return dot_any(a, (const uint8_t *)b, 1, n);
}

/* The tails in scalar fmaf rather than masked loads: the same bits, and a masked load in the
 * emulated copy would read (not fault on, but still touch) the memory past the end. */
static void avx512_axpy(float *y, float a, const float *x, size_t n)
{
    __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

static void avx512_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, k512_cvtph(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, f16_at((const uint8_t *)x, i), y[i]);
}

static void avx512_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    float scale = 1.0f / sqrtf(avx512_dot(x, x, n) / (float)n + eps);
    __m512 sv = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) /* (x * scale) * w, two roundings, as ref.c */
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), sv),
                                                _mm512_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

#ifdef KERN_AVX512_EMULATED
const kern_ops kern_avx512_emu_ops = {
    .name = "avx512-emulated",
#else
const kern_ops kern_avx512_ops = {
    .name = "avx512",
#endif
    .matmul = avx512_matmul,
    .dot = avx512_dot,
    .dot_f16 = avx512_dot_f16,
    .axpy = avx512_axpy,
    .axpy_f16 = avx512_axpy_f16,
    .to_f16 = kern__to_f16_f16c, /* 8 at a time (kern/f16c.h) */
    .rmsnorm = avx512_rmsnorm,
    /* The integer path's product (kern/qdot.h): batches on 16 rows a zmm (kern/qdot_avx512.c),
     * one activation row on AVX2's kernels; every table's bits are the reference's. */
    .qmatmul = KERN512(kern__qmatmul_avx512),
};
