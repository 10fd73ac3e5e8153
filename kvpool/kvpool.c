/* kvpool: block bookkeeping for the paged KV cache (see kvpool.h for the contract).
 * Invariants: every block is in exactly one state (used: refcount > 0; cached: refcount 0,
 * indexed, on the LRU list; free: refcount 0, unindexed, on the free list); an indexed block
 * is full, and every table holding it holds its indexed parent just before it (so children
 * leave the LRU before their parents); block fill is the same for every holder.
 * kvpool_seq_release_before relaxes two of them for the pools it is used on: a table's leading
 * released entries are -1, and an indexed block may be an orphan, its parent since evicted
 * (parent_gen no longer matches) or unindexed. A match from the root walks through parents
 * at their gen, so it never reaches an orphan; a windowed match (kvpool_seq_match_window)
 * does, through the anchor key that names the orphan's prefix exactly, and then a table may
 * hold an orphan after another block of the same prefix than its recorded parent. An orphan
 * without an anchor leaves the index when its last holder releases it; any when evicted. */
#include "kvpool/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* Tests may build this file with a tiny mask so that hash collisions are common and the
 * token/parent comparisons are exercised; production keeps all 64 bits. */
#ifndef KVPOOL_HASH_MASK
#define KVPOOL_HASH_MASK UINT64_MAX
#endif

#define KVPOOL_ROOT_HASH UINT64_C(0xcbf29ce484222325)

typedef struct kvpool_block {
    uint64_t hash;       /* chain hash, valid while indexed */
    uint32_t refcount;   /* block tables holding this block */
    uint32_t fill;       /* slots written; equal for every holder (shared partial blocks
                          * are copied before anyone writes to them) */
    uint32_t gen;        /* bumped whenever the block is taken for new data */
    uint32_t parent_gen; /* gen of parent when indexed: a reused parent never matches */
    int32_t parent;      /* indexed parent block, -1 for a sequence's first block */
    int32_t lprev;       /* free list or LRU links, -1 at the ends */
    int32_t lnext;
    int32_t hnext;   /* next block in the same index bucket, -1 at the end */
    uint64_t anchor; /* another pool's key for the same prefix (kvpool_seq_commit_anchored),
                      * 0 for none; valid while indexed */
    bool indexed;
} kvpool_block;

/* Intrusive doubly linked list over block ids (free list, LRU). */
typedef struct kvpool_list {
    int32_t head; /* oldest */
    int32_t tail; /* newest */
    uint32_t n;
} kvpool_list;

struct kvpool_seq {
    int32_t *blocks; /* block table */
    uint32_t n_blocks;
    uint32_t cap;
    uint32_t len;        /* reserved positions */
    uint32_t n_computed; /* positions holding K/V, <= len */
    uint32_t n_indexed;  /* leading blocks known to be in the prefix index */
    uint32_t n_released; /* leading entries released by kvpool_seq_release_before (-1) */
    kvpool_seq *prev;    /* the pool's list of live sequences (for kvpool_check) */
    kvpool_seq *next;
};

struct kvpool {
    uint32_t n_blocks;
    uint32_t block_size;
    bool prefix_cache;
    kvpool_block *blk;  /* [n_blocks] */
    int32_t *tokens;    /* [n_blocks * block_size] token id held by each slot */
    int32_t *buckets;   /* [n_buckets] head of each index chain, -1 when empty */
    uint32_t n_buckets; /* power of two >= n_blocks */
    kvpool_list free_list;
    kvpool_list lru; /* cached blocks, least recently released at the head */
    uint32_t n_used;
    uint32_t n_indexed;
    kvpool_seq *seqs;
    uint32_t n_seqs;
    /* A table released entries (kvpool_seq_release_before, or kvpool_seq_match_window's
     * placeholders): orphans may exist (see the top). */
    bool released_any;
    kvpool_stats st; /* counters and sums kept incrementally; block counts filled on read */
};

/* --- lists --- */

static void list_init(kvpool_list *l)
{
    l->head = l->tail = -1;
    l->n = 0;
}

static void list_push_tail(kvpool *pool, kvpool_list *l, int32_t b)
{
    kvpool_block *k = &pool->blk[b];
    k->lprev = l->tail;
    k->lnext = -1;
    if (l->tail >= 0)
        pool->blk[l->tail].lnext = b;
    else
        l->head = b;
    l->tail = b;
    l->n++;
}

static void list_remove(kvpool *pool, kvpool_list *l, int32_t b)
{
    kvpool_block *k = &pool->blk[b];
    if (k->lprev >= 0)
        pool->blk[k->lprev].lnext = k->lnext;
    else
        l->head = k->lnext;
    if (k->lnext >= 0)
        pool->blk[k->lnext].lprev = k->lprev;
    else
        l->tail = k->lprev;
    k->lprev = k->lnext = -1;
    l->n--;
}

