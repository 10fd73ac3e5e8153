/* kvpool: the paged KV cache's bookkeeping. A fixed pool of blocks, each holding block_size
 * token slots; sequences own block tables that map logical block i to a physical block id.
 *
 * The pool knows ids, refcounts and token ids, never K/V memory: whoever owns the memory
 * (the engine's KV arena) stores token at position p of a sequence in slot
 *     blocks[p / block_size] * block_size + p % block_size
 * and performs the block copies kvpool asks for on copy-on-write.
 *
 * Block states (invariant: used + cached + free == total after every call):
 *   used   refcount > 0, in one or more block tables
 *   cached refcount 0 but full and indexed by its prefix hash: findable by a later
 *          sequence with the same prefix until evicted, least recently released first
 *   free   refcount 0 and holding nothing anyone can find
 * (kvpool_seq_release_before lets a table drop its leading blocks: see there.)
 * Prefix hashes chain: hash(block i) = H(hash(block i-1), token ids of block i), and a hit
 * also compares the stored token ids and parent, so a hash collision can never alias (a
 * windowed match compares token ids and an anchor instead of the parent: see there).
 *
 * Not thread-safe: one owner thread (the engine thread) calls everything. */
#ifndef KVS_KVPOOL_KVPOOL_H
#define KVS_KVPOOL_KVPOOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvpool kvpool;
typedef struct kvpool_seq kvpool_seq;

typedef struct kvpool_params {
    uint32_t n_blocks;   /* > 0 */
    uint32_t block_size; /* tokens per block, > 0 (default 16) */
    bool prefix_cache;   /* index full blocks for reuse (default true) */
} kvpool_params;

typedef struct kvpool_stats {
    uint32_t blocks_total;
    uint32_t blocks_used;
    uint32_t blocks_cached;
    uint32_t blocks_free;
    uint64_t
        tokens_stored; /* token slots filled across live sequences (shared counted once per seq) */
    uint64_t slots_waste;    /* slots reserved in used blocks but not filled by any sequence */
    uint64_t prefix_queries; /* blocks looked up by kvpool_seq_match_prefix or
                              * kvpool_seq_match_window (every full block of the tokens
                              * passed, so hits / queries is the hit rate) */
    uint64_t prefix_hits;    /* blocks found */
    uint64_t evictions;      /* cached blocks reused for new data */
} kvpool_stats;

/* One block copy the caller must perform (K and V, all layers) before writing to dst. */
typedef struct kvpool_copy {
    int32_t src;
    int32_t dst;
} kvpool_copy;

/* Creates a pool; on error returns KVS_EINVAL or KVS_ENOMEM and *out is NULL. */
int kvpool_create(const kvpool_params *p, kvpool **out);
/* Destroys the pool; live sequences must be destroyed first. NULL is a no-op. */
void kvpool_destroy(kvpool *pool);

uint32_t kvpool_block_size(const kvpool *pool);
void kvpool_get_stats(const kvpool *pool, kvpool_stats *st);
/* Number of blocks an allocation could obtain now (free + evictable cached). */
uint32_t kvpool_available(const kvpool *pool);

/* New empty sequence. */
int kvpool_seq_create(kvpool *pool, kvpool_seq **out);
/* Releases all the sequence's blocks (refcount--; full hashed blocks become cached, others
 * free) and destroys it. NULL is a no-op. */
void kvpool_seq_destroy(kvpool *pool, kvpool_seq *seq);

/* New sequence sharing every block of src (refcounts++), including a partly filled last
 * block, which is copied on the first write by either side. KVS_ENOMEM only. */
int kvpool_seq_fork(kvpool *pool, const kvpool_seq *src, kvpool_seq **out);

/* For an empty seq: attaches the longest run of cached or live full blocks whose tokens equal
 * tokens[0..n), block by block from the start. Returns the number of tokens now covered (a
 * multiple of block_size, <= n); those positions are already computed and committed. Pass
 * n = prompt length - 1 so at least one token is left to compute logits from. */
uint32_t kvpool_seq_match_prefix(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n);

/* For an empty seq, the whole prompt tokens[0..n): kvpool_seq_match_prefix(tokens, n), except
 * that a hit of all n tokens is stepped back one position, which the caller computes again for
 * the last token's logits (as llama.cpp's server does; vLLM's cache leaves the whole last block
 * to compute). The hit's last block then stays in the table one position short, full and
 * indexed, and the next kvpool_seq_append copies it (copy-on-write) before writing that
 * position. Returns the positions covered, at most n - 1. */
uint32_t kvpool_seq_match_prompt(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n);

/* The tokens kvpool_seq_match_prefix(tokens, n) would cover now, changing nothing (no
 * reference, no counter). */
uint32_t kvpool_prefix_probe(const kvpool *pool, const int32_t *tokens, uint32_t n);
/* As kvpool_prefix_probe, and keys[i] (room for n / block_size) gets a key for the block that
 * holds block i of the hit: equal keys mean the same block holding the same prefix (its id
 * and the generation it was taken at), until that block is evicted. keys may be NULL. */
uint32_t kvpool_prefix_keys(const kvpool *pool, const int32_t *tokens, uint32_t n, uint64_t *keys);

