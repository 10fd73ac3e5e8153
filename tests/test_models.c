/* Model support: GGUFs in each layout a llama.cpp conversion produces (llama untied/tied,
 * F32/F16/Q8_0 weights, llama-quantize's Q4_0 .. Q6_K and IQ4 files when ../shared/peer has it,
 * qwen2 with Q/K/V biases and NEOX RoPE, Llama 3 rope base and rope_freqs, linear rope scaling;
 * qwen3 with Q/K norms and its own head size; gemma2 with post norms, GELU, soft-capping and
 * sliding windows; gemma3 with Q/K norms, the 5:1 window pattern and two RoPE bases; phi3 with
 * fused QKV and gate/up; the mixtures of experts of qwen3moe and Mixtral; gpt-oss; smollm3 with its
 * unrotated every-fourth layers) are written by the real
 * kvs-mkmodel (path in argv[1]) into a temp dir, loaded with engine_model_load, and
 * engine_forward's logits (a prefill, then cached decode steps through a scattered block table) are
 * compared with a deliberately naive reference forward written here: plain loops, F32 weights
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
/* The same with --activations q8: each row of activations rounded to int8 blocks (an error of up
 * to 1/254 of a block's largest value per input), compounded over the layers of these random
 * models; measured up to 0.075 (Q8_0), 0.079 (Q4_0), 0.074 (Q4_1), 0.067 (Q5_0), 0.081 (Q5_1),
 * 0.085 (Q4_K_M), 0.10 (Q3_K_M, Q5_K_M, Q6_K), 0.11 (Q2_K), 0.04 (IQ4_NL), 0.13 (IQ4_XS),
 * against at most 1.1e-5 with f32. A wrong scale, sum or activation buffer moves logits by
 * O(1). */
#define TOL_Q8 0.15

static const char *tool;
static const char *quantize; /* llama-quantize, or NULL: the quantized cases skip */
static char dir[] = "/tmp/kvs-models-test-XXXXXX";

/* ------------------------------------------------------------ running kvs-mkmodel */

/* Runs kvs-mkmodel --shape shape --weight-std 0.15 -o dir/name plus args (NULL-terminated).
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

/* make_shape of the tiny shape. */
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

/* Every member a float * (ref_free frees them as an array). */
typedef struct ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *ffn_norm, *gate, *up, *down;
    float *q_norm, *k_norm, *post_attn, *post_ffn; /* NULL where the family has none */
    float *qkv, *gate_up;                          /* phi3's fused matrices (wq.. point in) */
    /* an MoE FFN (qwen3moe, Mixtral; gate, up, down NULL): router (n_expert rows of dim), then per
     * expert e the slice e of gate_exps, up_exps (ffn_exp rows of dim) and down_exps (dim rows of
     * ffn_exp) */
    float *router, *gate_exps, *up_exps, *down_exps;
    /* gpt-oss: the output projection's bias, each head's sink logit, the router's bias and the
     * experts' biases (slice e of each stack expert e's); NULL elsewhere */
    float *bo, *sinks, *router_b, *gate_exps_b, *up_exps_b, *down_exps_b;
    /* granitemoeshared, ernie4_5-moe: the shared expert (sh_ffn rows of dim; down: dim rows of
     * sh_ffn) */
    float *sh_gate, *sh_up, *sh_down;
    float *probs_b; /* ernie4_5-moe: (n_expert) added to the probabilities to pick experts */
    /* lfm2's convolution layers (NULL on its attention layers): in_proj (3 dim rows of dim: B, C,
     * x), the taps (dim rows of taps, oldest position first), out_proj (dim rows of dim) */
    float *conv_in, *conv, *conv_out;
    /* gemma3n: the per-layer input's gate (P rows of dim), projection (dim rows of P) and norm;
     * AltUp's correction coefficients (A rows of A), output scale, prediction coefficients (A * A
     * rows of A), router (A rows of dim) and its norm; LAuReL's two matrices (R rows of dim, dim
     * rows of R) and its norm */
    float *g_inp_gate, *g_proj, *g_post_norm, *g_correct, *g_correct_scale, *g_predict, *g_router,
        *g_router_norm, *g_laurel_l, *g_laurel_r, *g_laurel_norm;
} ref_layer;

