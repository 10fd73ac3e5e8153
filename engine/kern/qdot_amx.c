/* AMX integer products over KERN_QUANT_X8 (kern/qdot_pack.c's interleaved groups), 16 rows of x
 * at a time: Intel's tile unit (Sapphire Rapids on) multiplies a 16 x 64-byte tile of int8 by
 * another in one instruction, 16 times the multiply-adds of a zmm vpdpbusd. Every integer type of
 * the layout but IQ4_XS (kern__amx_takes); kern__qmatmul_avx512 calls it from 32 rows of x on.
 *
 * The bits are kern/qdot_x8_avx512.c's: a block's sums are exact integers whichever unit adds
 * them, and everything after them, the mins through the sums of 16 activations and the float
 * fold, is that file's code (kern/qdot_x8_zmm.h) on the tile's rows. A tile product spans 64
 * values, more than a K-quant's sub-block, so each type's B tiles carry its sub-block scales as
 * digits small enough for a byte (btiles_q45k, btiles_q23k, btiles_q6k say how); S is then a
 * few tiles' sums shifted and added, the same integer as the zmm kernels' sum of scaled
 * sub-block sums. The 32-value types take a tile product per block (pair_leg).
 *
 * Tiles (one configuration per call, cfg_load): x's rows are read in place from the quantized
 * activations (A: 16 rows, xrb apart); the weights' B tiles are built once per block of a pair of
 * groups for all the rows of x, the layout's quads already lying as the instruction wants them
 * (a row's quad per 32-bit lane, two groups the 64 bytes of a tile row); sums go to memory and
 * are folded on zmm.
 *
 * Built with -mamx-tile -mamx-int8 beside the VNNI copy (engine/meson.build); used only where
 * CPUID has AMX-INT8, the OS enables its state and grants it to the process (kern__amx_ready). */
#define _DEFAULT_SOURCE /* syscall() */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_x8_zmm.h"

#include <cpuid.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023 /* asm/prctl.h, Linux 5.16 */
#define XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return; /* AMX-TILE, AMX-INT8 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)))
        return; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return; /* XTILECFG, XTILEDATA enabled by the OS */
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int kern__amx_ready(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

typedef struct amx_cfg {
    uint8_t palette, start;
    uint8_t res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* leg = 0: every tile 16 x 64 bytes (A: 16 rows of x, 64 values; B; C: 16 x 16 int32). leg = 1,
 * the 32-value types: A 16 rows of x by one block's 32 values, B that block's 8 quads. */
static void cfg_load(int leg)
{
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++)
        c.rows[i] = 16, c.colsb[i] = 64;
    if (leg) /* two A tiles (0, 2) and two B tiles (1, 3), taking turns */
        c.colsb[0] = c.colsb[2] = 32, c.rows[1] = c.rows[3] = 8;
    _tile_loadconfig(&c);
}

/* The B tiles of one Q4_K or Q5_K (q5) block of groups a, c (pa, pc), by quarters q (64 values:
 * sub-blocks 2 q and 2 q + 1): row kr < 8 quad kr of sub-block 2 q, row 8 + kr quad kr of 2 q + 1,
 * the 8 rows of a in bytes 0..31, those of c in 32..63; Q5_K's fifth bit (bit j of qh's byte for
 * sub-block j) above each nibble. A sub-block's scale sc (6 bits) goes in as 8 sh + sl (3 bits
 * each): lo holds value * sl, hi value * sh (at most 31 * 7 = 217: unsigned bytes, and vpmullw on
 * a word of two of them carries nothing into the high one), so one tile product spans two
 * sub-blocks of different scales and S = lo + 8 hi is the sum of sc_j times sub-block j's sum. */
typedef struct amx_q4k_bt {
    uint8_t lo[4][16][64], hi[4][16][64];
} amx_q4k_bt;

static inline __attribute__((always_inline)) void btiles_q45k(const uint8_t *pa, const uint8_t *pc,
                                                              int q5, amx_q4k_bt *bt)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m7 = _mm512_set1_epi32(7);
    const __m512i m10 = _mm512_set1_epi8(0x10);
    const kern__q4kx8 *ha = (const kern__q4kx8 *)(const void *)pa; /* the heads */
    const kern__q4kx8 *hc = (const kern__q4kx8 *)(const void *)pc;
    size_t qs = q5 ? offsetof(kern__q5kx8, qs) : offsetof(kern__q4kx8, qs);
    __m512i h[8];
    if (q5)
        for (int k = 0; k < 8; k++)
            h[k] = pair(ld(pa + offsetof(kern__q5kx8, qh) + 32 * k),
                        ld(pc + offsetof(kern__q5kx8, qh) + 32 * k));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i sl[2], sh[2];
        for (int j = 0; j < 2; j++) {
            __m512i sc = u8x16(ha->sc[2 * q + j], hc->sc[2 * q + j]);
            sl[j] = pairs16(_mm512_and_si512(sc, m7));
            sh[j] = pairs16(_mm512_srli_epi32(sc, 3));
        }
        for (int k = 0; k < 8; k++) {
            __m512i v = pair(ld(pa + qs + 256 * q + 32 * k), ld(pc + qs + 256 * q + 32 * k));
            __m512i l = _mm512_and_si512(v, m4), u = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (q5) { /* l | bit 2 q at bit 4, u | bit 2 q + 1's: 0xf8 = a | b & c */
                l = _mm512_ternarylogic_epi32(l, bit_to4(h[k], 2 * q), m10, 0xf8);
                u = _mm512_ternarylogic_epi32(u, bit_to4(h[k], 2 * q + 1), m10, 0xf8);
            }
            _mm512_store_si512((void *)bt->lo[q][k], _mm512_mullo_epi16(l, sl[0]));
            _mm512_store_si512((void *)bt->hi[q][k], _mm512_mullo_epi16(l, sh[0]));
            _mm512_store_si512((void *)bt->lo[q][8 + k], _mm512_mullo_epi16(u, sl[1]));
            _mm512_store_si512((void *)bt->hi[q][8 + k], _mm512_mullo_epi16(u, sh[1]));
        }
    }
}

