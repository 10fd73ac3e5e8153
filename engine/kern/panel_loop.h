/* The panel-loop driver the ISA files' matmuls share (kern/avx2.c, avx512.c, quant_avx2.c,
 * quant_avx512.c): rows of x in passes of at most PANEL_TC, each pass split into equal tiles of
 * at most PM rows, panels outer within a pass so that a panel stays in L1/L2 while every tile of
 * the pass reads it. Only the tile kernels differ per instruction set and stay in their files.
 * Header-only (static inline, always inlined) so each ISA file compiles the driver with its own
 * target flags, the emulated AVX-512 copy over simde included; the loop order, and so every
 * output's in-order FMA chain, is that of each file before the driver was shared. Not a public
 * header: for the kern/ files only. */
#ifndef KVS_ENGINE_KERN_PANEL_LOOP_H
#define KVS_ENGINE_KERN_PANEL_LOOP_H

#include "engine/kern/kern.h"
#include "engine/kern/quant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PANEL_INLINE static inline __attribute__((always_inline))
#define PANEL_TC 192     /* rows of x per pass over the panels: about the L2 */
#define PANEL_WCHUNK 256 /* inputs per widened chunk: 256 x 16 floats (16 KiB) stay in L1 */

/* One matmul call's operands (kern_ops.matmul's contract, kern/kern.h); for KERN_QUANT_PANEL
 * also the format and its offsets, found once per call rather than once per panel. */
typedef struct panel_job {
    const kern_mat *m;
    const float *x;
    size_t ldx;
    const float *xp; /* NULL, or x as panel_pack_x laid it out for this driver's tiles */
    float *out;
    size_t ldo;
    float *scratch;
    const kern_qfmt *f; /* KERN_QUANT_PANEL only, else NULL */
    kern_qoff o;
} panel_job;

/* One panel of one pass. */
typedef struct panel_step {
    size_t t0, tc;     /* the pass's rows of x: [t0, t0 + tc) */
    size_t nb, R;      /* in nb tiles of R rows (the last may hold fewer) */
    size_t base;       /* the panel's outputs: [base, base + KERN_PANEL) */
    size_t c0, c1;     /* of which columns [c0, c1) are wanted */
    size_t n1;         /* the call's end of outputs (whether the next panel is wanted whole) */
    const uint8_t *wp; /* the panel's bytes; the next panel's are pbytes further */
    size_t pbytes;
} panel_step;

/* The file's work on one step; returns the panels it covered (1, or 2 where it took the next
 * panel too). */
typedef size_t (*panel_fn)(const panel_job *j, const panel_step *s);

/* Every step of outputs [n0, n1) for T rows of x, in tiles of at most pm rows. */
PANEL_INLINE void panel_loop(const panel_job *j, size_t T, size_t n0, size_t n1, size_t pm,
                             panel_fn fn)
{
    panel_step s;
    s.pbytes = KERN_PANEL * j->m->row_bytes;
    s.n1 = n1;
    for (s.t0 = 0; s.t0 < T; s.t0 += PANEL_TC) {
        s.tc = T - s.t0 < PANEL_TC ? T - s.t0 : PANEL_TC;
        s.nb = (s.tc + pm - 1) / pm;
        s.R = (s.tc + s.nb - 1) / s.nb;
        for (size_t p = n0 / KERN_PANEL; p * KERN_PANEL < n1;) {
            s.base = p * KERN_PANEL;
            s.c0 = n0 > s.base ? n0 - s.base : 0;
            s.c1 = n1 - s.base < KERN_PANEL ? n1 - s.base : KERN_PANEL;
            s.wp = (const uint8_t *)j->m->data + p * s.pbytes;
            p += fn(j, &s);
        }
    }
}

/* Rows of the tile that starts at row t of the step's pass: R, or what is left. */
PANEL_INLINE int panel_rows(const panel_step *s, size_t t)
{
    size_t left = s->t0 + s->tc - t;
    return (int)(left < s->R ? left : s->R);
}

/* Whether this panel and the next are both wanted whole (a two-panel tile may run). */
PANEL_INLINE bool panel_pair_whole(const panel_step *s)
{
    return s->c0 == 0 && s->c1 == KERN_PANEL && s->base + 2 * KERN_PANEL <= s->n1;
}

/* The panels after the ones a pass's tiles read, pulled into L2 a share per tile: tile i of nb
 * prefetches bytes [i, i + 1) * bytes / nb past them, spread evenly over its k loop. Only the
 * first tile of a pass reads a panel from memory; without this it stalls on the stream while
 * the later ones run from L2, and the memory idles. Zen 4, kvs-bench-engine batch, paired runs:
 * 16-row decode steps of F16 (the AVX2 tiles: 6, 6, 4 rows) +11 % for the 110m shape, +14 % for
 * TinyLlama's, 64 rows +1 %; the AVX-512 tiles forced there (8 + 8 rows) +4 % and -1 %. One tile
 * (nb == 1) has no share: p is NULL. */
typedef struct panel_pf {
    const uint8_t *p;
    size_t step; /* bytes per k, times 256 */
} panel_pf;

