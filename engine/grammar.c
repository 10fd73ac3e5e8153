/* Constrained decoding: a byte-level pushdown automaton for JSON values described by a
 * grammar_def, and token masks by one walk of a vocabulary trie. Invariant: every state the
 * automaton reaches can still be completed (no dead ends), so a mask is never empty before
 * the value is complete: depth bounds and surrogate rules are refused at the first byte that
 * would make completion impossible, not later. */
#include "engine/grammar.h"

#include "common/hex.h"
#include "common/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the def ---------------------------------------------------------------------------- */

enum gkind {
    GK_UNDEF, /* reserved, not yet aliased (builder only) */
    GK_ALIAS, /* stands for child (builder only; resolved away by finish) */
    GK_OBJECT,
    GK_FREE_OBJECT,
    GK_ARRAY,
    GK_STRING,
    GK_NUMBER,
    GK_INTEGER,
    GK_LITERALS,
    GK_ANYOF,
    GK_PREFIXED, /* raw text (first, n: a range of the def's bytes), then a value of child */
    GK_TEXT,     /* free text up to its stop (first, n: a range of the def's bytes), then child */
};

typedef struct gnode {
    uint8_t kind;
    int32_t child;           /* array items, free object values, alias target */
    uint32_t first, n;       /* object: props; literals: lits; anyOf: alts (ranges into the def);
                                array: the least and most items (n 0: no most) */
    uint32_t min_depth;      /* containers needed to complete a value of this node */
    uint32_t first_bytes[8]; /* bytes a value of this node can start with (non-anyOf) */
} gnode;

typedef struct gprop {
    int32_t owner;             /* builder only: the object node */
    uint32_t key_off, key_len; /* escaped name + closing quote, in bytes */
    int32_t value;
    uint8_t required;
    uint32_t next_req; /* index (within the object) of the first required property >= this */
} gprop;

typedef struct glit {
    uint32_t off, len;
} glit;

#define MIN_DEPTH_INF UINT32_MAX

/* gcfg.ws: the whitespace of the current gap. 0 none; WS_ONE one space or tab (nothing more);
 * WS_NL a newline, plus the count of spaces and tabs after it in the low bits. */
#define WS_ONE 0x8000
#define WS_NL 0x4000
#define WS_COUNT 0x3FFF

struct grammar_def {
    grammar_options opts;
    int32_t root;
    gnode *nodes;
    gprop *props;
    glit *lits;
    int32_t *alts;
    char *bytes;
    uint32_t n_nodes;
    bool lead_ws; /* whitespace may come before the root: not when it opens with raw text */
};

struct grammar_builder {
    gnode *nodes;
    size_t n_nodes, cap_nodes;
    gprop *props;
    size_t n_props, cap_props;
    glit *lits;
    size_t n_lits, cap_lits;
    int32_t *alts;
    size_t n_alts, cap_alts;
    char *bytes;
    size_t n_bytes, cap_bytes;
    int32_t any; /* the shared any-value node, or -1 */
};

grammar_options grammar_default_options(void)
{
    grammar_options o = {.max_ws = 20, .max_depth = 32};
    return o;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return KVS_ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

int grammar_builder_create(grammar_builder **out)
{
    grammar_builder *b = calloc(1, sizeof *b);
    if (!b)
        return KVS_ENOMEM;
    b->any = -1;
    *out = b;
    return 0;
}

void grammar_builder_destroy(grammar_builder *b)
{
    if (!b)
        return;
    free(b->nodes);
    free(b->props);
    free(b->lits);
    free(b->alts);
    free(b->bytes);
    free(b);
}

static int add_node(grammar_builder *b, uint8_t kind, int32_t child, int32_t *id)
{
    if (b->n_nodes >= INT32_MAX / 2)
        return KVS_ENOMEM;
    if (grow((void **)&b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *b->nodes))
        return KVS_ENOMEM;
    gnode *n = &b->nodes[b->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->child = child;
    *id = (int32_t)b->n_nodes++;
    return 0;
}

static bool valid_id(const grammar_builder *b, int32_t id)
{
    return id >= 0 && (size_t)id < b->n_nodes;
}

static int add_bytes(grammar_builder *b, const char *s, size_t len, uint32_t *off)
{
    if (b->n_bytes + len >= UINT32_MAX / 2)
        return KVS_ENOMEM;
    if (grow((void **)&b->bytes, &b->cap_bytes, b->n_bytes + len + 1, 1))
        return KVS_ENOMEM;
    if (len)
        memcpy(b->bytes + b->n_bytes, s, len);
    *off = (uint32_t)b->n_bytes;
    b->n_bytes += len;
    return 0;
}

int grammar_builder_reserve(grammar_builder *b, int32_t *id)
{
    return add_node(b, GK_UNDEF, -1, id);
}

int grammar_builder_alias(grammar_builder *b, int32_t id, int32_t target)
{
    if (!valid_id(b, id) || !valid_id(b, target) || b->nodes[id].kind != GK_UNDEF)
        return KVS_EINVAL;
    b->nodes[id].kind = GK_ALIAS;
    b->nodes[id].child = target;
    return 0;
}

int grammar_builder_string(grammar_builder *b, int32_t *id)
{
    return add_node(b, GK_STRING, -1, id);
}

int grammar_builder_number(grammar_builder *b, bool integer, int32_t *id)
{
    return add_node(b, integer ? GK_INTEGER : GK_NUMBER, -1, id);
}

int grammar_builder_literals(grammar_builder *b, size_t n, const char *const *texts,
                             const size_t *lens, int32_t *id)
{
    if (n == 0 || n > UINT32_MAX / 4)
        return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (lens[i] == 0 || lens[i] > GRAMMAR_MAX_TEXT)
            return KVS_EINVAL; /* frames count matched bytes in 16 bits */
    size_t n_bytes0 = b->n_bytes, n_lits0 = b->n_lits;
    if (grow((void **)&b->lits, &b->cap_lits, b->n_lits + n, sizeof *b->lits))
        return KVS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t off;
        if (add_bytes(b, texts[i], lens[i], &off)) {
            b->n_bytes = n_bytes0;
            b->n_lits = n_lits0;
            return KVS_ENOMEM;
        }
        b->lits[b->n_lits].off = off;
        b->lits[b->n_lits].len = (uint32_t)lens[i];
        b->n_lits++;
    }
    int rc = add_node(b, GK_LITERALS, -1, id);
    if (rc) {
        b->n_bytes = n_bytes0;
        b->n_lits = n_lits0;
        return rc;
    }
    b->nodes[*id].first = (uint32_t)n_lits0;
    b->nodes[*id].n = (uint32_t)n;
    return 0;
}

int grammar_builder_array(grammar_builder *b, int32_t items, int32_t *id)
{
    return grammar_builder_array_bounded(b, items, 0, 0, id);
}

int grammar_builder_array_bounded(grammar_builder *b, int32_t items, uint32_t min_items,
                                  uint32_t max_items, int32_t *id)
{
    /* a frame counts the items in 16 bits */
    if (!valid_id(b, items) || min_items > UINT16_MAX || max_items > UINT16_MAX ||
        (max_items && min_items > max_items))
        return KVS_EINVAL;
    int rc = add_node(b, GK_ARRAY, items, id);
    if (!rc) {
        b->nodes[*id].first = min_items;
        b->nodes[*id].n = max_items;
    }
    return rc;
}

/* A node of kind k holding text (a prefix, or a stop string) before value. */
static int text_node(grammar_builder *b, uint8_t k, const char *text, size_t len, size_t max,
                     int32_t value, int32_t *id)
{
    if (!valid_id(b, value) || len == 0 || len > max)
        return KVS_EINVAL;
    size_t n_bytes0 = b->n_bytes;
    uint32_t off;
    if (add_bytes(b, text, len, &off))
        return KVS_ENOMEM;
    int rc = add_node(b, k, value, id);
    if (rc) {
        b->n_bytes = n_bytes0;
        return rc;
    }
    b->nodes[*id].first = off;
    b->nodes[*id].n = (uint32_t)len;
    return 0;
}

int grammar_builder_prefixed(grammar_builder *b, const char *text, size_t len, int32_t value,
                             int32_t *id)
{
    /* a frame counts the matched bytes in 16 bits */
    return text_node(b, GK_PREFIXED, text, len, GRAMMAR_MAX_TEXT, value, id);
}

int grammar_builder_text_until(grammar_builder *b, const char *stop, size_t len, int32_t value,
                               int32_t *id)
{
    return text_node(b, GK_TEXT, stop, len, GRAMMAR_MAX_STOP, value, id);
}

int grammar_builder_object(grammar_builder *b, int32_t *id)
{
    return add_node(b, GK_OBJECT, -1, id);
}

int grammar_builder_free_object(grammar_builder *b, int32_t value, int32_t *id)
{
    if (!valid_id(b, value))
        return KVS_EINVAL;
    return add_node(b, GK_FREE_OBJECT, value, id);
}

/* Appends name as cJSON prints a string (without the opening quote, with the closing one). */
static int add_escaped(grammar_builder *b, const char *name, size_t len, uint32_t *off,
                       uint32_t *out_len)
{
    size_t n0 = b->n_bytes;
    uint32_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        char e[8];
        size_t el = 0;
        switch (c) {
        case '"': memcpy(e, "\\\"", el = 2); break;
        case '\\': memcpy(e, "\\\\", el = 2); break;
        case '\b': memcpy(e, "\\b", el = 2); break;
        case '\f': memcpy(e, "\\f", el = 2); break;
        case '\n': memcpy(e, "\\n", el = 2); break;
        case '\r': memcpy(e, "\\r", el = 2); break;
        case '\t': memcpy(e, "\\t", el = 2); break;
        default:
            if (c < 0x20)
                el = (size_t)snprintf(e, sizeof e, "\\u%04x", c);
            else
                e[el++] = (char)c;
        }
        uint32_t ignored;
        if (add_bytes(b, e, el, i == 0 ? &o : &ignored)) {
            b->n_bytes = n0;
            return KVS_ENOMEM;
        }
    }
    uint32_t q;
    if (add_bytes(b, "\"", 1, len == 0 ? &o : &q)) {
        b->n_bytes = n0;
        return KVS_ENOMEM;
    }
    *off = o;
    *out_len = (uint32_t)(b->n_bytes - n0);
    return 0;
}

