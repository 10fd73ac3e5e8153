/* Request validation. Every field is checked for type and range where it enters, and the
 * first bad field is reported by name; OpenAI fields not implemented are refused by name
 * (k_unsupported), fields no OpenAI API defines are ignored (clients send extras). */
#include "server/api.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/buf.h"
#include "common/status.h"
#include "server/json_schema.h"
#include "server/tool_calls.h"

static const char *type_for_status(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "unavailable_error";
    default: return "invalid_request_error";
    }
}

int srv_error_set(srv_error *e, int status, const char *param, const char *code, const char *fmt,
                  ...)
{
    e->status = status;
    e->type = type_for_status(status);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *srv_error_json(const srv_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (!err) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : type_for_status(e->status));
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void srv_request_free(srv_request *r)
{
    if (!r)
        return;
    free(r->model);
    free(r->prompt_text);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->logit_bias);
    grammar_def_destroy(r->grammar);
    cJSON_Delete(r->tools);
    free(r->tool_name);
    for (size_t i = 0; i < r->n_more; i++) {
        free(r->more[i].text);
        free(r->more[i].ids);
    }
    free(r->more);
    memset(r, 0, sizeof *r);
}

/* Field helpers: absent or null fields leave the default; a present field of the wrong type or
 * outside [lo, hi] is an error naming it. */
static int get_num(const cJSON *root, const char *key, double lo, double hi, bool integer,
                   double *out, bool *present, srv_error *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (present)
        *present = false;
    if (!it || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsNumber(it))
        return srv_error_set(e, 400, key, NULL, "'%s' must be %s", key,
                             integer ? "an integer" : "a number");
    double d = it->valuedouble;
    if (integer && (!isfinite(d) || d != floor(d)))
        return srv_error_set(e, 400, key, NULL, "'%s' must be an integer", key);
    if (!(d >= lo && d <= hi))
        return srv_error_set(e, 400, key, NULL, "'%s' must be between %g and %g, got %g", key, lo,
                             hi, d);
    *out = d;
    if (present)
        *present = true;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, bool *out, srv_error *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsBool(it))
        return srv_error_set(e, 400, key, NULL, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(it);
    return 0;
}

/* A positive double as a float that stays positive: 5e-324 is in (0, 1] but is 0 as a float,
 * which the sampler would reject with no field named. */
static float positive_float(double d)
{
    float f = (float)d;
    return f > 0 ? f : FLT_MIN;
}

static int oom(srv_error *e)
{
    return srv_error_set(e, 500, NULL, NULL, "out of memory");
}

static int parse_stop(const cJSON *root, srv_request *r, srv_error *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!it || cJSON_IsNull(it))
        return 0;
    if (cJSON_IsString(it)) {
        if (!it->valuestring[0])
            return 0;
        if (!(r->stop[0] = strdup(it->valuestring)))
            return oom(e);
        r->n_stop = 1;
        return 0;
    }
    if (!cJSON_IsArray(it))
        return srv_error_set(e, 400, "stop", NULL,
                             "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(it) > SRV_MAX_STOP)
        return srv_error_set(e, 400, "stop", NULL, "'stop' takes at most %d strings", SRV_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, it)
    {
        if (!cJSON_IsString(s))
            return srv_error_set(e, 400, "stop", NULL, "'stop' must be an array of strings");
        if (!s->valuestring[0])
            continue;
        if (!(r->stop[r->n_stop] = strdup(s->valuestring)))
            return oom(e);
        r->n_stop++;
    }
    return 0;
}

/* Token ids: any non-negative int32; the caller checks them against the vocabulary. */
static int parse_ids(const cJSON *arr, int32_t **ids, size_t *n_ids, srv_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0)
        return srv_error_set(e, 400, "prompt", NULL, "'prompt' must not be empty");
    *ids = malloc((size_t)n * sizeof **ids);
    if (!*ids)
        return oom(e);
    const cJSON *t;
    cJSON_ArrayForEach(t, arr)
    {
        double d = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!cJSON_IsNumber(t) || d != floor(d) || d < 0 || d > INT32_MAX)
            return srv_error_set(e, 400, "prompt", NULL,
                                 "'prompt' must be a string or an array of token ids");
        (*ids)[(*n_ids)++] = (int32_t)d;
    }
    return 0;
}

/* One element of a prompt array: a string or an array of token ids. */
static int parse_one(const cJSON *p, char **text, int32_t **ids, size_t *n_ids, srv_error *e)
{
    if (cJSON_IsString(p))
        return (*text = strdup(p->valuestring)) ? 0 : oom(e);
    if (cJSON_IsArray(p))
        return parse_ids(p, ids, n_ids, e);
    return srv_error_set(e, 400, "prompt", NULL,
                         "'prompt' must be a string, an array of token ids, or an array of "
                         "those");
}

static int parse_prompt(const cJSON *root, srv_request *r, srv_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p))
        return srv_error_set(e, 400, "prompt", NULL, "'prompt' is required");
    if (cJSON_IsString(p)) {
        if (!(r->prompt_text = strdup(p->valuestring)))
            return oom(e);
        return 0;
    }
    if (!cJSON_IsArray(p))
        return srv_error_set(e, 400, "prompt", NULL,
                             "'prompt' must be a string or an array of token ids");
    const cJSON *first = p->child;
    if (first && (cJSON_IsString(first) || cJSON_IsArray(first))) {
        /* A batch of prompts: each its own request in the scheduler, sharing the batch. */
        int n = cJSON_GetArraySize(p);
        if (n > SRV_MAX_PROMPTS)
            return srv_error_set(e, 400, "prompt", NULL, "'prompt' holds %d prompts; at most %d", n,
                                 SRV_MAX_PROMPTS);
        if (parse_one(first, &r->prompt_text, &r->prompt_ids, &r->n_prompt_ids, e))
            return -1;
        if (n > 1 && !(r->more = calloc((size_t)n - 1, sizeof *r->more)))
            return oom(e);
        for (const cJSON *it = first->next; it; it = it->next) {
            srv_prompt *q = &r->more[r->n_more++];
            if (parse_one(it, &q->text, &q->ids, &q->n_ids, e))
                return -1;
        }
        return 0;
    }
    return parse_ids(p, &r->prompt_ids, &r->n_prompt_ids, e);
}

/* Message content: a string, or an array of {"type":"text","text":...} parts joined by "\n".
 * Required (OpenAI allows it absent only on an assistant message with tool_calls). */
static int content_text(const cJSON *c, int i, char **out, srv_error *e)
{
    if (!c || cJSON_IsNull(c))
        return srv_error_set(e, 400, "messages", NULL, "messages[%d] needs a 'content'", i);
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : oom(e);
    }
    if (!cJSON_IsArray(c))
        return srv_error_set(e, 400, "messages", NULL,
                             "message 'content' must be a string or an array of text parts");
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text))
            return srv_error_set(e, 400, "messages", NULL,
                                 "only content parts of type 'text' are supported");
        len += strlen(text->valuestring) + 1;
    }
    char *s = malloc(len + 1);
    if (!s)
        return oom(e);
    size_t n = 0;
    cJSON_ArrayForEach(part, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (n)
            s[n++] = '\n';
        memcpy(s + n, t, strlen(t));
        n += strlen(t);
    }
    s[n] = '\0';
    *out = s;
    return 0;
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
 * "arguments": a JSON string}}]. */
