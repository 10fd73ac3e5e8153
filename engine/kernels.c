/* Forward-pass kernels. The matrix kernels tile RB input rows x CB weight rows and keep the
 * RB * CB partial sums in registers, reducing over k in 8-lane vectors and summing the lanes
 * once at the end (so a weight row's bytes are read once per RB rows of x). */
#include "engine/kernels.h"

#include "engine/gguf.h"

#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h> /* baseline on x86-64: the panel copy's transposes */
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERN_AVX2 1
#include <immintrin.h>
#endif

#define Q8_BLOCK_BYTES (2 + QK8_0)
/* A Q8_0 panel's block of 32 inputs: 16 f16 scales, then [32][16] int8. */
#define Q8P_QUANTS (2 * KERN_PANEL)
#define Q8P_BLOCK_BYTES (KERN_PANEL * Q8_BLOCK_BYTES)

void kern_mat_init(kern_mat *m, kern_type type, const void *data, size_t n_out, size_t n_in)
{
    m->type = type;
    m->data = data;
    m->n_out = n_out;
    m->n_in = n_in;
    m->row_bytes = type == KERN_F32 || type == KERN_F32_PANEL   ? n_in * 4
                   : type == KERN_F16 || type == KERN_F16_PANEL ? n_in * 2
                                                                : n_in / QK8_0 * Q8_BLOCK_BYTES;
}

static size_t n_panels(size_t n_out)
{
    return (n_out + KERN_PANEL - 1) / KERN_PANEL;
}

size_t kern_panel_bytes(const kern_mat *src)
{
    if (src->type != KERN_F32 && src->type != KERN_F16 && src->type != KERN_Q8_0)
        return 0;
    return n_panels(src->n_out) * KERN_PANEL * src->row_bytes;
}

#ifdef __SSE2__
/* F16 rows r[0..7], inputs k..k+7, to 8 panel lines (the 8 rows' values at k + i): an 8 x 8
 * transpose of 16-bit lanes. */
static void f16_transpose8(const uint8_t *const *r, size_t k, uint8_t *d)
{
    __m128i a[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm_loadu_si128((const __m128i *)(const void *)(r[i] + 2 * k));
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm_unpacklo_epi16(a[i], a[i + 1]);
        t[i + 1] = _mm_unpackhi_epi16(a[i], a[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
        u[h] = _mm_unpacklo_epi32(t[h], t[h + 2]);
        u[h + 1] = _mm_unpackhi_epi32(t[h], t[h + 2]);
        u[h + 2] = _mm_unpacklo_epi32(t[h + 1], t[h + 3]);
        u[h + 3] = _mm_unpackhi_epi32(t[h + 1], t[h + 3]);
    }
    for (int j = 0; j < 4; j++) {
        _mm_storeu_si128((__m128i *)(void *)(d + (2 * j) * KERN_PANEL * 2),
                         _mm_unpacklo_epi64(u[j], u[j + 4]));
        _mm_storeu_si128((__m128i *)(void *)(d + (2 * j + 1) * KERN_PANEL * 2),
                         _mm_unpackhi_epi64(u[j], u[j + 4]));
    }
}
#endif

void kern_mat_to_panels(const kern_mat *src, void *dst, kern_mat *out)
{
    size_t K = src->n_in, pbytes = KERN_PANEL * src->row_bytes;
    const uint8_t *s = src->data;
    uint8_t *d = dst;
    /* rows outer, so each source row is read once, sequentially */
    for (size_t p = 0; p < n_panels(src->n_out); p++, d += pbytes) {
        if ((p + 1) * KERN_PANEL > src->n_out)
            memset(d, 0, pbytes); /* padding rows */
        size_t c_done = 0;
#ifdef __SSE2__
        if (src->type == KERN_F16 && (p + 1) * KERN_PANEL <= src->n_out && K % 8 == 0) {
            for (size_t g = 0; g < KERN_PANEL; g += 8) {
                const uint8_t *r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = s + (p * KERN_PANEL + g + (size_t)i) * src->row_bytes;
                for (size_t k = 0; k < K; k += 8)
                    f16_transpose8(r, k, d + (k * KERN_PANEL + g) * 2);
            }
            c_done = KERN_PANEL; /* a whole F16 panel, 8 x 8 blocks at a time */
        }
#endif
        for (size_t c = c_done; c < KERN_PANEL && p * KERN_PANEL + c < src->n_out; c++) {
            const uint8_t *row = s + (p * KERN_PANEL + c) * src->row_bytes;
            if (src->type == KERN_F16) {
                for (size_t k = 0; k < K; k++)
                    memcpy(d + (k * KERN_PANEL + c) * 2, row + k * 2, 2);
            } else if (src->type == KERN_F32) {
                for (size_t k = 0; k < K; k++)
                    memcpy(d + (k * KERN_PANEL + c) * 4, row + k * 4, 4);
            } else {
                for (size_t b = 0; b < K / QK8_0; b++) {
                    const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
                    uint8_t *db = d + b * Q8P_BLOCK_BYTES;
                    memcpy(db + 2 * c, blk, 2);
                    for (size_t i = 0; i < QK8_0; i++)
                        db[Q8P_QUANTS + i * KERN_PANEL + c] = blk[2 + i];
                }
            }
        }
    }
    kern_type pt = src->type == KERN_F32   ? KERN_F32_PANEL
                   : src->type == KERN_F16 ? KERN_F16_PANEL
                                           : KERN_Q8_0_PANEL;
    kern_mat_init(out, pt, dst, src->n_out, K);
}

static inline float f16_at(const uint8_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return ggml_fp16_to_fp32(h);
}

/* Weight k of a row as the F32 value a widened copy would hold. */
static inline float w_at(kern_type type, const uint8_t *row, size_t k)
{
    switch (type) {
    case KERN_F32: {
        float f;
        memcpy(&f, row + 4 * k, 4);
        return f;
    }
    case KERN_F16: return f16_at(row, k);
    default: {
        const uint8_t *blk = row + k / QK8_0 * Q8_BLOCK_BYTES;
        return f16_at(blk, 0) * (float)(int8_t)blk[2 + k % QK8_0];
    }
    }
}

#ifdef KERN_AVX2

/* With AVX-512VL the compiler has 32 vector registers: a 4 x 4 tile (16 sums, 4 x, 4 scales)
 * fits; plain AVX2 has 16, so 4 x 2. */
#ifdef __AVX512VL__
#define CB 4
#else
#define CB 2
#endif
#define RB 4
#ifndef SEQ_MAX_T
#define SEQ_MAX_T 4 /* measured: 2-3x at T = 1, 2; even at 4 */
#endif
#ifndef PF_DIST
#define PF_DIST 512
#endif
#define INLINE static inline __attribute__((always_inline))

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE __m256 load_w8(kern_type type, const uint8_t *row, size_t k)
{
    if (type == KERN_F32)
        return _mm256_loadu_ps((const float *)(const void *)(row + 4 * k));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k)));
}

