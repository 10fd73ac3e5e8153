/* Model support: GGUFs in each layout a llama.cpp conversion produces (llama untied/tied,
 * F32/F16/Q8_0 weights, llama-quantize's Q4_0 .. Q6_K and IQ4 files when ../shared/peer has it,
 * qwen2 with Q/K/V biases and NEOX RoPE, Llama 3 rope base and rope_freqs, linear rope scaling) are
 * written by the real kvs-mkmodel (path in argv[1]) into a temp dir, loaded with engine_model_load,
 * and engine_forward's logits (a prefill, then cached decode steps through a scattered block table)
 * are compared with a deliberately naive reference forward written here: plain loops, F32 weights
 * dequantized by this file, the whole sequence recomputed, its own RoPE per type. Files the engine
 * cannot run must be refused with a message naming the problem. */
/* cmocka needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "engine/model.h"

#define TOL 1e-3 /* max |engine - reference| / max |reference| over a logits row */

static const char *tool;
static const char *quantize; /* llama-quantize, or NULL: the quantized cases skip */
static char dir[] = "/tmp/kvs-models-test-XXXXXX";

/* ------------------------------------------------------------ running kvs-mkmodel */

/* Runs kvs-mkmodel --shape tiny --weight-std 0.15 -o dir/name plus args (NULL-terminated).
 * The larger std gives sharp attention, so that a wrong rotation or a lost bias moves the
 * logits far beyond TOL (checked by test_reference_is_sensitive). */
static void make_shape(char *path, size_t cap, const char *shape, const char *name,
                       const char *const *args)
{
    snprintf(path, cap, "%s/%s", dir, name);
    const char *argv[40] = {tool, "--shape", shape, "--weight-std", "0.15", "-o", path};
    size_t n = 7;
    for (size_t i = 0; args && args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 2);
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void make(char *path, size_t cap, const char *name, const char *const *args)
{
    make_shape(path, cap, "tiny", name, args);
}

/* llama-quantize [--allow-requantize] src dst ftype 2; its output goes to /dev/null. */
static void run_quantize(const char *src, const char *dst, const char *ftype, bool requant)
{
    const char *argv[8] = {quantize};
    size_t n = 1;
    if (requant)
        argv[n++] = "--allow-requantize";
    argv[n++] = src;
    argv[n++] = dst;
    argv[n++] = ftype;
    argv[n++] = "2";
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(quantize, (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        fail_msg("llama-quantize %s %s %s failed", src, dst, ftype);
}

/* ------------------------------------------------------------ the reference model */

typedef struct ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *ffn_norm, *gate, *up, *down;
} ref_layer;

typedef struct ref_model {
    bool neox;
    uint32_t dim, n_layer, n_head, n_kv, ffn, vocab, hd, n_rot;
    float eps, base, scale;
    float *freqs; /* (n_rot / 2) or NULL */
    float *embd, *out_norm, *out;
    ref_layer *L;
} ref_model;

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15), e = (h >> 10) & 31u, f = h & 1023u;
    float v;
    if (e == 0)
        v = ldexpf((float)f, -24);
    else if (e == 31)
        v = f ? NAN : INFINITY;
    else
        v = ldexpf((float)(f | 1024u), (int)e - 25);
    return sign ? -v : v;
}

/* Tensor name as F32 (NULL if absent), dequantized here from F32, F16 or Q8_0, and from the
 * block-quantized types by engine/dtype's to_f32 (held to gguf-py by the dequant suite). */
static float *ref_tensor(const gguf_file *f, const char *name)
{
    int64_t i = gguf_find_tensor(f, name);
    if (i < 0)
        return NULL;
    const gguf_tensor *t = gguf_tensor_at(f, i);
    float *d = malloc(t->n_elements * sizeof *d);
    assert_non_null(d);
    const uint8_t *p = t->data;
    const dtype_info *dt = dtype_get(t->type);
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_Q8_0 && dt &&
        dt->to_f32) {
        dt->to_f32(t->data, d, t->n_elements);
        return d;
    }
    for (uint64_t k = 0; k < t->n_elements; k++) {
        uint16_t h;
        switch (t->type) {
        case GGML_TYPE_F32: memcpy(&d[k], p + 4 * k, 4); break;
        case GGML_TYPE_F16:
            memcpy(&h, p + 2 * k, 2);
            d[k] = half_to_float(h);
            break;
        case GGML_TYPE_Q8_0: {
            const uint8_t *blk = p + (k / 32) * 34;
            memcpy(&h, blk, 2);
            d[k] = half_to_float(h) * (float)(int8_t)blk[2 + k % 32];
            break;
        }
        default: fail_msg("reference: %s has type %u", name, t->type);
        }
    }
    return d;
}

