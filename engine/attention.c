/* Paged attention over block tables: items of (row, span of positions), each leaving a partial
 * softmax per head, folded per row in order (flash-decoding's merge), so a row's bits depend on
 * its length (and its layer's window) alone. */
#include "engine/arch.h"

#include <math.h>
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
    uint32_t n_tasks;       /* c->attn_tasks of this wave */
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

/* The first span of row t (its window's first position's), from which its items count. */
static uint32_t first_span(const engine_batch *b, uint32_t window, uint32_t t)
{
    uint32_t n_pos = (uint32_t)b->pos[t] + 1;
    return (window && n_pos > window ? n_pos - window : 0) / ATTN_SPAN;
}

/* One item as a task sees it: a row's span of positions and where its result goes. */
typedef struct attn_item {
    const float *q;        /* the row's queries, every head */
    const int32_t *blocks; /* its sequence's block table (the layer's group) */
    float *part;           /* the item's (n_head, head_dim + 2) result */
    uint32_t p0, skip, n;  /* the span's first position; positions before the window; count */
} attn_item;

static void item_init(const attn_job *j, uint32_t t, uint32_t span, uint32_t item, attn_item *it)
{
    const engine_ctx *c = j->c;
    const engine_hparams *hp = &c->m->hp;
    const engine_seq_view *s = &j->b->seqs[j->b->seq[t]];
    uint32_t n_pos = (uint32_t)j->b->pos[t] + 1;
    uint32_t lo = j->window && n_pos > j->window ? n_pos - j->window : 0;
    it->q = c->q + (size_t)t * hp->n_head * hp->head_dim;
    it->blocks = j->windowed_table ? s->wblocks : s->blocks;
    it->part = c->attn_part + (size_t)(item - j->i0) * hp->n_head * (hp->head_dim + 2);
    it->p0 = span * ATTN_SPAN;
    it->skip = lo > it->p0 ? lo - it->p0 : 0; /* the first span's positions before the window */
    it->n = n_pos - it->p0 < ATTN_SPAN ? n_pos - it->p0 : ATTN_SPAN;
}

/* The heads one call of the run kernels takes: with grouped-query attention the query heads of
 * one kv head, which read the same cache rows (each row widened once for them all); without (one
 * query head per kv head), a lone row's every head, at bh bytes from the previous one's rows
 * (independent FMA chains), and for several rows one head, whose span of keys and values (2 x
 * 128 positions x head_dim) then stays in L1 while each row of the group reads it. */
static uint32_t heads_at_once(const engine_hparams *hp, bool lone_row)
{
    uint32_t group = hp->n_head / hp->n_head_kv;
    return group > 1 ? group : lone_row ? hp->n_head : 1;
}

/* The run kernels' view of heads [h0, h0 + g) over positions [i, i + run) of the item's span
 * (within one block): arena holds the layer's K or V. */
static kern_run head_run(const attn_job *j, const attn_item *it, const uint8_t *arena, uint32_t h0,
                         uint32_t g, uint32_t i, uint32_t run)
{
    const engine_hparams *hp = &j->c->m->hp;
    uint32_t hd = hp->head_dim, bs = j->kv->block_size, group = hp->n_head / hp->n_head_kv;
    size_t row = (size_t)hp->n_head_kv * hd * j->kv->esz, hsz = (size_t)hd * j->kv->esz;
    uint32_t p = it->p0 + i;
    const uint8_t *base = arena + ((size_t)it->blocks[p / bs] * bs + p % bs) * row;
    return (kern_run){.b = base + (size_t)(h0 / group) * hsz,
                      .bh = group > 1 ? 0 : hsz,
                      .stride = row,
                      .g = g,
                      .m = run,
                      .n = hd};
}

/* The scores' scale (or soft-cap) on n heads' or rows' scores, ATTN_SPAN apart, positions
 * [i0, i1). */