int grammar_builder_property(grammar_builder *b, int32_t object, const char *name, size_t len,
                             int32_t value, bool required)
{
    if (!valid_id(b, object) || !valid_id(b, value) || b->nodes[object].kind != GK_OBJECT ||
        b->nodes[object].n >= GRAMMAR_MAX_PROPERTIES)
        return KVS_EINVAL;
    if (grow((void **)&b->props, &b->cap_props, b->n_props + 1, sizeof *b->props))
        return KVS_ENOMEM;
    size_t n0 = b->n_bytes;
    uint32_t off, klen;
    if (len > GRAMMAR_MAX_TEXT / 6) /* escaped, each byte may take 6 ("\u001f") */
        return KVS_EINVAL;
    if (add_escaped(b, name, len, &off, &klen))
        return KVS_ENOMEM;
    for (size_t i = 0; i < b->n_props; i++) {
        const gprop *p = &b->props[i];
        if (p->owner == object && p->key_len == klen &&
            memcmp(b->bytes + p->key_off, b->bytes + off, klen) == 0) {
            b->n_bytes = n0;
            return KVS_EINVAL;
        }
    }
    gprop *p = &b->props[b->n_props++];
    memset(p, 0, sizeof *p);
    p->owner = object;
    p->key_off = off;
    p->key_len = klen;
    p->value = value;
    p->required = required;
    b->nodes[object].n++;
    return 0;
}

/* The literals of alternatives that are literal nodes, as one literal node (anyOf of consts,
 * as pydantic writes Literal unions, is then one matcher instead of one fork per value).
 * *merged = -1 when fewer than two alternatives are literals. */
static int merge_literals(grammar_builder *b, size_t n, const int32_t *alts, int32_t *merged)
{
    size_t n_lit = 0, bytes = 0;
    *merged = -1;
    for (size_t i = 0; i < n; i++) {
        const gnode *a = &b->nodes[alts[i]];
        if (a->kind != GK_LITERALS)
            continue;
        n_lit += a->n;
        for (uint32_t k = 0; k < a->n; k++)
            bytes += b->lits[a->first + k].len;
    }
    size_t n_alt_lit = 0;
    for (size_t i = 0; i < n; i++)
        n_alt_lit += b->nodes[alts[i]].kind == GK_LITERALS;
    if (n_alt_lit < 2)
        return 0;
    /* copies first: adding the merged texts may move b->bytes */
    char *buf = malloc(bytes ? bytes : 1);
    const char **texts = malloc(n_lit * sizeof *texts);
    size_t *lens = malloc(n_lit * sizeof *lens);
    int rc = KVS_ENOMEM;
    if (buf && texts && lens) {
        size_t m = 0, off = 0;
        for (size_t i = 0; i < n; i++) {
            const gnode *a = &b->nodes[alts[i]];
            if (a->kind != GK_LITERALS)
                continue;
            for (uint32_t k = 0; k < a->n; k++, m++) {
                const glit *l = &b->lits[a->first + k];
                memcpy(buf + off, b->bytes + l->off, l->len);
                texts[m] = buf + off;
                lens[m] = l->len;
                off += l->len;
            }
        }
        rc = grammar_builder_literals(b, n_lit, texts, lens, merged);
    }
    free(buf);
    free(texts);
    free(lens);
    return rc;
}

int grammar_builder_any_of(grammar_builder *b, size_t n, const int32_t *alts, int32_t *id)
{
    if (n == 0 || n > UINT32_MAX / 4)
        return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!valid_id(b, alts[i]))
            return KVS_EINVAL;
    if (grow((void **)&b->alts, &b->cap_alts, b->n_alts + n, sizeof *b->alts))
        return KVS_ENOMEM;
    size_t nodes0 = b->n_nodes, lits0 = b->n_lits, bytes0 = b->n_bytes;
    int32_t merged;
    int rc = merge_literals(b, n, alts, &merged);
    if (!rc)
        rc = add_node(b, GK_ANYOF, -1, id);
    if (rc) {
        b->n_nodes = nodes0;
        b->n_lits = lits0;
        b->n_bytes = bytes0;
        return rc;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (merged < 0 || b->nodes[alts[i]].kind != GK_LITERALS)
            b->alts[b->n_alts + m++] = alts[i];
    if (merged >= 0)
        b->alts[b->n_alts + m++] = merged;
    b->nodes[*id].first = (uint32_t)b->n_alts;
    b->nodes[*id].n = (uint32_t)m;
    b->n_alts += m;
    return 0;
}

int grammar_builder_any(grammar_builder *b, int32_t *id)
{
    if (b->any >= 0) {
        *id = b->any;
        return 0;
    }
    /* any = anyOf(object of any, array of any, string, number, false|null|true); the forks
     * die at the first byte, which tells the five apart. */
    size_t nodes0 = b->n_nodes, lits0 = b->n_lits, bytes0 = b->n_bytes, alts0 = b->n_alts;
    static const char *const kw[] = {"false", "null", "true"};
    static const size_t kwl[] = {5, 4, 4};
    int32_t self, alt[5], u;
    int rc = grammar_builder_reserve(b, &self);
    if (!rc)
        rc = grammar_builder_free_object(b, self, &alt[0]);
    if (!rc)
        rc = grammar_builder_array(b, self, &alt[1]);
    if (!rc)
        rc = grammar_builder_string(b, &alt[2]);
    if (!rc)
        rc = grammar_builder_number(b, false, &alt[3]);
    if (!rc)
        rc = grammar_builder_literals(b, 3, kw, kwl, &alt[4]);
    if (!rc)
        rc = grammar_builder_any_of(b, 5, alt, &u);
    if (!rc)
        rc = grammar_builder_alias(b, self, u);
    if (rc) {
        b->n_nodes = nodes0;
        b->n_lits = lits0;
        b->n_bytes = bytes0;
        b->n_alts = alts0;
        return rc;
    }
    b->any = self;
    *id = self;
    return 0;
}

void grammar_def_destroy(grammar_def *d)
{
    if (!d)
        return;
    free(d->nodes);
    free(d->props);
    free(d->lits);
    free(d->alts);
    free(d->bytes);
    free(d);
}

/* Follows aliases; -1 (err set) for an unaliased reservation or a cycle. */
static int32_t resolve(const grammar_builder *b, int32_t id, char *err, size_t err_len)
{
    for (size_t steps = 0; steps <= b->n_nodes; steps++) {
        const gnode *n = &b->nodes[id];
        if (n->kind == GK_UNDEF) {
            snprintf(err, err_len, "node %d is reserved but never defined", (int)id);
            return -1;
        }
        if (n->kind != GK_ALIAS)
            return id;
        id = n->child;
    }
    snprintf(err, err_len, "alias cycle through node %d (a $ref that only refers to itself)",
             (int)id);
    return -1;
}

static const char *def_bytes(const grammar_def *d, uint32_t off)
{
    return d->bytes + off;
}

static int lit_cmp(const char *pool, const glit *x, const glit *y)
{
    uint32_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(pool + x->off, pool + y->off, m);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static void sort_lits(const char *pool, glit *l, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) { /* insertion sort: enums are short */
        glit t = l[i];
        uint32_t j = i;
        while (j > 0 && lit_cmp(pool, &l[j - 1], &t) > 0) {
            l[j] = l[j - 1];
            j--;
        }
        l[j] = t;
    }
}

/* Flattens anyOf node u's alternatives (anyOf inside anyOf) into out, without duplicates;
 * state: 0 unvisited, 1 on the path, 2 done (per call tree). KVS_EINVAL on a cycle. */
