/* Scheduler: the engine thread and the per-request event queues.
 *
 * A request becomes one sequence (its first choice) in the waiting queue. Sequences move
 * waiting -> running (admitted: blocks reserved, prefill in chunks) -> finished. A request
 * with n > 1 forks its first sequence once the prompt is computed: the forks share every
 * prompt block and copy only the partly filled last block on their first write.
 * Preemption frees a sequence's blocks and requeues it at the head of the waiting queue with
 * all its tokens; on readmission its full blocks are usually still in the prefix cache, and it
 * continues from where it was (same sampler state), so its output is unaffected. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/memavail.h"
#include "common/status.h"
#include "kvpool/kvpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

sched_params sched_default_params(void)
{
    sched_params p = {
        .max_num_seqs = 64,
        .max_queue = 256,
        .max_batched_tokens = 512,
        .kv_cache_mb = 0,
        .kv_type = ENGINE_KV_F16,
        .block_size = 16,
        .prefix_cache = true,
        .window_reclaim = true,
        .n_threads = 0,
        .n_ctx = 0,
    };
    return p;
}

/* ------------------------------------------------------------------ lifecycle */

/* What the pool's blocks cost: all of one block's layers (bb), and with two groups (per_seq >
 * 0, see scheduler.h) the global group's (gb) and the windowed group's (wb) block, and the
 * windowed blocks one sequence needs (per_seq) */
typedef struct pool_geom {
    uint64_t bb, gb, wb, per_seq;
} pool_geom;

/* The global (*n) and windowed (*w) block counts of a budget of bytes, or of kv_blocks */
static void pool_split(const sched_params *p, const pool_geom *g, uint64_t budget, uint64_t *n,
                       uint64_t *w)
{
    *n = p->kv_blocks ? p->kv_blocks : budget / g->bb;
    *w = 0;
    if (!g->per_seq)
        return;
    /* the windowed group sized to what can be held at once; one sequence's window and chunk
     * always fit, or a long prefill could never run */
    uint64_t cap = g->per_seq * p->max_num_seqs;
    *w = *n < cap ? *n : cap;
    *w = *w < g->per_seq ? g->per_seq : *w;
    if (!p->kv_blocks)
        *n = budget > *w * g->wb ? (budget - *w * g->wb) / g->gb : 0;
    if (*w > (1u << 30))
        *w = 1u << 30;
}

/* The least budget whose global blocks hold one n_ctx-token context: with two groups the
 * windowed one takes as many blocks as the global one (pool_split), at least one sequence's
 * and at most cap */
static uint64_t pool_need(const sched_params *pin, const pool_geom *g, uint32_t n_ctx)
{
    sched_params q = *pin; /* a budget, not kv_blocks */
    const sched_params *p = &q;
    q.kv_blocks = 0;
    uint64_t c = (n_ctx + p->block_size - 1) / p->block_size, n, w;
    uint64_t budget = c * g->bb;
    if (g->per_seq) {
        uint64_t cap = g->per_seq * p->max_num_seqs;
        w = c > cap ? cap : c < g->per_seq ? g->per_seq : c;
        budget = c * g->gb + w * g->wb;
    }
    /* a block more until the split agrees (rounding; bb is the groups' two blocks) */
    for (pool_split(p, g, budget, &n, &w); n < c; pool_split(p, g, budget, &n, &w))
        budget += g->bb;
    return budget;
}

#define AUTO_FLOOR_BYTES (256ull << 20) /* the least pool kv_cache_mb 0 chooses */
#define FIT_MARGIN (1ull << 30)         /* the most left to the rest of the machine */
#define FIT_MIN_CTX 4096u               /* the shortest context the fit chooses */

/* kv_cache_mb 0: a pool holding one whole context and at least 256 MiB, in what the machine has
 * left (kvs_mem_available less a quarter of it, at most 1 GiB). Where one context does not fit
 * there and it is the model's (n_ctx 0), the context is shortened to what does, down to 4096
 * tokens, as llama-server's --fit does; a context asked for is kept, with a warning. Sets p->n_ctx
 * and returns the budget in bytes, or 0 (logged) if not even the shortest context fits. */
