/* The think-block splitter (see reasoning.h). */
#include "server/reasoning.h"

#include <string.h>

enum { ST_START = 0, ST_IN, ST_OUT };

static const char k_open[] = "<think>", k_close[] = "</think>";
#define OPEN_N (sizeof k_open - 1)
#define CLOSE_N (sizeof k_close - 1)

/* The length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag, size_t tag_n)
{
    for (size_t k = n < tag_n - 1 ? n : tag_n - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

void srv_think_feed(srv_think *t, const char *s, size_t n, kvs_buf *reasoning, kvs_buf *content)
{
    kvs_buf_addn(&t->held, s, n);
    if (!t->held.p)
        return; /* nothing fed, nothing held */
    if (t->held.oom) {
        reasoning->oom = content->oom = true;
        return;
    }
    const char *b = t->held.p;
    size_t len = t->held.len, i = 0;
    while (i < len) {
        const char *p = b + i;
        size_t rest = len - i;
        if (t->state == ST_START) {
            if (rest < OPEN_N && !memcmp(p, k_open, rest))
                break; /* "<thi": may still open the block */
            if (rest >= OPEN_N && !memcmp(p, k_open, OPEN_N)) {
                i += OPEN_N;
                t->state = ST_IN;
                t->drop_nl = true;
            } else {
                t->state = ST_OUT; /* no think block: all content, newlines kept */
            }
            continue;
        }
        if (t->drop_nl) {
            if (*p == '\n') {
                i++;
                continue;
            }
            t->drop_nl = false;
        }
        if (t->state == ST_OUT) {
            kvs_buf_addn(content, p, rest);
            i = len;
            break;
        }
        const char *close = NULL;
        for (size_t k = 0; k + CLOSE_N <= rest && !close; k++)
            if (!memcmp(p + k, k_close, CLOSE_N))
                close = p + k;
        if (close) {
            size_t r = (size_t)(close - p);
            while (r && p[r - 1] == '\n')
                r--;
            kvs_buf_addn(reasoning, p, r);
            i += (size_t)(close - p) + CLOSE_N;
            t->state = ST_OUT;
            t->drop_nl = true;
            continue;
        }
        /* Hold what may be the start of </think> and the newlines before it. */
        size_t k = rest - partial_tag(p, rest, k_close, CLOSE_N);
        while (k && p[k - 1] == '\n')
            k--;
        kvs_buf_addn(reasoning, p, k);
        i += k;
        break;
    }
    /* keep the unplaced tail */
    memmove(t->held.p, b + i, len - i);
    t->held.len = len - i;
    t->held.p[t->held.len] = '\0';
}

void srv_think_end(srv_think *t, kvs_buf *reasoning, kvs_buf *content)
{
    const char *p = t->held.p;
    size_t n = t->held.len;
    if (n && t->state == ST_START)
        kvs_buf_addn(content, p, n); /* a partial "<thi" that never opened anything */
    else if (n && t->state == ST_IN) {
        while (n && p[n - 1] == '\n')
            n--;
        kvs_buf_addn(reasoning, p, n); /* unclosed: the rest of the block */
    }
    srv_think_free(t);
}

void srv_think_free(srv_think *t)
{
    kvs_buf_free(&t->held);
    t->state = ST_START;
    t->drop_nl = false;
}
