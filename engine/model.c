/* Llama-family model (architectures llama and qwen2): loading from GGUF, the KV arena, and the
 * batched forward pass.
 * F32, F16 and Q8_0 matrices keep their type and are regrouped into panels at load (BF16 is
 * widened to F32 first); norm vectors are F32. Every matrix product, from one row to a whole
 * prefill, is the kernel table's panel product (engine/kern/kern.h; the table is chosen at load
 * from CPUID or --kernels), split over output columns between the ctx's pool threads. */
#include "engine/model.h"

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/gguf.h"
#include "engine/dtype.h"
#include "engine/kern/kern.h"
#include "engine/threadpool.h"

#include <stdatomic.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct engine_arch {
    const char *name; /* general.architecture, and the prefix of its metadata keys */
    engine_rope_type rope_type;
    bool qkv_bias; /* blk.N.attn_{q,k,v}.bias may be present */
} engine_arch;

/* Limits on metadata we accept: well beyond any llama model, and small enough that every
 * size computed from them fits in size_t without overflow. */
#define MAX_LAYERS 1024u
#define MAX_EMBD 65536u
#define MAX_FF 262144u
#define MAX_HEADS 1024u
#define MAX_VOCAB 1048576u
#define MAX_CTX (1u << 20)

typedef struct layer_weights {
    const float *attn_norm; /* (n_embd) */
    kern_mat wq;            /* (n_head * head_dim, n_embd): row-major out x in */
    kern_mat wk;            /* (n_head_kv * head_dim, n_embd) */
    kern_mat wv;            /* (n_head_kv * head_dim, n_embd) */
    const float *bq;        /* (n_head * head_dim) or NULL: qwen2's projection biases */
    const float *bk;        /* (n_head_kv * head_dim) or NULL */
    const float *bv;        /* (n_head_kv * head_dim) or NULL */
    kern_mat wo;            /* (n_embd, n_head * head_dim) */
    const float *ffn_norm;  /* (n_embd) */
    kern_mat w_gate;        /* (n_ff, n_embd) */
    kern_mat w_up;          /* (n_ff, n_embd) */
    kern_mat w_down;        /* (n_embd, n_ff) */
} layer_weights;

struct engine_model {
    engine_hparams hp;
    const engine_arch *arch;
    const float *rope_freqs; /* (n_rot / 2) or NULL: Llama 3.1 frequency divisors */
    gguf_file *file;
    tok_vocab *vocab;
    char *name;
    char *chat_template;
    kern_mat tok_embd;        /* (n_vocab, n_embd) */
    const float *output_norm; /* (n_embd) */
    kern_mat output;          /* (n_vocab, n_embd), token_embd when tied */
    layer_weights *layers;
    uint32_t weight_type;
    uint64_t n_params;
    uint64_t weight_bytes;
    void **owned; /* widened copies (norm vectors, BF16 matrices) and panel-layout weights */
    size_t n_owned;
    const kern_ops *kern; /* the kernel table every product and vector helper goes through */
};

