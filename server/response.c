/* Response JSON. Token strings in logprobs may be partial UTF-8 (byte tokens), so they are
 * made valid (U+FFFD) before going into JSON, and the raw bytes go in "bytes" as OpenAI does. */
#include "server/response.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"

const char *srv_finish_str(enum sched_finish f)
{
    switch (f) {
    case SCHED_FINISH_STOP: return "stop";
    case SCHED_FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

int srv_choice_add(srv_choice *c, const sched_event *ev)
{
    if (ev->text_len) {
        if (c->len + ev->text_len + 1 > c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 256;
            while (cap < c->len + ev->text_len + 1)
                cap *= 2;
            char *np = realloc(c->text, cap);
            if (!np)
                return KVS_ENOMEM;
            c->text = np;
            c->cap = cap;
        }
        memcpy(c->text + c->len, ev->text, ev->text_len);
        c->len += ev->text_len;
        c->text[c->len] = '\0';
    }
    if (ev->n_tokens) {
        if (c->n_toks + ev->n_tokens > c->cap_toks) {
            size_t cap = c->cap_toks ? c->cap_toks * 2 : 16;
            while (cap < c->n_toks + ev->n_tokens)
                cap *= 2;
            sched_token_info *np = realloc(c->toks, cap * sizeof *np);
            if (!np)
                return KVS_ENOMEM;
            c->toks = np;
            c->cap_toks = cap;
        }
        memcpy(c->toks + c->n_toks, ev->tokens, ev->n_tokens * sizeof *ev->tokens);
        c->n_toks += ev->n_tokens;
    }
    if (ev->finish != SCHED_FINISH_NONE) {
        c->finish = ev->finish;
        c->status = ev->status;
        c->completion_tokens = ev->completion_tokens;
    }
    return 0;
}

void srv_choice_free(srv_choice *c)
{
    if (!c)
        return;
    free(c->text);
    free(c->toks);
    free(c->reasoning);
    cJSON_Delete(c->tool_calls);
    srv_think_free(&c->think);
    srv_think_free(&c->count);
    memset(c, 0, sizeof *c);
}

int srv_choice_split_reasoning(srv_choice *c, enum srv_chat_tmpl tmpl)
{
    srv_think t = {0};
    srv_think_set_format(&t, tmpl);
    kvs_buf r = {0}, content = {0};
    srv_think_feed(&t, c->text ? c->text : "", c->len, &r, &content);
    srv_think_end(&t, &r, &content);
    if (r.oom || content.oom) {
        kvs_buf_free(&r);
        kvs_buf_free(&content);
        return KVS_ENOMEM;
    }
    bool had_block = r.len || content.len != c->len;
    if (!had_block) { /* no think block: the text stays as it is */
        kvs_buf_free(&r);
        kvs_buf_free(&content);
        return 0;
    }
    char *rs, *cs;
    size_t rn = r.len, cn = content.len;
    if (kvs_buf_take(&r, &rs)) {
        kvs_buf_free(&content);
        return KVS_ENOMEM;
    }
    if (kvs_buf_take(&content, &cs)) {
        free(rs);
        return KVS_ENOMEM;
    }
    free(c->reasoning);
    c->reasoning = NULL;
    if (rn)
        c->reasoning = rs; /* an empty block is no reasoning */
    else
        free(rs);
    free(c->text);
    c->text = cs;
    c->len = cn;
    c->cap = cn + 1;
    return 0;
}

/* Copies s into out as valid UTF-8, invalid bytes as U+FFFD; out needs 3*n+1 bytes. */
static void utf8_sanitize(const unsigned char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = (s[i + k] & 0xC0) == 0x80;
        if (ok && c == 0)
            ok = false; /* NUL would cut the C string */
        if (ok) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
}

/* The token's text (sanitized) into str (cap >= 3*256+1) and its raw bytes into raw. */
static int token_piece(const tok_vocab *v, int32_t id, char *raw, size_t raw_cap, char *str)
{
    int n = v ? tok_token_to_piece(v, id, raw, raw_cap) : 0;
    if (n < 0)
        n = 0;
    if ((size_t)n > raw_cap)
        n = (int)raw_cap;
    utf8_sanitize((const unsigned char *)raw, (size_t)n, str);
    return n;
}

static cJSON *bytes_array(const char *raw, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* Chat: {"content":[{"token","logprob","bytes","top_logprobs":[…]}]}.
 * Completions: {"tokens","token_logprobs","top_logprobs":[{tok:lp}],"text_offset"}. */
static cJSON *logprobs_json(const srv_resp_ctx *x, const sched_token_info *t, size_t n,
                            size_t text_offset, size_t echo_toks, size_t echo_len)
{
    char raw[256], str[3 * 256 + 1];
    cJSON *lp = cJSON_CreateObject();
    if (x->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (size_t i = 0; content && i < n; i++) {
            cJSON *e = cJSON_CreateObject();
            int nb = token_piece(x->vocab, t[i].id, raw, sizeof raw, str);
            cJSON_AddStringToObject(e, "token", str);
            cJSON_AddNumberToObject(e, "logprob", t[i].logprob);
            cJSON_AddItemToObject(e, "bytes", bytes_array(raw, nb));
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; tops && k < t[i].n_top && k < SCHED_MAX_TOP_LOGPROBS; k++) {
                cJSON *te = cJSON_CreateObject();
                int tb = token_piece(x->vocab, t[i].top_ids[k], raw, sizeof raw, str);
                cJSON_AddStringToObject(te, "token", str);
                cJSON_AddNumberToObject(te, "logprob", t[i].top_logprobs[k]);
                cJSON_AddItemToObject(te, "bytes", bytes_array(raw, tb));
                cJSON_AddItemToArray(tops, te);
            }
            cJSON_AddItemToArray(content, e);
        }
        return lp;
    }
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(lp, "text_offset");
    if (!tokens || !tlp || !tops || !offs)
        return lp;
    size_t off = text_offset;
    for (size_t i = 0; i < n; i++) {
        if (echo_toks && i == echo_toks)
            off = echo_len; /* the generated text follows the prompt's as echoed */
        int nb = token_piece(x->vocab, t[i].id, raw, sizeof raw, str);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(str));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += (size_t)nb;
        if (t[i].n_top < 0) { /* an echoed prompt's first token: nothing predicts it */
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(t[i].logprob));
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; d && k < t[i].n_top && k < SCHED_MAX_TOP_LOGPROBS; k++) {
            token_piece(x->vocab, t[i].top_ids[k], raw, sizeof raw, str);
            if (!cJSON_GetObjectItemCaseSensitive(d, str))
                cJSON_AddNumberToObject(d, str, t[i].top_logprobs[k]);
        }
        cJSON_AddItemToArray(tops, d);
    }
    return lp;
}

