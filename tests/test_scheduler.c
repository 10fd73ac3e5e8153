/* Scheduler: continuous batching on the real stories260K model. Concurrent requests give the
 * reference tokens; a tiny pool forces preemption without changing any output; cancellation,
 * prefix reuse, n > 1, stop strings and the queue bound behave as scheduler.h says. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "sched_client.h"
#include "scheduler/scheduler.h"
#include "test_reference.h"

#define MAX_CASES REF_MAX_CASES

/* A scheduler on the shared model with these limits; the test skips when the model is absent
 * (../shared/models). */
static sched *make_sched_steps(uint32_t kv_blocks, uint32_t max_seqs, uint32_t max_queue,
                               uint32_t step_tokens, uint32_t n_ctx,
                               void (*observer)(void *, const sched_kv_snapshot *), void *ud)
{
    if (!g_model)
        skip();
    sched_params sp = sched_default_params();
    sp.step_observer = observer;
    sp.step_observer_ud = ud;
    sp.n_ctx = n_ctx;
    sp.n_threads = 1;
    sp.kv_blocks = kv_blocks;
    sp.kv_cache_mb = 16;
    sp.max_num_seqs = max_seqs;
    sp.max_queue = max_queue;
    sp.max_batched_tokens = step_tokens;
    sched *s;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    return s;
}

static sched *make_sched_observed(uint32_t kv_blocks, uint32_t max_seqs, uint32_t max_queue,
                                  void (*observer)(void *, const sched_kv_snapshot *), void *ud)
{
    /* 64 tokens a step: small, so prompts are chunked across steps */
    return make_sched_steps(kv_blocks, max_seqs, max_queue, 64, 512, observer, ud);
}

static sched *make_sched(uint32_t kv_blocks, uint32_t max_seqs, uint32_t max_queue)
{
    return make_sched_observed(kv_blocks, max_seqs, max_queue, NULL, NULL);
}

/* The end of every test: all blocks back in the pool, no request left unfinished, s destroyed. */
static void end_sched(sched *s)
{
    /* A request's finishing event goes out just before the engine thread counts it finished,
     * and one served in a single step never shows in the gauges: wait for both. */
    for (int i = 0; i < 1000 && sched_n_unfinished(s); i++)
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    wait_blocks_free(s);
    assert_int_equal(sched_n_unfinished(s), 0);
    sched_destroy(s);
}

/* Submits p for c (n choices) and waits for its last event. */
static void submit_wait(sched *s, const sched_request_params *p, client *c, uint32_t n)
{
    client_init(c, n);
    assert_int_equal(sched_submit(s, p, on_notify, c, &c->req), 0);
    client_wait(c);
}

static void expect_case(const client *c, uint32_t ch, const ref_case *rc)
{
    /* Stop at BOS: the scheduler stops on it and reports the reference's length without it. */
    int n = c->n_ids[ch];
    if (n > 0 && c->ids[ch][n - 1] == 1) {
        assert_int_equal(c->finish[ch], SCHED_FINISH_STOP);
        n--;
    } else {
        assert_int_equal(c->finish[ch], SCHED_FINISH_LENGTH);
    }
    assert_int_equal(n, rc->n_completion);
    for (int i = 0; i < n; i++)
        if (c->ids[ch][i] != rc->completion[i])
            fail_msg("token %d: %d, reference %d", i, c->ids[ch][i], rc->completion[i]);
    assert_int_equal(c->text_len[ch], strlen(rc->text));
    assert_memory_equal(c->text[ch], rc->text, c->text_len[ch]);
}

static void run_all_cases(sched *s, int copies)
{
    client *cl = calloc((size_t)(g_n_cases * copies), sizeof *cl);
    for (int k = 0; k < g_n_cases * copies; k++) {
        const ref_case *rc = &g_cases[k % g_n_cases];
        sched_request_params p = greedy_params(rc);
        client_init(&cl[k], 1);
        assert_int_equal(sched_submit(s, &p, on_notify, &cl[k], &cl[k].req), 0);
    }
    for (int k = 0; k < g_n_cases * copies; k++) {
        client_wait(&cl[k]);
        expect_case(&cl[k], 0, &g_cases[k % g_n_cases]);
        client_finish(&cl[k]);
    }
    free(cl);
}

static void test_concurrent_reference(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    run_all_cases(s, 1);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.multi_seq_steps_total > 0);
    end_sched(s);
}

static void test_pool_pressure_preempts(void **state)
{
    (void)state;
    /* 40 blocks of 16 = 640 slots; 12 sequences of ~260 tokens need ~200 blocks. */
    sched *s = make_sched(40, 12, 64);
    run_all_cases(s, 3);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.preemptions_total > 0);
    end_sched(s);
}