static int set_err(char *err, size_t len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int set_err(char *err, size_t len, int status, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static int get_u32_key(const engine_model *m, const char *key, uint32_t *out, bool required,
                       uint32_t lo, uint32_t hi, char *err, size_t err_len)
{
    int rc = gguf_get_u32(m->file, key, out);
    if (rc == KVS_ENOKEY && !required)
        return 0;
    if (rc == KVS_ENOKEY)
        return set_err(err, err_len, rc, "missing metadata key %s", key);
    if (rc)
        return set_err(err, err_len, rc, "metadata key %s is not an unsigned integer", key);
    if (*out < lo || *out > hi)
        return set_err(err, err_len, KVS_EFORMAT, "metadata %s = %u is outside %u..%u", key, *out,
                       lo, hi);
    return 0;
}

/* Finds tensor name with exactly the ggml dims {d0, d1} (d1 = 1 for vectors) and returns its
 * data as F32, widening F16/BF16/Q8_0 into an owned copy. With mat, F32/F16/Q8_0 data is
 * returned in place in *mat instead (and only BF16 is widened). */
static int load_tensor_as(engine_model *m, const char *name, uint64_t d0, uint64_t d1,
                          bool required, const float **out, kern_mat *mat, char *err,
                          size_t err_len)
{
    *out = NULL;
    int64_t i = gguf_find_tensor(m->file, name);
    if (i < 0) {
        if (!required)
            return 0;
        return set_err(err, err_len, KVS_EFORMAT, "missing tensor %s", name);
    }
    const gguf_tensor *t = gguf_tensor_at(m->file, i);
    if (t->dims[0] != d0 || t->dims[1] != d1 || t->dims[2] != 1 || t->dims[3] != 1)
        return set_err(err, err_len, KVS_EFORMAT,
                       "tensor %s has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu]", name,
                       (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                       (unsigned long long)t->dims[2], (unsigned long long)t->dims[3],
                       (unsigned long long)d0, (unsigned long long)d1);
    m->n_params += t->n_elements;
    m->weight_bytes += t->n_bytes;
    if (t->type == GGML_TYPE_Q8_0 && d0 % QK8_0)
        return set_err(err, err_len, KVS_EFORMAT, "Q8_0 tensor %s has rows of %llu values", name,
                       (unsigned long long)d0);
    if (mat &&
        (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0)) {
        kern_type kt = t->type == GGML_TYPE_F32   ? KERN_F32
                       : t->type == GGML_TYPE_F16 ? KERN_F16
                                                  : KERN_Q8_0;
        kern_mat_init(mat, kt, t->data, d1, d0);
        *out = t->data;
        return 0;
    }
    if (t->type == GGML_TYPE_F32) {
        *out = t->data;
        return 0;
    }
    const dtype_info *dt = dtype_get(t->type);
    if (!dt || !dt->loadable)
        return set_err(err, err_len, KVS_EUNSUPPORTED, "tensor %s has type %s; supported: %s", name,
                       dtype_name(t->type), dtype_supported_list());
    float *dst = malloc(t->n_elements * sizeof *dst);
    void **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
    if (!dst || !owned) {
        free(dst);
        if (owned)
            m->owned = owned;
        return set_err(err, err_len, KVS_ENOMEM, "out of memory widening %s", name);
    }
    m->owned = owned;
    m->owned[m->n_owned++] = dst;
    dt->to_f32(t->data, dst, t->n_elements);
    *out = dst;
    if (mat)
        kern_mat_init(mat, KERN_F32, dst, d1, d0);
    return 0;
}

static int load_tensor(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                       const float **out, char *err, size_t err_len)
{
    return load_tensor_as(m, name, d0, d1, required, out, NULL, err, err_len);
}

static int load_mat(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                    kern_mat *out, char *err, size_t err_len)
{
    const float *p;
    return load_tensor_as(m, name, d0, d1, required, &p, out, err, err_len);
}

/* Architectures the forward pass implements: both are the llama block (RMSNorm, GQA
 * attention with RoPE, SwiGLU MLP); they differ in the RoPE pairing their converters lay Q/K
 * out for (llama.cpp's llama_model_rope_type: llama NORM, qwen2 NEOX) and qwen2's Q/K/V biases. */
static const engine_arch ARCHS[] = {
    {"llama", ENGINE_ROPE_NORM, false},
    {"qwen2", ENGINE_ROPE_NEOX, true},
};

/* Metadata key "<arch>.<suffix>" into buf. */
static const char *arch_key(const engine_model *m, const char *suffix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", m->arch->name, suffix);
    return buf;
}

static int get_arch_u32(const engine_model *m, const char *suffix, uint32_t *out, bool required,
                        uint32_t lo, uint32_t hi, char *err, size_t err_len)
{
    char key[128];
    return get_u32_key(m, arch_key(m, suffix, key, sizeof key), out, required, lo, hi, err,
                       err_len);
}

static int get_arch_f32(const engine_model *m, const char *suffix, float *out, char *err,
                        size_t err_len)
{
    char key[128];
    int rc = gguf_get_f32(m->file, arch_key(m, suffix, key, sizeof key), out);
    if (rc && rc != KVS_ENOKEY)
        return set_err(err, err_len, rc, "metadata key %s is not a float", key);
    return 0;
}

/* <arch>.rope.scaling.type: none, or linear (positions divided by rope.scaling.factor, as
 * llama.cpp's freq_scale); YaRN and LongRoPE change attention itself and are refused. */
static int load_rope_scaling(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    char key[128];
    const char *type = "linear";
    size_t type_len = 6;
    int rc =
        gguf_get_str(m->file, arch_key(m, "rope.scaling.type", key, sizeof key), &type, &type_len);
    if (rc && rc != KVS_ENOKEY)
        return set_err(err, err_len, rc, "metadata key %s is not a string", key);
    float factor = 0.0f;
    if ((rc = get_arch_f32(m, "rope.scaling.factor", &factor, err, err_len)))
        return rc;
    if (factor == 0.0f && (rc = get_arch_f32(m, "rope.scale_linear", &factor, err, err_len)))
        return rc;
    /* As llama.cpp, the factor applies whether the type says none or linear. */
    if (!(type_len == 4 && !memcmp(type, "none", 4)) &&
        !(type_len == 6 && !memcmp(type, "linear", 6)))
        return set_err(err, err_len, KVS_EUNSUPPORTED,
                       "rope scaling type '%.*s' is not supported (supported: none, linear)",
                       (int)type_len, type);
    if (factor == 0.0f)
        factor = 1.0f;
    if (!(factor >= 1e-3f && factor <= 1e3f))
        return set_err(err, err_len, KVS_EFORMAT, "rope scaling factor %g out of range",
                       (double)factor);
    hp->rope_freq_scale = 1.0f / factor;
    return 0;
}

static int load_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    const char *arch;
    size_t arch_len;
    int rc = gguf_get_str(m->file, "general.architecture", &arch, &arch_len);
    if (rc)
        return set_err(err, err_len, rc, "general.architecture: %s", status_str(rc));
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strlen(ARCHS[i].name) == arch_len && !memcmp(ARCHS[i].name, arch, arch_len))
            m->arch = &ARCHS[i];
    if (!m->arch)
        return set_err(err, err_len, KVS_EUNSUPPORTED,
                       "architecture '%.*s' is not supported (supported: llama, qwen2)",
                       (int)(arch_len > 64 ? 64 : arch_len), arch);
    hp->arch = m->arch->name;
    hp->rope_type = m->arch->rope_type;
    if ((rc =
             get_arch_u32(m, "context_length", &hp->n_ctx_train, true, 1, MAX_CTX, err, err_len)) ||
        (rc = get_arch_u32(m, "embedding_length", &hp->n_embd, true, 1, MAX_EMBD, err, err_len)) ||
        (rc = get_arch_u32(m, "block_count", &hp->n_layer, true, 1, MAX_LAYERS, err, err_len)) ||
        (rc = get_arch_u32(m, "feed_forward_length", &hp->n_ff, true, 1, MAX_FF, err, err_len)) ||
        (rc = get_arch_u32(m, "attention.head_count", &hp->n_head, true, 1, MAX_HEADS, err,
                           err_len)))
        return rc;
    /* Mixtral-style files say llama but hold expert tensors (ffn_*_exps) instead of one MLP. */
    uint32_t n_expert = 0;
    if ((rc = get_arch_u32(m, "expert_count", &n_expert, false, 0, UINT32_MAX, err, err_len)))
        return rc;
    if (n_expert > 0)
        return set_err(err, err_len, KVS_EUNSUPPORTED,
                       "mixture of experts (%s.expert_count = %u) is not supported", hp->arch,
                       n_expert);
    hp->n_head_kv = hp->n_head;
    if ((rc = get_arch_u32(m, "attention.head_count_kv", &hp->n_head_kv, false, 1, hp->n_head, err,
                           err_len)))
        return rc;
    if (hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv)
        return set_err(err, err_len, KVS_EFORMAT,
                       "embedding_length %u, head_count %u, head_count_kv %u do not divide",
                       hp->n_embd, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    /* Heads wider or narrower than n_embd / n_head (Gemma-style) need a different Q/O shape. */
    static const char *const head_keys[] = {"attention.key_length", "attention.value_length"};
    for (size_t i = 0; i < 2; i++) {
        uint32_t len = hp->head_dim;
        if ((rc = get_arch_u32(m, head_keys[i], &len, false, 1, MAX_EMBD, err, err_len)))
            return rc;
        if (len != hp->head_dim)
            return set_err(err, err_len, KVS_EUNSUPPORTED,
                           "%s.%s = %u differs from embedding_length / head_count = %u (not "
                           "supported)",
                           hp->arch, head_keys[i], len, hp->head_dim);
    }
    hp->n_rot = hp->head_dim;
    if ((rc = get_arch_u32(m, "rope.dimension_count", &hp->n_rot, false, 2, hp->head_dim, err,
                           err_len)))
        return rc;
    if (hp->n_rot % 2)
        return set_err(err, err_len, KVS_EFORMAT, "rope.dimension_count %u is odd", hp->n_rot);
    hp->rms_eps = 1e-5f;
    if ((rc = get_arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, err_len)))
        return rc;
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1))
        return set_err(err, err_len, KVS_EFORMAT, "rms epsilon %g out of range",
                       (double)hp->rms_eps);
    hp->rope_base = 10000.0f;
    if ((rc = get_arch_f32(m, "rope.freq_base", &hp->rope_base, err, err_len)))
        return rc;
    if (!(hp->rope_base > 1 && hp->rope_base < 1e12f))
        return set_err(err, err_len, KVS_EFORMAT, "rope.freq_base %g out of range",
                       (double)hp->rope_base);
    return load_rope_scaling(m, err, err_len);
}

