/* Chat templates: detection from real template snippets and each family's rendering of a
 * system + user + assistant + user conversation with the generation prompt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/chat_template.h"

static const srv_chat_msg k_conv[] = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "Bye"},
};

static void check(enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n, const char *want)
{
    char *got = NULL;
    srv_chat_opts o = {.enable_thinking = -1, .date = "01 Dec 2026"};
    assert_int_equal(srv_chat_render(t, m, n, &o, &got), 0);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(srv_chat_detect(NULL), SRV_CHAT_PLAIN);
    assert_int_equal(srv_chat_detect(""), SRV_CHAT_PLAIN);
    assert_int_equal(srv_chat_detect("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n'"
                                     " + m['content'] + '<|im_end|>\\n'}}{% endfor %}"),
                     SRV_CHAT_CHATML);
    assert_int_equal(srv_chat_detect("{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
                                     "{{ '[INST] <<SYS>>\\n' + system_message }}"),
                     SRV_CHAT_LLAMA2);
    assert_int_equal(srv_chat_detect("{% set content = '<|start_header_id|>' + message['role'] +"
                                     " '<|end_header_id|>\\n\\n'+ message['content'] | trim +"
                                     " '<|eot_id|>' %}"),
                     SRV_CHAT_LLAMA3);
    assert_int_equal(srv_chat_detect("{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
                                     "message['content'] + eos_token }}"),
                     SRV_CHAT_ZEPHYR);
    assert_int_equal(srv_chat_detect("{%- if loop.last and system_message is defined %}"
                                     "{{- '[INST] ' + system_message + '\\n\\n' }}"
                                     "{%- if tools is not none %}[AVAILABLE_TOOLS]"),
                     SRV_CHAT_MISTRAL);
    assert_int_equal(srv_chat_detect("{{ '<start_of_turn>' + role + '\\n' + message['content'] "
                                     "| trim + '<end_of_turn>\\n' }}"),
                     SRV_CHAT_GEMMA);
    assert_int_equal(srv_chat_detect("{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + "
                                     "'\\n' + '<|assistant|>' + '\\n'}}"),
                     SRV_CHAT_PHI3);
    assert_int_equal(srv_chat_detect("{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is "
                                     "defined and enable_thinking is false %}"),
                     SRV_CHAT_QWEN3);
    assert_int_equal(srv_chat_detect("{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                                     "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"),
                     SRV_CHAT_LLAMA31);
    assert_int_equal(srv_chat_detect("{%- set date_string = strftime_now(\"%d %b %Y\") %}"
                                     "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
                                     "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"),
                     SRV_CHAT_LLAMA32);
    /* gpt-oss: harmony's markers, though the template also writes Phi-3's <|end|> */
    assert_int_equal(srv_chat_detect("{{- \"<|start|>system<|message|>\" }}{{- \"<|end|>\" }}"
                                     "{{- \"<|start|>assistant<|channel|>final<|message|>\" + "
                                     "message.content + \"<|end|>\" }}"),
                     SRV_CHAT_HARMONY);
    /* SmolLM3: ChatML that reads enable_thinking too, but under its metadata system turn */
    assert_int_equal(
        srv_chat_detect("{%- if enable_thinking -%}{%- set reasoning_mode = \"/think\" "
                        "-%}{%- else -%}{%- set reasoning_mode = \"/no_think\" -%}"
                        "{%- endif -%}{{- \"<|im_start|>system\\n\" -}}{{- "
                        "\"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}"),
        SRV_CHAT_SMOLLM3);
    assert_int_equal(srv_chat_detect("{{- '<|start_of_role|>' + message['role'] + "
                                     "'<|end_of_role|>' + message['content'] + "
                                     "'<|end_of_text|>\\n' }}"),
                     SRV_CHAT_GRANITE30);
    assert_int_equal(srv_chat_detect("{%- set system_message = \"Knowledge Cutoff Date: April "
                                     "2024.\\nToday's Date: \" %}{{- '<|start_of_role|>system"
                                     "<|end_of_role|>' + system_message }}"),
                     SRV_CHAT_GRANITE);
    /* Granite 3.2 and 3.3: the dated default with a thinking text (3.3's asks for <think>) */
    assert_int_equal(srv_chat_detect("{%- set system_message = \"Knowledge Cutoff Date: April "
                                     "2024.\" %}{%- elif thinking %}{%- set system_message = "
                                     "system_message + \" Write your thoughts after 'Here is my "
                                     "thought process:'\" %}{{- '<|start_of_role|>system"
                                     "<|end_of_role|>' + system_message }}"),
                     SRV_CHAT_GRANITE32);
    assert_int_equal(srv_chat_detect("{%- set system_message = \"Knowledge Cutoff Date: April "
                                     "2024.\" %}{%- elif thinking %}{%- set system_message = "
                                     "system_message + \" Write your thoughts between "
                                     "<think></think>\" %}{{- '<|start_of_role|>system"
                                     "<|end_of_role|>' + system_message }}"),
                     SRV_CHAT_GRANITE33);
    /* Granite 4.0: the same role markers, its tools in <tools> and calls in <tool_call> tags
     * (either alone tells it from 3.x, as llama.cpp's detection) */
    assert_int_equal(srv_chat_detect("{%- set tools_system_message_prefix = 'You are provided "
                                     "with function signatures within <tools></tools> XML tags:"
                                     "\\n<tools>' %}{{- '<|start_of_role|>system<|end_of_role|>'"
                                     " + ns.system_message + '<|end_of_text|>\\n' }}"),
                     SRV_CHAT_GRANITE40);
    assert_int_equal(srv_chat_detect("{{- '<|start_of_role|>' + message.role + "
                                     "'<|end_of_role|>' + content.val }}{{- '<tool_call>\\n{\"name"
                                     "\": \"' }}"),
                     SRV_CHAT_GRANITE40);
    assert_int_equal(srv_chat_from_name("granite4.0"), SRV_CHAT_GRANITE40);
    assert_int_equal(srv_chat_from_name("granite3.2"), SRV_CHAT_GRANITE32);
    assert_int_equal(srv_chat_from_name("granite3.3"), SRV_CHAT_GRANITE33);
    /* ERNIE 4.5: its cls_token and sep_token around "User: " / "Assistant: " turns */
    assert_int_equal(srv_chat_detect("{%- set cls_token = \"<|begin_of_sentence|>\" -%}{%- set "
                                     "sep_token = \"<|end_of_sentence|>\" -%}{{- \"Assistant: \" "
                                     "+ message[\"content\"] + sep_token -}}"),
                     SRV_CHAT_ERNIE45);
    /* Liquid AI's LFM2 family: its tool list between markers, LFM2.5's bare, LFM2.5-8B-A1B's
     * writing calls back; "List of tools: " alone, without ChatML, is not one */
    assert_int_equal(srv_chat_detect("{{- \"<|im_start|>system\\n\" -}}{%- set p = \"List of "
                                     "tools: <|tool_list_start|>[\" -%}]<|tool_list_end|>"),
                     SRV_CHAT_LFM2);
    assert_int_equal(srv_chat_detect("{{- \"<|im_start|>\" -}}{%- set p = \"List of tools: [\" "
                                     "-%}{%- if \"</think>\" in content -%}"),
                     SRV_CHAT_LFM25);
    assert_int_equal(srv_chat_detect("{{- \"<|im_start|>\" -}}\"List of tools: \" + (tools | "
                                     "tojson){{- \"<|tool_call_start|>[\" -}}"),
                     SRV_CHAT_LFM25_8B);
    assert_int_equal(srv_chat_detect("List of tools: <|tool_list_start|>"), SRV_CHAT_PLAIN);
    assert_int_equal(srv_chat_from_name("lfm2.5-8b"), SRV_CHAT_LFM25_8B);
    /* Mistral's current templates: [SYSTEM_PROMPT] and calls as name[ARGS]; [THINK] where they
     * handle thinking chunks; Mistral Small 3.1's older tool template (a JSON list after
     * [TOOL_CALLS], no [ARGS]) stays v3's */
    assert_int_equal(srv_chat_detect("{{- '[SYSTEM_PROMPT]' -}}{{- '[INST]' + c + '[/INST]' }}"
                                     "{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}"),
                     SRV_CHAT_MISTRAL3);
    assert_int_equal(srv_chat_detect("{{- '[SYSTEM_PROMPT]' -}}{{- '[INST]' + c + '[/INST]' }}"
                                     "{{- '[THINK]' + block['thinking'] + '[/THINK]' }}"
                                     "{{- name + '[ARGS]' + arguments }}"),
                     SRV_CHAT_MISTRAL3_THINK);
    assert_int_equal(srv_chat_detect("{{- '[SYSTEM_PROMPT]' + s + '[/SYSTEM_PROMPT]' }}[INST]"
                                     "{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[TOOL_CALLS] [\" }}"),
                     SRV_CHAT_MISTRAL);
    assert_int_equal(srv_chat_from_name("mistral3"), SRV_CHAT_MISTRAL3);
    assert_int_equal(srv_chat_from_name("mistral3-think"), SRV_CHAT_MISTRAL3_THINK);
    assert_int_equal(srv_chat_detect("{{ message['content'] }}"), SRV_CHAT_PLAIN);
}

