/* kvpool: block bookkeeping through the public header. A shadow KV arena (one token id per
 * slot) plays the engine: it performs the copies kvpool reports and writes each appended
 * token to its slot, so a wrong share, copy or prefix hit shows up as wrong arena content. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h> /* after the headers it needs */

#include "common/status.h"
#include "kvpool/kvpool.h"

typedef struct harness {
    kvpool *pool;
    uint32_t bs;
    uint32_t nb;
    int32_t *arena; /* [nb * bs] token id each slot holds */
} harness;

typedef struct tseq {
    kvpool_seq *s;
    int32_t *tok; /* what the sequence should read back at each position */
    uint32_t len;
    uint32_t cap;
} tseq;

static void h_init(harness *h, uint32_t nb, uint32_t bs, bool prefix)
{
    kvpool_params p = {.n_blocks = nb, .block_size = bs, .prefix_cache = prefix};
    assert_int_equal(kvpool_create(&p, &h->pool), 0);
    h->bs = bs;
    h->nb = nb;
    h->arena = malloc(sizeof(int32_t) * nb * bs);
    assert_non_null(h->arena);
    for (uint32_t i = 0; i < nb * bs; i++)
        h->arena[i] = -1;
}

static void h_fini(harness *h)
{
    assert_int_equal(kvpool_check(h->pool), 0);
    kvpool_destroy(h->pool);
    free(h->arena);
}

static void ts_push(tseq *t, const int32_t *tok, uint32_t n)
{
    if (n == 0)
        return;
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2;
        t->tok = realloc(t->tok, sizeof(int32_t) * t->cap);
        assert_non_null(t->tok);
    }
    memcpy(t->tok + t->len, tok, sizeof(int32_t) * n);
    t->len += n;
}

static int32_t slot_of(const harness *h, const kvpool_seq *s, uint32_t pos)
{
    uint32_t nblk;
    const int32_t *blocks = kvpool_seq_blocks(s, &nblk);
    assert_true(pos / h->bs < nblk);
    return blocks[pos / h->bs] * (int32_t)h->bs + (int32_t)(pos % h->bs);
}

/* The sequence reads back exactly the tokens it was given (from its first unreleased block:
 * released entries are -1). */
static void ts_verify(const harness *h, const tseq *t)
{
    assert_int_equal(kvpool_seq_len(t->s), t->len);
    uint32_t nblk, rel = kvpool_seq_n_released(t->s);
    const int32_t *blocks = kvpool_seq_blocks(t->s, &nblk);
    for (uint32_t i = 0; i < rel; i++)
        assert_int_equal(blocks[i], -1);
    for (uint32_t p = rel * h->bs; p < t->len; p++)
        assert_int_equal(h->arena[slot_of(h, t->s, p)], t->tok[p]);
}

static void ts_create(harness *h, tseq *t)
{
    memset(t, 0, sizeof *t);
    assert_int_equal(kvpool_seq_create(h->pool, &t->s), 0);
    assert_int_equal(kvpool_seq_len(t->s), 0);
}

static void ts_destroy(harness *h, tseq *t)
{
    kvpool_seq_destroy(h->pool, t->s);
    free(t->tok);
    memset(t, 0, sizeof *t);
}

/* Appends like the engine would: performs any reported copy, then writes the slots. */
static int ts_append(harness *h, tseq *t, const int32_t *tok, uint32_t n, int *n_copy_out)
{
    kvpool_copy cp = {-1, -1};
    int n_copy = -1;
    int rc = kvpool_seq_append(h->pool, t->s, tok, n, &cp, &n_copy);
    if (n_copy_out)
        *n_copy_out = n_copy;
    if (rc != 0) {
        assert_int_equal(n_copy, 0);
        return rc;
    }
    assert_true(n_copy == 0 || n_copy == 1);
    if (n_copy == 1) {
        assert_true(cp.src >= 0 && (uint32_t)cp.src < h->nb);
        assert_true(cp.dst >= 0 && (uint32_t)cp.dst < h->nb);
        assert_int_not_equal(cp.src, cp.dst);
        memcpy(h->arena + (size_t)cp.dst * h->bs, h->arena + (size_t)cp.src * h->bs,
               sizeof(int32_t) * h->bs);
    }
    for (uint32_t i = 0; i < n; i++)
        h->arena[slot_of(h, t->s, t->len + i)] = tok[i];
    ts_push(t, tok, n);
    return 0;
}

/* Matches a prefix and checks every attached position really holds the queried token. */
static uint32_t ts_match(harness *h, tseq *t, const int32_t *tok, uint32_t n)
{
    uint32_t k = kvpool_seq_match_prefix(h->pool, t->s, tok, n);
    assert_true(k <= n);
    assert_int_equal(k % h->bs, 0);
    assert_int_equal(kvpool_seq_len(t->s), k);
    assert_int_equal(kvpool_seq_n_computed(t->s), k);
    for (uint32_t p = 0; p < k; p++)
        assert_int_equal(h->arena[slot_of(h, t->s, p)], tok[p]);
    ts_push(t, tok, k);
    return k;
}

/* As ts_match for a whole prompt (kvpool_seq_match_prompt): never all of it. */
static uint32_t ts_match_prompt(harness *h, tseq *t, const int32_t *tok, uint32_t n)
{
    uint32_t k = kvpool_seq_match_prompt(h->pool, t->s, tok, n);
    assert_true(n == 0 ? k == 0 : k < n);
    assert_true(k % h->bs == 0 || k == n - 1);
    assert_int_equal(kvpool_seq_len(t->s), k);
    assert_int_equal(kvpool_seq_n_computed(t->s), k);
    for (uint32_t p = 0; p < k; p++)
        assert_int_equal(h->arena[slot_of(h, t->s, p)], tok[p]);
    ts_push(t, tok, k);
    return k;
}

static void ts_fork(harness *h, const tseq *src, tseq *t)
{
    memset(t, 0, sizeof *t);
    assert_int_equal(kvpool_seq_fork(h->pool, src->s, &t->s), 0);
    ts_push(t, src->tok, src->len);
    ts_verify(h, t);
}

static kvpool_stats stats(const harness *h)
{
    kvpool_stats st;
    kvpool_get_stats(h->pool, &st);
    return st;
}

static void seq_tokens(int32_t *out, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = base + (int32_t)i;
}

/* --- deterministic cases --- */

static void test_create_invalid(void **state)
{
    (void)state;
    kvpool *pool = (kvpool *)1;
    kvpool_params p = {.n_blocks = 0, .block_size = 16, .prefix_cache = true};
    assert_int_equal(kvpool_create(&p, &pool), KVS_EINVAL);
    assert_null(pool);
    p.n_blocks = 4;
    p.block_size = 0;
    assert_int_equal(kvpool_create(&p, &pool), KVS_EINVAL);
    p.n_blocks = UINT32_MAX;
    p.block_size = 16;
    assert_int_equal(kvpool_create(&p, &pool), KVS_EINVAL);
    assert_int_equal(kvpool_create(NULL, &pool), KVS_EINVAL);
    kvpool_destroy(NULL);
    p.n_blocks = 4;
    assert_int_equal(kvpool_create(&p, &pool), 0);
    assert_int_equal(kvpool_block_size(pool), 16);
    kvpool_seq_destroy(pool, NULL);
    kvpool_stats st;
    kvpool_get_stats(pool, &st);
    assert_int_equal(st.blocks_total, 4);
    assert_int_equal(st.blocks_free, 4);
    assert_int_equal(st.blocks_used + st.blocks_cached, 0);
    assert_int_equal(kvpool_available(pool), 4);
    assert_int_equal(kvpool_check(pool), 0);
    kvpool_destroy(pool);
}

static void test_append_across_blocks(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, true);
    tseq a;
    ts_create(&h, &a);
    int32_t tok[32];
    seq_tokens(tok, 32, 100);

    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 0), 0);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 3), 1);
    assert_int_equal(ts_append(&h, &a, tok, 3, NULL), 0);
    uint32_t nb;
    kvpool_seq_blocks(a.s, &nb);
    assert_int_equal(nb, 1);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 1), 0);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 2), 1);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 10), 3);
    /* 3 + 10 = 13 tokens: 4 blocks, the last holding one token. */
    assert_int_equal(ts_append(&h, &a, tok + 3, 10, NULL), 0);
    const int32_t *blocks = kvpool_seq_blocks(a.s, &nb);
    assert_int_equal(nb, 4);
    for (uint32_t i = 0; i < nb; i++)
        for (uint32_t j = i + 1; j < nb; j++)
            assert_int_not_equal(blocks[i], blocks[j]);
    assert_int_equal(kvpool_seq_len(a.s), 13);
    assert_int_equal(kvpool_seq_n_computed(a.s), 0);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 4);
    assert_int_equal(st.blocks_free, 4);
    assert_int_equal(kvpool_available(h.pool), 4);
    /* Appending zero tokens is a no-op. */
    int n_copy = -1;
    assert_int_equal(kvpool_seq_append(h.pool, a.s, tok, 0, NULL, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    ts_verify(&h, &a);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* Many single-token appends (decode) keep exactly ceil(len / bs) blocks. */
    for (uint32_t i = 13; i < 32; i++) {
        assert_int_equal(ts_append(&h, &a, tok + i, 1, NULL), 0);
        kvpool_seq_blocks(a.s, &nb);
        assert_int_equal(nb, (i + 1 + 3) / 4);
    }
    ts_verify(&h, &a);
    assert_int_equal(kvpool_available(h.pool), 0);
    ts_destroy(&h, &a);
    st = stats(&h);
    /* Nothing committed, so nothing cached. */
    assert_int_equal(st.blocks_free, 8);
    assert_int_equal(st.blocks_used, 0);
    h_fini(&h);
}

static void test_destroy_and_refcount(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, false);
    tseq a, b, c;
    int32_t tok[16];
    seq_tokens(tok, 16, 1);
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 10, NULL), 0);
    ts_fork(&h, &a, &b);
    ts_fork(&h, &b, &c);
    uint32_t na, nb;
    const int32_t *ba = kvpool_seq_blocks(a.s, &na);
    const int32_t *bb = kvpool_seq_blocks(b.s, &nb);
    assert_int_equal(na, 3);
    assert_int_equal(nb, 3);
    assert_memory_equal(ba, bb, sizeof(int32_t) * 3);
    assert_int_equal(kvpool_seq_len(c.s), 10);
    assert_int_equal(stats(&h).blocks_used, 3); /* shared, not copied */
    assert_int_equal(kvpool_check(h.pool), 0);

    ts_destroy(&h, &a);
    assert_int_equal(stats(&h).blocks_used, 3);
    ts_verify(&h, &b);
    ts_destroy(&h, &b);
    assert_int_equal(stats(&h).blocks_used, 3);
    ts_verify(&h, &c);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &c);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.blocks_free, 8);
    assert_int_equal(st.tokens_stored, 0);
    assert_int_equal(st.slots_waste, 0);

    /* Forking an empty sequence gives another empty one. */
    ts_create(&h, &a);
    ts_fork(&h, &a, &b);
    assert_int_equal(kvpool_seq_len(b.s), 0);
    ts_destroy(&h, &a);
    ts_destroy(&h, &b);
    h_fini(&h);
}