/* Stores the tile's sums plus the scalar tail k0..K-1. */
INLINE void tile_store(const __m256 *acc, int stride, int rb, int cb, kern_type type,
                       const float *x, size_t ldx, const uint8_t *w, size_t ldw, size_t k0,
                       size_t K, float *out, size_t ldo)
{
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            float s = hsum8(acc[r * stride + c]);
            for (size_t k = k0; k < K; k++)
                s += x[r * ldx + k] * w_at(type, w + c * ldw, k);
            out[r * ldo + c] = s;
        }
}

/* F32 / F16 tile: rb rows of x against cb weight rows. */
INLINE void tile_fp(kern_type type, int rb, int cb, const float *x, size_t ldx, const uint8_t *w,
                    size_t ldw, size_t K, float *out, size_t ldo)
{
    __m256 acc[RB][CB];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 4
        for (int c = 0; c < cb; c++)
            acc[r][c] = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[RB];
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++)
            xv[r] = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 4
        for (int c = 0; c < cb; c++) {
            /* The rows are separate streams: fetch ahead so T = 1 runs at memory speed. */
            _mm_prefetch((const char *)(w + c * ldw + (type == KERN_F32 ? 4 : 2) * k + PF_DIST),
                         _MM_HINT_T0);
            __m256 wv = load_w8(type, w + c * ldw, k);
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    tile_store(&acc[0][0], CB, rb, cb, type, x, ldx, w, ldw, k, K, out, ldo);
}

/* One weight row against rb rows of x, with U partial sums per row interleaved over k: the
 * row is read as one sequential stream (several interleaved row streams defeat the hardware
 * prefetcher and halve the bandwidth a memory-bound small batch gets). */
INLINE void seq_fp(kern_type type, int rb, int U, const float *x, size_t ldx, const uint8_t *w,
                   size_t K, float *out, size_t ldo)
{
    __m256 acc[RB][4];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
            acc[r][u] = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 * (size_t)U <= K; k += 8 * (size_t)U) {
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 wv = load_w8(type, w, k + 8 * (size_t)u);
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                acc[r][u] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k + 8 * u), wv, acc[r][u]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 wv = load_w8(type, w, k);
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++)
            acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k), wv, acc[r][0]);
    }
    __m256 sum[RB];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++) {
        sum[r] = acc[r][0];
#pragma GCC unroll 4
        for (int u = 1; u < U; u++)
            sum[r] = _mm256_add_ps(sum[r], acc[r][u]);
    }
    tile_store(sum, 1, rb, 1, type, x, ldx, w, 0, k, K, out, ldo);
}

