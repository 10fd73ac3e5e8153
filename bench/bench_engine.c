/* kvs-bench-engine: engine-level timings, no HTTP and no scheduler thread.
 *   position  step time of one sequence against its position, with the paged KV cache and
 *             with a full recomputation (--no-cache loop), as CSV: what the cache buys.
 *   batch     decode throughput with B sequences stepping together (one GEMM per step),
 *             as CSV, plus the sgemm rate of the same machine at 64 rows for comparison
 *             (with OpenBLAS's core type: Debian's 0.3.21 takes CPUs it does not know for
 *             Prescott, whose slow kernels would make the comparison meaningless);
 *             each sequence first prefills KVS_BENCH_PROMPT tokens (default 8), so the
 *             attention's share at longer contexts can be measured too.
 * KVS_BENCH_KV=f32 runs with an F32 KV cache instead of the server's default F16.
 *   prefill   one step of R prompt rows (R / 32 sequences of 32 tokens, or of
 *             KVS_BENCH_PREFILL_LEN, logits for each
 *             sequence's last row), for each R of a list: prompt-processing speed as CSV.
 * Block tables are laid out by hand (the engine's contract), as in tests/test_engine.c. */
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/model.h"

#ifdef KVS_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: kvs-bench-engine position MODEL.gguf MAX_POS [THREADS]\n"
                    "       kvs-bench-engine batch MODEL.gguf STEPS B1,B2,... [THREADS]\n"
                    "       kvs-bench-engine prefill MODEL.gguf R1,R2,... [THREADS]\n");
    return 2;
}

typedef struct bench {
    engine_model *m;
    engine_kv *kv;
    engine_ctx *ctx;
    uint32_t block_size, blocks_per_seq;
    int32_t *blocks; /* (n_seqs, blocks_per_seq) */
    int32_t *tok, *pos, *sq;
    bool *want;
    engine_seq_view *views;
    float *logits;
} bench;

static int bench_init(bench *b, engine_model *m, uint32_t n_seqs, uint32_t ctx_len,
                      uint32_t max_rows, uint32_t threads)
{
    memset(b, 0, sizeof *b);
    b->m = m;
    b->block_size = 16;
    b->blocks_per_seq = (ctx_len + 15) / 16;
    uint32_t nb = b->blocks_per_seq * n_seqs;
    const char *kvt = getenv("KVS_BENCH_KV"); /* f16 (default, as the server) or f32 */
    int type = kvt ? engine_kv_type_parse(kvt) : ENGINE_KV_F16;
    int rc = type < 0 ? KVS_EINVAL : engine_kv_create(m, type, nb, b->block_size, &b->kv);
    if (!rc)
        rc = engine_ctx_create(m, max_rows, threads, &b->ctx);
    if (rc)
        return rc;
    b->blocks = malloc(nb * sizeof(int32_t));
    b->tok = calloc(max_rows, sizeof(int32_t));
    b->pos = calloc(max_rows, sizeof(int32_t));
    b->sq = calloc(max_rows, sizeof(int32_t));
    b->want = calloc(max_rows, sizeof(bool));
    b->views = calloc(n_seqs, sizeof *b->views);
    b->logits = malloc((size_t)n_seqs * engine_model_hparams(m)->n_vocab * sizeof(float));
    for (uint32_t i = 0; i < nb; i++)
        b->blocks[i] = (int32_t)i;
    for (uint32_t s = 0; s < n_seqs; s++) {
        b->views[s].blocks = b->blocks + s * b->blocks_per_seq;
        b->views[s].n_blocks = b->blocks_per_seq;
    }
    return 0;
}

static void bench_free(bench *b)
{
    engine_kv_destroy(b->kv);
    engine_ctx_destroy(b->ctx);
    free(b->blocks);
    free(b->tok);
    free(b->pos);
    free(b->sq);
    free(b->want);
    free(b->views);
    free(b->logits);
}

/* One forward over rows [0, n) already filled in. */
static double timed_forward(bench *b, uint32_t n, uint32_t n_seqs)
{
    engine_batch eb = {n, b->tok, b->pos, b->sq, b->want, n_seqs, b->views};
    double t0 = time_now_s();
    int rc = engine_forward(b->ctx, b->kv, &eb, b->logits);
    double t = time_now_s() - t0;
    if (rc) {
        fprintf(stderr, "forward failed: %s\n", status_str(rc));
        exit(1);
    }
    return t;
}