/* nt (1 or 2) tiles of 16 rows of x (the first at x0, the block's values; xrb apart) times one
 * block's B tiles: cs[2 i] tile i's lo sums, cs[2 i + 1] its hi ones. Tiles: tmm0, tmm1 the rows
 * of x, tmm2, tmm3 lo and hi, tmm4..tmm7 the sums: two x tiles share each B tile loaded, and
 * four independent chains keep the tile unit busy. */
static inline __attribute__((always_inline)) void block_q4k(const amx_q4k_bt *bk, const uint8_t *x0,
                                                            size_t xrb, int nt, int sgn,
                                                            int32_t cs[4][16][16])
{
    _tile_zero(4);
    _tile_zero(5);
    if (nt == 2) {
        _tile_zero(6);
        _tile_zero(7);
    }
    for (int q = 0; q < 4; q++) {
        _tile_loadd(2, bk->lo[q], 64);
        _tile_loadd(3, bk->hi[q], 64);
        _tile_loadd(0, x0 + 64 * q, xrb);
        if (sgn) { /* Q2_K, Q3_K: signed bytes (kern/qdot_amx.c's btiles_q23k) */
            _tile_dpbssd(4, 0, 2);
            _tile_dpbssd(5, 0, 3);
        } else {
            _tile_dpbsud(4, 0, 2);
            _tile_dpbsud(5, 0, 3);
        }
        if (nt == 2) {
            _tile_loadd(1, x0 + 16 * xrb + 64 * q, xrb);
            if (sgn) {
                _tile_dpbssd(6, 1, 2);
                _tile_dpbssd(7, 1, 3);
            } else {
                _tile_dpbsud(6, 1, 2);
                _tile_dpbsud(7, 1, 3);
            }
        }
    }
    _tile_stored(4, cs[0], 64);
    _tile_stored(5, cs[1], 64);
    if (nt == 2) {
        _tile_stored(6, cs[2], 64);
        _tile_stored(7, cs[3], 64);
    }
}

