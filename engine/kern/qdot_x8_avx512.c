/* AVX-512 integer products over KERN_QUANT_X8, the interleaved groups of kern/qdot_pack.c, two
 * groups of 8 rows a zmm (group a in the low half, the next one, c, in the high half): the
 * layout's quads are one row a 32-bit lane already, so a block is loads, inserts and masks, with
 * none of the transposes kern/qdot_tiles16.h's 16-row tiles spend their shuffles on. These are
 * kern/qdot_x8_avx2.c's kernels on twice the rows: the same integers, the same float order, the
 * same bits.
 *
 * Built three times (engine/meson.build): for the avx512 table (maddubs, int16 sums), again with
 * VNNI (KERN_QDOT_VNNI: vpdpbusd sums quads in int32, the sub-block scales by vpmulld) chosen per
 * call where the CPU has it, and over simde for the tests (kern/avx512_isa.h). One row of x (a
 * decode step) stays on the ymm kernels (these pairs, streaming two groups far apart, were
 * slower there), except Q4_K and Q5_K with VNNI: one_q45k below reads one group as one stream,
 * a whole 64-byte run a zmm (Q4_K, Zen 5 core: 74 -> 103 Gweights/s in the caches, the same 57
 * streaming; TinyLlama Q4_K_M decode 2 threads +5-10 %. Q5_K, Zen 4 core: 36.5 -> 54.3 in the
 * caches, 25.2 -> 42.2 streaming; Q5_K_M decode +16 %. The same for Q6_K gained 4 % on Zen 5,
 * so it has none), and IQ4_XS: one_iq4xs (Intel Xeon core: 1.20x in the caches; TinyLlama
 * IQ4_XS decode 2 threads 1.12x, where the ymm kernel's one row was compute-bound), and Q2_K
 * and Q3_K: one_q23k (Zen 5 core in the caches: Q3_K 1.36x, Q2_K 1.29x; TinyLlama Q3_K_M decode
 * 2 threads 1.06x, Q2_K 1.10x, both cores streaming Q2_K 1.25x), and the 32-value types: one_leg
 * (Zen 5 core in the caches: Q4_0 1.38x, Q8_0 1.30x, MXFP4 1.26x; streaming MXFP4 1.19x). From
 * two rows on, on one Zen 5 core (5632 x 2048, kvs-bench-qmatmul ... avx512 q8), the ymm kernels
 * ran at about 140 Gweights/s, the transposing 16-row tiles over the file's rows 150-250, these
 * 200-280 (docs/ARCHITECTURE.md, "The integer path"). The 32-value types and IQ4_XS joined the
 * layout later (one Zen 4 core at 16 rows: Q5_0 81 -> 125, IQ4_XS 108 -> 139 Gweights/s against
 * the tiles over the file's rows). With VNNI, a few rows (2 .. 4, Q4_K's and Q5_K's 2) of
 * all types but Q2_K, Q3_K and Q8_0 go to the ymm kernels too (kern/qdot_avx512.c's
 * few_rows_ymm). */
#include "engine/kern/avx512_isa.h"
#include "engine/kern/prefetch.h"
#include "engine/kern/qdot.h"
#include "engine/kern/qdot_x86.h"
#include "engine/kern/qdot_x8_zmm.h"

#include <stddef.h>
#include <string.h>

#ifdef KERN_QDOT_VNNI
#if !defined(__AVX512VNNI__)
#error "KERN_QDOT_VNNI needs -mavx512vnni"
#endif
#define QMATMUL_X8 kern__qmatmul_x8_avx512_vnni
#else
#define QMATMUL_X8 KERN512(kern__qmatmul_x8_avx512)
#endif

/* Into L2 (kern/prefetch.h), block b of the pair of groups a, c (nb blocks of bb bytes each,
 * c the group after a) KERN_PF_AHEAD bytes ahead in each stream: a group is one stream, but the
 * kernels jump about inside a block, which the hardware prefetchers follow too late. Past a
 * group's end the stream goes on in the next pair (two groups on): a plain KERN_PF_AHEAD past a
 * lands in c, which is being read, and past c in the next pair's first group, so the next pair's
 * second group went unfetched (one Zen 5 core, Q4_K 2048 x 2048 at 16 rows: 181 Gweights/s in
 * the caches, 133 streaming). */
INLINE void prefetch2(const uint8_t *a, const uint8_t *c, size_t b, size_t bb, size_t nb)
{
    size_t o = b * bb + KERN_PF_AHEAD;
    if (o >= nb * bb)
        o += nb * bb;
    kern_prefetch_l2(a + o, bb);
    kern_prefetch_l2(c + o, bb);
}

/* 32 bytes at offset off of both groups' blocks */
INLINE __m512i ld2(const uint8_t *a, const uint8_t *c, size_t off)
{
    return pair(ld(a + off), ld(c + off));
}

#ifdef KERN_QDOT_VNNI
/* sum over k < n of the quads w[k] . x[4k .. 4k + 3], from zero. Eight quads go in two chains
 * (k even, k odd) added at the end: an integer sum, so the same value, and half the latency of
 * the one chain per activation row (Q4_0, Q8_0, Q4_K, Q5_K, IQ4_XS at 64 rows on an Intel Xeon
 * core, kvs-bench-qmatmul: 1.10-1.14x; four chains no faster; four quads, Q3_K's, stay one). */
INLINE __m512i dot16(__m512i s0, const __m512i *w, const int8_t *x, int n)
{
    __m512i s = _mm512_dpbusd_epi32(s0, w[0], bcast4(x));
    if (n < 8) {
        for (int k = 1; k < n; k++)
            s = _mm512_dpbusd_epi32(s, w[k], bcast4(x + 4 * k));
        return s;
    }
    __m512i u = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(x + 4));
    for (int k = 2; k < n; k += 2) {
        s = _mm512_dpbusd_epi32(s, w[k], bcast4(x + 4 * k));
        u = _mm512_dpbusd_epi32(u, w[k + 1], bcast4(x + 4 * k + 4));
    }
    return _mm512_add_epi32(s, u);
}
#endif

#ifdef KERN_QDOT_VNNI
/* A Q4_K or Q5_K block's M, the sum over sub-blocks j of min j times the sum of its 32
 * activations: those sums (bs[2 j] + bs[2 j + 1], |.| <= 32 * 127) as int16 pairs (j = 2 k,
 * 2 k + 1) broadcast against mi[k], the rows' pairs of mins, by vpdpwssd: 4 of them where
 * bs_sum16 takes 8 vpmaddwd and 8 adds. Exact int32 sums, so the same M. One Zen 5 core, Q4_K
 * at 16 rows: 1.025x (the mins took about a tenth of the kernel's time). */
