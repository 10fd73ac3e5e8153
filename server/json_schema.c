/* JSON Schema -> grammar_def. One recursive pass over the schema; $ref targets are compiled
 * once each (keyed by the cJSON node they resolve to) through a reserved builder node, which is
 * what makes recursive schemas terminate. Error paths are JSON pointers into the document.
 * Tools: one {"name", "arguments"} object (or raw text NAME sep) per function, each parameters
 * schema its own document. */
#include "server/json_schema.h"

#include "common/buf.h"
#include "common/status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_NESTING 128 /* schema objects inside one another (the stack's bound) */

typedef struct ref_entry {
    const cJSON *target;
    int32_t id;
} ref_entry;

typedef struct compiler {
    const cJSON *root;
    grammar_builder *b;
    ref_entry *refs;
    size_t n_refs, cap_refs;
    char *err;
    size_t err_len;
    int nesting;
} compiler;

static int fail(compiler *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(compiler *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
    return rc;
}

/* path + "/" + seg as a JSON pointer (~ and / escaped); truncated paths stay NUL-terminated. */
static void path_join(char *out, size_t cap, const char *path, const char *seg)
{
    size_t n = (size_t)snprintf(out, cap, "%s/", path);
    for (const char *p = seg; *p && n + 3 < cap; p++) {
        if (*p == '~' || *p == '/') {
            out[n++] = '~';
            out[n++] = *p == '~' ? '0' : '1';
        } else {
            out[n++] = *p;
        }
    }
    if (n < cap)
        out[n] = '\0';
}

static bool is_annotation(const char *k)
{
    static const char *const names[] = {"title",    "description", "$comment", "examples",
                                        "default",  "$schema",     "$id",      "deprecated",
                                        "readOnly", "writeOnly",   "$defs",    "definitions"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(k, names[i]) == 0)
            return true;
    return false;
}

static bool is_keyword(const char *k)
{
    static const char *const names[] = {"type",  "properties", "required", "additionalProperties",
                                        "items", "enum",       "const",    "anyOf",
                                        "$ref"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(k, names[i]) == 0)
            return true;
    return is_annotation(k);
}

static int compile(compiler *c, const cJSON *s, const char *path, int32_t *id);

/* Resolves "#" or "#/a/b~1c" against the document root; NULL if it names nothing. */
static const cJSON *resolve_pointer(const cJSON *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const cJSON *cur = root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/')
            return NULL;
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p != '0' && *p != '1')
                    return NULL;
                ch = *p++ == '0' ? '~' : '/';
            }
            if (n + 1 >= sizeof seg)
                return NULL;
            seg[n++] = ch;
        }
        seg[n] = '\0';
        if (cJSON_IsObject(cur)) {
            cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
        } else if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (!n || *end || i < 0 || i >= cJSON_GetArraySize(cur))
                return NULL;
            cur = cJSON_GetArrayItem(cur, (int)i);
        } else {
            return NULL;
        }
        if (!cur)
            return NULL;
    }
    return cur;
}

static int compile_ref(compiler *c, const cJSON *ref, const char *path, int32_t *id)
{
    if (!cJSON_IsString(ref))
        return fail(c, KVS_EINVAL, "$ref must be a string at %s", path);
    const char *r = ref->valuestring;
    if (r[0] != '#')
        return fail(c, KVS_EUNSUPPORTED,
                    "only local $ref (\"#\" or \"#/...\") is supported, not \"%.80s\" at %s", r,
                    path);
    const cJSON *t = resolve_pointer(c->root, r);
    if (!t)
        return fail(c, KVS_EINVAL, "$ref \"%.80s\" does not resolve at %s", r, path);
    for (size_t i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == t) {
            *id = c->refs[i].id;
            return 0;
        }
    if (c->n_refs == c->cap_refs) {
        size_t nc = c->cap_refs ? 2 * c->cap_refs : 8;
        ref_entry *q = realloc(c->refs, nc * sizeof *q);
        if (!q)
            return fail(c, KVS_ENOMEM, "out of memory");
        c->refs = q;
        c->cap_refs = nc;
    }
    int32_t slot, body;
    if (grammar_builder_reserve(c->b, &slot))
        return fail(c, KVS_ENOMEM, "out of memory");
    c->refs[c->n_refs].target = t;
    c->refs[c->n_refs].id = slot;
    c->n_refs++;
    int rc = compile(c, t, r, &body); /* errors inside name the target's own pointer */
    if (rc)
        return rc;
    if (grammar_builder_alias(c->b, slot, body))
        return fail(c, KVS_EINVAL, "internal: alias of %s", r);
    *id = slot;
    return 0;
}