static void test_prefix_reuse_same_output(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    /* Prompt: a reference prompt plus its first c completion tokens (so it spans full
     * blocks); the continuation must be the reference's next 20 tokens both times, the second
     * time served partly from cached blocks: 53 tokens, 3 full blocks of 16 and 5 to compute;
     * 48 tokens, all cached, only the last position computed again for its logits. */
    const ref_case *rc = &g_cases[1];
    for (int len = 53; len >= 48; len -= 5) {
        int c_len = len - rc->n_prompt;
        assert_true(c_len > 0 && c_len + 20 <= rc->n_completion);
        int32_t prompt[128];
        memcpy(prompt, rc->prompt, (size_t)rc->n_prompt * sizeof(int32_t));
        memcpy(prompt + rc->n_prompt, rc->completion, (size_t)c_len * sizeof(int32_t));
        sched *s = make_sched(0, 4, 16);
        for (int round = 0; round < 2; round++) {
            client c;
            sched_request_params p = greedy_params(rc);
            p.prompt = prompt;
            p.n_prompt = (uint32_t)len;
            p.max_tokens = 20;
            submit_wait(s, &p, &c, 1);
            assert_int_equal(c.n_ids[0], 20);
            assert_memory_equal(c.ids[0], rc->completion + c_len, 20 * sizeof(int32_t));
            assert_int_equal(c.cached_tokens[0], round == 0 ? 0 : len == 48 ? 47 : 48);
            client_finish(&c);
            sched_metrics m;
            sched_get_metrics(s, &m);
            assert_int_equal(m.prefix_cache_hits_total, round == 0 ? 0 : 3);
        }
        end_sched(s);
    }
}