INLINE __m512i mins32(const __m512i mi[4], const kern__qx256 *x)
{
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)x->bs);
    __m256i s = _mm256_madd_epi16(b, _mm256_set1_epi16(1)); /* int32 sums of sub-block j */
    /* int16: s0..s3 s0..s3 in the low 128 bits, s4..s7 s4..s7 in the high */
    __m512i p = _mm512_castsi256_si512(_mm256_packs_epi32(s, s));
    __m512i B = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mi[0],
                                    _mm512_permutexvar_epi32(_mm512_set1_epi32(0), p));
    B = _mm512_dpwssd_epi32(B, mi[1], _mm512_permutexvar_epi32(_mm512_set1_epi32(1), p));
    B = _mm512_dpwssd_epi32(B, mi[2], _mm512_permutexvar_epi32(_mm512_set1_epi32(4), p));
    return _mm512_dpwssd_epi32(B, mi[3], _mm512_permutexvar_epi32(_mm512_set1_epi32(5), p));
}
#endif

/* The sum over k < 8 of signed values w[k] (two groups' rows, lane r) times the activation quads
 * at xs: with VNNI w holds the values plus 128 (unsigned) and the caller takes 128 sx off;
 * otherwise w holds |w| and neg[k] where w < 0, and x is negated there (AVX-512 has no vpsignb: a
 * masked subtraction from 0, exact as |x| <= 127), each maddubs widened by its own madd (|2 * 128
 * * 127| leaves no room to add two in int16). Exact int32 sums either way. */
INLINE __m512i sdot16(const __m512i w[8], const __mmask64 neg[8], const int8_t *xs)
{
#ifdef KERN_QDOT_VNNI
    (void)neg;
    return dot16(_mm512_setzero_si512(), w, xs, 8);
#else
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++) {
        __m512i xb = bcast4(xs + 4 * k);
        xb = _mm512_mask_sub_epi8(xb, neg[k], _mm512_setzero_si512(), xb);
        s = _mm512_add_epi32(s, madd16(_mm512_maddubs_epi16(w[k], xb), _mm512_set1_epi16(1)));
    }
    return s;
#endif
}

/* The levels of table lut (the IQ4 types', or MXFP4's) for sdot16 (plus 128 with VNNI, signed
 * otherwise), and w[k] made its operand: without VNNI |w| with neg[k] where w < 0 */
INLINE __m512i lut_levels16(int lut)
{
#ifdef KERN_QDOT_VNNI
    return _mm512_broadcast_i32x4(kern__lut_levels(lut, 1));
#else
    return _mm512_broadcast_i32x4(kern__lut_levels(lut, 0));
#endif
}

INLINE __m512i iq4_levels16(void)
{
    return lut_levels16(KERN_LUT_IQ4);
}

INLINE void signs16(__m512i w[8], __mmask64 neg[8])
{
#ifdef KERN_QDOT_VNNI
    (void)w;
    (void)neg;
#else
    for (int k = 0; k < 8; k++) {
        neg[k] = _mm512_movepi8_mask(w[k]);
        w[k] = _mm512_abs_epi8(w[k]);
    }
#endif
}

/* IQ4_XS (kern__iq4xsx8): sub-block j of both groups as a Q4_0 block, its nibbles' levels by one
 * vpshufb, sdot16's exact sum (less 128 times its 32 activations' sum with VNNI) times the
 * sub-block's scales (vpmulld), added in int32; the block's S folded as (d_w d_x) S. */
INLINE void grp_iq4xs(const kern__iq4xsx8 *a, const kern__iq4xsx8 *c, size_t nb, const uint8_t *xq,
                      size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), levels = iq4_levels16();
    for (size_t b = 0; b < nb; b++) {
        prefetch2((const uint8_t *)a, (const uint8_t *)c, b, sizeof *a, nb);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
            __mmask64 neg[8];
            for (int k = 0; k < 4; k++) {
                __m512i v = pair(ld(a[b].qs[j][k]), ld(c[b].qs[j][k]));
                w[k] = _mm512_shuffle_epi8(levels, _mm512_and_si512(v, m4));
                w[4 + k] =
                    _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            }
            signs16(w, neg);
            __m512i sc = i8x16(a[b].sc[j], c[b].sc[j]);
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                __m512i s = sdot16(w, neg, x->q + 32 * j);
#ifdef KERN_QDOT_VNNI
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * (x->bs[2 * j] + x->bs[2 * j + 1])));
#endif
                si[t] = _mm512_add_epi32(si[t], _mm512_mullo_epi32(s, sc));
            }
        }
        __m512 dw = f16x16(a[b].d, c[b].d);
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            acc[t] = fold16(acc[t], dw, _mm512_set1_ps(x->d), cvt_ps(si[t]));
        }
    }
}

/* Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and Q8_0 (kern__q40x8 .. kern__q80x8: bb bytes a block of
 * the group, m at mo, qh at ho, qs at qo; 0: none; the rows' scales f16, or MXFP4's E8M0 bytes
 * (e8)): w[0 .. 4) the low nibbles of qs[k] (values 4 k .. 4 k + 3 of each row), w[4 .. 8) the
 * high ones (values 16 + 4 k ..), bit k of qh above w[k]'s nibbles; IQ4_NL's and MXFP4's (lut)
 * the levels the nibbles look up, Q8_0's (s8) qs[k] whole. The int16 form
 * sums 8 maddubs of 4-bit values (4 of 5-bit ones) and one madd by ones; signed values |w| against
 * x negated where w < 0 (AVX-512 has no vpsignb: a masked subtraction from 0, exact as |x| <=
 * 127), each maddubs madd'ed alone. With VNNI 8 vpdpbusd, the signed values plus 128 (IQ4_NL's
 * levels so looked up, Q8_0's w ^ 0x80) with 128 sx taken off after. S = that - bias sx (Q = raw
 * - bias, through the block's activation sum), folded as (d_w d_x) S, then for a min (m d_x) sx.
 *
 * leg_blk: block b of both groups so unpacked: its values (w, neg: sdot16's operands), d_w and,
 * for a min, m (dm). */
typedef struct leg_blk {
    __m512i w[8];
    __mmask64 neg[8];
    __m512 dw, dm;
} leg_blk;

