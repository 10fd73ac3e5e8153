/* Baidu's ERNIE 4.5 text models (general.architecture ernie4_5: ERNIE-4.5-0.3B; ernie4_5-moe:
 * ERNIE-4.5-21B-A3B and 300B-A47B): the llama block (NORM RoPE turning whole heads, as llama.cpp
 * has it) with optional Q/K/V biases, heads of attention.key_length values where the file says
 * (else embedding_length / head_count). In ernie4_5-moe layer l runs a mixture of experts when
 * l >= leading_dense_block_count and (l + 1) % interleave_moe_layer_step == 0, else the dense
 * SwiGLU MLP of feed_forward_length. Its experts (expert_feed_forward_length wide) are picked by
 * softmax probability plus a per-expert selection bias (exp_probs_b.bias, optional), weighed by
 * their unbiased probabilities renormalized (moe.c); a shared expert (ffn_*_shexp,
 * expert_shared_feed_forward_length wide) runs on the same normed rows, added to their sum. */
#include "engine/arch.h"

#include "common/status.h"

#include <stdio.h>

/* The keys llama.cpp reads for other MoE families that an ERNIE converter does not write; a file
 * with one is refused rather than run without it. */
static const char *const refused_keys[] = {"expert_weights_scale", "expert_weights_norm",
                                           "expert_gating_func"};

static int load_ernie_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    int rc;
    if ((rc = engine__arch_whole_rope(m, err, err_len))) /* llama.cpp's ernie graphs assert it */
        return rc;
    for (size_t i = 0; i < sizeof refused_keys / sizeof refused_keys[0]; i++)
        if (engine__arch_has(m, refused_keys[i]))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s.%s: not supported for %s",
                                  hp->arch, refused_keys[i], hp->arch);
    /* ernie4_5-moe's keys on a dense file (whose expert_count model.c refuses) */
    static const char *const moe_keys[] = {
        "expert_feed_forward_length", "interleave_moe_layer_step", "leading_dense_block_count",
        "expert_shared_count", "expert_shared_feed_forward_length"};
    for (size_t i = 0; !m->arch->moe && i < sizeof moe_keys / sizeof moe_keys[0]; i++)
        if (engine__arch_has(m, moe_keys[i]))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s.%s: not supported for %s (a dense family)", hp->arch,
                                  moe_keys[i], hp->arch);
    if (!m->arch->moe)
        return 0;
    static const char *const required[] = {"expert_count", "expert_feed_forward_length",
                                           "interleave_moe_layer_step",
                                           "leading_dense_block_count"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!engine__arch_has(m, required[i]))
            return status_set_err(err, err_len, KVS_ENOKEY, "missing metadata key %s.%s", hp->arch,
                                  required[i]);
    if (!hp->n_expert)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s.expert_count is 0", hp->arch);
    uint32_t step = 0, lead = 0, n_shared = 0;
    bool has_count = engine__arch_has(m, "expert_shared_count");
    if ((rc = engine__arch_u32(m, "interleave_moe_layer_step", &step, true, 1, hp->n_layer, err,
                               err_len)) ||
        (rc = engine__arch_u32(m, "leading_dense_block_count", &lead, true, 0, hp->n_layer, err,
                               err_len)) ||
        (rc = engine__arch_u32(m, "expert_shared_feed_forward_length", &hp->n_ff_shexp, false, 0,
                               262144, err, err_len)) ||
        (rc = engine__arch_u32(m, "expert_shared_count", &n_shared, false, 0, 64, err, err_len)))
        return rc;
    /* llama.cpp runs the shared expert by its width alone; the converter writes the width only
     * beside a count above 0, so a count that says otherwise is a file this reading would run
     * wrong */
    if (has_count && (n_shared > 0) != (hp->n_ff_shexp > 0))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s.expert_shared_count = %u with "
                              "expert_shared_feed_forward_length = %u",
                              hp->arch, n_shared, hp->n_ff_shexp);
    /* the shared expert's output waits in the attention buffer, n_head * head_dim wide */
    if (hp->n_ff_shexp && (uint64_t)hp->n_head * hp->head_dim < hp->n_embd)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s: a shared expert with heads narrower than embedding_length / "
                              "head_count (%u heads of %u) is not supported",
                              hp->arch, hp->n_head, hp->head_dim);
    m->moe_step = step;
    m->moe_lead = lead;
    m->moe_dense = lead > 0 || step > 1;
    return 0;
}

/* Whether layer l of an ernie4_5-moe file runs experts (llama.cpp's is_moe_layer). */
static bool ernie_moe_layer(const engine_model *m, uint32_t l)
{
    return m->arch->moe && l >= m->moe_lead && (l + 1) % m->moe_step == 0;
}