typedef struct ref_model {
    bool neox, gelu;
    uint32_t dim, n_layer, n_head, n_kv, ffn, vocab, hd, n_rot;
    uint32_t n_expert, n_expert_used, ffn_exp; /* an MoE FFN; 0 for a dense one */
    bool topk_softmax; /* gpt-oss: the k highest router logits, a softmax over them; else the
                          softmax's k most probable, renormalized */
    bool oai_glu;      /* gpt-oss's clamped SwiGLU in the experts */
    bool sigmoid;      /* lfm2moe: each router logit's sigmoid in place of the softmax */
    float eps, base, scale;
    /* YaRN (rope.scaling.type yarn): original context, ramp corners; yarn_orig 0: none */
    uint32_t yarn_orig;
    float beta_fast, beta_slow;
    float embd_scale, attn_cap, final_cap; /* caps: 0 = none */
    double attn_scale;
    /* granite: each sublayer's output times res_scale before its residual add (0: none), the
     * logits times logit_mul (1 / logit_scale; else 1), and RoPE off when no_rope */
    float res_scale, logit_mul;
    bool no_rope;
    uint32_t sh_ffn; /* granitemoeshared's shared expert width; 0: none */
    /* ernie4_5-moe: layer l runs experts when l >= moe_lead and (l + 1) % moe_step == 0, else
     * the dense MLP (moe_step 0: every layer of an MoE file runs experts) */
    uint32_t moe_lead, moe_step;
    uint32_t n_swa, swa_pattern; /* 0 = no windowed layers */
    uint32_t taps;               /* lfm2: shortconv.l_cache */
    bool swa_all;                /* lfm2 with attention.sliding_window: every layer windowed */
    bool swa_plain;              /* olmo2: windowed layers rotate without YaRN or scaling */
    bool qk_norm_full;           /* olmo2: Q and K normed over their whole projections */
    float base_swa;              /* RoPE base of the windowed layers (gemma3), 0: base */
    uint32_t
        nope_step; /* smollm3: layer l rotates nothing when (l + 1) % nope_step == 0; 0: none */
    /* mistral3: roped queries times 1 + temp ln(1 + floor(pos / temp_len)); temp_len 0: none */
    double temp;
    uint32_t temp_len;
    float *freqs; /* (n_rot / 2) or NULL */
    /* gemma3n (g3n): per_layer_token_embd (vocab rows of n_layer * 256), per_layer_model_proj
     * (n_layer * 256 rows of dim), per_layer_proj_norm (256), altup_proj and altup_unembd_proj
     * (3 matrices of dim rows of dim each) */
    bool g3n;
    float *g_tok, *g_model_proj, *g_proj_norm, *g_altup_proj, *g_unembd;
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

/* ref_tensor of a tensor that must be there with dims d0, d1, d2 (ggml order; 0: no such dim). */
static float *ref_tensor_dims(const gguf_file *f, const char *name, uint64_t d0, uint64_t d1,
                              uint64_t d2)
{
    int64_t i = gguf_find_tensor(f, name);
    if (i < 0)
        fail_msg("reference: no tensor %s", name);
    const gguf_tensor *t = gguf_tensor_at(f, i);
    uint64_t want[3] = {d0, d1, d2};
    for (uint32_t d = 0; d < 3; d++)
        if ((d < t->n_dims ? t->dims[d] : 0) != want[d])
            fail_msg("reference: %s dim %u is %llu, not %llu", name, d,
                     (unsigned long long)(d < t->n_dims ? t->dims[d] : 0),
                     (unsigned long long)want[d]);
    return ref_tensor(f, name);
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
    bool gemma2 = !strcmp(arch, "gemma2"), gemma3 = !strcmp(arch, "gemma3");
    bool phi3 = !strcmp(arch, "phi3"), gpt_oss = !strcmp(arch, "gpt-oss");
    bool granite = !strncmp(arch, "granite", 7);
    char key[128];
    snprintf(key, sizeof key, "%s.expert_count", arch);
    bool moe = gguf_find_key(f, key) >= 0; /* qwen3moe, or llama with experts (Mixtral) */
    bool smollm3 = !strcmp(arch, "smollm3"), mistral3 = !strcmp(arch, "mistral3");
    bool ernie = !strncmp(arch, "ernie4_5", 8), ernie_moe = !strcmp(arch, "ernie4_5-moe");
    r->neox = strcmp(arch, "llama") != 0 && !smollm3 && !granite && !ernie && !mistral3;
    r->nope_step = smollm3 ? 4 : 0; /* llama.cpp's n_no_rope_layer_step: no key in the file */
    r->g3n = !strcmp(arch, "gemma3n");
    r->gelu = gemma2 || gemma3 || r->g3n;
    r->dim = ref_u32(f, arch, "embedding_length");
    r->n_layer = ref_u32(f, arch, "block_count");
    r->n_head = ref_u32(f, arch, "attention.head_count");
    bool lfm2 = !strncmp(arch, "lfm2", 4), lfm2moe = !strcmp(arch, "lfm2moe");
    if (lfm2) { /* one count per layer, 0 on the convolutions: the attention layers' count */
        enum gguf_type et;
        uint64_t cnt;
        const void *kvh;
        snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
        assert_int_equal(gguf_get_arr(f, key, &et, &cnt, &kvh), 0);
        assert_true(et == GGUF_TYPE_INT32 && cnt == r->n_layer);
        for (uint64_t i = 0; i < cnt; i++) {
            int32_t h;
            memcpy(&h, (const uint8_t *)kvh + 4 * i, 4);
            r->n_kv = h ? (uint32_t)h : r->n_kv;
        }
        r->taps = ref_u32(f, arch, "shortconv.l_cache");
        snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
        r->swa_all = !gguf_get_u32(f, key, &r->n_swa) && r->n_swa > 0;
    } else {
        r->n_kv = ref_u32(f, arch, "attention.head_count_kv");
    }
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    enum gguf_type ffn_t;
    uint64_t ffn_n;
    const void *ffn_a;
    if (!gguf_get_arr(f, key, &ffn_t, &ffn_n, &ffn_a)) { /* gemma3n: one per layer, all alike */
        assert_true(ffn_t == GGUF_TYPE_UINT32 && ffn_n == r->n_layer);
        memcpy(&r->ffn, ffn_a, 4);
    } else {
        r->ffn = ref_u32(f, arch, "feed_forward_length");
    }
    r->vocab = ref_u32(f, arch, "vocab_size");
    if (moe) {
        r->n_expert = ref_u32(f, arch, "expert_count");
        r->n_expert_used = ref_u32(f, arch, "expert_used_count");
        /* Mixtral's llama files have no such key: their experts are feed_forward_length wide */
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
        r->ffn_exp = r->ffn;
        gguf_get_u32(f, key, &r->ffn_exp);
        assert_true(r->n_expert_used >= 1 && r->n_expert_used <= r->n_expert);
    }
    if (lfm2moe) { /* llama.cpp's lfm2moe graph: dense layers first, then experts */
        r->moe_lead = ref_u32(f, arch, "leading_dense_block_count");
        r->moe_step = 1;
        r->sigmoid = ref_u32(f, arch, "expert_gating_func") == 2;
        assert_true(r->sigmoid);
    }
    if (ernie_moe) { /* llama.cpp's ernie4_5-moe graph: the placement from these two keys */
        r->moe_lead = ref_u32(f, arch, "leading_dense_block_count");
        r->moe_step = ref_u32(f, arch, "interleave_moe_layer_step");
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
        gguf_get_u32(f, key, &r->sh_ffn);
    }
    r->hd = r->dim / r->n_head;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    gguf_get_u32(f, key, &r->hd);
    r->embd_scale = r->gelu ? sqrtf((float)r->dim) : 1.0f;
    r->attn_scale = 1.0 / sqrt((double)r->hd);
    r->logit_mul = 1.0f;
    if (granite) { /* llama.cpp's granite graph: 0 or absent leaves each as llama's */
        float es = ref_f32(f, arch, "embedding_scale", 0.0f);
        float as = ref_f32(f, arch, "attention.scale", 0.0f);
        r->embd_scale = es != 0.0f ? es : 1.0f;
        r->attn_scale = as != 0.0f ? as : r->attn_scale;
        r->res_scale = ref_f32(f, arch, "residual_scale", 0.0f);
        r->logit_mul = 1.0f / ref_f32(f, arch, "logit_scale", 0.0f);
        int ft = 1;
        snprintf(key, sizeof key, "%s.rope.scaling.finetuned", arch);
        gguf_get_bool(f, key, &ft);
        r->no_rope = !ft;
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
        gguf_get_u32(f, key, &r->sh_ffn);
    }
    if (gemma2) {
        r->attn_cap = ref_f32(f, arch, "attn_logit_softcapping", 50.0f);
        r->final_cap = ref_f32(f, arch, "final_logit_softcapping", 30.0f);
        r->n_swa = 4096;
        snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
        gguf_get_u32(f, key, &r->n_swa);
        r->swa_pattern = 2;
    }
    if (gemma3) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
        gguf_get_u32(f, key, &r->n_swa);
        r->swa_pattern = r->n_swa ? 6 : 0;
        r->base_swa = 10000.0f;
    }
    bool olmo2 = !strcmp(arch, "olmo2");
    if (olmo2) { /* llama.cpp's olmo2 graph: windows (OLMo 3) on l % n < n - 1, plain RoPE */
        r->qk_norm_full = true;
        snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
        if (!gguf_get_u32(f, key, &r->n_swa) && r->n_swa > 0) {
            r->swa_pattern = 4;
            snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
            gguf_get_u32(f, key, &r->swa_pattern);
            r->swa_plain = true;
            r->base_swa = ref_f32(f, arch, "rope.freq_base_swa",
                                  ref_f32(f, arch, "rope.freq_base", 10000.0f));
        }
    }
    if (mistral3) { /* llama.cpp: the positions over n_ctx_orig_yarn (context_length's default) */
        r->temp = ref_f32(f, arch, "attention.temperature_scale", 0.0f);
        r->temp_len = ref_u32(f, arch, "context_length");
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        gguf_get_u32(f, key, &r->temp_len);
        r->temp_len = r->temp != 0.0 ? r->temp_len : 0;
    }
    if (r->g3n) { /* llama.cpp's gemma3n: four windowed layers then a global one, scores
                     unscaled, logits capped at 30 */
        r->n_swa = ref_u32(f, arch, "attention.sliding_window");
        r->swa_pattern = 5;
        r->base_swa = ref_f32(f, arch, "rope.freq_base_swa", 0.0f);
        r->final_cap = ref_f32(f, arch, "final_logit_softcapping", 30.0f);
    }
    if (gpt_oss) {
        r->n_swa = ref_u32(f, arch, "attention.sliding_window");
        r->swa_pattern = 2;
        r->topk_softmax = r->oai_glu = true;
    }
    const char *st;
    size_t st_len;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (!gguf_get_str(f, key, &st, &st_len) && st_len == 4 && !memcmp(st, "yarn", 4)) {
        r->yarn_orig = ref_u32(f, arch, "rope.scaling.original_context_length");
        r->beta_fast = ref_f32(f, arch, "rope.scaling.yarn_beta_fast", 32.0f);
        r->beta_slow = ref_f32(f, arch, "rope.scaling.yarn_beta_slow", 1.0f);
    }
    r->n_rot = ref_u32(f, arch, "rope.dimension_count");
    r->eps = ref_f32(f, arch, "attention.layer_norm_rms_epsilon", 1e-5f);
    r->base = ref_f32(f, arch, "rope.freq_base", 10000.0f);
    r->scale = 1.0f / ref_f32(f, arch, "rope.scaling.factor", 1.0f);
    r->freqs = ref_tensor(f, "rope_freqs.weight");
    r->embd = ref_tensor(f, "token_embd.weight");
    r->out_norm = ref_tensor(f, lfm2 ? "token_embd_norm.weight" : "output_norm.weight");
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
        ref_layer *L = &r->L[l];
        char name[64];
        if (phi3) { /* rows: Q, K, V; gate, up (as split by the reference's own pointers) */
            snprintf(name, sizeof name, "blk.%u.attn_qkv.weight", l);
            L->qkv = ref_tensor(f, name);
            snprintf(name, sizeof name, "blk.%u.ffn_up.weight", l);
            L->gate_up = ref_tensor(f, name);
            assert_true(L->qkv && L->gate_up);
        }
        snprintf(name, sizeof name, "blk.%u.shortconv.in_proj.weight", l);
        L->conv_in = lfm2 && gguf_find_tensor(f, name) >= 0
                         ? ref_tensor_dims(f, name, r->dim, 3 * (uint64_t)r->dim, 0)
                         : NULL;
        if (L->conv_in) {
            snprintf(name, sizeof name, "blk.%u.shortconv.conv.weight", l);
            L->conv = ref_tensor_dims(f, name, r->taps, r->dim, 0);
            snprintf(name, sizeof name, "blk.%u.shortconv.out_proj.weight", l);
            L->conv_out = ref_tensor_dims(f, name, r->dim, r->dim, 0);
        }
        /* this layer's MLP: experts in an MoE file, but for ernie4_5-moe's dense layers */
        bool lmoe = moe && (!r->moe_step || (l >= r->moe_lead && (l + 1) % r->moe_step == 0));
        for (size_t k = 0; k < 12; k++) {
            bool fused = phi3 && (k == 1 || k == 2 || k == 3 || k == 9 || k == 10);
            if (fused)
                continue;
            snprintf(name, sizeof name, "blk.%u.%s", l, names[k]);
            *dst[k] = ref_tensor(f, name);
            if ((k < 5 && (!L->conv_in || k == 0) && !(olmo2 && k == 0)) ||
                (k > 7 && !(lmoe && k > 8) && !((gpt_oss || olmo2) && k == 8)))
                assert_non_null(*dst[k]);
        }
        if (lmoe) {
            uint64_t D = r->dim, FE = r->ffn_exp, E = r->n_expert;
            snprintf(name, sizeof name, "blk.%u.ffn_gate_inp.weight", l);
            L->router = ref_tensor_dims(f, name, D, E, 0);
            snprintf(name, sizeof name, "blk.%u.ffn_gate_exps.weight", l);
            L->gate_exps = ref_tensor_dims(f, name, D, FE, E);
            snprintf(name, sizeof name, "blk.%u.ffn_up_exps.weight", l);
            L->up_exps = ref_tensor_dims(f, name, D, FE, E);
            snprintf(name, sizeof name, "blk.%u.ffn_down_exps.weight", l);
            L->down_exps = ref_tensor_dims(f, name, FE, D, E);
            assert_true(!L->gate && !L->up && !L->down);
            snprintf(name, sizeof name, "blk.%u.exp_probs_b.bias", l);
            L->probs_b = ernie_moe || lfm2moe ? ref_tensor(f, name) : NULL;
            assert_true(!lfm2moe || L->probs_b);
        }
        if (phi3) {
            size_t KV = (size_t)r->n_kv * r->hd;
            L->wq = malloc((size_t)r->dim * r->dim * sizeof(float));
            L->wk = malloc(KV * r->dim * sizeof(float));
            L->wv = malloc(KV * r->dim * sizeof(float));
            L->gate = malloc((size_t)r->ffn * r->dim * sizeof(float));
            L->up = malloc((size_t)r->ffn * r->dim * sizeof(float));
            assert_true(L->wq && L->wk && L->wv && L->gate && L->up);
            memcpy(L->wq, L->qkv, (size_t)r->dim * r->dim * sizeof(float));
            memcpy(L->wk, L->qkv + (size_t)r->dim * r->dim, KV * r->dim * sizeof(float));
            memcpy(L->wv, L->qkv + ((size_t)r->dim + KV) * r->dim, KV * r->dim * sizeof(float));
            memcpy(L->gate, L->gate_up, (size_t)r->ffn * r->dim * sizeof(float));
            memcpy(L->up, L->gate_up + (size_t)r->ffn * r->dim,
                   (size_t)r->ffn * r->dim * sizeof(float));
        }
        static const char *const extra[] = {"attn_q_norm.weight", "attn_k_norm.weight",
                                            "post_attention_norm.weight", "post_ffw_norm.weight"};
        float **edst[] = {&L->q_norm, &L->k_norm, &L->post_attn, &L->post_ffn};
        for (size_t k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "blk.%u.%s", l, extra[k]);
            *edst[k] = ref_tensor(f, name);
        }
        if (gemma3 || !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe") ||
            (lfm2 && !L->conv_in) || olmo2)
            assert_true(L->q_norm && L->k_norm);
        if (gpt_oss) { /* its post_attention_norm is the MLP's pre-norm; biases everywhere */
            assert_true(!L->ffn_norm && L->post_attn && L->bq && L->bk && L->bv);
            L->ffn_norm = L->post_attn;
            L->post_attn = NULL;
            static const char *const b[] = {"attn_output.bias",  "attn_sinks.weight",
                                            "ffn_gate_inp.bias", "ffn_gate_exps.bias",
                                            "ffn_up_exps.bias",  "ffn_down_exps.bias"};
            float **bdst[] = {&L->bo,          &L->sinks,     &L->router_b,
                              &L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
            for (size_t k = 0; k < 6; k++) {
                snprintf(name, sizeof name, "blk.%u.%s", l, b[k]);
                assert_non_null(*bdst[k] = ref_tensor(f, name));
            }
        }
        if (mistral3) {
            snprintf(name, sizeof name, "blk.%u.attn_output.bias", l);
            L->bo = ref_tensor(f, name);
        }
        if (r->sh_ffn && lmoe) {
            snprintf(name, sizeof name, "blk.%u.ffn_gate_shexp.weight", l);
            L->sh_gate = ref_tensor_dims(f, name, r->dim, r->sh_ffn, 0);
            snprintf(name, sizeof name, "blk.%u.ffn_up_shexp.weight", l);
            L->sh_up = ref_tensor_dims(f, name, r->dim, r->sh_ffn, 0);
            snprintf(name, sizeof name, "blk.%u.ffn_down_shexp.weight", l);
            L->sh_down = ref_tensor_dims(f, name, r->sh_ffn, r->dim, 0);
        }
        if (r->gelu || olmo2)
            assert_true(L->post_attn && L->post_ffn);
        if (r->g3n) {
            uint64_t D = r->dim, A = 4, P = 256, R = 64;
            struct {
                const char *suffix;
                uint64_t d0, d1;
                float **dst;
            } g[] = {{"inp_gate.weight", D, P, &L->g_inp_gate},
                     {"proj.weight", P, D, &L->g_proj},
                     {"post_norm.weight", D, 0, &L->g_post_norm},
                     {"altup_correct_coef.weight", A, A, &L->g_correct},
                     {"altup_correct_scale.weight", D, 0, &L->g_correct_scale},
                     {"altup_predict_coef.weight", A, A * A, &L->g_predict},
                     {"altup_router.weight", D, A, &L->g_router},
                     {"altup_router_norm.weight", D, 0, &L->g_router_norm},
                     {"laurel_l.weight", D, R, &L->g_laurel_l},
                     {"laurel_r.weight", R, D, &L->g_laurel_r},
                     {"laurel_post_norm.weight", D, 0, &L->g_laurel_norm}};
            for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
                snprintf(name, sizeof name, "blk.%u.%s", l, g[k].suffix);
                *g[k].dst = ref_tensor_dims(f, name, g[k].d0, g[k].d1, 0);
            }
            assert_true(L->q_norm && L->k_norm);
        }
    }
    if (r->g3n) {
        uint64_t D = r->dim, LP = (uint64_t)r->n_layer * 256;
        r->g_tok = ref_tensor_dims(f, "per_layer_token_embd.weight", LP, r->vocab, 0);
        r->g_model_proj = ref_tensor_dims(f, "per_layer_model_proj.weight", D, LP, 0);
        r->g_proj_norm = ref_tensor_dims(f, "per_layer_proj_norm.weight", 256, 0, 0);
        r->g_altup_proj = ref_tensor_dims(f, "altup_proj.weight", D, D, 3);
        r->g_unembd = ref_tensor_dims(f, "altup_unembd_proj.weight", D, D, 3);
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
    free(r->g_tok), free(r->g_model_proj), free(r->g_proj_norm), free(r->g_altup_proj);
    free(r->g_unembd);
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
 * angle pos * scale * base^(-2j/n_rot) / freqs[j] (gemma3's windowed layers: base_swa, scale 1). */
static void ref_rope(const ref_model *r, bool neox, bool use_freqs, float *v, int pos, bool swa)
{
    uint32_t half = r->n_rot / 2;
    double base = swa && r->base_swa ? r->base_swa : r->base;
    double scale = swa && r->base_swa ? 1.0 : r->scale, lo = 0, hi = 0, mscale = 1;
    bool yarn = r->yarn_orig && !(swa && r->swa_plain);
    if (yarn) { /* YaRN as llama.cpp's ggml_rope_yarn_corr_dims and rope_yarn */
        double n = r->n_rot, c = 2 * log(base);
        lo = fmax(0, floor(n * log(r->yarn_orig / (r->beta_fast * 6.283185307179586)) / c));
        hi = fmin(n - 1, ceil(n * log(r->yarn_orig / (r->beta_slow * 6.283185307179586)) / c));
        mscale = 1 + 0.1 * log(1 / scale);
    }
    for (uint32_t j = 0; j < half; j++) {
        double extrap = pos * pow(base, -2.0 * j / r->n_rot), th = scale * extrap;
        if (yarn) {
            double ramp = 1 - fmin(1, fmax(0, (j - lo) / fmax(0.001, hi - lo)));
            th = th * (1 - ramp) + extrap * ramp;
        }
        if (use_freqs && r->freqs)
            th /= r->freqs[j];
        uint32_t a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = (float)(mscale * (x0 * cos(th) - x1 * sin(th)));
        v[b] = (float)(mscale * (x0 * sin(th) + x1 * cos(th)));
    }
}

typedef struct ref_opts {
    bool wrong_rope;       /* the other pairing: to show the comparison can fail */
    bool no_bias;          /* drop the biases */
    bool no_freqs;         /* ignore rope_freqs */
    bool no_qk_norm;       /* skip the per-head Q/K norms */
    bool no_window;        /* every layer global */
    bool no_softcap;       /* neither soft-capping */
    bool one_base;         /* gemma3's windowed layers on the global RoPE base */
    bool no_sinks;         /* gpt-oss: no sink logits */
    bool no_yarn;          /* plain linear scaling in place of YaRN */
    bool rope_all;         /* smollm3: rotate its NoPE layers too */
    uint32_t experts_used; /* qwen3moe: 0, the file's expert_used_count; else this many */
    /* granite: one of its scalars left out (llama's value in its place), or RoPE run where the
     * file switches it off */
    bool no_embd_scale, no_attn_scale, no_res_scale, no_logit_scale, rope_anyway;
    bool no_shexp; /* granitemoeshared, ernie4_5-moe: the shared expert left out */
    /* ernie4_5-moe: the experts picked without the selection bias, or weighed with it too */
    bool no_probs_b, probs_b_weights;
    bool conv_own_only;  /* lfm2: each convolution reads its own position's B*x only */
    bool softmax_gating; /* lfm2moe: a softmax over the router's logits, not their sigmoids */
    bool qk_norm_heads;  /* olmo2: Q and K normed head by head, not over the projection */
    bool no_temp;        /* mistral3: no attention temperature */
    /* gemma3n: AltUp's prediction and correction left out (each stream as it is, the active one
     * replaced by the layer's output), LAuReL's branch (the normed input in its place), the
     * per-layer inputs, the sparse gates, the shared K/V (every layer its own), ggml's F16 GELU
     * (the exact tanh approximation in its place) */
    bool no_altup, no_laurel, no_per_layer, no_sparsity, no_kv_share, exact_gelu;
} ref_opts;

static double ref_cap(double x, double cap)
{
    return cap > 0 ? cap * tanh(x / cap) : x;
}

/* RMSNorm of x (n) times w into y, or x copied where the family has no such norm (w NULL:
 * olmo2's sublayers take the residual stream as it is). */
static void ref_norm_or_copy(float *y, const float *x, const float *w, uint32_t n, float eps)
{
    if (w)
        ref_rmsnorm(y, x, w, n, eps);
    else
        memcpy(y, x, n * sizeof *y);
}

/* Per-head RMSNorm in place: n_heads vectors of hd values, one weight vector. */
static void ref_head_norm(float *x, const float *w, uint32_t n_heads, uint32_t hd, float eps)
{
    for (uint32_t h = 0; h < n_heads; h++)
        ref_rmsnorm(x + (size_t)h * hd, x + (size_t)h * hd, w, hd, eps);
}

/* An MoE FFN of one row xn (dim, normed) into out (dim), as llama.cpp's build_moe_ffn for
 * QWEN3MOE and LLAMA: the softmax of the router's logits; the n_used most probable experts, most
 * probable first; their probabilities renormalized to sum 1 (the sum clamped below at 2^-14); out =
 * the sum over those slots, in that order, of weight * down_e(silu(gate_e(xn)) * up_e(xn)).
 * ernie4_5-moe: the experts are the n_used largest of probability + probs_b, in that order, their
 * weights still the probabilities (unless o says otherwise). */
static void ref_moe(const ref_model *r, const ref_layer *L, const ref_opts *o, uint32_t n_used,
                    const float *xn, float *out)
{
    uint32_t D = r->dim, FE = r->ffn_exp, E = r->n_expert;
    float *lg = malloc(E * sizeof(float)), *g = malloc(FE * sizeof(float));
    float *u = malloc(FE * sizeof(float)), *y = malloc(D * sizeof(float));
    double *p = malloc(E * sizeof(double)), *acc = calloc(D, sizeof(double));
    bool *taken = calloc(E, sizeof(bool));
    assert_true(lg && g && u && y && p && acc && taken);
    assert_true(n_used >= 1 && n_used <= E);
    ref_matvec(lg, L->router, xn, E, D);
    for (uint32_t e = 0; L->router_b && e < E; e++)
        lg[e] += L->router_b[e];
    double mx = lg[0], sum = 0;
    for (uint32_t e = 1; e < E; e++)
        mx = fmax(mx, lg[e]);
    bool sigmoid = r->sigmoid && !o->softmax_gating;
    for (uint32_t e = 0; e < E; e++)
        sum += p[e] = sigmoid ? 1 / (1 + exp(-(double)lg[e])) : exp(lg[e] - mx);
    for (uint32_t e = 0; !sigmoid && e < E; e++)
        p[e] /= sum;
    double *ps = malloc(E * sizeof(double)); /* the selection's scores */
    assert_non_null(ps);
    bool probs_b = L->probs_b && !o->no_probs_b;
    for (uint32_t e = 0; e < E; e++)
        ps[e] = probs_b ? (double)(float)p[e] + L->probs_b[e] : p[e];
    if (probs_b && o->probs_b_weights)
        for (uint32_t e = 0; e < E; e++)
            p[e] = ps[e];
    uint32_t sel[64];
    assert_true(n_used <= 64);
    double wsum = 0;
    for (uint32_t k = 0; k < n_used; k++) { /* the most probable expert not yet taken */
        uint32_t best = E;
        for (uint32_t e = 0; e < E; e++)
            if (!taken[e] && (best == E || ps[e] > ps[best]))
                best = e;
        taken[best] = true;
        sel[k] = best;
        wsum += p[best];
    }
    wsum = fmax(wsum, 6.103515625e-5);
    /* gpt-oss: a softmax over the k selected logits (the same order as the probabilities') */
    double tsum = 0;
    for (uint32_t k = 0; k < n_used; k++)
        tsum += exp(lg[sel[k]] - lg[sel[0]]);
    for (uint32_t k = 0; k < n_used; k++) {
        size_t e = sel[k];
        ref_matvec(g, L->gate_exps + e * FE * D, xn, FE, D);
        ref_matvec(u, L->up_exps + e * FE * D, xn, FE, D);
        for (uint32_t i = 0; L->gate_exps_b && i < FE; i++) {
            g[i] += L->gate_exps_b[e * FE + i];
            u[i] += L->up_exps_b[e * FE + i];
        }
        for (uint32_t i = 0; i < FE; i++) {
            double a = g[i];
            if (r->oai_glu) { /* gpt-oss: the gate capped at 7, up clamped to [-7, 7], alpha 1.702
                               */
                a = fmin(a, 7);
                g[i] = (float)(a / (1 + exp(-1.702 * a)) * (fmin(7, fmax(-7, u[i])) + 1));
            } else {
                g[i] = (float)(a / (1 + exp(-a)) * u[i]);
            }
        }
        ref_matvec(y, L->down_exps + e * D * FE, g, D, FE);
        for (uint32_t i = 0; L->down_exps_b && i < D; i++)
            y[i] += L->down_exps_b[e * D + i];
        double w = r->topk_softmax ? exp(lg[e] - lg[sel[0]]) / tsum : p[e] / wsum;
        for (uint32_t i = 0; i < D; i++)
            acc[i] += w * y[i];
    }
    for (uint32_t i = 0; i < D; i++)
        out[i] = (float)acc[i];
    free(lg), free(g), free(u), free(y), free(p), free(ps), free(acc), free(taken);
}

/* lfm2's convolution layer over the n rows of x (n, dim), as llama.cpp's shortconv block and
 * Hugging Face's Lfm2ShortConv: B, C, x = in_proj(rmsnorm(row)); channel i's sum over the taps k
 * (oldest first) of conv[i][k] times B*x of position t - (taps - 1) + k (none before 0); C times
 * it through out_proj, added to the row. */
static void ref_conv(const ref_model *r, const ref_layer *L, const ref_opts *o, float *x, int n,
                     float res)
{
    uint32_t D = r->dim;
    float *bcx = malloc((size_t)n * 3 * D * sizeof(float)), *xn = malloc(D * sizeof(float));
    float *bx = malloc((size_t)n * D * sizeof(float)), *y = malloc(D * sizeof(float));
    float *tmp = malloc(D * sizeof(float));
    assert_true(bcx && xn && bx && y && tmp);
    for (int t = 0; t < n; t++) {
        float *bt = bcx + (size_t)t * 3 * D;
        ref_rmsnorm(xn, x + (size_t)t * D, L->attn_norm, D, r->eps);
        ref_matvec(bt, L->conv_in, xn, 3 * D, D);
        for (uint32_t i = 0; i < D; i++)
            bx[(size_t)t * D + i] = bt[i] * bt[2 * D + i];
    }
    for (int t = 0; t < n; t++) {
        for (uint32_t i = 0; i < D; i++) {
            double s = 0;
            for (uint32_t k = 0; k < r->taps; k++) {
                int p = t - (int)(r->taps - 1) + (int)k;
                if (p >= 0 && (!o->conv_own_only || p == t))
                    s += (double)L->conv[(size_t)i * r->taps + k] * bx[(size_t)p * D + i];
            }
            y[i] = (float)(s * bcx[(size_t)t * 3 * D + D + i]);
        }
        ref_matvec(tmp, L->conv_out, y, D, D);
        for (uint32_t i = 0; i < D; i++)
            x[(size_t)t * D + i] += res != 0.0f ? tmp[i] * res : tmp[i];
    }
    free(bcx), free(xn), free(bx), free(y), free(tmp);
}

/* gemma3n's GELU times u as ggml_gelu computes it on the CPU: the tanh approximation at the input
 * rounded to F16, rounded to F16 itself (its table), 0 below -10, x above 10 */
static float ref_gelu16(float x, bool exact)
{
    if (exact)
        return (float)(0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    double h = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x));
    double y = 0.5 * h * (1 + tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)));
    return ggml_fp16_to_fp32(ggml_fp32_to_fp16((float)y));
}