static void test_copy_on_write(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 16, 4, true);
    tseq a, b, c;
    int32_t tok[64];
    seq_tokens(tok, 64, 500);
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 6, NULL), 0); /* block 1 holds 2 of 4 */
    kvpool_seq_commit(h.pool, a.s, 6);
    ts_fork(&h, &a, &b);
    assert_int_equal(kvpool_seq_n_computed(b.s), 6);
    uint32_t n;
    int32_t shared_last = kvpool_seq_blocks(a.s, &n)[1];
    int32_t shared_first = kvpool_seq_blocks(a.s, &n)[0];

    /* A writes first: one block for the copy, none for the token (it fits). */
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 1), 1);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, a.s, 3), 2);
    uint32_t avail = kvpool_available(h.pool);
    kvpool_copy cp;
    int n_copy = -1;
    int32_t t1 = 9001;
    assert_int_equal(kvpool_seq_append(h.pool, a.s, &t1, 1, &cp, &n_copy), 0);
    assert_int_equal(n_copy, 1);
    assert_int_equal(cp.src, shared_last);
    const int32_t *ta = kvpool_seq_blocks(a.s, &n);
    assert_int_equal(ta[1], cp.dst);
    assert_int_equal(ta[0], shared_first); /* full blocks stay shared */
    assert_int_equal(kvpool_seq_blocks(b.s, &n)[1], shared_last);
    assert_int_equal(kvpool_available(h.pool), avail - 1);
    /* play the engine for that append */
    memcpy(h.arena + cp.dst * 4, h.arena + cp.src * 4, sizeof(int32_t) * 4);
    h.arena[cp.dst * 4 + 2] = t1;
    ts_push(&a, &t1, 1);
    ts_verify(&h, &a);
    ts_verify(&h, &b);

    /* B is now the only holder of the old block: it writes in place. */
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, b.s, 1), 0);
    int32_t t2 = 9002;
    assert_int_equal(ts_append(&h, &b, &t2, 1, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    assert_int_equal(kvpool_seq_blocks(b.s, &n)[1], shared_last);
    ts_verify(&h, &a);
    ts_verify(&h, &b);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* Three-way share: the two writers each copy, the last holder keeps the original. */
    ts_fork(&h, &b, &c);
    tseq d;
    ts_fork(&h, &b, &d);
    int32_t more[3] = {1, 2, 3};
    assert_int_equal(ts_append(&h, &c, more, 3, &n_copy), 0); /* crosses into a new block */
    assert_int_equal(n_copy, 1);
    assert_int_equal(ts_append(&h, &d, more + 1, 1, &n_copy), 0);
    assert_int_equal(n_copy, 1);
    assert_int_equal(ts_append(&h, &b, more + 2, 1, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    assert_int_equal(kvpool_seq_blocks(b.s, &n)[1], shared_last);
    ts_verify(&h, &a);
    ts_verify(&h, &b);
    ts_verify(&h, &c);
    ts_verify(&h, &d);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* A full shared last block needs no copy: appends go to a new block. */
    tseq e, f;
    ts_create(&h, &e);
    assert_int_equal(ts_append(&h, &e, tok, 8, NULL), 0);
    ts_fork(&h, &e, &f);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, f.s, 1), 1);
    assert_int_equal(ts_append(&h, &f, tok + 8, 1, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    assert_int_equal(ts_append(&h, &e, tok + 20, 1, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    ts_verify(&h, &e);
    ts_verify(&h, &f);

    tseq *all[] = {&a, &b, &c, &d, &e, &f};
    for (size_t i = 0; i < 6; i++) {
        ts_destroy(&h, all[i]);
        assert_int_equal(kvpool_check(h.pool), 0);
    }
    assert_int_equal(stats(&h).blocks_used, 0);
    h_fini(&h);
}

static void test_exhaustion(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 4, 4, true);
    tseq a, b;
    int32_t tok[32];
    seq_tokens(tok, 32, 7);
    ts_create(&h, &a);
    ts_create(&h, &b);
    assert_int_equal(ts_append(&h, &a, tok, 10, NULL), 0); /* 3 blocks */
    kvpool_stats before = stats(&h);
    uint32_t nb_before;
    kvpool_seq_blocks(b.s, &nb_before);

    /* B wants 8 tokens = 2 blocks, only 1 left: nothing happens. */
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, b.s, 8), 2);
    assert_int_equal(ts_append(&h, &b, tok, 8, NULL), KVS_ENOSPC);
    kvpool_stats after = stats(&h);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(kvpool_seq_len(b.s), 0);
    uint32_t nb;
    kvpool_seq_blocks(b.s, &nb);
    assert_int_equal(nb, nb_before);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* A wants 3 more tokens: 2 fit its last block, the third needs the last free block. */
    assert_int_equal(ts_append(&h, &a, tok + 10, 3, NULL), 0);
    assert_int_equal(kvpool_available(h.pool), 0);
    assert_int_equal(ts_append(&h, &b, tok, 1, NULL), KVS_ENOSPC);
    assert_int_equal(ts_append(&h, &a, tok, 3, NULL), 0); /* fills its last block */
    assert_int_equal(ts_append(&h, &a, tok, 1, NULL), KVS_ENOSPC);
    assert_int_equal(kvpool_seq_len(a.s), 16);
    ts_verify(&h, &a);
    ts_destroy(&h, &a);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* A copy-on-write that cannot get a block fails whole, sharing intact. */
    tseq c, d;
    ts_create(&h, &c);
    assert_int_equal(ts_append(&h, &c, tok, 14, NULL), 0); /* 4 blocks, last holds 2 */
    ts_fork(&h, &c, &d);
    assert_int_equal(kvpool_seq_blocks_needed(h.pool, d.s, 1), 1);
    before = stats(&h);
    uint32_t n;
    int32_t last = kvpool_seq_blocks(d.s, &n)[3];
    int n_copy = -1;
    assert_int_equal(ts_append(&h, &d, tok, 1, &n_copy), KVS_ENOSPC);
    assert_int_equal(n_copy, 0);
    after = stats(&h);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(kvpool_seq_blocks(d.s, &n)[3], last);
    assert_int_equal(kvpool_seq_len(d.s), 14);
    assert_int_equal(kvpool_check(h.pool), 0);
    /* Once C is gone D owns the block and can write without any new block. */
    ts_destroy(&h, &c);
    assert_int_equal(ts_append(&h, &d, tok + 20, 2, &n_copy), 0);
    assert_int_equal(n_copy, 0);
    ts_verify(&h, &d);
    ts_destroy(&h, &d);
    ts_destroy(&h, &b);
    h_fini(&h);
}

/* Puts tok[0..n) in the cache (appended, committed, the sequence gone); its blocks into blk. */
static void cache_prompt(harness *h, const int32_t *tok, uint32_t n, int32_t *blk)
{
    tseq a;
    ts_create(h, &a);
    assert_int_equal(ts_append(h, &a, tok, n, NULL), 0);
    uint32_t nb;
    const int32_t *ab = kvpool_seq_blocks(a.s, &nb);
    memcpy(blk, ab, sizeof(int32_t) * nb);
    kvpool_seq_commit(h->pool, a.s, n);
    assert_int_equal(kvpool_seq_n_computed(a.s), n);
    ts_destroy(h, &a);
}

/* A new b matches all of tok[0..n), cached in blocks blk: n - 1 covered, blk attached. */
static void whole_hit(harness *h, tseq *b, const int32_t *tok, uint32_t n, const int32_t *blk)
{
    ts_create(h, b);
    assert_int_equal(ts_match_prompt(h, b, tok, n), n - 1);
    uint32_t nb;
    assert_memory_equal(kvpool_seq_blocks(b->s, &nb), blk, sizeof(int32_t) * (n / h->bs));
    assert_int_equal(nb, n / h->bs);
    assert_int_equal(kvpool_check(h->pool), 0);
}

/* b, stepped back by whole_hit, computes its last position again: written to a copy of the
 * cached block (even with no one else holding it: the block is the index's), and the commit
 * takes the cached block back. */
static void recompute_last(harness *h, tseq *b, const int32_t *tok, uint32_t n, const int32_t *blk)
{
    uint32_t nb, last = n / h->bs - 1;
    assert_int_equal(kvpool_seq_blocks_needed(h->pool, b->s, 1), 1);
    kvpool_copy cp;
    int n_copy = 0;
    assert_int_equal(kvpool_seq_append(h->pool, b->s, tok + n - 1, 1, &cp, &n_copy), 0);
    assert_int_equal(n_copy, 1);
    assert_int_equal(cp.src, blk[last]);
    assert_int_not_equal(kvpool_seq_blocks(b->s, &nb)[last], blk[last]);
    memcpy(h->arena + (size_t)cp.dst * h->bs, h->arena + (size_t)cp.src * h->bs,
           sizeof(int32_t) * h->bs);
    h->arena[slot_of(h, b->s, n - 1)] = tok[n - 1];
    ts_push(b, tok + n - 1, 1);
    assert_int_equal(kvpool_check(h->pool), 0);
    ts_verify(h, b);
    kvpool_seq_commit(h->pool, b->s, n);
    assert_memory_equal(kvpool_seq_blocks(b->s, &nb), blk, sizeof(int32_t) * (n / h->bs));
    assert_int_equal(kvpool_check(h->pool), 0);
}

static void test_prefix_hit(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 16, 4, true);
    int32_t tok[12];
    seq_tokens(tok, 12, 40);
    uint32_t n;
    int32_t ablk[3];
    cache_prompt(&h, tok, 12, ablk);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_cached, 3);
    assert_int_equal(st.blocks_free, 13);
    assert_int_equal(kvpool_available(h.pool), 16);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* Full hit; n = len - 1 leaves the last block to compute. */
    tseq b;
    ts_create(&h, &b);
    assert_int_equal(ts_match(&h, &b, tok, 11), 8);
    const int32_t *bb = kvpool_seq_blocks(b.s, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(bb, ablk, sizeof(int32_t) * 2);
    st = stats(&h);
    assert_int_equal(st.prefix_queries, 2);
    assert_int_equal(st.prefix_hits, 2);
    assert_int_equal(st.blocks_used, 2);
    assert_int_equal(st.blocks_cached, 1);
    assert_int_equal(st.tokens_stored, 8);
    /* A matched sequence is not empty, so a second match does nothing. */
    assert_int_equal(kvpool_seq_match_prefix(h.pool, b.s, tok, 12), 0);
    /* and it continues with the rest of its prompt into a new block. */
    assert_int_equal(ts_append(&h, &b, tok + 8, 4, NULL), 0);
    assert_int_not_equal(kvpool_seq_blocks(b.s, &n)[2], ablk[2]);
    ts_verify(&h, &b);
    ts_destroy(&h, &b);
    assert_int_equal(kvpool_check(h.pool), 0);

    tseq c;
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, tok, 12), 12);
    assert_memory_equal(kvpool_seq_blocks(c.s, &n), ablk, sizeof ablk);
    ts_destroy(&h, &c);

    /* Block-by-block partial match: first 2 blocks equal, third differs in its last token. */
    int32_t q[12];
    memcpy(q, tok, sizeof q);
    q[11] = 999;
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, q, 12), 8);
    ts_destroy(&h, &c);
    /* Mismatch in the middle: block 1 differs, so block 2 (equal tokens) is not reached. */
    memcpy(q, tok, sizeof q);
    q[5] = 999;
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, q, 12), 4);
    ts_destroy(&h, &c);
    /* Block 2's tokens alone, at the start, are a different prefix. */
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, tok + 8, 4), 0);
    /* Fewer tokens than a block: nothing to look up. */
    assert_int_equal(ts_match(&h, &c, tok, 3), 0);
    ts_destroy(&h, &c);
    /* First block differs: no hit at all. */
    memcpy(q, tok, sizeof q);
    q[0] = 999;
    ts_create(&h, &c);
    uint64_t queries = stats(&h).prefix_queries, hits = stats(&h).prefix_hits;
    assert_int_equal(ts_match(&h, &c, q, 12), 0);
    assert_int_equal(stats(&h).prefix_queries, queries + 3);
    assert_int_equal(stats(&h).prefix_hits, hits);
    ts_destroy(&h, &c);

    /* A partial commit indexes only the blocks it completes. */
    int32_t t2[12];
    seq_tokens(t2, 12, 300);
    tseq d;
    ts_create(&h, &d);
    assert_int_equal(ts_append(&h, &d, t2, 12, NULL), 0);
    kvpool_seq_commit(h.pool, d.s, 6);
    assert_int_equal(kvpool_seq_n_computed(d.s), 6);
    ts_destroy(&h, &d);
    ts_create(&h, &d);
    assert_int_equal(ts_match(&h, &d, t2, 12), 4);
    ts_destroy(&h, &d);
    h_fini(&h);
}

