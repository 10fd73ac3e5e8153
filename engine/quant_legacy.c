/* Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 values with an f16 scale d (the _1 types add an f16
 * offset m). Quants are packed two a byte, value j in the low nibble of byte j and value j + 16
 * in its high nibble; the 5-bit types keep each value's fifth bit in a little-endian u32 (bit j
 * for value j). A value is d * q with q signed (_0), or (d * q) + m with q unsigned (_1). */
#include "engine/quant_internal.h"

enum { QK = 32 };

/* The 32 quants of qs (low nibbles first), each with its fifth bit from qh (0 for 4-bit types),
 * less bias. */
static void unpack32(const uint8_t *qs, uint32_t qh, int bias, int q[QK])
{
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int)((qs[j] & 0x0f) | ((qh >> j) & 1) << 4) - bias;
        q[j + QK / 2] = (int)((qs[j] >> 4) | ((qh >> (j + QK / 2)) & 1) << 4) - bias;
    }
}

static uint32_t u32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* d (2 bytes) | qs (16) */
void dtype__q4_0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    int q[QK];
    for (size_t b = 0; b < n / QK; b++, p += 18, dst += QK) {
        float d = dtype__f16_at(p);
        unpack32(p + 2, 0, 8, q);
        for (int j = 0; j < QK; j++)
            dst[j] = d * (float)q[j];
    }
}

/* d (2) | m (2) | qs (16) */
void dtype__q4_1_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    int q[QK];
    for (size_t b = 0; b < n / QK; b++, p += 20, dst += QK) {
        float d = dtype__f16_at(p), m = dtype__f16_at(p + 2);
        unpack32(p + 4, 0, 0, q);
        for (int j = 0; j < QK; j++)
            dst[j] = d * (float)q[j] + m;
    }
}

/* d (2) | qh (4) | qs (16) */
void dtype__q5_0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    int q[QK];
    for (size_t b = 0; b < n / QK; b++, p += 22, dst += QK) {
        float d = dtype__f16_at(p);
        unpack32(p + 6, u32_at(p + 2), 16, q);
        for (int j = 0; j < QK; j++)
            dst[j] = d * (float)q[j];
    }
}

/* d (2) | m (2) | qh (4) | qs (16) */
void dtype__q5_1_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    int q[QK];
    for (size_t b = 0; b < n / QK; b++, p += 24, dst += QK) {
        float d = dtype__f16_at(p), m = dtype__f16_at(p + 2);
        unpack32(p + 8, u32_at(p + 4), 0, q);
        for (int j = 0; j < QK; j++)
            dst[j] = d * (float)q[j] + m;
    }
}
