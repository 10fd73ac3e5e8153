/* GGUF v3 writer. Metadata lives pre-serialised in one byte buffer; tensors keep their shape
 * and either an owned copy of their bytes or a fill callback. Offsets are computed at write
 * time, so adding never fails half-way: on any error the writer is left as before the call. */
#include "engine/gguf_write.h"

#include "common/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF is little-endian and this writer copies native integers"
#endif

#define GGUF_MAGIC_BYTES "GGUF"
#define WRITER_VERSION 3u
#define FILL_CHUNK_BYTES (4u << 20) /* fill callbacks produce about this much per call */

typedef struct wkey {
    char *s;
    size_t len;
} wkey;

typedef struct wtensor {
    char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t n_rows;  /* product of dims[1..] */
    size_t row_bytes; /* bytes of dims[0] elements */
    uint64_t n_bytes;
    void *data; /* owned copy, or NULL when fill is set */
    gguf_writer_fill_fn fill;
    void *user;
} wtensor;

struct gguf_writer {
    uint8_t *meta; /* serialised kv entries, in the order added */
    size_t meta_len, meta_cap;
    wkey *keys;
    size_t n_kv, keys_cap;
    wtensor *tensors;
    size_t n_tensors, tensors_cap;
    uint32_t alignment;
};

int gguf_writer_create(gguf_writer **out)
{
    *out = NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w)
        return KVS_ENOMEM;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return 0;
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++)
        free(w->keys[i].s);
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->keys);
    free(w->tensors);
    free(w->meta);
    free(w);
}

/* Grows *p (of *cap elements of size es) to hold need elements. */
static int grow(void **p, size_t *cap, size_t need, size_t es)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / es)
            return KVS_ENOMEM;
        n *= 2;
    }
    void *q = realloc(*p, n * es);
    if (!q)
        return KVS_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static int meta_put(gguf_writer *w, const void *src, size_t n)
{
    if (n > SIZE_MAX - w->meta_len)
        return KVS_ENOMEM;
    void *p = w->meta;
    int rc = grow(&p, &w->meta_cap, w->meta_len + n, 1);
    w->meta = p;
    if (rc)
        return rc;
    if (n)
        memcpy(w->meta + w->meta_len, src, n);
    w->meta_len += n;
    return 0;
}

static int meta_u32(gguf_writer *w, uint32_t v)
{
    return meta_put(w, &v, 4);
}
static int meta_u64(gguf_writer *w, uint64_t v)
{
    return meta_put(w, &v, 8);
}

static int meta_str(gguf_writer *w, const char *s, size_t n)
{
    int rc = meta_u64(w, n);
    return rc ? rc : meta_put(w, s, n);
}

static bool key_exists(const gguf_writer *w, const char *key, size_t len)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->keys[i].len == len && memcmp(w->keys[i].s, key, len) == 0)
            return true;
    return false;
}

/* Starts an entry: checks the key, reserves its index slot and writes key + type.
 * On success the caller writes the value, then calls kv_end (or kv_abort on failure). */
static int kv_begin(gguf_writer *w, const char *key, size_t key_len, enum gguf_type type,
                    size_t *mark)
{
    if (!key || key_exists(w, key, key_len))
        return KVS_EINVAL;
    void *p = w->keys;
    int rc = grow(&p, &w->keys_cap, w->n_kv + 1, sizeof *w->keys);
    w->keys = p;
    if (rc)
        return rc;
    *mark = w->meta_len;
    if ((rc = meta_str(w, key, key_len)) || (rc = meta_u32(w, (uint32_t)type)))
        w->meta_len = *mark;
    return rc;
}

static int kv_end(gguf_writer *w, const char *key, size_t key_len, size_t mark, int rc)
{
    char *copy = rc ? NULL : malloc(key_len + 1);
    if (!rc && !copy)
        rc = KVS_ENOMEM;
    if (rc) {
        w->meta_len = mark;
        return rc;
    }
    memcpy(copy, key, key_len);
    copy[key_len] = '\0';
    w->keys[w->n_kv].s = copy;
    w->keys[w->n_kv].len = key_len;
    w->n_kv++;
    return 0;
}

