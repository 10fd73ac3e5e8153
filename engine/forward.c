/* One batched forward step: the embedding rows, every layer (RMSNorm, the Q/K/V products,
 * RoPE, K/V into the arena, attention, the output product, the MLP), the final norm and the
 * logits of the rows that want them. Every matrix product is the kernel table's panel product
 * over all rows of the step, split over output columns between the ctx's pool threads. */
#include "engine/model_impl.h"

#include "common/status.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int engine_ctx_create(const engine_model *m, uint32_t max_tokens, uint32_t n_threads,
                      engine_ctx **out)
{
    *out = NULL;
    if (max_tokens == 0 || max_tokens > 65536 || n_threads > 1024)
        return KVS_EINVAL;
    engine_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return KVS_ENOMEM;
    const engine_hparams *hp = &m->hp;
    size_t T = max_tokens, E = hp->n_embd, KV = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    c->m = m;
    c->max_tokens = max_tokens;
    c->n_threads = n_threads ? n_threads : 1;
    c->kern = m->kern;
    size_t max_in = E > F ? E : F;
    c->tile_floats = KERN_PANEL * max_in;
    c->x = malloc(T * E * sizeof(float));
    c->xn = malloc(T * E * sizeof(float));
    c->q = malloc(T * E * sizeof(float));
    c->k = malloc(T * KV * sizeof(float));
    c->v = malloc(T * KV * sizeof(float));
    c->att = malloc(T * E * sizeof(float));
    c->gate = malloc(T * F * sizeof(float));
    c->up = malloc(T * F * sizeof(float));
    c->slot = malloc(T * sizeof(int32_t));
    size_t part = (size_t)hp->n_head * (hp->head_dim + 2);
    c->scores = malloc(c->n_threads * hp->n_head * ATTN_SPAN * sizeof(float));
    c->attn_part = malloc(ATTN_WAVE * part * sizeof(float));
    c->attn_state = malloc(T * part * sizeof(float));
    c->attn_first = malloc((T + 1) * sizeof(uint32_t));
    c->rope_inv_freq = malloc(hp->n_rot / 2 * sizeof(float));
    c->rope_cs = malloc(T * hp->n_rot * sizeof(float));
    c->tile = malloc(c->n_threads * c->tile_floats * sizeof(float));
    if (!c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->gate || !c->up || !c->slot ||
        !c->rope_inv_freq || !c->rope_cs || !c->tile || !c->scores || !c->attn_part ||
        !c->attn_state || !c->attn_first || tpool_create(c->n_threads, &c->pool)) {
        engine_ctx_destroy(c);
        return KVS_ENOMEM;
    }
    /* Angle of pair j at position p: p * freq_scale * base^(-2j/n_rot) / freq_factor[j], as
     * ggml_rope_ext with freq_factors and no YaRN extrapolation. */
    for (uint32_t j = 0; j < hp->n_rot / 2; j++) {
        float f = powf(hp->rope_base, -(float)(2 * j) / (float)hp->n_rot) * hp->rope_freq_scale;
        c->rope_inv_freq[j] = m->rope_freqs ? f / m->rope_freqs[j] : f;
    }
    *out = c;
    return 0;
}

void engine_ctx_destroy(engine_ctx *c)
{
    if (!c)
        return;
    tpool_destroy(c->pool);
    free(c->x);
    free(c->xn);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->gate);
    free(c->up);
    free(c->scores);
    free(c->attn_part);
    free(c->attn_state);
    free(c->attn_first);
    free(c->tile);
    free(c->slot);
    free(c->rope_inv_freq);
    free(c->rope_cs);
    free(c);
}

static void rmsnorm_rows(const engine_ctx *c, float *out, const float *x, const float *w,
                         size_t rows, size_t n, float eps)
{
    for (size_t r = 0; r < rows; r++)
        c->kern->rmsnorm(out + r * n, x + r * n, w, n, eps);
}

#define MM_MAX 3 /* matrices one job can multiply the same input by (Q, K, V) */

typedef struct matmul_job {
    engine_ctx *c;
    const float *in;
    size_t rows;
    uint32_t n_mats;
    const kern_mat *w[MM_MAX];
    float *out[MM_MAX];
    size_t chunk[MM_MAX];            /* output columns per work item */
    uint32_t first_item[MM_MAX + 1]; /* items of matrix m: [first_item[m], first_item[m+1]) */
    bool silu_pair;   /* an item covers the same columns of w[0] and w[1] (gate and up), then
                         out[0] = silu(out[0]) * out[1] on them */
    atomic_uint next; /* next work item */
} matmul_job;

