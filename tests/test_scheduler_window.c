/* The scheduler on a hybrid model (issue 13's sliding-window reclaim): a gemma3 file from
 * kvs-mkmodel (the swa7 shape: layer 5 global, the other six windowed) with a window of 32 and
 * blocks of 4 tokens. With the reclaim the windowed layers' group holds about one window per
 * sequence while the global group grows with the sequence; the tokens are the same as with
 * the reclaim off (one group holding every layer, the path tests/test_models.c checks against
 * the reference forward), through long generations, forks (n > 1), prefix hits (whole, also for
 * conversations far longer than the windowed group; shortened; refused), preemption, and both
 * groups end with no used block. argv[1]: kvs-mkmodel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "run_tool.h"
#include "sched_client.h"
#include "scheduler/scheduler.h"

#define WINDOW 32
#define BS 4
#define N_CTX 320
#define MAX_CHOICES 3

static const char *g_tool;
static char g_dir[] = "/tmp/kvs-sched-window-XXXXXX";
static char g_path[600];

/* The most windowed blocks one sequence may hold: its window, one chunk, the block kept as the
 * next one's parent, a partial first block and a copy-on-write (scheduler/seq_kv.c). */
static uint32_t window_bound(uint32_t max_batched)
{
    return (WINDOW + max_batched + BS - 1) / BS + 3;
}

