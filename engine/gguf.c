/* GGUF reader. The header is parsed once, with every read bounds-checked against the file
 * size; the parsed index (kv entries, tensor infos) points into the mapping. */
#define _DEFAULT_SOURCE /* madvise */
#include "engine/gguf.h"

#include "engine/dtype.h"

#include "common/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */

/* printf precision for a key or tensor name in an error: bounded, because a hostile length
 * cast to int could turn negative and make printf read until a NUL past the mapping. */
#define NAME_PREC(len) ((int)((len) > 96 ? 96 : (len)))

typedef struct gguf_kv {
    const char *key;
    size_t key_len;
    enum gguf_type type;
    const uint8_t *value; /* scalar value, string length prefix, or first array element */
    enum gguf_type arr_type;
    uint64_t arr_count;
    const uint8_t **arr_strs; /* string arrays: pointer to each element's length prefix */
} gguf_kv;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    bool mapped; /* base came from mmap and is ours to unmap */
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    gguf_tensor *tensors;
};

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *err;
    size_t err_len;
} cursor;

static int fail(cursor *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cursor *c, int status, const char *fmt, ...)
{
    if (c->err && c->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static bool have(const cursor *c, uint64_t n)
{
    return n <= c->size - c->pos;
}

static int read_bytes(cursor *c, void *dst, size_t n, const char *what)
{
    if (!have(c, n))
        return fail(c, KVS_ETRUNC, "truncated: %s at offset %zu needs %zu bytes, file has %zu",
                    what, c->pos, n, c->size);
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int read_u32(cursor *c, uint32_t *v, const char *what)
{
    return read_bytes(c, v, 4, what);
}
static int read_u64(cursor *c, uint64_t *v, const char *what)
{
    return read_bytes(c, v, 8, what);
}

/* A string: u64 length then bytes; on success *s points into the file. */
static int read_str(cursor *c, const char **s, size_t *len, const char *what)
{
    uint64_t n = 0;
    size_t at = c->pos;
    int rc = read_u64(c, &n, what);
    if (rc)
        return rc;
    if (!have(c, n))
        return fail(c, KVS_ETRUNC,
                    "truncated: %s at offset %zu declares %llu bytes, only %zu remain", what, at,
                    (unsigned long long)n, c->size - c->pos);
    *s = (const char *)(c->base + c->pos);
    *len = (size_t)n;
    c->pos += n;
    return 0;
}

size_t gguf_type_size(enum gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static int parse_kv(cursor *c, gguf_kv *kv)
{
    int rc = read_str(c, &kv->key, &kv->key_len, "metadata key");
    if (rc)
        return rc;
    uint32_t t = 0;
    if ((rc = read_u32(c, &t, "metadata value type")))
        return rc;
    if (t >= GGUF_TYPE_COUNT_)
        return fail(c, KVS_EFORMAT, "key '%.*s': unknown value type %u", NAME_PREC(kv->key_len),
                    kv->key, t);
    kv->type = (enum gguf_type)t;
    kv->value = c->base + c->pos;
    if (kv->type == GGUF_TYPE_STRING) {
        const char *s;
        size_t n;
        return read_str(c, &s, &n, "metadata string");
    }
    if (kv->type != GGUF_TYPE_ARRAY) {
        size_t n = gguf_type_size(kv->type);
        if (!have(c, n))
            return fail(c, KVS_ETRUNC, "truncated: value of '%.*s' at offset %zu",
                        NAME_PREC(kv->key_len), kv->key, c->pos);
        c->pos += n;
        return 0;
    }
    uint32_t et = 0;
    uint64_t count = 0;
    if ((rc = read_u32(c, &et, "array element type")) || (rc = read_u64(c, &count, "array count")))
        return rc;
    if (et >= GGUF_TYPE_COUNT_)
        return fail(c, KVS_EFORMAT, "key '%.*s': unknown array element type %u",
                    NAME_PREC(kv->key_len), kv->key, et);
    if (et == GGUF_TYPE_ARRAY) /* valid GGUF, but nothing we read uses nested arrays */
        return fail(c, KVS_EUNSUPPORTED, "key '%.*s': array of type %u is not supported",
                    NAME_PREC(kv->key_len), kv->key, et);
    kv->arr_type = (enum gguf_type)et;
    kv->arr_count = count;
    kv->value = c->base + c->pos;
    if (et != GGUF_TYPE_STRING) {
        size_t es = gguf_type_size(kv->arr_type);
        if (count > (c->size - c->pos) / es)
            return fail(c, KVS_ETRUNC,
                        "truncated: array '%.*s' declares %llu elements of %zu "
                        "bytes at offset %zu, file has %zu",
                        NAME_PREC(kv->key_len), kv->key, (unsigned long long)count, es, c->pos,
                        c->size);
        c->pos += count * es;
        return 0;
    }
    /* Each string takes at least its 8-byte length, which bounds the index we allocate. */
    if (count > (c->size - c->pos) / 8)
        return fail(c, KVS_ETRUNC,
                    "truncated: string array '%.*s' declares %llu elements, "
                    "more than the %zu bytes left can hold",
                    NAME_PREC(kv->key_len), kv->key, (unsigned long long)count, c->size - c->pos);
    kv->arr_strs = malloc((count ? count : 1) * sizeof *kv->arr_strs);
    if (!kv->arr_strs)
        return KVS_ENOMEM;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        size_t n;
        kv->arr_strs[i] = c->base + c->pos;
        if ((rc = read_str(c, &s, &n, "array string")))
            return rc;
    }
    return 0;
}

uint64_t ggml_type_nbytes(uint32_t type, uint64_t n)
{
    return dtype_nbytes(type, n);
}

const char *ggml_type_name(uint32_t type)
{
    return dtype_name(type);
}

static int parse_tensor(cursor *c, gguf_tensor *t)
{
    int rc = read_str(c, &t->name, &t->name_len, "tensor name");
    if (rc)
        return rc;
    if ((rc = read_u32(c, &t->n_dims, "tensor n_dims")))
        return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c, KVS_EFORMAT, "tensor '%.*s': %u dimensions (1..%d allowed)",
                    NAME_PREC(t->name_len), t->name, t->n_dims, GGUF_MAX_DIMS);
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->dims[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((rc = read_u64(c, &t->dims[d], "tensor dim")))
            return rc;
        /* 2^40 elements is far beyond any file we can map; it also keeps products exact. */
        if (t->dims[d] == 0 || t->dims[d] > (1ull << 40) || n > (1ull << 40) / t->dims[d])
            return fail(c, KVS_EFORMAT, "tensor '%.*s': absurd dimension %llu",
                        NAME_PREC(t->name_len), t->name, (unsigned long long)t->dims[d]);
        n *= t->dims[d];
    }
    t->n_elements = n;
    if ((rc = read_u32(c, &t->type, "tensor type")))
        return rc;
    const dtype_info *ti = dtype_get(t->type);
    if (!ti || !ti->block)
        return fail(c, KVS_EUNSUPPORTED, "tensor '%.*s': unsupported tensor type %s (%u)",
                    NAME_PREC(t->name_len), t->name, dtype_name(t->type), t->type);
    if (t->dims[0] % ti->block)
        return fail(c, KVS_EFORMAT,
                    "tensor '%.*s': row of %llu elements is not a whole number "
                    "of %s blocks",
                    NAME_PREC(t->name_len), t->name, (unsigned long long)t->dims[0], ti->name);
    t->n_bytes = ggml_type_nbytes(t->type, n);
    uint64_t off = 0;
    if ((rc = read_u64(c, &off, "tensor offset")))
        return rc;
    t->data = (const void *)(uintptr_t)off; /* resolved once the data section is known */
    return 0;
}

static bool names_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && memcmp(a, b, alen) == 0;
}

typedef struct extent {
    uint64_t begin, end;
    int64_t tensor;
} extent;

static int extent_cmp(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Tensors must not share bytes: ggml lays them out back to back, so an overlap means a lying
 * dimension or offset, and two weights would alias each other. */
static int check_overlap(gguf_file *f, cursor *c)
{
    if (f->n_tensors < 2)
        return 0;
    extent *e = malloc((size_t)f->n_tensors * sizeof *e);
    if (!e)
        return KVS_ENOMEM;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        e[i].begin = (uint64_t)((const uint8_t *)t->data - f->base);
        e[i].end = e[i].begin + t->n_bytes; /* both inside the file: no overflow */
        e[i].tensor = i;
    }
    qsort(e, (size_t)f->n_tensors, sizeof *e, extent_cmp);
    int rc = 0;
    for (int64_t i = 1; i < f->n_tensors && !rc; i++)
        if (e[i].begin < e[i - 1].end) {
            const gguf_tensor *a = &f->tensors[e[i - 1].tensor], *b = &f->tensors[e[i].tensor];
            rc = fail(c, KVS_EFORMAT, "tensors '%.*s' and '%.*s' overlap in the data section",
                      NAME_PREC(a->name_len), a->name, NAME_PREC(b->name_len), b->name);
        }
    free(e);
    return rc;
}

static int parse(gguf_file *f, char *err, size_t err_len)
{
    cursor c = {f->base, f->size, 0, err, err_len};
    uint32_t magic = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    int rc;
    if ((rc = read_u32(&c, &magic, "magic")))
        return rc;
    if (magic != GGUF_MAGIC)
        return fail(&c, KVS_EFORMAT, "bad magic 0x%08x: not a GGUF file", magic);
    if ((rc = read_u32(&c, &f->version, "version")))
        return rc;
    if (f->version != 2 && f->version != 3)
        return fail(&c, KVS_EVERSION, "GGUF version %u is not supported (2 and 3 are)", f->version);
    if ((rc = read_u64(&c, &n_tensors, "tensor count")) || (rc = read_u64(&c, &n_kv, "kv count")))
        return rc;
    /* Smallest kv: 8-byte key length + 4-byte type + 1-byte value. */
    if (n_kv > (c.size - c.pos) / 13)
        return fail(&c, KVS_ETRUNC, "truncated: %llu metadata entries cannot fit in %zu bytes",
                    (unsigned long long)n_kv, c.size);
    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    if (!f->kv)
        return KVS_ENOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = (int64_t)i + 1; /* so gguf_close frees what parse_kv allocated */
        if ((rc = parse_kv(&c, &f->kv[i])))
            return rc;
        for (uint64_t j = 0; j < i; j++)
            if (names_equal(f->kv[i].key, f->kv[i].key_len, f->kv[j].key, f->kv[j].key_len))
                return fail(&c, KVS_EFORMAT, "duplicate metadata key '%.*s'",
                            NAME_PREC(f->kv[i].key_len), f->kv[i].key);
    }
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = gguf_find_key(f, "general.alignment");
    if (ai >= 0) {
        if (f->kv[ai].type != GGUF_TYPE_UINT32)
            return fail(&c, KVS_EKEYTYPE, "general.alignment must be uint32");
        memcpy(&f->alignment, f->kv[ai].value, 4);
        if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) || f->alignment > 65536)
            return fail(&c, KVS_EFORMAT, "general.alignment %u is not a power of two <= 65536",
                        f->alignment);
    }
    /* Smallest tensor info: 8 name + 4 n_dims + 8 dim + 4 type + 8 offset. */
    if (n_tensors > (c.size - c.pos) / 32)
        return fail(&c, KVS_ETRUNC, "truncated: %llu tensor infos cannot fit in %zu bytes",
                    (unsigned long long)n_tensors, c.size);
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors)
        return KVS_ENOMEM;
    f->n_tensors = (int64_t)n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = parse_tensor(&c, &f->tensors[i])))
            return rc;
        for (uint64_t j = 0; j < i; j++)
            if (names_equal(f->tensors[i].name, f->tensors[i].name_len, f->tensors[j].name,
                            f->tensors[j].name_len))
                return fail(&c, KVS_EFORMAT, "duplicate tensor '%.*s'",
                            NAME_PREC(f->tensors[i].name_len), f->tensors[i].name);
    }
    size_t data_start = c.pos + (f->alignment - c.pos % f->alignment) % f->alignment;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t off = (uint64_t)(uintptr_t)t->data;
        if (off % f->alignment)
            return fail(&c, KVS_EFORMAT, "tensor '%.*s': offset %llu is not aligned to %u",
                        NAME_PREC(t->name_len), t->name, (unsigned long long)off, f->alignment);
        if (data_start > f->size || off > f->size - data_start ||
            t->n_bytes > f->size - data_start - off)
            return fail(&c, KVS_ETRUNC,
                        "truncated: tensor '%.*s' needs bytes %llu..%llu of "
                        "the data section, file has %zu bytes",
                        NAME_PREC(t->name_len), t->name, (unsigned long long)off,
                        (unsigned long long)(off + t->n_bytes), f->size);
        t->data = f->base + data_start + off;
    }
    return check_overlap(f, &c);
}