/* blocks whose B tiles are built at once (32 KiB), then read by every tile of x */
#define AMX_KB 4
#define AMX_TM 256 /* rows of x whose sums wait in acc at once (16 KiB) */

/* Q2_K (q3 = 0) and Q3_K (q3 = 1) in Q4_K's two tiles: values raw (Q2_K's 2 bits, Q3_K's 3 with
 * hm's bit; run v = 4 h + s of the layout, kern/qdot_x8_avx512.c's grp_q23k) by quarters q as
 * Q6_K's (row kr quad kr % 8 of run 2 q + kr / 8, sub-block 4 q + kr / 4), the sub-block's scale
 * sc (Q3_K's int8, less 32; Q2_K's low nibble) as 8 sh + sl, sl = sc & 7 in lo, sh = sc >> 3 (in
 * [-4, 3]) in hi: at most 7 * 7 in magnitude, signed bytes, tdpbssd. S = lo + 8 hi is grp_q23k's
 * sum of sc times the raw values; Q3_K's bias of 4 and Q2_K's mins go as there, through the sums
 * of 16 activations. */
static inline __attribute__((always_inline)) void btiles_q23k(const uint8_t *pa, const uint8_t *pc,
                                                              int q3, amx_q4k_bt *bt)
{
    const __m512i m7 = _mm512_set1_epi32(7), rep = _mm512_set1_epi32(0x01010101);
    const kern__q3kx8 *a3 = (const kern__q3kx8 *)(const void *)pa;
    const kern__q3kx8 *c3 = (const kern__q3kx8 *)(const void *)pc;
    const kern__q2kx8 *a2 = (const kern__q2kx8 *)(const void *)pa;
    const kern__q2kx8 *c2 = (const kern__q2kx8 *)(const void *)pc;
    __m512i hm[8];
    if (q3)
        for (int k = 0; k < 8; k++)
            hm[k] = pair(ld(a3->hm[0][k]), ld(c3->hm[0][k]));
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) {
        int h = v / 4, sv = v % 4, q = v / 2, r = v % 2;
        __m512i sl[2], sh[2];
        __mmask64 neg[2];
        for (int i = 0; i < 2; i++) {
            __m512i sc = scale_q23k(pa, pc, q3, 2 * v + i, 0);
            sl[i] = pairs16(_mm512_and_si512(sc, m7));
            __m512i d = _mm512_srai_epi32(sc, 3);
            sh[i] = pairs16(_mm512_abs_epi32(d));
            neg[i] = _mm512_movepi8_mask(
                _mm512_mullo_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0xff)), rep));
        }
        for (int k = 0; k < 8; k++) {
            __m512i w = bits2(q3 ? pair(ld(a3->qs[h][k]), ld(c3->qs[h][k]))
                                 : pair(ld(a2->qs[h][k]), ld(c2->qs[h][k])),
                              sv);
            if (q3)
                w = _mm512_or_si512(w, bit_to2(hm[k], v));
            int i = k / 4; /* sub-block 2 v + i */
            __m512i hi = _mm512_mullo_epi16(w, sh[i]);
            hi = _mm512_mask_sub_epi8(hi, neg[i], _mm512_setzero_si512(), hi);
            _mm512_store_si512((void *)bt->lo[q][8 * r + k], _mm512_mullo_epi16(w, sl[i]));
            _mm512_store_si512((void *)bt->hi[q][8 * r + k], hi);
        }
    }
}

/* Block b's head for tiles_k (pa, pc: groups a, c): d, the mins' factor dm (-dmin; Q3_K: d) and
 * the int16 pairs p whose bs_sum16 is B, the zmm kernels' (grp_q45k: the mins, grp_q23k: Q3_K's
 * scales for its bias of 4, Q2_K's mins) */