static double ref_mag(const float *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

/* tanh of router (A rows of dim) times RMSNorm(x, its norm) / dim */
static void ref_g3n_router(const ref_model *r, const ref_layer *L, const float *x, float *mod)
{
    uint32_t D = r->dim;
    float *xn = malloc(D * sizeof(float));
    assert_non_null(xn);
    ref_rmsnorm(xn, x, L->g_router_norm, D, r->eps);
    for (uint32_t i = 0; i < D; i++)
        xn[i] /= (float)D;
    ref_matvec(mod, L->g_router, xn, 4, D);
    for (uint32_t i = 0; i < 4; i++)
        mod[i] = tanhf(mod[i]);
    free(xn);
}

/* gemma3n's forward (Hugging Face's Gemma3nTextModel as llama.cpp runs it): the embedding and
 * three more AltUp streams (altup_proj's, at its magnitude); per-layer inputs (the normed
 * projection of the embedding plus the token's per-layer row, over sqrt 2); in each layer the
 * streams predicted from one another, the layer on the active prediction (attention with Q/K
 * norms, V's norm, unscaled scores, windows; beside it LAuReL; a GELU MLP, its gate cut at mean +
 * 1.6448533 std on the first 10 layers), the streams corrected by the innovation, the per-layer
 * input gated and added to streams 1..3; layers from 20 on attend over layer 18's (windowed) or
 * 19's (global) K/V; the streams merged (altup_unembd_proj at the active stream's magnitude,
 * averaged). */
static void ref_gemma3n(const ref_model *r, const ref_opts *o, const int32_t *tok, int n,
                        float *logits, float *hidden)
{
    enum { A = 4, P = 256, R = 64, KV_FROM = 20 };
    uint32_t D = r->dim, QD = r->n_head * r->hd, KV = r->n_kv * r->hd, F = r->ffn, NL = r->n_layer;
    size_t LP = (size_t)NL * P;
    float *S = malloc((size_t)n * A * D * sizeof(float)), *pred = malloc(A * D * sizeof(float));
    float *preds = malloc((size_t)n * A * D * sizeof(float));
    float *pl = malloc((size_t)n * LP * sizeof(float)), *xn = malloc(D * sizeof(float));
    float *lau = malloc((size_t)n * D * sizeof(float)), *tmp = malloc(D * sizeof(float));
    float *q = malloc((size_t)n * QD * sizeof(float));
    float *Ks = malloc((size_t)NL * n * KV * sizeof(float));
    float *Vs = malloc((size_t)NL * n * KV * sizeof(float));
    float *att = malloc(QD * sizeof(float)), *g = malloc((F > P ? F : P) * sizeof(float));
    float *u = malloc(F * sizeof(float)), *lr = malloc(R * sizeof(float));
    float *al = malloc(D * sizeof(float)), *mod = malloc(A * sizeof(float));
    float *cf = malloc(A * A * sizeof(float)), *sc = malloc((size_t)n * sizeof(float));
    float *ones = malloc(r->hd * sizeof(float));
    assert_true(S && pred && preds && pl && xn && lau && tmp && q && Ks && Vs && att && g && u &&
                lr && al && mod && cf && sc && ones);
    for (uint32_t i = 0; i < r->hd; i++)
        ones[i] = 1.0f;
    for (int t = 0; t < n; t++) {
        float *s = S + (size_t)t * A * D, *p = pl + (size_t)t * LP;
        for (uint32_t i = 0; i < D; i++)
            s[i] = r->embd[(size_t)tok[t] * D + i] * sqrtf((float)D);
        ref_matvec(p, r->g_model_proj, s, (uint32_t)LP, D);
        for (uint32_t l = 0; l < NL; l++) {
            float *b = p + (size_t)l * P;
            for (uint32_t i = 0; i < P; i++)
                b[i] /= sqrtf((float)D);
            ref_rmsnorm(b, b, r->g_proj_norm, P, r->eps);
            for (uint32_t i = 0; i < P; i++)
                b[i] = (float)(((double)b[i] +
                                (double)r->g_tok[(size_t)tok[t] * LP + l * P + i] * sqrt(P)) /
                               sqrt(2.0));
        }
        double m0 = ref_mag(s, D);
        for (uint32_t j = 1; j < A; j++) {
            float *sj = s + (size_t)j * D;
            ref_matvec(sj, r->g_altup_proj + (size_t)(j - 1) * D * D, s, D, D);
            double mj = ref_mag(sj, D);
            for (uint32_t i = 0; i < D; i++)
                sj[i] = (float)(sj[i] * m0 / mj);
        }
    }
    for (uint32_t l = 0; l < NL; l++) {
        const ref_layer *L = &r->L[l];
        bool swa = l % 5 < 4;
        int window = swa ? (int)r->n_swa : 0;
        bool shared = l >= KV_FROM && !o->no_kv_share;
        uint32_t kvl = shared ? KV_FROM - (swa ? 2 : 1) : l;
        for (int t = 0; t < n; t++) {
            float *s = S + (size_t)t * A * D, *pr = preds + (size_t)t * A * D;
            ref_g3n_router(r, L, s, mod);
            ref_matvec(cf, L->g_predict, mod, A * A, A);
            for (uint32_t i = 0; i < A; i++)
                for (uint32_t e = 0; e < D; e++) {
                    double sum = s[(size_t)i * D + e];
                    for (uint32_t k = 0; k < A && !o->no_altup; k++)
                        sum += (double)cf[i * A + k] * s[(size_t)k * D + e];
                    pr[(size_t)i * D + e] = (float)sum;
                }
            ref_rmsnorm(xn, pr, L->attn_norm, D, r->eps);
            float *lt = lau + (size_t)t * D;
            ref_matvec(lr, L->g_laurel_l, xn, R, D);
            ref_matvec(lt, L->g_laurel_r, lr, D, R);
            ref_rmsnorm(lt, lt, L->g_laurel_norm, D, r->eps);
            for (uint32_t i = 0; i < D; i++)
                lt[i] = o->no_laurel ? xn[i] : lt[i] + xn[i];
            float *qt = q + (size_t)t * QD;
            ref_matvec(qt, L->wq, xn, QD, D);
            ref_head_norm(qt, L->q_norm, r->n_head, r->hd, r->eps);
            for (uint32_t h = 0; h < r->n_head; h++)
                ref_rope(r, true, false, qt + h * r->hd, t, swa);
            if (shared)
                continue;
            float *kt = Ks + ((size_t)l * n + t) * KV, *vt = Vs + ((size_t)l * n + t) * KV;
            ref_matvec(kt, L->wk, xn, KV, D);
            ref_matvec(vt, L->wv, xn, KV, D);
            ref_head_norm(kt, L->k_norm, r->n_kv, r->hd, r->eps);
            ref_head_norm(vt, ones, r->n_kv, r->hd, r->eps);
            for (uint32_t h = 0; h < r->n_kv; h++)
                ref_rope(r, true, false, kt + h * r->hd, t, swa);
        }
        const float *K = Ks + (size_t)kvl * n * KV, *V = Vs + (size_t)kvl * n * KV;
        for (int t = 0; t < n; t++) {
            float *s = S + (size_t)t * A * D, *pr = preds + (size_t)t * A * D;
            int p0 = window && t + 1 > window ? t + 1 - window : 0;
            for (uint32_t h = 0; h < r->n_head; h++) {
                uint32_t kh = h / (r->n_head / r->n_kv);
                double mx = -1e30, sum = 0;
                for (int p = p0; p <= t; p++) {
                    double d = 0;
                    for (uint32_t i = 0; i < r->hd; i++)
                        d += (double)q[(size_t)t * QD + h * r->hd + i] *
                             K[(size_t)p * KV + kh * r->hd + i];
                    sc[p] = (float)d;
                    mx = fmax(mx, d);
                }
                for (int p = p0; p <= t; p++)
                    sum += exp(sc[p] - mx);
                for (uint32_t i = 0; i < r->hd; i++) {
                    double a = 0;
                    for (int p = p0; p <= t; p++)
                        a += exp(sc[p] - mx) / sum * V[(size_t)p * KV + kh * r->hd + i];
                    att[h * r->hd + i] = (float)a;
                }
            }
            ref_matvec(tmp, L->wo, att, D, QD);
            ref_rmsnorm(tmp, tmp, L->post_attn, D, r->eps);
            for (uint32_t i = 0; i < D; i++)
                al[i] = (float)(((double)tmp[i] + pr[i] + lau[(size_t)t * D + i]) / sqrt(2.0));
            ref_rmsnorm(xn, al, L->ffn_norm, D, r->eps);
            ref_matvec(g, L->gate, xn, F, D);
            ref_matvec(u, L->up, xn, F, D);
            if (l < 10 && !o->no_sparsity) { /* mean + icdf(0.95) sample std */
                double m = 0, v = 0;
                for (uint32_t i = 0; i < F; i++)
                    m += g[i];
                m /= F;
                for (uint32_t i = 0; i < F; i++)
                    v += (g[i] - m) * (g[i] - m);
                double cut = m + sqrt(v / (F - 1)) * 1.6448533535003662;
                for (uint32_t i = 0; i < F; i++)
                    g[i] = (float)fmax(0.0, g[i] - cut);
            }
            for (uint32_t i = 0; i < F; i++)
                g[i] = ref_gelu16(g[i], o->exact_gelu) * u[i];
            ref_matvec(tmp, L->down, g, D, F);
            ref_rmsnorm(tmp, tmp, L->post_ffn, D, r->eps);
            for (uint32_t i = 0; i < D; i++)
                al[i] += tmp[i];
            /* correct: each stream's prediction plus the innovation times (coefficient + 1) */
            ref_g3n_router(r, L, al, mod);
            ref_matvec(cf, L->g_correct, mod, A, A);
            for (uint32_t i = 0; i < A; i++)
                for (uint32_t e = 0; e < D; e++) {
                    double inn = (double)al[e] - pr[e];
                    s[(size_t)i * D + e] =
                        o->no_altup ? (i == 0 ? al[e] : pr[(size_t)i * D + e])
                                    : (float)(inn * (cf[i] + 1.0) + pr[(size_t)i * D + e]);
                }
            for (uint32_t e = 0; e < D; e++)
                xn[e] = s[e] * L->g_correct_scale[e];
            ref_matvec(g, L->g_inp_gate, xn, P, D);
            for (uint32_t i = 0; i < P; i++)
                g[i] = ref_gelu16(g[i], o->exact_gelu) * pl[(size_t)t * LP + l * P + i];
            ref_matvec(tmp, L->g_proj, g, D, P);
            ref_rmsnorm(tmp, tmp, L->g_post_norm, D, r->eps);
            for (uint32_t i = 1; i < A && !o->no_per_layer; i++)
                for (uint32_t e = 0; e < D; e++)
                    s[(size_t)i * D + e] += tmp[e];
        }
    }
    for (int t = 0; t < n; t++) {
        const float *s = S + (size_t)t * A * D;
        double m0 = ref_mag(s, D);
        double *acc = calloc(D, sizeof(double));
        assert_non_null(acc);
        for (uint32_t e = 0; e < D; e++)
            acc[e] = s[e];
        for (uint32_t j = 1; j < A; j++) {
            ref_matvec(tmp, r->g_unembd + (size_t)(j - 1) * D * D, s + (size_t)j * D, D, D);
            double mj = ref_mag(tmp, D);
            for (uint32_t e = 0; e < D; e++)
                acc[e] += tmp[e] * m0 / mj;
        }
        for (uint32_t e = 0; e < D; e++)
            tmp[e] = (float)(acc[e] / A);
        free(acc);
        ref_rmsnorm(xn, tmp, r->out_norm, D, r->eps);
        if (hidden)
            memcpy(hidden + (size_t)t * D, xn, D * sizeof(float));
        float *lt = logits + (size_t)t * r->vocab;
        ref_matvec(lt, r->out, xn, r->vocab, D);
        for (uint32_t i = 0; i < r->vocab; i++)
            lt[i] = (float)ref_cap(lt[i], r->final_cap);
    }
    free(S), free(pred), free(preds), free(pl), free(xn), free(lau), free(tmp), free(q), free(Ks);
    free(Vs), free(att), free(g), free(u), free(lr), free(al), free(mod), free(cf), free(sc);
    free(ones);
}

/* logits (n, vocab) of every position of tok[0..n), recomputing the whole sequence, and if
 * hidden is not NULL the hidden states after the final norm (n, dim) the logits come from. */
static void ref_forward_h(const ref_model *r, const ref_opts *o, const int32_t *tok, int n,
                          float *logits, float *hidden)
{
    if (r->g3n) {
        ref_gemma3n(r, o, tok, n, logits, hidden);
        return;
    }
    uint32_t D = r->dim, QD = r->n_head * r->hd, KV = r->n_kv * r->hd, F = r->ffn;
    float *x = calloc((size_t)n * D, sizeof(float)), *xn = malloc(D * sizeof(float));
    float *q = malloc((size_t)n * QD * sizeof(float)), *k = malloc((size_t)n * KV * sizeof(float));
    float *v = malloc((size_t)n * KV * sizeof(float)), *att = malloc(QD * sizeof(float));
    float *tmp = malloc(D * sizeof(float)), *g = malloc(F * sizeof(float));
    float *u = malloc(F * sizeof(float)), *sc = malloc((size_t)n * sizeof(float));
    assert_true(x && xn && q && k && v && att && tmp && g && u && sc);
    bool neox = o->wrong_rope ? !r->neox : r->neox;
    ref_model plain = *r; /* no_yarn: the same model on linear scaling */
    plain.yarn_orig = 0;
    const ref_model *rr = o->no_yarn ? &plain : r;
    for (int t = 0; t < n; t++)
        for (uint32_t i = 0; i < D; i++)
            x[(size_t)t * D + i] =
                r->embd[(size_t)tok[t] * D + i] * (o->no_embd_scale ? 1.0f : r->embd_scale);
    double attn_scale = o->no_attn_scale ? 1.0 / sqrt((double)r->hd) : r->attn_scale;
    float res = o->no_res_scale ? 0.0f : r->res_scale;
    bool rope = !r->no_rope || o->rope_anyway;
    for (uint32_t l = 0; l < r->n_layer; l++) {
        const ref_layer *L = &r->L[l];
        bool swa = !o->no_window &&
                   ((r->swa_pattern && l % r->swa_pattern < r->swa_pattern - 1) || r->swa_all);
        int window = swa ? (int)r->n_swa : 0;
        if (L->conv_in)
            ref_conv(r, L, o, x, n, res);
        for (int t = 0; t < n && !L->conv_in; t++) {
            ref_norm_or_copy(xn, x + (size_t)t * D, L->attn_norm, D, r->eps);
            float *qt = q + (size_t)t * QD, *kt = k + (size_t)t * KV, *vt = v + (size_t)t * KV;
            ref_matvec(qt, L->wq, xn, QD, D);
            ref_matvec(kt, L->wk, xn, KV, D);
            ref_matvec(vt, L->wv, xn, KV, D);
            for (uint32_t i = 0; !o->no_bias && L->bq && i < QD; i++)
                qt[i] += L->bq[i];
            for (uint32_t i = 0; !o->no_bias && L->bk && i < KV; i++)
                kt[i] += L->bk[i];
            for (uint32_t i = 0; !o->no_bias && L->bv && i < KV; i++)
                vt[i] += L->bv[i];
            if (L->q_norm && !o->no_qk_norm && r->qk_norm_full && !o->qk_norm_heads) {
                ref_rmsnorm(qt, qt, L->q_norm, QD, r->eps);
                ref_rmsnorm(kt, kt, L->k_norm, KV, r->eps);
            } else if (L->q_norm && !o->no_qk_norm) {
                ref_head_norm(qt, L->q_norm, r->n_head, r->hd, r->eps);
                ref_head_norm(kt, L->k_norm, r->n_kv, r->hd, r->eps);
            }
            bool swa_base = swa && !o->one_base;
            if (r->nope_step && (l + 1) % r->nope_step == 0 && !o->rope_all)
                continue; /* a NoPE layer: queries and keys as projected */
            for (uint32_t h = 0; rope && h < r->n_head; h++)
                ref_rope(rr, neox, !o->no_freqs, qt + h * r->hd, t, swa_base);
            for (uint32_t h = 0; rope && h < r->n_kv; h++)
                ref_rope(rr, neox, !o->no_freqs, kt + h * r->hd, t, swa_base);
            double ts = 1 + r->temp * log(1 + floor((double)t / (r->temp_len ? r->temp_len : 1)));
            for (uint32_t i = 0; r->temp_len && !o->no_temp && i < QD; i++)
                qt[i] = (float)(qt[i] * ts);
        }
        double cap = o->no_softcap ? 0 : r->attn_cap;
        for (int t = 0; t < n && !L->conv_in; t++) {
            int p0 = window && t + 1 > window ? t + 1 - window : 0;
            for (uint32_t h = 0; h < r->n_head; h++) {
                uint32_t kh = h / (r->n_head / r->n_kv);
                double mx = -1e30, sum = 0;
                for (int p = p0; p <= t; p++) {
                    double s = 0;
                    for (uint32_t i = 0; i < r->hd; i++)
                        s += (double)q[(size_t)t * QD + h * r->hd + i] *
                             k[(size_t)p * KV + kh * r->hd + i];
                    sc[p] = (float)ref_cap(s * attn_scale, cap);
                    if (sc[p] > mx)
                        mx = sc[p];
                }
                double sink = L->sinks && !o->no_sinks ? L->sinks[h] : -INFINITY;
                mx = fmax(mx, sink); /* a sink: one more logit, with no value */
                sum = exp(sink - mx);
                for (int p = p0; p <= t; p++)
                    sum += exp(sc[p] - mx);
                for (uint32_t i = 0; i < r->hd; i++) {
                    double s = 0;
                    for (int p = p0; p <= t; p++)
                        s += exp(sc[p] - mx) / sum * v[(size_t)p * KV + kh * r->hd + i];
                    att[h * r->hd + i] = (float)s;
                }
            }
            ref_matvec(tmp, L->wo, att, D, QD);
            for (uint32_t i = 0; !o->no_bias && L->bo && i < D; i++)
                tmp[i] += L->bo[i];
            if (L->post_attn)
                ref_rmsnorm(tmp, tmp, L->post_attn, D, r->eps);
            for (uint32_t i = 0; i < D; i++)
                x[(size_t)t * D + i] += res != 0.0f ? tmp[i] * res : tmp[i];
        }
        for (int t = 0; t < n && L->router; t++) {
            ref_norm_or_copy(xn, x + (size_t)t * D, L->ffn_norm, D, r->eps);
            ref_moe(r, L, o, o->experts_used ? o->experts_used : r->n_expert_used, xn, tmp);
            if (L->sh_down && !o->no_shexp) { /* moe_out + the shared expert's SwiGLU */
                float *sg = malloc(r->sh_ffn * sizeof(float)),
                      *su = malloc(r->sh_ffn * sizeof(float));
                float *sy = malloc(D * sizeof(float));
                assert_true(sg && su && sy);
                ref_matvec(sg, L->sh_gate, xn, r->sh_ffn, D);
                ref_matvec(su, L->sh_up, xn, r->sh_ffn, D);
                for (uint32_t i = 0; i < r->sh_ffn; i++)
                    sg[i] = (float)((double)sg[i] / (1 + exp(-(double)sg[i])) * su[i]);
                ref_matvec(sy, L->sh_down, sg, D, r->sh_ffn);
                for (uint32_t i = 0; i < D; i++)
                    tmp[i] += sy[i];
                free(sg), free(su), free(sy);
            }
            for (uint32_t i = 0; i < D; i++)
                x[(size_t)t * D + i] += res != 0.0f ? tmp[i] * res : tmp[i];
        }
        for (int t = 0; t < n && !L->router; t++) {
            ref_norm_or_copy(xn, x + (size_t)t * D, L->ffn_norm, D, r->eps);
            ref_matvec(g, L->gate, xn, F, D);
            ref_matvec(u, L->up, xn, F, D);
            for (uint32_t i = 0; i < F; i++) {
                double a = g[i];
                g[i] = r->gelu
                           ? (float)(0.5 * a *
                                     (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))) *
                                     u[i])
                           : (float)(a / (1 + exp(-a)) * u[i]);
            }
            ref_matvec(tmp, L->down, g, D, F);
            if (L->post_ffn)
                ref_rmsnorm(tmp, tmp, L->post_ffn, D, r->eps);
            for (uint32_t i = 0; i < D; i++)
                x[(size_t)t * D + i] += res != 0.0f ? tmp[i] * res : tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(xn, x + (size_t)t * D, r->out_norm, D, r->eps);
        if (hidden)
            memcpy(hidden + (size_t)t * D, xn, D * sizeof(float));
        float *lt = logits + (size_t)t * r->vocab;
        ref_matvec(lt, r->out, xn, r->vocab, D);
        for (uint32_t i = 0; !o->no_softcap && r->final_cap > 0 && i < r->vocab; i++)
            lt[i] = (float)ref_cap(lt[i], r->final_cap);
        for (uint32_t i = 0; !o->no_logit_scale && r->logit_mul != 1.0f && i < r->vocab; i++)
            lt[i] *= r->logit_mul;
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(tmp), free(g), free(u), free(sc);
}

static void ref_forward(const ref_model *r, const ref_opts *o, const int32_t *tok, int n,
                        float *logits)
{
    ref_forward_h(r, o, tok, n, logits, NULL);
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

/* engine_model_load of path with lp (NULL: the defaults); fails the test with the loader's
 * message. */
static engine_model *load_model(const char *path, const engine_load_params *lp)
{
    engine_model *m = NULL;
    char err[256] = "";
    if (engine_model_load(path, lp, &m, err, sizeof err))
        fail_msg("%s: %s", path, err);
    return m;
}

/* The context (16 rows) and cache (8 blocks of 4, F32) the TOKENS checks run in. */
static void small_ctx(engine_model *m, engine_ctx **c, engine_kv **kv)
{
    assert_int_equal(engine_ctx_create(m, 16, 2, c), 0);
    assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, 8, 4, kv), 0);
}