static void test_cancel_frees_blocks(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    for (int k = 0; k < 8; k++) {
        client c;
        sched_request_params p = greedy_params(&g_cases[k % g_n_cases]);
        client_init(&c, 1);
        assert_int_equal(sched_submit(s, &p, on_notify, &c, &c.req), 0);
        if (k % 2) { /* wait for a first token, then vanish */
            while (c.n_ids[0] == 0 && !c.done) {
                client_drain(&c);
                struct timespec ts = {0, 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
        client_finish(&c);
    }
    end_sched(s);
}

static void test_n_choices_and_stop_string(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    client c;
    sched_request_params p = greedy_params(&g_cases[0]);
    p.n = 3;
    p.max_tokens = 40;
    p.sampling.temperature = 0.8f;
    p.sampling.seed = 42;
    submit_wait(s, &p, &c, 3);
    for (int ch = 0; ch < 3; ch++) {
        assert_true(c.finish[ch] == SCHED_FINISH_LENGTH || c.finish[ch] == SCHED_FINISH_STOP);
        assert_true(c.n_ids[ch] > 0);
    }
    /* three different draws from the same prompt */
    assert_true(c.n_ids[0] != c.n_ids[1] || memcmp(c.ids[0], c.ids[1], sizeof c.ids[0]) != 0 ||
                c.n_ids[0] != c.n_ids[2] || memcmp(c.ids[0], c.ids[2], sizeof c.ids[0]) != 0);
    client_finish(&c);

    /* the same seed gives the same tokens */
    client d;
    p.n = 1;
    submit_wait(s, &p, &d, 1);
    assert_int_equal(d.n_ids[0], c.n_ids[0]);
    assert_memory_equal(d.ids[0], c.ids[0], (size_t)d.n_ids[0] * sizeof(int32_t));
    client_finish(&d);

    /* stop string: the reference text up to "Lily" */
    client e;
    p = greedy_params(&g_cases[0]);
    p.stop[0] = "Lily";
    submit_wait(s, &p, &e, 1);
    assert_int_equal(e.finish[0], SCHED_FINISH_STOP);
    const char *at = strstr(g_cases[0].text, "Lily");
    assert_non_null(at);
    assert_int_equal(e.text_len[0], (size_t)(at - g_cases[0].text));
    assert_memory_equal(e.text[0], g_cases[0].text, e.text_len[0]);
    client_finish(&e);
    end_sched(s);
}

/* Regression: forks that finish on their first token (max_tokens 1, a stop string matching
 * it) were freed while the loop over the new forks still read their next link: a
 * use-after-free that lost choices and then crashed the engine thread. */
static void test_forks_finish_on_first_token(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    for (int round = 0; round < 4; round++) {
        client *c = calloc(1, sizeof *c);
        sched_request_params p = greedy_params(&g_cases[round % g_n_cases]);
        p.n = 8;
        p.sampling.temperature = 1.0f;
        p.sampling.seed = (uint64_t)round;
        if (round % 2 == 0) {
            p.max_tokens = 1;
        } else {
            /* every one-character piece of the reference text: some fork hits one at once */
            p.stop[0] = "e";
            p.stop[1] = " ";
            p.stop[2] = "a";
            p.stop[3] = "o";
            p.max_tokens = 8;
        }
        client_init(c, p.n);
        assert_int_equal(sched_submit(s, &p, on_notify, c, &c->req), 0);
        client_wait_for(c, 60);
        for (uint32_t ch = 0; ch < p.n; ch++) {
            assert_int_equal(c->n_finish[ch], 1);
            assert_true(c->finish[ch] == SCHED_FINISH_LENGTH || c->finish[ch] == SCHED_FINISH_STOP);
            assert_true(c->completion_tokens[ch] >= 1 && c->completion_tokens[ch] <= p.max_tokens);
        }
        client_finish(c);
        free(c);
    }
    end_sched(s);
}

/* Each choice is a running sequence: a request with more choices than max_num_seqs is
 * refused, and the forks of admitted requests never take the running count over the limit
 * (a second request waits until the first one's choices are done). */
static void test_forks_count_against_max_num_seqs(void **state)
{
    (void)state;
    sched *s = make_sched(0, 4, 64);
    sched_request_params p = greedy_params(&g_cases[0]);
    sched_req *r;
    p.n = 5;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    client *c = calloc(2, sizeof *c);
    p.n = 3;
    p.max_tokens = 48;
    for (int k = 0; k < 2; k++) {
        client_init(&c[k], 3);
        assert_int_equal(sched_submit(s, &p, on_notify, &c[k], &c[k].req), 0);
    }
    uint32_t peak = 0;
    while (!(c[0].done && c[1].done)) {
        sched_metrics m;
        sched_get_metrics(s, &m);
        if (m.num_requests_running > peak)
            peak = m.num_requests_running;
        for (int k = 0; k < 2; k++)
            if (!c[k].done)
                client_drain(&c[k]);
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_true(peak >= 3);
    assert_true(peak <= 4);
    for (int k = 0; k < 2; k++)
        client_finish(&c[k]);
    free(c);
    end_sched(s);
}

/* Seen by the step observer (engine thread): a step after which the three forks of request
 * serial shared a block */
typedef struct shared_seen {
    atomic_uint_least64_t serial;
    atomic_bool saw;
} shared_seen;

static void observe_shared(void *ud, const sched_kv_snapshot *k)
{
    shared_seen *o = ud;
    if (k->n_seqs != 3)
        return;
    for (uint32_t i = 0; i < 3; i++)
        if (k->seqs[i].request != atomic_load(&o->serial))
            return;
    for (uint32_t b = 0; b < k->n_blocks; b++)
        if (k->refs[b] == 3)
            atomic_store(&o->saw, true);
}

/* The KV picture: idle all free; while an n = 3 request runs its forks share the prompt's
 * blocks (refs > 1: seen after every step by the step observer, whatever the threads' timing)
 * and every snapshot taken meanwhile is consistent; afterwards nothing is used and the
 * prompt's full blocks stay cached. */
static void test_kv_snapshot(void **state)
{
    (void)state;
    static shared_seen seen;
    atomic_store(&seen.serial, 0);
    atomic_store(&seen.saw, false);
    sched *s = make_sched_observed(64, 8, 16, observe_shared, &seen);
    sched_kv_snapshot k;
    assert_int_equal(sched_kv_snapshot_take(s, &k, 5000), 0);
    assert_int_equal(k.n_blocks, 64);
    assert_int_equal(k.block_size, 16);
    assert_int_equal(k.n_seqs, 0);
    for (uint32_t b = 0; b < k.n_blocks; b++)
        assert_int_equal(k.state[b], SCHED_BLOCK_FREE);
    sched_kv_snapshot_free(&k);

    /* a prompt of three full blocks and a bit: forks share them */
    const ref_case *rc = &g_cases[1];
    int32_t prompt[128];
    int np = rc->n_prompt;
    memcpy(prompt, rc->prompt, (size_t)np * sizeof(int32_t));
    memcpy(prompt + np, rc->completion, 40 * sizeof(int32_t));
    np += 40;
    client *c = calloc(1, sizeof *c);
    sched_request_params p = greedy_params(rc);
    p.prompt = prompt;
    p.n_prompt = (uint32_t)np;
    p.n = 3;
    p.max_tokens = 120;
    p.ignore_eos = true;
    client_init(c, 3);
    assert_int_equal(sched_submit(s, &p, on_notify, c, &c->req), 0);
    uint64_t serial = sched_req_serial(c->req);
    assert_true(serial >= 1);
    atomic_store(&seen.serial, serial);
    do { /* at least one, however fast the request ran */
        assert_int_equal(sched_kv_snapshot_take(s, &k, 5000), 0);
        check_snapshot(&k);
        if (k.n_seqs == 3)
            for (uint32_t i = 0; i < 3; i++)
                assert_true(k.seqs[i].request == serial);
        sched_kv_snapshot_free(&k);
    } while (!client_drain(c));
    assert_true(atomic_load(&seen.saw));
    client_finish(c);
    free(c);
    wait_blocks_free(s);
    assert_int_equal(sched_kv_snapshot_take(s, &k, 5000), 0);
    uint32_t cached = 0;
    for (uint32_t b = 0; b < k.n_blocks; b++) {
        assert_true(k.state[b] != SCHED_BLOCK_USED);
        cached += k.state[b] == SCHED_BLOCK_CACHED;
    }
    assert_true(cached >= 3);
    sched_kv_snapshot_free(&k);
    end_sched(s);
}

/* Constrained decoding: with an object grammar every choice (the first and its forks, which
 * clone its grammar) is one such object, ending with "stop" as its "}" closes it. The
 * same prompt unconstrained is a story, so the mask is what makes it JSON. The def is the
 * scheduler's after a successful submit, and still the caller's after a refused one. */
static void test_grammar_json_object(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    sched_request_params p = greedy_params(&g_cases[0]);
    p.n = 4;
    p.max_tokens = 400;
    p.sampling.temperature = 0.7f;
    p.sampling.seed = 7;
    p.n_top_logprobs = -1; /* the client keeps at most REF_MAX_IDS token infos */
    /* {"mood": "happy" | "sad", "age": integer} */
    grammar_builder *gb;
    int32_t obj, mood, age;
    static const char *const moods[] = {"\"happy\"", "\"sad\""};
    static const size_t mood_lens[] = {7, 5};
    assert_int_equal(grammar_builder_create(&gb), 0);
    assert_int_equal(grammar_builder_object(gb, &obj), 0);
    assert_int_equal(grammar_builder_literals(gb, 2, moods, mood_lens, &mood), 0);
    assert_int_equal(grammar_builder_number(gb, true, &age), 0);
    assert_int_equal(grammar_builder_property(gb, obj, "mood", 4, mood, true), 0);
    assert_int_equal(grammar_builder_property(gb, obj, "age", 3, age, true), 0);
    char err[128];
    assert_int_equal(grammar_builder_finish(gb, obj, NULL, &p.grammar, err, sizeof err), 0);
    grammar_builder_destroy(gb);
    p.n = 0; /* refused: the def stays ours */
    client r;
    client_init(&r, 1);
    assert_int_equal(sched_submit(s, &p, on_notify, &r, &r.req), KVS_EINVAL);
    p.n = 4;
    client c;
    submit_wait(s, &p, &c, 4);
    for (int ch = 0; ch < 4; ch++) {
        assert_int_equal(c.status[ch], 0);
        c.text[ch][c.text_len[ch]] = '\0';
        const char *t = c.text[ch];
        while (*t == ' ' || *t == '\n' || *t == '\t')
            t++;
        assert_true(*t == '{');
        assert_int_equal(c.finish[ch], SCHED_FINISH_STOP); /* "}" ends it */
        cJSON *j = cJSON_Parse(c.text[ch]);
        assert_true(cJSON_IsObject(j));
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "mood");
        assert_true(cJSON_IsString(m));
        assert_true(!strcmp(m->valuestring, "happy") || !strcmp(m->valuestring, "sad"));
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "age");
        if (!cJSON_IsNumber(a) || a->valuedouble != floor(a->valuedouble))
            fail_msg("age is not an integer in %s", c.text[ch]);
        assert_int_equal(cJSON_GetArraySize(j), 2);
        cJSON_Delete(j);
    }
    client_finish(&c);

    /* unconstrained, the same prompt is not JSON */
    client d;
    p = greedy_params(&g_cases[0]);
    submit_wait(s, &p, &d, 1);
    d.text[0][d.text_len[0]] = '\0';
    cJSON *j = cJSON_Parse(d.text[0]);
    assert_false(cJSON_IsObject(j));
    cJSON_Delete(j);
    client_finish(&d);
    end_sched(s);
}

/* logit_bias +100 on one token makes greedy decoding pick it every step; ids outside the
 * vocabulary and non-finite biases are refused. */
static void test_logit_bias(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    sched_request_params p = greedy_params(&g_cases[0]);
    p.max_tokens = 8;
    p.ignore_eos = true;
    int32_t forced = g_cases[0].completion[3];
    sched_logit_bias b = {forced, 100.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    client c;
    p.n_top_logprobs = 0;
    submit_wait(s, &p, &c, 1);
    assert_int_equal(c.n_ids[0], 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c.ids[0][i], forced);
    client_finish(&c);
    b.id = (int32_t)engine_model_hparams(g_model)->n_vocab;
    assert_int_equal(sched_submit(s, &p, on_notify, &c, &c.req), KVS_EINVAL);
    b.id = forced;
    b.bias = NAN;
    assert_int_equal(sched_submit(s, &p, on_notify, &c, &c.req), KVS_EINVAL);
    end_sched(s);
}

/* A choice's last token comes with its own text in the finishing event (not its logprobs in
 * one event and its text in the next). */
static void test_last_token_with_its_text(void **state)
{
    (void)state;
    sched *s = make_sched(0, 16, 64);
    sched_request_params p = greedy_params(&g_cases[0]);
    p.max_tokens = 5;
    p.n_top_logprobs = 1;
    client c;
    client_init(&c, 1);
    assert_int_equal(sched_submit(s, &p, on_notify, &c, &c.req), 0);
    for (;;) {
        sched_event ev;
        int rc = sched_req_next(c.req, &ev);
        if (rc < 0)
            break;
        if (rc == 0) {
            pthread_mutex_lock(&c.mu);
            if (!c.notified) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&c.cv, &c.mu, &ts);
            }
            c.notified = 0;
            pthread_mutex_unlock(&c.mu);
            continue;
        }
        /* every event is one token with its text (plain English, no stop strings) */
        assert_int_equal(ev.n_tokens, 1);
        assert_true(ev.text_len > 0);
        if (ev.finish != SCHED_FINISH_NONE)
            assert_int_equal(ev.finish, SCHED_FINISH_LENGTH);
        sched_event_free(&ev);
    }
    client_finish(&c);
    end_sched(s);
}

static void test_queue_bound_and_validation(void **state)
{
    (void)state;
    sched *s = make_sched(0, 1, 2);
    client c[6];
    int accepted = 0, rejected = 0;
    for (int k = 0; k < 6; k++) {
        sched_request_params p = greedy_params(&g_cases[0]);
        client_init(&c[k], 1);
        int rc = sched_submit(s, &p, on_notify, &c[k], &c[k].req);
        if (rc == 0)
            accepted++;
        else {
            assert_int_equal(rc, KVS_ENOSPC);
            rejected++;
        }
    }
    assert_true(accepted <= 3);
    assert_true(rejected >= 3);
    sched_request_params p = greedy_params(&g_cases[0]);
    sched_req *r;
    p.max_tokens = 600; /* prompt + max_tokens over the 512 context */
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_ERANGE);
    p.max_tokens = 4;
    int32_t bad[2] = {1, 9999};
    p.prompt = bad;
    p.n_prompt = 2;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    for (int k = 0; k < 6; k++)
        if (c[k].req)
            client_finish(&c[k]);
    wait_blocks_free(s);
    sched_drain(s);
    p = greedy_params(&g_cases[0]);
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EBUSY);
    sched_destroy(s);
}

