/* kvs-mkmodel: writes a random-weight GGUF of a named shape in the layout llama.cpp's converters
 * write for one family (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss, smollm3,
 * granite, granitemoe, ernie4_5, ernie4_5-moe), for load, speed and model-support tests. Weights
 * are a deterministic function of (seed, tensor index, element index): N(0, 0.02^2) for matrices (a
 * MoE router: N(0, max(0.02, 1/sqrt(dim))^2)), exactly 1.0 for norms; tensor data is generated
 * row-block by row-block while the file is written, so multi-GB shapes need only a few MB of
 * memory. */
#include "common/status.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    const char *name;
    uint32_t dim, n_layers, n_heads, n_kv_heads, ffn, vocab;
} shape;

static const shape SHAPES[] = {
    {"tiny", 64, 2, 4, 2, 128, 512},
    {"stories260K", 64, 5, 8, 4, 172, 512},
    /* every matrix row a whole number of 256-value K-quant blocks (tests/test_dequant.py) */
    {"kquant", 512, 2, 8, 4, 768, 512},
    {"110m", 768, 12, 12, 12, 2048, 32000},
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000},
    /* Mistral 7B's (v0.1) shape: what most CPU users serve, GQA 4:1 at head size 128 */
    {"mistral-7b", 4096, 32, 32, 8, 14336, 32000},
    /* Qwen3 0.6B's (and Qwen3-Embedding-0.6B's) shape: pass --arch qwen3 --head-dim 128 */
    {"qwen3-0.6b", 1024, 28, 16, 8, 3072, 151669},
    /* seven layers: gemma3's 5:1 pattern gives one global layer (5) among windowed ones, the
     * smallest hybrid (the scheduler's window-reclaim tests) */
    {"swa7", 64, 7, 4, 2, 128, 512},
    /* one kv head per query head (as the 110m shape), 64 wide: attention's paths without GQA */
    {"mha", 256, 2, 4, 4, 512, 512},
    /* Gemma 3 1B's KV structure (26 layers, 5:1, one KV head; pass --head-dim 256) on a
     * small width, for KV memory benchmarks on a loaded CPU */
    {"gemma3-1b-kv", 64, 26, 1, 1, 128, 512},
    /* a small MoE (with --arch qwen3moe): every matrix row, the experts' included, a whole
     * number of 256-value K-quant blocks, so llama-quantize keeps the K-quants */
    {"moe", 256, 2, 4, 2, 256, 512},
    /* Qwen3-30B-A3B's shape: pass --arch qwen3moe --head-dim 128 (MOE_SHAPES gives the model's
     * 128 experts, 8 used, expert ffn 768; feed_forward_length is its config's 6144) */
    {"qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936},
    /* gpt-oss-20b's shape: pass --arch gpt-oss --head-dim 64 (MOE_SHAPES: 32 experts, 4 used,
     * expert ffn 2880) */
    {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088},
    /* SmolLM3-3B's shape: pass --arch smollm3 --tied --rope-base 5000000 (its config ties the
     * embeddings; rope_theta 5e6) */
    {"smollm3-3b", 2048, 36, 16, 4, 11008, 128256},
    /* LFM2-1.2B's shape: pass --arch lfm2 --tied --rope-base 1000000 (kvs-mkmodel puts its
     * attention on 6 of the 16 layers, as the model: 2, 5, 8, 11, 14, 15 here, 2, 5, 8, 10, 12,
     * 14 there) */
    {"lfm2-1.2b", 2048, 16, 32, 8, 8192, 65536},
    /* LFM2-8B-A1B's shape: pass --arch lfm2moe --tied --dense-lead 2 (MOE_SHAPES: 32 experts, 4
     * used, expert ffn 1792; feed_forward_length is its dense layers' 7168) */
    {"lfm2-8b-a1b", 2048, 24, 32, 8, 7168, 65536},
};

/* --arch qwen3moe's defaults of a shape not listed here: 8 experts, 2 used, expert ffn the
 * shape's ffn. */
static const struct moe_shape {
    const char *name;
    uint32_t n_expert, n_expert_used, expert_ffn;
} MOE_SHAPES[] = {
    {"moe", 8, 2, 256},
    {"qwen3-30b-a3b", 128, 8, 768},
    {"gpt-oss-20b", 32, 4, 2880},
    {"lfm2-8b-a1b", 32, 4, 1792},
};

/* llama.cpp's LLAMA_FTYPE values for general.file_type. */
enum { FTYPE_ALL_F32 = 0, FTYPE_MOSTLY_F16 = 1, FTYPE_MOSTLY_Q8_0 = 7 };

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

#define WEIGHT_STD 0.02

/* ---- deterministic normal numbers: splitmix64 + Box-Muller ---- */

typedef struct rng {
    uint64_t s;
    bool have_spare;
    double spare;
} rng;

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]: never 0, so log() is finite. */
static double rng_uniform(rng *r)
{
    return ((splitmix64(&r->s) >> 11) + 1) * 0x1.0p-53;
}

static double rng_normal(rng *r)
{
    if (r->have_spare) {
        r->have_spare = false;
        return r->spare;
    }
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->have_spare = true;
    return rad * cos(th);
}

/* ---- tensor fill ---- */

typedef struct wfill {
    uint64_t seed; /* of this tensor */
    rng r;
    bool ones;     /* norm weights: every element 1.0 */
    double std;    /* of the random values */
    uint32_t type; /* ggml type of the stored data */
    uint64_t row_len;
    float *tmp; /* one row of float32 before conversion */
} wfill;

static void quantize_row_q8_0(const float *x, uint8_t *dst, uint64_t n)
{
    /* As ggml's quantize_row_q8_0_ref: block = f16 scale d = max|x|/127, then round(x/d). */
    for (uint64_t b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        uint8_t *yb = dst + b * (2 + QK8_0);
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = ggml_fp32_to_fp16(d);
        memcpy(yb, &dh, 2);
        for (int j = 0; j < QK8_0; j++) {
            int8_t q = (int8_t)roundf(xb[j] * id);
            memcpy(yb + 2 + j, &q, 1);
        }
    }
}

static int fill_tensor(void *user, uint64_t row, uint64_t n_rows, void *dst, size_t row_bytes)
{
    wfill *f = user;
    if (row == 0) /* a fresh write (the writer may be asked to write twice) */
        f->r = (rng){.s = f->seed};
    uint8_t *out = dst;
    for (uint64_t i = 0; i < n_rows; i++, out += row_bytes) {
        for (uint64_t j = 0; j < f->row_len; j++)
            f->tmp[j] = f->ones ? 1.0f : (float)(f->std * rng_normal(&f->r));
        switch (f->type) {
        case GGML_TYPE_F32: memcpy(out, f->tmp, row_bytes); break;
        case GGML_TYPE_F16:
            for (uint64_t j = 0; j < f->row_len; j++) {
                uint16_t h = ggml_fp32_to_fp16(f->tmp[j]);
                memcpy(out + 2 * j, &h, 2);
            }
            break;
        case GGML_TYPE_Q8_0: quantize_row_q8_0(f->tmp, out, f->row_len); break;
        default: return KVS_EUNSUPPORTED;
        }
    }
    return 0;
}

/* ---- synthesized vocabulary ---- */

typedef struct vocab {
    uint32_t n;
    char *buf; /* all pieces, back to back */
    const char **pieces;
    size_t *lens;
    float *scores;
    int32_t *types;
} vocab;