static bool value_has_type(const cJSON *v, const char *type)
{
    if (strcmp(type, "object") == 0)
        return cJSON_IsObject(v);
    if (strcmp(type, "array") == 0)
        return cJSON_IsArray(v);
    if (strcmp(type, "string") == 0)
        return cJSON_IsString(v);
    if (strcmp(type, "number") == 0)
        return cJSON_IsNumber(v);
    if (strcmp(type, "integer") == 0)
        return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
    if (strcmp(type, "boolean") == 0)
        return cJSON_IsBool(v);
    if (strcmp(type, "null") == 0)
        return cJSON_IsNull(v);
    return false;
}

static bool known_type(const char *t)
{
    static const char *const names[] = {"object",  "array",   "string", "number",
                                        "integer", "boolean", "null"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(t, names[i]) == 0)
            return true;
    return false;
}

/* enum / const: the values as literals, each checked against type when there is one. */
static int compile_literals(compiler *c, const cJSON *vals, bool single, const cJSON *type,
                            const char *path, int32_t *id)
{
    const char *kw = single ? "const" : "enum";
    char p[512];
    path_join(p, sizeof p, path, kw);
    size_t n = single ? 1 : (size_t)cJSON_GetArraySize(vals);
    if (!single && (!cJSON_IsArray(vals) || n == 0))
        return fail(c, KVS_EINVAL, "enum must be a non-empty array at %s", p);
    char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens);
    int rc = 0;
    if (!texts || !lens) {
        rc = fail(c, KVS_ENOMEM, "out of memory");
        goto out;
    }
    size_t i = 0;
    const cJSON *v = single ? vals : vals->child;
    for (; i < n && v; i++, v = v->next) {
        if (type) {
            bool ok = false;
            if (cJSON_IsString(type)) {
                ok = value_has_type(v, type->valuestring);
            } else {
                const cJSON *t;
                cJSON_ArrayForEach(t, type) ok = ok || value_has_type(v, t->valuestring);
            }
            if (!ok) {
                rc = fail(c, KVS_EINVAL, "%s value %zu does not match the type at %s", kw, i, p);
                goto out;
            }
        }
        texts[i] = cJSON_PrintUnformatted(v);
        if (!texts[i]) {
            rc = fail(c, KVS_ENOMEM, "out of memory");
            goto out;
        }
        lens[i] = strlen(texts[i]);
        if (lens[i] > GRAMMAR_MAX_TEXT) {
            rc = fail(c, KVS_EUNSUPPORTED, "%s value %zu is longer than %d bytes at %s", kw, i,
                      GRAMMAR_MAX_TEXT, p);
            goto out;
        }
    }
    if (grammar_builder_literals(c->b, n, (const char *const *)texts, lens, id))
        rc = fail(c, KVS_ENOMEM, "out of memory");
out:
    for (size_t k = 0; texts && k < n; k++)
        cJSON_free(texts[k]);
    free(texts);
    free(lens);
    return rc;
}

static int compile_object(compiler *c, const cJSON *s, const char *path, int32_t *id)
{
    char p[512], q[512];
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (add && !cJSON_IsFalse(add)) {
        path_join(p, sizeof p, path, "additionalProperties");
        return fail(c, KVS_EUNSUPPORTED, "additionalProperties must be false at %s", p);
    }
    if (props && !cJSON_IsObject(props)) {
        path_join(p, sizeof p, path, "properties");
        return fail(c, KVS_EINVAL, "properties must be an object at %s", p);
    }
    if (req) {
        path_join(p, sizeof p, path, "required");
        if (!cJSON_IsArray(req))
            return fail(c, KVS_EINVAL, "required must be an array of strings at %s", p);
        const cJSON *r;
        cJSON_ArrayForEach(r, req)
        {
            if (!cJSON_IsString(r))
                return fail(c, KVS_EINVAL, "required must be an array of strings at %s", p);
            if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return fail(c, KVS_EINVAL,
                            "required names \"%.64s\", which is not in properties, at %s",
                            r->valuestring, p);
        }
    }
    if (grammar_builder_object(c->b, id))
        return fail(c, KVS_ENOMEM, "out of memory");
    if (!props)
        return 0;
    path_join(p, sizeof p, path, "properties");
    if (cJSON_GetArraySize(props) > GRAMMAR_MAX_PROPERTIES)
        return fail(c, KVS_EUNSUPPORTED, "more than %d properties at %s", GRAMMAR_MAX_PROPERTIES,
                    p);
    const cJSON *prop;
    cJSON_ArrayForEach(prop, props)
    {
        path_join(q, sizeof q, p, prop->string);
        if (strlen(prop->string) > GRAMMAR_MAX_TEXT / 6)
            return fail(c, KVS_EUNSUPPORTED, "a property name longer than %d bytes at %s",
                        GRAMMAR_MAX_TEXT / 6, q);
        bool required = false;
        const cJSON *r;
        if (req)
            cJSON_ArrayForEach(r, req) required =
                required || strcmp(r->valuestring, prop->string) == 0;
        int32_t v;
        int rc = compile(c, prop, q, &v);
        if (rc)
            return rc;
        rc = grammar_builder_property(c->b, *id, prop->string, strlen(prop->string), v, required);
        if (rc == KVS_EINVAL)
            return fail(c, KVS_EINVAL, "duplicate property at %s", q);
        if (rc)
            return fail(c, KVS_ENOMEM, "out of memory");
    }
    return 0;
}