static cJSON *envelope(const srv_resp_ctx *x, bool chunk)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", x->id);
    cJSON_AddStringToObject(r, "object",
                            x->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)x->created);
    cJSON_AddStringToObject(r, "model", x->model);
    return r;
}

static void add_finish(cJSON *o, enum sched_finish f)
{
    const char *s = srv_finish_str(f);
    if (s)
        cJSON_AddStringToObject(o, "finish_reason", s);
    else
        cJSON_AddNullToObject(o, "finish_reason");
}

/* reasoning: the completion's tokens a thinking model spent reasoning (srv_choice
 * .reasoning_tokens), as OpenAI's completion_tokens_details; 0: none, left out. */
static void add_usage(cJSON *r, uint32_t prompt, uint32_t completion, int cached,
                      uint32_t reasoning)
{
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    if (!u)
        return;
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)prompt + completion);
    if (reasoning) {
        cJSON *d = cJSON_AddObjectToObject(u, "completion_tokens_details");
        if (d)
            cJSON_AddNumberToObject(d, "reasoning_tokens", reasoning);
    }
    if (cached >= 0) {
        cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
        if (d)
            cJSON_AddNumberToObject(d, "cached_tokens", cached);
    }
}

/* cJSON strings end at the first NUL, but text carries a length and may hold NUL bytes (a
 * byte-fallback token <0x00>): such text is written as a raw JSON string with \u0000. */
cJSON *srv_json_string_n(const char *s, size_t n)
{
    bool has_nul = n && memchr(s, 0, n);
    char *t = malloc(has_nul ? 6 * n + 3 : n + 1);
    if (!t)
        return NULL;
    if (!has_nul) {
        if (n)
            memcpy(t, s, n);
        t[n] = '\0';
        cJSON *j = cJSON_CreateString(t);
        free(t);
        return j;
    }
    size_t o = 0;
    t[o++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            t[o++] = '\\';
            t[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(t + o, 7, "\\u%04x", ch);
        } else {
            t[o++] = (char)ch;
        }
    }
    t[o++] = '"';
    t[o] = '\0';
    cJSON *j = cJSON_CreateRaw(t);
    free(t);
    return j;
}

