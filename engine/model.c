/* Loading a model from GGUF: opens the file, picks the family (arch.h, its registry in arch.c)
 * from general.architecture, reads the hyper-parameters every family shares
 * and then the family's own, the tokenizer, every tensor with its shape (the family's list), and
 * packs the weight matrices into the kernels' panel layout (F32, F16, Q8_0 and the block-quantized
 * types keep their type; BF16 is widened to F32 first; norm vectors are F32), then picks the kernel
 * table (engine/kern/ kern.h: from CPUID, or --kernels). The KV arena is kv_arena.c, one batched
 * step forward.c and attention.c. */
#include "engine/model.h"

#include "common/hugemem.h"
#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/arch.h"
#include "engine/dtype.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits on metadata we accept: well beyond any llama model, and small enough that every
 * size computed from them fits in size_t without overflow. */
#define MAX_LAYERS 1024u
#define MAX_EMBD 65536u
#define MAX_FF 262144u
#define MAX_HEADS 1024u
#define MAX_VOCAB 1048576u
#define MAX_CTX (1u << 20)
#define MAX_EXPERTS 1024u
#define MAX_EXPERTS_USED 64u

static int get_u32_key(const engine_model *m, const char *key, uint32_t *out, bool required,
                       uint32_t lo, uint32_t hi, char *err, size_t err_len)
{
    int rc = gguf_get_u32(m->file, key, out);
    if (rc == KVS_ENOKEY && !required)
        return 0;
    if (rc == KVS_ENOKEY)
        return status_set_err(err, err_len, rc, "missing metadata key %s", key);
    if (rc)
        return status_set_err(err, err_len, rc, "metadata key %s is not an unsigned integer", key);
    if (*out < lo || *out > hi)
        return status_set_err(err, err_len, KVS_EFORMAT, "metadata %s = %u is outside %u..%u", key,
                              *out, lo, hi);
    return 0;
}

/* Note that the file's tensor at p is copied and no longer read in place (m->released). */
static int note_released(engine_model *m, const void *p)
{
    const void **r = realloc(m->released, (m->n_released + 1) * sizeof *r);
    if (!r)
        return KVS_ENOMEM;
    m->released = r;
    m->released[m->n_released++] = p;
    return 0;
}

static bool is_released(const engine_model *m, const void *p)
{
    for (size_t r = 0; r < m->n_released; r++)
        if (m->released[r] == p)
            return true;
    return false;
}

/* Finds tensor name with exactly the ggml dims {d0, d1, d2} (d1 = 1 for vectors; d2 > 1 for a
 * stack of d2 matrices, the experts of an MoE layer, returned as one matrix of d1 * d2 rows) and
 * returns its data as F32 in an owned copy, widened from F16/BF16/Q8_0 (an F32 vector is copied
 * too: read in place, a norm's few KiB would keep a whole large folio of the page cache mapped, up
 * to 2 MiB, once the matrices around it are released). With mat, F32/F16/Q8_0 data is returned in
 * place in *mat instead (and only BF16 is widened). */
static int load_tensor_as(engine_model *m, const char *name, uint64_t d0, uint64_t d1, uint64_t d2,
                          bool required, const float **out, kern_mat *mat, char *err,
                          size_t err_len)
{
    *out = NULL;
    int64_t i = gguf_find_tensor(m->file, name);
    if (i < 0) {
        if (!required)
            return 0;
        return status_set_err(err, err_len, KVS_EFORMAT, "missing tensor %s", name);
    }
    const gguf_tensor *t = gguf_tensor_at(m->file, i);
    if (t->dims[0] != d0 || t->dims[1] != d1 || t->dims[2] != d2 || t->dims[3] != 1) {
        char want[64];
        snprintf(want, sizeof want, d2 > 1 ? "[%llu, %llu, %llu]" : "[%llu, %llu]",
                 (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)d2);
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "tensor %s has shape [%llu, %llu, %llu, %llu], expected %s", name,
                              (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                              (unsigned long long)t->dims[2], (unsigned long long)t->dims[3], want);
    }
    d1 *= d2; /* the rows of every matrix of the stack */
    m->n_params += t->n_elements;
    m->weight_bytes += t->n_bytes;
    if (t->type == GGML_TYPE_Q8_0 && d0 % QK8_0)
        return status_set_err(err, err_len, KVS_EFORMAT, "Q8_0 tensor %s has rows of %llu values",
                              name, (unsigned long long)d0);
    size_t qblock = kern_quant_block(t->type);
    if (qblock && d0 % qblock)
        return status_set_err(err, err_len, KVS_EFORMAT, "%s tensor %s has rows of %llu values",
                              dtype_name(t->type), name, (unsigned long long)d0);
    if (mat && qblock) { /* read in place; packed into quantized panels at load */
        kern_mat_init_quant(mat, KERN_QUANT, t->type, t->data, d1, d0);
        *out = t->data;
        return 0;
    }
    if (mat &&
        (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_Q8_0)) {
        kern_type kt = t->type == GGML_TYPE_F32   ? KERN_F32
                       : t->type == GGML_TYPE_F16 ? KERN_F16
                                                  : KERN_Q8_0;
        kern_mat_init(mat, kt, t->data, d1, d0);
        *out = t->data;
        return 0;
    }
    const dtype_info *dt = dtype_get(t->type);
    if (!dt || !dt->loadable)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "tensor %s has type %s; supported: %s", name, dtype_name(t->type),
                              dtype_supported_list());
    float *dst = kvs_huge_alloc(t->n_elements * sizeof *dst, false);
    void **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
    if (!dst || !owned) {
        kvs_huge_free(dst);
        if (owned)
            m->owned = owned;
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory widening %s", name);
    }
    m->owned = owned;
    m->owned[m->n_owned++] = dst;
    dt->to_f32(t->data, dst, t->n_elements);
    if (note_released(m, t->data))
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
    gguf_release(m->file, t->data, t->n_bytes);
    *out = dst;
    if (mat)
        kern_mat_init(mat, KERN_F32, dst, d1, d0);
    return 0;
}

