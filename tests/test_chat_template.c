/* Chat templates: detection from real template snippets and each family's rendering of a
 * system + user + assistant + user conversation with the generation prompt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
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
    assert_int_equal(srv_chat_render(t, m, n, &got), 0);
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
    assert_int_equal(srv_chat_detect("{{ message['content'] }}"), SRV_CHAT_PLAIN);
}

static void test_names(void **state)
{
    (void)state;
    for (int t = SRV_CHAT_PLAIN; t <= SRV_CHAT_PHI3; t++)
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_zephyr),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_gemma),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_gemma_trailing_system),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