static inline __attribute__((always_inline)) void
head_k(const uint8_t *pa, const uint8_t *pc, uint32_t type, __m512 *d, __m512 *dm, __m512i p[8])
{
    if (type == KERN_GGML_Q4_K || type == KERN_GGML_Q5_K) {
        const kern__q4kx8 *ha = (const kern__q4kx8 *)(const void *)pa; /* the heads */
        const kern__q4kx8 *hc = (const kern__q4kx8 *)(const void *)pc;
        *d = f16x16(ha->d, hc->d);
        *dm = _mm512_xor_ps(f16x16(ha->dmin, hc->dmin), _mm512_set1_ps(-0.0f));
        for (int j = 0; j < 8; j++) /* (min, min) pairs of sub-block j, row r in lane r */
            p[j] = pairs16(u8x16(ha->mn[j], hc->mn[j]));
        return;
    }
    int q3 = type == KERN_GGML_Q3_K;
    const kern__q3kx8 *a3 = (const kern__q3kx8 *)(const void *)pa;
    const kern__q3kx8 *c3 = (const kern__q3kx8 *)(const void *)pc;
    const kern__q2kx8 *a2 = (const kern__q2kx8 *)(const void *)pa;
    const kern__q2kx8 *c2 = (const kern__q2kx8 *)(const void *)pc;
    *d = q3 ? f16x16(a3->d, c3->d) : f16x16(a2->d, c2->d);
    *dm = q3 ? *d : _mm512_xor_ps(f16x16(a2->dmin, c2->dmin), _mm512_set1_ps(-0.0f));
    for (int k = 0; k < 8;
         k++) { /* lane r: Q3_K's (sc[2 k], sc[2 k + 1]) of row r, or Q2_K's mins */
        __m512i lo = scale_q23k(pa, pc, q3, 2 * k, 1), hi = scale_q23k(pa, pc, q3, 2 * k + 1, 1);
        p[k] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                               _mm512_slli_epi32(hi, 16));
    }
}

/* Rows [0, tm) of x (tm a multiple of 16; xq, xrb apart) times blocks [b0, b1) of groups a, c of
 * a K-quant in two tiles (Q2_K .. Q5_K; bb bytes a block), their B tiles in bt, added to acc[t]
 * (row t's 16 outputs) as the zmm kernels add them: S = lo + 8 hi, then B (head_k) folded with
 * dm, or for Q3_K taken off S four times (its bias) */
static void tiles_k(const uint8_t *a, const uint8_t *c, size_t bb, uint32_t type, size_t b0,
                    size_t b1, const amx_q4k_bt *bt, const uint8_t *xq, size_t xrb, size_t tm,
                    float (*acc)[16])
{
    _Alignas(64) int32_t cs[4][16][16];
    int sgn = type == KERN_GGML_Q2_K || type == KERN_GGML_Q3_K, q3 = type == KERN_GGML_Q3_K;
    for (size_t b = b0; b < b1; b++) {
        __m512 d, dm;
        __m512i p[8];
        head_k(a + b * bb, c + b * bb, type, &d, &dm, p);
        size_t xo = b * sizeof(kern__qx256);
        for (size_t t0 = 0; t0 < tm; t0 += 32) {
            int nt = tm - t0 >= 32 ? 2 : 1;
            const uint8_t *x0 = xq + t0 * xrb + xo;
            if (nt == 2)
                block_q4k(bt + (b - b0), x0 + offsetof(kern__qx256, q), xrb, 2, sgn, cs);
            else
                block_q4k(bt + (b - b0), x0 + offsetof(kern__qx256, q), xrb, 1, sgn, cs);
            for (int i = 0; i < nt; i++)
                for (int t = 0; t < 16; t++) {
                    const kern__qx256 *x =
                        (const kern__qx256 *)(const void *)(x0 + (size_t)(16 * i + t) * xrb);
                    __m512 dx = _mm512_set1_ps(x->d);
                    __m512i S = _mm512_add_epi32(
                        _mm512_load_si512((const void *)cs[2 * i][t]),
                        _mm512_slli_epi32(_mm512_load_si512((const void *)cs[2 * i + 1][t]), 3));
                    __m512i B = bs_sum16(p, x);
                    float *o = acc[t0 + 16 * (size_t)i + (size_t)t];
                    __m512 v = _mm512_load_ps(o);
                    if (q3) {
                        v = fold16(v, d, dx, cvt_ps(_mm512_sub_epi32(S, _mm512_slli_epi32(B, 2))));
                    } else {
                        v = fold16(v, d, dx, cvt_ps(S));
                        v = fold16(v, dm, dx, cvt_ps(B));
                    }
                    _mm512_store_ps(o, v);
                }
        }
    }
}