static int load_weights(engine_model *m, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff,
             V = hp->n_vocab;
    int rc;
    uint32_t n_vocab_key = hp->n_vocab;
    if ((rc = get_arch_u32(m, "vocab_size", &n_vocab_key, false, 1, MAX_VOCAB, err, err_len)))
        return rc;
    if (n_vocab_key != hp->n_vocab)
        return set_err(err, err_len, KVS_EFORMAT,
                       "%s.vocab_size = %u but the tokenizer has %u tokens", hp->arch, n_vocab_key,
                       hp->n_vocab);
    if ((rc = load_mat(m, "token_embd.weight", E, V, true, &m->tok_embd, err, err_len)) ||
        (rc = load_tensor(m, "output_norm.weight", E, 1, true, &m->output_norm, err, err_len)) ||
        (rc = load_mat(m, "output.weight", E, V, false, &m->output, err, err_len)))
        return rc;
    if (!m->output.data)
        m->output = m->tok_embd; /* tied embeddings */
    if ((rc = load_tensor(m, "rope_freqs.weight", hp->n_rot / 2, 1, false, &m->rope_freqs, err,
                          err_len)))
        return rc;
    for (uint32_t j = 0; m->rope_freqs && j < hp->n_rot / 2; j++)
        if (!(m->rope_freqs[j] > 0 && m->rope_freqs[j] < 1e30f)) /* a divisor: finite, > 0 */
            return set_err(err, err_len, KVS_EFORMAT, "rope_freqs.weight[%u] = %g is not positive",
                           j, (double)m->rope_freqs[j]);
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return set_err(err, err_len, KVS_ENOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        layer_weights *w = &m->layers[l];
        struct {
            const char *suffix;
            uint64_t d0, d1;
            const float **vec;
            kern_mat *mat;
        } spec[] = {
            {"attn_norm.weight", E, 1, &w->attn_norm, NULL},
            {"attn_q.weight", E, E, NULL, &w->wq},
            {"attn_k.weight", E, KV, NULL, &w->wk},
            {"attn_v.weight", E, KV, NULL, &w->wv},
            {"attn_output.weight", E, E, NULL, &w->wo},
            {"ffn_norm.weight", E, 1, &w->ffn_norm, NULL},
            {"ffn_gate.weight", E, F, NULL, &w->w_gate},
            {"ffn_up.weight", E, F, NULL, &w->w_up},
            {"ffn_down.weight", F, E, NULL, &w->w_down},
        };
        for (size_t k = 0; k < sizeof spec / sizeof spec[0]; k++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, spec[k].suffix);
            rc = spec[k].vec
                     ? load_tensor(m, name, spec[k].d0, spec[k].d1, true, spec[k].vec, err, err_len)
                     : load_mat(m, name, spec[k].d0, spec[k].d1, true, spec[k].mat, err, err_len);
            if (rc)
                return rc;
        }
        /* Biases are optional even for qwen2 (llama.cpp's TENSOR_NOT_REQUIRED); for llama a
         * stray bias would be silently ignored by llama.cpp too, so only qwen2 reads them. */
        if (!m->arch->qkv_bias)
            continue;
        struct {
            const char *suffix;
            uint64_t d0;
            const float **vec;
        } bias[] = {
            {"attn_q.bias", E, &w->bq},
            {"attn_k.bias", KV, &w->bk},
            {"attn_v.bias", KV, &w->bv},
        };
        for (size_t k = 0; k < sizeof bias / sizeof bias[0]; k++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, bias[k].suffix);
            if ((rc = load_tensor(m, name, bias[k].d0, 1, false, bias[k].vec, err, err_len)))
                return rc;
        }
    }
    int64_t q = gguf_find_tensor(m->file, "blk.0.attn_q.weight");
    m->weight_type = gguf_tensor_at(m->file, q)->type;
    return 0;
}

/* Load progress over the tensor bytes, logged once a second once loading has taken more than a
 * second (multi-GB files on a cold cache). */
typedef struct load_progress {
    const engine_model *m;
    bool verbose;
    uint64_t done, total;
    double t0, last;
} load_progress;

static void progress_add(load_progress *lp, uint64_t bytes)
{
    lp->done += bytes;
    double now = time_now_s();
    if (lp->verbose && now - lp->t0 > 1.0 && now - lp->last >= 1.0) {
        log_info("loading %s: %.0f%% of %.0f MiB", lp->m->name,
                 100.0 * (double)lp->done / (double)lp->total,
                 (double)lp->total / (1024.0 * 1024.0));
        lp->last = now;
    }
}

/* Every weight matrix (F32, F16 or Q8_0) is copied once into the panel layout of kern/kern.h,
 * the only layout the products take, and its file pages released at once (so loading never
 * holds a matrix twice for long): a batched product converts each weight once per tile of 6
 * rows, and its results do not depend on the batch. The embedding table too, so that a tied
 * output projection (which is that table) is batch-invariant like the rest; a lookup gathers
 * one row from it. Sources of the copies go to released[] (at most n_layer * 7 + 2). */
