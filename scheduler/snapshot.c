/* Pictures of the KV pool for people (the web page's grid): the taker allocates the buffers
 * and posts the snapshot; the engine thread fills it between two steps, so block states,
 * holders and the running list are from one moment, and the engine never allocates for it. */
#include "common/status.h"
#include "common/timeutil.h"
#include "scheduler/sched_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void sched__fill_snapshot(sched *s, sched_kv_snapshot *snap)
{
    double t0 = time_now_s();
    kvpool_block_states(s->pool, 0, snap->n_blocks, snap->state, snap->refs);
    for (uint32_t i = 0; i < snap->n_blocks; i++)
        snap->owner[i] = -1;
    uint32_t k = 0;
    /* running is in admission order: the first holder found is the oldest */
    for (seq *q = s->running.head; q && k < s->p.max_num_seqs; q = q->next, k++) {
        uint32_t nb = 0;
        const int32_t *blocks = q->kv ? kvpool_seq_blocks(q->kv, &nb) : NULL;
        for (uint32_t b = 0; b < nb; b++)
            if (blocks[b] >= 0 && (uint32_t)blocks[b] < snap->n_blocks &&
                snap->owner[blocks[b]] < 0)
                snap->owner[blocks[b]] = (int32_t)k;
        uint32_t nw = 0;
        if (q->wkv) {
            kvpool_seq_blocks(q->wkv, &nw);
            nw -= kvpool_seq_n_released(q->wkv);
        }
        snap->seqs[k] = (sched_kv_seq){.request = q->req->serial,
                                       .choice = q->choice,
                                       .n_tokens = q->n_tokens,
                                       .n_blocks = nb,
                                       .n_window_blocks = nw};
    }
    kvpool_stats st;
    kvpool_get_stats(s->pool, &st);
    snap->bytes_used = (uint64_t)st.blocks_used * s->block_bytes;
    snap->window = s->window;
    if (s->wpool) {
        kvpool_get_stats(s->wpool, &st);
        snap->n_window_blocks = st.blocks_total;
        snap->window_used = st.blocks_used;
        snap->window_cached = st.blocks_cached;
        snap->bytes_used += (uint64_t)st.blocks_used * s->wblock_bytes;
    }
    snap->n_seqs = k;
    snap->n_waiting = s->waiting.n;
    pthread_mutex_lock(&s->metrics_mu);
    snap->steps = s->m.steps_total;
    pthread_mutex_unlock(&s->metrics_mu);
    snap->fill_seconds = time_now_s() - t0;
}

void sched_kv_snapshot_free(sched_kv_snapshot *snap)
{
    if (!snap)
        return;
    free(snap->state);
    free(snap->refs);
    free(snap->owner);
    free(snap->seqs);
    memset(snap, 0, sizeof *snap);
}

int sched_kv_snapshot_take(sched *s, sched_kv_snapshot *out, int timeout_ms)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->snap_mu);
    /* sizes fixed at create: the pool itself is the engine thread's alone */
    out->n_blocks = s->n_blocks;
    out->block_size = s->p.block_size;
    out->state = malloc(out->n_blocks);
    out->refs = malloc(out->n_blocks * sizeof *out->refs);
    out->owner = malloc(out->n_blocks * sizeof *out->owner);
    out->seqs = malloc(s->p.max_num_seqs * sizeof *out->seqs);
    if (!out->state || !out->refs || !out->owner || !out->seqs) {
        pthread_mutex_unlock(&s->snap_mu);
        sched_kv_snapshot_free(out);
        return KVS_ENOMEM;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&s->inbox_mu);
    if (s->stop || !s->thread_started) {
        rc = KVS_EBUSY;
    } else {
        s->snap_want = out;
        s->snap_state = SNAP_POSTED;
        pthread_cond_signal(&s->inbox_cv);
        bool timed_out = false;
        for (;;) {
            if (s->snap_state == SNAP_DONE)
                break;
            if (s->snap_state == SNAP_POSTED && (s->stop || timed_out)) {
                s->snap_want = NULL; /* not taken yet: withdraw it */
                rc = KVS_EBUSY;
                break;
            }
            /* TAKEN: the engine thread is filling it and will say DONE shortly */
            if (pthread_cond_timedwait(&s->snap_cv, &s->inbox_mu, &until) == ETIMEDOUT)
                timed_out = true;
        }
        s->snap_state = SNAP_IDLE;
    }
    pthread_mutex_unlock(&s->inbox_mu);
    pthread_mutex_unlock(&s->snap_mu);
    if (rc)
        sched_kv_snapshot_free(out);
    return rc;
}