/* The same for a Q8_0 row: one partial sum per 8-value quarter of a block. */
INLINE void seq_q8(int rb, const float *x, size_t ldx, const uint8_t *w, size_t K, float *out,
                   size_t ldo)
{
    __m256 acc[RB][4];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            acc[r][u] = _mm256_setzero_ps();
    size_t nb = K / QK8_0;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * Q8_BLOCK_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            __m256 wv = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                             (const __m128i *)(const void *)(blk + 2 + u * 8)))));
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                acc[r][u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + b * QK8_0 + u * 8), wv,
                                            acc[r][u]);
        }
    }
    __m256 sum[RB];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
        sum[r] =
            _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
    tile_store(sum, 1, rb, 1, KERN_Q8_0, x, ldx, w, 0, nb * QK8_0, K, out, ldo);
}

/* Q8_0 tile: weight = scale * int8, rounded to float as a widened copy would be. */
INLINE void tile_q8(int rb, int cb, const float *x, size_t ldx, const uint8_t *w, size_t ldw,
                    size_t K, float *out, size_t ldo)
{
    __m256 acc[RB][CB];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 4
        for (int c = 0; c < cb; c++)
            acc[r][c] = _mm256_setzero_ps();
    size_t nb = K / QK8_0;
    for (size_t b = 0; b < nb; b++) {
        __m256 d[CB];
#pragma GCC unroll 4
        for (int c = 0; c < cb; c++) {
            uint16_t h;
            memcpy(&h, w + c * ldw + b * Q8_BLOCK_BYTES, 2);
            d[c] = _mm256_set1_ps(_cvtsh_ss(h));
        }
#pragma GCC unroll 4
        for (int j = 0; j < QK8_0 / 8; j++) {
            size_t k = b * QK8_0 + (size_t)j * 8;
            __m256 xv[RB];
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                xv[r] = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 4
            for (int c = 0; c < cb; c++) {
                const uint8_t *q = w + c * ldw + b * Q8_BLOCK_BYTES + 2 + j * 8;
                __m256 wv =
                    _mm256_mul_ps(d[c], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                            _mm_loadl_epi64((const __m128i *)(const void *)q))));
#pragma GCC unroll 4
                for (int r = 0; r < rb; r++)
                    acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
    }
    tile_store(&acc[0][0], CB, rb, cb, KERN_Q8_0, x, ldx, w, ldw, nb * QK8_0, K, out, ldo);
}

/* One instantiation per (type, rb, cb) so every loop bound is a constant. */
#define TILE_CASES(TYPE)                                                                           \
    static void tiles_##TYPE(int rb, int cb, const float *x, size_t ldx, const uint8_t *w,         \
                             size_t ldw, size_t K, float *out, size_t ldo)                         \
    {                                                                                              \
        if (cb == CB) {                                                                            \
            switch (rb) {                                                                          \
            case 1: TILE_CALL(TYPE, 1, CB); return;                                                \
            case 2: TILE_CALL(TYPE, 2, CB); return;                                                \
            case 3: TILE_CALL(TYPE, 3, CB); return;                                                \
            default: TILE_CALL(TYPE, 4, CB); return;                                               \
            }                                                                                      \
        }                                                                                          \
        switch (rb) {                                                                              \
        case 1: TILE_CALL(TYPE, 1, 1); return;                                                     \
        case 2: TILE_CALL(TYPE, 2, 1); return;                                                     \
        case 3: TILE_CALL(TYPE, 3, 1); return;                                                     \
        default: TILE_CALL(TYPE, 4, 1); return;                                                    \
        }                                                                                          \
    }
#define TILE_CALL(TYPE, R, C) TILE_CALL_##TYPE(R, C)
#define SEQ_CALL(TYPE, R) seq_fp(TYPE, R, R == 1 ? 4 : 2, x, ldx, w, K, out, ldo)
static void seq_f32(int rb, const float *x, size_t ldx, const uint8_t *w, size_t K, float *out,
                    size_t ldo)
{
    switch (rb) {
    case 1: SEQ_CALL(KERN_F32, 1); return;
    case 2: SEQ_CALL(KERN_F32, 2); return;
    case 3: SEQ_CALL(KERN_F32, 3); return;
    default: SEQ_CALL(KERN_F32, 4); return;
    }
}
static void seq_q8_rb(int rb, const float *x, size_t ldx, const uint8_t *w, size_t K, float *out,
                      size_t ldo)
{
    switch (rb) {
    case 1: seq_q8(1, x, ldx, w, K, out, ldo); return;
    case 2: seq_q8(2, x, ldx, w, K, out, ldo); return;
    case 3: seq_q8(3, x, ldx, w, K, out, ldo); return;
    default: seq_q8(4, x, ldx, w, K, out, ldo); return;
    }
}
static void seq_f16(int rb, const float *x, size_t ldx, const uint8_t *w, size_t K, float *out,
                    size_t ldo)
{
    switch (rb) {
    case 1: SEQ_CALL(KERN_F16, 1); return;
    case 2: SEQ_CALL(KERN_F16, 2); return;
    case 3: SEQ_CALL(KERN_F16, 3); return;
    default: SEQ_CALL(KERN_F16, 4); return;
    }
}
#define TILE_CALL_f32(R, C) tile_fp(KERN_F32, R, C, x, ldx, w, ldw, K, out, ldo)
#define TILE_CALL_f16(R, C) tile_fp(KERN_F16, R, C, x, ldx, w, ldw, K, out, ldo)
#define TILE_CALL_q8(R, C) tile_q8(R, C, x, ldx, w, ldw, K, out, ldo)
TILE_CASES(f32)
TILE_CASES(f16)
TILE_CASES(q8)