int engine__load_vec(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                     const float **out, char *err, size_t err_len)
{
    return load_tensor_as(m, name, d0, d1, 1, required, out, NULL, err, err_len);
}

int engine__load_mat(engine_model *m, const char *name, uint64_t d0, uint64_t d1, bool required,
                     kern_mat *out, char *err, size_t err_len)
{
    const float *p;
    return load_tensor_as(m, name, d0, d1, 1, required, &p, out, err, err_len);
}

#define load_tensor engine__load_vec
#define load_mat engine__load_mat

void engine__mat_rows(const kern_mat *src, size_t row0, size_t n, kern_mat *out)
{
    const void *d = (const uint8_t *)src->data + row0 * src->row_bytes;
    if (src->type == KERN_QUANT || src->type == KERN_QUANT_PANEL)
        kern_mat_init_quant(out, src->type, src->qtype, d, n, src->n_in);
    else
        kern_mat_init(out, src->type, d, n, src->n_in);
}

int engine__load_layer_vec(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                           bool required, const float **out, char *err, size_t err_len)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", l, suffix);
    return load_tensor(m, name, d0, 1, required, out, err, err_len);
}

int engine__load_layer_mat(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                           uint64_t d1, bool required, kern_mat *out, char *err, size_t err_len)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", l, suffix);
    return load_mat(m, name, d0, d1, required, out, err, err_len);
}

int engine__load_layer_experts(engine_model *m, uint32_t l, const char *suffix, uint64_t d0,
                               uint64_t d1, uint32_t n, kern_mat *out, size_t stride, char *err,
                               size_t err_len)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", l, suffix);
    return engine__load_stack(m, name, d0, d1, n, out, stride, err, err_len);
}

int engine__load_stack(engine_model *m, const char *name, uint64_t d0, uint64_t d1, uint32_t n,
                       kern_mat *out, size_t stride, char *err, size_t err_len)
{
    kern_mat all;
    const float *p;
    int rc = load_tensor_as(m, name, d0, d1, n, true, &p, &all, err, err_len);
    for (uint32_t e = 0; !rc && e < n; e++)
        engine__mat_rows(&all, (size_t)e * d1, d1, out + (size_t)e * stride);
    return rc;
}

/* Metadata key "<arch>.<suffix>" into buf. */
static const char *arch_key(const engine_model *m, const char *suffix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", m->arch->name, suffix);
    return buf;
}

int engine__arch_u32(const engine_model *m, const char *suffix, uint32_t *out, bool required,
                     uint32_t lo, uint32_t hi, char *err, size_t err_len)
{
    char key[128];
    return get_u32_key(m, arch_key(m, suffix, key, sizeof key), out, required, lo, hi, err,
                       err_len);
}

int engine__arch_f32(const engine_model *m, const char *suffix, float *out, char *err,
                     size_t err_len)
{
    char key[128];
    int rc = gguf_get_f32(m->file, arch_key(m, suffix, key, sizeof key), out);
    if (rc && rc != KVS_ENOKEY)
        return status_set_err(err, err_len, rc, "metadata key %s is not a float", key);
    return 0;
}

bool engine__arch_has(const engine_model *m, const char *suffix)
{
    char key[128];
    return gguf_find_key(m->file, arch_key(m, suffix, key, sizeof key)) >= 0;
}

int engine__arch_whole_rope(const engine_model *m, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    if (hp->n_rot == hp->head_dim)
        return 0;
    return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                          "%s.rope.dimension_count = %u differs from the head size %u (not "
                          "supported)",
                          hp->arch, hp->n_rot, hp->head_dim);
}

#define get_arch_u32 engine__arch_u32
#define get_arch_f32 engine__arch_f32

/* <arch>.rope.scaling.type: none, linear (positions divided by rope.scaling.factor, as
 * llama.cpp's freq_scale) or yarn (YaRN: the slow pairs interpolated by the factor, the fast
 * ones kept, a ramp between, and cos/sin scaled by 1 + 0.1 ln factor: gpt-oss, the long-context
 * Qwen files); LongRoPE changes the frequencies per pair and length and is refused. */