static int flatten(const grammar_def *d, const gnode *bnodes, const int32_t *balts, int32_t u,
                   uint8_t *state, int32_t *out, uint32_t *n_out, char *err, size_t err_len)
{
    state[u] = 1;
    const gnode *n = &bnodes[u]; /* the builder's ranges: d's are rewritten as we go */
    for (uint32_t i = 0; i < n->n; i++) {
        int32_t a = balts[n->first + i];
        if (d->nodes[a].kind == GK_ANYOF) {
            if (state[a] == 1) {
                snprintf(err, err_len, "anyOf reaches itself before any byte (node %d)", (int)a);
                return KVS_EINVAL;
            }
            if (state[a] == 0) {
                int rc = flatten(d, bnodes, balts, a, state, out, n_out, err, err_len);
                if (rc)
                    return rc;
            }
            continue;
        }
        bool dup = false;
        for (uint32_t k = 0; k < *n_out && !dup; k++)
            dup = out[k] == a;
        if (!dup)
            out[(*n_out)++] = a;
    }
    state[u] = 2;
    return 0;
}

static void compute_min_depth(grammar_def *d)
{
    for (uint32_t i = 0; i < d->n_nodes; i++)
        d->nodes[i].min_depth = MIN_DEPTH_INF;
    bool changed = true;
    while (changed) {
        changed = false;
        for (uint32_t i = 0; i < d->n_nodes; i++) {
            gnode *n = &d->nodes[i];
            uint32_t m = MIN_DEPTH_INF;
            switch (n->kind) {
            case GK_STRING:
            case GK_NUMBER:
            case GK_INTEGER:
            case GK_LITERALS: m = 0; break;
            case GK_FREE_OBJECT: m = 1; break; /* {} */
            case GK_ARRAY:                     /* [], or as many items as it needs */
                m = n->first == 0 ? 1
                    : d->nodes[n->child].min_depth == MIN_DEPTH_INF
                        ? MIN_DEPTH_INF
                        : d->nodes[n->child].min_depth + 1;
                break;
            case GK_OBJECT:
                m = 1;
                for (uint32_t k = 0; k < n->n && m != MIN_DEPTH_INF; k++) {
                    const gprop *p = &d->props[n->first + k];
                    if (!p->required)
                        continue;
                    uint32_t v = d->nodes[p->value].min_depth;
                    if (v == MIN_DEPTH_INF)
                        m = MIN_DEPTH_INF;
                    else if (v + 1 > m)
                        m = v + 1;
                }
                break;
            case GK_PREFIXED:
            case GK_TEXT: m = d->nodes[n->child].min_depth; break;
            case GK_ANYOF:
                for (uint32_t k = 0; k < n->n; k++) {
                    uint32_t v = d->nodes[d->alts[n->first + k]].min_depth;
                    if (v < m)
                        m = v;
                }
                break;
            default: break;
            }
            if (m < n->min_depth) {
                n->min_depth = m;
                changed = true;
            }
        }
    }
}

static void compute_first_bytes(const grammar_def *d, gnode *n)
{
    memset(n->first_bytes, 0, sizeof n->first_bytes);
#define FB_SET(c) (n->first_bytes[(uint8_t)(c) >> 5] |= 1u << ((uint8_t)(c)&31))
    switch (n->kind) {
    case GK_OBJECT:
    case GK_FREE_OBJECT: FB_SET('{'); break;
    case GK_ARRAY: FB_SET('['); break;
    case GK_STRING: FB_SET('"'); break;
    case GK_NUMBER:
    case GK_INTEGER:
        FB_SET('-');
        for (char c = '0'; c <= '9'; c++)
            FB_SET(c);
        break;
    case GK_LITERALS:
        for (uint32_t k = 0; k < n->n; k++)
            FB_SET(d->bytes[d->lits[n->first + k].off]);
        break;
    case GK_PREFIXED: FB_SET(d->bytes[n->first]); break;
    case GK_TEXT: memset(n->first_bytes, 0xFF, sizeof n->first_bytes); break; /* any */
    default: break;
    }
#undef FB_SET
}

int grammar_builder_finish(grammar_builder *b, int32_t root, const grammar_options *opts,
                           grammar_def **out, char *err, size_t err_len)
{
    char dummy[1];
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof dummy;
    }
    err[0] = '\0';
    grammar_options o = opts ? *opts : grammar_default_options();
    if (o.max_depth == 0 || o.max_depth > 1024 || o.max_ws > WS_COUNT) {
        snprintf(err, err_len, "max_depth must be in [1, 1024] and max_ws at most %d", WS_COUNT);
        return KVS_EINVAL;
    }
    if (!valid_id(b, root)) {
        snprintf(err, err_len, "root %d is not a node", (int)root);
        return KVS_EINVAL;
    }
    grammar_def *d = calloc(1, sizeof *d);
    int32_t *resolved = malloc((b->n_nodes ? b->n_nodes : 1) * sizeof *resolved);
    uint8_t *state = calloc(b->n_nodes ? b->n_nodes : 1, 1);
    uint32_t *pfirst = calloc(b->n_nodes + 1, sizeof *pfirst);
    int rc = KVS_ENOMEM;
    if (!d || !resolved || !state || !pfirst)
        goto fail;
    d->opts = o;
    d->n_nodes = (uint32_t)b->n_nodes;
    d->nodes = malloc(b->n_nodes * sizeof *d->nodes);
    d->props = malloc((b->n_props ? b->n_props : 1) * sizeof *d->props);
    d->lits = malloc((b->n_lits ? b->n_lits : 1) * sizeof *d->lits);
    d->bytes = malloc(b->n_bytes ? b->n_bytes : 1);
    if (!d->nodes || !d->props || !d->lits || !d->bytes)
        goto fail;
    rc = KVS_EINVAL;
    for (size_t i = 0; i < b->n_nodes; i++) {
        resolved[i] = b->nodes[i].kind == GK_UNDEF ? -2 : resolve(b, (int32_t)i, err, err_len);
        if (resolved[i] == -1)
            goto fail;
    }
    d->root = resolved[root];
    if (d->root < 0) {
        snprintf(err, err_len, "root %d is reserved but never defined", (int)root);
        goto fail;
    }
    if (b->n_bytes)
        memcpy(d->bytes, b->bytes, b->n_bytes);
    if (b->n_lits)
        memcpy(d->lits, b->lits, b->n_lits * sizeof *d->lits);
    memcpy(d->nodes, b->nodes, b->n_nodes * sizeof *d->nodes);
    /* Every reference points at a resolved node; a reference to an undefined one fails. */
    for (size_t i = 0; i < b->n_nodes; i++) {
        gnode *n = &d->nodes[i];
        if (n->kind == GK_ARRAY || n->kind == GK_FREE_OBJECT || n->kind == GK_PREFIXED ||
            n->kind == GK_TEXT) {
            n->child = resolved[n->child];
            if (n->child < 0) {
                snprintf(err, err_len, "node %zu refers to an undefined node", i);
                goto fail;
            }
        }
    }
    /* Properties grouped by owner, in the order they were added. */
    for (size_t i = 0; i < b->n_props; i++)
        pfirst[b->props[i].owner + 1]++;
    for (size_t i = 0; i < b->n_nodes; i++)
        pfirst[i + 1] += pfirst[i];
    for (size_t i = 0; i < b->n_nodes; i++) {
        d->nodes[i].first = d->nodes[i].kind == GK_OBJECT ? pfirst[i] : d->nodes[i].first;
    }
    for (size_t i = 0; i < b->n_props; i++) {
        gprop p = b->props[i];
        p.value = resolved[p.value];
        if (p.value < 0) {
            snprintf(err, err_len, "a property of node %d refers to an undefined node",
                     (int)p.owner);
            goto fail;
        }
        d->props[pfirst[p.owner]++] = p;
    }
    for (size_t i = 0; i < b->n_nodes; i++) {
        gnode *n = &d->nodes[i];
        if (n->kind == GK_OBJECT) {
            uint32_t next = n->n;
            for (uint32_t k = n->n; k-- > 0;) {
                gprop *p = &d->props[n->first + k];
                if (p->required)
                    next = k;
                p->next_req = next;
            }
        } else if (n->kind == GK_LITERALS) {
            sort_lits(d->bytes, d->lits + n->first, n->n);
            uint32_t w = 0; /* drop duplicates */
            for (uint32_t k = 0; k < n->n; k++)
                if (w == 0 ||
                    lit_cmp(d->bytes, &d->lits[n->first + w - 1], &d->lits[n->first + k]) != 0)
                    d->lits[n->first + w++] = d->lits[n->first + k];
            n->n = w;
        }
    }
    /* anyOf alternatives, resolved and flattened (each list holds distinct nodes, so at most
     * n_nodes entries). */
    int32_t *balts = malloc((b->n_alts ? b->n_alts : 1) * sizeof *balts);
    int32_t *flat = malloc(b->n_nodes * sizeof *flat);
    size_t cap_alts = 0, n_alts = 0;
    if (!balts || !flat) {
        free(balts);
        free(flat);
        rc = KVS_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < b->n_alts; i++) {
        balts[i] = resolved[b->alts[i]];
        if (balts[i] < 0) {
            free(balts);
            free(flat);
            snprintf(err, err_len, "an anyOf refers to an undefined node");
            goto fail;
        }
    }
    for (size_t i = 0; i < b->n_nodes; i++) {
        gnode *n = &d->nodes[i];
        if (n->kind != GK_ANYOF)
            continue;
        memset(state, 0, b->n_nodes);
        uint32_t cnt = 0;
        rc = flatten(d, b->nodes, balts, (int32_t)i, state, flat, &cnt, err, err_len);
        if (!rc && grow((void **)&d->alts, &cap_alts, n_alts + cnt, sizeof *d->alts))
            rc = KVS_ENOMEM;
        if (rc) {
            free(balts);
            free(flat);
            goto fail;
        }
        if (cnt)
            memcpy(d->alts + n_alts, flat, cnt * sizeof *flat);
        n->first = (uint32_t)n_alts;
        n->n = cnt;
        n_alts += cnt;
    }
    free(balts);
    free(flat);
    compute_min_depth(d);
    for (uint32_t i = 0; i < d->n_nodes; i++)
        compute_first_bytes(d, &d->nodes[i]);
    if (d->nodes[d->root].min_depth == MIN_DEPTH_INF) {
        snprintf(err, err_len,
                 "the schema has no finite instance (a required property or "
                 "every anyOf branch recurses without end)");
        rc = KVS_EINVAL;
        goto fail;
    }
    if (d->nodes[d->root].min_depth > o.max_depth) {
        snprintf(err, err_len, "the schema needs %u levels of nesting; the limit is %u",
                 d->nodes[d->root].min_depth, o.max_depth);
        rc = KVS_EINVAL;
        goto fail;
    }
    /* No gap before raw or free text: a root that opens with text begins where the prompt
     * ends (Granite's <|tool_call|>, gpt-oss's channel header). */
    const gnode *r = &d->nodes[d->root];
    d->lead_ws = r->kind != GK_PREFIXED && r->kind != GK_TEXT;
    for (uint32_t k = 0; r->kind == GK_ANYOF && k < r->n; k++) {
        uint8_t kind = d->nodes[d->alts[r->first + k]].kind;
        if (kind == GK_PREFIXED || kind == GK_TEXT)
            d->lead_ws = false;
    }
    free(resolved);
    free(state);
    free(pfirst);
    *out = d;
    return 0;
