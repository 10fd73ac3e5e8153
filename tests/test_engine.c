/* Engine: the forward pass through the paged KV arena reproduces llama2.c's greedy reference
 * token for token; cached logits equal a full recomputation; batching and block size change
 * nothing. Block tables are built here by hand (scattered ids), so no kvpool is involved. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "engine/kern/kern.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "test_reference.h"

#define MAX_CASES REF_MAX_CASES
/* run.c forwards positions 0..255 and samples after each, so a sequence ends with 257 tokens
 * (the last one never forwarded): prompt + completion = CTX + 1 for "stop": "length". */
#define CTX 256

static engine_model *g_model;
static uint32_t g_threads = 1;                   /* compute threads of run_batched's ctx */
static engine_kv_type g_kv_type = ENGINE_KV_F16; /* cache type of every arena made here */
static ref_case g_cases[REF_MAX_CASES];
static int g_n_cases;

static int setup(void **state)
{
    (void)state;
    return ref_load(&g_model, g_cases, &g_n_cases) < 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    engine_model_destroy(g_model);
    return 0;
}

static int32_t argmax(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* A sequence with a block table drawn from a shared arena by a caller-chosen permutation. */
typedef struct test_seq {
    int32_t blocks[CTX];
    int32_t tokens[CTX + 1];
    int n_tokens;
    int done;
    int n_generated;
} test_seq;

/* Runs every sequence to completion greedily, all in one batch per step. Sequences get the
 * blocks of arena in a scattered order (block id = (k * 7 + s) % n_blocks style), so paging
 * is exercised. Writes each sequence's generated ids to out[s]. */
static void run_batched(const int *cases, int n_seqs, uint32_t block_size, int32_t out[][CTX + 1],
                        int *n_out)
{
    const engine_hparams *hp = engine_model_hparams(g_model);
    uint32_t per_seq = (CTX + block_size - 1) / block_size;
    uint32_t n_blocks = per_seq * (uint32_t)n_seqs;
    engine_kv *kv;
    engine_ctx *ctx;
    assert_int_equal(engine_kv_create(g_model, g_kv_type, n_blocks, block_size, &kv), 0);
    assert_int_equal(engine_ctx_create(g_model, 64 * (uint32_t)n_seqs, g_threads, &ctx), 0);
    test_seq *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    for (int s = 0; s < n_seqs; s++) {
        /* interleave: sequence s owns blocks s, s + n_seqs, ... in reverse order */
        for (uint32_t k = 0; k < per_seq; k++)
            seqs[s].blocks[k] = (int32_t)((per_seq - 1 - k) * (uint32_t)n_seqs + (uint32_t)s);
        const ref_case *rc = &g_cases[cases[s]];
        memcpy(seqs[s].tokens, rc->prompt, (size_t)rc->n_prompt * sizeof(int32_t));
        seqs[s].n_tokens = rc->n_prompt;
    }
    int32_t tok[CTX * MAX_CASES], pos[CTX * MAX_CASES], sq[CTX * MAX_CASES];
    bool want[CTX * MAX_CASES];
    engine_seq_view views[MAX_CASES];
    float *logits = malloc((size_t)n_seqs * hp->n_vocab * sizeof(float));
    int first = 1;
    for (;;) {
        uint32_t n = 0;
        int rows[MAX_CASES], n_rows = 0;
        for (int s = 0; s < n_seqs; s++) {
            views[s].blocks = seqs[s].blocks;
            views[s].n_blocks = per_seq;
            if (seqs[s].done)
                continue;
            int from = first ? 0 : seqs[s].n_tokens - 1;
            for (int p = from; p < seqs[s].n_tokens; p++) {
                tok[n] = seqs[s].tokens[p];
                pos[n] = p;
                sq[n] = s;
                want[n] = p == seqs[s].n_tokens - 1;
                n++;
            }
            rows[n_rows++] = s;
        }
        if (!n_rows)
            break;
        first = 0;
        engine_batch b = {n, tok, pos, sq, want, (uint32_t)n_seqs, views};
        assert_int_equal(engine_forward(ctx, kv, &b, logits), 0);
        for (int r = 0; r < n_rows; r++) {
            test_seq *q = &seqs[rows[r]];
            int32_t next = argmax(logits + (size_t)r * hp->n_vocab, (int)hp->n_vocab);
            out[rows[r]][q->n_generated++] = next;
            q->tokens[q->n_tokens++] = next;
            if (next == 1 || q->n_tokens > CTX)
                q->done = 1;
        }
    }
    for (int s = 0; s < n_seqs; s++)
        n_out[s] = seqs[s].n_generated;
    free(logits);
    free(seqs);
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
}

static void expect_reference(int c, const int32_t *ids, int n)
{
    const ref_case *rc = &g_cases[c];
    /* The reference stops at BOS without listing it; our loop records the BOS it stopped on. */
    int n_cmp = n;
    if (n_cmp > 0 && ids[n_cmp - 1] == 1)
        n_cmp--;
    assert_int_equal(n_cmp, rc->n_completion);
    for (int i = 0; i < n_cmp; i++) {
        if (ids[i] != rc->completion[i])
            fail_msg("case %d: token %d is %d, reference %d", c, i, ids[i], rc->completion[i]);
    }
}

/* Every case alone, with the cache in F16 (the default) and in F32. */
static void test_reference_alone(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    for (int t = 0; t < 2; t++) {
        g_kv_type = t ? ENGINE_KV_F32 : ENGINE_KV_F16;
        for (int c = 0; c < g_n_cases; c++) {
            int32_t out[1][CTX + 1];
            int n;
            run_batched(&c, 1, 16, out, &n);
            expect_reference(c, out[0], n);
        }
    }
    g_kv_type = ENGINE_KV_F16;
}

static void test_reference_batched_block_sizes(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    const uint32_t sizes[] = {1, 16, 48, 64}; /* 48 does not divide the attention spans */
    int cases[MAX_CASES];
    for (int c = 0; c < g_n_cases; c++)
        cases[c] = c;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int32_t out[MAX_CASES][CTX + 1];
        int n[MAX_CASES];
        run_batched(cases, g_n_cases, sizes[k], out, n);
        for (int c = 0; c < g_n_cases; c++)
            expect_reference(c, out[c], n[c]);
    }
}

