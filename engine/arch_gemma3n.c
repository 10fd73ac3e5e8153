/* The Gemma 3n text model (general.architecture gemma3n: gemma-3n-E2B, E4B), as llama.cpp's
 * llama_model_gemma3n computes it. Gemma 3's layer (RMSNorm before and after attention and the
 * MLP, per-head Q/K norms, a GELU-gated MLP, NEOX RoPE, windowed layers with their own RoPE base,
 * soft-capped logits, embeddings times sqrt(n_embd)) plus:
 *   AltUp: n_altup streams of n_embd per row (the others made from the embedding by altup_proj,
 *     scaled to its magnitude); each layer predicts every stream from all of them (coefficients
 *     from a tanh router over the active stream), runs its sublayers on the active prediction,
 *     and corrects every stream by the innovation (a second router); the streams are merged
 *     back at the end (altup_unembd_proj, scaled to the active stream's magnitude, averaged).
 *   LAuReL: a rank-64 branch beside attention (laurel_l, laurel_r, a norm), added to its output
 *     with the residual, the sum times 1/sqrt(2).
 *   Per-layer embeddings: per_layer_token_embd's row of the token (n_layer blocks of
 *     embedding_length_per_layer_input) plus a normed projection of the embedding, each layer
 *     gating its block by its corrected active stream (inp_gate, GELU), projecting it back (proj,
 *     post_norm) and adding it to the streams 1..n_altup-1.
 *   Sparsity: the first 10 layers' MLP gates keep only what exceeds mean + 1.6448533 std of the
 *     row (a Gaussian's 95th percentile), minus that cut.
 *   Shared KV: layers from 20 on write no K/V and attend over layer 18's rows (windowed) or 19's
 *     (global); V is RMS-normed without a weight; scores are q.k unscaled (the norms stand in).
 * llama.cpp fixes the sparse layers (10), the KV layers (20), the window pattern (5: four
 * windowed, one global, unless a number is given), LAuReL's rank (64), the streams (4, the
 * first active) and the per-layer width (256); files whose keys say otherwise are refused by
 * the key's name. */
#include "engine/arch.h"

#include "common/hugemem.h"
#include "common/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* layer_weights.extra / extra_vec slots */
enum { X_ROUTER, X_PREDICT, X_CORRECT, X_LAUREL_L, X_LAUREL_R, X_INP_GATE, X_PROJ };
enum { V_ROUTER_NORM, V_CORRECT_SCALE, V_LAUREL_NORM, V_POST_NORM };
/* engine_model.extra: altup_proj's matrices from 0, altup_unembd_proj's from X_UNEMBD; the
 * per-layer projection; extra_vec: per_layer_proj_norm, a vector of ones (V's norm) */
enum { X_UNEMBD = 7, X_PL_PROJ = 14 };
enum { M_PL_NORM, M_ONES };
/* engine_model.extra_u32 */
enum { U_ALTUP, U_ACT, U_PL, U_KV_FROM, U_SPARSE };

#define LAUREL_RANK 64   /* llama_hparams::laurel_rank: not a key */
#define KV_FROM 20       /* llama.cpp's n_layer_kv_from_start for gemma3n */
#define SPARSE_LAYERS 10 /* llama.cpp's n_layer_sparsity */
#define SWA_PERIOD 5     /* llama.cpp's default; an array of the key is ignored there */
#define ALTUP 4          /* llama_hparams::n_altup, */
#define ALTUP_ACT 0      /* i_altup_act */
#define PER_LAYER 256    /* and n_embd_altup (the per-layer input width): not read from a file */
#define SPARSITY_STD_MUL 1.6448533535003662f /* Normal(0, 1).icdf(0.95), llama.cpp's */

static bool swa_layer(uint32_t period, uint32_t l)
{
    return l % period < period - 1;
}

/* attention.sliding_window_pattern: absent, a number (the period), or one bool per layer, which
 * llama.cpp ignores (its period stays 5): accepted only where it says what llama.cpp runs. */