/* One named type of schema s (s's other keywords apply to it). */
static int compile_type(compiler *c, const cJSON *s, const char *type, const char *path,
                        int32_t *id)
{
    int rc = 0;
    if (strcmp(type, "object") == 0)
        return compile_object(c, s, path, id);
    if (strcmp(type, "array") == 0) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int32_t it;
        char p[512];
        path_join(p, sizeof p, path, "items");
        rc = items ? compile(c, items, p, &it) : grammar_builder_any(c->b, &it);
        if (rc)
            return rc == KVS_ENOMEM ? fail(c, rc, "out of memory") : rc;
        rc = grammar_builder_array(c->b, it, id);
    } else if (strcmp(type, "string") == 0) {
        rc = grammar_builder_string(c->b, id);
    } else if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        rc = grammar_builder_number(c->b, type[0] == 'i', id);
    } else if (strcmp(type, "boolean") == 0) {
        static const char *const tf[] = {"false", "true"};
        static const size_t tfl[] = {5, 4};
        rc = grammar_builder_literals(c->b, 2, tf, tfl, id);
    } else if (strcmp(type, "null") == 0) {
        static const char *const nl[] = {"null"};
        static const size_t nll[] = {4};
        rc = grammar_builder_literals(c->b, 1, nl, nll, id);
    }
    return rc ? fail(c, KVS_ENOMEM, "out of memory") : 0;
}