/* A whole-prompt hit leaves its last position to compute (kvpool_seq_match_prompt), in a copy
 * of the cached block: the block itself, and a sequence reading it meanwhile, keep what they
 * hold. */
static void test_prefix_whole_prompt(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 16, 4, true);
    int32_t tok[8], blk[2];
    seq_tokens(tok, 8, 70);
    cache_prompt(&h, tok, 8, blk);

    tseq b, c;
    whole_hit(&h, &b, tok, 8, blk);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.prefix_hits, 2);
    assert_int_equal(st.blocks_used, 2);
    assert_int_equal(st.tokens_stored, 7);
    /* another sequence matches the same blocks meanwhile (whole blocks only) */
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, tok, 8), 8);
    recompute_last(&h, &b, tok, 8, blk);
    ts_verify(&h, &c);
    assert_int_equal(stats(&h).blocks_used, 2);
    ts_destroy(&h, &c);
    ts_destroy(&h, &b);

    /* alone on the block, the same */
    whole_hit(&h, &b, tok, 8, blk);
    recompute_last(&h, &b, tok, 8, blk);
    assert_int_equal(stats(&h).blocks_used, 2);
    ts_destroy(&h, &b);
    /* one short of a block's end: an ordinary partial hit, nothing stepped back */
    ts_create(&h, &b);
    assert_int_equal(ts_match_prompt(&h, &b, tok, 7), 4);
    ts_destroy(&h, &b);
    /* dropped before its append: the block goes back to the cache whole */
    whole_hit(&h, &b, tok, 8, blk);
    ts_destroy(&h, &b);
    st = stats(&h);
    assert_int_equal(st.blocks_cached, 2);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.slots_waste, 0);
    ts_create(&h, &b);
    assert_int_equal(ts_match(&h, &b, tok, 8), 8);
    ts_destroy(&h, &b);
    h_fini(&h);
}

static void test_prefix_hit_live(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 16, 4, true);
    int32_t sys[16];
    seq_tokens(sys, 16, 70);
    tseq a, b, c;
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, sys, 14, NULL), 0);
    /* Not yet computed: not findable. */
    ts_create(&h, &b);
    assert_int_equal(ts_match(&h, &b, sys, 13), 0);
    kvpool_seq_commit(h.pool, a.s, 14);
    /* A still runs; B with the same system prompt shares its full blocks. */
    assert_int_equal(ts_match(&h, &b, sys, 13), 12);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 4); /* nothing new taken */
    assert_int_equal(st.blocks_cached, 0);
    uint32_t n;
    assert_memory_equal(kvpool_seq_blocks(a.s, &n), kvpool_seq_blocks(b.s, &n),
                        sizeof(int32_t) * 3);
    assert_int_equal(kvpool_check(h.pool), 0);
    /* B diverges after the shared prefix; A keeps decoding. */
    int32_t tail[3] = {1, 2, 3};
    assert_int_equal(ts_append(&h, &b, tail, 3, NULL), 0);
    assert_int_equal(ts_append(&h, &a, tail, 3, NULL), 0);
    ts_verify(&h, &a);
    ts_verify(&h, &b);
    ts_destroy(&h, &a);
    ts_verify(&h, &b);
    /* C finds the prefix through B now. */
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, sys, 16), 12);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &b);
    ts_destroy(&h, &c);
    assert_int_equal(stats(&h).blocks_cached, 3);
    h_fini(&h);
}

/* Two sequences prefill the same system prompt at once: the second to commit switches to the
 * first one's blocks, so its own later blocks chain from them and stay findable. */
static void test_prefix_concurrent_prefill(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 16, 4, true);
    int32_t pa[12], pb[12];
    seq_tokens(pa, 12, 50);
    memcpy(pb, pa, sizeof pb);
    pa[8] = 1;
    pb[8] = 2;
    tseq a, b, c;
    ts_create(&h, &a);
    ts_create(&h, &b);
    assert_int_equal(ts_append(&h, &a, pa, 12, NULL), 0);
    assert_int_equal(ts_append(&h, &b, pb, 12, NULL), 0);
    assert_int_equal(stats(&h).blocks_used, 6);
    kvpool_seq_commit(h.pool, a.s, 12);
    kvpool_seq_commit(h.pool, b.s, 12);
    uint32_t n;
    assert_memory_equal(kvpool_seq_blocks(a.s, &n), kvpool_seq_blocks(b.s, &n),
                        sizeof(int32_t) * 2);
    assert_int_not_equal(kvpool_seq_blocks(a.s, &n)[2], kvpool_seq_blocks(b.s, &n)[2]);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 4);
    assert_int_equal(st.tokens_stored, 24);
    ts_verify(&h, &a);
    ts_verify(&h, &b);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &a);
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, pb, 12), 12);
    ts_destroy(&h, &c);
    ts_destroy(&h, &b);
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, pa, 12), 12);

    /* X and its fork Y share uncomputed copies of C's blocks. X committing cannot switch a
     * block Y still holds; once Y is gone, the next commit does. */
    tseq x, y;
    ts_create(&h, &x);
    assert_int_equal(ts_append(&h, &x, pa, 10, NULL), 0);
    ts_fork(&h, &x, &y);
    kvpool_seq_commit(h.pool, x.s, 10);
    assert_int_equal(kvpool_seq_n_computed(x.s), 10);
    const int32_t *bc = kvpool_seq_blocks(c.s, &n);
    assert_int_not_equal(kvpool_seq_blocks(x.s, &n)[0], bc[0]);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &y);
    kvpool_seq_commit(h.pool, x.s, 10);
    assert_memory_equal(kvpool_seq_blocks(x.s, &n), bc, sizeof(int32_t) * 2);
    assert_int_equal(stats(&h).blocks_used, 4); /* C's 3 and X's partial last block */
    ts_verify(&h, &x);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &x);
    ts_destroy(&h, &c);
    h_fini(&h);
}