static uint32_t ref_u32(const gguf_file *f, const char *arch, const char *suffix)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = 0;
    assert_int_equal(gguf_get_u32(f, key, &v), 0);
    return v;
}

static float ref_f32(const gguf_file *f, const char *arch, const char *suffix, float dflt)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    float v = dflt;
    gguf_get_f32(f, key, &v);
    return v;
}

static void ref_load(ref_model *r, const char *path)
{
    gguf_file *f = NULL;
    char err[256] = "";
    if (gguf_open(path, &f, err, sizeof err))
        fail_msg("%s: %s", path, err);
    const char *a;
    size_t alen;
    assert_int_equal(gguf_get_str(f, "general.architecture", &a, &alen), 0);
    char arch[16];
    snprintf(arch, sizeof arch, "%.*s", (int)alen, a);
    memset(r, 0, sizeof *r);
    r->neox = !strcmp(arch, "qwen2");
    r->dim = ref_u32(f, arch, "embedding_length");
    r->n_layer = ref_u32(f, arch, "block_count");
    r->n_head = ref_u32(f, arch, "attention.head_count");
    r->n_kv = ref_u32(f, arch, "attention.head_count_kv");
    r->ffn = ref_u32(f, arch, "feed_forward_length");
    r->vocab = ref_u32(f, arch, "vocab_size");
    r->hd = r->dim / r->n_head;
    r->n_rot = ref_u32(f, arch, "rope.dimension_count");
    r->eps = ref_f32(f, arch, "attention.layer_norm_rms_epsilon", 1e-5f);
    r->base = ref_f32(f, arch, "rope.freq_base", 10000.0f);
    r->scale = 1.0f / ref_f32(f, arch, "rope.scaling.factor", 1.0f);
    r->freqs = ref_tensor(f, "rope_freqs.weight");
    r->embd = ref_tensor(f, "token_embd.weight");
    r->out_norm = ref_tensor(f, "output_norm.weight");
    r->out = ref_tensor(f, "output.weight");
    if (!r->out)
        r->out = ref_tensor(f, "token_embd.weight");
    r->L = calloc(r->n_layer, sizeof *r->L);
    assert_non_null(r->L);
    for (uint32_t l = 0; l < r->n_layer; l++) {
        static const char *const names[] = {
            "attn_norm.weight",   "attn_q.weight",   "attn_k.weight", "attn_v.weight",
            "attn_output.weight", "attn_q.bias",     "attn_k.bias",   "attn_v.bias",
            "ffn_norm.weight",    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
        float **dst[] = {&r->L[l].attn_norm, &r->L[l].wq,   &r->L[l].wk, &r->L[l].wv,
                         &r->L[l].wo,        &r->L[l].bq,   &r->L[l].bk, &r->L[l].bv,
                         &r->L[l].ffn_norm,  &r->L[l].gate, &r->L[l].up, &r->L[l].down};
        for (size_t k = 0; k < 12; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s", l, names[k]);
            *dst[k] = ref_tensor(f, name);
            if (k < 5 || k > 7)
                assert_non_null(*dst[k]);
        }
    }
    gguf_close(f);
}

static void ref_free(ref_model *r)
{
    for (uint32_t l = 0; l < r->n_layer; l++) {
        float **p = &r->L[l].attn_norm;
        for (size_t k = 0; k < sizeof(ref_layer) / sizeof(float *); k++)
            free(p[k]);
    }
    free(r->L);
    if (r->out != r->embd)
        free(r->out);
    free(r->embd);
    free(r->out_norm);
    free(r->freqs);
}

/* y (n_out) = W (n_out rows of n_in) x */
static void ref_matvec(float *y, const float *W, const float *x, uint32_t n_out, uint32_t n_in)
{
    for (uint32_t o = 0; o < n_out; o++) {
        double s = 0;
        for (uint32_t i = 0; i < n_in; i++)
            s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = (float)s;
    }
}

static void ref_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * inv * w[i];
}

