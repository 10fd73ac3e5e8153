/* The olmo2 family (AllenAI's OLMo 2: 1B, 7B, 13B, 32B; OLMo 3: 7B, 32B, with its sliding
 * windows; general.architecture olmo2): no norm before attention or the MLP; instead an RMSNorm
 * of Q and of K over their whole projections (attn_q_norm n_head * head_dim wide, attn_k_norm
 * n_head_kv * head_dim: not per head, as qwen3's) before NEOX RoPE, and an RMSNorm of each
 * sublayer's output (post_attention_norm, post_ffw_norm) before its residual add; a SwiGLU MLP;
 * an output matrix of its own. With attention.sliding_window > 0 (OLMo 3) the layers l with
 * l % n < n - 1 attend to their last sliding_window positions (n from
 * attention.sliding_window_pattern, 4 without it: three windowed layers to one global, as
 * llama.cpp's set_swa_pattern), and rotate plainly: the base rope.freq_base_swa (rope.freq_base
 * without it), no scaling, no YaRN, no attention factor, while the global layers take the file's
 * scaling (OLMo 3's YaRN). */
#include "engine/arch.h"

#include "common/status.h"

static int load_olmo2_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    uint32_t n_swa = 0, pattern = 4;
    float base_swa = hp->rope_base;
    int rc =
        engine__arch_u32(m, "attention.sliding_window", &n_swa, false, 0, UINT32_MAX, err, err_len);
    if (rc ||
        (rc = engine__arch_u32(m, "attention.sliding_window_pattern", &pattern, false, 1,
                               hp->n_layer + 1, err, err_len)) ||
        (rc = engine__arch_f32(m, "rope.freq_base_swa", &base_swa, err, err_len)))
        return rc;
    if (!(base_swa > 1 && base_swa < 1e12f))
        return status_set_err(err, err_len, KVS_EFORMAT, "olmo2.rope.freq_base_swa %g out of range",
                              (double)base_swa);
    /* llama.cpp asserts that RoPE turns whole heads for this family, and requires an output
     * matrix of its own (no tied embeddings) */
    if ((rc = engine__arch_whole_rope(m, err, err_len)))
        return rc;
    if (gguf_find_tensor(m->file, "output.weight") < 0)
        return status_set_err(err, err_len, KVS_EFORMAT, "missing tensor output.weight");
    hp->n_swa = n_swa;
    hp->swa_pattern = n_swa ? pattern : 0;
    if (n_swa) {
        m->rope[1] = (rope_params){base_swa, 1.0f, true};
        m->n_rope = 2;
    }
    return 0;
}

static int load_olmo2_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
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
        {"attn_q.weight", E, Q, NULL, &w->wq},
        {"attn_k.weight", E, KV, NULL, &w->wk},
        {"attn_v.weight", E, KV, NULL, &w->wv},
        {"attn_output.weight", Q, E, NULL, &w->wo},
        {"attn_q_norm.weight", Q, 1, &w->q_norm, NULL},
        {"attn_k_norm.weight", KV, 1, &w->k_norm, NULL},
        {"post_attention_norm.weight", E, 1, &w->post_attn_norm, NULL},
        {"ffn_gate.weight", E, F, NULL, &w->w_gate},
        {"ffn_up.weight", E, F, NULL, &w->w_up},
        {"ffn_down.weight", F, E, NULL, &w->w_down},
        {"post_ffw_norm.weight", E, 1, &w->post_ffn_norm, NULL},
    };
    for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
        int rc = spec[k].vec ? engine__load_layer_vec(m, l, spec[k].suffix, spec[k].d0, true,
                                                      spec[k].vec, err, err_len)
                             : engine__load_layer_mat(m, l, spec[k].suffix, spec[k].d0, spec[k].d1,
                                                      true, spec[k].mat, err, err_len);
        if (rc)
            return rc;
    }
    /* llama.cpp's set_swa_pattern(n): layer l is windowed when l % n < n - 1 */
    bool windowed = hp->swa_pattern && l % hp->swa_pattern < hp->swa_pattern - 1;
    w->window = windowed ? hp->n_swa : 0;
    w->rope_set = windowed ? 1 : 0;
    return 0;
}

static void olmo2_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           KV = (size_t)hp->n_head_kv * hp->head_dim;

    const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    engine__matmuls(c, c->x, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
    engine__norm_rows(c, c->q, c->q, w->q_norm, T, Q); /* over the whole projection */
    engine__norm_rows(c, c->k, c->k, w->k_norm, T, KV);
    engine__rope_store(c, kv, b, l);
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    engine__norm_rows(c, c->xn, c->xn, w->post_attn_norm, T, E);
    kern_add(c->x, c->xn, T * E);

    const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
    float *gate_up_out[2] = {c->gate, c->up};
    engine__matmuls(c, c->x, T, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
    engine__matmul(c, c->xn, c->gate, &w->w_down, T);
    engine__norm_rows(c, c->xn, c->xn, w->post_ffn_norm, T, E);
    kern_add(c->x, c->xn, T * E);
}

const engine_arch engine__arch_olmo2 = {
    .name = "olmo2",
    .rope_type = ENGINE_ROPE_NEOX,
    .load_hparams = load_olmo2_hparams,
    .load_layer = load_olmo2_layer,
    .layer = olmo2_layer,
};
