/* Chat templates: renders OpenAI chat messages into prompt text for the common families,
 * detected from the GGUF's tokenizer.chat_template by characteristic substrings (as llama.cpp's
 * llm_chat_detect_template does; no Jinja interpreter). The rendered text is meant to be
 * tokenized with parse_special=true so markers like <|im_start|> become their control tokens.
 *
 * PLAIN, for models without a template (stories260K): message contents joined by "\n" with no
 * roles or markers, so a single user message "Once upon a time" renders to exactly that text.
 * Pure functions, any thread. */
#ifndef KVS_SERVER_CHAT_TEMPLATE_H
#define KVS_SERVER_CHAT_TEMPLATE_H

#include <stddef.h>

enum srv_chat_tmpl {
    SRV_CHAT_PLAIN = 0,
    SRV_CHAT_CHATML,
    SRV_CHAT_LLAMA2,
    SRV_CHAT_LLAMA3,
    SRV_CHAT_ZEPHYR,
    SRV_CHAT_MISTRAL,
    SRV_CHAT_GEMMA,
    SRV_CHAT_PHI3,
    SRV_CHAT_QWEN3,   /* ChatML with <think> blocks and the enable_thinking switch */
    SRV_CHAT_LLAMA31, /* Llama 3.1 / 3.3: a system turn with the knowledge and "today" dates */
    SRV_CHAT_LLAMA32, /* Llama 3.2: the same with the real date of today */
    SRV_CHAT_HARMONY, /* gpt-oss: OpenAI's harmony format (channels, a dated system message) */
    SRV_CHAT_SMOLLM3, /* SmolLM3: ChatML under a dated metadata system turn, /think, /no_think */
    SRV_CHAT_GRANITE, /* Granite 3.1: <|start_of_role|>..., a default system message dated today */
    SRV_CHAT_GRANITE30, /* Granite 3.0: the same turns, no default system message */
    SRV_CHAT_GRANITE32, /* Granite 3.2: 3.1's with the thinking switch (a reasoning system text) */
    SRV_CHAT_GRANITE33, /* Granite 3.3: 3.2's, tools in an available_tools turn, <think> */
    SRV_CHAT_ERNIE45,   /* ERNIE 4.5: "User: ...\n", "Assistant: ...<|end_of_sentence|>" */
    SRV_CHAT_LFM2,      /* Liquid AI LFM2: ChatML, tools in <|tool_list_start|>, results wrapped */
    SRV_CHAT_LFM25,     /* LFM2.5-1.2B: ChatML, earlier answers' <think> blocks dropped */
    SRV_CHAT_LFM25_8B,  /* LFM2.5-8B-A1B: LFM2.5's, dated tools, earlier calls written back */
    SRV_CHAT_OLMO2,     /* OLMo 2 (Tulu 3): <|user|>\n...\n, answers closed by the EOS text */
    SRV_CHAT_GRANITE40, /* Granite 4.0: <|start_of_role|> turns, tools in <tools> in the system */
    SRV_CHAT_MISTRAL3,  /* Mistral's current format (Ministral 3, Mistral Small 3.2, Devstral):
                           [SYSTEM_PROMPT], [AVAILABLE_TOOLS], [INST], [TOOL_CALLS]name[ARGS] */
    SRV_CHAT_MISTRAL3_THINK, /* the same, answers opening with [THINK] (Ministral 3 Reasoning,
                                Magistral) */
    SRV_CHAT_COUNT
};

/* A model's chat format: its family, and what its template writes beyond the family's form. */
typedef struct srv_chat_fmt {
    enum srv_chat_tmpl tmpl;
    /* ChatML: the system turn's text the template writes when a conversation has none (Qwen
     * 2.5's "You are Qwen, created by Alibaba Cloud. ...", SmolLM2's); MISTRAL3: its
     * default_system_message literal; malloc'd; NULL: none */
    char *default_system;
    /* Granite 3.x: the template's default system text joins its knowledge cutoff, today's date
     * and "You are Granite" with spaces, not newlines (as the copy of Granite 3.3's template
     * in llama.cpp's models/templates does) */
    int granite_spaced;
    /* The vocabulary's EOS text where the template writes eos_token (Zephyr's and TinyLlama's
     * turns, OLMo 2's answers), malloc'd (srv_chat_fmt_set_eos); NULL: "<|endoftext|>", the
     * text of the templates that spell it out */
    char *eos_text;
    int eos_var; /* the template writes eos_token (srv_chat_fmt_detect) */
} srv_chat_fmt;