/* Rotates one head in place: pair j is (2j, 2j+1) for llama, (j, j + n_rot/2) for NEOX, by
 * angle pos * scale * base^(-2j/n_rot) / freqs[j]. */
static void ref_rope(const ref_model *r, bool neox, bool use_freqs, float *v, int pos)
{
    uint32_t half = r->n_rot / 2;
    for (uint32_t j = 0; j < half; j++) {
        double th = pos * (double)r->scale * pow(r->base, -2.0 * j / r->n_rot);
        if (use_freqs && r->freqs)
            th /= r->freqs[j];
        uint32_t a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = (float)(x0 * cos(th) - x1 * sin(th));
        v[b] = (float)(x0 * sin(th) + x1 * cos(th));
    }
}

typedef struct ref_opts {
    bool wrong_rope; /* the other pairing: to show the comparison can fail */
    bool no_bias;    /* drop the biases */
    bool no_freqs;   /* ignore rope_freqs */
} ref_opts;

/* logits (n, vocab) of every position of tok[0..n), recomputing the whole sequence. */
static void ref_forward(const ref_model *r, const ref_opts *o, const int32_t *tok, int n,
                        float *logits)
{
    uint32_t D = r->dim, KV = r->n_kv * r->hd, F = r->ffn;
    float *x = calloc((size_t)n * D, sizeof(float)), *xn = malloc(D * sizeof(float));
    float *q = malloc((size_t)n * D * sizeof(float)), *k = malloc((size_t)n * KV * sizeof(float));
    float *v = malloc((size_t)n * KV * sizeof(float)), *att = malloc(D * sizeof(float));
    float *tmp = malloc(D * sizeof(float)), *g = malloc(F * sizeof(float));
    float *u = malloc(F * sizeof(float)), *sc = malloc((size_t)n * sizeof(float));
    assert_true(x && xn && q && k && v && att && tmp && g && u && sc);
    bool neox = o->wrong_rope ? !r->neox : r->neox;
    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * D, r->embd + (size_t)tok[t] * D, D * sizeof(float));
    for (uint32_t l = 0; l < r->n_layer; l++) {
        const ref_layer *L = &r->L[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xn, x + (size_t)t * D, L->attn_norm, D, r->eps);
            float *qt = q + (size_t)t * D, *kt = k + (size_t)t * KV, *vt = v + (size_t)t * KV;
            ref_matvec(qt, L->wq, xn, D, D);
            ref_matvec(kt, L->wk, xn, KV, D);
            ref_matvec(vt, L->wv, xn, KV, D);
            for (uint32_t i = 0; !o->no_bias && L->bq && i < D; i++)
                qt[i] += L->bq[i];
            for (uint32_t i = 0; !o->no_bias && L->bk && i < KV; i++)
                kt[i] += L->bk[i];
            for (uint32_t i = 0; !o->no_bias && L->bv && i < KV; i++)
                vt[i] += L->bv[i];
            for (uint32_t h = 0; h < r->n_head; h++)
                ref_rope(r, neox, !o->no_freqs, qt + h * r->hd, t);
            for (uint32_t h = 0; h < r->n_kv; h++)
                ref_rope(r, neox, !o->no_freqs, kt + h * r->hd, t);
        }
        for (int t = 0; t < n; t++) {
            for (uint32_t h = 0; h < r->n_head; h++) {
                uint32_t kh = h / (r->n_head / r->n_kv);
                double mx = -1e30, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double s = 0;
                    for (uint32_t i = 0; i < r->hd; i++)
                        s += (double)q[(size_t)t * D + h * r->hd + i] *
                             k[(size_t)p * KV + kh * r->hd + i];
                    sc[p] = (float)(s / sqrt((double)r->hd));
                    if (sc[p] > mx)
                        mx = sc[p];
                }
                for (int p = 0; p <= t; p++)
                    sum += exp(sc[p] - mx);
                for (uint32_t i = 0; i < r->hd; i++) {
                    double s = 0;
                    for (int p = 0; p <= t; p++)
                        s += exp(sc[p] - mx) / sum * v[(size_t)p * KV + kh * r->hd + i];
                    att[h * r->hd + i] = (float)s;
                }
            }
            ref_matvec(tmp, L->wo, att, D, D);
            for (uint32_t i = 0; i < D; i++)
                x[(size_t)t * D + i] += tmp[i];
        }
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xn, x + (size_t)t * D, L->ffn_norm, D, r->eps);
            ref_matvec(g, L->gate, xn, F, D);
            ref_matvec(u, L->up, xn, F, D);
            for (uint32_t i = 0; i < F; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            ref_matvec(tmp, L->down, g, D, F);
            for (uint32_t i = 0; i < D; i++)
                x[(size_t)t * D + i] += tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(xn, x + (size_t)t * D, r->out_norm, D, r->eps);
        ref_matvec(logits + (size_t)t * r->vocab, r->out, xn, r->vocab, D);
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(tmp), free(g), free(u), free(sc);
}