static int check_tool_calls(const cJSON *tc, int i, srv_error *e)
{
    if (!cJSON_IsArray(tc) || !cJSON_GetArraySize(tc))
        return srv_error_set(e, 400, "messages", NULL,
                             "messages[%d].tool_calls must be a non-empty array", i);
    const cJSON *c;
    cJSON_ArrayForEach(c, tc)
    {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(c) ||
            (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"))) ||
            !cJSON_IsObject(fn) || !cJSON_IsString(name) || !cJSON_IsString(args))
            return srv_error_set(e, 400, "messages", NULL,
                                 "messages[%d].tool_calls: each call needs type \"function\" and "
                                 "function.name and function.arguments strings",
                                 i);
        cJSON *parsed = cJSON_Parse(args->valuestring);
        bool obj = cJSON_IsObject(parsed);
        cJSON_Delete(parsed);
        if (!obj)
            return srv_error_set(e, 400, "messages", NULL,
                                 "messages[%d].tool_calls: function.arguments must be a JSON "
                                 "object in a string",
                                 i);
    }
    return 0;
}

/* A reasoning effort (gpt-oss's "Reasoning:" line): "low", "medium" or "high", as its
 * template and OpenAI's reasoning_effort take it; anything else is a 400 naming param. */
static int effort_of(const cJSON *it, const char *param, const char *what, const char **out,
                     srv_error *e)
{
    static const char *const k[] = {"low", "medium", "high"};
    for (size_t i = 0; cJSON_IsString(it) && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(it->valuestring, k[i])) {
            *out = k[i];
            return 0;
        }
    return srv_error_set(e, 400, param, NULL, "'%s' must be \"low\", \"medium\" or \"high\"", what);
}

/* chat_template_kwargs (as vLLM and llama.cpp's server take it): the switches kvserve's
 * templates have are Qwen 3's and SmolLM3's enable_thinking, Granite 3.2's and 3.3's thinking
 * (their documents and controls are not taken: 400s), LFM2.5's keep_past_thinking (8B's
 * preserve_thinking) and gpt-oss's reasoning_effort and model_identity (its builtin_tools,
 * whose calls nothing here would read, are refused). There
 * is no Jinja here, so any other key, or a switch on a template without it, would be a value
 * accepted and ignored: a 400 instead. */
static int parse_template_kwargs(const cJSON *root, enum srv_chat_tmpl tmpl, srv_chat_opts *o,
                                 srv_error *e)
{
    memset(o, 0, sizeof *o);
    o->enable_thinking = -1;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (!kw || cJSON_IsNull(kw))
        return 0;
    if (!cJSON_IsObject(kw))
        return srv_error_set(e, 400, "chat_template_kwargs", NULL,
                             "'chat_template_kwargs' must be an object");
    const cJSON *it;
    cJSON_ArrayForEach(it, kw)
    {
        if (tmpl == SRV_CHAT_HARMONY && !strcmp(it->string, "reasoning_effort")) {
            if (effort_of(it, "chat_template_kwargs", "chat_template_kwargs.reasoning_effort",
                          &o->reasoning_effort, e))
                return -1;
            continue;
        }
        if (tmpl == SRV_CHAT_HARMONY && !strcmp(it->string, "model_identity")) {
            if (!cJSON_IsString(it))
                return srv_error_set(e, 400, "chat_template_kwargs", NULL,
                                     "chat_template_kwargs.model_identity must be a string");
            o->model_identity = it->valuestring; /* root outlives the rendering */
            continue;
        }
        /* LFM2.5's templates keep earlier answers' think blocks on their own switch */
        if ((tmpl == SRV_CHAT_LFM25 && !strcmp(it->string, "keep_past_thinking")) ||
            (tmpl == SRV_CHAT_LFM25_8B && !strcmp(it->string, "preserve_thinking"))) {
            if (!cJSON_IsBool(it))
                return srv_error_set(e, 400, "chat_template_kwargs", NULL,
                                     "chat_template_kwargs.%s must be a boolean", it->string);
            o->keep_thinking = cJSON_IsTrue(it);
            continue;
        }
        /* Granite 3.2's and 3.3's templates read "thinking" (llama-server hands it to them as
         * it is; vLLM and Hugging Face's renderer too), the others "enable_thinking" */
        bool granite = tmpl == SRV_CHAT_GRANITE32 || tmpl == SRV_CHAT_GRANITE33;
        if (strcmp(it->string, "enable_thinking") && strcmp(it->string, "thinking"))
            return srv_error_set(e, 400, "chat_template_kwargs", "unsupported_parameter",
                                 "chat_template_kwargs.%.64s is not supported: the only "
                                 "template switches are enable_thinking (Qwen 3, SmolLM3), "
                                 "thinking (Granite 3.2, 3.3), keep_past_thinking (LFM2.5), "
                                 "preserve_thinking (LFM2.5-8B-A1B), reasoning_effort and "
                                 "model_identity (gpt-oss)",
                                 it->string);
        if (!cJSON_IsBool(it))
            return srv_error_set(e, 400, "chat_template_kwargs", NULL,
                                 "chat_template_kwargs.%s must be a boolean", it->string);
        if (!srv_chat_has_thinking(tmpl))
            return srv_error_set(e, 400, "chat_template_kwargs", "unsupported_parameter",
                                 "chat_template_kwargs.%s: this model's chat template (%s) has "
                                 "no thinking switch",
                                 it->string, srv_chat_name(tmpl));
        if (granite != !strcmp(it->string, "thinking"))
            return srv_error_set(e, 400, "chat_template_kwargs", "unsupported_parameter",
                                 "chat_template_kwargs.%s: this model's chat template (%s) "
                                 "names its thinking switch chat_template_kwargs.%s",
                                 it->string, srv_chat_name(tmpl),
                                 granite ? "thinking" : "enable_thinking");
        o->enable_thinking = cJSON_IsTrue(it);
    }
    return 0;
}

/* An assistant turn sent back with its reasoning_content (as vLLM and llama.cpp return it):
 * for Qwen 3's template, the reasoning goes back in front as the think block the template
 * reads it from (the template then keeps or drops it by its own rule). SmolLM3's template
 * reads content only, so there the reasoning is not rendered (as llama.cpp renders it). */
static int add_reasoning(enum srv_chat_tmpl tmpl, const cJSON *msg, int i, char **text,
                         srv_error *e)
{
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (!rc || cJSON_IsNull(rc))
        return 0;
    if (!cJSON_IsString(rc))
        return srv_error_set(e, 400, "messages", NULL,
                             "messages[%d].reasoning_content must be a string", i);
    bool mistral = tmpl == SRV_CHAT_MISTRAL3_THINK;
    if ((mistral || tmpl == SRV_CHAT_MISTRAL3) && !*rc->valuestring)
        return 0; /* no thinking chunk for an empty one */
    /* llama-server hands Mistral's templates the reasoning as a thinking chunk before the
     * text: the Reasoning template writes it in [THINK] tags, the Instruct one raises */
    if (tmpl == SRV_CHAT_MISTRAL3)
        return srv_error_set(e, 400, "messages", NULL,
                             "messages[%d].reasoning_content: this model's template takes no "
                             "reasoning (its Instruct template raises on a thinking chunk)",
                             i);
    kvs_buf b = {0};
    kvs_buf_add(&b, mistral ? "[THINK]" : "<think>\n");
    kvs_buf_add(&b, rc->valuestring);
    kvs_buf_add(&b, mistral ? "[/THINK]" : "\n</think>\n\n");
    kvs_buf_add(&b, *text);
    char *s;
    if (kvs_buf_take(&b, &s))
        return oom(e);
    free(*text);
    *text = s;
    return 0;
}

