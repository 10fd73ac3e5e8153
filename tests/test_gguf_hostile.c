/* GGUF reader against hostile input: truncations, bit flips and lying fields of a real file,
 * plus the writer (gguf_write.h) round-tripping every metadata type. Every candidate is opened
 * from an exact-size heap copy so that ASan sees any read past its end; when a damaged file
 * still opens, every accessor is swept to prove the "memory-safe after open" promise. */
/* cmocka needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "test_util.h"

/* ---- the pristine file and where its fields are ---- */

#define MAX_KV 64
#define MAX_T 64

typedef struct kv_loc {
    size_t key_len, type, value; /* offsets of the key length, value type and value */
    uint32_t vtype;
    size_t arr_type, arr_count, arr_first; /* arrays: element type, count, first element */
    uint32_t elem;
    char key[64];
} kv_loc;

typedef struct t_loc {
    size_t name_len, n_dims, dims, type, offset;
    uint32_t nd, ggml_type;
    uint64_t off_val, dims_val[4];
    char name[64];
} t_loc;

typedef struct model {
    uint8_t *buf;
    size_t size;
    size_t n_kv, n_t;
    kv_loc kv[MAX_KV];
    t_loc t[MAX_T];
    size_t header_end, data_start;
} model;

static model M;
static int have_model;

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static void wr64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static void wr32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static size_t elem_size(uint32_t t)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? sz[t] : 0;
}

/* Walks the trusted original to record field offsets (test code: no hostile input here). */
static void index_model(void)
{
    const uint8_t *b = M.buf;
    size_t p = 24;
    M.n_kv = (size_t)rd64(b + 16);
    M.n_t = (size_t)rd64(b + 8);
    assert_true(M.n_kv <= MAX_KV && M.n_t <= MAX_T);
    for (size_t i = 0; i < M.n_kv; i++) {
        kv_loc *k = &M.kv[i];
        k->key_len = p;
        uint64_t n = rd64(b + p);
        snprintf(k->key, sizeof k->key, "%.*s", (int)n, (const char *)b + p + 8);
        p += 8 + n;
        k->type = p;
        k->vtype = rd32(b + p);
        p += 4;
        k->value = p;
        if (k->vtype == GGUF_TYPE_STRING) {
            p += 8 + rd64(b + p);
        } else if (k->vtype == GGUF_TYPE_ARRAY) {
            k->arr_type = p;
            k->elem = rd32(b + p);
            k->arr_count = p + 4;
            uint64_t cnt = rd64(b + p + 4);
            p += 12;
            k->arr_first = p;
            for (uint64_t j = 0; j < cnt; j++)
                p += k->elem == GGUF_TYPE_STRING ? 8 + rd64(b + p) : elem_size(k->elem);
        } else {
            p += elem_size(k->vtype);
        }
    }
    for (size_t i = 0; i < M.n_t; i++) {
        t_loc *t = &M.t[i];
        t->name_len = p;
        uint64_t n = rd64(b + p);
        snprintf(t->name, sizeof t->name, "%.*s", (int)n, (const char *)b + p + 8);
        p += 8 + n;
        t->n_dims = p;
        t->nd = rd32(b + p);
        p += 4;
        t->dims = p;
        for (uint32_t d = 0; d < t->nd; d++)
            t->dims_val[d] = rd64(b + p + 8 * d);
        p += 8 * t->nd;
        t->type = p;
        t->ggml_type = rd32(b + p);
        t->offset = p + 4;
        t->off_val = rd64(b + p + 4);
        p += 12;
    }
    M.header_end = p;
    M.data_start = (p + 31) / 32 * 32;
}

static int setup(void **state)
{
    (void)state;
    char path[1024];
    if (!test_model_path(path, sizeof path, "stories260K.gguf"))
        return 0;
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    M.size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    M.buf = malloc(M.size);
    assert_non_null(M.buf);
    assert_int_equal(fread(M.buf, 1, M.size, fp), M.size);
    fclose(fp);
    index_model();
    have_model = 1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(M.buf);
    return 0;
}

#define NEED_MODEL()                                                                               \
    do {                                                                                           \
        if (!have_model)                                                                           \
            skip();                                                                                \
    } while (0)

/* ---- opening a candidate ---- */

static volatile uint64_t sink;

