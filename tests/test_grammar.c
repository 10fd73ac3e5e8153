/* Grammar: the automaton accepts exactly valid JSON byte by byte (a corpus of valid and invalid
 * documents), schema-constrained random walks on the real llama-spm vocabulary give documents
 * that cJSON parses and a validator written here accepts, masks equal a slow reference (every
 * token simulated alone) on many random states, clones are independent, unsupported schemas
 * are refused with the keyword's path; and the oracles are shown to catch a broken mask. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* needs the four headers above first */

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "engine/gguf.h"
#include "engine/grammar.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "server/json_schema.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static grammar_def *def_any(const grammar_options *o)
{
    grammar_builder *b;
    assert_int_equal(grammar_builder_create(&b), 0);
    int32_t any;
    assert_int_equal(grammar_builder_any(b, &any), 0);
    grammar_def *d = NULL;
    char err[128];
    assert_int_equal(grammar_builder_finish(b, any, o, &d, err, sizeof err), 0);
    grammar_builder_destroy(b);
    return d;
}

static grammar_def *def_schema(const char *text)
{
    cJSON *s = cJSON_Parse(text);
    assert_non_null(s);
    grammar_def *d = NULL;
    char err[256] = "";
    int rc = srv_json_schema_compile(s, NULL, &d, err, sizeof err);
    if (rc)
        fail_msg("compile %s: %s (%s)", text, status_str(rc), err);
    cJSON_Delete(s);
    return d;
}

/* Whether the whole text is accepted and complete; also checks that a refusal leaves the
 * state as it was (the byte after the refused one is judged from the same state). */
static bool accepts(const grammar_def *d, const char *text, size_t len)
{
    grammar *g;
    assert_int_equal(grammar_create(d, &g), 0);
    bool ok = true;
    for (size_t i = 0; i < len && ok; i++)
        ok = grammar_accept_bytes(g, text + i, 1);
    ok = ok && grammar_is_complete(g);
    grammar_destroy(g);
    /* all at once must agree with byte by byte */
    assert_int_equal(grammar_create(d, &g), 0);
    bool ok2 = grammar_accept_bytes(g, text, len) && grammar_is_complete(g);
    grammar_destroy(g);
    assert_int_equal(ok, ok2);
    return ok;
}

static bool accepts_s(const grammar_def *d, const char *text)
{
    return accepts(d, text, strlen(text));
}

static tok_vocab *load_named(const char *name)
{
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    if (!test_model_path(path, sizeof path, rel))
        return NULL;
    gguf_file *f = NULL;
    char err[256] = "";
    if (gguf_open(path, &f, err, sizeof err))
        fail_msg("gguf_open %s: %s", path, err);
    tok_vocab *v = NULL;
    int rc = tok_create_from_gguf(f, &v, err, sizeof err);
    gguf_close(f);
    if (rc)
        fail_msg("tok_create_from_gguf: %s", err);
    return v;
}

static tok_vocab *load_spm(void)
{
    return load_named("llama-spm");
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool bit(const uint32_t *m, int32_t i)
{
    return m[i >> 5] >> (i & 31) & 1;
}

/* The slow reference: each token simulated on its own copy. Returns the number of tokens on
 * which mask disagrees (0: equal). */
static int mask_mismatches(const grammar *g, const grammar_vocab *gv, const uint32_t *mask,
                           int32_t *first_bad)
{
    int bad = 0;
    int32_t n = grammar_vocab_n_tokens(gv);
    for (int32_t t = 0; t < n; t++) {
        grammar *c;
        assert_int_equal(grammar_clone(g, &c), 0);
        bool ok = grammar_accept_token(c, gv, t);
        grammar_destroy(c);
        if (ok != bit(mask, t)) {
            if (!bad && first_bad)
                *first_bad = t;
            bad++;
        }
    }
    return bad;
}

/* ---- a validator for the supported subset ------------------------------------------------ */

static const cJSON *resolve(const cJSON *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    const char *p = strchr(ref, '/');
    const cJSON *cur = root;
    while (p) {
        const char *e = strchr(p + 1, '/');
        char seg[128];
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1);
        memcpy(seg, p + 1, n);
        seg[n] = 0;
        cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
        if (!cur)
            return NULL;
        p = e;
    }
    return cur;
}

static bool has_type(const cJSON *v, const char *t)
{
    if (!strcmp(t, "object"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(v);
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "null"))
        return cJSON_IsNull(v);
    return false;
}

/* Whether v satisfies schema s (document root for $ref), object keys in schema order too. */
static bool valid(const cJSON *v, const cJSON *s, const cJSON *root)
{
    if (cJSON_IsTrue(s))
        return true;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        return valid(v, resolve(root, k->valuestring), root);
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        const cJSON *a;
        cJSON_ArrayForEach(a, k) if (valid(v, a, root)) return true;
        return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")))
        return cJSON_Compare(v, k, true);
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        const cJSON *a;
        cJSON_ArrayForEach(a, k) if (cJSON_Compare(v, a, true)) return true;
        return false;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (type) {
        bool ok = false;
        if (cJSON_IsString(type)) {
            ok = has_type(v, type->valuestring);
        } else {
            const cJSON *t;
            cJSON_ArrayForEach(t, type) ok = ok || has_type(v, t->valuestring);
        }
        if (!ok)
            return false;
    }
    if (cJSON_IsObject(v) &&
        (!type || cJSON_GetObjectItemCaseSensitive(s, "properties") || has_type(v, "object"))) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        if (!props && !type && !cJSON_GetObjectItemCaseSensitive(s, "items"))
            return true; /* {}: anything */
        const cJSON *r;
        if (req)
            cJSON_ArrayForEach(
                r, req) if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return false;
        const cJSON *p = props ? props->child : NULL, *m;
        cJSON_ArrayForEach(m, v)
        {
            while (p && strcmp(p->string, m->string))
                p = p->next; /* keys only move forward through the schema's order */
            if (!p || !valid(m, p, root))
                return false;
            p = p->next;
        }
    }
    if (cJSON_IsArray(v)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        const cJSON *m;
        if (items)
            cJSON_ArrayForEach(m, v) if (!valid(m, items, root)) return false;
    }
    return true;
}

/* ---- the automaton against a corpus ------------------------------------------------------ */

static const char *const k_valid[] = {
    "{}",
    "[]",
    "0",
    "-0",
    "1e5",
    "1.5E-3",
    "-12.5e+10",
    "123",
    "0.0",
    "true",
    "false",
    "null",
    "\"\"",
    "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"",
    "\"\\u0041\\u00e9\\uD83D\\uDE00\"",
    "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
    "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"e\"}}",
    " {\"a\" : [ 1 , 2 ] }",
    "\n{\n  \"k\": \"v\",\n\t\"l\":\t[\n    1\n  ]\n}",
    "[[[[[[[[[[]]]]]]]]]]",
    "[{\"a\":[{\"b\":[]}]}]",
    "{\"\":\"\"}",
    "[1,-1,0.5,-0.5e-5,1E+2]",
    "\"\x7f\"",
};

static const char *const k_invalid[] = {
    "",
    "{",
    "{,}",
    "{\"a\":1,}",
    "[1,]",
    "[,1]",
    "01",
    "-",
    "-01",
    "1.",
    ".5",
    "1e",
    "1e+",
    "+1",
    "tru",
    "nul",
    "True",
    "\"abc",
    "\"\\x\"",
    "\"\\u12\"",
    "\"\\uDE00\"",          /* lone low surrogate */
    "\"\\uD83D\"",          /* high surrogate not followed by a low one */
    "\"\\uD83D\\u0041\"",   /* high surrogate followed by a non-low one */
    "\"a\nb\"",             /* raw control character */
    "\"\xc3\"",             /* truncated UTF-8 */
    "\"\xc0\x80\"",         /* overlong */
    "\"\xed\xa0\x80\"",     /* an encoded surrogate */
    "\"\xf4\x90\x80\x80\"", /* above U+10FFFF */
    "\"\x80\"",
    "{\"a\" 1}",
    "{\"a\":}",
    "{1:2}",
    "{} ", /* nothing after the value, not even whitespace */
    "{}{}",
    "[1 2]",
    "[1,,2]",
    "'a'",
};