/* --- prefix index --- */

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finalizer: every input bit reaches every output bit. */
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

static uint64_t chain_hash(uint64_t parent_hash, const int32_t *tok, uint32_t n)
{
    uint64_t h = mix64(parent_hash ^ UINT64_C(0x9e3779b97f4a7c15));
    for (uint32_t i = 0; i < n; i++)
        h = mix64(h ^ (uint64_t)(uint32_t)tok[i]);
    return h & (uint64_t)KVPOOL_HASH_MASK;
}

static const int32_t *block_tokens(const kvpool *pool, int32_t b)
{
    return pool->tokens + (size_t)b * pool->block_size;
}

static int32_t *block_tokens_mut(kvpool *pool, int32_t b)
{
    return pool->tokens + (size_t)b * pool->block_size;
}

static uint32_t bucket_of(const kvpool *pool, uint64_t h)
{
    return (uint32_t)(mix64(h) & (pool->n_buckets - 1));
}

/* The indexed block holding exactly tok[0..block_size) after parent (at its current gen), or
 * -1. The hash only narrows the search: tokens and parent are compared, so no collision can
 * alias two different prefixes. */
static int32_t index_find(const kvpool *pool, uint64_t h, int32_t parent, const int32_t *tok)
{
    uint32_t pgen = parent >= 0 ? pool->blk[parent].gen : 0;
    for (int32_t b = pool->buckets[bucket_of(pool, h)]; b >= 0; b = pool->blk[b].hnext) {
        const kvpool_block *k = &pool->blk[b];
        if (k->hash == h && k->parent == parent && k->parent_gen == pgen &&
            memcmp(block_tokens(pool, b), tok, sizeof(int32_t) * pool->block_size) == 0)
            return b;
    }
    return -1;
}

static void index_insert(kvpool *pool, int32_t b, uint64_t h, int32_t parent)
{
    kvpool_block *k = &pool->blk[b];
    uint32_t bi = bucket_of(pool, h);
    k->hash = h;
    k->parent = parent;
    k->parent_gen = parent >= 0 ? pool->blk[parent].gen : 0;
    k->indexed = true;
    k->hnext = pool->buckets[bi];
    pool->buckets[bi] = b;
    pool->n_indexed++;
}

static void index_remove(kvpool *pool, int32_t b)
{
    kvpool_block *k = &pool->blk[b];
    int32_t *link = &pool->buckets[bucket_of(pool, k->hash)];
    while (*link != b)
        link = &pool->blk[*link].hnext;
    *link = k->hnext;
    k->hnext = -1;
    k->indexed = false;
    pool->n_indexed--;
}

/* --- blocks --- */

/* Takes a block for new data: a free one if any, else evicts the least recently released
 * cached block, so cached prefixes survive until the pool actually needs their space. The
 * caller has checked availability. */
static int32_t block_take(kvpool *pool)
{
    int32_t b = pool->free_list.head;
    if (b >= 0) {
        list_remove(pool, &pool->free_list, b);
    } else {
        b = pool->lru.head;
        list_remove(pool, &pool->lru, b);
        index_remove(pool, b);
        pool->st.evictions++;
    }
    kvpool_block *k = &pool->blk[b];
    k->refcount = 1;
    k->fill = 0;
    k->gen++;
    k->parent = -1;
    k->parent_gen = 0;
    k->anchor = 0;
    pool->n_used++;
    pool->st.slots_waste += pool->block_size;
    return b;
}

static void block_ref(kvpool *pool, int32_t b)
{
    kvpool_block *k = &pool->blk[b];
    if (k->refcount++ == 0) {
        /* Only indexed (hence full, zero-waste) blocks are found with refcount 0. */
        list_remove(pool, &pool->lru, b);
        pool->n_used++;
    }
}

/* An indexed block whose parent was evicted (or unindexed) since it was indexed: no walk from
 * the root reaches it any more, only an anchored match (kvpool_seq_match_window) through its
 * own anchor or a child's. Only release_before's partial tables let a parent go first. */
static bool block_orphaned(const kvpool *pool, const kvpool_block *k)
{
    if (k->parent < 0)
        return false;
    const kvpool_block *p = &pool->blk[k->parent];
    return !p->indexed || p->gen != k->parent_gen;
}

static void block_unref(kvpool *pool, int32_t b)
{
    kvpool_block *k = &pool->blk[b];
    if (--k->refcount > 0)
        return;
    pool->n_used--;
    pool->st.slots_waste -= pool->block_size - k->fill;
    /* An orphan without an anchor is unreachable: caching it would only hold a dead entry. One
     * with an anchor is what a windowed match looks for, so it stays cached. */
    if (k->indexed && k->anchor == 0 && block_orphaned(pool, k))
        index_remove(pool, b);
    if (k->indexed)
        list_push_tail(pool, &pool->lru, b);
    else
        list_push_tail(pool, &pool->free_list, b);
}