static int load_rope_scaling(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    char key[128];
    const char *type = "linear";
    size_t type_len = 6;
    int rc =
        gguf_get_str(m->file, arch_key(m, "rope.scaling.type", key, sizeof key), &type, &type_len);
    if (rc && rc != KVS_ENOKEY)
        return status_set_err(err, err_len, rc, "metadata key %s is not a string", key);
    float factor = 0.0f;
    if ((rc = get_arch_f32(m, "rope.scaling.factor", &factor, err, err_len)))
        return rc;
    if (factor == 0.0f && (rc = get_arch_f32(m, "rope.scale_linear", &factor, err, err_len)))
        return rc;
    bool yarn = type_len == 4 && !memcmp(type, "yarn", 4);
    /* As llama.cpp, the factor applies whether the type says none or linear. */
    if (!(type_len == 4 && !memcmp(type, "none", 4)) &&
        !(type_len == 6 && !memcmp(type, "linear", 6)) && !yarn)
        return status_set_err(
            err, err_len, KVS_EUNSUPPORTED,
            "rope scaling type '%.*s' is not supported (supported: none, linear, yarn)",
            (int)type_len, type);
    if (factor == 0.0f)
        factor = 1.0f;
    if (!(factor >= 1e-3f && factor <= 1e3f))
        return status_set_err(err, err_len, KVS_EFORMAT, "rope scaling factor %g out of range",
                              (double)factor);
    hp->rope_freq_scale = 1.0f / factor;
    hp->rope_attn_factor = 1.0f;
    if ((rc = get_arch_f32(m, "rope.scaling.attn_factor", &hp->rope_attn_factor, err, err_len)))
        return rc;
    if (!(hp->rope_attn_factor > 0 && hp->rope_attn_factor < 1e3f))
        return status_set_err(err, err_len, KVS_EFORMAT, "rope.scaling.attn_factor %g out of range",
                              (double)hp->rope_attn_factor);
    if (!yarn)
        return 0;
    /* llama.cpp's defaults: the ramp from the pair turning beta_fast = 32 times over the
     * original context to the one turning beta_slow = 1 times. */
    hp->yarn_orig_ctx = hp->n_ctx_train;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    float log_mul = 0.0f;
    if ((rc = get_arch_u32(m, "rope.scaling.original_context_length", &hp->yarn_orig_ctx, false, 1,
                           MAX_CTX, err, err_len)) ||
        (rc = get_arch_f32(m, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, err, err_len)) ||
        (rc = get_arch_f32(m, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, err, err_len)) ||
        (rc = get_arch_f32(m, "rope.scaling.yarn_log_multiplier", &log_mul, err, err_len)))
        return rc;
    if (!(hp->yarn_beta_fast > 0 && hp->yarn_beta_fast < 1e4f && hp->yarn_beta_slow > 0 &&
          hp->yarn_beta_slow < 1e4f && log_mul >= 0 && log_mul < 1e3f))
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "yarn beta_fast %g / beta_slow %g / log_multiplier %g out of range",
                              (double)hp->yarn_beta_fast, (double)hp->yarn_beta_slow,
                              (double)log_mul);
    /* Keys that override llama.cpp's context-level YaRN settings: not run here. */
    static const char *const unsupported[] = {"rope.scaling.yarn_ext_factor",
                                              "rope.scaling.yarn_attn_factor"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (engine__arch_has(m, unsupported[i]))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s.%s is not supported",
                                  hp->arch, unsupported[i]);
    /* llama.cpp's magnitude: get_mscale(f, 1) (over get_mscale(f, log_mul) when the file has
     * one), its 1 / (1 + 0.1 ln f) cancel, the file's attn_factor, then the kernel's
     * (1 + 0.1 ln f) again; computed in that order in float, as it does. */
    float f = 1.0f / hp->rope_freq_scale;
#define GET_MSCALE(s, ms) ((s) <= 1.0f ? 1.0f : 0.1f * (ms)*logf(s) + 1.0f)
    float attn =
        log_mul != 0.0f ? GET_MSCALE(f, 1.0f) / GET_MSCALE(f, log_mul) : GET_MSCALE(f, 1.0f);
#undef GET_MSCALE
    attn *= 1.0f / (1.0f + 0.1f * logf(f));
    hp->rope_attn_factor *= attn;
    hp->rope_yarn = true;
    return 0;
}

/* attention.head_count_kv: one count, or one per layer (lfm2's converter), where 0 marks a
 * layer without attention: the family's recurrent block in its place (engine_arch.recurrent:
 * layer_weights.recurrent); the layers with attention must agree on the count. */
