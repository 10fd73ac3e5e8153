/* Chat template rendering. The formats follow what each family's official template produces
 * for system/user/assistant turns with add_generation_prompt, as llama.cpp renders them; BOS
 * is not written here because the tokenizer adds it (tok_add_bos). */
#include "server/chat_template.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/status.h"

static const char *k_names[SRV_CHAT_COUNT] = {
    "plain",      "chatml",     "llama2",     "llama3",        "zephyr",  "mistral", "gemma",
    "phi3",       "qwen3",      "llama3.1",   "llama3.2",      "harmony", "smollm3", "granite",
    "granite3.0", "granite3.2", "granite3.3", "ernie4.5",      "lfm2",    "lfm2.5",  "lfm2.5-8b",
    "olmo2",      "granite4.0", "mistral3",   "mistral3-think"};

const char *srv_chat_name(enum srv_chat_tmpl t)
{
    return (unsigned)t < sizeof k_names / sizeof k_names[0] ? k_names[t] : "plain";
}

int srv_chat_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i]))
            return (int)i;
    return -1;
}

enum srv_chat_tmpl srv_chat_detect(const char *t)
{
    if (!t || !*t)
        return SRV_CHAT_PLAIN;
#define HAS(s) (strstr(t, (s)) != NULL)
    /* gpt-oss's harmony: its messages open with <|start|> and name a channel (its template also
     * holds "<|end|>", which would otherwise read as Phi-3's). */
    if (HAS("<|start|>") && HAS("<|channel|>") && HAS("<|message|>"))
        return SRV_CHAT_HARMONY;
    /* IBM Granite: roles between <|start_of_role|> and <|end_of_role|>. 4.0 lists its tools in
     * <tools> and calls in <tool_call> tags (as llama.cpp's llm_chat_detect_template tells 4.0
     * from 3.x); of 3.x, 3.1 on dates its default system message, 3.2 adds a thinking text to
     * it, 3.3 asks for <think> blocks */
    if (HAS("<|start_of_role|>") && HAS("<|end_of_role|>")) {
        if (HAS("<tool_call>") || HAS("<tools>"))
            return SRV_CHAT_GRANITE40;
        if (!HAS("Knowledge Cutoff Date"))
            return SRV_CHAT_GRANITE30;
        if (HAS("<think></think>"))
            return SRV_CHAT_GRANITE33;
        return HAS("Here is my thought process:") ? SRV_CHAT_GRANITE32 : SRV_CHAT_GRANITE;
    }
    /* ERNIE 4.5: its cls_token opens, its sep_token closes an assistant turn */
    if (HAS("<|begin_of_sentence|>") && HAS("<|end_of_sentence|>") && HAS("Assistant: "))
        return SRV_CHAT_ERNIE45;
    /* Liquid AI's LFM2 family: ChatML whose system turn lists the tools after "List of tools: ";
     * LFM2's between <|tool_list_start|> and <|tool_list_end|> (as llama.cpp's
     * is_lfm2_template knows it), LFM2.5's bare, LFM2.5-8B-A1B's after today's date, its
     * template writing calls back (<|tool_call_start|>) */
    if (HAS("<|im_start|>") && HAS("List of tools: ")) {
        if (HAS("<|tool_list_start|>") && HAS("<|tool_list_end|>"))
            return SRV_CHAT_LFM2;
        return HAS("<|tool_call_start|>") ? SRV_CHAT_LFM25_8B : SRV_CHAT_LFM25;
    }
    /* Mistral's current templates (mistral-common's, tokenizer v7 and later): a system prompt
     * between [SYSTEM_PROMPT] tags and calls written [TOOL_CALLS]name[ARGS]arguments; those
     * that handle thinking chunks write [THINK] */
    if (HAS("[SYSTEM_PROMPT]") && HAS("[ARGS]") && HAS("[INST]"))
        return HAS("[THINK]") ? SRV_CHAT_MISTRAL3_THINK : SRV_CHAT_MISTRAL3;
    /* Order matters as in llama.cpp: ChatML markers first, then [INST] (Mistral's official
     * templates put the system message inside the first [INST] and lack <<SYS>>). */
    /* SmolLM3's ChatML opens with a metadata system turn naming its reasoning mode (its template
     * also reads enable_thinking, which would otherwise read as Qwen 3's). */
    if (HAS("<|im_start|>") && HAS("Reasoning Mode: ") && HAS("/no_think"))
        return SRV_CHAT_SMOLLM3;
    if (HAS("<|im_start|>"))
        return HAS("enable_thinking") ? SRV_CHAT_QWEN3 : SRV_CHAT_CHATML;
    if (!strncmp(t, "mistral", 7) || HAS("[INST]")) {
        if (HAS("<<SYS>>") || !(HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]")))
            return SRV_CHAT_LLAMA2;
        return SRV_CHAT_MISTRAL;
    }
    if (HAS("<|assistant|>") && HAS("<|end|>"))
        return SRV_CHAT_PHI3;
    /* OLMo 2's (Tulu 3's): a user turn closed by a newline, an answer by eos_token, the last
     * answer with no newline after it */
    if (HAS("<|user|>") && HAS("<|assistant|>") && HAS("not loop.last") && HAS("eos_token"))
        return SRV_CHAT_OLMO2;
    if (HAS("<|user|>") && (HAS("<|endoftext|>") || HAS("eos_token")))
        return SRV_CHAT_ZEPHYR;
    if (HAS("<start_of_turn>"))
        return SRV_CHAT_GEMMA;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) {
        /* 3.1 / 3.3 open with a system turn dated 26 Jul 2024 unless told otherwise; 3.2's
         * template asks for today's date (strftime_now). */
        if (HAS("Cutting Knowledge Date"))
            return HAS("strftime_now") ? SRV_CHAT_LLAMA32 : SRV_CHAT_LLAMA31;
        return SRV_CHAT_LLAMA3;
    }
#undef HAS
    return SRV_CHAT_PLAIN;
}

