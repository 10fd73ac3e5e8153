/* AVX-512 products over quantized panels (kern/quant.h), every type, compiled with avx512.c's
 * flags (and over simde for the tests, kern/avx512_isa.h). A super-block's planes are expanded
 * to int8 Q with 64-byte shifts and masks (a vpshufb for the IQ4 levels), two 32-byte groups
 * per register, into an L1 buffer; each panel line is then one zmm widened as fmadd(S, Q, M),
 * the exact value (S * Q is exact), and multiplied in ref.c's in-order FMA chain: the portable
 * table's bits. One or two rows read the blocks in place (two panels at once where the column
 * range allows); from three rows on each 256-input chunk of a panel is widened once into L1
 * and tiles of up to 16 rows continue their chains over it. */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/panel_loop.h"
#include "engine/kern/quant.h"
#include "engine/kern/tile2_zmm.h"

#include <stdbool.h>
#include <string.h>

#define PM 16 /* rows per tile, as avx512.c */
#define QBUF (256 * KERN_PANEL)

INLINE __m256i ld32(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* The 32-byte groups at a and b as one register (a low), and back. */
INLINE __m512i ld_pair(const int8_t *a, const int8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(ld32(a)), ld32(b), 1);
}

INLINE void st_pair(int8_t *a, int8_t *b, __m512i v)
{
    _mm256_storeu_si256((__m256i *)(void *)a, _mm512_castsi512_si256(v));
    _mm256_storeu_si256((__m256i *)(void *)b, _mm512_extracti64x4_epi64(v, 1));
}

/* Q from raw: the IQ4 levels (a vpshufb per 128-bit lane) or the bias. */
INLINE __m512i q_of(int fin, __m512i lut, __m512i bias, __m512i raw)
{
    if (fin == 2)
        return _mm512_shuffle_epi8(lut, raw);
    return fin == 1 ? _mm512_sub_epi8(raw, bias) : raw;
}

/* The int8 Q (T[k * 16 + c]) of one panel super-block: kern__q_expand_ref's values. A 64-byte
 * load covers two of the layout's 32-byte groups (m = 2i and 2i + 1), whose values land in two
 * separate runs of T: hence the stores in pairs. The low bits are stored, then the high bits
 * (if any) or'ed in; the levels or the bias are applied in the last pass over each vector. n
 * (sb * 16) is a multiple of 512, so every loop below runs whole pairs. */