/* --- sequences --- */

/* Grows the block table geometrically so appends cost amortized O(1). */
static int seq_reserve(kvpool_seq *seq, uint32_t want)
{
    if (want <= seq->cap)
        return 0;
    uint32_t cap = seq->cap ? seq->cap : 4;
    while (cap < want)
        cap = cap > UINT32_MAX / 2 ? want : cap * 2;
    int32_t *nb = realloc(seq->blocks, sizeof(int32_t) * cap);
    if (!nb)
        return KVS_ENOMEM;
    seq->blocks = nb;
    seq->cap = cap;
    return 0;
}

static int seq_new(kvpool *pool, kvpool_seq **out)
{
    kvpool_seq *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->next = pool->seqs;
    if (pool->seqs)
        pool->seqs->prev = s;
    pool->seqs = s;
    pool->n_seqs++;
    *out = s;
    return 0;
}

static void seq_unlink(kvpool *pool, kvpool_seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        pool->seqs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pool->n_seqs--;
}

static uint32_t div_up(uint32_t a, uint32_t b)
{
    return a / b + (a % b != 0);
}

/* --- public API --- */

int kvpool_create(const kvpool_params *p, kvpool **out)
{
    if (!out)
        return KVS_EINVAL;
    *out = NULL;
    /* Slot ids (block * block_size + offset) must fit in int32 for the engine. */
    if (!p || p->n_blocks == 0 || p->block_size == 0 ||
        (uint64_t)p->n_blocks * p->block_size > INT32_MAX)
        return KVS_EINVAL;
    kvpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return KVS_ENOMEM;
    pool->n_blocks = p->n_blocks;
    pool->block_size = p->block_size;
    pool->prefix_cache = p->prefix_cache;
    pool->n_buckets = 1;
    while (pool->n_buckets < p->n_blocks)
        pool->n_buckets *= 2;
    pool->blk = calloc(p->n_blocks, sizeof *pool->blk);
    pool->tokens = calloc((size_t)p->n_blocks * p->block_size, sizeof(int32_t));
    pool->buckets = malloc(sizeof(int32_t) * pool->n_buckets);
    if (!pool->blk || !pool->tokens || !pool->buckets) {
        kvpool_destroy(pool);
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < pool->n_buckets; i++)
        pool->buckets[i] = -1;
    list_init(&pool->free_list);
    list_init(&pool->lru);
    for (uint32_t i = 0; i < p->n_blocks; i++) {
        pool->blk[i].parent = -1;
        pool->blk[i].hnext = -1;
        list_push_tail(pool, &pool->free_list, (int32_t)i);
    }
    *out = pool;
    return 0;
}

void kvpool_destroy(kvpool *pool)
{
    if (!pool)
        return;
    /* Contract says sequences go first; free stragglers anyway rather than leak them. */
    while (pool->seqs) {
        kvpool_seq *s = pool->seqs;
        pool->seqs = s->next;
        free(s->blocks);
        free(s);
    }
    free(pool->blk);
    free(pool->tokens);
    free(pool->buckets);
    free(pool);
}

uint32_t kvpool_block_size(const kvpool *pool)
{
    return pool->block_size;
}

void kvpool_get_stats(const kvpool *pool, kvpool_stats *st)
{
    *st = pool->st;
    st->blocks_total = pool->n_blocks;
    st->blocks_used = pool->n_used;
    st->blocks_cached = pool->lru.n;
    st->blocks_free = pool->free_list.n;
}

uint32_t kvpool_available(const kvpool *pool)
{
    return pool->free_list.n + pool->lru.n;
}

int kvpool_seq_create(kvpool *pool, kvpool_seq **out)
{
    if (!pool || !out)
        return KVS_EINVAL;
    *out = NULL;
    return seq_new(pool, out);
}

void kvpool_seq_destroy(kvpool *pool, kvpool_seq *seq)
{
    if (!seq)
        return;
    /* Last block first: a child then always sits in the LRU ahead of its parent, so it is
     * evicted before the parent and an indexed block's parent stays indexed. */
    for (uint32_t i = seq->n_blocks; i-- > seq->n_released;)
        block_unref(pool, seq->blocks[i]);
    pool->st.tokens_stored -= seq->len - seq->n_released * pool->block_size;
    seq_unlink(pool, seq);
    free(seq->blocks);
    free(seq);
}

int kvpool_seq_fork(kvpool *pool, const kvpool_seq *src, kvpool_seq **out)
{
    if (!pool || !src || !out)
        return KVS_EINVAL;
    *out = NULL;
    kvpool_seq *s;
    int rc = seq_new(pool, &s);
    if (rc)
        return rc;
    if (seq_reserve(s, src->n_blocks) != 0) {
        seq_unlink(pool, s);
        free(s);
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < src->n_blocks; i++) {
        s->blocks[i] = src->blocks[i];
        if (i >= src->n_released)
            block_ref(pool, src->blocks[i]);
    }
    s->n_blocks = src->n_blocks;
    s->len = src->len;
    s->n_computed = src->n_computed;
    s->n_indexed = src->n_indexed;
    s->n_released = src->n_released;
    pool->st.tokens_stored += s->len - s->n_released * pool->block_size;
    *out = s;
    return 0;
}

