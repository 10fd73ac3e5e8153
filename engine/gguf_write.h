/* GGUF v3 writer: collect metadata and tensor descriptions, then write the file in one pass.
 *
 * Metadata is serialised as it is added (so it costs its file size in memory); tensor data is
 * either copied at add time (small tensors) or produced row-block by row-block by a callback at
 * write time, so multi-GB models never sit in memory. Keys and tensor names must be unique;
 * "general.alignment" (uint32, power of two) sets the data alignment (default 32). Tensors are
 * laid out in the order added, each at an offset aligned to the alignment, and the file ends
 * padded to it, as ggml's writer does. A writer is not thread-safe; use it from one thread. */
#ifndef KVS_ENGINE_GGUF_WRITE_H
#define KVS_ENGINE_GGUF_WRITE_H

#include "engine/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gguf_writer gguf_writer;

/* Produces rows [row, row + n_rows) of a tensor into dst, row_bytes bytes per row (a row is
 * dims[0] elements of the tensor's type, so block-quantized rows hold whole blocks). Called
 * with ascending, contiguous rows from row 0; returns 0, or a negative status that aborts the
 * write and is returned by it. */
typedef int (*gguf_writer_fill_fn)(void *user, uint64_t row, uint64_t n_rows, void *dst,
                                   size_t row_bytes);

/* Creates an empty writer. Returns 0 or KVS_ENOMEM. */
int gguf_writer_create(gguf_writer **out);
/* Frees the writer and everything it copied; NULL is a no-op. */
void gguf_writer_destroy(gguf_writer *w);

/* --- metadata: each returns 0, KVS_EINVAL (duplicate or NULL key, bad argument) or
 * KVS_ENOMEM. Strings are copied; key must be NUL-terminated. --- */
int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v);
/* "general.alignment" must be a power of two <= 65536 and sets the data alignment. */
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_add_bool(gguf_writer *w, const char *key, int v);
/* s is NUL-terminated (add_str) or len bytes (add_strn, may contain NULs). */
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *s);
int gguf_writer_add_strn(gguf_writer *w, const char *key, const char *s, size_t len);
/* Numeric array of count elements of elem_type (not STRING/ARRAY), native little-endian. */
int gguf_writer_add_arr(gguf_writer *w, const char *key, enum gguf_type elem_type, const void *data,
                        uint64_t count);
/* String array; lens may be NULL when every string is NUL-terminated. */
int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            const size_t *lens, uint64_t count);
/* Copies entry kv (an index from gguf_find_key) of an open file, value and type unchanged
 * (nested arrays are KVS_EUNSUPPORTED, as the reader does not index them either). */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t kv);

/* --- tensors: each returns 0, KVS_EINVAL (duplicate name, 0 or > GGUF_MAX_DIMS dims, zero
 * dim, unknown type, row not a whole number of blocks, size overflow) or KVS_ENOMEM.
 * dims are in ggml order (dims[0] contiguous). --- */
/* data holds ggml_type_nbytes(type, product of dims) bytes and is copied. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *dims,
                           uint32_t type, const void *data);
/* The data is produced by fill(user, ...) during the write; user must outlive it. */
int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t n_dims,
                                const uint64_t *dims, uint32_t type, gguf_writer_fill_fn fill,
                                void *user);

/* Bytes the finished file will take. */
uint64_t gguf_writer_file_size(const gguf_writer *w);

/* Writes the file to path (created or truncated, mode 0666 minus umask; removed again on
 * failure). Returns 0, KVS_EIO (with a reason in err), a fill callback's status, or
 * KVS_ENOMEM. The writer is unchanged and may be written again. */
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t err_len);
/* As gguf_writer_write to an open stream (left open, flushed). */
int gguf_writer_write_stream(gguf_writer *w, FILE *fp, char *err, size_t err_len);
/* As gguf_writer_write into a malloc'd buffer the caller frees (tests, small files). */
int gguf_writer_write_mem(gguf_writer *w, void **buf, size_t *size);

#endif