INLINE void leg_load(const uint8_t *a, const uint8_t *c, size_t b, size_t nb, size_t bb, size_t mo,
                     size_t ho, size_t qo, int lut, int s8, int e8, __m512i levels, leg_blk *k)
{
    const uint8_t *qa = a + b * bb, *qc = c + b * bb;
    prefetch2(a, c, b, bb, nb);
    leg_vals(qa, qc, ho, qo, lut, s8, levels, k->w);
#ifdef KERN_QDOT_VNNI
    if (s8) /* plus 128: vpdpbusd's unsigned operand */
        for (int i = 0; i < 8; i++)
            k->w[i] = _mm512_xor_si512(k->w[i], _mm512_set1_epi8((char)0x80));
#endif
    if (lut || s8)
        signs16(k->w, k->neg);
    k->dw = leg_scales16(qa, qc, e8);
    k->dm = mo ? f16x16((const uint16_t *)(const void *)(qa + mo),
                        (const uint16_t *)(const void *)(qc + mo))
               : _mm512_setzero_ps();
}

/* acc plus activation row xr's block b times k. With VNNI the chain starts from -bias sx: the
 * same exact S, without a subtraction after it. */
INLINE __m512 leg_fold(__m512 acc, const leg_blk *k, const uint8_t *xr, size_t nb, size_t b,
                       int bias, int lut, int s8, size_t ho, int mo)
{
    const int8_t *xs = (const int8_t *)(const void *)(xr + KERN_QX32_Q(nb) + 32 * b);
#ifdef KERN_QDOT_VNNI
    (void)lut;
    (void)s8;
    (void)ho;
    int16_t sx;
    memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
    __m512i S = dot16(_mm512_set1_epi32(-bias * sx), k->w, xs, 8);
    return fold_leg16(acc, S, k->dw, k->dm, 0, mo, xr, nb, b);
#else
    const __m512i one = _mm512_set1_epi16(1);
    __m512i S;
    if (lut || s8) {
        S = sdot16(k->w, k->neg, xs);
    } else if (ho) {
        S = _mm512_add_epi32(madd16(mul16(k->w, xs, 4), one),
                             madd16(mul16(k->w + 4, xs + 16, 4), one));
    } else {
        S = madd16(mul16(k->w, xs, 8), one);
    }
    return fold_leg16(acc, S, k->dw, k->dm, bias, mo, xr, nb, b);
#endif
}

/* Two blocks a pass over the activation rows: each row's accumulator is loaded and stored once
 * per pair of blocks and folded in block order (the same float order, the same bits). A block a
 * pass spent about a cycle of its ~6 on that load, its store and the bias's subtraction; with
 * both, one Zen 5 core, Q4_0 at 16 rows: 281 -> 302 Gweights/s in the caches (1.07x; Q5_0 and
 * IQ4_NL 1.07x, Q8_0 1.06x, Q4_1 1.00x), 1.06x streaming; TinyLlama Q4_0 decode of 16 sequences
 * 1.065x, prefill 1.09x. Three or four blocks a pass: 0.93x, 0.79x (their values spill). */
INLINE void grp_leg(const uint8_t *a, const uint8_t *c, size_t nb, size_t bb, size_t mo, size_t ho,
                    size_t qo, int bias, int lut, int s8, int e8, const uint8_t *xq, size_t xrb,
                    size_t tt, __m512 *acc)
{
    const __m512i levels = lut_levels16(lut);
#ifdef KERN_QDOT_VNNI
    bias += lut || s8 ? 128 : 0;
#endif
    size_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        leg_blk k0, k1;
        leg_load(a, c, b, nb, bb, mo, ho, qo, lut, s8, e8, levels, &k0);
        leg_load(a, c, b + 1, nb, bb, mo, ho, qo, lut, s8, e8, levels, &k1);
        for (size_t t = 0; t < tt; t++) {
            const uint8_t *xr = xq + t * xrb;
            __m512 s = leg_fold(acc[t], &k0, xr, nb, b, bias, lut, s8, ho, mo != 0);
            acc[t] = leg_fold(s, &k1, xr, nb, b + 1, bias, lut, s8, ho, mo != 0);
        }
    }
    if (b < nb) {
        leg_blk k0;
        leg_load(a, c, b, nb, bb, mo, ho, qo, lut, s8, e8, levels, &k0);
        for (size_t t = 0; t < tt; t++)
            acc[t] = leg_fold(acc[t], &k0, xq + t * xrb, nb, b, bias, lut, s8, ho, mo != 0);
    }
}

/* Q4_K and Q5_K (kern__q4kx8, kern__q5kx8: alike up to qh): per sub-block j, w[k] the low or high
 * nibbles of qs[j / 2][k] (for Q5_K bit j of qh[0][k] above them), the scales and mins 8 bytes a
 * group. The int16 form sums 8 maddubs of 4-bit values (4 of 5-bit ones) and one madd with
 * (scale, scale) pairs; with VNNI vpdpbusd sums the quads and vpmulld scales them (|32 * 31 *
 * 127 * 63| < 2^31). Then the block's fold: (d d_x) S, then (-dmin d_x) M, M the mins through the
 * sums of 16 activations. */
INLINE void grp_q45k(const uint8_t *a, const uint8_t *c, size_t nb, int q5, const uint8_t *xq,
                     size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    size_t bb = q5 ? sizeof(kern__q5kx8) : sizeof(kern__q4kx8);
    size_t qs = q5 ? offsetof(kern__q5kx8, qs) : offsetof(kern__q4kx8, qs);
    size_t qh = offsetof(kern__q5kx8, qh);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pa = a + b * bb, *pc = c + b * bb;
        const kern__q4kx8 *ha = (const kern__q4kx8 *)(const void *)pa; /* the heads */
        const kern__q4kx8 *hc = (const kern__q4kx8 *)(const void *)pc;
        prefetch2(a, c, b, bb, nb);
        __m512 d = f16x16(ha->d, hc->d);
        __m512 dm = _mm512_xor_ps(f16x16(ha->dmin, hc->dmin), _mm512_set1_ps(-0.0f));
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w[8];
            for (int k = 0; k < 8; k++) {
                __m512i v = ld2(pa, pc, qs + 256 * (j / 2) + 32 * k);
                w[k] = _mm512_and_si512(j % 2 ? _mm512_srli_epi16(v, 4) : v, m4);
                if (q5) /* bit j of each byte to bit 4 (what crosses bytes is masked) */
                    w[k] = _mm512_or_si512(
                        w[k], _mm512_and_si512(bit_to4(ld2(pa, pc, qh + 32 * k), j), m10));
            }
            __m512i sc = u8x16(ha->sc[j], hc->sc[j]);
#ifndef KERN_QDOT_VNNI
            sc = pairs16(sc);
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * j;
#ifdef KERN_QDOT_VNNI
                si[t] = _mm512_add_epi32(
                    si[t], _mm512_mullo_epi32(dot16(_mm512_setzero_si512(), w, xs, 8), sc));
#else
                __m512i v = q5 ? _mm512_add_epi32(madd16(mul16(w, xs, 4), sc),
                                                  madd16(mul16(w + 4, xs + 16, 4), sc))
                               : madd16(mul16(w, xs, 8), sc);
                si[t] = _mm512_add_epi32(si[t], v);
#endif
            }
        }