/* The top-level reasoning_effort (OpenAI's, for its reasoning models): gpt-oss's template takes
 * it; with chat_template_kwargs.reasoning_effort too, both must agree. Other templates have no
 * such line: a 400 rather than a value accepted and ignored. */
static int parse_effort(const cJSON *root, enum srv_chat_tmpl tmpl, srv_chat_opts *o, srv_error *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (!it || cJSON_IsNull(it))
        return 0;
    if (tmpl != SRV_CHAT_HARMONY)
        return srv_error_set(e, 400, "reasoning_effort", "unsupported_parameter",
                             "'reasoning_effort' is not supported with this model's chat "
                             "template (%s): only gpt-oss's (harmony) has a reasoning effort",
                             srv_chat_name(tmpl));
    const char *v = NULL;
    if (effort_of(it, "reasoning_effort", "reasoning_effort", &v, e))
        return -1;
    if (o->reasoning_effort && strcmp(o->reasoning_effort, v))
        return srv_error_set(e, 400, "reasoning_effort", NULL,
                             "'reasoning_effort' (%s) and chat_template_kwargs.reasoning_effort "
                             "(%s) disagree",
                             v, o->reasoning_effort);
    o->reasoning_effort = v;
    return 0;
}

/* messages[i]'s role (developer read as system: OpenAI's newer name for it), content and
 * tool_calls (NULL when absent or null), checked as every template takes them; -1 with e. */
static int message_head(const cJSON *it, int i, const char **ro, const cJSON **content,
                        const cJSON **tc, srv_error *e)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    if (!cJSON_IsObject(it) || !cJSON_IsString(role))
        return srv_error_set(e, 400, "messages", NULL, "messages[%d] needs a string 'role'", i);
    *ro = !strcmp(role->valuestring, "developer") ? "system" : role->valuestring;
    if (strcmp(*ro, "system") && strcmp(*ro, "user") && strcmp(*ro, "assistant") &&
        strcmp(*ro, "tool"))
        return srv_error_set(e, 400, "messages", NULL,
                             "messages[%d]: role must be system, user, assistant or tool", i);
    *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    *tc = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
    if (cJSON_IsNull(*tc))
        *tc = NULL;
    if (*tc && strcmp(*ro, "assistant"))
        return srv_error_set(e, 400, "messages", NULL,
                             "messages[%d]: only assistant messages have tool_calls", i);
    return 0;
}

/* gpt-oss (harmony): messages with what the template reads beside each content (an
 * assistant's reasoning_content and first tool call; a tool result as the JSON string tojson
 * writes), checked against what the template refuses. */
static int parse_messages_harmony(const cJSON *msgs, srv_chat_opts *opts, srv_request *r,
                                  srv_error *e)
{
    int n = cJSON_GetArraySize(msgs);
    srv_chat_msg *m = calloc((size_t)n, sizeof *m);
    srv_chat_extra *x = calloc((size_t)n, sizeof *x);
    char **owned = calloc((size_t)n * 3, sizeof *owned); /* content, thinking, call_args */
    int rc = 0, i = 0;
    if (!m || !x || !owned) {
        rc = oom(e);
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, msgs)
    {
        const char *ro;
        const cJSON *content, *tc;
        if ((rc = message_head(it, i, &ro, &content, &tc, e)))
            goto out;
        bool has_calls = tc != NULL;
        char **text = &owned[3 * i];
        if (has_calls && (rc = check_tool_calls(tc, i, e)))
            goto out;
        if (has_calls && (!content || cJSON_IsNull(content))) {
            if (!(*text = strdup(""))) {
                rc = oom(e);
                goto out;
            }
        } else if ((rc = content_text(content, i, text, e))) {
            goto out;
        }
        if (!strcmp(ro, "tool")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "tool_call_id");
            if (!cJSON_IsString(id)) {
                rc = srv_error_set(e, 400, "messages", NULL,
                                   "messages[%d]: a tool message needs a string 'tool_call_id'", i);
                goto out;
            }
            const char *rr;
            char *json = NULL;
            if (srv_tools_render_result(SRV_CHAT_HARMONY, id->valuestring, *text, &rr, &json)) {
                rc = oom(e);
                goto out;
            }
            free(*text);
            *text = json;
        }
        if (!strcmp(ro, "assistant")) {
            const cJSON *rcj = cJSON_GetObjectItemCaseSensitive(it, "reasoning_content");
            if (rcj && !cJSON_IsNull(rcj) && !cJSON_IsString(rcj)) {
                rc = srv_error_set(e, 400, "messages", NULL,
                                   "messages[%d].reasoning_content must be a string", i);
                goto out;
            }
            x[i].thinking = cJSON_IsString(rcj) ? rcj->valuestring : NULL;
            if (has_calls) {
                const cJSON *fn =
                    cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tc, 0), "function");
                x[i].call_name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
                if (srv_tools_render_call_args(SRV_CHAT_HARMONY, tc, &owned[3 * i + 2])) {
                    rc = oom(e);
                    goto out;
                }
                x[i].call_args = owned[3 * i + 2];
            }
        }
        m[i].role = ro;
        m[i].content = *text;
        i++;
    }
    opts->extra = x;
    size_t bad = 0;
    const char *why = srv_chat_check(SRV_CHAT_HARMONY, m, (size_t)n, opts, &bad);
    if (why)
        rc = srv_error_set(e, 400, "messages", NULL, "messages[%zu]: %s", bad, why);
    else if (srv_chat_render(SRV_CHAT_HARMONY, m, (size_t)n, opts, &r->prompt_text))
        rc = oom(e);
out:
    if (owned)
        for (int q = 0; q < 3 * n; q++)
            free(owned[q]);
    free(owned);
    free(x);
    free(m);
    return rc;
}

