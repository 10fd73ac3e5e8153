/* Tokenizer front: builds a tok_vocab from GGUF metadata, splits special tokens out of the
 * text (llama.cpp's tokenizer_st_partition), dispatches fragments to the SPM or BPE encoder,
 * and decodes ids back to bytes. Every token's output piece is computed once at load, so
 * decoding is a table lookup. The vocab is immutable after tok_create_from_gguf. */
#include "engine/tok_internal.h"

#include "common/status.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_space[3] = {'\xE2', '\x96', '\x81'}; /* U+2581, SPM's space */

/* ---------------------------------------------------------------- loading */

static int fail(char *err, size_t err_len, int status, const char *msg, const char *key)
{
    if (err && err_len)
        snprintf(err, err_len, "%s%s%s", key ? key : "", key ? ": " : "", msg);
    return status;
}

/* Optional token id key: keeps *id when absent or out of range (llama.cpp ignores bad ids). */
static int read_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id)
{
    uint32_t u;
    int rc = gguf_get_u32(f, key, &u);
    if (rc == KVS_ENOKEY)
        return 0;
    if (rc == KVS_EKEYTYPE) {
        int64_t s;
        if (gguf_get_i64(f, key, &s) == 0)
            return 0; /* e.g. a negative "none" marker */
    }
    if (rc)
        return rc;
    if (u < (uint32_t)n_vocab)
        *id = (int32_t)u;
    return 0;
}

static int read_bool(const gguf_file *f, const char *key, bool *out)
{
    int b;
    int rc = gguf_get_bool(f, key, &b);
    if (rc == KVS_ENOKEY)
        return 0;
    if (rc)
        return rc;
    *out = b != 0;
    return 0;
}

static uint8_t flags_from_type(int32_t type)
{
    switch (type) {
    case TOK_TYPE_NORMAL: return TOK__NORMAL;
    case TOK_TYPE_UNKNOWN: return TOK__UNKNOWN;
    case TOK_TYPE_CONTROL: return TOK__CONTROL;
    case TOK_TYPE_USER_DEFINED: return TOK__USER_DEFINED;
    case TOK_TYPE_UNUSED: return TOK__UNUSED;
    case TOK_TYPE_BYTE: return TOK__BYTE;
    default: return 0; /* undefined: decodes to nothing, as in llama.cpp */
    }
}

static void add_eog(tok_vocab *v, int32_t id)
{
    if (id < 0 || v->n_eog == TOK_MAX_EOG)
        return;
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return;
    v->eog[v->n_eog++] = id;
}

static int32_t by_text(const tok_vocab *v, const char *s)
{
    return tok__map_get(&v->token_map, s, strlen(s));
}

/* gpt-oss's o200k_harmony vocabulary, as llama.cpp loads it: a generation ends at <|return|> or
 * <|call|>, while <|end|> only closes one message of several (analysis, then final), so it
 * leaves the end-of-generation set when both others are in it; it and the header markers are
 * written into the output text (user-defined, not control), where the channel splitter
 * (server/reasoning.h) reads them. */
static void fix_harmony(tok_vocab *v)
{
    static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        int32_t id = by_text(v, shown[i]);
        if (id >= 0)
            v->flags[id] = (uint8_t)((v->flags[id] & ~TOK__CONTROL) | TOK__USER_DEFINED);
    }
    int32_t ret = by_text(v, "<|return|>"), call = by_text(v, "<|call|>");
    int32_t end = by_text(v, "<|end|>");
    if (ret < 0 || call < 0 || end < 0 || !tok_is_eog(v, ret) || !tok_is_eog(v, call) ||
        !tok_is_eog(v, end))
        return;
    size_t k = 0;
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] != end)
            v->eog[k++] = v->eog[i];
    v->n_eog = k;
    v->flags[end] = (uint8_t)((v->flags[end] & ~TOK__CONTROL) | TOK__USER_DEFINED);
}

/* IBM Granite 3.x's vocabulary (known by its role markers): a call is written as <|tool_call|>
 * then a JSON list. Its tokenizer marks <|tool_call|> special, which llama.cpp's converter
 * stores as a control token, so it would print nothing and a call would lose its marker;
 * llama-server prints it as one of its granite format's "preserved tokens". Here it becomes
 * user-defined, so it prints wherever output is decoded (server/tool_calls.c reads it). So do
 * 3.3's <think>, </think>, <response>, </response> where a vocabulary has them as control
 * tokens (Granite 3.3's own has them as plain text), and Granite 4.0's call tags <tool_call>,
 * </tool_call> (its own vocabulary has them as plain text too; llama-server prints them as the
 * Hermes format's preserved tokens either way). Prompt side: the server tokenizes with
 * special tokens parsed, so user text holding "<|tool_call|>" became that token before and
 * still does; without parse_special (kvserve generate, tok_encode(..., false)) a user-defined
 * token is matched in text too, so there that text now becomes the one token instead of its
 * characters' pieces, as for gpt-oss's markers. */