static void test_json_corpus(void **state)
{
    (void)state;
    grammar_def *d = def_any(NULL);
    for (size_t i = 0; i < sizeof k_valid / sizeof *k_valid; i++) {
        if (!accepts_s(d, k_valid[i]))
            fail_msg("valid document refused: %s", k_valid[i]);
        cJSON *j = cJSON_Parse(k_valid[i]); /* the corpus itself is right */
        assert_non_null(j);
        cJSON_Delete(j);
    }
    for (size_t i = 0; i < sizeof k_invalid / sizeof *k_invalid; i++)
        if (accepts_s(d, k_invalid[i]))
            fail_msg("invalid document accepted: %s", k_invalid[i]);
    /* NUL inside a string */
    assert_false(accepts(d, "\"a\0\"", 4));
    grammar_def_destroy(d);
}

/* An independent strict JSON checker (RFC 8259 plus what the automaton documents: valid
 * UTF-8, paired surrogate escapes, nothing after the value) as the oracle for mutations. */
typedef struct jp {
    const unsigned char *p, *end;
    int depth;
} jp;

/* The documented whitespace: "" | " " | "\t" | "\n" [ \t]{0,max_ws}. */
static int g_max_ws = 65535;

static void jp_ws(jp *j)
{
    if (j->p < j->end && (*j->p == ' ' || *j->p == '\t')) {
        j->p++;
    } else if (j->p < j->end && *j->p == '\n') {
        j->p++;
        for (int k = 0; k < g_max_ws && j->p < j->end && (*j->p == ' ' || *j->p == '\t'); k++)
            j->p++;
    }
}

static bool jp_lit(jp *j, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n))
        return false;
    j->p += n;
    return true;
}

static int jp_hex4(jp *j)
{
    int v = 0;
    for (int i = 0; i < 4; i++, j->p++) {
        if (j->p >= j->end)
            return -1;
        int c = *j->p, h = c >= '0' && c <= '9'   ? c - '0'
                           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                  : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

static bool jp_string(jp *j)
{
    j->p++; /* the quote */
    while (j->p < j->end) {
        unsigned c = *j->p++;
        if (c == '"')
            return true;
        if (c < 0x20)
            return false;
        if (c == '\\') {
            if (j->p >= j->end)
                return false;
            c = *j->p++;
            if (c == 'u') {
                int v = jp_hex4(j);
                if (v < 0 || (v >= 0xDC00 && v <= 0xDFFF))
                    return false;
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (!jp_lit(j, "\\u"))
                        return false;
                    int w = jp_hex4(j);
                    if (w < 0xDC00 || w > 0xDFFF)
                        return false;
                }
            } else if (!strchr("\"\\/bfnrt", (int)c) || c == 0) {
                return false;
            }
            continue;
        }
        if (c < 0x80)
            continue;
        /* UTF-8: decode and check the code point's range */
        int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
        if (n < 0 || c > 0xF4)
            return false;
        unsigned cp = c & (0x3F >> n);
        for (int i = 0; i < n; i++) {
            if (j->p >= j->end || (*j->p & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (*j->p++ & 0x3F);
        }
        static const unsigned min_cp[] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
    }
    return false;
}

/* 1..max digits (the grammar's bounds per number part, GRAMMAR_MAX_*_DIGITS). */
static bool jp_digits(jp *j, long max)
{
    const unsigned char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > s && j->p - s <= max;
}

/* One value at j->p (no whitespace before it: every gap is read once, by the caller). */
static bool jp_value(jp *j)
{
    if (j->p >= j->end)
        return false;
    unsigned c = *j->p;
    if (c == '{' || c == '[') {
        if (++j->depth > 1000)
            return false;
        unsigned close = c == '{' ? '}' : ']';
        j->p++;
        jp_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return true;
        }
        for (;;) {
            if (c == '{') {
                if (j->p >= j->end || *j->p != '"' || !jp_string(j))
                    return false;
                jp_ws(j);
                if (j->p >= j->end || *j->p++ != ':')
                    return false;
                jp_ws(j);
            }
            if (!jp_value(j))
                return false;
            jp_ws(j);
            if (j->p >= j->end)
                return false;
            if (*j->p == ',') {
                j->p++;
                jp_ws(j);
                continue;
            }
            if (*j->p++ != close)
                return false;
            j->depth--;
            return true;
        }
    }
    if (c == '"')
        return jp_string(j);
    if (c == 't')
        return jp_lit(j, "true");
    if (c == 'f')
        return jp_lit(j, "false");
    if (c == 'n')
        return jp_lit(j, "null");
    if (c == '-')
        j->p++;
    if (j->p < j->end && *j->p == '0')
        j->p++;
    else if (!jp_digits(j, GRAMMAR_MAX_INT_DIGITS))
        return false;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!jp_digits(j, GRAMMAR_MAX_FRAC_DIGITS))
            return false;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (!jp_digits(j, GRAMMAR_MAX_EXP_DIGITS))
            return false;
    }
    return true;
}

static bool strict_json(const char *s, size_t len)
{
    jp j = {(const unsigned char *)s, (const unsigned char *)s + len, 0};
    jp_ws(&j);
    return jp_value(&j) && j.p == j.end; /* nothing after the value, not even whitespace */
}

/* Random edits of the corpus: the automaton and the independent checker must agree on every
 * one (bounds lifted so that only JSON itself decides). */
static void test_json_mutations(void **state)
{
    (void)state;
    grammar_options o = {.max_ws = 5, .max_depth = 1024};
    g_max_ws = 5;
    grammar_def *d = def_any(&o);
    static const char alphabet[] = "{}[],:\"\\0123456789-+.eEtrufalsn \t\nu\x01\xc3\xa9\xed\xa0"
                                   "\x80\xbf\xf0\x9f\xf4\x90"
                                   "DdCc";
    uint64_t rng = 42;
    int n_valid = 0, n_total = 0;
    size_t n_docs = sizeof k_valid / sizeof *k_valid + sizeof k_invalid / sizeof *k_invalid;
    for (size_t di = 0; di < n_docs; di++) {
        const char *base = di < sizeof k_valid / sizeof *k_valid
                               ? k_valid[di]
                               : k_invalid[di - sizeof k_valid / sizeof *k_valid];
        assert_int_equal(strict_json(base, strlen(base)), di < sizeof k_valid / sizeof *k_valid);
        for (int m = 0; m < 400; m++) {
            char buf[256];
            size_t len = strlen(base);
            memcpy(buf, base, len);
            int edits = 1 + (int)(rng_next(&rng) % 3);
            for (int e = 0; e < edits; e++) {
                size_t pos = len ? rng_next(&rng) % (len + 1) : 0;
                char ch = alphabet[rng_next(&rng) % (sizeof alphabet - 1)];
                switch (rng_next(&rng) % 3) {
                case 0: /* insert */
                    if (len + 1 < sizeof buf) {
                        memmove(buf + pos + 1, buf + pos, len - pos);
                        buf[pos] = ch;
                        len++;
                    }
                    break;
                case 1: /* delete */
                    if (pos < len) {
                        memmove(buf + pos, buf + pos + 1, len - pos - 1);
                        len--;
                    }
                    break;
                default: /* replace */
                    if (pos < len)
                        buf[pos] = ch;
                }
            }
            bool want = strict_json(buf, len), got = accepts(d, buf, len);
            if (want != got)
                fail_msg("automaton %s, checker %s: \"%.*s\" (from \"%s\")",
                         got ? "accepts" : "refuses", want ? "accepts" : "refuses", (int)len, buf,
                         base);
            n_valid += want;
            n_total++;
        }
    }
    fprintf(stderr, "mutations: %d of %d valid\n", n_valid, n_total);
    assert_true(n_valid > n_total / 20); /* the edits must not all be trivially invalid */
    grammar_def_destroy(d);
}