static int add_scalar(gguf_writer *w, const char *key, enum gguf_type type, const void *v)
{
    size_t mark, klen = key ? strlen(key) : 0;
    int rc = kv_begin(w, key, klen, type, &mark);
    if (rc)
        return rc;
    return kv_end(w, key, klen, mark, meta_put(w, v, gguf_type_size(type)));
}

int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT8, &v);
}
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v)
{
    return add_scalar(w, key, GGUF_TYPE_INT8, &v);
}
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT16, &v);
}
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v)
{
    return add_scalar(w, key, GGUF_TYPE_INT16, &v);
}
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v)
{
    return add_scalar(w, key, GGUF_TYPE_INT32, &v);
}
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return add_scalar(w, key, GGUF_TYPE_UINT64, &v);
}
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v)
{
    return add_scalar(w, key, GGUF_TYPE_INT64, &v);
}
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v)
{
    return add_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v)
{
    return add_scalar(w, key, GGUF_TYPE_FLOAT64, &v);
}
int gguf_writer_add_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return add_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v)
{
    /* The reader insists on this too: the data section is laid out by it. */
    bool is_align = key && strcmp(key, "general.alignment") == 0;
    if (is_align && (v == 0 || (v & (v - 1)) || v > 65536))
        return KVS_EINVAL;
    int rc = add_scalar(w, key, GGUF_TYPE_UINT32, &v);
    if (!rc && is_align)
        w->alignment = v;
    return rc;
}

int gguf_writer_add_strn(gguf_writer *w, const char *key, const char *s, size_t len)
{
    if (!s && len)
        return KVS_EINVAL;
    size_t mark, klen = key ? strlen(key) : 0;
    int rc = kv_begin(w, key, klen, GGUF_TYPE_STRING, &mark);
    if (rc)
        return rc;
    return kv_end(w, key, klen, mark, meta_str(w, s, len));
}

int gguf_writer_add_str(gguf_writer *w, const char *key, const char *s)
{
    if (!s)
        return KVS_EINVAL;
    return gguf_writer_add_strn(w, key, s, strlen(s));
}

static int add_arr_n(gguf_writer *w, const char *key, size_t klen, enum gguf_type et,
                     const void *data, uint64_t count)
{
    size_t es = gguf_type_size(et);
    if (es == 0 || count > SIZE_MAX / es || (!data && count))
        return KVS_EINVAL;
    size_t mark;
    int rc = kv_begin(w, key, klen, GGUF_TYPE_ARRAY, &mark);
    if (rc)
        return rc;
    if (!(rc = meta_u32(w, (uint32_t)et)) && !(rc = meta_u64(w, count)))
        rc = meta_put(w, data, (size_t)count * es);
    return kv_end(w, key, klen, mark, rc);
}

int gguf_writer_add_arr(gguf_writer *w, const char *key, enum gguf_type elem_type, const void *data,
                        uint64_t count)
{
    return add_arr_n(w, key, key ? strlen(key) : 0, elem_type, data, count);
}