/* Touches everything an opened file hands out, so ASan checks the reader's bounds claims. */
static void sweep(const gguf_file *f)
{
    uint64_t acc = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        size_t klen;
        const char *k = gguf_key_name(f, i, &klen);
        for (size_t j = 0; j < klen; j++)
            acc += (uint8_t)k[j];
        char key[256];
        if (klen >= sizeof key || memchr(k, 0, klen))
            continue;
        memcpy(key, k, klen);
        key[klen] = 0;
        const char *s;
        size_t n;
        enum gguf_type et;
        uint64_t cnt;
        const void *data;
        uint64_t u;
        int64_t sv;
        float fl;
        double d;
        int b;
        switch (gguf_kv_type(f, i)) {
        case GGUF_TYPE_STRING:
            assert_int_equal(gguf_get_str(f, key, &s, &n), 0);
            for (size_t j = 0; j < n; j++)
                acc += (uint8_t)s[j];
            break;
        case GGUF_TYPE_ARRAY:
            assert_int_equal(gguf_get_arr(f, key, &et, &cnt, &data), 0);
            if (et == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < cnt; j++) {
                    assert_int_equal(gguf_arr_str(f, i, j, &s, &n), 0);
                    if (n)
                        acc += (uint8_t)s[0] + (uint8_t)s[n - 1];
                }
            } else if (cnt) {
                const uint8_t *p = data;
                acc += p[0] + p[cnt * elem_size(et) - 1];
            }
            break;
        default:
            acc += (uint64_t)gguf_get_u64(f, key, &u) + (uint64_t)gguf_get_i64(f, key, &sv) +
                   (uint64_t)gguf_get_f32(f, key, &fl) + (uint64_t)gguf_get_f64(f, key, &d) +
                   (uint64_t)gguf_get_bool(f, key, &b);
            break;
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        assert_true(t->n_bytes > 0);
        acc += p[0] + p[t->n_bytes - 1] + (uint8_t)t->name[0];
    }
    sink += acc;
}

/* Opens an exact-size heap copy of buf[0..n); returns the status. */
static int try_open(const uint8_t *buf, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n)
        memcpy(copy, buf, n);
    gguf_file *f = (gguf_file *)(uintptr_t)1; /* must be reset to NULL on failure */
    char err[256] = "";
    int rc = gguf_open_memory(copy, n, &f, err, sizeof err);
    if (rc == 0) {
        assert_non_null(f);
        sweep(f);
        gguf_close(f);
    } else {
        assert_null(f);
        assert_true(err[0] != '\0' || rc == KVS_ENOMEM); /* a reason is always given */
    }
    free(copy);
    return rc;
}

/* Statuses any damaged file may legitimately produce. */
static int acceptable(int rc)
{
    return rc == 0 || rc == KVS_EFORMAT || rc == KVS_ETRUNC || rc == KVS_EVERSION ||
           rc == KVS_EUNSUPPORTED || rc == KVS_EKEYTYPE;
}

/* A mutable copy of the pristine file. */
static uint8_t *dup_model(void)
{
    uint8_t *b = malloc(M.size);
    assert_non_null(b);
    memcpy(b, M.buf, M.size);
    return b;
}

static const kv_loc *kv_by_name(const char *key)
{
    for (size_t i = 0; i < M.n_kv; i++)
        if (!strcmp(M.kv[i].key, key))
            return &M.kv[i];
    fail_msg("key %s not in the test model", key);
    return &M.kv[0]; /* not reached */
}

static const t_loc *t_by_name(const char *name)
{
    for (size_t i = 0; i < M.n_t; i++)
        if (!strcmp(M.t[i].name, name))
            return &M.t[i];
    fail_msg("tensor %s not in the test model", name);
    return &M.t[0]; /* not reached */
}

/* Applies a u64 or u32 lie at off, checks the status, and restores the byte copy. */
static void expect64(uint8_t *b, size_t off, uint64_t v, int want, const char *what)
{
    uint8_t save[8];
    memcpy(save, b + off, 8);
    wr64(b + off, v);
    int rc = try_open(b, M.size);
    if (rc != want)
        fail_msg("%s = %llu: got %s, want %s", what, (unsigned long long)v, status_str(rc),
                 status_str(want));
    memcpy(b + off, save, 8);
}

static void expect32(uint8_t *b, size_t off, uint32_t v, int want, const char *what)
{
    uint8_t save[4];
    memcpy(save, b + off, 4);
    wr32(b + off, v);
    int rc = try_open(b, M.size);
    if (rc != want)
        fail_msg("%s = %u: got %s, want %s", what, v, status_str(rc), status_str(want));
    memcpy(b + off, save, 4);
}

/* ---- tests ---- */

static void test_pristine_opens(void **state)
{
    (void)state;
    NEED_MODEL();
    assert_int_equal(try_open(M.buf, M.size), 0);
    /* The indexer agrees with the reader on where the data starts. */
    gguf_file *f;
    assert_int_equal(gguf_open_memory(M.buf, M.size, &f, NULL, 0), 0);
    const gguf_tensor *t0 = gguf_tensor_at(f, 0);
    assert_ptr_equal(t0->data, M.buf + M.data_start + M.t[0].off_val);
    gguf_close(f);
}