/* Tile i's share of the bytes after the pass's panels (bytes of them, K inputs). */
PANEL_INLINE panel_pf panel_pf_share(const panel_step *s, size_t i, size_t bytes, size_t K)
{
    panel_pf pf = {NULL, 0};
    if (s->nb > 1) {
        pf.p = s->wp + bytes + i * bytes / s->nb;
        pf.step = (bytes << 8) / (s->nb * K);
    }
    return pf;
}

/* The tile's prefetch at input k (into L2: prefetcht1; a hint, never a fault, so running past
 * the matrix's end is harmless) */
PANEL_INLINE void panel_pf_at(panel_pf pf, size_t k)
{
    if (pf.p)
        __builtin_prefetch(pf.p + ((k * pf.step) >> 8), 0, 2);
}

/* ---- float panels (KERN_F32_PANEL, KERN_F16_PANEL, KERN_Q8_0_PANEL) ---- */

/* The file's R x 16 tile over a float panel of type pt at wp (K inputs). */
typedef void (*panel_tile_fn)(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp,
                              size_t K, float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf);
/* The file's widening of a Q8_0 panel into an F32 one ([K][16], the values its tile computes). */
typedef void (*panel_widen_q8_fn)(const uint8_t *wp, size_t K, float *dst);

/* One float step: every tile of the pass over the panel. A Q8_0 panel that more than one tile
 * reads is widened once into scratch first (its conversion costs more than an F16 one). */
PANEL_INLINE size_t panel_float_step(const panel_job *j, const panel_step *s, panel_tile_fn tile,
                                     panel_widen_q8_fn widen_q8)
{
    const uint8_t *wp = s->wp;
    kern_type pt = j->m->type;
    size_t K = j->m->n_in;
    if (pt == KERN_Q8_0_PANEL && j->scratch && s->nb > 1) {
        widen_q8(wp, K, j->scratch);
        wp = (const uint8_t *)j->scratch;
        pt = KERN_F32_PANEL;
    }
    size_t i = 0; /* the tiles of a Q8_0 panel widened into scratch take no share */
    for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R, i++)
        tile(pt, panel_rows(s, t), j->x + t * j->ldx, j->ldx, wp, K, j->out + t * j->ldo + s->base,
             j->ldo, s->c0, s->c1,
             wp == s->wp ? panel_pf_share(s, i, s->pbytes, K) : (panel_pf){NULL, 0});
    return 1;
}

/* ---- quantized panels (KERN_QUANT_PANEL, kern/quant.h) ---- */

/* The file's widening of inputs [b0 * sb, b0 * sb + n) of quantized panel wp into dst ([n][16],
 * aligned to 64). */
typedef void (*panel_widen_fn)(const kern_qfmt *f, const kern_qoff *o, const uint8_t *wp, size_t b0,
                               size_t n, float *dst);
/* The file's R x 16 tile continuing its chains over n widened inputs w: the sums start at +0
 * (first) or at the values out holds. */
typedef void (*panel_ftile_fn)(int R, const float *x, size_t ldx, const float *w, size_t n,
                               float *out, size_t ldo, size_t c0, size_t c1, bool first);

/* One quantized step from three rows on: each chunk of the panel is widened once into L1 and
 * every tile of the pass continues its chains over it, so chunk after chunk each output is one
 * in-order FMA chain over k. */
PANEL_INLINE void panel_widened_step(const panel_job *j, const panel_step *s, panel_widen_fn widen,
                                     panel_ftile_fn tile)
{
    float w[PANEL_WCHUNK * KERN_PANEL] __attribute__((aligned(64)));
    size_t K = j->m->n_in;
    size_t chunk = PANEL_WCHUNK < K ? PANEL_WCHUNK : K; /* a multiple of sb: 32 or 256 */
    for (size_t k0 = 0; k0 < K; k0 += chunk) {
        size_t n = K - k0 < chunk ? K - k0 : chunk;
        widen(j->f, &j->o, s->wp, k0 / j->f->sb, n, w);
        for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R)
            tile(panel_rows(s, t), j->x + t * j->ldx + k0, j->ldx, w, n,
                 j->out + t * j->ldo + s->base, j->ldo, s->c0, s->c1, k0 == 0);
    }
}

/* ---- one instantiation per row count ----
 * PANEL_SWITCH(R, PM, C, t): switch (R) with a case per row count 1 .. PM - 1 and PM as the
 * default, each calling C(t, r) with r a constant and returning, so every loop bound and unroll
 * in the tile t is resolved at compile time. PM is 6 (AVX2), 12 or 16 (AVX-512). */
/* clang-format off */
#define PANEL_C_(C, t, r) case r: C(t, r); return;
#define PANEL_CASES_6(C, t) PANEL_C_(C, t, 1) PANEL_C_(C, t, 2) PANEL_C_(C, t, 3) \
    PANEL_C_(C, t, 4) PANEL_C_(C, t, 5)
