/* The K-quants Q2_K .. Q6_K: super-blocks of 256 values (QK_K) in sub-blocks of 16 or 32 that
 * each have an integer scale (and for Q2_K, Q4_K, Q5_K an integer min), both multiplied by the
 * super-block's f16 d (dmin) first. A value is (d * scale) * q, or (d * scale) * q - (dmin * min),
 * every product and difference rounded to float in that order. Quants of 2 bits sit four a
 * byte, low bits first, across 32 consecutive bytes; 4-bit ones two a byte; high bits come from
 * separate bit planes. Block layouts as ggml-common.h; arithmetic as gguf-py's quants.py. */
#include "engine/quant_internal.h"

enum { QK_K = 256 };

/* The 2-bit field of value e (0..255) in a Q2_K / Q3_K qs array of 64 bytes: values 0..127 in
 * bytes 0..31 and 128..255 in bytes 32..63, four 32-value rows per byte run, low bits first. */
static int crumb_at(const uint8_t *qs, int e)
{
    return (qs[(e >> 7) * 32 + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

/* The 4-bit field of value e in a Q4_K / Q5_K qs array of 128 bytes: each run of 32 bytes holds
 * 64 values, the first 32 in the low nibbles. */
static int nibble_at(const uint8_t *qs, int e)
{
    return (qs[(e >> 6) * 32 + (e & 31)] >> (4 * ((e >> 5) & 1))) & 0x0f;
}

/* scales (16) | qs (64) | d (2) | dmin (2); 16 sub-blocks of 16, each byte a 4-bit scale (low)
 * and a 4-bit min (high). */
void dtype__q2_k_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / QK_K; b++, p += 84, dst += QK_K) {
        const uint8_t *sc = p, *qs = p + 16;
        float d = dtype__f16_at(p + 80), dmin = dtype__f16_at(p + 82);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(sc[s] & 0x0f);
            float ml = dmin * (float)(sc[s] >> 4);
            for (int e = s * 16; e < s * 16 + 16; e++)
                dst[e] = dl * (float)crumb_at(qs, e) - ml;
        }
    }
}

/* hmask (32) | qs (64) | scales (12) | d (2); 16 sub-blocks of 16 with 6-bit scales stored less
 * 32: the low 4 bits of scale i in byte i % 8 (low nibble for i < 8), its high 2 bits in byte
 * 8 + i % 4 at bit 2 * (i / 4). A value's third bit is bit e / 32 of hmask[e % 32]; when it is
 * clear the 2-bit quant is less 4. */
void dtype__q3_k_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / QK_K; b++, p += 110, dst += QK_K) {
        const uint8_t *hmask = p, *qs = p + 32, *sc = p + 96;
        float d = dtype__f16_at(p + 108);
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
            int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            float dl = d * (float)((lo | hi << 4) - 32);
            for (int e = s * 16; e < s * 16 + 16; e++) {
                int h = (hmask[e & 31] >> (e >> 5)) & 1;
                dst[e] = dl * (float)(crumb_at(qs, e) - (h ? 0 : 4));
            }
        }
    }
}

/* The 6-bit scale and min of sub-block j (0..7) from the 12 bytes Q4_K and Q5_K share: for
 * j < 4 the low 6 bits of bytes j and j + 4; for j >= 4 the nibbles of byte j + 4 (scale low,
 * min high) with the top 2 bits of bytes j - 4 and j above them. */
static void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* d (2) | dmin (2) | scales (12) | qs (128); 8 sub-blocks of 32. */
void dtype__q4_k_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / QK_K; b++, p += 144, dst += QK_K) {
        float d = dtype__f16_at(p), dmin = dtype__f16_at(p + 2);
        const uint8_t *qs = p + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(p + 4, j, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int e = j * 32; e < j * 32 + 32; e++)
                dst[e] = dl * (float)nibble_at(qs, e) - ml;
        }
    }
}

/* d (2) | dmin (2) | scales (12) | qh (32) | qs (128); as Q4_K with a fifth bit, bit e / 32 of
 * qh[e % 32]. */
void dtype__q5_k_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / QK_K; b++, p += 176, dst += QK_K) {
        float d = dtype__f16_at(p), dmin = dtype__f16_at(p + 2);
        const uint8_t *qh = p + 16, *qs = p + 48;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(p + 4, j, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            for (int e = j * 32; e < j * 32 + 32; e++) {
                int q = nibble_at(qs, e) | ((qh[e & 31] >> (e >> 5)) & 1) << 4;
                dst[e] = dl * (float)q - ml;
            }
        }
    }
}

/* ql (128) | qh (64) | scales (16, int8) | d (2); 16 sub-blocks of 16, quants of 6 bits less
 * 32. Each half of 128 values has 64 bytes of ql (values 0..63 in the low nibbles, 64..127 in
 * the high) and 32 bytes of qh (the top 2 bits of four 32-value rows, low bits first). */
void dtype__q6_k_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / QK_K; b++, p += 210, dst += QK_K) {
        const uint8_t *ql = p, *qh = p + 128, *sc = p + 192;
        float d = dtype__f16_at(p + 208);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(int8_t)sc[s];
            for (int e = s * 16; e < s * 16 + 16; e++) {
                int h = e >> 7, r = e & 127;
                int lo = (ql[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 0x0f;
                int hi = (qh[h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
                dst[e] = dl * (float)((lo | hi << 4) - 32);
            }
        }
    }
}