int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const size_t *lens, uint64_t count)
{
    if (!strs && count)
        return KVS_EINVAL;
    for (uint64_t i = 0; i < count; i++)
        if (!strs[i] && (!lens || lens[i]))
            return KVS_EINVAL;
    size_t mark, klen = key ? strlen(key) : 0;
    int rc = kv_begin(w, key, klen, GGUF_TYPE_ARRAY, &mark);
    if (rc)
        return rc;
    if (!(rc = meta_u32(w, GGUF_TYPE_STRING)) && !(rc = meta_u64(w, count)))
        for (uint64_t i = 0; i < count && !rc; i++)
            rc = meta_str(w, strs[i], lens ? lens[i] : strlen(strs[i]));
    return kv_end(w, key, klen, mark, rc);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t kv)
{
    if (!src || kv < 0 || kv >= gguf_n_kv(src))
        return KVS_EINVAL;
    size_t klen;
    const char *kname = gguf_key_name(src, kv, &klen);
    /* The reader's getters take NUL-terminated keys. */
    if (memchr(kname, '\0', klen))
        return KVS_EINVAL;
    char *key = malloc(klen + 1);
    if (!key)
        return KVS_ENOMEM;
    memcpy(key, kname, klen);
    key[klen] = '\0';
    enum gguf_type t = gguf_kv_type(src, kv);
    int rc = 0;
    union {
        uint64_t u;
        int64_t i;
        double d;
        float f;
        int b;
    } v;
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64:
        if (!(rc = gguf_get_u64(src, key, &v.u))) {
            /* Narrow back to the stored width: the value came from it, so it fits. */
            uint8_t b8 = (uint8_t)v.u;
            uint16_t b16 = (uint16_t)v.u;
            uint32_t b32 = (uint32_t)v.u;
            if (t == GGUF_TYPE_UINT32) { /* through add_u32: general.alignment takes effect */
                rc = gguf_writer_add_u32(w, key, b32);
                break;
            }
            const void *p = t == GGUF_TYPE_UINT8    ? (const void *)&b8
                            : t == GGUF_TYPE_UINT16 ? (const void *)&b16
                            : t == GGUF_TYPE_UINT32 ? (const void *)&b32
                                                    : (const void *)&v.u;
            rc = add_scalar(w, key, t, p);
        }
        break;
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64:
        if (!(rc = gguf_get_i64(src, key, &v.i))) {
            int8_t b8 = (int8_t)v.i;
            int16_t b16 = (int16_t)v.i;
            int32_t b32 = (int32_t)v.i;
            const void *p = t == GGUF_TYPE_INT8    ? (const void *)&b8
                            : t == GGUF_TYPE_INT16 ? (const void *)&b16
                            : t == GGUF_TYPE_INT32 ? (const void *)&b32
                                                   : (const void *)&v.i;
            rc = add_scalar(w, key, t, p);
        }
        break;
    case GGUF_TYPE_FLOAT32:
        if (!(rc = gguf_get_f32(src, key, &v.f)))
            rc = gguf_writer_add_f32(w, key, v.f);
        break;
    case GGUF_TYPE_FLOAT64:
        if (!(rc = gguf_get_f64(src, key, &v.d)))
            rc = gguf_writer_add_f64(w, key, v.d);
        break;
    case GGUF_TYPE_BOOL:
        if (!(rc = gguf_get_bool(src, key, &v.b)))
            rc = gguf_writer_add_bool(w, key, v.b);
        break;
    case GGUF_TYPE_STRING: {
        const char *s;
        size_t n;
        if (!(rc = gguf_get_str(src, key, &s, &n)))
            rc = gguf_writer_add_strn(w, key, s, n);
        break;
    }
    case GGUF_TYPE_ARRAY: {
        enum gguf_type et;
        uint64_t count;
        const void *data;
        if ((rc = gguf_get_arr(src, key, &et, &count, &data)))
            break;
        if (et != GGUF_TYPE_STRING) {
            rc = add_arr_n(w, key, klen, et, data, count);
            break;
        }
        /* The reader bounded count by the file size, so these arrays are allocatable. */
        const char **strs = malloc((count ? count : 1) * sizeof *strs);
        size_t *lens = malloc((count ? count : 1) * sizeof *lens);
        if (!strs || !lens)
            rc = KVS_ENOMEM;
        for (uint64_t i = 0; i < count && !rc; i++)
            rc = gguf_arr_str(src, kv, i, &strs[i], &lens[i]);
        if (!rc)
            rc = gguf_writer_add_arr_str(w, key, strs, lens, count);
        free(strs);
        free(lens);
        break;
    }
    default: rc = KVS_EUNSUPPORTED; break;
    }
    free(key);
    return rc;
}