static int repack_weights(engine_model *m, load_progress *lp, const void **released,
                          size_t *n_released, char *err, size_t err_len)
{
    *n_released = 0;
    bool tied = m->output.data == m->tok_embd.data;
    size_t n_mats = (size_t)m->hp.n_layer * 7 + 2;
    for (size_t i = 0; i < n_mats; i++) {
        kern_mat *mat;
        if (i == 0) {
            mat = &m->tok_embd;
        } else if (i + 1 == n_mats) {
            if (tied) {
                m->output = m->tok_embd; /* the same copy serves both */
                break;
            }
            mat = &m->output;
        } else {
            layer_weights *w = &m->layers[(i - 1) / 7];
            kern_mat *mats[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
            mat = mats[(i - 1) % 7];
        }
        size_t bytes = kern_panel_bytes(mat);
        if (!bytes)
            continue;
        void *dst = malloc(bytes);
        void **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
        if (!dst || !owned) {
            free(dst);
            if (owned)
                m->owned = owned;
            return set_err(err, err_len, KVS_ENOMEM, "out of memory repacking weights");
        }
        m->owned = owned;
        m->owned[m->n_owned++] = dst;
        const void *src = mat->data;
        size_t src_bytes = mat->n_out * mat->row_bytes;
        kern_mat_to_panels(mat, dst, mat);
        gguf_release(m->file, src, src_bytes);
        released[(*n_released)++] = src;
        progress_add(lp, src_bytes);
    }
    return 0;
}

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Reads one byte of every page of every tensor not copied by repack_weights, so the first
 * request does not pay for page faults (from disk, for a file not in the page cache) in the
 * middle of a step. */
static void prefault_weights(const engine_model *m, load_progress *lp, const void *const *released,
                             size_t n_released)
{
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->file); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->file, i);
        bool copied = false;
        for (size_t r = 0; r < n_released && !copied; r++)
            copied = released[r] == t->data;
        if (copied)
            continue;
        const uint8_t *p = t->data;
        for (uint64_t off = 0; off < t->n_bytes; off += 4096) {
            sink ^= p[off];
            if ((off & ((64u << 20) - 1)) == 0 && off)
                progress_add(lp, 64u << 20);
        }
        progress_add(lp, t->n_bytes & ((64u << 20) - 1));
    }
    (void)sink;
}

int engine_model_load(const char *path, const engine_load_params *p, engine_model **out, char *err,
                      size_t err_len)
{
    *out = NULL;
    double t0 = time_now_s();
    engine_model *m = calloc(1, sizeof *m);
    if (!m)
        return set_err(err, err_len, KVS_ENOMEM, "out of memory");
    int rc = kern_select(p ? p->kernels : NULL, &m->kern, err, err_len);
    if (rc)
        goto fail;
    if ((rc = gguf_open(path, &m->file, err, err_len)))
        goto fail;
    if ((rc = load_hparams(m, err, err_len)))
        goto fail;
    if ((rc = tok_create_from_gguf(m->file, &m->vocab, err, err_len)))
        goto fail;
    m->hp.n_vocab = (uint32_t)tok_n_vocab(m->vocab);
    if (m->hp.n_vocab == 0 || m->hp.n_vocab > MAX_VOCAB) {
        rc = set_err(err, err_len, KVS_EFORMAT, "vocabulary of %u tokens", m->hp.n_vocab);
        goto fail;
    }
    if ((rc = load_weights(m, err, err_len)))
        goto fail;
    const char *s;
    size_t n;
    /* The file's base name identifies the model to clients (general.name is often generic,
     * e.g. "llama"), as vLLM names a model by its path. */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    m->name = dup_str(base, n);
    if (gguf_get_str(m->file, "tokenizer.chat_template", &s, &n) == 0)
        m->chat_template = dup_str(s, n);
    if (!m->name) {
        rc = set_err(err, err_len, KVS_ENOMEM, "out of memory");
        goto fail;
    }
    load_progress lp = {.m = m, .verbose = !p || p->verbose, .t0 = t0, .last = t0};
    for (int64_t i = 0; i < gguf_n_tensors(m->file); i++)
        lp.total += gguf_tensor_at(m->file, i)->n_bytes;
    size_t n_released;
    const void **released = malloc(((size_t)m->hp.n_layer * 7 + 2) * sizeof *released);
    if (!released) {
        rc = set_err(err, err_len, KVS_ENOMEM, "out of memory");
        goto fail;
    }
    rc = repack_weights(m, &lp, released, &n_released, err, err_len);
    if (!rc)
        prefault_weights(m, &lp, released, n_released);
    free(released);
    if (rc)
        goto fail;
    if (!p || p->verbose) {
        const engine_hparams *hp = &m->hp;
        log_info("model %s: %s, %u layers, dim %u, %u heads (%u kv), head_dim %u, ffn %u, "
                 "vocab %u, ctx %u; %.2fM params, %s weights %.1f MiB; loaded in %.3f s",
                 m->name, hp->arch, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv,
                 hp->head_dim, hp->n_ff, hp->n_vocab, hp->n_ctx_train, (double)m->n_params / 1e6,
                 ggml_type_name(m->weight_type), (double)m->weight_bytes / (1024.0 * 1024.0),
                 time_now_s() - t0);
        log_info("kernels: %s (%s; CPU: %s)", m->kern->name,
                 p && p->kernels && *p->kernels && strcmp(p->kernels, "auto")
                     ? "forced by --kernels"
                     : "chosen from CPUID",
                 kern_cpu_features());
    }
    *out = m;
    return 0;
fail:
    engine_model_destroy(m);
    return rc;
}

void engine_model_destroy(engine_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->name);
    free(m->chat_template);
    tok_destroy(m->vocab);
    gguf_close(m->file);
    free(m);
}

const engine_hparams *engine_model_hparams(const engine_model *m)
{
    return &m->hp;
}
const tok_vocab *engine_model_vocab(const engine_model *m)
{
    return m->vocab;
}
const char *engine_model_name(const engine_model *m)
{
    return m->name;
}
const char *engine_model_chat_template(const engine_model *m)
{
    return m->chat_template;
}
const char *engine_model_kernels(const engine_model *m)
{
    return m->kern->name;
}

int engine_kernels_check(const char *name, char *err, size_t err_len)
{
    const kern_ops *k;
    return kern_select(name, &k, err, err_len);
}

const char *engine_model_weight_type(const engine_model *m)
{
    return ggml_type_name(m->weight_type);
}
uint64_t engine_model_n_params(const engine_model *m)
{
    return m->n_params;
}