static void test_json_object_front_end(void **state)
{
    (void)state;
    grammar_def *d;
    assert_int_equal(grammar_def_json_object(NULL, &d), 0);
    assert_true(accepts_s(d, "{\"a\":[1,{\"b\":null}],\"a\":\"dup keys are JSON\"}"));
    assert_false(accepts_s(d, "[]"));
    assert_false(accepts_s(d, "\"s\""));
    assert_false(accepts_s(d, "1"));
    grammar *g;
    assert_int_equal(grammar_create(d, &g), 0);
    assert_false(grammar_is_complete(g));
    assert_true(grammar_accept_bytes(g, "{\"x\":12", 7));
    assert_false(grammar_is_complete(g));
    assert_true(grammar_accept_bytes(g, "}", 1));
    assert_true(grammar_is_complete(g));
    assert_true(grammar_is_finished(g));
    grammar_destroy(g);
    grammar_def_destroy(d);
}

static void test_bounds(void **state)
{
    (void)state;
    grammar_options o = grammar_default_options();
    o.max_ws = 4;
    o.max_depth = 3;
    grammar_def *d = def_any(&o);
    assert_true(accepts_s(d, "\n    [\n    1\n\t\t\t\t]"));
    assert_false(accepts_s(d, "\n     [1]"));
    assert_false(accepts_s(d, "[1\n     ]"));
    assert_true(accepts_s(d, "[ 1,\t2 ]"));
    assert_true(accepts_s(d, "\"     many spaces in a string are text     \""));
    assert_true(accepts_s(d, "[[[1]]]"));
    assert_false(accepts_s(d, "[[[[1]]]]"));
    assert_true(accepts_s(d, "[[{\"a\":\"b\"}]]"));
    /* at the depth bound a container value is refused at its first byte, so no dead end */
    grammar *g;
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_accept_bytes(g, "[[[", 3));
    assert_false(grammar_accept_bytes(g, "[", 1));
    assert_false(grammar_accept_bytes(g, "{", 1));
    assert_true(grammar_accept_bytes(g, "1]]]", 4));
    assert_true(grammar_is_finished(g));
    grammar_destroy(g);
    grammar_def_destroy(d);
    /* a root number is complete but may go on: not finished */
    d = def_any(NULL);
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_accept_bytes(g, "12", 2));
    assert_true(grammar_is_complete(g));
    assert_false(grammar_is_finished(g));
    assert_false(grammar_accept_bytes(g, "3x", 2)); /* all or nothing */
    assert_true(grammar_is_complete(g));
    assert_true(grammar_accept_bytes(g, "3", 1));
    grammar_destroy(g);
    grammar_def_destroy(d);
    /* digit bounds: every number allowed is a finite double */
    d = def_any(NULL);
    assert_true(accepts_s(d, "[1234567890123456,-0.1234567890123456e-99,9.5E+12]"));
    assert_false(accepts_s(d, "[12345678901234567]"));
    assert_false(accepts_s(d, "[0.12345678901234567]"));
    assert_false(accepts_s(d, "[1e100]"));
    assert_false(accepts_s(d, "[1e-308]"));
    grammar_def_destroy(d);
}

/* ---- schemas ------------------------------------------------------------------------------ */

static void test_schema_objects(void **state)
{
    (void)state;
    grammar_def *d = def_schema("{\"type\":\"object\",\"properties\":{"
                                "\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                                "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],"
                                "\"additionalProperties\":false}");
    assert_true(accepts_s(d, "{\"b\":\"x\"}"));
    assert_true(accepts_s(d, "{\"a\":1,\"b\":\"x\"}"));
    assert_true(accepts_s(d, "{\"a\":-3, \"b\":\"x\",\n \"c\":true}"));
    assert_true(accepts_s(d, "{\"b\":\"x\",\"c\":false}"));
    assert_false(accepts_s(d, "{}"));
    assert_false(accepts_s(d, "{\"a\":1}"));
    assert_false(accepts_s(d, "{\"b\":\"x\",\"a\":1}")); /* order */
    assert_false(accepts_s(d, "{\"a\":1.5,\"b\":\"x\"}"));
    assert_false(accepts_s(d, "{\"b\":\"x\",\"d\":1}"));
    assert_false(accepts_s(d, "{\"b\":\"x\",}"));
    assert_false(accepts_s(d, "{\"b\":1}"));
    assert_false(accepts_s(d, "{\"a\":1e5,\"b\":\"x\"}"));
    grammar_def_destroy(d);
    /* names that are prefixes of one another, and names that need escaping */
    d = def_schema("{\"properties\":{\"a\":{\"type\":\"null\"},\"ab\":{\"type\":\"null\"},"
                   "\"q\\\"\\n\":{\"type\":\"null\"}}}");
    assert_true(accepts_s(d, "{\"a\":null}"));
    assert_true(accepts_s(d, "{\"ab\":null}"));
    assert_true(accepts_s(d, "{\"a\":null,\"ab\":null}"));
    assert_true(accepts_s(d, "{\"q\\\"\\n\":null}"));
    assert_false(accepts_s(d, "{\"abc\":null}"));
    assert_false(accepts_s(d, "{\"ab\":null,\"a\":null}"));
    assert_true(accepts_s(d, "{}"));
    grammar_def_destroy(d);
}

/* Raw text before a value (grammar_builder_prefixed): the text exactly, then the value with no
 * gap; alternatives whose texts share a prefix fork and die apart; no whitespace before a
 * prefixed root; and masks equal the slow reference through the text and across its end. */
static void test_prefixed(void **state)
{
    (void)state;
    grammar_builder *b;
    assert_int_equal(grammar_builder_create(&b), 0);
    int32_t num, str, alt[2], root;
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_string(b, &str), 0);
    assert_int_equal(grammar_builder_prefixed(b, "x <|m|>", 7, num, &alt[0]), 0);
    assert_int_equal(grammar_builder_prefixed(b, "xy <|m|>", 8, str, &alt[1]), 0);
    assert_int_equal(grammar_builder_prefixed(b, "", 0, str, &root), KVS_EINVAL);
    assert_int_equal(grammar_builder_any_of(b, 2, alt, &root), 0);
    grammar_def *d = NULL;
    char err[128];
    assert_int_equal(grammar_builder_finish(b, root, NULL, &d, err, sizeof err), 0);
    grammar_builder_destroy(b);
    assert_true(accepts_s(d, "x <|m|>12"));
    assert_true(accepts_s(d, "xy <|m|>\"s\""));
    assert_false(accepts_s(d, "x <|m|>\"s\""));
    assert_false(accepts_s(d, "xy <|m|>12"));
    assert_false(accepts_s(d, " x <|m|>12"));
    assert_false(accepts_s(d, "x <|m|> 12"));
    assert_false(accepts_s(d, "x<|m|>12"));
    assert_false(accepts_s(d, "x <|m|>"));
    assert_false(accepts_s(d, "12"));
    tok_vocab *v = load_spm();
    if (v) {
        grammar_vocab *gv;
        assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
        uint32_t *m = malloc(grammar_mask_words(grammar_vocab_n_tokens(gv)) * sizeof *m);
        static const char *const at[] = {"", "x", "x <|", "xy <|m|>", "x <|m|>", "x <|m|>1"};
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
            grammar *g;
            assert_int_equal(grammar_create(d, &g), 0);
            assert_true(grammar_accept_bytes(g, at[i], strlen(at[i])));
            assert_true(grammar_mask(g, gv, m) > 0);
            int32_t bad = -1;
            if (mask_mismatches(g, gv, m, &bad))
                fail_msg("after \"%s\": token %d", at[i], (int)bad);
            grammar_destroy(g);
        }
        free(m);
        grammar_vocab_destroy(gv);
        tok_destroy(v);
    }
    grammar_def_destroy(d);
}