uint32_t kvpool_seq_match_prefix(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n)
{
    if (!pool->prefix_cache || seq->len != 0 || !tokens)
        return 0;
    uint32_t bs = pool->block_size;
    uint32_t want = n / bs;
    pool->st.prefix_queries += want;
    uint64_t h = KVPOOL_ROOT_HASH;
    int32_t parent = -1;
    uint32_t got = 0;
    while (got < want) {
        const int32_t *tok = tokens + (size_t)got * bs;
        uint64_t hh = chain_hash(h, tok, bs);
        int32_t b = index_find(pool, hh, parent, tok);
        /* A table that cannot grow just ends the match early: a shorter hit is still valid. */
        if (b < 0 || seq_reserve(seq, got + 1) != 0)
            break;
        block_ref(pool, b);
        seq->blocks[got++] = b;
        h = hh;
        parent = b;
    }
    seq->n_blocks = got;
    seq->len = seq->n_computed = got * bs;
    seq->n_indexed = got;
    pool->st.prefix_hits += got;
    pool->st.tokens_stored += seq->len;
    return seq->len;
}

uint32_t kvpool_seq_match_prompt(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n)
{
    if (n == 0 || pool->block_size == 1) /* one-token blocks: leave the last block unmatched */
        return kvpool_seq_match_prefix(pool, seq, tokens, n ? n - 1 : 0);
    uint32_t got = kvpool_seq_match_prefix(pool, seq, tokens, n);
    if (got < n)
        return got;
    /* The whole prompt hit. Its last position is computed again for the logits the caller
     * wants: the hit's last block stays in the table (referenced, so never evicted meanwhile),
     * one position short, and the next append writes that position into a copy of it. */
    seq->len--;
    seq->n_computed--;
    seq->n_indexed--;
    pool->st.tokens_stored--;
    return seq->len;
}

/* What block b holds now: its id and the gen it was taken at. A block keeps its tokens, position
 * and prefix from one take to the next, so equal keys mean the same prefix. */
static uint64_t block_key(const kvpool *pool, int32_t b)
{
    return (uint64_t)pool->blk[b].gen << 32 | (uint32_t)b;
}

uint32_t kvpool_prefix_keys(const kvpool *pool, const int32_t *tokens, uint32_t n, uint64_t *keys)
{
    if (!pool->prefix_cache || !tokens)
        return 0;
    uint32_t bs = pool->block_size, want = n / bs, got = 0;
    uint64_t h = KVPOOL_ROOT_HASH;
    int32_t parent = -1;
    while (got < want) {
        const int32_t *tok = tokens + (size_t)got * bs;
        uint64_t hh = chain_hash(h, tok, bs);
        int32_t b = index_find(pool, hh, parent, tok);
        if (b < 0)
            break;
        if (keys)
            keys[got] = block_key(pool, b);
        got++;
        h = hh;
        parent = b;
    }
    return got * bs;
}

uint32_t kvpool_prefix_probe(const kvpool *pool, const int32_t *tokens, uint32_t n)
{
    return kvpool_prefix_keys(pool, tokens, n, NULL);
}

/* --- windowed matches: backwards from the hit's end --- */

/* The indexed block holding tok[0..block_size) at the end of the prefix the anchor key names
 * (hash h), whatever its parent, or -1. The anchor is the exact check: it names one block of
 * another pool at one gen, which holds one prefix, so two different prefixes can never meet
 * here even when their chain hashes collide; the hash only picks the bucket. */
static int32_t anchor_find(const kvpool *pool, uint64_t h, const int32_t *tok, uint64_t key)
{
    if (key == 0)
        return -1;
    for (int32_t b = pool->buckets[bucket_of(pool, h)]; b >= 0; b = pool->blk[b].hnext) {
        const kvpool_block *k = &pool->blk[b];
        if (k->anchor == key && k->hash == h &&
            memcmp(block_tokens(pool, b), tok, sizeof(int32_t) * pool->block_size) == 0)
            return b;
    }
    return -1;
}

/* The first block a hit of e blocks needs: the one holding position e * bs + 1 - window, the
 * first the next row (position e * bs) reads; and always at least the last block, which the
 * next block to be indexed names as parent (as kvpool_seq_release_before keeps it). */
static uint32_t window_first(uint32_t bs, uint32_t window, uint32_t e)
{
    uint64_t end = (uint64_t)e * bs;
    uint32_t lo = end + 1 > window ? (uint32_t)((end + 1 - window) / bs) : 0;
    return lo < e ? lo : e - 1;
}