/* max |a - b| / max |b| over one row */
static double rel_err(const float *a, const float *b, uint32_t n)
{
    double d = 0, m = 0;
    for (uint32_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / (m > 0 ? m : 1);
}

/* ------------------------------------------------------------ engine vs reference */

#define N_PROMPT 6
#define N_DECODE 6
#define N_TOTAL (N_PROMPT + N_DECODE)

static const int32_t TOKENS[N_TOTAL] = {1, 300, 77, 412, 5, 260, 301, 499, 42, 388, 270, 3};

/* Loads path with the engine on kernel table kernels and checks its logits against the
 * reference: one prefill of N_PROMPT rows (all logits), then N_DECODE single-token steps reading
 * the cache through a block table of scattered physical blocks (block size 4); the last step
 * must also equal a one-batch recomputation exactly. The recomputed logits go to full_out
 * (n_vocab floats). */
static void check_model_on(const char *path, const char *arch, const char *wtype,
                           const char *kernels, float *full_out)
{
    engine_model *m = NULL;
    char err[256] = "";
    engine_load_params lp = {.verbose = false, .kernels = kernels};
    if (engine_model_load(path, &lp, &m, err, sizeof err))
        fail_msg("%s: %s", path, err);
    const engine_hparams *hp = engine_model_hparams(m);
    assert_string_equal(hp->arch, arch);
    assert_string_equal(engine_model_weight_type(m), wtype);

    ref_model r;
    ref_load(&r, path);
    assert_int_equal(hp->n_vocab, r.vocab);
    uint32_t V = r.vocab;
    float *want = malloc((size_t)N_TOTAL * V * sizeof(float));
    float *got = malloc((size_t)N_PROMPT * V * sizeof(float));
    assert_true(want && got);
    ref_opts ro = {0};
    ref_forward(&r, &ro, TOKENS, N_TOTAL, want);

    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    assert_int_equal(engine_ctx_create(m, 16, 2, &c), 0);
    assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, 8, 4, &kv), 0);
    int32_t blocks[] = {5, 2, 7, 0};
    engine_seq_view view = {blocks, 4};
    int32_t pos[N_PROMPT], seq[N_PROMPT] = {0};
    bool wl[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        pos[i] = i;
        wl[i] = true;
    }
    engine_batch b = {N_PROMPT, TOKENS, pos, seq, wl, 1, &view};
    assert_int_equal(engine_forward(c, kv, &b, got), 0);
    for (int t = 0; t < N_PROMPT; t++) {
        double e = rel_err(got + (size_t)t * V, want + (size_t)t * V, V);
        if (e > TOL)
            fail_msg("%s prefill row %d: relative error %g", path, t, e);
    }
    for (int t = N_PROMPT; t < N_TOTAL; t++) {
        int32_t p1 = t, s1 = 0;
        bool w1 = true;
        engine_batch d = {1, &TOKENS[t], &p1, &s1, &w1, 1, &view};
        assert_int_equal(engine_forward(c, kv, &d, got), 0);
        double e = rel_err(got, want + (size_t)t * V, V);
        if (e > TOL)
            fail_msg("%s decode position %d: relative error %g", path, t, e);
    }
    /* The last cached decode step equals a recomputation of the whole sequence in one batch,
     * bit for bit, whatever the weight type (panel products are batch-invariant). */
    engine_kv *kv2 = NULL;
    assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, 8, 4, &kv2), 0);
    int32_t posf[N_TOTAL], seqf[N_TOTAL] = {0};
    bool wf[N_TOTAL];
    for (int i = 0; i < N_TOTAL; i++) {
        posf[i] = i;
        wf[i] = i == N_TOTAL - 1;
    }
    float *full = malloc((size_t)V * sizeof(float));
    engine_batch f = {N_TOTAL, TOKENS, posf, seqf, wf, 1, &view};
    assert_int_equal(engine_forward(c, kv2, &f, full), 0);
    if (memcmp(full, got, (size_t)V * sizeof(float)))
        fail_msg("%s (%s kernels): cached decode and full recomputation differ", path, kernels);
    memcpy(full_out, full, (size_t)V * sizeof(float));
    free(full);
    engine_kv_destroy(kv2);
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
    free(want);
    free(got);
    ref_free(&r);
}

