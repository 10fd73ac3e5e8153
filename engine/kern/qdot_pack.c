/* The integer path's interleaved weight layout, KERN_QUANT_X8 (kern/qdot.h's kern__q4kx8): a
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q8_0, Q2_K .. Q6_K or IQ4_XS matrix's rows in groups of
 * 8, each block of the 8 rows stored together, their packed values in 4-byte quads transposed so
 * that lane r of a 32-byte vector is row r's quad, their scales and mins a byte each (Q2_K's byte
 * holds both). A kernel then loads its operands as they are needed: the tile kernels lose their
 * per-block transposes, one activation row its horizontal sums, scale shuffles and per-row streams
 * (a group is one contiguous stream). Made once at load from the file's rows (engine/model.c) when
 * the kernel table has an integer product of its own; kern__x8_row gives the file's bytes back
 * exactly, so the portable product (and the tests) read the same values. */
#include "engine/kern/qdot.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define Q2K_BYTES 84    /* scales (16) | qs (64) | d | dmin */
#define Q3K_BYTES 110   /* hmask (32) | qs (64) | scales (12) | d */
#define Q4K_BYTES 144   /* d | dmin | scales (12) | qs (128) */
#define Q5K_BYTES 176   /* d | dmin | scales (12) | qh (32) | qs (128) */
#define Q6K_BYTES 210   /* ql (128) | qh (64) | scales (16) | d */
#define IQ4XS_BYTES 136 /* d | scales_h (2) | scales_l (4) | qs (128) */

/* The legacy 32-value types: the file's block (d | m | qh (4) | qs (16); MXFP4's d is one E8M0
 * byte), the group's */
typedef struct leg_fmt {
    uint32_t id;
    int file, mo, ho, nq; /* a file block's bytes, its m's and qh's offsets (0: none), its quads */
    int e8;               /* a byte's scale (MXFP4): the group's e[8], not d[8] */
    size_t group, gm, gh, gq; /* the group block's bytes, its m's, qh's (0: none), qs's offsets */
} leg_fmt;

#define LEG_ROW(id, T, file, mo, ho, nq, gm, gh, bias, lut, s8, e8)                                \
    {id, file, mo, ho, nq, e8, sizeof(T), gm, gh, offsetof(T, qs)},
static const leg_fmt g_leg[] = {KERN_LEG_X8_TYPES(LEG_ROW)};
#undef LEG_ROW

/* m's legacy format: a KERN_QUANT matrix of one of those types, a KERN_Q8_0 one, or their
 * KERN_QUANT_X8 copy (whose qtype says which) */
static const leg_fmt *leg_of(const kern_mat *m)
{
    uint32_t qtype = m->type == KERN_Q8_0 ? KERN_GGML_Q8_0 : m->qtype;
    for (size_t i = 0; i < sizeof g_leg / sizeof g_leg[0]; i++)
        if (g_leg[i].id == qtype)
            return &g_leg[i];
    return NULL;
}

/* The value a group's w[k] holds in byte i of a lane (kern/qdot.h's kern__q50x8): its qh bit */
static int leg_value(int k, int i)
{
    return k < 4 ? 4 * k + i : 16 + 4 * (k - 4) + i;
}

size_t kern_qdot_x8_bytes(const kern_mat *src)
{
    if ((src->type != KERN_QUANT && src->type != KERN_Q8_0) || src->n_out % 8 ||
        src->n_in > KERN_X8_MAX_IN || !src->n_out)
        return 0;
    const leg_fmt *lf = leg_of(src);
    if (lf)
        return src->n_in % 32 ? 0 : src->n_out / 8 * (src->n_in / 32) * lf->group;
    if (src->n_in % 256)
        return 0;
    size_t n = src->n_out / 8 * (src->n_in / 256);
    return src->qtype == KERN_GGML_Q2_K     ? n * sizeof(kern__q2kx8)
           : src->qtype == KERN_GGML_Q3_K   ? n * sizeof(kern__q3kx8)
           : src->qtype == KERN_GGML_Q4_K   ? n * sizeof(kern__q4kx8)
           : src->qtype == KERN_GGML_Q5_K   ? n * sizeof(kern__q5kx8)
           : src->qtype == KERN_GGML_Q6_K   ? n * sizeof(kern__q6kx8)
           : src->qtype == KERN_GGML_IQ4_XS ? n * sizeof(kern__iq4xsx8)
                                            : 0;
}