/* Windowed matches (a pool backing sliding-window layers, next to a global pool that holds
 * every block). Such a pool is small and evicts a long prompt's early blocks, so a walk from
 * the first block finds little; but a windowed layer only needs the blocks inside the window
 * that ends at the hit. Blocks are therefore anchored: committed with
 * kvpool_seq_commit_anchored, each records the global pool's key for the same position of the
 * same sequence, and a match looks the window's blocks up by those keys, which the global
 * pool's own exact walk (kvpool_prefix_keys) produced. A key names one block at one
 * generation, hence one prefix: a chain-hash collision can never alias two prefixes, even for
 * a block whose parent was evicted (the hash only picks the bucket). Keys are 32-bit
 * generations: one block would have to be retaken 2^32 times between a commit and a match for
 * a key to repeat. */

/* As kvpool_seq_commit, and each block it indexes records as anchor the key of the same
 * block of aseq in apool (the global pool's table of the same sequence, committed first); so
 * does a block it finds indexed already with no anchor, or with one whose global block was
 * retaken since (that prefix computed again there under a new key). apool and aseq may be
 * NULL (no anchors: kvpool_seq_commit). */
void kvpool_seq_commit_anchored(kvpool *pool, kvpool_seq *seq, uint32_t n_computed,
                                const kvpool *apool, const kvpool_seq *aseq);

/* The longest hit e <= n (a multiple of block_size) such that the blocks covering
 * [e + 1 - window, e), the positions the next row (e) reads in a layer of that window, are all
 * cached here for tokens[0..e); keys[] are kvpool_prefix_keys' for the global pool over the
 * same tokens, n at most what it covered. Changes nothing. Always at least the hit's last
 * block (the next block to be indexed names it as parent). */
uint32_t kvpool_window_probe(const kvpool *pool, const int32_t *tokens, uint32_t n, uint32_t window,
                             const uint64_t *keys);

/* For an empty seq: attaches the blocks kvpool_window_probe(tokens, n, window, keys) finds;
 * the table's entries before them are released placeholders (-1), as after
 * kvpool_seq_release_before. Returns the tokens covered (positions already computed). Counts
 * n / block_size queries and, as hits, the blocks of the prompt the hit covers. */
uint32_t kvpool_seq_match_window(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n,
                                 uint32_t window, const uint64_t *keys);

/* Sliding-window reclaim: releases (refcount--) the seq's blocks wholly before position pos,
 * from the first unreleased one on; their table entries become -1 and stay so (the table keeps
 * its logical indexing). Never releases the last block, a block past n_computed, nor (with the
 * prefix cache) the last indexed block, which the next block to be indexed names as parent: so
 * a window of w positions holds at most ceil(w / block_size) + 2 blocks. A released full
 * block that is indexed stays cached (findable) until evicted; its still-held children then
 * become orphans that no match from the root reaches (a windowed match still does, by their
 * anchors). Only for pools that back windowed layers: the released
 * positions are gone for good. Returns the number of blocks released. */
uint32_t kvpool_seq_release_before(kvpool *pool, kvpool_seq *seq, uint32_t pos);
/* Leading table entries released so far. */
uint32_t kvpool_seq_n_released(const kvpool_seq *seq);

/* Blocks that kvpool_seq_append(seq, n) would have to take from the pool (including a
 * copy-on-write of a shared last block). */
uint32_t kvpool_seq_blocks_needed(const kvpool *pool, const kvpool_seq *seq, uint32_t n);

/* Reserves slots for n more tokens (positions len..len+n-1) and records their ids. If the
 * last block is shared and partly filled (or a stepped-back hit's, kvpool_seq_match_prompt) it
 * is first replaced by a private copy: *copy is set to {src, dst} and *n_copy to 1 (else 0);
 * the caller copies K/V before its forward pass.
 * All or nothing: KVS_ENOSPC (too few blocks), KVS_ENOMEM (table growth), KVS_ERANGE (length
 * overflow) and KVS_EINVAL (a copy is due but copy or n_copy is NULL) leave seq and pool
 * unchanged. */
int kvpool_seq_append(kvpool *pool, kvpool_seq *seq, const int32_t *tokens, uint32_t n,
                      kvpool_copy *copy, int *n_copy);

/* Marks the first n_computed positions as holding K/V (after the forward pass wrote them):
 * blocks that are now full are entered into the prefix index. A full block whose prefix
 * another sequence already indexed is replaced in the block table by that indexed block
 * (same tokens after the same prefix, so equivalent K/V) and goes back to the pool: re-read
 * the table after committing. Positions >= n_computed keep their slots. n_computed <= length. */
void kvpool_seq_commit(kvpool *pool, kvpool_seq *seq, uint32_t n_computed);

/* Length in tokens (reserved), and the block table (valid until the next call that changes
 * seq). */
uint32_t kvpool_seq_len(const kvpool_seq *seq);
uint32_t kvpool_seq_n_computed(const kvpool_seq *seq);
const int32_t *kvpool_seq_blocks(const kvpool_seq *seq, uint32_t *n_blocks);

/* For pictures of the pool: the state of blocks [first, first + n) into state[] (0 free,
 * 1 cached, 2 used) and their refcounts into refs[] (saturating at 65535); either may be NULL.
 * Clamped to the pool; returns the number of blocks written. O(n), reads only. */
uint32_t kvpool_block_states(const kvpool *pool, uint32_t first, uint32_t n, uint8_t *state,
                             uint16_t *refs);

/* Checks every invariant (refcounts match block tables, counts add up, index consistent);
 * returns 0 or KVS_EINVAL. For tests. */
int kvpool_check(const kvpool *pool);

#endif