/* check_model_on every kernel table this CPU runs; their logits are equal bit for bit (every
 * table computes the reference's bits, kern/ref.c). */
static void check_model(const char *path, const char *arch, const char *wtype)
{
    static const char *const tables[] = {"generic", "avx2"};
    float *first = NULL, *full = NULL;
    size_t V = 0;
    const char *first_name = NULL;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char err[256];
        if (engine_kernels_check(tables[i], err, sizeof err))
            continue; /* this CPU (or build) lacks it */
        if (!first) {
            ref_model r;
            ref_load(&r, path);
            V = r.vocab;
            ref_free(&r);
            first = malloc(V * sizeof(float));
            full = malloc(V * sizeof(float));
        }
        check_model_on(path, arch, wtype, tables[i], first_name ? full : first);
        if (!first_name)
            first_name = tables[i];
        else if (memcmp(first, full, V * sizeof(float)))
            fail_msg("%s: %s and %s kernels give different logits", path, first_name, tables[i]);
    }
    assert_non_null(first_name);
    free(first);
    free(full);
}

static void test_llama_f32(void **st)
{
    (void)st;
    char p[512];
    make(p, sizeof p, "llama-f32.gguf", NULL);
    check_model(p, "llama", "F32");
}

static void test_llama_f16_tied(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--type", "f16", "--tied", NULL};
    make(p, sizeof p, "llama-f16-tied.gguf", a);
    check_model(p, "llama", "F16");
}

static void test_llama_q8_0(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--type", "q8_0", NULL};
    make(p, sizeof p, "llama-q8.gguf", a);
    check_model(p, "llama", "Q8_0");
}

static void test_llama3_rope_freqs(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--rope-base", "500000", "--rope-freqs", "--type", "f16", NULL};
    make(p, sizeof p, "llama3-freqs.gguf", a);
    check_model(p, "llama", "F16");
}

static void test_qwen2_f32(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--arch", "qwen2", "--rope-base", "1000000", NULL};
    make(p, sizeof p, "qwen2-f32.gguf", a);
    check_model(p, "qwen2", "F32");
}

static void test_qwen2_q8_0_tied(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--arch", "qwen2", "--type", "q8_0", "--tied", NULL};
    make(p, sizeof p, "qwen2-q8-tied.gguf", a);
    check_model(p, "qwen2", "Q8_0");
}

/* The comparison has teeth: the wrong RoPE pairing, a dropped bias or ignored rope_freqs move
 * the reference's logits far beyond TOL, so an engine making that mistake fails above. */
static void test_reference_is_sensitive(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--arch", "qwen2", "--rope-freqs", NULL};
    make(p, sizeof p, "qwen2-sens.gguf", a);
    ref_model r;
    ref_load(&r, p);
    uint32_t V = r.vocab;
    float *base = malloc((size_t)N_TOTAL * V * sizeof(float));
    float *alt = malloc((size_t)N_TOTAL * V * sizeof(float));
    assert_true(base && alt);
    ref_opts o0 = {0};
    ref_forward(&r, &o0, TOKENS, N_TOTAL, base);
    ref_opts variants[] = {{.wrong_rope = true}, {.no_bias = true}, {.no_freqs = true}};
    for (size_t i = 0; i < 3; i++) {
        ref_forward(&r, &variants[i], TOKENS, N_TOTAL, alt);
        double e = rel_err(alt + (size_t)(N_TOTAL - 1) * V, base + (size_t)(N_TOTAL - 1) * V, V);
        if (e < 20 * TOL)
            fail_msg("variant %zu changes the last logits by only %g", i, e);
    }
    free(base);
    free(alt);
    ref_free(&r);
}