/* Masks equal the slow reference after each of the texts at[] (which d must accept). */
static void check_masks(const grammar_def *d, tok_vocab *v, const char *const *at, size_t n_at)
{
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    uint32_t *m = malloc(grammar_mask_words(grammar_vocab_n_tokens(gv)) * sizeof *m);
    for (size_t i = 0; i < n_at; i++) {
        grammar *g;
        assert_int_equal(grammar_create(d, &g), 0);
        if (!grammar_accept_bytes(g, at[i], strlen(at[i])))
            fail_msg("\"%s\" refused", at[i]);
        assert_true(grammar_mask(g, gv, m) > 0);
        int32_t bad = -1;
        if (mask_mismatches(g, gv, m, &bad))
            fail_msg("after \"%s\": token %d", at[i], (int)bad);
        grammar_destroy(g);
    }
    free(m);
    grammar_vocab_destroy(gv);
}

/* Arrays with item bounds (grammar_builder_array_bounded): the counts allowed and no others,
 * whitespace in the gaps as in any array; a least count makes an item's nesting part of the
 * array's (refused at build past max_depth, and at '[' where it cannot fit, so no dead end);
 * masks equal the slow reference at each count. */
static void test_array_bounds(void **state)
{
    (void)state;
    grammar_builder *b;
    assert_int_equal(grammar_builder_create(&b), 0);
    int32_t num, one, more, two3, bad;
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_array_bounded(b, num, 1, 1, &one), 0);
    assert_int_equal(grammar_builder_array_bounded(b, num, 1, 0, &more), 0);
    assert_int_equal(grammar_builder_array_bounded(b, num, 2, 3, &two3), 0);
    assert_int_equal(grammar_builder_array_bounded(b, num, 2, 1, &bad), KVS_EINVAL);
    assert_int_equal(grammar_builder_array_bounded(b, num, 0, 70000, &bad), KVS_EINVAL);
    grammar_def *d1, *dm, *d23;
    char err[128];
    assert_int_equal(grammar_builder_finish(b, one, NULL, &d1, err, sizeof err), 0);
    assert_int_equal(grammar_builder_finish(b, more, NULL, &dm, err, sizeof err), 0);
    assert_int_equal(grammar_builder_finish(b, two3, NULL, &d23, err, sizeof err), 0);
    grammar_builder_destroy(b);
    assert_true(accepts_s(d1, "[1]"));
    assert_true(accepts_s(d1, "[ 1 ]"));
    assert_false(accepts_s(d1, "[]"));
    assert_false(accepts_s(d1, "[1,2]"));
    assert_true(accepts_s(dm, "[1]"));
    assert_true(accepts_s(dm, "[1, 2,\n 3]"));
    assert_false(accepts_s(dm, "[]"));
    assert_false(accepts_s(d23, "[1]"));
    assert_true(accepts_s(d23, "[1,2]"));
    assert_true(accepts_s(d23, "[1,2,3]"));
    assert_false(accepts_s(d23, "[1,2,3,4]"));
    grammar *g;
    assert_int_equal(grammar_create(d1, &g), 0);
    assert_true(grammar_accept_bytes(g, "[1", 2));
    assert_false(grammar_accept_bytes(g, ",", 1)); /* refused where it comes, not at ']' */
    grammar_destroy(g);
    tok_vocab *v = load_spm();
    if (v) {
        static const char *const at1[] = {"[", "[1", "[12 "};
        static const char *const at23[] = {"[", "[1", "[1,", "[1, 2", "[1,2,3"};
        check_masks(d1, v, at1, 3);
        check_masks(d23, v, at23, 5);
        tok_destroy(v);
    }
    grammar_def_destroy(d1);
    grammar_def_destroy(dm);
    grammar_def_destroy(d23);

    /* nesting: [[[1]]] with each level needing an item takes 3 levels */
    grammar_options o = grammar_default_options();
    o.max_depth = 2;
    assert_int_equal(grammar_builder_create(&b), 0);
    int32_t a1, a2, a3, loose;
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_array_bounded(b, num, 1, 0, &a1), 0);
    assert_int_equal(grammar_builder_array_bounded(b, a1, 1, 0, &a2), 0);
    assert_int_equal(grammar_builder_array_bounded(b, a2, 1, 0, &a3), 0);
    assert_int_equal(grammar_builder_array(b, a2, &loose), 0);
    grammar_def *d = NULL;
    assert_int_equal(grammar_builder_finish(b, a3, &o, &d, err, sizeof err), KVS_EINVAL);
    assert_non_null(strstr(err, "3 levels"));
    assert_null(d);
    assert_int_equal(grammar_builder_finish(b, loose, &o, &d, err, sizeof err), 0);
    grammar_builder_destroy(b);
    assert_true(accepts_s(d, "[]"));
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_accept_bytes(g, "[", 1));
    assert_false(grammar_accept_bytes(g, "[", 1)); /* its item could not fit */
    assert_true(grammar_accept_bytes(g, "]", 1));
    assert_true(grammar_is_finished(g));
    grammar_destroy(g);
    grammar_def_destroy(d);
}

static void test_schema_literals_anyof_refs(void **state)
{
    (void)state;
    grammar_def *d = def_schema("{\"enum\":[1,12,\"x\",null,{\"k\":[1,2]}]}");
    assert_true(accepts_s(d, "1"));
    assert_true(accepts_s(d, "12"));
    assert_true(accepts_s(d, "\"x\""));
    assert_true(accepts_s(d, "null"));
    assert_true(accepts_s(d, "{\"k\":[1,2]}"));
    assert_false(accepts_s(d, "13"));
    assert_false(accepts_s(d, "123"));
    assert_false(accepts_s(d, "\"y\""));
    grammar_def_destroy(d);
    d = def_schema("{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":["
                   "{\"type\":\"string\"},{\"type\":\"integer\"},"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                   "\"required\":[\"a\"]},"
                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                   "\"b\":{\"const\":true}},\"required\":[\"a\",\"b\"]}]}},"
                   "\"required\":[\"v\"]}");
    assert_true(accepts_s(d, "{\"v\":\"s\"}"));
    assert_true(accepts_s(d, "{\"v\":7}"));
    assert_true(accepts_s(d, "{\"v\":{\"a\":\"s\"}}"));
    assert_true(accepts_s(d, "{\"v\":{\"a\":1,\"b\":true}}"));
    assert_false(accepts_s(d, "{\"v\":{\"a\":1}}"));
    assert_false(accepts_s(d, "{\"v\":{\"a\":\"s\",\"b\":true}}"));
    assert_false(accepts_s(d, "{\"v\":7.5}"));
    grammar_def_destroy(d);
    /* recursion through $defs and through "#" */
    d = def_schema("{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\","
                   "\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
                   "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"]}}}");
    assert_true(accepts_s(d, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":"
                             "[{\"v\":4,\"kids\":[]}]}]}"));
    assert_false(accepts_s(d, "{\"v\":1,\"kids\":[{\"v\":2}]}"));
    grammar_def_destroy(d);
    d = def_schema("{\"type\":[\"object\",\"null\"],\"properties\":{\"next\":{\"$ref\":\"#\"}},"
                   "\"required\":[\"next\"]}");
    assert_true(accepts_s(d, "null"));
    assert_true(accepts_s(d, "{\"next\":{\"next\":null}}"));
    assert_false(accepts_s(d, "{}"));
    grammar_def_destroy(d);
}