static int setup(void **state)
{
    (void)state;
    if (!g_tool || access(g_tool, X_OK) != 0 || !mkdtemp(g_dir))
        return -1;
    snprintf(g_path, sizeof g_path, "%s/gemma3-w32.gguf", g_dir);
    char window[16];
    snprintf(window, sizeof window, "%d", WINDOW);
    const char *argv[] = {g_tool,   "--shape",
                          "swa7",   "--arch",
                          "gemma3", "--weight-std",
                          "0.15",   "--sliding-window",
                          window,   "--ctx",
                          "512",    "-o",
                          g_path,   NULL};
    if (run_tool_quiet(argv))
        return -1;
    char err[256] = "";
    if (engine_model_load(g_path, NULL, &g_model, err, sizeof err)) {
        fprintf(stderr, "load %s: %s\n", g_path, err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    engine_model_destroy(g_model);
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

/* What the scheduler's step observer saw since run_requests last reset it: every step, on the
 * engine thread, so the figures do not depend on how often the test thread got to run. */
typedef struct observed {
    pthread_mutex_t mu;
    uint32_t max_window_blocks, max_tokens_seen, max_window_used;
} observed;
static observed g_obs = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void observe(void *ud, const sched_kv_snapshot *k)
{
    observed *o = ud;
    pthread_mutex_lock(&o->mu);
    for (uint32_t i = 0; i < k->n_seqs; i++) {
        if (k->seqs[i].n_window_blocks > o->max_window_blocks)
            o->max_window_blocks = k->seqs[i].n_window_blocks;
        if (k->seqs[i].n_tokens > o->max_tokens_seen)
            o->max_tokens_seen = k->seqs[i].n_tokens;
    }
    if (k->window_used > o->max_window_used)
        o->max_window_used = k->window_used;
    pthread_mutex_unlock(&o->mu);
}

static sched_params params(bool reclaim, uint32_t max_seqs, uint32_t max_batched,
                           uint32_t kv_blocks)
{
    sched_params sp = sched_default_params();
    sp.step_observer = observe;
    sp.step_observer_ud = &g_obs;
    sp.n_ctx = N_CTX;
    sp.n_threads = 1;
    sp.block_size = BS;
    sp.kv_blocks = kv_blocks;
    sp.max_num_seqs = max_seqs;
    sp.max_batched_tokens = max_batched;
    sp.window_reclaim = reclaim;
    return sp;
}

static void make_prompt(int32_t *p, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)((i * 37 + salt * 101 + 11) % 500) + 3;
}

typedef struct run_out {
    int32_t ids[MAX_CHOICES][REF_MAX_IDS];
    int n_ids[MAX_CHOICES];
    uint32_t max_window_blocks; /* most windowed blocks a sequence held after any step */
    uint32_t max_tokens_seen;   /* longest sequence after any step */
    uint32_t max_window_used;   /* windowed group's used blocks, most after any step */
} run_out;

static sched_request_params request(const int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
                                    uint32_t n)
{
    sched_request_params p = {0};
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = max_tokens;
    p.n = n;
    p.ignore_eos = true;
    p.sampling = sampler_default_params();
    p.sampling.temperature = n > 1 ? 0.9f : 0.0f; /* forks must diverge */
    p.sampling.seed = 1234;
    p.n_top_logprobs = 0;
    return p;
}

/* Runs the requests at once on s, checking snapshots taken meanwhile, until all finish; out[k]
 * gets request k's tokens and what the step observer saw (of all the requests). */
static void run_requests(sched *s, const sched_request_params *rp, int n_req, run_out *out)
{
    client *c = calloc((size_t)n_req, sizeof *c);
    assert_non_null(c);
    pthread_mutex_lock(&g_obs.mu);
    g_obs.max_window_blocks = g_obs.max_tokens_seen = g_obs.max_window_used = 0;
    pthread_mutex_unlock(&g_obs.mu);
    for (int k = 0; k < n_req; k++) {
        memset(&out[k], 0, sizeof out[k]);
        client_init(&c[k], rp[k].n);
        assert_int_equal(sched_submit(s, &rp[k], on_notify, &c[k], &c[k].req), 0);
    }
    for (int spins = 0;; spins++) {
        int done = 0;
        for (int k = 0; k < n_req; k++)
            done += client_drain(&c[k]);
        if (done == n_req)
            break;
        assert_true(spins < 200000);
        sched_kv_snapshot snap;
        assert_int_equal(sched_kv_snapshot_take(s, &snap, 60000), 0);
        check_snapshot(&snap);
        sched_kv_snapshot_free(&snap);
    }
    for (int k = 0; k < n_req; k++) {
        for (uint32_t ch = 0; ch < rp[k].n; ch++) {
            assert_int_equal(c[k].status[ch], 0);
            assert_int_equal(c[k].n_ids[ch], (int)rp[k].max_tokens);
            memcpy(out[k].ids[ch], c[k].ids[ch], sizeof(int32_t) * (size_t)c[k].n_ids[ch]);
            out[k].n_ids[ch] = c[k].n_ids[ch];
        }
        client_finish(&c[k]);
    }
    free(c);
    wait_blocks_free(s);
    pthread_mutex_lock(&g_obs.mu);
    for (int k = 0; k < n_req; k++) {
        out[k].max_window_blocks = g_obs.max_window_blocks;
        out[k].max_tokens_seen = g_obs.max_tokens_seen;
        out[k].max_window_used = g_obs.max_window_used;
    }
    pthread_mutex_unlock(&g_obs.mu);
}

static void assert_same(const run_out *a, const run_out *b, uint32_t n)
{
    for (uint32_t ch = 0; ch < n; ch++) {
        assert_int_equal(a->n_ids[ch], b->n_ids[ch]);
        assert_memory_equal(a->ids[ch], b->ids[ch], sizeof(int32_t) * (size_t)a->n_ids[ch]);
    }
}

/* One long generation: the windowed group stays within one window while the sequence grows to
 * 8 windows, and the tokens equal the one-group run's. */
static void test_long_sequence(void **state)
{
    (void)state;
    int32_t prompt[40];
    make_prompt(prompt, 40, 1);
    sched_request_params rp = request(prompt, 40, 250, 1);
    static run_out on, off;
    sched *s;

    sched_params sp = params(true, 2, 16, 0);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.kv_window_blocks_total > 0); /* two groups */
    assert_true(m.kv_window_blocks_total < m.kv_blocks_total);
    run_requests(s, &rp, 1, &on);
    sched_get_metrics(s, &m);
    assert_int_equal(m.kv_window_blocks_used, 0);
    sched_destroy(s);
    assert_true(on.max_tokens_seen > 4 * WINDOW); /* a step saw it far past the window */
    assert_true(on.max_window_blocks <= window_bound(16));
    assert_true(on.max_window_blocks > 0);

    sp = params(false, 2, 16, 0);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_get_metrics(s, &m);
    assert_int_equal(m.kv_window_blocks_total, 0); /* one group */
    run_requests(s, &rp, 1, &off);
    sched_destroy(s);
    assert_int_equal(off.max_window_blocks, 0);
    assert_same(&on, &off, 1);
}

/* n = 3 sampled choices fork the prompt's blocks in both groups (the partial last block is
 * copied on write in each), then diverge: the same tokens as with one group. */
static void test_forks(void **state)
{
    (void)state;
    int32_t prompt[50];
    make_prompt(prompt, 50, 2); /* 50 = 12 blocks and a partial one */
    sched_request_params rp = request(prompt, 50, 120, 3);
    static run_out on, off;
    sched *s;
    sched_params sp = params(true, 4, 32, 0);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, &rp, 1, &on);
    sched_destroy(s);
    assert_true(on.max_window_blocks <= window_bound(32));
    sp = params(false, 4, 32, 0);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, &rp, 1, &off);
    sched_destroy(s);
    assert_same(&on, &off, 3);
    /* the choices did diverge, or forking proved nothing */
    assert_true(memcmp(on.ids[0], on.ids[1], sizeof(int32_t) * 120) != 0);
}

