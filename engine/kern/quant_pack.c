/* The quantized types' formats (kern/quant.h): each file block decoded into the unified fields
 * (the field layouts as ggml-common.h, read as engine/quant_*.c's dequantizers read them), the
 * packer that regroups a file's rows into panels, and the portable widening of panel values. */
#include "engine/kern/quant.h"

#include "engine/dtype.h"

#include <string.h>

static uint16_t u16_at(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t u32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 32 raw quants: value j in the low nibble of qs[j], j + 16 in the high; fifth bits from qh. */
static void raw32(const uint8_t *qs, uint32_t qh, uint8_t *raw)
{
    for (int j = 0; j < 16; j++) {
        raw[j] = (uint8_t)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
        raw[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

/* d (2) | qs (16): Q4_0, IQ4_NL */
static void dec_q4_0(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    raw32(p + 2, 0, o->raw);
}

/* d (2) | m (2) | qs (16) */
static void dec_q4_1(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    o->dm = u16_at(p + 2);
    raw32(p + 4, 0, o->raw);
}

/* d (2) | qh (4) | qs (16) */
static void dec_q5_0(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    raw32(p + 6, u32_at(p + 2), o->raw);
}

/* d (2) | m (2) | qh (4) | qs (16) */
static void dec_q5_1(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    o->dm = u16_at(p + 2);
    raw32(p + 8, u32_at(p + 4), o->raw);
}

/* The 2-bit field of value e in a Q2_K / Q3_K qs array (engine/quant_k.c's crumb_at). */
static int crumb_at(const uint8_t *qs, int e)
{
    return (qs[(e >> 7) * 32 + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

/* The 256 4-bit fields of a Q4_K / Q5_K qs array: each run of 32 bytes holds 64 values, the
 * first 32 in the low nibbles (engine/quant_k.c's nibble_at). */
static void nibbles256(const uint8_t *qs, uint8_t *raw)
{
    for (int run = 0; run < 4; run++)
        for (int t = 0; t < 32; t++) {
            raw[64 * run + t] = qs[32 * run + t] & 0x0f;
            raw[64 * run + 32 + t] = qs[32 * run + t] >> 4;
        }
}

/* scales (16) | qs (64) | d (2) | dmin (2) */
static void dec_q2_k(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p + 80);
    o->dm = u16_at(p + 82) ^ 0x8000; /* - dmin * m */
    for (int s = 0; s < 16; s++) {
        o->sc[s] = (int8_t)(p[s] & 0x0f);
        o->mi[s] = (uint8_t)(p[s] >> 4);
    }
    for (int e = 0; e < 256; e++)
        o->raw[e] = (uint8_t)crumb_at(p + 16, e);
}

/* hmask (32) | qs (64) | scales (12) | d (2); raw = crumb | h << 2, Q = raw - 4 */
static void dec_q3_k(const uint8_t *p, kern_qblock *o)
{
    const uint8_t *hmask = p, *qs = p + 32, *sc = p + 96;
    o->d = u16_at(p + 108);
    for (int s = 0; s < 16; s++) {
        int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
        int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        o->sc[s] = (int8_t)((lo | hi << 4) - 32);
    }
    for (int e = 0; e < 256; e++)
        o->raw[e] = (uint8_t)(crumb_at(qs, e) | ((hmask[e & 31] >> (e >> 5)) & 1) << 2);
}

static void scale_min_k4(const uint8_t *s, int j, int8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = (int8_t)(s[j] & 63);
        *m = (uint8_t)(s[j + 4] & 63);
    } else {
        *sc = (int8_t)((s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4);
        *m = (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* d (2) | dmin (2) | scales (12) | qs (128) */
static void dec_q4_k(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    o->dm = u16_at(p + 2) ^ 0x8000;
    for (int j = 0; j < 8; j++)
        scale_min_k4(p + 4, j, &o->sc[j], &o->mi[j]);
    nibbles256(p + 16, o->raw);
}

/* d (2) | dmin (2) | scales (12) | qh (32) | qs (128) */
static void dec_q5_k(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    o->dm = u16_at(p + 2) ^ 0x8000;
    for (int j = 0; j < 8; j++)
        scale_min_k4(p + 4, j, &o->sc[j], &o->mi[j]);
    const uint8_t *qh = p + 16;
    nibbles256(p + 48, o->raw);
    for (int e = 0; e < 256; e++)
        o->raw[e] |= (uint8_t)(((qh[e & 31] >> (e >> 5)) & 1) << 4);
}

/* ql (128) | qh (64) | scales (16, int8) | d (2); Q = raw - 32 */
static void dec_q6_k(const uint8_t *p, kern_qblock *o)
{
    const uint8_t *ql = p, *qh = p + 128;
    o->d = u16_at(p + 208);
    for (int s = 0; s < 16; s++)
        o->sc[s] = (int8_t)p[192 + s];
    for (int h = 0; h < 2; h++) /* each half of 128 values */
        for (int r = 0; r < 64; r++) {
            uint8_t l = ql[h * 64 + r], hb = qh[h * 32 + (r & 31)];
            int s0 = 2 * (r >> 5); /* value r: bits s0 of qh; value r + 64: bits s0 + 4 */
            o->raw[h * 128 + r] = (uint8_t)((l & 0x0f) | ((hb >> s0) & 3) << 4);
            o->raw[h * 128 + 64 + r] = (uint8_t)((l >> 4) | ((hb >> (s0 + 4)) & 3) << 4);
        }
}

/* d (2) | scales_h (2) | scales_l (4) | qs (128) */
static void dec_iq4_xs(const uint8_t *p, kern_qblock *o)
{
    o->d = u16_at(p);
    unsigned sh = u16_at(p + 2);
    const uint8_t *sl = p + 4, *qs = p + 8;
    for (int i = 0; i < 8; i++) {
        int lo = (sl[i / 2] >> (4 * (i % 2))) & 0x0f;
        int hi = (sh >> (2 * i)) & 3;
        o->sc[i] = (int8_t)((lo | hi << 4) - 32);
        for (int k = 0; k < 16; k++) {
            o->raw[i * 32 + k] = qs[i * 16 + k] & 0x0f;
            o->raw[i * 32 + 16 + k] = qs[i * 16 + k] >> 4;
        }
    }
}

/* e (1) | qs (16): MXFP4, its E8M0 exponent widened to 2^(e - 128) as a bf16 (exact: the float's
 * low 16 bits are zero for every e) */
static void dec_mxfp4(const uint8_t *p, kern_qblock *o)
{
    o->d = (uint16_t)(dtype_e8m0_half_bits(p[0]) >> 16);
    raw32(p + 1, 0, o->raw);
}

/* ggml's kvalues_iq4nl */
static const int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* MXFP4's: E2M1's values doubled (engine/quant_mxfp4.c) */
static const int8_t MXFP4_LEVELS[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static const kern_qfmt FORMATS[] = {
    /* id, sb, sub, file bytes, lo, hi, bias, has_sc, has_min, d_bf16, lut, decode */
    {2, 32, 32, 18, 4, 0, 8, false, false, false, NULL, dec_q4_0},           /* Q4_0 */
    {3, 32, 32, 20, 4, 0, 0, false, true, false, NULL, dec_q4_1},            /* Q4_1 */
    {6, 32, 32, 22, 4, 1, 16, false, false, false, NULL, dec_q5_0},          /* Q5_0 */
    {7, 32, 32, 24, 4, 1, 0, false, true, false, NULL, dec_q5_1},            /* Q5_1 */
    {10, 256, 16, 84, 2, 0, 0, true, true, false, NULL, dec_q2_k},           /* Q2_K */
    {11, 256, 16, 110, 2, 1, 4, true, false, false, NULL, dec_q3_k},         /* Q3_K */
    {12, 256, 32, 144, 4, 0, 0, true, true, false, NULL, dec_q4_k},          /* Q4_K */
    {13, 256, 32, 176, 4, 1, 0, true, true, false, NULL, dec_q5_k},          /* Q5_K */
    {14, 256, 16, 210, 4, 2, 32, true, false, false, NULL, dec_q6_k},        /* Q6_K */
    {20, 32, 32, 18, 4, 0, 0, false, false, false, IQ4_LEVELS, dec_q4_0},    /* IQ4_NL */
    {23, 256, 32, 136, 4, 0, 0, true, false, false, IQ4_LEVELS, dec_iq4_xs}, /* IQ4_XS */
    {39, 32, 32, 17, 4, 0, 0, false, false, true, MXFP4_LEVELS, dec_mxfp4},  /* MXFP4 */
};

const kern_qfmt *kern__qfmt(uint32_t id)
{
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (FORMATS[i].id == id)
            return &FORMATS[i];
    return NULL;
}

size_t kern_quant_block(uint32_t ggml_type)
{
    const kern_qfmt *f = kern__qfmt(ggml_type);
    return f ? f->sb : 0;
}

void kern_mat_init_quant(kern_mat *m, kern_type type, uint32_t ggml_type, const void *data,
                         size_t n_out, size_t n_in)
{
    const kern_qfmt *f = kern__qfmt(ggml_type);
    m->type = type;
    m->qtype = ggml_type;
    m->data = data;
    m->n_out = n_out;
    m->n_in = n_in;
    size_t nsb = n_in / f->sb;
    m->row_bytes =
        type == KERN_QUANT ? nsb * f->file_bytes : nsb * (kern__qoff(f).psb / KERN_PANEL);
}

/* Bit position of T index i in a plane of b-bit fields (b = 1, 2 or 4): byte and shift. */
static void plane_pos(unsigned b, size_t i, size_t *byte, unsigned *shift)
{
    size_t per = 256 / b; /* T values one 32-byte run covers */
    size_t r = i % per;
    *byte = i / per * 32 + r % 32;
    *shift = (unsigned)(r / 32) * b;
}

/* The b-bit fields (raw >> from) & mask of the n values of T into a plane (the layout of
 * kern/quant.h, n a multiple of 256 / b): one 32-byte run at a time. */
static void plane_write(const uint8_t *T, size_t n, unsigned b, unsigned from, uint8_t *plane)
{
    unsigned per = 256 / b, mask = (1u << b) - 1;
    for (size_t run = 0; run < n / per; run++)
        for (unsigned t = 0; t < 32; t++) {
            unsigned v = 0;
            for (unsigned s = 0; s < per / 32; s++)
                v |= ((T[run * per + s * 32 + t] >> from) & mask) << (s * b);
            plane[run * 32 + t] = (uint8_t)v;
        }
}

/* Per panel and super-block: the 16 rows' blocks decoded (rows past n_out stay zero: d = 0,
 * every value 0), their raw quants gathered k-major, the planes written from those. */
void kern__quant_pack(const kern_mat *src, void *dst, kern_mat *out)
{
    const kern_qfmt *f = kern__qfmt(src->qtype);
    kern_qoff o = kern__qoff(f);
    size_t nsb = src->n_in / f->sb, n_sub = f->sb / f->sub, n = (size_t)f->sb * KERN_PANEL;
    size_t np = (src->n_out + KERN_PANEL - 1) / KERN_PANEL;
    kern_qblock q;
    uint8_t T[256 * KERN_PANEL];
    for (size_t p = 0; p < np; p++)
        for (size_t b = 0; b < nsb; b++) {
            uint8_t *ps = (uint8_t *)dst + (p * nsb + b) * o.psb;
            memset(ps, 0, o.psb);
            memset(T, 0, n);
            for (size_t c = 0; c < KERN_PANEL && p * KERN_PANEL + c < src->n_out; c++) {
                const uint8_t *row =
                    (const uint8_t *)src->data + (p * KERN_PANEL + c) * src->row_bytes;
                f->decode(row + b * f->file_bytes, &q);
                memcpy(ps + 2 * c, &q.d, 2);
                if (f->has_min)
                    memcpy(ps + o.dm + 2 * c, &q.dm, 2);
                for (size_t j = 0; f->has_sc && j < n_sub; j++) {
                    ps[o.sc + j * KERN_PANEL + c] = (uint8_t)q.sc[j];
                    if (f->has_min)
                        ps[o.mi + j * KERN_PANEL + c] = q.mi[j];
                }
                for (size_t k = 0; k < f->sb; k++)
                    T[k * KERN_PANEL + c] = q.raw[k];
            }
            plane_write(T, n, f->lo_bits, 0, ps + o.lo);
            if (f->hi_bits)
                plane_write(T, n, f->hi_bits, f->lo_bits, ps + o.hi);
        }
    kern_mat_init_quant(out, KERN_QUANT_PANEL, src->qtype, dst, src->n_out, src->n_in);
}

void kern__q_expand_ref(const kern_qfmt *f, const uint8_t *psb, int8_t *T)
{
    kern_qoff o = kern__qoff(f);
    for (size_t i = 0; i < (size_t)f->sb * KERN_PANEL; i++) {
        size_t byte;
        unsigned sh;
        plane_pos(f->lo_bits, i, &byte, &sh);
        unsigned raw = (psb[o.lo + byte] >> sh) & ((1u << f->lo_bits) - 1);
        if (f->hi_bits) {
            plane_pos(f->hi_bits, i, &byte, &sh);
            raw |= ((psb[o.hi + byte] >> sh) & ((1u << f->hi_bits) - 1)) << f->lo_bits;
        }
        T[i] = f->lut ? f->lut[raw] : (int8_t)((int)raw - f->bias);
    }
}

static float f16_at(const uint8_t *p)
{
    return dtype_f16_to_f32(u16_at(p));
}

/* S and M of row c, sub-block j of a panel super-block. */
static void scale_min(const kern_qfmt *f, const kern_qoff *o, const uint8_t *ps, size_t j, size_t c,
                      float *S, float *M)
{
    float d = kern__q_d(f, u16_at(ps + 2 * c));
    *S = f->has_sc ? d * (float)(int8_t)ps[o->sc + j * KERN_PANEL + c] : d;
    if (!f->has_min)
        *M = -0.0f;
    else if (f->has_sc)
        *M = f16_at(ps + o->dm + 2 * c) * (float)ps[o->mi + j * KERN_PANEL + c];
    else
        *M = f16_at(ps + o->dm + 2 * c);
}

void kern__quant_widen_sb(const kern_mat *m, size_t p, size_t b, float *dst)
{
    const kern_qfmt *f = kern__qfmt(m->qtype);
    kern_qoff o = kern__qoff(f);
    const uint8_t *ps = (const uint8_t *)m->data + p * KERN_PANEL * m->row_bytes + b * o.psb;
    int8_t T[256 * KERN_PANEL];
    kern__q_expand_ref(f, ps, T);
    for (size_t k = 0; k < f->sb; k++)
        for (size_t c = 0; c < KERN_PANEL; c++) {
            float S, M;
            scale_min(f, &o, ps, k / f->sub, c, &S, &M);
            dst[k * KERN_PANEL + c] = S * (float)T[k * KERN_PANEL + c] + M;
        }
}

void kern__quant_rows(const kern_mat *m, size_t r0, size_t nr, float *dst)
{
    const kern_qfmt *f = kern__qfmt(m->qtype);
    kern_qoff o = kern__qoff(f);
    size_t nsb = m->n_in / f->sb;
    int8_t T[256 * KERN_PANEL];
    for (size_t r = r0; r < r0 + nr; r++, dst += m->n_in) {
        const uint8_t *pp = (const uint8_t *)m->data + r / KERN_PANEL * KERN_PANEL * m->row_bytes;
        size_t c = r % KERN_PANEL;
        for (size_t b = 0; b < nsb; b++) {
            const uint8_t *ps = pp + b * o.psb;
            kern__q_expand_ref(f, ps, T);
            for (size_t k = 0; k < f->sb; k++) {
                float S, M;
                scale_min(f, &o, ps, k / f->sub, c, &S, &M);
                dst[b * f->sb + k] = S * (float)T[k * KERN_PANEL + c] + M;
            }
        }
    }
}
