/* kvs-bench-grammar: what constrained decoding costs per token on a real vocabulary.
 *   states  the time of one grammar_mask in typical states (start of a value, inside a key,
 *           after a key, inside a string, in a number, after a value), median of REPS calls
 *   walks   random walks (a random allowed token each step, half of them among the one-byte
 *           tokens so structure closes): mask and accept time per generated token, mean and
 *           percentiles, as the engine thread would pay them per stream and step
 * Prints markdown rows (bench/grammar.sh wraps them into docs/BENCHMARKS.md's section). */
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/grammar.h"
#include "engine/tokenizer.h"
#include "server/json_schema.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_schema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\"},\"email\":{\"type\":[\"string\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\"}},\"required\":[\"city\",\"zip\"],"
    "\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"role\"],\"additionalProperties\":false}";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void state_row(const char *gname, const grammar_def *d, const grammar_vocab *gv,
                      const char *prefix, const char *what, int reps, uint32_t *mask)
{
    grammar *g;
    if (grammar_create(d, &g) || !grammar_accept_bytes(g, prefix, strlen(prefix))) {
        fprintf(stderr, "bench: prefix %s refused\n", prefix);
        exit(1);
    }
    double *t = malloc((size_t)reps * sizeof *t);
    int allowed = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = time_now_s();
        allowed = grammar_mask(g, gv, mask);
        t[r] = (time_now_s() - t0) * 1e6;
    }
    char shown[64];
    size_t k = 0;
    for (const char *p = prefix; *p && k + 2 < sizeof shown; p++)
        if (*p != '|')
            shown[k++] = *p;
    shown[k] = '\0';
    printf("| %s | %s | `%s` | %d | %.1f |\n", gname, what, shown, allowed,
           pct(t, (size_t)reps, 0.5));
    free(t);
    grammar_destroy(g);
}

typedef struct walk_stats {
    double *mask_us, *accept_us, other_us; /* other: is_finished + mask_logits, summed */
    size_t n, cap;
    int walks, completed;
} walk_stats;

