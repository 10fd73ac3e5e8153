/* Byte-level BPE encoder (llama.cpp's llm_tokenizer_bpe): the text is split into words by the
 * pre-tokenizer regexes that tokenizer.ggml.pre selects (applied in sequence, each one
 * re-splitting the pieces of the previous one, unmatched gaps kept as pieces), each word's
 * bytes are mapped to GPT-2's printable code points, and adjacent symbols are merged
 * lowest-rank-first following tokenizer.ggml.merges.
 * The regexes run with PCRE2 in UTF + UCP mode on a copy of the text in which malformed UTF-8
 * was replaced by U+FFFD, as llama.cpp's unicode_cpts_from_utf8 does. */
#include "engine/tok_internal.h"

#include "common/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k (GPT-4o, gpt-oss, Llama 4) in the form llama.cpp runs it: its tokenizer.json's
 * [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]* ("upper") and [\p{Ll}\p{Lm}\p{Lo}\p{M}]+ ("lower") are
 * spelled "a letter but not a-z" and "a letter but not A-Z", so any non-ASCII letter counts as
 * both and combining marks are no part of a word; a word may end in a contraction, and a run of
 * punctuation takes the slashes and line breaks after it. */
#define RE_O200K_CASE "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
#define RE_O200K_UP "(?:(?=\\p{L})[^a-z])"
#define RE_O200K_LO "(?:(?=\\p{L})[^A-Z])"
#define RE_O200K                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "*" RE_O200K_LO "+" RE_O200K_CASE                         \
    "|[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "+" RE_O200K_LO "*" RE_O200K_CASE                        \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral's tekken (Mistral NeMo, Ministral 3, Mistral Small 3.x, Magistral, Devstral): o200k's
 * words (spelled as above) without the contractions, digits one by one. */
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "*" RE_O200K_LO "+"                                       \
    "|[^\\r\\n\\p{L}\\p{N}]?" RE_O200K_UP "+" RE_O200K_LO "*"                                      \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs, a block below them, Hangul (deepseek's "[一-龥ࠀ-一가-퟿]+"). */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* deepseek-llm's letter class: the cased letters (Lu, Ll, Lt) of its Unicode version, spelled
 * out as code points so no editor or normaliser can fold look-alikes (U+212A KELVIN SIGN). */
#define RE_DEEPSEEK_LETTERS                                                                        \
    "\\s?[\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"     \
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}"         \
    "\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-"         \
    "\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-"     \
    "\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"        \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-"       \
    "\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"         \
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-"        \
    "\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"        \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-"         \
    "\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-"         \
    "\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}"         \
    "\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-"       \
    "\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"      \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"         \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
/* ASCII and full-width punctuation, curly quotes, ideographic space/comma/stop. */
#define RE_DEEPSEEK_PUNCT                                                                          \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"

/* Pre-tokenizers by tokenizer.ggml.pre, as llama.cpp's llm_tokenizer_bpe sets them up. */
typedef struct pre_def {
    const char *names[8]; /* NULL-terminated */
    const char *regex[TOK__MAX_REGEX + 1];
    bool ignore_merges;
    bool add_bos;
} pre_def;

static const pre_def k_pre[] = {
    {{"default", NULL},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
     false,
     false},
    {{"gpt-2", "mpt", "phi-2", "olmo", "jais", "jina-es", "jina-de", NULL},
     {RE_GPT2, NULL},
     false,
     false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", NULL},
     {"\\p{N}", RE_GPT2, NULL},
     false,
     false},
    {{"falcon", NULL},
     {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL},
     false,
     false},
    {{"deepseek-coder", NULL},
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}", NULL},
     false,
     false},
    {{"deepseek-llm", NULL},
     {"[\r\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     false,
     false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "lfm2", NULL},
     {RE_LLAMA3, NULL},
     true,
     true},
    {{"dbrx", "smaug-bpe", NULL}, {RE_LLAMA3, NULL}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", NULL}, {RE_QWEN2, NULL}, false, false},
    {{"gpt-4o", "llama4", "minimax-m2", NULL}, {RE_O200K, NULL}, false, false},
    /* llama.cpp: tekken takes whole words before merges and adds BOS, as llama3 */
    {{"tekken", NULL}, {RE_TEKKEN, NULL}, true, true},
};

