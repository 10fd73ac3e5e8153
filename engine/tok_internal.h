/* Tokenizer internals shared by tokenizer.c (vocab, special tokens, decoding), tok_spm.c and
 * tok_bpe.c (the two encoders) and tok_util.c (hash map, heap, UTF-8 helpers). Not a public
 * header: names carry the tok__ prefix. Everything in a tok_vocab is read-only after creation;
 * per-call scratch lives on the caller's stack or in tok__ids / tok__heap owned by the call. */
#ifndef KVS_ENGINE_TOK_INTERNAL_H
#define KVS_ENGINE_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Per-token attribute bits (llama.cpp keeps the same as a bit set, because its load-time
 * fix-ups can add CONTROL to a token whose stored type says otherwise). */
enum {
    TOK__NORMAL = 1u << 0,
    TOK__UNKNOWN = 1u << 1,
    TOK__CONTROL = 1u << 2,
    TOK__USER_DEFINED = 1u << 3,
    TOK__UNUSED = 1u << 4,
    TOK__BYTE = 1u << 5,
    TOK__LSTRIP = 1u << 6, /* special token eats whitespace on its left */
    TOK__RSTRIP = 1u << 7, /* ... and on its right */
};

/* Open-addressing string -> int32 map. Keys are not copied: they must outlive the map. */
typedef struct tok__map_entry {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok__map_entry;

typedef struct tok__map {
    tok__map_entry *e;
    size_t mask; /* capacity - 1, capacity a power of two */
    size_t n;
} tok__map;

int tok__map_init(tok__map *m, size_t expected);
void tok__map_free(tok__map *m);
/* Adds key -> val; an existing key keeps its first value (llama.cpp's emplace semantics). */
int tok__map_put(tok__map *m, const char *key, size_t len, int32_t val);
/* Value for key, or -1. */
int32_t tok__map_get(const tok__map *m, const char *key, size_t len);
/* Value for the key a + ' ' + b (a BPE merge "left right"), or -1; nothing is built. */
int32_t tok__map_get_pair(const tok__map *m, const char *a, size_t alen, const char *b,
                          size_t blen);

/* Growable id vector for encode output. */
typedef struct tok__ids {
    int32_t *v;
    size_t n, cap;
} tok__ids;

int tok__ids_push(tok__ids *o, int32_t id);

/* Binary min-heap of candidate merges, ordered by (key, left): llama.cpp's tie-break is the
 * leftmost pair, which makes the result independent of heap internals. */
typedef struct tok__bigram {
    double key; /* BPE: merge rank; SPM: -score */
    int32_t left, right;
    uint32_t size; /* byte length of left+right when queued: detects stale entries */
} tok__bigram;

typedef struct tok__heap {
    tok__bigram *v;
    size_t n, cap;
} tok__heap;

int tok__heap_push(tok__heap *h, tok__bigram b);
tok__bigram tok__heap_pop(tok__heap *h); /* h->n must be > 0 */

/* Linked symbol used by both merge loops (llama.cpp's llm_symbol). */
typedef struct tok__sym {
    int32_t prev, next;
    uint32_t off; /* byte offset into the word */
    uint32_t n;   /* byte length; 0 once merged into its left neighbour */
} tok__sym;

/* Byte length of the UTF-8 sequence that lead byte c announces (1 for stray continuation
 * bytes), as llama.cpp's unicode_len_utf8: only the top four bits are looked at. */
static inline size_t tok__utf8_len(unsigned char c)
{
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Decodes one code point at s[*i] the way llama.cpp's unicode_cpts_from_utf8 does (no
 * overlong or surrogate checks); on a malformed sequence consumes one byte and returns
 * 0xFFFD. */
uint32_t tok__utf8_next(const unsigned char *s, size_t n, size_t *i);
/* Encodes cpt (<= 0x10FFFF) into out (4 bytes room); returns the byte count. */
size_t tok__utf8_put(uint32_t cpt, unsigned char *out);

#define TOK__MAX_REGEX 6

struct tok_vocab {
    enum tok_family family;
    int32_t n_vocab;

    char *text_arena;   /* all token texts, each NUL-terminated */
    uint32_t *text_off; /* [n_vocab] */
    uint32_t *text_len; /* [n_vocab] */
    float *score;       /* [n_vocab] */
    uint8_t *flags;     /* [n_vocab] TOK__* bits */
    tok__map token_map; /* text -> id */
    size_t max_token_len;

    char *piece_arena;   /* decoded piece per token (what tok_token_to_piece returns) */
    uint32_t *piece_off; /* [n_vocab] */
    uint32_t *piece_len; /* [n_vocab] */

    int32_t bos, eos, unk, pad;
    int32_t eog[TOK_MAX_EOG]; /* end-of-generation tokens (tok_eog_ids), EOS first */
    size_t n_eog;
    bool add_bos;
    bool add_eos; /* tokenizer.ggml.add_eos_token: an embedding model's input ends with EOS */
    bool add_space_prefix;
    int32_t byte_token[256]; /* token for a raw byte (byte fallback), -1 if none */

    /* Special tokens split out of the text before tokenizing, longest first. */
    int32_t *special;
    size_t n_special;
    /* Trie over the special tokens' texts (node 0 is the root). */
    struct tok__trie_node *trie;
    size_t n_trie;
    int32_t trie_root[256];

    /* BPE only. */
    char *merge_arena;
    tok__map merge_map; /* "left right" -> rank */
    bool ignore_merges; /* a word that is itself a token is taken whole (llama3 family) */
    pcre2_code *regex[TOK__MAX_REGEX];
    int n_regex;
    unsigned char byte_enc[256][2]; /* GPT-2 byte -> printable code point, as UTF-8 */
    unsigned char byte_enc_len[256];
    int16_t byte_dec[512]; /* printable code point -> byte, -1 if not in the mapping */
};

struct tok__trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t token;   /* special token ending here, -1 if none */
    unsigned char byte;
};

/* True if id may come out of the merge loops (plain text never yields control tokens). */
static inline bool tok__mergeable(const tok_vocab *v, int32_t id)
{
    return id >= 0 && (v->flags[id] & (TOK__CONTROL | TOK__UNKNOWN | TOK__UNUSED)) == 0;
}

static inline const char *tok__text(const tok_vocab *v, int32_t id)
{
    return v->text_arena + v->text_off[id];
}

/* Encoders for one raw-text fragment; they append to out. */
int tok__spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                    tok__ids *out);
int tok__bpe_encode(const tok_vocab *v, const char *text, size_t len, tok__ids *out);

/* BPE setup: merges, pre-tokenizer regexes, byte mapping. */
int tok__bpe_init(tok_vocab *v, const gguf_file *f, char *err, size_t err_len);
void tok__bpe_free(tok_vocab *v);
/* The bytes a byte-level BPE token text stands for (llama.cpp's llama_decode_text). Writes
 * at most cap bytes; returns the full length. */
size_t tok__bpe_unmap(const tok_vocab *v, const char *text, size_t len, char *out, size_t cap);

#endif