/* A block completed after a copy-on-write carries the copied tokens into the index. */
static void test_prefix_after_cow(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, true);
    int32_t tok[8];
    seq_tokens(tok, 8, 77);
    tseq a, b, c;
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 6, NULL), 0);
    ts_fork(&h, &a, &b);
    int n_copy;
    assert_int_equal(ts_append(&h, &b, tok + 6, 2, &n_copy), 0);
    assert_int_equal(n_copy, 1);
    kvpool_seq_commit(h.pool, b.s, 8);
    ts_destroy(&h, &a);
    ts_destroy(&h, &b);
    ts_create(&h, &c);
    assert_int_equal(ts_match(&h, &c, tok, 8), 8);
    ts_destroy(&h, &c);
    h_fini(&h);
}

static void test_prefix_disabled(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, false);
    int32_t tok[8];
    seq_tokens(tok, 8, 5);
    tseq a;
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 8, NULL), 0);
    kvpool_seq_commit(h.pool, a.s, 8);
    ts_destroy(&h, &a);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_cached, 0);
    assert_int_equal(st.blocks_free, 8);
    ts_create(&h, &a);
    assert_int_equal(ts_match(&h, &a, tok, 8), 0);
    ts_destroy(&h, &a);
    h_fini(&h);
}

/* One committed one-block sequence per base, destroyed in the order given. */
static void cache_blocks(harness *h, const int32_t *bases, int n, uint32_t bs)
{
    for (int i = 0; i < n; i++) {
        int32_t tok[16];
        seq_tokens(tok, bs, bases[i]);
        tseq t;
        ts_create(h, &t);
        assert_int_equal(ts_append(h, &t, tok, bs, NULL), 0);
        kvpool_seq_commit(h->pool, t.s, bs);
        ts_destroy(h, &t);
    }
}

static bool findable(harness *h, int32_t base, uint32_t bs)
{
    int32_t tok[16];
    seq_tokens(tok, bs, base);
    tseq t;
    ts_create(h, &t);
    uint32_t k = ts_match(h, &t, tok, bs);
    ts_destroy(h, &t); /* re-releasing refreshes its LRU position */
    return k == bs;
}

static void test_lru_eviction(void **state)
{
    (void)state;
    harness h;
    const uint32_t bs = 2;
    h_init(&h, 6, bs, true);
    const int32_t bases[3] = {100, 200, 300};
    cache_blocks(&h, bases, 3, bs); /* released X=100, Y=200, Z=300 */
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_cached, 3);
    assert_int_equal(st.blocks_free, 3);
    assert_int_equal(kvpool_available(h.pool), 6);

    /* Cached blocks survive while free blocks remain. */
    tseq fill;
    ts_create(&h, &fill);
    int32_t tok[16];
    seq_tokens(tok, 16, 1);
    assert_int_equal(ts_append(&h, &fill, tok, 3 * bs, NULL), 0);
    st = stats(&h);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.blocks_cached, 3);
    assert_int_equal(st.blocks_free, 0);
    assert_int_equal(kvpool_available(h.pool), 3);

    /* Touch X: now Y is the least recently released. */
    assert_true(findable(&h, 100, bs));
    /* One more block evicts Y, and only Y. */
    assert_int_equal(ts_append(&h, &fill, tok, 1, NULL), 0);
    st = stats(&h);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.blocks_cached, 2);
    assert_false(findable(&h, 200, bs));
    assert_true(findable(&h, 300, bs)); /* Z touched: X is oldest now */
    assert_int_equal(ts_append(&h, &fill, tok, bs, NULL), 0);
    assert_int_equal(stats(&h).evictions, 2);
    assert_false(findable(&h, 100, bs));
    assert_true(findable(&h, 300, bs));
    assert_int_equal(ts_append(&h, &fill, tok, bs, NULL), 0);
    assert_int_equal(stats(&h).evictions, 3);
    assert_false(findable(&h, 300, bs));
    st = stats(&h);
    assert_int_equal(st.blocks_used, 6);
    assert_int_equal(st.blocks_cached, 0);
    assert_int_equal(ts_append(&h, &fill, tok, 2 * bs, NULL), KVS_ENOSPC);
    ts_verify(&h, &fill);
    ts_destroy(&h, &fill);
    h_fini(&h);
}

/* A cached chain is evicted child first, so its prefix shrinks block by block. */
static void test_lru_chain(void **state)
{
    (void)state;
    harness h;
    const uint32_t bs = 4;
    h_init(&h, 4, bs, true);
    int32_t tok[16];
    seq_tokens(tok, 16, 10);
    tseq a;
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 12, NULL), 0);
    kvpool_seq_commit(h.pool, a.s, 12);
    ts_destroy(&h, &a);
    tseq x;
    ts_create(&h, &x);
    int32_t other[8];
    seq_tokens(other, 8, 900);
    assert_int_equal(ts_append(&h, &x, other, 2 * bs, NULL), 0); /* free block + 1 eviction */
    assert_int_equal(stats(&h).evictions, 1);
    assert_int_equal(kvpool_check(h.pool), 0);
    tseq b;
    ts_create(&h, &b);
    assert_int_equal(ts_match(&h, &b, tok, 12), 8); /* the last block went first */
    ts_destroy(&h, &b);
    ts_destroy(&h, &x);
    h_fini(&h);
}

static void test_stats(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, true);
    int32_t tok[16];
    seq_tokens(tok, 16, 3);
    tseq a, b;
    ts_create(&h, &a);
    assert_int_equal(ts_append(&h, &a, tok, 5, NULL), 0);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.tokens_stored, 5);
    assert_int_equal(st.slots_waste, 3);
    assert_int_equal(st.blocks_used, 2);
    ts_fork(&h, &a, &b);
    st = stats(&h);
    assert_int_equal(st.tokens_stored, 10); /* once per sequence */
    assert_int_equal(st.slots_waste, 3);    /* the shared partial block is one block */
    assert_int_equal(st.blocks_used, 2);
    int n_copy;
    assert_int_equal(ts_append(&h, &b, tok + 5, 1, &n_copy), 0);
    assert_int_equal(n_copy, 1);
    st = stats(&h);
    assert_int_equal(st.tokens_stored, 11);
    assert_int_equal(st.slots_waste, 3 + 2);
    assert_int_equal(st.blocks_used, 3);
    assert_int_equal(ts_append(&h, &b, tok + 6, 3, NULL), 0); /* 9 tokens: 3 blocks */
    st = stats(&h);
    assert_int_equal(st.tokens_stored, 14);
    assert_int_equal(st.slots_waste, 3 + 3);
    assert_int_equal(st.blocks_used, 4);
    ts_destroy(&h, &a);
    st = stats(&h);
    assert_int_equal(st.tokens_stored, 9);
    assert_int_equal(st.slots_waste, 3);
    assert_int_equal(st.blocks_used, 3);
    assert_int_equal(st.blocks_used + st.blocks_cached + st.blocks_free, st.blocks_total);
    ts_destroy(&h, &b);
    st = stats(&h);
    assert_int_equal(st.tokens_stored, 0);
    assert_int_equal(st.slots_waste, 0);
    h_fini(&h);
}

/* --- randomized --- */

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? (uint32_t)(rng_state % n) : 0;
}

#define MAX_SEQS 12

/* A prompt drawn from a few shared "system prompts" plus a random tail over a small
 * vocabulary, so prefixes repeat, diverge mid-block and collide often. */
static uint32_t make_prompt(int32_t *out, uint32_t cap, uint32_t bs)
{
    uint32_t sys = rnd(4);
    uint32_t sys_len = sys * bs + rnd(bs);
    uint32_t len = sys_len + rnd(3 * bs + 2);
    if (len > cap)
        len = cap;
    for (uint32_t i = 0; i < len; i++)
        out[i] = i < sys_len ? (int32_t)(sys * 1000 + i % 7) : (int32_t)rnd(3);
    return len;
}

/* window > 0: sequences also release their blocks before a window of up to `window`
 * positions behind n_computed, as a windowed layer group does. */