static void vocab_free(vocab *v)
{
    free(v->buf);
    free(v->pieces);
    free(v->lens);
    free(v->scores);
    free(v->types);
}

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's word-start marker */
#define PIECE_MAX 24

/* Filler piece k (0-based): "▁", printable chars, "▁"+char, lowercase bigrams, "▁"+bigram,
 * trigrams, "▁"+trigram, then "▁tok<k>". Each piece's prefixes come earlier, so the SPM merge
 * of its characters can reach it. */
static size_t filler_piece(uint64_t k, char *out)
{
    const uint64_t np = 94; /* '!'..'~' */
    if (k == 0)
        return (size_t)sprintf(out, SPM_SPACE);
    k--;
    if (k < np)
        return (size_t)sprintf(out, "%c", (char)('!' + k));
    k -= np;
    if (k < np)
        return (size_t)sprintf(out, SPM_SPACE "%c", (char)('!' + k));
    k -= np;
    for (int len = 2; len <= 3; len++) {
        uint64_t cnt = len == 2 ? 26 * 26 : 26 * 26 * 26;
        for (int sp = 0; sp < 2; sp++) {
            if (k < cnt) {
                char s[4] = {0};
                uint64_t x = k;
                for (int i = len - 1; i >= 0; i--, x /= 26)
                    s[i] = (char)('a' + x % 26);
                return (size_t)sprintf(out, "%s%s", sp ? SPM_SPACE : "", s);
            }
            k -= cnt;
        }
    }
    return (size_t)sprintf(out, SPM_SPACE "tok%llu", (unsigned long long)k);
}