static void test_truncations(void **state)
{
    (void)state;
    NEED_MODEL();
    /* The last tensor ends exactly at the end of this file, so every shorter length lies. */
    for (size_t n = 0; n <= M.data_start; n++) {
        int rc = try_open(M.buf, n);
        if (rc != KVS_ETRUNC)
            fail_msg("length %zu: got %s, want truncated", n, status_str(rc));
    }
    for (size_t n = M.data_start; n < M.size; n += 997)
        assert_int_equal(try_open(M.buf, n), KVS_ETRUNC);
    assert_int_equal(try_open(M.buf, M.size - 1), KVS_ETRUNC);
    /* Trailing bytes after the data are harmless. */
    uint8_t *longer = malloc(M.size + 100);
    assert_non_null(longer);
    memcpy(longer, M.buf, M.size);
    memset(longer + M.size, 0xAB, 100);
    assert_int_equal(try_open(longer, M.size + 100), 0);
    free(longer);
}

static uint64_t prng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_bit_flips(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    int seen[16] = {0};
    /* Every bit of the fixed 24-byte preamble, then a deterministic sample of the header. */
    for (size_t bit = 0; bit < 24 * 8; bit++) {
        b[bit / 8] ^= (uint8_t)(1u << bit % 8);
        int rc = try_open(b, M.size);
        if (bit < 32)
            assert_int_equal(rc, KVS_EFORMAT); /* magic */
        else if (bit < 64)
            assert_int_equal(rc, bit == 32 ? 0 : KVS_EVERSION); /* 3 ^ 1 = 2 is readable */
        else
            assert_true(acceptable(rc));
        b[bit / 8] ^= (uint8_t)(1u << bit % 8);
    }
    uint64_t s = 12345;
    for (int i = 0; i < 4000; i++) {
        uint64_t r = prng(&s);
        size_t off = (size_t)(r % M.header_end);
        uint8_t mask = (uint8_t)(1u << (r >> 32) % 8);
        if (i % 4 == 3) /* some multi-bit damage too */
            mask = (uint8_t)(r >> 40) | 1;
        b[off] ^= mask;
        int rc = try_open(b, M.size);
        if (!acceptable(rc))
            fail_msg("flip 0x%02x at %zu: unexpected %s", mask, off, status_str(rc));
        seen[-rc]++;
        b[off] ^= mask;
    }
    /* The sample must actually reach the interesting paths. */
    assert_true(seen[0] > 0);
    assert_true(seen[-KVS_EFORMAT] > 0);
    assert_true(seen[-KVS_ETRUNC] > 0);
    assert_true(seen[-KVS_EUNSUPPORTED] > 0);
    assert_int_equal(memcmp(b, M.buf, M.size), 0);
    free(b);
}

static void test_bad_magic_and_version(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    expect32(b, 0, 0x4c4d4747u /* "GGML" */, KVS_EFORMAT, "magic");
    expect32(b, 0, 0x47475546u /* byte-swapped */, KVS_EFORMAT, "magic");
    expect32(b, 0, 0, KVS_EFORMAT, "magic");
    expect32(b, 4, 0, KVS_EVERSION, "version");
    expect32(b, 4, 1, KVS_EVERSION, "version");
    expect32(b, 4, 4, KVS_EVERSION, "version");
    expect32(b, 4, 0x03000000u, KVS_EVERSION, "version"); /* a big-endian file */
    expect32(b, 4, 2, 0, "version");                      /* v2 has v3's layout */
    free(b);
}

static void test_lying_counts(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    expect64(b, 8, UINT64_MAX, KVS_ETRUNC, "n_tensors");
    expect64(b, 8, 1ull << 40, KVS_ETRUNC, "n_tensors");
    expect64(b, 8, M.size / 32 + 1, KVS_ETRUNC, "n_tensors");
    expect64(b, 16, UINT64_MAX, KVS_ETRUNC, "n_kv");
    expect64(b, 16, 1ull << 61, KVS_ETRUNC, "n_kv");
    expect64(b, 16, M.size, KVS_ETRUNC, "n_kv");
    /* One more entry than present: the first tensor info is parsed as metadata and fails. */
    int rc;
    wr64(b + 16, M.n_kv + 1);
    rc = try_open(b, M.size);
    assert_true(rc != 0 && acceptable(rc));
    wr64(b + 16, M.n_kv);
    wr64(b + 8, M.n_t + 1);
    rc = try_open(b, M.size);
    assert_true(rc != 0 && acceptable(rc));
    wr64(b + 8, M.n_t);

    const kv_loc *tok = kv_by_name("tokenizer.ggml.tokens");
    const kv_loc *sco = kv_by_name("tokenizer.ggml.scores");
    const kv_loc *typ = kv_by_name("tokenizer.ggml.token_type");
    expect64(b, tok->arr_count, UINT64_MAX, KVS_ETRUNC, "string array count");
    expect64(b, tok->arr_count, M.size / 8, KVS_ETRUNC, "string array count");
    /* Counts whose byte size wraps around 2^64 to something small. */
    expect64(b, sco->arr_count, (UINT64_MAX / 4) + 2, KVS_ETRUNC, "f32 array count");
    expect64(b, typ->arr_count, 1ull << 62, KVS_ETRUNC, "i32 array count");
    expect64(b, sco->arr_count, M.size, KVS_ETRUNC, "f32 array count");
    /* A shorter count desynchronises the parse: some error, never a crash. */
    wr64(b + sco->arr_count, 511);
    rc = try_open(b, M.size);
    assert_true(rc != 0 && acceptable(rc));
    memcpy(b, M.buf, M.size);
    free(b);
}