static int load_pattern(engine_model *m, uint32_t *period, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "gemma3n.attention.sliding_window_pattern");
    enum gguf_type et;
    uint64_t n;
    const void *data;
    *period = SWA_PERIOD;
    if (gguf_get_arr(m->file, key, &et, &n, &data)) {
        int rc = engine__arch_u32(m, "attention.sliding_window_pattern", period, false, 1, 1u << 20,
                                  err, err_len);
        return rc;
    }
    if (et != GGUF_TYPE_BOOL || n != m->hp.n_layer)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s is not one bool per layer", key);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        uint8_t v = ((const uint8_t *)data)[l];
        if ((v != 0) != swa_layer(SWA_PERIOD, l))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s[%u] = %s: only llama.cpp's pattern (four windowed layers, "
                                  "then one global) is supported",
                                  key, l, v ? "true" : "false");
    }
    return 0;
}

/* activation_sparsity_scale (the converter's std multiplier per layer), which llama.cpp does
 * not read: accepted where it matches the constant it uses on the first 10 layers and none on
 * the others. */
static int check_sparsity(engine_model *m, char *err, size_t err_len)
{
    const char *key = "gemma3n.activation_sparsity_scale";
    enum gguf_type et;
    uint64_t n;
    const void *data;
    if (gguf_find_key(m->file, key) < 0)
        return 0;
    if (gguf_get_arr(m->file, key, &et, &n, &data) || et != GGUF_TYPE_FLOAT32 || n != m->hp.n_layer)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s is not one float per layer", key);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        float v, want = l < SPARSE_LAYERS ? SPARSITY_STD_MUL : 0.0f;
        memcpy(&v, (const uint8_t *)data + 4 * (size_t)l, 4);
        if (!(fabsf(v - want) <= 1e-4f))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s[%u] = %g: only llama.cpp's sparsity (%g on the first %u "
                                  "layers, none after) is supported",
                                  key, l, (double)v, (double)SPARSITY_STD_MUL, SPARSE_LAYERS);
    }
    return 0;
}

static int load_gemma3n_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    int rc;
    m->embd_scale = sqrtf((float)hp->n_embd);
    m->attn_scale = 1.0f; /* llama.cpp's f_attention_scale: the Q and K norms stand in */
    m->final_softcap = 30.0f;
    if ((rc = engine__arch_f32(m, "final_logit_softcapping", &m->final_softcap, err, err_len)))
        return rc;
    if (!(m->final_softcap > 0 && m->final_softcap < 1e6f))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "gemma3n.final_logit_softcapping = %g out of range",
                              (double)m->final_softcap);
    float cap = 0.0f;
    if ((rc = engine__arch_f32(m, "attn_logit_softcapping", &cap, err, err_len)))
        return rc;
    if (cap != 0.0f)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "gemma3n.attn_logit_softcapping = %g: gemma3n has no attention "
                              "soft-capping (not supported)",
                              (double)cap);
    /* llama.cpp reads none of these three (its constants): a file saying otherwise is refused */
    static const struct {
        const char *suffix;
        uint32_t value;
    } fixed[] = {{"altup.num_inputs", ALTUP},
                 {"altup.active_idx", ALTUP_ACT},
                 {"embedding_length_per_layer_input", PER_LAYER}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        uint32_t v = fixed[i].value;
        if ((rc = engine__arch_u32(m, fixed[i].suffix, &v, false, 0, UINT32_MAX, err, err_len)))
            return rc;
        if (v != fixed[i].value)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "gemma3n.%s = %u is not supported (llama.cpp's gemma3n is %u)",
                                  fixed[i].suffix, v, fixed[i].value);
    }
    uint32_t period, A = ALTUP, act = ALTUP_ACT, P = PER_LAYER, shared = 0;
    if ((rc = engine__arch_u32(m, "attention.sliding_window", &hp->n_swa, true, 1, UINT32_MAX, err,
                               err_len)) ||
        (rc = load_pattern(m, &period, err, err_len)) || (rc = check_sparsity(m, err, err_len)) ||
        (rc = engine__arch_u32(m, "attention.shared_kv_layers", &shared, false, 0, hp->n_layer, err,
                               err_len)))
        return rc;
    /* llama.cpp gives layers 0..19 their own K/V whatever the key says */
    uint32_t from = hp->n_layer < KV_FROM ? hp->n_layer : KV_FROM;
    if (hp->n_layer - shared != from)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "gemma3n.attention.shared_kv_layers = %u of %u layers: only the "
                              "layers from %u on sharing K/V is supported (llama.cpp's)",
                              shared, hp->n_layer, KV_FROM);
    hp->swa_pattern = period;
    if ((uint64_t)hp->n_layer * P > (1u << 24))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "gemma3n.embedding_length_per_layer_input = %u is too wide", P);
    float base_swa = hp->rope_base;
    if ((rc = engine__arch_f32(m, "rope.freq_base_swa", &base_swa, err, err_len)))
        return rc;
    if (!(base_swa > 1 && base_swa < 1e12f))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "gemma3n.rope.freq_base_swa %g out of range", (double)base_swa);
    m->rope[1] = (rope_params){base_swa, m->rope[0].scale, false};
    m->n_rope = 2;
    m->extra_u32[U_ALTUP] = A;
    m->extra_u32[U_ACT] = act;
    m->extra_u32[U_PL] = P;
    m->extra_u32[U_KV_FROM] = from;
    m->extra_u32[U_SPARSE] = SPARSE_LAYERS;
    size_t in = hp->n_embd > LAUREL_RANK ? hp->n_embd : LAUREL_RANK;
    m->extra_in = in > P ? in : P;
    return 0;
}