fail:
    if (rc == KVS_ENOMEM && !err[0])
        snprintf(err, err_len, "out of memory");
    free(resolved);
    free(state);
    free(pfirst);
    grammar_def_destroy(d);
    return rc;
}

int grammar_def_json_object(const grammar_options *opts, grammar_def **out)
{
    grammar_builder *b;
    int rc = grammar_builder_create(&b);
    if (rc)
        return rc;
    int32_t any, root;
    rc = grammar_builder_any(b, &any);
    if (!rc)
        rc = grammar_builder_free_object(b, any, &root);
    if (!rc)
        rc = grammar_builder_finish(b, root, opts, out, NULL, 0);
    grammar_builder_destroy(b);
    return rc;
}

/* ---- the automaton ---------------------------------------------------------------------- */

enum fkind { F_ROOT, F_OBJ, F_KEY, F_ARR, F_STR, F_NUM, F_LIT, F_PFX, F_TXT };
enum { R_START, R_DONE };
enum { O_OPEN, O_COLON, O_VALUE, O_AFTER, O_COMMA };
enum { A_OPEN, A_AFTER, A_COMMA };
/* S_UTF8: a = continuation bytes still due, b = lo | hi << 8 for the next one. S_HEX: a =
 * digits read, b = their value. S_LOW_*: a high surrogate was read; "\uDC00".."\uDFFF" must
 * follow (S_LOW_HEX counts digits in a). */
