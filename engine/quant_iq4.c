/* IQ4_NL and IQ4_XS: 4-bit indices into one fixed non-linear table of 16 int8 levels. IQ4_NL
 * has blocks of 32 values with an f16 scale (nibbles as Q4_0: value j low, j + 16 high);
 * IQ4_XS has super-blocks of 256 with an f16 d and 6-bit sub-block scales stored less 32. A
 * value is d * level, or (d * scale) * level. */
#include "engine/quant_internal.h"

/* ggml's kvalues_iq4nl. */
static const int8_t LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

/* d (2) | qs (16) */
void dtype__iq4_nl_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / 32; b++, p += 18, dst += 32) {
        float d = dtype__f16_at(p);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)LEVELS[p[2 + j] & 0x0f];
            dst[j + 16] = d * (float)LEVELS[p[2 + j] >> 4];
        }
    }
}

/* d (2) | scales_h (2, u16) | scales_l (4) | qs (128); 8 sub-blocks of 32: scale i has its low
 * 4 bits in nibble i % 2 of scales_l[i / 2] and its high 2 bits at bit 2 i of scales_h; its 16
 * bytes of qs hold values 0..15 in the low nibbles, 16..31 in the high. */
void dtype__iq4_xs_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / 256; b++, p += 136, dst += 256) {
        float d = dtype__f16_at(p);
        unsigned sh = (unsigned)p[2] | (unsigned)p[3] << 8;
        const uint8_t *sl = p + 4, *qs = p + 8;
        for (int i = 0; i < 8; i++) {
            int lo = (sl[i / 2] >> (4 * (i % 2))) & 0x0f;
            int hi = (sh >> (2 * i)) & 3;
            float dl = d * (float)((lo | hi << 4) - 32);
            for (int k = 0; k < 16; k++) {
                dst[i * 32 + k] = dl * (float)LEVELS[qs[i * 16 + k] & 0x0f];
                dst[i * 32 + 16 + k] = dl * (float)LEVELS[qs[i * 16 + k] >> 4];
            }
        }
    }
}
