/* libFuzzer target: the chat-template renderer and detector (server/chat_template.h).
 * Input: byte 0 picks the template; the rest is split at NUL bytes into alternating role and
 * content strings (up to 64 messages), and is also given whole to srv_chat_detect as a GGUF
 * template. Checks: rendering succeeds, the output is NUL-terminated, and every message
 * content appears in it, verbatim apart from surrounding whitespace (llama2/llama3 trim it
 * as their official templates do): no template may drop or cut what the user wrote. The
 * exceptions are by design: Qwen 3 drops an assistant turn's <think> block (its official template
 * does), so there only the text after the last </think> is looked for; SmolLM3 cuts /think,
 * /no_think and /system_override out of the first system message and writes no other (its
 * official template does), so its system messages are not looked for.
 * Regression seed: corpus/chat_template/crash-llama3-trim (an untrimmed check flagged it). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum srv_chat_tmpl t = (enum srv_chat_tmpl)(data[0] % SRV_CHAT_COUNT);
    srv_chat_opts opts = {.enable_thinking = (data[0] / SRV_CHAT_COUNT) % 3 - 1,
                          .default_system = (data[0] & 0x80) ? "You are a test." : NULL,
                          .date = "01 Jan 2025"};
    /* A NUL-terminated copy, split in place. */
    char *buf = malloc(size);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    enum srv_chat_tmpl det = srv_chat_detect(buf);
    if ((unsigned)det >= SRV_CHAT_COUNT || srv_chat_from_name(srv_chat_name(det)) != (int)det)
        abort();

    static const char *roles[] = {"system", "user", "assistant"};
    srv_chat_msg msgs[MAX_MSGS];
    size_t n = 0;
    char *p = buf, *end = buf + size - 1;
    while (p <= end && n < MAX_MSGS) {
        char *content = p + strlen(p) + 1; /* role text picks one of the three roles */
        if (content > end)
            content = end;
        msgs[n].role = roles[(unsigned char)p[0] % 3];
        msgs[n].content = content;
        n++;
        p = content + strlen(content) + 1;
    }
    char *out = NULL;
    if (srv_chat_render(t, msgs, n, &opts, &out) != 0 || !out)
        abort();
    for (size_t i = 0; i < n; i++) {
        const char *c = msgs[i].content;
        if (t == SRV_CHAT_HARMONY && i && !strcmp(msgs[i].role, "system"))
            continue; /* harmony's template renders only the first system message */
        if (t == SRV_CHAT_SMOLLM3 && !strcmp(msgs[i].role, "system"))
            continue;
        /* Qwen 3 and LFM2.5 keep (at least) an answer's text after its last </think> */
        if ((t == SRV_CHAT_QWEN3 || t == SRV_CHAT_LFM25 || t == SRV_CHAT_LFM25_8B) &&
            !strcmp(msgs[i].role, "assistant"))
            for (const char *e = strstr(c, "</think>"); e; e = strstr(c, "</think>"))
                c = e + 8;
        size_t len = strlen(c);
        while (len && strchr(" \t\n\r\f\v", *c))
            c++, len--;
        while (len && strchr(" \t\n\r\f\v", c[len - 1]))
            len--;
        char *want = strndup(c, len);
        if (!want)
            break;
        bool found = strstr(out, want) != NULL;
        free(want);
        if (!found) {
            fprintf(stderr, "fuzz_chat_template: content of message %zu missing from %s\n", i,
                    srv_chat_name(t));
            abort();
        }
    }
    free(out);
    free(buf);
    return 0;
}