static int run_position(engine_model *m, uint32_t max_pos, uint32_t threads)
{
    bench b;
    if (bench_init(&b, m, 1, max_pos + 1, max_pos + 1, threads))
        return 1;
    uint32_t V = engine_model_hparams(m)->n_vocab;
    printf("position,cached_ms,recompute_ms\n");
    /* Cached: decode one token per step, positions 0..max_pos-1; record every step. */
    double *cached = calloc(max_pos, sizeof(double));
    for (uint32_t p = 0; p < max_pos; p++) {
        b.tok[0] = (int32_t)((p * 7919u + 3) % V);
        b.pos[0] = (int32_t)p;
        b.want[0] = true;
        cached[p] = timed_forward(&b, 1, 1);
    }
    /* Recompute: the whole sequence 0..p at sampled positions (quadratic overall). */
    for (uint32_t p = 1; p <= max_pos; p = p < 16 ? p * 2 : p + (p < 256 ? 16 : p / 4)) {
        for (uint32_t i = 0; i < p; i++) {
            b.tok[i] = (int32_t)((i * 7919u + 3) % V);
            b.pos[i] = (int32_t)i;
            b.want[i] = i == p - 1;
        }
        double t = timed_forward(&b, p, 1);
        /* median-free smoothing: average the cached step over a small window around p */
        double avg = 0;
        uint32_t lo = p > 4 ? p - 4 : 0, hi = p + 4 < max_pos ? p + 4 : max_pos;
        for (uint32_t i = lo; i < hi; i++)
            avg += cached[i];
        avg /= (double)(hi - lo);
        printf("%u,%.4f,%.4f\n", p, avg * 1e3, t * 1e3);
        fflush(stdout);
    }
    free(cached);
    bench_free(&b);
    return 0;
}

#ifdef KVS_HAVE_OPENBLAS
static double sgemm_gflops(uint32_t rows, uint32_t n_in, uint32_t n_out)
{
    float *a = calloc((size_t)rows * n_in, sizeof(float));
    float *w = calloc((size_t)n_in * n_out, sizeof(float));
    float *c = calloc((size_t)rows * n_out, sizeof(float));
    for (size_t i = 0; i < (size_t)rows * n_in; i++)
        a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)n_in * n_out; i++)
        w[i] = (float)(i % 7) * 0.01f;
    int iters = 0;
    double t0 = time_now_s(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n_out, (int)n_in, 1.0f,
                    a, (int)n_in, w, (int)n_in, 0.0f, c, (int)n_out);
        iters++;
        t = time_now_s() - t0;
    } while (t < 1.0);
    free(a);
    free(w);
    free(c);
    return 2.0 * rows * n_in * n_out * iters / t / 1e9;
}

#endif

/* The values 1..max of a comma-separated list ("1,4,16"), at most cap of them. */
static size_t parse_list(const char *list, uint32_t max, uint32_t *out, size_t cap)
{
    size_t n = 0;
    char *dup = strdup(list);
    for (char *tok = dup ? strtok(dup, ",") : NULL; tok && n < cap; tok = strtok(NULL, ",")) {
        long v = atol(tok);
        if (v >= 1 && v <= (long)max)
            out[n++] = (uint32_t)v;
    }
    free(dup);
    return n;
}