static uint64_t pool_auto(sched_params *p, const pool_geom *g, bool ctx_asked)
{
    /* a quarter of what is left, at most 1 GiB, stays for the rest (compute buffers, the HTTP
     * side, the page cache): a small container's limit is not all margin */
    uint64_t left = p->mem_avail ? p->mem_avail : kvs_mem_available();
    uint64_t margin = left / 4 < FIT_MARGIN ? left / 4 : FIT_MARGIN, avail = left - margin;
    bool known = left != 0;
    uint64_t need = pool_need(p, g, p->n_ctx);
    const double mib = 1024.0 * 1024.0;
    if (known && need > avail && ctx_asked) {
        log_warn("scheduler: the KV cache of one %u-token context takes %.0f MiB, more than the "
                 "%.0f MiB of the %.0f MiB this machine has left that it may take",
                 p->n_ctx, need / mib, avail / mib, left / mib);
    } else if (known && need > avail) {
        uint32_t lo = p->n_ctx < FIT_MIN_CTX ? p->n_ctx : FIT_MIN_CTX, hi = p->n_ctx;
        if (pool_need(p, g, lo) > avail) {
            log_error("scheduler: the KV cache of a %u-token context takes %.0f MiB, more than the "
                      "%.0f MiB of the %.0f MiB this machine has left that it may take; "
                      "--ctx-size and --kv-cache-mb choose a smaller one",
                      lo, pool_need(p, g, lo) / mib, avail / mib, left / mib);
            return 0;
        }
        while (hi - lo > p->block_size) { /* the longest context, to a block, that fits */
            uint32_t step = (hi - lo) / 2 / p->block_size * p->block_size;
            uint32_t mid = lo + (step ? step : p->block_size);
            if (pool_need(p, g, mid) <= avail)
                lo = mid;
            else
                hi = mid;
        }
        log_warn("scheduler: the model's %u-token context would take %.0f MiB of KV cache, more "
                 "than the %.0f MiB of the %.0f MiB this machine has left that it may take: "
                 "serving a %u-token context (--ctx-size and --kv-cache-mb choose)",
                 p->n_ctx, need / mib, avail / mib, left / mib, lo);
        p->n_ctx = lo;
        need = pool_need(p, g, lo);
    }
    uint64_t floor = known && avail < AUTO_FLOOR_BYTES ? avail : AUTO_FLOOR_BYTES;
    return need > floor ? need : floor;
}