enum { S_PLAIN, S_UTF8, S_ESC, S_HEX, S_LOW_BS, S_LOW_U, S_LOW_HEX };
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* One stack frame. F_OBJ: a = next property index, b = current property. F_KEY (a property
 * name being matched; node is the object): a = bytes matched, b = lowest candidate still
 * alive. F_ARR: a = items begun (saturating when there is no most). F_LIT: a = bytes matched,
 * b = lowest literal still alive (literals are sorted, so the alive ones are a run from b).
 * F_PFX: a = bytes of the raw text matched; the value that follows takes the frame's place.
 * F_TXT: a = the longest tail of the text that is a beginning of the stop (all of it: the
 * text has ended, and the value that follows takes the frame's place). */
typedef struct gframe {
    uint32_t node;
    uint8_t kind, st;
    uint16_t a;
    uint32_t b;
} gframe;

typedef struct gcfg {
    uint32_t off;       /* first frame in gstate.fr */
    uint16_t depth, ws; /* frames; whitespace bytes in the current gap */
} gcfg;

typedef struct gstate {
    gcfg *cfg;
    size_t n_cfg, cap_cfg;
    gframe *fr;
    size_t n_fr, cap_fr;
    bool overflow; /* a step wanted more than GRAMMAR_MAX_CONFIGS configurations */
} gstate;

enum { R_ERR = -1, R_REJECT = 0, R_ACCEPT = 1, R_FORKED = 2 };

static void state_free(gstate *s)
{
    free(s->cfg);
    free(s->fr);
    memset(s, 0, sizeof *s);
}

static int state_copy(gstate *dst, const gstate *src)
{
    if (grow((void **)&dst->cfg, &dst->cap_cfg, src->n_cfg, sizeof *dst->cfg) ||
        grow((void **)&dst->fr, &dst->cap_fr, src->n_fr, sizeof *dst->fr))
        return KVS_ENOMEM;
    memcpy(dst->cfg, src->cfg, src->n_cfg * sizeof *src->cfg);
    memcpy(dst->fr, src->fr, src->n_fr * sizeof *src->fr);
    dst->n_cfg = src->n_cfg;
    dst->n_fr = src->n_fr;
    return 0;
}

/* Room for one more configuration of up to depth frames; NULL on ENOMEM. */
static gframe *state_reserve(gstate *s, size_t depth)
{
    if (grow((void **)&s->cfg, &s->cap_cfg, s->n_cfg + 1, sizeof *s->cfg) ||
        grow((void **)&s->fr, &s->cap_fr, s->n_fr + depth, sizeof *s->fr))
        return NULL;
    return s->fr + s->n_fr;
}

/* Adds the configuration written at state_reserve's pointer, unless an equal one is there. */
static void state_commit(gstate *s, uint16_t depth, uint16_t ws)
{
    const gframe *f = s->fr + s->n_fr;
    for (size_t i = 0; i < s->n_cfg; i++) {
        const gcfg *c = &s->cfg[i];
        if (c->depth == depth && c->ws == ws && memcmp(s->fr + c->off, f, depth * sizeof *f) == 0)
            return;
    }
    if (s->n_cfg >= GRAMMAR_MAX_CONFIGS) {
        s->overflow = true;
        return;
    }
    s->cfg[s->n_cfg].off = (uint32_t)s->n_fr;
    s->cfg[s->n_cfg].depth = depth;
    s->cfg[s->n_cfg].ws = ws;
    s->n_cfg++;
    s->n_fr += depth;
}

/* UTF-8 lead byte: continuation count and the range of the first continuation byte (RFC
 * 3629: no overlong forms, no surrogates, nothing above U+10FFFF). false if not a lead. */
static bool utf8_lead(uint8_t c, unsigned *n, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        *n = 1;
    else if (c == 0xE0)
        *n = 2, *lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        *n = 2;
    else if (c == 0xED)
        *n = 2, *hi = 0x9F;
    else if (c == 0xF0)
        *n = 3, *lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        *n = 3;
    else if (c == 0xF4)
        *n = 3, *hi = 0x8F;
    else
        return false;
    return true;
}

/* One byte of a string after its opening quote: 1 consumed, 2 consumed and closed, 0 refused. */
static int str_byte(gframe *t, uint8_t c)
{
    unsigned n;
    uint8_t lo, hi;
    int h;
    switch (t->st) {
    case S_PLAIN:
        if (c == '"')
            return 2;
        if (c == '\\') {
            t->st = S_ESC;
            return 1;
        }
        if (c < 0x20)
            return 0;
        if (c < 0x80)
            return 1;
        if (!utf8_lead(c, &n, &lo, &hi))
            return 0;
        t->st = S_UTF8;
        t->a = (uint16_t)n;
        t->b = lo | (uint32_t)hi << 8;
        return 1;
    case S_UTF8:
        if (c < (t->b & 0xFF) || c > (t->b >> 8))
            return 0;
        t->a--;
        t->b = 0x80 | 0xBFu << 8;
        if (t->a == 0)
            t->st = S_PLAIN;
        return 1;
    case S_ESC:
        if (c == 'u') {
            t->st = S_HEX;
            t->a = 0;
            t->b = 0;
            return 1;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            t->st = S_PLAIN;
            return 1;
        }
        return 0;
    case S_HEX:
        if ((h = hex_digit(c)) < 0)
            return 0;
        t->b = t->b << 4 | (uint32_t)h;
        t->a++;
        /* a lone low surrogate (DC00-DFFF) is refused at its second digit: nothing after
         * "\uDC" could complete it */
        if (t->a == 2 && t->b >= 0xDC && t->b <= 0xDF)
            return 0;
        if (t->a == 4)
            t->st = t->b >= 0xD800 && t->b <= 0xDBFF ? S_LOW_BS : S_PLAIN;
        return 1;
    case S_LOW_BS:
        if (c != '\\')
            return 0;
        t->st = S_LOW_U;
        return 1;
    case S_LOW_U:
        if (c != 'u')
            return 0;
        t->st = S_LOW_HEX;
        t->a = 0;
        return 1;
    case S_LOW_HEX:
        if ((h = hex_digit(c)) < 0)
            return 0;
        if ((t->a == 0 && h != 0xD) || (t->a == 1 && h < 0xC))
            return 0;
        if (++t->a == 4)
            t->st = S_PLAIN;
        return 1;
    }
    return 0;
}

static bool num_can_end(const gframe *t)
{
    return t->st == N_ZERO || t->st == N_INT || t->st == N_FRAC || t->st == N_EXP;
}

/* One byte of a number: 1 consumed, 0 not part of it (the number ends before c if it can),
 * -1 refused. a counts the digits of the current part (integer, fraction, exponent), bounded
 * by GRAMMAR_MAX_*_DIGITS so every number the grammar allows is a finite double. */
static int num_byte(gframe *t, bool integer, uint8_t c)
{
    bool digit = c >= '0' && c <= '9';
    switch (t->st) {
    case N_START:
        if (c == '-')
            return t->st = N_MINUS, 1;
        /* fallthrough */
    case N_MINUS:
        t->a = 1;
        if (c == '0')
            return t->st = N_ZERO, 1;
        if (digit)
            return t->st = N_INT, 1;
        return -1;
    case N_INT:
        if (digit)
            return t->a < GRAMMAR_MAX_INT_DIGITS ? (t->a++, 1) : -1;
        /* fallthrough */
    case N_ZERO:
        if (!integer && c == '.')
            return t->st = N_DOT, 1;
        if (!integer && (c == 'e' || c == 'E'))
            return t->st = N_E, 1;
        return 0;
    case N_DOT: return digit ? (t->st = N_FRAC, t->a = 1, 1) : -1;
    case N_FRAC:
        if (digit)
            return t->a < GRAMMAR_MAX_FRAC_DIGITS ? (t->a++, 1) : -1;
        if (c == 'e' || c == 'E')
            return t->st = N_E, 1;
        return 0;
    case N_E:
        if (c == '+' || c == '-')
            return t->st = N_ESIGN, 1;
        /* fallthrough */
    case N_ESIGN: return digit ? (t->st = N_EXP, t->a = 1, 1) : -1;
    case N_EXP:
        if (digit)
            return t->a < GRAMMAR_MAX_EXP_DIGITS ? (t->a++, 1) : -1;
        return 0;
    }
    return -1;
}

static bool lit_can_end(const grammar_def *d, const gframe *t)
{
    return d->lits[d->nodes[t->node].first + t->b].len == t->a;
}

/* One byte of a literal: 1 consumed, 0 not part of it (ends before c if complete), -1. */
static int lit_byte(const grammar_def *d, gframe *t, uint8_t c)
{
    const gnode *n = &d->nodes[t->node];
    const glit *l = d->lits + n->first;
    const char *pj = d->bytes + l[t->b].off;
    for (uint32_t k = t->b; k < n->n; k++) {
        const char *pk = d->bytes + l[k].off;
        if (k != t->b && (l[k].len < t->a || memcmp(pk, pj, t->a) != 0))
            break; /* sorted: the run sharing the matched prefix has ended */
        if (l[k].len > t->a && (uint8_t)pk[t->a] == c) {
            t->b = k;
            t->a++;
            return 1;
        }
    }
    return lit_can_end(d, t) ? 0 : -1;
}

/* One byte of free text (node n, frame t): t->a becomes the longest tail of the text that
 * begins the stop, as a KMP automaton would have it (stops are short: GRAMMAR_MAX_STOP). */
static void txt_byte(const grammar_def *d, const gnode *n, gframe *t, uint8_t c)
{
    const char *stop = d->bytes + n->first;
    for (uint32_t k = t->a + 1u; k > 0; k--) /* the tail of stop[0..a) + c of length k */
        if ((uint8_t)stop[k - 1] == c && !memcmp(stop + t->a + 1 - k, stop, k - 1)) {
            t->a = (uint16_t)k;
            return;
        }
    t->a = 0;
}

/* Whether property k of object node obj (whose frame sits at stack index oi, so oi
 * containers are open counting it) can still have its value completed under max_depth. */
static bool prop_fits(const grammar_def *d, const gnode *obj, uint32_t k, uint16_t oi)
{
    uint32_t md = d->nodes[d->props[obj->first + k].value].min_depth;
    return (uint32_t)oi + md <= d->opts.max_depth;
}

/* Last candidate index for the next key: up to the first required property not yet given. */
static uint32_t key_last(const grammar_def *d, const gnode *obj, uint32_t next)
{
    uint32_t r = d->props[obj->first + next].next_req;
    return r < obj->n ? r : obj->n - 1;
}

/* First candidate property for a key after `next`, or UINT32_MAX if none fits. */
static uint32_t key_first(const grammar_def *d, const gnode *obj, uint32_t next, uint16_t oi)
{
    if (next >= obj->n)
        return UINT32_MAX;
    uint32_t last = key_last(d, obj, next);
    for (uint32_t k = next; k <= last; k++)
        if (prop_fits(d, obj, k, oi))
            return k;
    return UINT32_MAX;
}

static bool obj_can_close(const grammar_def *d, const gnode *obj, uint32_t next)
{
    return obj->kind == GK_FREE_OBJECT || next >= obj->n ||
           d->props[obj->first + next].next_req >= obj->n;
}

/* Starts a value of non-anyOf node `node` with byte c on frames f[0..*depth) (room for one
 * more frame). The stack's frames above the root are the open containers. */
static bool begin_simple(const grammar_def *d, gframe *f, uint16_t *depth, int32_t node, uint8_t c)
{
    const gnode *n = &d->nodes[node];
    if ((uint32_t)(*depth - 1) + n->min_depth > d->opts.max_depth)
        return false;
    gframe *t = &f[*depth];
    t->node = (uint32_t)node;
    t->st = 0;
    t->a = 0;
    t->b = 0;
    switch (n->kind) {
    case GK_OBJECT:
    case GK_FREE_OBJECT:
        if (c != '{')
            return false;
        t->kind = F_OBJ;
        t->st = O_OPEN;
        break;
    case GK_ARRAY:
        if (c != '[')
            return false;
        t->kind = F_ARR;
        t->st = A_OPEN;
        break;
    case GK_STRING:
        if (c != '"')
            return false;
        t->kind = F_STR;
        t->st = S_PLAIN;
        break;
    case GK_NUMBER:
    case GK_INTEGER:
        t->kind = F_NUM;
        t->st = N_START;
        if (num_byte(t, n->kind == GK_INTEGER, c) != 1)
            return false;
        break;
    case GK_LITERALS:
        t->kind = F_LIT;
        if (lit_byte(d, t, c) != 1)
            return false;
        break;
    case GK_PREFIXED:
        if ((uint8_t)d->bytes[n->first] != c)
            return false;
        t->kind = F_PFX;
        t->a = 1;
        break;
    case GK_TEXT:
        t->kind = F_TXT;
        txt_byte(d, n, t, c);
        break;
    default: return false;
    }
    (*depth)++;
    return true;
}

/* Starts a value of `node`: one configuration, or (anyOf) one per alternative that accepts c,
 * appended to out directly (R_FORKED). */
static int begin_value(const grammar_def *d, gframe *f, uint16_t *depth, uint16_t ws, int32_t node,
                       uint8_t c, gstate *out)
{
    const gnode *n = &d->nodes[node];
    if (n->kind != GK_ANYOF)
        return begin_simple(d, f, depth, node, c) ? R_ACCEPT : R_REJECT;
    for (uint32_t i = 0; i < n->n; i++) {
        const gnode *a = &d->nodes[d->alts[n->first + i]];
        if (!(a->first_bytes[c >> 5] >> (c & 31) & 1))
            continue; /* most forks die here: no copy */
        gframe *g = state_reserve(out, (size_t)*depth + 1);
        if (!g)
            return R_ERR;
        memcpy(g, f, *depth * sizeof *f);
        uint16_t dd = *depth;
        if (begin_simple(d, g, &dd, d->alts[n->first + i], c))
            state_commit(out, dd, ws);
    }
    return R_FORKED;
}

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Advances one configuration (frames f, top last; room for one push) by byte c. */
static int cfg_byte(const grammar_def *d, gframe *f, uint16_t *depth, uint16_t *ws, uint8_t c,
                    gstate *out)
{
    uint16_t ws_prev = *ws;
    *ws = 0;
    bool sp = is_ws(c);
    for (;;) {
        gframe *t = &f[*depth - 1];
        const gnode *n = &d->nodes[t->node];
        int r;
        switch (t->kind) {
        case F_ROOT:
            if (t->st == R_DONE)
                return R_REJECT;
            if (sp && d->lead_ws)
                goto gap;
            t->st = R_DONE;
            return begin_value(d, f, depth, 0, d->root, c, out);
        case F_OBJ:
            if (sp) /* whitespace is allowed in every gap of an object */
                goto gap;
            switch (t->st) {
            case O_OPEN:
            case O_COMMA:
                if (c == '"') {
                    gframe *k = &f[*depth];
                    if (n->kind == GK_FREE_OBJECT) {
                        k->kind = F_STR;
                        k->st = S_PLAIN;
                        k->node = t->node;
                        k->a = 0;
                        k->b = 0;
                    } else {
                        uint32_t j = key_first(d, n, t->a, (uint16_t)(*depth - 1));
                        if (j == UINT32_MAX)
                            return R_REJECT;
                        k->kind = F_KEY;
                        k->st = 0;
                        k->node = t->node;
                        k->a = 0;
                        k->b = j;
                    }
                    t->st = O_COLON;
                    (*depth)++;
                    return R_ACCEPT;
                }
                if (c == '}' && t->st == O_OPEN && obj_can_close(d, n, t->a)) {
                    (*depth)--;
                    return R_ACCEPT;
                }
                return R_REJECT;
            case O_COLON:
                if (c != ':')
                    return R_REJECT;
                t->st = O_VALUE;
                return R_ACCEPT;
            case O_VALUE:
                t->st = O_AFTER;
                return begin_value(
                    d, f, depth, 0,
                    n->kind == GK_FREE_OBJECT ? n->child : d->props[n->first + t->b].value, c, out);
            case O_AFTER:
                if (c == '}' && obj_can_close(d, n, t->a)) {
                    (*depth)--;
                    return R_ACCEPT;
                }
                if (c == ',' && (n->kind == GK_FREE_OBJECT ||
                                 key_first(d, n, t->a, (uint16_t)(*depth - 1)) != UINT32_MAX)) {
                    t->st = O_COMMA;
                    return R_ACCEPT;
                }
                return R_REJECT;
            }
            return R_REJECT;
        case F_KEY: {
            const gframe *o = &f[*depth - 2];
            uint16_t oi = (uint16_t)(*depth - 2);
            uint32_t last = key_last(d, n, o->a);
            const gprop *pj = &d->props[n->first + t->b];
            const char *kj = def_bytes(d, pj->key_off);
            for (uint32_t k = t->b; k <= last; k++) {
                const gprop *pk = &d->props[n->first + k];
                const char *kk = def_bytes(d, pk->key_off);
                if (pk->key_len > t->a && (uint8_t)kk[t->a] == c &&
                    (k == t->b || (prop_fits(d, n, k, oi) && memcmp(kk, kj, t->a) == 0))) {
                    t->b = k;
                    t->a++;
                    if (t->a == pk->key_len) { /* the closing quote: the key is this one */
                        gframe *ow = &f[*depth - 2];
                        ow->a = (uint16_t)(k + 1);
                        ow->b = k;
                        (*depth)--;
                    }
                    return R_ACCEPT;
                }
            }
            return R_REJECT;
        }
        case F_ARR:
            if (sp)
                goto gap;
            switch (t->st) {
            case A_OPEN:
            case A_COMMA:
                if (c == ']' && t->st == A_OPEN && n->first == 0) {
                    (*depth)--;
                    return R_ACCEPT;
                }
                t->st = A_AFTER;
                if (t->a < UINT16_MAX) /* only an array with no most gets this far */
                    t->a++;
                return begin_value(d, f, depth, 0, n->child, c, out);
            case A_AFTER:
                if (c == ',' && (n->n == 0 || t->a < n->n)) {
                    t->st = A_COMMA;
                    return R_ACCEPT;
                }
                if (c == ']' && t->a >= n->first) {
                    (*depth)--;
                    return R_ACCEPT;
                }
                return R_REJECT;
            }
            return R_REJECT;
        case F_STR:
            r = str_byte(t, c);
            if (r == 2)
                (*depth)--;
            return r ? R_ACCEPT : R_REJECT;
        case F_NUM:
            r = num_byte(t, n->kind == GK_INTEGER, c);
            if (r < 0)
                return R_REJECT;
            if (r == 1)
                return R_ACCEPT;
            if (!num_can_end(t))
                return R_REJECT;
            (*depth)--; /* the number ended before c: c belongs to the frame below */
            continue;
        case F_LIT:
            r = lit_byte(d, t, c);
            if (r < 0)
                return R_REJECT;
            if (r == 1)
                return R_ACCEPT;
            (*depth)--;
            continue;
        case F_PFX:
            if (t->a < n->n) {
                if ((uint8_t)d->bytes[n->first + t->a] != c)
                    return R_REJECT;
                t->a++;
                return R_ACCEPT;
            }
            /* the text is matched: c begins the value, with no gap, in this frame's place */
            (*depth)--;
            return begin_value(d, f, depth, 0, n->child, c, out);
        case F_TXT:
            if (t->a < n->n) {
                txt_byte(d, n, t, c);
                return R_ACCEPT;
            }
            /* the stop is matched: c begins the value, as after raw text */
            (*depth)--;
            return begin_value(d, f, depth, 0, n->child, c, out);
        }
        return R_REJECT;
    gap: /* "" | " " | "\t" | "\n" [ \t]{0,max_ws}, as llama.cpp's json.gbnf */
        if (ws_prev == 0 && (c == ' ' || c == '\t')) {
            *ws = WS_ONE;
            return R_ACCEPT;
        }
        if (ws_prev == 0 && c == '\n') {
            *ws = WS_NL;
            return R_ACCEPT;
        }
        if ((ws_prev & WS_NL) && (c == ' ' || c == '\t') && (ws_prev & WS_COUNT) < d->opts.max_ws) {
            *ws = (uint16_t)(ws_prev + 1);
            return R_ACCEPT;
        }
        return R_REJECT;
    }
}

/* out = in advanced by c (every configuration that accepts it). Returns the number of
 * configurations (0: c is refused) or R_ERR. work holds max_depth + 3 frames. */
static int state_step(const grammar_def *d, const gstate *in, uint8_t c, gstate *out, gframe *work)
{
    out->n_cfg = 0;
    out->n_fr = 0;
    out->overflow = false;
    for (size_t i = 0; i < in->n_cfg; i++) {
        const gcfg *cf = &in->cfg[i];
        uint16_t depth = cf->depth, ws = cf->ws;
        memcpy(work, in->fr + cf->off, depth * sizeof *work);
        int r = cfg_byte(d, work, &depth, &ws, c, out);
        if (r == R_ERR)
            return R_ERR;
        if (r == R_ACCEPT) {
            gframe *g = state_reserve(out, depth);
            if (!g)
                return R_ERR;
            memcpy(g, work, depth * sizeof *work);
            state_commit(out, depth, ws);
        }
    }
    return out->overflow ? R_ERR : (int)out->n_cfg;
}

static bool state_complete(const grammar_def *d, const gstate *s)
{
    for (size_t i = 0; i < s->n_cfg; i++) {
        const gframe *f = s->fr + s->cfg[i].off;
        uint16_t depth = s->cfg[i].depth;
        if (f[0].st != R_DONE)
            continue;
        if (depth == 1)
            return true;
        const gframe *t = &f[1];
        if (depth == 2 &&
            ((t->kind == F_NUM && num_can_end(t)) || (t->kind == F_LIT && lit_can_end(d, t))))
            return true;
    }
    return false;
}

/* Every configuration is inside plain string text (not in an escape or a UTF-8 sequence). */
static bool state_plain_string(const gstate *s)
{
    for (size_t i = 0; i < s->n_cfg; i++) {
        const gframe *t = s->fr + s->cfg[i].off + s->cfg[i].depth - 1;
        if (t->kind != F_STR || t->st != S_PLAIN)
            return false;
    }
    return s->n_cfg > 0;
}

/* ---- the vocabulary trie ---------------------------------------------------------------- */

/* Nodes in depth-first pre-order: a node's subtree is a contiguous run of nodes, and the
 * tokens of the subtree a contiguous run of toks[] (those ending at the node first). */
typedef struct gv_node {
    uint32_t edge_first;
    uint16_t n_edges;
    uint8_t safe;       /* every token below has, after this prefix, only plain string text */
    uint8_t pre_safe;   /* the prefix itself is plain string text ending at a character */
    uint8_t below_safe; /* every token strictly below is plain string text as a whole */
    uint32_t tok_first, tok_here, tok_end;
} gv_node;

typedef struct gv_edge {
    uint32_t node;
    uint8_t byte;
} gv_edge;

struct grammar_vocab {
    int32_t n_tokens;
    uint32_t *piece_off; /* (n_tokens + 1) into pieces */
    char *pieces;
    uint8_t *is_end; /* (n_tokens) */
    int32_t *end_ids;
    size_t n_end;
    gv_node *nodes;
    size_t n_nodes;
    gv_edge *edges;
    int32_t *toks;
    uint32_t *safe_mask; /* tokens whose whole piece is plain string text */
    uint32_t max_len;
};

typedef struct tnode { /* build-time trie: children as a byte-sorted sibling list */
    uint32_t first_child, next_sib, tok_head;
    uint8_t byte, safe, pre_safe, below_safe;
} tnode;

/* sf[k]: bytes p[k..len) are plain string text read from a character boundary. */
static void string_safe_suffixes(const uint8_t *p, uint32_t len, uint8_t *sf)
{
    sf[len] = 1;
    for (uint32_t k = len; k-- > 0;) {
        uint8_t c = p[k];
        unsigned n;
        uint8_t lo, hi;
        if (c < 0x80) {
            sf[k] = c >= 0x20 && c != '"' && c != '\\' && sf[k + 1];
            continue;
        }
        sf[k] = 0;
        if (!utf8_lead(c, &n, &lo, &hi) || k + n >= len)
            continue;
        bool ok = p[k + 1] >= lo && p[k + 1] <= hi;
        for (unsigned i = 2; ok && i <= n; i++)
            ok = p[k + i] >= 0x80 && p[k + i] <= 0xBF;
        sf[k] = ok && sf[k + n + 1];
    }
}

/* pf[k]: bytes p[0..k) are plain string text ending at a character boundary. */
static void string_safe_prefixes(const uint8_t *p, uint32_t len, uint8_t *pf)
{
    memset(pf, 0, len + 1);
    pf[0] = 1;
    for (uint32_t k = 0; k < len;) {
        uint8_t c = p[k];
        unsigned n = 0;
        uint8_t lo, hi;
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\')
                return;
        } else {
            if (!utf8_lead(c, &n, &lo, &hi) || k + n >= len || p[k + 1] < lo || p[k + 1] > hi)
                return;
            for (unsigned i = 2; i <= n; i++)
                if (p[k + i] < 0x80 || p[k + i] > 0xBF)
                    return;
        }
        k += n + 1;
        pf[k] = 1;
    }
}

