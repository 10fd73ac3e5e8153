/* The growable byte buffer of buf.h. */
#include "common/buf.h"

#include "common/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void kvs_buf_addn(kvs_buf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 4)
        b->oom = true; /* a length gone negative: never copied */
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) /* s may be NULL when there is nothing to add */
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void kvs_buf_add(kvs_buf *b, const char *s)
{
    kvs_buf_addn(b, s, strlen(s));
}

int kvs_buf_take(kvs_buf *b, char **out)
{
    *out = NULL;
    if (b->oom) {
        kvs_buf_free(b);
        return KVS_ENOMEM;
    }
    char *p = b->p ? b->p : calloc(1, 1);
    *b = (kvs_buf){0};
    if (!p)
        return KVS_ENOMEM;
    *out = p;
    return 0;
}

void kvs_buf_free(kvs_buf *b)
{
    free(b->p);
    *b = (kvs_buf){0};
}
