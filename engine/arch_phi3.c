/* The phi3 family (Phi-3 / Phi-3.5 mini): the llama block with NEOX RoPE, Q, K and V fused in
 * one attn_qkv matrix (rows: n_embd of Q, then K, then V) and gate and up fused in ffn_up (rows:
 * n_ff of gate, then n_ff of up, SwiGLU as ggml_swiglu splits them). The fused matrices are
 * loaded once and seen as row ranges, so the layer body is llama's. LongRoPE (rope_factors_long /
 * rope_factors_short, for contexts past the original one) is refused. llama.cpp runs Phi-3's
 * sliding_window key as no window (its converter's value is not what the model was trained
 * with); so does this engine, and says so when loading. */
#include "engine/arch.h"

#include "common/log.h"
#include "common/status.h"

static int load_phi3_hparams(engine_model *m, char *err, size_t err_len)
{
    static const char *const longrope[] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    for (size_t i = 0; i < 2; i++)
        if (gguf_find_tensor(m->file, longrope[i]) >= 0)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "phi3 LongRoPE (%s) is not supported", longrope[i]);
    uint32_t n_swa = 0;
    int rc =
        engine__arch_u32(m, "attention.sliding_window", &n_swa, false, 0, UINT32_MAX, err, err_len);
    if (rc)
        return rc;
    if (n_swa)
        log_warn("phi3.attention.sliding_window = %u: run without a window, as llama.cpp does",
                 n_swa);
    return 0;
}

static int load_phi3_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, Q = (uint64_t)hp->n_head * hp->head_dim,
             KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    layer_weights *w = &m->layers[l];
    kern_mat qkv, gate_up;
    int rc;
    if ((rc = engine__load_layer_vec(m, l, "attn_norm.weight", E, true, &w->attn_norm, err,
                                     err_len)) ||
        (rc = engine__load_layer_mat(m, l, "attn_qkv.weight", E, Q + 2 * KV, false, &qkv, err,
                                     err_len)))
        return rc;
    if (qkv.data) {
        engine__mat_rows(&qkv, 0, Q, &w->wq);
        engine__mat_rows(&qkv, Q, KV, &w->wk);
        engine__mat_rows(&qkv, Q + KV, KV, &w->wv);
    } else if ((rc = engine__load_layer_mat(m, l, "attn_q.weight", E, Q, true, &w->wq, err,
                                            err_len)) ||
               (rc = engine__load_layer_mat(m, l, "attn_k.weight", E, KV, true, &w->wk, err,
                                            err_len)) ||
               (rc = engine__load_layer_mat(m, l, "attn_v.weight", E, KV, true, &w->wv, err,
                                            err_len))) {
        return rc;
    }
    if ((rc = engine__load_layer_mat(m, l, "attn_output.weight", Q, E, true, &w->wo, err,
                                     err_len)) ||
        (rc = engine__load_layer_vec(m, l, "ffn_norm.weight", E, true, &w->ffn_norm, err,
                                     err_len)) ||
        (rc = engine__load_layer_mat(m, l, "ffn_up.weight", E, 2 * F, true, &gate_up, err,
                                     err_len)) ||
        (rc =
             engine__load_layer_mat(m, l, "ffn_down.weight", F, E, true, &w->w_down, err, err_len)))
        return rc;
    engine__mat_rows(&gate_up, 0, F, &w->w_gate);
    engine__mat_rows(&gate_up, F, F, &w->w_up);
    return 0;
}

const engine_arch engine__arch_phi3 = {
    .name = "phi3",
    .rope_type = ENGINE_ROPE_NEOX,
    .load_hparams = load_phi3_hparams,
    .load_layer = load_phi3_layer,
    .layer = engine__llama_layer,
};
