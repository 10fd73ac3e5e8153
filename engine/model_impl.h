/* What the engine's files share (the engine__ tier of names: not for other modules): the
 * model, KV arena and step context structs. The calls between model.c (loading), the family
 * files (arch.h), forward.c (one batched step) and attention.c (paged attention) are in
 * arch.h. */
#ifndef KVS_ENGINE_MODEL_IMPL_H
#define KVS_ENGINE_MODEL_IMPL_H

#include "engine/gguf.h"
#include "engine/kern/kern.h"
#include "engine/model.h"
#include "engine/threadpool.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct engine_arch engine_arch;       /* a model family: arch.h */
typedef struct engine_moe_buf engine_moe_buf; /* a step's expert routing: moe.c */

#define ENGINE_LAYER_EXTRA 8  /* a layer's family matrices (layer_weights.extra) */
#define ENGINE_MODEL_EXTRA 16 /* a model's (engine_model.extra) */

typedef struct layer_weights {
    const float *attn_norm; /* (n_embd) */
    kern_mat wq;            /* (n_head * head_dim, n_embd): row-major out x in */
    kern_mat wk;            /* (n_head_kv * head_dim, n_embd) */
    kern_mat wv;            /* (n_head_kv * head_dim, n_embd) */
    const float *bq;        /* (n_head * head_dim) or NULL: qwen2's projection biases */
    const float *bk;        /* (n_head_kv * head_dim) or NULL */
    const float *bv;        /* (n_head_kv * head_dim) or NULL */
    const float *q_norm;    /* (head_dim) or NULL: per-head RMSNorm of Q before RoPE */
    const float *k_norm;    /* (head_dim) or NULL: the same for K */
    kern_mat wo;            /* (n_embd, n_head * head_dim) */
    const float *bo;        /* (n_embd) or NULL: the output projection's bias (gpt-oss) */
    const float *sinks; /* (n_head) or NULL: each head's sink logit, a softmax term with no value
                           (gpt-oss's attn_sinks) */
    const float *post_attn_norm; /* (n_embd) or NULL: norm of the attention output (gemma) */
    const float *ffn_norm;       /* (n_embd) */
    kern_mat w_gate;             /* (n_ff, n_embd) */
    kern_mat w_up;               /* (n_ff, n_embd) */
    kern_mat w_down;             /* (n_embd, n_ff) */
    kern_mat router;             /* (n_expert, n_embd) of an MoE layer (ffn_gate_inp), else empty */
    kern_mat *experts;        /* [n_expert][3] of an MoE layer: gate, up (n_ff_exp, n_embd) and down
                                 (n_embd, n_ff_exp) of each expert, in place of w_gate..; else NULL */
    const float *router_b;    /* (n_expert) or NULL: the router's bias (gpt-oss) */
    const float *exp_probs_b; /* (n_expert) or NULL: added to the probabilities to pick the
                                 experts, not to their weights (ernie4_5-moe's exp_probs_b) */
    const float *exp_b[3];    /* (n_expert, n_ff_exp) gate, up and (n_expert, n_embd) down biases
                                 of the experts, or NULL (gpt-oss) */
    kern_mat sh_gate, sh_up;  /* (n_ff_shexp, n_embd) a shared expert's (granitemoeshared) */
    kern_mat sh_down;         /* (n_embd, n_ff_shexp); all three empty without one */
    const float *post_ffn_norm; /* (n_embd) or NULL: norm of the MLP output (gemma) */
    /* A short-convolution layer (lfm2) in place of attention: in_proj's B, C and x rows, the
     * depthwise taps, out_proj; conv_len 0 on an attention layer. */
    kern_mat conv_in;    /* (3 n_embd, n_embd) */
    kern_mat conv_out;   /* (n_embd, n_embd) */
    const float *conv_w; /* (n_embd, conv_len): channel i's taps, oldest position first */
    uint32_t conv_len;   /* taps: the layer reads its last conv_len positions' B*x */
    bool recurrent;      /* head_count_kv 0 for this layer in the file: the family's recurrent block
                            (lfm2's convolution) in place of attention */
    uint32_t window;     /* attends to the last `window` positions only; 0: all */
    uint32_t rope_set;   /* index into engine_model.rope */
    bool no_rope;        /* queries and keys go unrotated (smollm3's NoPE layers, every layer of a
                            granite file with rope.scaling.finetuned false): rope_set unused */
    bool kv_shared;      /* writes no K/V: attends over layer kv_layer's rows (gemma3n's shared-KV
                            layers; the arena gives it no rows of its own) */
    uint32_t kv_layer;   /* with kv_shared: the earlier layer whose K/V it reads */
    /* A family's own matrices and vectors (gemma3n's AltUp, LAuReL and per-layer input parts:
     * arch_gemma3n.c names the slots), the matrices repacked as the ones above; unused: empty. */
    kern_mat extra[ENGINE_LAYER_EXTRA];
    const float *extra_vec[ENGINE_LAYER_EXTRA];
} layer_weights;