static void run_random(uint32_t bs, uint32_t n_blocks, uint32_t iters, uint64_t seed,
                       uint32_t window)
{
    harness h;
    h_init(&h, n_blocks, bs, true);
    rng_state = seed;
    tseq seqs[MAX_SEQS];
    int32_t *pending[MAX_SEQS]; /* rest of each sequence's prompt, appended in chunks */
    uint32_t n_pending[MAX_SEQS], pending_at[MAX_SEQS];
    /* Forked while sharing full blocks not yet computed: if another sequence indexes the
     * same prefix first, indexing of that shared run waits until one sibling goes, so such
     * sequences are left out of the "everything committed is findable" bound. */
    bool tainted[MAX_SEQS];
    uint32_t n_live = 0;
    uint32_t cap = 8 * bs + 8;
    int32_t *buf = malloc(sizeof(int32_t) * cap);
    assert_non_null(buf);
    uint64_t last_queries = 0, n_released = 0;

    for (uint32_t it = 0; it < iters; it++) {
        uint32_t op = rnd(100);
        if (op < 20 && n_live < MAX_SEQS) {
            /* create, matching a prompt prefix */
            tseq *t = &seqs[n_live];
            ts_create(&h, t);
            uint32_t len = make_prompt(buf, cap, bs);
            uint32_t want = len > 0 ? len - rnd(2) : 0;
            /* Every committed full block of a live sequence is findable. */
            uint32_t lower = 0;
            for (uint32_t i = 0; i < n_live; i++) {
                if (tainted[i])
                    continue;
                uint32_t nc = kvpool_seq_n_computed(seqs[i].s) / bs * bs;
                uint32_t j = 0;
                while (j < nc && j < want && seqs[i].tok[j] == buf[j])
                    j++;
                j = j / bs * bs;
                if (j > lower)
                    lower = j;
            }
            uint32_t k, queries;
            if (!window && rnd(3) == 0) { /* the whole prompt: at most len - 1 covered */
                k = ts_match_prompt(&h, t, buf, len);
                assert_true(len == 0 || k >= (lower < len ? lower : len - 1));
                queries = bs == 1 ? (len ? len - 1 : 0) : len / bs;
            } else {
                k = ts_match(&h, t, buf, want);
                assert_true(k >= lower);
                queries = want / bs;
            }
            assert_int_equal(stats(&h).prefix_queries, last_queries + queries);
            pending[n_live] = malloc(sizeof(int32_t) * (len - k + 1));
            assert_non_null(pending[n_live]);
            memcpy(pending[n_live], buf + k, sizeof(int32_t) * (len - k));
            n_pending[n_live] = len - k;
            pending_at[n_live] = 0;
            tainted[n_live] = false;
            n_live++;
        } else if (op < 55 && n_live > 0) {
            /* append: the prompt's next chunk, else decode-like tokens */
            uint32_t i = rnd(n_live);
            uint32_t n = 1 + rnd(2 * bs + 3);
            const int32_t *src;
            if (pending_at[i] < n_pending[i]) {
                if (n > n_pending[i] - pending_at[i])
                    n = n_pending[i] - pending_at[i];
                src = pending[i] + pending_at[i];
            } else {
                for (uint32_t j = 0; j < n && j < cap; j++)
                    buf[j] = (int32_t)rnd(3);
                if (n > cap)
                    n = cap;
                src = buf;
            }
            uint32_t need = kvpool_seq_blocks_needed(h.pool, seqs[i].s, n);
            uint32_t avail = kvpool_available(h.pool);
            kvpool_stats before = stats(&h);
            uint32_t len_before = kvpool_seq_len(seqs[i].s);
            int rc = ts_append(&h, &seqs[i], src, n, NULL);
            if (rc == KVS_ENOSPC) {
                assert_true(need > avail);
                kvpool_stats after = stats(&h);
                assert_memory_equal(&before, &after, sizeof before);
                assert_int_equal(kvpool_seq_len(seqs[i].s), len_before);
            } else {
                assert_int_equal(rc, 0);
                assert_true(need <= avail);
                assert_int_equal(kvpool_available(h.pool), avail - need);
                if (src != buf)
                    pending_at[i] += n;
            }
        } else if (op < 75 && n_live > 0) {
            uint32_t i = rnd(n_live);
            uint32_t len = kvpool_seq_len(seqs[i].s);
            uint32_t nc = kvpool_seq_n_computed(seqs[i].s);
            uint32_t to = rnd(3) ? len : nc + rnd(len - nc + 1);
            kvpool_seq_commit(h.pool, seqs[i].s, to);
            assert_int_equal(kvpool_seq_n_computed(seqs[i].s), to > nc ? to : nc);
        } else if (window && op < 80 && n_live > 0) {
            uint32_t i = rnd(n_live);
            uint32_t nc = kvpool_seq_n_computed(seqs[i].s), w = 1 + rnd(window);
            uint32_t used = stats(&h).blocks_used, rel0 = kvpool_seq_n_released(seqs[i].s);
            uint32_t n = kvpool_seq_release_before(h.pool, seqs[i].s, nc + 1 > w ? nc + 1 - w : 0);
            assert_int_equal(kvpool_seq_n_released(seqs[i].s), rel0 + n);
            assert_true(stats(&h).blocks_used <= used);
            assert_true(kvpool_seq_n_released(seqs[i].s) * bs <= nc);
            n_released += n;
            if (n)
                tainted[i] = true; /* its early blocks may be evicted: no longer findable */
        } else if (op < 85 && n_live > 0 && n_live < MAX_SEQS) {
            uint32_t i = rnd(n_live);
            if (kvpool_seq_len(seqs[i].s) / bs > kvpool_seq_n_computed(seqs[i].s) / bs)
                tainted[i] = true;
            tainted[n_live] = tainted[i];
            ts_fork(&h, &seqs[i], &seqs[n_live]);
            assert_int_equal(kvpool_seq_n_computed(seqs[n_live].s),
                             kvpool_seq_n_computed(seqs[i].s));
            uint32_t rest = n_pending[i] - pending_at[i];
            pending[n_live] = malloc(sizeof(int32_t) * (rest + 1));
            assert_non_null(pending[n_live]);
            memcpy(pending[n_live], pending[i] + pending_at[i], sizeof(int32_t) * rest);
            n_pending[n_live] = rest;
            pending_at[n_live] = 0;
            n_live++;
        } else if (n_live > 0) {
            uint32_t i = rnd(n_live);
            ts_destroy(&h, &seqs[i]);
            free(pending[i]);
            n_live--;
            seqs[i] = seqs[n_live];
            pending[i] = pending[n_live];
            n_pending[i] = n_pending[n_live];
            pending_at[i] = pending_at[n_live];
            tainted[i] = tainted[n_live];
        }
        last_queries = stats(&h).prefix_queries;
        assert_int_equal(kvpool_check(h.pool), 0);
        kvpool_stats st = stats(&h);
        assert_int_equal(st.blocks_used + st.blocks_cached + st.blocks_free, n_blocks);
        assert_int_equal(kvpool_available(h.pool), st.blocks_cached + st.blocks_free);
        assert_true(st.prefix_hits <= st.prefix_queries);
        uint64_t tokens = 0;
        for (uint32_t i = 0; i < n_live; i++) {
            ts_verify(&h, &seqs[i]);
            tokens += seqs[i].len - kvpool_seq_n_released(seqs[i].s) * bs;
        }
        assert_int_equal(st.tokens_stored, tokens);
    }
    kvpool_stats st = stats(&h);
    /* The workload must actually have exercised sharing, hits and eviction. */
    assert_true(st.prefix_hits > 0);
    assert_true(st.evictions > 0);
    assert_true(!window || n_released > iters / 20);
    for (uint32_t i = 0; i < n_live; i++) {
        ts_destroy(&h, &seqs[i]);
        free(pending[i]);
        assert_int_equal(kvpool_check(h.pool), 0);
    }
    st = stats(&h);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.tokens_stored, 0);
    assert_int_equal(st.slots_waste, 0);
    free(buf);
    h_fini(&h);
}

static void test_random_bs1(void **state)
{
    (void)state;
    run_random(1, 96, 4000, 0x1234567u, 0);
}

static void test_random_bs16(void **state)
{
    (void)state;
    run_random(16, 48, 4000, 0xfeedbeefu, 0);
}

static void test_random_bs64(void **state)
{
    (void)state;
    run_random(64, 40, 3000, 0xabcdef01u, 0);
}

/* The same workloads with sliding-window releases mixed in: sharing, copy-on-write, prefix
 * hits on partly released chains and evictions of released parents (orphans) keep every
 * invariant and every live position's contents. */
static void test_random_window_bs1(void **state)
{
    (void)state;
    run_random(1, 96, 4000, 0x7654321u, 12);
}

static void test_random_window_bs4(void **state)
{
    (void)state;
    run_random(4, 64, 4000, 0x5eed5eedu, 20);
}

static void test_random_window_bs16(void **state)
{
    (void)state;
    run_random(16, 48, 4000, 0xc0ffee11u, 40);
}

/* release_before frees the blocks wholly before pos but keeps the last block and the last
 * indexed one (the next block's parent); released indexed blocks stay findable until evicted,
 * and their held children then become orphans that leave the index when released. */