static void test_lying_lengths(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    const kv_loc *first = &M.kv[0];
    expect64(b, first->key_len, UINT64_MAX, KVS_ETRUNC, "key length");
    expect64(b, first->key_len, 1ull << 63, KVS_ETRUNC, "key length");
    expect64(b, first->key_len, M.size - first->key_len - 8 + 1, KVS_ETRUNC, "key length");
    const kv_loc *model = kv_by_name("tokenizer.ggml.model");
    expect64(b, model->value, UINT64_MAX, KVS_ETRUNC, "string length");
    expect64(b, model->value, M.size - model->value - 8 + 1, KVS_ETRUNC, "string length");
    const kv_loc *tok = kv_by_name("tokenizer.ggml.tokens");
    expect64(b, tok->arr_first, UINT64_MAX - 7, KVS_ETRUNC, "array string length");
    const t_loc *t = &M.t[M.n_t - 1];
    expect64(b, t->name_len, UINT64_MAX, KVS_ETRUNC, "tensor name length");
    expect64(b, t->name_len, M.size - t->name_len - 8 + 1, KVS_ETRUNC, "tensor name length");
    /* Short-by-a-few lengths desynchronise: some error, never a crash or a success. */
    for (uint64_t d = 1; d <= 8; d++) {
        wr64(b + first->key_len, rd64(M.buf + first->key_len) - d);
        int rc = try_open(b, M.size);
        assert_true(rc != 0 && acceptable(rc));
        wr64(b + first->key_len, rd64(M.buf + first->key_len) + d);
        rc = try_open(b, M.size);
        assert_true(rc != 0 && acceptable(rc));
    }
    free(b);
}

static void test_lying_types(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    const kv_loc *arch = kv_by_name("general.architecture");
    expect32(b, arch->type, GGUF_TYPE_COUNT_, KVS_EFORMAT, "value type");
    expect32(b, arch->type, UINT32_MAX, KVS_EFORMAT, "value type");
    const kv_loc *sco = kv_by_name("tokenizer.ggml.scores");
    expect32(b, sco->arr_type, 13, KVS_EFORMAT, "array element type");
    expect32(b, sco->arr_type, 0x80000000u, KVS_EFORMAT, "array element type");
    expect32(b, sco->arr_type, GGUF_TYPE_ARRAY, KVS_EUNSUPPORTED, "nested array");
    const t_loc *emb = t_by_name("token_embd.weight");
    /* Q4_K: a real type the reader sizes (engine/dtype.c), but a 64-wide row is not a whole
     * number of its 256-value blocks; NVFP4: named, its layout unknown here, so unreadable. */
    expect32(b, emb->type, 12, KVS_EFORMAT, "tensor type");
    expect32(b, emb->type, 40, KVS_EUNSUPPORTED, "tensor type");
    expect32(b, emb->type, 4 /* removed from ggml */, KVS_EUNSUPPORTED, "tensor type");
    expect32(b, emb->type, UINT32_MAX, KVS_EUNSUPPORTED, "tensor type");
    /* Q8_0 on a 172-wide row is not a whole number of blocks. */
    const t_loc *down = t_by_name("blk.0.ffn_down.weight");
    expect32(b, down->type, GGML_TYPE_Q8_0, KVS_EFORMAT, "tensor type");
    /* general.alignment of the wrong type is caught by the kv-type check. */
    free(b);
}

