/* Planning one step: which sequences run, with how many tokens, within max_batched_tokens and
 * the pool's blocks; admission from the waiting queue and preemption when the pool runs dry.
 * Engine thread only. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/status.h"
#include "kvpool/kvpool.h"

#include <pthread.h>
#include <string.h>

/* Frees a running sequence's blocks and requeues it at the head of the waiting queue. */
void sched__preempt(sched *s, seq *q)
{
    sched__list_remove(&s->running, q);
    sched__kv_free(s, q);
    q->n_computed = 0;
    if (q->pool) { /* its rows come again */
        memset(q->pool, 0, s->n_embd * sizeof *q->pool);
        q->pool_n = 0;
    }
    q->state = SEQ_WAITING;
    sched__list_push_front(&s->waiting, q);
    pthread_mutex_lock(&s->metrics_mu);
    s->m.preemptions_total++;
    pthread_mutex_unlock(&s->metrics_mu);
    log_debug("scheduler: preempted a sequence of %u tokens", q->n_tokens);
}

/* Reserves slots for q's next chunk (tokens[n_computed .. n_computed + chunk)). A decode
 * (may_preempt) that finds the pool dry preempts the newest running sequence not yet planned
 * into this step, possibly q itself. Returns 0, or KVS_ENOSPC if q cannot run this step. */
static int reserve_chunk(sched *s, seq *q, uint32_t chunk, bool may_preempt)
{
    for (;;) {
        int rc = sched__kv_reserve(s, q, chunk);
        if (rc == 0)
            return 0;
        if (rc == KVS_EIO && q->state == SEQ_RUNNING) {
            sched__preempt(s, q); /* its groups disagree now: recompute it from scratch */
            return KVS_ENOSPC;
        }
        if (rc != KVS_ENOSPC || !may_preempt)
            return rc;
        seq *victim = NULL;
        for (seq *v = s->running.head; v; v = v->next)
            if (v->chunk == 0 && (!victim || v->admit_order > victim->admit_order))
                victim = v;
        if (!victim)
            return KVS_ENOSPC;
        sched__preempt(s, victim);
        if (victim == q)
            return KVS_ENOSPC;
    }
}

/* Adds q's planned chunk to the batch arrays. */
static void batch_add(sched *s, seq *q, uint32_t chunk, uint32_t *n_rows, uint32_t *n_seqs)
{
    uint32_t si = (*n_seqs)++;
    s->b_seqs[si] = q;
    q->chunk = chunk;
    q->plp_n = 0;
    q->hid_n = 0;
    bool plp = sched__plp_pending(q);
    engine_pooling embed = q->req->embed;
    uint32_t n_prompt = q->req->n_prompt;
    for (uint32_t i = 0; i < chunk; i++) {
        uint32_t p = q->n_computed + i;
        /* row p's logits give prompt token p + 1's logprob */
        bool plp_row = plp && p + 1 < n_prompt && p >= q->plp_done;
        if (plp_row && !q->plp_n++)
            q->plp_lo = p;
        /* an embedding pools hidden states and wants no logits */
        bool hid = (embed == ENGINE_POOLING_MEAN && p < n_prompt) ||
                   (embed == ENGINE_POOLING_CLS && p == 0) ||
                   (embed == ENGINE_POOLING_LAST && p == n_prompt - 1);
        q->hid_n += hid;
        s->b_token[*n_rows] = q->tokens[p];
        s->b_pos[*n_rows] = (int32_t)p;
        s->b_seq[*n_rows] = (int32_t)si;
        s->b_logits[*n_rows] = !embed && (p == q->n_tokens - 1 || plp_row);
        s->b_hidden[*n_rows] = hid;
        (*n_rows)++;
    }
    s->plp_rows_left -= q->plp_n; /* at most chunk, which plp_cap held to what is left */
}

/* A chunk of q's prefill cut to the prompt-logprob rows this step has left (any of its rows
 * may be one); 0 if none are left. */
static uint32_t plp_cap(const sched *s, const seq *q, uint32_t chunk)
{
    if (sched__plp_pending(q) && chunk > s->plp_rows_left)
        return s->plp_rows_left;
    return chunk;
}

