/* kvserve generate: one prompt from the command line through the same scheduler `serve` runs
 * (continuous batching over the paged KV cache, its stop policy and its detokenizer), without
 * HTTP. --no-cache recomputes the whole sequence every step (each token a fresh one-token
 * request over everything so far, with no prefix reuse): the textbook quadratic loop, kept to
 * verify the cache and to show what it buys. */
#include "server/commands.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "scheduler/scheduler.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct gen_opts {
    const char *model;
    const char *prompt;
    const char *prompt_ids; /* "1,300,77": the prompt as token ids, instead of text */
    long max_tokens;
    sampler_params sp;
    bool ids;
    bool no_cache;
    bool ignore_eos;
    long threads;
    long block_size;
    long ctx_size;
    engine_kv_type kv_type;
    const char *kernels;
    const char *activations;
} gen_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvserve generate -m MODEL.gguf -p PROMPT [options]\n"
            "\n"
            "  -m, --model PATH       GGUF model to load (required)\n"
            "  -p, --prompt TEXT      prompt text; BOS is added when the vocabulary asks for it\n"
            "      --prompt-ids LIST  the prompt as comma-separated token ids instead (as given:\n"
            "                         no BOS added)\n"
            "  -n, --max-tokens N     tokens to generate (default 64); stops early at an\n"
            "                         end-of-generation token (EOS, <|im_end|>, ...) or BOS\n"
            "      --temp T           temperature, 0 = greedy (default 0)\n"
            "      --top-k K          keep the K most likely tokens (default 0 = off)\n"
            "      --top-p P          nucleus sampling mass (default 1 = off)\n"
            "      --min-p P          drop tokens below P x the top probability (default 0)\n"
            "      --seed S           sampling seed (default 0)\n"
            "      --ids              print generated token ids, space-separated, instead of text\n"
            "      --no-cache         recompute the whole sequence at every step (no KV reuse;\n"
            "                         greedy only, to compare with the cached loop)\n"
            "      --ignore-eos       keep generating past EOS/BOS\n"
            "      --threads N        compute threads (default: online cores)\n"
            "      --block-size N     KV block size in tokens (default 16)\n"
            "      --ctx-size N       context length (default 0 = the model's); the prompt and\n"
            "                         --max-tokens must fit in it\n"
            "      --kv-cache-type T  f16|f32: what cached keys and values are stored as (f16)\n"
            "      --kernels K        auto|avx512|avx2|generic: the engine's kernels (auto: the\n"
            "                         best this CPU runs; every choice gives the same results)\n"
            "      --activations A    q8|f32: q8 (default) quantizes activations to int8 for the\n"
            "                         Q8_0, Q4_0 .. Q5_1, Q2_K .. Q6_K weights (faster); f32\n"
            "                         exact\n"
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
        O_CTX,
        O_KVTYPE,
        O_KERNELS,
        O_ACTIVATIONS,
        O_PIDS
    };
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"prompt-ids", required_argument, NULL, O_PIDS},
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
        {"ctx-size", required_argument, NULL, O_CTX},
        {"kv-cache-type", required_argument, NULL, O_KVTYPE},
        {"kernels", required_argument, NULL, O_KERNELS},
        {"activations", required_argument, NULL, O_ACTIVATIONS},
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
        case O_PIDS: o->prompt_ids = optarg; break;
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
        case O_CTX: bad = parse_long(optarg, 0, 1 << 20, &o->ctx_size); break;
        case O_KERNELS: o->kernels = optarg; break;
        case O_ACTIVATIONS: o->activations = optarg; break;
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
    if (!o->model || !o->prompt == !o->prompt_ids) {
        fprintf(stderr, "kvserve generate: -m MODEL and one of -p PROMPT, --prompt-ids are "
                        "required\n");
        usage(stderr);
        return -1;
    }
    if (o->no_cache && o->sp.temperature > 0.0f) {
        /* each recomputed step is a new request, so a sampled run would draw from a new random
         * stream every token and could not match the cached loop it exists to check */
        fprintf(stderr, "kvserve generate: --no-cache is greedy only (--temp 0)\n");
        return -1;
    }
    return 0;
}

/* "1,300,77" into ids (at most strlen(s) of them: each takes a digit); KVS_EINVAL for anything
 * but comma-separated ids below n_vocab. */