/* A K-quant group's block in the layout (kern/qdot.h) */
static size_t block_bytes_k(uint32_t type)
{
    return type == KERN_GGML_Q6_K   ? sizeof(kern__q6kx8)
           : type == KERN_GGML_Q5_K ? sizeof(kern__q5kx8)
           : type == KERN_GGML_Q3_K ? sizeof(kern__q3kx8)
           : type == KERN_GGML_Q2_K ? sizeof(kern__q2kx8)
                                    : sizeof(kern__q4kx8);
}

/* Rows [0, tm) of x times groups a, c of a K-quant in two tiles (nb blocks), added to acc */
static void pair_k(const uint8_t *a, const uint8_t *c, size_t nb, uint32_t type, const uint8_t *x,
                   size_t xrb, size_t tm, float (*acc)[16])
{
    _Alignas(64) amx_q4k_bt bt[AMX_KB];
    size_t bb = block_bytes_k(type);
    for (size_t b0 = 0; b0 < nb; b0 += AMX_KB) {
        size_t b1 = nb - b0 < AMX_KB ? nb : b0 + AMX_KB;
        for (size_t b = b0; b < b1; b++) { /* each call with constant flags */
            const uint8_t *pa = a + b * bb, *pc = c + b * bb;
            if (type == KERN_GGML_Q5_K)
                btiles_q45k(pa, pc, 1, &bt[b - b0]);
            else if (type == KERN_GGML_Q4_K)
                btiles_q45k(pa, pc, 0, &bt[b - b0]);
            else if (type == KERN_GGML_Q3_K)
                btiles_q23k(pa, pc, 1, &bt[b - b0]);
            else
                btiles_q23k(pa, pc, 0, &bt[b - b0]);
        }
        tiles_k(a, c, bb, type, b0, b1, bt, x, xrb, tm, acc);
    }
}

/* Q6_K: a sub-block's int8 scale sc goes in as d0 + 8 d1 + 64 d2, digits in [-3, 4] (from
 * sc's range [-128, 127]: d2 in [-2, 2]), each times the signed value Q = q - 32 ([-32, 31]: the
 * products within [-128, 128), signed bytes), so tile products by tdpbssd span sub-blocks of
 * different scales and S = C0 + 8 C1 + 64 C2 is the sum of sc_j times sub-block j's sum of Q x:
 * the integer grp_q6k reaches as its sum of q x less 32 times the sums of 16 activations. Tile
 * rows by quarters q (64 values, runs v = 2 q, 2 q + 1 of the layout): row kr quad kr % 8 of run
 * 2 q + kr / 8, of sub-block 4 q + kr / 4. */
typedef struct amx_q6k_bt {
    int8_t dg[3][4][16][64];
} amx_q6k_bt;

/* Q * d for the 64 bytes q (each 0..63) of rows whose digit d (int32 lanes, row r in lane r) is
 * given as |d| word pairs ad, the lanes where d < 0 as the byte mask neg, and 32 d in every byte
 * of the lane as c32: q |d| by vpmullw (at most 252: no carry into the word's high byte), negated
 * where d < 0, less 32 d (in bytes, mod 256: the result is in range) */
static inline __attribute__((always_inline)) __m512i qd_q6k(__m512i q, __m512i ad, __mmask64 neg,
                                                            __m512i c32)
{
    __m512i p = _mm512_mullo_epi16(q, ad);
    p = _mm512_mask_sub_epi8(p, neg, _mm512_setzero_si512(), p);
    return _mm512_sub_epi8(p, c32);
}

