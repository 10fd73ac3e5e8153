/* Requests from the client's side: submit into the inbox, each request's event queue (the
 * engine thread pushes, the client takes), notify and release. Any thread except where said. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

void sched__req_unref(sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left)
        return;
    for (event_node *e = r->head; e;) {
        event_node *n = e->next;
        sched_event_free(&e->ev);
        free(e);
        e = n;
    }
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->prompt);
    free(r->bias);
    grammar_def_destroy(r->gdef);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->notify_done);
    free(r);
}

void sched_event_free(sched_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    free(ev->tokens);
    free(ev->embedding);
    ev->text = NULL;
    ev->tokens = NULL;
    ev->embedding = NULL;
}

/* Queues an event (taking ownership of its buffers) and tells the client. Engine thread. */
void sched__push_event(sched_req *r, sched_event *ev)
{
    event_node *n = malloc(sizeof *n);
    if (!n) {
        /* Out of memory: drop the delta but never a finishing event's meaning. */
        log_error("scheduler: out of memory queueing an event");
        sched_event_free(ev);
        return;
    }
    n->ev = *ev;
    n->next = NULL;
    bool wake = !r->notify_on_finish_only || ev->finish != SCHED_FINISH_NONE;
    pthread_mutex_lock(&r->mu);
    bool gone = atomic_load(&r->released);
    if (!gone) {
        if (r->tail)
            r->tail->next = n;
        else
            r->head = n;
        r->tail = n;
    }
    wake = wake && !gone && r->notify;
    if (wake)
        r->notifying++;
    pthread_mutex_unlock(&r->mu);
    if (gone) {
        sched_event_free(&n->ev);
        free(n);
        return;
    }
    if (wake) {
        /* Outside the lock (the callback may take the client's own locks, which the client
         * holds while calling sched_req_next); release waits for it, so the client's ud is
         * never used after sched_req_release returns. */
        r->notify(r->ud);
        pthread_mutex_lock(&r->mu);
        if (--r->notifying == 0)
            pthread_cond_broadcast(&r->notify_done);
        pthread_mutex_unlock(&r->mu);
    }
}

uint32_t sched_req_generated(sched_req *r)
{
    return atomic_load_explicit(&r->generated, memory_order_relaxed);
}

uint64_t sched_req_serial(const sched_req *r)
{
    return r->serial; /* written once, before sched_submit returned r */
}

int sched_req_next(sched_req *r, sched_event *ev)
{
    pthread_mutex_lock(&r->mu);
    event_node *n = r->head;
    int rc;
    if (n) {
        r->head = n->next;
        if (!r->head)
            r->tail = NULL;
        *ev = n->ev;
        if (ev->finish != SCHED_FINISH_NONE)
            r->n_finished_taken++;
        free(n);
        rc = 1;
    } else {
        rc = r->n_finished_taken >= r->n ? -1 : 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void sched_req_release(sched_req *r)
{
    if (!r)
        return;
    sched *s = r->owner;
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->released, true);
    while (r->notifying)
        pthread_cond_wait(&r->notify_done, &r->mu);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->inbox_mu);
    s->wake = true;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->inbox_mu);
    sched__req_unref(r);
}

int sched_submit(sched *s, const sched_request_params *p, void (*notify)(void *ud), void *ud,
                 sched_req **out)
{
    *out = NULL;
    if (!p->prompt || p->n_prompt == 0 || p->n == 0 || p->n > s->p.max_num_seqs ||
        p->n_top_logprobs > SCHED_MAX_TOP_LOGPROBS ||
        (p->prompt_logprobs && p->n_top_logprobs < 0) ||
        (p->embed != ENGINE_POOLING_NONE &&
         (p->max_tokens || p->n != 1 || p->n_top_logprobs >= 0 || p->grammar)) ||
        p->n_logit_bias > SCHED_MAX_LOGIT_BIAS || (p->n_logit_bias && !p->logit_bias))
        return KVS_EINVAL;
    for (uint32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || (uint32_t)p->logit_bias[i].id >= s->n_vocab ||
            !isfinite(p->logit_bias[i].bias))
            return KVS_EINVAL;
    if (p->grammar && !s->gvocab)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= s->n_vocab)
            return KVS_EINVAL;
    if ((uint64_t)p->n_prompt + p->max_tokens > s->p.n_ctx)
        return KVS_ERANGE;
    sampler *probe;
    int rc = sampler_create(&p->sampling, (int32_t)s->n_vocab, &probe);
    if (rc)
        return rc;
    sampler_destroy(probe);

    sched_req *r = calloc(1, sizeof *r);
    if (!r)
        return KVS_ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->notify_done, NULL);
    r->owner = s;
    r->prompt = malloc(p->n_prompt * sizeof(int32_t));
    if (!r->prompt) {
        r->refs = 1;
        sched__req_unref(r);
        return KVS_ENOMEM;
    }
    memcpy(r->prompt, p->prompt, p->n_prompt * sizeof(int32_t));
    if (p->n_logit_bias) {
        r->bias = malloc(p->n_logit_bias * sizeof *r->bias);
        if (!r->bias) {
            r->refs = 1;
            sched__req_unref(r);
            return KVS_ENOMEM;
        }
        memcpy(r->bias, p->logit_bias, p->n_logit_bias * sizeof *r->bias);
        r->n_bias = p->n_logit_bias;
    }
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n = p->n;
    r->sampling = p->sampling;
    r->ignore_eos = p->ignore_eos;
    r->n_top_logprobs = p->n_top_logprobs;
    r->prompt_logprobs = p->prompt_logprobs;
    r->embed = p->embed;
    r->notify_on_finish_only = p->notify_on_finish_only;
    for (int i = 0; i < SCHED_MAX_STOP; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            continue;
        size_t len = strlen(p->stop[i]);
        r->stop[r->n_stop] = malloc(len + 1);
        if (!r->stop[r->n_stop]) {
            r->refs = 1;
            sched__req_unref(r);
            return KVS_ENOMEM;
        }
        memcpy(r->stop[r->n_stop], p->stop[i], len + 1);
        r->stop_len[r->n_stop] = len;
        if (len > r->max_stop_len)
            r->max_stop_len = len;
        r->n_stop++;
    }
    r->notify = notify;
    r->ud = ud;
    r->gdef = p->grammar;
    r->t_submit = time_now_s();
    r->refs = 2; /* the client's, and the engine thread's until every choice is finished */

    pthread_mutex_lock(&s->inbox_mu);
    if (s->draining || s->stop) {
        rc = KVS_EBUSY;
    } else if (s->n_queued >= s->p.max_queue) {
        rc = KVS_ENOSPC;
    } else {
        r->serial = ++s->next_serial;
        s->n_queued++;
        s->n_unfinished++;
        if (s->inbox_tail)
            s->inbox_tail->inbox_next = r;
        else
            s->inbox_head = r;
        s->inbox_tail = r;
        pthread_cond_signal(&s->inbox_cv);
    }
    pthread_mutex_unlock(&s->inbox_mu);
    if (rc) {
        r->gdef = NULL; /* still the caller's */
        r->refs = 1;
        sched__req_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}
