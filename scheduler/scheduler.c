/* Scheduler: the engine thread and the per-request event queues.
 *
 * A request becomes one sequence (its first choice) in the waiting queue. Sequences move
 * waiting -> running (admitted: blocks reserved, prefill in chunks) -> finished. A request
 * with n > 1 forks its first sequence once the prompt is computed: the forks share every
 * prompt block and copy only the partly filled last block on their first write.
 * Preemption frees a sequence's blocks and requeues it at the head of the waiting queue with
 * all its tokens; on readmission its full blocks are usually still in the prefix cache, and it
 * continues from where it was (same sampler state), so its output is unaffected. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "kvpool/kvpool.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void list_push_back(seq_list *l, seq *s)
{
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

static void list_push_front(seq_list *l, seq *s)
{
    s->prev = NULL;
    s->next = l->head;
    if (l->head)
        l->head->prev = s;
    else
        l->tail = s;
    l->head = s;
    l->n++;
}

static void list_remove(seq_list *l, seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        l->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

sched_params sched_default_params(void)
{
    sched_params p = {
        .max_num_seqs = 64,
        .max_queue = 256,
        .max_batched_tokens = 512,
        .kv_cache_mb = 256,
        .kv_type = ENGINE_KV_F16,
        .block_size = 16,
        .prefix_cache = true,
        .n_threads = 0,
        .n_ctx = 0,
    };
    return p;
}

static void hist_init(sched_hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof(double));
}

static void hist_add(sched_hist *h, double v)
{
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

static void init_metrics(sched_metrics *m)
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

/* ------------------------------------------------------------------ events */

static void req_unref(sched_req *r)
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
    ev->text = NULL;
    ev->tokens = NULL;
}

/* Queues an event (taking ownership of its buffers) and tells the client. Engine thread. */
static void push_event(sched_req *r, sched_event *ev)
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
    req_unref(r);
}

/* ------------------------------------------------------------------ submit */