/* The literal of a default system turn in a ChatML template's Jinja source: the text after
 * "<|im_start|>system" and its newline (a "\n" escape or a real one) up to "<|im_end|>", when
 * that text is plain (no quote, brace, plus or other escape: then it is an expression, such as
 * `+ messages[0]['content']`, not a literal). 0 and *out (NULL if there is none), or
 * KVS_ENOMEM. */
static int default_system_of(const char *t, char **out)
{
    *out = NULL;
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(t, head); p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else if (q[0] == '\n')
            q += 1;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q)
            continue;
        bool plain = true;
        for (const char *c = q; c < end && plain; c++)
            plain = !strchr("'\"{}+%", *c) && (*c != '\\' || c[1] == 'n');
        if (!plain)
            continue;
        kvs_buf b = {0};
        for (const char *c = q; c < end; c++) {
            if (*c == '\\') { /* the one escape allowed: \n */
                kvs_buf_add(&b, "\n");
                c++;
            } else {
                kvs_buf_addn(&b, c, 1);
            }
        }
        return kvs_buf_take(&b, out);
    }
    return 0;
}

/* Mistral's templates: the literal of `set default_system_message = '...'`, a Jinja string in
 * single quotes whose escapes (\n, \', \\, \") are read as Python reads them; its {today} and
 * {yesterday} are no Jinja, written as they are. 0 and *out (NULL if there is none or it is
 * empty), or KVS_ENOMEM. */
static int mistral_default_system(const char *t, char **out)
{
    *out = NULL;
    static const char head[] = "set default_system_message = '";
    const char *p = strstr(t, head);
    if (!p)
        return 0;
    kvs_buf b = {0};
    kvs_buf_add(&b, "");
    for (p += sizeof head - 1; *p && *p != '\''; p++) {
        if (*p != '\\') {
            kvs_buf_addn(&b, p, 1);
            continue;
        }
        char c = *++p;
        if (!c)
            break;
        kvs_buf_addn(&b, c == 'n' ? "\n" : c == 't' ? "\t" : p, 1);
    }
    if (!b.oom && (*p != '\'' || !b.len)) { /* unterminated or empty: none */
        free(b.p);
        return 0;
    }
    return kvs_buf_take(&b, out);
}

int srv_chat_fmt_detect(const char *tmpl, srv_chat_fmt *out)
{
    out->tmpl = srv_chat_detect(tmpl);
    out->default_system = NULL;
    out->eos_text = NULL;
    out->eos_var = tmpl && strstr(tmpl, "eos_token") != NULL;
    out->granite_spaced = tmpl && strstr(tmpl, "Knowledge Cutoff Date: April 2024. Today's Date") &&
                          out->tmpl != SRV_CHAT_GRANITE30;
    if (out->tmpl == SRV_CHAT_MISTRAL3 || out->tmpl == SRV_CHAT_MISTRAL3_THINK)
        return mistral_default_system(tmpl, &out->default_system);
    return out->tmpl == SRV_CHAT_CHATML ? default_system_of(tmpl, &out->default_system) : 0;
}

int srv_chat_fmt_set_eos(srv_chat_fmt *f, const char *eos_text)
{
    free(f->eos_text);
    f->eos_text = NULL;
    if (!f->eos_var || !eos_text)
        return 0;
    f->eos_text = strdup(eos_text);
    return f->eos_text ? 0 : KVS_ENOMEM;
}

void srv_chat_fmt_free(srv_chat_fmt *f)
{
    free(f->default_system);
    f->default_system = NULL;
    free(f->eos_text);
    f->eos_text = NULL;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void sb_add_trim(kvs_buf *b, const char *s)
{
    size_t n = strlen(s);
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    kvs_buf_addn(b, s, n);
}

int srv_chat_has_thinking(enum srv_chat_tmpl t)
{
    return t == SRV_CHAT_QWEN3 || t == SRV_CHAT_SMOLLM3 || t == SRV_CHAT_GRANITE32 ||
           t == SRV_CHAT_GRANITE33;
}

int srv_chat_may_think(enum srv_chat_tmpl t)
{
    return srv_chat_has_thinking(t) || t == SRV_CHAT_LFM25 || t == SRV_CHAT_LFM25_8B ||
           t == SRV_CHAT_MISTRAL3_THINK;
}

static bool is_nl(char c)
{
    return c == '\n';
}

/* s[0..n) without leading (lead) and trailing (trail) newlines: Python's lstrip('\n') and
 * rstrip('\n'), which Qwen 3's template applies around its think block. */
static void strip_nl(const char **s, size_t *n, bool lead, bool trail)
{
    while (lead && *n && is_nl(**s))
        (*s)++, (*n)--;
    while (trail && *n && is_nl((*s)[*n - 1]))
        (*n)--;
}

static const char *find_last(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k))
            return s + i;
    return NULL;
}

