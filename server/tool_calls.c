/* Tool-call syntax per family (see tool_calls.h). Text is built with a small growable buffer
 * whose failure is sticky: one check at the end reports KVS_ENOMEM. */
#include "server/tool_calls.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/status.h"
#include "server/json_py.h"

/* Appends j as a template's tojson prints it (json_py.h); NULL j or a failure marks b. */
static void tb_json(kvs_buf *b, const cJSON *j)
{
    srv_json_py(b, j, 0);
}

enum family {
    FAM_HERMES,
    FAM_LLAMA3,
    FAM_MISTRAL,
    FAM_MISTRAL3,
    FAM_HARMONY,
    FAM_GRANITE,
    FAM_LFM2
};

static enum family family_of(enum srv_chat_tmpl t)
{
    switch (t) {
    case SRV_CHAT_LLAMA3:
    case SRV_CHAT_LLAMA31:
    case SRV_CHAT_LLAMA32: return FAM_LLAMA3;
    case SRV_CHAT_MISTRAL: return FAM_MISTRAL;
    case SRV_CHAT_MISTRAL3:
    case SRV_CHAT_MISTRAL3_THINK: return FAM_MISTRAL3;
    case SRV_CHAT_HARMONY: return FAM_HARMONY;
    case SRV_CHAT_GRANITE:
    case SRV_CHAT_GRANITE30:
    case SRV_CHAT_GRANITE32:
    case SRV_CHAT_GRANITE33: return FAM_GRANITE;
    case SRV_CHAT_LFM2:
    case SRV_CHAT_LFM25:
    case SRV_CHAT_LFM25_8B: return FAM_LFM2;
    default: return FAM_HERMES; /* ChatML's (and Qwen 3's) own form, and the generic one */
    }
}

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool truthy(const cJSON *j)
{
    if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j))
        return false;
    if (cJSON_IsString(j))
        return j->valuestring[0] != '\0';
    if (cJSON_IsArray(j) || cJSON_IsObject(j))
        return j->child != NULL;
    if (cJSON_IsNumber(j))
        return j->valuedouble != 0;
    return true;
}

static bool type_is(const cJSON *spec, const char *name)
{
    const cJSON *t = get(spec, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, name);
}

static bool in_list(const cJSON *list, const char *s)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, list)
    {
        if (cJSON_IsString(it) && !strcmp(it->valuestring, s))
            return true;
    }
    return false;
}

/* Appends a Jinja string conversion of j: a string as itself, anything else as tojson. */
static void add_str(kvs_buf *b, const cJSON *j)
{
    if (cJSON_IsString(j))
        kvs_buf_add(b, j->valuestring);
    else
        srv_json_py(b, j, 0);
}

/* gpt-oss's render_typescript_type: a JSON schema as a TypeScript type, whitespace and all
 * (the spaces its template leaves between two expressions are part of what the model read). */
static void ts_type(kvs_buf *b, const cJSON *spec)
{
    const cJSON *t = get(spec, "type");
    bool nullable = truthy(get(spec, "nullable"));
    if (type_is(spec, "array")) {
        const cJSON *items = get(spec, "items");
        if (truthy(items)) {
            if (type_is(items, "string"))
                kvs_buf_add(b, "string[]");
            else if (type_is(items, "number") || type_is(items, "integer"))
                kvs_buf_add(b, "number[]");
            else if (type_is(items, "boolean"))
                kvs_buf_add(b, "boolean[]");
            else {
                kvs_buf inner = {0};
                kvs_buf_add(&inner, "");
                ts_type(&inner, items);
                if (inner.oom)
                    b->oom = true;
                else if (!strcmp(inner.p, "object | object") || inner.len > 50)
                    kvs_buf_add(b, "any[]");
                else {
                    kvs_buf_add(b, inner.p);
                    kvs_buf_add(b, "[]");
                }
                kvs_buf_free(&inner);
            }
        } else {
            kvs_buf_add(b, "any[]");
        }
        if (nullable)
            kvs_buf_add(b, " | null");
    } else if (cJSON_IsArray(t) && t->child) {
        const cJSON *it;
        cJSON_ArrayForEach(it, t)
        {
            if (it != t->child)
                kvs_buf_add(b, " | ");
            add_str(b, it);
        }
    } else if (truthy(get(spec, "oneOf"))) {
        /* (the template's object-variant test sets a variable inside its loop, which Jinja's
         * scoping drops: every variant is written) */
        const cJSON *v, *one = get(spec, "oneOf");
        cJSON_ArrayForEach(v, one)
        {
            ts_type(b, v);
            if (truthy(get(v, "description"))) {
                kvs_buf_add(b, "// ");
                add_str(b, get(v, "description"));
            }
            if (get(v, "default")) {
                kvs_buf_add(b, "                    // default: ");
                srv_json_py(b, get(v, "default"), 0);
            }
            if (v->next)
                kvs_buf_add(b, " | \n");
        }
    } else if (type_is(spec, "string")) {
        const cJSON *en = get(spec, "enum");
        if (truthy(en)) {
            kvs_buf_add(b, "\"");
            const cJSON *it;
            cJSON_ArrayForEach(it, en)
            {
                if (it != en->child)
                    kvs_buf_add(b, "\" | \"");
                add_str(b, it);
            }
            kvs_buf_add(b, "\"");
        } else {
            kvs_buf_add(b, "string");
            if (nullable)
                kvs_buf_add(b, " | null");
        }
    } else if (type_is(spec, "number") || type_is(spec, "integer")) {
        kvs_buf_add(b, "number");
    } else if (type_is(spec, "boolean")) {
        kvs_buf_add(b, "boolean");
    } else if (type_is(spec, "object")) {
        const cJSON *props = get(spec, "properties");
        if (truthy(props)) {
            kvs_buf_add(b, "{\n");
            const cJSON *p;
            cJSON_ArrayForEach(p, props)
            {
                kvs_buf_add(b, p->string);
                if (!in_list(get(spec, "required"), p->string))
                    kvs_buf_add(b, "?");
                kvs_buf_add(b, ": \n                ");
                ts_type(b, p);
                if (p->next)
                    kvs_buf_add(b, ", ");
            }
            kvs_buf_add(b, "}");
        } else {
            kvs_buf_add(b, "object");
        }
    } else {
        kvs_buf_add(b, "any");
    }
}