/* ---- panel types ----
 * An R x 16 tile: per k, the panel's 16 weights (two vectors, converted once) against R
 * broadcast x values, R * 2 accumulators; each output is one in-order FMA chain over k, so its
 * bits depend only on its x row and weight row, never on the batch (the engine's cache equals
 * a recomputation exactly because of this). PM = 6 rows (12 sums) fill AVX2's 16 registers;
 * with AVX-512VL's 32, tiles of 8, 10 and 12 rows measured no faster on Zen 4 (12 slower). */
#ifndef PM
#define PM 6
#endif
#ifndef PANEL_TC
#define PANEL_TC 192 /* rows of x per pass over the panels: about the L2 */
#endif
#ifndef PANEL_PF
#define PANEL_PF 4096 /* bytes ahead in the panel's stream */
#endif

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
                       float *out, size_t ldo, size_t c0, size_t c1)
{
    __m256 acc[PM][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    if (pt == KERN_Q8_0_PANEL) {
        for (size_t b = 0; b < K / QK8_0; b++) {
            const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
            __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)blk));
            __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16)));
            for (size_t i = 0; i < QK8_0; i++) {
                const uint8_t *q = blk + Q8P_QUANTS + i * KERN_PANEL;
                _mm_prefetch((const char *)(q + PANEL_PF), _MM_HINT_T0);
                __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
                __m256 w0 = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
                __m256 w1 = _mm256_mul_ps(
                    d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))));
                panel_fma(R, acc, x, ldx, b * QK8_0 + i, w0, w1);
            }
        }
    } else {
        kern_type et = pt == KERN_F32_PANEL ? KERN_F32 : KERN_F16;
        size_t esz = et == KERN_F32 ? 4 : 2;
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * esz + PANEL_PF), _MM_HINT_T0);
            panel_fma(R, acc, x, ldx, k, load_w8(et, wp, k * KERN_PANEL),
                      load_w8(et, wp, k * KERN_PANEL + 8));
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

/* One instantiation per (type, R) so every loop bound and branch is a constant. */
#define PANEL_CASE(R)                                                                              \
    case R:                                                                                        \
        if (pt == KERN_Q8_0_PANEL)                                                                 \
            panel_tile(KERN_Q8_0_PANEL, R, x, ldx, wp, K, out, ldo, c0, c1);                       \
        else if (pt == KERN_F16_PANEL)                                                             \
            panel_tile(KERN_F16_PANEL, R, x, ldx, wp, K, out, ldo, c0, c1);                        \
        else                                                                                       \
            panel_tile(KERN_F32_PANEL, R, x, ldx, wp, K, out, ldo, c0, c1);                        \
        return;
static void panel_tile_r(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp,
                         size_t K, float *out, size_t ldo, size_t c0, size_t c1)
{
    switch (R) {
        PANEL_CASE(1)
        PANEL_CASE(2)
        PANEL_CASE(3)
        PANEL_CASE(4)
        PANEL_CASE(5)
    default: PANEL_CASE(PM)
    }
}

/* A Q8_0 panel widened to an F32 one ([K][16], the values panel_tile would compute). */
static void panel_widen_q8(const uint8_t *wp, size_t K, float *dst)
{
    for (size_t b = 0; b < K / QK8_0; b++) {
        const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)blk));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 16)));
        for (size_t i = 0; i < QK8_0; i++) {
            __m128i v =
                _mm_loadu_si128((const __m128i *)(const void *)(blk + Q8P_QUANTS + i * KERN_PANEL));
            float *d = dst + (b * QK8_0 + i) * KERN_PANEL;
            _mm256_storeu_ps(d, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
            _mm256_storeu_ps(d + 8, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                          _mm_unpackhi_epi64(v, v)))));
        }
    }
}

