/* IBM's Granite 3.x (general.architecture granite: granite-3.x-2b/8b-instruct; granitemoe:
 * granite-3.x-1b-a400m / 3b-a800m, a mixture of experts in place of the MLP, moe.c): the llama
 * block (NORM RoPE, as llama.cpp's converter permutes Q/K for LlamaModel) with four scalars, read
 * and applied where llama.cpp's granite graph applies them:
 *   granite.embedding_scale  the embedding rows times it (0 or absent: not scaled);
 *   granite.attention.scale  the attention scores' scale in place of 1 / sqrt(head_dim) (0 or
 *                            absent: the default);
 *   granite.residual_scale   the attention output (after its bias) and the MLP output each times
 *                            it before being added to the residual stream (0 or absent: none);
 *   granite.logit_scale      the logits times 1 / it (required, as llama.cpp requires it).
 * rope.scaling.finetuned (a bool, true when absent) switches RoPE: false runs without it. The
 * experts are Mixtral's routing (softmax, top k, renormalized) and feed_forward_length wide;
 * granitemoeshared (Granite 3.x MoE with expert_shared_feed_forward_length, converted as
 * granitemoe) adds a shared expert, a SwiGLU MLP (ffn_{gate,up,down}_shexp) run for every token
 * on the same normed input, its output added to the routed experts' sum before the residual
 * scale. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>

/* "<arch>.<suffix>" as a finite float into *out (left as it is when absent). */
static int granite_f32(engine_model *m, const char *suffix, float *out, char *err, size_t err_len)
{
    int rc = engine__arch_f32(m, suffix, out, err, err_len);
    if (rc)
        return rc;
    if (!isfinite(*out) || fabsf(*out) > 1e6f)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s.%s = %g out of range", m->hp.arch,
                              suffix, (double)*out);
    return 0;
}

static int load_granite_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    if (!engine__arch_has(m, "logit_scale"))
        return status_set_err(err, err_len, KVS_ENOKEY, "missing metadata key %s.logit_scale",
                              hp->arch);
    float logit = 0.0f, embd = 0.0f, attn = 0.0f;
    int rc;
    if ((rc = granite_f32(m, "logit_scale", &logit, err, err_len)) ||
        (rc = granite_f32(m, "embedding_scale", &embd, err, err_len)) ||
        (rc = granite_f32(m, "attention.scale", &attn, err, err_len)) ||
        (rc = granite_f32(m, "residual_scale", &m->residual_scale, err, err_len)))
        return rc;
    if (logit == 0.0f)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s.logit_scale is 0", hp->arch);
    if (fabsf(logit) < 1e-6f) /* its reciprocal would overflow the logits */
        return status_set_err(err, err_len, KVS_EFORMAT, "%s.logit_scale = %g out of range",
                              hp->arch, (double)logit);
    m->logit_mul = 1.0f / logit; /* llama.cpp scales the logits by this float */
    if (embd != 0.0f)
        m->embd_scale = embd;
    if (attn != 0.0f)
        m->attn_scale = attn;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", hp->arch);
    int finetuned = 1; /* llama.cpp's default for granite: RoPE on */
    rc = gguf_get_bool(m->file, key, &finetuned);
    if (rc && rc != KVS_ENOKEY)
        return status_set_err(err, err_len, rc, "metadata key %s is not a bool", key);
    m->no_rope = !finetuned;
    if ((rc = engine__arch_whole_rope(m, err, err_len))) /* llama.cpp's granite graph asserts it */
        return rc;
    /* llama.cpp makes granite's experts feed_forward_length wide, whatever this key says. */
    if (hp->n_expert && hp->n_ff_exp != hp->n_ff)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.expert_feed_forward_length = %u differs from "
                              "feed_forward_length = %u (not supported)",
                              hp->arch, hp->n_ff_exp, hp->n_ff);
    if ((rc = engine__arch_u32(m, "expert_shared_feed_forward_length", &hp->n_ff_shexp, false, 0,
                               262144, err, err_len)))
        return rc;
    /* llama.cpp reads a shared expert only beside routed ones */
    if (hp->n_ff_shexp && !hp->n_expert)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.expert_shared_feed_forward_length = %u without experts (not "
                              "supported)",
                              hp->arch, hp->n_ff_shexp);
    return 0;
}

static int load_granite_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc = engine__load_llama_layer(m, l, err, err_len);
    if (rc)
        return rc;
    /* llama.cpp's optional biases: the output projection's is run; the others (no Granite 3.x
     * model has them) are refused by name rather than ignored. */
    static const char *const refused[] = {"attn_q.bias",   "attn_k.bias", "attn_v.bias",
                                          "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s", l, refused[i]);
        if (gguf_find_tensor(m->file, name) >= 0)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s: not supported for %s", name,
                                  m->hp.arch);
    }
    const engine_hparams *hp = &m->hp;
    layer_weights *w = &m->layers[l];
    w->no_rope = m->no_rope;
    /* (a shared expert, granitemoeshared's, comes with the experts: engine__load_moe) */
    return engine__load_layer_vec(m, l, "attn_output.bias", hp->n_embd, false, &w->bo, err,
                                  err_len);
}

/* The sublayer output xn (rows, n) times the residual scale, then added to x. */
static void add_scaled(const engine_ctx *c, float *x, float *xn, size_t n)
{
    float s = c->m->residual_scale;
    if (s != 0.0f)
        for (size_t i = 0; i < n; i++)
            xn[i] *= s;
    kern_add(x, xn, n);
}

static void granite_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = hp->n_embd;

    engine__norm_rows(c, c->xn, c->x, w->attn_norm, T, E);
    const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[3] = {c->q, c->k, c->v};
    engine__matmuls(c, c->xn, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
    engine__rope_store(c, kv, b, l);
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    for (size_t t = 0; w->bo && t < T; t++)
        kern_add(c->xn + t * E, w->bo, E);
    add_scaled(c, c->x, c->xn, T * E);

    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    if (w->experts) { /* and a shared expert where the layer has one */
        engine__moe_ffn(c, w, c->xn, T);
    } else {
        const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
        float *gate_up_out[2] = {c->gate, c->up};
        engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
        engine__matmul(c, c->xn, c->gate, &w->w_down, T);
    }
    add_scaled(c, c->x, c->xn, T * E);
}

/* Both take experts when the file has them, as llama.cpp's granite and granitemoe do. */
const engine_arch engine__arch_granite = {
    .name = "granite",
    .rope_type = ENGINE_ROPE_NORM,
    .moe = true,
    .load_hparams = load_granite_hparams,
    .load_layer = load_granite_layer,
    .layer = granite_layer,
};

const engine_arch engine__arch_granitemoe = {
    .name = "granitemoe",
    .rope_type = ENGINE_ROPE_NORM,
    .moe = true,
    .load_hparams = load_granite_hparams,
    .load_layer = load_granite_layer,
    .layer = granite_layer,
};