static void dfs_layout(grammar_vocab *gv, const tnode *tn, const int32_t *tok_next, uint32_t u,
                       size_t *n_nodes, size_t *n_edges, size_t *n_toks)
{
    uint32_t me = (uint32_t)(*n_nodes)++;
    gv_node *g = &gv->nodes[me];
    g->safe = tn[u].safe;
    g->pre_safe = tn[u].pre_safe;
    g->below_safe = tn[u].below_safe;
    g->tok_first = (uint32_t)*n_toks;
    for (int32_t t = (int32_t)tn[u].tok_head; t >= 0; t = tok_next[t])
        gv->toks[(*n_toks)++] = t;
    g->tok_here = (uint32_t)*n_toks;
    uint16_t ne = 0;
    for (uint32_t c = tn[u].first_child; c; c = tn[c].next_sib)
        ne++;
    g->edge_first = (uint32_t)*n_edges;
    g->n_edges = ne;
    *n_edges += ne;
    uint32_t i = 0;
    for (uint32_t c = tn[u].first_child; c; c = tn[c].next_sib, i++) {
        gv->edges[gv->nodes[me].edge_first + i].byte = tn[c].byte;
        gv->edges[gv->nodes[me].edge_first + i].node = (uint32_t)*n_nodes;
        dfs_layout(gv, tn, tok_next, c, n_nodes, n_edges, n_toks);
    }
    gv->nodes[me].tok_end = (uint32_t)*n_toks;
}