/* The model-wide tensors (loaded with layer 0) and a vector of ones for V's norm. */
static int load_model_parts(engine_model *m, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, A = m->extra_u32[U_ALTUP], P = m->extra_u32[U_PL],
             LP = (uint64_t)hp->n_layer * P;
    int rc;
    if ((rc = engine__load_stack(m, "altup_proj.weight", E, E, (uint32_t)(A - 1), &m->extra[0], 1,
                                 err, err_len)) ||
        (rc = engine__load_stack(m, "altup_unembd_proj.weight", E, E, (uint32_t)(A - 1),
                                 &m->extra[X_UNEMBD], 1, err, err_len)) ||
        (rc = engine__load_mat(m, "per_layer_model_proj.weight", E, LP, true, &m->extra[X_PL_PROJ],
                               err, err_len)) ||
        (rc = engine__load_mat(m, "per_layer_token_embd.weight", LP, hp->n_vocab, true,
                               &m->extra_table, err, err_len)) ||
        (rc = engine__load_vec(m, "per_layer_proj_norm.weight", P, 1, true,
                               &m->extra_vec[M_PL_NORM], err, err_len)))
        return rc;
    float *ones = kvs_huge_alloc(hp->head_dim * sizeof *ones, false);
    void **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
    if (!ones || !owned) {
        kvs_huge_free(ones);
        if (owned)
            m->owned = owned;
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
    }
    m->owned = owned;
    m->owned[m->n_owned++] = ones;
    for (uint32_t i = 0; i < hp->head_dim; i++)
        ones[i] = 1.0f;
    m->extra_vec[M_ONES] = ones;
    return 0;
}