/* What a request may change in a rendering (chat_template_kwargs), and the model's defaults. */
typedef struct srv_chat_opts {
    /* -1: the template's default; 0 or 1 (templates with the switch: Qwen 3's and SmolLM3's
     * enable_thinking, Granite 3.2's and 3.3's thinking) */
    int enable_thinking;
    const char *default_system; /* srv_chat_fmt's, or NULL */
    int granite_spaced;         /* srv_chat_fmt's */
    /* LFM2.5: earlier answers keep their think blocks (its 1.2B template's keep_past_thinking,
     * 8B's preserve_thinking; off by default, as there) */
    int keep_thinking;
    /* Llama 3.1/3.2: the tools' text, written at the start of the first user turn (with
     * "Environment: ipython" in the system turn), as their templates do; Granite: its tools
     * turn's text (and the default system text that says so); NULL: no tools */
    const char *tools_user;
    /* Llama 3.2's "Today Date" ("01 Dec 2026"), harmony's "Current date" ("2026-12-01"),
     * SmolLM3's "Today Date" ("01 December 2026"), Granite's "Today's Date" ("December 01,
     * 2026"); NULL: today (local time) in the family's
     * form */
    const char *date;
    /* Harmony: the system message's "Reasoning:" ("low", "medium", "high"); NULL: medium */
    const char *reasoning_effort;
    /* Harmony: the system message's first line; NULL: the template's "You are ChatGPT, ..." */
    const char *model_identity;
    /* Harmony: NULL, or one entry per message (parallel to msgs): what an assistant turn
     * carries beside its content */
    const struct srv_chat_extra *extra;
    /* Harmony: the developer message's "# Tools" section (the functions namespace, as the
     * template writes it); NULL: no tools */
    const char *tools_dev;
    const char *eos_text; /* srv_chat_fmt's */
} srv_chat_opts;

/* Harmony: an assistant message's reasoning and first tool call (the template renders one).
 * LFM2.5-8B: an assistant message's calls. */
typedef struct srv_chat_extra {
    const char *thinking;  /* reasoning_content, or NULL */
    const char *call_name; /* the first tool call's function name; NULL: no tool calls */
    const char *call_args; /* its arguments as the template's tojson writes them */
    /* LFM2.5-8B: the calls as its template writes them after the content
     * (<|tool_call_start|>[f(a=1)]<|tool_call_end|>), or NULL */
    const char *calls;
} srv_chat_extra;

typedef struct srv_chat_msg {
    const char *role;    /* "system", "user", "assistant" (others passed through) */
    const char *content; /* NUL-terminated */
} srv_chat_msg;

/* The family of a GGUF chat template (NULL or unrecognised: PLAIN). */
enum srv_chat_tmpl srv_chat_detect(const char *tmpl);
/* srv_chat_detect plus the default system text a ChatML template writes as a literal. Returns 0
 * or KVS_ENOMEM; free with srv_chat_fmt_free. */
int srv_chat_fmt_detect(const char *tmpl, srv_chat_fmt *out);
/* The vocabulary's EOS text (NULL: none), kept where the template writes eos_token. 0 or
 * KVS_ENOMEM. */
int srv_chat_fmt_set_eos(srv_chat_fmt *f, const char *eos_text);
void srv_chat_fmt_free(srv_chat_fmt *f);
/* By name: chatml, llama2, llama3, zephyr, mistral, gemma, phi3, qwen3, llama3.1, llama3.2,
 * harmony, smollm3, granite, granite3.0, granite3.2, granite3.3, granite4.0, ernie4.5, lfm2,
 * lfm2.5, lfm2.5-8b, olmo2, mistral3, mistral3-think, plain. -1 if unknown. */
int srv_chat_from_name(const char *name);
const char *srv_chat_name(enum srv_chat_tmpl t);

/* Whether the family has a thinking switch and its answers may open with a <think> block
 * (split into reasoning_content): Qwen 3, SmolLM3 (chat_template_kwargs.enable_thinking),
 * Granite 3.2 and 3.3 (chat_template_kwargs.thinking). */
int srv_chat_has_thinking(enum srv_chat_tmpl t);
/* Whether the family's answers may open with a <think> block, split into reasoning_content:
 * those with the switch, LFM2.5's (its thinking models think always; no switch), and
 * MISTRAL3_THINK's [THINK] block (reasoning.h). */
int srv_chat_may_think(enum srv_chat_tmpl t);

