/* OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b; general.architecture gpt-oss): llama's pre-norm
 * layer with every projection biased, a learned sink logit per attention head, sliding-window
 * attention (128 positions) on the even layers, YaRN RoPE (NEOX pairs), and a mixture of experts
 * in every layer (moe.c) whose router has a bias and picks the k highest scores, weighing them by
 * a softmax over those k, and whose experts have biases and gpt-oss's clamped SwiGLU. As
 * llama.cpp's openai-moe graph: the layer body is llama's (arch_llama.c), which adds the output
 * bias; attention.c adds the sinks. */
#include "engine/arch.h"

#include "common/status.h"

#include <stdio.h>

static int load_gpt_oss_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    if (!hp->n_expert)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "gpt-oss.expert_count is missing: gpt-oss layers hold experts");
    int rc = engine__arch_u32(m, "attention.sliding_window", &hp->n_swa, true, 1, UINT32_MAX, err,
                              err_len);
    hp->swa_pattern = 2; /* llama.cpp's set_swa_pattern(2): the even layers windowed */
    return rc;
}

static int load_gpt_oss_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, Q = (uint64_t)hp->n_head * hp->head_dim,
             KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff_exp, X = hp->n_expert;
    layer_weights *w = &m->layers[l];
    struct {
        const char *suffix;
        uint64_t d0, d1;
        const float **vec;
        kern_mat *mat;
    } spec[] = {
        {"attn_norm.weight", E, 1, &w->attn_norm, NULL},
        {"attn_q.weight", E, Q, NULL, &w->wq},
        {"attn_q.bias", Q, 1, &w->bq, NULL},
        {"attn_k.weight", E, KV, NULL, &w->wk},
        {"attn_k.bias", KV, 1, &w->bk, NULL},
        {"attn_v.weight", E, KV, NULL, &w->wv},
        {"attn_v.bias", KV, 1, &w->bv, NULL},
        {"attn_output.weight", Q, E, NULL, &w->wo},
        {"attn_output.bias", E, 1, &w->bo, NULL},
        {"attn_sinks.weight", hp->n_head, 1, &w->sinks, NULL},
        {"post_attention_norm.weight", E, 1, &w->ffn_norm, NULL},
        {"ffn_gate_inp.bias", X, 1, &w->router_b, NULL},
        {"ffn_gate_exps.bias", F, X, &w->exp_b[0], NULL},
        {"ffn_up_exps.bias", F, X, &w->exp_b[1], NULL},
        {"ffn_down_exps.bias", E, X, &w->exp_b[2], NULL},
    };
    for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s", l, spec[k].suffix);
        int rc = spec[k].vec ? engine__load_vec(m, name, spec[k].d0, spec[k].d1, true, spec[k].vec,
                                                err, err_len)
                             : engine__load_mat(m, name, spec[k].d0, spec[k].d1, true, spec[k].mat,
                                                err, err_len);
        if (rc)
            return rc;
    }
    /* llama.cpp's set_swa_pattern(2): layer l is windowed when l % 2 < 1. */
    w->window = l % hp->swa_pattern < hp->swa_pattern - 1 ? hp->n_swa : 0;
    return engine__load_moe(m, l, err, err_len);
}

const engine_arch engine__arch_gpt_oss = {
    .name = "gpt-oss",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .moe = true,
    .moe_route = ENGINE_MOE_TOPK_SOFTMAX,
    .moe_act = ENGINE_MOE_SWIGLU_OAI,
    .load_hparams = load_gpt_oss_hparams,
    .load_layer = load_gpt_oss_layer,
    .layer = engine__llama_layer,
};