/* The F32 tolerance of the family row being checked (test_family), 0: TOL. */
static double family_tol;

/* Loads path with the engine on kernel table kernels and checks its logits against the
 * reference: one prefill of N_PROMPT rows (all logits), then N_DECODE single-token steps reading
 * the cache through a block table of scattered physical blocks (block size 4); the last step
 * must also equal a one-batch recomputation exactly. The recomputed logits go to full_out
 * (n_vocab floats). */
static void check_model_on(const char *path, const char *arch, const char *wtype,
                           const char *kernels, const char *act, float *full_out)
{
    engine_load_params lp = {.verbose = false, .kernels = kernels, .activations = act};
    double tol = strcmp(act, "q8") ? (family_tol ? family_tol : TOL) : TOL_Q8, worst = 0;
    engine_model *m = load_model(path, &lp);
    const engine_hparams *hp = engine_model_hparams(m);
    assert_string_equal(hp->arch, arch);
    assert_string_equal(engine_model_weight_type(m), wtype);

    ref_model r;
    ref_load(&r, path);
    assert_int_equal(hp->n_vocab, r.vocab);
    uint32_t V = r.vocab;
    float *want = malloc((size_t)N_TOTAL * V * sizeof(float));
    float *got = malloc((size_t)N_PROMPT * V * sizeof(float));
    float *want_h = malloc((size_t)N_TOTAL * hp->n_embd * sizeof(float));
    float *got_h = malloc((size_t)N_PROMPT * hp->n_embd * sizeof(float));
    assert_true(want && got && want_h && got_h);
    ref_opts ro = {0};
    ref_forward_h(&r, &ro, TOKENS, N_TOTAL, want, want_h);

    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    small_ctx(m, &c, &kv);
    int32_t blocks[] = {5, 2, 7, 0};
    engine_seq_view view = {.blocks = blocks, .n_blocks = 4};
    int32_t pos[N_PROMPT], seq[N_PROMPT] = {0};
    bool wl[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        pos[i] = i;
        wl[i] = true;
    }
    engine_batch b = {N_PROMPT, TOKENS, pos, seq, wl, 1, &view};
    /* every row's hidden state too (an embedding's), from the same pass */
    assert_int_equal(engine_forward_hidden(c, kv, &b, got, wl, got_h), 0);
    for (int t = 0; t < N_PROMPT; t++) {
        double e = rel_err(got + (size_t)t * V, want + (size_t)t * V, V);
        worst = fmax(worst, e);
        if (e > tol)
            fail_msg("%s (%s) prefill row %d: relative error %g", path, act, t, e);
        e = rel_err(got_h + (size_t)t * hp->n_embd, want_h + (size_t)t * hp->n_embd, hp->n_embd);
        if (e > tol)
            fail_msg("%s (%s) prefill row %d: hidden state's relative error %g", path, act, t, e);
    }
    for (int t = N_PROMPT; t < N_TOTAL; t++) {
        int32_t p1 = t, s1 = 0;
        bool w1 = true;
        engine_batch d = {1, &TOKENS[t], &p1, &s1, &w1, 1, &view};
        assert_int_equal(engine_forward(c, kv, &d, got), 0);
        double e = rel_err(got, want + (size_t)t * V, V);
        worst = fmax(worst, e);
        if (e > tol)
            fail_msg("%s (%s) decode position %d: relative error %g", path, act, t, e);
    }
    if (!strcmp(kernels, "avx2") || !strcmp(kernels, "generic"))
        fprintf(stderr, "models: %s, %s kernels, activations %s: relative error at most %.2g\n",
                path, kernels, act, worst);
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
        fail_msg("%s (%s kernels, %s): cached decode and full recomputation differ", path, kernels,
                 act);
    memcpy(full_out, full, (size_t)V * sizeof(float));
    free(full);
    engine_kv_destroy(kv2);
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
    free(want);
    free(got);
    free(want_h);
    free(got_h);
    ref_free(&r);
}

/* check_model_on every kernel table this CPU runs; their logits are equal bit for bit (every
 * table computes the reference's bits, kern/ref.c and kern/qdot_ref.c). */
static void check_model_act(const char *path, const char *arch, const char *wtype, const char *act)
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
        check_model_on(path, arch, wtype, tables[i], act, first_name ? full : first);
        if (!first_name)
            first_name = tables[i];
        else if (memcmp(first, full, V * sizeof(float)))
            fail_msg("%s (%s): %s and %s kernels give different logits", path, act, first_name,
                     tables[i]);
    }
    assert_non_null(first_name);
    free(first);
    free(full);
}

/* Both modes; q8 only where it changes something: a file whose projections have an integer
 * kernel (Q8_0, Q4_0 .. Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4). */
static void check_model(const char *path, const char *arch, const char *wtype)
{
    check_model_act(path, arch, wtype, "f32");
    static const char *const qdot[] = {"Q8_0", "Q4_0", "Q4_1", "Q5_0",   "Q5_1",   "Q2_K", "Q3_K",
                                       "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"};
    for (size_t i = 0; i < sizeof qdot / sizeof qdot[0]; i++)
        if (!strcmp(wtype, qdot[i]))
            check_model_act(path, arch, wtype, "q8");
}

/* The families and weight types against the reference (check_model), one row each: the row's
 * name is its test's name in cmocka's output. */
typedef struct family_case {
    const char *name;
    const char *file; /* written by kvs-mkmodel's tiny shape with args */
    const char *arch; /* the architecture and weight type the engine must report */
    const char *wtype;
    const char *args[16]; /* NULL-terminated; a --shape there overrides tiny (the last wins) */
} family_case;