/* The longest hit of e <= n / bs blocks whose blocks [window_first(e), e) are all cached for
 * these tokens: their ids go to found[], and e is returned (0 for none). Walks down from the
 * end: the last block by its anchor, each earlier one as its successor's parent while that
 * parent is still indexed at the same gen (exact: the chain links it), else by its own anchor.
 * A block found neither way fails every hit that needs it, i.e. every longer one (the window's
 * first block only moves forward with e), so the search goes on with the hits that end before
 * it: each block is looked at about once. h[] gets the chain hashes. */
static uint32_t window_search(const kvpool *pool, const int32_t *tokens, uint32_t n,
                              uint32_t window, const uint64_t *keys, uint64_t *h, int32_t *found)
{
    uint32_t bs = pool->block_size, want = n / bs;
    uint64_t ph = KVPOOL_ROOT_HASH;
    for (uint32_t i = 0; i < want; i++)
        ph = h[i] = chain_hash(ph, tokens + (size_t)i * bs, bs);
    uint32_t e = want;
    while (e > 0) {
        uint32_t lo = window_first(bs, window, e), i = e - 1;
        int32_t b = anchor_find(pool, h[i], tokens + (size_t)i * bs, keys[i]);
        if (b < 0) {
            e = i;
            continue;
        }
        found[i] = b;
        while (i > lo) {
            const int32_t *tok = tokens + (size_t)(i - 1) * bs;
            const kvpool_block *k = &pool->blk[b];
            int32_t p = k->parent;
            if (p < 0 || !pool->blk[p].indexed || pool->blk[p].gen != k->parent_gen ||
                memcmp(block_tokens(pool, p), tok, sizeof(int32_t) * bs) != 0)
                p = anchor_find(pool, h[i - 1], tok, keys[i - 1]);
            if (p < 0)
                break;
            found[--i] = b = p;
        }
        if (i == lo)
            return e;
        e = i - 1; /* block i - 1 is gone: only hits ending before it can stand */
    }
    return 0;
}

/* Scratch for window_search, NULL on failure (a match then just finds nothing). */
static void *window_scratch(uint32_t want, uint64_t **h, int32_t **found)
{
    void *m = malloc(((size_t)want + 1) * (sizeof(uint64_t) + sizeof(int32_t)));
    if (m) {
        *h = m;
        *found = (int32_t *)(*h + want + 1);
    }
    return m;
}

uint32_t kvpool_window_probe(const kvpool *pool, const int32_t *tokens, uint32_t n, uint32_t window,
                             const uint64_t *keys)
{
    if (!pool->prefix_cache || !tokens || !keys || window == 0 || n < pool->block_size)
        return 0;
    uint64_t *h;
    int32_t *found;
    void *m = window_scratch(n / pool->block_size, &h, &found);
    if (!m)
        return 0;
    uint32_t e = window_search(pool, tokens, n, window, keys, h, found);
    free(m);
    return e * pool->block_size;
}

uint32_t kvpool_seq_match_window(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n,
                                 uint32_t window, const uint64_t *keys)
{
    if (!pool->prefix_cache || seq->len != 0 || !tokens || !keys || window == 0)
        return 0;
    uint32_t bs = pool->block_size, want = n / bs;
    pool->st.prefix_queries += want;
    if (want == 0)
        return 0;
    uint64_t *h;
    int32_t *found;
    void *m = window_scratch(want, &h, &found);
    if (!m)
        return 0;
    uint32_t e = window_search(pool, tokens, n, window, keys, h, found);
    if (e == 0 || seq_reserve(seq, e) != 0) {
        free(m);
        return 0;
    }
    uint32_t lo = window_first(bs, window, e);
    for (uint32_t i = 0; i < e; i++) {
        seq->blocks[i] = i < lo ? -1 : found[i];
        if (i >= lo)
            block_ref(pool, found[i]);
    }
    free(m);
    seq->n_blocks = seq->n_indexed = e;
    seq->len = seq->n_computed = e * bs;
    seq->n_released = lo;
    if (lo)
        pool->released_any = true;
    pool->st.prefix_hits += e;
    pool->st.tokens_stored += (uint64_t)(e - lo) * bs;
    return seq->len;
}

uint32_t kvpool_seq_release_before(kvpool *pool, kvpool_seq *seq, uint32_t pos)
{
    uint32_t bs = pool->block_size, end = pos / bs, n = 0;
    /* The last block stays (appends and copy-on-write work on it). With the prefix index the
     * last indexed block stays too: the next block to be indexed names it as its parent. */
    if (end + 1 > seq->n_blocks)
        end = seq->n_blocks ? seq->n_blocks - 1 : 0;
    if (pool->prefix_cache && end + 1 > seq->n_indexed)
        end = seq->n_indexed ? seq->n_indexed - 1 : 0;
    if (end > seq->n_computed / bs)
        end = seq->n_computed / bs; /* never a block whose K/V are still to be written */
    for (uint32_t i = seq->n_released; i < end; i++) {
        block_unref(pool, seq->blocks[i]);
        seq->blocks[i] = -1;
        n++;
    }
    if (n) {
        seq->n_released = end;
        pool->st.tokens_stored -= (uint64_t)n * bs;
        pool->released_any = true;
    }
    return n;
}