/* Panels outer (a panel, 16 x n_in weights, stays in L1/L2 while every row block of x passes);
 * the T rows split into equal blocks of at most PM. A Q8_0 panel that more than one block will
 * read is widened once into scratch first (its conversion costs more than an F16 one). */
static void panel_rows(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                       size_t ldo, size_t n0, size_t n1, float *scratch)
{
    size_t K = m->n_in, pbytes = KERN_PANEL * m->row_bytes;
    for (size_t t0 = 0; t0 < T; t0 += PANEL_TC) {
        size_t tc = T - t0 < PANEL_TC ? T - t0 : PANEL_TC;
        size_t nb = (tc + PM - 1) / PM, R = (tc + nb - 1) / nb;
        for (size_t p = n0 / KERN_PANEL; p * KERN_PANEL < n1; p++) {
            size_t base = p * KERN_PANEL;
            size_t c0 = n0 > base ? n0 - base : 0;
            size_t c1 = n1 - base < KERN_PANEL ? n1 - base : KERN_PANEL;
            const uint8_t *wp = (const uint8_t *)m->data + p * pbytes;
            kern_type pt = m->type;
            if (pt == KERN_Q8_0_PANEL && scratch && nb > 1) {
                panel_widen_q8(wp, K, scratch);
                wp = (const uint8_t *)scratch;
                pt = KERN_F32_PANEL;
            }
            for (size_t t = t0; t < t0 + tc; t += R)
                panel_tile_r(pt, (int)(t0 + tc - t < R ? t0 + tc - t : R), x + t * ldx, ldx, wp, K,
                             out + t * ldo + base, ldo, c0, c1);
        }
    }
}

void kern_matmul_panels(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                        size_t ldo, size_t n0, size_t n1, float *scratch)
{
    panel_rows(m, x, T, ldx, out, ldo, n0, n1, scratch);
}

void kern_matmul_rows(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                      size_t ldo, size_t n0, size_t n1)
{
    if (kern_is_panel(m->type)) {
        panel_rows(m, x, T, ldx, out, ldo, n0, n1, NULL);
        return;
    }
    void (*tile)(int, int, const float *, size_t, const uint8_t *, size_t, size_t, float *,
                 size_t) = m->type == KERN_F32   ? tiles_f32
                           : m->type == KERN_F16 ? tiles_f16
                                                 : tiles_q8;
    const uint8_t *base = m->data;
    size_t ldw = m->row_bytes;
    if (T <= SEQ_MAX_T) {
        void (*seq)(int, const float *, size_t, const uint8_t *, size_t, float *, size_t) =
            m->type == KERN_F32   ? seq_f32
            : m->type == KERN_F16 ? seq_f16
                                  : seq_q8_rb;
        for (size_t n = n0; n < n1; n++)
            for (size_t t = 0; t < T; t += RB)
                seq(T - t >= RB ? RB : (int)(T - t), x + t * ldx, ldx, base + n * ldw, m->n_in,
                    out + t * ldo + n, ldo);
        return;
    }
    /* Columns outer: a CB-row weight tile (a few KB) stays in L1 while all of x streams by. */
    for (size_t n = n0; n < n1;) {
        int cb = n1 - n >= CB ? CB : 1;
        for (size_t t = 0; t < T; t += RB) {
            int rb = T - t >= RB ? RB : (int)(T - t);
            tile(rb, cb, x + t * ldx, ldx, base + n * ldw, ldw, m->n_in, out + t * ldo + n, ldo);
        }
        n += (size_t)cb;
    }
}

static void panel_rows_to_f32(const kern_mat *m, size_t r0, size_t nr, float *dst);

void kern_rows_to_f32(const kern_mat *m, size_t r0, size_t nr, float *dst)
{
    if (kern_is_panel(m->type)) {
        panel_rows_to_f32(m, r0, nr, dst);
        return;
    }
    const uint8_t *base = (const uint8_t *)m->data + r0 * m->row_bytes;
    size_t K = m->n_in;
    if (m->type == KERN_F32) {
        memcpy(dst, base, nr * K * sizeof(float));
        return;
    }
    for (size_t r = 0; r < nr; r++, base += m->row_bytes, dst += K) {
        if (m->type == KERN_F16) {
            size_t k = 0;
            for (; k + 8 <= K; k += 8)
                _mm256_storeu_ps(dst + k, load_w8(KERN_F16, base, k));
            for (; k < K; k++)
                dst[k] = f16_at(base, k);
            continue;
        }
        for (size_t b = 0; b < K / QK8_0; b++) {
            const uint8_t *blk = base + b * Q8_BLOCK_BYTES;
            uint16_t h;
            memcpy(&h, blk, 2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
            for (int j = 0; j < QK8_0 / 8; j++)
                _mm256_storeu_ps(
                    dst + b * QK8_0 + j * 8,
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                         (const __m128i *)(const void *)(blk + 2 + j * 8))))));
        }
    }
}

