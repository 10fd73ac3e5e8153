/* The kernels for AVX-512 (F, BW, VL, DQ) + FMA + F16C, compiled with this file's own flags
 * (engine/meson.build) so a portable build carries them; kern_select runs them only where CPUID
 * and the OS's saved state say so. The same source is compiled a second time over simde for the
 * tests (kern/avx512_isa.h). Every operation gives the bits of ref.c: one zmm holds a panel's 16
 * rows at one input, and dot keeps ref's 16 partial sums in one zmm (ref's order is that of two
 * 8-lane AVX2 accumulators, so a second zmm accumulator would change the bits). */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/f16c.h"
#include "engine/kern/kexp.h"
#include "engine/kern/kern.h"
#include "engine/kern/panel_loop.h"
#include "engine/kern/qdot.h"
#include "engine/kern/tile2_zmm.h"

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

/* panel_fma on x's rows (ldx apart) or, px, on packed x (panel_pack_x: value k of the R rows at
 * x + k * R) */
INLINE void panel_fma_x(bool px, int R, __m512 acc[], const float *x, size_t ldx, size_t k,
                        __m512 w)
{
    if (px)
        panel_fma(R, acc, x + k * (size_t)R, 1, 0, w);
    else
        panel_fma(R, acc, x, ldx, k, w);
}

/* px: x packed (F16 / F32 panels only), for calls of at most PM rows, which take one tile per
 * panel: per k one conversion (a zmm vcvtph2ps is two uops, on the FMA ports) for R FMAs. At 16
 * rows the pair tiles run as 8 + 8 rows, four conversions for 32 FMAs: at most 32 / 40 of the
 * FMA peak against 16 / 18 here. Paired on one Intel Xeon core, 2048 x 2048 F16 (bench/ab.sh):
 * 16 rows 1.06x (1.05-1.11), 12 rows 1.01x, 64 rows as 16-row tiles 0.985x (so the pairs keep
 * every call past PM rows). */
INLINE void panel_tile(kern_type pt, bool px, int R, const float *x, size_t ldx, const uint8_t *wp,
                       size_t K, float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf)
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
                panel_pf_at(pf, b * KERN_QK8_0 + i);
                panel_fma_x(px, R, acc, x, ldx, b * KERN_QK8_0 + i, q8_line(blk, d, i));
            }
        }
    } else if (pt == KERN_F16_PANEL) {
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * 2 + PANEL_PF), _MM_HINT_T0);
            panel_pf_at(pf, k);
            panel_fma_x(px, R, acc, x, ldx, k, k512_cvtph(wp + k * KERN_PANEL * 2));
        }
    } else {
        for (size_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(wp + k * KERN_PANEL * 4 + PANEL_PF), _MM_HINT_T0);
            panel_pf_at(pf, k);
            panel_fma_x(px, R, acc, x, ldx, k,
                        _mm512_loadu_ps((const float *)(const void *)(wp + k * KERN_PANEL * 4)));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        store_cols(out + (size_t)r * ldo, acc[r], c0, c1);
}
/* panel_tile on x's rows, the signature kern/panel_loop.h's instantiations call */
INLINE void panel_tile_rows(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp,
                            size_t K, float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf)
{
    panel_tile(pt, false, R, x, ldx, wp, K, out, ldo, c0, c1, pf);
}
#define PANEL_TILE_PX_F16_(t, r) t(KERN_F16_PANEL, true, r, x, 0, wp, K, out, ldo, c0, c1, pf)
#define PANEL_TILE_PX_F32_(t, r) t(KERN_F32_PANEL, true, r, x, 0, wp, K, out, ldo, c0, c1, pf)
static void panel_tile_px_r(kern_type pt, int R, const float *x, const uint8_t *wp, size_t K,
                            float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf)
{
    if (pt == KERN_F16_PANEL)
        PANEL_SWITCH(R, 16, PANEL_TILE_PX_F16_, panel_tile)
    PANEL_SWITCH(R, 16, PANEL_TILE_PX_F32_, panel_tile)
}

/* panel_tile once per (type, R): every loop bound and branch in it a constant */
PANEL_DEFINE_TILE_R(panel_tile_r, panel_tile_rows, PM)

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