static void fix_granite(tok_vocab *v)
{
    static const char *const shown[] = {"<|tool_call|>", "<think>",     "</think>",    "<response>",
                                        "</response>",   "<tool_call>", "</tool_call>"};
    if (by_text(v, "<|start_of_role|>") < 0 || by_text(v, "<|end_of_role|>") < 0)
        return;
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        int32_t id = by_text(v, shown[i]);
        if (id >= 0 && (v->flags[id] & TOK__CONTROL))
            v->flags[id] = (uint8_t)((v->flags[id] & ~TOK__CONTROL) | TOK__USER_DEFINED);
    }
}

/* Liquid AI's LFM2 and LFM2.5 vocabulary (known by its <|tool_list_start|> and
 * <|tool_call_start|> tokens): a call is written between <|tool_call_start|> and
 * <|tool_call_end|>, which it holds as control tokens, so they would print nothing; llama-server
 * prints them (and <think>, </think>) as its LFM2 format's preserved tokens. Here they become
 * user-defined, as fix_granite's, so server/tool_calls.c and the think splitter read them. */
static void fix_lfm2(tok_vocab *v)
{
    static const char *const shown[] = {"<|tool_call_start|>", "<|tool_call_end|>", "<think>",
                                        "</think>"};
    if (by_text(v, "<|tool_list_start|>") < 0 || by_text(v, "<|tool_call_start|>") < 0)
        return;
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        int32_t id = by_text(v, shown[i]);
        if (id >= 0 && (v->flags[id] & TOK__CONTROL))
            v->flags[id] = (uint8_t)((v->flags[id] & ~TOK__CONTROL) | TOK__USER_DEFINED);
    }
}

/* Mistral's tekken vocabulary (known by its [SYSTEM_PROMPT] and [TOOL_CALLS] tokens: Ministral 3,
 * Mistral Small 3.x, Magistral, Devstral): a call is written [TOOL_CALLS]name[ARGS]{...} and
 * a reasoning model's thoughts between [THINK] and [/THINK], control tokens that would print
 * nothing; llama-server prints them as its Mistral formats' preserved tokens. Here they become
 * user-defined, as fix_granite's, so server/tool_calls.c and the think splitter read them. */
static void fix_mistral(tok_vocab *v)
{
    static const char *const shown[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]",
                                        "[/THINK]"};
    if (by_text(v, "[SYSTEM_PROMPT]") < 0 || by_text(v, "[TOOL_CALLS]") < 0)
        return;
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
        int32_t id = by_text(v, shown[i]);
        if (id >= 0 && (v->flags[id] & TOK__CONTROL))
            v->flags[id] = (uint8_t)((v->flags[id] & ~TOK__CONTROL) | TOK__USER_DEFINED);
    }
}

/* The end-of-generation set, as llama.cpp's llama_vocab builds special_eog_ids: EOS, EOT, EOM
 * and the end-of-turn markers by text. */