static int parse_messages(const cJSON *root, const srv_chat_fmt *fmt, srv_request *r, srv_error *e)
{
    enum srv_chat_tmpl tmpl = fmt->tmpl;
    srv_chat_opts opts;
    if (parse_template_kwargs(root, tmpl, &opts, e) || parse_effort(root, tmpl, &opts, e))
        return -1;
    opts.default_system = fmt->default_system;
    opts.granite_spaced = fmt->granite_spaced;
    opts.eos_text = fmt->eos_text;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs || cJSON_IsNull(msgs))
        return srv_error_set(e, 400, "messages", NULL, "'messages' is required");
    if (!cJSON_IsArray(msgs))
        return srv_error_set(e, 400, "messages", NULL, "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return srv_error_set(e, 400, "messages", NULL, "'messages' must not be empty");
    if (tmpl == SRV_CHAT_HARMONY) {
        bool tools_on = r->tools && r->tool_choice != SRV_TOOLS_NONE;
        char *tools_dev = NULL;
        if (tools_on && srv_tools_render_system(tmpl, r->tools, &tools_dev))
            return oom(e);
        opts.tools_dev = tools_dev;
        int rc = parse_messages_harmony(msgs, &opts, r, e);
        free(tools_dev);
        return rc;
    }
    /* one more slot: the tools' system text when the request has no system message */
    char *tools_user = NULL; /* the tools' text where a template puts it in the first user turn */
    srv_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    char **texts = calloc((size_t)n + 1, sizeof *texts);
    /* what an assistant turn carries beside its content (LFM2.5-8B-A1B: its calls), owned */
    srv_chat_extra *x = calloc((size_t)n + 1, sizeof *x);
    char **calls = calloc((size_t)n + 1, sizeof *calls);
    int rc = 0, i = 0, k = 0;
    if (!m || !texts || !x || !calls) {
        rc = oom(e);
        goto out;
    }
    opts.extra = x;
    bool tools_on = r->tools && r->tool_choice != SRV_TOOLS_NONE;
    if (tools_on && srv_tools_in_user_turn(tmpl)) {
        if (srv_tools_render_system(tmpl, r->tools, &tools_user)) {
            rc = oom(e);
            goto out;
        }
        opts.tools_user = tools_user;
    } else if (tools_on) {
        if (srv_tools_render_system(tmpl, r->tools, &texts[0])) {
            rc = oom(e);
            goto out;
        }
        const cJSON *r0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, 0), "role");
        bool has_system = cJSON_IsString(r0) && (!strcmp(r0->valuestring, "system") ||
                                                 !strcmp(r0->valuestring, "developer"));
        if (fmt->default_system && !has_system) {
            /* the tools' system turn opens with the default text, as Qwen 2.5's template does */
            kvs_buf b = {0};
            kvs_buf_add(&b, fmt->default_system);
            kvs_buf_add(&b, "\n\n");
            kvs_buf_add(&b, texts[0]);
            free(texts[0]);
            if (kvs_buf_take(&b, &texts[0])) {
                rc = oom(e);
                goto out;
            }
        }
        m[0].role = "system";
        m[0].content = texts[0];
        k = 1;
    }
    bool prev_tool = false; /* the message before was a tool result */
    const cJSON *it;
    cJSON_ArrayForEach(it, msgs)
    {
        const char *ro;
        const cJSON *content, *tc;
        if ((rc = message_head(it, i, &ro, &content, &tc, e)))
            goto out;
        bool has_calls = tc != NULL;
        char *text = NULL;
        if (has_calls) {
            if ((rc = check_tool_calls(tc, i, e)))
                goto out;
            if (content && !cJSON_IsNull(content) && (rc = content_text(content, i, &text, e)))
                goto out;
            if ((tmpl == SRV_CHAT_MISTRAL3 || tmpl == SRV_CHAT_MISTRAL3_THINK) &&
                (rc =
                     text || (text = strdup("")) ? add_reasoning(tmpl, it, i, &text, e) : oom(e))) {
                free(text);
                goto out;
            }
            int rr = srv_tools_render_calls(tmpl, text, tc, &texts[k]);
            free(text);
            if (!rr)
                rr = srv_tools_render_calls_apart(tmpl, tc, &calls[k]);
            x[k].calls = calls[k];
            /* the first call's name marks a turn with calls (srv_chat_check) */
            x[k].call_name = cJSON_GetObjectItemCaseSensitive(
                                 cJSON_GetObjectItemCaseSensitive(tc->child, "function"), "name")
                                 ->valuestring;
            if (rr) {
                rc = oom(e);
                goto out;
            }
        } else if (!strcmp(ro, "tool")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "tool_call_id");
            if (!cJSON_IsString(id)) {
                rc = srv_error_set(e, 400, "messages", NULL,
                                   "messages[%d]: a tool message needs a string 'tool_call_id'", i);
                goto out;
            }
            if ((rc = content_text(content, i, &text, e)))
                goto out;
            int rr = srv_tools_render_result(tmpl, id->valuestring, text, &ro, &texts[k]);
            free(text);
            if (rr) {
                rc = oom(e);
                goto out;
            }
            const char *merge = srv_tools_merge_sep(tmpl);
            if (prev_tool && merge) {
                /* results in a row share one turn (Qwen's templates: a line apart) */
                kvs_buf b = {0};
                kvs_buf_add(&b, texts[k - 1]);
                kvs_buf_add(&b, merge);
                kvs_buf_add(&b, texts[k]);
                free(texts[k - 1]);
                free(texts[k]);
                texts[k] = NULL;
                if (kvs_buf_take(&b, &texts[k - 1])) {
                    rc = oom(e);
                    goto out;
                }
                m[k - 1].content = texts[k - 1];
                i++;
                continue;
            }
            prev_tool = true;
        } else if ((rc = content_text(content, i, &texts[k], e))) {
            goto out;
        } else if (!strcmp(ro, "assistant") &&
                   (tmpl == SRV_CHAT_QWEN3 || tmpl == SRV_CHAT_MISTRAL3 ||
                    tmpl == SRV_CHAT_MISTRAL3_THINK) &&
                   (rc = add_reasoning(tmpl, it, i, &texts[k], e))) {
            goto out;
        }
        if (k == 1 && tools_on && !tools_user && !strcmp(ro, "system") && i == 0) {
            /* the request's own system message first, then the tools */
            const char *sep = srv_tools_system_sep(tmpl, texts[1]);
            size_t a = strlen(texts[1]), b = strlen(texts[0]), c = strlen(sep);
            char *s = malloc(a + b + c + 1);
            if (!s) {
                rc = oom(e);
                goto out;
            }
            memcpy(s, texts[1], a);
            memcpy(s + a, sep, c);
            memcpy(s + a + c, texts[0], b + 1);
            free(texts[0]);
            free(texts[1]);
            texts[1] = NULL;
            texts[0] = s;
            m[0].content = s;
            i++;
            continue;
        }
        if (strcmp(cJSON_GetObjectItemCaseSensitive(it, "role")->valuestring, "tool"))
            prev_tool = false;
        m[k].role = ro;
        m[k].content = texts[k];
        i++;
        k++;
    }
    size_t bad = 0;
    const char *why = srv_chat_check(tmpl, m, (size_t)k, &opts, &bad);
    if (why) /* (k counts the messages as the request has them: no system slot was added) */
        rc = srv_error_set(e, 400, "messages", NULL, "messages[%zu]: %s", bad, why);
    else if (srv_chat_render(tmpl, m, (size_t)k, &opts, &r->prompt_text))
        rc = oom(e);
out:
    free(tools_user);
    if (texts)
        for (int q = 0; q <= n; q++)
            free(texts[q]);
    if (calls)
        for (int q = 0; q <= n; q++)
            free(calls[q]);
    free(texts);
    free(calls);
    free(x);
    free(m);
    return rc;
}

/* A forced call's grammar in the family's own syntax, built in b from root (rc: how the
 * building went, err its message), compiled in place of the generic one; b is destroyed. */
static int native_grammar(srv_request *r, grammar_builder *b, int rc, int32_t root, char *err,
                          size_t err_len, srv_error *e)
{
    grammar_def *g = NULL;
    if (!rc)
        rc = grammar_builder_finish(b, root, NULL, &g, err, err_len);
    grammar_builder_destroy(b);
    if (rc == KVS_ENOMEM)
        return oom(e);
    if (rc) /* compiled already as the generic grammar: not expected */
        return srv_error_set(e, 400, "tools", NULL, "%s", err);
    grammar_def_destroy(r->grammar);
    r->grammar = g;
    r->tool_native = true;
    return 0;
}

