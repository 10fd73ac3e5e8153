/* POST /v1/responses (OpenAI's Responses API), stateless: the request is translated into a
 * chat completion (input items -> messages, instructions -> a system message, text.format ->
 * response_format, flat function tools -> chat tools), validated by the same parser, run by
 * the same path, and answered as a response object or as typed SSE events (response.created,
 * response.output_text.delta, response.function_call_arguments.delta, response.completed, ...).
 * Nothing is stored: store true and previous_response_id are 400s. One output per request
 * (the API has no n). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "server/api.h"
#include "server/http_impl.h"
#include "server/tool_calls.h"

/* ---------- request: responses -> chat ---------- */

static int bad(srv_error *e, const char *param, const char *msg)
{
    return srv_error_set(e, 400, param, NULL, "%s", msg);
}

/* Text of a content value: a string, or parts of type input_text / output_text / text. */
static int item_text(const cJSON *content, const char *param, cJSON **out, srv_error *e)
{
    if (cJSON_IsString(content)) {
        *out = cJSON_CreateString(content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return bad(e, param, "'content' must be a string or an array of text parts");
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, content)
    {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) ||
            (strcmp(ty->valuestring, "input_text") && strcmp(ty->valuestring, "output_text") &&
             strcmp(ty->valuestring, "text")) ||
            !cJSON_IsString(tx))
            return bad(e, param,
                       "only content parts of type input_text / output_text are supported");
        len += strlen(tx->valuestring) + 1;
    }
    char *s = malloc(len + 1);
    if (!s)
        return srv_error_set(e, 500, NULL, NULL, "out of memory");
    size_t n = 0;
    cJSON_ArrayForEach(p, content)
    {
        const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        if (n)
            s[n++] = '\n';
        memcpy(s + n, tx, strlen(tx));
        n += strlen(tx);
    }
    s[n] = '\0';
    *out = cJSON_CreateString(s);
    free(s);
    return 0;
}

/* The messages of the chat request from instructions and input. */
static int input_messages(const cJSON *root, cJSON *msgs, srv_error *e)
{
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(root, "instructions");
    if (ins && !cJSON_IsNull(ins)) {
        if (!cJSON_IsString(ins))
            return bad(e, "instructions", "'instructions' must be a string");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
        cJSON_AddItemToArray(msgs, m);
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return 0;
    }
    if (!cJSON_IsArray(input) || !cJSON_GetArraySize(input))
        return bad(e, "input", "'input' must be a string or a non-empty array of items");
    cJSON *pending_calls = NULL; /* function_call items gather into one assistant message */
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, input)
    {
        char param[32];
        snprintf(param, sizeof param, "input[%d]", i++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        const char *type = cJSON_IsString(ty) ? ty->valuestring : "message";
        if (!cJSON_IsObject(it))
            return bad(e, param, "input items must be objects");
        if (!strcmp(type, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return bad(e, param, "a function_call item needs call_id, name and arguments");
            if (!pending_calls) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddNullToObject(m, "content");
                pending_calls = cJSON_AddArrayToObject(m, "tool_calls");
                cJSON_AddItemToArray(msgs, m);
            }
            cJSON *tc = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", id->valuestring);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddStringToObject(fn, "arguments", args->valuestring);
            cJSON_AddItemToArray(pending_calls, tc);
            continue;
        }
        pending_calls = NULL;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        if (!strcmp(type, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *out = cJSON_GetObjectItemCaseSensitive(it, "output");
            if (!cJSON_IsString(id) || !cJSON_IsString(out))
                return bad(e, param, "a function_call_output item needs call_id and output");
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", out->valuestring);
            continue;
        }
        if (strcmp(type, "message"))
            return srv_error_set(e, 400, param, NULL,
                                 "input items of type '%.40s' are not supported (message, "
                                 "function_call, function_call_output)",
                                 type);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role))
            return bad(e, param, "a message item needs a string 'role'");
        cJSON_AddStringToObject(m, "role", role->valuestring);
        cJSON *text = NULL;
        if (item_text(cJSON_GetObjectItemCaseSensitive(it, "content"), param, &text, e))
            return -1;
        cJSON_AddItemToObject(m, "content", text);
    }
    return 0;
}