/* ---------------------------------------------------------------- KV arena */

struct engine_kv {
    engine_kv_type type;
    uint32_t n_blocks, block_size, n_layer, kv_dim;
    size_t esz;          /* bytes per value: 2 (F16) or 4 (F32) */
    size_t layer_stride; /* values per layer per K (or V): n_blocks * block_size * kv_dim */
    uint8_t *k;          /* (n_layer, n_slots, kv_dim) */
    uint8_t *v;          /* (n_layer, n_slots, kv_dim) */
};

int engine_kv_type_parse(const char *s)
{
    return !strcmp(s, "f16") ? ENGINE_KV_F16 : !strcmp(s, "f32") ? ENGINE_KV_F32 : -1;
}

const char *engine_kv_type_name(engine_kv_type t)
{
    return t == ENGINE_KV_F16 ? "f16" : "f32";
}

static size_t kv_esz(engine_kv_type type)
{
    return type == ENGINE_KV_F16 ? 2 : 4;
}

size_t engine_kv_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size)
{
    const engine_hparams *hp = &m->hp;
    return (size_t)2 * hp->n_layer * block_size * hp->n_head_kv * hp->head_dim * kv_esz(type);
}

int engine_kv_create(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                     uint32_t block_size, engine_kv **out)
{
    *out = NULL;
    if (n_blocks == 0 || block_size == 0 || (uint64_t)n_blocks * block_size > (1ull << 32) ||
        (type != ENGINE_KV_F16 && type != ENGINE_KV_F32))
        return KVS_EINVAL;
    engine_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return KVS_ENOMEM;
    kv->type = type;
    kv->esz = kv_esz(type);
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_layer = m->hp.n_layer;
    kv->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    kv->layer_stride = (size_t)n_blocks * block_size * kv->kv_dim;
    size_t total = kv->layer_stride * kv->n_layer;
    kv->k = calloc(total, kv->esz);
    kv->v = calloc(total, kv->esz);
    if (!kv->k || !kv->v) {
        engine_kv_destroy(kv);
        return KVS_ENOMEM;
    }
    *out = kv;
    return 0;
}

void engine_kv_destroy(engine_kv *kv)
{
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

void engine_kv_copy_block(engine_kv *kv, int32_t src, int32_t dst)
{
    size_t blk = (size_t)kv->block_size * kv->kv_dim * kv->esz;
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        size_t base = l * kv->layer_stride * kv->esz;
        memcpy(kv->k + base + (size_t)dst * blk, kv->k + base + (size_t)src * blk, blk);
        memcpy(kv->v + base + (size_t)dst * blk, kv->v + base + (size_t)src * blk, blk);
    }
}

/* ---------------------------------------------------------------- forward */

/* Attention work units: positions per item and items per pool job (see attention()). */
#define ATTN_SPAN 128
#define ATTN_WAVE 256

struct engine_ctx {
    const engine_model *m;
    uint32_t max_tokens;
    uint32_t n_threads;
    tpool *pool;
    const kern_ops *kern; /* the model's kernel table */
    float *x;             /* (max_tokens, n_embd) residual stream */
    float *xn;            /* (max_tokens, n_embd) normed input of a sublayer */
    float *q;             /* (max_tokens, n_embd) */
    float *k;             /* (max_tokens, kv_dim) */
    float *v;             /* (max_tokens, kv_dim) */
    float *att;           /* (max_tokens, n_embd) attention output before wo */
    float *gate;          /* (max_tokens, n_ff) */
    float *up;            /* (max_tokens, n_ff) */
    float *scores;        /* (n_threads, n_head, ATTN_SPAN) each thread's attention weights */
    float *attn_part;     /* (ATTN_WAVE, n_head, head_dim + 2) a wave's span results */
    float *attn_state;    /* (max_tokens, n_head, head_dim + 2) each row's spans folded so far */
    uint32_t *attn_first; /* (max_tokens + 1) first attention item of each row */
    float *tile;          /* (n_threads, tile_floats) a Q8_0 panel widened for several row tiles */
    size_t tile_floats;   /* KERN_PANEL * max(n_embd, n_ff) */
    int32_t *slot;        /* (max_tokens) arena slot of each row */
    float *rope_inv_freq; /* (n_rot / 2) base^(-2j/n_rot) */
    float *rope_cs;       /* (max_tokens, n_rot / 2, 2) cos, sin of each row's angles */
};

int engine_ctx_create(const engine_model *m, uint32_t max_tokens, uint32_t n_threads,
                      engine_ctx **out)
{
    *out = NULL;
    if (max_tokens == 0 || max_tokens > 65536 || n_threads > 1024)
        return KVS_EINVAL;
    engine_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return KVS_ENOMEM;
    const engine_hparams *hp = &m->hp;
    size_t T = max_tokens, E = hp->n_embd, KV = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    c->m = m;
    c->max_tokens = max_tokens;
    c->n_threads = n_threads ? n_threads : 1;
    c->kern = m->kern;
    size_t max_in = E > F ? E : F;
    c->tile_floats = KERN_PANEL * max_in;
    c->x = malloc(T * E * sizeof(float));
    c->xn = malloc(T * E * sizeof(float));
    c->q = malloc(T * E * sizeof(float));
    c->k = malloc(T * KV * sizeof(float));
    c->v = malloc(T * KV * sizeof(float));
    c->att = malloc(T * E * sizeof(float));
    c->gate = malloc(T * F * sizeof(float));
    c->up = malloc(T * F * sizeof(float));
    c->slot = malloc(T * sizeof(int32_t));
    size_t part = (size_t)hp->n_head * (hp->head_dim + 2);
    c->scores = malloc(c->n_threads * hp->n_head * ATTN_SPAN * sizeof(float));
    c->attn_part = malloc(ATTN_WAVE * part * sizeof(float));
    c->attn_state = malloc(T * part * sizeof(float));
    c->attn_first = malloc((T + 1) * sizeof(uint32_t));
    c->rope_inv_freq = malloc(hp->n_rot / 2 * sizeof(float));
    c->rope_cs = malloc(T * hp->n_rot * sizeof(float));
    c->tile = malloc(c->n_threads * c->tile_floats * sizeof(float));
    if (!c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->gate || !c->up || !c->slot ||
        !c->rope_inv_freq || !c->rope_cs || !c->tile || !c->scores || !c->attn_part ||
        !c->attn_state || !c->attn_first || tpool_create(c->n_threads, &c->pool)) {
        engine_ctx_destroy(c);
        return KVS_ENOMEM;
    }
    /* Angle of pair j at position p: p * freq_scale * base^(-2j/n_rot) / freq_factor[j], as
     * ggml_rope_ext with freq_factors and no YaRN extrapolation. */
    for (uint32_t j = 0; j < hp->n_rot / 2; j++) {
        float f = powf(hp->rope_base, -(float)(2 * j) / (float)hp->n_rot) * hp->rope_freq_scale;
        c->rope_inv_freq[j] = m->rope_freqs ? f / m->rope_freqs[j] : f;
    }
    *out = c;
    return 0;
}