static int run_batch(engine_model *m, uint32_t steps, const char *list, uint32_t threads)
{
    const engine_hparams *hp = engine_model_hparams(m);
    printf("batch,steps,tok_per_s,ms_per_step\n");
    uint32_t sizes[32];
    size_t n_sizes = parse_list(list, 1024, sizes, 32);
    for (size_t k = 0; k < n_sizes; k++) {
        uint32_t B = sizes[k];
        uint32_t prompt =
            getenv("KVS_BENCH_PROMPT") ? (uint32_t)atoi(getenv("KVS_BENCH_PROMPT")) : 8;
        bench b;
        if (bench_init(&b, m, B, prompt + steps + 1, B * prompt, threads))
            return 1;
        /* prefill every sequence with a short prompt */
        uint32_t n = 0;
        for (uint32_t s = 0; s < B; s++)
            for (uint32_t i = 0; i < prompt; i++, n++) {
                b.tok[n] = (int32_t)((s * 131 + i * 17 + 5) % hp->n_vocab);
                b.pos[n] = (int32_t)i;
                b.sq[n] = (int32_t)s;
                b.want[n] = i == prompt - 1;
            }
        timed_forward(&b, n, B);
        double total = 0;
        for (uint32_t st = 0; st < steps; st++) {
            for (uint32_t s = 0; s < B; s++) {
                b.tok[s] = (int32_t)((s * 31 + st * 7 + 1) % hp->n_vocab);
                b.pos[s] = (int32_t)(prompt + st);
                b.sq[s] = (int32_t)s;
                b.want[s] = true;
            }
            total += timed_forward(&b, B, B);
        }
        printf("%u,%u,%.1f,%.3f\n", B, steps, B * steps / total, total / steps * 1e3);
        fflush(stdout);
        bench_free(&b);
    }
#ifdef KVS_HAVE_OPENBLAS
    /* sgemm with the thread budget the engine had (KVS_BENCH_SGEMM=0 skips it: a second of work
     * that bench/kernels.sh's CPU-time comparison would count). */
    const char *sg = getenv("KVS_BENCH_SGEMM");
    if (sg && !strcmp(sg, "0"))
        return 0;
    openblas_set_num_threads((int)threads);
    const char *core = openblas_get_corename();
    printf("# openblas %s core %s%s\n", openblas_get_config(), core,
           !strcmp(core, "Prescott") ? " (a fallback: this OpenBLAS does not know the CPU; set "
                                       "OPENBLAS_CORETYPE=Haswell or SkylakeX)"
                                     : "");
    printf("# sgemm 64 x %u -> %u: %.1f GFLOP/s\n", hp->n_embd, hp->n_ff,
           sgemm_gflops(64, hp->n_embd, hp->n_ff));
#endif
    return 0;
}

static int run_prefill(engine_model *m, const char *list, uint32_t threads)
{
    const engine_hparams *hp = engine_model_hparams(m);
    printf("rows,seqs,ms_per_step,rows_per_s\n");
    uint32_t sizes[32];
    size_t n_sizes = parse_list(list, 65536, sizes, 32);
    /* KVS_BENCH_PREFILL_LEN: tokens per sequence (default 32); 512 is one 512-token prompt,
     * whose causal attention a server's long-prompt prefill pays */
    const char *pl = getenv("KVS_BENCH_PREFILL_LEN");
    uint32_t plen = pl && atoi(pl) > 0 ? (uint32_t)atoi(pl) : 32;
    for (size_t k = 0; k < n_sizes; k++) {
        uint32_t R = sizes[k];
        uint32_t len = R < plen ? R : plen, S = (R + len - 1) / len;
        bench b;
        if (bench_init(&b, m, S, len, R, threads))
            return 1;
        for (uint32_t n = 0; n < R; n++) {
            b.sq[n] = (int32_t)(n / len);
            b.pos[n] = (int32_t)(n % len);
            b.tok[n] = (int32_t)((n * 131 + 5) % hp->n_vocab);
            b.want[n] = n % len == len - 1 || n == R - 1;
        }
        timed_forward(&b, R, S); /* warm-up */
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) { /* the same rows again: overwrites the same slots */
            double t = timed_forward(&b, R, S);
            best = t < best ? t : best;
        }
        printf("%u,%u,%.3f,%.1f\n", R, S, best * 1e3, R / best);
        fflush(stdout);
        bench_free(&b);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return usage();
    uint32_t threads = 2;
    char err[512];
    engine_model *m;
    /* KVS_BENCH_KERNELS=avx512|avx2|generic forces a kernel table (--kernels of the server) */
    /* KVS_BENCH_ACTIVATIONS=q8|f32 (--activations of the server) */
    engine_load_params lp = {.verbose = true,
                             .kernels = getenv("KVS_BENCH_KERNELS"),
                             .activations = getenv("KVS_BENCH_ACTIVATIONS")};
    if (engine_model_load(argv[2], &lp, &m, err, sizeof err)) {
        fprintf(stderr, "kvs-bench-engine: %s\n", err);
        return 1;
    }
    int rc;
    if (!strcmp(argv[1], "position")) {
        if (argc > 4)
            threads = (uint32_t)atoi(argv[4]);
        rc = run_position(m, (uint32_t)atoi(argv[3]), threads);
    } else if (!strcmp(argv[1], "batch") && argc >= 5) {
        if (argc > 5)
            threads = (uint32_t)atoi(argv[5]);
        rc = run_batch(m, (uint32_t)atoi(argv[3]), argv[4], threads);
    } else if (!strcmp(argv[1], "prefill")) {
        if (argc > 4)
            threads = (uint32_t)atoi(argv[4]);
        rc = run_prefill(m, argv[3], threads);
    } else {
        rc = usage();
    }
    engine_model_destroy(m);
    return rc;
}