static void walks(const grammar_def *d, const tok_vocab *v, const grammar_vocab *gv, int n_walks,
                  int max_steps, uint32_t *mask, walk_stats *ws)
{
    int32_t n = grammar_vocab_n_tokens(gv);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    int32_t *single = malloc((size_t)n * sizeof *single);
    int32_t eos = tok_eos(v);
    float *logits = calloc((size_t)n, sizeof *logits);
    uint8_t *one_byte = malloc((size_t)n);
    for (int32_t t = 0; t < n; t++)
        one_byte[t] = tok_token_to_piece(v, t, NULL, 0) == 1;
    for (int w = 0; w < n_walks; w++) {
        uint64_t rng = (uint64_t)w * 0x9E3779B97F4A7C15ull + 12345;
        grammar *g;
        if (grammar_create(d, &g))
            exit(1);
        ws->walks++;
        for (int s = 0; s < max_steps; s++) {
            double t0 = time_now_s();
            int cnt = grammar_mask(g, gv, mask);
            double t1 = time_now_s();
            if (cnt <= 0)
                exit(1);
            if (ws->n == ws->cap) {
                ws->cap = ws->cap ? 2 * ws->cap : 4096;
                ws->mask_us = realloc(ws->mask_us, ws->cap * sizeof *ws->mask_us);
                ws->accept_us = realloc(ws->accept_us, ws->cap * sizeof *ws->accept_us);
            }
            double tf = time_now_s();
            bool finished = grammar_is_finished(g);
            grammar_mask_logits(mask, n, logits);
            ws->other_us += (time_now_s() - tf) * 1e6;
            if (finished || (grammar_is_complete(g) && rng_next(&rng) % 2 == 0)) {
                ws->completed++;
                break;
            }
            int na = 0, ns = 0;
            for (int32_t t = 0; t < n; t++) {
                if (!(mask[t >> 5] >> (t & 31) & 1) || t == eos)
                    continue;
                allowed[na++] = t;
                if (one_byte[t])
                    single[ns++] = t;
            }
            int32_t tok = ns && rng_next(&rng) % 2 ? single[rng_next(&rng) % (uint64_t)ns]
                                                   : allowed[rng_next(&rng) % (uint64_t)na];
            double t2 = time_now_s();
            if (!grammar_accept_token(g, gv, tok))
                exit(1);
            double t3 = time_now_s();
            ws->mask_us[ws->n] = (t1 - t0) * 1e6;
            ws->accept_us[ws->n] = (t3 - t2) * 1e6;
            ws->n++;
        }
        grammar_destroy(g);
    }
    free(allowed);
    free(single);
    free(logits);
    free(one_byte);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: kvs-bench-grammar VOCAB.gguf [REPS] [WALKS] [STEP_MS]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 200;
    int n_walks = argc > 3 ? atoi(argv[3]) : 40;
    double step_ms = argc > 4 ? atof(argv[4]) : 22.17;
    gguf_file *f;
    char err[256];
    tok_vocab *v;
    if (gguf_open(argv[1], &f, err, sizeof err) || tok_create_from_gguf(f, &v, err, sizeof err)) {
        fprintf(stderr, "bench: %s: %s\n", argv[1], err);
        return 1;
    }
    gguf_close(f);
    double t0 = time_now_s();
    grammar_vocab *gv;
    if (grammar_vocab_create(v, NULL, 0, &gv))
        return 1;
    double build_ms = (time_now_s() - t0) * 1e3;
    grammar_def *dobj, *dsch;
    cJSON *s = cJSON_Parse(k_schema);
    if (grammar_def_json_object(NULL, &dobj) ||
        srv_json_schema_compile(s, NULL, &dsch, err, sizeof err)) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    cJSON_Delete(s);
    uint32_t *mask = malloc(grammar_mask_words(grammar_vocab_n_tokens(gv)) * sizeof *mask);
    printf("Vocabulary: %d tokens, a trie of %zu nodes built in %.1f ms.\n\n",
           grammar_vocab_n_tokens(gv), grammar_vocab_n_nodes(gv), build_ms);
    printf("One mask in a given state (median of %d calls):\n\n", reps);
    printf("| grammar | state | text so far | allowed tokens | µs/mask |\n");
    printf("|---|---|---|---:|---:|\n");
    static const struct {
        int schema;
        const char *what, *prefix;
    } rows[] = {
        {0, "start", ""},
        {0, "after `{` (a key or `}`)", "{"},
        {0, "inside a key", "{\"na"},
        {0, "after a key", "{\"name\""},
        {0, "start of a value", "{\"name\":"},
        {0, "inside a string", "{\"name\":\"Jo"},
        {0, "inside a number", "{\"n\":12"},
        {0, "after a value", "{\"name\":\"Jo\""},
        {0, "in an array", "{\"a\":[1,"},
        {1, "after `{` (key literals)", "{"},
        {1, "inside a key", "{\"na"},
        {1, "start of a value (string)", "{\"name\":"},
        {1, "inside a string", "{\"name\":\"Jo"},
        {1, "start of a value (integer)", "{\"name\":\"Jo\",\"age\":"},
        {1, "in an integer (digits, `,`)", "{\"name\":\"Jo\",\"age\":3"},
        {1, "start of a value (enum)", "{\"name\":\"Jo\",\"age\":3,\"role\":"},
        {1, "start of a value (string or null)", "{\"name\":\"Jo\",\"age\":3,\"email\":"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        state_row(rows[i].schema ? "schema" : "json_object", rows[i].schema ? dsch : dobj, gv,
                  rows[i].prefix, rows[i].what, reps, mask);
    printf("\nPer generated token over random walks (%d walks of at most 400 tokens each):\n\n",
           n_walks);
    printf("| grammar | tokens | mask mean µs | p50 | p90 | p99 | max | accept µs |"
           " is_finished + mask_logits µs | 16 streams, %% of a %.2f ms step |\n",
           step_ms);
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < 2; k++) {
        walk_stats ws = {0};
        walks(k ? dsch : dobj, v, gv, n_walks, 400, mask, &ws);
        double sm = 0, sa = 0;
        for (size_t i = 0; i < ws.n; i++) {
            sm += ws.mask_us[i];
            sa += ws.accept_us[i];
        }
        double mean = sm / (double)ws.n, acc = sa / (double)ws.n;
        double other = ws.other_us / (double)ws.n, per_tok = mean + acc + other;
        printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f%% |\n",
               k ? "schema" : "json_object", ws.n, mean, pct(ws.mask_us, ws.n, 0.5),
               pct(ws.mask_us, ws.n, 0.9), pct(ws.mask_us, ws.n, 0.99), pct(ws.mask_us, ws.n, 1.0),
               acc, other, 100.0 * 16 * per_tok / (step_ms * 1e3 + 16 * per_tok));
        free(ws.mask_us);
        free(ws.accept_us);
    }
    free(mask);
    grammar_def_destroy(dobj);
    grammar_def_destroy(dsch);
    grammar_vocab_destroy(gv);
    tok_destroy(v);
    return 0;
}