static int parse_ids(const char *s, uint32_t n_vocab, int32_t *ids, size_t *n)
{
    *n = 0;
    while (*s) {
        long v;
        char *end;
        if (*s < '0' || *s > '9')
            return KVS_EINVAL;
        errno = 0;
        v = strtol(s, &end, 10);
        if (errno || v >= (long)n_vocab || (*end && *end != ','))
            return KVS_EINVAL;
        ids[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return 0;
}

/* The notify side of a request: the engine thread signals, the main thread waits. */
typedef struct gen_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ready;
} gen_wait;

static void on_notify(void *ud)
{
    gen_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->ready = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* The next event of r, waiting for the engine thread: 1 and *ev, or -1 when r has no more. */
static int next_event(sched_req *r, gen_wait *w, sched_event *ev)
{
    for (;;) {
        int got = sched_req_next(r, ev);
        if (got != 0)
            return got;
        pthread_mutex_lock(&w->mu);
        while (!w->ready)
            pthread_cond_wait(&w->cv, &w->mu);
        w->ready = false;
        pthread_mutex_unlock(&w->mu);
    }
}

/* What one run produced, for the summary line. */
typedef struct gen_run {
    uint32_t n_gen;
    double t_first; /* when the first generated token arrived */
    int status;     /* 0, or the error that ended the choice */
} gen_run;

/* Whether tok is the model's end token that ended the choice: the scheduler stops at every
 * end-of-generation token and at a generated BOS (its stop ids) and reports that token too, but
 * it is not part of the completion (neither the reference nor the text holds it). */
static bool is_end_token(const tok_vocab *v, bool ignore_eos, int32_t tok)
{
    return !ignore_eos && (tok_is_eog(v, tok) || tok == tok_bos(v));
}

/* Prints the ids of ev's tokens (but the end token), counting them in run. */
static void put_ids(const tok_vocab *v, bool ignore_eos, const sched_event *ev, bool ids,
                    gen_run *run)
{
    for (uint32_t i = 0; i < ev->n_tokens; i++) {
        if (is_end_token(v, ignore_eos, ev->tokens[i].id))
            continue;
        if (ids)
            printf(run->n_gen ? " %d" : "%d", ev->tokens[i].id);
        run->n_gen++;
    }
}

/* The cached loop: one request; its text (or ids) printed as the scheduler emits it. */
static void run_cached(sched *sc, const tok_vocab *v, sched_request_params *rp, bool ids,
                       gen_run *run)
{
    gen_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    sched_req *r = NULL;
    run->status = sched_submit(sc, rp, on_notify, &w, &r);
    if (run->status)
        return;
    sched_event ev;
    bool first = true;
    while (next_event(r, &w, &ev) == 1) {
        if (first) /* every event follows a sampled token (or the end) */
            run->t_first = time_now_s();
        first = false;
        put_ids(v, rp->ignore_eos, &ev, ids, run);
        if (!ids && ev.text_len)
            fwrite(ev.text, 1, ev.text_len, stdout);
        fflush(stdout);
        if (ev.finish == SCHED_FINISH_ERROR)
            run->status = ev.status;
        sched_event_free(&ev);
    }
    sched_req_release(r);
}

/* Appends token id's text to *buf (grown as needed). */
static int push_piece(const tok_vocab *v, tok_decoder *d, int32_t id, char **buf, size_t *cap)
{
    for (;;) {
        int len = tok_decoder_push(v, d, id, *buf, *cap);
        if (len != KVS_ENOSPC)
            return len;
        char *nb = realloc(*buf, *cap * 2);
        if (!nb)
            return KVS_ENOMEM;
        *buf = nb;
        *cap *= 2;
    }
}

/* The recomputing loop: every token a one-token request over the whole sequence so far (the
 * scheduler was made without prefix reuse, so each recomputes from position 0). */
static void run_no_cache(sched *sc, sched_request_params *rp, const tok_vocab *vocab,
                         size_t max_tokens, bool ids, gen_run *run)
{
    size_t n = rp->n_prompt;
    int32_t *seq = malloc((n + max_tokens) * sizeof(int32_t));
    size_t cap = 256;
    char *piece = malloc(cap);
    if (!seq || !piece) {
        free(seq);
        free(piece);
        run->status = KVS_ENOMEM;
        return;
    }
    memcpy(seq, rp->prompt, n * sizeof(int32_t));
    tok_decoder dec;
    tok_decoder_init(&dec);
    sched_request_params one = *rp;
    one.max_tokens = 1;
    one.n_top_logprobs = 0; /* the token id comes with its event */
    bool done = false;
    while (!done && run->n_gen < max_tokens && !run->status) {
        one.prompt = seq;
        one.n_prompt = (uint32_t)n;
        gen_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
        sched_req *r = NULL;
        run->status = sched_submit(sc, &one, on_notify, &w, &r);
        if (run->status)
            break;
        sched_event ev;
        done = true; /* unless a token arrives: EOS ends the choice with none */
        while (next_event(r, &w, &ev) == 1) {
            for (uint32_t i = 0; i < ev.n_tokens; i++) {
                int32_t tok = ev.tokens[i].id;
                if (is_end_token(vocab, rp->ignore_eos, tok))
                    continue;
                if (run->n_gen == 0)
                    run->t_first = time_now_s();
                if (ids) {
                    printf(run->n_gen ? " %d" : "%d", tok);
                } else {
                    int len = push_piece(vocab, &dec, tok, &piece, &cap);
                    if (len < 0)
                        run->status = len;
                    else
                        fwrite(piece, 1, (size_t)len, stdout);
                }
                seq[n++] = tok;
                run->n_gen++;
                done = false;
            }
            if (ev.finish == SCHED_FINISH_ERROR)
                run->status = ev.status;
            /* a stop string ends the run as it ends the cached one */
            if (ev.finish == SCHED_FINISH_STOP && ev.n_tokens == 0)
                done = true;
            sched_event_free(&ev);
        }
        fflush(stdout);
        sched_req_release(r);
    }
    if (!ids) {
        int len = tok_decoder_flush(&dec, piece, cap);
        if (len > 0)
            fwrite(piece, 1, (size_t)len, stdout);
    }
    free(piece);
    free(seq);
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
    if (engine_kernels_check(o.kernels, err, sizeof err) ||
        engine_activations_check(o.activations, err, sizeof err)) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        return 2;
    }
    engine_model *model = NULL;
    engine_load_params lp = {.verbose = true, .kernels = o.kernels, .activations = o.activations};
    int rc = engine_model_load(o.model, &lp, &model, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvserve generate: cannot load %s: %s\n", o.model, err);
        return 1;
    }
    const engine_hparams *hp = engine_model_hparams(model);
    const tok_vocab *vocab = engine_model_vocab(model);
    size_t plen = strlen(o.prompt ? o.prompt : o.prompt_ids), n_prompt = 0;
    size_t cap = plen + 2;
    int32_t *tokens = malloc(cap * sizeof(int32_t));
    if (!tokens)
        rc = KVS_ENOMEM;
    else if (o.prompt)
        rc = tok_encode(vocab, o.prompt, plen, tok_add_bos(vocab), false, tokens, cap, &n_prompt);
    else
        rc = parse_ids(o.prompt_ids, hp->n_vocab, tokens, &n_prompt);
    if (rc || n_prompt == 0) {
        fprintf(stderr, "kvserve generate: cannot tokenize the prompt: %s\n",
                rc ? status_str(rc) : "empty prompt");
        free(tokens);
        engine_model_destroy(model);
        return 1;
    }
    uint32_t n_ctx = o.ctx_size ? (uint32_t)o.ctx_size : hp->n_ctx_train;
    if ((uint64_t)n_prompt + (uint64_t)o.max_tokens > n_ctx) {
        fprintf(stderr,
                "kvserve generate: the prompt (%zu tokens) and --max-tokens %ld do not fit the "
                "context of %u tokens (--ctx-size sets it)\n",
                n_prompt, o.max_tokens, n_ctx);
        free(tokens);
        engine_model_destroy(model);
        return 2;
    }
    /* one sequence: a pool of what it takes (the whole context of a 128k-token model would be
     * gigabytes for a few hundred tokens) */
    uint32_t n_need = (uint32_t)(n_prompt + (size_t)o.max_tokens);
    sched_params sp = sched_default_params();
    sp.max_num_seqs = 1;
    sp.block_size = (uint32_t)o.block_size;
    sp.kv_blocks = (n_need + sp.block_size - 1) / sp.block_size;
    sp.kv_type = o.kv_type;
    sp.n_threads = (uint32_t)o.threads;
    sp.n_ctx = n_need;
    sp.prefix_cache = !o.no_cache;
    sched *sc = NULL;
    rc = sched_create(&sp, model, &sc);
    if (rc) {
        fprintf(stderr, "kvserve generate: setup failed: %s\n", status_str(rc));
        free(tokens);
        engine_model_destroy(model);
        return 1;
    }
    sched_request_params rp = {
        .prompt = tokens,
        .n_prompt = (uint32_t)n_prompt,
        .max_tokens = (uint32_t)o.max_tokens,
        .n = 1,
        .sampling = o.sp,
        .ignore_eos = o.ignore_eos,
        .n_top_logprobs = 0, /* so each event carries its tokens: ids, counts */
    };
    gen_run run = {0};
    double t0 = time_now_s();
    if (o.no_cache)
        run_no_cache(sc, &rp, vocab, (size_t)o.max_tokens, o.ids, &run);
    else
        run_cached(sc, vocab, &rp, o.ids, &run);
    printf("\n");
    if (run.status) {
        fprintf(stderr, "kvserve generate: generation failed: %s\n", status_str(run.status));
    } else {
        double t1 = time_now_s();
        double decode_s = t1 - run.t_first;
        fprintf(stderr,
                "kvserve generate: prompt %zu tokens, generated %u tokens; prefill %.1f ms, "
                "decode %.2f tok/s (%s)\n",
                n_prompt, run.n_gen, run.n_gen ? (run.t_first - t0) * 1e3 : 0.0,
                run.n_gen > 1 && decode_s > 0 ? (run.n_gen - 1) / decode_s : 0.0,
                o.no_cache ? "no cache: full recompute per token" : "paged KV cache");
    }
    sched_destroy(sc);
    free(tokens);
    engine_model_destroy(model);
    return run.status ? 1 : 0;
}