/* gpt-oss (harmony) with a forced call: the call is written as gpt-oss writes calls, after
 * the prompt's "<|start|>assistant" (where the assistant's turn begins, as unforced), and may
 * follow an analysis message, as llama.cpp's grammar for "required" lets it
 * (common_chat_params_init_gpt_oss), so the model reasons first as it was trained to:
 *   [<|channel|>analysis<|message|>TEXT<|end|><|start|>assistant]
 *   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>
 * TEXT is free text up to its first <|end|> (grammar_builder_text_until), NAME one of the
 * tools' names (the named function's for a named choice: llama.cpp's server reads tool_choice
 * as a string only, so a named one is "auto" there) and ARGS that tool's arguments
 * (srv_json_schema_tool_calls with a separator: raw text, then JSON). <|end|>, <|start|>,
 * <|channel|>, <|constrain|> and <|message|> are special tokens, but the harmony vocabulary writes
 * them out as their text (engine/tokenizer.c fix_harmony), so the grammar's vocabulary trie holds
 * them as those bytes and the model may write each as the one token it was trained on. The output
 * ends at <|call|>, an end-of-generation token the grammar allows once the arguments are complete,
 * and is read as an unforced call is (the splitter, reasoning.h: the analysis is
 * reasoning_content). llama.cpp's grammar also lets a commentary preamble (content) come before the
 * call; this one does not. parallel_tool_calls: gpt-oss writes one call per message and ends its
 * generation there, so a forced call is one call (as llama.cpp's grammar allows one), whatever
 * parallel_tool_calls says. */
static int harmony_grammar(srv_request *r, srv_error *e)
{
    static const char call_head[] = "<|channel|>commentary to=functions.",
                      sep[] = " <|constrain|>json<|message|>",
                      analysis[] = "<|channel|>analysis<|message|>", end[] = "<|end|>",
                      next[] = "<|start|>assistant";
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, r->tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        bool chosen = r->tool_name && !strcmp(name->valuestring, r->tool_name);
        /* the header's name ends at a space or a marker (tool_calls.c, reasoning.c): a name
         * with one could be written but not read back */
        if ((!r->tool_name || chosen) && strpbrk(name->valuestring, " \t\n\r<"))
            return srv_error_set(e, 400, "tools", NULL,
                                 "tools[%d].function.name: a forced call of gpt-oss's format "
                                 "cannot name a function whose name has whitespace or '<'",
                                 i);
        i++;
    }
    grammar_builder *b = NULL;
    char err[200] = "";
    int32_t calls, call, after, text, think, alt[2], root = -1;
    int rc = grammar_builder_create(&b);
    if (!rc)
        rc = srv_json_schema_tool_calls(b, r->tools, r->tool_name, sep, &calls, err, sizeof err);
    if (!rc)
        rc = grammar_builder_prefixed(b, call_head, sizeof call_head - 1, calls, &call);
    if (!rc)
        rc = grammar_builder_prefixed(b, next, sizeof next - 1, call, &after);
    if (!rc)
        rc = grammar_builder_text_until(b, end, sizeof end - 1, after, &text);
    if (!rc)
        rc = grammar_builder_prefixed(b, analysis, sizeof analysis - 1, text, &think);
    if (!rc) {
        alt[0] = call;
        alt[1] = think;
        rc = grammar_builder_any_of(b, 2, alt, &root);
    }
    return native_grammar(r, b, rc, root, err, sizeof err, e);
}

/* A forced call in a family's marker syntax, as llama.cpp's grammars force them: the marker
 * (Granite's <|tool_call|>, common_chat_params_init_granite; LFM2's <|tool_call_start|>) then a
 * JSON list of the tools' {"name", "arguments"} objects, read back by the family's unforced
 * reader (tool_calls.c; LFM2's block then ends with the list, unclosed). The marker is a special
 * token, but these vocabularies write it out as its text (engine/tokenizer.c fix_granite,
 * fix_lfm2), so the grammar's vocabulary trie holds it as those bytes and the model may write
 * it as the one token it was trained on. The list holds one call or more for "required" with
 * parallel_tool_calls (OpenAI's default), exactly one for a named function or with
 * parallel_tool_calls false (llama.cpp's grammar allows more whatever it says). */
static int marker_grammar(srv_request *r, const char *mark, srv_error *e)
{
    grammar_builder *b = NULL;
    char err[200] = "";
    int32_t calls, list, root = -1;
    uint32_t most = r->tool_name || !r->parallel_tool_calls ? 1 : 0;
    int rc = grammar_builder_create(&b);
    if (!rc)
        rc = srv_json_schema_tool_calls(b, r->tools, r->tool_name, NULL, &calls, err, sizeof err);
    if (!rc)
        rc = grammar_builder_array_bounded(b, calls, 1, most, &list);
    if (!rc)
        rc = grammar_builder_prefixed(b, mark, strlen(mark), list, &root);
    return native_grammar(r, b, rc, root, err, sizeof err, e);
}

/* One forced call in a family's tag syntax: the opening text (raw, which the model may write as
 * the one special token it was trained on: its vocabulary prints it, engine/tokenizer.c) then
 * one of the tools' calls, its name and arguments apart where sep says (srv_json_schema_tool_calls:
 * raw text between them), else one {"name", "arguments"} object; the generation ends with the
 * call, read back by the family's unforced reader (tool_calls.c). One call whatever
 * parallel_tool_calls says (the builder has no repetition of a raw-text node), and nothing
 * before it (a reasoning block): the grammar holds from the first token.
 *   Granite 4.0: "<tool_call>\n" then the object; the grammar has no way to ask for text after a
 *     value, so the block's closing "\n</tool_call>" is not written, and the Hermes reader takes
 *     a block left open at the end of the text as a call.
 *   Mistral's current format: "[TOOL_CALLS]" NAME "[ARGS]" ARGS, as llama.cpp's grammar for
 *     Ministral 3 / Magistral forces it. */
static int tag_grammar(srv_request *r, const char *open, const char *sep, srv_error *e)
{
    grammar_builder *b = NULL;
    char err[200] = "";
    int32_t calls, root = -1;
    int rc = grammar_builder_create(&b);
    if (!rc)
        rc = srv_json_schema_tool_calls(b, r->tools, r->tool_name, sep, &calls, err, sizeof err);
    if (!rc)
        rc = grammar_builder_prefixed(b, open, strlen(open), calls, &root);
    return native_grammar(r, b, rc, root, err, sizeof err, e);
}

/* tools, tool_choice, parallel_tool_calls (chat). A forced choice ("required" or a named
 * function) compiles the calls' grammar: the bare {"name", "arguments"} object, or the
 * family's own call syntax where kvserve writes it (gpt-oss, Granite, LFM2, Mistral's current
 * format; Granite 4.0's unclosed). */