static int find_eog(tok_vocab *v, const gguf_file *f)
{
    static const char *const names[] = {
        "<|eot_id|>",
        "<|eom_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>", /* gpt-oss (harmony): the answer is done */
        "<|call|>",   /* gpt-oss: a tool call is done */
        "<end_of_turn>",
        "<|endoftext|>",
        "<EOT>",
        "_<EOT>",
        /* DeepSeek's <｜end▁of▁sentence｜>, split so the \x escapes end where the text begins
         * (parenthesized: one element, not two) */
        ("<\xEF\xBD\x9C"
         "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),
    };
    int32_t eot = -1, eom = -1;
    int rc;
    if ((rc = read_id(f, "tokenizer.ggml.eot_token_id", v->n_vocab, &eot)) ||
        (rc = read_id(f, "tokenizer.ggml.eom_token_id", v->n_vocab, &eom)))
        return rc;
    v->n_eog = 0;
    add_eog(v, v->eos);
    add_eog(v, eot);
    add_eog(v, eom);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        add_eog(v, tok__map_get(&v->token_map, names[i], strlen(names[i])));
    fix_harmony(v);
    fix_granite(v);
    fix_lfm2(v);
    fix_mistral(v);
    return 0;
}

/* llama.cpp's load-time fix-ups by token text: end-of-turn markers that a converter stored as
 * plain tokens are forced to CONTROL, so they neither come out of text nor print. */
static void fix_control_by_name(tok_vocab *v)
{
    static const char *const names[] = {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "<|eom_id|>",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|fim_repo|>",
        "<|file_sep|>",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        "<fim_pad>",
        "<fim-prefix>",
        "<fim-suffix>",
        "<fim-middle>",
        "<fim-pad>",
        "<|repo_name|>",
        "<reponame>",
        /* DeepSeek's <｜end▁of▁sentence｜>, split so the \x escapes end where the text begins
         * (parenthesized: one element, not two) */
        ("<\xEF\xBD\x9C"
         "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),
        "<\xEF\xBD\x9C"
        "fim\xE2\x96\x81"
        "begin\xEF\xBD\x9C>",
        "<\xEF\xBD\x9C"
        "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
        "<\xEF\xBD\x9C"
        "fim\xE2\x96\x81"
        "end\xEF\xBD\x9C>",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = tok__map_get(&v->token_map, names[i], strlen(names[i]));
        if (id >= 0)
            v->flags[id] |= TOK__CONTROL;
    }
}

/* llama.cpp gives Phi-3's special tokens rstrip (they swallow the whitespace after them). */
static void fix_phi3(tok_vocab *v, const gguf_file *f)
{
    const char *name;
    size_t len;
    if (gguf_get_str(f, "general.name", &name, &len) != 0)
        return;
    char low[256];
    size_t n = len < sizeof low - 1 ? len : sizeof low - 1;
    for (size_t i = 0; i < n; i++)
        low[i] = (char)tolower((unsigned char)name[i]);
    low[n] = '\0';
    if (!strstr(low, "phi-3") && !strstr(low, "phi3"))
        return;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->flags[id] & (TOK__CONTROL | TOK__USER_DEFINED | TOK__UNKNOWN))
            v->flags[id] |= TOK__RSTRIP;
    int32_t id = tok__map_get(&v->token_map, "</s>", 4);
    if (id >= 0)
        v->flags[id] |= TOK__RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++) {
        id = tok__map_get(&v->token_map, keep[i], strlen(keep[i]));
        if (id >= 0)
            v->flags[id] &= (uint8_t)~TOK__RSTRIP;
    }
}

typedef struct special_key {
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1; /* longest first, as llama.cpp's cache_special_tokens */
    return (x->id > y->id) - (x->id < y->id);
}

static int build_specials(tok_vocab *v)
{
    size_t n = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->flags[id] & (TOK__CONTROL | TOK__USER_DEFINED | TOK__UNKNOWN))
            n++;
    v->special = malloc((n ? n : 1) * sizeof *v->special);
    if (!v->special)
        return KVS_ENOMEM;
    size_t bytes = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->flags[id] & (TOK__CONTROL | TOK__USER_DEFINED | TOK__UNKNOWN)) {
            v->special[v->n_special++] = id;
            bytes += v->text_len[id];
        }
    special_key *keys = malloc((v->n_special ? v->n_special : 1) * sizeof *keys);
    if (!keys)
        return KVS_ENOMEM;
    for (size_t k = 0; k < v->n_special; k++)
        keys[k] = (special_key){v->text_len[v->special[k]], v->special[k]};
    qsort(keys, v->n_special, sizeof *keys, cmp_special);
    for (size_t k = 0; k < v->n_special; k++)
        v->special[k] = keys[k].id;
    free(keys);

    /* Trie: root children through trie_root[], deeper levels through sibling lists. */
    for (int i = 0; i < 256; i++)
        v->trie_root[i] = -1;
    v->trie = malloc((bytes + 1) * sizeof *v->trie);
    if (!v->trie)
        return KVS_ENOMEM;
    v->n_trie = 0;
    for (size_t k = 0; k < v->n_special; k++) {
        int32_t id = v->special[k];
        const unsigned char *t = (const unsigned char *)tok__text(v, id);
        int32_t node = -1;
        for (uint32_t i = 0; i < v->text_len[id]; i++) {
            int32_t *link = node < 0 ? &v->trie_root[t[i]] : &v->trie[node].child;
            int32_t c = *link;
            while (c >= 0 && v->trie[c].byte != t[i])
                c = v->trie[c].sibling;
            if (c < 0) { /* new node goes to the head of its sibling list */
                c = (int32_t)v->n_trie++;
                v->trie[c] = (struct tok__trie_node){
                    .child = -1, .sibling = *link, .token = -1, .byte = t[i]};
                *link = c;
            }
            node = c;
        }
        if (node >= 0 && v->trie[node].token < 0)
            v->trie[node].token = id;
    }
    return 0;
}