INLINE void expand_t(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, int8_t *T, int fin)
{
    size_t n = (size_t)f->sb * KERN_PANEL;
    const uint8_t *lo = ps + o->lo, *hi = ps + o->hi;
    const __m512i lut =
        f->lut ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)f->lut))
               : _mm512_setzero_si512();
    const __m512i bias = _mm512_set1_epi8((char)f->bias);
    int lo_fin = f->hi_bits ? 0 : fin; /* the last pass over these vectors applies fin */
    if (f->lo_bits == 4) {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (size_t i = 0; i < n / 128; i++) {
            __m512i v = _mm512_loadu_si512((const void *)(lo + 64 * i));
            int8_t *t = T + 128 * i;
            st_pair(t, t + 64, q_of(lo_fin, lut, bias, _mm512_and_si512(v, m4)));
            st_pair(t + 32, t + 96,
                    q_of(lo_fin, lut, bias, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)));
        }
    } else {
        const __m512i m2 = _mm512_set1_epi8(3);
        for (size_t i = 0; i < n / 256; i++) {
            __m512i v = _mm512_loadu_si512((const void *)(lo + 64 * i));
            int8_t *t = T + 256 * i;
            st_pair(t, t + 128, q_of(lo_fin, lut, bias, _mm512_and_si512(v, m2)));
            st_pair(t + 32, t + 160,
                    q_of(lo_fin, lut, bias, _mm512_and_si512(_mm512_srli_epi16(v, 2), m2)));
            st_pair(t + 64, t + 192,
                    q_of(lo_fin, lut, bias, _mm512_and_si512(_mm512_srli_epi16(v, 4), m2)));
            st_pair(t + 96, t + 224,
                    q_of(lo_fin, lut, bias, _mm512_and_si512(_mm512_srli_epi16(v, 6), m2)));
        }
    }
    /* b's bits stay inside their byte: at most 3 << 4. The shifts by a loop counter take the
     * count in a register (vpsrlw zmm, xmm): simde's immediate form wants a constant. */
    __m128i sh = _mm_cvtsi32_si128(f->lo_bits);
    if (f->hi_bits == 1) {
        const __m512i m1 = _mm512_set1_epi8(1);
        for (size_t i = 0; i < n / 512; i++) {
            __m512i h = _mm512_loadu_si512((const void *)(hi + 64 * i));
            for (int s = 0; s < 8; s++) {
                __m512i b = _mm512_and_si512(_mm512_srl_epi16(h, _mm_cvtsi32_si128(s)), m1);
                int8_t *ta = T + 512 * i + 32 * s, *tb = ta + 256;
                st_pair(ta, tb,
                        q_of(fin, lut, bias,
                             _mm512_or_si512(ld_pair(ta, tb), _mm512_sll_epi16(b, sh))));
            }
        }
    } else if (f->hi_bits == 2) {
        const __m512i m2 = _mm512_set1_epi8(3);
        for (size_t i = 0; i < n / 256; i++) {
            __m512i h = _mm512_loadu_si512((const void *)(hi + 64 * i));
            for (int s = 0; s < 4; s++) {
                __m512i b = _mm512_and_si512(_mm512_srl_epi16(h, _mm_cvtsi32_si128(2 * s)), m2);
                int8_t *ta = T + 256 * i + 32 * s, *tb = ta + 128;
                st_pair(ta, tb,
                        q_of(fin, lut, bias,
                             _mm512_or_si512(ld_pair(ta, tb), _mm512_sll_epi16(b, sh))));
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

/* 16 bf16 at p as floats (MXFP4's d): each shifted into the top half of its float, in two ymm
 * halves as k512_cvtph's emulated form */
INLINE __m512 bf16x16(const uint8_t *p)
{
    __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
    return _mm512_insertf32x8(
        _mm512_castps256_ps512(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16))),
        _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)), 1);
}

/* S and M of the 16 rows for sub-block j of a panel super-block. */
INLINE void scales(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, size_t j, __m512 *S,
                   __m512 *M)
{
    __m512 d = f->d_bf16 ? bf16x16(ps) : k512_cvtph(ps);
    *S = f->has_sc ? _mm512_mul_ps(d, k512_i8_ps(ps + o->sc + j * KERN_PANEL)) : d;
    if (!f->has_min) {
        *M = _mm512_set1_ps(-0.0f);
        return;
    }
    __m512 dm = k512_cvtph(ps + o->dm);
    *M = f->has_sc ? _mm512_mul_ps(dm, k512_u8_ps(ps + o->mi + j * KERN_PANEL)) : dm;
}

/* Line k's 16 weights from the expanded Q. */
INLINE __m512 line(const int8_t *T, size_t k, __m512 S, __m512 M)
{
    return _mm512_fmadd_ps(S, k512_i8_ps(T + k * KERN_PANEL), M);
}

/* An R x (16 NP) tile over NP adjacent panels at wp (pbytes apart), read in place (R <= 2);
 * with NP = 2 only whole panels (out[0..32)), else columns c0..c1. */
