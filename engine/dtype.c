/* The GGUF tensor type table (values and block layouts as ggml's ggml.h and ggml-common.h).
 * kvserve loads the loadable rows; the others are known so a file using them can be read and
 * refused by name, and those with a to_f32 (engine/quant_*.c) widen exactly all the same. */
#include "engine/dtype.h"
#include "engine/quant_internal.h"

static void f32_to_f32(const void *src, float *dst, size_t n)
{
    memcpy(dst, src, n * sizeof(float));
}

static void f16_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = dtype_f16_to_f32(h);
    }
}

static void bf16_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = dtype_bf16_to_f32(h);
    }
}

/* Blocks of an f16 scale d and 32 int8 q: the value is d * q rounded to float, as ggml. */
static void q8_0_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t b = 0; b < n / 32; b++, p += 34) {
        uint16_t h;
        memcpy(&h, p, 2);
        float d = dtype_f16_to_f32(h);
        for (int k = 0; k < 32; k++)
            dst[b * 32 + (size_t)k] = d * (float)(int8_t)p[2 + k];
    }
}

/* K-quants and i-quants pack 256 values (QK_K) per block. The loadable rows must be the ones
 * dtype_supported_list names (tests/test_kernels.c checks). */
static const dtype_info TYPES[] = {
    {0, "F32", 1, 4, f32_to_f32, true},
    {1, "F16", 1, 2, f16_to_f32, true},
    {2, "Q4_0", 32, 18, dtype__q4_0_to_f32, true},
    {3, "Q4_1", 32, 20, dtype__q4_1_to_f32, true},
    {6, "Q5_0", 32, 22, dtype__q5_0_to_f32, true},
    {7, "Q5_1", 32, 24, dtype__q5_1_to_f32, true},
    {8, "Q8_0", 32, 34, q8_0_to_f32, true},
    {9, "Q8_1", 32, 36, NULL, false},
    {10, "Q2_K", 256, 84, dtype__q2_k_to_f32, true},
    {11, "Q3_K", 256, 110, dtype__q3_k_to_f32, true},
    {12, "Q4_K", 256, 144, dtype__q4_k_to_f32, true},
    {13, "Q5_K", 256, 176, dtype__q5_k_to_f32, true},
    {14, "Q6_K", 256, 210, dtype__q6_k_to_f32, true},
    {15, "Q8_K", 256, 292, NULL, false},
    {16, "IQ2_XXS", 256, 66, NULL, false},
    {17, "IQ2_XS", 256, 74, NULL, false},
    {18, "IQ3_XXS", 256, 98, NULL, false},
    {19, "IQ1_S", 256, 50, NULL, false},
    {20, "IQ4_NL", 32, 18, dtype__iq4_nl_to_f32, true},
    {21, "IQ3_S", 256, 110, NULL, false},
    {22, "IQ2_S", 256, 82, NULL, false},
    {23, "IQ4_XS", 256, 136, dtype__iq4_xs_to_f32, true},
    {24, "I8", 1, 1, NULL, false},
    {25, "I16", 1, 2, NULL, false},
    {26, "I32", 1, 4, NULL, false},
    {27, "I64", 1, 8, NULL, false},
    {28, "F64", 1, 8, NULL, false},
    {29, "IQ1_M", 256, 56, NULL, false},
    {30, "BF16", 1, 2, bf16_to_f32, true},
    {34, "TQ1_0", 256, 54, NULL, false},
    {35, "TQ2_0", 256, 66, NULL, false},
    {39, "MXFP4", 32, 17, dtype__mxfp4_to_f32, true},
    /* newer than this table's layouts: named in refusals, not readable */
    {40, "NVFP4", 0, 0, NULL, false},
    {41, "Q1_0", 0, 0, NULL, false},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

const dtype_info *dtype_get(uint32_t id)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (TYPES[i].id == id)
            return &TYPES[i];
    return NULL;
}

const char *dtype_name(uint32_t id)
{
    const dtype_info *t = dtype_get(id);
    return t ? t->name : "unknown";
}

uint64_t dtype_nbytes(uint32_t id, uint64_t n)
{
    const dtype_info *t = dtype_get(id);
    if (!t || !t->block || n % t->block)
        return 0;
    if (n / t->block > UINT64_MAX / t->block_bytes)
        return 0;
    return n / t->block * t->block_bytes;
}

const char *dtype_supported_list(void)
{
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
           "IQ4_XS, MXFP4";
}
