/* A thinking model's output split into its reasoning and its answer, as vLLM's reasoning
 * parsers and llama.cpp's `--reasoning-format deepseek` give them (message.reasoning_content
 * beside message.content): output that opens with <think> is reasoning up to </think>, the
 * rest is content. The newlines just inside the tags and just after the close are dropped (the
 * chat template writes its own when the turn is sent back). A think block never closed (cut by
 * max_tokens) is all reasoning.
 *
 * One splitter serves both shapes: a stream is fed piece by piece, a whole text in one piece,
 * and the results are the same bytes, because srv_think_feed holds back only what may still
 * become part of a tag or of the newlines around one. Pure; any thread. */
#ifndef KVS_SERVER_REASONING_H
#define KVS_SERVER_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "common/buf.h"
#include "server/chat_template.h"

/* gpt-oss (harmony) writes channels instead: after the prompt's "<|start|>assistant" comes
 * <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
 * (generation ends at <|return|> or <|call|>, end-of-generation tokens that write no text).
 * With harmony set, the analysis channel is reasoning and the final channel (and commentary
 * without a recipient) content, as llama.cpp's --reasoning-format auto gives them; a message
 * to a function (" to=functions.NAME", before or after the channel) is placed in content as
 * one piece, "<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS
 * <|call|>" (no space before <|call|>), when it ends, for the tool-call reader. Output that does
 * not open with a channel or a recipient is all content; headers are dropped, as is a header
 * the output ends inside. */
typedef struct srv_think {
    int state;    /* where the output is: before the first byte decides, inside, after */
    bool drop_nl; /* newlines here are the tags' own, dropped */
    kvs_buf held; /* bytes whose place is not known yet */
    bool harmony; /* the format: set before the first feed (srv_think_set_format) */
    /* Granite 3.2, asked to think, writes "Here is my thought process:" ... "Here is my
     * response:" ...: those phrases take the tags' place (as vLLM's granite reasoning parser
     * reads them; llama.cpp's server does not split them) */
    bool granite32;
    /* Ministral 3 Reasoning and Magistral write [THINK] ... [/THINK] in the tags' place */
    bool mistral;
    int channel;  /* harmony: where the current message's body goes */
    kvs_buf call; /* harmony: the current call's header and arguments */
} srv_think;

/* Sets the format t splits for chat template tmpl's output: harmony's channels, Granite 3.2's
 * phrases, Mistral's [THINK] tags, else <think> tags. Before the first feed. */
void srv_think_set_format(srv_think *t, enum srv_chat_tmpl tmpl);

/* Places n more bytes of output: appended to reasoning or content as far as they are known.
 * A zeroed srv_think starts an output. */
void srv_think_feed(srv_think *t, const char *s, size_t n, kvs_buf *reasoning, kvs_buf *content);
/* The output ended: places what was held, and frees it. */
void srv_think_end(srv_think *t, kvs_buf *reasoning, kvs_buf *content);
void srv_think_free(srv_think *t);

#endif