int sched_create(const sched_params *pin, const engine_model *model, sched **out)
{
    *out = NULL;
    sched_params p = *pin;
    const engine_hparams *hp = engine_model_hparams(model);
    if (p.n_ctx == 0)
        p.n_ctx = hp->n_ctx_train;
    if (p.block_size == 0 || p.block_size > 1024 || p.max_num_seqs == 0 || p.max_num_seqs > 4096 ||
        p.max_batched_tokens == 0 || p.max_batched_tokens > 65536 || p.n_ctx > (1u << 20)) {
        log_error("scheduler: invalid parameters");
        return KVS_EINVAL;
    }
    if (p.max_batched_tokens < p.max_num_seqs)
        p.max_batched_tokens = p.max_num_seqs; /* every running sequence decodes every step */
    if (p.n_threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = cores > 0 ? (uint32_t)cores : 1;
    }
    uint32_t window = engine_model_window(model);
    pool_geom g = {.bb = engine_kv_block_bytes(model, p.kv_type, p.block_size)};
    g.gb = engine_kv_group_block_bytes(model, p.kv_type, p.block_size, ENGINE_KV_GLOBAL);
    if (p.window_reclaim && window > 0 && g.gb > 0 && p.n_ctx > window) {
        /* Two groups (see scheduler.h) */
        g.wb = engine_kv_group_block_bytes(model, p.kv_type, p.block_size, ENGINE_KV_WINDOWED);
        g.per_seq = (window + p.max_batched_tokens + p.block_size - 1) / p.block_size + 3;
    }
    uint64_t budget = (uint64_t)p.kv_cache_mb * 1024 * 1024;
    if (!p.kv_blocks && !p.kv_cache_mb) {
        if (!(budget = pool_auto(&p, &g, pin->n_ctx != 0)))
            return KVS_ENOMEM;
        uint64_t mb = (budget + (1u << 20) - 1) >> 20;
        p.kv_cache_mb = mb > UINT32_MAX ? UINT32_MAX : (uint32_t)mb;
    }
    uint64_t n_blocks, n_wblocks;
    pool_split(&p, &g, budget, &n_blocks, &n_wblocks);
    size_t block_bytes = g.per_seq ? g.gb : g.bb, wblock_bytes = g.wb;
    uint64_t ctx_blocks = (p.n_ctx + p.block_size - 1) / p.block_size;
    if (n_blocks < ctx_blocks) {
        log_error("scheduler: the KV pool (--kv-cache-mb %u / --kv-blocks %u) holds %llu blocks "
                  "of %u tokens; one %u-token context needs %llu (%.0f MiB: --kv-cache-mb 0 "
                  "sizes the pool to it, --ctx-size shortens it)",
                  p.kv_cache_mb, p.kv_blocks, (unsigned long long)n_blocks, p.block_size, p.n_ctx,
                  (unsigned long long)ctx_blocks, pool_need(&p, &g, p.n_ctx) / (1024.0 * 1024.0));
        return KVS_EINVAL;
    }
    if (n_blocks > (1u << 30))
        n_blocks = 1u << 30;
    sched *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->p = p;
    s->model = model;
    s->vocab = engine_model_vocab(model);
    s->n_vocab = hp->n_vocab;
    /* Stop tokens: every end-of-generation token the vocabulary marks (EOS, EOT, <|im_end|>,
     * <end_of_turn>, ...), and BOS when distinct: no model means a generated BOS as content, and
     * stories260K (llama2.c) marks the end of a story with it. */
    const int32_t *eog = NULL;
    size_t n_eog = tok_eog_ids(s->vocab, &eog);
    for (size_t i = 0; i < n_eog && i < TOK_MAX_EOG; i++)
        s->stop_ids[s->n_stop_ids++] = eog[i];
    if (tok_bos(s->vocab) >= 0 && !tok_is_eog(s->vocab, tok_bos(s->vocab)))
        s->stop_ids[s->n_stop_ids++] = tok_bos(s->vocab);
    pthread_mutex_init(&s->inbox_mu, NULL);
    pthread_cond_init(&s->inbox_cv, NULL);
    pthread_mutex_init(&s->snap_mu, NULL);
    pthread_cond_init(&s->snap_cv, NULL);
    pthread_mutex_init(&s->metrics_mu, NULL);
    sched__init_metrics(&s->m);

    s->n_blocks = (uint32_t)n_blocks;
    s->n_wblocks = (uint32_t)n_wblocks;
    s->window = n_wblocks ? window : 0;
    s->block_bytes = block_bytes;
    s->wblock_bytes = wblock_bytes;
    kvpool_params kp = {(uint32_t)n_blocks, p.block_size, p.prefix_cache};
    int rc = kvpool_create(&kp, &s->pool);
    if (!rc && n_wblocks) {
        kvpool_params wp = {(uint32_t)n_wblocks, p.block_size, p.prefix_cache};
        rc = kvpool_create(&wp, &s->wpool);
    }
    if (!rc && n_wblocks)
        rc = engine_kv_create_split(model, p.kv_type, (uint32_t)n_blocks, (uint32_t)n_wblocks,
                                    p.block_size, &s->kv);
    else if (!rc)
        rc = engine_kv_create(model, p.kv_type, (uint32_t)n_blocks, p.block_size, &s->kv);
    if (!rc)
        rc = engine_ctx_create(model, p.max_batched_tokens, p.n_threads, &s->ctx);
    /* The trie for grammar masks: built once, a few ms for a 150k vocabulary. */
    if (!rc)
        rc = grammar_vocab_create(s->vocab, s->stop_ids, (size_t)s->n_stop_ids, &s->gvocab);
    if (!rc) {
        int32_t nt = grammar_vocab_n_tokens(s->gvocab);
        s->n_gtokens = (uint32_t)nt > s->n_vocab ? (int32_t)s->n_vocab : nt;
        s->gmask = malloc(grammar_mask_words(nt) * sizeof *s->gmask);
        if (!s->gmask)
            rc = KVS_ENOMEM;
    }
    if (rc) {
        sched_destroy(s);
        return rc;
    }
    size_t T = p.max_batched_tokens, S = p.max_num_seqs;
    s->logits = malloc((S + 1) * hp->n_vocab * sizeof(float));
    s->logits_rows = (uint32_t)S;
    /* Prompt logprobs: as many rows a step as 64 MiB of logits hold, 16 at least, within a
     * step's tokens (512 for a 32k vocabulary, 110 for 152k). */
    size_t plp = ((size_t)64 << 20) / ((size_t)hp->n_vocab * sizeof(float));
    s->plp_rows = (uint32_t)(plp < 16 ? 16 : plp > T ? T : plp);
    if (p.plp_rows)
        s->plp_rows = p.plp_rows;
    s->b_token = malloc(T * sizeof(int32_t));
    s->b_pos = malloc(T * sizeof(int32_t));
    s->b_seq = malloc(T * sizeof(int32_t));
    s->b_logits = malloc(T * sizeof(bool));
    s->b_hidden = calloc(T, sizeof(bool));
    s->n_embd = hp->n_embd;
    s->b_views = malloc(S * sizeof *s->b_views);
    s->b_seqs = malloc(S * sizeof *s->b_seqs);
    s->copies = malloc(2 * S * sizeof *s->copies);
    s->copy_group = malloc(2 * S * sizeof *s->copy_group);
    if (!s->logits || !s->b_token || !s->b_pos || !s->b_seq || !s->b_logits || !s->b_hidden ||
        !s->b_views || !s->b_seqs || !s->copies || !s->copy_group) {
        sched_destroy(s);
        return KVS_ENOMEM;
    }
    if (p.step_observer) {
        s->obs.n_blocks = s->n_blocks;
        s->obs.block_size = p.block_size;
        s->obs.state = malloc(s->n_blocks);
        s->obs.refs = malloc(s->n_blocks * sizeof *s->obs.refs);
        s->obs.owner = malloc(s->n_blocks * sizeof *s->obs.owner);
        s->obs.seqs = malloc(S * sizeof *s->obs.seqs);
        if (!s->obs.state || !s->obs.refs || !s->obs.owner || !s->obs.seqs) {
            sched_destroy(s);
            return KVS_ENOMEM;
        }
    }
    sched__update_gauges(s);
    if (pthread_create(&s->thread, NULL, sched__engine_main, s) != 0) {
        sched_destroy(s);
        return KVS_ENOMEM;
    }
    s->thread_started = true;
    log_info("scheduler: %llu KV blocks of %u tokens (%.1f MiB), context %u, up to %u "
             "sequences and %u tokens per step, %u compute threads",
             (unsigned long long)n_blocks, p.block_size,
             (double)(n_blocks * block_bytes) / (1024.0 * 1024.0), p.n_ctx, p.max_num_seqs,
             p.max_batched_tokens, p.n_threads);
    if (n_wblocks)
        log_info("scheduler: window reclaim: the global layers hold the blocks above, the "
                 "windowed layers (window %u) %llu blocks of their own (%.1f MiB)",
                 window, (unsigned long long)n_wblocks,
                 (double)(n_wblocks * wblock_bytes) / (1024.0 * 1024.0));
    *out = s;
    return 0;
}