static const pre_def *find_pre(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
        for (const char *const *n = k_pre[i].names; *n; n++)
            if (strlen(*n) == len && memcmp(*n, name, len) == 0)
                return &k_pre[i];
    return NULL;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order, so every byte has a visible, distinct stand-in. */
static void init_byte_map(tok_vocab *v)
{
    for (int i = 0; i < 512; i++)
        v->byte_dec[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        uint32_t cpt = printable ? (uint32_t)b : 256u + (uint32_t)n++;
        unsigned char buf[4];
        size_t len = tok__utf8_put(cpt, buf);
        memcpy(v->byte_enc[b], buf, len);
        v->byte_enc_len[b] = (unsigned char)len;
        v->byte_dec[cpt] = (int16_t)b;
    }
}

int tok__bpe_init(tok_vocab *v, const gguf_file *f, char *err, size_t err_len)
{
    init_byte_map(v);

    int64_t kv = gguf_find_key(f, "tokenizer.ggml.merges");
    if (kv < 0) {
        snprintf(err, err_len, "tokenizer.ggml.merges missing");
        return KVS_ENOKEY;
    }
    enum gguf_type et;
    uint64_t count;
    const void *data;
    if (gguf_get_arr(f, "tokenizer.ggml.merges", &et, &count, &data) != 0 ||
        et != GGUF_TYPE_STRING || count > INT32_MAX) {
        snprintf(err, err_len, "tokenizer.ggml.merges is not a string array");
        return KVS_EKEYTYPE;
    }
    size_t total = 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        size_t len;
        if (gguf_arr_str(f, kv, i, &s, &len) != 0)
            return KVS_EKEYTYPE;
        total += len + 1;
    }
    v->merge_arena = malloc(total ? total : 1);
    int rc = tok__map_init(&v->merge_map, (size_t)count);
    if (!v->merge_arena || rc)
        return KVS_ENOMEM;
    size_t off = 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        size_t len;
        gguf_arr_str(f, kv, i, &s, &len);
        memcpy(v->merge_arena + off, s, len);
        v->merge_arena[off + len] = '\0';
        rc = tok__map_put(&v->merge_map, v->merge_arena + off, len, (int32_t)i);
        if (rc)
            return rc;
        off += len + 1;
    }

    const char *pre = "default";
    size_t pre_len = strlen(pre);
    if (gguf_find_key(f, "tokenizer.ggml.pre") >= 0 &&
        gguf_get_str(f, "tokenizer.ggml.pre", &pre, &pre_len) != 0) {
        snprintf(err, err_len, "tokenizer.ggml.pre is not a string");
        return KVS_EKEYTYPE;
    }
    const pre_def *def = find_pre(pre, pre_len);
    if (!def) {
        snprintf(err, err_len, "unknown pre-tokenizer '%.*s'", (int)(pre_len > 64 ? 64 : pre_len),
                 pre);
        return KVS_EUNSUPPORTED;
    }
    v->ignore_merges = def->ignore_merges;
    v->add_bos = def->add_bos;
    for (int i = 0; i < TOK__MAX_REGEX && def->regex[i]; i++) {
        int code;
        PCRE2_SIZE eoff;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)def->regex[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &eoff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(code, msg, sizeof msg);
            snprintf(err, err_len, "pre-tokenizer regex %d: %s at %zu", i, (const char *)msg,
                     (size_t)eoff);
            return KVS_EUNSUPPORTED;
        }
        /* JIT is an optimisation only: without it pcre2_match interprets. */
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        v->regex[v->n_regex++] = re;
    }
    return 0;
}

