/* CPU kernels of the forward pass: products with weight matrices kept in their file type
 * (F32, F16, Q8_0; never widened in memory, F32/F16 regrouped into panels), and the vector
 * helpers around them.
 * Every kernel is single-threaded and deterministic: the same inputs give the same bits.
 * AVX2+FMA+F16C code when compiled for it, plain C otherwise. Weights are multiplied exactly
 * as widened F32 values (an F16 value, or scale * int8 rounded to float), so results differ
 * from a widened copy only in summation order. */
#ifndef KVS_ENGINE_KERNELS_H
#define KVS_ENGINE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* KERN_F32_PANEL / KERN_F16_PANEL / KERN_Q8_0_PANEL hold the same values as F32 / F16 / Q8_0
 * rows, regrouped for the batched products (kern_mat_to_panels): rows in panels of KERN_PANEL,
 * each panel stored k-major ([n_in][KERN_PANEL]: the panel's k-th values side by side, one
 * contiguous stream; for Q8_0, per block of 32 inputs the 16 rows' f16 scales, then the
 * [32][16] int8 values), the last panel padded with zero rows. A product then broadcasts each x
 * value against 16 weights at once and converts every weight once per tile of 6 rows of x. Panel
 * products are batch-invariant: an output is one in-order FMA chain over k, whatever T and the
 * column range, so a row's bits do not depend on the rows it is batched with. */
typedef enum kern_type {
    KERN_F32,
    KERN_F16,
    KERN_Q8_0,
    KERN_F32_PANEL,
    KERN_F16_PANEL,
    KERN_Q8_0_PANEL
} kern_type;

#define KERN_PANEL 16

static inline int kern_is_panel(kern_type t)
{
    return t == KERN_F32_PANEL || t == KERN_F16_PANEL || t == KERN_Q8_0_PANEL;
}

/* A row-major weight matrix (n_out rows of n_in inputs) in place: F32/F16 rows are n_in
 * values; Q8_0 rows are n_in / 32 blocks of an f16 scale and 32 int8 (n_in % 32 == 0). */
typedef struct kern_mat {
    kern_type type;
    const void *data;
    size_t n_out, n_in;
    size_t row_bytes;
} kern_mat;

/* Fills m from its parts; row_bytes from type and n_in (for panel types the bytes of one
 * row's values; the data holds ceil(n_out / KERN_PANEL) * KERN_PANEL of them). */
void kern_mat_init(kern_mat *m, kern_type type, const void *data, size_t n_out, size_t n_in);

/* Bytes kern_mat_to_panels writes for src (F32, F16 or Q8_0 rows); 0 for panel types. */
size_t kern_panel_bytes(const kern_mat *src);
/* Copies F32 / F16 / Q8_0 rows src into dst (kern_panel_bytes(src), any alignment) as the
 * matching panel type, described in out. Values are copied bit for bit. */
void kern_mat_to_panels(const kern_mat *src, void *dst, kern_mat *out);

/* out[t * ldo + n] = sum_k x[t * ldx + k] * W[n][k] for t < T and n0 <= n < n1. Row layouts:
 * the fused small-batch path, converting weights in registers (each weight byte read once per
 * call). Panel layouts: every batch size, x in passes of 192 rows. */
void kern_matmul_rows(const kern_mat *w, const float *x, size_t T, size_t ldx, float *out,
                      size_t ldo, size_t n0, size_t n1);
/* kern_matmul_rows for a panel type, with a scratch of KERN_PANEL * n_in floats (or NULL) in
 * which a Q8_0 panel read by several row tiles is widened once; the bits are the same either
 * way. */
void kern_matmul_panels(const kern_mat *w, const float *x, size_t T, size_t ldx, float *out,
                        size_t ldo, size_t n0, size_t n1, float *scratch);
/* Row layouts' mid-size batch path (about 8..128 rows; not for panel types): x is packed once per
 * product with kern_gemm_pack_x into xp (kern_gemm_xp_floats(T, n_in) floats), then any column
 * ranges of out[t * ldo + n] = sum_k x[t][k] * W[n][k] are computed from xp by kern_gemm_packed
 * (each weight converted once per call). An output's bits depend only on its x row and weight row,
 * not on T or on the column range. */
size_t kern_gemm_xp_floats(size_t T, size_t n_in);
void kern_gemm_pack_x(const float *x, size_t T, size_t ldx, size_t n_in, float *xp);
void kern_gemm_packed(const kern_mat *w, const float *xp, size_t T, float *out, size_t ldo,
                      size_t n0, size_t n1);
/* Widens rows r0..r0+nr-1 of w to F32 into dst ([nr][n_in]). */
void kern_rows_to_f32(const kern_mat *w, size_t r0, size_t nr, float *dst);

float kern_dot(const float *a, const float *b, size_t n);
/* The same with b in F16 (the KV cache's F16 type). */
float kern_dot_f16(const float *a, const uint16_t *b, size_t n);
/* y += a * x, x in F16 */
void kern_axpy_f16(float *y, float a, const uint16_t *x, size_t n);
/* dst = x rounded to F16 (to nearest even, as ggml_fp32_to_fp16) */
void kern_to_f16(uint16_t *dst, const float *x, size_t n);
/* y += a * x */
void kern_axpy(float *y, float a, const float *x, size_t n);
/* y += x */
void kern_add(float *y, const float *x, size_t n);
/* out = x / rms(x) * w */
void kern_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps);
/* g = silu(g) * u */
void kern_silu_mul(float *g, const float *u, size_t n);

#endif
