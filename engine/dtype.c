/* The GGUF tensor type table (values and block layouts as ggml's ggml.h and ggml-common.h).
 * kvserve loads the rows with a to_f32; the others are known so a file using them can be read
 * and refused by name. */
#include "engine/dtype.h"

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

/* K-quants and i-quants pack 256 values (QK_K) per block. */
static const dtype_info TYPES[] = {
    {0, "F32", 1, 4, f32_to_f32},
    {1, "F16", 1, 2, f16_to_f32},
    {2, "Q4_0", 32, 18, NULL},
    {3, "Q4_1", 32, 20, NULL},
    {6, "Q5_0", 32, 22, NULL},
    {7, "Q5_1", 32, 24, NULL},
    {8, "Q8_0", 32, 34, q8_0_to_f32},
    {9, "Q8_1", 32, 36, NULL},
    {10, "Q2_K", 256, 84, NULL},
    {11, "Q3_K", 256, 110, NULL},
    {12, "Q4_K", 256, 144, NULL},
    {13, "Q5_K", 256, 176, NULL},
    {14, "Q6_K", 256, 210, NULL},
    {15, "Q8_K", 256, 292, NULL},
    {16, "IQ2_XXS", 256, 66, NULL},
    {17, "IQ2_XS", 256, 74, NULL},
    {18, "IQ3_XXS", 256, 98, NULL},
    {19, "IQ1_S", 256, 50, NULL},
    {20, "IQ4_NL", 32, 18, NULL},
    {21, "IQ3_S", 256, 110, NULL},
    {22, "IQ2_S", 256, 82, NULL},
    {23, "IQ4_XS", 256, 136, NULL},
    {24, "I8", 1, 1, NULL},
    {25, "I16", 1, 2, NULL},
    {26, "I32", 1, 4, NULL},
    {27, "I64", 1, 8, NULL},
    {28, "F64", 1, 8, NULL},
    {29, "IQ1_M", 256, 56, NULL},
    {30, "BF16", 1, 2, bf16_to_f32},
    {34, "TQ1_0", 256, 54, NULL},
    {35, "TQ2_0", 256, 66, NULL},
    {39, "MXFP4", 32, 17, NULL},
    /* newer than this table's layouts: named in refusals, not readable */
    {40, "NVFP4", 0, 0, NULL},
    {41, "Q1_0", 0, 0, NULL},
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
    return "F32, F16, BF16, Q8_0";
}