/* gpt-oss's render_tool_namespace("functions", tools). */
static void harmony_tools(kvs_buf *b, const cJSON *tools)
{
    kvs_buf_add(b, "## functions\n\nnamespace functions {\n\n");
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools)
    {
        const cJSON *fn = get(tool, "function");
        const cJSON *params = get(fn, "parameters");
        const cJSON *props = get(params, "properties");
        const cJSON *req = get(params, "required");
        kvs_buf_add(b, "// ");
        if (cJSON_IsString(get(fn, "description")))
            kvs_buf_add(b, get(fn, "description")->valuestring);
        kvs_buf_add(b, "\ntype ");
        kvs_buf_add(b, get(fn, "name")->valuestring);
        kvs_buf_add(b, " = ");
        if (!truthy(params) || !truthy(props)) {
            kvs_buf_add(b, "() => any;\n\n");
            continue;
        }
        kvs_buf_add(b, "(_: {\n");
        const cJSON *p;
        cJSON_ArrayForEach(p, props)
        {
            if (truthy(get(p, "description"))) {
                kvs_buf_add(b, "// ");
                add_str(b, get(p, "description"));
                kvs_buf_add(b, "\n");
            }
            kvs_buf_add(b, p->string);
            if (!in_list(req, p->string))
                kvs_buf_add(b, "?");
            kvs_buf_add(b, ": ");
            ts_type(b, p);
            const cJSON *def = get(p, "default");
            if (def) {
                if (truthy(get(p, "enum"))) {
                    kvs_buf_add(b, ", // default: ");
                    add_str(b, def);
                } else if (truthy(get(p, "oneOf"))) {
                    kvs_buf_add(b, "// default: ");
                    add_str(b, def);
                } else {
                    kvs_buf_add(b, ", // default: ");
                    srv_json_py(b, def, 0);
                }
            }
            kvs_buf_add(b, ",\n");
        }
        kvs_buf_add(b, "}) => any;\n\n");
    }
    kvs_buf_add(b, "} // namespace functions");
}

int srv_tools_render_call_args(enum srv_chat_tmpl t, const cJSON *tool_calls, char **out)
{
    (void)t;
    const cJSON *fn = get(cJSON_GetArrayItem(tool_calls, 0), "function");
    const cJSON *args = get(fn, "arguments");
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    kvs_buf b = {0};
    if (parsed)
        srv_json_py(&b, parsed, 0);
    else
        kvs_buf_add(&b, "{}");
    cJSON_Delete(parsed);
    return kvs_buf_take(&b, out);
}

int srv_tools_render_system(enum srv_chat_tmpl t, const cJSON *tools, char **out)
{
    kvs_buf b = {0};
    const cJSON *tool;
    switch (family_of(t)) {
    case FAM_HERMES:
        if (t == SRV_CHAT_GRANITE40) { /* its template's own words, each tool tojson */
            kvs_buf_add(&b, "You are a helpful assistant with access to the following tools. You "
                            "may call one or more tools to assist with the user query.\n\nYou "
                            "are provided with function signatures within <tools></tools> XML "
                            "tags:\n<tools>");
            cJSON_ArrayForEach(tool, tools)
            {
                kvs_buf_add(&b, "\n");
                tb_json(&b, tool);
            }
            kvs_buf_add(&b, "\n</tools>\n\nFor each tool call, return a json object with "
                            "function name and arguments within <tool_call></tool_call> XML "
                            "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                            "<args-json-object>}\n</tool_call>. If a tool does not exist in the "
                            "provided list of tools, notify the user that you do not have the "
                            "ability to fulfill the request.");
            break;
        }
        kvs_buf_add(&b,
                    "# Tools\n\nYou may call one or more functions to assist with the user "
                    "query.\n\nYou are provided with function signatures within <tools></tools> "
                    "XML tags:\n<tools>");
        cJSON_ArrayForEach(tool, tools)
        {
            kvs_buf_add(&b, "\n");
            tb_json(&b, tool);
        }
        kvs_buf_add(&b,
                    "\n</tools>\n\nFor each function call, return a json object with function "
                    "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
        break;
    case FAM_LLAMA3:
        if (srv_tools_in_user_turn(t)) { /* Llama 3.1/3.2's own words and layout */
            kvs_buf_add(&b, "Given the following functions, please respond with a JSON for a "
                            "function call with its proper arguments that best answers the given "
                            "prompt.\n\nRespond in the format {\"name\": function name, "
                            "\"parameters\": dictionary of argument name and its value}.Do not "
                            "use variables.\n\n");
            cJSON_ArrayForEach(tool, tools)
            {
                srv_json_py(&b, tool, 4);
                kvs_buf_add(&b, "\n\n");
            }
            break;
        }
        kvs_buf_add(&b,
                    "Environment: ipython\n\nGiven the following functions, please respond with a "
                    "JSON for a function call with its proper arguments that best answers the "
                    "given prompt.\n\nRespond in the format {\"name\": function name, "
                    "\"parameters\": dictionary of argument name and its value}. Do not use "
                    "variables.\n");
        cJSON_ArrayForEach(tool, tools)
        {
            kvs_buf_add(&b, "\n");
            tb_json(&b, tool);
        }
        break;
    case FAM_HARMONY: harmony_tools(&b, tools); break;
    case FAM_GRANITE:
        if (t != SRV_CHAT_GRANITE30) { /* 3.1's to 3.3's tools turn: tools|tojson(indent=4) */
            srv_json_py(&b, tools, 4);
            break;
        }
        cJSON_ArrayForEach(tool, tools) /* 3.0's: each tool so, a blank line between */
        {
            if (tool != tools->child)
                kvs_buf_add(&b, "\n\n");
            srv_json_py(&b, tool, 4);
        }
        break;
    case FAM_MISTRAL:
    case FAM_MISTRAL3:
        kvs_buf_add(&b, "[AVAILABLE_TOOLS]");
        tb_json(&b, tools);
        kvs_buf_add(&b, "[/AVAILABLE_TOOLS]");
        break;
    case FAM_LFM2:
        if (t == SRV_CHAT_LFM25_8B) { /* today (local time, as strftime_now), then tools|tojson */
            char today[32];
            time_t now = time(NULL);
            struct tm tm;
            localtime_r(&now, &tm);
            if (!strftime(today, sizeof today, "%Y-%m-%d", &tm))
                today[0] = '\0';
            kvs_buf_add(&b, "Today's date: ");
            kvs_buf_add(&b, today);
            kvs_buf_add(&b, "\n\nList of tools: ");
            tb_json(&b, tools);
            break;
        }
        /* each tool tojson, ", " between: the same bytes as the list's tojson */
        kvs_buf_add(&b,
                    t == SRV_CHAT_LFM2 ? "List of tools: <|tool_list_start|>" : "List of tools: ");
        tb_json(&b, tools);
        if (t == SRV_CHAT_LFM2)
            kvs_buf_add(&b, "<|tool_list_end|>");
        break;
    }
    return kvs_buf_take(&b, out);
}