/* Prefix reuse: a second request with the first one's prompt hits whole in both groups; after
 * a long other sequence churned the windowed group, no window of the prompt stands there any
 * more and the hit is refused while the global group still has it (test_prefix_conversation
 * has the cases where a window survives). Tokens as without any cache. */
static void test_prefix(void **state)
{
    (void)state;
    int32_t a[80], b[60];
    make_prompt(a, 80, 3);
    make_prompt(b, 60, 4);
    sched_request_params ra = request(a, 80, 20, 1), rb = request(b, 60, 200, 1);
    static run_out first, hit, churn, shortened, fresh;
    sched *s;
    /* a windowed group of 4 windows and chunks (60 blocks): a's 25 fit, b's 65 evict them */
    sched_params sp = params(true, 4, 16, 200);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_metrics m0, m1;
    run_requests(s, &ra, 1, &first);
    sched_get_metrics(s, &m0);
    run_requests(s, &ra, 1, &hit);
    sched_get_metrics(s, &m1);
    assert_int_equal(m1.prefix_cache_hits_total - m0.prefix_cache_hits_total, 79 / BS);
    run_requests(s, &rb, 1, &churn);
    sched_get_metrics(s, &m0);
    assert_true(m0.kv_blocks_cached >= 80 / BS); /* the global group still holds a's prompt */
    run_requests(s, &ra, 1, &shortened);
    sched_get_metrics(s, &m1);
    assert_true(m1.prefix_cache_hits_total - m0.prefix_cache_hits_total < 79 / BS);
    sched_destroy(s);

    sp = params(false, 1, 16, 200);
    sp.prefix_cache = false;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, &ra, 1, &fresh);
    sched_destroy(s);
    assert_same(&first, &fresh, 1);
    assert_same(&hit, &fresh, 1);
    assert_same(&shortened, &fresh, 1);
}

/* A chat client sends a conversation back with a new turn. The conversation (a 160-token
 * prompt and its 24-token answer) is far longer than the window and than the windowed group
 * (two sequences' worth, 30 blocks: its first blocks were evicted while it ran), yet the hit
 * covers every full block the global group holds: the windowed layers need only the window
 * ending at the hit. Run again with another request between the turns, sharing the
 * conversation's first 100 tokens: it churns the windowed group, evicting the windows at the
 * conversation's end while the one ending at 100 stays (it held and released that one last),
 * so the new turn's hit is shortened to where a whole window still stands (here exactly there,
 * 25 blocks; the bound asserted leaves the eviction order to the pool). All exact. */