/* Bytes token id stands for in output (llama.cpp's token_to_piece with special=false). */
static size_t make_piece(const tok_vocab *v, int32_t id, char *out, size_t cap)
{
    uint8_t fl = v->flags[id];
    const char *t = tok__text(v, id);
    size_t len = v->text_len[id];
    if (fl & (TOK__CONTROL | TOK__UNKNOWN | TOK__UNUSED))
        return 0;
    if (fl & TOK__USER_DEFINED) {
        if (out && len <= cap)
            memcpy(out, t, len);
        return len;
    }
    if (fl & TOK__BYTE) {
        unsigned int b;
        if (len == 6 && sscanf(t, "<0x%2X>", &b) == 1) {
            if (out && cap)
                out[0] = (char)b;
            return 1;
        }
        if (out && len <= cap)
            memcpy(out, t, len);
        return len;
    }
    if (!(fl & TOK__NORMAL))
        return 0;
    if (v->family == TOK_FAMILY_BPE)
        return tok__bpe_unmap(v, t, len, out, cap);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (i + 3 <= len && memcmp(t + i, k_space, 3) == 0) {
            if (n < cap)
                out[n] = ' ';
            n++;
            i += 2;
        } else {
            if (n < cap)
                out[n] = t[i];
            n++;
        }
    }
    return n;
}

static int build_pieces(tok_vocab *v)
{
    size_t total = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        total += make_piece(v, id, NULL, 0);
    v->piece_arena = malloc(total ? total : 1);
    v->piece_off = malloc((size_t)v->n_vocab * sizeof *v->piece_off);
    v->piece_len = malloc((size_t)v->n_vocab * sizeof *v->piece_len);
    if (!v->piece_arena || !v->piece_off || !v->piece_len)
        return KVS_ENOMEM;
    if (total > UINT32_MAX)
        return KVS_ERANGE;
    size_t off = 0;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        size_t n = make_piece(v, id, v->piece_arena + off, total - off);
        v->piece_off[id] = (uint32_t)off;
        v->piece_len[id] = (uint32_t)n;
        off += n;
    }
    return 0;
}

