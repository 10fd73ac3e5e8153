/* Scheduler stress: randomized request mixes on the real stories260K model, in rounds, for a
 * bounded time (KVS_STRESS_SECONDS, default 15; KVS_STRESS_SEED repeats a run). Each round
 * builds a scheduler with random limits and a pool small enough to preempt, submits requests
 * with n 1..16, max_tokens 1..64, stop strings that hit at once, EOS allowed or ignored,
 * logprobs, shared prompt prefixes, and cancels some of them at random points (before any
 * event, mid-prefill, mid-decode, after some choices finished). After each round: every
 * request that was not cancelled got exactly one finishing event per choice, within its
 * limits, and the pool holds no used block; KV snapshots taken meanwhile are consistent. It
 * found the fork use-after-free of issue 10. With argv[1] (kvs-mkmodel), half the rounds run a
 * hybrid gemma3 file (swa7 shape, window 32) with the window reclaim mostly on, so both layer
 * groups must end every round with no used block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "common/status.h"
#include "run_tool.h"
#include "sched_client.h"
#include "scheduler/scheduler.h"
#include "test_reference.h"

#define MAX_REQS 12

static uint64_t g_rng;
static engine_model *g_wmodel; /* the hybrid model, or NULL without kvs-mkmodel */
static const char *g_tool;
static char g_wdir[] = "/tmp/kvs-stress-window-XXXXXX";
static char g_wpath[600];

/* Writes and loads the hybrid model (kvs-mkmodel --shape swa7 --arch gemma3, window 32). */
static void load_windowed(void)
{
    if (!g_tool || access(g_tool, X_OK) != 0 || !mkdtemp(g_wdir))
        return;
    snprintf(g_wpath, sizeof g_wpath, "%s/swa7.gguf", g_wdir);
    const char *argv[] = {g_tool, "--shape",          "swa7", "--arch", "gemma3", "--weight-std",
                          "0.15", "--sliding-window", "32",   "-o",     g_wpath,  NULL};
    if (run_tool_quiet(argv))
        return;
    char err[256] = "";
    if (engine_model_load(g_wpath, NULL, &g_wmodel, err, sizeof err))
        fprintf(stderr, "stress: %s: %s\n", g_wpath, err);
}

static uint32_t rnd(uint32_t n) /* uniform in [0, n) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct stress_req {
    client c;
    int32_t prompt[REF_MAX_IDS];
    sched_request_params p;
    int cancel_after; /* -1: never; else release once this many events were taken */
    bool cancelled;
} stress_req;

/* A random request: a reference prompt, possibly extended by tokens of its completion (so
 * requests share prefixes of different lengths and full blocks get reused). */
static void random_request(stress_req *q, uint32_t max_seqs)
{
    static const char *stops[] = {"e", " ", ".", "the", "Lily", "\n", "a", "was"};
    const ref_case *rc = &g_cases[rnd((uint32_t)g_n_cases)];
    int np = rc->n_prompt;
    memcpy(q->prompt, rc->prompt, (size_t)np * sizeof(int32_t));
    int extra = (int)rnd(3) == 0 ? 0 : (int)rnd(64);
    if (extra > rc->n_completion)
        extra = rc->n_completion;
    memcpy(q->prompt + np, rc->completion, (size_t)extra * sizeof(int32_t));
    np += extra;
    sched_request_params p = {0};
    p.prompt = q->prompt;
    p.n_prompt = (uint32_t)np;
    p.max_tokens = 1 + rnd(64);
    p.n = 1 + rnd(max_seqs < CLIENT_MAX_CHOICES ? max_seqs : CLIENT_MAX_CHOICES);
    p.sampling = sampler_default_params();
    p.sampling.temperature = rnd(3) == 0 ? 0.0f : 0.5f + (float)rnd(100) / 100.0f;
    p.sampling.seed = g_rng;
    p.ignore_eos = rnd(2) == 0;
    int n_stop = (int)rnd(4);
    for (int i = 0; i < n_stop; i++)
        p.stop[i] = stops[rnd(sizeof stops / sizeof stops[0])];
    p.n_top_logprobs = (int)rnd(4) - 1; /* -1 (none) .. 2 */
    p.notify_on_finish_only = rnd(2) == 0;
    q->p = p;
    uint32_t r = rnd(4);
    q->cancel_after = r == 0 ? (int)rnd(3) : r == 1 ? (int)rnd(40) : -1;
}

static void check_finished(const stress_req *q)
{
    const client *c = &q->c;
    for (uint32_t ch = 0; ch < c->n_choices; ch++) {
        assert_int_equal(c->n_finish[ch], 1);
        if (c->finish[ch] == SCHED_FINISH_ERROR)
            fail_msg("choice %u ended with an error: %s", ch, status_str(c->status[ch]));
        assert_true(c->completion_tokens[ch] >= 1);
        assert_true(c->completion_tokens[ch] <= q->p.max_tokens);
        if (c->finish[ch] == SCHED_FINISH_LENGTH)
            assert_int_equal(c->completion_tokens[ch], q->p.max_tokens);
        if (q->p.n_top_logprobs >= 0)
            assert_int_equal((uint32_t)c->n_ids[ch], c->completion_tokens[ch]);
    }
}

