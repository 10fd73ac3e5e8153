/* The qwen3 family (Qwen 3 0.6B-32B dense): the llama block with NEOX RoPE, no Q/K/V biases,
 * heads of attention.key_length values whatever the width (Q is n_head * head_dim wide), and a
 * per-head RMSNorm of Q and of K (attn_q_norm, attn_k_norm: head_dim weights each) before RoPE.
 * qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B) is the same block with a mixture of experts in place
 * of the MLP (moe.c). */
#include "engine/arch.h"

#include "common/status.h"

static int load_qwen3_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    layer_weights *w = &m->layers[l];
    uint32_t hd = m->hp.head_dim;
    if ((rc = engine__load_layer_vec(m, l, "attn_q_norm.weight", hd, true, &w->q_norm, err,
                                     err_len)))
        return rc;
    return engine__load_layer_vec(m, l, "attn_k_norm.weight", hd, true, &w->k_norm, err, err_len);
}

const engine_arch engine__arch_qwen3 = {
    .name = "qwen3",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .load_layer = load_qwen3_layer,
    .layer = engine__llama_layer,
};

const engine_arch engine__arch_qwen3moe = {
    .name = "qwen3moe",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .moe = true,
    .load_layer = load_qwen3_layer,
    .layer = engine__llama_layer,
};
