/* The engine thread: take the inbox, drop cancelled requests, plan -> forward -> output, and
 * KV snapshots between steps. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/status.h"
#include "kvpool/kvpool.h"

#include <pthread.h>
#include <stdatomic.h>

static void finish_all(sched *s, seq_list *l, int status)
{
    while (l->head)
        sched__finish_seq(s, l, l->head, SCHED_FINISH_ERROR, status);
}

static void drop_released(sched *s, seq_list *l)
{
    for (seq *q = l->head, *next; q; q = next) {
        next = q->next;
        if (atomic_load(&q->req->released)) {
            if (!q->ever_admitted) {
                pthread_mutex_lock(&s->inbox_mu);
                s->n_queued--;
                pthread_mutex_unlock(&s->inbox_mu);
            }
            sched__finish_seq(s, l, q, SCHED_FINISH_ERROR, KVS_ECANCELED);
            next = l->head; /* finish_seq may have touched other entries' requests only */
        }
    }
}

/* One step over the planned batch. */
static void run_step(sched *s)
{
    uint32_t n_rows = 0;
    uint32_t n_seqs = sched__plan_step(s, &n_rows);
    if (n_seqs == 0) {
        /* Every running sequence is mid-prefill and the pool is dry: make room. */
        seq *victim = NULL;
        for (seq *v = s->running.head; v; v = v->next)
            if (!victim || v->admit_order > victim->admit_order)
                victim = v;
        if (victim && s->running.n > 1)
            sched__preempt(s, victim);
        return;
    }
    for (int i = 0; i < s->n_copies; i++)
        engine_kv_copy_block(s->kv, s->copy_group[i], s->copies[i].src, s->copies[i].dst);
    int n_logits = 0, n_hidden = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        sched__kv_view(s, q, &s->b_views[i]);
        /* A sequence's marked rows come in position order: prompt-logprob rows, then its
         * last (batch_add); an embedding's rows are hidden states only */
        q->plp_row = n_logits;
        n_logits += (int)q->plp_n;
        q->logits_row = !q->req->embed && q->n_computed + q->chunk == q->n_tokens ? n_logits++ : -1;
        q->hid_row = n_hidden;
        n_hidden += (int)q->hid_n;
    }
    engine_batch b = {n_rows, s->b_token, s->b_pos, s->b_seq, s->b_logits, n_seqs, s->b_views};
    int rc = engine_forward_hidden(s->ctx, s->kv, &b, s->logits, n_hidden ? s->b_hidden : NULL,
                                   s->hidden);
    if (s->p.fail_step && s->m.steps_total + 1 == s->p.fail_step)
        rc = KVS_EIO; /* fault injection for tests: see sched_params.fail_step */
    if (rc) {
        log_error("scheduler: forward pass failed: %s", status_str(rc));
        pthread_mutex_lock(&s->metrics_mu);
        s->m.steps_total++;
        pthread_mutex_unlock(&s->metrics_mu);
        for (uint32_t i = 0; i < n_seqs; i++)
            sched__finish_seq(s, &s->running, s->b_seqs[i], SCHED_FINISH_ERROR, rc);
        return;
    }
    float *scratch = s->logits + (size_t)s->logits_rows * s->n_vocab;
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        q->n_computed += q->chunk;
        sched__kv_commit(s, q);
    }
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        if (sched__plp_pending(q))
            sched__plp_collect(s, q, s->logits);
        if (q->req->embed) {
            sched__embed_collect(s, q); /* may finish it */
            continue;
        }
        if (q->logits_row < 0)
            continue;
        const float *row = s->logits + (size_t)q->logits_row * s->n_vocab;
        if (q->req->max_tokens == 0) {
            /* the prompt only: every choice ends here (the forks with it, never made) */
            sched__finish_seq(s, &s->running, q, SCHED_FINISH_LENGTH, 0);
            continue;
        }
        if (q->fork_pending) {
            seq *last = s->running.tail;
            sched__fork_choices(s, q);
            /* The forks sample from the same prompt logits. A fork can finish on this first
             * token (max_tokens 1, a stop string, EOS), and finishing frees it: take the next
             * link before sampling. */
            for (seq *f = last->next, *next; f; f = next) {
                next = f->next;
                if (f->req == q->req && f->logits_row == q->logits_row && f != q)
                    sched__sample_and_emit(s, f, row, scratch);
            }
        }
        sched__sample_and_emit(s, q, row, scratch);
    }
    pthread_mutex_lock(&s->metrics_mu);
    s->m.steps_total++;
    if (n_seqs > 1)
        s->m.multi_seq_steps_total++;
    sched__hist_add(&s->m.batch_size, n_seqs);
    pthread_mutex_unlock(&s->metrics_mu);
}

void *sched__engine_main(void *arg)
{
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->inbox_mu);
        while (!s->stop && !s->inbox_head && !s->wake && !s->abort_all && !s->waiting.n &&
               !s->running.n && !s->snap_want)
            pthread_cond_wait(&s->inbox_cv, &s->inbox_mu);
        sched_kv_snapshot *snap = s->snap_want;
        if (snap) {
            s->snap_want = NULL;
            s->snap_state = SNAP_TAKEN;
        }
        sched_req *in = s->inbox_head;
        s->inbox_head = s->inbox_tail = NULL;
        bool abort = s->abort_all || s->stop, stop = s->stop;
        s->abort_all = false;
        s->wake = false;
        pthread_mutex_unlock(&s->inbox_mu);

        while (in) {
            sched_req *r = in;
            in = in->inbox_next;
            seq *q = (r->prompt_logprobs && sched__plp_buffers(s)) ||
                             (r->embed && sched__embed_buffers(s))
                         ? NULL
                         : sched__seq_new(s, r);
            if (!q) {
                /* tell the client and retire the request as if it had run */
                for (uint32_t c = 0; c < r->n; c++) {
                    sched_event ev = {.choice = c,
                                      .finish = SCHED_FINISH_ERROR,
                                      .status = KVS_ENOMEM,
                                      .prompt_tokens = r->n_prompt};
                    sched__push_event(r, &ev);
                }
                pthread_mutex_lock(&s->inbox_mu);
                s->n_queued--;
                s->n_unfinished--;
                pthread_mutex_unlock(&s->inbox_mu);
                sched__req_unref(r);
                continue;
            }
            q->state = SEQ_WAITING;
            sched__list_push_back(&s->waiting, q);
        }
        if (abort) {
            pthread_mutex_lock(&s->inbox_mu);
            s->n_queued = 0;
            pthread_mutex_unlock(&s->inbox_mu);
            finish_all(s, &s->waiting, KVS_ECANCELED);
            finish_all(s, &s->running, KVS_ECANCELED);
        }
        drop_released(s, &s->waiting);
        drop_released(s, &s->running);
        if (snap) {
            /* between steps: what the last step left, cancelled requests already gone */
            sched__update_gauges(s);
            sched__fill_snapshot(s, snap);
            pthread_mutex_lock(&s->inbox_mu);
            s->snap_state = SNAP_DONE;
            pthread_cond_broadcast(&s->snap_cv);
            pthread_mutex_unlock(&s->inbox_mu);
        }
        if (stop) {
            sched__update_gauges(s);
            break;
        }
        if (s->running.n || s->waiting.n) {
            run_step(s);
            if (s->p.step_observer) {
                sched__fill_snapshot(s, &s->obs);
                s->p.step_observer(s->p.step_observer_ud, &s->obs);
            }
        }
        sched__update_gauges(s);
    }
    return NULL;
}