int grammar_vocab_create(const tok_vocab *v, const int32_t *end_ids, size_t n_end,
                         grammar_vocab **out)
{
    int32_t n = tok_n_vocab(v);
    if (n <= 0)
        return KVS_EINVAL;
    int32_t eos = tok_eos(v);
    if (!end_ids) {
        end_ids = eos >= 0 ? &eos : NULL;
        n_end = eos >= 0 ? 1 : 0;
    }
    for (size_t i = 0; i < n_end; i++)
        if (end_ids[i] < 0 || end_ids[i] >= n)
            return KVS_EINVAL;
    grammar_vocab *gv = calloc(1, sizeof *gv);
    tnode *tn = NULL;
    int32_t *tok_next = NULL;
    uint8_t *sf = NULL;
    uint32_t *path = NULL;
    int rc = KVS_ENOMEM;
    if (!gv)
        return KVS_ENOMEM;
    gv->n_tokens = n;
    gv->piece_off = malloc(((size_t)n + 1) * sizeof *gv->piece_off);
    gv->is_end = calloc((size_t)n, 1);
    gv->end_ids = malloc((n_end ? n_end : 1) * sizeof *gv->end_ids);
    tok_next = malloc((size_t)n * sizeof *tok_next);
    gv->safe_mask = calloc(grammar_mask_words(n), sizeof *gv->safe_mask);
    if (!gv->piece_off || !gv->is_end || !gv->end_ids || !tok_next || !gv->safe_mask)
        goto fail;
    gv->n_end = n_end;
    for (size_t i = 0; i < n_end; i++) {
        gv->end_ids[i] = end_ids[i];
        gv->is_end[end_ids[i]] = 1;
    }
    size_t total = 0, cap = 0;
    for (int32_t id = 0; id < n; id++) {
        int len = tok_token_to_piece(v, id, NULL, 0);
        if (len < 0) {
            rc = len;
            goto fail;
        }
        if (gv->is_end[id])
            len = 0; /* end tokens are never text */
        if (grow((void **)&gv->pieces, &cap, total + (size_t)len + 1, 1))
            goto fail;
        gv->piece_off[id] = (uint32_t)total;
        if (len)
            tok_token_to_piece(v, id, gv->pieces + total, (size_t)len);
        total += (size_t)len;
        if ((uint32_t)len > gv->max_len)
            gv->max_len = (uint32_t)len;
    }
    gv->piece_off[n] = (uint32_t)total;
    /* Build-time trie; node 0 is the root (0 also ends the sibling lists: the root is no
     * one's child). */
    size_t n_tn = 1, cap_tn = 1024;
    tn = malloc(cap_tn * sizeof *tn);
    sf = malloc(gv->max_len + 2);
    path = malloc((gv->max_len + 2) * sizeof *path);
    if (!tn || !sf || !path)
        goto fail;
    memset(&tn[0], 0, sizeof tn[0]);
    tn[0].tok_head = UINT32_MAX;
    tn[0].safe = 1;
    tn[0].pre_safe = 1;
    tn[0].below_safe = 1;
    for (int32_t id = n; id-- > 0;) { /* in reverse, so each node's list is in id order */
        const uint8_t *p = (const uint8_t *)gv->pieces + gv->piece_off[id];
        uint32_t len = gv->piece_off[id + 1] - gv->piece_off[id];
        tok_next[id] = -1;
        if (len == 0)
            continue;
        uint32_t u = 0;
        path[0] = 0;
        for (uint32_t k = 0; k < len; k++) {
            uint32_t *link = &tn[u].first_child;
            while (*link && tn[*link].byte < p[k])
                link = &tn[*link].next_sib;
            if (!*link || tn[*link].byte != p[k]) {
                if (n_tn == cap_tn) {
                    size_t off = (size_t)(link - &tn[0].first_child); /* link moves with tn */
                    void *q = realloc(tn, 2 * cap_tn * sizeof *tn);
                    if (!q)
                        goto fail;
                    tn = q;
                    cap_tn *= 2;
                    link = &tn[0].first_child + off;
                }
                tnode *nn = &tn[n_tn];
                nn->first_child = 0;
                nn->next_sib = *link;
                nn->tok_head = UINT32_MAX;
                nn->byte = p[k];
                nn->safe = 1;
                nn->pre_safe = 0;
                nn->below_safe = 1;
                *link = (uint32_t)n_tn++;
            }
            u = *link;
            path[k + 1] = u;
        }
        tok_next[id] = (int32_t)tn[u].tok_head;
        tn[u].tok_head = (uint32_t)id;
        string_safe_suffixes(p, len, sf);
        for (uint32_t k = 0; k <= len; k++)
            tn[path[k]].safe &= sf[k];
        for (uint32_t k = 0; k < len; k++)
            tn[path[k]].below_safe &= sf[0];
        string_safe_prefixes(p, len, sf); /* the same for every token through a node */
        for (uint32_t k = 0; k <= len; k++)
            tn[path[k]].pre_safe = sf[k];
        if (sf[len])
            gv->safe_mask[id >> 5] |= 1u << (id & 31);
    }
    gv->nodes = malloc(n_tn * sizeof *gv->nodes);
    gv->edges = malloc(n_tn * sizeof *gv->edges);
    gv->toks = malloc((size_t)n * sizeof *gv->toks);
    if (!gv->nodes || !gv->edges || !gv->toks)
        goto fail;
    size_t nn = 0, ne = 0, nt = 0;
    dfs_layout(gv, tn, tok_next, 0, &nn, &ne, &nt);
    gv->n_nodes = nn;
    free(tn);
    free(tok_next);
    free(sf);
    free(path);
    *out = gv;
    return 0;
fail:
    free(tn);
    free(tok_next);
    free(sf);
    free(path);
    grammar_vocab_destroy(gv);
    return rc;
}

