/* Random finite rows of a ggml quantized type (tools/quant_rows.h). */
#include "tools/quant_rows.h"

#include "engine/dtype.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

uint8_t *quant_rows_random(uint32_t id, size_t n_out, size_t n_in, uint32_t *rng, float *wide)
{
    const dtype_info *dt = dtype_get(id);
    if (!dt || dt->block == 0 || !dt->to_f32)
        return NULL;
    size_t nb = n_in / dt->block, row_bytes = nb * dt->block_bytes;
    uint8_t *data = malloc(n_out * row_bytes);
    /* without wide, one block's values in scratch: only their finiteness is wanted */
    float *scratch = wide ? NULL : malloc(dt->block * sizeof(float));
    if (!data || (!wide && !scratch)) {
        free(data);
        free(scratch);
        return NULL;
    }
    for (size_t r = 0; r < n_out; r++)
        for (size_t b = 0; b < nb; b++) {
            uint8_t *blk = data + r * row_bytes + b * dt->block_bytes;
            float *w = wide ? wide + r * n_in + b * dt->block : scratch;
            for (bool finite = false; !finite;) {
                for (size_t i = 0; i < dt->block_bytes; i++) {
                    *rng = *rng * 1664525u + 1013904223u;
                    blk[i] = (uint8_t)(*rng >> 24);
                }
                if (id == 39) /* MXFP4: its exponent within an f16 scale's range (header) */
                    blk[0] = (uint8_t)(104 + blk[0] % 40);
                dt->to_f32(blk, w, dt->block);
                finite = true;
                for (size_t i = 0; i < dt->block; i++)
                    finite = finite && isfinite(w[i]);
            }
        }
    free(scratch);
    return data;
}