static int open_common(gguf_file *f, gguf_file **out, char *err, size_t err_len)
{
    int rc = parse(f, err, err_len);
    if (rc) {
        if (rc == KVS_ENOMEM && err && err_len)
            snprintf(err, err_len, "out of memory while indexing the header");
        gguf_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_open_memory(const void *data, size_t size, gguf_file **out, char *err, size_t err_len)
{
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return KVS_ENOMEM;
    f->base = data;
    f->size = size;
    return open_common(f, out, err, err_len);
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t err_len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err && err_len)
            snprintf(err, err_len, "cannot open %s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (err && err_len)
            snprintf(err, err_len, "%s is not a regular file", path);
        close(fd);
        return KVS_EIO;
    }
    if (st.st_size == 0) {
        if (err && err_len)
            snprintf(err, err_len, "truncated: %s is empty", path);
        close(fd);
        return KVS_ETRUNC;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        if (err && err_len)
            snprintf(err, err_len, "cannot mmap %s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(m, (size_t)st.st_size);
        return KVS_ENOMEM;
    }
    f->base = m;
    f->size = (size_t)st.st_size;
    f->mapped = true;
    return open_common(f, out, err, err_len);
}

void gguf_release(const gguf_file *f, const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + n, base = (uintptr_t)f->base;
    if (!f->mapped || lo < base || hi > base + f->size)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    lo = (lo + page - 1) / page * page; /* whole pages inside the range only, */
    hi = hi == base + f->size ? (hi + page - 1) / page * page /* and the file's last one */
                              : hi / page * page;
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void gguf_willneed(const gguf_file *f, const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + n, base = (uintptr_t)f->base;
    if (!f->mapped || lo < base || hi > base + f->size || !n)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    lo = lo / page * page; /* madvise wants a page-aligned start */
    madvise((void *)lo, hi - lo, MADV_WILLNEED);
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    for (int64_t i = 0; i < f->n_kv; i++)
        free(f->kv[i].arr_strs);
    free(f->kv);
    free(f->tensors);
    if (f->mapped)
        munmap((void *)f->base, f->size);
    free(f);
}

uint32_t gguf_version(const gguf_file *f)
{
    return f->version;
}
size_t gguf_file_size(const gguf_file *f)
{
    return f->size;
}
int64_t gguf_n_kv(const gguf_file *f)
{
    return f->n_kv;
}

int64_t gguf_find_key(const gguf_file *f, const char *key)
{
    size_t n = strlen(key);
    for (int64_t i = 0; i < f->n_kv; i++)
        if (names_equal(f->kv[i].key, f->kv[i].key_len, key, n))
            return i;
    return -1;
}

const char *gguf_key_name(const gguf_file *f, int64_t i, size_t *len)
{
    *len = f->kv[i].key_len;
    return f->kv[i].key;
}

enum gguf_type gguf_kv_type(const gguf_file *f, int64_t i)
{
    return f->kv[i].type;
}

/* Reads an integer-typed value as a signed 128-bit-safe pair: returns false if not integer. */
static bool kv_int(const gguf_kv *kv, int64_t *sv, uint64_t *uv, bool *is_signed)
{
    const uint8_t *p = kv->value;
    *is_signed = false;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: *uv = p[0]; return true;
    case GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *uv = v;
        return true;
    }
    case GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *uv = v;
        return true;
    }
    case GGUF_TYPE_UINT64: memcpy(uv, p, 8); return true;
    case GGUF_TYPE_INT8: {
        int8_t v;
        memcpy(&v, p, 1);
        *sv = v;
        break;
    }
    case GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *sv = v;
        break;
    }
    case GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *sv = v;
        break;
    }
    case GGUF_TYPE_INT64: memcpy(sv, p, 8); break;
    default: return false;
    }
    *is_signed = true;
    return true;
}

