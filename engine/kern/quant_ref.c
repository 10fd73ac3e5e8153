/* The portable product over quantized panels (kern/quant.h): each panel widened to its exact F32
 * values, then ref.c's arithmetic, one chain s = fmaf(x[k], w[k], s) in k order per output. */
#include "engine/kern/quant.h"

#include <math.h>

/* As ref.c: gcc's FMA clone of the fmaf loop (same bits, one instruction instead of libm's). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__FMA__) &&        \
    !defined(__SANITIZE_THREAD__)
#define REF_FMA_CLONE __attribute__((target_clones("fma", "default")))
#else
#define REF_FMA_CLONE
#endif

/* The chains of rows t < T, columns c0..c1 of one panel continue over the n inputs whose
 * widened weights are w ([n][16]); out holds the running sums (exact: stored floats). */
REF_FMA_CLONE static void chain_on(const float *w, size_t n, const float *x, size_t T, size_t ldx,
                                   float *out, size_t ldo, size_t c0, size_t c1)
{
    for (size_t t = 0; t < T; t++) {
        float acc[KERN_PANEL];
        for (size_t c = c0; c < c1; c++)
            acc[c] = out[t * ldo + c];
        for (size_t k = 0; k < n; k++) {
            float xv = x[t * ldx + k];
            for (size_t c = c0; c < c1; c++)
                acc[c] = fmaf(xv, w[k * KERN_PANEL + c], acc[c]);
        }
        for (size_t c = c0; c < c1; c++)
            out[t * ldo + c] = acc[c];
    }
}

void kern__quant_matmul_ref(const kern_mat *m, const float *x, size_t T, size_t ldx, float *out,
                            size_t ldo, size_t n0, size_t n1)
{
    const kern_qfmt *f = kern__qfmt(m->qtype);
    float w[256 * KERN_PANEL];
    for (size_t p = n0 / KERN_PANEL; p * KERN_PANEL < n1; p++) {
        size_t base = p * KERN_PANEL;
        size_t c0 = n0 > base ? n0 - base : 0;
        size_t c1 = n1 - base < KERN_PANEL ? n1 - base : KERN_PANEL;
        for (size_t t = 0; t < T; t++)
            for (size_t c = c0; c < c1; c++)
                out[t * ldo + base + c] = 0.0f;
        for (size_t b = 0; b < m->n_in / f->sb; b++) {
            kern__quant_widen_sb(m, p, b, w);
            chain_on(w, f->sb, x + b * f->sb, T, ldx, out + base, ldo, c0, c1);
        }
    }
}