int sched_submit(sched *s, const sched_request_params *p, void (*notify)(void *ud), void *ud,
                 sched_req **out)
{
    *out = NULL;
    if (!p->prompt || p->n_prompt == 0 || p->max_tokens == 0 || p->n == 0 ||
        p->n > s->p.max_num_seqs || p->n_top_logprobs > SCHED_MAX_TOP_LOGPROBS)
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
        req_unref(r);
        return KVS_ENOMEM;
    }
    memcpy(r->prompt, p->prompt, p->n_prompt * sizeof(int32_t));
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n = p->n;
    r->sampling = p->sampling;
    r->ignore_eos = p->ignore_eos;
    r->n_top_logprobs = p->n_top_logprobs;
    r->notify_on_finish_only = p->notify_on_finish_only;
    for (int i = 0; i < SCHED_MAX_STOP; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            continue;
        size_t len = strlen(p->stop[i]);
        r->stop[r->n_stop] = malloc(len + 1);
        if (!r->stop[r->n_stop]) {
            r->refs = 1;
            req_unref(r);
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
        r->refs = 1;
        req_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ------------------------------------------------------------------ sequences */

static int seq_reserve(seq *q, uint32_t n)
{
    if (n <= q->cap)
        return 0;
    uint32_t cap = q->cap ? q->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *t = realloc(q->tokens, cap * sizeof(int32_t));
    if (!t)
        return KVS_ENOMEM;
    q->tokens = t;
    q->cap = cap;
    return 0;
}

static seq *seq_new(sched *s, sched_req *r)
{
    seq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->req = r;
    q->fork_pending = r->n > 1;
    q->logits_row = -1;
    tok_decoder_init(&q->dec);
    if (seq_reserve(q, r->n_prompt + r->max_tokens) ||
        sampler_create(&r->sampling, (int32_t)s->n_vocab, &q->smp)) {
        free(q->tokens);
        free(q);
        return NULL;
    }
    memcpy(q->tokens, r->prompt, r->n_prompt * sizeof(int32_t));
    q->n_tokens = r->n_prompt;
    for (uint32_t i = 0; i < r->n_prompt; i++)
        sampler_accept(q->smp, r->prompt[i], true);
    return q;
}

static void seq_free(sched *s, seq *q)
{
    kvpool_seq_destroy(s->pool, q->kv);
    sampler_destroy(q->smp);
    free(q->tokens);
    free(q->held);
    free(q);
}

/* Sends the choice's last event and retires the sequence. */
static void finish_seq(sched *s, seq_list *from, seq *q, enum sched_finish why, int status)
{
    sched_req *r = q->req;
    sched_event ev = {0};
    ev.choice = q->choice;
    ev.finish = why;
    ev.status = status;
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = q->n_generated;
    ev.cached_tokens = r->cached_tokens;
    if (why != SCHED_FINISH_ERROR) {
        /* flush: an incomplete UTF-8 tail and any held-back stop-string prefix are text */
        char tail[16];
        int nt = tok_decoder_flush(&q->dec, tail, sizeof tail);
        size_t len = q->held_len + (nt > 0 ? (size_t)nt : 0);
        ev.text = malloc(len + 1);
        if (ev.text) {
            if (q->held_len)
                memcpy(ev.text, q->held, q->held_len);
            if (nt > 0)
                memcpy(ev.text + q->held_len, tail, (size_t)nt);
            ev.text[len] = '\0';
            ev.text_len = len;
        }
    }
    if (from)
        list_remove(from, q);
    uint32_t choices = r->n;
    bool was_fork_pending = q->fork_pending;
    seq_free(s, q);
    /* A first choice that ends before forking (error, cancel) ends the others too. */
    uint32_t ending = was_fork_pending ? choices : 1;
    bool last = r->n_done + ending == choices;
    if (last) {
        /* Recorded before the last event goes out, so a client that reads /metrics right
         * after its response already sees its request counted. */
        pthread_mutex_lock(&s->metrics_mu);
        hist_add(&s->m.e2e_request_latency_seconds, time_now_s() - r->t_submit);
        pthread_mutex_unlock(&s->metrics_mu);
    }
    push_event(r, &ev);
    if (was_fork_pending) {
        for (uint32_t c = 1; c < choices; c++) {
            sched_event e2 = ev;
            e2.text = NULL;
            e2.text_len = 0;
            e2.choice = c;
            e2.completion_tokens = 0;
            push_event(r, &e2);
        }
    }
    r->n_done += ending;
    if (last) {
        pthread_mutex_lock(&s->inbox_mu);
        s->n_unfinished--;
        pthread_mutex_unlock(&s->inbox_mu);
        req_unref(r);
    }
}

static void *memfind(const void *hay, size_t hn, const void *needle, size_t nn)
{
    if (nn == 0 || nn > hn)
        return NULL;
    const char *h = hay;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == *(const char *)needle && memcmp(h + i, needle, nn) == 0)
            return (void *)(h + i);
    return NULL;
}

/* Length of the longest suffix of text that is a proper prefix of some stop string: that much
 * must be held back, since the next token could complete the stop string. */
static size_t stop_prefix_suffix(const sched_req *r, const char *text, size_t len)
{
    size_t best = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t maxk = r->stop_len[i] - 1 < len ? r->stop_len[i] - 1 : len;
        for (size_t k = maxk; k > best; k--) {
            if (memcmp(text + len - k, r->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

static bool is_stop_token(const sched *s, const sched_req *r, int32_t tok)
{
    if (r->ignore_eos)
        return false;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (tok == s->stop_ids[i])
            return true;
    return false;
}

/* Samples the next token of q from its logits row and publishes what it adds. Returns true
 * if the sequence finished (and was freed). */
static bool sample_and_emit(sched *s, seq *q, const float *row_in, float *scratch)
{
    sched_req *r = q->req;
    memcpy(scratch, row_in, s->n_vocab * sizeof(float));
    sched_token_info info = {0};
    bool want_lp = r->n_top_logprobs >= 0;
    info.n_top = want_lp ? r->n_top_logprobs : 0;
    int32_t tok = sampler_sample(q->smp, scratch, want_lp ? &info.logprob : NULL, info.n_top,
                                 info.top_ids, info.top_logprobs);
    info.id = tok;
    sampler_accept(q->smp, tok, false);
    q->tokens[q->n_tokens++] = tok;
    q->n_generated++;
    atomic_fetch_add_explicit(&r->generated, 1, memory_order_relaxed);
    double now = time_now_s();
    pthread_mutex_lock(&s->metrics_mu);
    s->m.generation_tokens_total++;
    if (q->n_generated == 1) {
        if (!r->first_token_seen)
            hist_add(&s->m.time_to_first_token_seconds, now - r->t_submit);
    } else {
        hist_add(&s->m.inter_token_latency_seconds, now - q->t_last_token);
    }
    pthread_mutex_unlock(&s->metrics_mu);
    r->first_token_seen = true;
    q->t_last_token = now;

    sched_event ev = {0};
    ev.choice = q->choice;
    if (want_lp) {
        ev.tokens = malloc(sizeof info);
        if (ev.tokens) {
            *ev.tokens = info;
            ev.n_tokens = 1;
        }
    }
    enum sched_finish fin = SCHED_FINISH_NONE;
    if (is_stop_token(s, r, tok)) {
        fin = SCHED_FINISH_STOP;
    } else {
        /* Decode into the held buffer, then release what cannot start a stop string. */
        char piece[4096]; /* tok_decoder_push needs 64 + 3 x the piece: far above any vocab entry */
        int n = tok_decoder_push(s->vocab, &q->dec, tok, piece, sizeof piece);
        if (n > (int)sizeof piece)
            n = (int)sizeof piece;
        if (n > 0) {
            size_t need = q->held_len + (size_t)n;
            if (need > q->held_cap) {
                size_t cap = q->held_cap ? q->held_cap * 2 : 256;
                while (cap < need)
                    cap *= 2;
                char *h = realloc(q->held, cap);
                if (!h) {
                    sched_event_free(&ev);
                    finish_seq(s, &s->running, q, SCHED_FINISH_ERROR, KVS_ENOMEM);
                    return true;
                }
                q->held = h;
                q->held_cap = cap;
            }
            memcpy(q->held + q->held_len, piece, (size_t)n);
            q->held_len += (size_t)n;
        }
        size_t emit = q->held_len;
        if (r->n_stop) {
            size_t cut = SIZE_MAX;
            for (int i = 0; i < r->n_stop; i++) {
                char *at = memfind(q->held, q->held_len, r->stop[i], r->stop_len[i]);
                if (at && (size_t)(at - q->held) < cut)
                    cut = (size_t)(at - q->held);
            }
            if (cut != SIZE_MAX) {
                emit = cut;
                q->held_len = cut; /* the stop string and anything after it is dropped */
                fin = SCHED_FINISH_STOP;
            } else {
                emit = q->held_len - stop_prefix_suffix(r, q->held, q->held_len);
            }
        }
        if (fin == SCHED_FINISH_NONE) {
            if (emit) {
                ev.text = malloc(emit + 1);
                if (ev.text) {
                    memcpy(ev.text, q->held, emit);
                    ev.text[emit] = '\0';
                    ev.text_len = emit;
                }
                memmove(q->held, q->held + emit, q->held_len - emit);
                q->held_len -= emit;
            }
            if (q->n_generated >= r->max_tokens)
                fin = SCHED_FINISH_LENGTH;
        }
    }
    if (fin != SCHED_FINISH_NONE) {
        /* The finishing event carries the remaining text and this token's info. */
        if (ev.text_len) {
            /* put emitted text back in front of the held text for finish_seq to send */
            char *h = malloc(ev.text_len + q->held_len + 1);
            if (h) {
                memcpy(h, ev.text, ev.text_len);
                memcpy(h + ev.text_len, q->held, q->held_len);
                free(q->held);
                q->held = h;
                q->held_len += ev.text_len;
                q->held_cap = q->held_len + 1;
            }
        }
        if (ev.n_tokens)
            push_event(r, &(sched_event){
                              .choice = q->choice, .tokens = ev.tokens, .n_tokens = ev.n_tokens});
        free(ev.text);
        finish_seq(s, &s->running, q, fin, 0);
        return true;
    }
    if (ev.text_len || ev.n_tokens)
        push_event(r, &ev);
    return false;
}

/* Frees a running sequence's blocks and requeues it at the head of the waiting queue. */
static void preempt(sched *s, seq *q)
{
    list_remove(&s->running, q);
    kvpool_seq_destroy(s->pool, q->kv);
    q->kv = NULL;
    q->n_computed = 0;
    q->state = SEQ_WAITING;
    list_push_front(&s->waiting, q);
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
        kvpool_copy cp;
        int n_cp = 0;
        int rc = kvpool_seq_append(s->pool, q->kv, q->tokens + q->n_computed, chunk, &cp, &n_cp);
        if (rc == 0) {
            if (n_cp)
                s->copies[s->n_copies++] = cp;
            return 0;
        }
        if (rc != KVS_ENOSPC || !may_preempt)
            return rc;
        seq *victim = NULL;
        for (seq *v = s->running.head; v; v = v->next)
            if (v->chunk == 0 && (!victim || v->admit_order > victim->admit_order))
                victim = v;
        if (!victim)
            return KVS_ENOSPC;
        preempt(s, victim);
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
    for (uint32_t i = 0; i < chunk; i++) {
        uint32_t p = q->n_computed + i;
        s->b_token[*n_rows] = q->tokens[p];
        s->b_pos[*n_rows] = (int32_t)p;
        s->b_seq[*n_rows] = (int32_t)si;
        s->b_logits[*n_rows] = p == q->n_tokens - 1;
        (*n_rows)++;
    }
}

/* Plans one step: decodes first (one token each, oldest first, preempting the newest when
 * the pool is dry), then prefill chunks of running sequences, then admissions from the
 * waiting queue, all within max_batched_tokens. Returns the number of sequences planned. */
static uint32_t plan_step(sched *s, uint32_t *n_rows_out)
{
    uint32_t budget = s->p.max_batched_tokens, n_rows = 0, n_seqs = 0;
    s->n_copies = 0;
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
        if (reserve_chunk(s, q, chunk, false) == 0) {
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
        if (kvpool_seq_create(s->pool, &q->kv))
            break;
        uint32_t covered = 0;
        if (s->p.prefix_cache)
            covered = kvpool_seq_match_prefix(s->pool, q->kv, q->tokens, q->n_tokens - 1);
        /* Admit only if the pool can hold all of what is known of it now. */
        uint32_t need = kvpool_seq_blocks_needed(s->pool, q->kv, q->n_tokens - covered);
        uint32_t chunk = q->n_tokens - covered;
        if (chunk > budget)
            chunk = budget;
        q->n_computed = covered;
        if (need > kvpool_available(s->pool) || reserve_chunk(s, q, chunk, false) != 0) {
            kvpool_seq_destroy(s->pool, q->kv);
            q->kv = NULL;
            q->n_computed = 0;
            break;
        }
        list_remove(&s->waiting, q);
        seats_held += seats;
        q->state = SEQ_RUNNING;
        q->admit_order = ++s->admit_counter;
        list_push_back(&s->running, q);
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

/* Creates the other n - 1 choices of q's request, sharing q's blocks. */
static void fork_choices(sched *s, seq *q)
{
    sched_req *r = q->req;
    q->fork_pending = false;
    for (uint32_t c = 1; c < r->n; c++) {
        seq *f = calloc(1, sizeof *f);
        int rc = f ? 0 : KVS_ENOMEM;
        if (!rc)
            rc = seq_reserve(f, r->n_prompt + r->max_tokens);
        if (!rc)
            rc = sampler_clone(q->smp, r->sampling.seed + c, &f->smp);
        if (!rc)
            rc = kvpool_seq_fork(s->pool, q->kv, &f->kv);
        if (rc) {
            if (f) {
                sampler_destroy(f->smp);
                free(f->tokens);
                free(f);
            }
            sched_event ev = {.choice = c,
                              .finish = SCHED_FINISH_ERROR,
                              .status = rc,
                              .prompt_tokens = r->n_prompt};
            push_event(r, &ev);
            r->n_done++;
            continue;
        }
        f->req = r;
        f->choice = c;
        f->ever_admitted = true;
        f->state = SEQ_RUNNING;
        f->admit_order = ++s->admit_counter;
        f->logits_row = q->logits_row;
        tok_decoder_init(&f->dec);
        memcpy(f->tokens, q->tokens, q->n_tokens * sizeof(int32_t));
        f->n_tokens = q->n_tokens;
        f->n_computed = q->n_computed;
        list_push_back(&s->running, f);
    }
}

static void finish_all(sched *s, seq_list *l, int status)
{
    while (l->head)
        finish_seq(s, l, l->head, SCHED_FINISH_ERROR, status);
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
            finish_seq(s, l, q, SCHED_FINISH_ERROR, KVS_ECANCELED);
            next = l->head; /* finish_seq may have touched other entries' requests only */
        }
    }
}

static void update_gauges(sched *s)
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
    s->m.prefix_cache_queries_total = st.prefix_queries;
    s->m.prefix_cache_hits_total = st.prefix_hits;
    pthread_mutex_unlock(&s->metrics_mu);
}

/* One step over the planned batch. */
static void run_step(sched *s)
{
    uint32_t n_rows = 0;
    uint32_t n_seqs = plan_step(s, &n_rows);
    if (n_seqs == 0) {
        /* Every running sequence is mid-prefill and the pool is dry: make room. */
        seq *victim = NULL;
        for (seq *v = s->running.head; v; v = v->next)
            if (!victim || v->admit_order > victim->admit_order)
                victim = v;
        if (victim && s->running.n > 1)
            preempt(s, victim);
        return;
    }
    for (int i = 0; i < s->n_copies; i++)
        engine_kv_copy_block(s->kv, s->copies[i].src, s->copies[i].dst);
    int n_logits = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        uint32_t nb;
        s->b_views[i].blocks = kvpool_seq_blocks(q->kv, &nb);
        s->b_views[i].n_blocks = nb;
        q->logits_row = q->n_computed + q->chunk == q->n_tokens ? n_logits++ : -1;
    }
    engine_batch b = {n_rows, s->b_token, s->b_pos, s->b_seq, s->b_logits, n_seqs, s->b_views};
    int rc = engine_forward(s->ctx, s->kv, &b, s->logits);
    if (s->p.fail_step && s->m.steps_total + 1 == s->p.fail_step)
        rc = KVS_EIO; /* fault injection for tests: see sched_params.fail_step */
    if (rc) {
        log_error("scheduler: forward pass failed: %s", status_str(rc));
        pthread_mutex_lock(&s->metrics_mu);
        s->m.steps_total++;
        pthread_mutex_unlock(&s->metrics_mu);
        for (uint32_t i = 0; i < n_seqs; i++)
            finish_seq(s, &s->running, s->b_seqs[i], SCHED_FINISH_ERROR, rc);
        return;
    }
    float *scratch = s->logits + (size_t)s->p.max_num_seqs * s->n_vocab;
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        q->n_computed += q->chunk;
        kvpool_seq_commit(s->pool, q->kv, q->n_computed);
    }
    for (uint32_t i = 0; i < n_seqs; i++) {
        seq *q = s->b_seqs[i];
        if (q->logits_row < 0)
            continue;
        const float *row = s->logits + (size_t)q->logits_row * s->n_vocab;
        if (q->fork_pending) {
            seq *last = s->running.tail;
            fork_choices(s, q);
            /* The forks sample from the same prompt logits. A fork can finish on this first
             * token (max_tokens 1, a stop string, EOS), and finishing frees it: take the next
             * link before sampling. */
            for (seq *f = last->next, *next; f; f = next) {
                next = f->next;
                if (f->req == q->req && f->logits_row == q->logits_row && f != q)
                    sample_and_emit(s, f, row, scratch);
            }
        }
        sample_and_emit(s, q, row, scratch);
    }
    pthread_mutex_lock(&s->metrics_mu);
    s->m.steps_total++;
    if (n_seqs > 1)
        s->m.multi_seq_steps_total++;
    hist_add(&s->m.batch_size, n_seqs);
    pthread_mutex_unlock(&s->metrics_mu);
}

static void *engine_main(void *arg)
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
            seq *q = seq_new(s, r);
            if (!q) {
                /* tell the client and retire the request as if it had run */
                for (uint32_t c = 0; c < r->n; c++) {
                    sched_event ev = {.choice = c,
                                      .finish = SCHED_FINISH_ERROR,
                                      .status = KVS_ENOMEM,
                                      .prompt_tokens = r->n_prompt};
                    push_event(r, &ev);
                }
                pthread_mutex_lock(&s->inbox_mu);
                s->n_queued--;
                s->n_unfinished--;
                pthread_mutex_unlock(&s->inbox_mu);
                req_unref(r);
                continue;
            }
            q->state = SEQ_WAITING;
            list_push_back(&s->waiting, q);
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
            update_gauges(s);
            sched__fill_snapshot(s, snap);
            pthread_mutex_lock(&s->inbox_mu);
            s->snap_state = SNAP_DONE;
            pthread_cond_broadcast(&s->snap_cv);
            pthread_mutex_unlock(&s->inbox_mu);
        }
        if (stop) {
            update_gauges(s);
            break;
        }
        if (s->running.n || s->waiting.n)
            run_step(s);
        update_gauges(s);
    }
    return NULL;
}