/* A pool too small for everyone and 8 tokens a step: two plain sequences (200 reference tokens
 * each) decoding while the newest, third, is still in its prefill, so it is the one preempted
 * there, then computed again from the start. Runs third (a 214-token prompt) that way; checks
 * the plain two, the third with check, and that something was preempted. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, open;
} gate;

/* A step observer that holds the engine thread after its first step until the gate opens. */
static void gate_observer(void *ud, const sched_kv_snapshot *k)
{
    (void)k;
    gate *g = ud;
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void run_preempted(sched_request_params third, void (*check)(const client *))
{
    client c3v, *c3 = &c3v;
    /* the first plain one runs a step alone, then the engine waits at the gate until the
     * other two are queued: admitted in that order whatever the threads do */
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    sched *s = make_sched_steps(17, 3, 16, 8, 240, gate_observer, &g);
    client cp[2];
    for (int k = 0; k < 3; k++) {
        sched_request_params q = k == 2 ? third : greedy_params(&g_cases[k]);
        client *c = k == 2 ? c3 : &cp[k];
        if (k < 2)
            q.max_tokens = 200; /* within the 240-token context */
        client_init(c, 1);
        assert_int_equal(sched_submit(s, &q, on_notify, c, &c->req), 0);
        pthread_mutex_lock(&g.mu);
        while (k == 0 && !g.entered)
            pthread_cond_wait(&g.cv, &g.mu);
        g.open = k == 2;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
    }
    for (int k = 0; k < 3; k++)
        client_wait(k == 2 ? c3 : &cp[k]);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(cp[k].n_ids[0], 200);
        assert_memory_equal(cp[k].ids[0], g_cases[k].completion, 200 * sizeof(int32_t));
        client_finish(&cp[k]);
    }
    check(c3);
    client_finish(c3); /* before the scheduler goes (sched_destroy) */
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.preemptions_total > 0);
    end_sched(s);
}