/* An R x 32 tile over two adjacent F16 or F32 panels (wp, wp + pbytes): per k two weight vectors
 * meet each broadcast x, so per FMA the tile issues half the broadcast loads of the R x 16 one,
 * whose 16 x rows are also 16 streams from L2 where the panel is the one from L1. Each output
 * is still one in-order FMA chain over k. PM2 rows: 24 accumulators, 2 weights; measured on a
 * Sapphire Rapids core at 64 rows of a 2048 x 2048 F16 matrix: 12 x 32 ~101 GFLOP/s, 16 x 16
 * ~65, 8 x 32 ~100 (the core's FMA peak ~135). px: x packed (panel_pack_x: value k of the R
 * rows at x + k * R), one pointer for all rows; else R row pointers, more than the general
 * registers hold at 12 rows, so the loop spills and reloads three of them per k (through
 * vmovq on port 0, beside the FMAs). */
#define PM2 TILE2_ROWS

INLINE void panel_tile2(kern_type pt, bool px, int R, const float *x, size_t ldx, const uint8_t *wp,
                        size_t pbytes, size_t K, float *out, size_t ldo, panel_pf pf)
{
    __m512 a0[PM2], a1[PM2];
    const uint8_t *wq = wp + pbytes;
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
        a0[r] = a1[r] = _mm512_setzero_ps();
    size_t esz = pt == KERN_F16_PANEL ? 2 : 4, step = KERN_PANEL * esz;
    for (size_t k = 0; k < K; k++) {
        _mm_prefetch((const char *)(wp + k * step + PANEL_PF), _MM_HINT_T0);
        _mm_prefetch((const char *)(wq + k * step + PANEL_PF), _MM_HINT_T0);
        panel_pf_at(pf, k);
        __m512 w0, w1;
        if (pt == KERN_F16_PANEL) {
            w0 = k512_cvtph(wp + k * step);
            w1 = k512_cvtph(wq + k * step);
        } else {
            w0 = _mm512_loadu_ps((const float *)(const void *)(wp + k * step));
            w1 = _mm512_loadu_ps((const float *)(const void *)(wq + k * step));
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(px ? x[k * (size_t)R + (size_t)r] : x[(size_t)r * ldx + k]);
            a0[r] = _mm512_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm512_fmadd_ps(xb, w1, a1[r]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out + (size_t)r * ldo, a0[r]);
        _mm512_storeu_ps(out + (size_t)r * ldo + KERN_PANEL, a1[r]);
    }
}

/* panel_tile2 once per (type, packed x or not, R) */
#define PANEL_TILE2_F16_PX_(t, r) t(KERN_F16_PANEL, true, r, x, ldx, wp, pbytes, K, out, ldo, pf)
#define PANEL_TILE2_F16_(t, r) t(KERN_F16_PANEL, false, r, x, ldx, wp, pbytes, K, out, ldo, pf)
#define PANEL_TILE2_F32_PX_(t, r) t(KERN_F32_PANEL, true, r, x, ldx, wp, pbytes, K, out, ldo, pf)
#define PANEL_TILE2_F32_(t, r) t(KERN_F32_PANEL, false, r, x, ldx, wp, pbytes, K, out, ldo, pf)
static void panel_tile2_r(kern_type pt, bool px, int R, const float *x, size_t ldx,
                          const uint8_t *wp, size_t pbytes, size_t K, float *out, size_t ldo,
                          panel_pf pf)
{
    if (pt == KERN_F16_PANEL && px)
        PANEL_SWITCH(R, 12, PANEL_TILE2_F16_PX_, panel_tile2)
    if (pt == KERN_F16_PANEL)
        PANEL_SWITCH(R, 12, PANEL_TILE2_F16_, panel_tile2)
    if (px)
        PANEL_SWITCH(R, 12, PANEL_TILE2_F32_PX_, panel_tile2)
    PANEL_SWITCH(R, 12, PANEL_TILE2_F32_, panel_tile2)
}

/* tile2_zmm.h's pair tile over a widened chunk w ([n][32]: the two panels' 16 weights of an
 * input side by side) from packed x, once per R */
#define F32TILE2_PX_(t, r)                                                                         \
    t(r, true, x, 0, w, w + KERN_PANEL, 2 * KERN_PANEL, n, out, ldo, first, pf)
static void f32tile2_px_r(int R, const float *x, const float *w, size_t n, float *out, size_t ldo,
                          bool first, panel_pf pf)
{
    PANEL_SWITCH(R, 12, F32TILE2_PX_, zmm_ftile2)
}

/* A pass of many tiles over two whole F16 panels: chunk by chunk, both panels' inputs widened to
 * F32 once into L1 (32 KiB), then every tile of the pass continues over them. A zmm vcvtph2ps is
 * two uops on the FMA ports, so a 12 x 32 tile converting its own pair runs at most 24 / 28 of
 * the FMA peak; widened once for the pass's tiles that share is gone (the F32 pair tile measured
 * 0.93 of the peak on an Intel Xeon core at 192 rows, the F16 one 0.76 - 0.80). Widening costs a
 * store per weight vector and the chains' reload per chunk. The widening reads the pair at once,
 * not at the pace of a tile's FMAs, so it would wait on memory every chunk: the tiles pull the
 * next pair into L2, a share per (chunk, tile), as panel_pf_share does for the pair tiles
 * (without it 64-row steps lost, 0.91x). Paired on an Intel Xeon (bench/ab.sh, kvs-bench-engine):
 * 64-row steps 1.07x (TinyLlama) and 1.06x (110m), a 512-token TinyLlama prefill 1.06x; 32 rows
 * (3 tiles) 0.88x and 48 rows (4) 0.98x, hence WIDEN_MIN_TILES. */
#define WIDEN_MIN_TILES 6
static void f16_widened_pair(const panel_job *j, const panel_step *s)
{
    float w[PANEL_WCHUNK * 2 * KERN_PANEL] __attribute__((aligned(64)));
    size_t K = j->m->n_in, step = KERN_PANEL * 2;
    const uint8_t *wp = s->wp, *wq = s->wp + s->pbytes;
    size_t chunk = PANEL_WCHUNK < K ? PANEL_WCHUNK : K;
    size_t total = 2 * s->pbytes, nshares = (K + chunk - 1) / chunk * s->nb;
    for (size_t k0 = 0; k0 < K; k0 += chunk) {
        size_t n = K - k0 < chunk ? K - k0 : chunk;
        for (size_t k = k0; k < k0 + n; k++) {
            _mm_prefetch((const char *)(wp + k * step + PANEL_PF), _MM_HINT_T0);
            _mm_prefetch((const char *)(wq + k * step + PANEL_PF), _MM_HINT_T0);
            _mm512_store_ps(w + (k - k0) * 2 * KERN_PANEL, k512_cvtph(wp + k * step));
            _mm512_store_ps(w + (k - k0) * 2 * KERN_PANEL + KERN_PANEL, k512_cvtph(wq + k * step));
        }
        size_t i = 0;
        for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R, i++) {
            int R = panel_rows(s, t);
            size_t q = (k0 / chunk) * s->nb + i, share = total / nshares;
            panel_pf pf = {s->wp + 2 * s->pbytes + q * share, (share << 8) / n};
            f32tile2_px_r(R, j->xp + t * K + k0 * (size_t)R, w, n, j->out + t * j->ldo + s->base,
                          j->ldo, k0 == 0, pf);
        }
    }
}