const char *srv_tools_system_sep(enum srv_chat_tmpl t, const char *system)
{
    if (family_of(t) != FAM_LFM2)
        return "\n\n";
    if (!*system) /* the templates add a separator only after a system text */
        return "";
    return t == SRV_CHAT_LFM25_8B ? "\n\n" : "\n";
}

/* A string inside a list or dict as llama.cpp's Jinja writes it: in single quotes, its
 * characters as they are (none escaped), unless it holds a single quote: then as a JSON string
 * (Python's repr would write 'x"y\'z' where llama.cpp writes "x\"y'z"). */
static void py_repr_str(kvs_buf *b, const char *s)
{
    if (strchr(s, '\'')) {
        cJSON *j = cJSON_CreateString(s);
        srv_json_py(b, j, 0);
        cJSON_Delete(j);
        return;
    }
    kvs_buf_add(b, "'");
    kvs_buf_add(b, s);
    kvs_buf_add(b, "'");
}

/* Jinja's `| string` of j, as llama.cpp's renderer writes it: Python's str() (True, False,
 * None; a list's or dict's items by repr), numbers as JSON writes them. */
static void py_str(kvs_buf *b, const cJSON *j, bool repr)
{
    if (cJSON_IsBool(j))
        kvs_buf_add(b, cJSON_IsTrue(j) ? "True" : "False");
    else if (cJSON_IsNull(j))
        kvs_buf_add(b, "None");
    else if (cJSON_IsString(j) && repr)
        py_repr_str(b, j->valuestring);
    else if (cJSON_IsString(j))
        kvs_buf_add(b, j->valuestring);
    else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        bool obj = cJSON_IsObject(j);
        kvs_buf_add(b, obj ? "{" : "[");
        const cJSON *it;
        cJSON_ArrayForEach(it, j)
        {
            if (it != j->child)
                kvs_buf_add(b, ", ");
            if (obj) {
                py_repr_str(b, it->string);
                kvs_buf_add(b, ": ");
            }
            py_str(b, it, true);
        }
        kvs_buf_add(b, obj ? "}" : "]");
    } else
        srv_json_py(b, j, 0);
}

int srv_tools_render_calls_apart(enum srv_chat_tmpl t, const cJSON *tool_calls, char **out)
{
    *out = NULL;
    if (t != SRV_CHAT_LFM25_8B)
        return 0;
    /* its format_arg_value: a string in single quotes as it is, a mapping tojson, anything
     * else `| string` */
    kvs_buf b = {0};
    kvs_buf_add(&b, "<|tool_call_start|>[");
    const cJSON *tc;
    cJSON_ArrayForEach(tc, tool_calls)
    {
        const cJSON *fn = get(tc, "function");
        const cJSON *args = get(fn, "arguments");
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (tc != tool_calls->child)
            kvs_buf_add(&b, ", ");
        kvs_buf_add(&b, get(fn, "name")->valuestring);
        kvs_buf_add(&b, "(");
        const cJSON *a, *obj = cJSON_IsObject(parsed) ? parsed : NULL;
        cJSON_ArrayForEach(a, obj)
        {
            if (a != parsed->child)
                kvs_buf_add(&b, ", ");
            kvs_buf_add(&b, a->string);
            kvs_buf_add(&b, "=");
            if (cJSON_IsString(a)) {
                kvs_buf_add(&b, "'");
                kvs_buf_add(&b, a->valuestring);
                kvs_buf_add(&b, "'");
            } else if (cJSON_IsObject(a)) {
                tb_json(&b, a);
            } else {
                py_str(&b, a, false);
            }
        }
        kvs_buf_add(&b, ")");
        cJSON_Delete(parsed);
    }
    kvs_buf_add(&b, "]<|tool_call_end|>");
    return kvs_buf_take(&b, out);
}

