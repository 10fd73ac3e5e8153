/* Sampler: turns one row of logits into a token, per sequence, reproducibly.
 * Order (as vLLM): penalties -> temperature -> top-k -> top-p -> min-p -> draw.
 * temperature 0 is greedy (argmax, lowest id on ties) and ignores the filters.
 * Each sequence owns its rng state, so the same seed gives the same tokens whatever else
 * shares the batch. Not thread-safe per sampler; distinct samplers are independent. */
#ifndef KVS_ENGINE_SAMPLER_H
#define KVS_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sampler_params {
    float temperature;        /* >= 0; 0 = greedy. default 1 */
    float top_p;              /* (0, 1]; default 1 (off) */
    float min_p;              /* [0, 1]; default 0 (off) */
    int32_t top_k;            /* <= 0 = off */
    float repetition_penalty; /* > 0; 1 = off. Over prompt and output (as vLLM) */
    float presence_penalty;   /* [-2, 2]; 0 = off. Over output only (as OpenAI) */
    float frequency_penalty;  /* [-2, 2]; 0 = off. Over output only */
    uint64_t seed;            /* rng seed */
} sampler_params;

/* The defaults above. */
sampler_params sampler_default_params(void);

typedef struct sampler sampler;

/* n_vocab sized state (token counts for penalties, scratch). KVS_ENOMEM / KVS_EINVAL. */
int sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out);
void sampler_destroy(sampler *s);
/* A new sampler with the same params and history, and its rng reseeded with seed (n > 1
 * choices of one request each draw differently). */
int sampler_clone(const sampler *s, uint64_t seed, sampler **out);

/* Records a token of the context: prompt tokens count only for the repetition penalty,
 * generated tokens for all penalties. */
void sampler_accept(sampler *s, int32_t token, bool is_prompt);

/* Log-softmax over logits (n_vocab floats, unchanged): logits[id]'s into *logprob (if non-NULL),
 * and the n_top largest (ties: lower id first) into top_ids / top_logprobs. The numbers a
 * sampled token's logprobs report, for any row: a prompt token's logprob given the tokens
 * before it is this over the row before it. */
void sampler_logprobs(const float *logits, int32_t n_vocab, int32_t id, float *logprob, int n_top,
                      int32_t *top_ids, float *top_logprobs);
/* Picks the next token from logits (n_vocab floats; modified in place by penalties).
 * If logprob is non-NULL it receives log-softmax of the chosen token over the raw logits.
 * If n_top > 0, the n_top most likely tokens and their logprobs go to top_ids/top_logprobs. */
int32_t sampler_sample(sampler *s, float *logits, float *logprob, int n_top, int32_t *top_ids,
                       float *top_logprobs);

#endif
