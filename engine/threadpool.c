/* Persistent worker pool. Invariants: gen changes only under mu (so a sleeping worker cannot
 * miss a job), pending counts workers still inside the current job, and a new job is posted
 * only after pending reached 0. tpool_run_items: run t's span packs the next item its owner
 * takes (low 32 bits) and the end of the items left in it (high 32); the owner takes from the
 * front with one fetch_add, others from the back with a compare-exchange, so each item is taken
 * exactly once and the two ends meet only when the run is nearly done. */
#include "engine/threadpool.h"

#include "common/status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ~20-50 us of polling: covers the gap between two jobs of one step, short enough that an
 * idle pool, or one sharing its cores with other processes, soon sleeps. */
#define SPIN_ITERS 4096

/* One thread's run of items, alone in its cache line: its owner updates it for every item. */
typedef struct item_run {
    _Alignas(64) _Atomic uint64_t span;
} item_run;

typedef struct worker {
    tpool *pool;
    uint32_t ith;
    pthread_t th;
} worker;

struct tpool {
    uint32_t n;
    worker *workers; /* n - 1 */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    atomic_uint gen;
    atomic_uint pending;
    atomic_bool stop;
    tpool_fn fn;
    void *arg;
    item_run *runs; /* n */
    tpool_item_fn item_fn;
    void *item_arg;
};

static void *worker_main(void *a)
{
    worker *w = a;
    tpool *p = w->pool;
    unsigned seen = 0; /* gen at creation: a job posted before this thread ran still counts */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        p->fn(p->arg, w->ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int tpool_create(uint32_t n_threads, tpool **out)
{
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024)
        return KVS_EINVAL;
    tpool *p = calloc(1, sizeof *p);
    if (!p)
        return KVS_ENOMEM;
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->runs = aligned_alloc(_Alignof(item_run), n_threads * sizeof *p->runs);
    if (!p->runs) {
        tpool_destroy(p);
        return KVS_ENOMEM;
    }
    if (n_threads > 1) {
        p->workers = calloc(n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            tpool_destroy(p);
            return KVS_ENOMEM;
        }
    }
    for (uint32_t i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (pthread_create(&w->th, NULL, worker_main, w)) {
            p->n = i; /* join only the ones started */
            tpool_destroy(p);
            return KVS_ENOMEM;
        }
    }
    *out = p;
    return 0;
}

void tpool_destroy(tpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++)
        pthread_join(p->workers[i - 1].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->workers);
    free(p->runs);
    free(p);
}

uint32_t tpool_n_threads(const tpool *p)
{
    return p->n;
}

void tpool_run(tpool *p, tpool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) && spins < SPIN_ITERS) {
        cpu_relax();
        spins++;
    }
    if (atomic_load(&p->pending)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending))
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

#define SPAN(next, end) ((uint64_t)(end) << 32 | (next))

static void items_worker(void *arg, uint32_t ith, uint32_t nth)
{
    tpool *p = arg;
    /* Own run, front to back. A take past the end leaves next > end: the run stays empty. */
    for (;;) {
        uint64_t s = atomic_fetch_add_explicit(&p->runs[ith].span, 1, memory_order_relaxed);
        if ((uint32_t)s >= (uint32_t)(s >> 32))
            break;
        p->item_fn(p->item_arg, (uint32_t)s, ith);
    }
    /* The others' runs, back to front. A run once empty stays empty, so one pass suffices. */
    for (uint32_t k = 1; k < nth; k++) {
        _Atomic uint64_t *span = &p->runs[(ith + k) % nth].span;
        uint64_t s = atomic_load_explicit(span, memory_order_relaxed);
        for (;;) {
            uint32_t next = (uint32_t)s, end = (uint32_t)(s >> 32);
            if (next >= end)
                break;
            if (atomic_compare_exchange_weak_explicit(span, &s, SPAN(next, end - 1),
                                                      memory_order_relaxed, memory_order_relaxed)) {
                p->item_fn(p->item_arg, end - 1, ith);
                s = atomic_load_explicit(span, memory_order_relaxed);
            }
        }
    }
}

void tpool_run_items(tpool *p, uint32_t n_items, tpool_item_fn fn, void *arg)
{
    /* Relaxed stores: tpool_run publishes them to the workers with the job (gen's release). */
    for (uint32_t t = 0; t < p->n; t++) {
        uint64_t lo = (uint64_t)n_items * t / p->n, hi = (uint64_t)n_items * (t + 1) / p->n;
        atomic_store_explicit(&p->runs[t].span, SPAN(lo, hi), memory_order_relaxed);
    }
    p->item_fn = fn;
    p->item_arg = arg;
    tpool_run(p, items_worker, p);
}
