/* Tokenizer: llama.cpp's test vectors for every vocab in ../shared/models/vocab (encode without
 * BOS must give the recorded ids; decoding them must give the text back), stories260K's
 * reference prompts, special-token handling, streaming decode and robustness. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* needs the four headers above first */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "engine/tokenizer.h"
#include "test_util.h"

static const char *const k_vocabs[] = {
    "llama-spm",      "phi-3",        "gpt-2",  "starcoder", "refact",
    "deepseek-coder", "deepseek-llm", "falcon", "mpt",
};

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

/* Loads models_dir/rel; NULL (and a SKIP line) if the file is absent. */
static tok_vocab *load_vocab(const char *rel)
{
    char path[1024];
    if (!test_model_path(path, sizeof path, rel))
        return NULL;
    gguf_file *f = NULL;
    char err[256] = "";
    int rc = gguf_open(path, &f, err, sizeof err);
    if (rc)
        fail_msg("gguf_open %s: %s", path, err);
    tok_vocab *v = NULL;
    rc = tok_create_from_gguf(f, &v, err, sizeof err);
    gguf_close(f); /* the vocab must not depend on the file staying open */
    if (rc)
        fail_msg("tok_create_from_gguf %s: %s (%s)", path, status_str(rc), err);
    return v;
}

static tok_vocab *load_named(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    return load_vocab(rel);
}

/* Encodes into a fresh array (caller frees); checks the ENOSPC/retry contract on the way. */
static int32_t *encode(const tok_vocab *v, const char *s, size_t len, bool bos, bool special,
                       size_t *n)
{
    size_t need = 0;
    int rc = tok_encode(v, s, len, bos, special, NULL, 0, &need);
    assert_true(rc == 0 || rc == KVS_ENOSPC);
    assert_int_equal(rc == 0, need == 0);
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(tok_encode(v, s, len, bos, special, ids, need, n), 0);
    assert_int_equal(*n, need);
    return ids;
}

static char *decode(const tok_vocab *v, const int32_t *ids, size_t n, bool strip, size_t *len)
{
    size_t need = 0;
    char one[1];
    int rc = tok_decode(v, ids, n, strip ? TOK_DECODE_STRIP_SPACE : 0, one, 1, &need);
    assert_true(rc == 0 || rc == KVS_ENOSPC);
    char *out = malloc(need + 1);
    assert_non_null(out);
    assert_int_equal(tok_decode(v, ids, n, strip ? TOK_DECODE_STRIP_SPACE : 0, out, need + 1, len),
                     0);
    assert_int_equal(*len, need);
    assert_int_equal(out[need], '\0');
    return out;
}

/* One vocab against its .inp/.out pair, split exactly as llama.cpp's test-tokenizer-0 does:
 * texts separated by "\n__ggml_vocab_test__\n", one line of ids per text. */
