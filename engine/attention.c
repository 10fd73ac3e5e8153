/* Paged attention over block tables: items of (row, span of positions), each leaving a partial
 * softmax per head, folded per row in order (flash-decoding's merge), so a row's bits depend on
 * its length (and its layer's window) alone. */
#include "engine/arch.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Attention runs in items of one row and one span of ATTN_SPAN positions, with every head:
 * each item streams its positions' cache rows (all kv heads of a position are contiguous) once
 * for keys and once for values, and leaves per head the span's max score m, its sum of
 * exp(score - m) l and its exp-weighted sum of values o. A row's spans are then folded in
 * order (the merge of flash-decoding) and the row's output is o / l. Spans are fixed cuts of
 * the position range, so a row's arithmetic depends on its length alone, never on the batch,
 * the thread count or the wave sizes: cached decoding and a full recomputation give the same
 * bits. A long sequence decoding alone still spreads over every core. Items run in waves of
 * ATTN_WAVE, so the scratch is fixed at context creation whatever the context length.
 * A windowed layer (sliding-window attention) sees positions pos - window + 1 .. pos only (as
 * llama.cpp's LLAMA_SWA_TYPE_STANDARD mask): its items start at the span holding the first
 * of them, and positions of that span before it are skipped. */
typedef struct attn_job {
    engine_ctx *c;
    const engine_kv *kv;
    const engine_batch *b;
    const uint8_t *kl, *vl; /* this layer's K and V arenas (kv->type values) */
    bool windowed_table;    /* read the rows' windowed-group tables (a split arena) */
    uint32_t window;        /* the layer's window, 0: every position */
    uint32_t i0, i1;        /* this wave's items */
    atomic_uint next;       /* next item to take */
} attn_job;

/* Row of item i: the last row whose first item is <= i. */
static uint32_t attn_row(const engine_ctx *c, uint32_t n_rows, uint32_t i)
{
    uint32_t lo = 0, hi = n_rows - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (c->attn_first[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void attend_span(const attn_job *j, uint32_t item, float *scores)
{
    const engine_ctx *c = j->c;
    const engine_kv *kv = j->kv;
    const engine_hparams *hp = &c->m->hp;
    uint32_t t = attn_row(c, j->b->n_tokens, item);
    const engine_seq_view *s = &j->b->seqs[j->b->seq[t]];
    uint32_t n_pos = (uint32_t)j->b->pos[t] + 1, bs = kv->block_size;
    uint32_t lo = j->window && n_pos > j->window ? n_pos - j->window : 0;
    uint32_t p0 = (lo / ATTN_SPAN + item - c->attn_first[t]) * ATTN_SPAN;
    const int32_t *blocks = j->windowed_table ? s->wblocks : s->blocks;
    uint32_t skip = lo > p0 ? lo - p0 : 0; /* the first span's positions before the window */
    uint32_t n = n_pos - p0 < ATTN_SPAN ? n_pos - p0 : ATTN_SPAN;
    uint32_t hd = hp->head_dim, n_head = hp->n_head, group = n_head / hp->n_head_kv;
    size_t row = (size_t)hp->n_head_kv * hd * kv->esz, head = hd * kv->esz; /* bytes */
    float scale = c->m->attn_scale, cap = c->m->attn_softcap;
    const float *q = c->q + (size_t)t * n_head * hd;
    bool f16 = kv->type == ENGINE_KV_F16;
    if (f16) {
        /* a block's positions are rows `row` bytes apart: one call per head and run */
        for (uint32_t i = skip; i < n;) {
            uint32_t p = p0 + i, run = bs - p % bs < n - i ? bs - p % bs : n - i;
            const uint8_t *kp = j->kl + ((size_t)blocks[p / bs] * bs + p % bs) * row;
            for (uint32_t h = 0; h < n_head; h++)
                kern_dot_f16_n(c->kern, q + (size_t)h * hd, kp + (size_t)(h / group) * head, row,
                               run, hd, scores + h * ATTN_SPAN + i);
            i += run;
        }
        for (uint32_t h = 0; h < n_head; h++)
            for (uint32_t i = skip; i < n; i++) {
                float sc = scores[h * ATTN_SPAN + i] * scale;
                scores[h * ATTN_SPAN + i] = cap > 0 ? cap * tanhf(sc / cap) : sc;
            }
    } else {
        for (uint32_t i = skip; i < n; i++) {
            uint32_t p = p0 + i;
            const uint8_t *kp = j->kl + ((size_t)blocks[p / bs] * bs + p % bs) * row;
            for (uint32_t h = 0; h < n_head; h++) {
                float sc = c->kern->dot(
                               q + (size_t)h * hd,
                               (const float *)(const void *)(kp + (size_t)(h / group) * head), hd) *
                           scale;
                scores[h * ATTN_SPAN + i] = cap > 0 ? cap * tanhf(sc / cap) : sc;
            }
        }
    }
    float *part = c->attn_part + (size_t)(item - j->i0) * n_head * (hd + 2);
    for (uint32_t h = 0; h < n_head; h++) {
        float *sc = scores + h * ATTN_SPAN, *ph = part + (size_t)h * (hd + 2);
        float maxv = -INFINITY, sum = 0.0f;
        for (uint32_t i = skip; i < n; i++)
            maxv = sc[i] > maxv ? sc[i] : maxv;
        for (uint32_t i = skip; i < n; i++) {
            sc[i] = expf(sc[i] - maxv);
            sum += sc[i];
        }
        memset(ph, 0, hd * sizeof(float));
        ph[hd] = maxv;
        ph[hd + 1] = sum;
    }
    /* each head's o sums its positions in order, run after run (as one axpy per position) */
    for (uint32_t i = skip; i < n;) {
        uint32_t p = p0 + i, run = bs - p % bs < n - i ? bs - p % bs : n - i;
        const uint8_t *vp = j->vl + ((size_t)blocks[p / bs] * bs + p % bs) * row;
        for (uint32_t h = 0; h < n_head; h++) {
            const uint8_t *vh = vp + (size_t)(h / group) * head;
            float *oh = part + (size_t)h * (hd + 2);
            if (f16)
                kern_axpy_f16_n(c->kern, oh, scores + h * ATTN_SPAN + i, vh, row, run, hd);
            else
                for (uint32_t r = 0; r < run; r++)
                    c->kern->axpy(oh, scores[h * ATTN_SPAN + i + r],
                                  (const float *)(const void *)(vh + (size_t)r * row), hd);
        }
        i += run;
    }
}

static void attn_worker(void *arg, uint32_t ith, uint32_t nth)
{
    (void)nth;
    attn_job *j = arg;
    float *scores = j->c->scores + (size_t)ith * j->c->m->hp.n_head * ATTN_SPAN;
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->i1)
            return;
        attend_span(j, i, scores);
    }
}

/* Attention of every row of the batch into c->att, in waves of items; after each wave its span
 * results are folded, in item order, into their rows' states. */
void engine__attention(engine_ctx *c, const engine_kv *kv, const engine_batch *b, uint32_t l)
{
    const engine_hparams *hp = &c->m->hp;
    uint32_t T = b->n_tokens, hd = hp->head_dim, window = c->m->layers[l].window;
    size_t per_head = hd + 2, per_row = hp->n_head * per_head;
    attn_job j = {.c = c,
                  .kv = kv,
                  .b = b,
                  .kl = kv->k + kv->layer_off[l],
                  .vl = kv->v + kv->layer_off[l],
                  .windowed_table = kv->group[l] == ENGINE_KV_WINDOWED,
                  .window = window};
    uint64_t macs = 0;    /* of the whole batch: a tiny model's attention stays on this thread */
    c->attn_first[0] = 0; /* a row has one item per span from its window's first position on */
    for (uint32_t t = 0; t < T; t++) {
        uint32_t n_pos = (uint32_t)b->pos[t] + 1;
        uint32_t lo = window && n_pos > window ? n_pos - window : 0;
        c->attn_first[t + 1] = c->attn_first[t] + (n_pos - 1) / ATTN_SPAN - lo / ATTN_SPAN + 1;
        macs += 2ull * (n_pos - lo) * hp->n_head * hd;
    }
    uint32_t n_items = c->attn_first[T];
    for (uint32_t i0 = 0; i0 < n_items; i0 += ATTN_WAVE) {
        j.i0 = i0;
        j.i1 = n_items - i0 < ATTN_WAVE ? n_items : i0 + ATTN_WAVE;
        atomic_init(&j.next, i0);
        engine__run_job(c, attn_worker, &j, macs);
        for (uint32_t i = j.i0; i < j.i1; i++) {
            uint32_t t = attn_row(c, T, i);
            float *st = c->attn_state + t * per_row;
            const float *pt = c->attn_part + (size_t)(i - j.i0) * per_row;
            if (i == c->attn_first[t]) {
                memcpy(st, pt, per_row * sizeof(float));
                continue;
            }
            for (uint32_t h = 0; h < hp->n_head; h++) {
                float *sh = st + h * per_head;
                const float *ph = pt + h * per_head;
                float mx = sh[hd] > ph[hd] ? sh[hd] : ph[hd];
                float a = expf(sh[hd] - mx), e = expf(ph[hd] - mx);
                for (uint32_t d = 0; d < hd; d++)
                    sh[d] = a * sh[d] + e * ph[d];
                sh[hd] = mx;
                sh[hd + 1] = a * sh[hd + 1] + e * ph[hd + 1];
            }
        }
    }
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < hp->n_head; h++) {
            const float *sh = c->attn_state + t * per_row + h * per_head;
            float *out = c->att + ((size_t)t * hp->n_head + h) * hd, inv = 1.0f / sh[hd + 1];
            for (uint32_t d = 0; d < hd; d++)
                out[d] = sh[d] * inv;
        }
}
