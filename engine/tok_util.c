/* Tokenizer building blocks: string hash map, merge heap, id vector and UTF-8 helpers.
 * None of them allocates behind the caller's back except on push/put, which report ENOMEM. */
#include "engine/tok_internal.h"

#include "common/status.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a, continued over several pieces so a pair key never has to be built in memory. */
static inline uint32_t fnv_step(uint32_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

#define FNV_BASIS 2166136261u

int tok__map_init(tok__map *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2) /* load factor <= 1/2 keeps probes short */
        cap *= 2;
    m->e = calloc(cap, sizeof *m->e);
    if (!m->e)
        return KVS_ENOMEM;
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

void tok__map_free(tok__map *m)
{
    free(m->e);
    m->e = NULL;
    m->mask = 0;
    m->n = 0;
}

int tok__map_put(tok__map *m, const char *key, size_t len, int32_t val)
{
    if ((m->n + 1) * 2 > m->mask + 1) {
        /* Grow: rehash every entry into a table twice the size. */
        size_t cap = (m->mask + 1) * 2;
        tok__map_entry *e = calloc(cap, sizeof *e);
        if (!e)
            return KVS_ENOMEM;
        for (size_t i = 0; i <= m->mask; i++) {
            if (!m->e[i].key)
                continue;
            size_t j = m->e[i].hash & (cap - 1);
            while (e[j].key)
                j = (j + 1) & (cap - 1);
            e[j] = m->e[i];
        }
        free(m->e);
        m->e = e;
        m->mask = cap - 1;
    }
    uint32_t h = fnv_step(FNV_BASIS, key, len);
    size_t j = h & m->mask;
    while (m->e[j].key) {
        if (m->e[j].hash == h && m->e[j].len == len && memcmp(m->e[j].key, key, len) == 0)
            return 0;
        j = (j + 1) & m->mask;
    }
    m->e[j] = (tok__map_entry){.key = key, .len = (uint32_t)len, .hash = h, .val = val};
    m->n++;
    return 0;
}

int32_t tok__map_get(const tok__map *m, const char *key, size_t len)
{
    if (!m->e)
        return -1;
    uint32_t h = fnv_step(FNV_BASIS, key, len);
    size_t j = h & m->mask;
    while (m->e[j].key) {
        if (m->e[j].hash == h && m->e[j].len == len && memcmp(m->e[j].key, key, len) == 0)
            return m->e[j].val;
        j = (j + 1) & m->mask;
    }
    return -1;
}

int32_t tok__map_get_pair(const tok__map *m, const char *a, size_t alen, const char *b,
                          size_t blen)
{
    if (!m->e)
        return -1;
    uint32_t h = fnv_step(fnv_step(fnv_step(FNV_BASIS, a, alen), " ", 1), b, blen);
    size_t len = alen + 1 + blen;
    size_t j = h & m->mask;
    while (m->e[j].key) {
        const tok__map_entry *e = &m->e[j];
        if (e->hash == h && e->len == len && memcmp(e->key, a, alen) == 0 &&
            e->key[alen] == ' ' && memcmp(e->key + alen + 1, b, blen) == 0)
            return e->val;
        j = (j + 1) & m->mask;
    }
    return -1;
}

int tok__ids_push(tok__ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *p = realloc(o->v, cap * sizeof *p);
        if (!p)
            return KVS_ENOMEM;
        o->v = p;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

static inline bool bigram_less(const tok__bigram *a, const tok__bigram *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

int tok__heap_push(tok__heap *h, tok__bigram b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tok__bigram *p = realloc(h->v, cap * sizeof *p);
        if (!p)
            return KVS_ENOMEM;
        h->v = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_less(&b, &h->v[parent]))
            break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
    return 0;
}

tok__bigram tok__heap_pop(tok__heap *h)
{
    tok__bigram top = h->v[0];
    tok__bigram last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_less(&h->v[c + 1], &h->v[c]))
            c++;
        if (!bigram_less(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

uint32_t tok__utf8_next(const unsigned char *s, size_t n, size_t *i)
{
    size_t o = *i;
    unsigned char c = s[o];
    if (c < 0x80) {
        *i = o + 1;
        return c;
    }
    size_t need;
    uint32_t cpt;
    if ((c & 0xE0) == 0xC0) {
        need = 1;
        cpt = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        need = 2;
        cpt = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        need = 3;
        cpt = c & 0x07;
    } else {
        *i = o + 1; /* stray continuation byte or 0xF8..0xFF */
        return 0xFFFD;
    }
    if (o + need >= n) { /* truncated at the end of the text */
        *i = o + 1;
        return 0xFFFD;
    }
    for (size_t k = 1; k <= need; k++) {
        if ((s[o + k] & 0xC0) != 0x80) {
            *i = o + 1;
            return 0xFFFD;
        }
        cpt = (cpt << 6) | (s[o + k] & 0x3F);
    }
    *i = o + need + 1;
    return cpt;
}

size_t tok__utf8_put(uint32_t cpt, unsigned char *out)
{
    if (cpt < 0x80) {
        out[0] = (unsigned char)cpt;
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cpt >> 6));
        out[1] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cpt >> 12));
        out[1] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cpt >> 18));
    out[1] = (unsigned char)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cpt & 0x3F));
    return 4;
}
