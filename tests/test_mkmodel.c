/* kvs-mkmodel: runs the real tool (path in argv[1]) on the small stories260K shape into a temp
 * dir and re-reads the result with the GGUF reader: metadata llama.cpp needs, tensor names,
 * ggml dim order and types, weight statistics, F16/Q8_0 conversions, determinism, vocab. */
/* cmocka needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "engine/gguf.h"
#include "test_util.h"

static const char *tool;
static char dir[] = "/tmp/kvs-mkmodel-test-XXXXXX";

/* Runs kvs-mkmodel with the given arguments (NULL-terminated); returns its exit status. */
static int run_tool(const char *const *args)
{
    const char *argv[32] = {tool};
    size_t n = 1;
    while (args[n - 1] && n < 31) {
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execv(tool, (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void out_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* Generates the stories260K shape with the given type/seed/extra args and opens it. */
static gguf_file *make(const char *name, const char *type, const char *seed, const char *vocab)
{
    char path[512];
    out_path(path, sizeof path, name);
    const char *args[] = {"--shape",
                          "stories260K",
                          "--type",
                          type,
                          "--seed",
                          seed,
                          "--ctx",
                          "256",
                          "-o",
                          path,
                          vocab ? "--vocab" : NULL,
                          vocab,
                          NULL};
    assert_int_equal(run_tool(args), 0);
    gguf_file *f = NULL;
    char err[256] = "";
    int rc = gguf_open(path, &f, err, sizeof err);
    if (rc)
        fail_msg("%s: %s", path, err);
    return f;
}

static uint32_t u32(const gguf_file *f, const char *key)
{
    uint32_t v = 0;
    if (gguf_get_u32(f, key, &v))
        fail_msg("missing u32 %s", key);
    return v;
}

static const gguf_tensor *tensor(const gguf_file *f, const char *name)
{
    int64_t i = gguf_find_tensor(f, name);
    if (i < 0)
        fail_msg("missing tensor %s", name);
    return gguf_tensor_at(f, i);
}

static float get_f32(const gguf_tensor *t, uint64_t i)
{
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
    return v;
}

static float get_f16(const gguf_tensor *t, uint64_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
    return ggml_fp16_to_fp32(h);
}

static void check_llama_metadata(const gguf_file *f, uint32_t file_type)
{
    const char *s;
    size_t n;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(gguf_get_str(f, "general.name", &s, &n), 0);
    assert_true(n > 0);
    assert_int_equal(u32(f, "general.file_type"), file_type);
    assert_int_equal(u32(f, "llama.context_length"), 256);
    assert_int_equal(u32(f, "llama.embedding_length"), 64);
    assert_int_equal(u32(f, "llama.block_count"), 5);
    assert_int_equal(u32(f, "llama.feed_forward_length"), 172);
    assert_int_equal(u32(f, "llama.attention.head_count"), 8);
    assert_int_equal(u32(f, "llama.attention.head_count_kv"), 4);
    assert_int_equal(u32(f, "llama.rope.dimension_count"), 8);
    assert_int_equal(u32(f, "llama.vocab_size"), 512);
    float eps, base;
    assert_int_equal(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    assert_true(eps > 0 && eps < 1e-4f);
    assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &base), 0);
    assert_true(base == 10000.0f);
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s, &n), 0);
    assert_memory_equal(s, "llama", 5);
    enum gguf_type et;
    uint64_t cnt;
    const void *d;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &cnt, &d), 0);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(cnt, 512);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.scores", &et, &cnt, &d), 0);
    assert_int_equal(et, GGUF_TYPE_FLOAT32);
    assert_int_equal(cnt, 512);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &cnt, &d), 0);
    assert_int_equal(et, GGUF_TYPE_INT32);
    assert_int_equal(cnt, 512);
    assert_int_equal(u32(f, "tokenizer.ggml.bos_token_id"), 1);
    assert_int_equal(u32(f, "tokenizer.ggml.eos_token_id"), 2);
}