INLINE void qtile(const kern_qfmt *f, const kern_qoff *o, int NP, int R, const float *x, size_t ldx,
                  const uint8_t *wp, size_t pbytes, size_t K, float *out, size_t ldo, size_t c0,
                  size_t c1)
{
    __m512 acc[2][2];
    int8_t T[2][QBUF] __attribute__((aligned(64)));
    for (int r = 0; r < R; r++)
        for (int p = 0; p < NP; p++)
            acc[r][p] = _mm512_setzero_ps();
    size_t n_sub = f->sb / f->sub, sub = f->sub;
    for (size_t b = 0; b < K / f->sb; b++) {
        const uint8_t *ps[2];
        for (int p = 0; p < NP; p++) {
            ps[p] = wp + (size_t)p * pbytes + b * o->psb;
            expand(f, o, ps[p], T[p]);
        }
        for (size_t j = 0; j < n_sub; j++) {
            __m512 S[2], M[2];
            for (int p = 0; p < NP; p++)
                scales(f, o, ps[p], f->has_sc ? j : 0, &S[p], &M[p]);
            const float *xk = x + b * f->sb;
            for (size_t k = j * sub; k < (j + 1) * sub; k++)
                for (int p = 0; p < NP; p++) {
                    __m512 w = line(T[p], k, S[p], M[p]);
                    for (int r = 0; r < R; r++)
                        acc[r][p] =
                            _mm512_fmadd_ps(_mm512_set1_ps(xk[(size_t)r * ldx + k]), w, acc[r][p]);
                }
        }
    }
    for (int r = 0; r < R; r++) {
        float *orow = out + (size_t)r * ldo;
        if (NP == 2) {
            _mm512_storeu_ps(orow, acc[r][0]);
            _mm512_storeu_ps(orow + KERN_PANEL, acc[r][1]);
            continue;
        }
        float tmp[KERN_PANEL];
        _mm512_storeu_ps(tmp, acc[r][0]);
        for (size_t c = c0; c < c1; c++)
            orow[c] = tmp[c];
    }
}

static void qtile_r(const kern_qfmt *f, const kern_qoff *o, int NP, int R, const float *x,
                    size_t ldx, const uint8_t *wp, size_t pbytes, size_t K, float *out, size_t ldo,
                    size_t c0, size_t c1)
{
    if (NP == 2 && R == 1)
        qtile(f, o, 2, 1, x, ldx, wp, pbytes, K, out, ldo, c0, c1);
    else if (NP == 2)
        qtile(f, o, 2, 2, x, ldx, wp, pbytes, K, out, ldo, c0, c1);
    else if (R == 1)
        qtile(f, o, 1, 1, x, ldx, wp, pbytes, K, out, ldo, c0, c1);
    else
        qtile(f, o, 1, 2, x, ldx, wp, pbytes, K, out, ldo, c0, c1);
}

/* Inputs [b0 * sb, b0 * sb + n) of panel wp widened into dst ([n][16]). */
static void widen_chunk(const kern_qfmt *f, const kern_qoff *o, const uint8_t *wp, size_t b0,
                        size_t n, float *dst)
{
    int8_t T[QBUF] __attribute__((aligned(64)));
    size_t n_sub = f->sb / f->sub, sub = f->sub;
    for (size_t b = b0; b < b0 + n / f->sb; b++, dst += (size_t)f->sb * KERN_PANEL) {
        const uint8_t *ps = wp + b * o->psb;
        expand(f, o, ps, T);
        for (size_t j = 0; j < n_sub; j++) {
            __m512 S, M;
            scales(f, o, ps, f->has_sc ? j : 0, &S, &M);
            for (size_t k = j * sub; k < (j + 1) * sub; k++)
                _mm512_store_ps(dst + k * KERN_PANEL, line(T, k, S, M));
        }
    }
}

/* An R x 16 tile continuing its chains over n widened inputs w ([n][16]): the sums start at
 * +0 (first) or at the values out holds (stored floats: exact), so chunk after chunk is one
 * in-order FMA chain over k. */
INLINE void ftile(int R, const float *x, size_t ldx, const float *w, size_t n, float *out,
                  size_t ldo, size_t c0, size_t c1, bool first)
{
    __m512 acc[PM];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        if (first || c0 != 0 || c1 != KERN_PANEL) {
            float tmp[KERN_PANEL] = {0};
            for (size_t c = c0; c < c1 && !first; c++)
                tmp[c] = out[(size_t)r * ldo + c];
            acc[r] = _mm512_loadu_ps(tmp);
        } else {
            acc[r] = _mm512_loadu_ps(out + (size_t)r * ldo);
        }
    }
    for (size_t k = 0; k < n; k++) {
        __m512 wk = _mm512_load_ps(w + k * KERN_PANEL);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)r * ldx + k]), wk, acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        float tmp[KERN_PANEL];
        _mm512_storeu_ps(tmp, acc[r]);
        for (size_t c = c0; c < c1; c++)
            out[(size_t)r * ldo + c] = tmp[c];
    }
}

