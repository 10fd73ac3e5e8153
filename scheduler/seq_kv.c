/* A sequence's KV blocks across the layer groups. One group (one kvpool, one block table) for
 * models without windowed layers, or with the window reclaim off; two for a hybrid model
 * (gemma2/3: global and sliding-window layers): s->pool backs the global layers and s->wpool
 * the windowed ones, each sequence holding a table in each. After every step a sequence's
 * windowed blocks wholly before its window are released, so that group holds about one window
 * per sequence whatever the conversation's length; a prefix hit needs there only the window
 * that ends at it. Every table change of a sequence goes through here, so the groups never
 * disagree on its length. Engine thread only. */
#include "scheduler/sched_impl.h"

#include <stdlib.h>

#include "common/status.h"
#include "kvpool/kvpool.h"

int sched__kv_create(sched *s, seq *q)
{
    int rc = kvpool_seq_create(s->pool, &q->kv);
    if (!rc && s->wpool)
        rc = kvpool_seq_create(s->wpool, &q->wkv);
    if (rc)
        sched__kv_free(s, q);
    return rc;
}

void sched__kv_free(sched *s, seq *q)
{
    kvpool_seq_destroy(s->pool, q->kv);
    if (s->wpool)
        kvpool_seq_destroy(s->wpool, q->wkv);
    q->kv = q->wkv = NULL;
}

/* The first position the next row (n_computed) attends to in a windowed layer: everything
 * before it is never read again by this sequence. */
static uint32_t window_start(const sched *s, uint32_t n_computed)
{
    return n_computed + 1 > s->window ? n_computed + 1 - s->window : 0;
}

int sched__kv_match_prefix(sched *s, seq *q, uint32_t *covered_out)
{
    uint32_t n = q->n_tokens - 1;
    *covered_out = 0;
    if (!s->p.prefix_cache)
        return 0;
    if (!s->wpool) { /* a whole-prompt hit leaves only the last position to compute */
        *covered_out = kvpool_seq_match_prompt(s->pool, q->kv, q->tokens, q->n_tokens);
        return 0;
    }
    /* With windowed layers the hit stays whole blocks short of the last position: stepping it
     * back would move the window's start a position earlier than the probes checked. */
    /* The windowed group is small and soon evicts a long prompt's early blocks, but its layers
     * need only the window that ends at the hit: the global group's exact walk gives each
     * block's key, and the windowed group looks the window's blocks up by them, backwards
     * from the hit's end (as vLLM's hybrid allocator does). The hit is what both hold. */
    uint64_t *keys = malloc(sizeof(uint64_t) * ((size_t)n / s->p.block_size + 1));
    if (!keys)
        return 0; /* no hit: the prompt is computed instead */
    uint32_t g = kvpool_prefix_keys(s->pool, q->tokens, n, keys);
    n = kvpool_window_probe(s->wpool, q->tokens, g, s->window, keys);
    uint32_t covered = kvpool_seq_match_prefix(s->pool, q->kv, q->tokens, n);
    uint32_t wc =
        covered ? kvpool_seq_match_window(s->wpool, q->wkv, q->tokens, covered, s->window, keys)
                : 0;
    free(keys);
    if (wc != covered) {
        /* The probes leave nothing to change in between, so only a failed allocation in the
         * windowed match (its scratch, or the table's growth) gets here; start over empty
         * rather than run with tables of different lengths. */
        sched__kv_free(s, q);
        return sched__kv_create(s, q);
    }
    *covered_out = covered;
    return 0;
}

/* Windowed blocks a sequence can hold at once: its window, a chunk of up to
 * max_batched_tokens, the block kept as the next one's parent, a partial first block and a
 * copy-on-write. */
uint32_t sched__kv_window_blocks(const sched *s)
{
    uint32_t bs = s->p.block_size;
    return (s->window + s->p.max_batched_tokens + bs - 1) / bs + 3;
}

bool sched__kv_fits(const sched *s, const seq *q, uint32_t n_left)
{
    if (kvpool_seq_blocks_needed(s->pool, q->kv, n_left) > kvpool_available(s->pool))
        return false;
    if (!s->wpool)
        return true;
    uint32_t wneed = kvpool_seq_blocks_needed(s->wpool, q->wkv, n_left), cap;
    cap = sched__kv_window_blocks(s);
    return (wneed < cap ? wneed : cap) <= kvpool_available(s->wpool);
}

static int append_group(sched *s, kvpool *pool, kvpool_seq *kv, seq *q, uint32_t chunk, int group)
{
    kvpool_copy cp;
    int n_cp = 0;
    int rc = kvpool_seq_append(pool, kv, q->tokens + q->n_computed, chunk, &cp, &n_cp);
    if (rc == 0 && n_cp) {
        s->copies[s->n_copies] = cp;
        s->copy_group[s->n_copies++] = group;
    }
    return rc;
}

int sched__kv_reserve(sched *s, seq *q, uint32_t chunk)
{
    if (!s->wpool)
        return append_group(s, s->pool, q->kv, q, chunk, ENGINE_KV_GLOBAL);
    /* Both or neither: a shortage in either group is KVS_ENOSPC before anything changes. */
    if (kvpool_seq_blocks_needed(s->pool, q->kv, chunk) > kvpool_available(s->pool) ||
        kvpool_seq_blocks_needed(s->wpool, q->wkv, chunk) > kvpool_available(s->wpool))
        return KVS_ENOSPC;
    int rc = append_group(s, s->pool, q->kv, q, chunk, ENGINE_KV_GLOBAL);
    if (rc)
        return rc;
    rc = append_group(s, s->wpool, q->wkv, q, chunk, ENGINE_KV_WINDOWED);
    /* Only a failed table growth gets here (KVS_ENOMEM): the global table is a chunk ahead,
     * so the caller must drop the sequence's blocks (sched__kv_reserve's contract). */
    return rc ? KVS_EIO : 0;
}

void sched__kv_commit(sched *s, seq *q)
{
    kvpool_seq_commit(s->pool, q->kv, q->n_computed);
    if (s->wpool) {
        /* Anchored to the global table just committed, for later windowed matches. */
        kvpool_seq_commit_anchored(s->wpool, q->wkv, q->n_computed, s->pool, q->kv);
        kvpool_seq_release_before(s->wpool, q->wkv, window_start(s, q->n_computed));
    }
}

int sched__kv_fork(sched *s, const seq *q, seq *f)
{
    int rc = kvpool_seq_fork(s->pool, q->kv, &f->kv);
    if (!rc && s->wpool && (rc = kvpool_seq_fork(s->wpool, q->wkv, &f->wkv)) != 0) {
        kvpool_seq_destroy(s->pool, f->kv);
        f->kv = NULL;
    }
    return rc;
}

void sched__kv_view(const sched *s, const seq *q, engine_seq_view *v)
{
    v->blocks = kvpool_seq_blocks(q->kv, &v->n_blocks);
    v->wblocks = NULL;
    v->n_wblocks = 0;
    if (s->wpool)
        v->wblocks = kvpool_seq_blocks(q->wkv, &v->n_wblocks);
}
