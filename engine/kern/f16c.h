/* The F16C float-to-half row conversion (kern_ops.to_f16) the AVX2 and AVX-512 tables share:
 * eight values per vcvtps2ph, round to nearest even, the tail through dtype_f32_to_f16, so the
 * bits are ref.c's. Header-only (static inline) so each ISA file compiles it with its own target
 * flags; the AVX-512 files use it too because a 512-bit vcvtps2ph is missing in simde 0.7.4 (the
 * emulated copy) and the store-bound loop runs at the same speed either way. Not a public header:
 * for the kern/ files only, built with -mf16c. */
#ifndef KVS_ENGINE_KERN_F16C_H
#define KVS_ENGINE_KERN_F16C_H

#include "engine/dtype.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline void kern__to_f16_f16c(uint16_t *dst, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = dtype_f32_to_f16(x[i]);
}

#endif