#define PANEL_CASES_12(C, t) PANEL_CASES_6(C, t) PANEL_C_(C, t, 6) PANEL_C_(C, t, 7) \
    PANEL_C_(C, t, 8) PANEL_C_(C, t, 9) PANEL_C_(C, t, 10) PANEL_C_(C, t, 11)
#define PANEL_CASES_16(C, t) PANEL_CASES_12(C, t) PANEL_C_(C, t, 12) \
    PANEL_C_(C, t, 13) PANEL_C_(C, t, 14) PANEL_C_(C, t, 15)
#define PANEL_SWITCH_(R, pm, C, t) switch (R) { PANEL_CASES_##pm(C, t) default: C(t, pm); return; }
/* clang-format on */
#define PANEL_SWITCH(R, pm, C, t) PANEL_SWITCH_(R, pm, C, t)

/* Values [k0, k1) of one tile's rr rows (s, ldx apart) side by side from d: rr a constant in
 * each instantiation, so a value is one load and one store. */
PANEL_INLINE void panel_pack_tile(int rr, const float *s, size_t ldx, size_t k0, size_t k1,
                                  float *d)
{
    for (size_t k = k0; k < k1; k++, d += rr)
#pragma GCC unroll 16
        for (int r = 0; r < rr; r++)
            d[r] = s[(size_t)r * ldx + k];
}
#define PANEL_PACK_(t, r) t(r, s, ldx, k0, k1, d)
static inline void panel_pack_tile_r(int rr, const float *s, size_t ldx, size_t k0, size_t k1,
                                     float *d)
{
    PANEL_SWITCH(rr, 16, PANEL_PACK_, panel_pack_tile);
}

/* A file's packing of one tile: panel_pack_tile_r's values, by its own means. */
typedef void (*panel_pack_fn)(int rr, const float *s, size_t ldx, size_t k0, size_t k1, float *d);

/* Values [k0, k1) of x's rows for panel_loop's tiles of at most pm (<= 16) rows: each tile's R
 * rows [k][R], value k of its rows side by side, so a tile reads one stream of R values per
 * input rather than R rows ldx apart (with 12 rows the row pointers alone exceed the general
 * registers, and the loop spills them). The tiles follow one another: the one at row t starts
 * at xp + t * K. */
PANEL_INLINE void panel_pack_x(const float *x, size_t T, size_t ldx, size_t K, size_t k0, size_t k1,
                               size_t pm, float *xp, panel_pack_fn tile)
{
    for (size_t t0 = 0; t0 < T; t0 += PANEL_TC) {
        size_t tc = T - t0 < PANEL_TC ? T - t0 : PANEL_TC;
        size_t nb = (tc + pm - 1) / pm, R = (tc + nb - 1) / nb;
        for (size_t t = t0; t < t0 + tc; t += R) {
            size_t rr = t0 + tc - t < R ? t0 + tc - t : R;
            tile((int)rr, x + t * ldx, ldx, k0, k1, xp + t * K + k0 * rr);
        }
    }
}

/* The calls the definitions below instantiate, with the parameters' names. */
#define PANEL_TILE_Q8_(t, r) t(KERN_Q8_0_PANEL, r, x, ldx, wp, K, out, ldo, c0, c1, pf)
#define PANEL_TILE_F16_(t, r) t(KERN_F16_PANEL, r, x, ldx, wp, K, out, ldo, c0, c1, pf)
#define PANEL_TILE_F32_(t, r) t(KERN_F32_PANEL, r, x, ldx, wp, K, out, ldo, c0, c1, pf)
#define PANEL_FTILE_(t, r) t(r, x, ldx, w, n, out, ldo, c0, c1, first)

/* Defines static void name(...), a panel_tile_fn: the file's always-inlined float tile
 * tile(pt, R, ...) instantiated once per (panel type, R <= pm). */
#define PANEL_DEFINE_TILE_R(name, tile, pm)                                                        \
    static void name(kern_type pt, int R, const float *x, size_t ldx, const uint8_t *wp, size_t K, \
                     float *out, size_t ldo, size_t c0, size_t c1, panel_pf pf)                    \
    {                                                                                              \
        if (pt == KERN_Q8_0_PANEL)                                                                 \
            PANEL_SWITCH(R, pm, PANEL_TILE_Q8_, tile)                                              \
        if (pt == KERN_F16_PANEL)                                                                  \
            PANEL_SWITCH(R, pm, PANEL_TILE_F16_, tile)                                             \
        PANEL_SWITCH(R, pm, PANEL_TILE_F32_, tile)                                                 \
    }

/* Defines static void name(...), a panel_ftile_fn: the file's always-inlined widened-input tile
 * tile(R, ...) instantiated once per R <= pm. */
#define PANEL_DEFINE_FTILE_R(name, tile, pm)                                                       \
    static void name(int R, const float *x, size_t ldx, const float *w, size_t n, float *out,      \
                     size_t ldo, size_t c0, size_t c1, bool first)                                 \
    {                                                                                              \
        PANEL_SWITCH(R, pm, PANEL_FTILE_, tile)                                                    \
    }

#endif