static int add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *dims,
                      uint32_t type, const void *data, gguf_writer_fill_fn fill, void *user)
{
    if (!name || !dims || n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return KVS_EINVAL;
    size_t name_len = strlen(name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name_len == name_len && memcmp(w->tensors[i].name, name, name_len) == 0)
            return KVS_EINVAL;
    wtensor t = {0};
    t.n_dims = n_dims;
    t.type = type;
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.dims[d] = d < n_dims ? dims[d] : 1;
        if (t.dims[d] == 0 || n > UINT64_MAX / t.dims[d])
            return KVS_EINVAL;
        n *= t.dims[d];
    }
    uint64_t row_bytes = ggml_type_nbytes(type, t.dims[0]);
    if (row_bytes == 0 || row_bytes > SIZE_MAX)
        return KVS_EINVAL;
    t.row_bytes = (size_t)row_bytes;
    t.n_rows = n / t.dims[0];
    if (t.n_rows > UINT64_MAX / row_bytes)
        return KVS_EINVAL;
    t.n_bytes = t.n_rows * row_bytes;
    /* Keep the padded total representable: the reader computes offsets in 64 bits. */
    if (t.n_bytes > (UINT64_MAX >> 2))
        return KVS_EINVAL;
    if (data && t.n_bytes > SIZE_MAX)
        return KVS_EINVAL;
    void *p = w->tensors;
    int rc = grow(&p, &w->tensors_cap, w->n_tensors + 1, sizeof *w->tensors);
    w->tensors = p;
    if (rc)
        return rc;
    t.name = malloc(name_len + 1);
    if (!t.name)
        return KVS_ENOMEM;
    memcpy(t.name, name, name_len + 1);
    t.name_len = name_len;
    if (data) {
        t.data = malloc(t.n_bytes ? (size_t)t.n_bytes : 1);
        if (!t.data) {
            free(t.name);
            return KVS_ENOMEM;
        }
        memcpy(t.data, data, (size_t)t.n_bytes);
    }
    t.fill = fill;
    t.user = user;
    w->tensors[w->n_tensors++] = t;
    return 0;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *dims,
                           uint32_t type, const void *data)
{
    if (!data)
        return KVS_EINVAL;
    return add_tensor(w, name, n_dims, dims, type, data, NULL, NULL);
}

int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t n_dims,
                                const uint64_t *dims, uint32_t type, gguf_writer_fill_fn fill,
                                void *user)
{
    if (!fill)
        return KVS_EINVAL;
    return add_tensor(w, name, n_dims, dims, type, NULL, fill, user);
}

static uint64_t pad_to(uint64_t n, uint32_t a)
{
    return (a - n % a) % a;
}

static uint64_t header_size(const gguf_writer *w)
{
    uint64_t n = 4 + 4 + 8 + 8 + w->meta_len;
    for (size_t i = 0; i < w->n_tensors; i++)
        n += 8 + w->tensors[i].name_len + 4 + 8ull * w->tensors[i].n_dims + 4 + 8;
    return n;
}

uint64_t gguf_writer_file_size(const gguf_writer *w)
{
    uint64_t n = header_size(w);
    n += pad_to(n, w->alignment);
    for (size_t i = 0; i < w->n_tensors; i++)
        n += w->tensors[i].n_bytes + pad_to(w->tensors[i].n_bytes, w->alignment);
    return n;
}

typedef struct sink {
    FILE *fp;
    char *err;
    size_t err_len;
} sink;

static int put(sink *s, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, s->fp) != n) {
        if (s->err && s->err_len)
            snprintf(s->err, s->err_len, "write failed: %s", strerror(errno));
        return KVS_EIO;
    }
    return 0;
}

static int put_u32(sink *s, uint32_t v)
{
    return put(s, &v, 4);
}
static int put_u64(sink *s, uint64_t v)
{
    return put(s, &v, 8);
}