/* ------------------------------------------------------------ llama-quantize's files */

/* The last row's logits of TOKENS on path, one batch, on kernel table kernels. */
static void last_logits(const char *path, const char *kernels, float *out)
{
    engine_model *m = NULL;
    char err[256] = "";
    engine_load_params lp = {.verbose = false, .kernels = kernels};
    if (engine_model_load(path, &lp, &m, err, sizeof err))
        fail_msg("%s: %s", path, err);
    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    assert_int_equal(engine_ctx_create(m, 16, 2, &c), 0);
    assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, 8, 4, &kv), 0);
    int32_t blocks[] = {5, 2, 7, 0};
    engine_seq_view view = {blocks, 4};
    int32_t pos[N_TOTAL], seq[N_TOTAL] = {0};
    bool wl[N_TOTAL];
    for (int i = 0; i < N_TOTAL; i++) {
        pos[i] = i;
        wl[i] = i == N_TOTAL - 1;
    }
    engine_batch b = {N_TOTAL, TOKENS, pos, seq, wl, 1, &view};
    assert_int_equal(engine_forward(c, kv, &b, out), 0);
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
}

/* A kquant-shape model (every row whole 256-value blocks) quantized by llama-quantize to ftype,
 * whose first matrix is of type wtype (mixtures as llama-quantize writes them: output.weight in
 * Q6_K, some attn_v / ffn_down one step up): it loads, its logits are near the naive reference
 * and cached = recomputed bit for bit on every table (check_model); and they equal bit for bit
 * the engine's on the same file requantized to F32 by llama.cpp (llama-quantize
 * --allow-requantize ... F32: llama.cpp's own dequantizer), because the panels multiply
 * exactly those F32 values in the same order. */
static void check_quantized(const char *ftype, const char *wtype)
{
    if (!quantize) {
        fprintf(stderr, "models: no llama-quantize in ../shared/peer: %s skipped\n", ftype);
        skip();
    }
    char base[512], q[512], f32[512];
    make_shape(base, sizeof base, "kquant", "kquant-f16.gguf",
               (const char *const[]){"--type", "f16", NULL});
    snprintf(q, sizeof q, "%s/kquant-%s.gguf", dir, ftype);
    snprintf(f32, sizeof f32, "%s/kquant-%s-f32.gguf", dir, ftype);
    run_quantize(base, q, ftype, false);
    run_quantize(q, f32, "F32", true);
    check_model(q, "llama", wtype);
    ref_model r;
    ref_load(&r, q);
    size_t V = r.vocab;
    ref_free(&r);
    float *a = malloc(V * sizeof(float)), *b = malloc(V * sizeof(float));
    assert_true(a && b);
    last_logits(q, NULL, a);
    last_logits(f32, NULL, b);
    if (memcmp(a, b, V * sizeof(float)))
        fail_msg("%s: logits differ from the F32-requantized file's", ftype);
    free(a);
    free(b);
}

static void test_q4_0(void **st)
{
    (void)st;
    check_quantized("Q4_0", "Q4_0");
}
static void test_q4_1(void **st)
{
    (void)st;
    check_quantized("Q4_1", "Q4_1");
}
static void test_q5_0(void **st)
{
    (void)st;
    check_quantized("Q5_0", "Q5_0");
}
static void test_q5_1(void **st)
{
    (void)st;
    check_quantized("Q5_1", "Q5_1");
}
static void test_q8_0_peer(void **st)
{
    (void)st;
    check_quantized("Q8_0", "Q8_0");
}
static void test_q2_k(void **st)
{
    (void)st;
    check_quantized("Q2_K", "Q2_K");
}
static void test_q3_k_m(void **st)
{
    (void)st;
    check_quantized("Q3_K_M", "Q3_K");
}
static void test_q4_k_m(void **st)
{
    (void)st;
    check_quantized("Q4_K_M", "Q4_K");
}
static void test_q5_k_m(void **st)
{
    (void)st;
    check_quantized("Q5_K_M", "Q5_K");
}
static void test_q6_k(void **st)
{
    (void)st;
    check_quantized("Q6_K", "Q6_K");
}
static void test_iq4_nl(void **st)
{
    (void)st;
    check_quantized("IQ4_NL", "IQ4_NL");
}
static void test_iq4_xs(void **st)
{
    (void)st;
    check_quantized("IQ4_XS", "IQ4_XS");
}