#ifdef KERN_QDOT_VNNI
        __m512i mi[4]; /* (min 2 k, min 2 k + 1) pairs, row r in lane r */
        for (int k = 0; k < 4; k++)
            mi[k] =
                _mm512_or_si512(u8x16(ha->mn[2 * k], hc->mn[2 * k]),
                                _mm512_slli_epi32(u8x16(ha->mn[2 * k + 1], hc->mn[2 * k + 1]), 16));
#else
        __m512i mi[8]; /* (min, min) pairs of sub-block j, row r in lane r */
        for (int j = 0; j < 8; j++)
            mi[j] = pairs16(u8x16(ha->mn[j], hc->mn[j]));
#endif
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512 dx = _mm512_set1_ps(x->d);
            __m512 s1 = fold16(acc[t], d, dx, cvt_ps(si[t]));
#ifdef KERN_QDOT_VNNI
            acc[t] = fold16(s1, dm, dx, cvt_ps(mins32(mi, x)));
#else
            acc[t] = fold16(s1, dm, dx, cvt_ps(bs_sum16(mi, x)));
#endif
        }
    }
}

/* kern/qdot_x8_avx2.c's sub_pair on two groups: the scaled sums of two 16-value sub-blocks,
 * w[0..4) times s0 and w[4..8) times s1, n maddubs (2 or 4) a madd without VNNI */
INLINE __m512i sub_pair(const __m512i w[8], const int8_t *xs, __m512i s0, __m512i s1, int n)
{
#ifdef KERN_QDOT_VNNI
    (void)n;
    return _mm512_add_epi32(
        _mm512_mullo_epi32(dot16(_mm512_setzero_si512(), w, xs, 4), s0),
        _mm512_mullo_epi32(dot16(_mm512_setzero_si512(), w + 4, xs + 16, 4), s1));
#else
    __m512i u = madd16(mul16(w, xs, n), s0), z = madd16(mul16(w + 4, xs + 16, n), s1);
    if (n == 2) {
        u = _mm512_add_epi32(u, madd16(mul16(w + 2, xs + 8, 2), s0));
        z = _mm512_add_epi32(z, madd16(mul16(w + 6, xs + 24, 2), s1));
    }
    return _mm512_add_epi32(u, z);
#endif
}

/* Q2_K (q3 = 0) and Q3_K (q3 = 1), kern/qdot_x8_avx2.c's grp_q23kx8 on two groups: values 128 h +
 * 32 s + l (v = 4 h + s) are bits 2 s of qs[h], for Q3_K bit v of hm[0] at bit 2 above them;
 * w[0..4) sub-block 2 v, w[4..8) the next. The int16 form adds 4 maddubs of values below 8 before
 * each madd; with VNNI vpdpbusd and vpmulld. Q3_K: the bias of 4 through the sums of 16
 * activations; Q2_K: scales and mins the nibbles of sc[j], the mins' M folded with -dmin. */
INLINE void grp_q23k(const uint8_t *a, const uint8_t *c, size_t nb, int q3, const uint8_t *xq,
                     size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    size_t bb = q3 ? sizeof(kern__q3kx8) : sizeof(kern__q2kx8);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pa = a + b * bb, *pc = c + b * bb;
        const kern__q3kx8 *a3 = (const kern__q3kx8 *)(const void *)pa;
        const kern__q3kx8 *c3 = (const kern__q3kx8 *)(const void *)pc;
        const kern__q2kx8 *a2 = (const kern__q2kx8 *)(const void *)pa;
        const kern__q2kx8 *c2 = (const kern__q2kx8 *)(const void *)pc;
        prefetch2(a, c, b, bb, nb);
        __m512 d = q3 ? f16x16(a3->d, c3->d) : f16x16(a2->d, c2->d);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            int h = v / 4, sv = v % 4;
            __m512i w[8];
            for (int k = 0; k < 8; k++) {
                __m512i l = q3 ? pair(ld(a3->qs[h][k]), ld(c3->qs[h][k]))
                               : pair(ld(a2->qs[h][k]), ld(c2->qs[h][k]));
                w[k] = bits2(l, sv);
                if (q3)
                    w[k] =
                        _mm512_or_si512(w[k], bit_to2(pair(ld(a3->hm[0][k]), ld(c3->hm[0][k])), v));
            }
            __m512i s0 = scale_q23k(pa, pc, q3, 2 * v, 0);
            __m512i s1 = scale_q23k(pa, pc, q3, 2 * v + 1, 0);
#ifndef KERN_QDOT_VNNI
            s0 = pairs16(s0);
            s1 = pairs16(s1);
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] = _mm512_add_epi32(si[t], sub_pair(w, xs, s0, s1, 4));
            }
        }
        __m512i pr[8]; /* lane r: Q3_K's (sc[2 k], sc[2 k + 1]) of row r, or Q2_K's mins */
        for (int k = 0; k < 8; k++) {
            __m512i lo = scale_q23k(pa, pc, q3, 2 * k, 1);
            __m512i hi = scale_q23k(pa, pc, q3, 2 * k + 1, 1);
            pr[k] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                                    _mm512_slli_epi32(hi, 16));
        }
        __m512 dm = q3 ? d : _mm512_xor_ps(f16x16(a2->dmin, c2->dmin), _mm512_set1_ps(-0.0f));
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512 dx = _mm512_set1_ps(x->d);
            __m512i B = bs_sum16(pr, x);
            if (q3) {
                acc[t] =
                    fold16(acc[t], d, dx, cvt_ps(_mm512_sub_epi32(si[t], _mm512_slli_epi32(B, 2))));
            } else {
                acc[t] = fold16(acc[t], d, dx, cvt_ps(si[t]));
                acc[t] = fold16(acc[t], dm, dx, cvt_ps(B));
            }
        }
    }
}

/* Q6_K (kern__q6kx8): values 128 h + 32 s + l of a block are the low (s < 2) or high nibble of
 * ql[2 h + s % 2], bits 2 s, 2 s + 1 of qh[h] above them; w[0..4) sub-block 8 h + 2 s, w[4..8) the
 * next. The int16 form adds 2 maddubs (|2 * 2 * 63 * 127| < 2^15) before each madd; with VNNI
 * vpdpbusd sums a sub-block's 4 quads and vpmulld scales them. Q = raw - 32, the 32 taken off
 * through the sums of 16 activations. */