char *srv_resp_full(const srv_resp_ctx *x, const srv_choice *ch, uint32_t n, uint32_t prompt_tokens,
                    uint32_t cached_tokens)
{
    cJSON *r = envelope(x, false);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    uint32_t completion = 0, reasoning = 0;
    for (uint32_t i = 0; choices && i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        if (x->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (ch[i].tool_calls && !ch[i].len)
                cJSON_AddNullToObject(m, "content");
            else
                cJSON_AddItemToObject(m, "content", srv_json_string_n(ch[i].text, ch[i].len));
            if (ch[i].reasoning)
                cJSON_AddItemToObject(m, "reasoning_content",
                                      srv_json_string_n(ch[i].reasoning, strlen(ch[i].reasoning)));
            if (ch[i].tool_calls)
                cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(ch[i].tool_calls, true));
        } else {
            cJSON_AddItemToObject(c, "text", srv_json_string_n(ch[i].text, ch[i].len));
        }
        if (x->n_top_logprobs >= 0)
            cJSON_AddItemToObject(
                c, "logprobs",
                logprobs_json(x, ch[i].toks, ch[i].n_toks, 0, ch[i].echo_toks, ch[i].echo_len));
        else
            cJSON_AddNullToObject(c, "logprobs");
        if (ch[i].tool_calls)
            cJSON_AddStringToObject(c, "finish_reason", "tool_calls");
        else
            add_finish(c, ch[i].finish);
        cJSON_AddItemToArray(choices, c);
        completion += ch[i].completion_tokens;
        reasoning += ch[i].reasoning_tokens;
    }
    add_usage(r, prompt_tokens, completion, (int)cached_tokens, reasoning);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

char *srv_sse_wrap(const char *json)
{
    if (!json)
        return NULL;
    size_t n = strlen(json);
    char *s = malloc(n + 9);
    if (!s)
        return NULL;
    memcpy(s, "data: ", 6);
    memcpy(s + 6, json, n);
    memcpy(s + 6 + n, "\n\n", 3);
    return s;
}

static char *sse_of(cJSON *r)
{
    char *j = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    char *s = srv_sse_wrap(j);
    free(j);
    return s;
}

char *srv_resp_chunk(const srv_resp_ctx *x, uint32_t idx, const char *text, size_t len,
                     const sched_token_info *toks, uint32_t n_toks, enum sched_finish finish,
                     bool role_only, size_t text_offset)
{
    cJSON *r = envelope(x, true);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    if (x->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role_only) {
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
        } else if (len || finish == SCHED_FINISH_NONE) {
            cJSON_AddItemToObject(d, "content", srv_json_string_n(text, len));
        }
    } else {
        cJSON_AddItemToObject(c, "text", srv_json_string_n(text, len));
    }
    if (x->n_top_logprobs >= 0 && n_toks)
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(x, toks, n_toks, text_offset, 0, 0));
    else
        cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, finish);
    cJSON_AddItemToArray(choices, c);
    return sse_of(r);
}

char *srv_resp_reasoning_chunk(const srv_resp_ctx *x, uint32_t idx, const char *text, size_t len,
                               const sched_token_info *toks, uint32_t n_toks)
{
    cJSON *r = envelope(x, true);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddItemToObject(d, "reasoning_content", srv_json_string_n(text, len));
    if (x->n_top_logprobs >= 0 && n_toks)
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(x, toks, n_toks, 0, 0, 0));
    else
        cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    return sse_of(r);
}

char *srv_resp_tool_calls_chunk(const srv_resp_ctx *x, uint32_t idx, const cJSON *calls)
{
    cJSON *r = envelope(x, true);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON *arr = cJSON_Duplicate(calls, true);
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        cJSON_AddNumberToObject(it, "index", i++);
    }
    cJSON_AddItemToObject(d, "tool_calls", arr);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    return sse_of(r);
}

char *srv_resp_tool_calls_finish(const srv_resp_ctx *x, uint32_t idx)
{
    cJSON *r = envelope(x, true);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    cJSON_AddObjectToObject(c, "delta");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", "tool_calls");
    cJSON_AddItemToArray(choices, c);
    return sse_of(r);
}

char *srv_resp_usage_chunk(const srv_resp_ctx *x, uint32_t prompt_tokens,
                           uint32_t completion_tokens, uint32_t reasoning_tokens)
{
    cJSON *r = envelope(x, true);
    cJSON_AddArrayToObject(r, "choices");
    add_usage(r, prompt_tokens, completion_tokens, -1, reasoning_tokens);
    return sse_of(r);
}
