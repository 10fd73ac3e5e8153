/* MXFP4 (the OCP microscaling format's FP4, gpt-oss's expert weights): blocks of 32 values, one
 * E8M0 exponent byte e, then 16 bytes of nibbles (value j in the low nibble of byte j, j + 16 in
 * its high one, as Q4_0). A value is 2^(e - 128) * level[nibble], the levels E2M1's values
 * doubled (so integers), the scale halved to match (gguf-py's MXFP4 class). */
#include "engine/quant_internal.h"

/* E2M1's 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled (nibble 8 is -0: 0 here) */
static const int8_t LEVELS[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* e (1) | qs (16). The product d * level is exact (levels have at most two significant bits)
 * unless it overflows: 2^127 * 12 is +inf, as in gguf-py's float32 product. */
void dtype__mxfp4_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / 32; b++, p += 17, dst += 32) {
        float d = dtype_e8m0_half_to_f32(p[0]);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)LEVELS[p[1 + j] & 0x0f];
            dst[j + 16] = d * (float)LEVELS[p[1 + j] >> 4];
        }
    }
}