static int vocab_synth(vocab *v, uint32_t n)
{
    memset(v, 0, sizeof *v);
    if (n < 3 + 256)
        return KVS_EINVAL;
    v->n = n;
    v->buf = malloc((size_t)n * PIECE_MAX);
    v->pieces = malloc(n * sizeof *v->pieces);
    v->lens = malloc(n * sizeof *v->lens);
    v->scores = malloc(n * sizeof *v->scores);
    v->types = malloc(n * sizeof *v->types);
    if (!v->buf || !v->pieces || !v->lens || !v->scores || !v->types) {
        vocab_free(v);
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        char *p = v->buf + (size_t)i * PIECE_MAX;
        size_t len;
        if (i < 3) {
            static const char *const special[] = {"<unk>", "<s>", "</s>"};
            len = (size_t)sprintf(p, "%s", special[i]);
            v->types[i] = i == 0 ? TOK_UNKNOWN : TOK_CONTROL;
            v->scores[i] = 0.0f;
        } else if (i < 3 + 256) {
            len = (size_t)sprintf(p, "<0x%02X>", i - 3);
            v->types[i] = TOK_BYTE;
            v->scores[i] = 0.0f;
        } else {
            len = filler_piece(i - 259, p);
            v->types[i] = TOK_NORMAL;
            v->scores[i] = -(float)(i - 259); /* earlier (shorter) pieces merge first */
        }
        v->pieces[i] = p;
        v->lens[i] = len;
    }
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *fp)
{
    fprintf(
        fp,
        "usage: kvs-mkmodel --shape NAME -o OUT.gguf [--type f32|f16|q8_0] [--vocab FILE.gguf]\n"
        "                   [--seed N] [--ctx N] [--arch NAME] [--tied]\n"
        "                   [--rope-base F] [--rope-freqs] [--chat-template TEXT]\n"
        "                   [--weight-std F] [--head-dim N] [--sliding-window N]\n"
        "                   [--experts N] [--experts-used K] [--expert-ffn F]\n"
        "Writes a GGUF of one family with random weights (std %.2f, norms 1.0).\n"
        "  --shape   one of:",
        WEIGHT_STD);
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        fprintf(fp, " %s", SHAPES[i].name);
    fprintf(fp,
            "\n"
            "  --type    type of the weight matrices, qwen3moe's expert stacks too (default\n"
            "            f32; norms and the router stay F32; q8_0 falls back to f16 for\n"
            "            matrices whose rows are not a multiple of 32)\n"
            "  --vocab   copy tokenizer.* metadata from this GGUF (its token count sets the\n"
            "            vocabulary size); without it a llama-style byte vocabulary is made\n"
            "  --seed    weight seed (default 1)\n"
            "  --ctx     <arch>.context_length (default 2048)\n"
            "  --layers N  the shape's first N layers only (default all: a large shape's\n"
            "            per-layer cost measured on a smaller file)\n"
            "  --arch    llama (default); qwen2 (adds F32 Q/K/V biases, std 0.5; NEOX RoPE\n"
            "            when loaded); qwen3 (Q/K norms, attention.key_length); gemma2 (post\n"
            "            norms, soft-capping 50/30, sliding window on even layers); gemma3 (post\n"
            "            norms, Q/K norms, 5 windowed layers to 1 global); phi3 (fused attn_qkv\n"
            "            and gate/up in ffn_up); qwen3moe (qwen3 with a mixture of experts: an\n"
            "            F32 router ffn_gate_inp and 3-D ffn_{gate,up,down}_exps for the FFN);\n"
            "            gpt-oss (biases, attention sinks, experts, YaRN, windows on even\n"
            "            layers); smollm3 (llama's tensors; no RoPE on every fourth layer, which\n"
            "            llama.cpp fixes for the architecture: no metadata key);\n"
            "            granite (llama with four scalars: --granite-scales); granitemoe\n"
            "            (granite with Mixtral's experts of feed_forward_length: --experts);\n"
            "            ernie4_5 (llama's tensors); ernie4_5-moe (ernie4_5 with experts on\n"
            "            the layers --dense-lead and --moe-step leave, an F32 selection bias\n"
            "            exp_probs_b.bias of std 0.1 each, --shared-expert-ffn); lfm2 (a\n"
            "            short convolution of 3 taps (std 1, F32) in place of attention on\n"
            "            the layers l with l %% 3 != 2 but the last, Q/K norms on the others,\n"
            "            head_count_kv per layer (0 on the convolutions), token_embd_norm);\n"
            "            lfm2moe (lfm2 with experts after --dense-lead dense layers, sigmoid\n"
            "            gating, exp_probs_b.bias of std 0.1); olmo2 (no pre-norms, Q/K norms\n"
            "            over the whole projections, post-norms, never tied); mistral3 (llama's\n"
            "            tensors; --attn-temp, --bias); gemma3n (gemma3's layer with\n"
            "            AltUp's 4 streams, LAuReL of rank 64, per-layer embeddings 256 wide,\n"
            "            the window pattern as one bool per layer, layers from 20 on sharing\n"
            "            K/V: --layers 25 has shared windowed and global layers).\n"
            "            gemma is always tied, phi3 never\n"
            "  --tied    no output.weight: the output projection reuses token_embd\n");
    fprintf(fp, /* two strings: C99 compilers need take only 4095 bytes in one */

            "  --head-dim  attention.key_length/value_length (qwen3, qwen3moe, gemma,\n"
            "            gpt-oss, ernie4_5, ernie4_5-moe;\n"
            "            default dim / heads)\n"
            "  --experts N  qwen3moe, gpt-oss, granitemoe: expert_count (default the shape's,\n"
            "            else 8); llama: Mixtral's layout, N experts of feed_forward_length\n"
            "  --experts-used K  qwen3moe, granitemoe or llama with --experts:\n"
            "            expert_used_count, the experts each token uses (default the\n"
            "            shape's, else 2)\n"
            "  --expert-ffn F  qwen3moe: expert_feed_forward_length, one expert's hidden size\n"
            "            (default the shape's, else its ffn; feed_forward_length stays the\n"
            "            shape's ffn)\n"
            "  --sliding-window  attention.sliding_window (gemma, gpt-oss, lfm2: every\n"
            "            attention layer windowed; default 4096 for\n"
            "            gemma2, 512 for gemma3, 128 for gpt-oss)\n"
            "  --rope-base  <arch>.rope.freq_base (default 10000, gpt-oss 150000; Llama 3\n"
            "            uses 500000)\n"
            "  --yarn F  YaRN rope scaling by factor F (rope.scaling.type yarn), the original\n"
            "            context the --ctx one (gpt-oss: always, default 32 over 4096)\n"
            "  --rope-freqs write rope_freqs.weight, Llama 3.1's per-frequency divisors\n"
            "            (1 for the fastest pair rising to 8 for the slowest)\n"
            "  --chat-template  store TEXT as tokenizer.chat_template\n"
            "  --pooling N  <arch>.pooling_type N (an embedding model's: 1 mean, 2 cls,\n"
            "            3 last)\n"
            "  --add-eos tokenizer.ggml.add_eos_token true (inputs end with EOS)\n"
            "  --granite-scales E,A,R,L  granite, granitemoe: embedding_scale,\n"
            "            attention.scale, residual_scale, logit_scale (default 2.5,0.2,0.6,3;\n"
            "            0: the key not written)\n"
            "  --no-rope granite: rope.scaling.finetuned false (no RoPE)\n"
            "  --shared-expert-ffn N  granitemoe, ernie4_5-moe: a shared expert N wide\n"
            "            (expert_shared_feed_forward_length, ffn_*_shexp: granitemoeshared)\n"
            "  --dense-lead N  ernie4_5-moe, lfm2moe: leading_dense_block_count (default 1)\n"
            "  --moe-step N  ernie4_5-moe: interleave_moe_layer_step, experts on the layers\n"
            "            l >= the lead with (l + 1) %% N == 0 (default 1)\n"
            "  --no-probs-bias  ernie4_5-moe: no exp_probs_b.bias\n"
            "  --attn-temp S  mistral3: attention.temperature_scale S (queries times\n"
            "            1 + S ln(1 + floor(pos / original context)))\n"
            "  --orig-ctx N  rope.scaling.original_context_length N (YaRN's original\n"
            "            context, mistral3's temperature divisor; default --ctx with --yarn)\n"
            "  --bias    mistral3: Q/K/V and output projection biases (F32, std 0.5)\n"
            "  --weight-std  std of the random matrices (default %.2f; larger makes\n"
            "            attention sharper, so tests see position effects)\n",
            WEIGHT_STD);
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

typedef struct opts {
    const shape *shape;
    uint32_t type;
    const char *vocab_path;
    uint64_t seed;
    uint32_t ctx;
    uint32_t n_layers; /* 0: the shape's */
    const char *out;
    const char *arch;          /* one of --arch's names ("llama", "qwen3moe", ...) */
    bool tied;                 /* no output.weight: the output reuses token_embd */
    uint32_t head_dim;         /* 0: dim / n_heads */
    uint32_t sliding_window;   /* 0: the family's default */
    float rope_base;           /* 0: the family's default */
    float yarn;                /* YaRN's factor; 0: none (gpt-oss: 32) */
    bool rope_freqs;           /* write rope_freqs.weight (Llama 3.1 style divisors) */
    const char *chat_template; /* tokenizer.chat_template, or NULL */
    uint32_t pooling;          /* <arch>.pooling_type, 0: not written */
    bool add_eos;              /* tokenizer.ggml.add_eos_token true */
    double weight_std;         /* of the random matrices */
    uint32_t n_expert, n_expert_used, expert_ffn; /* qwen3moe, llama's Mixtral; else 0 */
    /* granite's embedding_scale, attention.scale, residual_scale, logit_scale (0: not
     * written) */
    float granite[4];
    bool no_rope;       /* granite: rope.scaling.finetuned false */
    uint32_t shexp_ffn; /* granitemoe, ernie4_5-moe: a shared expert this wide; 0: none */
    uint32_t dense_lead, moe_step; /* ernie4_5-moe: the layers of experts (default 1, 1) */
    bool no_probs_bias;            /* ernie4_5-moe: no exp_probs_b.bias */
    float attn_temp;               /* mistral3: attention.temperature_scale; 0: not written */
    uint32_t orig_ctx; /* rope.scaling.original_context_length; 0: --ctx's with --yarn, else none */
    bool bias;         /* mistral3: Q/K/V and output biases */
} opts;

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.type = GGML_TYPE_F32,
                .seed = 1,
                .ctx = 2048,
                .arch = "llama",
                .rope_base = 0.0f,
                .weight_std = WEIGHT_STD,
                .dense_lead = 1,
                .moe_step = 1,
                .granite = {2.5f, 0.2f, 0.6f, 3.0f}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--tied")) {
            o->tied = true;
            continue;
        }
        if (!strcmp(a, "--rope-freqs")) {
            o->rope_freqs = true;
            continue;
        }
        if (!strcmp(a, "--add-eos")) {
            o->add_eos = true;
            continue;
        }
        if (!strcmp(a, "--no-rope")) {
            o->no_rope = true;
            continue;
        }
        if (!strcmp(a, "--bias")) {
            o->bias = true;
            continue;
        }
        if (!strcmp(a, "--no-probs-bias")) {
            o->no_probs_bias = true;
            continue;
        }
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "kvs-mkmodel: %s needs a value (or is unknown)\n", a);
            return -1;
        }
        i++;
        uint64_t n;
        if (!strcmp(a, "--shape")) {
            for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
                if (!strcmp(val, SHAPES[k].name))
                    o->shape = &SHAPES[k];
            if (!o->shape) {
                fprintf(stderr, "kvs-mkmodel: unknown shape '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--type")) {
            if (!strcmp(val, "f32"))
                o->type = GGML_TYPE_F32;
            else if (!strcmp(val, "f16"))
                o->type = GGML_TYPE_F16;
            else if (!strcmp(val, "q8_0"))
                o->type = GGML_TYPE_Q8_0;
            else {
                fprintf(stderr, "kvs-mkmodel: unknown type '%s' (f32, f16, q8_0)\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--vocab")) {
            o->vocab_path = val;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_u64(val, UINT64_MAX, &o->seed)) {
                fprintf(stderr, "kvs-mkmodel: bad seed '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--ctx")) {
            if (!parse_u64(val, UINT32_MAX, &n) || n == 0) {
                fprintf(stderr, "kvs-mkmodel: bad context length '%s'\n", val);
                return -1;
            }
            o->ctx = (uint32_t)n;
        } else if (!strcmp(a, "--layers")) {
            if (!parse_u64(val, 1024, &n) || n == 0) {
                fprintf(stderr, "kvs-mkmodel: bad layer count '%s' (1..1024)\n", val);
                return -1;
            }
            o->n_layers = (uint32_t)n;
        } else if (!strcmp(a, "--arch")) {
            static const char *const archs[] = {
                "llama",        "qwen2",   "qwen3",   "qwen3moe", "gemma2",     "gemma3",
                "phi3",         "gpt-oss", "smollm3", "granite",  "granitemoe", "ernie4_5",
                "ernie4_5-moe", "lfm2",    "lfm2moe", "olmo2",    "mistral3",   "gemma3n"};
            o->arch = NULL;
            for (size_t k = 0; k < sizeof archs / sizeof archs[0]; k++)
                if (!strcmp(val, archs[k]))
                    o->arch = archs[k];
            if (!o->arch) {
                fprintf(stderr,
                        "kvs-mkmodel: unknown architecture '%s' (llama, qwen2, qwen3, "
                        "qwen3moe, gemma2, gemma3, phi3, gpt-oss, smollm3, granite, granitemoe, "
                        "ernie4_5, ernie4_5-moe, lfm2, lfm2moe, olmo2, mistral3, gemma3n)\n",
                        val);
                return -1;
            }
        } else if (!strcmp(a, "--head-dim") || !strcmp(a, "--sliding-window")) {
            if (!parse_u64(val, 65536, &n) || n == 0 || (!strcmp(a, "--head-dim") && n % 2)) {
                fprintf(stderr, "kvs-mkmodel: bad %s '%s'\n", a + 2, val);
                return -1;
            }
            if (!strcmp(a, "--head-dim"))
                o->head_dim = (uint32_t)n;
            else
                o->sliding_window = (uint32_t)n;
        } else if (!strcmp(a, "--experts") || !strcmp(a, "--experts-used") ||
                   !strcmp(a, "--expert-ffn")) {
            /* 512: llama.cpp's LLAMA_MAX_EXPERTS */
            uint64_t max = !strcmp(a, "--expert-ffn") ? 1u << 20 : 512;
            if (!parse_u64(val, max, &n) || n == 0) {
                fprintf(stderr, "kvs-mkmodel: bad %s '%s' (1..%llu)\n", a + 2, val,
                        (unsigned long long)max);
                return -1;
            }
            if (!strcmp(a, "--experts"))
                o->n_expert = (uint32_t)n;
            else if (!strcmp(a, "--experts-used"))
                o->n_expert_used = (uint32_t)n;
            else
                o->expert_ffn = (uint32_t)n;
        } else if (!strcmp(a, "--yarn")) {
            char *end;
            errno = 0;
            double f = strtod(val, &end);
            if (errno || *end || !(f > 1 && f <= 1000)) {
                fprintf(stderr, "kvs-mkmodel: bad yarn factor '%s' (1..1000)\n", val);
                return -1;
            }
            o->yarn = (float)f;
        } else if (!strcmp(a, "--attn-temp")) {
            char *end;
            errno = 0;
            double f = strtod(val, &end);
            if (errno || *end || !(f > 0 && f <= 100)) {
                fprintf(stderr, "kvs-mkmodel: bad attention temperature '%s' (0..100)\n", val);
                return -1;
            }
            o->attn_temp = (float)f;
        } else if (!strcmp(a, "--orig-ctx")) {
            if (!parse_u64(val, UINT32_MAX, &n) || n == 0) {
                fprintf(stderr, "kvs-mkmodel: bad original context '%s'\n", val);
                return -1;
            }
            o->orig_ctx = (uint32_t)n;
        } else if (!strcmp(a, "--rope-base")) {
            char *end;
            errno = 0;
            double b = strtod(val, &end);
            if (errno || *end || !(b > 1 && b < 1e12)) {
                fprintf(stderr, "kvs-mkmodel: bad rope base '%s'\n", val);
                return -1;
            }
            o->rope_base = (float)b;
        } else if (!strcmp(a, "--weight-std")) {
            char *end;
            errno = 0;
            o->weight_std = strtod(val, &end);
            if (errno || *end || !(o->weight_std > 0 && o->weight_std <= 10)) {
                fprintf(stderr, "kvs-mkmodel: bad weight std '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--shared-expert-ffn")) {
            if (!parse_u64(val, 1u << 20, &n) || n == 0) {
                fprintf(stderr, "kvs-mkmodel: bad shared expert width '%s'\n", val);
                return -1;
            }
            o->shexp_ffn = (uint32_t)n;
        } else if (!strcmp(a, "--dense-lead") || !strcmp(a, "--moe-step")) {
            bool step = !strcmp(a, "--moe-step");
            if (!parse_u64(val, 1024, &n) || (step && n == 0)) {
                fprintf(stderr, "kvs-mkmodel: bad %s '%s'\n", a + 2, val);
                return -1;
            }
            *(step ? &o->moe_step : &o->dense_lead) = (uint32_t)n;
        } else if (!strcmp(a, "--granite-scales")) {
            float *g = o->granite;
            int used = 0;
            if (sscanf(val, "%f,%f,%f,%f%n", &g[0], &g[1], &g[2], &g[3], &used) != 4 || val[used] ||
                !(g[0] >= 0 && g[1] >= 0 && g[2] >= 0 && g[3] >= 0 && g[0] < 1e4f && g[1] < 1e4f &&
                  g[2] < 1e4f && g[3] < 1e4f)) {
                fprintf(stderr, "kvs-mkmodel: bad granite scales '%s' (E,A,R,L)\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--chat-template")) {
            o->chat_template = val;
        } else if (!strcmp(a, "--pooling")) {
            uint64_t v;
            if (!parse_u64(val, 4, &v) || v == 0) {
                fprintf(stderr, "kvs-mkmodel: bad pooling type '%s' (1..4)\n", val);
                return -1;
            }
            o->pooling = (uint32_t)v;
        } else if (!strcmp(a, "-o")) {
            o->out = val;
        } else {
            fprintf(stderr, "kvs-mkmodel: unknown option '%s'\n", a);
            return -1;
        }
    }
    if (!o->shape || !o->out) {
        fprintf(stderr, "kvs-mkmodel: --shape and -o are required\n");
        return -1;
    }
    bool gpt_oss = !strcmp(o->arch, "gpt-oss"), gemma = !strncmp(o->arch, "gemma", 5);
    bool ernie_moe = !strcmp(o->arch, "ernie4_5-moe"), lfm2moe = !strcmp(o->arch, "lfm2moe");
    bool moe = !strcmp(o->arch, "qwen3moe") || gpt_oss || ernie_moe || lfm2moe;
    bool granite = !strncmp(o->arch, "granite", 7);
    /* llama with --experts, and granitemoe: Mixtral's layout (experts as wide as
     * feed_forward_length) */
    bool mistral3 = !strcmp(o->arch, "mistral3");
    bool mixtral =
        ((!strcmp(o->arch, "llama") || mistral3) && o->n_expert) || !strcmp(o->arch, "granitemoe");
    if ((o->attn_temp || o->bias) && !mistral3) {
        fprintf(stderr, "kvs-mkmodel: --attn-temp and --bias are for mistral3 only\n");
        return -1;
    }
    if (o->no_rope && !granite) {
        fprintf(stderr, "kvs-mkmodel: --no-rope is for granite only\n");
        return -1;
    }
    if (o->shexp_ffn && strcmp(o->arch, "granitemoe") && !ernie_moe) {
        fprintf(stderr, "kvs-mkmodel: --shared-expert-ffn is for granitemoe and ernie4_5-moe\n");
        return -1;
    }
    if ((o->moe_step != 1 || o->no_probs_bias || (o->dense_lead != 1 && !lfm2moe)) && !ernie_moe) {
        fprintf(stderr, "kvs-mkmodel: --dense-lead (also lfm2moe), --moe-step and "
                        "--no-probs-bias are for ernie4_5-moe\n");
        return -1;
    }
    if (o->head_dim && strcmp(o->arch, "qwen3") && !moe && !gemma && strcmp(o->arch, "ernie4_5") &&
        !mistral3) {
        fprintf(stderr, "kvs-mkmodel: --head-dim is for qwen3, qwen3moe, gemma, gpt-oss, ernie "
                        "and mistral3\n");
        return -1;
    }
    if ((o->n_expert || o->n_expert_used || o->expert_ffn) && !moe && !mixtral) {
        fprintf(stderr, "kvs-mkmodel: --experts, --experts-used and --expert-ffn are for "
                        "qwen3moe, gpt-oss, granitemoe, llama and mistral3 with --experts "
                        "(Mixtral)\n");
        return -1;
    }
    if (mixtral && o->expert_ffn) {
        fprintf(stderr, "kvs-mkmodel: llama's and granitemoe's experts are "
                        "feed_forward_length wide: no --expert-ffn\n");
        return -1;
    }
    if (moe || mixtral) {
        struct moe_shape d = {NULL, 8, 2, o->shape->ffn};
        for (size_t k = 0; k < sizeof MOE_SHAPES / sizeof MOE_SHAPES[0]; k++)
            if (!strcmp(MOE_SHAPES[k].name, o->shape->name))
                d = MOE_SHAPES[k];
        if (!o->n_expert)
            o->n_expert = d.n_expert;
        if (!o->n_expert_used)
            o->n_expert_used = d.n_expert_used;
        if (!o->expert_ffn)
            o->expert_ffn = mixtral ? o->shape->ffn : d.expert_ffn;
        if (o->n_expert_used > o->n_expert) {
            fprintf(stderr, "kvs-mkmodel: --experts-used %u is more than the %u experts\n",
                    o->n_expert_used, o->n_expert);
            return -1;
        }
    }
    if (o->sliding_window && !gemma && !gpt_oss && strncmp(o->arch, "lfm2", 4) &&
        strcmp(o->arch, "olmo2")) {
        fprintf(stderr,
                "kvs-mkmodel: --sliding-window is for gemma, gpt-oss, lfm2 and olmo2 only\n");
        return -1;
    }
    if (!strcmp(o->arch, "olmo2") && o->tied) {
        fprintf(stderr, "kvs-mkmodel: olmo2 is never tied\n");
        return -1;
    }
    /* As the converters: Gemma's output is always token_embd, Phi-3 has its own. */
    if (!strcmp(o->arch, "phi3") && o->tied) {
        fprintf(stderr, "kvs-mkmodel: phi3 is never tied\n");
        return -1;
    }
    if (gemma)
        o->tied = true;
    if (o->rope_base == 0.0f)
        o->rope_base = gpt_oss ? 150000.0f : 10000.0f;
    return 0;
}

/* ---- model description ---- */

typedef struct gen {
    gguf_writer *w;
    wfill *fills;
    size_t n_fills, cap_fills;
    uint64_t seed;
    uint32_t wtype;
    double std;
    float *tmp;
    uint64_t tmp_len;
} gen;

/* Adds one tensor of n_dims dims whose data fill_tensor generates in type (Q8_0 falls back to
 * F16 for rows that are not whole blocks): random with that std, or all 1.0 when std <= 0. */
static int gen_add(gen *g, const char *name, uint32_t n_dims, const uint64_t *dims, uint32_t type,
                   double std)
{
    uint64_t d0 = dims[0];
    if (type == GGML_TYPE_Q8_0 && d0 % QK8_0) {
        fprintf(stderr,
                "kvs-mkmodel: note: %s rows of %llu are not a multiple of %d, "
                "stored as F16\n",
                name, (unsigned long long)d0, QK8_0);
        type = GGML_TYPE_F16;
    }
    if (g->n_fills == g->cap_fills)
        return KVS_ENOSPC; /* sized exactly by the caller */
    wfill *f = &g->fills[g->n_fills];
    uint64_t idx = g->n_fills++;
    /* Each tensor gets its own stream so that its values do not depend on the others' sizes. */
    uint64_t s = g->seed ^ (idx * 0xd1b54a32d192ed03ull);
    *f = (wfill){.seed = splitmix64(&s),
                 .ones = std <= 0,
                 .std = std,
                 .type = type,
                 .row_len = d0,
                 .tmp = g->tmp};
    return gguf_writer_add_tensor_fill(g->w, name, n_dims, dims, type, fill_tensor, f);
}

/* Adds one tensor whose data fill_tensor generates. Matrices use the requested type; vectors
 * are F32, all 1.0 unless bias_std > 0 (then random with that std). */
static int gen_tensor_ex(gen *g, const char *name, uint64_t d0, uint64_t d1, double bias_std)
{
    bool matrix = d1 != 0;
    uint64_t dims[2] = {d0, d1};
    return gen_add(g, name, matrix ? 2 : 1, dims, matrix ? g->wtype : GGML_TYPE_F32,
                   matrix ? g->std : bias_std);
}

static int gen_tensor(gen *g, const char *name, uint64_t d0, uint64_t d1)
{
    return gen_tensor_ex(g, name, d0, d1, 0.0);
}

static int add_vocab(gguf_writer *w, const opts *o, uint32_t *n_vocab)
{
    if (o->vocab_path) {
        gguf_file *vf = NULL;
        char err[256] = "";
        int rc = gguf_open(o->vocab_path, &vf, err, sizeof err);
        if (rc) {
            fprintf(stderr, "kvs-mkmodel: %s: %s\n", o->vocab_path, err);
            return rc;
        }
        enum gguf_type et;
        uint64_t count = 0;
        const void *data;
        rc = gguf_get_arr(vf, "tokenizer.ggml.tokens", &et, &count, &data);
        if (rc || et != GGUF_TYPE_STRING || count == 0 || count > UINT32_MAX) {
            fprintf(stderr, "kvs-mkmodel: %s has no tokenizer.ggml.tokens string array\n",
                    o->vocab_path);
            gguf_close(vf);
            return rc ? rc : KVS_EKEYTYPE;
        }
        *n_vocab = (uint32_t)count;
        for (int64_t i = 0; i < gguf_n_kv(vf) && !rc; i++) {
            size_t klen;
            const char *k = gguf_key_name(vf, i, &klen);
            if (klen > 10 && !memcmp(k, "tokenizer.", 10) &&
                !(o->add_eos && klen == 28 && !memcmp(k, "tokenizer.ggml.add_eos_token", 28)))
                rc = gguf_writer_copy_kv(w, vf, i);
        }
        gguf_close(vf);
        if (rc)
            fprintf(stderr, "kvs-mkmodel: copying the vocabulary failed: %s\n", status_str(rc));
        return rc;
    }
    vocab v;
    int rc = vocab_synth(&v, o->shape->vocab);
    if (rc)
        return rc;
    *n_vocab = v.n;
    if (!(rc = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama")) &&
        !(rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.pieces, v.lens, v.n)) &&
        !(rc = gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.scores, v.n)) &&
        !(rc =
              gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types, v.n)) &&
        !(rc = gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0)) &&
        !(rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1)) &&
        !(rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2)) &&
        !(rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1)) && !o->add_eos)
        rc =
            gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", 0); /* --add-eos: true, later */
    vocab_free(&v);
    return rc;
}

