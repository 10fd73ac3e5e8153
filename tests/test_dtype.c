/* Dequantizers of engine/dtype's table, on hand-made blocks: the test packs chosen fields
 * (scales from the f16 extremes, subnormals, signed zeros; every stored scale, min and quant
 * value at every position) the way ggml's quantizers lay them out, and each widened value must
 * have the bits of the format's formula, evaluated here in float32 in gguf-py's order; a few
 * blocks with values worked out by hand; zero blocks; which types the loader takes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine/dtype.h"

/* An f16 widened with ldexpf, not the library's bit shuffling (finite values only). */
static float half(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    assert_true(e < 31);
    float v = e ? ldexpf((float)(m | 1024), e - 25) : ldexpf((float)m, -24);
    return h & 0x8000 ? -v : v;
}

static void put16(uint8_t *p, unsigned v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ggml's kvalues_iq4nl */
static const int LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

/* The fields of one block, as stored: unsigned bit fields (Q6_K's scales are int8). */
typedef struct fields {
    uint16_t d, m; /* f16: the scale, and the min (_1 types) or dmin (K types) */
    int sc[16], mn[16];
    int q[256];
} fields;

/* ---- packers: block layouts as ggml-common.h, loops as ggml's quantize_row_*_ref ---- */

static void pack_nibbles32(const int *q, uint8_t *qs) /* value j low, j + 16 high */
{
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
}

static void pack_qh32(const int *q, uint8_t *p) /* fifth bits, little-endian u32 */
{
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++)
        qh |= (uint32_t)(q[j] >> 4 & 1) << j;
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(qh >> 8 * k);
}

static void pack_q4_0(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    pack_nibbles32(f->q, b + 2);
}

static void pack_q4_1(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    put16(b + 2, f->m);
    pack_nibbles32(f->q, b + 4);
}

static void pack_q5_0(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    pack_qh32(f->q, b + 2);
    pack_nibbles32(f->q, b + 6);
}

static void pack_q5_1(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    put16(b + 2, f->m);
    pack_qh32(f->q, b + 4);
    pack_nibbles32(f->q, b + 8);
}

static void pack_crumbs(const int *L, uint8_t *qs) /* 2-bit fields of Q2_K and Q3_K */
{
    for (int j = 0; j < 256; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)((L[j + l] & 3) | (L[j + l + 32] & 3) << 2 |
                                      (L[j + l + 64] & 3) << 4 | (L[j + l + 96] & 3) << 6);
}

static void pack_q2_k(const fields *f, uint8_t *b)
{
    for (int i = 0; i < 16; i++)
        b[i] = (uint8_t)(f->sc[i] | f->mn[i] << 4);
    pack_crumbs(f->q, b + 16);
    put16(b + 80, f->d);
    put16(b + 82, f->m);
}

