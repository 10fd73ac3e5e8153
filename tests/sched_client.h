/* A scheduler client for the cmocka suites: collects one request's events, woken by the
 * scheduler's notify. Header-only, shared by test_scheduler.c and test_scheduler_stress.c;
 * the including suite includes cmocka first. */
#ifndef KVS_TESTS_SCHED_CLIENT_H
#define KVS_TESTS_SCHED_CLIENT_H

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "scheduler/scheduler.h"
#include "test_reference.h"

#define CLIENT_MAX_CHOICES 16

/* The suite's model and llama2.c's reference cases, loaded once by the group setup. */
static engine_model *g_model;
static ref_case g_cases[REF_MAX_CASES];
static int g_n_cases;

static inline int suite_setup(void **state)
{
    (void)state;
    return ref_load(&g_model, g_cases, &g_n_cases) < 0 ? -1 : 0;
}

static inline int suite_teardown(void **state)
{
    (void)state;
    engine_model_destroy(g_model);
    return 0;
}

typedef struct client {
    sched_req *req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int notified;
    uint32_t n_choices;
    int32_t ids[CLIENT_MAX_CHOICES][REF_MAX_IDS];
    int n_ids[CLIENT_MAX_CHOICES];
    char text[CLIENT_MAX_CHOICES][8192];
    size_t text_len[CLIENT_MAX_CHOICES];
    enum sched_finish finish[CLIENT_MAX_CHOICES];
    int n_finish[CLIENT_MAX_CHOICES]; /* finishing events seen: exactly 1 once done */
    int status[CLIENT_MAX_CHOICES];
    uint32_t completion_tokens[CLIENT_MAX_CHOICES];
    uint32_t cached_tokens[CLIENT_MAX_CHOICES]; /* the prompt's, from the last event */
    uint32_t n_events;
    /* The prompt event (sched_request_params.prompt_logprobs), taken over from it. */
    sched_token_info *plp;
    uint32_t n_plp;
    int n_prompt_events;
    /* An embedding request's event, taken over from it. */
    float *embedding;
    uint32_t n_embedding;
    int done;
} client;

static inline void on_notify(void *ud)
{
    client *c = ud;
    pthread_mutex_lock(&c->mu);
    c->notified = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static inline void client_init(client *c, uint32_t n)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->n_choices = n;
}

/* Takes whatever is queued; returns 1 once every choice has finished. */
static inline int client_drain(client *c)
{
    sched_event ev;
    int rc;
    while ((rc = sched_req_next(c->req, &ev)) == 1) {
        uint32_t ch = ev.choice;
        assert_true(ch < c->n_choices);
        assert_int_equal(c->n_finish[ch], 0); /* nothing after a choice's last event */
        c->n_events++;
        if (ev.prompt) {
            /* first, once, for choice 0, and without text */
            assert_int_equal(c->n_prompt_events++, 0);
            assert_int_equal(ch, 0);
            assert_int_equal(c->n_ids[0], 0);
            assert_int_equal(ev.text_len, 0);
            assert_int_equal(ev.finish, SCHED_FINISH_NONE);
            c->plp = ev.tokens;
            c->n_plp = ev.n_tokens;
            ev.tokens = NULL;
            sched_event_free(&ev);
            continue;
        }
        if (ev.embedding) { /* once, without text, before the finishing event */
            assert_null(c->embedding);
            assert_int_equal(ev.finish, SCHED_FINISH_NONE);
            assert_int_equal(ev.text_len, 0);
            c->embedding = ev.embedding;
            c->n_embedding = ev.n_embedding;
            ev.embedding = NULL;
            sched_event_free(&ev);
            continue;
        }
        for (uint32_t i = 0; i < ev.n_tokens; i++) {
            assert_true(c->n_ids[ch] < REF_MAX_IDS);
            c->ids[ch][c->n_ids[ch]++] = ev.tokens[i].id;
        }
        assert_true(c->text_len[ch] + ev.text_len < sizeof c->text[ch]);
        if (ev.text_len)
            memcpy(c->text[ch] + c->text_len[ch], ev.text, ev.text_len);
        c->text_len[ch] += ev.text_len;
        if (ev.finish != SCHED_FINISH_NONE) {
            c->finish[ch] = ev.finish;
            c->n_finish[ch]++;
            c->status[ch] = ev.status;
            c->completion_tokens[ch] = ev.completion_tokens;
            c->cached_tokens[ch] = ev.cached_tokens;
        }
        sched_event_free(&ev);
    }
    if (rc < 0) {
        for (uint32_t ch = 0; ch < c->n_choices; ch++)
            assert_int_equal(c->n_finish[ch], 1);
        c->done = 1;
    }
    return c->done;
}