static const gguf_kv *lookup(const gguf_file *f, const char *key)
{
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i];
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    int64_t sv;
    uint64_t uv;
    bool s;
    if (!kv_int(kv, &sv, &uv, &s) || (s && sv < 0))
        return KVS_EKEYTYPE;
    *out = s ? (uint64_t)sv : uv;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = gguf_get_u64(f, key, &v);
    if (rc)
        return rc;
    if (v > UINT32_MAX)
        return KVS_EKEYTYPE;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    int64_t sv;
    uint64_t uv;
    bool s;
    if (!kv_int(kv, &sv, &uv, &s) || (!s && uv > INT64_MAX))
        return KVS_EKEYTYPE;
    *out = s ? sv : (int64_t)uv;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->value, 4);
        return 0;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->value, 8);
        *out = (float)d;
        return 0;
    }
    return KVS_EKEYTYPE;
}

int gguf_get_f64(const gguf_file *f, const char *key, double *out)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        float v;
        memcpy(&v, kv->value, 4);
        *out = v;
        return 0;
    }
    if (kv->type == GGUF_TYPE_FLOAT64) {
        memcpy(out, kv->value, 8);
        return 0;
    }
    return KVS_EKEYTYPE;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    if (kv->type != GGUF_TYPE_BOOL)
        return KVS_EKEYTYPE;
    *out = kv->value[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    if (kv->type != GGUF_TYPE_STRING)
        return KVS_EKEYTYPE;
    uint64_t n = 0;
    memcpy(&n, kv->value, 8);
    *s = (const char *)kv->value + 8;
    *len = (size_t)n;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, enum gguf_type *elem_type, uint64_t *count,
                 const void **data)
{
    const gguf_kv *kv = lookup(f, key);
    if (!kv)
        return KVS_ENOKEY;
    if (kv->type != GGUF_TYPE_ARRAY)
        return KVS_EKEYTYPE;
    *elem_type = kv->arr_type;
    *count = kv->arr_count;
    *data = kv->value;
    return 0;
}