/* Prompt logprobs (what echo with logprobs reports): token i's logprob given tokens 0..i-1, for
 * every prompt token after the first. The want: one engine_forward over the whole prompt with
 * every row's logits, log-softmaxed in double here, and (bit for bit) through
 * sampler_logprobs, as the scheduler must give them however the prompt is chunked, shared,
 * cached or preempted. */
#define PLP_TOP 5
static int32_t plp_prompt[REF_MAX_IDS];
static int plp_len;
static sched_token_info *plp_want;
static float *plp_hidden; /* (plp_len, n_embd): every row's hidden state, from the same pass */

static void plp_reference(void)
{
    const ref_case *rc = &g_cases[1];
    plp_len = rc->n_prompt + 200 <= rc->n_prompt + rc->n_completion
                  ? rc->n_prompt + 200
                  : rc->n_prompt + rc->n_completion;
    memcpy(plp_prompt, rc->prompt, (size_t)rc->n_prompt * sizeof(int32_t));
    memcpy(plp_prompt + rc->n_prompt, rc->completion,
           (size_t)(plp_len - rc->n_prompt) * sizeof(int32_t));
    uint32_t V = engine_model_hparams(g_model)->n_vocab, n = (uint32_t)plp_len, bs = 16;
    engine_kv *kv;
    engine_ctx *ctx;
    assert_int_equal(engine_kv_create(g_model, ENGINE_KV_F16, n / bs + 1, bs, &kv), 0);
    assert_int_equal(engine_ctx_create(g_model, n, 1, &ctx), 0);
    int32_t blocks[REF_MAX_IDS / 16 + 1], pos[REF_MAX_IDS], sq[REF_MAX_IDS];
    bool want[REF_MAX_IDS];
    for (uint32_t b = 0; b < n / bs + 1; b++)
        blocks[b] = (int32_t)b;
    for (uint32_t i = 0; i < n; i++) {
        pos[i] = (int32_t)i;
        sq[i] = 0;
        want[i] = true;
    }
    engine_seq_view v = {blocks, n / bs + 1, NULL, 0};
    engine_batch b = {n, plp_prompt, pos, sq, want, 1, &v};
    float *logits = malloc((size_t)n * V * sizeof(float));
    free(plp_hidden);
    plp_hidden = malloc((size_t)n * engine_model_hparams(g_model)->n_embd * sizeof(float));
    assert_int_equal(engine_forward_hidden(ctx, kv, &b, logits, want, plp_hidden), 0);
    free(plp_want);
    plp_want = calloc(n - 1, sizeof *plp_want);
    for (uint32_t i = 0; i + 1 < n; i++) {
        const float *row = logits + (size_t)i * V;
        sched_token_info *t = &plp_want[i];
        t->id = plp_prompt[i + 1];
        t->n_top = PLP_TOP;
        sampler_logprobs(row, (int32_t)V, t->id, &t->logprob, PLP_TOP, t->top_ids, t->top_logprobs);
        double m = row[0], z = 0;
        for (uint32_t k = 1; k < V; k++)
            m = row[k] > m ? row[k] : m;
        for (uint32_t k = 0; k < V; k++)
            z += exp(row[k] - m);
        assert_true(fabs(t->logprob - (row[t->id] - m - log(z))) < 1e-5);
        for (uint32_t k = 0; k < V; k++) /* the tops: the largest, in order */
            assert_true(row[k] <= row[t->top_ids[0]]);
        for (int k = 1; k < PLP_TOP; k++)
            assert_true(t->top_logprobs[k] <= t->top_logprobs[k - 1]);
    }
    free(logits);
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
}