/* Every case alone, then all in one batch (block size 16), each matching the reference. */
static void expect_all_references(void)
{
    int cases[MAX_CASES];
    for (int c = 0; c < g_n_cases; c++) {
        cases[c] = c;
        int32_t out[1][CTX + 1];
        int n;
        run_batched(&c, 1, 16, out, &n);
        expect_reference(c, out[0], n);
    }
    int32_t out[MAX_CASES][CTX + 1];
    int n[MAX_CASES];
    run_batched(cases, g_n_cases, 16, out, n);
    for (int c = 0; c < g_n_cases; c++)
        expect_reference(c, out[c], n[c]);
}

/* The engine's worker pool (matmul chunks and attention items shared between threads) changes
 * nothing: two threads reproduce the reference, alone and batched. */
static void test_reference_threads(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    g_threads = 2;
    expect_all_references();
    g_threads = 1;
}

/* Every prompt prefilled in one batch (all rows' logits wanted; 1-row decode steps follow), on 1, 2
 * and 3 threads and twice each: the logits are the same bits every time. The scheduler relies on a
 * batch being reproducible. */
static void run_logits(uint32_t threads, float *out, size_t *n_out)
{
    const engine_hparams *hp = engine_model_hparams(g_model);
    engine_kv *kv;
    engine_ctx *ctx;
    uint32_t bs = 16, per_seq = 5, nb = per_seq * MAX_CASES; /* 64-token prompts + 1 */
    assert_int_equal(engine_kv_create(g_model, g_kv_type, nb, bs, &kv), 0);
    assert_int_equal(engine_ctx_create(g_model, 64 * MAX_CASES, threads, &ctx), 0);
    int32_t blocks[5 * MAX_CASES], tok[64 * MAX_CASES], pos[64 * MAX_CASES], sq[64 * MAX_CASES];
    bool want[64 * MAX_CASES];
    engine_seq_view views[MAX_CASES];
    for (uint32_t i = 0; i < nb; i++)
        blocks[i] = (int32_t)(nb - 1 - i);
    uint32_t n = 0;
    for (int c = 0; c < g_n_cases; c++) {
        views[c].blocks = blocks + c * (int)per_seq;
        views[c].n_blocks = per_seq;
        for (int p = 0; p < g_cases[c].n_prompt; p++, n++) {
            tok[n] = g_cases[c].prompt[p];
            pos[n] = p;
            sq[n] = c;
            want[n] = true;
        }
    }
    engine_batch b = {n, tok, pos, sq, want, (uint32_t)g_n_cases, views};
    assert_int_equal(engine_forward(ctx, kv, &b, out), 0);
    *n_out = n;
    /* one decode step of the first sequence: the single-row kernels */
    int32_t t1 = 1, p1 = g_cases[0].n_prompt, s1 = 0;
    bool w1 = true;
    engine_batch d = {1, &t1, &p1, &s1, &w1, 1, views};
    assert_int_equal(engine_forward(ctx, kv, &d, out + (size_t)n * hp->n_vocab), 0);
    (*n_out)++;
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
}