/* Every tensor llama.cpp's llama loader looks for, in ggml dim order, with the given types. */
static void check_tensors(const gguf_file *f, uint32_t mtype)
{
    assert_int_equal(gguf_n_tensors(f), 3 + 9 * 5);
    struct {
        const char *name;
        uint64_t d0, d1; /* d1 == 0: 1-D norm */
    } want[] = {
        {"attn_norm", 64, 0},  {"attn_q", 64, 64},      {"attn_k", 64, 32},
        {"attn_v", 64, 32},    {"attn_output", 64, 64}, {"ffn_norm", 64, 0},
        {"ffn_gate", 64, 172}, {"ffn_up", 64, 172},     {"ffn_down", 172, 64},
    };
    for (int l = 0; l < 5; l++)
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, want[k].name);
            const gguf_tensor *t = tensor(f, name);
            assert_int_equal(t->n_dims, want[k].d1 ? 2 : 1);
            assert_int_equal(t->dims[0], want[k].d0);
            assert_int_equal(t->dims[1], want[k].d1 ? want[k].d1 : 1);
            uint32_t type = !want[k].d1                                    ? GGML_TYPE_F32
                            : (mtype == GGML_TYPE_Q8_0 && want[k].d0 % 32) ? GGML_TYPE_F16
                                                                           : mtype;
            assert_int_equal(t->type, type);
            assert_int_equal(t->n_bytes, ggml_type_nbytes(type, t->n_elements));
        }
    const gguf_tensor *t = tensor(f, "token_embd.weight");
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->dims[1], 512);
    assert_int_equal(t->type, mtype);
    t = tensor(f, "output.weight");
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->dims[1], 512);
    t = tensor(f, "output_norm.weight");
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->type, GGML_TYPE_F32);
}

static void test_f32_shape(void **state)
{
    (void)state;
    gguf_file *f = make("f32.gguf", "f32", "7", NULL);
    check_llama_metadata(f, 0);
    check_tensors(f, GGML_TYPE_F32);
    /* Norms are exactly one; matrices look like N(0, 0.02^2). */
    const gguf_tensor *t = tensor(f, "blk.3.ffn_norm.weight");
    for (uint64_t i = 0; i < t->n_elements; i++)
        assert_true(get_f32(t, i) == 1.0f);
    t = tensor(f, "token_embd.weight");
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < t->n_elements; i++) {
        double v = get_f32(t, i);
        sum += v;
        sq += v * v;
    }
    double mean = sum / t->n_elements, sd = sqrt(sq / t->n_elements - mean * mean);
    assert_true(fabs(mean) < 0.001);
    assert_true(sd > 0.019 && sd < 0.021);
    /* Tensors draw from different streams. */
    assert_true(get_f32(tensor(f, "blk.0.attn_q.weight"), 0) !=
                get_f32(tensor(f, "blk.1.attn_q.weight"), 0));

    /* The synthesized vocabulary: specials, 256 byte tokens, then unique pieces. */
    int64_t kv = gguf_find_key(f, "tokenizer.ggml.tokens");
    const char *s;
    size_t n;
    assert_int_equal(gguf_arr_str(f, kv, 0, &s, &n), 0);
    assert_memory_equal(s, "<unk>", n);
    assert_int_equal(gguf_arr_str(f, kv, 2, &s, &n), 0);
    assert_memory_equal(s, "</s>", n);
    assert_int_equal(gguf_arr_str(f, kv, 3 + 0x41, &s, &n), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(s, "<0x41>", 6);
    enum gguf_type et;
    uint64_t cnt;
    const void *d;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &cnt, &d), 0);
    int32_t ty[512];
    memcpy(ty, d, sizeof ty);
    assert_int_equal(ty[0], 2);
    assert_int_equal(ty[1], 3);
    assert_int_equal(ty[3], 6);
    assert_int_equal(ty[258], 6);
    assert_int_equal(ty[259], 1);
    for (uint64_t i = 259; i < 512; i++) {
        const char *a;
        size_t an;
        assert_int_equal(gguf_arr_str(f, kv, i, &a, &an), 0);
        assert_true(an > 0);
        for (uint64_t j = 0; j < i; j++) {
            assert_int_equal(gguf_arr_str(f, kv, j, &s, &n), 0);
            assert_false(n == an && memcmp(s, a, n) == 0);
        }
    }
    gguf_close(f);
}