static int parse_tools(const cJSON *root, enum srv_chat_tmpl tmpl, srv_request *r, srv_error *e)
{
    r->tool_choice = SRV_TOOLS_NONE;
    r->parallel_tool_calls = true;
    if (get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e))
        return -1;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    bool have = tools && !cJSON_IsNull(tools);
    if (have) {
        if (!cJSON_IsArray(tools))
            return srv_error_set(e, 400, "tools", NULL, "'tools' must be an array");
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
            if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
                return srv_error_set(e, 400, "tools", NULL,
                                     "tools[%d]: only tools of type \"function\" are supported", i);
            if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0] ||
                (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc)) ||
                (params && !cJSON_IsNull(params) && !cJSON_IsObject(params)) ||
                (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict)))
                return srv_error_set(e, 400, "tools", NULL,
                                     "tools[%d].function needs a non-empty string 'name' (and "
                                     "'description' a string, 'parameters' an object)",
                                     i);
            i++;
        }
        if (i == 0)
            have = false; /* tools: [] asks for nothing */
    }
    if (!choice || cJSON_IsNull(choice)) {
        r->tool_choice = have ? SRV_TOOLS_AUTO : SRV_TOOLS_NONE;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
        r->tool_choice = SRV_TOOLS_NONE;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")) {
        r->tool_choice = SRV_TOOLS_AUTO;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
        r->tool_choice = SRV_TOOLS_REQUIRED;
    } else if (cJSON_IsObject(choice)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(name))
            return srv_error_set(e, 400, "tool_choice", NULL,
                                 "'tool_choice' must be none, auto, required or {\"type\": "
                                 "\"function\", \"function\": {\"name\": ...}}");
        r->tool_choice = SRV_TOOLS_NAMED;
        if (!(r->tool_name = strdup(name->valuestring)))
            return oom(e);
    } else {
        return srv_error_set(e, 400, "tool_choice", NULL,
                             "'tool_choice' must be none, auto, required or {\"type\": "
                             "\"function\", \"function\": {\"name\": ...}}");
    }
    if (!have && r->tool_choice != SRV_TOOLS_NONE && r->tool_choice != SRV_TOOLS_AUTO)
        return srv_error_set(e, 400, "tool_choice", NULL,
                             "'tool_choice' %s needs a non-empty 'tools'",
                             r->tool_choice == SRV_TOOLS_REQUIRED ? "required" : "of a function");
    if (!have) {
        r->tool_choice = SRV_TOOLS_NONE;
        return 0;
    }
    if (!(r->tools = cJSON_Duplicate(tools, true)))
        return oom(e);
    if (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED) {
        char err[200];
        int rc = srv_json_schema_compile_tools(r->tools, r->tool_name, NULL, &r->grammar, err,
                                               sizeof err);
        if (rc == KVS_ENOMEM)
            return oom(e);
        if (rc)
            return srv_error_set(e, 400, !strncmp(err, "tool_choice", 11) ? "tool_choice" : "tools",
                                 NULL, "%s", err);
        r->format_type = "a forced tool call";
        if (tmpl == SRV_CHAT_HARMONY)
            return harmony_grammar(r, e);
        if (tmpl == SRV_CHAT_GRANITE || tmpl == SRV_CHAT_GRANITE30 || tmpl == SRV_CHAT_GRANITE32 ||
            tmpl == SRV_CHAT_GRANITE33)
            return marker_grammar(r, "<|tool_call|>", e);
        if (tmpl == SRV_CHAT_LFM2 || tmpl == SRV_CHAT_LFM25 || tmpl == SRV_CHAT_LFM25_8B)
            return marker_grammar(r, "<|tool_call_start|>", e);
        if (tmpl == SRV_CHAT_GRANITE40)
            return tag_grammar(r, "<tool_call>\n", NULL, e);
        if (tmpl == SRV_CHAT_MISTRAL3 || tmpl == SRV_CHAT_MISTRAL3_THINK)
            return tag_grammar(r, "[TOOL_CALLS]", "[ARGS]", e);
    }
    return 0;
}

/* logit_bias: {"token id": bias, ...}, ids as decimal strings (JSON keys), bias in [-100, 100]. */
static int parse_logit_bias(const cJSON *root, srv_request *r, srv_error *e)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb))
        return 0;
    if (!cJSON_IsObject(lb))
        return srv_error_set(e, 400, "logit_bias", NULL,
                             "'logit_bias' must be an object of token ids to numbers");
    int n = cJSON_GetArraySize(lb);
    if (n == 0)
        return 0;
    if (n > SRV_MAX_LOGIT_BIAS)
        return srv_error_set(e, 400, "logit_bias", NULL,
                             "'logit_bias' takes at most %d entries, got %d", SRV_MAX_LOGIT_BIAS,
                             n);
    r->logit_bias = calloc((size_t)n, sizeof *r->logit_bias);
    if (!r->logit_bias)
        return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, lb)
    {
        const char *k = it->string;
        char *end = NULL;
        long id = -1;
        if (k && *k >= '0' && *k <= '9' && strlen(k) <= 10)
            id = strtol(k, &end, 10);
        if (id < 0 || id > INT32_MAX || !end || *end)
            return srv_error_set(e, 400, "logit_bias", NULL,
                                 "'logit_bias' keys must be token ids (non-negative integers), "
                                 "got \"%.40s\"",
                                 k ? k : "");
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return srv_error_set(e, 400, "logit_bias", NULL,
                                 "'logit_bias' values must be numbers from -100 to 100 (token %ld)",
                                 id);
        r->logit_bias[r->n_logit_bias].id = (int32_t)id;
        r->logit_bias[r->n_logit_bias].bias = (float)it->valuedouble;
        r->n_logit_bias++;
    }
    return 0;
}

/* The keys obj may have; the first other one is a 400 naming it as where.key. */
static int only_keys(const cJSON *obj, const char *where, const char *const *keys, srv_error *e)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        bool known = false;
        for (const char *const *k = keys; *k && !known; k++)
            known = !strcmp(it->string, *k);
        if (!known) {
            char param[48];
            snprintf(param, sizeof param, "%s.%s", where, it->string);
            return srv_error_set(e, 400, param, NULL, "unknown field '%s.%.60s'", where,
                                 it->string);
        }
    }
    return 0;
}

/* response_format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
 * "json_schema": {"name", "schema", "strict", "description"}} compiled to a grammar. */
static int parse_response_format(const cJSON *root, srv_request *r, srv_error *e)
{
    r->format_type = "text";
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return srv_error_set(e, 400, "response_format.type", NULL,
                             "'response_format' must be an object with a string 'type' (text, "
                             "json_object or json_schema)");
    const char *ty = type->valuestring;
    if (!strcmp(ty, "text") || !strcmp(ty, "json_object")) {
        static const char *const keys[] = {"type", NULL};
        if (only_keys(rf, "response_format", keys, e))
            return -1;
        if (!strcmp(ty, "text"))
            return 0;
        r->format_type = "json_object";
        return grammar_def_json_object(NULL, &r->grammar) ? oom(e) : 0;
    }
    if (strcmp(ty, "json_schema"))
        return srv_error_set(e, 400, "response_format.type", NULL,
                             "'response_format.type' must be text, json_object or json_schema, "
                             "got '%.60s'",
                             ty);
    static const char *const keys[] = {"type", "json_schema", NULL};
    if (only_keys(rf, "response_format", keys, e))
        return -1;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return srv_error_set(e, 400, "response_format.json_schema", NULL,
                             "'response_format.json_schema' must be an object with 'name' and "
                             "'schema'");
    static const char *const jkeys[] = {"name", "schema", "strict", "description", NULL};
    if (only_keys(js, "response_format.json_schema", jkeys, e))
        return -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(js, "description");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return srv_error_set(e, 400, "response_format.json_schema.name", NULL,
                             "'response_format.json_schema.name' must be a non-empty string");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return srv_error_set(e, 400, "response_format.json_schema.strict", NULL,
                             "'response_format.json_schema.strict' must be a boolean");
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return srv_error_set(e, 400, "response_format.json_schema.description", NULL,
                             "'response_format.json_schema.description' must be a string");
    if (!schema || cJSON_IsNull(schema)) {
        /* OpenAI: no schema means any JSON value is fine; here the same, as {}. */
        schema = NULL;
    } else if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) {
        return srv_error_set(e, 400, "response_format.json_schema.schema", NULL,
                             "'response_format.json_schema.schema' must be a JSON Schema object");
    }
    cJSON *empty = schema ? NULL : cJSON_CreateObject();
    if (!schema && !empty)
        return oom(e);
    char err[200];
    int rc = srv_json_schema_compile(schema ? schema : empty, NULL, &r->grammar, err, sizeof err);
    cJSON_Delete(empty);
    if (rc == KVS_ENOMEM)
        return oom(e);
    if (rc)
        return srv_error_set(e, 400, "response_format.json_schema.schema", NULL,
                             "response_format.json_schema.schema: %s", err);
    r->format_type = "json_schema";
    return 0;
}

