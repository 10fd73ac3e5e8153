/* The mistral3 family (general.architecture mistral3: Ministral 3 3B/8B/14B, Mistral Small 3.x,
 * Magistral, Devstral converted from their Mistral3ForConditionalGeneration / Ministral3
 * checkpoints, text tower only): llama's block (RMSNorm, grouped-query attention, NORM RoPE
 * pairs, SwiGLU MLP or Mixtral's experts, output tied to token_embd when the file has no
 * output.weight) as llama.cpp's mistral3 graph runs it, with these differences:
 *   - heads of attention.key_length (Ministral 3: 128 on a width of 3072 over 32 heads), else
 *     embedding_length / head_count; RoPE turns whole heads (llama.cpp asserts it);
 *   - YaRN (Ministral 3: factor 16 over 16384, betas 32 and 1, yarn_log_multiplier 1) as every
 *     family's (model.c, forward.c): llama.cpp (d32676d) passes its context's YaRN magnitude to
 *     this graph's RoPE as to llama's (in peer_families' mistral3-yarn row a magnitude of 1
 *     instead, as an older graph's own attn_factor 1 / (1 + 0.1 ln factor) gives under ggml's
 *     1 + 0.1 ln factor, parts at token 0);
 *   - Llama 4's attention temperature (attention.temperature_scale, Ministral 3's
 *     llama_4_scaling_beta): after RoPE each query row is multiplied by
 *     1 + scale ln(1 + floor(pos / n)), n = rope.scaling.original_context_length (llama.cpp's
 *     n_ctx_orig_yarn, context_length when absent), computed as llama.cpp's set_input does (a
 *     float quotient, the logarithm in double). attention.temperature_length is not read by
 *     llama.cpp for this family (d32676d: a file with 16 over an original context of 8 gives
 *     llama-server the tokens of the same file without it, not those of one over 16): a file
 *     whose value differs from n is refused rather than run one way or the other.
 * Optional Q/K/V and output biases are added; MLP biases, attention.scale (the graph's
 * f_attention_scale, which llama.cpp does not load for mistral3) are refused by name. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>

static int load_mistral3_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    int rc = engine__arch_whole_rope(m, err, err_len);
    if (rc)
        return rc;
    /* llama.cpp loads no attention.scale for this family (its graph's f_attention_scale stays
     * 0: 1 / sqrt(head_dim)) */
    if (engine__arch_has(m, "attention.scale"))
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.attention.scale is not supported (llama.cpp's mistral3 graph "
                              "does not read it)",
                              hp->arch);
    float temp = 0.0f;
    if ((rc = engine__arch_f32(m, "attention.temperature_scale", &temp, err, err_len)))
        return rc;
    if (!isfinite(temp) || fabsf(temp) > 1e3f)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s.attention.temperature_scale = %g out of range", hp->arch,
                              (double)temp);
    uint32_t floor_len = hp->n_ctx_train, temp_len = 0;
    if ((rc = engine__arch_u32(m, "rope.scaling.original_context_length", &floor_len, false, 1,
                               1u << 20, err, err_len)) ||
        (rc = engine__arch_u32(m, "attention.temperature_length", &temp_len, false, 0, UINT32_MAX,
                               err, err_len)))
        return rc;
    if (temp_len && temp_len != floor_len)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.attention.temperature_length = %u differs from "
                              "rope.scaling.original_context_length = %u (llama.cpp divides the "
                              "positions by the latter; not supported)",
                              hp->arch, temp_len, floor_len);
    m->attn_temp_scale = temp;
    m->attn_temp_len = temp != 0.0f ? floor_len : 0;
    return 0;
}

static int load_mistral3_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    static const char *const refused[] = {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s", l, refused[i]);
        if (gguf_find_tensor(m->file, name) >= 0)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s: not supported for %s", name,
                                  m->hp.arch);
    }
    const engine_hparams *hp = &m->hp;
    uint64_t Q = (uint64_t)hp->n_head * hp->head_dim, KV = (uint64_t)hp->n_head_kv * hp->head_dim;
    layer_weights *w = &m->layers[l];
    if ((rc = engine__load_layer_vec(m, l, "attn_q.bias", Q, false, &w->bq, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_k.bias", KV, false, &w->bk, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_v.bias", KV, false, &w->bv, err, err_len)))
        return rc;
    return engine__load_layer_vec(m, l, "attn_output.bias", hp->n_embd, false, &w->bo, err,
                                  err_len);
}

const engine_arch engine__arch_mistral3 = {
    .name = "mistral3",
    .rope_type = ENGINE_ROPE_NORM,
    .free_head_dim = true,
    .head_dim_default = true,
    .moe = true, /* llama.cpp's graph has Mixtral's branch (softmax, top k, renormalized) */
    .load_hparams = load_mistral3_hparams,
    .load_layer = load_mistral3_layer,
    .layer = engine__llama_layer, /* which applies the temperature (engine_model.attn_temp_len) */
};