void engine_ctx_destroy(engine_ctx *c)
{
    if (!c)
        return;
    tpool_destroy(c->pool);
    free(c->x);
    free(c->xn);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->gate);
    free(c->up);
    free(c->scores);
    free(c->attn_part);
    free(c->attn_state);
    free(c->attn_first);
    free(c->tile);
    free(c->slot);
    free(c->rope_inv_freq);
    free(c->rope_cs);
    free(c);
}

static void rmsnorm_rows(const engine_ctx *c, float *out, const float *x, const float *w,
                         size_t rows, size_t n, float eps)
{
    for (size_t r = 0; r < rows; r++)
        c->kern->rmsnorm(out + r * n, x + r * n, w, n, eps);
}

#define MM_MAX 3 /* matrices one job can multiply the same input by (Q, K, V) */

typedef struct matmul_job {
    engine_ctx *c;
    const float *in;
    size_t rows;
    uint32_t n_mats;
    const kern_mat *w[MM_MAX];
    float *out[MM_MAX];
    size_t chunk[MM_MAX];            /* output columns per work item */
    uint32_t first_item[MM_MAX + 1]; /* items of matrix m: [first_item[m], first_item[m+1]) */
    bool silu_pair;   /* an item covers the same columns of w[0] and w[1] (gate and up), then
                         out[0] = silu(out[0]) * out[1] on them */
    atomic_uint next; /* next work item */
} matmul_job;

/* Columns [n0, n0 + chunk) of matrix m. */
static void matmul_chunk(const matmul_job *j, uint32_t m, size_t n0, float *tile)
{
    const kern_mat *w = j->w[m];
    size_t N = w->n_out, K = w->n_in;
    size_t cnt = N - n0 < j->chunk[m] ? N - n0 : j->chunk[m];
    j->c->kern->matmul(w, j->in, j->rows, K, j->out[m], N, n0, n0 + cnt, tile);
}

/* Threads take chunks of output columns from a shared counter, so a thread the OS preempts
 * (the cores are shared) delays the step by one chunk, not by its whole share. Chunk
 * boundaries depend only on the matrix and the batch size, never on the thread count or on
 * which thread took a chunk, so a batch gives the same bits on every run. */
static void matmul_worker(void *arg, uint32_t ith, uint32_t nth)
{
    (void)nth;
    matmul_job *j = arg;
    float *tile = j->c->tile + ith * j->c->tile_floats;
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->first_item[j->n_mats])
            return;
        uint32_t m = 0;
        while (i >= j->first_item[m + 1])
            m++;
        size_t n0 = (size_t)(i - j->first_item[m]) * j->chunk[m];
        matmul_chunk(j, m, n0, tile);
        if (!j->silu_pair)
            continue;
        matmul_chunk(j, 1, n0, tile);
        size_t N = j->w[0]->n_out, cnt = N - n0 < j->chunk[0] ? N - n0 : j->chunk[0];
        for (size_t t = 0; t < j->rows; t++)
            kern_silu_mul(j->out[0] + t * N + n0, j->out[1] + t * N + n0, cnt);
    }
}

/* Below this many multiply-adds a job runs on the calling thread alone: waking the pool costs
 * microseconds when the other core is idle and a whole scheduler time slice when another
 * process holds it, which for a tiny model's matrices is far more than the work. Results do
 * not change: chunks are the same whichever thread takes them. */
#define PARALLEL_MIN_MACS (1u << 17)

static void run_job(engine_ctx *c, void (*fn)(void *, uint32_t, uint32_t), void *arg, uint64_t macs)
{
    if (macs < PARALLEL_MIN_MACS)
        fn(arg, 0, 1);
    else
        tpool_run(c->pool, fn, arg);
}

/* out[m] (rows, w[m]->n_out) = in (rows, n_in) * w[m]^T for the n matrices, in one pool job
 * (one hand-off instead of n). With silu_pair (n = 2, same shapes) out[0] becomes
 * silu(out[0]) * out[1], computed on each chunk as soon as both products have it. */
static void matmuls(engine_ctx *c, const float *in, size_t rows, uint32_t n,
                    const kern_mat *const *w, float *const *out, bool silu_pair)
{
    matmul_job j = {.c = c, .in = in, .rows = rows, .n_mats = n, .silu_pair = silu_pair};
    uint64_t macs = 0;
    for (uint32_t m = 0; m < n; m++) {
        /* Items of 64 columns: four panels, a few KB of weights per row of K. */
        const kern_mat *wm = w[m];
        j.w[m] = wm;
        j.out[m] = out[m];
        j.chunk[m] = 64;
        uint32_t items = (uint32_t)((wm->n_out + j.chunk[m] - 1) / j.chunk[m]);
        j.first_item[m + 1] = silu_pair ? items : j.first_item[m] + items;
        macs += (uint64_t)rows * wm->n_out * wm->n_in;
    }
    atomic_init(&j.next, 0);
    run_job(c, matmul_worker, &j, macs);
}

/* out (rows, n_out) = in (rows, n_in) * W^T. */
static void matmul(engine_ctx *c, float *out, const float *in, const kern_mat *w, size_t rows)
{
    matmuls(c, in, rows, 1, &w, &out, false);
}

/* Rotates pair j of each head's first n_rot dimensions by the row's angle pos * inv_freq[j]:
 * NORM pairs (x[2j], x[2j+1]) (llama, whose converter permutes Q and K for it), NEOX pairs
 * (x[j], x[j + n_rot/2]) (qwen2, Hugging Face layout). Dimensions past n_rot pass through. cs
 * holds (cos, sin) of each angle, computed once per step instead of once per layer. */