static void expect_plp(const client *c)
{
    assert_int_equal(c->n_prompt_events, 1);
    assert_int_equal(c->n_plp, (uint32_t)plp_len - 1);
    for (int i = 0; i + 1 < plp_len; i++) {
        const sched_token_info *g = &c->plp[i], *w = &plp_want[i];
        if (g->id != w->id || g->logprob != w->logprob || g->n_top != w->n_top ||
            memcmp(g->top_ids, w->top_ids, PLP_TOP * sizeof(int32_t)) ||
            memcmp(g->top_logprobs, w->top_logprobs, PLP_TOP * sizeof(float)))
            fail_msg("prompt token %d: id %d logprob %.9g, want id %d %.9g", i + 1, g->id,
                     (double)g->logprob, w->id, (double)w->logprob);
    }
}

static sched_request_params plp_params(uint32_t max_tokens, uint32_t n)
{
    sched_request_params p = greedy_params(&g_cases[1]);
    p.prompt = plp_prompt;
    p.n_prompt = (uint32_t)plp_len;
    p.max_tokens = max_tokens;
    p.n = n;
    p.n_top_logprobs = PLP_TOP;
    p.prompt_logprobs = true;
    return p;
}

/* run_preempted's check of a plp_params(16, 1) request: the logprobs, then the reference's
 * next 16 tokens */
