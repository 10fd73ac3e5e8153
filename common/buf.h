/* A growable byte buffer, always NUL-terminated once anything was added: appends never fail
 * one by one; a failed allocation sets oom, after which appends do nothing, so a builder checks
 * once at the end. A zeroed struct is an empty buffer. A leaf: libc only. */
#ifndef KVS_COMMON_BUF_H
#define KVS_COMMON_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvs_buf {
    char *p; /* NULL until the first append */
    size_t len, cap;
    bool oom;
} kvs_buf;

/* Appends n bytes of s (doubling the capacity as needed). */
void kvs_buf_addn(kvs_buf *b, const char *s, size_t n);
/* Appends the string s. */
void kvs_buf_add(kvs_buf *b, const char *s);
/* Hands the bytes to the caller: 0 and *out (malloc'd, "" when nothing was added; free it), or
 * KVS_ENOMEM after a failed allocation (the buffer is freed either way). */
int kvs_buf_take(kvs_buf *b, char **out);
/* Frees the bytes; b is empty again. */
void kvs_buf_free(kvs_buf *b);

#endif