int srv_tools_render_calls(enum srv_chat_tmpl t, const char *content, const cJSON *tool_calls,
                           char **out)
{
    kvs_buf b = {0};
    kvs_buf_add(&b, content ? content : "");
    enum family f = family_of(t);
    if (f == FAM_MISTRAL)
        kvs_buf_add(&b, "[TOOL_CALLS][");
    if (f == FAM_MISTRAL3) {
        /* each call [TOOL_CALLS]name[ARGS]arguments|tojson: llama-server hands the template the
         * object the arguments string holds (so 2.50 is written 2.5) */
        const cJSON *tc;
        cJSON_ArrayForEach(tc, tool_calls)
        {
            const cJSON *fn = get(tc, "function");
            const cJSON *args = get(fn, "arguments");
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            kvs_buf_add(&b, "[TOOL_CALLS]");
            kvs_buf_add(&b, get(fn, "name")->valuestring);
            kvs_buf_add(&b, "[ARGS]");
            if (parsed)
                tb_json(&b, parsed);
            else
                kvs_buf_add(&b, "{}");
            cJSON_Delete(parsed);
        }
        return kvs_buf_take(&b, out);
    }
    /* Granite 3.1's and LFM2's templates write an assistant's content alone (LFM2.5-8B's
     * calls go apart: srv_tools_render_calls_apart) */
    if (f == FAM_GRANITE || f == FAM_LFM2)
        return kvs_buf_take(&b, out);
    const cJSON *tc;
    int i = 0;
    cJSON_ArrayForEach(tc, tool_calls)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        /* arguments arrive as a JSON string; written back as the object it holds */
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        cJSON *call = cJSON_CreateObject();
        if (!call || !cJSON_AddStringToObject(call, "name", name->valuestring) ||
            !cJSON_AddItemToObject(call, f == FAM_LLAMA3 ? "parameters" : "arguments",
                                   parsed ? parsed : cJSON_CreateObject())) {
            b.oom = true;
        }
        switch (f) {
        case FAM_HERMES:
            if (t == SRV_CHAT_GRANITE40) {
                /* a line before each call but a first one with no content before it; the
                 * name as it is, then the arguments tojson */
                kvs_buf_add(&b,
                            b.len ? "\n<tool_call>\n{\"name\": \"" : "<tool_call>\n{\"name\": \"");
                kvs_buf_add(&b, name->valuestring);
                kvs_buf_add(&b, "\", \"arguments\": ");
                tb_json(&b, cJSON_GetObjectItemCaseSensitive(call, "arguments"));
                kvs_buf_add(&b, "}\n</tool_call>");
                break;
            }
            kvs_buf_add(&b, b.len && b.p[b.len - 1] != '\n' ? "\n<tool_call>\n" : "<tool_call>\n");
            tb_json(&b, call);
            kvs_buf_add(&b, "\n</tool_call>");
            break;
        case FAM_LLAMA3:
            if (i)
                kvs_buf_add(&b, "; ");
            tb_json(&b, call);
            break;
        case FAM_MISTRAL:
            if (i)
                kvs_buf_add(&b, ", ");
            tb_json(&b, call);
            break;
        case FAM_MISTRAL3: /* written above */
        case FAM_HARMONY:  /* srv_tools_render_call_args and the renderer write them */
        case FAM_GRANITE:
        case FAM_LFM2: break;
        }
        cJSON_Delete(call);
        i++;
    }
    if (f == FAM_MISTRAL)
        kvs_buf_add(&b, "]");
    return kvs_buf_take(&b, out);
}

bool srv_tools_in_user_turn(enum srv_chat_tmpl t)
{
    return t == SRV_CHAT_LLAMA31 || t == SRV_CHAT_LLAMA32 || t == SRV_CHAT_GRANITE ||
           t == SRV_CHAT_GRANITE30 || t == SRV_CHAT_GRANITE32 || t == SRV_CHAT_GRANITE33 ||
           family_of(t) == FAM_MISTRAL3;
}

const char *srv_tools_merge_sep(enum srv_chat_tmpl t)
{
    if (t == SRV_CHAT_GRANITE40) /* each result opens with its own newline */
        return "";
    return family_of(t) == FAM_HERMES ? "\n" : NULL;
}

int srv_tools_render_result(enum srv_chat_tmpl t, const char *call_id, const char *content,
                            const char **role, char **out)
{
    kvs_buf b = {0};
    switch (family_of(t)) {
    case FAM_HERMES:
        *role = "user";
        if (t == SRV_CHAT_GRANITE40) /* its template writes a newline before each result */
            kvs_buf_add(&b, "\n");
        kvs_buf_add(&b, "<tool_response>\n");
        kvs_buf_add(&b, content);
        kvs_buf_add(&b, "\n</tool_response>");
        break;
    case FAM_LLAMA3:
        *role = "ipython";
        if (srv_tools_in_user_turn(t)) {
            /* Llama 3.1/3.2's templates pass any iterable content, a string too, through
             * tojson: the result is written as a JSON string */
            cJSON *str = cJSON_CreateString(content);
            srv_json_py(&b, str, 0);
            cJSON_Delete(str);
        } else {
            kvs_buf_add(&b, content);
        }
        break;
    case FAM_GRANITE: /* a turn of role tool, its content as it is */
        *role = "tool";
        kvs_buf_add(&b, content);
        break;
    case FAM_LFM2: /* a turn of role tool; LFM2's wraps the content in its markers */
        *role = "tool";
        if (t == SRV_CHAT_LFM2)
            kvs_buf_add(&b, "<|tool_response_start|>");
        kvs_buf_add(&b, content);
        if (t == SRV_CHAT_LFM2)
            kvs_buf_add(&b, "<|tool_response_end|>");
        break;
    case FAM_HARMONY: { /* the template writes message.content|tojson */
        *role = "tool";
        cJSON *str = cJSON_CreateString(content);
        srv_json_py(&b, str, 0);
        cJSON_Delete(str);
        break;
    }
    case FAM_MISTRAL3: /* a turn of role tool: [TOOL_RESULTS]content[/TOOL_RESULTS] */
        *role = "tool";
        kvs_buf_add(&b, "[TOOL_RESULTS]");
        kvs_buf_add(&b, content);
        kvs_buf_add(&b, "[/TOOL_RESULTS]");
        break;
    case FAM_MISTRAL: {
        *role = "user";
        cJSON *r = cJSON_CreateObject();
        if (!r || !cJSON_AddStringToObject(r, "call_id", call_id ? call_id : "") ||
            !cJSON_AddStringToObject(r, "content", content))
            b.oom = true;
        kvs_buf_add(&b, "[TOOL_RESULTS]");
        tb_json(&b, r);
        kvs_buf_add(&b, "[/TOOL_RESULTS]");
        cJSON_Delete(r);
        break;
    }
    }
    return kvs_buf_take(&b, out);
}