static void test_f16_q8_0_match_f32(void **state)
{
    (void)state;
    gguf_file *f32 = make("a32.gguf", "f32", "11", NULL);
    gguf_file *f16 = make("a16.gguf", "f16", "11", NULL);
    gguf_file *q8 = make("aq8.gguf", "q8_0", "11", NULL);
    check_llama_metadata(f16, 1);
    check_tensors(f16, GGML_TYPE_F16);
    check_llama_metadata(q8, 7);
    check_tensors(q8, GGML_TYPE_Q8_0);
    for (int64_t i = 0; i < gguf_n_tensors(f32); i++) {
        const gguf_tensor *a = gguf_tensor_at(f32, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)a->name_len, a->name);
        const gguf_tensor *h = tensor(f16, name), *q = tensor(q8, name);
        for (uint64_t j = 0; j < a->n_elements; j++) {
            float x = get_f32(a, j);
            if (h->type == GGML_TYPE_F16)
                assert_true(get_f16(h, j) == ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)));
            else
                assert_true(get_f32(h, j) == x);
        }
        if (q->type != GGML_TYPE_Q8_0)
            continue;
        for (uint64_t b = 0; b < a->n_elements / 32; b++) {
            const uint8_t *blk = (const uint8_t *)q->data + 34 * b;
            uint16_t dh;
            memcpy(&dh, blk, 2);
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(get_f32(a, 32 * b + j)));
            assert_int_equal(dh, ggml_fp32_to_fp16(amax / 127.0f));
            float dq = ggml_fp16_to_fp32(dh);
            for (int j = 0; j < 32; j++) {
                int8_t v;
                memcpy(&v, blk + 2 + j, 1);
                assert_true(fabsf(v * dq - get_f32(a, 32 * b + j)) <= 0.51f * dq + 1e-3f * amax);
            }
        }
    }
    gguf_close(f32);
    gguf_close(f16);
    gguf_close(q8);
}

static int files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    assert_non_null(fa);
    assert_non_null(fb);
    int ca, cb, same = 1;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb)
            same = 0;
    } while (same && ca != EOF);
    fclose(fa);
    fclose(fb);
    return same;
}

static void test_deterministic(void **state)
{
    (void)state;
    gguf_close(make("d1.gguf", "q8_0", "5", NULL));
    gguf_close(make("d2.gguf", "q8_0", "5", NULL));
    gguf_close(make("d3.gguf", "q8_0", "6", NULL));
    char p1[512], p2[512], p3[512];
    out_path(p1, sizeof p1, "d1.gguf");
    out_path(p2, sizeof p2, "d2.gguf");
    out_path(p3, sizeof p3, "d3.gguf");
    assert_true(files_equal(p1, p2));
    assert_false(files_equal(p1, p3));
}

static void test_vocab_copy(void **state)
{
    (void)state;
    char vpath[1024];
    if (!test_model_path(vpath, sizeof vpath, "stories260K.gguf"))
        skip();
    gguf_file *f = make("v.gguf", "f32", "3", vpath);
    gguf_file *src;
    assert_int_equal(gguf_open(vpath, &src, NULL, 0), 0);
    check_llama_metadata(f, 0);
    check_tensors(f, GGML_TYPE_F32);
    /* Every tokenizer.* entry came over unchanged. */
    int copied = 0;
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        size_t kl;
        const char *k = gguf_key_name(src, i, &kl);
        if (kl < 10 || memcmp(k, "tokenizer.", 10))
            continue;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)kl, k);
        int64_t j = gguf_find_key(f, key);
        assert_true(j >= 0);
        assert_int_equal(gguf_kv_type(f, j), gguf_kv_type(src, i));
        copied++;
    }
    assert_true(copied >= 8);
    int64_t a = gguf_find_key(src, "tokenizer.ggml.tokens");
    int64_t b = gguf_find_key(f, "tokenizer.ggml.tokens");
    for (uint64_t i = 0; i < 512; i++) {
        const char *s1, *s2;
        size_t n1, n2;
        assert_int_equal(gguf_arr_str(src, a, i, &s1, &n1), 0);
        assert_int_equal(gguf_arr_str(f, b, i, &s2, &n2), 0);
        assert_int_equal(n1, n2);
        assert_memory_equal(s1, s2, n1);
    }
    enum gguf_type t1, t2;
    uint64_t c1, c2;
    const void *d1, *d2;
    assert_int_equal(gguf_get_arr(src, "tokenizer.ggml.scores", &t1, &c1, &d1), 0);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.scores", &t2, &c2, &d2), 0);
    assert_int_equal(c1, c2);
    assert_memory_equal(d1, d2, c1 * 4);
    gguf_close(src);
    gguf_close(f);
}

