/* GGUF tensor types: one row per type id the format defines (its name, block size, bytes per
 * block, how to widen a row to F32 where kvserve can, and whether the loader takes it), so the
 * reader sizes any tensor and a refusal names the type and the supported list; and the fp16 /
 * bf16 conversions.
 * A leaf: includes only libc. The table is immutable; any thread may read it. */
#ifndef KVS_ENGINE_DTYPE_H
#define KVS_ENGINE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct dtype_info {
    uint32_t id;          /* ggml_type value as stored in the file */
    const char *name;     /* "F32", "Q4_K", ... as ggml_type_name */
    uint32_t block;       /* values per block; 0 = layout unknown to kvserve (not readable) */
    uint32_t block_bytes; /* bytes per block */
    /* Widens n values (n % block == 0) at src to F32 with the bits of llama.cpp's reference
     * dequantizer (gguf-py's gguf.quants.dequantize); NULL if kvserve has none for the type. */
    void (*to_f32)(const void *src, float *dst, size_t n);
    /* The model loader takes the type (it has the kernels or widens at load); a type can have
     * a to_f32 and not be loadable yet. */
    bool loadable;
} dtype_info;

/* The row for id, or NULL if the format defines no such type (ids 4, 5, 31-33, 36-38 were
 * removed from ggml; anything past the last known id). */
const dtype_info *dtype_get(uint32_t id);
/* The type's name, or "unknown". */
const char *dtype_name(uint32_t id);
/* Bytes of n values of type id, or 0 if the type's layout is unknown or n is not a whole
 * number of blocks (or the size overflows). */
uint64_t dtype_nbytes(uint32_t id, uint64_t n);
/* "F32, F16, BF16, Q8_0, Q4_0, ...": the types kvserve loads (the loadable rows), for refusals. */
const char *dtype_supported_list(void);

/* IEEE half to float: exact. */
static inline float dtype_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Float to half, rounding to nearest even as F16C's vcvtps2ph with rounding mode 0 (NaNs
 * become the quiet NaN 0x7e00 with the sign kept). */
static inline uint16_t dtype_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absx >= 0x477ff000u)              /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (113 - e) */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

/* bfloat16 to float: the top half of the float's bits, exact. */
static inline float dtype_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* An E8M0 byte as MXFP4's block scale (gguf-py's e8m0_to_fp32_half, ggml's
 * ggml_e8m0_to_fp32_half): the bits of the float 2^(e - 128), exact for every e (e = 0, 1 the
 * subnormals 2^-128, 2^-127; e = 255 is 2^127, not a NaN). The low 16 bits are always zero, so
 * the top half is the same value as a bfloat16. */
static inline uint32_t dtype_e8m0_half_bits(uint8_t e)
{
    return e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
}

static inline float dtype_e8m0_half_to_f32(uint8_t e)
{
    uint32_t bits = dtype_e8m0_half_bits(e);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