/* Waits until every choice has finished; fails after timeout_s seconds. */
static inline void client_wait_for(client *c, int timeout_s)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (client_drain(c))
            return;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > timeout_s)
            fail_msg("request not finished after %d s", timeout_s);
        pthread_mutex_lock(&c->mu);
        if (!c->notified) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        c->notified = 0;
        pthread_mutex_unlock(&c->mu);
    }
}

static inline void client_wait(client *c)
{
    client_wait_for(c, 600);
}

static inline void client_finish(client *c)
{
    sched_req_release(c->req);
    c->req = NULL;
    free(c->plp);
    c->plp = NULL;
    free(c->embedding);
    c->embedding = NULL;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static inline sched_request_params greedy_params(const ref_case *rc)
{
    sched_request_params p = {0};
    p.prompt = rc->prompt;
    p.n_prompt = (uint32_t)rc->n_prompt;
    p.max_tokens = (uint32_t)rc->n_completion;
    p.n = 1;
    p.sampling = sampler_default_params();
    p.sampling.temperature = 0.0f;
    p.n_top_logprobs = 0; /* token ids come with logprob infos */
    return p;
}

/* Waits (up to 5 s) until the pool holds no used block and nothing runs. */
static inline void wait_blocks_free(sched *s)
{
    sched_metrics m;
    for (int i = 0; i < 1000; i++) {
        sched_get_metrics(s, &m);
        if (m.kv_blocks_used == 0 && m.kv_window_blocks_used == 0 && m.num_requests_running == 0 &&
            m.num_requests_waiting == 0)
            return;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fail_msg("%u KV blocks (%u windowed) still used, %u running, %u waiting", m.kv_blocks_used,
             m.kv_window_blocks_used, m.num_requests_running, m.num_requests_waiting);
}

/* A snapshot's own consistency: holders are running sequences, every used block has one and
 * every holder's table is counted in refs (so nothing was caught mid-step). */
static inline void check_snapshot(const sched_kv_snapshot *k)
{
    uint64_t refs = 0, table = 0;
    for (uint32_t b = 0; b < k->n_blocks; b++) {
        assert_true(k->state[b] <= SCHED_BLOCK_USED);
        assert_true(k->owner[b] >= -1 && k->owner[b] < (int32_t)k->n_seqs);
        if (k->state[b] == SCHED_BLOCK_USED) {
            assert_true(k->refs[b] >= 1);
            assert_true(k->owner[b] >= 0);
        } else {
            assert_int_equal(k->refs[b], 0);
            assert_int_equal(k->owner[b], -1);
        }
        refs += k->refs[b];
    }
    for (uint32_t i = 0; i < k->n_seqs; i++) {
        table += k->seqs[i].n_blocks;
        assert_true(k->seqs[i].request >= 1);
        /* blocks are reserved for known tokens only (prefill chunks may not cover all yet) */
        assert_true(k->seqs[i].n_blocks <=
                    (k->seqs[i].n_tokens + k->block_size - 1) / k->block_size);
    }
    assert_int_equal(refs, table);
    /* a split cache's windowed group: shared blocks count once there, once per holder here */
    uint64_t wtable = 0;
    for (uint32_t i = 0; i < k->n_seqs; i++)
        wtable += k->seqs[i].n_window_blocks;
    assert_true(k->window_used <= wtable);
    assert_true(k->window_used + k->window_cached <= k->n_window_blocks);
    if (!k->window)
        assert_int_equal(wtable, 0);
}

#endif