static bool tool_named(const cJSON *tools, const char *name)
{
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return true;
    }
    return false;
}

/* Adds the call in obj ({"name", "arguments" | "parameters"}) to calls if it names a tool and
 * its arguments are an object. Returns 1 if added, 0 if not a call, KVS_ENOMEM. */
static int add_call(cJSON *calls, const cJSON *obj, const cJSON *tools, const char *id_base)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    if (!cJSON_IsObject(obj) || !cJSON_IsString(name) || !cJSON_IsObject(args) ||
        !tool_named(tools, name->valuestring))
        return 0;
    char id[64];
    snprintf(id, sizeof id, "call_%s_%d", id_base, cJSON_GetArraySize(calls));
    char *a = cJSON_PrintUnformatted(args);
    cJSON *c = cJSON_CreateObject();
    bool ok = a && c && cJSON_AddStringToObject(c, "id", id) &&
              cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = ok ? cJSON_AddObjectToObject(c, "function") : NULL;
    ok = fn && cJSON_AddStringToObject(fn, "name", name->valuestring) &&
         cJSON_AddStringToObject(fn, "arguments", a);
    free(a);
    if (!ok) {
        cJSON_Delete(c);
        return KVS_ENOMEM;
    }
    cJSON_AddItemToArray(calls, c);
    return 1;
}

/* Parses the JSON value at the start of s (after whitespace); *end gets where it stopped. */
static cJSON *parse_at(const char *s, size_t len, const char **end)
{
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", s[i]) && s[i])
        i++;
    return cJSON_ParseWithLengthOpts(s + i, len - i, end, 0);
}

/* Bytes of s[0..n) before mark, or before a tail of s that may be mark's beginning. */
static size_t before_mark(const char *s, size_t n, const char *mark)
{
    size_t k = strlen(mark);
    for (size_t i = 0; i < n; i++) {
        size_t m = n - i < k ? n - i : k;
        if (!memcmp(s + i, mark, m))
            return i;
    }
    return n;
}

size_t srv_tools_stream_safe(enum srv_chat_tmpl t, const char *text, size_t len)
{
    switch (family_of(t)) {
    case FAM_HERMES: return before_mark(text, len, "<tool_call>");
    case FAM_MISTRAL:
    case FAM_MISTRAL3: return before_mark(text, len, "[TOOL_CALLS]");
    case FAM_GRANITE: return before_mark(text, len, "<|tool_call|>");
    case FAM_LFM2: return before_mark(text, len, "<|tool_call_start|>");
    case FAM_HARMONY: return before_mark(text, len, "<|start|>assistant to=functions.");
    case FAM_LLAMA3: {
        size_t i = 0;
        while (i < len && text[i] && strchr(" \t\r\n", text[i]))
            i++;
        return i == len || text[i] == '{' ? 0 : len;
    }
    }
    return 0;
}

/* ---- LFM2's calls: a Python list of calls, [f(a=1, b="x"), g()] ---- */

/* A cursor over the bytes [p, end) of one call block. */
typedef struct py_cur {
    const char *p, *end;
} py_cur;

static void py_ws(py_cur *c)
{
    while (c->p < c->end && strchr(" \t\r\n", *c->p) && *c->p)
        c->p++;
}

static bool py_eat(py_cur *c, char ch)
{
    py_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static bool py_ident_char(char ch, bool first)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
           (!first && ((ch >= '0' && ch <= '9') || ch == '.' || ch == '-'));
}

/* An identifier (a function name may hold dots and dashes, as tool names do) into buf. */
static bool py_ident(py_cur *c, char *buf, size_t cap)
{
    py_ws(c);
    size_t n = 0;
    while (c->p < c->end && py_ident_char(*c->p, n == 0)) {
        if (n + 1 >= cap)
            return false;
        buf[n++] = *c->p++;
    }
    buf[n] = '\0';
    return n > 0;
}

/* Appends code point u as UTF-8. */
static void utf8_add(kvs_buf *b, uint32_t u)
{
    char o[4];
    size_t n;
    if (u < 0x80) {
        o[0] = (char)u;
        n = 1;
    } else if (u < 0x800) {
        o[0] = (char)(0xC0 | u >> 6);
        o[1] = (char)(0x80 | (u & 0x3F));
        n = 2;
    } else if (u < 0x10000) {
        o[0] = (char)(0xE0 | u >> 12);
        o[1] = (char)(0x80 | (u >> 6 & 0x3F));
        o[2] = (char)(0x80 | (u & 0x3F));
        n = 3;
    } else {
        o[0] = (char)(0xF0 | u >> 18);
        o[1] = (char)(0x80 | (u >> 12 & 0x3F));
        o[2] = (char)(0x80 | (u >> 6 & 0x3F));
        o[3] = (char)(0x80 | (u & 0x3F));
        n = 4;
    }
    kvs_buf_addn(b, o, n);
}

