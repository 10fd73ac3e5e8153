/* Sampler: each filter against distributions computed by hand, penalties, logprobs, and
 * per-sequence seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/status.h"
#include "engine/sampler.h"

#define V 8

static sampler *make(sampler_params p)
{
    sampler *s;
    assert_int_equal(sampler_create(&p, V, &s), 0);
    return s;
}

/* Draws n tokens from the same logits; counts per id. */
static void histogram(sampler *s, const float *logits, int n, int *counts)
{
    memset(counts, 0, V * sizeof(int));
    for (int i = 0; i < n; i++) {
        float l[V];
        memcpy(l, logits, sizeof l);
        int32_t t = sampler_sample(s, l, NULL, 0, NULL, NULL);
        assert_true(t >= 0 && t < V);
        counts[t]++;
    }
}

static void test_greedy_and_ties(void **state)
{
    (void)state;
    sampler_params p = sampler_default_params();
    p.temperature = 0;
    sampler *s = make(p);
    float l[V] = {0, 3, 1, 3, -1, 2, 0, 0};
    assert_int_equal(sampler_sample(s, l, NULL, 0, NULL, NULL), 1); /* tie: lowest id */
    sampler_destroy(s);
}

static void test_temperature_matches_softmax(void **state)
{
    (void)state;
    sampler_params p = sampler_default_params();
    p.seed = 1;
    sampler *s = make(p);
    /* p(1) = 3 / (1 + 3) with every other token at -inf-ish */
    float l[V] = {0, logf(3.0f), -1e9f, -1e9f, -1e9f, -1e9f, -1e9f, -1e9f};
    int c[V];
    histogram(s, l, 20000, c);
    assert_true(fabs(c[1] / 20000.0 - 0.75) < 0.02);
    sampler_destroy(s);
    /* temperature 0.5 squares the odds: 9 : 1 */
    p.temperature = 0.5f;
    s = make(p);
    histogram(s, l, 20000, c);
    assert_true(fabs(c[1] / 20000.0 - 0.9) < 0.02);
    sampler_destroy(s);
}

static void test_top_k_top_p_min_p(void **state)
{
    (void)state;
    /* probabilities 0.4, 0.3, 0.2, 0.1 (ids 2, 5, 0, 7); the rest ~0 */
    float l[V] = {logf(0.2f), -1e9f, logf(0.4f), -1e9f, -1e9f, logf(0.3f), -1e9f, logf(0.1f)};
    int c[V];
    sampler_params p = sampler_default_params();
    p.seed = 3;
    p.top_k = 2;
    sampler *s = make(p);
    histogram(s, l, 20000, c);
    assert_int_equal(c[0] + c[7], 0);
    assert_true(fabs(c[2] / 20000.0 - 4.0 / 7.0) < 0.02); /* renormalised over the two */
    sampler_destroy(s);

    p = sampler_default_params();
    p.seed = 4;
    p.top_p = 0.85f; /* 0.4 + 0.3 + 0.2 = 0.9 >= 0.85: keeps three */
    s = make(p);
    histogram(s, l, 20000, c);
    assert_int_equal(c[7], 0);
    assert_true(c[0] > 0 && c[2] > c[5] && c[5] > c[0]);
    sampler_destroy(s);

    p = sampler_default_params();
    p.seed = 5;
    p.min_p = 0.6f; /* keeps p >= 0.24: ids 2 and 5 */
    s = make(p);
    histogram(s, l, 20000, c);
    assert_int_equal(c[0] + c[7], 0);
    assert_true(c[2] > 0 && c[5] > 0);
    sampler_destroy(s);
}

static void test_penalties(void **state)
{
    (void)state;
    sampler_params p = sampler_default_params();
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    sampler *s = make(p);
    sampler_accept(s, 1, true); /* in the prompt: repetition penalty applies */
    float l[V] = {0, 4, 3, 0, 0, 0, 0, 0};
    assert_int_equal(sampler_sample(s, l, NULL, 0, NULL, NULL), 2); /* 4 / 2 = 2 < 3 */
    sampler_destroy(s);

    p = sampler_default_params();
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.4f;
    s = make(p);
    sampler_accept(s, 1, true); /* prompt tokens do not count for presence/frequency */
    float l2[V] = {0, 4, 3.0f, 0, 0, 0, 0, 0};
    assert_int_equal(sampler_sample(s, l2, NULL, 0, NULL, NULL), 1);
    sampler_accept(s, 1, false);
    float l3[V] = {0, 4, 3.0f, 0, 0, 0, 0, 0};
    assert_int_equal(sampler_sample(s, l3, NULL, 0, NULL, NULL), 1); /* 4 - 0.5 - 0.4 = 3.1 */
    sampler_accept(s, 1, false);
    float l4[V] = {0, 4, 3.0f, 0, 0, 0, 0, 0};
    assert_int_equal(sampler_sample(s, l4, NULL, 0, NULL, NULL), 2); /* 4 - 0.5 - 0.8 = 2.7 */
    sampler_destroy(s);
}