/* OpenAI request fields this server does not implement: each is a 400 naming it, unless it
 * holds a value that asks for nothing (null, or the neutral value listed), so a client never
 * believes a feature took effect when it did not. Fields no OpenAI API defines are ignored. */
typedef struct unsupported_field {
    const char *name;
    int endpoints;       /* 1 completions, 2 chat */
    const char *neutral; /* the one value that is accepted, as cJSON_PrintUnformatted prints it */
} unsupported_field;

static const unsupported_field k_unsupported[] = {
    {"tools", 1, "[]"}, /* chat implements them */
    {"tool_choice", 1, "\"none\""},
    {"parallel_tool_calls", 1, NULL},
    {"functions", 3, "[]"},
    {"function_call", 3, "\"none\""},
    {"audio", 2, NULL},
    {"modalities", 2, "[\"text\"]"},
    {"prediction", 2, NULL},
    {"store", 2, "false"},
    {"service_tier", 3, "\"auto\""},
    {"web_search_options", 2, NULL},
    {"verbosity", 2, NULL},
    {"best_of", 1, "1"},
    {"suffix", 1, "\"\""},
    /* not OpenAI's: vLLM's chat field handing RAG documents to the template (Granite's, Command
     * R's); there is no Jinja here to write them, and a request whose documents were dropped
     * would be answered as if it had none */
    {"documents", 2, "[]"},
};

static int refuse_unsupported(const cJSON *root, bool chat, srv_error *e)
{
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++) {
        const unsupported_field *f = &k_unsupported[i];
        if (!(f->endpoints & (chat ? 2 : 1)))
            continue;
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, f->name);
        if (!it || cJSON_IsNull(it))
            continue;
        if (f->neutral) {
            char *s = cJSON_PrintUnformatted(it);
            bool neutral = s && !strcmp(s, f->neutral);
            free(s);
            if (neutral)
                continue;
        }
        return srv_error_set(e, 400, f->name, "unsupported_parameter",
                             "'%s' is not supported by this server", f->name);
    }
    return 0;
}

/* The literal at p is one of the non-finite numbers clients emit (NaN, Infinity; JSON has
 * neither, but Python's json.dumps and JavaScript-ish encoders write them). */
static bool non_finite_at(const char *p, const char *end)
{
    static const char *lits[] = {"NaN",  "nan",       "Infinity", "-Infinity", "inf",
                                 "-inf", "+Infinity", "+inf",     "-NaN",      "-nan"};
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(end - p) >= n && !memcmp(p, lits[i], n))
            return true;
    }
    return false;
}

/* A body cJSON rejected. When the failure is a non-finite number literal as an object value,
 * the error names that field (found by walking back over `"key" :` from the failure point),
 * so `{"temperature": NaN}` reports param "temperature" like any out-of-range value. */
static int parse_failure(const char *body, size_t len, const char *at, srv_error *e)
{
    const char *end = body + len;
    if (!at || at < body || at >= end || !non_finite_at(at, end))
        return srv_error_set(e, 400, NULL, NULL, "request body is not valid JSON");
    const char *p = at;
    while (p > body && strchr(" \t\r\n", p[-1]))
        p--;
    char key[48] = "";
    if (p > body && p[-1] == ':') {
        p--;
        while (p > body && strchr(" \t\r\n", p[-1]))
            p--;
        if (p > body && p[-1] == '"') {
            const char *close = p - 1, *open = close;
            while (open > body && open[-1] != '"')
                open--;
            size_t n = (size_t)(close - open);
            if (open > body && n < sizeof key) {
                memcpy(key, open, n);
                key[n] = '\0';
            }
        }
    }
    if (!key[0])
        return srv_error_set(e, 400, NULL, NULL,
                             "request body is not valid JSON: NaN and Infinity are not numbers");
    return srv_error_set(e, 400, key, NULL, "'%s' must be a finite number", key);
}

/* The first string of body (valid JSON) that holds the escape \u0000, or NULL; *key gets the
 * top-level member it is in ("" if none). cJSON keeps strings NUL-terminated, so such a
 * string would reach us cut short: it is refused instead of silently truncated. */
static const char *find_nul_escape(const char *body, size_t len, char *key, size_t key_cap)
{
    const char *p = body, *end = body + len;
    int depth = 0;
    bool expect_key = false; /* the next string at depth 1 is a member name */
    key[0] = '\0';
    while (p < end) {
        char ch = *p++;
        if (ch == '{' || ch == '[') {
            depth++;
            expect_key = depth == 1 && ch == '{';
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == ',' && depth == 1) {
            expect_key = true;
        } else if (ch == '"') {
            const char *start = p;
            bool nul = false;
            while (p < end && *p != '"') {
                if (*p == '\\' && p + 1 < end) {
                    if (p[1] == 'u' && end - p >= 6 && !memcmp(p + 2, "0000", 4))
                        nul = true;
                    p += 2;
                } else {
                    p++;
                }
            }
            if (depth == 1 && expect_key) {
                size_t n = (size_t)(p - start);
                if (n >= key_cap)
                    n = key_cap - 1;
                memcpy(key, start, n);
                key[n] = '\0';
                expect_key = false;
            }
            if (nul)
                return start - 1;
            p++; /* the closing quote */
        }
    }
    return NULL;
}

int srv_json_parse(const char *body, size_t len, cJSON **out, srv_error *e)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root)
        return parse_failure(body, len, end, e);
    /* cJSON stops after the first value: anything but whitespace after it is an error, or
     * `{...} garbage` (or two concatenated documents) would pass as the first one. */
    while (end && end < body + len && strchr(" \t\r\n", *end) && *end)
        end++;
    if (end && end < body + len) {
        cJSON_Delete(root);
        return srv_error_set(e, 400, NULL, NULL,
                             "request body is not valid JSON: unexpected data after the JSON "
                             "value at byte %zu",
                             (size_t)(end - body));
    }
    char key[48];
    if (find_nul_escape(body, len, key, sizeof key)) {
        cJSON_Delete(root);
        if (key[0])
            return srv_error_set(e, 400, key, NULL,
                                 "'%s' must not contain the NUL character (\\u0000)", key);
        return srv_error_set(e, 400, NULL, NULL,
                             "strings must not contain the NUL character (\\u0000)");
    }
    *out = root;
    return 0;
}

int srv_json_parse_object(const char *body, size_t len, cJSON **out, srv_error *e)
{
    if (srv_json_parse(body, len, out, e))
        return -1;
    if (cJSON_IsObject(*out))
        return 0;
    cJSON_Delete(*out);
    *out = NULL;
    return srv_error_set(e, 400, NULL, NULL, "request body must be a JSON object");
}

uint64_t srv_response_bound(uint32_t n, uint32_t max_tokens, int n_top_logprobs)
{
    uint64_t per_token = SRV_BOUND_TEXT_BYTES;
    if (n_top_logprobs >= 0)
        per_token += (uint64_t)(1 + n_top_logprobs) * SRV_BOUND_LOGPROB_BYTES;
    return (uint64_t)n * max_tokens * per_token;
}