/* Responses fields that have no stateless or implemented meaning here: 400 unless neutral. */
static int refuse_fields(const cJSON *root, srv_error *e)
{
    static const struct {
        const char *name, *neutral;
    } k[] = {
        {"previous_response_id", NULL}, {"conversation", NULL}, {"store", "false"},
        {"background", "false"},        {"include", "[]"},      {"prompt", NULL},
        {"max_tool_calls", NULL},       {"top_logprobs", NULL}, {"service_tier", "\"auto\""},
        {"truncation", "\"disabled\""},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, k[i].name);
        if (!it || cJSON_IsNull(it))
            continue;
        char *s = cJSON_PrintUnformatted(it);
        bool neutral = s && k[i].neutral && !strcmp(s, k[i].neutral);
        free(s);
        if (neutral)
            continue;
        if (!strcmp(k[i].name, "previous_response_id") || !strcmp(k[i].name, "store"))
            return srv_error_set(e, 400, k[i].name, "unsupported_parameter",
                                 "'%s' is not supported: this server is stateless and stores "
                                 "no responses (send the whole conversation as input)",
                                 k[i].name);
        return srv_error_set(e, 400, k[i].name, "unsupported_parameter",
                             "'%s' is not supported by this server", k[i].name);
    }
    return 0;
}

/* reasoning ({"effort": ...}): gpt-oss's template takes the effort (as the chat route's
 * reasoning_effort); other templates have none, and summaries are not written: 400s. */
static int reasoning_to_chat(const cJSON *root, enum srv_chat_tmpl tmpl, cJSON *chat, srv_error *e)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "reasoning");
    if (!rs || cJSON_IsNull(rs))
        return 0;
    if (tmpl != SRV_CHAT_HARMONY)
        return srv_error_set(e, 400, "reasoning", "unsupported_parameter",
                             "'reasoning' is not supported with this model's chat template (%s): "
                             "only gpt-oss's (harmony) takes a reasoning effort",
                             srv_chat_name(tmpl));
    if (!cJSON_IsObject(rs))
        return bad(e, "reasoning", "'reasoning' must be an object");
    const cJSON *it;
    cJSON_ArrayForEach(it, rs)
    {
        if (cJSON_IsNull(it))
            continue;
        if (strcmp(it->string, "effort"))
            return srv_error_set(e, 400, "reasoning", "unsupported_parameter",
                                 "reasoning.%.32s is not supported: only reasoning.effort",
                                 it->string);
        if (!cJSON_IsString(it) ||
            (strcmp(it->valuestring, "low") && strcmp(it->valuestring, "medium") &&
             strcmp(it->valuestring, "high")))
            return bad(e, "reasoning.effort",
                       "'reasoning.effort' must be \"low\", \"medium\" or \"high\"");
        cJSON_AddStringToObject(chat, "reasoning_effort", it->valuestring);
    }
    return 0;
}