static int put_zeros(sink *s, uint64_t n)
{
    static const uint8_t zeros[64];
    int rc = 0;
    while (n && !rc) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        rc = put(s, zeros, k);
        n -= k;
    }
    return rc;
}

static int put_tensor_data(sink *s, const wtensor *t)
{
    if (t->data)
        return put(s, t->data, (size_t)t->n_bytes);
    uint64_t rows_per_chunk = FILL_CHUNK_BYTES / t->row_bytes;
    if (rows_per_chunk == 0)
        rows_per_chunk = 1;
    if (rows_per_chunk > t->n_rows)
        rows_per_chunk = t->n_rows;
    uint8_t *buf = malloc((size_t)rows_per_chunk * t->row_bytes);
    if (!buf) {
        if (s->err && s->err_len)
            snprintf(s->err, s->err_len, "out of memory for tensor '%s'", t->name);
        return KVS_ENOMEM;
    }
    int rc = 0;
    for (uint64_t row = 0; row < t->n_rows && !rc; row += rows_per_chunk) {
        uint64_t n = t->n_rows - row < rows_per_chunk ? t->n_rows - row : rows_per_chunk;
        rc = t->fill(t->user, row, n, buf, t->row_bytes);
        if (rc) {
            if (s->err && s->err_len)
                snprintf(s->err, s->err_len, "filling tensor '%s' failed: %s", t->name,
                         status_str(rc));
            break;
        }
        rc = put(s, buf, (size_t)n * t->row_bytes);
    }
    free(buf);
    return rc;
}

int gguf_writer_write_stream(gguf_writer *w, FILE *fp, char *err, size_t err_len)
{
    sink s = {fp, err, err_len};
    int rc;
    if ((rc = put(&s, GGUF_MAGIC_BYTES, 4)) || (rc = put_u32(&s, WRITER_VERSION)) ||
        (rc = put_u64(&s, w->n_tensors)) || (rc = put_u64(&s, w->n_kv)) ||
        (rc = put(&s, w->meta, w->meta_len)))
        return rc;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if ((rc = put_u64(&s, t->name_len)) || (rc = put(&s, t->name, t->name_len)) ||
            (rc = put_u32(&s, t->n_dims)))
            return rc;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = put_u64(&s, t->dims[d])))
                return rc;
        if ((rc = put_u32(&s, t->type)) || (rc = put_u64(&s, off)))
            return rc;
        off += t->n_bytes + pad_to(t->n_bytes, w->alignment);
    }
    if ((rc = put_zeros(&s, pad_to(header_size(w), w->alignment))))
        return rc;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if ((rc = put_tensor_data(&s, t)) || (rc = put_zeros(&s, pad_to(t->n_bytes, w->alignment))))
            return rc;
    }
    if (fflush(fp) != 0) {
        if (err && err_len)
            snprintf(err, err_len, "write failed: %s", strerror(errno));
        return KVS_EIO;
    }
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t err_len)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        if (err && err_len)
            snprintf(err, err_len, "cannot create %s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    int rc = gguf_writer_write_stream(w, fp, err, err_len);
    if (fclose(fp) != 0 && !rc) {
        if (err && err_len)
            snprintf(err, err_len, "closing %s failed: %s", path, strerror(errno));
        rc = KVS_EIO;
    }
    if (rc)
        unlink(path);
    return rc;
}

int gguf_writer_write_mem(gguf_writer *w, void **buf, size_t *size)
{
    *buf = NULL;
    *size = 0;
    char *p = NULL;
    size_t n = 0;
    FILE *fp = open_memstream(&p, &n);
    if (!fp)
        return KVS_ENOMEM;
    int rc = gguf_writer_write_stream(w, fp, NULL, 0);
    if (fclose(fp) != 0 && !rc)
        rc = KVS_ENOMEM;
    if (rc) {
        free(p);
        return rc;
    }
    *buf = p;
    *size = n;
    return 0;
}