uint32_t sched_n_ctx(const sched *s)
{
    return s->p.n_ctx;
}

void sched_destroy(sched *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->inbox_mu);
        s->stop = true;
        pthread_cond_signal(&s->inbox_cv);
        pthread_cond_broadcast(&s->snap_cv); /* a snapshot taker gives up */
        pthread_mutex_unlock(&s->inbox_mu);
        pthread_join(s->thread, NULL);
    }
    kvpool_destroy(s->pool);
    kvpool_destroy(s->wpool);
    engine_kv_destroy(s->kv);
    engine_ctx_destroy(s->ctx);
    grammar_vocab_destroy(s->gvocab);
    free(s->gmask);
    free(s->logits);
    free(s->b_token);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_logits);
    free(s->b_hidden);
    free(s->hidden);
    free(s->b_views);
    free(s->b_seqs);
    free(s->copies);
    free(s->copy_group);
    sched_kv_snapshot_free(&s->obs);
    pthread_mutex_destroy(&s->inbox_mu);
    pthread_cond_destroy(&s->inbox_cv);
    pthread_mutex_destroy(&s->snap_mu);
    pthread_cond_destroy(&s->snap_cv);
    pthread_mutex_destroy(&s->metrics_mu);
    free(s);
}

void sched_drain(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    s->draining = true;
    pthread_mutex_unlock(&s->inbox_mu);
}

void sched_abort_all(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    s->abort_all = true;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->inbox_mu);
}

uint32_t sched_n_unfinished(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    uint32_t n = s->n_unfinished;
    pthread_mutex_unlock(&s->inbox_mu);
    return n;
}
