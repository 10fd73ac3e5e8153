/* The lfm2 family (Liquid AI's LFM2 and LFM2.5: 350M, 700M, 1.2B, 2.6B; general.architecture
 * lfm2): pre-norm blocks whose first half is either grouped-query attention (per-head RMSNorm of
 * Q and K, NEOX RoPE, as qwen3's, heads n_embd / n_head wide) or a gated short convolution, and
 * whose second half is a SwiGLU MLP. attention.head_count_kv is one count per layer: 0 marks a
 * convolution layer (llama.cpp's recurrent_layer_arr). The final norm is token_embd_norm.weight
 * (the converter's name for it); the output is tied to token_embd unless the file has its own.
 *
 * A convolution layer: in_proj (3 n_embd rows) gives each row B, C and x; B * x is convolved
 * along the sequence, channel by channel, over the last shortconv.l_cache positions (the row's
 * own included; positions before 0 count as zeros); C times that goes through out_proj. Where
 * llama.cpp keeps each sequence's last l_cache - 1 values of B * x as a recurrent state, kvserve
 * writes every position's B * x into the paged cache as the layer's K row (kv_arena.c: n_embd F32
 * values, no V) and reads the window back from the block table, the same way attention reads
 * keys: so a prefix hit, a fork and a recomputation all see the same values, and the layer's
 * window (l_cache) lets the windowed group of a split arena hold only the last block or two of
 * each sequence. With attention.sliding_window > 0 the attention layers are windowed too, as
 * llama.cpp reads that key for this family.
 *
 * lfm2moe (LFM2-8B-A1B, LFM2-24B-A2B): the same blocks, with a mixture of experts in place of the
 * MLP on the layers from leading_dense_block_count on (moe.c): sigmoid gating (its
 * expert_gating_func, 2; the other values are refused), the experts picked on the probabilities
 * plus a per-expert bias (exp_probs_b.bias) and weighed by their probabilities renormalized. */
#include "engine/arch.h"

#include "common/status.h"

#include <stdio.h>
#include <string.h>

#define MAX_CONV_LEN 64 /* taps: LFM2 has 3; llama.cpp reads any count above 1 */

static int load_lfm2_hparams(engine_model *m, char *err, size_t err_len)
{
    uint32_t taps = 0, n_swa = 0;
    int rc = engine__arch_u32(m, "shortconv.l_cache", &taps, true, 2, MAX_CONV_LEN, err, err_len);
    if (rc || (rc = engine__arch_u32(m, "attention.sliding_window", &n_swa, false, 0, UINT32_MAX,
                                     err, err_len)))
        return rc;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        layer_weights *w = &m->layers[l];
        w->conv_len = w->recurrent ? taps : 0;
        w->window = w->recurrent ? taps : n_swa;
    }
    return 0;
}

/* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID */
#define GATING_SIGMOID 2

static int load_lfm2moe_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    uint32_t gating = 0, lead = 0;
    int rc = load_lfm2_hparams(m, err, err_len);
    if (rc ||
        (rc = engine__arch_u32(m, "expert_gating_func", &gating, true, 0, UINT32_MAX, err,
                               err_len)) ||
        (rc = engine__arch_u32(m, "leading_dense_block_count", &lead, false, 0, hp->n_layer, err,
                               err_len)))
        return rc;
    if (gating != GATING_SIGMOID)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.expert_gating_func = %u is not supported (2, sigmoid, as LFM2's "
                              "converter writes)",
                              hp->arch, gating);
    if (!hp->n_expert || !engine__arch_has(m, "expert_feed_forward_length"))
        return status_set_err(err, err_len, KVS_ENOKEY,
                              "%s needs expert_count > 0 and expert_feed_forward_length", hp->arch);
    /* llama.cpp's expert_weights_scale and _norm are not read for this family: its graph
     * normalizes and does not scale */
    static const char *const refused[] = {"expert_weights_scale", "expert_weights_norm",
                                          "expert_shared_count",
                                          "expert_shared_feed_forward_length"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (engine__arch_has(m, refused[i]))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s.%s: not supported for %s",
                                  hp->arch, refused[i], hp->arch);
    m->moe_lead = lead;
    m->moe_step = 1;
    m->moe_dense = lead > 0;
    return 0;
}

static int load_conv_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, F = hp->n_ff;
    layer_weights *w = &m->layers[l];
    char name[96];
    snprintf(name, sizeof name, "blk.%u.shortconv.conv.weight", l);
    int rc;
    if ((rc = engine__load_layer_vec(m, l, "attn_norm.weight", E, true, &w->attn_norm, err,
                                     err_len)) ||
        (rc = engine__load_vec(m, name, w->conv_len, E, true, &w->conv_w, err, err_len)) ||
        (rc = engine__load_layer_mat(m, l, "shortconv.in_proj.weight", E, 3 * E, true, &w->conv_in,
                                     err, err_len)) ||
        (rc = engine__load_layer_mat(m, l, "shortconv.out_proj.weight", E, E, true, &w->conv_out,
                                     err, err_len)) ||
        (rc = engine__load_layer_vec(m, l, "ffn_norm.weight", E, true, &w->ffn_norm, err, err_len)))
        return rc;
    if (engine__layer_moe(m, l))
        return 0; /* load_lfm2_layer loads the experts */
    if ((rc = engine__load_layer_mat(m, l, "ffn_gate.weight", E, F, true, &w->w_gate, err,
                                     err_len)) ||
        (rc = engine__load_layer_mat(m, l, "ffn_up.weight", E, F, true, &w->w_up, err, err_len)))
        return rc;
    return engine__load_layer_mat(m, l, "ffn_down.weight", F, E, true, &w->w_down, err, err_len);
}