static const family_case FAMILY_CASES[] = {
    {"test_llama_f32", "llama-f32.gguf", "llama", "F32", {NULL}},
    {"test_llama_f16_tied", "llama-f16-tied.gguf", "llama", "F16", {"--type", "f16", "--tied"}},
    {"test_llama_q8_0", "llama-q8.gguf", "llama", "Q8_0", {"--type", "q8_0"}},
    {"test_llama3_rope_freqs",
     "llama3-freqs.gguf",
     "llama",
     "F16",
     {"--rope-base", "500000", "--rope-freqs", "--type", "f16"}},
    {"test_qwen2_f32",
     "qwen2-f32.gguf",
     "qwen2",
     "F32",
     {"--arch", "qwen2", "--rope-base", "1000000"}},
    {"test_qwen2_q8_0_tied",
     "qwen2-q8-tied.gguf",
     "qwen2",
     "Q8_0",
     {"--arch", "qwen2", "--type", "q8_0", "--tied"}},
    {"test_qwen3_f32",
     "qwen3-f32.gguf",
     "qwen3",
     "F32",
     {"--arch", "qwen3", "--head-dim", "32", "--rope-base", "1000000"}},
    {"test_qwen3_q8_0_tied",
     "qwen3-q8-tied.gguf",
     "qwen3",
     "Q8_0",
     {"--arch", "qwen3", "--head-dim", "32", "--type", "q8_0", "--tied"}},
    /* windows of 4 positions: the 12-token sequences leave the window on the windowed layers */
    {"test_gemma2_f32",
     "gemma2-f32.gguf",
     "gemma2",
     "F32",
     {"--arch", "gemma2", "--head-dim", "32", "--sliding-window", "4"}},
    {"test_gemma3_f16",
     "gemma3-f16.gguf",
     "gemma3",
     "F16",
     {"--arch", "gemma3", "--head-dim", "32", "--type", "f16", "--sliding-window", "4",
      "--rope-base", "1000000"}},
    {"test_phi3_f32", "phi3-f32.gguf", "phi3", "F32", {"--arch", "phi3"}},
    {"test_phi3_q8_0", "phi3-q8.gguf", "phi3", "Q8_0", {"--arch", "phi3", "--type", "q8_0"}},
    /* an expert's ffn (96) other than feed_forward_length (128); then 3 experts of 6, seed 3:
     * over TOKENS its closest routing call (the last expert taken against the next) is 0.063
     * apart in router logits (seed 1's: 0.006), a margin for --activations q8's rounding */
    {"test_qwen3moe_f32",
     "qwen3moe-f32.gguf",
     "qwen3moe",
     "F32",
     {"--arch", "qwen3moe", "--head-dim", "32", "--experts", "8", "--experts-used", "2",
      "--expert-ffn", "96", "--rope-base", "1000000"}},
    {"test_qwen3moe_q8_0",
     "qwen3moe-q8.gguf",
     "qwen3moe",
     "Q8_0",
     {"--arch", "qwen3moe", "--head-dim", "32", "--experts", "6", "--experts-used", "3", "--type",
      "q8_0", "--seed", "3"}},
    /* Mixtral's layout: llama with experts of feed_forward_length, no expert_feed_forward_length
     * key */
    {"test_mixtral_f32",
     "mixtral-f32.gguf",
     "llama",
     "F32",
     {"--experts", "4", "--experts-used", "2", "--seed", "3"}},
    /* YaRN on a dense family (the long-context Qwen files): factor 4 over the file's context */
    {"test_qwen3_yarn_f32",
     "qwen3-yarn-f32.gguf",
     "qwen3",
     "F32",
     {"--arch", "qwen3", "--head-dim", "32", "--rope-base", "1000000", "--yarn", "4"}},
    /* gpt-oss: biases, sinks, YaRN (factor 32 over 4096), windows of 4 on the even layers, the
     * top 3 of 8 experts (96 wide) weighed by a softmax over them, the clamped SwiGLU */
    {"test_gpt_oss_f32",
     "gpt-oss-f32.gguf",
     "gpt-oss",
     "F32",
     {"--arch", "gpt-oss", "--head-dim", "32", "--experts", "8", "--experts-used", "3",
      "--expert-ffn", "96", "--sliding-window", "4"}},
    {"test_gpt_oss_q8_0",
     "gpt-oss-q8.gguf",
     "gpt-oss",
     "Q8_0",
     {"--arch", "gpt-oss", "--head-dim", "32", "--experts", "6", "--experts-used", "2", "--type",
      "q8_0", "--sliding-window", "4", "--seed", "3"}},
    /* smollm3 on seven layers (tiny has two): layer 3 unrotated among rotated ones (NORM pairs),
     * untied, then tied in Q8_0 */
    {"test_smollm3_f32",
     "smollm3-f32.gguf",
     "smollm3",
     "F32",
     {"--arch", "smollm3", "--rope-base", "5000000", "--shape", "swa7"}},
    {"test_smollm3_q8_0_tied",
     "smollm3-q8-tied.gguf",
     "smollm3",
     "Q8_0",
     {"--arch", "smollm3", "--type", "q8_0", "--tied", "--shape", "swa7"}},
    /* YaRN (its 128k setting), whose magnitude the NoPE layer does not take either */
    {"test_smollm3_yarn_f32",
     "smollm3-yarn-f32.gguf",
     "smollm3",
     "F32",
     {"--arch", "smollm3", "--yarn", "4", "--shape", "swa7"}},
    /* granite: llama (NORM RoPE) with kvs-mkmodel's embedding_scale 2.5, attention.scale 0.2
     * (1/sqrt(16) is 0.25), residual_scale 0.6 and logit_scale 3; without RoPE; and granitemoe,
     * the same with Mixtral's routing over 8 experts of feed_forward_length, 2 used */
    {"test_granite_f32", "granite-f32.gguf", "granite", "F32", {"--arch", "granite"}},
    {"test_granite_q8_0",
     "granite-q8.gguf",
     "granite",
     "Q8_0",
     {"--arch", "granite", "--type", "q8_0", "--seed", "2"}},
    {"test_granite_no_rope",
     "granite-norope.gguf",
     "granite",
     "F32",
     {"--arch", "granite", "--no-rope"}},
    {"test_granitemoe_f32", "granitemoe-f32.gguf", "granitemoe", "F32", {"--arch", "granitemoe"}},
    /* granitemoeshared (converted as granitemoe): a shared expert of 96 beside the routed ones */
    {"test_granitemoe_shared_f32",
     "granitemoe-shared-f32.gguf",
     "granitemoe",
     "F32",
     {"--arch", "granitemoe", "--shared-expert-ffn", "96"}},
    {"test_granitemoe_shared_q8_0",
     "granitemoe-shared-q8.gguf",
     "granitemoe",
     "Q8_0",
     {"--arch", "granitemoe", "--shared-expert-ffn", "64", "--type", "q8_0", "--seed", "2"}},
    /* ernie4_5: llama's block, NORM pairs; ernie4_5-moe on seven layers: 0, 2, 4, 6 dense (a
     * lead of 1, then every second layer), 1, 3, 5 experts (8 of 96, 2 used, picked on the
     * probabilities plus exp_probs_b) beside a shared expert of 80 */
    {"test_ernie4_5_f32", "ernie4_5-f32.gguf", "ernie4_5", "F32", {"--arch", "ernie4_5"}},
    /* heads of attention.key_length (32: Q 128 wide on a width of 64) */
    {"test_ernie4_5_head_dim_f32",
     "ernie4_5-hd-f32.gguf",
     "ernie4_5",
     "F32",
     {"--arch", "ernie4_5", "--head-dim", "32"}},
    {"test_ernie4_5_moe_head_dim_f32",
     "ernie4_5-moe-hd-f32.gguf",
     "ernie4_5-moe",
     "F32",
     {"--arch", "ernie4_5-moe", "--head-dim", "32", "--shared-expert-ffn", "80", "--seed", "2"}},
    {"test_ernie4_5_q8_0",
     "ernie4_5-q8.gguf",
     "ernie4_5",
     "Q8_0",
     {"--arch", "ernie4_5", "--type", "q8_0", "--seed", "2"}},
    {"test_ernie4_5_moe_f32",
     "ernie4_5-moe-f32.gguf",
     "ernie4_5-moe",
     "F32",
     {"--arch", "ernie4_5-moe", "--shape", "swa7", "--experts", "8", "--experts-used", "2",
      "--expert-ffn", "96", "--shared-expert-ffn", "80", "--moe-step", "2"}},
    /* heads narrower than the width beside a shared expert (moe.c holds its output) */
    {"test_ernie4_5_moe_narrow_shexp_f32",
     "ernie4_5-moe-narrow.gguf",
     "ernie4_5-moe",
     "F32",
     {"--arch", "ernie4_5-moe", "--head-dim", "8", "--shared-expert-ffn", "32"}},
    {"test_ernie4_5_moe_q8_0",
     "ernie4_5-moe-q8.gguf",
     "ernie4_5-moe",
     "Q8_0",
     {"--arch", "ernie4_5-moe", "--shape", "swa7", "--experts", "6", "--shared-expert-ffn", "64",
      "--moe-step", "2", "--type", "q8_0", "--seed", "3"}},
    /* lfm2 on seven layers: convolutions of 3 taps on 0, 1, 3, 4 (B*x of the two positions
     * before each row read back from the cache), attention with Q/K norms on 2, 5, 6; tied in
     * Q8_0 */
    {"test_lfm2_f32", "lfm2-f32.gguf", "lfm2", "F32", {"--arch", "lfm2", "--shape", "swa7"}},
    /* with attention.sliding_window 4: every attention layer windowed (llama.cpp's iswa graph),
     * beside the convolutions' own window of 3 in the same group */
    {"test_lfm2_swa_f32",
     "lfm2-swa-f32.gguf",
     "lfm2",
     "F32",
     {"--arch", "lfm2", "--shape", "swa7", "--sliding-window", "4"}},
    {"test_lfm2_q8_0_tied",
     "lfm2-q8-tied.gguf",
     "lfm2",
     "Q8_0",
     {"--arch", "lfm2", "--shape", "swa7", "--type", "q8_0", "--tied", "--seed", "2"}},
    /* lfm2moe on seven layers: layer 0 dense, experts on the others (8 of 96, 2 used, sigmoid
     * gating, picked on the probabilities plus exp_probs_b); in Q8_0, seed 2: seeds 1, 4 and 5
     * had a routing call close enough for --activations q8's rounding to pick another expert
     * (0.15-0.24 from the reference, against 0.076 here, lfm2's 0.074) */
    {"test_lfm2moe_f32",
     "lfm2moe-f32.gguf",
     "lfm2moe",
     "F32",
     {"--arch", "lfm2moe", "--shape", "swa7", "--experts", "8", "--experts-used", "2",
      "--expert-ffn", "96"}},
    {"test_lfm2moe_q8_0",
     "lfm2moe-q8.gguf",
     "lfm2moe",
     "Q8_0",
     {"--arch", "lfm2moe", "--shape", "swa7", "--experts", "6", "--experts-used", "2", "--type",
      "q8_0", "--seed", "2"}},
    /* olmo2 on seven layers (F32, Q8_0), and OLMo 3's windows: layers 0-2 and 4-6 windowed (4
     * positions, plain RoPE), 3 global with YaRN */
    {"test_olmo2_f32", "olmo2-f32.gguf", "olmo2", "F32", {"--arch", "olmo2", "--shape", "swa7"}},
    {"test_olmo2_q8_0",
     "olmo2-q8.gguf",
     "olmo2",
     "Q8_0",
     {"--arch", "olmo2", "--shape", "swa7", "--type", "q8_0", "--seed", "2"}},
    {"test_olmo2_swa_f32",
     "olmo2-swa-f32.gguf",
     "olmo2",
     "F32",
     {"--arch", "olmo2", "--shape", "swa7", "--sliding-window", "4", "--yarn", "4"}},
    /* mistral3: heads of attention.key_length (32: Q 128 wide on a width of 64), YaRN (factor 4)
     * and the attention temperature (0.5) over an original context of 4, so the positions see
     * floor(pos / 4) of 0 to 3 and more; Q/K/V and output biases tied in Q8_0; Mixtral's experts */
    {"test_mistral3_f32",
     "mistral3-f32.gguf",
     "mistral3",
     "F32",
     {"--arch", "mistral3", "--head-dim", "32", "--yarn", "4", "--orig-ctx", "4", "--attn-temp",
      "0.5"}},
    {"test_mistral3_q8_0_bias",
     "mistral3-q8-bias.gguf",
     "mistral3",
     "Q8_0",
     {"--arch", "mistral3", "--type", "q8_0", "--tied", "--bias", "--orig-ctx", "4", "--attn-temp",
      "0.5"}},
    {"test_mistral3_moe_f32",
     "mistral3-moe-f32.gguf",
     "mistral3",
     "F32",
     {"--arch", "mistral3", "--experts", "4", "--experts-used", "2"}},
    /* gemma3n on 12 layers: the sparse gates on 0..9, windows of 4 on four layers of five
     * (4.4e-4 from the reference). No Q8_0 row: --activations q8's rounding, grown through the
     * F16 GELU's (below), leaves a Q8_0 file 0.21 from the reference, past TOL_Q8 */
    {"test_gemma3n_f32",
     "gemma3n-f32.gguf",
     "gemma3n",
     "F32",
     {"--arch", "gemma3n", "--layers", "12", "--head-dim", "32", "--sliding-window", "4",
      "--rope-base", "1000000", "--weight-std", "0.05"}},
    /* and on 25, layers 20..24 reading layer 18's K/V (windowed) and 19's (global, 24). ggml's
     * GELU rounds to F16 (input and output), so a change of one ulp flips roundings and grows
     * with depth: 1.1e-3 to 1.5e-3 from the reference here, 1.4e-4 with the exact GELU on both
     * sides */
    {"test_gemma3n_shared_kv_f32",
     "gemma3n-25-f32.gguf",
     "gemma3n",
     "F32",
     {"--arch", "gemma3n", "--layers", "25", "--head-dim", "32", "--sliding-window", "4",
      "--rope-base", "1000000", "--weight-std", "0.05"}},
    {"test_granitemoe_q8_0",
     "granitemoe-q8.gguf",
     "granitemoe",
     "Q8_0",
     {"--arch", "granitemoe", "--experts", "4", "--type", "q8_0", "--seed", "3"}},
};

/* One row of FAMILY_CASES (cmocka's initial state). */
static void test_family(void **st)
{
    const family_case *c = *st;
    char p[512];
    make(p, sizeof p, c->file, c->args);
    /* test_gemma3n_shared_kv_f32's depth (see its row) */
    family_tol = !strcmp(c->name, "test_gemma3n_shared_kv_f32") ? 3e-3 : 0;
    check_model(p, c->arch, c->wtype);
    family_tol = 0;
}

/* The reference's logits (n x *V, malloc'd) of every position of tok[0 .. n) on the model at
 * path, its vocabulary size in *V. */
static float *ref_all(const char *path, const int32_t *tok, int n, uint32_t *V)
{
    ref_model r;
    ref_load(&r, path);
    *V = r.vocab;
    float *want = malloc((size_t)n * r.vocab * sizeof(float));
    assert_non_null(want);
    ref_opts ro = {0};
    ref_forward(&r, &ro, tok, n, want);
    ref_free(&r);
    return want;
}

/* The reference's logits of tok (n rows) on path (n * *V floats, the caller frees them), once it
 * is shown that the window matters there: without it the last row moves far beyond TOL. */
static float *ref_windowed(const char *path, const int32_t *tok, int n, uint32_t *V)
{
    ref_model r;
    ref_load(&r, path);
    *V = r.vocab;
    float *want = malloc((size_t)n * r.vocab * sizeof(float));
    float *alt = malloc((size_t)n * r.vocab * sizeof(float));
    assert_true(want && alt);
    ref_opts ro = {0}, nw = {.no_window = true};
    ref_forward(&r, &ro, tok, n, want);
    ref_forward(&r, &nw, tok, n, alt);
    size_t last = (size_t)(n - 1) * r.vocab;
    assert_true(rel_err(alt + last, want + last, r.vocab) > 20 * TOL);
    free(alt);
    ref_free(&r);
    return want;
}

/* The window tests' sequence: n tokens (i * mul + add) % 509 + 3 at positions 0 .. n - 1, with
 * logits wanted for row last_row only, and nb blocks in the permutation (i * step + off) % nb
 * (step prime to nb), so neighbouring positions live in scattered physical blocks. */
static void window_sequence(int n, int last_row, int mul, int add, int32_t *tok, int32_t *pos,
                            bool *wl, int nb, int step, int off, int32_t *blocks)
{
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)((i * mul + add) % 509) + 3;
        pos[i] = i;
        wl[i] = i == last_row;
    }
    for (int i = 0; i < nb; i++)
        blocks[i] = (i * step + off) % nb;
}

/* The prefill's last row (row, logits in got) within TOL of want's. */
static void check_prefill_row(const float *got, const float *want, int row, uint32_t V)
{
    double e = rel_err(got, want + (size_t)row * V, V);
    if (e > TOL)
        fail_msg("prefill row %d: relative error %g", row, e);
}

/* Row t of tok decoded alone through view: its logits (into got) within TOL of want's row t. */
static void check_decode_row(engine_ctx *c, engine_kv *kv, engine_seq_view *view,
                             const int32_t *tok, const int32_t *pos, int t, float *got,
                             const float *want, uint32_t V)
{
    int32_t seq = 0;
    bool w1 = true;
    engine_batch d = {1, &tok[t], &pos[t], &seq, &w1, 1, view};
    assert_int_equal(engine_forward(c, kv, &d, got), 0);
    double e = rel_err(got, want + (size_t)t * V, V);
    if (e > TOL)
        fail_msg("decode position %d: relative error %g", t, e);
}

/* A window across attention spans (kvserve's items of 128 positions): a 300-token sequence with
 * a window of 150 on the small "stories260K" shape of 5 layers (windowed: 0-3; 4 global),
 * prefilled in one batch and decoded for 4 more rows through a scattered block table. */
static void test_gemma3_long_window(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--arch",  "gemma3", "--sliding-window", "150", "--rope-base",
                       "1000000", NULL};
    make_shape(p, sizeof p, "stories260K", "gemma3-long.gguf", a);

    enum { N = 300, NP = 296, BS = 8, NB = 40 };
    int32_t tok[N], pos[N], seq[N] = {0}, blocks[NB];
    bool wl[N];
    window_sequence(N, NP - 1, 37, 11, tok, pos, wl, NB, 7, 3, blocks); /* 7 is prime to 40 */
    uint32_t V;
    float *want = ref_windowed(p, tok, N, &V), *got = malloc(V * sizeof(float));
    assert_non_null(got);

    engine_model *m = load_model(p, NULL);
    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    assert_int_equal(engine_ctx_create(m, N, 2, &c), 0);
    assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, NB, BS, &kv), 0);
    engine_seq_view view = {.blocks = blocks, .n_blocks = NB};
    engine_batch b = {NP, tok, pos, seq, wl, 1, &view};
    assert_int_equal(engine_forward(c, kv, &b, got), 0);
    check_prefill_row(got, want, NP - 1, V);
    for (int t = NP; t < N; t++)
        check_decode_row(c, kv, &view, tok, pos, t, got, want, V);
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
    free(want);
    free(got);
}

/* A prompt across attention spans without GQA, with the server's F16 cache (the mha shape: four
 * heads of 64, one kv head each): a 300-token sequence prefilled in batches of 100 (296 rows)
 * and decoded for 4 more rows through a scattered block table of 16-position blocks, on every
 * kernel table this CPU runs. A prompt's rows of one sequence go through each whole span
 * together, 16 at most (engine/attention.c's rows_attend), a decode row alone: the last decode
 * row must equal a recomputation of the whole sequence in one batch (other groups of rows) bit
 * for bit, and the table's logits those of the first table. Against the reference (F32 keys and
 * values) the F16 cache's rounding is allowed KV16_TOL. */