void tok__bpe_free(tok_vocab *v)
{
    for (int i = 0; i < v->n_regex; i++)
        pcre2_code_free(v->regex[i]);
    v->n_regex = 0;
    tok__map_free(&v->merge_map);
    free(v->merge_arena);
    v->merge_arena = NULL;
}

size_t tok__bpe_unmap(const tok_vocab *v, const char *text, size_t len, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (n < cap)                                                                               \
            out[n] = (char)(c);                                                                    \
        n++;                                                                                       \
    } while (0)
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cpt = tok__utf8_next(s, len, &i);
        if (cpt < 512 && v->byte_dec[cpt] >= 0) {
            PUT(v->byte_dec[cpt]);
            continue;
        }
        /* Not a byte stand-in: llama.cpp's llama_decode_text marker, kept for parity. */
        unsigned char u[4];
        size_t ul = tok__utf8_put(cpt > 0x10FFFF ? 0xFFFD : cpt, u);
        for (const char *m = "[UNK_BYTE_0x"; *m; m++)
            PUT(*m);
        for (size_t k = 0; k < ul; k++) {
            PUT(hex[u[k] >> 4]);
            PUT(hex[u[k] & 15]);
        }
        for (size_t k = 0; k < len; k++)
            PUT(text[k]);
        PUT(']');
    }
#undef PUT
    return n;
}

/* Per-call scratch for the word loop, reused across words. */
typedef struct bpe_scratch {
    char *word;
    size_t word_cap;
    tok__sym *sym;
    size_t sym_cap;
    tok__heap heap;
} bpe_scratch;

typedef struct piece {
    size_t off, len;
} piece;

typedef struct piece_vec {
    piece *v;
    size_t n, cap;
} piece_vec;

static int piece_push(piece_vec *p, size_t off, size_t len)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        piece *q = realloc(p->v, cap * sizeof *q);
        if (!q)
            return KVS_ENOMEM;
        p->v = q;
        p->cap = cap;
    }
    p->v[p->n++] = (piece){off, len};
    return 0;
}

static int add_bigram(const tok_vocab *v, bpe_scratch *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const tok__sym *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = tok__map_get_pair(&v->merge_map, s->word + l->off, l->n, s->word + r->off, r->n);
    if (rank < 0)
        return 0;
    tok__bigram b = {.key = rank, .left = left, .right = right, .size = l->n + r->n};
    return tok__heap_push(&s->heap, b);
}

/* Merges one word (raw bytes) and appends its tokens. */
static int bpe_word(const tok_vocab *v, bpe_scratch *s, const unsigned char *raw, size_t len,
                    tok__ids *out)
{
    if (len == 0)
        return 0;
    if (2 * len > UINT32_MAX)
        return KVS_ERANGE;
    if (s->word_cap < 2 * len) {
        free(s->word);
        s->word = malloc(2 * len);
        s->word_cap = s->word ? 2 * len : 0;
        if (!s->word)
            return KVS_ENOMEM;
    }
    if (s->sym_cap < len) {
        free(s->sym);
        s->sym = malloc(len * sizeof *s->sym);
        s->sym_cap = s->sym ? len : 0;
        if (!s->sym)
            return KVS_ENOMEM;
    }
    size_t wlen = 0;
    for (size_t i = 0; i < len; i++) {
        s->sym[i] = (tok__sym){.prev = (int32_t)i - 1,
                               .next = i + 1 == len ? -1 : (int32_t)i + 1,
                               .off = (uint32_t)wlen,
                               .n = v->byte_enc_len[raw[i]]};
        memcpy(s->word + wlen, v->byte_enc[raw[i]], v->byte_enc_len[raw[i]]);
        wlen += v->byte_enc_len[raw[i]];
    }
    if (v->ignore_merges) {
        int32_t id = tok__map_get(&v->token_map, s->word, wlen);
        if (tok__mergeable(v, id))
            return tok__ids_push(out, id);
    }
    int rc;
    s->heap.n = 0;
    for (size_t i = 1; i < len; i++)
        if ((rc = add_bigram(v, s, (int32_t)i - 1, (int32_t)i)))
            return rc;
    while (s->heap.n > 0) {
        tok__bigram b = tok__heap_pop(&s->heap);
        tok__sym *l = &s->sym[b.left], *r = &s->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: a side changed since the pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->sym[r->next].prev = b.left;
        if ((rc = add_bigram(v, s, l->prev, b.left)) || (rc = add_bigram(v, s, b.left, l->next)))
            return rc;
    }
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const char *t = s->word + s->sym[i].off;
        int32_t id = tok__map_get(&v->token_map, t, s->sym[i].n);
        if (tok__mergeable(v, id)) {
            if ((rc = tok__ids_push(out, id)))
                return rc;
            continue;
        }
        /* As llama.cpp: look each byte of the symbol's text up on its own, skip misses. */
        for (uint32_t k = 0; k < s->sym[i].n; k++) {
            id = tok__map_get(&v->token_map, t + k, 1);
            if (tok__mergeable(v, id) && (rc = tok__ids_push(out, id)))
                return rc;
        }
    }
    return 0;
}