/* n hex digits at p as a number; -1 if they are not all hex. */
static long hex_n(const char *p, const char *end, int n)
{
    long v = 0;
    for (int i = 0; i < n; i++) {
        if (p + i >= end)
            return -1;
        char ch = p[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A Python string literal in single or double quotes, its escapes decoded (an unknown escape
 * keeps its backslash, as Python's). NULL if unterminated or on allocation failure. */
static cJSON *py_string(py_cur *c)
{
    char q = *c->p++;
    kvs_buf b = {0};
    kvs_buf_add(&b, "");
    while (c->p < c->end && *c->p != q) {
        char ch = *c->p++;
        if (ch != '\\') {
            kvs_buf_addn(&b, &ch, 1);
            continue;
        }
        if (c->p >= c->end)
            break;
        char e = *c->p++;
        long u = -1;
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex && (u = hex_n(c->p, c->end, hex)) >= 0 && u <= 0x10FFFF) {
            c->p += hex;
            utf8_add(&b, (uint32_t)u);
            continue;
        }
        const char *plain = strchr("nrtbfv0", e);
        if (plain && e) {
            static const char k_out[] = "\n\r\t\b\f\v";
            char o = k_out[plain - "nrtbfv0"];
            kvs_buf_addn(&b, &o, 1);
        } else if (e == '\\' || e == '\'' || e == '"') {
            kvs_buf_addn(&b, &e, 1);
        } else if (e == '\n') { /* a line continuation */
        } else {
            kvs_buf_addn(&b, &ch, 1);
            kvs_buf_addn(&b, &e, 1);
        }
    }
    cJSON *s = NULL;
    if (c->p < c->end && !b.oom) {
        c->p++; /* the closing quote */
        s = cJSON_CreateString(b.p);
    }
    free(b.p);
    return s;
}

static cJSON *py_value(py_cur *c, int depth);

/* Items up to close (a list's ']', a tuple's ')', a dict's '}'), a trailing comma allowed;
 * into a JSON array, or for a dict an object whose keys are string literals. */
static cJSON *py_items(py_cur *c, char close, bool dict, int depth)
{
    cJSON *out = dict ? cJSON_CreateObject() : cJSON_CreateArray();
    while (out) {
        if (py_eat(c, close))
            return out;
        char *key = NULL;
        if (dict) {
            py_ws(c);
            cJSON *k = c->p < c->end && (*c->p == '\'' || *c->p == '"') ? py_string(c) : NULL;
            if (!k || !py_eat(c, ':')) {
                cJSON_Delete(k);
                break;
            }
            key = k->valuestring;
            k->valuestring = NULL;
            cJSON_Delete(k);
        }
        cJSON *v = py_value(c, depth + 1);
        bool ok = v && (dict ? cJSON_AddItemToObject(out, key, v) : cJSON_AddItemToArray(out, v));
        cJSON_free(key);
        if (!ok) {
            cJSON_Delete(v);
            break;
        }
        if (!py_eat(c, ',')) {
            if (py_eat(c, close))
                return out;
            break;
        }
    }
    cJSON_Delete(out);
    return NULL;
}

/* A Python literal (or JSON's): a string, a number, True/False/None (true/false/null), a list
 * or tuple (a JSON array), a dict. NULL if it is none of them. */
static cJSON *py_value(py_cur *c, int depth)
{
    py_ws(c);
    if (c->p >= c->end || depth > 64)
        return NULL;
    char ch = *c->p;
    if (ch == '\'' || ch == '"')
        return py_string(c);
    if (ch == '[' || ch == '(' || ch == '{') {
        c->p++;
        return py_items(c, ch == '[' ? ']' : ch == '(' ? ')' : '}', ch == '{', depth);
    }
    static const struct {
        const char *word;
        int kind; /* 0 false, 1 true, 2 null */
    } k_words[] = {{"True", 1}, {"true", 1}, {"False", 0}, {"false", 0}, {"None", 2}, {"null", 2}};
    for (size_t i = 0; i < sizeof k_words / sizeof k_words[0]; i++) {
        size_t n = strlen(k_words[i].word);
        if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, k_words[i].word, n) &&
            (c->p + n == c->end || !py_ident_char(c->p[n], false))) {
            c->p += n;
            return k_words[i].kind == 2 ? cJSON_CreateNull() : cJSON_CreateBool(k_words[i].kind);
        }
    }
    /* a number: JSON's form, a leading '+' allowed */
    char num[64];
    size_t n = 0;
    while (c->p + n < c->end && n < sizeof num - 1 && strchr("+-0123456789.eE", c->p[n]) && c->p[n])
        num[n] = c->p[n], n++;
    num[n] = '\0';
    if (!n)
        return NULL;
    char *e;
    double d = strtod(num, &e);
    if (e != num + n || !(num[0] == '-' || num[0] == '+' || (num[0] >= '0' && num[0] <= '9')))
        return NULL;
    c->p += n;
    return cJSON_CreateNumber(d);
}

/* A block's body as a JSON list of {"name", "arguments"} objects (only whitespace after it when
 * whole) into calls: the number added, 0 when it is not such a list of the tools' calls (then
 * nothing is added), or KVS_ENOMEM. */
static int json_calls(const char *body, size_t len, bool whole, const cJSON *tools,
                      const char *id_base, cJSON *calls)
{
    const char *jend = NULL;
    cJSON *j = parse_at(body, len, &jend);
    bool ok = cJSON_IsArray(j) && cJSON_GetArraySize(j) > 0;
    for (const char *q = jend; ok && whole && q < body + len; q++)
        ok = *q == ' ' || *q == '\t' || *q == '\r' || *q == '\n';
    int base = cJSON_GetArraySize(calls), n = 0, rc = 0;
    const cJSON *it;
    cJSON *list = ok ? j : NULL;
    cJSON_ArrayForEach(it, list)
    {
        int added = add_call(calls, it, tools, id_base);
        if (added <= 0) { /* an item that is not a call: the list is not calls */
            rc = added;
            n = 0;
            break;
        }
        n++;
    }
    while (!n && cJSON_GetArraySize(calls) > base)
        cJSON_DeleteItemFromArray(calls, base);
    cJSON_Delete(j);
    return rc < 0 ? rc : n;
}

/* One call block's body ([f(a=1), g()], the brackets optional) into calls. Returns the number
 * of calls naming one of tools (0 if the body is not a list of calls), or KVS_ENOMEM. */
static int py_calls(const char *body, size_t len, const cJSON *tools, const char *id_base,
                    cJSON *calls)
{
    py_cur c = {body, body + len};
    bool bracket = py_eat(&c, '[');
    cJSON *found = cJSON_CreateArray();
    if (!found)
        return KVS_ENOMEM;
    bool ok = true;
    while (ok) {
        char name[256];
        cJSON *obj = NULL, *args = NULL;
        ok = py_ident(&c, name, sizeof name) && py_eat(&c, '(');
        /* name=value pairs up to ')', a trailing comma allowed */
        args = ok ? cJSON_CreateObject() : NULL;
        ok = ok && args;
        bool closed = ok && py_eat(&c, ')');
        while (ok && !closed) { /* name=value, ..., a trailing comma allowed */
            char key[256];
            cJSON *v = py_ident(&c, key, sizeof key) && py_eat(&c, '=') ? py_value(&c, 0) : NULL;
            ok = v && cJSON_AddItemToObject(args, key, v);
            if (!ok)
                cJSON_Delete(v);
            else if (py_eat(&c, ','))
                closed = py_eat(&c, ')');
            else
                ok = closed = py_eat(&c, ')');
        }
        obj = ok && args ? cJSON_CreateObject() : NULL;
        ok = obj && cJSON_AddStringToObject(obj, "name", name) &&
             cJSON_AddItemToObject(obj, "arguments", args);
        if (ok)
            args = NULL;
        else
            cJSON_Delete(args);
        if (ok)
            cJSON_AddItemToArray(found, obj);
        else
            cJSON_Delete(obj);
        if (ok && !py_eat(&c, ','))
            break;
    }
    if (ok && bracket)
        ok = py_eat(&c, ']');
    py_ws(&c);
    ok = ok && c.p == c.end;
    int n = 0;
    const cJSON *it, *list = ok ? found : NULL;
    cJSON_ArrayForEach(it, list)
    {
        int added = add_call(calls, it, tools, id_base);
        if (added < 0) {
            n = added;
            break;
        }
        n += added;
    }
    cJSON_Delete(found);
    return n;
}

/* Mistral's current calls, [TOOL_CALLS]name[ARGS]{...} each (tokenizer v11 on): the text before
 * the first marker is content, each call's arguments the JSON object after [ARGS] (what follows
 * it up to the next marker, whitespace aside, must be nothing). false when the text has no
 * [TOOL_CALLS]name[ARGS] (the caller then reads v3's [TOOL_CALLS][{...}] list); else true, the
 * calls in arr and the content in rest, or every byte in rest when one of them is not a call of
 * the tools; *rc KVS_ENOMEM on failure. */
static bool mistral3_calls(const char *text, size_t len, const cJSON *tools, const char *id_base,
                           cJSON *arr, kvs_buf *rest, int *rc)
{
    static const char mark[] = "[TOOL_CALLS]", sep[] = "[ARGS]";
    const size_t mk = sizeof mark - 1, sk = sizeof sep - 1;
    const char *end = text + len, *first = NULL;
    for (const char *p = text; p + mk <= end; p++)
        if (!memcmp(p, mark, mk)) {
            first = p;
            break;
        }
    if (!first || first + mk >= end || first[mk] == '[')
        return false;
    bool ok = true;
    const char *p = first;
    while (ok && p < end && *rc >= 0) {
        const char *name = p + mk, *s = name;
        /* the name runs to [ARGS] (or, not a call, to the next marker; either whole inside
         * the text before it is compared) */
        while (s + sk <= end && memcmp(s, sep, sk) && (s + mk > end || memcmp(s, mark, mk)))
            s++;
        ok = p + mk <= end && !memcmp(p, mark, mk) && s + sk <= end && !memcmp(s, sep, sk) &&
             s > name && (size_t)(s - name) < 256;
        const char *jend = NULL;
        cJSON *args = ok ? parse_at(s + sk, (size_t)(end - s - sk), &jend) : NULL;
        cJSON *obj = cJSON_IsObject(args) ? cJSON_CreateObject() : NULL;
        char nm[256];
        if (ok) {
            memcpy(nm, name, (size_t)(s - name));
            nm[s - name] = '\0';
        }
        int added = 0;
        if (obj && cJSON_AddStringToObject(obj, "name", nm) &&
            cJSON_AddItemToObject(obj, "arguments", args)) {
            args = NULL;
            added = add_call(arr, obj, tools, id_base);
        } else if (cJSON_IsObject(args)) {
            added = KVS_ENOMEM;
        }
        cJSON_Delete(args);
        cJSON_Delete(obj);
        if (added < 0)
            *rc = added;
        ok = added > 0;
        if (ok) {
            p = jend;
            while (p < end && strchr(" \t\r\n", *p) && *p)
                p++;
        }
    }
    if (*rc < 0 || !ok) { /* not all calls of the tools: all content */
        cJSON *it;
        while ((it = cJSON_DetachItemFromArray(arr, 0)))
            cJSON_Delete(it);
        kvs_buf_addn(rest, text, len);
        return true;
    }
    kvs_buf_addn(rest, text, (size_t)(first - text));
    return true;
}

int srv_tools_parse(enum srv_chat_tmpl t, const char *text, size_t len, bool forced,
                    const cJSON *tools, const char *id_base, cJSON **calls, char **content)
{
    *calls = NULL;
    *content = NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return KVS_ENOMEM;
    kvs_buf rest = {0};
    int rc = 0;
    enum family f = forced ? FAM_LLAMA3 : family_of(t); /* forced: one bare object */
    if (f == FAM_HARMONY) {
        /* the reasoning splitter's pieces (reasoning.h): <|start|>assistant to=functions.NAME
         * <|channel|>commentary json<|message|>ARGS<|call|> */
        static const char open[] = "<|start|>assistant to=functions.", mid[] = "<|message|>",
                          close[] = "<|call|>";
        const char *p = text, *end = text + len;
        while (p < end && rc >= 0) {
            const char *o = strstr(p, open), *m = o ? strstr(o, mid) : NULL;
            const char *c = m ? strstr(m, close) : NULL;
            if (!c || c >= end) {
                kvs_buf_addn(&rest, p, (size_t)(end - p));
                break;
            }
            const char *name = o + sizeof open - 1, *ne = name;
            while (ne < m && *ne != '<' && *ne != ' ')
                ne++;
            const char *args = m + sizeof mid - 1;
            cJSON *obj = cJSON_CreateObject();
            cJSON *a = cJSON_ParseWithLength(args, (size_t)(c - args));
            int added = 0;
            if (!obj)
                added = KVS_ENOMEM;
            else if (a && cJSON_AddItemToObject(obj, "arguments", a)) {
                a = NULL;
                char nm[256];
                size_t nl = (size_t)(ne - name) < sizeof nm - 1 ? (size_t)(ne - name) : 0;
                memcpy(nm, name, nl);
                nm[nl] = '\0';
                added = nl && cJSON_AddStringToObject(obj, "name", nm)
                            ? add_call(arr, obj, tools, id_base)
                            : 0;
            }
            cJSON_Delete(a);
            cJSON_Delete(obj);
            if (added < 0) {
                rc = added;
                break;
            }
            kvs_buf_addn(&rest, p, (size_t)(o - p));
            if (!added) /* not a call of one of the tools: it stays text */
                kvs_buf_addn(&rest, o, (size_t)(c - o) + sizeof close - 1);
            p = c + sizeof close - 1;
        }
    } else if (f == FAM_HERMES) {
        static const char open[] = "<tool_call>", close[] = "</tool_call>";
        const char *p = text, *end = text + len;
        while (p < end && rc >= 0) {
            const char *o = strstr(p, open);
            if (!o || o >= end) {
                kvs_buf_addn(&rest, p, (size_t)(end - p));
                break;
            }
            const char *body = o + sizeof open - 1;
            const char *c = strstr(body, close);
            const char *stop = c && c < end ? c : end;
            const char *jend = NULL;
            cJSON *j = parse_at(body, (size_t)(stop - body), &jend);
            int added = j ? add_call(arr, j, tools, id_base) : 0;
            cJSON_Delete(j);
            if (added < 0) {
                rc = added;
                break;
            }
            kvs_buf_addn(&rest, p, (size_t)(o - p));
            if (!added) /* not a call: it stays text */
                kvs_buf_addn(&rest, o, (size_t)(stop - o) + (c && c < end ? sizeof close - 1 : 0));
            p = c && c < end ? c + sizeof close - 1 : end;
        }
    } else if (f == FAM_LFM2) {
        /* <|tool_call_start|>[f(a=1), ...]<|tool_call_end|>, the text around them content; the
         * block's list may be JSON's {"name", "arguments"} objects instead (llama.cpp's LFM2
         * form, and kvserve's forced calls: those end with the list, unclosed) */
        static const char open[] = "<|tool_call_start|>", close[] = "<|tool_call_end|>";
        const char *p = text, *end = text + len;
        while (p < end && rc >= 0) {
            const char *o = strstr(p, open);
            const char *body = o ? o + sizeof open - 1 : NULL;
            const char *c = body ? strstr(body, close) : NULL;
            bool closed = c && c < end;
            int added = 0;
            if (!closed && o && o < end) /* unclosed: a JSON list ending the text, or text */
                added = json_calls(body, (size_t)(end - body), true, tools, id_base, arr);
            if (!closed && added <= 0) {
                rc = added < 0 ? added : rc;
                kvs_buf_addn(&rest, p, (size_t)(end - p));
                break;
            }
            if (!closed) {
                kvs_buf_addn(&rest, p, (size_t)(o - p));
                break;
            }
            added = py_calls(body, (size_t)(c - body), tools, id_base, arr);
            if (added == 0)
                added = json_calls(body, (size_t)(c - body), true, tools, id_base, arr);
            if (added < 0) {
                rc = added;
                break;
            }
            kvs_buf_addn(&rest, p, (size_t)(o - p));
            if (!added) /* not calls of the tools: it stays text */
                kvs_buf_addn(&rest, o, (size_t)(c - o) + sizeof close - 1);
            p = c + sizeof close - 1;
        }
    } else if (f == FAM_LLAMA3) {
        /* one or more objects separated by ";" making up the whole text */
        const char *p = text, *end = text + len;
        while (p < end && rc >= 0) {
            const char *jend = NULL;
            cJSON *j = parse_at(p, (size_t)(end - p), &jend);
            int added = j ? add_call(arr, j, tools, id_base) : 0;
            cJSON_Delete(j);
            if (added <= 0) {
                rc = added < 0 ? added : 0;
                cJSON_Delete(arr);
                arr = cJSON_CreateArray(); /* not all calls: all content */
                break;
            }
            p = jend;
            while (p < end && strchr(" \t\r\n;", *p) && *p)
                p++;
        }
        if (!arr)
            rc = KVS_ENOMEM;
    } else if (f == FAM_MISTRAL3 && mistral3_calls(text, len, tools, id_base, arr, &rest, &rc)) {
        /* [TOOL_CALLS]name[ARGS]{...}, one after another (read by mistral3_calls) */
    } else { /* Mistral's [TOOL_CALLS] or Granite's <|tool_call|>, then a JSON list */
        const char *mark = f == FAM_GRANITE ? "<|tool_call|>" : "[TOOL_CALLS]";
        const char *m = strstr(text, mark);
        if (m && m < text + len) {
            const char *body = m + strlen(mark), *jend = NULL;
            cJSON *j = parse_at(body, len - (size_t)(body - text), &jend);
            const cJSON *it;
            int n = 0;
            cJSON *list = cJSON_IsArray(j) ? j : NULL;
            cJSON_ArrayForEach(it, list)
            {
                int added = add_call(arr, it, tools, id_base);
                if (added < 0)
                    rc = added;
                n += added > 0;
            }
            cJSON_Delete(j);
            kvs_buf_addn(&rest, text, (size_t)(m - text));
            if (!n && rc >= 0)
                kvs_buf_addn(&rest, m, len - (size_t)(m - text));
            else if (jend)
                kvs_buf_addn(&rest, jend, len - (size_t)(jend - text));
        } else {
            kvs_buf_addn(&rest, text, len);
        }
    }
    int n = arr ? cJSON_GetArraySize(arr) : 0;
    if (rc < 0 || rest.oom || n == 0) {
        cJSON_Delete(arr);
        free(rest.p);
        return rc < 0 ? rc : rest.oom ? KVS_ENOMEM : 0;
    }
    *calls = arr;
    *content = rest.p ? rest.p : calloc(1, 1);
    if (!*content) {
        cJSON_Delete(arr);
        *calls = NULL;
        return KVS_ENOMEM;
    }
    return n;
}
