/* The llama family: Llama 2/3/3.1/3.2, Mistral, TinyLlama, SmolLM, Mixtral (general.architecture
 * llama; Mixtral's experts in place of the MLP, moe.c) and Qwen 2/2.5 (qwen2). Pre-norm blocks:
 * RMSNorm, grouped-query attention with RoPE, a SwiGLU MLP. They differ in the RoPE pairing their
 * converters lay Q/K out for (llama.cpp's llama_model_rope_type: llama NORM, qwen2 NEOX) and
 * qwen2's optional Q/K/V biases. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>

int engine__load_llama_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, Q = (uint64_t)hp->n_head * hp->head_dim,
             KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    layer_weights *w = &m->layers[l];
    struct {
        const char *suffix;
        uint64_t d0, d1;
        const float **vec;
        kern_mat *mat;
    } spec[] = {
        {"attn_norm.weight", E, 1, &w->attn_norm, NULL},
        {"attn_q.weight", E, Q, NULL, &w->wq},
        {"attn_k.weight", E, KV, NULL, &w->wk},
        {"attn_v.weight", E, KV, NULL, &w->wv},
        {"attn_output.weight", Q, E, NULL, &w->wo},
        {"ffn_norm.weight", E, 1, &w->ffn_norm, NULL},
        {"ffn_gate.weight", E, F, NULL, &w->w_gate},
        {"ffn_up.weight", E, F, NULL, &w->w_up},
        {"ffn_down.weight", F, E, NULL, &w->w_down},
    };
    /* With experts, the last three are theirs (moe.c). */
    bool moe = engine__layer_moe(m, l);
    size_t n_spec = sizeof spec / sizeof spec[0] - (moe ? 3 : 0);
    for (size_t k = 0; k < n_spec; k++) {
        int rc = spec[k].vec ? engine__load_layer_vec(m, l, spec[k].suffix, spec[k].d0, true,
                                                      spec[k].vec, err, err_len)
                             : engine__load_layer_mat(m, l, spec[k].suffix, spec[k].d0, spec[k].d1,
                                                      true, spec[k].mat, err, err_len);
        if (rc)
            return rc;
    }
    return moe ? engine__load_moe(m, l, err, err_len) : 0;
}

static int load_qwen2_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    /* Biases are optional (llama.cpp's TENSOR_NOT_REQUIRED); for llama a stray bias would be
     * silently ignored by llama.cpp too, so only qwen2 reads them. */
    const engine_hparams *hp = &m->hp;
    uint64_t Q = (uint64_t)hp->n_head * hp->head_dim, KV = (uint64_t)hp->n_head_kv * hp->head_dim;
    layer_weights *w = &m->layers[l];
    if ((rc = engine__load_layer_vec(m, l, "attn_q.bias", Q, false, &w->bq, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_k.bias", KV, false, &w->bk, err, err_len)))
        return rc;
    return engine__load_layer_vec(m, l, "attn_v.bias", KV, false, &w->bv, err, err_len);
}

void engine__llama_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           KV = (size_t)hp->n_head_kv * hp->head_dim;

    engine__norm_rows(c, c->xn, c->x, w->attn_norm, T, E);
    const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    engine__matmuls(c, c->xn, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
    for (size_t t = 0; t < T; t++) {
        if (w->bq)
            kern_add(c->q + t * Q, w->bq, Q);
        if (w->bk)
            kern_add(c->k + t * KV, w->bk, KV);
        if (w->bv)
            kern_add(c->v + t * KV, w->bv, KV);
    }
    if (w->q_norm) { /* qwen3: each head's vector normed on its own, rows of head_dim values */
        engine__norm_rows(c, c->q, c->q, w->q_norm, T * hp->n_head, hp->head_dim);
        engine__norm_rows(c, c->k, c->k, w->k_norm, T * hp->n_head_kv, hp->head_dim);
    }
    engine__rope_store(c, kv, b, l);
    /* Llama 4's attention temperature (mistral3: engine_model.attn_temp_len > 0), as llama.cpp's
     * llm_graph_input_attn_temp (offset 0): each roped query row times
     * 1 + scale ln(1 + floor(pos / n)), the quotient in float and the logarithm in double */
    for (size_t t = 0; c->m->attn_temp_len && t < T; t++) {
        float fl = floorf((float)b->pos[t] / (float)c->m->attn_temp_len);
        float s = (float)(log((double)fl + 1.0) * (double)c->m->attn_temp_scale + 1.0);
        for (size_t i = 0; i < Q; i++)
            c->q[t * Q + i] *= s;
    }
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    for (size_t t = 0; w->bo && t < T; t++)
        kern_add(c->xn + t * E, w->bo, E);
    kern_add(c->x, c->xn, T * E);
    engine__llama_ffn(c, l, T);
}

void engine__llama_ffn(engine_ctx *c, uint32_t l, size_t T)
{
    const layer_weights *w = &c->m->layers[l];
    size_t E = c->m->hp.n_embd;
    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    if (w->experts) {
        engine__moe_ffn(c, w, c->xn, T);
    } else {
        const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
        float *gate_up_out[2] = {c->gate, c->up};
        engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
        engine__matmul(c, c->xn, c->gate, &w->w_down, T);
    }
    kern_add(c->x, c->xn, T * E);
}

const engine_arch engine__arch_llama = {
    .name = "llama",
    .rope_type = ENGINE_ROPE_NORM,
    .moe = true, /* Mixtral */
    .load_layer = engine__load_llama_layer,
    .layer = engine__llama_layer,
};

const engine_arch engine__arch_qwen2 = {
    .name = "qwen2",
    .rope_type = ENGINE_ROPE_NEOX,
    .load_layer = load_qwen2_layer,
    .layer = engine__llama_layer,
};