/* Renders msgs (with the assistant generation prompt at the end) into a malloc'd string;
 * opts NULL: the defaults. Returns 0 and *out, or KVS_ENOMEM.
 *
 * HARMONY (gpt-oss's official template): a system message naming the model, its knowledge
 * cutoff, today's date and the reasoning effort; the conversation's first system message as
 * the developer message's "# Instructions" (later ones are not rendered); user turns; an
 * assistant turn as its final channel (its reasoning dropped), or, with a tool call, the call on
 * the commentary channel after its reasoning (content, or else extra's thinking) in the
 * analysis channel unless a later assistant turn answers without calls; a tool result as a
 * message from the last call's function, its content a JSON string. What the template refuses
 * (srv_chat_check) must be refused before rendering.
 *
 * SMOLLM3 (SmolLM3-3B's official template): a system turn of metadata (knowledge cutoff,
 * today's date, "Reasoning Mode: /think" or "/no_think") and custom instructions (the first
 * system message with /think and /no_think removed, which also switch the mode; else the
 * template's default text), which the template leaves without <|im_end|> unless it writes its
 * tools section (never here: kvserve passes no xml_tools); a first system message containing
 * /system_override replaces that turn (closed); user and tool turns as ChatML user turns;
 * assistant turns with their leading newlines dropped, after an empty think block in /no_think
 * mode; other system messages are not written; the generation prompt opens an assistant turn,
 * with an empty think block in /no_think mode.
 *
 * GRANITE (Granite 3.1's official template): a system turn always, the conversation's first
 * system message or else the template's default (its knowledge cutoff, today's date, "You are
 * Granite, developed by IBM. You are a helpful AI assistant."); then every other message as a
 * turn of its role, untrimmed; the generation prompt follows the last of them (a conversation of
 * one system message gets none, as the template writes it).
 *
 * GRANITE32, GRANITE33 (Granite 3.2's and 3.3's official templates): GRANITE's, whose default
 * system message, with thinking on (opts->enable_thinking 1; the template's default is off)
 * and no tools, asks for the thoughts and the response apart: 3.2's after "Here is my thought
 * process:" and "Here is my response:", 3.3's between <think></think> and
 * <response></response>. 3.3 words the tools sentence of its default system message its own
 * way and names its tools turn available_tools. Their documents and controls are not rendered
 * (the request has no way to give them).
 *
 * GRANITE30 (Granite 3.0's official template): the tools first (an available_tools turn), then
 * system, user and assistant messages as turns of their role (a tool result, role tool, is not
 * written: the template knows only its own tool_response role), and the generation prompt.
 *
 * GRANITE40 (Granite 4.0's official template, shared by granite-4.0-micro, -h-micro, -h-tiny
 * and -h-small): a system turn always, the conversation's first system
 * message (the tools' text after it, server/api.c) or, when that is absent or empty, the
 * template's default "You are a helpful assistant. Please ensure responses are professional,
 * accurate, and safe."; then user, assistant and later system messages as turns of their role,
 * untrimmed (an assistant's calls already written after its content, and tool results already
 * a user turn of <tool_response> blocks, tool_calls.h); other roles are not written; the
 * generation prompt. Its documents are not rendered (the request has no way to give them).
 *
 * ERNIE45 (ERNIE 4.5's official template): <|begin_of_sentence|> (its cls_token, not the
 * vocabulary's BOS <s>, so written here), then each system message's content and a newline,
 * each user turn as "User: " content and a newline, each assistant turn as "Assistant: " content
 * and <|end_of_sentence|>, all untrimmed; other roles (a tool result) are not written, as the
 * template writes none; the generation prompt "Assistant: ".
 *
 * LFM2 (Liquid AI LFM2's official template): ChatML under the vocabulary's BOS <|startoftext|>
 * (added by the tokenizer); a first system message (the tools' text after it, server/api.c)
 * is a system turn only when not empty; every other message a turn of its role, untrimmed (a
 * tool result already wrapped in <|tool_response_start|>...<|tool_response_end|>,
 * tool_calls.h); an earlier call is not written back, as the template writes content alone.
 *
 * LFM25 (LFM2.5-1.2B-Instruct's template): LFM2's, but the assistant turns before the last
 * one, where they hold </think>, are only their text after the last </think>, stripped, unless
 * opts->keep_thinking (its keep_past_thinking). A tool result is written as it is.
 *
 * LFM25_8B (LFM2.5-8B-A1B's template, llama.cpp's models/templates copy): LFM25's, but the
 * <think> blocks are dropped from the assistant turns before the last user turn (unless
 * opts->keep_thinking, its preserve_thinking), and an
 * assistant turn's calls (opts->extra[i].calls) follow its content.
 *
 * MISTRAL3, MISTRAL3_THINK (Ministral 3's Instruct and Reasoning templates, generated by
 * mistral-common as Magistral's and Devstral's): [SYSTEM_PROMPT] with the first system
 * message, else the template's default (opts->default_system; none: no system prompt), then
 * [/SYSTEM_PROMPT]; the tools' text (opts->tools_user: [AVAILABLE_TOOLS]tools|tojson
 * [/AVAILABLE_TOOLS]); user turns as [INST]content[/INST], assistant turns as their content
 * (their calls already after it: [TOOL_CALLS]name[ARGS]arguments each) and </s>, tool results
 * as their text ([TOOL_RESULTS]content[/TOOL_RESULTS], tool_calls.h), untrimmed; no generation
 * prompt (the template writes none: the answer follows [/INST]). What the template raises on
 * (srv_chat_check) must be refused before rendering. */
int srv_chat_render(enum srv_chat_tmpl t, const srv_chat_msg *msgs, size_t n,
                    const srv_chat_opts *opts, char **out);

/* What family t's template raises an exception on (harmony: channel tags inside an assistant's
 * content or reasoning, a call with both content and reasoning, a tool result with no call
 * before it; MISTRAL3: a system message after the first, user and assistant turns that do not
 * alternate (an assistant turn with calls, opts->extra[i].call_name, and tool results aside)):
 * NULL if msgs render, else a static
 * sentence saying why, and *bad the message's index. */
const char *srv_chat_check(enum srv_chat_tmpl t, const srv_chat_msg *msgs, size_t n,
                           const srv_chat_opts *opts, size_t *bad);

#endif