static int load_lfm2_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    layer_weights *w = &m->layers[l];
    uint32_t hd = m->hp.head_dim;
    int rc;
    /* the other kind's tensors in a layer would go unread: head_count_kv disagrees with the
     * tensors, refused naming the tensor (llama.cpp refuses a file with tensors it did not
     * load) */
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", l,
             w->conv_len ? "attn_q.weight" : "shortconv.in_proj.weight");
    if (gguf_find_tensor(m->file, name) >= 0)
        return status_set_err(
            err, err_len, KVS_EUNSUPPORTED, "%s in %s layer (head_count_kv[%u] = %u)", name,
            w->conv_len ? "a convolution" : "an attention", l, w->conv_len ? 0 : m->hp.n_head_kv);
    if (w->conv_len) {
        if ((rc = load_conv_layer(m, l, err, err_len)))
            return rc;
    } else if ((rc = engine__load_llama_layer(m, l, err, err_len)) ||
               (rc = engine__load_layer_vec(m, l, "attn_q_norm.weight", hd, true, &w->q_norm, err,
                                            err_len)) ||
               (rc = engine__load_layer_vec(m, l, "attn_k_norm.weight", hd, true, &w->k_norm, err,
                                            err_len))) {
        return rc;
    }
    if (!engine__layer_moe(m, l))
        return 0;
    if (!w->experts && (rc = engine__load_moe(m, l, err, err_len))) /* llama's loader takes them */
        return rc;
    return engine__load_layer_vec(m, l, "exp_probs_b.bias", m->hp.n_expert, true, &w->exp_probs_b,
                                  err, err_len);
}

/* Position pos's B * x in a layer's rows kl (row bytes a slot), through a block table. */
static const float *conv_row(const uint8_t *kl, size_t row, const int32_t *table, uint32_t bs,
                             uint32_t pos)
{
    return (const float *)(const void *)(kl + ((size_t)table[pos / bs] * bs + pos % bs) * row);
}

/* Layer l's convolution of every row of the batch: its normed input in c->xn, its output (before
 * the residual add) into c->up. Every row's B * x is written to the arena before any row reads
 * its window, so rows of one sequence in one step read each other's as a later step would. */
static void shortconv(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const layer_weights *w = &c->m->layers[l];
    size_t T = b->n_tokens, E = c->m->hp.n_embd, taps = w->conv_len, row = kv->k_row[l];
    float *bcx = c->gate; /* (T, 3E): each row's B, C and x */
    engine__matmul(c, bcx, c->xn, &w->conv_in, T);
    uint8_t *kl = kv->k + kv->layer_off[l];
    bool windowed = kv->group[l] == ENGINE_KV_WINDOWED;
    const int32_t *slot = windowed ? c->wslot : c->slot;
    for (size_t t = 0; t < T; t++) {
        float *bx = (float *)(void *)(kl + (size_t)slot[t] * row);
        const float *bt = bcx + t * 3 * E, *xt = bt + 2 * E;
        for (size_t i = 0; i < E; i++)
            bx[i] = bt[i] * xt[i];
    }
    for (size_t t = 0; t < T; t++) {
        const engine_seq_view *s = &b->seqs[b->seq[t]];
        const int32_t *table = windowed ? s->wblocks : s->blocks;
        uint32_t pos = (uint32_t)b->pos[t];
        float *y = c->xn + t * E;
        /* ggml_ssm_conv's sum for each channel: the taps in order from the oldest position,
         * from 0 (a position before the sequence adds nothing) */
        memset(y, 0, E * sizeof *y);
        for (size_t k = 0; k < taps; k++) {
            if (pos + k + 1 < taps)
                continue;
            const float *src =
                conv_row(kl, row, table, kv->block_size, pos + (uint32_t)k + 1 - (uint32_t)taps);
            for (size_t i = 0; i < E; i++)
                y[i] += src[i] * w->conv_w[i * taps + k];
        }
        const float *ct = bcx + t * 3 * E + E;
        for (size_t i = 0; i < E; i++)
            y[i] = ct[i] * y[i];
    }
    engine__matmul(c, c->up, c->xn, &w->conv_out, T);
}

static void lfm2_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    if (!c->m->layers[l].conv_len) {
        engine__llama_layer(c, kv, b, l);
        return;
    }
    size_t T = b->n_tokens, E = c->m->hp.n_embd;
    engine__norm_rows(c, c->xn, c->x, c->m->layers[l].attn_norm, T, E);
    shortconv(c, kv, b, l);
    kern_add(c->x, c->up, T * E);
    engine__llama_ffn(c, l, T);
}

const engine_arch engine__arch_lfm2 = {
    .name = "lfm2",
    .rope_type = ENGINE_ROPE_NEOX,
    .recurrent = true,
    .output_norm = "token_embd_norm.weight",
    .load_hparams = load_lfm2_hparams,
    .load_layer = load_lfm2_layer,
    .layer = lfm2_layer,
};

const engine_arch engine__arch_lfm2moe = {
    .name = "lfm2moe",
    .rope_type = ENGINE_ROPE_NEOX,
    .recurrent = true,
    .moe = true,
    .moe_route = ENGINE_MOE_SIGMOID_NORM,
    .output_norm = "token_embd_norm.weight",
    .load_hparams = load_lfm2moe_hparams,
    .load_layer = load_lfm2_layer,
    .layer = lfm2_layer,
};