static int load_gemma3n_layer(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    int rc;
    if (l == 0 && (rc = load_model_parts(m, err, err_len)))
        return rc;
    if ((rc = engine__load_llama_layer(m, l, err, err_len)))
        return rc;
    const engine_hparams *hp = &m->hp;
    layer_weights *w = &m->layers[l];
    uint64_t E = hp->n_embd, A = m->extra_u32[U_ALTUP], P = m->extra_u32[U_PL];
    struct {
        const char *suffix;
        uint64_t d0, d1;
        const float **vec;
        kern_mat *mat;
    } spec[] = {
        {"post_attention_norm.weight", E, 1, &w->post_attn_norm, NULL},
        {"post_ffw_norm.weight", E, 1, &w->post_ffn_norm, NULL},
        {"attn_q_norm.weight", hp->head_dim, 1, &w->q_norm, NULL},
        {"attn_k_norm.weight", hp->head_dim, 1, &w->k_norm, NULL},
        {"inp_gate.weight", E, P, NULL, &w->extra[X_INP_GATE]},
        {"proj.weight", P, E, NULL, &w->extra[X_PROJ]},
        {"post_norm.weight", E, 1, &w->extra_vec[V_POST_NORM], NULL},
        {"altup_correct_coef.weight", A, A, NULL, &w->extra[X_CORRECT]},
        {"altup_correct_scale.weight", E, 1, &w->extra_vec[V_CORRECT_SCALE], NULL},
        {"altup_predict_coef.weight", A, A * A, NULL, &w->extra[X_PREDICT]},
        {"altup_router.weight", E, A, NULL, &w->extra[X_ROUTER]},
        {"altup_router_norm.weight", E, 1, &w->extra_vec[V_ROUTER_NORM], NULL},
        {"laurel_l.weight", E, LAUREL_RANK, NULL, &w->extra[X_LAUREL_L]},
        {"laurel_r.weight", LAUREL_RANK, E, NULL, &w->extra[X_LAUREL_R]},
        {"laurel_post_norm.weight", E, 1, &w->extra_vec[V_LAUREL_NORM], NULL},
    };
    for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
        rc = spec[k].vec ? engine__load_layer_vec(m, l, spec[k].suffix, spec[k].d0, true,
                                                  spec[k].vec, err, err_len)
                         : engine__load_layer_mat(m, l, spec[k].suffix, spec[k].d0, spec[k].d1,
                                                  true, spec[k].mat, err, err_len);
        if (rc)
            return rc;
    }
    bool windowed = swa_layer(hp->swa_pattern, l);
    w->window = windowed ? hp->n_swa : 0;
    w->rope_set = windowed ? 1 : 0;
    uint32_t from = m->extra_u32[U_KV_FROM];
    if (l >= from) {
        /* llama.cpp's reuse: windowed layers read layer from - 2, global ones from - 1; their
         * own K and V (which the file holds) are never used */
        uint32_t src = from - (windowed ? 2 : 1);
        if (from < 2 || swa_layer(hp->swa_pattern, src) != windowed)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "gemma3n: layer %u would read layer %u's K/V, which is %s "
                                  "(attention.sliding_window_pattern %u not supported)",
                                  l, src, windowed ? "global" : "windowed", hp->swa_pattern);
        w->kv_shared = true;
        w->kv_layer = src;
        w->wk = w->wv = (kern_mat){0};
    }
    return 0;
}

/* ---- one step ---- */

/* The step buffers (floats, T rows): the streams and their predictions (T, A, E), the per-layer
 * inputs (T, L, P), a row of n_embd (T, E), a low-rank or per-layer row (T, max(R, P)), the
 * router's outputs (T, A), the prediction coefficients (T, A * A) and one token's row of the
 * per-layer table (L * P). */
typedef struct bufs {
    float *st, *pred, *pl, *e, *r, *mod, *cf, *tok;
} bufs;

static size_t lowrank(const engine_model *m)
{
    uint32_t P = m->extra_u32[U_PL];
    return P > LAUREL_RANK ? P : LAUREL_RANK;
}

static size_t gemma3n_ctx_floats(const engine_model *m, size_t T)
{
    size_t A = m->extra_u32[U_ALTUP], E = m->hp.n_embd;
    size_t LP = (size_t)m->hp.n_layer * m->extra_u32[U_PL];
    return T * (2 * A * E + LP + E + lowrank(m) + A + A * A) + LP;
}

static bufs get_bufs(const engine_ctx *c)
{
    const engine_model *m = c->m;
    size_t T = c->max_tokens, A = m->extra_u32[U_ALTUP], E = m->hp.n_embd;
    bufs b;
    b.st = c->fam;
    b.pred = b.st + T * A * E;
    b.pl = b.pred + T * A * E;
    b.e = b.pl + T * m->hp.n_layer * m->extra_u32[U_PL];
    b.r = b.e + T * E;
    b.mod = b.r + T * lowrank(m);
    b.cf = b.mod + T * A;
    b.tok = b.cf + T * A * A;
    return b;
}