/* ------------------------------------------------------------------ lifecycle */

int sched_create(const sched_params *pin, const engine_model *model, sched **out)
{
    *out = NULL;
    sched_params p = *pin;
    const engine_hparams *hp = engine_model_hparams(model);
    if (p.n_ctx == 0)
        p.n_ctx = hp->n_ctx_train;
    if (p.block_size == 0 || p.block_size > 1024 || p.max_num_seqs == 0 || p.max_num_seqs > 4096 ||
        p.max_batched_tokens == 0 || p.max_batched_tokens > 65536 || p.kv_cache_mb == 0 ||
        p.n_ctx > (1u << 20)) {
        log_error("scheduler: invalid parameters");
        return KVS_EINVAL;
    }
    if (p.max_batched_tokens < p.max_num_seqs)
        p.max_batched_tokens = p.max_num_seqs; /* every running sequence decodes every step */
    if (p.n_threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = cores > 0 ? (uint32_t)cores : 1;
    }
    size_t block_bytes = engine_kv_block_bytes(model, p.kv_type, p.block_size);
    uint64_t n_blocks =
        p.kv_blocks ? p.kv_blocks : (uint64_t)p.kv_cache_mb * 1024 * 1024 / block_bytes;
    uint64_t ctx_blocks = (p.n_ctx + p.block_size - 1) / p.block_size;
    if (n_blocks < ctx_blocks) {
        log_error("scheduler: the KV pool (--kv-cache-mb %u / --kv-blocks %u) holds %llu blocks "
                  "of %u tokens; one %u-token context needs %llu",
                  p.kv_cache_mb, p.kv_blocks, (unsigned long long)n_blocks, p.block_size, p.n_ctx,
                  (unsigned long long)ctx_blocks);
        return KVS_EINVAL;
    }
    if (n_blocks > (1u << 30))
        n_blocks = 1u << 30;
    sched *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->p = p;
    s->model = model;
    s->vocab = engine_model_vocab(model);
    s->n_vocab = hp->n_vocab;
    /* Stop tokens: EOS, and BOS when distinct: no model means a generated BOS as content, and
     * stories260K (llama2.c) marks the end of a story with it. */
    if (tok_eos(s->vocab) >= 0)
        s->stop_ids[s->n_stop_ids++] = tok_eos(s->vocab);
    if (tok_bos(s->vocab) >= 0 && tok_bos(s->vocab) != tok_eos(s->vocab))
        s->stop_ids[s->n_stop_ids++] = tok_bos(s->vocab);
    pthread_mutex_init(&s->inbox_mu, NULL);
    pthread_cond_init(&s->inbox_cv, NULL);
    pthread_mutex_init(&s->snap_mu, NULL);
    pthread_cond_init(&s->snap_cv, NULL);
    pthread_mutex_init(&s->metrics_mu, NULL);
    init_metrics(&s->m);

    s->n_blocks = (uint32_t)n_blocks;
    kvpool_params kp = {(uint32_t)n_blocks, p.block_size, p.prefix_cache};
    int rc = kvpool_create(&kp, &s->pool);
    if (!rc)
        rc = engine_kv_create(model, p.kv_type, (uint32_t)n_blocks, p.block_size, &s->kv);
    if (!rc)
        rc = engine_ctx_create(model, p.max_batched_tokens, p.n_threads, &s->ctx);
    if (rc) {
        sched_destroy(s);
        return rc;
    }
    size_t T = p.max_batched_tokens, S = p.max_num_seqs;
    s->logits = malloc((S + 1) * hp->n_vocab * sizeof(float));
    s->b_token = malloc(T * sizeof(int32_t));
    s->b_pos = malloc(T * sizeof(int32_t));
    s->b_seq = malloc(T * sizeof(int32_t));
    s->b_logits = malloc(T * sizeof(bool));
    s->b_views = malloc(S * sizeof *s->b_views);
    s->b_seqs = malloc(S * sizeof *s->b_seqs);
    s->copies = malloc(S * sizeof *s->copies);
    if (!s->logits || !s->b_token || !s->b_pos || !s->b_seq || !s->b_logits || !s->b_views ||
        !s->b_seqs || !s->copies) {
        sched_destroy(s);
        return KVS_ENOMEM;
    }
    update_gauges(s);
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        sched_destroy(s);
        return KVS_ENOMEM;
    }
    s->thread_started = true;
    log_info("scheduler: %llu KV blocks of %u tokens (%.1f MiB), context %u, up to %u "
             "sequences and %u tokens per step, %u compute threads",
             (unsigned long long)n_blocks, p.block_size,
             (double)(n_blocks * block_bytes) / (1024.0 * 1024.0), p.n_ctx, p.max_num_seqs,
             p.max_batched_tokens, p.n_threads);
    *out = s;
    return 0;
}

