/* Chat template rendering. The formats follow what each family's official template produces
 * for system/user/assistant turns with add_generation_prompt, as llama.cpp renders them; BOS
 * is not written here because the tokenizer adds it (tok_add_bos). */
#include "server/chat_template.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/status.h"

static const char *k_names[] = {"plain",  "chatml",  "llama2", "llama3",
                                "zephyr", "mistral", "gemma",  "phi3"};

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
    /* Order matters as in llama.cpp: ChatML markers first, then [INST] (Mistral's official
     * templates put the system message inside the first [INST] and lack <<SYS>>). */
    if (HAS("<|im_start|>"))
        return SRV_CHAT_CHATML;
    if (!strncmp(t, "mistral", 7) || HAS("[INST]")) {
        if (HAS("<<SYS>>") || !(HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]")))
            return SRV_CHAT_LLAMA2;
        return SRV_CHAT_MISTRAL;
    }
    if (HAS("<|assistant|>") && HAS("<|end|>"))
        return SRV_CHAT_PHI3;
    if (HAS("<|user|>") && (HAS("<|endoftext|>") || HAS("eos_token")))
        return SRV_CHAT_ZEPHYR;
    if (HAS("<start_of_turn>"))
        return SRV_CHAT_GEMMA;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>"))
        return SRV_CHAT_LLAMA3;
#undef HAS
    return SRV_CHAT_PLAIN;
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

int srv_chat_render(enum srv_chat_tmpl t, const srv_chat_msg *m, size_t n, char **out)
{
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
    case SRV_CHAT_ZEPHYR:
        for (size_t i = 0; i < n; i++) {
            kvs_buf_add(&b, "<|");
            kvs_buf_add(&b, m[i].role);
            kvs_buf_add(&b, "|>\n");
            kvs_buf_add(&b, m[i].content);
            kvs_buf_add(&b, "<|endoftext|>\n");
        }
        kvs_buf_add(&b, "<|assistant|>\n");
        break;
    case SRV_CHAT_PHI3:
        for (size_t i = 0; i < n; i++) {
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
                sb_add_trim(&sys, m[i].content);
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
            kvs_buf_add(&b, sys.p);
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