uint32_t kvpool_seq_n_released(const kvpool_seq *seq)
{
    return seq->n_released;
}

/* Whether writing to the last block needs a copy: it is partly ours and someone else's too,
 * shared with a fork sibling or indexed (a whole-prompt hit stepped back by
 * kvpool_seq_match_prompt), whose tokens and K/V later matches read as they are. */
static bool seq_needs_cow(const kvpool *pool, const kvpool_seq *seq)
{
    if (seq->len % pool->block_size == 0)
        return false;
    const kvpool_block *k = &pool->blk[seq->blocks[seq->n_blocks - 1]];
    return k->refcount > 1 || k->indexed;
}

uint32_t kvpool_seq_blocks_needed(const kvpool *pool, const kvpool_seq *seq, uint32_t n)
{
    if (n == 0)
        return 0;
    uint64_t new_len = (uint64_t)seq->len + n;
    uint64_t blocks = new_len / pool->block_size + (new_len % pool->block_size != 0);
    uint64_t need = blocks - seq->n_blocks + (seq_needs_cow(pool, seq) ? 1 : 0);
    return need > UINT32_MAX ? UINT32_MAX : (uint32_t)need;
}

int kvpool_seq_append(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n,
                      kvpool_copy *copy, int *n_copy)
{
    if (n_copy)
        *n_copy = 0;
    if (!pool || !seq || (n > 0 && !tokens))
        return KVS_EINVAL;
    if (n == 0)
        return 0;
    uint32_t bs = pool->block_size;
    if ((uint64_t)seq->len + n > UINT32_MAX)
        return KVS_ERANGE;
    uint32_t need = kvpool_seq_blocks_needed(pool, seq, n);
    if (need > kvpool_available(pool))
        return KVS_ENOSPC;
    bool cow = seq_needs_cow(pool, seq);
    if (cow && (!copy || !n_copy))
        return KVS_EINVAL; /* the caller could not learn about the copy it must make */
    /* Grow the table before touching any block so ENOMEM also leaves everything unchanged. */
    if (seq_reserve(seq, div_up(seq->len + n, bs)) != 0)
        return KVS_ENOMEM;

    if (cow) {
        int32_t src = seq->blocks[seq->n_blocks - 1];
        int32_t dst = block_take(pool);
        uint32_t f = seq->len % bs; /* ours: a stepped-back hit holds one less than the block */
        memcpy(block_tokens_mut(pool, dst), block_tokens(pool, src), sizeof(int32_t) * f);
        pool->blk[dst].fill = f;
        pool->st.slots_waste -= f;
        block_unref(pool, src); /* a fork sibling still holds it, or it is cached again */
        seq->blocks[seq->n_blocks - 1] = dst;
        copy->src = src;
        copy->dst = dst;
        *n_copy = 1;
    }
    uint32_t done = 0;
    while (done < n) {
        uint32_t off = seq->len % bs;
        if (off == 0)
            seq->blocks[seq->n_blocks++] = block_take(pool);
        int32_t b = seq->blocks[seq->n_blocks - 1];
        uint32_t k = bs - off < n - done ? bs - off : n - done;
        memcpy(block_tokens_mut(pool, b) + off, tokens + done, sizeof(int32_t) * k);
        pool->blk[b].fill = off + k;
        pool->st.slots_waste -= k;
        seq->len += k;
        done += k;
    }
    pool->st.tokens_stored += n;
    return 0;
}

void kvpool_seq_commit(kvpool *pool, kvpool_seq *seq, uint32_t n_computed)
{
    kvpool_seq_commit_anchored(pool, seq, n_computed, NULL, NULL);
}

/* The anchor for block i of seq: the key of block i of aseq, once aseq has computed it. */
static uint64_t anchor_of(const kvpool *apool, const kvpool_seq *aseq, uint32_t i)
{
    if (!apool || !aseq || i >= aseq->n_blocks || aseq->blocks[i] < 0 ||
        (uint64_t)(i + 1) * apool->block_size > aseq->n_computed)
        return 0;
    return block_key(apool, aseq->blocks[i]);
}

/* Whether the block anchor key names in apool was taken for new data since: the key can never
 * match again. */
static bool anchor_retaken(const kvpool *apool, uint64_t key)
{
    uint32_t b = (uint32_t)key;
    return b >= apool->n_blocks || apool->blk[b].gen != (uint32_t)(key >> 32);
}