int tok_create_from_gguf(const gguf_file *f, tok_vocab **out, char *err, size_t err_len)
{
    char dummy[1];
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof dummy;
    }
    err[0] = '\0';
    *out = NULL;
    if (!f)
        return KVS_EINVAL;

    const char *model;
    size_t model_len;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, &model_len);
    if (rc)
        return fail(err, err_len, rc, rc == KVS_ENOKEY ? "missing" : "not a string",
                    "tokenizer.ggml.model");
    enum tok_family family;
    if (model_len == 5 && memcmp(model, "llama", 5) == 0)
        family = TOK_FAMILY_SPM;
    else if (model_len == 4 && memcmp(model, "gpt2", 4) == 0)
        family = TOK_FAMILY_BPE;
    else {
        snprintf(err, err_len, "unsupported tokenizer model '%.*s'",
                 (int)(model_len > 64 ? 64 : model_len), model);
        return KVS_EUNSUPPORTED;
    }

    int64_t tkv = gguf_find_key(f, "tokenizer.ggml.tokens");
    if (tkv < 0)
        return fail(err, err_len, KVS_ENOKEY, "missing", "tokenizer.ggml.tokens");
    enum gguf_type et;
    uint64_t count;
    const void *data;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &count, &data) != 0 || et != GGUF_TYPE_STRING)
        return fail(err, err_len, KVS_EKEYTYPE, "not a string array", "tokenizer.ggml.tokens");
    if (count == 0 || count > INT32_MAX / 2)
        return fail(err, err_len, KVS_ERANGE, "bad token count", "tokenizer.ggml.tokens");

    tok_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    v->family = family;
    v->n_vocab = (int32_t)count;
    size_t n = (size_t)count;
    v->text_off = malloc(n * sizeof *v->text_off);
    v->text_len = malloc(n * sizeof *v->text_len);
    v->score = calloc(n, sizeof *v->score);
    v->flags = malloc(n);
    rc = KVS_ENOMEM;
    if (!v->text_off || !v->text_len || !v->score || !v->flags)
        goto fail;

    /* Texts: an empty entry becomes "[EMPTY_i]" as in llama.cpp, so every id has a key. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if ((rc = gguf_arr_str(f, tkv, i, &s, &len)))
            goto fail;
        total += (len ? len : 32) + 1;
    }
    if (total > UINT32_MAX) {
        rc = KVS_ERANGE;
        goto fail;
    }
    v->text_arena = malloc(total);
    if (!v->text_arena || (rc = tok__map_init(&v->token_map, n)))
        goto fail;
    rc = KVS_ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        gguf_arr_str(f, tkv, i, &s, &len);
        if (len)
            memcpy(v->text_arena + off, s, len);
        else
            len = (size_t)snprintf(v->text_arena + off, 33, "[EMPTY_%zu]", i);
        v->text_arena[off + len] = '\0';
        v->text_off[i] = (uint32_t)off;
        v->text_len[i] = (uint32_t)len;
        if (len > v->max_token_len)
            v->max_token_len = len;
        if ((rc = tok__map_put(&v->token_map, v->text_arena + off, len, (int32_t)i)))
            goto fail;
        off += len + 1;
    }

    /* Scores (float or int) and types are optional; when present they cover every token. */
    if (gguf_find_key(f, "tokenizer.ggml.scores") >= 0) {
        if (gguf_get_arr(f, "tokenizer.ggml.scores", &et, &count, &data) != 0 || count < n ||
            (et != GGUF_TYPE_FLOAT32 && et != GGUF_TYPE_INT32)) {
            rc = fail(err, err_len, KVS_EKEYTYPE, "not a float array covering the vocab",
                      "tokenizer.ggml.scores");
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            if (et == GGUF_TYPE_FLOAT32) {
                memcpy(&v->score[i], (const char *)data + 4 * i, 4);
            } else {
                int32_t s;
                memcpy(&s, (const char *)data + 4 * i, 4);
                v->score[i] = (float)s;
            }
        }
    }
    memset(v->flags, TOK__NORMAL, n);
    if (gguf_find_key(f, "tokenizer.ggml.token_type") >= 0) {
        if (gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &count, &data) != 0 || count < n ||
            et != GGUF_TYPE_INT32) {
            rc = fail(err, err_len, KVS_EKEYTYPE, "not an int32 array covering the vocab",
                      "tokenizer.ggml.token_type");
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            int32_t t;
            memcpy(&t, (const char *)data + 4 * i, 4);
            v->flags[i] = flags_from_type(t);
        }
    }

    /* Family defaults (llama.cpp's), then the file's overrides. */
    if (family == TOK_FAMILY_SPM) {
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
    } else {
        v->bos = v->eos = v->unk = -1;
        v->add_bos = false;
        v->add_space_prefix = false;
        if ((rc = tok__bpe_init(v, f, err, err_len)))
            goto fail;
    }
    if (v->bos >= v->n_vocab)
        v->bos = -1;
    if (v->eos >= v->n_vocab)
        v->eos = -1;
    if (v->unk >= v->n_vocab)
        v->unk = -1;
    v->pad = -1;
    static const char *const bool_keys[] = {"tokenizer.ggml.add_bos_token",
                                            "tokenizer.ggml.add_space_prefix"};
    if ((rc = read_id(f, "tokenizer.ggml.bos_token_id", v->n_vocab, &v->bos)) ||
        (rc = read_id(f, "tokenizer.ggml.eos_token_id", v->n_vocab, &v->eos)) ||
        (rc = read_id(f, "tokenizer.ggml.unknown_token_id", v->n_vocab, &v->unk)) ||
        (rc = read_bool(f, bool_keys[0], &v->add_bos)) ||
        (rc = read_bool(f, bool_keys[1], &v->add_space_prefix))) {
        fail(err, err_len, rc, "bad value", "tokenizer.ggml special token keys");
        goto fail;
    }
    if (v->bos < 0)
        v->add_bos = false;
    /* read for embeddings (GET /v1/embeddings appends EOS to an input where the file says
     * so, as llama.cpp does) and reported; a key of the wrong type is no reason to refuse */
    if (read_bool(f, "tokenizer.ggml.add_eos_token", &v->add_eos) || v->eos < 0)
        v->add_eos = false;
    /* only reported (GET /tokenizer_info): a key of the wrong type is no reason to refuse */
    if (read_id(f, "tokenizer.ggml.padding_token_id", v->n_vocab, &v->pad))
        v->pad = -1;

    fix_control_by_name(v);
    fix_phi3(v, f);
    if ((rc = find_eog(v, f))) {
        fail(err, err_len, rc, "bad value", "tokenizer.ggml.eot_token_id / eom_token_id");
        goto fail;
    }

    /* Byte fallback: SPM's <0xXX> tokens (or the single byte itself), BPE's mapped byte. */
    for (int b = 0; b < 256; b++) {
        int32_t id;
        if (family == TOK_FAMILY_SPM) {
            char hex[7];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            id = tok__map_get(&v->token_map, hex, 6);
            if (id < 0) {
                char c = (char)b;
                id = tok__map_get(&v->token_map, &c, 1);
            }
        } else {
            id = tok__map_get(&v->token_map, (const char *)v->byte_enc[b], v->byte_enc_len[b]);
        }
        v->byte_token[b] = id;
    }

    if ((rc = build_specials(v)) || (rc = build_pieces(v)))
        goto fail;
    *out = v;
    return 0;