static void scale_scores(const engine_ctx *c, float *sc, uint32_t n, uint32_t i0, uint32_t i1)
{
    float scale = c->m->attn_scale, cap = c->m->attn_softcap;
    for (uint32_t h = 0; h < n; h++) {
        float *s = sc + h * ATTN_SPAN;
        if (cap > 0)
            c->kern->softcap(s + i0, i1 - i0, scale, cap);
        else /* a loop the compiler vectorizes */
            for (uint32_t i = i0; i < i1; i++)
                s[i] *= scale;
    }
}

/* Heads [h0, h0 + g)'s scores of item it's positions [i0, i1) into sc + (h - h0) * ATTN_SPAN
 * (scaled, soft-capped). */
static void heads_scores(const attn_job *j, const attn_item *it, uint32_t h0, uint32_t g, float *sc,
                         uint32_t i0, uint32_t i1)
{
    const engine_ctx *c = j->c;
    const engine_hparams *hp = &c->m->hp;
    uint32_t hd = hp->head_dim, bs = j->kv->block_size, group = hp->n_head / hp->n_head_kv;
    size_t row = (size_t)hp->n_head_kv * hd * j->kv->esz;
    if (j->kv->type == ENGINE_KV_F16) {
        /* a block's positions are rows `row` bytes apart: one call per run */
        for (uint32_t i = i0; i < i1;) {
            uint32_t p = it->p0 + i, run = bs - p % bs < i1 - i ? bs - p % bs : i1 - i;
            kern_run r = head_run(j, it, j->kl, h0, g, i, run);
            kern_dot_f16_n(c->kern, &r, it->q + (size_t)h0 * hd, hd, sc + i, ATTN_SPAN);
            i += run;
        }
    } else {
        for (uint32_t h = h0; h < h0 + g; h++)
            for (uint32_t i = i0; i < i1; i++) {
                uint32_t p = it->p0 + i;
                const uint8_t *kp = j->kl + ((size_t)it->blocks[p / bs] * bs + p % bs) * row +
                                    (size_t)(h / group) * hd * j->kv->esz;
                sc[(h - h0) * ATTN_SPAN + i] =
                    c->kern->dot(it->q + (size_t)h * hd, (const float *)(const void *)kp, hd);
            }
    }
    scale_scores(c, sc, g, i0, i1);
}

/* Head h's softmax of sc in place (the table's, kern/kexp.h): its max and sum go to the head's
 * result, whose o is zeroed. */
static void head_softmax(const attn_job *j, const attn_item *it, uint32_t h, float *sc)
{
    uint32_t hd = j->c->m->hp.head_dim;
    float *ph = it->part + (size_t)h * (hd + 2), maxv;
    float sum = j->c->kern->softmax(sc + it->skip, it->n - it->skip, &maxv);
    memset(ph, 0, hd * sizeof(float));
    ph[hd] = maxv;
    ph[hd + 1] = sum;
}

/* Heads [h0, h0 + g)'s o += the values of positions [i0, i1) of the span, weighted by sc + (h -
 * h0) * ATTN_SPAN, in order. */
static void heads_values(const attn_job *j, const attn_item *it, uint32_t h0, uint32_t g,
                         const float *sc, uint32_t i0, uint32_t i1)
{
    const engine_ctx *c = j->c;
    const engine_hparams *hp = &c->m->hp;
    uint32_t hd = hp->head_dim, bs = j->kv->block_size, group = hp->n_head / hp->n_head_kv;
    size_t row = (size_t)hp->n_head_kv * hd * j->kv->esz;
    float *oh = it->part + (size_t)h0 * (hd + 2);
    for (uint32_t i = i0; i < i1;) {
        uint32_t p = it->p0 + i, run = bs - p % bs < i1 - i ? bs - p % bs : i1 - i;
        if (j->kv->type == ENGINE_KV_F16) {
            kern_run r = head_run(j, it, j->vl, h0, g, i, run);
            kern_axpy_f16_n(c->kern, &r, oh, hd + 2, sc + i, ATTN_SPAN);
        } else {
            const uint8_t *vb = j->vl + ((size_t)it->blocks[p / bs] * bs + p % bs) * row;
            for (uint32_t h = h0; h < h0 + g; h++)
                for (uint32_t r = 0; r < run; r++)
                    c->kern->axpy(
                        oh + (size_t)(h - h0) * (hd + 2), sc[(h - h0) * ATTN_SPAN + i + r],
                        (const float *)(const void *)(vb + (size_t)r * row +
                                                      (size_t)(h / group) * hd * j->kv->esz),
                        hd);
        }
        i += run;
    }
}