int gguf_arr_str(const gguf_file *f, int64_t kvi, uint64_t i, const char **s, size_t *len)
{
    if (kvi < 0 || kvi >= f->n_kv)
        return KVS_ERANGE;
    const gguf_kv *kv = &f->kv[kvi];
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING)
        return KVS_EKEYTYPE;
    if (i >= kv->arr_count)
        return KVS_ERANGE;
    uint64_t n = 0;
    memcpy(&n, kv->arr_strs[i], 8);
    *s = (const char *)kv->arr_strs[i] + 8;
    *len = (size_t)n;
    return 0;
}

int64_t gguf_n_tensors(const gguf_file *f)
{
    return f->n_tensors;
}

int64_t gguf_find_tensor(const gguf_file *f, const char *name)
{
    size_t n = strlen(name);
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (names_equal(f->tensors[i].name, f->tensors[i].name_len, name, n))
            return i;
    return -1;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i)
{
    return (i < 0 || i >= f->n_tensors) ? NULL : &f->tensors[i];
}

float ggml_fp16_to_fp32(uint16_t h)
{
    return dtype_f16_to_f32(h);
}

uint16_t ggml_fp32_to_fp16(float f)
{
    return dtype_f32_to_f16(f);
}

void ggml_fp16_to_fp32_row(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f16_to_f32(src[i]);
}