/* sqrt of the sum of squares, summed in double as ggml_sum_rows */
static float magnitude(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)(x[i] * x[i]);
    return sqrtf((float)s);
}

/* x times target / its own magnitude (ggml_div(ggml_mul(x, target), mag)) */
static void rescale(float *x, size_t n, float target)
{
    float mag = magnitude(x, n);
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] * target / mag;
}

static void gemma3n_begin(engine_ctx *c, const engine_batch *b)
{
    const engine_model *m = c->m;
    bufs f = get_bufs(c);
    size_t T = b->n_tokens, E = m->hp.n_embd, A = m->extra_u32[U_ALTUP], L = m->hp.n_layer,
           P = m->extra_u32[U_PL];
    /* per-layer inputs: (normed projection of the embedding + the token's row) / sqrt 2 */
    engine__matmul(c, f.pl, c->x, &m->extra[X_PL_PROJ], T);
    float proj_scale = 1.0f / sqrtf((float)E), tok_scale = sqrtf((float)P),
          in_scale = 1.0f / sqrtf(2.0f);
    for (size_t t = 0; t < T; t++) {
        float *pl = f.pl + t * L * P;
        for (size_t i = 0; i < L * P; i++)
            pl[i] *= proj_scale;
        engine__norm_rows(c, pl, pl, m->extra_vec[M_PL_NORM], L, P);
        kern_rows_to_f32(&m->extra_table, (size_t)b->token[t], 1, f.tok);
        for (size_t i = 0; i < L * P; i++)
            pl[i] = (pl[i] + f.tok[i] * tok_scale) * in_scale;
    }
    /* the streams: the embedding, then altup_proj's of it at its magnitude */
    for (size_t t = 0; t < T; t++)
        memcpy(f.st + t * A * E, c->x + t * E, E * sizeof(float));
    for (size_t j = 1; j < A; j++) {
        engine__matmul(c, f.e, c->x, &m->extra[j - 1], T);
        for (size_t t = 0; t < T; t++) {
            float *s = f.st + (t * A + j) * E;
            memcpy(s, f.e + t * E, E * sizeof(float));
            rescale(s, E, magnitude(c->x + t * E, E));
        }
    }
}

/* modalities (T, A) = tanh(router * (RMSNorm(x, router_norm) / n_embd)) of rows x (T, E) */
static void router(engine_ctx *c, const layer_weights *w, const float *x, size_t T, float *out)
{
    size_t E = c->m->hp.n_embd, A = c->m->extra_u32[U_ALTUP];
    engine__norm_rows(c, c->xn, x, w->extra_vec[V_ROUTER_NORM], T, E);
    float s = 1.0f / (float)E;
    for (size_t i = 0; i < T * E; i++)
        c->xn[i] *= s;
    engine__matmul(c, out, c->xn, &w->extra[X_ROUTER], T);
    for (size_t i = 0; i < T * A; i++)
        out[i] = tanhf(out[i]);
}

/* g[i] = GELU(g[i]) * u[i] as ggml_gelu then ggml_mul compute it on the CPU (llama.cpp's gemma3n
 * graph, unlike Gemma 3's fused GEGLU): GELU's tanh approximation looked up at the input
 * rounded to F16 and rounded to F16 itself (ggml's table), 0 below -10 and x above 10 */
static void gelu_f16_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = g[i], y;
        if (x <= -10.0f) {
            y = 0.0f;
        } else if (x >= 10.0f) {
            y = x;
        } else {
            float h = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x));
            y = 0.5f * h *
                (1.0f +
                 tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
            y = ggml_fp16_to_fp32(ggml_fp32_to_fp16(y));
        }
        g[i] = u[i] * y;
    }
}

/* The first layers' MLP gate: what exceeds mean + SPARSITY_STD_MUL * std of the row (the
 * sample std, n - 1), minus that; sums in double as ggml's */