/* ---- mid-size batches: packed GEMM ----
 * out = X W^T as a register-blocked outer product: GM rows of x (broadcast) x GN = 16 weight
 * rows (two 8-lane vectors) per microkernel step. X is packed once per call as [row block][k]
 * [GM] so the broadcasts stream sequentially; a GN x GKC weight panel is widened and transposed
 * to [k][GN] F32 on the stack (16 KB, stays in L1) and reused by every row block, so each
 * weight is converted once per call instead of once per 4 rows. Each output is
 * sum over k blocks (in order) of an in-order FMA chain: its bits depend only on x, its weight
 * row and K, never on T, the column range or the thread that computes it. */
#ifdef __AVX512VL__
#define GM 8 /* 16 accumulators + 2 weight vectors + broadcasts fit 32 registers */
#else
#define GM 4
#endif
#define GN 16
#define GKC 256 /* multiple of QK8_0 and of 8 */

size_t kern_gemm_xp_floats(size_t T, size_t K)
{
    return (T + GM - 1) / GM * GM * K;
}

INLINE void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Whole panels: 8 k-vectors of 8 rows at a time, transposed back to rows. */
static void panel_rows_to_f32(const kern_mat *m, size_t r0, size_t nr, float *dst)
{
    kern_type et = m->type == KERN_F32_PANEL ? KERN_F32 : KERN_F16;
    size_t K = m->n_in, pbytes = KERN_PANEL * m->row_bytes;
    size_t r = r0, end = r0 + nr;
    while (r < end) {
        if (r % KERN_PANEL || end - r < KERN_PANEL || K % 8 || m->type == KERN_Q8_0_PANEL) {
            /* one row (an embedding lookup): its values sit KERN_PANEL apart */
            const uint8_t *wp = (const uint8_t *)m->data + r / KERN_PANEL * pbytes;
            size_t c = r % KERN_PANEL;
            float *d = dst + (r - r0) * K;
            if (m->type == KERN_F16_PANEL) {
                for (size_t k = 0; k < K; k++)
                    d[k] = f16_at(wp, k * KERN_PANEL + c);
            } else if (m->type == KERN_F32_PANEL) {
                for (size_t k = 0; k < K; k++)
                    memcpy(d + k, wp + (k * KERN_PANEL + c) * 4, 4);
            } else {
                for (size_t b = 0; b < K / QK8_0; b++) {
                    const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
                    float s = f16_at(blk, c);
                    for (size_t i = 0; i < QK8_0; i++)
                        d[b * QK8_0 + i] = s * (float)(int8_t)blk[Q8P_QUANTS + i * KERN_PANEL + c];
                }
            }
            r++;
            continue;
        }
        const uint8_t *wp = (const uint8_t *)m->data + r / KERN_PANEL * pbytes;
        for (size_t k = 0; k < K; k += 8)
            for (size_t g = 0; g < KERN_PANEL; g += 8) {
                __m256 v[8];
                for (size_t i = 0; i < 8; i++)
                    v[i] = load_w8(et, wp, (k + i) * KERN_PANEL + g);
                transpose8(v);
                for (size_t i = 0; i < 8; i++)
                    _mm256_storeu_ps(dst + (r - r0 + g + i) * K + k, v[i]);
            }
        r += KERN_PANEL;
    }
}

void kern_gemm_pack_x(const float *x, size_t T, size_t ldx, size_t K, float *xp)
{
    for (size_t t0 = 0; t0 < T; t0 += GM, xp += GM * K) {
        size_t rows = T - t0 < GM ? T - t0 : GM;
        size_t k = 0;
        if (GM == 8 && rows == 8)
            for (; k + 8 <= K; k += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = _mm256_loadu_ps(x + (t0 + (size_t)i) * ldx + k);
                transpose8(r);
                for (int i = 0; i < 8; i++)
                    _mm256_storeu_ps(xp + (k + (size_t)i) * GM, r[i]);
            }
        for (; k < K; k++)
            for (size_t i = 0; i < GM; i++)
                xp[k * GM + i] = i < rows ? x[(t0 + i) * ldx + k] : 0.0f;
    }
}

/* Widens weight rows r0..r0+nr-1 (nr <= GN), inputs k0..k0+kc-1, into wp[kc][GN]; missing
 * rows are zero. The next block of the same rows is prefetched: the panel's 16 row streams
 * are more than the hardware prefetcher follows. */