void grammar_vocab_destroy(grammar_vocab *gv)
{
    if (!gv)
        return;
    free(gv->piece_off);
    free(gv->pieces);
    free(gv->is_end);
    free(gv->end_ids);
    free(gv->nodes);
    free(gv->edges);
    free(gv->toks);
    free(gv->safe_mask);
    free(gv);
}

int32_t grammar_vocab_n_tokens(const grammar_vocab *gv)
{
    return gv->n_tokens;
}
size_t grammar_vocab_n_nodes(const grammar_vocab *gv)
{
    return gv->n_nodes;
}

/* ---- one sequence ----------------------------------------------------------------------- */

struct grammar {
    const grammar_def *d;
    gstate cur;
    gstate tmp[2]; /* accept_bytes' double buffer */
    gframe *work;  /* (max_depth + 3) frames: one configuration being advanced */
    gstate *lvl;   /* mask walk: the state after each trie depth */
    size_t n_lvl;
};

static int grammar_alloc(const grammar_def *d, grammar **out)
{
    grammar *g = calloc(1, sizeof *g);
    if (!g)
        return KVS_ENOMEM;
    g->d = d;
    g->work = malloc((d->opts.max_depth + 3) * sizeof *g->work);
    if (!g->work) {
        free(g);
        return KVS_ENOMEM;
    }
    *out = g;
    return 0;
}

int grammar_create(const grammar_def *d, grammar **out)
{
    grammar *g;
    int rc = grammar_alloc(d, &g);
    if (rc)
        return rc;
    gframe *f = state_reserve(&g->cur, 1);
    if (!f) {
        grammar_destroy(g);
        return KVS_ENOMEM;
    }
    memset(f, 0, sizeof *f);
    f->kind = F_ROOT;
    f->st = R_START;
    f->node = (uint32_t)d->root;
    state_commit(&g->cur, 1, 0);
    *out = g;
    return 0;
}

void grammar_destroy(grammar *g)
{
    if (!g)
        return;
    state_free(&g->cur);
    state_free(&g->tmp[0]);
    state_free(&g->tmp[1]);
    for (size_t i = 0; i < g->n_lvl; i++)
        state_free(&g->lvl[i]);
    free(g->lvl);
    free(g->work);
    free(g);
}

int grammar_clone(const grammar *g, grammar **out)
{
    grammar *c;
    int rc = grammar_alloc(g->d, &c);
    if (rc)
        return rc;
    if (state_copy(&c->cur, &g->cur)) {
        grammar_destroy(c);
        return KVS_ENOMEM;
    }
    *out = c;
    return 0;
}

bool grammar_accept_bytes(grammar *g, const void *bytes, size_t len)
{
    const uint8_t *p = bytes;
    const gstate *src = &g->cur;
    int k = 0;
    for (size_t i = 0; i < len; i++) {
        if (state_step(g->d, src, p[i], &g->tmp[k], g->work) <= 0)
            return false;
        src = &g->tmp[k];
        k ^= 1;
    }
    if (len) { /* the result is in tmp[k ^ 1]: make it current */
        gstate t = g->cur;
        g->cur = g->tmp[k ^ 1];
        g->tmp[k ^ 1] = t;
    }
    return true;
}

static const char *piece(const grammar_vocab *gv, int32_t id, size_t *len)
{
    *len = gv->piece_off[id + 1] - gv->piece_off[id];
    return gv->pieces + gv->piece_off[id];
}

bool grammar_accept_token(grammar *g, const grammar_vocab *gv, int32_t token)
{
    if (token < 0 || token >= gv->n_tokens)
        return false;
    if (gv->is_end[token])
        return grammar_is_complete(g);
    size_t len;
    const char *p = piece(gv, token, &len);
    return len > 0 && grammar_accept_bytes(g, p, len);
}

bool grammar_is_complete(const grammar *g)
{
    return state_complete(g->d, &g->cur);
}

bool grammar_is_finished(grammar *g)
{
    if (!state_complete(g->d, &g->cur))
        return false;
    for (int c = 0; c < 256; c++) /* on scratch: the state itself is not changed */
        if (state_step(g->d, &g->cur, (uint8_t)c, &g->tmp[0], g->work) != 0)
            return false; /* something may follow (or no memory to tell: keep going) */
    return true;
}

static void set_bits(uint32_t *mask, const int32_t *toks, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++)
        mask[toks[i] >> 5] |= 1u << (toks[i] & 31);
}

/* The one byte that can change s, when s is one configuration inside free text with no part
 * of its stop matched: any other byte leaves s as it is. -1 when s is not such a state. */
static int text_idle_byte(const grammar_def *d, const gstate *s)
{
    if (s->n_cfg != 1)
        return -1;
    const gframe *t = s->fr + s->cfg[0].off + s->cfg[0].depth - 1;
    if (t->kind != F_TXT || t->a != 0)
        return -1;
    return (uint8_t)d->bytes[d->nodes[t->node].first];
}

/* covered: the walk began inside plain string text, so mask already holds safe_mask; a
 * subtree of safe text under a safe prefix is then in it already. Inside free text the edges
 * that leave the state as it is (text_idle_byte) are followed without stepping, so a walk
 * through an analysis message costs the trie's size, not a step per node. */
static int walk(grammar *g, const grammar_vocab *gv, uint32_t u, const gstate *s, size_t level,
                bool covered, uint32_t *mask)
{
    const gv_node *n = &gv->nodes[u];
    if (n->safe && state_plain_string(s)) {
        if (!(covered && n->pre_safe))
            set_bits(mask, gv->toks, n->tok_first, n->tok_end);
        return 0;
    }
    set_bits(mask, gv->toks, n->tok_first, n->tok_here);
    if (covered && n->below_safe)
        return 0; /* everything below is plain text from the start: in safe_mask already */
    gstate *next = &g->lvl[level];
    int idle = text_idle_byte(g->d, s);
    for (uint32_t i = 0; i < n->n_edges; i++) {
        const gv_edge *e = &gv->edges[n->edge_first + i];
        const gv_node *cn = &gv->nodes[e->node];
        if (covered && cn->below_safe && cn->pre_safe)
            continue; /* the whole subtree is plain text from the start: in safe_mask */
        int r;
        if (idle >= 0 && e->byte != idle) { /* s itself: deeper levels never write it */
            if ((r = walk(g, gv, e->node, s, level + 1, covered, mask)) < 0)
                return r;
            continue;
        }
        r = state_step(g->d, s, e->byte, next, g->work);
        if (r < 0)
            return next->overflow ? KVS_ERANGE : KVS_ENOMEM;
        if (r > 0 && (r = walk(g, gv, e->node, next, level + 1, covered, mask)) < 0)
            return r;
    }
    return 0;
}

int grammar_mask(grammar *g, const grammar_vocab *gv, uint32_t *mask)
{
    size_t words = grammar_mask_words(gv->n_tokens);
    bool covered = state_plain_string(&g->cur);
    if (covered) /* whatever the stack, plain text keeps a string open: start from those */
        memcpy(mask, gv->safe_mask, words * sizeof *mask);
    else
        memset(mask, 0, words * sizeof *mask);
    if (g->n_lvl < (size_t)gv->max_len + 1) {
        gstate *l = realloc(g->lvl, ((size_t)gv->max_len + 1) * sizeof *l);
        if (!l)
            return KVS_ENOMEM;
        memset(l + g->n_lvl, 0, ((size_t)gv->max_len + 1 - g->n_lvl) * sizeof *l);
        g->lvl = l;
        g->n_lvl = (size_t)gv->max_len + 1;
    }
    int rc = walk(g, gv, 0, &g->cur, 0, covered, mask);
    if (rc < 0)
        return rc;
    if (grammar_is_complete(g))
        for (size_t i = 0; i < gv->n_end; i++)
            mask[gv->end_ids[i] >> 5] |= 1u << (gv->end_ids[i] & 31);
    int count = 0;
    for (size_t i = 0; i < words; i++)
        count += __builtin_popcount(mask[i]);
    return count;
}

void grammar_mask_logits(const uint32_t *mask, int32_t n_tokens, float *logits)
{
    for (int32_t w = 0; w * 32 < n_tokens; w++) {
        uint32_t m = mask[w];
        if (m == UINT32_MAX)
            continue; /* inside strings nearly every word is full */
        int32_t end = n_tokens - w * 32 < 32 ? n_tokens - w * 32 : 32;
        if (m == 0) { /* outside strings nearly every word is empty */
            for (int32_t i = 0; i < end; i++)
                logits[w * 32 + i] = -INFINITY;
            continue;
        }
        for (int32_t i = 0; i < end; i++)
            if (!(m >> i & 1))
                logits[w * 32 + i] = -INFINITY;
    }
}