static int load_kv_heads(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    char key[128];
    enum gguf_type et;
    uint64_t n;
    const void *data;
    hp->n_head_kv = hp->n_head;
    if (gguf_get_arr(m->file, arch_key(m, "attention.head_count_kv", key, sizeof key), &et, &n,
                     &data))
        return get_arch_u32(m, "attention.head_count_kv", &hp->n_head_kv, false, 1, hp->n_head, err,
                            err_len);
    static const size_t esz[GGUF_TYPE_COUNT_] = {
        [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,   [GGUF_TYPE_UINT16] = 2,
        [GGUF_TYPE_INT16] = 2,  [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4,
        [GGUF_TYPE_UINT64] = 8, [GGUF_TYPE_INT64] = 8};
    if ((unsigned)et >= GGUF_TYPE_COUNT_ || !esz[et] || n != hp->n_layer)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s is not an integer per layer (%llu values, %u layers)", key,
                              (unsigned long long)n, hp->n_layer);
    if (!m->arch->recurrent)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s per layer is not supported for %s (one count for every layer)",
                              key, hp->arch);
    uint32_t common = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const uint8_t *p = (const uint8_t *)data + (size_t)l * esz[et];
        int64_t v = 0;
        bool is_signed = et == GGUF_TYPE_INT8 || et == GGUF_TYPE_INT16 || et == GGUF_TYPE_INT32 ||
                         et == GGUF_TYPE_INT64;
        uint64_t u = 0;
        memcpy(&u, p, esz[et]); /* little-endian, as the file */
        if (is_signed && esz[et] < 8 && (u >> (esz[et] * 8 - 1)) & 1)
            u |= ~0ull << (esz[et] * 8); /* sign-extended */
        v = (int64_t)u;
        if (v < 0 || v > hp->n_head || (v && hp->n_head % v))
            return status_set_err(err, err_len, KVS_EFORMAT,
                                  "%s[%u] = %lld does not divide head_count %u", key, l,
                                  (long long)v, hp->n_head);
        if (v && common && v != common)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s differs between layers (%u and %lld): not supported", key,
                                  common, (long long)v);
        common = v ? (uint32_t)v : common;
        m->layers[l].recurrent = v == 0;
    }
    if (!common)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED, "%s: no layer has attention", key);
    hp->n_head_kv = common;
    return 0;
}

/* feed_forward_length: one width, or one per layer (Gemma 3n's converter writes its config's
 * list), which must then be the same on every layer. */
static int load_ff_length(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    char key[128];
    enum gguf_type et;
    uint64_t n;
    const void *data;
    if (gguf_get_arr(m->file, arch_key(m, "feed_forward_length", key, sizeof key), &et, &n, &data))
        return get_arch_u32(m, "feed_forward_length", &hp->n_ff, true, 1, MAX_FF, err, err_len);
    if ((et != GGUF_TYPE_UINT32 && et != GGUF_TYPE_INT32) || n != hp->n_layer)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s is not a 32-bit integer per layer (%llu values, %u layers)", key,
                              (unsigned long long)n, hp->n_layer);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        uint32_t v;
        memcpy(&v, (const uint8_t *)data + 4 * (size_t)l, 4);
        if (v < 1 || v > MAX_FF || (l && v != hp->n_ff))
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s[%u] = %u: one width on every layer (1..%u) is supported", key,
                                  l, v, MAX_FF);
        hp->n_ff = v;
    }
    return 0;
}