static void test_logprobs(void **state)
{
    (void)state;
    sampler_params p = sampler_default_params();
    p.temperature = 0;
    sampler *s = make(p);
    float l[V] = {1, 2, 3, 0, 0, 0, 0, 0};
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i]);
    float lp;
    int32_t top[3];
    float toplp[3];
    assert_int_equal(sampler_sample(s, l, &lp, 3, top, toplp), 2);
    assert_true(fabs(lp - (3 - log(z))) < 1e-5);
    assert_int_equal(top[0], 2);
    assert_int_equal(top[1], 1);
    assert_int_equal(top[2], 0);
    assert_true(fabs(toplp[1] - (2 - log(z))) < 1e-5);
    sampler_destroy(s);
}

/* sampler_logprobs against a brute force: random rows with many ties, every k. */
static void test_logprobs_tops(void **state)
{
    (void)state;
    enum { N = 300 };
    float l[N];
    uint64_t r = 12345;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((r >> 40) % 64) / 8.0f; /* 64 values: many ties */
        }
        for (int k = 0; k <= 20; k++) {
            int32_t ids[20];
            float lps[20], lp;
            sampler_logprobs(l, N, 3, &lp, k, ids, lps);
            bool taken[N] = {false};
            for (int j = 0; j < k; j++) {
                int best = -1; /* the largest not taken, lowest id on ties */
                for (int i = 0; i < N; i++)
                    if (!taken[i] && (best < 0 || l[i] > l[best]))
                        best = i;
                taken[best] = true;
                assert_int_equal(ids[j], best);
                if (j)
                    assert_true(lps[j] <= lps[j - 1]);
            }
            double m = -INFINITY, z = 0;
            for (int i = 0; i < N; i++)
                m = l[i] > m ? l[i] : m;
            for (int i = 0; i < N; i++)
                z += exp(l[i] - m);
            assert_true(fabs(lp - (l[3] - m - log(z))) < 1e-5);
            if (k)
                assert_true(fabs(lps[0] - (l[ids[0]] - m - log(z))) < 1e-5);
        }
    }
}

static void test_seeds(void **state)
{
    (void)state;
    float l[V] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
    sampler_params p = sampler_default_params();
    p.seed = 42;
    sampler *a = make(p), *b = make(p);
    p.seed = 43;
    sampler *c = make(p);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        float la[V], lb[V], lc[V];
        memcpy(la, l, sizeof l);
        memcpy(lb, l, sizeof l);
        memcpy(lc, l, sizeof l);
        int32_t ta = sampler_sample(a, la, NULL, 0, NULL, NULL);
        int32_t tb = sampler_sample(b, lb, NULL, 0, NULL, NULL);
        int32_t tc = sampler_sample(c, lc, NULL, 0, NULL, NULL);
        same &= ta == tb;
        differ |= ta != tc;
    }
    assert_true(same);
    assert_true(differ);
    sampler_destroy(a);
    sampler_destroy(b);
    sampler_destroy(c);
}

static void test_invalid_params(void **state)
{
    (void)state;
    sampler *s;
    sampler_params p = sampler_default_params();
    p.top_p = 0;
    assert_int_equal(sampler_create(&p, V, &s), KVS_EINVAL);
    p = sampler_default_params();
    p.temperature = NAN;
    assert_int_equal(sampler_create(&p, V, &s), KVS_EINVAL);
    p = sampler_default_params();
    p.repetition_penalty = 0;
    assert_int_equal(sampler_create(&p, V, &s), KVS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),
        cmocka_unit_test(test_temperature_matches_softmax),
        cmocka_unit_test(test_top_k_top_p_min_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_logprobs_tops),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_invalid_params),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