static int compile(compiler *c, const cJSON *s, const char *path, int32_t *id)
{
    char p[512];
    if (cJSON_IsTrue(s))
        return grammar_builder_any(c->b, id) ? fail(c, KVS_ENOMEM, "out of memory") : 0;
    if (cJSON_IsFalse(s))
        return fail(c, KVS_EUNSUPPORTED, "the schema false (nothing is valid) at %s", path);
    if (!cJSON_IsObject(s))
        return fail(c, KVS_EINVAL, "a schema must be an object or a boolean at %s", path);
    if (++c->nesting > SCHEMA_MAX_NESTING)
        return fail(c, KVS_EUNSUPPORTED, "schemas nested more than %d deep at %s",
                    SCHEMA_MAX_NESTING, path);
    int rc = 0;
    bool constraint = false; /* keywords other than annotations */
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
    {
        if (!is_keyword(k->string)) {
            path_join(p, sizeof p, path, k->string);
            rc = fail(c, KVS_EUNSUPPORTED, "unsupported keyword \"%.64s\" at %s", k->string, p);
            goto out;
        }
        constraint = constraint || (!is_annotation(k->string) && strcmp(k->string, "$ref") &&
                                    strcmp(k->string, "anyOf"));
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if ((ref || any_of) && (constraint || (ref && any_of))) {
        path_join(p, sizeof p, path, ref ? "$ref" : "anyOf");
        rc = fail(c, KVS_EUNSUPPORTED, "%s alongside other keywords at %s", ref ? "$ref" : "anyOf",
                  p);
        goto out;
    }
    if (ref) {
        path_join(p, sizeof p, path, "$ref");
        rc = compile_ref(c, ref, p, id);
        goto out;
    }
    if (any_of) {
        path_join(p, sizeof p, path, "anyOf");
        int n = cJSON_GetArraySize(any_of);
        if (!cJSON_IsArray(any_of) || n == 0) {
            rc = fail(c, KVS_EINVAL, "anyOf must be a non-empty array at %s", p);
            goto out;
        }
        int32_t *alts = malloc((size_t)n * sizeof *alts);
        if (!alts) {
            rc = fail(c, KVS_ENOMEM, "out of memory");
            goto out;
        }
        int i = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any_of)
        {
            char q[512];
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i);
            path_join(q, sizeof q, p, idx);
            if ((rc = compile(c, a, q, &alts[i++])) != 0)
                break;
        }
        if (!rc && grammar_builder_any_of(c->b, (size_t)n, alts, id))
            rc = fail(c, KVS_ENOMEM, "out of memory");
        free(alts);
        goto out;
    }
    if (type) {
        path_join(p, sizeof p, path, "type");
        const cJSON *t;
        bool ok = cJSON_IsString(type) || (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0);
        if (cJSON_IsString(type)) {
            ok = known_type(type->valuestring);
        } else if (ok) {
            cJSON_ArrayForEach(t, type) ok = ok && cJSON_IsString(t) && known_type(t->valuestring);
        }
        if (!ok) {
            rc = fail(c, KVS_EINVAL,
                      "type must be one of object, array, string, number, integer, boolean, "
                      "null (or a list of them) at %s",
                      p);
            goto out;
        }
    }
    if (en || cn) {
        if (en && cn) {
            path_join(p, sizeof p, path, "const");
            rc = fail(c, KVS_EUNSUPPORTED, "enum and const together at %s", p);
            goto out;
        }
        rc = compile_literals(c, en ? en : cn, cn != NULL, type, path, id);
        goto out;
    }
    if (!type) {
        if (cJSON_GetObjectItemCaseSensitive(s, "properties"))
            rc = compile_object(c, s, path, id);
        else if (cJSON_GetObjectItemCaseSensitive(s, "items"))
            rc = compile_type(c, s, "array", path, id);
        else if (grammar_builder_any(c->b, id))
            rc = fail(c, KVS_ENOMEM, "out of memory");
        goto out;
    }
    if (cJSON_IsString(type)) {
        rc = compile_type(c, s, type->valuestring, path, id);
        goto out;
    }
    int n = cJSON_GetArraySize(type);
    int32_t *alts = malloc((size_t)n * sizeof *alts);
    if (!alts) {
        rc = fail(c, KVS_ENOMEM, "out of memory");
        goto out;
    }
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, type)
    {
        if ((rc = compile_type(c, s, t->valuestring, path, &alts[i++])) != 0)
            break;
    }
    if (!rc && grammar_builder_any_of(c->b, (size_t)n, alts, id))
        rc = fail(c, KVS_ENOMEM, "out of memory");
    free(alts);
out:
    c->nesting--;
    return rc;
}

int srv_json_schema_compile(const cJSON *schema, const grammar_options *opts, grammar_def **out,
                            char *err, size_t err_len)
{
    char dummy[1];
    compiler c = {.root = schema,
                  .err = err && err_len ? err : dummy,
                  .err_len = err && err_len ? err_len : sizeof dummy};
    c.err[0] = '\0';
    if (!schema)
        return fail(&c, KVS_EINVAL, "no schema");
    int rc = grammar_builder_create(&c.b);
    if (rc)
        return fail(&c, rc, "out of memory");
    int32_t root;
    rc = compile(&c, schema, "#", &root);
    if (!rc) {
        char e[256];
        rc = grammar_builder_finish(c.b, root, opts, out, e, sizeof e);
        if (rc)
            fail(&c, rc, "%s at #", e);
    }
    grammar_builder_destroy(c.b);
    free(c.refs);
    return rc;
}

/* One tool's arguments: its parameters (a document of their own), or {} without them. */
static int compile_args(compiler *c, const cJSON *tool, int i, int32_t *args_id)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
    if (!cJSON_IsObject(tool) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return fail(c, KVS_EUNSUPPORTED, "tools[%d]: only {\"type\": \"function\"} tools", i);
    if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0])
        return fail(c, KVS_EINVAL, "tools[%d].function.name must be a non-empty string", i);
    if (!params) {
        if (grammar_builder_object(c->b, args_id)) /* no parameters: {} */
            return fail(c, KVS_ENOMEM, "out of memory");
        return 0;
    }
    /* the parameters are a document of their own: "#" in their $refs is their root */
    const cJSON *outer = c->root;
    c->root = params;
    int rc = compile(c, params, "#", args_id);
    c->root = outer;
    if (rc) {
        char e[256];
        snprintf(e, sizeof e, "%s", c->err);
        return fail(c, rc, "tools[%d].function.parameters: %s", i, e);
    }
    return 0;
}