static inline __attribute__((always_inline)) void btiles_q6k(const kern__q6kx8 *qa,
                                                             const kern__q6kx8 *qc, amx_q6k_bt *bt)
{
    const __m512i three = _mm512_set1_epi32(3), seven = _mm512_set1_epi32(7);
    const __m512i rep = _mm512_set1_epi32(0x01010101);
    for (int j = 0; j < 16; j++) { /* sub-block j: 4 tile rows of quarter j / 4 */
        __m512i sc = i8x16(qa->sc[j], qc->sc[j]), ad[3], c32[3];
        __mmask64 neg[3];
        for (int i = 0; i < 3; i++) {
            __m512i d = sc;
            if (i < 2) { /* d = ((sc + 3) & 7) - 3, then sc = (sc - d) / 8 exactly */
                d = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(sc, three), seven), three);
                sc = _mm512_srai_epi32(_mm512_sub_epi32(sc, d), 3);
            }
            ad[i] = pairs16(_mm512_abs_epi32(d));
            __m512i db = _mm512_mullo_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0xff)), rep);
            neg[i] = _mm512_movepi8_mask(db);
            c32[i] = _mm512_mullo_epi32(
                _mm512_and_si512(_mm512_slli_epi32(d, 5), _mm512_set1_epi32(0xff)), rep);
        }
        int q = j / 4, v = 2 * q + (j % 4) / 2;
        for (int kk = 0; kk < 4; kk++) {
            int k = 4 * (j % 2) + kk, kr = 8 * ((j % 4) / 2) + k;
            __m512i w = q6k_vals(qa, qc, v, k);
            for (int i = 0; i < 3; i++)
                _mm512_store_si512((void *)bt->dg[i][q][kr], qd_q6k(w, ad[i], neg[i], c32[i]));
        }
    }
}

static void tiles_q6k(const kern__q6kx8 *a, const kern__q6kx8 *c, size_t b0, size_t b1,
                      const amx_q6k_bt *bt, const uint8_t *xq, size_t xrb, size_t tm,
                      float (*acc)[16])
{
    _Alignas(64) int32_t cs[3][16][16];
    for (size_t b = b0; b < b1; b++) {
        __m512 d = f16x16(a[b].d, c[b].d);
        const amx_q6k_bt *bk = bt + (b - b0);
        size_t xo = b * sizeof(kern__qx256);
        for (size_t t0 = 0; t0 < tm; t0 += 16) {
            const uint8_t *x0 = xq + t0 * xrb + xo;
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            for (int q = 0; q < 4; q++) {
                _tile_loadd(0, x0 + offsetof(kern__qx256, q) + 64 * q, xrb);
                _tile_loadd(1, bk->dg[0][q], 64);
                _tile_loadd(2, bk->dg[1][q], 64);
                _tile_loadd(3, bk->dg[2][q], 64);
                _tile_dpbssd(4, 0, 1);
                _tile_dpbssd(5, 0, 2);
                _tile_dpbssd(6, 0, 3);
            }
            _tile_stored(4, cs[0], 64);
            _tile_stored(5, cs[1], 64);
            _tile_stored(6, cs[2], 64);
            for (int t = 0; t < 16; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(x0 + (size_t)t * xrb);
                __m512i S = _mm512_add_epi32(
                    _mm512_load_si512((const void *)cs[0][t]),
                    _mm512_add_epi32(
                        _mm512_slli_epi32(_mm512_load_si512((const void *)cs[1][t]), 3),
                        _mm512_slli_epi32(_mm512_load_si512((const void *)cs[2][t]), 6)));
                float *o = acc[t0 + (size_t)t];
                _mm512_store_ps(o, fold16(_mm512_load_ps(o), d, _mm512_set1_ps(x->d), cvt_ps(S)));
            }
        }
    }
}

static void pair_q6k(const uint8_t *a, const uint8_t *c, size_t nb, const uint8_t *x, size_t xrb,
                     size_t tm, float (*acc)[16])
{
    _Alignas(64) amx_q6k_bt bt[AMX_KB];
    const kern__q6kx8 *qa = (const kern__q6kx8 *)(const void *)a;
    const kern__q6kx8 *qc = (const kern__q6kx8 *)(const void *)c;
    for (size_t b0 = 0; b0 < nb; b0 += AMX_KB) {
        size_t b1 = nb - b0 < AMX_KB ? nb : b0 + AMX_KB;
        for (size_t b = b0; b < b1; b++)
            btiles_q6k(qa + b, qc + b, &bt[b - b0]);
        tiles_q6k(qa, qc, b0, b1, bt, x, xrb, tm, acc);
    }
}