static void pack_w(const kern_mat *m, size_t r0, size_t nr, size_t k0, size_t kc, float *wp)
{
    const uint8_t *base = (const uint8_t *)m->data + r0 * m->row_bytes;
    size_t ldw = m->row_bytes;
    size_t esz = m->type == KERN_F32 ? 4 : 2;
    if (m->type != KERN_Q8_0) {
        /* the next block of these rows, or after the last one the next panel's first block */
        const uint8_t *pf = base + (k0 + kc) * esz;
        size_t pr = nr, pbytes = kc * esz;
        if (k0 + kc >= m->n_in) {
            pf = base + GN * ldw;
            pr = r0 + 2 * GN <= m->n_out ? GN : 0;
            pbytes = (m->n_in < GKC ? m->n_in : GKC) * esz;
        }
        for (size_t r = 0; r < pr; r++)
            for (size_t off = 0; off < pbytes; off += 64)
                _mm_prefetch((const char *)(pf + r * ldw + off), _MM_HINT_T0);
    }
    size_t k = 0;
    if (nr == GN && m->type != KERN_Q8_0) {
        for (; k + 8 <= kc; k += 8)
            for (size_t g = 0; g < GN; g += 8) {
                __m256 r[8];
                for (size_t i = 0; i < 8; i++)
                    r[i] = load_w8(m->type, base + (g + i) * ldw, k0 + k);
                transpose8(r);
                for (size_t i = 0; i < 8; i++)
                    _mm256_storeu_ps(wp + (k + i) * GN + g, r[i]);
            }
    } else if (nr == GN) { /* Q8_0: k0 and kc are multiples of QK8_0 */
        for (; k < kc; k += QK8_0) {
            size_t b = (k0 + k) / QK8_0;
            for (size_t g = 0; g < GN; g += 8) {
                __m256 d[8];
                for (size_t i = 0; i < 8; i++) {
                    const uint8_t *blk = base + (g + i) * ldw + b * Q8_BLOCK_BYTES;
                    if (k0 + kc < m->n_in)
                        _mm_prefetch((const char *)(blk + kc / QK8_0 * Q8_BLOCK_BYTES),
                                     _MM_HINT_T0);
                    uint16_t h;
                    memcpy(&h, blk, 2);
                    d[i] = _mm256_set1_ps(_cvtsh_ss(h));
                }
                for (size_t j = 0; j < QK8_0; j += 8) {
                    __m256 r[8];
                    for (size_t i = 0; i < 8; i++) {
                        const uint8_t *q = base + (g + i) * ldw + b * Q8_BLOCK_BYTES + 2 + j;
                        r[i] = _mm256_mul_ps(
                            d[i], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                      _mm_loadl_epi64((const __m128i *)(const void *)q))));
                    }
                    transpose8(r);
                    for (size_t i = 0; i < 8; i++)
                        _mm256_storeu_ps(wp + (k + j + i) * GN + g, r[i]);
                }
            }
        }
    }
    for (; k < kc; k++)
        for (size_t c = 0; c < GN; c++)
            wp[k * GN + c] = c < nr ? w_at(m->type, base + c * ldw, k0 + k) : 0.0f;
}

/* acc (+)= xp[kc][GM] (its first R rows) x wp[kc][GN], then rows < nt (<= R), columns < nc
 * go to out. */
INLINE void gemm_micro(int R, const float *xp, const float *wp, size_t kc, int first, size_t nt,
                       size_t nc, float *out, size_t ldo)
{
    __m256 acc[GM][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (size_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_loadu_ps(wp + k * GN), w1 = _mm256_loadu_ps(wp + k * GN + 8);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(xp + k * GM + r);
            acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
        }
    }
    /* constant indices once unrolled, so acc stays in registers in the loop above */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if ((size_t)r >= nt)
            break;
        float *o = out + (size_t)r * ldo;
        if (nc == GN) {
            if (first) {
                _mm256_storeu_ps(o, acc[r][0]);
                _mm256_storeu_ps(o + 8, acc[r][1]);
            } else {
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[r][0]));
                _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), acc[r][1]));
            }
            continue;
        }
        float tmp[GN];
        _mm256_storeu_ps(tmp, acc[r][0]);
        _mm256_storeu_ps(tmp + 8, acc[r][1]);
        for (size_t c = 0; c < nc; c++)
            o[c] = first ? tmp[c] : o[c] + tmp[c];
    }
}