/* ------------------------------------------------------------ refusals */

typedef struct edit {
    const char *arch;              /* new general.architecture */
    const char *str_key, *str_val; /* set (or replace) a string key */
    const char *u32_key;           /* set (or replace) a u32 key */
    uint32_t u32_val;
    const char *f32_key; /* set (or replace) a float key */
    float f32_val;
    const char *drop;    /* tensor to leave out */
    const char *foreign; /* tensor stored as MXFP4 (a type kvserve has no kernels for) */
    const char *reshape; /* tensor whose dims[1] gains one row */
} edit;

/* Copies src to dst through the real writer with one edit applied. */
static void rewrite(const char *src, const char *dst, const edit *e)
{
    gguf_file *f = NULL;
    char err[256] = "";
    if (gguf_open(src, &f, err, sizeof err))
        fail_msg("%s: %s", src, err);
    gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(&w), 0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        size_t len;
        const char *k = gguf_key_name(f, i, &len);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)len, k);
        if ((e->arch && !strcmp(key, "general.architecture")) ||
            (e->str_key && !strcmp(key, e->str_key)) || (e->u32_key && !strcmp(key, e->u32_key)) ||
            (e->f32_key && !strcmp(key, e->f32_key)))
            continue;
        assert_int_equal(gguf_writer_copy_kv(w, f, i), 0);
    }
    if (e->arch)
        assert_int_equal(gguf_writer_add_str(w, "general.architecture", e->arch), 0);
    if (e->str_key)
        assert_int_equal(gguf_writer_add_str(w, e->str_key, e->str_val), 0);
    if (e->u32_key)
        assert_int_equal(gguf_writer_add_u32(w, e->u32_key, e->u32_val), 0);
    if (e->f32_key)
        assert_int_equal(gguf_writer_add_f32(w, e->f32_key, e->f32_val), 0);
    void *scratch = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name_len, t->name);
        if (e->drop && !strcmp(name, e->drop))
            continue;
        uint64_t dims[GGUF_MAX_DIMS];
        memcpy(dims, t->dims, sizeof dims);
        uint32_t type = t->type;
        const void *data = t->data;
        if ((e->foreign && !strcmp(name, e->foreign)) ||
            (e->reshape && !strcmp(name, e->reshape))) {
            bool foreign = e->foreign && !strcmp(name, e->foreign);
            if (!foreign)
                dims[1]++;
            type = foreign ? 39 /* MXFP4 */ : t->type;
            uint64_t n = dims[0] * dims[1] * dims[2] * dims[3];
            free(scratch);
            scratch = calloc(1, ggml_type_nbytes(type, n));
            assert_non_null(scratch);
            data = scratch;
        }
        assert_int_equal(gguf_writer_add_tensor(w, name, t->n_dims, dims, type, data), 0);
    }
    if (gguf_writer_write(w, dst, err, sizeof err))
        fail_msg("%s: %s", dst, err);
    free(scratch);
    gguf_writer_destroy(w);
    gguf_close(f);
}

/* Loading dst must fail with status and a message containing each of the words. */
static void expect_refusal(const edit *e, int status, const char *w1, const char *w2)
{
    static int n;
    char src[512], dst[512];
    make(src, sizeof src, "refusal-src.gguf", NULL);
    snprintf(dst, sizeof dst, "%s/refused-%d.gguf", dir, n++);
    rewrite(src, dst, e);
    engine_model *m = NULL;
    char err[256] = "";
    int rc = engine_model_load(dst, NULL, &m, err, sizeof err);
    assert_null(m);
    if (rc != status || !strstr(err, w1) || (w2 && !strstr(err, w2)))
        fail_msg("got %d (%s) '%s', wanted %d naming '%s' '%s'", rc, status_str(rc), err, status,
                 w1, w2 ? w2 : "");
}