INLINE void grp_q6k(const kern__q6kx8 *a, const kern__q6kx8 *c, size_t nb, const uint8_t *xq,
                    size_t xrb, size_t tt, __m512 *acc, __m512i *si)
{
    for (size_t b = 0; b < nb; b++) {
        const kern__q6kx8 *qa = a + b, *qc = c + b;
        prefetch2((const uint8_t *)a, (const uint8_t *)c, b, sizeof *a, nb);
        __m512 d = f16x16(qa->d, qc->d);
        for (size_t t = 0; t < tt; t++)
            si[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            __m512i w[8];
            for (int k = 0; k < 8; k++)
                w[k] = q6k_vals(qa, qc, v, k);
            __m512i s0 = i8x16(qa->sc[2 * v], qc->sc[2 * v]);
            __m512i s1 = i8x16(qa->sc[2 * v + 1], qc->sc[2 * v + 1]);
#ifndef KERN_QDOT_VNNI
            s0 = pairs16(s0);
            s1 = pairs16(s1);
#endif
            for (size_t t = 0; t < tt; t++) {
                const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
                const int8_t *xs = x->q + 32 * v;
                si[t] = _mm512_add_epi32(si[t], sub_pair(w, xs, s0, s1, 2));
            }
        }
        __m512i pr[8]; /* lane r: (sc[2 k], sc[2 k + 1]) of row r, for the bias through bs */
        for (int k = 0; k < 8; k++) {
            __m512i lo = i8x16(qa->sc[2 * k], qc->sc[2 * k]);
            __m512i hi = i8x16(qa->sc[2 * k + 1], qc->sc[2 * k + 1]);
            pr[k] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                                    _mm512_slli_epi32(hi, 16));
        }
        for (size_t t = 0; t < tt; t++) {
            const kern__qx256 *x = (const kern__qx256 *)(const void *)(xq + t * xrb) + b;
            __m512i S = _mm512_sub_epi32(si[t], _mm512_slli_epi32(bs_sum16(pr, x), 5));
            acc[t] = fold16(acc[t], d, _mm512_set1_ps(x->d), cvt_ps(S));
        }
    }
}

#ifdef KERN_QDOT_VNNI
/* 8 activation bytes at p: the quad at p in lanes 0..7, the one at p + 4 in lanes 8..15 */
INLINE __m512i quads2(const int8_t *p)
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(
        idx, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

/* One activation row of Q4_K or Q5_K (a decode step), one group at a time as it lies: the 64
 * bytes qs[c][2 kp], qs[c][2 kp + 1] are one zmm, quad 2 kp of the 8 rows in lanes 0..7 and quad
 * 2 kp + 1 in lanes 8..15; their low nibbles meet sub-block 2 c's activations, the high ones
 * sub-block 2 c + 1's, by vpdpbusd, scaled by vpmulld in both halves. For Q5_K, qh[0][2 kp],
 * qh[0][2 kp + 1] lie the same way, a zmm each loaded once a block: bit j of each byte, moved to
 * bit 4, is sub-block j's fifth bit (one vpternlogd puts it above the nibble). The halves' int32
 * sums are added at the block's end (integers: exact in any order), which leaves each row's S of
 * the ymm kernel, folded as there: the same bits, one stream, half the instructions. */
INLINE void one_q45k(const uint8_t *g, size_t nb, int q5, const kern__qx256 *x, __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    size_t bb = q5 ? sizeof(kern__q5kx8) : sizeof(kern__q4kx8);
    size_t qs = q5 ? offsetof(kern__q5kx8, qs) : offsetof(kern__q4kx8, qs);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * bb;
        const kern__q4kx8 *q = (const kern__q4kx8 *)(const void *)p; /* the head */
        kern_prefetch_l2(p + KERN_PF_AHEAD, bb);
        __m512i h[4];
        if (q5)
            for (int kp = 0; kp < 4; kp++)
                h[kp] = _mm512_loadu_si512((const void *)(p + offsetof(kern__q5kx8, qh) + 64 * kp));
        __m512i si = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i slo = _mm512_setzero_si512(), shi = _mm512_setzero_si512();
            for (int kp = 0; kp < 4; kp++) {
                __m512i v = _mm512_loadu_si512((const void *)(p + qs + 256 * c + 64 * kp));
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) { /* lo | bit 2 c at bit 4, hi | bit 2 c + 1's: 0xf8 = a | b & c */
                    lo = _mm512_ternarylogic_epi32(lo, bit_to4(h[kp], 2 * c), m10, 0xf8);
                    hi = _mm512_ternarylogic_epi32(hi, bit_to4(h[kp], 2 * c + 1), m10, 0xf8);
                }
                slo = _mm512_dpbusd_epi32(slo, lo, quads2(x[b].q + 64 * c + 8 * kp));
                shi = _mm512_dpbusd_epi32(shi, hi, quads2(x[b].q + 64 * c + 32 + 8 * kp));
            }
            __m256i s0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q->sc[2 * c]));
            __m256i s1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q->sc[2 * c + 1]));
            si = _mm512_add_epi32(si, _mm512_add_epi32(_mm512_mullo_epi32(slo, pair(s0, s0)),
                                                       _mm512_mullo_epi32(shi, pair(s1, s1))));
        }
        __m256i S = _mm256_add_epi32(_mm512_castsi512_si256(si), _mm512_extracti64x4_epi64(si, 1));
        __m256i B = _mm256_setzero_si256(); /* the mins through the sums of 16 activations */
        for (int j = 0; j < 8; j++) {
            __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q->mn[j]));
            int32_t bs;
            memcpy(&bs, &x[b].bs[2 * j], 4);
            B = _mm256_add_epi32(B, _mm256_madd_epi16(_mm256_or_si256(m, _mm256_slli_epi32(m, 16)),
                                                      _mm256_set1_epi32(bs)));
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->d));
        __m256 dm =
            _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->dmin)),
                          _mm256_set1_ps(-0.0f));
        __m256 dx = _mm256_set1_ps(x[b].d);
        __m256 a = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(S)));
        *acc = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(B)));
    }
}