#define KV16_TOL 1e-2
static void test_long_prompt_mha(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--type", "f16", NULL};
    make_shape(p, sizeof p, "mha", "mha-long.gguf", a);
    enum { N = 300, NP = 296, CHUNK = 100, BS = 16, NB = 19 };
    int32_t tok[N], pos[N], seq[N] = {0}, blocks[NB];
    bool wl[N];
    window_sequence(N, NP - 1, 37, 11, tok, pos, wl, NB, 7, 3, blocks); /* 7 is prime to 19 */
    uint32_t V;
    float *want = ref_all(p, tok, N, &V), *got = malloc(V * sizeof(float));
    float *full = malloc(V * sizeof(float)), *first = malloc(V * sizeof(float));
    assert_true(got && full && first);
    static const char *const tables[] = {"generic", "avx2", "auto"};
    const char *first_name = NULL;
    double worst = 0;
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        char err[256];
        if (engine_kernels_check(tables[ti], err, sizeof err))
            continue; /* this CPU (or build) lacks it */
        engine_load_params lp = {.verbose = false, .kernels = tables[ti], .activations = "f32"};
        engine_model *m = load_model(p, &lp);
        assert_int_equal(engine_model_hparams(m)->n_head, engine_model_hparams(m)->n_head_kv);
        engine_ctx *c = NULL;
        engine_kv *kv = NULL, *kv2 = NULL;
        assert_int_equal(engine_ctx_create(m, N, 2, &c), 0);
        assert_int_equal(engine_kv_create(m, ENGINE_KV_F16, NB, BS, &kv), 0);
        assert_int_equal(engine_kv_create(m, ENGINE_KV_F16, NB, BS, &kv2), 0);
        engine_seq_view view = {.blocks = blocks, .n_blocks = NB};
        for (int t0 = 0; t0 < NP; t0 += CHUNK) { /* the rows of a task differ from f's */
            int n = NP - t0 < CHUNK ? NP - t0 : CHUNK;
            engine_batch b = {(uint32_t)n, tok + t0, pos + t0, seq, wl + t0, 1, &view};
            assert_int_equal(engine_forward(c, kv, &b, got), 0);
        }
        worst = fmax(worst, rel_err(got, want + (size_t)(NP - 1) * V, V));
        for (int t = NP; t < N; t++) {
            bool w1 = true;
            engine_batch d = {1, &tok[t], &pos[t], seq, &w1, 1, &view};
            assert_int_equal(engine_forward(c, kv, &d, got), 0);
            worst = fmax(worst, rel_err(got, want + (size_t)t * V, V));
        }
        bool wf[N];
        for (int i = 0; i < N; i++)
            wf[i] = i == N - 1;
        engine_batch f = {N, tok, pos, seq, wf, 1, &view};
        assert_int_equal(engine_forward(c, kv2, &f, full), 0);
        if (memcmp(full, got, V * sizeof(float)))
            fail_msg("mha, %s kernels: cached decode and full recomputation differ", tables[ti]);
        if (!first_name) {
            first_name = tables[ti];
            memcpy(first, full, V * sizeof(float));
        } else if (memcmp(first, full, V * sizeof(float))) {
            fail_msg("mha: %s and %s kernels give different logits", first_name, tables[ti]);
        }
        engine_kv_destroy(kv2);
        engine_kv_destroy(kv);
        engine_ctx_destroy(c);
        engine_model_destroy(m);
    }
    fprintf(stderr, "models: mha, F16 cache, 300 tokens: relative error at most %.2g\n", worst);
    if (worst > KV16_TOL)
        fail_msg("mha: relative error %g against the reference", worst);
    free(want);
    free(got);
    free(full);
    free(first);
}

/* A split arena (window reclaim, engine_kv_create_split) against the reference forward: the
 * swa7 shape (layer 5 global, six windowed) with a window of 40 and blocks of 8; the windowed
 * table is a different permutation in a 12-block arena, and after each decode row every entry
 * wholly before the next row's window is overwritten with -1 (released), as the scheduler does.
 * A wrong group, table or slot moves the logits beyond TOL; reading a released entry fails the
 * forward (KVS_EINVAL) or the bounds. */
/* KiB of the process's mapping of path that are resident (/proc/self/smaps), or -1 if none is
 * listed or smaps cannot be read. */
static long mapped_kb(const char *path)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[1024];
    long kb = -1;
    bool in = false;
    size_t n = strlen(path);
    while (fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        if (l > 0 && line[l - 1] == '\n')
            line[--l] = '\0';
        if (strchr("0123456789abcdef", line[0]) && line[0]) /* a mapping's (fields: "Rss:") */
            in = l >= n && !strcmp(line + l - n, path);
        else if (in && !strncmp(line, "Rss:", 4))
            kb = (kb < 0 ? 0 : kb) + strtol(line + 4, NULL, 10);
    }
    fclose(f);
    return kb;
}

/* Loading leaves none of the file's tensor pages mapped once every tensor is copied (an F16
 * file with --activations f32: the matrices into panels, the norm vectors widened; the untied
 * embedding table is read in place, and not prefaulted), so the
 * resident size is that of the copies, not copies plus file: at most the metadata's pages before
 * the first tensor. Before the loader copied its F32 vectors and released the copied tensors
 * as runs, their pages (and, with the page cache's large folios, up to 2 MiB around each) stayed
 * mapped. */
static void test_load_releases_file_pages(void **st)
{
    (void)st;
    char p[512], err[256];
    const char *a[] = {"--type", "f16", NULL};
    make_shape(p, sizeof p, "mha", "mha-release.gguf", a);
    gguf_file *g = NULL;
    assert_int_equal(gguf_open(p, &g, err, sizeof err), 0);
    uint64_t data = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++)
        data += gguf_tensor_at(g, i)->n_bytes;
    long head_kb = (long)((gguf_file_size(g) - data + 4095) / 4096 * 4); /* no more than this */
    gguf_close(g);
    engine_load_params lp = {.verbose = false, .activations = "f32"};
    engine_model *m = load_model(p, &lp);
    long kb = mapped_kb(p);
    if (kb < 0) {
        engine_model_destroy(m);
        skip(); /* no /proc/self/smaps here */
    }
    printf("resident of the file's mapping after load: %ld KiB (metadata: %ld KiB)\n", kb, head_kb);
    assert_true(kb <= head_kb + 4);
    /* The untied embedding table stays the file's rows, read in place (not prefaulted): a step's
     * lookup maps its row's page (and what the kernel maps around it). Copied at load, as before,
     * the mapping would not grow. */
    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    small_ctx(m, &c, &kv);
    int32_t blocks[] = {0}, tok[] = {300}, pos[] = {0}, seq[] = {0};
    bool wl[] = {true};
    engine_seq_view view = {.blocks = blocks, .n_blocks = 1};
    engine_batch b = {1, tok, pos, seq, wl, 1, &view};
    float *logits = malloc(512 * sizeof(float));
    assert_non_null(logits);
    assert_int_equal(engine_forward(c, kv, &b, logits), 0);
    long after = mapped_kb(p);
    printf("after one token: %ld KiB\n", after);
    assert_true(after >= kb + 4);
    free(logits);
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
}

static void test_gemma3_split_arena(void **st)
{
    (void)st;
    char p[512];
    const char *a[] = {"--arch", "gemma3", "--sliding-window", "40", NULL};
    make_shape(p, sizeof p, "swa7", "gemma3-split.gguf", a);

    enum { N = 120, NP = 100, BS = 8, NB = 16, NW = 12, WIN = 40 };
    int32_t tok[N], pos[N], seq[N] = {0}, blocks[NB], wblocks[NB];
    bool wl[N];
    window_sequence(N, NP - 1, 53, 7, tok, pos, wl, NB, 5, 2, blocks); /* 5 is prime to 16 */
    uint32_t V;
    float *want = ref_windowed(p, tok, N, &V), *got = malloc(V * sizeof(float));
    assert_non_null(got);

    engine_model *m = load_model(p, NULL);
    engine_ctx *c = NULL;
    engine_kv *kv = NULL, *bad = NULL;
    assert_int_equal(engine_kv_create_split(m, ENGINE_KV_F32, NB, 0, BS, &bad), KVS_EINVAL);
    assert_null(bad);
    assert_int_equal(engine_ctx_create(m, NP, 2, &c), 0);
    assert_int_equal(engine_kv_create_split(m, ENGINE_KV_F32, NB, NW, BS, &kv), 0);
    /* the prefill writes every windowed block of its 100 positions (13 blocks) once: the first
     * ones are released before the 12-block arena would need them again */
    for (int i = 0; i < NB; i++)
        wblocks[i] = i < NW ? (i * 7 + 3) % NW : -1;
    wblocks[12] = wblocks[0]; /* block 0 is behind row 99's window: its slots are reused */
    wblocks[0] = -1;
    engine_seq_view view = {.blocks = blocks, .n_blocks = NB, .wblocks = wblocks, .n_wblocks = NB};
    /* a prefill of 100 rows reads its whole window for every row: rows before 96 need block 0
     * in the windowed table, so it is prefilled in two parts */
    int32_t w0[NB];
    memcpy(w0, wblocks, sizeof w0);
    w0[0] = w0[12];
    w0[12] = -1;
    engine_seq_view v0 = {.blocks = blocks, .n_blocks = NB, .wblocks = w0, .n_wblocks = 12};
    bool none[N] = {false};
    engine_batch b0 = {96, tok, pos, seq, none, 1, &v0};
    assert_int_equal(engine_forward(c, kv, &b0, got), 0);
    engine_batch b1 = {NP - 96, tok + 96, pos + 96, seq, wl + 96, 1, &view};
    assert_int_equal(engine_forward(c, kv, &b1, got), 0);
    check_prefill_row(got, want, NP - 1, V);
    for (int t = NP; t < N; t++) {
        uint32_t lo = (uint32_t)t + 1 > WIN ? (uint32_t)t + 1 - WIN : 0;
        for (uint32_t i = 0; i < lo / BS; i++)
            wblocks[i] = -1;
        if (wblocks[t / BS] < 0) { /* the row's block: reuse a released one's slot */
            for (int f = 0; f < NW; f++) {
                bool taken = false;
                for (int i = 0; i < NB; i++)
                    taken |= wblocks[i] == f;
                if (!taken) {
                    wblocks[t / BS] = f;
                    break;
                }
            }
        }
        check_decode_row(c, kv, &view, tok, pos, t, got, want, V);
    }
    /* a released entry inside the row's window is refused */
    uint32_t last = N - 1;
    int32_t keep = wblocks[(last + 1 - WIN) / BS];
    wblocks[(last + 1 - WIN) / BS] = -1;
    bool w1 = true;
    engine_batch d = {1, &tok[last], &pos[last], seq, &w1, 1, &view};
    assert_int_equal(engine_forward(c, kv, &d, got), KVS_EINVAL);
    wblocks[(last + 1 - WIN) / BS] = keep;
    engine_kv_destroy(kv);
    engine_ctx_destroy(c);
    engine_model_destroy(m);
    free(want);
    free(got);
}

typedef struct edit edit;
static void rewrite(const char *src, const char *dst, const edit *e);
static void make_strong_caps(char *p, size_t cap);

/* The reference's family parts have teeth: each one left out moves the last logits far beyond
 * TOL, so an engine that forgot it would fail its family's test above. */