void sched_destroy(sched *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->inbox_mu);
        s->stop = true;
        pthread_cond_signal(&s->inbox_cv);
        pthread_cond_broadcast(&s->snap_cv); /* a snapshot taker gives up */
        pthread_mutex_unlock(&s->inbox_mu);
        pthread_join(s->thread, NULL);
    }
    kvpool_destroy(s->pool);
    engine_kv_destroy(s->kv);
    engine_ctx_destroy(s->ctx);
    free(s->logits);
    free(s->b_token);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_logits);
    free(s->b_views);
    free(s->b_seqs);
    free(s->copies);
    pthread_mutex_destroy(&s->inbox_mu);
    pthread_cond_destroy(&s->inbox_cv);
    pthread_mutex_destroy(&s->snap_mu);
    pthread_cond_destroy(&s->snap_cv);
    pthread_mutex_destroy(&s->metrics_mu);
    free(s);
}

void sched_drain(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    s->draining = true;
    pthread_mutex_unlock(&s->inbox_mu);
}

void sched_abort_all(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    s->abort_all = true;
    pthread_cond_signal(&s->inbox_cv);
    pthread_mutex_unlock(&s->inbox_mu);
}

uint32_t sched_n_unfinished(sched *s)
{
    pthread_mutex_lock(&s->inbox_mu);
    uint32_t n = s->n_unfinished;
    pthread_mutex_unlock(&s->inbox_mu);
    return n;
}

void sched_get_metrics(sched *s, sched_metrics *m)
{
    pthread_mutex_lock(&s->metrics_mu);
    *m = s->m;
    pthread_mutex_unlock(&s->metrics_mu);
}