static void test_refuse_architecture(void **st)
{
    (void)st;
    edit e = {.arch = "gemma"};
    expect_refusal(&e, KVS_EUNSUPPORTED, "architecture 'gemma' is not supported",
                   "supported: llama, qwen2");
    edit e2 = {.arch = "phi3"};
    expect_refusal(&e2, KVS_EUNSUPPORTED, "'phi3'", NULL);
}

static void test_refuse_tensor_type(void **st)
{
    (void)st;
    edit e = {.foreign = "blk.1.ffn_up.weight"};
    expect_refusal(&e, KVS_EUNSUPPORTED, "tensor blk.1.ffn_up.weight has type MXFP4",
                   "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                   "Q5_K, Q6_K, IQ4_NL, IQ4_XS");
}

static void test_refuse_missing_tensor(void **st)
{
    (void)st;
    edit e = {.drop = "blk.1.attn_k.weight"};
    expect_refusal(&e, KVS_EFORMAT, "missing tensor blk.1.attn_k.weight", NULL);
}

static void test_refuse_wrong_shape(void **st)
{
    (void)st;
    edit e = {.reshape = "blk.0.attn_v.weight"};
    expect_refusal(&e, KVS_EFORMAT, "blk.0.attn_v.weight", "expected [64, 32]");
}

static void test_refuse_metadata(void **st)
{
    (void)st;
    edit yarn = {.str_key = "llama.rope.scaling.type", .str_val = "yarn"};
    expect_refusal(&yarn, KVS_EUNSUPPORTED, "rope scaling type 'yarn'", NULL);
    edit kl = {.u32_key = "llama.attention.key_length", .u32_val = 32};
    expect_refusal(&kl, KVS_EUNSUPPORTED, "llama.attention.key_length = 32", NULL);
    edit moe = {.u32_key = "llama.expert_count", .u32_val = 8};
    expect_refusal(&moe, KVS_EUNSUPPORTED, "mixture of experts (llama.expert_count = 8)", NULL);
    edit vs = {.u32_key = "llama.vocab_size", .u32_val = 600};
    expect_refusal(&vs, KVS_EFORMAT, "llama.vocab_size = 600", "512 tokens");
}

/* Linear rope scaling (rope.scaling.factor 4) is run, not refused: positions are divided. */
static void test_linear_rope_scaling(void **st)
{
    (void)st;
    char src[512], dst[512];
    make(src, sizeof src, "scaled-src.gguf", NULL);
    snprintf(dst, sizeof dst, "%s/scaled.gguf", dir);
    edit e = {.str_key = "llama.rope.scaling.type",
              .str_val = "linear",
              .f32_key = "llama.rope.scaling.factor",
              .f32_val = 4.0f};
    rewrite(src, dst, &e);
    check_model(dst, "llama", "F32");
}

static int setup(void **st)
{
    (void)st;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **st)
{
    (void)st;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_models PATH/TO/kvs-mkmodel [PATH/TO/llama-quantize]\n");
        return 1;
    }
    tool = argv[1];
    if (argc > 2 && access(argv[2], X_OK) == 0)
        quantize = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32),
        cmocka_unit_test(test_llama_f16_tied),
        cmocka_unit_test(test_llama_q8_0),
        cmocka_unit_test(test_llama3_rope_freqs),
        cmocka_unit_test(test_qwen2_f32),
        cmocka_unit_test(test_qwen2_q8_0_tied),
        cmocka_unit_test(test_reference_is_sensitive),
        cmocka_unit_test(test_linear_rope_scaling),
        cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_q4_1),
        cmocka_unit_test(test_q5_0),
        cmocka_unit_test(test_q5_1),
        cmocka_unit_test(test_q8_0_peer),
        cmocka_unit_test(test_q2_k),
        cmocka_unit_test(test_q3_k_m),
        cmocka_unit_test(test_q4_k_m),
        cmocka_unit_test(test_q5_k_m),
        cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_iq4_nl),
        cmocka_unit_test(test_iq4_xs),
        cmocka_unit_test(test_refuse_architecture),
        cmocka_unit_test(test_refuse_tensor_type),
        cmocka_unit_test(test_refuse_missing_tensor),
        cmocka_unit_test(test_refuse_wrong_shape),
        cmocka_unit_test(test_refuse_metadata),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