static void rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot,
                 engine_rope_type type, const float *cs)
{
    uint32_t half = n_rot / 2;
    uint32_t stride = type == ENGINE_ROPE_NEOX ? 1 : 2; /* index step between pairs */
    uint32_t off = type == ENGINE_ROPE_NEOX ? half : 1; /* partner's offset in the pair */
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = x + (size_t)h * head_dim;
        for (uint32_t j = 0; j < half; j++) {
            float *a = p + j * stride, *b = a + off;
            float xa = *a, xb = *b, co = cs[2 * j], sn = cs[2 * j + 1];
            *a = xa * co - xb * sn;
            *b = xa * sn + xb * co;
        }
    }
}

static int validate_batch(engine_ctx *c, const engine_kv *kv, const engine_batch *b)
{
    if (b->n_tokens == 0 || b->n_tokens > c->max_tokens)
        return KVS_EINVAL;
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        if (b->token[t] < 0 || (uint32_t)b->token[t] >= c->m->hp.n_vocab || b->pos[t] < 0 ||
            b->seq[t] < 0 || (uint32_t)b->seq[t] >= b->n_seqs)
            return KVS_EINVAL;
        const engine_seq_view *s = &b->seqs[b->seq[t]];
        uint32_t bi = (uint32_t)b->pos[t] / kv->block_size;
        if (bi >= s->n_blocks)
            return KVS_EINVAL;
        for (uint32_t i = 0; i <= bi; i++)
            if (s->blocks[i] < 0 || (uint32_t)s->blocks[i] >= kv->n_blocks)
                return KVS_EINVAL;
        c->slot[t] = s->blocks[bi] * (int32_t)kv->block_size +
                     (int32_t)((uint32_t)b->pos[t] % kv->block_size);
    }
    return 0;
}

/* Attention runs in items of one row and one span of ATTN_SPAN positions, with every head:
 * each item streams its positions' cache rows (all kv heads of a position are contiguous) once
 * for keys and once for values, and leaves per head the span's max score m, its sum of
 * exp(score - m) l and its exp-weighted sum of values o. A row's spans are then folded in
 * order (the merge of flash-decoding) and the row's output is o / l. Spans are fixed cuts of
 * the position range, so a row's arithmetic depends on its length alone, never on the batch,
 * the thread count or the wave sizes: cached decoding and a full recomputation give the same
 * bits. A long sequence decoding alone still spreads over every core. Items run in waves of
 * ATTN_WAVE, so the scratch is fixed at context creation whatever the context length. */
typedef struct attn_job {
    engine_ctx *c;
    const engine_kv *kv;
    const engine_batch *b;
    const uint8_t *kl, *vl; /* this layer's K and V arenas (kv->type values) */
    uint32_t i0, i1;        /* this wave's items */
    atomic_uint next;       /* next item to take */
} attn_job;

/* Row of item i: the last row whose first item is <= i. */
static uint32_t attn_row(const engine_ctx *c, uint32_t n_rows, uint32_t i)
{
    uint32_t lo = 0, hi = n_rows - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (c->attn_first[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void attend_span(const attn_job *j, uint32_t item, float *scores)
{
    const engine_ctx *c = j->c;
    const engine_kv *kv = j->kv;
    const engine_hparams *hp = &c->m->hp;
    uint32_t t = attn_row(c, j->b->n_tokens, item);
    const engine_seq_view *s = &j->b->seqs[j->b->seq[t]];
    uint32_t n_pos = (uint32_t)j->b->pos[t] + 1, bs = kv->block_size;
    uint32_t p0 = (item - c->attn_first[t]) * ATTN_SPAN;
    uint32_t n = n_pos - p0 < ATTN_SPAN ? n_pos - p0 : ATTN_SPAN;
    uint32_t hd = hp->head_dim, n_head = hp->n_head, group = n_head / hp->n_head_kv;
    size_t row = (size_t)hp->n_head_kv * hd * kv->esz, head = hd * kv->esz; /* bytes */
    float scale = 1.0f / sqrtf((float)hd);
    const float *q = c->q + (size_t)t * hp->n_embd;
    bool f16 = kv->type == ENGINE_KV_F16;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = p0 + i;
        const uint8_t *kp = j->kl + ((size_t)s->blocks[p / bs] * bs + p % bs) * row;
        for (uint32_t h = 0; h < n_head; h++) {
            const void *kh = kp + (size_t)(h / group) * head;
            const float *qh = q + (size_t)h * hd;
            scores[h * ATTN_SPAN + i] =
                (f16 ? c->kern->dot_f16(qh, kh, hd) : c->kern->dot(qh, kh, hd)) * scale;
        }
    }
    float *part = c->attn_part + (size_t)(item - j->i0) * n_head * (hd + 2);
    for (uint32_t h = 0; h < n_head; h++) {
        float *sc = scores + h * ATTN_SPAN, *ph = part + (size_t)h * (hd + 2);
        float maxv = -INFINITY, sum = 0.0f;
        for (uint32_t i = 0; i < n; i++)
            maxv = sc[i] > maxv ? sc[i] : maxv;
        for (uint32_t i = 0; i < n; i++) {
            sc[i] = expf(sc[i] - maxv);
            sum += sc[i];
        }
        memset(ph, 0, hd * sizeof(float));
        ph[hd] = maxv;
        ph[hd + 1] = sum;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = p0 + i;
        const uint8_t *vp = j->vl + ((size_t)s->blocks[p / bs] * bs + p % bs) * row;
        for (uint32_t h = 0; h < n_head; h++) {
            const void *vh = vp + (size_t)(h / group) * head;
            float *oh = part + (size_t)h * (hd + 2), wgt = scores[h * ATTN_SPAN + i];
            if (f16)
                c->kern->axpy_f16(oh, wgt, vh, hd);
            else
                c->kern->axpy(oh, wgt, vh, hd);
        }
    }
}

static void attn_worker(void *arg, uint32_t ith, uint32_t nth)
{
    (void)nth;
    attn_job *j = arg;
    float *scores = j->c->scores + (size_t)ith * j->c->m->hp.n_head * ATTN_SPAN;
    for (;;) {
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->i1)
            return;
        attend_span(j, i, scores);
    }
}

/* Attention of every row of the batch into c->att, in waves of items; after each wave its span
 * results are folded, in item order, into their rows' states. */
static void attention(engine_ctx *c, const engine_kv *kv, const engine_batch *b, const uint8_t *kl,
                      const uint8_t *vl)
{
    const engine_hparams *hp = &c->m->hp;
    uint32_t T = b->n_tokens, n_items = c->attn_first[T], hd = hp->head_dim;
    size_t per_head = hd + 2, per_row = hp->n_head * per_head;
    attn_job j = {.c = c, .kv = kv, .b = b, .kl = kl, .vl = vl};
    uint64_t macs = 0; /* of the whole batch: a tiny model's attention stays on this thread */
    for (uint32_t t = 0; t < T; t++)
        macs += 2ull * ((uint64_t)b->pos[t] + 1) * hp->n_embd;
    for (uint32_t i0 = 0; i0 < n_items; i0 += ATTN_WAVE) {
        j.i0 = i0;
        j.i1 = n_items - i0 < ATTN_WAVE ? n_items : i0 + ATTN_WAVE;
        atomic_init(&j.next, i0);
        run_job(c, attn_worker, &j, macs);
        for (uint32_t i = j.i0; i < j.i1; i++) {
            uint32_t t = attn_row(c, T, i);
            float *st = c->attn_state + t * per_row;
            const float *pt = c->attn_part + (size_t)(i - j.i0) * per_row;
            if (i == c->attn_first[t]) {
                memcpy(st, pt, per_row * sizeof(float));
                continue;
            }
            for (uint32_t h = 0; h < hp->n_head; h++) {
                float *sh = st + h * per_head;
                const float *ph = pt + h * per_head;
                float mx = sh[hd] > ph[hd] ? sh[hd] : ph[hd];
                float a = expf(sh[hd] - mx), e = expf(ph[hd] - mx);
                for (uint32_t d = 0; d < hd; d++)
                    sh[d] = a * sh[d] + e * ph[d];
                sh[hd] = mx;
                sh[hd + 1] = a * sh[hd + 1] + e * ph[hd + 1];
            }
        }
    }
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < hp->n_head; h++) {
            const float *sh = c->attn_state + t * per_row + h * per_head;
            float *out = c->att + (size_t)t * hp->n_embd + (size_t)h * hd, inv = 1.0f / sh[hd + 1];
            for (uint32_t d = 0; d < hd; d++)
                out[d] = sh[d] * inv;
        }
}