/* One activation row of IQ4_XS, one group as it lies, as one_q45k: the 64 bytes qs[j][2 kp],
 * qs[j][2 kp + 1] are one zmm (quad 2 kp of the 8 rows in lanes 0..7, quad 2 kp + 1 in lanes
 * 8..15), whose nibbles look up the levels plus 128 by one vpshufb each and meet sub-block j's
 * activations by vpdpbusd. The 128 s_x taken off (the activations' sum over the sub-block) starts
 * the low half's sum; each half is scaled by vpmulld, and the halves are added at the block's
 * end: each row's S of grp_iq4xsx8 (integers, exact in any order), folded as there. Half the
 * instructions of the ymm kernel, whose one row waited on each sub-block's chain. */
INLINE void one_iq4xs(const kern__iq4xsx8 *g, size_t nb, const kern__qx256 *x, __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), levels = iq4_levels16();
    for (size_t b = 0; b < nb; b++) {
        const kern__iq4xsx8 *q = g + b;
        kern_prefetch_l2((const uint8_t *)q + KERN_PF_AHEAD, sizeof *q);
        __m512i si = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            int32_t sx = x[b].bs[2 * j] + x[b].bs[2 * j + 1];
            __m512i slo = _mm512_maskz_set1_epi32(0x00ff, -128 * sx), shi = _mm512_setzero_si512();
            for (int kp = 0; kp < 2; kp++) {
                __m512i v = _mm512_loadu_si512((const void *)q->qs[j][2 * kp]);
                __m512i lo = _mm512_shuffle_epi8(levels, _mm512_and_si512(v, m4));
                __m512i hi =
                    _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                slo = _mm512_dpbusd_epi32(slo, lo, quads2(x[b].q + 32 * j + 8 * kp));
                shi = _mm512_dpbusd_epi32(shi, hi, quads2(x[b].q + 32 * j + 16 + 8 * kp));
            }
            __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q->sc[j]));
            si = _mm512_add_epi32(si, _mm512_mullo_epi32(_mm512_add_epi32(slo, shi), pair(sc, sc)));
        }
        __m256i S = _mm256_add_epi32(_mm512_castsi512_si256(si), _mm512_extracti64x4_epi64(si, 1));
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q->d));
        *acc = _mm256_add_ps(
            *acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(x[b].d)), _mm256_cvtepi32_ps(S)));
    }
}

/* Bit v of each byte of h at bit 2, the other bits as they fall (the caller masks): constant
 * shifts, as bit_to4 */
INLINE __m512i bit_at2(__m512i h, int v)
{
    switch (v) {
    case 0: return _mm512_slli_epi16(h, 2);
    case 1: return _mm512_slli_epi16(h, 1);
    case 2: return h;
    case 3: return _mm512_srli_epi16(h, 1);
    case 4: return _mm512_srli_epi16(h, 2);
    case 5: return _mm512_srli_epi16(h, 3);
    case 6: return _mm512_srli_epi16(h, 4);
    default: return _mm512_srli_epi16(h, 5);
    }
}

/* Sub-blocks 2 v and 2 v + 1's scales (mn = 0) or Q2_K's mins (mn = 1) of one group's 8 rows as
 * int16 pairs, (sc[2 v][r], sc[2 v + 1][r]) in int32 lanes r and 8 + r: vpdpwssd's operand */
INLINE __m512i pairs_q23k(const uint8_t *p, int q3, int v, int mn)
{
    const __m256i ilv = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8,
                                         1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    size_t o = (q3 ? offsetof(kern__q3kx8, sc) : offsetof(kern__q2kx8, sc)) + 16 * (size_t)v;
    __m256i t = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p + o))), ilv);
    if (q3)
        return _mm512_cvtepi8_epi16(t);
    if (mn)
        t = _mm256_srli_epi16(t, 4);
    return _mm512_cvtepu8_epi16(_mm256_and_si256(t, _mm256_set1_epi8(0x0f)));
}

/* One activation row of Q2_K (q3 = 0) or Q3_K (q3 = 1), one group as it lies, as one_q45k: the
 * 64 bytes qs[h][2 kp], qs[h][2 kp + 1] are one zmm (quad 2 kp of the 8 rows in lanes 0..7, quad
 * 2 kp + 1 in lanes 8..15); bits 2 s of them are run v = 4 h + s's values (for Q3_K bit v of
 * hm[0][2 kp], hm[0][2 kp + 1], loaded once a block, above them at bit 2), kp 0, 1 sub-block 2 v
 * and kp 2, 3 sub-block 2 v + 1. The two sub-blocks' vpdpbusd sums (8 products a lane, |.| <=
 * 8 * 7 * 128 < 2^15) are packed as int16 pairs and scaled by one vpdpwssd with the pairs of
 * their scales; the halves are added at the block's end: each row's S of grp_q23kx8 (integers,
 * exact in any order), then its bias or mins and its folds as there: the same bits, in
 * a third of the ymm kernel's vector instructions, whose one row was compute-bound (one Zen 5
 * core in the caches: Q3_K 54, Q2_K 79 Gweights/s, against 106 for Q4_K's one_q45k). */
INLINE void one_q23k(const uint8_t *g, size_t nb, int q3, const kern__qx256 *x, __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(4);
    size_t bb = q3 ? sizeof(kern__q3kx8) : sizeof(kern__q2kx8);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = g + b * bb;
        const kern__q3kx8 *q3p = (const kern__q3kx8 *)(const void *)p;
        const kern__q2kx8 *q2p = (const kern__q2kx8 *)(const void *)p;
        const uint8_t(*qs)[8][32] = q3 ? q3p->qs : q2p->qs;
        kern_prefetch_l2(p + KERN_PF_AHEAD, bb);
        __m512i hm[4];
        if (q3)
            for (int kp = 0; kp < 4; kp++)
                hm[kp] = _mm512_loadu_si512((const void *)q3p->hm[0][2 * kp]);
        __m512i si = _mm512_setzero_si512();
        __m256i B = _mm256_setzero_si256(); /* Q3_K's bias or Q2_K's mins, through bs[] */
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            int h = v / 4, s = v % 4;
            __m512i sum[2];
            for (int u = 0; u < 2; u++) { /* sub-block 2 v + u: quads 4 u .. 4 u + 3 */
                sum[u] = _mm512_setzero_si512();
                for (int kp = 2 * u; kp < 2 * u + 2; kp++) {
                    __m512i wv = bits2(_mm512_loadu_si512((const void *)qs[h][2 * kp]), s);
                    if (q3) /* wv | bit v at bit 2: 0xf8 = a | b & c */
                        wv = _mm512_ternarylogic_epi32(wv, bit_at2(hm[kp], v), m4, 0xf8);
                    sum[u] = _mm512_dpbusd_epi32(sum[u], wv, quads2(x[b].q + 32 * v + 8 * kp));
                }
            }
            __m512i sc = pairs_q23k(p, q3, v, 0);
            si = _mm512_dpwssd_epi32(
                si, _mm512_mask_blend_epi16(0xaaaaaaaa, sum[0], _mm512_slli_epi32(sum[1], 16)), sc);
            int32_t bs;
            memcpy(&bs, &x[b].bs[2 * v], 4);
            __m256i pr = _mm512_castsi512_si256(q3 ? sc : pairs_q23k(p, q3, v, 1));
            B = _mm256_add_epi32(B, _mm256_madd_epi16(pr, _mm256_set1_epi32(bs)));
        }
        __m256i S = _mm256_add_epi32(_mm512_castsi512_si256(si), _mm512_extracti64x4_epi64(si, 1));
        __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(q3 ? q3p->d : q2p->d)));
        __m256 dx = _mm256_set1_ps(x[b].d);
        if (q3) { /* sc[2 k] bs[2 k] + sc[2 k + 1] bs[2 k + 1], times the bias 4 */
            S = _mm256_sub_epi32(S, _mm256_slli_epi32(B, 2));
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(S)));
        } else {
            __m256 dm = _mm256_xor_ps(
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q2p->dmin)),
                _mm256_set1_ps(-0.0f)); /* the min is subtracted */
            __m256 a =
                _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(S)));
            *acc = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(B)));
        }
    }
}