static void test_lying_dims(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    const t_loc *emb = t_by_name("token_embd.weight"); /* [64, 512], first in the data */
    const t_loc *last = &M.t[M.n_t - 1];               /* [64], last in the data */
    expect32(b, emb->n_dims, 0, KVS_EFORMAT, "n_dims");
    expect32(b, emb->n_dims, GGUF_MAX_DIMS + 1, KVS_EFORMAT, "n_dims");
    expect32(b, emb->n_dims, UINT32_MAX, KVS_EFORMAT, "n_dims");
    expect64(b, emb->dims, 0, KVS_EFORMAT, "dims[0]");
    expect64(b, emb->dims + 8, 0, KVS_EFORMAT, "dims[1]");
    expect64(b, emb->dims, UINT64_MAX, KVS_EFORMAT, "dims[0]");
    /* 2^33 * 2^31 = 2^64 wraps to 0 in unchecked arithmetic. */
    wr64(b + emb->dims, 1ull << 33);
    expect64(b, emb->dims + 8, 1ull << 31, KVS_EFORMAT, "dims product");
    expect64(b, emb->dims + 8, (1ull << 31) + 1, KVS_EFORMAT, "dims product");
    memcpy(b, M.buf, M.size);
    /* Plausible but too big: past the end for the last tensor, overlapping for the first. */
    expect64(b, last->dims, 128, KVS_ETRUNC, "last dims[0]");
    expect64(b, emb->dims + 8, 513, KVS_EFORMAT, "first dims[1]");
    expect64(b, emb->dims + 8, 512 * 1000, KVS_ETRUNC, "first dims[1]");
    free(b);
}

static void test_lying_offsets(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    const t_loc *emb = t_by_name("token_embd.weight");
    const t_loc *last = &M.t[M.n_t - 1];
    uint64_t data_len = M.size - M.data_start;
    expect64(b, last->offset, last->off_val + 32, KVS_ETRUNC, "offset");
    expect64(b, last->offset, data_len, KVS_ETRUNC, "offset");
    expect64(b, last->offset, (data_len + 31) / 32 * 32 + 32, KVS_ETRUNC, "offset");
    expect64(b, last->offset, UINT64_MAX - 31, KVS_ETRUNC, "offset"); /* aligned, wraps */
    expect64(b, last->offset, last->off_val + 1, KVS_EFORMAT, "offset misaligned");
    expect64(b, emb->offset, 4, KVS_EFORMAT, "offset misaligned");
    expect64(b, emb->offset, UINT64_MAX, KVS_EFORMAT, "offset misaligned");
    /* Two tensors at one offset alias each other. */
    expect64(b, emb->offset, M.t[1].off_val, KVS_EFORMAT, "overlapping offset");
    free(b);
}

static void test_duplicates(void **state)
{
    (void)state;
    NEED_MODEL();
    uint8_t *b = dup_model();
    const kv_loc *bos = kv_by_name("tokenizer.ggml.bos_token_id");
    const kv_loc *eos = kv_by_name("tokenizer.ggml.eos_token_id");
    assert_int_equal(strlen(bos->key), strlen(eos->key));
    memcpy(b + eos->key_len + 8, bos->key, strlen(bos->key));
    assert_int_equal(try_open(b, M.size), KVS_EFORMAT);
    memcpy(b, M.buf, M.size);
    const t_loc *q0 = t_by_name("blk.0.attn_q.weight");
    const t_loc *q1 = t_by_name("blk.1.attn_q.weight");
    memcpy(b + q1->name_len + 8, q0->name, strlen(q0->name));
    assert_int_equal(try_open(b, M.size), KVS_EFORMAT);
    free(b);
}

/* A few of the cases above through gguf_open on real files (mmap path, empty-file path). */
static void test_files_on_disk(void **state)
{
    (void)state;
    NEED_MODEL();
    char dir[] = "/tmp/kvs-gguf-hostile-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    uint8_t *b = dup_model();
    struct {
        size_t len;
        size_t off32; /* 0: no patch */
        uint32_t v32;
        int want;
    } cases[] = {
        {M.size, 0, 0, 0},
        {0, 0, 0, KVS_ETRUNC},
        {3, 0, 0, KVS_ETRUNC},
        {M.header_end / 2, 0, 0, KVS_ETRUNC},
        {M.size - 1, 0, 0, KVS_ETRUNC},
        {M.size, 4, 4, KVS_EVERSION},
        {M.size, 4, 1, KVS_EVERSION},
        {M.size, 0, 0x12345678u, KVS_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(b, M.buf, M.size);
        if (cases[i].off32 || cases[i].v32)
            wr32(b + cases[i].off32, cases[i].v32);
        FILE *fp = fopen(path, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(b, 1, cases[i].len, fp), cases[i].len);
        fclose(fp);
        gguf_file *f = NULL;
        char err[256] = "";
        int rc = gguf_open(path, &f, err, sizeof err);
        if (rc != cases[i].want)
            fail_msg("file case %zu: got %s (%s), want %s", i, status_str(rc), err,
                     status_str(cases[i].want));
        if (!rc)
            sweep(f);
        gguf_close(f);
    }
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(dir, &f, NULL, 0), KVS_EIO); /* a directory */
    unlink(path);
    assert_int_equal(gguf_open(path, &f, NULL, 0), KVS_EIO); /* missing */
    assert_null(f);
    rmdir(dir);
    free(b);
}

/* ---- writer ---- */