static void test_family_reference_is_sensitive(void **st)
{
    (void)st;
    static const struct {
        const char *name;
        const char *args[16];
        ref_opts o;
    } cases[] = {
        {"", {NULL}, {.no_softcap = true}}, /* make_strong_caps */
        {"sens-qwen3.gguf", {"--arch", "qwen3", "--head-dim", "32", NULL}, {.no_qk_norm = true}},
        /* the second expert's share, and the choice of experts (all 8 mixed instead) */
        {"sens-qwen3moe.gguf",
         {"--arch", "qwen3moe", "--head-dim", "32", NULL},
         {.experts_used = 1}},
        {"sens-qwen3moe.gguf",
         {"--arch", "qwen3moe", "--head-dim", "32", NULL},
         {.experts_used = 8}},
        {"sens-gemma2.gguf",
         {"--arch", "gemma2", "--sliding-window", "4", NULL},
         {.no_window = true}},
        /* gpt-oss's sinks, YaRN, windows, biases, and its routing's k */
        {"sens-gpt-oss.gguf",
         {"--arch", "gpt-oss", "--head-dim", "32", "--sliding-window", "4", NULL},
         {.no_sinks = true}},
        {"sens-gpt-oss.gguf",
         {"--arch", "gpt-oss", "--head-dim", "32", "--sliding-window", "4", NULL},
         {.no_yarn = true}},
        {"sens-gpt-oss.gguf",
         {"--arch", "gpt-oss", "--head-dim", "32", "--sliding-window", "4", NULL},
         {.no_window = true}},
        {"sens-gpt-oss.gguf",
         {"--arch", "gpt-oss", "--head-dim", "32", "--sliding-window", "4", NULL},
         {.no_bias = true}},
        {"sens-gpt-oss.gguf",
         {"--arch", "gpt-oss", "--head-dim", "32", "--sliding-window", "4", NULL},
         {.experts_used = 1}},
        {"sens-gemma3.gguf",
         {"--arch", "gemma3", "--sliding-window", "4", "--rope-base", "1000000", NULL},
         {.no_window = true}},
        {"sens-gemma3.gguf",
         {"--arch", "gemma3", "--sliding-window", "4", "--rope-base", "1000000", NULL},
         {.no_qk_norm = true}},
        {"sens-gemma3.gguf",
         {"--arch", "gemma3", "--sliding-window", "4", "--rope-base", "1000000", NULL},
         {.one_base = true}},
        /* smollm3's NoPE layer (3 of swa7's 7) rotated as the others */
        {"sens-smollm3.gguf", {"--arch", "smollm3", "--shape", "swa7", NULL}, {.rope_all = true}},
        /* granite's four scalars, its RoPE switch, and granitemoe's routing */
        {"sens-granite.gguf", {"--arch", "granite", NULL}, {.no_embd_scale = true}},
        {"sens-granite.gguf", {"--arch", "granite", NULL}, {.no_attn_scale = true}},
        {"sens-granite.gguf", {"--arch", "granite", NULL}, {.no_res_scale = true}},
        {"sens-granite.gguf", {"--arch", "granite", NULL}, {.no_logit_scale = true}},
        {"sens-granite-norope.gguf",
         {"--arch", "granite", "--no-rope", NULL},
         {.rope_anyway = true}},
        {"sens-granitemoe.gguf", {"--arch", "granitemoe", NULL}, {.experts_used = 1}},
        {"sens-granitemoe-shared.gguf",
         {"--arch", "granitemoe", "--shared-expert-ffn", "96", NULL},
         {.no_shexp = true}},
    /* ernie4_5-moe: the experts picked without the selection bias, weighed with it too, and
     * without the shared expert */
#define ERNIE_SENS                                                                                 \
    {"--arch", "ernie4_5-moe",        "--shape", "swa7",       "--experts", "8", "--expert-ffn",   \
     "96",     "--shared-expert-ffn", "80",      "--moe-step", "2",         NULL}
        {"sens-ernie4_5-moe.gguf", ERNIE_SENS, {.no_probs_b = true}},
        {"sens-ernie4_5-moe.gguf", ERNIE_SENS, {.probs_b_weights = true}},
        {"sens-ernie4_5-moe.gguf", ERNIE_SENS, {.no_shexp = true}},
#undef ERNIE_SENS
        /* lfm2's convolution over the positions before a row, not its own alone */
        {"sens-lfm2.gguf", {"--arch", "lfm2", "--shape", "swa7", NULL}, {.conv_own_only = true}},
        {"sens-lfm2-swa.gguf",
         {"--arch", "lfm2", "--shape", "swa7", "--sliding-window", "4", NULL},
         {.no_window = true}},
        /* olmo2's Q/K norms over the projections (head by head instead), its windows, and their
         * plain RoPE (the global layers' YaRN there too) */
        {"sens-olmo2.gguf", {"--arch", "olmo2", "--shape", "swa7", NULL}, {.qk_norm_heads = true}},
        {"sens-olmo2-swa.gguf",
         {"--arch", "olmo2", "--shape", "swa7", "--sliding-window", "4", "--yarn", "4", NULL},
         {.no_window = true}},
        {"sens-olmo2-swa.gguf",
         {"--arch", "olmo2", "--shape", "swa7", "--sliding-window", "4", "--yarn", "4", NULL},
         {.one_base = true}},
        /* lfm2moe's selection bias, and its gating (a softmax in place of the sigmoids) */
        /* mistral3's attention temperature, its YaRN and its biases */
        {"sens-mistral3.gguf",
         {"--arch", "mistral3", "--yarn", "4", "--orig-ctx", "4", "--attn-temp", "0.5", "--bias",
          NULL},
         {.no_temp = true}},
        {"sens-mistral3.gguf",
         {"--arch", "mistral3", "--yarn", "4", "--orig-ctx", "4", "--attn-temp", "0.5", "--bias",
          NULL},
         {.no_yarn = true}},
        {"sens-mistral3.gguf",
         {"--arch", "mistral3", "--yarn", "4", "--orig-ctx", "4", "--attn-temp", "0.5", "--bias",
          NULL},
         {.no_bias = true}},
        {"sens-lfm2moe.gguf",
         {"--arch", "lfm2moe", "--shape", "swa7", "--expert-ffn", "96", NULL},
         {.no_probs_b = true}},
        {"sens-lfm2moe.gguf",
         {"--arch", "lfm2moe", "--shape", "swa7", "--expert-ffn", "96", NULL},
         {.softmax_gating = true}},
    /* gemma3n's AltUp, LAuReL, per-layer inputs, sparse gates, shared K/V and F16 GELU */
#define G3N_SENS                                                                                   \
    {"--arch", "gemma3n", "--layers", "25", "--head-dim", "32", "--sliding-window", "4", NULL}
        {"sens-gemma3n.gguf", G3N_SENS, {.no_altup = true}},
        {"sens-gemma3n.gguf", G3N_SENS, {.no_laurel = true}},
        {"sens-gemma3n.gguf", G3N_SENS, {.no_per_layer = true}},
        {"sens-gemma3n.gguf", G3N_SENS, {.no_sparsity = true}},
        {"sens-gemma3n.gguf", G3N_SENS, {.no_kv_share = true}},
        {"sens-gemma3n.gguf", G3N_SENS, {.exact_gelu = true}},
#undef G3N_SENS
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char p[512];
        if (!cases[i].name[0])
            make_strong_caps(p, sizeof p);
        else
            make(p, sizeof p, cases[i].name, cases[i].args);
        ref_model r;
        ref_load(&r, p);
        uint32_t V = r.vocab;
        float *base = malloc((size_t)N_TOTAL * V * sizeof(float));
        float *alt = malloc((size_t)N_TOTAL * V * sizeof(float));
        assert_true(base && alt);
        ref_opts o0 = {0};
        ref_forward(&r, &o0, TOKENS, N_TOTAL, base);
        ref_forward(&r, &cases[i].o, TOKENS, N_TOTAL, alt);
        double e = rel_err(alt + (size_t)(N_TOTAL - 1) * V, base + (size_t)(N_TOTAL - 1) * V, V);
        if (e < 20 * TOL)
            fail_msg("case %zu (%s) changes the last logits by only %g", i, cases[i].name, e);
        free(base);
        free(alt);
        ref_free(&r);
    }
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
    engine_load_params lp = {.verbose = false, .kernels = kernels, .activations = "f32"};
    engine_model *m = load_model(path, &lp);
    engine_ctx *c = NULL;
    engine_kv *kv = NULL;
    small_ctx(m, &c, &kv);
    int32_t blocks[] = {5, 2, 7, 0};
    engine_seq_view view = {.blocks = blocks, .n_blocks = 4};
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

/* A model of kvs-mkmodel's shape (kquant: every row whole 256-value blocks; tiny: rows of 64 and
 * 128, for which llama-quantize falls back from the K-quants to Q4_0 .. Q5_1 and Q8_0, as it does
 * for Gemma 3 1B's 1152 or Qwen2.5 0.5B's 896) quantized by llama-quantize to ftype, whose first
 * matrix is of type wtype (mixtures as llama-quantize writes them: output.weight in Q6_K, some
 * attn_v / ffn_down one step up): it loads, its logits are near the naive reference
 * and cached = recomputed bit for bit on every table (check_model); and they equal bit for bit
 * the engine's on the same file requantized to F32 by llama.cpp (llama-quantize
 * --allow-requantize ... F32: llama.cpp's own dequantizer), with --activations f32, because the
 * panels multiply exactly those F32 values in the same order. With q8 (check_model) the logits
 * are within TOL_Q8 of the reference instead. */
static void check_quantized(const char *shape, const char *ftype, const char *wtype,
                            const char *arch)
{
    if (!quantize) {
        fprintf(stderr, "models: no llama-quantize in ../shared/peer: %s skipped\n", ftype);
        skip();
    }
    char base[512], name[128], q[512], f32[512];
    snprintf(name, sizeof name, "%s-%s-f16.gguf", shape, arch);
    make_shape(base, sizeof base, shape, name,
               (const char *const[]){"--type", "f16", "--arch", arch, NULL});
    snprintf(q, sizeof q, "%s/%s-%s-%s.gguf", dir, shape, arch, ftype);
    snprintf(f32, sizeof f32, "%s/%s-%s-%s-f32.gguf", dir, shape, arch, ftype);
    run_quantize(base, q, ftype, false);
    run_quantize(q, f32, "F32", true);
    check_model(q, arch, wtype);
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

/* llama-quantize's file types (check_quantized): the ftype, the type its first matrix gets, the
 * test's name in cmocka's output, the shape (NULL: kquant) and the family (NULL: llama). */
typedef struct quant_case {
    const char *name, *ftype, *wtype, *shape, *arch;
} quant_case;

static const quant_case QUANT_CASES[] = {
    {"test_q4_0", "Q4_0", "Q4_0", NULL, NULL},
    {"test_q4_1", "Q4_1", "Q4_1", NULL, NULL},
    {"test_q5_0", "Q5_0", "Q5_0", NULL, NULL},
    {"test_q5_1", "Q5_1", "Q5_1", NULL, NULL},
    {"test_q8_0_peer", "Q8_0", "Q8_0", NULL, NULL},
    {"test_q2_k", "Q2_K", "Q2_K", NULL, NULL},
    {"test_q3_k_m", "Q3_K_M", "Q3_K", NULL, NULL},
    {"test_q4_k_m", "Q4_K_M", "Q4_K", NULL, NULL},
    {"test_q5_k_m", "Q5_K_M", "Q5_K", NULL, NULL},
    {"test_q6_k", "Q6_K", "Q6_K", NULL, NULL},
    {"test_iq4_nl", "IQ4_NL", "IQ4_NL", NULL, NULL},
    {"test_iq4_xs", "IQ4_XS", "IQ4_XS", NULL, NULL},
    /* the K-quants' fallbacks: Q5_0 and Q8_0; Q4_0, Q5_0, Q5_1 and Q8_0 */
    {"test_q4_k_m_narrow", "Q4_K_M", "Q5_0", "tiny", NULL},
    {"test_q3_k_m_narrow", "Q3_K_M", "Q4_0", "tiny", NULL},
    /* a mixture of experts: K-quant expert stacks (gate and up Q4_K, down Q6_K in some layers),
     * on the integer path the grouped products of engine/moe.c */
    {"test_qwen3moe_q4_k_m", "Q4_K_M", "Q4_K", "moe", "qwen3moe"},
    /* MXFP4_MOE: MXFP4 expert stacks (gpt-oss's type), the other matrices Q8_0 */
    {"test_qwen3moe_mxfp4_moe", "MXFP4_MOE", "Q8_0", "moe", "qwen3moe"},
};

/* One row of QUANT_CASES (cmocka's initial state). */
static void test_quantized(void **st)
{
    const quant_case *c = *st;
    check_quantized(c->shape ? c->shape : "kquant", c->ftype, c->wtype,
                    c->arch ? c->arch : "llama");
}

/* A quantized prompt longer than the gated MLP's row blocks (engine/forward.c's GLU_ROWS, on
 * the integer path): Q4_K_M on the kquant shape (gate and up in Q4_K, down in Q6_K / Q4_K),
 * --activations q8, every kernel table this CPU runs. The last row of one 70-row batch (row
 * blocks 64 + 6) equals, bit for bit, the same row prefilled in batches of 10 (one block
 * each) and decoded alone after a 69-row batch, and is within TOL_Q8 of the reference. */
static void test_quantized_long_prompt(void **st)
{
    (void)st;
    if (!quantize) {
        fprintf(stderr,
                "models: no llama-quantize in ../shared/peer: long Q4_K_M prompt skipped\n");
        skip();
    }
    char base[512], q[512];
    make_shape(base, sizeof base, "kquant", "kquant-f16.gguf",
               (const char *const[]){"--type", "f16", NULL});
    snprintf(q, sizeof q, "%s/kquant-long-Q4_K_M.gguf", dir);
    run_quantize(base, q, "Q4_K_M", false);
    enum { N = 70, CHUNK = 10, BS = 16, NB = 5 };
    int32_t tok[N], pos[N], seq[N] = {0}, blocks[NB];
    bool wl[N], wlast[N];
    window_sequence(N, N - 1, 37, 11, tok, pos, wl, NB, 2, 1, blocks); /* 2 is prime to 5 */
    for (int i = 0; i < N; i++)
        wlast[i] = i == N - 2;
    uint32_t V;
    float *want = ref_all(q, tok, N, &V), *one = malloc(V * sizeof(float));
    float *chunked = malloc(V * sizeof(float)), *decoded = malloc(V * sizeof(float));
    assert_true(one && chunked && decoded);
    static const char *const tables[] = {"generic", "avx2", "auto"};
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        char err[256];
        if (engine_kernels_check(tables[ti], err, sizeof err))
            continue; /* this CPU (or build) lacks it */
        engine_load_params lp = {.verbose = false, .kernels = tables[ti], .activations = "q8"};
        engine_model *m = load_model(q, &lp);
        assert_string_equal(engine_model_weight_type(m), "Q4_K");
        engine_seq_view view = {.blocks = blocks, .n_blocks = NB};
        engine_ctx *c = NULL;
        engine_kv *kv[3] = {NULL, NULL, NULL};
        assert_int_equal(engine_ctx_create(m, N, 2, &c), 0);
        for (int k = 0; k < 3; k++)
            assert_int_equal(engine_kv_create(m, ENGINE_KV_F16, NB, BS, &kv[k]), 0);
        engine_batch b = {N, tok, pos, seq, wl, 1, &view};
        assert_int_equal(engine_forward(c, kv[0], &b, one), 0);
        for (int t0 = 0; t0 < N; t0 += CHUNK) {
            engine_batch bc = {CHUNK, tok + t0, pos + t0, seq, wl + t0, 1, &view};
            assert_int_equal(engine_forward(c, kv[1], &bc, chunked), 0);
        }
        engine_batch bp = {N - 1, tok, pos, seq, wlast, 1, &view};
        assert_int_equal(engine_forward(c, kv[2], &bp, decoded), 0);
        bool w1 = true;
        engine_batch d = {1, &tok[N - 1], &pos[N - 1], seq, &w1, 1, &view};
        assert_int_equal(engine_forward(c, kv[2], &d, decoded), 0);
        if (memcmp(one, chunked, V * sizeof(float)))
            fail_msg("%s kernels: a 70-row batch and batches of 10 give different logits",
                     tables[ti]);
        if (memcmp(one, decoded, V * sizeof(float)))
            fail_msg("%s kernels: cached decode and the 70-row batch differ", tables[ti]);
        double e = rel_err(one, want + (size_t)(N - 1) * V, V);
        if (e > TOL_Q8)
            fail_msg("%s kernels: relative error %g against the reference", tables[ti], e);
        for (int k = 0; k < 3; k++)
            engine_kv_destroy(kv[k]);
        engine_ctx_destroy(c);
        engine_model_destroy(m);
    }
    free(want);
    free(one);
    free(chunked);
    free(decoded);
}

/* ------------------------------------------------------------ refusals */

struct edit {
    const char *arch;              /* new general.architecture */
    const char *str_key, *str_val; /* set (or replace) a string key */
    const char *u32_key;           /* set (or replace) a u32 key */
    uint32_t u32_val;
    const char *f32_key; /* set (or replace) a float key */
    float f32_val;
    const char *drop;     /* tensor to leave out */
    const char *drop_key; /* metadata key to leave out */
    const char *add_vec;  /* F32 vector tensor of 4 values to add */
    const char *foreign;  /* tensor stored as Q8_1 (a type kvserve has no kernels for) */
    const char *reshape;  /* tensor whose dims[1] gains one row */
};

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
            (e->f32_key && !strcmp(key, e->f32_key)) || (e->drop_key && !strcmp(key, e->drop_key)))
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
            type = foreign ? 9 /* Q8_1 */ : t->type;
            uint64_t n = dims[0] * dims[1] * dims[2] * dims[3];
            free(scratch);
            scratch = calloc(1, ggml_type_nbytes(type, n));
            assert_non_null(scratch);
            data = scratch;
        }
        assert_int_equal(gguf_writer_add_tensor(w, name, t->n_dims, dims, type, data), 0);
    }
    if (e->add_vec) {
        static const float ones[4] = {1, 1, 1, 1};
        uint64_t dims[GGUF_MAX_DIMS] = {4, 1, 1, 1};
        assert_int_equal(gguf_writer_add_tensor(w, e->add_vec, 1, dims, GGML_TYPE_F32, ones), 0);
    }
    if (gguf_writer_write(w, dst, err, sizeof err))
        fail_msg("%s: %s", dst, err);
    free(scratch);
    gguf_writer_destroy(w);
    gguf_close(f);
}

/* Loading a copy of a model kvs-mkmodel writes with src_args, edited by e, must fail with
 * status and a message containing each of the words. */