/* The cache rows of the block run at position i of the span (arena: K or V), asked for ahead
 * of their use: a lone row's attention reads each block once, mostly from memory past a few
 * thousand positions, and the hardware prefetchers do not follow the jumps between blocks. */
static void prefetch_run(const attn_job *j, const attn_item *it, const uint8_t *arena, uint32_t i)
{
    const engine_hparams *hp = &j->c->m->hp;
    uint32_t bs = j->kv->block_size, p = it->p0 + i;
    uint32_t run = bs - p % bs < it->n - i ? bs - p % bs : it->n - i;
    size_t row = (size_t)hp->n_head_kv * hp->head_dim * j->kv->esz;
    const uint8_t *b = arena + ((size_t)it->blocks[p / bs] * bs + p % bs) * row;
    for (size_t o = 0; o < run * row; o += 64)
        __builtin_prefetch(b + o, 0, 3);
}

#define ROWS_MAX_HD 256 /* rows_attend's value sums stay on the stack */

/* Whether item b, nr rows after item a, sees the same positions of the span, its queries where
 * a's rows would put them: rows_attend can take them together. */
static bool same_positions(const engine_hparams *hp, const attn_item *a, const attn_item *b,
                           uint32_t nr)
{
    return b->skip == a->skip && b->n == a->n &&
           b->q == a->q + (size_t)nr * hp->n_head * hp->head_dim;
}

/* nr consecutive rows of one sequence that see the same positions of the span (every span of a
 * prompt but each row's last), without GQA, F16 cache: head by head, each block run's keys then
 * values meet all nr rows in one run-kernel call (the rows as the call's heads, bh = 0), so
 * each key and value row is widened once for them all instead of once per row. Per row and
 * head the same scores, softmax and in-order value sums as heads_scores / heads_values (the
 * run kernels' contract), so the same bits. */
static void rows_attend(const attn_job *j, const attn_item *its, uint32_t nr, float *sc)
{
    const engine_ctx *c = j->c;
    const engine_hparams *hp = &c->m->hp;
    uint32_t hd = hp->head_dim, bs = j->kv->block_size;
    const attn_item *it = &its[0];
    float y[ATTN_GROUP * ROWS_MAX_HD];
    for (uint32_t h = 0; h < hp->n_head; h++) {
        for (uint32_t i = it->skip; i < it->n;) {
            uint32_t p = it->p0 + i, run = bs - p % bs < it->n - i ? bs - p % bs : it->n - i;
            kern_run r = head_run(j, it, j->kl, h, 1, i, run);
            r.g = nr;
            r.bh = 0;
            kern_dot_f16_n(c->kern, &r, it->q + (size_t)h * hd, (size_t)hp->n_head * hd, sc + i,
                           ATTN_SPAN);
            i += run;
        }
        scale_scores(c, sc, nr, it->skip, it->n);
        for (uint32_t k = 0; k < nr; k++)
            head_softmax(j, &its[k], h, sc + k * ATTN_SPAN);
        memset(y, 0, (size_t)nr * hd * sizeof(float)); /* as head_softmax zeroes each o */
        for (uint32_t i = it->skip; i < it->n;) {
            uint32_t p = it->p0 + i, run = bs - p % bs < it->n - i ? bs - p % bs : it->n - i;
            kern_run r = head_run(j, it, j->vl, h, 1, i, run);
            r.g = nr;
            r.bh = 0;
            kern_axpy_f16_n(c->kern, &r, y, hd, sc + i, ATTN_SPAN);
            i += run;
        }
        for (uint32_t k = 0; k < nr; k++)
            memcpy(its[k].part + (size_t)h * (hd + 2), y + (size_t)k * hd, hd * sizeof(float));
    }
}

