/* One batched forward step: the embedding rows, every layer (the family's layer body, arch.h,
 * built from the steps here: RMSNorm, the matrix products, RoPE and K/V into the arena), the
 * final norm and the logits of the rows that want them. Every matrix product is the kernel
 * table's panel product over all rows of the step, split over output columns between the ctx's
 * pool threads. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
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
    size_t T = max_tokens, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           KV = (size_t)hp->n_head_kv * hp->head_dim,
           F = hp->n_expert ? hp->n_ff_exp : hp->n_ff; /* an MoE model has no dense MLP */
    F = F > hp->n_ff_shexp ? F : hp->n_ff_shexp;       /* and a shared expert may be wider */
    F = m->moe_dense && hp->n_ff > F ? hp->n_ff : F;   /* as may its dense layers' (ernie) */
    for (uint32_t l = 0; l < hp->n_layer; l++)         /* a short convolution's B, C and x (lfm2) */
        F = m->layers[l].conv_len && F < 3 * E ? 3 * E : F;
    c->m = m;
    c->max_tokens = max_tokens;
    c->n_threads = n_threads ? n_threads : 1;
    c->kern = m->kern;
    size_t max_in = E > F ? E : F;
    max_in = max_in > Q ? max_in : Q;
    max_in = max_in > m->extra_in ? max_in : m->extra_in; /* a family's own matrices' */
    c->tile_floats = KERN_PANEL * max_in;
    c->x = malloc(T * E * sizeof(float));
    c->xn = malloc(T * E * sizeof(float));
    c->q = malloc(T * Q * sizeof(float));
    c->k = malloc(T * KV * sizeof(float));
    c->v = malloc(T * KV * sizeof(float));
    c->att = malloc(T * Q * sizeof(float));
    c->gate = malloc(T * F * sizeof(float));
    c->up = malloc(T * F * sizeof(float));
    c->slot = malloc(T * sizeof(int32_t));
    c->wslot = malloc(T * sizeof(int32_t));
    size_t part = (size_t)hp->n_head * (hp->head_dim + 2);
    c->scores = malloc(c->n_threads * ATTN_SCORES(hp->n_head) * sizeof(float));
    c->attn_part = malloc(ATTN_WAVE * part * sizeof(float));
    c->attn_state = malloc(T * part * sizeof(float));
    c->attn_first = malloc((T + 1) * sizeof(uint32_t));
    c->attn_tasks = malloc(ATTN_WAVE * sizeof(attn_task));
    c->rope_inv_freq = malloc(m->n_rope * (hp->n_rot / 2) * sizeof(float));
    c->rope_cs = malloc(m->n_rope * T * hp->n_rot * sizeof(float));
    c->tile = malloc(c->n_threads * c->tile_floats * sizeof(float));
    if (c->kern->pack_x)
        c->xp = malloc(T * max_in * sizeof(float));
    if (m->arch->ctx_floats && !(c->fam = malloc(m->arch->ctx_floats(m, T) * sizeof(float)))) {
        engine_ctx_destroy(c);
        return KVS_ENOMEM;
    }
    if (hp->n_expert && !(c->moe = engine__moe_buf_create(m, max_tokens))) {
        engine_ctx_destroy(c);
        return KVS_ENOMEM;
    }
    if (m->n_qdot) /* bytes per input of either format < 40 / 32 (kern_qx_row_bytes) */
        for (int f = 0; f < 2; f++)
            c->xq[f] = malloc(T * (max_in / 32 + 1) * 40);
    if (!c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->gate || !c->up || !c->slot ||
        !c->wslot || !c->rope_inv_freq || !c->rope_cs || !c->tile || !c->scores || !c->attn_part ||
        !c->attn_state || !c->attn_first || !c->attn_tasks || (c->kern->pack_x && !c->xp) ||
        (m->n_qdot && (!c->xq[0] || !c->xq[1])) || tpool_create(c->n_threads, &c->pool)) {
        engine_ctx_destroy(c);
        return KVS_ENOMEM;
    }
    /* Angle of pair j at position p: p * freq_scale * base^(-2j/n_rot) / freq_factor[j], as
     * ggml_rope_ext with freq_factors. With YaRN, p * base^(-2j/n_rot) / freq_factor[j] times
     * freq_scale (1 - ramp_j) + ramp_j (ggml's theta_interp (1 - ramp) + theta_extrap ramp):
     * ramp_j is 1 for pairs below the corner where the pair turns beta_fast times over the
     * original context, 0 past the one where it turns beta_slow times, linear between. */
    for (uint32_t r = 0; r < m->n_rope; r++) {
        float lo = 0.0f, hi = 0.0f, scale = m->rope[r].scale;
        bool yarn = hp->rope_yarn && !m->rope[r].plain;
        c->rope_mscale[r] = m->rope[r].plain ? 1.0f : hp->rope_attn_factor;
        if (yarn) {
            float n = (float)hp->n_rot, two_pi = 2.0f * 3.14159265358979f;
            float base_ln = 2.0f * logf(m->rope[r].base), orig = (float)hp->yarn_orig_ctx;
            lo = floorf(n * logf(orig / (hp->yarn_beta_fast * two_pi)) / base_ln);
            hi = ceilf(n * logf(orig / (hp->yarn_beta_slow * two_pi)) / base_ln);
            lo = lo > 0.0f ? lo : 0.0f;
            hi = hi < n - 1.0f ? hi : n - 1.0f;
            c->rope_mscale[r] *= 1.0f + 0.1f * logf(1.0f / scale);
        }
        for (uint32_t j = 0; j < hp->n_rot / 2; j++) {
            float mix = scale;
            if (yarn) {
                float y = ((float)j - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
                float ramp = 1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y);
                mix = scale * (1.0f - ramp) + ramp;
            }
            float f = powf(m->rope[r].base, -(float)(2 * j) / (float)hp->n_rot) * mix;
            c->rope_inv_freq[r * (hp->n_rot / 2) + j] = m->rope_freqs ? f / m->rope_freqs[j] : f;
        }
    }
    *out = c;
    return 0;
}