/* Each family's layout, as llama.cpp's loader for it asks (tensor names and ggml dims, its
 * metadata keys): the tiny shape (dim 64, 2 layers, 4 heads, 2 kv heads, ffn 128). */
static void test_family_layouts(void **state)
{
    (void)state;
    static const struct {
        const char *arch;
        const char *extra[5];
        size_t n_tensors;
        const char *has[4]; /* tensors that must be there, blk.1.* unless global */
        const char *lacks[3];
    } fam[] = {
        {"qwen3",
         {"--head-dim", "32", NULL},
         3 + 2 * 11,
         {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "output.weight", NULL},
         {"blk.1.attn_q.bias", NULL}},
        {"gemma2",
         {"--head-dim", "32", "--sliding-window", "8", NULL},
         2 + 2 * 11,
         {"blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight", NULL},
         {"output.weight", "blk.1.attn_q_norm.weight", NULL}},
        {"gemma3",
         {"--head-dim", "32", "--sliding-window", "8", NULL},
         2 + 2 * 13,
         {"blk.1.attn_q_norm.weight", "blk.1.post_ffw_norm.weight", NULL},
         {"output.weight", NULL}},
        {"phi3",
         {NULL},
         3 + 2 * 6,
         {"blk.1.attn_qkv.weight", "output.weight", NULL},
         {"blk.1.attn_q.weight", "blk.1.ffn_gate.weight", NULL}},
        {"qwen3moe",
         {"--head-dim", "32", NULL},
         3 + 2 * 12,
         {"blk.1.attn_q_norm.weight", "blk.1.ffn_gate_inp.weight", "blk.1.ffn_down_exps.weight",
          NULL},
         {"blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", NULL}},
        /* llama's tensors; its NoPE layers are llama.cpp's constant, in no key */
        {"smollm3",
         {NULL},
         3 + 2 * 9,
         {"blk.1.ffn_gate.weight", "output.weight", NULL},
         {"blk.1.attn_q.bias", "rope_freqs.weight", NULL}},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char path[512], key[128];
        out_path(path, sizeof path, "family.gguf");
        const char *args[16] = {"--shape", "tiny", "--arch", fam[i].arch, "-o", path};
        size_t n = 6;
        for (size_t k = 0; fam[i].extra[k]; k++)
            args[n++] = fam[i].extra[k];
        args[n] = NULL;
        assert_int_equal(run_tool(args), 0);
        gguf_file *f = NULL;
        assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
        const char *s;
        size_t len;
        assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len), 0);
        assert_int_equal(len, strlen(fam[i].arch));
        assert_memory_equal(s, fam[i].arch, len);
        if (gguf_n_tensors(f) != (int64_t)fam[i].n_tensors)
            fail_msg("%s: %lld tensors, want %zu", fam[i].arch, (long long)gguf_n_tensors(f),
                     fam[i].n_tensors);
        for (size_t k = 0; fam[i].has[k]; k++)
            tensor(f, fam[i].has[k]);
        for (size_t k = 0; fam[i].lacks[k]; k++)
            assert_true(gguf_find_tensor(f, fam[i].lacks[k]) < 0);
        bool phi3 = !strcmp(fam[i].arch, "phi3"), smollm3 = !strcmp(fam[i].arch, "smollm3");
        bool wide = !phi3 && !smollm3; /* heads of 32: Q is 128 wide */
        const gguf_tensor *q = tensor(f, phi3 ? "blk.0.attn_qkv.weight" : "blk.0.attn_q.weight");
        assert_int_equal(q->dims[0], 64);
        assert_int_equal(q->dims[1], wide ? 128 : phi3 ? 64 + 2 * 32 : 64);
        const gguf_tensor *o = tensor(f, "blk.0.attn_output.weight");
        assert_int_equal(o->dims[0], wide ? 128 : 64);
        assert_int_equal(o->dims[1], 64);
        if (smollm3) { /* heads of dim / n_heads, all of each rotated: no key_length */
            assert_true(gguf_find_key(f, "smollm3.attention.key_length") < 0);
            assert_int_equal(u32(f, "smollm3.rope.dimension_count"), 16);
        } else if (wide) {
            snprintf(key, sizeof key, "%s.attention.key_length", fam[i].arch);
            assert_int_equal(u32(f, key), 32);
            snprintf(key, sizeof key, "%s.attention.value_length", fam[i].arch);
            assert_int_equal(u32(f, key), 32);
            snprintf(key, sizeof key, "%s.rope.dimension_count", fam[i].arch);
            assert_int_equal(u32(f, key), 32);
        } else {
            const gguf_tensor *up = tensor(f, "blk.0.ffn_up.weight"); /* gate and up fused */
            assert_int_equal(up->dims[1], 2 * 128);
        }
        if (!strncmp(fam[i].arch, "gemma", 5)) {
            snprintf(key, sizeof key, "%s.attention.sliding_window", fam[i].arch);
            assert_int_equal(u32(f, key), 8);
        }
        float cap = 0;
        int has_cap = gguf_get_f32(f, "gemma2.attn_logit_softcapping", &cap) == 0;
        assert_int_equal(has_cap, !strcmp(fam[i].arch, "gemma2"));
        gguf_close(f);
        unlink(path);
    }
    char path[512];
    out_path(path, sizeof path, "bad.gguf");
    const char *tied_phi3[] = {"--shape", "tiny", "--arch", "phi3", "--tied", "-o", path, NULL};
    assert_int_equal(run_tool(tied_phi3), 2);
    const char *hd_llama[] = {"--shape", "tiny", "--head-dim", "32", "-o", path, NULL};
    assert_int_equal(run_tool(hd_llama), 2);
    const char *gemma1[] = {"--shape", "tiny", "--arch", "gemma", "-o", path, NULL};
    assert_int_equal(run_tool(gemma1), 2);
    assert_int_equal(access(path, F_OK), -1);
}