static void check_plp_16(const client *c)
{
    expect_plp(c);
    const ref_case *rc = &g_cases[1];
    assert_memory_equal(c->ids[0], rc->completion + (plp_len - rc->n_prompt), 16 * sizeof(int32_t));
}

static void test_prompt_logprobs(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    plp_reference();
    sched *s = make_sched(0, 4, 16);
    /* the prompt only: chunked over 64-token steps, then every choice ends, nothing sampled */
    client c;
    sched_request_params p = plp_params(0, 2);
    submit_wait(s, &p, &c, 2);
    expect_plp(&c);
    for (uint32_t ch = 0; ch < 2; ch++) {
        assert_int_equal(c.finish[ch], SCHED_FINISH_LENGTH);
        assert_int_equal(c.completion_tokens[ch], 0);
        assert_int_equal(c.n_ids[ch], 0);
    }
    client_finish(&c);
    /* its blocks are cached now: a plain request reuses them, one with prompt logprobs does
     * not (its rows are computed), and both choices then decode the reference's tokens */
    p = plp_params(8, 1);
    p.prompt_logprobs = false;
    submit_wait(s, &p, &c, 1);
    assert_true(c.cached_tokens[0] > 0);
    assert_int_equal(c.n_prompt_events, 0);
    client_finish(&c);
    p = plp_params(8, 2);
    submit_wait(s, &p, &c, 2);
    expect_plp(&c);
    assert_int_equal(c.cached_tokens[0], 0);
    const ref_case *rc = &g_cases[1];
    int done = plp_len - rc->n_prompt;
    for (uint32_t ch = 0; ch < 2; ch++) {
        assert_int_equal(c.n_ids[ch], 8);
        assert_memory_equal(c.ids[ch], rc->completion + done, 8 * sizeof(int32_t));
    }
    client_finish(&c);
    /* n_top_logprobs -1 has no tops to give */
    p.n_top_logprobs = -1;
    sched_req *r;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    end_sched(s);

    /* preempted in its prefill, after some of its rows' logprobs, then computed again from
     * the start: its logprobs still arrive once and exact */
    run_preempted(plp_params(16, 1), check_plp_16);

    client cl[12];
    /* Three at once with plain ones, and 5 prompt-logprob rows a step: the three share them,
     * a step's marked rows never pass what the logits buffer holds (ASan would see it). */
    if (!g_model)
        skip();
    sched_params sp = sched_default_params();
    sp.n_ctx = 512;
    sp.n_threads = 1;
    sp.kv_cache_mb = 16;
    sp.max_num_seqs = 6;
    sp.max_batched_tokens = 64;
    sp.plp_rows = 5;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    for (int k = 0; k < 6; k++) {
        sched_request_params q =
            k % 2 ? plp_params(4, 1) : greedy_params(&g_cases[k / 2 % g_n_cases]);
        client_init(&cl[k], 1);
        assert_int_equal(sched_submit(s, &q, on_notify, &cl[k], &cl[k].req), 0);
    }
    for (int k = 0; k < 6; k++) {
        client_wait(&cl[k]);
        if (k % 2)
            expect_plp(&cl[k]);
        else
            expect_case(&cl[k], 0, &g_cases[k / 2 % g_n_cases]);
        client_finish(&cl[k]);
    }
    end_sched(s);

    /* many at once, sharing the pool with plain ones */
    s = make_sched(40, 12, 64);
    for (int k = 0; k < 12; k++) {
        /* equal sequences share their full blocks: the plain ones are every reference case */
        sched_request_params q =
            k % 2 ? plp_params(16, 1) : greedy_params(&g_cases[k / 2 % g_n_cases]);
        client_init(&cl[k], 1);
        assert_int_equal(sched_submit(s, &q, on_notify, &cl[k], &cl[k].req), 0);
    }
    for (int k = 0; k < 12; k++) {
        client_wait(&cl[k]);
        if (k % 2) {
            expect_plp(&cl[k]);
            assert_memory_equal(cl[k].ids[0], rc->completion + done, 16 * sizeof(int32_t));
        } else {
            expect_case(&cl[k], 0, &g_cases[k / 2 % g_n_cases]);
        }
        client_finish(&cl[k]);
    }
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.preemptions_total > 0);
    end_sched(s);
    free(plp_want);
    plp_want = NULL;
}

