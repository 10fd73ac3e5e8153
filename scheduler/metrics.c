/* The scheduler's counters, gauges and histograms, and the snapshot /metrics reads. metrics_mu
 * guards them; the engine thread writes, any thread reads. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "kvpool/kvpool.h"

#include <pthread.h>
#include <string.h>

static void hist_init(sched_hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof(double));
}

void sched__hist_add(sched_hist *h, double v)
{
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void sched__init_metrics(sched_metrics *m)
{
    static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                  0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
    static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03,
                                 0.04,  0.05,   0.075, 0.1,  0.15,  0.2,  0.3,   0.5};
    static const double e2e[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  2.5,
                                 5.0,  10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0};
    static const double bs[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    memset(m, 0, sizeof *m);
    hist_init(&m->time_to_first_token_seconds, ttft, 16);
    hist_init(&m->inter_token_latency_seconds, itl, 16);
    hist_init(&m->e2e_request_latency_seconds, e2e, 16);
    hist_init(&m->batch_size, bs, 10);
}

void sched__update_gauges(sched *s)
{
    kvpool_stats st;
    kvpool_get_stats(s->pool, &st);
    pthread_mutex_lock(&s->metrics_mu);
    s->m.num_requests_running = s->running.n;
    s->m.num_requests_waiting = s->waiting.n;
    s->m.kv_blocks_total = st.blocks_total;
    s->m.kv_blocks_used = st.blocks_used;
    s->m.kv_blocks_cached = st.blocks_cached;
    s->m.kv_cache_usage_ratio = st.blocks_total ? (double)st.blocks_used / st.blocks_total : 0;
    s->m.kv_bytes_capacity = (uint64_t)st.blocks_total * s->block_bytes;
    s->m.kv_bytes_used = (uint64_t)st.blocks_used * s->block_bytes;
    s->m.prefix_cache_queries_total = st.prefix_queries;
    s->m.prefix_cache_hits_total = st.prefix_hits;
    if (s->wpool) {
        /* A prefix hit counts once, in the global group (the windowed one looks up the same
         * blocks again, for the same hit). */
        kvpool_stats ws;
        kvpool_get_stats(s->wpool, &ws);
        s->m.kv_window_blocks_total = ws.blocks_total;
        s->m.kv_window_blocks_used = ws.blocks_used;
        s->m.kv_window_blocks_cached = ws.blocks_cached;
        s->m.kv_bytes_capacity += (uint64_t)ws.blocks_total * s->wblock_bytes;
        s->m.kv_bytes_used += (uint64_t)ws.blocks_used * s->wblock_bytes;
    }
    pthread_mutex_unlock(&s->metrics_mu);
}

void sched_get_metrics(sched *s, sched_metrics *m)
{
    pthread_mutex_lock(&s->metrics_mu);
    *m = s->m;
    pthread_mutex_unlock(&s->metrics_mu);
}