static void gaussian_topk(float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i];
    float mean = (float)s / (float)n;
    double v = 0.0;
    for (size_t i = 0; i < n; i++) {
        float d = x[i] - mean;
        v += (double)(d * d);
    }
    float sd = sqrtf((float)v * (1.0f / (float)(n - 1)));
    float cut = mean + sd * SPARSITY_STD_MUL;
    for (size_t i = 0; i < n; i++) {
        float y = x[i] - cut;
        x[i] = y > 0.0f ? y : 0.0f;
    }
}

static void gemma3n_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_model *m = c->m;
    const engine_hparams *hp = &m->hp;
    const layer_weights *w = &m->layers[l];
    bufs f = get_bufs(c);
    size_t T = b->n_tokens, E = hp->n_embd, A = m->extra_u32[U_ALTUP], act = m->extra_u32[U_ACT],
           P = m->extra_u32[U_PL], L = hp->n_layer, F = hp->n_ff;

    /* predict: each stream from all of them, coefficients from the active one's router */
    for (size_t t = 0; t < T; t++)
        memcpy(c->x + t * E, f.st + (t * A + act) * E, E * sizeof(float));
    router(c, w, c->x, T, f.mod);
    engine__matmul(c, f.cf, f.mod, &w->extra[X_PREDICT], T);
    for (size_t t = 0; t < T; t++) {
        const float *s = f.st + t * A * E, *cf = f.cf + t * A * A;
        float *p = f.pred + t * A * E;
        for (size_t i = 0; i < A; i++)
            for (size_t e = 0; e < E; e++) {
                double sum = 0.0;
                for (size_t k = 0; k < A; k++)
                    sum += (double)(s[k * E + e] * cf[i * A + k]);
                p[i * E + e] = (float)sum + s[i * E + e];
            }
    }
    /* c->x: the active prediction, the sublayers' input and residual */
    for (size_t t = 0; t < T; t++)
        memcpy(c->x + t * E, f.pred + (t * A + act) * E, E * sizeof(float));
    engine__norm_rows(c, c->xn, c->x, w->attn_norm, T, E);

    /* LAuReL into f.e: RMSNorm(laurel_r * laurel_l * xn) + xn */
    engine__matmul(c, f.r, c->xn, &w->extra[X_LAUREL_L], T);
    engine__matmul(c, f.e, f.r, &w->extra[X_LAUREL_R], T);
    engine__norm_rows(c, f.e, f.e, w->extra_vec[V_LAUREL_NORM], T, E);
    kern_add(f.e, c->xn, T * E);

    /* attention: a shared-KV layer computes Q only and reads its source layer's rows */
    if (w->kv_shared) {
        engine__matmul(c, c->q, c->xn, &w->wq, T);
        engine__norm_rows(c, c->q, c->q, w->q_norm, T * hp->n_head, hp->head_dim);
        engine__rope_q(c, b, l);
    } else {
        const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
        float *qkv_out[3] = {c->q, c->k, c->v};
        engine__matmuls(c, c->xn, T, 3, qkv, qkv_out, ENGINE_GLU_NONE);
        engine__norm_rows(c, c->q, c->q, w->q_norm, T * hp->n_head, hp->head_dim);
        engine__norm_rows(c, c->k, c->k, w->k_norm, T * hp->n_head_kv, hp->head_dim);
        engine__norm_rows(c, c->v, c->v, m->extra_vec[M_ONES], T * hp->n_head_kv, hp->head_dim);
        engine__rope_store(c, kv, b, l);
    }
    engine__attention(c, kv, b, l);
    engine__matmul(c, c->xn, c->att, &w->wo, T);
    engine__norm_rows(c, c->xn, c->xn, w->post_attn_norm, T, E);
    kern_add(c->xn, c->x, T * E);
    /* c->x: (attention + residual + LAuReL) / sqrt 2 */
    float r2 = 1.0f / sqrtf(2.0f);
    for (size_t i = 0; i < T * E; i++)
        c->x[i] = (c->xn[i] + f.e[i]) * r2;

    /* the MLP, its gate cut on the first layers; its output + c->x into c->x */
    engine__norm_rows(c, c->xn, c->x, w->ffn_norm, T, E);
    const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
    float *gate_up_out[2] = {c->gate, c->up};
    engine__matmuls(c, c->xn, T, 2, gate_up, gate_up_out, ENGINE_GLU_NONE);
    for (size_t t = 0; t < T; t++) {
        if (l < m->extra_u32[U_SPARSE])
            gaussian_topk(c->gate + t * F, F);
        gelu_f16_mul(c->gate + t * F, c->up + t * F, F);
    }
    engine__matmul(c, f.e, c->gate, &w->w_down, T);
    engine__norm_rows(c, f.e, f.e, w->post_ffn_norm, T, E);
    kern_add(c->x, f.e, T * E);

    /* correct: every stream's prediction plus the innovation times (its coefficient + 1) */
    router(c, w, c->x, T, f.mod);
    engine__matmul(c, f.cf, f.mod, &w->extra[X_CORRECT], T);
    for (size_t t = 0; t < T; t++) {
        const float *a = c->x + t * E, *p = f.pred + t * A * E, *cc = f.cf + t * A;
        float *s = f.st + t * A * E;
        for (size_t i = 0; i < A; i++) {
            float k = cc[i] + 1.0f;
            for (size_t e = 0; e < E; e++)
                s[i * E + e] = (a[e] - p[act * E + e]) * k + p[i * E + e];
        }
    }

    /* the per-layer input: gate of the corrected active stream, times this layer's block,
     * projected and normed, added to streams 1.. */
    const float *scale = w->extra_vec[V_CORRECT_SCALE];
    for (size_t t = 0; t < T; t++)
        for (size_t e = 0; e < E; e++)
            c->xn[t * E + e] = f.st[(t * A + act) * E + e] * scale[e];
    engine__matmul(c, f.r, c->xn, &w->extra[X_INP_GATE], T);
    for (size_t t = 0; t < T; t++)
        gelu_f16_mul(f.r + t * P, f.pl + (t * L + l) * P, P);
    engine__matmul(c, f.e, f.r, &w->extra[X_PROJ], T);
    engine__norm_rows(c, f.e, f.e, w->extra_vec[V_POST_NORM], T, E);
    for (size_t t = 0; t < T; t++)
        for (size_t i = 1; i < A; i++)
            kern_add(f.st + (t * A + i) * E, f.e + t * E, E);
}