/* Embeddings: the prompt's hidden states pooled (mean, first, last) equal, bit for bit, the
 * same pooling in position order of one forward over the whole prompt (plp_reference's),
 * however the prompt is chunked, cached or preempted. */
static sched_request_params embed_params(engine_pooling pooling)
{
    sched_request_params p = greedy_params(&g_cases[1]);
    p.prompt = plp_prompt;
    p.n_prompt = (uint32_t)plp_len;
    p.max_tokens = 0;
    p.n_top_logprobs = -1;
    p.embed = pooling;
    return p;
}

static void expect_embedding(const client *c, engine_pooling pooling)
{
    uint32_t E = engine_model_hparams(g_model)->n_embd;
    assert_int_equal(c->n_embedding, E);
    assert_int_equal(c->finish[0], SCHED_FINISH_LENGTH);
    assert_int_equal(c->n_ids[0], 0);
    for (uint32_t i = 0; i < E; i++) {
        float want;
        if (pooling == ENGINE_POOLING_MEAN) {
            double sum = 0;
            for (int t = 0; t < plp_len; t++)
                sum += plp_hidden[(size_t)t * E + i];
            want = (float)(sum / plp_len);
        } else {
            want = plp_hidden[(size_t)(pooling == ENGINE_POOLING_CLS ? 0 : plp_len - 1) * E + i];
        }
        if (c->embedding[i] != want)
            fail_msg("pooling %d, dimension %u: %.9g, want %.9g", (int)pooling, i,
                     (double)c->embedding[i], (double)want);
    }
}

static void check_embedding_mean(const client *c)
{
    expect_embedding(c, ENGINE_POOLING_MEAN);
}

static void test_embeddings(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    plp_reference();
    static const engine_pooling kinds[] = {ENGINE_POOLING_MEAN, ENGINE_POOLING_CLS,
                                           ENGINE_POOLING_LAST};
    sched *s = make_sched(0, 4, 16);
    client c;
    for (int round = 0; round < 2; round++) /* the prompt's blocks cached from the first on */
        for (size_t k = 0; k < 3; k++) {
            sched_request_params p = embed_params(kinds[k]);
            submit_wait(s, &p, &c, 1);
            expect_embedding(&c, kinds[k]);
            /* only pooling the last row can take the rest from the cache */
            if (kinds[k] != ENGINE_POOLING_LAST)
                assert_int_equal(c.cached_tokens[0], 0);
            else
                assert_true(c.cached_tokens[0] > 0);
            client_finish(&c);
        }
    sched_req *r;
    sched_request_params p = embed_params(ENGINE_POOLING_MEAN);
    p.max_tokens = 1;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    p = embed_params(ENGINE_POOLING_MEAN);
    p.n = 2;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    p = embed_params(ENGINE_POOLING_LAST);
    p.n_top_logprobs = 0;
    assert_int_equal(sched_submit(s, &p, NULL, NULL, &r), KVS_EINVAL);
    end_sched(s);

    /* preempted mid-prompt (as in test_prompt_logprobs): the sums start over, the same bits */
    run_preempted(embed_params(ENGINE_POOLING_MEAN), check_embedding_mean);
    free(plp_want);
    plp_want = NULL;
    free(plp_hidden);
    plp_hidden = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_reference),
        cmocka_unit_test(test_pool_pressure_preempts),
        cmocka_unit_test(test_prefix_reuse_same_output),
        cmocka_unit_test(test_cancel_frees_blocks),
        cmocka_unit_test(test_n_choices_and_stop_string),
        cmocka_unit_test(test_queue_bound_and_validation),
        cmocka_unit_test(test_forks_finish_on_first_token),
        cmocka_unit_test(test_forks_count_against_max_num_seqs),
        cmocka_unit_test(test_kv_snapshot),
        cmocka_unit_test(test_grammar_json_object),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_last_token_with_its_text),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_embeddings),
    };
    return cmocka_run_group_tests_name("scheduler", tests, suite_setup, suite_teardown);
}