/* ftile once per R */
PANEL_DEFINE_FTILE_R(ftile_r, ftile, PM)

/* ftile over two whole adjacent panels' widened chunks w0, w1 (tile2_zmm.h): two weight vectors
 * meet each broadcast x (half the broadcast loads per FMA; avx512.c's pair tiles), up to PM2
 * rows, once per R. */
#define PM2 TILE2_ROWS
#define FTILE2_(t, r)                                                                              \
    t(r, false, x, ldx, w0, w1, KERN_PANEL, n, out, ldo, first, (panel_pf){NULL, 0})
static void ftile2_r(int R, const float *x, size_t ldx, const float *w0, const float *w1, size_t n,
                     float *out, size_t ldo, bool first)
{
    PANEL_SWITCH(R, 12, FTILE2_, zmm_ftile2)
}

/* panel_widened_step over two whole panels: both chunks widened (2 x 16 KiB of L1), then every
 * tile of the pass continues its chains over the pair. */
static void widened_pair(const panel_job *j, const panel_step *s)
{
    float w0[PANEL_WCHUNK * KERN_PANEL] __attribute__((aligned(64)));
    float w1[PANEL_WCHUNK * KERN_PANEL] __attribute__((aligned(64)));
    size_t K = j->m->n_in;
    size_t chunk = PANEL_WCHUNK < K ? PANEL_WCHUNK : K;
    for (size_t k0 = 0; k0 < K; k0 += chunk) {
        size_t n = K - k0 < chunk ? K - k0 : chunk;
        widen_chunk(j->f, &j->o, s->wp, k0 / j->f->sb, n, w0);
        widen_chunk(j->f, &j->o, s->wp + s->pbytes, k0 / j->f->sb, n, w1);
        for (size_t t = s->t0; t < s->t0 + s->tc; t += s->R)
            ftile2_r(panel_rows(s, t), j->x + t * j->ldx + k0, j->ldx, w0, w1, n,
                     j->out + t * j->ldo + s->base, j->ldo, k0 == 0);
    }
}

/* From 3 rows on, chunks widened into L1 and tiles of up to 16 rows; one or two rows read the
 * blocks in place, two whole panels at once where the columns allow (2 R independent chains in
 * flight instead of R). */
static size_t qpanel(const panel_job *j, const panel_step *s)
{
    if (s->tc > 2) {
        if (panel_pair_whole(s)) {
            widened_pair(j, s);
            return 2;
        }
        panel_widened_step(j, s, widen_chunk, ftile_r);
        return 1;
    }
    int np = panel_pair_whole(s) ? 2 : 1;
    qtile_r(j->f, &j->o, np, (int)s->tc, j->x + s->t0 * j->ldx, j->ldx, s->wp, s->pbytes,
            j->m->n_in, j->out + s->t0 * j->ldo + s->base, j->ldo, s->c0, s->c1);
    return (size_t)np;
}

/* kern/panel_loop.h's driver; the scratch offered is unused (the chunks live on the stack). */
void KERN512(kern__quant_matmul_avx512)(const kern_mat *m, const float *x, size_t T, size_t ldx,
                                        float *out, size_t ldo, size_t n0, size_t n1,
                                        float *scratch)
{
    (void)scratch;
    panel_job j = {.m = m, .x = x, .ldx = ldx, .out = out, .ldo = ldo, .f = kern__qfmt(m->qtype)};
    j.o = kern__qoff(j.f);
    panel_loop(&j, T, n0, n1, PM2, qpanel); /* tiles of at most PM2 rows, for the pairs */
}