fail:
    if (!err[0])
        snprintf(err, err_len, "%s", status_str(rc));
    tok_destroy(v);
    return rc;
}

void tok_destroy(tok_vocab *v)
{
    if (!v)
        return;
    tok__bpe_free(v);
    tok__map_free(&v->token_map);
    free(v->text_arena);
    free(v->text_off);
    free(v->text_len);
    free(v->score);
    free(v->flags);
    free(v->piece_arena);
    free(v->piece_off);
    free(v->piece_len);
    free(v->special);
    free(v->trie);
    free(v);
}

/* ---------------------------------------------------------------- accessors */

enum tok_family tok_family(const tok_vocab *v)
{
    return v->family;
}
int32_t tok_n_vocab(const tok_vocab *v)
{
    return v->n_vocab;
}
int32_t tok_bos(const tok_vocab *v)
{
    return v->bos;
}
int32_t tok_eos(const tok_vocab *v)
{
    return v->eos;
}
int32_t tok_unk(const tok_vocab *v)
{
    return v->unk;
}
int32_t tok_pad(const tok_vocab *v)
{
    return v->pad;
}
size_t tok_eog_ids(const tok_vocab *v, const int32_t **ids)
{
    *ids = v->eog;
    return v->n_eog;
}

bool tok_is_eog(const tok_vocab *v, int32_t id)
{
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return true;
    return false;
}

bool tok_add_bos(const tok_vocab *v)
{
    return v->add_bos;
}
bool tok_add_eos(const tok_vocab *v)
{
    return v->add_eos;
}

bool tok_is_control(const tok_vocab *v, int32_t id)
{
    return id >= 0 && id < v->n_vocab && (v->flags[id] & TOK__CONTROL);
}

const char *tok_token_text(const tok_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_vocab)
        return "";
    return tok__text(v, id);
}

int32_t tok_find(const tok_vocab *v, const char *s, size_t len)
{
    return tok__map_get(&v->token_map, s, len);
}

/* ---------------------------------------------------------------- encoding */

typedef struct frag {
    int32_t token; /* -1: raw text [off, off+len) */
    size_t off, len;
} frag;

typedef struct frag_vec {
    frag *v;
    size_t n, cap;
} frag_vec;

static int frag_push(frag_vec *fv, int32_t token, size_t off, size_t len)
{
    if (fv->n == fv->cap) {
        size_t cap = fv->cap ? fv->cap * 2 : 16;
        frag *p = realloc(fv->v, cap * sizeof *p);
        if (!p)
            return KVS_ENOMEM;
        fv->v = p;
        fv->cap = cap;
    }
    fv->v[fv->n++] = (frag){token, off, len};
    return 0;
}

enum { RAW = 0, CLAIMED = 1, DROPPED = 2 };

typedef struct occ {
    int32_t token;
    size_t pos;
} occ;