static bool starts_ends(const char *s, const char *head, const char *tail)
{
    size_t n = strlen(s), h = strlen(head), t = strlen(tail);
    return n >= h && n >= t && !memcmp(s, head, h) && !memcmp(s + n - t, tail, t);
}

/* Qwen 3 (its official template): ChatML whose assistant turns keep their <think> block only
 * after the last real user query (tool results, which arrive as user turns wrapped in
 * <tool_response>, do not count), and whose generation prompt closes an empty think block
 * when thinking is switched off. */
static void render_qwen3(kvs_buf *b, const srv_chat_msg *m, size_t n, int enable_thinking)
{
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0;)
        if (!strcmp(m[i].role, "user") &&
            !starts_ends(m[i].content, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        if (strcmp(m[i].role, "assistant")) {
            kvs_buf_add(b, "<|im_start|>");
            kvs_buf_add(b, m[i].role);
            kvs_buf_add(b, "\n");
            kvs_buf_add(b, c);
            kvs_buf_add(b, "<|im_end|>\n");
            continue;
        }
        size_t cn = strlen(c);
        const char *body = c, *think = "";
        size_t body_n = cn, think_n = 0;
        const char *first_end = strstr(c, "</think>");
        if (first_end) {
            const char *last_end = find_last(c, cn, "</think>");
            body = last_end + 8;
            body_n = (size_t)(c + cn - body);
            strip_nl(&body, &body_n, true, false);
            think = c;
            think_n = (size_t)(first_end - c);
            strip_nl(&think, &think_n, false, true);
            const char *open = find_last(think, think_n, "<think>");
            if (open) {
                think_n -= (size_t)(open + 7 - think);
                think = open + 7;
            }
            strip_nl(&think, &think_n, true, false);
        }
        kvs_buf_add(b, "<|im_start|>assistant\n");
        if (i > last_query && (i == n - 1 || think_n)) {
            strip_nl(&think, &think_n, true, true);
            strip_nl(&body, &body_n, true, false);
            kvs_buf_add(b, "<think>\n");
            kvs_buf_addn(b, think, think_n);
            kvs_buf_add(b, "\n</think>\n\n");
        }
        kvs_buf_addn(b, body, body_n);
        kvs_buf_add(b, "<|im_end|>\n");
    }
    kvs_buf_add(b, "<|im_start|>assistant\n");
    if (enable_thinking == 0)
        kvs_buf_add(b, "<think>\n\n</think>\n\n");
}