static void test_schema_errors(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        int rc;
        const char *msg; /* must appear in err */
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"a+\"}}}",
         KVS_EUNSUPPORTED, "\"pattern\" at #/properties/name/pattern"},
        {"{\"type\":\"string\",\"format\":\"date\"}", KVS_EUNSUPPORTED, "#/format"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0}}", KVS_EUNSUPPORTED,
         "#/items/minimum"},
        {"{\"allOf\":[{}]}", KVS_EUNSUPPORTED, "\"allOf\" at #/allOf"},
        {"{\"oneOf\":[{}]}", KVS_EUNSUPPORTED, "#/oneOf"},
        {"{\"type\":\"object\",\"additionalProperties\":true}", KVS_EUNSUPPORTED,
         "#/additionalProperties"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", KVS_EUNSUPPORTED,
         "#/additionalProperties"},
        {"{\"type\":\"strnig\"}", KVS_EINVAL, "#/type"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", KVS_EINVAL,
         "\"b\""},
        {"{\"$ref\":\"#/$defs/missing\"}", KVS_EINVAL, "does not resolve at #/$ref"},
        {"{\"$ref\":\"http://example.com/s.json\"}", KVS_EUNSUPPORTED, "#/$ref"},
        {"{\"properties\":{\"a/b~\":{\"type\":\"string\",\"maxLength\":3}}}", KVS_EUNSUPPORTED,
         "#/properties/a~1b~0/maxLength"},
        {"{\"anyOf\":[]}", KVS_EINVAL, "#/anyOf"},
        {"{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", KVS_EUNSUPPORTED, "#/anyOf"},
        {"{\"$defs\":{\"x\":{\"type\":\"object\",\"properties\":{\"y\":{\"$ref\":\"#/$defs/x\"}},"
         "\"required\":[\"y\"]}},\"$ref\":\"#/$defs/x\"}",
         KVS_EINVAL, "no finite instance"},
        {"{\"$defs\":{\"x\":{\"$ref\":\"#/$defs/x\"}},\"$ref\":\"#/$defs/x\"}", KVS_EINVAL,
         "cycle"},
        {"{\"$defs\":{\"x\":{\"anyOf\":[{\"$ref\":\"#/$defs/x\"},{\"type\":\"null\"}]}},"
         "\"$ref\":\"#/$defs/x\"}",
         KVS_EINVAL, "anyOf reaches itself"},
        {"{\"type\":\"integer\",\"enum\":[1,2.5]}", KVS_EINVAL, "#/enum"},
        {"false", KVS_EUNSUPPORTED, "false"},
        {"[1]", KVS_EINVAL, "at #"},
        {"{\"properties\":{\"a\":{\"properties\":{\"b\":{\"x-custom\":1}}}}}", KVS_EUNSUPPORTED,
         "#/properties/a/properties/b/x-custom"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *s = cJSON_Parse(cases[i].schema);
        assert_non_null(s);
        grammar_def *d = NULL;
        char err[256] = "";
        int rc = srv_json_schema_compile(s, NULL, &d, err, sizeof err);
        cJSON_Delete(s);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("schema %s: got %s \"%s\", want %s containing \"%s\"", cases[i].schema,
                     status_str(rc), err, status_str(cases[i].rc), cases[i].msg);
        assert_null(d);
    }
}

static void test_tools(void **state)
{
    (void)state;
    cJSON *tools =
        cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                    "\"unit\":{\"$ref\":\"#/$defs/unit\"}},\"required\":[\"city\"],"
                    "\"$defs\":{\"unit\":{\"enum\":[\"c\",\"f\"]}}}}},"
                    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]");
    assert_non_null(tools);
    grammar_def *d = NULL;
    char err[256] = "";
    assert_int_equal(srv_json_schema_compile_tools(tools, NULL, NULL, &d, err, sizeof err), 0);
    assert_true(accepts_s(d, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"));
    assert_true(accepts_s(d, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\","
                             "\"unit\":\"c\"}}"));
    assert_true(accepts_s(d, "{\"name\":\"now\",\"arguments\":{}}"));
    assert_false(accepts_s(d, "{\"name\":\"now\",\"arguments\":{\"city\":\"Oslo\"}}"));
    assert_false(accepts_s(d, "{\"name\":\"other\",\"arguments\":{}}"));
    assert_false(accepts_s(d, "{\"arguments\":{},\"name\":\"now\"}"));
    grammar_def_destroy(d);
    d = NULL;
    assert_int_equal(srv_json_schema_compile_tools(tools, "now", NULL, &d, err, sizeof err), 0);
    assert_true(accepts_s(d, "{\"name\":\"now\",\"arguments\":{}}"));
    assert_false(accepts_s(d, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}"));
    grammar_def_destroy(d);
    d = NULL;
    assert_int_equal(srv_json_schema_compile_tools(tools, "nope", NULL, &d, err, sizeof err),
                     KVS_EINVAL);
    assert_non_null(strstr(err, "nope"));
    cJSON_Delete(tools);
    tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"b\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                        "\"pattern\":\"^a\"}}}}}]");
    assert_int_equal(srv_json_schema_compile_tools(tools, "a", NULL, &d, err, sizeof err),
                     KVS_EUNSUPPORTED);
    assert_non_null(strstr(err, "tools[1].function.parameters: unsupported keyword \"pattern\" "
                                "at #/properties/x/pattern"));
    assert_null(d);
    cJSON_Delete(tools);
}

/* A schema so ambiguous that more than GRAMMAR_MAX_CONFIGS alternatives would be alive at
 * once fails loudly (KVS_ERANGE from the mask, false from accept), never silently. */
static void test_ambiguity_bound(void **state)
{
    (void)state;
    tok_vocab *v = load_spm();
    if (!v)
        skip();
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    size_t cap = 96 * (GRAMMAR_MAX_CONFIGS + 10), len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text + len, cap - len, "{\"anyOf\":[");
    for (int i = 0; i < GRAMMAR_MAX_CONFIGS + 8; i++)
        len += (size_t)snprintf(
            text + len, cap - len,
            "%s{\"properties\":{\"k\":{\"const\":\"v%d\"}},\"required\":[\"k\"]}", i ? "," : "", i);
    snprintf(text + len, cap - len, "]}");
    grammar_def *d = def_schema(text);
    grammar *g;
    assert_int_equal(grammar_create(d, &g), 0);
    uint32_t *m = malloc(grammar_mask_words(grammar_vocab_n_tokens(gv)) * sizeof *m);
    assert_int_equal(grammar_mask(g, gv, m), KVS_ERANGE);
    assert_false(grammar_accept_bytes(g, "{", 1));
    assert_true(grammar_accept_bytes(g, " ", 1)); /* the state is still usable */
    grammar_destroy(g);
    grammar_def_destroy(d);
    /* as many consts in an anyOf are merged into one literal set: no forks at all */
    len = (size_t)snprintf(text, cap, "{\"anyOf\":[");
    for (int i = 0; i < GRAMMAR_MAX_CONFIGS + 8; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s{\"const\":\"v%d\"}", i ? "," : "", i);
    snprintf(text + len, cap - len, ",{\"type\":\"integer\"},{\"enum\":[true,\"v0\"]}]}");
    d = def_schema(text);
    assert_true(accepts_s(d, "\"v263\""));
    assert_true(accepts_s(d, "\"v0\""));
    assert_true(accepts_s(d, "true"));
    assert_true(accepts_s(d, "-5"));
    assert_false(accepts_s(d, "\"v264\""));
    assert_false(accepts_s(d, "false"));
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_mask(g, gv, m) > 0);
    free(m);
    free(text);
    grammar_destroy(g);
    grammar_def_destroy(d);
    grammar_vocab_destroy(gv);
    tok_destroy(v);
}

/* ---- random walks on the real vocabulary -------------------------------------------------- */