/* the streams merged into c->x: stream 0 and the others' altup_unembd_proj (at the active
 * stream's magnitude), averaged */
static void gemma3n_end(engine_ctx *c, const engine_batch *b)
{
    const engine_model *m = c->m;
    bufs f = get_bufs(c);
    size_t T = b->n_tokens, E = m->hp.n_embd, A = m->extra_u32[U_ALTUP], act = m->extra_u32[U_ACT];
    for (size_t t = 0; t < T; t++)
        memcpy(c->x + t * E, f.st + t * A * E, E * sizeof(float));
    for (size_t j = 1; j < A; j++) {
        for (size_t t = 0; t < T; t++)
            memcpy(f.e + t * E, f.st + (t * A + j) * E, E * sizeof(float));
        engine__matmul(c, c->xn, f.e, &m->extra[X_UNEMBD + j - 1], T);
        for (size_t t = 0; t < T; t++) {
            rescale(c->xn + t * E, E, magnitude(f.st + (t * A + act) * E, E));
            kern_add(c->x + t * E, c->xn + t * E, E);
        }
    }
    float inv = 1.0f / (float)A;
    for (size_t i = 0; i < T * E; i++)
        c->x[i] *= inv;
}

const engine_arch engine__arch_gemma3n = {
    .name = "gemma3n",
    .rope_type = ENGINE_ROPE_NEOX,
    .free_head_dim = true,
    .load_hparams = load_gemma3n_hparams,
    .load_layer = load_gemma3n_layer,
    .layer = gemma3n_layer,
    .ctx_floats = gemma3n_ctx_floats,
    .begin = gemma3n_begin,
    .end = gemma3n_end,
};