/* A ChatML template's default system turn is read only where it is a literal. */
static void test_default_system(void **state)
{
    (void)state;
    srv_chat_fmt f;
    assert_int_equal(
        srv_chat_fmt_detect(
            "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
            "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou "
            "are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}",
            &f),
        0);
    assert_int_equal(f.tmpl, SRV_CHAT_CHATML);
    assert_string_equal(f.default_system,
                        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    srv_chat_msg one[] = {{"user", "Hi"}};
    char *got = NULL;
    srv_chat_opts o = {.enable_thinking = -1, .default_system = f.default_system};
    assert_int_equal(srv_chat_render(f.tmpl, one, 1, &o, &got), 0);
    assert_string_equal(got, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are "
                             "a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\n");
    free(got);
    /* a system message of the conversation's own replaces it */
    assert_int_equal(srv_chat_render(f.tmpl, k_conv, 2, &o, &got), 0);
    assert_string_equal(got, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                             "<|im_end|>\n<|im_start|>assistant\n");
    free(got);
    srv_chat_fmt_free(&f);
    /* no literal: an expression after the marker, or no default at all */
    assert_int_equal(srv_chat_fmt_detect("{{'<|im_start|>system\\n' + m['content'] + "
                                         "'<|im_end|>'}}{{'<|im_start|>' + role}}",
                                         &f),
                     0);
    assert_int_equal(f.tmpl, SRV_CHAT_CHATML);
    assert_null(f.default_system);
    assert_int_equal(srv_chat_fmt_detect("{{ message['content'] }}", &f), 0);
    assert_null(f.default_system);
}

/* Mistral's default_system_message literal: Python's escapes read, {today} left as written; an
 * empty one is none. */
static void test_mistral3_default_system(void **state)
{
    (void)state;
    srv_chat_fmt f;
    assert_int_equal(srv_chat_fmt_detect("{%- set default_system_message = 'You\\'re \"M\".\\nThe "
                                         "date is {today}.\\\\' %}{{- '[SYSTEM_PROMPT]' -}}[INST]"
                                         "{{- '[TOOL_CALLS]' + n + '[ARGS]' }}",
                                         &f),
                     0);
    assert_int_equal(f.tmpl, SRV_CHAT_MISTRAL3);
    assert_string_equal(f.default_system, "You're \"M\".\nThe date is {today}.\\");
    srv_chat_fmt_free(&f);
    assert_int_equal(srv_chat_fmt_detect("{%- set default_system_message = '' %}[SYSTEM_PROMPT]"
                                         "[INST][ARGS][THINK]",
                                         &f),
                     0);
    assert_int_equal(f.tmpl, SRV_CHAT_MISTRAL3_THINK);
    assert_null(f.default_system);
}

/* Mistral's current format (checked against llama-server's Jinja in peer_templates): the system
 * prompt (the first system message, else the default), the tools, [INST] turns, answers closed
 * by </s> with their calls already in their text, tool results as written, no generation
 * prompt; what the templates raise on refused by srv_chat_check. */
static void test_mistral3(void **state)
{
    (void)state;
    for (int t = SRV_CHAT_MISTRAL3; t <= SRV_CHAT_MISTRAL3_THINK; t++) {
        check((enum srv_chat_tmpl)t, k_conv, 4,
              "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]Hello!</s>[INST]Bye[/INST]");
        const srv_chat_msg calls[] = {
            {"user", " Add "},
            {"assistant", "Sure.[TOOL_CALLS]add[ARGS]{\"a\": 2}"},
            {"tool", "[TOOL_RESULTS]5[/TOOL_RESULTS]"},
        };
        srv_chat_extra x[] = {{0}, {.call_name = "add"}, {0}};
        srv_chat_opts o = {.enable_thinking = -1,
                           .default_system = "Default.",
                           .tools_user = "[AVAILABLE_TOOLS][][/AVAILABLE_TOOLS]",
                           .extra = x};
        char *got = NULL;
        assert_int_equal(srv_chat_render((enum srv_chat_tmpl)t, calls, 3, &o, &got), 0);
        assert_string_equal(got, "[SYSTEM_PROMPT]Default.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][]"
                                 "[/AVAILABLE_TOOLS][INST] Add [/INST]Sure.[TOOL_CALLS]add[ARGS]"
                                 "{\"a\": 2}</s>[TOOL_RESULTS]5[/TOOL_RESULTS]");
        free(got);
        size_t bad = 9;
        assert_null(srv_chat_check((enum srv_chat_tmpl)t, calls, 3, &o, &bad));
        /* user, assistant, user alternate; two user turns in a row, a later system message, or
         * an answer first are refused */
        const srv_chat_msg two[] = {{"system", ""}, {"user", "a"}, {"user", "b"}};
        assert_non_null(srv_chat_check((enum srv_chat_tmpl)t, two, 3, NULL, &bad));
        assert_int_equal(bad, 2);
        assert_null(srv_chat_check((enum srv_chat_tmpl)t, k_conv + 1, 3, NULL, &bad));
        const srv_chat_msg later[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
        assert_non_null(srv_chat_check((enum srv_chat_tmpl)t, later, 3, NULL, &bad));
        assert_int_equal(bad, 2);
        const srv_chat_msg first[] = {{"assistant", "a"}, {"user", "b"}};
        assert_non_null(srv_chat_check((enum srv_chat_tmpl)t, first, 2, NULL, &bad));
        assert_int_equal(bad, 0);
        /* no system message and no default: no system prompt */
        const srv_chat_msg one[] = {{"user", "Hi"}};
        check((enum srv_chat_tmpl)t, one, 1, "[INST]Hi[/INST]");
    }
    assert_true(srv_chat_may_think(SRV_CHAT_MISTRAL3_THINK));
    assert_false(srv_chat_may_think(SRV_CHAT_MISTRAL3));
    assert_false(srv_chat_has_thinking(SRV_CHAT_MISTRAL3_THINK)); /* no switch */
}

static void test_names(void **state)
{
    (void)state;
    for (int t = SRV_CHAT_PLAIN; t < SRV_CHAT_COUNT; t++)
        assert_int_equal(srv_chat_from_name(srv_chat_name((enum srv_chat_tmpl)t)), t);
    assert_int_equal(srv_chat_from_name("jinja"), -1);
}

static void test_plain(void **state)
{
    (void)state;
    const srv_chat_msg one[] = {{"user", "Once upon a time"}};
    check(SRV_CHAT_PLAIN, one, 1, "Once upon a time");
    check(SRV_CHAT_PLAIN, k_conv, 4, "Be brief.\nHi\nHello!\nBye");
}

static void test_chatml(void **state)
{
    (void)state;
    check(SRV_CHAT_CHATML, k_conv, 4,
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
          "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
          "<|im_start|>assistant\n");
}

static void test_llama2(void **state)
{
    (void)state;
    check(SRV_CHAT_LLAMA2, k_conv, 4,
          "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
}

static void test_llama3(void **state)
{
    (void)state;
    check(SRV_CHAT_LLAMA3, k_conv, 4,
          "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_zephyr(void **state)
{
    (void)state;
    check(SRV_CHAT_ZEPHYR, k_conv, 4,
          "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n"
          "<|assistant|>\nHello!<|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n");
}

/* Zephyr's (TinyLlama's) and OLMo 2's eos_token: the vocabulary's EOS text (srv_chat_fmt_set_eos,
 * kept only where the template writes eos_token); OLMo 2 closes an answer with it, the last with
 * no newline after it, and a user or system turn with a newline alone. */
static void test_eos_text(void **state)
{
    (void)state;
    srv_chat_fmt f;
    assert_int_equal(srv_chat_fmt_detect("{{ '<|user|>\n' + message['content'] + eos_token }}", &f),
                     0);
    assert_int_equal(f.tmpl, SRV_CHAT_ZEPHYR);
    assert_int_equal(srv_chat_fmt_set_eos(&f, "</s>"), 0);
    srv_chat_opts o = {.enable_thinking = -1, .eos_text = f.eos_text};
    char *got = NULL;
    assert_int_equal(srv_chat_render(f.tmpl, k_conv, 4, &o, &got), 0);
    assert_string_equal(got,
                        "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>"
                        "\n<|user|>\nBye</s>\n<|assistant|>\n");
    free(got);
    srv_chat_fmt_free(&f);
    /* a template spelling the text out keeps it whatever the vocabulary's EOS */
    assert_int_equal(srv_chat_fmt_detect("'<|user|>\n' + message['content'] + '<|endoftext|>'", &f),
                     0);
    assert_int_equal(srv_chat_fmt_set_eos(&f, "</s>"), 0);
    assert_null(f.eos_text);
    srv_chat_fmt_free(&f);
    static const char olmo2[] =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ "
        "'<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}"
        "{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}"
        "{% endif %}{% endif %}{% endfor %}";
    assert_int_equal(srv_chat_detect(olmo2), SRV_CHAT_OLMO2);
    o.eos_text = "<|endoftext|>";
    assert_int_equal(srv_chat_render(SRV_CHAT_OLMO2, k_conv, 4, &o, &got), 0);
    assert_string_equal(got, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!"
                             "<|endoftext|>\n<|user|>\nBye\n<|assistant|>\n");
    free(got);
    assert_int_equal(srv_chat_render(SRV_CHAT_OLMO2, k_conv, 3, &o, &got), 0);
    assert_string_equal(got, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!"
                             "<|endoftext|><|assistant|>\n");
    free(got);
}

static void test_mistral(void **state)
{
    (void)state;
    check(SRV_CHAT_MISTRAL, k_conv, 4, "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST]");
}

static void test_gemma(void **state)
{
    (void)state;
    check(SRV_CHAT_GEMMA, k_conv, 4,
          "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
          "<start_of_turn>model\nHello!<end_of_turn>\n"
          "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

/* Regression (fuzz_chat_template): a system message with no user turn after it was dropped. */
static void test_gemma_trailing_system(void **state)
{
    (void)state;
    const srv_chat_msg m[] = {{"user", "hi"}, {"assistant", "yo"}, {"system", " be brief "}};
    check(SRV_CHAT_GEMMA, m, 3,
          "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
          "<start_of_turn>user\nbe brief<end_of_turn>\n<start_of_turn>model\n");
    const srv_chat_msg only[] = {{"system", "rules"}};
    check(SRV_CHAT_GEMMA, only, 1,
          "<start_of_turn>user\nrules<end_of_turn>\n<start_of_turn>model\n");
}

static void test_phi3(void **state)
{
    (void)state;
    check(SRV_CHAT_PHI3, k_conv, 4,
          "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
          "<|user|>\nBye<|end|>\n<|assistant|>\n");
}

static void test_qwen3(void **state)
{
    (void)state;
    check(SRV_CHAT_QWEN3, k_conv, 4,
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
          "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
          "<|im_start|>assistant\n");
    /* An earlier turn's reasoning is dropped; one after the last query is kept, re-spaced. */
    const srv_chat_msg m[] = {{"user", "Hi"},
                              {"assistant", "<think>\nhmm\n</think>\n\nHello!"},
                              {"user", "<tool_response>\n42\n</tool_response>"},
                              {"assistant", "\n<think>plan</think>Done."}};
    check(SRV_CHAT_QWEN3, m, 2,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
          "Hello!<|im_end|>\n<|im_start|>assistant\n");
    /* A tool result is not a query: both turns after "Hi" keep their reasoning. */
    check(SRV_CHAT_QWEN3, m, 4,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
          "Hello!<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
          "<|im_start|>assistant\n<think>\nplan\n</think>\n\nDone.<|im_end|>\n"
          "<|im_start|>assistant\n");
    const srv_chat_msg q[] = {
        {"user", "Hi"}, {"assistant", "<think>\nhmm\n</think>\n\nHello!"}, {"user", "Bye"}};
    check(SRV_CHAT_QWEN3, q, 3,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
          "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    char *got = NULL;
    srv_chat_opts off = {.enable_thinking = 0};
    assert_int_equal(srv_chat_render(SRV_CHAT_QWEN3, m, 1, &off, &got), 0);
    assert_string_equal(got, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                             "<think>\n\n</think>\n\n");
    free(got);
    assert_true(srv_chat_has_thinking(SRV_CHAT_QWEN3));
    assert_false(srv_chat_has_thinking(SRV_CHAT_CHATML));
}

/* SmolLM3 (byte for byte against llama.cpp's Jinja: peer_templates): the metadata system turn,
 * left open; the system message's switches over enable_thinking; /system_override. */
static void test_smollm3(void **state)
{
    (void)state;
    static const char head[] = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June "
                               "2025\nToday Date: 01 Dec 2026\nReasoning Mode: ";
    char want[2048];
    snprintf(want, sizeof want,
             "%s/think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_start|>user\nHi<|im_end|>\n"
             "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
             "<|im_start|>assistant\n",
             head);
    check(SRV_CHAT_SMOLLM3, k_conv, 4, want);
    const srv_chat_msg off[] = {
        {"system", " /no_think"}, {"user", "Hi"}, {"assistant", "\nYo"}, {"tool", "5"}};
    snprintf(want, sizeof want,
             "%s/no_think\n\n## Custom Instructions\n\nYou are a helpful AI assistant named "
             "SmolLM, trained by Hugging Face.\n\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
             "assistant\n<think>\n\n</think>\nYo<|im_end|>\n<|im_start|>user\n5<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n",
             head);
    check(SRV_CHAT_SMOLLM3, off, 4, want);
    const srv_chat_msg over[] = {{"system", "You are Bob. /system_override /think \n"},
                                 {"user", "Hi"}};
    check(SRV_CHAT_SMOLLM3, over, 2,
          "<|im_start|>system\nYou are Bob.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
          "<|im_start|>assistant\n");
    /* the template's default instructions in /think mode, and enable_thinking off */
    char *got = NULL;
    srv_chat_opts o = {.enable_thinking = -1, .date = "01 Dec 2026"};
    assert_int_equal(srv_chat_render(SRV_CHAT_SMOLLM3, k_conv + 1, 1, &o, &got), 0);
    assert_non_null(strstr(got, "Reasoning Mode: /think\n\n## Custom Instructions\n\nYou are a "
                                "helpful AI assistant named SmolLM, trained by Hugging Face. Your "
                                "role"));
    assert_non_null(strstr(got, "necessary steps needed to reach the conclusion.\n\n"
                                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    free(got);
    o.enable_thinking = 0;
    assert_int_equal(srv_chat_render(SRV_CHAT_SMOLLM3, k_conv, 2, &o, &got), 0);
    snprintf(want, sizeof want,
             "%s/no_think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_start|>user\nHi"
             "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n",
             head);
    assert_string_equal(got, want);
    free(got);
    assert_true(srv_chat_has_thinking(SRV_CHAT_SMOLLM3));
}

static void test_llama31(void **state)
{
    (void)state;
    const char *head = "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                       "December 2023\nToday Date: ";
    const char *rest = "\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
                       "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n";
    char want[1024];
    snprintf(want, sizeof want, "%s26 Jul 2024%s", head, rest);
    check(SRV_CHAT_LLAMA31, k_conv, 4, want);
    snprintf(want, sizeof want, "%s01 Dec 2026%s", head, rest);
    check(SRV_CHAT_LLAMA32, k_conv, 4, want);
    /* No system message: the dated system turn is still there, empty after the dates. */
    snprintf(want, sizeof want,
             "%s26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n",
             head);
    check(SRV_CHAT_LLAMA31, k_conv + 1, 1, want);
}

/* Granite 3.1 (its official template, checked against llama-server's Jinja in peer_templates):
 * the first system message or the dated default, each turn untrimmed, the generation prompt
 * after the last turn only; with tools, the default's tools sentence and a tools turn. */
static void test_granite(void **state)
{
    (void)state;
    check(SRV_CHAT_GRANITE, k_conv, 4,
          "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>Bye<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>");
    char *got = NULL;
    srv_chat_opts o = {.enable_thinking = -1, .date = "December 01, 2026"};
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE, k_conv + 1, 1, &o, &got), 0);
    assert_string_equal(got, "<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: April "
                             "2024.\nToday's Date: December 01, 2026.\nYou are Granite, developed "
                             "by IBM. You are a helpful AI assistant.<|end_of_text|>\n"
                             "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                             "<|start_of_role|>assistant<|end_of_role|>");
    free(got);
    /* a system message alone: no turn after it, so no generation prompt (as the template) */
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE, k_conv, 1, &o, &got), 0);
    assert_string_equal(got, "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n");
    free(got);
    o.tools_user = "[]";
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE, k_conv + 1, 1, &o, &got), 0);
    assert_non_null(strstr(got, "You are Granite, developed by IBM. You are a helpful AI assistant "
                                "with access to the following tools. When a tool is required"));
    assert_non_null(strstr(got, "request.<|end_of_text|>\n<|start_of_role|>tools<|end_of_role|>"
                                "[]<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hi"));
    free(got);
    /* Granite 3.2 and 3.3: thinking (off by default) changes the default system text only,
     * and tools take its place; 3.3 words the tools sentence and names the tools turn its own
     * way */
    o.tools_user = NULL;
    static const char *const think[] = {"Write your thoughts after 'Here is my thought "
                                        "process:' and write your response after 'Here is my "
                                        "response:' for each user query.<|end_of_text|>",
                                        "Write your thoughts between <think></think> and write "
                                        "your response between <response></response> for each "
                                        "user query.<|end_of_text|>"};
    for (int v = 0; v < 2; v++) {
        enum srv_chat_tmpl t = v ? SRV_CHAT_GRANITE33 : SRV_CHAT_GRANITE32;
        o.enable_thinking = -1;
        o.tools_user = NULL;
        assert_int_equal(srv_chat_render(t, k_conv + 1, 1, &o, &got), 0);
        assert_non_null(strstr(got, "by IBM. You are a helpful AI assistant.<|end_of_text|>\n"));
        free(got);
        o.enable_thinking = 1;
        assert_int_equal(srv_chat_render(t, k_conv + 1, 1, &o, &got), 0);
        assert_non_null(strstr(got, "by IBM. You are a helpful AI assistant.\nRespond to every "
                                    "user query in a comprehensive and detailed way."));
        assert_non_null(strstr(got, think[v]));
        free(got);
        assert_int_equal(srv_chat_render(t, k_conv, 2, &o, &got), 0); /* its system message */
        assert_null(strstr(got, "Respond to every"));
        free(got);
        o.tools_user = "[]";
        assert_int_equal(srv_chat_render(t, k_conv + 1, 1, &o, &got), 0);
        assert_null(strstr(got, "Respond to every"));
        assert_non_null(strstr(got, v ? "You are a helpful assistant with access to the following "
                                        "tools. When a tool is required to answer the user's "
                                        "query, respond only with <|tool_call|>"
                                      : "You are a helpful AI assistant with access to the "
                                        "following tools. When a tool is required to answer the "
                                        "user's query, respond with <|tool_call|>"));
        assert_non_null(strstr(got, v ? "<|start_of_role|>available_tools<|end_of_role|>[]"
                                      : "<|start_of_role|>tools<|end_of_role|>[]"));
        free(got);
    }
    o.enable_thinking = -1;
    /* the variant of 3.3's template that joins its date line with spaces (llama.cpp's copy) */
    srv_chat_fmt f;
    assert_int_equal(srv_chat_fmt_detect("{%- set system_message = \"Knowledge Cutoff Date: "
                                         "April 2024. Today's Date: \" %}<think></think>"
                                         "<|start_of_role|><|end_of_role|>",
                                         &f),
                     0);
    assert_int_equal(f.tmpl, SRV_CHAT_GRANITE33);
    assert_true(f.granite_spaced);
    o.tools_user = NULL;
    o.granite_spaced = f.granite_spaced;
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE33, k_conv + 1, 1, &o, &got), 0);
    assert_non_null(strstr(got, "system<|end_of_role|>Knowledge Cutoff Date: April 2024. Today's "
                                "Date: December 01, 2026. You are Granite, developed by IBM. You "
                                "are a helpful AI assistant.<|end_of_text|>"));
    free(got);
    o.granite_spaced = 0;
    /* Granite 3.0: no default system message, the tools first, a tool result not written */
    o.tools_user = "{}";
    const srv_chat_msg conv30[] = {{"user", "Hi"}, {"tool", "5"}};
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE30, conv30, 2, &o, &got), 0);
    assert_string_equal(got, "<|start_of_role|>available_tools<|end_of_role|>\n{}<|end_of_text|>\n"
                             "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                             "<|start_of_role|>assistant<|end_of_role|>");
    free(got);
}

/* Granite 4.0 (its official template, checked against llama-server's Jinja in peer_templates):
 * a system turn always, the conversation's first system message or, absent or empty, the
 * template's default text; other turns as their role, untrimmed; roles it does not know (a raw
 * tool turn: server/api.c has made results user turns already) not written. */
static void test_granite40(void **state)
{
    (void)state;
    check(SRV_CHAT_GRANITE40, k_conv, 4,
          "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>Bye<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>");
    static const char dflt[] = "<|start_of_role|>system<|end_of_role|>You are a helpful "
                               "assistant. Please ensure responses are professional, accurate, "
                               "and safe.<|end_of_text|>\n";
    const srv_chat_msg none[] = {{"user", " Hi "}, {"tool", "5"}, {"system", "Later."}};
    check(SRV_CHAT_GRANITE40, none, 3,
          "<|start_of_role|>system<|end_of_role|>You are a helpful assistant. Please ensure "
          "responses are professional, accurate, and safe.<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|> Hi <|end_of_text|>\n"
          "<|start_of_role|>system<|end_of_role|>Later.<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>");
    const srv_chat_msg empty[] = {{"system", ""}};
    char *got = NULL;
    assert_int_equal(srv_chat_render(SRV_CHAT_GRANITE40, empty, 1, NULL, &got), 0);
    assert_non_null(got);
    assert_memory_equal(got, dflt, sizeof dflt - 1);
    assert_string_equal(got + sizeof dflt - 1, "<|start_of_role|>assistant<|end_of_role|>");
    free(got);
}

/* ERNIE 4.5 (its official template, checked against llama-server's Jinja in peer_templates): its
 * cls_token first, system text and user turns each ending in a newline, assistant turns in its
 * sep_token, contents untrimmed; a tool result not written (the template writes no other role) */
static void test_ernie45(void **state)
{
    (void)state;
    check(SRV_CHAT_ERNIE45, k_conv, 4,
          "<|begin_of_sentence|>Be brief.\nUser: Hi\nAssistant: Hello!<|end_of_sentence|>"
          "User: Bye\nAssistant: ");
    const srv_chat_msg tool[] = {{"user", " Hi "}, {"tool", "5"}};
    check(SRV_CHAT_ERNIE45, tool, 2, "<|begin_of_sentence|>User:  Hi \nAssistant: ");
}

/* Liquid AI's LFM2 and LFM2.5 (their official templates, checked against llama-server's Jinja
 * in peer_templates): ChatML, no system turn for an empty system text, a later system message a
 * turn of its own; LFM2.5 keeps an earlier answer's text after its last </think>, stripped (the
 * 1.2B template: every answer but the last; 8B's: the answers before the last user turn), and
 * 8B's writes an answer's calls after its content. */
static void test_lfm2(void **state)
{
    (void)state;
    for (int t = SRV_CHAT_LFM2; t <= SRV_CHAT_LFM25_8B; t++) {
        check((enum srv_chat_tmpl)t, k_conv, 4,
              "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n");
        const srv_chat_msg empty[] = {{"system", ""}, {"user", "Hi"}, {"system", " x "}};
        check((enum srv_chat_tmpl)t, empty, 3,
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\n x <|im_end|>\n"
              "<|im_start|>assistant\n");
    }
    const srv_chat_msg think[] = {{"user", "Hi"},
                                  {"assistant", "<think>a</think>b</think>\n c \n"},
                                  {"user", "Bye"},
                                  {"assistant", " <think>d</think> e "},
                                  {"tool", "5"}};
    const char *turns[] = {"<think>a</think>b</think>\n c \n", "c", "c"};
    const char *last[] = {" <think>d</think> e ", " <think>d</think> e ", " <think>d</think> e "};
    for (int t = SRV_CHAT_LFM2; t <= SRV_CHAT_LFM25_8B; t++) {
        char want[512];
        snprintf(want, sizeof want,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n"
                 "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n"
                 "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n",
                 turns[t - SRV_CHAT_LFM2], last[t - SRV_CHAT_LFM2]);
        check((enum srv_chat_tmpl)t, think, 5, want);
    }
    /* keep_past_thinking (1.2B) and preserve_thinking (8B): every answer as it is */
    srv_chat_opts keep = {.enable_thinking = -1, .keep_thinking = 1};
    for (int t = SRV_CHAT_LFM25; t <= SRV_CHAT_LFM25_8B; t++) {
        char *got = NULL;
        assert_int_equal(srv_chat_render((enum srv_chat_tmpl)t, think, 5, &keep, &got), 0);
        assert_non_null(strstr(got, "assistant\n<think>a</think>b</think>\n c \n<|im_end|>"));
        free(got);
    }
    /* an answer after the last user turn but not the last answer: 1.2B drops its think
     * block, 8B keeps it */
    const srv_chat_msg after[] = {
        {"user", "Hi"}, {"assistant", "<think>a</think>b"}, {"tool", "5"}, {"assistant", "c"}};
    check(SRV_CHAT_LFM25, after, 4,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>tool\n"
          "5<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n<|im_start|>assistant\n");
    check(SRV_CHAT_LFM25_8B, after, 4,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>a</think>b<|im_end|>\n"
          "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n"
          "<|im_start|>assistant\n");
    /* 8B: the calls after the content (the content's think block dropped first) */
    const srv_chat_msg call[] = {
        {"user", "Add"}, {"assistant", "<think>p</think> Ok. "}, {"tool", "5"}, {"user", "Thanks"}};
    const srv_chat_extra x[] = {
        {0}, {NULL, NULL, NULL, "<|tool_call_start|>[add(a=1)]<|tool_call_end|>"}, {0}, {0}};
    srv_chat_opts o = {.enable_thinking = -1, .extra = x};
    char *got = NULL;
    assert_int_equal(srv_chat_render(SRV_CHAT_LFM25_8B, call, 4, &o, &got), 0);
    assert_string_equal(got,
                        "<|im_start|>user\nAdd<|im_end|>\n<|im_start|>assistant\nOk.<|tool_call_"
                        "start|>[add(a=1)]<|tool_call_end|><|im_end|>\n<|im_start|>tool\n5<|im_"
                        "end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n");
    free(got);
    assert_false(srv_chat_has_thinking(SRV_CHAT_LFM25));
    assert_true(srv_chat_may_think(SRV_CHAT_LFM25));
    assert_true(srv_chat_may_think(SRV_CHAT_LFM25_8B));
    assert_false(srv_chat_may_think(SRV_CHAT_LFM2));
    assert_true(srv_chat_may_think(SRV_CHAT_QWEN3));
}

#define HARMONY_SYSTEM(effort, tools)                                                              \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"       \
    "Knowledge cutoff: 2024-06\nCurrent date: 2026-12-01\n\nReasoning: " effort "\n\n# Valid "     \
    "channels: analysis, commentary, final. Channel must be included for every message." tools     \
    "<|end|>"

/* gpt-oss (its official template, checked against llama-server's Jinja in peer_templates): the
 * system message dated, the first system message as the developer's instructions, an assistant
 * turn's final channel without its reasoning, and the generation prompt without a channel. */
static void test_harmony(void **state)
{
    (void)state;
    char *got = NULL;
    srv_chat_opts o = {.enable_thinking = -1, .date = "2026-12-01"};
    assert_int_equal(srv_chat_render(SRV_CHAT_HARMONY, k_conv, 4, &o, &got), 0);
    assert_string_equal(got,
                        HARMONY_SYSTEM("medium", "") "<|start|>developer<|message|># "
                                                     "Instructions\n\nBe brief.\n\n<|end|>"
                                                     "<|start|>user<|message|>Hi<|end|>"
                                                     "<|start|>assistant<|channel|>final"
                                                     "<|message|>Hello!<|end|><|start|>user"
                                                     "<|message|>Bye<|end|><|start|>assistant");
    free(got);
    /* no system message: no developer message; a later system message is not written; the
     * reasoning of an answer is dropped */
    const srv_chat_msg m[] = {
        {"user", "Hi"}, {"assistant", "Hello!"}, {"system", "Be brief."}, {"user", "Bye"}};
    const srv_chat_extra x[] = {{NULL, NULL, NULL, NULL}, {"greet", NULL, NULL, NULL}, {0}, {0}};
    o.extra = x;
    o.reasoning_effort = "high";
    assert_int_equal(srv_chat_render(SRV_CHAT_HARMONY, m, 4, &o, &got), 0);
    assert_string_equal(got, HARMONY_SYSTEM("high", "") "<|start|>user<|message|>Hi<|end|>"
                                                        "<|start|>assistant<|channel|>final"
                                                        "<|message|>Hello!<|end|><|start|>user"
                                                        "<|message|>Bye<|end|><|start|>assistant");
    free(got);
    /* a call: its reasoning on the analysis channel while no later turn answers; the result
     * from the call's function; the tools in the developer message */
    const srv_chat_msg c[] = {{"user", "Add"},
                              {"assistant", ""},
                              {"tool", "\"5\""},
                              {"assistant", "It is 5."},
                              {"user", "Thanks"}};
    const srv_chat_extra cx[] = {{0}, {"use add", "add", "{\"a\": 2}", NULL}, {0}, {0}, {0}};
    srv_chat_opts t = {.enable_thinking = -1, .date = "2026-12-01", .extra = cx, .tools_dev = "T"};
    const char *call = "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>"
                       "{\"a\": 2}<|call|><|start|>functions.add to=assistant<|channel|>"
                       "commentary<|message|>\"5\"<|end|>";
    const char *sys = HARMONY_SYSTEM("medium", "\nCalls to these tools must go to the commentary "
                                               "channel: 'functions'.") "<|start|>developer"
                                                                        "<|message|># Tools\n\nT"
                                                                        "<|end|><|start|>user"
                                                                        "<|message|>Add<|end|>";
    char want[2048];
    snprintf(want, sizeof want,
             "%s<|start|>assistant<|channel|>analysis<|message|>use add<|end|>%s", sys, call);
    assert_int_equal(srv_chat_render(SRV_CHAT_HARMONY, c, 3, &t, &got), 0);
    assert_string_equal(got, strcat(want, "<|start|>assistant"));
    free(got);
    snprintf(want, sizeof want,
             "%s%s<|start|>assistant<|channel|>final<|message|>It is 5.<|end|><|start|>user"
             "<|message|>Thanks<|end|><|start|>assistant",
             sys, call);
    assert_int_equal(srv_chat_render(SRV_CHAT_HARMONY, c, 5, &t, &got), 0);
    assert_string_equal(got, want);
    free(got);
    /* what the template raises on */
    size_t bad = 99;
    assert_null(srv_chat_check(SRV_CHAT_HARMONY, c, 5, &t, &bad));
    assert_non_null(srv_chat_check(SRV_CHAT_HARMONY, c + 2, 1, &o, &bad)); /* result, no call */
    assert_int_equal(bad, 0);
    const srv_chat_msg tags[] = {{"user", "Hi"}, {"assistant", "<|channel|>final<|message|>x"}};
    assert_non_null(srv_chat_check(SRV_CHAT_HARMONY, tags, 2, NULL, &bad));
    assert_int_equal(bad, 1);
    const srv_chat_extra both[] = {{0}, {"why", "add", "{}", NULL}};
    const srv_chat_msg callc[] = {{"user", "Hi"}, {"assistant", "preamble"}};
    t.extra = both;
    assert_non_null(srv_chat_check(SRV_CHAT_HARMONY, callc, 2, &t, &bad));
    assert_null(srv_chat_check(SRV_CHAT_QWEN3, tags, 2, NULL, &bad));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_default_system),
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_zephyr),
        cmocka_unit_test(test_eos_text),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_gemma),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_gemma_trailing_system),
        cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_smollm3),
        cmocka_unit_test(test_granite),
        cmocka_unit_test(test_ernie45),
        cmocka_unit_test(test_lfm2),
        cmocka_unit_test(test_granite40),
        cmocka_unit_test(test_mistral3),
        cmocka_unit_test(test_mistral3_default_system),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