/* One task: a span of positions for up to ATTN_GROUP rows of one sequence. Each (row, head)
 * is computed alike whatever the order (its scores, softmax and value sums each in position
 * order), so the order only decides what stays in the caches and what is shared. A lone row
 * (decoding) goes through its span block by block, its K rows once for every head, then its V
 * rows once, the next block's rows asked for ahead; several rows go kv head by kv head
 * (heads_at_once), so that head's keys and values of the span stay in L1 while every row of the
 * group reads them; without GQA, rows that see the same positions also share the widening of
 * each key and value row (rows_attend). */
static void attend_task(const attn_job *j, const attn_task *tk, float *scores)
{
    const engine_hparams *hp = &j->c->m->hp;
    attn_item its[ATTN_GROUP];
    uint32_t n_it = 0;
    for (uint32_t t = tk->t0; t < tk->t1; t++) {
        uint32_t f = first_span(j->b, j->window, t), item = j->c->attn_first[t] + tk->span - f;
        if (tk->span < f || item >= j->c->attn_first[t + 1] || item < j->i0 || item >= j->i1)
            continue;
        item_init(j, t, tk->span, item, &its[n_it++]);
    }
    uint32_t g = heads_at_once(hp, n_it == 1);
    if (n_it == 1) {
        const attn_item *it = &its[0];
        uint32_t bs = j->kv->block_size;
        prefetch_run(j, it, j->kl, it->skip);
        for (uint32_t i = it->skip; i < it->n;) {
            uint32_t p = it->p0 + i, run = bs - p % bs < it->n - i ? bs - p % bs : it->n - i;
            prefetch_run(j, it, i + run < it->n ? j->kl : j->vl,
                         i + run < it->n ? i + run : it->skip);
            for (uint32_t h = 0; h < hp->n_head; h += g)
                heads_scores(j, it, h, g, scores + h * ATTN_SPAN, i, i + run);
            i += run;
        }
        for (uint32_t h = 0; h < hp->n_head; h++)
            head_softmax(j, it, h, scores + h * ATTN_SPAN);
        for (uint32_t i = it->skip; i < it->n;) {
            uint32_t p = it->p0 + i, run = bs - p % bs < it->n - i ? bs - p % bs : it->n - i;
            if (i + run < it->n)
                prefetch_run(j, it, j->vl, i + run);
            for (uint32_t h = 0; h < hp->n_head; h += g)
                heads_values(j, it, h, g, scores + h * ATTN_SPAN, i, i + run);
            i += run;
        }
        return;
    }
    if (g == 1 && j->kv->type == ENGINE_KV_F16 && hp->head_dim <= ROWS_MAX_HD) {
        for (uint32_t r0 = 0, r1; r0 < n_it; r0 = r1) {
            for (r1 = r0 + 1; r1 < n_it && same_positions(hp, &its[r0], &its[r1], r1 - r0); r1++)
                ;
            if (r1 - r0 > 1) {
                rows_attend(j, its + r0, r1 - r0, scores);
                continue;
            }
            for (uint32_t h = 0; h < hp->n_head; h++) {
                heads_scores(j, &its[r0], h, 1, scores, its[r0].skip, its[r0].n);
                head_softmax(j, &its[r0], h, scores);
                heads_values(j, &its[r0], h, 1, scores, its[r0].skip, its[r0].n);
            }
        }
        return;
    }
    for (uint32_t h = 0; h < hp->n_head; h += g)
        for (uint32_t r = 0; r < n_it; r++) {
            heads_scores(j, &its[r], h, g, scores, its[r].skip, its[r].n);
            for (uint32_t k = 0; k < g; k++)
                head_softmax(j, &its[r], h + k, scores + k * ATTN_SPAN);
            heads_values(j, &its[r], h, g, scores, its[r].skip, its[r].n);
        }
}