static const char *const k_walk_schemas[] = {
    /* an OpenAI-style strict schema */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\"},\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"nick\":{\"type\":[\"string\",\"null\"]},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"role\"],\"additionalProperties\":false}",
    /* a recursive tree with anyOf leaves */
    "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
    "\"v\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"},{\"const\":\"leaf\"}]},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
    "\"required\":[\"v\"]}}}",
    /* a tool call: name plus arguments by anyOf */
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
    "\"arguments\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"},"
    "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"location\",\"unit\"]}},"
    "\"required\":[\"name\",\"arguments\"]},"
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_time\"},"
    "\"arguments\":{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"string\"}}}},"
    "\"required\":[\"name\",\"arguments\"]}]}",
    /* any JSON object (json_object mode): NULL schema */
    NULL,
};

typedef struct walk_stats {
    int walks, completed, steps, checked;
} walk_stats;

/* One random walk from g's state: a random allowed token each step (half the time among the
 * one-byte tokens, so structure closes in reasonable time) until finished, or until the end
 * token is drawn when complete (even odds), or max_steps. Every check_every steps (0: never)
 * the mask is compared with the reference. Returns the text (caller frees); *completed says
 * whether it ended complete. */
static char *random_walk(grammar *g, const tok_vocab *v, const grammar_vocab *gv, uint64_t seed,
                         int max_steps, int check_every, bool *completed, walk_stats *ws)
{
    int32_t n = grammar_vocab_n_tokens(gv);
    uint32_t *mask = malloc(grammar_mask_words(n) * sizeof *mask);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    int32_t *single = malloc((size_t)n * sizeof *single);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    uint8_t *one_byte = malloc((size_t)n);
    assert_true(mask && allowed && single && text && one_byte);
    for (int32_t t = 0; t < n; t++)
        one_byte[t] = tok_token_to_piece(v, t, NULL, 0) == 1;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    *completed = false;
    ws->walks++;
    for (int step = 0; step < max_steps; step++) {
        int cnt = grammar_mask(g, gv, mask);
        if (cnt <= 0)
            fail_msg("empty mask (%d) after \"%.*s\"", cnt, (int)len, text);
        if (check_every && step % check_every == 0) {
            int32_t bad_tok = -1;
            int bad = mask_mismatches(g, gv, mask, &bad_tok);
            if (bad)
                fail_msg("mask differs from the reference on %d tokens (first %d) after "
                         "\"%.*s\"",
                         bad, (int)bad_tok, (int)len, text);
            ws->checked++;
        }
        if (grammar_is_finished(g)) {
            assert_int_equal(cnt, 1); /* nothing but the end token */
            assert_true(bit(mask, tok_eos(v)));
            *completed = true;
            break;
        }
        assert_int_equal(bit(mask, tok_eos(v)), grammar_is_complete(g));
        if (grammar_is_complete(g) && rng_next(&rng) % 2 == 0) {
            *completed = true; /* drew the end token */
            break;
        }
        int na = 0, ns = 0;
        char piece[256];
        for (int32_t t = 0; t < n; t++) {
            if (!bit(mask, t) || t == tok_eos(v))
                continue;
            allowed[na++] = t;
            if (one_byte[t])
                single[ns++] = t;
        }
        assert_true(na > 0);
        int32_t tok = ns && rng_next(&rng) % 2 ? single[rng_next(&rng) % (uint64_t)ns]
                                               : allowed[rng_next(&rng) % (uint64_t)na];
        assert_true(grammar_accept_token(g, gv, tok));
        int pl = tok_token_to_piece(v, tok, piece, sizeof piece);
        assert_true(pl > 0 && pl < (int)sizeof piece);
        if (len + (size_t)pl + 1 > cap)
            break;
        memcpy(text + len, piece, (size_t)pl);
        len += (size_t)pl;
        ws->steps++;
    }
    free(mask);
    free(allowed);
    free(single);
    free(one_byte);
    text[len] = '\0';
    return text;
}

static void test_random_walks(void **state)
{
    (void)state;
    tok_vocab *v = load_spm();
    if (!v)
        skip();
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    assert_int_equal(grammar_vocab_n_tokens(gv), 32000);
    int seeds = getenv("KVS_GRAMMAR_SEEDS") ? atoi(getenv("KVS_GRAMMAR_SEEDS")) : 24;
    for (size_t si = 0; si < sizeof k_walk_schemas / sizeof *k_walk_schemas; si++) {
        const char *st = k_walk_schemas[si] ? k_walk_schemas[si] : "{\"type\":\"object\"}";
        cJSON *schema = cJSON_Parse(st);
        grammar_def *d;
        if (k_walk_schemas[si])
            d = def_schema(st);
        else
            assert_int_equal(grammar_def_json_object(NULL, &d), 0);
        walk_stats ws = {0};
        for (int seed = 0; seed < seeds; seed++) {
            grammar *g;
            assert_int_equal(grammar_create(d, &g), 0);
            bool done;
            /* the reference check costs n_vocab simulations: on a few seeds only */
            char *text = random_walk(g, v, gv, (uint64_t)seed * 7919 + si, 1500, seed < 2 ? 9 : 0,
                                     &done, &ws);
            grammar_destroy(g);
            if (!done) {
                free(text);
                continue;
            }
            ws.completed++;
            if (getenv("KVS_GRAMMAR_SHOW"))
                fprintf(stderr, "  %s\n", text);
            const char *end = NULL;
            cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
            if (!j)
                fail_msg("schema %zu seed %d: cJSON refuses \"%s\"", si, seed, text);
            if (k_walk_schemas[si] ? !valid(j, schema, schema) : !cJSON_IsObject(j))
                fail_msg("schema %zu seed %d: \"%s\" does not validate", si, seed, text);
            cJSON_Delete(j);
            free(text);
        }
        fprintf(stderr, "schema %zu: %d walks, %d complete, %d tokens, %d masks checked\n", si,
                ws.walks, ws.completed, ws.steps, ws.checked);
        assert_true(ws.completed >= ws.walks / 2);
        cJSON_Delete(schema);
        grammar_def_destroy(d);
    }
    grammar_vocab_destroy(gv);
    tok_destroy(v);
}

/* A byte-level BPE vocabulary (gpt-2: 50257 tokens, pieces that split UTF-8 characters and
 * glue punctuation to words): masks against the reference along walks of two grammars. */
static void test_random_walks_bpe(void **state)
{
    (void)state;
    tok_vocab *v = load_named("gpt-2");
    if (!v)
        skip();
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    for (int k = 0; k < 2; k++) {
        grammar_def *d;
        if (k)
            d = def_schema(k_walk_schemas[2]);
        else
            assert_int_equal(grammar_def_json_object(NULL, &d), 0);
        walk_stats ws = {0};
        for (int seed = 0; seed < 2; seed++) {
            grammar *g;
            assert_int_equal(grammar_create(d, &g), 0);
            bool done;
            free(random_walk(g, v, gv, (uint64_t)seed + 100, 200, 8, &done, &ws));
            grammar_destroy(g);
        }
        fprintf(stderr, "gpt-2 grammar %d: %d tokens, %d masks checked\n", k, ws.steps, ws.checked);
        grammar_def_destroy(d);
    }
    grammar_vocab_destroy(gv);
    tok_destroy(v);
}

/* Free text up to a stop (grammar_builder_text_until): any bytes but the stop, which ends the
 * text at its first occurrence (a partial stop is text, overlapping beginnings are followed as
 * KMP follows them), then the value with no gap; alternatives that open with raw text and with
 * free text fork and die apart; masks equal the slow reference inside the text (where the walk
 * follows edges without stepping), across partial stops and after the stop, on SentencePiece
 * and byte-level BPE vocabularies, and on random walks through the text. */