/* the 32-byte runs of a block (at p, n of them) as quads of the 8 rows: lane r of t[c][k] */
static void quads(uint8_t (*t)[8][32], const uint8_t *p, int n, int r)
{
    for (int c = 0; c < n; c++)
        for (int k = 0; k < 8; k++)
            memcpy(&t[c][k][4 * r], p + 32 * c + 4 * k, 4);
}

static void unquads(uint8_t *p, const uint8_t (*t)[8][32], int n, int r)
{
    for (int c = 0; c < n; c++)
        for (int k = 0; k < 8; k++)
            memcpy(p + 32 * c + 4 * k, &t[c][k][4 * r], 4);
}

/* a block's n quads at p as row r's: lane r of t[k] */
static void quads_n(uint8_t (*t)[32], const uint8_t *p, int n, int r)
{
    for (int k = 0; k < n; k++)
        memcpy(&t[k][4 * r], p + 4 * k, 4);
}

static void to_x8_leg(const kern_mat *src, const leg_fmt *lf, uint8_t *o)
{
    size_t nb = src->n_in / 32, groups = src->n_out / 8;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o += lf->group) {
            if (lf->ho)
                memset(o + lf->gh, 0, 32);
            for (int r = 0; r < 8; r++) {
                const uint8_t *p =
                    (const uint8_t *)src->data + (8 * g + r) * src->row_bytes + lf->file * b;
                if (lf->e8)
                    o[r] = p[0];
                else
                    memcpy(o + 2 * r, p, 2);
                if (lf->mo)
                    memcpy(o + lf->gm + 2 * r, p + lf->mo, 2);
                if (lf->ho) {
                    uint32_t h = (uint32_t)p[lf->ho] | (uint32_t)p[lf->ho + 1] << 8 |
                                 (uint32_t)p[lf->ho + 2] << 16 | (uint32_t)p[lf->ho + 3] << 24;
                    for (int i = 0; i < 4; i++)
                        for (int k = 0; k < 8; k++)
                            o[lf->gh + 4 * r + i] |= (uint8_t)((h >> leg_value(k, i) & 1) << k);
                }
                quads_n((uint8_t(*)[32])(o + lf->gq), p + lf->file - 4 * lf->nq, lf->nq, r);
            }
        }
}

static void to_x8_q6k(const kern_mat *src, kern__q6kx8 *o)
{
    size_t nb = src->n_in / 256, groups = src->n_out / 8;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o++)
            for (int r = 0; r < 8; r++) {
                const uint8_t *p =
                    (const uint8_t *)src->data + (8 * g + r) * src->row_bytes + Q6K_BYTES * b;
                quads(o->ql, p, 4, r);
                quads(o->qh, p + 128, 2, r);
                for (int j = 0; j < 16; j++)
                    o->sc[j][r] = (int8_t)p[192 + j];
                memcpy(&o->d[r], p + 208, 2);
            }
}

static void to_x8_iq4xs(const kern_mat *src, kern__iq4xsx8 *o)
{
    size_t nb = src->n_in / 256, groups = src->n_out / 8;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o++)
            for (int r = 0; r < 8; r++) {
                const uint8_t *p =
                    (const uint8_t *)src->data + (8 * g + r) * src->row_bytes + IQ4XS_BYTES * b;
                memcpy(&o->d[r], p, 2);
                unsigned sh = (unsigned)p[2] | (unsigned)p[3] << 8;
                for (int j = 0; j < 8; j++) {
                    int lo = p[4 + j / 2] >> (4 * (j % 2)) & 15, hi = sh >> (2 * j) & 3;
                    o->sc[j][r] = (int8_t)((lo | hi << 4) - 32);
                    quads_n(o->qs[j], p + 8 + 16 * j, 4, r);
                }
            }
}

static void to_x8_q3k(const kern_mat *src, kern__q3kx8 *o)
{
    size_t nb = src->n_in / 256, groups = src->n_out / 8;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o++)
            for (int r = 0; r < 8; r++) {
                const uint8_t *p =
                    (const uint8_t *)src->data + (8 * g + r) * src->row_bytes + Q3K_BYTES * b;
                quads(o->hm, p, 1, r);
                quads(o->qs, p + 32, 2, r);
                const uint8_t *s = p + 96; /* ggml's 12-byte packing: low nibbles, 2 high bits */
                for (int j = 0; j < 16; j++) {
                    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4,
                        hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                    o->sc[j][r] = (int8_t)((lo | hi << 4) - 32);
                }
                memcpy(&o->d[r], p + 108, 2);
            }
}