static void test_deterministic_across_threads(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    size_t V = engine_model_hparams(g_model)->n_vocab, rows = 64 * MAX_CASES + 1, n0, n;
    float *ref = malloc(rows * V * sizeof(float)), *got = malloc(rows * V * sizeof(float));
    run_logits(1, ref, &n0);
    for (uint32_t threads = 1; threads <= 3; threads++)
        for (int rep = 0; rep < 2; rep++) {
            run_logits(threads, got, &n);
            assert_int_equal(n, n0);
            assert_memory_equal(ref, got, n * V * sizeof(float));
        }
    free(ref);
    free(got);
}

/* Along each reference generation, the cached step's logits are exactly (bit for bit) those of
 * a full recomputation of the whole sequence from scratch (fresh arena, one prefill batch), for
 * either cache type: F32/F16 weights are multiplied in panels whose results do not depend on the
 * batch a row is in, and a recomputation stores and reads its keys and values as the cached
 * steps did. */
/* Every cached decode step's logits against a full recomputation of the sequence, bit for bit;
 * the recomputation (quadratic in the length) at every every-th step and at the last. */
static void check_cache_equals_recompute_every(int every)
{
    const engine_hparams *hp = engine_model_hparams(g_model);
    const uint32_t bs = 16, nb = CTX / bs;
    engine_kv *kv, *kv2;
    engine_ctx *ctx;
    assert_int_equal(engine_kv_create(g_model, g_kv_type, nb, bs, &kv), 0);
    assert_int_equal(engine_kv_create(g_model, g_kv_type, nb, bs, &kv2), 0);
    assert_int_equal(engine_ctx_create(g_model, CTX, 1, &ctx), 0);
    int32_t blocks[CTX / 16];
    for (uint32_t i = 0; i < nb; i++)
        blocks[i] = (int32_t)(nb - 1 - i);
    engine_seq_view view = {.blocks = blocks, .n_blocks = nb};
    float *cached = malloc(hp->n_vocab * sizeof(float));
    float *full = malloc(hp->n_vocab * sizeof(float));
    int32_t tok[CTX + 1], pos[CTX + 1], sq[CTX + 1];
    bool want[CTX + 1];
    memset(sq, 0, sizeof sq);
    double worst = 0.0;
    for (int c = 0; c < g_n_cases; c++) {
        const ref_case *rc = &g_cases[c];
        int n = rc->n_prompt;
        memcpy(tok, rc->prompt, (size_t)n * sizeof(int32_t));
        int total = n + rc->n_completion; /* tokens whose logits we check: up to pos CTX - 1 */
        if (total > CTX)
            total = CTX;
        for (int step = 0; n <= total && n <= CTX; step++) {
            /* cached: prefill at step 0, then one token per step */
            int from = step == 0 ? 0 : n - 1;
            for (int p = from; p < n; p++) {
                pos[p - from] = p;
                want[p - from] = p == n - 1;
            }
            engine_batch b = {(uint32_t)(n - from), tok + from, pos, sq, want, 1, &view};
            assert_int_equal(engine_forward(ctx, kv, &b, cached), 0);
            bool last = n - rc->n_prompt >= rc->n_completion || n == total;
            if (step % every && !last) {
                tok[n] = rc->completion[n - rc->n_prompt];
                n++;
                continue;
            }
            /* full recomputation into a second arena */
            for (int p = 0; p < n; p++) {
                pos[p] = p;
                want[p] = p == n - 1;
            }
            engine_batch bf = {(uint32_t)n, tok, pos, sq, want, 1, &view};
            assert_int_equal(engine_forward(ctx, kv2, &bf, full), 0);
            for (uint32_t i = 0; i < hp->n_vocab; i++) {
                double d = fabs((double)cached[i] - (double)full[i]);
                if (d > worst)
                    worst = d;
                if (d != 0.0)
                    fail_msg("case %d pos %d token %u: cached %.7f full %.7f", c, n - 1, i,
                             (double)cached[i], (double)full[i]);
            }
            if (n - rc->n_prompt >= rc->n_completion)
                break;
            tok[n] = rc->completion[n - rc->n_prompt];
            n++;
        }
    }
    fprintf(stderr, "%s cache: max |cached - recomputed| logit difference: %.3g\n",
            engine_kv_type_name(g_kv_type), worst);
    free(cached);
    free(full);
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
    engine_kv_destroy(kv2);
}

static void check_cache_equals_recompute(void)
{
    check_cache_equals_recompute_every(1);
}