void kern_gemm_packed(const kern_mat *m, const float *xp, size_t T, float *out, size_t ldo,
                      size_t n0, size_t n1)
{
    float wp[GKC * GN] __attribute__((aligned(32)));
    size_t K = m->n_in;
    for (size_t n = n0; n < n1; n += GN) {
        size_t nc = n1 - n < GN ? n1 - n : GN;
        for (size_t k0 = 0; k0 < K; k0 += GKC) {
            size_t kc = K - k0 < GKC ? K - k0 : GKC;
            pack_w(m, n, nc, k0, kc, wp);
            for (size_t t0 = 0; t0 < T; t0 += GM) {
                /* a short last block runs a narrower tile: no FMAs on padding rows */
                size_t nt = T - t0 < GM ? T - t0 : GM;
                const float *xb = xp + t0 * K + k0 * GM;
                float *ob = out + t0 * ldo + n;
                int first = k0 == 0;
                switch ((nt + 1) / 2) {
                case 1: gemm_micro(2, xb, wp, kc, first, nt, nc, ob, ldo); break;
                case 2: gemm_micro(4, xb, wp, kc, first, nt, nc, ob, ldo); break;
                case 3: gemm_micro(GM < 6 ? GM : 6, xb, wp, kc, first, nt, nc, ob, ldo); break;
                default: gemm_micro(GM, xb, wp, kc, first, nt, nc, ob, ldo); break;
                }
            }
        }
    }
}

float kern_dot(const float *a, const float *b, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

float kern_dot_f16(const float *a, const uint16_t *b, size_t n)
{
    const uint8_t *bb = (const uint8_t *)b;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_w8(KERN_F16, bb, i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_w8(KERN_F16, bb, i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_w8(KERN_F16, bb, i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * f16_at(bb, i);
    return s;
}

void kern_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    const uint8_t *xb = (const uint8_t *)x;
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, load_w8(KERN_F16, xb, i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * f16_at(xb, i);
}

void kern_to_f16(uint16_t *dst, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = ggml_fp32_to_fp16(x[i]);
}

void kern_axpy(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static float sum_squares(const float *x, size_t n)
{
    return kern_dot(x, x, n);
}

#else /* portable C */

/* Weight (n, k) of a panel-type matrix. */
static inline float panel_at(const kern_mat *m, size_t n, size_t k)
{
    if (m->type == KERN_Q8_0_PANEL) {
        const uint8_t *blk = (const uint8_t *)m->data +
                             (n / KERN_PANEL * (m->n_in / QK8_0) + k / QK8_0) * Q8P_BLOCK_BYTES;
        return f16_at(blk, n % KERN_PANEL) *
               (float)(int8_t)blk[Q8P_QUANTS + k % QK8_0 * KERN_PANEL + n % KERN_PANEL];
    }
    size_t i = (n / KERN_PANEL * m->n_in + k) * KERN_PANEL + n % KERN_PANEL;
    if (m->type == KERN_F16_PANEL)
        return f16_at(m->data, i);
    float f;
    memcpy(&f, (const uint8_t *)m->data + 4 * i, 4);
    return f;
}

static float mat_at(const kern_mat *m, size_t n, size_t k)
{
    if (kern_is_panel(m->type))
        return panel_at(m, n, k);
    return w_at(m->type, (const uint8_t *)m->data + n * m->row_bytes, k);
}

void kern_matmul_rows(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                      size_t ldo, size_t n0, size_t n1)
{
    for (size_t n = n0; n < n1; n++) {
        for (size_t t = 0; t < T; t++) {
            float s = 0.0f;
            for (size_t k = 0; k < m->n_in; k++)
                s += x[t * ldx + k] * mat_at(m, n, k);
            out[t * ldo + n] = s;
        }
    }
}

void kern_rows_to_f32(const kern_mat *m, size_t r0, size_t nr, float *dst)
{
    for (size_t r = 0; r < nr; r++)
        for (size_t k = 0; k < m->n_in; k++)
            dst[r * m->n_in + k] = mat_at(m, r0 + r, k);
}

size_t kern_gemm_xp_floats(size_t T, size_t K)
{
    return T * K;
}

void kern_matmul_panels(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                        size_t ldo, size_t n0, size_t n1, float *scratch)
{
    (void)scratch;
    kern_matmul_rows(m, x, T, ldx, out, ldo, n0, n1);
}

void kern_gemm_pack_x(const float *x, size_t T, size_t ldx, size_t K, float *xp)
{
    for (size_t t = 0; t < T; t++)
        memcpy(xp + t * K, x + t * ldx, K * sizeof(float));
}

void kern_gemm_packed(const kern_mat *m, const float *xp, size_t T, float *out, size_t ldo,
                      size_t n0, size_t n1)
{
    kern_matmul_rows(m, xp, T, m->n_in, out, ldo, n0, n1);
}

float kern_dot(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void kern_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

float kern_dot_f16(const float *a, const uint16_t *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * ggml_fp16_to_fp32(b[i]);
    return s;
}

void kern_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * ggml_fp16_to_fp32(x[i]);
}

void kern_to_f16(uint16_t *dst, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ggml_fp32_to_fp16(x[i]);
}

static float sum_squares(const float *x, size_t n)
{
    return kern_dot(x, x, n);
}

#endif

void kern_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) /* auto-vectorized; exact either way */
        y[i] += x[i];
}

void kern_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    float scale = 1.0f / sqrtf(sum_squares(x, n) / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

void kern_silu_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