static int load_ernie_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, Q = (uint64_t)hp->n_head * hp->head_dim,
             KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, S = hp->n_ff_shexp,
             X = hp->n_expert;
    layer_weights *w = &m->layers[l];
    bool moe = ernie_moe_layer(m, l);
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
    size_t n_spec = sizeof spec / sizeof spec[0] - (moe ? 3 : 0);
    int rc;
    for (size_t k = 0; k < n_spec; k++)
        if ((rc = spec[k].vec ? engine__load_layer_vec(m, l, spec[k].suffix, spec[k].d0, true,
                                                       spec[k].vec, err, err_len)
                              : engine__load_layer_mat(m, l, spec[k].suffix, spec[k].d0, spec[k].d1,
                                                       true, spec[k].mat, err, err_len)))
            return rc;
    /* Q/K/V biases are optional and run; llama.cpp loads an output bias but does not add it,
     * and reads the MLP's biases not at all: refused by name rather than ignored. A layer's
     * tensors of the other MLP kind would go unread: refused as well. */
    if ((rc = engine__load_layer_vec(m, l, "attn_q.bias", Q, false, &w->bq, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_k.bias", KV, false, &w->bk, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_v.bias", KV, false, &w->bv, err, err_len)))
        return rc;
    static const char *const refused_all[] = {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                                              "ffn_down.bias"};
    static const char *const refused_dense[] = {"ffn_gate_inp.weight", "exp_probs_b.bias",
                                                "ffn_up_exps.weight", "ffn_gate_shexp.weight"};
    static const char *const refused_moe[] = {"ffn_gate.weight"};
    const char *const *lists[2] = {refused_all, moe ? refused_moe : refused_dense};
    size_t lens[2] = {4, moe ? 1 : 4};
    for (size_t j = 0; j < 2; j++)
        for (size_t i = 0; i < lens[j]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, lists[j][i]);
            if (gguf_find_tensor(m->file, name) >= 0)
                return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s: not supported for %s%s",
                                      name, hp->arch,
                                      !j    ? ""
                                      : moe ? " (a mixture-of-experts layer)"
                                            : " (a dense layer)");
        }
    if (!moe)
        return 0;
    if ((rc = engine__load_moe(m, l, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "exp_probs_b.bias", X, false, &w->exp_probs_b, err,
                                     err_len)))
        return rc;
    if (S && ((rc = engine__load_layer_mat(m, l, "ffn_gate_shexp.weight", E, S, true, &w->sh_gate,
                                           err, err_len)) ||
              (rc = engine__load_layer_mat(m, l, "ffn_up_shexp.weight", E, S, true, &w->sh_up, err,
                                           err_len)) ||
              (rc = engine__load_layer_mat(m, l, "ffn_down_shexp.weight", S, E, true, &w->sh_down,
                                           err, err_len))))
        return rc;
    return 0;
}

static void ernie_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const layer_weights *w = &c->m->layers[l];
    if (!w->experts || !w->sh_down.data) {
        engine__llama_layer(c, kv, b, l); /* its biases, and the dense MLP or the experts */
        return;
    }
    const engine_hparams *hp = &c->m->hp;
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
    engine__rope_store(c, kv, b, l);
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    kern_add(c->x, c->xn, T * E);

    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    /* the shared expert first, into att (free now, at least n_embd wide: load_ernie_hparams),
     * since the routed experts' sum replaces xn; then moe_out + shexp, as llama.cpp */
    const kern_mat *gate_up[2] = {&w->sh_gate, &w->sh_up};
    float *gate_up_out[2] = {c->gate, c->up};
    engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
    engine__matmul(c, c->att, c->gate, &w->sh_down, T);
    engine__moe_ffn(c, w, c->xn, T);
    kern_add(c->xn, c->att, T * E);
    kern_add(c->x, c->xn, T * E);
}

/* Heads of attention.key_length values where the file says (ERNIE's converter writes a config's
 * head_dim), else embedding_length / head_count, as llama.cpp reads them. */
const engine_arch engine__arch_ernie4_5 = {
    .name = "ernie4_5",
    .rope_type = ENGINE_ROPE_NORM,
    .free_head_dim = true,
    .head_dim_default = true,
    .load_hparams = load_ernie_hparams,
    .load_layer = load_ernie_layer,
    .layer = ernie_layer,
};

const engine_arch engine__arch_ernie4_5_moe = {
    .name = "ernie4_5-moe",
    .rope_type = ENGINE_ROPE_NORM,
    .free_head_dim = true,
    .head_dim_default = true,
    .moe = true,
    .load_hparams = load_ernie_hparams,
    .load_layer = load_ernie_layer,
    .layer = ernie_layer,
};