void engine_ctx_destroy(engine_ctx *c)
{
    if (!c)
        return;
    tpool_destroy(c->pool);
    engine__moe_buf_destroy(c->moe);
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
    free(c->attn_tasks);
    free(c->tile);
    free(c->xq[0]);
    free(c->xq[1]);
    free(c->xp);
    free(c->slot);
    free(c->wslot);
    free(c->rope_inv_freq);
    free(c->rope_cs);
    free(c->fam);
    free(c);
}

void engine__norm_rows(engine_ctx *c, float *out, const float *x, const float *w, size_t rows,
                       size_t n)
{
    for (size_t r = 0; r < rows; r++)
        c->kern->rmsnorm(out + r * n, x + r * n, w, n, c->m->hp.rms_eps);
}

#define MM_MAX 3 /* matrices one job can multiply the same input by (Q, K, V) */

typedef struct matmul_job {
    engine_ctx *c;
    const float *in;
    const float *xp; /* NULL, or in as kern->pack_x laid it out */
    size_t rows;
    uint32_t n_mats;
    const kern_mat *w[MM_MAX];
    float *out[MM_MAX];
    size_t chunk[MM_MAX];            /* output columns per work item */
    uint32_t first_item[MM_MAX + 1]; /* items of matrix m: [first_item[m], first_item[m+1]) */
    engine_glu glu; /* an item covers the same columns of w[0] and w[1] (gate and up), then
                       out[0] = act(out[0]) * out[1] on them */
} matmul_job;

/* Columns [n0, n0 + chunk) of matrix m, rows [t0, t1) (on the F32 / F16 panels all rows: their
 * packed x is laid out for the whole batch). */
