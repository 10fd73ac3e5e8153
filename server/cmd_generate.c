/* kvserve generate: one prompt, one sequence, through the same scheduler as `serve` (one
 * engine driver, one stop policy: EOS, and a generated BOS), without HTTP.
 * --no-cache instead recomputes the whole sequence every step straight through the engine:
 * the textbook quadratic loop, kept to verify the cache and to show what it buys. */
#include "server/commands.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "kvpool/kvpool.h"
#include "scheduler/scheduler.h"

#include <pthread.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    long max_tokens;
    sampler_params sp;
    bool ids;
    bool no_cache;
    bool ignore_eos;
    long threads;
    long block_size;
    engine_kv_type kv_type;
    const char *kernels;
} gen_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvserve generate -m MODEL.gguf -p PROMPT [options]\n"
            "\n"
            "  -m, --model PATH       GGUF model to load (required)\n"
            "  -p, --prompt TEXT      prompt text; BOS is added when the vocabulary asks for it\n"
            "  -n, --max-tokens N     tokens to generate (default 64); stops early at EOS/BOS\n"
            "      --temp T           temperature, 0 = greedy (default 0)\n"
            "      --top-k K          keep the K most likely tokens (default 0 = off)\n"
            "      --top-p P          nucleus sampling mass (default 1 = off)\n"
            "      --min-p P          drop tokens below P x the top probability (default 0)\n"
            "      --seed S           sampling seed (default 0)\n"
            "      --ids              print generated token ids, space-separated, instead of text\n"
            "      --no-cache         recompute the whole sequence at every step (no KV reuse)\n"
            "      --ignore-eos       keep generating past EOS/BOS\n"
            "      --threads N        compute threads (default: online cores)\n"
            "      --block-size N     KV block size in tokens (default 16)\n"
            "      --kv-cache-type T  f16|f32: what cached keys and values are stored as (f16)\n"
            "      --kernels K        auto|avx2|generic: the engine's kernels (auto: the best\n"
            "                         this CPU runs; every choice gives the same results)\n"
            "  -h, --help             this text\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, gen_opts *o)
{
    enum {
        O_TEMP = 256,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_SEED,
        O_IDS,
        O_NOCACHE,
        O_IGNEOS,
        O_THREADS,
        O_BS,
        O_KVTYPE,
        O_KERNELS
    };
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"temp", required_argument, NULL, O_TEMP},
        {"top-k", required_argument, NULL, O_TOPK},
        {"top-p", required_argument, NULL, O_TOPP},
        {"min-p", required_argument, NULL, O_MINP},
        {"seed", required_argument, NULL, O_SEED},
        {"ids", no_argument, NULL, O_IDS},
        {"no-cache", no_argument, NULL, O_NOCACHE},
        {"ignore-eos", no_argument, NULL, O_IGNEOS},
        {"threads", required_argument, NULL, O_THREADS},
        {"block-size", required_argument, NULL, O_BS},
        {"kv-cache-type", required_argument, NULL, O_KVTYPE},
        {"kernels", required_argument, NULL, O_KERNELS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long v = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': bad = parse_long(optarg, 1, 1 << 20, &o->max_tokens); break;
        case O_TEMP: bad = parse_float(optarg, 0, 100, &o->sp.temperature); break;
        case O_TOPK:
            bad = parse_long(optarg, 0, 1 << 20, &v);
            o->sp.top_k = (int32_t)v;
            break;
        case O_TOPP: bad = parse_float(optarg, 1e-6f, 1, &o->sp.top_p); break;
        case O_MINP: bad = parse_float(optarg, 0, 1, &o->sp.min_p); break;
        case O_SEED:
            bad = parse_long(optarg, 0, __LONG_MAX__, &v);
            o->sp.seed = (uint64_t)v;
            break;
        case O_IDS: o->ids = true; break;
        case O_NOCACHE: o->no_cache = true; break;
        case O_IGNEOS: o->ignore_eos = true; break;
        case O_THREADS: bad = parse_long(optarg, 1, 1024, &o->threads); break;
        case O_BS: bad = parse_long(optarg, 1, 1024, &o->block_size); break;
        case O_KERNELS: o->kernels = optarg; break;
        case O_KVTYPE: {
            int t = engine_kv_type_parse(optarg);
            bad = t < 0;
            o->kv_type = (engine_kv_type)(t < 0 ? 0 : t);
            break;
        }
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "kvserve generate: invalid value '%s' for option %s\n", optarg,
                    argv[optind - 1]);
            return -1;
        }
    }
    if (!o->model || !o->prompt) {
        fprintf(stderr, "kvserve generate: -m MODEL and -p PROMPT are required\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

/* Runs positions [from, n) of tokens through the engine, logits for the last one. */
static int forward_span(engine_ctx *ctx, engine_kv *kv, kvpool *pool, kvpool_seq *seq,
                        const int32_t *tokens, uint32_t from, uint32_t n, int32_t *pos, int32_t *sq,
                        bool *want, float *logits)
{
    kvpool_copy cp;
    int n_cp;
    int rc = kvpool_seq_append(pool, seq, tokens + from, n - from, &cp, &n_cp);
    if (rc)
        return rc;
    for (uint32_t i = from; i < n; i++) {
        pos[i - from] = (int32_t)i;
        sq[i - from] = 0;
        want[i - from] = i == n - 1;
    }
    engine_seq_view view;
    view.blocks = kvpool_seq_blocks(seq, &view.n_blocks);
    engine_batch b = {n - from, tokens + from, pos, sq, want, 1, &view};
    rc = engine_forward(ctx, kv, &b, logits);
    if (!rc)
        kvpool_seq_commit(pool, seq, n);
    return rc;
}

typedef struct gen_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool notified;
} gen_wait;

static void gen_notify(void *ud)
{
    gen_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->notified = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* The cached path: a scheduler with one sequence's worth of KV blocks, the request submitted
 * and its events printed as they come. Returns 0 or a status. */
static int generate_scheduled(const gen_opts *o, const engine_model *model, const int32_t *prompt,
                              uint32_t n_prompt)
{
    sched_params sp = sched_default_params();
    sp.max_num_seqs = 1;
    sp.max_queue = 1;
    sp.block_size = (uint32_t)o->block_size;
    sp.kv_type = o->kv_type;
    sp.n_threads = (uint32_t)o->threads;
    sp.n_ctx = n_prompt + (uint32_t)o->max_tokens;
    sp.kv_blocks = (sp.n_ctx + sp.block_size - 1) / sp.block_size + 1;
    sp.max_batched_tokens = n_prompt > 512 ? n_prompt : 512;
    sp.prefix_cache = false;
    sched *s = NULL;
    int rc = sched_create(&sp, model, &s);
    if (rc)
        return rc;
    gen_wait w = {.notified = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    sched_request_params p = {0};
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = (uint32_t)o->max_tokens;
    p.n = 1;
    p.sampling = o->sp;
    p.ignore_eos = o->ignore_eos;
    p.n_top_logprobs = o->ids ? 0 : -1; /* token infos carry the ids */
    sched_req *r = NULL;
    double t0 = time_now_s();
    uint32_t n_gen = 0;
    rc = sched_submit(s, &p, gen_notify, &w, &r);
    while (!rc) {
        sched_event ev;
        int got = sched_req_next(r, &ev);
        if (got < 0)
            break;
        if (got == 0) {
            pthread_mutex_lock(&w.mu);
            while (!w.notified)
                pthread_cond_wait(&w.cv, &w.mu);
            w.notified = false;
            pthread_mutex_unlock(&w.mu);
            continue;
        }
        if (o->ids) {
            for (uint32_t i = 0; i < ev.n_tokens; i++)
                printf(n_gen + i ? " %d" : "%d", ev.tokens[i].id);
            n_gen += ev.n_tokens;
        } else if (ev.text_len) {
            fwrite(ev.text, 1, ev.text_len, stdout);
        }
        fflush(stdout);
        if (ev.finish != SCHED_FINISH_NONE) {
            n_gen = ev.completion_tokens;
            if (ev.finish == SCHED_FINISH_ERROR)
                rc = ev.status ? ev.status : KVS_EIO;
        }
        sched_event_free(&ev);
    }
    printf("\n");
    sched_req_release(r);
    sched_destroy(s);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    if (rc) {
        fprintf(stderr, "kvserve generate: generation failed: %s\n", status_str(rc));
        return rc;
    }
    double t1 = time_now_s();
    /* events are read as they are woken for: the whole run is the honest clock here */
    fprintf(stderr,
            "kvserve generate: prompt %u tokens, generated %u tokens in %.1f ms (%.2f tok/s, "
            "prefill included; scheduler, paged KV cache)\n",
            n_prompt, n_gen, (t1 - t0) * 1e3, t1 > t0 ? n_gen / (t1 - t0) : 0.0);
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    gen_opts o = {0};
    o.max_tokens = 64;
    o.sp = sampler_default_params();
    o.sp.temperature = 0.0f;
    o.block_size = 16;
    o.kv_type = ENGINE_KV_F16;
    o.threads = sysconf(_SC_NPROCESSORS_ONLN);
    int prc = parse_args(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;

    char err[512] = "";
    if (engine_kernels_check(o.kernels, err, sizeof err)) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        return 2;
    }
    engine_model *model = NULL;
    engine_load_params lp = {.verbose = true, .kernels = o.kernels};
    int rc = engine_model_load(o.model, &lp, &model, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvserve generate: cannot load %s: %s\n", o.model, err);
        return 1;
    }
    const engine_hparams *hp = engine_model_hparams(model);
    const tok_vocab *vocab = engine_model_vocab(model);
    size_t plen = strlen(o.prompt), n_prompt = 0;
    size_t cap = plen + 2 + (size_t)o.max_tokens;
    int32_t *tokens = malloc(cap * sizeof(int32_t));
    rc = tokens
             ? tok_encode(vocab, o.prompt, plen, tok_add_bos(vocab), false, tokens, cap, &n_prompt)
             : KVS_ENOMEM;
    if (rc || n_prompt == 0) {
        fprintf(stderr, "kvserve generate: cannot tokenize the prompt: %s\n",
                rc ? status_str(rc) : "empty prompt");
        free(tokens);
        engine_model_destroy(model);
        return 1;
    }
    if (!o.no_cache) {
        rc = generate_scheduled(&o, model, tokens, (uint32_t)n_prompt);
        free(tokens);
        engine_model_destroy(model);
        return rc ? 1 : 0;
    }
    uint32_t n_total = (uint32_t)(n_prompt + (size_t)o.max_tokens);
    uint32_t bs = (uint32_t)o.block_size;
    kvpool_params kp = {(n_total + bs - 1) / bs + 1, bs, false};
    kvpool *pool = NULL;
    kvpool_seq *seq = NULL;
    engine_kv *kv = NULL;
    engine_ctx *ctx = NULL;
    sampler *smp = NULL;
    uint32_t max_rows = n_total;
    int32_t *pos = malloc(n_total * sizeof(int32_t)), *sq = malloc(n_total * sizeof(int32_t));
    bool *want = malloc(n_total * sizeof(bool));
    float *logits = malloc(hp->n_vocab * sizeof(float));
    rc = (!pos || !sq || !want || !logits) ? KVS_ENOMEM : 0;
    if (!rc)
        rc = kvpool_create(&kp, &pool);
    if (!rc)
        rc = kvpool_seq_create(pool, &seq);
    if (!rc)
        rc = engine_kv_create(model, o.kv_type, kp.n_blocks, bs, &kv);
    if (!rc)
        rc = engine_ctx_create(model, max_rows < 1 ? 1 : max_rows, (uint32_t)o.threads, &ctx);
    if (!rc)
        rc = sampler_create(&o.sp, (int32_t)hp->n_vocab, &smp);
    if (rc) {
        fprintf(stderr, "kvserve generate: setup failed: %s\n", status_str(rc));
        goto out;
    }
    for (size_t i = 0; i < n_prompt; i++)
        sampler_accept(smp, tokens[i], true);

    tok_decoder dec;
    tok_decoder_init(&dec);
    uint32_t n = (uint32_t)n_prompt, n_gen = 0;
    double t0 = time_now_s(), t_first = 0;
    rc = forward_span(ctx, kv, pool, seq, tokens, 0, n, pos, sq, want, logits);
    while (!rc) {
        int32_t tok = sampler_sample(smp, logits, NULL, 0, NULL, NULL);
        sampler_accept(smp, tok, false);
        if (n_gen == 0)
            t_first = time_now_s();
        bool stop = !o.ignore_eos && (tok == tok_eos(vocab) || tok == tok_bos(vocab));
        if (stop)
            break;
        tokens[n++] = tok;
        n_gen++;
        if (o.ids) {
            printf(n_gen > 1 ? " %d" : "%d", tok);
        } else {
            char piece[256];
            int len = tok_decoder_push(vocab, &dec, tok, piece, sizeof piece);
            if (len > 0)
                fwrite(piece, 1, (size_t)len, stdout);
        }
        fflush(stdout);
        if (n_gen >= (uint32_t)o.max_tokens)
            break;
        /* Forget everything and recompute the whole sequence from position 0. */
        kvpool_seq_destroy(pool, seq);
        seq = NULL;
        rc = kvpool_seq_create(pool, &seq);
        if (!rc)
            rc = forward_span(ctx, kv, pool, seq, tokens, 0, n, pos, sq, want, logits);
    }
    if (!o.ids) {
        char tail[16];
        int len = tok_decoder_flush(&dec, tail, sizeof tail);
        if (len > 0)
            fwrite(tail, 1, (size_t)len, stdout);
    }
    printf("\n");
    if (rc) {
        fprintf(stderr, "kvserve generate: forward pass failed: %s\n", status_str(rc));
    } else {
        double t1 = time_now_s();
        double decode_s = t1 - t_first;
        fprintf(stderr,
                "kvserve generate: prompt %zu tokens, generated %u tokens; prefill %.1f ms, "
                "decode %.2f tok/s (%s)\n",
                n_prompt, n_gen, (t_first - t0) * 1e3,
                n_gen > 1 && decode_s > 0 ? (n_gen - 1) / decode_s : 0.0,
                "no cache: full recompute per token");
    }
out:
    sampler_destroy(smp);
    engine_ctx_destroy(ctx);
    engine_kv_destroy(kv);
    kvpool_seq_destroy(pool, seq);
    kvpool_destroy(pool);
    free(pos);
    free(sq);
    free(want);
    free(logits);
    free(tokens);
    engine_model_destroy(model);
    return rc ? 1 : 0;
}
