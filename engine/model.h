/* A decoder-only model (the families in engine/arch.h: llama, qwen2, qwen3, gemma2, gemma3,
 * phi3): hyperparameters and weights from a GGUF file, the KV arena the paged cache lives in,
 * and the batched forward pass.
 *
 * engine_forward takes a flat batch of tokens from many sequences. Every projection and the
 * MLP is one GEMM over all rows of the batch (weights are read once per step, not once per
 * sequence); attention runs per token and head over its own sequence's blocks. Token t of sequence
 * s at position p writes its K/V into slot blocks[p / block_size] * block_size + p % block_size of
 * the arena and attends over positions 0..p of s (causal; a windowed layer over the last
 * n_swa of them); all of a layer's K/V writes for the
 * batch happen before that layer's attention, so a prefill chunk sees itself.
 *
 * Threads: an engine_model is immutable after load and may be shared. An engine_kv and an
 * engine_ctx belong to one thread at a time (the engine thread). */
#ifndef KVS_ENGINE_MODEL_H
#define KVS_ENGINE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

/* How RoPE pairs a head's dimensions (llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX): NORM rotates
 * adjacent pairs (2j, 2j+1), as llama.cpp's converter permutes llama Q/K for; NEOX rotates
 * (j, j + n_rot/2), the Hugging Face layout qwen2 keeps. */
typedef enum engine_rope_type { ENGINE_ROPE_NORM, ENGINE_ROPE_NEOX } engine_rope_type;

/* Keys are read under "<arch>." (llama.*, qwen2.*, ...). */
typedef struct engine_hparams {
    const char *arch;     /* general.architecture: "llama", "qwen2", "qwen3", "qwen3moe",
                             "gemma2", "gemma3", "phi3", "gpt-oss", "smollm3" (static
                             string) */
    uint32_t n_ctx_train; /* llama.context_length */
    uint32_t n_embd;      /* llama.embedding_length */
    uint32_t n_layer;     /* llama.block_count */
    uint32_t n_ff;        /* llama.feed_forward_length */
    uint32_t n_head;      /* llama.attention.head_count */
    uint32_t n_head_kv;   /* llama.attention.head_count_kv (GQA) */
    uint32_t head_dim;    /* llama.attention.key_length (default n_embd / n_head) */
    uint32_t n_rot;       /* llama.rope.dimension_count (default head_dim) */
    uint32_t n_vocab;
    float rms_eps;          /* llama.attention.layer_norm_rms_epsilon */
    float rope_base;        /* llama.rope.freq_base (default 10000) */
    float rope_freq_scale;  /* 1 / llama.rope.scaling.factor (linear or YaRN; default 1) */
    float rope_attn_factor; /* cos and sin of RoPE times it (rope.scaling.attn_factor, and YaRN's
                               magnitude before the kernel's 1 + 0.1 ln factor); default 1 */
    bool rope_yarn;         /* rope.scaling.type yarn: the pairs' ramp between interpolation and
                               extrapolation, cos and sin times 1 + 0.1 ln factor */
    uint32_t yarn_orig_ctx; /* rope.scaling.original_context_length (default context_length) */
    float yarn_beta_fast, yarn_beta_slow; /* the ramp's corners (default 32 and 1) */
    engine_rope_type rope_type;           /* from the architecture */
    uint32_t n_swa;       /* <arch>.attention.sliding_window of the windowed layers; 0: none */
    uint32_t swa_pattern; /* layer l is windowed when l % swa_pattern < swa_pattern - 1; 0: none */
    uint32_t n_expert;    /* <arch>.expert_count: experts per layer's MLP; 0: a dense MLP */
    uint32_t n_expert_used; /* <arch>.expert_used_count: experts each token runs through */
    uint32_t n_ff_exp;   /* <arch>.expert_feed_forward_length (default n_ff): an expert's width */
    uint32_t n_ff_shexp; /* a shared expert's width, run for every token beside the routed ones
                            (granitemoeshared's expert_shared_feed_forward_length); 0: none */
} engine_hparams;