/* ernie4_5-moe as llama.cpp's loader and its converter have it: the placement keys, experts on
 * the layers they leave (here a lead of 1 and a step of 2 on seven layers: 1, 3, 5), an F32
 * selection bias exp_probs_b.bias [experts] of std 0.1 beside each router, a shared expert with
 * expert_shared_count 1; the dense layers llama's MLP. The options are ernie4_5-moe's alone. */
static void test_ernie_moe_layout(void **state)
{
    (void)state;
    char path[512];
    out_path(path, sizeof path, "ernie.gguf");
    const char *args[] = {
        "--shape", "swa7",         "--arch", "ernie4_5-moe",        "--moe-step", "2",  "--experts",
        "8",       "--expert-ffn", "96",     "--shared-expert-ffn", "32",         "-o", path,
        NULL};
    assert_int_equal(run_tool(args), 0);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
    assert_int_equal(u32(f, "ernie4_5-moe.interleave_moe_layer_step"), 2);
    assert_int_equal(u32(f, "ernie4_5-moe.leading_dense_block_count"), 1);
    assert_int_equal(u32(f, "ernie4_5-moe.expert_count"), 8);
    assert_int_equal(u32(f, "ernie4_5-moe.expert_feed_forward_length"), 96);
    assert_int_equal(u32(f, "ernie4_5-moe.expert_shared_count"), 1);
    assert_int_equal(u32(f, "ernie4_5-moe.expert_shared_feed_forward_length"), 32);
    for (uint32_t l = 0; l < 7; l++) {
        bool moe = l % 2 == 1;
        char name[64];
        snprintf(name, sizeof name, "blk.%u.ffn_gate.weight", l);
        assert_int_equal(gguf_find_tensor(f, name) >= 0, !moe);
        snprintf(name, sizeof name, "blk.%u.ffn_up_exps.weight", l);
        assert_int_equal(gguf_find_tensor(f, name) >= 0, moe);
        snprintf(name, sizeof name, "blk.%u.ffn_down_shexp.weight", l);
        assert_int_equal(gguf_find_tensor(f, name) >= 0, moe);
        snprintf(name, sizeof name, "blk.%u.exp_probs_b.bias", l);
        assert_int_equal(gguf_find_tensor(f, name) >= 0, moe);
    }
    const gguf_tensor *b = tensor(f, "blk.3.exp_probs_b.bias");
    assert_int_equal(b->type, GGML_TYPE_F32);
    assert_int_equal(b->n_dims, 1);
    assert_int_equal(b->dims[0], 8);
    double sq = 0;
    for (uint64_t i = 0; i < b->n_elements; i++)
        sq += (double)get_f32(b, i) * get_f32(b, i);
    assert_true(sq > 0); /* not the 1.0 of a norm */
    assert_true(get_f32(b, 0) != get_f32(b, 1));
    gguf_close(f);
    const char *nob[] = {"--shape",         "tiny", "--arch", "ernie4_5-moe",
                         "--no-probs-bias", "-o",   path,     NULL};
    assert_int_equal(run_tool(nob), 0);
    assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
    assert_true(gguf_find_tensor(f, "blk.1.exp_probs_b.bias") < 0);
    assert_true(gguf_find_tensor(f, "blk.1.ffn_gate_inp.weight") >= 0);
    assert_true(gguf_find_tensor(f, "blk.0.ffn_gate.weight") >= 0);
    assert_int_equal(u32(f, "ernie4_5-moe.expert_shared_count"), 0);
    gguf_close(f);
    unlink(path);
    const char *step[] = {"--shape", "tiny", "--arch", "qwen3moe", "--moe-step",
                          "2",       "-o",   path,     NULL};
    assert_int_equal(run_tool(step), 2);
    const char *step0[] = {"--shape", "tiny", "--arch", "ernie4_5-moe", "--moe-step", "0",
                           "-o",      path,   NULL};
    assert_int_equal(run_tool(step0), 2);
    const char *dense[] = {"--shape", "tiny", "--arch", "ernie4_5", "--shared-expert-ffn",
                           "32",      "-o",   path,     NULL};
    assert_int_equal(run_tool(dense), 2);
}

