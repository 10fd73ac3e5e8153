/* AVX-512 integer products (kern/qdot.h): the type's 16-row tile entry point, each in the file
 * of its family (kern/qdot_tiles16.h says how the kernels work), for two rows of x and more; a
 * lone row, and the IQ4 types without VNNI, to the AVX2 kernels (kern/qdot_rows8.h), which follow
 * the same contract, so the bits do not change; the interleaved layout to kern/qdot_x8_avx512.c.
 * A new type is a file of its kernels, its QTILES16_DEFINE and a line in tiles16_for. */
#include "engine/kern/qdot_tiles16.h"

#include <string.h>

typedef void (*qtiles16_fn)(const kern_mat *w, const uint8_t *x, size_t xrb, size_t tt, float *out,
                            size_t ldo, size_t n0, size_t n1, int vnni);

/* The entry point of w's type (kern_qdot_act admits only these; the IQ4 types' and MXFP4's only
 * with VNNI, in the native build) */
static qtiles16_fn tiles16_for(const kern_mat *w)
{
    if (w->type == KERN_Q8_0)
        return QTILES16(q8_0);
    switch (w->qtype) {
    case KERN_GGML_Q4_0: return QTILES16(q4_0);
    case KERN_GGML_Q4_1: return QTILES16(q4_1);
    case KERN_GGML_Q5_0: return QTILES16(q5_0);
    case KERN_GGML_Q5_1: return QTILES16(q5_1);
    case KERN_GGML_Q2_K: return QTILES16(q2_k);
    case KERN_GGML_Q3_K: return QTILES16(q3_k);
    case KERN_GGML_Q4_K: return QTILES16(q4_k);
    case KERN_GGML_Q5_K: return QTILES16(q5_k);
#ifndef KERN_AVX512_EMULATED
    case KERN_GGML_IQ4_NL: return QTILES16(iq4_nl);
    case KERN_GGML_IQ4_XS: return QTILES16(iq4_xs);
    case KERN_GGML_MXFP4: return QTILES16(mxfp4);
#endif
    default: return QTILES16(q6_k);
    }
}

/* Rows of x up to which w's type runs faster on the ymm kernels than on the zmm pairs
 * (kern/qdot.h's KERN_X8_FEW_ROWS), measured on one Zen 5 core streaming 2048 x 2048: 2 rows Q4_K
 * 1.55x, Q6_K 1.61x, Q5_0 1.73x, IQ4_XS 1.52x; the others to 4 (from 6 rows Q6_K's and Q4_0's
 * zmm kernels are the faster, IQ4_XS at 8 rows 0.80x); Q4_K and Q5_K to 2 since their zmm kernel
 * has its sub-blocks unrolled (the zmm one against the ymm one: Q4_K 2 rows 0.87x, 3 1.08x, 4
 * 1.08x, 8 1.33x; Q5_K 4 rows 1.27x, 8 1.54x; before, they went on to 8 rows); none for Q2_K and
 * Q3_K, whose zmm kernels were the faster from 2 rows (0.66-0.97x), nor for Q8_0, the same either
 * way (1.00-1.03x). */
static inline size_t few_rows_ymm(const kern_mat *w)
{
    switch (w->qtype) {
    case KERN_GGML_Q4_K:
    case KERN_GGML_Q5_K: return 2;
    case KERN_GGML_Q2_K:
    case KERN_GGML_Q3_K:
    case KERN_GGML_Q8_0: return 1;
    default: return 4;
    }
}

/* Whether one row of w goes to its one-group zmm stream (kern/qdot_x8_avx512.c's one_row): Q4_K,
 * Q5_K, IQ4_XS, Q2_K and Q3_K (one_q45k, one_iq4xs, one_q23k), and with leg the 32-value types
 * (one_leg); Q6_K never (the same form gained 4 % on Zen 5). */
static inline bool one_row_zmm(const kern_mat *w, bool leg)
{
    switch (w->qtype) {
    case KERN_GGML_Q4_K:
    case KERN_GGML_Q5_K:
    case KERN_GGML_IQ4_XS:
    case KERN_GGML_Q2_K:
    case KERN_GGML_Q3_K: return true;
    case KERN_GGML_Q6_K: return false;
    default: return leg;
    }
}

/* leg: one row of the 32-value types on zmm (kern__qmatmul_avx512_leg) */
static void qmatmul(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                    size_t n1, bool leg)
{
    (void)leg; /* the emulated copy has no VNNI kernels */
    size_t xrb = kern_qx_row_bytes(kern_qdot_act(w), w->n_in);
    int kind = w->type == KERN_Q8_0 ? 0 : (int)w->qtype;
#ifndef KERN_AVX512_EMULATED
    int vnni = __builtin_cpu_supports("avx512vnni");
#else
    int vnni = 0; /* the emulated copy has no VNNI kernels */
#endif
    /* The interleaved layout (kern/qdot_pack.c) needs no transposes, which is what the 16-row
     * tiles below spend their shuffles on: two of its groups a zmm from two rows of x on
     * (kern/qdot_x8_avx512.c), for one row Q4_K's group as one stream on zmm where the CPU has
     * VNNI (the same file) and the ymm kernels otherwise (kern/qdot_x8_avx2.c), which also take
     * a few rows of most types where the CPU has VNNI (few_rows_ymm). */
    if (w->type == KERN_QUANT_X8 && T > 1) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_AMX)
        /* From 32 rows of x on the tile unit (kern/qdot_amx.c), where the CPU has it: its weight
         * tiles are built once for all the rows, which 16 rows do not pay for (TinyLlama Q4_K_M,
         * 2 threads, against the zmm kernels: 16 rows 0.92x with Q4_K alone, 32 1.19x, 64 1.34x) */
        if (vnni && T >= 32 && kern__amx_takes(w) && kern__amx_ready()) {
            size_t T16 = T / 16 * 16;
            kern__qmatmul_x8_amx(w, xq, T16, out, ldo, n0, n1);
            if (T16 < T)
                kern__qmatmul_x8_avx512_vnni(w, (const uint8_t *)xq + T16 * xrb, T - T16,
                                             out + T16 * ldo, ldo, n0, n1);
            return;
        }