/* The 32-value types (kern__q40x8 .. kern__q80x8: bb bytes a block, m at mo, qh at ho, qs at qo;
 * 0: none): a block's B tile is grp_leg's w[k] as they are, row k quad k (values 4 k .. 4 k + 3):
 * the low nibbles of qs[k] for k < 4, the high ones of qs[k - 4] after, with qh's bit k at bit 4;
 * IQ4_NL's and MXFP4's (lut) the signed levels they look up, Q8_0's (s8) qs[k] whole. Each
 * block's own tile product (its scale is the block's: MXFP4's from its E8M0 byte, e8): tdpbssd
 * for the signed values, tdpbsud for the unsigned ones, then fold_leg16, the VNNI kernels' fold
 * of that sum: the same integers, the same bits. */
#define AMX_LB 32 /* blocks whose B tiles are built at once (16 KiB) */

static inline __attribute__((always_inline)) void btile_leg(const uint8_t *qa, const uint8_t *qc,
                                                            size_t ho, size_t qo, int lut, int s8,
                                                            uint8_t bt[8][64])
{
    __m512i w[8]; /* signed levels: tdpbssd takes them as they are */
    leg_vals(qa, qc, ho, qo, lut, s8, _mm512_broadcast_i32x4(kern__lut_levels(lut, 0)), w);
    for (int k = 0; k < 8; k++)
        _mm512_store_si512((void *)bt[k], w[k]);
}

/* Block b + i's product into C tile T (a literal: the tile intrinsics name registers in their
 * assembly) from x's block (16 rows, xrb apart) in tile XA and its B tile in XB */
#define LEG_MUL(i, XA, XB, T)                                                                      \
    do {                                                                                           \
        _tile_loadd(XA, x0 + 32 * (b + (i)), xrb);                                                 \
        _tile_loadd(XB, bt[b + (i)-b0], 64);                                                       \
        _tile_zero(T);                                                                             \
        if (sgn)                                                                                   \
            _tile_dpbssd(T, XA, XB);                                                               \
        else                                                                                       \
            _tile_dpbsud(T, XA, XB);                                                               \
    } while (0)

static void pair_leg(const uint8_t *a, const uint8_t *c, size_t nb, size_t bb, size_t mo, size_t ho,
                     size_t qo, int bias, int lut, int s8, int e8, const uint8_t *x, size_t xrb,
                     size_t tm, float (*acc)[16])
{
    _Alignas(64) uint8_t bt[AMX_LB][8][64];
    _Alignas(64) int32_t cs[4][16][16];
    int sgn = lut || s8;
    for (size_t b0 = 0; b0 < nb; b0 += AMX_LB) {
        size_t b1 = nb - b0 < AMX_LB ? nb : b0 + AMX_LB;
        for (size_t b = b0; b < b1; b++)
            btile_leg(a + b * bb, c + b * bb, ho, qo, lut, s8, bt[b - b0]);
        for (size_t t0 = 0; t0 < tm; t0 += 16) {
            const uint8_t *xr0 = x + t0 * xrb, *x0 = xr0 + KERN_QX32_Q(nb);
            for (size_t b = b0; b < b1; b += 4) {
                size_t n = b1 - b < 4 ? b1 - b : 4;
                /* tiles 0, 1 and 2, 3 take turns holding x's and w's blocks */
                LEG_MUL(0, 0, 1, 4);
                if (n > 1)
                    LEG_MUL(1, 2, 3, 5);
                if (n > 2)
                    LEG_MUL(2, 0, 1, 6);
                if (n > 3)
                    LEG_MUL(3, 2, 3, 7);
                _tile_stored(4, cs[0], 64);
                if (n > 1)
                    _tile_stored(5, cs[1], 64);
                if (n > 2)
                    _tile_stored(6, cs[2], 64);
                if (n > 3)
                    _tile_stored(7, cs[3], 64);
                __m512 dw[4], dm[4];
                for (size_t i = 0; i < n; i++) {
                    const uint8_t *qa = a + (b + i) * bb, *qc = c + (b + i) * bb;
                    dw[i] = leg_scales16(qa, qc, e8);
                    dm[i] = mo ? f16x16((const uint16_t *)(const void *)(qa + mo),
                                        (const uint16_t *)(const void *)(qc + mo))
                               : _mm512_setzero_ps();
                }
                for (size_t t = 0; t < 16; t++) {
                    __m512 o = _mm512_load_ps(acc[t0 + t]);
                    for (size_t i = 0; i < n; i++)
                        o = fold_leg16(o, _mm512_load_si512((const void *)cs[i][t]), dw[i], dm[i],
                                       bias, mo != 0, xr0 + t * xrb, nb, b + i);
                    _mm512_store_ps(acc[t0 + t], o);
                }
            }
        }
    }
}

