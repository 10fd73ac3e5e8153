/* After a step: sequences made and retired, sampling, detokenizing, stop tokens and stop
 * strings, logprobs, forks of n > 1 requests, and the events each choice publishes. Engine
 * thread only. */
#include "scheduler/scheduler.h"
#include "scheduler/sched_impl.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "kvpool/kvpool.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

seq *sched__seq_new(sched *s, sched_req *r)
{
    seq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->req = r;
    q->fork_pending = r->n > 1;
    q->logits_row = -1;
    tok_decoder_init(&q->dec);
    if (seq_reserve(q, r->n_prompt + r->max_tokens) ||
        sampler_create(&r->sampling, (int32_t)s->n_vocab, &q->smp) ||
        (r->gdef && grammar_create(r->gdef, &q->gram))) {
        sampler_destroy(q->smp);
        free(q->tokens);
        free(q);
        return NULL;
    }
    if ((r->prompt_logprobs && r->n_prompt > 1 &&
         !(q->plp = malloc((r->n_prompt - 1) * sizeof *q->plp))) ||
        (r->embed && !(q->pool = calloc(s->n_embd, sizeof *q->pool)))) {
        free(q->plp);
        sampler_destroy(q->smp);
        grammar_destroy(q->gram);
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
    sched__kv_free(s, q);
    sampler_destroy(q->smp);
    grammar_destroy(q->gram);
    free(q->tokens);
    free(q->held);
    free(q->plp);
    free(q->pool);
    free(q);
}

int sched__embed_buffers(sched *s)
{
    if (s->hidden)
        return 0;
    s->hidden = malloc((size_t)s->p.max_batched_tokens * s->n_embd * sizeof(float));
    return s->hidden ? 0 : KVS_ENOMEM;
}

void sched__embed_collect(sched *s, seq *q)
{
    sched_req *r = q->req;
    uint32_t E = s->n_embd;
    for (uint32_t j = 0; j < q->hid_n; j++) { /* in position order, however it was chunked */
        const float *h = s->hidden + (size_t)(q->hid_row + (int)j) * E;
        for (uint32_t i = 0; i < E; i++)
            q->pool[i] += h[i];
    }
    q->pool_n += q->hid_n;
    q->hid_n = 0;
    if (q->n_computed < r->n_prompt)
        return;
    sched_event ev = {.choice = q->choice};
    ev.embedding = malloc(E * sizeof(float));
    if (!ev.embedding || !q->pool_n) {
        free(ev.embedding);
        sched__finish_seq(s, &s->running, q, SCHED_FINISH_ERROR, q->pool_n ? KVS_ENOMEM : KVS_EIO);
        return;
    }
    for (uint32_t i = 0; i < E; i++)
        ev.embedding[i] = (float)(q->pool[i] / q->pool_n);
    ev.n_embedding = E;
    sched__push_event(r, &ev);
    sched__finish_seq(s, &s->running, q, SCHED_FINISH_LENGTH, 0);
}

int sched__plp_buffers(sched *s)
{
    uint32_t rows = s->p.max_num_seqs + s->plp_rows;
    if (s->logits_rows >= rows)
        return 0;
    float *l = realloc(s->logits, ((size_t)rows + 1) * s->n_vocab * sizeof(float));
    if (!l)
        return KVS_ENOMEM;
    s->logits = l;
    s->logits_rows = rows;
    return 0;
}

void sched__plp_collect(sched *s, seq *q, const float *logits)
{
    sched_req *r = q->req;
    for (uint32_t j = 0; j < q->plp_n; j++) {
        uint32_t p = q->plp_lo + j;
        sched_token_info *t = &q->plp[p];
        memset(t, 0, sizeof *t);
        t->id = q->tokens[p + 1];
        t->n_top = r->n_top_logprobs;
        sampler_logprobs(logits + (size_t)(q->plp_row + (int)j) * s->n_vocab, (int32_t)s->n_vocab,
                         t->id, &t->logprob, t->n_top, t->top_ids, t->top_logprobs);
    }
    if (q->plp_n)
        q->plp_done = q->plp_lo + q->plp_n;
    q->plp_n = 0;
    if (q->n_computed < r->n_prompt)
        return;
    sched_event ev = {.choice = q->choice, .prompt = true};
    ev.tokens = q->plp;
    ev.n_tokens = r->n_prompt - 1;
    q->plp = NULL;
    q->plp_sent = true;
    sched__push_event(r, &ev);
}

void sched__finish_seq(sched *s, seq_list *from, seq *q, enum sched_finish why, int status)
{
    sched__finish_seq_tokens(s, from, q, why, status, NULL, 0);
}

void sched__finish_seq_tokens(sched *s, seq_list *from, seq *q, enum sched_finish why, int status,
                              sched_token_info *tokens, uint32_t n_tokens)
{
    sched_req *r = q->req;
    sched_event ev = {0};
    ev.choice = q->choice;
    ev.tokens = tokens;
    ev.n_tokens = tokens ? n_tokens : 0;
    ev.finish = why;
    ev.status = status;
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = q->n_generated;
    ev.generated = q->n_generated;
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
        sched__list_remove(from, q);
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
        sched__hist_add(&s->m.e2e_request_latency_seconds, time_now_s() - r->t_submit);
        pthread_mutex_unlock(&s->metrics_mu);
    }
    sched__push_event(r, &ev);
    if (was_fork_pending) {
        for (uint32_t c = 1; c < choices; c++) {
            sched_event e2 = ev;
            e2.text = NULL;
            e2.text_len = 0;
            e2.tokens = NULL;
            e2.n_tokens = 0;
            e2.choice = c;
            e2.completion_tokens = 0;
            sched__push_event(r, &e2);
        }
    }
    r->n_done += ending;
    if (last) {
        pthread_mutex_lock(&s->inbox_mu);
        s->n_unfinished--;
        pthread_mutex_unlock(&s->inbox_mu);
        sched__req_unref(r);
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

static bool is_end_token(const sched *s, int32_t tok)
{
    for (int i = 0; i < s->n_stop_ids; i++)
        if (tok == s->stop_ids[i])
            return true;
    return false;
}

static bool is_stop_token(const sched *s, const sched_req *r, int32_t tok)
{
    return !r->ignore_eos && is_end_token(s, tok);
}

/* Samples the next token of q from its logits row and publishes what it adds. Returns true
 * if the sequence finished (and was freed). */
bool sched__sample_and_emit(sched *s, seq *q, const float *row_in, float *scratch)
{
    sched_req *r = q->req;
    memcpy(scratch, row_in, s->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < r->n_bias; i++)
        scratch[r->bias[i].id] += r->bias[i].bias;
    if (q->gram) {
        int rc = grammar_mask(q->gram, s->gvocab, s->gmask);
        if (rc <= 0) {
            /* A dead end cannot happen with a def that has a finite instance; an anyOf too
             * ambiguous (KVS_ERANGE) or OOM fails the choice. */
            log_warn("scheduler: grammar mask failed: %s", status_str(rc ? rc : KVS_EINVAL));
            sched__finish_seq(s, &s->running, q, SCHED_FINISH_ERROR, rc ? rc : KVS_EINVAL);
            return true;
        }
        grammar_mask_logits(s->gmask, s->n_gtokens, scratch);
        for (uint32_t i = (uint32_t)s->n_gtokens; i < s->n_vocab; i++)
            scratch[i] = -INFINITY; /* rows past the tokenizer's vocabulary: no bytes */
    }
    sched_token_info info = {0};
    bool want_lp = r->n_top_logprobs >= 0;
    info.n_top = want_lp ? r->n_top_logprobs : 0;
    int32_t tok = sampler_sample(q->smp, scratch, want_lp ? &info.logprob : NULL, info.n_top,
                                 info.top_ids, info.top_logprobs);
    info.id = tok;
    /* Under a mask the tail of the tops can be tokens never allowed (-inf): not alternatives. */
    while (q->gram && info.n_top > 0 && !isfinite(info.top_logprobs[info.n_top - 1]))
        info.n_top--;
    if (q->gram && !grammar_accept_token(q->gram, s->gvocab, tok)) {
        /* the mask allowed it, so only memory can have run out */
        sched__finish_seq(s, &s->running, q, SCHED_FINISH_ERROR, KVS_ENOMEM);
        return true;
    }
    sampler_accept(q->smp, tok, false);
    q->tokens[q->n_tokens++] = tok;
    q->n_generated++;
    atomic_fetch_add_explicit(&r->generated, 1, memory_order_relaxed);
    double now = time_now_s();
    pthread_mutex_lock(&s->metrics_mu);
    s->m.generation_tokens_total++;
    if (q->n_generated == 1) {
        if (!r->first_token_seen)
            sched__hist_add(&s->m.time_to_first_token_seconds, now - r->t_submit);
    } else {
        sched__hist_add(&s->m.inter_token_latency_seconds, now - q->t_last_token);
    }
    pthread_mutex_unlock(&s->metrics_mu);
    r->first_token_seen = true;
    q->t_last_token = now;

    sched_event ev = {0};
    ev.choice = q->choice;
    ev.generated = q->n_generated;
    if (want_lp) {
        ev.tokens = malloc(sizeof info);
        if (ev.tokens) {
            *ev.tokens = info;
            ev.n_tokens = 1;
        }
    }
    enum sched_finish fin = SCHED_FINISH_NONE;
    if (is_stop_token(s, r, tok) || (q->gram && is_end_token(s, tok))) {
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
                    sched__finish_seq(s, &s->running, q, SCHED_FINISH_ERROR, KVS_ENOMEM);
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
            if (q->gram && grammar_is_finished(q->gram))
                fin = SCHED_FINISH_STOP; /* the value is whole and nothing may follow */
            else if (q->n_generated >= r->max_tokens)
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
        /* The finishing event carries this token's info with the text it completes. */
        free(ev.text);
        sched__finish_seq_tokens(s, &s->running, q, fin, 0, ev.tokens, ev.n_tokens);
        return true;
    }
    if (ev.text_len || ev.n_tokens)
        sched__push_event(r, &ev);
    return false;
}

/* Creates the other n - 1 choices of q's request, sharing q's blocks. */
void sched__fork_choices(sched *s, seq *q)
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
        if (!rc && q->gram)
            rc = grammar_clone(q->gram, &f->gram);
        if (!rc)
            rc = sched__kv_fork(s, q, f);
        if (rc) {
            if (f) {
                sampler_destroy(f->smp);
                grammar_destroy(f->gram);
                free(f->tokens);
                free(f);
            }
            sched_event ev = {.choice = c,
                              .finish = SCHED_FINISH_ERROR,
                              .status = rc,
                              .prompt_tokens = r->n_prompt};
            sched__push_event(r, &ev);
            r->n_done++;
            continue;
        }
        f->req = r;
        f->choice = c;
        f->ever_admitted = true;
        f->state = SEQ_RUNNING;
        f->admit_order = ++s->admit_counter;
        f->logits_row = q->logits_row;
        f->plp_sent = true; /* the first choice's event carries the prompt's */
        tok_decoder_init(&f->dec);
        memcpy(f->tokens, q->tokens, q->n_tokens * sizeof(int32_t));
        f->n_tokens = q->n_tokens;
        f->n_computed = q->n_computed;
        sched__list_push_back(&s->running, f);
    }
}