/* Columns [n0, n0 + chunk) of matrix m. */
static void matmul_chunk(const matmul_job *j, uint32_t m, size_t n0, float *tile)
{
    const kern_mat *w = j->w[m];
    size_t N = w->n_out, K = w->n_in;
    size_t cnt = N - n0 < j->chunk[m] ? N - n0 : j->chunk[m];
    j->c->kern->matmul(w, j->in, j->rows, K, j->out[m], N, n0, n0 + cnt, tile);
}

/* Threads take chunks of output columns from a shared counter, so a thread the OS preempts
 * (the cores are shared) delays the step by one chunk, not by its whole share. Chunk
 * boundaries depend only on the matrix and the batch size, never on the thread count or on
 * which thread took a chunk, so a batch gives the same bits on every run. */
static void matmul_worker(void *arg, uint32_t ith, uint32_t nth)
{
    (void)nth;
    matmul_job *j = arg;
    float *tile = j->c->tile + ith * j->c->tile_floats;
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->first_item[j->n_mats])
            return;
        uint32_t m = 0;
        while (i >= j->first_item[m + 1])
            m++;
        size_t n0 = (size_t)(i - j->first_item[m]) * j->chunk[m];
        matmul_chunk(j, m, n0, tile);
        if (!j->silu_pair)
            continue;
        matmul_chunk(j, 1, n0, tile);
        size_t N = j->w[0]->n_out, cnt = N - n0 < j->chunk[0] ? N - n0 : j->chunk[0];
        for (size_t t = 0; t < j->rows; t++)
            kern_silu_mul(j->out[0] + t * N + n0, j->out[1] + t * N + n0, cnt);
    }
}

/* Below this many multiply-adds a job runs on the calling thread alone: waking the pool costs
 * microseconds when the other core is idle and a whole scheduler time slice when another
 * process holds it, which for a tiny model's matrices is far more than the work. Results do
 * not change: chunks are the same whichever thread takes them. */
#define PARALLEL_MIN_MACS (1u << 17)

void engine__run_job(engine_ctx *c, void (*fn)(void *, uint32_t, uint32_t), void *arg,
                     uint64_t macs)
{
    if (macs < PARALLEL_MIN_MACS)
        fn(arg, 0, 1);
    else
        tpool_run(c->pool, fn, arg);
}

/* out[m] (rows, w[m]->n_out) = in (rows, n_in) * w[m]^T for the n matrices, in one pool job
 * (one hand-off instead of n). With silu_pair (n = 2, same shapes) out[0] becomes
 * silu(out[0]) * out[1], computed on each chunk as soon as both products have it. */
static void matmuls(engine_ctx *c, const float *in, size_t rows, uint32_t n,
                    const kern_mat *const *w, float *const *out, bool silu_pair)
{
    matmul_job j = {.c = c, .in = in, .rows = rows, .n_mats = n, .silu_pair = silu_pair};
    uint64_t macs = 0;
    for (uint32_t m = 0; m < n; m++) {
        /* Items of 64 columns: four panels, a few KB of weights per row of K. */
        const kern_mat *wm = w[m];
        j.w[m] = wm;
        j.out[m] = out[m];
        j.chunk[m] = 64;
        uint32_t items = (uint32_t)((wm->n_out + j.chunk[m] - 1) / j.chunk[m]);
        j.first_item[m + 1] = silu_pair ? items : j.first_item[m] + items;
        macs += (uint64_t)rows * wm->n_out * wm->n_in;
    }
    atomic_init(&j.next, 0);
    engine__run_job(c, matmul_worker, &j, macs);
}

/* out (rows, n_out) = in (rows, n_in) * W^T. */
static void matmul(engine_ctx *c, float *out, const float *in, const kern_mat *w, size_t rows)
{
    matmuls(c, in, rows, 1, &w, &out, false);
}

/* Rotates pair j of each head's first n_rot dimensions by the row's angle pos * inv_freq[j]:
 * NORM pairs (x[2j], x[2j+1]) (llama, whose converter permutes Q and K for it), NEOX pairs
 * (x[j], x[j + n_rot/2]) (qwen2, Hugging Face layout). Dimensions past n_rot pass through. cs
 * holds (cos, sin) of each angle, computed once per step instead of once per layer. */
static void rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot,
                 engine_rope_type type, const float *cs)
{
    uint32_t half = n_rot / 2;
    uint32_t stride = type == ENGINE_ROPE_NEOX ? 1 : 2; /* index step between pairs */
    uint32_t off = type == ENGINE_ROPE_NEOX ? half : 1; /* partner's offset in the pair */
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = x + (size_t)h * head_dim;
        for (uint32_t j = 0; j < half; j++) {
            float *a = p + j * stride, *b = a + off;
            float xa = *a, xb = *b, co = cs[2 * j], sn = cs[2 * j + 1];
            *a = xa * co - xb * sn;
            *b = xa * sn + xb * co;
        }
    }
}