static void pack_q3_k(const fields *f, uint8_t *b)
{
    uint8_t *hmask = b, *sc = b + 96;
    memset(b, 0, 110);
    for (int j = 0; j < 256; j++)
        if (f->q[j] > 3)
            hmask[j % 32] |= (uint8_t)(1 << (j / 32));
    pack_crumbs(f->q, b + 32);
    for (int j = 0; j < 16; j++) {
        int l = f->sc[j];
        if (j < 8)
            sc[j] = (uint8_t)(l & 15);
        else
            sc[j - 8] |= (uint8_t)((l & 15) << 4);
        sc[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
    }
    put16(b + 108, f->d);
}

static void pack_scales_k4(const fields *f, uint8_t *s) /* Q4_K / Q5_K: 8 x (6-bit sc, mn) */
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = f->sc[j], lm = f->mn[j];
        if (j < 4) {
            s[j] = (uint8_t)ls;
            s[j + 4] = (uint8_t)lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
}

static void pack_q4_k(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    put16(b + 2, f->m);
    pack_scales_k4(f, b + 4);
    uint8_t *qs = b + 16;
    for (int j = 0; j < 256; j += 64)
        for (int l = 0; l < 32; l++)
            qs[j / 2 + l] = (uint8_t)(f->q[j + l] | f->q[j + l + 32] << 4);
}

static void pack_q5_k(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    put16(b + 2, f->m);
    pack_scales_k4(f, b + 4);
    uint8_t *qh = b + 16, *ql = b + 48;
    memset(qh, 0, 32);
    int m1 = 1, m2 = 2;
    for (int n = 0; n < 256; n += 64, ql += 32, m1 <<= 2, m2 <<= 2)
        for (int j = 0; j < 32; j++) {
            int l1 = f->q[n + j], l2 = f->q[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= (uint8_t)m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= (uint8_t)m2;
            }
            ql[j] = (uint8_t)(l1 | l2 << 4);
        }
}

static void pack_q6_k(const fields *f, uint8_t *b)
{
    uint8_t *ql = b, *qh = b + 128;
    const int *L = f->q;
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((L[j + l] & 15) | (L[j + l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((L[j + l + 32] & 15) | (L[j + l + 96] & 15) << 4);
            qh[l] = (uint8_t)(L[j + l] >> 4 | (L[j + l + 32] >> 4) << 2 |
                              (L[j + l + 64] >> 4) << 4 | (L[j + l + 96] >> 4) << 6);
        }
    for (int i = 0; i < 16; i++)
        b[192 + i] = (uint8_t)(int8_t)f->sc[i];
    put16(b + 208, f->d);
}

static void pack_iq4_xs(const fields *f, uint8_t *b)
{
    put16(b, f->d);
    unsigned sh = 0;
    memset(b + 4, 0, 4);
    for (int i = 0; i < 8; i++) {
        sh |= (unsigned)(f->sc[i] >> 4) << (2 * i);
        b[4 + i / 2] |= (uint8_t)((f->sc[i] & 15) << (4 * (i % 2)));
        pack_nibbles32(f->q + 32 * i, b + 8 + 16 * i);
    }
    put16(b + 2, sh);
}

/* ---- the formulas, in float32, each product rounded before the next operation ---- */

static float want_q4_0(const fields *f, int e)
{
    return half(f->d) * (float)(f->q[e] - 8);
}

static float want_q5_0(const fields *f, int e)
{
    return half(f->d) * (float)(f->q[e] - 16);
}

static float want_q_1(const fields *f, int e) /* Q4_1, Q5_1 */
{
    float dq = half(f->d) * (float)f->q[e];
    return dq + half(f->m);
}

static float want_q2_k(const fields *f, int e)
{
    float dl = half(f->d) * (float)f->sc[e / 16], ml = half(f->m) * (float)f->mn[e / 16];
    float dq = dl * (float)f->q[e];
    return dq - ml;
}

static float want_q3_k(const fields *f, int e)
{
    float dl = half(f->d) * (float)(f->sc[e / 16] - 32);
    return dl * (float)(f->q[e] - 4);
}

static float want_q45_k(const fields *f, int e) /* Q4_K, Q5_K */
{
    float dl = half(f->d) * (float)f->sc[e / 32], ml = half(f->m) * (float)f->mn[e / 32];
    float dq = dl * (float)f->q[e];
    return dq - ml;
}

static float want_q6_k(const fields *f, int e)
{
    float dl = half(f->d) * (float)f->sc[e / 16];
    return dl * (float)(f->q[e] - 32);
}

static float want_iq4_nl(const fields *f, int e)
{
    return half(f->d) * (float)LEVELS[f->q[e]];
}

static float want_iq4_xs(const fields *f, int e)
{
    float dl = half(f->d) * (float)(f->sc[e / 32] - 32);
    return dl * (float)LEVELS[f->q[e]];
}

typedef struct qtype {
    uint32_t id;
    int block, bytes;
    int q_range;  /* stored quants are 0 .. q_range - 1 */
    int sc_range; /* stored scales and mins 0 .. sc_range - 1 (Q6_K: -128 .. 127); 0 = none */
    void (*pack)(const fields *f, uint8_t *blk);
    float (*want)(const fields *f, int e);
} qtype;

static const qtype QTYPES[] = {
    {2, 32, 18, 16, 0, pack_q4_0, want_q4_0},
    {3, 32, 20, 16, 0, pack_q4_1, want_q_1},
    {6, 32, 22, 32, 0, pack_q5_0, want_q5_0},
    {7, 32, 24, 32, 0, pack_q5_1, want_q_1},
    {10, 256, 84, 4, 16, pack_q2_k, want_q2_k},
    {11, 256, 110, 8, 64, pack_q3_k, want_q3_k},
    {12, 256, 144, 16, 64, pack_q4_k, want_q45_k},
    {13, 256, 176, 32, 64, pack_q5_k, want_q45_k},
    {14, 256, 210, 64, 256, pack_q6_k, want_q6_k},
    {20, 32, 18, 16, 0, pack_q4_0, want_iq4_nl}, /* IQ4_NL: Q4_0's layout, table levels */
    {23, 256, 136, 16, 64, pack_iq4_xs, want_iq4_xs},
};

/* f16 scales: zeros of both signs, the smallest and largest subnormals, the smallest normal,
 * +-1, an inexact third, the largest finite of both signs. */
static const uint16_t SCALES[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400,
                                  0x3c00, 0xbc00, 0x3555, 0x7bff, 0xfbff};
#define N_SCALES (sizeof SCALES / sizeof SCALES[0])
#define ROW_BLOCKS 3

/* Block b of a row for (scale index di, seed s): as s runs over 0..255, every position of q,
 * sc and mn takes every value its field can hold (the strides 5, 7, 3 are odd). */
static void make_fields(const qtype *t, size_t di, int s, int b, fields *f)
{
    memset(f, 0, sizeof *f);
    f->d = SCALES[(di + (size_t)b) % N_SCALES];
    f->m = SCALES[(di + (size_t)s + 3 * (size_t)b) % N_SCALES];
    for (int i = 0; i < 16 && t->sc_range; i++) {
        f->sc[i] = (i * 7 + s + b) % t->sc_range;
        f->mn[i] = (i * 5 + 3 * (s + b)) % t->sc_range;
        if (t->id == 14)
            f->sc[i] -= 128; /* int8 */
    }
    for (int e = 0; e < t->block; e++)
        f->q[e] = (e * 5 + s + b) % t->q_range;
}

static void test_exact(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof QTYPES / sizeof QTYPES[0]; k++) {
        const qtype *t = &QTYPES[k];
        const dtype_info *dt = dtype_get(t->id);
        assert_non_null(dt);
        assert_non_null(dt->to_f32);
        assert_int_equal(dt->block, t->block);
        assert_int_equal(dt->block_bytes, t->bytes);
        uint8_t row[ROW_BLOCKS * 256];
        float got[ROW_BLOCKS * 256];
        fields f[ROW_BLOCKS];
        for (size_t di = 0; di < N_SCALES; di++)
            for (int s = 0; s < 256; s++) {
                for (int b = 0; b < ROW_BLOCKS; b++) {
                    make_fields(t, di, s, b, &f[b]);
                    t->pack(&f[b], row + b * t->bytes);
                }
                dt->to_f32(row, got, (size_t)(ROW_BLOCKS * t->block));
                for (int b = 0; b < ROW_BLOCKS; b++)
                    for (int e = 0; e < t->block; e++) {
                        float w = t->want(&f[b], e), g = got[b * t->block + e];
                        uint32_t wb, gb;
                        memcpy(&wb, &w, 4);
                        memcpy(&gb, &g, 4);
                        if (wb != gb)
                            fail_msg("%s d=0x%04x m=0x%04x seed %d block %d value %d: got %a "
                                     "(0x%08x), want %a (0x%08x)",
                                     dt->name, f[b].d, f[b].m, s, b, e, (double)g, gb, (double)w,
                                     wb);
                    }
            }
    }
}

/* Blocks whose values are worked out by hand. */
static void test_by_hand(void **state)
{
    (void)state;
    float v[256];
    uint8_t b[256];

    /* Q4_0, d = 1: nibble 0 is -8, nibble 15 is 7, nibble 8 is 0 */
    memset(b, 0x88, 18);
    put16(b, 0x3c00);
    b[2] = 0xf0;
    dtype_get(2)->to_f32(b, v, 32);
    assert_true(v[0] == -8.0f && v[16] == 7.0f && v[1] == 0.0f && v[31] == 0.0f);

    /* Q5_1, d = 0.5, m = -2: value 0 has q 15 + 16 = 31 (13.5), value 16 has q 1 + 16 = 17
     * (6.5), value 1 has q 0 (-2) */
    memset(b, 0, 24);
    put16(b, 0x3800);
    put16(b + 2, 0xc000);
    b[4] = 0x01;
    b[6] = 0x01; /* qh bits 0 and 16 */
    b[8] = 0x1f;
    dtype_get(7)->to_f32(b, v, 32);
    assert_true(v[0] == 13.5f && v[16] == 6.5f && v[1] == -2.0f);

    /* Q3_K, d = 1, every scale 1 | 2 << 4 = 33 (less 32: 1), crumbs 0,1,2,3 across the four
     * 32-value rows; with the hmask bits set the quant is the crumb, clear it is less 4 */
    memset(b, 0xff, 32);
    memset(b + 32, 0xe4, 64);
    memset(b + 96, 0x11, 8);
    memset(b + 104, 0xaa, 4);
    put16(b + 108, 0x3c00);
    dtype_get(11)->to_f32(b, v, 256);
    assert_true(v[0] == 0.0f && v[32] == 1.0f && v[64] == 2.0f && v[96] == 3.0f && v[128] == 0.0f &&
                v[255] == 3.0f);
    memset(b, 0, 32);
    dtype_get(11)->to_f32(b, v, 256);
    assert_true(v[0] == -4.0f && v[96] == -1.0f && v[200] == -2.0f);

    /* Q4_K, d = 1, dmin = 0.5, every scale 2 and min 3; nibbles 1 (low) and 5 (high):
     * 2 * 1 - 1.5 and 2 * 5 - 1.5 */
    memset(b, 0, 144);
    put16(b, 0x3c00);
    put16(b + 2, 0x3800);
    memset(b + 4, 2, 4);
    memset(b + 8, 3, 4);
    memset(b + 12, 0x32, 4);
    memset(b + 16, 0x51, 128);
    dtype_get(12)->to_f32(b, v, 256);
    assert_true(v[0] == 0.5f && v[31] == 0.5f && v[32] == 8.5f && v[255] == 8.5f);

    /* Q6_K, d = 0.25, every scale -1, low nibbles 0 and high bits 3: q = 48 - 32 = 16 */
    memset(b, 0, 128);
    memset(b + 128, 0xff, 64);
    memset(b + 192, 0xff, 16);
    put16(b + 208, 0x3400);
    dtype_get(14)->to_f32(b, v, 256);
    for (int e = 0; e < 256; e++)
        assert_true(v[e] == -4.0f);

    /* IQ4_XS, d = 1, every scale 1 | 2 << 4 = 33 (1): levels 0 (-127) and 15 (113) */
    put16(b, 0x3c00);
    put16(b + 2, 0xaaaa);
    memset(b + 4, 0x11, 4);
    memset(b + 8, 0xf0, 128);
    dtype_get(23)->to_f32(b, v, 256);
    assert_true(v[0] == -127.0f && v[15] == -127.0f && v[16] == 113.0f && v[255] == 113.0f);
}

/* MXFP4 (e (1) | qs (16)): its scale is an E8M0 byte, not an f16, so its blocks are made here
 * apart from the table above: every exponent 0 .. 255 (the subnormal scales of e = 0, 1, the
 * overflow to infinity of the large ones times 12; gguf-py gives e = 255 the finite 2^127, not a
 * NaN), every nibble at every position. The want: ldexpf's 2^(e - 128) times the doubled E2M1
 * level, in float32 as gguf-py's d * level. */
static const int MX_LEVELS[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void test_mxfp4(void **state)
{
    (void)state;
    const dtype_info *dt = dtype_get(39);
    assert_non_null(dt);
    assert_string_equal(dt->name, "MXFP4");
    assert_non_null(dt->to_f32);
    assert_int_equal(dt->block, 32);
    assert_int_equal(dt->block_bytes, 17);
    uint8_t row[2 * 17];
    float got[64];
    for (int e = 0; e < 256; e++)
        for (int s = 0; s < 16; s++) {
            int q[64];
            for (int b = 0; b < 2; b++) {
                uint8_t *p = row + 17 * b;
                p[0] = (uint8_t)(b ? 255 - e : e); /* the second block from the other end */
                for (int j = 0; j < 32; j++)
                    q[32 * b + j] = (j * 5 + s + 3 * b) % 16;
                pack_nibbles32(q + 32 * b, p + 1);
            }
            dt->to_f32(row, got, 64);
            for (int i = 0; i < 64; i++) {
                float w = ldexpf(1.0f, row[17 * (i / 32)] - 128) * (float)MX_LEVELS[q[i]];
                uint32_t wb, gb;
                memcpy(&wb, &w, 4);
                memcpy(&gb, &got[i], 4);
                if (wb != gb)
                    fail_msg("MXFP4 e=%d seed %d value %d: got %a (0x%08x), want %a (0x%08x)",
                             row[17 * (i / 32)], s, i, (double)got[i], gb, (double)w, wb);
            }
        }

    /* by hand (the bits gguf-py prints): e = 127 scales by 1/2, so nibble 1 is 0.5, 7 is 6, 15 is
     * -6; e = 0, 1 are 2^-128 (0x00200000), 2^-127; e = 255 is 2^127 (0x7f000000), times 12 +inf;
     * nibble 8 is +0 */
    static const struct {
        uint8_t e, byte; /* byte 0 of qs: value 0 low, value 16 high */
        uint32_t v0, v16;
    } HAND[] = {{127, 0x71, 0x3f000000, 0x40c00000}, {127, 0xf8, 0x00000000, 0xc0c00000},
                {0, 0x01, 0x00200000, 0x00000000},   {1, 0x01, 0x00400000, 0x00000000},
                {255, 0x71, 0x7f000000, 0x7f800000}, {254, 0xf1, 0x7e800000, 0xff800000},
                {128, 0x95, 0x40c00000, 0xbf800000}};
    for (size_t h = 0; h < sizeof HAND / sizeof HAND[0]; h++) {
        memset(row, 0, 17);
        row[0] = HAND[h].e;
        row[1] = HAND[h].byte;
        dt->to_f32(row, got, 32);
        uint32_t b0, b16;
        memcpy(&b0, &got[0], 4);
        memcpy(&b16, &got[16], 4);
        if (b0 != HAND[h].v0 || b16 != HAND[h].v16)
            fail_msg("MXFP4 e=%d byte 0x%02x: 0x%08x 0x%08x, want 0x%08x 0x%08x", HAND[h].e,
                     HAND[h].byte, b0, b16, HAND[h].v0, HAND[h].v16);
        for (int i = 1; i < 32; i++)
            assert_true(i == 16 || got[i] == 0.0f);
    }
}

/* All-zero blocks widen to zeros (of either sign) in every type with a dequantizer. */
static void test_zero_blocks(void **state)
{
    (void)state;
    static const uint8_t zero[2 * 292];
    float v[512];
    for (uint32_t id = 0; id < 64; id++) {
        const dtype_info *t = dtype_get(id);
        if (!t || !t->to_f32)
            continue;
        size_t n = 2 * (t->block == 1 ? 32 : t->block);
        assert_true(n <= 512 && dtype_nbytes(id, n) <= sizeof zero);
        t->to_f32(zero, v, n);
        for (size_t i = 0; i < n; i++)
            if (v[i] != 0.0f)
                fail_msg("%s: value %zu of a zero block is %g", t->name, i, (double)v[i]);
    }
}

/* The loader takes exactly the types it has kernels for (F32, F16, Q8_0 panels, BF16 widened,
 * and the quantized panels of kern/quant.h), each has a to_f32, and they are the supported list a
 * refusal names, in this order. */
static void test_loadable(void **state)
{
    (void)state;
    static const char *const LOADS[] = {"F32",  "F16",    "BF16",   "Q8_0", "Q4_0", "Q4_1",
                                        "Q5_0", "Q5_1",   "Q2_K",   "Q3_K", "Q4_K", "Q5_K",
                                        "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"};
    enum { N_LOADS = sizeof LOADS / sizeof LOADS[0] };
    int n_loadable = 0;
    for (uint32_t id = 0; id < 64; id++) {
        const dtype_info *t = dtype_get(id);
        if (!t)
            continue;
        bool listed = false;
        for (size_t i = 0; i < N_LOADS; i++)
            listed |= !strcmp(t->name, LOADS[i]);
        assert_int_equal(t->loadable, listed);
        if (listed)
            assert_non_null(t->to_f32);
        if (t->loadable)
            n_loadable++;
    }
    assert_int_equal(n_loadable, N_LOADS);
    char want[256] = "";
    for (size_t i = 0; i < N_LOADS; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? ", " : "", LOADS[i]);
    assert_string_equal(dtype_supported_list(), want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),    cmocka_unit_test(test_by_hand),
        cmocka_unit_test(test_mxfp4),    cmocka_unit_test(test_zero_blocks),
        cmocka_unit_test(test_loadable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
