/* Model families (the engine__ tier): one file each holds a family's hyper-parameters beyond the
 * common ones model.c reads, its tensor list with shapes, and its layer body; the registry
 * (engine__arch_find in arch.c) names them. A new family is one arch_<name>.c and one line in
 * arch.c. The helpers below are what the family files are built from: model.c's loaders
 * (tensors by name and shape, metadata under "<arch>.") and forward.c's steps over a batch. */
#ifndef KVS_ENGINE_ARCH_H
#define KVS_ENGINE_ARCH_H

#include "engine/model_impl.h"

/* How an MoE router's scores pick a row's experts and weigh them (moe.c). */
typedef enum engine_moe_route {
    ENGINE_MOE_SOFTMAX_NORM, /* softmax over every expert, the k most probable, their
                                probabilities renormalized to sum to 1 (Mixtral, Qwen3) */
    ENGINE_MOE_TOPK_SOFTMAX, /* the k highest scores, a softmax over those k (gpt-oss) */
    ENGINE_MOE_SIGMOID_NORM, /* a sigmoid of each score, the k largest, renormalized as
                                SOFTMAX_NORM's (lfm2moe) */
} engine_moe_route;

/* An expert's activation of its gate g and up u (moe.c). */
typedef enum engine_moe_act {
    ENGINE_MOE_SILU,       /* SiLU(g) * u */
    ENGINE_MOE_SWIGLU_OAI, /* gpt-oss: g' = min(g, 7), g' * sigmoid(1.702 g') * (clamp(u, -7, 7) +
                              1) */
} engine_moe_act;

struct engine_arch {
    const char *name; /* general.architecture, and the prefix of its metadata keys */
    engine_rope_type rope_type;
    /* Whether attention.key_length / value_length may differ from embedding_length /
     * head_count (the Q and output projections are then n_head * head_dim wide). */
    bool free_head_dim;
    /* With free_head_dim: key_length / value_length may be absent, the heads then
     * embedding_length / head_count wide (ernie, as llama.cpp's default); else they are
     * required. */
    bool head_dim_default;
    /* Whether a file may hold a mixture-of-experts MLP (<arch>.expert_count > 0, moe.c) in
     * place of the dense one; other families refuse such files at load. */
    bool moe;
    /* Whether attention.head_count_kv may be one count per layer, 0 marking a layer whose
     * recurrent block stands in for attention (lfm2's short convolutions); others refuse it. */
    bool recurrent;
    /* The final norm's tensor; NULL: output_norm.weight (lfm2's converter names it
     * token_embd_norm.weight). */
    const char *output_norm;
    engine_moe_route moe_route;
    engine_moe_act moe_act;
    /* Family metadata after the common keys (model.c's load_hparams); NULL: none. Refuses
     * (KVS_EUNSUPPORTED, naming the key) what the family has but this engine does not run. */
    int (*load_hparams)(engine_model *m, char *err, size_t err_len);
    /* Layer l's tensors into m->layers[l], and its attention window / RoPE set. */
    int (*load_layer)(engine_model *m, uint32_t l, char *err, size_t err_len);
    /* Layer l over every row of the batch: reads and updates the residual stream c->x. */
    void (*layer)(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l);
    /* NULL, or: floats of the family's own step buffers for max_tokens rows (engine_ctx.fam);
     * begin, after the embedding rows are in c->x (scaled), before the first layer; end, after
     * the last, leaving in c->x what the final norm reads (gemma3n's AltUp streams). */
    size_t (*ctx_floats)(const engine_model *m, size_t max_tokens);
    void (*begin)(engine_ctx *c, const engine_batch *b);
    void (*end)(engine_ctx *c, const engine_batch *b);
};

/* The registry's rows, one per family file. */
extern const engine_arch engine__arch_llama, engine__arch_qwen2, engine__arch_qwen3,
    engine__arch_qwen3moe, engine__arch_gemma2, engine__arch_gemma3, engine__arch_phi3,
    engine__arch_gpt_oss, engine__arch_smollm3, engine__arch_granite, engine__arch_granitemoe,
    engine__arch_ernie4_5, engine__arch_ernie4_5_moe, engine__arch_lfm2, engine__arch_lfm2moe,
    engine__arch_olmo2, engine__arch_mistral3, engine__arch_gemma3n;

/* The family named name[0..len), or NULL. */
const engine_arch *engine__arch_find(const char *name, size_t len);
/* "llama, qwen2, ..." into buf (truncated to cap), for a refusal; returns buf. */
const char *engine__arch_list(char *buf, size_t cap);

/* ---- loading (model.c) ---- */

/* Tensor name with exactly the ggml dims {d0, d1} (d1 = 1 for a vector) as F32 (an owned
 * widened copy unless the file holds F32). Absent and !required: *out = NULL and 0. */
int engine__load_vec(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                     const float **out, char *err, size_t err_len);
/* Matrix name of ggml dims {d0, d1} (d1 output rows of d0 inputs) into *out, in place for
 * F32/F16/Q8_0 (BF16 widened). Absent and !required: out->data = NULL and 0. */
int engine__load_mat(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                     kern_mat *out, char *err, size_t err_len);
/* Rows [row0, row0 + n) of a loaded matrix, as a matrix of its own (fused projections). */
void engine__mat_rows(const kern_mat *src, size_t row0, size_t n, kern_mat *out);
/* "blk.<l>.<suffix>", a stack of n matrices of ggml dims {d0, d1} (ggml dims {d0, d1, n}), as
 * engine__load_mat: matrix e into out[e * stride]. */
int engine__load_layer_experts(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                               uint64_t d1, uint32_t n, kern_mat *out, size_t stride, char *err,
                               size_t err_len);