static int cmp_occ(const void *a, const void *b)
{
    const occ *x = a, *y = b;
    if (x->token != y->token)
        return x->token < y->token ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_occ_pos(const void *a, const void *b)
{
    const occ *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static bool is_eligible(const tok_vocab *v, int32_t id, bool parse_special)
{
    /* User-defined tokens (added vocabulary such as NeoX's space runs) are split out even
     * without parse_special, as llama.cpp and HF tokenizers do; control ones only with it. */
    return parse_special || !(v->flags[id] & (TOK__CONTROL | TOK__UNKNOWN));
}

static bool ascii_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* llama.cpp's tokenizer_st_partition, restated: special tokens are taken longest first (ties
 * by id); each takes its leftmost non-overlapping occurrences that lie wholly in text no
 * earlier token took. Occurrences are found with the trie, one pass per token length, and
 * only from positions still raw, so normal text costs one failed trie step per byte. */
static int partition(const tok_vocab *v, const char *text, size_t len, bool parse_special,
                     frag_vec *fv)
{
    size_t n_elig = 0;
    for (size_t k = 0; k < v->n_special; k++)
        n_elig += is_eligible(v, v->special[k], parse_special);
    if (n_elig == 0 || len == 0)
        return len ? frag_push(fv, -1, 0, len) : 0;

    const unsigned char *t = (const unsigned char *)text;
    unsigned char *mark = calloc(len, 1);
    occ *cand = NULL, *taken = NULL;
    size_t n_taken = 0, cap_taken = 0, cap_cand = 0;
    int rc = KVS_ENOMEM;
    if (!mark)
        goto out;

    for (size_t k = 0; k < v->n_special;) {
        uint32_t L = v->text_len[v->special[k]];
        size_t k_end = k;
        while (k_end < v->n_special && v->text_len[v->special[k_end]] == L)
            k_end++;
        k = k_end;
        if (L == 0 || L > len)
            continue;
        /* Collect occurrences of this length from raw positions. */
        size_t n_cand = 0;
        for (size_t p = 0; p + L <= len; p++) {
            if (mark[p] != RAW)
                continue;
            int32_t node = v->trie_root[t[p]];
            uint32_t depth = 1;
            while (node >= 0 && depth < L) {
                if (mark[p + depth] != RAW)
                    break;
                int32_t c = v->trie[node].child;
                while (c >= 0 && v->trie[c].byte != t[p + depth])
                    c = v->trie[c].sibling;
                node = c;
                depth++;
            }
            if (node < 0 || depth != L)
                continue;
            int32_t id = v->trie[node].token;
            if (id < 0 || v->text_len[id] != L || !is_eligible(v, id, parse_special))
                continue;
            if (n_cand == cap_cand) {
                size_t cap = cap_cand ? cap_cand * 2 : 64;
                occ *q = realloc(cand, cap * sizeof *q);
                if (!q)
                    goto out;
                cand = q;
                cap_cand = cap;
            }
            cand[n_cand++] = (occ){id, p};
        }
        if (n_cand == 0)
            continue;
        qsort(cand, n_cand, sizeof *cand, cmp_occ); /* token by token, left to right */
        for (size_t c = 0; c < n_cand; c++) {
            size_t p = cand[c].pos;
            bool raw = true;
            for (uint32_t i = 0; i < L && raw; i++)
                raw = mark[p + i] == RAW;
            if (!raw)
                continue;
            memset(mark + p, CLAIMED, L);
            uint8_t fl = v->flags[cand[c].token];
            if (fl & TOK__LSTRIP)
                for (size_t i = p; i > 0 && mark[i - 1] == RAW && ascii_space(t[i - 1]); i--)
                    mark[i - 1] = DROPPED;
            if (fl & TOK__RSTRIP)
                for (size_t i = p + L; i < len && mark[i] == RAW && ascii_space(t[i]); i++)
                    mark[i] = DROPPED;
            if (n_taken == cap_taken) {
                size_t cap = cap_taken ? cap_taken * 2 : 64;
                occ *q = realloc(taken, cap * sizeof *q);
                if (!q)
                    goto out;
                taken = q;
                cap_taken = cap;
            }
            taken[n_taken++] = cand[c];
        }
    }

    /* Walk the text: raw runs become text fragments, taken occurrences become tokens. */
    if (n_taken > 1) /* qsort(NULL, 0) is undefined */
        qsort(taken, n_taken, sizeof *taken, cmp_occ_pos);
    size_t ti = 0;
    for (size_t p = 0; p < len;) {
        if (mark[p] == RAW) {
            size_t q = p;
            while (q < len && mark[q] == RAW)
                q++;
            if ((rc = frag_push(fv, -1, p, q - p)))
                goto out;
            p = q;
        } else if (mark[p] == DROPPED) {
            p++;
        } else {
            /* p starts a taken occurrence: occurrences never overlap, so they come in order */
            if (ti >= n_taken || taken[ti].pos != p) {
                p++; /* cannot happen; keeps a logic slip from reading out of bounds */
                continue;
            }
            if ((rc = frag_push(fv, taken[ti].token, p, v->text_len[taken[ti].token])))
                goto out;
            p += v->text_len[taken[ti].token];
            ti++;
        }
    }
    rc = 0;
out:
    free(mark);
    free(cand);
    free(taken);
    return rc;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_bos, bool parse_special,
               int32_t *ids, size_t cap, size_t *n_out)
{
    if (n_out)
        *n_out = 0;
    if (!v || (!text && len) || (!ids && cap) || !n_out)
        return KVS_EINVAL;
    tok__ids out = {0};
    frag_vec fv = {0};
    int rc = 0;
    if (add_bos && v->bos >= 0)
        rc = tok__ids_push(&out, v->bos);
    if (!rc)
        rc = partition(v, text, len, parse_special, &fv);
    /* SPM puts a space in front of the text and of any text that follows a special token. */
    bool prev_special = true;
    for (size_t i = 0; i < fv.n && !rc; i++) {
        const frag *fr = &fv.v[i];
        if (fr->token >= 0) {
            rc = tok__ids_push(&out, fr->token);
            prev_special = true;
        } else if (v->family == TOK_FAMILY_SPM) {
            rc = tok__spm_encode(v, text + fr->off, fr->len, v->add_space_prefix && prev_special,
                                 &out);
            prev_special = false;
        } else {
            rc = tok__bpe_encode(v, text + fr->off, fr->len, &out);
        }
    }
    if (!rc) {
        *n_out = out.n;
        if (out.n && cap)
            memcpy(ids, out.v, (out.n < cap ? out.n : cap) * sizeof *ids);
        if (out.n > cap)
            rc = KVS_ENOSPC;
    }
    free(out.v);
    free(fv.v);
    return rc;
}

/* ---------------------------------------------------------------- decoding */

int tok_token_to_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n_vocab)
        return KVS_ERANGE;
    size_t n = v->piece_len[id];
    if (buf && cap)
        memcpy(buf, v->piece_arena + v->piece_off[id], n < cap ? n : cap);
    return (int)n;
}

int tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, unsigned flags, char *out,
               size_t cap, size_t *n_out)
{
    size_t total = 0;
    bool strip =
        (flags & TOK_DECODE_STRIP_SPACE) && v->family == TOK_FAMILY_SPM && v->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_vocab)
            return KVS_ERANGE;
        const char *p = v->piece_arena + v->piece_off[ids[i]];
        size_t len = v->piece_len[ids[i]];
        if ((flags & TOK_DECODE_SPECIAL) && (v->flags[ids[i]] & TOK__CONTROL)) {
            p = tok__text(v, ids[i]);
            len = v->text_len[ids[i]];
        }
        /* The prefix space goes only where it begins the text: after a BOS that writes "<s>"
         * it stays ("<s> Hello", as Hugging Face decodes it); a BOS that writes nothing leaves
         * it first. */
        if (strip && len > 0) {
            strip = false;
            if (total == 0 && p[0] == ' ') {
                p++;
                len--;
            }
        }
        if (total < cap)
            memcpy(out + total, p, len < cap - total ? len : cap - total);
        total += len;
    }
    if (n_out)
        *n_out = total;
    if (total < cap)
        out[total] = '\0';
    return total < cap ? 0 : KVS_ENOSPC;
}

void tok_decoder_init(tok_decoder *d)
{
    memset(d, 0, sizeof *d);
}

/* Byte k of the concatenation a[0..na) b[0..nb). */
static inline unsigned char at2(const unsigned char *a, size_t na, const unsigned char *b, size_t k)
{
    return k < na ? a[k] : b[k - na];
}

/* Classifies the UTF-8 sequence starting at byte i of the concatenation (total n bytes):
 * returns its length if it is a complete, valid character; 0 if it is a valid but unfinished
 * prefix running to the end; or -k for an invalid maximal subpart of k bytes (Unicode's
 * "maximal subpart" rule: one U+FFFD per such run). */
static int utf8_class(const unsigned char *a, size_t na, const unsigned char *b, size_t n, size_t i)
{
    unsigned char c = at2(a, na, b, i);
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if (i + (size_t)k >= n)
            return 0;
        unsigned char x = at2(a, na, b, i + (size_t)k);
        if (x < lo || x > hi)
            return -k;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* Runs the decoder over pending + piece. With out == NULL only counts; otherwise writes (the
 * caller checked the count against cap) and updates the pending bytes. */
static size_t decoder_run(tok_decoder *d, const unsigned char *piece, size_t len, char *out)
{
    size_t np = (size_t)d->n_pending, n = np + len, w = 0, i = 0;
    unsigned char keep[4];
    size_t n_keep = 0;
    while (i < n) {
        int r = utf8_class(d->pending, np, piece, n, i);
        if (r > 0) {
            for (int k = 0; k < r; k++, w++)
                if (out)
                    out[w] = (char)at2(d->pending, np, piece, i + (size_t)k);
            i += (size_t)r;
        } else if (r == 0) {
            for (; i < n; i++)
                keep[n_keep++] = at2(d->pending, np, piece, i);
        } else {
            if (out)
                memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i += (size_t)-r;
        }
    }
    if (out) {
        memcpy(d->pending, keep, n_keep);
        d->n_pending = (int)n_keep;
    }
    return w;
}

int tok_decoder_push(const tok_vocab *v, tok_decoder *d, int32_t id, char *out, size_t cap)
{
    if (id < 0 || id >= v->n_vocab)
        return KVS_ERANGE;
    const unsigned char *p = (const unsigned char *)v->piece_arena + v->piece_off[id];
    size_t len = v->piece_len[id];
    size_t need = decoder_run(d, p, len, NULL);
    if (need > cap || need > INT32_MAX)
        return KVS_ENOSPC; /* state untouched: the caller may retry with more room */
    return (int)decoder_run(d, p, len, out);
}

int tok_decoder_flush(tok_decoder *d, char *out, size_t cap)
{
    if (d->n_pending == 0)
        return 0;
    if (cap < 3)
        return KVS_ENOSPC;
    memcpy(out, "\xEF\xBF\xBD", 3);
    d->n_pending = 0;
    return 3;
}
