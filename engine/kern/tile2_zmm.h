/* The AVX-512 pair tile over weights already widened to F32, shared by kern/avx512.c (F16 pairs
 * widened once per pass) and kern/quant_avx512.c (quantized pairs widened per chunk): an R x 32
 * tile, two weight vectors (w0 and w1 at input k: w0 + k * wstep, w1 + k * wstep) against each
 * broadcast x, continuing the chains out holds (first: from +0), so that chunk after chunk each
 * output is still one in-order FMA chain over k. x is packed (px: value k of the R rows at
 * x + k * R, panel_pack_x's layout) or R rows ldx apart. Header-only, always inlined, so each
 * file compiles it with its own target flags (the emulated copies over simde included); for the
 * kern/ files only. */
#ifndef KVS_ENGINE_KERN_TILE2_ZMM_H
#define KVS_ENGINE_KERN_TILE2_ZMM_H

#include "engine/kern/avx512_isa.h"
#include "engine/kern/kern.h"
#include "engine/kern/panel_loop.h"

#include <stdbool.h>
#include <stddef.h>

#define TILE2_ROWS 12 /* 24 accumulators and 2 weight vectors of the 32 zmm registers */

INLINE void zmm_ftile2(int R, bool px, const float *x, size_t ldx, const float *w0, const float *w1,
                       size_t wstep, size_t n, float *out, size_t ldo, bool first, panel_pf pf)
{
    __m512 a0[TILE2_ROWS], a1[TILE2_ROWS];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        a0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (size_t)r * ldo);
        a1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (size_t)r * ldo + KERN_PANEL);
    }
    for (size_t k = 0; k < n; k++) {
        panel_pf_at(pf, k);
        __m512 v0 = _mm512_load_ps(w0 + k * wstep), v1 = _mm512_load_ps(w1 + k * wstep);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(px ? x[k * (size_t)R + (size_t)r] : x[(size_t)r * ldx + k]);
            a0[r] = _mm512_fmadd_ps(xb, v0, a0[r]);
            a1[r] = _mm512_fmadd_ps(xb, v1, a1[r]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out + (size_t)r * ldo, a0[r]);
        _mm512_storeu_ps(out + (size_t)r * ldo + KERN_PANEL, a1[r]);
    }
}

#endif
