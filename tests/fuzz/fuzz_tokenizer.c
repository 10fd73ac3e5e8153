/* libFuzzer target: encode, decode and incremental decode of arbitrary bytes with every vocab
 * family of ../shared/models/vocab (the first input byte picks the vocab and the flags).
 * Checks invariants, not just crashes: ids stay in range, decoding never overruns its count,
 * and the incremental decoder emits only valid UTF-8. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_VOCABS 16
static tok_vocab *g_vocabs[MAX_VOCABS];
static int g_n;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("KVS_SHARED_MODELS");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab", dir && *dir ? dir : KVS_SHARED_MODELS);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "fuzz_tokenizer: %s not found\n", path);
        abort();
    }
    struct dirent *e;
    while ((e = readdir(d)) && g_n < MAX_VOCABS) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf"))
            continue;
        char file[2048];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        gguf_file *f;
        char err[256];
        if (gguf_open(file, &f, err, sizeof err))
            continue;
        if (tok_create_from_gguf(f, &g_vocabs[g_n], err, sizeof err) == 0)
            g_n++;
        gguf_close(f);
    }
    closedir(d);
    return 0;
}

static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n)
            return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || g_n == 0)
        return 0;
    const tok_vocab *v = g_vocabs[data[0] % g_n];
    bool parse_special = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    size_t cap = len + 8, n = 0;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids)
        return 0;
    int rc = tok_encode(v, text, len, true, parse_special, ids, cap, &n);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tok_n_vocab(v))
                abort();
        size_t out_n = 0, out_cap = len * 4 + 64;
        char *out = malloc(out_cap);
        if (out) {
            tok_decode(v, ids, n, TOK_DECODE_STRIP_SPACE | (len & 1 ? TOK_DECODE_SPECIAL : 0), out,
                       out_cap, &out_n);
            free(out);
        }
    }
    /* Incremental decoding of the input read as token ids (2 bytes each). */
    tok_decoder dec;
    tok_decoder_init(&dec);
    char piece[1024];
    for (size_t i = 0; i + 1 < len; i += 2) {
        int32_t id = (int32_t)(((unsigned)(uint8_t)text[i] << 8 | (uint8_t)text[i + 1]) %
                               (unsigned)tok_n_vocab(v));
        int m = tok_decoder_push(v, &dec, id, piece, sizeof piece);
        if (m > 0 && m <= (int)sizeof piece && !valid_utf8((unsigned char *)piece, (size_t)m))
            abort();
    }
    int m = tok_decoder_flush(&dec, piece, sizeof piece);
    if (m > 0 && !valid_utf8((unsigned char *)piece, (size_t)m))
        abort();
    free(ids);
    return 0;
}