typedef struct engine_model engine_model;

typedef struct engine_load_params {
    bool verbose; /* log one line with shape, parameters, bytes, load time, and the kernels */
    /* Kernel table (engine/kern/kern.h): NULL or "auto" = the best this CPU runs (CPUID);
     * "avx2" or "generic" force one (A/B runs, tests). Every table gives the same bits. */
    const char *kernels;
    /* Products' activations: NULL or "q8" = each row quantized to int8 blocks for the weight
     * types with an integer kernel (Q8_0, Q4_0 .. Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4:
     * faster, within a stated tolerance of the F32 result, batch-invariant); "f32" = every product
     * on exact F32 panels. */
    const char *activations;
    /* Tests only: run on this table, whatever kernels says (the AVX-512 kernels emulated over
     * simde, kern_avx512_emu_ops, which tests link and kvserve never does); NULL in kvserve. */
    const struct kern_ops *kern_table;
} engine_load_params;

/* Loads path. Returns 0, or a negative status with a one-line reason in err: GGUF errors,
 * KVS_EUNSUPPORTED (architecture, tensor type, head size, rope scaling type, a family's key or
 * tensor this engine does not run (gemma3.attn_logit_softcapping, phi3's rope_factors_long),
 * kernels the CPU cannot run or this build lacks: the message names it), KVS_EINVAL (unknown
 * kernels name), KVS_ENOKEY / KVS_EKEYTYPE (metadata), KVS_EFORMAT (a tensor of the wrong shape),
 * KVS_ENOMEM. */
int engine_model_load(const char *path, const engine_load_params *p, engine_model **out, char *err,
                      size_t err_len);
void engine_model_destroy(engine_model *m);

const engine_hparams *engine_model_hparams(const engine_model *m);
const tok_vocab *engine_model_vocab(const engine_model *m);
/* The file's base name without .gguf ("stories260K"); never NULL. */
const char *engine_model_name(const engine_model *m);
/* tokenizer.chat_template, or NULL if the file has none. NUL-terminated copy. */
const char *engine_model_chat_template(const engine_model *m);
/* The kernel table the model runs on: "avx512", "avx2" or "generic". */
const char *engine_model_kernels(const engine_model *m);
/* Whether kernels (as engine_load_params.kernels) can run here: 0, or the status and one line
 * in err that engine_model_load would fail with. For checking a flag before loading. */
int engine_kernels_check(const char *kernels, char *err, size_t err_len);
/* Whether activations (as engine_load_params.activations) is known: 0, or KVS_EINVAL and one
 * line in err. */
int engine_activations_check(const char *activations, char *err, size_t err_len);
/* "q8" or "f32": the activations the model's products take. */
const char *engine_model_activations(const engine_model *m);
/* How an embedding pools a sequence's hidden states (GGUF <arch>.pooling_type, llama.cpp's
 * values): the mean of every position's, the first position's (CLS), or the last's. */
typedef enum engine_pooling {
    ENGINE_POOLING_NONE = 0,
    ENGINE_POOLING_MEAN = 1,
    ENGINE_POOLING_CLS = 2,
    ENGINE_POOLING_LAST = 3,
} engine_pooling;
/* The file's <arch>.pooling_type when it is one of the above, else ENGINE_POOLING_NONE (an
 * embedding model says how it pools; a generative one says nothing). */
engine_pooling engine_model_pooling(const engine_model *m);
/* Weight type of the projection matrices ("F32", "F16", "Q8_0"). */
const char *engine_model_weight_type(const engine_model *m);
uint64_t engine_model_n_params(const engine_model *m);

/* --- KV arena: n_blocks * block_size token slots of K and V for every layer --- */
typedef struct engine_kv engine_kv;

/* What a cached key or value is stored as. F16 (llama.cpp's default cache type) halves the
 * bytes every decode step reads back; F32 keeps the exact projections. Either way a cached
 * step computes exactly what a full recomputation computes: every row's attention reads its
 * keys and values back from the cache, its own included. */