static void to_x8_q2k(const kern_mat *src, kern__q2kx8 *o)
{
    size_t nb = src->n_in / 256, groups = src->n_out / 8;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o++)
            for (int r = 0; r < 8; r++) {
                const uint8_t *p =
                    (const uint8_t *)src->data + (8 * g + r) * src->row_bytes + Q2K_BYTES * b;
                for (int j = 0; j < 16; j++)
                    o->sc[j][r] = p[j];
                quads(o->qs, p + 16, 2, r);
                memcpy(&o->d[r], p + 80, 2);
                memcpy(&o->dmin[r], p + 82, 2);
            }
}

/* Q4_K's or Q5_K's d, dmin, scales and mins of row r at p into the group's fields */
static void head_q45k(uint16_t *d, uint16_t *dmin, uint8_t (*sc)[8], uint8_t (*mn)[8],
                      const uint8_t *p, int r)
{
    const uint8_t *s = p + 4;
    memcpy(&d[r], p, 2);
    memcpy(&dmin[r], p + 2, 2);
    for (int j = 0; j < 4; j++) { /* ggml's get_scale_min_k4 */
        sc[j][r] = s[j] & 63;
        mn[j][r] = s[j + 4] & 63;
        sc[j + 4][r] = (uint8_t)((s[j + 8] & 15) | (s[j] >> 6) << 4);
        mn[j + 4][r] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

/* and back: every bit of the 12 scale bytes */
static void unhead_q45k(uint8_t *p, const uint16_t *d, const uint16_t *dmin, const uint8_t (*sc)[8],
                        const uint8_t (*mn)[8], int r)
{
    memcpy(p, &d[r], 2);
    memcpy(p + 2, &dmin[r], 2);
    for (int j = 0; j < 4; j++) {
        p[4 + j] = (uint8_t)(sc[j][r] | (sc[j + 4][r] >> 4) << 6);
        p[8 + j] = (uint8_t)(mn[j][r] | (mn[j + 4][r] >> 4) << 6);
        p[12 + j] = (uint8_t)((sc[j + 4][r] & 15) | (mn[j + 4][r] & 15) << 4);
    }
}

void kern_qdot_to_x8(const kern_mat *src_in, void *dst, kern_mat *out)
{
    const kern_mat s = *src_in, *src = &s; /* out may be src_in */
    out->type = KERN_QUANT_X8;
    out->data = dst;
    out->n_out = s.n_out;
    out->n_in = s.n_in;
    out->row_bytes = s.row_bytes;
    out->qtype = s.type == KERN_Q8_0 ? KERN_GGML_Q8_0 : s.qtype;
    size_t nb = src->n_in / 256, groups = src->n_out / 8;
    const leg_fmt *lf = leg_of(src);
    if (lf) {
        to_x8_leg(src, lf, dst);
        return;
    }
    if (src->qtype == KERN_GGML_Q6_K) {
        to_x8_q6k(src, dst);
        return;
    }
    if (src->qtype == KERN_GGML_Q3_K) {
        to_x8_q3k(src, dst);
        return;
    }
    if (src->qtype == KERN_GGML_IQ4_XS) {
        to_x8_iq4xs(src, dst);
        return;
    }
    if (src->qtype == KERN_GGML_Q2_K) {
        to_x8_q2k(src, dst);
        return;
    }
    kern__q4kx8 *o4 = dst;
    kern__q5kx8 *o5 = dst;
    bool q5 = src->qtype == KERN_GGML_Q5_K;
    for (size_t g = 0; g < groups; g++)
        for (size_t b = 0; b < nb; b++, o4++, o5++)
            for (int r = 0; r < 8; r++) {
                const uint8_t *p = (const uint8_t *)src->data + (8 * g + r) * src->row_bytes +
                                   (q5 ? Q5K_BYTES : Q4K_BYTES) * b;
                if (q5) {
                    head_q45k(o5->d, o5->dmin, o5->sc, o5->mn, p, r);
                    quads(o5->qh, p + 16, 1, r);
                    quads(o5->qs, p + 48, 4, r);
                } else {
                    head_q45k(o4->d, o4->dmin, o4->sc, o4->mn, p, r);
                    quads(o4->qs, p + 16, 4, r);
                }
            }
}

void kern__x8_row(const kern_mat *w, size_t n, uint8_t *row)
{
    size_t nb = w->n_in / 256;
    int r = (int)(n % 8);
    const leg_fmt *lf = leg_of(w);
    if (lf) {
        const uint8_t *q = (const uint8_t *)w->data + n / 8 * (w->n_in / 32) * lf->group;
        for (size_t b = 0; b < w->n_in / 32; b++, q += lf->group) {
            uint8_t *p = row + lf->file * b;
            if (lf->e8)
                p[0] = q[r];
            else
                memcpy(p, q + 2 * r, 2);
            if (lf->mo)
                memcpy(p + lf->mo, q + lf->gm + 2 * r, 2);
            if (lf->ho) {
                uint32_t h = 0;
                for (int i = 0; i < 4; i++)
                    for (int k = 0; k < 8; k++)
                        h |= (uint32_t)(q[lf->gh + 4 * r + i] >> k & 1) << leg_value(k, i);
                for (int i = 0; i < 4; i++)
                    p[lf->ho + i] = (uint8_t)(h >> 8 * i);
            }
            for (int k = 0; k < lf->nq; k++)
                memcpy(p + lf->file - 4 * lf->nq + 4 * k, q + lf->gq + 32 * k + 4 * r, 4);
        }
    } else if (w->qtype == KERN_GGML_Q6_K) {
        const kern__q6kx8 *q = (const kern__q6kx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + Q6K_BYTES * b;
            unquads(p, q->ql, 4, r);
            unquads(p + 128, q->qh, 2, r);
            for (int j = 0; j < 16; j++)
                p[192 + j] = (uint8_t)q->sc[j][r];
            memcpy(p + 208, &q->d[r], 2);
        }
    } else if (w->qtype == KERN_GGML_IQ4_XS) {
        const kern__iq4xsx8 *q = (const kern__iq4xsx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + IQ4XS_BYTES * b;
            memcpy(p, &q->d[r], 2);
            memset(p + 2, 0, 6);
            for (int j = 0; j < 8; j++) {
                int v = q->sc[j][r] + 32;
                p[4 + j / 2] |= (uint8_t)((v & 15) << (4 * (j % 2)));
                p[2 + j / 4] |= (uint8_t)((v >> 4) << (2 * (j % 4)));
                for (int k = 0; k < 4; k++)
                    memcpy(p + 8 + 16 * j + 4 * k, &q->qs[j][k][4 * r], 4);
            }
        }
    } else if (w->qtype == KERN_GGML_Q3_K) {
        const kern__q3kx8 *q = (const kern__q3kx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + Q3K_BYTES * b;
            unquads(p, q->hm, 1, r);
            unquads(p + 32, q->qs, 2, r);
            uint8_t *s = p + 96;
            memset(s, 0, 12);
            for (int j = 0; j < 16; j++) {
                int v = q->sc[j][r] + 32;
                s[j % 8] |= (uint8_t)((v & 15) << (j < 8 ? 0 : 4));
                s[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
            }
            memcpy(p + 108, &q->d[r], 2);
        }
    } else if (w->qtype == KERN_GGML_Q2_K) {
        const kern__q2kx8 *q = (const kern__q2kx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + Q2K_BYTES * b;
            for (int j = 0; j < 16; j++)
                p[j] = q->sc[j][r];
            unquads(p + 16, q->qs, 2, r);
            memcpy(p + 80, &q->d[r], 2);
            memcpy(p + 82, &q->dmin[r], 2);
        }
    } else if (w->qtype == KERN_GGML_Q5_K) {
        const kern__q5kx8 *q = (const kern__q5kx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + Q5K_BYTES * b;
            unhead_q45k(p, q->d, q->dmin, q->sc, q->mn, r);
            unquads(p + 16, q->qh, 1, r);
            unquads(p + 48, q->qs, 4, r);
        }
    } else {
        const kern__q4kx8 *q = (const kern__q4kx8 *)w->data + n / 8 * nb;
        for (size_t b = 0; b < nb; b++, q++) {
            uint8_t *p = row + Q4K_BYTES * b;
            unhead_q45k(p, q->d, q->dmin, q->sc, q->mn, r);
            unquads(p + 16, q->qs, 4, r);
        }
    }
}