/* Plans one step: decodes first (one token each, oldest first, preempting the newest when
 * the pool is dry), then prefill chunks of running sequences, then admissions from the
 * waiting queue, all within max_batched_tokens. Returns the number of sequences planned. */
uint32_t sched__plan_step(sched *s, uint32_t *n_rows_out)
{
    uint32_t budget = s->p.max_batched_tokens, n_rows = 0, n_seqs = 0;
    s->n_copies = 0;
    s->plp_rows_left = s->plp_rows;
    for (seq *q = s->running.head; q; q = q->next)
        q->chunk = 0;
    /* running is in admission order, so this walks oldest first */
    uint32_t max_seqs = s->p.max_num_seqs;
    for (seq *q = s->running.head, *next; q && budget && n_seqs < max_seqs; q = next) {
        next = q->next;
        if (q->chunk || q->n_tokens - q->n_computed != 1)
            continue;
        if (reserve_chunk(s, q, 1, true) == 0) {
            batch_add(s, q, 1, &n_rows, &n_seqs);
            budget--;
        }
        /* preemption may have removed next: restart from a safe point */
        if (next && next->state != SEQ_RUNNING)
            next = s->running.head;
    }
    for (seq *q = s->running.head; q && budget && n_seqs < max_seqs; q = q->next) {
        if (q->chunk || q->n_tokens - q->n_computed <= 1)
            continue;
        uint32_t chunk = q->n_tokens - q->n_computed;
        if (chunk > budget)
            chunk = budget;
        chunk = plp_cap(s, q, chunk);
        if (chunk && reserve_chunk(s, q, chunk, false) == 0) {
            batch_add(s, q, chunk, &n_rows, &n_seqs);
            budget -= chunk;
        }
    }
    /* A first choice brings its n - 1 forks once its prompt is computed: they hold seats
     * from its admission on, so forks never take the running count over max_num_seqs. */
    uint32_t seats_held = s->running.n;
    for (seq *q = s->running.head; q; q = q->next)
        if (q->fork_pending)
            seats_held += q->req->n - 1;
    while (s->waiting.head && n_seqs < max_seqs && budget) {
        seq *q = s->waiting.head;
        /* Admit only when all of the request's seats fit. The queue stays first come, first
         * served: later requests wait behind it. */
        uint32_t seats = q->fork_pending ? q->req->n : 1;
        if (seats_held + seats > max_seqs)
            break;
        if (sched__kv_create(s, q))
            break;
        /* Rows whose prompt logprobs or hidden states are wanted are computed, never taken
         * from the cache (an embedding pooling the last row only may take the rest). */
        uint32_t covered = 0;
        engine_pooling embed = q->req->embed;
        bool all_rows =
            sched__plp_pending(q) || embed == ENGINE_POOLING_MEAN || embed == ENGINE_POOLING_CLS;
        if (!all_rows && sched__kv_match_prefix(s, q, &covered))
            break;
        uint32_t chunk = q->n_tokens - covered;
        if (chunk > budget)
            chunk = budget;
        chunk = plp_cap(s, q, chunk);
        if (!chunk) {
            sched__kv_free(s, q);
            break;
        }
        q->n_computed = covered;
        /* Admit only if the pools can hold all of what is known of it now. */
        if (!sched__kv_fits(s, q, q->n_tokens - covered) ||
            reserve_chunk(s, q, chunk, false) != 0) {
            sched__kv_free(s, q);
            q->n_computed = 0;
            break;
        }
        sched__list_remove(&s->waiting, q);
        seats_held += seats;
        q->state = SEQ_RUNNING;
        q->admit_order = ++s->admit_counter;
        sched__list_push_back(&s->running, q);
        sched_req *r = q->req;
        if (!q->ever_admitted) {
            q->ever_admitted = true;
            r->cached_tokens = covered;
            pthread_mutex_lock(&s->inbox_mu);
            s->n_queued--;
            pthread_mutex_unlock(&s->inbox_mu);
            pthread_mutex_lock(&s->metrics_mu);
            s->m.prompt_tokens_total += q->n_tokens;
            pthread_mutex_unlock(&s->metrics_mu);
        }
        batch_add(s, q, chunk, &n_rows, &n_seqs);
        budget -= chunk;
    }
    *n_rows_out = n_rows;
    return n_seqs;
}
