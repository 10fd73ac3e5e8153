/* The qwen3 family (Qwen 3 0.6B-32B dense): the llama block with NEOX RoPE, no Q/K/V biases,
 * heads of attention.key_length values whatever the width (Q is n_head * head_dim wide), and a
 * per-head RMSNorm of Q and of K (attn_q_norm, attn_k_norm: head_dim weights each) before RoPE. */
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

static void qwen3_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = hp->n_embd;

    engine__norm_rows(c, c->xn, c->x, w->attn_norm, T, E);
    const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    engine__matmuls(c, c->xn, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
    /* Each head's vector is normed on its own: rows of head_dim values. */
    engine__norm_rows(c, c->q, c->q, w->q_norm, T * hp->n_head, hp->head_dim);
    engine__norm_rows(c, c->k, c->k, w->k_norm, T * hp->n_head_kv, hp->head_dim);
    engine__rope_store(c, kv, b, l);
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    kern_add(c->x, c->xn, T * E);

    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
    float *gate_up_out[2] = {c->gate, c->up};
    engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
    engine__matmul(c, c->xn, c->gate, &w->w_down, T);
    kern_add(c->x, c->xn, T * E);
}

const engine_arch engine__arch_qwen3 = {
    .name = "qwen3",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .load_layer = load_qwen3_layer,
    .layer = qwen3_layer,
};
