/* The smollm3 family (Hugging Face's SmolLM3-3B; general.architecture smollm3): llama's block
 * (RMSNorm, grouped-query attention, SwiGLU MLP, NORM RoPE pairs, output tied to token_embd when
 * the file has no output.weight) except that every fourth layer (l + 1 = 4, 8, ...) rotates
 * neither its queries nor its keys (NoPE), nor scales them by YaRN's magnitude, which llama.cpp
 * applies inside its RoPE (and forward.c folds into the rotation's cos and sin). The step is no
 * metadata key: llama.cpp fixes its n_no_rope_layer_step at 4 for this architecture (its converter
 * writes no key for it), as the model's config does (no_rope_layer_interval 4: no_rope_layers[l] =
 * 0 where (l + 1) % 4 == 0). */
#include "engine/arch.h"

#include "common/status.h"

#define NO_ROPE_STEP 4 /* llama.cpp's hparams.n_no_rope_layer_step for smollm3 */

static int load_smollm3_hparams(engine_model *m, char *err, size_t err_len)
{
    /* llama.cpp's smollm3 graph passes no frequency factors to its RoPE: a file with Llama 3.1's
     * rope_freqs would be rotated one way there and another here. */
    if (gguf_find_tensor(m->file, "rope_freqs.weight") >= 0)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "rope_freqs.weight in a smollm3 file is not supported (its RoPE "
                              "has no frequency factors)");
    /* llama.cpp asserts that RoPE turns whole heads (n_rot == head size) for this family. */
    return engine__arch_whole_rope(m, err, err_len);
}

static int load_smollm3_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    /* llama.cpp's use_rope = (il + 1) % n_no_rope_layer_step != 0 */
    m->layers[l].no_rope = (l + 1) % NO_ROPE_STEP == 0;
    return 0;
}

const engine_arch engine__arch_smollm3 = {
    .name = "smollm3",
    .rope_type = ENGINE_ROPE_NORM,
    .load_hparams = load_smollm3_hparams,
    .load_layer = load_smollm3_layer,
    .layer = engine__llama_layer,
};