static void test_text_until(void **state)
{
    (void)state;
    grammar_builder *b;
    assert_int_equal(grammar_builder_create(&b), 0);
    int32_t num, call, text, think, alt[2], root, bad;
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_prefixed(b, "C:", 2, num, &call), 0);
    assert_int_equal(grammar_builder_text_until(b, "<|end|>", 7, call, &text), 0);
    assert_int_equal(grammar_builder_prefixed(b, "T:", 2, text, &think), 0);
    assert_int_equal(grammar_builder_text_until(b, "", 0, call, &bad), KVS_EINVAL);
    char long_stop[GRAMMAR_MAX_STOP + 1];
    memset(long_stop, 'x', sizeof long_stop);
    assert_int_equal(grammar_builder_text_until(b, long_stop, sizeof long_stop, call, &bad),
                     KVS_EINVAL);
    alt[0] = call;
    alt[1] = think;
    assert_int_equal(grammar_builder_any_of(b, 2, alt, &root), 0);
    grammar_def *d = NULL, *dt = NULL;
    char err[128];
    assert_int_equal(grammar_builder_finish(b, root, NULL, &d, err, sizeof err), 0);
    assert_int_equal(grammar_builder_finish(b, text, NULL, &dt, err, sizeof err), 0);
    grammar_builder_destroy(b);
    assert_true(accepts_s(d, "C:12"));
    assert_true(accepts_s(d, "T:hello <b>|x|</b>\n\"{\"<|end|>C:3"));
    assert_true(accepts_s(d, "T:<|end|>C:3"));
    assert_true(accepts_s(d, "T:a<|en<|end|>C:1"));
    assert_true(accepts_s(d, "T:<<|end|>C:1"));
    assert_true(accepts_s(d, "T:<|end|<|end|>C:1"));
    assert_false(accepts_s(d, "T:hello"));
    assert_false(accepts_s(d, "T:hello<|end|>"));
    assert_false(accepts_s(d, "T:hello<|end|>x<|end|>C:1")); /* the first stop ends it */
    assert_false(accepts_s(d, "T:hello<|end|> C:1"));
    assert_false(accepts_s(d, " C:1"));
    assert_false(accepts_s(d, "C:1<|end|>"));
    /* a root of free text: whitespace is text, not a gap */
    assert_true(accepts_s(dt, "  \n<|end|>C:1"));
    assert_true(accepts_s(dt, "<|end|>C:1"));
    grammar_def_destroy(dt);
    /* a stop that overlaps itself: "aab" in "aaab" */
    assert_int_equal(grammar_builder_create(&b), 0);
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_text_until(b, "aab", 3, num, &text), 0);
    assert_int_equal(grammar_builder_finish(b, text, NULL, &dt, err, sizeof err), 0);
    grammar_builder_destroy(b);
    assert_true(accepts_s(dt, "aaab1"));
    assert_true(accepts_s(dt, "abaaaab1"));
    assert_false(accepts_s(dt, "aaab"));
    assert_false(accepts_s(dt, "aabaab1"));
    grammar_def_destroy(dt);
    /* a stop that real tokens hold ("ing" in "ings", "ingly"): a token may end the text and
     * begin the value, or end it and fail; the walk's shortcut must step at the stop's byte */
    assert_int_equal(grammar_builder_create(&b), 0);
    assert_int_equal(grammar_builder_number(b, true, &num), 0);
    assert_int_equal(grammar_builder_prefixed(b, "s:", 2, num, &call), 0);
    assert_int_equal(grammar_builder_text_until(b, "ing", 3, call, &text), 0);
    assert_int_equal(grammar_builder_finish(b, text, NULL, &dt, err, sizeof err), 0);
    grammar_builder_destroy(b);
    static const char *const at[] = {"",         "T:",        "T:some text", "T:x<",
                                     "T:x<|end", "T:x<|end|", "T:x<|end|>",  "T:x<|end|>C:1"};
    static const char *const at_ing[] = {"", "a th", "a thi", "a thin", "a thing", "a things"};
    static const char *const names[] = {"llama-spm", "gpt-2"};
    for (int k = 0; k < 2; k++) {
        tok_vocab *v = load_named(names[k]);
        if (!v)
            continue;
        check_masks(d, v, at, sizeof at / sizeof at[0]);
        check_masks(dt, v, at_ing, sizeof at_ing / sizeof at_ing[0]);
        grammar_vocab *gv;
        assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
        walk_stats ws = {0};
        for (int seed = 0; seed < 2; seed++) {
            grammar *g;
            assert_int_equal(grammar_create(d, &g), 0);
            assert_true(grammar_accept_bytes(g, "T:", 2));
            bool done;
            free(random_walk(g, v, gv, (uint64_t)seed + 7, 40, 8, &done, &ws));
            grammar_destroy(g);
        }
        grammar_vocab_destroy(gv);
        tok_destroy(v);
    }
    grammar_def_destroy(dt);
    grammar_def_destroy(d);
}

static void test_clone_independence(void **state)
{
    (void)state;
    tok_vocab *v = load_spm();
    if (!v)
        skip();
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    grammar_def *d = def_schema("{\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"},"
                                "{\"type\":\"string\"}]},\"b\":{\"type\":\"boolean\"}}}");
    size_t words = grammar_mask_words(grammar_vocab_n_tokens(gv));
    uint32_t *m1 = malloc(words * 4), *m2 = malloc(words * 4), *m3 = malloc(words * 4);
    grammar *g, *c;
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_accept_bytes(g, "{\"a\":", 5));
    assert_int_equal(grammar_clone(g, &c), 0);
    assert_true(grammar_mask(g, gv, m1) > 0);
    assert_true(grammar_mask(c, gv, m2) > 0);
    assert_memory_equal(m1, m2, words * 4);
    /* the fork takes the string branch, the original the integer one */
    assert_true(grammar_accept_bytes(c, "\"x", 2));
    assert_true(grammar_accept_bytes(g, "12", 2));
    assert_true(grammar_mask(g, gv, m1) > 0);
    assert_true(grammar_mask(c, gv, m2) > 0);
    assert_memory_not_equal(m1, m2, words * 4);
    assert_false(grammar_accept_bytes(g, "\"", 1));
    assert_false(grammar_accept_bytes(c, "\n", 1)); /* raw newline: text in c, a gap in g */
    grammar *g2;
    assert_int_equal(grammar_clone(g, &g2), 0);
    assert_true(grammar_accept_bytes(g2, "\n", 1));
    grammar_destroy(g2);
    grammar *c2;
    assert_int_equal(grammar_clone(c, &c2), 0);
    grammar_destroy(c); /* a clone owns everything it uses */
    assert_true(grammar_mask(c2, gv, m3) > 0);
    assert_memory_equal(m2, m3, words * 4);
    assert_true(grammar_accept_bytes(c2, "\",\"b\":true}", 11));
    assert_true(grammar_is_finished(c2));
    assert_true(grammar_accept_bytes(g, "}", 1));
    assert_true(grammar_is_finished(g));
    grammar_destroy(c2);
    grammar_destroy(g);
    free(m1);
    free(m2);
    free(m3);
    grammar_def_destroy(d);
    grammar_vocab_destroy(gv);
    tok_destroy(v);
}

/* The oracles fail when they should: a mask that allows a trailing comma's closing brace is
 * caught by the reference comparison, and such documents (and schema violations) by cJSON and
 * the validator. */
