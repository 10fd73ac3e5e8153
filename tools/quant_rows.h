/* Random rows of a ggml quantized type for the tests and benchmarks (tests/test_kernels.c,
 * bench/bench_qmatmul.c): not part of any library kvserve links. Every byte pattern is a valid
 * block of these types except where an f16 scale widens a value to infinity or NaN, so each
 * block is drawn again until all its values are finite. MXFP4's exponent byte e is drawn in 104 ..
 * 143 (scales 2^-24 .. 2^15, an f16 scale's range), not over all of 2^-128 .. 2^127, where the
 * sums of random rows would overflow float (tests/test_kernels.c tries the extremes apart). */
#ifndef KVS_TOOLS_QUANT_ROWS_H
#define KVS_TOOLS_QUANT_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* n_out rows of n_in / block blocks of ggml type id (engine/dtype.h must know it; n_in a
 * multiple of its block), each byte the top byte of the next step of the LCG *rng (x = x *
 * 1664525 + 1013904223), so a caller sharing *rng with its other draws keeps one sequence. With
 * wide not NULL, the exact widened values (dtype's to_f32, n_out * n_in floats) go there. Returns
 * the rows (malloc'd: the caller frees them), or NULL when out of memory or the type is
 * unknown. */
uint8_t *quant_rows_random(uint32_t id, size_t n_out, size_t n_in, uint32_t *rng, float *wide);

#endif