void kvpool_seq_commit_anchored(kvpool *pool, kvpool_seq *seq, uint32_t n_computed,
                                const kvpool *apool, const kvpool_seq *aseq)
{
    if (n_computed > seq->len)
        n_computed = seq->len;
    if (n_computed > seq->n_computed)
        seq->n_computed = n_computed;
    if (!pool->prefix_cache)
        return;
    uint32_t bs = pool->block_size, end = seq->n_computed / bs;
    /* Index in table order: a child is findable only through its parent. */
    for (uint32_t i = seq->n_indexed; i < end; i++) {
        int32_t b = seq->blocks[i];
        if (!pool->blk[b].indexed) {
            int32_t parent = i > 0 ? seq->blocks[i - 1] : -1;
            uint64_t ph = parent >= 0 ? pool->blk[parent].hash : KVPOOL_ROOT_HASH;
            const int32_t *tok = block_tokens(pool, b);
            uint64_t h = chain_hash(ph, tok, bs);
            int32_t same = index_find(pool, h, parent, tok);
            if (same < 0) {
                index_insert(pool, b, h, parent);
                pool->blk[b].anchor = anchor_of(apool, aseq, i);
            } else if (pool->blk[b].refcount == 1) {
                /* Another sequence computed and indexed this very prefix first (both
                 * prefilled it at once). Switch to the indexed block so our later blocks
                 * chain from it and become findable too; ours returns to the pool. */
                block_ref(pool, same);
                block_unref(pool, b);
                seq->blocks[i] = same;
            } else {
                /* Shared with a fork sibling: switching only our table would give our
                 * later blocks a parent the sibling lacks. Retry on a later commit (the
                 * sibling may have switched or gone by then). */
                break;
            }
        }
        /* A block indexed without an anchor (by kvpool_seq_commit, or matched from the root),
         * or with one whose global block was retaken since (the global group evicted this
         * prefix and computed it again under a new key, while this group kept its block),
         * takes ours: it holds our prefix at position i, so our anchor names it exactly. */
        kvpool_block *k = &pool->blk[seq->blocks[i]];
        uint64_t a = anchor_of(apool, aseq, i);
        if (a && (k->anchor == 0 || anchor_retaken(apool, k->anchor)))
            k->anchor = a;
        seq->n_indexed = i + 1;
    }
}

uint32_t kvpool_seq_len(const kvpool_seq *seq)
{
    return seq->len;
}

uint32_t kvpool_seq_n_computed(const kvpool_seq *seq)
{
    return seq->n_computed;
}

const int32_t *kvpool_seq_blocks(const kvpool_seq *seq, uint32_t *n_blocks)
{
    if (n_blocks)
        *n_blocks = seq->n_blocks;
    return seq->blocks;
}

/* --- invariant check (tests): scans everything --- */

static int check_list(const kvpool *pool, const kvpool_list *l, bool want_indexed, uint8_t *seen)
{
    uint32_t count = 0;
    int32_t prev = -1;
    for (int32_t b = l->head; b >= 0; b = pool->blk[b].lnext) {
        if ((uint32_t)b >= pool->n_blocks || seen[b] || count >= pool->n_blocks)
            return KVS_EINVAL;
        seen[b] = 1;
        const kvpool_block *k = &pool->blk[b];
        if (k->lprev != prev || k->refcount != 0 || k->indexed != want_indexed)
            return KVS_EINVAL;
        prev = b;
        count++;
    }
    if (prev != l->tail || count != l->n)
        return KVS_EINVAL;
    return 0;
}