/* The chat request body for root (a Responses request). */
static int to_chat(const cJSON *root, enum srv_chat_tmpl tmpl, cJSON **out, srv_error *e)
{
    *out = NULL;
    if (!cJSON_IsObject(root))
        return bad(e, NULL, "request body must be a JSON object");
    if (refuse_fields(root, e))
        return -1;
    cJSON *chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (input_messages(root, msgs, e) || reasoning_to_chat(root, tmpl, chat, e)) {
        cJSON_Delete(chat);
        return -1;
    }
    /* same meaning, same name */
    static const char *const same[] = {"model",
                                       "temperature",
                                       "top_p",
                                       "stream",
                                       "user",
                                       "parallel_tool_calls",
                                       "seed",
                                       "top_k",
                                       "min_p",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "stop",
                                       "logit_bias"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, same[i]);
        if (it)
            cJSON_AddItemToObject(chat, same[i], cJSON_Duplicate(it, true));
    }
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(root, "max_output_tokens");
    if (mot)
        cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(mot, true));
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (text && !cJSON_IsNull(text)) {
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(text, "format");
        if (!cJSON_IsObject(text) || (fmt && !cJSON_IsNull(fmt) && !cJSON_IsObject(fmt))) {
            cJSON_Delete(chat);
            return bad(e, "text.format", "'text' must be an object whose 'format' is an object");
        }
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(fmt, "type");
        if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "json_schema")) {
            /* flat in Responses ({type, name, schema, strict}), nested in chat */
            cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
            cJSON_AddStringToObject(rf, "type", "json_schema");
            cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
            const cJSON *f;
            cJSON_ArrayForEach(f, fmt)
            {
                if (strcmp(f->string, "type"))
                    cJSON_AddItemToObject(js, f->string, cJSON_Duplicate(f, true));
            }
        } else if (fmt && !cJSON_IsNull(fmt)) {
            cJSON_AddItemToObject(chat, "response_format", cJSON_Duplicate(fmt, true));
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) {
            cJSON_Delete(chat);
            return bad(e, "tools", "'tools' must be an array");
        }
        cJSON *ct = cJSON_AddArrayToObject(chat, "tools");
        const cJSON *t;
        int i = 0;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function")) {
                cJSON_Delete(chat);
                return srv_error_set(e, 400, "tools", NULL,
                                     "tools[%d]: only tools of type \"function\" are supported "
                                     "(no built-in tools)",
                                     i);
            }
            cJSON *w = cJSON_CreateObject();
            cJSON_AddStringToObject(w, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(w, "function");
            const cJSON *f;
            cJSON_ArrayForEach(f, t)
            {
                if (strcmp(f->string, "type"))
                    cJSON_AddItemToObject(fn, f->string, cJSON_Duplicate(f, true));
            }
            cJSON_AddItemToArray(ct, w);
            i++;
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (cJSON_IsObject(tc)) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
        cJSON *w = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(w, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(w, "function");
        if (cJSON_IsString(name))
            cJSON_AddStringToObject(fn, "name", name->valuestring);
    } else if (tc) {
        cJSON_AddItemToObject(chat, "tool_choice", cJSON_Duplicate(tc, true));
    }
    *out = chat;
    return 0;
}

/* Chat parameter names back to the Responses ones, for errors. */
static void rename_param(srv_error *e)
{
    static const struct {
        const char *from, *to;
    } k[] = {{"messages", "input"},
             {"max_tokens", "max_output_tokens"},
             {"response_format.json_schema.", "text.format."},
             {"response_format.", "text.format."},
             {"response_format", "text.format"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t n = strlen(k[i].from);
        if (!strncmp(e->param, k[i].from, n)) {
            char rest[48];
            snprintf(rest, sizeof rest, "%s", e->param + n);
            snprintf(e->param, sizeof e->param, "%s%s", k[i].to, rest);
            break;
        }
    }
    /* and in the message, where the field is named too */
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char *at = strstr(e->message, k[i].from);
        if (!at)
            continue;
        char tmp[sizeof e->message];
        size_t n = strlen(k[i].from);
        snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(at - e->message), e->message, k[i].to, at + n);
        snprintf(e->message, sizeof e->message, "%s", tmp);
        break;
    }
}

enum MHD_Result srv__route_responses(srv_conn *c)
{
    srv_error e;
    cJSON *root;
    if (srv_json_parse(c->body ? c->body : "", c->body_len, &root, &e))
        return srv__send_error(c, &e);
    cJSON *chat = NULL;
    if (to_chat(root, c->srv->chat.tmpl, &chat, &e)) {
        cJSON_Delete(root);
        return srv__send_error(c, &e);
    }
    /* what the response object repeats */
    c->resp_echo = cJSON_CreateObject();
    static const char *const echo[] = {
        "instructions", "max_output_tokens", "temperature",         "top_p", "tools", "tool_choice",
        "text",         "metadata",          "parallel_tool_calls", "user"};
    for (size_t i = 0; c->resp_echo && i < sizeof echo / sizeof echo[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, echo[i]);
        if (it)
            cJSON_AddItemToObject(c->resp_echo, echo[i], cJSON_Duplicate(it, true));
    }
    cJSON_Delete(root);
    char *body = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    if (!body || !c->resp_echo) {
        free(body);
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    }
    sampler_params defaults = sampler_default_params();
    int rc = srv_request_parse(body, strlen(body), true, &c->srv->chat, &defaults, &c->rq, &e);
    free(body);
    if (rc) {
        rename_param(&e);
        return srv__send_error(c, &e);
    }
    return srv__generate(c);
}

