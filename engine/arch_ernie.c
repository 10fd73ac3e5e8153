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
    m->moe_step = step;
    m->moe_lead = lead;
    m->moe_dense = lead > 0 || step > 1;
    return 0;
}

static int load_ernie_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t Q = (uint64_t)hp->n_head * hp->head_dim, KV = (uint64_t)hp->n_head_kv * hp->head_dim;
    layer_weights *w = &m->layers[l];
    bool moe = engine__layer_moe(m, l);
    /* llama.cpp loads an output bias but does not add it, and reads the MLP's biases not at
     * all: refused by name rather than ignored; and a layer's tensors of the other MLP kind
     * would go unread: refused as well, first, so that a key disagreeing with the tensors is
     * named by a tensor rather than a missing one. */
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
    /* llama's tensors, the experts (and the shared one) on the layers that have them */
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    /* Q/K/V biases are optional and run (llama's body adds them) */
    if ((rc = engine__load_layer_vec(m, l, "attn_q.bias", Q, false, &w->bq, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_k.bias", KV, false, &w->bk, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "attn_v.bias", KV, false, &w->bv, err, err_len)))
        return rc;
    return moe ? engine__load_layer_vec(m, l, "exp_probs_b.bias", hp->n_expert, false,
                                        &w->exp_probs_b, err, err_len)
               : 0;
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
    .layer = engine__llama_layer,
};

const engine_arch engine__arch_ernie4_5_moe = {
    .name = "ernie4_5-moe",
    .rope_type = ENGINE_ROPE_NORM,
    .free_head_dim = true,
    .head_dim_default = true,
    .moe = true,
    .load_hparams = load_ernie_hparams,
    .load_layer = load_ernie_layer,
    .layer = engine__llama_layer,
};