/* One RoPE frequency table: angle of pair j at position p is p * scale * base^(-2j/n_rot)
 * (/ rope_freqs[j] when the file has them). */
typedef struct rope_params {
    float base, scale;
    bool plain; /* no YaRN and no attention factor on this set (olmo2's windowed layers) */
} rope_params;

#define ENGINE_ROPE_SETS 2 /* gemma3: global layers and windowed ones */

struct engine_model {
    engine_hparams hp;
    const engine_arch *arch;
    const float *rope_freqs; /* (n_rot / 2) or NULL: Llama 3.1 frequency divisors */
    gguf_file *file;
    tok_vocab *vocab;
    char *name;
    char *chat_template;
    kern_mat tok_embd;        /* (n_vocab, n_embd) */
    const float *output_norm; /* (n_embd) */
    kern_mat output;          /* (n_vocab, n_embd), token_embd when tied */
    layer_weights *layers;
    rope_params rope[ENGINE_ROPE_SETS];
    uint32_t n_rope;        /* RoPE sets in use: 1, or 2 */
    float embd_scale;       /* embedding rows are multiplied by it (gemma: sqrt(n_embd)); 1 */
    float attn_scale;       /* attention scores are q.k times it (1 / sqrt(head_dim) by default) */
    float attn_softcap;     /* > 0: scores become cap * tanh(score / cap) before the softmax */
    float final_softcap;    /* > 0: logits become cap * tanh(logit / cap) */
    float logit_mul;        /* logits are multiplied by it (granite: 1 / logit_scale); 1 */
    float residual_scale;   /* != 0: a sublayer's output is times it before the residual add
                               (granite); 0: added as it is */
    float attn_temp_scale;  /* mistral3's attention.temperature_scale: each query row times
                               1 + it ln(1 + floor(pos / attn_temp_len)) after RoPE */
    uint32_t attn_temp_len; /* the positions' divisor; 0: no temperature */
    bool no_rope;           /* granite's rope.scaling.finetuned false: every layer's no_rope
                               (positions enter through the causal mask only) */
    bool moe_dense;         /* an MoE model with dense MLP layers as well (ernie4_5-moe's leading
                               and interleaved ones): w_gate.. n_ff wide beside the experts */
    uint32_t moe_lead;      /* ernie4_5-moe: layers l >= moe_lead with (l + 1) % moe_step == 0 */
    uint32_t moe_step;      /* run experts, the others the dense MLP */
    /* A family's own model-wide parts (gemma3n's AltUp projections and per-layer embeddings:
     * arch_gemma3n.c): matrices repacked as the layers' (empty ones skipped), a lookup table
     * kept in the file's rows as an untied tok_embd, vectors, sizes. */
    kern_mat extra[ENGINE_MODEL_EXTRA];
    kern_mat extra_table;
    const float *extra_vec[2];
    uint32_t extra_u32[8];
    size_t extra_in;        /* the widest input of the family's matrices (the ctx's buffers) */
    engine_pooling pooling; /* <arch>.pooling_type, NONE when absent or another value */
    uint32_t weight_type;
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t expert_params; /* of n_params and weight_bytes, those in experts' matrices (an MoE */
    uint64_t expert_bytes;  /* model's tokens each read n_expert_used / n_expert of them) */
    void **owned; /* widened copies (norm vectors, BF16 matrices) and panel-layout weights */
    size_t n_owned;
    const void **released; /* while loading: the file's tensors copied, no longer read there */
    size_t n_released;
    const kern_ops *kern; /* the kernel table every product and vector helper goes through */
    bool qdot;            /* --activations q8: types with an integer kernel keep the file's rows */
    size_t n_qdot;        /* matrices on the integer path */
    size_t n_x8;          /* of which interleaved (kern/qdot_pack.c) */
};