static void expect_refusal_from(const char *const *src_args, const edit *e, int status,
                                const char *w1, const char *w2)
{
    static int n;
    char src[512], dst[512];
    make(src, sizeof src, "refusal-src.gguf", src_args);
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

static void expect_refusal(const edit *e, int status, const char *w1, const char *w2)
{
    expect_refusal_from(NULL, e, status, w1, w2);
}

static void test_refuse_architecture(void **st)
{
    (void)st;
    edit e = {.arch = "mamba"};
    expect_refusal(&e, KVS_EUNSUPPORTED, "architecture 'mamba' is not supported",
                   "supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss, "
                   "smollm3, granite, granitemoe, ernie4_5, ernie4_5-moe, lfm2, lfm2moe, olmo2, "
                   "mistral3, gemma3n");
    edit e2 = {.arch = "gemma"}; /* Gemma 1: not implemented */
    expect_refusal(&e2, KVS_EUNSUPPORTED, "'gemma'", NULL);
}

static void test_refuse_tensor_type(void **st)
{
    (void)st;
    edit e = {.foreign = "blk.1.ffn_up.weight"};
    expect_refusal(&e, KVS_EUNSUPPORTED, "tensor blk.1.ffn_up.weight has type Q8_1",
                   "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                   "Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4");
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
    edit longrope = {.str_key = "llama.rope.scaling.type", .str_val = "longrope"};
    expect_refusal(&longrope, KVS_EUNSUPPORTED, "rope scaling type 'longrope'", NULL);
    /* YaRN runs, but not llama.cpp's context-level overrides of it */
    edit yarn = {.str_key = "llama.rope.scaling.type",
                 .str_val = "yarn",
                 .f32_key = "llama.rope.scaling.yarn_ext_factor",
                 .f32_val = 0.5f};
    expect_refusal(&yarn, KVS_EUNSUPPORTED, "llama.rope.scaling.yarn_ext_factor is not supported",
                   NULL);
    edit kl = {.u32_key = "llama.attention.key_length", .u32_val = 32};
    expect_refusal(&kl, KVS_EUNSUPPORTED, "llama.attention.key_length = 32", NULL);
    /* llama runs Mixtral's experts, which need their count per token; qwen2 has none */
    edit moe = {.u32_key = "llama.expert_count", .u32_val = 8};
    expect_refusal(&moe, KVS_ENOKEY, "missing metadata key llama.expert_used_count", NULL);
    /* a mixture of experts' own keys and stacks */
    static const char *const qwen3moe[] = {"--arch", "qwen3moe", "--head-dim", "16", NULL};
    edit used = {.u32_key = "qwen3moe.expert_used_count", .u32_val = 9};
    expect_refusal_from(qwen3moe, &used, KVS_EFORMAT,
                        "metadata qwen3moe.expert_used_count = 9 is outside 1..8", NULL);
    edit stack = {.reshape = "blk.1.ffn_down_exps.weight"};
    expect_refusal_from(qwen3moe, &stack, KVS_EFORMAT, "tensor blk.1.ffn_down_exps.weight",
                        "expected [128, 64, 8]");
    /* Mixtral's old layout: one tensor per expert */
    static const char *const mixtral[] = {"--experts", "4", NULL};
    edit split = {.add_vec = "blk.0.ffn_gate.0.weight"};
    expect_refusal_from(mixtral, &split, KVS_EUNSUPPORTED,
                        "blk.0.ffn_gate.0.weight: experts stored one tensor each",
                        "convert_hf_to_gguf.py");
    static const char *const qwen2[] = {"--arch", "qwen2", NULL};
    edit moe2 = {.u32_key = "qwen2.expert_count", .u32_val = 8};
    expect_refusal_from(qwen2, &moe2, KVS_EUNSUPPORTED,
                        "mixture of experts (qwen2.expert_count = 8) is not supported for qwen2",
                        NULL);
    edit vs = {.u32_key = "llama.vocab_size", .u32_val = 600};
    expect_refusal(&vs, KVS_EFORMAT, "llama.vocab_size = 600", "512 tokens");
}

/* gemma2 with caps that bite on this small model (attention 2, final 3; the files' 50 and 30
 * barely touch its scores and logits) into p. */
static void make_strong_caps(char *p, size_t cap)
{
    char src[512], mid[512];
    const char *a[] = {"--arch", "gemma2", "--sliding-window", "4", NULL};
    make(src, sizeof src, "caps-src.gguf", a);
    snprintf(mid, sizeof mid, "%s/caps-mid.gguf", dir);
    snprintf(p, cap, "%s/caps.gguf", dir);
    edit e1 = {.f32_key = "gemma2.attn_logit_softcapping", .f32_val = 2.0f};
    edit e2 = {.f32_key = "gemma2.final_logit_softcapping", .f32_val = 3.0f};
    rewrite(src, mid, &e1);
    rewrite(mid, p, &e2);
}

static void test_gemma2_strong_caps(void **st)
{
    (void)st;
    char p[512];
    make_strong_caps(p, sizeof p);
    check_model(p, "gemma2", "F32");
}

/* Bad or partial files of the new families: each refusal names what is wrong. */
static void test_refuse_family_files(void **st)
{
    (void)st;
    const char *qwen3[] = {"--arch", "qwen3", "--head-dim", "32", NULL};
    edit qn = {.drop = "blk.1.attn_k_norm.weight"};
    expect_refusal_from(qwen3, &qn, KVS_EFORMAT, "missing tensor blk.1.attn_k_norm.weight", NULL);
    edit kl = {.drop_key = "qwen3.attention.key_length"};
    expect_refusal_from(qwen3, &kl, KVS_ENOKEY, "missing metadata key qwen3.attention.key_length",
                        NULL);
    edit vl = {.u32_key = "qwen3.attention.value_length", .u32_val = 16};
    expect_refusal_from(qwen3, &vl, KVS_EUNSUPPORTED, "qwen3.attention.value_length = 16",
                        "key_length = 32");
    edit qs = {.reshape = "blk.0.attn_q.weight"};
    expect_refusal_from(qwen3, &qs, KVS_EFORMAT, "blk.0.attn_q.weight", "expected [64, 128]");

    /* mistral3: what llama.cpp's graph would not read, refused by name */
    const char *m3[] = {"--arch", "mistral3", "--orig-ctx", "4", "--attn-temp", "0.5", NULL};
    edit m3s = {.f32_key = "mistral3.attention.scale", .f32_val = 0.2f};
    expect_refusal_from(m3, &m3s, KVS_EUNSUPPORTED, "mistral3.attention.scale", NULL);
    edit m3b = {.add_vec = "blk.0.ffn_up.bias"};
    expect_refusal_from(m3, &m3b, KVS_EUNSUPPORTED, "blk.0.ffn_up.bias", "mistral3");
    edit m3t = {.u32_key = "mistral3.attention.temperature_length", .u32_val = 8};
    expect_refusal_from(m3, &m3t, KVS_EUNSUPPORTED, "mistral3.attention.temperature_length = 8",
                        "original_context_length = 4");
    edit m3r = {.u32_key = "mistral3.rope.dimension_count", .u32_val = 8};
    expect_refusal_from(m3, &m3r, KVS_EUNSUPPORTED, "mistral3.rope.dimension_count = 8", NULL);

    const char *gemma2[] = {"--arch", "gemma2", "--sliding-window", "4", NULL};
    edit w0 = {.u32_key = "gemma2.attention.sliding_window", .u32_val = 0};
    expect_refusal_from(gemma2, &w0, KVS_EFORMAT, "gemma2.attention.sliding_window = 0", NULL);
    edit ws = {.str_key = "gemma2.attention.sliding_window", .str_val = "4096"};
    expect_refusal_from(gemma2, &ws, KVS_EKEYTYPE, "gemma2.attention.sliding_window",
                        "not an unsigned integer");
    edit pn = {.drop = "blk.1.post_ffw_norm.weight"};
    expect_refusal_from(gemma2, &pn, KVS_EFORMAT, "missing tensor blk.1.post_ffw_norm.weight",
                        NULL);

    const char *gemma3[] = {"--arch", "gemma3", "--sliding-window", "4", NULL};
    edit g3n = {.drop = "blk.0.attn_q_norm.weight"};
    expect_refusal_from(gemma3, &g3n, KVS_EFORMAT, "missing tensor blk.0.attn_q_norm.weight", NULL);
    edit pat = {.u32_key = "gemma3.attention.sliding_window_pattern", .u32_val = 4};
    expect_refusal_from(gemma3, &pat, KVS_EUNSUPPORTED,
                        "gemma3.attention.sliding_window_pattern = 4", NULL);
    edit cap = {.f32_key = "gemma3.attn_logit_softcapping", .f32_val = 50.0f};
    expect_refusal_from(gemma3, &cap, KVS_EUNSUPPORTED, "gemma3.attn_logit_softcapping", NULL);

    /* smollm3: llama.cpp's graph for it has no RoPE frequency factors, and turns whole heads */
    const char *smol_freqs[] = {"--arch", "smollm3", "--rope-freqs", NULL};
    edit none = {0};
    expect_refusal_from(smol_freqs, &none, KVS_EUNSUPPORTED, "rope_freqs.weight in a smollm3 file",
                        NULL);
    const char *smol[] = {"--arch", "smollm3", NULL};
    edit rd = {.u32_key = "smollm3.rope.dimension_count", .u32_val = 8};
    expect_refusal_from(smol, &rd, KVS_EUNSUPPORTED, "smollm3.rope.dimension_count = 8",
                        "head size 16");

    const char *phi3[] = {"--arch", "phi3", NULL};
    edit lr = {.add_vec = "rope_factors_long.weight"};
    expect_refusal_from(phi3, &lr, KVS_EUNSUPPORTED, "LongRoPE", "rope_factors_long.weight");
    edit qkv = {.reshape = "blk.1.attn_qkv.weight"};
    expect_refusal_from(phi3, &qkv, KVS_EFORMAT, "blk.1.attn_qkv.weight", "expected [64, 128]");
    edit up = {.drop = "blk.0.ffn_up.weight"};
    expect_refusal_from(phi3, &up, KVS_EFORMAT, "missing tensor blk.0.ffn_up.weight", NULL);

    /* granite: what llama.cpp requires, and what it would run but this engine does not */
    const char *granite[] = {"--arch", "granite", NULL};
    edit ls = {.drop_key = "granite.logit_scale"};
    expect_refusal_from(granite, &ls, KVS_ENOKEY, "missing metadata key granite.logit_scale", NULL);
    edit ls0 = {.f32_key = "granite.logit_scale", .f32_val = 0.0f};
    expect_refusal_from(granite, &ls0, KVS_EFORMAT, "granite.logit_scale is 0", NULL);
    edit ft = {.str_key = "granite.rope.scaling.finetuned", .str_val = "yes"};
    expect_refusal_from(granite, &ft, KVS_EKEYTYPE, "granite.rope.scaling.finetuned", "not a bool");
    edit grd = {.u32_key = "granite.rope.dimension_count", .u32_val = 8};
    expect_refusal_from(granite, &grd, KVS_EUNSUPPORTED, "granite.rope.dimension_count = 8",
                        "head size 16");
    edit fb = {.add_vec = "blk.1.ffn_up.bias"};
    expect_refusal_from(granite, &fb, KVS_EUNSUPPORTED, "blk.1.ffn_up.bias", "not supported");
    const char *gmoe[] = {"--arch", "granitemoe", NULL};
    edit sh = {.u32_key = "granitemoe.expert_shared_feed_forward_length", .u32_val = 64};
    expect_refusal_from(gmoe, &sh, KVS_EFORMAT, "missing tensor blk.0.ffn_gate_shexp.weight", NULL);
    const char *dense[] = {"--arch", "granite", NULL};
    edit dsh = {.u32_key = "granite.expert_shared_feed_forward_length", .u32_val = 64};
    expect_refusal_from(dense, &dsh, KVS_EUNSUPPORTED,
                        "granite.expert_shared_feed_forward_length = 64 without experts", NULL);
    const char *gsh[] = {"--arch", "granitemoe", "--shared-expert-ffn", "96", NULL};
    edit shs = {.reshape = "blk.1.ffn_down_shexp.weight"};
    expect_refusal_from(gsh, &shs, KVS_EFORMAT, "blk.1.ffn_down_shexp.weight", "expected [96, 64]");
    edit ef = {.u32_key = "granitemoe.expert_feed_forward_length", .u32_val = 64};
    expect_refusal_from(gmoe, &ef, KVS_EUNSUPPORTED, "granitemoe.expert_feed_forward_length = 64",
                        "feed_forward_length = 128");

    /* lfm2: the convolution's window, which layers convolve (head_count_kv: a file whose count
     * is one for all has attention everywhere, and a convolution layer's tensors left over), its
     * tensors; lfm2moe's gating */
    const char *lfm2[] = {"--arch", "lfm2", "--shape", "swa7", NULL};
    edit lc = {.drop_key = "lfm2.shortconv.l_cache"};
    expect_refusal_from(lfm2, &lc, KVS_ENOKEY, "missing metadata key lfm2.shortconv.l_cache", NULL);
    edit lc1 = {.u32_key = "lfm2.shortconv.l_cache", .u32_val = 1};
    expect_refusal_from(lfm2, &lc1, KVS_EFORMAT, "lfm2.shortconv.l_cache = 1", NULL);
    edit kv1 = {.u32_key = "lfm2.attention.head_count_kv", .u32_val = 2};
    expect_refusal_from(lfm2, &kv1, KVS_EUNSUPPORTED, "blk.0.shortconv.in_proj.weight",
                        "in an attention layer");
    edit cw = {.drop = "blk.3.shortconv.conv.weight"};
    expect_refusal_from(lfm2, &cw, KVS_EFORMAT, "missing tensor blk.3.shortconv.conv.weight", NULL);
    edit en = {.drop = "token_embd_norm.weight"};
    expect_refusal_from(lfm2, &en, KVS_EFORMAT, "missing tensor token_embd_norm.weight", NULL);
    const char *lmoe[] = {"--arch", "lfm2moe", "--shape", "swa7", NULL};
    edit gf = {.u32_key = "lfm2moe.expert_gating_func", .u32_val = 1};
    expect_refusal_from(lmoe, &gf, KVS_EUNSUPPORTED, "lfm2moe.expert_gating_func = 1", NULL);
    edit pb = {.drop = "blk.2.exp_probs_b.bias"};
    expect_refusal_from(lmoe, &pb, KVS_EFORMAT, "missing tensor blk.2.exp_probs_b.bias", NULL);

    /* olmo2: an output matrix of its own (llama.cpp requires it), its windows' RoPE base */
    const char *olmo2[] = {"--arch", "olmo2", "--shape", "swa7", NULL};
    edit oo = {.drop = "output.weight"};
    expect_refusal_from(olmo2, &oo, KVS_EFORMAT, "missing tensor output.weight", NULL);
    edit ob = {.f32_key = "olmo2.rope.freq_base_swa", .f32_val = 0.5f};
    expect_refusal_from(olmo2, &ob, KVS_EFORMAT, "olmo2.rope.freq_base_swa", "out of range");

    /* ernie4_5-moe: the layers' kinds come from the keys, so a key that disagrees with the
     * tensors is a refusal naming the tensor, not a layer run the other way */
    const char *emoe[] = {
        "--arch", "ernie4_5-moe", "--shape", "swa7", "--shared-expert-ffn",
        "32",     "--moe-step",   "2",       NULL}; /* experts on layers 1, 3, 5 */
    edit nostep = {.drop_key = "ernie4_5-moe.interleave_moe_layer_step"};
    expect_refusal_from(emoe, &nostep, KVS_ENOKEY,
                        "missing metadata key ernie4_5-moe.interleave_moe_layer_step", NULL);
    edit nolead = {.drop_key = "ernie4_5-moe.leading_dense_block_count"};
    expect_refusal_from(emoe, &nolead, KVS_ENOKEY,
                        "missing metadata key ernie4_5-moe.leading_dense_block_count", NULL);
    edit step0 = {.u32_key = "ernie4_5-moe.interleave_moe_layer_step", .u32_val = 0};
    expect_refusal_from(emoe, &step0, KVS_EFORMAT, "ernie4_5-moe.interleave_moe_layer_step", NULL);
    edit step1 = {.u32_key = "ernie4_5-moe.interleave_moe_layer_step", .u32_val = 1};
    expect_refusal_from(emoe, &step1, KVS_EUNSUPPORTED, "blk.2.ffn_gate.weight",
                        "(a mixture-of-experts layer)");
    edit step3 = {.u32_key = "ernie4_5-moe.interleave_moe_layer_step", .u32_val = 3};
    expect_refusal_from(emoe, &step3, KVS_EUNSUPPORTED, "blk.1.ffn_gate_inp.weight",
                        "(a dense layer)");
    edit lead2 = {.u32_key = "ernie4_5-moe.leading_dense_block_count", .u32_val = 2};
    expect_refusal_from(emoe, &lead2, KVS_EUNSUPPORTED, "blk.1.ffn_gate_inp.weight",
                        "(a dense layer)");
    edit shc = {.u32_key = "ernie4_5-moe.expert_shared_count", .u32_val = 0};
    expect_refusal_from(emoe, &shc, KVS_EFORMAT, "ernie4_5-moe.expert_shared_count = 0",
                        "expert_shared_feed_forward_length = 32");
    edit shd = {.drop = "blk.3.ffn_up_shexp.weight"};
    expect_refusal_from(emoe, &shd, KVS_EFORMAT, "missing tensor blk.3.ffn_up_shexp.weight", NULL);
    edit pbd = {.add_vec = "blk.2.exp_probs_b.bias"};
    expect_refusal_from(emoe, &pbd, KVS_EUNSUPPORTED, "blk.2.exp_probs_b.bias", "(a dense layer)");
    edit ews = {.f32_key = "ernie4_5-moe.expert_weights_scale", .f32_val = 2.0f};
    expect_refusal_from(emoe, &ews, KVS_EUNSUPPORTED, "ernie4_5-moe.expert_weights_scale",
                        "not supported");
    edit eob = {.add_vec = "blk.1.attn_output.bias"};
    expect_refusal_from(emoe, &eob, KVS_EUNSUPPORTED, "blk.1.attn_output.bias", "not supported");
    edit efe = {.drop_key = "ernie4_5-moe.expert_feed_forward_length"};
    expect_refusal_from(emoe, &efe, KVS_ENOKEY,
                        "missing metadata key ernie4_5-moe.expert_feed_forward_length", NULL);
    const char *ernie[] = {"--arch", "ernie4_5", NULL};
    edit dstep = {.u32_key = "ernie4_5.interleave_moe_layer_step", .u32_val = 1};
    expect_refusal_from(ernie, &dstep, KVS_EUNSUPPORTED, "ernie4_5.interleave_moe_layer_step",
                        "a dense family");
    edit dexp = {.u32_key = "ernie4_5.expert_count", .u32_val = 4};
    expect_refusal_from(ernie, &dexp, KVS_EUNSUPPORTED, "ernie4_5.expert_count = 4", NULL);
    edit drd = {.u32_key = "ernie4_5.rope.dimension_count", .u32_val = 8};
    expect_refusal_from(ernie, &drd, KVS_EUNSUPPORTED, "ernie4_5.rope.dimension_count = 8", NULL);
    edit dub = {.add_vec = "blk.0.ffn_up.bias"};
    expect_refusal_from(ernie, &dub, KVS_EUNSUPPORTED, "blk.0.ffn_up.bias", "not supported");
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
    /* The table rows first, each a test of its own name, then the tests written out. */
    static const struct CMUnitTest others[] = {
        cmocka_unit_test(test_reference_is_sensitive),
        cmocka_unit_test(test_gemma3_long_window),
        cmocka_unit_test(test_long_prompt_mha),
        cmocka_unit_test(test_quantized_long_prompt),
        cmocka_unit_test(test_gemma3_split_arena),
        cmocka_unit_test(test_load_releases_file_pages),
        cmocka_unit_test(test_family_reference_is_sensitive),
        cmocka_unit_test(test_refuse_family_files),
        cmocka_unit_test(test_gemma2_strong_caps),
        cmocka_unit_test(test_linear_rope_scaling),
        cmocka_unit_test(test_refuse_architecture),
        cmocka_unit_test(test_refuse_tensor_type),
        cmocka_unit_test(test_refuse_missing_tensor),
        cmocka_unit_test(test_refuse_wrong_shape),
        cmocka_unit_test(test_refuse_metadata),
    };
    enum { N_FAM = sizeof FAMILY_CASES / sizeof FAMILY_CASES[0] };
    enum { N_QUANT = sizeof QUANT_CASES / sizeof QUANT_CASES[0] };
    enum { N_OTHER = sizeof others / sizeof others[0] };
    struct CMUnitTest tests[N_FAM + N_QUANT + N_OTHER];
    size_t n = 0;
    for (size_t i = 0; i < N_FAM; i++)
        tests[n++] = (struct CMUnitTest){.name = FAMILY_CASES[i].name,
                                         .test_func = test_family,
                                         .initial_state = (void *)&FAMILY_CASES[i]};
    for (size_t i = 0; i < N_QUANT; i++)
        tests[n++] = (struct CMUnitTest){.name = QUANT_CASES[i].name,
                                         .test_func = test_quantized,
                                         .initial_state = (void *)&QUANT_CASES[i]};
    for (size_t i = 0; i < N_OTHER; i++)
        tests[n++] = others[i];
    if (n != sizeof tests / sizeof tests[0])
        return 1;
    return cmocka_run_group_tests(tests, setup, teardown);
}