#endif
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
        if (vnni && T <= few_rows_ymm(w)) { /* a few rows: the ymm kernels (kern/qdot.h) */
            kern__qmatmul_x8_avx2_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
        if (vnni) {
            kern__qmatmul_x8_avx512_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
#endif
        KERN512(kern__qmatmul_x8_avx512)(w, xq, T, out, ldo, n0, n1);
        return;
    }
    if (w->type == KERN_QUANT_X8) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
        /* one group's stream, zmm */
        if (vnni && one_row_zmm(w, leg)) {
            kern__qmatmul_x8_avx512_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
        if (vnni) {
            kern__qmatmul_x8_avx2_vnni(w, xq, T, out, ldo, n0, n1);
            return;
        }
#endif
        kern__qmatmul_x8_avx2(w, xq, T, out, ldo, n0, n1);
        return;
    }
    /* The IQ4 types and MXFP4 have 16-row tiles with VNNI only (grpv_iq4nl, grpv_iq4xs,
     * grpv_mxfp4): otherwise, and for one row, the AVX2 kernels */
    if (kind == KERN_GGML_IQ4_NL || kind == KERN_GGML_IQ4_XS || kind == KERN_GGML_MXFP4) {
#ifndef KERN_AVX512_EMULATED
        if (!vnni || T == 1)
#endif
        {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
            if (vnni) {
                kern__qmatmul_avx2_vnni(w, xq, T, out, ldo, n0, n1);
                return;
            }
#endif
            kern__qmatmul_avx2(w, xq, T, out, ldo, n0, n1);
            return;
        }
    }
    qtiles16_fn tiles = tiles16_for(w);
    for (size_t t0 = 0; t0 < T; t0 += TT) {
        size_t tt = T - t0 < TT ? T - t0 : TT;
        const uint8_t *x = (const uint8_t *)xq + t0 * xrb;
        /* One row of x (a decode step): AVX2's one-row kernels, the same bits, built again with
         * VL + VNNI where the CPU has VNNI (kern/qdot_rows8.h). zmm forms of them (64 values a
         * vector against x as it lies, the 16 rows' lanes reduced after; BW for the K-quants,
         * vpdpbusd for Q8_0 and Q4_0) measured no faster on the Intel Xeon, in the caches or not;
         * likely because zmm work issues on ports 0 and 5 only, where the scales' and inserts'
         * shuffles crowd port 5. */
        if (tt == 1) {
#if !defined(KERN_AVX512_EMULATED) && defined(KERN_HAVE_QDOT_VNNI)
            if (vnni) {
                kern__qmatmul_avx2_vnni(w, x, 1, out + t0 * ldo, ldo, n0, n1);
                continue;
            }
#endif
            kern__qmatmul_avx2(w, x, 1, out + t0 * ldo, ldo, n0, n1);
            continue;
        }
        tiles(w, x, xrb, tt, out + t0 * ldo, ldo, n0, n1, vnni);
    }
}

void KERN512(kern__qmatmul_avx512)(const kern_mat *w, const void *xq, size_t T, float *out,
                                   size_t ldo, size_t n0, size_t n1)
{
    qmatmul(w, xq, T, out, ldo, n0, n1, false);
}

#ifndef KERN_AVX512_EMULATED
/* Where zmm work is as cheap as ymm work a value (AMD Zen 5, kern_avx512_cvt_ops), one row of the
 * 32-value types (Q4_0 .. Q8_0, IQ4_NL, MXFP4) on its zmm stream, one_leg: one Zen 5 core from
 * the caches Q4_0 1.38x, Q8_0 1.30x, MXFP4 1.26x, Q5_0 1.29x; streaming MXFP4 1.19x. The same
 * form measured 1.00x (IQ4_NL), 1.09x (Q4_0) and 0.92x (Q5_1) on an Intel Xeon core (zmm
 * integer work issues on two ports there), so kern__qmatmul_avx512 keeps them on ymm. */
void kern__qmatmul_avx512_leg(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                              size_t n0, size_t n1)
{
    qmatmul(w, xq, T, out, ldo, n0, n1, true);
}

/* Where AVX-512 runs as two 256-bit halves (AMD Zen 4), Q2_K's and Q3_K's one row stays on the
 * ymm kernel: there a zmm stream of one group (one_q45k's form) was the slower, 75 -> 55
 * Gweights/s for Q2_K and 51 -> 46 for Q3_K from the caches (docs/BENCHMARKS.md, "Q2_K and Q3_K
 * in 8-row groups"); on full-width units one_q23k is the faster (kern/qdot_x8_avx512.c). */
void kern__qmatmul_avx512_halves(const kern_mat *w, const void *xq, size_t T, float *out,
                                 size_t ldo, size_t n0, size_t n1)
{
#ifdef KERN_HAVE_QDOT_VNNI
    if (T == 1 && w->type == KERN_QUANT_X8 &&
        (w->qtype == KERN_GGML_Q2_K || w->qtype == KERN_GGML_Q3_K) &&
        __builtin_cpu_supports("avx512vnni")) {
        kern__qmatmul_x8_avx2_vnni(w, xq, T, out, ldo, n0, n1);
        return;
    }
#endif
    kern__qmatmul_avx512(w, xq, T, out, ldo, n0, n1);
}
#endif
