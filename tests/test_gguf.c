/* GGUF reader: the real model parses with the metadata MODELS.md describes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "common/status.h"
#include "engine/gguf.h"
#include "test_util.h"

static void test_stories_metadata(void **state)
{
    (void)state;
    char path[1024];
    if (!test_model_path(path, sizeof path, "stories260K.gguf"))
        skip();
    gguf_file *f = NULL;
    char err[256] = "";
    assert_int_equal(gguf_open(path, &f, err, sizeof err), 0);
    assert_int_equal(gguf_version(f), 3);
    const char *s;
    size_t n;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "llama", 5);
    uint32_t v;
    assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &v), 0);
    assert_int_equal(v, 64);
    assert_int_equal(gguf_get_u32(f, "llama.block_count", &v), 0);
    assert_int_equal(v, 5);
    assert_int_equal(gguf_get_u32(f, "llama.no_such_key", &v), KVS_ENOKEY);
    assert_int_equal(gguf_get_u32(f, "general.architecture", &v), KVS_EKEYTYPE);
    int64_t kv = gguf_find_key(f, "tokenizer.ggml.tokens");
    assert_true(kv >= 0);
    assert_int_equal(gguf_arr_str(f, kv, 1, &s, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "<s>", 3);
    int64_t ti = gguf_find_tensor(f, "token_embd.weight");
    assert_true(ti >= 0);
    const gguf_tensor *t = gguf_tensor_at(f, ti);
    assert_int_equal(t->type, GGML_TYPE_F32);
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->dims[1], 512);
    gguf_close(f);
}

static void test_fp16_roundtrip(void **state)
{
    (void)state;
    /* Every finite half converts to float and back unchanged. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        float f = ggml_fp16_to_fp32((uint16_t)h);
        assert_int_equal(ggml_fp32_to_fp16(f), h);
    }
    assert_true(ggml_fp16_to_fp32(0x3c00) == 1.0f);
    assert_int_equal(ggml_fp32_to_fp16(65536.0f), 0x7c00);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_metadata),
        cmocka_unit_test(test_fp16_roundtrip),
    };
    return cmocka_run_group_tests_name("gguf", tests, NULL, NULL);
}