struct engine_kv {
    engine_kv_type type;
    uint32_t n_blocks, block_size, n_layer, kv_dim;
    size_t esz;         /* bytes per value: 2 (F16) or 4 (F32) */
    uint32_t n_wblocks; /* blocks of the windowed group of a split arena, 0: single arena */
    uint8_t *k;         /* each layer's (n_slots of its group, kv_dim) one after another */
    uint8_t *v;
    size_t *layer_off; /* [n_layer] byte offset of layer l's K in k */
    size_t *v_off;     /* [n_layer] byte offset of layer l's V in v */
    size_t *k_row;     /* [n_layer] bytes of a slot's K: kv_dim * esz, or a short-convolution
                          layer's B*x (n_embd F32 values) */
    size_t *v_row;     /* [n_layer] bytes of a slot's V: kv_dim * esz, or 0 (a convolution) */
    uint8_t *group;    /* [n_layer] ENGINE_KV_GLOBAL / ENGINE_KV_WINDOWED (all global: single) */
};

/* Attention work units: positions per item and items per pool job (see attention()). */
#define ATTN_SPAN 128
#define ATTN_WAVE 256
#define ATTN_GROUP 16 /* rows of one sequence that one task takes through a span together */
/* floats of one thread's attention weights: a span's for every head, or for a group's rows */
#define ATTN_SCORES(n_head) ((size_t)((n_head) > ATTN_GROUP ? (n_head) : ATTN_GROUP) * ATTN_SPAN)

/* A task of attention: one span for the rows [t0, t1) of one sequence (those with an item of
 * that span in the wave). */
typedef struct attn_task {
    uint32_t t0, t1, span;
} attn_task;

struct engine_ctx {
    const engine_model *m;
    uint32_t max_tokens;
    uint32_t n_threads;
    tpool *pool;
    const kern_ops *kern;  /* the model's kernel table */
    float *x;              /* (max_tokens, n_embd) residual stream */
    float *xn;             /* (max_tokens, n_embd) normed input of a sublayer */
    float *q;              /* (max_tokens, n_head * head_dim) */
    float *k;              /* (max_tokens, kv_dim) */
    float *v;              /* (max_tokens, kv_dim) */
    float *att;            /* (max_tokens, n_head * head_dim) attention output before wo */
    float *gate;           /* (max_tokens, n_ff, or an MoE model's n_ff_exp; the widest of the
                              layers' MLPs) */
    float *up;             /* (max_tokens, as gate) */
    engine_moe_buf *moe;   /* an MoE model's routing and expert buffers (moe.c), else NULL */
    float *scores;         /* (n_threads, ATTN_SCORES(n_head)) each thread's attention weights */
    float *attn_part;      /* (ATTN_WAVE, n_head, head_dim + 2) a wave's span results */
    float *attn_state;     /* (max_tokens, n_head, head_dim + 2) each row's spans folded so far */
    uint32_t *attn_first;  /* (max_tokens + 1) first attention item of each row */
    attn_task *attn_tasks; /* (ATTN_WAVE) the tasks of a wave */
    float *tile;           /* (n_threads, tile_floats) a Q8_0 panel widened for several row tiles */
    size_t tile_floats;    /* KERN_PANEL * max(n_embd, n_ff) */
    void *xq[2];           /* the step's rows quantized for the integer path: KERN_QX_32, _256 */
    float *xp;             /* (max_tokens, max_in) the step's rows as kern->pack_x lays them out,
                              when it has one */
    int32_t *slot;         /* (max_tokens) arena slot of each row (global layers) */
    int32_t *wslot;        /* (max_tokens) the same in a split arena's windowed group */
    float *rope_inv_freq;  /* (n_rope, n_rot / 2) each RoPE set's scale * base^(-2j/n_rot) */
    float *rope_cs;        /* (n_rope, max_tokens, n_rot / 2, 2) cos, sin of each row's angles */
    float rope_mscale[ENGINE_ROPE_SETS]; /* each set's cos and sin are times it (YaRN), else 1 */
    float *fam; /* the family's own step buffers (engine_arch.ctx_floats), or NULL */
};

/* Runs fn on the ctx's pool (every thread, fn(arg, ith, nth)), or on the calling thread alone
 * when the job has too few multiply-adds to be worth waking the pool (see forward.c). */
void engine__run_job(engine_ctx *c, void (*fn)(void *, uint32_t, uint32_t), void *arg,
                     uint64_t macs);
/* The same for items 0..n_items-1, fn(arg, item, ith): tpool_run_items on the pool, or every
 * item in order on the calling thread (ith 0). */
void engine__run_items(engine_ctx *c, uint32_t n_items, void (*fn)(void *, uint32_t, uint32_t),
                       void *arg, uint64_t macs);

#endif
