/* GGUF reader: a memory-mapped, read-only view of a GGUF v2/v3 file.
 *
 * File layout (little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv   x { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
 *   padding to general.alignment (default 32) | tensor data (offsets are relative to here)
 *   string = u64 length | bytes (not NUL-terminated); array = u32 elem_type | u64 count | elems
 *
 * Every count, length, offset and tensor extent is checked against the file size while the
 * header is parsed (and tensors may not overlap), so once gguf_open succeeds every accessor is
 * memory-safe. Strings handed out point into the mapping and are NOT NUL-terminated: use the
 * returned length.
 * A gguf_file is immutable after open and may be read from any thread. */
#ifndef KVS_ENGINE_GGUF_H
#define KVS_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT_
};

/* ggml tensor element types this project knows by name (values are ggml's). */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_BF16 = 30,
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define QK8_0 32 /* elements per Q8_0 block: one f16 scale + 32 int8 */

typedef struct gguf_file gguf_file;

typedef struct gguf_tensor {
    const char *name; /* not NUL-terminated: see name_len */
    size_t name_len;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS]; /* ggml order: dims[0] is the contiguous (row) length */
    uint32_t type;                /* enum ggml_type */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data; /* inside the mapping, aligned to the file's alignment */
} gguf_tensor;

/* Opens and validates path (mmap, read-only). On success *out owns the mapping.
 * On failure returns a negative status, *out is NULL and, if err is non-NULL, a one-line
 * reason (with the byte offset where it applies) is written to err. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t err_len);

/* Tells f that the caller no longer reads the bytes [p, p + n) of its tensor data (they were
 * copied elsewhere): for a mapped file their whole pages leave the process's memory (and the
 * file's last page, where the range ends with the file; read again, they come back from the
 * page cache); for a caller's buffer nothing happens. */
void gguf_release(const gguf_file *f, const void *p, size_t n);

/* Asks the kernel to read [p, p + n) of f's tensor data into the page cache ahead of its use,
 * without mapping it into the process (a mapped file; nothing otherwise): bytes read in place
 * later, a few at a time, then do not wait on the disk. */
void gguf_willneed(const gguf_file *f, const void *p, size_t n);

/* As gguf_open over a caller-owned buffer, which must outlive the gguf_file (fuzzing, tests). */
int gguf_open_memory(const void *data, size_t size, gguf_file **out, char *err, size_t err_len);

/* Unmaps and frees; NULL is a no-op. Pointers obtained from f die with it. */
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_file_size(const gguf_file *f);

/* --- metadata --- */
int64_t gguf_n_kv(const gguf_file *f);
/* Index of key, or -1 if the key is not found. */
int64_t gguf_find_key(const gguf_file *f, const char *key);
/* Key name of entry i (not NUL-terminated; *len receives its length). */
const char *gguf_key_name(const gguf_file *f, int64_t i, size_t *len);
enum gguf_type gguf_kv_type(const gguf_file *f, int64_t i);

/* Typed getters by key name. Each returns 0, KVS_ENOKEY if absent, or KVS_EKEYTYPE if the
 * stored type cannot represent the request (integers convert when the value fits;
 * gguf_get_f32 accepts FLOAT32 and FLOAT64). *out is untouched on failure. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
/* As gguf_get_f32 without the rounding of FLOAT64 values (FLOAT32 and FLOAT64). */
int gguf_get_f64(const gguf_file *f, const char *key, double *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len);

/* Arrays: element type and count. Numeric arrays are handed out as a pointer into the file
 * (may be unaligned: copy with memcpy); string arrays through gguf_arr_str(). */
int gguf_get_arr(const gguf_file *f, const char *key, enum gguf_type *elem_type, uint64_t *count,
                 const void **data);
/* String i of the string array stored under key index kv (from gguf_find_key).
 * Returns 0, or KVS_EKEYTYPE / KVS_ERANGE. */
int gguf_arr_str(const gguf_file *f, int64_t kv, uint64_t i, const char **s, size_t *len);

/* --- tensors --- */
int64_t gguf_n_tensors(const gguf_file *f);
/* Index of the tensor called name, or -1 if the tensor is not found. */
int64_t gguf_find_tensor(const gguf_file *f, const char *name);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);

/* Bytes of one scalar of metadata type t, or 0 for STRING, ARRAY and unknown types. */
size_t gguf_type_size(enum gguf_type t);

/* Size in bytes of n elements of ggml type t, or 0 if t is unknown or n does not fill whole
 * blocks of a block-quantized type. */
uint64_t ggml_type_nbytes(uint32_t type, uint64_t n);
/* "F32", "F16", "Q8_0", ... or "unknown". */
const char *ggml_type_name(uint32_t type);

/* Conversions used by weight loaders (n elements). */
void ggml_fp16_to_fp32_row(const uint16_t *src, float *dst, size_t n);
float ggml_fp16_to_fp32(uint16_t h);
uint16_t ggml_fp32_to_fp16(float f);

#endif
