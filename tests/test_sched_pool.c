/* The KV pool's size when --kv-cache-mb is left to choose (kv_cache_mb 0, scheduler.h): one whole
 * context and at least 256 MiB; a model's context too long for the memory left is shortened to
 * what fits (not below 4096 tokens), a context asked for is kept, and a machine without room
 * for 4096 tokens is refused. On kvs-mkmodel files with a 65536-token context: the tiny llama
 * shape (one group) and a gemma3 one with a 32-token window (two groups), the memory left
 * given by sched_params.mem_avail. argv[1]: kvs-mkmodel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "run_tool.h"
#include "sched_client.h"
#include "scheduler/scheduler.h"

#define CTX 65536
#define MIB (1024ull * 1024)

static const char *g_tool;
static char g_dir[] = "/tmp/kvs-sched-pool-XXXXXX";
static char g_llama[600], g_gemma[600];
static engine_model *g_gm; /* the gemma3 file; g_model (sched_client.h) the llama one */

static int setup(void **state)
{
    (void)state;
    if (!g_tool || access(g_tool, X_OK) != 0 || !mkdtemp(g_dir))
        return -1;
    snprintf(g_llama, sizeof g_llama, "%s/tiny.gguf", g_dir);
    snprintf(g_gemma, sizeof g_gemma, "%s/swa7.gguf", g_dir);
    const char *a[] = {g_tool, "--shape", "tiny", "--ctx", "65536", "-o", g_llama, NULL};
    const char *b[] = {g_tool, "--shape", "swa7",  "--arch", "gemma3", "--sliding-window",
                       "32",   "--ctx",   "65536", "-o",     g_gemma,  NULL};
    char err[256] = "";
    if (run_tool_quiet(a) || run_tool_quiet(b) ||
        engine_model_load(g_llama, NULL, &g_model, err, sizeof err) ||
        engine_model_load(g_gemma, NULL, &g_gm, err, sizeof err)) {
        fprintf(stderr, "sched_pool: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    engine_model_destroy(g_model);
    engine_model_destroy(g_gm);
    unlink(g_llama);
    unlink(g_gemma);
    rmdir(g_dir);
    return 0;
}

/* The memory left (sched_params.mem_avail) that lets the pool take left bytes, below 3 GiB: the
 * fit leaves a quarter of what is left (at most 1 GiB) to the rest, so 4/3 of it, rounded up */
static uint64_t given(uint64_t left)
{
    return (left * 4 + 2) / 3;
}

/* A scheduler on m, the pool left to choose, mem_avail bytes left; n_ctx 0: the model's */
static int create(const engine_model *m, uint64_t mem_avail, uint32_t n_ctx, sched **s)
{
    sched_params sp = sched_default_params();
    assert_int_equal(sp.kv_cache_mb, 0); /* the default chooses */
    sp.n_threads = 1;
    sp.max_num_seqs = 4;
    sp.max_batched_tokens = 64;
    sp.mem_avail = mem_avail;
    sp.n_ctx = n_ctx;
    return sched_create(&sp, m, s);
}

/* greedy tokens of a short prompt through s: the pool works */
static void run_one(sched *s)
{
    static const int32_t prompt[] = {1, 5, 9, 13, 17, 21, 25, 29};
    sched_request_params p = {0};
    p.prompt = prompt;
    p.n_prompt = 8;
    p.max_tokens = 24;
    p.n = 1;
    p.ignore_eos = true;
    p.sampling = sampler_default_params();
    p.sampling.temperature = 0.0f;
    client c;
    client_init(&c, 1);
    assert_int_equal(sched_submit(s, &p, on_notify, &c, &c.req), 0);
    client_wait(&c);
    assert_int_equal(c.n_ids[0], 24);
    assert_int_equal(c.finish[0], SCHED_FINISH_LENGTH);
    client_finish(&c);
    wait_blocks_free(s);
}

/* a request of n tokens in all (prompt and generation) against s's context */
static int submit_len(sched *s, uint32_t n)
{
    static int32_t prompt[16];
    sched_request_params p = {0};
    p.prompt = prompt;
    p.n_prompt = 16;
    p.max_tokens = n - 16;
    p.n = 1;
    p.sampling = sampler_default_params();
    client c;
    client_init(&c, 1);
    int rc = sched_submit(s, &p, on_notify, &c, &c.req);
    if (rc == 0) {
        sched_req_release(c.req); /* cancelled: its blocks go back within a step */
        wait_blocks_free(s);
    }
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return rc;
}

/* Plenty of memory: the model's whole context, in a pool of 256 MiB (more than it needs). */
static void test_floor(void **state)
{
    (void)state;
    sched *s;
    assert_int_equal(create(g_model, 64 * 1024 * MIB, 0, &s), 0);
    assert_int_equal(sched_n_ctx(s), CTX);
    sched_metrics m;
    sched_get_metrics(s, &m);
    size_t bb = engine_kv_block_bytes(g_model, ENGINE_KV_F16, 16);
    assert_true(m.kv_bytes_capacity <= 256 * MIB && m.kv_bytes_capacity > 256 * MIB - bb);
    assert_true((uint64_t)m.kv_blocks_total * 16 >= CTX);
    run_one(s);
    sched_destroy(s);
}

/* 8 MiB left: the model's context is shortened to the longest one whose cache fits there, and
 * requests are held to it. */
static void test_fit(void **state)
{
    (void)state;
    size_t bb = engine_kv_block_bytes(g_model, ENGINE_KV_F16, 16);
    uint64_t left = 8 * MIB;
    assert_true(CTX / 16 * bb > left); /* the model's context does not fit */
    sched *s;
    assert_int_equal(create(g_model, given(left), 0, &s), 0);
    uint32_t n = sched_n_ctx(s);
    assert_int_equal(n, left / bb * 16);
    assert_true(n >= 4096 && n < CTX);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.kv_bytes_capacity <= left);
    assert_true((uint64_t)m.kv_blocks_total * 16 >= n);
    assert_int_equal(submit_len(s, n), 0);
    assert_int_equal(submit_len(s, n + 1), KVS_ERANGE);
    run_one(s);
    sched_destroy(s);
}

/* Blocks of 48 tokens, which neither 4096 nor the model's 65536 is a multiple of: the fit
 * still ends, on a context whose blocks fit. */
static void test_fit_odd_blocks(void **state)
{
    (void)state;
    sched_params sp = sched_default_params();
    sp.n_threads = 1;
    sp.max_num_seqs = 4;
    sp.max_batched_tokens = 64;
    sp.block_size = 48;
    sp.mem_avail = given(5 * MIB + 12345);
    sched *s;
    assert_int_equal(sched_create(&sp, g_model, &s), 0);
    uint32_t n = sched_n_ctx(s);
    assert_true(n >= 4096 && n < CTX);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true(m.kv_bytes_capacity <= 5 * MIB + 12345);
    assert_true((uint64_t)m.kv_blocks_total * 48 >= n);
    size_t bb = engine_kv_block_bytes(g_model, ENGINE_KV_F16, 48);
    assert_true((uint64_t)((n + 48 - 1) / 48 + 1) * bb > 5 * MIB + 12345); /* the longest */
    run_one(s);
    sched_destroy(s);
}

/* A context asked for (--ctx-size) is kept whatever the memory says, with a warning; without
 * room for 4096 tokens the model's context is refused. */
static void test_asked_and_refused(void **state)
{
    (void)state;
    size_t bb = engine_kv_block_bytes(g_model, ENGINE_KV_F16, 16);
    sched *s;
    assert_int_equal(create(g_model, given(8 * MIB), CTX, &s), 0);
    assert_int_equal(sched_n_ctx(s), CTX);
    sched_metrics m;
    sched_get_metrics(s, &m);
    assert_true((uint64_t)m.kv_blocks_total * 16 >= CTX);
    sched_destroy(s);
    s = NULL;
    assert_int_equal(create(g_model, given(4096 / 16 * bb - bb), 0, &s), KVS_ENOMEM);
    assert_null(s);
    assert_int_equal(create(g_model, given(4096 / 16 * bb), 0, &s), 0);
    assert_int_equal(sched_n_ctx(s), 4096);
    sched_destroy(s);
}

/* Two groups (window reclaim): the global one holds one whole context and the windowed one at
 * least a sequence's window, in the memory left; shortened as above where it is short. */
static void test_two_groups(void **state)
{
    (void)state;
    sched *s;
    sched_metrics m;
    assert_int_equal(create(g_gm, 64 * 1024 * MIB, 0, &s), 0);
    assert_int_equal(sched_n_ctx(s), CTX);
    sched_get_metrics(s, &m);
    assert_true(m.kv_window_blocks_total > 0);
    assert_true((uint64_t)m.kv_blocks_total * 16 >= CTX);
    assert_true(m.kv_bytes_capacity <= 256 * MIB + MIB);
    run_one(s);
    sched_destroy(s);
    uint64_t left = 2 * MIB;
    assert_int_equal(create(g_gm, given(left), 0, &s), 0);
    uint32_t n = sched_n_ctx(s);
    assert_true(n >= 4096 && n < CTX && n % 16 == 0);
    sched_get_metrics(s, &m);
    assert_true(m.kv_bytes_capacity <= left);
    assert_true((uint64_t)m.kv_blocks_total * 16 >= n);
    assert_true(m.kv_window_blocks_total >= (32 + 64 + 15) / 16 + 3);
    run_one(s);
    sched_destroy(s);
}

int main(int argc, char **argv)
{
    g_tool = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_floor),          cmocka_unit_test(test_fit),
        cmocka_unit_test(test_fit_odd_blocks), cmocka_unit_test(test_asked_and_refused),
        cmocka_unit_test(test_two_groups),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