/* lfm2: whether layer l of n is a short convolution (kvs-mkmodel's pattern: attention on every
 * third layer from 2 and on the last, so any file has one) */
static bool lfm2_conv(uint32_t l, uint32_t n)
{
    return l % 3 != 2 && l + 1 != n;
}

/* gemma3n's sizes: AltUp streams, LAuReL's rank (llama.cpp's fixed 64), per-layer input
 * width; the layers from G3N_KV_FROM on share K/V (llama.cpp's fixed 20) */
#define G3N_ALTUP 4
#define G3N_LAUREL 64
#define G3N_PL 256
#define G3N_KV_FROM 20

static int build(gen *g, const opts *o)
{
    const shape *sh = o->shape;
    gguf_writer *w = g->w;
    uint32_t head_dim = o->head_dim ? o->head_dim : sh->dim / sh->n_heads;
    uint32_t n_layers = o->n_layers ? o->n_layers : sh->n_layers;
    uint32_t q_dim = head_dim * sh->n_heads, kv_dim = head_dim * sh->n_kv_heads;
    bool qwen2 = !strcmp(o->arch, "qwen2"), qwen3moe = !strcmp(o->arch, "qwen3moe");
    bool qwen3 = !strcmp(o->arch, "qwen3") || qwen3moe; /* qwen3moe is qwen3 but for the FFN */
    bool moe = o->n_expert > 0; /* qwen3moe, gpt-oss, granitemoe, llama with experts (Mixtral) */
    bool granite = !strncmp(o->arch, "granite", 7);
    bool ernie_moe = !strcmp(o->arch, "ernie4_5-moe"), lfm2moe = !strcmp(o->arch, "lfm2moe");
    bool gemma2 = !strcmp(o->arch, "gemma2"), gemma3 = !strcmp(o->arch, "gemma3");
    bool gemma3n = !strcmp(o->arch, "gemma3n");
    bool phi3 = !strcmp(o->arch, "phi3"), gemma = gemma2 || gemma3 || gemma3n;
    bool gpt_oss = !strcmp(o->arch, "gpt-oss"), smollm3 = !strcmp(o->arch, "smollm3");
    bool lfm2 = !strncmp(o->arch, "lfm2", 4); /* lfm2, lfm2moe */
    bool olmo2 = !strcmp(o->arch, "olmo2");
    /* lfm2's converter: one KV head count per layer, 0 on the convolutions */
    int32_t kv_heads[1024];
    for (uint32_t l = 0; l < n_layers && l < 1024; l++)
        kv_heads[l] = lfm2 && lfm2_conv(l, n_layers) ? 0 : (int32_t)sh->n_kv_heads;
    /* Gemma 3n's converter: feed_forward_length is its config's list, one width per layer */
    uint32_t ffn_arr[1024];
    for (uint32_t l = 0; l < n_layers && l < 1024; l++)
        ffn_arr[l] = sh->ffn;
    uint32_t ftype = o->type == GGML_TYPE_F32   ? FTYPE_ALL_F32
                     : o->type == GGML_TYPE_F16 ? FTYPE_MOSTLY_F16
                                                : FTYPE_MOSTLY_Q8_0;
    char name[128];
    snprintf(name, sizeof name, "%s-random-seed%llu", sh->name, (unsigned long long)o->seed);
    int rc;
    char key[128];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, o->arch), key)
    if ((rc = gguf_writer_add_str(w, "general.architecture", o->arch)) ||
        (rc = gguf_writer_add_str(w, "general.name", name)) ||
        (rc = gguf_writer_add_u32(w, "general.file_type", ftype)) ||
        (rc = gguf_writer_add_u32(w, ARCH_KEY("context_length"), o->ctx)) ||
        (rc = gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), sh->dim)) ||
        (rc = gguf_writer_add_u32(w, ARCH_KEY("block_count"), n_layers)) ||
        (rc = gemma3n ? gguf_writer_add_arr(w, ARCH_KEY("feed_forward_length"), GGUF_TYPE_UINT32,
                                            ffn_arr, n_layers)
                      : gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), sh->ffn)) ||
        (rc = gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), sh->n_heads)) ||
        (rc = lfm2 ? gguf_writer_add_arr(w, ARCH_KEY("attention.head_count_kv"), GGUF_TYPE_INT32,
                                         kv_heads, n_layers)
                   : gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), sh->n_kv_heads)) ||
        (rc = gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"),
                                  qwen2 || qwen3 || gemma || smollm3 ? 1e-6f : 1e-5f)) ||
        (rc = gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), o->rope_base)) ||
        (rc = gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), head_dim)))
        return rc;
    /* ernie: only with --head-dim, as its converter writes a config's head_dim */
    bool ernie = !strncmp(o->arch, "ernie4_5", 8);
    bool mistral3 = !strcmp(o->arch, "mistral3");
    if ((qwen3 || gemma || gpt_oss || ((ernie || mistral3) && o->head_dim)) &&
        ((rc = gguf_writer_add_u32(w, ARCH_KEY("attention.key_length"), head_dim)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("attention.value_length"), head_dim))))
        return rc;
    /* lfm2: only when asked (its attention layers all windowed then, as llama.cpp reads it) */
    if ((lfm2 || olmo2) && o->sliding_window &&
        (rc = gguf_writer_add_u32(w, ARCH_KEY("attention.sliding_window"), o->sliding_window)))
        return rc;
    if ((gemma || gpt_oss) && (rc = gguf_writer_add_u32(w, ARCH_KEY("attention.sliding_window"),
                                                        o->sliding_window ? o->sliding_window
                                                        : gpt_oss         ? 128
                                                        : gemma2          ? 4096
                                                                          : 512)))
        return rc;
    if (moe &&
        ((rc = gguf_writer_add_u32(w, ARCH_KEY("expert_count"), o->n_expert)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("expert_used_count"), o->n_expert_used)) ||
         ((qwen3moe || gpt_oss || ernie_moe || lfm2moe) &&
          (rc = gguf_writer_add_u32(w, ARCH_KEY("expert_feed_forward_length"), o->expert_ffn)))))
        return rc;
    /* as LFM2's converter: the dense layers first, sigmoid gating (llama.cpp's 2) */
    if (lfm2moe &&
        ((rc = gguf_writer_add_u32(w, ARCH_KEY("leading_dense_block_count"), o->dense_lead)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("expert_gating_func"), 2))))
        return rc;
    /* as ERNIE's converter: the layers of experts, and the shared experts' count beside their
     * width (one, as wide as --shared-expert-ffn) */
    if (ernie_moe &&
        ((rc = gguf_writer_add_u32(w, ARCH_KEY("interleave_moe_layer_step"), o->moe_step)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("leading_dense_block_count"), o->dense_lead)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("expert_shared_count"), o->shexp_ffn ? 1 : 0))))
        return rc;
    /* gpt-oss's YaRN: factor 32 over an original context of 4096. */
    float yarn = o->yarn ? o->yarn : gpt_oss ? 32.0f : 0.0f;
    uint32_t yarn_ctx = o->orig_ctx ? o->orig_ctx : o->yarn ? o->ctx : 4096;
    if (yarn &&
        ((rc = gguf_writer_add_str(w, ARCH_KEY("rope.scaling.type"), "yarn")) ||
         (rc = gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.factor"), yarn)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("rope.scaling.original_context_length"), yarn_ctx))))
        return rc;
    if (!yarn && o->orig_ctx &&
        (rc = gguf_writer_add_u32(w, ARCH_KEY("rope.scaling.original_context_length"), yarn_ctx)))
        return rc;
    if (o->attn_temp &&
        (rc = gguf_writer_add_f32(w, ARCH_KEY("attention.temperature_scale"), o->attn_temp)))
        return rc;
    /* granite's four scalars, each only when non-zero (as the converter: absent when the
     * config has none), and RoPE's switch */
    static const char *const gscale[4] = {"%s.embedding_scale", "%s.attention.scale",
                                          "%s.residual_scale", "%s.logit_scale"};
    for (int i = 0; granite && i < 4; i++) {
        snprintf(key, sizeof key, gscale[i], o->arch);
        if (o->granite[i] != 0.0f && (rc = gguf_writer_add_f32(w, key, o->granite[i])))
            return rc;
    }
    if (o->no_rope && (rc = gguf_writer_add_bool(w, ARCH_KEY("rope.scaling.finetuned"), 0)))
        return rc;
    if (o->shexp_ffn &&
        (rc = gguf_writer_add_u32(w, ARCH_KEY("expert_shared_feed_forward_length"), o->shexp_ffn)))
        return rc;
    if (lfm2 && (rc = gguf_writer_add_u32(w, ARCH_KEY("shortconv.l_cache"), 3)))
        return rc;
    /* as Gemma 3n's converter: the window pattern one bool per layer (four windowed, one
     * global), its sparsity one std multiplier per layer (icdf(0.95) on the first 10) */
    uint8_t swa[1024];
    float sparsity[1024];
    for (uint32_t l = 0; l < n_layers && l < 1024; l++) {
        swa[l] = l % 5 < 4;
        sparsity[l] = l < 10 ? 1.6448533535003662f : 0.0f;
    }
    if (gemma3n &&
        ((rc = gguf_writer_add_u32(w, ARCH_KEY("altup.active_idx"), 0)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("altup.num_inputs"), G3N_ALTUP)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("embedding_length_per_layer_input"), G3N_PL)) ||
         (rc = gguf_writer_add_u32(w, ARCH_KEY("attention.shared_kv_layers"),
                                   n_layers > G3N_KV_FROM ? n_layers - G3N_KV_FROM : 0)) ||
         (rc = gguf_writer_add_arr(w, ARCH_KEY("attention.sliding_window_pattern"), GGUF_TYPE_BOOL,
                                   swa, n_layers)) ||
         (rc = gguf_writer_add_arr(w, ARCH_KEY("activation_sparsity_scale"), GGUF_TYPE_FLOAT32,
                                   sparsity, n_layers)) ||
         (rc = gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base_swa"), 10000.0f)) ||
         (rc = gguf_writer_add_f32(w, ARCH_KEY("final_logit_softcapping"), 30.0f))))
        return rc;
    if (gemma2 && ((rc = gguf_writer_add_f32(w, ARCH_KEY("attn_logit_softcapping"), 50.0f)) ||
                   (rc = gguf_writer_add_f32(w, ARCH_KEY("final_logit_softcapping"), 30.0f))))
        return rc;
    if (o->chat_template &&
        (rc = gguf_writer_add_str(w, "tokenizer.chat_template", o->chat_template)))
        return rc;
    uint32_t n_vocab = 0;
    if ((rc = add_vocab(w, o, &n_vocab)))
        return rc;
    if (n_vocab != sh->vocab)
        fprintf(stderr, "kvs-mkmodel: note: vocabulary has %u tokens (shape default %u)\n", n_vocab,
                sh->vocab);
    if ((o->add_eos && (rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", 1))) ||
        (o->pooling && (rc = gguf_writer_add_u32(w, ARCH_KEY("pooling_type"), o->pooling))))
        return rc;
    if ((rc = gguf_writer_add_u32(w, ARCH_KEY("vocab_size"), n_vocab)))
        return rc;
#undef ARCH_KEY

    /* One row buffer serves every tensor: the writer fills them one at a time. */
    g->tmp_len = sh->dim > 2 * sh->ffn ? sh->dim : 2 * sh->ffn;
    g->tmp_len = g->tmp_len > q_dim ? g->tmp_len : q_dim;
    g->tmp_len = g->tmp_len > o->expert_ffn ? g->tmp_len : o->expert_ffn;
    g->tmp_len = g->tmp_len > o->shexp_ffn ? g->tmp_len : o->shexp_ffn;
    if (gemma3n && g->tmp_len < (uint64_t)n_layers * G3N_PL)
        g->tmp_len = (uint64_t)n_layers * G3N_PL; /* a row of per_layer_token_embd */
    g->tmp = malloc(g->tmp_len * sizeof *g->tmp);
    g->cap_fills = 8 + 26 * (size_t)n_layers;
    g->fills = calloc(g->cap_fills, sizeof *g->fills);
    if (!g->tmp || !g->fills)
        return KVS_ENOMEM;
    if ((rc = gen_tensor(g, "token_embd.weight", sh->dim, n_vocab)))
        return rc;
    if (gemma3n) {
        uint64_t stack[3] = {sh->dim, sh->dim, G3N_ALTUP - 1};
        if ((rc = gen_tensor(g, "per_layer_token_embd.weight", (uint64_t)n_layers * G3N_PL,
                             n_vocab)) ||
            (rc = gen_tensor(g, "per_layer_model_proj.weight", sh->dim,
                             (uint64_t)n_layers * G3N_PL)) ||
            (rc = gen_tensor(g, "per_layer_proj_norm.weight", G3N_PL, 0)) ||
            (rc = gen_add(g, "altup_proj.weight", 3, stack, g->wtype, g->std)) ||
            (rc = gen_add(g, "altup_unembd_proj.weight", 3, stack, g->wtype, g->std)))
            return rc;
    }
    for (uint32_t l = 0; l < n_layers; l++) {
        /* In the order llama.cpp's converters write them (and kvs-mkmodel always has: each
         * tensor's values come from its index). d1 = 0 marks a norm vector; d2 > 0 a stack of
         * d2 matrices (qwen3moe's experts, matrix e the contiguous slice e). */
        uint64_t ne = o->n_expert, eff = o->expert_ffn;
        /* ernie4_5-moe: experts on the layers its lead and step leave, the others dense */
        bool dense = !moe || (ernie_moe && (l < o->dense_lead || (l + 1) % o->moe_step)) ||
                     (lfm2moe && l < o->dense_lead);
        bool lmoe = !dense, shexp = o->shexp_ffn > 0 && lmoe;
        bool conv = lfm2 && lfm2_conv(l, n_layers), attn = !phi3 && !conv;
        struct {
            const char *suffix;
            uint64_t d0, d1, d2;
            bool on;
        } L[] = {
            {"attn_norm", sh->dim, 0, 0, !olmo2},
            {"attn_qkv", sh->dim, q_dim + 2 * kv_dim, 0, phi3},
            {"attn_q", sh->dim, q_dim, 0, attn},
            {"attn_k", sh->dim, kv_dim, 0, attn},
            {"attn_v", sh->dim, kv_dim, 0, attn},
            {"attn_q_norm", head_dim, 0, 0, qwen3 || gemma3 || gemma3n || (lfm2 && attn)},
            {"attn_k_norm", head_dim, 0, 0, qwen3 || gemma3 || gemma3n || (lfm2 && attn)},
            {"attn_q_norm", q_dim, 0, 0, olmo2}, /* over the whole projection */
            {"attn_k_norm", kv_dim, 0, 0, olmo2},
            {"attn_output", q_dim, sh->dim, 0, !conv},
            {"shortconv.conv", 3, sh->dim, 0, conv},
            {"shortconv.in_proj", sh->dim, 3 * (uint64_t)sh->dim, 0, conv},
            {"shortconv.out_proj", sh->dim, sh->dim, 0, conv},
            {"attn_sinks", sh->n_heads, 0, 0, gpt_oss},
            {"post_attention_norm", sh->dim, 0, 0, gemma || gpt_oss || olmo2},
            {"ffn_norm", sh->dim, 0, 0, !gpt_oss && !olmo2},
            {"ffn_gate", sh->dim, sh->ffn, 0, !phi3 && dense},
            {"ffn_down", sh->ffn, sh->dim, 0, dense},
            {"ffn_up", sh->dim, phi3 ? 2 * (uint64_t)sh->ffn : sh->ffn, 0, dense},
            {"ffn_gate_inp", sh->dim, ne, 0, lmoe},
            {"exp_probs_b", ne, 0, 0, lmoe && ((ernie_moe && !o->no_probs_bias) || lfm2moe)},
            {"ffn_gate_exps", sh->dim, eff, ne, lmoe},
            {"ffn_down_exps", eff, sh->dim, ne, lmoe},
            {"ffn_up_exps", sh->dim, eff, ne, lmoe},
            {"ffn_gate_shexp", sh->dim, o->shexp_ffn, 0, shexp},
            {"ffn_up_shexp", sh->dim, o->shexp_ffn, 0, shexp},
            {"ffn_down_shexp", o->shexp_ffn, sh->dim, 0, shexp},
            {"post_ffw_norm", sh->dim, 0, 0, gemma || olmo2},
            /* gemma3n's per-layer input, AltUp and LAuReL, as its converter orders them */
            {"inp_gate", sh->dim, G3N_PL, 0, gemma3n},
            {"proj", G3N_PL, sh->dim, 0, gemma3n},
            {"post_norm", sh->dim, 0, 0, gemma3n},
            {"altup_correct_coef", G3N_ALTUP, G3N_ALTUP, 0, gemma3n},
            {"altup_correct_scale", sh->dim, 0, 0, gemma3n},
            {"altup_predict_coef", G3N_ALTUP, G3N_ALTUP * G3N_ALTUP, 0, gemma3n},
            {"altup_router", sh->dim, G3N_ALTUP, 0, gemma3n},
            {"altup_router_norm", sh->dim, 0, 0, gemma3n},
            {"laurel_l", sh->dim, G3N_LAUREL, 0, gemma3n},
            {"laurel_r", G3N_LAUREL, sh->dim, 0, gemma3n},
            {"laurel_post_norm", sh->dim, 0, 0, gemma3n},
        };
        for (size_t k = 0; k < sizeof L / sizeof L[0]; k++) {
            if (!L[k].on)
                continue;
            char tn[96];
            bool probs_b = !strcmp(L[k].suffix, "exp_probs_b");
            snprintf(tn, sizeof tn, "blk.%u.%s.%s", l, L[k].suffix, probs_b ? "bias" : "weight");
            uint64_t dims[3] = {L[k].d0, L[k].d1, L[k].d2};
            if (probs_b)
                /* a selection bias of std 0.1 beside probabilities of ~1 / n_expert: it changes
                 * which experts are picked for a good part of the rows */
                rc = gen_tensor_ex(g, tn, L[k].d0, 0, 0.1);
            else if (L[k].d2)
                rc = gen_add(g, tn, 3, dims, g->wtype, g->std);
            else if (!strcmp(L[k].suffix, "shortconv.conv"))
                /* F32 (llama-quantize keeps rows of 3 so); taps of std 1, so the convolution
                 * weighs in beside the attention layers */
                rc = gen_add(g, tn, 2, dims, GGML_TYPE_F32, 1.0);
            else if (!strcmp(L[k].suffix, "ffn_gate_inp"))
                /* The router stays F32 (llama-quantize keeps it so). Its inputs are RMS-normed
                 * to 1 each, so its logits' std is its std times sqrt(dim): at 1/sqrt(dim),
                 * logits of std 1 or more give a clear order of experts (neighbours' gaps
                 * ~0.3 against rounding of ~1e-6) and unequal weights, while (unlike a std of
                 * 0.5 or 1 on wide shapes) the second expert still weighs in, not a softmax
                 * saturated onto one. */
                rc = gen_add(g, tn, 2, dims, GGML_TYPE_F32,
                             fmax(g->std, 1.0 / sqrt((double)sh->dim)));
            else if (!strcmp(L[k].suffix, "attn_sinks"))
                /* sink logits of the scores' size (std 1), so a head's sink weighs in */
                rc = gen_tensor_ex(g, tn, L[k].d0, 0, 1.0);
            else
                rc = gen_tensor(g, tn, L[k].d0, L[k].d1);
            if (rc)
                return rc;
            /* gpt-oss biases every projection, the router and each expert's three matrices
             * (a stack of vectors): std 0.5, as qwen2's below */
            bool biased = !strncmp(L[k].suffix, "attn_", 5) && L[k].d1 && !phi3;
            biased = biased || !strncmp(L[k].suffix, "ffn_", 4);
            if (gpt_oss && biased) {
                snprintf(tn, sizeof tn, "blk.%u.%s.bias", l, L[k].suffix);
                uint64_t bdims[2] = {L[k].d1, L[k].d2};
                if ((rc = gen_add(g, tn, L[k].d2 ? 2 : 1, bdims, GGML_TYPE_F32, 0.5)))
                    return rc;
            }
            /* Qwen2's biases: large enough (std 0.5) that dropping one changes the logits;
             * mistral3's --bias adds the output projection's too. */
            bool mbias = o->bias && !strcmp(o->arch, "mistral3") &&
                         ((k >= 2 && k <= 4) || !strcmp(L[k].suffix, "attn_output"));
            if ((qwen2 && k >= 2 && k <= 4) || mbias) {
                snprintf(tn, sizeof tn, "blk.%u.%s.bias", l, L[k].suffix);
                if ((rc = gen_tensor_ex(g, tn, L[k].d1, 0, 0.5)))
                    return rc;
            }
        }
    }
    if ((rc = gen_tensor(g, lfm2 ? "token_embd_norm.weight" : "output_norm.weight", sh->dim, 0)))
        return rc;
    if (!o->tied && (rc = gen_tensor(g, "output.weight", sh->dim, n_vocab)))
        return rc;
    if (o->rope_freqs) {
        /* Llama 3.1's factors divide the frequencies: 1 for the fast pairs rising to 8 for the
         * slow ones. A ramp keeps every pair distinct, so a misapplied factor shows. */
        uint32_t half = head_dim / 2;
        float *ff = malloc(half * sizeof *ff);
        if (!ff)
            return KVS_ENOMEM;
        for (uint32_t j = 0; j < half; j++)
            ff[j] = 1.0f + 7.0f * (float)j / (float)(half > 1 ? half - 1 : 1);
        uint64_t dims[1] = {half};
        rc = gguf_writer_add_tensor(w, "rope_freqs.weight", 1, dims, GGML_TYPE_F32, ff);
        free(ff);
        if (rc)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        if (prc < 0)
            usage(stderr);
        return prc < 0 ? 2 : 0;
    }
    gen g = {.seed = o.seed, .wtype = o.type, .std = o.weight_std};
    int rc = gguf_writer_create(&g.w);
    if (!rc)
        rc = build(&g, &o);
    char err[512] = "";
    if (!rc) {
        rc = gguf_writer_write(g.w, o.out, err, sizeof err);
        if (rc)
            fprintf(stderr, "kvs-mkmodel: %s\n", err);
    } else {
        fprintf(stderr, "kvs-mkmodel: building the model failed: %s\n", status_str(rc));
    }
    if (!rc)
        fprintf(stderr, "kvs-mkmodel: wrote %s (%s, %zu tensors, %llu bytes)\n", o.out,
                o.shape->name, g.n_fills, (unsigned long long)gguf_writer_file_size(g.w));
    gguf_writer_destroy(g.w);
    free(g.fills);
    free(g.tmp);
    return rc ? 1 : 0;
}