int engine_forward(engine_ctx *c, engine_kv *kv, const engine_batch *b, float *logits_out)
{
    int rc = validate_batch(c, kv, b);
    if (rc)
        return rc;
    const engine_model *m = c->m;
    const engine_hparams *hp = &m->hp;
    size_t T = b->n_tokens, E = hp->n_embd, kv_dim = (size_t)hp->n_head_kv * hp->head_dim,
           R = hp->n_rot / 2;
    c->attn_first[0] = 0; /* a row of n positions has ceil(n / ATTN_SPAN) attention items */
    for (size_t t = 0; t < T; t++)
        c->attn_first[t + 1] =
            c->attn_first[t] + ((uint32_t)b->pos[t] + 1 + ATTN_SPAN - 1) / ATTN_SPAN;

    for (size_t t = 0; t < T; t++) {
        kern_rows_to_f32(&m->tok_embd, (size_t)b->token[t], 1, c->x + t * E);
        for (size_t r = 0; r < R; r++) {
            float theta = (float)b->pos[t] * c->rope_inv_freq[r];
            c->rope_cs[(t * R + r) * 2] = cosf(theta);
            c->rope_cs[(t * R + r) * 2 + 1] = sinf(theta);
        }
    }

    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        uint8_t *kl = kv->k + l * kv->layer_stride * kv->esz;
        uint8_t *vl = kv->v + l * kv->layer_stride * kv->esz;

        rmsnorm_rows(c, c->xn, c->x, w->attn_norm, T, E, hp->rms_eps);
        const kern_mat *qkv[3] = {&w->wq, &w->wk, &w->wv};
        float *qkv_out[3] = {c->q, c->k, c->v};
        matmuls(c, c->xn, T, 3, qkv, qkv_out, false);
        for (size_t t = 0; t < T; t++) {
            if (w->bq)
                kern_add(c->q + t * E, w->bq, E);
            if (w->bk)
                kern_add(c->k + t * kv_dim, w->bk, kv_dim);
            if (w->bv)
                kern_add(c->v + t * kv_dim, w->bv, kv_dim);
            rope(c->q + t * E, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_type,
                 c->rope_cs + t * R * 2);
            rope(c->k + t * kv_dim, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_type,
                 c->rope_cs + t * R * 2);
            size_t off = (size_t)c->slot[t] * kv_dim * kv->esz;
            if (kv->type == ENGINE_KV_F16) {
                c->kern->to_f16((uint16_t *)(void *)(kl + off), c->k + t * kv_dim, kv_dim);
                c->kern->to_f16((uint16_t *)(void *)(vl + off), c->v + t * kv_dim, kv_dim);
            } else {
                memcpy(kl + off, c->k + t * kv_dim, kv_dim * sizeof(float));
                memcpy(vl + off, c->v + t * kv_dim, kv_dim * sizeof(float));
            }
        }
        attention(c, kv, b, kl, vl);
        matmul(c, c->xn, c->att, &w->wo, T);
        kern_add(c->x, c->xn, T * E);

        rmsnorm_rows(c, c->xn, c->x, w->ffn_norm, T, E, hp->rms_eps);
        const kern_mat *gate_up[2] = {&w->w_gate, &w->w_up};
        float *gate_up_out[2] = {c->gate, c->up};
        matmuls(c, c->xn, T, 2, gate_up, gate_up_out, true);
        matmul(c, c->xn, c->gate, &w->w_down, T);
        kern_add(c->x, c->xn, T * E);
    }

    /* Final norm and the vocabulary projection, only for rows whose logits are wanted. */
    size_t n_out = 0;
    for (size_t t = 0; t < T; t++) {
        if (!b->logits[t])
            continue;
        rmsnorm_rows(c, c->xn + n_out * E, c->x + t * E, m->output_norm, 1, E, hp->rms_eps);
        n_out++;
    }
    if (n_out)
        matmul(c, logits_out, c->xn, &m->output, n_out);
    return 0;
}