static void run_vocab_file(const char *name, int *n_tests, int *enc_ok, int *dec_ok)
{
    *n_tests = *enc_ok = *dec_ok = 0;
    tok_vocab *v = load_named(name);
    if (!v)
        return;
    char path[1024];
    size_t ilen, olen;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.inp", test_models_dir(), name);
    char *inp = read_file(path, &ilen);
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.out", test_models_dir(), name);
    char *outf = read_file(path, &olen);
    if (!inp || !outf) {
        fprintf(stderr, "SKIP: %s has no .inp/.out\n", name);
        free(inp);
        free(outf);
        tok_destroy(v);
        return;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    size_t pos = 0;
    char *line = outf;
    while (pos < ilen) {
        const char *next = strstr(inp + pos, sep);
        size_t tlen = next ? (size_t)(next - (inp + pos)) : ilen - pos;
        const char *text = inp + pos;
        pos = next ? (size_t)(next - inp) + sep_len : ilen;

        assert_non_null(line);
        char *eol = strchr(line, '\n');
        if (eol)
            *eol = '\0';
        int32_t want[4096];
        size_t n_want = 0;
        for (char *p = line, *end; n_want < 4096; p = end) {
            long x = strtol(p, &end, 10);
            if (end == p)
                break;
            want[n_want++] = (int32_t)x;
        }
        line = eol ? eol + 1 : NULL;

        size_t n = 0;
        int32_t *got = encode(v, text, tlen, false, false, &n);
        (*n_tests)++;
        bool same = n == n_want && memcmp(got, want, n * sizeof *got) == 0;
        if (same) {
            (*enc_ok)++;
        } else {
            fprintf(stderr, "%s: text %d '%.*s'\n  want:", name, *n_tests, (int)tlen, text);
            for (size_t i = 0; i < n_want; i++)
                fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got: ");
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        size_t dlen;
        char *dec = decode(v, want, n_want, true, &dlen);
        if (dlen == tlen && memcmp(dec, text, tlen) == 0)
            (*dec_ok)++;
        else
            fprintf(stderr, "%s: decode of text %d gave '%s'\n", name, *n_tests, dec);
        free(dec);
        free(got);
    }
    free(inp);
    free(outf);
    tok_destroy(v);
}

static void test_vocab_vectors(void **state)
{
    (void)state;
    int failures = 0, ran = 0;
    for (size_t i = 0; i < sizeof k_vocabs / sizeof k_vocabs[0]; i++) {
        int n, enc, dec;
        run_vocab_file(k_vocabs[i], &n, &enc, &dec);
        if (n == 0)
            continue;
        ran++;
        fprintf(stderr, "vocab %-15s encode %d/%d  decode round-trip %d/%d\n", k_vocabs[i], enc, n,
                dec, n);
        failures += (n - enc) + (n - dec);
    }
    if (ran == 0)
        skip();
    assert_int_equal(failures, 0);
}

/* Pulls "prompt" strings and "prompt_ids" arrays out of the reference JSON, in order. */
static void test_stories_prompts(void **state)
{
    (void)state;
    char path[1024];
    if (!test_model_path(path, sizeof path, "reference/stories260K-greedy.json"))
        skip();
    tok_vocab *v = load_vocab("stories260K.gguf");
    if (!v)
        skip();
    assert_int_equal(tok_family(v), TOK_FAMILY_SPM);
    assert_int_equal(tok_n_vocab(v), 512);
    assert_int_equal(tok_bos(v), 1);
    assert_int_equal(tok_eos(v), 2);
    assert_true(tok_add_bos(v));
    size_t jlen;
    char *json = read_file(path, &jlen);
    assert_non_null(json);
    int cases = 0;
    for (char *p = json; (p = strstr(p, "\"prompt\": \"")) != NULL;) {
        p += strlen("\"prompt\": \"");
        char prompt[1024];
        size_t plen = 0;
        for (; *p && *p != '"' && plen < sizeof prompt - 1; p++) {
            if (*p == '\\') {
                p++;
                prompt[plen++] = *p == 'n' ? '\n' : *p;
            } else {
                prompt[plen++] = *p;
            }
        }
        char *ids_at = strstr(p, "\"prompt_ids\": [");
        assert_non_null(ids_at);
        ids_at += strlen("\"prompt_ids\": [");
        int32_t want[256];
        size_t n_want = 0;
        for (char *end; *ids_at != ']' && n_want < 256; ids_at = end) {
            want[n_want++] = (int32_t)strtol(ids_at, &end, 10);
            while (*end == ',' || *end == ' ')
                end++;
        }
        size_t n;
        int32_t *got = encode(v, prompt, plen, true, false, &n);
        assert_int_equal(n, n_want);
        assert_memory_equal(got, want, n * sizeof *got);
        size_t dlen;
        char *dec = decode(v, got, n, true, &dlen);
        assert_int_equal(dlen, plen);
        assert_memory_equal(dec, prompt, plen);
        free(dec);
        free(got);
        cases++;
    }
    assert_int_equal(cases, 4);

    /* The first case spelled out, as the brief states it. */
    size_t n;
    int32_t *ids = encode(v, "Once upon a time", 16, true, false, &n);
    const int32_t once[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, once, sizeof once);
    free(ids);
    free(json);
    tok_destroy(v);
}

static void test_pieces_and_lookup(void **state)
{
    (void)state;
    tok_vocab *v = load_vocab("stories260K.gguf");
    if (!v)
        skip();
    char buf[64];
    assert_int_equal(tok_token_to_piece(v, 1, buf, sizeof buf), 0); /* BOS prints nothing */
    assert_true(tok_is_control(v, 1));
    assert_false(tok_is_control(v, 403));
    int32_t nl = tok_find(v, "<0x0A>", 6);
    assert_true(nl >= 0);
    assert_int_equal(tok_token_to_piece(v, nl, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');
    /* A "▁word" token prints with a real space. */
    const char *t = tok_token_text(v, 403);
    assert_memory_equal(t, "\xE2\x96\x81", 3);
    int n = tok_token_to_piece(v, 403, buf, sizeof buf);
    assert_true(n > 1);
    assert_int_equal(buf[0], ' ');
    assert_memory_equal(buf + 1, t + 3, (size_t)n - 1);
    assert_int_equal(tok_find(v, t, strlen(t)), 403);
    assert_int_equal(tok_find(v, "no such token", 13), -1);
    assert_true(tok_token_to_piece(v, 512, buf, sizeof buf) < 0);
    assert_true(tok_token_to_piece(v, -1, buf, sizeof buf) < 0);
    /* Too small a buffer: the full length comes back, only cap bytes are written. */
    buf[1] = 'X';
    assert_int_equal(tok_token_to_piece(v, 403, buf, 1), n);
    assert_int_equal(buf[1], 'X');
    tok_destroy(v);

    v = load_named("gpt-2");
    if (!v)
        skip();
    int32_t id = tok_find(v, "\xC4\xA0the", 5); /* "Ġthe" */
    assert_true(id >= 0);
    assert_int_equal(tok_token_to_piece(v, id, buf, sizeof buf), 4);
    assert_memory_equal(buf, " the", 4);
    tok_destroy(v);
}

/* GPT-2's vocabulary with tokenizer.ggml.pre set to pre and no add_bos_token key (so the
 * pre-tokenizer's own BOS default shows): *rc the load's status, the vocab or NULL. */
static tok_vocab *gpt2_as(const char *pre, int *rc)
{
    char path[1024];
    if (!test_model_path(path, sizeof path, "vocab/ggml-vocab-gpt-2.gguf"))
        return NULL;
    gguf_file *f = NULL;
    char err[256] = "";
    assert_int_equal(gguf_open(path, &f, err, sizeof err), 0);
    gguf_writer *w = NULL;
    assert_int_equal(gguf_writer_create(&w), 0);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        size_t len;
        const char *key = gguf_key_name(f, i, &len);
        if (strncmp(key, "tokenizer.ggml.pre", len) &&
            strncmp(key, "tokenizer.ggml.add_bos_token", len))
            assert_int_equal(gguf_writer_copy_kv(w, f, i), 0);
    }
    assert_int_equal(gguf_writer_add_str(w, "tokenizer.ggml.pre", pre), 0);
    void *buf = NULL;
    size_t size = 0;
    assert_int_equal(gguf_writer_write_mem(w, &buf, &size), 0);
    gguf_writer_destroy(w);
    gguf_close(f);
    assert_int_equal(gguf_open_memory(buf, size, &f, err, sizeof err), 0);
    tok_vocab *v = NULL;
    *rc = tok_create_from_gguf(f, &v, err, sizeof err);
    gguf_close(f);
    free(buf);
    return v;
}

/* tokenizer.ggml.pre "lfm2" (Liquid AI's LFM2 and LFM2.5) is llama.cpp's llama3 row under
 * another name: Llama 3's splits (digits in threes, case-blind contractions), whole words taken
 * before merges, BOS added; an unknown name is refused, so the row is what loads it. */
static void test_pre_aliases(void **state)
{
    (void)state;
    int rc;
    tok_vocab *llama = gpt2_as("llama-bpe", &rc);
    if (!llama)
        skip();
    tok_vocab *lfm2 = gpt2_as("lfm2", &rc);
    assert_int_equal(rc, 0);
    assert_true(tok_add_bos(lfm2));
    assert_true(tok_add_bos(llama));
    static const char *const texts[] = {"1234567 I'M you'll", " Hello  world\n\n x",
                                        "caf\xC3\xA9!!"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t na, nb;
        int32_t *a = encode(llama, texts[i], strlen(texts[i]), true, false, &na);
        int32_t *b = encode(lfm2, texts[i], strlen(texts[i]), true, false, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        free(a);
        free(b);
    }
    tok_destroy(llama);
    tok_destroy(lfm2);
    assert_null(gpt2_as("lfm3", &rc));
    assert_int_equal(rc, KVS_EUNSUPPORTED);

    /* "tekken" (Mistral's) loads, adds BOS and takes digits one by one (peer_tokenizer's
     * gpt-2+tekken row holds its ids to llama-server's) */
    tok_vocab *tekken = gpt2_as("tekken", &rc);
    assert_int_equal(rc, 0);
    assert_true(tok_add_bos(tekken));
    size_t n;
    int32_t *ids = encode(tekken, "1234567", 7, false, false, &n);
    assert_int_equal(n, 7);
    free(ids);
    tok_destroy(tekken);
}

static void test_control_tokens(void **state)
{
    (void)state;
    tok_vocab *v = load_named("llama-spm");
    if (!v)
        skip();
    size_t n;
    int32_t *ids = encode(v, "<s>hi</s>", 9, false, false, &n);
    for (size_t i = 0; i < n; i++)
        assert_false(tok_is_control(v, ids[i]));
    size_t dlen;
    char *dec = decode(v, ids, n, true, &dlen);
    assert_string_equal(dec, "<s>hi</s>");
    free(dec);
    free(ids);
    ids = encode(v, "<s>hi</s>", 9, false, true, &n);
    assert_true(n >= 3);
    assert_int_equal(ids[0], tok_bos(v));
    assert_int_equal(ids[n - 1], tok_eos(v));
    /* TOK_DECODE_SPECIAL writes them (/detokenize, as Hugging Face and llama.cpp), and the
     * prefix space the text after BOS got stays where it no longer begins the text */
    char buf[64];
    size_t got;
    assert_int_equal(
        tok_decode(v, ids, n, TOK_DECODE_STRIP_SPACE | TOK_DECODE_SPECIAL, buf, sizeof buf, &got),
        0);
    assert_string_equal(buf, "<s> hi</s>");
    assert_int_equal(tok_decode(v, ids, n, TOK_DECODE_STRIP_SPACE, buf, sizeof buf, &got), 0);
    assert_string_equal(buf, "hi");
    assert_int_equal(tok_decode(v, ids + 1, n - 1, TOK_DECODE_STRIP_SPACE | TOK_DECODE_SPECIAL, buf,
                                sizeof buf, &got),
                     0);
    assert_string_equal(buf, "hi</s>");
    free(ids);
    tok_destroy(v);

    v = load_named("gpt-2");
    if (!v)
        skip();
    const char *s = "a<|endoftext|>b";
    ids = encode(v, s, strlen(s), false, false, &n);
    int32_t eot = tok_find(v, "<|endoftext|>", 13);
    assert_true(eot >= 0 && tok_is_control(v, eot));
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], eot);
    free(ids);
    ids = encode(v, s, strlen(s), false, true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], eot);
    assert_int_equal(tok_decode(v, ids, n, TOK_DECODE_SPECIAL, buf, sizeof buf, &got), 0);
    assert_string_equal(buf, s);
    assert_int_equal(tok_decode(v, ids, n, 0, buf, sizeof buf, &got), 0);
    assert_string_equal(buf, "ab");
    free(ids);
    tok_destroy(v);
}

/* End of generation: EOS, plus every end-of-turn marker the vocabulary has (phi-3: <|end|> and
 * <|endoftext|>), and nothing else (not <|user|>, not BOS); Llama 2's has EOS alone. */
static void test_eog_tokens(void **state)
{
    (void)state;
    tok_vocab *v = load_named("phi-3");
    if (!v)
        skip();
    const int32_t *ids;
    size_t n = tok_eog_ids(v, &ids);
    int32_t end = tok_find(v, "<|end|>", 7), eot = tok_find(v, "<|endoftext|>", 13);
    int32_t user = tok_find(v, "<|user|>", 8);
    assert_true(end >= 0 && eot >= 0 && user >= 0);
    assert_true(n >= 2 && ids[0] == tok_eos(v));
    assert_true(tok_is_eog(v, end));
    assert_true(tok_is_eog(v, eot));
    assert_true(tok_is_eog(v, tok_eos(v)));
    assert_false(tok_is_eog(v, user));
    assert_false(tok_is_eog(v, tok_bos(v)));
    assert_int_equal(n, 2 + (tok_eos(v) != end && tok_eos(v) != eot));
    tok_destroy(v);

    v = load_named("llama-spm");
    if (!v)
        skip();
    assert_int_equal(tok_eog_ids(v, &ids), 1);
    assert_int_equal(ids[0], tok_eos(v));
    assert_false(tok_is_eog(v, tok_bos(v)));
    assert_false(tok_is_eog(v, -1));
    tok_destroy(v);
}

static void test_user_defined_and_rstrip(void **state)
{
    (void)state;
    /* mpt: its runs of spaces are user-defined tokens, split out even from plain text. */
    tok_vocab *v = load_named("mpt");
    if (!v)
        skip();
    int32_t two = tok_find(v, "  ", 2);
    assert_true(two >= 0 && !tok_is_control(v, two));
    size_t n;
    int32_t *ids = encode(v, "a  b", 4, false, false, &n);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found |= ids[i] == two;
    assert_true(found);
    free(ids);
    tok_destroy(v);

    /* phi-3: llama.cpp gives its special tokens rstrip, so "\n" after <|user|> is dropped. */
    v = load_named("phi-3");
    if (!v)
        skip();
    int32_t user = tok_find(v, "<|user|>", 8);
    assert_true(user >= 0 && tok_is_control(v, user));
    int32_t *a = encode(v, "<|user|>\nHi", 11, false, true, &n);
    size_t nb;
    int32_t *b = encode(v, "Hi", 2, false, false, &nb);
    assert_int_equal(n, nb + 1);
    assert_int_equal(a[0], user);
    assert_memory_equal(a + 1, b, nb * sizeof *b);
    free(a);
    free(b);
    tok_destroy(v);
}

static void test_incremental_decoder(void **state)
{
    (void)state;
    tok_vocab *v = load_vocab("stories260K.gguf");
    if (!v)
        skip();
    /* "é" and "🦙" are not in this 512-token vocab: they become byte tokens. */
    const char *text = "caf\xC3\xA9 \xF0\x9F\xA6\x99!";
    size_t n;
    int32_t *ids = encode(v, text, strlen(text), false, false, &n);
    tok_decoder d;
    tok_decoder_init(&d);
    char acc[256];
    size_t alen = 0;
    int split_seen = 0;
    for (size_t i = 0; i < n; i++) {
        char piece[64];
        int pl = tok_token_to_piece(v, ids[i], piece, sizeof piece);
        assert_true(pl >= 0);
        int w = tok_decoder_push(v, &d, ids[i], acc + alen, 64 + 3 * (size_t)pl);
        assert_true(w >= 0);
        if (d.n_pending > 0)
            split_seen++;
        /* Whatever came out so far is whole UTF-8: no emitted byte starts a partial char. */
        alen += (size_t)w;
    }
    assert_true(split_seen >= 2); /* both multi-byte characters were held back at least once */
    assert_int_equal(tok_decoder_flush(&d, acc + alen, 16), 0);
    acc[alen] = '\0';
    assert_string_equal(acc, " caf\xC3\xA9 \xF0\x9F\xA6\x99!");
    free(ids);

    /* A lead byte followed by plain text: U+FFFD, then the text; flush of a dangling lead. */
    int32_t c3 = tok_find(v, "<0xC3>", 6), a = tok_find(v, "a", 1);
    assert_true(c3 >= 0 && a >= 0);
    tok_decoder_init(&d);
    char out[64];
    assert_int_equal(tok_decoder_push(v, &d, c3, out, sizeof out), 0);
    assert_int_equal(tok_decoder_push(v, &d, a, out, sizeof out), 4);
    assert_memory_equal(out,
                        "\xEF\xBF\xBD"
                        "a",
                        4);
    assert_int_equal(tok_decoder_push(v, &d, c3, out, sizeof out), 0);
    assert_int_equal(tok_decoder_push(v, &d, c3, out, 2), KVS_ENOSPC); /* state kept */
    assert_int_equal(tok_decoder_push(v, &d, c3, out, sizeof out), 3);
    assert_int_equal(tok_decoder_flush(&d, out, sizeof out), 3);
    assert_memory_equal(out, "\xEF\xBF\xBD", 3);
    assert_int_equal(tok_decoder_flush(&d, out, sizeof out), 0);
    tok_destroy(v);
}

static void test_invalid_utf8_and_enospc(void **state)
{
    (void)state;
    static const char junk[] = "ok \xC3 \xE2\x82 \xF0\x9F\xA6 \x80\xBF \xFF\xFE \xED\xA0\x80"
                               " \xC0\x80 \xF4\x90\x80\x80 end\xE2";
    size_t jl = sizeof junk - 1;
    int ran = 0;
    for (size_t k = 0; k < sizeof k_vocabs / sizeof k_vocabs[0]; k++) {
        tok_vocab *v = load_named(k_vocabs[k]);
        if (!v)
            continue;
        ran++;
        size_t n;
        int32_t *ids = encode(v, junk, jl, true, true, &n);
        assert_true(n > 0);
        for (size_t i = 0; i < n; i++)
            assert_true(ids[i] >= 0 && ids[i] < tok_n_vocab(v));
        size_t dlen;
        char *dec = decode(v, ids, n, true, &dlen);
        if (tok_family(v) == TOK_FAMILY_SPM) /* byte fallback keeps every byte */
            assert_memory_equal(dec, junk, jl);
        free(dec);
        /* Short buffer: ENOSPC, the first cap ids, and the full count. */
        if (n > 2) {
            int32_t two[2];
            size_t total = 0;
            assert_int_equal(tok_encode(v, junk, jl, true, true, two, 2, &total), KVS_ENOSPC);
            assert_int_equal(total, n);
            assert_memory_equal(two, ids, sizeof two);
        }
        char small[4];
        size_t need = 0;
        assert_int_equal(tok_decode(v, ids, n, 0, small, sizeof small, &need), KVS_ENOSPC);
        assert_true(need >= sizeof small);
        free(ids);
        /* Random bytes (fixed seed): every result is a valid id; SPM keeps every byte. */
        uint32_t seed = 12345u;
        for (int round = 0; round < 200; round++) {
            char buf[96];
            size_t bl = (size_t)(round % 96);
            for (size_t i = 0; i < bl; i++) {
                seed = seed * 1664525u + 1013904223u;
                /* bias towards UTF-8 lead/continuation bytes, spaces and '<' */
                static const char pool[] = {' ',    '<',    '|',    'a',    '\n',   '\xC3',
                                            '\xE2', '\xF0', '\x80', '\xBF', '\xFF', '1'};
                buf[i] = (seed >> 28) < 12 ? pool[(seed >> 28)] : (char)(seed >> 16);
            }
            int32_t *r = encode(v, buf, bl, false, (round & 1) != 0, &n);
            for (size_t i = 0; i < n; i++)
                assert_true(r[i] >= 0 && r[i] < tok_n_vocab(v));
            if (tok_family(v) == TOK_FAMILY_SPM && (round & 1) == 0) {
                char *d = decode(v, r, n, true, &dlen);
                assert_int_equal(dlen, bl);
                assert_memory_equal(d, buf, bl);
                free(d);
            }
            free(r);
        }
        /* Empty input: nothing, or just BOS. */
        ids = encode(v, "", 0, true, false, &n);
        assert_int_equal(n, tok_bos(v) >= 0 ? 1u : 0u);
        free(ids);
        tok_destroy(v);
    }
    if (!ran)
        skip();
}

/* ~1 MB of mixed text per family; llama.cpp-style linked symbols + heap keep this fast. */
static void test_speed_1mb(void **state)
{
    (void)state;
    static const char *const names[] = {"llama-spm", "gpt-2", "deepseek-llm", "falcon"};
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf.inp", test_models_dir());
    size_t ilen;
    char *inp = read_file(path, &ilen);
    if (!inp) {
        fprintf(stderr, "SKIP: %s not found\n", path);
        skip();
    }
    size_t cap = 1u << 20;
    char *big = malloc(cap);
    assert_non_null(big);
    for (size_t i = 0; i < cap; i++)
        big[i] = inp[i % ilen];
    int ran = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        tok_vocab *v = load_named(names[k]);
        if (!v)
            continue;
        ran++;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        size_t n;
        int32_t *ids = encode(v, big, cap, false, false, &n);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "1 MB with %-12s: %zu tokens in %.3f s (two passes: size, then ids)\n",
                names[k], n, s);
        /* Generous bound: sanitizer builds and a shared 2-core machine are much slower. */
        assert_true(s < 20.0);
        free(ids);
        tok_destroy(v);
    }
    free(big);
    free(inp);
    if (!ran)
        skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_vectors),       cmocka_unit_test(test_stories_prompts),
        cmocka_unit_test(test_pieces_and_lookup),   cmocka_unit_test(test_control_tokens),
        cmocka_unit_test(test_eog_tokens),          cmocka_unit_test(test_user_defined_and_rstrip),
        cmocka_unit_test(test_incremental_decoder), cmocka_unit_test(test_invalid_utf8_and_enospc),
        cmocka_unit_test(test_speed_1mb),           cmocka_unit_test(test_pre_aliases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