static int load_hparams(engine_model *m, char *err, size_t err_len)
{
    engine_hparams *hp = &m->hp;
    const char *arch;
    size_t arch_len;
    int rc = gguf_get_str(m->file, "general.architecture", &arch, &arch_len);
    if (rc)
        return status_set_err(err, err_len, rc, "general.architecture: %s", status_str(rc));
    m->arch = engine__arch_find(arch, arch_len);
    char list[256];
    if (!m->arch)
        return status_set_err(
            err, err_len, KVS_EUNSUPPORTED, "architecture '%.*s' is not supported (supported: %s)",
            (int)(arch_len > 64 ? 64 : arch_len), arch, engine__arch_list(list, sizeof list));
    hp->arch = m->arch->name;
    hp->rope_type = m->arch->rope_type;
    if ((rc =
             get_arch_u32(m, "context_length", &hp->n_ctx_train, true, 1, MAX_CTX, err, err_len)) ||
        (rc = get_arch_u32(m, "embedding_length", &hp->n_embd, true, 1, MAX_EMBD, err, err_len)) ||
        (rc = get_arch_u32(m, "block_count", &hp->n_layer, true, 1, MAX_LAYERS, err, err_len)) ||
        (rc = load_ff_length(m, err, err_len)) ||
        (rc = get_arch_u32(m, "attention.head_count", &hp->n_head, true, 1, MAX_HEADS, err,
                           err_len)))
        return rc;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
    /* Mixtral-style files say llama but hold expert tensors (ffn_*_exps) instead of one MLP;
     * families whose layer has no expert path refuse them. */
    if ((rc = get_arch_u32(m, "expert_count", &hp->n_expert, false, 0, MAX_EXPERTS, err, err_len)))
        return rc;
    if (hp->n_expert > 0 && !m->arch->moe)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "mixture of experts (%s.expert_count = %u) is not supported for %s",
                              hp->arch, hp->n_expert, hp->arch);
    if (hp->n_expert > 0) {
        hp->n_ff_exp = hp->n_ff;
        if ((rc = get_arch_u32(m, "expert_used_count", &hp->n_expert_used, true, 1,
                               hp->n_expert < MAX_EXPERTS_USED ? hp->n_expert : MAX_EXPERTS_USED,
                               err, err_len)) ||
            (rc = get_arch_u32(m, "expert_feed_forward_length", &hp->n_ff_exp, false, 1, MAX_FF,
                               err, err_len)))
            return rc;
    }
    if ((rc = load_kv_heads(m, err, err_len)))
        return rc;
    bool head_from_width =
        !m->arch->free_head_dim ||
        (m->arch->head_dim_default && !engine__arch_has(m, "attention.key_length"));
    if ((head_from_width && hp->n_embd % hp->n_head) || hp->n_head % hp->n_head_kv)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "embedding_length %u, head_count %u, head_count_kv %u do not divide",
                              hp->n_embd, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    /* Families whose heads may be wider or narrower than n_embd / n_head (qwen3, gemma) read
     * the width from key_length; values must be as wide as keys (the arena holds both alike). */
    static const char *const head_keys[] = {"attention.key_length", "attention.value_length"};
    uint32_t lens[2] = {hp->head_dim, hp->head_dim};
    for (size_t i = 0; i < 2; i++) {
        bool required = m->arch->free_head_dim && !m->arch->head_dim_default;
        if ((rc = get_arch_u32(m, head_keys[i], &lens[i], required, 1, MAX_EMBD, err, err_len)))
            return rc;
        if (!m->arch->free_head_dim && lens[i] != hp->head_dim)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "%s.%s = %u differs from embedding_length / head_count = %u (not "
                                  "supported)",
                                  hp->arch, head_keys[i], lens[i], hp->head_dim);
    }
    if (lens[1] != lens[0])
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s.attention.value_length = %u differs from key_length = %u (not "
                              "supported)",
                              hp->arch, lens[1], lens[0]);
    hp->head_dim = lens[0];
    if ((uint64_t)hp->n_head * hp->head_dim > MAX_EMBD)
        return status_set_err(err, err_len, KVS_EFORMAT, "%u heads of %u values are too wide",
                              hp->n_head, hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((rc = get_arch_u32(m, "rope.dimension_count", &hp->n_rot, false, 2, hp->head_dim, err,
                           err_len)))
        return rc;
    if (hp->n_rot % 2)
        return status_set_err(err, err_len, KVS_EFORMAT, "rope.dimension_count %u is odd",
                              hp->n_rot);
    hp->rms_eps = 1e-5f;
    if ((rc = get_arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, err_len)))
        return rc;
    if (!(hp->rms_eps > 0 && hp->rms_eps < 1))
        return status_set_err(err, err_len, KVS_EFORMAT, "rms epsilon %g out of range",
                              (double)hp->rms_eps);
    hp->rope_base = 10000.0f;
    if ((rc = get_arch_f32(m, "rope.freq_base", &hp->rope_base, err, err_len)))
        return rc;
    if (!(hp->rope_base > 1 && hp->rope_base < 1e12f))
        return status_set_err(err, err_len, KVS_EFORMAT, "rope.freq_base %g out of range",
                              (double)hp->rope_base);
    if ((rc = load_rope_scaling(m, err, err_len)))
        return rc;
    m->rope[0] = (rope_params){hp->rope_base, hp->rope_freq_scale, false};
    m->n_rope = 1;
    m->embd_scale = 1.0f;
    m->logit_mul = 1.0f;
    m->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    return m->arch->load_hparams ? m->arch->load_hparams(m, err, err_len) : 0;
}