static int fill_ramp(void *user, uint64_t row, uint64_t n_rows, void *dst, size_t row_bytes)
{
    const uint64_t *cols = user;
    float *out = dst;
    assert_int_equal(row_bytes, *cols * 4);
    for (uint64_t r = 0; r < n_rows; r++)
        for (uint64_t c = 0; c < *cols; c++)
            out[r * *cols + c] = (float)((row + r) * 1000 + c);
    return 0;
}

static int fill_fails(void *user, uint64_t row, uint64_t n_rows, void *dst, size_t row_bytes)
{
    (void)user, (void)row, (void)n_rows, (void)dst, (void)row_bytes;
    return KVS_ECANCELED;
}

static const int32_t RT_INTS[5] = {1, -2, 3, -4, 5};
static const double RT_DBL[3] = {1.5, -2.5, 1e300};
static const char *const RT_STRS[3] = {"x", "", "zzz"};

/* One entry of every metadata type (19 in all). */
static void add_all_kvs(gguf_writer *w)
{
    assert_int_equal(gguf_writer_add_u8(w, "t.u8", 200), 0);
    assert_int_equal(gguf_writer_add_i8(w, "t.i8", -100), 0);
    assert_int_equal(gguf_writer_add_u16(w, "t.u16", 60000), 0);
    assert_int_equal(gguf_writer_add_i16(w, "t.i16", -30000), 0);
    assert_int_equal(gguf_writer_add_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(gguf_writer_add_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(gguf_writer_add_u64(w, "t.u64", UINT64_MAX - 5), 0);
    assert_int_equal(gguf_writer_add_i64(w, "t.i64", INT64_MIN + 7), 0);
    assert_int_equal(gguf_writer_add_f32(w, "t.f32", 3.25f), 0);
    assert_int_equal(gguf_writer_add_f64(w, "t.f64", 0.1), 0);
    assert_int_equal(gguf_writer_add_bool(w, "t.bool", 7), 0);
    assert_int_equal(gguf_writer_add_str(w, "t.str", "hello"), 0);
    assert_int_equal(gguf_writer_add_strn(w, "t.strn", "a\0b", 3), 0);
    assert_int_equal(gguf_writer_add_str(w, "t.empty", ""), 0);
    assert_int_equal(gguf_writer_add_arr(w, "t.arr_i32", GGUF_TYPE_INT32, RT_INTS, 5), 0);
    assert_int_equal(gguf_writer_add_arr(w, "t.arr_f64", GGUF_TYPE_FLOAT64, RT_DBL, 3), 0);
    assert_int_equal(gguf_writer_add_arr(w, "t.arr_empty", GGUF_TYPE_UINT8, NULL, 0), 0);
    assert_int_equal(gguf_writer_add_arr_str(w, "t.arr_str", RT_STRS, NULL, 3), 0);
    assert_int_equal(gguf_writer_add_u32(w, "general.alignment", 64), 0);
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    gguf_writer *w;
    assert_int_equal(gguf_writer_create(&w), 0);
    add_all_kvs(w);
    const int32_t *ints = RT_INTS;
    const double *dbl = RT_DBL;
    const char *const *strs = RT_STRS;
    /* Rejections leave the writer usable. */
    assert_int_equal(gguf_writer_add_u8(w, "t.u8", 1), KVS_EINVAL);
    assert_int_equal(gguf_writer_add_u32(w, "general.alignment", 64), KVS_EINVAL);
    assert_int_equal(gguf_writer_add_arr(w, "t.bad", GGUF_TYPE_STRING, ints, 1), KVS_EINVAL);
    assert_int_equal(gguf_writer_add_arr(w, "t.bad", GGUF_TYPE_ARRAY, ints, 1), KVS_EINVAL);
    gguf_writer *w2;
    assert_int_equal(gguf_writer_create(&w2), 0);
    assert_int_equal(gguf_writer_add_u32(w2, "general.alignment", 48), KVS_EINVAL);
    gguf_writer_destroy(w2);

    float small[6] = {1, 2, 3, 4, 5, 6};
    uint64_t d_small[2] = {3, 2};
    assert_int_equal(gguf_writer_add_tensor(w, "small", 2, d_small, GGML_TYPE_F32, small), 0);
    uint16_t h[40];
    for (int i = 0; i < 40; i++)
        h[i] = ggml_fp32_to_fp16((float)i / 4);
    uint64_t d_h[3] = {5, 4, 2};
    assert_int_equal(gguf_writer_add_tensor(w, "half", 3, d_h, GGML_TYPE_F16, h), 0);
    /* Big enough that the fill runs in several chunks (rows of 4 KB, chunks of 4 MB). */
    uint64_t cols = 1024, d_ramp[2] = {1024, 1500};
    assert_int_equal(
        gguf_writer_add_tensor_fill(w, "ramp", 2, d_ramp, GGML_TYPE_F32, fill_ramp, &cols), 0);
    uint8_t q[34 * 2] = {0};
    uint64_t d_q[1] = {64};
    assert_int_equal(gguf_writer_add_tensor(w, "q", 1, d_q, GGML_TYPE_Q8_0, q), 0);
    uint64_t d_bad[1] = {33};
    assert_int_equal(gguf_writer_add_tensor(w, "bad", 1, d_bad, GGML_TYPE_Q8_0, q), KVS_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "bad", 1, d_q, 99, q), KVS_EINVAL);
    assert_int_equal(gguf_writer_add_tensor(w, "small", 1, d_q, GGML_TYPE_F32, q), KVS_EINVAL);
    uint64_t d_zero[2] = {4, 0};
    assert_int_equal(gguf_writer_add_tensor(w, "bad", 2, d_zero, GGML_TYPE_F32, q), KVS_EINVAL);

    void *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, &buf, &size), 0);
    assert_int_equal(size, gguf_writer_file_size(w));
    gguf_file *f;
    char err[256] = "";
    int rc = gguf_open_memory(buf, size, &f, err, sizeof err);
    if (rc)
        fail_msg("round trip: %s: %s", status_str(rc), err);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_kv(f), 19);
    uint64_t u;
    int64_t i64;
    float fl;
    double d;
    int b;
    const char *s;
    size_t n;
    assert_int_equal(gguf_get_u64(f, "t.u8", &u), 0);
    assert_int_equal(u, 200);
    assert_int_equal(gguf_kv_type(f, gguf_find_key(f, "t.u8")), GGUF_TYPE_UINT8);
    assert_int_equal(gguf_get_i64(f, "t.i8", &i64), 0);
    assert_int_equal(i64, -100);
    assert_int_equal(gguf_kv_type(f, gguf_find_key(f, "t.i8")), GGUF_TYPE_INT8);
    assert_int_equal(gguf_get_u64(f, "t.u16", &u), 0);
    assert_int_equal(u, 60000);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i64), 0);
    assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_u64(f, "t.u32", &u), 0);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i64), 0);
    assert_int_equal(i64, -2000000000);
    assert_int_equal(gguf_get_u64(f, "t.u64", &u), 0);
    assert_true(u == UINT64_MAX - 5);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i64), 0);
    assert_true(i64 == INT64_MIN + 7);
    assert_int_equal(gguf_get_f32(f, "t.f32", &fl), 0);
    assert_true(fl == 3.25f);
    assert_int_equal(gguf_get_f64(f, "t.f64", &d), 0);
    assert_true(d == 0.1);
    assert_int_equal(gguf_kv_type(f, gguf_find_key(f, "t.f64")), GGUF_TYPE_FLOAT64);
    assert_int_equal(gguf_get_bool(f, "t.bool", &b), 0);
    assert_int_equal(b, 1);
    assert_int_equal(gguf_get_str(f, "t.str", &s, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "hello", 5);
    assert_int_equal(gguf_get_str(f, "t.strn", &s, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "a\0b", 3);
    assert_int_equal(gguf_get_str(f, "t.empty", &s, &n), 0);
    assert_int_equal(n, 0);
    enum gguf_type et;
    uint64_t cnt;
    const void *data;
    assert_int_equal(gguf_get_arr(f, "t.arr_i32", &et, &cnt, &data), 0);
    assert_int_equal(et, GGUF_TYPE_INT32);
    assert_int_equal(cnt, 5);
    assert_memory_equal(data, ints, sizeof RT_INTS);
    assert_int_equal(gguf_get_arr(f, "t.arr_f64", &et, &cnt, &data), 0);
    assert_int_equal(et, GGUF_TYPE_FLOAT64);
    assert_int_equal(cnt, 3);
    assert_memory_equal(data, dbl, sizeof RT_DBL);
    assert_int_equal(gguf_get_arr(f, "t.arr_empty", &et, &cnt, &data), 0);
    assert_int_equal(cnt, 0);
    int64_t ks = gguf_find_key(f, "t.arr_str");
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(gguf_arr_str(f, ks, i, &s, &n), 0);
        assert_int_equal(n, strlen(strs[i]));
        assert_memory_equal(s, strs[i], n);
    }
    assert_int_equal(gguf_arr_str(f, ks, 3, &s, &n), KVS_ERANGE);

    assert_int_equal(gguf_n_tensors(f), 4);
    const gguf_tensor *t = gguf_tensor_at(f, gguf_find_tensor(f, "small"));
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->dims[0], 3);
    assert_int_equal(t->dims[1], 2);
    assert_memory_equal(t->data, small, sizeof small);
    t = gguf_tensor_at(f, gguf_find_tensor(f, "half"));
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(t->type, GGML_TYPE_F16);
    assert_int_equal(t->n_elements, 40);
    assert_memory_equal(t->data, h, sizeof h);
    t = gguf_tensor_at(f, gguf_find_tensor(f, "ramp"));
    assert_int_equal(t->n_bytes, 1024 * 1500 * 4);
    assert_int_equal((uintptr_t)((const uint8_t *)t->data - (const uint8_t *)buf) % 64, 0);
    for (uint64_t r = 0; r < 1500; r += 97) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + (r * 1024 + 1023) * 4, 4);
        assert_true(v == (float)(r * 1000 + 1023));
    }
    t = gguf_tensor_at(f, gguf_find_tensor(f, "q"));
    assert_int_equal(t->type, GGML_TYPE_Q8_0);
    assert_int_equal(t->n_bytes, 68);
    gguf_close(f);

    /* Copying every entry to a second writer reproduces the metadata byte for byte. */
    assert_int_equal(gguf_open_memory(buf, size, &f, NULL, 0), 0);
    assert_int_equal(gguf_writer_create(&w2), 0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        assert_int_equal(gguf_writer_copy_kv(w2, f, i), 0);
    assert_int_equal(gguf_writer_copy_kv(w2, f, 0), KVS_EINVAL); /* duplicate */
    void *buf2;
    size_t size2;
    assert_int_equal(gguf_writer_write_mem(w2, &buf2, &size2), 0);
    gguf_close(f);
    /* A writer given the same entries directly produces the same bytes. */
    gguf_writer *w3;
    void *buf3;
    size_t size3;
    assert_int_equal(gguf_writer_create(&w3), 0);
    add_all_kvs(w3);
    assert_int_equal(gguf_writer_write_mem(w3, &buf3, &size3), 0);
    assert_int_equal(size2, size3);
    assert_memory_equal(buf2, buf3, size2);
    free(buf3);
    gguf_writer_destroy(w3);
    free(buf2);
    gguf_writer_destroy(w2);
    free(buf);

    /* A failing fill aborts the write with its status and leaves no file behind. */
    assert_int_equal(gguf_writer_create(&w2), 0);
    assert_int_equal(
        gguf_writer_add_tensor_fill(w2, "x", 2, d_ramp, GGML_TYPE_F32, fill_fails, NULL), 0);
    char path[] = "/tmp/kvs-gguf-write-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w2, path, err, sizeof err), KVS_ECANCELED);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(gguf_writer_write(w2, "/nonexistent-dir/x.gguf", err, sizeof err), KVS_EIO);
    gguf_writer_destroy(w2);
    gguf_writer_destroy(w);
}

