/* libFuzzer target: the GGUF reader, then every accessor and the model's tokenizer builder over
 * whatever opened. Any crash, leak or sanitizer finding is a bug in the reader. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy so reads past the end are caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    gguf_file *f = NULL;
    char err[256];
    if (gguf_open_memory(buf, size, &f, err, sizeof err) == 0) {
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            size_t len;
            const char *k = gguf_key_name(f, i, &len);
            char key[128];
            if (len >= sizeof key)
                continue;
            memcpy(key, k, len);
            key[len] = '\0';
            uint64_t u;
            int64_t s;
            float fl;
            double d;
            int b;
            const char *str;
            size_t sl;
            enum gguf_type et;
            uint64_t count;
            const void *arr;
            gguf_get_u64(f, key, &u);
            gguf_get_i64(f, key, &s);
            gguf_get_f32(f, key, &fl);
            gguf_get_f64(f, key, &d);
            gguf_get_bool(f, key, &b);
            gguf_get_str(f, key, &str, &sl);
            if (gguf_get_arr(f, key, &et, &count, &arr) == 0 && et == GGUF_TYPE_STRING)
                for (uint64_t j = 0; j < count && j < 64; j++)
                    gguf_arr_str(f, i, j, &str, &sl);
        }
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            if (t->n_bytes)
                sink ^= ((const uint8_t *)t->data)[t->n_bytes - 1];
        }
        (void)sink;
        tok_vocab *v = NULL;
        if (tok_create_from_gguf(f, &v, err, sizeof err) == 0) {
            int32_t ids[64];
            size_t n;
            tok_encode(v, "Hello world", 11, true, true, ids, 64, &n);
            tok_destroy(v);
        }
        gguf_close(f);
    }
    free(buf);
    return 0;
}
