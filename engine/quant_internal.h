/* Row dequantizers of the block-quantized GGUF types, shared by engine/quant_legacy.c,
 * engine/quant_k.c, engine/quant_iq4.c and engine/quant_mxfp4.c with engine/dtype.c's table that
 * registers them. Not a public header: names carry the dtype__ prefix. Each widens n values at src
 * (n a whole number of blocks) to F32 with the bits of llama.cpp's reference dequantizer
 * gguf.quants.dequantize (gguf-py): the same float32 operations in the same order, each rounded
 * before the next (the build turns off a * b + c fusion). */
#ifndef KVS_ENGINE_QUANT_INTERNAL_H
#define KVS_ENGINE_QUANT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/dtype.h"

/* The little-endian f16 at p (blocks are byte-packed: p need not be aligned), widened. */
static inline float dtype__f16_at(const uint8_t *p)
{
    return dtype_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* 32 values a block (engine/quant_legacy.c, engine/quant_iq4.c, engine/quant_mxfp4.c) */
void dtype__q4_0_to_f32(const void *src, float *dst, size_t n);
void dtype__q4_1_to_f32(const void *src, float *dst, size_t n);
void dtype__q5_0_to_f32(const void *src, float *dst, size_t n);
void dtype__q5_1_to_f32(const void *src, float *dst, size_t n);
void dtype__iq4_nl_to_f32(const void *src, float *dst, size_t n);
void dtype__mxfp4_to_f32(const void *src, float *dst, size_t n);

/* 256 values a block (engine/quant_k.c, engine/quant_iq4.c) */
void dtype__q2_k_to_f32(const void *src, float *dst, size_t n);
void dtype__q3_k_to_f32(const void *src, float *dst, size_t n);
void dtype__q4_k_to_f32(const void *src, float *dst, size_t n);
void dtype__q5_k_to_f32(const void *src, float *dst, size_t n);
void dtype__q6_k_to_f32(const void *src, float *dst, size_t n);
void dtype__iq4_xs_to_f32(const void *src, float *dst, size_t n);

#endif