static int load_weights(engine_model *m, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, V = hp->n_vocab;
    int rc;
    uint32_t n_vocab_key = hp->n_vocab;
    if ((rc = get_arch_u32(m, "vocab_size", &n_vocab_key, false, 1, MAX_VOCAB, err, err_len)))
        return rc;
    if (n_vocab_key != hp->n_vocab)
        return status_set_err(err, err_len, KVS_EFORMAT,
                              "%s.vocab_size = %u but the tokenizer has %u tokens", hp->arch,
                              n_vocab_key, hp->n_vocab);
    if ((rc = load_mat(m, "token_embd.weight", E, V, true, &m->tok_embd, err, err_len)) ||
        (rc = load_tensor(m, m->arch->output_norm ? m->arch->output_norm : "output_norm.weight", E,
                          1, true, &m->output_norm, err, err_len)) ||
        (rc = load_mat(m, "output.weight", E, V, false, &m->output, err, err_len)))
        return rc;
    if (!m->output.data)
        m->output = m->tok_embd; /* tied embeddings */
    if ((rc = load_tensor(m, "rope_freqs.weight", hp->n_rot / 2, 1, false, &m->rope_freqs, err,
                          err_len)))
        return rc;
    for (uint32_t j = 0; m->rope_freqs && j < hp->n_rot / 2; j++)
        if (!(m->rope_freqs[j] > 0 && m->rope_freqs[j] < 1e30f)) /* a divisor: finite, > 0 */
            return status_set_err(err, err_len, KVS_EFORMAT,
                                  "rope_freqs.weight[%u] = %g is not positive", j,
                                  (double)m->rope_freqs[j]);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if ((rc = m->arch->load_layer(m, l, err, err_len)))
            return rc;
    /* the file's type: its first layer's Q (phi3: fused Q/K/V; lfm2: a convolution's input) */
    static const char *const first[] = {"blk.0.attn_q.weight", "blk.0.attn_qkv.weight",
                                        "blk.0.shortconv.in_proj.weight", "token_embd.weight"};
    int64_t q = -1;
    for (size_t i = 0; q < 0; i++)
        q = gguf_find_tensor(m->file, first[i]);
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

/* Every weight matrix (F32, F16, Q8_0 or quantized) is copied once into the panel layout of
 * kern/kern.h, the only layout the products take, and its file pages released at once (so loading
 * never holds a matrix twice for long): a batched product converts each weight once per tile of 6
 * rows, and its results do not depend on the batch. A tied embedding table too, so that the
 * output projection (which is that table) is batch-invariant like the rest; a lookup gathers
 * one row from it. An untied one stays in the file. Sources of the copies go to m->released. */
static int repack_weights(engine_model *m, load_progress *lp, char *err, size_t err_len)
{
    bool tied = m->output.data == m->tok_embd.data;
    /* Each layer's matrices: the dense MLP's 7, or 4 + the router + 3 stacks of experts (+ a
     * shared expert's 3); an MoE model's dense layers (ernie4_5-moe) use the first 7 of theirs. */
    size_t X = m->hp.n_expert, SH = X && m->hp.n_ff_shexp ? 3 : 0;
    size_t per_layer = X ? 5 + 3 * X + SH + 2 : 9 + ENGINE_LAYER_EXTRA; /* + a short
                                          convolution's two, or a family's own (gemma3n) */
    size_t n_layer_mats = (size_t)m->hp.n_layer * per_layer;
    size_t n_mats = n_layer_mats + ENGINE_MODEL_EXTRA + 2;
    /* An expert stack's copies go into one mapping, each slice 64-byte aligned: one mapping per
     * matrix would be 18k of them for Qwen3-30B-A3B (and three VMAs each, against the kernel's
     * 65530 per process). All slices of a stack are alike (same type and shape). */
    uint8_t *stack = NULL;
    size_t e = 0; /* the expert of a stack's matrix */
    for (size_t i = 0; i < n_mats; i++) {
        kern_mat *mat;
        bool in_stack = false;
        if (i == 0) {
            /* An untied table is only looked up, a row per token: it stays the file's rows
             * (kern_rows_to_f32 widens a row with the panels' bits), so only the rows the
             * prompts use become resident, as page cache (prefault_weights skips it). */
            if (!tied)
                continue;
            mat = &m->tok_embd;
        } else if (i + 1 == n_mats) {
            if (tied) {
                m->output = m->tok_embd; /* the same copy serves both */
                break;
            }
            mat = &m->output;
        } else if (i > n_layer_mats) {
            mat = &m->extra[i - 1 - n_layer_mats];
            if (!mat->data)
                continue;
        } else {
            layer_weights *w = &m->layers[(i - 1) / per_layer];
            size_t k = (i - 1) % per_layer;
            kern_mat *mats[9] = {&w->wq,   &w->wk,     &w->wv,      &w->wo,      &w->w_gate,
                                 &w->w_up, &w->w_down, &w->conv_in, &w->conv_out};
            kern_mat *shared[3] = {&w->sh_gate, &w->sh_up, &w->sh_down};
            if (!w->experts && X && k >= 9) /* a dense layer of an MoE model (ernie4_5-moe) */
                continue;
            in_stack = w->experts && k >= 5 && k < 5 + 3 * X;
            e = in_stack ? (k - 5) % X : 0;
            /* stack by stack: every expert's gate, then every up, then every down; past a
             * dense layer's nine, the family's own */
            mat = !X && k >= 9           ? &w->extra[k - 9]
                  : k < 4 || !w->experts ? mats[k]
                  : k == 4               ? &w->router
                  : in_stack             ? &w->experts[e * 3 + (k - 5) / X]
                  : k < 5 + 3 * X + SH   ? shared[k - 5 - 3 * X]
                                         : mats[7 + k - (5 + 3 * X + SH)];
            if (!mat->data) /* a matrix this layer does not have (attention or convolution) */
                continue;
        }
        /* The integer path reads an interleaved copy where the table has kernels of its own
         * (kern/qdot_pack.c: the same bytes in another order, at most 3.6% more), the file's
         * pages released as for panels; matrices the layout does not take (rows not a multiple
         * of 8, more than KERN_X8_MAX_IN inputs) it reads in place. A tied embedding table keeps
         * its panels (the output projection's), which a lookup widens exactly. */
        bool qdot = m->qdot && mat != &m->tok_embd && kern_qdot_act(mat) != KERN_QX_NONE;
        size_t bytes = !qdot              ? kern_panel_bytes(mat)
                       : m->kern->qmatmul ? kern_qdot_x8_bytes(mat)
                                          : 0;
        if (qdot) {
            m->n_qdot++;
            m->n_x8 += bytes > 0;
        }
        if (!bytes)
            continue;
        size_t slice = (bytes + 63) & ~(size_t)63;
        void *dst = in_stack && e ? stack + e * slice : NULL;
        if (!dst) {
            dst = kvs_huge_alloc(in_stack ? X * slice : bytes, false); /* written right away */
            void **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
            if (!dst || !owned) {
                kvs_huge_free(dst);
                if (owned)
                    m->owned = owned;
                return status_set_err(err, err_len, KVS_ENOMEM, "out of memory repacking weights");
            }
            m->owned = owned;
            m->owned[m->n_owned++] = dst;
            stack = in_stack ? dst : NULL;
        }
        const void *src = mat->data;
        size_t src_bytes = mat->n_out * mat->row_bytes;
        if (qdot)
            kern_qdot_to_x8(mat, dst, mat);
        else
            kern_mat_to_panels(mat, dst, mat);
        gguf_release(m->file, src, src_bytes);
        if (note_released(m, src))
            return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
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

/* Reads one byte of every page of every tensor not copied by repack_weights (but an untied
 * embedding table, of which a request reads a few rows), so the first request does not pay for
 * page faults (from disk, for a file not in the page cache) in the middle of a step. */
static void prefault_weights(const engine_model *m, load_progress *lp)
{
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->file); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->file, i);
        if (is_released(m, t->data))
            continue;
        /* an untied embedding, or a family's table (gemma3n's per-layer embeddings, the
         * largest tensor of its files): mapped row by row */
        if (t->data == m->tok_embd.data || t->data == m->extra_table.data) {
            gguf_willneed(m->file, t->data, t->n_bytes); /* into the page cache, not mapped */
            progress_add(lp, t->n_bytes);
            continue;
        }
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

static int by_data(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)(*(const gguf_tensor *const *)a)->data;
    uintptr_t y = (uintptr_t)(*(const gguf_tensor *const *)b)->data;
    return (x > y) - (x < y);
}

/* The file's pages under every released tensor, released again as runs of neighbours in the
 * file: gguf_release frees whole pages inside one range, so a page that two released tensors
 * share (or their padding) is freed only here; and with large folios in the page cache, a read
 * after a release (the next tensor's) may have mapped the whole folio again, up to 2 MiB around
 * it. Without this pass, a TinyLlama Q4_K_M file kept 30 MiB of such pages
 * resident. A hint: pages read again later only come back from the page cache. */
static void release_runs(const engine_model *m)
{
    int64_t n = gguf_n_tensors(m->file);
    const gguf_tensor **ts = malloc((size_t)n * sizeof *ts);
    if (!ts)
        return;
    for (int64_t i = 0; i < n; i++)
        ts[i] = gguf_tensor_at(m->file, i);
    qsort(ts, (size_t)n, sizeof *ts, by_data);
    const uint8_t *lo = NULL, *hi = NULL;
    for (int64_t i = 0; i <= n; i++) {
        /* and an untied embedding table, read in place: a lookup maps its rows' pages again */
        if (i < n && (is_released(m, ts[i]->data) || ts[i]->data == m->tok_embd.data)) {
            if (!lo)
                lo = ts[i]->data;
            hi = (const uint8_t *)ts[i]->data + ts[i]->n_bytes;
            continue;
        }
        if (lo)
            gguf_release(m->file, lo, (size_t)(hi - lo));
        lo = NULL;
    }
    free(ts);
}

int engine_model_load(const char *path, const engine_load_params *p, engine_model **out, char *err,
                      size_t err_len)
{
    *out = NULL;
    double t0 = time_now_s();
    engine_model *m = calloc(1, sizeof *m);
    if (!m)
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
    int rc = 0;
    if (p && p->kern_table)
        m->kern = p->kern_table;
    else if ((rc = kern_select(p ? p->kernels : NULL, &m->kern, err, err_len)))
        goto fail;
    if ((rc = engine_activations_check(p ? p->activations : NULL, err, err_len)))
        goto fail;
    m->qdot = !p || !p->activations || !*p->activations || !strcmp(p->activations, "q8");
    if ((rc = gguf_open(path, &m->file, err, err_len)))
        goto fail;
    if ((rc = load_hparams(m, err, err_len)))
        goto fail;
    if ((rc = tok_create_from_gguf(m->file, &m->vocab, err, err_len)))
        goto fail;
    m->hp.n_vocab = (uint32_t)tok_n_vocab(m->vocab);
    if (m->hp.n_vocab == 0 || m->hp.n_vocab > MAX_VOCAB) {
        rc = status_set_err(err, err_len, KVS_EFORMAT, "vocabulary of %u tokens", m->hp.n_vocab);
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
    /* An embedding model's pooling (llama.cpp's key; RANK, a reranker's, is not pooling an
     * embedding: left NONE). Read for GET /v1/embeddings, never a reason to refuse a file. */
    uint32_t pool = 0;
    char pkey[128];
    if (gguf_get_u32(m->file, arch_key(m, "pooling_type", pkey, sizeof pkey), &pool) == 0 &&
        pool >= ENGINE_POOLING_MEAN && pool <= ENGINE_POOLING_LAST)
        m->pooling = (engine_pooling)pool;
    if (!m->name) {
        rc = status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
        goto fail;
    }
    load_progress lp = {.m = m, .verbose = !p || p->verbose, .t0 = t0, .last = t0};
    for (int64_t i = 0; i < gguf_n_tensors(m->file); i++)
        lp.total += gguf_tensor_at(m->file, i)->n_bytes;
    if ((rc = repack_weights(m, &lp, err, err_len)))
        goto fail;
    release_runs(m); /* first: a release may unmap a large folio's in-place neighbours too */
    prefault_weights(m, &lp);
    free(m->released);
    m->released = NULL;
    m->n_released = 0;
    if (!p || p->verbose) {
        const engine_hparams *hp = &m->hp;
        log_info("model %s: %s, %u layers, dim %u, %u heads (%u kv), head_dim %u, ffn %u, "
                 "vocab %u, ctx %u; %.2fM params, %s weights %.1f MiB; loaded in %.3f s",
                 m->name, hp->arch, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv,
                 hp->head_dim, hp->n_ff, hp->n_vocab, hp->n_ctx_train, (double)m->n_params / 1e6,
                 ggml_type_name(m->weight_type), (double)m->weight_bytes / (1024.0 * 1024.0),
                 time_now_s() - t0);
        if (hp->n_expert) {
            /* A token reads every weight but the experts it does not run (and, of an untied
             * embedding table, one row): the bytes a decode step of one sequence reads. */
            double unused = 1.0 - (double)hp->n_expert_used / hp->n_expert;
            double bytes = (double)m->weight_bytes - unused * (double)m->expert_bytes;
            int64_t te = gguf_find_tensor(m->file, "token_embd.weight");
            if (m->output.data != m->tok_embd.data && te >= 0)
                bytes -= (double)gguf_tensor_at(m->file, te)->n_bytes;
            /* the experts' type, which an MXFP4_MOE or mixed file has apart from attention's:
             * of the first layer with experts (ernie4_5-moe's first layers are dense) */
            int64_t ge = -1;
            for (uint32_t l = 0; l < hp->n_layer && ge < 0; l++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%u.ffn_gate_exps.weight", l);
                ge = gguf_find_tensor(m->file, name);
            }
            log_info("experts: %u per layer of ffn %u, %s, %u used per token: %.2fM params "
                     "active, %.1f MiB of weights read per token",
                     hp->n_expert, hp->n_ff_exp,
                     ge >= 0 ? ggml_type_name(gguf_tensor_at(m->file, ge)->type) : "?",
                     hp->n_expert_used,
                     ((double)m->n_params - unused * (double)m->expert_params) / 1e6,
                     bytes / (1024.0 * 1024.0));
        }
        log_info(
            "kernels: %s (%s%s%s; CPU: %s)", m->kern->name,
            p && p->kern_table                                             ? "the caller's table"
            : p && p->kernels && *p->kernels && strcmp(p->kernels, "auto") ? "forced by --kernels"
                                                                           : "chosen from CPUID",
            m->kern->note ? "; " : "", m->kern->note ? m->kern->note : "", kern_cpu_features());
        log_info("activations: %s (%zu weight matrices on the integer path, %zu of them "
                 "interleaved; the others on exact F32 panels%s)",
                 m->qdot ? "q8" : "f32", m->n_qdot, m->n_x8,
                 m->n_x8 && !strcmp(m->kern->name, "avx512") && kern_amx()
                     ? "; from 32 rows of x on AMX tiles (but IQ4_XS)"
                     : "");
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
        kvs_huge_free(m->owned[i]);
    free(m->owned);
    free(m->released);
    for (uint32_t l = 0; m->layers && l < m->hp.n_layer; l++)
        free(m->layers[l].experts);
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

engine_pooling engine_model_pooling(const engine_model *m)
{
    return m->pooling;
}

const char *engine_model_weight_type(const engine_model *m)
{
    return ggml_type_name(m->weight_type);
}
uint64_t engine_model_n_params(const engine_model *m)
{
    return m->n_params;
}

int engine_activations_check(const char *activations, char *err, size_t err_len)
{
    if (!activations || !*activations || !strcmp(activations, "q8") || !strcmp(activations, "f32"))
        return 0;
    return status_set_err(err, err_len, KVS_EINVAL, "--activations '%s': unknown (q8|f32)",
                          activations);
}

const char *engine_model_activations(const engine_model *m)
{
    return m->qdot ? "q8" : "f32";
}