static void matmul_chunk(const matmul_job *j, uint32_t m, size_t n0, size_t t0, size_t t1,
                         float *tile)
{
    const kern_mat *w = j->w[m];
    size_t N = w->n_out, K = w->n_in;
    size_t cnt = N - n0 < j->chunk[m] ? N - n0 : j->chunk[m];
    kern_qx fmt = kern_qdot_act(w);
    if (fmt == KERN_QX_NONE) {
        j->c->kern->matmul(w, j->in, j->rows, K, j->xp, j->out[m], N, n0, n0 + cnt, tile);
        return;
    }
    const uint8_t *xq =
        (const uint8_t *)j->c->xq[fmt == KERN_QX_256] + t0 * kern_qx_row_bytes(fmt, K);
    float *out = j->out[m] + t0 * N;
    if (j->c->kern->qmatmul)
        j->c->kern->qmatmul(w, xq, t1 - t0, out, N, n0, n0 + cnt);
    else
        kern_qmatmul_ref(w, xq, t1 - t0, out, N, n0, n0 + cnt);
}

/* Rows of a gated MLP's chunk taken at a time on the integer path: gate, up and their
 * activation on 64 rows x 64 columns (16 KB a product), instead of each product over the whole
 * batch first. A prompt's rows are 4 N bytes apart (N = 5632 for TinyLlama: a stride that maps
 * its rows onto few L2 sets), so 512 rows of gate and up did not stay in L2 until the
 * activation read them: silu_mul was 3.7 % of a TinyLlama Q4_K_M 512-token prefill, mostly
 * waiting on its loads, and that prefill runs 1.27x faster blocked (bench/ab.sh; 32 rows measured
 * the same as 64, and 64 leaves a decode step of up to 64 rows as it was). A row's products do
 * not depend on the rows around it (kern/qdot.h), so the bits are the same. */
#define GLU_ROWS 64

/* Item i: a chunk of output columns (tpool_run_items says which thread takes which). Chunk
 * boundaries depend only on the matrix and the batch size, never on the thread count or on
 * which thread took a chunk, so a batch gives the same bits on every run. */
