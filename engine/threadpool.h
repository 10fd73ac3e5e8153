/* A small persistent worker pool for the engine's forward pass: tpool_run calls fn on every
 * thread of the pool (the caller is thread 0) and returns when all calls have returned.
 * Workers spin briefly for the next job (a forward pass posts ~100 jobs back to back), then
 * sleep on a condition variable, so an idle engine costs no CPU.
 * Threads: a pool is driven by one thread at a time (the engine thread); fn runs concurrently
 * on n threads and must split its work by ith / nth itself. */
#ifndef KVS_ENGINE_THREADPOOL_H
#define KVS_ENGINE_THREADPOOL_H

#include <stdint.h>

typedef struct tpool tpool;
typedef void (*tpool_fn)(void *arg, uint32_t ith, uint32_t nth);
typedef void (*tpool_item_fn)(void *arg, uint32_t item, uint32_t ith);

/* n_threads >= 1 counting the caller; starts n_threads - 1 workers. KVS_ENOMEM, KVS_EINVAL. */
int tpool_create(uint32_t n_threads, tpool **out);
/* Stops and joins the workers. NULL is a no-op. */
void tpool_destroy(tpool *p);
uint32_t tpool_n_threads(const tpool *p);
/* Runs fn(arg, ith, nth) for ith = 0..nth-1, ith 0 on the calling thread; returns after all. */
void tpool_run(tpool *p, tpool_fn fn, void *arg);
/* Runs fn(arg, item, ith) once for each item in 0..n_items-1 and returns after all. Thread ith
 * first takes, in order, its own contiguous run of the items (the ith of n equal runs), so that
 * consecutive items (adjacent slices of one weight matrix) stream through one core and its
 * prefetches; a thread done with its run then takes items from the far end of the others' runs,
 * so a thread the OS preempts holds up at most the item it is in. Which thread runs an item
 * varies from run to run: fn must give the same result whichever does. */
void tpool_run_items(tpool *p, uint32_t n_items, tpool_item_fn fn, void *arg);

#endif