typedef enum engine_kv_type { ENGINE_KV_F16, ENGINE_KV_F32 } engine_kv_type;

/* "f16" / "f32" to the type; -1 for anything else. */
int engine_kv_type_parse(const char *s);
const char *engine_kv_type_name(engine_kv_type t);

/* Bytes one block takes (K and V, all layers). */
size_t engine_kv_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size);
/* Layer groups of a split arena: ENGINE_KV_GLOBAL holds the layers that attend to every
 * position, ENGINE_KV_WINDOWED the sliding-window ones (a layer with window > 0). */
enum { ENGINE_KV_GLOBAL = 0, ENGINE_KV_WINDOWED = 1 };
/* Bytes one block of a group takes (K and V of that group's layers). */
size_t engine_kv_group_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size,
                                   int group);
/* The windowed layers' window (hp->n_swa), 0 when no layer is windowed. */
uint32_t engine_model_window(const engine_model *m);
/* One arena of n_blocks blocks for every layer: one block table per sequence. */
int engine_kv_create(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                     uint32_t block_size, engine_kv **out);
/* A split arena: the global layers in n_blocks blocks, the windowed layers in n_wblocks blocks
 * of their own, each addressed through its own block table (engine_seq_view.wblocks), so a
 * sequence holds windowed blocks for its last window only. KVS_EINVAL if the model has no
 * windowed layer or every layer is windowed. */
int engine_kv_create_split(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                           uint32_t n_wblocks, uint32_t block_size, engine_kv **out);
void engine_kv_destroy(engine_kv *kv);
/* Copies block src's K/V into block dst (copy-on-write): every layer of group `group` of a
 * split arena, every layer of a single one (group ignored). */
void engine_kv_copy_block(engine_kv *kv, int group, int32_t src, int32_t dst);

/* --- forward --- */
typedef struct engine_seq_view {
    const int32_t *blocks; /* block table: physical block ids */
    uint32_t n_blocks;
    /* With a split arena: the windowed layers' block table, logical block i holding positions
     * i * block_size.. like blocks; entries wholly before a row's window may be -1 (released).
     * NULL with a single arena. */
    const int32_t *wblocks;
    uint32_t n_wblocks;
} engine_seq_view;

typedef struct engine_batch {
    uint32_t n_tokens;
    const int32_t *token; /* [n_tokens] token ids */
    const int32_t *pos;   /* [n_tokens] position within its sequence */
    const int32_t *seq;   /* [n_tokens] index into seqs */
    const bool *logits;   /* [n_tokens] whether this row's logits are wanted */
    uint32_t n_seqs;
    const engine_seq_view *seqs;
} engine_batch;

typedef struct engine_ctx engine_ctx;

/* Scratch for batches of up to max_tokens rows; n_threads compute threads (0 means 1): a
 * persistent pool of n_threads - 1 workers plus the thread calling engine_forward, shared by
 * the matrix products and attention. Idle workers sleep. The same batch gives
 * the same logits on every run, whatever n_threads. */
int engine_ctx_create(const engine_model *m, uint32_t max_tokens, uint32_t n_threads,
                      engine_ctx **out);
void engine_ctx_destroy(engine_ctx *c);

/* Runs the batch, writing K/V into kv and the logits of the rows marked in b->logits, in row
 * order, to logits_out ([n_marked][n_vocab]). KVS_EINVAL if the batch is malformed (token or
 * position out of range, slot outside its block table, too many rows). */
int engine_forward(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out);
/* engine_forward, and the hidden state after the final norm (what an embedding's pooling
 * reads, and what the vocabulary projection takes) of the rows marked in hidden ([n_tokens],
 * or NULL for none) to hidden_out ([n_marked][n_embd], in row order). */
int engine_forward_hidden(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out,
                          const bool *hidden, float *hidden_out);

#endif