/* Offset of the dims of the tensor whose one-letter name is c, in a writer-made file. */
static size_t find_dims(const uint8_t *buf, size_t size, char c, uint32_t n_dims)
{
    for (size_t i = 24; i + 13 < size; i++)
        if (rd64(buf + i) == 1 && buf[i + 8] == (uint8_t)c && rd32(buf + i + 9) == n_dims)
            return i + 13;
    fail_msg("tensor %c not found", c);
    return 0;
}

/* A writer-made file whose last tensor declares more bytes than the data holds. */
static void test_writer_short_data(void **state)
{
    (void)state;
    gguf_writer *w;
    assert_int_equal(gguf_writer_create(&w), 0);
    float a[64 * 4] = {0}, c[64] = {0};
    uint64_t da[2] = {64, 4}, dc[1] = {64};
    assert_int_equal(gguf_writer_add_tensor(w, "a", 2, da, GGML_TYPE_F32, a), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "c", 1, dc, GGML_TYPE_F32, c), 0);
    uint8_t *buf;
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, (void **)&buf, &size), 0);
    gguf_writer_destroy(w);
    assert_int_equal(try_open(buf, size), 0);
    size_t a_dims = find_dims(buf, size, 'a', 2), c_dims = find_dims(buf, size, 'c', 1);
    assert_int_equal(rd64(buf + c_dims), 64);
    wr64(buf + c_dims, 65); /* declares 260 bytes, 256 are there */
    assert_int_equal(try_open(buf, size), KVS_ETRUNC);
    wr64(buf + c_dims, 64);
    assert_int_equal(try_open(buf, size - 4), KVS_ETRUNC); /* data cut short instead */
    /* Tensor a declared one row longer runs into c. */
    assert_int_equal(rd64(buf + a_dims + 8), 4);
    wr64(buf + a_dims + 8, 5);
    assert_int_equal(try_open(buf, size), KVS_EFORMAT);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pristine_opens),    cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_bit_flips),         cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_lying_counts),      cmocka_unit_test(test_lying_lengths),
        cmocka_unit_test(test_lying_types),       cmocka_unit_test(test_lying_dims),
        cmocka_unit_test(test_lying_offsets),     cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_files_on_disk),     cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_short_data),
    };
    return cmocka_run_group_tests_name("gguf_hostile", tests, setup, teardown);
}
