/* SentencePiece-style encoder (llama.cpp's llm_tokenizer_spm): spaces become U+2581, the text
 * is cut into UTF-8 characters, and adjacent symbols are merged best-score-first while the
 * merged text is a vocab token; leftovers fall back to <0xXX> byte tokens.
 * Invariant of the merge loop: a symbol's text starts at a fixed offset and only grows by
 * absorbing its right neighbour, so (n_left + n_right == size) identifies a still-valid pair. */
#include "engine/tok_internal.h"

#include "common/status.h"

#include <stdlib.h>
#include <string.h>

static const char k_space[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */

typedef struct spm_state {
    const tok_vocab *v;
    const char *text;
    tok__sym *sym;
    tok__heap heap;
} spm_state;

static int try_add_bigram(spm_state *st, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    size_t n = (size_t)st->sym[left].n + st->sym[right].n;
    if (n > st->v->max_token_len)
        return 0;
    int32_t id = tok__map_get(&st->v->token_map, st->text + st->sym[left].off, n);
    /* Byte tokens only serve the fallback, as in SentencePiece itself. */
    if (!tok__mergeable(st->v, id) || (st->v->flags[id] & TOK__BYTE))
        return 0;
    tok__bigram b = {.key = -(double)st->v->score[id], .left = left, .right = right,
                     .size = (uint32_t)n};
    return tok__heap_push(&st->heap, b);
}

static int emit_symbol(const tok_vocab *v, const char *s, size_t n, tok__ids *out)
{
    int32_t id = tok__map_get(&v->token_map, s, n);
    if (tok__mergeable(v, id) && !(v->flags[id] & TOK__BYTE))
        return tok__ids_push(out, id);
    /* Not a token (only single characters can get here: merges always form tokens). */
    for (size_t i = 0; i < n; i++) {
        int32_t b = v->byte_token[(unsigned char)s[i]];
        if (b < 0)
            b = v->unk;
        if (b < 0)
            continue;
        int rc = tok__ids_push(out, b);
        if (rc)
            return rc;
    }
    return 0;
}

int tok__spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                    tok__ids *out)
{
    /* Escaped copy: every ' ' becomes 3 bytes. */
    size_t n_spaces = space_prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++)
        n_spaces += text[i] == ' ';
    size_t elen = len + (space_prefix ? 1 : 0) + 2 * n_spaces;
    if (elen == 0)
        return 0;
    if (elen > UINT32_MAX)
        return KVS_ERANGE;
    char *esc = malloc(elen);
    tok__sym *sym = malloc(elen * sizeof *sym);
    int rc = KVS_ENOMEM;
    spm_state st = {.v = v, .text = esc, .sym = sym};
    if (!esc || !sym)
        goto out;
    size_t k = 0;
    if (space_prefix) {
        memcpy(esc, k_space, 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + k, k_space, 3);
            k += 3;
        } else {
            esc[k++] = text[i];
        }
    }

    int32_t n_sym = 0;
    for (size_t off = 0; off < elen;) {
        /* A character is what its lead byte announces, but a malformed sequence is cut to
         * its lead byte alone (llama.cpp would swallow the next bytes into it, turning a
         * following space into raw U+2581 bytes). Valid text is split exactly as there. */
        size_t n = tok__utf8_len((unsigned char)esc[off]);
        if (n > elen - off)
            n = 1;
        for (size_t k = 1; k < n; k++)
            if (((unsigned char)esc[off + k] & 0xC0) != 0x80)
                n = 1;
        sym[n_sym] = (tok__sym){.prev = n_sym - 1, .next = off + n == elen ? -1 : n_sym + 1,
                                .off = (uint32_t)off, .n = (uint32_t)n};
        off += n;
        n_sym++;
    }
    for (int32_t i = 1; i < n_sym; i++) {
        rc = try_add_bigram(&st, i - 1, i);
        if (rc)
            goto out;
    }
    while (st.heap.n > 0) {
        tok__bigram b = tok__heap_pop(&st.heap);
        tok__sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: one side was merged since this pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = b.left;
        rc = try_add_bigram(&st, l->prev, b.left);
        if (!rc)
            rc = try_add_bigram(&st, b.left, l->next);
        if (rc)
            goto out;
    }
    rc = 0;
    for (int32_t i = 0; i != -1 && rc == 0; i = sym[i].next)
        rc = emit_symbol(v, esc + sym[i].off, sym[i].n, out);
out:
    free(st.heap.v);
    free(sym);
    free(esc);
    return rc;
}