static void matmul_item(void *arg, uint32_t i, uint32_t ith)
{
    const matmul_job *j = arg;
    float *tile = j->c->tile + ith * j->c->tile_floats;
    uint32_t m = 0;
    while (i >= j->first_item[m + 1])
        m++;
    size_t n0 = (size_t)(i - j->first_item[m]) * j->chunk[m];
    if (j->glu == ENGINE_GLU_NONE) {
        matmul_chunk(j, m, n0, 0, j->rows, tile);
        return;
    }
    size_t N = j->w[0]->n_out, cnt = N - n0 < j->chunk[0] ? N - n0 : j->chunk[0];
    bool blocked = kern_qdot_act(j->w[0]) != KERN_QX_NONE && kern_qdot_act(j->w[1]) != KERN_QX_NONE;
    size_t step = blocked ? GLU_ROWS : j->rows;
    for (size_t t0 = 0; t0 < j->rows; t0 += step) {
        size_t t1 = j->rows - t0 < step ? j->rows : t0 + step;
        matmul_chunk(j, 0, n0, t0, t1, tile);
        matmul_chunk(j, 1, n0, t0, t1, tile);
        for (size_t t = t0; t < t1; t++) {
            if (j->glu == ENGINE_GLU_SILU)
                j->c->kern->silu_mul(j->out[0] + t * N + n0, j->out[1] + t * N + n0, cnt);
            else /* GELU's tanh approximation (gemma's gelu_pytorch_tanh, ggml_gelu) */
                j->c->kern->gelu_mul(j->out[0] + t * N + n0, j->out[1] + t * N + n0, cnt);
        }
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

void engine__run_items(engine_ctx *c, uint32_t n_items, void (*fn)(void *, uint32_t, uint32_t),
                       void *arg, uint64_t macs)
{
    if (macs < PARALLEL_MIN_MACS)
        for (uint32_t i = 0; i < n_items; i++)
            fn(arg, i, 0);
    else
        tpool_run_items(c->pool, n_items, fn, arg);
}

/* One pass over a step's input for its products, split among the threads: quantized for the
 * integer path (fmt; each row alone, kern_qx_quantize, so splitting the rows gives the same
 * bytes whatever the split) or, with KERN_QX_NONE, laid out for the float panels' row tiles
 * (kern_ops.pack_x; each thread a range of the inputs of every row). */
typedef struct input_job {
    const kern_ops *kern;
    kern_qx fmt;
    const float *in;
    size_t rows, n_in;
    void *dst;
} input_job;

static void input_worker(void *arg, uint32_t ith, uint32_t nth)
{
    const input_job *j = arg;
    if (j->fmt == KERN_QX_NONE) {
        size_t k0 = j->n_in * ith / nth, k1 = j->n_in * (ith + 1) / nth;
        if (k1 > k0)
            j->kern->pack_x(j->in, j->rows, j->n_in, j->n_in, k0, k1, j->dst);
        return;
    }
    size_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    if (r1 > r0)
        (j->kern->qx_quantize ? j->kern->qx_quantize : kern_qx_quantize)(
            j->fmt, j->in + r0 * j->n_in, r1 - r0, j->n_in, j->n_in,
            (uint8_t *)j->dst + r0 * kern_qx_row_bytes(j->fmt, j->n_in));
}

/* A batch's rows are quantized on the pool: on one thread, 16 rows took ~6 % of a
 * TinyLlama-shape Q4_K_M step while the other core waited (perf, docs/BENCHMARKS.md). One row
 * (a decode step) stays on this thread: the hand-off would cost more than the pass; the job
 * counts a value as 32 multiply-adds, about what quantizing it costs. */
void engine__quantize_rows(engine_ctx *c, kern_qx fmt, const float *in, size_t rows, size_t n_in,
                           void *dst)
{
    input_job j = {c->kern, fmt, in, rows, n_in, dst};
    if (rows < 2)
        input_worker(&j, 0, 1);
    else
        engine__run_job(c, input_worker, &j, (uint64_t)rows * n_in * 32);
}

/* In one pool job (one hand-off instead of n); with glu, act(out[0]) * out[1] is computed on
 * each chunk as soon as both products have it. */
void engine__matmuls(engine_ctx *c, const float *in, size_t rows, uint32_t n,
                     const kern_mat *const *w, float *const *out, engine_glu glu)
{
    matmul_job j = {.c = c, .in = in, .rows = rows, .n_mats = n, .glu = glu};
    uint64_t macs = 0;
    for (uint32_t m = 0; m < n; m++) {
        /* Items of 64 columns: four panels, a few KB of weights per row of K. */
        const kern_mat *wm = w[m];
        j.w[m] = wm;
        j.out[m] = out[m];
        j.chunk[m] = 64;
        uint32_t items = (uint32_t)((wm->n_out + j.chunk[m] - 1) / j.chunk[m]);
        j.first_item[m + 1] = glu != ENGINE_GLU_NONE ? items : j.first_item[m] + items;
        macs += (uint64_t)rows * wm->n_out * wm->n_in;
    }
    /* Matrices on the integer path share the input: each row quantized once per format (a
     * pass over the input, against n_out passes in the products); F16 / F32 panels likewise
     * read one copy laid out for the table's row tiles, where it has a layout of its own. */
    bool done[2] = {false, false};
    for (uint32_t m = 0; m < n && c->kern->pack_x && rows >= c->kern->pack_min_rows && !j.xp; m++)
        if (w[m]->type == KERN_F16_PANEL || w[m]->type == KERN_F32_PANEL) {
            /* a value counted as 2 multiply-adds (a load and a store): 64 rows of 768 stay on
             * this thread, a 512-token prompt's go to the pool */
            input_job pj = {c->kern, KERN_QX_NONE, in, rows, w[m]->n_in, c->xp};
            engine__run_job(c, input_worker, &pj, (uint64_t)rows * w[m]->n_in * 2);
            j.xp = c->xp;
        }
    for (uint32_t m = 0; m < n; m++) {
        kern_qx fmt = kern_qdot_act(w[m]);
        if (fmt != KERN_QX_NONE && !done[fmt == KERN_QX_256]) {
            engine__quantize_rows(c, fmt, in, rows, w[m]->n_in, c->xq[fmt == KERN_QX_256]);
            done[fmt == KERN_QX_256] = true;
        }
    }
    engine__run_items(c, j.first_item[n], matmul_item, &j, macs);
}

void engine__matmul(engine_ctx *c, float *out, const float *in, const kern_mat *w, size_t rows)
{
    engine__matmuls(c, in, rows, 1, &w, &out, ENGINE_GLU_NONE);
}

/* Rotates pair j of each head's first n_rot dimensions by the row's angle pos * inv_freq[j]:
 * NORM pairs (x[2j], x[2j+1]) (llama, whose converter permutes Q and K for it), NEOX pairs
 * (x[j], x[j + n_rot/2]) (qwen2 and the others, Hugging Face layout). Dimensions past n_rot pass
 * through. cs holds (cos, sin) of each angle, computed once per step instead of once per layer. */
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

/* Checks the table entries rows of a sequence read: blocks lo / bs .. pos / bs of a table
 * (lo = 0 for the global layers, the window's first position for the windowed ones, whose
 * earlier entries may be released), and returns pos's slot or -1. */
static int32_t table_slot(const int32_t *blocks, uint32_t n_blocks, uint32_t n_ids, uint32_t bs,
                          uint32_t lo, uint32_t pos)
{
    uint32_t bi = pos / bs;
    if (!blocks || bi >= n_blocks)
        return -1;
    for (uint32_t i = lo / bs; i <= bi; i++)
        if (blocks[i] < 0 || (uint32_t)blocks[i] >= n_ids)
            return -1;
    return blocks[bi] * (int32_t)bs + (int32_t)(pos % bs);
}

static int validate_batch(engine_ctx *c, const engine_kv *kv, const engine_batch *b)
{
    if (b->n_tokens == 0 || b->n_tokens > c->max_tokens)
        return KVS_EINVAL;
    uint32_t bs = kv->block_size, window = engine_model_window(c->m);
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        if (b->token[t] < 0 || (uint32_t)b->token[t] >= c->m->hp.n_vocab || b->pos[t] < 0 ||
            b->seq[t] < 0 || (uint32_t)b->seq[t] >= b->n_seqs)
            return KVS_EINVAL;
        const engine_seq_view *s = &b->seqs[b->seq[t]];
        uint32_t pos = (uint32_t)b->pos[t];
        c->slot[t] = table_slot(s->blocks, s->n_blocks, kv->n_blocks, bs, 0, pos);
        if (c->slot[t] < 0)
            return KVS_EINVAL;
        if (kv->n_wblocks) {
            /* The windowed layers read this row's window only: entries before it may be
             * released (-1). */
            uint32_t lo = pos + 1 > window ? pos + 1 - window : 0;
            c->wslot[t] = table_slot(s->wblocks, s->n_wblocks, kv->n_wblocks, bs, lo, pos);
            if (c->wslot[t] < 0)
                return KVS_EINVAL;
        }
    }
    return 0;
}

void engine__rope_store(engine_ctx *c, engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    size_t T = b->n_tokens, Q = (size_t)hp->n_head * hp->head_dim,
           kv_dim = (size_t)hp->n_head_kv * hp->head_dim, R = hp->n_rot / 2;
    const float *cs = c->rope_cs + (size_t)c->m->layers[l].rope_set * c->max_tokens * R * 2;
    uint8_t *kl = kv->k + kv->layer_off[l], *vl = kv->v + kv->v_off[l];
    const int32_t *slot = kv->group[l] == ENGINE_KV_WINDOWED ? c->wslot : c->slot;
    bool no_rope = c->m->layers[l].no_rope;
    for (size_t t = 0; t < T; t++) {
        if (!no_rope) {
            rope(c->q + t * Q, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type, cs + t * R * 2);
            rope(c->k + t * kv_dim, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_type,
                 cs + t * R * 2);
        }
        size_t off = (size_t)slot[t] * kv_dim * kv->esz;
        if (kv->type == ENGINE_KV_F16) {
            c->kern->to_f16((uint16_t *)(void *)(kl + off), c->k + t * kv_dim, kv_dim);
            c->kern->to_f16((uint16_t *)(void *)(vl + off), c->v + t * kv_dim, kv_dim);
        } else {
            memcpy(kl + off, c->k + t * kv_dim, kv_dim * sizeof(float));
            memcpy(vl + off, c->v + t * kv_dim, kv_dim * sizeof(float));
        }
    }
}

void engine__rope_q(engine_ctx *c, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    size_t T = b->n_tokens, Q = (size_t)hp->n_head * hp->head_dim, R = hp->n_rot / 2;
    const float *cs = c->rope_cs + (size_t)c->m->layers[l].rope_set * c->max_tokens * R * 2;
    for (size_t t = 0; t < T && !c->m->layers[l].no_rope; t++)
        rope(c->q + t * Q, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type, cs + t * R * 2);
}

int engine_forward(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out)
{
    return engine_forward_hidden(c, kv, b, logits_out, NULL, NULL);
}

int engine_forward_hidden(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out,
                          const bool *hidden, float *hidden_out)
{
    int rc = hidden && !hidden_out ? KVS_EINVAL : validate_batch(c, kv, b);
    if (rc)
        return rc;
    const engine_model *m = c->m;
    const engine_hparams *hp = &m->hp;
    size_t T = b->n_tokens, E = hp->n_embd, R = hp->n_rot / 2;

    for (size_t t = 0; t < T; t++) {
        kern_rows_to_f32(&m->tok_embd, (size_t)b->token[t], 1, c->x + t * E);
        if (m->embd_scale != 1.0f)
            for (size_t i = 0; i < E; i++)
                c->x[t * E + i] *= m->embd_scale;
        for (uint32_t s = 0; s < m->n_rope; s++) {
            float *cs = c->rope_cs + (s * c->max_tokens + t) * R * 2;
            for (size_t r = 0; r < R; r++) {
                float theta = (float)b->pos[t] * c->rope_inv_freq[s * R + r];
                cs[r * 2] = cosf(theta) * c->rope_mscale[s];
                cs[r * 2 + 1] = sinf(theta) * c->rope_mscale[s];
            }
        }
    }

    if (m->arch->begin)
        m->arch->begin(c, b);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        m->arch->layer(c, kv, b, l);
    if (m->arch->end)
        m->arch->end(c, b);

    /* Final norm and the vocabulary projection, only for rows whose logits are wanted. */
    size_t n_out = 0;
    for (size_t t = 0; t < T; t++) {
        if (!b->logits[t])
            continue;
        engine__norm_rows(c, c->xn + n_out * E, c->x + t * E, m->output_norm, 1, E);
        n_out++;
    }
    if (n_out)
        engine__matmul(c, logits_out, c->xn, &m->output, n_out);
    if (n_out && m->logit_mul != 1.0f) /* granite's logit_scale: ggml_scale by 1 / scale */
        for (size_t i = 0; i < n_out * hp->n_vocab; i++)
            logits_out[i] *= m->logit_mul;
    if (n_out && m->final_softcap > 0) /* gemma 2's soft-capping of logits */
        c->kern->softcap(logits_out, n_out * hp->n_vocab, 1.0f, m->final_softcap);
    /* Hidden states wanted as such (embeddings): the same norm, written out. */
    for (size_t t = 0, k = 0; hidden && t < T; t++)
        if (hidden[t])
            engine__norm_rows(c, hidden_out + k++ * E, c->x + t * E, m->output_norm, 1, E);
    return 0;
}