static int validate_batch(engine_ctx *c, const engine_kv *kv, const engine_batch *b)
{
    if (b->n_tokens == 0 || b->n_tokens > c->max_tokens)
        return KVS_EINVAL;
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        if (b->token[t] < 0 || (uint32_t)b->token[t] >= c->m->hp.n_vocab || b->pos[t] < 0 ||
            b->seq[t] < 0 || (uint32_t)b->seq[t] >= b->n_seqs)
            return KVS_EINVAL;
        const engine_seq_view *s = &b->seqs[b->seq[t]];
        uint32_t bi = (uint32_t)b->pos[t] / kv->block_size;
        if (bi >= s->n_blocks)
            return KVS_EINVAL;
        for (uint32_t i = 0; i <= bi; i++)
            if (s->blocks[i] < 0 || (uint32_t)s->blocks[i] >= kv->n_blocks)
                return KVS_EINVAL;
        c->slot[t] = s->blocks[bi] * (int32_t)kv->block_size +
                     (int32_t)((uint32_t)b->pos[t] % kv->block_size);
    }
    return 0;
}

int engine_forward(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out)
{
    int rc = validate_batch(c, kv, b);
    if (rc)
        return rc;
    const engine_model *m = c->m;
    const engine_hparams *hp = &m->hp;
    size_t T = b->n_tokens, E = hp->n_embd, kv_dim = (size_t)hp->n_head_kv * hp->head_dim,
           R = hp->n_rot / 2;
    c->attn_first[0] = 0; /* a row of n positions has ceil(n / ATTN_SPAN) attention items */
    for (size_t t = 0; t < T; t++)
        c->attn_first[t + 1] =
            c->attn_first[t] + ((uint32_t)b->pos[t] + 1 + ATTN_SPAN - 1) / ATTN_SPAN;

    for (size_t t = 0; t < T; t++) {
        kern_rows_to_f32(&m->tok_embd, (size_t)b->token[t], 1, c->x + t * E);
        for (size_t r = 0; r < R; r++) {
            float theta = (float)b->pos[t] * c->rope_inv_freq[r];
            c->rope_cs[(t * R + r) * 2] = cosf(theta);
            c->rope_cs[(t * R + r) * 2 + 1] = sinf(theta);
        }
    }

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        uint8_t *kl = kv->k + l * kv->layer_stride * kv->esz;
        uint8_t *vl = kv->v + l * kv->layer_stride * kv->esz;

        rmsnorm_rows(c, c->xn, c->x, w->attn_norm, T, E, hp->rms_eps);
        const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
        float *qkv_out[3] = {c->q, c->k, c->v};
        matmuls(c, c->xn, T, 3, qkv, qkv_out, false);
        for (size_t t = 0; t < T; t++) {
            if (w->bq)
                kern_add(c->q + t * E, w->bq, E);
            if (w->bk)
                kern_add(c->k + t * kv_dim, w->bk, kv_dim);
            if (w->bv)
                kern_add(c->v + t * kv_dim, w->bv, kv_dim);
            rope(c->q + t * E, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type,
                 c->rope_cs + t * R * 2);
            rope(c->k + t * kv_dim, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_type,
                 c->rope_cs + t * R * 2);
            size_t off = (size_t)c->slot[t] * kv_dim * kv->esz;
            if (kv->type == ENGINE_KV_F16) {
                c->kern->to_f16((uint16_t *)(void *)(kl + off), c->k + t * kv_dim, kv_dim);
                c->kern->to_f16((uint16_t *)(void *)(vl + off), c->v + t * kv_dim, kv_dim);
            } else {
                memcpy(kl + off, c->k + t * kv_dim, kv_dim * sizeof(float));
                memcpy(vl + off, c->v + t * kv_dim, kv_dim * sizeof(float));
            }
        }
        engine__attention(c, kv, b, kl, vl);
        matmul(c, c->xn, c->att, &w->wo, T);
        kern_add(c->x, c->xn, T * E);

        rmsnorm_rows(c, c->xn, c->x, w->ffn_norm, T, E, hp->rms_eps);
        const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
        float *gate_up_out[2] = {c->gate, c->up};
        matmuls(c, c->xn, T, 2, gate_up, gate_up_out, true);
        matmul(c, c->xn, c->gate, &w->w_down, T);
        kern_add(c->x, c->xn, T * E);
    }

    /* Final norm and the vocabulary projection, only for rows whose logits are wanted. */
    size_t n_out = 0;
    for (size_t t = 0; t < T; t++) {
        if (!b->logits[t])
            continue;
        rmsnorm_rows(c, c->xn + n_out * E, c->x + t * E, m->output_norm, 1, E, hp->rms_eps);
        n_out++;
    }
    if (n_out)
        matmul(c, logits_out, c->xn, &m->output, n_out);
    return 0;
}