int kern__amx_takes(const kern_mat *w)
{
    if (w->type != KERN_QUANT_X8)
        return 0;
#define LEG(id, T, file, mo, ho, nq, gm, gh, bias, lut, s8, e8)                                    \
    if (w->qtype == id)                                                                            \
        return 1;
    KERN_LEG_X8_TYPES(LEG)
#undef LEG
    return w->qtype == KERN_GGML_Q2_K || w->qtype == KERN_GGML_Q3_K || w->qtype == KERN_GGML_Q4_K ||
           w->qtype == KERN_GGML_Q5_K || w->qtype == KERN_GGML_Q6_K;
}

/* Rows t < T16 (a multiple of 16) of x times outputs [n0, n1) of w (kern__amx_takes), as
 * kern__qmatmul_x8_avx512_vnni would give them. */
void kern__qmatmul_x8_amx(const kern_mat *w, const void *xq, size_t T16, float *out, size_t ldo,
                          size_t n0, size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    int leg = fmt == KERN_QX_32;
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), nb = w->n_in / (leg ? 32 : 256);
    int q6 = w->qtype == KERN_GGML_Q6_K;
    size_t bb = block_bytes_k(w->qtype); /* or the 32-value type's, below */
    size_t mo = 0, ho = 0, qo = 0;
    int bias = 0, lut = 0, s8 = 0, e8 = 0;
#define LEG(id, T, file, mo_, ho_, nq, gm, gh, bias_, lut_, s8_, e8_)                              \
    if (w->qtype == id) {                                                                          \
        bb = sizeof(T), mo = gm, ho = gh, qo = offsetof(T, qs);                                    \
        bias = bias_, lut = lut_, s8 = s8_, e8 = e8_;                                              \
    }
    KERN_LEG_X8_TYPES(LEG)
#undef LEG
    size_t gb = nb * bb;
    const uint8_t *q = w->data;
    _Alignas(64) float acc[AMX_TM][16];
    cfg_load(leg);
    for (size_t g = n0 / 8; 8 * g < n1; g += 2) {
        size_t g2 = 8 * (g + 1) < w->n_out ? g + 1 : g;
        size_t c0 = n0 > 8 * g ? n0 - 8 * g : 0, c1 = n1 - 8 * g < 16 ? n1 - 8 * g : 16;
        const uint8_t *a = q + g * gb, *c = q + g2 * gb;
        for (size_t t0 = 0; t0 < T16; t0 += AMX_TM) {
            size_t tm = T16 - t0 < AMX_TM ? T16 - t0 : AMX_TM;
            const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
            memset(acc, 0, tm * sizeof acc[0]);
            if (leg)
                pair_leg(a, c, nb, bb, mo, ho, qo, bias, lut, s8, e8, x, xrb, tm, acc);
            else if (q6)
                pair_q6k(a, c, nb, x, xrb, tm, acc);
            else
                pair_k(a, c, nb, w->qtype, x, xrb, tm, acc);
            for (size_t t = 0; t < tm; t++)
                memcpy(out + (t0 + t) * ldo + 8 * g + c0, acc[t] + c0, (c1 - c0) * sizeof(float));
        }
    }
    _tile_release();
}