static void test_oracles_are_sensitive(void **state)
{
    (void)state;
    tok_vocab *v = load_spm();
    if (!v)
        skip();
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    grammar_def *d;
    assert_int_equal(grammar_def_json_object(NULL, &d), 0);
    size_t words = grammar_mask_words(grammar_vocab_n_tokens(gv));
    uint32_t *m = malloc(words * 4);
    grammar *g;
    assert_int_equal(grammar_create(d, &g), 0);
    assert_true(grammar_accept_bytes(g, "{\"a\":1,", 7));
    assert_true(grammar_mask(g, gv, m) > 0);
    assert_int_equal(mask_mismatches(g, gv, m, NULL), 0);
    int32_t brace = tok_find(v, "}", 1);
    assert_true(brace >= 0);
    assert_false(bit(m, brace));
    m[brace >> 5] |= 1u << (brace & 31); /* the broken mask */
    int32_t first = -1;
    assert_int_equal(mask_mismatches(g, gv, m, &first), 1);
    assert_int_equal(first, brace);
    grammar_destroy(g);
    free(m);
    grammar_def_destroy(d);

    cJSON *schema = cJSON_Parse(k_walk_schemas[0]);
    static const char *const bad[] = {
        "{\"name\":\"x\",\"age\":1,\"role\":\"user\",}",               /* trailing comma */
        "{\"name\":\"x\",\"role\":\"user\"}",                          /* required age missing */
        "{\"age\":1,\"name\":\"x\",\"role\":\"user\"}",                /* out of order */
        "{\"name\":\"x\",\"age\":1.5,\"role\":\"user\"}",              /* not an integer */
        "{\"name\":\"x\",\"age\":1,\"role\":\"root\"}",                /* not in the enum */
        "{\"name\":\"x\",\"age\":1,\"role\":\"user\",\"z\":1}",        /* not a property */
        "{\"name\":\"x\",\"age\":1,\"role\":\"user\",\"address\":{}}", /* city */
    };
    grammar_def *sd = def_schema(k_walk_schemas[0]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *j = cJSON_Parse(bad[i]);
        if (j && valid(j, schema, schema))
            fail_msg("the oracle accepts %s", bad[i]);
        cJSON_Delete(j);
        assert_false(accepts_s(sd, bad[i])); /* and so does the automaton */
    }
    const char *good = "{\"name\":\"x\",\"age\":1,\"role\":\"user\",\"nick\":null}";
    cJSON *j = cJSON_Parse(good);
    assert_true(valid(j, schema, schema));
    assert_true(accepts_s(sd, good));
    cJSON_Delete(j);
    grammar_def_destroy(sd);
    cJSON_Delete(schema);
    grammar_vocab_destroy(gv);
    tok_destroy(v);
}

/* The whole loop the scheduler will run, on the real stories260K model: forward, mask the
 * logits, sample, accept; stop when finished. Greedy and sampled runs must all give documents
 * that cJSON parses and the schema validates (a 260K-parameter model knows no JSON: the mask
 * alone makes them valid). */
static void test_model_constrained(void **state)
{
    (void)state;
    char path[1024];
    if (!test_model_path(path, sizeof path, "stories260K.gguf"))
        skip();
    engine_model *m;
    char err[256];
    engine_load_params lp = {0};
    if (engine_model_load(path, &lp, &m, err, sizeof err))
        fail_msg("load: %s", err);
    const tok_vocab *v = engine_model_vocab(m);
    const engine_hparams *hp = engine_model_hparams(m);
    grammar_vocab *gv;
    assert_int_equal(grammar_vocab_create(v, NULL, 0, &gv), 0);
    static const char schema_text[] =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"enum\":[\"Lily\",\"Tom\","
        "\"Ben\"]},\"age\":{\"type\":\"integer\"},\"happy\":{\"type\":\"boolean\"},"
        "\"pet\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"name\",\"age\","
        "\"happy\",\"pet\"],\"additionalProperties\":false}";
    cJSON *schema = cJSON_Parse(schema_text);
    grammar_def *d = def_schema(schema_text);
    enum { CTX = 256, BS = 16 };
    int32_t blocks[CTX / BS];
    for (int i = 0; i < CTX / BS; i++)
        blocks[i] = i;
    float *logits = malloc((size_t)hp->n_vocab * CTX * sizeof *logits);
    uint32_t *mask = malloc(grammar_mask_words((int32_t)hp->n_vocab) * sizeof *mask);
    int finished = 0;
    for (int run = 0; run < 4; run++) {
        engine_kv *kv;
        engine_ctx *ctx;
        assert_int_equal(engine_kv_create(m, ENGINE_KV_F32, CTX / BS, BS, &kv), 0);
        assert_int_equal(engine_ctx_create(m, CTX, 1, &ctx), 0);
        sampler_params sp = sampler_default_params();
        sp.temperature = run == 0 ? 0.0f : 1.0f; /* run 0 greedy, then three seeds */
        sp.seed = (uint64_t)run;
        sampler *smp;
        assert_int_equal(sampler_create(&sp, (int32_t)hp->n_vocab, &smp), 0);
        grammar *g;
        assert_int_equal(grammar_create(d, &g), 0);
        int32_t tok[CTX], pos[CTX], sq[CTX];
        bool want[CTX];
        size_t n_tok;
        assert_int_equal(tok_encode(v, "Once upon a time", 16, true, false, tok, CTX, &n_tok), 0);
        for (size_t i = 0; i < n_tok; i++) {
            pos[i] = (int32_t)i;
            sq[i] = 0;
            want[i] = i + 1 == n_tok;
        }
        engine_seq_view view = {.blocks = blocks, .n_blocks = CTX / BS};
        char text[4 * CTX] = "";
        size_t len = 0, from = 0;
        while (n_tok < CTX) {
            engine_batch b = {
                (uint32_t)(n_tok - from), tok + from, pos + from, sq + from, want + from, 1, &view};
            assert_int_equal(engine_forward(ctx, kv, &b, logits), 0);
            assert_true(grammar_mask(g, gv, mask) > 0);
            grammar_mask_logits(mask, (int32_t)hp->n_vocab, logits);
            int32_t next = sampler_sample(smp, logits, NULL, 0, NULL, NULL);
            assert_true(bit(mask, next));
            if (next == tok_eos(v)) {
                assert_true(grammar_is_complete(g));
                break;
            }
            assert_true(grammar_accept_token(g, gv, next));
            sampler_accept(smp, next, false);
            char piece[64];
            int pl = tok_token_to_piece(v, next, piece, sizeof piece);
            memcpy(text + len, piece, (size_t)pl);
            len += (size_t)pl;
            text[len] = '\0';
            from = n_tok;
            tok[n_tok] = next;
            pos[n_tok] = (int32_t)n_tok;
            sq[n_tok] = 0;
            want[n_tok] = true;
            n_tok++;
            if (grammar_is_finished(g))
                break;
        }
        if (grammar_is_complete(g)) {
            finished++;
            cJSON *j = cJSON_Parse(text);
            if (!j || !valid(j, schema, schema))
                fail_msg("run %d: \"%s\" does not validate", run, text);
            cJSON_Delete(j);
        }
        fprintf(stderr, "stories260K run %d: %s\n", run, text);
        grammar_destroy(g);
        sampler_destroy(smp);
        engine_ctx_destroy(ctx);
        engine_kv_destroy(kv);
    }
    assert_true(finished >= 3);
    free(logits);
    free(mask);
    grammar_def_destroy(d);
    cJSON_Delete(schema);
    grammar_vocab_destroy(gv);
    engine_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_corpus),
        cmocka_unit_test(test_json_mutations),
        cmocka_unit_test(test_json_object_front_end),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_schema_objects),
        cmocka_unit_test(test_schema_literals_anyof_refs),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_ambiguity_bound),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_prefixed),
        cmocka_unit_test(test_array_bounds),
        cmocka_unit_test(test_text_until),
        cmocka_unit_test(test_random_walks),
        cmocka_unit_test(test_random_walks_bpe),
        cmocka_unit_test(test_clone_independence),
        cmocka_unit_test(test_oracles_are_sensitive),
        cmocka_unit_test(test_model_constrained),
    };
    return cmocka_run_group_tests_name("grammar", tests, NULL, NULL);
}