static void test_prefix_conversation(void **state)
{
    (void)state;
    enum { P = 160, GEN = 24, TURN = 12, SHARED = 100, TAIL = 60 };
    int32_t conv[P + GEN + TURN], other[SHARED + TAIL];
    make_prompt(conv, P, 7);
    sched_request_params r1 = request(conv, P, GEN, 1);
    static run_out first, first2, again, fresh, side, after, fresh2;
    sched *s;
    sched_params sp = params(true, 2, 16, 200);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_metrics m0, m1;
    sched_get_metrics(s, &m0);
    assert_int_equal(m0.kv_window_blocks_total, 2 * window_bound(16));
    run_requests(s, &r1, 1, &first);
    memcpy(conv + P, first.ids[0], sizeof(int32_t) * GEN);
    make_prompt(conv + P + GEN, TURN, 8);
    sched_request_params r2 = request(conv, P + GEN + TURN, 20, 1);
    sched_get_metrics(s, &m0);
    run_requests(s, &r2, 1, &again);
    sched_get_metrics(s, &m1);
    /* P + GEN - 1 positions were computed (the last answer token never was): 45 full blocks */
    uint32_t whole = (P + GEN - 1) / BS;
    assert_int_equal(m1.prefix_cache_hits_total - m0.prefix_cache_hits_total, whole);

    sched_destroy(s);

    /* Again on a fresh scheduler, with the other request between the two turns. */
    memcpy(other, conv, sizeof(int32_t) * SHARED);
    make_prompt(other + SHARED, TAIL, 9);
    sched_request_params r3 = request(other, SHARED + TAIL, 8, 1);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, &r1, 1, &first2);
    assert_same(&first, &first2, 1);
    sched_get_metrics(s, &m0);
    run_requests(s, &r3, 1, &side);
    sched_get_metrics(s, &m1);
    assert_int_equal(m1.prefix_cache_hits_total - m0.prefix_cache_hits_total, SHARED / BS);
    sched_get_metrics(s, &m0);
    run_requests(s, &r2, 1, &after);
    sched_get_metrics(s, &m1);
    uint64_t hit = m1.prefix_cache_hits_total - m0.prefix_cache_hits_total;
    assert_true(m0.kv_blocks_cached >= whole); /* the global group still holds it all */
    assert_true(hit > 0 && hit < whole);
    sched_destroy(s);

    /* The same answers computed from scratch. */
    sp = params(true, 2, 16, 200);
    sp.prefix_cache = false;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, &r2, 1, &fresh);
    run_requests(s, &r3, 1, &fresh2);
    sched_destroy(s);
    assert_same(&again, &fresh, 1);
    assert_same(&after, &fresh, 1);
    assert_same(&side, &fresh2, 1);
}

/* Two long sequences in a global group that holds one context: the newer is preempted and
 * recomputed, in both groups, with the same tokens as each alone with one group. */
static void test_preemption(void **state)
{
    (void)state;
    int32_t p0[40], p1[40];
    make_prompt(p0, 40, 5);
    make_prompt(p1, 40, 6);
    sched_request_params rp[2] = {request(p0, 40, 230, 1), request(p1, 40, 230, 1)};
    static run_out on[2], off[2];
    sched *s;
    sched_params sp = params(true, 2, 16, N_CTX / BS);
    sp.prefix_cache = false; /* recomputation, not a hit, must give the same tokens */
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    run_requests(s, rp, 2, on);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.preemptions_total > 0);
    sched_destroy(s);
    for (int k = 0; k < 2; k++) {
        sp = params(false, 1, 16, 0);
        assert_int_equal(sched_create(&sp, g_model, &s), 0);
        run_requests(s, &rp[k], 1, &off[k]);
        sched_destroy(s);
        assert_same(&on[k], &off[k], 1);
    }
}

/* Sizing: --kv-blocks sets the global group exactly; the windowed group is what its sequences
 * can hold; a cache-size budget is split, and the same MiB hold more global blocks. */
static void test_sizing(void **state)
{
    (void)state;
    sched *s;
    sched_metrics m;
    sched_params sp = params(true, 4, 16, 100);
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_get_metrics(s, &m);
    assert_int_equal(m.kv_blocks_total, 100);
    assert_int_equal(m.kv_window_blocks_total, 4 * window_bound(16));
    sched_destroy(s);

    sp = params(true, 4, 16, 0);
    sp.kv_cache_mb = 1;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_get_metrics(s, &m);
    uint32_t global_on = m.kv_blocks_total;
    assert_true(m.kv_bytes_capacity <= 1024 * 1024);
    sched_destroy(s);
    sp.window_reclaim = false;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_get_metrics(s, &m);
    assert_true(m.kv_bytes_capacity <= 1024 * 1024);
    assert_int_equal(m.kv_window_blocks_total, 0);
    assert_true(global_on > m.kv_blocks_total);
    sched_destroy(s);

    /* n_ctx within the window: nothing to reclaim, one group */
    sp = params(true, 4, 16, 0);
    sp.n_ctx = WINDOW;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    sched_get_metrics(s, &m);
    assert_int_equal(m.kv_window_blocks_total, 0);
    sched_destroy(s);
}

int main(int argc, char **argv)
{
    g_tool = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_sequence), cmocka_unit_test(test_forks),
        cmocka_unit_test(test_prefix),        cmocka_unit_test(test_prefix_conversation),
        cmocka_unit_test(test_preemption),    cmocka_unit_test(test_sizing),
    };
    return cmocka_run_group_tests_name("scheduler_window", tests, setup, teardown);
}