static void test_release_before(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, true);
    tseq a, b, c;
    ts_create(&h, &a);
    int32_t tok[32], other[32];
    seq_tokens(tok, 32, 500);
    seq_tokens(other, 32, 900);
    assert_int_equal(ts_append(&h, &a, tok, 18, NULL), 0); /* 4 full blocks and 2 tokens */
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 17), 0); /* nothing computed */
    kvpool_seq_commit(h.pool, a.s, 18);
    assert_int_equal(stats(&h).blocks_used, 5);
    /* pos 17: blocks 0..3 are wholly before it, block 3 stays as block 4's parent */
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 17), 3);
    assert_int_equal(kvpool_seq_n_released(a.s), 3);
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 17), 0); /* idempotent */
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 2);
    assert_int_equal(st.blocks_cached, 3);
    assert_int_equal(st.tokens_stored, 18 - 12);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_verify(&h, &a);

    /* The released chain is still whole in the cache: a new sequence finds all 4 blocks. */
    assert_int_equal(kvpool_prefix_probe(h.pool, tok, 18), 16);
    ts_create(&h, &b);
    assert_int_equal(ts_match(&h, &b, tok, 17), 16);
    assert_int_equal(stats(&h).blocks_used, 5);
    ts_destroy(&h, &b);
    assert_int_equal(kvpool_check(h.pool), 0);

    /* Taking 6 blocks evicts the 3 cached ones (and block 3 is still a's): a's block 3 is now
     * an orphan, unreachable, and not cached when a lets it go. */
    ts_create(&h, &c);
    assert_int_equal(ts_append(&h, &c, other, 24, NULL), 0);
    assert_true(stats(&h).evictions >= 3);
    assert_int_equal(kvpool_prefix_probe(h.pool, tok, 18), 0);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &c);
    ts_destroy(&h, &a);
    st = stats(&h);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.tokens_stored, 0);
    assert_int_equal(kvpool_check(h.pool), 0);
    h_fini(&h);
}

/* A fork shares the released table (-1 entries, no references) and the live blocks; each side
 * then releases and copies on write on its own. */
static void test_release_fork_cow(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 12, 4, true);
    tseq a, b;
    ts_create(&h, &a);
    int32_t tok[40], t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 8};
    seq_tokens(tok, 40, 700);
    assert_int_equal(ts_append(&h, &a, tok, 14, NULL), 0);
    kvpool_seq_commit(h.pool, a.s, 14);
    /* pos 9: blocks 0 and 1 are wholly before it (block 2, holding 9, is also the parent of
     * the next block to be indexed) */
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 9), 2);
    ts_fork(&h, &a, &b);
    assert_int_equal(kvpool_seq_n_released(b.s), 2);
    assert_int_equal(stats(&h).blocks_used, 2);
    assert_int_equal(kvpool_check(h.pool), 0);
    int nc = -1;
    assert_int_equal(ts_append(&h, &a, t1, 2, &nc), 0); /* shared partial block: copied */
    assert_int_equal(nc, 1);
    assert_int_equal(ts_append(&h, &b, t2, 4, &nc), 0); /* now b's alone: no copy */
    assert_int_equal(nc, 0);
    kvpool_seq_commit(h.pool, a.s, 16);
    kvpool_seq_commit(h.pool, b.s, 18);
    /* b: block 2 goes (still a's), block 3 stays as block 4's parent */
    assert_int_equal(kvpool_seq_release_before(h.pool, b.s, 17), 1);
    assert_int_equal(kvpool_seq_n_released(a.s), 2);
    assert_int_equal(stats(&h).blocks_used, 4); /* a: 2 and its copy of 3; b: 3 and 4 */
    ts_verify(&h, &a);
    ts_verify(&h, &b);
    assert_int_equal(kvpool_check(h.pool), 0);
    ts_destroy(&h, &b);
    ts_destroy(&h, &a);
    assert_int_equal(stats(&h).blocks_used, 0);
    h_fini(&h);
}

/* Without the prefix index only the last block is kept, and released blocks go free. */
static void test_release_no_prefix(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, false);
    tseq a;
    ts_create(&h, &a);
    int32_t tok[32];
    seq_tokens(tok, 32, 40);
    assert_int_equal(ts_append(&h, &a, tok, 16, NULL), 0);
    kvpool_seq_commit(h.pool, a.s, 12);
    /* at most n_computed: blocks 0..2 (12 positions), even though pos asks for more */
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 16), 3);
    kvpool_stats st = stats(&h);
    assert_int_equal(st.blocks_used, 1);
    assert_int_equal(st.blocks_cached, 0);
    assert_int_equal(st.blocks_free, 7);
    kvpool_seq_commit(h.pool, a.s, 16);
    assert_int_equal(kvpool_seq_release_before(h.pool, a.s, 16), 0); /* the last block stays */
    ts_verify(&h, &a);
    ts_destroy(&h, &a);
    h_fini(&h);
}

/* kvpool_block_states: the picture matches the pool (used with refcounts, cached, free),
 * is clamped to the pool, and either output may be skipped. */
static void test_block_states(void **state)
{
    (void)state;
    harness h;
    h_init(&h, 8, 4, true);
    tseq a, b;
    ts_create(&h, &a);
    int32_t tok[8];
    seq_tokens(tok, 8, 300);
    assert_int_equal(ts_append(&h, &a, tok, 6, NULL), 0); /* a full block and a partial one */
    kvpool_seq_commit(h.pool, a.s, 6);
    ts_fork(&h, &a, &b);
    uint8_t st[8];
    uint16_t refs[8];
    assert_int_equal(kvpool_block_states(h.pool, 0, 8, st, refs), 8);
    uint32_t n_used = 0, n_shared = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(st[i] == 0 || st[i] == 2);
        n_used += st[i] == 2;
        n_shared += refs[i] == 2;
        assert_true((st[i] == 2) == (refs[i] > 0));
    }
    assert_int_equal(n_used, 2);
    assert_int_equal(n_shared, 2);
    ts_destroy(&h, &b);
    ts_destroy(&h, &a);
    assert_int_equal(kvpool_block_states(h.pool, 0, 8, st, NULL), 8);
    uint32_t n_cached = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(st[i] != 2);
        n_cached += st[i] == 1;
    }
    assert_int_equal(n_cached, 1); /* the full block stays findable; the partial one is free */
    assert_int_equal(kvpool_block_states(h.pool, 6, 8, NULL, refs), 2);
    assert_int_equal(kvpool_block_states(h.pool, 8, 1, st, refs), 0);
    kvpool_stats ps = stats(&h);
    assert_int_equal(ps.blocks_cached, n_cached);
    h_fini(&h);
}

/* --- windowed matches (a global pool and a windowed pool, as the scheduler pairs them) --- */

/* One sequence in both pools, the windowed table released behind a window of w positions
 * after each commit, as scheduler/seq_kv.c does. */
typedef struct wpair {
    harness g, w;
    uint32_t window;
} wpair;

typedef struct wseq {
    tseq g, w;
} wseq;

static void wp_init(wpair *p, uint32_t g_blocks, uint32_t w_blocks, uint32_t bs, uint32_t window)
{
    h_init(&p->g, g_blocks, bs, true);
    h_init(&p->w, w_blocks, bs, true);
    p->window = window;
}

static void wp_fini(wpair *p)
{
    h_fini(&p->g);
    h_fini(&p->w);
}

static void ws_create(wpair *p, wseq *q)
{
    ts_create(&p->g, &q->g);
    ts_create(&p->w, &q->w);
}

static void ws_destroy(wpair *p, wseq *q)
{
    ts_destroy(&p->g, &q->g);
    ts_destroy(&p->w, &q->w);
}

/* Appends and computes tok[0..n) in chunks of `chunk`, committing and releasing after each. */
static void ws_run(wpair *p, wseq *q, const int32_t *tok, uint32_t n, uint32_t chunk)
{
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done < chunk ? n - done : chunk;
        assert_int_equal(ts_append(&p->g, &q->g, tok + done, k, NULL), 0);
        assert_int_equal(ts_append(&p->w, &q->w, tok + done, k, NULL), 0);
        done += k;
        uint32_t nc = q->g.len;
        kvpool_seq_commit(p->g.pool, q->g.s, nc);
        kvpool_seq_commit_anchored(p->w.pool, q->w.s, nc, p->g.pool, q->g.s);
        kvpool_seq_release_before(p->w.pool, q->w.s, nc + 1 > p->window ? nc + 1 - p->window : 0);
        assert_int_equal(kvpool_check(p->g.pool), 0);
        assert_int_equal(kvpool_check(p->w.pool), 0);
        ts_verify(&p->w, &q->w);
    }
}

/* One sequence computes tok[0..n) in chunks of `chunk` and goes: the conversation a later
 * request sends again, its full blocks left cached wherever the pools still hold them. */
static void ws_cached(wpair *p, const int32_t *tok, uint32_t n, uint32_t chunk)
{
    wseq q;
    ws_create(p, &q);
    ws_run(p, &q, tok, n, chunk);
    ws_destroy(p, &q);
}

/* The windowed probe for tok[0..n) after the global group's walk (0 when keys run out). */
static uint32_t wp_probe(const wpair *p, const int32_t *tok, uint32_t n, uint64_t *keys)
{
    uint32_t g = kvpool_prefix_keys(p->g.pool, tok, n, keys);
    uint32_t w = kvpool_window_probe(p->w.pool, tok, g, p->window, keys);
    assert_true(w <= g);
    assert_int_equal(w % p->g.bs, 0);
    return w;
}

/* A prefix hit in both groups, as scheduler/seq_kv.c makes it: every position the windowed
 * table holds reads back the queried token, and the entries before the window are released. */
static uint32_t ws_match(wpair *p, wseq *q, const int32_t *tok, uint32_t n)
{
    uint64_t keys[256];
    assert_true(n / p->g.bs <= 256);
    uint32_t w = wp_probe(p, tok, n, keys);
    assert_int_equal(ts_match(&p->g, &q->g, tok, w), w);
    uint32_t k = kvpool_seq_match_window(p->w.pool, q->w.s, tok, w, p->window, keys);
    assert_int_equal(k, w);
    assert_int_equal(kvpool_seq_len(q->w.s), k);
    assert_int_equal(kvpool_seq_n_computed(q->w.s), k);
    uint32_t bs = p->w.bs, rel = kvpool_seq_n_released(q->w.s);
    uint32_t first = k + 1 > p->window ? (k + 1 - p->window) / bs : 0;
    if (k) {
        assert_int_equal(rel, first < k / bs ? first : k / bs - 1);
    }
    ts_push(&q->w, tok, k);
    ts_verify(&p->w, &q->w);
    assert_int_equal(kvpool_check(p->w.pool), 0);
    assert_int_equal(kvpool_check(p->g.pool), 0);
    return k;
}