/* One activation row of the 32-value types (kern__q40x8 .. kern__q80x8, the layout and the
 * arguments of grp_leg), one group as it lies, as one_q45k: the 64 bytes qs[2 kp], qs[2 kp + 1]
 * are one zmm (quad 2 kp of the 8 rows in lanes 0..7, quad 2 kp + 1 in lanes 8..15): their low
 * nibbles meet activation quads 2 kp, 2 kp + 1 and the high ones quads 4 + 2 kp, 5 + 2 kp by
 * vpdpbusd (Q8_0's bytes whole, quads 2 kp, 2 kp + 1 for kp < 4). For Q5_0 and Q5_1 the block's
 * qh is loaded once as (qh, qh >> 1), so that bit k of the low half's bytes and bit k + 1 of the
 * high half's sit at bit k of one zmm, moved to bit 4 above the nibble. The bias's 128 sx (plus
 * the type's own, Q = raw - bias) starts the low half's chain; the halves, summed at the block's
 * end, leave each row's S of grp_legx8 (integers, exact in any order), folded as there: the same
 * bits, in half the vpdpbusd and loads of the ymm kernel, whose one row ran at 99 Gweights/s in a
 * Zen 5 core's caches (Q4_0; Q4_K's one_q45k 131). */
INLINE void one_leg(const uint8_t *g, size_t nb, size_t bb, size_t mo, size_t ho, size_t qo,
                    int bias, int lut, int s8, int e8, const uint8_t *xr, __m256 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    const __m512i levels = lut_levels16(lut);
    const int8_t *xq = (const int8_t *)(const void *)(xr + KERN_QX32_Q(nb));
    bias += lut || s8 ? 128 : 0;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = g + b * bb;
        const int8_t *xs = xq + 32 * b;
        kern_prefetch_l2(q + KERN_PF_AHEAD, bb);
        int16_t sx;
        float dx;
        memcpy(&sx, xr + KERN_QX32_S(nb) + 2 * b, 2);
        memcpy(&dx, xr + 4 * b, 4);
        __m512i s = _mm512_maskz_set1_epi32(0x00ff, -bias * sx), u = _mm512_setzero_si512();
        if (s8) {
            for (int kp = 0; kp < 4; kp += 2) {
                __m512i v0 = _mm512_loadu_si512((const void *)(q + qo + 64 * kp));
                __m512i v1 = _mm512_loadu_si512((const void *)(q + qo + 64 * kp + 64));
                v0 = _mm512_xor_si512(v0, _mm512_set1_epi8((char)0x80)); /* plus 128 */
                v1 = _mm512_xor_si512(v1, _mm512_set1_epi8((char)0x80));
                s = _mm512_dpbusd_epi32(s, v0, quads2(xs + 8 * kp));
                u = _mm512_dpbusd_epi32(u, v1, quads2(xs + 8 * kp + 8));
            }
        } else {
            __m512i h = _mm512_setzero_si512();
            if (ho) {
                __m256i h8 = _mm256_loadu_si256((const __m256i *)(const void *)(q + ho));
                h = pair(h8, _mm256_srli_epi16(h8, 1)); /* bits past 6 are not read */
            }
            for (int kp = 0; kp < 2; kp++) {
                __m512i v = _mm512_loadu_si512((const void *)(q + qo + 64 * kp));
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (ho) { /* 0xf8 = a | b & c */
                    lo = _mm512_ternarylogic_epi32(lo, bit_to4(h, 2 * kp), m10, 0xf8);
                    hi = _mm512_ternarylogic_epi32(hi, bit_to4(h, 4 + 2 * kp), m10, 0xf8);
                }
                if (lut) {
                    lo = _mm512_shuffle_epi8(levels, lo);
                    hi = _mm512_shuffle_epi8(levels, hi);
                }
                s = _mm512_dpbusd_epi32(s, lo, quads2(xs + 8 * kp));
                u = _mm512_dpbusd_epi32(u, hi, quads2(xs + 16 + 8 * kp));
            }
        }
        __m512i t = _mm512_add_epi32(s, u);
        __m256i S = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
        __m256 d = e8 ? kern__e8m0x8(q)
                      : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)q));
        __m256 vdx = _mm256_set1_ps(dx);
        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(d, vdx), _mm256_cvtepi32_ps(S)));
        if (mo) {
            __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(q + mo)));
            *acc = _mm256_add_ps(*acc,
                                 _mm256_mul_ps(_mm256_mul_ps(dm, vdx), _mm256_set1_ps((float)sx)));
        }
    }
}

#endif

