/* Sampler. Candidates are sorted only as far as a filter needs: greedy is one argmax pass;
 * top-k uses a partial selection; top-p sorts the (already reduced) candidate list. */
#include "engine/sampler.h"

#include "common/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    sampler_params p;
    int32_t n_vocab;
    uint64_t rng;           /* xorshift64* state, never 0 */
    uint32_t *prompt_count; /* (n_vocab) occurrences in the prompt */
    uint32_t *output_count; /* (n_vocab) occurrences in the output */
    int32_t *cand_id;       /* (n_vocab) scratch */
    float *cand_p;          /* (n_vocab) scratch */
};

sampler_params sampler_default_params(void)
{
    sampler_params p = {
        .temperature = 1.0f,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .top_k = 0,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

static uint64_t seed_state(uint64_t seed)
{
    /* splitmix64 of the seed: nearby seeds give unrelated streams, and the state is never 0. */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 0x9e3779b97f4a7c15ull;
}

static double rng_uniform(sampler *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    uint64_t r = s->rng * 0x2545f4914f6cdd1dull;
    return (double)(r >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) with 53 bits */
}

int sampler_create(const sampler_params *p, int32_t n_vocab, sampler **out)
{
    *out = NULL;
    if (n_vocab <= 0 || !(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return KVS_EINVAL;
    sampler *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = seed_state(p->seed);
    s->prompt_count = calloc((size_t)n_vocab, sizeof *s->prompt_count);
    s->output_count = calloc((size_t)n_vocab, sizeof *s->output_count);
    s->cand_id = malloc((size_t)n_vocab * sizeof *s->cand_id);
    s->cand_p = malloc((size_t)n_vocab * sizeof *s->cand_p);
    if (!s->prompt_count || !s->output_count || !s->cand_id || !s->cand_p) {
        sampler_destroy(s);
        return KVS_ENOMEM;
    }
    *out = s;
    return 0;
}

void sampler_destroy(sampler *s)
{
    if (!s)
        return;
    free(s->prompt_count);
    free(s->output_count);
    free(s->cand_id);
    free(s->cand_p);
    free(s);
}

int sampler_clone(const sampler *src, uint64_t seed, sampler **out)
{
    sampler_params p = src->p;
    p.seed = seed;
    int rc = sampler_create(&p, src->n_vocab, out);
    if (rc)
        return rc;
    memcpy((*out)->prompt_count, src->prompt_count, (size_t)src->n_vocab * sizeof(uint32_t));
    memcpy((*out)->output_count, src->output_count, (size_t)src->n_vocab * sizeof(uint32_t));
    return 0;
}

void sampler_accept(sampler *s, int32_t token, bool is_prompt)
{
    if (token < 0 || token >= s->n_vocab)
        return;
    if (is_prompt)
        s->prompt_count[token]++;
    else
        s->output_count[token]++;
}

static void apply_penalties(sampler *s, float *logits)
{
    const sampler_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f;
    bool pres = p->presence_penalty != 0.0f, freq = p->frequency_penalty != 0.0f;
    if (!rep && !pres && !freq)
        return;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        uint32_t oc = s->output_count[i];
        if (rep && (oc || s->prompt_count[i]))
            logits[i] = logits[i] > 0 ? logits[i] / p->repetition_penalty
                                      : logits[i] * p->repetition_penalty;
        if (oc) {
            logits[i] -= (float)oc * p->frequency_penalty;
            logits[i] -= p->presence_penalty;
        }
    }
}

/* qsort has no context argument in C11, so the keys travel in a thread-local: each thread
 * that samples sorts its own candidates. Descending by key, ties by ascending id. */
static _Thread_local const float *sort_keys;
static int cmp_by_key(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float x = sort_keys[ia], y = sort_keys[ib];
    if (x != y)
        return x > y ? -1 : 1;
    return (ia > ib) - (ia < ib);
}

static void sort_candidates(int32_t *ids, size_t n, const float *keys)
{
    sort_keys = keys;
    qsort(ids, n, sizeof *ids, cmp_by_key);
}

/* Moves the k candidates with the largest keys (ties: lower id) to ids[0..k), unordered, in
 * O(n log k) with a min-heap, so top-k over a 32k vocabulary never sorts all of it. */
static bool key_less(const float *keys, int32_t a, int32_t b)
{
    return keys[a] < keys[b] || (keys[a] == keys[b] && a > b);
}

static void heap_sift_down(int32_t *h, int32_t k, int32_t i, const float *keys)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && key_less(keys, h[l], h[m]))
            m = l;
        if (r < k && key_less(keys, h[r], h[m]))
            m = r;
        if (m == i)
            return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void select_top_k(int32_t *ids, int32_t n, int32_t k, const float *keys)
{
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        heap_sift_down(ids, k, i, keys);
    for (int32_t i = k; i < n; i++) {
        if (key_less(keys, ids[0], ids[i])) {
            ids[0] = ids[i];
            heap_sift_down(ids, k, 0, keys);
        }
    }
}

/* The largest of x[0 .. n) (NaNs skipped; -inf if none): 16 running maxima, each `a > m ? a : m`
 * (maxps' own rule), which the compiler keeps in vector registers; one running maximum waited
 * on every compare, and greedy sampling over a 32k vocabulary was 5 % of a 16-client 110m
 * server's time (perf). */
static float max_of(const float *x, int32_t n)
{
    float m[16];
    for (int j = 0; j < 16; j++)
        m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float best = -INFINITY;
    for (int j = 0; j < 16; j++)
        best = m[j] > best ? m[j] : best;
    for (; i < n; i++)
        best = x[i] > best ? x[i] : best;
    return best;
}

/* The first index of the largest of x[0 .. n) (NaNs never chosen; 0 where nothing is larger
 * than -inf). */
static int32_t argmax(const float *x, int32_t n)
{
    float best = max_of(x, n);
    for (int32_t i = 0; i < n; i++)
        if (x[i] == best)
            return i;
    return 0;
}

/* log(sum(exp(x - maxv))) over logits, maxv their largest (into *maxv). */
static double log_sum_exp(const float *logits, int32_t V, float *maxv)
{
    *maxv = max_of(logits, V);
    double sum = 0.0;
    for (int32_t i = 0; i < V; i++)
        sum += exp((double)(logits[i] - *maxv));
    return log(sum);
}

/* The k largest logits (k <= n_top, V) and their logprobs, given log_sum_exp's maxv and lse. */
static void top_logprobs_of(const float *logits, int32_t V, float maxv, double lse, int n_top,
                            int32_t *top_ids, float *top_logprobs)
{
    int k = n_top < V ? n_top : V;
    if (k <= 0)
        return;
    /* The k largest by insertion into a sorted list: one compare per logit for all but the few
     * that enter it (k is at most 20). Ties keep the lower id first; NaNs never enter. */
    int n = 0;
    for (int32_t i = 0; i < V; i++) {
        float x = logits[i];
        if (n == k && !(x > logits[top_ids[k - 1]]))
            continue;
        if (n < k && x != x)
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && x > logits[top_ids[j - 1]]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int j = 0; j < n; j++)
        top_logprobs[j] = (float)((double)(logits[top_ids[j]] - maxv) - lse);
    for (int j = n; j < k; j++) {
        top_ids[j] = 0; /* only where fewer than k logits are numbers */
        top_logprobs[j] = -INFINITY;
    }
}

void sampler_logprobs(const float *logits, int32_t n_vocab, int32_t id, float *logprob, int n_top,
                      int32_t *top_ids, float *top_logprobs)
{
    float maxv;
    double lse = log_sum_exp(logits, n_vocab, &maxv);
    if (logprob)
        *logprob = (float)((double)(logits[id] - maxv) - lse);
    top_logprobs_of(logits, n_vocab, maxv, lse, n_top, top_ids, top_logprobs);
}

int32_t sampler_sample(sampler *s, float *logits, float *logprob, int n_top, int32_t *top_ids,
                       float *top_logprobs)
{
    const sampler_params *p = &s->p;
    int32_t V = s->n_vocab;
    /* Logprobs are reported over the raw distribution (before penalties and filters), as
     * OpenAI and vLLM report them: its log-sum-exp is taken once, for the tops and the chosen. */
    float raw_max = 0.0f;
    double lse = n_top > 0 || logprob ? log_sum_exp(logits, V, &raw_max) : 0.0;
    top_logprobs_of(logits, V, raw_max, lse, n_top, top_ids, top_logprobs);
    float *raw = NULL;
    if (logprob) {
        raw = s->cand_p; /* scratch otherwise unused: keeps the raw logits for the logprob */
        memcpy(raw, logits, (size_t)V * sizeof(float));
    }

    apply_penalties(s, logits);
    int32_t chosen;
    if (p->temperature == 0.0f) {
        chosen = argmax(logits, V);
    } else {
        float maxv = max_of(logits, V);
        /* probabilities at temperature, in logits[] */
        double sum = 0.0;
        for (int32_t i = 0; i < V; i++) {
            double e = exp((double)(logits[i] - maxv) / p->temperature);
            logits[i] = (float)e;
            sum += e;
        }
        int32_t n = 0;
        for (int32_t i = 0; i < V; i++) {
            logits[i] = (float)(logits[i] / sum);
            s->cand_id[n++] = i;
        }
        bool sorted = false;
        if (p->top_k > 0 && p->top_k < n) {
            select_top_k(s->cand_id, n, p->top_k, logits);
            sort_candidates(s->cand_id, (size_t)p->top_k, logits);
            sorted = true;
            n = p->top_k;
        }
        if (p->top_p < 1.0f) {
            if (!sorted)
                sort_candidates(s->cand_id, (size_t)n, logits);
            sorted = true;
            double mass = 0.0, cum = 0.0;
            for (int32_t i = 0; i < n; i++)
                mass += logits[s->cand_id[i]];
            int32_t keep = n;
            for (int32_t i = 0; i < n; i++) {
                cum += logits[s->cand_id[i]] / mass;
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
        if (p->min_p > 0.0f) {
            float top = 0.0f;
            for (int32_t i = 0; i < n; i++)
                if (logits[s->cand_id[i]] > top)
                    top = logits[s->cand_id[i]];
            int32_t w = 0;
            for (int32_t i = 0; i < n; i++)
                if (logits[s->cand_id[i]] >= p->min_p * top)
                    s->cand_id[w++] = s->cand_id[i];
            n = w;
        }
        double mass = 0.0;
        for (int32_t i = 0; i < n; i++)
            mass += logits[s->cand_id[i]];
        double r = rng_uniform(s) * mass, cum = 0.0;
        chosen = s->cand_id[n - 1];
        for (int32_t i = 0; i < n; i++) {
            cum += logits[s->cand_id[i]];
            if (r < cum) {
                chosen = s->cand_id[i];
                break;
            }
        }
    }
    if (logprob)
        *logprob = (float)((double)(raw[chosen] - raw_max) - lse);
    return chosen;
}