/* One tool's call. sep NULL: {"name": "<its name>", "arguments": <its parameters>}, properties
 * in that order; else the raw text NAME sep, then the arguments. */
static int compile_tool(compiler *c, const cJSON *tool, int i, const char *sep, int32_t *id)
{
    int32_t args_id, name_id;
    int rc = compile_args(c, tool, i, &args_id);
    if (rc)
        return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(tool, "function"), "name");
    if (sep) {
        kvs_buf t = {0};
        kvs_buf_add(&t, name->valuestring);
        kvs_buf_add(&t, sep);
        rc = t.oom                      ? KVS_ENOMEM
             : t.len > GRAMMAR_MAX_TEXT ? KVS_EINVAL
                                        : grammar_builder_prefixed(c->b, t.p, t.len, args_id, id);
        kvs_buf_free(&t);
        if (rc)
            return fail(c, rc, "tools[%d].function.name: %s", i,
                        rc == KVS_EINVAL ? "too long" : "out of memory");
        return 0;
    }
    char *lit = cJSON_PrintUnformatted(name);
    if (!lit)
        return fail(c, KVS_ENOMEM, "out of memory");
    size_t len = strlen(lit);
    rc = len > GRAMMAR_MAX_TEXT
             ? KVS_EINVAL
             : grammar_builder_literals(c->b, 1, (const char *const *)&lit, &len, &name_id);
    cJSON_free(lit);
    if (rc)
        return fail(c, rc, "tools[%d].function.name: %s", i,
                    rc == KVS_EINVAL ? "too long" : "out of memory");
    if (grammar_builder_object(c->b, id) ||
        grammar_builder_property(c->b, *id, "name", 4, name_id, true) ||
        grammar_builder_property(c->b, *id, "arguments", 9, args_id, true))
        return fail(c, KVS_ENOMEM, "out of memory");
    return 0;
}

/* The calls of tools (or of the one named only) as one anyOf node of c->b. */
static int tool_alts(compiler *c, const cJSON *tools, const char *only, const char *sep,
                     int32_t *id)
{
    int n = cJSON_GetArraySize(tools);
    if (!cJSON_IsArray(tools) || n == 0)
        return fail(c, KVS_EINVAL, "tools must be a non-empty array");
    int32_t *alts = malloc((size_t)n * sizeof *alts);
    if (!alts)
        return fail(c, KVS_ENOMEM, "out of memory");
    size_t n_alts = 0;
    int i = 0, rc = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        bool wanted = !only || (cJSON_IsString(name) && strcmp(name->valuestring, only) == 0);
        /* every tool is checked, so a bad one is reported whichever is chosen */
        int32_t tid;
        if ((rc = compile_tool(c, t, i, sep, &tid)) != 0)
            break;
        if (wanted)
            alts[n_alts++] = tid;
        i++;
    }
    if (!rc && n_alts == 0)
        rc = fail(c, KVS_EINVAL, "tool_choice names \"%.64s\", which is not in tools", only);
    if (!rc && grammar_builder_any_of(c->b, n_alts, alts, id))
        rc = fail(c, KVS_ENOMEM, "out of memory");
    free(alts);
    return rc;
}

static void compiler_init(compiler *c, grammar_builder *b, char *err, size_t err_len, char *dummy)
{
    memset(c, 0, sizeof *c);
    c->b = b;
    c->err = err && err_len ? err : dummy;
    c->err_len = err && err_len ? err_len : 1;
    c->err[0] = '\0';
}

int srv_json_schema_compile_tools(const cJSON *tools, const char *only, const grammar_options *opts,
                                  grammar_def **out, char *err, size_t err_len)
{
    char dummy[1];
    compiler c;
    compiler_init(&c, NULL, err, err_len, dummy);
    int rc = grammar_builder_create(&c.b);
    if (rc)
        return fail(&c, rc, "out of memory");
    int32_t root;
    rc = tool_alts(&c, tools, only, NULL, &root);
    if (!rc) {
        char e[256];
        rc = grammar_builder_finish(c.b, root, opts, out, e, sizeof e);
        if (rc)
            fail(&c, rc, "tools: %s", e);
    }
    grammar_builder_destroy(c.b);
    free(c.refs);
    return rc;
}

int srv_json_schema_tool_calls(grammar_builder *b, const cJSON *tools, const char *only,
                               const char *sep, int32_t *id, char *err, size_t err_len)
{
    char dummy[1];
    compiler c;
    compiler_init(&c, b, err, err_len, dummy);
    int rc = tool_alts(&c, tools, only, sep, id);
    free(c.refs);
    return rc;
}