/* Two whole F16 / F32 panels at once where the columns allow, from the packed x where there is
 * one; otherwise one panel from x's rows (a Q8_0 panel read by several tiles is widened once
 * into scratch, which holds one panel). Widening a whole F16 pair once for its tiles the same
 * way lost: the F32 pair, twice the bytes, no longer stays in L1 (one Intel Xeon core,
 * 2048 x 2048: 16 rows 0.76x, 64 rows 1.06x, paired); long passes widen it chunk by chunk
 * (f16_widened_pair). */
static inline size_t panel_step_w(const panel_job *j, const panel_step *s, bool widen)
{
    kern_type pt = j->m->type;
    if (widen && pt == KERN_F16_PANEL && j->xp && s->nb >= WIDEN_MIN_TILES && panel_pair_whole(s)) {
        f16_widened_pair(j, s);
        return 2;
    }
    if (pt != KERN_Q8_0_PANEL && panel_pair_whole(s)) {
        size_t i = 0, K = j->m->n_in;
        for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R, i++)
            panel_tile2_r(pt, j->xp != NULL, panel_rows(s, t),
                          j->xp ? j->xp + t * K : j->x + t * j->ldx, j->ldx, s->wp, s->pbytes, K,
                          j->out + t * j->ldo + s->base, j->ldo,
                          panel_pf_share(s, i, 2 * s->pbytes, K));
        return 2;
    }
    return panel_float_step(j, s, panel_tile_r, panel_widen_q8);
}

static size_t avx512_panel(const panel_job *j, const panel_step *s)
{
    return panel_step_w(j, s, true);
}