/* Groups g and g + 1 of w (the last group twice where their count is odd) times xq[0 .. tt). */
INLINE void grp2(const kern_mat *w, size_t g, size_t nb, const uint8_t *xq, size_t xrb, size_t tt,
                 __m512 *acc, __m512i *si)
{
    size_t g2 = 8 * (g + 1) < w->n_out ? g + 1 : g;
    const uint8_t *q = w->data;
#define LEG(id, T, file, mo, ho, nq, gm, gh, bias, lut, s8, e8)                                    \
    if (w->qtype == id) {                                                                          \
        size_t gb = nb * sizeof(T);                                                                \
        grp_leg(q + g * gb, q + g2 * gb, nb, sizeof(T), gm, gh, offsetof(T, qs), bias, lut, s8,    \
                e8, xq, xrb, tt, acc);                                                             \
    } else
    KERN_LEG_X8_TYPES(LEG)
#undef LEG
    if (w->qtype == KERN_GGML_IQ4_XS) {
        const kern__iq4xsx8 *qx = w->data;
        grp_iq4xs(qx + g * nb, qx + g2 * nb, nb, xq, xrb, tt, acc, si);
    } else if (w->qtype == KERN_GGML_Q6_K) {
        const kern__q6kx8 *q6 = w->data;
        grp_q6k(q6 + g * nb, q6 + g2 * nb, nb, xq, xrb, tt, acc, si);
    } else if (w->qtype == KERN_GGML_Q2_K || w->qtype == KERN_GGML_Q3_K) {
        int q3 = w->qtype == KERN_GGML_Q3_K;
        size_t gb = nb * (q3 ? sizeof(kern__q3kx8) : sizeof(kern__q2kx8));
        grp_q23k(q + g * gb, q + g2 * gb, nb, q3, xq, xrb, tt, acc, si);
    } else {
        int q5 = w->qtype == KERN_GGML_Q5_K;
        size_t gb = nb * (q5 ? sizeof(kern__q5kx8) : sizeof(kern__q4kx8));
        /* q5 a constant in each call, and grp_q45k's sub-block loop unrolled: the shifts, the
         * scales' offsets and the Q5_K branches are settled at compile time and the low and high
         * nibbles share their loads (one Zen 5 core, Q4_K 2048 x 2048: 189 -> 225 Gweights/s at
         * 16 rows, 1.10x at 32; Q5_K 1.22x; TinyLlama Q4_K_M decode of 16 sequences 1.16x,
         * prefill 1.09x). The same for grp_q23k's q3 made Q3_K 0.84x, so it stays a variable. */
        if (q5)
            grp_q45k(q + g * gb, q + g2 * gb, nb, 1, xq, xrb, tt, acc, si);
        else
            grp_q45k(q + g * gb, q + g2 * gb, nb, 0, xq, xrb, tt, acc, si);
    }
}

#ifdef KERN_QDOT_VNNI
/* group g's 8 outputs a of one activation row, those in [n0, n1) stored */
INLINE void store8(float *out, size_t g, size_t n0, size_t n1, __m256 a)
{
    size_t c0 = n0 > 8 * g ? n0 - 8 * g : 0, c1 = n1 - 8 * g < 8 ? n1 - 8 * g : 8;
    float l[8];
    _mm256_storeu_ps(l, a);
    memcpy(out + 8 * g + c0, l + c0, (c1 - c0) * sizeof(float));
}

/* One activation row of Q2_K .. Q5_K, IQ4_XS or the 32-value types, group by group on its
 * one-stream kernel (each call's type flags constants, so that each kernel is built for its
 * type); 0 for another type (Q6_K) */
INLINE int one_row(const kern_mat *w, const void *xq, size_t nb, float *out, size_t n0, size_t n1)
{
    uint32_t t = w->qtype;
    size_t gb = nb * (t == KERN_GGML_Q2_K     ? sizeof(kern__q2kx8)
                      : t == KERN_GGML_Q3_K   ? sizeof(kern__q3kx8)
                      : t == KERN_GGML_Q4_K   ? sizeof(kern__q4kx8)
                      : t == KERN_GGML_Q5_K   ? sizeof(kern__q5kx8)
                      : t == KERN_GGML_IQ4_XS ? sizeof(kern__iq4xsx8)
                                              : 0);
    if (!gb) {
#define LEG(id, T, file, mo, ho, nq, gm, gh, bias, lut, s8, e8)                                    \
    if (t == id) {                                                                                 \
        for (size_t g = n0 / 8; 8 * g < n1; g++) {                                                 \
            __m256 a = _mm256_setzero_ps();                                                        \
            one_leg((const uint8_t *)w->data + g * nb * sizeof(T), nb, sizeof(T), gm, gh,          \
                    offsetof(T, qs), bias, lut, s8, e8, xq, &a);                                   \
            store8(out, g, n0, n1, a);                                                             \
        }                                                                                          \
        return 1;                                                                                  \
    }
        KERN_LEG_X8_TYPES(LEG)
#undef LEG
        return 0;
    }
    for (size_t g = n0 / 8; 8 * g < n1; g++) {
        const uint8_t *p = (const uint8_t *)w->data + g * gb;
        __m256 a = _mm256_setzero_ps();
        switch (t) {
        case KERN_GGML_Q2_K: one_q23k(p, nb, 0, xq, &a); break;
        case KERN_GGML_Q3_K: one_q23k(p, nb, 1, xq, &a); break;
        case KERN_GGML_Q4_K: one_q45k(p, nb, 0, xq, &a); break;
        case KERN_GGML_Q5_K: one_q45k(p, nb, 1, xq, &a); break;
        default: one_iq4xs((const kern__iq4xsx8 *)(const void *)p, nb, xq, &a); break;
        }
        store8(out, g, n0, n1, a);
    }
    return 1;
}
#endif

/* qmatmul over KERN_QUANT_X8, 16 outputs (two groups) at a time, the wanted ones stored. */
void QMATMUL_X8(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                size_t n1)
{
    kern_qx fmt = kern_qdot_act(w);
    size_t xrb = kern_qx_row_bytes(fmt, w->n_in), nb = w->n_in / (fmt == KERN_QX_32 ? 32 : 256);
    __m512 acc[TT];
    __m512i si[TT];
#ifdef KERN_QDOT_VNNI
    if (T == 1 && one_row(w, xq, nb, out, n0, n1))
        return;
#endif
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        for (size_t g = n0 / 8; 8 * g < n1; g += 2) {
            for (size_t t = 0; t < tt; t++)
                acc[t] = _mm512_setzero_ps();
            grp2(w, g, nb, x, xrb, tt, acc, si);
            size_t c0 = n0 > 8 * g ? n0 - 8 * g : 0, c1 = n1 - 8 * g < 16 ? n1 - 8 * g : 16;
            for (size_t t = 0; t < tt; t++) {
                float *o = out + (t0 + t) * ldo + 8 * g;
                if (c0 == 0 && c1 == 16) {
                    _mm512_storeu_ps(o, acc[t]);
                } else {
                    float l[16];
                    _mm512_storeu_ps(l, acc[t]);
                    memcpy(o + c0, l + c0, (c1 - c0) * sizeof(float));
                }
            }
        }
    }
}