static int check_all(const kvpool *pool, uint32_t *refs, uint8_t *seen)
{
    uint32_t bs = pool->block_size, nb = pool->n_blocks;
    if (check_list(pool, &pool->free_list, false, seen) || check_list(pool, &pool->lru, true, seen))
        return KVS_EINVAL;

    /* Block tables: shapes, per-holder fill, and parent links of indexed blocks. */
    uint64_t tokens = 0;
    uint32_t n_seqs = 0;
    for (const kvpool_seq *s = pool->seqs; s; s = s->next) {
        if (++n_seqs > pool->n_seqs || s->n_computed > s->len ||
            s->n_blocks != div_up(s->len, bs) || s->n_blocks > s->cap ||
            s->n_indexed > s->n_computed / bs)
            return KVS_EINVAL;
        if (s->next && s->next->prev != s)
            return KVS_EINVAL;
        if (s->n_released > 0 && (!pool->released_any || s->n_released >= s->n_blocks))
            return KVS_EINVAL; /* the last block is never released */
        tokens += s->len - (uint64_t)s->n_released * bs;
        for (uint32_t i = 0; i < s->n_blocks; i++) {
            int32_t b = s->blocks[i];
            if (i < s->n_released) {
                if (b != -1)
                    return KVS_EINVAL;
                continue;
            }
            if (b < 0 || (uint32_t)b >= nb)
                return KVS_EINVAL;
            refs[b]++;
            uint32_t fill = s->len - i * bs < bs ? s->len - i * bs : bs;
            const kvpool_block *k = &pool->blk[b];
            /* a stepped-back whole-prompt hit (kvpool_seq_match_prompt) holds its last block,
             * full and indexed, one position short until its next append copies it */
            bool stepped = i + 1 == s->n_blocks && i == s->n_indexed && k->indexed &&
                           fill + 1 == bs && s->n_computed == s->len;
            if (k->fill != fill && !stepped)
                return KVS_EINVAL;
            /* After released entries the parent is no longer in this table; an orphan
             * attached by an anchored match follows another block of the same prefix. */
            if (k->indexed && i > s->n_released && k->parent != s->blocks[i - 1] &&
                !block_orphaned(pool, k))
                return KVS_EINVAL;
            if (k->indexed && i == 0 && k->parent != -1)
                return KVS_EINVAL;
            if (i < s->n_indexed && !k->indexed)
                return KVS_EINVAL;
        }
    }
    if (n_seqs != pool->n_seqs || tokens != pool->st.tokens_stored)
        return KVS_EINVAL;

    /* Refcounts and states. */
    uint32_t used = 0, indexed = 0;
    uint64_t waste = 0;
    for (uint32_t b = 0; b < nb; b++) {
        const kvpool_block *k = &pool->blk[b];
        if (k->refcount != refs[b])
            return KVS_EINVAL;
        if (k->refcount > 0) {
            if (seen[b])
                return KVS_EINVAL; /* used block on the free list or LRU */
            used++;
            waste += bs - k->fill;
        } else if (!seen[b]) {
            return KVS_EINVAL; /* unreferenced block on no list: leaked */
        }
        if (k->indexed) {
            indexed++;
            if (k->fill != bs)
                return KVS_EINVAL;
            uint64_t ph = KVPOOL_ROOT_HASH;
            if (k->parent >= 0 && pool->released_any && block_orphaned(pool, k)) {
                if ((uint32_t)k->parent >= nb)
                    return KVS_EINVAL;
                continue; /* unreachable; its chain hash cannot be recomputed */
            }
            if (k->parent >= 0) {
                const kvpool_block *p = &pool->blk[k->parent];
                if ((uint32_t)k->parent >= nb || !p->indexed || p->gen != k->parent_gen)
                    return KVS_EINVAL;
                ph = p->hash;
            }
            if (chain_hash(ph, block_tokens(pool, (int32_t)b), bs) != k->hash)
                return KVS_EINVAL;
        }
    }
    if (used != pool->n_used || indexed != pool->n_indexed || waste != pool->st.slots_waste ||
        used + pool->lru.n + pool->free_list.n != nb)
        return KVS_EINVAL;

    /* Index: every chain entry sits in its bucket, is indexed, and is unique by content. */
    uint32_t in_chains = 0;
    for (uint32_t i = 0; i < pool->n_buckets; i++) {
        for (int32_t b = pool->buckets[i]; b >= 0; b = pool->blk[b].hnext) {
            const kvpool_block *k = &pool->blk[b];
            if ((uint32_t)b >= nb || ++in_chains > indexed || !k->indexed ||
                bucket_of(pool, k->hash) != i)
                return KVS_EINVAL;
            for (int32_t c = k->hnext; c >= 0; c = pool->blk[c].hnext) {
                const kvpool_block *q = &pool->blk[c];
                if (q->hash == k->hash && q->parent == k->parent &&
                    q->parent_gen == k->parent_gen &&
                    memcmp(block_tokens(pool, b), block_tokens(pool, c), sizeof(int32_t) * bs) == 0)
                    return KVS_EINVAL;
            }
        }
    }
    if (in_chains != indexed)
        return KVS_EINVAL;
    return 0;
}

uint32_t kvpool_block_states(const kvpool *pool, uint32_t first, uint32_t n, uint8_t *state,
                             uint16_t *refs)
{
    if (first >= pool->n_blocks)
        return 0;
    if (n > pool->n_blocks - first)
        n = pool->n_blocks - first;
    for (uint32_t i = 0; i < n; i++) {
        const kvpool_block *b = &pool->blk[first + i];
        if (state)
            state[i] = b->refcount ? 2 : b->indexed ? 1 : 0;
        if (refs)
            refs[i] = b->refcount > 65535 ? 65535 : (uint16_t)b->refcount;
    }
    return n;
}

int kvpool_check(const kvpool *pool)
{
    if (!pool)
        return KVS_EINVAL;
    uint32_t *refs = calloc(pool->n_blocks, sizeof *refs);
    uint8_t *seen = calloc(pool->n_blocks, 1);
    int rc = refs && seen ? check_all(pool, refs, seen) : KVS_ENOMEM;
    free(refs);
    free(seen);
    return rc;
}