/* The same where vcvtph2ps issues beside the FMAs (kern_cpu_cvtph_free: AMD Zen 5): the pair
 * tiles convert their own halves, and widening a chunk for a pass's tiles is only its stores and
 * the chains' reloads. Zen 5, 2 threads, against avx512_panel (bench/ab.sh, kvs-bench-engine, two
 * sets of pairs): TinyLlama F16 512-token prefill 1.16-1.22x, 64-row steps 1.11-1.13x; 110m
 * prefill 1.05-1.10x, 64-row steps 1.09x (docs/BENCHMARKS.md, "F16 pairs on Zen 5"). */
static size_t avx512_panel_cvt(const panel_job *j, const panel_step *s)
{
    return panel_step_w(j, s, false);
}

/* avx512_matmul's step for packed x of at most PM rows: every tile one panel, panel_tile's px. */
static size_t avx512_panel_px(const panel_job *j, const panel_step *s)
{
    size_t i = 0, K = j->m->n_in;
    for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R, i++)
        panel_tile_px_r(j->m->type, panel_rows(s, t), j->xp + t * K, s->wp, K,
                        j->out + t * j->ldo + s->base, j->ldo, s->c0, s->c1,
                        panel_pf_share(s, i, s->pbytes, K));
    return 1;
}

/* Whether avx512_matmul takes a call of T rows (F16 / F32 panels, x packed) as one tile per
 * panel (avx512_panel_px) rather than as pair tiles of at most PM2 rows (avx512_panel): the
 * layout avx512_pack_x writes follows it. */
static bool one_tile(size_t T)
{
    return T <= PM;
}

/* kern/panel_loop.h's driver, step the pairs' (avx512_panel or avx512_panel_cvt). */
static inline void matmul_w(const kern_mat *m, const float *x, size_t T, size_t ldx,
                            const float *xp, float *out, size_t ldo, size_t n0, size_t n1,
                            float *scratch, size_t (*step)(const panel_job *, const panel_step *))
{
    if (m->type == KERN_QUANT_PANEL) {
        KERN512(kern__quant_matmul_avx512)(m, x, T, ldx, out, ldo, n0, n1, scratch);
        return;
    }
    panel_job j = {
        .m = m, .x = x, .ldx = ldx, .xp = xp, .out = out, .ldo = ldo, .scratch = scratch};
    if (xp && one_tile(T) && m->type != KERN_Q8_0_PANEL) {
        panel_loop(&j, T, n0, n1, PM, avx512_panel_px);
        return;
    }
    panel_loop(&j, T, n0, n1, PM2, step); /* tiles of at most PM2 rows, for the pairs */
}

static void avx512_matmul(const kern_mat *m, const float *x, size_t T, size_t ldx, const float *xp,
                          float *out, size_t ldo, size_t n0, size_t n1, float *scratch)
{
    matmul_w(m, x, T, ldx, xp, out, ldo, n0, n1, scratch, avx512_panel);
}

static void avx512_matmul_cvt(const kern_mat *m, const float *x, size_t T, size_t ldx,
                              const float *xp, float *out, size_t ldo, size_t n0, size_t n1,
                              float *scratch)
{
    matmul_w(m, x, T, ldx, xp, out, ldo, n0, n1, scratch, avx512_panel_cvt);
}

/* x for avx512_matmul's tiles: one tile of up to PM rows (one_tile), else tiles of at most
 * PM2 (the pairs). Up to 8 rows a pair tile's row pointers fit in the registers and the pass (a
 * read and a write of x, 0.8 % of a 64-row 110m step and 1.9 % of a 512-row one, perf on an
 * Intel Xeon) would buy nothing. */
#define PACK_MIN_ROWS 9
/* Values [k0, k1) of a tile's rr (<= 16) rows side by side (panel_pack_x's layout), 16 inputs
 * at a time through a 16 x 16 transpose in registers: 16 loads, 64 shuffles and 16 stores where
 * the plain copy took a load and a store per value. Each input's column is stored whole, in
 * order, so its lanes past rr fall on the places of the next ones, which are written later: a
 * block needs 16 more values after it (their places take the 16 - rr spilled lanes), and the
 * last values go one by one. */