/* A conversation much longer than the windowed pool, finished, then sent again with a new
 * turn: a walk from the first block finds nothing (those blocks were evicted long ago), the
 * windowed match covers every full block the global group holds, and the new turn computes
 * and indexes on top of it. */
static void test_window_match_long(void **state)
{
    (void)state;
    wpair p;
    wp_init(&p, 64, 10, 4, 9); /* a window of 9 positions needs 3 blocks, 4 when unaligned */
    int32_t tok[160];
    seq_tokens(tok, 160, 2000);
    wseq b;
    ws_cached(&p, tok, 102, 5); /* 25 full blocks and 2 tokens; 10 windowed blocks */
    assert_true(stats(&p.w).evictions > 0);
    assert_int_equal(kvpool_prefix_probe(p.w.pool, tok, 120), 0);
    assert_int_equal(kvpool_prefix_probe(p.g.pool, tok, 120), 100);

    kvpool_stats w0 = stats(&p.w);
    ws_create(&p, &b);
    assert_int_equal(ws_match(&p, &b, tok, 119), 100); /* every full block; not the partial one */
    assert_int_equal(kvpool_seq_n_released(b.w.s), (100 + 1 - 9) / 4);
    assert_int_equal(stats(&p.w).prefix_queries, w0.prefix_queries + 25); /* the global hit's */
    assert_int_equal(stats(&p.w).prefix_hits, w0.prefix_hits + 25);
    assert_int_equal(stats(&p.w).blocks_used, 2); /* [92, 100): blocks 23 and 24 */
    ws_run(&p, &b, tok + 100, 40, 7);             /* the new turn, past the old partial block */
    assert_int_equal(b.w.len, 140);
    ws_destroy(&p, &b);
    /* and the longer conversation is whole again */
    ws_create(&p, &b);
    assert_int_equal(ws_match(&p, &b, tok, 150), 140);
    ws_destroy(&p, &b);
    assert_int_equal(stats(&p.w).blocks_used, 0);
    assert_int_equal(stats(&p.g).blocks_used, 0);
    wp_fini(&p);
}

/* The window at the hit's end was evicted while an earlier one stands (held by a sequence
 * matched there during the churn): the hit is shortened to the end of the earlier window. */
static void test_window_match_evicted_middle(void **state)
{
    (void)state;
    wpair p;
    wp_init(&p, 64, 12, 4, 9);
    int32_t tok[80], other[80];
    seq_tokens(tok, 80, 3000);
    seq_tokens(other, 80, 7000);
    wseq a, mid, churn, b;
    ws_cached(&p, tok, 60, 4);
    ws_create(&p, &mid);
    assert_int_equal(ws_match(&p, &mid, tok, 32), 32); /* holds the blocks of [24, 32) */
    /* Everything else cached in the windowed group goes. */
    ts_create(&p.w, &churn.w);
    assert_int_equal(ts_append(&p.w, &churn.w, other, kvpool_available(p.w.pool) * 4, NULL), 0);
    ts_destroy(&p.w, &churn.w);
    ws_destroy(&p, &mid);
    uint64_t keys[32];
    assert_int_equal(kvpool_prefix_keys(p.g.pool, tok, 59, keys), 56); /* global: all of it */
    assert_int_equal(wp_probe(&p, tok, 59, keys), 32);
    ws_create(&p, &b);
    assert_int_equal(ws_match(&p, &b, tok, 59), 32);
    ws_run(&p, &b, tok + 32, 28, 6);
    ws_destroy(&p, &b);

    /* A hole inside the window itself: [24, 32) needs blocks 6 and 7; with block 6 evicted and
     * block 7 kept, 32 is refused and the hit falls back before block 6. */
    ws_create(&p, &a);
    assert_int_equal(ws_match(&p, &a, tok, 59), 56);
    ws_destroy(&p, &a);
    ts_create(&p.w, &churn.w);
    assert_int_equal(ts_append(&p.w, &churn.w, other, kvpool_available(p.w.pool) * 4, NULL), 0);
    ts_destroy(&p.w, &churn.w);
    assert_int_equal(wp_probe(&p, tok, 59, keys), 0); /* nothing left anywhere */
    wp_fini(&p);
}

/* Two prefixes that differ only in their first block hold the same tokens at every later
 * position. The windowed group holds one of them; the other, computed in the global group
 * only, must find nothing there, though its window's tokens match and (in the kvpool_collide
 * build, 2-bit hashes) its chain hashes often do too: the anchor tells the prefixes apart. */
static void test_window_match_no_alias(void **state)
{
    (void)state;
    wpair p;
    wp_init(&p, 300, 40, 4, 9); /* the global group keeps every prefix */
    int32_t a_tok[40];
    seq_tokens(a_tok, 40, 100);
    ws_cached(&p, a_tok, 40, 8);
    uint64_t keys[16];
    assert_int_equal(wp_probe(&p, a_tok, 39, keys), 36);
    for (int v = 0; v < 24; v++) {
        int32_t b_tok[40];
        memcpy(b_tok, a_tok, sizeof b_tok);
        b_tok[0] = 5000 + v; /* a different first block, the same tokens after it */
        tseq bg;
        ts_create(&p.g, &bg);
        assert_int_equal(ts_append(&p.g, &bg, b_tok, 40, NULL), 0);
        kvpool_seq_commit(p.g.pool, bg.s, 40);
        ts_destroy(&p.g, &bg);
        assert_int_equal(kvpool_prefix_keys(p.g.pool, b_tok, 39, keys), 36);
        assert_int_equal(kvpool_window_probe(p.w.pool, b_tok, 36, p.window, keys), 0);
        wseq b;
        ws_create(&p, &b);
        assert_int_equal(ws_match(&p, &b, b_tok, 39), 0);
        ws_destroy(&p, &b);
    }
    /* a's own prefix is still found */
    assert_int_equal(wp_probe(&p, a_tok, 39, keys), 36);
    wp_fini(&p);
}

/* The global group evicted a conversation and computed it again (new blocks, new keys) while
 * the windowed group still cached its old blocks: the new windowed commit switches to those
 * (same prefix, same parent chain), and they must then carry the new global keys, or the
 * conversation sent a third time finds its window nowhere though both groups hold it. */
static void test_window_match_after_global_recompute(void **state)
{
    (void)state;
    wpair p;
    wp_init(&p, 16, 40, 4, 9); /* a small global group, a windowed one that keeps everything */
    int32_t tok[40], other[80];
    seq_tokens(tok, 40, 5000);
    seq_tokens(other, 80, 9000);
    ws_cached(&p, tok, 40, 4);
    uint64_t keys[16];
    assert_int_equal(wp_probe(&p, tok, 39, keys), 36);
    /* everything cached in the global group goes; the windowed group is untouched */
    tseq churn;
    ts_create(&p.g, &churn);
    assert_int_equal(ts_append(&p.g, &churn, other, kvpool_available(p.g.pool) * 4, NULL), 0);
    ts_destroy(&p.g, &churn);
    assert_int_equal(kvpool_prefix_probe(p.g.pool, tok, 39), 0);
    assert_int_equal(kvpool_prefix_probe(p.w.pool, tok, 39), 36);
    uint64_t w_evictions = stats(&p.w).evictions;
    ws_cached(&p, tok, 40, 4); /* computed again: the windowed commit switches to the old blocks */
    assert_int_equal(stats(&p.w).evictions, w_evictions);
    assert_int_equal(wp_probe(&p, tok, 39, keys), 36);
    wseq b;
    ws_create(&p, &b);
    assert_int_equal(ws_match(&p, &b, tok, 39), 36);
    ws_destroy(&p, &b);
    wp_fini(&p);
}

/* Window-matched blocks are shared like any hit: two sequences hold the same window, a fork of
 * one with a partial last block copies it on the first write, and each side goes on alone. */
