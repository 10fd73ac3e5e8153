/* kvs-dequant-dump IN.gguf OUT.bin: every tensor of IN widened to F32 by engine/dtype's
 * to_f32, for tests/test_dequant.py to compare with gguf-py bit for bit. OUT holds, per tensor
 * in file order: u32 name length | name | u32 ggml type | u64 values | values x f32 (native
 * byte order). Then it tries the model loader on IN and prints "load: OK" or "load: <reason>".
 * Exits 1 when a tensor's type has no to_f32 or its rows are not whole blocks. */
#include "common/status.h"
#include "engine/dtype.h"
#include "engine/gguf.h"
#include "engine/model.h"

#include <stdio.h>
#include <stdlib.h>

static int dump(const gguf_file *f, FILE *out)
{
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const dtype_info *dt = dtype_get(t->type);
        if (!dt || !dt->to_f32 || t->dims[0] % dt->block) {
            fprintf(stderr, "kvs-dequant-dump: tensor %.*s: type %s has no dequantizer here\n",
                    (int)t->name_len, t->name, dtype_name(t->type));
            return -1;
        }
        float *v = malloc(t->n_elements * sizeof *v);
        if (!v) {
            fprintf(stderr, "kvs-dequant-dump: out of memory\n");
            return -1;
        }
        dt->to_f32(t->data, v, t->n_elements);
        uint32_t len = (uint32_t)t->name_len;
        int ok = fwrite(&len, 4, 1, out) == 1 && fwrite(t->name, 1, len, out) == len &&
                 fwrite(&t->type, 4, 1, out) == 1 && fwrite(&t->n_elements, 8, 1, out) == 1 &&
                 fwrite(v, sizeof *v, t->n_elements, out) == t->n_elements;
        free(v);
        if (!ok) {
            fprintf(stderr, "kvs-dequant-dump: write failed\n");
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: kvs-dequant-dump IN.gguf OUT.bin\n");
        return 2;
    }
    char err[512] = "";
    gguf_file *f = NULL;
    if (gguf_open(argv[1], &f, err, sizeof err)) {
        fprintf(stderr, "kvs-dequant-dump: %s: %s\n", argv[1], err);
        return 1;
    }
    FILE *out = fopen(argv[2], "wb");
    int rc = out ? dump(f, out) : -1;
    if (!out)
        fprintf(stderr, "kvs-dequant-dump: cannot write %s\n", argv[2]);
    if (out && fclose(out))
        rc = -1;
    gguf_close(f);
    if (rc)
        return 1;
    engine_model *m = NULL;
    if (engine_model_load(argv[1], NULL, &m, err, sizeof err))
        printf("load: %s\n", err);
    else
        printf("load: OK\n");
    engine_model_destroy(m);
    return 0;
}