/* ---------- the response object and its events ---------- */

static void add_echo(srv_conn *c, cJSON *r, const char *key, cJSON *dflt)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->resp_echo, key);
    cJSON_AddItemToObject(r, key, it ? cJSON_Duplicate(it, true) : dflt);
    if (it)
        cJSON_Delete(dflt);
}

/* A finished choice cut by max_output_tokens is incomplete: the response and its message item
 * both say so (as OpenAI's do). */
static bool cut_short(const srv_choice *ch)
{
    return !ch->tool_calls && ch->finish == SCHED_FINISH_LENGTH;
}

static cJSON *message_item(srv_conn *c, const char *text, size_t len, bool done)
{
    char id[64];
    snprintf(id, sizeof id, "msg_%s", c->id + strlen("resp_"));
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status",
                            !done                       ? "in_progress"
                            : cut_short(&c->choices[0]) ? "incomplete"
                                                        : "completed");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "output_text");
        cJSON_AddItemToObject(p, "text", srv_json_string_n(text, len));
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddItemToArray(content, p);
    }
    return m;
}

/* A thinking model's reasoning (reasoning.h) as a reasoning item before the message, its text
 * as reasoning_text content (as vLLM gives gpt-oss's analysis channel); NULL text: none yet. */
static cJSON *reasoning_item(srv_conn *c, const char *text, bool done)
{
    char id[64];
    snprintf(id, sizeof id, "rs_%s", c->id + strlen("resp_"));
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "reasoning");
    cJSON_AddArrayToObject(m, "summary");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text);
        cJSON_AddItemToArray(content, p);
    }
    cJSON_AddStringToObject(m, "status", done ? "completed" : "in_progress");
    return m;
}

static cJSON *call_item(srv_conn *c, const cJSON *call, int i, bool with_args)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    char id[64];
    snprintf(id, sizeof id, "fc_%s_%d", c->id + strlen("resp_"), i);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "function_call");
    cJSON_AddStringToObject(m, "status", with_args ? "completed" : "in_progress");
    cJSON_AddStringToObject(m, "call_id",
                            cJSON_GetObjectItemCaseSensitive(call, "id")->valuestring);
    cJSON_AddStringToObject(m, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    cJSON_AddStringToObject(
        m, "arguments",
        with_args ? cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring : "");
    return m;
}

/* The response object: status in_progress (no output yet) or the final one. */
static cJSON *response_object(srv_conn *c, bool final)
{
    srv_choice *ch = &c->choices[0];
    bool incomplete = final && cut_short(ch);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", c->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)c->rx.created);
    cJSON_AddStringToObject(r, "status",
                            !final       ? "in_progress"
                            : incomplete ? "incomplete"
                                         : "completed");
    cJSON_AddNullToObject(r, "error");
    if (incomplete) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(r, "incomplete_details");
    }
    add_echo(c, r, "instructions", cJSON_CreateNull());
    add_echo(c, r, "max_output_tokens", cJSON_CreateNull());
    cJSON_AddStringToObject(r, "model", c->rx.model);
    cJSON *out = cJSON_AddArrayToObject(r, "output");
    if (final) {
        if (ch->reasoning)
            cJSON_AddItemToArray(out, reasoning_item(c, ch->reasoning, true));
        if (ch->len || !ch->tool_calls)
            cJSON_AddItemToArray(out, message_item(c, ch->text ? ch->text : "", ch->len, true));
        const cJSON *call;
        int i = 0;
        cJSON_ArrayForEach(call, ch->tool_calls)
        {
            cJSON_AddItemToArray(out, call_item(c, call, i++, true));
        }
    }
    add_echo(c, r, "parallel_tool_calls", cJSON_CreateTrue());
    cJSON_AddNullToObject(r, "previous_response_id");
    cJSON_AddFalseToObject(r, "store");
    add_echo(c, r, "temperature", cJSON_CreateNumber(c->rq.sampling.temperature));
    add_echo(c, r, "top_p", cJSON_CreateNumber(c->rq.sampling.top_p));
    cJSON *text = cJSON_CreateObject();
    cJSON_AddItemToObject(cJSON_AddObjectToObject(text, "format"), "type",
                          cJSON_CreateString("text"));
    add_echo(c, r, "text", text);
    add_echo(c, r, "tool_choice", cJSON_CreateString(c->rq.tools ? "auto" : "none"));
    add_echo(c, r, "tools", cJSON_CreateArray());
    add_echo(c, r, "metadata", cJSON_CreateObject());
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (final) {
        cJSON *u = cJSON_AddObjectToObject(r, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", c->prompt_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                                c->cached_tokens);
        cJSON_AddNumberToObject(u, "output_tokens", c->completion_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                                "reasoning_tokens", ch->reasoning_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", c->prompt_tokens + c->completion_tokens);
    } else {
        cJSON_AddNullToObject(r, "usage");
    }
    return r;
}

char *srv__responses_full(srv_conn *c)
{
    cJSON *r = response_object(c, true);
    char *s = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    return s;
}

/* "event: TYPE\ndata: {...}\n\n"; o gets "type" and "sequence_number" first. Takes o. */
static bool emit(srv_conn *c, const char *type, cJSON *o)
{
    if (!o)
        return false;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddNumberToObject(ev, "sequence_number", c->resp_seq++);
    const cJSON *it;
    cJSON_ArrayForEach(it, o)
    {
        cJSON_AddItemToObject(ev, it->string, cJSON_Duplicate(it, true));
    }
    cJSON_Delete(o);
    char *j = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    if (!j)
        return false;
    size_t n = strlen(j), tl = strlen(type);
    char *s = malloc(n + tl + 20);
    if (s)
        snprintf(s, n + tl + 20, "event: %s\ndata: %s\n\n", type, j);
    free(j);
    return srv__out_append(c, s);
}

static cJSON *with(const char *key, cJSON *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, key, v);
    return o;
}