static void pack_tile16(int rr, const float *s, size_t ldx, size_t k0, size_t k1, float *d)
{
    size_t k = k0;
    for (; k + 32 <= k1; k += 16, d += 16 * (size_t)rr) {
        __m512 v[16], t[16];
        for (int r = 0; r < 16; r++)
            v[r] = r < rr ? _mm512_loadu_ps(s + (size_t)r * ldx + k) : _mm512_setzero_ps();
        /* in each 128-bit lane j: rows 2i and 2i + 1 interleaved; then column 4j + q of rows
         * 4g .. 4g + 3 in v[4g + q]; then a column's four lanes brought together */
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
        }
        for (int g = 0; g < 16; g += 4) {
            __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
            __m512d c = _mm512_castps_pd(t[g + 2]), e = _mm512_castps_pd(t[g + 3]);
            v[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
            v[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
            v[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
            v[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
        }
        for (int q = 0; q < 4; q++) {
            __m512 w0 = k512_shuffle_f32x4(v[q], v[4 + q], 0x88);
            __m512 w1 = k512_shuffle_f32x4(v[q], v[4 + q], 0xdd);
            __m512 y0 = k512_shuffle_f32x4(v[8 + q], v[12 + q], 0x88);
            __m512 y1 = k512_shuffle_f32x4(v[8 + q], v[12 + q], 0xdd);
            t[q] = k512_shuffle_f32x4(w0, y0, 0x88);
            t[4 + q] = k512_shuffle_f32x4(w1, y1, 0x88);
            t[8 + q] = k512_shuffle_f32x4(w0, y0, 0xdd);
            t[12 + q] = k512_shuffle_f32x4(w1, y1, 0xdd);
        }
        for (int c = 0; c < 16; c++)
            _mm512_storeu_ps(d + (size_t)c * (size_t)rr, t[c]);
    }
    panel_pack_tile_r(rr, s, ldx, k, k1, d);
}

static void avx512_pack_x(const float *x, size_t T, size_t ldx, size_t K, size_t k0, size_t k1,
                          float *xp)
{
    panel_pack_x(x, T, ldx, K, k0, k1, one_tile(T) ? PM : PM2, xp, pack_tile16);
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

/* ---- attention's runs of cache rows ---- */

/* Lane i: a[i]'s fold in dot_any's order, ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7)) with v[j] =
 * a[i][j] + a[i][j + 8]. Each level adds the same pairs of partial sums as dot_any's halvings,
 * for two to sixteen rows per instruction: 15 adds and 30 shuffles instead of 16 horizontal
 * sums. The levels leave row c + 4 k in lane 4 c + k; the permutation puts row i in lane i. */
INLINE __m512 fold16(const __m512 a[16])
{
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7 row 2i's v, 8-15 row 2i + 1's */
        t[i] = _mm512_add_ps(k512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             k512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* 128-bit chunk c: row 4i + c's v[j] + v[j + 4], j < 4 */
        u[i] = _mm512_add_ps(k512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             k512_shuffle_f32x4(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) { /* chunk c: rows 8i + c and 8i + 4 + c, (u0 + u2, u1 + u3) */
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(u[2 * i]), _mm512_castps_pd(u[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(u[2 * i]), _mm512_castps_pd(u[2 * i + 1]));
        v[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i perm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(perm, r);
}

/* NC = n / 16 inputs of 16: the loops below unrolled, the accumulators in registers. */
INLINE void dot_rows(const float *a, const uint8_t *b, size_t stride, size_t m, int NC, float *out)
{
    for (size_t i0 = 0; i0 < m; i0 += 16) {
        size_t mm = m - i0 < 16 ? m - i0 : 16;
        __m512 acc[16]; /* in registers: the loop unrolled (a stack array cost 1/3 more) */
#pragma GCC unroll 16
        for (size_t r = 0; r < 16; r++) {
            const uint8_t *row = b + (i0 + (r < mm ? r : 0)) * stride;
            __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 16
            for (int c = 0; c < NC; c++) /* dot_any's 16 partial sums over whole blocks */
                s = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * c), k512_cvtph(row + 32 * c), s);
            acc[r] = s;
        }
        if (mm == 16) {
            _mm512_storeu_ps(out + i0, fold16(acc));
        } else { /* the rows past m repeat row i0: computed, not stored */
            float tmp[16];
            _mm512_storeu_ps(tmp, fold16(acc));
            memcpy(out + i0, tmp, mm * sizeof(float));
        }
    }
}

/* The 16 rows of wide (n floats each, n a multiple of 16) against a: dot_any's 16 partial sums
 * of each row, folded; a's block c is loaded once for the 16 rows. */
INLINE __m512 dot16_f32(const float *a, const float *wide, size_t n)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        acc[r] = _mm512_setzero_ps();
    for (size_t c = 0; c < n; c += 16) {
        __m512 av = _mm512_loadu_ps(a + c);
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++)
            acc[r] = _mm512_fmadd_ps(av, _mm512_load_ps(wide + r * n + c), acc[r]);
    }
    return fold16(acc);
}

/* Heads sharing their rows (GQA): each 16 rows widened once into wide, then every head's dots
 * from there (the conversions were most of a head's work). Other heads: dot_rows per head. */
static void avx512_dot_f16_n(const kern_run *rn, const float *a, size_t lda, float *out, size_t ldo)
{
    size_t n = rn->n, m = rn->m;
    bool unrolled = n == 64 || n == 128 || n == 256;
    if (n % 16 || n > 256 || (rn->bh && !unrolled)) {
        for (size_t h = 0; h < rn->g; h++)
            for (size_t i = 0; i < m; i++)
                out[h * ldo + i] =
                    dot_any(a + h * lda, (const uint8_t *)kern_run_row(rn, h, i), 1, n);
        return;
    }
    if (unrolled && (rn->bh || rn->g == 1)) {
        for (size_t h = 0; h < rn->g; h++) {
            const uint8_t *bp = (const uint8_t *)rn->b + h * rn->bh;
            switch (n) {
            case 64: dot_rows(a + h * lda, bp, rn->stride, m, 4, out + h * ldo); break;
            case 128: dot_rows(a + h * lda, bp, rn->stride, m, 8, out + h * ldo); break;
            default: dot_rows(a + h * lda, bp, rn->stride, m, 16, out + h * ldo); break;
            }
        }
        return;
    }
    _Alignas(64) float wide[16 * 256];
    for (size_t i0 = 0; i0 < m; i0 += 16) {
        size_t mm = m - i0 < 16 ? m - i0 : 16;
        for (size_t r = 0; r < 16; r++) { /* the rows past m repeat row i0: not stored below */
            const uint8_t *row = (const uint8_t *)kern_run_row(rn, 0, i0 + (r < mm ? r : 0));
            for (size_t c = 0; c < n; c += 16)
                _mm512_store_ps(wide + r * n + c, k512_cvtph(row + 2 * c));
        }
        for (size_t h = 0; h < rn->g; h++) {
            __m512 v = dot16_f32(a + h * lda, wide, n);
            if (mm == 16) {
                _mm512_storeu_ps(out + h * ldo + i0, v);
            } else {
                float tmp[16];
                _mm512_storeu_ps(tmp, v);
                memcpy(out + h * ldo + i0, tmp, mm * sizeof(float));
            }
        }
    }
}

/* HG heads' y over 64 of their values, y in registers over the m rows: 4 HG independent FMA
 * chains (one head alone, 4, waited on the FMA latency every row). Where the heads share their
 * rows (bh = 0) a row's 64 values are widened once for all of them. */
INLINE void axpy_heads(const kern_run *rn, size_t d, float *y, size_t ldy, const float *w,
                       size_t ldw, int HG, int shared)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < HG; h++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[h][c] = _mm512_loadu_ps(y + h * ldy + d + 16 * c);
    for (size_t i = 0; i < rn->m; i++) {
        const uint8_t *row = (const uint8_t *)rn->b + i * rn->stride + 2 * d;
        __m512 v[4];
        if (shared)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                v[c] = k512_cvtph(row + 32 * c);
#pragma GCC unroll 4
        for (int h = 0; h < HG; h++) {
            __m512 wv = _mm512_set1_ps(w[h * ldw + i]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[h][c] = _mm512_fmadd_ps(
                    wv, shared ? v[c] : k512_cvtph(row + h * rn->bh + 32 * c), acc[h][c]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < HG; h++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(y + h * ldy + d + 16 * c, acc[h][c]);
}

static void avx512_axpy_f16_n(const kern_run *rn, float *y, size_t ldy, const float *w, size_t ldw)
{
    if (rn->n % 64) {
        for (size_t h = 0; h < rn->g; h++)
            for (size_t i = 0; i < rn->m; i++)
                avx512_axpy_f16(y + h * ldy, w[h * ldw + i], kern_run_row(rn, h, i), rn->n);
        return;
    }
    for (size_t d = 0; d < rn->n; d += 64)
        for (size_t h = 0; h < rn->g; h += 4) {
            kern_run r = *rn;
            r.b = (const uint8_t *)rn->b + h * rn->bh;
            float *yh = y + h * ldy;
            const float *wh = w + h * ldw;
            size_t hg = rn->g - h < 4 ? rn->g - h : 4;
            if (rn->bh == 0 && hg == 4)
                axpy_heads(&r, d, yh, ldy, wh, ldw, 4, 1);
            else if (rn->bh == 0 && hg == 2)
                axpy_heads(&r, d, yh, ldy, wh, ldw, 2, 1);
            else if (hg == 4)
                axpy_heads(&r, d, yh, ldy, wh, ldw, 4, 0);
            else /* the rest one head at a time */
                for (size_t k = 0; k < hg; k++) {
                    r.b = (const uint8_t *)rn->b + (h + k) * rn->bh;
                    axpy_heads(&r, d, yh + k * ldy, ldy, wh + k * ldw, ldw, 1, 0);
                }
        }
}

/* ---- attention's softmax (kern/kexp.h: kern_exp in every lane, 16 lanes of sums) ---- */

/* kern_exp's and kern_expm1's common part: p = (e^r - 1) / r for x's r, and 2^k in *s */
INLINE __m512 k512_exp_poly(__m512 x, __m512 *r_out, __m512 *s)
{
    const __m512 shift = _mm512_set1_ps(KEXP_SHIFT);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(KEXP_LOG2E), shift);
    __m512 k = _mm512_sub_ps(t, shift);
    __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-KEXP_LN2_HI), x);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(-KEXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(KEXP_C7), r, _mm512_set1_ps(KEXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KEXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KEXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KEXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KEXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    /* t's bits are shift's plus k (no integer conversion in simde 0.7.4): 2^k's exponent */
    __m512i e = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(shift));
    *s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
    *r_out = r;
    return p;
}

INLINE __m512 k512_exp(__m512 x)
{
    __m512 r, s, p = k512_exp_poly(x, &r, &s);
    __m512 y = _mm512_mul_ps(_mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f)), s);
    y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(KEXP_MIN), _CMP_GE_OQ), y);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

INLINE __m512 k512_expm1(__m512 x)
{
    __m512 r, s, p = k512_exp_poly(x, &r, &s);
    __m512 y = _mm512_fmadd_ps(s, _mm512_mul_ps(p, r), _mm512_sub_ps(s, _mm512_set1_ps(1.0f)));
    y = _mm512_mask_mov_ps(_mm512_set1_ps(-1.0f),
                           _mm512_cmp_ps_mask(x, _mm512_set1_ps(KEXP_MIN), _CMP_GE_OQ), y);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

static float avx512_softmax(float *sc, size_t n, float *max)
{
    size_t n16 = n / 16 * 16;
    float lanes[16];
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (size_t i = 0; i < n16; i += 16) {
        __m512 v = _mm512_loadu_ps(sc + i);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), v);
    }
    _mm512_storeu_ps(lanes, m);
    float mx = kexp_max_tail(lanes, sc, n16, n);
    __m512 mv = _mm512_set1_ps(mx), s = _mm512_setzero_ps();
    for (size_t i = 0; i < n16; i += 16) {
        __m512 e = k512_exp(_mm512_sub_ps(_mm512_loadu_ps(sc + i), mv));
        _mm512_storeu_ps(sc + i, e);
        s = _mm512_add_ps(s, e);
    }
    _mm512_storeu_ps(lanes, s);
    *max = mx;
    return kexp_sum_tail(lanes, sc, n16, n, mx);
}

/* x * sigmoid(v) * u, the gated MLPs' tail (kern/kexp.h): with e = kern_exp(-|v|),
 * (v >= 0 ? x : x * e) / (1 + e) * u, so 1 + e never cancels. SiLU is k512_gate(x, x, u). */
INLINE __m512 k512_gate(__m512 x, __m512 v, __m512 u)
{
    __m512 e = k512_exp(_mm512_or_ps(v, _mm512_set1_ps(-0.0f))); /* -|v| */
    __m512 num = _mm512_mask_mov_ps(_mm512_mul_ps(x, e),
                                    _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ), x);
    return _mm512_mul_ps(_mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

static void avx512_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        _mm512_storeu_ps(g + i, k512_gate(x, x, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = kern_silu(g[i]) * u[i];
}

static void avx512_gelu_mul(float *g, const float *u, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 c = _mm512_mul_ps(_mm512_set1_ps(KGELU_A), _mm512_mul_ps(x, x));
        __m512 v = _mm512_mul_ps(_mm512_set1_ps(KGELU_2K), _mm512_fmadd_ps(c, x, x));
        _mm512_storeu_ps(g + i, k512_gate(x, v, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        g[i] = kern_gelu(g[i]) * u[i];
}

static void avx512_softcap(float *x, size_t n, float scale, float cap)
{
    const __m512 sign = _mm512_set1_ps(-0.0f), sc = _mm512_set1_ps(scale), cp = _mm512_set1_ps(cap);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = _mm512_div_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), sc), cp);
        __m512 a = _mm512_andnot_ps(sign, y);
        __m512 m = k512_expm1(_mm512_mul_ps(_mm512_set1_ps(-2.0f), a));
        __m512 t = _mm512_div_ps(_mm512_xor_ps(m, sign), _mm512_add_ps(_mm512_set1_ps(2.0f), m));
        t = _mm512_or_ps(_mm512_andnot_ps(sign, t), _mm512_and_ps(sign, y)); /* copysign */
        _mm512_storeu_ps(x + i, _mm512_mul_ps(cp, t));
    }
    for (; i < n; i++)
        x[i] = kern_softcap(x[i], scale, cap);
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

/* The table's operations but for its panel products and its integer path's product (each table
 * below names its own qmatmul: kern/qdot_avx512.c's, or for Zen 4 the halves form). F16
 * conversion 8 at a time (kern/f16c.h); every table's bits are the reference's. */
/* clang-format off */
#define AVX512_OPS                                                                                 \
    .dot = avx512_dot,                                                                             \
    .dot_f16 = avx512_dot_f16,                                                                     \
    .axpy = avx512_axpy,                                                                           \
    .axpy_f16 = avx512_axpy_f16,                                                                   \
    .to_f16 = kern__to_f16_f16c,                                                                   \
    .rmsnorm = avx512_rmsnorm,                                                                     \
    .dot_f16_n = avx512_dot_f16_n,                                                                 \
    .axpy_f16_n = avx512_axpy_f16_n,                                                               \
    .softmax = avx512_softmax,                                                                     \
    .silu_mul = avx512_silu_mul,                                                                   \
    .gelu_mul = avx512_gelu_mul,                                                                   \
    .softcap = avx512_softcap,                                                                     \
    .qx_quantize = KERN512(kern__qx_quantize_avx512)
/* clang-format on */

#ifdef KERN_AVX512_EMULATED
const kern_ops kern_avx512_emu_ops = {.name = "avx512-emulated",
                                      .matmul = avx512_matmul,
                                      .pack_x = avx512_pack_x,
                                      .pack_min_rows = PACK_MIN_ROWS,
                                      .qmatmul = KERN512(kern__qmatmul_avx512),
                                      AVX512_OPS};
#else
const kern_ops kern_avx512_ops = {.name = "avx512",
                                  .matmul = avx512_matmul,
                                  .pack_x = avx512_pack_x,
                                  .pack_min_rows = PACK_MIN_ROWS,
                                  .qmatmul = kern__qmatmul_avx512,
                                  AVX512_OPS};

/* For CPUs whose vcvtph2ps issues beside the FMAs (AMD Zen 5; kern_select's "auto"): the F16
 * pair tiles convert their own halves however many tiles a pass has (avx512_panel_cvt), and one
 * row of the 32-value types runs on a zmm stream (kern__qmatmul_avx512_leg), both measured
 * faster there only. The same bits: every table's products are the reference's. */
const kern_ops kern_avx512_cvt_ops = {
    .name = "avx512",
    .note = "F16 pairs converted in their tiles, one row of Q4_0..Q8_0 on zmm: this CPU converts "
            "halves beside its FMAs and runs zmm at full width",
    .matmul = avx512_matmul_cvt,
    .pack_x = avx512_pack_x,
    .pack_min_rows = PACK_MIN_ROWS,
    .qmatmul = kern__qmatmul_avx512_leg,
    AVX512_OPS};

/* For CPUs that run AVX-512 as two 256-bit halves (AMD Zen 4; kern_select's "auto"): the panel
 * products on the AVX2 table's 256-bit tiles, which there beat the zmm ones (TinyLlama F16, two
 * threads, kvs-bench-engine batch: 64 rows 98 / 84 tok/s, 512 rows 99 / 83; 16 rows and one
 * row the same; docs/BENCHMARKS.md), and one row of Q2_K and Q3_K on the ymm kernel
 * (kern__qmatmul_avx512_halves). The same bits: every table's products are the
 * reference's. */
const kern_ops kern_avx512_halves_ops = {
    .name = "avx512",
    .note = "F16/F32/Q8_0 panels and one row of Q2_K/Q3_K on AVX2's 256-bit kernels: this CPU "
            "runs AVX-512 in two halves",
    .matmul = kern__avx2_matmul,
    .qmatmul = kern__qmatmul_avx512_halves,
    AVX512_OPS};
#endif