static void test_cache_equals_recompute(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    g_kv_type = ENGINE_KV_F32;
    check_cache_equals_recompute();
    g_kv_type = ENGINE_KV_F16;
    check_cache_equals_recompute();
}

/* One kernel table (by name, or a test's own table) against auto's choice: see below. */
static void check_table(engine_model *chosen, const char *name, const struct kern_ops *table,
                        const float *want, size_t n0, float *got)
{
    size_t V = engine_model_hparams(chosen)->n_vocab, n;
    ref_case cases[REF_MAX_CASES];
    int n_cases;
    assert_int_equal(ref_load_with(&g_model, cases, &n_cases, name, table), 1);
    assert_string_equal(engine_model_kernels(g_model), table ? table->name : name);
    expect_all_references();
    check_cache_equals_recompute_every(8);
    run_logits(2, got, &n);
    assert_int_equal(n, n0);
    if (memcmp(want, got, n * V * sizeof(float)))
        fail_msg("%s kernels: logits differ from %s's", engine_model_kernels(g_model),
                 engine_model_kernels(chosen));
    engine_model_destroy(g_model);
    g_model = chosen;
}

/* Every other kernel table this CPU runs (kern/kern.h; the tests above ran on auto's choice),
 * and the AVX-512 one emulated over simde where the build has it (tests link it; no --kernels
 * name reaches it), decodes every reference exactly, alone and batched; its cached logits equal
 * a full recomputation bit for bit (with the default F16 cache, recomputed at every 8th step and
 * the last: the recomputation is quadratic, the portable table slow, and test_kernels already
 * holds each table to the reference's bits op by op); and a prefill plus a decode step gives
 * exactly auto's logits. */
static void test_reference_every_kernel_table(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    static const char *const tables[] = {"generic", "avx2", "avx512"};
    engine_model *chosen = g_model;
    size_t V = engine_model_hparams(g_model)->n_vocab, rows = 64 * MAX_CASES + 1, n0;
    float *want = malloc(rows * V * sizeof(float)), *got = malloc(rows * V * sizeof(float));
    run_logits(2, want, &n0);
    int tested = 0;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char err[256];
        if (engine_kernels_check(tables[i], err, sizeof err)) {
            print_message("kernels %s not run here: %s\n", tables[i], err);
            continue;
        }
        if (!strcmp(tables[i], engine_model_kernels(chosen)))
            continue;
        check_table(chosen, tables[i], NULL, want, n0, got);
        tested++;
    }
#ifdef KERN_HAVE_AVX512_EMU
    check_table(chosen, NULL, &kern_avx512_emu_ops, want, n0, got);
    tested++;
#else
    print_message("kernels avx512-emulated not run: built without libsimde-dev\n");
#endif
    print_message("%d kernel table(s) besides %s\n", tested, engine_model_kernels(chosen));
    free(want);
    free(got);
}

static void test_malformed_batch_rejected(void **state)
{
    (void)state;
    if (!g_model)
        skip();
    engine_kv *kv;
    engine_ctx *ctx;
    assert_int_equal(engine_kv_create(g_model, g_kv_type, 2, 4, &kv), 0);
    assert_int_equal(engine_ctx_create(g_model, 4, 1, &ctx), 0);
    int32_t blocks[2] = {0, 1}, bad_blocks[2] = {0, 7};
    engine_seq_view v = {.blocks = blocks, .n_blocks = 2},
                    bv = {.blocks = bad_blocks, .n_blocks = 2};
    int32_t tok[1] = {5}, pos[1] = {8}, sq[1] = {0};
    bool want[1] = {true};
    float logits[512];
    engine_batch b = {1, tok, pos, sq, want, 1, &v};
    assert_int_equal(engine_forward(ctx, kv, &b, logits), KVS_EINVAL); /* past its blocks */
    pos[0] = 5;
    b.seqs = &bv;
    assert_int_equal(engine_forward(ctx, kv, &b, logits), KVS_EINVAL); /* block outside arena */
    b.seqs = &v;
    tok[0] = 512;
    assert_int_equal(engine_forward(ctx, kv, &b, logits), KVS_EINVAL); /* token id */
    tok[0] = 5;
    assert_int_equal(engine_forward(ctx, kv, &b, logits), 0);
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_alone),
        cmocka_unit_test(test_reference_batched_block_sizes),
        cmocka_unit_test(test_reference_threads),
        cmocka_unit_test(test_deterministic_across_threads),
        cmocka_unit_test(test_cache_equals_recompute),
        cmocka_unit_test(test_reference_every_kernel_table),
        cmocka_unit_test(test_malformed_batch_rejected),
    };
    return cmocka_run_group_tests_name("engine", tests, setup, teardown);
}