bool srv__responses_start(srv_conn *c)
{
    return emit(c, "response.created", with("response", response_object(c, false))) &&
           emit(c, "response.in_progress", with("response", response_object(c, false)));
}

static cJSON *at(cJSON *o, int output_index, const char *item_id)
{
    cJSON_AddNumberToObject(o, "output_index", output_index);
    if (item_id)
        cJSON_AddStringToObject(o, "item_id", item_id);
    return o;
}

static bool message_open(srv_conn *c)
{
    if (c->resp_msg_open)
        return true;
    c->resp_msg_open = true;
    char id[64];
    snprintf(id, sizeof id, "msg_%s", c->id + strlen("resp_"));
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "output_text");
    cJSON_AddStringToObject(part, "text", "");
    cJSON_AddArrayToObject(part, "annotations");
    cJSON *p = at(with("part", part), c->resp_msg_index, id);
    cJSON_AddNumberToObject(p, "content_index", 0);
    return emit(c, "response.output_item.added",
                at(with("item", message_item(c, NULL, 0, false)), c->resp_msg_index, NULL)) &&
           emit(c, "response.content_part.added", p);
}

static bool text_delta(srv_conn *c, const char *text, size_t len)
{
    char id[64];
    snprintf(id, sizeof id, "msg_%s", c->id + strlen("resp_"));
    cJSON *d = at(with("delta", srv_json_string_n(text, len)), c->resp_msg_index, id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    return emit(c, "response.output_text.delta", d);
}

static bool message_close(srv_conn *c, const srv_choice *ch)
{
    char id[64];
    snprintf(id, sizeof id, "msg_%s", c->id + strlen("resp_"));
    const char *t = ch->text ? ch->text : "";
    cJSON *d = at(with("text", srv_json_string_n(t, ch->len)), c->resp_msg_index, id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "output_text");
    cJSON_AddItemToObject(part, "text", srv_json_string_n(t, ch->len));
    cJSON_AddArrayToObject(part, "annotations");
    cJSON *p = at(with("part", part), c->resp_msg_index, id);
    cJSON_AddNumberToObject(p, "content_index", 0);
    return emit(c, "response.output_text.done", d) && emit(c, "response.content_part.done", p) &&
           emit(c, "response.output_item.done",
                at(with("item", message_item(c, t, ch->len, true)), c->resp_msg_index, NULL));
}

/* The reasoning item's events, at output_index 0, before the message's. */
static bool reasoning_events(srv_conn *c, const char *text)
{
    char id[64];
    snprintf(id, sizeof id, "rs_%s", c->id + strlen("resp_"));
    cJSON *d = at(with("delta", cJSON_CreateString(text)), 0, id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON *t = at(with("text", cJSON_CreateString(text)), 0, id);
    cJSON_AddNumberToObject(t, "content_index", 0);
    return emit(c, "response.output_item.added",
                at(with("item", reasoning_item(c, NULL, false)), 0, NULL)) &&
           emit(c, "response.reasoning_text.delta", d) &&
           emit(c, "response.reasoning_text.done", t) &&
           emit(c, "response.output_item.done",
                at(with("item", reasoning_item(c, text, true)), 0, NULL));
}

/* The reasoning item's events as its text comes (a thinking model without tools): the item is
 * added with the first reasoning, each piece is a reasoning_text delta, and the item is done
 * when the answer begins or the output ends. */
static bool reasoning_delta(srv_conn *c, const char *text, size_t len)
{
    char id[64];
    snprintf(id, sizeof id, "rs_%s", c->id + strlen("resp_"));
    if (!c->resp_rs) {
        c->resp_rs = 1;
        if (!emit(c, "response.output_item.added",
                  at(with("item", reasoning_item(c, NULL, false)), 0, NULL)))
            return false;
    }
    kvs_buf_addn(&c->resp_rs_text, text, len);
    cJSON *d = at(with("delta", srv_json_string_n(text, len)), 0, id);
    cJSON_AddNumberToObject(d, "content_index", 0);
    return !c->resp_rs_text.oom && emit(c, "response.reasoning_text.delta", d);
}

static bool reasoning_close(srv_conn *c)
{
    if (c->resp_rs != 1)
        return true;
    c->resp_rs = 2;
    c->resp_msg_index = 1;
    char id[64];
    snprintf(id, sizeof id, "rs_%s", c->id + strlen("resp_"));
    const char *text = c->resp_rs_text.p ? c->resp_rs_text.p : "";
    cJSON *t = at(with("text", cJSON_CreateString(text)), 0, id);
    cJSON_AddNumberToObject(t, "content_index", 0);
    return emit(c, "response.reasoning_text.done", t) &&
           emit(c, "response.output_item.done",
                at(with("item", reasoning_item(c, text, true)), 0, NULL));
}

/* The calls' items (read at the end of the output), from output_index oi. */
static bool call_events(srv_conn *c, const srv_choice *ch, int oi)
{
    const cJSON *call;
    int i = 0;
    cJSON_ArrayForEach(call, ch->tool_calls)
    {
        cJSON *item = call_item(c, call, i, false);
        char id[64];
        snprintf(id, sizeof id, "%s", cJSON_GetObjectItemCaseSensitive(item, "id")->valuestring);
        const char *args = cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(call, "function"), "arguments")
                               ->valuestring;
        if (!emit(c, "response.output_item.added", at(with("item", item), oi + i, NULL)) ||
            !emit(c, "response.function_call_arguments.delta",
                  at(with("delta", cJSON_CreateString(args)), oi + i, id)) ||
            !emit(c, "response.function_call_arguments.done",
                  at(with("arguments", cJSON_CreateString(args)), oi + i, id)) ||
            !emit(c, "response.output_item.done",
                  at(with("item", call_item(c, call, i, true)), oi + i, NULL)))
            return false;
        i++;
    }
    return true;
}

/* A streamed event as it comes: a thinking model's text through the choice's splitter
 * (reasoning.h, as the chat route streams it), reasoning as the reasoning item's deltas, the
 * answer as the message's; the choice keeps the answer, and the reasoning once the output ends
 * (the final response object). Reasoning placed after the answer has begun (no template
 * writes it so) joins the reasoning text without events of its own. With tools (auto), the
 * answer is sent as far as it cannot be the start of a call (srv_tools_stream_safe, as the
 * chat route streams it: what is sent is a prefix of the content the whole answer parses to),
 * and the rest when the output ends and its calls are read, the calls' items after the
 * message. */
static bool stream_live(srv_conn *c, srv_choice *ch, const sched_event *ev, bool split, bool tools)
{
    kvs_buf r = {0}, t = {0};
    if (split) {
        srv__split_event(c, &ch->think, ev, &r, &t);
    } else {
        kvs_buf_addn(&t, ev->text, ev->text_len);
    }
    sched_event content = *ev;
    content.text = t.p ? t.p : "";
    content.text_len = t.len;
    bool ok = !r.oom && !t.oom && !srv_choice_add(ch, &content);
    if (ok && r.len)
        ok = c->resp_rs == 2 ? (kvs_buf_addn(&c->resp_rs_text, r.p, r.len), !c->resp_rs_text.oom)
                             : reasoning_delta(c, r.p, r.len);
    kvs_buf_free(&r);
    kvs_buf_free(&t);
    /* the answer's bytes that can be sent now: all of them, or with tools those that cannot
     * begin a call (the end waits for the calls to be read) */
    size_t safe = !tools ? ch->len
                  : ev->finish == SCHED_FINISH_NONE
                      ? srv_tools_stream_safe(c->srv->chat.tmpl, ch->text ? ch->text : "", ch->len)
                      : ch->sent;
    if (ok && safe > ch->sent) {
        ok = reasoning_close(c) && message_open(c) &&
             text_delta(c, ch->text + ch->sent, safe - ch->sent);
        ch->sent = safe;
    }
    if (!ok || ev->finish == SCHED_FINISH_NONE)
        return ok;
    if (!reasoning_close(c))
        return false;
    if (c->resp_rs_text.len) { /* for the final response object */
        free(ch->reasoning);
        if (kvs_buf_take(&c->resp_rs_text, &ch->reasoning))
            return false;
    }
    if (tools) {
        if (srv__read_tool_calls(c, 0, ch))
            return false;
        if (ch->len > ch->sent &&
            !(message_open(c) && text_delta(c, ch->text + ch->sent, ch->len - ch->sent)))
            return false;
        ch->sent = ch->len;
    }
    /* no message when the whole answer was calls */
    bool message = c->resp_msg_open || ch->len || !ch->tool_calls;
    if (message && !(message_open(c) && message_close(c, ch)))
        return false;
    return call_events(c, ch, c->resp_msg_index + message);
}

bool srv__responses_event(srv_conn *c, const sched_event *ev)
{
    srv_choice *ch = &c->choices[0];
    if (ev->finish == SCHED_FINISH_ERROR) {
        /* the stream ends with an error event (the Responses API's shape) */
        srv_error e;
        srv__error_of_status(ev->status, &e);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "code",
                                e.status == 503 ? "server_shutting_down" : "server_error");
        cJSON_AddStringToObject(o, "message", e.message);
        cJSON_AddNullToObject(o, "param");
        c->ss = SS_END;
        return emit(c, "error", o);
    }
    bool tools_on = c->rq.tools && c->rq.tool_choice != SRV_TOOLS_NONE;
    bool split = srv__splits_reasoning(c);
    if (ev->choice != 0)
        return true;
    if (!tools_on || c->rq.tool_choice == SRV_TOOLS_AUTO)
        return stream_live(c, ch, ev, split, tools_on);
    /* A forced call: the output is the call, held until it ends and is read (a thinking
     * model's reasoning item first) */
    if (srv_choice_add(ch, ev))
        return false;
    if (ev->finish == SCHED_FINISH_NONE)
        return true;
    if (split && srv_choice_split_reasoning(ch, c->srv->chat.tmpl))
        return false;
    if (ch->reasoning) {
        if (!reasoning_events(c, ch->reasoning))
            return false;
        c->resp_msg_index = 1;
    }
    if (srv__read_tool_calls(c, 0, ch))
        return false;
    int oi = c->resp_msg_index;
    if (ch->len || !ch->tool_calls) {
        if (!message_open(c) || (ch->len && !text_delta(c, ch->text, ch->len)) ||
            !message_close(c, ch))
            return false;
        oi++;
    }
    return call_events(c, ch, oi);
}

bool srv__responses_end(srv_conn *c)
{
    if (c->ss == SS_END)
        return true; /* an error event ended it */
    srv_choice *ch = &c->choices[0];
    bool incomplete = !ch->tool_calls && ch->finish == SCHED_FINISH_LENGTH;
    return emit(c, incomplete ? "response.incomplete" : "response.completed",
                with("response", response_object(c, true)));
}