/* qwen3moe's mixture of experts as llama.cpp's loader asks: the expert keys, an F32 router
 * [dim, experts] whatever --type (llama-quantize keeps it F32), and expert stacks [dim, expert
 * ffn, experts] and [expert ffn, dim, experts] of --type; defaults 8 experts, 2 used, the shape's
 * ffn (feed_forward_length stays it). The router's std is max(--weight-std, 1/sqrt(dim)). The
 * expert options are for qwen3moe only, and at most --experts used. */
static void test_moe_layout(void **state)
{
    (void)state;
    char path[512];
    out_path(path, sizeof path, "moe.gguf");
    const char *args[] = {
        "--shape",        "tiny", "--arch",       "qwen3moe", "--type", "q8_0", "--experts", "4",
        "--experts-used", "3",    "--expert-ffn", "96",       "-o",     path,   NULL};
    assert_int_equal(run_tool(args), 0);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
    assert_int_equal(u32(f, "qwen3moe.expert_count"), 4);
    assert_int_equal(u32(f, "qwen3moe.expert_used_count"), 3);
    assert_int_equal(u32(f, "qwen3moe.expert_feed_forward_length"), 96);
    assert_int_equal(u32(f, "qwen3moe.feed_forward_length"), 128);
    assert_int_equal(u32(f, "qwen3moe.attention.key_length"), 16);
    const gguf_tensor *r = tensor(f, "blk.1.ffn_gate_inp.weight");
    assert_int_equal(r->type, GGML_TYPE_F32);
    assert_int_equal(r->n_dims, 2);
    assert_int_equal(r->dims[0], 64);
    assert_int_equal(r->dims[1], 4);
    double sq = 0;
    for (uint64_t i = 0; i < r->n_elements; i++)
        sq += (double)get_f32(r, i) * get_f32(r, i);
    double sd = sqrt(sq / r->n_elements); /* 1/sqrt(64) */
    assert_true(sd > 0.11 && sd < 0.14);
    static const struct {
        const char *name;
        uint64_t d0, d1;
    } exps[] = {{"blk.0.ffn_gate_exps.weight", 64, 96},
                {"blk.0.ffn_up_exps.weight", 64, 96},
                {"blk.1.ffn_down_exps.weight", 96, 64}};
    for (size_t i = 0; i < 3; i++) {
        const gguf_tensor *t = tensor(f, exps[i].name);
        assert_int_equal(t->type, GGML_TYPE_Q8_0);
        assert_int_equal(t->n_dims, 3);
        assert_int_equal(t->dims[0], exps[i].d0);
        assert_int_equal(t->dims[1], exps[i].d1);
        assert_int_equal(t->dims[2], 4);
        assert_int_equal(t->n_elements, exps[i].d0 * exps[i].d1 * 4);
    }
    gguf_close(f);
    const char *dflt[] = {"--shape", "tiny", "--arch", "qwen3moe", "-o", path, NULL};
    assert_int_equal(run_tool(dflt), 0);
    assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
    assert_int_equal(u32(f, "qwen3moe.expert_count"), 8);
    assert_int_equal(u32(f, "qwen3moe.expert_used_count"), 2);
    assert_int_equal(u32(f, "qwen3moe.expert_feed_forward_length"), 128);
    assert_int_equal(tensor(f, "blk.0.ffn_down_exps.weight")->dims[2], 8);
    gguf_close(f);
    unlink(path);
    /* llama with experts: Mixtral's layout, experts as wide as feed_forward_length, no
     * expert_feed_forward_length key */
    const char *llama[] = {"--shape", "tiny", "--experts", "4", "-o", path, NULL};
    assert_int_equal(run_tool(llama), 0);
    assert_int_equal(gguf_open(path, &f, NULL, 0), 0);
    assert_int_equal(u32(f, "llama.expert_count"), 4);
    assert_int_equal(u32(f, "llama.expert_used_count"), 2);
    assert_true(gguf_find_key(f, "llama.expert_feed_forward_length") < 0);
    assert_int_equal(tensor(f, "blk.1.ffn_down_exps.weight")->dims[0], 128);
    assert_true(gguf_find_tensor(f, "blk.0.ffn_gate.weight") < 0);
    gguf_close(f);
    unlink(path);
    const char *llama_ffn[] = {"--shape", "tiny", "--experts", "4", "--expert-ffn",
                               "96",      "-o",   path,        NULL};
    assert_int_equal(run_tool(llama_ffn), 2);
    const char *qwen3[] = {"--shape", "tiny", "--arch", "qwen3", "--experts",
                           "4",       "-o",   path,     NULL};
    assert_int_equal(run_tool(qwen3), 2);
    const char *used[] = {"--shape",        "tiny", "--arch", "qwen3moe", "--experts", "4",
                          "--experts-used", "5",    "-o",     path,       NULL};
    assert_int_equal(run_tool(used), 2);
    const char *zero[] = {"--shape", "tiny", "--arch", "qwen3moe", "--experts",
                          "0",       "-o",   path,     NULL};
    assert_int_equal(run_tool(zero), 2);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char path[512];
    out_path(path, sizeof path, "bad.gguf");
    const char *a1[] = {"--shape", "nope", "-o", path, NULL};
    assert_int_equal(run_tool(a1), 2);
    const char *a2[] = {"--shape", "110m", NULL};
    assert_int_equal(run_tool(a2), 2);
    const char *a3[] = {"--shape", "110m", "--type", "q4_k", "-o", path, NULL};
    assert_int_equal(run_tool(a3), 2);
    const char *a4[] = {"--shape", "stories260K", "--ctx", "-5", "-o", path, NULL};
    assert_int_equal(run_tool(a4), 2);
    const char *a5[] = {"--shape", "stories260K", "--vocab", "/nonexistent.gguf", "-o", path, NULL};
    assert_int_equal(run_tool(a5), 1);
    assert_int_equal(access(path, F_OK), -1); /* nothing written */
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    static const char *const names[] = {"f32.gguf", "a32.gguf", "a16.gguf", "aq8.gguf",
                                        "d1.gguf",  "d2.gguf",  "d3.gguf",  "v.gguf"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        out_path(p, sizeof p, names[i]);
        unlink(p);
    }
    return rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_mkmodel PATH-TO-kvs-mkmodel\n");
        return 1;
    }
    tool = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_shape),        cmocka_unit_test(test_f16_q8_0_match_f32),
        cmocka_unit_test(test_deterministic),    cmocka_unit_test(test_vocab_copy),
        cmocka_unit_test(test_family_layouts),   cmocka_unit_test(test_moe_layout),
        cmocka_unit_test(test_ernie_moe_layout), cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("mkmodel", tests, setup, teardown);
}