static void run_round(int round)
{
    const engine_model *model = g_wmodel && rnd(2) ? g_wmodel : g_model;
    sched_params sp = sched_default_params();
    sp.window_reclaim = rnd(4) != 0;
    sp.n_ctx = 512;
    sp.n_threads = 1;
    sp.block_size = rnd(2) ? 16 : 8;
    sp.kv_blocks = 512 / sp.block_size + rnd(24); /* one context and a little more: preempts */
    sp.kv_cache_mb = 16;
    sp.max_num_seqs = 1 + rnd(16);
    sp.max_queue = 64;
    sp.max_batched_tokens = 16 + rnd(112);
    sp.prefix_cache = rnd(4) != 0;
    sched *s;
    assert_int_equal(sched_create(&sp, model, &s), 0);

    uint32_t n_reqs = 1 + rnd(MAX_REQS);
    stress_req *q = calloc(n_reqs, sizeof *q);
    assert_non_null(q);
    for (uint32_t k = 0; k < n_reqs; k++) {
        random_request(&q[k], sp.max_num_seqs);
        client_init(&q[k].c, q[k].p.n);
        assert_int_equal(sched_submit(s, &q[k].p, on_notify, &q[k].c, &q[k].c.req), 0);
        if (q[k].cancel_after == 0) {
            client_finish(&q[k].c);
            q[k].cancelled = true;
        }
    }
    double deadline = now_s() + 120;
    for (;;) {
        bool all = true;
        for (uint32_t k = 0; k < n_reqs; k++) {
            stress_req *r = &q[k];
            if (r->cancelled || r->c.done)
                continue;
            client_drain(&r->c);
            if (!r->c.done && r->cancel_after > 0 && (int)r->c.n_events >= r->cancel_after) {
                client_finish(&r->c);
                r->cancelled = true;
                continue;
            }
            if (!r->c.done)
                all = false;
        }
        if (rnd(8) == 0) { /* a picture of the pool mid-run must be consistent */
            sched_kv_snapshot k;
            assert_int_equal(sched_kv_snapshot_take(s, &k, 60000), 0);
            check_snapshot(&k);
            assert_true(k.n_seqs <= sp.max_num_seqs);
            sched_kv_snapshot_free(&k);
        }
        sched_metrics m;
        sched_get_metrics(s, &m);
        if (m.num_requests_running > sp.max_num_seqs)
            fail_msg("round %d: %u sequences running, max_num_seqs %u", round,
                     m.num_requests_running, sp.max_num_seqs);
        if (all)
            break;
        if (now_s() > deadline)
            fail_msg("round %d: requests unfinished after 120 s", round);
        struct timespec ts = {0, 500 * 1000};
        nanosleep(&ts, NULL);
    }
    for (uint32_t k = 0; k < n_reqs; k++) {
        if (q[k].cancelled)
            continue;
        check_finished(&q[k]);
        client_finish(&q[k].c);
    }
    /* cancelled requests still in the inbox are dropped within one engine loop */
    for (int i = 0; i < 1000 && sched_n_unfinished(s); i++)
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    assert_int_equal(sched_n_unfinished(s), 0);
    wait_blocks_free(s);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_int_equal(m.kv_blocks_used, 0);
    assert_int_equal(m.kv_window_blocks_used, 0);
    sched_destroy(s);
    free(q);
}

static void test_random_mixes(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    const char *env = getenv("KVS_STRESS_SECONDS");
    double seconds = env && *env ? atof(env) : 15;
    const char *seed = getenv("KVS_STRESS_SEED");
    g_rng = seed && *seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
    if (g_rng == 0)
        g_rng = 1;
    fprintf(stderr, "stress: KVS_STRESS_SEED=%llu, %.0f s\n", (unsigned long long)g_rng, seconds);
    double end = now_s() + seconds;
    int rounds = 0;
    if (!g_wmodel)
        fprintf(stderr, "stress: no hybrid model (kvs-mkmodel not given): stories260K only\n");
    do {
        run_round(rounds++);
    } while (now_s() < end);
    fprintf(stderr, "stress: %d rounds\n", rounds);
}

int main(int argc, char **argv)
{
    g_tool = argc > 1 ? argv[1] : NULL;
    load_windowed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_mixes),
    };
    int rc = cmocka_run_group_tests_name("scheduler_stress", tests, suite_setup, suite_teardown);
    engine_model_destroy(g_wmodel);
    if (g_wmodel) {
        unlink(g_wpath);
        rmdir(g_wdir);
    }
    return rc;
}