/* SmolLM3's custom instructions when a conversation gives none, in /think mode. */
static const char k_smollm3_think[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an "
    "assistant involves thoroughly exploring questions through a systematic thinking process "
    "before providing the final precise and accurate solutions. This requires engaging in a "
    "comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, "
    "backtracking, and iteration to develop well-considered thinking process. Please "
    "structure your response into two main sections: Thought and Solution using the specified "
    "format: <think> Thought section </think> Solution section. In the Thought section, "
    "detail your reasoning process in steps. Each step should include detailed considerations "
    "such as analysing questions, summarizing relevant findings, brainstorming new ideas, "
    "verifying the accuracy of the current steps, refining any errors, and revisiting "
    "previous steps. In the Solution section, based on various attempts, explorations, and "
    "reflections from the Thought section, systematically present the final solution that you "
    "deem correct. The Solution section should be logical, accurate, and concise and detail "
    "necessary steps needed to reach the conclusion.\n\n";

/* s without its trailing whitespace (Python's rstrip()), as a length. */
static size_t rstrip_len(const char *s, size_t n)
{
    while (n && (is_space(s[n - 1]) || s[n - 1] == '\v' || s[n - 1] == '\f'))
        n--;
    return n;
}

/* b += s with every occurrence of each of the n_cut needles removed, one needle after another
 * (Python's s.replace(a, "").replace(b, "")), then right-stripped. */
static void add_cut_rstrip(kvs_buf *b, const char *s, const char *const *cut, size_t n_cut)
{
    kvs_buf t = {0}, u = {0};
    kvs_buf_add(&t, s);
    for (size_t k = 0; k < n_cut && !t.oom; k++) {
        u.len = 0;
        kvs_buf_add(&u, "");
        size_t nl = strlen(cut[k]);
        for (const char *p = t.p, *q; !u.oom; p = q + nl) {
            q = strstr(p, cut[k]);
            if (!q) {
                kvs_buf_add(&u, p);
                break;
            }
            kvs_buf_addn(&u, p, (size_t)(q - p));
        }
        kvs_buf tmp = t;
        t = u;
        u = tmp;
    }
    if (t.oom || u.oom)
        b->oom = true;
    else
        kvs_buf_addn(b, t.p, rstrip_len(t.p, t.len));
    free(t.p);
    free(u.p);
}

/* date, or else today (local time, as llama.cpp's Jinja gives strftime_now) in the template's
 * strftime format fmt, written into buf */
static const char *date_or_today(const char *date, const char *fmt, char *buf, size_t cap)
{
    if (date)
        return date;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    if (!strftime(buf, cap, fmt, &tm))
        buf[0] = '\0';
    return buf;
}

/* SmolLM3 (its official template; srv_chat_render's header says what it writes). */
static void render_smollm3(kvs_buf *b, const srv_chat_msg *m, size_t n, int enable_thinking,
                           const char *date)
{
    bool think = enable_thinking != 0; /* the template's default: /think */
    const char *sys = n && !strcmp(m[0].role, "system") ? m[0].content : NULL;
    if (sys && strstr(sys, "/no_think"))
        think = false;
    else if (sys && strstr(sys, "/think"))
        think = true;
    static const char *const modes[] = {"/no_think", "/think"};
    kvs_buf_add(b, "<|im_start|>system\n");
    if (sys && strstr(sys, "/system_override")) {
        kvs_buf custom = {0};
        add_cut_rstrip(&custom, sys, modes, 2);
        kvs_buf_add(&custom, "");
        static const char *const override[] = {"/system_override"};
        if (!custom.oom)
            add_cut_rstrip(b, custom.p, override, 1);
        b->oom |= custom.oom;
        free(custom.p);
        kvs_buf_add(b, "<|im_end|>\n");
    } else {
        char today[64];
        date = date_or_today(date, "%d %B %Y", today, sizeof today);
        kvs_buf_add(b, "## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: ");
        kvs_buf_add(b, date);
        kvs_buf_add(b, think ? "\nReasoning Mode: /think\n\n" : "\nReasoning Mode: /no_think\n\n");
        kvs_buf_add(b, "## Custom Instructions\n\n");
        size_t before = b->len;
        if (sys)
            add_cut_rstrip(b, sys, modes, 2);
        if (b->len > before)
            kvs_buf_add(b, "\n\n");
        else
            kvs_buf_add(b, think
                               ? k_smollm3_think
                               : "You are a helpful AI assistant named SmolLM, trained by Hugging "
                                 "Face.\n\n");
        /* no <|im_end|>: the template writes it only after its tools section */
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content;
        if (!strcmp(role, "assistant")) {
            kvs_buf_add(b, think ? "<|im_start|>assistant\n"
                                 : "<|im_start|>assistant\n<think>\n\n</think>\n");
            while (*c == '\n')
                c++;
        } else if (!strcmp(role, "user") || !strcmp(role, "tool")) {
            kvs_buf_add(b, "<|im_start|>user\n");
        } else {
            continue; /* system messages (the first is the header's), other roles: not written */
        }
        kvs_buf_add(b, c);
        kvs_buf_add(b, "<|im_end|>\n");
    }
    kvs_buf_add(b,
                think ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n");
}

/* Llama 3.1 / 3.2 / 3.3: the first system message (trimmed) goes after the knowledge-cutoff
 * and today lines of a system turn that is always there. */
static void render_llama31(kvs_buf *b, const srv_chat_msg *m, size_t n, const char *date,
                           const char *tools)
{
    kvs_buf_add(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools)
        kvs_buf_add(b, "Environment: ipython\n");
    kvs_buf_add(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    kvs_buf_add(b, date);
    kvs_buf_add(b, "\n\n");
    size_t i = 0;
    if (n && !strcmp(m[0].role, "system"))
        sb_add_trim(b, m[i++].content);
    kvs_buf_add(b, "<|eot_id|>");
    if (tools) { /* the next message, whatever its role, is the user turn the tools open */
        kvs_buf_add(b, "<|start_header_id|>user<|end_header_id|>\n\n");
        kvs_buf_add(b, tools);
        if (i < n)
            sb_add_trim(b, m[i++].content);
        kvs_buf_add(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        kvs_buf_add(b, "<|start_header_id|>");
        kvs_buf_add(b, m[i].role);
        kvs_buf_add(b, "<|end_header_id|>\n\n");
        sb_add_trim(b, m[i].content);
        kvs_buf_add(b, "<|eot_id|>");
    }
    kvs_buf_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static const srv_chat_extra *extra_of(const srv_chat_opts *o, size_t i)
{
    static const srv_chat_extra none = {0};
    return o && o->extra ? &o->extra[i] : &none;
}

static bool has_channel_tags(const char *s)
{
    return s && (strstr(s, "<|channel|>analysis<|message|>") ||
                 strstr(s, "<|channel|>final<|message|>"));
}

/* Mistral's templates' exceptions (chat_template.h). */
static const char *check_mistral3(const srv_chat_msg *m, size_t n, const srv_chat_opts *opts,
                                  size_t *bad)
{
    size_t turn = 0; /* user and assistant turns without calls must alternate, user first */
    for (size_t i = n && !strcmp(m[0].role, "system") ? 1 : 0; i < n; i++) {
        const srv_chat_extra *x = extra_of(opts, i);
        bool user = !strcmp(m[i].role, "user"), asst = !strcmp(m[i].role, "assistant");
        *bad = i;
        if (!user && !asst && strcmp(m[i].role, "tool"))
            return "only user, assistant and tool roles are supported after the first system "
                   "message";
        if (user || (asst && !x->call_name)) {
            if (user != (turn % 2 == 0))
                return "after the optional system message, user and assistant roles must "
                       "alternate, except for tool calls and results";
            turn++;
        }
    }
    return NULL;
}

const char *srv_chat_check(enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n,
                           const srv_chat_opts *opts, size_t *bad)
{
    if (t == SRV_CHAT_MISTRAL3 || t == SRV_CHAT_MISTRAL3_THINK)
        return check_mistral3(m, n, opts, bad);
    if (t != SRV_CHAT_HARMONY)
        return NULL;
    bool called = false; /* the last assistant turn was a call (a final answer forgets it) */
    size_t first = n && !strcmp(m[0].role, "system") ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        const srv_chat_extra *x = extra_of(opts, i);
        *bad = i;
        if (!strcmp(m[i].role, "assistant")) {
            if (has_channel_tags(m[i].content))
                return "an assistant message's content holds <|channel|> tags: send the analysis "
                       "text as reasoning_content and the final text as content";
            if (has_channel_tags(x->thinking))
                return "an assistant message's reasoning_content holds <|channel|> tags: send "
                       "the analysis text alone";
            if (x->call_name && *m[i].content && x->thinking && *x->thinking)
                return "an assistant message with tool calls has both content and "
                       "reasoning_content: the template writes one analysis message, send one";
            called = x->call_name != NULL;
        } else if (!strcmp(m[i].role, "tool") && !called) {
            return "a tool message with no assistant tool call before it";
        }
    }
    return NULL;
}

/* gpt-oss's harmony template (chat_template.h); every assistant turn is followed by a
 * generation prompt here, so the template's training-only branch (the last assistant turn
 * written with its reasoning and <|return|>) is never taken. */
static void render_harmony(kvs_buf *b, const srv_chat_msg *m, size_t n, const srv_chat_opts *o)
{
    char today[32];
    const char *date = date_or_today(o->date, "%Y-%m-%d", today, sizeof today);
    kvs_buf_add(b, "<|start|>system<|message|>");
    kvs_buf_add(b, o->model_identity
                       ? o->model_identity
                       : "You are ChatGPT, a large language model trained by OpenAI.");
    kvs_buf_add(b, "\nKnowledge cutoff: 2024-06\nCurrent date: ");
    kvs_buf_add(b, date);
    kvs_buf_add(b, "\n\nReasoning: ");
    kvs_buf_add(b, o->reasoning_effort ? o->reasoning_effort : "medium");
    kvs_buf_add(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included "
                   "for every message.");
    if (o->tools_dev)
        kvs_buf_add(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    kvs_buf_add(b, "<|end|>");
    size_t i = 0;
    const char *dev = "";
    if (n && !strcmp(m[0].role, "system"))
        dev = m[i++].content;
    if (*dev || o->tools_dev) {
        kvs_buf_add(b, "<|start|>developer<|message|>");
        if (*dev) {
            kvs_buf_add(b, "# Instructions\n\n");
            kvs_buf_add(b, dev);
            kvs_buf_add(b, "\n\n");
        }
        if (o->tools_dev) {
            kvs_buf_add(b, "# Tools\n\n");
            kvs_buf_add(b, o->tools_dev);
        }
        kvs_buf_add(b, "<|end|>");
    }
    const char *last_call = NULL;
    for (; i < n; i++) {
        const srv_chat_extra *x = extra_of(o, i);
        if (!strcmp(m[i].role, "user")) {
            kvs_buf_add(b, "<|start|>user<|message|>");
            kvs_buf_add(b, m[i].content);
            kvs_buf_add(b, "<|end|>");
        } else if (!strcmp(m[i].role, "tool")) {
            kvs_buf_add(b, "<|start|>functions.");
            kvs_buf_add(b, last_call ? last_call : "");
            kvs_buf_add(b, " to=assistant<|channel|>commentary<|message|>");
            kvs_buf_add(b, m[i].content); /* already the JSON string tojson writes */
            kvs_buf_add(b, "<|end|>");
        } else if (!strcmp(m[i].role, "assistant") && x->call_name) {
            /* the reasoning before a call stays only while no later turn answers finally */
            bool answered = false;
            for (size_t j = i + 1; j < n && !answered; j++)
                answered = !strcmp(m[j].role, "assistant") && !extra_of(o, j)->call_name;
            const char *analysis = *m[i].content ? m[i].content : x->thinking;
            if (analysis && *analysis && !answered) {
                kvs_buf_add(b, "<|start|>assistant<|channel|>analysis<|message|>");
                kvs_buf_add(b, analysis);
                kvs_buf_add(b, "<|end|>");
            }
            kvs_buf_add(b, "<|start|>assistant to=functions.");
            kvs_buf_add(b, x->call_name);
            kvs_buf_add(b, "<|channel|>commentary json<|message|>");
            kvs_buf_add(b, x->call_args ? x->call_args : "{}");
            kvs_buf_add(b, "<|call|>");
            last_call = x->call_name;
        } else if (!strcmp(m[i].role, "assistant")) {
            kvs_buf_add(b, "<|start|>assistant<|channel|>final<|message|>");
            kvs_buf_add(b, m[i].content);
            kvs_buf_add(b, "<|end|>");
            last_call = NULL;
        }
        /* later system messages: the template renders only the first */
    }
    kvs_buf_add(b, "<|start|>assistant");
}

/* Granite 3.2's and 3.3's default system text with thinking on (after "You are Granite,
 * developed by IBM."): they differ in how the thoughts and the response are marked. */
#define GRANITE_THINK_TEXT                                                                         \
    " You are a helpful AI assistant.\nRespond to every user query in a comprehensive and "        \
    "detailed way. You can write down your thoughts and reasoning process before responding. In "  \
    "the thought process, engage in a comprehensive cycle of analysis, summarization, "            \
    "exploration, reassessment, reflection, backtracing, and iteration to develop "                \
    "well-considered thinking process. In the response section, based on various attempts, "       \
    "explorations, and reflections from the thoughts section, systematically present the final "   \
    "solution that you deem correct. The response should summarize the thought process. Write "    \
    "your thoughts "
static const char k_granite_think32[] =
    GRANITE_THINK_TEXT "after 'Here is my thought process:' and write your response after 'Here "
                       "is my response:' for each user query.";
static const char k_granite_think33[] =
    GRANITE_THINK_TEXT "between <think></think> and write your response between "
                       "<response></response> for each user query.";

/* Granite 3.1's, 3.2's and 3.3's templates (t; chat_template.h). */
static void render_granite(kvs_buf *b, enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n,
                           const srv_chat_opts *o)
{
    size_t i = 0;
    kvs_buf_add(b, "<|start_of_role|>system<|end_of_role|>");
    if (n && !strcmp(m[0].role, "system")) {
        kvs_buf_add(b, m[i++].content);
    } else {
        char today[64];
        const char *date = date_or_today(o->date, "%B %d, %Y", today, sizeof today);
        const char *sep = o->granite_spaced ? " " : "\n";
        kvs_buf_add(b, "Knowledge Cutoff Date: April 2024.");
        kvs_buf_add(b, sep);
        kvs_buf_add(b, "Today's Date: ");
        kvs_buf_add(b, date);
        kvs_buf_add(b, ".");
        kvs_buf_add(b, sep);
        kvs_buf_add(b, "You are Granite, developed by IBM.");
        /* the templates' branches: tools, else (3.2, 3.3) thinking, else the plain text */
        if (o->tools_user && t == SRV_CHAT_GRANITE33)
            kvs_buf_add(b, " You are a helpful assistant with access to the following tools. When "
                           "a tool is required to answer the user's query, respond only with "
                           "<|tool_call|> followed by a JSON list of tools used. If a tool does "
                           "not exist in the provided list of tools, notify the user that you do "
                           "not have the ability to fulfill the request.");
        else if (o->tools_user)
            kvs_buf_add(b, " You are a helpful AI assistant with access to the following tools. "
                           "When a tool is required to answer the user's query, respond with "
                           "<|tool_call|> followed by a JSON list of tools used. If a tool does "
                           "not exist in the provided list of tools, notify the user that you do "
                           "not have the ability to fulfill the request.");
        else if (o->enable_thinking == 1 && t != SRV_CHAT_GRANITE)
            kvs_buf_add(b, t == SRV_CHAT_GRANITE33 ? k_granite_think33 : k_granite_think32);
        else
            kvs_buf_add(b, " You are a helpful AI assistant.");
    }
    kvs_buf_add(b, "<|end_of_text|>\n");
    if (o->tools_user) {
        kvs_buf_add(b, t == SRV_CHAT_GRANITE33 ? "<|start_of_role|>available_tools<|end_of_role|>"
                                               : "<|start_of_role|>tools<|end_of_role|>");
        kvs_buf_add(b, o->tools_user);
        kvs_buf_add(b, "<|end_of_text|>\n");
    }
    for (; i < n; i++) {
        kvs_buf_add(b, "<|start_of_role|>");
        kvs_buf_add(b, m[i].role);
        kvs_buf_add(b, "<|end_of_role|>");
        kvs_buf_add(b, m[i].content);
        kvs_buf_add(b, "<|end_of_text|>\n");
        if (i == n - 1)
            kvs_buf_add(b, "<|start_of_role|>assistant<|end_of_role|>");
    }
}

/* Granite 3.0's template (chat_template.h). */
static void render_granite30(kvs_buf *b, const srv_chat_msg *m, size_t n, const srv_chat_opts *o)
{
    if (o->tools_user) {
        kvs_buf_add(b, "<|start_of_role|>available_tools<|end_of_role|>\n");
        kvs_buf_add(b, o->tools_user);
        kvs_buf_add(b, "<|end_of_text|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(m[i].role, "system") || !strcmp(m[i].role, "user") ||
            !strcmp(m[i].role, "assistant")) {
            kvs_buf_add(b, "<|start_of_role|>");
            kvs_buf_add(b, m[i].role);
            kvs_buf_add(b, "<|end_of_role|>");
            kvs_buf_add(b, m[i].content);
            kvs_buf_add(b, "<|end_of_text|>\n");
        }
        if (i == n - 1)
            kvs_buf_add(b, "<|start_of_role|>assistant<|end_of_role|>");
    }
}

/* Granite 4.0's template (chat_template.h). */
static void render_granite40(kvs_buf *b, const srv_chat_msg *m, size_t n)
{
    size_t i = 0;
    const char *sys = n && !strcmp(m[0].role, "system") ? m[i++].content : "";
    kvs_buf_add(b, "<|start_of_role|>system<|end_of_role|>");
    kvs_buf_add(b, *sys ? sys
                        : "You are a helpful assistant. Please ensure responses are "
                          "professional, accurate, and safe.");
    kvs_buf_add(b, "<|end_of_text|>\n");
    for (; i < n; i++) {
        if (strcmp(m[i].role, "user") && strcmp(m[i].role, "system") &&
            strcmp(m[i].role, "assistant"))
            continue;
        kvs_buf_add(b, "<|start_of_role|>");
        kvs_buf_add(b, m[i].role);
        kvs_buf_add(b, "<|end_of_role|>");
        kvs_buf_add(b, m[i].content);
        kvs_buf_add(b, "<|end_of_text|>\n");
    }
    kvs_buf_add(b, "<|start_of_role|>assistant<|end_of_role|>");
}

/* Jinja's trim (Python's strip()): s[0..n) without its leading and trailing whitespace. */
static void strip_ws(const char **s, size_t *n)
{
    while (*n && (is_space(**s) || **s == '\v' || **s == '\f'))
        (*s)++, (*n)--;
    *n = rstrip_len(*s, *n);
}

/* Liquid AI's LFM2, LFM2.5 and LFM2.5-8B-A1B templates (chat_template.h). */
static void render_lfm2(kvs_buf *b, enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n,
                        const srv_chat_opts *o)
{
    size_t i = 0;
    if (n && !strcmp(m[0].role, "system")) {
        if (*m[0].content) { /* the templates write no system turn for an empty text */
            kvs_buf_add(b, "<|im_start|>system\n");
            kvs_buf_add(b, m[0].content);
            kvs_buf_add(b, "<|im_end|>\n");
        }
        i = 1;
    }
    size_t last_asst = n, last_user = n; /* n: none */
    for (size_t j = i; j < n; j++) {
        if (!strcmp(m[j].role, "assistant"))
            last_asst = j;
        else if (!strcmp(m[j].role, "user"))
            last_user = j;
    }
    for (; i < n; i++) {
        const char *c = m[i].content;
        size_t cn = strlen(c);
        kvs_buf_add(b, "<|im_start|>");
        kvs_buf_add(b, m[i].role);
        kvs_buf_add(b, "\n");
        bool asst = !strcmp(m[i].role, "assistant");
        /* LFM2.5: an earlier answer keeps only its text after the last </think>, stripped
         * (1.2B's: every answer but the last; 8B's: those before the last user turn) */
        bool past = t == SRV_CHAT_LFM25 ? i != last_asst : last_user < n && i < last_user;
        if (asst && t != SRV_CHAT_LFM2 && past && !o->keep_thinking) {
            const char *end = find_last(c, cn, "</think>");
            if (end) {
                cn -= (size_t)(end + 8 - c);
                c = end + 8;
                strip_ws(&c, &cn);
            }
        }
        kvs_buf_addn(b, c, cn);
        if (asst && t == SRV_CHAT_LFM25_8B && extra_of(o, i)->calls)
            kvs_buf_add(b, extra_of(o, i)->calls);
        kvs_buf_add(b, "<|im_end|>\n");
    }
    kvs_buf_add(b, "<|im_start|>assistant\n");
}

int srv_chat_render(enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n,
                    const srv_chat_opts *opts, char **out)
{
    static const srv_chat_opts k_defaults = {.enable_thinking = -1};
    if (!opts)
        opts = &k_defaults;
    const char *eos = opts->eos_text ? opts->eos_text : "<|endoftext|>";
    kvs_buf b = {0};
    kvs_buf_add(&b, ""); /* an empty conversation still renders to a valid string */
    switch (t) {
    case SRV_CHAT_PLAIN:
        for (size_t i = 0; i < n; i++) {
            if (i)
                kvs_buf_add(&b, "\n");
            kvs_buf_add(&b, m[i].content);
        }
        break;
    case SRV_CHAT_CHATML:
        if (opts->default_system && !(n && !strcmp(m[0].role, "system"))) {
            kvs_buf_add(&b, "<|im_start|>system\n");
            kvs_buf_add(&b, opts->default_system);
            kvs_buf_add(&b, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n; i++) {
            kvs_buf_add(&b, "<|im_start|>");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "\n");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, "<|im_end|>\n");
        }
        kvs_buf_add(&b, "<|im_start|>assistant\n");
        break;
    case SRV_CHAT_LLAMA2: {
        /* [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST]assistant</s>[INST] user [/INST] */
        bool in_turn = true;
        kvs_buf_add(&b, "[INST] ");
        for (size_t i = 0; i < n; i++) {
            if (!in_turn) {
                kvs_buf_add(&b, "[INST] ");
                in_turn = true;
            }
            if (!strcmp(m[i].role, "system")) {
                kvs_buf_add(&b, "<<SYS>>\n");
                kvs_buf_add(&b, m[i].content);
                kvs_buf_add(&b, "\n<</SYS>>\n\n");
            } else if (!strcmp(m[i].role, "user")) {
                kvs_buf_add(&b, m[i].content);
                kvs_buf_add(&b, " [/INST]");
            } else {
                kvs_buf_add(&b, m[i].content);
                kvs_buf_add(&b, "</s>");
                in_turn = false;
            }
        }
        break;
    }
    case SRV_CHAT_MISTRAL: {
        /* Mistral v3: [INST] sys\n\nuser[/INST] assistant</s> */
        bool in_turn = false;
        for (size_t i = 0; i < n; i++) {
            if (!in_turn) {
                kvs_buf_add(&b, "[INST] ");
                in_turn = true;
            }
            if (!strcmp(m[i].role, "system")) {
                kvs_buf_add(&b, m[i].content);
                kvs_buf_add(&b, "\n\n");
            } else if (!strcmp(m[i].role, "user")) {
                kvs_buf_add(&b, m[i].content);
                kvs_buf_add(&b, "[/INST]");
            } else {
                kvs_buf_add(&b, " ");
                sb_add_trim(&b, m[i].content);
                kvs_buf_add(&b, "</s>");
                in_turn = false;
            }
        }
        break;
    }
    case SRV_CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            kvs_buf_add(&b, "<|start_header_id|>");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "<|end_header_id|>\n\n");
            sb_add_trim(&b, m[i].content);
            kvs_buf_add(&b, "<|eot_id|>");
        }
        kvs_buf_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case SRV_CHAT_LLAMA31: render_llama31(&b, m, n, "26 Jul 2024", opts->tools_user); break;
    case SRV_CHAT_LLAMA32: {
        char today[32];
        render_llama31(&b, m, n, date_or_today(opts->date, "%d %b %Y", today, sizeof today),
                       opts->tools_user);
        break;
    }
    case SRV_CHAT_QWEN3: render_qwen3(&b, m, n, opts->enable_thinking); break;
    case SRV_CHAT_HARMONY: render_harmony(&b, m, n, opts); break;
    case SRV_CHAT_SMOLLM3: render_smollm3(&b, m, n, opts->enable_thinking, opts->date); break;
    case SRV_CHAT_GRANITE:
    case SRV_CHAT_GRANITE32:
    case SRV_CHAT_GRANITE33: render_granite(&b, t, m, n, opts); break;
    case SRV_CHAT_GRANITE30: render_granite30(&b, m, n, opts); break;
    case SRV_CHAT_GRANITE40: render_granite40(&b, m, n); break;
    case SRV_CHAT_ERNIE45:
        kvs_buf_add(&b, "<|begin_of_sentence|>");
        for (size_t i = 0; i < n; i++) {
            bool user = !strcmp(m[i].role, "user"), asst = !strcmp(m[i].role, "assistant");
            if (!user && !asst && strcmp(m[i].role, "system"))
                continue;
            kvs_buf_add(&b, user ? "User: " : asst ? "Assistant: " : "");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, asst ? "<|end_of_sentence|>" : "\n");
        }
        kvs_buf_add(&b, "Assistant: ");
        break;
    case SRV_CHAT_LFM2:
    case SRV_CHAT_LFM25:
    case SRV_CHAT_LFM25_8B: render_lfm2(&b, t, m, n, opts); break;
    case SRV_CHAT_MISTRAL3:
    case SRV_CHAT_MISTRAL3_THINK: {
        size_t i = 0;
        const char *sys = opts->default_system;
        if (n && !strcmp(m[0].role, "system"))
            sys = m[i++].content;
        if (sys) {
            kvs_buf_add(&b, "[SYSTEM_PROMPT]");
            kvs_buf_add(&b, sys);
            kvs_buf_add(&b, "[/SYSTEM_PROMPT]");
        }
        if (opts->tools_user)
            kvs_buf_add(&b, opts->tools_user);
        for (; i < n; i++) {
            bool user = !strcmp(m[i].role, "user"), asst = !strcmp(m[i].role, "assistant");
            kvs_buf_add(&b, user ? "[INST]" : "");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, user ? "[/INST]" : asst ? "</s>" : "");
        }
        break;
    }
    case SRV_CHAT_COUNT: break;
    case SRV_CHAT_ZEPHYR: /* every turn closed by eos_token (TinyLlama's </s>) and a newline */
        for (size_t i = 0; i < n; i++) {
            kvs_buf_add(&b, "<|");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "|>\n");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, eos);
            kvs_buf_add(&b, "\n");
        }
        kvs_buf_add(&b, "<|assistant|>\n");
        break;
    case SRV_CHAT_OLMO2: /* system, user and assistant turns only (its template writes no other) */
        for (size_t i = 0; i < n; i++) {
            bool asst = !strcmp(m[i].role, "assistant");
            if (!asst && strcmp(m[i].role, "system") && strcmp(m[i].role, "user"))
                continue;
            kvs_buf_add(&b, "<|");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "|>\n");
            kvs_buf_add(&b, m[i].content);
            if (asst)
                kvs_buf_add(&b, eos);
            if (!asst || i + 1 < n)
                kvs_buf_add(&b, "\n");
        }
        kvs_buf_add(&b, "<|assistant|>\n");
        break;
    case SRV_CHAT_PHI3:
        for (size_t i = 0; i < n; i++) {
            if (!strcmp(m[i].role, "system") && !*m[i].content)
                continue; /* Phi-3.5's template writes a system turn only with content */
            kvs_buf_add(&b, "<|");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "|>\n");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, "<|end|>\n");
        }
        kvs_buf_add(&b, "<|assistant|>\n");
        break;
    case SRV_CHAT_GEMMA: {
        /* Gemma has no system role: the system text is prepended to the next user turn. */
        kvs_buf sys = {0};
        for (size_t i = 0; i < n; i++) {
            if (!strcmp(m[i].role, "system")) {
                kvs_buf_add(&sys, m[i].content); /* as Gemma 3: untrimmed, then "\n\n" */
                continue;
            }
            bool model = !strcmp(m[i].role, "assistant");
            kvs_buf_add(&b, "<start_of_turn>");
            kvs_buf_add(&b, model ? "model" : m[i].role);
            kvs_buf_add(&b, "\n");
            if (sys.len && !model) {
                kvs_buf_add(&b, sys.p);
                kvs_buf_add(&b, "\n\n");
                sys.len = 0;
            }
            sb_add_trim(&b, m[i].content);
            kvs_buf_add(&b, "<end_of_turn>\n");
        }
        /* A system text with no user turn after it (found by fuzz_chat_template): rather than
         * dropping it, give it a user turn of its own. */
        if (sys.len) {
            kvs_buf_add(&b, "<start_of_turn>user\n");
            sb_add_trim(&b, sys.p); /* the text is a turn's content here, trimmed as one */
            kvs_buf_add(&b, "<end_of_turn>\n");
        }
        if (sys.oom)
            b.oom = true;
        free(sys.p);
        kvs_buf_add(&b, "<start_of_turn>model\n");
        break;
    }
    }
    if (b.oom) {
        free(b.p);
        return KVS_ENOMEM;
    }
    *out = b.p;
    return 0;
}
