/* Weight layout: regrouping a file's rows into panels at load (kern.h describes the layout),
 * and reading rows back. The only layout the products take, on every instruction set. Plain C
 * plus SSE2 (the x86-64 baseline) for the F16 transposes. */
#include "engine/kern/kern.h"

#include "engine/dtype.h"
#include "engine/kern/quant.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define Q8_BLOCK_BYTES (2 + KERN_QK8_0)
/* A Q8_0 panel's block of 32 inputs: 16 f16 scales, then [32][16] int8. */
#define Q8P_QUANTS (2 * KERN_PANEL)
#define Q8P_BLOCK_BYTES (KERN_PANEL * Q8_BLOCK_BYTES)

void kern_mat_init(kern_mat *m, kern_type type, const void *data, size_t n_out, size_t n_in)
{
    m->type = type;
    m->qtype = 0;
    m->data = data;
    m->n_out = n_out;
    m->n_in = n_in;
    m->row_bytes = type == KERN_F32 || type == KERN_F32_PANEL ? n_in * 4
                   : type == KERN_F16 || type == KERN_F16_PANEL
                       ? n_in * 2
                       : n_in / KERN_QK8_0 * Q8_BLOCK_BYTES;
}

static size_t n_panels(size_t n_out)
{
    return (n_out + KERN_PANEL - 1) / KERN_PANEL;
}

size_t kern_panel_bytes(const kern_mat *src)
{
    if (src->type != KERN_F32 && src->type != KERN_F16 && src->type != KERN_Q8_0 &&
        src->type != KERN_QUANT)
        return 0;
    if (src->type == KERN_QUANT) {
        kern_mat pm;
        kern_mat_init_quant(&pm, KERN_QUANT_PANEL, src->qtype, NULL, src->n_out, src->n_in);
        return n_panels(src->n_out) * KERN_PANEL * pm.row_bytes;
    }
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
    if (src->type == KERN_QUANT) {
        kern__quant_pack(src, dst, out);
        return;
    }
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
                for (size_t b = 0; b < K / KERN_QK8_0; b++) {
                    const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
                    uint8_t *db = d + b * Q8P_BLOCK_BYTES;
                    memcpy(db + 2 * c, blk, 2);
                    for (size_t i = 0; i < KERN_QK8_0; i++)
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

static float f16_at(const uint8_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dtype_f16_to_f32(h);
}

void kern_rows_to_f32(const kern_mat *m, size_t r0, size_t nr, float *dst)
{
    if (m->type == KERN_QUANT_PANEL) {
        kern__quant_rows(m, r0, nr, dst);
        return;
    }
    if (m->type == KERN_F32 || m->type == KERN_F16 || m->type == KERN_Q8_0 ||
        m->type == KERN_QUANT) { /* the file's rows: its dequantizer, the panels' bits */
        const dtype_info *dt = dtype_get(m->type == KERN_F32    ? 0
                                         : m->type == KERN_F16  ? 1
                                         : m->type == KERN_Q8_0 ? 8
                                                                : m->qtype);
        for (size_t r = r0; r < r0 + nr; r++, dst += m->n_in)
            dt->to_f32((const uint8_t *)m->data + r * m->row_bytes, dst, m->n_in);
        return;
    }
    size_t K = m->n_in, pbytes = KERN_PANEL * m->row_bytes;
    for (size_t r = r0; r < r0 + nr; r++, dst += K) {
        /* one row (an embedding lookup): its values sit KERN_PANEL apart */
        const uint8_t *wp = (const uint8_t *)m->data + r / KERN_PANEL * pbytes;
        size_t c = r % KERN_PANEL;
        if (m->type == KERN_F16_PANEL) {
            for (size_t k = 0; k < K; k++)
                dst[k] = f16_at(wp, k * KERN_PANEL + c);
        } else if (m->type == KERN_F32_PANEL) {
            for (size_t k = 0; k < K; k++)
                memcpy(dst + k, wp + (k * KERN_PANEL + c) * 4, 4);
        } else {
            for (size_t b = 0; b < K / KERN_QK8_0; b++) {
                const uint8_t *blk = wp + b * Q8P_BLOCK_BYTES;
                float s = f16_at(blk, c);
                for (size_t i = 0; i < KERN_QK8_0; i++)
                    dst[b * KERN_QK8_0 + i] =
                        s * (float)(int8_t)blk[Q8P_QUANTS + i * KERN_PANEL + c];
            }
        }
    }
}
