/* The Gemma 2 and Gemma 3 families (text models; general.architecture gemma2, gemma3), in the
 * layout llama.cpp's converter writes (norm weights already hold Gemma's 1 + w). Both: embedding
 * rows times sqrt(n_embd); RMSNorm before and after attention and before and after the MLP
 * (post_attention_norm, post_ffw_norm); a GELU-gated MLP (tanh approximation); NEOX RoPE; heads
 * of attention.key_length values; queries scaled by 1/sqrt(head_dim), or by 1/sqrt(n_embd /
 * n_head) for the 27B shapes (query_pre_attn_scalar: llama.cpp tells them by layer count, as
 * gemma_pytorch's config does); sliding-window attention on some layers; tied output unless
 * output.weight is present.
 *   gemma2: attention scores and final logits soft-capped (attn_logit_softcapping, default 50;
 *           final_logit_softcapping, default 30); even layers windowed (sliding_window, default
 *           4096).
 *   gemma3: no attention soft-capping (final logits only if final_logit_softcapping is set);
 *           per-head RMSNorm of Q and K (attn_q_norm, attn_k_norm) before RoPE; five windowed
 *           layers then one global (the 5:1 pattern); windowed layers use RoPE base 10000 and no
 *           scaling, global ones rope.freq_base and its scaling. Without sliding_window (or 0)
 *           every layer is global, as llama.cpp. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>

static int load_gemma_common(engine_model *m, bool gemma3, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    int rc;
    m->embd_scale = sqrtf((float)hp->n_embd);
    bool big = hp->n_layer == (gemma3 ? 62u : 46u); /* the 27B shapes */
    m->attn_scale =
        big ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)) : 1.0f / sqrtf((float)hp->head_dim);
    uint32_t n_swa = gemma3 ? 0 : 4096;
    if ((rc = engine__arch_u32(m, "attention.sliding_window", &n_swa, false, gemma3 ? 0 : 1,
                               UINT32_MAX, err, err_len)))
        return rc;
    m->final_softcap = gemma3 ? 0.0f : 30.0f;
    if ((rc = engine__arch_f32(m, "final_logit_softcapping", &m->final_softcap, err, err_len)))
        return rc;
    if (!(m->final_softcap >= 0 && m->final_softcap < 1e6f))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s.final_logit_softcapping = %g out of range", hp->arch,
                              (double)m->final_softcap);
    uint32_t pattern = gemma3 ? 6 : 2;
    if (gemma3) {
        float cap = 0.0f;
        if ((rc = engine__arch_f32(m, "attn_logit_softcapping", &cap, err, err_len)))
            return rc;
        if (cap != 0.0f)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "gemma3.attn_logit_softcapping = %g: gemma3 has no attention "
                                  "soft-capping (not supported)",
                                  (double)cap);
        /* llama.cpp fixes gemma3's pattern at 5 windowed layers to 1 global one. */
        uint32_t p = pattern;
        if ((rc = engine__arch_u32(m, "attention.sliding_window_pattern", &p, false, 0, UINT32_MAX,
                                   err, err_len)))
            return rc;
        if (p != pattern)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "gemma3.attention.sliding_window_pattern = %u is not supported "
                                  "(gemma3 is 6: five windowed layers, then one global)",
                                  p);
        if (n_swa) {
            m->rope[1] = (rope_params){10000.0f, 1.0f, false};
            m->n_rope = 2;
        }
    } else {
        m->attn_softcap = 50.0f;
        if ((rc = engine__arch_f32(m, "attn_logit_softcapping", &m->attn_softcap, err, err_len)))
            return rc;
        if (!(m->attn_softcap > 0 && m->attn_softcap < 1e6f))
            return status_set_err(err, err_len, KVS_EFORMAT,
                                  "gemma2.attn_logit_softcapping = %g out of range",
                                  (double)m->attn_softcap);
    }
    hp->n_swa = n_swa;
    hp->swa_pattern = n_swa ? pattern : 0;
    return 0;
}

static int load_gemma2_hparams(engine_model *m, char *err, size_t err_len)
{
    return load_gemma_common(m, false, err, err_len);
}

static int load_gemma3_hparams(engine_model *m, char *err, size_t err_len)
{
    return load_gemma_common(m, true, err, err_len);
}

static int load_gemma_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    const engine_hparams *hp = &m->hp;
    layer_weights *w = &m->layers[l];
    uint64_t E = hp->n_embd;
    if ((rc = engine__load_layer_vec(m, l, "post_attention_norm.weight", E, true,
                                     &w->post_attn_norm, err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "post_ffw_norm.weight", E, true, &w->post_ffn_norm, err,
                                     err_len)))
        return rc;
    if (m->arch == &engine__arch_gemma3 &&
        ((rc = engine__load_layer_vec(m, l, "attn_q_norm.weight", hp->head_dim, true, &w->q_norm,
                                      err, err_len)) ||
         (rc = engine__load_layer_vec(m, l, "attn_k_norm.weight", hp->head_dim, true, &w->k_norm,
                                      err, err_len))))
        return rc;
    /* llama.cpp's set_swa_pattern(n): layer l is windowed when l % n < n - 1. */
    bool windowed = hp->swa_pattern && l % hp->swa_pattern < hp->swa_pattern - 1;
    w->window = windowed ? hp->n_swa : 0;
    w->rope_set = windowed && m->n_rope == 2 ? 1 : 0;
    return 0;
}

static void gemma_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = hp->n_embd;

    engine__norm_rows(c, c->xn, c->x, w->attn_norm, T, E);
    const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    engine__matmuls(c, c->xn, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
    if (w->q_norm) {
        engine__norm_rows(c, c->q, c->q, w->q_norm, T * hp->n_head, hp->head_dim);
        engine__norm_rows(c, c->k, c->k, w->k_norm, T * hp->n_head_kv, hp->head_dim);
    }
    engine__rope_store(c, kv, b, l);
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    engine__norm_rows(c, c->xn, c->xn, w->post_attn_norm, T, E);
    kern_add(c->x, c->xn, T * E);

    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
    float *gate_up_out[2] = {c->gate, c->up};
    engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_GELU);
    engine__matmul(c, c->xn, c->gate, &w->w_down, T);
    engine__norm_rows(c, c->xn, c->xn, w->post_ffn_norm, T, E);
    kern_add(c->x, c->xn, T * E);
}

const engine_arch engine__arch_gemma2 = {
    .name = "gemma2",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .load_hparams = load_gemma2_hparams,
    .load_layer = load_gemma_layer,
    .layer = gemma_layer,
};

const engine_arch engine__arch_gemma3 = {
    .name = "gemma3",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .load_hparams = load_gemma3_hparams,
    .load_layer = load_gemma_layer,
    .layer = gemma_layer,
};