/* Task k of the wave (engine__run_items hands them out: consecutive tasks, a group's next spans,
 * mostly to one thread). */
static void attn_run_task(void *arg, uint32_t k, uint32_t ith)
{
    attn_job *j = arg;
    float *scores = j->c->scores + (size_t)ith * ATTN_SCORES(j->c->m->hp.n_head);
    attend_task(j, &j->c->attn_tasks[k], scores);
}

/* The tasks of wave [i0, i1): its rows cut into groups of consecutive rows of one sequence
 * (at most ATTN_GROUP), each group's spans one task, every task holding at least one of the
 * wave's items (so there are at most ATTN_WAVE). */
static uint32_t wave_tasks(attn_job *j)
{
    engine_ctx *c = j->c;
    const engine_batch *b = j->b;
    uint32_t T = b->n_tokens, n = 0;
    uint32_t ta = attn_row(c, T, j->i0), tb = attn_row(c, T, j->i1 - 1);
    for (uint32_t g0 = ta, g1; g0 <= tb; g0 = g1) {
        for (g1 = g0 + 1; g1 <= tb && g1 - g0 < ATTN_GROUP && b->seq[g1] == b->seq[g0]; g1++)
            ;
        uint32_t smin = UINT32_MAX, smax = 0; /* the spans of the group's items in the wave */
        for (uint32_t t = g0; t < g1; t++) {
            uint32_t f = first_span(b, j->window, t);
            uint32_t a = c->attn_first[t] > j->i0 ? c->attn_first[t] : j->i0;
            uint32_t e = c->attn_first[t + 1] < j->i1 ? c->attn_first[t + 1] : j->i1;
            if (a >= e)
                continue;
            smin = f + a - c->attn_first[t] < smin ? f + a - c->attn_first[t] : smin;
            smax = f + e - 1 - c->attn_first[t] > smax ? f + e - 1 - c->attn_first[t] : smax;
        }
        for (uint32_t s = smin; smin != UINT32_MAX && s <= smax; s++) {
            bool any = false;
            for (uint32_t t = g0; t < g1 && !any; t++) {
                uint32_t f = first_span(b, j->window, t), item = c->attn_first[t] + s - f;
                any = s >= f && item < c->attn_first[t + 1] && item >= j->i0 && item < j->i1;
            }
            if (any)
                c->attn_tasks[n++] = (attn_task){g0, g1, s};
        }
    }
    return n;
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
                  .vl = kv->v + kv->v_off[l],
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
        j.n_tasks = wave_tasks(&j);
        engine__run_items(c, j.n_tasks, attn_run_task, &j, macs);
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
    /* A sink (gpt-oss) is one more logit in the head's softmax with no value: it joins the
     * max and the sum only. */
    const float *sinks = c->m->layers[l].sinks;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < hp->n_head; h++) {
            const float *sh = c->attn_state + t * per_row + h * per_head;
            float *out = c->att + ((size_t)t * hp->n_head + h) * hd, inv = 1.0f / sh[hd + 1];
            if (sinks) {
                float mx = sh[hd] > sinks[h] ? sh[hd] : sinks[h], a = expf(sh[hd] - mx);
                inv = a / (a * sh[hd + 1] + expf(sinks[h] - mx));
            }
            for (uint32_t d = 0; d < hd; d++)
                out[d] = sh[d] * inv;
        }
}