/* Splits every piece in *in by re into *out: matches and the gaps between them. */
static int regex_split(const pcre2_code *re, pcre2_match_data *md, const char *subj,
                       const piece_vec *in, piece_vec *out)
{
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        const char *s = subj + in->v[p].off;
        size_t n = in->v[p].len, pos = 0, gap = 0;
        while (pos < n) {
            int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0)
                break; /* no more matches (or a match-limit error): the rest is one gap */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: none of our patterns make one, but never loop */
                pos = ms + tok__utf8_len((unsigned char)s[ms]);
                continue;
            }
            if (ms > gap && piece_push(out, in->v[p].off + gap, ms - gap))
                return KVS_ENOMEM;
            if (piece_push(out, in->v[p].off + ms, me - ms))
                return KVS_ENOMEM;
            pos = gap = me;
        }
        if (gap < n && piece_push(out, in->v[p].off + gap, n - gap))
            return KVS_ENOMEM;
    }
    return 0;
}

int tok__bpe_encode(const tok_vocab *v, const char *text, size_t len, tok__ids *out)
{
    if (len == 0)
        return 0;
    if (len > SIZE_MAX / 4)
        return KVS_ERANGE;
    /* orig: the text re-encoded from llama.cpp-decoded code points (what BPE sees);
     * subj: the same with surrogates also replaced, so PCRE2 gets valid UTF-8 of equal length. */
    unsigned char *orig = malloc(3 * len);
    unsigned char *subj = malloc(3 * len);
    piece_vec a = {0}, b = {0};
    bpe_scratch s = {0};
    pcre2_match_data *md = NULL;
    int rc = KVS_ENOMEM;
    if (!orig || !subj)
        goto out;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cpt = tok__utf8_next((const unsigned char *)text, len, &i);
        if (cpt > 0x10FFFF)
            cpt = 0xFFFD;
        size_t k = tok__utf8_put(cpt, orig + n);
        if (cpt >= 0xD800 && cpt <= 0xDFFF)
            tok__utf8_put(0xFFFD, subj + n); /* same 3-byte length */
        else
            memcpy(subj + n, orig + n, k);
        n += k;
    }
    if (piece_push(&a, 0, n))
        goto out;
    if (v->n_regex > 0) {
        md = pcre2_match_data_create(1, NULL);
        if (!md)
            goto out;
    }
    for (int r = 0; r < v->n_regex; r++) {
        if ((rc = regex_split(v->regex[r], md, (const char *)subj, &a, &b)))
            goto out;
        piece_vec t = a;
        a = b;
        b = t;
    }
    rc = 0;
    for (size_t p = 0; p < a.n && rc == 0; p++)
        rc = bpe_word(v, &s, orig + a.v[p].off, a.v[p].len, out);
out:
    pcre2_match_data_free(md);
    free(s.word);
    free(s.sym);
    free(s.heap.v);
    free(a.v);
    free(b.v);
    free(orig);
    free(subj);
    return rc;
}