int srv_json_model(const cJSON *root, char **out, srv_error *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    *out = NULL;
    if (!model || cJSON_IsNull(model))
        return 0;
    if (!cJSON_IsString(model))
        return srv_error_set(e, 400, "model", NULL, "'model' must be a string");
    if (!(*out = strdup(model->valuestring)))
        return oom(e);
    return 0;
}

int srv_request_parse(const char *body, size_t len, bool chat, const srv_chat_fmt *fmt,
                      const sampler_params *defaults, srv_request *r, srv_error *e)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->n = 1;
    r->max_tokens = 16;
    r->n_top_logprobs = -1;
    r->sampling = *defaults;

    cJSON *root;
    if (srv_json_parse_object(body, len, &root, e))
        return -1;
    int rc = -1;
    if (srv_json_model(root, &r->model, e))
        goto out;
    if (refuse_unsupported(root, chat, e))
        goto out;
    if (chat && parse_tools(root, fmt->tmpl, r, e))
        goto out;
    if (chat ? parse_messages(root, fmt, r, e) : parse_prompt(root, r, e))
        goto out;

    double d;
    bool has;
    if (!chat && get_bool(root, "echo", &r->echo, e))
        goto out;
    const char *mt_key = "max_tokens";
    /* 0 with echo: the prompt alone, scored (its logprobs), nothing generated */
    if (get_num(root, "max_tokens", 0, UINT32_MAX, true, &d, &has, e))
        goto out;
    if (has && d == 0 && !r->echo) {
        srv_error_set(e, 400, "max_tokens", NULL, "'max_tokens' must be at least 1%s",
                      chat ? ""
                           : " (0 only with echo: the "
                             "prompt alone, scored)");
        goto out;
    }
    if (!has) {
        mt_key = "max_completion_tokens";
        if (get_num(root, mt_key, 1, UINT32_MAX, true, &d, &has, e))
            goto out;
    }
    (void)mt_key;
    if (has) {
        r->has_max_tokens = true;
        r->max_tokens = (uint32_t)d;
    }
    if (get_num(root, "n", 1, SRV_MAX_N, true, &d, &has, e))
        goto out;
    if (has)
        r->n = (uint32_t)d;
    sampler_params *s = &r->sampling;
    if (get_num(root, "temperature", 0, 2, false, &d, &has, e))
        goto out;
    if (has)
        s->temperature = (float)d;
    if (get_num(root, "top_p", 0, 1, false, &d, &has, e))
        goto out;
    if (has) {
        if (d <= 0) {
            srv_error_set(e, 400, "top_p", NULL, "'top_p' must be in (0, 1]");
            goto out;
        }
        s->top_p = positive_float(d);
    }
    if (get_num(root, "top_k", -1, INT32_MAX, true, &d, &has, e))
        goto out;
    if (has)
        s->top_k = (int32_t)d;
    if (get_num(root, "min_p", 0, 1, false, &d, &has, e))
        goto out;
    if (has)
        s->min_p = (float)d;
    if (get_num(root, "presence_penalty", -2, 2, false, &d, &has, e))
        goto out;
    if (has)
        s->presence_penalty = (float)d;
    if (get_num(root, "frequency_penalty", -2, 2, false, &d, &has, e))
        goto out;
    if (has)
        s->frequency_penalty = (float)d;
    if (get_num(root, "repetition_penalty", 0, 2, false, &d, &has, e))
        goto out;
    if (has) {
        if (d <= 0) {
            srv_error_set(e, 400, "repetition_penalty", NULL,
                          "'repetition_penalty' must be in (0, 2]");
            goto out;
        }
        s->repetition_penalty = positive_float(d);
    }
    /* Seeds beyond 2^53 lose precision as JSON doubles; the range is what clients send. */
    if (get_num(root, "seed", -9007199254740992.0, 9007199254740992.0, true, &d, &has, e))
        goto out;
    if (has) {
        r->has_seed = true;
        s->seed = (uint64_t)(int64_t)d;
    }
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) || get_bool(root, "stream", &r->stream, e))
        goto out;
    if (parse_stop(root, r, e) || parse_logit_bias(root, r, e))
        goto out;
    if (r->grammar) { /* a forced tool call */
        const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (rf && !cJSON_IsNull(rf) && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "text"))) {
            srv_error_set(e, 400, "response_format", NULL,
                          "'response_format' cannot be combined with tool_choice %s",
                          r->tool_choice == SRV_TOOLS_REQUIRED ? "required" : "of a function");
            goto out;
        }
    } else if (parse_response_format(root, r, e)) {
        goto out;
    }

    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            srv_error_set(e, 400, "stream_options", NULL, "'stream_options' must be an object");
            goto out;
        }
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (iu && !cJSON_IsNull(iu) && !cJSON_IsBool(iu)) {
            srv_error_set(e, 400, "stream_options.include_usage", NULL,
                          "'stream_options.include_usage' must be a boolean");
            goto out;
        }
        r->include_usage = cJSON_IsTrue(iu);
    }

    if (chat) {
        bool lp = false;
        if (get_bool(root, "logprobs", &lp, e))
            goto out;
        if (get_num(root, "top_logprobs", 0, 20, true, &d, &has, e))
            goto out;
        if (has && !lp) {
            srv_error_set(e, 400, "top_logprobs", NULL,
                          "'top_logprobs' requires 'logprobs' to be true");
            goto out;
        }
        if (lp)
            r->n_top_logprobs = has ? (int)d : 0;
    } else {
        if (get_num(root, "logprobs", 0, 5, true, &d, &has, e))
            goto out;
        if (has)
            r->n_top_logprobs = (int)d;
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user)) {
        srv_error_set(e, 400, "user", NULL, "'user' must be a string");
        goto out;
    }
    if (r->grammar && r->n_more) {
        srv_error_set(e, 400, "response_format", NULL,
                      "'response_format' with an array of several prompts is not supported: "
                      "send one request per prompt");
        goto out;
    }
    if (r->grammar && r->ignore_eos) {
        bool tool = r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED;
        srv_error_set(e, 400, "ignore_eos", NULL,
                      "'ignore_eos' cannot be used with %s%s: the output ends when its JSON "
                      "value is complete",
                      tool ? "a forced tool call" : "response_format ", tool ? "" : r->format_type);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc)
        srv_request_free(r);
    return rc;
}

/* The members the rendering reads: tool_choice decides whether the tools are rendered. */
static const char *const k_template_fields[] = {"messages", "tools", "tool_choice",
                                                "chat_template_kwargs", "reasoning_effort"};

bool srv_template_field(const char *name)
{
    for (size_t i = 0; i < sizeof k_template_fields / sizeof k_template_fields[0]; i++)
        if (!strcmp(name, k_template_fields[i]))
            return true;
    return false;
}

int srv_template_parse(const char *body, size_t len, const srv_chat_fmt *fmt, srv_request *r,
                       srv_error *e)
{
    memset(r, 0, sizeof *r);
    cJSON *root;
    if (srv_json_parse_object(body, len, &root, e))
        return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (!srv_template_field(it->string)) {
            srv_error_set(e, 400, it->string, "unsupported_parameter",
                          "'%.64s' has no effect on /apply-template: it renders messages, tools, "
                          "tool_choice, chat_template_kwargs and reasoning_effort only",
                          it->string);
            cJSON_Delete(root);
            return -1;
        }
    }
    cJSON_Delete(root);
    sampler_params defaults = sampler_default_params();
    return srv_request_parse(body, len, true, fmt, &defaults, r, e);
}