static void test_window_match_share_cow(void **state)
{
    (void)state;
    wpair p;
    wp_init(&p, 64, 16, 4, 9);
    int32_t tok[60], t1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, t2[8] = {9, 10, 11, 12, 13, 14, 15, 16};
    seq_tokens(tok, 60, 4000);
    wseq b, c, f;
    ws_cached(&p, tok, 44, 4);
    ws_create(&p, &b);
    ws_create(&p, &c);
    assert_int_equal(ws_match(&p, &b, tok, 43), 40);
    assert_int_equal(ws_match(&p, &c, tok, 43), 40);
    uint32_t held = stats(&p.w).blocks_used;
    assert_int_equal(held, 2); /* [32, 40): blocks 8 and 9, shared; 0..7 released */
    assert_int_equal(ts_append(&p.w, &b.w, t1, 2, NULL), 0);
    assert_int_equal(ts_append(&p.g, &b.g, t1, 2, NULL), 0);
    ts_fork(&p.w, &b.w, &f.w);
    ts_fork(&p.g, &b.g, &f.g);
    assert_int_equal(kvpool_seq_n_released(f.w.s), kvpool_seq_n_released(b.w.s));
    int nc = -1;
    assert_int_equal(ts_append(&p.w, &f.w, t2, 3, &nc), 0); /* shared partial block: copied */
    assert_int_equal(nc, 1);
    assert_int_equal(ts_append(&p.w, &b.w, t1 + 2, 3, &nc), 0);
    assert_int_equal(nc, 0);
    assert_int_equal(ts_append(&p.g, &f.g, t2, 3, &nc), 0);
    assert_int_equal(nc, 1);
    assert_int_equal(ts_append(&p.g, &b.g, t1 + 2, 3, &nc), 0);
    wseq *qs[3] = {&b, &c, &f};
    for (int i = 0; i < 3; i++) {
        uint32_t n = qs[i]->g.len;
        kvpool_seq_commit(p.g.pool, qs[i]->g.s, n);
        kvpool_seq_commit_anchored(p.w.pool, qs[i]->w.s, n, p.g.pool, qs[i]->g.s);
        kvpool_seq_release_before(p.w.pool, qs[i]->w.s, n + 1 - p.window);
        ts_verify(&p.w, &qs[i]->w);
        ts_verify(&p.g, &qs[i]->g);
        assert_int_equal(kvpool_check(p.w.pool), 0);
    }
    ws_destroy(&p, &f);
    ws_destroy(&p, &c);
    /* b's continuation was indexed anchored: it is found as a window too */
    int32_t cont[48];
    memcpy(cont, tok, sizeof(int32_t) * 40);
    memcpy(cont + 40, t1, sizeof(int32_t) * 5);
    ws_destroy(&p, &b);
    uint64_t keys[16];
    assert_int_equal(wp_probe(&p, cont, 45, keys), 44);
    assert_int_equal(stats(&p.w).blocks_used, 0);
    wp_fini(&p);
}

/* A random workload on a pair of pools, as the scheduler drives them: sequences are created
 * with a windowed hit, advance in chunks (commit in both, release behind the window), fork and
 * go. Prompts come from families that differ only in their first block, so equal tokens at
 * equal positions after different prefixes are common (and, in the kvpool_collide build, so
 * are equal chain hashes). A second shadow arena holds, for each windowed slot, a fingerprint
 * of the whole prefix its writer had up to there: a hit that attached a block of another
 * prefix, even one with the same tokens, shows up as a wrong fingerprint. */
#define WR_SEQS 6
#define WR_MAXLEN 120

static uint64_t wr_fingerprint(const int32_t *tok, uint32_t p)
{
    uint64_t h = 1469598103934665603u;
    for (uint32_t i = 0; i <= p; i++)
        h = (h ^ (uint32_t)tok[i]) * 1099511628211u;
    return h;
}

typedef struct wr_seq {
    wseq q;
    int32_t tok[WR_MAXLEN]; /* the whole sequence: prompt, then decode-like tokens */
    uint32_t n_tok;
} wr_seq;

static void wr_write_fp(const wpair *p, uint64_t *fp, const wr_seq *r, uint32_t from)
{
    for (uint32_t pos = from; pos < r->q.w.len; pos++)
        fp[slot_of(&p->w, r->q.w.s, pos)] = wr_fingerprint(r->q.w.tok, pos);
}

static void wr_verify(const wpair *p, const uint64_t *fp, const wr_seq *r)
{
    ts_verify(&p->w, &r->q.w);
    ts_verify(&p->g, &r->q.g);
    uint32_t rel = kvpool_seq_n_released(r->q.w.s);
    for (uint32_t pos = rel * p->w.bs; pos < r->q.w.len; pos++)
        assert_true(fp[slot_of(&p->w, r->q.w.s, pos)] == wr_fingerprint(r->q.w.tok, pos));
}

static void run_window_random(uint32_t bs, uint32_t window, uint32_t w_blocks, uint32_t iters,
                              uint64_t seed)
{
    wpair p;
    wp_init(&p, 400, w_blocks, bs, window);
    uint64_t *fp = calloc((size_t)w_blocks * bs, sizeof *fp);
    assert_non_null(fp);
    rng_state = seed;
    static wr_seq seqs[WR_SEQS];
    uint32_t n_live = 0, n_hits = 0, n_partial_tables = 0;
    for (uint32_t it = 0; it < iters; it++) {
        uint32_t op = rnd(100);
        if (op < 20 && n_live < WR_SEQS) {
            wr_seq *r = &seqs[n_live];
            memset(r, 0, sizeof *r);
            uint32_t fam = rnd(3), body = rnd(12 * bs);
            r->n_tok = WR_MAXLEN;
            for (uint32_t i = 0; i < WR_MAXLEN; i++)
                r->tok[i] = i < bs          ? (int32_t)(fam * 100 + i)
                            : i < bs + body ? (int32_t)(i % 5)
                                            : (int32_t)rnd(3);
            ws_create(&p, &r->q);
            uint32_t want = bs + body + rnd(2 * bs);
            if (want > WR_MAXLEN)
                want = WR_MAXLEN;
            uint32_t k = ws_match(&p, &r->q, r->tok, want);
            n_hits += k > 0;
            n_partial_tables += kvpool_seq_n_released(r->q.w.s) > 0;
            assert_int_equal(r->q.g.len, k);
            n_live++;
        } else if (op < 70 && n_live > 0) {
            wr_seq *r = &seqs[rnd(n_live)];
            uint32_t len = r->q.g.len, n = 1 + rnd(2 * bs + 3);
            if (len + n > WR_MAXLEN)
                continue;
            if (kvpool_seq_blocks_needed(p.g.pool, r->q.g.s, n) > kvpool_available(p.g.pool) ||
                kvpool_seq_blocks_needed(p.w.pool, r->q.w.s, n) > kvpool_available(p.w.pool))
                continue;
            assert_int_equal(ts_append(&p.g, &r->q.g, r->tok + len, n, NULL), 0);
            assert_int_equal(ts_append(&p.w, &r->q.w, r->tok + len, n, NULL), 0);
            wr_write_fp(&p, fp, r, len / bs * bs);
            uint32_t nc = r->q.g.len - rnd(2);
            kvpool_seq_commit(p.g.pool, r->q.g.s, nc);
            kvpool_seq_commit_anchored(p.w.pool, r->q.w.s, nc, p.g.pool, r->q.g.s);
            nc = kvpool_seq_n_computed(r->q.w.s);
            kvpool_seq_release_before(p.w.pool, r->q.w.s, nc + 1 > window ? nc + 1 - window : 0);
        } else if (op < 80 && n_live > 0 && n_live < WR_SEQS) {
            wr_seq *r = &seqs[rnd(n_live)], *f = &seqs[n_live++];
            memcpy(f->tok, r->tok, sizeof r->tok);
            f->n_tok = r->n_tok;
            ts_fork(&p.g, &r->q.g, &f->q.g);
            ts_fork(&p.w, &r->q.w, &f->q.w);
            /* the fork decodes its own tokens from here */
            for (uint32_t i = f->q.g.len; i < WR_MAXLEN; i++)
                f->tok[i] = (int32_t)rnd(3);
        } else if (n_live > 0) {
            uint32_t i = rnd(n_live);
            ws_destroy(&p, &seqs[i].q);
            seqs[i] = seqs[--n_live];
        }
        assert_int_equal(kvpool_check(p.g.pool), 0);
        assert_int_equal(kvpool_check(p.w.pool), 0);
        for (uint32_t i = 0; i < n_live; i++) {
            assert_int_equal(kvpool_seq_len(seqs[i].q.g.s), kvpool_seq_len(seqs[i].q.w.s));
            wr_verify(&p, fp, &seqs[i]);
        }
    }
    /* The workload must have hit through partly released tables and evicted windowed blocks. */
    assert_true(n_hits > iters / 50);
    assert_true(n_partial_tables > 0);
    assert_true(stats(&p.w).evictions > 0);
    while (n_live > 0)
        ws_destroy(&p, &seqs[--n_live].q);
    assert_int_equal(stats(&p.w).blocks_used, 0);
    assert_int_equal(stats(&p.g).blocks_used, 0);
    free(fp);
    wp_fini(&p);
}

static void test_window_random_bs1(void **state)
{
    (void)state;
    run_window_random(1, 7, 40, 3000, 0x13572468u);
}

static void test_window_random_bs4(void **state)
{
    (void)state;
    run_window_random(4, 13, 30, 3000, 0x24681357u);
}

static void test_window_random_bs16(void **state)
{
    (void)state;
    run_window_random(16, 40, 24, 2000, 0x99887766u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_append_across_blocks),
        cmocka_unit_test(test_destroy_and_refcount),
        cmocka_unit_test(test_copy_on_write),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_prefix_hit),
        cmocka_unit_test(test_prefix_hit_live),
        cmocka_unit_test(test_prefix_whole_prompt),
        cmocka_unit_test(test_prefix_concurrent_prefill),
        cmocka_unit_test(test_prefix_after_cow),
        cmocka_unit_test(test_prefix_disabled),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_lru_chain),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_random_bs1),
        cmocka_unit_test(test_random_bs16),
        cmocka_unit_test(test_random_bs64),
        cmocka_unit_test(test_block_states),
        cmocka_unit_test(test_release_before),
        cmocka_unit_test(test_release_fork_cow),
        cmocka_unit_test(test_release_no_prefix),
        cmocka_unit_test(test_random_window_bs1),
        cmocka_unit_test(test_random_window_bs4),
        cmocka_unit_test(test_random_window_bs16),
        cmocka_unit_test(test_window_match_long),
        cmocka_unit_test(test_window_match_evicted_middle),
        cmocka_unit_test(test_window_match_no_alias),
        cmocka_unit_test(test_window_match_after_global_recompute),
        cmocka_unit_test(test_window_match_share_cow),
        cmocka_unit_test(test_window_random_bs1),
        cmocka_unit_test(test_window_random_bs4),
        cmocka_unit_test(test_window_random_bs16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