/* name, a stack of n matrices of ggml dims {d0, d1} (ggml dims {d0, d1, n}), as
 * engine__load_layer_experts. */
int engine__load_stack(engine_model *m, const char *name, uint64_t d0, uint64_t d1, uint32_t n,
                       kern_mat *out, size_t stride, char *err, size_t err_len);
/* "blk.<l>.<suffix>" as engine__load_vec / engine__load_mat. */
int engine__load_layer_vec(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                           bool required, const float **out, char *err, size_t err_len);
int engine__load_layer_mat(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                           uint64_t d1, bool required, kern_mat *out, char *err, size_t err_len);
/* Metadata "<arch>.<suffix>": absent leaves *out as it was (0) unless required; a value of the
 * wrong type, or outside lo..hi, is refused naming the key. */
int engine__arch_u32(const engine_model *m, const char *suffix, uint32_t *out, bool required,
                     uint32_t lo, uint32_t hi, char *err, size_t err_len);
int engine__arch_f32(const engine_model *m, const char *suffix, float *out, char *err,
                     size_t err_len);
/* Whether "<arch>.<suffix>" is present at all. */
bool engine__arch_has(const engine_model *m, const char *suffix);
/* 0 if RoPE turns whole heads (rope.dimension_count = the head size), which llama.cpp asserts for
 * some families (smollm3, granite); else KVS_EUNSUPPORTED naming the key. */
int engine__arch_whole_rope(const engine_model *m, char *err, size_t err_len);

/* The llama layer's tensors (norms, Q/K/V/O, SwiGLU MLP) with the layer's shapes: shared by the
 * families whose layer is llama's plus something. */
int engine__load_llama_layer(engine_model *m, uint32_t l, char *err, size_t err_len);
/* The llama layer body (arch_llama.c), for families that differ from llama only in loading: the
 * Q/K/V biases (qwen2) and the per-head Q/K norms (qwen3) where the layer has them. */
void engine__llama_layer(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l);
/* The llama layer's second half over the batch's rows: RMSNorm of c->x, the SwiGLU MLP (or
 * the experts), added to c->x. */
void engine__llama_ffn(engine_ctx *c, uint32_t l, size_t rows);

/* An MoE layer's router and experts (moe.c) into m->layers[l], in place of the dense MLP's
 * three matrices, and a shared expert's where the file has one (hp.n_ff_shexp > 0): for
 * families with .moe, on the layers engine__layer_moe names. */
int engine__load_moe(engine_model *m, uint32_t l, char *err, size_t err_len);
/* Whether layer l runs experts: every layer of a file with experts (hp.n_expert > 0), except
 * where the model has dense layers too (engine_model.moe_dense: ernie4_5-moe's leading and
 * interleaved ones). */
bool engine__layer_moe(const engine_model *m, uint32_t l);

/* ---- one step (forward.c, attention.c, moe.c) ---- */

typedef enum engine_glu { ENGINE_GLU_NONE, ENGINE_GLU_SILU, ENGINE_GLU_GELU } engine_glu;

/* out (rows, n) = RMSNorm of each row of x (rows, n) times w, with the model's epsilon; out may
 * be x. */
void engine__norm_rows(engine_ctx *c, float *out, const float *x, const float *w, size_t rows,
                       size_t n);
/* out[m] (rows, w[m]->n_out) = in (rows, n_in) * w[m]^T for n <= 3 matrices in one pool job.
 * With glu (n = 2, same shapes) out[0] becomes act(out[0]) * out[1] (SiLU, or GELU with the
 * tanh approximation). */
void engine__matmuls(engine_ctx *c, const float *in, size_t rows, uint32_t n,
                     const kern_mat *const *w, float *const *out, engine_glu glu);
/* Rows [0, rows) of in (n_in floats each) quantized for the integer path in format fmt into dst
 * (kern_qx_row_bytes each), split among the pool's threads (each row alone: the same bytes
 * whatever the split). */
void engine__quantize_rows(engine_ctx *c, kern_qx fmt, const float *in, size_t rows, size_t n_in,
                           void *dst);
/* Rotates each row's queries c->q by its position with layer l's RoPE set (unless a NoPE
 * layer), writing nothing to the arena: a layer that reads another's K/V (gemma3n). */
void engine__rope_q(engine_ctx *c, const engine_batch *b, uint32_t l);
/* out (rows, w->n_out) = in (rows, w->n_in) * w^T. */
void engine__matmul(engine_ctx *c, float *out, const float *in, const kern_mat *w, size_t rows);
/* Rotates each row's queries c->q and keys c->k by its position with layer l's RoPE set (unless
 * the layer is a NoPE one), and writes the keys c->k and values c->v into layer l of the arena at
 * each row's slot. */
void engine__rope_store(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l);
/* The MoE MLP of layer weights w over the rows xn (rows, n_embd) (normed): each row's
 * n_expert_used experts' outputs, weighted, replace it in xn. */
void engine__moe_ffn(engine_ctx *c, const layer_weights *w, float *xn, size_t rows);
/* A ctx's MoE buffers for m's shape and max_tokens rows a step (NULL when out of memory), and
 * their release. */
engine_moe_buf *engine__moe_buf_create(const engine_model *m, uint32_t max_tokens);
void engine__moe_buf_destroy(engine_moe_buf *b);
/* Attention of every row of b into c->att over layer l of the arena (every K/V write of the
 * layer done), inside the layer's window; c->q holds the rows' roped queries. */
void engine__attention(engine_ctx *c, const engine_kv *kv, const engine_batch *b, uint32_t l);

#endif
